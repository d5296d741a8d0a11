"""GPU instances needed to serve a given mix at once (spec 5.2, "GPU instance count").

The mix is a batch of jobs that are all pending at time 0.  For each policy we
search the smallest cluster (whole nodes of 8 GPUs) on which the policy starts
every job within ``epochs`` planning epochs (running jobs fed back as running,
as the engine does).  Static whole-GPU allocation needs the sum of the jobs' GPU
counts; co-location and reshaping can need fewer.  The cluster-size search is a
binary search, which assumes that more GPUs never make a policy admit fewer jobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.policies.base import Policy
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["admits_all", "instances_needed"]


def admits_all(
    policy: Policy, mix: Sequence[TraceJob], configs: ConfigTable, gpus: int, epochs: int = 6
) -> bool:
    cluster = ClusterSpec(gpus=gpus)
    nodes = cluster.nodes()
    fams = configs.families
    peak = {n: float(f.throughput.max()) for n, f in fams.items()}
    jobs = {
        j.job_id: Job(
            id=j.job_id,
            family=j.workload,
            kind=fams[j.workload].kind,
            gpus=min(j.gpus, gpus),
            min_throughput=j.floor_frac * peak[j.workload],
            arrival_time=float(k),
        )
        for k, j in enumerate(mix)
    }
    previous = None
    for epoch in range(epochs):
        plan = policy.plan(Snapshot(nodes, tuple(jobs.values()), fams, epoch=epoch), previous)
        previous = plan
        if plan.rejected:
            return False
        for job_id, a in plan.assignments.items():
            jobs[job_id] = replace(jobs[job_id], current_config=a.config_index, devices=a.devices)
        for job_id in plan.preempted:
            jobs[job_id] = replace(jobs[job_id], current_config=None, devices=())
        if all(j.running for j in jobs.values()):
            return True
    return False


def instances_needed(
    policy: Policy, mix: Sequence[TraceJob], configs: ConfigTable, per_node: int = 8
) -> int:
    """Smallest GPU count (multiple of ``per_node``) on which ``policy`` starts the whole mix."""
    widest = max(j.gpus for j in mix)
    hi = math.ceil(sum(j.gpus for j in mix) / per_node)
    lo = max(1, math.ceil(widest / per_node))
    while not admits_all(policy, mix, configs, hi * per_node):
        hi *= 2
        if hi > 4096:
            return -1
    while lo < hi:
        mid = (lo + hi) // 2
        if admits_all(policy, mix, configs, mid * per_node):
            hi = mid
        else:
            lo = mid + 1
    return hi * per_node
