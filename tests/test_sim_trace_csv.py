"""A user's trace or pair CSV: every bad cell is a clear error naming its line and column.

Found by feeding the simulator hand-broken traces: a NaN or infinite time made
the run step epochs forever, a huge duration died in numpy with a traceback, a
non-numeric cell surfaced Python's own conversion message, and zero GPUs, a
negative duration or a throughput floor of 7 were taken silently.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import simulate

from elastico_extender.sim.traces import MAX_TRACE_SECONDS, load_csv, philly_trace
from elastico_extender.sim.truth import load_pair_table

HEADER = "job_id,arrival_time_s,gpu_num,duration_s,workload,min_throughput_frac\n"
GOOD = "a,0,1,600,resnet50,0.3\n"


def _fails_naming(load: Callable[[], object], column: str, line: int = 3) -> None:
    """``load()`` raises ValueError naming ``line`` and ``column``, not Python's own words."""
    with pytest.raises(ValueError) as caught:
        load()
    message = str(caught.value)
    assert f"line {line}" in message and column in message, message
    assert "could not convert" not in message and "invalid literal" not in message


def _trace(tmp_path: Path, bad_row: str) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(HEADER + GOOD + bad_row)
    return path


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("b,x,1,600,resnet50,0.3\n", "arrival_time_s"),
        ("b,nan,1,600,resnet50,0.3\n", "arrival_time_s"),
        ("b,inf,1,600,resnet50,0.3\n", "arrival_time_s"),
        (f"b,{MAX_TRACE_SECONDS * 2},1,600,resnet50,0.3\n", "arrival_time_s"),
        ("b,10,x,600,resnet50,0.3\n", "gpu_num"),
        ("b,10,0,600,resnet50,0.3\n", "gpu_num"),
        ("b,10,-2,600,resnet50,0.3\n", "gpu_num"),
        ("b,10,1.5,600,resnet50,0.3\n", "gpu_num"),
        ("b,10,1e12,600,resnet50,0.3\n", "gpu_num"),
        ("b,10,1,,resnet50,0.3\n", "duration_s"),
        ("b,10,1,nan,resnet50,0.3\n", "duration_s"),
        ("b,10,1,-600,resnet50,0.3\n", "duration_s"),
        ("b,10,1,0,resnet50,0.3\n", "duration_s"),
        ("b,10,1,1e300,resnet50,0.3\n", "duration_s"),
        ("b,10,1,600,resnet50,7\n", "min_throughput_frac"),
        ("b,10,1,600,resnet50,-0.1\n", "min_throughput_frac"),
        ("b,10,1,600,resnet50,nan\n", "min_throughput_frac"),
        ("b,10,1,600,no-such-model,0.3\n", "workload"),
        ("a,10,1,600,resnet50,0.3\n", "job_id"),
    ],
)
def test_a_bad_cell_names_its_line_and_column(tmp_path: Path, row: str, column: str) -> None:
    path = _trace(tmp_path, row)
    _fails_naming(lambda: load_csv(path), column)


def test_a_row_with_too_few_cells_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="line 3"):
        load_csv(_trace(tmp_path, "b,10\n"))


def test_good_rows_load_as_written(tmp_path: Path) -> None:
    path = _trace(tmp_path, "b,10,2.0,7200,transformer,0\n")
    jobs = load_csv(path)
    assert [(j.job_id, j.arrival_s, j.gpus, j.duration_s, j.workload) for j in jobs] == [
        ("a", 0.0, 1, 600.0, "resnet50"),
        ("b", 10.0, 2, 7200.0, "transformer"),
    ]
    assert jobs[0].floor_frac == pytest.approx(0.3) and jobs[1].floor_frac == 0.0


