"""Prometheus metrics of one service instance (its own registry, so apps never collide).

==========================================  =========  ====================================
metric                                      type       labels
==========================================  =========  ====================================
elastico_extender_request_seconds           histogram  verb (filter, prioritize, bind, ...)
elastico_epoch_seconds                      histogram
elastico_price                              gauge      resource (shadow price lambda)
elastico_colocated_devices                  gauge      GPUs with >= 2 tenants in the plan
elastico_queued_jobs                        gauge
elastico_rejections_total                   counter    reason (bounded label set)
elastico_binds_total                        counter    result
elastico_assumed_placements                 gauge      binds in flight
elastico_predictor_degraded                 gauge      reason (1 while degraded)
elastico_last_epoch_timestamp_seconds       gauge      (wall clock of the last plan)
elastico_leader                             gauge      (1 while holding the leader Lease)
==========================================  =========  ====================================

The closed loop's series (observed slowdowns, agents, harmful pairs) are read at scrape
time by ``service.observations.ObservationCollector``; docs/monitoring.md lists them all.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from elastico_extender.core.model import Plan
from elastico_extender.service.engine import Metrics

__all__ = ["MAX_LABEL_CHARS", "PrometheusMetrics"]

_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip


MAX_LABEL_CHARS = 200
"""Longest free-text label value (a degraded predictor's reason): far under any
Prometheus label_value_length_limit, so one long error never fails a whole scrape."""


class PrometheusMetrics(Metrics):
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.request = Histogram(
            "elastico_extender_request_seconds",
            "Latency of extender and REST requests",
            ["verb"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.epoch_seconds = Histogram(
            "elastico_epoch_seconds", "Latency of one planning epoch", buckets=_LATENCY_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.price = Gauge("elastico_price", "Shadow price per resource", ["resource"], registry=r)
        self.colocated = Gauge(
            "elastico_colocated_devices", "GPUs shared by two or more jobs", registry=r
        )
        self.queued = Gauge("elastico_queued_jobs", "Jobs the plan keeps queued", registry=r)
        self.rejections = Counter(
            "elastico_rejections_total", "Nodes rejected in filter, by reason", ["reason"],
            registry=r,
        )  # fmt: skip
        self.binds = Counter("elastico_binds_total", "Bind results", ["result"], registry=r)
        self.assumed = Gauge(
            "elastico_assumed_placements", "Bound placements not yet confirmed", registry=r
        )
        self.degraded = Gauge(
            "elastico_predictor_degraded",
            "1 while the interference predictor runs degraded",
            ["reason"],
            registry=r,
        )
        # For the chart's alerts: epochs failing (no success for a while), HA.  The pairs
        # the closed loop observed to hurt are the ObservationCollector's.
        self.last_epoch = Gauge(
            "elastico_last_epoch_timestamp_seconds",
            "Unix time of the last successful planning epoch",
            registry=r,
        )
        self.leader = Gauge(
            "elastico_leader", "1 while this replica holds the leader Lease", registry=r
        )

    def epoch(self, seconds: float, plan: Plan) -> None:
        self.epoch_seconds.observe(seconds)
        self.last_epoch.set_to_current_time()
        for name, value in plan.price_map().items():
            self.price.labels(name).set(value)
        self.colocated.set(float(plan.stats.get("colocated_devices", 0.0)))
        self.queued.set(len(plan.queued))

    def rejection(self, reason: str, count: int = 1) -> None:
        self.rejections.labels(reason).inc(count)

    def bind(self, result: str) -> None:
        self.binds.labels(result).inc()

    def render(self, assumed: Callable[[], int]) -> bytes:
        self.assumed.set(assumed())
        return generate_latest(self.registry)

    def set_degraded(self, reason: str) -> None:
        """Mark the predictor degraded; the label is ``reason`` cut to MAX_LABEL_CHARS
        (``/healthz`` carries it whole)."""
        if len(reason) > MAX_LABEL_CHARS:
            reason = reason[: MAX_LABEL_CHARS - 3] + "..."
        self.degraded.labels(reason).set(1)
