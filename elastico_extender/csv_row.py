"""One record of a user's CSV (a trace, a pair table), read with errors that say where.

Used by the simulator's trace and pair loaders and by the IAC trainer's pair reader.

Every loader of a user file reads its cells through :class:`CsvRow`, so a bad
cell is a ``ValueError`` naming the file, the line and the column, with the cell
shown (truncated), never Python's own conversion message or a later hang.  The file
around the cells is checked as it is read too: a byte that is not UTF-8 is an error
naming its line (:class:`CsvText`), a column named twice one naming the column
(:func:`csv_header`).
"""

from __future__ import annotations

import csv
import errno
import gzip
import io
import math
import re
import tarfile
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, BinaryIO

from elastico_extender.userfiles import open_regular

__all__ = [
    "MAX_CSV_BYTES",
    "MAX_CSV_LINE",
    "TAR_SLACK",
    "CsvRow",
    "CsvText",
    "csv_header",
    "csv_rows",
    "open_bytes",
    "open_csv",
]

MAX_CSV_BYTES = 256 << 20
"""Largest CSV read (a year of a large cluster's arrivals is tens of MiB)."""

MAX_CSV_LINE = 1 << 20
"""Longest line read, in characters: a record is a few short cells (Python's CSV field
limit is 131,072), and a file without newlines must not be held whole to find out."""

GZIP_MAGIC = b"\x1f\x8b"
_NOT_UTF8 = re.compile("[\udc80-\udcff]")
"""What ``surrogateescape`` decodes a byte that is not UTF-8 to."""


TAR_SLACK = 1 << 20
"""Bytes a tar stream may hold beyond its member's bound: the tar's own headers and
padding (a few KiB a member), so a member at the bound still reads."""


def open_csv(
    path: Path | str,
    *,
    gzipped: bool = False,
    max_bytes: int = MAX_CSV_BYTES,
    member: str | None = None,
) -> CsvText:
    """``path`` opened as the loaders read a CSV (UTF-8, BOM or not); OSError, without
    waiting, when it is not a regular file of at most ``max_bytes`` (a reader that streams
    a larger published table sets its own bound).  With ``gzipped``, a file that starts as
    gzip does is read as the text it holds (at most ``max_bytes`` of it: a small file must
    not inflate without end).  With ``member``, ``path`` is a tar archive (gzip-compressed
    or not, as datasets are published: ``x.tar.gz`` holding ``x.csv``) and the CSV read is
    its regular file of that base name, streamed from the archive (:func:`_tar_member`)."""
    if member is None:
        return CsvText(path, open_bytes(path, gzipped=gzipped, max_bytes=max_bytes))
    raw = open_regular(path, max_bytes)
    try:
        return _tar_member(path, raw, member, max_bytes)
    except BaseException:
        raw.close()
        raise


def open_bytes(
    path: Path | str, *, gzipped: bool = False, max_bytes: int = MAX_CSV_BYTES
) -> BinaryIO:
    """The bytes :func:`open_csv` reads, for a reader of another text format (the Philly
    job log is JSON): the same bounds, and with ``gzipped`` a gzip file's contents."""
    raw = open_regular(path, max_bytes)
    try:
        if gzipped and raw.read(2) == GZIP_MAGIC:
            raw.seek(0)
            return io.BufferedReader(_Inflated(path, raw, max_bytes))
        raw.seek(0)
        return raw
    except BaseException:
        raw.close()
        raise


