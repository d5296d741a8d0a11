"""``elastico simulate``-style entry point: run policies side by side on one trace.

Examples::

    python -m elastico_extender.sim.cli --quick
    python -m elastico_extender.sim.cli --gpus 64 --load 1.0 --duration 24 --out results/main
    python -m elastico_extender.sim.cli --trace philly:ed69ec --duration 168 --policy volcano \
        --policy lucid --policy elastico
    python -m elastico_extender.sim.cli --trace my_trace.csv --interference my_pairs.csv

Every policy sees the same trace, cluster and seed.  Tables are printed and
written to ``--out`` with per-job and timeline CSVs and PNG plots.
"""

from __future__ import annotations

import argparse
import csv
import logging
import math
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from elastico_extender.core.resources import MAX_CLUSTER_GPUS
from elastico_extender.core.settings import PlannerSettings, assignments
from elastico_extender.csv_row import open_csv
from elastico_extender.policies.elastico import ABLATIONS
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.instances import instances_needed
from elastico_extender.sim.pai_trace import PAI_PREFIX, is_pai_table, pai_trace
from elastico_extender.sim.philly_log import PHILLY_LOG_PREFIX, is_job_log, parse_spec, philly_log
from elastico_extender.sim.production import ProductionWorld
from elastico_extender.sim.progress import ProgressBar
from elastico_extender.sim.report import (
    PLOT_FILES,
    RUN_FILES,
    ablation_table,
    main_table,
    plot_all,
    summaries,
    time_table,
    write_run_files,
    writing,
)
from elastico_extender.sim.runner import (
    DEFAULT_POLICIES,
    Experiment,
    build_policy,
    parse_policy_name,
    run_experiment,
)
from elastico_extender.sim.traces import (
    MAX_TRACE_SECONDS,
    PHILLY_CLIP_HOURS,
    PHILLY_INFERENCE_SHARE,
    PHILLY_VC_GPUS,
    EmptyWindowError,
    TraceJob,
    TraceLoad,
    arrival_span,
    days_window,
    fit_to_cluster,
    offered_load,
    philly_trace,
    read_trace,
    rebase,
    scale_arrivals,
    synthetic,
)
from elastico_extender.sim.truth import DEFAULT_PAIRS, GroundTruth
from elastico_extender.sim.workloads import ConfigTable
from elastico_extender.userfiles import Staging, check_writable, reason

__all__ = [
    "WORLDS",
    "build_parser",
    "count_arg",
    "days_arg",
    "finite_arg",
    "load_trace",
    "main",
    "text_arg",
]

WORLDS = ("benchmark", "production")
MAX_PROFILE_NOISE = 2.0
"""Largest --profile-noise: a one-sigma profile error of e**2 (7.4x) is far past any
profiler's; far larger sigmas overflow the true throughputs to inf and never end."""
DEFAULT_GPU_TYPE = "v100"

log = logging.getLogger(__name__)


def finite_arg(minimum: float, strict: bool, maximum: float = math.inf) -> Callable[[str], float]:
    """argparse ``type=``: a finite number above (``strict``) or at ``minimum``, at most
    ``maximum`` (also the benchmark scripts' check, ``benchmarks/_args.py``)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
        if not ok:
            sign = ">" if strict else ">="
            raise argparse.ArgumentTypeError(f"must be a finite number {sign} {minimum:g}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}")
        return value

    return parse


def _whole(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:,}")
        return value

    return parse


count_arg = _whole(1)
"""argparse ``type=``: a whole number >= 1."""


def text_arg(text: str) -> str:
    """argparse ``type=``: a value that is not blank (an empty path would read the working
    folder, an empty GPU type silently mean the default)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must not be empty")
    return text


def _reason(exc: Exception) -> str:
    """Why a file could not be read: the OS's words for an OSError, else the message."""
    return reason(exc) if isinstance(exc, OSError) else str(exc)


