"""Which nodes are closed to a pod: cordoned, or tainted against it, as kube-scheduler sees.

kube-scheduler's NodeUnschedulable and TaintToleration filters keep a pod off a node with
``spec.unschedulable`` or a NoSchedule/NoExecute taint it does not tolerate
(``cluster.objects.closed_to``).  The core knows neither (it is pure, and a cordon is no
GPU fact), so the edge tells it: a pending pod's job carries the names of the nodes closed
to it (``Job.barred_nodes``), and the planner places it elsewhere.  Filter refuses those
nodes with the same reason, and bind refuses them too.

Most nodes keep no pod out, and most pods of a cluster carry one of a few toleration
lists, so the answer is kept per toleration list while no node's cordon or keep-out
taints change (status heartbeats do not count): a filter call or an epoch over
thousands of pending pods of one template checks the closed nodes once.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import orjson

from elastico_extender.cluster.objects import KEEP_OUT_EFFECTS, closed_to
from elastico_extender.cluster.state import ClusterState

__all__ = ["MAX_KEY_BYTES", "MAX_TOLERATION_SETS", "Closures", "KeepOut", "keep_out"]

MAX_TOLERATION_SETS = 256
"""Distinct toleration lists whose answers are kept per node set (callers choose pods'
tolerations, so the bound is in entries; a list is typically a few hundred bytes)."""
MAX_KEY_BYTES = 8192
"""Longer toleration lists (as JSON) are answered but not kept: with the entry bound,
the cache holds at most about 2 MiB of keys whatever filter callers send."""


KeepOut = tuple[bool, tuple[tuple[str, str, str], ...]]
"""What of a node can close it to a pod: cordoned, and its NoSchedule/NoExecute taints."""


def keep_out(node: Mapping[str, Any]) -> KeepOut | None:
    """The node's cordon and keep-out taints (key, value, effect); None when it keeps no
    pod out (most nodes)."""
    spec = node.get("spec") or {}
    if not isinstance(spec, Mapping):
        return None
    taints = spec.get("taints")
    kept = tuple(
        (str(t.get("key") or ""), str(t.get("value") or ""), str(t["effect"]))
        for t in (taints if isinstance(taints, list) else ())
        if isinstance(t, Mapping) and t.get("effect") in KEEP_OUT_EFFECTS
    )
    cordoned = spec.get("unschedulable") is True
    return (cordoned, kept) if cordoned or kept else None


class Closures:
    """Per pod, the nodes closed to it and why (thread-safe: the epoch and the verbs)."""

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self._lock = threading.Lock()
        self._generation = -1
        # per node: the object last read and what of it may close it (None: nothing)
        self._facts: dict[str, tuple[dict[str, Any], KeepOut | None]] = {}
        self._signature: tuple[tuple[str, KeepOut], ...] = ()  # every node's that may close
        self._keeping_out: list[tuple[str, dict[str, Any]]] = []  # those nodes' objects
        self._answers: dict[bytes, dict[str, str]] = {}  # toleration list -> closed nodes

    def _refresh(self) -> None:
        """Follow the node set (call with the lock held).  A node object seen before is not
        read again, and the answers stay while no cordon or keep-out taint changed: status
        heartbeats, which replace node objects all the time, cost an identity check each."""
        generation = self.state.node_generation
        if generation == self._generation:
            return
        known = self._facts
        facts: dict[str, tuple[dict[str, Any], KeepOut | None]] = {}
        for name, obj in self.state.nodes().items():
            hit = known.get(name)
            facts[name] = hit if hit is not None and hit[0] is obj else (obj, keep_out(obj))
        self._facts = facts
        signature = tuple(sorted((n, f) for n, (_, f) in facts.items() if f is not None))
        if signature != self._signature:
            self._signature = signature
            self._answers.clear()
        self._keeping_out = [(name, facts[name][0]) for name, _ in signature]
        self._generation = generation

    def closed(self, pod: Mapping[str, Any]) -> dict[str, str]:
        """Node name -> why kube-scheduler would not place ``pod`` there; empty when every
        node is open to it.  The mapping is shared: do not change it."""
        spec = pod.get("spec")
        tolerations = spec.get("tolerations") if isinstance(spec, Mapping) else None
        try:
            key = orjson.dumps(tolerations, option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not JSON (a caller's body): no cache, same answer
            key = b""
        if len(key) > MAX_KEY_BYTES:
            key = b""
        with self._lock:
            self._refresh()
            signature = self._signature
            if not self._keeping_out:
                return {}
            found = self._answers.get(key) if key else None
            if found is not None:
                return found
            keeping_out = self._keeping_out
        probe = {"spec": {"tolerations": tolerations}}
        closed = {}
        for name, node in keeping_out:
            why = closed_to(node, probe)
            if why:
                closed[name] = why
        if key:
            with self._lock:
                if self._signature == signature:
                    if len(self._answers) >= MAX_TOLERATION_SETS:
                        self._answers.clear()
                    self._answers[key] = closed
        return closed
