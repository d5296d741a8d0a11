"""Tiresias-like baseline (Gu et al., NSDI'19): discretised two-dimensional least attained service.

Tiresias schedules without knowing job durations.  A job's *attained service*
is two-dimensional, GPUs x seconds it has run (2D-LAS), measured by the
scheduler itself (:class:`.ledger.ServiceLedger`).  Jobs are binned into K
priority queues by thresholds on that service: a job starts in the highest
queue and is demoted each time its service crosses the next threshold
(``thresholds``, GPU-seconds; default one threshold of 18,000 GPU-s = 5
GPU-hours, i.e. two queues, the setting of the Tiresias reimplementation in
Lucid's published simulator).  Higher queues go first; within a queue jobs
are served FIFO in the order of Tiresias' own simulator (SymbioticLab/Tiresias,
``run_sim.py`` ``dlas_sim_jobs``): a job joins the back of a queue when it
arrives or is demoted into it, and after every pass the queue's waiting jobs
move behind its running ones.  So a job that backfilled is not preempted
later for a job of its own queue that was waiting first (Lucid's
reimplementation sorts by arrival instead, which preempts it: more
checkpoints, a higher average JCT).  Scheduling is preemptive over whole GPUs with
no sharing (:func:`.preemptive.priority_quota_plan`): a running job in a lower
queue is preempted for a waiting job in a higher one.  Tiresias' optional
starvation guard ("promote a job that waited longer than ``promote_factor``
times its executed time back to the highest queue") is available and off by
default, as in Lucid's reimplementation.  The policy asks the driver to wake
it when a running job crosses a threshold (``wake_at``), since demotions are
decisions no external event announces.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from elastico_extender.core.model import Job, Plan, Snapshot
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies.ledger import ServiceLedger
from elastico_extender.policies.preemptive import priority_quota_plan

__all__ = ["TiresiasPolicy"]

DEFAULT_THRESHOLDS: tuple[float, ...] = (18_000.0,)
"""GPU-seconds of attained service at which a job drops one queue (two queues)."""


class TiresiasPolicy:
    """Discretised 2D-LAS with preemption (module docstring)."""

    def __init__(
        self,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        promote_factor: float | None = None,
        settings: PlannerSettings | None = None,
        name: str = "tiresias",
    ) -> None:
        if list(thresholds) != sorted(thresholds) or any(t <= 0 for t in thresholds):
            raise ValueError("thresholds must be positive and increasing")
        self.name = name
        self.thresholds = tuple(float(t) for t in thresholds)
        self.promote_factor = promote_factor
        self.margin = (settings or PlannerSettings()).memory_margin_mib
        self.ledger = ServiceLedger()
        self._waiting_since: dict[str, float] = {}
        self._place: dict[str, tuple[int, int]] = {}  # live job -> (queue, position in it)
        self._tick = 0

    def queue_of(self, job: Job) -> int:
        """0 for the highest-priority queue; one more per threshold crossed."""
        q = bisect.bisect_right(self.thresholds, self.ledger.attained(job.id))
        if self.promote_factor is not None and q > 0 and not job.running:
            since = self._waiting_since.get(job.id, self.ledger.now)
            if self.ledger.now - since > self.promote_factor * self.ledger.executed(job.id):
                return 0
        return q

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        self.ledger.observe(snapshot)
        live = {j.id for j in snapshot.jobs}
        self._waiting_since = {k: v for k, v in self._waiting_since.items() if k in live}
        for j in snapshot.jobs:
            if j.running:
                self._waiting_since.pop(j.id, None)
            else:
                self._waiting_since.setdefault(j.id, float(snapshot.now))
        self._place = {k: v for k, v in self._place.items() if k in live}
        for j in sorted(snapshot.jobs, key=lambda j: (j.arrival_time, j.id)):
            q = self.queue_of(j)
            held = self._place.get(j.id)
            if held is None or held[0] != q:  # arrived or changed queue: joins its back
                self._enqueue(j.id, q)

        def key(j: Job) -> tuple[int, int, str]:
            return (*self._place[j.id], j.id)

        result = priority_quota_plan(snapshot, key, self.margin)
        for j in sorted((j for j in snapshot.jobs if j.id not in result.assignments), key=key):
            self._enqueue(j.id, self._place[j.id][0])  # waiting jobs behind running ones
        self.ledger.ran(result)
        self._running = {j.id: j.gpus for j in snapshot.jobs if j.id in result.assignments}
        self._pending = bool(result.queued)
        return result

    def _enqueue(self, job_id: str, queue: int) -> None:
        """Put ``job_id`` at the back of ``queue``."""
        self._tick += 1
        self._place[job_id] = (queue, self._tick)

    def wake_at(self) -> float | None:
        """When the next running job crosses a threshold, if a job waits (else None)."""
        if not getattr(self, "_pending", False):
            return None
        best = None
        for job_id, gpus in self._running.items():
            service = self.ledger.attained(job_id)
            nxt = bisect.bisect_right(self.thresholds, service)
            if nxt < len(self.thresholds):
                t = self.ledger.now + (self.thresholds[nxt] - service) / gpus
                best = t if best is None else min(best, t)
        return best
