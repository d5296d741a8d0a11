"""Lucid-like baseline (after Hu et al., ASPLOS'23): non-intrusive packing of training jobs.

The parts of Lucid that matter for a sharing comparison, written from the
paper's description (no code reused):

* **Sharing classes.**  Each job is put into a coarse class from its solo
  profile (the default configuration's SM activity, what Lucid's lightweight
  profiler measures): class 0 (light, SM <= 0.30), 1 (medium, <= 0.45), 2
  (heavy).  Two jobs may share a GPU only if their memory fits the device
  together and their class sum is <= 2 (0+0, 0+1, 0+2, 1+1); at most two jobs
  per GPU.  Jobs of any kind are classified the same way: Lucid has no notion
  of offline inference, so an LLM engine is just another (usually memory-heavy)
  job.
* **Indolent packing.**  A job runs alone on idle GPUs when enough are free;
  it is packed next to a compatible tenant only when it would otherwise wait.
  Among compatible tenants the lightest partner (lowest class) is preferred.
* **Priority from estimated duration.**  The queue is ordered by an estimate
  of each job's run time, shortest first (Lucid's throughput/duration
  estimator).  The estimate comes from the ``duration_estimate`` callable the
  driver passes (the simulator gives the trace duration with log-normal error);
  without one the order is FIFO.
* **No configuration reshaping, no preemption, no migration**: every job
  runs its default (fastest) configuration where it started.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from elastico_extender.core.model import Job, Plan, ProfileFamily, Snapshot
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies.volcano import (
    admit_in_order,
    default_config,
    demand,
    gang,
    seat_running,
)

__all__ = ["LucidPolicy", "sharing_class"]

CLASS_LIMITS = (0.30, 0.45)
"""SM activity at or below which a job is class 0, class 1; above: class 2."""


def sharing_class(family: ProfileFamily, config: int) -> int:
    sm = float(family.resources[config, GPU_SM])
    if sm <= CLASS_LIMITS[0] + 1e-9:
        return 0
    if sm <= CLASS_LIMITS[1] + 1e-9:
        return 1
    return 2


def _profiled_sm(family: ProfileFamily, config: int) -> float:
    return float(family.resources[config, GPU_SM])


class LucidPolicy:
    """Class-based indolent packing with duration-estimate priority (module docstring)."""

    def __init__(
        self,
        duration_estimate: Callable[[Job], float] | None = None,
        settings: PlannerSettings | None = None,
        name: str = "lucid",
    ) -> None:
        self.name = name
        self.duration_estimate = duration_estimate
        self.margin = (settings or PlannerSettings()).memory_margin_mib

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        table, assignments, pending = seat_running(snapshot, self.margin, _profiled_sm)
        n_dev = table.size
        cls_of = np.full(n_dev, -1)  # class of a device's single tenant (-1 idle, 9 full)
        for d, rows in table.occupants.items():
            if len(rows) == 1:
                job = snapshot.jobs[rows[0]]
                fam = snapshot.families[job.family]
                cls_of[d] = sharing_class(fam, default_config(job, fam))
            elif rows:
                cls_of[d] = 9
        estimate = self.duration_estimate
        if estimate is not None:
            pending.sort(key=lambda p: (estimate(p[1]), p[1].arrival_time, p[1].id))
        else:
            pending.sort(key=lambda p: (p[1].arrival_time, p[1].id))

        def seat(row: int, job: Job, fam: ProfileFamily, config: int) -> list[int] | None:
            per_gpu = demand(fam.resources[config, GPU_MEM], fam.resources[config, GPU_SM])
            mine = sharing_class(fam, config)
            fits = table.fits(per_gpu)  # memory and SM left on each device
            devs = gang(table, (table.count == 0) & fits, job.gpus)
            if devs is None:
                # Indolent packing: share only because the job would otherwise wait.
                ok = (cls_of >= 0) & (cls_of + mine <= 2) & fits
                if ok.sum() >= job.gpus:
                    # Lightest partners first.
                    order = np.flatnonzero(ok)[np.argsort(cls_of[ok], kind="stable")]
                    if job.gpus == 1:
                        devs = [int(order[0])]
                    else:
                        mask = np.zeros(n_dev, dtype=bool)
                        mask[order] = True
                        devs = gang(table, mask, job.gpus)
            if devs is not None:
                table.place(row, devs, per_gpu)
                for d in devs:
                    cls_of[d] = mine if table.count[d] == 1 else 9
            return devs

        return admit_in_order(snapshot, table, pending, assignments, seat)
