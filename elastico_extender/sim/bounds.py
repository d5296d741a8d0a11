"""What no scheduler can beat on a trace: the floors the results tables quote.

Average JCT is at least the mean over jobs of each job's solo run time, started
on arrival with no queueing: at its default configuration (the trace's
``duration_s``), or, lower still, at the fastest configuration its workload
offers (``ConfigTable.rate``: true throughput over the default's, up to about
1.14x).  Sharing a GPU only slows a job, and no configuration changes how many
GPUs a job runs on, so no policy's average JCT is below the second figure.  A
target below it is out of every scheduler's reach in that world.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from elastico_extender.sim.traces import TraceJob
from elastico_extender.sim.workloads import ConfigTable

__all__ = ["JctFloors", "fastest_speed", "jct_floors"]


class JctFloors(NamedTuple):
    """Average JCT floors of a trace, in seconds (module docstring)."""

    default_s: float
    """Every job alone from its arrival at its default configuration."""
    fastest_s: float
    """The same at its workload's fastest configuration (no policy goes below)."""


def fastest_speed(trace: Sequence[TraceJob], configs: ConfigTable) -> np.ndarray:
    """Per job of ``trace``: its workload's fastest true throughput over its default's."""
    fastest = np.full(len(configs.names), -np.inf)
    np.maximum.at(fastest, configs.workload, configs.rate)
    index = {name: k for k, name in enumerate(configs.names)}
    return fastest[np.array([index[job.workload] for job in trace], dtype=np.intp)]


def jct_floors(
    trace: Sequence[TraceJob], configs: ConfigTable, speed: np.ndarray | None = None
) -> JctFloors:
    """The floors of ``trace`` in the world whose configurations are ``configs``;
    ``speed``: its ``fastest_speed``, when the caller has it already."""
    if not trace:
        return JctFloors(float("nan"), float("nan"))
    work = np.array([job.duration_s for job in trace], dtype=np.float64)
    if speed is None:
        speed = fastest_speed(trace, configs)
    return JctFloors(float(work.mean()), float((work / speed).mean()))
