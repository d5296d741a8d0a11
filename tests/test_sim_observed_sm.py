"""The simulator reports each job's SM activity as the node agent does, and the planner
packs on it in the production world without breaking the engine's invariants."""

from __future__ import annotations

import math

import numpy as np
import pytest

from elastico_extender.core.observations import Observation
from elastico_extender.sim.cli import InputError, _check_policies
from elastico_extender.sim.engine import ClusterSpec, Simulator
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.production import ProductionTruth
from elastico_extender.sim.runner import Experiment, _world, build_policy
from elastico_extender.sim.traces import synthetic


def _run(world: str, gpus: int, hours: float, load: float, noise: float = 0.0):
    exp = Experiment(
        trace=tuple(synthetic(gpus, load, hours * 3600.0, 0)),
        cluster=ClusterSpec(gpus=gpus),
        world=world,
    )
    configs, truth = _world(exp)
    policy = build_policy("elastico+online", exp, truth)
    loop = policy.loop  # type: ignore[attr-defined]
    seen: list[tuple[Observation, int]] = []
    record = loop.record

    def spy(observations, running, families):  # type: ignore[no-untyped-def]
        observations = list(observations)
        seen.extend((o, sim.offset[sim.index[o.job_id]] + o.config) for o in observations)
        return record(observations, running, families)

    loop.record = spy
    stats: list[float] = []
    plan = policy.plan

    def spy_plan(snapshot, previous=None):  # type: ignore[no-untyped-def]
        result = plan(snapshot, previous)
        stats.append(result.stats.get("sm_observed_jobs", 0.0))
        return result

    policy.plan = spy_plan  # type: ignore[method-assign]
    sim = Simulator(
        list(exp.trace), policy, configs, truth, exp.cluster, loop=loop, noise=noise, seed=0
    )
    return sim.run(), seen, stats, configs, truth, sim


def test_production_windows_carry_the_true_activity() -> None:
    result, seen, _, _, truth, sim = _run("production", 8, 2.0, 1.5)
    assert isinstance(truth, ProductionTruth)
    checked = 0
    step = truth.world.step_s
    for obs, gid in seen:
        assert obs.sm_activity is not None and 0.0 <= obs.sm_activity <= 1.0
        start = obs.end - obs.seconds
        if math.floor((start - truth.origin) / step) != math.floor(
            (obs.end - 1e-6 - truth.origin) / step
        ):
            continue  # the window spans a phase change: an average of two values
        i = sim.index[obs.job_id]
        expected = float(truth.activity(np.array([i]), np.array([gid]), obs.end - 1e-6)[0])
        assert obs.sm_activity == pytest.approx(expected, abs=1e-9)
        checked += 1
    assert checked > 50
    assert not result.anomalies


def test_benchmark_windows_carry_the_profiled_share() -> None:
    _, seen, stats, configs, _, _ = _run("benchmark", 8, 1.0, 1.5)
    assert seen
    for obs, gid in seen:
        assert obs.sm_activity == pytest.approx(float(configs.sm[gid]), abs=1e-9)
    assert max(stats) == 0.0  # saturating jobs use their catalog share: nothing to free


def test_production_packing_on_observed_sm_keeps_the_invariants() -> None:
    result, _, stats, _, _, _ = _run("production", 16, 3.0, 1.5, noise=0.03)
    s = summarise(result)
    assert max(stats) > 0  # the planner did charge observed shares
    assert s["capacity_violations"] == 0.0  # memory never overcommitted
    assert s["work_error"] < 1e-6 and s["gpu_seconds_error"] < 1e-6
    assert not result.anomalies
    assert result.counters["sm_oversubscribed_s"] >= 0.0


def test_cli_accepts_the_online_suffix() -> None:
    _check_policies(["elastico+online", "elastico+learned+online", "elastico-catalog-sm+online"])
    for bad in ("volcano+online", "elastico+online+iac", "lucid+learned"):
        with pytest.raises(InputError):
            _check_policies([bad])
