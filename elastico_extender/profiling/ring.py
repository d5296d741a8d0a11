"""Decoder of the shim's shared-memory ring (the consumer side of layout.h's protocol).

:class:`RingReader` maps ``elastico-shim-<pid>.ring`` and either *drains* records
(advancing the shared ``tail`` so the producers can reuse the slots; the agent's mode)
or *peeks* at what is there without consuming (for a finished process).  A slot is
decoded only when its ``seq`` stamp equals its position + 1, so a record a writer had
not finished (pre-empted, killed) is never read as data; such slots are reported in
``incomplete``.  :func:`summarize` folds records into per-process totals.

:func:`read_header` reads a header without mapping the file: for a reader that only
looks at the counters (the node agent), a file truncated meanwhile (by the pod that owns
it, or an older shim that re-created its ring with ``O_TRUNC``; the shim now replaces the
file under the name) is then a short read, not a SIGBUS on a mapped page past its end.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from elastico_extender.errors import RingFormatError
from elastico_extender.profiling.layout import (
    API_NAMES,
    HEADER_DTYPE,
    HEADER_SIZE,
    LAYOUT_VERSION,
    MAGIC,
    RECORD_DTYPE,
    RECORD_SIZE,
    TAIL_OFFSET,
    Flag,
    Kind,
)

__all__ = [
    "KernelKey",
    "RingFormatError",
    "RingReader",
    "ShimSummary",
    "find_rings",
    "read_header",
    "ring_pid",
    "summarize",
]

RING_PREFIX = "elastico-shim-"
RING_SUFFIX = ".ring"


def ring_pid(name: str) -> int | None:
    """The pid in a ring's file name (``elastico-shim-<pid>.ring``), else None.  Only
    ASCII digits: ``str.isdigit`` also takes '²' (which ``int`` refuses) and '٣' (which
    it reads as 3), names the shim never writes and a pod's own files may have."""
    if not (name.startswith(RING_PREFIX) and name.endswith(RING_SUFFIX)):
        return None
    pid = name[len(RING_PREFIX) : -len(RING_SUFFIX)]
    return int(pid) if pid.isascii() and pid.isdigit() else None


def find_rings(directory: str | Path) -> dict[int, Path]:
    """``pid -> ring file`` for every shim ring in ``directory``."""
    rings = {}
    for path in Path(directory).glob(f"{RING_PREFIX}*{RING_SUFFIX}"):
        pid = ring_pid(path.name)
        if pid is not None:
            rings[pid] = path
    return rings


def _open_ring(path: Path, flags: int) -> int:
    """An open descriptor of a regular file big enough for a ring (never blocks on a FIFO
    or device named like one: ``flags`` carries ``O_NONBLOCK``)."""
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RingFormatError(f"{path}: not a regular file")
        if info.st_size < HEADER_SIZE + RECORD_SIZE:
            raise RingFormatError(f"{path}: {info.st_size} bytes is too small for a ring")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _decode_header(data: bytes | mmap.mmap) -> dict[str, int]:
    row = np.frombuffer(data, dtype=HEADER_DTYPE, count=1)[0]
    return {name: int(row[name]) for name in HEADER_DTYPE.names or ()}


def _check(path: Path, head: dict[str, int], size: int) -> None:
    """RingFormatError unless ``head`` is a header of this layout fitting ``size`` bytes."""
    problems = []
    if head["magic"] != MAGIC:
        problems.append(f"magic {head['magic']:#x} != {MAGIC:#x}")
    if head["version"] != LAYOUT_VERSION:
        problems.append(f"layout version {head['version']} != {LAYOUT_VERSION}")
    if head["record_size"] != RECORD_SIZE or head["header_size"] != HEADER_SIZE:
        problems.append("record/header size differ from this decoder's")
    if HEADER_SIZE + head["capacity"] * RECORD_SIZE > size:
        problems.append(f"capacity {head['capacity']} does not fit {size} bytes")
    if problems:
        raise RingFormatError(f"{path}: " + "; ".join(problems))


