"""PDS: one scheduling epoch, Algorithm 1 of the spec.

    C_eff <- C - gamma * sum_{j in Q} R_j^min               (queue-aware reservation)
    Gamma <- 0
    for m in 1..M:
        lambda* <- ESP tatonnement over running + pending jobs (warm start)
        c_j*    <- argmin_c Score_j(c; lambda*)
        A       <- bin-pack onto GPU devices (running jobs first, in place when possible)
        V       <- co-located pairs with S_hat > tau (one batched IAC call)
        if V empty: break
        Gamma   += alpha * (S_hat - tau) on the offending configurations; forbid those pairs
    apply switches, placements, migrations; admit from the queue

Pending jobs take part in ESP with a "wait" option (see ``pricing.scoring``),
rationed by priority against the aggregate capacity, so admissions come out
of the same price signal.  Priority is the weight scaled by the job's length
band (``pricing.queueing``: attained service, or expected remaining time where
completed jobs give an estimate), then arrival; below the utilisation target a
queued job with an estimate starts on a shared GPU only if that beats waiting
for one of its own (``planner.patience``).  One packing pass (``pack``) then runs, in order:

1. running jobs, in place, in bulk where no device overflows; the others go
   back in place first and grow or migrate only if there is room, so a job is
   never preempted for a neighbour's growth (``_place_conflicted``);
2. pending jobs the prices admit, in queue priority then best-fit decreasing, idle GPUs first, each
   trying its next-best configurations (never worse than waiting);
3. squeeze: co-tenants step down to admit a queued job when the primal
   objective gains (closes the duality gap of lumpy configurations);
4. residual admission: "admit jobs from Q if residual capacity permits";
   then, with ``band_preemption`` (on by default), a queued job that still
   fits nowhere may preempt running jobs of a worse length band (``planner.preempt``);
5. spread: co-located jobs move to GPUs still idle (migrations);
6. undo idle shrinks: a sharing job shrunk where nobody joined keeps the
   configuration it runs (no reconfiguration that frees room nobody takes);
7. regrow: a job alone on its GPUs takes back the speed prices took from it.

With the closed loop, running jobs observed long enough are charged their
observed peak SM activity (with a margin) instead of their catalog SM share
(``planner.observed_sm``), in ESP's demand and in every packing pass alike.

The function is pure: the snapshot and the previous plan in, a new plan out.
Timing is measured only if the driver passes a ``timer`` (a monotonic clock).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import chain

import numpy as np

from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.interference.tolerance import (
    planner_tolerance,
    smoothed_utilization,
)
from elastico_extender.core.model import AssignmentColumns, DeviceRef, Plan, Snapshot
from elastico_extender.core.planner.devices import (
    DeviceTable,
    device_tuples,
    gpu_equivalent,
    tenant_pairs,
)
from elastico_extender.core.planner.observed_sm import charge_observed_sm
from elastico_extender.core.planner.patience import Patience
from elastico_extender.core.planner.placement import Placer, device_slowdown
from elastico_extender.core.planner.preempt import preempt_for_queue
from elastico_extender.core.planner.protect import (
    Protection,
    harmed_rows,
    held_apart,
    separate,
    solo_rows,
)
from elastico_extender.core.planner.running import place_running
from elastico_extender.core.planner.squeeze import Squeeze
from elastico_extender.core.planner.tables import JobTables, build_tables
from elastico_extender.core.pricing.queueing import length_aware, queue_weights, service_keys
from elastico_extender.core.pricing.scoring import PricingProblem, Selection, select
from elastico_extender.core.pricing.tatonnement import tatonnement
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM, NUM_RESOURCES
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.errors import InvalidInputError

__all__ = ["plan"]

Timer = Callable[[], float]
Pairs = tuple[tuple[str, str], ...]
Protections = tuple[tuple[str, str, str, str, float, float], ...]


def _ordered(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a <= b else (b, a)


SPREAD_LIMIT = 16
"""Co-located jobs moved to idle GPUs per epoch (bounds migration churn)."""
SPREAD_MIN_SLOWDOWN = 1.05
"""Predicted slowdown below which a shared GPU is not worth a migration."""
RESIDUAL_LIMIT = 128
"""Queued jobs per packing pass tried for residual admission (bounds epoch cost)."""


def _performance_cost(throughput: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row: 1 - T(c) / T(c_max) over the valid columns (+inf elsewhere), and T(c_max)."""
    tput = np.where(valid, throughput, 0.0)
    tmax = tput.max(axis=1, initial=0.0)
    cost = tput
    cost /= -np.maximum(tmax, 1e-12)[:, None]
    cost += 1.0
    cost[~valid] = np.inf
    return cost, tmax


class _Clock:
    """Accumulates per-phase milliseconds when the driver supplies a timer."""

    def __init__(self, timer: Timer | None) -> None:
        self.timer = timer
        self.phases: dict[str, float] = {}
        self._last = timer() if timer else 0.0

    def lap(self, phase: str) -> None:
        if self.timer is None:
            return
        now = self.timer()
        self.phases[phase] = self.phases.get(phase, 0.0) + (now - self._last) * 1000.0
        self._last = now


