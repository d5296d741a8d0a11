"""Scheduling policies behind one interface, picked by name from a small registry.

``make_policy("elastico")`` gives the full system; the ablations and the
baselines (Volcano-like FIFO, Lucid-like, Tiresias-like 2D-LAS, SRTF with oracle
durations, HAMi-like declared-share packing; docs/baselines.md) register here too,
so the simulator and the benchmarks run every policy through the same
``plan(snapshot, previous)``.
"""

from __future__ import annotations

from collections.abc import Callable

from elastico_extender.policies.base import Policy
from elastico_extender.policies.elastico import ABLATIONS, ElasticoPolicy
from elastico_extender.policies.hami import HamiPolicy
from elastico_extender.policies.lucid import LucidPolicy
from elastico_extender.policies.srtf import SrtfOraclePolicy
from elastico_extender.policies.tiresias import TiresiasPolicy
from elastico_extender.policies.volcano import VolcanoPolicy

__all__ = ["POLICIES", "Policy", "make_policy", "register"]

POLICIES: dict[str, Callable[..., Policy]] = {}


def register(name: str, factory: Callable[..., Policy]) -> None:
    """Add a policy factory under ``name`` (keyword arguments are passed through)."""
    POLICIES[name] = factory


def make_policy(name: str, **kwargs: object) -> Policy:
    """The policy registered as ``name``; ValueError lists the known names."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    return factory(**kwargs)


for _name in ABLATIONS:
    register(_name, lambda _n=_name, **kw: ElasticoPolicy.ablation(_n, **kw))
register("volcano", VolcanoPolicy)
register("lucid", LucidPolicy)
register("tiresias", TiresiasPolicy)
register("srtf", SrtfOraclePolicy)
register("hami", HamiPolicy)
