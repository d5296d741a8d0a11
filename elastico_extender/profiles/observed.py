"""Unknown workloads: a job's solo observation becomes its family's measured profile (spec 4.1).

A pod whose family has no measured profile runs alone first (the planner's
rule, ``core/planner/protect.py``).  While it runs alone, the node agent
reports its peak GPU memory, SM activity and progress rate; this module turns
one such solo window into a measured profile row through the
:class:`ProfileStore`, after which ``ProfileStore.family`` serves the measured
row (and nearest-neighbour estimates around it), the family is no longer all
estimated and the job may share.

Only what was measured is written: peak memory (plus the store's margin is
the planner's business) and SM activity become R(c)'s GPU memory and SM
share, CPU and host memory keep the family's current values, and the rate
becomes T(c) only when its unit is the family's throughput unit (a framework
counter such as tokens/s); a launch rate has no meaning as T(c), so then the
current T(c) is kept.  The IAC features of that row get the observed SM
activity and memory (GiB).
"""

from __future__ import annotations

import numpy as np

from elastico_extender.core.interference.features import FB, SM
from elastico_extender.core.model import ProfileFamily
from elastico_extender.core.observations import Observation
from elastico_extender.core.resources import GPU_MEM, GPU_SM
from elastico_extender.profiles.store import ProfileStore

__all__ = ["record_solo_profile"]


def record_solo_profile(
    store: ProfileStore, family: ProfileFamily, obs: Observation, *, measured_at: float
) -> bool:
    """Write ``obs`` (a solo window) as the measured profile of its configuration.

    Returns False, writing nothing, when the window was shared, lacks peak
    memory or SM activity, names a configuration the family does not have, or
    is otherwise unusable (``Observation.problems``).
    """
    if obs.problems() or obs.partners:
        return False
    if obs.peak_mem_mib is None or obs.sm_activity is None or obs.peak_mem_mib <= 0:
        return False
    if not 0 <= obs.config < family.size:
        return False
    resources = np.array(family.resources[obs.config], dtype=np.float64)
    resources[GPU_MEM] = obs.peak_mem_mib
    resources[GPU_SM] = min(max(obs.sm_activity, 0.0), 1.0)
    throughput = float(family.throughput[obs.config])
    if obs.unit == family.throughput_unit and obs.rate > 0:
        throughput = obs.rate
    features = np.array(family.features[obs.config], dtype=np.float64)
    features[SM] = resources[GPU_SM]
    features[FB] = obs.peak_mem_mib / 1024.0
    store.put(
        family.workload,
        family.hardware,
        family.configs[obs.config],
        resources,
        throughput,
        features,
        measured_at=measured_at,
    )
    return True
