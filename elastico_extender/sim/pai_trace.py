"""Alibaba PAI's GPU cluster trace of 2020 as ``--trace pai:DIR``.

The trace (``cluster-trace-gpu-v2020`` in ``alibaba/clusterdata``; Weng et al., "MLaaS
in the Wild", NSDI'22; CC BY 4.0; not shipped) covers July and August 2020 on a cluster
of over 6,500 GPUs.  ``DIR`` is the folder of its tables: the simulator reads the task
table (needed) and the job table (when present), each from the first of
``<table>.csv`` (unpacked), ``<table>.csv.gz`` or ``<table>.tar.gz`` (the tarball as
published, holding ``<table>.csv``, streamed from the archive without unpacking it)
found there (:data:`TABLE_FILES`); the notes name the files read.  The CSVs have no
header row: their columns are in the order the ``.header`` files beside
them give (the repository's README, commit 02a1be14), which is read when one is in
``DIR`` and otherwise taken as published (:data:`JOB_COLUMNS`, :data:`TASK_COLUMNS`);
a first line that repeats the column names is read as a header.

One simulated job per PAI job
-----------------------------
* **GPUs**: a task asks for ``plan_gpu`` percent of one GPU for each of its
  ``inst_num`` instances (README: 50.0 is half a GPU); an empty or 0 ``plan_gpu`` is a
  CPU-only role (a parameter server).  The job asks for the sum over its GPU tasks that
  launched, to a tenth of a percent (the 2023 trace's resolution: 3 x 33.333333 is
  one GPU).  4 x 25.0 is one whole GPU, 10.0 a tenth of one, 600.0 six.  Up to one
  GPU, it runs on one and keeps the part it asked for as
  :attr:`.TraceRecord.share`, as the 2023 trace's ``gpu_milli`` does (only the ``hami``
  baseline places by it); over one GPU, it runs on whole GPUs, the sum rounded up (1.5
  GPUs run on 2: its instances cannot share fewer whole GPUs without sharing them).
  Both are counted in the notes.
* **Run time**: from the first launch of a GPU task to the last end of one (the time the
  job held GPUs; a CPU-only role that ran on is not part of it).  A task whose
  ``start_time`` is 0 or empty never launched (the repository's own analysis reads 0 so:
  ``analysis/utils.py``, ``get_dfa``) and holds no GPU.
* **Arrival**: the job's submission, ``start_time`` of the job table (README: "the gap
  between job.start_time and the earliest task.start_time ... implies its wait time").
  Without a job table, its first GPU task's launch, and no job names a user.
* **User**: the job table's ``user`` (the duration estimator learns per user).
* ``status`` is not read: a Failed job held its GPUs as long as it ran (as the Helios
  layout reads), and the times say whether one ran or ended (``Running`` tasks have no
  ``end_time``, ``Waiting`` ones no ``start_time``).
* **Numbers** are read as published (``1.0`` instances, ``4550879.0`` seconds); an
  empty cell is absent, and a row with fewer cells than the table has columns reads
  the missing ones as empty.

Skipped and counted in the notes: jobs without a GPU task (CPU-only), jobs none of
whose GPU tasks launched or whose GPU tasks each ended as they launched (never ran,
``Waiting``), jobs with a launched GPU task without ``end_time`` (still running when
the trace ends: its run time is unknown), GPU jobs of the task table without a job-table
row, and job-table rows without a task row.

Odd rows of a real table
------------------------
A published table of a million rows is not refused for one odd row its user cannot
fix: each rule of :data:`ODD` sets the row or job aside, counts it, and the notes name
the first such line.

* a task row without a ``job_name``: skipped;
* a launched GPU task whose ``inst_num`` is empty, under 1 or not whole (``0.0``,
  ``1.5``): its job is skipped (how many GPUs it held is unknown);
* a GPU task whose ``start_time`` or ``end_time`` is negative (the trace writes 0, not
  a negative, for "none"), or whose ``end_time`` is before its ``start_time``: its job
  is skipped (how long it held them is unknown);
* a job-table row that repeats a ``job_name`` (the README: one ``inst_id`` per job):
  the first row is the job, later ones are skipped;
* a job without a submission time (an empty job-table ``start_time``) or submitted
  after its first GPU launch: it arrives at that launch (a job cannot run before it
  arrives).

A cell that is not a number at all, NaN or infinite, more instances than the largest
cluster has GPUs, or a task over :data:`.MAX_TRACE_SECONDS` is still an error naming
the file, line and column: such a file is not the trace, or not a trace the simulator
can run.  ``--days``, ``--duration`` and ``--load``
apply as to any trace file (:func:`.traces.days_window`).

Memory and bounds
-----------------
The tables are streamed, never held: the task table is folded into one entry per job
(its first line, GPU percent, first launch, last end and three flags in flat arrays:
about 160 bytes a job with its name), then the job table streams past that aggregate,
each row becoming at most one job.  At most :data:`MAX_PAI_JOBS` jobs (the trace holds
about 1.2 million) and :data:`MAX_PAI_TABLE_BYTES` per table (each unpacked table the
simulator reads is a few hundred MB: the 256 MiB bound of user CSVs is too tight)
bound the memory and the time; a compressed table is bounded twice, its file and the
text it inflates to (a tarball's member by the size its header gives, before a byte of
it is read).  Measured on tables of our own in the trace's layout,
1.2 million jobs (313 MB): about 2.5 minutes on one core, at most 690 MiB resident.
Every cell read is checked as a user trace's is: a bad one is a ValueError naming the
file, line and column.

Not used
--------
The sensor table (``pai_sensor_table.csv``: each instance's average GPU utilisation and
peak GPU memory) could replace the production world's drawn activity per job
(:mod:`.production` draws it from a Beta fitted to this trace); that needs a measured
activity carried per trace job, which :class:`.TraceJob` does not have, so it is left.
``plan_cpu``, ``plan_mem``, ``gpu_type`` and ``inst_id`` are not used either.
"""

