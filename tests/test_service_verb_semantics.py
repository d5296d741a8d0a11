"""The extender verbs against the published plan, as kube-scheduler really calls them
(real HTTP through uvicorn): idle GPUs before sharing, the plan's node first, binds to
nodes the plan did not choose, concurrent binds for the last GPUs, and the reply shapes."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from test_service_behaviour import args, call, elastic_pod, gpu_node, start

from elastico_extender.cluster.base import BindRequest, ClusterError
from elastico_extender.cluster.embedded import EmbeddedCluster


def running(name: str, family: str, node: str) -> dict:
    pod = elastic_pod(name, family)
    pod["spec"]["nodeName"] = node
    pod["status"]["phase"] = "Running"
    return pod


@pytest.fixture
def shared_and_idle() -> Iterator[tuple[str, str, EmbeddedCluster]]:
    """g0's one GPU runs resnet50 (room for an lstm next to it); g1's GPU is idle."""
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1")], "test")
    cluster.add_pod(running("a", "resnet50", "g0"))
    server, token = start(cluster)
    yield server.url, token, cluster
    server.stop()


def test_filter_never_shares_a_gpu_while_an_offered_node_has_an_idle_one_that_fits(
    shared_and_idle,
):
    url, _, cluster = shared_and_idle
    newcomer = elastic_pod("y", "lstm")  # arrives after the plan: answered on the spot
    cluster.add_pod(newcomer)
    alone = call(url, "filter", args(newcomer, ["g0"])).json()
    assert alone["NodeNames"] == ["g0"]  # sharing is fine when nothing idle is offered
    body = call(url, "filter", args(newcomer, ["g0", "g1"])).json()
    assert body["NodeNames"] == ["g1"]
    assert "idle GPU" in body["FailedNodes"]["g0"]
    assert body["FailedAndUnresolvableNodes"] == {}
    # the reason names no node, so a reordered node list gives the same message
    again = call(url, "filter", args(newcomer, ["g1", "g0"])).json()
    assert again["FailedNodes"] == body["FailedNodes"]
    metrics = httpx.get(f"{url}/metrics").text
    assert 'elastico_rejections_total{reason="idle-elsewhere"}' in metrics


def bind_args(name: str, node: str) -> dict:
    return {"PodName": name, "PodNamespace": "ml", "PodUID": f"uid-{name}", "Node": node}


def proposal(url: str, pod: str) -> str:
    """The node GET /jobs shows for ``pod`` (the plan's proposal while it is pending)."""
    jobs = {j["pod"]: j for j in httpx.get(f"{url}/jobs").json() if "pod" in j}
    return jobs[pod]["devices"][0].split("/")[0]


def test_prioritize_puts_the_plans_node_first_and_answers_each_name_once():
    cluster = EmbeddedCluster([gpu_node(f"g{i}") for i in range(3)], "test")
    cluster.add_pod(running("a", "resnet50", "g0"))
    cluster.add_pod(elastic_pod("x", "lstm"))  # seen by the first plan: a proposal
    server, _ = start(cluster)
    try:
        planned = proposal(server.url, "ml/x")
        others = [n for n in ("g0", "g1", "g2") if n != planned]
        names = [others[0], "ghost", planned, others[1], others[0], planned]
        reply = call(server.url, "prioritize", args(cluster.state.pod("uid-x"), names))
        assert reply.status_code == 200
        rows = reply.json()
        # HostPriorityList: one {"Host": string, "Score": int 0..10} per distinct name
        assert [r["Host"] for r in rows] == [others[0], "ghost", planned, others[1]]
        assert all(set(r) == {"Host", "Score"} and type(r["Score"]) is int for r in rows)
        scores = {r["Host"]: r["Score"] for r in rows}
        assert scores[planned] == 10 and scores["ghost"] == 0
        assert max(scores[n] for n in others) < 10
    finally:
        server.stop()


def test_bind_to_a_node_the_plan_did_not_choose_books_that_nodes_answer():
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1")], "test")
    cluster.add_pod(elastic_pod("x", "bert"))
    server, token = start(cluster)
    try:
        url = server.url
        planned = proposal(url, "ml/x")
        other = "g1" if planned == "g0" else "g0"
        assert call(url, "bind", bind_args("x", other), token).json() == {"Error": ""}
        notes = cluster.state.pod("uid-x")["metadata"]["annotations"]
        assert notes["elastico.io/assigned-node"] == other
        assert notes["elastico.io/assigned-devices"] == "0"
        data = cluster.configmaps[("ml", notes["elastico.io/configmap"])]["data"]
        assert data["ELASTICO_CONFIGURATION"] == notes["elastico.io/assigned-configuration"]
        # counted once, where it was bound: the plan's node is free for the next bert
        nodes = {n["name"]: n["gpus"][0] for n in httpx.get(f"{url}/nodes").json()}
        assert nodes[planned]["pods"] == [] and nodes[other]["pods"] == ["ml/x"]
        budget = float(notes["elastico.io/memory-budget-mib"])
        assert nodes[other]["memory_assigned_mib"] == pytest.approx(budget)
        cluster.add_pod(elastic_pod("y", "bert"))
        body = call(url, "filter", args(cluster.state.pod("uid-y"), ["g0", "g1"])).json()
        assert body["NodeNames"] == [planned]
    finally:
        server.stop()


class LaggingCluster(EmbeddedCluster):
    """The Binding is written, but the watch never shows it (the pod stays pending)."""

    def bind(self, request) -> None:  # type: ignore[no-untyped-def]
        self.bindings.append({"target": {"name": request.node}, "request": request})


def test_a_pod_deleted_before_the_watch_shows_its_bind_frees_its_booking():
    cluster = LaggingCluster([gpu_node("g0")], "test")
    for name in ("x", "y"):
        cluster.add_pod(elastic_pod(name, "bert"))  # two berts never share 40 GiB
    server, token = start(cluster)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        url = server.url
        assert call(url, "bind", bind_args("x", "g0"), token).json() == {"Error": ""}
        y = cluster.state.pod("uid-y")
        assert call(url, "filter", args(y, ["g0"])).json()["NodeNames"] == []
        cluster.delete_pod("ml", "x")
        assert httpx.post(f"{url}/epoch", headers=auth).status_code == 200
        assert call(url, "filter", args(y, ["g0"])).json()["NodeNames"] == ["g0"]
        assert call(url, "bind", bind_args("y", "g0"), token).json() == {"Error": ""}
    finally:
        server.stop()


def test_two_concurrent_binds_for_the_last_gpu_one_wins_the_other_lands_elsewhere():
    cluster = EmbeddedCluster([gpu_node("g0"), gpu_node("g1")], "test")
    for name in ("a", "b"):
        cluster.add_pod(elastic_pod(name, "bert"))  # two berts never share 40 GiB
    server, token = start(cluster)
    try:
        url = server.url
        barrier = threading.Barrier(2)

        def bind(name: str) -> str:
            barrier.wait()
            return call(url, "bind", bind_args(name, "g0"), token).json()["Error"]

        with ThreadPoolExecutor(2) as pool:
            errors = dict(zip("ab", pool.map(bind, "ab"), strict=True))
        assert sorted(errors.values())[0] == ""
        (loser,) = [n for n, e in errors.items() if e]
        assert "cannot take" in errors[loser] and "g0" in errors[loser]
        assert call(url, "bind", bind_args(loser, "g1"), token).json() == {"Error": ""}
        nodes = {
            p["metadata"]["name"]: p["spec"]["nodeName"] for p in cluster.state.pods().values()
        }
        assert sorted(nodes.values()) == ["g0", "g1"]
    finally:
        server.stop()


def test_many_concurrent_binds_over_http_never_overbook_gpu_memory():
    cluster = EmbeddedCluster([gpu_node(f"g{i}", gpus=2) for i in range(3)], "test")
    families = ["bert", "resnet50", "lstm", "qwen-1.7b", "dcgan", "llama3-7b"]
    names = [f"p{i}" for i in range(30)]
    for i, name in enumerate(names):
        cluster.add_pod(elastic_pod(name, families[i % len(families)]))
    server, token = start(cluster, min_dwell_seconds=0)
    auth = {"Authorization": f"Bearer {token}"}
    stop = threading.Event()

    def epochs() -> None:
        while not stop.wait(0.05):
            httpx.post(f"{server.url}/epoch", headers=auth, timeout=30)

    def schedule(name: str) -> list[tuple[str, str]]:
        rng = random.Random(name)
        pod = cluster.state.pod(f"uid-{name}")
        nodes = ["g0", "g1", "g2"]
        passed = call(server.url, "filter", args(pod, nodes)).json()["NodeNames"]
        tries = passed[:1] + [rng.choice(nodes) for _ in range(3)]  # retries, other nodes
        return [(node, call(server.url, "bind", bind_args(name, node), token).json()["Error"])
                for node in tries]  # fmt: skip

    ticker = threading.Thread(target=epochs)
    ticker.start()
    try:
        with ThreadPoolExecutor(8) as pool:
            results = dict(zip(names, pool.map(schedule, names), strict=True))
    finally:
        stop.set()
        ticker.join()
    try:
        booked: dict[tuple[str, str], float] = {}
        bound = {}
        for pod in cluster.state.pods().values():
            node = pod["spec"].get("nodeName")
            if not node:
                continue
            bound[pod["metadata"]["name"]] = node
            notes = pod["metadata"]["annotations"]
            for d in notes["elastico.io/assigned-devices"].split(","):
                key = (node, d)
                booked[key] = booked.get(key, 0.0) + float(notes["elastico.io/memory-budget-mib"])
        assert bound and max(booked.values()) <= 40960
        assert any(error for tries in results.values() for _, error in tries)
        assert len(cluster.bindings) == len(bound)  # one Binding per bound pod
        for name, tries in results.items():
            for node, error in tries:
                if error == "":
                    assert bound[name] == node  # a success names where the pod is
                else:
                    assert error.startswith("elastico:") or "already bound" in error
        httpx.post(f"{server.url}/epoch", headers=auth, timeout=30)
        for row in httpx.get(f"{server.url}/nodes").json():
            for gpu in row["gpus"]:
                assert gpu["memory_assigned_mib"] <= gpu["memory_mib"]
    finally:
        server.stop()


class BoundElsewhere(EmbeddedCluster):
    """Another scheduler bound ``ml/x`` to g1; the API server knows, the watch not yet."""

    def bind(self, request: BindRequest) -> None:
        if request.name == "x":
            raise ClusterError('pod x is already assigned to node "g1"', status=409)
        super().bind(request)

    def reveal(self) -> None:
        super().bind(BindRequest("ml", "x", "uid-x", "g1"))


def test_a_bind_the_api_server_answers_409_is_an_error_and_its_booking_goes_with_the_watch():
    cluster = BoundElsewhere([gpu_node("g0"), gpu_node("g1")], "test")
    for name in ("x", "y"):
        cluster.add_pod(elastic_pod(name, "bert"))  # two berts never share 40 GiB
    server, token = start(cluster)
    auth = {"Authorization": f"Bearer {token}"}
    try:
        url = server.url
        reply = call(url, "bind", bind_args("x", "g0"), token)
        assert reply.status_code == 200 and "already assigned" in reply.json()["Error"]
        y = cluster.state.pod("uid-y")
        assert call(url, "filter", args(y, ["g0"])).json()["NodeNames"] == []  # kept for now
        cluster.reveal()  # the watch shows where the pod really is
        assert httpx.post(f"{url}/epoch", headers=auth).status_code == 200
        nodes = {n["name"]: n["gpus"][0]["pods"] for n in httpx.get(f"{url}/nodes").json()}
        assert nodes["g1"] == ["ml/x"] and "ml/x" not in nodes["g0"]  # g0: y's proposal
        assert call(url, "filter", args(y, ["g0", "g1"])).json()["NodeNames"] == ["g0"]
    finally:
        server.stop()


def test_the_plans_idle_proposal_keeps_a_seen_pod_off_shared_gpus(shared_and_idle):
    url, token, cluster = shared_and_idle
    cluster.add_pod(elastic_pod("x", "lstm"))
    auth = {"Authorization": f"Bearer {token}"}
    assert httpx.post(f"{url}/epoch", headers=auth).status_code == 200
    assert proposal(url, "ml/x") == "g1"  # the plan put it on the idle GPU
    body = call(url, "filter", args(cluster.state.pod("uid-x"), ["g0", "g1"])).json()
    assert body["NodeNames"] == ["g1"] and "idle GPU" in body["FailedNodes"]["g0"]


def test_a_bind_to_a_node_the_watch_shows_deleted_writes_nothing():
    """The node left the cluster (the watch shows it deleted) after the epoch that
    published the view: bind refuses it, naming the node, and writes nothing (before,
    it booked the pod on the published view and the API server took the Binding, so
    the pod sat bound to a node that no longer exists until the pod GC deleted it).
    The booking holds no GPU: a bind to the node that is left goes through."""
    from kubernetes import client

    from elastico_extender.cluster.fake_apiserver import FakeApiServer
    from elastico_extender.cluster.kube import KubeCluster
    from elastico_extender.service.engine import Engine
    from elastico_extender.service.settings import ServiceSettings

    api = FakeApiServer().start()
    api.put("nodes", gpu_node("g0"))
    api.put("nodes", gpu_node("g1"))
    api.put("pods", elastic_pod("p"))
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain", "namespace": "ml"},
             "spec": {"containers": [{"name": "main", "image": "img"}]}}  # fmt: skip
    api.put("pods", plain)
    kube = KubeCluster(client.ApiClient(client.Configuration(host=api.url)), resync_seconds=300)
    kube.start()
    try:
        assert kube.wait_synced(15)
        engine = Engine(ServiceSettings(epoch_seconds=3600), kube)
        engine.run_epoch()  # no loop thread: the view stays the one with g0
        api.delete("nodes", "g0")
        deadline = time.monotonic() + 15
        while kube.state.node("g0") is not None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert kube.state.node("g0") is None
        error = engine.bind("ml", "p", "uid-p", "g0")
        assert "g0" in error and "not in its cluster view" in error, error
        # a pod ElastiCo only binds (no opt-in) is refused the same way
        assert "g0" in engine.bind("ml", "plain", "uid-plain", "g0")
        assert api.bindings == [] and api.configmaps == {}
        assert engine.bind("ml", "p", "uid-p", "g1") == ""
        assert [b["target"]["name"] for b in api.bindings] == ["g1"]
    finally:
        kube.stop()
        api.stop()
