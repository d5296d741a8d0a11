"""ElastiCo against its peers on real Philly weeks and at scale, in both worlds (issue 14).

Command (from the repository root; one command regenerates every table)::

    PYTHONPATH=. nice -n 5 python benchmarks/peers_eval.py --jobs 1
    PYTHONPATH=. python benchmarks/peers_eval.py --only philly --worlds benchmark
    PYTHONPATH=. python benchmarks/peers_eval.py --only scale --sizes 64,256
    PYTHONPATH=. python benchmarks/peers_eval.py --only collect     # tables from saved parts

Sections (results under ``benchmarks/results/peers/``, tables in ``PEERS.md``):

* ``philly``: five Philly virtual clusters (``PHILLY``), each over its busiest week, replayed at
  its **native** load (recorded arrivals, no compression) on two cluster sizes,
  every baseline -- volcano (FIFO, whole GPUs), lucid, tiresias (2D-LAS), srtf
  (ORACLE durations) -- and elastico, elastico+learned, in the benchmark and
  the production world.  Jobs that finished before the week are the history the
  duration estimators start from (``--days``).  Durations clipped at 48 h and 30%
  of one-GPU jobs turned into LLM inference, as printed by ``elastico simulate``.
* ``alibaba``: a week of Alibaba's GPU-sharing pod list (``ALIBABA_WEEK``; the file is not
  shipped: ``--alibaba PATH``, default under ``ELASTICO_DATA_DIR``) at its native load on
  two sizes, the same policies as ``scale``, in both worlds.
* ``scale``: synthetic mix at load 1.5 on 64 .. 2,048 GPUs (windows shrink with
  size, see SCALE), every baseline and elastico, in both worlds.  ``--hours H``
  gives every size one window (saved as ``scale_<gpus>_<world>_<H>h``): only a
  window long enough to build a backlog measures scheduling at a large size.

Each policy's summary is saved as JSON as soon as it finishes, beside the policies
the row saved before (``--policies P`` re-runs P and keeps the others); ``--resume``
runs only the policies not yet saved, so an interrupted run loses nothing.  A policy run
past ``--policy-timeout`` seconds is stopped and reported as such.  The saved set was
produced in passes, cheap policies first, on a 2-core machine shared with 6 jobs::

    P="PYTHONPATH=. nice -n 5 python benchmarks/peers_eval.py"
    $P --only philly --no-learned --resume
    $P --only scale --worlds benchmark --resume --policy-timeout 180
    $P --only scale --worlds production --sizes 64,128,256 --resume --policy-timeout 180
    $P --only philly --resume --policy-timeout 300          # adds elastico+learned
    $P --only philly --vcs 6c71a0,ee9e8c --no-learned --resume --policy-timeout 2400

Session 26 (band preemption on by default) re-ran the two ElastiCo columns of every row::

    E="--policies elastico+online,elastico"
    $P --only philly $E
    $P --only scale --worlds production --sizes 64,128,256 $E
    $P --only scale --worlds benchmark $E --policy-timeout 1500
    $P --only scale --worlds benchmark --sizes 512,1024 --hours 24 $E --policy-timeout 2400

Session 27 (the observation book's mean reference, harm cases kept through a partner's
restart) and session 28 (mixed windows teach nothing) re-ran the one column that reads
observations::

    E="--policies elastico+online"
    $P --only philly $E
    $P --only scale --worlds production --sizes 64,128,256 $E
    $P --only scale --worlds benchmark $E --policy-timeout 1500
    $P --only scale --worlds benchmark --sizes 512,1024 --hours 24 $E --policy-timeout 2400
    $P --only collect

Session 33 re-ran that column on session 32's tree (the correction's neighbours first)::

    $P --only philly --vcs 6214e9,ee9e8c $E --policy-timeout 2400
    $P --only philly --vcs 0e4a51,11cb48,6c71a0 $E --policy-timeout 2400
    $P --only scale --worlds production --sizes 64,128,256 $E
    $P --only scale --worlds benchmark $E --policy-timeout 1500
    $P --only scale --worlds benchmark --sizes 512,1024 --hours 24 $E --policy-timeout 2400
    $P --only collect

Session 35 added the Alibaba rows (the pod list under ``ELASTICO_DATA_DIR``)::

    ELASTICO_DATA_DIR=DIR $P --only alibaba,collect
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import multiprocessing.queues
import sys
import time
from pathlib import Path
from queue import Empty

import _results
from _args import comma_list, positive_float, positive_int

from elastico_extender.sim.bounds import JctFloors, jct_floors
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import (
    Experiment,
    configs_of,
    parse_policy_name,
    run_experiment,
)
from elastico_extender.sim.traces import (
    TraceLoad,
    days_window,
    default_data_dir,
    fit_to_cluster,
    offered_load,
    philly_trace,
    read_trace,
    synthetic,
)

OUT = Path(__file__).with_name("results") / "peers"
BASELINES = ("volcano", "lucid", "tiresias", "srtf")
SHARE_BASELINES = (*BASELINES, "hami")
"""Where the trace declares GPU shares (the Alibaba rows), HAMi's packing of them too; on
the other traces it would place exactly as volcano."""
ELASTICO = ("elastico", "elastico+online", "elastico+learned", "elastico+learned+online")
SHIPPED = "elastico+online"
"""What the extender runs (it always closes the loop): the column compared with the baselines."""
PHILLY: tuple[tuple[str, tuple[float, float], tuple[int, int]], ...] = (
    ("6214e9", (41.0, 48.0), (144, 96)),
    ("11cb48", (77.0, 84.0), (128, 96)),
    ("0e4a51", (19.0, 26.0), (256, 160)),
    ("6c71a0", (11.0, 18.0), (192, 128)),
    ("ee9e8c", (35.0, 42.0), (448, 304)),
)
"""(VC, its busiest week in days, two cluster sizes: native load about 0.6 and 0.9).
Every VC of the trace whose busiest week (the 7 days with the most GPU-time arriving)
holds at least 250 jobs; the sizes are that week's GPU-time over 0.6 and 0.9 of the
week, rounded to a multiple of 16."""
ALIBABA_FILE = "openb_pod_list_default.csv"
ALIBABA_WEEK = (129.0, 136.0)
ALIBABA_SIZES = (28, 20)
"""Alibaba's GPU-sharing pod list (``alibaba/clusterdata``, ``cluster-trace-gpu-v2023``; not
shipped: ``--alibaba PATH``): a week of its busy last month, days since its first pod,
with 2,212 earlier completions as history, and two sizes for a native load of about 0.6
and 0.9 as for Philly (that week's GPU-time over 0.6 and 0.9 of it, to a multiple of 4:
the sample of 8,152 pods is far smaller than the 6,212-GPU cluster it ran on)."""
SCALE = {64: 24.0, 128: 24.0, 256: 12.0, 512: 6.0, 1024: 3.0, 2048: 2.0}
"""GPUs -> arrival window in hours at load 1.5 (shorter at large sizes to bound run time)."""
WORLDS = ("benchmark", "production")
SECTIONS = ("philly", "alibaba", "scale", "collect")


def _save(path: Path, meta: dict[str, object], summ: dict[str, dict[str, float]]) -> None:
    _results.folder(path.parent)
    _results.write_text(path, json.dumps({"meta": meta, "summary": summ}, indent=1, sort_keys=True))


LIMIT = {"policy_s": 3600.0}
"""Wall-clock limit per policy run (``--policy-timeout``); a run past it is reported as such."""


def _one(exp: Experiment, name: str, queue: mp.queues.Queue) -> None:
    r = run_experiment(exp, [name], workers=1)[name]
    queue.put((summarise(r), r.wall_s))


def _bounded(exp: Experiment, name: str, limit: float) -> tuple[dict[str, float], float] | None:
    """One policy's summary and wall time, or None if it ran past ``limit`` seconds.

    A run that fails ends the command (SystemExit naming the policy; its traceback is
    on stderr): it is not waited out as if it were slow, nor saved as stopped."""
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    proc = ctx.Process(target=_one, args=(exp, name, queue))
    proc.start()
    deadline = time.monotonic() + limit
    result: tuple[dict[str, float], float] | None = None
    while result is None and time.monotonic() < deadline:
        try:
            result = queue.get(timeout=min(1.0, max(0.0, deadline - time.monotonic())))
        except Empty:
            if not proc.is_alive() and queue.empty():
                proc.join()
                raise SystemExit(f"peers_eval: {name} failed (exit code {proc.exitcode})") from None
    proc.join(timeout=5)
    if proc.is_alive():
        proc.terminate()
        proc.join()
    return result


def _run(
    key: str, exp: Experiment, policies: tuple[str, ...], meta: dict[str, object], resume: bool
) -> None:
    """Run ``policies`` on ``exp`` into the row saved as ``key`` (another seed's row is
    another file: one row never holds two traces)."""
    if exp.seed:
        key += f"_seed{exp.seed}"
    meta = {**meta, "seed": exp.seed}
    path = OUT / f"{key}.json"
    t0 = time.time()
    summ: dict[str, dict[str, float]] = {}
    walls: dict[str, float] = {}
    if path.exists():  # keep what was saved: the policies not run now stay in the row
        saved = json.loads(path.read_text())
        summ, walls = saved["summary"], saved["meta"].get("wall_s", {})
    if resume:  # run only the missing policies
        policies = tuple(n for n in policies if n not in summ)
    for name in policies:  # one at a time: the partial file is useful if stopped
        limit = LIMIT["policy_s"]
        got = _bounded(exp, name, limit)
        if got is None:
            summ[name] = {"timed_out_s": limit}
            walls[name] = limit
            print(f"  {key} {name}: stopped after {limit:.0f}s", file=sys.stderr)
        else:
            summ[name], walls[name] = got
            print(f"  {key} {name}: {walls[name]:.0f}s", file=sys.stderr)
        _save(path, {**meta, "wall_s": walls, "complete": False}, summ)
    _save(path, {**meta, "wall_s": walls, "complete": True}, summ)
    print(f"  {key}: {time.time() - t0:.0f}s", file=sys.stderr)


def week_experiment(loaded: TraceLoad, gpus: int, world: str, seed: int) -> Experiment:
    """One trace row's experiment: the week's jobs fitted to ``gpus``, in ``world``."""
    return Experiment(
        trace=tuple(fit_to_cluster(loaded.jobs, gpus)),
        cluster=ClusterSpec(gpus=gpus),
        seed=seed,
        world=world,
        history=loaded.history,
    )


def alibaba_week(path: Path, seed: int) -> TraceLoad:
    """The Alibaba row's week (``ALIBABA_WEEK``) of the pod list at ``path``, with the notes
    of what reading the file and cutting the week did."""
    return days_window(read_trace(path, seed), ALIBABA_WEEK)


def row_floors(meta: dict[str, object], alibaba: Path) -> JctFloors | None:
    """The average-JCT floors (``sim.bounds``) of a saved trace row, of the seed it ran;
    None for an Alibaba row when the pod list is not at ``alibaba`` (``--alibaba``: rows
    save the file's name only, no local path)."""
    days = meta["days"]
    assert isinstance(days, list)
    seed = int(str(meta.get("seed", 0)))
    if meta["section"] == "alibaba":
        if not alibaba.is_file():
            return None
        loaded = alibaba_week(alibaba, seed)
    else:
        loaded = philly_trace(str(meta["vc"]), seed=seed, days=(float(days[0]), float(days[1])))
    exp = week_experiment(loaded, int(str(meta["gpus"])), str(meta["world"]), seed)
    return jct_floors(exp.trace, configs_of(exp))


def philly(
    worlds: tuple[str, ...],
    policies: tuple[str, ...],
    seed: int,
    resume: bool,
    vcs: tuple[str, ...] = (),
) -> None:
    for world in worlds:
        for vc, days, sizes in PHILLY:
            if vcs and vc not in vcs:
                continue
            loaded = philly_trace(vc, seed=seed, days=days)
            for gpus in sizes:
                exp = week_experiment(loaded, gpus, world, seed)
                jobs = list(exp.trace)
                span = max(j.arrival_s for j in jobs)
                meta = {
                    "section": "philly",
                    "vc": vc,
                    "days": list(days),
                    "gpus": gpus,
                    "world": world,
                    "jobs": len(jobs),
                    "load": offered_load(jobs, gpus, span),
                    "notes": list(loaded.notes),
                }
                _run(row_stem(vc, gpus, world), exp, policies, meta, resume)


def alibaba(
    worlds: tuple[str, ...], policies: tuple[str, ...], seed: int, resume: bool, path: Path
) -> None:
    """The Alibaba rows: ``ALIBABA_WEEK`` of the pod list at ``path`` on ``ALIBABA_SIZES``."""
    loaded = alibaba_week(path, seed)
    for world in worlds:
        for gpus in ALIBABA_SIZES:
            exp = week_experiment(loaded, gpus, world, seed)
            jobs = list(exp.trace)
            meta = {
                "section": "alibaba",
                "file": path.name,
                "days": list(ALIBABA_WEEK),
                "gpus": gpus,
                "world": world,
                "jobs": len(jobs),
                "load": offered_load(jobs, gpus, max(j.arrival_s for j in jobs)),
                "notes": list(loaded.notes),
            }
            _run(f"alibaba_{gpus}_{world}", exp, policies, meta, resume)


def row_stem(vc: str | None, gpus: int, world: str) -> str:
    """A row's file stem under ``OUT``: a Philly VC's (``vc``) or, for None, a scale row's
    (before any ``--hours`` suffix)."""
    return f"scale_{gpus}_{world}" if vc is None else f"philly_{vc}_{gpus}_{world}"


def scale_experiment(gpus: int, hours: float, world: str, seed: int) -> Experiment:
    """One scale row's experiment: the synthetic mix at load 1.5 over ``hours``."""
    jobs = synthetic(gpus, 1.5, hours * 3600.0, seed)
    return Experiment(trace=tuple(jobs), cluster=ClusterSpec(gpus=gpus), seed=seed, world=world)


def scale(
    worlds: tuple[str, ...],
    sizes: list[int],
    policies: tuple[str, ...],
    seed: int,
    resume: bool,
    hours_override: float | None = None,
) -> None:
    """The scale rows; ``hours_override`` replaces every size's window in ``SCALE`` (a
    sustained backlog at every size), saved beside the trimmed rows."""
    for world in worlds:
        for gpus in sizes:
            hours = hours_override or SCALE.get(gpus, 2.0)
            tag = row_stem(None, gpus, world)
            if hours != SCALE.get(gpus, 2.0):
                tag += f"_{hours:g}h"
            exp = scale_experiment(gpus, hours, world, seed)
            jobs = list(exp.trace)
            meta = {
                "section": "scale",
                "gpus": gpus,
                "hours": hours,
                "world": world,
                "jobs": len(jobs),
                "load": offered_load(jobs, gpus, hours * 3600.0),
            }
            _run(tag, exp, policies, meta, resume)


def _cell(s: dict[str, dict[str, float]], name: str, base: float) -> str:
    if name not in s:
        return ""
    if "timed_out_s" in s[name]:
        return f"stopped at {s[name]['timed_out_s'] / 60:.0f} min"
    return _x(s[name]["avg_jct_s"], base)


def _x(a: float, b: float) -> str:
    return f"{a / b:.2f}x" if b and math.isfinite(a) and math.isfinite(b) else "n/a"


def collect(command: str, alibaba: Path) -> str:
    """PEERS.md from every saved experiment (partial ones marked)."""
    parts = [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]
    lines = [
        "# ElastiCo vs. peers (issue 14): Philly and Alibaba weeks at native load, and scale "
        "at load 1.5",
        "",
        f"Last command: `{command}`.  The saved set came from the passes listed in "
        "`benchmarks/peers_eval.py`'s docstring (cheap policies first, per-policy time limit); "
        "`--only collect` rebuilds this file from the saved JSON.",
        "",
        "Avg JCT normalised to volcano (FIFO, whole GPUs) of the same run; `srtf` knows every",
        "job's true remaining time (ORACLE). p99 JCT and worst queueing delay in hours.",
        f"`{SHIPPED}` is what the extender runs (it always closes the loop on observations);",
        "`elastico` is the same planner open-loop.  Where a row lacks it, `elastico` stands in.",
        "Philly and Alibaba rows, last two columns: the average JCT no scheduler can beat",
        "(every job started on arrival, alone, at its default / its fastest configuration:",
        "`elastico_extender/sim/bounds.py`), and issue 14's target (0.9x the best baseline where",
        "one beats FIFO by 10%), both relative to volcano; a target below the fastest floor is",
        "out of every scheduler's reach.",
        "",
    ]
    for section in ("philly", "alibaba", "scale"):
        rows = [p for p in parts if p["meta"]["section"] == section]
        if not rows:
            continue
        names = [n for n in (*SHARE_BASELINES, *ELASTICO) if any(n in p["summary"] for p in rows)]
        floors = section != "scale"  # the JCT floors and issue 14's target per row
        head = [
            "world",
            "cluster",
            "GPUs",
            "jobs",
            "load",
            *names,
            f"p99 JCT h (volcano/best base/{SHIPPED})",
            f"worst queue h (volcano/{SHIPPED})",
            f"{SHIPPED} vs best baseline",
            *(["floor: default / fastest", "target"] if floors else []),
        ]
        lines += [f"## {section}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        rows.sort(
            key=lambda p: (
                p["meta"]["world"],
                str(p["meta"].get("vc", "")),
                -int(p["meta"]["gpus"]),
            )
        )
        for p in rows:
            m, s = p["meta"], p["summary"]
            base = s.get("volcano", {}).get("avg_jct_s", float("nan"))
            cells = [_cell(s, n, base) for n in names]
            s = {n: v for n, v in s.items() if "timed_out_s" not in v}
            others = [n for n in SHARE_BASELINES if n in s and n != "volcano"]
            best = min(others, key=lambda n: s[n]["avg_jct_s"]) if others else None
            ours = SHIPPED if SHIPPED in s else "elastico"
            el = s.get(ours)
            p99 = "/".join(
                f"{s[n]['p99_jct_s'] / 3600:.1f}" if n and n in s else "-"
                for n in ("volcano", best, ours)
            )
            worst = "/".join(
                f"{s[n]['max_queue_s'] / 3600:.1f}" if n in s else "-" for n in ("volcano", ours)
            )
            vs = f"{el['avg_jct_s'] / s[best]['avg_jct_s']:.2f}x of {best}" if el and best else "-"
            extra = _floor_cells(m, s, best, base, alibaba) if floors else []
            tag = "" if m.get("complete", True) else " (partial)"
            label = "pods" if section == "alibaba" else m.get("vc", "synthetic")
            cluster = f"{label}" + (
                f" d{m['days'][0]:g}-{m['days'][1]:g}" if "days" in m else f" {m['hours']:g}h"
            )
            lines.append(
                "| "
                + " | ".join(
                    [
                        m["world"] + tag,
                        cluster,
                        str(m["gpus"]),
                        str(m["jobs"]),
                        f"{m['load']:.2f}",
                        *cells,
                        p99,
                        worst,
                        vs,
                        *extra,
                    ]
                )
                + " |"
            )
        lines.append("")
        if section == "scale":
            lines += [
                "Throughput and SM utilisation at scale (throughput normalised to volcano):",
                "",
                "| world | GPUs | " + " | ".join(f"{n} tput / SM%" for n in names) + " |",
                "|" + "---|" * (2 + len(names)),
            ]
            for p in rows:
                m, s = p["meta"], p["summary"]
                b = s.get("volcano", {}).get("throughput", float("nan"))
                cells = [
                    f"{_x(s[n]['throughput'], b)} / {s[n]['sm_util']:.0f}"
                    if n in s and "timed_out_s" not in s[n]
                    else _cell(s, n, b)
                    for n in names
                ]
                lines.append(f"| {m['world']} | {m['gpus']} | " + " | ".join(cells) + " |")
            lines.append("")
        walls = {n: sum(p["meta"].get("wall_s", {}).get(n, 0.0) for p in rows) for n in names}
        lines.append(
            "Simulation wall time (s, all rows): "
            + ", ".join(f"{n} {w:.0f}" for n, w in walls.items())
        )
        lines.append("")
    text = "\n".join(lines)
    _results.write_text(OUT / "PEERS.md", text + "\n")
    return text


TARGET_MARGIN = 0.9
"""Issue 14: where a baseline beats FIFO by 10% or more, ElastiCo must beat every
baseline by 10%: a target of 0.9x the best baseline's average JCT."""


def _floor_cells(
    meta: dict[str, object],
    summary: dict[str, dict[str, float]],
    best: str | None,
    base: float,
    alibaba: Path,
) -> list[str]:
    """A trace row's JCT floors (``sim.bounds``) and target, both relative to volcano;
    the target is marked out of reach when it lies below the fastest floor."""
    floors = row_floors(meta, alibaba)
    if floors is None:
        return ["-", "-"]
    cells = [f"{floors.default_s / base:.3f} / {floors.fastest_s / base:.3f}"]
    ratio = summary[best]["avg_jct_s"] / base if best else math.nan
    if not ratio <= TARGET_MARGIN:
        return [*cells, "-"]
    target = TARGET_MARGIN * ratio
    reach = " (below the floor: no scheduler)" if target < floors.fastest_s / base else ""
    return [*cells, f"{target:.3f}{reach}"]


def world_name(text: str) -> str:
    """A ``--worlds`` item: one of WORLDS."""
    if text not in WORLDS:
        raise argparse.ArgumentTypeError(f"no world {text!r}; known: {', '.join(WORLDS)}")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="philly,scale,collect")
    ap.add_argument("--worlds", type=comma_list(world_name), default=",".join(WORLDS))
    ap.add_argument(
        "--sizes", type=comma_list(positive_int), default=",".join(str(g) for g in SCALE)
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--hours",
        type=positive_float,
        help="scale: one arrival window for every size (default: SCALE)",
    )
    ap.add_argument("--jobs", type=int, default=1, help="kept for symmetry; runs are serial")
    ap.add_argument("--no-learned", action="store_true", help="skip elastico+learned(+online)")
    ap.add_argument("--policies", help="comma list replacing every policy run (baselines too)")
    ap.add_argument("--resume", action="store_true", help="run only policies not yet saved")
    ap.add_argument("--vcs", default="", help="comma list of Philly VCs to run (default: all)")
    ap.add_argument(
        "--alibaba",
        type=Path,
        default=default_data_dir() / ALIBABA_FILE,
        help=f"Alibaba's {ALIBABA_FILE} (default: under ELASTICO_DATA_DIR)",
    )
    ap.add_argument(
        "--policy-timeout",
        type=positive_float,
        default=LIMIT["policy_s"],
        help="seconds per policy run",
    )
    args = ap.parse_args(argv)
    LIMIT["policy_s"] = args.policy_timeout
    only = set(args.only.split(","))
    if only - set(SECTIONS):
        unknown = ", ".join(sorted(only - set(SECTIONS)))
        ap.error(f"--only: no section {unknown}; known: {', '.join(SECTIONS)}")
    vcs = tuple(v for v in args.vcs.split(",") if v)
    known_vcs = [vc for vc, _, _ in PHILLY]
    if set(vcs) - set(known_vcs):
        unknown = ", ".join(sorted(set(vcs) - set(known_vcs)))
        ap.error(f"--vcs: no Philly row for {unknown}; known: {', '.join(known_vcs)}")
    worlds = tuple(args.worlds)
    elastico = tuple(n for n in ELASTICO if not (args.no_learned and "learned" in n))
    chosen = tuple(args.policies.split(",")) if args.policies else None
    for name in chosen or ():
        try:
            parse_policy_name(name)
        except ValueError as exc:
            ap.error(f"--policies: {exc}")
    command = "PYTHONPATH=. nice -n 5 python benchmarks/peers_eval.py " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    _results.folder(OUT)
    if "philly" in only:
        philly(worlds, chosen or (*BASELINES, *elastico), args.seed, args.resume, vcs)
    if "alibaba" in only:
        if not args.alibaba.is_file():
            ap.error(f"--alibaba: no file {args.alibaba} (alibaba/clusterdata, {ALIBABA_FILE})")
        policies = chosen or (*SHARE_BASELINES, "elastico", SHIPPED)
        alibaba(worlds, policies, args.seed, args.resume, args.alibaba)
    if "scale" in only:
        policies = chosen or (*BASELINES, "elastico", SHIPPED)
        scale(worlds, args.sizes, policies, args.seed, args.resume, args.hours)
    print(collect(command, args.alibaba))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