def _tar_member(path: Path | str, raw: BinaryIO, member: str, max_bytes: int) -> CsvText:
    """The CSV ``member`` of the tar archive open as ``raw``, read as the archive streams
    past (never unpacked to disk, never seeking): the gzip layer inflates at most
    ``max_bytes`` plus :data:`TAR_SLACK`, and a member larger than ``max_bytes`` is refused
    by the size its header gives before a byte of it is read.  A link, a folder or a
    missing member is a ValueError naming the archive; so is a file that is no tar."""
    binary: BinaryIO | io.BufferedReader = raw
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        binary = io.BufferedReader(_Inflated(path, raw, max_bytes + TAR_SLACK))
    else:
        raw.seek(0)
    try:
        # closed by the CsvText returned (it outlives this call), or below
        archive = tarfile.open(fileobj=binary, mode="r|")  # noqa: SIM115
        for entry in archive:
            if PurePosixPath(entry.name).name != member:
                continue
            if not entry.isfile():
                raise ValueError(f"{path}: its {member} is not a regular file (a link or folder)")
            if entry.size > max_bytes:
                why = f"its {member} is larger than {max_bytes:,} bytes"
                raise OSError(errno.EFBIG, why, str(path))
            handle = archive.extractfile(entry)
            if handle is None:  # not for a regular file; said for the type checker
                raise ValueError(f"{path}: cannot read its {member}")
            reader = io.BufferedReader(_Member(path, handle))
            closes = (archive.close, binary.close)
            return CsvText(f"{path} member {entry.name}", reader, also=closes)
    except tarfile.TarError as exc:
        binary.close()
        raise ValueError(f"{path}: not a tar archive, or a damaged one ({exc})") from None
    except BaseException:
        binary.close()
        raise
    archive.close()
    binary.close()
    raise ValueError(f"{path}: holds no {member}")


class _Member(io.RawIOBase):
    """A tar member's bytes; an archive that ends inside it is a ValueError naming the
    archive (tarfile's ReadError is neither an OSError nor a ValueError)."""

    def __init__(self, path: Path | str, handle: IO[bytes]) -> None:
        self._path = path
        self._handle = handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            return self._handle.readinto(buffer)  # type: ignore[attr-defined]
        except tarfile.TarError:
            raise ValueError(f"{self._path}: a damaged or cut-off tar archive") from None

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


class _Inflated(io.RawIOBase):
    """The bytes a gzip file holds, at most ``max_bytes``; a damaged or cut-off file is a
    ValueError naming it, not the gzip module's EOFError or zlib's jargon."""

    def __init__(self, path: Path | str, raw: BinaryIO, max_bytes: int) -> None:
        self._path = path
        self._raw = raw
        self._max_bytes = max_bytes
        self._gzip = gzip.GzipFile(fileobj=raw)
        self._total = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        try:
            count = self._gzip.readinto(buffer)
        except (EOFError, zlib.error, gzip.BadGzipFile):
            raise ValueError(f"{self._path}: a damaged or cut-off gzip file") from None
        self._total += count
        if self._total > self._max_bytes:
            why = f"holds more than {self._max_bytes:,} bytes of text"
            raise OSError(errno.EFBIG, why, str(self._path))
        return count

    def close(self) -> None:
        if not self.closed:
            self._gzip.close()
            self._raw.close()
        super().close()


class CsvText:
    """A CSV's lines for ``csv.reader``, each checked to be UTF-8 as it is read: a byte
    that is not is a ValueError naming the file and its line (the codec would name
    only a position in whichever 8 KiB chunk it was decoding)."""

    def __init__(
        self,
        path: Path | str,
        binary: BinaryIO | io.BufferedReader,
        also: tuple[Callable[[], object], ...] = (),
    ) -> None:
        self.path = path
        self.line = 0
        self._also = also  # what closes with it: the archive a member is read from
        self._text = io.TextIOWrapper(
            binary, encoding="utf-8-sig", errors="surrogateescape", newline=""
        )

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        line = self._text.readline(MAX_CSV_LINE + 1)
        if not line:
            raise StopIteration
        self.line += 1
        if len(line) > MAX_CSV_LINE:
            raise ValueError(
                f"{self.path}, line {self.line}: longer than {MAX_CSV_LINE:,} characters "
                "(not a CSV record: is it the right file?)"
            )
        if not line.isascii() and (bad := _NOT_UTF8.search(line)):
            byte = ord(bad.group()) - 0xDC00
            raise ValueError(
                f"{self.path}, line {self.line}: not UTF-8 text (byte 0x{byte:02x}); "
                "save the file as UTF-8"
            )
        return line

    def __enter__(self) -> CsvText:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._text.close()
        for close in self._also:
            close()


