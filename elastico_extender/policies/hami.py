"""HAMi-like baseline: each job's declared share of a GPU, packed as HAMi places it.

HAMi (Project-HAMi, a CNCF sandbox project) lets a pod ask for part of a GPU
(``nvidia.com/gpucores``, ``nvidia.com/gpumem``), enforces it in the container
(HAMi-core) and places pods with its own scheduler extender.  What that placement
does, as its chart configures it by default, is what this policy does:

* **The declared share decides.**  A GPU takes pods while their declared core shares
  sum to at most 100%, their memory fits, and it holds fewer than
  ``deviceSplitCount`` (10) of them.  Nothing predicts or observes interference: the
  co-located jobs slow each other as the simulated world says.  A job that declares
  no share asks for whole GPUs (HAMi's default ``gpumem`` is all of the memory), so
  on a trace without declarations this policy places exactly as ``volcano`` does.
  The share comes from the trace (``TraceJob.gpu_share``: Alibaba's ``gpu_milli``).
* **Node binpack, GPU spread** (``nodeSchedulerPolicy: binpack``,
  ``gpuSchedulerPolicy: spread``): a shared job goes to the node with the most of
  its GPU shares taken that still fits it, and there to the GPU with the least.
* **Arrival order**, as kube-scheduler's queue: a job that does not fit waits and
  the next is tried.  No reconfiguration, preemption or migration; each job runs
  its default configuration.  Compute limits are not modelled (HAMi-core's
  ``gpuCorePolicy: disable``): a job runs as fast as its partners let it, the
  kinder reading for the baseline.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from elastico_extender.core.model import Job, Plan, ProfileFamily, Snapshot
from elastico_extender.core.planner.devices import DeviceTable
from elastico_extender.core.resources import GPU_MEM
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies.volcano import admit_in_order, demand, seat_running, seat_whole

__all__ = ["DEVICE_SPLIT_COUNT", "HamiPolicy"]

DEVICE_SPLIT_COUNT = 10
"""HAMi's default ``deviceSplitCount``: at most this many pods on one GPU."""


class HamiPolicy:
    """Declared-share packing, node binpack and GPU spread (the module docstring)."""

    def __init__(
        self,
        settings: PlannerSettings | None = None,
        shares: Mapping[str, float] | None = None,
        name: str = "hami",
    ) -> None:
        self.name = name
        self.margin = (settings or PlannerSettings()).memory_margin_mib
        self.shares = dict(shares or {})

    def share(self, job: Job) -> float:
        """The part of one GPU ``job`` declared (1.0: whole GPUs, and for a gang)."""
        declared = self.shares.get(job.id, 1.0)
        return declared if job.gpus == 1 and 0.0 <= declared < 1.0 else 1.0

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        table, assignments, pending = seat_running(
            snapshot, self.margin, lambda job, fam, config: self.share(job)
        )
        pending.sort(key=lambda p: (p[1].arrival_time, p[1].id))

        def seat(row: int, job: Job, fam: ProfileFamily, config: int) -> list[int] | None:
            share = self.share(job)
            if share >= 1.0:
                return seat_whole(table, row, job, fam, config)
            per_gpu = demand(fam.resources[config, GPU_MEM], share)
            device = _binpack_spread(table, per_gpu)
            if device is not None:
                table.place(row, [device], per_gpu)
                return [device]
            return None

        return admit_in_order(snapshot, table, pending, assignments, seat)


def _binpack_spread(table: DeviceTable, per_gpu: np.ndarray) -> int | None:
    """The device a shared job goes to: among those it fits (share, memory, pod count),
    on the node with the most GPU share taken, the device with the least."""
    fits = table.fits(per_gpu) & (table.count < DEVICE_SPLIT_COUNT)
    candidates = np.flatnonzero(fits)
    if candidates.size == 0:
        return None
    taken = 1.0 - table.sm_free
    node_taken = np.bincount(table.node_of, weights=taken, minlength=int(table.node_of.max()) + 1)
    # lexsort: last key first; node most taken, then device least taken, then index
    order = np.lexsort((candidates, taken[candidates], -node_taken[table.node_of[candidates]]))
    return int(candidates[order[0]])
