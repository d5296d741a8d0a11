"""Padded per-epoch arrays: every job x every configuration of its family.

Families are stacked once into (F, K_max, ...) tables.  Per-job quantities
that only depend on the family (demand, throughput) stay per family and are
read through :class:`PerJob`, which maps a job row to its family row on each
lookup: an (N, K, R) copy would cost more to build every epoch than all the
lookups of the epoch together.  Only what differs per job (validity after
user restrictions and floors) is an (N, K) array.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES
from elastico_extender.core.model import Job, Mode, Snapshot
from elastico_extender.core.planner.observed_throughput import observed_throughput
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings

__all__ = ["FamilyStack", "JobTables", "build_tables", "stack_families"]


class PerJob:
    """A per-family table read per job: ``view[rows, ...] == table[family_index[rows], ...]``.

    Supports the indexing the planner uses (a row, an array of rows, then any
    further indices) and ``shape`` as if the (N, ...) array were materialised.
    """

    __slots__ = ("family_index", "table")

    def __init__(self, table: np.ndarray, family_index: np.ndarray) -> None:
        self.table = table
        self.family_index = family_index

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.family_index), *self.table.shape[1:])

    def __getitem__(self, key: Any) -> np.ndarray:
        if isinstance(key, tuple):
            return self.table[(self.family_index[key[0]], *key[1:])]
        return self.table[self.family_index[key]]


@dataclass(eq=False)
class JobTables:
    jobs: tuple[Job, ...]
    family_names: list[str]  # (F,) workload family of each family row
    family_index: np.ndarray  # (N,)
    per_gpu: PerJob  # (N, K, R) per-GPU demand, read through the family table
    throughput: PerJob  # (N, K) T_j(c); 1.0 in padding
    valid: np.ndarray  # (N, K) bool
    default: np.ndarray  # (N,) the configuration a non-reshaped job runs
    current: np.ndarray  # (N,) current configuration or -1
    gpus: np.ndarray  # (N,)
    weight: np.ndarray  # (N,)
    floor: np.ndarray  # (N,)
    running: np.ndarray  # (N,) bool
    demand_table: np.ndarray  # (R, F, K) per-GPU demand, resource-major (for ESP)
    throughput_table: np.ndarray  # (F, K)
    smallest: np.ndarray  # (N, R) R_j^min over valid configurations (0 where none)
    narrowed: np.ndarray  # rows whose valid configurations are fewer than their family's
    real: np.ndarray  # (F, K) bool: configuration rows that exist (not padding)
    feature_table: np.ndarray  # (F, K, 14)
    estimated_table: np.ndarray  # (F, K) bool
    reasons: dict[int, str]  # row -> why no configuration is valid
    demand_family: np.ndarray  # (N,) each job's row of ``demand_table`` and ``per_gpu``'s table:
    # its family's, or its own where observation recharged its SM share (planner.observed_sm)
    rank: np.ndarray | None = None
    """(N,) queue priority: the weight scaled by the job's length band (pricing.queueing);
    None until the epoch sets it (then ``weight`` serves)."""
    service_key: np.ndarray | None = None
    """(N,) the length-aware key behind ``rank`` (expected remaining GPU-seconds, else
    attained service; ``pricing.queueing.service_keys``): within a band, shorter first.
    None when queueing is length-blind."""
    remaining: np.ndarray | None = None
    """(N,) expected remaining seconds (the age once a job outlived its estimate), the
    other half of ``service_keys``: the share-or-wait rule's (``planner.patience``).
    None when queueing is length-blind."""

    @property
    def priority(self) -> np.ndarray:
        """(N,) the queue priority every pass orders by: ``rank``, else ``weight``."""
        return self.weight if self.rank is None else self.rank

    def in_queue_order(self, rows: list[int]) -> list[int]:
        """``rows`` highest ``priority`` first, then oldest, then by row (the order the
        squeeze and the residual admission try the queue in)."""
        rank = self.priority
        return sorted(rows, key=lambda r: (-rank[r], self.jobs[r].arrival_time, r))

    def features(self, rows: np.ndarray, configs: np.ndarray) -> np.ndarray:
        return self.feature_table[self.family_index[rows], configs]


class FamilyStack(NamedTuple):
    """The snapshot's families stacked and padded to (F, K_max, ...); family row ``f``
    is ``snapshot.columns.family_names[f]``, so ``columns.family_code`` indexes it."""

    names: list[str]
    resources: np.ndarray  # (F, K, R) per-GPU demand; 0 in padding
    throughput: np.ndarray  # (F, K); 1.0 in padding
    real: np.ndarray  # (F, K) bool
    features: np.ndarray  # (F, K, NUM_JOB_FEATURES) float32
    estimated: np.ndarray  # (F, K) bool
    fastest: np.ndarray  # (F,)


def stack_families(snapshot: Snapshot) -> FamilyStack:
    names = list(snapshot.columns.family_names)
    families = [snapshot.families[n] for n in names]
    k_max = max((f.size for f in families), default=1)
    f_count = len(families)
    stack = FamilyStack(
        names,
        np.zeros((f_count, k_max, NUM_RESOURCES)),
        np.ones((f_count, k_max)),
        np.zeros((f_count, k_max), dtype=bool),
        np.zeros((f_count, k_max, NUM_JOB_FEATURES), dtype=np.float32),
        np.zeros((f_count, k_max), dtype=bool),
        np.zeros(f_count, dtype=np.intp),
    )
    for i, fam in enumerate(families):
        stack.resources[i, : fam.size] = fam.resources
        stack.throughput[i, : fam.size] = fam.throughput
        stack.real[i, : fam.size] = True
        stack.features[i, : fam.size, : fam.features.shape[1]] = fam.features[:, :NUM_JOB_FEATURES]
        stack.estimated[i, : fam.size] = fam.estimated
        stack.fastest[i] = fam.fastest_index
    return stack


def build_tables(
    snapshot: Snapshot, settings: PlannerSettings, *, whole_cluster: bool = True
) -> JobTables:
    """The epoch's job tables.  ``whole_cluster``: the snapshot's devices are the whole
    cluster (an epoch), so a gang wanting more GPUs than it has can never start; False
    for a probe whose devices only stand for the cluster's capacities (admission)."""
    jobs = snapshot.jobs
    names, res_table, tput_table, real, feat_table, est_table, fastest = stack_families(snapshot)
    if settings.observed_throughput and snapshot.solo_rates:
        tput_table = observed_throughput(names, tput_table, real, snapshot.solo_rates)
    f_count = len(names)
    k_max = real.shape[1]

    n = len(jobs)
    fam_idx = snapshot.columns.family_code
    valid = real[fam_idx]  # fancy indexing already copies
    cols = snapshot.columns
    gpus, weight, floor, current = cols.gpus, cols.weight, cols.floor, cols.current
    running = cols.held > 0

    # User restrictions (allowed knob ranges, fixed mode) and the default configuration.
    default = fastest[fam_idx] if n else np.zeros(0, dtype=np.intp)
    fixed = cols.fixed
    restricted = sorted(set(cols.restricted.tolist()) | set(np.flatnonzero(fixed).tolist()))
    for row in restricted:
        job = jobs[row]
        if job.allowed is not None:
            mask = np.zeros(k_max, dtype=bool)
            mask[list(job.allowed)] = True
            valid[row] &= mask
            if job.allowed:
                allowed = np.array(job.allowed)
                default[row] = allowed[np.argmax(tput_table[fam_idx[row], allowed])]
        if job.mode is Mode.FIXED and job.current_config is not None:
            default[row] = job.current_config
    reasons: dict[int, str] = {}
    no_allowed = ~valid.any(axis=1)
    for blocked in np.flatnonzero(no_allowed).tolist():
        reasons[blocked] = "no configuration is allowed by the job's knob ranges"

    pinned = fixed | (not settings.reshape)
    if pinned.any():
        only = np.zeros_like(valid)
        rows = np.flatnonzero(pinned)
        only[rows, default[rows]] = True
        valid = np.where(pinned[:, None], valid & only, valid)

    # Floors: T_j(c) >= L_j (spec Eq. perf_constraint); only jobs that set one.
    floored = np.flatnonzero(floor > 0)
    if floored.size:
        before = valid[floored]
        tput = tput_table[fam_idx[floored]]
        after = before & (tput >= floor[floored, None])
        valid[floored] = after
        for k in np.flatnonzero(before.any(axis=1) & ~after.any(axis=1)).tolist():
            row = int(floored[k])
            best = tput[k][before[k]].max()
            reasons[row] = (
                f"no configuration meets the throughput floor {floor[row]:g} "
                f"(best allowed: {best:g})"
            )

    # A configuration must fit on some device of the cluster (decided per family).
    cluster = snapshot.devices
    if cluster.size:
        mem_cap = float(cluster.memory_total.max()) - settings.memory_margin_mib
        with_gpus = cluster.per_node > 0
        cpu_cap = float(cluster.cpu[with_gpus].max())
        ram_cap = float(cluster.ram[with_gpus].max())
        family_fits = (
            (res_table[:, :, GPU_MEM] <= mem_cap + 1e-9)
            & (res_table[:, :, GPU_SM] <= 1.0 + 1e-9)
            & (res_table[:, :, CPU] <= cpu_cap + 1e-9)
            & (res_table[:, :, HOST_MEM] <= ram_cap + 1e-9)
        )
        if not family_fits[real].all():
            before = valid.copy()
            valid &= family_fits[fam_idx]
            for row in np.flatnonzero(before.any(axis=1) & ~valid.any(axis=1)).tolist():
                needs = res_table[fam_idx[row]][before[row]]
                reasons[row] = _unfit_reason(needs, mem_cap, cpu_cap, ram_cap)
        # A gang needs distinct GPUs: more than the cluster has never start (and take
        # no part in the prices, which its demand would raise for every other job).
        if whole_cluster:
            for row in np.flatnonzero((gpus > cluster.size) & ~running).tolist():
                if valid[row].any():
                    reasons[row] = f"asks for {int(gpus[row])} GPUs; the cluster has {cluster.size}"
                valid[row] = False
    else:
        for row in range(n):
            reasons.setdefault(row, "the cluster has no GPU devices")
        valid[:] = False

    # A running job always keeps its current configuration as a fallback.
    run_rows = np.flatnonzero(running)
    if run_rows.size:
        valid[run_rows, current[run_rows]] = True

    # R_min per job: per family where the job is unrestricted, per job otherwise.
    family_min = (
        np.where(real[:, :, None], res_table, np.inf).min(axis=1)
        if f_count
        else np.zeros((0, NUM_RESOURCES))
    )
    smallest = family_min[fam_idx] if n else np.zeros((0, NUM_RESOURCES))
    narrowed = np.flatnonzero(
        (valid.sum(axis=1) != real.sum(axis=1)[fam_idx]) if n else np.zeros(0, dtype=bool)
    )
    if narrowed.size:
        sub = np.where(valid[narrowed][:, :, None], res_table[fam_idx[narrowed]], np.inf).min(
            axis=1
        )
        smallest[narrowed] = np.where(np.isfinite(sub), sub, 0.0)
    return JobTables(
        jobs=jobs,
        family_names=names,
        family_index=fam_idx,
        per_gpu=PerJob(res_table, fam_idx),
        throughput=PerJob(tput_table, fam_idx),
        valid=valid,
        default=default,
        current=current,
        gpus=gpus,
        weight=weight,
        floor=floor,
        running=running,
        demand_table=np.ascontiguousarray(np.transpose(res_table, (2, 0, 1))),
        throughput_table=tput_table,
        smallest=smallest,
        narrowed=narrowed,
        real=real,
        feature_table=feat_table,
        estimated_table=est_table,
        reasons=reasons,
        demand_family=fam_idx,
    )


