"""Behaviour of the Volcano-like and Lucid-like baselines and of the ground truth."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.model import Job, Snapshot
from elastico_extender.core.shapes.catalog import catalog_families
from elastico_extender.policies import Policy, make_policy
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.traces import load_csv, synthetic
from elastico_extender.sim.truth import GroundTruth, load_pair_table
from elastico_extender.sim.workloads import ConfigTable, gavel_type, workload_from_gavel

FAMS = catalog_families()


def _snap(jobs: list[Job], gpus: int = 8) -> Snapshot:
    return Snapshot(ClusterSpec(gpus=gpus).nodes(), tuple(jobs), FAMS)


def _job(i: int, family: str, gpus: int = 1, **kw: object) -> Job:
    return Job(
        id=f"j{i}", family=family, kind=FAMS[family].kind, gpus=gpus, arrival_time=float(i), **kw
    )  # type: ignore[arg-type]


def test_policies_implement_the_protocol() -> None:
    for name in ("volcano", "lucid", "tiresias", "srtf"):
        assert isinstance(make_policy(name), Policy)


def test_volcano_whole_gpus_fifo_default_config() -> None:
    jobs = [_job(0, "lstm", 4), _job(1, "ncf", 4), _job(2, "ppo", 1)]
    plan = make_policy("volcano").plan(_snap(jobs), None)
    assert set(plan.assignments) == {"j0", "j1"}
    assert plan.queued == ("j2",)
    devices = [d for a in plan.assignments.values() for d in a.devices]
    assert len(devices) == len(set(devices)) == 8  # no device shared
    for a in plan.assignments.values():
        fam = FAMS[jobs[int(a.job_id[1:])].family]
        assert a.config_index == fam.fastest_index


def test_volcano_skips_a_blocked_gang_and_backfills() -> None:
    jobs = [_job(0, "lstm", 6), _job(1, "ncf", 4), _job(2, "ppo", 1)]
    plan = make_policy("volcano").plan(_snap(jobs), None)
    assert set(plan.assignments) == {"j0", "j2"}
    assert plan.queued == ("j1",)


def test_lucid_respects_memory() -> None:
    big = "qwen-1.7b"
    running = _job(0, "ncf", current_config=FAMS["ncf"].fastest_index, devices=(("node-0000", 0),))
    plan = make_policy("lucid").plan(_snap([running, _job(1, big)], gpus=1), None)
    total = FAMS["ncf"].resources[FAMS["ncf"].fastest_index, 1]
    if "j1" in plan.assignments:
        total += plan.assignments["j1"].memory_budget_mib
    assert total <= 40 * 1024


def test_gavel_mapping_is_documented_and_reversible() -> None:
    assert gavel_type("lstm", 4096, (32, 4096)) == "LM (batch size 80)"
    assert gavel_type("lstm", 32, (32, 4096)) == "LM (batch size 5)"
    assert workload_from_gavel("Recommendation (batch size 512)") == "ncf"
    assert workload_from_gavel("Transformer (batch size 64)", "x") in ("bert", "transformer")


def test_ground_truth_uses_measured_pairs() -> None:
    configs = ConfigTable.build(0)
    truth = GroundTruth.build(configs)
    table = load_pair_table(truth_path())
    a = configs.default_of("lstm")
    b = configs.default_of("ncf")
    assert truth.measured[a, b]
    expected = table[(configs.gavel[a], configs.gavel[b])]
    assert truth.slowdown[a, b] == pytest.approx(expected)
    q = configs.default_of("qwen-1.7b")
    assert not truth.measured[q, a]
    assert truth.slowdown[q, a] > 1.0
    s = truth.device_slowdowns(np.array([a, b, q]))
    assert s.shape == (3,) and (s > 1).all()


def truth_path():  # type: ignore[no-untyped-def]
    from elastico_extender.sim.truth import DEFAULT_PAIRS

    return DEFAULT_PAIRS


def test_reconfiguration_costs_follow_spec_5_7() -> None:
    c = ConfigTable.build(0)
    truth = GroundTruth.build(c, None)
    fam = FAMS["qwen-1.7b"]
    base = fam.configs[0].as_dict()
    toggled = dict(base, prefix_caching=not base["prefix_caching"])
    g0 = c.gid("qwen-1.7b", 0)
    g1 = c.gid("qwen-1.7b", fam.index_of(toggled))
    assert truth.reconfig_cost(g0, g1) == 0.0
    other = next(
        i for i, cfg in enumerate(fam.configs) if cfg["max_num_seqs"] != base["max_num_seqs"]
    )
    assert 5.0 <= truth.reconfig_cost(g0, c.gid("qwen-1.7b", other)) <= 15.0
    r0, r1 = c.gid("resnet50", 0), c.gid("resnet50", 1)
    assert 15.0 <= truth.reconfig_cost(r0, r1) <= 45.0


def test_synthetic_trace_matches_load_and_mix() -> None:
    from elastico_extender.sim.traces import offered_load

    jobs = synthetic(64, load=1.0, duration_s=24 * 3600.0, seed=1)
    assert 0.8 < offered_load(jobs, 64, 24 * 3600.0) < 1.2
    assert len({j.workload for j in jobs}) == 12


def test_user_csv_trace(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "t.csv"
    p.write_text(
        "job_id,arrival_time_s,gpu_num,duration_s,workload\n"
        "b,10,2,600,LM (batch size 20)\n"
        "a,0,1,1200,qwen-1.7b\n"
    )
    jobs = load_csv(p)
    assert [j.job_id for j in jobs] == ["a", "b"]
    assert jobs[1].workload == "lstm" and jobs[1].gpus == 2


def test_core_alone_starts_queued_gangs_on_idle_gpus() -> None:
    """40 identical 8-GPU jobs on an idle 64-GPU cluster: once a core deadlock (every
    price made all of them run or all wait); the core now rations by priority."""
    jobs = [_job(i, "bert", 8) for i in range(40)]
    snap = _snap(jobs, gpus=64)
    plan = make_policy("elastico").plan(snap, None)
    assert len(plan.assignments) == 8
    devices = [d for a in plan.assignments.values() for d in a.devices]
    assert len(devices) == len(set(devices)) == 64
    assert len(plan.queued) == 32


def test_learned_predictor_profiles_every_colocation_type_and_beats_the_heuristic() -> None:
    """The spec's protocol: a stratified 25% of workload pairs, k-NN over the 36 features."""
    import numpy as np

    from elastico_extender.core.interference.features import pair_features
    from elastico_extender.core.interference.predictor import ContentionPredictor
    from elastico_extender.sim.predictors import SampledPairsPredictor
    from elastico_extender.sim.truth import GroundTruth
    from elastico_extender.sim.workloads import ConfigTable

    configs = ConfigTable.build(0, 0.05)
    truth = GroundTruth.build(configs)
    learned = SampledPairsPredictor(truth, seed=0)
    workloads = len(configs.names)
    all_pairs = workloads * (workloads + 1) // 2
    assert 0.2 * all_pairs <= learned.profiled_pairs <= 0.3 * all_pairs + 3
    feats = np.concatenate([configs.families[n].features[:, :14] for n in configs.names])
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, configs.size, 2000), rng.integers(0, configs.size, 2000)
    x = pair_features(feats[a], feats[b], 40.0)
    y = truth.slowdown[a, b]
    got = learned.predict(x)
    assert np.all(got >= 1.0)
    mape = np.mean(np.abs(got - y) / y)
    assert mape < np.mean(np.abs(ContentionPredictor().predict(x) - y) / y)


def test_scaled_truth_scales_excess_slowdown() -> None:
    truth = GroundTruth.build(ConfigTable.build(0, 0.05))
    assert np.all(truth.scaled(0.0).slowdown == 1.0)
    np.testing.assert_allclose(truth.scaled(0.5).slowdown - 1.0, 0.5 * (truth.slowdown - 1.0))
    np.testing.assert_array_equal(truth.scaled(1.0).slowdown, truth.slowdown)
    with pytest.raises(ValueError):
        truth.scaled(-0.1)