def _unreadable(option: str, path: object, exc: Exception) -> InputError:
    """``option: cannot read PATH: why``, the path said once: a bad cell's message already
    begins with the file (``PATH, line 2: column ...``)."""
    why = _reason(exc)
    if why.startswith(f"{path}, ") or why.startswith(f"{path}: "):
        return InputError(f"{option}: {why}")
    return InputError(f"{option}: cannot read {path}: {why}")


def days_arg(text: str) -> tuple[float, float]:
    """'7' (the first 7 days) or '2:9' (from day 2 to day 9)."""
    parts = text.split(":")
    try:
        lo, hi = (0.0, float(parts[0])) if len(parts) == 1 else (float(parts[0]), float(parts[1]))
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"{text!r}: use N or START:END (days)") from None
    if len(parts) > 2 or not (math.isfinite(lo) and math.isfinite(hi) and 0 <= lo < hi):
        raise argparse.ArgumentTypeError(f"{text!r}: need 0 <= START < END, finite")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elastico simulate",
        description="Trace-driven simulation of ElastiCo against Volcano-like (FIFO), "
        "Lucid-like, Tiresias-like and SRTF (oracle) baselines (spec section 5).",
    )
    p.add_argument(
        "--policy",
        action="append",
        help="policy to run (repeatable; default: all of " + ", ".join(DEFAULT_POLICIES) + "; "
        "also tiresias, srtf = shortest remaining GPU-time first with ORACLE durations, "
        "hami = HAMi-like packing of the shares a trace declares (Alibaba's gpu_milli), and "
        + ", ".join(n for n in ABLATIONS if n not in DEFAULT_POLICIES)
        + "); "
        "suffix '+learned' plans ElastiCo with a predictor learned from 25%% of the "
        "workload pairs, '+iac' with a spec-accuracy (7.6%% MAPE) predictor, '+truth' with the "
        "exact slowdowns (ORACLE diagnostic); then optionally '+online' (the closed loop)",
    )
    p.add_argument(
        "--trace",
        type=text_arg,
        default="synthetic",
        help="'synthetic', 'philly:VC' (e.g. philly:ed69ec; ships with the package), a CSV "
        "path (format: sim.traces; a Helios cluster_log.csv, as Lucid's simulator reads, and "
        "an Alibaba openb_pod_list_*.csv too), 'pai:DIR', a folder of Alibaba PAI's 2020 "
        "pai_task_table.csv and pai_job_table.csv (sim.pai_trace), or 'philly-log:FILE', "
        "Microsoft's Philly cluster_job_log, plain or gzip ('philly-log:FILE@VC': one VC's "
        "jobs; sim.philly_log)",
    )
    p.add_argument(
        "--gpus",
        type=_whole(1, MAX_CLUSTER_GPUS),
        help="cluster GPUs (default 64; a Philly VC's own size, philly-log:FILE@VC's too; at "
        "most 65,536)",
    )
    p.add_argument(
        "--load",
        type=finite_arg(0.0, strict=True),
        help="load factor: synthetic arrival rate, or arrivals of a trace rescaled to it "
        "over its arrival span (default 1.0 for synthetic, as recorded for traces)",
    )
    p.add_argument("--seed", type=_whole(0), default=0)
    p.add_argument(
        "--duration",
        type=finite_arg(0.0, strict=True, maximum=MAX_TRACE_SECONDS / 3600.0),
        help="arrival window in hours (default 24; whole trace for files; on Philly the first "
        "hours, instead of --days; at most 8784)",
    )
    p.add_argument(
        "--days",
        type=days_arg,
        help="window of a Philly VC or a trace file in days since its first job: N or "
        "START:END; jobs that finished before START are the history the duration "
        "estimators start from",
    )
    p.add_argument(
        "--epoch",
        type=finite_arg(0.0, strict=True, maximum=86400.0),
        default=60.0,
        help="scheduling epoch in simulated seconds (at most a day)",
    )
    p.add_argument("--out", type=text_arg, default="sim-results", help="output directory")
    p.add_argument(
        "--quick",
        action="store_true",
        help="small loaded cluster, short trace (smoke test): --gpus 16 --duration 6 --load "
        "1.6 where not given (--duration not beside --days)",
    )
    p.add_argument(
        "--jobs",
        type=count_arg,
        default=2,
        help="policies simulated in parallel (at most one process per policy and per CPU)",
    )
    p.add_argument(
        "--world",
        choices=WORLDS,
        default="benchmark",
        help="ground truth: 'benchmark' (every job saturates its GPU, Gavel's measured pairs) or "
        "'production' (production activity, phases and bursty inference; sim.production)",
    )
    p.add_argument(
        "--world-file",
        type=text_arg,
        help="JSON parameters of the production world (default: the shipped "
        "sim/data/production_world.json, each figure with its source)",
    )
    p.add_argument(
        "--interference",
        type=text_arg,
        default=str(DEFAULT_PAIRS),
        help="measured pair CSV (format: sim.truth); 'none' uses the contention model only",
    )
    p.add_argument(
        "--gpu-type",
        type=text_arg,
        help="GPU type whose rows of the pair CSV are used (others only fill missing pairs); "
        f"one of the file's gpu column values (shipped file: v100, p100; default "
        f"{DEFAULT_GPU_TYPE})",
    )
    p.add_argument(
        "--profile-noise",
        type=finite_arg(0.0, strict=False, maximum=MAX_PROFILE_NOISE),
        default=0.05,
        help=f"sigma of log T_true/T (at most {MAX_PROFILE_NOISE:g})",
    )
    p.add_argument(
        "--max-job-hours",
        type=finite_arg(0.0, strict=False, maximum=MAX_TRACE_SECONDS / 3600.0),
        default=None,
        help=f"clip Philly durations to this many hours (default {PHILLY_CLIP_HOURS:g}; "
        "0: no clipping; at most 8784, a trace's longest job); the count is printed",
    )
    p.add_argument(
        "--inference-share",
        type=finite_arg(0.0, strict=False, maximum=1.0),
        default=None,
        help="share of Philly's one-GPU jobs turned into LLM inference "
        f"(0..1, default {PHILLY_INFERENCE_SHARE:g}; printed)",
    )
    p.add_argument(
        "--planner",
        action="append",
        metavar="NAME=VALUE",
        help="a planner setting for every policy (repeatable), e.g. --planner tau_default=1.4; "
        "names and defaults: elastico_extender/core/settings.py",
    )
    p.add_argument("--instances", action="store_true", help="also count GPU instances per mix")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


