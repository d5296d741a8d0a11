"""The webhook against what the API server sends and expects (admission.k8s.io/v1).

Each request is the AdmissionReview the API server posts for a pod CREATE (``kind``,
``resource``, ``userInfo``, ``options``, ``dryRun``; a controller's pod has only
``generateName``), sent to the real endpoint over HTTP; the patch is applied as RFC 6902
(``test_edge_handoff.apply_patch``: a missing parent fails) and the result checked the
way the API server's pod validation would refuse it.
"""

from __future__ import annotations

import base64
import copy
import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from test_edge_handoff import apply_patch

from elastico_extender.annotations import DECISION_VOLUME, RINGS_VOLUME
from elastico_extender.api.app import create_app
from elastico_extender.cluster.embedded import EmbeddedCluster
from elastico_extender.service.server import ServerThread
from elastico_extender.service.settings import ServiceSettings

UID = "705ab4f5-6393-11e8-b7cc-42010a800002"
GPU = {"resources": {"limits": {"nvidia.com/gpu": "1"}}}


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    app = create_app(ServiceSettings(epoch_seconds=3600), EmbeddedCluster([], "test"))
    with ServerThread(app) as running:
        yield running


def new_pod(**spec: Any) -> dict[str, Any]:
    """A Job controller's pod as the API server hands it to admission: defaulted, no
    name yet (``generateName``), ``creationTimestamp: null``."""
    pod: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"generateName": "train-7d9f4-", "namespace": "ml",
                     "creationTimestamp": None,
                     "annotations": {"elastico.io/family": "bert"}},
        "spec": {"schedulerName": "elastico-scheduler", "restartPolicy": "Never",
                 "containers": [{"name": "trainer", "image": "t", **GPU}]},
        "status": {},
    }  # fmt: skip
    pod["spec"].update(spec)
    return pod


def review(obj: Any, **request: Any) -> dict[str, Any]:
    body = {
        "uid": UID,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "namespace": "ml",
        "operation": "CREATE",
        "userInfo": {"username": "system:serviceaccount:kube-system:job-controller",
                     "groups": ["system:serviceaccounts", "system:authenticated"]},
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
    }  # fmt: skip
    body.update(request)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}


