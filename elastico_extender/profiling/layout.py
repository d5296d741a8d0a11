"""Python twin of ``profiler_shim/layout.h`` and ``profiler_shim/hooks.h``.

The shared-memory ring the shim writes is decoded with the numpy dtypes built here.
Fields are declared in the same order and with the same types as the C X-macros;
:func:`describe` renders them in the exact text form that the built library's
``elastico_shim_layout()`` returns, and ``tests/test_shim_layout.py`` compares the two,
so a change on one side without the other fails the tests.

Record fields by kind (see layout.h for the authoritative comment):

==========  ==========================================================================
LAUNCH      handle=function, stream, value=launch count, aux=shared-memory bytes,
            grid_*/block_* dimensions; ERROR flag when the call failed
ALLOC       handle=device pointer, value=bytes, stream (async API only)
FREE        handle=pointer, value=bytes (0 with SIZE_UNKNOWN when never seen allocated)
COLLECTIVE  handle=communicator, stream, value=element count, aux=ncclDataType_t,
            flags>>8=reduction op, grid_x=root/peer (0xffffffff none), grid_y=bytes/element
TICK        value=CLOCK_REALTIME ns, handle=live bytes, stream=peak bytes, grid_x=flush no.
==========  ==========================================================================
"""

from __future__ import annotations

from enum import IntEnum, IntFlag

import numpy as np

__all__ = [
    "API_NAMES",
    "HEADER_DTYPE",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "LAYOUT_VERSION",
    "MAGIC",
    "RECORD_DTYPE",
    "RECORD_FIELDS",
    "RECORD_SIZE",
    "Flag",
    "Kind",
    "describe",
]

LAYOUT_VERSION = 1
RECORD_SIZE = 64
HEADER_SIZE = 512
MAGIC = 0x4D485345  # "ESHM" little-endian

RECORD_FIELDS: tuple[tuple[str, str], ...] = (
    ("seq", "<u8"),
    ("kind", "u1"),
    ("api", "u1"),
    ("flags", "<u2"),
    ("aux", "<u4"),
    ("handle", "<u8"),
    ("stream", "<u8"),
    ("value", "<u8"),
    ("grid_x", "<u4"),
    ("grid_y", "<u4"),
    ("grid_z", "<u4"),
    ("block_x", "<u4"),
    ("block_y", "<u4"),
    ("block_z", "<u4"),
)

_PAD = tuple((f"reserved{i}", "<u8") for i in range(2, 16))
HEADER_FIELDS: tuple[tuple[str, str], ...] = (
    ("magic", "<u4"),
    ("version", "<u2"),
    ("record_size", "<u2"),
    ("header_size", "<u4"),
    ("capacity", "<u4"),
    ("pid", "<u8"),
    ("flush_interval_ns", "<u8"),
    ("start_realtime_ns", "<u8"),
    ("buffer_bytes", "<u8"),
    # CLOCK_MONOTONIC beside the realtime stamps (rates survive wall-clock steps); zero in
    # rings of shims older than these two fields, whose bytes were reserved and zero
    ("start_monotonic_ns", "<u8"),
    ("last_flush_monotonic_ns", "<u8"),
    ("head", "<u8"),  # offset 64: a cache line of its own
    # /proc/<pid>/stat's start time (clock ticks after boot): an exec keeps it, so the
    # new image continues the ring; zero in rings of older shims and when unknown
    ("process_start_ticks", "<u8"),
    *_PAD[1:7],
    ("tail", "<u8"),  # offset 128
    *_PAD[7:14],
    ("dropped_records", "<u8"),
    ("dropped_launches", "<u8"),
    ("launches", "<u8"),
    ("launch_errors", "<u8"),
    ("allocs", "<u8"),
    ("alloc_failures", "<u8"),
    ("frees", "<u8"),
    ("untracked_frees", "<u8"),
    ("alloc_bytes", "<u8"),
    ("live_bytes", "<u8"),
    ("peak_bytes", "<u8"),
    ("collectives", "<u8"),
    ("collective_bytes", "<u8"),
    ("flushes", "<u8"),
    ("last_flush_realtime_ns", "<u8"),
)

