"""A framework's own progress counter, declared by the pod (``elastico.io/progress-metrics``).

For example vLLM's ``vllm:generation_tokens_total`` on its OpenAI server's ``/metrics``:
the agent scrapes ``http://<pod IP>:<port><path>`` once per window, sums the counter over
its label sets (one per served model) and keeps the value with the agent's clock; the
rate over the window is what the job produced per second, in the declared unit.  This
beats the launch rate where both exist (it is the job's real output; see
docs/observability.md).  A scrape that fails or lacks the counter gives no window.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

from elastico_extender.annotations import ProgressEndpoint
from elastico_extender.profiling.hardware import http_get, parse_prometheus

__all__ = ["MAX_SCRAPE_BYTES", "read_counter", "scrape", "scrape_url"]

log = logging.getLogger(__name__)

MAX_SCRAPE_BYTES = 8 << 20
"""Largest exposition read from a pod (a vLLM server's is tens of KiB)."""

Fetch = Callable[[str, float], str]


def scrape(url: str, timeout: float) -> str:
    """A pod's exposition: at most :data:`MAX_SCRAPE_BYTES`, within about ``2 * timeout``
    however slowly or long the pod answers (:func:`http_get`)."""
    return http_get(url, timeout, max_bytes=MAX_SCRAPE_BYTES)


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
    values = [v for name, _, v in parse_prometheus(text) if name in names and math.isfinite(v)]
    return sum(values) if values else None
