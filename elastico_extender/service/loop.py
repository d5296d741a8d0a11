"""The epoch loop: snapshot -> PDS plan -> placement view, published every ``epoch_seconds``.

One background thread (spec 3.4, Algorithm 1) plans on the cluster view as
the :class:`SnapshotBuilder` reads it and publishes the plan and a fresh
:class:`PlacementView` through :class:`Bookings`; the :class:`Actuator` writes
what the plan changed for running pods.

Readiness means "synced and planned on the synced view" (issue 12 item 2): a
plan made before the cluster view synced does not count, and the loop replans
as soon as the view has synced, or a node was added or removed, instead of
waiting out the interval.  ``is_leader`` gates planning writes when replicas
share a cluster (only the leader's actuator reshapes running pods).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Container
from typing import Any, Protocol

from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.model import Action, Plan
from elastico_extender.core.planner import NodeVerdict, PlacementView, plan
from elastico_extender.core.resources import GPU_MEM
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import ElasticoError
from elastico_extender.service.actuator import Actuator
from elastico_extender.service.bookings import Bookings, Published
from elastico_extender.service.pods import PodJob
from elastico_extender.service.snapshot import Built, SnapshotBuilder

__all__ = ["POLL_SECONDS", "EpochLoop", "EpochMetrics"]

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""How often the loop looks for a reason to plan before the interval ends (a sync,
a node added or removed): a comparison of two counters."""


class EpochMetrics(Protocol):
    def epoch(self, seconds: float, plan: Plan) -> None: ...