def read_header(path: str | Path) -> dict[str, int]:
    """A ring's header, read rather than mapped (see the module doc); RingFormatError
    when the file is not a whole ring of this layout, OSError when it cannot be read or
    is a link (a pod's link would pass another file off as its ring: O_NOFOLLOW)."""
    path = Path(path)
    fd = _open_ring(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(fd).st_size
        data = os.pread(fd, HEADER_SIZE, 0)
    finally:
        os.close(fd)
    if len(data) < HEADER_SIZE:
        raise RingFormatError(f"{path}: truncated while read ({len(data)} bytes)")
    head = _decode_header(data)
    _check(path, head, size)
    return head


class RingReader:
    """A mapped ring file; use as a context manager."""

    def __init__(self, path: str | Path, *, writable: bool = True) -> None:
        """``writable=False`` maps the ring read-only (the node agent, which reads only the
        header, from a read-only mount): :meth:`drain` is then refused.  Only a regular
        file is mapped: a FIFO or device someone named like a ring is refused without
        blocking (``O_NONBLOCK``)."""
        self.path = Path(path)
        self.writable = writable
        flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_NONBLOCK | os.O_CLOEXEC
        fd = _open_ring(self.path, flags)
        try:
            size = os.fstat(fd).st_size
            prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
            self._map = mmap.mmap(fd, size, mmap.MAP_SHARED, prot)
        finally:
            os.close(fd)
        head = self.header()
        try:
            _check(self.path, head, size)
        except RingFormatError:
            self.close()
            raise
        self.capacity = int(head["capacity"])
        self._slots: np.ndarray | None = np.frombuffer(
            self._map, dtype=RECORD_DTYPE, count=self.capacity, offset=HEADER_SIZE
        )
        self.incomplete = 0

    def __enter__(self) -> RingReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if getattr(self, "_slots", None) is not None:
            del self._slots
        self._slots = None
        if not self._map.closed:
            self._map.close()

    def header(self) -> dict[str, int]:
        return _decode_header(self._map)

    def _complete(self, start: int, stop: int) -> np.ndarray:
        """Copies of the committed records at positions [start, stop), up to the first gap."""
        assert self._slots is not None
        positions = np.arange(start, stop, dtype=np.uint64)
        records = self._slots[(positions % np.uint64(self.capacity)).astype(np.int64)].copy()
        good = records["seq"] == positions + np.uint64(1)
        if not good.all():
            first_gap = int(np.argmin(good))
            self.incomplete = int((~good).sum())
            records = records[:first_gap]
        else:
            self.incomplete = 0
        return records

    def peek(self) -> np.ndarray:
        """Every committed record between tail and head, without consuming them."""
        head = self.header()
        return self._complete(head["tail"], head["head"])

    def drain(self, limit: int | None = None) -> np.ndarray:
        """Consume committed records from the tail (at most ``limit``) and return them."""
        if not self.writable:
            raise RingFormatError(f"{self.path}: mapped read-only, cannot consume records")
        head = self.header()
        stop = head["head"] if limit is None else min(head["head"], head["tail"] + limit)
        records = self._complete(head["tail"], stop)
        if len(records):
            struct.pack_into("<Q", self._map, TAIL_OFFSET, head["tail"] + len(records))
        return records


@dataclass(frozen=True, slots=True)
class KernelKey:
    api: str
    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int
    stream: int
    failed: bool


@dataclass
class ShimSummary:
    """Per-process totals folded from records (plus the header's counters when given)."""

    launches: int = 0
    launch_errors: int = 0
    kernels: Counter[KernelKey] = field(default_factory=Counter)
    launches_by_api: Counter[str] = field(default_factory=Counter)
    allocs: int = 0
    alloc_bytes: int = 0
    frees: int = 0
    freed_bytes: int = 0
    collectives: Counter[str] = field(default_factory=Counter)
    collective_bytes: int = 0
    ticks: int = 0
    peak_bytes: int = 0
    dropped_records: int = 0
    dropped_launches: int = 0

    @property
    def mean_threads_per_block(self) -> float:
        total = sum(self.kernels.values())
        if not total:
            return 0.0
        threads = sum(
            n * key.block[0] * key.block[1] * key.block[2] for key, n in self.kernels.items()
        )
        return threads / total


def summarize(records: np.ndarray, header: dict[str, int] | None = None) -> ShimSummary:
    """Fold decoded records into a :class:`ShimSummary`."""
    out = ShimSummary()
    for rec in records:
        kind = int(rec["kind"])
        api = API_NAMES[int(rec["api"])] if int(rec["api"]) < len(API_NAMES) else "?"
        flags = int(rec["flags"])
        failed = bool(flags & Flag.ERROR)
        value = int(rec["value"])
        if kind == Kind.LAUNCH:
            key = KernelKey(
                api=api,
                function=int(rec["handle"]),
                grid=(int(rec["grid_x"]), int(rec["grid_y"]), int(rec["grid_z"])),
                block=(int(rec["block_x"]), int(rec["block_y"]), int(rec["block_z"])),
                shared_mem=int(rec["aux"]),
                stream=int(rec["stream"]),
                failed=failed,
            )
            out.kernels[key] += value
            out.launches_by_api[api] += value
            out.launches += value
            out.launch_errors += value if failed else 0
        elif kind == Kind.ALLOC and not failed:
            out.allocs += 1
            out.alloc_bytes += value
        elif kind == Kind.FREE and not failed:
            out.frees += 1
            out.freed_bytes += value
        elif kind == Kind.COLLECTIVE:
            out.collectives[api] += 1
            out.collective_bytes += value * int(rec["grid_y"])
        elif kind == Kind.TICK:
            out.ticks += 1
            out.peak_bytes = max(out.peak_bytes, int(rec["stream"]))
    if header is not None:
        out.peak_bytes = max(out.peak_bytes, header["peak_bytes"])
        out.dropped_records = header["dropped_records"]
        out.dropped_launches = header["dropped_launches"]
    return out
