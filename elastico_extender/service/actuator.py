"""The actuator: the only part of the service that writes to the cluster.

It turns a decision (a :class:`NodeVerdict`, or a plan's :class:`Assignment`)
into the writes of a :class:`BindRequest` -- the per-pod ConfigMap of
framework settings and the decision annotations (spec 4.2); for a pod held as
whole GPUs only the node and devices it was counted on, so a restarted extender
counts it on the same devices instead of guessing -- and performs
binds, in-place reconfigurations and the evictions that carry out a
migration.  It keeps one piece of state: the pods it asked to evict.

With an :class:`~.events.EventRecorder` (a real cluster, service/events.py) it also
tells the pod why, as core/v1 Events written on the leader only: ``Bound`` with the
configuration, node/GPUs, GPU-memory price λ and Ŝ ≤ τ; ``Reconfigured`` with the
old and new configuration and the price behind it; ``Refused`` when bind refuses
the scheduler's node; ``ConfigurationsRejected`` when the plan rejects every
configuration of a pending pod's family (``Plan.rejected``: knob ranges, throughput
floor, no GPU large enough), so it stays queued -- said once per pod and reason, not
every epoch (:meth:`announce_rejected`).  The recorder rate-limits per (pod, reason)
and writes on its own thread: a verb only queues.

Ordering keeps the cluster's record of decisions within capacity at all
times: reconfigurations that shrink (or keep) a budget are written before the
epoch publishes the view that counts the freed memory (:meth:`shrink`, which
returns the pods whose write failed: the epoch counts them as they run, and holds
back what the plan grows or moves onto their devices); ones that grow it, and
evictions, after (:meth:`apply`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Container, Mapping
from typing import Any, Protocol

from elastico_extender.annotations import (
    ASSIGNED_CONFIGURATION,
    ASSIGNED_DEVICES,
    ASSIGNED_NODE,
    MEMORY_BUDGET,
    PREFIX,
    configmap_name,
    decision_annotations,
    read_decision,
)
from elastico_extender.cluster.base import BindRequest, Cluster, ClusterError
from elastico_extender.cluster.objects import closed_to
from elastico_extender.core.handoff import framework_settings
from elastico_extender.core.model import Action, DeviceRef, Node, Plan
from elastico_extender.core.planner import NodeVerdict
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.service.events import (
    EventRecorder,
    PodRef,
    bound_message,
    reconfigured_message,
    refused_message,
    rejected_configurations_message,
)
from elastico_extender.service.logs import decision_fields
from elastico_extender.service.pods import PodJob, unmovable
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.succession import Succession

__all__ = ["ANNOUNCED_KEPT", "EVICTED_KEPT", "Actuator", "BindMetrics"]

log = logging.getLogger(__name__)

EVICTED_KEPT = 4096
"""Pods remembered as asked to evict (so one move is requested once)."""
ANNOUNCED_KEPT = 10_000
"""Rejected pods remembered with what their Event said (so it is said once)."""


class BindMetrics(Protocol):
    """What the actuator reports (the API layer supplies Prometheus-backed metrics)."""

    def bind(self, result: str) -> None: ...


class Actuator:
    """Writes decisions, reconfigurations and evictions (see the module docstring).

    ``is_leader``: with several replicas only the leader reshapes and moves
    running pods; binds are answered by whichever replica the scheduler asks."""

    def __init__(
        self,
        cluster: Cluster,
        settings: ServiceSettings,
        metrics: BindMetrics,
        *,
        is_leader: Callable[[], bool] = lambda: True,
        events: EventRecorder | None = None,
        succession: Succession | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.cluster = cluster
        self.settings = settings
        self.metrics = metrics
        self.is_leader = is_leader
        self.events = events
        # An evicted pod's job passes to its replacement (service.succession).
        self.succession = succession
        self.wall_clock = wall_clock
        self._evicted: OrderedDict[str, None] = OrderedDict()
        self._announced: OrderedDict[str, str] = OrderedDict()
        self._announce_lock = threading.Lock()

    # -- decisions -----------------------------------------------------------------
    def request(
        self,
        pod: Mapping[str, Any],
        pj: PodJob,
        verdict: NodeVerdict,
        epoch: int,
        node: Node | None,
    ) -> BindRequest:
        """Everything bind (or a reconfiguration) writes for ``verdict``."""
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name", ""))
        uid = str(meta.get("uid", ""))
        if pj.intent is None:  # whole GPUs, no budget: only where they were counted
            held = {
                PREFIX + ASSIGNED_NODE: verdict.node,
                PREFIX + ASSIGNED_DEVICES: ",".join(str(d) for _, d in verdict.devices),
            }
            return BindRequest(namespace, name, uid, verdict.node, held)
        family, config = pj.family, verdict.config_index
        devices = tuple(d for _, d in verdict.devices)
        device_mib = (
            min(g.memory_mib for g in node.gpus if g.index in devices)
            if node is not None and node.gpus
            else self.settings.default_gpu_memory_mib
        )
        budget = float(verdict.memory_budget_mib or family.resources[config, GPU_MEM])
        budget = min(budget, device_mib)
        configmap = configmap_name(meta)
        sm_share = float(family.resources[config, GPU_SM])
        data = framework_settings(
            kind=family.kind,
            configuration=family.configs[config],
            memory_budget_mib=budget,
            device_memory_mib=device_mib,
            device_indices=devices,
            sm_share=sm_share,
            mps=self.settings.mps,
        )
        annotations = decision_annotations(
            node=verdict.node,
            devices=devices,
            kind=family.kind,
            configuration=family.configs[config],
            memory_budget_mib=budget,
            device_memory_mib=device_mib,
            sm_share=sm_share,
            mps=self.settings.mps,
            predicted_slowdown=verdict.predicted_slowdown,
            price_epoch=epoch,
            configmap=configmap,
        )
        return BindRequest(namespace, name, uid, verdict.node, annotations, configmap, data)

    def bind(
        self, request: BindRequest, verdict: NodeVerdict | None = None, price: float = 0.0
    ) -> None:
        """Write the decision and the Binding; raises ClusterError (status set when the
        API server answered).  With the ``verdict`` it carries out and the GPU-memory
        ``price`` of the plan that made it, the pod gets a ``Bound`` Event."""
        try:
            self.cluster.bind(request)
        except OSError as exc:
            raise ClusterError(f"API server unreachable: {exc}") from exc
        self.metrics.bind("ok")
        log.info("bind.ok", extra=decision_fields(request))
        if verdict is not None and self._recording():
            assert self.events is not None
            configuration = request.annotations.get(PREFIX + ASSIGNED_CONFIGURATION)
            message = bound_message(
                request.node,
                tuple(d for _, d in verdict.devices),
                configuration or "whole GPUs",
                price,
                verdict.predicted_slowdown,
                verdict.tolerance,
            )
            self.events.bound(self._ref(request), message)

    def refused(self, namespace: str, name: str, uid: str, node: str, because: str) -> None:
        """Bind refused the scheduler's ``node``: one ``Refused`` Event per pod and
        reason per rate-limit window (the recorder folds repeats)."""
        if self._recording():
            assert self.events is not None
            self.events.refused(PodRef(namespace, name, uid), refused_message(node, because))

    def announce_rejected(self, plan: Plan, pods: Mapping[str, PodJob]) -> None:
        """A ``ConfigurationsRejected`` Event for each pod the plan rejects whole (no
        configuration of its family can run: ``Plan.rejected``), once per pod and
        message: a pod that stays rejected is not told again each epoch; one that is
        rejected again after it was not, or for another reason, is."""
        if not self._recording():
            return
        with self._announce_lock:  # two epochs at once (a forced one) must not both tell
            self._announce_rejected(plan, pods)

    def _announce_rejected(self, plan: Plan, pods: Mapping[str, PodJob]) -> None:
        assert self.events is not None
        for job_id in [j for j in self._announced if j not in plan.rejected]:
            del self._announced[job_id]
        for job_id, reason in plan.rejected.items():
            pj = pods.get(job_id)
            if pj is None:
                continue
            count = len(pj.family.configs)
            message = rejected_configurations_message(
                [(f"all {count} configurations of {pj.family.workload}", reason)]
            )
            if self._announced.get(job_id) == message:
                continue
            namespace, _, name = pj.key.partition("/")
            if self.events.rejected(PodRef(namespace, name, job_id), message):
                self._announced[job_id] = message
                self._announced.move_to_end(job_id)
                if len(self._announced) > ANNOUNCED_KEPT:
                    self._announced.popitem(last=False)

    def _recording(self) -> bool:
        return self.events is not None and self.is_leader()

    @staticmethod
    def _ref(request: BindRequest) -> PodRef:
        return PodRef(request.namespace, request.name, request.uid)

    # -- the plan's changes to running pods ------------------------------------------
    def shrink(
        self,
        plan: Plan,
        pods: Mapping[str, PodJob],
        nodes: Mapping[str, Node],
        skip: Container[str] = (),
    ) -> set[str]:
        """Write the reconfigurations that do not grow a pod's memory budget (before
        the view that counts the freed memory is published); returns the jobs whose
        write failed: they still run as before, and the view must count them so."""
        return self._reconfigure(plan, pods, nodes, skip, grow=False)

    def apply(
        self,
        plan: Plan,
        pods: Mapping[str, PodJob],
        nodes: Mapping[str, Node],
        skip: Container[str] = (),
        moves: Container[str] | None = None,
    ) -> None:
        """Write the growing reconfigurations and carry out the plan's migrations (those
        in ``moves`` when given: what :meth:`moves` chose before the publish)."""
        self._reconfigure(plan, pods, nodes, skip, grow=True)
        migrations = 0
        for a in plan.changed():
            if a.action is Action.MIGRATE and a.job_id not in skip:
                if moves is not None and a.job_id not in moves:
                    continue
                migrations += self._migrate(a.job_id, a.devices, pods.get(a.job_id), migrations)
        for job_id in plan.preempted:  # e.g. requeued by the closed loop for observed harm
            if job_id in skip or (moves is not None and job_id not in moves):
                continue
            migrations += self._migrate(job_id, (), pods.get(job_id), migrations)

    def moves(self, plan: Plan, pods: Mapping[str, PodJob], skip: Container[str]) -> set[str]:
        """The plan's migrations this epoch will carry out (see :meth:`_migrate`); every
        other MIGRATE stays where it runs, and the published view must say so."""
        chosen: set[str] = set()
        if not self.is_leader():
            return chosen
        # Requeued running pods first (the closed loop undoing observed harm), then moves.
        wanted: list[tuple[str, tuple[DeviceRef, ...]]] = [
            (j, ()) for j in plan.preempted if j not in skip
        ]
        wanted += [
            (a.job_id, a.devices)
            for a in plan.changed()
            if a.action is Action.MIGRATE and a.job_id not in skip
        ]
        for job_id, to in wanted:
            if len(chosen) >= self.settings.max_migrations_per_epoch:
                break
            if not self._why_not(job_id, pods.get(job_id), self.cluster.state.pod(job_id), to):
                chosen.add(job_id)
        return chosen

    def _why_not(
        self,
        job_id: str,
        pj: PodJob | None,
        pod: Mapping[str, Any] | None,
        to: tuple[DeviceRef, ...] = (),
    ) -> str:
        """Why the pod of job ``job_id`` may not be moved (to ``to``) or requeued ('' when
        it may)."""
        if pj is None or pod is None:
            return "pod no longer known"
        why = unmovable(pod, pj.intent)  # the planner's Job.preemptible, by the same rule
        if why:
            return why
        if job_id in self._evicted:
            return "eviction already requested"
        target = self.cluster.state.node(to[0][0]) if to else None
        if target is not None:
            # The plan knows no cordon or taint: a replacement would never be placed there.
            return closed_to(target, pod)
        return ""

    def _reconfigure(
        self,
        plan: Plan,
        pods: Mapping[str, PodJob],
        nodes: Mapping[str, Node],
        skip: Container[str],
        *,
        grow: bool,
    ) -> set[str]:
        """Push in-place reconfigurations of bound pods to the cluster (spec 4.2): the
        new ConfigMap and decision annotations reach the workload through
        ``elastico-run``; only those that grow the budget (``grow``) or not.  Returns
        the jobs whose write failed."""
        failed: set[str] = set()
        if not self.is_leader():
            return failed
        for a in plan.changed():
            if a.action is not Action.RECONFIGURE or a.job_id in skip:
                continue
            pj = pods.get(a.job_id)
            pod = self.cluster.state.pod(a.job_id)
            if pj is None or pj.intent is None or pod is None or not a.devices:
                continue
            current = read_decision((pod.get("metadata") or {}).get("annotations"))
            grows = current is None or a.memory_budget_mib > current.memory_budget_mib + 1e-6
            if grows is not grow:
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
            request = self.request(pod, pj, verdict, plan.epoch, nodes.get(verdict.node))
            try:
                self.cluster.reconfigure(request)
            except (ClusterError, OSError) as exc:
                self.metrics.bind("reconfigure-error")
                log.warning("reconfigure.failed", extra=decision_fields(request, error=str(exc)))
                failed.add(a.job_id)
                continue
            self.metrics.bind("reconfigured")
            log.info("reconfigure.ok", extra=decision_fields(request))
            if self.events is not None:  # _reconfigure runs on the leader only
                after = request.annotations.get(PREFIX + ASSIGNED_CONFIGURATION, "")
                before = current.configuration if current is not None else "unrecorded"
                was = f"{current.memory_budget_mib:.0f}" if current is not None else "?"
                because = (
                    f"the plan of epoch {plan.epoch} reshapes it at GPU memory price "
                    f"λ={float(plan.prices[GPU_MEM]):.3f}: memory budget {was} -> "
                    f"{request_budget(request)} MiB, predicted slowdown "
                    f"Ŝ={a.predicted_slowdown:.2f} ≤ τ={a.tolerance:.2f}"
                )
                self.events.reconfigured(
                    self._ref(request), reconfigured_message(before, after, because)
                )
        return failed

    def _migrate(self, job_id: str, to: tuple[DeviceRef, ...], pj: PodJob | None, done: int) -> int:
        """Evict a pod the plan moves (to ``to``) or requeues (``to`` empty), when it may
        be moved; returns 1 if evicted.

        A pod is moved only when it opted in (``elastico.io/migration: allowed``), a
        controller owns it (so a replacement pod comes back through filter and
        prioritize), it was not evicted before, and this epoch's budget
        (``max_migrations_per_epoch``) is not spent.  The Eviction API honours
        PodDisruptionBudgets and the pod's graceful termination, in which
        ``elastico-run`` forwards SIGTERM so the workload can checkpoint."""
        pod = self.cluster.state.pod(job_id)
        why = "not the leader" if not self.is_leader() else self._why_not(job_id, pj, pod, to)
        if not why and done >= self.settings.max_migrations_per_epoch:
            why = "max_migrations_per_epoch reached"
        if why:
            log.info("migration.suggested", extra={"job": job_id, "to": to, "why": why})
            return 0
        assert pj is not None and pod is not None
        meta = pod.get("metadata") or {}
        try:
            self.cluster.evict(
                str(meta.get("namespace") or "default"), str(meta.get("name")), job_id
            )
        except (ClusterError, OSError) as exc:
            self.metrics.bind("migration-refused")
            log.warning("migration.refused", extra={"pod": pj.key, "error": str(exc)})
            return 0
        self._evicted[job_id] = None
        if self.succession is not None:
            self.succession.evicted(pod, pj.job, self.wall_clock())
        if len(self._evicted) > EVICTED_KEPT:
            self._evicted.popitem(last=False)
        self.metrics.bind("migrated")
        log.info("migration.evicted", extra={"pod": pj.key, "to": to})
        return 1


def request_budget(request: BindRequest) -> str:
    """The memory budget a request writes, as recorded in its annotations."""
    return request.annotations.get(PREFIX + MEMORY_BUDGET, "?")