def _unfit_reason(needs: np.ndarray, mem_cap: float, cpu_cap: float, ram_cap: float) -> str:
    """Why none of a job's allowed configurations (``needs``, (C, R) per GPU) fits any
    GPU node: the resource whose smallest need exceeds the most any node offers, so an
    operator is not sent after GPU memory when the nodes lack CPU cores or host memory."""
    if needs[:, GPU_MEM].min() > mem_cap + 1e-9:
        return (
            f"no allowed configuration fits any GPU (smallest needs "
            f"{needs[:, GPU_MEM].min():.0f} MiB, largest device offers {mem_cap:.0f} MiB "
            "after the driver margin)"
        )
    if needs[:, CPU].min() > cpu_cap + 1e-9:
        return (
            f"no allowed configuration fits any GPU node's CPU (smallest needs "
            f"{needs[:, CPU].min():g} cores per GPU, largest GPU node offers {cpu_cap:g})"
        )
    if needs[:, HOST_MEM].min() > ram_cap + 1e-9:
        return (
            f"no allowed configuration fits any GPU node's host memory (smallest needs "
            f"{needs[:, HOST_MEM].min():.0f} MiB per GPU, largest GPU node offers "
            f"{ram_cap:.0f} MiB)"
        )
    return (
        "no allowed configuration fits any GPU node (GPU memory, CPU and host memory "
        f"together: at most {mem_cap:.0f} MiB per device, {cpu_cap:g} cores and "
        f"{ram_cap:.0f} MiB of host memory per node)"
    )
