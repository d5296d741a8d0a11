"""Alibaba's GPU-sharing pod lists (``openb_pod_list_*.csv``) as ``--trace``: read as
published, CPU-only and never-run pods skipped and said, fractional GPU asks counted,
every bad cell named.  The rows are our own, in the
trace's columns."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_sim_trace_csv import _simulate

from elastico_extender.sim.traces import read_trace

HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)
ROWS = (
    "pod-a,8000,16384,1,1000,,LS,Running,100,5000,100\n"
    "pod-b,4000,15258,1,250,,BE,Succeeded,200,1400,260\n"  # a quarter of a GPU
    "pod-c,88000,327680,8,1000,,Burstable,Succeeded,300,7500,300\n"
    "pod-d,16000,65536,0,0,,LS,Running,400,5000,400\n"  # CPU only
    "pod-e,12000,24576,1,1000,,BE,Pending,500,560,\n"  # never scheduled
    "pod-f,3152,5600,1,1000,V100M16|V100M32,BE,Failed,600,600,600\n"  # deleted at once
    "pod-g,3152,5600,2,1000,,BE,Failed,700,820,710\n"
)


def _pods(tmp_path: Path, rows: str = ROWS) -> Path:
    path = tmp_path / "openb_pod_list_default.csv"
    path.write_text(HEADER + rows)
    return path


def test_a_pod_list_loads_each_pod_that_ran_from_its_scheduling_to_its_deletion(
    tmp_path: Path,
) -> None:
    loaded = read_trace(_pods(tmp_path), seed=0)
    jobs = loaded.jobs
    assert [(j.job_id, j.arrival_s, j.gpus, j.duration_s) for j in jobs] == [
        ("pod-a", 100.0, 1, 4900.0),
        ("pod-b", 200.0, 1, 1140.0),  # queued 60 s in the real cluster: not part of its run
        ("pod-c", 300.0, 8, 7200.0),
        ("pod-g", 700.0, 2, 110.0),
    ]
    name = "openb_pod_list_default.csv"
    assert loaded.notes[:2] == (
        f"{name}: an Alibaba GPU-sharing pod list: 4 GPU jobs; skipped 1 CPU-only pods "
        "(num_gpu 0) and 2 that never ran (no scheduled_time, or deleted when scheduled)",
        f"{name}: 1 one-GPU pods asked for part of a GPU (gpu_milli under 1000): the hami "
        "baseline packs them by that share, every other policy decides what shares a GPU "
        "itself",
    )
    assert loaded.notes[2].startswith(f"{name}: 4 jobs name no workload: drawn")
    assert all(j.workload for j in jobs)
    assert [j.gpu_share for j in jobs] == [1.0, 0.25, 1.0, 1.0]  # a gang's gpu_milli: whole


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("pod-x,1,1,1,1000,,LS,Running,900,800,900\n", "deletion_time"),  # before scheduled
        ("pod-x,1,1,1,1000,,LS,Running,900,1000,850\n", "scheduled_time"),  # before created
        ("pod-x,1,1,1,1000,,LS,Running,nan,1000,900\n", "creation_time"),
        ("pod-x,1,1,1.5,1000,,LS,Running,900,1000,900\n", "num_gpu"),
        ("pod-x,1,1,-1,1000,,LS,Running,900,1000,900\n", "num_gpu"),
        ("pod-x,1,1,1,1500,,LS,Running,900,1000,900\n", "gpu_milli"),
        ("pod-x,1,1,1,1000,,LS,Running,900,1e12,900\n", "deletion_time"),
        ("pod-a,1,1,1,1000,,LS,Running,900,1000,900\n", "name"),  # a repeated pod
    ],
)
def test_a_bad_cell_of_a_pod_list_names_its_line_and_column(
    tmp_path: Path, row: str, column: str
) -> None:
    with pytest.raises(ValueError, match=f"line 9: column {column}"):
        read_trace(_pods(tmp_path, ROWS + row))


def test_the_simulator_runs_a_pod_list_and_says_what_it_skipped(tmp_path: Path) -> None:
    proc = _simulate(_pods(tmp_path), tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "an Alibaba GPU-sharing pod list: 4 GPU jobs; skipped 1 CPU-only pods" in proc.stdout
    assert "4 jobs, rebased to t=0" in proc.stdout


def test_a_pod_list_without_a_column_it_needs_says_which(tmp_path: Path) -> None:
    """A pod list that lost scheduled_time was told it lacked arrival_time_s, duration_s
    and gpu_num, the project's own columns, none of which it could have."""
    path = tmp_path / "pods.csv"
    path.write_text(HEADER.replace(",scheduled_time", "") + "pod-a,1,1,1,1000,,LS,Running,1,2\n")
    with pytest.raises(ValueError) as caught:
        read_trace(path)
    said = "missing columns ['scheduled_time'] (read as an Alibaba GPU-sharing pod list)"
    assert str(caught.value) == f"{path}: {said}"
    path.write_text("when,gpu_num\n1,1\n")  # no layout's own column: the project's format
    with pytest.raises(ValueError, match=r"missing columns \['arrival_time_s', 'duration_s'\]$"):
        read_trace(path)


def test_the_hami_baseline_packs_the_pods_by_their_declared_shares(tmp_path: Path) -> None:
    """Two quarter-GPU pods on a one-GPU cluster: HAMi places both on the GPU at once,
    FIFO on whole GPUs runs them one after the other."""
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.runner import Experiment, run_one

    path = tmp_path / "pods.csv"  # a workload column, so both fit one GPU's memory
    path.write_text(
        HEADER.replace("\n", ",workload\n")
        + "pod-a,1,1,1,250,,BE,Succeeded,0,3600,0,ncf\n"
        + "pod-b,1,1,1,250,,BE,Succeeded,10,3610,10,ncf\n"
    )
    jobs = tuple(read_trace(path).jobs)
    exp = Experiment(trace=jobs, cluster=ClusterSpec(gpus=1), seed=0)
    shared: dict[str, float] = {}
    for name in ("hami", "volcano"):
        plans: list[float] = []
        run_one(
            name, exp, planned=lambda plan, seen=plans: seen.append(plan.stats["colocated_devices"])
        )
        shared[name] = max(plans)
    assert shared == {"hami": 1.0, "volcano": 0.0}
