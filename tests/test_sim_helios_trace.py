"""Helios cluster logs (``cluster_log.csv``, the layout Lucid's simulator reads) as
``--trace``: read as published, CPU-only and never-run jobs skipped and said, every bad
cell named.  The rows are our own, in Helios' columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sim_trace_csv import _simulate

from elastico_extender.sim.traces import read_trace

HELIOS_HEADER = "job_id,user,vc,jobname,gpu_num,cpu_num,node_num,state,submit_time,duration\n"
HELIOS_ROWS = (
    "j3,u2,vcA,train,8,48,1,COMPLETED,2020-04-01 00:10:00,7200\n"
    "j1,u1,vcA,train,1,6,1,COMPLETED,2020-04-01 00:00:09,600\n"
    "j2,u1,vcB,prep,0,12,1,COMPLETED,2020-04-01 00:05:00,300\n"  # CPU only
    "j4,u3,vcA,train,2,12,1,FAILED,2020-04-01 00:20:00,0\n"  # never ran
    "j5,u3,vcA,train,2,12,1,CANCELLED,2020-04-01 01:00:00,45\n"
)


def _log(tmp_path: Path, header: str = HELIOS_HEADER, rows: str = HELIOS_ROWS) -> Path:
    path = tmp_path / "cluster_log.csv"
    path.write_text(header + rows)
    return path


def test_a_helios_log_loads_its_gpu_jobs_with_their_users(tmp_path: Path) -> None:
    loaded = read_trace(_log(tmp_path), seed=0)
    jobs = loaded.jobs
    assert [j.job_id for j in jobs] == ["j1", "j3", "j5"]
    start = jobs[0].arrival_s
    assert [j.arrival_s - start for j in jobs] == [0.0, 591.0, 3591.0]
    assert [(j.gpus, j.duration_s, j.user) for j in jobs] == [
        (1, 600.0, "u1"),
        (8, 7200.0, "u2"),
        (2, 45.0, "u3"),
    ]
    assert loaded.notes[0] == (
        "cluster_log.csv: a Helios cluster log: 3 GPU jobs; skipped 1 CPU-only jobs "
        "(gpu_num 0) and 1 that never ran (duration 0)"
    )
    assert loaded.notes[1].startswith("cluster_log.csv: 3 jobs name no workload: drawn")


def test_lucids_philly_log_names_jobs_by_jobname_and_times_in_seconds(tmp_path: Path) -> None:
    """Lucid's Philly copy has no job_id column; a log already in seconds loads too."""
    header = "user,vc,jobname,gpu_num,state,submit_time,duration\n"
    rows = "u1,philly,application_1,4,Pass,100,3600\nu2,philly,application_2,1,Killed,40,60\n"
    jobs = read_trace(_log(tmp_path, header, rows)).jobs
    assert [(j.job_id, j.arrival_s) for j in jobs] == [
        ("application_2", 40.0),
        ("application_1", 100.0),
    ]


def test_a_gang_that_names_no_workload_stays_a_gang(tmp_path: Path) -> None:
    """A job of several GPUs drew from all twelve workloads, and one drawn as an inference
    engine silently became a one-GPU job: a third of a trace's gangs shrank."""
    from elastico_extender.sim.workloads import TRAINING_WORKLOADS

    path = tmp_path / "trace.csv"
    rows = "".join(f"{k * 60},8,3600\n" for k in range(200))
    path.write_text("arrival_time_s,gpu_num,duration_s\n" + rows)
    loaded = read_trace(path, seed=3)
    assert {j.gpus for j in loaded.jobs} == {8}
    assert {j.workload for j in loaded.jobs} <= set(TRAINING_WORKLOADS)
    assert not any("run on one" in note for note in loaded.notes)


def test_an_inference_gang_named_by_the_user_runs_on_one_gpu_and_is_said(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("arrival_time_s,gpu_num,duration_s,workload\n0,4,60,qwen-1.7b\n")
    loaded = read_trace(path)
    assert loaded.jobs[0].gpus == 1
    assert "1 jobs name an inference workload on more than one GPU" in loaded.notes[0]


def test_a_user_column_reaches_the_projects_own_format_too(tmp_path: Path) -> None:
    path = tmp_path / "trace.csv"
    path.write_text("arrival_time_s,gpu_num,duration_s,user\n0,1,60,alice\n")
    assert read_trace(path).jobs[0].user == "alice"


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("j9,u,vcA,t,1,6,1,COMPLETED,yesterday,60\n", "submit_time"),
        ("j9,u,vcA,t,1,6,1,COMPLETED,2020-13-01 00:00:00,60\n", "submit_time"),
        ("j9,u,vcA,t,1,6,1,COMPLETED,2020-04-01 00:00:00,-60\n", "duration"),
        ("j9,u,vcA,t,1,6,1,COMPLETED,2020-04-01 00:00:00,nan\n", "duration"),
        ("j9,u,vcA,t,1.5,6,1,COMPLETED,2020-04-01 00:00:00,60\n", "gpu_num"),
        ("j9,u,vcA,t,-1,6,1,COMPLETED,2020-04-01 00:00:00,60\n", "gpu_num"),
        ("j1,u,vcA,t,1,6,1,COMPLETED,2020-04-01 00:00:00,60\n", "job_id"),
        ("j9,u,vcA,t,1,6,1,COMPLETED,2021-06-01 00:00:00,60\n", "submit_time"),  # > 366 days
    ],
)
def test_a_bad_cell_of_a_helios_log_names_its_line_and_column(
    tmp_path: Path, row: str, column: str
) -> None:
    with pytest.raises(ValueError, match=f"line 7: column {column}"):
        read_trace(_log(tmp_path, rows=HELIOS_ROWS + row))


def test_the_simulator_runs_a_helios_log_and_says_what_it_skipped(tmp_path: Path) -> None:
    proc = _simulate(_log(tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "a Helios cluster log: 3 GPU jobs; skipped 1 CPU-only jobs" in out
    assert "3 jobs, rebased to t=0" in out


def test_a_helios_log_with_no_gpu_job_says_what_it_skipped(tmp_path: Path) -> None:
    """Before the fix: "cpuonly.csv has no jobs", without the note that says why."""
    rows = "".join(HELIOS_ROWS.splitlines(keepends=True)[2:4])  # one CPU-only, one never ran
    proc = _simulate(_log(tmp_path, rows=rows), tmp_path)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert error.startswith("elastico simulate: error: --trace:") and "has no jobs" in error
    assert "skipped 1 CPU-only jobs (gpu_num 0) and 1 that never ran" in error, error


def test_a_repeated_id_names_the_column_it_came_from(tmp_path: Path) -> None:
    """An empty job_id takes the jobname; a repeat blamed column job_id (got '')."""
    rows = HELIOS_ROWS + ",u1,vcA,train,1,6,1,COMPLETED,2020-04-01 02:00:00,60\n"
    rows += ",u1,vcA,train,1,6,1,COMPLETED,2020-04-01 03:00:00,60\n"
    with pytest.raises(ValueError, match=r"line 8: column jobname: used by an earlier row"):
        read_trace(_log(tmp_path, rows=rows))
