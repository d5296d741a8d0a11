"""The rings volume the webhook adds passes Pod Security by default; hostPath only on request.

Pod Security Admission's ``baseline`` (and so ``restricted``) level refuses a pod with any
``spec.volumes[*].hostPath``.  The webhook's patch is applied to the pod (RFC 6902 adds,
as the API server applies them) and the result checked like that.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import pytest
from kubernetes import client
from test_edge_handoff import apply_patch

from elastico_extender.annotations import RINGS_DIR, RINGS_VOLUME
from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {"name": "job", "namespace": "ml", "uid": "u-1",
                 "annotations": {"elastico.io/family": "bert"}},
    "spec": {"schedulerName": "elastico-scheduler",
             "containers": [{"name": "trainer", "image": "t",
                             "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
             "volumes": [{"name": "data", "emptyDir": {}}]},
}  # fmt: skip


def admitted(settings: ServiceSettings) -> dict[str, Any]:
    """The pod as stored after the webhook's patch, through the real HTTP endpoint."""
    app = create_app(settings, EmbeddedCluster([], "test"))
    with ServerThread(app) as server:
        body = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": "r", "operation": "CREATE", "object": POD}}  # fmt: skip
        response = httpx.post(f"{server.url}/mutate", json=body, timeout=10).json()["response"]
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    pod: dict[str, Any] = apply_patch(POD, patch)
    # a valid Pod for the kubernetes client's model: nothing dropped in the round trip
    api = client.ApiClient()
    model = api.deserialize(json.dumps(pod), "V1Pod", "application/json")
    assert api.sanitize_for_serialization(model) == pod
    return pod


def baseline_violations(pod: dict[str, Any]) -> list[str]:
    """Pod Security baseline's volume rule: no hostPath volume."""
    return [v["name"] for v in pod["spec"].get("volumes", []) if "hostPath" in v]


def rings_of(pod: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == RINGS_VOLUME]
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == RINGS_VOLUME]
    env = {e["name"]: e.get("value") or e.get("valueFrom") for e in container["env"]}
    return volume, mount, env


def test_default_patch_mounts_a_memory_emptydir_and_no_hostpath() -> None:
    pod = admitted(ServiceSettings(epoch_seconds=60))
    assert baseline_violations(pod) == []
    volume, mount, env = rings_of(pod)
    assert volume == {"name": RINGS_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "256Mi"}}
    assert mount["mountPath"] == RINGS_DIR == env["ELASTICO_RING_ROOT"]
    assert not mount.get("readOnly")  # the shim writes there
    assert env["ELASTICO_POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert {"name": "data", "emptyDir": {}} in pod["spec"]["volumes"]  # the user's kept


def test_disk_medium_without_a_size_limit_on_request() -> None:
    pod = admitted(ServiceSettings(epoch_seconds=60, rings_medium="", rings_size_limit=""))
    volume, _, _ = rings_of(pod)
    assert volume == {"name": RINGS_VOLUME, "emptyDir": {}}
    assert baseline_violations(pod) == []


def test_legacy_hostpath_mode_mounts_the_shared_host_directory() -> None:
    settings = ServiceSettings.load(
        env={"ELASTICO_RINGS_VOLUME": "hostPath", "ELASTICO_RINGS_HOST_PATH": "/run/gpu/rings"}
    )
    pod = admitted(settings)
    assert baseline_violations(pod) == [RINGS_VOLUME]
    volume, mount, env = rings_of(pod)
    assert volume["hostPath"] == {"path": "/run/gpu/rings", "type": "DirectoryOrCreate"}
    assert mount["mountPath"] == RINGS_DIR == env["ELASTICO_RING_ROOT"]


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"rings_volume": "configMap"}, "rings_volume: must be emptyDir or hostPath"),
        ({"rings_medium": "HugePages-2Mi"}, "rings_medium: must be Memory or empty"),
        ({"rings_size_limit": "lots"}, "rings_size_limit: not a Kubernetes quantity"),
        ({"rings_size_limit": "4Ki"}, "rings_size_limit: must be at least 1Mi"),
        ({"rings_host_path": "run/rings"}, "rings_host_path: must be an absolute path"),
        ({"rings_host_path": "/run/../etc"}, "rings_host_path: must be an absolute path"),
    ],
)
def test_invalid_rings_settings_are_refused_naming_the_field(values, named) -> None:
    with pytest.raises(ValueError, match=named):
        ServiceSettings.load(overrides=values)


def test_each_gpu_container_is_told_its_name_for_a_ring_directory_of_its_own() -> None:
    from elastico_extender.annotations import parse_intent
    from elastico_extender.api.routes.webhook import mutation_patch
    from elastico_extender.service.families import FamilyResolver

    gpu = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}
    evaluator = {"name": "evaluator", "image": "t", "env": [{"name": "X", "value": "1"}], **gpu}
    containers = [{"name": "trainer", "image": "t", **gpu}, evaluator]
    pod = {**POD, "spec": {**POD["spec"], "containers": containers}}
    intent = parse_intent(pod["metadata"]["annotations"], FamilyResolver(40960.0))
    assert intent is not None
    patched = apply_patch(pod, mutation_patch(pod, intent, mps=True))
    named = [
        {e["name"]: e.get("value") for e in c["env"]}["ELASTICO_CONTAINER_NAME"]
        for c in patched["spec"]["containers"]
    ]
    assert named == ["trainer", "evaluator"]
    assert baseline_violations(patched) == []