class InputError(ValueError):
    """A bad argument: the message names the option."""


QUICK_DEFAULTS: dict[str, float] = {"gpus": 16, "duration": 6.0, "load": 1.6}
"""What --quick fills in: a loaded cluster, so the quick run shows what sharing changes."""


def _apply_quick(args: argparse.Namespace) -> None:
    """--quick's defaults for the options the user left unset (not --duration beside
    --days, which sets the Philly window itself), remembered in ``args.quick_filled``
    so that an error about one names --quick, what the user gave."""
    filled = []
    for name, value in QUICK_DEFAULTS.items():
        if getattr(args, name) is None and not (name == "duration" and args.days is not None):
            setattr(args, name, int(value) if name == "gpus" else value)
            filled.append(name)
    args.quick_filled = tuple(filled)


def _named(args: argparse.Namespace, *names: str) -> str:
    """The options a message is about, as the user gave them: one that --quick filled in
    is named as --quick with the value it chose (the user never typed that option)."""
    filled = getattr(args, "quick_filled", ())
    given = [f"--{n}" for n in names if n not in filled]
    chosen = [f"--{n} {getattr(args, n):g}" for n in names if n in filled]
    if chosen:
        given.append(f"--quick (its {', '.join(chosen)})")
    return "/".join(given)


def _figure(value: float) -> str:
    """A load or factor in a few digits, however large (1e308 has 309 in fixed point)."""
    return f"{value:.2f}" if value < 1000 else f"{value:.3g}"


