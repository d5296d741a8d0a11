"""Pods as the planner sees them: one pod object -> one :class:`PodJob`.

The translation (annotations -> :class:`PodIntent` -> core :class:`Job`) is
cached per ``(uid, resourceVersion, digest of the content)`` because kube-scheduler
asks about the same pod object many times (filter, prioritize, retries).  The
content digest is in the key because a filter or prioritize body is not
authenticated: keyed by uid and resourceVersion alone (both public in ``/jobs``), a
forged body of a real pod with other annotations was cached as that pod's job, and
the planner and bind then read the forgery until the pod changed.  The cache is bounded in
entries and in bytes: it keeps no pod body, only the small records built from
it, and an invalid pod's problems as text (at most ``MAX_PROBLEM_CHARS``), so
neither an unauthenticated caller inventing UIDs nor a pod with huge invalid
annotations can grow it without limit (issue 12 items 8 and 10).  A cached
failure is raised as a *fresh* :class:`AnnotationError` every time: re-raising
one exception object would chain a new traceback onto it per retry.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from elastico_extender.annotations import DECISION_VOLUME, PodIntent, parse_intent
from elastico_extender.cluster.objects import pod_gpu_request, pod_key
from elastico_extender.core.model import Job, Mode, ProfileFamily
from elastico_extender.errors import AnnotationError
from elastico_extender.service.families import EXCLUSIVE_FAMILY, FamilyResolver

__all__ = [
    "DECISION_VOLUME",
    "MAX_PROBLEM_CHARS",
    "POD_JOB_CACHE",
    "PodJob",
    "PodJobs",
    "bounded_problems",
    "controller_of",
    "exclusive_job",
    "unmovable",
    "webhook_applied",
]

POD_JOB_CACHE = 4096
"""Pods whose translation is remembered (LRU); an entry is about 1 KB (a Job, an
intent that shares its family with every other pod of the family), or at most
``MAX_PROBLEM_CHARS`` of problem text: a few MiB in all."""
MAX_PROBLEM_CHARS = 2048
"""Problem text kept per invalid pod (the cache never holds a caller's whole value)."""

UNMUTATED_NOTE = (
    "created while the ElastiCo webhook was unavailable (no elastico-decision volume): "
    "nothing inside the pod would enforce a shared budget, so it may only take whole idle "
    "GPUs; recreate the pod to share"
)


@dataclass(frozen=True)
class PodJob:
    """A pod as the planner sees it. ``intent`` is None for a GPU pod the extender
    treats as exclusive (no opt-in, or ``note`` says why not elastic)."""

    job: Job
    family: ProfileFamily
    intent: PodIntent | None
    key: str
    note: str = ""


def created_at(pod: Mapping[str, Any]) -> float:
    """The pod's creationTimestamp as epoch seconds (0 when absent or unreadable)."""
    return epoch_seconds((pod.get("metadata") or {}).get("creationTimestamp")) or 0.0


def started_at(pod: Mapping[str, Any]) -> float | None:
    """When the pod's current run began (``status.startTime``), for attained service."""
    status = pod.get("status")
    return epoch_seconds(status.get("startTime")) if isinstance(status, Mapping) else None


def epoch_seconds(stamp: object) -> float | None:
    """An RFC 3339 timestamp as epoch seconds (None when absent or unreadable)."""
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def bounded_problems(problems: list[tuple[str, str]]) -> tuple[tuple[str, str], ...]:
    """The problems, cut to ``MAX_PROBLEM_CHARS`` of text in all."""
    kept: list[tuple[str, str]] = []
    left = MAX_PROBLEM_CHARS
    for key, message in problems:
        key, message = key[: left // 2], message[: max(left // 2, 0)]
        left -= len(key) + len(message)
        if left < 0 or not key:
            break
        kept.append((key, message))
    return tuple(kept) or (("metadata.annotations", "invalid"),)


def webhook_applied(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries the webhook's downward-API volume (issue 12 item 3)."""
    spec = pod.get("spec")
    volumes = spec.get("volumes") if isinstance(spec, Mapping) else None
    if not isinstance(volumes, list):
        return False
    return any(isinstance(v, Mapping) and v.get("name") == DECISION_VOLUME for v in volumes)


def unmovable(pod: Mapping[str, Any], intent: PodIntent | None) -> str:
    """Why ElastiCo may never evict ``pod`` to move or requeue it ('' when it may).

    The one rule for both sides: the actuator evicts only such pods, and the planner
    is told (``Job.preemptible``) so it does not count on devices that would not free.
    An eviction needs the pod's opt-in, and a controller to create the replacement, and
    none is asked of a pod being deleted already."""
    meta = pod.get("metadata")
    if isinstance(meta, Mapping) and meta.get("deletionTimestamp"):
        return "pod is being deleted (graceful termination)"
    if intent is None or not intent.migration_allowed:
        return "pod does not allow migration (elastico.io/migration: allowed)"
    if controller_of(pod) is None:
        return "no controller owns the pod, so nothing would recreate it"
    return ""


def controller_of(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(namespace, controller owner uid) of ``pod``; None without a controller."""
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        return None
    owners = meta.get("ownerReferences")
    if not isinstance(owners, list):
        return None
    for owner in owners:
        if isinstance(owner, Mapping) and owner.get("controller") and owner.get("uid"):
            return str(meta.get("namespace") or "default"), str(owner["uid"])
    return None


def exclusive_job(pod: Mapping[str, Any], uid: str, gpus: int, note: str = "") -> PodJob:
    """A pod held as whole GPUs (the :data:`EXCLUSIVE_FAMILY`), never shared, and never
    evicted (no intent: :func:`unmovable`)."""
    job = Job(
        id=uid,
        family=EXCLUSIVE_FAMILY.workload,
        gpus=gpus,
        mode=Mode.FIXED,
        arrival_time=created_at(pod),
        started_at=started_at(pod),
        preemptible=False,
    )
    return PodJob(job, EXCLUSIVE_FAMILY, None, pod_key(pod), note)


def _content_digest(pod: Mapping[str, Any]) -> bytes:
    """A digest of what a pod's translation may read: its metadata (without the
    server's field-manager bookkeeping), its spec and its start time."""
    meta = pod.get("metadata")
    if isinstance(meta, Mapping) and "managedFields" in meta:
        meta = {k: v for k, v in meta.items() if k != "managedFields"}
    status = pod.get("status")
    content = {
        "metadata": meta,
        "spec": pod.get("spec"),
        "startTime": status.get("startTime") if isinstance(status, Mapping) else None,
    }
    try:  # orjson: about ten times faster than json on a pod (this runs per filter call)
        data = orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # what orjson refuses (a key that is no string): the slow, lenient way
        data = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(data, digest_size=16).digest()


class PodJobs:
    """``pod -> PodJob | None`` with a bounded cache (see the module docstring)."""

    def __init__(
        self,
        families: FamilyResolver,
        capacity: int = POD_JOB_CACHE,
        *,
        require_webhook: bool = False,
    ) -> None:
        self.families = families
        self.require_webhook = require_webhook
        self.capacity = capacity
        self._lock = threading.Lock()
        self._cache: OrderedDict[
            tuple[str, str, bytes], PodJob | tuple[tuple[str, str], ...] | None
        ] = OrderedDict()
        # Counts forget_family calls: a job built from a family forgotten meanwhile is
        # answered once and not cached (the pod's resourceVersion does not change with it).
        self._forgets = 0

    def __len__(self) -> int:
        return len(self._cache)

    def get(self, pod: Mapping[str, Any]) -> PodJob | None:
        """The job a pod stands for; None when the extender leaves it alone (no opt-in
        and no GPU). Raises AnnotationError (every problem) or ValueError (bad pod)."""
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            raise ValueError("Pod has no metadata object")
        uid = str(meta.get("uid") or pod_key(pod))
        key = (uid, str(meta.get("resourceVersion", "")), _content_digest(pod))
        with self._lock:
            found = key in self._cache
            cached = self._cache.get(key)
            if found:
                self._cache.move_to_end(key)
            forgets = self._forgets
        if not found:
            try:
                cached = self._build(pod, uid)
            except AnnotationError as exc:
                cached = bounded_problems(exc.problems)
            with self._lock:
                if self._forgets == forgets:
                    self._cache[key] = cached
                    while len(self._cache) > self.capacity:
                        self._cache.popitem(last=False)
        if isinstance(cached, tuple):
            raise AnnotationError(list(cached))  # a fresh exception: no traceback chain
        return cached

    def forget_family(self, name: str) -> int:
        """Drop the cached jobs of family ``name`` (its profile changed); returns how many."""
        with self._lock:
            stale = [
                key
                for key, value in self._cache.items()
                if isinstance(value, PodJob) and value.family.workload == name
            ]
            for key in stale:
                del self._cache[key]
            self._forgets += 1
        return len(stale)

    def _build(self, pod: Mapping[str, Any], uid: str) -> PodJob | None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise ValueError("metadata.annotations must be an object")
        gpus = pod_gpu_request(pod)
        intent = parse_intent(annotations, self.families, self.families.unprofiled)
        if intent is None:
            return exclusive_job(pod, uid, gpus) if gpus > 0 else None
        if self.require_webhook and not webhook_applied(pod):
            return exclusive_job(pod, uid, max(gpus, 1), UNMUTATED_NOTE)
        job = Job(
            id=uid,
            family=intent.family_name,
            kind=intent.kind,
            gpus=max(gpus, 1),
            weight=intent.weight,
            min_throughput=intent.min_throughput,
            mode=intent.mode,
            allowed=intent.allowed,
            arrival_time=created_at(pod),
            started_at=started_at(pod),
            preemptible=not unmovable(pod, intent),
        )
        return PodJob(job, intent.family, intent, pod_key(pod))

    def fallback(self, pod: Mapping[str, Any], uid: str) -> PodJob | None:
        """A bound pod whose annotations no longer parse still holds its GPUs (exclusive)."""
        try:
            gpus = pod_gpu_request(pod)
        except ValueError:
            return None
        return exclusive_job(pod, uid, gpus) if gpus > 0 else None
