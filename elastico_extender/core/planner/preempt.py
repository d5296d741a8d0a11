"""Band preemption: a queued job of a better band may stop a running job of a worse one.

On by default (``PlannerSettings.band_preemption``; measured in
``benchmarks/results/issue14/band_preemption.md``).  Tiresias wins on some
Philly weeks because a short job that arrives at a full cluster preempts a
long one that has run for hours; ElastiCo's bands (``pricing.queueing``) order
the queue the same way but, without this pass, never stop a running job for it.

After every admission pass of the epoch (ordered packing, squeeze, residual
admission), a queued job still unplaced may free room by preempting running
jobs (``Plan.preempted``: checkpointed and requeued, as protect's requeues are;
the driver charges the restart when the job resumes).  Anti-thrash rules:

* **across bands only**: the victim's band of attained service (Tiresias'
  2D-LAS: ``queueing.attained_service`` through the queue's thresholds) is
  strictly worse than the queued job's, so a job that has run for hours yields
  to one that has not, and jobs of one band never preempt each other;
* **the estimate may veto**: the victim's service key in the queue (expected
  remaining GPU-time where history gives it, else attained service:
  ``JobTables.service_key``) exceeds ``preemption_remaining_ratio`` times the
  queued job's, SRPT's rule with a margin for rough estimates, so a job about to
  finish is not stopped for one expected to run longer, nor a long job for one
  about as long; without history the queued job's key is its attained service
  (0 for a newcomer), and plain LAS decides.  No starvation promotion here
  (waiting counts from arrival, so a job just preempted would count as starved
  at once and preempt its preemptor back); and the victim's user weight is not
  higher;
* **minimum run**: a job runs ``preemption_min_run_s`` since it last (re)started
  before it can be preempted (a resumed job makes progress first);
* **once per job**: a job that was stopped before (preempted, requeued by the
  closed loop, or in a cluster moved by eviction: it has service from an earlier
  run) is not preempted again; a reconfiguration in place does not count.  A victim
  waits behind the whole queue it made room for; a second preemption is what made
  the tail (a 48-hour job stopped three times in 90 minutes on Philly 6c71a0, p99
  JCT 48 -> 58 h); with the cap p99 stays within 4 h of no preemption on every
  Philly row (5.3 h on one);
* **only jobs the driver can stop** (``Job.preemptible``): a victim that would not
  leave frees no device, and the queued job would wait for GPUs promised to it in
  vain, where another victim, or none, was the right choice;
* **last resort**: only for a job that fits nowhere now, sharing included, and
  only where idle devices plus devices held by eligible victims alone could hold
  its gang; if releasing victims still does not place it, they all stay;
* **bounded**: at most ``PREEMPTIONS_PER_EPOCH`` victims and
  ``CANDIDATES_PER_EPOCH`` queued jobs tried per packing pass.

Why attained service and not the queue's band alone: preempting on the queue's
bands was measured first and left 11cb48 at 96 GPUs where it was (0.941 ->
0.944 of FIFO's average JCT): the bursts of 4-GPU jobs that wait there are
expected to need 16 GPU-hours or more, the last band, where the long runners
are too, so none of them could preempt; Tiresias serves every newcomer's first
GPU-hours at once.  Why the ratio veto and not a band veto (session 25's rule):
bands let a 48-hour job that had run for days be stopped for a newcomer of the
same band; it then waited out the whole burst, and p99 JCT rose 8-10 h on Philly
rows with no gain in the average (0e4a51 at 256 GPUs); with a ratio of 4 such
preemptions stop (p99 back to 48.4 h there) and the rows where preemption pays keep
most of their gain (``benchmarks/results/issue14/band_preemption.md``).

Victims go worst band first, then fewest GPUs (a one-GPU job does not stop a
gang where a one-GPU victim will do), then the largest service key.  A gang is
released whole; its GPUs the queued job leaves idle go to the next candidates.

In the extender a preempted job is a pod to evict, the path protect's requeues
already take (``service.actuator``: Eviction API, at most
``max_migrations_per_epoch``; the replacement keeps the job's arrival and attained
service, ``service.succession``).  Only pods that allow migration and have a
controller can be evicted; the snapshot marks every other pod not preemptible
(``service.pods.unmovable``), so it is never a victim.  The queued job then binds
once the evicted pod has left its GPUs.  In the simulator every job is preemptible.
"""

from __future__ import annotations

from itertools import chain

import numpy as np

