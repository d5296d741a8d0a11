"""Adaptive tolerance thresholds tau_j(t) (spec 3.3.3, Eq. adaptive_threshold).

    tau_j(t) = tau_base_j + clamp(beta * (U(t) / U_target - 1), -inf, beta_max)
    tau_base_j = min(tau_default, T_j(c) / L_j)   when the job has a floor L_j > 0

so a co-location is admitted only if S_hat <= tau_j: a busy cluster (U above
target) tolerates a little more interference, never more than beta_max above
the base, and the base itself never lets throughput fall below the floor:
T_j(c) / S_hat >= L_j  <=>  S_hat <= T_j(c) / L_j.
"""

from __future__ import annotations

import numpy as np

__all__ = ["adaptive_tolerance"]


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
