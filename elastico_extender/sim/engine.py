"""The discrete-event simulator: its own clock and cluster view around any :class:`Policy`.

The engine drives the policy exactly as the extender service does: each
scheduling epoch it builds a core :class:`Snapshot` (nodes, running jobs with
their configuration and devices, pending jobs), calls ``policy.plan(snapshot,
previous)`` and applies the returned :class:`Plan`.  Nothing in the core knows
it is simulated.

Time and epochs
---------------
Scheduling happens on a grid of epochs of ``epoch_s`` seconds (the spec's
Delta T is 5 s; traces spanning days use 60 s by default, see the CLI).
Between epochs, jobs progress at

    rate_j = (T_true(c_j) / T_true(default_j)) / S_j          (0 while paying a reconfiguration)

work units per second, where a job's work is its trace duration at the default
configuration alone and S_j is its true slowdown (:mod:`.truth`); completions
and ends of reconfiguration pauses are processed exactly inside an epoch and
change the rates of co-tenants at once, but the scheduler only sees a
completion at the next epoch boundary, as a real periodic scheduler would.

Epochs in which nothing the scheduler can see has changed are skipped (a
deterministic planner given the same snapshot repeats itself).  Because ESP
warm-starts prices from the previous plan, a plan may still change without an
event; the engine therefore keeps planning every epoch while the queue is
non-empty and the last plan acted (admitted, reconfigured, migrated or
preempted something), for at most ``max_idle_replans`` epochs in a row.

Closed loop (``loop``)
----------------------
With a :class:`~elastico_extender.core.closed_loop.ClosedLoop`, the engine
reports observation windows to it as the node agent does in the service: two
windows per epoch (the agent reports every half epoch), each ending at a
planning point or half-way to the next one.  A window of a job is its progress
rate in samples/s (or tokens/s): the work it did over the seconds it was not
paused, times ``T_true(default)``, i.e. its true throughput ``T_true(c) / S_j``
averaged over the window, times a measurement error, log-normal with sigma
``noise`` (default 0.03: the scatter of a launch-rate count over a window),
with every tenant that ran unpaused on its devices at any time in the window
as partners (a window is solo only if the job ran alone all through it), and
its SM activity over the window (``Observation.sm_activity``, the field the
node agent fills from NVML/DCGM): the world's true activity averaged over the
window's unpaused seconds (the production world's a_i(t); in the benchmark
world the configuration's profiled SM share), times its own log-normal error
of the same sigma, clipped to [0, 1].  A
job paused for more than two thirds of a window reports nothing for it.  A
window in which a partner ran next to the job for less than two thirds of its
unpaused seconds (``MIN_SHARED_SHARE``: the partner joined, left, or paused to
restart) is reported as *mixed* (``Observation.mixed``, as the node agent
marks it: ``agent/daemon.py``, "Restarts"; counted in
``counters["mixed_windows"]``): it counts as the job's slowdown but teaches
nothing.
The book's reference for a job is its profiled ``T(c)`` until the
job is seen alone, then its own solo rate (profile error fades out).  The
snapshot carries the book's per-job observed slowdowns and the clock.  While
any device is shared the engine observes every epoch (two windows per epoch),
and plans when the observations could change the plan: when some shared job's
windows make a case of harm against the tolerance its last plan stated
(:func:`~elastico_extender.core.planner.protect.harm_evidence`, with
``LOOP_HARM_SLACK`` so the planner's adaptive tolerance is never missed) that
the last plan did not see (a new case, or one now above tolerance), so a
harmful pair is seen and separated within the planner's k windows exactly as
when planning every epoch; and, while jobs wait, every
``LOOP_QUEUE_REPLAN_EPOCHS`` epochs, because what the correction learned may
now admit one.  (The extender plans every epoch; in the planner only the
protect step and the corrected predictor read observations, so the skipped
plans are those that would repeat the previous one, as for epochs without
events.)

Harm is measured against each job's tolerance as the last plan stated it
(``Assignment.tolerance``): ``harm_s`` lists how long each (victim, partner)
pair whose true slowdown exceeded the victim's tolerance stayed co-located,
``counters["above_tolerance_s"]`` the job-seconds spent so, and with an online
correction ``mape`` the corrected predictor's MAPE against the ground truth on
every configuration pair observed so far, once per simulated hour.
``separated_truth`` holds, per job a plan separated for observed harm, its true
slowdown over its tolerance when that plan was made (at most 1: a false alarm).

Invariants checked while running (recorded, asserted by the tests)
-----------------------------------------------------------------
* no device ever holds more memory than it physically has (``capacity_violations``);
  in the benchmark world, where every job's true SM activity is its profiled SM
  share all the time, neither SM shares summing above 1.  In the production world
  a job's SM demand is its time-varying activity, not its catalog share, and SM
  is time-shared: the planner may pack jobs whose catalog shares sum above 1 on
  the strength of their observed activity (``core.planner.observed_sm``).  What
  the device really holds there is recorded, not asserted: the device-seconds in
  which its tenants' true activities summed above 1
  (``counters["sm_oversubscribed_s"]``), during which the truth slows them;
* every running job appears in each plan (or is listed as preempted);
* every job finishes, and the work done equals the work of the trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from elastico_extender.core.closed_loop import ClosedLoop, RunningConfig
from elastico_extender.core.duration import CompletedJob, DurationBook
from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.predictor import mape_percent
from elastico_extender.core.model import GpuDevice, Job, Node, Plan, Snapshot
from elastico_extender.core.observations import MIN_SHARED_SHARE, Observation
from elastico_extender.core.planner.observed_throughput import solo_rates
from elastico_extender.core.planner.protect import harm_evidence
from elastico_extender.policies.base import Policy
from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["ClusterSpec", "RunResult", "Simulator"]

FUTURE, PENDING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4

_EPS = 1e-9
LOOP_HARM_SLACK = 0.03
"""Relative margin below the last plan's tolerance at which observed harm triggers a plan."""
LOOP_QUEUE_REPLAN_EPOCHS = 30
"""With the loop and a non-empty queue, plan at least every this many epochs (half an hour
of 60 s epochs: the synthetic load-1.5 figures are identical with 5 and with never)."""


