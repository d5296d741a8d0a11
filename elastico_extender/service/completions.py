"""Finished pods -> expected run times of the pods still to come (issue 14, section 1).

Length-aware queueing (``core.pricing.queueing``) and the share-or-wait rule
(``core.planner.patience``) read each job's expected run time; without one they fall
back on attained service alone.  The extender learns it the way the simulator does,
from the cluster's own finished jobs, through the same
:class:`~elastico_extender.core.duration.DurationBook`:

* **what counts**: an ElastiCo pod (one with an intent; exclusive pods are not jobs of
  a family) that reached phase ``Succeeded``, seen while the snapshot is built (every
  epoch; Kubernetes keeps finished pods until they are deleted, so a pod deleted within
  one epoch of finishing can be missed).  Its run time is from ``status.startTime`` to
  the last ``finishedAt`` of its containers; a pod without both, or whose times are
  reversed, is skipped.  Failed pods are not counted: how long a job ran before it
  crashed says little about how long the next one will run.
* **keys**: the pod's family, GPU count and namespace (the estimator's "user").
* **once per pod**: recorded uids are remembered (bounded) and the store's key is the
  uid, so a Succeeded pod listed again after a restart or a relist is not counted twice.
* **every replica records**: they all watch the same pods, so a replica that takes the
  lead already knows what finished while it followed.  With a store configured
  (``profile_store``, else ``observation_store``) completions survive a restart.
* **in the leader's checkpoint** (``service/checkpoint.py``): the completions go out
  with the loop's state (:meth:`CompletionRecorder.rows`), and a restore or refresh merges
  the checkpoint's (:meth:`CompletionRecorder.merge`), each pod once (by uid, as above),
  so replicas restarted with empty SQLite files (no persistent volume) still know the
  run times the cluster taught.
* **into the snapshot**: each pending or running job gets ``expected_duration_s`` from
  the book and ``user`` = its namespace (copies cached per job record and book
  generation, so an unchanged job costs a dictionary lookup per epoch).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any

from elastico_extender.core.duration import MAX_COMPLETIONS, CompletedJob, DurationBook
from elastico_extender.core.model import Job
from elastico_extender.errors import ProfileStoreError
from elastico_extender.profiles.completions import CompletionRow, CompletionStore
from elastico_extender.service.pods import PodJob, epoch_seconds, started_at

__all__ = ["CompletionRecorder", "finished_at"]

log = logging.getLogger(__name__)


def finished_at(pod: Mapping[str, Any]) -> float | None:
    """The last ``finishedAt`` over the pod's terminated containers (None when none)."""
    status = pod.get("status")
    statuses = status.get("containerStatuses") if isinstance(status, Mapping) else None
    if not isinstance(statuses, list):
        return None
    last = None
    for item in statuses:
        state = item.get("state") if isinstance(item, Mapping) else None
        done = state.get("terminated") if isinstance(state, Mapping) else None
        stamp = epoch_seconds(done.get("finishedAt")) if isinstance(done, Mapping) else None
        if stamp is not None and (last is None or stamp > last):
            last = stamp
    return last


def namespace_of(pod_job: PodJob) -> str:
    return pod_job.key.split("/", 1)[0]


