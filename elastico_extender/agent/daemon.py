"""The agent's loop: every window, one observation per pod on this node, posted at once.

Per pod (running on this node, uid from the API server):

* progress rate: the framework counter it declares (``elastico.io/progress-metrics``),
  else kernel launches/s from its shim rings (:mod:`.rings`); a pod with neither is not
  reported (the planner then treats it as unobserved);
* peak GPU memory: the shim's peak device bytes over the pod's processes;
* SM activity: the mean over the pod's assigned GPUs (``elastico.io/assigned-devices``)
  of DCGM's SM_ACTIVE or NVML's utilisation (a device metric: on a shared GPU it is the
  device's activity, both tenants together);
* configuration: the pod's ``elastico.io/assigned-configuration``, so the extender refuses
  a window measured under a configuration the pod no longer runs.

Restarts: a pod's window is not reported when its rings show a CUDA process starting,
beginning to launch kernels or stopping in it, or none alive that has launched one
(:attr:`~.rings.PodLaunches.steady`: ``elastico-run`` restarting the workload under a new
configuration, a container restart, the gap before the first CUDA call, a model loading
before the first launch): such a window adds up two runs' rates, or a pause, and is no
slowdown.  A process that never launched a kernel (a helper) changes no window.  Nor is
the window after one with no progress at all (a model loading, a checkpoint write, an
idle server): progress began again part-way through it, so it holds part of the pause
and would read as a slowdown; the window of no progress itself is reported (rate 0, a
pause to the extender).
Nor while ``elastico-run`` says the workload still runs another configuration than the
pod's ``elastico.io/assigned-configuration`` (:attr:`~.rings.PodLaunches.configurations`):
the kubelet brings a new decision into the pod's annotations file a minute or so after the
extender wrote it, and until the workload restarts under it, its rate is the old
configuration's, which measured against the new one's solo rate reads as a false slowdown
(a step up) or a false relief (a step down), and alone, would teach the new
configuration's reference the old one's rate.

A pod's window is marked ``mixed`` when a pod on one of its GPUs ran its current run,
under the configuration it is assigned, for less than two thirds of the window
(``MIN_SHARED_SHARE``; :func:`_run_share`): it started its processes, or began
launching, late in the window (from :attr:`~.rings.PodLaunches.running_since`), has none
alive that launched, still runs its previous
configuration, restarted its framework counter, or left the node since the last window.
The pod ran largely alone while the extender labels the window as shared with that pod
(a falsely mild pair sample) or, once it is gone, as alone (a slow solo window); the
extender counts a mixed window's slowdown (which understates the partner's harm, never
overstates it) and learns nothing from it (``core/observations.py``).

Warm-up: a run's first ``WARMUP_SECONDS`` (30 s) after it began launching kernels
(:attr:`~.rings.PodLaunches.running_since`), or the pod's ``elastico.io/warmup-seconds``,
are not measured.  Its first steps autotune kernels, fill the allocator's cache and wait
for the data loader, so their rate is not its rate: taken alone, they would set the job's
solo reference (and its family's) low, and a partner's harm measured against it would
hide; taken shared, they read as a slowdown.  While a pod warms up, its own windows are
not reported and its co-tenants' are marked ``mixed`` as for a run that began late in the
window (the warm-up counts as no part of its run).  A job that compiles for minutes
(``torch.compile``) says so in its annotation.

Windows refused for a passing reason (a follower's 503 while the leader changes) are held
by the :class:`~.reporter.Reporter` and resent with the next window, bounded and only
while the extender would still take them.  A window whose pod listing fails (the API
server out of reach) has no items but is still reported, so held windows go out.

Ring directories of pods that left the node are removed after ``ORPHAN_SECONDS`` (the
legacy hostPath mode; the kubelet removes a pod's emptyDir itself).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from elastico_extender.agent.framework import Fetch, read_counter, scrape
from elastico_extender.agent.reporter import Reporter
from elastico_extender.agent.rings import PodLaunches, PodRings
from elastico_extender.agent.window import CounterRates
from elastico_extender.annotations import (
    PREFIX,
    PROGRESS_METRICS,
    WARMUP,
    ProgressEndpoint,
    parse_progress_metrics,
    parse_warmup_seconds,
    read_decision,
)
from elastico_extender.core.observations import MIN_SHARED_SHARE
from elastico_extender.profiling.hardware import HardwareSample

__all__ = ["WARMUP_SECONDS", "Agent", "PodInfo", "pod_info"]

log = logging.getLogger(__name__)

ORPHAN_SECONDS = 120.0
"""A ring directory whose pod is gone from the node for this long is deleted, seconds."""
WARMUP_SECONDS = 30.0
"""Seconds after a run's first kernel launch that are not measured, unless the pod says
otherwise (``elastico.io/warmup-seconds``; module doc, "Warm-up"): a first step that
autotunes kernels (cuDNN's benchmark mode), fills the allocator's cache or waits for the
data loader's first batches runs at another rate than the steps after it."""
MAX_SCRAPES_AT_ONCE = 16
"""Framework metrics endpoints read at the same time in one window (a node runs a few
dozen pods at most; each scrape is bounded in bytes and time)."""


@dataclass(frozen=True, slots=True)
class PodInfo:
    uid: str
    key: str
    ip: str | None
    devices: tuple[int, ...]
    configuration: str | None
    progress: ProgressEndpoint | None
    warmup_seconds: float | None = None
    """Its ``elastico.io/warmup-seconds`` (None: the agent's default)."""


def pod_info(pod: Mapping[str, Any]) -> PodInfo | None:
    """The agent's view of a Pod object (JSON form); None without a uid."""
    meta = pod.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if not uid:
        return None
    annotations = meta.get("annotations") or {}
    decision = read_decision(annotations)
    progress = None
    raw = annotations.get(PREFIX + PROGRESS_METRICS)
    if raw:
        try:
            progress = parse_progress_metrics(str(raw))
        except ValueError as exc:
            log.info("pod.progress_annotation_invalid", extra={"pod": uid, "error": str(exc)})
    warmup = None
    raw = annotations.get(PREFIX + WARMUP)
    if raw is not None:
        try:
            warmup = parse_warmup_seconds(str(raw))
        except ValueError as exc:  # admission refuses it; a pod admitted before may carry it
            log.info("pod.warmup_annotation_invalid", extra={"pod": uid, "error": str(exc)})
    return PodInfo(
        uid=uid,
        key=f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}",
        ip=(pod.get("status") or {}).get("podIP"),
        devices=decision.devices if decision else (),
        configuration=(decision.configuration or None) if decision else None,
        progress=progress,
        warmup_seconds=warmup,
    )


