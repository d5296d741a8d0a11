"""The embedded cluster: real Node/Pod JSON from a file, bound in memory.

The file is a Kubernetes ``v1 List`` (``{"kind": "List", "items": [...]}``) of
Node and Pod objects, exactly as ``kubectl get nodes,pods -o json`` prints them.
It is the no-cluster default of ``serve`` (so every endpoint can be tried
without Kubernetes), the tests' fixture, and a starting state for experiments.
Bind applies the same writes a real API server would (ConfigMap owned by the
pod, annotations, ``spec.nodeName``) to the in-memory objects.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from elastico_extender.cluster.base import BindRequest, ClusterError
from elastico_extender.cluster.state import ClusterState, KubeObject

__all__ = ["DEFAULT_EMBEDDED", "EmbeddedCluster", "load_objects"]

log = logging.getLogger(__name__)

DEFAULT_EMBEDDED = "embedded_cluster.json"
"""Packaged file under ``elastico_extender/data`` used when no path is given."""


def load_objects(path: str | Path | None = None) -> list[KubeObject]:
    """Items of a v1 List file (the packaged default when ``path`` is None)."""
    if path is None:
        text = resources.files("elastico_extender").joinpath("data", DEFAULT_EMBEDDED).read_text()
    else:
        text = Path(path).read_text()
    doc = json.loads(text)
    items = doc.get("items") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise ValueError("embedded cluster file must be a v1 List with an items array")
    return items


class EmbeddedCluster:
    """A :class:`~.base.Cluster` over objects held in memory."""

    def __init__(self, objects: list[KubeObject], source: str = "embedded") -> None:
        self.state = ClusterState()
        self.description = f"embedded cluster from {source} (no Kubernetes API server)"
        self.configmaps: dict[tuple[str, str], KubeObject] = {}
        self.bindings: list[KubeObject] = []
        self.evictions: list[tuple[str, str]] = []  # (namespace, name) of evicted pods
        self._lock = threading.Lock()
        self._rv = itertools.count(1000)
        nodes = [o for o in objects if self._is_node(o)]
        pods = [o for o in objects if self._is_pod(o)]
        for obj in nodes + pods:
            obj.setdefault("metadata", {}).setdefault("resourceVersion", str(next(self._rv)))
            if self._is_pod(obj):
                obj["metadata"].setdefault("namespace", "default")
                obj["metadata"].setdefault("uid", f"embedded-{obj['metadata'].get('name')}")
        rv = str(next(self._rv))
        self.state.replace("nodes", nodes, rv)
        self.state.replace("pods", pods, rv)

    @staticmethod
    def _is_node(obj: KubeObject) -> bool:
        return obj.get("kind") == "Node"

    @staticmethod
    def _is_pod(obj: KubeObject) -> bool:
        return obj.get("kind") == "Pod"

    @classmethod
    def from_file(cls, path: str | Path | None = None) -> EmbeddedCluster:
        source = str(path) if path is not None else f"elastico_extender/data/{DEFAULT_EMBEDDED}"
        return cls(load_objects(path), source)

    def start(self) -> None:
        log.info("cluster.start", extra={"cluster": self.description})

    def stop(self) -> None:
        return None

    def add_pod(self, pod: KubeObject) -> KubeObject:
        """Create a pod, as ``kubectl apply`` would (tests and demos)."""
        obj = copy.deepcopy(pod)
        obj.setdefault("kind", "Pod")
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", "default")
        meta.setdefault("uid", f"embedded-{meta.get('name')}")
        meta["resourceVersion"] = str(next(self._rv))
        self.state.apply("pods", "ADDED", obj)
        return obj

    def delete_pod(self, namespace: str, name: str) -> None:
        pod = self.state.pod_by_name(namespace, name)
        if pod is not None:
            self.state.apply("pods", "DELETED", pod)
            with self._lock:
                uid = pod["metadata"].get("uid")
                for key, cm in list(self.configmaps.items()):
                    owners = cm["metadata"].get("ownerReferences") or []
                    if any(o.get("uid") == uid for o in owners):
                        del self.configmaps[key]  # garbage collection of owned objects

    def evict(self, namespace: str, name: str, uid: str) -> None:
        """No controllers here: the pod is deleted (recorded in ``evictions``)."""
        pod = self.state.pod_by_name(namespace, name)
        if pod is None or (uid and str(pod["metadata"].get("uid")) != uid):
            raise ClusterError(f"pod {namespace}/{name} with UID {uid} not found")
        self.evictions.append((namespace, name))
        self.delete_pod(namespace, name)

    def bind(self, request: BindRequest) -> None:
        with self._lock:
            pod = self.state.pod_by_name(request.namespace, request.name)
            if pod is None:
                raise ClusterError(f"pod {request.namespace}/{request.name} not found", 404)
            uid = str(pod["metadata"].get("uid"))
            if request.uid and uid != request.uid:
                raise ClusterError(
                    f"pod {request.namespace}/{request.name} has UID {uid}, not {request.uid}",
                    409,
                )
            if pod.get("spec", {}).get("nodeName"):
                raise ClusterError(
                    f"pod {request.namespace}/{request.name} is already bound to "
                    f"{pod['spec']['nodeName']}",
                    409,
                )
            if self.state.node(request.node) is None:
                raise ClusterError(f"node {request.node} not found", 404)
            self.bindings.append(binding_object(request))
            self._write_decision(pod, request, bind=True)

    def reconfigure(self, request: BindRequest) -> None:
        with self._lock:
            pod = self.state.pod_by_name(request.namespace, request.name)
            if pod is None:
                raise ClusterError(f"pod {request.namespace}/{request.name} not found")
            if (pod.get("spec") or {}).get("nodeName") != request.node:
                raise ClusterError(
                    f"pod {request.namespace}/{request.name} is not bound to {request.node}"
                )
            self._write_decision(pod, request, bind=False)

    def _write_decision(self, pod: KubeObject, request: BindRequest, *, bind: bool) -> None:
        """ConfigMap, then the pod's decision annotations (and nodeName when binding);
        call with the lock held."""
        uid = str(pod["metadata"].get("uid"))
        if request.configmap is not None:
            self.configmaps[(request.namespace, request.configmap)] = configmap_object(request, uid)
        updated: dict[str, Any] = copy.deepcopy(pod)
        meta = updated["metadata"]
        meta.setdefault("annotations", {}).update(request.annotations)
        if bind:
            updated.setdefault("spec", {})["nodeName"] = request.node
        meta["resourceVersion"] = str(next(self._rv))
        self.state.apply("pods", "MODIFIED", updated)


def configmap_object(request: BindRequest, pod_uid: str) -> KubeObject:
    """The per-pod ConfigMap, owned by the pod so it is garbage-collected with it."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": request.configmap,
            "namespace": request.namespace,
            "labels": {"app.kubernetes.io/managed-by": "elastico"},
            "ownerReferences": [
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "name": request.name,
                    "uid": pod_uid,
                    "controller": False,
                    "blockOwnerDeletion": False,
                }
            ],
        },
        "data": dict(request.data),
    }


def binding_object(request: BindRequest) -> KubeObject:
    """The v1 Binding that ``POST /api/v1/namespaces/{ns}/pods/{name}/binding`` takes."""
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": request.name, "namespace": request.namespace, "uid": request.uid},
        "target": {"apiVersion": "v1", "kind": "Node", "name": request.node},
    }
