"""Do no harm: share a GPU only when waiting for one would cost more.

Co-location is worth its slowdown only instead of waiting (spec principle
"never worse than not sharing").  A queued job j that could start now on a
shared GPU with predicted slowdown S (its worst S_hat there) instead of
waiting w_j for a GPU of its own pays, with its partner, about

    cost_j = 2 * D_j * (1 - 1 / S)

seconds of lost progress (both tenants run at about 1/S for the overlap,
at most j's expected run time D_j), while waiting costs j exactly w_j.  So
the planner starts j shared only when ``cost_j < w_j``; otherwise j waits
and takes the GPU that frees up (or an idle one that appears).  Estimates are
rough (heavy-tailed run times), so a job is held back only while its expected
wait is within ``patience_horizon_s``; if the GPU does not free as expected,
its tenant's age raises its expected remaining time, and the next epoch shares.
The rule applies only while the offered load U(t) is below the utilisation
target (the same U as the tolerance's): under a long queue every GPU that frees
is spoken for, and sharing is what ElastiCo is for.

``w_j`` comes from what the scheduler can know (no true durations): every
occupied GPU frees when the last of its tenants is expected to finish (each
tenant's expected remaining time, :mod:`elastico_extender.core.pricing.
queueing`; a tenant without an estimate never "frees" it), and queued jobs
ahead of j in priority take the earliest ones.  Without an estimate for j
(no history yet), or when no GPU is expected to free up, sharing proceeds as
before: the check only ever holds back a job that a GPU is about to serve.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.model import Snapshot
from elastico_extender.core.pricing.queueing import service_keys

__all__ = ["Patience"]


class Patience:
    """Expected GPU-free times of one epoch and the share-or-wait rule (module docstring)."""

    def __init__(
        self,
        snapshot: Snapshot,
        devices: int,
        horizon_s: float,
        remaining: np.ndarray | None = None,
    ) -> None:
        """``remaining``: the snapshot's expected remaining seconds per job row, when the
        epoch has them already (``queueing.service_keys``; computed here otherwise)."""
        self.horizon_s = horizon_s
        cols = snapshot.columns
        if remaining is None:
            _, remaining = service_keys(snapshot)
        self.expected = cols.expected
        held = cols.held
        run = np.flatnonzero(held > 0)
        free_at = np.zeros(devices)  # idle devices are free now
        if run.size:
            workers = snapshot.workers
            owner = np.repeat(np.arange(len(held)), held)
            ok = workers >= 0
            rem = np.where(self.expected > 0, remaining, np.inf)[owner[ok]]
            np.maximum.at(free_at, workers[ok], rem)
        self.free_at = np.sort(free_at[free_at > 0])  # occupied devices, earliest first
        self.claimed = 0  # GPUs promised to queued jobs ahead in this epoch's order
        self._ahead: dict[int, int] = {}  # queued row -> GPUs claimed before it

    def wait_s(self, row: int, gpus: int) -> float:
        """Expected wait of ``row`` for ``gpus`` GPUs after the queued jobs ahead of it."""
        k = self._ahead.get(row, self.claimed) + gpus - 1
        return float(self.free_at[k]) if k < self.free_at.size else float("inf")

    def worth_sharing(self, row: int, gpus: int, slowdown: float) -> bool:
        """Whether starting ``row`` now at ``slowdown`` beats waiting for a GPU of its own."""
        duration = float(self.expected[row])
        if slowdown <= 1.0 or duration <= 0:
            return True
        wait = self.wait_s(row, gpus)
        if wait > self.horizon_s:
            return True
        return 2.0 * duration * (1.0 - 1.0 / slowdown) < wait

    def queue(self, row: int, gpus: int) -> None:
        """A queued job keeps its place: the next GPUs to free up are its."""
        if row not in self._ahead:
            self._ahead[row] = self.claimed
            self.claimed += gpus