class EpochLoop:
    """Runs PDS epochs and publishes them (see the module docstring)."""

    def __init__(
        self,
        builder: SnapshotBuilder,
        bookings: Bookings,
        actuator: Actuator,
        *,
        epoch_seconds: float,
        price_history: int,
        planner_settings: PlannerSettings,
        predictor: SlowdownPredictor | None,
        metrics: EpochMetrics,
        clock: Callable[[], float],
        is_leader: Callable[[], bool] = lambda: True,
    ) -> None:
        self.builder = builder
        self.bookings = bookings
        self.actuator = actuator
        self.epoch_seconds = epoch_seconds
        self.planner_settings = planner_settings
        self.predictor = predictor
        self.metrics = metrics
        self.clock = clock
        self.is_leader = is_leader
        self.history: deque[dict[str, Any]] = deque(maxlen=price_history)
        self.last_epoch_error: str | None = None
        # Called in the epoch thread after each published epoch (serve adds the
        # garbage-collector policy of service.gc_policy).
        self.after_epoch: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._checked_generation = -1
        self._epoch_lock = threading.Lock()

    # -- state -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Planned on a synced cluster view (and that view is still synced)."""
        pub = self.bookings.latest
        return pub is not None and pub.synced and self.builder.state.is_synced

    def stale(self) -> bool:
        """Whether the published view lags the cluster view in a way that answers
        notice at once: no plan, a plan from before the sync, or other nodes.  The epoch
        thread's poll: a node generation looked at once is not looked at again (an epoch
        that failed on it is not retried at once, nor a heartbeat compared twice)."""
        return self._lags(remember=True)

    def _lags(self, *, remember: bool) -> bool:
        pub = self.bookings.latest
        state = self.builder.state
        if pub is None:
            return True
        if not pub.synced and state.is_synced:
            return True
        generation = state.node_generation
        if generation == pub.node_generation or (
            remember and generation == self._checked_generation
        ):
            return False
        # A node event: a heartbeat parses to the same nodes (the same tuple), a node
        # added, removed or resized does not.
        if remember:
            self._checked_generation = generation
        return self.builder.nodes() is not pub.snapshot.nodes

    def _poll(self) -> bool:
        """:meth:`stale` for the epoch thread's wait, which no error may end: a failure
        is logged and answered "plan now", so the epoch's own guard reports it."""
        try:
            return self.stale()
        except Exception:
            log.exception("epoch.poll_failed")
            return True

    def refresh(self) -> bool:
        """Plan now if the published view lags the cluster view (a verb asked about a
        node the view lacks); returns whether an epoch ran.  Whatever the epoch thread's
        poll has seen: it may be planning on the new nodes now, and then that plan is
        waited for instead of made twice."""
        if not self._lags(remember=False):
            return False
        with self._epoch_lock:
            if not self._lags(remember=False):
                return False  # the epoch thread published a plan on the new nodes
            self._run()
        return True

    # -- one epoch ---------------------------------------------------------------------
    def run_epoch(self) -> Plan:
        """One PDS epoch over the current view; publishes the plan and a fresh view.

        Binds go on while it plans: :meth:`Bookings.publish` counts the bookings made
        meanwhile in the new view.  Reconfigurations that free memory are written
        before the publish; the rest after it."""
        with self._epoch_lock:  # the epoch thread and a verb's refresh: one at a time
            return self._run()

    def _run(self) -> Plan:
        """:meth:`run_epoch`'s work; call with ``_epoch_lock`` held."""
        for _ in range(3):
            published = self._epoch()
            if published is not None:
                return published
        raise RuntimeError("bookings kept colliding with the plan; the old view stays")

    def _epoch(self) -> Plan | None:
        started = time.perf_counter()
        bookings = self.bookings
        built = self.builder.build(bookings.pinned())
        bookings.settle(built.confirmed, self.clock())
        previous = bookings.latest
        try:
            new_plan = plan(
                built.snapshot,
                previous.plan if previous is not None else None,
                settings=self.planner_settings,
                predictor=self.predictor,
                timer=time.perf_counter,
            )
        except ElasticoError as exc:
            self.last_epoch_error = str(exc)
            log.error("epoch.invalid", extra={"error": str(exc)})
            raise
        view = PlacementView(built.snapshot, new_plan, self.planner_settings, self.predictor)
        elapsed = time.perf_counter() - started
        nodes = {n.name: n for n in built.snapshot.nodes}
        leading = self.is_leader()
        refused: set[str] = set()
        if leading:
            refused = self.actuator.shrink(new_plan, built.pods, nodes, bookings.pinned())
        pending = frozenset(j.id for j in built.snapshot.jobs if not j.running)
        moves = self.actuator.moves(new_plan, built.pods, bookings.pinned()) if leading else set()
        held = self._held_back(new_plan, built, refused)
        moves -= held
        in_place = self._unmoved(new_plan, built, moves, refused)
        published = Published(
            built.snapshot,
            new_plan,
            view,
            built.pods,
            time.time(),
            elapsed * 1000.0,
            built.invalid,
            built.synced,
            built.node_generation,
            pending,
        )
        with bookings.serial:
            if not bookings.publish(published, pending, in_place, built.in_snapshot):
                return None  # a booking collided with the plan: plan again
            booked = bookings.pinned()
        self.last_epoch_error = None
        if leading:
            skip = set(booked) | held if held else booked
            self.actuator.apply(new_plan, built.pods, nodes, skip, moves)
            if nodes:  # a view without nodes yet (startup) says nothing about a pod
                self.actuator.announce_rejected(new_plan, built.pods)
        self.history.append(
            {"epoch": built.snapshot.epoch, "time": time.time(), "prices": new_plan.price_map()}
        )
        self.metrics.epoch(elapsed, new_plan)
        return new_plan

    @staticmethod
    def _held_back(plan: Plan, built: Built, refused: set[str]) -> set[str]:
        """The jobs a refused shrink holds back: those refused (they run as before), and
        any the plan grows or moves onto the devices they still fill, so no write counts
        on memory that was never freed."""
        if not refused:
            return set()
        jobs = {j.id: j for j in built.snapshot.jobs}
        full = {ref for j in refused if j in jobs for ref in jobs[j].devices}
        return refused | {
            a.job_id
            for a in plan.changed()
            if a.action in (Action.RECONFIGURE, Action.MIGRATE) and full.intersection(a.devices)
        }

    @staticmethod
    def _unmoved(
        plan: Plan, built: Built, moves: set[str], refused: Container[str] = ()
    ) -> list[tuple[PodJob, NodeVerdict]]:
        """The plan's migrations nobody will carry out, and the shrinks the API server
        refused (``refused``), as placements where and as the pods run now (the view
        must count a pod as it is, not as the plan wished)."""
        # Moves and requeues (preempted running pods) nobody carries out: the pod stays.
        stay = [
            (a.job_id, a.predicted_slowdown, a.tolerance)
            for a in plan.changed()
            if (a.action is Action.MIGRATE and a.job_id not in moves) or a.job_id in refused
        ]
        stay += [(j, 1.0, 1.0) for j in plan.preempted if j not in moves]
        if not stay:
            return []
        jobs = {j.id: j for j in built.snapshot.jobs}
        kept = []
        for job_id, slowdown, tolerance in stay:
            job, pj = jobs.get(job_id), built.pods.get(job_id)
            if job is None or pj is None or not job.devices or job.current_config is None:
                continue
            verdict = NodeVerdict(
                job.devices[0][0],
                True,
                config_index=job.current_config,
                devices=job.devices,
                predicted_slowdown=slowdown,
                tolerance=tolerance,
                memory_budget_mib=float(pj.family.resources[job.current_config, GPU_MEM]),
            )
            kept.append((pj, verdict))
        return kept

    # -- the thread ----------------------------------------------------------------------
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
            deadline = time.monotonic() + self.epoch_seconds
            while not self._stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0 or self._wake.wait(min(left, POLL_SECONDS)) or self._poll():
                    break
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.run_epoch()
                for hook in self.after_epoch:
                    hook()
            except Exception:  # the loop must survive anything; the error is reported
                log.exception("epoch.failed")