from __future__ import annotations

import csv
import math
import os
from array import array
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.csv_row import CsvRow, CsvText, csv_rows, open_csv
from elastico_extender.sim.trace_layouts import MAX_TRACE_SECONDS, Layout, TraceRecord
from elastico_extender.sim.traces import TraceLoad, load_records
from elastico_extender.userfiles import read_text, reason

__all__ = [
    "JOB_COLUMNS",
    "JOB_TABLE",
    "MAX_PAI_JOBS",
    "MAX_PAI_TABLE_BYTES",
    "PAI_PREFIX",
    "TABLE_FILES",
    "TASK_COLUMNS",
    "TASK_TABLE",
    "is_pai_table",
    "pai_trace",
]

PAI_PREFIX = "pai:"
"""What ``--trace`` starts with to name a folder of the trace's tables."""
JOB_TABLE = "pai_job_table"
TASK_TABLE = "pai_task_table"
JOB_COLUMNS = ("job_name", "inst_id", "user", "status", "start_time", "end_time")
"""``pai_job_table.header`` as published (alibaba/clusterdata, cluster-trace-gpu-v2020/data)."""
TASK_COLUMNS = (
    "job_name",
    "task_name",
    "inst_num",
    "status",
    "start_time",
    "end_time",
    "plan_cpu",
    "plan_mem",
    "plan_gpu",
    "gpu_type",
)
"""``pai_task_table.header`` as published."""
JOB_NEEDS = frozenset({"job_name", "user", "start_time"})
TASK_NEEDS = frozenset({"job_name", "inst_num", "start_time", "end_time", "plan_gpu"})
MAX_PAI_TABLE_BYTES = 1 << 30
"""Largest table read (1 GiB; the job and task tables unpack to a few hundred MB)."""
MAX_PAI_JOBS = 2_000_000
"""Most jobs the task table may name (the trace holds about 1.2 million): the per-job
aggregate, about 160 bytes a job, is the reader's only memory that grows with the file."""
MAX_HEADER_BYTES = 64 << 10
MAX_PERCENT = 100.0 * MAX_CLUSTER_GPUS
"""Most GPU percent a job may ask for: the simulator's largest cluster."""

