"""Protect: undo co-location that observation says hurts (closed loop, spec 3.3.3, 3.4).

Predictions start co-locations; observations end them.  The planner reads,
per running job, its observed slowdown (``Snapshot.observed``, built by
:class:`~elastico_extender.core.observations.ObservationBook`).

Rules
-----
* **Harm.** A running job is *harmed* when each of its newest ``HARM_WINDOWS``
  (k = 2) observation windows shows a slowdown above its tolerance tau (the
  planner's adaptive tolerance at its current configuration), or the mean of
  its newest ``SLOW_WINDOWS`` (4) windows is (a pair just above tau, where
  one window's noise hides it; the mean has half the noise), or its newest
  window alone is above tau by more than ``ONE_WINDOW_MARGIN`` (9%, three
  sigma of one window's scatter) and by its reference's margin (below):
  observed beats predicted, and a window that far above tau is neither noise
  nor a reference's error, so the pair is separated on its first shared
  window (the first window of a case often understates it: a partner that
  joined or restarted ran for part of it only, and waiting for a second
  window cost such pairs an epoch).  The newest window is at most
  ``STALE_S`` old, and the job shared a device in it.
  The windows are those with the newest window's partners
  (``ObservedSlowdown.recent``): a move or a partner leaving starts a new case.
  The driver's window is one epoch (the simulator) or the agent's report
  period (the extender, a few seconds, at most one epoch), so a harmful pair
  is observed for at most two epochs before the plan that separates it:
  a harmful pair lives at most two epochs.  A stale job (its agent stopped
  reporting) is left where it is: the last decision stands.  A job whose
  reference rate is not its own solo rate carries that reference's error in
  every window, so its evidence is raised before the comparison: by
  ``FAMILY_MARGIN`` (5%) when the reference is its family's solo rate at that
  configuration in this cluster (the spread between jobs of one family), by
  ``PROFILE_MARGIN`` (10%) when it is a profile's T(c) (neither it nor its
  family was seen alone there).  The family's margin equals the admission
  band, so a pair admitted inside the band is separated only when observed
  worse than predicted; the profile's, twice the band, separated pairs
  admitted 5-10% inside tau on the margin alone, which made most of the
  loop's requeues on Philly (``benchmarks/results/loop``).  What the windows
  vouch for is computed once per window, when the book takes it
  (``observations.window_evidence``, ``ObservedSlowdown.evidence``); each epoch
  the planner only checks staleness and compares with tau (8,192 sharing jobs
  cost 10 ms per epoch when the formula ran per job per epoch, 2 ms now).
* **Separate, cheapest first.** For each harmed job and each partner on its
  device, the planner prices, for either tenant: stepping down in place to a
  configuration that needs no more of any resource, whose slowdown, predicted
  and then scaled by how far the observation (the evidence that found the harm,
  not the smoothed slowdown lagging behind it) exceeded the prediction for the
  current pair, stays within both tolerances (cost: the throughput given up
  plus the switching cost gamma0); or moving a one-GPU tenant to an idle GPU
  where it fits (cost: ``MOVE_COST_SWITCHES`` switching costs: a checkpoint,
  a restart and the lost warm-up).  The cheapest option wins.  A step-down
  must have observation behind it: at least ``HARM_WINDOWS`` windows of the
  stepped-down configuration pair, in both directions, learned by the online
  correction (``OnlineCorrection.observed_windows``).  Observed harm is not
  remedied on a prediction alone: at load 1.5 a third of the step-downs the
  predictor called safe left the pair above tau (12 of 37 on the 16-GPU test
  trace), each for another epoch or more, and those made the long tail of
  harm (up to 24 epochs on 64 GPUs); moving or requeueing ends it at once.  Without
  either, a one-GPU tenant moves next to other jobs where the ordinary IAC
  screen (the corrected predictor) admits it; failing that too, the newer
  tenant goes back to the queue (never worse than not sharing: it would have
  waited without sharing).  Only a tenant the driver can stop moves or goes back
  (``Job.preemptible``; in a cluster, a pod that allows migration and has a
  controller): the other one leaves instead, and when neither can, only a
  step-down in place answers the harm and otherwise the pair stays (a move or
  requeue nobody carries out would leave the harm where it is, and the plan
  would report a separation that never happened).
* **Hysteresis.** A pair steps down at most once (``Plan.stepped``): harm
  observed again after its step-down separates it.  When both tenants are
  harmed, a step-down must clear each one's own evidence (each direction
  scaled by that tenant's observed excess), and then it answers both cases
  in the same plan (before, the second tenant's turn found the pair stepped
  down and requeued the newer job: a switch paid for nothing).  A pair
  separated by a move or a requeue is *held apart* while both jobs live: the
  plan lists it (``Plan.separated``) and the next epoch's planner, given that
  plan as ``previous``, never puts the two on one device again.  A tenant
  that leaves for harm (moved or requeued) is held apart from every job it
  shared a device with where either of the two was harmed, not only from the
  partner whose pair was looked at: a job's window is one slowdown over all
  its partners, so which of them hurt it is unknown (an 8-GPU job requeued
  beside one partner went back next to the other four two epochs later,
  twice, on the 64-GPU load 1.0 mix).  The configuration pair itself is
  remembered as harmful by the online correction
  (:mod:`..interference.online`), which learns the observed slowdown from the
  same windows, so other jobs of the same pair are refused by the ordinary
  IAC screen, and that memory persists across restarts.
* **Admission band.**  While the loop is engaged a new co-location (an
  admission, a move next to others, a step-down) must clear every tenant's
  tolerance by ``ADMIT_BAND``: the IAC screen compares ``S_hat * (1 +
  ADMIT_BAND)`` with tau.  With ``PlannerSettings.gang_band`` on, a job of
  more than one GPU clears ``WIDE_JOB_BAND`` more (a requeued gang waits for
  as many GPUs to free at once; :mod:`.band`), except in a step-down, which
  is what spares a tenant its requeue.  A running pair stays while its
  observations are within tau, so admission and separation thresholds form a
  hysteresis band.  Without it the planner admitted pairs predicted just under tau which the
  harm test, on noisy and profile-referenced windows, separated two windows
  later, and the next job of the same pair took the freed place: on Philly
  at load 1.5 (600 h) 60% of separations were of pairs whose smoothed
  slowdown was within tau, and one job went back to the queue 41 times.
  (Adding the profile margin to the band as well cut requeues sixfold but
  refused most pairs a learned predictor would share, leaving that policy
  1.5% behind not sharing at all; ``benchmarks/results/loop/README.md``.)
  Without observations there is no band.
* **Unknown workloads run alone.** While the loop is engaged (any observation
  present), a job whose family has no measured configuration and which has
  never been observed may only start on an idle GPU, and nobody joins it,
  until the book has its solo rate (its observed peak memory, SM activity and
  rate become its measured profile through the profile store).  Likewise a
  running job whose fresh windows cannot be measured (``Snapshot.unmeasured``:
  it reports in a unit no profile states, launch rates, and neither it nor
  its family ran alone at that configuration on that GPU model): nobody joins
  it, and if it shares it moves to an idle GPU where one fits (the ordinary
  path of a running job next to a forbidden partner), for one solo window that
  measures it and, through its family's reference, every later job like it.

With an empty ``Snapshot.observed`` and no held-apart pairs none of this runs
and the planner's decisions are unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.observations import (
    FAMILY_MARGIN,
    HARM_WINDOWS,
    ONE_WINDOW_MARGIN,
    PROFILE_MARGIN,
    SLOW_WINDOWS,
    ObservedSlowdown,
)
from elastico_extender.core.planner.context import EpochRows
from elastico_extender.core.planner.placement import Placer

__all__ = [
    "FAMILY_MARGIN",
    "HARM_WINDOWS",
    "MOVE_COST_SWITCHES",
    "ONE_WINDOW_MARGIN",
    "PROFILE_MARGIN",
    "SLOW_WINDOWS",
    "STALE_S",
    "Protection",
    "harm_evidence",
    "harmed_rows",
    "held_apart",
    "separate",
    "solo_rows",
]

STALE_S = 300.0
"""Observations older than this (seconds of the driver's clock) are not acted on."""
MOVE_COST_SWITCHES = 2.0
"""A move (checkpoint, restart elsewhere, warm-up) costs this many in-place switches."""


@dataclass(frozen=True, slots=True)
class Protection:
    """One separation: who was harmed, by whom, what the planner did and why."""

    victim: int
    partner: int
    action: str  # "step-down", "move" or "requeue"
    actor: int  # the row that stepped down, moved or went back to the queue
    observed: float
    tolerance: float


def harm_evidence(seen: ObservedSlowdown, now: float) -> float | None:
    """The slowdown a job's windows vouch for, to compare with tau (module doc, "Harm";
    ``observations.window_evidence``, computed when the window arrived).

    None when there is no case: the newest window was not shared, or is stale.
    """
    if not seen.partners or not seen.recent or seen.age(now) > STALE_S:
        return None
    return seen.evidence


def harmed_rows(epoch: EpochRows, rows: dict[str, int]) -> dict[int, float]:
    """Harmed running rows (module doc, "Harm") -> their smoothed observed slowdown.

    ``rows`` maps job ids to rows; only jobs observed sharing are looked at.
    """
    snapshot = epoch.snapshot
    observed = snapshot.observed
    t = epoch.t
    found: list[int] = []
    low: list[float] = []
    running = t.running
    for job_id, seen in observed.items():
        evidence = harm_evidence(seen, snapshot.now)
        if evidence is None:
            continue
        row = rows.get(job_id)
        if row is not None and running[row]:
            found.append(row)
            low.append(evidence)
    if not found:
        return {}
    idx = np.array(found, dtype=np.intp)
    tau = epoch.tolerance(idx, t.current[idx])
    over = np.array(low) > tau + 1e-9
    return {r: float(observed[t.jobs[r].id].slowdown) for r in idx[over].tolist()}


def held_apart(pairs: tuple[tuple[str, str], ...], rows: dict[str, int]) -> set[tuple[int, int]]:
    """Row pairs of ``pairs`` (job ids, from the previous plan) whose jobs both live."""
    out: set[tuple[int, int]] = set()
    for a, b in pairs:
        ra, rb = rows.get(a), rows.get(b)
        if ra is not None and rb is not None:
            out.add((ra, rb))
            out.add((rb, ra))
    return out


def solo_rows(epoch: EpochRows, rows: dict[str, int]) -> set[int]:
    """Rows that run alone first (module doc, "Unknown workloads run alone").

    Jobs of families never measured that were never observed, and running jobs
    whose fresh windows cannot be measured (``Snapshot.unmeasured``: no reference
    rate, theirs or their family's).  ``rows`` maps job ids to rows.
    """
    snapshot = epoch.snapshot
    t = epoch.t
    oldest = snapshot.now - STALE_S
    out = set()
    for job_id, end in snapshot.unmeasured.items():  # few: not every job's id
        row = rows.get(job_id)
        if row is not None and t.running[row] and end >= oldest:
            out.add(row)
    if not snapshot.observed:
        return out
    # Padding rows (families have fewer configurations than the widest) count as estimated.
    unknown = np.asarray((t.estimated_table | ~t.real).all(axis=1))[t.family_index]
    out.update(r for r in np.flatnonzero(unknown).tolist() if t.jobs[r].id not in snapshot.observed)
    return out


def separate(
    epoch: EpochRows,
    placer: Placer,
    harmed: dict[int, float],
    switch_cost: float,
    stepped: set[tuple[int, int]],
) -> tuple[list[int], list[Protection]]:
    """Separate every harmed job from its partners, cheapest option first (module doc).

    Returns the rows sent back to the queue and what was done.  Moved and
    requeued pairs are added to ``placer.apart`` so nothing re-pairs them.
    """
    t, table = epoch.t, placer.table
    requeued: list[int] = []
    done: list[Protection] = []
    observed = epoch.snapshot.observed
    implicated = _implicated(placer, harmed)
    stepped_now: set[tuple[int, int]] = set()  # answered by a step-down in this plan

    def leave(row: int) -> None:
        for other in implicated.get(row, ()):
            placer.keep_apart(row, other)

    for victim in sorted(harmed, key=lambda r: (-harmed[r], r)):
        if victim not in placer.devices_of:
            continue
        partners = sorted(
            {o for d in placer.devices_of[victim] for o in table.occupants[d] if o != victim}
        )
        seen = observed[t.jobs[victim].id]
        evidence = _step_evidence(seen, epoch.snapshot.now)
        for partner in partners:
            if victim not in placer.devices_of or partner not in placer.devices_of:
                continue
            if not set(placer.devices_of[victim]) & set(placer.devices_of[partner]):
                continue
            if (victim, partner) in stepped_now:  # judged safe both ways: it answers both
                continue
            tau = float(placer.tolerance[victim])  # a step-down of the victim changes it
            step = None
            if (victim, partner) not in stepped:  # a pair steps down once, then separates
                # A harmed partner's own evidence binds its direction too (see stepped_now).
                theirs = observed.get(t.jobs[partner].id) if partner in harmed else None
                both = (evidence, _step_evidence(theirs, epoch.snapshot.now) if theirs else 0.0)
                step = _cheapest_step_down(epoch, placer, victim, partner, both, switch_cost)
            leaving = _leavers(epoch, victim, partner)
            move = _move_target(epoch, placer, leaving)
            move_cost = MOVE_COST_SWITCHES * switch_cost
            if step is not None and (move is None or step[0] <= move_cost):
                _, row, config = step
                epoch.reconfigure(placer, row, config)
                stepped.update(((victim, partner), (partner, victim)))
                stepped_now.update(((victim, partner), (partner, victim)))
                done.append(Protection(victim, partner, "step-down", row, seen.slowdown, tau))
                continue
            if not leaving:
                continue  # neither can leave (Job.preemptible): planning it apart is in vain
            placer.keep_apart(victim, partner)
            if move is not None:
                row, device = move
                config = int(placer.config[row])
                placer.release(row, t.per_gpu[row, config])
                epoch.commit_row(placer, row, config, [device])
                leave(row)
                done.append(Protection(victim, partner, "move", row, seen.slowdown, tau))
                continue
            moved = _move_next_to_others(epoch, placer, leaving, implicated)
            if moved is not None:
                leave(moved)
                done.append(Protection(victim, partner, "move", moved, seen.slowdown, tau))
                continue
            newer = leaving[0]
            placer.release(newer, t.per_gpu[newer, placer.config[newer]])
            leave(newer)
            requeued.append(newer)
            done.append(Protection(victim, partner, "requeue", newer, seen.slowdown, tau))
    return requeued, done


def _step_evidence(seen: ObservedSlowdown, now: float) -> float:
    """The slowdown a step-down must clear for a harmed job: the evidence that found
    the harm, or the smoothed slowdown if higher; never the smoothed value alone, which
    lags below the evidence and would step down pairs still harmful."""
    return max(harm_evidence(seen, now) or 0.0, seen.slowdown)


def _implicated(placer: Placer, harmed: Mapping[int, float]) -> dict[int, set[int]]:
    """Row -> the rows it shares a device with where either of the two is harmed.

    A harmed job's window is one slowdown over all its partners (on every device
    it holds), so which of them hurt it is unknown: a tenant that leaves for harm
    is held apart from each of them, not only from the partner whose pair the
    planner looked at first (an 8-GPU job requeued that way went back next to
    the others two epochs later, twice, on the 64-GPU load 1.0 trace).
    """
    table = placer.table
    out: dict[int, set[int]] = {}
    for victim in harmed:
        for d in placer.devices_of.get(victim, ()):
            for other in table.occupants[d]:
                if other != victim:
                    out.setdefault(victim, set()).add(other)
                    out.setdefault(other, set()).add(victim)
    return out


def _leavers(epoch: EpochRows, victim: int, partner: int) -> list[int]:
    """The tenants that may move away, the newer first: those the driver can stop and
    start elsewhere (``Job.preemptible``; a pod nothing would evict stays put)."""
    t, stoppable = epoch.t, epoch.snapshot.columns.preemptible
    rows = [r for r in (victim, partner) if stoppable[r]]
    return sorted(rows, key=lambda r: (-t.jobs[r].arrival_time, -r))


def _move_target(epoch: EpochRows, placer: Placer, leaving: list[int]) -> tuple[int, int] | None:
    """(row, idle device) for moving one one-GPU tenant of ``leaving`` (``_leavers``: the
    newer first); None if neither can."""
    t, table = epoch.t, placer.table
    if not np.any(table.count == 0):
        return None
    for row in leaving:
        if len(placer.devices_of[row]) != 1:
            continue
        need = t.per_gpu[row, int(placer.config[row])]
        idle = table.fits(need) & (table.count == 0)
        open_devices = epoch.open_devices(row)  # never onto a node barred to it
        if open_devices is not None:
            idle &= open_devices
        if idle.any():
            target = table.choose(idle, need, 1, best_fit=True)
            if target is not None:
                return row, int(target[0])
    return None


def _move_next_to_others(
    epoch: EpochRows,
    placer: Placer,
    leaving: list[int],
    implicated: Mapping[int, set[int]],
) -> int | None:
    """Move one one-GPU tenant of ``leaving`` (``_leavers``: the newer first) to another
    device where IAC admits it.

    No idle GPU fits: the tenant goes wherever the ordinary screen (corrected
    prediction within every tolerance, held-apart pairs refused) accepts it,
    in its current configuration, off its current device and off every device
    of a row it is implicated with (``_implicated``).  Returns the moved row, or
    None (nothing moved) when no device accepts either tenant.
    """
    t, table = epoch.t, placer.table
    for row in leaving:
        devices = placer.devices_of[row]
        if len(devices) != 1:
            continue
        config = int(placer.config[row])
        allowed = np.ones(table.size, dtype=bool)
        allowed[list(devices)] = False
        for other in implicated.get(row, ()):
            allowed[list(placer.devices_of.get(other, ()))] = False
        placer.release(row, t.per_gpu[row, config])
        if epoch.try_row(placer, row, [config], allowed_devices=allowed):
            return row
        epoch.commit_row(placer, row, config, list(devices))
    return None


def _cheapest_step_down(
    epoch: EpochRows,
    placer: Placer,
    victim: int,
    partner: int,
    observed: tuple[float, float],
    switch_cost: float,
) -> tuple[float, int, int] | None:
    """(cost, row, configuration) of the cheapest safe in-place step-down of either tenant.

    ``observed``: the victim's evidence and the partner's (0 when the partner is
    not harmed).  Safety needs a predictor: S_hat of the stepped-down pair, in
    both directions, each times its tenant's observed / predicted ratio at the
    current pair (at least 1), within both tolerances; and observation behind that S_hat
    (module doc, "Separate"): at least ``HARM_WINDOWS`` windows of the
    stepped-down configuration pair in each direction, learned by the online
    correction.  A predictor that learns nothing vouches for no step-down.
    """
    predictor = placer.predictor
    observed_windows = getattr(predictor, "observed_windows", None)
    if predictor is None or observed_windows is None:
        return None
    t = epoch.t
    device = placer.devices_of[victim][0]
    memory = float(placer.table.memory_total[device]) / 1024.0
    feats = placer.features
    excess: dict[int, float] | None = None  # predicted once an option is observed
    best: tuple[float, int, int] | None = None
    for row, other in ((victim, partner), (partner, victim)):
        if len(placer.devices_of[row]) != 1:
            continue
        current = int(placer.config[row])
        need = t.per_gpu[row]
        leaner = np.all(need <= need[current] + 1e-9, axis=1) & t.valid[row]
        leaner &= t.throughput[row] < t.throughput[row, current] - 1e-12
        options = np.flatnonzero(leaner)
        if options.size == 0:
            continue
        mine = t.features(np.full(options.size, row), options)
        theirs = np.broadcast_to(feats[other], mine.shape)
        pairs = np.concatenate(
            [pair_features(mine, theirs, memory), pair_features(theirs, mine, memory)]
        )
        seen = np.asarray(observed_windows(pairs), dtype=np.float64) >= HARM_WINDOWS
        seen = seen[: options.size] & seen[options.size :]
        if not seen.any():  # nothing observed vouches for any of them: no prediction needed
            continue
        s = np.asarray(predictor.predict(pairs), dtype=np.float64)
        if excess is None:
            now = predictor.predict(
                pair_features(feats[[victim, partner]], feats[[partner, victim]], memory)
            )
            excess = {
                victim: max(1.0, observed[0] / max(float(now[0]), 1.0)),
                partner: max(1.0, observed[1] / max(float(now[1]), 1.0)),
            }
        # Each harmed tenant's direction carries its observed excess over the prediction.
        s_row, s_other = s[: options.size] * excess[row], s[options.size :] * excess[other]
        tau_row = epoch.tolerance_rows(np.array([row]))[0][options]
        tau_other = float(placer.tolerance[other])
        # A step-down is a new co-location of the pair: it clears the admission band, the
        # one-GPU band even for a gang, as it is what spares the tenant its requeue.
        margin = placer.margin_for(1)
        safe = (s_row * margin <= tau_row) & (s_other * margin <= tau_other)
        safe &= seen
        if not safe.any():
            continue
        cost = 1.0 - t.throughput[row, options] / t.throughput[row, current]
        cost = t.weight[row] * cost + switch_cost
        cost[~safe] = np.inf
        k = int(np.argmin(cost))
        if best is None or cost[k] < best[0]:
            best = (float(cost[k]), row, int(options[k]))
    return best
