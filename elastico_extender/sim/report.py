"""Tables in the form of the spec's section 5 and the plots, from simulation results.

Tables are Markdown (printed and written as ``.md``) plus machine-readable CSV.
Plots need matplotlib (``pip install elastico-extender[sim]``); without it the
CSV files are still written and a message says which PNGs were skipped.
"""

from __future__ import annotations

import csv
import itertools
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from elastico_extender.sim.engine import DONE, RunResult
from elastico_extender.sim.metrics import TIME_PARTS, job_time_parts, summarise

__all__ = [
    "PLOT_FILES",
    "RUN_FILES",
    "ablation_table",
    "load_table",
    "main_table",
    "plot_all",
    "scalability_table",
    "summaries",
    "time_table",
    "write_run_files",
    "writing",
]

Summary = Mapping[str, float]

RUN_FILES = ("summary.csv", "jobs.csv", "timeline.csv")
"""What :func:`write_run_files` writes into the output folder."""
PLOT_FILES = ("jct_cdf.png", "utilisation.png", "queueing.png")
"""What :func:`plot_all` writes into the output folder."""


def summaries(results: Mapping[str, RunResult]) -> dict[str, dict[str, float]]:
    return {name: summarise(r) for name, r in results.items()}


def _ratio(a: float, b: float) -> str:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return "n/a"
    return f"{a / b:.2f}x"


def _num(value: float, spec: str, unit: float = 1.0) -> str:
    """``value / unit`` formatted with ``spec``; "n/a" where no figure exists (a mean over
    no finished job, a share of no time) rather than "nan" in a table."""
    return format(value / unit, spec) if math.isfinite(value) else "n/a"


