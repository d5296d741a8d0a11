"""Observed interference: what running jobs really did, turned into planner input.

Closed-loop control (spec 3.3, 3.4, 4.1; ARCHITECTURE "the loop closes on
observations").  Predictions start co-location decisions; observations end
them.  Both drivers feed this one book: the extender from the node agent's
reports, the simulator from its ground truth plus measurement noise.

A report is a *progress rate* of one job over one window, in a unit that stays
constant for a fixed configuration: CUDA kernel launches per second (a training
step launches the same kernels every step), or a framework counter (tokens/s,
samples/s).  The book turns rates into slowdowns against a reference rate of
the same job at the same configuration:

    S_obs = rate_ref(job, config, unit) / rate(window)

where ``rate_ref`` is, best first:

1. *solo*: learned from the windows in which the job ran alone on its devices
   (their mean: a job's solo rate at a fixed configuration is constant, so each
   window is one more sample of it; the newest weighs at least
   ``SOLO_SMOOTHING``, so a slow drift is followed);
2. *family*: learned from the solo windows of other jobs of the same family at
   the same configuration, in the same unit (a family's configuration fixes the
   kernels of a step and its batch, so its solo rate is the family's, not the
   job's; ``FAMILY_SMOOTHING`` averages over many jobs' windows).  A job that
   started next to a partner is never seen alone, yet its slowdown is measured
   against what its family does alone in this cluster, not against a profile
   taken elsewhere; for launch rates, which no profile states, it is the only
   reference such a job can have;
3. *profile*: for framework units that match the family's throughput unit, the
   profile's T(c) passed by the driver (its error, a few percent, biases every
   window).

A *mixed* window (``Observation.mixed``: a tenant of the job's devices ran
next to it for less than ``MIN_SHARED_SHARE`` of the window: it joined, left
or paused to restart part-way through) is neither: its rate is largely alone
and partly shared.  It counts as the job's slowdown (a harm
case goes on with it: the slowdown it shows understates the partners', never
overstates it), but it teaches nothing: no reference moves on it and it labels
no pair sample (labelled as shared it taught mild samples; taken as alone, a
slow solo rate).

A window with no progress at all (rate 0) changes nothing: the job paused
(a restarted workload loading its model, a checkpoint, an inference server
with no requests); no partner stops a job outright, and reading a pause as a
hundredfold slowdown would separate a harmless pair.

``ObservedSlowdown.reference`` says which one a job's slowdown rests on, so the
planner can allow for its error.  A job with no reference yields no slowdown:
the book lists it in ``unmeasured()`` (with its newest window's end) until one
of its windows can be measured, so the planner can run it alone first.
The family references are kept beside the jobs' under ``family_key`` (a key no
job id can take), so they persist and restore with them.

Per job the book keeps an exponentially weighted slowdown (weight
``smoothing`` on the newest window), the sample count, the time of the last
window and the last ``history`` window slowdowns, so the planner can apply
"above tolerance for k consecutive windows" with its own tolerance.

Observed SM demand (the planner's charge, ``planner.observed_sm``): a report
may carry the job's mean SM activity over its window (DCGM/NVML "SM active",
or the simulator's truth plus noise).  The book keeps, per job and for its
current configuration only, a *bucketed peak*: the highest window activity
in each of the last ``SM_BUCKETS`` buckets of ``SM_HORIZON_S / SM_BUCKETS``
seconds (driver clock).  ``ObservedSlowdown.sm_peak`` is the maximum over the
buckets within the horizon: a peak, not a mean, so a bursty inference job is
charged for its bursts of the last hour rather than its average; bounded in
memory (``SM_BUCKETS`` numbers per job) whatever the agent's report period.
A configuration switch restarts it (a new configuration keeps the GPU busy
differently).  ``sm_seconds`` counts the observed seconds behind it.

The book is pure (time is an argument, no I/O) and bounded: at most
``max_jobs`` jobs (least recently reported dropped first) and ``max_refs``
references.  ``state()``/``restore()`` give plain data so a driver can persist it.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = [
    "FAMILY_MARGIN",
    "FAMILY_SMOOTHING",
    "HARM_WINDOWS",
    "MAX_RATE",
    "MIN_SHARED_SHARE",
    "ONE_WINDOW_MARGIN",
    "PROFILE_MARGIN",
    "REFERENCES",
    "REFERENCE_MARGIN",
    "RESTORED_WINDOWS",
    "SLOW_WINDOWS",
    "SM_BUCKETS",
    "SM_HORIZON_S",
    "SOLO_SMOOTHING",
    "Observation",
    "ObservationBook",
    "ObservedSlowdown",
    "PairSample",
    "family_key",
    "is_family_key",
    "window_evidence",
]

MAX_RATE = 1e9
"""Most progress per second a window may report, in any unit: far above any kernel launch,
token or sample rate of one pod; beyond it a report is garbage whose ratios overflow."""
SM_HORIZON_S = 3600.0
"""How far back the observed SM peak looks (an hour: several idle/busy phases of a
training job, and an inference burst of the last hour)."""
SM_BUCKETS = 6
"""Buckets of the SM peak (each ``SM_HORIZON_S / SM_BUCKETS`` seconds, its highest window)."""
FAMILY_SMOOTHING = 0.2
"""Weight of the newest solo window in a family's reference (module doc): about ten
windows, of several jobs, make it, so one job's quirk or one noisy window moves it little."""
SOLO_SMOOTHING = FAMILY_SMOOTHING
"""Least weight of the newest solo window in a job's own reference (module doc): the
plain mean of its first windows, then a moving average of about the last ten, so one
noisy window moves it little (at weight 0.5 one window 7% slow set a job's reference 4%
low, and a pair 3% above tau read within it for 22 epochs on Philly ed69ec)."""
RESTORED_WINDOWS = 10
"""Most solo windows a reference counts as resting on: its average weighs the newest by
at least ``FAMILY_SMOOTHING``, so it never rests on more than about 10; a restored
reference (counts are not persisted) counts as that many."""
REFERENCES = ("solo", "family", "profile")
"""What a slowdown can rest on, best first (module doc)."""
MIN_SHARED_SHARE = 2.0 / 3.0
"""A window is labelled as shared with a partner only if that partner ran next to the job
for at least this share of it; one that joined, left or paused to restart for longer
makes the window *mixed* (module doc).  Below a third alone, a window
understates the pair's slowdown by at most a third of its excess and is still a sample of
it: Philly ed69ec's loop lost 3-5% of JCT when every such window was mixed
(``benchmarks/results/loop/README.md``, "Session 28")."""
HARM_WINDOWS = 2
"""k: consecutive observation windows above tolerance before a pair is separated."""
SLOW_WINDOWS = 4
"""Windows whose mean above tau also counts as harm (marginal pairs, noisy windows)."""
ONE_WINDOW_MARGIN = 0.09
"""Relative margin above tau at which a single window is harm on its own: three sigma of
one window's scatter (3% for a launch-rate count over a window, the simulator's noise),
so noise alone (about one window in 700 at tau) does not separate a pair; a borrowed
reference's margin comes on top (its error may raise every window by that much)."""
PROFILE_MARGIN = 0.10
"""Relative margin on a slowdown measured against a profile's T(c) instead of a solo
window (two sigma of a profile's throughput error): such a job is separated once
its evidence times 1.1 exceeds tau."""
FAMILY_MARGIN = 0.05
"""Relative margin on a slowdown measured against the family's solo rate at the job's
configuration (module doc): jobs of one family and configuration run the same kernels,
so what is left is their spread (input pipelines, data), unknown in general and taken
as the planner's admission band (3% let harm live 3 epochs at p95 in the load 1.0 run)."""
REFERENCE_MARGIN = {"solo": 0.0, "family": FAMILY_MARGIN, "profile": PROFILE_MARGIN}
"""The error a slowdown may carry from what its reference rate is (``REFERENCES``)."""
_FAMILY_PREFIX = "family:"  # no pod uid or simulated job id starts so