class CompletionRecorder:
    """Records finished ElastiCo pods and dates the rest (module docstring).

    Called from the snapshot builder (one thread at a time); ``book`` and the copies
    are guarded by a lock anyway, since REST views may read ``len``."""

    def __init__(self, store: CompletionStore | None = None) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.book: DurationBook[tuple[str, float]] = DurationBook()
        """The completions learned, each tagged with its pod's uid and finish time (what
        the checkpoint sends)."""
        self.version = 0
        """Completions learned so far (the checkpoint writes when it grows)."""
        if store is not None:
            for row in store.load():
                if self._remember(row[0]):
                    self._learn(row)
        self._copies: dict[str, tuple[Job, int, Job]] = {}

    def __len__(self) -> int:
        with self._lock:
            return len(self.book)

    def _remember(self, uid: str) -> bool:
        if uid in self._seen:
            return False
        self._seen[uid] = None
        while len(self._seen) > MAX_COMPLETIONS:
            self._seen.popitem(last=False)
        return True

    def _learn(self, row: CompletionRow) -> None:
        uid, done, end = row
        if self.book.record(done, (uid, end)):  # what it ignores is not checkpointed either
            self.version += 1

    def rows(self, newest: int) -> list[CompletionRow]:
        """The ``newest`` completions the book holds, the oldest finish first (for the
        checkpoint)."""
        with self._lock:
            kept = self.book.tagged()
        rows: list[CompletionRow] = sorted(
            ((tag[0], done, tag[1]) for done, tag in kept if tag is not None),
            key=lambda row: row[2],
        )
        return rows[max(0, len(rows) - newest) :]

    def merge(self, rows: Iterable[CompletionRow]) -> int:
        """Learn the completions in ``rows`` (a checkpoint's) of pods not known yet, and
        keep them in the store; how many were new."""
        with self._lock:
            new = [row for row in rows if self._remember(row[0])]
            for row in new:
                self._learn(row)
        if new and self.store is not None:
            try:
                self.store.add_many(new)
            except ProfileStoreError as exc:  # learned in memory all the same
                log.warning("completions.store_failed", extra={"error": str(exc)})
        return len(new)

    def wants(self, uid: str, pod: Mapping[str, Any]) -> bool:
        """Whether a finished ``pod`` may teach something: it succeeded and is not known
        yet (checked before its annotations are parsed: finished pods linger)."""
        status = pod.get("status")
        if not isinstance(status, Mapping) or status.get("phase") != "Succeeded":
            return False
        with self._lock:
            return uid not in self._seen

    def saw_finished(
        self, uid: str, pod: Mapping[str, Any], pod_job: PodJob | None, ran_before: float = 0.0
    ) -> bool:
        """Record ``pod``, which :meth:`wants`, if it is an ElastiCo pod (``pod_job`` has an
        intent; None: its annotations do not parse).  ``ran_before``: seconds its job ran
        in pods ElastiCo evicted before this one (``service.succession``)."""
        if pod_job is None or pod_job.intent is None:
            with self._lock:
                self._remember(uid)  # not a job of a family: not looked at again
            return False
        start, end = started_at(pod), finished_at(pod)
        if start is None or end is None or end <= start:
            with self._lock:
                self._remember(uid)  # nothing to learn from it: not looked at again
            return False
        job = pod_job.job
        done = CompletedJob(job.family, job.gpus, ran_before + end - start, namespace_of(pod_job))
        with self._lock:
            if not self._remember(uid):
                return False
            self._learn((uid, done, end))
        if self.store is not None:
            try:
                self.store.add(uid, done, end)
            except ProfileStoreError as exc:  # learning goes on in memory
                log.warning("completions.store_failed", extra={"error": str(exc)})
        return True

    def dated(self, jobs: list[Job], pods: Mapping[str, PodJob]) -> list[Job]:
        """``jobs`` with ``expected_duration_s`` from the book and ``user`` = namespace."""
        out: list[Job] = []
        copies: dict[str, tuple[Job, int, Job]] = {}
        with self._lock:
            book = self.book
            book.refresh()
            generation = book.generation
            for job in jobs:
                cached = self._copies.get(job.id)
                if cached is not None and cached[0] is job and cached[1] == generation:
                    copies[job.id] = cached
                    out.append(cached[2])
                    continue
                pod_job = pods.get(job.id)
                user = namespace_of(pod_job) if pod_job is not None else job.user
                elastic = pod_job is not None and pod_job.intent is not None
                expected = book.expected(job.family, job.gpus, user) if elastic else 0.0
                dated = job
                if expected != job.expected_duration_s or user != job.user:
                    dated = dataclasses.replace(job, expected_duration_s=expected, user=user)
                copies[job.id] = (job, generation, dated)
                out.append(dated)
            self._copies = copies
        return out
