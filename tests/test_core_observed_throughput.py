"""Observed throughput: the planner ranks a family's configurations by the solo rates the
closed loop measured there (in the profile's unit), not by the profile's T(c)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from conftest import a100_nodes

from elastico_extender.core.model import Job, MeasuredRates, Snapshot
from elastico_extender.core.observations import RESTORED_WINDOWS, Observation, ObservationBook
from elastico_extender.core.planner import plan
from elastico_extender.core.planner.observed_throughput import (
    MAX_DEVIATION,
    PRIOR_WINDOWS,
    observed_throughput,
    solo_rates,
)
from elastico_extender.core.settings import PlannerSettings

SURE = RESTORED_WINDOWS  # windows behind a well-measured rate


def measured(rates: list[float], windows: int = SURE) -> MeasuredRates:
    rate = np.array(rates, dtype=np.float64)
    return MeasuredRates(rate, np.where(np.isfinite(rate), windows, 0))


def trusted(deviation: float, windows: int = SURE) -> float:
    """The estimate's ratio to the profile after ``windows`` at ``deviation`` (log)."""
    return math.exp(windows / (windows + PRIOR_WINDOWS) * deviation)


FAMILY = "resnet50"


def solo(book: ObservationBook, job: str, config: int, rate: float, unit: str, end: float):
    book.record(Observation(job, config, end, 60.0, rate, unit), family=FAMILY)


def test_only_solo_windows_in_the_profiles_unit_measure_a_configuration(families):
    unit = families[FAMILY].throughput_unit
    book = ObservationBook()
    book.set_reference("j1", 3, unit, 500.0)  # a profile's T(c): not a measurement
    book.record(Observation("j1", 3, 60.0, 60.0, 400.0, unit, ("j2",)), family=FAMILY)
    solo(book, "j2", 5, 250.0, "launches/s", 60.0)  # another unit: ranks nothing
    assert solo_rates(book, families) == {}
    solo(book, "j1", 3, 480.0, unit, 120.0)
    rates = solo_rates(book, families)
    assert set(rates) == {FAMILY} and rates[FAMILY].rate.shape == (families[FAMILY].size,)
    assert rates[FAMILY].rate[3] == 480.0 and np.isnan(np.delete(rates[FAMILY].rate, 3)).all()
    assert rates[FAMILY].windows[3] == 1 and not np.delete(rates[FAMILY].windows, 3).any()
    for end in range(3, 30):
        solo(book, "j1", 3, 480.0, unit, 60.0 * end)
    assert solo_rates(book, families)[FAMILY].windows[3] == RESTORED_WINDOWS  # an average
    restored = ObservationBook()
    restored.restore(book.state())
    assert solo_rates(restored, families)[FAMILY].windows[3] == RESTORED_WINDOWS


def test_one_window_moves_the_estimate_part_of_the_way():
    """A window is noisy: a configuration's estimate leaves its profile value gradually."""
    profile = np.array([[10.0, 8.0]])
    real = np.ones((1, 2), dtype=bool)
    one = observed_throughput(["a"], profile, real, {"a": measured([np.nan, 8.4], windows=1)})
    assert 8.0 < one[0, 1] < 8.4
    assert one[0, 1] == pytest.approx(8.0 * trusted(math.log(8.4 / 8.0), 1))
    many = observed_throughput(["a"], profile, real, {"a": measured([np.nan, 8.4])})
    assert one[0, 1] < many[0, 1] < 8.4


def test_measured_rates_replace_the_profile_and_leave_the_rest_within_a_profiles_error():
    profile = np.array([[10.0, 8.0, 6.0, 1.0], [5.0, 4.0, 1.0, 1.0]])
    real = np.array([[True, True, True, False], [True, True, False, False]])
    # measured 5% below and 3% above the profile: a configuration's own error
    rates = {"a": measured([np.nan, 7.6, 6.18]), "b": measured([np.nan, np.nan])}
    out = observed_throughput(["a", "b"], profile, real, rates)
    expected = [10.0, 8.0 * trusted(math.log(0.95)), 6.0 * trusted(math.log(1.03))]
    assert np.allclose(out[0, :3], expected)  # the untried one keeps its profile
    assert out[0, 3] == 1.0  # padding untouched
    assert (out[1] == profile[1]).all()  # nothing measured: the profile
    assert (profile[0] == [10.0, 8.0, 6.0, 1.0]).all()  # the input is not modified


def test_a_family_measured_far_off_its_profile_rescales_what_was_not_measured():
    """Another GPU model than the profiler's: every configuration ~30% slower."""
    profile = np.array([[10.0, 8.0, 6.0]])
    real = np.ones((1, 3), dtype=bool)
    rates = {"a": measured([np.nan, 8.0 * 0.68, 6.0 * 0.72])}
    out = observed_throughput(["a"], profile, real, rates)
    shift = math.log(math.sqrt(0.68 * 0.72))  # geometric mean of measured / profile
    scale = math.exp(shift)
    assert out[0, 0] == pytest.approx(10.0 * scale)
    assert out[0, 1] == pytest.approx(8.0 * scale * trusted(math.log(0.68) - shift))
    assert out[0, 0] > out[0, 1]  # the profile's ranking of the untried one holds
    nine = {"a": measured([np.nan, 8 * 1.09, 6.0])}
    assert observed_throughput(["a"], profile, real, nine)[0, 0] == 10.0  # a config's error


