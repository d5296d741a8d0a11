"""Run several policies on the same trace, cluster and seed (in parallel processes).

Policy names are registry names (``volcano``, ``lucid``, ``elastico``,
``elastico-no-rst`` ...).  Appending ``+learned`` to an ElastiCo name plans with a
:class:`SampledPairsPredictor` (learned from a stratified 25% of the workload pairs,
the spec's profiling protocol); appending ``+iac`` plans with the
:class:`NoisyTablePredictor` (spec-accuracy IAC, 7.6% MAPE against the ground
truth) instead of the core's default ContentionPredictor; ``+truth`` plans with the
ground truth itself (:class:`NoisyTablePredictor` without noise): an ORACLE, the
ceiling of what any knowledge of interference (a better model, or the closed loop's
learning) can buy the planner.

Appending ``+online`` (alone or after ``+learned``/``+iac``) closes the loop
(issue 11): the simulator reports observation windows (ground truth plus
measurement noise) to a :class:`ClosedLoop` whose :class:`OnlineCorrection`
sits in front of the policy's predictor, and the planner separates pairs it
observes above tolerance.

The simulator learns every policy's duration estimates from the jobs it sees
complete plus ``Experiment.history`` (completions before the trace window):
ElastiCo reads them from the snapshot (``core.duration.DurationBook``), the
Lucid-like policy keeps its own ledger of the same completions, and
classifies jobs with the predictor learned from a sampled 25% of the workload
pairs, the profiling budget ElastiCo+learned gets.  ``srtf`` is bound to the
simulator's true remaining times: an ORACLE baseline, labelled as such.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

from elastico_extender.core.closed_loop import ClosedLoop
from elastico_extender.core.duration import CompletedJob
from elastico_extender.core.interference.online import OnlineCorrection
from elastico_extender.core.interference.predictor import ContentionPredictor, SlowdownPredictor
from elastico_extender.core.model import Plan, Snapshot
from elastico_extender.core.settings import PlannerSettings
from elastico_extender.policies import POLICIES, Policy, make_policy
from elastico_extender.sim.engine import ClusterSpec, RunResult, Simulator
from elastico_extender.sim.predictors import NoisyTablePredictor, SampledPairsPredictor
from elastico_extender.sim.production import DEFAULT_WORLD_FILE, ProductionTruth, ProductionWorld
from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.truth import DEFAULT_PAIRS, GroundTruth
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["DEFAULT_POLICIES", "Experiment", "build_policy", "configs_of", "run_experiment"]

DEFAULT_POLICIES: tuple[str, ...] = (
    "volcano",
    "lucid",
    "elastico",
    "elastico-no-rst",
    "elastico-no-esp",
    "elastico-no-iac",
    "elastico-no-pds",
)


@dataclass(frozen=True)
class Experiment:
    """One comparison: a trace on a cluster, the ground truth, the epoch length."""

    trace: tuple[TraceJob, ...]
    cluster: ClusterSpec
    seed: int = 0
    epoch_s: float = 60.0
    pairs: str | None = str(DEFAULT_PAIRS)
    profile_noise: float = 0.05
    interference: float = 1.0
    """True excess slowdowns times this (0: no interference; a what-if, see GroundTruth.scaled)."""
    gpu_type: str = "v100"
    """GPU type whose rows of the pair CSV are preferred (others fill gaps)."""
    world: str = "benchmark"
    """Ground-truth world: 'benchmark' (saturating jobs, Gavel pairs) or 'production'."""
    world_file: str | None = None
    """Parameters of the production world (None: the shipped sim/data/production_world.json)."""
    history: tuple[CompletedJob, ...] = ()
    """Jobs completed before the trace window (what a running cluster already knows)."""
    oracle_durations: bool = False
    """ORACLE diagnostic, never a result: the planner reads every job's true duration
    instead of the estimator's guess, to bound what length awareness could gain."""
    planner: PlannerSettings | None = None
    """Planner settings of every policy (ElastiCo's planner; the baselines read only the
    memory margin); None: the defaults, as the extender runs them."""


PREDICTOR_SUFFIXES = ("iac", "learned", "truth")
"""'+iac': a spec-accuracy predictor; '+learned': k-NN on 25% of the pairs; '+truth': the
exact slowdowns (ORACLE diagnostic)."""


def parse_policy_name(name: str) -> tuple[str, str | None, bool]:
    """'elastico+learned+online' -> ('elastico', 'learned', True); ValueError says why not."""
    base, *extras = name.split("+")
    if base not in POLICIES:
        raise ValueError(f"unknown policy {base!r}; known: {', '.join(sorted(POLICIES))}")
    online = extras[-1:] == ["online"]
    if online:
        extras = extras[:-1]
    if len(extras) > 1 or (extras and extras[0] not in PREDICTOR_SUFFIXES):
        known = ", ".join(f"+{s}" for s in PREDICTOR_SUFFIXES)
        raise ValueError(
            f"{name!r}: unknown suffix +{'+'.join(extras)} (known: {known}, "
            "each optionally followed by +online)"
        )
    if (extras or online) and not base.startswith("elastico"):
        raise ValueError(f"{name!r}: +{'+'.join(extras) or 'online'} only applies to ElastiCo")
    return base, (extras[0] if extras else None), online