def _no_spacing(args: argparse.Namespace, count: int, window: str | None) -> str:
    """Why ``--load`` cannot apply: every job arrives at once, in the whole trace or in the
    part of it the option ``window`` kept (then named, as the one to change)."""
    tail = "so there is no arrival spacing to scale to a load"
    if window is None:
        return (
            f"{_named(args, 'load')}: every job of {args.trace} arrives at the same instant, {tail}"
        )
    jobs = f"{count} job" + ("s" if count != 1 else "")
    return (
        f"{_named(args, 'load', window)}: the window {_named(args, window)} keeps holds {jobs} "
        f"of {args.trace}, all arriving at one instant, {tail} (widen the window)"
    )


def _read_trace_file(args: argparse.Namespace) -> TraceLoad:
    """The trace file ``--trace`` names: a CSV of a layout told apart by its header, a
    folder of Alibaba PAI's headerless 2020 tables (``pai:DIR``, :mod:`.pai_trace`), or
    Philly's JSON job log (``philly-log:FILE[@VC]``, :mod:`.philly_log`)."""
    if args.trace.startswith(PHILLY_LOG_PREFIX):
        try:
            return philly_log(*parse_spec(args.trace), seed=args.seed)
        except ValueError as exc:  # it names the file, and the job and its byte offset
            raise InputError(f"--trace: {exc}") from None
    if is_job_log(args.trace):  # JSON: read as a CSV, its first line would be the header
        raise InputError(
            f"--trace: {args.trace} is Philly's job log (JSON, not CSV): read it with "
            f"--trace {PHILLY_LOG_PREFIX}{args.trace}"
        )
    if args.trace.startswith(PAI_PREFIX):
        folder = args.trace.removeprefix(PAI_PREFIX)
        if not folder:
            raise InputError(f"--trace: {PAI_PREFIX} names no folder (use {PAI_PREFIX}DIR)")
        try:
            return pai_trace(folder, args.seed)
        except ValueError as exc:  # it names the table, and the line and column
            raise InputError(f"--trace: {exc}") from None
        except OSError as exc:  # a read that failed part way
            raise _unreadable("--trace", args.trace, exc) from None
    if is_pai_table(args.trace):  # its first record would be read as a header
        raise InputError(
            f"--trace: {args.trace} is a table of Alibaba PAI's 2020 trace, which has no "
            f"header row: give its folder, --trace {PAI_PREFIX}{Path(args.trace).parent}"
        )
    try:
        return read_trace(args.trace, args.seed)
    except (OSError, ValueError, KeyError) as exc:
        raise _unreadable("--trace", args.trace, exc) from None


def _file_gpus(trace: str) -> int:
    """The cluster a trace file runs on without ``--gpus``: the VC's own size for a Philly
    job log read for one VC of known size (as ``philly:VC``), else 64."""
    if trace.startswith(PHILLY_LOG_PREFIX):
        return PHILLY_VC_GPUS.get(parse_spec(trace)[1] or "", 64)
    return 64


