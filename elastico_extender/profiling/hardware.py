"""TDOP hardware dimension: the five IAC hardware metrics from DCGM or NVML (spec 4.1).

==================  ==================================  ==================================
metric              DCGM field (dcgm-exporter name)     NVML fallback
==================  ==================================  ==================================
sm_active           DCGM_FI_PROF_SM_ACTIVE (0..1)       utilization.gpu / 100 (a proxy:
                                                        any kernel running, not SM share)
sm_occupancy        DCGM_FI_PROF_SM_OCCUPANCY (0..1)    absent
dram_active         DCGM_FI_PROF_DRAM_ACTIVE (0..1)     absent
fb_used_mib         DCGM_FI_DEV_FB_USED (MiB)           memory used / 2**20
tensor_active       DCGM_FI_PROF_PIPE_TENSOR_ACTIVE     absent
==================  ==================================  ==================================

A metric that no source provides is ``None`` (never a made-up zero); with neither DCGM
nor NVML, :func:`detect_source` returns a :class:`NullSource` whose samples are empty,
and profiling proceeds on the software dimension alone.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Protocol

from elastico_extender.httpget import get_text

__all__ = [
    "DCGM_FIELDS",
    "HTTP_GET_MAX_BYTES",
    "DcgmExporterSource",
    "HardwareSample",
    "HardwareSource",
    "NullSource",
    "NvmlSource",
    "detect_source",
    "http_get",
    "parse_prometheus",
]

log = logging.getLogger(__name__)

DCGM_FIELDS: dict[str, str] = {
    "DCGM_FI_PROF_SM_ACTIVE": "sm_active",
    "DCGM_FI_PROF_SM_OCCUPANCY": "sm_occupancy",
    "DCGM_FI_PROF_DRAM_ACTIVE": "dram_active",
    "DCGM_FI_DEV_FB_USED": "fb_used_mib",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": "tensor_active",
}


@dataclass(frozen=True, slots=True)
class HardwareSample:
    """One reading; None where the source cannot measure the metric."""

    sm_active: float | None = None
    sm_occupancy: float | None = None
    dram_active: float | None = None
    fb_used_mib: float | None = None
    tensor_active: float | None = None

    @classmethod
    def metric_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))


class HardwareSource(Protocol):
    """Where hardware samples come from.

    ``sample()`` returns the current reading (None when the source failed this time:
    callers skip it); ``signature()`` names the GPU product (for the profile store's
    hardware key) or None when unknown.  Neither raises for a missing device.
    """

    name: str

    def sample(self) -> HardwareSample | None: ...

    def signature(self) -> str | None: ...


_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\\n]|\\.)*)"(,?)')
_VALUE = re.compile(r"[ \t]+(\S+)")
_ESCAPE = re.compile(r"\\(.)")
_UNESCAPED = {"n": "\n", "\\": "\\", '"': '"'}


def _unescape(value: str) -> str:
    """A label value as the text format escapes it (``\\\\``, ``\\"``, ``\\n``)."""
    return _ESCAPE.sub(lambda m: _UNESCAPED.get(m[1], m[0]), value)


def _labels(line: str, pos: int) -> tuple[dict[str, str], int] | None:
    """The label set opening at ``line[pos]`` (``{``) and where it ends; None when it is
    not one.  Each pair is matched where the last ended, so a long line costs linear time
    (a pattern searched at every offset of an 8 MiB line is quadratic)."""
    labels: dict[str, str] = {}
    pos += 1
    while not line.startswith("}", pos):
        pair = _LABEL.match(line, pos)
        if pair is None:
            return None
        labels[pair[1]] = _unescape(pair[2])
        pos = pair.end()
        if not pair[3] and not line.startswith("}", pos):
            return None
    return labels, pos + 1


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """``NAME[{LABELS}] VALUE [TIMESTAMP]``; what follows the value (a timestamp, an
    OpenMetrics exemplar ``# {...} v``) is not read."""
    name = _NAME.match(line)
    if name is None:
        return None
    labels: dict[str, str] = {}
    pos = name.end()
    if line.startswith("{", pos):
        found = _labels(line, pos)
        if found is None:
            return None
        labels, pos = found
    token = _VALUE.match(line, pos)
    if token is None or "_" in token[1]:  # float() takes 1_000; the format does not
        return None
    try:
        return name[0], labels, float(token[1])
    except ValueError:
        return None


def parse_prometheus(text: str) -> list[tuple[str, dict[str, str], float]]:
    """``(metric, labels, value)`` for every sample line of a text exposition (lines end
    at ``\\n`` only: a label value may hold U+2028 and the like)."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#"):
            continue
        sample = _sample(line)
        if sample is not None:
            out.append(sample)
    return out


class DcgmExporterSource:
    """dcgm-exporter's Prometheus endpoint (e.g. ``http://localhost:9400/metrics``)."""

    name = "dcgm-exporter"

    def __init__(
        self,
        url: str,
        gpu: str = "0",
        *,
        timeout: float = 2.0,
        fetch: Callable[[str, float], str] | None = None,
    ) -> None:
        self.url = url
        self.gpu = gpu
        self.timeout = timeout
        self._fetch = fetch or http_get
        self._model: str | None = None

    def sample(self) -> HardwareSample | None:
        try:
            text = self._fetch(self.url, self.timeout)
        except (OSError, ValueError) as exc:  # ValueError: an answer over the size bound
            log.warning("dcgm-exporter unreachable: %s", exc)
            return None
        values: dict[str, float] = {}
        for name, labels, value in parse_prometheus(text):
            metric = DCGM_FIELDS.get(name)
            if metric is None or not math.isfinite(value):
                continue
            if labels.get("gpu", self.gpu) != self.gpu:
                continue
            values[metric] = value
            self._model = labels.get("modelName", self._model)
        return HardwareSample(**values) if values else None

    def signature(self) -> str | None:
        if self._model is None:
            self.sample()
        return self._model


HTTP_GET_MAX_BYTES = 16 << 20
"""Longest answer :func:`http_get` reads (an exposition is KiB to a few MiB)."""


def http_get(url: str, timeout: float, *, max_bytes: int = HTTP_GET_MAX_BYTES) -> str:
    """GET ``url`` as text, bounded whatever the server does (``httpget.get_text``):
    OSError on failure, ValueError for an answer over ``max_bytes``."""
    return get_text(url, timeout, max_bytes=max_bytes)


class NvmlSource:
    """NVML through the optional ``pynvml`` module (``nvidia-ml-py``)."""

    name = "nvml"

    def __init__(self, index: int = 0, nvml: Any = None) -> None:
        self._nvml = nvml if nvml is not None else _load_pynvml()
        self._handle = self._nvml.nvmlDeviceGetHandleByIndex(index)

    def sample(self) -> HardwareSample | None:
        try:
            util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
            memory = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except Exception as exc:  # NVMLError and friends: degrade to "no sample"
            log.warning("NVML sample failed: %s", exc)
            return None
        return HardwareSample(sm_active=util.gpu / 100.0, fb_used_mib=memory.used / 2**20)

    def signature(self) -> str | None:
        name = self._nvml.nvmlDeviceGetName(self._handle)
        return name.decode() if isinstance(name, bytes) else str(name)


def _load_pynvml() -> Any:
    import pynvml  # optional: nvidia-ml-py

    pynvml.nvmlInit()
    return pynvml


class NullSource:
    """No hardware telemetry on this node."""

    name = "none"

    def sample(self) -> HardwareSample | None:
        return None

    def signature(self) -> str | None:
        return None


def detect_source(environ: Mapping[str, str], gpu: int = 0) -> HardwareSource:
    """``ELASTICO_DCGM_URL`` if set, else NVML when importable and initialisable, else none."""
    url = environ.get("ELASTICO_DCGM_URL")
    if url:
        return DcgmExporterSource(url, str(gpu))
    try:
        return NvmlSource(gpu)
    except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, no device, ...
        log.info("no hardware metrics source (DCGM unset, NVML unavailable: %s)", exc)
        return NullSource()
