"""ESP price discovery (spec 3.2, Eq. price_update): projected subgradient "tatonnement".

    lambda_r <- max(0, lambda_r + eta_t * (U_r + Res_r - C_r) / C_r)

where Res_r = gamma * sum R_min over the pending jobs that currently wait:
prices see C_eff = C - Res (spec Eq. effective_capacity), so running jobs are
pushed to leave room for the queue.  Feasibility, though, is judged against
the physical C: a waiting job's reservation never blocks another job's
admission by itself (that would let two queued jobs lock each other out).

with eta_t = eta0 (fixed) or eta0 / sqrt(t) (diminishing).  The subgradient is
taken relative to capacity so eta is dimensionless.  Prices are warm-started
from the previous epoch, so a steady cluster converges in a few iterations.

Convergence rule: stop as soon as the selection is feasible (U <= C within
``feasibility_slack``) and either is a fixed point (the selection at the
updated prices is the same) or sits on the edge of feasibility (the update
would lower prices into an over-committed selection); otherwise stop after
``max_price_iterations`` and return the best feasible selection seen (highest
total value), or the last one if none was feasible (bin-packing then queues what does not fit).
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
    for t in range(1, settings.max_price_iterations + 1):
        excess = (selection.usage + selection.reserved - problem.capacity) / capacity
        new_prices = np.maximum(0.0, prices + _step(settings, t) * excess)
        feasible = _feasible(problem, selection.usage, settings.feasibility_slack)
        if feasible:
            value = _value(problem, selection, penalty)
            if best is None or value > best[0] + 1e-12:
                best = (value, prices, selection)
                since_best = 0
        if best is not None:
            since_best += 1
            if since_best > PATIENCE:
                return PriceResult(best[1], best[2], t, False)
        new_selection = select(problem, new_prices, penalty)
        if feasible and (
            _same(selection, new_selection)
            or not _feasible(problem, new_selection.usage, settings.feasibility_slack)
        ):
            # A fixed point, or the edge of feasibility: any lower price over-commits.
            return PriceResult(prices, selection, t, True)
        prices, selection = new_prices, new_selection
    if _feasible(problem, selection.usage, settings.feasibility_slack):
        return PriceResult(prices, selection, settings.max_price_iterations, True)
    if best is not None:
        return PriceResult(best[1], best[2], settings.max_price_iterations, False)
    return PriceResult(prices, selection, settings.max_price_iterations, False)


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
