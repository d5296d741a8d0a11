"""Service behaviour over real HTTP: bad input, in-flight binds, restarts, REST, webhook."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator

import httpx
import pytest

from elastico_extender.api.app import create_app
from elastico_extender.cluster.base import BindRequest
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def gpu_node(name: str, gpus: int = 1, memory_mib: int = 40960) -> dict:
    labels = {"nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": str(memory_mib),
              "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}  # fmt: skip
    alloc = {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus), "pods": "110"}
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels},
            "spec": {}, "status": {"allocatable": alloc, "capacity": alloc}}  # fmt: skip


def elastic_pod(name: str, family: str = "bert", **extra: str) -> dict:
    """An opted-in pod as stored after the webhook admitted it."""
    return webhook_applied(raw_elastic_pod(name, family, **extra))


def raw_elastic_pod(name: str, family: str = "bert", **extra: str) -> dict:
    """An opted-in pod as its author wrote it (before the webhook)."""
    annotations = {
        "elastico.io/family": family,
        **{f"elastico.io/{k}": v for k, v in extra.items()},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}",
                     "annotations": annotations},
        "spec": {"schedulerName": "elastico-scheduler", "containers": [{"name": "main",
                 "image": "img", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"},
    }  # fmt: skip


def webhook_applied(pod: dict) -> dict:
    """``pod`` as the API server stores it after the mutating webhook's patch."""
    from elastico_extender.annotations import parse_intent
    from elastico_extender.api.routes.webhook import mutation_patch
    from elastico_extender.errors import AnnotationError
    from elastico_extender.service.families import FamilyResolver

    try:
        intent = parse_intent(pod["metadata"]["annotations"], FamilyResolver(40960.0))
    except AnnotationError:
        return pod  # admitted unchanged, with warnings
    if intent is None:
        return pod
    return apply_patch(pod, mutation_patch(pod, intent, mps=True))


def apply_patch(obj: dict, ops: list[dict]) -> dict:
    """RFC 6902 ``add`` operations, as the API server applies a webhook's JSONPatch."""
    import copy

    out = copy.deepcopy(obj)
    for op in ops:
        assert op["op"] == "add"
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target = out
        for part in parts[:-1]:
            target = target[int(part)] if isinstance(target, list) else target[part]
        last = parts[-1]
        if isinstance(target, list):
            target.append(op["value"]) if last == "-" else target.insert(int(last), op["value"])
        else:
            target[last] = op["value"]
    return out


class LaggingCluster(EmbeddedCluster):
    """Bind succeeds at the API server, but the watch has not delivered it yet."""

    def bind(self, request: BindRequest) -> None:
        self.bindings.append({"target": {"name": request.node}, "request": request})


def start(cluster: EmbeddedCluster, **settings) -> tuple[ServerThread, str]:
    app = create_app(ServiceSettings(epoch_seconds=60, **settings), cluster)
    return ServerThread(app).start(), app.state.token


@pytest.fixture
def one_gpu() -> Iterator[tuple[str, str, LaggingCluster]]:
    cluster = LaggingCluster([gpu_node("g0")], "test")
    server, token = start(cluster)
    yield server.url, token, cluster
    server.stop()


