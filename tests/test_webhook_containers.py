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


def test_a_setting_the_container_sets_itself_follows_the_user_at_run_time_too():
    """The webhook keeps a container's own PYTORCH_CUDA_ALLOC_CONF / CUDA_VISIBLE_DEVICES
    and warns; elastico-run, which sees that value and the ConfigMap's alike in its
    environment, must not then overwrite it with the decision's (it did)."""
    from elastico_extender.annotations import parse_intent
    from elastico_extender.api.routes.webhook import mutation_patch
    from elastico_extender.launcher.assignment import read_assignment
    from elastico_extender.launcher.run import build_launch
    from elastico_extender.service.families import FamilyResolver

    own = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "CUDA_VISIBLE_DEVICES": "1"}
    user_env = [{"name": k, "value": v} for k, v in own.items()]
    obj = pod([{"name": "trainer", "image": "t", "env": user_env, **GPU}])
    intent = parse_intent(obj["metadata"]["annotations"], FamilyResolver(40960.0))
    ops = mutation_patch(obj, intent, mps=False)
    added = [op["value"] for op in ops if op["path"] == "/spec/containers/0/env/-"]
    decision = {
        "elastico.io/workload-kind": "training",
        "elastico.io/assigned-knobs": json.dumps(dict(intent.family.configs[0].knobs)),
        "elastico.io/memory-budget-mib": "10240",
        "elastico.io/device-memory-mib": "40960",
    }
    decided = read_assignment(decision, {}).settings().env  # what bind writes the ConfigMap
    # the container's environment as the kubelet builds it: its own values, then the
    # webhook's (a ConfigMap reference resolves to the decision)
    environ = {e["name"]: e["value"] for e in user_env}
    for e in added:
        if "value" in e:
            environ[e["name"]] = e["value"]
        elif "configMapKeyRef" in e["valueFrom"]:
            environ[e["name"]] = decided[e["valueFrom"]["configMapKeyRef"]["key"]]
    settings = read_assignment(decision, environ).settings()
    assert set(own) <= set(settings.env)  # the decision does state both
    _, env = build_launch(["python", "train.py"], settings, environ)
    assert {k: env[k] for k in own} == own  # kept as the user wrote them
    assert env["ELASTICO_MEMORY_FRACTION"] == settings.env["ELASTICO_MEMORY_FRACTION"]
    # a container that sets nothing itself gets every setting from the decision
    bare = pod([{"name": "trainer", "image": "t", **GPU}])
    (env_op,) = [
        op for op in mutation_patch(bare, intent, mps=False) if op["path"].endswith("/env")
    ]
    assert "ELASTICO_USER_SETTINGS" not in {e["name"] for e in env_op["value"]}
