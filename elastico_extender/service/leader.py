"""High availability: Lease-based leader election (coordination.k8s.io/v1) for extender replicas.

Kubernetes is the consensus: replicas race for one ``Lease`` object with
``resourceVersion``-conditional updates, as client-go's ``leaderelection`` does:

* **acquire**: the Lease is free (no holder), or its record (holder, renewTime, ...) has
  not changed for ``lease_duration`` seconds *as observed on this replica's own clock*
  (no clock comparison across machines), and our conditional update wins (a concurrent
  candidate gets ``409 Conflict``);
* **renew**: the holder rewrites ``renewTime`` every ``retry_period``; if it cannot renew
  for ``renew_deadline`` seconds, counted from when its last successful renewal was
  *sent* (a follower may see it land at once, however late the answer), it stops leading
  *before* anyone may take over (``renew_deadline < lease_duration``: the margin covers
  the last write in flight);
* **release**: a replica that stops cleanly empties ``holderIdentity`` so a follower takes
  over at its next retry instead of after the lease expires.
* **lost**: a leader that reads another holder stops writing at once; a Lease deleted
  while another replica's claim is alive (by this replica's clock) is left for that
  holder to recreate, so a deletion never makes two leaders.

Every replica watches the cluster and plans (a synced view, its own plan for
filter/prioritize); only the leader writes. :class:`LeaderGatedCluster` wraps the cluster
so that bind, reconfigure and evict raise :class:`NotLeader` (a ``ClusterError``: "not
the leader", nothing written) on a follower: the engine turns that into a clean extender
Error and books nothing, and the scheduler retries the pod.

Hand-over safety: a new leader starts writing only after its view has caught up with a
consistent list of pods taken *after* it acquired the Lease (:func:`view_caught_up`), so
every Binding the old leader made is in the view it plans and binds on: no GPU is
promised twice, and every bound pod's decision (its annotations) is read back.

Takeover time after a leader dies: at most ``lease_duration + retry_period`` plus the
catch-up list (15 + 2 s with the chart's defaults); after a clean stop, ``retry_period``.
"""

from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from elastico_extender.cluster.base import BindRequest, Cluster
from elastico_extender.cluster.kube import KubeCluster
from elastico_extender.cluster.state import ClusterState
from elastico_extender.errors import NotLeader

__all__ = [
    "LEADER_LABEL",
    "CampaigningCluster",
    "LeaderElector",
    "LeaderGatedCluster",
    "LeaseTiming",
    "catch_up_fence",
    "elect",
    "label_own_pod",
    "view_caught_up",
]

log = logging.getLogger(__name__)

LEADER_LABEL = "elastico.io/leader"
"""Set to "true" on the leader's own pod: the chart's extender Service selects it."""


@dataclass(frozen=True)
class LeaseTiming:
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError("need lease_duration > renew_deadline > retry_period > 0")


def view_caught_up(listed: Mapping[str, str], state: ClusterState) -> bool:
    """Whether the watched view holds every pod of a consistent list at least as new.

    ``listed``: uid -> resourceVersion from the list. Versions are compared as integers
    when both are (etcd revisions), else for equality."""
    pods = state.pods()
    for uid, rv in listed.items():
        seen = pods.get(uid)
        if seen is None:
            return False
        mine = str((seen.get("metadata") or {}).get("resourceVersion", ""))
        if mine.isdigit() and rv.isdigit():
            if int(mine) < int(rv):
                return False
        elif mine != rv:
            return False
    return True


