"""Trace-driven discrete-event simulator around the same core planner as the service.

Entry point: :func:`elastico_extender.sim.cli.main`.  Modules: ``workloads``
(configuration table, Gavel mapping), ``truth`` (true slowdowns, reconfiguration
costs), ``traces`` (CSV / Philly / synthetic inputs), ``engine`` (clock, cluster
view, plan application), ``metrics``, ``report`` (tables, plots), ``runner``
(policies side by side), ``instances`` (GPUs needed for a mix).
"""

from elastico_extender.sim.engine import ClusterSpec, RunResult, Simulator
from elastico_extender.sim.traces import TraceJob

__all__ = ["ClusterSpec", "RunResult", "Simulator", "TraceJob"]
