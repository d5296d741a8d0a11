"""The production-like world: cited distributions, phases, and the reduction to Gavel's pairs."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from elastico_extender.sim.production import (
    DEFAULT_WORLD_FILE,
    MAX_WORLD_FILE_BYTES,
    ProductionWorld,
    demand_curve,
)
from elastico_extender.sim.traces import TraceJob, synthetic
from elastico_extender.sim.truth import DEFAULT_PAIRS, GroundTruth
from elastico_extender.sim.workloads import INFERENCE_WORKLOADS, ConfigTable

CONFIGS = ConfigTable.build(0, 0.0)
BENCH = GroundTruth.build(CONFIGS, DEFAULT_PAIRS)


def _world_truth(n: int = 4000, seed: int = 0):  # type: ignore[no-untyped-def]
    trace = synthetic(64, load=1.0, duration_s=n * 30.0, seed=seed)[:n]
    return trace, ProductionWorld.load().truth(BENCH, trace, seed)


def test_shipped_file_cites_a_source_for_every_figure() -> None:
    raw = json.loads(DEFAULT_WORLD_FILE.read_text())
    assert {"train_beta", "infer_beta", "train_idle_share", "demand"} <= set(raw["sources"])
    assert ProductionWorld.load() == ProductionWorld(sources=raw["sources"])


def test_solo_activity_matches_pai_means_and_shapes() -> None:
    _, truth = _world_truth()
    inf = truth.inference
    assert inf.any() and (~inf).any()
    train, infer = truth.solo_activity[~inf], truth.solo_activity[inf]
    assert train.mean() == pytest.approx(0.143, abs=0.02)  # PAI training mean
    assert (train < 0.5).mean() == pytest.approx(0.90, abs=0.03)  # ~90% below 50%
    assert infer.mean() == pytest.approx(0.064, abs=0.015)  # PAI inference mean
    assert np.median(infer) < 0.02 and (infer < 0.5).mean() > 0.95  # GenAI: median ~0


def test_inference_demand_is_as_bursty_as_the_serving_trace() -> None:
    world = ProductionWorld.load()
    curves = [demand_curve(world, 96 * 30, seed) for seed in range(6)]
    cv = np.mean([c.std() / c.mean() for c in curves])
    p95_p5 = np.mean([np.percentile(c, 95) / np.percentile(c, 5) for c in curves])
    assert cv == pytest.approx(0.87, abs=0.12)
    assert 50 < p95_p5 < 130
    assert all(c.mean() == pytest.approx(1.0) for c in curves)


def test_training_has_idle_stretches_with_the_same_lifetime_mean() -> None:
    _, truth = _world_truth(400)
    jobs = np.flatnonzero(~truth.inference)[:200]
    gids = np.zeros(jobs.size, dtype=np.intp)
    slots = np.array([truth.activity(jobs, gids, k * 900.0 + 1.0) for k in range(400)])
    idle = (slots == 0).mean()
    assert idle == pytest.approx(0.25, abs=0.03)
    unclipped = truth.solo_activity[jobs] < 0.75
    np.testing.assert_allclose(
        slots.mean(axis=0)[unclipped], truth.solo_activity[jobs][unclipped], rtol=0.2, atol=0.01
    )


def test_activity_asked_across_slots_in_any_order_never_reads_a_stale_slot() -> None:
    """Activities are computed once per slot for every job (the hot path of a production
    run): a query for another slot, or back to an earlier one, answers for its own slot,
    as a truth asked nothing before does."""
    _, truth = _world_truth(300)
    n = truth.solo_activity.size
    rng = np.random.default_rng(4)
    offsets = [10.0, 20.0, 950.0, 30.0, 5000.0, 5000.5, 940.0, 10.0]  # slots 0 0 1 0 5 5 1 0
    times = [truth.origin + x for x in offsets]
    for t in times:
        jobs = rng.choice(n, size=min(40, n), replace=False)
        gids = np.zeros(jobs.size, dtype=np.intp)
        fresh = replace(truth)  # same world and jobs, nothing cached
        np.testing.assert_array_equal(truth.activity(jobs, gids, t), fresh.activity(jobs, gids, t))
        np.testing.assert_array_equal(
            truth.occupancy(jobs, gids, t), fresh.occupancy(jobs, gids, t)
        )
    idle = [truth.activity(np.arange(n), np.zeros(n, dtype=np.intp), t) == 0 for t in times]
    assert not np.array_equal(idle[0], idle[2])  # the slots really differ


def test_slowdown_reduces_to_gavel_pairs_when_jobs_saturate() -> None:
    trace = [
        TraceJob("a", 0.0, 1, 3600.0, "lstm"),
        TraceJob("b", 1.0, 1, 3600.0, "ncf"),
    ]
    truth = ProductionWorld(train_idle_share=0.0).truth(BENCH, trace)
    truth = replace(truth, solo_activity=np.ones(2))
    g = np.array([CONFIGS.default_of("lstm"), CONFIGS.default_of("ncf")])
    assert BENCH.measured[g[0], g[1]]
    got = truth.device_slowdowns(g, np.array([0, 1]), 10.0)
    np.testing.assert_allclose(got, BENCH.device_slowdowns(g))


def test_slowdown_scales_with_both_jobs_activity_and_vanishes_when_one_idles() -> None:
    trace = [TraceJob("a", 0.0, 1, 3600.0, "lstm"), TraceJob("b", 1.0, 1, 3600.0, "lstm")]
    truth = ProductionWorld(train_idle_share=0.0).truth(BENCH, trace)
    g = np.array([CONFIGS.default_of("lstm")] * 2)
    full = BENCH.device_slowdowns(g)[0] - 1.0
    truth = replace(truth, dram_ratio=np.zeros(2), solo_activity=np.array([0.5, 0.4]))
    s = truth.device_slowdowns(g, np.array([0, 1]), 10.0)
    np.testing.assert_allclose(s - 1.0, 0.5 * 0.4 * full)
    truth = replace(truth, solo_activity=np.array([0.0, 1.0]))
    np.testing.assert_allclose(truth.device_slowdowns(g, np.array([0, 1]), 10.0), 1.0)


def test_memory_bandwidth_counts_as_occupancy() -> None:
    trace = [TraceJob("a", 0.0, 1, 3600.0, "lstm"), TraceJob("b", 1.0, 1, 3600.0, "lstm")]
    truth = ProductionWorld(train_idle_share=0.0).truth(BENCH, trace)
    g = np.array([CONFIGS.default_of("lstm")] * 2)
    truth = replace(truth, solo_activity=np.full(2, 0.2), dram_ratio=np.zeros(2))
    low = truth.device_slowdowns(g, np.array([0, 1]), 10.0)
    truth = replace(truth, dram_ratio=np.full(2, 4.0))  # memory-bound: the bus busy 80%
    high = truth.device_slowdowns(g, np.array([0, 1]), 10.0)
    assert (high > low).all()


def test_inference_activity_follows_the_demand_curve() -> None:
    trace = [TraceJob("q", 0.0, 1, 86400.0, INFERENCE_WORKLOADS[0])]
    truth = ProductionWorld().truth(BENCH, trace)
    truth = replace(truth, solo_activity=np.full(1, 0.05))
    acts = np.array([truth.activity(np.array([0]), np.array([0]), k * 900.0)[0] for k in range(96)])
    np.testing.assert_allclose(acts, np.minimum(1.0, 0.05 * truth.demand[:96]))
    assert truth.next_change(100.0) == pytest.approx(900.0)


@pytest.mark.parametrize(
    "content",
    [
        ('{"train_beta": [0.2]}', "train_beta"),
        ('{"train_beta": 5}', "train_beta"),
        ('{"train_beta": ["a", 1]}', "train_beta"),
        ('{"step_s": -1}', "step_s"),
        ('{"step_s": null}', "step_s"),
        ('{"step_s": "abc"}', "step_s"),
        ('{"step_s": true}', "step_s"),
        ('{"train_idle_share": false}', "train_idle_share"),
        ('{"sources": 5}', "sources"),
        ('{"bogus": 1}', "bogus"),
        ("[1, 2]", "JSON object"),
        ("not json", "cannot read"),
    ],
)
def test_bad_world_files_are_rejected(tmp_path: Path, content: tuple[str, str]) -> None:
    """A wrong type is named, not a TypeError traceback (null, a bare number, a string)."""
    text, named = content
    p = tmp_path / "w.json"
    p.write_text(text)
    with pytest.raises(ValueError, match=named) as caught:
        ProductionWorld.load(p)
    assert "could not convert" not in str(caught.value)


def test_world_is_chosen_by_the_experiment() -> None:
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.metrics import summarise
    from elastico_extender.sim.runner import Experiment, run_experiment

    trace = tuple(synthetic(8, load=1.0, duration_s=3 * 3600.0, seed=2))
    exp = Experiment(trace=trace, cluster=ClusterSpec(gpus=8), seed=2)
    bench = summarise(run_experiment(exp, ["volcano"], workers=1)["volcano"])
    prod = summarise(
        run_experiment(replace(exp, world="production"), ["volcano"], workers=1)["volcano"]
    )
    assert prod["sm_util"] < 0.6 * bench["sm_util"]  # production jobs idle most of the time
    assert prod["avg_jct_s"] == pytest.approx(bench["avg_jct_s"])  # no sharing: same JCT


@pytest.mark.parametrize(("activity", "idle_share"), [(0.2, 0.0), (0.7, 0.3), (0.7, 0.6)])
def test_harm_is_measured_on_the_slowdown_jobs_run_at(activity: float, idle_share: float) -> None:
    """The harm metric (pairs whose true S(i|j) exceeds tau, and for how long) reads the
    slowdown the jobs progress at, which here follows both jobs' activity and phases:
    two jobs sharing one GPU spend as many pair-seconds harmed as job-seconds above tau.
    (It read the saturated Gavel pair: pairs of mostly idle jobs counted as harmed.)"""
    from elastico_extender.core.interference.predictor import ContentionPredictor
    from elastico_extender.policies.elastico import ElasticoPolicy
    from elastico_extender.sim.engine import ClusterSpec, Simulator

    blind = ContentionPredictor(sm_weight=0.0, dram_weight=0.0, pressure_weight=0.0)
    trace = [TraceJob("a", 0.0, 1, 36000.0, "ncf"), TraceJob("b", 0.0, 1, 36000.0, "ncf")]
    truth = ProductionWorld(train_idle_share=idle_share).truth(BENCH, trace, 3)
    truth = replace(truth, dram_ratio=np.zeros(2), solo_activity=np.full(2, activity))
    policy = ElasticoPolicy(predictor=blind)  # shares: it predicts no slowdown
    result = Simulator(trace, policy, CONFIGS, truth, ClusterSpec(gpus=1)).run()
    assert result.seg_tenants.max() == 2.0  # they shared the GPU
    above = result.counters["above_tolerance_s"]
    assert sum(result.harm_s) == pytest.approx(above, rel=1e-6, abs=1e-6)
    if activity < 0.5:
        assert result.harm_s == [] and above == 0.0  # 1 + 0.04 * 0.7: never above tau


def _shipped(**changes: object) -> str:
    """The shipped world file's JSON with ``changes`` applied."""
    world = json.loads(DEFAULT_WORLD_FILE.read_text())
    world.update(changes)
    return json.dumps(world)