def test_a_measured_rate_far_beyond_any_gpu_is_bounded_not_inf_or_zero():
    """A solo rate 1e300 times or 1e-300 of the profile (a counter in another unit, a
    stalled window, a broken exporter) is no GPU's speed: the estimate stays finite and
    positive, within MAX_DEVIATION of the profile, and the plan's scores stay finite."""
    profile = np.array([[10.0, 8.0]])
    real = np.ones((1, 2), dtype=bool)
    for rate in (1e300, 5e-324):
        with np.errstate(all="raise"):
            out = observed_throughput(["a"], profile, real, {"a": measured([rate, np.nan])})
        assert np.isfinite(out).all() and (out > 0).all(), rate
        assert (out <= profile * MAX_DEVIATION + 1e-9).all()
        assert (out >= profile / MAX_DEVIATION - 1e-9).all()


def _chosen(families, rates: dict[str, np.ndarray], **settings: bool) -> int:
    job = Job("j", FAMILY)
    snapshot = Snapshot(a100_nodes(1, 1), (job,), families, epoch=1, solo_rates=rates)
    return plan(snapshot, settings=PlannerSettings(**settings)).assignments["j"].config_index


def test_the_plan_follows_the_measured_rates_not_the_profile(families):
    family = families[FAMILY]
    assert _chosen(families, {}) == family.fastest_index  # alone on a GPU: the fastest
    # Measured: the profile's fastest runs at half its T(c); another at 1.2x that T(c).
    other = int(np.argsort(family.throughput)[-2])
    rates = np.full(family.size, np.nan)
    rates[family.fastest_index] = 0.5 * family.throughput[family.fastest_index]
    rates[other] = 1.2 * family.throughput[family.fastest_index]
    seen = {FAMILY: measured(rates.tolist())}
    assert _chosen(families, seen) == other
    assert _chosen(families, seen, observed_throughput=False) == family.fastest_index


def test_a_job_pinned_to_its_default_keeps_the_profiles_default(families):
    family = families[FAMILY]
    rates = np.full(family.size, np.nan)
    rates[family.fastest_index] = 0.1 * family.throughput[family.fastest_index]
    chosen = _chosen(families, {FAMILY: measured(rates.tolist())}, reshape=False)
    assert chosen == family.fastest_index


def test_the_simulator_hands_the_loops_measured_rates_to_the_planner(families):
    from elastico_extender.sim.engine import ClusterSpec
    from elastico_extender.sim.runner import Experiment, run_one
    from elastico_extender.sim.traces import synthetic

    exp = Experiment(trace=tuple(synthetic(8, 1.0, 3 * 3600.0, 0)), cluster=ClusterSpec(gpus=8))
    seen: list[Snapshot] = []
    import elastico_extender.policies.elastico as policy_module

    original = policy_module.plan

    def recording(snapshot, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(snapshot)
        return original(snapshot, *args, **kwargs)

    policy_module.plan = recording
    try:
        run_one("elastico+online", replace(exp))
    finally:
        policy_module.plan = original
    measured = [s.solo_rates for s in seen if s.solo_rates]
    assert measured, "no plan saw a measured solo rate"
    last = measured[-1]
    for name, rates in last.items():
        assert rates.rate.shape == rates.windows.shape == (families[name].size,)
        seen = np.isfinite(rates.rate)
        assert seen.any() and (rates.rate[seen] > 0).all() and (rates.windows[seen] >= 1).all()


def test_the_extenders_view_between_plans_scores_as_the_plan_does(families):
    """A pod arriving between two plans is placed at the configuration the next plan
    would choose: the view reads the snapshot's measured rates too."""
    from elastico_extender.core.planner import PlacementView

    family = families[FAMILY]
    other = int(np.argsort(family.throughput)[-2])
    rates = np.full(family.size, np.nan)
    rates[family.fastest_index] = 0.5 * family.throughput[family.fastest_index]
    rates[other] = 1.2 * family.throughput[family.fastest_index]
    nodes = a100_nodes(1, 1)
    for on, expected in ((True, other), (False, family.fastest_index)):
        settings = PlannerSettings(observed_throughput=on)
        snapshot = Snapshot(
            nodes, (), families, epoch=1, solo_rates={FAMILY: measured(list(rates))}
        )
        view = PlacementView(snapshot, plan(snapshot, settings=settings), settings)
        verdict = view.evaluate(Job("late", FAMILY), family)["node-0"]
        assert verdict.feasible and verdict.config_index == expected, on