def plan(
    snapshot: Snapshot,
    previous: Plan | None = None,
    *,
    settings: PlannerSettings | None = None,
    predictor: SlowdownPredictor | None = None,
    timer: Timer | None = None,
) -> Plan:
    """Run one PDS epoch over ``snapshot``; see the module docstring.

    ``predictor`` defaults to the core's :class:`ContentionPredictor`; pass the
    ONNX model in production.  Raises :class:`InvalidInputError` (or a subclass)
    listing every problem when the snapshot or settings are invalid.
    """
    settings = settings or PlannerSettings()
    problems = settings.problems()
    if problems:
        raise InvalidInputError("invalid planner settings: " + "; ".join(problems))
    clock = _Clock(timer)
    snapshot.validate()
    clock.lap("validate")
    if not settings.interference_check:
        predictor = None  # ablation "w/o IAC": co-locations are admitted unchecked
    elif predictor is None:
        predictor = ContentionPredictor()
    tables = build_tables(snapshot, settings)
    recharged = charge_observed_sm(tables, snapshot) if settings.observed_sm else 0
    keys = service_keys(snapshot) if length_aware(settings) else None
    tables.rank = queue_weights(snapshot, tables.weight, settings, keys)
    if keys is not None:
        tables.service_key, tables.remaining = keys
    epoch = _Epoch(snapshot, tables, settings, predictor, previous)
    epoch.recharged = recharged
    clock.lap("build")
    return epoch.run(clock)


WAIT_FOR_PRICES = (
    "waiting: at the current shadow prices no configuration is worth more than waiting "
    "(ESP); it starts as prices fall or room frees up"
)
WAIT_FOR_ROOM = (
    "no GPU has room for an allowed configuration now (GPU memory, SM share, node CPU or "
    "host memory, or a predicted slowdown above tolerance beside the tenants)"
)
WAIT_FOR_OWN_GPU = (
    "waiting for a GPU of its own: sharing now would finish later than waiting for one "
    "expected to free up soon (share-or-wait rule)"
)
WAIT_FOR_OPEN_NODE = (
    "too few GPUs on nodes open to it: the others are barred to it (cordoned, or with a "
    "taint it does not tolerate); it starts when such a node opens or an open one has room"
)
WAIT_IN_LINE = "waiting behind jobs ahead of it in the queue"
"""``Plan.queue_reasons``: why a queued job waits, by where the epoch left it."""


def packing_order(t: JobTables, pending: np.ndarray, choice: np.ndarray) -> list[int]:
    """The order the admitted pending rows are packed in: queue priority first (the
    length-aware rank every other pass uses, ``pricing.queueing``), then, within a band,
    the shorter expected remaining GPU-time (``JobTables.service_key``: the band is
    coarse, and a short job packed after a long one of its band waits out the long
    one's run, where Lucid and SRTF order by the estimate itself), then best-fit
    decreasing (the largest memory footprint at its chosen configuration packs with
    less fragmentation), then arrival.  When the prices admit more than the devices
    hold (lumpy demand), the jobs first in the queue get in."""
    size = t.per_gpu[pending, choice[pending], GPU_MEM] * t.gpus[pending]
    big = dict(zip(pending.tolist(), size.tolist(), strict=True))
    rank = t.priority
    key = t.service_key if t.service_key is not None else np.zeros(len(t.jobs))
    return sorted(
        pending.tolist(),
        key=lambda r: (-rank[r], key[r], -big[r], t.jobs[r].arrival_time, t.jobs[r].id),
    )