@dataclass(frozen=True)
class ClusterSpec:
    """A homogeneous simulated cluster (the spec's testbed: 8 x A100-40GB per node)."""

    gpus: int = 64
    gpus_per_node: int = 8
    device_mib: float = 40 * 1024.0
    product: str = "A100-SXM4-40GB"
    cpu_cores: float = 128.0
    host_mem_mib: float = 1024 * 1024.0

    def nodes(self) -> tuple[Node, ...]:
        count = math.ceil(self.gpus / self.gpus_per_node)
        out = []
        left = self.gpus
        for n in range(count):
            k = min(self.gpus_per_node, left)
            left -= k
            devices = tuple(GpuDevice(i, self.device_mib, self.product) for i in range(k))
            out.append(Node(f"node-{n:04d}", devices, self.cpu_cores, self.host_mem_mib))
        return tuple(out)


@dataclass
class RunResult:
    """Everything measured in one run; :mod:`.metrics` turns it into table rows."""

    policy: str
    gpus: int
    window_s: float
    jobs: list[TraceJob]
    arrival: np.ndarray
    first_start: np.ndarray
    finish: np.ndarray
    work: np.ndarray  # duration_s (default-solo seconds)
    gpus_of: np.ndarray
    status: np.ndarray
    floor: np.ndarray  # catalog units
    achieved: np.ndarray  # time-averaged true throughput while holding devices
    held_gpu_s: np.ndarray
    is_inference: np.ndarray
    # piecewise-constant timelines: [t0, t1) segments
    seg_t0: np.ndarray
    seg_t1: np.ndarray
    seg_sm: np.ndarray  # SM activity, fraction of cluster
    seg_mem: np.ndarray  # memory held, fraction of cluster
    seg_busy: np.ndarray  # devices with at least one tenant, fraction
    seg_useful: np.ndarray  # useful work rate in GPU-equivalents (sum rate * gpus)
    seg_tenants: np.ndarray  # sum over devices of tenant count (for accounting)
    seg_active: np.ndarray  # GPUs of running, unpaused jobs
    seg_cfg: np.ndarray  # sum over those of gpus * T_true(c)/T_true(default) (no slowdown)
    plan_ms: list[float]
    counters: dict[str, float]
    capacity_violations: list[tuple[float, int, float, float]] = field(default_factory=list)
    anomalies: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    harm_s: list[float] = field(default_factory=list)
    """Closed loop: per harmful co-location (true S above tolerance), seconds it lasted."""
    separated_truth: list[float] = field(default_factory=list)
    """Closed loop: per job a plan separated for observed harm (once per plan), its true
    slowdown over its tolerance at that plan; at most 1.0: the pair was not harmful."""
    mape: list[tuple[float, int, float, float]] = field(default_factory=list)
    """(hour, observed configuration pairs, corrected MAPE %, base MAPE %) per hour."""
    window_t0: float = 0.0
    """First arrival: metrics average over [window_t0, window_t0 + window_s], so they never
    depend on where the trace's clock starts."""
    active_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per job, seconds it held GPUs and was not paused by a reconfiguration."""
    config_work_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Per job, the work it would have done over ``active_s`` at its configurations alone
    (default-solo seconds): below ``active_s`` when it ran slower configurations, above
    ``work`` by what interference took."""


