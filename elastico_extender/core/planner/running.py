"""PDS, first packing step: running jobs go back where they run.

Most running jobs keep their devices and their configuration or move to one
the prices chose; they are committed in bulk wherever no device or node would
overflow.  The rest (their devices would overflow, or they sit next to a
partner the interference check forbade this epoch) are placed one by one so
that no job is ever preempted for a neighbour's growth.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.planner.context import EpochRows
from elastico_extender.core.planner.devices import device_tuples
from elastico_extender.core.planner.placement import Placer
from elastico_extender.core.resources import CPU, GPU_MEM, GPU_SM, HOST_MEM

__all__ = ["place_running"]


def place_running(
    epoch: EpochRows, placer: Placer, rows: np.ndarray, choice: np.ndarray
) -> list[int]:
    """Place running jobs: in place in bulk where nothing overflows, one by one otherwise.

    ``rows`` are every running job, ``choice`` the configuration ESP chose per row.
    Returns the rows that fit nowhere (preempted, the documented last resort).
    """
    t, table = epoch.t, placer.table
    # ``rows`` are all running jobs in row order, as the snapshot lists their workers.
    held = epoch.snapshot.columns.held[rows]
    worker_rows = np.repeat(rows, held)
    worker_devs = epoch.snapshot.workers
    cur_devs = device_tuples(worker_devs, held)
    cfg = choice.copy()
    cfg[rows] = np.where(t.valid[rows, choice[rows]], choice[rows], t.current[rows])
    demand = t.per_gpu[worker_rows, cfg[worker_rows]]
    mem = np.bincount(worker_devs, demand[:, GPU_MEM], table.size)
    sm = np.bincount(worker_devs, demand[:, GPU_SM], table.size)
    node_n = len(table.cpu_free)
    nodes = table.node_of[worker_devs]
    cpu = np.bincount(nodes, demand[:, CPU], node_n)
    ram = np.bincount(nodes, demand[:, HOST_MEM], node_n)
    over_node = (cpu > table.cpu_free + 1e-9) | (ram > table.ram_free + 1e-9)
    over = (mem > table.mem_free + 1e-9) | (sm > table.sm_free + 1e-9) | over_node[table.node_of]
    conflicted = set(worker_rows[over[worker_devs]].tolist())
    if placer.forbidden:
        conflicted |= _forbidden_running(epoch, placer, rows, cfg, cur_devs)
    ok = np.ones(rows.size, dtype=bool)
    if conflicted:
        ok = ~np.isin(rows, np.fromiter(conflicted, dtype=np.intp))
    keep_rows = rows[ok]
    keep_workers = ~np.isin(worker_rows, rows[~ok]) if conflicted else slice(None)
    placer.commit_many(
        keep_rows,
        cfg[keep_rows],
        [d for d, keep in zip(cur_devs, ok.tolist(), strict=True) if keep],
        worker_rows[keep_workers],
        worker_devs[keep_workers],
        demand[keep_workers],
        t.features(keep_rows, cfg[keep_rows]),
        epoch.tolerance(keep_rows, cfg[keep_rows]),
    )
    if not conflicted:
        return []
    by_row = {int(rows[k]): cur_devs[k] for k in np.flatnonzero(~ok).tolist()}
    return _place_conflicted(epoch, placer, sorted(conflicted), cfg, by_row)


def _place_conflicted(
    epoch: EpochRows,
    placer: Placer,
    rows: list[int],
    cfg: np.ndarray,
    devices_of: dict[int, tuple[int, ...]],
) -> list[int]:
    """Running jobs whose devices would overflow, or that sit next to a forbidden partner.

    1. Every one goes back in place, at its chosen configuration if that needs no
       more of any resource than the current one, else at the current one: they
       all fit before, so this always fits and nobody is dropped for another's
       growth.  SM is not checked here: an observed SM share may have risen since
       (``planner.observed_sm``); tenants already together stay together unless
       their observed slowdown says otherwise (protect).
    2. Jobs next to a forbidden partner try to migrate (chosen, then current); of a
       forbidden pair the one flagged is one the driver can move (``Job.preemptible``)
       where there is one, and a job it cannot move stays put (violation reported).
    3. Jobs that wanted to grow try their chosen configuration in place.
    Only a job that fits nowhere, not even where it ran, is preempted.
    """
    t = epoch.t
    stoppable = epoch.snapshot.columns.preemptible  # only these can migrate (Job.preemptible)
    preempted: list[int] = []
    lower: dict[int, int] = {}
    epoch.tolerance_rows(np.array(rows, dtype=np.intp))  # every row's tau in one pass
    for row in rows:
        chosen, current = int(cfg[row]), int(t.current[row])
        # The chosen configuration only if it needs no more of anything than the current.
        shrinks = bool(np.all(t.per_gpu[row, chosen] <= t.per_gpu[row, current] + 1e-9))
        small = chosen if shrinks else current
        devs = list(devices_of[row])
        if placer.table.fits_on(devs, t.per_gpu[row, small], check_sm=False):
            epoch.commit_row(placer, row, small, devs)
            lower[row] = small
        else:
            preempted.append(row)
    for row in rows:
        if row not in lower:
            continue
        chosen, current = int(cfg[row]), int(t.current[row])
        devs = list(devices_of[row])
        if placer.is_forbidden(row, lower[row], devs) and stoppable[row]:
            placer.release(row, t.per_gpu[row, lower[row]])
            configs = [chosen] if chosen == current else [chosen, current]
            if not epoch.try_row(placer, row, configs):  # stay put; violation reported
                epoch.commit_row(placer, row, lower[row], devs)
            continue
        if chosen != lower[row]:
            placer.release(row, t.per_gpu[row, lower[row]])
            if placer.table.fits_on(devs, t.per_gpu[row, chosen]) and not (
                placer.is_forbidden(row, chosen, devs)
            ):
                epoch.commit_row(placer, row, chosen, devs)
            else:
                epoch.commit_row(placer, row, lower[row], devs)
    still = []
    for row in preempted:  # could not even go back where it ran: try anywhere
        chosen, current = int(cfg[row]), int(t.current[row])
        configs = [chosen] if chosen == current else [chosen, current]
        if not epoch.try_row(placer, row, configs):
            still.append(row)
    return still


def _forbidden_running(
    epoch: EpochRows,
    placer: Placer,
    rows: np.ndarray,
    cfg: np.ndarray,
    cur_devs: list[tuple[int, ...]],
) -> set[int]:
    """Running jobs that share a device with a partner forbidden this epoch."""
    where: dict[int, list[int]] = {}
    for row, devs in zip(rows.tolist(), cur_devs, strict=True):
        for d in devs:
            where.setdefault(d, []).append(row)
    hit: set[int] = set()
    stoppable = epoch.snapshot.columns.preemptible
    for members in where.values():
        for a in members:
            for b in members:
                if a != b and (a, int(cfg[a]), b, int(cfg[b])) in placer.forbidden:
                    # The one that can migrate, then the lighter, then the later row.
                    hit.add(max(a, b, key=lambda r: (stoppable[r], -epoch.t.weight[r], r)))
    return hit
