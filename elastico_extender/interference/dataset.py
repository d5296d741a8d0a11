"""Read pairwise co-location measurements into IAC training rows (spec 3.3.1).

The pair CSV format
-------------------

One row per measured co-location of two jobs on one GPU, the format of
Gavel's pair table (``elastico_extender/data/gavel_colocation_pairs.csv``)::

    column              required  meaning
    gpu                 yes       device type as the lab writes it (k80, v100-32gb,
                                  A100-SXM4-80GB, GeForce RTX 3090, ...; ``_gpu_key``)
    job_a, job_b        yes       job identifiers (a workload + configuration)
    solo_tput_a/_b      yes       isolated throughput T(solo), any unit > 0
    slowdown_a/_b       yes*      T(solo) / T(co-located) of each job
    colo_tput_a/_b      *         used for the slowdown when slowdown_* is empty
    model_a/_b          no        workload family (default: job id)
    batch_size_a/_b     no        micro-batch size (empty: unknown, 0 in features)
    measured            no        0 (or false) marks a pair that failed or was not run: skipped
    gpu_memory_gib      no        device memory (default: a size the GPU name gives,
                                  ``a100-80gb``, else the model's usual one, else 16)
    <feature>_a/_b      no        any per-job feature of ``features.JOB_FEATURES``
                                  (``sm_active_a``, ``fb_used_gib_b``, ``is_inference_a``,
                                  ``log10_params_a`` ...): given values override the fills

Lucid's published profile tables (a co-location table and a solo table, another layout)
are read as they are, told apart by their header: :mod:`.lucid_tables`.

An empty cell is absent; a given numeric cell must be a finite number (solo and
co-located throughputs and slowdowns > 0), else a ``PredictorError`` names the file,
line and column, so a user's measurements never feed a NaN into training.

Each measured pair gives two rows, the second with the per-job blocks swapped,
so the first 14 columns always describe the job whose slowdown is the label.
Self-pairs (two instances of one job) give two rows too.

How missing per-job features are filled (Gavel has no hardware counters)
------------------------------------------------------------------------

Every fill is deterministic and uses only solo information (never a
co-located throughput, so a test pair's label cannot leak into features):

* ``sm_active``, ``sm_occupancy``, ``dram_active`` := u, the *GPU-bound share*
  of a step, from how the job's solo throughput scales across the GPU types in
  the same file.  With step time t_g = c + w / P_g (c: host-side time, w: GPU
  work, P_g: the device's nominal FP32 peak, ``_PEAK_TFLOPS``), the slowest
  and the fastest GPU a job was measured on give c >= 0 and w >= 0, and
  u_g = (w / P_g) / t_g in [0, 1].  A job that speeds up as much as the
  hardware keeps the GPU busy (u = 1, e.g. ResNet at large batch); one that
  does not is host-bound and leaves the GPU idle (u -> 0).  Gavel gives one
  such signal, not three, so the three columns carry the same proxy; where a
  job appears on one GPU type only, u = 0.5 (unknown).
* ``tensor_active`` := 0: Gavel's jobs train in FP32; K80 and P100 have no
  tensor cores and V100's are not used by FP32 kernels.
* ``fb_used_gib`` := 0 (unknown).  Memory pressure is therefore constant on
  Gavel data and the trained model masks it out (see ``train.py``); memory
  fit stays a hard constraint of the planner.
* ``is_inference``, ``checkpointing``, ``amp`` and the inference knobs := 0:
  Gavel pairs are FP32 training jobs without activation checkpointing.
* ``log10_params`` := log10 of the family's approximate parameter count
  (``_FAMILY_PARAMS``, order-of-magnitude figures of the reference models);
  it mainly tells families apart and orders them by size.  A family the table
  lacks gets 10^7 nudged by a fixed per-family amount
  (``features.unknown_family_log10_params``), so two unknown families stay two
  (give ``log10_params_a/_b`` where the count is known).
* ``log10_throughput`` := log10(solo_tput) in the file's unit (steps/s for Gavel).
* ``micro_batch_log2`` := log2(batch_size) where the job type names one, else 0.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from elastico_extender.core.interference.features import (
    JOB_FEATURES,
    NUM_FEATURES,
    NUM_JOB_FEATURES,
    pair_features,
    unknown_family_log10_params,
)
from elastico_extender.csv_row import CsvRow, csv_header, csv_rows, open_csv
from elastico_extender.errors import PredictorError
from elastico_extender.interference.lucid_tables import (
    LUCID_PAIR_COLUMNS,
    LUCID_SOLO_COLUMNS,
    lucid_pair_records,
    lucid_solo_profiles,
    table_kind,
)
from elastico_extender.userfiles import reason

__all__ = [
    "DEFAULT_DEVICE_MEMORY_GIB",
    "PairDataset",
    "gpu_bound_share",
    "load_pairs",
    "shipped_csv",
]

# Nominal FP32 peak (TFLOP/s) per device model; only ratios between GPUs matter.
# K80 is one GK210 die (the unit Gavel schedules).  Datasheet figures.
_PEAK_TFLOPS: Mapping[str, float] = {
    "k80": 4.37,
    "p100": 9.3,
    "v100": 15.7,
    "t4": 8.1,
    "rtx2080ti": 13.4,
    "rtx3090": 35.6,
    "rtx4090": 82.6,
    "a10": 31.2,
    "a40": 37.4,
    "a100": 19.5,
    "l4": 30.3,
    "l40": 90.5,
    "l40s": 91.6,
    "h100": 67.0,
    "h200": 67.0,
}
# Device memory (GiB) of each model's common variant; a size in the name wins.
_DEVICE_MEMORY_GIB: Mapping[str, float] = {
    "k80": 12.0,
    "p100": 16.0,
    "v100": 16.0,
    "t4": 16.0,
    "rtx2080ti": 11.0,
    "rtx3090": 24.0,
    "rtx4090": 24.0,
    "a10": 24.0,
    "a40": 48.0,
    "a100": 40.0,
    "l4": 24.0,
    "l40": 48.0,
    "l40s": 48.0,
    "h100": 80.0,
    "h200": 141.0,
}
_MODELS_LONGEST_FIRST = tuple(sorted(_PEAK_TFLOPS, key=len, reverse=True))  # a100 before a10
_VENDOR_WORDS = re.compile(r"^(nvidia|geforce|tesla|quadro)+")
_MEMORY_IN_NAME = re.compile(r"(\d+)\s*gi?b\b")
DEFAULT_DEVICE_MEMORY_GIB = 16.0
_UNKNOWN_SHARE = 0.5
# Approximate parameter counts of the reference models of Gavel's and Lucid's tables
# (order of magnitude), keyed by ``_plain`` names (case, dashes and spaces ignored).
_FAMILY_PARAMS: Mapping[str, float] = {
    "a3c": 1.0e6,
    "bert": 110e6,
    "cyclegan": 28e6,
    "dcgan": 6.4e6,
    "efficientnet": 5.3e6,
    "lm": 20e6,
    "lstm": 20e6,
    "mobilenetv2": 2.3e6,
    "mobilenetv3": 5.4e6,
    "neumf": 3.0e6,
    "pointnet": 3.5e6,
    "ppo": 1.0e4,
    "recommendation": 40e6,
    "resnet18": 11.2e6,
    "resnet50": 25.6e6,
    "td3": 2.7e5,
    "transformer": 60e6,
    "vgg": 15e6,
}
_DEFAULT_PARAMS = 1.0e7
_FEATURE_INDEX = {name: i for i, name in enumerate(JOB_FEATURES)}


@dataclass(frozen=True)
class PairDataset:
    """Rows of an IAC training set, two per measured pair.

    ``x`` (n, 36) float32 in ``features.FEATURE_NAMES`` order; ``y`` (n,) the
    measured slowdown of the victim (first block); ``pair_id`` (n,) ints
    equal for every row of the same unordered job pair (on any GPU), the
    grouping for cross-validation; ``colocation_type`` (n,) 0/1/2;
    ``victim``/``partner`` job ids, ``victim_family``/``partner_family``
    workload families and ``gpu`` device names, each (n,) str arrays.
    """

    x: np.ndarray
    y: np.ndarray
    pair_id: np.ndarray
    colocation_type: np.ndarray
    victim: np.ndarray
    partner: np.ndarray
    victim_family: np.ndarray
    partner_family: np.ndarray
    gpu: np.ndarray

    def __len__(self) -> int:
        return int(self.y.shape[0])

    def subset(self, mask: np.ndarray) -> PairDataset:
        return PairDataset(*(getattr(self, f)[mask] for f in self.__dataclass_fields__))


def shipped_csv(name: str = "gavel_colocation_pairs.csv") -> Path:
    """Path of a pair CSV shipped in ``elastico_extender/data``."""
    return Path(__file__).resolve().parent.parent / "data" / name


def gpu_bound_share(solo: Mapping[str, float], gpu: str) -> float:
    """u_g = (w/P_g) / (c + w/P_g) from solo throughputs on several GPU types.

    ``solo`` maps GPU name -> solo throughput of one job.  Uses the GPUs with
    the lowest and highest nominal peak among those known; 0.5 when fewer
    than two known GPUs (or a non-positive throughput) are given.
    """
    known = {g: t for g, t in solo.items() if g in _PEAK_TFLOPS and t > 0}
    if len(known) < 2 or gpu not in known:
        return _UNKNOWN_SHARE
    slow = min(known, key=lambda g: _PEAK_TFLOPS[g])
    fast = max(known, key=lambda g: _PEAK_TFLOPS[g])
    t_slow, t_fast = 1.0 / known[slow], 1.0 / known[fast]  # seconds per step
    inv_slow, inv_fast = 1.0 / _PEAK_TFLOPS[slow], 1.0 / _PEAK_TFLOPS[fast]
    work = max(0.0, (t_slow - t_fast) / (inv_slow - inv_fast))
    host = t_slow - work * inv_slow
    if host < 0.0:  # scales at least as well as the peak: fully GPU-bound
        work, host = t_slow / inv_slow, 0.0
    gpu_time = work / _PEAK_TFLOPS[gpu]
    total = host + gpu_time
    return float(gpu_time / total) if total > 0 else _UNKNOWN_SHARE


def _plain(name: str) -> str:
    """``name`` in lower case, letters and digits only: ``ResNet-18`` is ``resnet18``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _gpu_key(gpu: str) -> str:
    """The device model a ``gpu`` cell names, as the tables above spell it: ``A100-SXM4-80GB``
    and ``NVIDIA A100 80GB PCIe`` are ``a100``, ``GeForce RTX 3090`` is ``rtx3090``; a
    model the tables lack stays itself (lower case, letters and digits only)."""
    text = _VENDOR_WORDS.sub("", _plain(gpu))
    for model in _MODELS_LONGEST_FIRST:
        if text.startswith(model):
            return model
    return text