API_NAMES: tuple[str, ...] = (
    "cuGetProcAddress",
    "cuGetProcAddress_v2",
    "cuLaunchKernel",
    "cuLaunchKernel_ptsz",
    "cuLaunchKernelEx",
    "cuLaunchKernelEx_ptsz",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cudaLaunchKernel",
    "cudaLaunchKernel_ptsz",
    "cudaMalloc",
    "cudaFree",
    "cudaMallocAsync",
    "cudaFreeAsync",
    "ncclAllReduce",
    "ncclAllGather",
    "ncclReduceScatter",
    "ncclBroadcast",
    "ncclSend",
    "ncclRecv",
    "cudaGetDriverEntryPoint",
    "cudaGetDriverEntryPoint_ptsz",
    "cudaGetDriverEntryPointByVersion",
    "cudaGetDriverEntryPointByVersion_ptsz",
    "cudaMallocAsync_ptsz",
    "cudaFreeAsync_ptsz",
    "cuGraphLaunch",
    "cuGraphLaunch_ptsz",
    "cudaGraphLaunch",
    "cudaGraphLaunch_ptsz",
    "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz",
    "cudaLaunchKernelExC",
    "cudaLaunchKernelExC_ptsz",
    "cudaLaunchCooperativeKernel",
    "cudaLaunchCooperativeKernel_ptsz",
    "cuLaunchCooperativeKernel",
    "cuLaunchCooperativeKernel_ptsz",
    "cuMemCreate",
    "cuMemRelease",
)


class Kind(IntEnum):
    LAUNCH = 1
    ALLOC = 2
    FREE = 3
    COLLECTIVE = 4
    TICK = 5


class Flag(IntFlag):
    ERROR = 1
    SIZE_UNKNOWN = 2
    FINAL = 4
    EXEC = 8


def _offsets(fields: tuple[tuple[str, str], ...]) -> list[int]:
    """Natural C alignment: each field at the next multiple of its own size."""
    offsets, at = [], 0
    for _, code in fields:
        size = np.dtype(code).itemsize
        at = (at + size - 1) // size * size
        offsets.append(at)
        at += size
    return offsets


def _dtype(fields: tuple[tuple[str, str], ...], itemsize: int) -> np.dtype:
    return np.dtype(
        {
            "names": [name for name, _ in fields],
            "formats": [code for _, code in fields],
            "offsets": _offsets(fields),
            "itemsize": itemsize,
        }
    )


RECORD_DTYPE = _dtype(RECORD_FIELDS, RECORD_SIZE)
HEADER_DTYPE = _dtype(HEADER_FIELDS, HEADER_SIZE)
_HEADER_OFFSETS = dict(zip((n for n, _ in HEADER_FIELDS), _offsets(HEADER_FIELDS), strict=True))
HEAD_OFFSET = _HEADER_OFFSETS["head"]
TAIL_OFFSET = _HEADER_OFFSETS["tail"]


def describe() -> str:
    """The layout in the text form of the C library's ``elastico_shim_layout()``."""

    def fields(items: tuple[tuple[str, str], ...]) -> str:
        return "".join(
            f" {name}:{code}@{offset}"
            for (name, code), offset in zip(items, _offsets(items), strict=True)
        )

    return "\n".join(
        [
            f"version={LAYOUT_VERSION}",
            f"record={RECORD_SIZE}{fields(RECORD_FIELDS)}",
            f"header={HEADER_SIZE}{fields(HEADER_FIELDS)}",
            f"magic={MAGIC}",
            "apis=" + ",".join(API_NAMES),
            "kinds=" + ",".join(f"{k.name}={k.value}" for k in Kind),
            "flags=" + ",".join(f"{f.name}={f.value}" for f in Flag),
        ]
    )
