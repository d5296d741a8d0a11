"""The CSV layouts ``--trace`` reads, each told apart by its columns.

A layout turns one record into a :class:`TraceRecord` (which columns hold the job's
id, arrival, GPUs and run time) or into the reason it holds no job to simulate (a
CPU-only job, one that never ran).  :func:`elastico_extender.sim.traces.read_trace`
does what every layout shares: unique ids, workloads, floors, the arrival span, and
the notes that count what each layout skipped or read differently.

* The project's own format (``arrival_time_s``, ``gpu_num``, ``duration_s``).
* Helios cluster logs (Hu et al., SC'21), the files Lucid's simulator reads:
  ``submit_time``, ``gpu_num``, ``duration``.
* Alibaba's GPU-sharing cluster trace of 2023 (``openb_pod_list_*.csv``, Weng et
  al., ATC'23, the "Beware of Fragmentation" trace in ``alibaba/clusterdata``): one
  pod per row, ``creation_time``, ``scheduled_time``, ``deletion_time`` (seconds),
  ``num_gpu`` and ``gpu_milli`` (the share of one GPU a one-GPU pod asked for).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.csv_row import CsvRow

__all__ = [
    "LAYOUTS",
    "MAX_TRACE_SECONDS",
    "Layout",
    "RecordRows",
    "TraceRecord",
    "instant",
    "layout_of",
]

MAX_TRACE_SECONDS = 366 * 86400.0
"""Longest job and longest arrival span a trace may hold: the simulator steps every epoch
up to the last completion, so a year bounds a run (Philly's longest job is 60 days)."""


@dataclass(frozen=True, slots=True)
class TraceRecord:
    """One job as a layout reads it, with the columns its values came from (errors
    found later, a repeated id or an arrival too far out, name them)."""

    job_id: str
    id_column: str
    arrival_s: float
    arrival_column: str
    gpus: int
    duration_s: float
    marks: frozenset[str] = frozenset()
    """Keys of :attr:`Layout.marks`: what the notes count about this job."""
    share: float = 1.0
    """The part of one GPU the job declared (1.0: whole GPUs)."""


RowReader = Callable[[CsvRow, int], "TraceRecord | str"]
"""(record, its index among the rows) -> the job, or the key of why it is skipped."""
RecordRows = Iterable[tuple[CsvRow, "TraceRecord | str"]]
"""Each row read with its job or the key of why it is skipped: what
:func:`elastico_extender.sim.traces.load_records` turns into jobs and notes."""


@dataclass(frozen=True)
class Layout:
    """A trace format: the columns that identify it, how a row reads, what notes say."""

    title: str
    """What the notes call a file of this layout ("" for the project's own format)."""
    columns: frozenset[str]
    read: RowReader
    skips: tuple[tuple[str, str], ...] = ()
    """(key, words) of each reason a row holds no job, in the order the notes list them."""
    marks: tuple[tuple[str, str], ...] = ()
    """(key, words) of what the notes count about kept jobs that the simulation does
    not follow as written."""

    def summary(self, name: str, kept: int, skipped: dict[str, int]) -> str:
        """The note naming this layout, with the rows it skipped ("" for none to say)."""
        if not self.title:
            return ""
        counts = " and ".join(f"{skipped.get(key, 0)} {words}" for key, words in self.skips)
        return f"{name}: {self.title}: {kept} GPU jobs; skipped {counts}"


def instant(cells: CsvRow, column: str) -> float:
    """Seconds of a time cell: a number of seconds, or a date-time (naive ones are UTC)."""
    text = cells.text(column)
    try:
        float(text)
    except ValueError:
        try:
            when = datetime.fromisoformat(text)
        except ValueError:
            why = "not seconds nor a date-time such as 2020-04-01 00:00:09"
            raise cells.fail(column, why) from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    return cells.number(column, -math.inf, math.inf)


def _own(cells: CsvRow, k: int) -> TraceRecord:
    return TraceRecord(
        job_id=cells.text("job_id") or f"row{k:06d}",
        id_column="job_id",
        arrival_s=instant(cells, "arrival_time_s"),
        arrival_column="arrival_time_s",
        gpus=cells.count("gpu_num", MAX_CLUSTER_GPUS),
        duration_s=cells.number("duration_s", 0.0, MAX_TRACE_SECONDS, above_low=True),
    )


def _helios(cells: CsvRow, k: int) -> TraceRecord | str:
    if cells.number("gpu_num", 0.0, MAX_CLUSTER_GPUS) == 0:
        return "cpu"
    if cells.number("duration", 0.0, MAX_TRACE_SECONDS) == 0:
        return "never"
    # A row without a job_id is named by its jobname: a repeat names that column.
    id_column = "job_id" if cells.text("job_id") else "jobname"
    return TraceRecord(
        job_id=cells.text(id_column) or f"row{k:06d}",
        id_column=id_column,
        arrival_s=instant(cells, "submit_time"),
        arrival_column="submit_time",
        gpus=cells.count("gpu_num", MAX_CLUSTER_GPUS),
        duration_s=cells.number("duration", 0.0, MAX_TRACE_SECONDS, above_low=True),
    )


def _alibaba_pod(cells: CsvRow, k: int) -> TraceRecord | str:
    """A pod runs from its scheduling to its deletion; one never scheduled (Pending)
    or deleted as it was scheduled never ran.  ``pod_phase`` is the last phase seen
    before the deletion (most deleted pods read Running), so it says nothing of the
    trace's end: pods deleted at its last instant (34 of the default list's 8,152) ran
    on past it, and their run times stop there."""
    if cells.number("num_gpu", 0.0, MAX_CLUSTER_GPUS) == 0:
        return "cpu"
    if not cells.text("scheduled_time"):
        return "never"
    created = cells.number("creation_time", 0.0, math.inf)
    scheduled = cells.number("scheduled_time", 0.0, math.inf)
    deleted = cells.number("deletion_time", 0.0, math.inf)
    if scheduled < created:
        raise cells.fail("scheduled_time", "before creation_time")
    if deleted < scheduled:
        raise cells.fail("deletion_time", "before scheduled_time")
    if deleted - scheduled > MAX_TRACE_SECONDS:
        days = MAX_TRACE_SECONDS / 86400
        raise cells.fail("deletion_time", f"more than {days:g} days after scheduled_time")
    if deleted == scheduled:
        return "never"
    gpus = cells.count("num_gpu", MAX_CLUSTER_GPUS)
    marks = set()
    share = 1.0
    if gpus == 1 and cells.text("gpu_milli"):
        share = cells.number("gpu_milli", 0.0, 1000.0) / 1000.0
        if share < 1.0:
            marks.add("fraction")
    return TraceRecord(
        job_id=cells.text("name") or f"row{k:06d}",
        id_column="name",
        arrival_s=created,
        arrival_column="creation_time",
        gpus=gpus,
        duration_s=deleted - scheduled,
        marks=frozenset(marks),
        share=share,
    )


OWN = Layout("", frozenset({"arrival_time_s", "gpu_num", "duration_s"}), _own)
HELIOS = Layout(
    "a Helios cluster log",
    frozenset({"submit_time", "gpu_num", "duration"}),
    _helios,
    skips=(("cpu", "CPU-only jobs (gpu_num 0)"), ("never", "that never ran (duration 0)")),
)
ALIBABA_PODS = Layout(
    "an Alibaba GPU-sharing pod list",
    frozenset({"name", "num_gpu", "creation_time", "scheduled_time", "deletion_time"}),
    _alibaba_pod,
    skips=(
        ("cpu", "CPU-only pods (num_gpu 0)"),
        ("never", "that never ran (no scheduled_time, or deleted when scheduled)"),
    ),
    marks=(
        (
            "fraction",
            "one-GPU pods asked for part of a GPU (gpu_milli under 1000): the hami baseline "
            "packs them by that share, every other policy decides what shares a GPU itself",
        ),
    ),
)
LAYOUTS = (ALIBABA_PODS, HELIOS, OWN)
"""Most specific first: the first whose columns a header holds reads the file."""


def layout_of(columns: set[str]) -> Layout:
    """The layout a header's columns name.  When none is there in full, the one with
    the most of its own columns present (a pod list that lost ``scheduled_time`` is
    still a pod list: its missing column is the error to report), else the project's."""
    if "arrival_time_s" in columns:
        return OWN
    full = next((layout for layout in LAYOUTS if columns >= layout.columns), None)
    if full is not None:
        return full
    shared = set.intersection(*(set(layout.columns) for layout in LAYOUTS))
    return max(LAYOUTS[::-1], key=lambda layout: len((layout.columns - shared) & columns))
