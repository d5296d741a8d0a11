"""Every cache of the verbs is bounded, and callers cannot grow the service's memory
(issue 12 items 8 and 10)."""

from __future__ import annotations

import gc
import traceback
import tracemalloc

from test_service_behaviour import elastic_pod, gpu_node

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.errors import AnnotationError
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


def engine_on(cluster: EmbeddedCluster) -> Engine:
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    return engine


def test_an_invalid_pod_raises_a_fresh_error_every_retry():
    engine = engine_on(EmbeddedCluster([gpu_node("g0")], "test"))
    bad = elastic_pod("q", mode="sometimes")
    depths = []
    for _ in range(200):
        try:
            engine.pod_job(bad)
        except AnnotationError as exc:
            depths.append(len(traceback.extract_tb(exc.__traceback__)))
    assert len(depths) == 200 and max(depths) == depths[0]  # no traceback chain per retry


def grown_by(action) -> int:  # type: ignore[no-untyped-def]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    action()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return after - before


def test_filtering_an_invalid_pod_many_times_keeps_memory_flat():
    engine = engine_on(EmbeddedCluster([gpu_node("g0")], "test"))
    bad = elastic_pod("q", mode="sometimes")
    engine.filter(bad, ["g0"])
    grown = grown_by(lambda: [engine.filter(bad, ["g0"]) for _ in range(2000)])
    assert grown < 200_000


def test_filter_keeps_no_pod_body_of_its_callers():
    engine = engine_on(EmbeddedCluster([gpu_node("g0")], "test"))

    def send() -> None:
        for i in range(20):
            pod = elastic_pod(f"big-{i}")
            pod["metadata"]["annotations"]["example.com/notes"] = f"{i}" * (1 << 20)  # 1 MiB
            engine.filter(pod, ["g0"])
            del pod

    assert grown_by(send) < 4 << 20  # 20 MiB sent, far less kept


def test_pods_invented_by_callers_cannot_grow_the_translation_cache():
    engine = engine_on(EmbeddedCluster([gpu_node("g0")], "test"))
    capacity = engine.pod_jobs.capacity
    for i in range(capacity + 500):
        pod = elastic_pod(f"p{i}")
        engine.filter(pod, ["g0"])
    assert len(engine.pod_jobs) == capacity
    huge = elastic_pod("bad", mode="m" * 100_000, weight="w" * 100_000)
    for i in range(50):
        huge["metadata"]["uid"] = f"uid-bad-{i}"
        assert engine.filter(huge, ["g0"]).passed == []
    kept = [v for v in engine.pod_jobs._cache.values() if isinstance(v, tuple)]
    assert kept and all(sum(len(k) + len(m) for k, m in v) <= 4096 for v in kept)


def test_answers_for_many_pod_shapes_stay_within_their_byte_budget():
    nodes = [gpu_node(f"g{i}", gpus=8) for i in range(200)]
    engine = engine_on(EmbeddedCluster(nodes, "test"))
    names = [f"g{i}" for i in range(200)]
    for k in range(400):  # a distinct weight per pod: a distinct shape, a fresh answer
        engine.filter(elastic_pod(f"s{k}", weight=f"{1 + k / 1000:.3f}"), names)
    assert engine.verbs.answer_bytes <= engine.verbs.answer_budget


def test_the_degraded_predictor_label_is_bounded():
    """The reason a model could not be used is a label of elastico_predictor_degraded:
    a long path or error text (onnxruntime's can run to kilobytes) would exceed a
    Prometheus server's label_value_length_limit and fail the whole scrape.  The label
    is cut; /healthz keeps the whole reason."""
    from prometheus_client import generate_latest

    from elastico_extender.service.metrics import MAX_LABEL_CHARS, PrometheusMetrics

    metrics = PrometheusMetrics()
    metrics.set_degraded("/models/" + "x" * 5000 + ".onnx: not an ONNX model")
    text = generate_latest(metrics.registry).decode()
    (line,) = [x for x in text.splitlines() if x.startswith("elastico_predictor_degraded{")]
    label = line.split('reason="', 1)[1].rsplit('"}', 1)[0]
    assert 0 < len(label) <= MAX_LABEL_CHARS and label.endswith("...")