WORLD_TEXT = DEFAULT_WORLD_FILE.read_text()


@pytest.mark.parametrize(
    ("content", "named"),
    [
        pytest.param("not json", "cannot read", id="not-json"),
        pytest.param("[1, 2]", "JSON object", id="not-object"),
        pytest.param(_shipped(step_s="900"), "step_s", id="string-for-number"),
        pytest.param(_shipped(train_beta={"a": 0.2, "b": 1.2}), "train_beta", id="object-for-list"),
        pytest.param(_shipped(sources=["a"]), "sources", id="list-for-object"),
        pytest.param(_shipped(stepp_s=900), "stepp_s", id="unknown-key"),
        # a parameter left out would silently run at the shipped value ("replaces the parameters")
        pytest.param(
            json.dumps({k: v for k, v in json.loads(WORLD_TEXT).items() if k != "demand_floor"}),
            "demand_floor",
            id="missing-key",
        ),
        pytest.param(WORLD_TEXT.replace('"step_s": 900', '"step_s": NaN'), "step_s", id="nan"),
        pytest.param(
            WORLD_TEXT.replace('"demand_floor": 0.05', '"demand_floor": -Infinity'),
            "demand_floor",
            id="minus-infinity",
        ),
        pytest.param(_shipped(step_s=0), "step_s", id="zero-step"),
        pytest.param(_shipped(train_idle_share=1.5), "train_idle_share", id="share-above-1"),
        # phases a femtosecond long: the engine stops at every slot boundary, forever
        pytest.param(_shipped(step_s=1e-300), "step_s", id="step-femtoseconds"),
        pytest.param(_shipped(step_s=1), "step_s", id="step-one-second"),
        # exp of the AR(1) overflows to inf: a NaN demand curve, SM utilisation "n/a"
        pytest.param(_shipped(demand_sigma=1e300), "demand_sigma", id="sigma-overflows"),
        pytest.param(_shipped(demand_sigma=1000), "demand_sigma", id="sigma-1000"),
        # numpy's Beta sampler returns 0 for every job past ~1e307, not the mean a/(a+b)
        pytest.param(_shipped(infer_beta=[1e308, 1e308]), "infer_beta", id="beta-overflows"),
        # probabilities and the idle floor (a fraction of demand) outside [0, 1]
        pytest.param(_shipped(demand_p_enter=5), "demand_p_enter", id="p-enter-5"),
        pytest.param(_shipped(demand_floor=5), "demand_floor", id="floor-5"),
        pytest.param(_shipped(demand_p_exit=1.5), "demand_p_exit", id="p-exit-1.5"),
        # an integer too large for a float, or for Python's int parser: named, no OverflowError
        pytest.param(
            WORLD_TEXT.replace('"step_s": 900', '"step_s": ' + "9" * 400),
            "step_s",
            id="int-over-float",
        ),
        pytest.param(
            WORLD_TEXT.replace('"step_s": 900', '"step_s": ' + "9" * 5000),
            "step_s",
            id="int-over-parser",
        ),
        # nested past the parser's recursion limit: no RecursionError traceback
        pytest.param("[" * 100_000 + "]" * 100_000, "nested", id="nested-array"),
        pytest.param(
            '{"sources": ' + '{"a": ' * 100_000 + "1" + "}" * 100_001, "nested", id="nested-object"
        ),
    ],
)
def test_a_bad_world_file_is_one_cli_error_line_before_any_simulation(
    tmp_path: Path, content: str, named: str
) -> None:
    """`elastico simulate --world production --world-file F`: a bad F ends in one line
    naming --world-file and the key (exit 2), before the run starts (no 'trace=' line)."""
    world = tmp_path / "world.json"
    world.write_text(content)
    _assert_world_file_refused(tmp_path, str(world), named)


