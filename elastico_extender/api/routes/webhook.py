"""Mutating admission webhook: make the bind-time decision reachable by the container.

The pod spec is immutable once the pod exists, and the decision is only known at
bind time.  So at admission (pod CREATE) the webhook adds, for an opted-in pod:

* ``elastico.io/configmap: elastico-<name>-<random>``: the per-pod ConfigMap that
  bind fills (owned by the pod, so it is garbage-collected with it), a new name for every
  pod, also one that carries a name copied from another pod;
* to each GPU container (:func:`gpu_containers`: those whose resources name a GPU, else
  the first container, the workload by convention; never a sidecar), one ``env`` entry
  per framework setting (spec 4.2, from :func:`core.handoff.framework_settings`), each a
  ``configMapKeyRef`` into that ConfigMap; the kubelet holds the container until bind has
  created it;
* a downward-API volume with the pod's annotations at
  ``/etc/elastico/annotations`` (updated live, for runtime reconfiguration), and
  ``ELASTICO_ANNOTATIONS_FILE`` naming that file: what ``elastico-run`` reads;
* the rings volume at ``/run/elastico/rings`` (``ELASTICO_RING_ROOT``; the pod uid as
  ``ELASTICO_POD_UID``, the container's name as ``ELASTICO_CONTAINER_NAME``), where
  ``elastico-run`` puts the profiler shim's rings for the node agent (issue 11): by
  default an ``emptyDir`` (:func:`rings_volume`), which every Pod Security level admits
  and the agent reads through the kubelet's pods directory; the legacy ``hostPath`` only
  when ``rings_volume: hostPath`` is set (Pod Security ``baseline`` and ``restricted``
  refuse it).

Invalid annotations are admitted unchanged with warnings (filter reports them
as the pod's scheduling failure, naming each annotation).  So is a pod ElastiCo will never
bind (:func:`not_bound_by_elastico`): nothing would create the ConfigMap its env would
name, and the kubelet would never start its containers.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import orjson
from fastapi import APIRouter, Request
from fastapi.responses import Response

from elastico_extender.annotations import (
    ANNOTATIONS_FILE,
    ANNOTATIONS_FILE_ENV,
    DECISION_DIR,
    DECISION_VOLUME,
    PREFIX,
    RINGS_DIR,
    RINGS_VOLUME,
    USER_SETTINGS_ENV,
    PodIntent,
    parse_intent,
)
from elastico_extender.api.deps import ApiError, engine_of, json_response, read_body
from elastico_extender.api.validate import checked_pod
from elastico_extender.core.handoff import framework_settings
from elastico_extender.errors import AnnotationError
from elastico_extender.service.pods import bounded_problems

__all__ = [
    "DECISION_DIR",
    "DECISION_VOLUME",
    "RINGS_DIR",
    "RINGS_VOLUME",
    "gpu_containers",
    "mutation_patch",
    "rings_volume",
    "router",
    "user_overrides",
]

router = APIRouter(tags=["admission webhook"])

# What the webhook answers in the request's own version: v1 (what it is registered for);
# v1beta1 has the same fields for a pod CREATE.
REVIEW_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


def rings_volume(
    mode: str = "emptyDir",
    *,
    medium: str = "Memory",
    size_limit: str = "256Mi",
    host_path: str = RINGS_DIR,
) -> dict[str, Any]:
    """The pod volume ``RINGS_VOLUME`` for the shim's rings (settings ``rings_*``).

    ``emptyDir``: the pod's own directory, which the kubelet keeps at
    ``<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/elastico-rings`` on the node (a
    tmpfs mounted there for ``medium: Memory``) and removes with the pod; a pod can write
    only its own rings there.  ``hostPath``: the legacy shared host directory."""
    if mode == "hostPath":
        return {"name": RINGS_VOLUME, "hostPath": {"path": host_path, "type": "DirectoryOrCreate"}}
    source: dict[str, str] = {}
    if medium:
        source["medium"] = medium
    if size_limit:
        source["sizeLimit"] = size_limit
    return {"name": RINGS_VOLUME, "emptyDir": source}


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


def _configmap_ref(entry: dict[str, Any]) -> Any:
    """The ConfigMap an env entry reads from (``valueFrom.configMapKeyRef.name``), or None."""
    source = entry.get("valueFrom")
    ref = source.get("configMapKeyRef") if isinstance(source, dict) else None
    return ref.get("name") if isinstance(ref, dict) else None


def user_settings(container: dict[str, Any], keys: set[str], configmap: str | None) -> list[str]:
    """The settings among ``keys`` the container sets itself: not the references into the
    pod's ConfigMap (``configmap``) that an earlier pass of the webhook added, which a pod
    copied from an admitted one carries."""
    return sorted(
        entry["name"]
        for entry in container.get("env") or []
        if entry.get("name") in keys and (configmap is None or _configmap_ref(entry) != configmap)
    )


def user_overrides(pod: dict[str, Any], intent: PodIntent, mps: bool) -> list[str]:
    """Warnings for the settings a GPU container already sets itself (kept as written)."""
    keys = set(setting_keys(intent, mps))
    configmap = ((pod.get("metadata") or {}).get("annotations") or {}).get(PREFIX + "configmap")
    containers = (pod.get("spec") or {}).get("containers") or []
    warnings = []
    for i in gpu_containers(pod.get("spec") or {}):
        container = containers[i] or {}
        for name in user_settings(container, keys, configmap):
            warnings.append(
                f"container {container.get('name', i)!s} sets {name} itself: "
                "kept as written, so it overrides ElastiCo's decision for that setting"
            )
    return warnings


def not_bound_by_elastico(pod: dict[str, Any], scheduler_name: str) -> str | None:
    """Why ElastiCo's bind never sees this pod (the warning), or None.

    The chart's ``matchConditions`` keep such pods away, but ``deploy/webhook.yaml`` has
    none, and any webhook configuration may be edited: the webhook checks itself."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return (
            f"spec.nodeName is set ({spec['nodeName'][:63]}): the pod bypasses the scheduler, "
            "so ElastiCo gives it no GPU decision; its elastico.io annotations are ignored"
        )
    name = spec.get("schedulerName") or "default-scheduler"
    if scheduler_name and name != scheduler_name:
        return (
            f"spec.schedulerName is {name[:63]}, not {scheduler_name}: ElastiCo does not "
            "schedule this pod; its elastico.io annotations are ignored"
        )
    return None