def call(url: str, verb: str, body: object, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{url}/scheduler/{verb}", content=data, headers=headers, timeout=30)


def args(pod: dict, names: list[str]) -> dict:
    return {"Pod": pod, "Nodes": None, "NodeNames": names}


@pytest.mark.parametrize(
    ("body", "status", "fragment"),
    [
        (b"{not json", 400, "malformed JSON"),
        (b"", 400, "empty"),
        (b"[1, 2]", 400, "ExtenderArgs"),
        (json.dumps({"Pod": "x", "NodeNames": ["g0"]}).encode(), 400, "Pod"),
        (json.dumps({"Pod": {"metadata": {}}, "NodeNames": "g0"}).encode(), 400, "NodeNames"),
        (
            json.dumps({"Pod": {"metadata": {}}, "Nodes": {"items": [{"spec": {}}]}}).encode(),
            400,
            "metadata.name",
        ),
        (json.dumps({"Pod": {"metadata": 7}, "NodeNames": []}).encode(), 400, "metadata"),
    ],
)
def test_bad_filter_bodies_get_a_4xx_with_an_error(one_gpu, body, status, fragment):
    url, _, _ = one_gpu
    reply = call(url, "filter", body)
    assert reply.status_code == status
    assert fragment in reply.json()["Error"]
    assert httpx.get(f"{url}/healthz").status_code == 200  # still serving


def test_oversized_body_is_refused_and_the_server_keeps_serving():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    server, _ = start(cluster, max_body_bytes=4096)
    try:
        big = json.dumps(args(elastic_pod("p"), ["n"] * 5000)).encode()
        assert call(server.url, "filter", big).status_code == 413
        ok = call(server.url, "filter", args(elastic_pod("p"), ["g0"]))
        assert ok.status_code == 200 and ok.json()["NodeNames"] == ["g0"]
    finally:
        server.stop()


def test_bind_with_wrong_types_and_unknown_pods(one_gpu):
    url, token, _ = one_gpu
    reply = call(url, "bind", {"PodName": 3, "PodNamespace": "ml", "PodUID": "u", "Node": "g0"},
                 token)  # fmt: skip
    assert reply.status_code == 400 and "PodName" in reply.json()["Error"]
    reply = call(url, "bind", {"PodName": "ghost", "PodNamespace": "ml", "PodUID": "u",
                               "Node": "g0"}, token)  # fmt: skip
    assert reply.status_code == 200 and "not known" in reply.json()["Error"]


def test_unknown_nodes_and_invalid_annotations_are_reported_per_node(one_gpu):
    url, _, _ = one_gpu
    body = call(url, "filter", args(elastic_pod("p"), ["g0", "nowhere"])).json()
    assert body["NodeNames"] == ["g0"]
    assert "not in its cluster view" in body["FailedAndUnresolvableNodes"]["nowhere"]
    bad = elastic_pod("q", weight="-2", mode="sometimes", allowed="batch=1..2")
    body = call(url, "filter", args(bad, ["g0"])).json()
    assert body["NodeNames"] == []
    reason = body["FailedAndUnresolvableNodes"]["g0"]
    for key in ("elastico.io/weight", "elastico.io/mode", "elastico.io/allowed"):
        assert key in reason


def test_pods_without_annotations_or_gpus_pass_through(one_gpu):
    url, _, _ = one_gpu
    plain = {"metadata": {"name": "web", "namespace": "ml", "uid": "w"},
             "spec": {"containers": [{"name": "c", "image": "nginx"}]}}  # fmt: skip
    body = call(url, "filter", args(plain, ["g0", "other"])).json()
    assert body["NodeNames"] == ["g0", "other"] and body["FailedNodes"] == {}


def test_in_flight_bind_counts_against_capacity(one_gpu):
    url, token, cluster = one_gpu
    a, b = elastic_pod("a"), elastic_pod("b")  # bert needs >= 22 GiB; two never fit 40 GiB
    cluster.add_pod(a)
    cluster.add_pod(b)
    assert call(url, "filter", args(a, ["g0"])).json()["NodeNames"] == ["g0"]
    bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
    assert call(url, "bind", bind, token).json() == {"Error": ""}
    # the watch has not shown a bound pod yet, but b must not get the same GPU memory
    body = call(url, "filter", args(b, ["g0"])).json()
    assert body["NodeNames"] == []
    assert "memory" in body["FailedNodes"]["g0"] or "compute" in body["FailedNodes"]["g0"]
    # an epoch in between keeps the assumption
    assert (
        httpx.post(f"{url}/epoch", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    )
    assert call(url, "filter", args(b, ["g0"])).json()["NodeNames"] == []
    bind_b = {"PodName": "b", "PodNamespace": "ml", "PodUID": "uid-b", "Node": "g0"}
    assert "cannot take" in call(url, "bind", bind_b, token).json()["Error"]
    request = cluster.bindings[0]["request"]
    assert request.annotations["elastico.io/assigned-devices"] == "0"
    assert float(request.data["ELASTICO_MEMORY_FRACTION"]) > 0
    assert request.data["PYTORCH_CUDA_ALLOC_CONF"].startswith("max_split_size_mb:")
    assert request.data["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith("0=")


def test_restarted_extender_rebuilds_placements_from_the_api_server():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("a"))
    cluster.add_pod(elastic_pod("b"))
    server, token = start(cluster)
    try:
        bind = {"PodName": "a", "PodNamespace": "ml", "PodUID": "uid-a", "Node": "g0"}
        assert call(server.url, "bind", bind, token).json() == {"Error": ""}
    finally:
        server.stop()
    # a fresh process sees only what the API server holds
    restarted = EmbeddedCluster(
        list(cluster.state.nodes().values()) + list(cluster.state.pods().values()), "restart"
    )
    server, token = start(restarted)
    try:
        pod_b = restarted.state.pod_by_name("ml", "b")
        body = call(server.url, "filter", args(pod_b, ["g0"])).json()
        assert body["NodeNames"] == []
        nodes = httpx.get(f"{server.url}/nodes").json()
        assert nodes[0]["gpus"][0]["pods"] == ["ml/a"]
        jobs = {j["pod"]: j for j in httpx.get(f"{server.url}/jobs").json() if "pod" in j}
        assert jobs["ml/a"]["state"] == "running"
    finally:
        server.stop()


def test_rest_views_and_operations():
    cluster = EmbeddedCluster.from_file()
    server, _token = start(cluster)
    try:
        url = server.url
        prices = httpx.get(f"{url}/prices").json()
        assert set(prices["resources"]) == {"gpu_sm", "gpu_mem_mib", "cpu_cores", "host_mem_mib"}
        assert prices["history"]
        jobs = {j["pod"]: j for j in httpx.get(f"{url}/jobs").json()}
        assert jobs["ml/bert-finetune"]["floor"] == 90.0
        assert jobs["ml/bert-finetune"]["devices"][0].startswith("gpu-a100-0/")
        assert "predicted_slowdown" in jobs["ml/llama3-batch-infer"]
        nodes = {n["name"]: n for n in httpx.get(f"{url}/nodes").json()}
        assert len(nodes["gpu-a100-80g-0"]["gpus"]) == 8
        assert nodes["gpu-a100-80g-0"]["gpus"][0]["memory_mib"] == 81920
        published = httpx.get(f"{url}/plan").json()
        assert published["epoch"] >= 1
        assert published["utilization"] > 0  # U(t) behind the plan's tolerances
        assert httpx.get(f"{url}/readyz").status_code == 200
        health = httpx.get(f"{url}/healthz").json()
        assert health["predictor"] and "degraded_predictor" in health
        assert httpx.post(f"{url}/epoch").status_code == 401
        assert (
            httpx.post(f"{url}/epoch", headers={"Authorization": "Bearer nope"}).status_code == 401
        )
        call(url, "filter", args(elastic_pod("x"), ["gpu-a100-0", "ghost"]))
        metrics = httpx.get(f"{url}/metrics").text
        for name in ("elastico_extender_request_seconds_bucket", "elastico_epoch_seconds",
                     "elastico_price{", 'elastico_rejections_total{reason="unknown-node"}',
                     "elastico_colocated_devices"):  # fmt: skip
            assert name in metrics
        spec = httpx.get(f"{url}/openapi.json").json()
        assert {"/scheduler/filter", "/scheduler/bind", "/prices", "/mutate"} <= set(spec["paths"])
    finally:
        server.stop()


def test_webhook_adds_configmap_env_and_downward_api():
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    server, _ = start(cluster)
    try:
        pod = raw_elastic_pod("trainer")
        pod["metadata"]["annotations"]["elastico.io/kind"] = "training"
        review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                  "request": {"uid": "r1", "operation": "CREATE", "object": pod}}  # fmt: skip
        reply = httpx.post(f"{server.url}/mutate", json=review).json()
        response = reply["response"]
        assert response["uid"] == "r1" and response["allowed"] is True
        patch = json.loads(base64.b64decode(response["patch"]))
        by_path = {op["path"]: op["value"] for op in patch}
        configmap = by_path["/metadata/annotations/elastico.io~1configmap"]
        env = {e["name"]: e for e in by_path["/spec/containers/0/env"]}
        for key in ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES",
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "ELASTICO_MEMORY_FRACTION"):  # fmt: skip
            assert env[key]["valueFrom"]["configMapKeyRef"] == {"name": configmap, "key": key}
        assert by_path["/spec/volumes"][0]["downwardAPI"]["items"][0]["fieldRef"] == {
            "fieldPath": "metadata.annotations"
        }
        # the pod uid and the rings volume (an emptyDir, which Pod Security admits):
        # elastico-run puts the shim's rings there under the pod's uid, where the node
        # agent finds them through the kubelet's pods directory
        assert env["ELASTICO_POD_UID"]["valueFrom"]["fieldRef"] == {"fieldPath": "metadata.uid"}
        rings = by_path["/spec/volumes"][1]
        assert "hostPath" not in rings and rings["emptyDir"]["medium"] == "Memory"
        mounts = {m["name"]: m["mountPath"] for m in by_path["/spec/containers/0/volumeMounts"]}
        assert mounts[rings["name"]] == env["ELASTICO_RING_ROOT"]["value"]
        plain = {"uid": "r2", "operation": "CREATE", "object": {"metadata": {"name": "web"},
                 "spec": {"containers": [{"name": "c"}]}}}  # fmt: skip
        reply = httpx.post(f"{server.url}/mutate", json={"request": plain}).json()
        assert "patch" not in reply["response"] and reply["response"]["allowed"]
        assert httpx.post(f"{server.url}/mutate", content=b"{").status_code == 400
    finally:
        server.stop()


