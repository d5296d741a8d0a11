"""PDS coordinated reconfiguration: co-tenants step down so a queued job can start.

Prices are a relaxation: when the jobs' configurations are lumpy, no price
vector may support a selection that packs (a duality gap), and a job stays
queued although co-tenants could step down to a slightly slower configuration
to make room (spec 5.3, Cases 1 and 2).  For each queued single-GPU job
(priority order, at most ``SQUEEZE_LIMIT``), the squeeze tries its best few
configurations on the devices with the smallest memory deficit, shrinks each
co-tenant to its cheapest configuration that frees enough, and accepts only if
the primal objective improves:

    gain  = wait_j - Score_j(c; 0)                    (value of starting j)
    loss  = sum_o Score_o(c'_o; 0) - Score_o(c_o; 0)  (co-tenants' loss)
    accept when gain > loss and the interference check passes.

A long queue asks the same questions many times (jobs of one family, devices
in the same state), so answers are remembered within one squeeze: shrink
plans per device state, bounds per co-tenant, and whole failed searches until
the next success changes the devices.  Each attempt that passes the price test
still costs an interference screen after the shrink; at most ``SQUEEZE_TRIES``
of them per squeeze bound the epoch's cost when the screen keeps refusing (a
corrected predictor that learned a family pair is harmful refuses every device
that holds it), and the highest-priority queued jobs get them first.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.planner.context import EpochRows
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.pricing.scoring import PricingProblem
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, NUM_RESOURCES

__all__ = ["SQUEEZE_DEVICES", "SQUEEZE_LIMIT", "SQUEEZE_OPTIONS", "SQUEEZE_TRIES", "Squeeze"]

SQUEEZE_LIMIT = 64
"""Queued jobs per packing pass that may ask co-tenants to shrink (bounds epoch cost)."""
SQUEEZE_OPTIONS = 8
"""Best configurations of a queued job tried when squeezing."""
SQUEEZE_DEVICES = 8
"""Devices with the smallest memory deficit tried per configuration."""
SQUEEZE_TRIES = 48
"""Shrink-and-screen attempts per squeeze, over all queued jobs (bounds epoch cost)."""

ShrinkPlan = tuple[list[tuple[int, int]], float]
"""(co-tenant row, new configuration) changes and their total loss."""


class Squeeze:
    """One squeeze over the queue, at the primal scores of one packing pass."""

    def __init__(
        self, epoch: EpochRows, placer: Placer, problem: PricingProblem, penalty: np.ndarray
    ) -> None:
        self.epoch = epoch
        self.t = epoch.t
        self.placer = placer
        self.table: DeviceTable = placer.table
        self.problem = problem
        self.primal = problem.scores(np.zeros(NUM_RESOURCES), penalty)
        self._plans: dict[tuple[object, ...], ShrinkPlan | None] = {}
        self._most: dict[tuple[int, int], tuple[float, float]] = {}
        self.tries_left = SQUEEZE_TRIES

    def run(self, queued: list[int]) -> list[int]:
        """Try the queue in priority order; return the rows still queued."""
        t, problem, placer = self.t, self.problem, self.placer
        still: list[int] = []
        order = t.in_queue_order(queued)
        tried = 0
        # Queued jobs that ask exactly what an earlier one asked since the last success fail
        # the same way (a failed attempt undoes its changes): skip the search for them.
        failed: set[tuple[object, ...]] = set()
        self.epoch.tolerance_rows(np.array(order[: SQUEEZE_LIMIT + len(t.reasons)], np.intp))
        for row in order:
            if t.gpus[row] != 1 or not np.isfinite(problem.wait_score[row]) or row in t.reasons:
                still.append(row)
                continue
            if tried >= SQUEEZE_LIMIT or self.tries_left <= 0:
                still.append(row)
                continue
            tried += 1
            question = None
            if row not in placer.forbidden_rows:
                tau = self.epoch.tolerance_rows(np.array([row]))[0]
                question = (
                    int(t.family_index[row]),
                    float(problem.wait_score[row]),
                    self.primal[row].tobytes(),
                    tau.tobytes(),
                )
                if question in failed:
                    still.append(row)
                    continue
            if self._admit(row):
                failed.clear()
            else:
                still.append(row)
                if question is not None:
                    failed.add(question)
        return still

    def _admit(self, row: int) -> bool:
        """Start ``row`` by shrinking the co-tenants of one device, if it pays."""
        t, table, placer, primal = self.t, self.table, self.placer, self.primal
        wait = self.problem.wait_score[row]
        options = np.flatnonzero(primal[row] < wait)
        options = options[np.argsort(primal[row][options], kind="stable")][:SQUEEZE_OPTIONS]
        for config in options.tolist():
            need = t.per_gpu[row, config]
            gain = wait - primal[row, config]
            deficit = need[GPU_MEM] - table.mem_free
            candidates = np.flatnonzero((deficit > 0) & (table.memory_capacity >= need[GPU_MEM]))
            candidates = candidates[np.argsort(deficit[candidates], kind="stable")][
                :SQUEEZE_DEVICES
            ]
            for d in candidates.tolist():
                if placer.kept_apart(row, d):  # no shrink makes room for a held-apart pair
                    continue
                # Queued jobs of one family ask the same question of the same device state:
                # a plan depends only on that state, the need and this squeeze's primal scores.
                occupants = tuple((o, int(placer.config[o])) for o in table.occupants[d])
                free = (table.mem_free[d], table.sm_free[d])
                key = (d, *need[[GPU_MEM, GPU_SM]].tolist(), *free, occupants)
                if key not in self._plans:
                    self._plans[key] = self._shrink_plan(d, need)
                plan = self._plans[key]
                if plan is None:
                    continue
                changes, loss = plan
                if loss >= gain or not self._node_fits_after(d, need, changes):
                    continue
                if self.tries_left <= 0:
                    return False
                self.tries_left -= 1
                undo = [(o, int(placer.config[o])) for o, _ in changes]
                for o, new in changes:
                    self.epoch.reconfigure(placer, o, new)
                only = np.zeros(table.size, dtype=bool)
                only[d] = True
                if self.epoch.try_row(placer, row, [config], only):
                    return True
                for o, old in undo:
                    self.epoch.reconfigure(placer, o, old)
        return False

    def _shrink_plan(self, device: int, need: np.ndarray) -> ShrinkPlan | None:
        """Cheapest single-GPU co-tenant reconfigurations that free ``need`` on ``device``."""
        t, table, placer, primal = self.t, self.table, self.placer, self.primal
        mem_short = need[GPU_MEM] - table.mem_free[device]
        sm_short = need[GPU_SM] - table.sm_free[device]
        occupants = sorted(table.occupants[device])
        # Cheap bound first: what every co-tenant could free at most (most searches end here).
        free_mem = free_sm = 0.0
        for o in occupants:
            if t.gpus[o] == 1:
                most_mem, most_sm = self._most_freed(o, int(placer.config[o]))
                free_mem += most_mem
                free_sm += most_sm
        if mem_short - free_mem > 1e-9 or sm_short - free_sm > 1e-9:
            return None
        changes: list[tuple[int, int]] = []
        loss = 0.0
        for o in occupants:
            if mem_short <= 1e-9 and sm_short <= 1e-9:
                break
            if t.gpus[o] != 1:
                continue
            cur = int(placer.config[o])
            res = t.per_gpu[o]
            freed_mem = res[cur, GPU_MEM] - res[:, GPU_MEM]
            freed_sm = res[cur, GPU_SM] - res[:, GPU_SM]
            ok = (
                t.valid[o]
                & np.isfinite(primal[o])
                & (freed_mem >= min(mem_short, res[cur, GPU_MEM]))
                & (freed_sm >= min(sm_short, 0.0))
            )
            if not ok.any():
                continue
            cost = np.where(ok, primal[o] - primal[o, cur], np.inf)
            best = int(np.argmin(cost))
            changes.append((o, best))
            loss += float(cost[best])
            mem_short -= freed_mem[best]
            sm_short -= freed_sm[best]
        if mem_short > 1e-9 or sm_short > 1e-9:
            return None
        return changes, loss

    def _most_freed(self, row: int, config: int) -> tuple[float, float]:
        """(memory, SM) a co-tenant at ``config`` frees at most by switching configuration."""
        key = (row, config)
        most = self._most.get(key)
        if most is None:
            res = self.t.per_gpu[row]
            ok = self.t.valid[row] & np.isfinite(self.primal[row])
            most = (0.0, 0.0)
            if ok.any():
                most = (
                    float(res[config, GPU_MEM] - res[ok, GPU_MEM].min()),
                    float(res[config, GPU_SM] - res[ok, GPU_SM].min()),
                )
            self._most[key] = most
        return most

    def _node_fits_after(
        self, device: int, need: np.ndarray, changes: list[tuple[int, int]]
    ) -> bool:
        """Whether the device's node has CPU and host RAM for ``need`` once ``changes`` apply.

        A shrink plan frees GPU memory and SM; when the node's CPU or RAM is what is
        short, applying it (and undoing it) would be wasted work.
        """
        table = self.table
        node = table.node_of[device]
        cpu, ram = table.cpu_free[node], table.ram_free[node]
        for o, new in changes:
            res = self.t.per_gpu[o]
            cur = int(self.placer.config[o])
            cpu += res[cur, CPU] - res[new, CPU]
            ram += res[cur, HOST_MEM] - res[new, HOST_MEM]
        return bool(cpu >= need[CPU] - 1e-9 and ram >= need[HOST_MEM] - 1e-9)
