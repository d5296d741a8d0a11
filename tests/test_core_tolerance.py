"""IAC adaptive tolerance tau_j(t) (spec 3.3.3), table-driven."""

from __future__ import annotations

import numpy as np
import pytest

from elastico_extender.core.interference.tolerance import adaptive_tolerance

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
