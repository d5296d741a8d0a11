"""Result files of benchmarks/ are written whole or not at all (``benchmarks/_results.py``).

The scripts wrote their tables with ``Path.write_text``: a full disk or a file size limit
left a cut-off table under the result's name that read like a finished one, and a
folder that could not be made or written was a traceback, sometimes after hours of
runs.  Now a failed write is one line naming the file and the reason (exit 1), and the
target is left as it was."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def results(monkeypatch):
    return load_benchmark("_results", monkeypatch)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_result_is_written_whole_and_replaces_the_old_one(results, tmp_path):
    target = tmp_path / "table.md"
    target.write_text("old\n")
    results.write_text(target, "| a |\n|---|\n")
    assert target.read_text() == "| a |\n|---|\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]  # no temporary file left


def test_a_missing_folder_is_one_line_naming_the_file(results, tmp_path, capsys):
    target = tmp_path / "nowhere" / "table.md"
    with pytest.raises(SystemExit) as exit_:
        results.write_text(target, "x")
    assert exit_.value.code == 1
    line = _error_line(capsys)
    assert line.endswith(f"error: cannot write {target}: No such file or directory"), line
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_folder_is_one_line_and_keeps_the_old_file(results, tmp_path, capsys):
    target = tmp_path / "table.md"
    target.write_text("old\n")
    tmp_path.chmod(0o555)
    try:
        with pytest.raises(SystemExit) as exit_:
            results.write_text(target, "new\n")
    finally:
        tmp_path.chmod(0o755)
    assert exit_.value.code == 1
    assert _error_line(capsys).endswith(f"cannot write {target}: Permission denied")
    assert target.read_text() == "old\n"


def test_a_full_disk_half_way_leaves_the_old_table_and_no_part_file(
    results, tmp_path, capsys, monkeypatch
):
    """ENOSPC after the first bytes went out: the old table stays, whole, and the
    temporary file holding the first bytes is removed."""
    target = tmp_path / "table.md"
    target.write_text("old table\n")
    real_write = os.write
    calls = []

    def full_disk(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:10])  # a short write first
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(SystemExit) as exit_:
        results.write_text(target, "a new table of more than ten bytes\n")
    monkeypatch.undo()
    assert exit_.value.code == 1
    assert len(calls) == 2  # the short write was continued, then the disk was full
    assert _error_line(capsys).endswith(f"cannot write {target}: No space left on device")
    assert target.read_text() == "old table\n"
    assert [p.name for p in tmp_path.iterdir()] == ["table.md"]


def test_files_of_one_block_are_renamed_together_or_not_at_all(results, tmp_path, capsys):
    first, second = tmp_path / "a.md", tmp_path / "b.md"
    first.write_text("old a\n")
    with pytest.raises(SystemExit), results.results() as out:
        out.text(first, "new a\n")
        out.text(tmp_path / "missing" / "b.md", "new b\n")
    assert first.read_text() == "old a\n"  # not renamed: its partner failed
    assert not second.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["a.md"]
    assert "missing/b.md: No such file or directory" in _error_line(capsys)


def test_a_fifo_or_device_in_a_results_place_is_refused_not_replaced(results, tmp_path, capsys):
    """Renaming onto it would have swapped a FIFO (or ``/dev/null``) for a regular file."""
    fifo = tmp_path / "table.md"
    os.mkfifo(fifo)
    with pytest.raises(SystemExit):
        results.write_text(fifo, "x")
    assert _error_line(capsys).endswith(f"cannot write {fifo}: not a regular file (a FIFO, "
                                        "socket or device)")  # fmt: skip
    assert fifo.is_fifo()


def test_a_file_in_the_way_of_a_results_folder_is_one_line(results, tmp_path, capsys):
    blocker = tmp_path / "results"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exit_:
        results.folder(blocker / "loop")
    assert exit_.value.code == 1
    assert "cannot write " + str(blocker / "loop") in _error_line(capsys)


def _limit_file_size() -> None:
    """In the child: files may grow to 64 bytes only, and more is an EFBIG error rather
    than the SIGXFSZ that would kill the process (what a disk filling up looks like)."""
    import resource
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))


def _loop_eval(out: Path, *more: str, limit: bool = False) -> subprocess.CompletedProcess[str]:
    tiny = ["--scenario", "load100", "--gpus", "4", "--hours", "0.5", "--policy", "volcano"]
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "loop_eval.py"), *tiny, "--out", str(out),
         *more],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        preexec_fn=_limit_file_size if limit else None,
    )  # fmt: skip


def test_loop_eval_on_a_full_disk_keeps_the_earlier_table_whole(tmp_path):
    """A re-run (``--resume``: the saved part is read, only the table is written) whose
    table write fails: it was a traceback and a table cut off at 64 bytes."""
    out = tmp_path / "loop"
    assert _loop_eval(out).returncode == 0
    table = out / "load100_4g_0.5h.md"
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert len(before[table.relative_to(out)]) > 64
    proc = _loop_eval(out, "--resume", limit=True)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error == f"loop_eval.py: error: cannot write {table}: File too large", error
    after = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert after == before  # no cut-off table, no temporary file


def test_loop_eval_with_a_file_for_its_folder_is_one_line(tmp_path):
    blocker = tmp_path / "out"
    blocker.write_text("not a folder\n")
    proc = _loop_eval(blocker)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    (error,) = proc.stderr.strip().splitlines()
    assert error.startswith(f"loop_eval.py: error: cannot write {blocker}"), error
    assert blocker.read_text() == "not a folder\n"


def test_edge_fuzz_refuses_an_unwritable_out_before_its_requests(tmp_path):
    """``--out`` in a missing folder was a traceback after the whole run (100,000
    requests by default); now one line before the first."""
    target = tmp_path / "nowhere" / "edge_fuzz.md"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "edge_fuzz.py"), "--out", str(target)],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    (error,) = proc.stderr.strip().splitlines()
    assert error == f"edge_fuzz.py: error: cannot write {target}: No such file or directory"
    assert proc.stdout == ""


SCRATCH = {
    # (script, text of the line): files a script makes for its own run, not results
    ("edge_fuzz.py", 'cluster_file.write_text(json.dumps({"kind": "List"'),
    ("edge_fuzz.py", '(work / "token").write_text(token)'),
    ("edge_fuzz.py", 'with log_path.open("w") as log:'),
    ("shim_real_cuda.py", "program.write_text("),
    ("online_transfer.py", 'with open(target, "w", newline="", encoding="utf-8")'),
    ("extender_latency.py", 'tempfile.NamedTemporaryFile("w"'),
}
WRITES = re.compile(r"\.write_text\(|\.write_bytes\(|open\([^)]*[\"'][wax]b?[\"']|\.savefig\(|"
                    r"NamedTemporaryFile\(")  # fmt: skip


def test_every_result_write_of_a_benchmark_goes_through_results():
    """A new ``write_text`` in benchmarks/ would bring the cut-off table back: every
    write found is ``_results``' or a listed scratch file."""
    found = set()
    for script in sorted((ROOT / "benchmarks").glob("*.py")):
        if script.name == "_results.py":
            continue
        for line in script.read_text().splitlines():
            if WRITES.search(line) and "_results" not in line and "staged" not in line:
                match = [s for s in SCRATCH if s[0] == script.name and s[1] in line]
                assert match, f"{script.name}: {line.strip()}"
                found.update(match)
    assert found == SCRATCH  # the list names no write that is gone