def _run_share(
    pod: PodInfo,
    launches: PodLaunches | None,
    began_again: bool,
    start: float | None,
    now: float,
    warmup: float,
) -> float:
    """The share of the window ``[start, now]`` in which the pod ran its current run, warmed
    up (``warmup`` seconds after it began launching), under the configuration it is
    assigned (module doc, "Restarts", "Warm-up"); 1.0 where nothing says otherwise (no
    rings, the agent's first window)."""
    if began_again:
        return 0.0  # a framework counter that went back: when it restarted is unknown
    if launches is None or start is None or now <= start:
        return 1.0
    if launches.running_since is None or _lags(pod, launches):
        return 0.0
    warm = launches.running_since + warmup
    return min(1.0, max(0.0, (now - max(warm, start)) / (now - start)))


def _lags(pod: PodInfo, launches: PodLaunches) -> bool:
    """Whether ``elastico-run`` says the workload runs another configuration than the one
    the pod is assigned (the decision has not reached it yet)."""
    return pod.configuration is not None and bool(launches.configurations - {pod.configuration})


def _one_run(pod: PodInfo, launches: PodLaunches | None, share: float) -> bool:
    """Whether the pod's window measures one run of its workload, warmed up, under the
    configuration it is assigned (module doc, "Restarts", "Warm-up"); ``share``: its
    :func:`_run_share`."""
    if launches is not None and not launches.steady:
        log.debug("window.unsteady", extra={"pod": pod.key})
        return False
    if launches is not None and _lags(pod, launches):
        log.debug("window.decision_not_yet_applied", extra={"pod": pod.key})
        return False
    if share < 1.0:
        log.debug("window.warming_up", extra={"pod": pod.key})
        return False
    return True