def test_a_world_file_is_read_bounded_and_may_start_with_a_bom(tmp_path: Path) -> None:
    """A file past MAX_WORLD_FILE_BYTES is refused, not read whole, and an endless one
    (/dev/zero) as not a regular file; a BOM (Windows editors) is read as the CSV
    loaders read it; a directory, or bytes that are not UTF-8, are named."""
    padded = tmp_path / "padded.json"
    padded.write_text(WORLD_TEXT + " " * MAX_WORLD_FILE_BYTES)
    _assert_world_file_refused(tmp_path, str(padded), "larger than")
    _assert_world_file_refused(tmp_path, "/dev/zero", "not a regular file")
    _assert_world_file_refused(tmp_path, str(tmp_path), "cannot read")
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe{}")
    _assert_world_file_refused(tmp_path, str(binary), "UTF-8")
    bom = tmp_path / "bom.json"
    bom.write_text("\ufeff" + WORLD_TEXT, encoding="utf-8")
    assert ProductionWorld.load(bom) == ProductionWorld.load()


def _assert_world_file_refused(tmp_path: Path, world: str, named: str) -> None:
    argv = ["--world", "production", "--world-file", world, "--gpus", "2", "--duration", "1"]
    proc = subprocess.run(
        [sys.executable, "-m", "elastico_extender.sim.cli", *argv, "--no-plots",
         "--no-progress", "--jobs", "1", "--out", str(tmp_path / "out")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "trace=" not in proc.stdout
    assert lines[-1].startswith("elastico simulate: error: --world-file: "), lines[-1][:300]
    assert named in lines[-1] and len(lines[-1]) < 600, lines[-1][:300]
