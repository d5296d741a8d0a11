"""The average-JCT floors the results tables quote (sim.bounds) hold for every policy."""

from __future__ import annotations

import math

import pytest

from elastico_extender.sim.bounds import fastest_speed, jct_floors
from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.metrics import summarise
from elastico_extender.sim.runner import Experiment, configs_of, run_experiment
from elastico_extender.sim.traces import TraceJob, synthetic


def test_the_floors_are_the_solo_run_times_at_default_and_fastest_speed() -> None:
    exp = Experiment(trace=(), cluster=ClusterSpec(gpus=8))
    configs = configs_of(exp)
    jobs = [TraceJob("a", 0.0, 1, 3600.0, "bert"), TraceJob("b", 10.0, 2, 600.0, "resnet50")]
    floors = jct_floors(jobs, configs)
    assert floors.default_s == pytest.approx(2100.0)
    speed = fastest_speed(jobs, configs)
    assert (speed >= 1.0).all()  # the default is one of the configurations
    assert floors.fastest_s == pytest.approx((3600.0 / speed[0] + 600.0 / speed[1]) / 2)
    assert math.isnan(jct_floors([], configs).default_s)


@pytest.mark.parametrize("world", ["benchmark", "production"])
def test_no_policy_beats_the_fastest_floor(world: str) -> None:
    jobs = synthetic(8, 1.5, 3 * 3600.0, seed=3)
    exp = Experiment(trace=tuple(jobs), cluster=ClusterSpec(gpus=8), seed=3, world=world)
    floor = jct_floors(jobs, configs_of(exp)).fastest_s
    results = run_experiment(exp, ["volcano", "srtf", "elastico+online"], workers=1)
    for name, result in results.items():
        assert summarise(result)["avg_jct_s"] >= floor * (1 - 1e-9), name
