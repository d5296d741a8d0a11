"""Microsoft's Philly job log as ``--trace philly-log:FILE`` (or ``philly-log:FILE@VC``).

The trace (``msr-fiddle/philly-traces``, Jeon et al., ATC'19; CC BY 4.0; not shipped)
unpacks from ``trace-data.tar.gz`` into five files; the simulator reads one of them,
``cluster_job_log``: a JSON array with one object per job, as the repository's README
describes it::

    {"status": "Pass", "vc": "ee9e8c", "jobid": "application_1506638472019_14199",
     "attempts": [{"start_time": "2017-10-07 01:12:09", "end_time": "2017-10-07 01:13:23",
                   "detail": [{"ip": "m47", "gpus": ["gpu0", "gpu1", ...]}]}, ...],
     "submitted_time": "2017-10-07 01:11:39", "user": "ce2f4c"}

``FILE`` may be gzip-compressed.  ``@VC`` keeps the jobs of one virtual cluster (as
``philly:VC`` does, and then ``--gpus`` defaults to that VC's size); without it every
VC's jobs are read.  The VC comes after the *last* ``@``, and only when no ``/`` follows
it: a path may hold a colon (``philly-log:C:/logs/...`` or a folder named ``a:b``), so
``:`` could not separate a VC from the file the way ``philly:VC`` separates its VC from
the scheme.

One simulated job per Philly job
--------------------------------
* **Arrival**: ``submitted_time``.
* **GPUs**: the GPUs listed in the first attempt's ``detail``, summed over its machines
  (a job on two 8-GPU servers asks for 16).  A later attempt placed on another number of
  GPUs is counted in the notes, and the job runs on the first attempt's number.
* **Run time**: from the first attempt's ``start_time`` to the last attempt's
  ``end_time``.  This is how the trace's own notebook reads a job (``analysis/Philly
  Trace Analysis.ipynb``, ``Job.run_time``), and Gavel's, whose per-VC traces are what
  ``philly:VC`` replays (Gavel's ``notebooks/figures/background/philly.ipynb`` has the
  same ``Job`` class: first attempt's GPUs, first start to last end), so a job read both
  ways runs as long in both.  A retried job's gaps between attempts (its requeue waits)
  are inside that span; the sum of its attempts' spans, the time it held GPUs, is the
  other published reading (Synergy's ``sum_attempts``), not used here.  The notes count
  the jobs with several attempts.  Unlike ``philly:VC``, run times are not clipped and no
  job becomes an inference job (``--max-job-hours`` and ``--inference-share`` are refused).
* **User**: ``user`` (the duration estimator learns per user).  No job names a workload:
  each is drawn with the seed, as for any trace without a ``workload`` column.
* ``status`` does not decide whether a job runs: a Killed or Failed job held its GPUs as
  long as it ran (as the Helios and PAI readers read theirs); the notes count them.

Times are read as written, in the format ``2017-10-07 01:12:09``, without a zone (the log
gives none), so all of them share one clock.  Skipped and counted in the notes: jobs
without attempts (never ran), jobs whose ``submitted_time`` or first ``start_time`` was
not logged (``None``, null or empty: the README calls it a logging error), jobs whose
last ``end_time`` is ``None`` (still running when the log was taken), jobs with no GPU in
the first attempt's ``detail``, jobs that ended as they started, and jobs with a time
that is not a date-time or that ends before it starts.  Those are facts of a trace of
117,325 jobs that the readers of it skip too; a file that is not the trace's layout (not
JSON, not an array of objects, a field of the wrong type) is an error instead, naming
the file, the job (counted from 1) and its byte offset.

Memory and bounds
-----------------
The file is decoded one job object at a time (``json.JSONDecoder.raw_decode`` over a
buffer of about a megabyte): the reader holds that buffer and one job, never the whole
array.  Measured on a log of our own in the trace's layout (117,325 jobs, the trace's
count; 103 MB written with indents): 12 s on one core and 120 MiB resident at most, the
kept jobs included, where ``json.load`` of it alone peaks at 400 MiB.  At most
:data:`MAX_PHILLY_LOG_BYTES` of file and of inflated text, :data:`MAX_JOB_CHARS`
characters a job and :data:`.traces.MAX_TRACE_JOBS` jobs in the array (every VC's
counted).  ``--days``, ``--duration`` and ``--load`` then apply as to any trace file
(:func:`.traces.days_window`).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.csv_row import CsvRow, open_bytes
from elastico_extender.sim.trace_layouts import MAX_TRACE_SECONDS, Layout, TraceRecord
from elastico_extender.sim.traces import (
    MAX_NAMED_VCS,
    MAX_TRACE_JOBS,
    TraceLoad,
    load_records,
)
from elastico_extender.userfiles import reason

__all__ = [
    "JOB_LOG",
    "MAX_JOB_CHARS",
    "MAX_PHILLY_LOG_BYTES",
    "PHILLY_LOG_PREFIX",
    "is_job_log",
    "parse_spec",
    "philly_log",
]

PHILLY_LOG_PREFIX = "philly-log:"
"""What ``--trace`` starts with to name a Philly ``cluster_job_log``."""
JOB_LOG = "cluster_job_log"
MAX_PHILLY_LOG_BYTES = 1 << 30
"""Largest log read, as a file and as the text a gzip file holds (1 GiB: a log of the
published 117,325 jobs in its layout is about 100 MB)."""
MAX_JOB_CHARS = 4 << 20
"""Longest job object, in characters (4 MiB): an attempt on 16 servers of 8 GPUs is 4.5 KB
written with indents, so a job may hold some 900 of them, and a file that is no job array
(one huge string, say) must not be buffered whole to find out."""
READ_BYTES = 1 << 20
"""How much of the file one read adds to the buffer."""
_WS = re.compile(r"[ \t\n\r]*")
"""JSON's whitespace."""
_MISSING = (None, "", "None")
"""How the log writes a time it did not record (the trace's notebook reads all three)."""

