"""The simulator runs the same closed loop: observing co-located jobs bounds their harm."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.sim.engine import ClusterSpec
from elastico_extender.sim.runner import Experiment, build_policy, run_experiment
from elastico_extender.sim.traces import synthetic
from elastico_extender.sim.truth import GroundTruth
from elastico_extender.sim.workloads import ConfigTable


def test_the_loop_reduces_harm_and_learns_the_observed_pairs():
    exp = Experiment(trace=tuple(synthetic(16, 1.5, 4 * 3600.0, 0)), cluster=ClusterSpec(gpus=16))
    results = run_experiment(exp, ["elastico", "elastico+online"], workers=1)
    off, on = results["elastico"], results["elastico+online"]
    assert on.counters["observations"] > 0 and off.counters["observations"] == 0
    # Job-time spent above tolerance: at most a third of the open loop's.
    assert on.counters["above_tolerance_s"] < off.counters["above_tolerance_s"] / 3
    epochs_on = np.array(on.harm_s) / exp.epoch_s
    epochs_off = np.array(off.harm_s) / exp.epoch_s
    assert np.percentile(epochs_on, 95) <= 2.0 + 1e-6 < np.percentile(epochs_off, 95)
    # The corrected predictor knows the pairs it saw better than the base model.
    _hour, pairs, corrected, base = on.mape[-1]
    assert pairs > 0 and corrected < base
    assert all(not r.anomalies for r in results.values())


def test_online_suffix_combines_with_each_predictor():
    exp = Experiment(trace=tuple(synthetic(8, 1.0, 3600.0, 0)), cluster=ClusterSpec(gpus=8))
    configs = ConfigTable.build(0, 0.05)
    truth = GroundTruth.build(configs)
    for name, base in (
        ("elastico+online", "contention-heuristic"),
        ("elastico+iac+online", "table-mape7.6"),
        ("elastico-no-rst+online", "contention-heuristic"),
    ):
        policy = build_policy(name, exp, truth)
        assert policy.loop is not None  # type: ignore[attr-defined]
        assert policy.predictor.name == f"{base}+online"  # type: ignore[attr-defined]
    for bad in ("volcano+online", "elastico+online+iac", "elastico+magic"):
        with pytest.raises(ValueError):
            build_policy(bad, exp, truth)
