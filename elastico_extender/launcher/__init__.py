"""``elastico-run``: the container entrypoint that applies an assigned configuration (spec 4.2).

:mod:`.downward` parses the Kubernetes downward-API annotations file, :mod:`.assignment`
turns annotations/env into framework-native settings (through ``core.handoff``), and
:mod:`.run` supervises the workload: launch, watch for a new assignment, restart.
"""