from elastico_extender.core.planner.context import EpochRows
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.pricing.queueing import attained_service, bands
from elastico_extender.core.settings import PlannerSettings

__all__ = ["preempt_for_queue"]

PREEMPTIONS_PER_EPOCH = 8
"""Running jobs band preemption may stop per packing pass (bounds churn after a burst)."""
CANDIDATES_PER_EPOCH = 16
"""Queued jobs, in queue order, that may preempt per packing pass (bounds epoch cost)."""


def preempt_for_queue(
    epoch: EpochRows, placer: Placer, queued: list[int], settings: PlannerSettings
) -> tuple[list[int], list[int]]:
    """(rows still queued, running rows preempted for them); module docstring."""
    t, snapshot = epoch.t, epoch.snapshot
    if not queued or t.service_key is None:
        return queued, []
    las = bands(attained_service(snapshot), settings)  # who preempts whom
    key = t.service_key  # expected remaining GPU-time (else attained): the veto
    ran = snapshot.now - snapshot.columns.started  # NaN for jobs not running
    placed = np.zeros(len(t.jobs), dtype=bool)
    placed[list(placer.devices_of)] = True  # protect's requeues are no longer placed
    never_stopped = snapshot.columns.attained <= 0  # no service from an earlier run
    stoppable = snapshot.columns.preemptible  # the driver can stop it (Job.preemptible)
    with np.errstate(invalid="ignore"):
        movable = t.running & placed & stoppable & never_stopped
        movable &= ran >= settings.preemption_min_run_s
    if not movable.any():
        return queued, []
    worst = int(las[movable].max())
    candidates = [r for r in t.in_queue_order(queued) if r not in t.reasons and las[r] < worst]
    still = set(queued)
    preempted: list[int] = []
    for row in candidates[:CANDIDATES_PER_EPOCH]:
        if len(preempted) >= PREEMPTIONS_PER_EPOCH:
            break
        options = _fastest_first(epoch, row)
        if epoch.try_row(placer, row, options):  # room an earlier preemption left idle
            still.discard(row)
            continue
        longer = key > settings.preemption_remaining_ratio * key[row]
        victims = movable & (las > las[row]) & longer & (t.weight <= t.weight[row])
        if not _could_hold(placer, victims, int(t.gpus[row])):
            continue
        # Worst band first, then fewest GPUs, then the largest service key.
        rows = np.flatnonzero(victims)
        rows = rows[np.lexsort((-key[rows], t.gpus[rows], -las[rows]))]
        budget = PREEMPTIONS_PER_EPOCH - len(preempted)
        freed = _release_until_placed(epoch, placer, row, options, rows[:budget].tolist())
        if freed:
            preempted += freed
            movable[freed] = False
            still.discard(row)
    return sorted(still), preempted


def _fastest_first(epoch: EpochRows, row: int) -> list[int]:
    """The row's valid configurations, fastest first (it is given devices of its own)."""
    t = epoch.t
    valid = np.flatnonzero(t.valid[row])
    return valid[np.argsort(-t.throughput[row, valid], kind="stable")].tolist()


def _could_hold(placer: Placer, victims: np.ndarray, gpus: int) -> bool:
    """Whether idle devices and devices whose every occupant is a victim number ``gpus``."""
    held = placer.devices_of
    rows = np.fromiter(held, dtype=np.intp, count=len(held))
    width = np.fromiter(map(len, held.values()), dtype=np.intp, count=rows.size)
    devices = np.fromiter(chain.from_iterable(held.values()), np.intp, int(width.sum()))
    keeps = ~victims[np.repeat(rows, width)]
    blocked = np.bincount(devices, keeps, placer.table.size) > 0
    return int(np.count_nonzero(~blocked)) >= gpus


def _release_until_placed(
    epoch: EpochRows,
    placer: Placer,
    row: int,
    options: list[int],
    victims: list[int],
) -> list[int]:
    """Release ``victims`` in order until ``row`` is placed; the victims released, or
    none (every victim back where it was) if all of them did not make room."""
    t = epoch.t
    released: list[tuple[int, int, tuple[int, ...], bool]] = []
    for victim in victims:
        config = int(placer.config[victim])
        released.append((victim, config, placer.devices_of[victim], victim in placer.kept_in_place))
        placer.release(victim, t.per_gpu[victim, config])
        if epoch.try_row(placer, row, options):
            return [v for v, *_ in released]
    for victim, config, devices, kept in reversed(released):
        epoch.commit_row(placer, victim, config, devices)
        if kept:
            placer.kept_in_place.add(victim)
    return []