def family_key(family: str, config: int, unit: str) -> tuple[str, int, str]:
    """The reference key of a family at a configuration (module doc, "family")."""
    return (_FAMILY_PREFIX + family, config, unit)


def is_family_key(job_id: str) -> bool:
    """Whether a reference row's first field names a family (``family_key``), not a job."""
    return job_id.startswith(_FAMILY_PREFIX)


def window_evidence(recent: tuple[float, ...], reference: str) -> float:
    """The slowdown a job's windows with its current partners vouch for (0.0: none).

    The planner compares it with tau (``planner.protect``, "Harm").  The larger of:
    the newest window, lowered by ``ONE_WINDOW_MARGIN`` and by the reference's margin
    (one window far beyond both is enough: observed beats predicted); and, once there
    are ``HARM_WINDOWS`` windows, the least of the newest k, or the mean of the newest
    ``SLOW_WINDOWS`` if larger, *raised* by the reference's margin unless the job's own
    solo rate is the reference (k windows agree: the reference's error is what may hide
    the excess).  The first window of a case often understates it, never overstates
    it: a partner that joined or restarted in it ran for part of it only.
    """
    if not recent:
        return 0.0
    margin = 1.0 + REFERENCE_MARGIN.get(reference, PROFILE_MARGIN)
    one = recent[-1] / (1.0 + ONE_WINDOW_MARGIN) / margin
    if len(recent) < HARM_WINDOWS:
        return one
    evidence = min(recent[-HARM_WINDOWS:])
    if len(recent) >= SLOW_WINDOWS:
        evidence = max(evidence, sum(recent[-SLOW_WINDOWS:]) / SLOW_WINDOWS)
    return max(one, evidence * margin)


