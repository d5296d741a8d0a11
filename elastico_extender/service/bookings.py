"""The published view and the placements booked on it: the one serialised bind path.

:class:`Bookings` owns two things and nothing else:

* the latest :class:`Published` plan and placement view (the epoch loop hands a
  new one to :meth:`Bookings.publish`; the verbs read it);
* the **bookings**: placements bind has counted against capacity and the watch
  has not yet shown as bound (kube-scheduler's "assumed pods").

Two locks, always taken in this order:

``serial``
    one booking at a time (bind's :meth:`book`), and the epoch's :meth:`publish`,
    which replays onto the new view every booking made while it planned (binds
    never wait for planning, only for a publish);
``lock``
    the view itself: short sections only (an answer, a booking, a publish).

A booking is per pod UID and idempotent (issue 12 item 1): the same node again
returns the same booking; another node is refused and the first kept.  A
booking goes only when the watch confirms the pod bound, when it expires, or
when its write failed for certain (:meth:`release`) -- never on a retry.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Container, Iterable, Sequence
from dataclasses import dataclass, field
from typing import NoReturn

from elastico_extender.core.model import Plan, Snapshot
from elastico_extender.core.planner import NodeVerdict, PlacementView
from elastico_extender.service.pods import PodJob

__all__ = ["AlreadyPlaced", "Booking", "Bookings", "Published", "Refused"]

log = logging.getLogger(__name__)


@dataclass
class Published:
    """One epoch's output, as the verbs and the REST views read it."""

    snapshot: Snapshot
    plan: Plan
    view: PlacementView
    pods: dict[str, PodJob]
    published_at: float
    epoch_ms: float
    invalid: dict[str, str]
    synced: bool = True  # planned on a cluster view that had synced
    node_generation: int = -1  # the cluster view's node generation it was planned on
    pending: frozenset[str] = frozenset()  # jobs the snapshot holds as pending


@dataclass(eq=False)
class Booking:
    """A placement bind counted against capacity. ``outcome``: None until a write
    succeeded or failed for certain; "" once the Binding was written."""

    pod_job: PodJob
    verdict: NodeVerdict
    booked_at: float
    expires: float
    write_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    outcome: str | None = None


