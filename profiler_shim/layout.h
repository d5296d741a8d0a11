/*
 * Shared-memory layout of the profiler ring: the C side of the layout twin.
 * elastico_extender/profiling/layout.py declares the same fields in the same order;
 * tests/test_shim_layout.py compares it with elastico_shim_layout() from the built
 * library, which is generated from the X-macros below, so the two cannot drift.
 *
 * File  <ELASTICO_SHIM_DIR>/elastico-shim-<pid>.ring  (mmap'ed MAP_SHARED):
 *   [0, ES_HEADER_SIZE)                  es_header
 *   [ES_HEADER_SIZE, + capacity * 64)    es_record slots; position p lives in slot p % capacity
 *
 * Protocol (many producers in the process, one consumer: the agent or the decoder):
 *   producer  reserve p = head by CAS while head - tail < capacity, else count a drop;
 *             write the slot, then store seq = p + 1 with release semantics.
 *   consumer  for p from tail: the slot is complete iff seq == p + 1; copy it, then
 *             store tail = p + 1.  A slot whose seq is not p + 1 (writer pre-empted or
 *             killed mid-write) is never decoded as data.
 * An exec keeps the pid: the new image continues the ring its process left (same pid and
 * process_start_ticks, every reserved slot committed), else truncates it.
 * All integers are little-endian, naturally aligned.
 */
#ifndef ELASTICO_SHIM_LAYOUT_H
#define ELASTICO_SHIM_LAYOUT_H

#include <stdint.h>

#define ES_MAGIC 0x4d485345u /* "ESHM" */
#define ES_LAYOUT_VERSION 1
#define ES_RECORD_SIZE 64
#define ES_HEADER_SIZE 512

/* Record kinds. */
#define ES_KINDS(X)                                                                          \
    X(LAUNCH, 1)     /* aggregated launches of one (api, function, dims, smem, stream) key */  \
    X(ALLOC, 2)      /* one allocation: handle=pointer, value=bytes, stream for async */       \
    X(FREE, 3)       /* one free: handle=pointer, value=bytes when the pointer was tracked */  \
    X(COLLECTIVE, 4) /* one NCCL call: handle=comm, value=count, aux=datatype, flags=op,     \
                        grid_x=root/peer (0xffffffff when none), grid_y=bytes per element */  \
    X(TICK, 5)       /* periodic flush: value=CLOCK_REALTIME ns, handle=live bytes,           \
                        stream=peak bytes, grid_x=flush number */

/* Record flag bits. */
#define ES_FLAGS(X)                                                                          \
    X(ERROR, 1)        /* the wrapped call returned an error (its result is kept as is) */   \
    X(SIZE_UNKNOWN, 2) /* a free of a pointer the shim did not see allocated */              \
    X(FINAL, 4)        /* the tick written at process exit */                            \
    X(EXEC, 8)         /* the tick written before an exec: the process goes on */

/* X(c type, name, numpy type code) */
#define ES_RECORD_FIELDS(X)  \
    X(uint64_t, seq, "<u8")     \
    X(uint8_t, kind, "u1")      \
    X(uint8_t, api, "u1")       \
    X(uint16_t, flags, "<u2")   \
    X(uint32_t, aux, "<u4")     \
    X(uint64_t, handle, "<u8")  \
    X(uint64_t, stream, "<u8")  \
    X(uint64_t, value, "<u8")   \
    X(uint32_t, grid_x, "<u4")  \
    X(uint32_t, grid_y, "<u4")  \
    X(uint32_t, grid_z, "<u4")  \
    X(uint32_t, block_x, "<u4") \
    X(uint32_t, block_y, "<u4") \
    X(uint32_t, block_z, "<u4")

/* head and tail sit on cache lines of their own (producers vs consumer). */
#define ES_HEADER_FIELDS(X)                   \
    X(uint32_t, magic, "<u4")                 \
    X(uint16_t, version, "<u2")               \
    X(uint16_t, record_size, "<u2")           \
    X(uint32_t, header_size, "<u4")           \
    X(uint32_t, capacity, "<u4")              \
    X(uint64_t, pid, "<u8")                   \
    X(uint64_t, flush_interval_ns, "<u8")     \
    X(uint64_t, start_realtime_ns, "<u8")     \
    X(uint64_t, buffer_bytes, "<u8")          \
    X(uint64_t, start_monotonic_ns, "<u8")    \
    X(uint64_t, last_flush_monotonic_ns, "<u8") \
    X(uint64_t, head, "<u8")                  \
    X(uint64_t, process_start_ticks, "<u8")   \
    X(uint64_t, reserved3, "<u8")             \
    X(uint64_t, reserved4, "<u8")             \
    X(uint64_t, reserved5, "<u8")             \
    X(uint64_t, reserved6, "<u8")             \
    X(uint64_t, reserved7, "<u8")             \
    X(uint64_t, reserved8, "<u8")             \
    X(uint64_t, tail, "<u8")                  \
    X(uint64_t, reserved9, "<u8")             \
    X(uint64_t, reserved10, "<u8")            \
    X(uint64_t, reserved11, "<u8")            \
    X(uint64_t, reserved12, "<u8")            \
    X(uint64_t, reserved13, "<u8")            \
    X(uint64_t, reserved14, "<u8")            \
    X(uint64_t, reserved15, "<u8")            \
    X(uint64_t, dropped_records, "<u8")       \
    X(uint64_t, dropped_launches, "<u8")      \
    X(uint64_t, launches, "<u8")              \
    X(uint64_t, launch_errors, "<u8")         \
    X(uint64_t, allocs, "<u8")                \
    X(uint64_t, alloc_failures, "<u8")        \
    X(uint64_t, frees, "<u8")                 \
    X(uint64_t, untracked_frees, "<u8")       \
    X(uint64_t, alloc_bytes, "<u8")           \
    X(uint64_t, live_bytes, "<u8")            \
    X(uint64_t, peak_bytes, "<u8")            \
    X(uint64_t, collectives, "<u8")           \
    X(uint64_t, collective_bytes, "<u8")      \
    X(uint64_t, flushes, "<u8")               \
    X(uint64_t, last_flush_realtime_ns, "<u8")

#define ES_DECLARE_FIELD(ctype, name, code) ctype name;

typedef struct es_record {
    ES_RECORD_FIELDS(ES_DECLARE_FIELD)
} es_record;

typedef struct es_header {
    ES_HEADER_FIELDS(ES_DECLARE_FIELD)
} es_header;

_Static_assert(sizeof(es_record) == ES_RECORD_SIZE, "record must be one 64-byte line");
_Static_assert(sizeof(es_header) <= ES_HEADER_SIZE, "header must fit its reserved space");
_Static_assert(__builtin_offsetof(es_header, head) == 64, "head on its own cache line");
_Static_assert(__builtin_offsetof(es_header, tail) == 128, "tail on its own cache line");

#endif /* ELASTICO_SHIM_LAYOUT_H */
