"""Interference-aware placement of one job: the step both PDS admission and the
extender's per-pod filter take ("where can this job run, in which configuration?").

A :class:`Placer` wraps a :class:`DeviceTable` and remembers, for every job it
has placed, its per-job IAC features and tolerance.  To place a job it tries
configurations in the order given (best ESP score first), and for each one:

1. keeps the devices with room (``DeviceTable.fits``);
2. drops devices where the pair is forbidden this epoch (a violation found in an
   earlier ESP-IAC round);
3. if interference checking is on, predicts S_hat in both directions against
   every occupant of the best candidate devices in **one** batched predictor
   call, and keeps devices where the newcomer stays within its tolerance and
   no occupant leaves its own (spec 3.3: "permits co-location only if the
   predicted slowdown for all participating jobs falls within tau");
4. picks devices by best fit (tightest memory) or first fit.

More than two tenants: the predictor answers pairs, and a job's slowdown on a
device is composed from them additively, ``S_i = 1 + sum_j (S_hat(i|j) - 1)``
(:func:`device_slowdown`): tenants that each saturate the GPU time-slice it,
so three such jobs run at a third each (pairwise 2x, composed 3x), where the
worst pair alone (2x) would admit a third tenant each pair tolerates but the
three together do not.  An occupant's excess from the tenants already there is
predicted once per device state and cached (``occupant_excess``).

A queue asks the same screen again and again: hundreds of pending jobs of a few
shapes, each walked every epoch.  A configuration's refusal is remembered per shape
and reused, exactly, until something leaves the table (``Placer._refusal``).  What a
placer keeps from the predictor (refusals, occupants' excess) is dropped when the
predictor's ``generation`` moves: a placer can outlive the plan that made it (the
service's ``PlacementView``) while the online correction learns.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.interference.features import NUM_JOB_FEATURES, pair_features
from elastico_extender.core.interference.predictor import SlowdownPredictor, predictor_generation
from elastico_extender.core.planner.band import admit_margin
from elastico_extender.core.planner.devices import DeviceTable, tenant_pairs
from elastico_extender.core.planner.screening import OptionScreen
from elastico_extender.core.resources import GPU_MEM, GPU_SM

__all__ = ["Placed", "Placer", "device_slowdown"]

MAX_CHECKED_DEVICES = 32
"""Occupied candidate devices whose interference is predicted per attempt (best fit first);
bounds one placement's cost on a large cluster while keeping the tightest options."""
_NO_ROW = -1
"""A row id no constraint names: asks a placement question without any row's constraints."""
REFUSAL_LOG_LIMIT = 4096
"""Placements a placer logs for its remembered refusals; beyond it they are forgotten
(a long-lived placer that only ever places stays bounded)."""
MAX_SCREENED_OPTIONS = 6
"""Configurations of one job screened for interference per placement attempt (best score
first).  A job whose best few configurations are all refused next to every occupant
is unlikely to be accepted in a leaner one (the occupants' own tolerance is what
refuses most pairs), and a predictor harsher than the default refuses most pairs: without
this bound one attempt walked all of a family's configurations (issue 14: ~197k
placement calls in 25 plans).  Idle GPUs are still tried for every configuration."""


def device_slowdown(excess: np.ndarray, groups: np.ndarray, count: int) -> np.ndarray:
    """Composed slowdown per group: ``1 + sum(excess)`` over the pairs of each group.

    ``excess`` holds S_hat - 1 per predicted pair and ``groups`` the group (a victim on
    a device, or a candidate device) each pair belongs to; the module doc says why the
    excesses of a job's partners on one device add.
    """
    total = np.ones(count)
    np.add.at(total, groups, np.maximum(excess, 0.0))
    return total


@dataclass(frozen=True, slots=True)
class Placed:
    config: int
    devices: tuple[int, ...]
    slowdown: float  # worst predicted S_hat of the newcomer on its devices (1.0 alone)


