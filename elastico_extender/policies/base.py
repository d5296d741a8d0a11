"""The one interface every scheduling policy implements (ElastiCo and the baselines)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from elastico_extender.core.model import Plan, Snapshot

__all__ = ["Policy"]


@runtime_checkable
class Policy(Protocol):
    """A scheduling policy: ``plan(snapshot, previous) -> Plan``.

    Contract: pure with respect to its inputs (no I/O, no clock), returns a plan
    whose placements are capacity-feasible on every device of ``snapshot``,
    never assigns a job that the snapshot does not contain, and leaves running
    jobs running unless the plan lists them in ``preempted``.  ``name`` is the
    registry key used on the command line and in result tables.
    """

    name: str

    def plan(self, snapshot: Snapshot, previous: Plan | None = None) -> Plan: ...
