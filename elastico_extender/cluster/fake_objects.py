"""The fake API server's store for every kind beyond nodes and pods (STYLE habit 12).

Any ``/api/v1/...`` or ``/apis/GROUP/VERSION/...`` collection, namespaced or not, is
served with the API server's semantics that ElastiCo and the official client rely on:

* ``POST`` creates (``409 AlreadyExists`` when the name is taken), assigning
  ``resourceVersion``, ``uid`` and ``creationTimestamp``;
* ``PUT`` replaces with optimistic concurrency: a body whose ``metadata.resourceVersion``
  is not the stored one gets ``409 Conflict`` (how two leader candidates race for a Lease);
* ``GET`` reads one object (``404 NotFound``) or lists a collection;
* ``DELETE`` removes it; ``PATCH`` (merge patch) updates it.

Used for Leases (leader election), Events, and every object the Helm chart renders.
"""

from __future__ import annotations

import copy
import re
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

__all__ = ["ObjectStore", "merge_patch", "parse_path"]

# /api/v1[/namespaces/NS]/RESOURCE[/NAME]  or  /apis/G/V[/namespaces/NS]/RESOURCE[/NAME]
_PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"(?:/namespaces/(?P<ns>[^/]+))?/(?P<resource>[^/]+)(?:/(?P<name>[^/]+))?$"
)

Key = tuple[str, str, str, str]  # group, resource, namespace ('' when cluster-scoped), name


def parse_path(path: str) -> tuple[str, str, str, str | None] | None:
    """(group, resource, namespace, name) of a REST path; core group is ''."""
    m = _PATH.match(path)
    if m is None:
        return None
    return (m["group"] or "", m["resource"], m["ns"] or "", m["name"])


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "reason": reason, "message": message, "code": code}  # fmt: skip


class ObjectStore:
    """Objects by (group, resource, namespace, name); ``next_rv`` is the shared counter."""

    def __init__(self, next_rv: Callable[[], int]) -> None:
        self._next_rv = next_rv
        self._lock = threading.Lock()
        self.objects: dict[Key, dict[str, Any]] = {}
        self.writes: list[tuple[str, Key]] = []  # (verb, key), in order

    def get(self, group: str, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.get((group, resource, namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def items(self, group: str, resource: str, namespace: str = "") -> list[dict[str, Any]]:
        with self._lock:
            return [
                copy.deepcopy(o)
                for (g, r, ns, _), o in self.objects.items()
                if g == group and r == resource and (not namespace or ns == namespace)
            ]

    def handle(
        self, method: str, path: str, body: dict[str, Any] | None
    ) -> tuple[int, dict[str, Any]] | None:
        """The answer to one request, or None when the path is not a REST path."""
        parsed = parse_path(path)
        if parsed is None:
            return None
        group, resource, namespace, name = parsed
        with self._lock:
            if method == "GET":
                if name is None:
                    items = [
                        copy.deepcopy(o)
                        for (g, r, ns, _), o in self.objects.items()
                        if g == group and r == resource and (not namespace or ns == namespace)
                    ]
                    return 200, {"kind": "List", "apiVersion": "v1", "items": items,
                                 "metadata": {"resourceVersion": str(self._next_rv())}}  # fmt: skip
                obj = self.objects.get((group, resource, namespace, name))
                if obj is None:
                    return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
                return 200, copy.deepcopy(obj)
            if method == "POST":
                if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                    return 400, _status(400, "BadRequest", "body must be an object with metadata")
                meta = body["metadata"]
                if not meta.get("name") and meta.get("generateName"):
                    meta["name"] = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
                if not meta.get("name"):
                    return 422, _status(422, "Invalid", "metadata.name: Required value")
                key = (group, resource, namespace, meta["name"])
                if key in self.objects:
                    return 409, _status(409, "AlreadyExists",
                                        f'{resource} "{meta["name"]}" already exists')  # fmt: skip
                return 201, self._store("create", key, body, None)
            if name is None:
                return 405, _status(405, "MethodNotAllowed", f"{method} needs a name")
            key = (group, resource, namespace, name)
            current = self.objects.get(key)
            if current is None:
                return 404, _status(404, "NotFound", f'{resource} "{name}" not found')
            if method == "DELETE":
                del self.objects[key]
                self.writes.append(("delete", key))
                return 200, _status(200, "", "deleted") | {"status": "Success"}
            if method == "PUT":
                if not isinstance(body, dict) or not isinstance(body.get("metadata"), dict):
                    return 400, _status(400, "BadRequest", "body must be an object with metadata")
                wanted = body["metadata"].get("resourceVersion")
                if wanted and wanted != current["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", (
                        f'Operation cannot be fulfilled on {resource} "{name}": the object '
                        "has been modified; please apply your changes to the latest version "
                        "and try again"))  # fmt: skip
                return 200, self._store("update", key, body, current)
            if method == "PATCH":
                merged = merge_patch(copy.deepcopy(current), body or {})
                return 200, self._store("patch", key, merged, current)
        return 405, _status(405, "MethodNotAllowed", method)

    def _store(
        self, verb: str, key: Key, body: dict[str, Any], current: dict[str, Any] | None
    ) -> dict[str, Any]:
        obj = copy.deepcopy(body)
        meta = obj["metadata"]
        if key[2]:
            meta["namespace"] = key[2]
        meta["resourceVersion"] = str(self._next_rv())
        old = (current or {}).get("metadata") or {}
        meta["uid"] = old.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = old.get("creationTimestamp") or datetime.now(UTC).strftime(
            "%Y-%m-%dT%H:%M:%SZ"
        )
        self.objects[key] = obj
        self.writes.append((verb, key))
        return copy.deepcopy(obj)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge_patch(target.get(k), v)
    return target