TABLE_FILES = ("{}.csv", "{}.csv.gz", "{}.tar.gz")
"""The files a table is read from, the first found: unpacked, gzip-compressed, or the
tarball as published (holding ``<table>.csv``); each bounded as the plain table is."""

_GPU = 1  # the job has a task that asks for a GPU
_OPEN = 2  # a launched GPU task of the job has no end_time
_MATCHED = 4  # a job-table row named the job
_BAD_INSTANCES = 8  # a launched GPU task's inst_num is empty, under 1 or not whole
_BAD_TIMES = 16  # a GPU task's time is negative, or it ends before it starts

ODD = {
    # key: what the notes say of the rows or jobs a rule set aside (read_notes)
    "nameless": "task rows without a job_name (no job to add them to)",
    "instances": "jobs with a launched GPU task whose inst_num is empty, under 1 or not a "
    "whole number (how many GPUs it held is unknown)",
    "times": "jobs with a GPU task whose start_time or end_time is negative, or that ends "
    "before it starts (how long it held them is unknown)",
    "repeated": f"rows of {JOB_TABLE} that repeat a job_name (its first row is read)",
    "launch": "jobs without a submission time (an empty start_time in "
    f"{JOB_TABLE}) or submitted after their first GPU launch: they arrive at that launch",
}
"""The rules for a real table's odd rows: each is counted, and the notes name the first
such line, instead of refusing a published table of a million rows its user cannot fix.
A cell that is no number at all (or NaN, or infinite) is still an error naming it: such
a file is not the trace."""

LAYOUT = Layout(
    "Alibaba PAI's GPU cluster trace of 2020",
    frozenset(JOB_NEEDS),
    lambda cells, k: "joined",  # never called: _JobTable reads a row beside the tasks
    skips=(
        ("cpu", "CPU-only jobs (no task asks for a GPU)"),
        ("never", "that never ran (no GPU task launched, or each ended as it launched)"),
        ("open", "unfinished (a launched GPU task has no end_time)"),
    ),
    marks=(
        (
            "fraction",
            "one-GPU jobs asked for part of a GPU (inst_num x plan_gpu under 100 in all): "
            "the hami baseline packs them by that share, every other policy decides what "
            "shares a GPU itself",
        ),
        (
            "rounded",
            "jobs asked for more than one GPU but not a whole number (e.g. 3 x 50%): run "
            "on whole GPUs, rounded up",
        ),
    ),
)


def is_pai_table(path: str) -> bool:
    """Whether ``path`` names one of the trace's headerless tables (read with ``pai:``)."""
    tables = (JOB_TABLE, TASK_TABLE)
    return Path(path).name in {p.format(t) for p in TABLE_FILES for t in tables}


