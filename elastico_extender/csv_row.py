"""One record of a user's CSV (a trace, a pair table), read with errors that say where.

Used by the simulator's trace and pair loaders and by the IAC trainer's pair reader.

Every loader of a user file reads its cells through :class:`CsvRow`, so a bad
cell is a ``ValueError`` naming the file, the line and the column, with the cell
shown (truncated), never Python's own conversion message or a later hang.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator
from pathlib import Path

from elastico_extender.userfiles import open_regular

__all__ = ["MAX_CSV_BYTES", "CsvRow", "csv_rows", "open_csv"]

MAX_CSV_BYTES = 256 << 20
"""Largest CSV read (a year of a large cluster's arrivals is tens of MiB)."""


def open_csv(path: Path | str) -> io.TextIOWrapper:
    """``path`` opened as the loaders read a CSV (UTF-8, BOM or not); OSError, without
    waiting, when it is not a regular file of at most :data:`MAX_CSV_BYTES`."""
    return io.TextIOWrapper(open_regular(path, MAX_CSV_BYTES), encoding="utf-8-sig", newline="")


def csv_rows(path: Path | str, reader: csv.DictReader[str]) -> Iterator[CsvRow]:
    """Each record of ``reader`` as a :class:`CsvRow`; what the csv module itself cannot
    read (a cell over its field limit: a minified JSON or a binary file given by
    mistake) is a ``ValueError`` naming the file and the line, like a bad cell."""
    try:
        for record in reader:
            yield CsvRow(path, reader.line_num, dict(record))
    except csv.Error as exc:
        raise ValueError(f"{path}, after line {reader.line_num}: {exc}") from None


class CsvRow:
    """One CSV record's cells, read with errors that name the file, line and column."""

    def __init__(self, path: Path | str, line: int, record: dict[str | None, object]) -> None:
        self.where = f"{path}, line {line}"
        if None in record:
            raise ValueError(f"{self.where}: more cells than the header has columns")
        self.record = record

    def derived(self, record: dict[str | None, object]) -> CsvRow:
        """A record built from this one's cells in another format's columns, whose errors
        still name this row's file and line."""
        row = CsvRow("", 0, record)
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