def test_epoch_reconfigures_a_running_pod_in_place_to_admit_another():
    """Spec 5.3 Case 1 end to end: BERT runs at its peak on the only GPU; when ResNet-50
    arrives the epoch reshapes BERT in place and writes the new configuration to its
    ConfigMap and annotations (what elastico-run reads), without a new Binding."""
    cluster = EmbeddedCluster([gpu_node("g0")], "test")
    cluster.add_pod(elastic_pod("bert-a", "bert"))
    server, token = start(cluster, min_dwell_seconds=0)  # reshaped at once: no dwell
    auth = {"Authorization": f"Bearer {token}"}
    try:
        bind = {"PodName": "bert-a", "PodNamespace": "ml", "PodUID": "uid-bert-a", "Node": "g0"}
        assert call(server.url, "bind", bind, token).json() == {"Error": ""}
        before = dict(cluster.state.pod_by_name("ml", "bert-a")["metadata"]["annotations"])
        assert float(before["elastico.io/memory-budget-mib"]) > 30 * 1024  # peak: 36 GB
        cluster.add_pod(elastic_pod("resnet-b", "resnet50"))
        assert httpx.post(f"{server.url}/epoch", headers=auth).status_code == 200
        after = cluster.state.pod_by_name("ml", "bert-a")["metadata"]["annotations"]
        assert (
            after["elastico.io/assigned-configuration"]
            != before["elastico.io/assigned-configuration"]
        )
        assert float(after["elastico.io/memory-budget-mib"]) < float(
            before["elastico.io/memory-budget-mib"]
        )
        assert after["elastico.io/assigned-node"] == "g0"  # in place: same node, same GPU
        assert len(cluster.bindings) == 1  # no second Binding
        data = cluster.configmaps[("ml", after["elastico.io/configmap"])]["data"]
        assert data["ELASTICO_CONFIGURATION"] == after["elastico.io/assigned-configuration"]
        # and ResNet-50 now fits next to it
        pod_b = cluster.state.pod_by_name("ml", "resnet-b")
        assert call(server.url, "filter", args(pod_b, ["g0"])).json()["NodeNames"] == ["g0"]
    finally:
        server.stop()


def test_extender_verbs_report_their_own_time_in_server_timing(one_gpu):
    url, _, _ = one_gpu
    for verb in ("filter", "prioritize"):
        reply = call(url, verb, args(elastic_pod("timed"), ["g0"]))
        assert reply.status_code == 200
        name, _, duration = reply.headers["Server-Timing"].partition(";dur=")
        assert name == "extender" and 0.0 < float(duration) < 10_000.0
