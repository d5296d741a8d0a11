"""The engine's vectorised filter and prioritize agree with one evaluation per node."""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from test_service_snapshot import DECISION_VOLUME
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
    scores = dict(engine.prioritize(pod, names).pairs())
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
    cached = len(engine.verbs._answer_cache)
    engine.filter(twin, names)
    assert len(engine.verbs._answer_cache) == cached  # one entry for the shape
    assert first.passed
    meta = pod["metadata"]
    assert (
        engine.bind(meta.get("namespace", "default"), meta["name"], meta["uid"], first.passed[0])
        == ""
    )
    after = engine.filter(twin, names)  # the bind counts: a fresh answer, not the cached one
    assert_same_as_per_node(engine, twin, names)
    assert after == engine.filter(twin, names)


def _benchmark_like_cluster() -> EmbeddedCluster:
    node = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4", "pods": "110"}
    labels = {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "40960"}
    objects: list[dict] = []
    for i in range(3):
        objects.append({"kind": "Node", "metadata": {"name": f"n{i}", "labels": labels,
                        "resourceVersion": "1"}, "status": {"allocatable": node}})  # fmt: skip
        for d in range(2):
            name = f"run-{i}-{d}"
            annotations = {"elastico.io/family": "bert", "elastico.io/assigned-node": f"n{i}",
                           "elastico.io/assigned-devices": str(d)}  # fmt: skip
            objects.append({"kind": "Pod", "metadata": {"name": name, "namespace": "ml",
                            "uid": f"uid-{name}", "resourceVersion": "1",
                            "annotations": annotations},
                            "spec": {"nodeName": f"n{i}", "containers": [{"name": "c",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                                     "volumes": [DECISION_VOLUME]},
                            "status": {"phase": "Running"}})  # fmt: skip
    return EmbeddedCluster(objects, "test")


def test_unchanged_bound_pods_keep_their_records_and_changed_ones_are_rebuilt():
    cluster = _benchmark_like_cluster()
    engine = engine_on(cluster)
    first = engine.build_snapshot()[0]
    again = engine.build_snapshot()[0]
    assert again.jobs == first.jobs
    assert all(a is b for a, b in zip(again.jobs, first.jobs, strict=True))  # reused
    fresh = engine_on(_benchmark_like_cluster()).build_snapshot()[0]
    assert fresh.jobs == again.jobs
    # The watch delivers a new version of one pod: it moved to device 3.
    pod = copy.deepcopy(cluster.state.pod("uid-run-1-0"))
    pod["metadata"]["resourceVersion"] = "2"
    pod["metadata"]["annotations"]["elastico.io/assigned-devices"] = "3"
    cluster.state.apply("pods", "MODIFIED", pod)
    moved = {j.id: j for j in engine.build_snapshot()[0].jobs}
    assert moved["uid-run-1-0"].devices == (("n1", 3),)
    assert moved["uid-run-0-0"] is {j.id: j for j in again.jobs}["uid-run-0-0"]


def test_a_list_of_names_seen_before_in_another_order_or_with_repeats_is_answered_afresh():
    cluster = EmbeddedCluster.from_file()
    engine = engine_on(cluster)
    names = list(cluster.state.nodes())
    pod = next(p for p in cluster.state.pods().values() if not p["spec"].get("nodeName"))
    forward = engine.filter(pod, names)
    backward = engine.filter(pod, names[::-1])
    assert backward.passed == forward.passed[::-1]
    assert engine.filter(pod, list(names)).passed == forward.passed  # an equal list: cached
    scores = engine.prioritize(pod, [names[0], "ghost", names[0]]).pairs()
    assert [n for n, _ in scores] == [names[0], "ghost"]  # repeats dropped, unknown kept
    assert dict(scores)["ghost"] == 0
    repeated = engine.prioritize(pod, [names[0], "ghost", names[0]]).pairs()
    assert repeated == scores


def test_prioritize_scores_follow_a_bind_not_the_cached_answer():
    from test_service_behaviour import elastic_pod, gpu_node

    cluster = EmbeddedCluster([gpu_node("g0", 1), gpu_node("g1", 1)], "test")
    engine = engine_on(cluster)
    pod, twin = elastic_pod("p"), elastic_pod("twin")
    for p in (pod, twin):
        cluster.add_pod(p)
    before = engine.prioritize(pod, ["g0", "g1"]).pairs()
    assert engine.prioritize(pod, ["g0", "g1"]).pairs() == before  # the cached answer
    assert engine.filter(twin, ["g0"]).passed == ["g0"]
    assert engine.bind("ml", "twin", "uid-twin", "g0") == ""
    after = engine.prioritize(pod, ["g0", "g1"]).pairs()
    engine.verbs._score_cache.clear()
    engine.verbs._answer_cache.clear()
    assert engine.prioritize(pod, ["g0", "g1"]).pairs() == after  # recomputed: the same
    assert after != before  # g0 is fuller now
