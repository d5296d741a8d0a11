"""Read-only REST views of what is published: prices, jobs, nodes, the plan.

They read the published plan and view and the bookings; they own nothing but the
serialised replies they keep (:meth:`RestViews.kept`).

The views are built on the event loop that also answers kube-scheduler's verbs, so a
large one holds every scheduling request up while it builds (about 0.2 s for /nodes at
5,000 nodes).  /jobs, /nodes and /plan change only when a plan is published or a
booking is made or dropped, so their bytes are kept and served again until then.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from elastico_extender.cluster.objects import pod_key
from elastico_extender.core.model import DeviceRef
from elastico_extender.core.resources import GPU_SM, RESOURCE_NAMES
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.service.bookings import Bookings, Published

__all__ = ["RestViews", "to_json"]


def to_json(content: Any) -> bytes:
    """A reply's JSON (numpy numbers and arrays as JSON numbers and lists)."""
    return orjson.dumps(content, option=orjson.OPT_SERIALIZE_NUMPY)


class RestViews:
    """GET /prices, /jobs, /nodes, /plan (see :mod:`elastico_extender.api.routes.rest`).

    ``pod``: the cluster view's pod by UID, to name the invalid pods in /jobs."""

    def __init__(
        self,
        bookings: Bookings,
        history: Sequence[dict[str, Any]],
        predictor_name: str,
        predictor_degraded: str | None,
        planner_settings: PlannerSettings | None = None,
        pod: Callable[[str], Mapping[str, Any] | None] = lambda uid: None,
    ) -> None:
        self.bookings = bookings
        self.history = history
        self.predictor_name = predictor_name
        self.predictor_degraded = predictor_degraded
        self.planner_changed = (planner_settings or PlannerSettings()).changed()
        """The planner settings that differ from the defaults, shown on GET /plan."""
        self.pod = pod
        self._replies: dict[str, tuple[tuple[Any, ...], bytes]] = {}
        """One kept reply per view name (/jobs, /nodes, /plan: three at most)."""

    def kept(self, name: str, build: Callable[[], Any]) -> bytes:
        """View ``name`` as JSON: the kept reply while what the view reads is unchanged,
        else ``build()``'s, kept if nothing changed while it was built.

        What such a view reads that can change: the published plan and the bookings
        (:attr:`Bookings.version` moves at every publish, booking and release; the
        epoch drops confirmed and expired bookings without moving it, so the bookings
        themselves count too) and, for /jobs, the invalid pods' names (the cluster
        view).  A published plan is never changed after the publish."""
        key = self._inputs(name)
        kept = self._replies.get(name)
        if kept is not None and kept[0] == key:
            return kept[1]
        reply = to_json(build())
        if self._inputs(name) == key:  # else built on newer inputs than ``key`` says
            self._replies[name] = (key, reply)
        return reply

    def _inputs(self, name: str) -> tuple[Any, ...]:
        pub, booked, version = self.bookings.current()
        names = self._invalid_names(pub) if name == "jobs" else ()
        return (version, tuple(booked.values()), names)

    def _invalid_names(self, pub: Published) -> tuple[str | None, ...]:
        """``namespace/name`` of each invalid pod (they never became jobs), in
        ``pub.invalid``'s order; None for one gone from the cluster view."""
        objs = [self.pod(uid) for uid in pub.invalid]
        return tuple(None if obj is None else pod_key(obj) for obj in objs)

    def prices(self) -> dict[str, Any]:
        pub = self.bookings.published
        return {
            "epoch": pub.plan.epoch,
            "resources": pub.plan.price_map(),
            "units": dict(zip(RESOURCE_NAMES, ("fraction", "MiB", "cores", "MiB"), strict=True)),
            "history": list(self.history),
        }

    def jobs(self) -> list[dict[str, Any]]:
        pub, booked, _ = self.bookings.current()
        rows = []
        for job in pub.snapshot.jobs:
            pj = pub.pods.get(job.id)
            if pj is None:
                continue
            a = pub.plan.assignments.get(job.id)
            state = "running" if job.running else "pending"
            if job.id in pub.plan.rejected:
                state = "rejected"
            elif job.id in pub.plan.queued:
                state = "queued"
            elif job.id in booked:
                state = "binding"
            row: dict[str, Any] = {
                "id": job.id,
                "pod": pj.key,
                "family": job.family,
                "kind": job.kind.value,
                "mode": job.mode.value,
                "gpus": job.gpus,
                "weight": job.weight,
                "floor": job.min_throughput,
                "throughput_unit": pj.family.throughput_unit,
                "state": state,
                "reason": _reason(
                    pub.plan.rejected.get(job.id) or pub.plan.queue_reasons.get(job.id), pj.note
                ),
                # learned from finished pods (service.completions); None: not enough yet
                "expected_duration_s": job.expected_duration_s or None,
            }
            if a is not None:
                row.update(
                    {
                        "action": a.action.value,
                        "configuration": a.configuration.label,
                        "config_index": a.config_index,
                        "devices": [f"{n}/{d}" for n, d in a.devices],
                        "memory_budget_mib": a.memory_budget_mib,
                        "throughput": a.throughput,
                        "predicted_slowdown": a.predicted_slowdown,
                        "tolerance": a.tolerance if math.isfinite(a.tolerance) else None,
                        "estimated_profile": a.estimated,
                    }
                )
            rows.append(row)
        invalid_names = self._invalid_names(pub)
        for (uid, message), name in zip(pub.invalid.items(), invalid_names, strict=True):
            rows.append({"id": uid, "state": "invalid", "reason": message, "pod": name})
        return rows

    def nodes(self) -> list[dict[str, Any]]:
        pub, booked, _ = self.bookings.current()
        occupants: dict[DeviceRef, list[tuple[str, float, float]]] = {}
        for a in pub.plan.assignments.values():
            if a.job_id in booked:
                continue  # shown where it was booked, below
            pj = pub.pods.get(a.job_id)
            sm = float(pj.family.resources[a.config_index, GPU_SM]) if pj else 0.0
            for ref in a.devices:
                occupants.setdefault(ref, []).append(
                    (pj.key if pj else a.job_id, a.memory_budget_mib, sm)
                )
        for x in booked.values():
            sm = float(x.pod_job.family.resources[x.verdict.config_index, GPU_SM])
            for ref in x.verdict.devices:
                occupants.setdefault(ref, []).append(
                    (x.pod_job.key, x.verdict.memory_budget_mib, sm)
                )
        rows = []
        for node in pub.snapshot.nodes:
            gpus = []
            pairs: list[list[str]] = []
            seen: set[frozenset[str]] = set()
            for g in node.gpus:
                here = occupants.get((node.name, g.index))  # None: nothing on it
                names = [p for p, _, _ in here] if here else []
                sm_assigned = float(sum(s for _, _, s in here)) if here else 0.0
                gpus.append(
                    {
                        "index": g.index,
                        "product": g.product,
                        "memory_mib": g.memory_mib,
                        "memory_assigned_mib": float(sum(m for _, m, _ in here)) if here else 0.0,
                        "sm_assigned": 0.0 if sm_assigned < 0.0 else sm_assigned,
                        "pods": names,
                    }
                )
                for first, second in itertools.combinations(names, 2):
                    pair = frozenset((first, second))
                    if pair not in seen:  # pods that share several GPUs: one pair
                        seen.add(pair)
                        pairs.append([first, second])
            rows.append(
                {
                    "name": node.name,
                    "cpu_cores": node.cpu_cores,
                    "host_mem_mib": node.host_mem_mib,
                    "gpus": gpus,
                    "colocated_pairs": pairs,
                }
            )
        return rows

    def plan_summary(self) -> dict[str, Any]:
        pub = self.bookings.published
        p = pub.plan
        return {
            "epoch": p.epoch,
            "published_at": pub.published_at,
            "epoch_ms": pub.epoch_ms,
            "prices": p.price_map(),
            "utilization": p.utilization,
            "assignments": {
                job_id: {
                    "pod": pub.pods[job_id].key if job_id in pub.pods else job_id,
                    "configuration": a.configuration.label,
                    "devices": [f"{n}/{d}" for n, d in a.devices],
                    "action": a.action.value,
                    "memory_budget_mib": a.memory_budget_mib,
                    "predicted_slowdown": a.predicted_slowdown,
                }
                for job_id, a in p.assignments.items()
            },
            "queued": list(p.queued),
            "rejected": dict(p.rejected),
            "queue_reasons": dict(p.queue_reasons),
            "preempted": list(p.preempted),
            "violations": [list(v) for v in p.violations],
            "stats": {k: float(v) for k, v in p.stats.items()},
            "predictor": self.predictor_name,
            "predictor_degraded": self.predictor_degraded,
            "planner_settings": dict(self.planner_changed),
        }


def _reason(why: str | None, note: str) -> str | None:
    """A job's reason in /jobs: why the plan rejected or queued it, with what is peculiar
    to its pod (e.g. created without the webhook) as filter words it."""
    if why and note:
        return f"{why} (pod {note})"
    return why or note or None
