"""A bounded, compact snapshot of what the closed loop learned (issue 11, "survives a restart").

The extender's replicas keep the loop's state in pod-local SQLite
(:mod:`.loop_store`); the leader also checkpoints it to the API server
(``service/checkpoint.py``) so a new leader starts from what the old one learned.
This module is the checkpoint's format: plain rows in (:class:`LearnedState`),
bytes out, and back, with no I/O.

Format ``elastico-learned/1``: zlib over one JSON header line (format, sections with
dtype, shape, offset, length; the references, per-pod records and completed jobs, which
carry strings) followed by the raw little-endian arrays the header names.  The header's
row sections are optional: a missing one reads as empty, so a checkpoint written before
completions (or the evicted jobs' successions) travelled still restores, and an older
reader ignores them (no format bump: both versions read each other's checkpoints during
a rolling upgrade).

Bound: :func:`encode` keeps the payload at most ``max_bytes``, dropping the *oldest*
rows first, tier by tier (:data:`TIERS`): the training history (labelled samples,
per-pod records), then the references, then the completed jobs, then the evicted jobs'
successions, then, evenly, the correction's rows and its neighbour ring.  What it
kept and dropped per section travels in the header and comes back to the caller.

Decoding trusts nothing: the decompressed size is capped, dtypes and shapes are checked
against the section's schema, and anything else raises :class:`CorruptSnapshot`.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from elastico_extender.core.duration import CompletedJob
from elastico_extender.core.interference.features import NUM_FEATURES
from elastico_extender.profiles.completions import CompletionRow
from elastico_extender.profiles.loop_store import PairRecord, ReferenceRow

__all__ = [
    "FORMAT",
    "MAX_DECODED_BYTES",
    "CorruptSnapshot",
    "LearnedState",
    "NewerSnapshot",
    "SuccessionRow",
    "decode",
    "encode",
]

FORMAT = "elastico-learned/1"
MAX_DECODED_BYTES = 64 << 20
"""Largest decompressed snapshot accepted (a zip bomb is refused, not inflated)."""

CorrectionRow = tuple[int, float, float]
"""(64-bit pair key, mean log residual, capped count)."""
RingRow = tuple[int, np.ndarray, float, float]
"""(configuration-pair key, 36 float32 features, mean log residual, count)."""
SuccessionRow = tuple[str, str, float, float, float, float]
"""An evicted job handed to its replacement (``service/succession.py``): ("waiting",
"namespace/owner uid") or ("claimed", pod uid), then arrival time, attained GPU-seconds,
seconds run, eviction time (epoch seconds)."""
SUCCESSION_KINDS = ("waiting", "claimed")

_ARRAYS: dict[str, tuple[str, tuple[int, ...]]] = {
    # name -> (dtype, trailing shape); every array of a section has the section's rows
    "config.key": ("<u8", ()),
    "config.mean": ("<f4", ()),
    "config.count": ("<f4", ()),
    "family.key": ("<u8", ()),
    "family.mean": ("<f4", ()),
    "family.count": ("<f4", ()),
    "ring.key": ("<u8", ()),
    "ring.x": ("<f4", (NUM_FEATURES,)),
    "ring.mean": ("<f4", ()),
    "ring.count": ("<f4", ()),
    "samples.x": ("<f4", (NUM_FEATURES,)),
    "samples.y": ("<f8", ()),
    "samples.at": ("<f8", ()),
}
SECTIONS = (
    "config",
    "family",
    "ring",
    "references",
    "samples",
    "records",
    "completions",
    "succession",
)
TIERS = (
    ("samples", "records"),
    ("references",),
    ("completions",),
    ("succession",),
    ("config", "family", "ring"),
)
"""Trimming order: the training set and the per-pod record first (the planner does not
read them); then the references (up to 200,000, mostly of departed pods; the caller puts
running pods' last); then the completed jobs: cheap (the caller offers the newest
5,000, about 33 bytes each compressed, a fifth of the default bound) and valuable (every
queued job's expected run time comes from them), so the references' long tail must not
crowd them out; then the evicted jobs' successions (a few thousand at most, each the
place in the queue of a job ElastiCo moved or requeued); then the correction itself,
which keeps harmful pairs apart."""
MIN_ROW_BYTES = 8
"""No row compresses below its 64-bit key or the like: a section never needs more rows
than ``max_bytes // MIN_ROW_BYTES`` (cut before encoding, to bound the work)."""