def _device_memory_gib(gpu: str, model: str) -> float:
    """The memory a ``gpu`` cell names (``a100-80gb``: 80), else that of its ``model``
    (``_gpu_key``), else 16."""
    size = _MEMORY_IN_NAME.search(gpu.lower())
    if size is not None and 0 < int(size.group(1)) <= 1024:
        return float(size.group(1))
    return _DEVICE_MEMORY_GIB.get(model, DEFAULT_DEVICE_MEMORY_GIB)


def _slowdown(row: CsvRow, side: str) -> float | None:
    """The row's measured slowdown of ``side``: its column, else solo / co-located
    throughput; None when neither is given."""
    value = row.optional(f"slowdown_{side}")
    if value is None:
        colo = row.optional(f"colo_tput_{side}")
        if colo is None:
            return None
        if colo <= 0:
            raise row.fail(f"colo_tput_{side}", "must be > 0")
        value = _solo(row, side) / colo
    if value <= 0:
        raise row.fail(f"slowdown_{side}", "must be > 0")
    return value


def _job_block(row: CsvRow, side: str, share: float) -> np.ndarray:
    block = np.zeros(NUM_JOB_FEATURES, dtype=np.float64)
    block[0] = block[1] = block[2] = share
    family = (row.text(f"model_{side}") or row.text(f"job_{side}")).lower()
    known = _FAMILY_PARAMS.get(_plain(family))
    block[6] = (
        math.log10(known)
        if known is not None
        else unknown_family_log10_params(family, math.log10(_DEFAULT_PARAMS))
    )
    block[7] = math.log10(_solo(row, side))
    batch = row.optional(f"batch_size_{side}")
    block[8] = math.log2(batch) if batch is not None and batch >= 1 else 0.0
    for name, index in _FEATURE_INDEX.items():  # explicit columns win
        given = row.optional(f"{name}_{side}")
        if given is not None:
            block[index] = given
    return block