def load_trace(args: argparse.Namespace) -> tuple[list[TraceJob], int, float, TraceLoad]:
    """(jobs rebased to t=0, cluster GPUs, arrival span seconds, what was done) for ``args``;
    the span is 0 when every job arrives at once (no offered load exists then)."""
    hours = args.duration
    gpus = args.gpus
    days = getattr(args, "days", None)
    share = getattr(args, "inference_share", None)
    clip_hours = getattr(args, "max_job_hours", None)
    narrowed: str | None = None  # the option that kept only part of the trace's jobs
    if not args.trace.startswith("philly:"):
        # Philly-only options on another trace would be ignored silently: refuse them.
        for option, given in (("--inference-share", share), ("--max-job-hours", clip_hours)):
            if given is not None:
                raise InputError(f"{option}: only applies to --trace philly:VC")
    if hours and days is not None:
        raise InputError("--duration: --days sets the window; give one of the two")
    if args.trace == "synthetic":
        if days is not None:
            raise InputError("--days: applies to a trace's arrivals (use --duration)")
        gpus = gpus or 64
        window = (hours or 24.0) * 3600.0
        load = 1.0 if args.load is None else args.load
        try:
            jobs = synthetic(gpus, load, window, args.seed)
        except ValueError as exc:
            raise InputError(f"{_named(args, 'load', 'gpus', 'duration')}: {exc}") from None
        if not jobs:
            raise InputError(
                f"{_named(args, 'duration', 'load')}: no job arrives in {window / 3600:g} h "
                f"at load {load:g} (raise either)"
            )
        return jobs, gpus, window, TraceLoad(jobs)
    if args.trace.startswith("philly:"):
        vc = args.trace.split(":", 1)[1]
        if hours:
            days = (0.0, hours / 24.0)
        if days is not None:
            narrowed = "duration" if hours else "days"
        share = PHILLY_INFERENCE_SHARE if share is None else share
        clip_hours = PHILLY_CLIP_HOURS if clip_hours is None else clip_hours
        clip = clip_hours * 3600.0 if clip_hours > 0 else None
        try:
            loaded = philly_trace(
                vc, seed=args.seed, max_duration_s=clip, days=days, inference_share=share
            )
        except EmptyWindowError as exc:
            raise InputError(f"{_named(args, 'duration' if hours else 'days')}: {exc}") from None
        except ValueError as exc:
            raise InputError(f"--trace: {exc}") from None
        gpus = gpus or PHILLY_VC_GPUS.get(vc, 64)
    else:
        loaded = _read_trace_file(args)
        if not loaded.jobs:  # the notes say why (a Helios log's skipped rows)
            why = "".join(f"; {note}" for note in loaded.notes)
            raise InputError(f"--trace: {args.trace} has no jobs{why}")
        gpus = gpus or _file_gpus(args.trace)
        jobs = rebase(loaded.jobs)
        notes = [*loaded.notes, f"{args.trace}: {len(jobs)} jobs, rebased to t=0"]
        if hours:
            kept = [j for j in jobs if j.arrival_s <= hours * 3600.0]
            notes.append(
                f"{_named(args, 'duration')}: kept the {len(kept)} of {len(jobs)} jobs arriving "
                f"in the first {hours:g} h (dropped {len(jobs) - len(kept)} arriving later)"
            )
            if len(kept) < len(jobs):
                narrowed = "duration"
            jobs = kept
        loaded = TraceLoad(jobs, notes=tuple(notes))
        if days is not None:
            try:
                loaded = days_window(loaded, days)
            except EmptyWindowError as exc:
                raise InputError(f"--days: {args.trace}: {exc}") from None
            narrowed = "days"
    jobs = fit_to_cluster(loaded.jobs, gpus)
    clipped = sum(j.gpus > gpus for j in loaded.jobs)
    if clipped:
        note = f"clipped {clipped} gang sizes to the cluster's {gpus} GPUs (wider never start)"
        loaded = replace(loaded, notes=(*loaded.notes, note))
    span = arrival_span(jobs)
    if args.load is not None:
        if span <= 0:
            raise InputError(_no_spacing(args, len(jobs), narrowed))
        offered = offered_load(jobs, gpus, span)
        factor = args.load / max(offered, 1e-9)
        jobs = scale_arrivals(jobs, factor)
        span = arrival_span(jobs)
        if span > MAX_TRACE_SECONDS:
            raise InputError(
                f"{_named(args, 'load')}: {args.load:g} stretches the trace's arrivals over "
                f"{span / 86400:.3g} days (at most {MAX_TRACE_SECONDS / 86400:g})"
            )
        note = (
            f"{_named(args, 'load')}: every arrival time divided by {factor:.3g} to offer "
            f"{args.load:g} (the trace offers {_figure(offered)})"
        )
        loaded = replace(loaded, notes=(*loaded.notes, note))
    return jobs, gpus, span, loaded


