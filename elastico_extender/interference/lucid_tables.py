"""Lucid's profile tables, read as pair-CSV records: another lab's measurements as published.

Lucid (ASPLOS'23; its repository ``S-Lab-System-Group/Lucid``) publishes two tables of
single-GPU measurements of training jobs, in a format of its own:

* **co-location** (``simulation/data/colocate_info.csv``): one row per pair of jobs run
  together on one GPU; per job (suffix 1 and 2) ``model``, ``dataset``, ``gpu_num``,
  ``batchsize``, ``amp`` (0/1) and ``speed``: its throughput next to the other job
  *relative to its throughput alone* (1.0: not slowed), so its slowdown is
  ``1 / speed``; then the pair's combined ``gpu_util``, ``gmem_util`` (%) and ``gmem``
  (MiB), which describe neither job alone and are not used;
* **solo** (``simulation/analyzer/single_data.csv``): one row per job alone: ``model``,
  ``dataset``, ``batchsize``, ``amp``, ``speed`` (samples/s), ``gpu_util`` and
  ``gmem_util`` (mean nvidia-smi utilisation and memory-controller activity, %),
  ``gmem`` (peak memory used, MiB).

``load_pairs`` tells the three formats apart by their header (:func:`table_kind`), so a
user passes Lucid's files as they are, in any order, in one call (``elastico train-iac
--csv colocate_info.csv --csv single_data.csv``).  Each co-location row becomes one
record of the project's pair format (:mod:`.dataset`): job ids name model, dataset,
batch size and AMP; ``slowdown_a/_b`` are ``1 / speed``; and where the solo table has
the job, its solo throughput and its own counters fill the features the Gavel format
lacks: ``sm_active`` and ``sm_occupancy`` from ``gpu_util`` (nvidia-smi's one activity
figure stands for both), ``dram_active`` from ``gmem_util``, ``fb_used_gib`` from
``gmem``.  A job the solo table lacks keeps the loader's fills with a solo throughput of
1 (the co-location table is relative, so no unit is lost).

The tables do not name their GPU.  Rows take ``gpu`` from a ``gpu`` column where the
file has one, else :data:`LUCID_GPU`: the RTX 3090 that issue 11 names for this
campaign; the tables' largest footprint (20.5 GiB) fits its 24 GiB.

Lucid's data is under its own licence (non-commercial); nothing of it ships here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from elastico_extender.csv_row import CsvRow

__all__ = [
    "LUCID_GPU",
    "LUCID_PAIR_COLUMNS",
    "LUCID_SOLO_COLUMNS",
    "lucid_pair_records",
    "lucid_solo_profiles",
    "table_kind",
]

LUCID_GPU = "rtx3090"
"""GPU of a Lucid table without a ``gpu`` column (module doc)."""
LUCID_PAIR_COLUMNS = frozenset(
    f"{name}{side}" for name in ("model", "batchsize", "amp", "speed") for side in "12"
)
"""Columns that make a CSV a Lucid co-location table."""
LUCID_SOLO_COLUMNS = frozenset({"model", "batchsize", "amp", "speed"})
"""Columns that make a CSV (without ``LUCID_PAIR_COLUMNS``) a Lucid solo table."""
_MIB_PER_GIB = 1024.0
_MAX_GMEM_MIB = 1024 * _MIB_PER_GIB  # a TiB: far above any GPU's memory
_MAX_BATCH = 1 << 20

JobKey = tuple[str, str, int, int]
"""(model, dataset, batch size, amp): one job of a Lucid table."""


def table_kind(columns: Iterable[str]) -> str:
    """``"lucid-pairs"``, ``"lucid-solo"`` or ``"pairs"`` (the project's format) by header."""
    have = set(columns)
    if have >= LUCID_PAIR_COLUMNS:
        return "lucid-pairs"
    if have >= LUCID_SOLO_COLUMNS:
        return "lucid-solo"
    return "pairs"


def _job(row: CsvRow, suffix: str) -> JobKey:
    model = row.text(f"model{suffix}")
    if not model:
        raise row.fail(f"model{suffix}", "missing")
    batch = row.count(f"batchsize{suffix}", _MAX_BATCH)
    amp = row.flag(f"amp{suffix}", default=False)
    return (model, row.text(f"dataset{suffix}"), batch, int(amp))


def _job_id(job: JobKey) -> str:
    model, dataset, batch, amp = job
    return f"{model} ({dataset + ', ' if dataset else ''}batch {batch}{', amp' if amp else ''})"


def lucid_solo_profiles(rows: Iterable[CsvRow]) -> dict[JobKey, dict[str, float]]:
    """Per job of solo-table ``rows``: its solo throughput and the feature columns its
    counters fill (module doc); the first row of a job wins.  A bad cell is a
    ``ValueError`` naming the file, line and column."""
    profiles: dict[JobKey, dict[str, float]] = {}
    for row in rows:
        job = _job(row, "")
        values = {"solo_tput": row.number("speed", 0.0, math.inf, above_low=True)}
        util = row.optional("gpu_util")
        if util is not None:
            values["sm_active"] = values["sm_occupancy"] = _share(row, "gpu_util", util)
        dram = row.optional("gmem_util")
        if dram is not None:
            values["dram_active"] = _share(row, "gmem_util", dram)
        memory = row.optional("gmem")
        if memory is not None:
            if not 0.0 <= memory <= _MAX_GMEM_MIB:
                raise row.fail("gmem", f"must be MiB in [0, {_MAX_GMEM_MIB:.0f}]")
            values["fb_used_gib"] = memory / _MIB_PER_GIB
        profiles.setdefault(job, values)
    return profiles


def _share(row: CsvRow, column: str, percent: float) -> float:
    if not 0.0 <= percent <= 100.0:
        raise row.fail(column, "must be a percentage in [0, 100]")
    return percent / 100.0


def lucid_pair_records(
    rows: Iterable[CsvRow], solo: Mapping[JobKey, Mapping[str, float]]
) -> list[CsvRow]:
    """Co-location-table ``rows`` as records of the project's pair format (module doc),
    each still naming its own file and line; a bad cell is a ``ValueError`` naming the
    Lucid column."""
    records = []
    for row in rows:
        cells: dict[str | None, object] = {"gpu": row.text("gpu") or LUCID_GPU}
        for suffix, side in (("1", "a"), ("2", "b")):
            job = _job(row, suffix)
            speed = row.number(f"speed{suffix}", 0.0, math.inf, above_low=True)
            known = solo.get(job, {})
            cells |= {
                f"job_{side}": _job_id(job),
                f"model_{side}": job[0],
                f"batch_size_{side}": str(job[2]),
                f"amp_{side}": str(job[3]),
                f"slowdown_{side}": repr(1.0 / speed),
                f"solo_tput_{side}": repr(known.get("solo_tput", 1.0)),
            }
            cells |= {f"{name}_{side}": repr(v) for name, v in known.items() if name != "solo_tput"}
        records.append(row.derived(cells))
    return records
