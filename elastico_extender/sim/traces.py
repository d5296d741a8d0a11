"""Simulator inputs: trace jobs from a user CSV, the Philly per-VC traces, or a generator.

User trace format (``--trace path.csv``)
----------------------------------------
CSV with a header.  Required columns:

* ``arrival_time_s``  seconds on any clock (any order; sorted, and the simulator rebases
                      the first arrival to 0); the arrivals span at most 366 days
* ``gpu_num``         GPUs the job asks for (whole GPUs, one worker per GPU, 1..65,536);
                      a gang wider than the cluster is clipped to it, and the CLI says so
* ``duration_s``      run time at its default configuration alone on its GPUs (> 0, at
                      most 366 days); one under a second is run for a second, and
                      the notes say how many were

Optional columns:

* ``job_id``               unique id (row number when absent)
* ``workload``             a catalog workload (``resnet50`` ... ``llama3-7b``) or a Gavel job
                           type (``'LM (batch size 20)'``, mapped by :mod:`.workloads`);
                           when absent, drawn from the synthetic mix with the run's seed
                           (a job of several GPUs from the training workloads only: an
                           inference engine, which serves from one GPU, is run on one)
* ``min_throughput_frac``  throughput floor L_j as a fraction of the workload's peak
                           catalog throughput (0..1, 0 = none); drawn when absent

* ``user``                 who submitted it: the duration estimator learns per user too
                           (``core.duration``)

What is drawn for a job depends on the seed and its ``job_id`` only, never on the
order of the rows: the same jobs listed in another order load as the same trace.

Helios cluster logs (``--trace cluster_log.csv``)
-------------------------------------------------
The layout of the Helios traces (Hu et al., SC'21; SenseTime's Venus, Earth, Saturn
and Uranus clusters) and of the traces Lucid's simulator reads, Philly's included, is
read as published, told apart by its columns: ``submit_time`` (a date-time such as
``2020-04-01 00:00:09``, read as UTC, or seconds), ``gpu_num`` and ``duration``
(seconds), with ``job_id`` (else ``jobname``, else the row), ``user`` and ``workload``
read as above.  The other columns (``vc``, ``state``, ``cpu_num``, ...) are not used:
a job that failed or was cancelled held its GPUs as long as it ran.  CPU-only jobs
(``gpu_num`` 0) and jobs that never ran (``duration`` 0) are skipped, and the notes
say how many (:func:`read_trace`).

Alibaba GPU-sharing pod lists (``--trace openb_pod_list_default.csv``)
----------------------------------------------------------------------
The 2023 trace of Alibaba's GPU-sharing cluster (Weng et al., ATC'23; ``alibaba/
clusterdata``, ``cluster-trace-gpu-v2023/csv``), one pod per row: ``name``, ``num_gpu``,
``creation_time``, ``scheduled_time`` and ``deletion_time`` in seconds.  A pod arrives
when created and runs from its scheduling to its deletion; CPU-only pods and pods never
scheduled (``Pending``, or deleted as they were scheduled) are skipped.  Two things are
not simulated as written: a one-GPU pod that asked for part of a GPU (``gpu_milli``
under 1000; the notes count them) keeps that share in ``TraceJob.gpu_share``, which only
the ``hami`` baseline places by (every other policy decides what shares a GPU itself);
a pod deleted at the trace's last instant (still running then) stops there.  ``qos``,
``gpu_spec`` and the CPU and memory columns are not used (:mod:`.trace_layouts`).

A bad cell (not a number, NaN, infinite, out of range, a repeated id, an unknown
workload) is a ``ValueError`` naming the file, line and column.  So is a bad file: a
byte that is not UTF-8 names its line, and a column named twice in the header is
refused, naming it (a CSV reader would keep the last copy's cells).

Philly per-VC traces (``--trace philly:VC``)
--------------------------------------------
Real arrival times, GPU counts and durations of one Philly virtual cluster
(Jeon et al., ATC'19, CC BY 4.0), as derived per VC by Gavel (Narayanan et
al., OSDI'20, MIT): ``sim/data/philly_vc_traces.csv.gz`` ships with the
package (the columns of ``philly_gavel_vc_traces.csv`` the simulator reads,
../shared/data/README.md section 4), so an installed user needs nothing else;
``path``, or ``philly_gavel_vc_traces.csv`` in the folder ``ELASTICO_DATA_DIR``
names, may be the full CSV instead, plain or gzip-compressed (its cells are checked
like a user trace's, job ids unique within a VC; columns ``PHILLY_COLUMNS``).  A set
``ELASTICO_DATA_DIR`` that is not a folder is refused; a folder without that file
falls back to the shipped copy.  The notes name the file read (:func:`philly_source`).
Job types come from column ``job_type_seed0`` (Gavel's random assignment) mapped
to catalog workloads.  Three transformations, each stated in
:attr:`TraceLoad.notes` and printed by the CLI:

* **Inference conversion.**  Philly has no offline-inference jobs, so a share
  of the one-GPU jobs (``inference_share``, default 0.3, chosen by a hash of
  the job id so every policy and seed sees the same ones) becomes one of the
  four LLM inference workloads, keeping the spec's mixed setting; 0 keeps the
  trace training-only.
* **Duration clipping.**  Philly jobs last a median of 4.6 h and up to 60
  days; ``max_duration_s`` (default 48 h; None keeps every duration) clips
  the tail so a run ends in reasonable simulated time.
* **Days window.**  ``days=(start, end)`` keeps the jobs arriving in that
  window (days since the VC's first job), rebased so the window starts at 0;
  jobs that finished before the window form :attr:`TraceLoad.history`, what a
  running cluster already knows about job lengths.

Synthetic generator (``--trace synthetic``)
-------------------------------------------
Poisson arrivals over ``duration_s`` at the rate that gives the requested load
factor ``load = rate * E[gpus * duration] / cluster GPUs``.  Workloads uniform over
the spec's 12 (8 training, 4 offline inference, spec table "Workloads").  GPU
counts of training jobs follow Philly's empirical distribution (1: 69%, 2: 3%,
4: 13%, 8: 13%, 16: 2%), capped at a quarter of the cluster; inference engines
use 1 GPU.  Durations are log-normal (median 1 h, sigma 1.0) clipped to
[10 min, 12 h]: shorter than Philly so a 24 h window holds many completions.
Every job gets a throughput floor of U[0.25, 0.6] x its workload's peak
throughput (the spec's attainment metric needs a floor per job).
"""

