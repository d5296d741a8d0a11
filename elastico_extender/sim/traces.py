"""Simulator inputs: trace jobs from a user CSV, the Philly per-VC traces, or a generator.

User trace format (``--trace path.csv``)
----------------------------------------
CSV with a header.  Required columns:

* ``arrival_time_s``  seconds since the start of the trace (any order; sorted on load)
* ``gpu_num``         GPUs the job asks for (whole GPUs, one worker per GPU)
* ``duration_s``      run time at its default configuration alone on its GPUs

Optional columns:

* ``job_id``               unique id (row number when absent)
* ``workload``             a catalog workload (``resnet50`` ... ``llama3-7b``) or a Gavel job
                           type (``'LM (batch size 20)'``, mapped by :mod:`.workloads`);
                           when absent, drawn from the synthetic mix with the run's seed
* ``min_throughput_frac``  throughput floor L_j as a fraction of the workload's peak
                           catalog throughput (0 = none); drawn when absent

Philly per-VC traces (``--trace philly:VC``)
--------------------------------------------
``philly_gavel_vc_traces.csv`` (../shared/data, README section 4): real arrival
times, GPU counts and durations of one Philly virtual cluster.  Job types come
from column ``job_type_seed0`` (Gavel's random assignment) mapped to catalog
workloads; Philly has no offline-inference jobs, so a share of the 1-GPU jobs
(``inference_share``, default 0.3, chosen by a hash of the job id so every
policy and seed sees the same ones) becomes one of the four LLM inference
workloads, keeping the spec's mixed training + inference setting.  Philly jobs
last a median of 4.6 h and up to 60 days; ``max_duration_s`` clips the tail
(default 48 h) so a run ends in reasonable simulated time, and ``window_s``
keeps only the jobs arriving in the first part of the trace.  Jobs wider than
the simulated cluster are clipped to the cluster size.

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
import zlib
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from elastico_extender.sim.workloads import (
    INFERENCE_WORKLOADS,
    TRAINING_WORKLOADS,
    workload_from_gavel,
)

__all__ = [
    "PHILLY_GPU_MIX",
    "PHILLY_VC_GPUS",
    "TraceJob",
    "default_data_dir",
    "load_csv",
    "load_philly",
    "offered_load",
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


@dataclass(frozen=True, slots=True)
class TraceJob:
    job_id: str
    arrival_s: float
    gpus: int
    duration_s: float
    workload: str
    floor_frac: float = 0.0
    user: str = ""


def default_data_dir() -> Path:
    """``../shared/data`` next to the repository (overridable with ELASTICO_DATA_DIR)."""
    import os

    env = os.environ.get("ELASTICO_DATA_DIR")
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2]
    return repo.parent / "shared" / "data"


def offered_load(jobs: list[TraceJob], gpus: int, span_s: float | None = None) -> float:
    """Offered GPU-time over the arrival span divided by cluster GPU-time."""
    if not jobs:
        return 0.0
    span = span_s or max(j.arrival_s for j in jobs) or 1.0
    return sum(j.gpus * j.duration_s for j in jobs) / (gpus * span)


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
    jobs: list[TraceJob] = []
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


def load_csv(path: Path | str, seed: int = 0) -> list[TraceJob]:
    """A user trace (format in the module docstring), sorted by arrival."""
    rng = np.random.default_rng([seed, 0xC5F])
    jobs: list[TraceJob] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        need = {"arrival_time_s", "gpu_num", "duration_s"}
        missing = need - set(reader.fieldnames or [])
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        for k, rec in enumerate(reader):
            job_id = (rec.get("job_id") or "").strip() or f"row{k:06d}"
            name = (rec.get("workload") or "").strip()
            if name:
                workload = _resolve_workload(name, job_id)
            else:
                workload = ALL_WORKLOADS[int(rng.integers(len(ALL_WORKLOADS)))]
            raw_floor = (rec.get("min_throughput_frac") or "").strip()
            floor = float(raw_floor) if raw_floor else _floor(rng)
            gpus = int(float(rec["gpu_num"]))
            if workload in INFERENCE_WORKLOADS:
                gpus = 1
            jobs.append(
                TraceJob(
                    job_id,
                    float(rec["arrival_time_s"]),
                    max(gpus, 1),
                    max(float(rec["duration_s"]), 1.0),
                    workload,
                    floor,
                )
            )
    jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
    return jobs


def load_philly(
    vc: str,
    path: Path | str | None = None,
    seed: int = 0,
    inference_share: float = 0.3,
    max_duration_s: float = 48 * 3600.0,
    window_s: float | None = None,
) -> list[TraceJob]:
    """One Philly VC's jobs with the workload mapping of the module docstring."""
    path = Path(path) if path else default_data_dir() / "philly_gavel_vc_traces.csv"
    rng = np.random.default_rng([seed, zlib.crc32(vc.encode())])
    jobs: list[TraceJob] = []
    with open(path, newline="") as handle:
        for rec in csv.DictReader(handle):
            if rec["vc"] != vc:
                continue
            arrival = float(rec["arrival_time_s"])
            if window_s is not None and arrival > window_s:
                continue
            job_id = rec["job_id"]
            gpus = int(rec["gpu_num"])
            workload = workload_from_gavel(rec["job_type_seed0"], job_id)
            h = zlib.crc32(("inf:" + job_id).encode()) / 2**32
            if gpus == 1 and h < inference_share:
                workload = INFERENCE_WORKLOADS[int(h / inference_share * 4) % 4]
            duration = min(float(rec["duration_s"]), max_duration_s)
            jobs.append(TraceJob(job_id, arrival, gpus, duration, workload, _floor(rng)))
    if not jobs:
        raise ValueError(f"no jobs for Philly VC {vc!r} in {path}")
    jobs.sort(key=lambda j: (j.arrival_s, j.job_id))
    return jobs


def fit_to_cluster(jobs: list[TraceJob], gpus: int) -> list[TraceJob]:
    """Clip gang sizes to the cluster (a job wider than the cluster could never start)."""
    return [j if j.gpus <= gpus else replace(j, gpus=gpus) for j in jobs]


def scale_arrivals(jobs: list[TraceJob], factor: float) -> list[TraceJob]:
    """Compress (factor > 1) or stretch inter-arrival times: load scales by ``factor``."""
    return [replace(j, arrival_s=j.arrival_s / factor) for j in jobs]
