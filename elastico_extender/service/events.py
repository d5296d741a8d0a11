"""Kubernetes Events for ElastiCo's decisions, with the reason in numbers, rate-limited.

``kubectl describe pod`` shows why a pod went where it went:

    Normal   Bound         elastico  bound to gpu-3/GPU 1 at batch_size=64,amp=on: GPU memory
                                     price λ=0.412, predicted slowdown Ŝ=1.08 ≤ τ=1.25
    Normal   Reconfigured  elastico  batch_size=128 -> batch_size=64 because λ rose to 0.61
    Warning  Refused       elastico  refused gpu-2: co-location with job-7 predicts Ŝ=1.41 > τ=1.25
    Warning  ConfigurationsRejected  elastico  rejected all 6 configurations of bert: no
                                     configuration meets the throughput floor 900 (best ...)

The text is built here (one place: :func:`bound_message` and friends); the engine's
actuator calls :meth:`EventRecorder.bound` / ``reconfigured`` / ``refused`` /
``rejected`` (wired in
service/actuator.py, docs/monitoring.md). Events are ``core/v1`` (what ``kubectl
describe`` lists), written through the official client on a background thread so a verb
never waits on the API server.

Rate limit (client-go's EventCorrelator does the same job): per (pod, reason) at most one
Event per ``min_interval`` seconds; repeats inside the window are counted and the next
Event says how many were folded in; at most ``max_queue`` Events wait to be written
(older ones are dropped and counted), and the per-key memory is bounded (``max_keys``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from kubernetes import client

__all__ = [
    "EventRecorder",
    "PodRef",
    "bound_message",
    "reconfigured_message",
    "refused_message",
    "rejected_configurations_message",
]

log = logging.getLogger(__name__)

COMPONENT = "elastico"
MAX_MESSAGE = 1024  # the API server caps Event messages at 1 KiB
WRITE_TIMEOUT_SECONDS = 10.0  # per write: an API server that never answers costs an Event


@dataclass(frozen=True)
class PodRef:
    namespace: str
    name: str
    uid: str = ""


def bound_message(
    node: str,
    devices: tuple[int, ...],
    configuration: str,
    price: float,
    predicted_slowdown: float,
    tolerance: float,
) -> str:
    gpus = ",".join(str(d) for d in devices) or "-"
    return (
        f"bound to {node}/GPU {gpus} at {configuration}: price λ={price:.3f}, "
        f"predicted slowdown Ŝ={predicted_slowdown:.2f} ≤ τ={tolerance:.2f}"
    )


def reconfigured_message(before: str, after: str, because: str) -> str:
    return f"{before} -> {after} because {because}"


def refused_message(node: str, because: str) -> str:
    return f"refused {node}: {because}"


def rejected_configurations_message(rejected: list[tuple[str, str]], limit: int = 5) -> str:
    """Configurations the plan did not take, each with its reason (the first ``limit``)."""
    shown = "; ".join(f"{label}: {why}" for label, why in rejected[:limit])
    more = f" (+{len(rejected) - limit} more)" if len(rejected) > limit else ""
    return f"rejected {shown}{more}"


class EventRecorder:
    """Writes rate-limited core/v1 Events about pods; ``start`` / ``stop`` the writer."""

    def __init__(
        self,
        api_client: client.ApiClient,
        *,
        identity: str = "",
        min_interval: float = 30.0,
        max_queue: int = 1000,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api = client.CoreV1Api(api_client)
        self.identity = identity
        self.min_interval = min_interval
        self.clock = clock
        self.max_keys = max_keys
        self._last: OrderedDict[tuple[str, str, str], tuple[float, int]] = OrderedDict()
        self._queue: queue.Queue[client.CoreV1Event | None] = queue.Queue(max_queue)
        self._lock = threading.Lock()
        self.dropped = 0
        self.suppressed = 0
        self.written = 0
        self._thread: threading.Thread | None = None

    # -- the API the actuator calls ---------------------------------------------------
    def bound(self, pod: PodRef, message: str) -> bool:
        return self.record(pod, "Normal", "Bound", message)

    def reconfigured(self, pod: PodRef, message: str) -> bool:
        return self.record(pod, "Normal", "Reconfigured", message)

    def refused(self, pod: PodRef, message: str) -> bool:
        return self.record(pod, "Warning", "Refused", message)

    def rejected(self, pod: PodRef, message: str) -> bool:
        """The pod stays queued: no configuration of its family can run as submitted."""
        return self.record(pod, "Warning", "ConfigurationsRejected", message)

    def record(self, pod: PodRef, type_: str, reason: str, message: str) -> bool:
        """Queue an Event; False when rate-limited or the queue is full."""
        key = (pod.namespace, pod.name, reason)
        now = self.clock()
        with self._lock:
            last, folded = self._last.get(key, (float("-inf"), 0))
            if now - last < self.min_interval:
                self._last[key] = (last, folded + 1)
                self.suppressed += 1
                return False
            self._last[key] = (now, 0)
            self._last.move_to_end(key)
            while len(self._last) > self.max_keys:
                self._last.popitem(last=False)
        if folded:
            message = f"{message} ({folded} similar in the last {self.min_interval:.0f}s)"
        event = self._event(pod, type_, reason, message[:MAX_MESSAGE])
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return False
        return True

    def _event(self, pod: PodRef, type_: str, reason: str, message: str) -> client.CoreV1Event:
        now = datetime.now(UTC)
        return client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                name=pod.name,
                namespace=pod.namespace,
                uid=pod.uid or None,
            ),
            reason=reason,
            message=message,
            type=type_,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=client.V1EventSource(component=COMPONENT),
            reporting_component=f"elastico.io/{COMPONENT}",
            reporting_instance=self.identity or None,
        )

    # -- the writer -------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="elastico-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        self._thread.join(timeout)
        self._thread = None

    def flush(self, timeout: float = 5.0) -> None:
        """Write everything queued so far (tests, shutdown)."""
        deadline = self.clock() + timeout
        while not self._queue.empty() and self.clock() < deadline:
            time.sleep(0.01)
        self._queue.join()

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            try:
                if event is None:
                    return
                self.api.create_namespaced_event(
                    str(event.metadata.namespace), event, _request_timeout=WRITE_TIMEOUT_SECONDS
                )
                self.written += 1
            except Exception as exc:  # an Event is best effort; the writer must live on
                # (no answer at all is urllib3's MaxRetryError, not an ApiException)
                log.warning("event.write_failed", extra={"error": str(exc)[:200]})
            finally:
                self._queue.task_done()
