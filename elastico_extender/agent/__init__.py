"""``elastico agent``: the node agent of the closed loop (issue 11; spec 3.3, 4.1).

Runs on every GPU node (DaemonSet, ``deploy/agent.yaml``), observes the pods there without
touching their code and reports one window per pod to the extender's
``POST /observations``.  Modules: :mod:`.rings` (launch rate and memory from the profiler
shim's rings), :mod:`.framework` (a framework's Prometheus counter declared by annotation),
:mod:`.window` (counter readings -> rates), :mod:`.reporter` (the authenticated POST),
:mod:`.daemon` (the loop) and :mod:`.cli`.  See docs/observability.md.
"""

__all__ = ["MAX_AGE_HEADER"]

MAX_AGE_HEADER = "Elastico-Observation-Max-Age"
"""The wire name both sides share: the extender states its ``observation_max_age_seconds``
in this header of every answer to ``POST /observations`` (``api/routes/observations.py``),
and the agent holds refused windows that long (:mod:`.reporter`).  Here, with no imports,
so the extender reads it without the agent's HTTP client."""