LAYOUT = Layout(
    "Microsoft's Philly job log",
    frozenset({"jobid", "submitted_time", "attempts"}),
    lambda cells, k: "decoded",  # never called: _Jobs reads each job object itself
    skips=(
        ("never", "that never ran (no attempt, or ended as it started)"),
        ("unlogged", "whose submitted_time or first start_time was not logged"),
        ("open", "unfinished (the last attempt has no end_time)"),
        ("cpu", "with no GPU in the first attempt's detail"),
        ("times", "with a time that is not a date-time, or an end before its start"),
    ),
    marks=(
        (
            "retried",
            "jobs ran in several attempts: each runs from its first attempt's start to "
            "its last attempt's end, the waits between attempts included (as the trace's "
            "notebook and Gavel read a job)",
        ),
        (
            "resized",
            "jobs had a later attempt on another number of GPUs than the first: run on "
            "the first attempt's",
        ),
        (
            "ended",
            "jobs ended Killed or Failed: each runs as long as it held its GPUs",
        ),
    ),
)


def parse_spec(spec: str) -> tuple[Path, str | None]:
    """The file and the VC (None: every VC) of ``philly-log:FILE[@VC]`` (module docstring);
    a ValueError saying what is missing."""
    rest = spec.removeprefix(PHILLY_LOG_PREFIX)
    path, at, vc = rest.rpartition("@")
    if not at or "/" in vc:
        path, vc = rest, ""
        at = ""
    if not path:
        raise ValueError(
            f"{PHILLY_LOG_PREFIX} names no file (use {PHILLY_LOG_PREFIX}FILE or "
            f"{PHILLY_LOG_PREFIX}FILE@VC)"
        )
    if at and not vc:
        raise ValueError(
            f"{spec}: no VC after the @ ({PHILLY_LOG_PREFIX}{path} reads every VC's jobs)"
        )
    return Path(path), vc or None


def is_job_log(path: str) -> bool:
    """Whether ``path`` names the log itself (read with ``philly-log:``, not as a CSV)."""
    name = Path(path).name
    return name == JOB_LOG or name.startswith(JOB_LOG + ".")


