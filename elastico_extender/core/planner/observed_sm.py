"""Observed SM demand: charge a running job the SM share it was seen to use, not its catalog's.

Why
---
A configuration's catalog SM share (the GPU_SM column of its resource
vector) is what the profiler measured on a job that keeps the GPU busy.
Production jobs rarely do (Alibaba PAI: training 14.3% and inference 6.4%
mean SM activity, spec section 2), so charging catalog shares lets two to
four jobs share a GPU that they leave idle most of the time.  The node agent
already reports each job's SM activity per window (``Observation.sm_activity``);
"observed beats predicted", so once a running job has been observed long
enough the planner charges it

    share(c) = catalog(c) * min(1, max(ratio, SM_FLOOR / catalog(c)))
    ratio    = SM_MARGIN * peak / catalog(c_obs)

at every configuration c, where ``peak`` is the job's bucketed peak activity
over the last hour at the configuration it was observed at, ``c_obs``
(:class:`~elastico_extender.core.observations.ObservationBook`): a peak, not
a mean, so bursty inference keeps room for its bursts.  The ratio carries
"how much of its catalog share the job really uses" to the other
configurations ESP may choose (a larger batch keeps the GPU busier in the same
proportion, the conservative reading).

* ``SM_MARGIN`` (1.25): headroom over the peak for what one hour of windows
  may not have shown (a burst a little above the last hour's, the noise of an
  activity counter over a window: a few percent).
* ``SM_FLOOR`` (0.05 of a GPU): a job observed idle still gets a share, so
  at most 20 observed jobs share one device by SM (memory usually binds first).
* Never above the catalog share: observation only ever frees SM.
* Only with evidence: at least ``SM_MIN_SECONDS`` (10 min) of observed windows
  at the current configuration, the newest at most ``protect.STALE_S`` old;
  otherwise (never observed, agent silent, configuration just switched) the
  catalog share.  Without observations (no closed loop) nothing changes.

Memory is always charged in full (a device's memory cannot be overcommitted);
SM shares are time-shared, and what the extra tenants cost is slowdown, which
the IAC screen (with the closed loop's online correction) still has to accept
pair by pair, and the protect step undoes when observed above tolerance.
Because observed shares change between epochs, a job already on a device
keeps its place when its share rises (``running.place_running``): SM
oversubscription by tenants already together is the observed slowdown's call,
not a reason to preempt; nobody new joins such a device.

How: each observed running job gets its own row in the per-GPU demand table
(a copy of its family's with the SM column rescaled), so every packing pass
and ESP's prices see the charged share through the same ``per_gpu`` lookup,
in one vectorised pass per epoch.  The extender's between-epoch placement view
(``planner.admission``) charges the plan's jobs the same way, from the same
snapshot, so the service and the planner agree about what fits.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.model import Snapshot
from elastico_extender.core.planner.protect import STALE_S
from elastico_extender.core.planner.tables import JobTables, PerJob
from elastico_extender.core.resources import GPU_SM

__all__ = [
    "SM_FLOOR",
    "SM_MARGIN",
    "SM_MIN_SECONDS",
    "charge_observed_sm",
    "charged_sm",
    "observed_ratios",
]

SM_MARGIN = 1.25
"""Headroom over the observed peak SM activity (module doc)."""
SM_FLOOR = 0.05
"""Smallest SM share charged to an observed job (share of one GPU)."""
SM_MIN_SECONDS = 600.0
"""Observed seconds at the current configuration before the observed share is trusted."""


def observed_ratios(snapshot: Snapshot) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``snapshot.jobs`` charged by observation, and their ratio (< 1) of the
    catalog share.

    A row qualifies when its job runs, was observed at its current configuration for
    at least ``SM_MIN_SECONDS``, not stale, and the margin-raised peak is below its
    catalog share there.
    """
    observed = snapshot.observed
    if not observed:
        return np.zeros(0, dtype=np.intp), np.zeros(0)
    rows: list[int] = []
    ratios: list[float] = []
    families = snapshot.families
    for row, job in enumerate(snapshot.jobs):
        seen = observed.get(job.id)
        if (
            seen is None
            or not job.devices
            or not seen.sm_buckets
            or seen.sm_config != job.current_config
            or seen.sm_seconds < SM_MIN_SECONDS
            or seen.age(snapshot.now) > STALE_S
        ):
            continue
        family = families.get(job.family)
        if family is None or not 0 <= seen.sm_config < family.size:
            continue
        catalog = float(family.resources[seen.sm_config, GPU_SM])
        ratio = SM_MARGIN * max(p for _, p in seen.sm_buckets) / max(catalog, 1e-9)
        if ratio < 1.0:
            rows.append(row)
            ratios.append(ratio)
    return np.array(rows, dtype=np.intp), np.array(ratios)


def charged_sm(catalog: np.ndarray, ratio: np.ndarray) -> np.ndarray:
    """The SM share charged: catalog x ratio, at least ``SM_FLOOR`` (or the catalog share
    where that is smaller).  ``ratio`` broadcasts against ``catalog``."""
    return np.maximum(catalog * ratio, np.minimum(SM_FLOOR, catalog))


def charge_observed_sm(t: JobTables, snapshot: Snapshot) -> int:
    """Give every observed running job of ``t`` its own SM demand row (module doc).

    Rewrites ``t.per_gpu`` and ``t.demand_table`` (extended by one family row per
    such job) and ``t.demand_family``; returns how many jobs were recharged.
    """
    rows, ratio = observed_ratios(snapshot)
    if rows.size == 0:
        return 0
    table = t.per_gpu.table
    own = table[t.family_index[rows]].copy()  # (M, K, R)
    own[:, :, GPU_SM] = charged_sm(own[:, :, GPU_SM], ratio[:, None])
    extended = np.concatenate([table, own])
    family = t.demand_family.copy()
    family[rows] = len(table) + np.arange(rows.size)
    t.per_gpu = PerJob(extended, family)
    t.demand_family = family
    t.demand_table = np.ascontiguousarray(np.transpose(extended, (2, 0, 1)))
    return int(rows.size)
