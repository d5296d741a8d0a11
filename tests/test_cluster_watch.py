"""The Kubernetes cluster view against a server speaking the real list/watch protocol."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator

import pytest
from kubernetes import client

from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.fake_apiserver import FakeApiServer
from elastico_extender.cluster.kube import KubeCluster


def node(name: str, gpus: int = 4) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.count": str(gpus)}},
        "spec": {},
        "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": str(gpus)}},
    }


def pod(name: str, node_name: str | None = None) -> dict:
    spec: dict = {"containers": [{"name": "main", "image": "busybox"}]}
    if node_name:
        spec["nodeName"] = node_name
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ml"},
            "spec": spec, "status": {"phase": "Pending"}}  # fmt: skip


def wait_for(condition: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def server() -> Iterator[FakeApiServer]:
    srv = FakeApiServer().start()
    srv.put("nodes", node("gpu-0"))
    srv.put("nodes", node("gpu-1", 8))
    srv.put("pods", pod("a"))
    yield srv
    srv.stop()


@pytest.fixture
def cluster(server: FakeApiServer) -> Iterator[KubeCluster]:
    config = client.Configuration(host=server.url)
    kube = KubeCluster(client.ApiClient(config), resync_seconds=300, watch_timeout_seconds=30)
    kube.start()
    assert kube.wait_synced(15)
    yield kube
    kube.stop()


def names(kube: KubeCluster) -> set[str]:
    return {p["metadata"]["name"] for p in kube.state.pods().values()}


def test_list_then_watch_sees_adds_modifications_and_deletes(server, cluster):
    assert set(cluster.state.nodes()) == {"gpu-0", "gpu-1"}
    assert names(cluster) == {"a"}
    server.put("pods", pod("b"))
    server.put("pods", pod("a", node_name="gpu-0"))
    server.delete("nodes", "gpu-1")
    assert wait_for(lambda: names(cluster) == {"a", "b"} and "gpu-1" not in cluster.state.nodes())
    bound = cluster.state.pod_by_name("ml", "a")
    assert bound is not None and bound["spec"]["nodeName"] == "gpu-0"
    server.delete("pods", "ml/b")
    assert wait_for(lambda: names(cluster) == {"a"})
    assert cluster.relists["pods"] == 1  # events alone, no relist needed


def test_bookmark_advances_the_resource_version(server, cluster):
    server.bookmark("pods")
    assert wait_for(lambda: cluster.state.resource_version["pods"] == str(server.rv))


def watching(server: FakeApiServer, kind: str) -> int:
    """Wait until a watch of ``kind`` is open; returns how many were opened.

    A stream must be open before it is cut or its version compacted: on a loaded machine
    the client may still be between its first list and its first watch, and a watch then
    opened from the listed (current) version is neither dropped nor too old."""
    assert wait_for(lambda: server.watch_count[kind] >= 1)
    return server.watch_count[kind]


def test_dropped_stream_relists_without_losing_a_pod(server, cluster):
    watches = watching(server, "pods")
    server.drop_watches()
    # Changes while no watch is open are only visible through the relist.
    server.put("pods", pod("during-outage"))
    server.delete("pods", "ml/a")
    assert wait_for(lambda: names(cluster) == {"during-outage"})
    assert cluster.relists["pods"] >= 2
    assert wait_for(lambda: server.watch_count["pods"] > watches)
    server.put("pods", pod("after"))
    assert wait_for(lambda: names(cluster) == {"during-outage", "after"})


def test_410_gone_relists_and_resumes(server, cluster):
    watching(server, "pods")
    relists = cluster.relists["pods"]
    server.drop_watches()  # the client reconnects ...
    server.compact()  # ... but its version is gone by then: ERROR 410 on the watch
    server.put("pods", pod("c"))
    assert wait_for(lambda: "c" in names(cluster))
    assert cluster.relists["pods"] > relists
    server.put("pods", pod("d"))
    assert wait_for(lambda: names(cluster) == {"a", "c", "d"})


def test_410_on_a_live_watch_is_recovered(server, cluster):
    watching(server, "nodes")
    relists = cluster.relists["nodes"]
    server.compact()
    server.drop_watches()
    # The resumed watch starts from a compacted version: 410 Gone, so the client relists.
    # (A write before the client notices the drop could reach it on the old stream and
    # move its resourceVersion past the compaction, so the write waits for the relist.)
    assert wait_for(lambda: cluster.relists["nodes"] > relists)
    server.put("nodes", node("gpu-2"))
    assert wait_for(lambda: set(cluster.state.nodes()) == {"gpu-0", "gpu-1", "gpu-2"})
    assert any("watch=" in r and "/nodes" in r for r in server.requests)


def test_410_gone_on_a_resumed_watch_is_logged_as_gone_and_relisted_at_once(server, caplog):
    """A watch resumed (after its server-side timeout) from a compacted version gets an
    ERROR event with code 410: the log names it (``watch.gone``), and the informer relists
    at once, with no back-off as for a broken connection."""
    config = client.Configuration(host=server.url)
    kube = KubeCluster(client.ApiClient(config), resync_seconds=300, watch_timeout_seconds=1)
    caplog.set_level(logging.INFO, logger="elastico_extender.cluster.kube")
    kube.start()
    try:
        assert kube.wait_synced(15)
        relists = kube.relists["pods"]
        server.put("nodes", node("gpu-2"))  # a newer revision elsewhere, then compaction:
        server.compact()  # the pods watch's version is now too old
        assert wait_for(lambda: kube.relists["pods"] > relists)
    finally:
        kube.stop()
    said = [(r.getMessage(), getattr(r, "kind", None)) for r in caplog.records]
    assert ("watch.gone", "pods") in said
    assert not [r for r in caplog.records if r.getMessage() == "watch.dropped"]


def test_watches_the_api_server_ends_at_once_are_reopened_with_a_back_off(server, cluster):
    """An API server (shutting down, or a proxy in front of it) that ends every watch
    cleanly at once, before any event: the informer backs off between watches, as
    client-go's reflector does for a "very short watch", instead of reopening them as
    fast as the connection allows (some twenty a second before the fix); no event is
    lost, and a watch that lasts again resets the back-off."""
    watching(server, "pods")
    server.watch_limit_seconds = 0.0
    time.sleep(0.3)  # the open watches see the limit at their next wake-up
    opened = server.watch_count["pods"]
    time.sleep(2.0)
    assert server.watch_count["pods"] - opened <= 6  # 0.2 s doubling: about four
    server.put("pods", pod("while-short"))  # delivered by the next short watch
    assert wait_for(lambda: "while-short" in names(cluster))
    server.watch_limit_seconds = None
    assert wait_for(lambda: server.watch_count["pods"] > opened + 1)
    server.put("pods", pod("after"))
    assert wait_for(lambda: {"while-short", "after"} <= names(cluster), timeout=5)


def test_a_stalled_watch_is_replaced_and_relisted_within_its_timeout_and_grace(server, caplog):
    """A watch whose connection stays open and brings nothing more, past its own
    timeoutSeconds (a proxy or load balancer that lost the API server half-way: the fake
    holds every stream open in silence).  The informer reads with a timeout of
    ``watch_timeout_seconds + watch_grace_seconds`` (3 s here), so it gives the stream
    up, logs ``watch.stalled`` and relists: a pod created meanwhile, which the stalled
    stream never delivers, is in the view within that bound.  Before, the read timeout
    was the watch timeout plus a fixed 30 s (270 s with the default 240 s watch), and
    nothing else noticed the stall."""
    config = client.Configuration(host=server.url)
    kube = KubeCluster(
        client.ApiClient(config),
        resync_seconds=300,
        watch_timeout_seconds=2,
        watch_grace_seconds=1.0,
    )
    caplog.set_level(logging.INFO, logger="elastico_extender.cluster.kube")
    kube.start()
    try:
        assert kube.wait_synced(15)
        watching(server, "pods")
        relists = kube.relists["pods"]
        server.stall_watches = True
        time.sleep(0.3)  # open streams see the stall at their next wake-up
        stalled_at = time.monotonic()
        server.put("pods", pod("during-stall"))  # only a relist can bring it now
        assert wait_for(lambda: "during-stall" in names(kube), timeout=20)
        # within the read timeout (3 s) plus a back-off and a list, not the 32 s of before
        assert time.monotonic() - stalled_at < 8
        assert kube.relists["pods"] > relists
        server.stall_watches = False
        server.put("pods", pod("after"))  # watched again: the view follows events
        assert wait_for(lambda: names(kube) == {"a", "during-stall", "after"})
    finally:
        kube.stop()
    said = [(r.getMessage(), getattr(r, "kind", None)) for r in caplog.records]
    assert ("watch.stalled", "pods") in said


def test_by_default_a_watch_asks_for_a_short_server_timeout_and_bookmarks(server):
    """The defaults bound how long a stall goes unnoticed to 75 s (60 s ``timeoutSeconds``,
    which the API server honours, plus 15 s of grace); each watch asks for bookmarks."""
    from elastico_extender.service.settings import ServiceSettings

    settings = ServiceSettings()
    assert settings.watch_timeout_seconds + settings.watch_grace_seconds <= 90
    kube = KubeCluster(client.ApiClient(client.Configuration(host=server.url)))
    kube.start()
    try:
        assert kube.wait_synced(15)
        assert wait_for(lambda: server.watch_count["pods"] >= 1)
    finally:
        kube.stop()
    watches = [r for r in server.requests if "watch=" in r and r.startswith("/api/v1/pods")]
    assert watches and all(
        "timeoutSeconds=60" in r and "allowWatchBookmarks=true" in r for r in watches
    ), watches
    with pytest.raises(ValueError, match="watch_grace_seconds"):
        KubeCluster(client.ApiClient(client.Configuration(host=server.url)),
                    watch_grace_seconds=0)  # fmt: skip


def test_a_bind_the_api_server_never_answers_fails_in_bounded_time(monkeypatch):
    """An API server that accepts the connection and never answers: the bind fails as
    'outcome unknown' (the caller keeps the booking) after the write timeout, instead of
    holding the extender's handler, and the booking's write lock, for ever."""
    import socket
    import threading

    from elastico_extender.cluster import kube as kube_module
    from elastico_extender.cluster.base import ClusterError

    monkeypatch.setattr(kube_module, "WRITE_TIMEOUT_SECONDS", 0.3)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    host = f"http://127.0.0.1:{silent.getsockname()[1]}"
    kube = KubeCluster(client.ApiClient(client.Configuration(host=host)))
    request = BindRequest("ml", "p", "uid-p", "gpu-0", {"elastico.io/node": "gpu-0"},
                          "elastico-p", {"K": "v"})  # fmt: skip
    outcome: list[BaseException | None] = []

    def bind() -> None:
        try:
            kube.bind(request)
            outcome.append(None)
        except ClusterError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=bind, daemon=True)
    thread.start()
    thread.join(timeout=10)
    alive = thread.is_alive()
    silent.close()
    assert not alive, "bind was still waiting for the API server"
    (exc,) = outcome
    assert isinstance(exc, ClusterError) and exc.status is None  # outcome unknown


def test_bind_writes_configmap_annotations_and_binding(server, cluster):
    a = cluster.state.pod_by_name("ml", "a")
    assert a is not None
    request = BindRequest(
        namespace="ml",
        name="a",
        uid=a["metadata"]["uid"],
        node="gpu-0",
        annotations={"elastico.io/assigned-devices": "1"},
        configmap="elastico-a",
        data={"CUDA_VISIBLE_DEVICES": "1"},
    )
    cluster.bind(request)
    cm = server.configmaps[("ml", "elastico-a")]
    assert cm["data"] == {"CUDA_VISIBLE_DEVICES": "1"}
    assert cm["metadata"]["ownerReferences"][0]["uid"] == a["metadata"]["uid"]
    assert server.bindings[0]["target"]["name"] == "gpu-0"
    assert wait_for(
        lambda: (
            (cluster.state.pod_by_name("ml", "a") or {}).get("spec", {}).get("nodeName") == "gpu-0"
        )
    )
    pod_a = cluster.state.pod_by_name("ml", "a") or {}
    assert pod_a["metadata"]["annotations"]["elastico.io/assigned-devices"] == "1"
    order = [r for r in server.requests if r.startswith(("POST", "PATCH"))]
    assert order == [  # two round trips: the decision travels with the Binding
        "POST /api/v1/namespaces/ml/configmaps",
        "POST /api/v1/namespaces/ml/pods/a/binding",
    ]
    assert server.bindings[0]["metadata"]["annotations"] == {"elastico.io/assigned-devices": "1"}


def test_a_pod_is_never_bound_without_its_decision(server, cluster):
    """Whatever stops between bind's writes, every version of the pod the API server
    ever held with a node also holds the decision (crash safety of issue 12 item 18)."""
    a = cluster.state.pod_by_name("ml", "a") or {}
    request = BindRequest("ml", "a", a["metadata"]["uid"], "gpu-1",
                          {"elastico.io/assigned-devices": "3"}, "elastico-a",
                          {"CUDA_VISIBLE_DEVICES": "3"})  # fmt: skip
    cluster.bind(request)
    versions = [obj for _, _, obj in server.events["pods"] if obj["metadata"]["name"] == "a"]
    bound = [v for v in versions if v["spec"].get("nodeName")]
    assert bound and all(
        v["metadata"].get("annotations", {}).get("elastico.io/assigned-devices") == "3"
        for v in bound
    )
    # A retried Binding gets 409, but the pod is bound as asked: the bind is done.
    cluster.bind(request)
    assert len(server.bindings) == 1


def test_evict_goes_through_the_eviction_api_and_reports_a_budget_refusal(server, cluster):
    from elastico_extender.cluster.base import ClusterError

    server.put("pods", pod("b", "gpu-0"))
    server.put("pods", pod("c", "gpu-1"))
    assert wait_for(lambda: {"b", "c"} <= names(cluster))
    b = cluster.state.pod_by_name("ml", "b") or {}
    with pytest.raises(ClusterError, match="404"):
        cluster.evict("ml", "nobody", "uid-x")
    with pytest.raises(ClusterError, match="409"):  # the UID precondition: not a successor
        cluster.evict("ml", "b", "some-other-uid")
    cluster.evict("ml", "b", b["metadata"]["uid"])
    assert server.evictions[0]["kind"] == "Eviction"
    assert server.evictions[0]["deleteOptions"]["preconditions"]["uid"] == b["metadata"]["uid"]
    assert wait_for(lambda: "b" not in names(cluster))  # the watch saw it go
    # ... after the version a real API server writes first: the DisruptionTarget
    # condition and a deletionTimestamp, then the deletion.
    seen = [(e, o) for _, e, o in server.events["pods"] if o["metadata"]["name"] == "b"]
    (kind, _), (_, before) = seen[-1], seen[-2]
    assert kind == "DELETED" and before["metadata"]["deletionTimestamp"]
    condition = before["status"]["conditions"][-1]
    assert (condition["type"], condition["reason"]) == ("DisruptionTarget", "EvictionByEvictionAPI")
    server.disruptions_allowed = 0
    c = cluster.state.pod_by_name("ml", "c") or {}
    with pytest.raises(ClusterError, match="PodDisruptionBudget"):
        cluster.evict("ml", "c", c["metadata"]["uid"])
    assert "c" in names(cluster)
    assert "POST /api/v1/namespaces/ml/pods/b/eviction" in server.requests


def test_a_reconfiguration_never_lands_on_a_same_named_successor(server, cluster):
    """The pod was deleted and recreated under its name (a StatefulSet's pod) after the
    epoch read it: the reconfiguration, meant for the old pod's UID, must not write the
    old pod's decision (its node, devices, budget) onto the successor, which may already
    run on other devices.  Before, the merge patch went by name and did; now it carries
    the UID as a precondition and the API server refuses it (a ClusterError with the
    4xx), as it refuses the Binding and the Eviction of another UID."""
    from elastico_extender.cluster.base import ClusterError

    old = cluster.state.pod_by_name("ml", "a") or {}
    old_uid = old["metadata"]["uid"]
    server.delete("pods", "ml/a")
    successor = pod("a", node_name="gpu-1")
    successor["metadata"]["uid"] = "uid-a-successor"
    successor["metadata"]["annotations"] = {"elastico.io/assigned-devices": "0"}
    server.put("pods", successor)
    request = BindRequest("ml", "a", old_uid, "gpu-0", {"elastico.io/assigned-devices": "3"},
                          "elastico-a", {"CUDA_VISIBLE_DEVICES": "3"})  # fmt: skip
    with pytest.raises(ClusterError) as refused:
        cluster.reconfigure(request)
    assert refused.value.status is not None and 400 <= refused.value.status < 500
    stored = server.objects["pods"]["ml/a"]
    assert stored["metadata"]["uid"] == "uid-a-successor"
    assert stored["metadata"]["annotations"] == {"elastico.io/assigned-devices": "0"}
    # the pod itself, the UID unchanged, is reconfigured as before
    current = dict(request.__dict__, uid="uid-a-successor")
    cluster.reconfigure(BindRequest(**current))
    assert server.objects["pods"]["ml/a"]["metadata"]["annotations"] == {
        "elastico.io/assigned-devices": "3"
    }


def test_a_binding_for_a_deleted_pods_uid_leaves_its_same_named_successor_unbound(server, cluster):
    """The Binding names the UID the extender decided for; kube-apiserver checks it as a
    precondition (409 Conflict), so a successor of the same name created since is neither
    bound nor given the old pod's decision.  (Before, the fake API server ignored the
    Binding's UID, so no test could see a bind reach the wrong pod.)"""
    from elastico_extender.cluster.base import ClusterError

    old_uid = (cluster.state.pod_by_name("ml", "a") or {})["metadata"]["uid"]
    server.delete("pods", "ml/a")
    successor = pod("a")
    successor["metadata"]["uid"] = "uid-a-successor"
    server.put("pods", successor)
    request = BindRequest("ml", "a", old_uid, "gpu-0", {"elastico.io/assigned-devices": "1"})
    with pytest.raises(ClusterError) as refused:
        cluster.bind(request)
    assert refused.value.status == 409
    assert "Precondition failed" in str(refused.value)
    stored = server.objects["pods"]["ml/a"]
    assert not stored["spec"].get("nodeName") and not stored["metadata"].get("annotations")
    assert server.bindings == []


def test_a_binding_retried_after_its_answer_was_lost_succeeds(server, cluster):
    """The first Binding lands but its answer never comes back (the connection drops:
    'outcome unknown'); kube-scheduler, or a duplicate bind waiting on the first, tries
    again and the API server answers 409, the pod being bound already, to the very node
    asked for.  That is the bind done, not a failure: before, the retry failed with the
    409 and the scheduler recorded FailedScheduling for a pod bound as it asked."""
    from elastico_extender.cluster.base import ClusterError

    a = cluster.state.pod_by_name("ml", "a") or {}
    request = BindRequest("ml", "a", a["metadata"]["uid"], "gpu-0",
                          {"elastico.io/assigned-devices": "1"})  # fmt: skip

    def lose_the_answer(method: str, path: str) -> None:
        if path.endswith("/binding"):
            server.before_reply = None
            raise ConnectionResetError("the answer is lost")  # the handler hangs up

    server.before_reply = lose_the_answer
    with pytest.raises(ClusterError) as lost:
        cluster.bind(request)
    assert lost.value.status is None  # outcome unknown
    assert server.objects["pods"]["ml/a"]["spec"]["nodeName"] == "gpu-0"
    cluster.bind(request)  # the retry: 409 from the API server, the pod on gpu-0
    assert len(server.bindings) == 1
    # bound to another node than asked, or another pod of that name: still a 409 error
    with pytest.raises(ClusterError) as elsewhere:
        cluster.bind(BindRequest("ml", "a", a["metadata"]["uid"], "gpu-1"))
    assert elsewhere.value.status == 409 and 'already assigned to node "gpu-0"' in str(
        elsewhere.value
    )
