"""Result files of the benchmark scripts, written whole or not at all.

A table written with ``Path.write_text`` that fails half-way (a full disk, a file size
limit, an interrupt) leaves a cut-off file under the result's name that reads like a
finished table, and a missing or read-only folder was a traceback, sometimes after
hours of runs.  Every result write of ``benchmarks/`` goes through here instead: the
content goes to a temporary name beside the target and is renamed into place once
written (``elastico_extender.userfiles.Staging``, as ``elastico simulate --out`` does),
and a failure ends the script with one line naming the file and the reason, exit code
1 (``SystemExit``), leaving the target as it was and no temporary file behind.

Call these from the process that owns the run, never from a ``multiprocessing.Pool``
worker: a worker that raises ``SystemExit`` dies without answering and the pool waits
for its result forever (return the content to the parent and write it there).
Scratch files a script makes for itself (a server's log, a generated cluster file in a
temporary folder) are inputs, not results, and stay as they are.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

from elastico_extender.userfiles import Staging, check_regular, check_writable, reason

__all__ = ["Results", "check", "folder", "results", "write_text"]

EXIT = 1
"""The exit code of a failed write (argparse keeps 2 for a bad argument)."""


def _fail(exc: OSError, fallback: Path | None = None) -> NoReturn:
    """One line on stderr naming the file and why, exit :data:`EXIT`.  A write that fails
    after the open (a full disk) carries no file name: ``fallback`` names it then."""
    name = exc.filename if exc.filename is not None else fallback
    script = Path(sys.argv[0]).name or "benchmark"
    print(f"{script}: error: cannot write {name}: {reason(exc)}", file=sys.stderr)
    raise SystemExit(EXIT) from None


class Results:
    """The result files of one :func:`results` block, renamed into place together when the
    block ends without an error (none of them when one fails)."""

    def __init__(self, staging: Staging) -> None:
        self._staging = staging
        self.last: Path | None = None
        """The target staged last: what a failure without a file name is about."""

    def path(self, target: str | Path) -> Path:
        """The temporary path to write ``target``'s content to, for a writer of its own (a
        csv writer, ``savefig``).  It ends in ``.part``: give such a writer its format
        (``savefig(..., format="png")``) rather than letting it guess from the name."""
        self.last = Path(target)
        if os.path.exists(target):  # renamed onto, a device or FIFO would be replaced
            check_regular(os.stat(target).st_mode, target)
        return self._staging(target)

    def text(self, target: str | Path, text: str) -> None:
        """``text`` (UTF-8) as ``target``'s content.  Written with ``os.write`` until every
        byte is out: a short write is continued, an error (ENOSPC, EFBIG) raised."""
        temp = self.path(target)
        data = memoryview(text.encode("utf-8"))
        fd = os.open(temp, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
        try:
            while data:
                data = data[os.write(fd, data) :]
        finally:
            os.close(fd)

    def save(self, target: str | Path, write: Callable[[Path], object]) -> None:
        """``write(path)`` writes ``target``'s content to ``path`` (``fig.savefig`` with an
        explicit format, a CSV writer)."""
        write(self.path(target))


@contextlib.contextmanager
def results() -> Iterator[Results]:
    """Result files written inside the block, committed together on a clean exit; an
    OSError in it (keep the block to writes) is the one-line error of :func:`_fail`."""
    out: Results | None = None
    try:
        with Staging() as staging:
            out = Results(staging)
            yield out
    except OSError as exc:  # Staging named its target, not the temporary file
        _fail(exc, out.last if out is not None else None)


def write_text(target: str | Path, text: str) -> None:
    """One result file: ``text`` as ``target``'s whole content, or the one-line error."""
    with results() as out:
        out.text(target, text)


def folder(path: str | Path) -> Path:
    """``path`` made (with its parents) if missing, for results to go into; a file in the
    way, or a folder that cannot be made, is the one-line error."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not path.is_dir():  # a link to a file passes mkdir's exist_ok
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
    except OSError as exc:
        _fail(exc, path)
    return path


def check(target: str | Path) -> None:
    """Before a long run: the one-line error unless ``target`` could be written now (its
    folder exists and takes a new file, it is no folder or FIFO)."""
    try:
        check_writable(target)
    except OSError as exc:
        _fail(exc, Path(target))
