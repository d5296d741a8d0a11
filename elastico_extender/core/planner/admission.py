"""Per-pod placement between epochs: what the extender's filter, prioritize and bind ask.

The epoch planner publishes a plan every Delta T; a pod that arrives in between
must not wait for it (ARCHITECTURE: "a pod the plan has not seen yet gets its
best configuration at current prices on the spot").  :class:`PlacementView`
holds the devices as the latest plan left them plus every placement the
extender has *assumed* since (a bind in flight counts against capacity until
the watch confirms it), and answers, for one job and many nodes at once:

* which configuration, at the current shadow prices, the job would run on each
  node (cheapest ESP score among configurations that fit a device there and
  pass the interference check against that device's occupants),
* or why a node cannot take it (memory, SM, host resources, interference).

It uses the same validity rules (``tables.build_tables``), the same capacity
ledger (``DeviceTable``) and the same interference screening (``Placer``) as
the epoch, so the service and the planner cannot disagree about "fits".

Not thread-safe: the service serialises calls with one lock (each call is a
few hundred microseconds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import NamedTuple

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.interference.tolerance import planner_tolerance
from elastico_extender.core.model import (
    AssignmentColumns,
    DeviceRef,
    GpuDevice,
    Job,
    Node,
    Plan,
    ProfileFamily,
    Snapshot,
)
from elastico_extender.core.planner.devices import DeviceTable, device_tuples, gpu_equivalent
from elastico_extender.core.planner.observed_sm import charged_sm, observed_ratios
from elastico_extender.core.planner.observed_throughput import corrected
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.planner.tables import build_tables, stack_families
from elastico_extender.core.resources import GPU_MEM, GPU_SM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings

__all__ = ["MAX_SCREENED_DEVICES", "UNKNOWN_NODE", "Answers", "NodeVerdict", "PlacementView"]

MAX_SCREENED_DEVICES = 256
"""Occupied devices whose interference is predicted per configuration tried (tightest
fit first); bounds filter latency on a busy cluster.  Devices beyond it are skipped
for that configuration, never admitted unchecked."""
SCREENED_PER_NODE = 2
"""Occupied candidate devices per node whose interference is predicted (tightest first)."""
MAX_OPTIONS = 16
"""Configurations tried per call, best score first."""
UNKNOWN_NODE = "node has no GPU inventory known to ElastiCo (not in its cluster view)"
"""The reason given for a node name the view does not know."""


class NodeVerdict(NamedTuple):
    """Whether ``node`` can take the job now, and how (a tuple: one is built per node)."""

    node: str
    feasible: bool
    config_index: int = -1
    devices: tuple[DeviceRef, ...] = ()
    predicted_slowdown: float = 1.0
    tolerance: float = math.inf
    score: float = math.inf  # ESP score of the chosen configuration (lower is better)
    memory_budget_mib: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Answers:
    """One job's verdict on every node of a view, as arrays indexed like ``view.nodes``.

    What :meth:`PlacementView.answer` returns: the extender reads filter and
    prioritize straight off these arrays, and :meth:`verdict` builds the
    :class:`NodeVerdict` of one node when a caller wants the record.  Only nodes
    in ``asked`` were evaluated; an infeasible node's reason is
    ``reasons[reason_of[node]]`` (``reason_of`` is -1 where feasible).
    """

    names: Sequence[str]  # node names, the view's order
    refs: Sequence[DeviceRef]  # device row -> (node, index), the view's table
    asked: np.ndarray  # (N,) bool
    feasible: np.ndarray  # (N,) bool: the node can take the job now
    config: np.ndarray  # (N,) intp configuration row (-1 where infeasible or unknown)
    devices: np.ndarray  # (N, D) intp device rows (D >= gpus), -1 past the job's devices
    slowdown: np.ndarray  # (N,) predicted S_hat of the newcomer (1.0 alone)
    tolerance: np.ndarray  # (N,)
    score: np.ndarray  # (N,) ESP score of the chosen configuration (-inf: the plan's own)
    budget: np.ndarray  # (N,) GPU memory budget in MiB
    reason_of: np.ndarray  # (N,) intp index into ``reasons``, -1 where feasible
    reasons: tuple[str, ...]

    def reason(self, node: int) -> str:
        """Why ``node`` (an index; -1 for a name the view does not know) cannot take the job."""
        if node < 0:
            return UNKNOWN_NODE
        code = int(self.reason_of[node])
        return self.reasons[code] if code >= 0 else ""

    def verdict(self, node: int, name: str) -> NodeVerdict:
        """The record for one node (``node`` -1: a name the view does not know)."""
        if node < 0 or not self.feasible[node]:
            return NodeVerdict(name, False, reason=self.reason(node))
        rows = self.devices[node]
        return NodeVerdict(
            name,
            True,
            int(self.config[node]),
            tuple(self.refs[d] for d in rows[rows >= 0].tolist()),
            float(self.slowdown[node]),
            float(self.tolerance[node]),
            float(self.score[node]),
            float(self.budget[node]),
            "",
        )

    def with_verdict(self, node: int, verdict: NodeVerdict, index: dict[DeviceRef, int]) -> Answers:
        """A copy where ``node`` answers ``verdict`` (the extender's own placement of a job
        the view already holds); device references missing from ``index`` are dropped."""
        rows = [index[r] for r in verdict.devices if r in index]
        width = max(self.devices.shape[1], len(rows))
        devices = np.full((self.devices.shape[0], width), -1, dtype=np.intp)
        devices[:, : self.devices.shape[1]] = self.devices
        devices[node] = -1
        devices[node, : len(rows)] = rows
        arrays = {
            "asked": self.asked.copy(),
            "feasible": self.feasible.copy(),
            "config": self.config.copy(),
            "slowdown": self.slowdown.copy(),
            "tolerance": self.tolerance.copy(),
            "score": self.score.copy(),
            "budget": self.budget.copy(),
            "reason_of": self.reason_of.copy(),
        }
        arrays["asked"][node] = True
        arrays["feasible"][node] = verdict.feasible
        arrays["config"][node] = verdict.config_index
        if verdict.feasible:
            arrays["slowdown"][node] = verdict.predicted_slowdown
            arrays["tolerance"][node] = verdict.tolerance
            arrays["score"][node] = verdict.score
            arrays["budget"][node] = verdict.memory_budget_mib
            arrays["reason_of"][node] = -1
            reasons = self.reasons
        else:
            arrays["reason_of"][node] = len(self.reasons)
            reasons = (*self.reasons, verdict.reason)
        return Answers(self.names, self.refs, devices=devices, reasons=reasons, **arrays)


class PlacementView:
    """Devices as the latest plan left them, plus placements assumed since."""

    def __init__(
        self,
        snapshot: Snapshot,
        plan: Plan,
        settings: PlannerSettings | None = None,
        predictor: SlowdownPredictor | None = None,
    ) -> None:
        self.settings = settings or PlannerSettings()
        if not self.settings.interference_check:
            predictor = None
        elif predictor is None:
            predictor = ContentionPredictor()
        self.nodes = snapshot.nodes
        self.plan = plan
        self.prices = np.asarray(plan.prices, dtype=np.float64)
        self.table = DeviceTable(snapshot.nodes, self.settings.memory_margin_mib)
        self.placer = Placer(self.table, predictor)
        self.units = gpu_equivalent(self.table)
        # Per node set, not per view: shared with every view of the same nodes (read-only).
        self.node_index = snapshot.devices.node_position
        self.names = snapshot.devices.node_names
        self._rows: dict[str, int] = {}
        self._next_row = 0
        self._valid_cache: dict[tuple[object, ...], tuple[np.ndarray, str | None]] = {}
        # per family, T(c) as the plan ranked it: measured solo rates where the loop has
        # them (planner.observed_throughput), so a pod arriving between plans is scored
        # as the next plan will score it
        self._rates = snapshot.solo_rates if self.settings.observed_throughput else {}
        self._throughput: dict[str, tuple[ProfileFamily, np.ndarray]] = {}
        cluster = snapshot.devices
        with_gpus = cluster.per_node > 0
        self._caps_node: tuple[Node, ...] = (
            (
                Node(
                    "largest",
                    (GpuDevice(0, float(cluster.memory_total.max())),),
                    float(cluster.cpu[with_gpus].max()),
                    float(cluster.ram[with_gpus].max()),
                ),
            )
            if with_gpus.any()
            else ()
        )
        self._demand: dict[int, np.ndarray] = {}  # rows assumed since the plan
        self._plan_demand = np.zeros((0, NUM_RESOURCES))  # per-GPU demand of plan rows
        self._assumed: set[str] = set()
        # U(t) for tau is the plan's (offered load, smoothed: ``EpochPlanner``), so a pod
        # screened between plans is judged at the tolerance every running pair was; only a
        # plan from a policy without tau has none, and then its allocated share stands in.
        utilization = plan.utilization
        if utilization is None:
            utilization = max(
                plan.stats.get("sm_allocated", 0.0), plan.stats.get("memory_allocated", 0.0)
            )
        self.utilization = float(utilization)
        self.placer.banded = bool(snapshot.observed)  # closed loop: admission band
        self.placer.gang_band = self.settings.gang_band
        self._commit_plan(snapshot, plan)

    # -- bookkeeping ----------------------------------------------------------
    def _row_for(self, job_id: str) -> int:
        row = self._rows.get(job_id)
        if row is None:
            row = self._next_row
            self._next_row += 1
            self._rows[job_id] = row
        return row

    def _commit_plan(self, snapshot: Snapshot, plan: Plan) -> None:
        """Every assignment of ``plan`` whose job and devices the snapshot knows, in bulk."""
        columns = (
            plan.assignments.rows_in(snapshot.jobs)
            if isinstance(plan.assignments, AssignmentColumns)
            else None
        )
        if columns is None:  # a plan made from another snapshot: match by job id
            self._commit_records(snapshot, plan)
            return
        index = self.table.index
        held = snapshot.columns.held
        rows, moved = columns.rows, columns.moved
        m = rows.size
        # Workers of each assignment, flat: kept jobs' from the snapshot, moved ones' here.
        width = held[rows].copy()
        moved_to = {k: [index.get(ref, -1) for ref in refs] for k, refs in moved.items()}
        for k, found in moved_to.items():
            width[k] = len(found)
        offset = np.cumsum(width) - width
        flat = np.empty(int(width.sum()), dtype=np.intp)
        kept = np.ones(m, dtype=bool)
        kept[list(moved_to)] = False
        kept_at = np.flatnonzero(kept)
        w = width[kept_at]
        within = np.arange(int(w.sum())) - np.repeat(np.cumsum(w) - w, w)
        first_worker = np.cumsum(held) - held
        flat[np.repeat(offset[kept_at], w) + within] = snapshot.workers[
            np.repeat(first_worker[rows[kept_at]], w) + within
        ]
        for k, found in moved_to.items():
            flat[offset[k] : offset[k] + len(found)] = found
        owner = np.repeat(np.arange(m), width)
        good = np.ones(m, dtype=bool)
        good[owner[flat < 0]] = False  # a device the view's table does not know
        if not good.all():
            flat, width = flat[good[owner]], width[good]
        positions = np.flatnonzero(good)
        ids = columns.ids if positions.size == m else [columns.ids[k] for k in positions.tolist()]
        self._rows = dict(zip(ids, range(positions.size), strict=True))
        self._next_row = positions.size
        stack = stack_families(snapshot)
        family = snapshot.columns.family_code[rows[positions]]
        configs = columns.config[positions]
        demand = stack.resources[family, configs]
        if self.settings.observed_sm and snapshot.observed:  # as the planner charged them
            charged, ratio = observed_ratios(snapshot)
            if charged.size:
                full = np.ones(len(snapshot.jobs))
                full[charged] = ratio
                mine = full[rows[positions]]
                demand[:, GPU_SM] = charged_sm(demand[:, GPU_SM], mine)
        view_rows = np.arange(positions.size, dtype=np.intp)
        self.placer.commit_many(
            view_rows,
            configs,
            device_tuples(flat, width),
            np.repeat(view_rows, width),
            flat,
            np.repeat(demand, width, axis=0),
            stack.features[family, configs],
            columns.tolerance[positions],
        )
        self._plan_demand = demand

    def _commit_records(self, snapshot: Snapshot, plan: Plan) -> None:
        jobs = {job.id: job for job in snapshot.jobs}
        index = self.table.index
        kept = [
            (a, jobs[a.job_id])
            for a in plan.assignments.values()
            if a.job_id in jobs and all(ref in index for ref in a.devices)
        ]
        if not kept:
            return
        rows = np.arange(len(kept), dtype=np.intp)
        self._rows = {a.job_id: int(r) for r, (a, _) in zip(rows.tolist(), kept, strict=True)}
        self._next_row = len(kept)
        families = snapshot.families
        configs = np.fromiter((a.config_index for a, _ in kept), np.intp, len(kept))
        demand = np.stack([families[job.family].resources[a.config_index] for a, job in kept])
        devices = [tuple(index[ref] for ref in a.devices) for a, _ in kept]
        width = np.fromiter(map(len, devices), np.intp, len(kept))
        features = np.stack(
            [families[job.family].features[a.config_index, :NUM_JOB_FEATURES] for a, job in kept]
        )
        self.placer.commit_many(
            rows,
            configs,
            devices,
            np.repeat(rows, width),
            np.fromiter((d for devs in devices for d in devs), np.intp, int(width.sum())),
            np.repeat(demand, width, axis=0),
            features,
            np.fromiter((a.tolerance for a, _ in kept), np.float64, len(kept)),
        )
        self._plan_demand = demand

    @property
    def assumed(self) -> frozenset[str]:
        """Jobs placed by :meth:`assume` and not yet forgotten."""
        return frozenset(self._assumed)

    def holds(self, job_id: str) -> bool:
        """Whether the job occupies devices in this view (from the plan or assumed)."""
        row = self._rows.get(job_id)
        return row is not None and row in self.placer.devices_of

    def devices_of(self, job_id: str) -> tuple[DeviceRef, ...]:
        row = self._rows.get(job_id)
        if row is None or row not in self.placer.devices_of:
            return ()
        return tuple(self.table.refs[d] for d in self.placer.devices_of[row])

    def config_of(self, job_id: str) -> int | None:
        """The configuration the view counts the job in (None when it holds no devices)."""
        row = self._rows.get(job_id)
        if row is None or row not in self.placer.devices_of:
            return None
        return int(self.placer.config[row])

    def jobs_on(self, refs: Iterable[DeviceRef]) -> set[str]:
        """Ids of the jobs the view places on any of the devices ``refs``."""
        index = self.table.index
        rows = {r for ref in refs if ref in index for r in self.table.occupants[index[ref]]}
        placed = self.placer.devices_of
        return {job for job, row in self._rows.items() if row in rows and row in placed}

    def assume(
        self, job: Job, family: ProfileFamily, verdict: NodeVerdict, *, force: bool = False
    ) -> None:
        """Count a bind in flight against capacity. Raises ValueError if it no longer fits
        (``force``: count it anyway -- a pod that is there, whatever the plan wanted)."""
        if not verdict.feasible:
            raise ValueError(f"cannot assume an infeasible placement on {verdict.node}")
        if self.holds(job.id):
            raise ValueError(f"job {job.id} already holds devices {self.devices_of(job.id)}")
        row = self._row_for(job.id)
        devices = [self.table.index[ref] for ref in verdict.devices]
        demand = family.resources[verdict.config_index]
        if not force and not self.table.fits_on(devices, demand):
            raise ValueError(f"job {job.id} no longer fits on {verdict.node}")
        self.placer.commit(
            row,
            verdict.config_index,
            devices,
            demand,
            family.features[verdict.config_index],
            verdict.tolerance,
        )
        self._demand[row] = demand
        self._assumed.add(job.id)

    def forget(self, job_id: str) -> bool:
        """Release a job's devices (bind failed, pod deleted, assumption expired)."""
        row = self._rows.get(job_id)
        if row is None or row not in self.placer.devices_of:
            return False
        demand = self._demand.pop(row, None)
        self.placer.release(row, self._plan_demand[row] if demand is None else demand)
        self._assumed.discard(job_id)
        return True

    # -- the question ---------------------------------------------------------
    def _validity(self, job: Job, family: ProfileFamily) -> tuple[np.ndarray, str | None]:
        """Valid configuration rows of ``job`` (the epoch's own rules), cached per job shape."""
        key = (
            job.family,
            id(family),
            job.allowed,
            job.mode,
            job.min_throughput,
            job.gpus,
            job.current_config,
        )
        hit = self._valid_cache.get(key)
        if hit is None:
            rates = {job.family: self._rates[job.family]} if job.family in self._rates else {}
            probe = Snapshot(self._caps_node, (job,), {job.family: family}, solo_rates=rates)
            tables = build_tables(probe, self.settings, whole_cluster=False)
            hit = (tables.valid[0, : family.size].copy(), tables.reasons.get(0))
            if len(self._valid_cache) > 1024:
                self._valid_cache.clear()
            self._valid_cache[key] = hit
        return hit

    def scores(self, job: Job, family: ProfileFamily) -> tuple[np.ndarray, str | None]:
        """ESP score of every configuration at current prices (+inf where invalid),
        and the reason when no configuration is valid at all."""
        valid, reason = self._validity(job, family)
        throughput = self.throughput_of(job.family, family)
        best = throughput[valid].max() if valid.any() else 1.0
        rent = (family.resources * (job.gpus / self.units)) @ self.prices
        score = job.weight * (1.0 - throughput / best) + rent
        return np.where(valid, score, np.inf), reason

    def throughput_of(self, name: str, family: ProfileFamily) -> np.ndarray:
        """``family``'s T(c) with the snapshot's measured solo rates (observed throughput);
        one array per family name and view (a view lives one epoch)."""
        if name not in self._rates:
            return family.throughput
        cached = self._throughput.get(name)
        if cached is None or cached[0] is not family:  # a family replaced since
            cached = (family, corrected(family.throughput, self._rates[name]))
            self._throughput[name] = cached
        return cached[1]

    def indices(self, node_names: Iterable[str]) -> np.ndarray:
        """Node index of each name (-1 for a name the view does not know)."""
        names = node_names if isinstance(node_names, list) else list(node_names)
        return np.fromiter(map(self.node_index.get, names, repeat(-1)), np.intp, len(names))

    def evaluate(
        self, job: Job, family: ProfileFamily, node_names: Iterable[str] | None = None
    ) -> dict[str, NodeVerdict]:
        """A verdict for every requested node (all nodes when ``node_names`` is None).

        The record form of :meth:`answer`.  Unknown node names get an infeasible
        verdict saying so (never an exception).
        """
        names = list(self.node_index) if node_names is None else list(node_names)
        at = self.indices(names).tolist()
        answers = self.answer(job, family, [n for n, i in zip(names, at, strict=True) if i >= 0])
        return {name: answers.verdict(i, name) for name, i in zip(names, at, strict=True)}

    def answer(
        self, job: Job, family: ProfileFamily, node_names: Iterable[str] | None = None
    ) -> Answers:
        """Where and how ``job`` can run, for the requested nodes (all when None).

        Names the view does not know are ignored (:meth:`indices` marks them -1;
        :meth:`Answers.reason` explains them).
        """
        if node_names is None:
            return self.answer_at(job, family, np.arange(len(self.nodes)))
        return self.answer_at(job, family, self.indices(node_names))

    def answer_at(self, job: Job, family: ProfileFamily, at: np.ndarray) -> Answers:
        """:meth:`answer` for the nodes at indices ``at`` (-1 entries are skipped).

        Vectorised over devices and nodes: per configuration tried (best score
        first) one capacity mask, one batched interference screen, and a
        per-node best fit by sorting.
        """
        node_count = len(self.nodes)
        asked = np.zeros(node_count, dtype=bool)
        asked[at[at >= 0]] = True
        gpus = job.gpus
        config_of = np.full(node_count, -1, dtype=np.intp)
        chosen_devices = np.full((node_count, gpus), -1, dtype=np.intp)
        chosen_slow = np.ones(node_count)
        chosen_tol = np.full(node_count, np.inf)
        scores, invalid_reason = self.scores(job, family)

        def answers(reason_of: np.ndarray, reasons: tuple[str, ...]) -> Answers:
            feasible = config_of >= 0
            config = np.maximum(config_of, 0)
            return Answers(
                self.names,
                self.table.refs,
                asked,
                feasible,
                config_of,
                chosen_devices,
                chosen_slow,
                chosen_tol,
                np.where(feasible, scores[config], np.inf),
                np.where(feasible, family.resources[config, GPU_MEM], 0.0),
                reason_of,
                reasons,
            )

        if invalid_reason is not None or not np.isfinite(scores).any():
            reason = invalid_reason or "no valid configuration"
            return answers(np.where(asked, 0, -1), (reason,))
        table = self.table
        open_node = asked.copy()
        worst_seen = np.full(node_count, np.nan)
        options = np.flatnonzero(np.isfinite(scores))
        options = options[np.argsort(scores[options], kind="stable")][:MAX_OPTIONS]
        screen = self.placer.predictor is not None
        for config in options.tolist():
            if not open_node.any():
                break
            demand = family.resources[config]
            mask = table.fits(demand) & open_node[table.node_of]
            if not mask.any():
                continue
            tolerance = self._tolerance(job, family, config)
            slowdown = None
            if screen:
                mask, slowdown, (bad_devs, bad_slow) = self._screen(
                    mask, family.features[config], tolerance, gpus
                )
                if bad_devs.size:
                    np.fmax.at(worst_seen, table.node_of[bad_devs], bad_slow)
            nodes, picks = self._per_node(mask, gpus)
            if nodes.size == 0:
                continue
            config_of[nodes] = config
            chosen_tol[nodes] = tolerance
            if slowdown is not None:
                chosen_slow[nodes] = slowdown[picks].max(axis=1)
            chosen_devices[nodes] = picks
            open_node[nodes] = False
        reason_of, reasons = self._why_not(open_node, family, scores, gpus, worst_seen)
        return answers(reason_of, reasons)

    # -- helpers ----------------------------------------------------------------
    def _tolerance(self, job: Job, family: ProfileFamily, config: int) -> float:
        throughput = np.array([self.throughput_of(job.family, family)[config]])
        floor = np.array([job.min_throughput])
        return float(planner_tolerance(throughput, floor, self.utilization, self.settings)[0])

    def _screen(
        self, mask: np.ndarray, features: np.ndarray, tolerance: float, gpus: int
    ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Keep empty devices and occupied ones whose pairs stay within tolerance.

        A node with ``gpus`` idle candidates is placed on them (``_per_node`` takes
        idle devices first), so its occupied ones need no prediction.  Per other
        node only its ``SCREENED_PER_NODE`` tightest occupied candidates are
        predicted (and at most ``MAX_SCREENED_DEVICES`` in all), so a busy
        cluster costs one bounded batched predictor call.
        """
        table = self.table
        idx = np.flatnonzero(mask)
        occupied = table.count[idx] > 0
        idle = idx[~occupied]
        busy = idx[occupied]
        screened = np.zeros_like(mask)
        screened[idle] = True
        idle_on = np.bincount(table.node_of[idle], minlength=len(self.nodes))
        busy = busy[idle_on[table.node_of[busy]] < gpus]
        slowdown = np.ones(table.size)
        rejected = (np.zeros(0, dtype=np.intp), np.zeros(0))
        if busy.size:
            order = np.lexsort((table.mem_free[busy], table.node_of[busy]))
            busy = busy[order]
            node = table.node_of[busy]
            first = np.concatenate(([True], node[1:] != node[:-1]))
            rank = np.arange(busy.size) - np.maximum.accumulate(
                np.where(first, np.arange(busy.size), 0)
            )
            busy = busy[rank < SCREENED_PER_NODE][:MAX_SCREENED_DEVICES]
            safe, worst = self.placer.predict_against(busy, features, tolerance, gpus)
            screened[busy[safe]] = True
            slowdown[busy] = worst
            rejected = (busy[~safe], worst[~safe])
        return screened, slowdown, rejected

    def _per_node(self, mask: np.ndarray, gpus: int) -> tuple[np.ndarray, np.ndarray]:
        """Nodes with >= ``gpus`` usable devices, and (nodes, gpus) of their tightest fits."""
        table = self.table
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return np.zeros(0, dtype=np.intp), np.zeros((0, gpus), dtype=np.intp)
        # Per node: idle GPUs first (share only when none is idle), then the tightest fit.
        idx = idx[np.lexsort((table.mem_free[idx], table.count[idx] > 0, table.node_of[idx]))]
        nodes = table.node_of[idx]
        starts = np.flatnonzero(np.concatenate(([True], nodes[1:] != nodes[:-1])))
        counts = np.diff(starts, append=idx.size)
        ok = counts >= gpus
        starts = starts[ok]
        picks = idx[starts[:, None] + np.arange(gpus)[None, :]]
        return nodes[starts], picks

    def _why_not(
        self,
        open_node: np.ndarray,
        family: ProfileFamily,
        scores: np.ndarray,
        gpus: int,
        worst_seen: np.ndarray,
    ) -> tuple[np.ndarray, tuple[str, ...]]:
        """One reason per node left open, for all of them at once: (reason_of, reasons).

        Nodes that share a reason share its text (formatted once per distinct value)."""
        reason_of = np.full(open_node.size, -1, dtype=np.intp)
        rest = np.flatnonzero(open_node)
        if rest.size == 0:
            return reason_of, ()
        table = self.table
        valid = np.isfinite(scores)
        need_mem = float(family.resources[valid, GPU_MEM].min())
        need_sm = float(family.resources[valid, GPU_SM].min())
        count = len(self.nodes)
        free_mem = np.full(count, -np.inf)
        free_sm = np.full(count, -np.inf)
        np.maximum.at(free_mem, table.node_of, table.mem_free)
        np.maximum.at(free_sm, table.node_of, table.sm_free)
        devices = np.bincount(table.node_of, minlength=count)
        texts: list[str] = []

        def explain(hit: np.ndarray, values: np.ndarray, text: Callable[[float], str]) -> None:
            """Give the nodes ``rest[hit]`` their reason; they leave ``rest``."""
            nonlocal rest
            nodes = rest[hit]
            rest = rest[~hit]
            if nodes.size == 0:
                return
            distinct, inverse = np.unique(values[nodes], return_inverse=True)
            reason_of[nodes] = len(texts) + inverse.reshape(-1)
            texts.extend(text(v) for v in distinct.tolist())

        explain(devices[rest] < gpus, devices, lambda v: f"node has {v} GPU(s), job needs {gpus}")
        banded = self.placer.banded
        band = " less the closed loop's admission band for new pairs" if banded else ""
        explain(
            ~np.isnan(worst_seen[rest]),
            worst_seen,
            lambda v: (
                f"predicted co-location slowdown {v:.2f}x exceeds "
                f"the tolerance of this job or of a GPU's current tenant{band}"
            ),
        )
        explain(
            need_mem > free_mem[rest] + 1e-9,
            free_mem,
            lambda v: (
                f"insufficient GPU memory: smallest configuration needs "
                f"{need_mem:.0f} MiB, most free on one GPU here is {max(v, 0.0):.0f} MiB"
            ),
        )
        explain(
            need_sm > free_sm[rest] + 1e-9,
            free_sm,
            lambda v: (
                f"insufficient GPU compute: needs SM share {need_sm:.2f}, "
                f"most free {max(v, 0.0):.2f}"
            ),
        )
        explain(
            np.ones(rest.size, dtype=bool),
            np.zeros(count),
            lambda v: (
                "insufficient host CPU or memory on the node, or too few GPUs "
                "free together, for any allowed configuration"
            ),
        )
        return reason_of, tuple(texts)


def prices_of(plan: Plan) -> np.ndarray:
    """The plan's shadow prices as a float vector (zeros before the first epoch)."""
    prices = np.asarray(plan.prices, dtype=np.float64)
    return prices if prices.shape == (NUM_RESOURCES,) else np.zeros(NUM_RESOURCES)


def verdicts_feasible(verdicts: dict[str, NodeVerdict]) -> Sequence[str]:
    """Names of the feasible nodes, in the order given."""
    return [name for name, v in verdicts.items() if v.feasible]