class CorruptSnapshot(ValueError):
    """The bytes are not a snapshot this version can read (the reason says why)."""


class NewerSnapshot(CorruptSnapshot):
    """A snapshot of a later format than this version's: unreadable here, but good data
    (a rolled-back replica must not write over it)."""


@dataclass
class LearnedState:
    """The loop's learned rows, oldest first in every section."""

    config: list[CorrectionRow] = field(default_factory=list)
    family: list[CorrectionRow] = field(default_factory=list)
    ring: list[RingRow] = field(default_factory=list)
    references: list[ReferenceRow] = field(default_factory=list)
    samples: tuple[np.ndarray, np.ndarray, np.ndarray] = field(
        default_factory=lambda: (
            np.zeros((0, NUM_FEATURES), dtype=np.float32),
            np.zeros(0),
            np.zeros(0),
        )
    )
    """Labelled pairs: features (n, 36), observed slowdown (n,), when recorded (n,)."""
    records: list[PairRecord] = field(default_factory=list)
    completions: list[CompletionRow] = field(default_factory=list)
    """Completed jobs (``service/completions.py``), the oldest finish first."""
    succession: list[SuccessionRow] = field(default_factory=list)
    """Evicted jobs waiting for, or taken over by, a replacement pod, oldest first."""
    written_at: float = 0.0

    def counts(self) -> dict[str, int]:
        return {
            "config": len(self.config),
            "family": len(self.family),
            "ring": len(self.ring),
            "references": len(self.references),
            "samples": int(self.samples[1].shape[0]),
            "records": len(self.records),
            "completions": len(self.completions),
            "succession": len(self.succession),
        }

    def newest(self, keep: dict[str, int]) -> LearnedState:
        """The newest ``keep[section]`` rows of each section."""

        def tail(n: int, total: int) -> slice:
            return slice(max(0, total - max(0, n)), total)

        counts = self.counts()
        s = tail(keep["samples"], counts["samples"])
        return replace(
            self,
            config=self.config[tail(keep["config"], counts["config"])],
            family=self.family[tail(keep["family"], counts["family"])],
            ring=self.ring[tail(keep["ring"], counts["ring"])],
            references=self.references[tail(keep["references"], counts["references"])],
            samples=(self.samples[0][s], self.samples[1][s], self.samples[2][s]),
            records=self.records[tail(keep["records"], counts["records"])],
            completions=self.completions[tail(keep["completions"], counts["completions"])],
            succession=self.succession[tail(keep["succession"], counts["succession"])],
        )


def _pack(state: LearnedState, dropped: dict[str, int]) -> bytes:
    arrays: dict[str, np.ndarray] = {}
    for level in ("config", "family"):
        rows = getattr(state, level)
        arrays[f"{level}.key"] = np.array([r[0] for r in rows], dtype="<u8")
        arrays[f"{level}.mean"] = np.array([r[1] for r in rows], dtype="<f4")
        arrays[f"{level}.count"] = np.array([r[2] for r in rows], dtype="<f4")
    ring = state.ring
    arrays["ring.key"] = np.array([r[0] for r in ring], dtype="<u8")
    arrays["ring.x"] = (
        np.stack([np.asarray(r[1], dtype="<f4") for r in ring])
        if ring
        else np.zeros((0, NUM_FEATURES), dtype="<f4")
    )
    arrays["ring.mean"] = np.array([r[2] for r in ring], dtype="<f4")
    arrays["ring.count"] = np.array([r[3] for r in ring], dtype="<f4")
    x, y, at = state.samples
    arrays["samples.x"] = np.ascontiguousarray(x, dtype="<f4").reshape(-1, NUM_FEATURES)
    arrays["samples.y"] = np.asarray(y, dtype="<f8")
    arrays["samples.at"] = np.asarray(at, dtype="<f8")
    sections: dict[str, Any] = {}
    blobs: list[bytes] = []
    offset = 0
    for name, (dtype, _) in _ARRAYS.items():
        data = np.ascontiguousarray(arrays[name], dtype=dtype).tobytes()
        sections[name] = {"dtype": dtype, "shape": list(arrays[name].shape), "offset": offset,
                          "length": len(data)}  # fmt: skip
        blobs.append(data)
        offset += len(data)
    header = {
        "format": FORMAT,
        "written_at": state.written_at,
        "arrays": sections,
        **{name: [write(row) for row in getattr(state, name)] for name, write in _WRITERS.items()},
        "kept": state.counts(),
        "dropped": dropped,
    }
    raw = json.dumps(header, separators=(",", ":")).encode() + b"\n" + b"".join(blobs)
    return zlib.compress(raw, 6)


