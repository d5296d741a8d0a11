"""Turn a :class:`RunResult` into the numbers of the spec's tables.

Definitions (all from the simulated ground truth, never from the planner's view):

* **JCT**: finish - arrival; **queueing delay**: first start - arrival.  Beside
  the averages, ``p99_jct_s`` and ``max_queue_s`` (the worst queueing delay)
  show whether length-aware ordering starves anyone.
* **Stretch**: JCT / solo duration (the trace's duration at the default
  configuration alone), per finished job: 1.0 means neither queueing nor
  sharing nor a leaner configuration cost the job anything.
* **Throughput** (``throughput``): useful work per second over the trace's
  arrival window [t0, t0 + W] (first to last arrival; the spec's "24-hour
  replay"; where the trace's clock starts changes nothing; when every job arrives at
  once, first arrival to last completion), in GPU-equivalents:
  a job at its default configuration alone on g GPUs contributes g; slower
  configurations and co-location slowdowns contribute proportionally less.
  ``throughput_makespan`` is the finished jobs' work / (last finish - first arrival).
* **SM utilisation**: profile SM activity of the running jobs' configurations
  summed over devices, as a share of the cluster, time-averaged over [0, W]
  (a paused job counts 0).  **Memory utilisation**: device memory held,
  likewise.
* **Attainment**: share of finished jobs whose time-averaged true throughput
  while holding GPUs (reconfiguration pauses included) reached their floor L_j.
* **Where throughput goes** (to explain results): ``config_efficiency`` is the
  GPU-time-weighted mean of T_true(c)/T_true(default) over running jobs (1.0 when
  every job runs its default configuration; < 1 when RST picked slower, smaller
  configurations); ``interference_efficiency`` is useful work / work at those
  configurations without slowdown (1.0 without co-location);
  ``pause_gpu_share`` is the share of held GPU-time spent in reconfiguration (or
  resuming after a preemption or migration), and ``pause_share`` the same GPU-time as a
  percentage of the cluster's over the makespan (a gang's pause counts on each of its GPUs).
* **Where each job's time goes**, averaged over finished jobs so that
  avg JCT = mean solo run (``work``) + ``avg_queue_s`` (before its first start)
  + ``avg_waiting_after_start_s`` (queued again after a preemption or requeue)
  + ``avg_paused_s`` (holding GPUs while reconfiguring) + ``avg_config_loss_s``
  (running a slower configuration than its default; negative where a faster one)
  + ``avg_interference_loss_s`` (slowed by its co-tenants).
* **Accounting** (``work_error``, ``gpu_seconds_error``): work done integrated
  over time vs. the trace's work, and tenant-device-seconds vs. the jobs' held
  GPU-seconds; both relative errors should be ~0.
"""

from __future__ import annotations

import numpy as np

from elastico_extender.sim.engine import DONE, RunResult

__all__ = ["summarise", "window_average"]


def window_average(result: RunResult, values: np.ndarray, end: float | None = None) -> float:
    """Time average of a piecewise-constant timeline over [t0, t0 + end] (default: the window;
    t0 = first arrival; a one-instant window falls back to the run, up to its last completion:
    the timeline goes on to the next epoch boundary, and past it while a stuck job is retried)."""
    end = result.window_s if end is None else end
    if values.size == 0:
        return 0.0
    start = result.window_t0
    if end <= 0:
        done = result.status == DONE
        end = float(result.finish[done].max()) - start if done.any() else 0.0
        if end <= 0:
            return 0.0
    t0 = np.clip(result.seg_t0, start, start + end)
    t1 = np.clip(result.seg_t1, start, start + end)
    return float((values * (t1 - t0)).sum() / end)


TIME_PARTS = ("waiting_after_start_s", "paused_s", "config_loss_s", "interference_loss_s")
"""Per-job parts of the time after a job's first start beyond its solo run (module doc)."""


def job_time_parts(r: RunResult) -> dict[str, np.ndarray]:
    """Per job (NaN until it finishes), seconds by cause after its first start: JCT =
    work + queue + the sum of these.  Empty for a result without per-job records."""
    if r.active_s.size != r.work.size:
        return {}
    held = r.held_gpu_s / np.maximum(r.gpus_of, 1)
    parts = (
        (r.finish - r.first_start) - held,
        held - r.active_s,
        r.active_s - r.config_work_s,
        r.config_work_s - r.work,
    )
    done = r.status == DONE
    return {k: np.where(done, v, np.nan) for k, v in zip(TIME_PARTS, parts, strict=True)}


