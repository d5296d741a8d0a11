"""A replacement pod continues the job of the pod ElastiCo evicted.

ElastiCo moves a running pod, or requeues it for observed harm (the closed loop),
by evicting it; its controller (a Job, a StatefulSet, a training operator) then
creates a replacement, which reaches the extender as a new pending pod with a
new uid and its own creation time.  Read as is, that pod would queue as a
newcomer: behind every job that arrived after the evicted one, and, with the
length-aware queue, in the first band again although the job already ran for
hours.  The simulator, which drives the same core, keeps a requeued job's
arrival and attained service (``sim.engine``), and the published figures rest
on that.

:class:`Succession` makes the extender agree.  When the actuator evicts a pod
it records, under the pod's controller (namespace and owner uid), the job's
arrival time and attained GPU-seconds (``Job.attained_gpu_seconds``: what
earlier pods of the job ran, plus this pod's run since ``status.startTime``).
The first pod of that controller created after the eviction (pending, or already
bound by the time the next epoch looks) claims the record; from then on, as long
as it lives, the planner sees it with the job's arrival time and attained service
(:meth:`continued`), and a completion of it counts the whole job's run time
(:meth:`ran_before`), so duration estimates are learned from jobs, not from pod
fragments.  Filter and prioritize answer per pod and do not read either.

The records travel in the leader's checkpoint of what the loop learned
(``service/checkpoint.py``; :meth:`rows`, :meth:`merge`, :attr:`version`), so a
replacement keeps its job's place across a restart of the extender or a change of
leader (the last ``period`` seconds of evictions at most are lost when a leader crashes).

A controller with several pods (a Job with ``parallelism`` > 1) hands the record
to whichever replacement comes first: they are interchangeable workers of one
job.  Bounded: at most ``capacity`` records waiting and as many claimed (least
recently touched dropped first); a record nobody claims within ``expiry_s`` is
dropped.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, NamedTuple

from elastico_extender.core.model import Job
from elastico_extender.profiles.loop_snapshot import SuccessionRow
from elastico_extender.service.pods import controller_of, created_at, started_at

__all__ = ["SUCCESSION_CAPACITY", "SUCCESSION_EXPIRY_S", "Carried", "Succession"]

log = logging.getLogger(__name__)

SUCCESSION_CAPACITY = 4096
"""Records kept waiting for a replacement, and as many claimed (each a few numbers)."""
SUCCESSION_EXPIRY_S = 3600.0
"""How long an eviction waits for its controller's replacement pod (an hour covers a
graceful termination, a checkpoint and a controller's back-off)."""
CLOCK_SKEW_S = 5.0
"""A replacement's creationTimestamp (the API server's clock) may read this much before
the eviction (the extender's clock) and still count as created after it."""


class Carried(NamedTuple):
    """What a replacement pod takes over from the pod it replaces."""

    arrival_time: float
    """When the job first arrived (the first pod's creationTimestamp), epoch seconds."""
    attained_gpu_seconds: float
    """GPU-seconds the job ran in earlier pods."""
    ran_s: float
    """Wall-clock seconds the job ran in earlier pods (its completion adds them)."""
    evicted_at: float
    """When the last of them was evicted (the extender's wall clock)."""