class _Epoch:
    def __init__(
        self,
        snapshot: Snapshot,
        tables: JobTables,
        settings: PlannerSettings,
        predictor: SlowdownPredictor | None,
        previous: Plan | None,
    ) -> None:
        self.snapshot = snapshot
        self.t = tables
        self.settings = settings
        self.predictor = predictor
        self.previous = previous
        self.device_probe = DeviceTable(snapshot.nodes, settings.memory_margin_mib)
        self.units = self._units()
        self.utilization, self.utilization_history_s = self._smoothed_utilization()
        self.fastest = np.zeros(len(tables.jobs))
        self.residual_admits = 0  # admissions by Algorithm 1's last step, last packing pass
        self.band_preempted = 0  # running jobs preempted for the queue, last packing pass
        self.recharged = 0  # running jobs charged their observed SM share (observed_sm)
        self.patience: Patience | None = None  # share-or-wait rule, fresh per packing pass
        self.why_waiting: dict[int, str] = {}  # row -> why it is not placed, per packing pass
        self._tau: dict[int, np.ndarray] = {}  # row -> tau at every configuration
        self._open: dict[int, np.ndarray | None] = {}  # row -> devices open to it (barred)
        self._loop_setup()

    def _loop_setup(self) -> None:
        """Closed loop (``protect``): harmed rows, held-apart pairs, run-alone rows."""
        self.harmed: dict[int, float] = {}
        self.apart: set[tuple[int, int]] = set()
        self.stepped: set[tuple[int, int]] = set()
        self.solo: set[int] = set()
        self.protections: list[Protection] = []
        previous = self.previous
        if not (
            self.snapshot.observed or self.snapshot.unmeasured or (previous and previous.separated)
        ):
            return
        rows = {job.id: r for r, job in enumerate(self.t.jobs)}
        if previous is not None:
            self.apart = held_apart(previous.separated, rows)
            self.stepped = held_apart(previous.stepped, rows)
        self.harmed = harmed_rows(self, rows)
        self.solo = solo_rows(self, rows)

    # -- set-up -------------------------------------------------------------
    def _units(self) -> np.ndarray:
        return gpu_equivalent(self.device_probe)

    def _smoothed_utilization(self) -> tuple[float, float]:
        """(U(t) for tau, how long its average has run): this plan's offered load
        averaged with the previous plan's U (``tolerance.smoothed_utilization``)."""
        previous = self.previous
        now = self._current_utilization()
        if previous is None:
            return now, 0.0
        return smoothed_utilization(
            now,
            previous.utilization,
            self.snapshot.now - previous.planned_at,
            self.settings.utilization_smoothing_s,
            previous.utilization_history_s,
        )

    def _current_utilization(self) -> float:
        """U(t) for tau: offered load, the busier of SM and memory.

        Running jobs count at their current configuration, pending ones at their
        smallest, relative to cluster capacity; a long queue therefore raises U
        above target and tau with it (spec 3.3.3: "when the queue is long,
        ElastiCo tolerates slightly more interference").
        """
        t, table = self.t, self.device_probe
        if len(t.jobs) == 0 or table.size == 0:
            return 0.0
        smallest = t.smallest.copy()
        rows = np.flatnonzero(t.running)
        smallest[rows] = t.per_gpu[rows, t.current[rows]]
        smallest *= t.gpus[:, None]
        sm = smallest[:, GPU_SM].sum() / table.size
        mem = smallest[:, GPU_MEM].sum() / max(float(table.memory_capacity.sum()), 1.0)
        return float(max(sm, mem))

    def tolerance(self, rows: np.ndarray, configs: np.ndarray) -> np.ndarray:
        return planner_tolerance(
            self.t.throughput[rows, configs], self.t.floor[rows], self.utilization, self.settings
        )

    def problem(self) -> PricingProblem:
        t, s = self.t, self.settings
        n = len(t.jobs)
        scale = t.gpus[:, None] / self.units[None, :]  # (N, R)
        # Demand stays per family (R, F, K), in GPU-equivalents; jobs scale it by GPU count.
        demand = t.demand_table / self.units[:, None, None]
        multi = None if (n == 0 or np.all(t.gpus == 1.0)) else t.gpus
        # Performance cost w_j * (1 - T_j(c) / T_j(c_max)), c_max over the job's valid rows:
        # per family for jobs that may use every configuration, per job for the others.
        family_base, family_max = _performance_cost(t.throughput_table, t.real)
        run = np.flatnonzero(t.running)
        switch = s.switch_cost if (s.coordination and s.switch_cost > 0 and run.size) else 0.0
        unit_weights = n > 0 and bool(np.all(t.weight == 1.0))
        current = t.current[run]
        tmax = family_max[t.family_index]
        if unit_weights and switch and not t.narrowed.size:
            # Common case, one gather: rows of running jobs come from the table plus gamma0.
            stacked = np.concatenate([family_base, family_base + switch])
            base = stacked[t.family_index + len(family_base) * t.running]
            staying = family_base[t.family_index[run], current]
        else:
            base = family_base[t.family_index]
            if t.narrowed.size:
                rows = t.narrowed
                base[rows], tmax[rows] = _performance_cost(t.throughput[rows], t.valid[rows])
            if not unit_weights:
                base *= t.weight[:, None]
            staying = base[run, current]
            if switch:
                base += switch * t.running[:, None]
        if switch:  # staying in the current configuration costs no switch
            base[run, current] = staying
        self.fastest = tmax  # T_j(c_max) over valid rows, for the regrow filter
        rank = t.priority
        wait = np.where(t.running, np.inf, t.weight)
        reserve = np.zeros((NUM_RESOURCES, n))
        if s.coordination and s.reservation > 0 and n:
            reserve = (s.reservation * t.smallest * scale).T * (~t.running)[None, :]
        capacity = np.full(NUM_RESOURCES, float(self.device_probe.size))
        arrival = self.snapshot.columns.arrival
        priority = np.lexsort((np.arange(n), arrival, -rank))  # higher rank, then older first
        return PricingProblem(
            demand=demand,
            base=base,
            wait_score=wait,
            capacity=capacity,
            reserve=np.ascontiguousarray(reserve),
            priority=priority,
            family=t.demand_family,
            gpus=multi,
        )

    # -- the loop -----------------------------------------------------------
    def run(self, clock: _Clock) -> Plan:
        t, s = self.t, self.settings
        n = len(t.jobs)
        problem = self.problem()
        clock.lap("scoring")
        prices = np.zeros(NUM_RESOURCES)
        if s.pricing and self.previous is not None and self.previous.prices.shape == prices.shape:
            prices = np.maximum(self.previous.prices.astype(np.float64), 0.0)
        penalty = np.zeros(problem.base.shape)
        forbidden: set[tuple[int, int, int, int]] = set()
        iterations = 0
        converged = True
        rounds = 0
        violations: list[tuple[int, int, float]] = []
        for rounds in range(1, s.max_rounds + 1):
            gamma = penalty if forbidden else None  # all zero until a round finds violations
            if s.pricing and n:
                result = tatonnement(problem, prices, s, gamma)
                prices, selection = result.prices, result.selection
                iterations += result.iterations
                converged = result.converged
            else:
                selection = select(problem, np.zeros(NUM_RESOURCES), gamma)
            clock.lap("tatonnement")
            placer, queued, preempted = self.pack(problem, selection, prices, penalty, forbidden)
            clock.lap("binpacking")
            violations, slowdown = self.check(placer)
            clock.lap("interference")
            if not violations:
                break
            if rounds < s.max_rounds:
                for victim, partner, excess in violations:
                    vc = int(placer.config[victim])
                    pc = int(placer.config[partner])
                    penalty[victim, vc] += s.interference_weight * excess
                    penalty[partner, pc] += s.interference_weight * excess
                    forbidden.add((victim, vc, partner, pc))
                    forbidden.add((partner, pc, victim, vc))
        queued, violations, slowdown = self.repair(placer, queued, violations, slowdown)
        clock.lap("coordination")
        return self.build_plan(
            placer,
            queued,
            preempted,
            violations,
            slowdown,
            prices,
            {
                "rounds": float(rounds),
                "price_iterations": float(iterations),
                "converged": float(converged),
                "residual_admissions": float(self.residual_admits),
                "sm_observed_jobs": float(self.recharged),
                "throughput_observed_configs": float(self._measured_configs()),
            },
            clock,
        )

    def _measured_configs(self) -> int:
        """Configurations ranked by a measured solo rate (planner.observed_throughput)."""
        if not self.settings.observed_throughput:
            return 0
        return sum(int(np.isfinite(m.rate).sum()) for m in self.snapshot.solo_rates.values())

    # -- bin-packing --------------------------------------------------------
    def pack(
        self,
        problem: PricingProblem,
        selection: Selection,
        prices: np.ndarray,
        penalty: np.ndarray,
        forbidden: set[tuple[int, int, int, int]],
    ) -> tuple[Placer, list[int], list[int]]:
        t, s = self.t, self.settings
        table = self.device_probe.fresh()
        placer = Placer(table, self.predictor, forbidden, rows=len(t.jobs))
        # Holding a job back pays at low load; under a long queue sharing is the point.
        calm = self.utilization < s.utilization_target
        if calm and s.patience_horizon_s > 0 and np.any(self.snapshot.columns.expected > 0):
            self.patience = Patience(
                self.snapshot, table.size, s.patience_horizon_s, self.t.remaining
            )
        if self.apart or self.solo:
            placer.set_loop(self.apart, self.solo)
        placer.banded = bool(self.snapshot.observed)  # closed loop: admission band
        placer.gang_band = s.gang_band
        choice = selection.choice
        preempted: list[int] = []
        run_rows = np.flatnonzero(t.running)
        if run_rows.size:
            preempted = place_running(self, placer, run_rows, choice)
        if self.harmed:  # closed loop: separate pairs observed above tolerance
            requeued, self.protections = separate(
                self, placer, self.harmed, s.switch_cost, self.stepped
            )
            preempted += requeued
        pending = np.flatnonzero(~t.running & selection.running)
        order = packing_order(t, pending, choice)
        queued = sorted(set(np.flatnonzero(~t.running).tolist()) - set(order))
        self.why_waiting = dict.fromkeys(queued, WAIT_FOR_PRICES)  # ESP chose waiting
        if order:
            # Every admitted job's configurations ranked by score (better than waiting
            # only) and its tolerances, in one pass over the admitted rows.
            admitted = np.array(order, dtype=np.intp)
            scores = problem.scores(prices, penalty, rows=admitted)
            ranked = np.argsort(scores, axis=1, kind="stable")
            worth = np.take_along_axis(scores, ranked, axis=1) < problem.wait_score[admitted, None]
            tolerance = self.tolerance_rows(admitted)
            for i, row in enumerate(order):
                options = ranked[i][worth[i]]
                if options.size == 0 or options[0] != choice[row]:
                    options = np.concatenate([[choice[row]], options[options != choice[row]]])
                if not self.try_row(placer, row, options.tolist(), tolerance=tolerance[i]):
                    queued.append(row)
        if queued and s.reshape and s.coordination:
            queued = Squeeze(self, placer, problem, penalty).run(queued)
        self.residual_admits = 0
        if queued:
            queued = self._admit_residual(placer, problem, prices, penalty, queued)
        self.band_preempted = 0
        if queued and s.band_preemption:  # planner.preempt
            queued, bumped = preempt_for_queue(self, placer, queued, s)
            self.band_preempted = len(bumped)
            preempted += bumped
        if s.coordination and self.predictor is not None:
            self._spread(placer)
        if s.reshape:
            self._undo_idle_shrinks(placer)
            self._regrow(placer, problem, penalty)
        return placer, sorted(queued), preempted

    def _undo_idle_shrinks(self, placer: Placer) -> None:
        """Undo shrinks of running jobs that made room for nobody (PDS hysteresis).

        Prices follow the queue: a running job that shares a GPU can be shrunk in
        one epoch to make room that no queued job then takes (the queue is blocked
        by GPU count or by interference) and grow back in the next, paying a
        reconfiguration pause each time.  On the synthetic mix at load 1.5 (seed 1)
        that made 2,404 reconfigurations in 12 h, single jobs flipping between two
        configurations every epoch, and left ElastiCo with the exact truth 3%
        behind Volcano.  After admissions, a running job kept on its devices at a
        slower configuration than it runs returns to the one it runs when nobody
        joined those devices this epoch (every tenant ran there before) and it
        still fits: its tenants are the ones it was observed next to.  The
        switching cost gamma0 cannot stop this flapping: the prices themselves
        differ between the two states.  Protect's step-downs stay.
        """
        t = self.t
        rows = np.flatnonzero(t.running)
        if rows.size == 0:
            return
        chosen, current = placer.config[rows], t.current[rows]
        slower = (chosen >= 0) & (current >= 0) & (chosen != current)
        slower[slower] &= t.valid[rows[slower], current[slower]]
        slower[slower] &= t.throughput[rows[slower], chosen[slower]] < (
            t.throughput[rows[slower], current[slower]] - 1e-12
        )
        if not slower.any():
            return
        held = self.snapshot.columns.held[rows]
        was = dict(zip(rows.tolist(), device_tuples(self.snapshot.workers, held), strict=True))
        stepped = {p.actor for p in self.protections if p.action == "step-down"}
        table = placer.table
        undo: list[int] = []
        for row in rows[slower].tolist():
            devices = placer.devices_of.get(row)
            if devices is None or set(devices) != set(was[row]) or row in stepped:
                continue
            # (device, tenant) now; every tenant must have run on that device before.
            # Alone on its devices, _regrow gives it its best configuration instead.
            now = [(d, other) for d in devices for other in table.occupants[d] if other != row]
            if now and all(d in was.get(other, ()) for d, other in now):
                undo.append(row)
        if not undo:
            return
        self.tolerance_rows(np.array(undo, dtype=np.intp))  # every row's tau in one pass
        for row in undo:
            on = placer.devices_of[row]
            config, keep = int(placer.config[row]), int(t.current[row])
            if table.fits_more(on, t.per_gpu[row, keep] - t.per_gpu[row, config]):
                placer.release(row, t.per_gpu[row, config])
                self.commit_row(placer, row, keep, on)

    def _spread(self, placer: Placer) -> None:
        """Undo co-locations that idle GPUs no longer justify (PDS migrations).

        Sharing a GPU is worth its slowdown only instead of waiting.  Once the
        queue has had every idle GPU it can use, a single-GPU job that shares a
        device with predicted slowdown above ``SPREAD_MIN_SLOWDOWN`` moves to an
        idle GPU that fits it (worst slowdown first, at most ``SPREAD_LIMIT`` per
        epoch).  A job admitted this epoch just starts there instead; a running
        one migrates (the plan says MIGRATE; in-place reconfiguration stays
        preferred everywhere else); a running job the driver cannot move
        (``Job.preemptible``) stays, and its partner may move instead.
        """
        table = placer.table
        if not np.any(table.count == 0) or not np.any(table.count >= 2):
            return
        t = self.t
        _, slowdown = self.check(placer)
        stays = t.running & ~self.snapshot.columns.preemptible  # the driver cannot move it
        movers = sorted(
            (
                r
                for r, sd in slowdown.items()
                if sd > SPREAD_MIN_SLOWDOWN
                and t.gpus[r] == 1
                and r in placer.devices_of
                and not stays[r]
            ),
            key=lambda r: -slowdown[r],
        )
        moved = 0
        for row in movers:
            if moved >= SPREAD_LIMIT or not np.any(table.count == 0):
                break
            (device,) = placer.devices_of[row]
            if table.count[device] < 2:
                continue  # its partner already moved away
            config = int(placer.config[row])
            need = t.per_gpu[row, config]
            idle = table.fits(need) & (table.count == 0)
            open_devices = self.open_devices(row)  # never onto a node barred to it
            if open_devices is not None:
                idle &= open_devices
            if not idle.any():
                continue
            target = table.choose(idle, need, 1, best_fit=True)
            if target is None:
                continue
            placer.release(row, need)
            self.commit_row(placer, row, config, target)
            moved += 1

    def _regrow(self, placer: Placer, problem: PricingProblem, penalty: np.ndarray) -> None:
        """Give back speed that bought nothing: jobs alone on their GPUs after admission.

        Prices are aggregate signals: under a long queue they stay high and push
        running jobs to lean configurations even where the memory so freed
        admits nobody (the queue is blocked by GPU count, or by interference).
        After admissions, a job that is alone on every one of its devices moves
        to the best configuration, at zero prices (switching cost included),
        that fits there.  Being alone, it risks no interference.
        """
        t = self.t
        table = placer.table
        count = table.count
        placed = placer.devices_of
        rows = np.fromiter(placed, dtype=np.intp, count=len(placed))
        width = np.fromiter(map(len, placed.values()), dtype=np.intp, count=rows.size)
        flat = np.fromiter(chain.from_iterable(placed.values()), np.intp, int(width.sum()))
        shared = np.bincount(np.repeat(np.arange(rows.size), width), count[flat] != 1, rows.size)
        # Alone on every device; one-GPU jobs first, then gangs (each in placement order).
        alone = np.flatnonzero(shared == 0)
        rows = rows[alone[np.argsort(width[alone] > 1, kind="stable")]]
        if rows.size == 0:
            return
        current = placer.config[rows]
        # Only jobs below their fastest valid configuration can gain (cheap filter first).
        slower = t.throughput[rows, current] < self.fastest[rows] - 1e-9
        rows, current = rows[slower], current[slower]
        if rows.size == 0:
            return
        primal = problem.base[rows] + penalty[rows]
        better = primal.min(axis=1) < primal[np.arange(rows.size), current] - 1e-9
        for k in np.flatnonzero(better).tolist():
            row, config = int(rows[k]), int(current[k])
            devices = list(placer.devices_of[row])
            placer.release(row, t.per_gpu[row, config])
            idx = np.asarray(devices, dtype=np.intp)
            workers = np.bincount(table.node_of[idx])
            nodes = np.flatnonzero(workers)
            need = t.per_gpu[row]
            fits = (
                (need[:, GPU_MEM] <= table.mem_free[idx].min() + 1e-9)
                & (need[:, GPU_SM] <= table.sm_free[idx].min() + 1e-9)
                & (need[:, CPU] <= (table.cpu_free[nodes] / workers[nodes]).min() + 1e-9)
                & (need[:, HOST_MEM] <= (table.ram_free[nodes] / workers[nodes]).min() + 1e-9)
            )
            options = np.where(fits, primal[k], np.inf)
            best = int(np.argmin(options)) if np.isfinite(options).any() else config
            if not table.fits_on(devices, need[best]):
                best = config
            self.commit_row(placer, row, best, devices)

    def _admit_residual(
        self,
        placer: Placer,
        problem: PricingProblem,
        prices: np.ndarray,
        penalty: np.ndarray,
        queued: list[int],
    ) -> list[int]:
        """Algorithm 1's last step: "admit jobs from Q if residual capacity permits".

        Queued jobs (priority order, at most ``RESIDUAL_LIMIT`` tries) start in the
        best-scoring configuration that still fits somewhere, even if at the final
        prices they chose to wait: an idle GPU earns nothing, and prices over lumpy
        demand can overshoot.  Placement goes through the same interference screen.
        """
        t = self.t
        still: list[int] = []
        order = t.in_queue_order(queued)
        candidates = np.array(order[: RESIDUAL_LIMIT + len(t.reasons)], dtype=np.intp)
        self.tolerance_rows(candidates)  # one pass for every row likely to be tried
        scores = dict(
            zip(candidates.tolist(), problem.scores(prices, penalty, rows=candidates), strict=True)
        )
        tried = 0
        for row in order:
            if row in t.reasons or t.running[row] or tried >= RESIDUAL_LIMIT:
                still.append(row)
                continue
            row_scores = scores.get(row)
            if row_scores is None:
                row_scores = problem.scores(prices, penalty, rows=np.array([row]))[0]
            options = np.flatnonzero(np.isfinite(row_scores))
            if options.size == 0:
                still.append(row)
                continue
            tried += 1
            options = options[np.argsort(row_scores[options], kind="stable")]
            if self.try_row(placer, row, options.tolist()):
                self.residual_admits += 1
            else:
                still.append(row)
        return still

    def reconfigure(self, placer: Placer, row: int, config: int) -> None:
        """Switch a placed single-GPU job to ``config`` on the same device."""
        devices = placer.devices_of[row]
        placer.release(row, self.t.per_gpu[row, placer.config[row]])
        self.commit_row(placer, row, config, devices)

    def tolerance_rows(self, rows: np.ndarray) -> np.ndarray:
        """(len(rows), K) tau of each of ``rows`` at every configuration (cached per row)."""
        cache = self._tau
        missing = [r for r in dict.fromkeys(rows.tolist()) if r not in cache]
        if missing:
            k = self.t.per_gpu.shape[1]
            configs = np.tile(np.arange(k), len(missing))
            fresh = self.tolerance(np.repeat(missing, k), configs).reshape(len(missing), k)
            cache.update(zip(missing, fresh, strict=True))
        return np.stack([cache[r] for r in rows.tolist()]) if rows.size else np.zeros((0, 0))

    def row_tau(self, row: int, config: int) -> float:
        tau = self._tau.get(row)
        if tau is None:
            tau = self.tolerance_rows(np.array([row]))[0]
        return float(tau[config])

    def try_row(
        self,
        placer: Placer,
        row: int,
        options: list[int],
        allowed_devices: np.ndarray | None = None,
        tolerance: np.ndarray | None = None,
    ) -> bool:
        """``Placer.try_place`` for one job row, with its features and tolerances per config;
        never on devices of the row's barred nodes (``Job.barred_nodes``)."""
        t = self.t
        gpus = int(t.gpus[row])
        open_devices = self.open_devices(row)
        if open_devices is not None:
            if np.count_nonzero(open_devices) < gpus:
                self.why_waiting[row] = WAIT_FOR_OPEN_NODE
                return False
            allowed_devices = (
                open_devices if allowed_devices is None else allowed_devices & open_devices
            )
        if tolerance is None:
            tolerance = self.tolerance_rows(np.array([row]))[0]
        # A queued job with an expected duration starts shared only if that beats waiting.
        patience = self.patience if not t.running[row] and self.patience is not None else None
        if patience is not None and patience.expected[row] <= 0:
            patience = None
        placed = placer.try_place(
            row,
            gpus,
            options,
            t.per_gpu[row],
            t.feature_table[t.family_index[row]],
            tolerance,
            best_fit=self.settings.pricing,
            allowed_devices=allowed_devices,
            commit=patience is None,
            # Demand and features follow from the demand row (the family's, or the
            # job's own observed SM share) and the GPU count.
            shape=(int(t.demand_family[row]), gpus),
        )
        if patience is None:
            if placed is None:
                self.why_waiting[row] = WAIT_FOR_ROOM
            return placed is not None
        if placed is None or not patience.worth_sharing(row, gpus, placed.slowdown):
            self.why_waiting[row] = WAIT_FOR_ROOM if placed is None else WAIT_FOR_OWN_GPU
            patience.queue(row, gpus)
            return False
        self.commit_row(placer, row, placed.config, placed.devices)
        return True

    def open_devices(self, row: int) -> np.ndarray | None:
        """(G,) mask of the devices not on a node barred to ``row``, or None when no node
        is (the common case: every device); computed once per row and epoch."""
        if row in self._open:
            return self._open[row]
        barred = self.t.jobs[row].barred_nodes
        mask: np.ndarray | None = None
        if barred:
            position = self.snapshot.devices.node_position
            closed = [position[name] for name in barred if name in position]
            if closed:
                mask = ~np.isin(self.device_probe.node_of, closed)
        self._open[row] = mask
        return mask

    def commit_row(self, placer: Placer, row: int, config: int, devices: Sequence[int]) -> None:
        """``Placer.commit`` of one job row at ``config`` on ``devices``."""
        placer.commit(
            row,
            config,
            devices,
            self.t.per_gpu[row, config],
            self.t.feature_table[self.t.family_index[row], config],
            self.row_tau(row, config),
        )

    # -- interference check ---------------------------------------------------
    def check(self, placer: Placer) -> tuple[list[tuple[int, int, float]], dict[int, float]]:
        """All co-located pairs in one predictor call: violations and per-job worst S_hat.

        A job's slowdown on a device is composed from its pairs there
        (``placement.device_slowdown``) and the worst of its devices counts.  Where
        the composed slowdown exceeds tau, the partners adding the most excess are
        the violating pairs, as few as bring the rest within tau (a pair over tau on
        its own is always one of them).
        """
        slowdown: dict[int, float] = {}
        if self.predictor is None:
            return [], slowdown
        table = placer.table
        va, pa, where, group = tenant_pairs(table, list(table.occupants))
        if not va.size:
            return [], slowdown
        features = placer.features
        memory = table.memory_total[where] / 1024.0
        s_hat = np.asarray(
            self.predictor.predict(pair_features(features[va], features[pa], memory)),
            dtype=np.float64,
        )
        starts = np.flatnonzero(np.concatenate(([True], group[1:] != group[:-1])))
        owner = va[starts]
        composed = device_slowdown(s_hat - 1.0, group, owner.size)
        # Worst composed S_hat per victim (over its devices), in order of first appearance.
        worst = np.ones(int(owner.max()) + 1)
        np.maximum.at(worst, owner, composed)
        _, first = np.unique(owner, return_index=True)
        seen = owner[np.sort(first)]
        slowdown = dict(zip(seen.tolist(), worst[seen].tolist(), strict=True))
        tau = placer.tolerance[owner]
        violations: dict[tuple[int, int], float] = {}
        ends = np.append(starts[1:], va.size)
        for g in np.flatnonzero(composed > tau + 1e-9).tolist():
            pairs = np.arange(starts[g], ends[g])  # a group's pairs are contiguous
            over = float(composed[g] - tau[g])
            left = float(composed[g])
            for k in pairs[np.argsort(-s_hat[pairs], kind="stable")].tolist():
                if left <= tau[g] + 1e-9:
                    break
                key = (int(va[k]), int(pa[k]))
                violations[key] = max(violations.get(key, 0.0), over)
                left -= max(float(s_hat[k]) - 1.0, 0.0)
        return [(v, p, e) for (v, p), e in violations.items()], slowdown

    def repair(
        self,
        placer: Placer,
        queued: list[int],
        violations: list[tuple[int, int, float]],
        slowdown: dict[int, float],
    ) -> tuple[list[int], list[tuple[int, int, float]], dict[int, float]]:
        """After M rounds: newly admitted jobs in a violating pair go back to the queue."""
        if not violations:
            return queued, violations, slowdown
        t = self.t
        evicted: set[int] = set()
        for victim, partner, _ in violations:
            fresh = [r for r in (victim, partner) if not t.running[r] and r not in evicted]
            if fresh and victim not in evicted and partner not in evicted:
                drop = max(fresh, key=lambda r: (t.jobs[r].arrival_time, -t.weight[r], r))
                placer.release(drop, t.per_gpu[drop, placer.config[drop]])
                evicted.add(drop)
        if not evicted:
            return queued, violations, slowdown
        remaining, slowdown = self.check(placer)
        return sorted(set(queued) | evicted), remaining, slowdown

    # -- output ---------------------------------------------------------------
    def _loop_output(self, placer: Placer) -> tuple[Pairs, Pairs, Protections]:
        """Held-apart and stepped-down pairs (each once), this epoch's separations, by id."""
        if not placer.apart and not self.stepped and not self.protections:
            return (), (), ()
        ids = [job.id for job in self.t.jobs]

        def named(pairs: set[tuple[int, int]]) -> Pairs:
            return tuple(sorted({_ordered(ids[a], ids[b]) for a, b in pairs}))

        done = tuple(
            (ids[p.victim], ids[p.partner], p.action, ids[p.actor], p.observed, p.tolerance)
            for p in self.protections
        )
        return named(placer.apart), named(self.stepped), done

    def build_plan(
        self,
        placer: Placer,
        queued: list[int],
        preempted: list[int],
        violations: list[tuple[int, int, float]],
        slowdown: dict[int, float],
        prices: np.ndarray,
        stats: dict[str, float],
        clock: _Clock,
    ) -> Plan:
        t = self.t
        refs = placer.table.refs
        rows = np.fromiter(placer.devices_of, dtype=np.intp, count=len(placer.devices_of))
        configs = placer.config[rows]
        memory_arr = t.per_gpu[rows, configs, GPU_MEM]
        sm = t.per_gpu[rows, configs, GPU_SM]
        # The plan holds its assignments as columns; records are built when read.
        listed = rows.tolist()
        jobs = list(map(t.jobs.__getitem__, listed))
        kept = np.zeros(len(t.jobs), dtype=bool)
        kept[list(placer.kept_in_place)] = True
        code = np.where(t.running[rows], np.where(configs != t.current[rows], 1, 0), 3)
        moved: dict[int, tuple[DeviceRef, ...]] = {}
        for k in np.flatnonzero(~kept[rows]).tolist():  # placed this epoch: maybe moved
            job = jobs[k]
            devices = moved[k] = tuple(refs[d] for d in placer.devices_of[listed[k]])
            if job.devices and devices != job.devices and set(devices) != set(job.devices):
                code[k] = 2
        worst = np.ones(rows.size)
        if slowdown:
            position = np.full(len(t.jobs), -1, dtype=np.intp)
            position[rows] = np.arange(rows.size)
            at = position[np.fromiter(slowdown.keys(), np.intp, len(slowdown))]
            values = np.fromiter(slowdown.values(), np.float64, len(slowdown))
            worst[at[at >= 0]] = values[at >= 0]
        families = self.snapshot.families
        assignments = AssignmentColumns(
            ids=[job.id for job in jobs],
            jobs=jobs,
            config=configs,
            configurations=tuple(families[name].configs for name in t.family_names),
            family=t.family_index[rows],
            moved=moved,
            memory=memory_arr,
            throughput=t.throughput[rows, configs],
            slowdown=worst,
            tolerance=placer.tolerance[rows],
            action=code,
            estimated=t.estimated_table[t.family_index[rows], configs],
            rows=rows,
            source=t.jobs,
        )
        rejected = {t.jobs[r].id: reason for r, reason in t.reasons.items() if not t.running[r]}
        per_job_gpus = t.gpus[rows]
        table = placer.table
        stats = dict(stats)
        stats["sm_allocated"] = float((sm * per_job_gpus).sum()) / max(table.size, 1)
        stats["memory_allocated"] = float((memory_arr * per_job_gpus).sum()) / max(
            float(table.memory_total.sum()), 1.0
        )
        stats["colocated_devices"] = float(np.count_nonzero(table.count >= 2))
        waiting = tuple(t.jobs[r].id for r in queued if t.jobs[r].id not in rejected)
        why = self.why_waiting
        queue_reasons = {
            t.jobs[r].id: why.get(r, WAIT_IN_LINE) for r in queued if t.jobs[r].id not in rejected
        }
        preempted_ids = tuple(t.jobs[r].id for r in preempted)
        violation_ids = tuple((t.jobs[v].id, t.jobs[p].id, float(e)) for v, p, e in violations)
        clock.lap("output")
        stats.update(clock.phases)
        separated, stepped, protections = self._loop_output(placer)
        if protections:
            stats["separations"] = float(len(protections))
        if self.band_preempted:
            stats["band_preemptions"] = float(self.band_preempted)
        return Plan(
            utilization=self.utilization,
            planned_at=self.snapshot.now,
            utilization_history_s=self.utilization_history_s,
            separated=separated,
            stepped=stepped,
            protections=protections,
            epoch=self.snapshot.epoch,
            prices=prices.copy(),
            assignments=assignments,
            queued=waiting,
            rejected=rejected,
            queue_reasons=queue_reasons,
            preempted=preempted_ids,
            violations=violation_ids,
            stats=stats,
        )
