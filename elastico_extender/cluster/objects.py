"""Kubernetes JSON -> what the scheduler needs: GPU inventory of a node, GPU demand of a pod.

Pure functions over plain dicts (the API server's JSON, as the watch and the
extender wire deliver it).  GPU inventory follows NVIDIA GPU feature
discovery (GFD) labels, falling back to node allocatable:

==========================  ===============================================  ==========
source                      meaning                                          unit
==========================  ===============================================  ==========
nvidia.com/gpu.count        GPUs on the node (label)                         count
status.allocatable          ``nvidia.com/gpu`` when the label is absent      count
nvidia.com/gpu.memory       memory of one GPU (label, as GFD writes it)      MiB
nvidia.com/gpu.product      GPU model, e.g. ``NVIDIA-A100-SXM4-40GB``        text
allocatable cpu / memory    host resources left for pods                     cores / MiB
==========================  ===============================================  ==========

A node without the memory label gets ``default_gpu_memory_mib`` (a service
setting, logged once per node) rather than being dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from functools import lru_cache
from typing import Any

from elastico_extender.core.model import GpuDevice, Node

__all__ = [
    "GPU_RESOURCE",
    "LABEL_COUNT",
    "LABEL_MEMORY",
    "LABEL_PRODUCT",
    "node_from_json",
    "pod_gpu_request",
    "pod_is_active",
    "pod_key",
    "quantity",
]

log = logging.getLogger(__name__)

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_COUNT = "nvidia.com/gpu.count"
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


@lru_cache(maxsize=4096)
def quantity(text: str | int | float) -> float:
    """A Kubernetes resource quantity (``500m``, ``64Gi``, ``1e3``) as a float.

    Raises ValueError on anything else.
    """
    if isinstance(text, int | float):
        return float(text)
    raw = str(text).strip()
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
        if raw.endswith(suffix):
            number, factor = raw[: -len(suffix)], Decimal(_SUFFIX[suffix])
            break
    else:
        if raw and raw[-1] in _SUFFIX and not raw[-1].isdigit() and raw[-1] != "E":
            number, factor = raw[:-1], Decimal(_SUFFIX[raw[-1]])
        elif raw.endswith("E") and raw[:-1].replace(".", "", 1).isdigit():
            number, factor = raw[:-1], Decimal(_SUFFIX["E"])
        else:
            number, factor = raw, Decimal(1)
    try:
        return float(Decimal(number) * factor)
    except InvalidOperation:
        raise ValueError(f"not a Kubernetes quantity: {text!r}") from None


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
        if LABEL_COUNT in labels:
            count = int(quantity(labels[LABEL_COUNT]))
        else:
            count = int(quantity(allocatable.get(GPU_RESOURCE, 0)))
        memory = (
            quantity(labels[LABEL_MEMORY]) if LABEL_MEMORY in labels else default_gpu_memory_mib
        )
        cpu = quantity(allocatable.get("cpu", 0))
        ram = quantity(allocatable.get("memory", 0)) / 2**20
    except ValueError as exc:
        raise ValueError(f"node {name}: {exc}") from None
    if count < 0 or memory <= 0:
        raise ValueError(f"node {name}: bad GPU inventory ({count} GPUs of {memory} MiB)")
    product = str(labels.get(LABEL_PRODUCT, "unknown"))
    gpus = tuple(GpuDevice(i, memory, product) for i in range(count))
    return Node(name=name, gpus=gpus, cpu_cores=cpu, host_mem_mib=ram)


def pod_gpu_request(obj: Mapping[str, Any]) -> int:
    """GPUs the pod asks for: the sum over containers of ``nvidia.com/gpu`` (requests,
    else limits), or the largest init container's if larger.  Raises ValueError."""

    def of(containers: Any) -> list[int]:
        found = []
        for c in containers or ():
            res = _get(c, "resources") or {}
            value = (res.get("requests") or {}).get(GPU_RESOURCE)
            if value is None:
                value = (res.get("limits") or {}).get(GPU_RESOURCE)
            found.append(int(quantity(value)) if value is not None else 0)
        return found

    spec = obj.get("spec") or {}
    main = sum(of(spec.get("containers")))
    init = max(of(spec.get("initContainers")), default=0)
    return max(main, init)


def pod_is_active(obj: Mapping[str, Any]) -> bool:
    """Whether the pod holds (or will hold) resources: not Succeeded/Failed."""
    phase = _get(obj, "status", "phase")
    return phase not in ("Succeeded", "Failed")


def pod_key(obj: Mapping[str, Any]) -> str:
    """``namespace/name`` of a pod object."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or 'default'}/{meta.get('name', '')}"
