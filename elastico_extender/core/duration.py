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
the rarest dropped first), no I/O, no clock.

Who knows what: a :class:`DurationBook` holds the completed jobs a driver has
seen (the simulator's engine; the service's completion recorder, which also
persists them) and the estimator fitted on them, and answers the expected run
time of a job the planner is about to see (``Job.expected_duration_s``; 0 until
``min_history`` jobs have finished, so early guesses from the prior alone never
reorder a queue).  Both drivers go through it, so the simulated ElastiCo knows
exactly what the shipped one would.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

__all__ = [
    "MAX_COMPLETIONS",
    "MIN_HISTORY",
    "CompletedJob",
    "DurationBook",
    "DurationEstimator",
    "JobLike",
]

MIN_HISTORY = 5
"""Completed jobs before the book's guesses reach the planner (fewer: 0, no guess)."""
MAX_COMPLETIONS = 50_000
"""Completions a book keeps (the newest); at about 100 bytes each, a few MiB."""
REFIT_GROWTH = 1.25
"""The book refits once it holds more than this many times the completions of its last fit."""


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


Tag = TypeVar("Tag")
"""What a driver tags each completion with (``DurationBook.record``)."""


class DurationBook(Generic[Tag]):
    """Completed jobs and the estimator fitted on them (module docstring).

    Owned by one driver; not thread-safe.  ``history``: completions known before
    the driver started (jobs that finished before a trace window; the service's
    persisted completions).  Refits lazily, when asked for a guess after the
    completions grew by :data:`REFIT_GROWTH` since the last fit (every finished job
    would refit O(n) each time; a quarter more moves the estimates little)."""

    def __init__(
        self,
        history: Iterable[CompletedJob] = (),
        *,
        min_history: int = MIN_HISTORY,
        capacity: int = MAX_COMPLETIONS,
        estimator: DurationEstimator | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.min_history = int(min_history)
        self.estimator = estimator or DurationEstimator()
        self._completed: deque[tuple[CompletedJob, Tag | None]] = deque(maxlen=int(capacity))
        self._recorded = 0  # completions ever recorded (the deque forgets the oldest)
        self._fitted_at = 0  # ``_recorded`` at the last fit
        self._guesses: dict[tuple[str, int, str], float] = {}
        self.generation = 0
        """Bumped at every refit: guesses a caller cached before are stale."""
        for job in history:
            self.record(job)

    def __len__(self) -> int:
        return len(self._completed)

    @property
    def completed(self) -> tuple[CompletedJob, ...]:
        """The completions kept, oldest first."""
        return tuple(job for job, _ in self._completed)

    def tagged(self) -> tuple[tuple[CompletedJob, Tag | None], ...]:
        """The completions kept with the tags they were recorded with, oldest first."""
        return tuple(self._completed)

    def record(self, job: CompletedJob, tag: Tag | None = None) -> bool:
        """A job finished (run time ``job.duration_s``; not finite or <= 0: ignored, False).

        ``tag``: what the driver needs to persist the completion (the service: the pod's
        uid and finish time), kept beside it and forgotten with it, so the book is the
        one owner of which completions are known."""
        if not (math.isfinite(job.duration_s) and job.duration_s > 0):
            return False
        self._completed.append((job, tag))
        self._recorded += 1
        return True

    def refresh(self) -> bool:
        """Refit if enough completions arrived since the last fit; True if it refitted."""
        if self._recorded < max(self.min_history, int(self._fitted_at * REFIT_GROWTH) + 1):
            return False
        self.estimator.fit(job for job, _ in self._completed)
        self._fitted_at = self._recorded
        self._guesses.clear()
        self.generation += 1
        return True

    def expected(self, family: str, gpus: int, user: str = "") -> float:
        """Expected run time in seconds of a job of ``family`` on ``gpus`` GPUs started by
        ``user``; 0.0 while fewer than ``min_history`` jobs have finished."""
        self.refresh()
        if not self._fitted_at:
            return 0.0
        key = (family, int(gpus), user)
        guess = self._guesses.get(key)
        if guess is None:
            guess = self.estimator.predict(CompletedJob(family, int(gpus), 0.0, user))
            if len(self._guesses) < MAX_COMPLETIONS:
                self._guesses[key] = guess
        return guess