def _solo(row: CsvRow, side: str) -> float:
    return row.number(f"solo_tput_{side}", 0.0, math.inf, above_low=True)


_REQUIRED = {"gpu", "job_a", "job_b", "solo_tput_a", "solo_tput_b"}
_REQUIRED_BY_KIND = {
    "pairs": _REQUIRED,
    "lucid-pairs": LUCID_PAIR_COLUMNS,
    "lucid-solo": LUCID_SOLO_COLUMNS,
}


def _read_table(path: Path) -> tuple[str, list[CsvRow]]:
    """The CSV's format (``lucid_tables.table_kind``) and records; a short or long row, or
    a missing column, is a PredictorError."""
    try:
        with open_csv(path) as handle:
            reader = csv.DictReader(handle)
            fields = csv_header(path, reader)
            kind = table_kind(fields)
            missing = _REQUIRED_BY_KIND[kind] - set(fields)  # Lucid's: none, by their kind
            if missing:
                raise PredictorError(
                    f"pair CSV {path} lacks columns {sorted(missing)} (nor is it one of "
                    "Lucid's tables: model1, speed1, ... or model, speed, ...)"
                )
            rows = list(csv_rows(path, reader))
    except OSError as exc:
        raise PredictorError(f"cannot read pair CSV {path}: {reason(exc)}") from exc
    except ValueError as exc:  # a repeated column, more cells than the header, not UTF-8
        raise PredictorError(str(exc)) from None
    for row in rows:
        for column in sorted(_REQUIRED_BY_KIND[kind]):
            if row.record.get(column) is None:
                raise PredictorError(f"{row.where}: fewer cells than the header has columns")
    return kind, rows