def _reference_row(row: ReferenceRow) -> list[Any]:
    j, c, u, r, m = row
    return [j, int(c), u, float(r), int(bool(m))]


def _record_row(r: PairRecord) -> list[Any]:
    return [r.victim, int(r.victim_config), r.partner, float(r.slowdown), r.predicted, r.end]


def _completion_row(row: CompletionRow) -> list[Any]:
    uid, job, at = row
    return [uid, job.family, int(job.gpus), job.user, float(job.duration_s), float(at)]


_WRITERS: dict[str, Callable[[Any], list[Any]]] = {
    "references": _reference_row,
    "records": _record_row,
    "completions": _completion_row,
    "succession": list,
}
"""Each row section's rows as the header's JSON lists."""


def _readable(state: LearnedState) -> tuple[LearnedState, dict[str, int]]:
    """``state`` without the rows :func:`decode`'s own checks refuse (a reference's
    configuration past 2**31, a 300-character job, a NaN slowdown: read from a
    hand-edited store, say), and how many per section."""
    kept: dict[str, list[Any]] = {}
    unreadable: dict[str, int] = {}
    for name, write in _WRITERS.items():
        rows = getattr(state, name)
        kept[name] = [row for row in rows if _decodes(name, write, row)]
        unreadable[name] = len(rows) - len(kept[name])
    if not any(unreadable.values()):
        return state, unreadable
    return (
        replace(
            state,
            references=kept["references"],
            records=kept["records"],
            completions=kept["completions"],
            succession=kept["succession"],
        ),
        unreadable,
    )


def _decodes(name: str, write: Callable[[Any], list[Any]], row: Any) -> bool:
    """Whether ``row`` of section ``name``, written, reads back."""
    try:
        _READERS[name](write(row))
    except (CorruptSnapshot, TypeError, ValueError):
        return False
    return True