def _simulate(
    trace: Path | str, tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`elastico simulate` of one FIFO policy on 8 GPUs, bounded in time."""
    argv = ["--trace", str(trace), "--gpus", "8", "--policy", "volcano", "--no-progress"]
    return simulate(*argv, "--no-plots", "--out", str(tmp_path / "o"), env=env)


@pytest.mark.parametrize("cell", ["nan", "inf", "1e300"])
def test_the_simulator_refuses_an_endless_trace_at_once(tmp_path: Path, cell: str) -> None:
    """Before the fix a NaN or infinite time ran for ever and 1e300 died in numpy."""
    path = _trace(tmp_path, f"b,10,1,{cell},resnet50,0.3\n")
    proc = _simulate(path, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "duration_s" in proc.stderr and "line 3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_gang_wider_than_the_cluster_is_clipped_and_said(tmp_path: Path) -> None:
    path = _trace(tmp_path, "b,10,16,600,resnet50,0.3\n")
    proc = _simulate(path, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "clipped 1 gang" in proc.stdout + proc.stderr


def test_arrivals_on_any_clock_load_in_order(tmp_path: Path) -> None:
    """Unix timestamps or negative offsets are fine: the simulator rebases the first to 0."""
    unix = tmp_path / "unix.csv"
    unix.write_text("arrival_time_s,gpu_num,duration_s\n1700000600,1,60\n1700000000,2,60\n")
    assert [j.arrival_s for j in load_csv(unix)] == [1.7e9, 1700000600.0]
    negative = tmp_path / "negative.csv"
    negative.write_text("arrival_time_s,gpu_num,duration_s\n30,1,60\n-5,2,60\n")
    assert [j.arrival_s for j in load_csv(negative)] == [-5.0, 30.0]


PAIRS = "gpu,job_a,job_b,slowdown_a,slowdown_b,measured\n"


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("v100,A3C,\n", "job_b"),
        ("v100,,A3C,1.2,1.3,1\n", "job_a"),
        ("v100,A3C,CycleGAN,x,1.3,1\n", "slowdown_a"),
        ("v100,A3C,CycleGAN,1.2,nan,1\n", "slowdown_b"),
        ("v100,A3C,CycleGAN,-1,1.3,1\n", "slowdown_a"),
        ("v100,A3C,CycleGAN,1e9,1.3,1\n", "slowdown_a"),
        ("v100,A3C,CycleGAN,,,1\n", "slowdown_a"),
    ],
)
def test_a_bad_pair_row_names_its_line_and_column(tmp_path: Path, row: str, column: str) -> None:
    path = tmp_path / "pairs.csv"
    path.write_text(PAIRS + "v100,A3C,A3C,1.5,1.5,1\n" + row)
    _fails_naming(lambda: load_pair_table(path), column)


def test_unmeasured_pair_rows_are_skipped_as_documented(tmp_path: Path) -> None:
    """Gavel's file leaves an unmeasured pair's slowdowns empty, with measured = 0."""
    path = tmp_path / "pairs.csv"
    path.write_text(PAIRS + "v100,A3C,CycleGAN,,,0\nv100,A3C,A3C,0.9,1.5,1\n")
    assert load_pair_table(path) == {("A3C", "A3C"): 1.0}


PHILLY = (
    "job_id,vc,arrival_time_s,gpu_num,duration_s,job_type_seed0\n"
    "j1,vc1,0,1,600,ResNet-18 (batch size 16)\n"
)


@pytest.mark.parametrize(
    ("row", "column"),
    [
        ("j2,vc1,abc,1,600,ResNet-18 (batch size 16)\n", "arrival_time_s"),
        ("j2,vc1,10,0,600,ResNet-18 (batch size 16)\n", "gpu_num"),
        ("j2,vc1,10,1,nan,ResNet-18 (batch size 16)\n", "duration_s"),
        ("j2,vc1,10,1,inf,ResNet-18 (batch size 16)\n", "duration_s"),
        ("j2,vc1,10,1,600,Nonsense (batch size 1)\n", "job_type_seed0"),
    ],
)
def test_a_bad_philly_cell_names_its_line_and_column(tmp_path: Path, row: str, column: str) -> None:
    """ELASTICO_DATA_DIR may point at a user's own copy of the per-VC traces."""
    path = tmp_path / "philly.csv"
    path.write_text(PHILLY + row)
    _fails_naming(lambda: philly_trace("vc1", path), column)


def test_a_philly_file_without_its_columns_says_which(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text("job_id,vc,arrival_time_s\nj1,vc1,0\n")
    with pytest.raises(ValueError, match=r"missing columns \['duration_s', 'gpu_num'"):
        philly_trace("vc1", path)


def test_a_nan_in_the_users_philly_copy_ends_the_simulation_at_once(tmp_path: Path) -> None:
    """Before the fix this ran for ever (a NaN duration never completes)."""
    (tmp_path / "philly_gavel_vc_traces.csv").write_text(
        PHILLY + "j2,vc1,10,1,nan,ResNet-18 (batch size 16)\n"
    )
    argv = ["--trace", "philly:vc1", "--gpus", "8", "--policy", "volcano", "--no-progress"]
    argv += ["--no-plots", "--out", str(tmp_path / "o")]
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "ELASTICO_DATA_DIR": str(tmp_path)},
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "duration_s" in proc.stderr and "Traceback" not in proc.stderr


def test_csvs_saved_with_a_byte_order_mark_are_read(tmp_path: Path) -> None:
    """Spreadsheets save 'CSV UTF-8' with a BOM: the first column keeps its name."""
    from elastico_extender.interference.dataset import load_pairs, shipped_csv
    from elastico_extender.sim.truth import DEFAULT_PAIRS

    trace = tmp_path / "trace.csv"
    trace.write_text(HEADER + GOOD, encoding="utf-8-sig")
    assert [j.job_id for j in load_csv(trace)] == ["a"]
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(Path(DEFAULT_PAIRS).read_text(), encoding="utf-8-sig")
    assert load_pair_table(pairs, "v100") == load_pair_table(DEFAULT_PAIRS, "v100")
    train = tmp_path / "train.csv"
    train.write_text(shipped_csv().read_text(), encoding="utf-8-sig")
    assert len(load_pairs(train)) == len(load_pairs(shipped_csv()))


def test_a_trace_in_another_row_order_loads_the_same_jobs(tmp_path: Path) -> None:
    """Workloads and floors drawn for rows that lack them belong to the job, not to its row.

    Before the fix they were drawn in row order, so the same jobs (same ids) listed in
    another order got each other's workloads and floors, and every result changed.
    """
    rows = ["a,0,1,600\n", "b,100,1,1200\n", "c,200,2,300\n", "d,200,1,900\n"]
    forward, backward = tmp_path / "forward.csv", tmp_path / "backward.csv"
    forward.write_text("job_id,arrival_time_s,gpu_num,duration_s\n" + "".join(rows))
    backward.write_text("job_id,arrival_time_s,gpu_num,duration_s\n" + "".join(rows[::-1]))
    assert load_csv(forward, seed=4) == load_csv(backward, seed=4)
    assert len({j.workload for j in load_csv(forward, seed=4)}) > 1  # still drawn, per job


@pytest.mark.parametrize("kind", ["trace", "pairs", "philly"])
def test_a_cell_over_the_csv_field_limit_is_an_error_naming_where(tmp_path: Path, kind) -> None:
    """A cell longer than Python's CSV field limit (131,072 characters: a minified JSON or
    a binary file given by mistake) raised csv.Error, a traceback from `elastico
    simulate`; it is a ValueError naming the file and the line, as every bad cell is."""
    big = "x" * 200_000
    path = tmp_path / f"{kind}.csv"
    if kind == "trace":
        path.write_text(HEADER + GOOD + f"b,10,1,600,{big},0.3\n")
        load: Callable[[], object] = lambda: load_csv(path)  # noqa: E731
    elif kind == "pairs":
        path.write_text(PAIRS + f"v100,{big},resnet50,1.2,1.3,1\n")
        load = lambda: load_pair_table(path)  # noqa: E731
    else:
        path.write_text(PHILLY + f"j2,vc1,10,1,600,{big}\n")
        load = lambda: philly_trace("vc1", path)  # noqa: E731
    with pytest.raises(ValueError) as caught:
        load()
    message = str(caught.value)
    assert str(path) in message and "line" in message and "field limit" in message, message


USER_CSV_HEADERS = {
    "trace": HEADER,
    "pairs": PAIRS,
    "philly": PHILLY.splitlines(keepends=True)[0],
    "train": "gpu,job_a,job_b,solo_tput_a,solo_tput_b,slowdown_a,slowdown_b\n",
}


def _user_row(kind: str, name: str) -> str:
    """A good row of ``kind`` whose job (or first job of the pair) is ``name``."""
    return {
        "trace": f"{name},0,1,600,resnet50,0.3\n",
        "pairs": f"v100,{name},A3C,1.5,1.5,1\n",
        "philly": f"{name},vc1,0,1,600,ResNet-18 (batch size 16)\n",
        "train": f"v100,{name},A3C,10,10,1.5,1.5\n",
    }[kind]


def _user_csv(tmp_path: Path, kind: str, text: bytes) -> tuple[Path, Callable[[], object]]:
    """A CSV of ``kind`` holding ``text``, and the loader that reads it."""
    from elastico_extender.interference.dataset import load_pairs

    path = tmp_path / f"{kind}.csv"
    path.write_bytes(text)
    loaders: dict[str, Callable[[], object]] = {
        "trace": lambda: load_csv(path),
        "pairs": lambda: load_pair_table(path),
        "philly": lambda: philly_trace("vc1", path),
        "train": lambda: load_pairs(path),
    }
    return path, loaders[kind]


@pytest.mark.parametrize("kind", ["trace", "pairs", "philly", "train"])
@pytest.mark.parametrize("good_rows", [1, 900])
def test_a_byte_that_is_not_utf8_names_the_file_and_its_line(
    tmp_path: Path, kind: str, good_rows: int
) -> None:
    """A Latin-1 'e acute' (0xe9) in a cell.  Before the fix the error was the codec's
    "can't decode byte 0xe9 in position 62: invalid continuation byte": no line, and a
    position counted in an 8 KiB chunk, not in the file."""
    good = "".join(_user_row(kind, f"job{k}") for k in range(good_rows))
    text = (USER_CSV_HEADERS[kind] + good).encode() + _user_row(kind, "Jos\xe9").encode("latin-1")
    path, load = _user_csv(tmp_path, kind, text)
    with pytest.raises(Exception) as caught:
        load()
    message = str(caught.value)
    assert str(path) in message and f"line {good_rows + 2}:" in message, message
    assert "not UTF-8 text" in message and "codec" not in message, message


@pytest.mark.parametrize("kind", ["trace", "pairs", "philly", "train"])
def test_a_column_named_twice_in_the_header_is_refused_naming_it(tmp_path: Path, kind: str) -> None:
    """``csv.DictReader`` keeps the last copy of a repeated column: a trace with two
    ``gpu_num`` columns ran on the second silently, a pair table on its second job_a."""
    column = "gpu_num" if kind in ("trace", "philly") else "job_a"
    header = USER_CSV_HEADERS[kind].rstrip("\n") + f",{column}\n"
    row = _user_row(kind, "j1").rstrip("\n") + ",4\n"
    path, load = _user_csv(tmp_path, kind, (header + row).encode())
    with pytest.raises(Exception) as caught:
        load()
    message = str(caught.value)
    assert str(path) in message and "line 1:" in message, message
    assert f"column {column!r} appears twice" in message, message


def _simulate_philly(data_dir: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`elastico simulate --trace philly:vc1` with ``ELASTICO_DATA_DIR=data_dir``."""
    return _simulate("philly:vc1", tmp_path, {**os.environ, "ELASTICO_DATA_DIR": str(data_dir)})


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("directory", "Is a directory"),
        ("fifo", "not a regular file"),
        ("gzip-garbage", "a damaged or cut-off gzip file"),
        ("gzip-cut", "a damaged or cut-off gzip file"),
        ("duplicate-ids", "line 3: column job_id: used by an earlier row"),
    ],
)
def test_a_bad_philly_copy_under_the_data_dir_is_an_error_naming_it(
    tmp_path: Path, kind: str, said: str
) -> None:
    """Before the fix: IsADirectoryError and EOFError tracebacks, a hang on a FIFO (the
    file was read whole with read_bytes), and "trace job ids must be unique" from the
    engine, naming no file or line."""
    import gzip

    path = tmp_path / "philly_gavel_vc_traces.csv"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "gzip-garbage":
        path.write_bytes(b"\x1f\x8bgarbage")
    elif kind == "gzip-cut":
        path.write_bytes(gzip.compress((PHILLY * 50).encode())[:-30])
    else:
        path.write_text(PHILLY + "j1,vc1,50,1,600,ResNet-18 (batch size 16)\n")
    proc = _simulate_philly(tmp_path, tmp_path)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "[Errno" not in error, proc.stderr[-2000:]
    assert error.startswith("elastico simulate: error: --trace:"), error
    assert str(path) in error and said in error, error


def test_a_gzipped_philly_copy_under_the_data_dir_is_read_and_named(tmp_path: Path) -> None:
    import gzip

    path = tmp_path / "philly_gavel_vc_traces.csv"
    path.write_bytes(gzip.compress((PHILLY + "j2,vc1,50,2,900,LM (batch size 20)\n").encode()))
    proc = _simulate_philly(tmp_path, tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"Philly trace read from {path}" in proc.stdout, proc.stdout


def test_a_data_dir_that_is_no_folder_is_refused_not_replaced_by_the_shipped_trace(
    tmp_path: Path,
) -> None:
    """A mistyped ELASTICO_DATA_DIR used to run the shipped trace, unsaid; a folder that
    holds no copy still does (the variable names a data folder for other files too),
    and the notes now say which file was read."""
    missing = tmp_path / "no-such-folder"
    proc = _simulate_philly(missing, tmp_path)
    error = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "ELASTICO_DATA_DIR" in error and str(missing) in error, error
    from elastico_extender.sim.traces import PHILLY_DATA

    shipped = philly_trace("ed69ec", days=(0.0, 1.0))
    assert f"Philly trace read from {PHILLY_DATA} (shipped with the package)" in shipped.notes


def test_durations_under_a_second_are_raised_to_one_and_said(tmp_path: Path) -> None:
    """The simulator runs a job for at least a second; before the fix a 0.25 s job became
    a 1 s job unsaid."""
    from elastico_extender.sim.traces import read_trace

    path = _trace(tmp_path, "b,10,1,0.25,resnet50,0.3\nc,20,1,0.5,resnet50,0.3\n")
    loaded = read_trace(path)
    assert [j.duration_s for j in loaded.jobs] == [600.0, 1.0, 1.0]
    assert "trace.csv: raised 2 durations under 1 s to 1 s" in " ".join(loaded.notes)
    assert not any("raised" in n for n in read_trace(_trace(tmp_path, "")).notes)


def test_rows_that_state_one_pair_differently_are_refused(tmp_path: Path) -> None:
    """Before the fix the first of two conflicting rows was kept, unsaid.  Rows that
    agree (in either order), and another GPU type's figure for the pair, are fine."""
    path = tmp_path / "pairs.csv"
    agreeing = "v100,A3C,CycleGAN,1.5,1.2,1\nv100,CycleGAN,A3C,1.2,1.5,1\np100,A3C,CycleGAN,2,2,1\n"
    path.write_text(PAIRS + agreeing)
    assert load_pair_table(path)[("A3C", "CycleGAN")] == 1.5
    path.write_text(PAIRS + agreeing + "v100,CycleGAN,A3C,1.2,1.9,1\n")
    with pytest.raises(ValueError) as caught:
        load_pair_table(path)
    message = str(caught.value)
    assert f"{path}, line 5: column slowdown_b:" in message, message
    assert "A3C next to CycleGAN on v100 is 1.5 on line 2" in message, message


def test_a_bad_cell_names_the_trace_once(tmp_path: Path) -> None:
    """The CLI printed "--trace: cannot read X: X, line 3: column ..." (the path twice)."""
    path = _trace(tmp_path, "b,10,x,600,resnet50,0.3\n")
    proc = _simulate(path, tmp_path)
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert error.count(str(path)) == 1 and f"{path}, line 3: column gpu_num" in error, error


def test_a_line_without_end_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    """A gzip copy that inflates to 200 MiB without a newline (a binary dump, a
    one-line export): the reader held the whole line, peaking near 460 MiB, before the
    CSV field limit refused it.  A line is now cut off at MAX_CSV_LINE characters, named
    with its number, and the reading process stays small."""
    import gzip

    path = tmp_path / "philly_gavel_vc_traces.csv"
    with gzip.open(path, "wb", compresslevel=1) as handle:
        handle.write(PHILLY.encode())
        for _ in range(200):
            handle.write(b"a" * (1 << 20))
    # VmHWM: this process's own peak (ru_maxrss would start at the forking pytest's)
    probe = (
        "import re, sys\n"
        "from elastico_extender.sim.traces import philly_trace\n"
        "try:\n"
        "    philly_trace('vc1', sys.argv[1])\n"
        "except ValueError as exc:\n"
        "    print(exc)\n"
        "status = open('/proc/self/status').read()\n"
        "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    error, peak_mib = proc.stdout.strip().splitlines()
    assert error.startswith(f"{path}, line 3: longer than 1,048,576 characters"), error
    assert int(peak_mib) < 160, peak_mib


def test_a_large_philly_copy_holds_only_the_asked_vcs_jobs(tmp_path: Path) -> None:
    """The Philly loader kept every record of the file as a CsvRow (a dict of cells)
    before picking the VC's: about 40 bytes of memory per byte of a short-rowed file,
    so a copy at the 256 MiB size bound peaked near 10 GiB.  Records are now read one
    at a time and only the VC's jobs kept: a 20 MiB copy of which the VC asked for has
    a few rows stays near the size of the process that reads it."""
    path = tmp_path / "philly_gavel_vc_traces.csv"
    rows = (f"j{k},{'mine' if k % 1000 == 0 else 'other'},{k},1,600,A3C\n" for k in range(700_000))
    path.write_text(PHILLY + "".join(rows))
    assert path.stat().st_size > 20 << 20
    probe = (
        "import re, sys\n"
        "from elastico_extender.sim.traces import philly_trace\n"
        "print(len(philly_trace('mine', sys.argv[1]).jobs))\n"
        "status = open('/proc/self/status').read()\n"
        "print(int(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1)) // 1024)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    jobs, peak_mib = proc.stdout.split()
    assert jobs == "700" and int(peak_mib) < 200, (jobs, peak_mib)


def test_a_trace_of_more_jobs_than_a_run_holds_is_refused_naming_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the 256 MiB file bound limited a trace's jobs: about 11 million short rows,
    some 4.4 GiB of jobs held and minutes of reading before a run that could never end
    (the synthetic generator stops at a million jobs).  A file of more than
    MAX_TRACE_JOBS jobs is now refused at the first row past it, naming the file and
    line; a Philly VC likewise (the bound is patched small here)."""
    from elastico_extender.sim import traces

    monkeypatch.setattr(traces, "MAX_TRACE_JOBS", 5)
    path = tmp_path / "many.csv"
    path.write_text(
        "arrival_time_s,gpu_num,duration_s\n" + "".join(f"{k},1,60\n" for k in range(6))
    )
    with pytest.raises(ValueError, match=rf"^{path}, line 7: more than 5 jobs \(the most"):
        load_csv(path)
    path.write_text(
        "arrival_time_s,gpu_num,duration_s\n" + "".join(f"{k},1,60\n" for k in range(5))
    )
    assert len(load_csv(path)) == 5
    philly = tmp_path / "philly.csv"
    rows = "".join(f"j{k},vc1,{k},1,600,A3C\n" for k in range(2, 8))
    philly.write_text(PHILLY + rows)
    with pytest.raises(ValueError, match=rf"^{philly}, line 7: more than 5 jobs of VC vc1"):
        philly_trace("vc1", philly)
