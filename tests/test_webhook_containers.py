"""The webhook gives GPU settings to GPU containers only, and says what it keeps."""

from __future__ import annotations

import base64
import json

import httpx

from elastico_extender.api.app import create_app
from elastico_extender.api.routes.webhook import gpu_containers
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings


def pod(containers: list[dict]) -> dict:
    return {"metadata": {"name": "job", "namespace": "ml",
                         "annotations": {"elastico.io/family": "bert"}},
            "spec": {"schedulerName": "elastico-scheduler", "containers": containers}}  # fmt: skip


def review(server: ServerThread, obj: dict) -> dict:
    body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r", "operation": "CREATE", "object": obj}}  # fmt: skip
    return httpx.post(f"{server.url}/mutate", json=body, timeout=10).json()["response"]


def patched_paths(response: dict) -> set[str]:
    return {op["path"] for op in json.loads(base64.b64decode(response["patch"]))}


GPU = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}


def test_gpu_containers_are_the_ones_requesting_a_gpu_else_the_first():
    assert gpu_containers({"containers": [{"name": "log"}, {"name": "main", **GPU}]}) == [1]
    assert gpu_containers({"containers": [{"name": "main"}, {"name": "log"}]}) == [0]
    assert gpu_containers({"containers": []}) == []


def test_sidecars_get_no_gpu_env_and_a_user_cuda_visible_devices_is_kept_with_a_warning():
    app = create_app(ServiceSettings(epoch_seconds=60), EmbeddedCluster([], "test"))
    with ServerThread(app) as server:
        user_env = [{"name": "CUDA_VISIBLE_DEVICES", "value": "1"}]
        response = review(server, pod([
            {"name": "istio-proxy", "image": "proxy"},
            {"name": "trainer", "image": "t", "env": user_env, **GPU},
            {"name": "log-shipper", "image": "fluent"},
        ]))  # fmt: skip
        paths = patched_paths(response)
        assert any(p.startswith("/spec/containers/1/env") for p in paths)
        assert not any(p.startswith(("/spec/containers/0/", "/spec/containers/2/")) for p in paths)
        ops = json.loads(base64.b64decode(response["patch"]))
        added = [op["value"]["name"] for op in ops if op["path"] == "/spec/containers/1/env/-"]
        assert "CUDA_VISIBLE_DEVICES" not in added and "PYTORCH_CUDA_ALLOC_CONF" in added
        (warning,) = response["warnings"]
        assert "trainer sets CUDA_VISIBLE_DEVICES itself" in warning


def test_elastico_run_reads_the_decision_file_where_the_webhook_mounts_it():
    from elastico_extender.annotations import parse_intent
    from elastico_extender.api.routes.webhook import mutation_patch
    from elastico_extender.launcher.run import DEFAULT_ANNOTATIONS
    from elastico_extender.service.families import FamilyResolver

    obj = pod([{"name": "trainer", "image": "t", **GPU}])
    intent = parse_intent(obj["metadata"]["annotations"], FamilyResolver(40960.0))
    ops = mutation_patch(obj, intent, mps=True)
    by_path = {op["path"]: op["value"] for op in ops}
    env = {e["name"]: e.get("value") for e in by_path["/spec/containers/0/env"]}
    from elastico_extender.api.routes.webhook import DECISION_VOLUME

    (mount,) = [
        m for m in by_path["/spec/containers/0/volumeMounts"] if m["name"] == DECISION_VOLUME
    ]  # the rings volume is mounted beside it (node agent)
    (item,) = by_path["/spec/volumes"][0]["downwardAPI"]["items"]
    mounted = f"{mount['mountPath']}/{item['path']}"
    assert mounted == DEFAULT_ANNOTATIONS
    named_file = [v for k, v in env.items() if k.endswith(("_FILE",)) and v]
    assert all(value == mounted for value in named_file)


def test_the_profiling_annotation_elastico_run_reads_is_accepted_not_reported_unknown():
    from elastico_extender.annotations import parse_intent
    from elastico_extender.service.families import FamilyResolver

    intent = parse_intent(
        {"elastico.io/family": "bert", "elastico.io/profiling": "true"}, FamilyResolver(40960.0)
    )
    assert intent is not None
    assert parse_intent({"elastico.io/profiling": "true"}, FamilyResolver(40960.0)) is None