class Placer:
    """Places jobs onto a :class:`DeviceTable`, checking interference when given a predictor.

    What it knows of each placed job row is held in columns (``config``,
    ``tolerance``, ``features``, indexed by row and grown on demand) so a
    bulk commit of thousands of running jobs is a few array writes.
    ``devices_of`` maps each placed row to its device indices, in the order
    the rows were placed; a row is placed exactly when it is a key there.
    """

    def __init__(
        self,
        table: DeviceTable,
        predictor: SlowdownPredictor | None,
        forbidden: set[tuple[int, int, int, int]] | None = None,
        rows: int = 0,
    ) -> None:
        self.table = table
        self.predictor = predictor
        self.forbidden = forbidden or set()
        self.forbidden_rows = {key[0] for key in self.forbidden}
        # Closed loop (``protect``): job rows held apart in every configuration, and
        # rows that must run alone (an unknown workload not yet observed).
        self.apart: set[tuple[int, int]] = set()
        self.solo: set[int] = set()
        self.config = np.full(rows, -1, dtype=np.intp)
        self.tolerance = np.zeros(rows)
        # Closed loop engaged: new co-locations clear the admission band (``band``), a
        # gang's the wider one where ``gang_band`` is on (``PlannerSettings.gang_band``).
        self.banded = False
        self.gang_band = False
        self.features = np.zeros((rows, NUM_JOB_FEATURES), dtype=np.float32)
        self.devices_of: dict[int, tuple[int, ...]] = {}
        self.kept_in_place: set[int] = set()  # rows committed in bulk on their own devices
        # (shape, config, best_fit, margin) -> (highest tau at which that configuration's
        # screen left no devices, length of ``_placed_on`` when that was last true); all
        # valid while nothing has left the table since ``_refused_freed`` (_refusal).
        self._refused: dict[tuple[object, ...], tuple[float, int]] = {}
        self._refused_freed = -1
        self._placed_on: list[int] = []  # devices of every commit, in order
        # device -> {occupant row: its predicted excess from the other occupants}
        self._excess: dict[int, dict[int, float]] = {}
        self._followed = (predictor, predictor_generation(predictor))

    # -- bookkeeping --------------------------------------------------------
    def _reserve(self, rows: int) -> None:
        """Grow the per-row columns to hold at least ``rows`` rows."""
        have = self.config.size
        if rows <= have:
            return
        size = max(rows, 2 * have, 16)
        self.config = np.concatenate([self.config, np.full(size - have, -1, dtype=np.intp)])
        self.tolerance = np.concatenate([self.tolerance, np.zeros(size - have)])
        self.features = np.concatenate(
            [self.features, np.zeros((size - have, self.features.shape[1]), dtype=np.float32)]
        )

    def commit(
        self,
        row: int,
        config: int,
        devices: Sequence[int],
        per_gpu: np.ndarray,
        features: np.ndarray,
        tolerance: float,
    ) -> None:
        self._reserve(row + 1)
        self.table.place(row, devices, per_gpu)
        if len(self._placed_on) >= REFUSAL_LOG_LIMIT:
            self._refused.clear()
            self._placed_on.clear()
        self._placed_on.extend(devices)
        for d in devices:
            self._excess.pop(d, None)
        self.config[row] = config
        self.features[row] = features
        self.tolerance[row] = tolerance
        self.devices_of[row] = tuple(devices)

    def commit_many(
        self,
        rows: np.ndarray,
        configs: np.ndarray,
        devices: list[tuple[int, ...]],
        worker_rows: np.ndarray,
        worker_devices: np.ndarray,
        worker_demand: np.ndarray,
        features: np.ndarray,
        tolerance: np.ndarray,
    ) -> None:
        """Bulk commit of jobs already known to fit; ``devices[k]`` belongs to ``rows[k]``."""
        if rows.size:
            self._reserve(int(rows.max()) + 1)
        self.table.place_many(worker_rows, worker_devices, worker_demand)
        self._excess.clear()
        self._refused.clear()
        self.config[rows] = configs
        self.features[rows] = features
        self.tolerance[rows] = tolerance
        listed = rows.tolist()
        self.devices_of.update(zip(listed, devices, strict=True))
        self.kept_in_place.update(listed)

    def release(self, row: int, per_gpu: np.ndarray) -> None:
        self.kept_in_place.discard(row)
        devices = self.devices_of.pop(row)
        self.table.remove(row, devices, per_gpu)
        for d in devices:
            self._excess.pop(d, None)
        self.config[row] = -1

    def keep_apart(self, a: int, b: int) -> None:
        """Never put rows ``a`` and ``b`` on one device (closed-loop hysteresis)."""
        self.apart.update(((a, b), (b, a)))
        self.forbidden_rows.update((a, b))
        self._refused.clear()

    def set_loop(self, apart: set[tuple[int, int]], solo: set[int]) -> None:
        """Held-apart row pairs (both orders) and run-alone rows for this epoch."""
        self.apart = set(apart)
        self.solo = set(solo)
        self.forbidden_rows.update(a for a, _ in apart)
        self.forbidden_rows.update(solo)
        self._refused.clear()

    # -- checks ------------------------------------------------------------
    def kept_apart(self, row: int, device: int) -> bool:
        """Whether a constraint of every configuration keeps ``row`` off ``device``: it or
        an occupant must run alone, or the two are held apart (protect)."""
        if row not in self.forbidden_rows and not self.solo:
            return False
        alone = row in self.solo
        return any(
            other != row and (alone or other in self.solo or (row, other) in self.apart)
            for other in self.table.occupants[device]
        )

    def is_forbidden(self, row: int, config: int, devices: Sequence[int]) -> bool:
        if row not in self.forbidden_rows:
            return False
        for d in devices:
            if self.kept_apart(row, d):
                return True
            for other in self.table.occupants[d]:
                if other != row and (row, config, other, int(self.config[other])) in self.forbidden:
                    return True
        return False

    def follow_predictor(self) -> None:
        """Drop what was kept from the predictor (occupants' excess, refusals) if it was
        replaced or its generation moved since (a predictor without one is trusted)."""
        followed = (self.predictor, predictor_generation(self.predictor))
        if followed[1] != self._followed[1] or followed[0] is not self._followed[0]:
            self._followed = followed
            self._excess.clear()
            self._refused.clear()

    def predict_against(
        self, devices: np.ndarray, features: np.ndarray, tolerance: float, gpus: int = 1
    ) -> tuple[np.ndarray, np.ndarray]:
        """For each device: (safe?, newcomer's worst S_hat) next to that device's occupants.

        Empty devices are safe with S_hat 1.  One predictor call covers all pairs.
        Both sides' S_hat times the admission band of a job of ``gpus`` GPUs
        (``margin_for``) are compared with tau.
        """
        self.follow_predictor()
        return self._predict_against(devices, features, tolerance, self.margin_for(gpus))

    def margin_for(self, gpus: int) -> float:
        """The factor on S_hat in the admission screen of a job of ``gpus`` GPUs."""
        return admit_margin(self.banded, gpus, self.gang_band)

    def _predict_against(
        self, devices: np.ndarray, features: np.ndarray, tolerance: float, margin: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """``predict_against`` inside a search, which followed the predictor already."""
        safe = np.ones(len(devices), dtype=bool)
        worst = np.ones(len(devices))
        if self.predictor is None or len(devices) == 0:
            return safe, worst
        pair_dev: list[int] = []
        partner_rows: list[int] = []
        occupants = self.table.occupants
        for k, d in enumerate(devices.tolist()):
            for other in occupants[d]:
                pair_dev.append(k)
                partner_rows.append(other)
        if not partner_rows:
            return safe, worst
        partners = np.array(partner_rows, dtype=np.intp)
        # Many devices host the same partner configuration: predict each distinct
        # (partner features, device memory) once, then map back.
        memory_gib = self.table.memory_total[devices[np.array(pair_dev)]] / 1024.0
        theirs = self.features[partners]
        ids: dict[tuple[bytes, float], int] = {}
        first_list: list[int] = []
        inverse_list: list[int] = []
        for i, mem in enumerate(memory_gib.tolist()):
            key = (theirs[i].tobytes(), mem)
            slot = ids.get(key)
            if slot is None:
                slot = ids[key] = len(first_list)
                first_list.append(i)
            inverse_list.append(slot)
        first = np.array(first_list, dtype=np.intp)
        inverse = np.array(inverse_list, dtype=np.intp)
        u_theirs = theirs[first]
        u_memory = memory_gib[first]
        mine = np.broadcast_to(features, (first.size, features.shape[0]))
        x = np.concatenate(
            [pair_features(mine, u_theirs, u_memory), pair_features(u_theirs, mine, u_memory)]
        )
        s = np.asarray(self.predictor.predict(x), dtype=np.float64)
        half = first.size
        s_new, s_old = s[:half][inverse], s[half:][inverse]
        idx = np.array(pair_dev, dtype=np.intp)
        return self.verdict(
            idx, len(devices), s_new, s_old, tolerance, partners, devices[idx], margin
        )

    def verdict(
        self,
        at: np.ndarray,
        count: int,
        s_new: np.ndarray,
        s_old: np.ndarray,
        tolerance: float,
        partners: np.ndarray,
        pair_devices: np.ndarray,
        margin: float,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(safe?, newcomer's composed S_hat) of ``count`` candidate devices.

        Per pair (``at``: its candidate's position, ``partners``: the occupant's row,
        ``pair_devices``: its device) the newcomer's S_hat next to the occupant and the
        occupant's next to the newcomer.  A device is refused when the newcomer's
        composed slowdown there, or an occupant's (its excess from the others already
        there plus the newcomer's), times ``margin`` (the closed loop's admission band
        for the newcomer, which is the tenant a separation sends back), exceeds tau.
        """
        worst = device_slowdown(s_new - 1.0, at, count)
        before = self.occupant_excess(pair_devices, partners)
        occupant = 1.0 + before + np.maximum(s_old - 1.0, 0.0)
        bad_pair = occupant * margin > self.tolerance[partners]
        paired = np.zeros(count, dtype=bool)
        paired[at] = True
        safe = ~paired | (worst * margin <= tolerance)
        safe[np.unique(at[bad_pair])] = False
        return safe, worst

    def occupant_excess(self, devices: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """Per (device, occupant row): its predicted excess from the device's other occupants.

        Zero where it is alone.  Devices with two or more occupants are predicted in one
        batched call for all of them and cached until their occupants change.
        """
        out = np.zeros(len(rows))
        if self.predictor is None or len(rows) == 0:
            return out
        occupants = self.table.occupants
        todo = [
            d
            for d in dict.fromkeys(devices.tolist())
            if d not in self._excess and len(occupants.get(d, ())) >= 2
        ]
        if todo:
            self._predict_excess(todo)
        cache = self._excess
        for k, (d, r) in enumerate(zip(devices.tolist(), rows.tolist(), strict=True)):
            known = cache.get(d)
            if known is not None:
                out[k] = known.get(r, 0.0)
        return out

    def _predict_excess(self, devices: list[int]) -> None:
        """Fill the excess cache of ``devices`` (each shared) in one predictor call."""
        assert self.predictor is not None
        victims, partners, where, _ = tenant_pairs(self.table, devices)
        memory = self.table.memory_total[where] / 1024.0
        s = np.asarray(
            self.predictor.predict(
                pair_features(self.features[victims], self.features[partners], memory)
            ),
            dtype=np.float64,
        )
        excess = np.maximum(s - 1.0, 0.0)
        for d in devices:
            self._excess[d] = {}
        for d, a, e in zip(where.tolist(), victims.tolist(), excess.tolist(), strict=True):
            slot = self._excess[d]
            slot[a] = slot.get(a, 0.0) + e

    # -- placement -----------------------------------------------------------
    def try_place(
        self,
        row: int,
        gpus: int,
        options: Sequence[int],
        per_gpu: np.ndarray,
        features: np.ndarray,
        tolerance: np.ndarray,
        *,
        best_fit: bool = True,
        allowed_devices: np.ndarray | None = None,
        commit: bool = True,
        shape: Hashable | None = None,
    ) -> Placed | None:
        """Place ``row`` in the first configuration of ``options`` that fits safely.

        ``per_gpu`` (K, R), ``features`` (K, 14) and ``tolerance`` (K,) are the
        job's rows for every configuration; ``allowed_devices`` optionally limits
        the devices (the extender asks node by node).  ``shape``, when given, must
        identify ``gpus``, ``per_gpu`` and ``features`` (e.g. the job's demand family
        and GPU count); jobs of one shape differ only in their options and tolerances.
        Queues hold many jobs of few shapes: a configuration whose interference screen
        left no devices is not screened again for that shape while the refusal holds
        (``_refusal``).
        """
        self.follow_predictor()
        if shape is not None and allowed_devices is None and row in self.forbidden_rows:
            # Held-apart, run-alone and forbidden-pair rows only lose devices to their
            # constraints: if the same question without them finds nothing, neither do
            # they.  Asked as no row, it is a plain search and records its refusals.
            unconstrained = self._try_options(
                _NO_ROW, gpus, options, per_gpu, features, tolerance, best_fit, None, False,
                shape,
            )  # fmt: skip
            if unconstrained is None:
                return None
        return self._try_options(
            row, gpus, options, per_gpu, features, tolerance, best_fit, allowed_devices, commit,
            shape,
        )  # fmt: skip

    def _try_options(
        self,
        row: int,
        gpus: int,
        options: Sequence[int],
        per_gpu: np.ndarray,
        features: np.ndarray,
        tolerance: np.ndarray,
        best_fit: bool,
        allowed_devices: np.ndarray | None,
        commit: bool,
        shape: Hashable | None = None,
    ) -> Placed | None:
        """``try_place``'s search; screen refusals are remembered (``_refusal``)."""
        table = self.table
        if self._refused_freed != table.freed:
            self._refused.clear()
            self._placed_on.clear()
            self._refused_freed = table.freed
        # Only a plain search records refusals (run-alone rows are forbidden rows too).
        records = shape is not None and allowed_devices is None and row not in self.forbidden_rows
        largest: tuple[float, float] | None = None
        any_idle = gpus == 1 and allowed_devices is None and bool(table.idle_per_node.any())
        screens = 0
        batch: OptionScreen | None = None
        screen = self.predictor is not None or row in self.forbidden_rows or bool(self.solo)
        # Whether idle devices could ever hold the whole job: when they cannot, every
        # option needs a screen, and once MAX_SCREENED_OPTIONS were screened no later
        # option can be placed (a family has up to ~200: not even looked at).
        idle = table.count == 0
        if allowed_devices is not None:
            idle = idle & allowed_devices
        idle_may_do = np.count_nonzero(idle) >= gpus
        for i, config in enumerate(options):
            if screen and screens >= MAX_SCREENED_OPTIONS and not idle_may_do:
                break
            demand = per_gpu[config]
            if largest is not None and (
                demand[GPU_MEM] > largest[0] + 1e-9 or demand[GPU_SM] > largest[1] + 1e-9
            ):
                continue
            if any_idle:
                spot = table.choose_idle(demand, best_fit)
                if spot is not None and spot is not False:  # an idle GPU: no co-location to check
                    if commit:
                        self.commit(
                            row, config, [spot], demand, features[config], float(tolerance[config])
                        )
                    return Placed(config, (spot,), 1.0)
            if largest is None:  # cheap rejection of configurations no device can hold
                largest = (
                    float(table.mem_free.max()) if table.size else 0.0,
                    float(table.sm_free.max()) if table.size else 0.0,
                )
            if demand[GPU_MEM] > largest[0] + 1e-9 or demand[GPU_SM] > largest[1] + 1e-9:
                continue
            tau = float(tolerance[config])
            mask = table.fits(demand)
            if allowed_devices is not None:
                mask &= allowed_devices
            if row in self.solo:  # runs alone (protect): only idle devices, nothing to screen
                mask &= table.count == 0
            if np.count_nonzero(mask) < gpus:
                continue
            slowdown_of: np.ndarray | None = None  # 1.0 everywhere unless screened
            # Idle devices are always safe and ``choose`` prefers them: screening the
            # occupied ones is only needed when the idle ones cannot take the whole job.
            enough_idle = idle_may_do and np.count_nonzero(mask & idle) >= gpus
            refusal = None
            if not enough_idle and screen:
                if screens >= MAX_SCREENED_OPTIONS:
                    continue
                screens += 1
                if shape is not None and allowed_devices is None:
                    refusal = (shape, config, best_fit, self.margin_for(gpus))
                    if self._refusal(refusal, tau, gpus, mask, features[config]):
                        continue
                if screens >= 2 and batch is None and self.predictor is not None:
                    # The first choice was refused: screen every remaining one in one call.
                    busy = table.count > 0
                    if allowed_devices is not None:
                        busy &= allowed_devices
                    rest = list(dict.fromkeys(options[i:]))[:MAX_SCREENED_OPTIONS]
                    batch = OptionScreen(self, np.flatnonzero(busy), rest, features)
                mask, slowdown_of = self._screen(
                    row,
                    config,
                    mask,
                    demand,
                    features[config],
                    tau,
                    gpus,
                    best_fit,
                    batch,
                )
            devices = table.choose(mask, demand, gpus, best_fit)
            if devices is None:
                if records and refusal is not None:
                    # ``_refusal`` said no: nothing was known at this tau for the table as
                    # it is now, so this refusal replaces whatever was remembered.
                    self._refused[refusal] = (tau, len(self._placed_on))
                continue
            worst = 1.0 if slowdown_of is None else float(slowdown_of[devices].max())
            placed = Placed(config, tuple(devices), worst)
            if commit:
                self.commit(row, config, devices, demand, features[config], tau)
            return placed
        return None

    def _refusal(
        self, key: tuple[object, ...], tau: float, gpus: int, mask: np.ndarray, features: np.ndarray
    ) -> bool:
        """Whether a remembered refusal answers this screen: no device will be found.

        Queues hold many jobs of few shapes and walk them every epoch, so the same
        screen is asked again and again.  A refusal recorded at tau holds for every tau
        no higher (the verdict only loosens as tau grows), and for any row: a row's own
        constraints, or a run alone, only remove devices from the plain screen's (only
        a plain search, over every device, records one).  It holds until something
        leaves the table.  Placements since then only take room, so for a one-GPU job
        only the devices placed on since it was recorded can have changed the answer:
        those that still fit are screened, and if none is safe the refusal stands.  The
        best-fit bound on screened devices keeps the answer exact: a device placed on
        only ranks earlier, pushing out devices that were refused anyway.  A gang's
        refusal holds only while nothing was placed.
        """
        known = self._refused.get(key)
        if known is None or tau > known[0]:
            return False
        recorded, since = known
        placed = len(self._placed_on)
        if since == placed:
            return True
        if gpus != 1:
            return False
        changed = np.unique(np.asarray(self._placed_on[since:], dtype=np.intp))
        changed = changed[mask[changed]]
        if changed.size:
            if self.predictor is None:
                return False
            safe, _ = self._predict_against(changed, features, recorded, self.margin_for(gpus))
            if safe.any():
                return False
        self._refused[key] = (recorded, placed)
        return True

    def _screen(
        self,
        row: int,
        config: int,
        mask: np.ndarray,
        demand: np.ndarray,
        features: np.ndarray,
        tolerance: float,
        gpus: int,
        best_fit: bool,
        batch: OptionScreen | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Restrict ``mask`` to devices that are not forbidden and are interference-safe.

        ``batch``, when it covers ``config``, answers the interference question
        from predictions made for several configurations at once.
        """
        table = self.table
        idx = np.flatnonzero(mask)
        occupied = table.count[idx] > 0
        busy = idx[occupied]
        key = table.mem_free[busy] if best_fit else busy.astype(np.float64)
        limit = max(MAX_CHECKED_DEVICES, 4 * gpus)
        if busy.size > limit:
            top = np.argpartition(key, limit - 1)[:limit]
            busy, key = busy[top], key[top]
        checked = busy[np.argsort(key, kind="stable")]
        screened = np.zeros_like(mask)
        screened[idx[~occupied]] = True
        slowdown_of = np.ones(table.size)
        if checked.size and self.solo and row not in self.forbidden_rows:
            occupied_by_solo = np.array(
                [any(o in self.solo for o in table.occupants[int(d)]) for d in checked], dtype=bool
            )
            checked = checked[~occupied_by_solo]
        if checked.size:
            if row in self.forbidden_rows:
                keep = np.array(
                    [not self.is_forbidden(row, config, [int(d)]) for d in checked], dtype=bool
                )
                checked = checked[keep]
            margin = self.margin_for(gpus)
            if batch is not None and batch.covers(config):
                safe, worst = batch.verdict(config, checked, tolerance, margin)
            else:
                safe, worst = self._predict_against(checked, features, tolerance, margin)
            screened[checked[safe]] = True
            slowdown_of[checked] = worst
        return screened, slowdown_of