class _Array:
    """The values of a JSON array in a file, decoded one at a time with the byte offset
    each starts at (errors name it); the file's text is checked to be UTF-8 as it is
    read, and only a buffer of about :data:`READ_BYTES` and one value are held."""

    def __init__(self, path: Path, raw: BinaryIO) -> None:
        self.path = path
        self.count = 0  # values decoded so far
        self._raw = raw
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0  # the next character of _buf to read
        self._byte = 0  # the file's byte offset of _buf[_pos]
        self._read = 0  # bytes read from the file
        self._ascii = True  # _buf holds only ASCII: a character is a byte
        self._eof = False

    def _more(self) -> bool:
        """The next part of the file added to the buffer (what was read dropped from it);
        False at the end of the file."""
        if self._eof:
            return False
        pending = len(self._utf8.getstate()[0])  # bytes of a character cut by the last read
        try:
            chunk = self._raw.read(READ_BYTES)
        except OSError as exc:  # a gzip file that inflates past the bound, a failed read
            raise ValueError(f"{self.path}: cannot read: {reason(exc)}") from None
        try:
            text = self._utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            at = self._read - pending + exc.start
            raise ValueError(
                f"{self.path}, byte {at}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x})"
            ) from None
        if self._read == 0 and text.startswith("\ufeff"):  # a BOM: not part of the JSON
            text = text[1:]
            self._byte = 3
        self._read += len(chunk)
        self._eof = not chunk
        self._buf = self._buf[self._pos :] + text
        self._pos = 0
        self._ascii = self._buf.isascii()
        return bool(chunk)

    def _advance(self, to: int) -> None:
        piece = self._buf[self._pos : to]
        self._byte += len(piece) if self._ascii else len(piece.encode("utf-8"))
        self._pos = to

    def _next(self) -> str:
        """The next character that is not whitespace, not consumed ("" at the end)."""
        while True:
            match = _WS.match(self._buf, self._pos)
            assert match is not None  # the pattern matches the empty string
            self._advance(match.end())
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return ""

    def where(self, byte: int) -> str:
        return f"{self.path}, job {self.count + 1} (byte {byte})"

    def __iter__(self) -> Iterator[tuple[int, object]]:
        first = self._next()
        if first != "[":
            raise ValueError(self._not_an_array(first))
        self._advance(self._pos + 1)
        after = self._next()
        while after != "]":
            if self.count == MAX_TRACE_JOBS:
                raise ValueError(
                    f"{self.where(self._byte)}: more than {MAX_TRACE_JOBS:,} jobs (the most "
                    "a trace may hold: split the file)"
                )
            start = self._byte
            yield start, self._value(start)
            self.count += 1
            after = self._next()
            if after == ",":
                self._advance(self._pos + 1)
                after = self._next()
                if after == "]":
                    raise ValueError(f"{self.path}, byte {self._byte}: a comma before the ]")
                if after:
                    continue  # the next job
            if after == "":
                raise ValueError(
                    f"{self.path}: the file ends after job {self.count} without the array's "
                    "closing ] (cut off?)"
                )
            if after != "]":
                raise ValueError(
                    f"{self.path}, byte {self._byte}: after job {self.count}, {after!r} where "
                    "a comma or the array's closing ] belongs"
                )
        self._advance(self._pos + 1)
        if self._next():
            raise ValueError(f"{self.path}, byte {self._byte}: data after the array's closing ]")

    def _not_an_array(self, first: str) -> str:
        hint = f"{JOB_LOG} is a JSON array of jobs"
        if self.path.name.endswith((".tar", ".tar.gz", ".tgz")):
            hint = f"a tarball: unpack it (tar xzf) and give the {JOB_LOG} it holds"
        if not first:
            return f"{self.path}: empty ({hint})"
        if first == "{":
            return f"{self.path}: a JSON object, not an array of jobs ({hint})"
        return f"{self.path}, byte {self._byte}: not a JSON array (starts with {first!r}; {hint})"

    def _value(self, start: int) -> object:
        """The value at the buffer's position, more of the file read while it may be cut by
        the buffer's end: an error near that end, or an unterminated string (a cut one)."""
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                unterminated = exc.msg.startswith("Unterminated string")
                near_end = unterminated or exc.pos >= len(self._buf) - 8
                if near_end and not self._eof and len(self._buf) - self._pos <= MAX_JOB_CHARS:
                    self._more()
                    continue  # decoded again, with more text or at the end of the file
                raise ValueError(self._bad(start, exc, near_end)) from None
            except RecursionError:
                raise ValueError(f"{self.where(start)}: nested too deeply to be a job") from None
            if end - self._pos > MAX_JOB_CHARS:
                raise ValueError(self._too_long(start))
            self._advance(end)
            return value

    def _too_long(self, start: int) -> str:
        return (
            f"{self.where(start)}: longer than {MAX_JOB_CHARS:,} characters, the most a job "
            "may take (is it the right file?)"
        )

    def _bad(self, start: int, exc: json.JSONDecodeError, near_end: bool) -> str:
        """Why the value at ``start`` does not decode: too long, cut off by the end of the
        file (the error is at its end, or in a string it never closes), or not JSON."""
        if near_end and not self._eof:
            return self._too_long(start)
        unterminated = exc.msg.startswith("Unterminated string")
        if self._eof and (unterminated or exc.pos >= len(self._buf.rstrip())):
            return f"{self.where(start)}: the file ends inside this job (cut off?)"
        piece = self._buf[self._pos : exc.pos]
        at = start + (len(piece) if self._ascii else len(piece.encode("utf-8")))
        return f"{self.where(start)}: not JSON: {exc.msg} at byte {at}"