def csv_header(path: Path | str, reader: csv.DictReader[str]) -> list[str]:
    """The columns of ``reader``'s header; a column named twice is a ValueError naming it
    (a DictReader would silently read only the last copy's cells)."""
    try:
        fields = list(reader.fieldnames or ())
    except csv.Error as exc:
        raise ValueError(f"{path}, after line {reader.line_num}: {exc}") from None
    seen: set[str] = set()
    for name in fields:
        if name and name in seen:
            raise ValueError(
                f"{path}, line {reader.line_num}: column {name!r} appears twice in the header"
            )
        seen.add(name)
    return fields


def csv_rows(path: Path | str, reader: csv.DictReader[str]) -> Iterator[CsvRow]:
    """Each record of ``reader`` as a :class:`CsvRow`, its header checked by
    :func:`csv_header`; what the csv module itself cannot read (a cell over its field
    limit: a minified JSON or a binary file given by mistake) is a ``ValueError``
    naming the file and the line, like a bad cell."""
    csv_header(path, reader)
    try:
        for record in reader:
            yield CsvRow(path, reader.line_num, dict(record))
    except csv.Error as exc:
        raise ValueError(f"{path}, after line {reader.line_num}: {exc}") from None


class CsvRow:
    """One CSV record's cells, read with errors that name the file, line and column."""

    def __init__(self, path: Path | str, line: int, record: dict[str | None, object]) -> None:
        self.line = line
        self.where = f"{path}, line {line}"
        if None in record:
            raise ValueError(f"{self.where}: more cells than the header has columns")
        self.record = record

    def derived(self, record: dict[str | None, object]) -> CsvRow:
        """A record built from this one's cells in another format's columns, whose errors
        still name this row's file and line."""
        row = CsvRow("", self.line, record)
        row.where = self.where
        return row

    def fail(self, column: str, why: str) -> ValueError:
        cell = str(self.record.get(column) or "")
        shown = cell if len(cell) <= 40 else cell[:40] + "..."
        return ValueError(f"{self.where}: column {column}: {why} (got {shown!r})")

    def text(self, column: str) -> str:
        cell = self.record.get(column)
        return cell.strip() if isinstance(cell, str) else ""

    def number(self, column: str, low: float, high: float, *, above_low: bool = False) -> float:
        """A finite number in [low, high] (or (low, high] with ``above_low``)."""
        cell = self.text(column)
        if not cell:
            raise self.fail(column, "missing")
        try:
            value = float(cell)
        except ValueError:
            raise self.fail(column, "not a number") from None
        inside = (value > low if above_low else value >= low) and value <= high
        if not (math.isfinite(value) and inside):
            if math.isinf(low) and math.isinf(high):
                raise self.fail(column, "must be a finite number")
            bracket = "(" if above_low else "["
            raise self.fail(column, f"must be a finite number in {bracket}{low:g}, {high:g}]")
        return value

    def optional(self, column: str) -> float | None:
        """None for an empty cell, else a finite number (an unparseable or infinite
        cell is an error, not an absent one)."""
        if not self.text(column):
            return None
        return self.number(column, -math.inf, math.inf)

    def flag(self, column: str, *, default: bool) -> bool:
        """A yes/no cell: 1 or 0 (as any number), true or false; ``default`` when empty.
        Anything else is an error: a pair file's ``measured`` column decides whether a
        row is a measurement, and every reader of it must decide the same."""
        cell = self.text(column).lower()
        if not cell:
            return default
        if cell in ("true", "false"):
            return cell == "true"
        try:
            value = float(cell)
        except ValueError:
            value = math.nan
        if value not in (0.0, 1.0):
            raise self.fail(column, "must be 1 or 0 (or true or false)")
        return value == 1.0

    def count(self, column: str, high: int) -> int:
        """A whole number in [1, high] ('2' and '2.0' alike)."""
        value = self.number(column, 1.0, float(high))
        if value != int(value):
            raise self.fail(column, "must be a whole number")
        return int(value)
