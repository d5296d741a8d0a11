"""Alibaba PAI's GPU cluster trace of 2020 (``cluster-trace-gpu-v2020``) as ``--trace
pai:DIR``: the job and task tables joined into one simulated job per PAI job, read
headerless as published, CPU-only, unlaunched and unfinished jobs skipped and said,
every bad cell named by file, line and column.  The rows are our own, in the tables'
published column order and number format (floats, empty cells, 0 for "not launched")."""

from __future__ import annotations

import gzip
import re
import tarfile
from pathlib import Path

import pytest
from conftest import simulate

from elastico_extender.sim import pai_trace as pai
from elastico_extender.sim.traces import days_window

JOB_HEADER = "job_name,inst_id,user,status,start_time,end_time\n"
TASK_HEADER = (
    "job_name,task_name,inst_num,status,start_time,end_time,plan_cpu,plan_mem,plan_gpu,gpu_type\n"
)
JOBS = (
    "ja01,i01,ua,Terminated,1000.0,4700.0\n"  # a 2-GPU gang beside a CPU-only ps
    "ja02,i02,ub,Terminated,2000.0,2700.0\n"  # half a GPU
    "ja03,i03,ua,Failed,3000.0,3400.0\n"  # 1.5 + 0.25 GPUs; failed after running 300 s
    "ja04,i04,uc,Terminated,4000.0,4100.0\n"  # CPU only
    "ja05,i05,ub,Running,5000.0,\n"  # still running when the trace ends
    "ja06,i06,uc,Waiting,6000.0,\n"  # never launched
    "ja07,i07,ud,Terminated,90000.0,93700.0\n"  # the next day; its evaluator never launched
    "ja09,i09,ud,Failed,7000.0,7000.0\n"  # no task row
)
TASKS = (
    "ja01,ps,1.0,Terminated,1005.0,4620.0,600.0,29.296875,,\n"
    "ja01,worker,2.0,Terminated,1010.0,4610.0,800.0,40.0,100.0,V100\n"
    "ja02,tensorflow,1.0,Terminated,2030.0,2630.0,400.0,10.0,50.0,T4\n"
    "ja03,worker,3.0,Failed,3100.0,3400.0,400.0,10.0,50.0,P100\n"
    "ja03,evaluator,1.0,Failed,3150.0,3300.0,100.0,5.0,25.0,P100\n"
    "ja04,tensorflow,1.0,Terminated,4010.0,4090.0,200.0,2.0,0.0,\n"
    "ja05,worker,1.0,Running,5010.0,,600.0,30.0,100.0,V100M32\n"
    "ja06,worker,1.0,Waiting,0.0,0.0,600.0,30.0,100.0,\n"
    "ja07,worker,4.0,Terminated,90060.0,93660.0,800.0,60.0,100.0,V100M32\n"
    "ja07,evaluator,1.0,Failed,0.0,0.0,100.0,5.0,100.0,MISC\n"
    "ja08,worker,1.0,Terminated,8000.0,8500.0,100.0,5.0,100.0,MISC\n"  # no job row
)
KEPT = [  # (job, arrival, GPUs, run time, user, share)
    ("ja01", 1000.0, 2, 3600.0, "ua", 1.0),  # its GPU task's run: the ps held no GPU
    ("ja02", 2000.0, 1, 600.0, "ub", 0.5),
    ("ja03", 3000.0, 2, 300.0, "ua", 1.0),  # 1.75 GPUs, rounded up
    ("ja07", 90000.0, 4, 3600.0, "ud", 1.0),  # the unlaunched evaluator held none
]


def _folder(
    tmp_path: Path, jobs: str | None = JOBS, tasks: str = TASKS, headers: bool = False
) -> Path:
    """A folder as unpacked from the trace's tarballs (optionally with its .header files)."""
    folder = tmp_path / "pai"
    folder.mkdir(exist_ok=True)
    if jobs is not None:
        (folder / "pai_job_table.csv").write_text(jobs)
    (folder / "pai_task_table.csv").write_text(tasks)
    if headers:
        (folder / "pai_job_table.header").write_text(JOB_HEADER)
        (folder / "pai_task_table.header").write_text(TASK_HEADER)
    return folder


