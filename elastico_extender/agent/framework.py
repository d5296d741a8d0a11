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
from elastico_extender.httpget import get_text
from elastico_extender.profiling.hardware import parse_prometheus

__all__ = ["MAX_SCRAPE_BYTES", "read_counter", "scrape", "scrape_url"]

log = logging.getLogger(__name__)

MAX_SCRAPE_BYTES = 8 << 20
"""Largest exposition read from a pod (a vLLM server's is tens of KiB)."""

Fetch = Callable[[str, float], str]


def scrape(url: str, timeout: float) -> str:
    """A pod's exposition: at most :data:`MAX_SCRAPE_BYTES`, within ``2 * timeout``
    however slowly or long the pod answers, headers included; only a whole 200 answer
    (a redirect is not followed: the pod would send the agent to another service).
    See :func:`elastico_extender.httpget.get_text`."""
    return get_text(url, timeout, max_bytes=MAX_SCRAPE_BYTES)


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
