"""Job-length estimator: how long will a job run, learned only from jobs that finished.

Schedulers that know job length (SRTF, Tiresias' successors, Lucid's "Workload
Estimate Model", ElastiCo's length-aware queueing) need a duration guess for a
job that has not finished.  The truth is never available; what a cluster does
know is how long *completed* jobs of the same kind took.  Lucid (Hu et al.,
ASPLOS'23, section 4.3) fits an interpretable model on the job's user, name and
GPU count; this estimator keeps the same inputs and a model simple enough to
explain in one formula.

Model (hierarchical shrinkage in log space)
-------------------------------------------
Durations are log-normal-ish (Philly: median 4.6 h, tail to weeks), so every
statistic is a mean of ``log(duration)``.  Keys from coarse to fine::

    global  ->  gpus  ->  family  ->  (family, gpus)  ->  (family, gpus, user)

Starting from the prior ``log(prior_s)`` (weight ``shrink``), each level's
estimate blends the level's own mean with its parent's::

    est(level) = (n * mean(level) + shrink * est(parent)) / (n + shrink)

where n is the number of completed jobs with that key, so a key seen once
moves the estimate a little and a key seen 50 times speaks for itself.
``predict`` returns ``exp(est)``: a median-like duration in seconds, clipped to
``[min_s, max_s]``.  The ``family`` level sits under the ``gpus`` level
because a family's length varies with its width less than jobs in general do.

Bounded and pure: ``fit`` keeps per-key sums only (``max_keys`` keys at most,
the rarest dropped first), no I/O, no clock.  A driver (the simulator, the
service) collects finished jobs as :class:`CompletedJob` records and calls
``fit`` again when more have finished.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

__all__ = ["CompletedJob", "DurationEstimator", "JobLike"]


@dataclass(frozen=True, slots=True)
class CompletedJob:
    """A finished job as the scheduler observed it: what it was and how long it ran."""

    family: str
    gpus: int
    duration_s: float
    user: str = ""


class JobLike(Protocol):
    """What ``predict`` reads from a job (core :class:`~elastico_extender.core.model.Job`)."""

    @property
    def family(self) -> str: ...

    @property
    def gpus(self) -> int: ...


_Key = tuple[str, ...]


class DurationEstimator:
    """Predicts a job's run time from completed jobs (module docstring for the model)."""

    def __init__(
        self,
        prior_s: float = 3600.0,
        shrink: float = 3.0,
        min_s: float = 60.0,
        max_s: float = 60 * 86400.0,
        max_keys: int = 20_000,
    ) -> None:
        if not (prior_s > 0 and math.isfinite(prior_s)):
            raise ValueError(f"prior_s must be a positive number, got {prior_s}")
        if not (shrink > 0 and math.isfinite(shrink)):
            raise ValueError(f"shrink must be a positive number, got {shrink}")
        self.prior_s = float(prior_s)
        self.shrink = float(shrink)
        self.min_s = float(min_s)
        self.max_s = float(max_s)
        self.max_keys = int(max_keys)
        self._sums: dict[_Key, tuple[int, float]] = {}
        self.count = 0

    @staticmethod
    def _keys(family: str, gpus: int, user: str) -> tuple[_Key, ...]:
        g = str(int(gpus))
        return (("*",), ("g", g), ("f", family), ("fg", family, g), ("fgu", family, g, user))

    def fit(self, records: Iterable[CompletedJob]) -> DurationEstimator:
        """Learn from ``records`` (replacing what was learned before); returns self."""
        sums: dict[_Key, tuple[int, float]] = {}
        count = 0
        for rec in records:
            d = float(rec.duration_s)
            if not (math.isfinite(d) and d > 0):
                continue
            x = math.log(min(max(d, self.min_s), self.max_s))
            count += 1
            for key in self._keys(rec.family, rec.gpus, rec.user):
                n, s = sums.get(key, (0, 0.0))
                sums[key] = (n + 1, s + x)
        if len(sums) > self.max_keys:
            keep = sorted(sums, key=lambda k: (len(k), -sums[k][0]))[: self.max_keys]
            sums = {k: sums[k] for k in keep}
        self._sums = sums
        self.count = count
        return self

    def predict(self, job: JobLike) -> float:
        """Estimated run time of ``job`` in seconds (the prior before any ``fit``)."""
        user = str(getattr(job, "user", "") or "")
        est = math.log(self.prior_s)
        for key in self._keys(job.family, int(job.gpus), user):
            if key[0] == "fgu" and not user:
                break
            n, s = self._sums.get(key, (0, 0.0))
            if n:
                est = (s + self.shrink * est) / (n + self.shrink)
        return min(max(math.exp(est), self.min_s), self.max_s)
