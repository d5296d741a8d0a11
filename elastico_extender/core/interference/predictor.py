"""The interference predictor interface and the core's built-in contention model.

The planner asks one question, for many pairs at once: "how much slower does
job i run next to job j?"  Anything implementing :class:`SlowdownPredictor`
answers it; the ONNX DNN of spec 3.3.2 is one implementation (outside the core,
since it loads a file), :class:`ContentionPredictor` below is the pure fallback
used when no model is loaded and as the documented conservative default.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from elastico_extender.core.interference.features import NUM_FEATURES

__all__ = [
    "ContentionPredictor",
    "SlowdownPredictor",
    "check_feature_batch",
    "mape_percent",
    "predictor_generation",
]


@runtime_checkable
class SlowdownPredictor(Protocol):
    """Predicts S_hat(i|j) = T_i(solo) / T_i(co-located with j) for a batch of pairs.

    Contract:

    * input ``features`` is a float32 array of shape (P, 36) in the order of
      :mod:`.features` (victim block first); P may be 0;
    * output is a float array of shape (P,), every value finite and >= 1.0;
    * one call serves all pairs of an epoch: implementations must be vectorised
      and must not keep per-call state (they are shared across threads).

    Optional: an int ``generation`` that grows whenever an answer can change (a
    predictor that never changes keeps a constant).  Only a predictor declaring it
    lets a caller keep its answers between calls (:func:`predictor_generation`).
    """

    name: str

    def predict(self, features: np.ndarray) -> np.ndarray: ...


def check_feature_batch(features: np.ndarray) -> np.ndarray:
    """Validate a (P, 36) batch, returning it as contiguous float32."""
    array = np.ascontiguousarray(features, dtype=np.float32)
    if array.ndim != 2 or array.shape[1] != NUM_FEATURES:
        raise ValueError(f"expected features of shape (P, {NUM_FEATURES}), got {array.shape}")
    if not np.isfinite(array).all():
        raise ValueError("interference features contain NaN or infinity")
    return array


def predictor_generation(predictor: object) -> int | None:
    """``predictor``'s generation (its answers stay put while it is unchanged), or None
    when it does not declare one and so may change at any time (nothing may be cached)."""
    generation = getattr(predictor, "generation", None)
    return generation if isinstance(generation, int) else None


class ContentionPredictor:
    """A transparent additive contention model, no training needed.

    S_hat = 1 + a * sm_j * sm_i + b * dram_j * dram_i / (sm_i + eps)
              + c * max(0, memory_pressure - 0.97)

    i.e. slowdown grows with how much of the contended resource each job
    keeps busy: SM time shared (first term), DRAM bandwidth shared, weighted
    by how memory-bound the victim is (second term), and a steep term once the
    pair crowds device memory (allocator pressure, MPS paging).  Coefficients
    (a=0.9, b=0.6, c=2.0) put typical training pairs around 1.2-1.8x, the
    spread of Gavel's measured pairs (median 1.73x, ../shared/data/README.md).
    """

    name = "contention-heuristic"
    generation = 0  # fixed coefficients: its answers never change

    def __init__(
        self, sm_weight: float = 0.9, dram_weight: float = 0.6, pressure_weight: float = 2.0
    ):
        self.sm_weight = sm_weight
        self.dram_weight = dram_weight
        self.pressure_weight = pressure_weight

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = check_feature_batch(features).astype(np.float64)
        sm_i, dram_i = x[:, 0], x[:, 2]
        sm_j, dram_j = x[:, 14], x[:, 16]
        pressure = x[:, 33]
        slowdown = (
            1.0
            + self.sm_weight * sm_i * sm_j
            + self.dram_weight * dram_i * dram_j / (sm_i + 0.1)
            + self.pressure_weight * np.maximum(0.0, pressure - 0.97)
        )
        return np.maximum(slowdown, 1.0)


def mape_percent(predicted: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute percentage error of slowdown predictions against measured ones, in %:
    the one figure every report of a predictor's accuracy quotes (training, the
    simulator's learning curve, the accuracy benchmarks).  NaN when there is nothing
    to compare."""
    measured = np.asarray(measured, dtype=np.float64)
    if measured.size == 0:
        return float("nan")
    return float(np.mean(np.abs(np.asarray(predicted) - measured) / measured) * 100.0)
