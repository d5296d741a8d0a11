"""The cluster view: the API server's Nodes and Pods as last seen, kept current by a driver.

A driver (the Kubernetes watch or the embedded file) writes whole objects in;
readers take consistent copies.  Events only replace objects; nothing here
interprets them (STYLE habit 2: react to current state, not to events).
``generation`` counts changes so the epoch loop can tell whether anything moved;
``node_generation`` counts node changes only.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["ClusterState", "KubeObject"]

KubeObject = dict[str, Any]


def _uid(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace', 'default')}/{meta.get('name', '')}")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


class ClusterState:
    """Thread-safe store of Node objects (by name) and Pod objects (by UID)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, KubeObject] = {}
        self._pods: dict[str, KubeObject] = {}
        self._by_key: dict[tuple[str, str], str] = {}
        self.generation = 0
        self.node_generation = 0
        self.synced: dict[str, bool] = {"nodes": False, "pods": False}
        self.resource_version: dict[str, str] = {"nodes": "", "pods": ""}

    # -- writers ------------------------------------------------------------
    def replace(self, kind: str, objects: Iterable[KubeObject], resource_version: str) -> None:
        """A full relist: objects absent from ``objects`` are gone."""
        with self._lock:
            if kind == "nodes":
                self._nodes = {_name(o): o for o in objects}
                self.node_generation += 1
            else:
                self._pods = {_uid(o): o for o in objects}
                self._by_key = {self._key(o): uid for uid, o in self._pods.items()}
            self.synced[kind] = True
            self.resource_version[kind] = resource_version
            self.generation += 1

    def apply(self, kind: str, event_type: str, obj: KubeObject) -> None:
        """One watch event (ADDED / MODIFIED / DELETED)."""
        rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
        with self._lock:
            if kind == "nodes":
                if event_type == "DELETED":
                    self._nodes.pop(_name(obj), None)
                else:
                    self._nodes[_name(obj)] = obj
                self.node_generation += 1
            else:
                uid = _uid(obj)
                if event_type == "DELETED":
                    old = self._pods.pop(uid, None)
                    if old is not None:
                        self._by_key.pop(self._key(old), None)
                else:
                    self._pods[uid] = obj
                    self._by_key[self._key(obj)] = uid
            if rv:
                self.resource_version[kind] = rv
            self.generation += 1

    def set_resource_version(self, kind: str, resource_version: str) -> None:
        with self._lock:
            self.resource_version[kind] = resource_version

    @staticmethod
    def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (str(meta.get("namespace") or "default"), str(meta.get("name", "")))

    # -- readers ------------------------------------------------------------
    def nodes(self) -> dict[str, KubeObject]:
        with self._lock:
            return dict(self._nodes)

    def pods(self) -> dict[str, KubeObject]:
        with self._lock:
            return dict(self._pods)

    def node(self, name: str) -> KubeObject | None:
        with self._lock:
            return self._nodes.get(name)

    def pod(self, uid: str) -> KubeObject | None:
        with self._lock:
            return self._pods.get(uid)

    def pod_by_name(self, namespace: str, name: str) -> KubeObject | None:
        with self._lock:
            uid = self._by_key.get((namespace, name))
            return None if uid is None else self._pods.get(uid)

    @property
    def is_synced(self) -> bool:
        return all(self.synced.values())
