"""Mutating admission webhook: make the bind-time decision reachable by the container.

The pod spec is immutable once the pod exists, and the decision is only known at
bind time.  So at admission (pod CREATE) the webhook adds, for an opted-in pod:

* ``elastico.io/configmap: elastico-<name>-<random>``: the per-pod ConfigMap that
  bind fills (owned by the pod, so it is garbage-collected with it);
* to each GPU container (:func:`gpu_containers`: those whose resources name a GPU, else
  the first container, the workload by convention; never a sidecar), one ``env`` entry
  per framework setting (spec 4.2, from :func:`core.handoff.framework_settings`), each a
  ``configMapKeyRef`` into that ConfigMap; the kubelet holds the container until bind has
  created it;
* a downward-API volume with the pod's annotations at
  ``/etc/elastico/annotations`` (updated live, for runtime reconfiguration).

A variable the container already sets (``CUDA_VISIBLE_DEVICES`` say) is left as the user
wrote it, and the AdmissionReview carries a warning naming it (:func:`user_overrides`):
the user's value then decides, not ElastiCo's decision.

Invalid annotations are admitted unchanged with warnings (filter reports them
as the pod's scheduling failure, naming each annotation).
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from elastico_extender.annotations import PREFIX, PodIntent, parse_intent
from elastico_extender.api.deps import ApiError, engine_of, json_response, read_body
from elastico_extender.core.handoff import framework_settings
from elastico_extender.errors import AnnotationError

__all__ = [
    "DECISION_DIR",
    "DECISION_VOLUME",
    "gpu_containers",
    "mutation_patch",
    "router",
    "user_overrides",
]

router = APIRouter(tags=["admission webhook"])

DECISION_VOLUME = "elastico-decision"
DECISION_DIR = "/etc/elastico"


def setting_keys(intent: PodIntent, mps: bool) -> list[str]:
    """The env names bind will write for this pod's family (same for every configuration)."""
    family = intent.family
    config = family.configs[family.fastest_index]
    env = framework_settings(
        kind=family.kind,
        configuration=config,
        memory_budget_mib=1.0,
        device_memory_mib=1.0,
        device_indices=(0,),
        mps=mps,
    )
    return sorted(env)


def gpu_containers(spec: dict[str, Any]) -> list[int]:
    """Indices of the containers that get the GPU settings: those requesting a GPU
    resource (``nvidia.com/gpu``, or any ``*/gpu*`` extended resource), else the first."""
    containers = spec.get("containers") or []
    found = []
    for i, container in enumerate(containers):
        resources = (container or {}).get("resources") or {}
        names = {*((resources.get("limits") or {}).keys()),
                 *((resources.get("requests") or {}).keys())}  # fmt: skip
        if any("/gpu" in str(name) for name in names):
            found.append(i)
    return found or ([0] if containers else [])


def user_overrides(pod: dict[str, Any], intent: PodIntent, mps: bool) -> list[str]:
    """Warnings for the settings a GPU container already sets itself (kept as written)."""
    keys = set(setting_keys(intent, mps))
    containers = (pod.get("spec") or {}).get("containers") or []
    warnings = []
    for i in gpu_containers(pod.get("spec") or {}):
        container = containers[i] or {}
        for entry in container.get("env") or []:
            if entry.get("name") in keys:
                warnings.append(
                    f"container {container.get('name', i)!s} sets {entry['name']} itself: "
                    "kept as written, so it overrides ElastiCo's decision for that setting"
                )
    return warnings


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def mutation_patch(pod: dict[str, Any], intent: PodIntent, mps: bool) -> list[dict[str, Any]]:
    """JSON Patch (RFC 6902) operations adding the ConfigMap env, annotation and volume."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    base = (meta.get("name") or meta.get("generateName") or "pod").rstrip("-")
    configmap = annotations.get(PREFIX + "configmap") or (
        f"elastico-{base[:200]}-{secrets.token_hex(3)}"
    )
    ops: list[dict[str, Any]] = []
    if PREFIX + "configmap" not in annotations:
        ops.append(
            {
                "op": "add",
                "path": f"/metadata/annotations/{_escape(PREFIX + 'configmap')}",
                "value": configmap,
            }
        )
    keys = setting_keys(intent, mps)
    env = [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": key}}}
        for key in keys
    ]
    env.append({"name": "ELASTICO_DECISION_FILE", "value": f"{DECISION_DIR}/annotations"})
    mount = {"name": DECISION_VOLUME, "mountPath": DECISION_DIR, "readOnly": True}
    containers = spec.get("containers") or []
    for i in gpu_containers(spec):
        container = containers[i]
        existing = {e.get("name") for e in container.get("env") or []}
        mine = [e for e in env if e["name"] not in existing]
        if container.get("env"):
            ops.extend(
                {"op": "add", "path": f"/spec/containers/{i}/env/-", "value": e} for e in mine
            )
        else:
            ops.append({"op": "add", "path": f"/spec/containers/{i}/env", "value": mine})
        if container.get("volumeMounts"):
            ops.append(
                {"op": "add", "path": f"/spec/containers/{i}/volumeMounts/-", "value": mount}
            )
        else:
            ops.append(
                {"op": "add", "path": f"/spec/containers/{i}/volumeMounts", "value": [mount]}
            )
    volume = {
        "name": DECISION_VOLUME,
        "downwardAPI": {
            "items": [{"path": "annotations", "fieldRef": {"fieldPath": "metadata.annotations"}}]
        },
    }
    if spec.get("volumes"):
        ops.append({"op": "add", "path": "/spec/volumes/-", "value": volume})
    else:
        ops.append({"op": "add", "path": "/spec/volumes", "value": [volume]})
    return ops


@router.post("/mutate", summary="Mutating admission webhook (AdmissionReview v1) for pods")
async def mutate(request: Request) -> Response:
    try:
        review = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    req = review.get("request") if isinstance(review, dict) else None
    if not isinstance(req, dict) or "uid" not in req:
        raise ApiError(400, "expected an AdmissionReview with request.uid")
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    pod = req.get("object")
    if isinstance(pod, dict) and req.get("operation", "CREATE") == "CREATE":
        engine = engine_of(request)
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        try:
            intent = parse_intent(annotations, engine.families)
        except AnnotationError as exc:
            response["warnings"] = [f"{key}: {msg}" for key, msg in exc.problems]
            intent = None
        if intent is not None:
            patch = mutation_patch(pod, intent, engine.settings.mps)
            if overrides := user_overrides(pod, intent, engine.settings.mps):
                response["warnings"] = overrides
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return json_response(
        {
            "apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview",
            "response": response,
        }
    )
