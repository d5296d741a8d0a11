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

from collections.abc import Callable

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
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.resources import GPU_MEM, GPU_SM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings

__all__ = [
    "Seat",
    "VolcanoPolicy",
    "admit_in_order",
    "assignment",
    "default_config",
    "demand",
    "gang",
    "rejection",
    "seat_running",
    "seat_whole",
    "table_plan",
]


def default_config(job: Job, family: ProfileFamily) -> int:
    """The configuration a non-reshaping scheduler runs: current, fixed, or fastest allowed."""
    if job.current_config is not None and (job.running or job.mode is Mode.FIXED):
        return job.current_config
    rows = list(job.allowed) if job.allowed else list(range(family.size))
    return int(max(rows, key=lambda r: family.throughput[r]))


def demand(mem_mib: float, sm: float) -> np.ndarray:
    """A per-GPU resource vector for :class:`DeviceTable`: device memory and SM share only.

    The baselines account what a worker takes of its GPU and nothing of its node
    (CPU, host RAM are left at 0, so the table's node checks always pass), as
    before they used the core's table.
    """
    per_gpu = np.zeros(NUM_RESOURCES)
    per_gpu[GPU_MEM] = mem_mib
    per_gpu[GPU_SM] = sm
    return per_gpu


def gang(table: DeviceTable, candidates: np.ndarray, gpus: int) -> list[int] | None:
    """``gpus`` devices among ``candidates``: tightest whole node, else most-free nodes.

    Volcano's node choice, not ElastiCo's :meth:`DeviceTable.choose`: nodes are
    ranked by how many *candidate* devices they have, and devices within a node
    are taken in index order (no memory best fit, no idle-first pass).
    """
    idx = np.flatnonzero(candidates)
    if idx.size < gpus:
        return None
    node_of = table.node_of
    counts = np.bincount(node_of[idx], minlength=int(node_of.max()) + 1)
    whole = np.flatnonzero(counts >= gpus)
    if whole.size:
        node = int(whole[np.argmin(counts[whole])])
        return [int(d) for d in idx[node_of[idx] == node][:gpus]]
    chosen: list[int] = []
    for node in np.argsort(-counts, kind="stable").tolist():
        if len(chosen) >= gpus or counts[node] == 0:
            break
        local = idx[node_of[idx] == node]
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


def rejection(job: Job, family: ProfileFamily, config: int, table: DeviceTable) -> str | None:
    """Why a non-reshaping scheduler can never run ``job`` at ``config`` here, or None."""
    if family.throughput[config] < job.min_throughput:
        return (
            f"default configuration gives {family.throughput[config]:g}, "
            f"below the floor {job.min_throughput:g}"
        )
    largest = float(table.memory_capacity.max()) if table.size else 0.0
    if family.resources[config, GPU_MEM] > largest + 1e-9:
        return "default configuration does not fit any GPU"
    if job.gpus > table.size:
        return f"asks for {job.gpus} GPUs, the cluster has {table.size}"
    return None


def seat_running(
    snapshot: Snapshot, margin_mib: float, sm_share: Callable[[Job, ProfileFamily, int], float]
) -> tuple[DeviceTable, dict[str, Assignment], list[tuple[int, Job]]]:
    """Start a baseline's epoch: running jobs stay where they are, the rest wait.

    Returns the device table with every running job placed at its default
    configuration (``sm_share`` says how much of each GPU it is charged), their
    KEEP/RECONFIGURE assignments, and the pending jobs as (snapshot row, job).
    """
    snapshot.validate()
    table = DeviceTable(snapshot.nodes, margin_mib)
    assignments: dict[str, Assignment] = {}
    pending: list[tuple[int, Job]] = []
    for row, job in enumerate(snapshot.jobs):
        if not job.running:
            pending.append((row, job))
            continue
        fam = snapshot.families[job.family]
        config = default_config(job, fam)
        held = [table.index[r] for r in job.devices]
        table.place(row, held, demand(fam.resources[config, GPU_MEM], sm_share(job, fam, config)))
        assignments[job.id] = assignment(job, fam, config, job.devices)
    return table, assignments, pending


Seat = Callable[[int, Job, ProfileFamily, int], list[int] | None]
"""A baseline's placement rule: (snapshot row, job, family, config) -> devices it placed the
job on (in the table), or None to leave it queued."""


def admit_in_order(
    snapshot: Snapshot,
    table: DeviceTable,
    pending: list[tuple[int, Job]],
    assignments: dict[str, Assignment],
    seat: Seat,
) -> Plan:
    """Offer each pending job, in the given order, its default configuration; the plan.

    Jobs that can never run are rejected with a reason; the others go to
    ``seat``, and get an ADMIT assignment where it placed them, or are queued.
    Stats: share of GPUs holding a job, devices holding two or more.
    """
    queued: list[str] = []
    rejected: dict[str, str] = {}
    for row, job in pending:
        fam = snapshot.families[job.family]
        config = default_config(job, fam)
        reason = rejection(job, fam, config, table)
        if reason is not None:
            rejected[job.id] = reason
            continue
        devs = seat(row, job, fam, config)
        if devs is None:
            queued.append(job.id)
            continue
        assignments[job.id] = assignment(job, fam, config, tuple(table.refs[d] for d in devs))
    return table_plan(snapshot, table, assignments, queued, rejected)


def table_plan(
    snapshot: Snapshot,
    table: DeviceTable,
    assignments: dict[str, Assignment],
    queued: list[str],
    rejected: dict[str, str],
    preempted: tuple[str, ...] = (),
) -> Plan:
    """A baseline's plan from its device table: no prices, and the stats every baseline
    reports (share of GPUs holding a job, devices holding two or more)."""
    return Plan(
        epoch=snapshot.epoch,
        prices=np.zeros(NUM_RESOURCES),
        assignments=assignments,
        queued=tuple(queued),
        rejected=rejected,
        preempted=preempted,
        stats={
            "gpus_allocated": float((table.count > 0).sum()) / max(table.size, 1),
            "colocated_devices": float((table.count >= 2).sum()),
        },
    )


def _whole_gpu(job: Job, family: ProfileFamily, config: int) -> float:
    return 1.0


class VolcanoPolicy:
    """Static whole-GPU FIFO allocation (see the module docstring)."""

    def __init__(self, settings: PlannerSettings | None = None, name: str = "volcano") -> None:
        self.name = name
        self.margin = (settings or PlannerSettings()).memory_margin_mib

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        table, assignments, pending = seat_running(snapshot, self.margin, _whole_gpu)
        pending.sort(key=lambda p: (p[1].arrival_time, p[1].id))

        def seat(row: int, job: Job, fam: ProfileFamily, config: int) -> list[int] | None:
            return seat_whole(table, row, job, fam, config)

        return admit_in_order(snapshot, table, pending, assignments, seat)


def seat_whole(
    table: DeviceTable, row: int, job: Job, family: ProfileFamily, config: int
) -> list[int] | None:
    """Volcano's placement: ``job.gpus`` idle GPUs with room for the job's memory and all
    of its SM (:func:`gang`), placed in ``table``; None when they are not there."""
    per_gpu = demand(family.resources[config, GPU_MEM], 1.0)
    devs = gang(table, (table.count == 0) & table.fits(per_gpu), job.gpus)
    if devs is not None:
        table.place(row, devs, per_gpu)
    return devs
