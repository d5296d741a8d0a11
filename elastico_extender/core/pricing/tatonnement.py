"""ESP price discovery (spec 3.2, Eq. price_update): projected subgradient "tatonnement".

    lambda_r <- max(0, lambda_r + eta_t * (D_r + Res_r - C_r) / C_r)

with eta_t = eta0 (fixed) or eta0 / sqrt(t) (diminishing).  D is the demand of
every job that wants to run at these prices and Res_r = gamma * sum R_min over
the pending jobs that choose to wait, so prices see C_eff = C - Res (spec Eq.
effective_capacity) and running jobs are pushed to leave room for the queue.
The subgradient is taken relative to capacity so eta is dimensionless, and
prices are warm-started from the previous epoch.

Feasibility and value are judged on the *rationed* selection (pending jobs
admitted in priority order while the aggregate capacity holds, see
``scoring.select``): demand made of many identical lumps (say 40 queued 8-GPU
jobs with room for 8) flips from "all run" to "all wait" at one price step,
and without rationing the best feasible answer would be to leave the GPUs idle.

Convergence rule: stop when the unrationed demand fits (D <= C within
``feasibility_slack``) and the selection is a fixed point or sits on the edge
of feasibility (a lower price would over-commit), or when the best value has
not improved for ``PATIENCE`` iterations, or after ``max_price_iterations``.
The selection returned is the best-valued (rationed) one seen, with its prices.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from elastico_extender.core.pricing.scoring import PricingProblem, Selection, select
from elastico_extender.core.settings import PlannerSettings, StepSchedule

__all__ = ["PATIENCE", "PriceResult", "tatonnement"]

PATIENCE = 8


@dataclass(frozen=True, eq=False)
class PriceResult:
    prices: np.ndarray
    selection: Selection
    iterations: int
    converged: bool


def _step(settings: PlannerSettings, t: int) -> float:
    if settings.step_schedule is StepSchedule.SQRT:
        return settings.step_size / np.sqrt(t)
    return settings.step_size


def _feasible(problem: PricingProblem, usage: np.ndarray, slack: float) -> bool:
    return bool(np.all(usage <= problem.capacity * (1.0 + slack) + 1e-9))


def tatonnement(
    problem: PricingProblem,
    start_prices: np.ndarray,
    settings: PlannerSettings,
    penalty: np.ndarray | None = None,
) -> PriceResult:
    """Iterate prices until the selection is a feasible fixed point (see module doc)."""
    prices = np.maximum(np.asarray(start_prices, dtype=np.float64), 0.0)
    capacity = np.maximum(problem.capacity, 1e-9)
    selection = select(problem, prices, penalty)
    best: tuple[float, np.ndarray, Selection] | None = None
    since_best = 0
    converged = False
    iterations = settings.max_price_iterations
    for t in range(1, settings.max_price_iterations + 1):
        value = _value(problem, selection, penalty)
        # Running jobs cannot be rationed: a selection where they over-commit is not a candidate.
        if _feasible(problem, selection.usage, settings.feasibility_slack) and (
            best is None or value > best[0] + 1e-12
        ):
            best = (value, prices, selection)
            since_best = 0
        elif best is not None:
            since_best += 1
        excess = (selection.desired + selection.reserved - problem.capacity) / capacity
        new_prices = np.maximum(0.0, prices + _step(settings, t) * excess)
        # Unchanged prices give the same selection (select is deterministic): skip it.
        same_prices = np.array_equal(new_prices, prices)
        new_selection = selection if same_prices else select(problem, new_prices, penalty)
        if _fits(problem, selection, settings) and (
            _same(selection, new_selection) or not _fits(problem, new_selection, settings)
        ):
            # A fixed point, or the edge of feasibility: any lower price over-commits.
            converged, iterations = True, t
            if best is None or value >= best[0] - 1e-12:
                best = (value, prices, selection)
            break
        if since_best > PATIENCE:
            iterations = t
            break
        prices, selection = new_prices, new_selection
    if best is None:
        return PriceResult(prices, selection, iterations, converged)
    return PriceResult(best[1], best[2], iterations, converged)


def _fits(problem: PricingProblem, selection: Selection, settings: PlannerSettings) -> bool:
    """Whether every job that wants to run fits the aggregate capacity, unrationed."""
    return _feasible(problem, selection.desired, settings.feasibility_slack)


def _same(a: Selection, b: Selection) -> bool:
    return bool(
        np.array_equal(a.running, b.running)
        and np.array_equal(a.choice[a.running], b.choice[b.running])
    )


def _value(problem: PricingProblem, selection: Selection, penalty: np.ndarray | None) -> float:
    """Total surplus of a selection at zero prices (what the Lagrangian maximises)."""
    rows = np.flatnonzero(selection.running)
    base = problem.base[rows, selection.choice[rows]]
    if penalty is not None:
        base = base + penalty[rows, selection.choice[rows]]
    waiting = ~selection.running
    return float(
        -(base.sum() + problem.wait_score[waiting & np.isfinite(problem.wait_score)].sum())
    )
