"""Driver-side work-around for a core admission deadlock (reported to the core's owner).

Problem (core ``planner.epoch`` + ``pricing.tatonnement``): pending jobs take part
in ESP with a "wait" option.  When many similar jobs queue (e.g. 40 pending
8-GPU BERT jobs on an idle 64-GPU cluster), every price either makes *all* of
them run (over-demand) or *all* of them wait; tatonnement then returns the best
*feasible* selection, "everybody waits", and raises the warm-started prices a
little more every epoch.  Nothing is admitted although the cluster is idle
(reproduction in the simulator's report; the squeeze pass covers only 1-GPU
jobs).  Spec Algorithm 1 ends with "Admit jobs from Q if residual capacity
permits"; the core has no such pass.

:class:`ResidualAdmission` adds exactly that pass after the wrapped policy's
plan, conservatively: queued jobs (in the plan's queue order, i.e. priority
then arrival) start on *whole idle GPUs* at their default configuration (the
fastest allowed one meeting the floor), so the pass can never create a
co-location and needs no interference check.  The wrapper keeps the inner
policy's name; the simulator applies it to the ElastiCo variants unless told
not to (``--pure-core``), and the report counts how many admissions it made.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from elastico_extender.core.model import Plan, Snapshot
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies.base import Policy
from elastico_extender.policies.volcano import Ledger, assignment

__all__ = ["ResidualAdmission"]


class ResidualAdmission:
    """Wraps a policy; after its plan, admits queued jobs onto whole idle GPUs."""

    def __init__(self, inner: Policy, settings: PlannerSettings | None = None) -> None:
        self.inner = inner
        self.name = inner.name
        self.margin = (settings or PlannerSettings()).memory_margin_mib
        self.admitted = 0

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        plan = self.inner.plan(snapshot, previous)
        if not plan.queued:
            return plan
        ledger = Ledger(snapshot, self.margin)
        fams = snapshot.families
        by_id = {j.id: j for j in snapshot.jobs}
        for a in plan.assignments.values():
            job = by_id[a.job_id]
            fam = fams[job.family]
            devs = [ledger.index[r] for r in a.devices]
            ledger.add(a.job_id, devs, fam.resources[a.config_index, GPU_MEM], 1.0)
        idle = ledger.idle()
        if not idle.any():
            return plan
        assignments = dict(plan.assignments)
        queued = []
        for job_id in plan.queued:
            job = by_id[job_id]
            fam = fams[job.family]
            ok = [
                r
                for r in (job.allowed if job.allowed is not None else range(fam.size))
                if fam.throughput[r] >= job.min_throughput
                and fam.resources[r, GPU_SM] <= 1.0 + 1e-9
            ]
            devs = None
            config = -1
            if ok and idle.sum() >= job.gpus:
                config = max(ok, key=lambda r: fam.throughput[r])
                mem = float(fam.resources[config, GPU_MEM])
                devs = ledger.gang(idle & (ledger.capacity >= mem - 1e-9), job.gpus)
            if devs is None:
                queued.append(job_id)
                continue
            ledger.add(job_id, devs, float(fam.resources[config, GPU_MEM]), 1.0)
            idle[np.asarray(devs)] = False
            assignments[job_id] = assignment(job, fam, config, tuple(ledger.refs[d] for d in devs))
            self.admitted += 1
        if len(queued) == len(plan.queued):
            return plan
        stats = dict(plan.stats)
        stats["residual_admissions"] = float(len(plan.queued) - len(queued))
        return replace(plan, assignments=assignments, queued=tuple(queued), stats=stats)
