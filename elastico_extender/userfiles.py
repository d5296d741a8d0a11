"""Files a user names (settings, cluster, token, world and trace files): read bounded,
never blocking.

A FIFO nobody writes to would block ``open`` forever, and ``/dev/zero`` or a runaway
file would be read whole into memory; both are refused here with an :class:`OSError`
whose ``strerror`` says why, which is what every caller already reports.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

__all__ = [
    "Staging",
    "YamlError",
    "check_regular",
    "check_writable",
    "open_regular",
    "parse_yaml",
    "read_bounded",
    "read_text",
    "reason",
]


def _too_large(path: str | Path, max_bytes: int) -> OSError:
    return OSError(errno.EFBIG, f"larger than {max_bytes:,} bytes", str(path))


def check_regular(mode: int, path: str | Path) -> None:
    """OSError unless ``mode`` (an ``st_mode``) is a regular file's: a directory, FIFO,
    socket or device is refused before anything opens it (a FIFO would block the open
    until a writer, or a reader, came)."""
    if stat.S_ISDIR(mode):
        raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(path))
    if not stat.S_ISREG(mode):
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, socket or device)", str(path))


def check_writable(path: str | Path) -> None:
    """OSError unless ``path`` can be written as a regular file, found out by opening it
    to append (never blocking: a FIFO is refused, not waited on); a file created to
    find out is removed again.  For a long job's output: fail before the work."""
    if os.path.lexists(path) and not os.path.exists(path):
        raise FileNotFoundError(errno.ENOENT, "a link to nothing", str(path))
    if os.path.exists(path):
        check_regular(os.stat(path).st_mode, path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd, created = os.open(path, flags), False
    except FileNotFoundError:
        # O_EXCL: the probe is this call's own file, so removing it removes nobody's
        # (a file another writer created since the look is opened above, not here)
        fd, created = os.open(path, flags | os.O_CREAT | os.O_EXCL, 0o666), True
    try:
        check_regular(os.fstat(fd).st_mode, path)  # swapped for a FIFO since the stat
    finally:
        os.close(fd)
        if created:
            os.unlink(path)


class Staging:
    """Files written under temporary names beside their targets and renamed into place
    together once every one is written, or removed when one fails: a write that fails
    half-way (a full disk, a file size limit) leaves no cut-off file under a result's
    name, and no mix of this run's files with an earlier run's.

    Calling it with a target gives the path to write ``target``'s content to.  Used as a context
    manager: committed on a clean exit, discarded on an exception, and an OSError about
    a temporary file is re-raised naming its target (what the user asked to write)."""

    SUFFIX = ".part"

    def __init__(self) -> None:
        self._targets: dict[str, tuple[Path, Path]] = {}  # temporary -> (target, its file)

    def __call__(self, target: str | Path) -> Path:
        target = Path(target)
        # beside what a link names, so the rename stays on its file system and the
        # write goes where it went before (a link to a results file keeps working)
        real = Path(os.path.realpath(target))
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            while True:
                temp = real.with_name(f".{real.name}.{secrets.token_hex(4)}{self.SUFFIX}")
                try:
                    fd = os.open(temp, flags, 0o666)  # the umask applies, as to open(.., "w")
                    break
                except FileExistsError:
                    continue
            try:
                if real.exists():  # a rewritten file keeps its mode, as open(.., "w") kept it
                    os.fchmod(fd, stat.S_IMODE(real.stat().st_mode))
            finally:
                os.close(fd)
        except OSError as exc:
            exc.filename = str(target)
            raise
        self._targets[str(temp)] = (target, real)
        return temp

    def _name_target(self, exc: OSError) -> None:
        """``exc`` names the target of the temporary file it is about (the user's name)."""
        if str(exc.filename) in self._targets:
            exc.filename = str(self._targets[str(exc.filename)][0])

    def commit(self) -> None:
        """Every staged file renamed onto its target (a rename within one folder); when
        one fails, the others not yet renamed are removed."""
        try:
            for temp, (_, real) in list(self._targets.items()):
                os.replace(temp, real)
                del self._targets[temp]
        except OSError as exc:
            self._name_target(exc)
            self.discard()
            raise

    def discard(self) -> None:
        """Every staged file not yet renamed removed; the targets are left as they were."""
        for temp in self._targets:
            with contextlib.suppress(FileNotFoundError):  # removed by someone else
                os.unlink(temp)
        self._targets.clear()

    def __enter__(self) -> Staging:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if exc is None:
            self.commit()
            return
        if isinstance(exc, OSError):
            self._name_target(exc)
        self.discard()


def open_regular(path: str | Path, max_bytes: int, *, follow: bool = True) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file of at most ``max_bytes``.

    The open does not block (``O_NONBLOCK``), so a FIFO is refused at once instead of
    waiting for a writer; a directory, FIFO, socket or device is an OSError.  With
    ``follow`` False a link as the last component is an OSError too (a file someone else
    controls must not point the reader at one of its own)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    fd = os.open(path, flags)
    try:
        mode = os.fstat(fd)
        check_regular(mode.st_mode, path)
        if mode.st_size > max_bytes:
            raise _too_large(path, max_bytes)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_bounded(path: str | Path, max_bytes: int, *, follow: bool = True) -> bytes:
    """The bytes of the regular file ``path``; OSError when it is not one or holds more
    than ``max_bytes`` (also when it grew past them while being read).  ``follow``: as
    :func:`open_regular`."""
    with open_regular(path, max_bytes, follow=follow) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_large(path, max_bytes)
    return data


def read_text(path: str | Path, max_bytes: int, *, encoding: str = "utf-8") -> str:
    """:func:`read_bounded`, decoded; bytes that are not UTF-8 are an OSError too, whose
    ``strerror`` names the first bad byte and its offset in plain words (the codec's own
    message talks of codecs and positions)."""
    data = read_bounded(path, max_bytes)
    try:
        return data.decode(encoding)
    except UnicodeDecodeError as exc:
        why = f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        raise OSError(errno.EILSEQ, why, str(path)) from None


def reason(exc: OSError) -> str:
    """Why a file operation failed, in the OS's words without Python's ("[Errno 2]")."""
    return exc.strerror or str(exc)


class YamlError(ValueError):
    """Text that is not YAML: ``line`` (1-based; None when the parser names none) and
    ``problem`` (the parser's words, None when it has none) say where and why."""

    def __init__(self, line: int | None, problem: str | None) -> None:
        super().__init__(f"line {line}: {problem}" if line else problem or "not YAML")
        self.line = line
        self.problem = problem


def parse_yaml(text: str) -> Any:
    """The document ``text`` holds (``yaml.safe_load``: plain data, no object tags);
    :class:`YamlError` when it is not YAML, for each reader of a user's YAML file to
    word in its own terms.  PyYAML is imported here, by the readers that need it."""
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise YamlError(
            mark.line + 1 if mark is not None else None, getattr(exc, "problem", None)
        ) from None
