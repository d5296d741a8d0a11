"""The scheduler behind the extender: cluster view -> snapshot -> plan -> per-pod answers.

Two paths, never waiting on each other (spec 3.4, ARCHITECTURE "one core, thin edges"):

* the **epoch loop** (a background thread, every ``epoch_seconds``) turns the
  cluster view into a core :class:`Snapshot`, runs :func:`core.planner.plan`
  with the previous plan, builds a :class:`PlacementView` and publishes both;
* the **per-pod verbs** (filter, prioritize, bind) read the latest published
  view under one short lock and ask it one question per pod
  (``PlacementView.evaluate``); a pod the plan has not seen gets its best
  configuration at the current prices on the spot.

Assumed placements: bind counts its placement in the view (``assume``) before it
writes anything, and remembers it in ``_assumed`` until the watch shows the pod
bound with its decision annotations (confirmed) or ``assume_ttl_seconds`` pass.
Every new view replays the assumptions its snapshot did not contain, so two
pods never get the same GPU memory even while binds are in flight.  The API
server stays the only store: after a restart the decision annotations rebuild
every placement (``annotations.read_decision``).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np

from elastico_extender.annotations import (
    PREFIX,
    PodIntent,
    decision_annotations,
    parse_intent,
    read_decision,
)
from elastico_extender.cluster.base import BindRequest, Cluster, ClusterError
from elastico_extender.cluster.objects import (
    node_from_json,
    pod_gpu_request,
    pod_is_active,
    pod_key,
)
from elastico_extender.core.handoff import framework_settings
from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.model import (
    Action,
    Assignment,
    Job,
    Mode,
    Node,
    Plan,
    ProfileFamily,
    Snapshot,
)
from elastico_extender.core.planner import Answers, NodeVerdict, PlacementView, plan
from elastico_extender.core.resources import GPU_MEM, GPU_SM, RESOURCE_NAMES
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import AnnotationError, ElasticoError
from elastico_extender.service.families import EXCLUSIVE_FAMILY, FamilyResolver
from elastico_extender.service.settings import ServiceSettings

__all__ = ["Engine", "FilterOutcome", "HostScores", "PodJob"]

log = logging.getLogger(__name__)

MAX_SCORE = 10
"""Upper end of the extender score range (kube-scheduler multiplies by weight and 10)."""
SEEN_PODS = 4096
"""Pods remembered from filter so bind works before the watch has delivered them."""
_UNRESOLVABLE = frozenset({"unknown-node", "gpu-count", "no-configuration"})
"""Rejection labels that no preemption can cure (FailedAndUnresolvableNodes)."""


@dataclass(frozen=True)
class PodJob:
    """A pod as the planner sees it. ``intent`` is None for a GPU pod that did not opt in."""

    job: Job
    family: ProfileFamily
    intent: PodIntent | None
    key: str


@dataclass
class Assumed:
    pod_job: PodJob
    verdict: NodeVerdict
    expires: float


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


@dataclass
class Published:
    snapshot: Snapshot
    plan: Plan
    view: PlacementView
    pods: dict[str, PodJob]
    published_at: float
    epoch_ms: float
    invalid: dict[str, str]


class Metrics:
    """Hooks the engine calls; the API layer supplies Prometheus-backed ones."""

    def epoch(self, seconds: float, plan: Plan) -> None: ...

    def rejection(self, reason: str, count: int = 1) -> None: ...

    def bind(self, result: str) -> None: ...


def reason_label(reason: str) -> str:
    """A short, bounded label for a rejection reason (metrics must not get free text)."""
    text = reason.lower()
    for needle, label in (
        ("annotation", "annotation"),
        (PREFIX, "annotation"),
        ("not in its cluster view", "unknown-node"),
        ("unknown node", "unknown-node"),
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


def _created(pod: Mapping[str, Any]) -> float:
    return _stamp((pod.get("metadata") or {}).get("creationTimestamp")) or 0.0


def _started(pod: Mapping[str, Any]) -> float | None:
    """When the pod's current run began (``status.startTime``), for attained service."""
    status = pod.get("status")
    return _stamp(status.get("startTime")) if isinstance(status, Mapping) else None