class _Fields(CsvRow):
    """A job's fields read as :func:`.traces.load_records` reads a row's cells; its
    errors name the job and its byte offset, and call a field a field."""

    def __init__(self, where: str, record: dict[str | None, object]) -> None:
        super().__init__("", 0, record)
        self.where = where

    def fail(self, column: str, why: str) -> ValueError:
        cell = str(self.record.get(column) or "")
        shown = cell if len(cell) <= 40 else cell[:40] + "..."
        return ValueError(f"{self.where}: field {column}: {why} (got {shown!r})")


_UNREADABLE = math.nan
"""What :func:`_moment` gives for a time that is not a date-time."""


def _moment(value: object) -> float | None:
    """Seconds of a logged time: None when not logged, NaN when not a date-time."""
    if value in _MISSING:
        return None
    if not isinstance(value, str):
        return _UNREADABLE
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        return _UNREADABLE
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return when.timestamp()


class _Jobs:
    """The log's jobs (of one VC, or all), each with its fields and its simulated job or
    why it is skipped; counts the jobs of other VCs (:attr:`others`) and names some."""

    def __init__(self, array: _Array, vc: str | None) -> None:
        self.array = array
        self.vc = vc
        self.others = 0
        self.vcs: set[str] = set()  # at most MAX_NAMED_VCS, for an error
        self.more_vcs = False

    def __iter__(self) -> Iterator[tuple[CsvRow, TraceRecord | str]]:
        for start, job in self.array:
            where = self.array.where(start)
            if not isinstance(job, dict):
                kind = _KINDS.get(type(job), "value")
                raise ValueError(f"{where}: a JSON {kind}, not a job object")
            vc = _text(job, "vc", where)
            if self.vc is not None and vc != self.vc:
                self.others += 1
                if len(self.vcs) < MAX_NAMED_VCS:
                    self.vcs.add(vc)
                else:
                    self.more_vcs = self.more_vcs or vc not in self.vcs
                continue
            yield _read_job(job, where)


_KINDS = {list: "array", str: "string", int: "number", float: "number", bool: "true or false"}
_KINDS[type(None)] = "null"


def _text(job: dict[str, object], field: str, where: str, *, required: bool = True) -> str:
    value = job.get(field)
    if value is None and not required:
        return ""
    if not isinstance(value, str):
        why = "missing" if field not in job else "not a string"
        raise ValueError(f"{where}: field {field}: {why}")
    return value


def _list(value: object, field: str, where: str) -> list[object]:
    if not isinstance(value, list):
        why = "missing" if value is None else "not an array"
        raise ValueError(f"{where}: field {field}: {why}")
    return value


