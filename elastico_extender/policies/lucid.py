"""Lucid-like baseline, following Lucid's published policy (Hu et al., ASPLOS'23).

Written from the paper and the behaviour of its public simulator
(S-Lab-System-Group/Lucid, ``simulation/policy/lucid.py``); no code reused.

* **Priority from an estimated duration** (Lucid's Workload Estimate Model):
  priority = estimated duration x GPUs, smallest first.  The estimate comes
  from :class:`~elastico_extender.core.duration.DurationEstimator` (family,
  user, GPU count), fitted on the jobs the policy has seen complete
  (:class:`.ledger.ServiceLedger`) plus any ``history`` the driver gives; never
  on true durations.
* **Workload-aware affinity classes** (Lucid's Packing Analyze Model): a job's
  *sharing score* is 0 (tiny), 1 (medium) or 2 (jumbo) from its average speed
  when co-located with the profiled benchmark jobs: >= 0.95, >= 0.85, below.
  Lucid measures those speeds on a profiling cluster and a decision tree maps
  solo metrics to the class; here the average runs over the catalog's default
  configurations that fit in memory beside the job, and the speed comes from
  the ``predictor`` the driver gives (the simulator gives the one learned from
  a sampled 25% of measured pairs, the same profiling budget ElastiCo+learned
  gets; the core's contention heuristic otherwise).  Where the driver can
  measure each job's own solo activity (``profiled``: job id -> (SM activity,
  DRAM activity), Lucid's lightweight profiler; the simulator gives it in the
  production world), the job's features carry those measurements instead of the
  catalog profile, so a mostly idle job is classed as the tiny job it is.  Two
  jobs may share only if their scores sum to <= 2.
* **Time-aware pairing**: a waiting job of at most 8 GPUs may join a running
  job that runs alone (two jobs per GPU at most), asks for the same number of
  GPUs, fits beside it in memory (and SM share, the simulator's MPS limit),
  passes the class rule, and whose priority is at least half the newcomer's
  (``priority_ratio``: a long job is not stacked onto a short one).  The first
  such partner in snapshot (arrival) order is taken; Lucid takes its run list's first.
* **Indolent packing** (Lucid's Prescient Adaptive Sharing): packing is on only
  while the queue is long, i.e. while the pending jobs ask for more GPUs than
  are idle; Lucid forecasts this with a throughput model, the queue is what
  that model predicts.  With packing on a job tries a partner first, then idle
  GPUs; with packing off jobs take idle GPUs in priority order.  The walk
  continues past a job that cannot start (Lucid's simulator stops at it when
  packing is off, which only matters for its consolidation-only placer; gangs
  here may span nodes, so with packing off every waiting job fits anyway).
* No configuration reshaping, no preemption, no migration: each job runs its
  default (fastest) configuration where it started.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np

from elastico_extender.core.duration import CompletedJob, DurationEstimator
from elastico_extender.core.interference.features import pair_features
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.model import Job, Plan, ProfileFamily, Snapshot
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies.ledger import ServiceLedger
from elastico_extender.policies.volcano import (
    admit_in_order,
    default_config,
    demand,
    gang,
    seat_running,
)

__all__ = ["AFFINITY_SPEEDS", "LucidPolicy", "affinity_class"]

SM_ACTIVE, DRAM_ACTIVE = 0, 2
"""Columns of the solo feature block (core.interference.features) a profiler measures."""

AFFINITY_SPEEDS = (0.95, 0.85)
"""Average co-located speed at or above which a job is tiny (0), medium (1); below: jumbo (2)."""
MAX_PACK_GPUS = 8


def affinity_class(mean_speed: float) -> int:
    """Lucid's sharing score from a job's average co-located speed (module docstring)."""
    if mean_speed >= AFFINITY_SPEEDS[0]:
        return 0
    if mean_speed >= AFFINITY_SPEEDS[1]:
        return 1
    return 2


def _profiled_sm(job: Job, family: ProfileFamily, config: int) -> float:
    return float(family.resources[config, GPU_SM])


class LucidPolicy:
    """Duration-priority, affinity-class, indolent packing (module docstring)."""

    def __init__(
        self,
        predictor: SlowdownPredictor | None = None,
        estimator: DurationEstimator | None = None,
        history: Iterable[CompletedJob] = (),
        settings: PlannerSettings | None = None,
        priority_ratio: float = 2.0,
        profiled: Callable[[str], tuple[float, float] | None] | None = None,
        name: str = "lucid",
    ) -> None:
        self.name = name
        self.predictor = predictor or ContentionPredictor()
        self.estimator = estimator or DurationEstimator()
        self.ledger = ServiceLedger()
        self.ledger.seed(history)
        self.priority_ratio = priority_ratio
        self.margin = (settings or PlannerSettings()).memory_margin_mib
        self.profiled = profiled
        self._classes: dict[tuple[str, int], int] = {}
        self._job_classes: dict[str, int] = {}

    # -- the three models ---------------------------------------------------------
    def sharing_score(
        self,
        families: dict[str, ProfileFamily],
        name: str,
        config: int,
        cap: float,
        job_id: str | None = None,
    ) -> int:
        """Affinity class of ``name`` at ``config`` on devices of ``cap`` usable MiB (cached;
        per job when the job's own solo activity was measured)."""
        measured = self.profiled(job_id) if self.profiled is not None and job_id else None
        key: str | tuple[str, int] = job_id if measured is not None and job_id else (name, config)
        cached = self._job_classes.get(key) if isinstance(key, str) else self._classes.get(key)
        if cached is not None:
            return cached
        fam = families[name]
        mine = fam.features[config, :14].astype(np.float64).copy()
        if measured is not None:
            mine[SM_ACTIVE], mine[DRAM_ACTIVE] = measured
        mem = float(fam.resources[config, GPU_MEM])
        partners = [
            f.features[f.fastest_index, :14]
            for f in families.values()
            if mem + float(f.resources[f.fastest_index, GPU_MEM]) <= cap
        ]
        if not partners:
            score = 2
        else:
            rows = np.repeat(mine[None, :], len(partners), axis=0)
            slow = self.predictor.predict(pair_features(rows, np.stack(partners), cap / 1024.0))
            score = affinity_class(float(np.mean(1.0 / np.maximum(slow, 1.0))))
        if isinstance(key, str):
            self._job_classes[key] = score
        else:
            self._classes[key] = score
        return score

    def priority(self, job: Job) -> float:
        """Estimated duration x GPUs (smaller runs first)."""
        return self.estimator.predict(job) * job.gpus

    # -- one epoch ------------------------------------------------------------------
    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        if self.ledger.observe(snapshot) or self.ledger.new_completions:
            self.estimator.fit(self.ledger.completed)
            self.ledger.new_completions = 0
        families = dict(snapshot.families)
        live = {j.id for j in snapshot.jobs}
        self._job_classes = {k: v for k, v in self._job_classes.items() if k in live}
        table, assignments, pending = seat_running(snapshot, self.margin, _profiled_sm)
        cap = float(table.memory_capacity.max()) if table.size else 0.0
        prio = {job.id: self.priority(job) for _, job in pending}
        pending.sort(key=lambda p: (prio[p[1].id], p[1].arrival_time, p[1].id))
        idle = int((table.count == 0).sum())
        packing = sum(job.gpus for _, job in pending) > idle
        # Running jobs alone on their devices, in snapshot order: (devices, gpus, priority, class).
        alone: list[tuple[list[int], int, float, int]] = []
        for _row, job in enumerate(snapshot.jobs):
            if not job.running:
                continue
            devs = [table.index[r] for r in job.devices]
            if all(table.count[d] == 1 for d in devs):
                fam = snapshot.families[job.family]
                config = default_config(job, fam)
                score = self.sharing_score(families, job.family, config, cap, job.id)
                alone.append((devs, job.gpus, self.priority(job), score))

        def seat(row: int, job: Job, fam: ProfileFamily, config: int) -> list[int] | None:
            per_gpu = demand(fam.resources[config, GPU_MEM], fam.resources[config, GPU_SM])
            mine = self.sharing_score(families, job.family, config, cap, job.id)
            if packing and job.gpus <= MAX_PACK_GPUS:
                for k, (devs, gpus, their_prio, score) in enumerate(alone):
                    if (
                        gpus == job.gpus
                        and mine + score <= 2
                        and prio[job.id] <= self.priority_ratio * their_prio
                        and table.fits_on(devs, per_gpu)
                    ):
                        table.place(row, devs, per_gpu)
                        del alone[k]
                        return devs
            devs_idle = gang(table, (table.count == 0) & table.fits(per_gpu), job.gpus)
            if devs_idle is None:
                return None
            table.place(row, devs_idle, per_gpu)
            alone.append((devs_idle, job.gpus, prio[job.id], mine))
            return devs_idle

        result = admit_in_order(snapshot, table, pending, assignments, seat)
        self.ledger.ran(result)
        return result