def _stamp(stamp: object) -> float | None:
    if not stamp:
        return None
    try:
        return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Engine:
    def __init__(
        self,
        settings: ServiceSettings,
        cluster: Cluster,
        *,
        planner_settings: PlannerSettings | None = None,
        predictor: SlowdownPredictor | None = None,
        predictor_degraded: str | None = None,
        families: FamilyResolver | None = None,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.planner_settings = planner_settings or PlannerSettings()
        self.predictor = predictor
        self.predictor_name = getattr(predictor, "name", "contention-heuristic")
        self.predictor_degraded = predictor_degraded
        self.families = families or FamilyResolver(settings.default_gpu_memory_mib)
        self.metrics = metrics or Metrics()
        self.clock = clock
        self._lock = threading.Lock()
        self._assumed: dict[str, Assumed] = {}
        self._seen: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._evicted: OrderedDict[str, None] = OrderedDict()  # pods evicted to move them
        self._node_cache: dict[str, tuple[str, Node | None]] = {}
        self._last_nodes: tuple[Node, ...] = ()
        self._nodes_generation = -1  # the cluster view's node generation _last_nodes is of
        # Bound pods' running records from the last snapshot, by pod uid, with what
        # they were built from: (Pod object, PodJob, Node, running Job).
        self._bound_jobs: dict[str, tuple[dict[str, Any], PodJob, Node, Job]] = {}
        self._intent_cache: OrderedDict[tuple[str, str], PodJob | AnnotationError | None] = (
            OrderedDict()
        )
        self._epoch = 0
        self._version = 0  # bumps whenever the view changes (publish, assume, forget)
        self._answer_cache: OrderedDict[Hashable, tuple[int, Answers]] = OrderedDict()
        # (answers, node indices) -> prioritize's scores, while both objects are cached.
        self._score_cache: OrderedDict[tuple[int, int], tuple[Answers, np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        # (view nodes, names asked, distinct names, their indices): see _distinct.
        self._names_cache: deque[tuple[tuple[Node, ...], list[str], list[str], np.ndarray]] = deque(
            maxlen=4
        )
        self._published: Published | None = None
        self.history: deque[dict[str, Any]] = deque(maxlen=settings.price_history)
        self.last_epoch_error: str | None = None
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Called in the epoch thread after each published epoch (serve adds the
        # garbage-collector policy of service.gc_policy).
        self.after_epoch: list[Callable[[], None]] = []

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        """Plan once now (so the first pod has a view), then every ``epoch_seconds``."""
        self.run_epoch()
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="elastico-epoch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def trigger(self) -> None:
        """Run the next epoch now instead of at the end of the interval."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.settings.epoch_seconds)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_epoch()
                for hook in self.after_epoch:
                    hook()
            except Exception:  # the loop must survive anything; the error is reported
                log.exception("epoch.failed")

    @property
    def has_plan(self) -> bool:
        return self._published is not None

    @property
    def ready(self) -> bool:
        return self._published is not None and self.cluster.state.is_synced

    # -- pods -> jobs ----------------------------------------------------------------
    def pod_job(self, pod: Mapping[str, Any]) -> PodJob | None:
        """The job a pod stands for; None when the extender leaves it alone (no opt-in
        and no GPU). Raises AnnotationError (every problem) or ValueError (bad pod)."""
        meta = pod.get("metadata")
        if not isinstance(meta, Mapping):
            raise ValueError("Pod has no metadata object")
        uid = str(meta.get("uid") or pod_key(pod))
        key = (uid, str(meta.get("resourceVersion", "")))
        cached = self._intent_cache.get(key)
        if cached is None and key not in self._intent_cache:
            try:
                cached = self._build_pod_job(pod, uid)
            except AnnotationError as exc:
                cached = exc
            self._intent_cache[key] = cached
            if len(self._intent_cache) > 4 * SEEN_PODS:
                self._intent_cache.popitem(last=False)
        if isinstance(cached, AnnotationError):
            raise cached
        return cached

    def _build_pod_job(self, pod: Mapping[str, Any], uid: str) -> PodJob | None:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        if not isinstance(annotations, Mapping):
            raise ValueError("metadata.annotations must be an object")
        gpus = pod_gpu_request(pod)
        intent = parse_intent(annotations, self.families)
        if intent is None:
            if gpus <= 0:
                return None
            job = Job(
                id=uid,
                family=EXCLUSIVE_FAMILY.workload,
                gpus=gpus,
                mode=Mode.FIXED,
                arrival_time=_created(pod),
            )
            return PodJob(job, EXCLUSIVE_FAMILY, None, pod_key(pod))
        job = Job(
            id=uid,
            family=intent.family_name,
            kind=intent.kind,
            gpus=max(gpus, 1),
            weight=intent.weight,
            min_throughput=intent.min_throughput,
            mode=intent.mode,
            allowed=intent.allowed,
            arrival_time=_created(pod),
            started_at=_started(pod),
        )
        return PodJob(job, intent.family, intent, pod_key(pod))

    def remember(self, pod: Mapping[str, Any]) -> None:
        """Keep a pod seen in filter, so bind can run before the watch delivers it."""
        meta = pod.get("metadata") or {}
        uid = meta.get("uid")
        if uid:
            self._seen[str(uid)] = dict(pod)
            self._seen.move_to_end(str(uid))
            if len(self._seen) > SEEN_PODS:
                self._seen.popitem(last=False)

    # -- snapshot + epoch ---------------------------------------------------------
    def _nodes(self) -> tuple[Node, ...]:
        """The cluster's nodes as the planner sees them.

        While no node changes what the planner sees, the same tuple of the same
        objects comes back (a status heartbeat bumps a node's resourceVersion but
        parses to an equal Node), so the core's per-cluster device index is built
        once, not every epoch."""
        generation = self.cluster.state.node_generation
        if generation == self._nodes_generation:
            return self._last_nodes  # no node event since the last call
        nodes = []
        for name, obj in sorted(self.cluster.state.nodes().items()):
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            cached = self._node_cache.get(name)
            if cached is None or cached[0] != rv:
                try:
                    parsed: Node | None = node_from_json(obj, self.settings.default_gpu_memory_mib)
                except ValueError as exc:
                    log.warning("node.unreadable", extra={"node": name, "error": str(exc)})
                    parsed = None
                if cached is not None and parsed is not None and parsed == cached[1]:
                    parsed = cached[1]  # unchanged for the planner: keep the object
                cached = (rv, parsed)
                self._node_cache[name] = cached
            if cached[1] is not None:
                nodes.append(cached[1])
        self._nodes_generation = generation
        last = self._last_nodes
        if len(last) == len(nodes) and all(a is b for a, b in zip(last, nodes, strict=True)):
            return last
        self._last_nodes = tuple(nodes)
        return self._last_nodes

    def build_snapshot(self) -> tuple[Snapshot, dict[str, PodJob], set[str], dict[str, str]]:
        """The planner's input from the cluster view plus in-flight binds.

        Returns the snapshot, pod jobs by id, the assumed ids it contains and the
        pods whose annotations are invalid (id -> message, shown by GET /jobs)."""
        nodes = self._nodes()
        by_name = {n.name: n for n in nodes}
        now = self.clock()
        with self._lock:
            assumed = dict(self._assumed)
        pods = self.cluster.state.pods()
        jobs: list[Job] = []
        meta: dict[str, PodJob] = {}
        used: dict[str, set[int]] = {}
        deferred: list[tuple[PodJob, str, int]] = []
        confirmed: set[str] = set()
        in_snapshot: set[str] = set()
        invalid: dict[str, str] = {}
        bound: dict[str, tuple[dict[str, Any], PodJob, Node, Job]] = {}
        wanted = self.settings.scheduler_name
        previous = self._bound_jobs
        for uid, pod in pods.items():
            # A bound pod whose object and node are the ones of the last epoch: the same
            # record (the cluster view replaces objects, never edits them; a node
            # heartbeat keeps the Node object: see _nodes).  Most pods, most epochs.
            hit = previous.get(uid)
            if hit is not None and hit[0] is pod and by_name.get(hit[3].devices[0][0]) is hit[2]:
                bound[uid] = hit  # confirmed too (bound with its decision)
                jobs.append(hit[3])
                meta[uid] = hit[1]
                continue
            if not pod_is_active(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            try:
                pj = self.pod_job(pod)
            except AnnotationError as exc:
                invalid[uid] = str(exc)
                pj = self._exclusive_fallback(pod, uid) if node_name else None
            except ValueError as exc:
                invalid[uid] = str(exc)
                continue
            if pj is None:
                continue
            job, family = pj.job, pj.family
            if node_name:
                node = by_name.get(node_name)
                if node is None:
                    continue
                confirmed.add(uid)
                decision = read_decision((pod.get("metadata") or {}).get("annotations"))
                config = self._config_row(family, pj, decision.configuration if decision else "")
                indices = {g.index for g in node.gpus}
                devices = None
                if (
                    decision is not None
                    and decision.node == node_name
                    and len(decision.devices) == job.gpus
                    and all(d in indices for d in decision.devices)
                ):
                    devices = decision.devices
                    running = self._running(job, node_name, devices, config)
                    if uid not in invalid:  # an invalid pod is reported again every epoch
                        bound[uid] = (pod, pj, node, running)
                    jobs.append(running)
                    meta[uid] = pj
                    continue
                if uid in assumed and assumed[uid].verdict.node == node_name:
                    devices = tuple(d for _, d in assumed[uid].verdict.devices)
                    config = assumed[uid].verdict.config_index
                if devices is None:
                    deferred.append((pj, node_name, config))
                    continue
                jobs.append(self._running(job, node_name, devices, config))
                meta[uid] = pj
            elif uid in assumed:
                a = assumed[uid]
                jobs.append(
                    dataclasses.replace(
                        job, devices=a.verdict.devices, current_config=a.verdict.config_index
                    )
                )
                in_snapshot.add(uid)
                meta[uid] = pj
            elif not wanted or (pod.get("spec") or {}).get("schedulerName") == wanted:
                jobs.append(job)
                meta[uid] = pj
        for uid, a in assumed.items():  # bound by us, not yet seen by the watch
            if uid in meta or uid in confirmed or uid in bound or a.verdict.node not in by_name:
                continue
            jobs.append(
                dataclasses.replace(
                    a.pod_job.job, devices=a.verdict.devices, current_config=a.verdict.config_index
                )
            )
            in_snapshot.add(uid)
            meta[uid] = a.pod_job
        if deferred:
            for placed in jobs:
                for ref_node, device in placed.devices:
                    used.setdefault(ref_node, set()).add(device)
        for pj, node_name, config in deferred:  # bound elsewhere: lowest free devices
            node = by_name[node_name]
            taken = used.setdefault(node_name, set())
            free = [g.index for g in node.gpus if g.index not in taken]
            pool = free + [g.index for g in node.gpus if g.index in taken]
            devices = tuple(pool[: pj.job.gpus])
            if len(devices) < pj.job.gpus:
                continue
            taken.update(devices)
            jobs.append(self._running(pj.job, node_name, devices, config))
            meta[pj.job.id] = pj
        with self._lock:
            for uid, a in list(self._assumed.items()):
                if uid in confirmed or uid in bound:
                    del self._assumed[uid]
                elif a.expires <= now:
                    log.info("assumption.expired", extra={"pod": a.pod_job.key})
                    del self._assumed[uid]
        self._bound_jobs = bound
        families = {j.family: meta[j.id].family for j in jobs}
        self._epoch += 1
        # Wall clock, the clock of the pods' timestamps (arrival, start: attained service).
        snapshot = Snapshot(nodes, tuple(jobs), families, epoch=self._epoch, now=time.time())
        return snapshot, meta, in_snapshot, invalid

    def _exclusive_fallback(self, pod: Mapping[str, Any], uid: str) -> PodJob | None:
        """A bound pod with annotations that no longer parse still holds its GPUs."""
        try:
            gpus = pod_gpu_request(pod)
        except ValueError:
            return None
        if gpus <= 0:
            return None
        job = Job(id=uid, family=EXCLUSIVE_FAMILY.workload, gpus=gpus, mode=Mode.FIXED)
        return PodJob(job, EXCLUSIVE_FAMILY, None, pod_key(pod))

    @staticmethod
    def _config_row(family: ProfileFamily, pj: PodJob, label: str) -> int:
        if label:
            for i, config in enumerate(family.configs):
                if config.label == label:
                    return i
        allowed = pj.job.allowed
        if allowed:
            return max(allowed, key=lambda r: float(family.throughput[r]))
        return family.fastest_index

    @staticmethod
    def _running(job: Job, node: str, devices: tuple[int, ...], config: int) -> Job:
        refs = tuple((node, d) for d in devices)
        allowed = job.allowed
        if allowed is not None and config not in allowed:
            allowed = (*allowed, config)
        return dataclasses.replace(job, devices=refs, current_config=config, allowed=allowed)

    def run_epoch(self) -> Plan:
        """One PDS epoch over the current view; publishes the plan and a fresh view."""
        started = time.perf_counter()
        snapshot, meta, in_snapshot, invalid = self.build_snapshot()
        previous = self._published.plan if self._published else None
        try:
            new_plan = plan(
                snapshot,
                previous,
                settings=self.planner_settings,
                predictor=self.predictor,
                timer=time.perf_counter,
            )
        except ElasticoError as exc:
            self.last_epoch_error = str(exc)
            log.error("epoch.invalid", extra={"error": str(exc)})
            raise
        view = PlacementView(snapshot, new_plan, self.planner_settings, self.predictor)
        elapsed = time.perf_counter() - started
        with self._lock:
            for uid, a in self._assumed.items():
                if uid in in_snapshot:
                    continue
                if view.holds(uid):
                    view.forget(uid)
                try:
                    view.assume(a.pod_job.job, a.pod_job.family, a.verdict)
                except ValueError as exc:
                    log.warning(
                        "assumption.replay", extra={"pod": a.pod_job.key, "error": str(exc)}
                    )
            self._published = Published(
                snapshot, new_plan, view, meta, time.time(), elapsed * 1000.0, invalid
            )
            self._version += 1
        self.last_epoch_error = None
        self._apply_reconfigurations(new_plan, meta)
        self.history.append(
            {"epoch": snapshot.epoch, "time": time.time(), "prices": new_plan.price_map()}
        )
        self.metrics.epoch(elapsed, new_plan)
        return new_plan

    def _apply_reconfigurations(self, new_plan: Plan, pods: Mapping[str, PodJob]) -> None:
        """Push in-place reconfigurations of bound pods to the cluster (spec 4.2).

        The plan prefers RECONFIGURE (same GPU, new configuration) to MIGRATE; the
        new ConfigMap and decision annotations reach the workload through
        ``elastico-run``.  A MIGRATE is carried out by :meth:`_migrate` for pods that
        allow it, and logged for the others.
        """
        migrations = 0
        for a in new_plan.changed():
            job_id = a.job_id
            if a.action is Action.MIGRATE:
                migrations += self._migrate(a, pods.get(job_id), migrations)
                continue
            if a.action is not Action.RECONFIGURE:
                continue
            pj = pods.get(job_id)
            pod = self.cluster.state.pod(job_id)
            if pj is None or pj.intent is None or pod is None or not a.devices:
                continue
            verdict = NodeVerdict(
                a.devices[0][0],
                True,
                a.config_index,
                a.devices,
                a.predicted_slowdown,
                a.tolerance,
                0.0,
                a.memory_budget_mib,
            )
            request = self._bind_request(pod, pj, verdict, new_plan.epoch)
            try:
                self.cluster.reconfigure(request)
            except (ClusterError, OSError) as exc:
                self.metrics.bind("reconfigure-error")
                log.warning("reconfigure.failed", extra={"pod": pj.key, "error": str(exc)})
                continue
            self.metrics.bind("reconfigured")
            log.info(
                "reconfigure.ok", extra={"pod": pj.key, "configuration": a.configuration.label}
            )

    def _migrate(self, a: Assignment, pj: PodJob | None, done: int) -> int:
        """Evict a pod the plan moves, when it may be moved; returns 1 if evicted.

        A pod is moved only when it opted in (``elastico.io/migration: allowed``), a
        controller owns it (so a replacement pod comes back through filter and
        prioritize), it was not evicted before, and this epoch's budget
        (``max_migrations_per_epoch``) is not spent.  The Eviction API honours
        PodDisruptionBudgets and the pod's graceful termination, in which
        ``elastico-run`` forwards SIGTERM so the workload can checkpoint."""
        pod = self.cluster.state.pod(a.job_id)
        why = ""
        if pj is None or pod is None:
            why = "pod no longer known"
        elif pj.intent is None or not pj.intent.migration_allowed:
            why = "pod does not allow migration (elastico.io/migration: allowed)"
        elif not any(
            o.get("controller") for o in (pod.get("metadata") or {}).get("ownerReferences") or ()
        ):
            why = "no controller owns the pod, so nothing would recreate it"
        elif a.job_id in self._evicted:
            why = "eviction already requested"
        elif done >= self.settings.max_migrations_per_epoch:
            why = "max_migrations_per_epoch reached"
        if why:
            log.info("migration.suggested", extra={"job": a.job_id, "to": a.devices, "why": why})
            return 0
        assert pj is not None and pod is not None
        meta = pod.get("metadata") or {}
        try:
            self.cluster.evict(
                str(meta.get("namespace") or "default"), str(meta.get("name")), a.job_id
            )
        except (ClusterError, OSError) as exc:
            self.metrics.bind("migration-refused")
            log.warning("migration.refused", extra={"pod": pj.key, "error": str(exc)})
            return 0
        self._evicted[a.job_id] = None
        if len(self._evicted) > SEEN_PODS:
            self._evicted.popitem(last=False)
        self.metrics.bind("migrated")
        log.info("migration.evicted", extra={"pod": pj.key, "to": a.devices})
        return 1

    @property
    def published(self) -> Published:
        if self._published is None:
            raise RuntimeError("no plan published yet")
        return self._published

    # -- per-pod questions --------------------------------------------------------------
    def _answers(self, pub: Published, pj: PodJob, at: np.ndarray) -> Answers:
        """The view's answer for the pod on the nodes ``at`` (indices, -1 unknown); call
        with ``self._lock`` held.

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
        if cached is not None and cached[0] == self._version and cached[1].asked[known].all():
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
                verdict = self._held_verdict(pub, pj, home, devices)
                answers = answers.with_verdict(view.node_index[home], verdict, view.table.index)
        self._answer_cache[key] = (self._version, answers)
        if len(self._answer_cache) > 256:
            self._answer_cache.popitem(last=False)
        return answers

    def _held_verdict(
        self, pub: Published, pj: PodJob, node: str, held: tuple[tuple[str, int], ...]
    ) -> NodeVerdict:
        assumed = self._assumed.get(pj.job.id)
        if assumed is not None and assumed.verdict.node == node:
            return assumed.verdict
        a = pub.plan.assignments.get(pj.job.id)
        if a is None:
            return NodeVerdict(node, True, devices=held, score=-math.inf)
        return NodeVerdict(
            node,
            True,
            config_index=a.config_index,
            devices=a.devices,
            predicted_slowdown=a.predicted_slowdown,
            tolerance=a.tolerance,
            score=-math.inf,  # the plan's own choice ranks first
            memory_budget_mib=a.memory_budget_mib,
        )

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
        self.remember(pod)
        try:
            pj = self.pod_job(pod)
        except AnnotationError as exc:
            names = list(dict.fromkeys(names))
            message = f"elastico: invalid annotations: {exc}"
            self.metrics.rejection("annotation", len(names))
            return FilterOutcome([], {}, {n: message for n in names})
        if pj is None:
            return FilterOutcome(list(dict.fromkeys(names)), {}, {})
        pub = self.published
        names, at = self._distinct(pub.view, names)
        with self._lock:
            answers = self._answers(pub, pj, at)
        ok = np.zeros(at.size, dtype=bool)
        ok[at >= 0] = answers.feasible[at[at >= 0]]
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        if ok.all():
            return FilterOutcome(names, failed, unresolvable)
        passed = [n for n, good in zip(names, ok.tolist(), strict=True) if good]
        # One label and one message per distinct reason; each node only looks them up.
        seen: dict[int, tuple[dict[str, str], str, str]] = {}
        counts: dict[str, int] = {}
        for pos in np.flatnonzero(~ok).tolist():
            node = int(at[pos])
            code = int(answers.reason_of[node]) if node >= 0 else -2
            hit = seen.get(code)
            if hit is None:
                reason = answers.reason(node)
                label = reason_label(reason)
                bucket = unresolvable if label in _UNRESOLVABLE else failed
                hit = seen[code] = (bucket, f"elastico: {reason}", label)
            hit[0][names[pos]] = hit[1]
            counts[hit[2]] = counts.get(hit[2], 0) + 1
        for label, count in counts.items():
            self.metrics.rejection(label, count)
        return FilterOutcome(passed, failed, unresolvable)

    def prioritize(self, pod: Mapping[str, Any], names: Iterable[str]) -> HostScores:
        """Scores 0..10: the plan's node 10; otherwise cheaper configuration at current
        prices, less predicted slowdown and a tighter fit score higher; infeasible 0."""
        try:
            pj = self.pod_job(pod)
        except AnnotationError:
            pj = None  # filter reported it; every node scores 0
        if pj is None and self._published is None:  # nothing to rank, no view needed
            names = list(dict.fromkeys(names))
            return HostScores(names, np.full(len(names), -1), np.zeros(len(names), np.intp), ())
        pub = self.published
        names, at = self._distinct(pub.view, names)
        if pj is None:
            return HostScores(names, at, np.zeros(at.size, dtype=np.intp), pub.view.nodes)
        with self._lock:
            answers = self._answers(pub, pj, at)
            key = (id(answers), id(at))  # both cached objects: a repeat of an earlier pod
            hit = self._score_cache.get(key)
            if hit is not None and hit[0] is answers and hit[1] is at:
                return HostScores(names, at, hit[2], pub.view.nodes)
            result = self._scores(pub, answers, at)
            self._score_cache[key] = (answers, at, result)
            if len(self._score_cache) > 32:
                self._score_cache.popitem(last=False)
        return HostScores(names, at, result, pub.view.nodes)

    @staticmethod
    def _scores(pub: Published, answers: Answers, at: np.ndarray) -> np.ndarray:
        """0..10 per node of ``at`` (see prioritize); call with ``self._lock`` held."""
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

    def _pod_for_bind(self, namespace: str, name: str, uid: str) -> dict[str, Any] | None:
        pod = self.cluster.state.pod(uid) if uid else None
        if pod is None:
            pod = self.cluster.state.pod_by_name(namespace, name)
        if pod is None and uid:
            pod = self._seen.get(uid)
        return pod

    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        """Place and bind; returns '' on success or the error text for the Error field."""
        pod = self._pod_for_bind(namespace, name, uid)
        if pod is None:
            self.metrics.bind("unknown-pod")
            return f"pod {namespace}/{name} (UID {uid}) is not known to ElastiCo"
        try:
            pj = self.pod_job(pod)
        except (AnnotationError, ValueError) as exc:
            self.metrics.bind("invalid")
            return f"pod {namespace}/{name}: {exc}"
        if pj is None:
            return self._write(BindRequest(namespace, name, uid, node), None)
        pub = self.published
        job = pj.job
        with self._lock:
            previous = self._assumed.get(job.id)
            if previous is not None and previous.verdict.node == node:
                verdict = previous.verdict
            else:
                if previous is not None:
                    del self._assumed[job.id]
                held = pub.view.devices_of(job.id) if pub.view.holds(job.id) else ()
                if held and held[0][0] == node:
                    verdict = self._held_verdict(pub, pj, node, held)
                else:
                    if held:
                        pub.view.forget(job.id)
                        self._version += 1
                    verdict = pub.view.evaluate(job, pj.family, [node])[node]
                    if not verdict.feasible:
                        self.metrics.bind("rejected")
                        return f"elastico: node {node} cannot take {pj.key}: {verdict.reason}"
                    pub.view.assume(job, pj.family, verdict)
            self._assumed[job.id] = Assumed(
                pj, verdict, self.clock() + self.settings.assume_ttl_seconds
            )
            self._version += 1
        return self._write(self._bind_request(pod, pj, verdict, pub.plan.epoch), pj)

    def _bind_request(
        self, pod: Mapping[str, Any], pj: PodJob, verdict: NodeVerdict, epoch: int
    ) -> BindRequest:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name", ""))
        uid = str(meta.get("uid", ""))
        if pj.intent is None:
            return BindRequest(namespace, name, uid, verdict.node)
        family, config = pj.family, verdict.config_index
        devices = tuple(d for _, d in verdict.devices)
        node_obj = next((n for n in self.published.snapshot.nodes if n.name == verdict.node), None)
        device_mib = (
            min(g.memory_mib for g in node_obj.gpus if g.index in devices)
            if node_obj is not None and node_obj.gpus
            else self.settings.default_gpu_memory_mib
        )
        budget = float(verdict.memory_budget_mib or family.resources[config, GPU_MEM])
        budget = min(budget, device_mib)
        configmap = (meta.get("annotations") or {}).get(PREFIX + "configmap") or (
            "elastico-" + name
        )[:253]
        data = framework_settings(
            kind=family.kind,
            configuration=family.configs[config],
            memory_budget_mib=budget,
            device_memory_mib=device_mib,
            device_indices=devices,
            sm_share=float(family.resources[config, GPU_SM]),
            mps=self.settings.mps,
        )
        annotations = decision_annotations(
            node=verdict.node,
            devices=devices,
            kind=family.kind,
            configuration=family.configs[config],
            memory_budget_mib=budget,
            device_memory_mib=device_mib,
            sm_share=float(family.resources[config, GPU_SM]),
            mps=self.settings.mps,
            predicted_slowdown=verdict.predicted_slowdown,
            price_epoch=epoch,
            configmap=configmap,
        )
        return BindRequest(namespace, name, uid, verdict.node, annotations, configmap, data)

    def _write(self, request: BindRequest, pj: PodJob | None) -> str:
        try:
            self.cluster.bind(request)
        except (ClusterError, OSError) as exc:
            if pj is not None:
                with self._lock:
                    self._assumed.pop(pj.job.id, None)
                    self.published.view.forget(pj.job.id)
                    self._version += 1
            self.metrics.bind("error")
            log.warning(
                "bind.failed",
                extra={"pod": f"{request.namespace}/{request.name}", "error": str(exc)},
            )
            return f"bind {request.namespace}/{request.name} to {request.node} failed: {exc}"
        self.metrics.bind("ok")
        log.info(
            "bind.ok", extra={"pod": f"{request.namespace}/{request.name}", "node": request.node}
        )
        return ""

    def victims(self, node_victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        """Preempt: keep the scheduler's candidates on known nodes, only victims that
        really run there (an unknown UID would fail the scheduler's cycle)."""
        pods = self.cluster.state.pods()
        known_nodes = set(self.cluster.state.nodes())
        kept: dict[str, list[str]] = {}
        for node, uids in node_victims.items():
            if node not in known_nodes:
                continue
            here = [u for u in uids if (pods.get(u, {}).get("spec") or {}).get("nodeName") == node]
            if here and len(here) == len(uids):
                kept[node] = here
        return kept

    # -- REST views ----------------------------------------------------------------------
    def assumed_count(self) -> int:
        with self._lock:
            return len(self._assumed)

    def prices(self) -> dict[str, Any]:
        pub = self.published
        return {
            "epoch": pub.plan.epoch,
            "resources": pub.plan.price_map(),
            "units": dict(zip(RESOURCE_NAMES, ("fraction", "MiB", "cores", "MiB"), strict=True)),
            "history": list(self.history),
        }

    def jobs(self) -> list[dict[str, Any]]:
        pub = self.published
        with self._lock:
            assumed = {k: v for k, v in self._assumed.items()}
        rows = []
        for job in pub.snapshot.jobs:
            pj = pub.pods.get(job.id)
            if pj is None:
                continue
            a = pub.plan.assignments.get(job.id)
            state = "running" if job.running else "pending"
            if job.id in pub.plan.rejected:
                state = "rejected"
            elif job.id in pub.plan.queued:
                state = "queued"
            elif job.id in assumed:
                state = "binding"
            row: dict[str, Any] = {
                "id": job.id,
                "pod": pj.key,
                "family": job.family,
                "kind": job.kind.value,
                "mode": job.mode.value,
                "gpus": job.gpus,
                "weight": job.weight,
                "floor": job.min_throughput,
                "throughput_unit": pj.family.throughput_unit,
                "state": state,
                "reason": pub.plan.rejected.get(job.id),
            }
            if a is not None:
                row.update(
                    {
                        "action": a.action.value,
                        "configuration": a.configuration.label,
                        "config_index": a.config_index,
                        "devices": [f"{n}/{d}" for n, d in a.devices],
                        "memory_budget_mib": a.memory_budget_mib,
                        "throughput": a.throughput,
                        "predicted_slowdown": a.predicted_slowdown,
                        "tolerance": a.tolerance if math.isfinite(a.tolerance) else None,
                        "estimated_profile": a.estimated,
                    }
                )
            rows.append(row)
        for uid, message in pub.invalid.items():
            rows.append({"id": uid, "state": "invalid", "reason": message})
        return rows

    def nodes(self) -> list[dict[str, Any]]:
        pub = self.published
        with self._lock:
            assumed = list(self._assumed.values())
        occupants: dict[tuple[str, int], list[tuple[str, float, float]]] = {}
        for a in pub.plan.assignments.values():
            pj = pub.pods.get(a.job_id)
            sm = float(pj.family.resources[a.config_index, GPU_SM]) if pj else 0.0
            for ref in a.devices:
                occupants.setdefault(ref, []).append(
                    (pj.key if pj else a.job_id, a.memory_budget_mib, sm)
                )
        for x in assumed:
            if x.pod_job.job.id in pub.plan.assignments:
                continue
            sm = float(x.pod_job.family.resources[x.verdict.config_index, GPU_SM])
            for ref in x.verdict.devices:
                occupants.setdefault(ref, []).append(
                    (x.pod_job.key, x.verdict.memory_budget_mib, sm)
                )
        rows = []
        for node in pub.snapshot.nodes:
            gpus = []
            pairs: list[list[str]] = []
            for g in node.gpus:
                here = occupants.get((node.name, g.index), [])
                gpus.append(
                    {
                        "index": g.index,
                        "product": g.product,
                        "memory_mib": g.memory_mib,
                        "memory_assigned_mib": float(sum(m for _, m, _ in here)),
                        "sm_assigned": float(np.clip(sum(s for _, _, s in here), 0.0, None)),
                        "pods": [p for p, _, _ in here],
                    }
                )
                names = [p for p, _, _ in here]
                pairs.extend(
                    [names[i], names[j]]
                    for i in range(len(names))
                    for j in range(i + 1, len(names))
                )
            rows.append(
                {
                    "name": node.name,
                    "cpu_cores": node.cpu_cores,
                    "host_mem_mib": node.host_mem_mib,
                    "gpus": gpus,
                    "colocated_pairs": pairs,
                }
            )
        return rows

    def plan_summary(self) -> dict[str, Any]:
        pub = self.published
        p = pub.plan
        return {
            "epoch": p.epoch,
            "published_at": pub.published_at,
            "epoch_ms": pub.epoch_ms,
            "prices": p.price_map(),
            "assignments": {
                job_id: {
                    "pod": pub.pods[job_id].key if job_id in pub.pods else job_id,
                    "configuration": a.configuration.label,
                    "devices": [f"{n}/{d}" for n, d in a.devices],
                    "action": a.action.value,
                    "memory_budget_mib": a.memory_budget_mib,
                    "predicted_slowdown": a.predicted_slowdown,
                }
                for job_id, a in p.assignments.items()
            },
            "queued": list(p.queued),
            "rejected": dict(p.rejected),
            "preempted": list(p.preempted),
            "violations": [list(v) for v in p.violations],
            "stats": {k: float(v) for k, v in p.stats.items()},
            "predictor": self.predictor_name,
            "predictor_degraded": self.predictor_degraded,
        }
