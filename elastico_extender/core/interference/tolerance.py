"""Adaptive tolerance thresholds tau_j(t) (spec 3.3.3, Eq. adaptive_threshold).

    tau_j(t) = tau_base_j + clamp(beta * (U(t) / U_target - 1), -inf, beta_max)
    tau_base_j = min(tau_default, T_j(c) / L_j)   when the job has a floor L_j > 0

so a co-location is admitted only if S_hat <= tau_j: a busy cluster (U above
target) tolerates a little more interference, never more than beta_max above
the base, and the base itself never lets throughput fall below the floor:
T_j(c) / S_hat >= L_j  <=>  S_hat <= T_j(c) / L_j.

U(t) is the offered load, and it falls slowly (``smoothed_utilization``): tau
decides both admission and, in the closed loop, separation, so a tau that
followed each plan's instantaneous load re-judged every co-location whenever a
job left, and a pair the long queue had let share was separated (a gang sent back
to wait hours for its GPUs) a minute after the queue shrank.  A rising load is
taken at once: a higher tau only admits more, and a restarted extender, whose first
plans saw part of the cluster, must not hold tau down while the average catches up.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["adaptive_tolerance", "smoothed_utilization"]


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


def smoothed_utilization(
    current: float,
    previous: float | None,
    elapsed_s: float,
    time_constant_s: float,
    history_s: float,
) -> float:
    """U(t) for tau: the load ``current`` averaged exponentially with the last plan's U.

    The weight left on ``previous`` is exp(-elapsed / T), with T the time constant or,
    while the average is younger than that, its age ``history_s`` (the span of plans
    behind ``previous``): a young average is the mean of what it has seen, so the
    first plan of a restarted extender, made before its watch listed the pods,
    does not hold tau at an empty cluster's for half an hour.  Without a previous
    value or a history (a driver without a clock has none), with smoothing off, or
    when the clock went back (a restart that reset it) the load now is U.
    """
    horizon = min(time_constant_s, history_s)
    if previous is None or not horizon > 0 or not elapsed_s >= 0:
        return current
    keep = math.exp(-elapsed_s / horizon)
    return current + keep * (previous - current)
