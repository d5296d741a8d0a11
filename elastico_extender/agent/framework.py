"""A framework's own progress counter, declared by the pod (``elastico.io/progress-metrics``).

For example vLLM's ``vllm:generation_tokens_total`` on its OpenAI server's ``/metrics``:
the agent scrapes ``http://<pod IP>:<port><path>`` once per window, sums the counter over
its label sets (one per served model) and keeps the value with the agent's clock; the
rate over the window is what the job produced per second, in the declared unit.  This
beats the launch rate where both exist (it is the job's real output; see
docs/observability.md).  A scrape that fails or lacks the counter gives no window.
"""

from __future__ import annotations

import http.client
import logging
import math
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from elastico_extender.annotations import ProgressEndpoint
from elastico_extender.profiling.hardware import parse_prometheus, read_reply

if TYPE_CHECKING:
    from _typeshed import WriteableBuffer

__all__ = ["MAX_SCRAPE_BYTES", "read_counter", "scrape", "scrape_url"]

log = logging.getLogger(__name__)

MAX_SCRAPE_BYTES = 8 << 20
"""Largest exposition read from a pod (a vLLM server's is tens of KiB)."""

Fetch = Callable[[str, float], str]


class _DeadlineSocket(socket.socket):
    """A socket each read of which ends by ``deadline`` (``time.monotonic()``): a socket
    timeout bounds one read only, so an endpoint sending a byte of header now and then
    would hold the scrape (and the node's window) for as long as it likes."""

    deadline = math.inf

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("answer not complete in time")
        self.settimeout(left)
        return super().recv_into(buffer, nbytes, flags)


class _PodConnection(http.client.HTTPConnection):
    """Plain HTTP to a pod's port whose reads all end by ``deadline`` (no proxy)."""

    def __init__(self, host: str, port: int | None, timeout: float, deadline: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self.deadline = deadline

    def connect(self) -> None:
        raw = socket.create_connection((self.host, self.port), self.timeout)
        sock = _DeadlineSocket(raw.family, raw.type, raw.proto, fileno=raw.detach())
        sock.deadline = self.deadline
        sock.settimeout(self.timeout)
        self.sock = sock


def scrape(url: str, timeout: float) -> str:
    """A pod's exposition: at most :data:`MAX_SCRAPE_BYTES`, within about ``2 * timeout``
    however slowly or long the pod answers, headers included (connecting, then the
    whole answer).  Only a whole 200 answer is one: a redirect is not followed (the pod
    would send the agent to another service), a body short of its Content-Length is
    refused, and http.client's own errors (a status line that is not HTTP, a header line
    too long, a broken chunk, a path it refuses) become OSError naming the URL."""
    parts = urlsplit(url)
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    started = time.monotonic()
    conn = _PodConnection(parts.hostname or "", parts.port, timeout, started + 2 * timeout)
    try:
        conn.request("GET", target, headers={"Accept": "text/plain"})
        reply = conn.getresponse()
        if reply.status != 200:
            raise OSError(f"{url}: HTTP {reply.status} {reply.reason}")
        body = read_reply(reply, url, started, 2 * timeout, MAX_SCRAPE_BYTES)
        if reply.length:  # the connection closed before Content-Length bytes came
            raise OSError(f"{url}: answer cut short, {reply.length} bytes missing")
    except http.client.HTTPException as exc:
        raise OSError(f"{url}: not an HTTP answer: {type(exc).__name__}: {exc}"[:300]) from exc
    finally:
        conn.close()
    return body.decode("utf-8", errors="replace")


def scrape_url(endpoint: ProgressEndpoint, pod_ip: str) -> str:
    host = f"[{pod_ip}]" if ":" in pod_ip else pod_ip
    return f"http://{host}:{endpoint.port}{endpoint.path}"


def read_counter(
    endpoint: ProgressEndpoint, pod_ip: str, *, fetch: Fetch = scrape, timeout: float = 2.0
) -> float | None:
    """The counter's current value summed over label sets; None when unreadable."""
    url = scrape_url(endpoint, pod_ip)
    try:
        text = fetch(url, timeout)
    except (OSError, ValueError) as exc:
        log.info("progress.scrape_failed", extra={"url": url, "error": str(exc)})
        return None
    if len(text) > MAX_SCRAPE_BYTES:
        log.info("progress.scrape_too_large", extra={"url": url, "bytes": len(text)})
        return None
    names = {endpoint.counter, endpoint.counter + "_total"}
    series: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    repeated = False
    for name, labels, value in parse_prometheus(text):
        if name in names and not math.isnan(value):
            key = (name, frozenset(labels.items()))
            repeated = repeated or key in series
            series[key] = value
    return _count(list(series.values()), repeated, url)


def _count(values: list[float], repeated: bool, url: str) -> float | None:
    """The sum of a counter's series; None (and a log line) when it is no count: a series
    listed twice (Prometheus refuses such a scrape), a negative or infinite sample."""
    if not values:
        return None
    total = sum(values)
    if repeated or not math.isfinite(total) or min(values) < 0:
        # a rate from it would be NaN, inf, or a count the pod never made
        log.info("progress.counter_invalid",
                 extra={"url": url, "samples": len(values), "repeated": repeated})  # fmt: skip
        return None
    return total