def post(server: ServerThread, body: Any) -> dict[str, Any]:
    reply = httpx.post(f"{server.url}/mutate", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    answer: dict[str, Any] = reply.json()
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    response: dict[str, Any] = answer["response"]
    assert response["uid"] == body["request"]["uid"] and response["allowed"] is True
    return response


def admit(server: ServerThread, obj: dict[str, Any], **request: Any) -> tuple[dict, dict]:
    """(the response, the pod as stored: the patch applied, or unchanged)."""
    response = post(server, review(obj, **request))
    if "patch" not in response:
        assert "patchType" not in response
        return response, obj
    assert response["patchType"] == "JSONPatch"
    return response, apply_patch(obj, json.loads(base64.b64decode(response["patch"])))


def refusals(pod: dict[str, Any]) -> list[str]:
    """What the API server's pod validation refuses among what the patch touches:
    duplicate volume names, a mount naming no volume, two mounts at one path."""
    spec = pod["spec"]
    found = []
    volumes = [v["name"] for v in spec.get("volumes") or []]
    found += [f"volume {n} twice" for n in set(volumes) if volumes.count(n) > 1]
    for part in ("initContainers", "containers"):
        for c in spec.get(part) or []:
            mounts = c.get("volumeMounts") or []
            found += [f"{c['name']}: no volume {m['name']}" for m in mounts
                      if m["name"] not in volumes]  # fmt: skip
            paths = [m["mountPath"] for m in mounts]
            found += [f"{c['name']}: {p} twice" for p in set(paths) if paths.count(p) > 1]
    return found


def env_of(container: dict[str, Any]) -> list[str]:
    return [e["name"] for e in container.get("env") or []]


def test_a_pod_elastico_never_binds_is_left_unchanged_with_a_warning(server):
    """Only the chart's matchConditions kept such pods away: deploy/webhook.yaml has
    none, and the pod was wired to a ConfigMap that only ElastiCo's bind creates, so its
    containers never started (CreateContainerConfigError)."""
    for spec, named in (
        ({"schedulerName": "default-scheduler"}, "spec.schedulerName"),
        ({"nodeName": "gpu-3"}, "spec.nodeName"),
    ):
        response, _ = admit(server, new_pod(**spec))
        assert "patch" not in response
        (warning,) = response["warnings"]
        assert named in warning and "elastico" in warning.lower()
    response, _ = admit(server, new_pod())
    assert "patch" in response and "warnings" not in response


def test_a_pod_already_carrying_the_webhooks_additions_gets_nothing_twice(server):
    """``kubectl debug --copy-to``, or a pod or template written from ``kubectl get -o
    yaml`` of an admitted pod, arrives with the decision volume, rings volume, mounts and
    env: the second pass added both volumes again (the API server refused the pod:
    ``spec.volumes[2].name: Duplicate value``) and took the webhook's own ConfigMap
    references for the user's settings (a warning each, and ELASTICO_USER_SETTINGS naming
    them all, so elastico-run would ignore the decision)."""
    evaluator = {"name": "eval", "image": "t", "env": [{"name": "X", "value": "1"}], **GPU}
    containers = [{"name": "trainer", "image": "t", **GPU}, evaluator]
    _, once = admit(server, new_pod(containers=containers, volumes=[{"name": "d", "emptyDir": {}}]))
    response, twice = admit(server, copy.deepcopy(once))
    assert refusals(twice) == [] and "warnings" not in response
    configmap = twice["metadata"]["annotations"]["elastico.io/configmap"]
    before = json.dumps(once).replace(once["metadata"]["annotations"]["elastico.io/configmap"], "C")
    assert json.loads(json.dumps(twice).replace(configmap, "C")) == json.loads(before)
    for container in twice["spec"]["containers"]:
        assert "ELASTICO_USER_SETTINGS" not in env_of(container)


def config_map_refs(pod: dict[str, Any]) -> set[str]:
    return {
        e["valueFrom"]["configMapKeyRef"]["name"]
        for c in pod["spec"]["containers"]
        for e in c.get("env") or []
        if "configMapKeyRef" in (e.get("valueFrom") or {})
    }


def test_pods_copied_from_an_admitted_one_each_get_a_configmap_of_their_own(server):
    """A Job template written from an admitted pod carries its ``elastico.io/configmap``:
    every replica kept that name, so each bind replaced the one ConfigMap (owner and
    devices) all of them read, and deleting any replica garbage-collected it."""
    _, original = admit(server, new_pod())
    (shared,) = config_map_refs(original)
    names = set()
    for _ in range(2):
        _, replica = admit(server, copy.deepcopy(original))
        (name,) = config_map_refs(replica)
        assert name == replica["metadata"]["annotations"]["elastico.io/configmap"]
        names.add(name)
    assert len(names) == 2 and shared not in names


SIDECAR = {"name": "proxy", "image": "p", "restartPolicy": "Always"}
SHAPES = {
    "no volumes, env or mounts": new_pod(),
    "existing volumes, env and mounts": new_pod(
        containers=[{"name": "t", "image": "i", **GPU, "env": [{"name": "A", "value": "1"}],
                     "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
        volumes=[{"name": "data", "emptyDir": {}}]),
    "empty arrays": new_pod(containers=[{"name": "t", "image": "i", **GPU, "env": [],
                                         "volumeMounts": []}], volumes=[]),
    "init, sidecar and three containers": new_pod(
        initContainers=[{"name": "fetch", "image": "f"}, SIDECAR],
        containers=[{"name": "log", "image": "l"}, {"name": "a", "image": "i", **GPU},
                    {"name": "b", "image": "i", "resources": {"requests": {"amd.com/gpu": "1"}}}]),
    "the user sets one of the variables and names a volume like the webhook's": new_pod(
        containers=[{"name": "t", "image": "i", **GPU,
                     "env": [{"name": "ELASTICO_RING_ROOT", "value": "/scratch/rings"}]}],
        volumes=[{"name": RINGS_VOLUME, "emptyDir": {}}]),
}  # fmt: skip


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("where", ["in the object", "only in request.namespace", "named"])
def test_the_patch_applies_to_the_pod_as_sent_and_the_api_server_accepts_it(server, shape, where):
    pod = copy.deepcopy(SHAPES[shape])
    if where == "only in request.namespace":
        del pod["metadata"]["namespace"]
    elif where == "named":
        pod["metadata"]["name"] = pod["metadata"].pop("generateName") + "x1"
    response, admitted = admit(server, pod)
    assert refusals(admitted) == []
    configmap = admitted["metadata"]["annotations"]["elastico.io/configmap"]
    assert configmap.startswith("elastico-train-7d9f4-") and len(configmap) <= 253
    spec, before = admitted["spec"], pod["spec"]
    assert spec.get("initContainers") == before.get("initContainers")  # sidecars untouched
    for container, was in zip(spec["containers"], before["containers"], strict=True):
        if "resources" not in was and any("resources" in c for c in before["containers"]):
            assert container == was  # not a GPU container
            continue
        names = env_of(container)
        assert len(names) == len(set(names)) and "ELASTICO_CONFIGURATION" in names
        assert config_map_refs({"spec": {"containers": [container]}}) == {configmap}
        assert {DECISION_VOLUME, RINGS_VOLUME} <= {m["name"] for m in container["volumeMounts"]}
        assert was.get("env", []) == container["env"][: len(was.get("env", []))]  # kept
    assert before.get("volumes", []) == spec["volumes"][: len(before.get("volumes", []))]
    assert "warnings" not in response or shape.startswith("the user sets")


@pytest.mark.parametrize(
    ("operation", "obj", "extra"),
    [
        ("UPDATE", new_pod(), {"oldObject": new_pod()}),
        ("DELETE", None, {"oldObject": new_pod(),
                          "options": {"kind": "DeleteOptions", "apiVersion": "meta.k8s.io/v1"}}),
        ("CONNECT", {"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"]},
         {"subResource": "exec", "options": None}),
    ],
)  # fmt: skip
def test_other_operations_are_allowed_unchanged(server, operation, obj, extra):
    response, _ = admit(server, obj, operation=operation, **extra)
    assert set(response) == {"uid", "allowed"}


def test_a_dry_run_gets_the_same_patch_and_books_nothing(server):
    engine = server.server.config.app.state.engine
    _, admitted = admit(server, new_pod(), dryRun=True)
    assert refusals(admitted) == [] and DECISION_VOLUME in {
        v["name"] for v in admitted["spec"]["volumes"]
    }
    assert engine.jobs() == []  # the webhook reads the families, books and records nothing


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"apiVersion": "admission.k8s.io/v2"}, "apiVersion"),
        ({"apiVersion": "v1"}, "apiVersion"),
        ({"kind": "Pod"}, "kind"),
        ({"request": {"operation": "CREATE", "object": new_pod()}}, "request.uid"),
        ({"request": None}, "request.uid"),
    ],
)
def test_a_review_the_webhook_does_not_speak_is_a_400_naming_the_field(server, change, named):
    """The webhook is registered for admission.k8s.io/v1 only; another version was
    answered in that version's name, with v1's fields."""
    body = {**review(new_pod()), **change}
    reply = httpx.post(f"{server.url}/mutate", json=body, timeout=10)
    assert reply.status_code == 400, reply.text[:200]
    assert named in reply.json()["Error"]