def _gpus(attempt: object, k: int, where: str) -> int:
    """GPUs attempt ``k`` (counted from 1) was placed on, over all its servers."""
    if not isinstance(attempt, dict):
        raise ValueError(f"{where}: field attempts: attempt {k} is not an object")
    detail = attempt.get("detail")
    total = 0
    for server in _list([] if detail is None else detail, f"attempts[{k}].detail", where):
        if not isinstance(server, dict):
            raise ValueError(f"{where}: field attempts[{k}].detail: a server that is no object")
        gpus = server.get("gpus")
        total += len(_list([] if gpus is None else gpus, f"attempts[{k}].detail.gpus", where))
    if total > MAX_CLUSTER_GPUS:
        raise ValueError(
            f"{where}: field attempts[{k}].detail: more than {MAX_CLUSTER_GPUS:,} GPUs"
        )
    return total


def _read_job(job: dict[str, object], where: str) -> tuple[CsvRow, TraceRecord | str]:
    """One job object as its fields and its simulated job, or why it is skipped."""
    job_id = _text(job, "jobid", where)
    if not job_id:
        raise ValueError(f"{where}: field jobid: empty")
    submitted_raw = job.get("submitted_time")
    fields = _Fields(
        where,
        {
            "jobid": job_id,
            "submitted_time": submitted_raw if isinstance(submitted_raw, str) else "",
            "user": _text(job, "user", where, required=False),
        },
    )
    _text(job, "status", where, required=False)
    attempts = _list(job.get("attempts"), "attempts", where)
    sizes = [_gpus(attempt, k, where) for k, attempt in enumerate(attempts, 1)]
    if not attempts:
        return fields, "never"
    first, last = attempts[0], attempts[-1]
    assert isinstance(first, dict) and isinstance(last, dict)  # checked by _gpus
    times = (
        _moment(submitted_raw),
        _moment(first.get("start_time")),
        _moment(last.get("end_time")),
    )
    submitted, start, end = times
    if any(t is not None and math.isnan(t) for t in times):
        return fields, "times"
    if submitted is None or start is None:
        return fields, "unlogged"
    if end is None:
        return fields, "open"
    if sizes[0] == 0:
        return fields, "cpu"
    if end < start:
        return fields, "times"
    if end == start:
        return fields, "never"
    if end - start > MAX_TRACE_SECONDS:
        days = MAX_TRACE_SECONDS / 86400
        raise ValueError(f"{where}: its attempts run over more than {days:g} days")
    marks = set()
    if len(attempts) > 1:
        marks.add("retried")
    if any(size and size != sizes[0] for size in sizes[1:]):
        marks.add("resized")
    if job.get("status") in ("Killed", "Failed"):
        marks.add("ended")
    record = TraceRecord(
        job_id=job_id,
        id_column="jobid",
        arrival_s=submitted,
        arrival_column="submitted_time",
        gpus=sizes[0],
        duration_s=end - start,
        marks=frozenset(marks),
    )
    return fields, record


def philly_log(path: Path | str, vc: str | None = None, seed: int = 0) -> TraceLoad:
    """The jobs of the Philly job log ``path`` (of VC ``vc``, else of every VC), sorted by
    arrival, with notes of what was read, skipped and read differently (module
    docstring); a bad file or job is a ValueError naming it."""
    path = Path(path)
    name = f"{PHILLY_LOG_PREFIX}{path}" + (f"@{vc}" if vc is not None else "")
    try:
        raw = open_bytes(path, gzipped=True, max_bytes=MAX_PHILLY_LOG_BYTES)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {reason(exc)}") from None
    with raw:
        array = _Array(path, raw)
        jobs = _Jobs(array, vc)
        loaded = load_records(name, LAYOUT, jobs, seed)
    if vc is not None and array.count == jobs.others:
        known = ", ".join(sorted(jobs.vcs)) + (", ..." if jobs.more_vcs else "")
        raise ValueError(f"no job of VC {vc!r} in {path} (its VCs: {known or 'none'})")
    if vc is None:
        read = f"all {array.count} jobs (every VC)"
    else:
        read = f"the {array.count - jobs.others} jobs of VC {vc} (of the {array.count} in it)"
    notes = [
        f"{name}: read {read}: arrival at submitted_time, GPUs of the first attempt, run from "
        "the first attempt's start to the last one's end",
        *loaded.notes,
    ]
    return TraceLoad(loaded.jobs, loaded.history, tuple(notes))
