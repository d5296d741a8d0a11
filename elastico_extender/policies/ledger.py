"""What a scheduler can know about job length without being told: service so far, completions.

Tiresias needs each job's *attained service* (GPUs x seconds it has run); Lucid
and ElastiCo's length-aware queueing need durations of *completed* jobs to
learn an estimate (:mod:`elastico_extender.core.duration`).  Both come from
watching snapshots over time, which is what this ledger does, so a policy never
reads the trace's true durations.

``observe(snapshot)`` credits every job that the previous plan left running
with ``gpus * (now - last_now)`` GPU-seconds, and turns every job that ran and
has left the snapshot into a :class:`CompletedJob` whose duration is the time
from its first start to the snapshot it was last missing from (the observed
run time, queueing excluded, co-location slowdowns included).  ``ran(plan)``
records which jobs run from now on.

Pure (time comes from ``Snapshot.now``) and bounded: per-job entries are
dropped when the job leaves; at most ``max_completed`` completions are kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from elastico_extender.core.duration import CompletedJob
from elastico_extender.core.model import Plan, Snapshot

__all__ = ["ServiceLedger"]


@dataclass
class _Entry:
    family: str
    gpus: int
    user: str
    attained: float = 0.0  # GPU-seconds run so far
    executed: float = 0.0  # seconds run so far
    first_start: float | None = None
    running: bool = False


class ServiceLedger:
    """Attained service per live job and the completions seen so far (module docstring)."""

    def __init__(self, max_completed: int = 20_000) -> None:
        self._jobs: dict[str, _Entry] = {}
        self._now: float | None = None
        self.completed: deque[CompletedJob] = deque(maxlen=max_completed)
        self.new_completions = 0

    def observe(self, snapshot: Snapshot) -> int:
        """Account the time since the last snapshot; returns how many jobs completed."""
        now = float(snapshot.now)
        dt = max(0.0, now - self._now) if self._now is not None else 0.0
        self._now = now
        if dt > 0:
            for e in self._jobs.values():
                if e.running:
                    e.attained += e.gpus * dt
                    e.executed += dt
        live = {j.id for j in snapshot.jobs}
        done = 0
        for job_id in [k for k in self._jobs if k not in live]:
            e = self._jobs.pop(job_id)
            if e.first_start is not None and now > e.first_start:
                self.completed.append(CompletedJob(e.family, e.gpus, now - e.first_start, e.user))
                done += 1
        for j in snapshot.jobs:
            if j.id not in self._jobs:
                self._jobs[j.id] = _Entry(j.family, j.gpus, j.user)
            e = self._jobs[j.id]
            e.running = j.running
            if j.running and e.first_start is None:
                e.first_start = now
        self.new_completions += done
        return done

    def ran(self, plan: Plan) -> None:
        """Mark the jobs ``plan`` runs (assigned) as running from this snapshot on."""
        for job_id, e in self._jobs.items():
            running = job_id in plan.assignments
            if running and e.first_start is None and self._now is not None:
                e.first_start = self._now
            e.running = running

    def seed(self, history: Iterable[CompletedJob]) -> None:
        """Completions known before the run (a cluster's history)."""
        self.completed.extend(history)
        self.new_completions += 1

    def attained(self, job_id: str) -> float:
        """GPU-seconds the job has run so far (0 for an unknown job)."""
        e = self._jobs.get(job_id)
        return e.attained if e is not None else 0.0

    def executed(self, job_id: str) -> float:
        """Seconds the job has run so far."""
        e = self._jobs.get(job_id)
        return e.executed if e is not None else 0.0

    def first_start(self, job_id: str) -> float | None:
        """When the job was first seen running (None: never, or unknown)."""
        e = self._jobs.get(job_id)
        return e.first_start if e is not None else None

    @property
    def now(self) -> float:
        return self._now or 0.0