@dataclass(frozen=True, slots=True)
class Observation:
    """One window's progress of one running job, as a node agent or the simulator reports it.

    ``partners`` are the job ids sharing any of its devices during the window
    (empty: it ran alone).  ``unit`` names what ``rate`` counts ("launches/s",
    "tokens/s", ...); rates of different units are never compared.  ``mixed``: a
    tenant of its devices ran next to it for less than ``MIN_SHARED_SHARE`` of the window
    (it joined, left, or paused to restart), so it is neither a window alone nor one next
    to ``partners`` (module doc).
    """

    job_id: str
    config: int
    end: float
    seconds: float
    rate: float
    unit: str = "launches/s"
    partners: tuple[str, ...] = ()
    peak_mem_mib: float | None = None
    sm_activity: float | None = None
    mixed: bool = False

    def problems(self) -> list[str]:
        """Every reason this report cannot be used, each naming the field."""
        found = []
        if not self.job_id:
            found.append("job_id is empty")
        if self.config < 0:
            found.append(f"config must be >= 0, got {self.config}")
        for name in ("end", "seconds", "rate"):
            value = getattr(self, name)
            if not math.isfinite(value):
                found.append(f"{name} must be a finite number, got {value!r}")
        if math.isfinite(self.seconds) and self.seconds <= 0:
            found.append(f"seconds must be > 0, got {self.seconds}")
        if math.isfinite(self.rate) and not 0 <= self.rate <= MAX_RATE:
            found.append(f"rate must be in [0, {MAX_RATE:g}] per second, got {self.rate}")
        for name in ("peak_mem_mib", "sm_activity"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                found.append(f"{name} must be a non-negative finite number, got {value!r}")
        return found


@dataclass(frozen=True, slots=True)
class ObservedSlowdown:
    """What the planner reads per running job (``Snapshot.observed``)."""

    slowdown: float
    """Exponentially weighted observed slowdown (1.0 = as fast as alone)."""
    samples: int
    """Windows with a slowdown (shared or alone) since the job's configuration last changed."""
    last: float
    """Driver clock of the newest window."""
    recent: tuple[float, ...]
    """The newest window slowdowns, oldest first (at most ``ObservationBook.history``),
    across configuration switches (each relative to the solo rate at its configuration)
    but only with the newest window's partners: a window next to other tenants is
    evidence about other tenants, so a change of partners starts the list afresh
    (a few windows alone in between do not: ``ObservationBook._recent``)."""
    partners: tuple[str, ...] = ()
    """Who shared its devices in the newest window."""
    reference: str = "solo"
    """What the reference rate is (``REFERENCES``): this job's own solo rate, its family's
    solo rate at this configuration in this cluster, or a profile's T(c), whose own
    error, a few percent, biases the slowdown until the job or its family is seen alone."""
    sm_config: int = -1
    """The configuration the SM buckets were observed at (-1: no SM reported)."""
    sm_buckets: tuple[tuple[int, float], ...] = ()
    """(bucket index, highest window SM activity in it), oldest first, within the horizon."""
    sm_seconds: float = 0.0
    """Observed seconds behind ``sm_buckets`` (since the configuration last changed)."""
    evidence: float = field(init=False, repr=False, compare=False)
    """``window_evidence`` of ``recent``: computed once per window, when the book takes
    it, so the planner's harm test reads one number per job each epoch."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "evidence", window_evidence(self.recent, self.reference))

    @property
    def solo_reference(self) -> bool:
        """Whether the reference rate is this job's own, measured alone."""
        return self.reference == "solo"

    @property
    def sm_peak(self) -> float | None:
        """Highest window SM activity over the last ``SM_HORIZON_S`` at ``sm_config``."""
        return max(p for _, p in self.sm_buckets) if self.sm_buckets else None

    def age(self, now: float) -> float:
        return max(0.0, now - self.last)


@dataclass(frozen=True, slots=True)
class PairSample:
    """A labelled co-location sample for learning: victim ran at S next to partner."""

    victim: str
    victim_config: int
    partner: str
    slowdown: float
    end: float


@dataclass(frozen=True, slots=True)
class _Case:
    """A job's newest windows next to one set of partners, kept through a few windows
    alone (``ObservationBook._recent``)."""

    partners: frozenset[str]
    recent: tuple[float, ...]
    gap: int  # windows alone since the newest of ``recent``


_JobEntry = tuple[int, ObservedSlowdown, _Case | None]
"""Per job in the book: its configuration, what the planner reads, its shared case."""


class ObservationBook:
    """Turns per-window progress rates into per-job observed slowdowns (see module doc)."""

    def __init__(
        self,
        *,
        smoothing: float = 0.5,
        history: int = 4,
        max_jobs: int = 100_000,
        max_refs: int = 200_000,
    ) -> None:
        if not 0 < smoothing <= 1:
            raise ValueError(f"smoothing must lie in (0, 1], got {smoothing}")
        self.smoothing = smoothing
        self.history = history
        self.max_jobs = max_jobs
        self.max_refs = max_refs
        self._refs: OrderedDict[tuple[str, int, str], float] = OrderedDict()
        self._measured: set[tuple[str, int, str]] = set()  # refs learned from solo windows
        # solo windows behind each measured reference, a job's or a family's (kept with
        # the reference, not stored: a restored one counts RESTORED_WINDOWS)
        self._windows: dict[tuple[str, int, str], int] = {}
        self._jobs: OrderedDict[str, _JobEntry] = OrderedDict()
        self._unmeasured: OrderedDict[str, float] = OrderedDict()  # job -> newest window end

    def reference(self, job_id: str, config: int, unit: str) -> float | None:
        return self._refs.get((job_id, config, unit))

    def set_reference(self, job_id: str, config: int, unit: str, rate: float) -> None:
        """A known solo rate (a profile's T(c) in the same unit) for the job at ``config``."""
        if math.isfinite(rate) and rate > 0:
            self._put_ref((job_id, config, unit), rate)

    def family_reference(self, family: str, config: int, unit: str) -> float | None:
        """The family's solo rate at ``config`` in ``unit`` (module doc), if measured."""
        return self._refs.get(family_key(family, config, unit))

    def family_solo_rates(self, family: str, unit: str, size: int) -> dict[int, tuple[float, int]]:
        """Configuration -> (the family's solo rate measured there in ``unit``, how many
        solo windows it rests on), over configurations ``0 .. size-1``; solo windows
        only, never a profile's."""
        out = {}
        for config in range(size):
            key = family_key(family, config, unit)
            if key in self._measured:
                out[config] = (self._refs[key], self._windows.get(key, RESTORED_WINDOWS))
        return out

    def record(self, obs: Observation, family: str | None = None) -> list[PairSample]:
        """Take one window; returns the pair samples it labels (empty when it ran alone).

        ``family`` (the job's profile family, when the driver knows it) lets a
        solo window teach the family's reference and a job never seen alone use
        it.  Raises ValueError naming the field for an unusable report.
        """
        problems = obs.problems()
        if problems:
            raise ValueError("; ".join(problems))
        if obs.rate == 0:  # no progress at all: a pause, not a slowdown (module doc)
            return []
        key = (obs.job_id, obs.config, obs.unit)
        fkey = family_key(family, obs.config, obs.unit) if family else None
        ref, kind = self._reference_of(key, fkey)
        if not obs.partners and not obs.mixed:
            # The job's own mean starts from the family's rate, counted as one window,
            # when there is one (a measured rate of the same kernels), never from a
            # profile's biased T(c).
            if kind == "solo":
                own = self._windows.get(key, RESTORED_WINDOWS)
            else:
                ref, own = (ref, 1) if kind == "family" else (None, 0)
            weight = max(1.0 / (own + 1), SOLO_SMOOTHING)
            ref = self._average(key, obs.rate, ref, own, weight)
            kind = "solo"
            if fkey is not None:
                known = self._refs.get(fkey)
                # an average of ~10 windows weighs as ~10 (a restored one had as many)
                behind = self._windows.get(fkey, 0 if known is None else RESTORED_WINDOWS)
                self._average(fkey, obs.rate, known, behind, FAMILY_SMOOTHING)
        if ref is None:
            self._unmeasured[obs.job_id] = obs.end
            self._unmeasured.move_to_end(obs.job_id)
            while len(self._unmeasured) > self.max_jobs:
                self._unmeasured.popitem(last=False)
            return []
        self._unmeasured.pop(obs.job_id, None)
        slowdown = max(1.0, min(ref / obs.rate, 100.0))
        prior = self._jobs.get(obs.job_id)
        sm = _sm_peaks(prior[1] if prior is not None else None, obs)
        recent, case = self._recent(prior, obs.partners, slowdown)
        if prior is None or prior[0] != obs.config:
            # A slowdown is relative to the job's own solo rate at each configuration,
            # so window slowdowns stay comparable across a switch: the recent windows
            # carry on (harm that survives a step-down is still harm), the smoothed
            # value and the sample count restart.
            smoothed, samples = slowdown, 1
        else:
            old = prior[1]
            smoothed = old.slowdown + self.smoothing * (slowdown - old.slowdown)
            samples = old.samples + 1
        self._jobs[obs.job_id] = (
            obs.config,
            ObservedSlowdown(smoothed, samples, obs.end, recent, obs.partners, kind, *sm),
            case,
        )
        self._jobs.move_to_end(obs.job_id)
        while len(self._jobs) > self.max_jobs:
            self._jobs.popitem(last=False)
        if obs.mixed:
            return []
        return [PairSample(obs.job_id, obs.config, p, slowdown, obs.end) for p in obs.partners]

    def _recent(
        self, prior: _JobEntry | None, partners: tuple[str, ...], slowdown: float
    ) -> tuple[tuple[float, ...], _Case | None]:
        """(the job's recent windows after this one, its shared case after it).

        Harm is judged on windows with the same partners: after a move or a partner's
        departure the old windows speak of other tenants (a job moved away from the
        partner that hurt it would be separated again from its new one on them).  A
        few windows alone do not end a case: a partner that pauses to restart at
        another configuration leaves the job alone for a window or two, and the case
        resumes when it is back (restarting the count let a pair above tau share a
        third epoch on Philly ed69ec).
        """
        case = prior[2] if prior is not None else None
        if partners:
            if case is not None and case.partners == frozenset(partners):
                recent = (*case.recent, slowdown)[-self.history :]
            else:
                recent = (slowdown,)
            return recent, _Case(frozenset(partners), recent, 0)
        if prior is not None and not prior[1].partners:
            recent = (*prior[1].recent, slowdown)[-self.history :]
        else:
            recent = (slowdown,)
        if case is None or case.gap >= self.history:
            return recent, None
        return recent, _Case(case.partners, case.recent, case.gap + 1)

    def _average(
        self,
        key: tuple[str, int, str],
        rate: float,
        known: float | None,
        behind: int,
        weight: float,
    ) -> float:
        """Take one solo window into ``key``'s reference (module doc): the ``known`` mean
        of ``behind`` windows (None: none yet) moves by ``weight`` toward ``rate``.
        Returns the new reference."""
        mean = rate if known is None else known + weight * (rate - known)
        self._put_ref(key, mean)
        self._measured.add(key)
        self._windows[key] = min(behind + 1, RESTORED_WINDOWS)
        return mean

    def observed(self) -> dict[str, ObservedSlowdown]:
        """Per job id, what the planner reads (a copy)."""
        return {job: entry for job, (_, entry, _) in self._jobs.items()}

    def unmeasured(self) -> dict[str, float]:
        """Jobs whose newest window had no reference (never seen alone, nor their family,
        in a unit no profile states) -> that window's end (a copy)."""
        return dict(self._unmeasured)

    def forget(self, job_id: str) -> None:
        """Drop a finished job's window history (its references age out by LRU)."""
        self._jobs.pop(job_id, None)
        self._unmeasured.pop(job_id, None)

    def state(self) -> dict[str, list[list[object]]]:
        """Plain data for persistence (references only: window history is short-lived)."""
        return {
            "refs": [
                [j, c, u, r, int((j, c, u) in self._measured)]
                for (j, c, u), r in self._refs.items()
            ]
        }

    def restore(self, state: dict[str, list[list[object]]]) -> None:
        """Load :meth:`state`'s rows.  A row whose rate is no reference (not finite or not
        positive: an older or hostile writer's) is skipped whole: a key marked measured
        must have a rate to read."""
        for job, config, unit, rate, *measured in state.get("refs", []):
            key = (str(job), int(str(config)), str(unit))
            value = float(str(rate))
            if not (math.isfinite(value) and value > 0):
                continue
            self._put_ref(key, value)
            if measured and int(str(measured[0])):
                self._measured.add(key)

    def _reference_of(
        self, key: tuple[str, int, str], fkey: tuple[str, int, str] | None
    ) -> tuple[float | None, str]:
        """(reference rate, what it is) for a job's key: solo, else family, else profile."""
        if key in self._measured:
            return self._refs[key], "solo"
        if fkey is not None and fkey in self._refs:
            return self._refs[fkey], "family"
        return self._refs.get(key), "profile"

    def _put_ref(self, key: tuple[str, int, str], rate: float) -> None:
        self._refs[key] = rate
        self._refs.move_to_end(key)
        while len(self._refs) > self.max_refs:
            dropped, _ = self._refs.popitem(last=False)
            self._measured.discard(dropped)
            self._windows.pop(dropped, None)


def _sm_peaks(
    prior: ObservedSlowdown | None, obs: Observation
) -> tuple[int, tuple[tuple[int, float], ...], float]:
    """(sm_config, sm_buckets, sm_seconds) after ``obs`` (module doc, observed SM demand)."""
    if prior is None or prior.sm_config != obs.config:
        buckets: tuple[tuple[int, float], ...] = ()
        seconds = 0.0
    else:
        buckets, seconds = prior.sm_buckets, prior.sm_seconds
    width = SM_HORIZON_S / SM_BUCKETS
    bucket = math.floor(obs.end / width)
    kept = [(b, p) for b, p in buckets if bucket - SM_BUCKETS < b <= bucket]
    if obs.sm_activity is None:  # nothing new; older buckets still age out
        return (obs.config, tuple(kept), seconds) if kept else (-1, (), 0.0)
    activity = min(float(obs.sm_activity), 1.0)
    if kept and kept[-1][0] == bucket:
        kept[-1] = (bucket, max(kept[-1][1], activity))
    else:
        kept.append((bucket, activity))
    return obs.config, tuple(kept), seconds + obs.seconds