def encode(state: LearnedState, max_bytes: int) -> tuple[bytes, dict[str, int], dict[str, int]]:
    """``(payload, kept, dropped)`` with ``len(payload) <= max_bytes`` (module doc).  Rows
    :func:`decode` would refuse are dropped first (and counted): one of them would make
    the whole checkpoint unreadable to the next leader."""
    state, unreadable = _readable(state)
    total = state.counts()
    keep = {k: min(n, max_bytes // MIN_ROW_BYTES) for k, n in total.items()}
    for attempt in range(60):
        dropped = {k: total[k] - keep[k] + unreadable.get(k, 0) for k in SECTIONS}
        payload = _pack(state.newest(keep), dropped)
        if len(payload) <= max_bytes:
            return payload, keep, dropped
        if attempt == 0:  # a first guess from each section's bytes per row
            keep = _estimate(state, keep, max_bytes)
            continue
        tier = next((t for t in TIERS if any(keep[k] for k in t)), None)
        if tier is None:
            break  # only the header is left, and it does not fit
        ratio = max(0.0, min(0.9, 0.95 * max_bytes / len(payload)))
        for k in tier:
            keep[k] = int(keep[k] * ratio) if keep[k] * ratio >= 1 else 0
    raise ValueError(f"max_bytes={max_bytes} cannot hold even an empty snapshot")


def _estimate(state: LearnedState, keep: dict[str, int], max_bytes: int) -> dict[str, int]:
    """Rows per section that should fit, from each section's compressed bytes per row,
    filling the bound tier by tier from the most important (one pack per section)."""
    nothing = {k: 0 for k in SECTIONS}
    empty = len(_pack(state.newest(nothing), {}))
    per_row = {
        k: (len(_pack(state.newest({**nothing, k: keep[k]}), {})) - empty) / keep[k]
        for k in SECTIONS
        if keep[k]
    }
    room = 0.97 * max_bytes - empty
    out = dict(nothing)
    for tier in reversed(TIERS):
        need = sum(per_row.get(k, 0.0) * keep[k] for k in tier)
        share = 1.0 if need <= room else max(0.0, room / need) if need else 0.0
        for k in tier:
            out[k] = int(keep[k] * share)
        room -= need * share
    return out


def _format_number(name: object) -> int:
    """N of ``elastico-learned/N``; 0 for anything else."""
    prefix, _, number = str(name).rpartition("/")
    if prefix != FORMAT.rpartition("/")[0] or not number.isdigit():
        return 0
    return int(number[:9])


def decode(payload: bytes) -> LearnedState:
    """The snapshot in ``payload``; raises :class:`CorruptSnapshot` for anything else."""
    try:
        inflater = zlib.decompressobj()
        raw = inflater.decompress(payload, MAX_DECODED_BYTES)
        if inflater.unconsumed_tail:
            raise CorruptSnapshot(f"larger than {MAX_DECODED_BYTES} bytes decompressed")
        if not inflater.eof:
            raise CorruptSnapshot("truncated compressed stream")
    except zlib.error as exc:
        raise CorruptSnapshot(f"not zlib data ({exc})") from None
    line, sep, body = raw.partition(b"\n")
    if not sep:
        raise CorruptSnapshot("no header line")
    try:
        header = json.loads(line)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptSnapshot(f"header is not JSON ({exc})") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        found = header.get("format") if isinstance(header, dict) else type(header).__name__
        if _format_number(found) > _format_number(FORMAT):
            raise NewerSnapshot(f"format {found!r} is newer than this version's {FORMAT!r}")
        raise CorruptSnapshot(f"format {found!r}, expected {FORMAT!r}")
    try:
        arrays = _arrays(header.get("arrays"), body)
        state = LearnedState(
            config=_correction(arrays, "config"),
            family=_correction(arrays, "family"),
            ring=[
                (int(k), x, float(m), float(n))
                for k, x, m, n in zip(
                    arrays["ring.key"].tolist(),
                    arrays["ring.x"],
                    arrays["ring.mean"].tolist(),
                    arrays["ring.count"].tolist(),
                    strict=True,
                )
            ],
            references=[_reference(r) for r in _rows(header, "references")],
            samples=(arrays["samples.x"], arrays["samples.y"], arrays["samples.at"]),
            records=[_record(r) for r in _rows(header, "records")],
            completions=[_completion(r) for r in _rows(header, "completions")],
            succession=[_succession(r) for r in _rows(header, "succession")],
            written_at=_number(header.get("written_at", 0.0), "written_at"),
        )
    except (TypeError, ValueError, KeyError, IndexError) as exc:
        if isinstance(exc, CorruptSnapshot):
            raise
        raise CorruptSnapshot(f"malformed rows ({type(exc).__name__}: {exc})") from None
    for prefix in ("config", "family", "ring", "samples"):
        rows = {arrays[n].shape[0] for n in _ARRAYS if n.startswith(prefix + ".")}
        if len(rows) != 1:
            raise CorruptSnapshot(f"section {prefix}: arrays of different lengths {sorted(rows)}")
    return state


def _arrays(spec: Any, body: bytes) -> dict[str, np.ndarray]:
    if not isinstance(spec, dict):
        raise CorruptSnapshot("header.arrays is missing")
    out: dict[str, np.ndarray] = {}
    for name, (dtype, trailing) in _ARRAYS.items():
        s = spec.get(name)
        if not isinstance(s, dict) or s.get("dtype") != dtype:
            raise CorruptSnapshot(f"array {name}: missing or not {dtype}")
        shape, offset, length = s.get("shape"), s.get("offset"), s.get("length")
        if (
            not isinstance(shape, list)
            or len(shape) != 1 + len(trailing)
            or not all(isinstance(d, int) and d >= 0 for d in shape)
            or tuple(shape[1:]) != trailing
            or not isinstance(offset, int)
            or not isinstance(length, int)
            or offset < 0
            or length != math.prod(shape) * np.dtype(dtype).itemsize
            or offset + length > len(body)
        ):
            raise CorruptSnapshot(f"array {name}: shape, offset or length do not fit")
        out[name] = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=offset)
        out[name] = out[name].reshape(shape)
    return out


def _correction(arrays: dict[str, np.ndarray], level: str) -> list[CorrectionRow]:
    return list(
        zip(
            arrays[f"{level}.key"].tolist(),
            arrays[f"{level}.mean"].tolist(),
            arrays[f"{level}.count"].tolist(),
            strict=True,
        )
    )


def _rows(header: dict[str, Any], name: str) -> list[list[Any]]:
    rows = header.get(name, [])
    if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
        raise CorruptSnapshot(f"header.{name} is not a list of rows")
    return rows


def _text(value: Any, what: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or not (0 if empty else 1) <= len(value) <= 256:
        raise CorruptSnapshot(f"{what}: not a short string")
    return value


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CorruptSnapshot(f"{what}: not a finite number")
    return float(value)


def _positive(value: Any, what: str) -> float:
    number = _number(value, what)
    if number <= 0:
        raise CorruptSnapshot(f"{what}: not positive")
    return number


def _whole(value: Any, what: str) -> int:
    """A JSON integer, 0 or more (a float or a bool is refused, not rounded)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 1 << 31:
        raise CorruptSnapshot(f"{what}: not a count")
    return value


def _checked(row: list[Any], width: int, what: str) -> list[Any]:
    if len(row) != width:
        raise CorruptSnapshot(f"{what}: a row of {len(row)} fields, expected {width}")
    return row


def _reference(row: list[Any]) -> ReferenceRow:
    job, config, unit, rate, solo = _checked(row, 5, "references")
    return (
        _text(job, "references.job"),
        _whole(config, "references.config"),
        _text(unit, "references.unit"),
        _number(rate, "references.rate"),
        bool(_number(solo, "references.solo")),
    )


def _record(row: list[Any]) -> PairRecord:
    victim, config, partner, slowdown, predicted, end = _checked(row, 6, "records")
    number: Callable[[Any, str], float] = _number
    return PairRecord(
        _text(victim, "records.victim"),
        _whole(config, "records.victim_config"),
        _text(partner, "records.partner"),
        number(slowdown, "records.slowdown"),
        None if predicted is None else number(predicted, "records.predicted"),
        number(end, "records.end"),
    )


def _completion(row: list[Any]) -> CompletionRow:
    uid, family, gpus, user, seconds, at = _checked(row, 6, "completions")
    job = CompletedJob(
        _text(family, "completions.family"),
        _whole(gpus, "completions.gpus"),
        _positive(seconds, "completions.duration_s"),
        _text(user, "completions.user", empty=True),
    )
    return _text(uid, "completions.uid"), job, _number(at, "completions.finished_at")


def _succession(row: list[Any]) -> SuccessionRow:
    kind, key, arrival, attained, ran, evicted = _checked(row, 6, "succession")
    if kind not in SUCCESSION_KINDS:
        raise CorruptSnapshot(f"succession.kind: not one of {SUCCESSION_KINDS}")
    return (
        kind,
        _text(key, "succession.key"),
        _nonnegative(arrival, "succession.arrival"),
        _nonnegative(attained, "succession.attained_gpu_seconds"),
        _nonnegative(ran, "succession.ran_s"),
        _number(evicted, "succession.evicted_at"),
    )


def _nonnegative(value: Any, what: str) -> float:
    number = _number(value, what)
    if number < 0:
        raise CorruptSnapshot(f"{what}: negative")
    return number


_READERS: dict[str, Callable[[list[Any]], Any]] = {
    "references": _reference,
    "records": _record,
    "completions": _completion,
    "succession": _succession,
}
"""Each row section's reader: the same checks :func:`decode` makes, which the writer
applies too."""
