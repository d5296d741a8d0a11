"""TDOP, the two-dimensional profiler of spec 4.1.

* software dimension: the LD_PRELOAD shim (``profiler_shim/``, located by
  :func:`shim_path`) writes a ring that :mod:`.ring` decodes (layout twin in :mod:`.layout`);
* hardware dimension: DCGM exporter / NVML samples (:mod:`.hardware`);
* the profiling procedure that turns both into a stored profile (:mod:`.procedure`).
"""