def build_policy(name: str, exp: Experiment, truth: GroundTruth) -> Policy:
    base, suffix, online = parse_policy_name(name)
    kwargs: dict[str, object] = {}
    if base == "lucid":
        kwargs["predictor"] = SampledPairsPredictor(truth, seed=exp.seed)
        kwargs["history"] = exp.history
        if isinstance(truth, ProductionTruth):
            # Lucid's profiler measures each job alone; the k-NN learned on saturating
            # benchmark pairs cannot extrapolate to 1-20% activity, the transparent
            # contention model (monotone in activity) can: the stronger Lucid.
            kwargs["profiled"] = truth.solo_profile
            kwargs["predictor"] = ContentionPredictor()
    if base == "hami":  # the shares the trace declares: the only thing HAMi places by
        kwargs["shares"] = {j.job_id: j.gpu_share for j in exp.trace if j.gpu_share < 1.0}
    if exp.planner is not None:
        kwargs["settings"] = exp.planner
    predictor: SlowdownPredictor | None = None
    if suffix:
        if suffix == "learned":
            predictor = SampledPairsPredictor(truth, seed=exp.seed)
        elif suffix == "truth":  # the ORACLE: the ground truth, no error
            predictor = NoisyTablePredictor(truth, sigma=0.0, seed=exp.seed)
        else:  # "iac": the spec's accuracy
            predictor = NoisyTablePredictor(truth, seed=exp.seed)
        kwargs["predictor"] = predictor
    if online:
        correction = OnlineCorrection(predictor or ContentionPredictor())
        kwargs["loop"] = ClosedLoop(correction)
    policy = make_policy(base, **kwargs)
    policy.name = name
    return policy


def configs_of(exp: Experiment) -> ConfigTable:
    """The configurations (planner profiles and true throughputs) of ``exp``'s world."""
    return ConfigTable.build(exp.seed, exp.profile_noise)


def _world(exp: Experiment) -> tuple[ConfigTable, GroundTruth]:
    configs = configs_of(exp)
    truth = GroundTruth.build(configs, Path(exp.pairs) if exp.pairs else None, gpu=exp.gpu_type)
    if exp.world == "production":
        world = ProductionWorld.load(exp.world_file or DEFAULT_WORLD_FILE)
        truth = world.truth(truth, exp.trace, exp.seed)
    elif exp.world != "benchmark":
        raise ValueError(f"unknown world {exp.world!r}; known: benchmark, production")
    if exp.interference != 1.0:
        truth = truth.scaled(exp.interference)
    return configs, truth


def run_one(
    name: str,
    exp: Experiment,
    progress: Callable[[float, int, int], None] | None = None,
    planned: Callable[[Plan], None] | None = None,
) -> RunResult:
    """One policy over ``exp``; ``planned``, if given, sees every plan the policy makes."""
    configs, truth = _world(exp)
    policy = build_policy(name, exp, truth)
    if planned is not None:
        plan = policy.plan

        def watched(snapshot: Snapshot, previous: Plan | None = None) -> Plan:
            result = plan(snapshot, previous)
            planned(result)
            return result

        policy.plan = watched  # type: ignore[method-assign]
    sim = Simulator(
        list(exp.trace),
        policy,
        configs,
        truth,
        exp.cluster,
        epoch_s=exp.epoch_s,
        progress=progress,
        loop=getattr(policy, "loop", None),
        seed=exp.seed,
        history=exp.history,
        oracle_durations=exp.oracle_durations,
    )
    if getattr(policy, "oracle", False):
        policy.remaining = sim.remaining_solo_s  # type: ignore[attr-defined]
    return sim.run()


_QUEUE: object = None


def _init_worker(queue: object) -> None:
    global _QUEUE
    _QUEUE = queue


def _run_in_worker(name: str, exp: Experiment) -> RunResult:
    queue = _QUEUE
    last = [0.0]

    def report(now: float, done: int, total: int) -> None:
        t = time.monotonic()
        if queue is not None and (t - last[0] > 0.5 or done == total):
            last[0] = t
            queue.put((name, done, total))  # type: ignore[attr-defined]

    return run_one(name, exp, report)


def run_experiment(
    exp: Experiment,
    policies: Sequence[str] = DEFAULT_POLICIES,
    workers: int | None = None,
    on_progress: Callable[[dict[str, tuple[int, int]]], None] | None = None,
) -> dict[str, RunResult]:
    """Every policy on the same experiment; results keyed by policy name, in order.

    ``workers`` (default: as many as there are policies) is capped at one process per
    policy and per CPU: more would only fork processes with nothing to run, or share
    the CPUs they have."""
    names = list(dict.fromkeys(policies))
    workers = min(workers or len(names), len(names), os.cpu_count() or 1)
    state = {n: (0, len(exp.trace)) for n in names}
    if workers <= 1 or len(names) == 1:
        out = {}
        for n in names:

            def report(now: float, done: int, total: int, _n: str = n) -> None:
                state[_n] = (done, total)
                if on_progress:
                    on_progress(state)

            out[n] = run_one(n, exp, report)
        return out
    ctx = mp.get_context("fork")
    queue = ctx.Manager().Queue()
    results: dict[str, RunResult] = {}
    with ProcessPoolExecutor(
        max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(queue,)
    ) as pool:
        futures: dict[Future[RunResult], str] = {
            pool.submit(_run_in_worker, n, exp): n for n in names
        }
        pending = set(futures)
        while pending:
            done, pending = wait(pending, timeout=0.5, return_when=FIRST_COMPLETED)
            while not queue.empty():
                n, d, t = queue.get()
                state[n] = (d, t)
            for f in done:
                results[futures[f]] = f.result()
                state[futures[f]] = (len(exp.trace), len(exp.trace))
            if on_progress:
                on_progress(state)
    return {n: results[n] for n in names}
