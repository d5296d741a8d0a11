"""Which interference predictor the service uses, and why it is degraded if it is.

The ONNX model loader lives in ``elastico_extender.interference`` (optional at
this layer): ``load_predictor(path) -> (predictor, degradation_reason | None)``.
Without it, or without a model path, the core's ContentionPredictor is used and
the reason is reported by /healthz and the ``elastico_predictor_degraded`` metric.
"""

from __future__ import annotations

import importlib
import logging
import threading

import numpy as np

from elastico_extender.core.interference.predictor import (
    ContentionPredictor,
    SlowdownPredictor,
    predictor_generation,
)

__all__ = ["HEURISTIC", "GuardedPredictor", "resolve_predictor"]

log = logging.getLogger(__name__)


HEURISTIC = "heuristic"
"""``predictor_model`` value that chooses the contention heuristic on purpose (not degraded):
on measurements unlike the shipped model's training pairs it can transfer better (Lucid's
RTX 3090 pairs: 15.7% MAPE against the shipped model's 24.0%;
``benchmarks/results/loop/lucid_transfer.md``); the online correction learns either."""


def resolve_predictor(model_path: str | None) -> tuple[SlowdownPredictor, str | None]:
    """The predictor to inject and the degradation reason (None when healthy)."""
    if model_path == HEURISTIC:
        return ContentionPredictor(), None
    try:
        module = importlib.import_module("elastico_extender.interference")
        loader = module.load_predictor
    except (ImportError, AttributeError):
        reason = "ONNX interference predictor not installed; using the contention heuristic"
        return ContentionPredictor(), reason if model_path else None
    try:
        predictor, reason = loader(model_path)
    except Exception as exc:  # a broken model must not stop the extender (degrade, don't crash)
        log.warning("predictor.load_failed", extra={"error": str(exc)})
        return ContentionPredictor(), f"model {model_path} failed to load: {exc}"
    return predictor, reason


class GuardedPredictor:
    """A predictor answering under a lock its learner also holds while it changes.

    The online correction learns on the observation threads while the epoch thread
    predicts; the core is single-threaded by design, so the service serialises them.
    """

    def __init__(self, inner: SlowdownPredictor, lock: threading.Lock) -> None:
        self.inner = inner
        self.lock = lock
        self.name = getattr(inner, "name", type(inner).__name__)

    @property
    def generation(self) -> int | None:
        """The inner predictor's (read without the lock: an int read is atomic)."""
        return predictor_generation(self.inner)

    def predict(self, features: np.ndarray) -> np.ndarray:
        with self.lock:
            return self.inner.predict(features)