class LeaderElector:
    """One replica's side of the election; ``run`` in a thread, ``is_leader`` anywhere."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        name: str,
        namespace: str,
        identity: str | None = None,
        timing: LeaseTiming | None = None,
        on_started: Callable[[], bool] | None = None,
        on_stopped: Callable[[], None] | None = None,
        on_following: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = client.CoordinationV1Api(api_client)
        self.name = name
        self.namespace = namespace
        self.identity = identity or socket.gethostname()
        self.timing = timing or LeaseTiming()
        self.on_started = on_started
        self.on_stopped = on_stopped
        self.on_following = on_following
        self.clock = clock
        self._leading = False
        self._last_renew = float("-inf")
        self._observed: tuple[Any, ...] | None = None
        self._observed_at = float("-inf")
        self._other_until = float("-inf")  # another holder's claim, by our clock
        self.holder: str = ""
        self.transitions = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def _timeout(self) -> float:
        """Per Lease request: no answer for a renew deadline is as good as a refusal."""
        return self.timing.renew_deadline

    # -- the gate ------------------------------------------------------------------
    def is_leader(self) -> bool:
        """Leading, and the last renewal is younger than the renew deadline."""
        return self._leading and self.clock() < self._last_renew + self.timing.renew_deadline

    # -- one step ------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        """client-go's tryAcquireOrRenew: True when we hold the Lease after this call."""
        # The claim runs from before the request: a follower may see the write the moment
        # it lands, whenever our answer comes (a pause, a slow network back).
        sent = self.clock()
        now = datetime.now(UTC)
        seconds = max(1, math.ceil(self.timing.lease_duration))  # never below our claim
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 404:
                log.warning("leader.read_failed", extra={"error": exc.reason})
                return False
            if self.clock() < self._other_until:
                # Deleted (an admin) while another replica's claim is alive: that holder
                # recreates it; taking it now would make two leaders.
                return False
            body = client.V1Lease(
                metadata=client.V1ObjectMeta(name=self.name, namespace=self.namespace),
                spec=client.V1LeaseSpec(
                    holder_identity=self.identity,
                    lease_duration_seconds=seconds,
                    acquire_time=now,
                    renew_time=now,
                    lease_transitions=0,
                ),
            )
            try:
                self.api.create_namespaced_lease(
                    self.namespace, body, _request_timeout=self._timeout
                )
            except ApiException:
                return False  # another candidate created it first
            self._renewed(sent)
            return True
        record = lease.spec or client.V1LeaseSpec()
        key = (record.holder_identity, record.renew_time, record.lease_transitions)
        if key != self._observed:
            self._observed, self._observed_at = key, self.clock()
        holder = record.holder_identity or ""
        self.holder = holder
        duration = float(record.lease_duration_seconds or self.timing.lease_duration)
        other = bool(holder) and holder != self.identity
        self._other_until = self._observed_at + duration if other else float("-inf")
        if other and self.clock() < self._other_until:
            return False  # held by another replica, not expired
        transitions = int(record.lease_transitions or 0)
        if holder != self.identity:
            record.acquire_time = now
            transitions += 1
        record.holder_identity = self.identity
        record.lease_duration_seconds = seconds
        record.renew_time = now
        record.lease_transitions = transitions
        lease.spec = record
        try:  # conditional on the resourceVersion we read: a racing writer gets 409
            self.api.replace_namespaced_lease(
                self.name, self.namespace, lease, _request_timeout=self._timeout
            )
        except ApiException as exc:
            if exc.status != 409:
                log.warning("leader.update_failed", extra={"error": exc.reason})
            return False
        self._renewed(sent)
        self.transitions = transitions
        return True

    def _renewed(self, sent: float) -> None:
        self._last_renew = sent
        self.holder = self.identity

    def step(self) -> None:
        """One retry period's work: acquire or renew, start or stop leading."""
        with self._lock:
            try:
                held = self.try_acquire_or_renew()
            except Exception as exc:  # no answer (urllib3's errors are not ApiException)
                log.warning("leader.api_unreachable", extra={"error": repr(exc)})
                held = False  # as a refused renewal: step down at the renew deadline
            if held and not self._leading:
                # Lead only once the view has caught up (the on_started fence).
                if self.on_started is None or self.on_started():
                    self._leading = True
                    log.info("leader.started", extra={"identity": self.identity})
            elif not held and self._leading and not self._may_go_on():
                self._stop_leading()
            if not self._leading and self.on_following is not None:
                self.on_following()

    def _may_go_on(self) -> bool:
        """After a failed renewal: a renewal may fail now and then within the renew
        deadline, but a Lease another replica holds means that replica leads."""
        return self.is_leader() and self.holder in ("", self.identity)

    def _stop_leading(self) -> None:
        self._leading = False
        log.warning("leader.stopped", extra={"identity": self.identity})
        if self.on_stopped is not None:
            self.on_stopped()

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="leader-election", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # the election must outlive any one failed call
                log.exception("leader.step_failed")
            self._stop.wait(self.timing.retry_period)

    def stop(self, release: bool = True) -> None:
        """Stop campaigning; when leading and ``release``, free the Lease for a follower."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        with self._lock:
            if self._leading:
                self._stop_leading()
                if release:
                    self._release()

    def _release(self) -> None:
        try:
            lease = self.api.read_namespaced_lease(
                self.name, self.namespace, _request_timeout=self._timeout
            )
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = ""
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = datetime.now(UTC)
                self.api.replace_namespaced_lease(
                    self.name, self.namespace, lease, _request_timeout=self._timeout
                )
        except ApiException as exc:
            log.warning("leader.release_failed", extra={"error": exc.reason})
        except Exception as exc:  # no answer: followers take over when the Lease expires
            log.warning("leader.release_failed", extra={"error": repr(exc)})


class LeaderGatedCluster:
    """A :class:`Cluster` whose writes happen only while ``is_leader()`` holds."""

    def __init__(self, inner: Cluster, is_leader: Callable[[], bool], holder: Callable[[], str]):
        self.inner = inner
        self.is_leader = is_leader
        self.holder = holder
        if isinstance(inner, KubeCluster):  # checked again between a bind's two writes
            inner.may_write = self._check

    @property
    def state(self) -> ClusterState:
        return self.inner.state

    @property
    def description(self) -> str:
        return self.inner.description

    def start(self) -> None:
        self.inner.start()

    def stop(self) -> None:
        self.inner.stop()

    def _check(self, what: str) -> None:
        if not self.is_leader():
            holder = self.holder() or "none yet"
            raise NotLeader(
                f"this replica is not the ElastiCo leader (Lease holder: {holder}); "
                f"{what} is retried on the leader"
            )

    def bind(self, request: BindRequest) -> None:
        self._check("bind")
        self.inner.bind(request)

    def reconfigure(self, request: BindRequest) -> None:
        self._check("reconfigure")
        self.inner.reconfigure(request)

    def evict(self, namespace: str, name: str, uid: str) -> None:
        self._check("evict")
        self.inner.evict(namespace, name, uid)

    def __getattr__(self, name: str) -> Any:  # wait_synced, relists, ...: the inner cluster's
        return getattr(self.inner, name)


def catch_up_fence(
    core: client.CoreV1Api, state: ClusterState, timeout: float
) -> Callable[[], bool]:
    """on_started hook: list pods (a consistent read, after the Lease was won) and wait
    until the watched view holds each of them at least as new; False on time-out (the
    replica then tries again at its next retry instead of leading on a stale view)."""

    def fence() -> bool:
        try:
            pods = core.list_pod_for_all_namespaces(_preload_content=False, _request_timeout=30)
            items = json.loads(pods.data).get("items") or []  # type: ignore[attr-defined]
        except Exception as exc:  # no answer, or not a pod list: not caught up, retried
            log.warning("leader.catch_up_list_failed", extra={"error": repr(exc)[:500]})
            return False
        listed = {
            str(p["metadata"].get("uid", "")): str(p["metadata"].get("resourceVersion", ""))
            for p in items
        }
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if view_caught_up(listed, state):
                return True
            time.sleep(0.02)
        log.warning("leader.view_behind", extra={"pods": len(listed)})
        return False

    return fence


def label_own_pod(
    core: client.CoreV1Api, namespace: str, pod: str, leading: bool, timeout: float = 30
) -> bool:
    """Mark (or unmark) this replica's pod with :data:`LEADER_LABEL` for the Service;
    False when it should be tried again (no answer, or the API server failed)."""
    body = {"metadata": {"labels": {LEADER_LABEL: "true" if leading else None}}}
    try:
        core.patch_namespaced_pod(pod, namespace, body, _request_timeout=timeout)
    except ApiException as exc:  # outside a pod (tests, a laptop): nothing to label
        log.info("leader.label_skipped", extra={"pod": pod, "error": exc.reason})
        return exc.status is not None and exc.status < 500
    except Exception as exc:  # no answer: the follower tries again at its next retry
        log.warning("leader.label_failed", extra={"pod": pod, "error": repr(exc)})
        return False
    return True


def elect(
    cluster: Any,
    api_client: client.ApiClient,
    *,
    name: str,
    namespace: str,
    identity: str | None,
    timing: LeaseTiming,
    label_pod: bool = True,
) -> tuple[LeaderElector, LeaderGatedCluster]:
    """Wire a KubeCluster for HA: an elector whose fence reads ``cluster.state``, and the
    gated cluster whose start/stop also start and stop the campaign."""
    core = client.CoreV1Api(api_client)
    elector = LeaderElector(
        api_client, name=name, namespace=namespace, identity=identity, timing=timing
    )
    fence = catch_up_fence(core, cluster.state, timing.renew_deadline)
    # Whether our pod may carry the label. At start it may: a container restarted in the
    # pod of a leader that was killed, or one that could not unlabel when it stepped down.
    # A follower takes it off (retried every step until done): the Service selects every
    # labelled pod, and one that refuses binds and windows must not get them.
    labelled = [label_pod]

    def label(leading: bool) -> None:
        done = label_own_pod(core, namespace, elector.identity, leading, timing.renew_deadline)
        labelled[0] = leading or not done

    def started() -> bool:
        if not fence():
            return False
        if label_pod:
            label(True)
        return True

    def following() -> None:
        if labelled[0]:
            label(False)

    elector.on_started = started
    elector.on_stopped = following
    elector.on_following = following
    gated = CampaigningCluster(cluster, elector)
    return elector, gated


class CampaigningCluster(LeaderGatedCluster):
    """The gated cluster that also runs the election from ``start`` to ``stop``."""

    def __init__(self, inner: Cluster, elector: LeaderElector) -> None:
        super().__init__(inner, elector.is_leader, lambda: elector.holder)
        self.elector = elector

    def start(self) -> None:
        self.inner.start()
        self.elector.start()

    def stop(self) -> None:
        self.elector.stop(release=True)
        self.inner.stop()
