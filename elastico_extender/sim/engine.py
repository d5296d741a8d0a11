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

Invariants checked while running (recorded, asserted by the tests)
-----------------------------------------------------------------
* no device ever holds more memory than it physically has, nor SM shares
  summing above 1 (``capacity_violations``);
* every running job appears in each plan (or is listed as preempted);
* every job finishes, and the work done equals the work of the trace.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from elastico_extender.core.model import GpuDevice, Job, Node, Plan, Snapshot
from elastico_extender.policies.base import Policy
from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["ClusterSpec", "RunResult", "Simulator"]

FUTURE, PENDING, RUNNING, DONE, REJECTED = 0, 1, 2, 3, 4
_EPS = 1e-9


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
    window_t0: float = 0.0
    """First arrival: metrics average over [window_t0, window_t0 + window_s], so they never
    depend on where the trace's clock starts."""


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
        self.rate = np.zeros(n)
        self.slow = np.ones(n)
        self.tenants: list[list[int]] = [[] for _ in range(self.n_dev)]
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
            user=t.user,
        )
        self._job_cache[i] = job
        return job

    def snapshot(self, epoch: int, now: float = 0.0) -> Snapshot:
        live = np.flatnonzero((self.status == PENDING) | (self.status == RUNNING))
        jobs = tuple(self._job(int(i)) for i in live)
        return Snapshot(self.nodes, jobs, self.c.families, epoch=epoch, now=now)

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
        for d, members in enumerate(self.tenants):
            if not members:
                continue
            g = self.gid[members]
            m, s = float(mem[g].sum()), float(sm[g].sum())
            if m > self.cluster.device_mib + 1e-6 or s > 1.0 + 1e-6:
                self.capacity_violations.append((now, d, m, s))

    # -- progress ---------------------------------------------------------------
    def _update_rates(self, now: float) -> None:
        run = self.status == RUNNING
        active = run & (self.pause_until <= now + _EPS)
        self.slow[:] = 1.0
        for members in self.tenants:
            if len(members) < 2:
                continue
            live = [i for i in members if active[i]]
            if len(live) < 2:
                continue
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
            device_sm = getattr(self.truth, "device_sm", None)
            if device_sm is None:
                sm = float((self.c.sm[g] * w * active).sum()) / self.n_dev
            else:  # a world with time-varying activity (sim.production)
                on = self.rate > 0
                sm = 0.0
                for m in self.tenants:
                    live = [i for i in m if on[i]]
                    if live:
                        sm += device_sm(np.array(live), self.gid[live], t0)
                sm /= self.n_dev
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
            self.remaining[run] -= self.rate[run] * dt
            self.held_time[run] += dt
            self.tput_integral[run] += (
                self.c.t_true[self.gid[run]] / self.slow[run] * (self.rate[run] > 0) * dt
            )

    def _advance(self, now: float, target: float) -> tuple[float, bool]:
        """Progress jobs from ``now`` to ``target``; returns (now, any completion)."""
        completed = False
        while now < target - _EPS:
            run = np.flatnonzero(self.status == RUNNING)
            t_next = min(target, max(self.truth.next_change(now), now))
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
            finished = run[(self.remaining[run] <= 1e-6 * np.maximum(self.work[run], 1.0))]
            if finished.size:
                completed = True
                for i in finished.tolist():
                    self.status[i] = DONE
                    self.finish[i] = now
                    self.remaining[i] = 0.0
                    for d in self.devices[i]:
                        self.tenants[d].remove(i)
                    self._job_cache.pop(i, None)
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
        while True:
            while next_arrival < n and self.arrival[next_arrival] <= now + _EPS:
                self.status[next_arrival] = PENDING
                next_arrival += 1
                changed = True
            live = np.count_nonzero((self.status == PENDING) | (self.status == RUNNING))
            if live == 0 and next_arrival >= n:
                break
            if changed or replan:
                idle = 0 if changed else idle + 1
                snap = self.snapshot(epoch, now)
                t0 = self.timer()
                plan = self.policy.plan(snap, previous)
                self.plan_ms.append((self.timer() - t0) * 1000.0)
                self.counters["plans"] += 1
                self.counters["residual_admissions"] += plan.stats.get("residual_admissions", 0.0)
                previous = plan
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
            # Next time the scheduler has something new to look at.
            if replan:
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
            now, completed = self._advance(now, target)
            changed = changed or completed or wake
            wake = False
            if self.progress is not None:
                self.progress(now, int(np.count_nonzero(self.status >= DONE)), n)
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
        )
