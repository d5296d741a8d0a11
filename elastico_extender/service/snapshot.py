"""Cluster view -> core :class:`Snapshot`: the planner's input, rebuilt every epoch.

The builder owns what it needs to rebuild cheaply: parsed nodes by
resourceVersion (a heartbeat keeps the same :class:`Node` object, so the core's
per-cluster device index is built once per node set) and the running records
of bound pods (the same record while the pod object and its node are the same).

Bound pods take their devices from the decision annotations bind wrote
(``annotations.read_decision``): the API server is the only store, so a
restarted extender rebuilds every placement from it.  Placements booked by
bind and not yet shown by the watch come in as ``bookings`` and are counted as
running where they were booked.  A bound pod whose decision annotations a user
removed is counted where they last said (remembered from the last build) or, after a
restart, where its ConfigMap says (``service.recovery``).  A pending pod's job carries
the nodes closed to it, cordoned or tainted against it (``service.closures``), which
the planner leaves out for it.  Observations (the closed
loop) come from an ``observed`` callable given by their owner; the snapshot only
carries them.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol

from elastico_extender.annotations import read_decision
from elastico_extender.cluster.objects import node_from_json, pod_is_active
from elastico_extender.cluster.state import ClusterState
from elastico_extender.core.model import Job, Node, ProfileFamily, Snapshot
from elastico_extender.core.observations import ObservedSlowdown
from elastico_extender.core.planner import NodeVerdict
from elastico_extender.core.planner.observed_throughput import SoloRates
from elastico_extender.errors import AnnotationError
from elastico_extender.service.closures import Closures
from elastico_extender.service.completions import CompletionRecorder
from elastico_extender.service.pods import PodJob, PodJobs
from elastico_extender.service.recovery import PlacementRecovery
from elastico_extender.service.succession import Succession

__all__ = ["Built", "Pinned", "SnapshotBuilder"]

log = logging.getLogger(__name__)


class Pinned(Protocol):
    """A placement the snapshot must show as running where ``verdict`` put it: a
    booking that the watch has not confirmed yet (see :mod:`.bookings`)."""

    @property
    def pod_job(self) -> PodJob: ...

    @property
    def verdict(self) -> NodeVerdict: ...


class Built(NamedTuple):
    """One snapshot and what the rest of the service needs to know about it."""

    snapshot: Snapshot
    pods: dict[str, PodJob]  # every planned job's pod, by job id
    in_snapshot: set[str]  # bookings the snapshot shows as running
    invalid: dict[str, str]  # pods with invalid annotations: id -> message (GET /jobs)
    confirmed: set[str]  # booked pods the watch shows bound or deleted (the booking can go)
    synced: bool  # the cluster view had synced when the snapshot was read
    node_generation: int  # the cluster view's node generation the snapshot is of


class SnapshotBuilder:
    """Builds :class:`Built` snapshots from a :class:`ClusterState` (one owner: the epoch)."""

    def __init__(
        self,
        state: ClusterState,
        pod_jobs: PodJobs,
        *,
        default_gpu_memory_mib: float,
        scheduler_name: str = "",
        observed: Callable[[], Mapping[str, ObservedSlowdown]] | None = None,
        unmeasured: Callable[[], Mapping[str, float]] | None = None,
        solo_rates: SoloRates | None = None,
        clock: Callable[[], float] | None = None,
        wall_clock: Callable[[], float] = time.time,
        dwell_seconds: float = 0.0,
        completions: CompletionRecorder | None = None,
        succession: Succession | None = None,
        recovery: PlacementRecovery | None = None,
        closures: Closures | None = None,
    ) -> None:
        self.state = state
        # Nodes closed to a pod (cordoned, tainted): barred to its job while it is pending.
        self.closures = closures
        # Per pending pod uid: (its job, the nodes barred, the job with them), so an
        # unchanged pod keeps one record from epoch to epoch.
        self._barred: dict[str, tuple[Job, frozenset[str], Job]] = {}
        # Placements of bound pods that lost their decision annotations before this
        # process saw them, read back from their ConfigMaps (None: not read).
        self.recovery = recovery
        # Finished pods teach expected run times; every job gets one (service.completions).
        self.completions = completions
        # Replacement pods of pods ElastiCo evicted continue their jobs (service.succession).
        self.succession = succession
        self.pod_jobs = pod_jobs
        self.default_gpu_memory_mib = default_gpu_memory_mib
        self.scheduler_name = scheduler_name
        # The observations owner hands its per-job observed slowdowns in here (closed
        # loop, core.observations); None: nothing observed yet.
        self.observed = observed
        self.unmeasured = unmeasured  # jobs reporting windows that have no reference yet
        # per family, the solo rates measured at each configuration (observed throughput)
        self.solo_rates = solo_rates
        self.clock = clock  # the service's monotonic clock (dwell)
        # Snapshot.now is wall-clock seconds: the unit of observation windows (agents)
        # and of pod start times (attained service).
        self.wall_clock = wall_clock
        self.dwell_seconds = dwell_seconds
        self.epoch = 0
        # Per running pod: the configuration it runs and since when (this clock), to
        # hold it for dwell_seconds after a bind or a reshape (issue 12 item 6).
        self._since: dict[str, tuple[int, float]] = {}
        self._held_copies: dict[str, tuple[Job, Job]] = {}
        self._primed = False  # the first snapshot's running pods started before us
        self._node_cache: dict[str, tuple[str, Node | None]] = {}
        self._last_nodes: tuple[Node, ...] = ()
        self._product: tuple[tuple[Node, ...], str | None] = ((), None)  # of _last_nodes
        self._nodes_generation = -1
        self._nodes_lock = threading.Lock()  # the epoch thread and a verb's refresh
        # Bound pods' running records from the last snapshot, by pod uid, with what
        # they were built from: (Pod object, PodJob, Node, running Job).
        self._bound: dict[str, tuple[dict[str, Any], PodJob, Node, Job]] = {}
        # Where each bound pod's decision annotations last placed it, by pod uid: (node,
        # devices, configuration row); one whose annotations went is counted there still.
        # Rebuilt every snapshot from the pods it holds, so bounded by them.
        self._decided: dict[str, tuple[str, tuple[int, ...], int]] = {}
        # Families whose profile changed since the last build: their bound pods' records
        # are built again (they hold the old family).  Taken at the start of a build, so
        # a change that lands during one is seen by the next.
        self._stale_families: set[str] = set()
        self._stale_lock = threading.Lock()

    # -- nodes -------------------------------------------------------------------------
    def nodes(self) -> tuple[Node, ...]:
        """The cluster's nodes as the planner sees them.

        While no node changes what the planner sees, the same tuple of the same
        objects comes back (a status heartbeat bumps a node's resourceVersion but
        parses to an equal Node), so the core's per-cluster device index is built
        once, not every epoch."""
        with self._nodes_lock:
            return self._nodes()

    def _main_product(self, nodes: tuple[Node, ...]) -> str | None:
        """The GPU model most of the cluster's GPUs are (None: no GPU): the one whose
        measured solo rates rank configurations (``core.planner.observed_throughput``).
        Counted again only when the node tuple changes (it is kept while nodes are)."""
        if nodes is not self._product[0]:
            counts = Counter(gpu.product for node in nodes for gpu in node.gpus)
            self._product = (nodes, counts.most_common(1)[0][0] if counts else None)
        return self._product[1]

    def _nodes(self) -> tuple[Node, ...]:
        generation = self.state.node_generation
        if generation == self._nodes_generation:
            return self._last_nodes
        nodes = []
        for name, obj in sorted(self.state.nodes().items()):
            rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
            cached = self._node_cache.get(name)
            if cached is None or cached[0] != rv:
                try:
                    parsed: Node | None = node_from_json(obj, self.default_gpu_memory_mib)
                except ValueError as exc:
                    log.warning("node.unreadable", extra={"node": name, "error": str(exc)})
                    parsed = None
                if cached is not None and parsed is not None and parsed == cached[1]:
                    parsed = cached[1]  # unchanged for the planner: keep the object
                cached = (rv, parsed)
                self._node_cache[name] = cached
            if cached[1] is not None:
                nodes.append(cached[1])
        for name in set(self._node_cache) - set(self.state.nodes()):
            del self._node_cache[name]
        self._nodes_generation = generation
        last = self._last_nodes
        if len(last) == len(nodes) and all(a is b for a, b in zip(last, nodes, strict=True)):
            return last
        self._last_nodes = tuple(nodes)
        return self._last_nodes

    def forget_family(self, name: str) -> None:
        """Family ``name``'s profile changed: the next build reads its bound pods anew."""
        with self._stale_lock:
            self._stale_families.add(name)

    # -- the snapshot ------------------------------------------------------------------
    def build(self, bookings: Mapping[str, Pinned] | None = None) -> Built:
        """The planner's input from the cluster view plus the placements in ``bookings``."""
        synced = self.state.is_synced  # read before the objects: a view at least this fresh
        now = self.clock() if self.clock is not None else 0.0
        generation = self.state.node_generation
        nodes = self.nodes()
        by_name = {n.name: n for n in nodes}
        assumed = dict(bookings or {})
        pods = self.state.pods()
        jobs: list[Job] = []
        meta: dict[str, PodJob] = {}
        deferred: list[tuple[PodJob, str, int, dict[str, Any]]] = []
        # uid -> (node, devices, configuration) of each pod's decision, for the next build
        decided: dict[str, tuple[str, tuple[int, ...], int]] = {}
        confirmed: set[str] = set()
        in_snapshot: set[str] = set()
        terminating: set[str] = set()
        invalid: dict[str, str] = {}
        bound: dict[str, tuple[dict[str, Any], PodJob, Node, Job]] = {}
        barred: dict[str, tuple[Job, frozenset[str], Job]] = {}
        wanted = self.scheduler_name
        previous = self._bound
        with self._stale_lock:
            stale, self._stale_families = self._stale_families, set()
        for uid, pod in pods.items():
            # A bound pod whose object and node are the ones of the last epoch: the same
            # record (the cluster view replaces objects, never edits them).  Most pods.
            hit = previous.get(uid)
            if (
                hit is not None
                and hit[0] is pod
                and by_name.get(hit[3].devices[0][0]) is hit[2]
                and hit[1].family.workload not in stale
            ):
                bound[uid] = hit
                decided[uid] = decided_of(hit[3])
                jobs.append(hit[3])
                meta[uid] = hit[1]
                continue
            if not pod_is_active(pod):
                self._finished(uid, pod)
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            if (pod.get("metadata") or {}).get("deletionTimestamp"):
                if not node_name:
                    continue  # a pending pod being deleted: nothing to plan
                # Terminating, still running (a checkpoint on SIGTERM): its GPU is not free
                # until the pod is gone, as kube-scheduler's cache counts it.
                terminating.add(uid)
            try:
                pj = self.pod_jobs.get(pod)
            except AnnotationError as exc:
                invalid[uid] = str(exc)
                pj = self.pod_jobs.fallback(pod, uid) if node_name else None
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
                config = config_row(family, pj, decision.configuration if decision else "")
                indices = {g.index for g in node.gpus}
                if (
                    decision is not None
                    and decision.node == node_name
                    and len(decision.devices) == job.gpus
                    and all(d in indices for d in decision.devices)
                ):
                    running = running_job(job, node_name, decision.devices, config)
                    decided[uid] = (node_name, decision.devices, config)
                    # an invalid pod is reported again every epoch, a terminating one held
                    if uid not in invalid and uid not in terminating:
                        bound[uid] = (pod, pj, node, running)
                    jobs.append(running)
                    meta[uid] = pj
                    continue
                booked = assumed.get(uid)
                if booked is not None and booked.verdict.node == node_name:
                    devices = tuple(d for _, d in booked.verdict.devices)
                    jobs.append(running_job(job, node_name, devices, booked.verdict.config_index))
                    meta[uid] = pj
                    continue
                deferred.append((pj, node_name, config, pod))
            elif uid in assumed:
                jobs.append(booked_job(job, assumed[uid].verdict))
                in_snapshot.add(uid)
                meta[uid] = pj
            elif not wanted or (pod.get("spec") or {}).get("schedulerName") == wanted:
                jobs.append(self._open_to(uid, job, pod, barred))
                meta[uid] = pj
        for uid, a in assumed.items():  # booked by us, not yet seen bound by the watch
            if uid not in pods:
                confirmed.add(uid)  # deleted since its bind: the booking can go too
                continue
            if uid in meta or uid in confirmed or a.verdict.node not in by_name:
                continue
            jobs.append(booked_job(a.pod_job.job, a.verdict))
            in_snapshot.add(uid)
            meta[uid] = a.pod_job
        if deferred:
            used: dict[str, set[int]] = {}
            for placed in jobs:
                for ref_node, device in placed.devices:
                    used.setdefault(ref_node, set()).add(device)
            if self.recovery is not None:
                self.recovery.begin()
            for pj, node_name, config, pod in deferred:
                node = by_name[node_name]
                taken = used.setdefault(node_name, set())
                last = last_decided(self._decided.get(pj.job.id), node, pj.job.gpus)
                if last is None and self.recovery is not None:
                    # Not seen with its decision by this process (a restart since): where
                    # the ConfigMap that bind wrote with the decision says.
                    found = self.recovery.placement(pj.job.id, pod)
                    if found is not None:
                        row = config_row(pj.family, pj, found.configuration)
                        last = last_decided((node_name, found.devices, row), node, pj.job.gpus)
                if last is not None:
                    # Its decision annotations went (a user removed them): the container
                    # still runs where bind put it, so where its decision last said.
                    devices, config = last
                    decided[pj.job.id] = (node_name, devices, config)
                else:  # bound elsewhere (or before this process): lowest free devices
                    free = [g.index for g in node.gpus if g.index not in taken]
                    pool = free + [g.index for g in node.gpus if g.index in taken]
                    devices = tuple(pool[: pj.job.gpus])
                    if len(devices) < pj.job.gpus:
                        continue
                taken.update(devices)
                jobs.append(running_job(pj.job, node_name, devices, config))
                meta[pj.job.id] = pj
            if self.recovery is not None:
                self.recovery.end()
        self._decided = decided
        self._barred = barred
        if terminating:
            jobs = [staying(j) if j.id in terminating else j for j in jobs]
        self._bound = bound
        if self.succession is not None:
            jobs = self.succession.continued(jobs, pods, self.wall_clock())
        if self.completions is not None:
            jobs = self.completions.dated(jobs, meta)
        if self.dwell_seconds > 0:
            jobs = self._hold(jobs, now)
        families = {j.family: meta[j.id].family for j in jobs}
        self.epoch += 1
        snapshot = Snapshot(
            nodes,
            tuple(jobs),
            families,
            epoch=self.epoch,
            observed=dict(self.observed()) if self.observed is not None else {},
            unmeasured=dict(self.unmeasured()) if self.unmeasured is not None else {},
            now=self.wall_clock(),
            solo_rates=(
                dict(self.solo_rates(families, self._main_product(nodes)))
                if self.solo_rates is not None
                else {}
            ),
        )
        return Built(snapshot, meta, in_snapshot, invalid, confirmed, synced, generation)

    def _open_to(
        self,
        uid: str,
        job: Job,
        pod: dict[str, Any],
        barred: dict[str, tuple[Job, frozenset[str], Job]],
    ) -> Job:
        """A pending pod's job with the nodes closed to it barred (``Job.barred_nodes``):
        kube-scheduler would never bind it there, so the plan must not reserve GPUs for
        it there.  The same record while the pod and its closed nodes are the same."""
        if self.closures is None:
            return job
        closed = self.closures.closed(pod)
        if not closed:
            return job
        names = frozenset(closed)
        kept = self._barred.get(uid)
        if kept is None or kept[0] is not job or kept[1] != names:
            kept = (job, names, dataclasses.replace(job, barred_nodes=names))
        barred[uid] = kept
        return kept[2]

    def _finished(self, uid: str, pod: dict[str, Any]) -> None:
        """A pod that ran to its end: a completion, if it succeeded as an ElastiCo job."""
        if self.completions is None or not self.completions.wants(uid, pod):
            return
        try:
            pod_job = self.pod_jobs.get(pod)
        except (AnnotationError, ValueError):
            pod_job = None
        before = self.succession.ran_before(uid) if self.succession is not None else 0.0
        self.completions.saw_finished(uid, pod, pod_job, before)

    def _hold(self, jobs: list[Job], now: float) -> list[Job]:
        """Running jobs that started (or were reshaped) less than ``dwell_seconds`` ago,
        held in their configuration: a reshape restarts the workload (spec 5.7).  Pods
        already running at the first snapshot count as running long enough."""
        since, copies = self._since, self._held_copies
        held: list[Job] = []
        seen: dict[str, tuple[int, float]] = {}
        kept: dict[str, tuple[Job, Job]] = {}
        for job in jobs:
            config = job.current_config
            if config is None:
                held.append(job)
                continue
            start = since.get(job.id)
            if start is None and not self._primed:
                start = (config, -math.inf)  # running before this process: long enough
            elif start is None or start[0] != config:
                start = (config, now)
            seen[job.id] = start
            if now - start[1] < self.dwell_seconds and job.allowed != (config,):
                copy = copies.get(job.id)
                if copy is None or copy[0] is not job:  # the same record gets the same copy
                    copy = (job, dataclasses.replace(job, allowed=(config,)))
                kept[job.id] = copy
                job = copy[1]
            held.append(job)
        self._since = seen  # pods gone or pending are forgotten
        self._held_copies = kept
        self._primed = True
        return held


