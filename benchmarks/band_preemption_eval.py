"""Band preemption on and off, side by side, on issue 14's rows (planner.preempt).

Command (from the repository root; what produced
``benchmarks/results/issue14/band_preemption.md``)::

    PYTHONPATH=. nice -n 5 python benchmarks/band_preemption_eval.py --out /tmp/band_preemption

Each row of ``benchmarks/peers_eval.py`` (a Philly week at one cluster size, or the
synthetic mix at load 1.5 on 64 GPUs over 24 h) runs ``elastico+online``, what the
extender runs, twice on the same trace and seed: with ``band_preemption=False`` and
with ``PlannerSettings()`` (band preemption on, the default), in each world.  Average
JCT is normalised to volcano's of the same row as saved in ``benchmarks/results/peers/``
(the baselines are not re-run); beside it the row's saved tiresias and best baseline,
p99 JCT, the worst queueing delay, preemptions (every requeue; in brackets those band
preemption made) and where the time beyond a job's solo run goes (``sim.metrics``).
One JSON per run is saved under ``--out`` as it finishes, and runs already there are
not repeated, so an interrupted command resumes; the table is written there too (never
into ``benchmarks/results``).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from dataclasses import replace
from pathlib import Path

import _results
from _args import comma_list, positive_int
from peers_eval import (
    BASELINES,
    OUT,
    PHILLY,
    SCALE,
    SHIPPED,
    WORLDS,
    row_stem,
    scale_experiment,
    week_experiment,
    world_name,
)

from elastico_extender.core.model import Plan
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, run_one
from elastico_extender.sim.traces import philly_trace

SETTINGS = {"off": PlannerSettings(band_preemption=False), "on": PlannerSettings()}
ROWS = (*(f"{vc}:{g}" for vc, _, sizes in PHILLY for g in sizes), "scale:64")
"""Every Philly row of PEERS.md and the 64-GPU scale row (24 h at load 1.5)."""
BREAKDOWN = (
    ("avg_queue_s", "queue"),
    ("avg_waiting_after_start_s", "requeued"),
    ("avg_paused_s", "paused"),
    ("avg_config_loss_s", "config"),
    ("avg_interference_loss_s", "interf."),
)
"""Where a job's time beyond its solo run goes (``sim.metrics``), in the table's order."""


def saved_key(row: str, world: str) -> str:
    """The row's file stem in ``benchmarks/results/peers``."""
    name, gpus = row.split(":")
    return row_stem(None if name == "scale" else name, int(gpus), world)


def saved_wall_s(row: str, world: str) -> float:
    """How long the row's saved ``elastico+online`` run took (to run cheap rows first)."""
    path = OUT / f"{saved_key(row, world)}.json"
    if not path.exists():
        return float("inf")
    return float(json.loads(path.read_text())["meta"].get("wall_s", {}).get(SHIPPED, "inf"))


def experiment(row: str, world: str, seed: int) -> Experiment:
    name, gpus = row.split(":")
    if name == "scale":
        return scale_experiment(int(gpus), SCALE[int(gpus)], world, seed)
    days = next(d for vc, d, _ in PHILLY if vc == name)
    return week_experiment(philly_trace(name, seed=seed, days=days), int(gpus), world, seed)


def run(task: tuple[str, str, str, int, Path]) -> tuple[Path, str, str]:
    """One run of ``elastico+online`` (in a pool worker): where its summary goes, the
    summary as JSON, and the line to print.  The parent writes it: a failed write in a
    worker would end the worker, and the pool would wait for its answer forever."""
    row, world, setting, seed, out = task
    exp = replace(experiment(row, world, seed), planner=SETTINGS[setting])
    band = [0.0]

    def count(plan: Plan) -> None:
        band[0] += plan.stats.get("band_preemptions", 0.0)

    result = run_one(SHIPPED, exp, planned=count)
    summary = {**summarise(result), "band_preemptions": band[0], "wall_s": result.wall_s}
    path = out / f"{saved_key(row, world)}_{setting}.json"
    return path, json.dumps(summary, indent=1, sort_keys=True), f"{path.name}: {result.wall_s:.0f}s"