def test_an_oversized_review_is_a_413_before_it_is_read():
    settings = ServiceSettings(epoch_seconds=3600, max_body_bytes=4096)
    with ServerThread(create_app(settings, EmbeddedCluster([], "test"))) as small:
        pod = new_pod(containers=[{"name": "t", "image": "x" * 8192, **GPU}])
        reply = httpx.post(f"{small.url}/mutate", json=review(pod), timeout=10)
        assert reply.status_code == 413 and "4096" in reply.json()["Error"]
        assert "patch" in post(small, review(new_pod()))  # still serving


DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@pytest.mark.parametrize(
    "meta", [{"generateName": "train.v2."}, {"name": "a" * 199 + ".b" * 20}, {"name": "x"}]
)
def test_the_configmap_name_is_one_the_api_server_accepts(server, meta):
    """Pod names and generateName are DNS subdomains, which may end in a dot (or have one
    where the name is cut at 200): ``elastico-train.v2.-1a2b3c`` was refused at bind
    (``ConfigMap "..." is invalid``) and the pod's containers never started."""
    pod = new_pod()
    del pod["metadata"]["generateName"]
    pod["metadata"].update(meta)
    _, admitted = admit(server, pod)
    name = admitted["metadata"]["annotations"]["elastico.io/configmap"]
    assert DNS_SUBDOMAIN.fullmatch(name) and len(name) <= 253, name


def test_huge_invalid_annotations_get_bounded_warnings_and_oversized_ones_a_400(server):
    """The webhook port is open to any source.  One warning per invalid token made a
    4 MB review answer 130 MB of warnings (800 MiB resident, 10 s on the event loop the
    scheduler's verbs share); annotations over the API server's own 256 KiB limit are
    refused before they are parsed, and the warnings cut like the filter's problem text."""
    pod = new_pod()
    pod["metadata"]["annotations"]["elastico.io/allowed"] = "batch_size=" + "|7" * 100_000
    reply = httpx.post(f"{server.url}/mutate", json=review(pod), timeout=30)
    assert reply.status_code == 200 and len(reply.content) < 8192
    warnings = reply.json()["response"]["warnings"]
    assert warnings[0].startswith("elastico.io/allowed: batch_size: ")
    pod["metadata"]["annotations"]["elastico.io/allowed"] = "batch_size=" + "|7" * 140_000
    reply = httpx.post(f"{server.url}/mutate", json=review(pod), timeout=30)
    assert reply.status_code == 400 and "metadata.annotations" in reply.json()["Error"]
    assert "262144" in reply.json()["Error"]
