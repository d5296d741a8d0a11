"""Alibaba PAI's GPU cluster trace of 2020 as ``--trace pai:DIR``.

The trace (``cluster-trace-gpu-v2020`` in ``alibaba/clusterdata``; Weng et al., "MLaaS
in the Wild", NSDI'22; CC BY 4.0; not shipped) covers July and August 2020 on a cluster
of over 6,500 GPUs.  ``DIR`` is the folder its tarballs unpack into: the simulator
reads ``pai_task_table.csv`` (needed) and ``pai_job_table.csv`` (when present).  The
CSVs have no header row: their columns are in the order the ``.header`` files beside
them give (the repository's README, commit 02a1be14), which is read when one is in
``DIR`` and otherwise taken as published (:data:`JOB_COLUMNS`, :data:`TASK_COLUMNS`);
a first line that repeats the column names is read as a header.

One simulated job per PAI job
-----------------------------
* **GPUs**: a task asks for ``plan_gpu`` percent of one GPU for each of its
  ``inst_num`` instances (README: 50.0 is half a GPU); an empty or 0 ``plan_gpu`` is a
  CPU-only role (a parameter server).  The job asks for the sum over its GPU tasks that
  launched.  Up to one GPU, it runs on one and keeps the part it asked for as
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
  layout reads), and the times say whether one ran or ended.

Skipped and counted in the notes: jobs without a GPU task (CPU-only), jobs none of
whose GPU tasks launched or whose GPU tasks each ended as they launched (never ran,
``Waiting``), jobs with a launched GPU task without ``end_time`` (still running when
the trace ends: its run time is unknown), GPU jobs of the task table without a job-table
row, and job-table rows without a task row.  ``--days``, ``--duration`` and ``--load``
apply as to any trace file (:func:`.traces.days_window`).

Memory and bounds
-----------------
The tables are streamed, never held: the task table is folded into one entry per job
(its first line, GPU percent, first launch, last end and three flags in flat arrays:
about 160 bytes a job with its name), then the job table streams past that aggregate,
each row becoming at most one job.  At most :data:`MAX_PAI_JOBS` jobs (the trace holds
about 1.2 million) and :data:`MAX_PAI_TABLE_BYTES` per table (each unpacked table the
simulator reads is a few hundred MB: the 256 MiB bound of user CSVs is too tight)
bound the memory and the time.  Measured on tables of our own in the trace's layout,
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
from array import array
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.csv_row import CsvRow, csv_rows, open_csv
from elastico_extender.sim.trace_layouts import MAX_TRACE_SECONDS, Layout, TraceRecord
from elastico_extender.sim.traces import TraceLoad, load_records
from elastico_extender.userfiles import read_text, reason

__all__ = [
    "JOB_COLUMNS",
    "JOB_TABLE",
    "MAX_PAI_JOBS",
    "MAX_PAI_TABLE_BYTES",
    "PAI_PREFIX",
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

_GPU = 1  # the job has a task that asks for a GPU
_OPEN = 2  # a launched GPU task of the job has no end_time
_MATCHED = 4  # a job-table row named the job

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
    return Path(path).name in {f"{JOB_TABLE}.csv", f"{TASK_TABLE}.csv"}


class _Tasks:
    """The task table folded into one entry per job: what its simulated job needs."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.index: dict[str, int] = {}
        self.line = array("q")  # the job's first task row: errors and arrivals name it
        self.percent = array("d")  # sum of inst_num x plan_gpu over launched GPU tasks
        self.first = array("d")  # earliest launch of a GPU task
        self.last = array("d")  # latest end of a GPU task
        self.state = bytearray()  # _GPU | _OPEN | _MATCHED

    def add(self, cells: CsvRow) -> None:
        name = cells.text("job_name")
        if not name:
            raise cells.fail("job_name", "missing")
        k = self.index.get(name)
        if k is None:
            if len(self.index) >= MAX_PAI_JOBS:
                why = f"more than {MAX_PAI_JOBS:,} jobs, the most read (the trace has 1.2 million)"
                raise cells.fail("job_name", why)
            k = self.index[name] = len(self.index)
            self.line.append(cells.line)
            self.percent.append(0.0)
            self.first.append(math.inf)
            self.last.append(-math.inf)
            self.state.append(0)
        plan = cells.number("plan_gpu", 0.0, MAX_PERCENT) if cells.text("plan_gpu") else 0.0
        if plan == 0:
            return
        self.state[k] |= _GPU
        start = _moment(cells, "start_time")
        if start is None:
            return  # never launched: it held no GPU
        instances = cells.count("inst_num", MAX_CLUSTER_GPUS)
        end = _moment(cells, "end_time")
        if end is None:
            self.state[k] |= _OPEN
        elif end < start:
            raise cells.fail("end_time", "before start_time")
        elif end - start > MAX_TRACE_SECONDS:
            days = MAX_TRACE_SECONDS / 86400
            raise cells.fail("end_time", f"more than {days:g} days after start_time")
        self.percent[k] += instances * plan
        if self.percent[k] > MAX_PERCENT:
            why = f"the job's tasks ask for more than {MAX_CLUSTER_GPUS:,} GPUs in all"
            raise cells.fail("plan_gpu", why)
        self.first[k] = min(self.first[k], start)
        if end is not None:
            self.last[k] = max(self.last[k], end)

    def record(self, name: str, k: int) -> TraceRecord | str:
        """Job ``name`` (the ``k``-th), arriving at its first GPU launch, or why it is
        skipped."""
        state, first, last = self.state[k], self.first[k], self.last[k]
        if not state & _GPU:
            return "cpu"
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
        percent = round(self.percent[k], 6)  # 3 x 33.333333 is one GPU, not two
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
    for an empty or 0 cell: the trace writes 0 for a task not launched or not ended."""
    if not cells.text(column):
        return None
    value = cells.number(column, 0.0, math.inf)
    return value or None


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


def _rows(folder: Path, table: str, columns: list[str]) -> Iterator[CsvRow]:
    """Each record of ``folder/table.csv`` read as ``columns`` (a line repeating them is
    a header), streamed: one line in memory at a time."""
    path = folder / f"{table}.csv"
    try:
        handle = open_csv(path, max_bytes=MAX_PAI_TABLE_BYTES)
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {reason(exc)}") from None
    with handle:
        reader = csv.DictReader(handle, fieldnames=columns)
        for k, cells in enumerate(csv_rows(path, reader)):
            if k == 0 and [cells.text(name) for name in columns] == columns:
                continue
            yield cells


class _JobTable:
    """The job table's rows, each with its job from the task table's aggregate; counts
    the rows that name no job of the task table (:attr:`unmatched`)."""

    def __init__(self, tasks: _Tasks, rows: Iterator[CsvRow]) -> None:
        self.tasks = tasks
        self.rows = rows
        self.unmatched = 0

    def __iter__(self) -> Iterator[tuple[CsvRow, TraceRecord | str]]:
        for cells in self.rows:
            name = cells.text("job_name")
            k = self.tasks.index.get(name)
            if k is None:
                self.unmatched += 1
                continue
            self.tasks.state[k] |= _MATCHED
            record = self.tasks.record(name, k)
            if isinstance(record, TraceRecord):  # a job that ran arrives when submitted
                record = replace(record, arrival_s=cells.number("start_time", 0.0, math.inf))
            yield cells, record


def _task_records(tasks: _Tasks) -> Iterator[tuple[CsvRow, TraceRecord | str]]:
    """Each job of the task table alone, arriving at its first GPU task's launch, with a
    row that names its first task line (an arrival too far out names that line)."""
    for name, k in tasks.index.items():
        at = str(tasks.first[k])
        yield (
            CsvRow(tasks.path, tasks.line[k], {"job_name": name, "start_time": at}),
            tasks.record(name, k),
        )


def pai_trace(folder: Path | str, seed: int = 0) -> TraceLoad:
    """The trace's jobs in ``folder`` (module docstring), sorted by arrival, with notes
    of what was read, skipped and read differently; a bad file or cell is a ValueError
    naming it."""
    folder = Path(folder)
    name = f"{PAI_PREFIX}{folder}"
    tasks = _Tasks(folder / f"{TASK_TABLE}.csv")
    for cells in _rows(folder, TASK_TABLE, _columns(folder, TASK_TABLE, TASK_COLUMNS, TASK_NEEDS)):
        tasks.add(cells)
    if not (folder / f"{JOB_TABLE}.csv").exists():
        loaded = load_records(name, LAYOUT, _task_records(tasks), seed)
        source = (
            f"{name}: no {JOB_TABLE}.csv: each job arrives at its first GPU task's launch "
            f"and names no user ({TASK_TABLE}.csv read alone)"
        )
        return TraceLoad(loaded.jobs, loaded.history, (source, *loaded.notes))
    columns = _columns(folder, JOB_TABLE, JOB_COLUMNS, JOB_NEEDS)
    table = _JobTable(tasks, _rows(folder, JOB_TABLE, columns))
    loaded = load_records(name, LAYOUT, table, seed)
    notes = [
        f"{name}: read {JOB_TABLE}.csv (submissions, users) and {TASK_TABLE}.csv (GPUs, "
        "run times): one job per PAI job",
        *loaded.notes,
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