class _Tasks:
    """The task table folded into one entry per job: what its simulated job needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index: dict[str, int] = {}
        self.line = array("q")  # the job's first task row: errors and arrivals name it
        self.percent = array("d")  # sum of inst_num x plan_gpu over launched GPU tasks
        self.start = array("d")  # earliest launch of a GPU task
        self.last = array("d")  # latest end of a GPU task
        self.state = bytearray()  # _GPU | _OPEN | _MATCHED | _BAD_INSTANCES | _BAD_TIMES
        self.odd: Counter[str] = Counter()  # ODD key -> rows or jobs set aside
        self.first: dict[str, str] = {}  # ODD key -> where the first one is

    def note(self, key: str, cells: CsvRow) -> None:
        """One more of ``key`` (:data:`ODD`), the first one's line kept for the notes."""
        self.odd[key] += 1
        self.first.setdefault(key, cells.where)

    def add(self, cells: CsvRow) -> None:
        name = cells.text("job_name")
        if not name:
            self.note("nameless", cells)
            return
        k = self.index.get(name)
        if k is None:
            if len(self.index) >= MAX_PAI_JOBS:
                why = f"more than {MAX_PAI_JOBS:,} jobs, the most read (the trace has 1.2 million)"
                raise cells.fail("job_name", why)
            k = self.index[name] = len(self.index)
            self.line.append(cells.line)
            self.percent.append(0.0)
            self.start.append(math.inf)
            self.last.append(-math.inf)
            self.state.append(0)
        plan = cells.number("plan_gpu", 0.0, MAX_PERCENT) if cells.text("plan_gpu") else 0.0
        if plan == 0:
            return
        self.state[k] |= _GPU
        start, end = _moment(cells, "start_time"), _moment(cells, "end_time")
        if start is None:
            return  # never launched: it held no GPU
        if start < 0 or (end is not None and (end < 0 or end < start)):
            self.state[k] |= _BAD_TIMES
            self.first.setdefault("times", cells.where)
            return
        instances = _instances(cells)
        if instances is None:
            self.state[k] |= _BAD_INSTANCES
            self.first.setdefault("instances", cells.where)
            return
        if end is None:
            self.state[k] |= _OPEN
        elif end - start > MAX_TRACE_SECONDS:
            days = MAX_TRACE_SECONDS / 86400
            raise cells.fail("end_time", f"more than {days:g} days after start_time")
        self.percent[k] += instances * plan
        if self.percent[k] > MAX_PERCENT:
            why = f"the job's tasks ask for more than {MAX_CLUSTER_GPUS:,} GPUs in all"
            raise cells.fail("plan_gpu", why)
        self.start[k] = min(self.start[k], start)
        if end is not None:
            self.last[k] = max(self.last[k], end)

    def record(self, name: str, k: int) -> TraceRecord | str:
        """Job ``name`` (the ``k``-th), arriving at its first GPU launch, or why it is
        skipped."""
        state, first, last = self.state[k], self.start[k], self.last[k]
        if not state & _GPU:
            return "cpu"
        for flag, key in ((_BAD_INSTANCES, "instances"), (_BAD_TIMES, "times")):
            if state & flag:
                self.odd[key] += 1
                return key  # counted here; the notes say it (read_notes)
        if first == math.inf:
            return "never"
        if state & _OPEN:
            return "open"
        if last <= first:
            return "never"
        if last - first > MAX_TRACE_SECONDS:
            days = MAX_TRACE_SECONDS / 86400
            raise ValueError(
                f"{self.path}, line {self.line[k]}: job {name}: its GPU tasks run over more "
                f"than {days:g} days"
            )
        # to the 2023 trace's resolution (gpu_milli: a thousandth of a GPU), and at least
        # that: 3 x 33.333333 is one whole GPU, neither two nor 0.99999999 of one
        percent = max(round(self.percent[k], 1), 0.1)
        gpus = max(1, math.ceil(percent / 100.0))
        marks: frozenset[str] = frozenset()
        share = 1.0
        if gpus == 1 and percent < 100.0:
            share, marks = percent / 100.0, frozenset({"fraction"})
        elif percent != 100.0 * gpus:
            marks = frozenset({"rounded"})
        return TraceRecord(
            job_id=name,
            id_column="job_name",
            arrival_s=first,
            arrival_column="start_time",
            gpus=gpus,
            duration_s=last - first,
            marks=marks,
            share=share,
        )


def _moment(cells: CsvRow, column: str) -> float | None:
    """A time cell in seconds (any clock, shifted by a constant in the trace), or None
    for an empty or 0 cell: the trace writes 0 for a task not launched or not ended.  A
    negative one is returned as it is, for the caller's rule (:data:`ODD`)."""
    if not cells.text(column):
        return None
    value = cells.number(column, -math.inf, math.inf)
    return value or None


