"""The engine's vectorised filter and prioritize agree with one evaluation per node."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from test_service_wire import WIRE, wire_cluster

from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.engine import Engine
from elastico_extender.service.settings import ServiceSettings


def engine_on(cluster: EmbeddedCluster) -> Engine:
    cluster.start()
    engine = Engine(ServiceSettings(epoch_seconds=3600), cluster)
    engine.run_epoch()
    return engine


def assert_same_as_per_node(engine: Engine, pod: dict, names: list[str]) -> None:
    """filter/prioritize over all ``names`` at once == the record of each node alone."""
    pj = engine.pod_job(pod)
    assert pj is not None
    view = engine.published.view
    job = pj.job
    if view.holds(job.id):  # the extender asks about a probe copy of a job the view holds
        job = dataclasses.replace(job, id=job.id + "#probe")
    alone = {n: view.evaluate(job, pj.family, [n])[n] for n in names}
    outcome = engine.filter(pod, names)
    home = view.devices_of(pj.job.id)[0][0] if view.holds(pj.job.id) else None
    expected = [n for n, v in alone.items() if v.feasible or n == home]
    assert outcome.passed == expected
    reasons = {**outcome.failed, **outcome.unresolvable}
    assert reasons == {n: f"elastico: {v.reason}" for n, v in alone.items() if n not in expected}
    scores = dict(engine.prioritize(pod, names))
    assert list(scores) == names
    assert {n for n, s in scores.items() if s > 0} == set(expected)
    assert all(0 <= s <= 10 for s in scores.values())


def test_embedded_cluster_pods_get_the_per_node_answers():
    cluster = EmbeddedCluster.from_file()
    engine = engine_on(cluster)
    names = [*cluster.state.nodes(), "ghost"]
    pods = [p for p in cluster.state.pods().values() if engine.pod_job(p) is not None]
    assert pods
    for pod in pods:
        assert_same_as_per_node(engine, pod, names)


@pytest.mark.skipif(not WIRE.exists(), reason="wire captures not available")
def test_wire_bodies_get_the_per_node_answers():
    engine = engine_on(wire_cluster())
    for line in (WIRE / "requests.jsonl").read_text().splitlines():
        request = json.loads(line)
        if request["verb"] not in ("filter", "prioritize"):
            continue
        body = request["body"]
        names = body.get("NodeNames") or [n["metadata"]["name"] for n in body["Nodes"]["items"]]
        assert_same_as_per_node(engine, copy.deepcopy(body["Pod"]), names)


def test_pods_of_one_shape_share_an_answer_until_the_view_changes():
    cluster = EmbeddedCluster.from_file()
    engine = engine_on(cluster)
    names = list(cluster.state.nodes())
    pod = next(p for p in cluster.state.pods().values() if not p["spec"].get("nodeName"))
    twin = copy.deepcopy(pod)
    twin["metadata"].update(name="twin", uid="uid-twin")
    first = engine.filter(pod, names)
    assert engine.filter(twin, names) == first
    cached = len(engine._answer_cache)
    engine.filter(twin, names)
    assert len(engine._answer_cache) == cached  # one entry for the shape
    assert first.passed
    meta = pod["metadata"]
    assert (
        engine.bind(meta.get("namespace", "default"), meta["name"], meta["uid"], first.passed[0])
        == ""
    )
    after = engine.filter(twin, names)  # the bind counts: a fresh answer, not the cached one
    assert_same_as_per_node(engine, twin, names)
    assert after == engine.filter(twin, names)
