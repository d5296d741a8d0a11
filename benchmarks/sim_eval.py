"""Regenerate every simulation table and plot of the evaluation (spec section 5).

Command (from the repository root)::

    PYTHONPATH=. python benchmarks/sim_eval.py                    # everything (~40-60 min, 2 cores)
    PYTHONPATH=. python benchmarks/sim_eval.py --only main        # main + ablation (64 GPUs)
    PYTHONPATH=. python benchmarks/sim_eval.py --only load,scale,instances,philly
    PYTHONPATH=. python benchmarks/sim_eval.py --quick            # small smoke variant
    PYTHONPATH=. python benchmarks/sim_eval.py --only scale --sizes 64,256 --jobs 1
    PYTHONPATH=. python benchmarks/sim_eval.py --only collect      # RESULTS.md from the parts

``--jobs`` is how many simulations run at once (one per policy; use 1 on a shared
machine).  ``--sizes`` picks the scale section's cluster sizes, ``--load-hours`` the
load section's arrival window.  Every section's Markdown names the command that
made it.  ``--quick`` writes into a fresh temporary directory (named on stderr), never into
``benchmarks/results``.

Sections (results under ``benchmarks/results/<section>/``, tables collected in
``benchmarks/results/RESULTS.md``):

* ``main``: 64 GPUs, synthetic 24 h mix at load 1.0, every policy on one seed:
  the main-results table (normalised to Volcano) and the ablation tables
  (normalised to full ElastiCo, without and with the closed loop), plots (CDF of
  JCT, utilisation over time, queueing delay by arrival order).
* ``load``: 128 GPUs at 50/100/150% load, every compared system side by side.
* ``scale``: 64, 128, 256, 512 and 2,048 GPUs, arrivals scaled with the cluster
  to keep the load factor; shorter windows at the large sizes (see SCALE).
* ``instances``: GPUs each policy needs to start a fixed mix at once.
* ``philly``: a real Philly VC (ed69ec, its own 64 GPUs), all jobs, arrivals compressed
  to load 1.0 (the VC's native load over its 3-month trace is 0.09).

Every policy runs with the same trace and seed.  Peers: ``lucid`` (Lucid's published
policy), ``tiresias`` (2D-LAS) and ``srtf`` (shortest remaining time first given the
true durations: an ORACLE no scheduler has); ``docs/baselines.md`` states each.
``elastico`` plans with the core ContentionPredictor and no observations (the open
loop: no node agents), ``elastico+online`` is the same with the closed loop (node
agents reporting, the online correction; what the Helm chart installs),
``elastico+learned`` plans with a k-NN learned from a stratified 25% of the workload
pairs, ``elastico+iac`` with a predictor of the spec's accuracy.
The 128-GPU, load-1.0, 24 h point is shared by the load and scale sections and run
once when both are asked for.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import _results
from _args import positive_float

from elastico_extender.sim.engine import ClusterSpec, RunResult
from elastico_extender.sim.instances import instances_needed
from elastico_extender.sim.progress import ProgressBar
from elastico_extender.sim.report import (
    ablation_table,
    load_table,
    main_table,
    plot_all,
    scalability_table,
    summaries,
    write_run_files,
)
from elastico_extender.sim.runner import Experiment, build_policy, run_experiment
from elastico_extender.sim.traces import (
    fit_to_cluster,
    load_philly,
    offered_load,
    scale_arrivals,
    synthetic,
)
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable

OUT = Path(__file__).with_name("results")
COMPARE = (
    "volcano",
    "lucid",
    "tiresias",
    "srtf",
    "elastico",
    "elastico+online",
    "elastico+learned",
    "elastico+iac",
)
ABLATED = ("elastico-no-rst", "elastico-no-esp", "elastico-no-iac", "elastico-no-pds")
"""The spec's ablations (one mechanism off each); the main section runs each without and
with the closed loop: what each mechanism adds to the open loop and to what is shipped."""
MAIN_POLICIES = (*COMPARE, *ABLATED, *(f"{name}+online" for name in ABLATED))
PARTS = ("main", "load", "scale", "instances", "philly", "analysis")
"""Parts of RESULTS.md, in order: one per section, then the hand-written analysis."""
SCALE = {64: 24.0, 128: 24.0, 256: 12.0, 512: 6.0, 2048: 2.0}
"""GPUs -> arrival window in hours (shorter at large sizes to bound run time)."""


def _run(label: str, exp: Experiment, policies: tuple[str, ...], jobs: int) -> dict[str, RunResult]:
    bar = ProgressBar(label)
    t0 = time.time()
    res = run_experiment(exp, policies, workers=jobs, on_progress=bar.update)
    bar.update({n: (1, 1) for n in policies}, force=True)
    bar.close()
    print(f"  {label}: {time.time() - t0:.0f}s wall", file=sys.stderr)
    return res


def _check(results: dict[str, RunResult]) -> list[str]:
    notes = []
    for name, r in results.items():
        if r.anomalies or r.capacity_violations:
            notes.append(
                f"- {name}: {len(r.anomalies)} anomalies, {len(r.capacity_violations)} "
                f"capacity violations, e.g. {(r.anomalies or r.capacity_violations)[:2]}"
            )
    return notes


def save_runs(results: dict[str, RunResult], where: Path, title: str | None = None) -> None:
    """A run's CSVs (and, given a title, its plots) under ``where``, renamed into place
    together once all are written (``_results``): an interrupted or failed write leaves
    the folder as an earlier run left it."""
    _results.folder(where)
    with _results.results() as staged:
        write_run_files(results, where, place=staged.path)
        if title is not None:
            plot_all(results, where, title=title, place=staged.path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="main,load,scale,instances,philly")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--epoch", type=positive_float, default=60.0)
    ap.add_argument(
        "--sizes",
        default=",".join(str(g) for g in SCALE),
        help="scale section: cluster sizes to run (each with its window from SCALE)",
    )
    ap.add_argument(
        "--load-hours", type=positive_float, default=24.0, help="load section: arrival window (h)"
    )
    args = ap.parse_args(argv)
    unknown = set(args.only.split(",")) - {*PARTS[:-1], "collect"}
    if unknown:
        known = ", ".join([*PARTS[:-1], "collect"])
        ap.error(f"--only: no section {', '.join(sorted(unknown))}; known: {known}")
    try:
        scale_windows = {int(g): SCALE[int(g)] for g in args.sizes.split(",")}
    except (ValueError, KeyError):
        ap.error(f"--sizes {args.sizes!r}: comma-separated sizes of {', '.join(map(str, SCALE))}")
    words = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["PYTHONPATH=. python benchmarks/sim_eval.py", *words])
    made_by = f"Made by `{command}`.\n"
    runs: dict[tuple[int, float, float], dict[str, RunResult]] = {}

    def sweep_point(label: str, gpus: int, load: float, hours: float) -> dict[str, RunResult]:
        """COMPARE on the synthetic trace at one point; a point both sweeps share runs once."""
        key = (gpus, load, hours)
        if key not in runs:
            trace = synthetic(gpus, load, hours * 3600, seed)
            exp = Experiment(tuple(trace), ClusterSpec(gpus=gpus), seed, ep)
            runs[key] = _run(label, exp, COMPARE, args.jobs)
        return runs[key]

    only = set(args.only.split(","))
    # a smoke run never writes into the tracked results: a fresh temporary directory
    out = Path(tempfile.mkdtemp(prefix="sim_eval_quick_")) if args.quick else OUT
    if args.quick:
        print(f"quick run: results under {out}", file=sys.stderr)
    _results.folder(out)
    report: list[str] = [
        "# Simulation results (regenerate: `PYTHONPATH=. python benchmarks/sim_eval.py`)\n",
        f"seed={args.seed}, epoch={args.epoch:g}s, quick={args.quick}\n",
    ]
    seed, ep = args.seed, args.epoch

    def collect(done: dict[str, str] | None = None) -> None:
        """RESULTS.md from every part there is (``analysis.md`` is written by hand), with
        the parts in ``done`` (section -> text) written beside it: renamed into place
        together, so RESULTS.md never holds a part its own file does not."""
        done = done or {}
        parts = [
            done[sec] if sec in done else (out / f"{sec}.md").read_text()
            for sec in PARTS
            if sec in done or (out / f"{sec}.md").exists()
        ]
        with _results.results() as staged:
            for sec, text in done.items():
                staged.text(out / f"{sec}.md", text)
            staged.text(out / "RESULTS.md", "\n".join([*report[:2], *parts]) + "\n")

    def finish(section: str, mark: int) -> None:
        """Write a section's Markdown as soon as it is done, and RESULTS.md from all parts."""
        collect({section: "\n".join(report[mark:]) + "\n"})

    if "collect" in only:
        collect()

    main_gpus, main_hours = (16, 4.0) if args.quick else (64, 24.0)

    if "main" in only:
        mark = len(report)
        trace = synthetic(main_gpus, 1.0, main_hours * 3600, seed)
        exp = Experiment(tuple(trace), ClusterSpec(gpus=main_gpus), seed, ep)
        res = _run(f"main {main_gpus} GPUs", exp, MAIN_POLICIES, args.jobs)
        summ = summaries(res)
        save_runs(res, out / "main", title=f"({main_gpus} GPUs)")
        report += [
            f"## Main results: {main_gpus} GPUs, {len(trace)} jobs, {main_hours:g} h, "
            f"load {offered_load(trace, main_gpus, main_hours * 3600):.2f}\n",
            made_by,
            main_table(summ),
            "\n## Ablation (normalised to full elastico)\n",
            ablation_table({k: v for k, v in summ.items() if "+" not in k}),
            "\n## Ablation with the closed loop (normalised to elastico+online)\n",
            ablation_table(
                {k: v for k, v in summ.items() if k.endswith("+online") and k.count("+") == 1},
                full="elastico+online",
            ),
            "\nWith the spec-accuracy predictor:\n",
            ablation_table({"elastico": summ["elastico+iac"]}),
            "\nWith the predictor learned from a stratified 25% of the workload pairs:\n",
            ablation_table({"elastico": summ["elastico+learned"]}),
            *_check(res),
            "",
        ]

        finish("main", mark)

    if "load" in only:
        mark = len(report)
        gpus, hours = (16, 4.0) if args.quick else (128, args.load_hours)
        points = []
        for load in (0.5, 1.0, 1.5):
            res = sweep_point(f"load {load:.0%} {gpus} GPUs", gpus, load, hours)
            points.append((load, summaries(res)))
            save_runs(res, out / f"load_{int(load * 100)}")
            report += _check(res)
        report += [
            f"\n## Load sensitivity ({gpus} GPUs, {hours:g} h arrival window, seed {seed})\n",
            made_by,
            load_table(points, COMPARE),
            "",
        ]

        finish("load", mark)

    if "scale" in only:
        mark = len(report)
        sizes = {16: 4.0, 32: 2.0} if args.quick else scale_windows
        sizes_done = []
        notes: list[str] = []
        for gpus, hours in sizes.items():
            res = sweep_point(f"scale {gpus} GPUs ({hours:g} h)", gpus, 1.0, hours)
            sizes_done.append((gpus, summaries(res)))
            save_runs(res, out / f"scale_{gpus}")
            notes += _check(res)
            # Rewritten after every size, so the sizes done so far survive an interrupted run.
            done = dict(sizes_done)
            windows = ", ".join(f"{h:g} h at {g:,}" for g, h in sizes.items() if g in done)
            report[mark:] = [
                *notes,
                f"\n## Scalability (load 1.0, seed {seed}; arrival window {windows} GPUs)\n",
                made_by,
                scalability_table(sizes_done, COMPARE),
                "",
            ]
            finish("scale", mark)

    if "instances" in only:
        mark = len(report)
        trace = synthetic(64, 1.0, 24 * 3600, seed + 1)
        mixes = {
            "64 single-GPU jobs": [j for j in trace if j.gpus == 1][:64],
            "48 jobs, mixed gangs <= 8": [j for j in trace if j.gpus <= 8][:48],
        }
        configs = ConfigTable.build(seed)
        truth = GroundTruth.build(configs)
        exp = Experiment(tuple(trace), ClusterSpec(gpus=64), seed, ep)
        rows = ["| Policy | " + " | ".join(mixes) + " |", "|---|" + "---|" * len(mixes)]
        # srtf orders a queue by true remaining time; starting a whole mix at once has
        # no queue, and its plan needs durations this question does not bind.
        for name in (*(p for p in COMPARE if p != "srtf"), "elastico-no-rst"):
            cells = []
            for mix in mixes.values():
                need = instances_needed(build_policy(name, exp, truth), mix, configs)
                cells.append(str(need))
            rows.append(f"| {name} | " + " | ".join(cells) + " |")
        report += [
            "\n## GPU instances needed to start a mix at once\n",
            made_by,
            "\n".join(rows),
            "",
        ]

        finish("instances", mark)

    if "philly" in only:
        mark = len(report)
        vc, gpus = "ed69ec", 64
        raw = fit_to_cluster(load_philly(vc, seed=seed), gpus)
        if args.quick:
            raw = raw[:40]
        native = offered_load(raw, gpus)
        trace = scale_arrivals(raw, 1.0 / native)
        exp = Experiment(tuple(trace), ClusterSpec(gpus=gpus), seed, ep)
        res = _run(f"philly {vc}", exp, COMPARE, args.jobs)
        summ = summaries(res)
        save_runs(res, out / "philly", title=f"(Philly {vc}, {gpus} GPUs)")
        report += [
            f"\n## Philly VC {vc} ({gpus} GPUs, {len(trace)} jobs; real GPU counts, durations "
            f"clipped at 48 h, arrival order and gaps compressed x{1 / native:.1f} from the "
            f"native load {native:.2f} to load 1.0)\n",
            made_by,
            main_table(summ),
            *_check(res),
            "",
        ]

        finish("philly", mark)

    print("\n".join(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