def table(rows: list[str], worlds: list[str], out: Path, command: str) -> str:
    """The side-by-side table of every run saved under ``out``."""
    head = [
        "world", "row", "tiresias", "best base", "saved e+o", "off", "on", "on/off",
        "p99 h off/on", "worst queue h off/on", "preemptions off/on (band)",
        "off: " + "/".join(b for _, b in BREAKDOWN) + " (s)",
        "on: " + "/".join(b for _, b in BREAKDOWN) + " (s)",
    ]  # fmt: skip
    lines = [
        f"Command: `{command}`",
        "",
        f"`{SHIPPED}`, avg JCT normalised to the row's saved volcano (benchmarks/results/"
        "peers); off = band_preemption=False, on = PlannerSettings() (the default).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for world in worlds:
        for row in rows:
            key = saved_key(row, world)
            runs = {s: out / f"{key}_{s}.json" for s in SETTINGS}
            if not all(p.exists() for p in runs.values()):
                continue
            got = {s: json.loads(p.read_text()) for s, p in runs.items()}
            saved = json.loads((OUT / f"{key}.json").read_text())["summary"]
            base = saved["volcano"]["avg_jct_s"]
            others = [n for n in BASELINES if n != "volcano" and "avg_jct_s" in saved.get(n, {})]
            best = min(others, key=lambda n: saved[n]["avg_jct_s"])
            off, on = got["off"], got["on"]
            cells = [
                world,
                row,
                f"{saved['tiresias']['avg_jct_s'] / base:.3f}",
                f"{saved[best]['avg_jct_s'] / base:.3f} ({best})",
                f"{saved[SHIPPED]['avg_jct_s'] / base:.3f}" if SHIPPED in saved else "-",
                f"{off['avg_jct_s'] / base:.3f}",
                f"{on['avg_jct_s'] / base:.3f}",
                f"{on['avg_jct_s'] / off['avg_jct_s']:.3f}",
                f"{off['p99_jct_s'] / 3600:.1f}/{on['p99_jct_s'] / 3600:.1f}",
                f"{off['max_queue_s'] / 3600:.1f}/{on['max_queue_s'] / 3600:.1f}",
                f"{off['preemptions']:.0f}/{on['preemptions']:.0f} ({on['band_preemptions']:.0f})",
                "/".join(f"{off.get(k, 0.0):.0f}" for k, _ in BREAKDOWN),
                "/".join(f"{on.get(k, 0.0):.0f}" for k, _ in BREAKDOWN),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    _results.write_text(out / "band_preemption.md", text)
    return text


def row_name(text: str) -> str:
    """A ``--rows`` item: one of ROWS."""
    if text not in ROWS:
        raise argparse.ArgumentTypeError(f"no row {text!r}; known: {', '.join(ROWS)}")
    return text


def setting_name(text: str) -> str:
    """A ``--settings`` item: one of SETTINGS."""
    if text not in SETTINGS:
        raise argparse.ArgumentTypeError(f"no setting {text!r}; known: {', '.join(SETTINGS)}")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the runs and table")
    ap.add_argument("--rows", type=comma_list(row_name), default=",".join(ROWS))
    ap.add_argument("--worlds", type=comma_list(world_name), default=",".join(WORLDS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=positive_int, default=1, help="runs in parallel")
    ap.add_argument(
        "--settings",
        type=comma_list(setting_name),
        default=",".join(SETTINGS),
        help="which runs (off: a saved 'off' is reused after a change of the rule)",
    )
    args = ap.parse_args(argv)
    out: Path = args.out
    if out.exists() and not out.is_dir():
        ap.error(f"--out: {out} is not a folder")
    _results.folder(out)
    tasks = [
        (row, world, setting, args.seed, out)
        for world in args.worlds
        for row in args.rows
        for setting in args.settings
        if not (out / f"{saved_key(row, world)}_{setting}.json").exists()
    ]
    tasks.sort(key=lambda task: saved_wall_s(task[0], task[1]))  # cheapest rows first
    t0 = time.time()
    with mp.get_context("fork").Pool(args.jobs) as pool:
        for path, summary, done in pool.imap_unordered(run, tasks):
            _results.write_text(path, summary)  # saved as it finishes: a rerun resumes
            print(f"  {done} ({time.time() - t0:.0f}s)", file=sys.stderr, flush=True)
    command = "PYTHONPATH=. nice -n 5 python benchmarks/band_preemption_eval.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    print(table(args.rows, args.worlds, out, command))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