class Simulator:
    """Runs one policy over one trace on one simulated cluster (module docstring)."""

    def __init__(
        self,
        trace: list[TraceJob],
        policy: Policy,
        configs: ConfigTable,
        truth: GroundTruth,
        cluster: ClusterSpec | None = None,
        *,
        epoch_s: float = 60.0,
        max_idle_replans: int = 3,
        progress: Callable[[float, int, int], None] | None = None,
        timer: Callable[[], float] = time.perf_counter,
        loop: ClosedLoop | None = None,
        noise: float = 0.03,
        seed: int = 0,
        history: Sequence[CompletedJob] = (),
        oracle_durations: bool = False,
    ) -> None:
        self.trace = sorted(trace, key=lambda j: (j.arrival_s, j.job_id))
        self.policy = policy
        self.c = configs
        self.truth = truth
        self.cluster = cluster or ClusterSpec()
        self.epoch_s = float(epoch_s)
        self.max_idle_replans = max_idle_replans
        self.progress = progress
        self.timer = timer
        self.nodes = self.cluster.nodes()
        self.refs = [(n.name, g.index) for n in self.nodes for g in n.gpus]
        self.dev_index = {r: i for i, r in enumerate(self.refs)}
        self.n_dev = len(self.refs)
        n = len(self.trace)
        self.n = n
        self.index = {j.job_id: i for i, j in enumerate(self.trace)}
        if len(self.index) != n:
            raise ValueError("trace job ids must be unique")
        fams = configs.families
        self.arrival = np.array([j.arrival_s for j in self.trace], dtype=np.float64)
        self.work = np.array([j.duration_s for j in self.trace], dtype=np.float64)
        self.gpus = np.array([j.gpus for j in self.trace], dtype=np.intp)
        self.offset = np.array([configs.offset[j.workload] for j in self.trace], dtype=np.intp)
        peak = {name: float(f.throughput.max()) for name, f in fams.items()}
        self.floor = np.array([j.floor_frac * peak[j.workload] for j in self.trace])
        self.kind = [fams[j.workload].kind for j in self.trace]
        self.is_inf = np.array([configs.is_inference[o] for o in self.offset], dtype=bool)
        # dynamic state
        self.status = np.full(n, FUTURE, dtype=np.int8)
        self.remaining = self.work.copy()
        self.gid = np.full(n, -1, dtype=np.intp)
        self.devices: list[tuple[int, ...]] = [() for _ in range(n)]
        self.pause_until = np.zeros(n)
        self.first_start = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.tput_integral = np.zeros(n)
        self.held_time = np.zeros(n)
        self.active_time = np.zeros(n)  # held and not paused
        self.config_work = np.zeros(n)  # integral of T_true(c)/T_true(default) while active
        self.rate = np.zeros(n)
        self.slow = np.ones(n)
        self.tenants: list[list[int]] = [[] for _ in range(self.n_dev)]
        # What the scheduler may know of job length: service so far and completions.
        self.attained = np.zeros(n)  # GPU-seconds served before the current run
        self.run_start = np.full(n, np.nan)
        self.expected = np.zeros(n)  # estimator's guess of each job's run time, 0 = none
        self.durations: DurationBook[None] = DurationBook(history)  # the estimates' only source
        self.oracle_durations = oracle_durations
        if oracle_durations:
            self.expected[:] = self.work
        self._job_cache: dict[int, Job] = {}
        self.counters: dict[str, float] = {
            "plans": 0,
            "reconfigurations": 0,
            "migrations": 0,
            "preemptions": 0,
            "admissions": 0,
            "pause_s": 0.0,
            "rejected": 0,
            "residual_admissions": 0,
        }
        self.segments: list[tuple[float, ...]] = []
        self.plan_ms: list[float] = []
        self.capacity_violations: list[tuple[float, int, float, float]] = []
        self.anomalies: list[str] = []
        # closed loop and harm accounting
        self.loop = loop
        self.noise = noise
        self._rng = np.random.default_rng([seed, 0x0B5])
        self.tau = np.full(n, np.inf)
        self._harm_open: dict[tuple[int, int], float] = {}
        self.harm_s: list[float] = []
        self.separated_truth: list[float] = []
        self.counters["above_tolerance_s"] = 0.0
        self.counters["observations"] = 0.0
        self.counters["mixed_windows"] = 0.0
        self._observed_pairs: set[tuple[int, int]] = set()
        self.mape: list[tuple[float, int, float, float]] = []
        self._next_mape = 3600.0
        self._harm_flags: dict[int, bool] = {}  # cases of harm at this epoch (_loop_news)
        self._planned_flags: dict[int, bool] = {}  # ... when the last plan was made
        self.win_work = np.zeros(n)  # work done in the current observation window
        self.win_active = np.zeros(n)  # seconds not paused in it
        self.win_sm = np.zeros(n)  # integral of its SM activity over it
        # who shared its devices in it, unpaused, and for how many of its seconds
        self.win_partners: dict[int, dict[int, float]] = {}
        self._sharing: dict[int, list[int]] = {}  # job -> its unpaused co-tenants now
        self.counters["sm_oversubscribed_s"] = 0.0
        self._window_start = 0.0

    # -- closed loop ------------------------------------------------------------
    def _observe(self, now: float) -> None:
        """One observation window per running, unpaused job (module doc)."""
        loop = self.loop
        if loop is None:
            return
        active = (self.status == RUNNING) & (self.pause_until <= now + _EPS) & (self.rate > 0)
        span = now - self._window_start
        self._window_start = now
        worked = self.win_active >= max(span, _EPS) / 3.0
        idx = np.flatnonzero(active & worked)
        rate_now = self.win_work[idx] / np.maximum(self.win_active[idx], _EPS)
        sm_now = self.win_sm[idx] / np.maximum(self.win_active[idx], _EPS)
        seconds = self.win_active[idx].copy()
        self.win_work[:] = 0.0
        self.win_active[:] = 0.0
        self.win_sm[:] = 0.0
        shared, self.win_partners = self.win_partners, {}
        if idx.size == 0:
            return
        noise = np.exp(self._rng.normal(0.0, self.noise, idx.size)) if self.noise > 0 else None
        if self.noise > 0:  # the activity counter's own error, drawn independently
            sm_now *= np.exp(self._rng.normal(0.0, self.noise, idx.size))
        sm_now = np.clip(sm_now, 0.0, 1.0)
        fams = self.c.families
        running: dict[str, RunningConfig] = {}
        observations: list[Observation] = []
        book = loop.book
        memory = self.cluster.device_mib / 1024.0
        for k, i in enumerate(idx.tolist()):
            t = self.trace[i]
            config = int(self.gid[i] - self.offset[i])
            unit = fams[t.workload].throughput_unit
            if book.reference(t.job_id, config, unit) is None:
                book.set_reference(
                    t.job_id, config, unit, float(fams[t.workload].throughput[config])
                )
            with_whom = shared.get(i, {})
            partners = sorted(with_whom)
            default = self.c.default_gid[int(self.c.workload[self.gid[i]])]
            rate = float(rate_now[k] * self.c.t_true[default])
            if noise is not None:
                rate *= float(noise[k])
            crowded = any(len(self.tenants[d]) > 2 for d in self.devices[i])
            running[t.job_id] = RunningConfig(t.workload, config, memory, crowded)
            # a partner for less than two thirds of its seconds: neither alone nor shared
            mixed = any(v < seconds[k] * MIN_SHARED_SHARE for v in with_whom.values())
            self.counters["mixed_windows"] += mixed
            observations.append(
                Observation(
                    t.job_id,
                    config,
                    now,
                    float(seconds[k]),
                    rate,
                    unit,
                    tuple(self.trace[o].job_id for o in partners),
                    sm_activity=float(sm_now[k]),
                    mixed=mixed,
                )
            )
            if len(partners) == 1 and not mixed:
                self._observed_pairs.add((int(self.gid[i]), int(self.gid[partners[0]])))
        loop.record(observations, running, fams)
        self.counters["observations"] += len(observations)

    def _loop_news(self, now: float, epochs_since_plan: float) -> bool:
        """Whether the observations since the last plan could change it (module doc)."""
        loop = self.loop
        if loop is None:
            return False
        observed = loop.observed()
        flags: dict[int, bool] = {}  # job -> its evidence is above its tolerance
        for members in self.tenants:
            if len(members) < 2:
                continue
            for i in members:
                seen = observed.get(self.trace[i].job_id)
                if seen is None:
                    continue
                evidence = harm_evidence(seen, now)
                if evidence is not None and evidence > self.tau[i] * (1.0 - LOOP_HARM_SLACK):
                    flags[i] = evidence > self.tau[i]
        self._harm_flags = flags
        # A case the last plan already saw, no worse, would get the same answer.
        planned = self._planned_flags
        if any(i not in planned or (over and not planned[i]) for i, over in flags.items()):
            return True
        waiting = bool(np.any(self.status == PENDING))
        return waiting and epochs_since_plan >= LOOP_QUEUE_REPLAN_EPOCHS - _EPS

    def _saw(self, plan: Plan) -> None:
        """Remember the cases of harm ``plan`` answered, less those it acted on.

        A plan that stepped a harmed pair down (or moved or requeued one of it) changed
        what the next windows measure: if they still show harm, the extender's next
        plan (it plans every epoch) separates the pair, so the simulator plans then too.
        Remembering the case as answered skipped those plans: on Philly ed69ec a pair
        stepped down that stayed above tolerance shared for 30 more epochs.
        Also records how the truth saw each job the plan separated (``separated_truth``).
        """
        touched = {
            self.index[job]
            for victim, partner, _action, actor, *_ in plan.protections
            for job in (victim, partner, actor)
            if job in self.index
        }
        victims = {p[0]: p[5] for p in plan.protections if p[0] in self.index}
        self.separated_truth.extend(
            float(self.slow[self.index[job]]) / tau for job, tau in victims.items() if tau > 0
        )
        self._planned_flags = {i: f for i, f in self._harm_flags.items() if i not in touched}

    def _measure_mape(self, now: float) -> None:
        """Hourly: corrected vs base prediction against the truth on observed pairs."""
        loop = self.loop
        if loop is None or loop.correction is None:
            return
        while now >= self._next_mape:
            hour = self._next_mape / 3600.0
            self._next_mape += 3600.0
            if not self._observed_pairs:
                continue
            pairs = np.array(sorted(self._observed_pairs), dtype=np.intp)
            feats = self._features
            x = pair_features(
                feats[pairs[:, 0]], feats[pairs[:, 1]], self.cluster.device_mib / 1024.0
            )
            truth = self.truth.slowdown[pairs[:, 0], pairs[:, 1]]
            fixed = loop.correction.predict(x)
            base = np.asarray(loop.correction.base.predict(x), dtype=np.float64)
            err, err_base = mape_percent(fixed, truth), mape_percent(base, truth)
            self.mape.append((hour, int(pairs.shape[0]), err, err_base))

    @property
    def _features(self) -> np.ndarray:
        cached = getattr(self, "_feature_rows", None)
        if cached is None:
            cached = np.concatenate(
                [
                    np.asarray(self.c.families[name].features, dtype=np.float32)
                    for name in self.c.names
                ]
            )
            self._feature_rows = cached
        return cached

    def _track_harm(self, now: float) -> None:
        """Open and close harmful co-locations (true S(i|j) above i's tolerance).

        The truth's S(i|j) at ``now``: in the production world it follows both jobs'
        activity, so ``_advance`` calls this at every change of the activities too."""
        current: set[tuple[int, int]] = set()
        for members in self.tenants:
            if len(members) < 2:
                continue
            g = self.gid[members]
            block = self.truth.pair_slowdowns(g, np.array(members), now)
            for a, i in enumerate(members):
                for b, j in enumerate(members):
                    if a != b and block[a, b] > self.tau[i] + 1e-9:
                        current.add((i, j))
        for pair in list(self._harm_open):
            if pair not in current:
                self.harm_s.append(now - self._harm_open.pop(pair))
        for pair in current:
            self._harm_open.setdefault(pair, now)

    # -- snapshot -------------------------------------------------------------
    def _job(self, i: int) -> Job:
        cached = self._job_cache.get(i)
        if cached is not None:
            return cached
        t = self.trace[i]
        running = self.status[i] == RUNNING
        job = Job(
            id=t.job_id,
            family=t.workload,
            kind=self.kind[i],
            gpus=int(self.gpus[i]),
            min_throughput=float(self.floor[i]),
            current_config=int(self.gid[i] - self.offset[i]) if running else None,
            devices=tuple(self.refs[d] for d in self.devices[i]) if running else (),
            arrival_time=float(self.arrival[i]),
            attained_gpu_seconds=float(self.attained[i]),
            started_at=float(self.run_start[i]) if running else None,
            expected_duration_s=float(self.expected[i]),
            user=t.user,
        )
        self._job_cache[i] = job
        return job

    def _learn_durations(self) -> None:
        """Every job's expected run time from the book, after each of its refits (or, as a
        labelled ORACLE diagnostic, its true duration from the start)."""
        if self.oracle_durations or not self.durations.refresh():
            return
        book = self.durations
        for i, t in enumerate(self.trace):
            self.expected[i] = book.expected(t.workload, int(self.gpus[i]), t.user)
        self._job_cache.clear()

    def snapshot(self, epoch: int, now: float = 0.0) -> Snapshot:
        self._learn_durations()
        live = np.flatnonzero((self.status == PENDING) | (self.status == RUNNING))
        jobs = tuple(self._job(int(i)) for i in live)
        observed = self.loop.observed() if self.loop is not None else {}
        unmeasured = self.loop.book.unmeasured() if self.loop is not None else {}
        rates = solo_rates(self.loop.book, self.c.families) if self.loop is not None else {}
        return Snapshot(
            self.nodes,
            jobs,
            self.c.families,
            epoch=epoch,
            observed=observed,
            unmeasured=unmeasured,
            now=now,
            solo_rates=rates,
        )

    def remaining_solo_s(self, job_id: str) -> float:
        """True remaining seconds of ``job_id`` alone at its default configuration (ORACLE:
        only the SRTF baseline, labelled as an oracle, may be bound to this)."""
        i = self.index.get(job_id)
        return float(self.remaining[i]) if i is not None else 0.0

    # -- applying a plan ----------------------------------------------------------
    def _apply(self, plan: Plan, now: float) -> bool:
        """Apply ``plan``; True if anything changed (admit/reconfigure/migrate/preempt)."""
        acted = False
        seen: set[int] = set()
        for job_id, a in plan.assignments.items():
            i = self.index.get(job_id)
            if i is None or self.status[i] not in (PENDING, RUNNING):
                self.anomalies.append(f"t={now:.0f}: plan assigns unknown or finished job {job_id}")
                continue
            seen.add(i)
            self.tau[i] = float(a.tolerance)
            new_gid = int(self.offset[i] + a.config_index)
            devs = tuple(self.dev_index[r] for r in a.devices)
            if len(devs) != self.gpus[i]:
                self.anomalies.append(
                    f"t={now:.0f}: {job_id} assigned {len(devs)} devices, needs {self.gpus[i]}"
                )
                continue
            cost = 0.0
            if self.status[i] == PENDING:
                self.status[i] = RUNNING
                self.run_start[i] = now
                self.counters["admissions"] += 1
                if math.isnan(self.first_start[i]):
                    self.first_start[i] = now
                elif self.remaining[i] < self.work[i]:
                    cost = self.truth.restart_cost(new_gid)  # resume from checkpoint
            elif set(devs) != set(self.devices[i]):
                cost = self.truth.restart_cost(new_gid)
                self.counters["migrations"] += 1
            elif new_gid != self.gid[i]:
                cost = self.truth.reconfig_cost(int(self.gid[i]), new_gid)
                self.counters["reconfigurations"] += 1
            else:
                continue
            acted = True
            self.gid[i] = new_gid
            self.devices[i] = devs
            self._job_cache.pop(i, None)
            if cost > 0:
                self.pause_until[i] = now + cost
                self.counters["pause_s"] += cost
        preempted = {self.index[j] for j in plan.preempted if j in self.index}
        for i in np.flatnonzero(self.status == RUNNING).tolist():
            if i in seen:
                continue
            if i not in preempted:
                self.anomalies.append(
                    f"t={now:.0f}: running job {self.trace[i].job_id} missing from the plan "
                    "and not preempted (treated as preempted)"
                )
            self.status[i] = PENDING
            self.attained[i] += (now - self.run_start[i]) * self.gpus[i]
            self.run_start[i] = np.nan
            self.devices[i] = ()
            self.gid[i] = -1
            self.pause_until[i] = 0.0
            self._job_cache.pop(i, None)
            self.counters["preemptions"] += 1
            acted = True
        for job_id in plan.rejected:
            i = self.index.get(job_id)
            if i is not None and self.status[i] == PENDING:
                self.status[i] = REJECTED
                self.counters["rejected"] += 1
                self.anomalies.append(f"rejected {job_id}: {plan.rejected[job_id]}")
        self._rebuild_tenants(now)
        return acted

    def _rebuild_tenants(self, now: float) -> None:
        self.tenants = [[] for _ in range(self.n_dev)]
        for i in np.flatnonzero(self.status == RUNNING).tolist():
            for d in self.devices[i]:
                self.tenants[d].append(i)
        mem = self.c.mem_mib
        sm = self.c.sm
        # SM shares are a capacity only where they are the jobs' true, constant activity
        # (the benchmark world); with time-varying activity they are time-shared and
        # contention is the truth's slowdown (module doc, invariants).
        sm_capacity = 1.0 if getattr(self.truth, "activity", None) is None else math.inf
        for d, members in enumerate(self.tenants):
            if not members:
                continue
            g = self.gid[members]
            m, s = float(mem[g].sum()), float(sm[g].sum())
            if m > self.cluster.device_mib + 1e-6 or s > sm_capacity + 1e-6:
                self.capacity_violations.append((now, d, m, s))
        self._track_harm(now)

    # -- progress ---------------------------------------------------------------
    def _update_rates(self, now: float) -> None:
        run = self.status == RUNNING
        active = run & (self.pause_until <= now + _EPS)
        self.slow[:] = 1.0
        self._sharing = {}
        for members in self.tenants:
            if len(members) < 2:
                continue
            live = [i for i in members if active[i]]
            if len(live) < 2:
                continue
            for i in live:
                self._sharing.setdefault(i, []).extend(o for o in live if o != i)
            s = self.truth.device_slowdowns(self.gid[live], np.array(live), now)
            for i, v in zip(live, s.tolist(), strict=True):
                if v > self.slow[i]:
                    self.slow[i] = v
        self.rate[:] = 0.0
        idx = np.flatnonzero(active)
        self.rate[idx] = self.c.rate[self.gid[idx]] / self.slow[idx]

    def _record(self, t0: float, t1: float) -> None:
        if t1 <= t0:
            return
        run = np.flatnonzero(self.status == RUNNING)
        if run.size:
            g = self.gid[run]
            w = self.gpus[run].astype(np.float64)
            active = self.rate[run] > 0
            live = run[active]
            activity = self._activity(live, t0)
            if getattr(self.truth, "device_sm", None) is None:
                sm = float((activity * w[active]).sum()) / self.n_dev
            else:  # a world with time-varying activity (sim.production): 1 - prod(1 - a_i)
                sm = self._device_activity(live, activity, dt=t1 - t0)
            if self.loop is not None:
                self.win_sm[live] += activity * (t1 - t0)
            mem = float((self.c.mem_mib[g] * w).sum()) / (self.n_dev * self.cluster.device_mib)
            useful = float((self.rate[run] * w).sum())
            tenants = float(w.sum())
            busy = sum(1 for m in self.tenants if m) / self.n_dev
            act = float((w * active).sum())
            cfg = float((w * active * self.c.rate[g]).sum())
        else:
            sm = mem = useful = tenants = busy = act = cfg = 0.0
        self.segments.append((t0, t1, sm, mem, busy, useful, tenants, act, cfg))
        dt = t1 - t0
        if run.size:
            over = (self.slow[run] > self.tau[run] + 1e-9) & (self.rate[run] > 0)
            self.counters["above_tolerance_s"] += float(over.sum()) * dt
            if self.loop is not None:
                self.win_work[run] += self.rate[run] * dt
                self.win_active[run] += dt * (self.rate[run] > 0)
                for i, others in self._sharing.items():
                    shared = self.win_partners.setdefault(i, {})
                    for o in others:
                        shared[o] = shared.get(o, 0.0) + dt
            self.remaining[run] -= self.rate[run] * dt
            self.held_time[run] += dt
            on = (self.rate[run] > 0) * dt  # seconds each ran unpaused
            g = self.gid[run]
            self.active_time[run] += on
            self.config_work[run] += self.c.rate[g] * on
            self.tput_integral[run] += self.c.t_true[g] / self.slow[run] * on

    def _activity(self, jobs: np.ndarray, t: float) -> np.ndarray:
        """SM activity of running ``jobs`` at ``t``: the world's (sim.production), or, in the
        benchmark world, their configurations' profiled SM share (saturating jobs)."""
        varying = getattr(self.truth, "activity", None)
        if varying is None:
            return np.asarray(self.c.sm[self.gid[jobs]], dtype=np.float64)
        return np.asarray(varying(jobs, self.gid[jobs], t), dtype=np.float64)

    def _device_activity(self, jobs: np.ndarray, act: np.ndarray, dt: float) -> float:
        """Cluster SM activity, 1 - prod(1 - a_i) per device over its active tenants, as a
        share of the cluster; counts the device-seconds whose tenants' activities sum above
        1 (``sm_oversubscribed_s``: they contend, the truth slows them)."""
        if jobs.size == 0:
            return 0.0
        width = self.gpus[jobs]
        flat = np.fromiter(
            (d for i in jobs.tolist() for d in self.devices[i]), np.intp, int(width.sum())
        )
        per_worker = np.repeat(act, width)
        idle = np.bincount(flat, np.log1p(-np.minimum(per_worker, 1.0 - 1e-12)), self.n_dev)
        summed = np.bincount(flat, per_worker, self.n_dev)
        self.counters["sm_oversubscribed_s"] += float(np.count_nonzero(summed > 1.0 + 1e-9)) * dt
        return float((1.0 - np.exp(idle)).sum()) / self.n_dev

    def _advance(self, now: float, target: float) -> tuple[float, bool]:
        """Progress jobs from ``now`` to ``target``; returns (now, any completion)."""
        completed = False
        while now < target - _EPS:
            run = np.flatnonzero(self.status == RUNNING)
            changes = max(self.truth.next_change(now), now)  # activities change (production)
            t_next = min(target, changes)
            if run.size:
                r = self.rate[run]
                moving = r > 0
                if moving.any():
                    t_done = now + self.remaining[run[moving]] / r[moving]
                    t_next = min(t_next, float(t_done.min()))
                pu = self.pause_until[run]
                waiting = pu > now + _EPS
                if waiting.any():
                    t_next = min(t_next, float(pu[waiting].min()))
            t_next = max(t_next, now)
            self._record(now, t_next)
            now = t_next
            changed = now >= changes - _EPS  # pairs' true slowdowns moved with the activities
            finished = run[(self.remaining[run] <= 1e-6 * np.maximum(self.work[run], 1.0))]
            if finished.size:
                completed = True
                for i in finished.tolist():
                    self.status[i] = DONE
                    self.finish[i] = now
                    t = self.trace[i]
                    self.durations.record(
                        CompletedJob(
                            t.workload, int(self.gpus[i]), now - self.first_start[i], t.user
                        )
                    )
                    self.remaining[i] = 0.0
                    for d in self.devices[i]:
                        self.tenants[d].remove(i)
                    self._job_cache.pop(i, None)
                    if self.loop is not None:
                        self.loop.forget([self.trace[i].job_id])
            if finished.size or changed:
                self._track_harm(now)
            self._update_rates(now)
            if not run.size:
                now = target
        return now, completed

    # -- main loop ----------------------------------------------------------------
    def run(self) -> RunResult:
        wall0 = time.perf_counter()
        n = self.n
        ep = self.epoch_s
        next_arrival = 0
        # The epoch grid starts at the first arrival: results never depend on the clock's origin.
        origin = float(self.arrival[0]) if n else 0.0
        now = origin
        changed = True
        idle = 0
        replan = False
        epoch = 0
        previous: Plan | None = None
        stuck = 0
        wake = False
        planned_at = now
        while True:
            while next_arrival < n and self.arrival[next_arrival] <= now + _EPS:
                self.status[next_arrival] = PENDING
                next_arrival += 1
                changed = True
            live = np.count_nonzero((self.status == PENDING) | (self.status == RUNNING))
            if live == 0 and next_arrival >= n:
                break
            if self.loop is not None:
                self._observe(now)
                self._measure_mape(now)
                # Observations change the snapshot: plan when they could change the plan
                # (the extender plans every epoch).  Judged every epoch, even with a plan
                # due anyway, so that the plan records its own epoch's cases (``_saw``).
                news = self._loop_news(now, (now - planned_at) / ep)
                replan = replan or news
            if changed or replan:
                idle = 0 if changed else idle + 1
                snap = self.snapshot(epoch, now)
                t0 = self.timer()
                plan = self.policy.plan(snap, previous)
                self.plan_ms.append((self.timer() - t0) * 1000.0)
                self.counters["plans"] += 1
                self.counters["residual_admissions"] += plan.stats.get("residual_admissions", 0.0)
                previous = plan
                planned_at = now
                self._saw(plan)
                epoch += 1
                acted = self._apply(plan, now)
                pending = bool(np.any(self.status == PENDING))
                replan = pending and acted and idle < self.max_idle_replans
                self._update_rates(now)
                running = bool(np.any(self.status == RUNNING))
                if pending and not running and next_arrival >= n and not acted:
                    stuck += 1
                    if stuck >= 5:
                        for i in np.flatnonzero(self.status == PENDING).tolist():
                            self.status[i] = REJECTED
                            self.anomalies.append(
                                f"t={now:.0f}: {self.trace[i].job_id} never admitted on an "
                                "idle cluster (stuck)"
                            )
                        continue
                    replan = True
                else:
                    stuck = 0
            changed = False
            # Next time the scheduler has something new to look at; with the closed
            # loop, every epoch while a device is shared (a window per epoch).
            shared = self.loop is not None and any(len(m) >= 2 for m in self.tenants)
            if replan or shared:
                target = now + ep
            else:
                t_evt = self.arrival[next_arrival] if next_arrival < n else math.inf
                run = np.flatnonzero(self.status == RUNNING)
                if run.size:
                    r = self.rate[run]
                    moving = r > 0
                    if moving.any():
                        t_evt = min(
                            t_evt, now + float((self.remaining[run[moving]] / r[moving]).min())
                        )
                    pu = self.pause_until[run]
                    if (pu > now + _EPS).any():
                        t_evt = min(t_evt, float(pu[pu > now + _EPS].min()))
                # A policy may ask to decide again at a time no event announces
                # (Tiresias' demotions): ``wake_at() -> seconds or None``.
                wake_at = getattr(self.policy, "wake_at", None)
                woke = wake_at() if callable(wake_at) else None
                if woke is not None and woke < t_evt:
                    t_evt = max(woke, now)
                    wake = True
                if not math.isfinite(t_evt):
                    target = now + ep
                else:
                    target = max(now + ep, origin + math.ceil((t_evt - origin - _EPS) / ep) * ep)
            if self.loop is not None and target - now <= ep + _EPS:
                # The agent's first window of this epoch ends half-way.
                now, completed = self._advance(now, now + ep / 2.0)
                self._observe(now)
                now, late = self._advance(now, target)
                completed = completed or late
            else:
                now, completed = self._advance(now, target)
            changed = changed or completed or wake
            wake = False
            if self.progress is not None:
                self.progress(now, int(np.count_nonzero(self.status >= DONE)), n)
        for pair in list(self._harm_open):
            self.harm_s.append(now - self._harm_open.pop(pair))
        seg = np.array(self.segments, dtype=np.float64).reshape(-1, 9)
        held_gpu_s = self.held_time * self.gpus
        achieved = np.where(
            self.held_time > 0, self.tput_integral / np.maximum(self.held_time, _EPS), 0
        )
        return RunResult(
            policy=getattr(self.policy, "name", type(self.policy).__name__),
            gpus=self.n_dev,
            window_s=float(self.arrival.max() - self.arrival.min()) if n else 0.0,
            window_t0=float(self.arrival.min()) if n else 0.0,
            jobs=self.trace,
            arrival=self.arrival,
            first_start=self.first_start,
            finish=self.finish,
            work=self.work,
            gpus_of=self.gpus,
            status=self.status.copy(),
            floor=self.floor,
            achieved=achieved,
            held_gpu_s=held_gpu_s,
            is_inference=self.is_inf,
            seg_t0=seg[:, 0],
            seg_t1=seg[:, 1],
            seg_sm=seg[:, 2],
            seg_mem=seg[:, 3],
            seg_busy=seg[:, 4],
            seg_useful=seg[:, 5],
            seg_tenants=seg[:, 6],
            seg_active=seg[:, 7],
            seg_cfg=seg[:, 8],
            plan_ms=self.plan_ms,
            counters=dict(self.counters),
            capacity_violations=self.capacity_violations,
            anomalies=self.anomalies,
            wall_s=time.perf_counter() - wall0,
            harm_s=self.harm_s,
            separated_truth=self.separated_truth,
            mape=self.mape,
            active_s=self.active_time,
            config_work_s=self.config_work,
        )
