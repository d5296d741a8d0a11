"""Files a user names on a command line: a FIFO nobody writes to, a directory or a file
far too large is a one-line error naming the file, never a hang or a read into memory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli_validation import ENV, ROOT, free_port, no_traceback

HANG_S = 30
"""Each command fails within seconds; one that blocks on a FIFO is stopped after this."""

SIM_FAST = ["--no-progress", "--no-plots", "--jobs", "1"]


def make(kind: str, path: Path, size: int = 0) -> Path:
    """A FIFO, a directory, or a sparse file of ``size`` bytes (nothing written)."""
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as handle:
            handle.truncate(size)
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "elastico_extender.cli", *args],
        capture_output=True, text=True, timeout=HANG_S, env=ENV, cwd=ROOT,
    )  # fmt: skip
    no_traceback(done)
    return done


WHY = {
    "fifo": "not a regular file",
    "directory": "Is a directory",
    "huge": "larger than",
}


@pytest.mark.parametrize("kind", ["fifo", "directory", "huge"])
@pytest.mark.parametrize(
    ("option", "code", "huge"),
    [("--config", 2, 2 << 20), ("--embedded", 1, 1 << 30), ("--token-file", 1, 1 << 20)],
)
def test_serve_refuses_a_file_it_cannot_read_whole(option, code, huge, kind, tmp_path):
    path = make(kind, tmp_path / "given", huge)
    done = run("serve", "--port", free_port(), option, str(path))
    assert done.returncode == code, done.stderr
    assert str(path) in done.stderr and WHY[kind] in done.stderr, done.stderr
    assert "extender at" not in done.stderr


@pytest.mark.parametrize("option", ["--config", "--embedded", "--token-file"])
def test_serve_names_a_file_that_is_not_utf8_in_plain_words(option: str, tmp_path: Path) -> None:
    """A settings or token file saved in Latin-1: serve answered with the codec's own
    words ("'utf-8' codec can't decode byte 0xff in position 3: invalid start byte")."""
    path = tmp_path / "given"
    path.write_bytes(b"tok\xff\n")
    done = run("serve", "--port", free_port(), option, str(path))
    assert done.returncode in (1, 2), done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert str(path) in error and "not UTF-8 text (byte 0xff at offset 3)" in error, error
    assert "codec" not in done.stderr and "position" not in error, done.stderr


@pytest.mark.parametrize(
    ("option", "extra"),
    [
        ("--world-file", ["--world", "production"]),
        ("--trace", []),
        ("--interference", []),
    ],
)
def test_simulate_refuses_a_fifo_it_would_wait_on_for_ever(option, extra, tmp_path):
    """A FIFO nobody writes to hung the run before it started (the world and pair files
    are read again by each policy's worker, so even a fed FIFO would not do)."""
    fifo = make("fifo", tmp_path / "given")
    done = run("simulate", option, str(fifo), *extra, *SIM_FAST, "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert option in error and str(fifo) in error and "not a regular file" in error


def test_staged_files_keep_a_links_target_and_a_files_mode(tmp_path: Path) -> None:
    """Results staged under temporary names (userfiles.Staging) must land where writing
    them in place did: through a link to a file elsewhere (not over the link), with the
    mode a rewritten file had; a failure leaves the targets and no temporary file."""
    from elastico_extender.userfiles import Staging

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "jobs.csv").write_text("old\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "jobs.csv").symlink_to(elsewhere / "jobs.csv")
    (out / "tables.md").write_text("old\n")
    (out / "tables.md").chmod(0o640)
    with pytest.raises(OSError) as caught, Staging() as staged:
        staged(out / "tables.md").write_text("new\n")
        raise OSError(28, "No space left on device", str(staged(out / "jobs.csv")))
    assert caught.value.filename == str(out / "jobs.csv")  # the user's name, not the temporary
    assert sorted(p.name for p in out.iterdir()) == ["jobs.csv", "tables.md"]
    assert [p.name for p in elsewhere.iterdir()] == ["jobs.csv"]
    assert (out / "tables.md").read_text() == "old\n"
    with Staging() as staged:
        staged(out / "tables.md").write_text("new\n")
        staged(out / "jobs.csv").write_text("new\n")
    assert (out / "jobs.csv").is_symlink() and (elsewhere / "jobs.csv").read_text() == "new\n"
    assert (out / "tables.md").read_text() == "new\n"
    assert (out / "tables.md").stat().st_mode & 0o777 == 0o640