class Refused(Exception):
    """A bind the bookings refuse; ``message`` goes to the extender's Error field."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class AlreadyPlaced(Refused):
    """The pod is booked or bound on the node asked for already: nothing to do."""


class Bookings:
    """The published view and the bookings on it (see the module docstring)."""

    def __init__(self, clock: Callable[[], float], ttl_seconds: float) -> None:
        self.clock = clock
        self.ttl_seconds = ttl_seconds
        self.serial = threading.Lock()
        self.lock = threading.Lock()
        self.version = 0  # bumps whenever the view changes (publish, book, release)
        self._bookings: dict[str, Booking] = {}
        self._settled: dict[str, str] = {}  # confirmed since the last publish: uid -> node
        self._published: Published | None = None

    # -- reading ---------------------------------------------------------------------
    @property
    def published(self) -> Published:
        pub = self._published
        if pub is None:
            raise RuntimeError("no plan published yet")
        return pub

    @property
    def latest(self) -> Published | None:
        return self._published

    def current(self) -> tuple[Published, dict[str, Booking], int]:
        """The published view, the bookings (a copy) and :attr:`version`, read together."""
        with self.lock:
            return self.published, dict(self._bookings), self.version

    def pinned(self) -> dict[str, Booking]:
        """The bookings now, by pod UID (a copy)."""
        with self.lock:
            return dict(self._bookings)

    def __len__(self) -> int:
        return len(self._bookings)

    def get(self, uid: str) -> Booking | None:
        return self._bookings.get(uid)

    def held_verdict(
        self, pub: Published, pj: PodJob, node: str, held: tuple[tuple[str, int], ...]
    ) -> NodeVerdict:
        """The verdict for a job the view already holds on ``node`` (the plan's own
        choice ranks first); call with ``lock`` held."""
        booking = self._bookings.get(pj.job.id)
        if booking is not None and booking.verdict.node == node:
            return booking.verdict
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
            score=-math.inf,
            memory_budget_mib=a.memory_budget_mib,
        )

    # -- booking ---------------------------------------------------------------------
    def book(self, pj: PodJob, node: str) -> Booking:
        """Count ``pj`` on ``node`` against capacity, or the booking it already has
        there; raises :class:`Refused`.  Call with ``serial`` held."""
        job = pj.job
        with self.lock:
            existing = self._bookings.get(job.id)
            if existing is not None:
                if existing.verdict.node != node:
                    already_bound(pj, existing.verdict.node, node)
                return existing
            pub = self.published
            view = pub.view
            if job.id in self._settled:  # confirmed after the view was planned
                already_bound(pj, self._settled[job.id], node)
            held = view.devices_of(job.id) if view.holds(job.id) else ()
            if held and not (job.id in pub.pending and job.id not in view.assumed):
                # Booked or bound already (the caller read a stale pod object).
                already_bound(pj, held[0][0], node)
            if held and held[0][0] == node:  # the plan's own proposal
                verdict = self.held_verdict(pub, pj, node, held)
            else:
                if held:  # the plan proposed another node: a proposal, not a booking
                    view.forget(job.id)
                    self.version += 1
                verdict = view.evaluate(job, pj.family, [node])[node]
                if not verdict.feasible:
                    raise Refused(f"elastico: node {node} cannot take {pj.key}: {verdict.reason}")
                view.assume(job, pj.family, verdict)
            now = self.clock()
            booking = Booking(pj, verdict, now, now + self.ttl_seconds)
            self._bookings[job.id] = booking
            self.version += 1
            return booking

    def release(self, booking: Booking) -> None:
        """Drop a booking whose write failed for certain, and free its devices."""
        uid = booking.pod_job.job.id
        with self.lock:
            if self._bookings.get(uid) is not booking:
                return
            del self._bookings[uid]
            if self._published is not None:
                self._published.view.forget(uid)
            self.version += 1

    def settle(self, confirmed: set[str], now: float) -> None:
        """Drop bookings the watch shows bound (``confirmed``) and expired ones.

        A confirmed pod stays known as bound where it was booked until the next
        publish: the view published now may still hold it as the plan's pending
        proposal, and a retried bind that read the pod before the watch showed it
        bound must not book it again."""
        with self.lock:
            for uid, b in list(self._bookings.items()):
                if uid in confirmed:
                    self._settled[uid] = b.verdict.node
                    del self._bookings[uid]
                elif b.expires <= now:
                    log.info("booking.expired", extra={"pod": b.pod_job.key})
                    del self._bookings[uid]

    # -- publishing ------------------------------------------------------------------
    def publish(
        self,
        pub: Published,
        pending: Container[str],
        in_place: Sequence[tuple[PodJob, NodeVerdict]] = (),
        counted: Iterable[str] = (),
    ) -> bool:
        """Make ``pub`` the view the verbs read, every booking counted in it exactly
        where it was booked; call with ``serial`` held (no booking in flight).

        ``counted``: the bookings the snapshot held as running (``Built.in_snapshot``).
        One released or expired while the epoch planned is no longer a booking, so the
        view does not hold its pod either (a retried bind would read "already placed"
        and write nothing).

        A booking made while the epoch planned may collide with the plan's proposal
        for a pending pod (``pending``: ids the snapshot holds as pending): a booking
        is real, a proposal is not, so the proposal goes.  If a booking still does
        not fit (the plan grew or moved a running pod onto it), nothing is published
        and False is returned: the old view, which counts every booking, stays."""
        view = pub.view
        with self.lock:
            for uid in counted:
                if uid not in self._bookings:
                    view.forget(uid)
            for pj, verdict in in_place:  # moves the plan wants and nobody will make
                view.forget(pj.job.id)
                self._place(view, pj, verdict, pending, force=True)
            for uid, b in self._bookings.items():
                if uid not in pending and self._kept(view, uid, b.verdict):
                    continue  # in the snapshot, held in its configuration: the plan kept it
                view.forget(uid)  # booked while the epoch planned: the plan's proposal goes
                try:
                    view.assume(b.pod_job.job, b.pod_job.family, b.verdict)
                    continue
                except ValueError:
                    pass
                for other in view.jobs_on(b.verdict.devices):
                    if other in pending and other not in self._bookings:
                        view.forget(other)
                try:
                    view.assume(b.pod_job.job, b.pod_job.family, b.verdict)
                except ValueError as exc:
                    log.warning("booking.replay", extra={"pod": b.pod_job.key, "error": str(exc)})
                    return False
            self._published = pub
            self._settled.clear()  # the new view holds every confirmed pod as running
            self.version += 1
            return True

    @staticmethod
    def _kept(view: PlacementView, uid: str, verdict: NodeVerdict) -> bool:
        """Whether ``view`` counts a booked pod where and as it was booked.  The
        actuator does not reshape a booked pod, so a plan that did must give way."""
        if view.devices_of(uid) != verdict.devices:
            return False
        return verdict.config_index < 0 or view.config_of(uid) == verdict.config_index

    def _place(
        self,
        view: PlacementView,
        pj: PodJob,
        verdict: NodeVerdict,
        pending: Container[str],
        *,
        force: bool,
    ) -> bool:
        """Count ``pj`` where ``verdict`` says in ``view``; proposals for pending pods on
        those devices give way; ``force``: count it even if it still does not fit."""
        try:
            view.assume(pj.job, pj.family, verdict)
            return True
        except ValueError:
            pass
        for other in view.jobs_on(verdict.devices):
            if other in pending and other not in self._bookings:
                view.forget(other)
        try:
            view.assume(pj.job, pj.family, verdict, force=force)
            return True
        except ValueError:
            return False


def already_bound(pj: PodJob, bound: str, node: str) -> NoReturn:
    """Refuse a bind of a pod booked or bound on ``bound`` already (a retry when
    ``bound`` is ``node``: nothing to do)."""
    if bound == node:
        raise AlreadyPlaced(f"pod {pj.key} is already bound to {node}")
    raise Refused(
        f"elastico: pod {pj.key} is already bound to {bound}; "
        f"not binding it to {node} (the first placement is kept)"
    )
