"""Request checks at the edge: a malformed pod is a 400 naming the field, before any work.

kube-scheduler only ever sends pods the API server stored, but the extender port
answers anyone who can reach it.  The engine trusts the shape of the fields it
reads (``cluster.objects.check_pod`` lists them) and sizes arrays by a pod's GPU
count, so both are checked here, on the event loop, in time linear in the body:

* a field of the wrong JSON type -> ``400 {"Error": "Pod.spec.containers[0]: ..."}``;
* a GPU count no node of the cluster view could hold -> every candidate node fails
  with a reason naming ``nvidia.com/gpu`` (filter) or scores 0 (prioritize), without
  asking the engine.
"""

from __future__ import annotations

import threading
from typing import Any

from elastico_extender.api.deps import ApiError
from elastico_extender.cluster.objects import GPU_RESOURCE, PodFieldError, check_pod
from elastico_extender.core.model import Node
from elastico_extender.service.engine import Engine

__all__ = ["LargestNode", "checked_pod", "oversized_request"]


def checked_pod(pod: Any, where: str = "Pod") -> int:
    """The pod's GPU request; ApiError(400) naming the field when the pod is malformed."""
    try:
        return check_pod(pod)
    except PodFieldError as exc:
        if exc.field == "Pod":  # the object itself: ``where`` names it
            raise ApiError(400, f"{where}: {str(exc).removeprefix('Pod: ')}") from None
        raise ApiError(400, f"{where}.{exc}") from None


class LargestNode:
    """GPUs on the largest node of the engine's published view, memoised per node tuple
    (the engine publishes the same tuple until a node changes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: tuple[Node, ...] | None = None
        self._gpus = 0

    def gpus(self, engine: Engine) -> int | None:
        """None before the first plan (then only the absolute bound has been applied)."""
        if not engine.has_plan:
            return None
        nodes = engine.published.snapshot.nodes
        with self._lock:
            if nodes is not self._nodes:
                self._gpus = max((len(n.gpus) for n in nodes), default=0)
                self._nodes = nodes
            return self._gpus


def oversized_request(gpus: int, largest: int | None) -> str | None:
    """The reason no node can take a pod asking for ``gpus`` GPUs, or None if one might."""
    if largest is None or gpus <= largest:
        return None
    return (
        f"elastico: Pod.spec.containers[*].resources[{GPU_RESOURCE}] asks for {gpus} GPUs; "
        f"the largest node in the cluster view holds {largest}"
    )
