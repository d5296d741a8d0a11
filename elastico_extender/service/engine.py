"""The scheduler behind the extender, assembled: one owner per piece of state.

::

    cluster view ──> SnapshotBuilder ──> EpochLoop ──publish──> Bookings ──> Verbs
     (cluster/)       (snapshot.py)       (loop.py)   plan+view  (bookings.py) (verbs.py)
                                              │                    │ book      │ bind
                                              └──> Actuator <──────┴───────────┘
                                                   (actuator.py: decisions, reconfigurations,
                                                    evictions)      RestViews (views.py) read

* :class:`~.pods.PodJobs` turns pod objects into planner jobs (bounded cache);
* :class:`~.snapshot.SnapshotBuilder` turns the cluster view (and the bookings,
  and the observations its owner hands in) into a core ``Snapshot``;
* :class:`~.loop.EpochLoop` plans every ``epoch_seconds`` and publishes the plan
  and a :class:`PlacementView`; it decides readiness;
* :class:`~.bookings.Bookings` holds the published view and the placements
  bind booked on it: the one serialised path that counts GPU memory;
* :class:`~.verbs.Verbs` answers filter / prioritize / bind / preempt;
* :class:`~.actuator.Actuator` is the only writer to the cluster;
* :class:`~.views.RestViews` serves GET /prices, /jobs, /nodes, /plan.

:class:`Engine` wires them and keeps the surface the HTTP layer calls.  The API
server stays the only store: after a restart the decision annotations rebuild
every placement (``annotations.read_decision``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from elastico_extender.cluster.base import Cluster, ConfigMapReader
from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.model import Plan
from elastico_extender.core.observations import ObservedSlowdown
from elastico_extender.core.planner.observed_throughput import SoloRates
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.service.actuator import Actuator
from elastico_extender.service.bookings import Bookings, Published
from elastico_extender.service.closures import Closures
from elastico_extender.service.completions import CompletionRecorder
from elastico_extender.service.events import EventRecorder
from elastico_extender.service.families import FamilyResolver
from elastico_extender.service.loop import EpochLoop
from elastico_extender.service.pods import PodJob, PodJobs
from elastico_extender.service.recovery import PlacementRecovery
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.snapshot import Built, SnapshotBuilder
from elastico_extender.service.succession import Succession
from elastico_extender.service.verbs import (
    MAX_SCORE,
    FilterOutcome,
    HostScores,
    Verbs,
    reason_label,
)
from elastico_extender.service.views import RestViews

__all__ = [
    "MAX_SCORE",
    "Engine",
    "FilterOutcome",
    "HostScores",
    "Metrics",
    "PodJob",
    "reason_label",
]


class Metrics:
    """Hooks the engine calls; the API layer supplies Prometheus-backed ones."""

    def epoch(self, seconds: float, plan: Plan) -> None: ...

    def rejection(self, reason: str, count: int = 1) -> None: ...

    def bind(self, result: str) -> None: ...


class Engine:
    """The service's parts, wired (see the module docstring).

    ``observed``: the observations owner's per-job observed slowdowns, read at each
    snapshot (closed loop); ``unmeasured``: its jobs whose windows have no reference
    yet; ``solo_rates``: its families' measured solo rates per configuration
    (``core.planner.observed_throughput``).  ``is_leader``: whether this replica may
    reshape and move running pods (leader election; always True for one replica)."""

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
        observed: Callable[[], Mapping[str, ObservedSlowdown]] | None = None,
        unmeasured: Callable[[], Mapping[str, float]] | None = None,
        solo_rates: SoloRates | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        events: EventRecorder | None = None,
        completions: CompletionRecorder | None = None,
        succession: Succession | None = None,
    ) -> None:
        self.settings = settings
        self.cluster = cluster
        self.planner_settings = planner_settings or settings.planner
        self.predictor = predictor
        self.predictor_name = getattr(predictor, "name", "contention-heuristic")
        self.predictor_degraded = predictor_degraded
        self.families = families or FamilyResolver(settings.default_gpu_memory_mib)
        self.metrics = metrics or Metrics()
        self.clock = clock
        self.pod_jobs = PodJobs(self.families, require_webhook=settings.require_webhook)
        # Evicted pods' jobs, for their replacements (service.succession).
        self.succession = succession if succession is not None else Succession()
        # Nodes closed to a pod (cordon, taints): the plan and the verbs agree on them.
        self.closures = Closures(cluster.state)
        self.builder = SnapshotBuilder(
            cluster.state,
            self.pod_jobs,
            default_gpu_memory_mib=settings.default_gpu_memory_mib,
            scheduler_name=settings.scheduler_name,
            observed=observed,
            unmeasured=unmeasured,
            solo_rates=solo_rates,
            clock=clock,
            dwell_seconds=settings.min_dwell_seconds,
            completions=completions if completions is not None else CompletionRecorder(),
            succession=self.succession,
            # a cluster that can read a pod's ConfigMap back (the API server, the file)
            recovery=PlacementRecovery(cluster) if isinstance(cluster, ConfigMapReader) else None,
            closures=self.closures,
        )
        self.bookings = Bookings(clock, settings.assume_ttl_seconds)
        self.actuator = Actuator(
            cluster,
            settings,
            self.metrics,
            is_leader=is_leader,
            events=events,
            succession=self.succession,
        )
        self.loop = EpochLoop(
            self.builder,
            self.bookings,
            self.actuator,
            epoch_seconds=settings.epoch_seconds,
            price_history=settings.price_history,
            planner_settings=self.planner_settings,
            predictor=predictor,
            metrics=self.metrics,
            clock=clock,
            is_leader=is_leader,
        )
        self.verbs = Verbs(
            cluster,
            self.pod_jobs,
            self.bookings,
            self.actuator,
            self.loop,
            self.metrics,
            closures=self.closures,
        )
        self.views = RestViews(
            self.bookings,
            self.loop.history,
            self.predictor_name,
            predictor_degraded,
            self.planner_settings,
            pod=cluster.state.pod,
        )
        self.after_epoch = self.loop.after_epoch
        self.history = self.loop.history

    # -- lifecycle ------------------------------------------------------------------
    def start(self) -> None:
        self.loop.start()

    def stop(self) -> None:
        self.loop.stop()

    def trigger(self) -> None:
        self.loop.trigger()

    def run_epoch(self) -> Plan:
        return self.loop.run_epoch()

    @property
    def has_plan(self) -> bool:
        return self.bookings.latest is not None

    @property
    def ready(self) -> bool:
        return self.loop.ready

    @property
    def last_epoch_error(self) -> str | None:
        return self.loop.last_epoch_error

    @property
    def published(self) -> Published:
        return self.bookings.published

    # -- the parts' answers ------------------------------------------------------------
    def pod_job(self, pod: Mapping[str, Any]) -> PodJob | None:
        return self.pod_jobs.get(pod)

    def build_snapshot(self) -> Built:
        return self.builder.build(self.bookings.pinned())

    def filter(self, pod: Mapping[str, Any], names: Iterable[str]) -> FilterOutcome:
        return self.verbs.filter(pod, names)

    def prioritize(self, pod: Mapping[str, Any], names: Iterable[str]) -> HostScores:
        return self.verbs.prioritize(pod, names)

    def bind(self, namespace: str, name: str, uid: str, node: str) -> str:
        return self.verbs.bind(namespace, name, uid, node)

    def victims(self, node_victims: Mapping[str, list[str]]) -> dict[str, list[str]]:
        return self.verbs.victims(node_victims)

    def assumed_count(self) -> int:
        return len(self.bookings)

    def prices(self) -> dict[str, Any]:
        return self.views.prices()

    def jobs(self) -> list[dict[str, Any]]:
        return self.views.jobs()

    def nodes(self) -> list[dict[str, Any]]:
        return self.views.nodes()

    def forget_family(self, name: str) -> None:
        """Family ``name``'s profile changed (an unprofiled workload was measured): drop
        what was built from the old one (the resolver's family, the pod jobs, the snapshot
        builder's bound-pod records), so the next epoch reads the new."""
        self.families.forget(name)
        self.pod_jobs.forget_family(name)
        self.builder.forget_family(name)

    def plan_summary(self) -> dict[str, Any]:
        return self.views.plan_summary()

    def view_json(self, name: str) -> bytes:
        """GET /jobs, /nodes or /plan (``name``) as JSON, kept until what it shows changes."""
        build = {"jobs": self.jobs, "nodes": self.nodes, "plan": self.plan_summary}[name]
        return self.views.kept(name, build)

    def view_page(self, name: str, limit: int | None, token: str | None) -> bytes:
        """One page of GET /jobs or /nodes (``name``): :meth:`RestViews.page`."""
        build = {"jobs": self.jobs, "nodes": self.nodes}[name]
        return self.views.page(name, build, limit, token)
