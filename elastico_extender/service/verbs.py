"""The per-pod extender verbs: filter, prioritize, bind, preempt.

Filter and prioritize read the published :class:`PlacementView` under the
bookings' short view lock and ask it one question per pod
(``PlacementView.answer_at``); a pod the plan has not seen gets its best
configuration at the current prices on the spot.  Filter passes a node where the
pod would share a GPU only when no node offered has idle GPUs that fit it (the
plan's own idle-first rule).  They never wait for an
epoch, except once after the node set changed (a node the scheduler names that
the cluster view has and the published view lacks: issue 12 item 2).

Bind takes the pod from the cluster view only (never from a body some filter
caller sent: item 14), books it through :meth:`Bookings.book` (the one
serialised path) and has the :class:`Actuator` write it, once per booking:
a duplicate bind waits for the first write and shares its outcome; a bind to
another node is refused and the first placement kept (item 1).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import OrderedDict, deque
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import numpy as np

from elastico_extender.annotations import PREFIX
from elastico_extender.cluster.base import BindRequest, Cluster, ClusterError
from elastico_extender.cluster.objects import pod_key
from elastico_extender.core.model import Node
from elastico_extender.core.planner import Answers, PlacementView
from elastico_extender.core.resources import GPU_MEM
from elastico_extender.errors import AnnotationError, NotLeader
from elastico_extender.service.actuator import Actuator
from elastico_extender.service.bookings import (
    AlreadyPlaced,
    Booking,
    Bookings,
    Published,
    Refused,
)
from elastico_extender.service.closures import Closures
from elastico_extender.service.loop import EpochLoop
from elastico_extender.service.pods import PodJob, PodJobs

__all__ = ["MAX_SCORE", "FilterOutcome", "HostScores", "VerbMetrics", "Verbs", "reason_label"]

log = logging.getLogger(__name__)

MAX_SCORE = 10
"""Upper end of the extender score range (kube-scheduler multiplies by weight and 10)."""
_UNRESOLVABLE = frozenset(
    {"unknown-node", "gpu-count", "no-configuration", "webhook", "closed-node"}
)
"""Rejection labels that no preemption can cure (FailedAndUnresolvableNodes)."""
SHARED_WHILE_IDLE = (
    "would share a GPU while another node offered has an idle GPU that fits "
    "(ElastiCo shares only when no idle GPU can take the pod)"
)
"""Filter's reason for a sharing node when an offered node has idle GPUs that fit; it
names no node, so the scheduler's message does not change with the node order."""
HTTP_CONFLICT = 409
ANSWER_BUDGET_BYTES = 32 << 20
"""Arrays kept by the answer cache, at most (an answer is ~60 bytes per node; callers
choose pod shapes, so the bound is in bytes, not entries)."""


class VerbMetrics(Protocol):
    def rejection(self, reason: str, count: int = 1) -> None: ...

    def bind(self, result: str) -> None: ...


@dataclass(frozen=True)
class FilterOutcome:
    passed: list[str]
    failed: dict[str, str]
    unresolvable: dict[str, str]


class HostScores(NamedTuple):
    """Prioritize's answer as arrays: ``score[k]`` (0..10) for ``names[k]``, which is
    ``nodes[at[k]]`` of the published view (``at`` -1: a node the view does not know)."""

    names: list[str]
    at: np.ndarray
    score: np.ndarray
    nodes: tuple[Node, ...]

    def pairs(self) -> list[tuple[str, int]]:
        return list(zip(self.names, self.score.tolist(), strict=True))