def _md(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def main_table(summ: Mapping[str, Summary], baseline: str = "volcano") -> str:
    """Spec table 'Main comparison results': JCT and throughput relative to the baseline."""
    base = summ.get(baseline)
    header = [
        "System",
        "Avg JCT",
        "Median JCT",
        "P99 JCT",
        "Avg queue (min)",
        "Max queue (min)",
        "Avg stretch",
        "Throughput",
        "SM Util (%)",
        "Mem Util (%)",
        "Attainment (%)",
        "Sched. latency (ms, mean/p95)",
        "Config eff.",
        "Interf. eff.",
    ]
    rows = []
    for name, s in summ.items():
        rows.append(
            [
                name,
                _ratio(s["avg_jct_s"], base["avg_jct_s"])
                if base
                else _num(s["avg_jct_s"], ".0f") + "s",
                _ratio(s["median_jct_s"], base["median_jct_s"]) if base else "",
                _ratio(s["p99_jct_s"], base["p99_jct_s"])
                if base
                else _num(s["p99_jct_s"], ".0f") + "s",
                _num(s["avg_queue_s"], ".1f", 60),
                _num(s["max_queue_s"], ".1f", 60),
                _num(s["avg_stretch"], ".2f"),
                _ratio(s["throughput"], base["throughput"])
                if base
                else _num(s["throughput"], ".1f"),
                _num(s["sm_util"], ".1f"),
                _num(s["mem_util"], ".1f"),
                _num(s["attainment"], ".1f"),
                f"{s['plan_ms_mean']:.1f}/{s['plan_ms_p95']:.1f}",
                _num(s["config_efficiency"], ".3f"),
                _num(s["interference_efficiency"], ".3f"),
            ]
        )
    return _md(header, rows)


TIME_TABLE_COLUMNS = (
    ("Queued", "avg_queue_s"),
    *zip(
        (
            "Waiting after a preemption or requeue",
            "Paused reconfiguring",
            "Slower configurations",
            "Interference",
        ),
        (f"avg_{part}" for part in TIME_PARTS),  # metrics' own keys, in its order
        strict=True,
    ),
)


def time_table(summ: Mapping[str, Summary]) -> str:
    """Where a finished job's time beyond its solo run goes, in minutes per job."""
    header = ["System", "Avg JCT (min)", "Solo run", *(label for label, _ in TIME_TABLE_COLUMNS)]
    rows = []
    for name, s in summ.items():
        if any(key not in s for _, key in TIME_TABLE_COLUMNS):
            continue
        parts = [s[key] for _, key in TIME_TABLE_COLUMNS]
        solo = s["avg_jct_s"] - sum(parts)
        cells = [f"{round(v / 60, 1) + 0.0:.1f}" for v in (s["avg_jct_s"], solo, *parts)]
        rows.append([name, *cells])
    return _md(header, rows)


def ablation_table(summ: Mapping[str, Summary], full: str = "elastico") -> str:
    """Spec table 'Ablation study': each variant relative to full ElastiCo."""
    base = summ[full]
    header = [
        "Configuration",
        "Avg JCT",
        "Throughput",
        "Mem Util (%)",
        "SM Util (%)",
        "Attainment (%)",
        "Reconfig./Migr./Preempt.",
        "Residual admits",
        "Config eff.",
        "Interf. eff.",
    ]
    rows = []
    for name, s in summ.items():
        if not name.startswith("elastico"):
            continue
        rows.append(
            [
                name,
                _ratio(s["avg_jct_s"], base["avg_jct_s"]),
                _ratio(s["throughput"], base["throughput"]),
                _num(s["mem_util"], ".1f"),
                _num(s["sm_util"], ".1f"),
                _num(s["attainment"], ".1f"),
                f"{s['reconfigurations']:.0f}/{s['migrations']:.0f}/{s['preemptions']:.0f}",
                f"{s.get('residual_admissions', 0):.0f}",
                _num(s["config_efficiency"], ".3f"),
                _num(s["interference_efficiency"], ".3f"),
            ]
        )
    return _md(header, rows)


def _sweep_table(
    points: Sequence[tuple[str, Mapping[str, Summary]]],
    point_header: str,
    columns: Sequence[tuple[str, Callable[[Summary, Summary, Summary | None], str]]],
    systems: Sequence[str] | None,
    baseline: str,
) -> str:
    """One row per (sweep point, system): every system side by side at each point.

    ``columns`` are (header, cell) with ``cell(system, baseline, lucid)`` given the
    summaries at that point (``lucid`` None when Lucid did not run).
    """
    rows = []
    for label, summ in points:
        b, lucid = summ[baseline], summ.get("lucid")
        for name in systems if systems is not None else list(summ):
            if name in summ:
                rows.append([label, name, *(cell(summ[name], b, lucid) for _, cell in columns)])
    return _md([point_header, "System", *(h for h, _ in columns)], rows)


def scalability_table(
    points: Sequence[tuple[int, Mapping[str, Summary]]],
    systems: Sequence[str] | None = None,
    baseline: str = "volcano",
) -> str:
    """Spec table 'Scalability': each system relative to the baseline at each size.

    ``systems``: which rows to show at each size, in order (default: every system run).
    """
    columns: list[tuple[str, Callable[[Summary, Summary, Summary | None], str]]] = [
        ("Jobs", lambda s, b, lu: f"{s['jobs']:.0f}"),
        ("Avg JCT", lambda s, b, lu: _ratio(s["avg_jct_s"], b["avg_jct_s"])),
        ("Throughput", lambda s, b, lu: _ratio(s["throughput"], b["throughput"])),
        ("Avg queue (min)", lambda s, b, lu: _num(s["avg_queue_s"], ".1f", 60)),
        ("SM Util (%)", lambda s, b, lu: _num(s["sm_util"], ".1f")),
        ("Attainment (%)", lambda s, b, lu: _num(s["attainment"], ".1f")),
        (
            "Sched. latency (ms, mean/p95)",
            lambda s, b, lu: f"{s['plan_ms_mean']:.1f}/{s['plan_ms_p95']:.1f}",
        ),
    ]
    return _sweep_table([(str(g), summ) for g, summ in points], "GPUs", columns, systems, baseline)


def load_table(
    points: Sequence[tuple[float, Mapping[str, Summary]]],
    systems: Sequence[str] | None = None,
    baseline: str = "volcano",
) -> str:
    """Load sensitivity: JCT improvement (baseline JCT / system JCT) per load factor.

    ``systems``: which rows to show at each load, in order (default: every system run).
    """
    columns: list[tuple[str, Callable[[Summary, Summary, Summary | None], str]]] = [
        ("Avg JCT (h)", lambda s, b, lu: _num(s["avg_jct_s"], ".2f", 3600)),
        ("JCT improvement vs Volcano", lambda s, b, lu: _ratio(b["avg_jct_s"], s["avg_jct_s"])),
        (
            "vs Lucid",
            lambda s, b, lu: _ratio(lu["avg_jct_s"], s["avg_jct_s"]) if lu else "",
        ),
        ("Throughput vs Volcano", lambda s, b, lu: _ratio(s["throughput"], b["throughput"])),
        ("Avg queue (min)", lambda s, b, lu: _num(s["avg_queue_s"], ".1f", 60)),
        ("Attainment (%)", lambda s, b, lu: _num(s["attainment"], ".1f")),
    ]
    return _sweep_table(
        [(f"{100 * load:.0f}", summ) for load, summ in points],
        "Load (%)",
        columns,
        systems,
        baseline,
    )


@contextmanager
def writing(path: Path) -> Iterator[None]:
    """An OSError raised while ``path`` is written names it: a write that fails after the
    open (a full disk, a file size limit) carries no file name of its own."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def write_summary_csv(summ: Mapping[str, Summary], path: Path) -> None:
    keys = sorted({k for s in summ.values() for k in s})
    with open(path, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["policy", *keys])
        for name, s in summ.items():
            w.writerow([name, *(f"{s.get(k, float('nan')):.6g}" for k in keys)])


Place = Callable[[Path], Path]
"""The path to write a result file's content to: the file itself, or a temporary name
that a :class:`~elastico_extender.userfiles.Staging` renames onto it once all are written."""


def _itself(path: Path) -> Path:
    return path


def write_run_files(
    results: Mapping[str, RunResult], out: Path, place: Place = _itself
) -> list[Path]:
    """Per-job and timeline CSVs of every run, plus the summary CSV (each written to
    ``place(out / name)``); the paths written to."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    summ = summaries(results)
    summary, jobs, timeline = (place(out / name) for name in RUN_FILES)
    p = summary
    with writing(p):
        write_summary_csv(summ, p)
    written.append(p)
    p = jobs
    with writing(p), open(p, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(
            [
                "policy", "job_id", "workload", "gpus", "arrival_s", "start_s", "finish_s",
                "duration_s", "jct_s", "queue_s", "floor", "achieved_tput", *TIME_PARTS,
            ]
        )  # fmt: skip
        for name, r in results.items():
            parts = job_time_parts(r)
            for k, j in enumerate(r.jobs):
                w.writerow(
                    [
                        name, j.job_id, j.workload, j.gpus, f"{r.arrival[k]:.1f}",
                        f"{r.first_start[k]:.1f}", f"{r.finish[k]:.1f}", f"{r.work[k]:.1f}",
                        f"{r.finish[k] - r.arrival[k]:.1f}",
                        f"{r.first_start[k] - r.arrival[k]:.1f}",
                        f"{r.floor[k]:.6g}", f"{r.achieved[k]:.6g}",
                        *(f"{parts[c][k]:.1f}" if parts else "" for c in TIME_PARTS),
                    ]
                )  # fmt: skip
    written.append(p)
    p = timeline
    with writing(p), open(p, "w", newline="") as handle:
        w = csv.writer(handle)
        w.writerow(["policy", "hour", "sm_util", "mem_util", "busy_gpus", "useful_gpu_eq"])
        for name, r in results.items():
            for h, vals in _hourly(r).items():
                w.writerow([name, h, *(f"{v:.4f}" for v in vals)])
    written.append(p)
    return written


def _hourly(r: RunResult, bin_s: float = 3600.0) -> dict[float, tuple[float, ...]]:
    """Time averages per bin of SM, memory, busy share and useful work."""
    if r.seg_t0.size == 0:
        return {}
    start = r.window_t0
    end = float(r.seg_t1.max())
    bins = np.arange(start, end + bin_s, bin_s)
    out: dict[float, tuple[float, ...]] = {}
    for lo, hi in itertools.pairwise(bins):
        a = np.clip(r.seg_t0, lo, hi)
        b = np.clip(r.seg_t1, lo, hi)
        w = b - a
        if w.sum() <= 0:
            continue
        out[(lo - start) / 3600.0] = tuple(
            float((v * w).sum() / (hi - lo))
            for v in (r.seg_sm, r.seg_mem, r.seg_busy, r.seg_useful)
        )
    return out


def plot_all(
    results: Mapping[str, RunResult], out: Path, title: str = "", place: Place = _itself
) -> list[Path]:
    """CDF of JCT, SM utilisation over time, queueing delay by arrival order (PNG, each
    written to ``place(out / name)``); the paths written to."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError:
        print("matplotlib not installed: plots skipped (CSV files written); pip install matplotlib")
        return []
    out.mkdir(parents=True, exist_ok=True)
    cdf, utilisation, queueing = (place(out / name) for name in PLOT_FILES)
    written = []
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        done = r.status == DONE
        jct = np.sort((r.finish - r.arrival)[done]) / 3600.0
        ax.plot(jct, np.arange(1, jct.size + 1) / max(jct.size, 1), label=name)
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlabel("JCT (hours, log scale)")
    ax.set_ylabel("CDF")
    ax.set_title(f"CDF of JCT {title}".strip())
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    p = cdf
    fig.tight_layout()
    with writing(p):
        fig.savefig(p, dpi=120, format="png")  # a staged name ends .part
    plt.close(fig)
    written.append(p)

    fig, axes = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    for name, r in results.items():
        hourly = _hourly(r)
        hours = list(hourly)
        axes[0].plot(hours, [100 * v[0] for v in hourly.values()], label=name)
        axes[1].plot(hours, [100 * v[1] for v in hourly.values()], label=name)
    axes[0].set_ylabel("SM active (%)")
    axes[1].set_ylabel("GPU memory held (%)")
    axes[1].set_xlabel("time (hours)")
    window = next(iter(results.values())).window_s / 3600.0
    for a in axes:
        a.axvline(window, color="grey", ls=":", lw=1, label="last arrival")
        a.grid(alpha=0.3)
    axes[0].legend(fontsize=7, ncol=2)
    axes[0].set_title(f"Cluster utilisation over time {title}".strip())
    p = utilisation
    fig.tight_layout()
    with writing(p):
        fig.savefig(p, dpi=120, format="png")  # a staged name ends .part
    plt.close(fig)
    written.append(p)

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in results.items():
        order = np.argsort(r.arrival, kind="stable")
        q = (r.first_start - r.arrival)[order] / 60.0
        # a window of 3 jobs or a 20th of them, but no wider than the jobs there are
        # ("same" mode returns the longer input: a wider window would outgrow the x axis)
        k = min(max(3, q.size // 20), q.size)
        smooth = np.convolve(np.nan_to_num(q), np.ones(k) / k, mode="same")
        ax.plot(np.arange(q.size), smooth, label=name)
    ax.set_xlabel("job arrival order")
    ax.set_ylabel("queueing delay (min, moving average)")
    ax.set_title(f"Queueing delay by arrival order {title}".strip())
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    p = queueing
    fig.tight_layout()
    with writing(p):
        fig.savefig(p, dpi=120, format="png")  # a staged name ends .part
    plt.close(fig)
    written.append(p)
    return written
