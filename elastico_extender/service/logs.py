"""Structured logs: every ``extra`` field of a record reaches the output.

The service logs events as short names with fields (``log.info("bind.ok",
extra={"pod": ..., "node": ...})``); the standard formatter prints only the name.
Two formatters keep the fields:

* ``text`` (default): ``2026-11-22T20:40:01.123Z INFO elastico... bind.ok pod=ml/a node=g0``
  (values with spaces or quotes are JSON-quoted, so a line splits unambiguously);
* ``json``: one JSON object per line (``ts``, ``level``, ``logger``, ``event``, the
  fields, ``exception`` when there is one), for log pipelines.

:func:`decision_fields` is the one mapping of a :class:`BindRequest` to the fields
of a bind or reconfigure line: pod, node, devices, configuration, budget.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO

from elastico_extender.cluster.base import BindRequest

__all__ = [
    "LOG_FORMATS",
    "JsonFormatter",
    "KeyValueFormatter",
    "configure_logging",
    "decision_fields",
    "record_fields",
]

LOG_FORMATS = ("text", "json")

# Attributes every LogRecord has; anything else on a record came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def record_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra`` fields of ``record``, in the order they were given."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


def _timestamp(record: logging.LogRecord) -> str:
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{whole}.{int(record.msecs):03d}Z"


def _plain(value: Any) -> Any:
    """A JSON-ready value (tuples and sets as lists, unknown objects as text)."""
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(v) for v in value]
    return str(value)


class KeyValueFormatter(logging.Formatter):
    """``<time> <LEVEL> <logger> <event> key=value ...``."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [_timestamp(record), record.levelname, record.name, record.getMessage()]
        for key, value in record_fields(record).items():
            text = value if isinstance(value, str) else json.dumps(_plain(value))
            if not text or any(c in text for c in ' "=\n'):
                text = json.dumps(text)
            parts.append(f"{key}={text}")
        line = " ".join(parts)
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class JsonFormatter(logging.Formatter):
    """One JSON object per record; the fields sit beside ``event``."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        for key, value in record_fields(record).items():
            doc.setdefault(key, _plain(value))
        if record.exc_info:
            doc["exception"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False)


def configure_logging(level: str, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) with the chosen formatter."""
    if fmt not in LOG_FORMATS:
        raise ValueError(f"log format must be one of {', '.join(LOG_FORMATS)}, got {fmt!r}")
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else KeyValueFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def decision_fields(request: BindRequest, **more: Any) -> dict[str, Any]:
    """Fields of a bind/reconfigure log line: pod, node, devices, configuration, budget
    (from the decision annotations the request writes) and ``more`` (e.g. ``reason``)."""
    notes = request.annotations
    fields: dict[str, Any] = {"pod": f"{request.namespace}/{request.name}", "node": request.node}
    for key, name in (
        ("elastico.io/assigned-devices", "devices"),
        ("elastico.io/assigned-configuration", "configuration"),
        ("elastico.io/memory-budget-mib", "memory_budget_mib"),
    ):
        if key in notes:
            fields[name] = notes[key]
    fields.update(more)
    return fields