class Succession:
    """Evicted pods' jobs handed to their replacements (see the module docstring)."""

    def __init__(
        self, capacity: int = SUCCESSION_CAPACITY, expiry_s: float = SUCCESSION_EXPIRY_S
    ) -> None:
        self.capacity = capacity
        self.expiry_s = expiry_s
        self._waiting: OrderedDict[tuple[str, str], Carried] = OrderedDict()
        self._claimed: OrderedDict[str, Carried] = OrderedDict()  # pod uid -> its job's
        self._copies: dict[str, tuple[Job, Carried, Job]] = {}  # uid -> (given, record, copy)
        self._lock = threading.Lock()  # the actuator (bind, epoch) and the epoch's build
        self.version = 0
        """Grows whenever a record is added, claimed or dropped (the checkpoint's cue)."""

    def evicted(self, pod: Mapping[str, Any], job: Job, now: float) -> None:
        """ElastiCo evicted ``pod`` (running as ``job``) at wall-clock ``now``."""
        owner = controller_of(pod)
        if owner is None:
            return  # nothing recreates it (the actuator does not evict such pods)
        start = started_at(pod)
        ran = max(0.0, now - start) if start is not None else 0.0
        with self._lock:
            before = self._claimed.pop(job.id, None)
            arrival = before.arrival_time if before is not None else created_at(pod)
            arrival = arrival or job.arrival_time
            carried = Carried(
                arrival,
                (before.attained_gpu_seconds if before else 0.0) + job.gpus * ran,
                (before.ran_s if before else 0.0) + ran,
                now,
            )
            self._waiting[owner] = carried
            self._waiting.move_to_end(owner)
            self.version += 1
            self._trim()

    def continued(
        self, jobs: list[Job], pods: Mapping[str, Mapping[str, Any]], now: float
    ) -> list[Job]:
        """``jobs`` with each replacement pod's job carrying its predecessors' arrival and
        attained service; claims waiting records for pods of the evicted pod's controller
        created after the eviction, and forgets claimed records of pods that left
        ``pods``."""
        with self._lock:
            if not self._waiting and not self._claimed:
                return jobs
            expired = [o for o, c in self._waiting.items() if now - c.evicted_at > self.expiry_s]
            gone = [u for u in self._claimed if u not in pods]
            for owner in expired:
                del self._waiting[owner]
            for uid in gone:
                del self._claimed[uid]
            if expired or gone:
                self.version += 1
            out = []
            copies: dict[str, tuple[Job, Carried, Job]] = {}
            for job in jobs:
                carried = self._claimed.get(job.id)
                if carried is None and self._waiting:
                    carried = self._claim(job.id, pods.get(job.id))
                if carried is not None:
                    # The same job object and record as last epoch: the same copy, so the
                    # caches keyed on the job object downstream keep hitting.
                    last = self._copies.get(job.id)
                    if last is not None and last[0] is job and last[1] == carried:
                        copy = last[2]
                    else:
                        copy = dataclasses.replace(
                            job,
                            arrival_time=carried.arrival_time or job.arrival_time,
                            attained_gpu_seconds=carried.attained_gpu_seconds,
                        )
                    copies[job.id] = (job, carried, copy)
                    job = copy
                out.append(job)
            self._copies = copies
            return out

    def ran_before(self, uid: str) -> float:
        """Seconds the job of pod ``uid`` ran in earlier pods (0 for a first pod)."""
        with self._lock:
            carried = self._claimed.get(uid)
        return carried.ran_s if carried is not None else 0.0

    def rows(self) -> list[SuccessionRow]:
        """Every record as plain rows for the checkpoint, the waiting ones first."""
        with self._lock:
            waiting = [("waiting", f"{ns}/{owner}", *c) for (ns, owner), c in self._waiting.items()]
            claimed = [("claimed", uid, *c) for uid, c in self._claimed.items()]
        return [*waiting, *claimed]

    def merge(self, rows: list[SuccessionRow]) -> int:
        """Take the checkpoint's records this replica lacks (its own are newer); how many."""
        taken = 0
        with self._lock:
            claimed = {(c.arrival_time, c.evicted_at) for c in self._claimed.values()}
            for kind, key, arrival, attained, ran, evicted in rows:
                carried = Carried(arrival, attained, ran, evicted)
                if kind == "claimed" and key not in self._claimed:
                    self._claimed[key] = carried
                    taken += 1
                elif kind == "waiting" and (arrival, evicted) not in claimed:
                    ns, _, owner = key.partition("/")  # claimed here already: not again
                    if owner and (ns, owner) not in self._waiting:
                        self._waiting[(ns, owner)] = carried
                        taken += 1
            self._trim()
            if taken:
                self.version += 1
        return taken

    def _claim(self, uid: str, pod: Mapping[str, Any] | None) -> Carried | None:
        """The waiting record ``pod`` replaces, now claimed by ``uid`` (None: none)."""
        owner = controller_of(pod) if pod is not None else None
        if owner is None or pod is None or owner not in self._waiting:
            return None
        carried = self._waiting[owner]
        if created_at(pod) < carried.evicted_at - CLOCK_SKEW_S:
            return None  # a pod of that controller older than the eviction: not its replacement
        del self._waiting[owner]
        self._claimed[uid] = carried
        self.version += 1
        log.info(
            "succession.continued",
            extra={
                "pod": uid,
                "arrival": carried.arrival_time,
                "attained_gpu_s": round(carried.attained_gpu_seconds, 1),
            },
        )
        self._trim()
        return carried

    def _trim(self) -> None:
        """Hold both tables to ``capacity``, least recently added dropped (lock held)."""
        for table in (self._waiting, self._claimed):
            while len(table) > self.capacity:
                table.popitem(last=False)
