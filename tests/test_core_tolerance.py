"""IAC adaptive tolerance tau_j(t) (spec 3.3.3), table-driven."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.interference.tolerance import adaptive_tolerance, smoothed_utilization

KW = dict(tau_default=1.5, beta=0.2, beta_max=0.3, utilization_target=0.8)


@pytest.mark.parametrize(
    ("name", "throughput", "floor", "utilization", "expected"),
    [
        ("no floor, at target", 100.0, 0.0, 0.8, 1.5),
        ("no floor, idle cluster tolerates less", 100.0, 0.0, 0.4, 1.4),
        ("no floor, busy cluster tolerates more", 100.0, 0.0, 1.2, 1.6),
        ("bonus is clamped at beta_max", 100.0, 0.0, 100.0, 1.8),
        ("floor binds below default", 100.0, 80.0, 0.8, 1.25),
        ("floor still binds when busy", 100.0, 80.0, 1.6, 1.25),
        ("no headroom: no co-location", 100.0, 100.0, 1.0, 1.0),
    ],
)
def test_adaptive_tolerance(name, throughput, floor, utilization, expected):
    tau = adaptive_tolerance(np.array([throughput]), np.array([floor]), utilization, **KW)
    assert tau[0] == pytest.approx(expected), name


def test_admitted_slowdown_never_breaks_the_floor():
    throughput = np.linspace(50, 500, 20)
    floor = throughput * 0.7
    tau = adaptive_tolerance(throughput, floor, 2.0, **KW)
    assert np.all(throughput / tau >= floor - 1e-9)


@pytest.mark.parametrize(
    ("name", "current", "previous", "elapsed", "time_constant", "history", "expected"),
    [
        ("no previous plan: the load now", 0.5, None, 60.0, 1800.0, 1e4, 0.5),
        ("smoothing off", 0.5, 2.0, 60.0, 0.0, 1e4, 0.5),
        ("one time constant: 1/e of the old value left", 0.5, 2.0, 1800.0, 1800.0, 1e4, None),
        ("a falling load falls slowly", 0.5, 2.0, 60.0, 1800.0, 1e4, "between"),
        ("a rising load rises slowly", 2.0, 0.5, 60.0, 1800.0, 1e4, "between"),
        ("no time passed: the average stands", 0.5, 2.0, 0.0, 1800.0, 1e4, 2.0),
        ("a clock that went back (a restart): the load now", 0.5, 2.0, -5.0, 1800.0, 1e4, 0.5),
        ("a long gap forgets the old value", 0.5, 2.0, 1e9, 1800.0, 1e4, 0.5),
        ("no history (a driver without a clock): the load now", 0.5, 2.0, 0.0, 1800.0, 0.0, 0.5),
        ("a first plan seen a second later carries no weight", 0.9, 0.0, 1.0, 1800.0, 0.0, 0.9),
        ("a young average: its age is the horizon", 0.5, 2.0, 60.0, 1800.0, 60.0, None),
    ],
)
def test_smoothed_utilization(name, current, previous, elapsed, time_constant, history, expected):
    got, _ = smoothed_utilization(current, previous, elapsed, time_constant, history)
    if expected is None:  # 1/e of the old value's distance left
        expected = current + (previous - current) * np.exp(-1.0)
    if expected == "between":
        assert min(current, previous) < got < max(current, previous), name
        assert abs(got - previous) < abs(got - current), name
    else:
        assert got == pytest.approx(expected), name


def test_one_busy_minute_moves_tau_a_thirtieth_of_the_way():
    """A queue that vanished a minute ago leaves U (and tau) near the busy value: the
    planner does not re-judge every co-location on one departure (settings doc)."""
    u, _ = smoothed_utilization(0.4, 3.0, 60.0, 1800.0, 1e4)
    assert 2.8 < u < 3.0
    tau = adaptive_tolerance(np.array([100.0]), np.array([0.0]), u, **KW)
    assert tau[0] == pytest.approx(1.8)


def test_the_average_ages_with_the_clock_and_restarts_when_it_goes_back():
    assert smoothed_utilization(0.5, 2.0, 60.0, 1800.0, 100.0)[1] == 160.0
    assert smoothed_utilization(0.5, 2.0, 60.0, 0.0, 100.0)[1] == 160.0  # smoothing off
    assert smoothed_utilization(0.5, None, 60.0, 1800.0, 100.0) == (0.5, 0.0)
    assert smoothed_utilization(0.5, 2.0, -5.0, 1800.0, 100.0) == (0.5, 0.0)
