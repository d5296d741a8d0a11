"""Nearest-neighbour fill for unprofiled configurations (spec 3.1, fallback).

When a configuration has no measured profile (new knob combination, new
hardware), RST borrows the measured entry whose resource vector is closest
under an l2 distance.  Resource vectors are compared after dividing each
dimension by its spread over the family, so MiB do not drown SM shares.  The
prior resource vector of the unmeasured row (from the catalog model or the
user's request) is the query; throughput and features come from the neighbour,
and the row is flagged ``estimated`` until the profiler measures it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["nearest_measured"]


def nearest_measured(prior: np.ndarray, measured: np.ndarray) -> np.ndarray:
    """For each row of ``prior`` (Q, R), the index of the nearest row of ``measured`` (M, R)."""
    prior = np.asarray(prior, dtype=np.float64)
    measured = np.asarray(measured, dtype=np.float64)
    if measured.shape[0] == 0:
        raise ValueError("no measured profiles to estimate from")
    spread = np.ptp(np.vstack([prior, measured]), axis=0)
    scale = np.where(spread > 0, spread, 1.0)
    a = prior / scale
    b = measured / scale
    distance = ((a[:, None, :] - b[None, :, :]) ** 2).sum(axis=2)
    return np.argmin(distance, axis=1)