def config_row(family: ProfileFamily, pj: PodJob, label: str) -> int:
    """The configuration row named ``label``; else the fastest allowed one."""
    if label:
        for i, config in enumerate(family.configs):
            if config.label == label:
                return i
    allowed = pj.job.allowed
    if allowed:
        return max(allowed, key=lambda r: float(family.throughput[r]))
    return family.fastest_index


def running_job(job: Job, node: str, devices: tuple[int, ...], config: int) -> Job:
    """``job`` running on ``devices`` of ``node`` in configuration row ``config``."""
    refs = tuple((node, d) for d in devices)
    allowed = job.allowed
    if allowed is not None and config not in allowed:
        allowed = (*allowed, config)
    return dataclasses.replace(job, devices=refs, current_config=config, allowed=allowed)


def decided_of(job: Job) -> tuple[str, tuple[int, ...], int]:
    """(node, devices, configuration) of a running job counted by its decision."""
    config = job.current_config
    return job.devices[0][0], tuple(d for _, d in job.devices), -1 if config is None else config


def last_decided(
    last: tuple[str, tuple[int, ...], int] | None, node: Node, gpus: int
) -> tuple[tuple[int, ...], int] | None:
    """The devices and configuration a pod's decision last named, if on ``node``, with
    ``gpus`` devices that it still has; else None."""
    if last is None or last[0] != node.name or len(last[1]) != gpus or last[2] < 0:
        return None
    indices = {g.index for g in node.gpus}
    return (last[1], last[2]) if all(d in indices for d in last[1]) else None


def staying(job: Job) -> Job:
    """A terminating pod's job: where and as it runs until it is gone (never reshaped,
    moved or requeued: its workload may be checkpointing on SIGTERM)."""
    config = job.current_config
    allowed = (config,) if config is not None else job.allowed
    return dataclasses.replace(job, allowed=allowed, preemptible=False)


def booked_job(job: Job, verdict: NodeVerdict) -> Job:
    """A booked job, running where it was booked and held in its booked configuration
    (a bind in flight is never reshaped or moved by the epoch that overlaps it)."""
    return dataclasses.replace(
        job,
        devices=verdict.devices,
        current_config=verdict.config_index,
        allowed=(verdict.config_index,),
    )
