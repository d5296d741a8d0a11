"""Length-aware ESP weights: who goes first, from what a scheduler can know.

SRTF, Tiresias and Lucid all win by letting short jobs pass long ones; none of
them is told a job's true length.  ElastiCo folds the same knowledge into the
one number ESP already uses for priority, the weight w_j: it ranks pending
jobs for rationing and packing (heavier first, then older), scales the
performance cost of a leaner configuration, and is a pending job's score for
waiting.  Per job, from the snapshot alone:

* **service key** (GPU-seconds).  Where the driver has learned an expected run
  time E_j from completed jobs (:mod:`elastico_extender.core.duration`),
  the key is the expected *remaining* GPU-time ``g_j * R_j`` with
  ``R_j = E_j - a_j`` while the job is younger than its estimate, and
  ``R_j = a_j`` once it has outlived it (heavy-tailed run times: a job that
  ran long is likely to run long again), ``a_j`` being the seconds it has run.
  Without history the key is Tiresias' 2D attained service
  ``A_j = attained_gpu_seconds + g_j * (now - started_at)`` (least attained
  service first: a job that has not run yet is in the first band).
* **band** b_j: the number of thresholds ``base * ratio**k`` (k = 0 ..
  bands - 2) at or below the key, Tiresias' discretised queues, so jobs with
  similar keys keep FIFO order among themselves and nobody thrashes.
* **weight** ``w_j * max(decay**b_j, floor)``; a queued job that has waited
  longer than ``starvation_factor * max(R_j, base)`` seconds (R_j = a_j
  without history) is promoted back to band 0.

Fairness: the floor bounds how far a long job's weight falls (its wait score
and performance cost shrink at most by ``floor``), and the starvation rule
bounds how long a job waits behind shorter arrivals; the simulator reports the
p99 JCT and the worst queueing delay beside the average to show it.
With ``length_aware`` off, or no service and no history (every key 0), the
weights are the users' weights unchanged.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.model import Snapshot
from elastico_extender.core.settings import PlannerSettings

__all__ = [
    "attained_service",
    "band_thresholds",
    "bands",
    "length_aware",
    "queue_weights",
    "service_keys",
]


def band_thresholds(settings: PlannerSettings) -> np.ndarray:
    """Band boundaries in GPU-seconds, ascending (``bands - 1`` of them)."""
    k = np.arange(int(settings.bands) - 1, dtype=np.float64)
    return settings.band_base_gpu_s * settings.band_ratio**k


def bands(key: np.ndarray, settings: PlannerSettings) -> np.ndarray:
    """Band b_j per service key (0 is the first): the thresholds at or below the key."""
    return np.searchsorted(band_thresholds(settings), key, side="right")


def attained_service(snapshot: Snapshot) -> np.ndarray:
    """Per job row: Tiresias' 2D attained service A_j in GPU-seconds (module docstring)."""
    cols = snapshot.columns
    running = cols.held > 0
    started = cols.started
    since = np.where(running & np.isfinite(started), np.maximum(snapshot.now - started, 0.0), 0.0)
    return cols.attained + cols.gpus * since


def service_keys(snapshot: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    """Per job row: (service key in GPU-seconds, expected remaining seconds or the age)."""
    cols = snapshot.columns
    gpus = cols.gpus
    attained = attained_service(snapshot)
    age = attained / np.maximum(gpus, 1.0)
    expected = cols.expected
    known = expected > 0
    remaining = np.where(known & (expected > age), expected - age, age)
    key = np.where(known, gpus * remaining, attained)
    return key, remaining


def length_aware(settings: PlannerSettings) -> bool:
    """Whether the queue ranks by length (bands from ``service_keys``) at all."""
    return settings.length_aware and settings.bands > 1


def queue_weights(
    snapshot: Snapshot,
    weight: np.ndarray,
    settings: PlannerSettings,
    keys: tuple[np.ndarray, np.ndarray] | None = None,
) -> np.ndarray:
    """Effective ESP weight per job row (module docstring); ``weight`` is the users' w_j,
    ``keys`` the snapshot's ``service_keys`` when the caller has them already."""
    if not length_aware(settings) or weight.size == 0:
        return weight
    key, remaining = keys if keys is not None else service_keys(snapshot)
    band = bands(key, settings)
    factor = np.maximum(settings.band_decay ** band.astype(np.float64), settings.weight_floor)
    cols = snapshot.columns
    waited = snapshot.now - cols.arrival
    limit = settings.starvation_factor * np.maximum(remaining, settings.band_base_gpu_s)
    starved = (cols.held == 0) & (waited > limit)
    factor[starved] = 1.0
    return weight * factor