def _instances(cells: CsvRow) -> int | None:
    """A task's ``inst_num`` (published as ``1.0``), or None where it is empty, under 1
    or not whole; a cell that is no number, or more instances than the largest cluster
    has GPUs, is an error naming it."""
    if not cells.text("inst_num"):
        return None
    value = cells.number("inst_num", -math.inf, math.inf)
    if value > MAX_CLUSTER_GPUS:
        raise cells.fail(
            "inst_num", f"more instances than the largest cluster's {MAX_CLUSTER_GPUS:,} GPUs"
        )
    if value < 1 or value != int(value):
        return None
    return int(value)


def _columns(
    folder: Path, table: str, published: tuple[str, ...], needs: frozenset[str]
) -> list[str]:
    """The column order of ``table``: its ``.header`` file's when there is one, else the
    published order; a header that lacks a column the reader needs names both."""
    header = folder / f"{table}.header"
    if not header.exists():
        return list(published)
    try:
        text = read_text(header, MAX_HEADER_BYTES)
    except OSError as exc:
        raise ValueError(f"{header}: cannot read: {reason(exc)}") from None
    names = [name.strip() for name in next(csv.reader(text.splitlines()), [])]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ValueError(f"{header}: names {twice} twice")
    missing = needs - set(names)
    if missing:
        raise ValueError(f"{header}: names no column {sorted(missing)} ({table}.csv needs them)")
    return names


def _table_file(folder: Path, table: str) -> Path | None:
    """The file ``table`` is read from: the first of :data:`TABLE_FILES` in ``folder``
    (a tarball beside what it unpacked to is left alone), None when there is none."""
    for pattern in TABLE_FILES:
        path = folder / pattern.format(table)
        if os.path.lexists(path):  # a folder or broken link of that name is refused, not passed
            return path
    return None


def _open_table(folder: Path, table: str) -> CsvText:
    """``table``'s text, from its plain, gzip-compressed or tarred file (each bounded by
    :data:`MAX_PAI_TABLE_BYTES`, compressed and inflated); a missing or unreadable one is
    a ValueError naming it."""
    path = _table_file(folder, table)
    try:
        if path is None:
            others = " or ".join(p.format(table) for p in TABLE_FILES[1:])
            raise FileNotFoundError(2, f"No such file or directory (nor {others})")
        if path.name.endswith(".tar.gz"):
            return open_csv(path, max_bytes=MAX_PAI_TABLE_BYTES, member=f"{table}.csv")
        return open_csv(path, gzipped=True, max_bytes=MAX_PAI_TABLE_BYTES)
    except OSError as exc:
        raise ValueError(f"{path or folder / f'{table}.csv'}: cannot read: {reason(exc)}") from None


def _rows(handle: CsvText, columns: list[str]) -> Iterator[CsvRow]:
    """Each record of the table open as ``handle`` read as ``columns`` (a line repeating
    them is a header), streamed: one line in memory at a time.  A row with fewer cells
    reads its missing ones as empty; a read that fails part way is a ValueError naming
    the file, as one that fails at the open is."""
    with handle:
        reader = csv.DictReader(handle, fieldnames=columns)
        try:
            for k, cells in enumerate(csv_rows(handle.path, reader)):
                if k == 0 and [cells.text(name) for name in columns] == columns:
                    continue
                yield cells
        except OSError as exc:  # a compressed table inflating past its bound, a disk error
            raise ValueError(f"{exc.filename or handle.path}: cannot read: {reason(exc)}") from None


