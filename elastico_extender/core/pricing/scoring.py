"""ESP scoring (spec 3.2, Eq. esp_score), vectorised over all jobs x configurations.

    Score_j(c; lambda) = w_j * (1 - T_j(c) / T_j(c_max))      performance cost
                       + sum_r lambda_r * D_j(c)[r]             resource rent
                       + gamma0 * 1[c != c_cur]                 switching cost
                       + Gamma_j(c)                             interference penalty

D_j(c) is the job's whole demand (per-GPU vector times its GPU count) in
*GPU-equivalents*: each resource divided by what one average GPU slot of the
cluster offers (1 SM share, mean device memory, CPU and RAM per GPU), so one
price unit means the same scarcity for every resource and any cluster size.

Pending jobs may also *wait*, worth w_j (their performance cost with no
throughput); a pending job starts only if some configuration scores below
that, i.e. when its normalised value exceeds its rent.  Running jobs cannot
choose to wait.  Invalid rows (padding, disallowed by the user, below the
floor L_j) score +inf.

Everything is held as padded (N, K) arrays so one selection is a handful of
numpy operations, never a per-job Python loop.  Demand is kept *factored*:
jobs of one workload family share their per-GPU demand table, so it is stored
once per family, (R, F, K), with each job's family row and GPU count; the rent
of every configuration is then one (F, K) product per price vector, gathered
to (N, K), instead of an (R, N, K) tensor rebuilt every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from elastico_extender.core.resources import NUM_RESOURCES

__all__ = ["PricingProblem", "Selection", "select"]


@dataclass(frozen=True, eq=False)
class PricingProblem:
    """The padded arrays one epoch prices over.

    demand     (R, F, K)  per-GPU demand of family f's configuration c, in GPU-equivalents
    family     (N,)       each job's row of ``demand``; None means F == N, row j is job j
    gpus       (N,)       each job's GPU count: D_j(c) = gpus_j * demand[:, family_j, c];
                          None means one GPU each
    base       (N, K)     performance cost + switching cost; +inf where invalid
    wait_score (N,)       score of waiting (w_j for pending, +inf for running jobs)
    capacity   (R,)       physical capacity C in GPU-equivalents
    reserve    (R, N)     gamma * R_min of each pending job, counted while it waits:
                          C_eff = C - gamma * sum_{j in Q} R_j^min (spec Eq. effective_capacity)
    priority   (N,)       row order in which pending jobs are rationed (highest first);
                          None means row order
    """

    demand: np.ndarray
    base: np.ndarray
    wait_score: np.ndarray
    capacity: np.ndarray
    reserve: np.ndarray
    priority: np.ndarray | None = None
    family: np.ndarray | None = None
    gpus: np.ndarray | None = None

    @property
    def num_jobs(self) -> int:
        return int(self.base.shape[0])

    def scores(
        self,
        prices: np.ndarray,
        penalty: np.ndarray | None = None,
        rows: np.ndarray | None = None,
    ) -> np.ndarray:
        """(N, K) Score_j(c; lambda) including the interference penalty Gamma.

        With ``rows``, only those jobs' rows, in that order.  The result may be
        ``base`` itself (no prices, no penalty): callers must not write to it.
        """
        every = slice(None) if rows is None else rows
        if np.any(prices != 0.0):
            rent = np.tensordot(prices, self.demand, axes=1)  # (F, K): one row per family
            if self.family is not None:
                rent = rent[self.family[every]]
            elif rows is not None:
                rent = rent[rows]
            if self.gpus is not None:
                rent *= self.gpus[every, None]
            total = rent
            total += self.base[every]
        elif penalty is None and rows is None:
            return self.base  # no rent, no penalty: the base scores themselves (read-only use)
        else:
            total = self.base[every].copy()
        if penalty is not None:
            total += penalty[every]
        return total

    def chosen_demand(self, choice: np.ndarray) -> np.ndarray:
        """(R, N) D_j(c_j) of each job at configuration ``choice[j]``."""
        rows = np.arange(choice.size) if self.family is None else self.family
        chosen = self.demand[:, rows, choice]
        if self.gpus is not None:
            chosen = chosen * self.gpus[None, :]
        return chosen


@dataclass(frozen=True, eq=False)
class Selection:
    """The jobs' choices at one price vector.

    ``wants`` marks jobs whose best configuration beats waiting (running jobs
    always); ``running`` those that get to run after *rationing*: pending jobs
    that want to run are admitted in priority order while the aggregate
    capacity holds, so ``usage`` never exceeds C through pending jobs.
    ``desired`` is the unrationed demand, which drives the price update.
    """

    choice: np.ndarray  # (N,) argmin configuration row
    running: np.ndarray  # (N,) bool: runs (running jobs, and pending jobs admitted by rationing)
    wants: np.ndarray  # (N,) bool: prefers running to waiting at these prices
    usage: np.ndarray  # (R,) aggregate demand of the jobs that run
    desired: np.ndarray  # (R,) aggregate demand of every job that wants to run
    reserved: np.ndarray  # (R,) gamma * R_min of the pending jobs that choose to wait


def select(
    problem: PricingProblem, prices: np.ndarray, penalty: np.ndarray | None = None
) -> Selection:
    """Every job's argmin configuration at ``prices``, rationed to the aggregate capacity."""
    scores = problem.scores(prices, penalty)
    n = problem.num_jobs
    if n == 0:
        empty = np.zeros(NUM_RESOURCES)
        none = np.zeros(0, dtype=bool)
        return Selection(np.zeros(0, dtype=np.intp), none, none, empty, empty, empty)
    choice = np.argmin(scores, axis=1)
    rows = np.arange(n)
    best = scores[rows, choice]
    wants = np.isfinite(best) & (best < problem.wait_score)
    chosen = problem.chosen_demand(choice)  # (R, N)
    chosen[:, ~wants] = 0.0
    incumbent = ~np.isfinite(problem.wait_score)  # running jobs: never wait
    base_usage = chosen[:, incumbent].sum(axis=1)
    desired = chosen.sum(axis=1)
    running = wants.copy()
    pending = wants & ~incumbent
    if pending.any() and np.any(desired > problem.capacity + 1e-9):
        order = problem.priority if problem.priority is not None else rows
        queue = order[pending[order]]
        cumulative = np.cumsum(chosen[:, queue], axis=1) + base_usage[:, None]
        fits = np.logical_and.accumulate(
            np.all(cumulative <= problem.capacity[:, None] + 1e-9, axis=0)
        )
        running[queue[~fits]] = False
    usage = chosen[:, running].sum(axis=1)
    reserved = problem.reserve[:, ~wants].sum(axis=1)
    return Selection(choice, running, wants, usage, desired, reserved)
