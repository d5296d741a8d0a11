"""The embedded cluster: real Node/Pod JSON from a file, bound in memory.

The file is a Kubernetes ``v1 List`` (``{"kind": "List", "items": [...]}``) of
Node and Pod objects, exactly as ``kubectl get nodes,pods -o json`` prints them.
It is the no-cluster default of ``serve`` (so every endpoint can be tried
without Kubernetes), the tests' fixture, and a starting state for experiments.
Bind applies the same writes a real API server would (ConfigMap owned by the
pod, annotations, ``spec.nodeName``) to the in-memory objects.

What survives a restart: with ``state_file`` (``elastico serve --embedded-state``)
every change -- pods created, bound, reconfigured, deleted, and the ConfigMaps --
is written to that file atomically before the call returns, and a restart
(``kill -9`` included) starts from it.  Without it the objects live in memory only:
a restart starts again from the seed file, every bind forgotten.
"""

from __future__ import annotations

import copy
import itertools
import json
import logging
import os
import tempfile
import threading
from importlib import resources
from pathlib import Path
from typing import Any

from elastico_extender.cluster.base import BindRequest, ClusterError
from elastico_extender.cluster.objects import PodFieldError, check_pod
from elastico_extender.cluster.state import ClusterState, KubeObject
from elastico_extender.core.resources import MAX_NODES
from elastico_extender.userfiles import read_text, reason

__all__ = ["DEFAULT_EMBEDDED", "MAX_EMBEDDED_FILE_BYTES", "EmbeddedCluster", "load_objects"]

log = logging.getLogger(__name__)

DEFAULT_EMBEDDED = "embedded_cluster.json"
"""Packaged file under ``elastico_extender/data`` used when no path is given."""
MAX_EMBEDDED_FILE_BYTES = 256 << 20
"""Largest embedded cluster (or state) file read: thousands of nodes and tens of
thousands of pods are tens of MiB of JSON."""


def load_objects(path: str | Path | None = None) -> list[KubeObject]:
    """Items of a v1 List file (the packaged default when ``path`` is None)."""
    if path is None:
        text = resources.files("elastico_extender").joinpath("data", DEFAULT_EMBEDDED).read_text()
    else:
        try:
            text = read_text(path, MAX_EMBEDDED_FILE_BYTES)
        except OSError as exc:
            raise ValueError(f"{path}: cannot read: {reason(exc)}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ValueError(f"{path}: not JSON a cluster holds (nested too deeply)") from None
    items = doc.get("items") if isinstance(doc, dict) else doc
    if not isinstance(items, list):
        raise ValueError(f"{path}: embedded cluster file must be a v1 List with an items array")
    for i, item in enumerate(items):
        _check_item(item, f"{path}: items[{i}]")
    nodes = sum(item.get("kind") == "Node" for item in items)
    if nodes > MAX_NODES:  # more than kube-scheduler could ever ask about
        raise ValueError(
            f"{path}: {nodes:,} nodes; an embedded cluster holds at most {MAX_NODES:,}"
        )
    return items


def _check_item(item: object, where: str) -> None:
    """The shape of one object of the file, as the API server would guarantee it: a file
    is the user's, and a Pod whose spec is an array crashed the first epoch, a Node whose
    metadata is an array the start (Python's words, no field named)."""
    if not isinstance(item, dict):
        raise ValueError(f"{where} is not a Node or Pod object")
    meta = item.get("metadata")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError(f"{where}.metadata: must be an object")
    for part in ("spec", "status"):
        if item.get(part) is not None and not isinstance(item[part], dict):
            raise ValueError(f"{where}.{part}: must be an object")
    if item.get("kind") == "Pod":
        try:
            check_pod(item)
        except PodFieldError as exc:
            raise ValueError(f"{where}.{exc}") from None


class EmbeddedCluster:
    """A :class:`~.base.Cluster` over objects held in memory."""

    def __init__(
        self,
        objects: list[KubeObject],
        source: str = "embedded",
        *,
        state_file: str | Path | None = None,
    ) -> None:
        self.state = ClusterState()
        self.state_file = Path(state_file) if state_file is not None else None
        kept = f" (state kept in {self.state_file})" if self.state_file else ""
        self.description = f"embedded cluster from {source}{kept} (no Kubernetes API server)"
        self.configmaps: dict[tuple[str, str], KubeObject] = {}
        self.bindings: list[KubeObject] = []
        self.evictions: list[tuple[str, str]] = []  # (namespace, name) of evicted pods
        self._lock = threading.Lock()
        self._save_lock = threading.Lock()
        self._rv = itertools.count(1000)
        if self.state_file is not None and self.state_file.exists():
            objects = load_objects(self.state_file)  # what the last run wrote, not the seed
            self.description = f"embedded cluster restored from {self.state_file}"
            versions = (str((o.get("metadata") or {}).get("resourceVersion", "")) for o in objects)
            rvs = [int(v) for v in versions if v.isascii() and v.isdigit()]
            self._rv = itertools.count(max(rvs, default=999) + 1)
            for cm in (o for o in objects if o.get("kind") == "ConfigMap"):
                self.configmaps[(cm["metadata"]["namespace"], cm["metadata"]["name"])] = cm
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
        self._save()

    def _save(self) -> None:
        """Write every object to ``state_file`` (when set) atomically and durably: a
        temporary file, fsync, rename, fsync of the directory -- after every change, so
        a ``kill -9`` at any point leaves the last complete state."""
        if self.state_file is None:
            return
        with self._save_lock:
            items = [
                *self.state.nodes().values(),
                *self.state.pods().values(),
                *self.configmaps.values(),
            ]
            body = json.dumps({"apiVersion": "v1", "kind": "List", "items": items}).encode()
            folder = self.state_file.parent
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".embedded-", dir=folder)
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(body)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, self.state_file)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            dir_fd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    @staticmethod
    def _is_node(obj: KubeObject) -> bool:
        return obj.get("kind") == "Node"

    @staticmethod
    def _is_pod(obj: KubeObject) -> bool:
        return obj.get("kind") == "Pod"

    @classmethod
    def from_file(
        cls, path: str | Path | None = None, state_file: str | Path | None = None
    ) -> EmbeddedCluster:
        """The objects of ``path`` (the packaged demo when None); with ``state_file``,
        what the last run left there instead, once it exists."""
        source = str(path) if path is not None else f"elastico_extender/data/{DEFAULT_EMBEDDED}"
        return cls(load_objects(path), source, state_file=state_file)

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
        self._save()
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
            self._save()

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
            self._save()

    def reconfigure(self, request: BindRequest) -> None:
        with self._lock:
            pod = self.state.pod_by_name(request.namespace, request.name)
            if pod is None:
                raise ClusterError(f"pod {request.namespace}/{request.name} not found")
            uid = str(pod["metadata"].get("uid"))
            if request.uid and uid != request.uid:  # a same-named successor
                raise ClusterError(
                    f"pod {request.namespace}/{request.name} has UID {uid}, not {request.uid}",
                    422,
                )
            if (pod.get("spec") or {}).get("nodeName") != request.node:
                raise ClusterError(
                    f"pod {request.namespace}/{request.name} is not bound to {request.node}"
                )
            self._write_decision(pod, request, bind=False)
            self._save()

    def read_configmap(self, namespace: str, name: str) -> KubeObject | None:
        """A copy of the ConfigMap bind wrote (:class:`~.base.ConfigMapReader`), or None."""
        with self._lock:
            found = self.configmaps.get((namespace, name))
            return copy.deepcopy(found) if found is not None else None

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