def _kept(folder: Path) -> list[tuple[str, float, int, float, str, float]]:
    jobs = pai.pai_trace(folder).jobs
    return [(j.job_id, j.arrival_s, j.gpus, j.duration_s, j.user, j.gpu_share) for j in jobs]


def test_each_pai_job_with_gpus_that_ran_is_one_job_from_its_submission(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    loaded = pai.pai_trace(folder)
    assert _kept(folder) == KEPT
    assert all(j.workload for j in loaded.jobs)
    name = f"pai:{folder}"
    assert loaded.notes[0].startswith(f"{name}: read pai_job_table.csv")
    assert loaded.notes[1] == (
        f"{name}: Alibaba PAI's GPU cluster trace of 2020: 4 GPU jobs; skipped 1 CPU-only "
        "jobs (no task asks for a GPU) and 1 that never ran (no GPU task launched, or each "
        "ended as it launched) and 1 unfinished (a launched GPU task has no end_time)"
    )
    assert f"{name}: 1 one-GPU jobs asked for part of a GPU" in loaded.notes[2]
    assert f"{name}: 1 jobs asked for more than one GPU but not a whole number" in loaded.notes[3]
    assert loaded.notes[4].startswith(f"{name}: 4 jobs name no workload: drawn")
    assert loaded.notes[5:] == (
        f"{name}: skipped 1 GPU jobs of pai_task_table.csv with no row in pai_job_table.csv "
        "(no submission time or user)",
        f"{name}: skipped 1 jobs of pai_job_table.csv with no row in pai_task_table.csv",
    )


def test_the_header_files_name_the_column_order_when_present(tmp_path: Path) -> None:
    assert _kept(_folder(tmp_path, headers=True)) == KEPT
    # A .header in another order is followed: the cells move with it.
    folder = _folder(tmp_path)
    order = "user,job_name,inst_id,status,start_time,end_time\n"
    (folder / "pai_job_table.header").write_text(order)
    swapped = "".join(
        ",".join([cells[2], cells[0], cells[1], *cells[3:]]) + "\n"
        for cells in (line.split(",") for line in JOBS.splitlines())
    )
    (folder / "pai_job_table.csv").write_text(swapped)
    assert _kept(folder) == KEPT


def test_a_header_line_written_into_a_table_is_read_as_one(tmp_path: Path) -> None:
    assert _kept(_folder(tmp_path, JOB_HEADER + JOBS, TASK_HEADER + TASKS)) == KEPT


def test_a_header_file_without_a_column_the_reader_needs_names_both(tmp_path: Path) -> None:
    folder = _folder(tmp_path, headers=True)
    (folder / "pai_task_table.header").write_text(TASK_HEADER.replace(",plan_gpu", ""))
    with pytest.raises(ValueError, match=r"pai_task_table.header: names no column \['plan_gpu'\]"):
        pai.pai_trace(folder)


def test_the_task_table_alone_arrives_each_job_at_its_first_gpu_launch(tmp_path: Path) -> None:
    folder = _folder(tmp_path, jobs=None)
    loaded = pai.pai_trace(folder)
    assert [(j.job_id, j.arrival_s, j.gpus, j.duration_s, j.user) for j in loaded.jobs] == [
        ("ja01", 1010.0, 2, 3600.0, ""),
        ("ja02", 2030.0, 1, 600.0, ""),
        ("ja03", 3100.0, 2, 300.0, ""),
        ("ja08", 8000.0, 1, 500.0, ""),
        ("ja07", 90060.0, 4, 3600.0, ""),
    ]
    said = "no pai_job_table.csv: each job arrives at its first GPU task's launch"
    assert said in loaded.notes[0]


def test_days_keep_a_window_and_the_jobs_done_before_it_are_history(tmp_path: Path) -> None:
    window = days_window(pai.pai_trace(_folder(tmp_path)), (1.0, 2.0))
    assert [(j.job_id, j.arrival_s) for j in window.jobs] == [("ja07", 0.0)]
    assert sorted((h.gpus, h.duration_s, h.user) for h in window.history) == [
        (1, 600.0, "ub"),
        (2, 300.0, "ua"),
        (2, 3600.0, "ua"),
    ]


TASK_LINE = len(TASKS.splitlines()) + 1
JOB_LINE = len(JOBS.splitlines()) + 1


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("ja10,worker,two,Terminated,100.0,150.0,1.0,1.0,100.0,V100\n", "inst_num"),
        ("ja10,worker,70000.0,Terminated,100.0,150.0,1.0,1.0,100.0,V100\n", "inst_num"),
        ("ja10,worker,1.0,Terminated,100.0,150.0,1.0,1.0,lots,V100\n", "plan_gpu"),
        ("ja10,worker,1.0,Terminated,100.0,150.0,1.0,1.0,-50.0,V100\n", "plan_gpu"),
        ("ja10,worker,1.0,Terminated,nan,150.0,1.0,1.0,100.0,V100\n", "start_time"),
        ("ja10,worker,1.0,Terminated,100.0,1e12,1.0,1.0,100.0,V100\n", "end_time"),
        ("ja10,worker,1.0,Terminated,100.0,-inf,1.0,1.0,100.0,V100\n", "end_time"),
        # a second task that takes the job past the cluster's most GPUs
        ("ja07,ps,2.0,Terminated,100.0,150.0,1.0,1.0,3276800.0,V100\n", "plan_gpu"),
    ],
)
def test_a_bad_task_cell_names_its_file_line_and_column(
    tmp_path: Path, row: str, column: str
) -> None:
    with pytest.raises(ValueError, match=f"pai_task_table.csv, line {TASK_LINE}: column {column}"):
        pai.pai_trace(_folder(tmp_path, tasks=TASKS + row))


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("ja08,i08,ue,Terminated,abc,9000.0\n", "start_time"),
        ("ja08,i08,ue,Terminated,inf,9000.0\n", "start_time"),
    ],
)
def test_a_bad_job_cell_names_its_file_line_and_column(
    tmp_path: Path, row: str, column: str
) -> None:
    with pytest.raises(ValueError, match=f"pai_job_table.csv, line {JOB_LINE}: column {column}"):
        pai.pai_trace(_folder(tmp_path, jobs=JOBS + row))