def reason_label(reason: str) -> str:
    """A short, bounded label for a rejection reason (metrics must not get free text)."""
    text = reason.lower()
    for needle, label in (
        ("webhook", "webhook"),
        ("annotation", "annotation"),
        (PREFIX, "annotation"),
        ("is cordoned", "closed-node"),
        ("not tolerated by the pod", "closed-node"),
        ("not in its cluster view", "unknown-node"),
        ("unknown node", "unknown-node"),
        ("idle gpu", "idle-elsewhere"),
        ("interference", "interference"),
        ("slowdown", "interference"),
        ("gpu memory", "gpu-memory"),
        ("gpu compute", "gpu-compute"),
        ("gpu(s), job needs", "gpu-count"),
        ("host cpu", "host"),
        ("configuration", "no-configuration"),
    ):
        if needle in text:
            return label
    return "other"


class Verbs:
    """filter / prioritize / bind / preempt (see the module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        pod_jobs: PodJobs,
        bookings: Bookings,
        actuator: Actuator,
        loop: EpochLoop,
        metrics: VerbMetrics,
        *,
        closures: Closures | None = None,
    ) -> None:
        self.cluster = cluster
        # Nodes closed to a pod (cordoned, tainted against it): filter and bind refuse them,
        # as kube-scheduler does and as the plan leaves them out for a pending pod.
        self.closures = closures
        self.pod_jobs = pod_jobs
        self.bookings = bookings
        self.actuator = actuator
        self.loop = loop
        self.metrics = metrics
        # Answers per pod shape while the view is unchanged (bookings.version), with
        # their size: at most answer_budget bytes in all.
        self._answer_cache: OrderedDict[Hashable, tuple[int, Answers, int]] = OrderedDict()
        self.answer_budget = ANSWER_BUDGET_BYTES
        self.answer_bytes = 0
        # (answers, node indices) -> prioritize's scores, while both objects are cached.
        self._score_cache: OrderedDict[tuple[int, int], tuple[Answers, np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        # (view nodes, names asked, distinct names, their indices): see _distinct.
        self._names_cache: deque[tuple[tuple[Node, ...], list[str], list[str], np.ndarray]] = deque(
            maxlen=4
        )

    # -- the view, fresh enough ---------------------------------------------------------
    def _view_for(self, names: list[str]) -> tuple[Published, list[str], np.ndarray]:
        """The published view, ``names`` without repeats and their indices in it;
        replanned first when the view lacks a node the cluster view has (added since
        the last epoch, or planned before the sync)."""
        pub = self.bookings.latest
        if pub is not None:
            distinct, at = self._distinct(pub.view, names)
            if pub.synced and (at >= 0).all():
                return pub, distinct, at  # the usual case: every node known
        if self._knows_more(pub, names):
            self.loop.refresh()
        pub = self.bookings.published
        distinct, at = self._distinct(pub.view, names)
        return pub, distinct, at

    def _knows_more(self, pub: Published | None, names: list[str]) -> bool:
        if pub is None:
            return True
        state = self.cluster.state
        if not pub.synced and state.is_synced:
            return True
        index = pub.view.node_index
        return any(n not in index and state.node(n) is not None for n in names)

    # -- per-pod answers ---------------------------------------------------------------
    def _answers(self, pub: Published, pj: PodJob, at: np.ndarray) -> Answers:
        """The view's answer for the pod on the nodes ``at`` (indices, -1 unknown); call
        with ``bookings.lock`` held.

        While the view is unchanged, an answer is reused for every pod of the same
        shape (what the planner sees of a job, less its id) asked about the same
        nodes or fewer: prioritize after filter, and a burst of replicas."""
        view, job = pub.view, pj.job
        held = view.holds(job.id)
        key: Hashable = (
            ("held", job.id)
            if held
            else (dataclasses.replace(job, id="", arrival_time=0.0), id(pj.family))
        )
        cached = self._answer_cache.get(key)
        known = at[at >= 0]
        version = self.bookings.version
        # A publish since the caller read ``pub``: its answers are of the old view, so
        # they neither come from nor go into the cache (kept for the new view's version).
        current = pub is self.bookings.latest
        if current and cached is not None and cached[0] == version and cached[1].asked[known].all():
            self._answer_cache.move_to_end(key)
            return cached[1]
        if not held:
            answers = view.answer_at(job, pj.family, at)
        else:
            # PlacementView skips interference screening for a job it already holds, so
            # other nodes are asked about a probe copy of the job (a fresh row in the view).
            devices = view.devices_of(job.id)
            home = devices[0][0] if devices else ""
            probe = dataclasses.replace(job, id=job.id + "#probe")
            others = at[at != view.node_index.get(home, -1)]
            answers = view.answer_at(probe, pj.family, others)
            if home in view.node_index:
                verdict = self.bookings.held_verdict(pub, pj, home, devices)
                answers = answers.with_verdict(view.node_index[home], verdict, view.table.index)
        if not current:
            return answers
        size = answer_bytes(answers)
        old = self._answer_cache.pop(key, None)
        if old is not None:
            self.answer_bytes -= old[2]
        self._answer_cache[key] = (version, answers, size)
        self.answer_bytes += size
        while self._answer_cache and (
            self.answer_bytes > self.answer_budget or len(self._answer_cache) > 256
        ):
            self.answer_bytes -= self._answer_cache.popitem(last=False)[1][2]
        return answers

    def _distinct(self, view: PlacementView, names: Iterable[str]) -> tuple[list[str], np.ndarray]:
        """``names`` without repeats (first kept), and their node indices in ``view``.

        kube-scheduler sends the same node list pod after pod (and prioritize the
        list filter passed), so the last few answers are kept per node set:
        comparing two lists of names costs a fraction of looking each name up."""
        names = names if isinstance(names, list) else list(names)
        nodes = view.nodes
        for cached in self._names_cache:
            if cached[0] is nodes and len(cached[1]) == len(names) and cached[1] == names:
                return cached[2], cached[3]
        asked = names
        at = view.indices(names)
        known = at[at >= 0]
        if known.size != at.size or (
            known.size and np.bincount(known, minlength=len(view.nodes)).max() > 1
        ):
            names = list(dict.fromkeys(names))  # unknown or repeated names: the slow path
            at = view.indices(names)
        self._names_cache.appendleft((nodes, asked, names, at))
        return names, at

    def filter(self, pod: Mapping[str, Any], names: Iterable[str]) -> FilterOutcome:
        """Which of ``names`` can take the pod now. Raises nothing for bad annotations:
        they become an unresolvable failure on every node naming the annotation."""
        names = list(names)
        try:
            pj = self.pod_jobs.get(pod)
        except AnnotationError as exc:
            names = list(dict.fromkeys(names))
            message = f"elastico: invalid annotations: {exc}"
            self.metrics.rejection("annotation", len(names))
            return FilterOutcome([], {}, {n: message for n in names})
        if pj is None:
            return FilterOutcome(list(dict.fromkeys(names)), {}, {})
        closed = self.closures.closed(pod) if self.closures is not None else {}
        pub, names, at = self._view_for(names)
        shut = np.fromiter((n in closed for n in names), bool, len(names)) if closed else None
        with self.bookings.lock:
            answers = self._answers(pub, pj, at)
            ok = np.zeros(at.size, dtype=bool)
            ok[at >= 0] = answers.feasible[at[at >= 0]]
            if shut is not None:  # kube-scheduler never binds there: no idle GPU offered
                ok &= ~shut
            # Idle GPUs first, across the nodes offered as the plan does across the cluster:
            # a node where the pod would share fails while another offers an idle fit.
            shared = ok & ~alone_on(pub.view, answers, at, pj.job.id)
            if shared.all() or not shared.any():
                shared[:] = False
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if ok.all() and not shared.any():
            return FilterOutcome(names, failed, unresolvable)
        ok &= ~shared
        passed = [n for n, good in zip(names, ok.tolist(), strict=True) if good]
        # One label and one message per distinct reason; each node only looks them up.
        seen: dict[int, tuple[dict[str, str], str, str]] = {}
        counts: dict[str, int] = {}
        note = f" (pod {pj.note})" if pj.note else ""
        for pos in np.flatnonzero(~ok).tolist():
            if shut is not None and shut[pos]:
                # one reason per node (it names the node and the taint): never preemptible
                unresolvable[names[pos]] = f"elastico: {closed[names[pos]]}"
                counts["closed-node"] = counts.get("closed-node", 0) + 1
                seen.setdefault(-4, (unresolvable, unresolvable[names[pos]], ""))  # the Event
                continue
            node = int(at[pos])
            code = -3 if shared[pos] else int(answers.reason_of[node]) if node >= 0 else -2
            hit = seen.get(code)
            if hit is None:
                reason = SHARED_WHILE_IDLE if code == -3 else answers.reason(node)
                label = reason_label(reason)
                bucket = unresolvable if label in _UNRESOLVABLE else failed
                hit = seen[code] = (bucket, f"elastico: {reason}{note}", label)
            hit[0][names[pos]] = hit[1]
            counts[hit[2]] = counts.get(hit[2], 0) + 1
        for label, count in counts.items():
            self.metrics.rejection(label, count)
        if not passed:  # nowhere to go: one Event per pod (rate-limited), not per node
            meta = pod.get("metadata") or {}
            namespace = str(meta.get("namespace") or "default")
            name, uid = str(meta.get("name", "")), str(meta.get("uid", ""))
            # only about a pod of the cluster view: the body is the caller's word
            if self._pod(namespace, name, uid) is not None:
                reasons = "; ".join(sorted({hit[1] for hit in seen.values()})[:3])
                self.actuator.refused(
                    namespace, name, uid, f"all {len(names)} nodes offered", reasons
                )
        return FilterOutcome(passed, failed, unresolvable)

    def prioritize(self, pod: Mapping[str, Any], names: Iterable[str]) -> HostScores:
        """Scores 0..10: the plan's node 10; otherwise cheaper configuration at current
        prices, less predicted slowdown and a tighter fit score higher; infeasible 0."""
        try:
            pj = self.pod_jobs.get(pod)
        except AnnotationError:
            pj = None  # filter reported it; every node scores 0
        if pj is None and self.bookings.latest is None:  # nothing to rank, no view needed
            names = list(dict.fromkeys(names))
            return HostScores(names, np.full(len(names), -1), np.zeros(len(names), np.intp), ())
        pub = self.bookings.published
        names, at = self._distinct(pub.view, names)
        if pj is None:
            return HostScores(names, at, np.zeros(at.size, dtype=np.intp), pub.view.nodes)
        with self.bookings.lock:
            answers = self._answers(pub, pj, at)
            key = (id(answers), id(at))  # both cached objects: a repeat of an earlier pod
            hit = self._score_cache.get(key)
            if hit is not None and hit[0] is answers and hit[1] is at:
                return HostScores(names, at, hit[2], pub.view.nodes)
            result = scores(pub, answers, at)
            self._score_cache[key] = (answers, at, result)
            if len(self._score_cache) > 32:
                self._score_cache.popitem(last=False)
        return HostScores(names, at, result, pub.view.nodes)

    # -- bind ----------------------------------------------------------------------------
    def _pod(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        """The pod from the cluster view: by UID when its namespace and name match, else
        by name when its UID matches (the scheduler names one pod three ways); None for a
        pod the view does not hold."""
        state = self.cluster.state
        pod = state.pod(uid) if uid else None
        if pod is not None and pod_key(pod) != f"{namespace}/{name}":
            return None  # the UID of another pod than the one named
        if pod is None:
            pod = state.pod_by_name(namespace, name)
            if pod is not None and uid and str(pod["metadata"].get("uid")) != uid:
                return None  # a same-named successor, not the pod the scheduler means
        return pod

    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Place and bind; returns '' on success or the error text for the Error field."""
        key = f"{namespace}/{name}"
        pod = self._pod(namespace, name, uid)
        if pod is None:
            self.metrics.bind("unknown-pod")
            return (
                f"pod {key} (UID {uid}) is not known to ElastiCo: not in its cluster view "
                "(yet); the scheduler will retry"
            )
        bound_to = (pod.get("spec") or {}).get("nodeName")
        if bound_to:
            if bound_to == node:
                return ""  # a retry of a bind that went through: idempotent
            self.metrics.bind("rejected")
            return f"elastico: pod {key} is already bound to {bound_to}; not binding it to {node}"
        if self.cluster.state.node(node) is None:
            # Left the cluster since the view was published (or never in it): a Binding
            # to it would be accepted and leave the pod on no node until the pod GC.
            message = (
                f"elastico: node {node} is not in its cluster view (deleted, or not yet "
                f"seen); not binding {key} to it, the scheduler will retry"
            )
            self.metrics.bind("rejected")
            self.actuator.refused(namespace, name, uid, node, message)
            return message
        try:
            pj = self.pod_jobs.get(pod)
        except (AnnotationError, ValueError) as exc:
            self.metrics.bind("invalid")
            return f"pod {key}: {exc}"
        why = self.closures.closed(pod).get(node, "") if self.closures is not None else ""
        if pj is not None and why:
            # As filter refuses it: the plan reserved nothing there, and kube-scheduler's
            # own filters would not have chosen it.
            message = f"elastico: {why}; not binding {key} to it"
            self.metrics.bind("rejected")
            self.actuator.refused(namespace, name, uid, node, message)
            return message
        if pj is None:  # neither opted in nor asking for GPUs: bound untouched
            return self._write_plain(BindRequest(namespace, name, uid or "", node))
        if self._knows_more(self.bookings.latest, [node]):
            # As filter does: no plan, one from before the sync (this process restarted
            # since the scheduler's filter), or one without the node: replan first.
            # Never under ``serial``, which the epoch's publish takes.
            self.loop.refresh()
        with self.bookings.serial:
            try:
                booking = self.bookings.book(pj, node)
            except AlreadyPlaced:
                return ""  # a retry of a bind that went through: idempotent
            except Refused as refused:
                self.metrics.bind("rejected")
                self.actuator.refused(namespace, name, uid, node, refused.message)
                return refused.message
        return self._write(pod, pj, booking)

    def _write(self, pod: Mapping[str, Any], pj: PodJob, booking: Booking) -> str:
        """Write a booking once; a duplicate waits for the first write and shares it."""
        with booking.write_lock:
            if booking.outcome is not None:
                return booking.outcome
            pub = self.bookings.published
            verdict = booking.verdict
            at = pub.view.node_index.get(verdict.node)
            node = pub.snapshot.nodes[at] if at is not None else None
            request = self.actuator.request(pod, pj, verdict, pub.plan.epoch, node)
            try:
                self.actuator.bind(request, verdict, float(pub.plan.prices[GPU_MEM]))
            except ClusterError as exc:
                return self._failed(request, booking, exc)
            if pj.note:
                log.info("bind.exclusive", extra={"pod": pj.key, "reason": pj.note})
            booking.outcome = ""
            return ""

    def _failed(self, request: BindRequest, booking: Booking, exc: ClusterError) -> str:
        """A failed write: the booking stays unless it is certain that nothing was written
        and nothing is bound (a 4xx other than 409, or a follower's own refusal)."""
        status = exc.status
        message = f"bind {request.namespace}/{request.name} to {request.node} failed: {exc}"
        if status == HTTP_CONFLICT:
            self.metrics.bind("already-bound")
            message += " (the booked placement is kept until the watch shows the pod)"
        elif isinstance(exc, NotLeader) or (status is not None and 400 <= status < 500):
            self.bookings.release(booking)
            booking.outcome = message
            self.metrics.bind("error")
        else:
            self.metrics.bind("unknown-outcome")
            message += " (outcome unknown: the booked placement is kept)"
        log.warning(
            "bind.failed",
            extra={"pod": f"{request.namespace}/{request.name}", "node": request.node,
                   "error": str(exc)},
        )  # fmt: skip
        return message

    def _write_plain(self, request: BindRequest) -> str:
        try:
            self.actuator.bind(request)
        except ClusterError as exc:
            self.metrics.bind("error")
            return f"bind {request.namespace}/{request.name} to {request.node} failed: {exc}"
        return ""

    # -- preempt -------------------------------------------------------------------------
    def victims(self, node_victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """Preempt: keep the scheduler's candidates on known nodes, only victims that
        really run there (an unknown UID would fail the scheduler's cycle)."""
        state = self.cluster.state
        kept: dict[str, list[str]] = {}
        for node, uids in node_victims.items():
            if state.node(node) is None:
                continue
            here = [
                u for u in uids if ((state.pod(u) or {}).get("spec") or {}).get("nodeName") == node
            ]
            if here and len(here) == len(uids):
                kept[node] = here
        return kept


def answer_bytes(answers: Answers) -> int:
    """The bytes an answer's own arrays hold (names and refs belong to the view)."""
    return sum(
        a.nbytes
        for a in (
            answers.asked,
            answers.feasible,
            answers.config,
            answers.devices,
            answers.slowdown,
            answers.tolerance,
            answers.score,
            answers.budget,
            answers.reason_of,
        )
    ) + sum(len(r) for r in answers.reasons)


def alone_on(view: PlacementView, answers: Answers, at: np.ndarray, job_id: str) -> np.ndarray:
    """Per node of ``at``: whether the job's answer there puts it on GPUs no other job
    holds (False where infeasible or unknown); call with the view lock."""
    alone = np.zeros(at.size, dtype=bool)
    known = np.flatnonzero(at >= 0)
    rows = answers.devices[at[known]]
    real = rows >= 0
    tenants = np.where(real, view.table.count[np.where(real, rows, 0)], 0).sum(axis=1)
    alone[known] = answers.feasible[at[known]] & (tenants == 0)
    own = view.devices_of(job_id)  # the plan's proposal: the job is its devices' tenant
    if own:
        home = np.flatnonzero(at == view.node_index.get(own[0][0], -2))
        by_itself = all(view.table.count[view.table.index[ref]] == 1 for ref in own)
        alone[home] = answers.feasible[at[home]] & by_itself
    return alone


def scores(pub: Published, answers: Answers, at: np.ndarray) -> np.ndarray:
    """0..10 per node of ``at`` (see :meth:`Verbs.prioritize`); call with the view lock."""
    ok = np.zeros(at.size, dtype=bool)
    ok[at >= 0] = answers.feasible[at[at >= 0]]
    nodes = at[ok]
    rows = answers.devices[nodes]  # (F, D) device rows, -1 past a job's devices
    real = rows >= 0
    table = pub.view.table
    left = np.where(real, table.mem_free[rows], 0.0).sum(axis=1)
    cap = np.where(real, table.memory_capacity[rows], 0.0).sum(axis=1)
    per = real.sum(axis=1)
    score = answers.score[nodes]
    slow = answers.slowdown[nodes]
    budget = answers.budget[nodes]
    count = nodes.size
    free = np.where(per > 0, (left - budget * per) / np.maximum(cap, 1.0), 0.0)
    with np.errstate(invalid="ignore"):
        keys = score + np.maximum(slow - 1.0, 0.0) + 0.1 * free
    keys[score == -math.inf] = -math.inf  # the plan's own node: always first
    finite = np.isfinite(keys)
    low, high = (keys[finite].min(), keys[finite].max()) if finite.any() else (0.0, 0.0)
    if high - low < 1e-12:
        scaled = np.full(count, MAX_SCORE - 1)
    else:
        scaled = np.rint(1 + (MAX_SCORE - 2) * (high - keys) / (high - low))
    scaled = np.where(keys == -math.inf, MAX_SCORE, np.where(finite, scaled, MAX_SCORE))
    result = np.zeros(at.size, dtype=np.intp)
    result[ok] = scaled
    return result