def load_pairs(paths: Path | str | Iterable[Path | str]) -> PairDataset:
    """Read one or more pair CSVs into a :class:`PairDataset`: the project's format, or
    Lucid's co-location tables with its solo tables to fill their jobs' features
    (:mod:`.lucid_tables`), mixed in any order."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    tables: dict[str, list[CsvRow]] = {kind: [] for kind in _REQUIRED_BY_KIND}
    for path in paths:
        kind, rows = _read_table(Path(path))
        tables[kind].extend(rows)
    try:
        solo = lucid_solo_profiles(tables["lucid-solo"])
        rows = tables["pairs"] + lucid_pair_records(tables["lucid-pairs"], solo)
        return _dataset(rows)
    except ValueError as exc:  # a bad cell, named by CsvRow
        raise PredictorError(str(exc)) from None


def _dataset(rows: list[CsvRow]) -> PairDataset:
    solo: dict[str, dict[str, float]] = {}  # job -> gpu -> solo throughput
    for row in rows:  # every row's solo figure counts, measured pair or not
        for side in ("a", "b"):
            value = row.optional(f"solo_tput_{side}")
            if value is not None and value > 0:
                job, gpu = row.text(f"job_{side}"), _gpu_key(row.text("gpu"))
                solo.setdefault(job, {}).setdefault(gpu, value)

    pair_index: dict[tuple[str, str], int] = {}
    victims, partners, memories, labels, meta = [], [], [], [], []
    for row in rows:
        if not row.flag("measured", default=True):
            continue
        s_a, s_b = _slowdown(row, "a"), _slowdown(row, "b")
        if s_a is None or s_b is None:
            continue
        gpu = _gpu_key(row.text("gpu"))
        job_a, job_b = row.text("job_a"), row.text("job_b")
        block_a = _job_block(row, "a", gpu_bound_share(solo.get(job_a, {}), gpu))
        block_b = _job_block(row, "b", gpu_bound_share(solo.get(job_b, {}), gpu))
        memory = row.optional("gpu_memory_gib") or _device_memory_gib(row.text("gpu"), gpu)
        key = (min(job_a, job_b), max(job_a, job_b))
        pid = pair_index.setdefault(key, len(pair_index))
        fam_a = row.text("model_a") or job_a
        fam_b = row.text("model_b") or job_b
        for v, p, s, (jv, jp, fv, fp) in (
            (block_a, block_b, s_a, (job_a, job_b, fam_a, fam_b)),
            (block_b, block_a, s_b, (job_b, job_a, fam_b, fam_a)),
        ):
            victims.append(v)
            partners.append(p)
            memories.append(memory)
            labels.append(s)
            meta.append((pid, jv, jp, fv, fp, row.text("gpu")))

    if not labels:
        raise PredictorError("no measured pairs with slowdowns found in the pair CSV(s)")
    x = pair_features(np.array(victims), np.array(partners), np.array(memories))
    assert x.shape[1] == NUM_FEATURES
    pids, jvs, jps, fvs, fps, gpus = zip(*meta, strict=True)
    return PairDataset(
        x=x,
        y=np.asarray(labels, dtype=np.float64),
        pair_id=np.asarray(pids, dtype=np.int64),
        colocation_type=np.rint(x[:, 32]).astype(np.int64),
        victim=np.asarray(jvs),
        partner=np.asarray(jps),
        victim_family=np.asarray(fvs),
        partner_family=np.asarray(fps),
        gpu=np.asarray(gpus),
    )