def test_a_row_with_more_cells_than_the_table_has_columns_names_its_line(tmp_path: Path) -> None:
    row = "ja10,worker,1.0,Terminated,100.0,150.0,1.0,1.0,100.0,V100,extra\n"
    with pytest.raises(ValueError, match=f"pai_task_table.csv, line {TASK_LINE}: more cells"):
        pai.pai_trace(_folder(tmp_path, tasks=TASKS + row))


def test_a_folder_without_the_task_table_says_what_it_needs(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"pai_task_table.csv: cannot read: No such file"):
        pai.pai_trace(tmp_path)


def test_the_jobs_a_task_table_may_name_are_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-job aggregate is the reader's only memory that grows with the file."""
    monkeypatch.setattr(pai, "MAX_PAI_JOBS", 3)
    said = "pai_task_table.csv, line 6: column job_name: more than 3 jobs"
    with pytest.raises(ValueError, match=re.escape(said)):
        pai.pai_trace(_folder(tmp_path))


def test_a_table_over_the_size_bound_is_refused_before_it_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pai, "MAX_PAI_TABLE_BYTES", 100)
    said = "pai_task_table.csv: cannot read: larger than 100 bytes"
    with pytest.raises(ValueError, match=re.escape(said)):
        pai.pai_trace(_folder(tmp_path))


FAST = ["--policy", "volcano", "--no-progress", "--no-plots"]