def _time_parts(r: RunResult, done: np.ndarray) -> dict[str, float]:
    """Finished jobs' mean seconds beyond their solo run, by cause (module docstring)."""
    parts = job_time_parts(r)
    if not done.any() or not parts:
        return {}
    return {f"avg_{k}": float(v[done].mean()) for k, v in parts.items()}


def summarise(result: RunResult) -> dict[str, float]:
    r = result
    done = r.status == DONE
    jct = (r.finish - r.arrival)[done]
    queue = (r.first_start - r.arrival)[done]
    stretch = jct / np.maximum(r.work[done], 1e-9)
    dt = r.seg_t1 - r.seg_t0
    total_work = float((r.work * r.gpus_of).sum())
    done_work = float((r.seg_useful * dt).sum())
    makespan = float(np.nanmax(r.finish) - r.arrival.min()) if done.any() else float("nan")
    met = (r.achieved >= r.floor * (1 - 1e-9))[done]
    inf = r.is_inference[done]
    tenant_s = float((r.seg_tenants * dt).sum())
    held = float(r.held_gpu_s.sum())
    plan_ms = np.array(r.plan_ms) if r.plan_ms else np.zeros(1)
    gpu_hours = r.gpus * max(makespan, 1.0) / 3600.0
    active = float((r.seg_active * dt).sum())
    cfg = float((r.seg_cfg * dt).sum())
    return {
        **_time_parts(r, done),
        "config_efficiency": cfg / active if active > 0 else float("nan"),
        "interference_efficiency": done_work / cfg if cfg > 0 else float("nan"),
        "pause_gpu_share": 1.0 - active / tenant_s if tenant_s > 0 else 0.0,
        "jobs": float(r.status.size),
        "finished": float(done.sum()),
        "rejected": float((r.status == 4).sum()),
        "avg_jct_s": float(jct.mean()) if jct.size else float("nan"),
        "median_jct_s": float(np.median(jct)) if jct.size else float("nan"),
        "p95_jct_s": float(np.percentile(jct, 95)) if jct.size else float("nan"),
        "p99_jct_s": float(np.percentile(jct, 99)) if jct.size else float("nan"),
        "max_queue_s": float(queue.max()) if queue.size else float("nan"),
        "avg_stretch": float(stretch.mean()) if stretch.size else float("nan"),
        "max_stretch": float(stretch.max()) if stretch.size else float("nan"),
        "avg_queue_s": float(queue.mean()) if queue.size else float("nan"),
        "median_queue_s": float(np.median(queue)) if queue.size else float("nan"),
        "throughput": window_average(r, r.seg_useful),
        "throughput_makespan": float((r.work * r.gpus_of)[done].sum()) / makespan
        if makespan > 0
        else float("nan"),
        "makespan_s": makespan,
        "sm_util": 100.0 * window_average(r, r.seg_sm),
        "mem_util": 100.0 * window_average(r, r.seg_mem),
        "busy_gpus": 100.0 * window_average(r, r.seg_busy),
        "attainment": 100.0 * float(met.mean()) if met.size else float("nan"),
        "attainment_training": 100.0 * float(met[~inf].mean()) if (~inf).any() else float("nan"),
        "attainment_inference": 100.0 * float(met[inf].mean()) if inf.any() else float("nan"),
        "plan_ms_mean": float(plan_ms.mean()),
        "plan_ms_p95": float(np.percentile(plan_ms, 95)),
        "plans": float(r.counters.get("plans", 0)),
        "reconfigurations": float(r.counters.get("reconfigurations", 0)),
        "migrations": float(r.counters.get("migrations", 0)),
        "preemptions": float(r.counters.get("preemptions", 0)),
        "residual_admissions": float(r.counters.get("residual_admissions", 0)),
        "pause_share": 100.0 * (tenant_s - active) / max(gpu_hours * 3600, 1),
        "reconfig_per_gpu_hour": float(r.counters.get("reconfigurations", 0))
        / max(gpu_hours, 1e-9),
        "work_error": abs(done_work - total_work) / max(total_work, 1e-9)
        if done.all()
        else float("nan"),
        "gpu_seconds_error": abs(tenant_s - held) / max(held, 1e-9),
        "capacity_violations": float(len(r.capacity_violations)),
        "anomalies": float(len(r.anomalies)),
        "wall_s": r.wall_s,
    }