def _check_pairs(args: argparse.Namespace) -> tuple[str, str] | None:
    """The pair CSV ``--interference`` names and a note of how much of the simulated world
    it measures; None for ``none``.  InputError when it cannot be read, lacks the
    ``--gpu-type``, or measures nothing: no pair names two simulated workloads, so every
    slowdown would come from the contention model and the file would change nothing."""
    if args.interference.lower() == "none":
        return None
    path = Path(args.interference)
    configs = ConfigTable.build(args.seed, args.profile_noise)
    try:
        measured = GroundTruth.build(configs, path, gpu=args.gpu_type).measured
        with open_csv(path) as handle:
            types = {r.get("gpu") or "" for r in csv.DictReader(handle)}
    except (OSError, ValueError, KeyError) as exc:
        raise _unreadable("--interference", path, exc) from None
    types.discard("")
    if types and args.gpu_type not in types:
        raise InputError(
            f"--gpu-type: {args.gpu_type!r} has no rows in {path.name} "
            f"(types: {', '.join(sorted(types))})"
        )
    if not measured.any():
        example = next(g for g in configs.gavel if g)
        raise InputError(
            f"--interference: no pair of {path.name} names two simulated workloads (job_a "
            f"and job_b must be Gavel job types such as {example!r}, or catalog names such "
            f"as {configs.names[0]!r}); --interference none uses the contention model alone"
        )
    training = ~configs.is_inference
    shares = measured.mean(), measured[np.ix_(training, training)].mean()
    note = (
        f"{path.name} measures {shares[0]:.0%} of the simulated configuration pairs (of the "
        f"training pairs {shares[1]:.0%}); the others follow the contention model"
    )
    return str(path), note


TABLES_FILE = "tables.md"