def _escape(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


def _append(path: str, present: Any, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Operations adding the ``items`` whose ``name`` the array at ``path`` (``present``,
    None if absent) does not hold yet: a pod copied from an admitted one already has them,
    and the API server refuses a second volume or mount of one name.  One ``-`` add each
    to an array that exists; the whole array where there is none (RFC 6902 appends only
    to an existing array)."""
    names = {entry.get("name") for entry in present or []}
    missing = [item for item in items if item["name"] not in names]
    if not missing:
        return []
    if present:
        return [{"op": "add", "path": f"{path}/-", "value": item} for item in missing]
    return [{"op": "add", "path": path, "value": missing}]


def mutation_patch(
    pod: dict[str, Any], intent: PodIntent, mps: bool, rings: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """JSON Patch (RFC 6902) operations adding the ConfigMap env, annotation and volumes
    (``rings``: the rings volume, default :func:`rings_volume`'s emptyDir)."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    spec = pod.get("spec") or {}
    # a DNS subdomain: no "-" or "." before the "-<random>" suffix (generateName ends in one)
    base = (meta.get("name") or meta.get("generateName") or "")[:200].rstrip("-.") or "pod"
    # A new pod has no ConfigMap yet: a name it carries came with a copy of another pod
    # (a template written from one), whose ConfigMap its bind would take over.  So a new
    # name always (RFC 6902 ``add`` replaces a member), and the copied references renamed.
    copied = annotations.get(PREFIX + "configmap")
    configmap = f"elastico-{base}-{secrets.token_hex(3)}"
    ops: list[dict[str, Any]] = [
        {
            "op": "add",
            "path": f"/metadata/annotations/{_escape(PREFIX + 'configmap')}",
            "value": configmap,
        }
    ]
    containers = spec.get("containers") or []
    for i, container in enumerate(containers):
        for j, entry in enumerate(container.get("env") or []):
            if copied is not None and _configmap_ref(entry) == copied:
                path = f"/spec/containers/{i}/env/{j}/valueFrom/configMapKeyRef/name"
                ops.append({"op": "add", "path": path, "value": configmap})
    keys = setting_keys(intent, mps)
    env = [
        {"name": key, "valueFrom": {"configMapKeyRef": {"name": configmap, "key": key}}}
        for key in keys
    ]
    env.append({"name": ANNOTATIONS_FILE_ENV, "value": ANNOTATIONS_FILE})
    env.append(
        {"name": "ELASTICO_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}
    )
    env.append({"name": "ELASTICO_RING_ROOT", "value": RINGS_DIR})
    mounts: list[dict[str, Any]] = [
        {"name": DECISION_VOLUME, "mountPath": DECISION_DIR, "readOnly": True},
        {"name": RINGS_VOLUME, "mountPath": RINGS_DIR},
    ]
    for i in gpu_containers(spec):
        container = containers[i]
        # its own ring directory: the pod's containers have pid namespaces of their own
        named: dict[str, Any] = {
            "name": "ELASTICO_CONTAINER_NAME",
            "value": str(container.get("name") or i),
        }
        mine = [*env, named]
        kept = user_settings(container, set(keys), copied)
        if kept:  # user_overrides warns about these
            mine.append({"name": USER_SETTINGS_ENV, "value": ",".join(kept)})
        ops += _append(f"/spec/containers/{i}/env", container.get("env"), mine)
        ops += _append(f"/spec/containers/{i}/volumeMounts", container.get("volumeMounts"), mounts)
    volume = {
        "name": DECISION_VOLUME,
        "downwardAPI": {
            "items": [
                {
                    "path": ANNOTATIONS_FILE.removeprefix(DECISION_DIR + "/"),
                    "fieldRef": {"fieldPath": "metadata.annotations"},
                }
            ]
        },
    }
    ops += _append("/spec/volumes", spec.get("volumes"), [volume, rings or rings_volume()])
    return ops


@router.post("/mutate", summary="Mutating admission webhook (AdmissionReview v1) for pods")
async def mutate(request: Request) -> Response:
    try:
        review = orjson.loads(await read_body(request))
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}") from None
    req = review.get("request") if isinstance(review, dict) else None
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str):
        raise ApiError(400, "expected an AdmissionReview with request.uid (a string)")
    api_version = review.get("apiVersion", "admission.k8s.io/v1")
    if api_version not in REVIEW_VERSIONS:
        raise ApiError(
            400, f"apiVersion must be one of {', '.join(REVIEW_VERSIONS)} (AdmissionReview)"
        )
    if review.get("kind", "AdmissionReview") != "AdmissionReview":
        raise ApiError(400, "kind must be AdmissionReview")
    operation = req.get("operation", "CREATE")
    if not isinstance(operation, str):
        raise ApiError(400, "request.operation must be a string")
    response: dict[str, Any] = {"uid": req["uid"], "allowed": True}
    pod = req.get("object")
    if pod is not None and operation == "CREATE":
        checked_pod(pod, "request.object")
        engine = engine_of(request)
        annotations = pod["metadata"].get("annotations") or {}
        try:
            intent = parse_intent(annotations, engine.families, engine.families.unprofiled)
        except AnnotationError as exc:
            response["warnings"] = [f"{k}: {msg}" for k, msg in bounded_problems(exc.problems)]
            intent = None
        settings = engine.settings
        elsewhere = intent is not None and not_bound_by_elastico(pod, settings.scheduler_name)
        if elsewhere:
            response["warnings"] = [elsewhere]
        elif intent is not None:
            rings = rings_volume(
                settings.rings_volume,
                medium=settings.rings_medium,
                size_limit=settings.rings_size_limit,
                host_path=settings.rings_host_path,
            )
            patch = mutation_patch(pod, intent, settings.mps, rings)
            if overrides := user_overrides(pod, intent, settings.mps):
                response["warnings"] = overrides
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(orjson.dumps(patch)).decode()
    return json_response(
        {
            "apiVersion": api_version,
            "kind": "AdmissionReview",
            "response": response,
        }
    )
