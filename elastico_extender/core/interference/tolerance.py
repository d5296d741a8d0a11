"""Adaptive tolerance thresholds tau_j(t) (spec 3.3.3, Eq. adaptive_threshold).

    tau_j(t) = tau_base_j + clamp(beta * (U(t) / U_target - 1), -inf, beta_max)
    tau_base_j = min(tau_default, T_j(c) / L_j)   when the job has a floor L_j > 0

so a co-location is admitted only if S_hat <= tau_j: a busy cluster (U above
target) tolerates a little more interference, never more than beta_max above
the base, and the base itself never lets throughput fall below the floor:
T_j(c) / S_hat >= L_j  <=>  S_hat <= T_j(c) / L_j.

U(t) is the offered load averaged over time, both ways (``smoothed_utilization``):
tau decides both admission and, in the closed loop, separation, so a tau that
followed each plan's instantaneous load re-judged every co-location whenever a
job left, and a pair the long queue had let share was separated (a gang sent back
to wait hours for its GPUs) a minute after the queue shrank.  Taking a rising load
at once instead (tau up on every burst of arrivals) admitted borderline pairs the
loop then separated (64 GPUs, load 1.5: 0.691x Volcano's JCT, against 0.638x
averaged both ways and 0.660x not averaged).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from elastico_extender.core.settings import PlannerSettings

__all__ = ["adaptive_tolerance", "planner_tolerance", "smoothed_utilization"]


def adaptive_tolerance(
    throughput: np.ndarray,
    floor: np.ndarray,
    utilization: float,
    *,
    tau_default: float,
    beta: float,
    beta_max: float,
    utilization_target: float,
) -> np.ndarray:
    """Vectorised tau_j(t) for jobs running at throughput T_j(c) with floors L_j.

    Where the floor leaves no room (T_j(c) / L_j < 1 + beta_max) the adaptive
    term is capped so tau never exceeds T_j(c) / L_j: the floor is a hard limit.
    """
    throughput = np.asarray(throughput, dtype=np.float64)
    floor = np.asarray(floor, dtype=np.float64)
    headroom = np.where(floor > 0, throughput / np.maximum(floor, 1e-12), np.inf)
    base = np.minimum(tau_default, headroom)
    ratio = utilization / utilization_target if utilization_target > 0 else 1.0
    adjust = min(beta * (ratio - 1.0), beta_max)
    tau = base + adjust
    tau = np.minimum(tau, headroom)  # the floor always wins
    return np.maximum(tau, 1.0)


def planner_tolerance(
    throughput: np.ndarray, floor: np.ndarray, utilization: float, settings: PlannerSettings
) -> np.ndarray:
    """``adaptive_tolerance`` with the planner's settings: the one tau the epoch planner
    and the extender's view between plans both judge co-location by."""
    return adaptive_tolerance(
        throughput,
        floor,
        utilization,
        tau_default=settings.tau_default,
        beta=settings.beta,
        beta_max=settings.beta_max,
        utilization_target=settings.utilization_target,
    )


def smoothed_utilization(
    current: float,
    previous: float | None,
    elapsed_s: float,
    time_constant_s: float,
    history_s: float,
) -> tuple[float, float]:
    """U(t) for tau, and how long its average has run: the load ``current`` averaged
    exponentially with the last plan's U, ``previous``, whose average had run
    ``history_s`` seconds.

    The weight left on ``previous`` is exp(-elapsed / T), with T the time constant or,
    while the average is younger than that, its age ``history_s``: a young average is
    the mean of what it has seen, so the first plan of a restarted extender, made
    before its watch listed the pods, does not hold tau at an empty cluster's for
    half an hour.  Without a previous value or a history (a driver without a clock
    has none), or with smoothing off, the load now is U; a clock that went back (a
    restart that reset it) also starts a new average.
    """
    if previous is None or not elapsed_s >= 0:
        return current, 0.0
    horizon = min(time_constant_s, history_s)
    if not horizon > 0:
        return current, history_s + elapsed_s
    keep = math.exp(-elapsed_s / horizon)
    return current + keep * (previous - current), history_s + elapsed_s
