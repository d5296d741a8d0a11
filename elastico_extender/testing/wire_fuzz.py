"""Seeded fuzzing of every HTTP route with malformed and mutated real wire bodies.

The seeds are what a real kube-scheduler and API server sent (``/work/shared/wire``:
filter, prioritize, bind and preempt bodies of both nodeCacheCapable modes, and the
pods inside them wrapped as AdmissionReviews for ``/mutate``).  Each case is one
request: a seed with a few structural mutations (a value replaced by a hostile one,
a key dropped, a type changed, GPU quantities made absurd), or the seed's bytes
damaged (truncated, flipped, padded), sent to its route or to another one, with or
without the bearer token.  The same seed gives the same cases (``random.Random``).

Used by ``tests/test_edge_fuzz.py`` (a few thousand cases) and
``benchmarks/edge_fuzz.py`` (>= 100,000, with statuses and RSS recorded).
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["WIRE_DIR", "Case", "Fuzzer", "load_seeds", "wire_objects"]

WIRE_DIR = Path("/work/shared/wire")

ROUTES: dict[str, tuple[str, str]] = {
    "filter": ("POST", "/scheduler/filter"),
    "prioritize": ("POST", "/scheduler/prioritize"),
    "bind": ("POST", "/scheduler/bind"),
    "preempt": ("POST", "/scheduler/preempt"),
    "mutate": ("POST", "/mutate"),
}
READS = ["/healthz", "/readyz", "/metrics", "/jobs", "/nodes", "/prices", "/plan",
         "/openapi.json"]  # fmt: skip

HOSTILE: list[Any] = [
    "abc", "NaN", "Infinity", "-Infinity", "1e999999999", "1e308", "-1", "0.5", "",
    " ", "\u00e9\u65e5\u0000", "10000000", "1000000000", "9" * 40, [1], [], {}, {"a": 1},
    None, True, False, 0, -1, 10**30, 1.5, float("1e300"), "x" * 5000,
]  # fmt: skip
GPU_KEY = "nvidia.com/gpu"


@dataclass(frozen=True)
class Case:
    """One request: method, path, body bytes and headers."""

    method: str
    path: str
    body: bytes
    headers: dict[str, str | bytes]


def _dumps(doc: Any) -> bytes:
    """JSON bytes; the standard encoder, which (unlike orjson) nests past 255 levels."""
    return json.dumps(doc, ensure_ascii=False, separators=(",", ":")).encode()


def _read(path: Path) -> Any:
    return json.loads(path.read_text())


def load_seeds(wire: Path = WIRE_DIR) -> dict[str, list[Any]]:
    """Real bodies by verb (filter, prioritize, bind, preempt, mutate)."""
    seeds: dict[str, list[Any]] = {v: [] for v in ROUTES}
    for log in sorted(wire.rglob("requests.jsonl")):
        for line in log.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("verb") in seeds:
                seeds[entry["verb"]].append(entry["body"])
    for name in ("filter", "prioritize", "bind"):
        for path in (wire / f"{name}.json", wire / "nodecache" / f"{name}.json"):
            if path.exists():
                seeds[name].append(_read(path))
    for path in sorted((wire / "preempt").glob("preempt*.json")):
        if not path.name.endswith("response.json"):
            seeds["preempt"].append(_read(path))
    for body in seeds["filter"] + seeds["preempt"]:
        pod = body.get("Pod") if isinstance(body, dict) else None
        if isinstance(pod, dict):
            review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                      "request": {"uid": "fuzz", "operation": "CREATE",
                                  "object": _opted_in(pod)}}  # fmt: skip
            seeds["mutate"].append(review)
    return seeds


def _opted_in(pod: dict[str, Any]) -> dict[str, Any]:
    """The wire pod with ElastiCo annotations, so the webhook builds a patch for it."""
    out = copy.deepcopy(pod)
    meta = out.setdefault("metadata", {})
    meta.setdefault("annotations", {})["elastico.io/family"] = "bert"
    return out


def wire_objects(wire: Path = WIRE_DIR) -> list[dict[str, Any]]:
    """Node and Pod objects of the captures (kind set), for a cluster the seeds fit."""
    nodes: dict[str, dict[str, Any]] = {}
    pods: dict[str, dict[str, Any]] = {}
    for body in load_seeds(wire)["filter"]:
        for node in (body.get("Nodes") or {}).get("items") or ():
            nodes[node["metadata"]["name"]] = dict(node, kind="Node", apiVersion="v1")
        pod = body.get("Pod")
        if isinstance(pod, dict):
            pods[pod["metadata"]["uid"]] = dict(pod, kind="Pod", apiVersion="v1")
    if not any(n for n in nodes):  # nodeCacheCapable captures carry names only
        for name in ("gpu-node-1", "gpu-node-2", "gpu-node-3"):
            nodes[name] = {"kind": "Node", "apiVersion": "v1", "metadata": {"name": name},
                           "status": {"allocatable": {GPU_KEY: "4"}}}  # fmt: skip
    return list(nodes.values()) + list(pods.values())


class Fuzzer:
    """Cases from the seeds, deterministic for a seed."""

    def __init__(self, seeds: dict[str, list[Any]], token: str, seed: int = 0) -> None:
        self.seeds = {verb: bodies for verb, bodies in seeds.items() if bodies}
        self.token = token
        self.rng = random.Random(seed)

    # -- structural mutations --------------------------------------------------------
    def _paths(self, doc: Any, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
        yield at
        if isinstance(doc, dict):
            for key, value in doc.items():
                yield from self._paths(value, (*at, key))
        elif isinstance(doc, list):
            for i, value in enumerate(doc[:8]):
                yield from self._paths(value, (*at, i))

    @staticmethod
    def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
        if not path:
            return value
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        parent[path[-1]] = value
        return doc

    def _hostile(self) -> Any:
        rng = self.rng
        roll = rng.random()
        if roll < 0.7:
            return copy.deepcopy(rng.choice(HOSTILE))
        if roll < 0.85:  # deep nesting
            value: Any = rng.choice(HOSTILE[:5])
            for _ in range(rng.randint(10, 300)):
                value = [value] if rng.random() < 0.5 else {"k": value}
            return value
        return "".join(chr(rng.randint(0, 0x2FFF)) for _ in range(rng.randint(1, 40)))

    def _gpu_paths(self, doc: Any) -> list[tuple[Any, ...]]:
        return [p for p in self._paths(doc) if p and p[-1] == GPU_KEY]

    def mutate(self, doc: Any) -> Any:
        """A copy of ``doc`` with 1-4 structural changes."""
        rng = self.rng
        doc = copy.deepcopy(doc)
        for _ in range(rng.randint(1, 4)):
            paths = list(self._paths(doc))
            gpu = self._gpu_paths(doc)
            roll = rng.random()
            if gpu and roll < 0.3:
                doc = self._set(doc, rng.choice(gpu), rng.choice(HOSTILE))
            elif roll < 0.75:
                doc = self._set(doc, rng.choice(paths), self._hostile())
            elif roll < 0.9:
                path = rng.choice(paths)
                if path:
                    parent = doc
                    try:
                        for key in path[:-1]:
                            parent = parent[key]
                        del parent[path[-1]]
                    except (KeyError, IndexError, TypeError):
                        pass
            else:  # a subtree grafted elsewhere (right shapes in wrong places)
                source, target = rng.choice(paths), rng.choice(paths)
                value = doc
                try:
                    for key in source:
                        value = value[key]
                    doc = self._set(doc, target, copy.deepcopy(value))
                except (KeyError, IndexError, TypeError):
                    pass
        return doc

    # -- byte damage -------------------------------------------------------------------
    def damage(self, data: bytes) -> bytes:
        rng = self.rng
        roll = rng.random()
        if roll < 0.25 or not data:
            return data[: rng.randint(0, max(0, len(data) - 1))]
        if roll < 0.5:
            buf = bytearray(data)
            for _ in range(rng.randint(1, 16)):
                buf[rng.randrange(len(buf))] = rng.randrange(256)
            return bytes(buf)
        if roll < 0.7:
            return rng.choice([b"", b"null", b"[]", b"{}", b"0", b'"s"', b"\xff\xfe", b"{" * 2000])
        if roll < 0.85:
            at = rng.randrange(len(data))
            return (
                data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 64))) + data[at:]
            )
        return data + data[: rng.randint(1, 64)]

    # -- cases ------------------------------------------------------------------------
    def _headers(self) -> dict[str, str | bytes]:
        rng = self.rng
        headers: dict[str, str | bytes] = {"Content-Type": "application/json"}
        roll = rng.random()
        if roll < 0.45:
            headers["Authorization"] = f"Bearer {self.token}"
        elif roll < 0.6:
            choices: list[str | bytes] = [
                "Bearer", "Bearer x", "Basic abc", "bearer  " + self.token,
                "Bearer \u00e9\u00ff".encode(), "Bearer \u65e5".encode(), "Bearer " + "a" * 4096,
                self.token,
            ]  # fmt: skip
            headers["Authorization"] = rng.choice(choices)
        return headers

    def case(self) -> Case:
        rng = self.rng
        verb = rng.choice(list(self.seeds))
        seed = rng.choice(self.seeds[verb])
        roll = rng.random()
        if roll < 0.08:
            return Case("GET", rng.choice(READS), b"", self._headers())
        if roll < 0.1:
            method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "POST"])
            path = rng.choice(["/scheduler/filter", "/mutate", "/epoch", "/nope", "/scheduler/",
                               "/scheduler/bind/x", "/jobs"])  # fmt: skip
            return Case(method, path, b"{}", self._headers())
        method, path = ROUTES[verb]
        if rng.random() < 0.1:  # a real body of one verb sent to another verb
            method, path = ROUTES[rng.choice(list(ROUTES))]
        if roll < 0.75:
            body = _dumps(self.mutate(seed))
        elif roll < 0.95:
            body = self.damage(_dumps(seed))
        else:
            body = _dumps(seed)  # the real thing, unchanged
        return Case(method, path, body, self._headers())

    def cases(self, count: int) -> Iterator[Case]:
        for _ in range(count):
            yield self.case()