from __future__ import annotations

import csv
import math
import os
import zlib
from collections import Counter
from collections.abc import Generator
from contextlib import closing
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from elastico_extender.core.duration import CompletedJob
from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.csv_row import CsvRow, csv_header, csv_rows, open_csv
from elastico_extender.sim.trace_layouts import (
    MAX_TRACE_SECONDS,
    Layout,
    RecordRows,
    layout_of,
)
from elastico_extender.sim.workloads import (
    INFERENCE_WORKLOADS,
    TRAINING_WORKLOADS,
    workload_from_gavel,
)
from elastico_extender.userfiles import reason

__all__ = [
    "MAX_TRACE_SECONDS",
    "PHILLY_CLIP_HOURS",
    "PHILLY_DATA",
    "PHILLY_GPU_MIX",
    "PHILLY_INFERENCE_SHARE",
    "PHILLY_VC_GPUS",
    "EmptyWindowError",
    "TraceJob",
    "TraceLoad",
    "days_window",
    "default_data_dir",
    "in_window",
    "load_csv",
    "load_philly",
    "load_records",
    "offered_load",
    "philly_source",
    "philly_trace",
    "read_trace",
    "rebase",
    "synthetic",
]

ALL_WORKLOADS = TRAINING_WORKLOADS + INFERENCE_WORKLOADS
PHILLY_GPU_MIX: dict[int, float] = {1: 0.69, 2: 0.03, 4: 0.13, 8: 0.13, 16: 0.02}
PHILLY_VC_GPUS: dict[str, int] = {
    "6214e9": 512,
    "7f04ca": 256,
    "11cb48": 128,
    "b436b2": 512,
    "ee9e8c": 512,
    "e13805": 128,
    "6c71a0": 256,
    "2869ce": 128,
    "ed69ec": 64,
    "103959": 64,
    "0e4a51": 256,
}
"""VC sizes in GPUs (nodes x 8, HeliosArtifact philly_vc.csv via ../shared/data/README.md)."""
FLOOR_RANGE = (0.25, 0.6)
PHILLY_DATA = Path(__file__).with_name("data") / "philly_vc_traces.csv.gz"
"""Package copy of the per-VC Philly traces (Philly CC BY 4.0 via Gavel MIT; see sim/data)."""
PHILLY_FULL_NAME = "philly_gavel_vc_traces.csv"
PHILLY_CLIP_HOURS = 48.0
"""Default clip of Philly durations (hours; the count is stated in the notes)."""
PHILLY_INFERENCE_SHARE = 0.3
"""Default share of Philly's one-GPU jobs turned into LLM inference (module doc)."""
MIN_JOB_SECONDS = 1.0
"""Shortest duration a user trace's job runs for: a shorter one is raised to it, and the
notes say how many were, so the run never differs from the file unsaid."""
MAX_SYNTHETIC_JOBS = 1_000_000
"""Most jobs the generator draws (load x GPUs x hours sets the count): memory stays bounded."""
MAX_TRACE_JOBS = 2_000_000
"""Most jobs a trace file (or a Philly VC) may hold: some 0.8 GiB of jobs and a minute of
reading.  The file bound alone let about 11 million short rows through, 4.4 GiB held
for a run that could never end; the largest published trace (Helios's Saturn
cluster, 1.75 million jobs with its CPU-only ones) fits."""
_TOO_MANY = "(the most a trace may hold: split the file)"


