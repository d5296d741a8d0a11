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
starvation guard is available and off by default, as in its simulator and in
Lucid's reimplementation: a demoted job that has waited ``promote_factor``
times as long as it ran (both counted since it last started over) goes back to
the top queue with its service counted again from zero, as Tiresias resets it.
The policy asks the driver to wake it when a running job crosses a threshold or
a waiting one is due for promotion (``wake_at``), since those are decisions no
external event announces.
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
        self._reset: dict[str, tuple[float, float, float]] = {}
        """Live job -> (time, attained GPU-s, executed s) at its last promotion."""
        self._place: dict[str, tuple[int, int]] = {}  # live job -> (queue, position in it)
        self._tick = 0
        self._running: dict[str, int] = {}  # last plan's running jobs -> GPUs
        self._waiting: tuple[str, ...] = ()  # last plan's queued and preempted jobs

    def _service(self, job_id: str) -> float:
        """GPU-seconds run since the job last started over (arrival or promotion)."""
        base = self._reset.get(job_id)
        return self.ledger.attained(job_id) - (base[1] if base else 0.0)

    def queue_of(self, job: Job) -> int:
        """0 for the highest-priority queue; one more per threshold crossed."""
        return bisect.bisect_right(self.thresholds, self._service(job.id))

    def _promotion_due(self, job_id: str) -> float | None:
        """Seconds until a demoted job that waits is due for promotion (<= 0: due), or None."""
        if self.promote_factor is None or self._service(job_id) < self.thresholds[0]:
            return None
        base = self._reset.get(job_id)
        start = base[0] if base else self.ledger.first_start(job_id)
        if start is None:
            return None
        executed = self.ledger.executed(job_id) - (base[2] if base else 0.0)
        waited = self.ledger.now - start - executed
        return self.promote_factor * executed - waited

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        ledger = self.ledger
        ledger.observe(snapshot)
        live = {j.id for j in snapshot.jobs}
        self._reset = {k: v for k, v in self._reset.items() if k in live}
        for j in snapshot.jobs:
            due = None if j.running else self._promotion_due(j.id)
            if due is not None and due <= 0:
                self._reset[j.id] = (ledger.now, ledger.attained(j.id), ledger.executed(j.id))
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
        self._waiting = result.queued + result.preempted
        return result

    def _enqueue(self, job_id: str, queue: int) -> None:
        """Put ``job_id`` at the back of ``queue``."""
        self._tick += 1
        self._place[job_id] = (queue, self._tick)

    def wake_at(self) -> float | None:
        """When the next running job crosses a threshold or a waiting one is due for
        promotion, if a job waits (else None)."""
        if not self._waiting:
            return None
        now = self.ledger.now
        times = []
        for job_id, gpus in self._running.items():
            service = self._service(job_id)
            nxt = bisect.bisect_right(self.thresholds, service)
            if nxt < len(self.thresholds):
                times.append(now + (self.thresholds[nxt] - service) / gpus)
        for job_id in self._waiting:
            due = self._promotion_due(job_id)
            if due is not None:
                times.append(now + max(due, 0.0))
        return min(times) if times else None