def _check_out(out: Path, names: Sequence[str]) -> None:
    """``out`` is a folder the run can write, and none of the files ``names`` it writes
    there is something else (a folder called jobs.csv, a FIFO): checked before the
    simulation, not found when its results are written."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out):  # a name of its own, gone when closed
            pass
    except OSError as exc:
        raise InputError(f"--out: cannot write to {out}: {_reason(exc)}") from None
    for name in names:
        target = out / name
        try:
            if os.path.lexists(target):
                check_writable(target)
        except OSError as exc:
            raise InputError(f"--out: cannot write {target}: {_reason(exc)}") from None


def _planner(flags: list[str] | None) -> PlannerSettings | None:
    """``--planner NAME=VALUE`` flags as settings (None: none given, the defaults)."""
    if not flags:
        return None
    try:
        return PlannerSettings.from_mapping(assignments(flags, "--planner"), label="--planner ")
    except ValueError as exc:  # every message starts with the option's name
        raise InputError(str(exc)) from None


def _check_policies(names: list[str]) -> None:
    for name in names:
        try:
            parse_policy_name(name)
        except ValueError as exc:
            raise InputError(f"--policy: {exc}") from None


QUICK_POLICIES = ("volcano", "lucid", "tiresias", "elastico")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.quick:
        _apply_quick(args)
    # a policy named twice runs once, and is listed once
    policies = list(
        dict.fromkeys(args.policy or (QUICK_POLICIES if args.quick else DEFAULT_POLICIES))
    )
    try:
        _check_policies(policies)
        if args.gpu_type is not None and args.interference.lower() == "none":
            raise InputError("--gpu-type: only applies with a pair CSV (--interference none)")
        args.gpu_type = args.gpu_type or DEFAULT_GPU_TYPE
        checked = _check_pairs(args)
        pairs, coverage = checked if checked is not None else (None, None)
        out = Path(args.out)
        _check_out(out, [TABLES_FILE, *RUN_FILES, *(() if args.no_plots else PLOT_FILES)])
        if args.world_file is not None:
            if args.world != "production":
                raise InputError("--world-file: only applies to --world production")
            try:
                ProductionWorld.load(args.world_file)
            except ValueError as exc:
                raise InputError(f"--world-file: {exc}") from None
        planner = _planner(args.planner)
        jobs, gpus, window, loaded = load_trace(args)
    except InputError as exc:
        parser.print_usage(sys.stderr)
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    if not jobs:
        print(f"{parser.prog}: error: --trace: the trace has no jobs", file=sys.stderr)
        return 2
    exp = Experiment(
        trace=tuple(jobs),
        cluster=ClusterSpec(gpus=gpus),
        seed=args.seed,
        epoch_s=args.epoch,
        pairs=pairs,
        profile_noise=args.profile_noise,
        gpu_type=args.gpu_type,
        world=args.world,
        world_file=args.world_file,
        history=loaded.history,
        planner=planner,
    )
    # Work over the arrival span: none when every job arrives at once.
    load = _figure(offered_load(jobs, gpus, window)) if window > 0 else "n/a"
    print(
        f"trace={args.trace} jobs={len(jobs)} gpus={gpus} window={window / 3600:.1f}h "
        f"offered load={load} epoch={args.epoch:g}s seed={args.seed} world={args.world} "
        f"gpu-type={args.gpu_type} policies={','.join(policies)}"
    )
    for note in loaded.notes:
        print(f"  {note}")
    if coverage is not None:
        print(f"  {coverage}")
    if planner is not None:
        print(f"  planner settings changed: {planner.changed()}")
    if any(p.partition("+")[0] == "srtf" for p in policies):
        print("  srtf is an ORACLE: it is told every job's true remaining time")
    bar = ProgressBar(f"simulating {len(policies)} policies")
    bar.enabled = not args.no_progress
    try:
        results = run_experiment(exp, policies, workers=args.jobs, on_progress=bar.update)
    except ValueError as exc:
        bar.close()
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    bar.update({n: (1, 1) for n in policies}, force=True)
    bar.close()
    summ = summaries(results)
    baseline = "volcano" if "volcano" in summ else next(iter(summ))
    sections = [
        f"## Main results ({gpus} GPUs, {args.world} world, normalised to {baseline})\n",
        main_table(summ, baseline=baseline),
        "\n## Where each job's time goes (minutes per finished job)\n",
        time_table(summ),
    ]
    if sum(n.startswith("elastico") for n in summ) > 1 and "elastico" in summ:
        sections += ["\n## Ablation (normalised to full elastico)\n", ablation_table(summ)]
    if args.instances:
        configs = ConfigTable.build(args.seed, args.profile_noise)
        truth = GroundTruth.build(configs, pairs, gpu=args.gpu_type)
        mix = [j for j in jobs if j.gpus <= 8][:64]
        rows = ["| Policy | GPUs needed for the mix |", "|---|---|"]
        for name in policies:
            need = instances_needed(build_policy(name, exp, truth), mix, configs)
            rows.append(f"| {name} | {need} |")
        sections += [f"\n## GPU instances for a mix of {len(mix)} jobs\n", "\n".join(rows)]
    text = "\n".join(sections)
    print(text)
    for name, r in results.items():
        if r.anomalies or r.capacity_violations:
            print(
                f"WARNING {name}: {len(r.anomalies)} anomalies, "
                f"{len(r.capacity_violations)} capacity violations; first: "
                f"{(r.anomalies or [str(v) for v in r.capacity_violations])[:3]}"
            )
    walls = ", ".join(f"{n} {r.wall_s:.1f}s" for n, r in results.items())
    print(f"simulation wall time: {walls}")
    try:  # all renamed into place once all are written: a failure leaves none cut off
        with Staging() as staged:
            tables = staged(out / TABLES_FILE)
            with writing(tables):
                tables.write_text(text + "\n")
            write_run_files(results, out, place=staged)
            if not args.no_plots:
                plot_all(results, out, title=f"({gpus} GPUs, load {load})", place=staged)
    except OSError as exc:  # the disk filled, or the folder changed, after the check
        print(
            f"{parser.prog}: error: --out: cannot write {exc.filename}: {_reason(exc)}",
            file=sys.stderr,
        )
        return 1
    print(f"results written to {out}/")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
