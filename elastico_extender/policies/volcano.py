"""Volcano-like baseline: static whole-GPU allocation, FIFO, default configuration.

What Volcano's default ``allocate`` action does for GPU batch jobs, reduced to
the part that matters for a GPU-sharing comparison:

* every job gets ``gpus`` whole, otherwise idle devices (no co-location, ever);
* jobs are considered in submission order (FIFO); a gang that does not fit
  now is skipped and the next one is tried (Volcano's allocate loop does not
  hold the cluster for the head of the queue), so small jobs may backfill;
* each job runs its default configuration, the fastest of its family (or the
  configuration a ``fixed`` job asked for); nothing is ever reconfigured,
  migrated or preempted;
* a gang prefers the tightest single node that holds it whole, and spreads
  over the nodes with the most free devices only when no node can.

A job whose configuration cannot fit any device, or misses its throughput
floor even alone, is rejected with a reason, as in the core planner.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from elastico_extender.core.model import (
    Action,
    Assignment,
    DeviceRef,
    Job,
    Mode,
    Plan,
    ProfileFamily,
    Snapshot,
)
from elastico_extender.core.resources import GPU_MEM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings

__all__ = ["Ledger", "VolcanoPolicy", "default_config"]


def default_config(job: Job, family: ProfileFamily) -> int:
    """The configuration a non-reshaping scheduler runs: current, fixed, or fastest allowed."""
    if job.current_config is not None and (job.running or job.mode is Mode.FIXED):
        return job.current_config
    rows = list(job.allowed) if job.allowed else list(range(family.size))
    return int(max(rows, key=lambda r: family.throughput[r]))


class Ledger:
    """Per-device tenants (job id, memory MiB, SM share) over a snapshot's GPUs."""

    def __init__(self, snapshot: Snapshot, margin_mib: float) -> None:
        self.refs: list[DeviceRef] = [(n.name, g.index) for n in snapshot.nodes for g in n.gpus]
        self.index = {r: i for i, r in enumerate(self.refs)}
        node_names = [n.name for n in snapshot.nodes]
        self.node_of = np.array([node_names.index(r[0]) for r in self.refs], dtype=np.intp)
        self.capacity = np.array(
            [g.memory_mib - margin_mib for n in snapshot.nodes for g in n.gpus]
        )
        self.mem_used = np.zeros(len(self.refs))
        self.sm_used = np.zeros(len(self.refs))
        self.tenants: list[list[str]] = [[] for _ in self.refs]

    def add(self, job_id: str, devices: Iterable[int], mem: float, sm: float) -> None:
        for d in devices:
            self.mem_used[d] += mem
            self.sm_used[d] += sm
            self.tenants[d].append(job_id)

    def idle(self) -> np.ndarray:
        return np.array([not t for t in self.tenants], dtype=bool)

    def gang(self, candidates: np.ndarray, gpus: int) -> list[int] | None:
        """``gpus`` devices among ``candidates``: tightest whole node, else most-free nodes."""
        idx = np.flatnonzero(candidates)
        if idx.size < gpus:
            return None
        counts = np.bincount(self.node_of[idx], minlength=int(self.node_of.max()) + 1)
        whole = np.flatnonzero(counts >= gpus)
        if whole.size:
            node = int(whole[np.argmin(counts[whole])])
            return [int(d) for d in idx[self.node_of[idx] == node][:gpus]]
        chosen: list[int] = []
        for node in np.argsort(-counts, kind="stable").tolist():
            if len(chosen) >= gpus or counts[node] == 0:
                break
            local = idx[self.node_of[idx] == node]
            chosen.extend(int(d) for d in local[: gpus - len(chosen)])
        return chosen if len(chosen) == gpus else None


def assignment(
    job: Job, family: ProfileFamily, config: int, devices: tuple[DeviceRef, ...]
) -> Assignment:
    if not job.devices:
        action = Action.ADMIT
    elif set(devices) != set(job.devices):
        action = Action.MIGRATE
    elif config != job.current_config:
        action = Action.RECONFIGURE
    else:
        action = Action.KEEP
    return Assignment(
        job_id=job.id,
        config_index=config,
        configuration=family.configs[config],
        devices=devices,
        memory_budget_mib=float(family.resources[config, GPU_MEM]),
        throughput=float(family.throughput[config]),
        predicted_slowdown=1.0,
        tolerance=float("inf"),
        action=action,
        estimated=bool(family.estimated[config]) if family.estimated is not None else False,
    )


def rejection(job: Job, family: ProfileFamily, config: int, largest_mib: float) -> str | None:
    if family.throughput[config] < job.min_throughput:
        return (
            f"default configuration gives {family.throughput[config]:g}, "
            f"below the floor {job.min_throughput:g}"
        )
    if family.resources[config, GPU_MEM] > largest_mib + 1e-9:
        return "default configuration does not fit any GPU"
    return None


class VolcanoPolicy:
    """Static whole-GPU FIFO allocation (see the module docstring)."""

    def __init__(self, settings: PlannerSettings | None = None, name: str = "volcano") -> None:
        self.name = name
        self.margin = (settings or PlannerSettings()).memory_margin_mib

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        snapshot.validate()
        ledger = Ledger(snapshot, self.margin)
        fams = snapshot.families
        assignments: dict[str, Assignment] = {}
        pending: list[Job] = []
        for job in snapshot.jobs:
            if job.running:
                fam = fams[job.family]
                config = default_config(job, fam)
                held = [ledger.index[r] for r in job.devices]
                ledger.add(job.id, held, fam.resources[config, GPU_MEM], 1.0)
                assignments[job.id] = assignment(job, fam, config, job.devices)
            else:
                pending.append(job)
        pending.sort(key=lambda j: (j.arrival_time, j.id))
        largest = float(ledger.capacity.max()) if ledger.capacity.size else 0.0
        queued: list[str] = []
        rejected: dict[str, str] = {}
        free = ledger.idle()
        for job in pending:
            fam = fams[job.family]
            config = default_config(job, fam)
            reason = rejection(job, fam, config, largest)
            if reason is None and job.gpus > len(ledger.refs):
                reason = f"asks for {job.gpus} GPUs, the cluster has {len(ledger.refs)}"
            if reason is not None:
                rejected[job.id] = reason
                continue
            mem = float(fam.resources[config, GPU_MEM])
            fits = free & (ledger.capacity >= mem - 1e-9)
            devs = ledger.gang(fits, job.gpus)
            if devs is None:
                queued.append(job.id)
                continue
            ledger.add(job.id, devs, mem, 1.0)
            free[devs] = False
            assignments[job.id] = assignment(job, fam, config, tuple(ledger.refs[d] for d in devs))
        busy = ~ledger.idle()
        return Plan(
            epoch=snapshot.epoch,
            prices=np.zeros(NUM_RESOURCES),
            assignments=assignments,
            queued=tuple(queued),
            rejected=rejected,
            stats={
                "gpus_allocated": float(busy.sum()) / max(len(ledger.refs), 1),
                "colocated_devices": 0.0,
            },
        )
