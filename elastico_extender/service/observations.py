"""The extender's owner of what node agents observe (closed loop, issue 11; spec 3.3, 4.1).

One :class:`ObservationService` per extender holds the core's
:class:`~elastico_extender.core.observations.ObservationBook`, keyed by job id (the
pod uid, as the engine keys jobs).  It

* takes windows from ``POST /observations`` (:meth:`ingest`): each is checked against
  the latest published plan (the pod must run there; the window must be recent and
  newer than the pod's last one; a configuration the agent names must be the one the
  pod runs).  The pod's configuration row and its partners (jobs sharing any of its
  GPUs) come from the published snapshot, never from the agent.  A batch with any
  problem is refused whole (4xx naming each field) and changes nothing;
* turns the solo window of a pod whose family has no profile (every row estimated: an
  unprofiled workload, ``service/families.py``) into that family's measured profile in
  the profile store (``profiles/observed.record_solo_profile``: peak memory, SM activity)
  and tells the engine, which drops the caches holding the old family
  (``Engine.forget_family``): from the next epoch the pod may share (spec 4.1);
* gives the engine ``(observed, now)`` for the next snapshot (:meth:`for_snapshot`),
  and at that moment compares the two newest plans to record pairs the plan separated;
* persists what the closed loop learns in the one
  :class:`~elastico_extender.profiles.loop_store.LoopStore` (reference rates, labelled
  pairs, the online correction; restored at start);
* serves ``GET /observations`` (:meth:`view`, or :meth:`sections` for its pages) and
  Prometheus series
  (:class:`ObservationCollector`): observed vs predicted slowdown per co-located pair,
  prediction error over time, report age and staleness per pod and per agent node, pairs
  separated and why.

An agent that stops reporting changes no decision: the pod's last observed slowdown stays
in the book (with its age, which the planner reads) and the pod shows as stale.

Clock: wall-clock seconds (``time.time``), the unit of the agents' window ends; the
snapshot's ``now`` is the same clock.  A window's end is recorded as ``min(end, now)`` so
a fast agent clock never makes an observation look younger than its arrival.
"""

from __future__ import annotations

import logging
import math
import sqlite3
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import numpy as np
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from elastico_extender.core.closed_loop import ClosedLoop, LabelledPairs, RunningConfig
from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.model import Job, MeasuredRates, ProfileFamily, Snapshot
from elastico_extender.core.observations import (
    Observation,
    ObservationBook,
    ObservedSlowdown,
    PairSample,
    family_key,
    is_family_key,
)
from elastico_extender.core.planner.observed_throughput import solo_rates
from elastico_extender.errors import InvalidProfileError, ProfileStoreError
from elastico_extender.profiles.loop_snapshot import LearnedState
from elastico_extender.profiles.loop_store import LoopStore, PairRecord, ReferenceRow
from elastico_extender.profiles.observed import record_solo_profile
from elastico_extender.profiles.store import ProfileStore
from elastico_extender.service.engine import Published
from elastico_extender.service.predictor import GuardedPredictor
from elastico_extender.service.settings import ServiceSettings
from elastico_extender.service.views import Sections

__all__ = [
    "ROW_LISTS",
    "AgentWindow",
    "ObservationCollector",
    "ObservationRefused",
    "ObservationService",
    "open_store",
]

log = logging.getLogger(__name__)

MAX_PAIRS = 20_000
"""Co-located pairs whose statistics are kept (least recently observed dropped first)."""
MAX_PODS = 100_000
"""Pods whose last report is remembered (for age and staleness)."""
ERROR_HISTORY = 1_440
"""Batches of prediction-error history kept for GET /observations (2 h of 5 s windows)."""
SEPARATIONS_KEPT = 512
"""Recent separations listed by GET /observations."""
ROW_LISTS = ("pods", "unreported", "stale", "pairs")
"""The members of GET /observations with a row per pod or pair, which grow with the
cluster: paged with ``limit`` and ``continue``.  The others are summaries of a bounded
length (at most one entry per node, :data:`ERROR_HISTORY`, :data:`SEPARATIONS_KEPT`),
sent once, on the first page."""


def open_store(settings: ServiceSettings) -> LoopStore | None:
    """The closed loop's store the settings name (the profile store's file by default)."""
    path = settings.observation_store or settings.profile_store
    if not path:
        log.warning(
            "observations.memory_only: set observation_store or profile_store so what the "
            "closed loop learns survives a restart"
        )
        return None
    return LoopStore(path)


@dataclass(frozen=True, slots=True)
class AgentWindow:
    """One pod's window as the node agent reports it (validated wire item)."""

    pod_uid: str
    end: float
    seconds: float
    rate: float
    unit: str
    configuration: str | None = None
    peak_mem_mib: float | None = None
    sm_activity: float | None = None
    mixed: bool = False  # a co-tenant came, went or restarted in it (agent/daemon.py)


class ObservationRefused(Exception):
    """A batch that cannot be taken; ``problems`` name the field of each item."""

    def __init__(self, status: int, problems: list[str], refused: list[int]) -> None:
        super().__init__("; ".join(problems))
        self.status = status
        self.problems = problems
        self.refused = refused