class _JobTable:
    """The job table's rows, each with its job from the task table's aggregate; counts
    the rows that name no job of the task table (:attr:`unmatched`), and those that
    repeat a job or give it no usable submission (:data:`ODD`, on the task aggregate)."""

    def __init__(self, tasks: _Tasks, rows: Iterator[CsvRow]) -> None:
        self.tasks = tasks
        self.rows = rows
        self.unmatched = 0

    def __iter__(self) -> Iterator[tuple[CsvRow, TraceRecord | str]]:
        tasks = self.tasks
        for cells in self.rows:
            name = cells.text("job_name")
            k = tasks.index.get(name)
            if k is None:
                self.unmatched += 1
                continue
            if tasks.state[k] & _MATCHED:  # the first row is the job (ids are unique)
                tasks.note("repeated", cells)
                continue
            tasks.state[k] |= _MATCHED
            record = tasks.record(name, k)
            if isinstance(record, TraceRecord):  # a job that ran arrives when submitted
                submitted = cells.optional("start_time")
                if submitted is None or submitted > record.arrival_s:
                    tasks.note("launch", cells)  # it arrives at its first GPU launch
                else:
                    record = replace(record, arrival_s=submitted)
            yield cells, record


def _task_records(tasks: _Tasks) -> Iterator[tuple[CsvRow, TraceRecord | str]]:
    """Each job of the task table alone, arriving at its first GPU task's launch, with a
    row that names its first task line (an arrival too far out names that line)."""
    for name, k in tasks.index.items():
        at = str(tasks.start[k])
        yield (
            CsvRow(tasks.path, tasks.line[k], {"job_name": name, "start_time": at}),
            tasks.record(name, k),
        )


def _odd_notes(name: str, tasks: _Tasks) -> list[str]:
    """A note for each rule of :data:`ODD` that set something aside, naming the first."""
    return [
        f"{name}: skipped {tasks.odd[key]} {words} (the first: {tasks.first[key]})"
        if key != "launch"
        else f"{name}: {tasks.odd[key]} {words} (the first: {tasks.first[key]})"
        for key, words in ODD.items()
        if tasks.odd[key]
    ]


def pai_trace(folder: Path | str, seed: int = 0) -> TraceLoad:
    """The trace's jobs in ``folder`` (module docstring), sorted by arrival, with notes
    of what was read, skipped and read differently; a bad file or cell is a ValueError
    naming it."""
    folder = Path(folder)
    name = f"{PAI_PREFIX}{folder}"
    columns = _columns(folder, TASK_TABLE, TASK_COLUMNS, TASK_NEEDS)
    handle = _open_table(folder, TASK_TABLE)
    tasks = _Tasks(Path(handle.path))
    for cells in _rows(handle, columns):
        tasks.add(cells)
    task_file = Path(str(handle.path)).name
    if _table_file(folder, JOB_TABLE) is None:
        loaded = load_records(name, LAYOUT, _task_records(tasks), seed)
        source = (
            f"{name}: no {JOB_TABLE}.csv: each job arrives at its first GPU task's launch "
            f"and names no user ({task_file} read alone)"
        )
        return TraceLoad(
            loaded.jobs, loaded.history, (source, *loaded.notes, *_odd_notes(name, tasks))
        )
    columns = _columns(folder, JOB_TABLE, JOB_COLUMNS, JOB_NEEDS)
    jobs = _open_table(folder, JOB_TABLE)
    table = _JobTable(tasks, _rows(jobs, columns))
    loaded = load_records(name, LAYOUT, table, seed)
    notes = [
        f"{name}: read {Path(str(jobs.path)).name} (submissions, users) and {task_file} "
        "(GPUs, run times): one job per PAI job",
        *loaded.notes,
        *_odd_notes(name, tasks),
    ]
    orphans = sum(1 for state in tasks.state if state & _GPU and not state & _MATCHED)
    if orphans:
        notes.append(
            f"{name}: skipped {orphans} GPU jobs of {TASK_TABLE}.csv with no row in "
            f"{JOB_TABLE}.csv (no submission time or user)"
        )
    if table.unmatched:
        notes.append(
            f"{name}: skipped {table.unmatched} jobs of {JOB_TABLE}.csv with no row in "
            f"{TASK_TABLE}.csv"
        )
    return TraceLoad(loaded.jobs, loaded.history, tuple(notes))
