"""Kubernetes JSON -> what the scheduler needs: GPU inventory of a node, GPU demand of a pod.

Pure functions over plain dicts (the API server's JSON, as the watch and the
extender wire deliver it).  GPU inventory follows NVIDIA GPU feature
discovery (GFD) labels and node allocatable:

============================  =============================================  ==========
source                        meaning                                        unit
============================  =============================================  ==========
allocatable nvidia.com/gpu    GPUs the device plugin offers pods now         count
nvidia.com/gpu.count          GPUs on the node (label), when allocatable     count
                              has no ``nvidia.com/gpu`` (no device plugin)
nvidia.com/gpu.replicas       times the plugin advertises each GPU           count
                              (time-slicing; divides allocatable)
nvidia.com/gpu.memory         memory of one GPU (label, as GFD writes it)    MiB
nvidia.com/gpu.product        GPU model, e.g. ``NVIDIA-A100-SXM4-40GB``      text
allocatable cpu / memory      host resources left for pods                   cores / MiB
============================  =============================================  ==========

Allocatable, never capacity: it is what the kubelet admits pods against (capacity less
reserved resources and, for ``nvidia.com/gpu``, less the devices its plugin reports
unhealthy).  Where the device plugin advertises ``nvidia.com/gpu`` its count wins over
the label: a node whose plugin offers 0 (no healthy GPU, or GPUs being drained) would
refuse every GPU pod at admission whatever GFD counted.

A node without the memory label gets ``default_gpu_memory_mib`` (a service
setting, logged once per node) rather than being dropped.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from decimal import Decimal
from functools import lru_cache
from typing import Any

from elastico_extender.core.model import GpuDevice, Node

__all__ = [
    "GPU_RESOURCE",
    "KEEP_OUT_EFFECTS",
    "LABEL_COUNT",
    "LABEL_MEMORY",
    "LABEL_PRODUCT",
    "LABEL_REPLICAS",
    "MAX_GPUS_PER_NODE",
    "PodFieldError",
    "check_pod",
    "closed_to",
    "node_from_json",
    "pod_gpu_request",
    "pod_is_active",
    "pod_key",
    "quantity",
]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_COUNT = "nvidia.com/gpu.count"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_PRODUCT = "nvidia.com/gpu.product"

_SUFFIX: dict[str, int | Decimal] = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}


MAX_QUANTITY_CHARS = 64
"""Longer quantity strings are refused before parsing (and never enter the cache)."""

MAX_GPUS_PER_NODE = 1024
"""No node holds more GPUs: larger counts, on a node or a pod, are refused as unreadable
before anything is sized by them (the edge also checks against the cluster's largest)."""

# Kubernetes' quantity grammar (apimachinery resource.Quantity): a signed decimal
# number, then a binary-SI suffix, a decimal-SI suffix or a decimal exponent.
_QUANTITY = re.compile(
    r"(?P<number>[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkKMGTPE]|[eE][+-]?[0-9]{1,3})?"
)


def quantity(text: object) -> float:
    """A Kubernetes resource quantity (``500m``, ``64Gi``, ``1e3``) as a finite float.

    Raises ValueError (never TypeError or OverflowError) on anything else: other
    JSON types, NaN/Infinity, text outside the quantity grammar, non-finite values.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise ValueError(f"not a Kubernetes quantity: a JSON {_json_type(text)}")
    if isinstance(text, int | float):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"not a finite quantity: {text!r}")
        return value
    if len(text) > MAX_QUANTITY_CHARS:
        raise ValueError(f"not a Kubernetes quantity: {len(text)} characters")
    return _parse_quantity(text.strip())


@lru_cache(maxsize=4096)  # keys are at most MAX_QUANTITY_CHARS long
def _parse_quantity(raw: str) -> float:
    match = _QUANTITY.fullmatch(raw)
    if match is None:
        raise ValueError(f"not a Kubernetes quantity: {raw!r}")
    suffix = match["suffix"] or ""
    if suffix[:1] in ("e", "E") and len(suffix) > 1:
        factor: Decimal | int = Decimal(10) ** int(suffix[1:])
    else:
        factor = _SUFFIX.get(suffix, 1)
    try:
        value = float(Decimal(match["number"]) * Decimal(factor))
    except ArithmeticError:
        raise ValueError(f"not a Kubernetes quantity: {raw!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"quantity out of range: {raw!r}")
    return value


def _json_type(value: object) -> str:
    """The JSON name of a decoded value's type (messages name JSON, not Python, types)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    return "object"


def _get(obj: Mapping[str, Any], *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def node_from_json(obj: Mapping[str, Any], default_gpu_memory_mib: float) -> Node:
    """The core :class:`Node` for a Kubernetes Node object.

    Raises ValueError (with the node name and field) on unreadable input.
    """
    name = _get(obj, "metadata", "name")
    if not isinstance(name, str) or not name:
        raise ValueError("node object has no metadata.name")
    labels = _get(obj, "metadata", "labels") or {}
    allocatable = _get(obj, "status", "allocatable") or {}
    if not isinstance(labels, Mapping) or not isinstance(allocatable, Mapping):
        raise ValueError(f"node {name}: labels and status.allocatable must be objects")
    try:
        count = _node_gpus(labels, allocatable)
        memory = (
            quantity(labels[LABEL_MEMORY]) if LABEL_MEMORY in labels else default_gpu_memory_mib
        )
        cpu = quantity(allocatable.get("cpu", 0))
        ram = quantity(allocatable.get("memory", 0)) / 2**20
    except ValueError as exc:
        raise ValueError(f"node {name}: {exc}") from None
    if not 0 <= count <= MAX_GPUS_PER_NODE or memory <= 0:
        raise ValueError(f"node {name}: bad GPU inventory ({count} GPUs of {memory} MiB)")
    product = str(labels.get(LABEL_PRODUCT, "unknown"))
    gpus = tuple(GpuDevice(i, memory, product) for i in range(count))
    return Node(name=name, gpus=gpus, cpu_cores=cpu, host_mem_mib=ram)


def _node_gpus(labels: Mapping[str, Any], allocatable: Mapping[str, Any]) -> int:
    """The GPUs pods can get on a node: allocatable's ``nvidia.com/gpu`` where the device
    plugin advertises it (divided by GFD's replicas label under time-slicing, which
    advertises each GPU that many times), else the ``nvidia.com/gpu.count`` label (mode A
    of docs/node-setup.md: no device plugin resource), else 0.

    The label counts hardware; allocatable is what the kubelet admits pods against, so
    when they differ (unhealthy GPUs, a plugin draining them) allocatable is the truth."""
    if allocatable.get(GPU_RESOURCE) is not None:
        count = int(quantity(allocatable[GPU_RESOURCE]))
        replicas = int(quantity(labels[LABEL_REPLICAS])) if LABEL_REPLICAS in labels else 1
        return count // replicas if replicas > 1 else count
    if LABEL_COUNT in labels:
        return int(quantity(labels[LABEL_COUNT]))
    return 0


class PodFieldError(ValueError):
    """A pod object with a field of the wrong shape; ``field`` is its JSON path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


def _gpu_count(value: Any, field: str) -> int:
    try:
        number = quantity(value)
    except ValueError as exc:
        raise PodFieldError(field, str(exc)) from None
    if number < 0 or number != int(number):
        raise PodFieldError(field, f"GPUs must be a whole number >= 0, got {value!r}")
    if number > MAX_GPUS_PER_NODE:
        raise PodFieldError(field, f"{value} GPUs: no node holds more than {MAX_GPUS_PER_NODE}")
    return int(number)


def _container_gpus(containers: Any, where: str) -> list[int]:
    if containers is None:
        return []
    if not isinstance(containers, list):
        raise PodFieldError(where, f"must be an array, got a JSON {_json_type(containers)}")
    found = []
    for i, c in enumerate(containers):
        at = f"{where}[{i}]"
        if not isinstance(c, dict):
            raise PodFieldError(at, f"must be an object, got a JSON {_json_type(c)}")
        res = c.get("resources")
        if res is None:
            found.append(0)
            continue
        if not isinstance(res, dict):
            raise PodFieldError(f"{at}.resources", "must be an object")
        value = None
        for part in ("requests", "limits"):
            amounts = res.get(part)
            if amounts is None:
                continue
            if not isinstance(amounts, dict):
                raise PodFieldError(f"{at}.resources.{part}", "must be an object")
            if value is None and amounts.get(GPU_RESOURCE) is not None:
                value = _gpu_count(amounts[GPU_RESOURCE], f"{at}.resources.{part}[{GPU_RESOURCE}]")
        found.append(value or 0)
    return found


def pod_gpu_request(obj: Mapping[str, Any]) -> int:
    """GPUs the pod asks for: the sum over containers of ``nvidia.com/gpu`` (requests,
    else limits), or the largest init container's if larger.

    Raises :class:`PodFieldError` (a ValueError) naming the field, e.g.
    ``spec.containers[0].resources.limits[nvidia.com/gpu]``, for a quantity that is
    not a whole number of GPUs, or more than :data:`MAX_GPUS_PER_NODE`."""
    spec = obj.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise PodFieldError("spec", f"must be an object, got a JSON {_json_type(spec)}")
    main = sum(_container_gpus(spec.get("containers"), "spec.containers"))
    init = max(_container_gpus(spec.get("initContainers"), "spec.initContainers"), default=0)
    total = max(main, init)
    if total > MAX_GPUS_PER_NODE:
        raise PodFieldError(
            f"spec.containers[*].resources[{GPU_RESOURCE}]",
            f"{total} GPUs: no node holds more than {MAX_GPUS_PER_NODE}",
        )
    return total


MAX_ANNOTATION_CHARS = 256 * 1024
"""The API server's limit on a pod's annotations, keys and values together (it counts
bytes, at least as many as characters): a pod over it was never stored, and an invalid
annotation costs a problem per token, so larger ones are refused before any parsing."""

_META_STRINGS = ("name", "namespace", "uid", "resourceVersion", "generateName",
                 "creationTimestamp", "deletionTimestamp")  # fmt: skip
_SPEC_STRINGS = ("nodeName", "schedulerName", "priorityClassName")
_LIST_OF_OBJECTS = ("env", "volumeMounts", "envFrom")


def _strings(obj: Mapping[str, Any], keys: tuple[str, ...], field: str) -> None:
    """Each of ``keys`` in ``obj``, where present, must be a string."""
    for key in keys:
        value = obj.get(key)
        if value is not None and not isinstance(value, str):
            raise PodFieldError(
                f"{field}.{key}", f"must be a string, got a JSON {_json_type(value)}"
            )


def _string_map(value: Any, field: str) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise PodFieldError(field, f"must be an object of strings, got a JSON {_json_type(value)}")
    for key, item in value.items():
        if not isinstance(item, str):
            raise PodFieldError(
                f"{field}[{key}]", f"must be a string, got a JSON {_json_type(item)}"
            )


def _objects(value: Any, field: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise PodFieldError(field, f"must be an array, got a JSON {_json_type(value)}")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise PodFieldError(
                f"{field}[{i}]", f"must be an object, got a JSON {_json_type(item)}"
            )
    return value


def _named_objects(value: Any, path: str) -> None:
    """``value`` is absent or a list of objects whose ``name``, where given, is a string
    (the webhook matches entries by name: a list or an object there is no name)."""
    for j, entry in enumerate(_objects(value, path)):
        name = entry.get("name")
        if name is not None and not isinstance(name, str):
            raise PodFieldError(
                f"{path}[{j}].name", f"must be a string, got a JSON {_json_type(name)}"
            )


def check_pod(obj: Any) -> int:
    """Check the shape of every pod field ElastiCo reads; returns its GPU request.

    Objects are checked as ``dict`` (what JSON decodes to), not ``Mapping``: the
    abstract check costs more than the rest of this function on a typical pod.

    The API server guarantees these shapes for pods it stores, but an extender or
    webhook caller can send anything: raising :class:`PodFieldError` naming the field
    here keeps malformed JSON from reaching code that trusts the shape."""
    if not isinstance(obj, dict):
        raise PodFieldError("Pod", f"must be an object, got a JSON {_json_type(obj)}")
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        raise PodFieldError("metadata", f"must be an object, got a JSON {_json_type(meta)}")
    _strings(meta, _META_STRINGS, "metadata")
    annotations = meta.get("annotations")
    _string_map(annotations, "metadata.annotations")
    if annotations:
        size = sum(len(key) + len(value) for key, value in annotations.items())
        if size > MAX_ANNOTATION_CHARS:
            raise PodFieldError(
                "metadata.annotations",
                f"{size} characters in all; the API server stores at most {MAX_ANNOTATION_CHARS}",
            )
    _string_map(meta.get("labels"), "metadata.labels")
    _objects(meta.get("ownerReferences"), "metadata.ownerReferences")
    spec = obj.get("spec")
    if spec is not None:
        if not isinstance(spec, dict):
            raise PodFieldError("spec", f"must be an object, got a JSON {_json_type(spec)}")
        _strings(spec, _SPEC_STRINGS, "spec")
        for part in ("containers", "initContainers"):
            for i, c in enumerate(_objects(spec.get(part), f"spec.{part}")):
                for key in _LIST_OF_OBJECTS:
                    _named_objects(c.get(key), f"spec.{part}[{i}].{key}")
        _named_objects(spec.get("volumes"), "spec.volumes")
    status = obj.get("status")
    if status is not None:
        if not isinstance(status, dict):
            raise PodFieldError("status", f"must be an object, got a JSON {_json_type(status)}")
        phase = status.get("phase")
        if phase is not None and not isinstance(phase, str):
            raise PodFieldError("status.phase", f"must be a string, got a JSON {_json_type(phase)}")
    return pod_gpu_request(obj)


def pod_is_active(obj: Mapping[str, Any]) -> bool:
    """Whether the pod holds (or will hold) resources: not Succeeded/Failed."""
    phase = _get(obj, "status", "phase")
    return phase not in ("Succeeded", "Failed")


def pod_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"


UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
"""The taint the node lifecycle controller puts on a cordoned node (tolerated by
DaemonSet pods; kube-scheduler's NodeUnschedulable filter honours its toleration)."""
KEEP_OUT_EFFECTS = ("NoSchedule", "NoExecute")
"""Taint effects that keep a pod that does not tolerate them off a node (kube-scheduler's
TaintToleration filter); PreferNoSchedule only scores."""


def _tolerates(tolerations: Any, key: str, value: str, effect: str) -> bool:
    """Whether any toleration matches the taint, as v1.Toleration.ToleratesTaint:
    same effect unless empty, same key unless empty, and Exists or an equal value."""
    for t in tolerations if isinstance(tolerations, list) else ():
        if not isinstance(t, Mapping):
            continue
        if t.get("effect") and t.get("effect") != effect:
            continue
        if t.get("key") and t.get("key") != key:
            continue
        operator = t.get("operator") or "Equal"
        if operator == "Exists" or (operator == "Equal" and (t.get("value") or "") == value):
            return True
    return False


def closed_to(node: Mapping[str, Any], pod: Mapping[str, Any]) -> str:
    """Why kube-scheduler would not place ``pod`` (or its replacement, from the same
    template) on ``node``: cordoned, or a NoSchedule/NoExecute taint it does not
    tolerate; '' when neither.  The plan does not know either, so the actuator must not
    evict a pod to move it there."""
    name = _get(node, "metadata", "name")
    tolerations = _get(pod, "spec", "tolerations")
    if _get(node, "spec", "unschedulable") is True and not _tolerates(
        tolerations, UNSCHEDULABLE_TAINT, "", "NoSchedule"
    ):
        return f"node {name} is cordoned (spec.unschedulable)"
    taints = _get(node, "spec", "taints")
    for taint in taints if isinstance(taints, list) else ():
        if not isinstance(taint, Mapping) or taint.get("effect") not in KEEP_OUT_EFFECTS:
            continue
        key, value = str(taint.get("key") or ""), str(taint.get("value") or "")
        if not _tolerates(tolerations, key, value, str(taint["effect"])):
            shown = f"{key}={value}" if value else key
            return f"node {name} has the taint {shown}:{taint['effect']}, not tolerated by the pod"
    return ""