def test_the_simulator_runs_a_pai_folder_quickly_and_says_what_it_skipped(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    proc = simulate("--trace", f"pai:{folder}", "--quick", *FAST, "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Alibaba PAI's GPU cluster trace of 2020: 4 GPU jobs; skipped 1 CPU-only" in proc.stdout
    assert f"pai:{folder}: 4 jobs, rebased to t=0" in proc.stdout
    assert "kept the 3 of 4 jobs arriving in the first 6 h" in proc.stdout
    assert (tmp_path / "o" / "tables.md").is_file()


def test_days_on_a_pai_folder_keep_the_window_with_its_history(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    argv = ["--trace", f"pai:{folder}", "--days", "1:2", "--gpus", "8", *FAST]
    proc = simulate(*argv, "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "trace=pai:" in proc.stdout and " jobs=1 " in proc.stdout
    assert (
        "--days: kept the 1 of 4 jobs arriving in days 1-2, rebased to t=0; the 3 that "
        "finished before day 1 are the history"
    ) in proc.stdout


@pytest.mark.parametrize(
    ("trace", "said"),
    [
        ("bad-cell", f"pai_task_table.csv, line {TASK_LINE}: column plan_gpu: not a number"),
        ("no-folder", "pai_task_table.csv: cannot read: No such file or directory"),
        ("table-path", "a table of Alibaba PAI's 2020 trace, which has no header row: give "),
    ],
)
def test_the_simulator_names_a_bad_pai_input_and_exits_2(
    tmp_path: Path, trace: str, said: str
) -> None:
    tasks = TASKS + "ja10,worker,1.0,Terminated,100.0,150.0,1.0,1.0,lots,V100\n"
    folder = _folder(tmp_path, tasks=tasks if trace == "bad-cell" else TASKS)
    given = {
        "bad-cell": f"pai:{folder}",
        "no-folder": f"pai:{tmp_path / 'nope'}",
        "table-path": str(folder / "pai_task_table.csv"),
    }[trace]
    proc = simulate("--trace", given, "--gpus", "8", *FAST, "--out", str(tmp_path / "o"))
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert said in proc.stderr and "Traceback" not in proc.stderr
    if trace == "table-path":
        assert f"--trace pai:{folder}" in proc.stderr


def _gzipped(path: Path) -> Path:
    """``path`` replaced by ``path.gz``, its gzip-compressed copy."""
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


def _tarred(path: Path, *, keep: bool = False) -> Path:
    """``x.csv`` packed as the trace publishes it: ``x.tar.gz`` holding ``x.csv``."""
    packed = path.with_name(path.name.removesuffix(".csv") + ".tar.gz")
    with tarfile.open(packed, "w:gz") as archive:
        archive.add(path, arcname=path.name)
    if not keep:
        path.unlink()
    return packed


def test_gzip_compressed_tables_are_read_as_the_unpacked_ones(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for table in ("pai_job_table", "pai_task_table"):
        _gzipped(folder / f"{table}.csv")
    loaded = pai.pai_trace(folder)
    assert _kept(folder) == KEPT
    assert loaded.notes[0].startswith(
        f"pai:{folder}: read pai_job_table.csv.gz (submissions, users) and pai_task_table.csv.gz"
    )


def test_the_published_tarballs_are_read_without_unpacking(tmp_path: Path) -> None:
    folder = _folder(tmp_path, headers=True)
    for table in ("pai_job_table", "pai_task_table"):
        _tarred(folder / f"{table}.csv")
    assert sorted(p.name for p in folder.iterdir()) == [
        "pai_job_table.header", "pai_job_table.tar.gz",
        "pai_task_table.header", "pai_task_table.tar.gz",
    ]  # fmt: skip
    assert _kept(folder) == KEPT
    said = "read pai_job_table.tar.gz member pai_job_table.csv (submissions, users)"
    assert said in pai.pai_trace(folder).notes[0]


def test_an_unpacked_table_beside_its_tarball_is_the_one_read(tmp_path: Path) -> None:
    """``tar -xzf`` leaves the tarball beside the table: the table is read (here the
    tarball holds another job table, which must not be)."""
    folder = _folder(tmp_path)
    _tarred(folder / "pai_job_table.csv", keep=True)
    (folder / "pai_job_table.csv").write_text(JOBS.replace(",ua,", ",uz,"))
    assert {j.user for j in pai.pai_trace(folder).jobs} == {"uz", "ub", "ud"}


def test_a_bad_cell_in_a_tarred_table_names_the_archive_its_table_and_line(tmp_path: Path) -> None:
    tasks = TASKS + "ja10,worker,1.0,Terminated,100.0,150.0,1.0,1.0,lots,V100\n"
    folder = _folder(tmp_path, tasks=tasks)
    packed = _tarred(folder / "pai_task_table.csv")
    said = f"{packed} member pai_task_table.csv, line {TASK_LINE}: column plan_gpu: not a number"
    with pytest.raises(ValueError, match=re.escape(said)):
        pai.pai_trace(folder)


@pytest.mark.parametrize(
    ("make", "said"),
    [
        ("no-member", "pai_task_table.tar.gz: holds no pai_task_table.csv"),
        ("not-tar", "pai_task_table.tar.gz: not a tar archive, or a damaged one"),
        ("cut-off", "pai_task_table.tar.gz: a damaged or cut-off gzip file"),
        ("link", "pai_task_table.tar.gz: its pai_task_table.csv is not a regular file"),
    ],
)
def test_a_tarball_that_is_not_the_published_one_is_named(
    tmp_path: Path, make: str, said: str
) -> None:
    folder = _folder(tmp_path)
    table = folder / "pai_task_table.csv"
    packed = folder / "pai_task_table.tar.gz"
    if make == "no-member":
        other = table.rename(folder / "other.csv")
        with tarfile.open(packed, "w:gz") as archive:
            archive.add(other, arcname="other.csv")
    elif make == "not-tar":
        packed.write_bytes(gzip.compress(table.read_bytes()))
        table.unlink()
    elif make == "cut-off":
        whole = _tarred(table).read_bytes()
        packed.write_bytes(whole[: len(whole) // 2])
    else:
        with tarfile.open(packed, "w:gz") as archive:
            link = tarfile.TarInfo("pai_task_table.csv")
            link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
            archive.addfile(link)
        table.unlink()
    with pytest.raises(ValueError, match=re.escape(said)):
        pai.pai_trace(folder)


@pytest.mark.parametrize("pack", [_gzipped, _tarred])
def test_compressed_tables_are_bounded_as_the_unpacked_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pack
) -> None:
    """A small compressed file must not inflate past the bound the plain table has."""
    folder = _folder(tmp_path, tasks=TASKS * 10)
    packed = pack(folder / "pai_task_table.csv")
    monkeypatch.setattr(pai, "MAX_PAI_TABLE_BYTES", 1000)
    assert packed.stat().st_size < 1000 < len(TASKS * 10)
    with pytest.raises(ValueError, match=re.escape(f"{packed}: cannot read: ")) as error:
        pai.pai_trace(folder)
    assert "1,000 bytes" in str(error.value)


# Rows in the published layout that a real table holds and a rule sets aside or reads
# in a documented way (pai_trace.ODD); each comment says which.
ODD_TASKS = (
    "jb01,worker,0.0,Terminated,100.0,700.0,600.0,29.296875,100.0,V100\n"  # no instances
    "jb02,worker,1.5,Terminated,100.0,700.0,600.0,29.296875,100.0,V100\n"  # half an instance
    "jb03,worker,,Terminated,100.0,700.0,600.0,29.296875,100.0,V100\n"  # inst_num empty
    "jb04,worker,1.0,Failed,900.0,700.0,600.0,29.296875,100.0,P100\n"  # ends before it starts
    "jb05,worker,1.0,Terminated,-100.0,700.0,600.0,29.296875,100.0,V100\n"  # negative
    ",worker,1.0,Terminated,100.0,700.0,600.0,29.296875,100.0,V100\n"  # no job_name
    "jb06,worker,4.0,Terminated,100.0,700.0,600.0,10.0,25.0,T4\n"  # 4 x 25%: one GPU
    "jb07,tensorflow,1.0,Terminated,100.0,700.0,400.0,5.0,10.0,T4\n"  # a tenth of one
    "jb08,worker,1.0,Terminated,100.0,700.0,4800.0,200.0,600.0,V100M32\n"  # six in one instance
    "jb09,worker,1.0,Terminated,100.0,700.0,800.0,40.0,150.0,V100\n"  # 1.5: two GPUs
    "jb10,worker,3.0,Terminated,100.0,700.0,400.0,5.0,33.333333,T4\n"  # 3 x a third: one
    "jb10,ps,1.0,Terminated,100.0,900.0,600.0,5.0\n"  # short: plan_gpu and gpu_type missing
)
ODD_JOBS = (
    "".join(
        f"jb{k:02d},i{k:02d},u{k % 3},Terminated,{'' if k == 7 else '150.0' if k == 8 else '50.0'},"
        "710.0\n"
        for k in range(1, 11)
    )
    + "jb06,i11,u9,Terminated,20.0,710.0\n"
)  # jb06 listed again: its first row is read


def test_odd_rows_of_a_real_table_are_set_aside_by_rule_counted_and_located(
    tmp_path: Path,
) -> None:
    folder = _folder(tmp_path, jobs=ODD_JOBS, tasks=ODD_TASKS)
    loaded = pai.pai_trace(folder)
    assert _kept(folder) == [
        ("jb06", 50.0, 1, 600.0, "u0", 1.0),  # four quarter GPUs fill one GPU
        ("jb09", 50.0, 2, 600.0, "u0", 1.0),  # rounded up
        ("jb10", 50.0, 1, 600.0, "u1", 1.0),  # 3 x 33.333333 is one GPU, not two
        ("jb07", 100.0, 1, 600.0, "u1", 0.1),  # no submission: arrives at its launch
        ("jb08", 100.0, 6, 600.0, "u2", 1.0),  # submitted after its launch: at the launch
    ]
    name = f"pai:{folder}"
    tasks, jobs = folder / "pai_task_table.csv", folder / "pai_job_table.csv"
    for said in (
        f"{name}: skipped 3 jobs with a launched GPU task whose inst_num is empty, under 1 or "
        f"not a whole number (how many GPUs it held is unknown) (the first: {tasks}, line 1)",
        f"{name}: skipped 2 jobs with a GPU task whose start_time or end_time is negative, or "
        f"that ends before it starts (how long it held them is unknown) (the first: {tasks}, "
        "line 4)",
        f"{name}: skipped 1 task rows without a job_name (no job to add them to) (the first: "
        f"{tasks}, line 6)",
        f"{name}: skipped 1 rows of pai_job_table that repeat a job_name (its first row is "
        f"read) (the first: {jobs}, line 11)",
        f"{name}: 2 jobs without a submission time (an empty start_time in pai_job_table) or "
        f"submitted after their first GPU launch: they arrive at that launch (the first: "
        f"{jobs}, line 7)",
        f"{name}: 1 one-GPU jobs asked for part of a GPU",
        f"{name}: 1 jobs asked for more than one GPU but not a whole number",
    ):
        assert any(note.startswith(said) for note in loaded.notes), (said, loaded.notes)


def test_odd_rows_are_set_aside_alike_without_a_job_table(tmp_path: Path) -> None:
    folder = _folder(tmp_path, jobs=None, tasks=ODD_TASKS)
    assert [j.job_id for j in pai.pai_trace(folder).jobs] == [
        "jb06", "jb07", "jb08", "jb09", "jb10",
    ]  # fmt: skip


def test_a_compressed_table_is_refused_with_the_pai_form_when_named_itself(
    tmp_path: Path,
) -> None:
    for name in ("pai_task_table.csv.gz", "pai_job_table.tar.gz", "pai_task_table.csv"):
        assert pai.is_pai_table(str(tmp_path / name))
    assert not pai.is_pai_table(str(tmp_path / "cluster_log.csv.gz"))


def test_the_simulator_runs_the_published_tarballs_as_they_are(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    for table in ("pai_job_table", "pai_task_table"):
        _tarred(folder / f"{table}.csv")
    proc = simulate("--trace", f"pai:{folder}", "--quick", *FAST, "--out", str(tmp_path / "o"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "read pai_job_table.tar.gz member pai_job_table.csv" in proc.stdout
    assert "Alibaba PAI's GPU cluster trace of 2020: 4 GPU jobs" in proc.stdout
