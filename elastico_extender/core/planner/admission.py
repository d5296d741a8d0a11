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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.interference.tolerance import adaptive_tolerance
from elastico_extender.core.model import Assignment, DeviceRef, Job, Plan, ProfileFamily, Snapshot
from elastico_extender.core.planner.devices import DeviceTable, gpu_equivalent
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.planner.tables import build_tables
from elastico_extender.core.resources import GPU_MEM, GPU_SM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings

__all__ = ["MAX_SCREENED_DEVICES", "NodeVerdict", "PlacementView"]

MAX_SCREENED_DEVICES = 256
"""Occupied devices whose interference is predicted per configuration tried (tightest
fit first); bounds filter latency on a busy cluster.  Devices beyond it are skipped
for that configuration, never admitted unchecked."""
MAX_OPTIONS = 16
"""Configurations tried per call, best score first."""


@dataclass(frozen=True, slots=True)
class NodeVerdict:
    """Whether ``node`` can take the job now, and how."""

    node: str
    feasible: bool
    config_index: int = -1
    devices: tuple[DeviceRef, ...] = ()
    predicted_slowdown: float = 1.0
    tolerance: float = math.inf
    score: float = math.inf  # ESP score of the chosen configuration (lower is better)
    memory_budget_mib: float = 0.0
    reason: str = ""


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
        self.node_index = {node.name: i for i, node in enumerate(snapshot.nodes)}
        self._rows: dict[str, int] = {}
        self._next_row = 0
        self._demand: dict[int, np.ndarray] = {}
        self._assumed: set[str] = set()
        utilization = max(
            plan.stats.get("sm_allocated", 0.0), plan.stats.get("memory_allocated", 0.0)
        )
        self.utilization = float(utilization)
        jobs = {job.id: job for job in snapshot.jobs}
        for assignment in plan.assignments.values():
            job = jobs.get(assignment.job_id)
            if job is None or any(ref not in self.table.index for ref in assignment.devices):
                continue
            self._commit_assignment(job, snapshot.families[job.family], assignment)

    # -- bookkeeping ----------------------------------------------------------
    def _row_for(self, job_id: str) -> int:
        row = self._rows.get(job_id)
        if row is None:
            row = self._next_row
            self._next_row += 1
            self._rows[job_id] = row
        return row

    def _commit_assignment(self, job: Job, family: ProfileFamily, assignment: Assignment) -> None:
        row = self._row_for(job.id)
        config = assignment.config_index
        devices = [self.table.index[ref] for ref in assignment.devices]
        demand = family.resources[config]
        self.placer.commit(
            row, config, devices, demand, family.features[config], assignment.tolerance
        )
        self._demand[row] = demand

    @property
    def assumed(self) -> frozenset[str]:
        """Jobs placed by :meth:`assume` and not yet forgotten."""
        return frozenset(self._assumed)

    def holds(self, job_id: str) -> bool:
        """Whether the job occupies devices in this view (from the plan or assumed)."""
        row = self._rows.get(job_id)
        return row is not None and row in self.placer.occupants

    def devices_of(self, job_id: str) -> tuple[DeviceRef, ...]:
        row = self._rows.get(job_id)
        if row is None or row not in self.placer.devices_of:
            return ()
        return tuple(self.table.refs[d] for d in self.placer.devices_of[row])

    def assume(self, job: Job, family: ProfileFamily, verdict: NodeVerdict) -> None:
        """Count a bind in flight against capacity. Raises ValueError if it no longer fits."""
        if not verdict.feasible:
            raise ValueError(f"cannot assume an infeasible placement on {verdict.node}")
        if self.holds(job.id):
            raise ValueError(f"job {job.id} already holds devices {self.devices_of(job.id)}")
        row = self._row_for(job.id)
        devices = [self.table.index[ref] for ref in verdict.devices]
        demand = family.resources[verdict.config_index]
        if not self.table.fits_on(devices, demand):
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
        if row is None or row not in self.placer.occupants:
            return False
        self.placer.release(row, self._demand.pop(row))
        self._assumed.discard(job_id)
        return True

    # -- the question ---------------------------------------------------------
    def scores(self, job: Job, family: ProfileFamily) -> tuple[np.ndarray, str | None]:
        """ESP score of every configuration at current prices (+inf where invalid),
        and the reason when no configuration is valid at all."""
        snapshot = Snapshot(self.nodes, (job,), {job.family: family})
        tables = build_tables(snapshot, self.settings)
        valid = tables.valid[0, : family.size]
        throughput = family.throughput
        best = throughput[valid].max() if valid.any() else 1.0
        rent = (family.resources * job.gpus / self.units) @ self.prices
        score = job.weight * (1.0 - throughput / best) + rent
        return np.where(valid, score, np.inf), tables.reasons.get(0)

    def evaluate(
        self, job: Job, family: ProfileFamily, node_names: Iterable[str] | None = None
    ) -> dict[str, NodeVerdict]:
        """A verdict for every requested node (all nodes when ``node_names`` is None).

        Unknown node names get an infeasible verdict saying so (never an exception).
        """
        names = list(self.node_index) if node_names is None else list(node_names)
        verdicts: dict[str, NodeVerdict] = {}
        known = [n for n in names if n in self.node_index]
        for name in names:
            if name not in self.node_index:
                verdicts[name] = NodeVerdict(
                    name,
                    False,
                    reason="node has no GPU inventory known to ElastiCo (not in its cluster view)",
                )
        scores, invalid_reason = self.scores(job, family)
        if invalid_reason is not None or not np.isfinite(scores).any():
            reason = invalid_reason or "no valid configuration"
            for name in known:
                verdicts[name] = NodeVerdict(name, False, reason=reason)
            return verdicts
        row = self._row_for(job.id) if not self.holds(job.id) else None
        table = self.table
        wanted_nodes = np.array([self.node_index[n] for n in known], dtype=np.intp)
        open_node = np.zeros(len(self.nodes), dtype=bool)
        open_node[wanted_nodes] = True
        options = np.flatnonzero(np.isfinite(scores))
        options = options[np.argsort(scores[options], kind="stable")][:MAX_OPTIONS]
        worst_seen = np.full(len(self.nodes), np.nan)
        gpus = job.gpus
        for config in options.tolist():
            if not open_node.any():
                break
            demand = family.resources[config]
            mask = table.fits(demand) & open_node[table.node_of]
            if not mask.any():
                continue
            tolerance = float(self._tolerance(job, family, config))
            slowdown = np.ones(table.size)
            if self.placer.predictor is not None and row is not None:
                mask, slowdown, rejected = self._screen(mask, family.features[config], tolerance)
                np.fmax.at(worst_seen, table.node_of[rejected[0]], rejected[1])
            for node, devices in self._per_node(mask, gpus):
                name = self.nodes[node].name
                refs = tuple(table.refs[d] for d in devices)
                verdicts[name] = NodeVerdict(
                    name,
                    True,
                    config_index=config,
                    devices=refs,
                    predicted_slowdown=float(slowdown[devices].max()),
                    tolerance=tolerance,
                    score=float(scores[config]),
                    memory_budget_mib=float(demand[GPU_MEM]),
                )
                open_node[node] = False
        for node in np.flatnonzero(open_node).tolist():
            name = self.nodes[node].name
            verdicts[name] = NodeVerdict(
                name,
                False,
                reason=self._why_not(node, family, scores, gpus, float(worst_seen[node])),
            )
        if row is not None and not self.holds(job.id):
            self._rows.pop(job.id, None)  # evaluation only; keep row ids compact
        return {name: verdicts[name] for name in names}

    # -- helpers ----------------------------------------------------------------
    def _tolerance(self, job: Job, family: ProfileFamily, config: int) -> float:
        s = self.settings
        return float(
            adaptive_tolerance(
                np.array([family.throughput[config]]),
                np.array([job.min_throughput]),
                self.utilization,
                tau_default=s.tau_default,
                beta=s.beta,
                beta_max=s.beta_max,
                utilization_target=s.utilization_target,
            )[0]
        )

    def _screen(
        self, mask: np.ndarray, features: np.ndarray, tolerance: float
    ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
        """Keep empty devices and occupied ones whose pairs stay within tolerance."""
        table = self.table
        idx = np.flatnonzero(mask)
        occupied = table.count[idx] > 0
        busy = idx[occupied]
        busy = busy[np.argsort(table.mem_free[busy], kind="stable")][:MAX_SCREENED_DEVICES]
        screened = np.zeros_like(mask)
        screened[idx[~occupied]] = True
        slowdown = np.ones(table.size)
        rejected = (np.zeros(0, dtype=np.intp), np.zeros(0))
        if busy.size:
            safe, worst = self.placer.predict_against(busy, features, tolerance)
            screened[busy[safe]] = True
            slowdown[busy] = worst
            rejected = (busy[~safe], worst[~safe])
        return screened, slowdown, rejected

    def _per_node(self, mask: np.ndarray, gpus: int) -> list[tuple[int, list[int]]]:
        """For each node with >= ``gpus`` usable devices, its tightest-fitting ones."""
        table = self.table
        idx = np.flatnonzero(mask)
        if idx.size == 0:
            return []
        order = np.lexsort((table.mem_free[idx], table.node_of[idx]))
        idx = idx[order]
        nodes = table.node_of[idx]
        starts = np.flatnonzero(np.r_[True, nodes[1:] != nodes[:-1]])
        counts = np.diff(np.r_[starts, idx.size])
        return [
            (int(nodes[s]), idx[s : s + gpus].tolist())
            for s, c in zip(starts.tolist(), counts.tolist(), strict=True)
            if c >= gpus
        ]

    def _why_not(
        self, node: int, family: ProfileFamily, scores: np.ndarray, gpus: int, worst: float
    ) -> str:
        table = self.table
        devices = np.flatnonzero(table.node_of == node)
        if devices.size < gpus:
            return f"node has {devices.size} GPU(s), job needs {gpus}"
        valid = np.isfinite(scores)
        need_mem = float(family.resources[valid, GPU_MEM].min())
        need_sm = float(family.resources[valid, GPU_SM].min())
        free_mem = float(table.mem_free[devices].max())
        free_sm = float(table.sm_free[devices].max())
        if not math.isnan(worst):
            return (
                f"predicted co-location slowdown {worst:.2f}x exceeds the tolerance "
                f"of this job or of a GPU's current tenant"
            )
        if need_mem > free_mem + 1e-9:
            return (
                f"insufficient GPU memory: smallest configuration needs {need_mem:.0f} MiB, "
                f"most free on one GPU here is {free_mem:.0f} MiB"
            )
        if need_sm > free_sm + 1e-9:
            return (
                f"insufficient GPU compute: needs SM share {need_sm:.2f}, most free {free_sm:.2f}"
            )
        return "insufficient host CPU or memory on the node for any allowed configuration"


def prices_of(plan: Plan) -> np.ndarray:
    """The plan's shadow prices as a float vector (zeros before the first epoch)."""
    prices = np.asarray(plan.prices, dtype=np.float64)
    return prices if prices.shape == (NUM_RESOURCES,) else np.zeros(NUM_RESOURCES)


def verdicts_feasible(verdicts: dict[str, NodeVerdict]) -> Sequence[str]:
    """Names of the feasible nodes, in the order given."""
    return [name for name, v in verdicts.items() if v.feasible]
