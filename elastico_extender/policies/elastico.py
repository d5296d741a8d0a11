"""ElastiCo itself as a policy, and its ablations (spec 5.2) as settings of the same core."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from elastico_extender.core.closed_loop import ClosedLoop
from elastico_extender.core.interference.predictor import SlowdownPredictor
from elastico_extender.core.model import Plan, Snapshot
from elastico_extender.core.planner import plan
from elastico_extender.core.settings import PlannerSettings

__all__ = ["ABLATIONS", "ElasticoPolicy"]

ABLATIONS: dict[str, dict[str, bool]] = {
    "elastico": {},
    "elastico-no-rst": {"reshape": False},
    "elastico-no-esp": {"pricing": False},
    "elastico-no-iac": {"interference_check": False},
    "elastico-no-pds": {"coordination": False},
    "elastico-no-len": {"length_aware": False},
    "elastico-catalog-sm": {"observed_sm": False},
}
"""Registry names of the full system and each 'w/o X' variant of the ablation table."""


class ElasticoPolicy:
    """Runs the core PDS planner (Algorithm 1) with the given settings and predictor."""

    def __init__(
        self,
        settings: PlannerSettings | None = None,
        predictor: SlowdownPredictor | None = None,
        timer: Callable[[], float] | None = None,
        name: str = "elastico",
        loop: ClosedLoop | None = None,
    ) -> None:
        self.name = name
        self.settings = settings or PlannerSettings()
        self.timer = timer
        self.loop = loop
        """The closed loop the driver feeds (observations, online correction), if any."""
        if loop is not None and loop.correction is not None:
            predictor = loop.correction  # plans with the corrected predictor
        self.predictor = predictor

    @classmethod
    def ablation(cls, name: str, **kwargs: object) -> ElasticoPolicy:
        """The registry variant ``name`` (see :data:`ABLATIONS`)."""
        base = kwargs.pop("settings", None) or PlannerSettings()
        assert isinstance(base, PlannerSettings)
        return cls(settings=replace(base, **ABLATIONS[name]), name=name, **kwargs)  # type: ignore[arg-type]

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan:
        return plan(
            snapshot, previous, settings=self.settings, predictor=self.predictor, timer=self.timer
        )