class Agent:
    def __init__(
        self,
        node: str,
        pods: Callable[[], list[PodInfo]],
        rings: PodRings,
        reporter: Reporter,
        *,
        hardware: Callable[[int], HardwareSample | None] = lambda _: None,
        fetch: Fetch = scrape,
        clock: Callable[[], float] = time.time,
        warmup_seconds: float = WARMUP_SECONDS,
    ) -> None:
        self.node = node
        self.warmup_seconds = warmup_seconds
        """Seconds of a run's warm-up not measured, for a pod that does not say (module doc)."""
        self.pods = pods
        self.rings = rings
        self.reporter = reporter
        self.hardware = hardware
        self.fetch = fetch
        self.clock = clock
        self._counters = CounterRates()
        self._ends: dict[str, float] = {}
        self._orphans: dict[str, float] = {}
        self._devices: dict[str, tuple[int, ...]] = {}  # pod -> its GPUs at the last window
        self._paused: set[str] = set()  # pods whose last window made no progress
        self._observed_at: float | None = None  # when the last window ended (``clock``)
        self.listing_error: str | None = None
        """Why the newest window could not list the node's pods (None: it could)."""

    def observe(self) -> list[dict[str, Any]]:
        """One window's items (the wire form of ``POST /observations``); none when the
        node's pods cannot be listed (then nothing about departed pods is concluded)."""
        try:
            pods = self.pods()
        except Exception as exc:  # the API server out of reach, or refusing the agent
            self.listing_error = repr(exc)[:500]
            log.warning("pods.list_failed", extra={"error": self.listing_error})
            return []
        self.listing_error = None
        now = self.clock()
        device_samples: dict[int, HardwareSample | None] = {}
        counters = self._read_counters(pods)
        counted: dict[str, tuple[float, float] | None] = {}
        began_again = set()  # framework counters that went back: the server restarted
        for pod in pods:
            value = counters.get(pod.uid)
            if value is not None:
                if self._counters.went_back(pod.uid, value):
                    began_again.add(pod.uid)
                counted[pod.uid] = self._counters.update(pod.uid, value, now)
        launch_samples = {pod.uid: self.rings.sample(pod.uid) for pod in pods}
        start, self._observed_at = self._observed_at, now
        # per GPU, the share of this window each tenant ran there (module doc, "Restarts")
        shares: dict[int, dict[str, float]] = {}
        own_share: dict[str, float] = {}
        for pod in pods:
            warmup = self.warmup_seconds if pod.warmup_seconds is None else pod.warmup_seconds
            share = _run_share(
                pod, launch_samples[pod.uid], pod.uid in began_again, start, now, warmup
            )
            own_share[pod.uid] = share
            for device in pod.devices:
                shares.setdefault(device, {})[pod.uid] = share
        listed = {pod.uid: pod.devices for pod in pods if pod.devices}
        for uid, devices in self._devices.items():
            if uid not in listed:  # left the node since the last window
                for device in devices:
                    shares.setdefault(device, {})[uid] = 0.0
        self._devices = listed
        items = []
        for pod in pods:
            launches = launch_samples[pod.uid]
            rate: float | None = None
            unit = "launches/s"
            end = now
            seconds = 0.0
            if pod.progress is not None and pod.ip:
                got = counted.get(pod.uid)
                if got is not None:
                    rate, seconds = got
                    unit = pod.progress.unit
            elif launches is not None and launches.rate is not None:
                rate, end = launches.rate, launches.end
                seconds = end - self._ends.get(pod.uid, end)
            if launches is not None:
                self._ends[pod.uid] = launches.end
            resumed = rate is not None and rate > 0 and pod.uid in self._paused
            if rate == 0:
                self._paused.add(pod.uid)
            elif rate is not None:
                self._paused.discard(pod.uid)
            if resumed:  # progress began again part-way through the window (module doc)
                log.debug("window.resumed", extra={"pod": pod.key})
                continue
            if rate is not None and not math.isfinite(rate):  # JSON has no inf: the POST fails
                log.info("window.rate_not_finite", extra={"pod": pod.key, "rate": str(rate)})
                continue
            if rate is None or seconds <= 0 or not _one_run(pod, launches, own_share[pod.uid]):
                continue
            item: dict[str, Any] = {
                "pod_uid": pod.uid,
                "end": end,
                "seconds": seconds,
                "rate": rate,
                "unit": unit,
            }
            if any(
                share < MIN_SHARED_SHARE
                for d in pod.devices
                for uid, share in shares.get(d, {}).items()
                if uid != pod.uid
            ):
                item["mixed"] = True  # a co-tenant came, went or restarted (module doc)
            if pod.configuration:
                item["configuration"] = pod.configuration
            if launches is not None and launches.peak_mem_mib > 0:
                item["peak_mem_mib"] = launches.peak_mem_mib
            active = []
            for device in pod.devices:
                if device not in device_samples:
                    device_samples[device] = self.hardware(device)
                sample = device_samples[device]
                if sample is not None and sample.sm_active is not None:
                    active.append(min(1.0, max(0.0, sample.sm_active)))
            if active:
                item["sm_activity"] = sum(active) / len(active)
            items.append(item)
        self._collect_orphans({p.uid for p in pods}, now)
        return items

    def _read_counters(self, pods: list[PodInfo]) -> dict[str, float | None]:
        """Every framework counter of this window, read at once: a pod whose endpoint
        hangs costs the window one scrape's time limit, not one per such pod."""
        asked = [p for p in pods if p.progress is not None and p.ip]
        if not asked:
            return {}

        def read(pod: PodInfo) -> float | None:
            assert pod.progress is not None and pod.ip
            return read_counter(pod.progress, pod.ip, fetch=self.fetch)

        with ThreadPoolExecutor(min(len(asked), MAX_SCRAPES_AT_ONCE)) as pool:
            return dict(zip((p.uid for p in asked), pool.map(read, asked), strict=True))

    def _collect_orphans(self, present: set[str], now: float) -> None:
        self._paused &= present
        for uid in list(self._ends):
            if uid not in present:
                del self._ends[uid]
                self._counters.forget(uid)
                self.rings.forget(uid)  # its baselines (the kubelet removes an emptyDir)
        for uid in self.rings.pods():
            if uid in present:
                self._orphans.pop(uid, None)
                continue
            first = self._orphans.setdefault(uid, now)
            if now - first >= ORPHAN_SECONDS:
                self.rings.remove_directory(uid)
                self._orphans.pop(uid, None)

    def run_once(self) -> dict[str, Any]:
        items = self.observe()
        result = self.reporter.send(self.node, items)
        log.info("window.reported", extra={"pods": len(items), "result": result})
        return result

    def run(self, window_seconds: float, stop: threading.Event) -> None:
        """Report every ``window_seconds`` until ``stop`` is set; never dies on one error."""
        while not stop.wait(window_seconds):
            try:
                self.run_once()
            except Exception:  # the agent must outlive any one bad window
                log.exception("window.failed")