@dataclass(slots=True)
class PodReport:
    node: str
    received: float
    end: float
    seconds: float
    rate: float
    unit: str
    config: int
    partners: tuple[str, ...]
    window_slowdown: float | None
    peak_mem_mib: float | None
    sm_activity: float | None
    mixed: bool = False
    agent_end: float = -math.inf
    """The window's end as the agent's clock wrote it (``end`` is clamped to arrival):
    the next window of the pod must end after it (a resent window is refused even when
    the agent's clock runs ahead).  Windows may overlap: an agent may report a rate over
    a sliding span."""


@dataclass(slots=True)
class PairStat:
    """Observed vs predicted slowdown of ``victim`` next to ``partner``."""

    observed: float
    """Exponentially weighted (the book's smoothing) window slowdown of the victim."""
    last: float
    predicted: float | None
    tolerance: float | None
    windows: int
    last_end: float
    separated: bool = False


CORRECTION_SAVE_SECONDS = 30.0
"""How often at most the online correction is written to the loop store (it is bounded
in rows; a restart loses at most this much learning)."""


class ObservationService:
    """Holds the observation book for the extender; thread-safe (one lock, and one for
    the store's writes, taken after it is released)."""

    def __init__(
        self,
        settings: ServiceSettings,
        store: LoopStore | None = None,
        *,
        book: ObservationBook | None = None,
        loop: ClosedLoop | None = None,
        profiles: ProfileStore | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self.store = store
        self.profiles = profiles  # where unprofiled workloads' solo windows are written
        self._measured: Callable[[str], None] = lambda name: None
        # The closed loop (core.closed_loop): its book is this service's book, and the
        # pairs the windows label teach its online correction (the predictor the
        # planner uses), exactly as in the simulator.
        self.loop = loop or ClosedLoop(book=book)
        self.book = self.loop.book
        self.clock = clock
        self._published: Callable[[], Published | None] = lambda: None
        self._lock = threading.Lock()
        # The online correction is read by the engine's epoch thread (every prediction)
        # and changed by the ingest and checkpoint threads: every read and change of it
        # holds this lock, the innermost one (nothing is called out while holding it).
        self.correction_lock = threading.Lock()
        # What a change taught is written to the store after ``_lock`` is released (a
        # slow disk must not stall the event loop's views, which take ``_lock``): queued
        # under ``_lock`` in the order it was learned, written in that order under
        # ``_store_lock`` by whichever queuing thread takes it first; each writes what is
        # queued before it returns, so the queue holds at most one entry per thread.
        self._store_lock = threading.Lock()
        self._pending: deque[Callable[[], None]] = deque()
        self._saved_at = 0.0  # when the correction was last written (under _store_lock)
        self._reports: OrderedDict[str, PodReport] = OrderedDict()
        self._agents: dict[str, float] = {}  # node -> when its agent last reported
        self._pairs: OrderedDict[tuple[str, str], PairStat] = OrderedDict()
        self._errors: deque[dict[str, float]] = deque(maxlen=ERROR_HISTORY)
        self._error_sum = 0.0
        self._error_count = 0
        self._separations: deque[dict[str, Any]] = deque(maxlen=SEPARATIONS_KEPT)
        self.separated_total: dict[str, int] = {}
        self.windows_total: dict[str, int] = {}
        # Per published snapshot (built once, reused by every agent's POST until the next
        # epoch).
        self._index = SnapshotIndex(None, {}, {}, frozenset())
        self._seen_plan: Published | None = None
        # Only the leader learns (docs/high-availability.md); one replica: always.
        self._leader: Callable[[], bool] = lambda: True
        self._holder: Callable[[], str] = lambda: ""
        self.learned_version = 0
        """Bumped whenever the learned state changes (the checkpoint writes only then)."""
        if store is not None:
            store.load_references(self.book)
            if self.loop.correction is not None:
                store.load_correction(self.loop.correction)

    def guarded(self, predictor: SlowdownPredictor) -> SlowdownPredictor:
        """``predictor`` (the correction, as the engine's predictor) answering under
        :attr:`correction_lock`, so no prediction reads a half-applied update."""
        return GuardedPredictor(predictor, self.correction_lock)

    def close(self) -> None:
        """Close the store (the app's shutdown); what it holds is already written."""
        if self.store is not None:
            with self._store_lock:
                if self.loop.correction is not None:
                    try:
                        self.store.save_correction(self.loop.correction, self.correction_lock)
                    except sqlite3.Error as exc:  # a full or read-only disk: said, not raised
                        log.warning(
                            "observations.loop_not_saved",
                            extra={"path": self.store.path, "error": str(exc)},
                        )
                self.store.close()

    def attach(
        self,
        published: Callable[[], Published | None],
        measured: Callable[[str], None] | None = None,
    ) -> None:
        """Where the latest published plan comes from (the engine), and whom to tell that
        a family's profile was measured (the engine drops what it built from the old one)."""
        self._published = published
        if measured is not None:
            self._measured = measured

    def gate(self, is_leader: Callable[[], bool], holder: Callable[[], str]) -> None:
        """Learn only while ``is_leader()``: a follower refuses windows with 503 naming the
        Lease holder, so what the cluster learned has one owner, the leader, whose
        checkpoint the next leader restores (``service/checkpoint.py``)."""
        self._leader, self._holder = is_leader, holder

    # -- ingest -------------------------------------------------------------------------
    def ingest(self, node: str, windows: Sequence[AgentWindow]) -> dict[str, Any]:
        """Record a batch of one agent's windows, or refuse it whole (ObservationRefused)."""
        if not self._leader():
            holder = self._holder() or "none yet"
            raise ObservationRefused(
                503,
                [
                    f"this replica is not the ElastiCo leader (Lease holder: {holder}); post "
                    "to the extender Service, which selects the leader, and retry"
                ],
                [],
            )
        now = self.clock()
        pub = self._published()
        if pub is None:
            raise ObservationRefused(409, ["no plan published yet; retry after an epoch"], [])
        problems: list[str] = []
        refused: list[int] = []
        accepted: list[tuple[AgentWindow, Observation, float | None, float | None]] = []
        seen: set[str] = set()
        with self._lock:
            index = self._snapshot_index(pub.snapshot)
            running, partners_of = index.running, index.partners
            if node not in pub.snapshot.devices.node_position:
                self._count("refused", len(windows))
                raise ObservationRefused(
                    422,
                    [f"node: {node!r} is not a node of the cluster (in the published plan)"],
                    list(range(len(windows))),
                )
            for i, w in enumerate(windows):
                where = f"observations[{i}]"
                found = self._check(where, w, node, now, running, pub, seen)
                seen.add(w.pod_uid)
                if found:
                    problems.extend(found)
                    refused.append(i)
                    continue
                job = running[w.pod_uid]
                config = int(job.current_config or 0)  # running jobs always have one
                a = pub.plan.assignments.get(job.id)
                kept = a is not None and a.devices == job.devices and a.config_index == config
                predicted = float(a.predicted_slowdown) if kept and a is not None else None
                tolerance = (
                    float(a.tolerance)
                    if kept and a is not None and math.isfinite(a.tolerance)
                    else None
                )
                obs = Observation(
                    job_id=job.id,
                    config=config,
                    end=min(w.end, now),
                    seconds=w.seconds,
                    rate=w.rate,
                    unit=w.unit,
                    partners=partners_of.get(job.id, ()),
                    peak_mem_mib=w.peak_mem_mib,
                    sm_activity=w.sm_activity,
                    mixed=w.mixed,
                )
                invalid = obs.problems()
                if invalid:
                    problems.extend(f"{where}: {p}" for p in invalid)
                    refused.append(i)
                    continue
                accepted.append((w, obs, predicted, tolerance))
            if problems:
                self._count("refused", len(windows))
                raise ObservationRefused(422, problems, refused)
            refs, samples, labelled = self._record(node, now, pub, accepted)
            if accepted:
                self.learned_version += 1
                self._queue_write(lambda: self._write_learned(now, refs, samples, labelled))
        self._write_queued()
        self._profile_unprofiled(pub, [obs for _, obs, _, _ in accepted], now)
        return {"accepted": len(accepted), "pair_samples": len(samples)}

    def _queue_write(self, write: Callable[[], None]) -> None:
        """Queue a store write (the caller holds ``_lock`` and calls
        :meth:`_write_queued` once it released it)."""
        if self.store is not None:
            self._pending.append(write)

    def _write_queued(self) -> None:
        """Write the queued store writes, oldest first (called without ``_lock``: only
        the thread that queued waits for the disk)."""
        with self._store_lock:
            while self._pending:
                self._pending.popleft()()

    def _write_learned(
        self,
        now: float,
        refs: list[ReferenceRow],
        samples: list[PairRecord],
        labelled: LabelledPairs | None,
    ) -> None:
        """Persist what one batch taught: references, pair records, labelled samples and,
        at most every ``CORRECTION_SAVE_SECONDS``, the correction (under ``_store_lock``)."""
        assert self.store is not None  # queued only with a store
        try:
            self.store.put_references(refs, now)
            self.store.add_pair_records(samples)
        except sqlite3.Error as exc:  # degrade: kept in memory, said in the log
            log.warning("observations.persist_failed", extra={"error": str(exc)})
        if labelled is None or self.loop.correction is None:
            return
        try:
            # the samples `elastico train-iac --from-store` retrains the DNN on
            self.store.add_samples(labelled.features, labelled.observed, at=now)
            if now - self._saved_at >= CORRECTION_SAVE_SECONDS:
                self.store.save_correction(self.loop.correction, self.correction_lock)
                self._saved_at = now
        except sqlite3.Error as exc:
            log.warning(
                "observations.loop_not_saved",
                extra={"path": self.store.path, "error": str(exc)},
            )

    def _profile_unprofiled(self, pub: Published, windows: list[Observation], now: float) -> None:
        """Solo windows of pods whose family has no measured row become its profile."""
        if self.profiles is None:
            return
        measured: set[str] = set()
        for obs in windows:
            pj = pub.pods.get(obs.job_id)
            if pj is None or obs.partners or obs.mixed or pj.family.workload in measured:
                continue  # a mixed window ran shared for part of it: no solo profile
            flags = pj.family.estimated
            if flags is None or not bool(np.all(flags)):
                continue  # profiled (catalog or measured rows): nothing to learn here
            try:
                if record_solo_profile(self.profiles, pj.family, obs, measured_at=now):
                    measured.add(pj.family.workload)
            except (sqlite3.Error, ProfileStoreError, InvalidProfileError) as exc:
                log.warning("observations.profile_not_saved", extra={"error": str(exc)})
        for name in sorted(measured):
            log.info("observations.profile_measured", extra={"family": name})
            self._measured(name)

    def _check(
        self,
        where: str,
        w: AgentWindow,
        node: str,
        now: float,
        running: Mapping[str, Job],
        pub: Published,
        seen: set[str],
    ) -> list[str]:
        found = []
        if w.pod_uid in seen:
            found.append(f"{where}.pod_uid: {w.pod_uid!r} appears twice in one batch")
        job = running.get(w.pod_uid)
        if job is None:
            found.append(
                f"{where}.pod_uid: unknown pod {w.pod_uid!r} (not running in the published plan)"
            )
        elif job.devices and job.devices[0][0] != node:  # an agent measures its own node only
            found.append(
                f"{where}.pod_uid: pod {w.pod_uid!r} runs on node {job.devices[0][0]!r}, "
                f"not on the reporting node {node!r}"
            )
        age = now - w.end
        if age > self.settings.observation_max_age_seconds:
            found.append(
                f"{where}.end: window ended {age:.4g} s ago, older than the "
                f"{self.settings.observation_max_age_seconds:g} s bound (stale)"
            )
        elif -age > self.settings.observation_max_skew_seconds:
            found.append(
                f"{where}.end: window ends {-age:.4g} s in the future (agent clock ahead by more "
                f"than {self.settings.observation_max_skew_seconds:g} s)"
            )
        if w.seconds > self.settings.observation_max_age_seconds:
            found.append(
                f"{where}.seconds: a {w.seconds:g} s window is longer than the "
                f"{self.settings.observation_max_age_seconds:g} s bound"
            )
        last = self._reports.get(w.pod_uid)
        if last is not None:
            ended = max(last.end, last.agent_end)  # as the agent wrote it, not clamped
            if w.end <= ended:
                found.append(
                    f"{where}.end: not after the pod's last window (ended {ended:.3f}): "
                    "out of order or repeated"
                )
        if job is not None and w.peak_mem_mib is not None:
            devices = pub.snapshot.devices
            at = [devices.index[d] for d in job.devices if d in devices.index]
            held = float(devices.memory_total[at].sum())
            if at and w.peak_mem_mib > held:  # impossible: it would become a family's profile
                found.append(
                    f"{where}.peak_mem_mib: {w.peak_mem_mib:.6g} MiB is more than the "
                    f"{held:g} MiB of GPU memory the pod holds"
                )
        if job is not None and w.configuration is not None:
            pj = pub.pods.get(job.id)
            if pj is not None:
                running_label = pj.family.configs[int(job.current_config or 0)].label
                if w.configuration != running_label:
                    found.append(
                        f"{where}.configuration: the pod runs {running_label!r}, the window "
                        f"was measured under {w.configuration!r}"
                    )
        return found

    def _record(
        self,
        node: str,
        now: float,
        pub: Published,
        accepted: list[tuple[AgentWindow, Observation, float | None, float | None]],
    ) -> tuple[list[ReferenceRow], list[PairRecord], LabelledPairs | None]:
        refs: list[ReferenceRow] = []
        samples: list[PairRecord] = []
        errors: list[float] = []
        windows: list[list[PairSample]] = []
        running = self._snapshot_index(pub.snapshot).running
        devices = pub.snapshot.devices
        # what the loop needs of every job these windows name, to label and teach pairs
        configs = self._loop_configs(
            pub.snapshot, {j for _, obs, _, _ in accepted for j in (obs.job_id, *obs.partners)}
        )
        for w, obs, predicted, tolerance in accepted:
            pj = pub.pods.get(obs.job_id)
            key = (obs.job_id, obs.config, obs.unit)
            job = running.get(obs.job_id)
            # the same kernels run at the same solo rate on the same GPU model only
            family = None
            if job is not None and job.devices:
                device = devices.index.get(job.devices[0])
                product = devices.products[device] if device is not None else "unknown"
                family = f"{job.family}@{product}"
            family_before = (
                self.book.family_reference(family, obs.config, obs.unit) if family else None
            )
            if (
                pj is not None
                and obs.unit == pj.family.throughput_unit
                and self.book.reference(*key) is None
                and not _estimated(pj.family.estimated, obs.config)
            ):
                # a framework counter in the profile's unit: its measured T(c) is a solo rate
                self.book.set_reference(*key, float(pj.family.throughput[obs.config]))
            before = self.book.reference(*key)
            pair_samples = self.book.record(obs, family)
            windows.append(pair_samples)
            after = self.book.reference(*key)
            if after is not None and after != before:
                # the book moves a reference on a window alone only: measured alone
                refs.append((*key, after, True))
            family_after = (
                self.book.family_reference(family, obs.config, obs.unit) if family else None
            )
            if family and family_after is not None and family_after != family_before:
                refs.append((*family_key(family, obs.config, obs.unit), family_after, True))
            window = pair_samples[0].slowdown if pair_samples else None
            if window is None and after is not None and obs.rate > 0:  # alone, or mixed
                window = max(1.0, after / obs.rate)
            self._reports[obs.job_id] = PodReport(
                node,
                now,
                obs.end,
                obs.seconds,
                obs.rate,
                obs.unit,
                obs.config,
                obs.partners,
                window,
                obs.peak_mem_mib,
                obs.sm_activity,
                obs.mixed,
                w.end,
            )
            self._reports.move_to_end(obs.job_id)
            for s in pair_samples:
                samples.append(
                    PairRecord(s.victim, s.victim_config, s.partner, s.slowdown, predicted, s.end)
                )
                self._pair(s.victim, s.partner, s.slowdown, predicted, tolerance, s.end)
            if pair_samples and predicted is not None:
                errors.append(abs(predicted - pair_samples[0].slowdown) / pair_samples[0].slowdown)
        while len(self._reports) > MAX_PODS:
            self._reports.popitem(last=False)
        self._agents[node] = now
        labelled = self._teach(windows, configs, pub)
        self._count("accepted", len(accepted))
        if errors:
            self._error_sum += sum(errors)
            self._error_count += len(errors)
            self._errors.append(
                {"time": now, "mean_abs_error": sum(errors) / len(errors), "windows": len(errors)}
            )
        return refs, samples, labelled

    def _teach(
        self,
        windows: list[list[PairSample]],
        running: Mapping[str, RunningConfig],
        pub: Published,
    ) -> LabelledPairs | None:
        """The pairs the windows label (``ClosedLoop.label``) teach the online correction
        (one vectorised call); returns them, to be written to the store."""
        if not any(windows) or self.loop.correction is None:
            return None
        with self.correction_lock:
            return self.loop.learn(windows, running, pub.snapshot.families)

    def _pair(
        self,
        victim: str,
        partner: str,
        slowdown: float,
        predicted: float | None,
        tolerance: float | None,
        end: float,
    ) -> None:
        stat = self._pairs.get((victim, partner))
        if stat is None:
            stat = PairStat(slowdown, slowdown, predicted, tolerance, 0, end)
            self._pairs[(victim, partner)] = stat
        else:
            stat.observed += self.book.smoothing * (slowdown - stat.observed)
            stat.last = slowdown
            stat.predicted = predicted if predicted is not None else stat.predicted
            stat.tolerance = tolerance if tolerance is not None else stat.tolerance
            stat.last_end = end
            stat.separated = False
        stat.windows += 1
        self._pairs.move_to_end((victim, partner))
        while len(self._pairs) > MAX_PAIRS:
            self._pairs.popitem(last=False)

    def _count(self, result: str, n: int) -> None:
        self.windows_total[result] = self.windows_total.get(result, 0) + n

    def _snapshot_index(self, snapshot: Snapshot) -> SnapshotIndex:
        """``snapshot`` indexed (once per snapshot: every agent's POST until the next
        epoch reads the same); the agents of nodes that left the cluster are forgotten."""
        if self._index.snapshot is not snapshot:
            self._index = index_snapshot(snapshot)
            nodes = snapshot.devices.node_position
            self._agents = {n: t for n, t in self._agents.items() if n in nodes}
        return self._index

    def _loop_configs(self, snapshot: Snapshot, job_ids: Iterable[str]) -> dict[str, RunningConfig]:
        """What the loop needs of each running job of ``job_ids`` to label and learn its
        pairs (family, configuration, GPU memory, crowded); unknown jobs are left out."""
        index = self._snapshot_index(snapshot)
        jobs, crowded = index.running, index.crowded
        devices = snapshot.devices
        out: dict[str, RunningConfig] = {}
        for job_id in job_ids:
            job = jobs.get(job_id)
            if job is None or job.current_config is None:
                continue
            device = devices.index.get(job.devices[0]) if job.devices else None
            gib = devices.memory_total[device] / 1024.0 if device is not None else 40.0
            out[job_id] = RunningConfig(
                job.family, int(job.current_config), float(gib), job_id in crowded
            )
        return out

    # -- checkpoint (service/checkpoint.py) ---------------------------------------------
    def learned_state(self, history: int) -> LearnedState:
        """What the loop learned, oldest rows first: the correction's rows and ring, the
        book's references and the newest ``history`` samples and per-pod records."""
        with self._lock:
            correction = self.loop.correction
            with self.correction_lock:
                config = correction.rows("config") if correction is not None else []
                family = correction.rows("family") if correction is not None else []
                ring = correction.neighbour_rows() if correction is not None else []
            state = LearnedState(
                config=config,
                family=family,
                ring=ring,
                references=[
                    (str(j), int(str(c)), str(u), float(str(r)), bool(int(str(m))))
                    for j, c, u, r, m in self.book.state()["refs"]
                ],
                written_at=self.clock(),
            )
            # families' and running pods' references last: a bound drops departed pods' first
            running = self._reports.keys()
            state.references.sort(key=lambda row: row[0] in running or is_family_key(row[0]))
        if self.store is not None and history > 0:
            try:
                state.samples = self.store.recent_samples(history)
                state.records = self.store.pair_records(history)
            except sqlite3.Error as exc:
                log.warning("observations.history_unread", extra={"error": str(exc)})
        return state

    def merge_learned(self, state: LearnedState) -> None:
        """Merge another replica's learned state (a checkpoint) into this one and its store:
        on a key both hold, the checkpoint's row wins (it is the newest leader's); rows only
        this replica holds are kept."""
        with self._lock:
            correction = self.loop.correction
            if correction is not None:
                with self.correction_lock:
                    correction.restore_rows("config", state.config)
                    correction.restore_rows("family", state.family)
                    correction.restore_neighbours(state.ring)
            refs = [[j, c, u, r, int(m)] for j, c, u, r, m in state.references]
            self.book.restore({"refs": refs})
            self.learned_version += 1
            self._queue_write(lambda: self._write_merged(state))
        self._write_queued()

    def _write_merged(self, state: LearnedState) -> None:
        """Persist a merged checkpoint (under ``_store_lock``)."""
        assert self.store is not None  # queued only with a store
        try:
            self.store.put_references(state.references, self.clock())
            if self.loop.correction is not None:
                self.store.save_correction(self.loop.correction, self.correction_lock)
            self.store.merge_history(state.samples, state.records)
        except sqlite3.Error as exc:
            log.warning("observations.merge_not_saved", extra={"error": str(exc)})

    # -- the engine's side --------------------------------------------------------------
    def for_snapshot(self) -> tuple[Mapping[str, ObservedSlowdown], float]:
        """``(observed, now)`` for the next snapshot; notes what the newest plan separated."""
        pub = self._published()
        with self._lock:
            if pub is not None and pub is not self._seen_plan:
                self._note_separations(pub)
                self._forget_departed(pub)
                self._seen_plan = pub
            return self.book.observed(), self.clock()

    def solo_rates(
        self, families: Mapping[str, ProfileFamily], product: str | None
    ) -> dict[str, MeasuredRates]:
        """Per family of the next snapshot, the solo rates the book measured at each
        configuration on GPU model ``product`` (the planner ranks configurations by
        them: observed throughput)."""
        if product is None:
            return {}
        with self._lock:
            return solo_rates(self.book, families, product)

    def unmeasured(self) -> dict[str, float]:
        """Running pods whose windows have no reference yet -> newest window end (they run
        alone first: ``planner.protect``)."""
        with self._lock:
            return self.book.unmeasured()

    def _forget_departed(self, pub: Published) -> None:
        """Jobs no longer running leave the book's window history, the report list and the
        pairs (their references and pair samples stay, in the book and the store, for a
        job id that returns)."""
        running = self._snapshot_index(pub.snapshot).running
        for job_id in [j for j in self._reports if j not in running]:
            del self._reports[job_id]
            self.book.forget(job_id)
        for key in [k for k in self._pairs if k[0] not in running or k[1] not in running]:
            del self._pairs[key]

    def _note_protections(self, after: Published) -> None:
        """The planner's own record of what it did about observed harm, where the plan
        carries one (``Plan.protections``: victim, partner, action, actor, observed
        slowdown, tolerance; the closed loop's Protect pass).  A step-down leaves the
        pair together (listed, not counted as a separation)."""
        for victim, partner, action, actor, observed, tolerance in getattr(
            after.plan, "protections", ()
        ):
            if action != "step-down":
                for key in ((victim, partner), (partner, victim)):
                    stat = self._pairs.get(key)
                    if stat is not None:
                        stat.separated = True
            self.separated_total[action] = self.separated_total.get(action, 0) + 1
            pj = after.pods.get(actor)
            who = pj.key if pj is not None else actor
            vj, pp = after.pods.get(victim), after.pods.get(partner)
            self._separations.append(
                {
                    "epoch": after.plan.epoch,
                    "time": after.published_at,
                    "victim": vj.key if vj is not None else victim,
                    "partner": pp.key if pp is not None else partner,
                    "action": action,
                    "observed_slowdown": float(observed),
                    "predicted_slowdown": None,
                    "tolerance": float(tolerance),
                    "why": (
                        f"planner: {action} of {who}; observed slowdown {float(observed):.2f} "
                        f"above tolerance {float(tolerance):.2f}"
                    ),
                }
            )

    def _note_separations(self, after: Published) -> None:
        """Observed pairs that share a GPU in ``after``'s snapshot (what runs) and that its
        plan no longer co-locates: each plan is looked at once, when it is first seen."""
        running = self._snapshot_index(after.snapshot).running
        new = after.plan.assignments
        preempted = set(after.plan.preempted)
        self._note_protections(after)
        for (victim, partner), stat in self._pairs.items():
            if stat.separated:
                continue
            a, b = running.get(victim), running.get(partner)
            if a is None or b is None or not set(a.devices) & set(b.devices):
                continue
            x, y = new.get(victim), new.get(partner)
            if x is None or y is None:
                if not {victim, partner} & preempted:
                    continue  # not in the plan (ending): no decision to report
            elif set(x.devices) & set(y.devices):
                continue
            stat.separated = True
            reverse = self._pairs.get((partner, victim))
            if reverse is not None:
                reverse.separated = True  # one separation, reported once
            moved = [
                (job, z)
                for job, z in ((victim, x), (partner, y))
                if z is not None and z.action.value != "keep"
            ]
            action = moved[0][1].action.value if moved else "preempt"
            self.separated_total[action] = self.separated_total.get(action, 0) + 1

            def pod(job_id: str) -> str:
                pj = after.pods.get(job_id)
                return pj.key if pj is not None else job_id

            how = "; ".join(
                f"{pod(job)} {z.action.value} to {z.configuration.label} on "
                + ",".join(f"{n}/{d}" for n, d in z.devices)
                for job, z in moved
            )
            tol = f"{stat.tolerance:.2f}" if stat.tolerance is not None else "none"
            pred = f"{stat.predicted:.2f}" if stat.predicted is not None else "none"
            if x is None or y is None:
                how = "; ".join(
                    f"{pod(job)} preempted" for job in (victim, partner) if job in preempted
                )
            self._separations.append(
                {
                    "epoch": after.plan.epoch,
                    "time": after.published_at,
                    "victim": pod(victim),
                    "partner": pod(partner),
                    "action": action,
                    "observed_slowdown": stat.observed,
                    "predicted_slowdown": stat.predicted,
                    "tolerance": stat.tolerance,
                    "why": (
                        f"{how or 'both kept their devices'}; observed slowdown "
                        f"{stat.observed:.2f} (predicted {pred}, tolerance {tol}) "
                        f"after {stat.windows} windows"
                    ),
                }
            )

    # -- views --------------------------------------------------------------------------
    def staleness(self) -> list[dict[str, Any]]:
        """Per running pod: age of its last report and whether it is stale (or never seen)."""
        pub = self._published()
        now = self.clock()
        with self._lock:  # a copy: reports are replaced, never changed
            reports = dict(self._reports)
        return self._staleness(pub, now, reports)

    def _staleness(
        self, pub: Published | None, now: float, reports: Mapping[str, PodReport]
    ) -> list[dict[str, Any]]:
        if pub is None:
            return []
        bound = self.settings.observation_stale_seconds
        rows = []
        for job in pub.snapshot.jobs:
            if not job.running:
                continue
            pj = pub.pods.get(job.id)
            report = reports.get(job.id)
            age = None if report is None else max(0.0, now - report.received)
            rows.append(
                {
                    "id": job.id,
                    "pod": pj.key if pj else job.id,
                    "node": job.devices[0][0] if job.devices else None,
                    "age_seconds": age,
                    "stale": age is not None and age > bound,
                    "reported": report is not None,
                }
            )
        return rows

    def view(self) -> dict[str, Any]:
        """``GET /observations``: pods, pairs, prediction error, separations, agents."""
        pub = self._published()
        now = self.clock()
        pods_by_id = pub.pods if pub is not None else {}

        def pod(job_id: str) -> str:
            pj = pods_by_id.get(job_id)
            return pj.key if pj is not None else job_id

        # The ingest threads change all of this, and the event loop waits for the lock:
        # under it, a shallow copy (reports and the book's entries are replaced, never
        # changed; pair stats, which ingest changes in place, are copied); the rows are
        # built after it is released.
        with self._lock:
            reports = [
                (job_id, r, self.book.reference(job_id, r.config, r.unit))
                for job_id, r in self._reports.items()
            ]
            observed = self.book.observed()
            stats = [(v, p, replace(s)) for (v, p), s in self._pairs.items()]
            error_sum, error_count = self._error_sum, self._error_count
            errors = list(self._errors)
            separations = list(self._separations)
            agents = dict(self._agents)
            windows_total = dict(self.windows_total)
        stale = {
            row["id"]: row
            for row in self._staleness(pub, now, {job_id: r for job_id, r, _ in reports})
        }
        pods = []
        for job_id, r, reference_rate in reports:
            if job_id not in stale:
                continue
            o = observed.get(job_id)
            pods.append(
                {
                    "id": job_id,
                    "pod": pod(job_id),
                    "node": r.node,
                    "config_index": r.config,
                    "unit": r.unit,
                    "rate": r.rate,
                    "window_seconds": r.seconds,
                    "window_slowdown": r.window_slowdown,
                    "window_mixed": r.mixed,
                    "observed_slowdown": o.slowdown if o else None,
                    "samples": o.samples if o else 0,
                    "recent": list(o.recent) if o else [],
                    "partners": [pod(p) for p in r.partners if p in pods_by_id],
                    "peak_mem_mib": r.peak_mem_mib,
                    "sm_activity": r.sm_activity,
                    "age_seconds": stale[job_id]["age_seconds"],
                    "stale": stale[job_id]["stale"],
                    "reference_rate": reference_rate,
                    # what the slowdown rests on: its own solo rate, its family's, a profile
                    "reference": o.reference if o else None,
                }
            )
        pairs = [
            {
                "victim": pod(v),
                "partner": pod(p),
                "observed_slowdown": s.observed,
                "last_window_slowdown": s.last,
                "predicted_slowdown": s.predicted,
                "error": None if s.predicted is None else s.predicted - s.observed,
                "tolerance": s.tolerance,
                "windows": s.windows,
                "age_seconds": max(0.0, now - s.last_end),
                "separated": s.separated,
            }
            for v, p, s in stats
            if v in pods_by_id and p in pods_by_id  # a pod that left (requeued, deleted)
        ]
        return {
            "now": now,
            "stale_after_seconds": self.settings.observation_stale_seconds,
            "pods": pods,
            "unreported": [row for row in stale.values() if not row["reported"]],
            "stale": [row for row in stale.values() if row["stale"]],
            "pairs": pairs,
            "prediction_error": {
                "mean_abs_error": error_sum / error_count if error_count else None,
                "windows": error_count,
                "history": errors,
            },
            "separations": separations,
            "agents": {
                node: {"last_report_age_seconds": max(0.0, now - t)} for node, t in agents.items()
            },
            "windows_total": windows_total,
        }

    def sections(self) -> Sections:
        """:meth:`view` split for its pages: the :data:`ROW_LISTS`, and the summary."""
        view = self.view()
        return Sections({name: view.pop(name) for name in ROW_LISTS}, view)

    def pair_stats(self) -> Iterable[tuple[str, str, PairStat]]:
        with self._lock:
            return [(v, p, s) for (v, p), s in self._pairs.items()]

    def harmful_pairs(self) -> int:
        """Pairs of running pods that share a GPU in the published snapshot, are not
        separated, and where either pod's observed slowdown next to the other exceeds
        its tolerance (each pair counted once)."""
        pub = self._published()
        if pub is None:
            return 0
        with self._lock:
            partners = self._snapshot_index(pub.snapshot).partners
            return len(
                {
                    frozenset(key)
                    for key, s in self._pairs.items()
                    if not s.separated
                    and key[1] in partners.get(key[0], ())
                    and s.tolerance is not None
                    and s.observed > s.tolerance
                }
            )

    def error_totals(self) -> tuple[float, int]:
        with self._lock:
            return self._error_sum, self._error_count

    def agent_ages(self) -> dict[str, float]:
        now = self.clock()
        with self._lock:
            return {node: max(0.0, now - t) for node, t in self._agents.items()}


def _estimated(flags: Any, row: int) -> bool:
    return flags is not None and bool(flags[row])


class ObservationCollector(Collector):
    """Prometheus series read from the service at scrape time (labels only for live pods).

    ======================================  =======  =====================================
    metric                                  type     labels
    ======================================  =======  =====================================
    elastico_observed_slowdown              gauge    victim, partner (ns/name, smoothed)
    elastico_predicted_slowdown             gauge    victim, partner (the plan's)
    elastico_prediction_error_ratio         summary  |predicted - observed| / observed
    elastico_observation_age_seconds        gauge    pod (since its last report)
    elastico_observation_stale              gauge    pod (1 when older than the bound)
    elastico_agent_report_age_seconds       gauge    node
    elastico_harmful_pairs_observed         gauge    (co-located pairs above tolerance)
    elastico_observation_windows_total      counter  result (accepted, refused)
    elastico_pairs_separated_total          counter  action (reconfigure, migrate, ...)
    ======================================  =======  =====================================
    """

    def __init__(self, service: ObservationService) -> None:
        self.service = service

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: series depend on the cluster

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        observed = GaugeMetricFamily(
            "elastico_observed_slowdown",
            "Observed slowdown of victim next to partner (smoothed over windows)",
            labels=["victim", "partner"],
        )
        predicted = GaugeMetricFamily(
            "elastico_predicted_slowdown",
            "The plan's predicted slowdown of victim while it shares with partner",
            labels=["victim", "partner"],
        )
        rows = svc.staleness()
        live = {row["id"]: row["pod"] for row in rows}  # labelled namespace/name, as /observations
        for victim, partner, stat in svc.pair_stats():
            if stat.separated or victim not in live or partner not in live:
                continue  # series only for unseparated pairs of running pods
            labels = [live[victim], live[partner]]
            observed.add_metric(labels, stat.observed)
            if stat.predicted is not None:
                predicted.add_metric(labels, stat.predicted)
        yield observed
        yield predicted
        total, count = svc.error_totals()
        yield SummaryMetricFamily(
            "elastico_prediction_error_ratio",
            "Relative error of the predicted slowdown per observed co-located window",
            count_value=count,
            sum_value=total,
        )
        age = GaugeMetricFamily(
            "elastico_observation_age_seconds",
            "Seconds since the pod's last report",
            labels=["pod"],
        )
        stale = GaugeMetricFamily(
            "elastico_observation_stale",
            "1 when a running pod's last report is older than observation_stale_seconds",
            labels=["pod"],
        )
        for row in rows:
            if row["age_seconds"] is not None:
                age.add_metric([row["pod"]], row["age_seconds"])
                stale.add_metric([row["pod"]], 1.0 if row["stale"] else 0.0)
        yield age
        yield stale
        agents = GaugeMetricFamily(
            "elastico_agent_report_age_seconds",
            "Seconds since the node's agent last reported",
            labels=["node"],
        )
        for node, seconds in svc.agent_ages().items():
            agents.add_metric([node], seconds)
        yield agents
        yield GaugeMetricFamily(
            "elastico_harmful_pairs_observed",
            "Co-located pairs where a pod's observed slowdown exceeds its tolerance",
            value=svc.harmful_pairs(),
        )
        windows = CounterMetricFamily(
            "elastico_observation_windows", "Agent windows by result", labels=["result"]
        )
        for result, n in dict(svc.windows_total).items():
            windows.add_metric([result], n)
        yield windows
        separated = CounterMetricFamily(
            "elastico_pairs_separated",
            "Observed co-located pairs the plan separated, by the action that did it",
            labels=["action"],
        )
        for action, n in dict(svc.separated_total).items():
            separated.add_metric([action], n)
        yield separated


class SnapshotIndex(NamedTuple):
    """A published snapshot indexed for the agents' reports until the next epoch."""

    snapshot: Snapshot | None
    running: dict[str, Job]  # running jobs by id
    partners: dict[str, tuple[str, ...]]  # job id -> the running jobs sharing any of its GPUs
    crowded: frozenset[str]  # jobs with two or more partners on one GPU (RunningConfig)


def index_snapshot(snapshot: Snapshot) -> SnapshotIndex:
    """Index ``snapshot``'s running jobs, their partners and the crowded ones."""
    running: dict[str, Job] = {}
    on: dict[tuple[str, int], list[str]] = {}
    for job in snapshot.jobs:
        if job.running:
            running[job.id] = job
            for ref in job.devices:
                on.setdefault(ref, []).append(job.id)
    partners: dict[str, set[str]] = {}
    for ids in on.values():
        if len(ids) > 1:
            for job_id in ids:
                partners.setdefault(job_id, set()).update(x for x in ids if x != job_id)
    crowded = frozenset(j for ids in on.values() if len(ids) > 2 for j in ids)
    return SnapshotIndex(
        snapshot, running, {job_id: tuple(sorted(p)) for job_id, p in partners.items()}, crowded
    )