class EmptyWindowError(ValueError):
    """A Philly VC that exists has no job arriving in the requested days window."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    workload: str
    floor_frac: float = 0.0
    user: str = ""
    gpu_share: float = 1.0
    """The part of one GPU the job declared (Alibaba's ``gpu_milli``; 1.0: whole GPUs).
    Only the ``hami`` baseline reads it: the other policies decide sharing themselves."""


def default_data_dir() -> Path:
    """Where ``--trace philly:VC`` looks first: ``ELASTICO_DATA_DIR``, else the package data."""
    env = os.environ.get("ELASTICO_DATA_DIR")
    return Path(env) if env else PHILLY_DATA.parent


def arrival_span(jobs: list[TraceJob]) -> float:
    """Last minus first arrival (seconds): the window the jobs were offered over."""
    if not jobs:
        return 0.0
    arrivals = [j.arrival_s for j in jobs]
    return max(arrivals) - min(arrivals)


def offered_load(jobs: list[TraceJob], gpus: int, span_s: float | None = None) -> float:
    """Offered GPU-time over the arrival span (last - first arrival) / cluster GPU-time."""
    if not jobs:
        return 0.0
    span = span_s or arrival_span(jobs) or 1.0
    return sum(j.gpus * j.duration_s for j in jobs) / (gpus * span)


def rebase(jobs: list[TraceJob]) -> list[TraceJob]:
    """The same jobs with the first arrival at t = 0 (metrics never depend on the origin)."""
    if not jobs:
        return jobs
    t0 = min(j.arrival_s for j in jobs)
    return jobs if t0 == 0 else [replace(j, arrival_s=j.arrival_s - t0) for j in jobs]


def _floor(rng: np.random.Generator) -> float:
    return float(rng.uniform(*FLOOR_RANGE))


def synthetic(
    gpus: int,
    load: float = 1.0,
    duration_s: float = 24 * 3600.0,
    seed: int = 0,
    median_job_s: float = 3600.0,
) -> list[TraceJob]:
    """Poisson arrivals of the spec's 12-workload mix at load factor ``load``."""
    rng = np.random.default_rng([seed, 0x7EACE])
    cap = max(1, gpus // 4)
    sizes = np.array([g for g in PHILLY_GPU_MIX if g <= cap])
    probs = np.array([PHILLY_GPU_MIX[int(g)] for g in sizes])
    probs /= probs.sum()
    sigma = 1.0
    lo, hi = 600.0, 12 * 3600.0
    # E[duration] of the clipped log-normal, by sampling once (deterministic per seed).
    probe = np.clip(median_job_s * np.exp(rng.normal(0, sigma, 200_000)), lo, hi)
    share_train = len(TRAINING_WORKLOADS) / len(ALL_WORKLOADS)
    mean_gpus = share_train * float((sizes * probs).sum()) + (1 - share_train)
    rate = load * gpus / (mean_gpus * float(probe.mean()))
    if rate * duration_s > MAX_SYNTHETIC_JOBS:
        raise ValueError(
            f"the synthetic trace would hold about {rate * duration_s:,.0f} jobs, "
            f"more than {MAX_SYNTHETIC_JOBS:,}"
        )
    jobs: list[TraceJob] = []
    if rate <= 0.0:  # a load so small that the rate underflows: no job ever arrives
        return jobs
    t = 0.0
    k = 0
    while True:
        t += float(rng.exponential(1.0 / rate))
        if t > duration_s:
            break
        workload = ALL_WORKLOADS[int(rng.integers(len(ALL_WORKLOADS)))]
        g = 1 if workload in INFERENCE_WORKLOADS else int(rng.choice(sizes, p=probs))
        d = float(np.clip(median_job_s * math.exp(rng.normal(0, sigma)), lo, hi))
        jobs.append(TraceJob(f"s{k:05d}", round(t, 1), g, round(d, 1), workload, _floor(rng)))
        k += 1
    return jobs


def _resolve_workload(name: str, job_id: str) -> str:
    name = name.strip()
    if name in ALL_WORKLOADS:
        return name
    return workload_from_gavel(name, job_id)


@dataclass(frozen=True)
class TraceLoad:
    """A loaded trace with what was done to it and what came before its window."""

    jobs: list[TraceJob]
    history: tuple[CompletedJob, ...] = ()
    notes: tuple[str, ...] = ()


def load_csv(path: Path | str, seed: int = 0) -> list[TraceJob]:
    """A user trace's jobs (:func:`read_trace` without its notes)."""
    return read_trace(path, seed).jobs


def read_trace(path: Path | str, seed: int = 0) -> TraceLoad:
    """A user trace (any layout of :mod:`.trace_layouts`), sorted by arrival, with notes
    of what was skipped or read differently.

    Every cell is checked (finite, in range, ids unique): a bad one raises
    ValueError naming the line and column, never a run that cannot end.
    """
    with open_csv(path) as handle:
        reader = csv.DictReader(handle)
        columns = set(csv_header(path, reader))
        layout = layout_of(columns)
        missing = layout.columns - columns
        if missing:
            read_as = f" (read as {layout.title})" if layout.title else ""
            raise ValueError(f"{path}: missing columns {sorted(missing)}{read_as}")
        rows = csv_rows(path, reader)
        records = ((cells, layout.read(cells, k)) for k, cells in enumerate(rows))
        return load_records(Path(path).name, layout, records, seed)


def load_records(
    name: str,
    layout: Layout,
    records: RecordRows,
    seed: int = 0,
) -> TraceLoad:
    """The jobs of ``records`` (each the row it was read from, and the job or why it is
    skipped), sorted by arrival, with the notes :func:`read_trace` gives, ``name`` the
    trace they call: what every layout shares, for readers that join several files
    into one record (:mod:`.pai_trace`).  The row's ``workload``, ``min_throughput_frac``
    and ``user`` cells are read as a user trace's, and a bad value names that row."""
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    first, last = math.inf, -math.inf
    skipped: Counter[str] = Counter()
    marked: Counter[str] = Counter()
    drawn = narrowed = raised = 0
    for cells, record in records:
        if isinstance(record, str):
            skipped[record] += 1
            continue
        job_id = record.job_id
        if job_id in seen:
            raise cells.fail(record.id_column, "used by an earlier row (ids must be unique)")
        seen.add(job_id)
        marked.update(record.marks)
        gpus, duration = record.gpus, record.duration_s
        raised += duration < MIN_JOB_SECONDS
        workload_name = cells.text("workload")
        # Draws keyed by the job, not by its row (module docstring).
        rng = np.random.default_rng([seed, 0xC5F, zlib.crc32(job_id.encode())])
        try:
            workload = (
                _resolve_workload(workload_name, job_id) if workload_name else _draw(rng, gpus)
            )
        except ValueError as exc:
            raise cells.fail("workload", str(exc)) from None
        drawn += not workload_name
        has_floor = bool(cells.text("min_throughput_frac"))
        floor = cells.number("min_throughput_frac", 0.0, 1.0) if has_floor else _floor(rng)
        if workload in INFERENCE_WORKLOADS and gpus > 1:
            narrowed += 1
            gpus = 1
        first, last = min(first, record.arrival_s), max(last, record.arrival_s)
        if last - first > MAX_TRACE_SECONDS:
            why = f"arrivals span more than {MAX_TRACE_SECONDS / 86400:g} days"
            raise cells.fail(record.arrival_column, why)
        if len(jobs) == MAX_TRACE_JOBS:
            raise ValueError(f"{cells.where}: more than {MAX_TRACE_JOBS:,} jobs {_TOO_MANY}")
        user = cells.text("user")
        duration = max(duration, MIN_JOB_SECONDS)
        jobs.append(
            TraceJob(job_id, record.arrival_s, gpus, duration, workload, floor, user, record.share)
        )
    jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
    notes = [layout.summary(name, len(jobs), skipped)]
    notes += [f"{name}: {marked[key]} {words}" for key, words in layout.marks if marked[key]]
    if drawn:
        notes.append(
            f"{name}: {drawn} jobs name no workload: drawn from the synthetic mix with the "
            "seed (one-GPU jobs from all twelve, wider ones from the eight training workloads)"
        )
    if raised:
        notes.append(
            f"{name}: raised {raised} durations under {MIN_JOB_SECONDS:g} s to "
            f"{MIN_JOB_SECONDS:g} s (the shortest job the simulator runs)"
        )
    if narrowed:
        notes.append(
            f"{name}: {narrowed} jobs name an inference workload on more than one GPU: "
            "run on one (an engine serves from one GPU)"
        )
    return TraceLoad(jobs, notes=tuple(note for note in notes if note))


def _draw(rng: np.random.Generator, gpus: int) -> str:
    """A workload for a job that names none: a gang is training (an inference engine
    serves from one GPU, so drawing one would shrink the job to one GPU)."""
    pool = ALL_WORKLOADS if gpus == 1 else TRAINING_WORKLOADS
    return pool[int(rng.integers(len(pool)))]


PHILLY_COLUMNS = ("job_id", "vc", "arrival_time_s", "gpu_num", "duration_s", "job_type_seed0")


def philly_source(path: Path | str | None = None) -> Path:
    """The file ``--trace philly:VC`` reads: ``path``, else ``ELASTICO_DATA_DIR``'s copy,
    else the package's.  A set ``ELASTICO_DATA_DIR`` that is no folder is a ValueError: a
    mistyped folder must not run the shipped trace unnoticed.  A folder without a copy
    falls back to the package's (the variable names a data folder for other files too);
    the notes say which file was read."""
    if path is not None:
        return Path(path)
    env = os.environ.get("ELASTICO_DATA_DIR")
    if env and not Path(env).is_dir():
        raise ValueError(
            f"ELASTICO_DATA_DIR={env} is not a folder: set it to one holding "
            f"{PHILLY_FULL_NAME}, or unset it to read the trace shipped with the package"
        )
    full = default_data_dir() / PHILLY_FULL_NAME
    # lexists: a directory, FIFO or broken link of that name is read, and refused, not skipped
    return full if env and os.path.lexists(full) else PHILLY_DATA


def _philly_rows(source: Path) -> Generator[CsvRow, None, None]:
    """Each record of the Philly file ``source`` (plain or gzip-compressed, read bounded)
    with its line (errors name it), one at a time: held all at once, a file at the size
    bound took about 40 times its size in memory (a dict of cells per record)."""
    try:
        with open_csv(source, gzipped=True) as handle:
            reader = csv.DictReader(handle)
            missing = set(PHILLY_COLUMNS) - set(csv_header(source, reader))
            if missing:
                raise ValueError(f"{source}: missing columns {sorted(missing)}")
            yield from csv_rows(source, reader)
    except FileNotFoundError:
        raise ValueError(
            f"Philly trace not found at {source}: it ships with the package as "
            f"{PHILLY_DATA.name}; reinstall elastico-extender, or download Gavel's per-VC "
            "traces (github.com/stanford-futuredata/gavel, scheduler/traces/msr) and set "
            f"ELASTICO_DATA_DIR to a folder holding {PHILLY_FULL_NAME}"
        ) from None
    except OSError as exc:
        raise ValueError(f"cannot read {source}: {reason(exc)}") from None


MAX_NAMED_VCS = 32
"""Most VC ids an error lists (a file of a million distinct ones must not be held)."""


def philly_vcs(path: Path | str | None = None) -> list[str]:
    """The VC ids in the trace file."""
    return sorted({r.text("vc") for r in _philly_rows(philly_source(path))})


def philly_trace(
    vc: str,
    path: Path | str | None = None,
    seed: int = 0,
    inference_share: float = PHILLY_INFERENCE_SHARE,
    max_duration_s: float | None = PHILLY_CLIP_HOURS * 3600.0,
    days: tuple[float, float] | None = None,
) -> TraceLoad:
    """One Philly VC with the transformations of the module docstring, each stated in notes."""
    source = philly_source(path)
    rng = np.random.default_rng([seed, zlib.crc32(vc.encode())])
    start, end = (days[0] * 86400.0, days[1] * 86400.0) if days else (0.0, math.inf)
    every: list[TraceJob] = []
    clipped_ids: set[str] = set()
    seen: set[str] = set()
    others: set[str] = set()  # the VCs an error lists, at most MAX_NAMED_VCS of them
    more = False
    with closing(_philly_rows(source)) as records:  # closed on a bad row too
        for row in records:
            if row.text("vc") != vc:
                if len(others) < MAX_NAMED_VCS:
                    others.add(row.text("vc"))
                else:
                    more = more or row.text("vc") not in others
                continue
            if len(every) == MAX_TRACE_JOBS:
                raise ValueError(
                    f"{row.where}: more than {MAX_TRACE_JOBS:,} jobs of VC {vc} {_TOO_MANY}"
                )
            arrival = row.number("arrival_time_s", 0.0, MAX_TRACE_SECONDS)
            job_id = row.text("job_id")
            if job_id in seen:
                raise row.fail("job_id", f"used by an earlier row of VC {vc} (ids must be unique)")
            seen.add(job_id)
            gpus = row.count("gpu_num", MAX_CLUSTER_GPUS)
            try:
                workload = workload_from_gavel(row.text("job_type_seed0"), job_id)
            except ValueError as exc:
                raise row.fail("job_type_seed0", str(exc)) from None
            h = zlib.crc32(("inf:" + job_id).encode()) / 2**32
            if gpus == 1 and h < inference_share:
                workload = INFERENCE_WORKLOADS[int(h / inference_share * 4) % 4]
            duration = row.number("duration_s", 0.0, MAX_TRACE_SECONDS, above_low=True)
            if max_duration_s is not None and duration > max_duration_s:
                duration = max_duration_s
                clipped_ids.add(job_id)
            every.append(TraceJob(job_id, arrival, gpus, duration, workload))
    jobs, history = in_window(every, start, end)
    # Floors drawn in row order for the window's jobs only: a window never shifts another's.
    jobs = [replace(j, floor_frac=_floor(rng)) for j in jobs]
    one_gpu = sum(j.gpus == 1 for j in jobs)
    converted = sum(j.workload in INFERENCE_WORKLOADS for j in jobs)
    clipped = sum(j.job_id in clipped_ids for j in jobs)
    if not jobs:
        arrivals = [j.arrival_s for j in every]
        if arrivals and days:
            raise EmptyWindowError(
                f"no job of Philly VC {vc!r} arrives in days {days[0]:g}-{days[1]:g} "
                f"(its jobs arrive over days {min(arrivals) / 86400:.1f}-"
                f"{max(arrivals) / 86400:.1f})"
            )
        known = ", ".join(sorted(others)) + (", ..." if more else "")
        raise ValueError(f"no jobs for Philly VC {vc!r} in {source} (VCs: {known})")
    jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
    shift = jobs[0].arrival_s
    jobs = rebase(jobs)
    window = f"days {days[0]:g}-{days[1]:g}" if days else "whole trace"
    shipped = " (shipped with the package)" if source == PHILLY_DATA else ""
    notes = [
        f"Philly trace read from {source}{shipped}",
        f"Philly VC {vc} ({window}, first arrival rebased to t=0 from {shift / 86400:.2f} d): "
        f"{len(jobs)} jobs, {len(history)} earlier completions as history",
        f"converted {converted} of {one_gpu} one-GPU jobs to LLM inference "
        f"(inference share {inference_share:g}: Philly has no inference jobs)",
        f"clipped {clipped} job durations to {max_duration_s / 3600:g} h (--max-job-hours)"
        if max_duration_s is not None
        else "durations not clipped",
    ]
    return TraceLoad(jobs, tuple(history), tuple(notes))


def in_window(
    jobs: list[TraceJob], start_s: float, end_s: float
) -> tuple[list[TraceJob], list[CompletedJob]]:
    """The jobs arriving in [start_s, end_s), in their order, and those that finished
    before start_s as completions: what a cluster running since the trace began already
    knows about job lengths (the duration estimators start from it)."""
    kept = [j for j in jobs if start_s <= j.arrival_s < end_s]
    history = [
        CompletedJob(j.workload, j.gpus, j.duration_s, j.user)
        for j in jobs
        if j.arrival_s < start_s and j.arrival_s + j.duration_s <= start_s
    ]
    return kept, history


def days_window(loaded: TraceLoad, days: tuple[float, float]) -> TraceLoad:
    """A trace file's jobs arriving in ``days`` since its first arrival, rebased to t = 0,
    with the completions before the window added to its history and a note saying so
    added to its notes; :class:`EmptyWindowError` when no job arrives in it."""
    jobs = rebase(loaded.jobs)
    kept, history = in_window(jobs, days[0] * 86400.0, days[1] * 86400.0)
    if not kept:
        last = max((j.arrival_s for j in jobs), default=0.0) / 86400.0
        raise EmptyWindowError(
            f"no job arrives in days {days[0]:g}-{days[1]:g} (the jobs arrive over days "
            f"0-{last:.1f} after the first)"
        )
    note = (
        f"--days: kept the {len(kept)} of {len(jobs)} jobs arriving in days {days[0]:g}-"
        f"{days[1]:g}, rebased to t=0; the {len(history)} that finished before day "
        f"{days[0]:g} are the history the duration estimators start from"
    )
    return TraceLoad(rebase(kept), (*loaded.history, *history), (*loaded.notes, note))


def load_philly(
    vc: str,
    path: Path | str | None = None,
    seed: int = 0,
    inference_share: float = PHILLY_INFERENCE_SHARE,
    max_duration_s: float | None = PHILLY_CLIP_HOURS * 3600.0,
    window_s: float | None = None,
) -> list[TraceJob]:
    """One Philly VC's jobs (the first ``window_s`` seconds); :func:`philly_trace` says more."""
    days = (0.0, window_s / 86400.0) if window_s is not None else None
    return philly_trace(vc, path, seed, inference_share, max_duration_s, days).jobs


def fit_to_cluster(jobs: list[TraceJob], gpus: int) -> list[TraceJob]:
    """Clip gang sizes to the cluster (a job wider than the cluster could never start)."""
    return [j if j.gpus <= gpus else replace(j, gpus=gpus) for j in jobs]


def scale_arrivals(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """Compress (factor > 1) or stretch inter-arrival times: load scales by ``factor``."""
    return [replace(j, arrival_s=j.arrival_s / factor) for j in jobs]
