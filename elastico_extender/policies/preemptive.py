"""The preemptive priority walk shared by Tiresias-like and SRTF (whole GPUs, no sharing).

Both baselines decide every epoch, over all live jobs at once: sort by the
policy's priority key, walk the list with a GPU quota equal to the cluster's
size, and keep (or start) every job whose gang still fits the quota; a running
job that falls outside the quota is preempted (checkpointed, later resumed at a
cost the simulator charges).  Selected pending jobs are then placed on idle
GPUs, consolidated on one node where possible (:func:`.volcano.gang`); a job
that the quota admits but fragmentation cannot place waits for the next epoch.
This is the structure of both schedulers in Tiresias' and Lucid's simulators.
"""

from __future__ import annotations

from collections.abc import Callable

from elastico_extender.core.model import Job, Plan, Snapshot
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.resources import GPU_MEM
from elastico_extender.policies.volcano import (
    assignment,
    default_config,
    demand,
    gang,
    rejection,
    table_plan,
)

__all__ = ["priority_quota_plan"]


def priority_quota_plan(
    snapshot: Snapshot, key: Callable[[Job], tuple[float, float, str]], margin_mib: float
) -> Plan:
    """One epoch of a preemptive whole-GPU priority scheduler (module docstring)."""
    snapshot.validate()
    table = DeviceTable(snapshot.nodes, margin_mib)
    rejected: dict[str, str] = {}
    live: list[tuple[int, Job]] = []
    for row, job in enumerate(snapshot.jobs):
        fam = snapshot.families[job.family]
        if not job.running:
            reason = rejection(job, fam, default_config(job, fam), table)
            if reason is not None:
                rejected[job.id] = reason
                continue
        live.append((row, job))
    live.sort(key=lambda p: key(p[1]))
    quota = table.size
    chosen: set[str] = set()
    for _, job in live:
        if job.gpus <= quota:
            quota -= job.gpus
            chosen.add(job.id)
    assignments = {}
    preempted: list[str] = []
    for row, job in live:
        if not job.running:
            continue
        if job.id not in chosen:
            preempted.append(job.id)
            continue
        fam = snapshot.families[job.family]
        config = default_config(job, fam)
        held = [table.index[r] for r in job.devices]
        table.place(row, held, demand(fam.resources[config, GPU_MEM], 1.0))
        assignments[job.id] = assignment(job, fam, config, job.devices)
    queued: list[str] = []
    for row, job in live:
        if job.running:
            continue
        fam = snapshot.families[job.family]
        config = default_config(job, fam)
        per_gpu = demand(fam.resources[config, GPU_MEM], 1.0)
        devs = None
        if job.id in chosen:
            devs = gang(table, (table.count == 0) & table.fits(per_gpu), job.gpus)
        if devs is None:
            queued.append(job.id)
            continue
        table.place(row, devs, per_gpu)
        assignments[job.id] = assignment(job, fam, config, tuple(table.refs[d] for d in devs))
    return table_plan(snapshot, table, assignments, queued, rejected, tuple(preempted))
