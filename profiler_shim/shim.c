/*
 * ElastiCo TDOP software dimension (spec 4.1): an LD_PRELOAD interposition library.
 *
 * Every entry point in hooks.h gets a wrapper that calls the real symbol (resolved once
 * with dlsym(RTLD_NEXT), so another preload hook such as HAMi-core further down the
 * chain keeps working, else in the calling library's own scope when that was loaded with
 * RTLD_LOCAL), returns its result untouched, and notes what happened:
 *
 *   kernel launches   (and CUDA graph replays, keyed by the graph: function = the
 *                     executable graph, dimensions 0) aggregated per thread in a small
 *                     direct-mapped cache keyed by
 *                     (api, function, grid, block, shared memory, stream, error); a key
 *                     is published to the ring as one LAUNCH record with its count when
 *                     it is evicted, when the flush epoch moves on (every flush interval)
 *                     and when the thread or the process ends.  The hot path touches only
 *                     thread-local memory: no lock, no atomic read-modify-write.
 *   allocations       one ALLOC / FREE record each (cuMemCreate / cuMemRelease of the
 *                     virtual memory API too, keyed by the handle with its top bit set);
 *                     a pointer->size map gives frees their size and keeps live and peak
 *                     bytes in the header.
 *   NCCL calls        one COLLECTIVE record each.
 *
 * The ring is a bounded file mapping (layout.h) that the agent reads; a full ring drops
 * the record and counts it, it never blocks the application.  Nested calls (the runtime
 * calling the driver inside cudaMalloc, ...) are passed straight through by a per-thread
 * reentrancy depth, so one user call is one record.  cuGetProcAddress and the runtime's
 * cudaGetDriverEntryPoint* are wrapped so that driver entry points fetched by name still
 * go through the wrappers; so is dlsym, for hooked functions a program looks up on its
 * own handle of the library (Triton's launcher).
 *
 * Environment: ELASTICO_SHIM_DIR (default /dev/shm, else /tmp), ELASTICO_SHIM_BUFFER_BYTES
 * (default 4 MiB, the whole mapping; 1536 B to 1 GiB), ELASTICO_SHIM_FLUSH_MS (default
 * 2000; 10 to 3600000), ELASTICO_SHIM_DISABLE=1 (pure pass-through; 0, false, no, off
 * leave it on); a value out of range or not a decimal integer is reported on stderr and
 * the default used.  fork() gives the child a ring of its own; a child made by a clone
 * that runs no pthread_atfork handler publishes nothing (es_ring_mine).
 *
 * A process publishes the calling thread's pending launches and a final tick at exit()
 * (after every destructor: es_exit_handler), and also when it ends with _exit()/_Exit()
 * or replaces its image with an exec call (hooks.h's ES_PROCESS_HOOKS): os._exit,
 * multiprocessing and DataLoader workers, launchers.  Other threads' caches, and a process killed by a signal, keep
 * what they launched since the last flush they noticed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"
#include "layout.h"

#define ES_EXPORT __attribute__((visibility("default")))
#define ES_LIKELY(x) __builtin_expect(!!(x), 1)
#define ES_UNLIKELY(x) __builtin_expect(!!(x), 0)

/* ---- generated from the list ------------------------------------------------------ */
enum {
#define ES_ENUM(name, ret, params, args, fail) ES_API_##name,
    ES_HOOKED_SYMBOLS(ES_ENUM)
#undef ES_ENUM
    ES_API_COUNT
};
_Static_assert(ES_API_COUNT < 256, "api index must fit the record's byte");

static const char *const es_api_names[ES_API_COUNT] = {
#define ES_NAME(name, ret, params, args, fail) #name,
    ES_HOOKED_SYMBOLS(ES_NAME)
#undef ES_NAME
};

#define ES_TYPEDEF(name, ret, params, args, fail) typedef ret es_fn_##name params;
ES_HOOKED_SYMBOLS(ES_TYPEDEF)
#undef ES_TYPEDEF

/* Every symbol in the list has an exported wrapper of exactly the listed signature. */
#define ES_DECLARE(name, ret, params, args, fail) ES_EXPORT ret name params;
ES_HOOKED_SYMBOLS(ES_DECLARE)
#undef ES_DECLARE

enum {
#define ES_KIND_ENUM(name, value) ES_KIND_##name = value,
    ES_KINDS(ES_KIND_ENUM)
#undef ES_KIND_ENUM
};
enum {
#define ES_FLAG_ENUM(name, value) ES_FLAG_##name = value,
    ES_FLAGS(ES_FLAG_ENUM)
#undef ES_FLAG_ENUM
};

/* ---- a line on stderr ------------------------------------------------------------ */
/* One write(2) of the formatted line: no stdio lock or buffer.  SIGPIPE is held off while
 * it is written and the one the write raised is taken back, so a stderr pipe whose reader
 * has gone loses the line instead of killing a workload that never writes there itself;
 * a SIGPIPE already pending for the application is left alone.  errno is kept. */
__attribute__((format(printf, 1, 2))) static void es_warn(const char *format, ...) {
    char line[PATH_MAX + 256];
    va_list ap;
    va_start(ap, format);
    int saved = errno, n = vsnprintf(line, sizeof line, format, ap);
    va_end(ap);
    if (n <= 0) {
        errno = saved;
        return;
    }
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    line[len - 1] = '\n'; /* a line cut short still ends one */
    sigset_t pipe_only, old, pending;
    sigemptyset(&pipe_only);
    sigaddset(&pipe_only, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
    int was_pending = sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
    for (size_t off = 0; off < len;) {
        ssize_t w = write(STDERR_FILENO, line + off, len - off);
        if (w > 0)
            off += (size_t)w;
        else if (w < 0 && errno == EINTR)
            continue;
        else
            break;
    }
    if (!was_pending) {
        struct timespec now = {0, 0};
        sigtimedwait(&pipe_only, NULL, &now);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = saved;
}

/* ---- real symbols: resolved once each, lazily (libnccl may be loaded late) -------- */
static void *es_real[ES_API_COUNT];

/* The shim's dlsym (below) is compiled where the C library's can be found by version:
 * glibc on the architectures CUDA runs on. */
#if defined(__GLIBC__) && defined(__x86_64__)
#define ES_DLSYM_FIRST_VERSION "GLIBC_2.2.5"
#elif defined(__GLIBC__) && defined(__aarch64__)
#define ES_DLSYM_FIRST_VERSION "GLIBC_2.17"
#endif

typedef void *es_fn_dlsym(void *handle, const char *name);

#ifdef ES_DLSYM_FIRST_VERSION
static es_fn_dlsym *es_dlsym_real;

/* The next dlsym past the shim: the C library's, found with dlvsym (which the shim leaves
 * alone) called from here, so that the search starts past the shim.  The architecture's
 * first version first: libdl's before glibc 2.34, an alias of libc's GLIBC_2.34 one
 * since, so the first try finds it and no error message is allocated (with a malloc
 * that a preloaded allocator looking its own malloc up with dlsym would re-enter). */
__attribute__((noinline)) static es_fn_dlsym *es_dlsym_resolve(void) {
    static const char *const versions[] = {ES_DLSYM_FIRST_VERSION, "GLIBC_2.34"};
    static int reported;
    int saved = errno;
    es_fn_dlsym *p = NULL;
    for (size_t i = 0; !p && i < sizeof versions / sizeof *versions; i++)
        p = (es_fn_dlsym *)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
    if (p)
        __atomic_store_n(&es_dlsym_real, p, __ATOMIC_RELEASE);
    else if (!__atomic_exchange_n(&reported, 1, __ATOMIC_RELAXED))
        es_warn("elastico-shim: the C library's dlsym cannot be found\n");
    errno = saved;
    return p;
}

static inline es_fn_dlsym *es_dlsym_next(void) {
    es_fn_dlsym *p = __atomic_load_n(&es_dlsym_real, __ATOMIC_ACQUIRE);
    return ES_LIKELY(p != NULL) ? p : es_dlsym_resolve();
}
#endif

/* dlsym for the shim's own lookups, never the shim's wrapper of it (whose answer for a
 * hooked name would call back here).  Called from the shim, so RTLD_NEXT means past it. */
static void *es_sym(void *handle, const char *name) {
#ifdef ES_DLSYM_FIRST_VERSION
    es_fn_dlsym *real = es_dlsym_next();
    return real ? real(handle, name) : NULL;
#else
    return dlsym(handle, name);
#endif
}

/* The real `name` as the dynamic linker would have bound it for the code at `caller`
 * without the shim, when dlsym(RTLD_NEXT) (which searches only the global scope) finds
 * nothing: a library loaded with dlopen(RTLD_LOCAL), such as a Python extension module or
 * PyTorch's libcaffe2_nvrtc.so, has its libcuda/libcudart/libnccl in its own local scope
 * only, yet its calls bind to the preloaded wrappers.  The caller's object is pinned (its
 * RTLD_NOLOAD handle is never closed) so the pointer kept stays mapped. */
static void *es_resolve_local(const char *name, const void *caller) {
    Dl_info at, found, self;
    if (!caller || !dladdr(caller, &at) || !at.dli_fname || !*at.dli_fname) return NULL;
    void *handle = dlopen(at.dli_fname, RTLD_LAZY | RTLD_NOLOAD);
    if (!handle) return NULL;
    void *p = es_sym(handle, name);
    if (p && dladdr(p, &found) && dladdr((void *)es_resolve_local, &self) &&
        found.dli_fbase == self.dli_fbase)
        p = NULL; /* never our own wrapper */
    if (!p) dlclose(handle);
    return p;
}

static void *es_lookup(const char *name, const void *caller) {
    void *p = es_sym(RTLD_NEXT, name);
    return p ? p : es_resolve_local(name, caller);
}

__attribute__((noinline)) static void *es_resolve(int api, const void *caller) {
    int saved = errno;
    void *p = es_lookup(es_api_names[api], caller);
    if (p) __atomic_store_n(&es_real[api], p, __ATOMIC_RELEASE);
    errno = saved;
    return p;
}

static inline void *es_next(int api, const void *caller) {
    void *p = __atomic_load_n(&es_real[api], __ATOMIC_ACQUIRE);
    return ES_LIKELY(p != NULL) ? p : es_resolve(api, caller);
}

/* ---- process state ---------------------------------------------------------------- */
#define ES_CACHE_SLOTS 1024 /* per thread; power of two */
#define ES_ALLOC_MIN_SLOTS (1u << 12)
#define ES_ALLOC_MAX_SLOTS (1u << 22) /* 64 MiB; tracks 3 Mi live allocations */
#define ES_DEFAULT_BUFFER (4u << 20)
#define ES_DEFAULT_FLUSH_MS 2000
#define ES_MAX_BUFFER (1ull << 30) /* 16 Mi records; each ring is reserved whole, in memory */
#define ES_MAX_FLUSH_MS 3600000ull /* an hour; counters advance only at flushes */

/* ES_ORPHAN: a child that still maps its parent's ring and holds the shim's state as the
 * parent left it, made by a clone that is no C library fork (es_fork_child never ran);
 * it publishes nothing (es_ring_mine). */
enum { ES_UNINIT = 0, ES_ACTIVE = 1, ES_DISABLED = 2, ES_ORPHAN = 3 };

/* A launch key packed into six words, built in registers: (function, stream,
 * grid x|y, grid z|block x, block y|z, shared memory|api<<32|flags<<40).  Building it
 * as 32-bit fields on the stack and comparing 64-bit words defeats store forwarding and
 * costs ~20 ns per launch. */
typedef struct es_slot {
    uint64_t w[6];
    uint64_t count;
    uint64_t pad;
} __attribute__((aligned(64))) es_slot;
_Static_assert(sizeof(es_slot) == 64, "one slot per cache line");

typedef struct es_thread {
    uint64_t epoch;
    es_slot slot[ES_CACHE_SLOTS];
} es_thread;

typedef struct es_alloc_entry {
    uint64_t ptr; /* 0 empty, 1 tombstone */
    uint64_t size;
} es_alloc_entry;

static struct {
    int state;
    uint64_t epoch;
    es_header *hdr;
    es_record *ring;
    size_t map_bytes;
    uint32_t capacity;
    uint64_t flush_ns;
    pthread_mutex_t lock; /* init, fork */
    pthread_mutex_t alloc_lock;
    es_alloc_entry *allocs; /* alloc_slots entries (a power of two), under alloc_lock */
    uint32_t alloc_slots, alloc_used, alloc_live; /* used: live entries and tombstones */
    pthread_key_t thread_key;
    int key_ok;
    int ended; /* the final tick is written */
    uint64_t *mine; /* nonzero in the process that started the ring (es_ring_mine) */
    char path[PATH_MAX];
} es_g = {.lock = PTHREAD_MUTEX_INITIALIZER, .alloc_lock = PTHREAD_MUTEX_INITIALIZER};

static __thread int es_depth __attribute__((tls_model("initial-exec")));
static __thread es_thread *es_tls __attribute__((tls_model("initial-exec")));

static uint64_t es_clock_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Wall time dates a window; the monotonic clock measures its length, which a step of the
 * wall clock (NTP, a resumed VM) between two flushes would otherwise change. */
static uint64_t es_realtime_ns(void) { return es_clock_ns(CLOCK_REALTIME); }
static uint64_t es_monotonic_ns(void) { return es_clock_ns(CLOCK_MONOTONIC); }

/* ---- the ring --------------------------------------------------------------------- */
/* Whether the ring mapped is this process's own.  A child made by fork() gets a ring of
 * its own (es_fork_child), but one made by a clone that skips the pthread_atfork handlers
 * (syscall(SYS_clone, SIGCHLD), clone(2) without CLONE_VM) keeps the parent's MAP_SHARED
 * ring, state and launch caches: all it published would be mixed into the parent's
 * counts.  The word es_g.mine points to lies in a page the kernel hands every such child
 * zeroed (MADV_WIPEONFORK, Linux 4.14): one load, no system call, so it is asked at each
 * publish, never per launch.  Where the kernel lacks it, the pid is (getpid(), a system
 * call, at each record and eviction: old kernels only).  The child then publishes
 * nothing: a ring of its own would need a lock that another of the parent's threads may
 * have held at the clone, and a flusher thread.  A clone(CLONE_VM) child shares the page
 * too (nothing is copied, so nothing is wiped), and its parent's thread's TLS: its
 * launches are aggregated in that thread's cache, and only a system call per launch
 * could tell them apart, so they count as the parent's (docs/observability.md). */
static inline int es_ring_mine(void) {
    const uint64_t *mine = es_g.mine;
    if (ES_LIKELY(mine != NULL)) return __atomic_load_n(mine, __ATOMIC_RELAXED) != 0;
    return es_g.hdr->pid == (uint64_t)getpid();
}

/* es_ring_mine(), and a child that finds the ring is its parent's is marked ES_ORPHAN. */
static int es_ring_kept(void) {
    if (ES_LIKELY(es_ring_mine())) return 1;
    __atomic_store_n(&es_g.state, ES_ORPHAN, __ATOMIC_RELAXED);
    return 0;
}

static inline void es_add(uint64_t *counter, uint64_t n) {
    __atomic_fetch_add(counter, n, __ATOMIC_RELAXED);
}

/* Reserve a slot, or count a drop and return NULL.  `launches` is what a drop loses. */
static es_record *es_reserve(uint64_t launches, uint64_t *pos) {
    es_header *h = es_g.hdr;
    uint64_t head = __atomic_load_n(&h->head, __ATOMIC_RELAXED);
    for (;;) {
        uint64_t tail = __atomic_load_n(&h->tail, __ATOMIC_ACQUIRE);
        if (head - tail >= es_g.capacity) {
            es_add(&h->dropped_records, 1);
            if (launches) es_add(&h->dropped_launches, launches);
            return NULL;
        }
        if (__atomic_compare_exchange_n(&h->head, &head, head + 1, 1, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            break;
    }
    *pos = head;
    return &es_g.ring[head % es_g.capacity];
}

static inline void es_commit(es_record *r, uint64_t pos) {
    __atomic_store_n(&r->seq, pos + 1, __ATOMIC_RELEASE);
}

static void es_emit(uint8_t kind, uint8_t api, uint16_t flags, uint32_t aux, uint64_t handle,
                    uint64_t stream, uint64_t value, const uint32_t grid[3],
                    const uint32_t block[3]) {
    uint64_t pos;
    es_record *r = es_reserve(kind == ES_KIND_LAUNCH ? value : 0, &pos);
    if (!r) return;
    r->kind = kind;
    r->api = api;
    r->flags = flags;
    r->aux = aux;
    r->handle = handle;
    r->stream = stream;
    r->value = value;
    r->grid_x = grid ? grid[0] : 0;
    r->grid_y = grid ? grid[1] : 0;
    r->grid_z = grid ? grid[2] : 0;
    r->block_x = block ? block[0] : 0;
    r->block_y = block ? block[1] : 0;
    r->block_z = block ? block[2] : 0;
    es_commit(r, pos);
}

static void es_emit_tick(uint16_t flags) {
    es_header *h = es_g.hdr;
    uint64_t now = es_realtime_ns();
    uint64_t n = __atomic_add_fetch(&h->flushes, 1, __ATOMIC_RELAXED);
    __atomic_store_n(&h->last_flush_monotonic_ns, es_monotonic_ns(), __ATOMIC_RELAXED);
    __atomic_store_n(&h->last_flush_realtime_ns, now, __ATOMIC_RELAXED);
    uint32_t grid[3] = {(uint32_t)n, 0, 0};
    es_emit(ES_KIND_TICK, 0, flags, 0, __atomic_load_n(&h->live_bytes, __ATOMIC_RELAXED),
            __atomic_load_n(&h->peak_bytes, __ATOMIC_RELAXED), now, grid, NULL);
}

/* ---- per-thread launch aggregation ----------------------------------------------- */
/* The count is taken before it is published: _exit() in a signal handler that interrupted
 * this publishes the rest of the cache (es_flush_at_end) and never this slot twice.  The
 * signal fences order only the compiler (no instruction). */
static void es_publish(es_slot *s) {
    uint64_t count = s->count;
    s->count = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    if (ES_UNLIKELY(!es_ring_kept())) return; /* a child's copy of its parent's cache */
    uint16_t flags = (uint16_t)(s->w[5] >> 40);
    uint32_t grid[3] = {(uint32_t)s->w[2], (uint32_t)(s->w[2] >> 32), (uint32_t)s->w[3]};
    uint32_t block[3] = {(uint32_t)(s->w[3] >> 32), (uint32_t)s->w[4],
                         (uint32_t)(s->w[4] >> 32)};
    es_add(&es_g.hdr->launches, count);
    if (flags & ES_FLAG_ERROR) es_add(&es_g.hdr->launch_errors, count);
    es_emit(ES_KIND_LAUNCH, (uint8_t)(s->w[5] >> 32), flags, (uint32_t)s->w[5], s->w[0],
            s->w[1], count, grid, block);
}

static void es_thread_flush(es_thread *t) {
    for (unsigned i = 0; i < ES_CACHE_SLOTS; i++)
        if (t->slot[i].count) es_publish(&t->slot[i]);
}

static void es_thread_exit(void *arg) {
    es_thread *t = arg;
    int saved = es_depth;
    es_depth = 1;
    if (es_g.state == ES_ACTIVE) es_thread_flush(t);
    es_tls = NULL;
    es_depth = saved;
    munmap(t, sizeof *t);
}

static void *es_flusher(void *arg) {
    (void)arg;
    es_depth = 1; /* nothing this thread does is the application's */
    struct timespec ts = {(time_t)(es_g.flush_ns / 1000000000ull),
                          (long)(es_g.flush_ns % 1000000000ull)};
    for (;;) {
        while (nanosleep(&ts, NULL) != 0 && errno == EINTR) {
        }
        if (es_g.state != ES_ACTIVE) return NULL;
        __atomic_fetch_add(&es_g.epoch, 1, __ATOMIC_RELEASE);
        es_emit_tick(0);
    }
}

/* A decimal integer in [low, high] from the environment, else `fallback` and a line on
 * stderr.  Digits only: strtoull alone would take "-1" as 2^64 - 1. */
static uint64_t es_env_u64(const char *name, uint64_t fallback, uint64_t low, uint64_t high) {
    const char *s = getenv(name);
    if (!s || !*s) return fallback;
    char *end = NULL;
    unsigned long long v = 0;
    int saved = errno;
    errno = 0;
    if (*s >= '0' && *s <= '9') v = strtoull(s, &end, 10);
    int bad = !end || *end || errno == ERANGE || v < low || v > high;
    errno = saved;
    if (bad) {
        es_warn("elastico-shim: ignoring %s=%.200s (need an integer from %llu to %llu)\n", name, s,
                (unsigned long long)low, (unsigned long long)high);
        return fallback;
    }
    return v;
}

static const char *es_dir(void) {
    const char *d = getenv("ELASTICO_SHIM_DIR");
    if (d && *d) return d;
    struct stat st;
    if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) && access("/dev/shm", W_OK) == 0)
        return "/dev/shm";
    return "/tmp";
}

/* This process's start time in clock ticks after boot (/proc/self/stat, field 22): an
 * exec keeps it, a later process given the same pid has another.  0 when unknown. */
static uint64_t es_process_start_ticks(void) {
    char buf[1024];
    int fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the end of field 2, the command, which may hold ") " */
    for (int field = 2; p && field < 22; field++) p = strchr(p + 1, ' ');
    if (!p) return 0;
    int saved = errno;
    uint64_t ticks = strtoull(p + 1, NULL, 10);
    errno = saved;
    return ticks;
}

/* Whether the ring file open at `fd` is one an earlier image of this same process left
 * (it exec'd): of this layout and size, this pid and this process's start time. */
static int es_ring_is_ours(int fd, uint64_t bytes, uint64_t capacity, uint64_t started) {
    es_header h;
    struct stat st;
    if (!started || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        (uint64_t)st.st_size != bytes || pread(fd, &h, sizeof h, 0) != (ssize_t)sizeof h)
        return 0;
    return h.magic == ES_MAGIC && h.version == ES_LAYOUT_VERSION &&
           h.record_size == ES_RECORD_SIZE && h.header_size == ES_HEADER_SIZE &&
           h.capacity == capacity && h.buffer_bytes == bytes && h.pid == (uint64_t)getpid() &&
           h.process_start_ticks == started && h.tail <= h.head && h.head - h.tail <= capacity;
}

/* Whether every record between tail and head was committed: a writer the exec ended
 * between reserving a slot and committing it leaves a gap no reader would ever pass. */
static int es_ring_committed(const es_header *h, const es_record *ring, uint64_t capacity) {
    for (uint64_t p = h->tail; p != h->head; p++)
        if (ring[p % capacity].seq != p + 1) return 0;
    return 1;
}

/* The header of a new ring, whose file is all zeros. */
static void es_ring_start(es_header *h, uint64_t bytes, uint64_t started) {
    h->version = ES_LAYOUT_VERSION;
    h->record_size = ES_RECORD_SIZE;
    h->header_size = ES_HEADER_SIZE;
    h->capacity = es_g.capacity;
    h->pid = (uint64_t)getpid();
    h->process_start_ticks = started;
    h->start_realtime_ns = es_realtime_ns();
    h->start_monotonic_ns = es_monotonic_ns();
    h->buffer_bytes = bytes;
    __atomic_store_n(&h->magic, ES_MAGIC, __ATOMIC_RELEASE); /* readers wait for this */
}

/* Whether ELASTICO_SHIM_DISABLE makes the shim a pure pass-through: any value but an
 * empty one or a switch written as off (0, false, no, off, in any case), which a chart or
 * a user writes as readily as 0 and must not turn profiling off. */
static int es_env_disabled(void) {
    const char *v = getenv("ELASTICO_SHIM_DISABLE");
    if (!v || !*v)
        return 0;
    static const char *const off[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++)
        if (strcasecmp(v, off[i]) == 0)
            return 0;
    return 1;
}

/* Mark the ring this process's own (es_ring_mine): a page of its own, wiped in children
 * that do not share its memory, mapped once (a forked child's is already zero); NULL
 * where the kernel cannot wipe it, and the pid is compared instead.  ES_NO_WIPEONFORK
 * builds the shim as it runs on such a kernel (tests/test_shim_interpose.py). */
static void es_mark_mine(void) {
    if (!es_g.mine) {
        long page = sysconf(_SC_PAGESIZE);
        size_t bytes = page > 0 ? (size_t)page : 4096;
        void *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        int wiped = 0;
#if defined(MADV_WIPEONFORK) && !defined(ES_NO_WIPEONFORK)
        wiped = m != MAP_FAILED && madvise(m, bytes, MADV_WIPEONFORK) == 0;
#endif
        if (wiped)
            es_g.mine = m;
        else if (m != MAP_FAILED)
            munmap(m, bytes);
    }
    if (es_g.mine) __atomic_store_n(es_g.mine, 1, __ATOMIC_RELAXED);
}

/* Called with es_g.lock held. */
static void es_init_locked(void) {
    if (es_env_disabled()) {
        es_g.state = ES_DISABLED;
        return;
    }
    uint64_t bytes = es_env_u64("ELASTICO_SHIM_BUFFER_BYTES", ES_DEFAULT_BUFFER,
                                ES_HEADER_SIZE + 16 * ES_RECORD_SIZE, ES_MAX_BUFFER);
    uint64_t capacity = (bytes - ES_HEADER_SIZE) / ES_RECORD_SIZE;
    bytes = ES_HEADER_SIZE + capacity * ES_RECORD_SIZE;
    uint64_t flush_ms =
        es_env_u64("ELASTICO_SHIM_FLUSH_MS", ES_DEFAULT_FLUSH_MS, 10, ES_MAX_FLUSH_MS);

    const char *dir = es_dir();
    int n = snprintf(es_g.path, sizeof es_g.path, "%s/elastico-shim-%ld.ring", dir,
                     (long)getpid());
    if (n < 0 || (size_t)n >= sizeof es_g.path) { /* never a ring under a name cut short */
        es_warn("elastico-shim: ring directory %.200s... is too long; profiling is off\n", dir);
        es_g.path[0] = '\0';
        es_g.state = ES_DISABLED;
        return;
    }
    /* An exec keeps the pid, so the ring an earlier image of this process left is here:
     * it is continued (counters, records and flush numbers go on, the agent sees one
     * process).  Any other file under the name is replaced by a new one, never truncated
     * in place: another live process may map it (two containers of a pod, each pid 1 of
     * its own pid namespace, share /dev/shm), and cutting it under that mapping kills
     * that process with SIGBUS; a hard link's other names keep their contents too.
     * O_NOFOLLOW: in a directory other users share (/dev/shm, /tmp), a symbolic link
     * planted under the ring's name is not followed, and profiling is off. */
    uint64_t started = es_process_start_ticks();
    int fd = open(es_g.path, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    int continued = fd >= 0 && es_ring_is_ours(fd, bytes, capacity, started);
    if (!continued && (fd >= 0 || errno != ELOOP)) {
        if (fd >= 0) close(fd);
        fd = -1;
        if (unlink(es_g.path) == 0 || errno == ENOENT)
            fd = open(es_g.path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    }
    void *map = MAP_FAILED;
    int err = errno;
    /* Growing a file past the file-size limit (ulimit -f) raises SIGXFSZ, which ends the
     * workload: a ring that would cross it is not started. */
    struct rlimit fsize;
    if (fd >= 0 && !continued && getrlimit(RLIMIT_FSIZE, &fsize) == 0 &&
        fsize.rlim_cur != RLIM_INFINITY && (uint64_t)fsize.rlim_cur < bytes) {
        close(fd);
        fd = -1;
        unlink(es_g.path);
        err = EFBIG;
    }
    /* Reserve every page now: a ring on a full tmpfs (a memory emptyDir at its
     * sizeLimit, /dev/shm) must fail here, not SIGBUS the workload at a later write. */
    if (fd >= 0 && (err = posix_fallocate(fd, 0, (off_t)bytes)) == 0) {
        map = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (map == MAP_FAILED) err = errno;
    }
    if (fd >= 0) close(fd);
    if (map == MAP_FAILED) {
        if (fd >= 0) unlink(es_g.path); /* give back what a partial reservation took */
        es_warn("elastico-shim: cannot map %s (%s); profiling is off\n", es_g.path,
                strerror(err));
        es_g.state = ES_DISABLED;
        return;
    }
    es_g.hdr = map;
    es_g.ring = (es_record *)((char *)map + ES_HEADER_SIZE);
    es_g.map_bytes = bytes;
    es_g.capacity = (uint32_t)capacity;
    es_g.flush_ns = flush_ms * 1000000ull;
    es_header *h = es_g.hdr;
    if (continued && !es_ring_committed(h, es_g.ring, capacity)) {
        memset(map, 0, bytes); /* as if truncated */
        continued = 0;
    }
    h->flush_interval_ns = es_g.flush_ns;
    if (continued) /* the earlier image's device memory went with it; the peak stays */
        __atomic_store_n(&h->live_bytes, 0, __ATOMIC_RELAXED);
    else
        es_ring_start(h, bytes, started);

    es_mark_mine();
    __atomic_store_n(&es_g.state, ES_ACTIVE, __ATOMIC_RELEASE);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the flusher never takes a signal */
    pthread_t tid;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&tid, &attr, es_flusher, NULL) != 0)
        es_warn("elastico-shim: no flusher thread; records publish on eviction/exit\n");
    pthread_attr_destroy(&attr);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

static int es_ready(void) {
    int s = __atomic_load_n(&es_g.state, __ATOMIC_ACQUIRE);
    if (ES_LIKELY(s != ES_UNINIT)) return s == ES_ACTIVE && es_ring_kept();
    int saved = errno;
    pthread_mutex_lock(&es_g.lock);
    if (es_g.state == ES_UNINIT) es_init_locked();
    pthread_mutex_unlock(&es_g.lock);
    errno = saved;
    return es_g.state == ES_ACTIVE;
}

static es_thread *es_thread_attach(void) {
    if (!es_ready()) return NULL;
    es_thread *t = mmap(NULL, sizeof *t, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                        -1, 0);
    if (t == MAP_FAILED) return NULL;
    t->epoch = __atomic_load_n(&es_g.epoch, __ATOMIC_ACQUIRE);
    if (es_g.key_ok) pthread_setspecific(es_g.thread_key, t); /* flush at thread exit */
    es_tls = t;
    return t;
}

#define ES_INLINE __attribute__((always_inline)) static inline

/* Inlined into each launch wrapper: an out-of-line call with eleven arguments costs more
 * than the aggregation itself. */
ES_INLINE void es_note_launch(uint8_t api, const void *func, uint32_t gx, uint32_t gy,
                                  uint32_t gz, uint32_t bx, uint32_t by, uint32_t bz,
                                  uint32_t smem, const void *stream, int failed) {
    es_thread *t = es_tls;
    if (ES_UNLIKELY(!t)) {
        if (__atomic_load_n(&es_g.state, __ATOMIC_RELAXED) >= ES_DISABLED) /* or ES_ORPHAN */
            return;
        int saved = errno;
        t = es_thread_attach();
        errno = saved;
        if (!t) return;
    }
    uint64_t epoch = __atomic_load_n(&es_g.epoch, __ATOMIC_RELAXED);
    if (ES_UNLIKELY(t->epoch != epoch)) {
        es_thread_flush(t);
        t->epoch = epoch;
    }
    const uint64_t w0 = (uint64_t)(uintptr_t)func, w1 = (uint64_t)(uintptr_t)stream;
    const uint64_t w2 = gx | (uint64_t)gy << 32, w3 = gz | (uint64_t)bx << 32;
    const uint64_t w4 = by | (uint64_t)bz << 32;
    const uint64_t w5 =
        smem | (uint64_t)api << 32 | (uint64_t)(failed ? ES_FLAG_ERROR : 0) << 40;
    uint64_t hash = (w0 ^ w1 * 0xc2b2ae3d27d4eb4full ^ w2 * 0x165667b19e3779f9ull ^ w3 ^
                     w4 * 0x27d4eb2f165667c5ull ^ w5) * 0x9e3779b97f4a7c15ull;
    es_slot *s = &t->slot[(hash >> 40) & (ES_CACHE_SLOTS - 1)];
    if (ES_LIKELY(s->count && s->w[0] == w0 && s->w[1] == w1 && s->w[2] == w2 &&
                  s->w[3] == w3 && s->w[4] == w4 && s->w[5] == w5)) {
        s->count++;
        return;
    }
    if (s->count) es_publish(s);
    s->w[0] = w0;
    s->w[1] = w1;
    s->w[2] = w2;
    s->w[3] = w3;
    s->w[4] = w4;
    s->w[5] = w5;
    __atomic_signal_fence(__ATOMIC_RELEASE); /* a slot with a count has its whole key */
    s->count = 1;
}

/* ---- allocation tracking ----------------------------------------------------------
 * Open addressing under alloc_lock; a freed entry becomes a tombstone until the next
 * rehash, which drops them and doubles the table when it is over half live, so a lookup
 * ends at an empty slot soon however many distinct addresses have come and gone.  At the
 * cap, further allocations go untracked: neither counted live nor sized at their free. */
static es_alloc_entry *es_alloc_find(uint64_t ptr, es_alloc_entry **insert) {
    es_alloc_entry *tomb = NULL;
    uint32_t mask = es_g.alloc_slots - 1;
    uint32_t i = (uint32_t)((ptr * 0x9e3779b97f4a7c15ull) >> 32) & mask;
    for (uint32_t n = 0; es_g.allocs && n <= mask; n++, i = (i + 1) & mask) {
        es_alloc_entry *e = &es_g.allocs[i];
        if (e->ptr == ptr) return e;
        if (e->ptr == 1 && !tomb) tomb = e;
        if (e->ptr == 0) {
            if (insert) *insert = tomb ? tomb : e;
            return NULL;
        }
    }
    if (insert) *insert = tomb;
    return NULL;
}

/* Make room for one more entry (at most three quarters of the slots used); 0 at the cap. */
static int es_alloc_reserve(void) {
    uint64_t slots = es_g.alloc_slots;
    if (slots && (es_g.alloc_used + 1) * 4 <= slots * 3) return 1;
    uint64_t want = slots ? slots : ES_ALLOC_MIN_SLOTS;
    while ((es_g.alloc_live + 1) * 2 > want && want < ES_ALLOC_MAX_SLOTS) want *= 2;
    if ((es_g.alloc_live + 1) * 4 > want * 3) return 0;
    es_alloc_entry *old = es_g.allocs;
    es_alloc_entry *m = mmap(NULL, want * sizeof *m, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return 0;
    es_g.allocs = m;
    es_g.alloc_slots = (uint32_t)want;
    es_g.alloc_used = es_g.alloc_live;
    for (uint64_t i = 0; i < slots; i++) {
        es_alloc_entry *slot = NULL;
        if (old[i].ptr > 1 && !es_alloc_find(old[i].ptr, &slot) && slot) *slot = old[i];
    }
    if (old) munmap(old, slots * sizeof *old);
    return 1;
}

static void es_note_alloc(uint8_t api, uint64_t ptr, uint64_t size, const void *stream,
                          int failed) {
    if (!es_ready()) return;
    es_header *h = es_g.hdr;
    if (failed) {
        es_add(&h->alloc_failures, 1);
    } else {
        es_add(&h->allocs, 1);
        es_add(&h->alloc_bytes, size);
        pthread_mutex_lock(&es_g.alloc_lock);
        es_alloc_entry *slot = NULL, *e = ptr > 1 ? es_alloc_find(ptr, NULL) : NULL;
        if (e) {
            __atomic_sub_fetch(&h->live_bytes, e->size, __ATOMIC_RELAXED); /* no free seen */
        } else if (ptr > 1 && es_alloc_reserve() && !es_alloc_find(ptr, &slot) && slot) {
            if (slot->ptr == 0) es_g.alloc_used++;
            es_g.alloc_live++;
            e = slot;
            e->ptr = ptr;
        }
        if (e) {
            e->size = size;
            uint64_t live = __atomic_add_fetch(&h->live_bytes, size, __ATOMIC_RELAXED);
            if (live > h->peak_bytes) __atomic_store_n(&h->peak_bytes, live, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&es_g.alloc_lock);
    }
    es_emit(ES_KIND_ALLOC, api, failed ? ES_FLAG_ERROR : 0, 0, ptr, (uint64_t)(uintptr_t)stream,
            size, NULL, NULL);
}

static void es_note_free(uint8_t api, uint64_t ptr, const void *stream, int failed) {
    if (!ptr || !es_ready()) return; /* cudaFree(0) only initialises the context */
    es_header *h = es_g.hdr;
    uint64_t size = 0;
    uint16_t flags = failed ? ES_FLAG_ERROR : 0;
    if (!failed) {
        es_add(&h->frees, 1);
        pthread_mutex_lock(&es_g.alloc_lock);
        es_alloc_entry *e = es_alloc_find(ptr, NULL);
        if (e) {
            size = e->size;
            e->ptr = 1;
            es_g.alloc_live--;
            __atomic_sub_fetch(&h->live_bytes, size, __ATOMIC_RELAXED);
        }
        pthread_mutex_unlock(&es_g.alloc_lock);
        if (!e) {
            flags |= ES_FLAG_SIZE_UNKNOWN;
            es_add(&h->untracked_frees, 1);
        }
    }
    es_emit(ES_KIND_FREE, api, flags, 0, ptr, (uint64_t)(uintptr_t)stream, size, NULL, NULL);
}

static const uint8_t es_nccl_type_bytes[12] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static void es_note_collective(uint8_t api, size_t count, ncclDataType_t type, int op,
                               int peer, const void *comm, const void *stream, int failed) {
    if (!es_ready()) return;
    uint32_t width = (unsigned)type < 12 ? es_nccl_type_bytes[type] : 0;
    es_add(&es_g.hdr->collectives, 1);
    es_add(&es_g.hdr->collective_bytes, (uint64_t)count * width);
    uint32_t grid[3] = {(uint32_t)peer, width, 0};
    es_emit(ES_KIND_COLLECTIVE, api, (uint16_t)((failed ? ES_FLAG_ERROR : 0) | (op << 8)),
            (uint32_t)type, (uint64_t)(uintptr_t)comm, (uint64_t)(uintptr_t)stream,
            (uint64_t)count, grid, NULL);
}

/* ---- wrappers --------------------------------------------------------------------- */
/* A missing real symbol gets the list's failure value; a nested call passes through. */
#define ES_PASS_OR_FAIL(next, fail, args)     \
    if (ES_UNLIKELY(!(next))) return fail; \
    if (es_depth) return (next) args

ES_INLINE CUresult es_launch(int api, es_fn_cuLaunchKernel *next, CUfunction f,
                                 unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned smem, CUstream s,
                                 void **params, void **extra) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND,
                    (f, gx, gy, gz, bx, by, bz, smem, s, params, extra));
    es_depth++;
    CUresult r = next(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
    es_note_launch((uint8_t)api, f, gx, gy, gz, bx, by, bz, smem, s, r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline CUresult es_launch_ex(int api, es_fn_cuLaunchKernelEx *next,
                                    const CUlaunchConfig *c, CUfunction f, void **params,
                                    void **extra) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (c, f, params, extra));
    es_depth++;
    CUresult r = next(c, f, params, extra);
    if (c)
        es_note_launch((uint8_t)api, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
                       c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream,
                       r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline cudaError_t es_rt_launch(int api, es_fn_cudaLaunchKernel *next, const void *func,
                                       dim3 g, dim3 b, void **args, size_t smem,
                                       cudaStream_t s) {
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound,
                    (func, g, b, args, smem, s));
    es_depth++;
    cudaError_t r = next(func, g, b, args, smem, s);
    es_note_launch((uint8_t)api, func, g.x, g.y, g.z, b.x, b.y, b.z, (uint32_t)smem, s,
                   r != cudaSuccess);
    es_depth--;
    return r;
}

static inline CUresult es_mem_alloc(es_fn_cuMemAlloc_v2 *next, CUdeviceptr *p, size_t n) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (p, n));
    es_depth++;
    CUresult r = next(p, n);
    es_note_alloc(ES_API_cuMemAlloc_v2, (r == CUDA_SUCCESS && p) ? *p : 0, n, NULL,
                  r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline CUresult es_mem_free(es_fn_cuMemFree_v2 *next, CUdeviceptr p) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (p));
    es_depth++;
    CUresult r = next(p);
    es_note_free(ES_API_cuMemFree_v2, p, NULL, r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

/* A physical allocation's handle as a key of the allocation map: the top bit set keeps it
 * apart from device pointers (user-space addresses), whose values a handle may take. */
static inline uint64_t es_vmm_key(CUmemGenericAllocationHandle h) {
    return h ? (uint64_t)h | (1ull << 63) : 0;
}

static inline CUresult es_mem_create(es_fn_cuMemCreate *next, CUmemGenericAllocationHandle *h,
                                     size_t n, const CUmemAllocationProp *prop,
                                     unsigned long long flags) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (h, n, prop, flags));
    es_depth++;
    CUresult r = next(h, n, prop, flags);
    es_note_alloc(ES_API_cuMemCreate, (r == CUDA_SUCCESS && h) ? es_vmm_key(*h) : 0, n, NULL,
                  r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline CUresult es_mem_release(es_fn_cuMemRelease *next, CUmemGenericAllocationHandle h) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (h));
    es_depth++;
    CUresult r = next(h);
    es_note_free(ES_API_cuMemRelease, es_vmm_key(h), NULL, r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

/* Used only in the exported wrappers, so the return address is the application's call. */
#define ES_NEXT(name) \
    ((es_fn_##name *)es_next(ES_API_##name, __builtin_return_address(0)))

ES_EXPORT CUresult cuLaunchKernel ES_LAUNCH_PARAMS {
    return es_launch(ES_API_cuLaunchKernel, ES_NEXT(cuLaunchKernel), f, gridDimX, gridDimY,
                     gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                     kernelParams, extra);
}

ES_EXPORT CUresult cuLaunchKernel_ptsz ES_LAUNCH_PARAMS {
    return es_launch(ES_API_cuLaunchKernel_ptsz, ES_NEXT(cuLaunchKernel_ptsz), f, gridDimX,
                     gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                     hStream, kernelParams, extra);
}

ES_EXPORT CUresult cuLaunchKernelEx ES_LAUNCH_EX_PARAMS {
    return es_launch_ex(ES_API_cuLaunchKernelEx, ES_NEXT(cuLaunchKernelEx), config, f,
                        kernelParams, extra);
}

ES_EXPORT CUresult cuLaunchKernelEx_ptsz ES_LAUNCH_EX_PARAMS {
    return es_launch_ex(ES_API_cuLaunchKernelEx_ptsz, ES_NEXT(cuLaunchKernelEx_ptsz), config, f,
                        kernelParams, extra);
}

ES_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    return es_mem_alloc(ES_NEXT(cuMemAlloc_v2), dptr, bytesize);
}

ES_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr) {
    return es_mem_free(ES_NEXT(cuMemFree_v2), dptr);
}

ES_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                               const CUmemAllocationProp *prop, unsigned long long flags) {
    return es_mem_create(ES_NEXT(cuMemCreate), handle, size, prop, flags);
}

ES_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle) {
    return es_mem_release(ES_NEXT(cuMemRelease), handle);
}

/* The runtime launches that take (function, grid, block, args, shared memory, stream):
 * cudaLaunchKernel, nvcc 13's __cudaLaunchKernel and the cooperative launch, each also
 * in its per-thread-default-stream variant. */
#define ES_RT_LAUNCH_WRAP(name)                                                           \
    ES_EXPORT cudaError_t name ES_RT_LAUNCH_PARAMS {                                      \
        return es_rt_launch(ES_API_##name, ES_NEXT(name), func, gridDim, blockDim, args,  \
                            sharedMem, stream);                                           \
    }
ES_RT_LAUNCH_WRAP(cudaLaunchKernel)
ES_RT_LAUNCH_WRAP(cudaLaunchKernel_ptsz)
ES_RT_LAUNCH_WRAP(__cudaLaunchKernel)
ES_RT_LAUNCH_WRAP(__cudaLaunchKernel_ptsz)
ES_RT_LAUNCH_WRAP(cudaLaunchCooperativeKernel)
ES_RT_LAUNCH_WRAP(cudaLaunchCooperativeKernel_ptsz)

ES_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size) {
    es_fn_cudaMalloc *next = ES_NEXT(cudaMalloc);
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (devPtr, size));
    es_depth++;
    cudaError_t r = next(devPtr, size);
    es_note_alloc(ES_API_cudaMalloc, (r == cudaSuccess && devPtr) ? (uintptr_t)*devPtr : 0,
                  size, NULL, r != cudaSuccess);
    es_depth--;
    return r;
}

ES_EXPORT cudaError_t cudaFree(void *devPtr) {
    es_fn_cudaFree *next = ES_NEXT(cudaFree);
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (devPtr));
    es_depth++;
    cudaError_t r = next(devPtr);
    es_note_free(ES_API_cudaFree, (uintptr_t)devPtr, NULL, r != cudaSuccess);
    es_depth--;
    return r;
}

static inline cudaError_t es_malloc_async(int api, es_fn_cudaMallocAsync *next, void **devPtr,
                                          size_t size, cudaStream_t hStream) {
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (devPtr, size, hStream));
    es_depth++;
    cudaError_t r = next(devPtr, size, hStream);
    es_note_alloc((uint8_t)api, (r == cudaSuccess && devPtr) ? (uintptr_t)*devPtr : 0, size,
                  hStream, r != cudaSuccess);
    es_depth--;
    return r;
}

static inline cudaError_t es_free_async(int api, es_fn_cudaFreeAsync *next, void *devPtr,
                                        cudaStream_t hStream) {
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (devPtr, hStream));
    es_depth++;
    cudaError_t r = next(devPtr, hStream);
    es_note_free((uint8_t)api, (uintptr_t)devPtr, hStream, r != cudaSuccess);
    es_depth--;
    return r;
}

ES_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t hStream) {
    return es_malloc_async(ES_API_cudaMallocAsync, ES_NEXT(cudaMallocAsync), devPtr, size,
                           hStream);
}

ES_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t hStream) {
    return es_free_async(ES_API_cudaFreeAsync, ES_NEXT(cudaFreeAsync), devPtr, hStream);
}

ES_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t hStream) {
    return es_malloc_async(ES_API_cudaMallocAsync_ptsz, ES_NEXT(cudaMallocAsync_ptsz), devPtr,
                           size, hStream);
}

ES_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t hStream) {
    return es_free_async(ES_API_cudaFreeAsync_ptsz, ES_NEXT(cudaFreeAsync_ptsz), devPtr,
                         hStream);
}

/* A graph replay is one record keyed by the executable graph and the stream, with no
 * dimensions: the agent's launch rate counts it as one launch per replay. */
static inline CUresult es_graph_launch(int api, es_fn_cuGraphLaunch *next, CUgraphExec g,
                                       CUstream s) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (g, s));
    es_depth++;
    CUresult r = next(g, s);
    es_note_launch((uint8_t)api, g, 0, 0, 0, 0, 0, 0, 0, s, r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline cudaError_t es_rt_graph_launch(int api, es_fn_cudaGraphLaunch *next,
                                             cudaGraphExec_t g, cudaStream_t s) {
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (g, s));
    es_depth++;
    cudaError_t r = next(g, s);
    es_note_launch((uint8_t)api, g, 0, 0, 0, 0, 0, 0, 0, s, r != cudaSuccess);
    es_depth--;
    return r;
}

ES_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream) {
    return es_graph_launch(ES_API_cuGraphLaunch, ES_NEXT(cuGraphLaunch), hGraphExec, hStream);
}

ES_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    return es_graph_launch(ES_API_cuGraphLaunch_ptsz, ES_NEXT(cuGraphLaunch_ptsz), hGraphExec,
                           hStream);
}

ES_EXPORT cudaError_t cudaGraphLaunch(cudaGraphExec_t graphExec, cudaStream_t stream) {
    return es_rt_graph_launch(ES_API_cudaGraphLaunch, ES_NEXT(cudaGraphLaunch), graphExec,
                              stream);
}

ES_EXPORT cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t graphExec, cudaStream_t stream) {
    return es_rt_graph_launch(ES_API_cudaGraphLaunch_ptsz, ES_NEXT(cudaGraphLaunch_ptsz),
                              graphExec, stream);
}

static inline CUresult es_coop_launch(int api, es_fn_cuLaunchCooperativeKernel *next,
                                      CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                      unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                      CUstream s, void **params) {
    ES_PASS_OR_FAIL(next, CUDA_ERROR_NOT_FOUND, (f, gx, gy, gz, bx, by, bz, smem, s, params));
    es_depth++;
    CUresult r = next(f, gx, gy, gz, bx, by, bz, smem, s, params);
    es_note_launch((uint8_t)api, f, gx, gy, gz, bx, by, bz, smem, s, r != CUDA_SUCCESS);
    es_depth--;
    return r;
}

static inline cudaError_t es_rt_launch_ex(int api, es_fn_cudaLaunchKernelExC *next,
                                          const cudaLaunchConfig_t *c, const void *func,
                                          void **args) {
    ES_PASS_OR_FAIL(next, cudaErrorSymbolNotFound, (c, func, args));
    es_depth++;
    cudaError_t r = next(c, func, args);
    if (c)
        es_note_launch((uint8_t)api, func, c->gridDim.x, c->gridDim.y, c->gridDim.z,
                       c->blockDim.x, c->blockDim.y, c->blockDim.z,
                       (uint32_t)c->dynamicSmemBytes, c->stream, r != cudaSuccess);
    es_depth--;
    return r;
}

ES_EXPORT cudaError_t cudaLaunchKernelExC ES_RT_LAUNCH_EX_PARAMS {
    return es_rt_launch_ex(ES_API_cudaLaunchKernelExC, ES_NEXT(cudaLaunchKernelExC), config, func,
                           args);
}

ES_EXPORT cudaError_t cudaLaunchKernelExC_ptsz ES_RT_LAUNCH_EX_PARAMS {
    return es_rt_launch_ex(ES_API_cudaLaunchKernelExC_ptsz, ES_NEXT(cudaLaunchKernelExC_ptsz),
                           config, func, args);
}

ES_EXPORT CUresult cuLaunchCooperativeKernel ES_COOP_PARAMS {
    return es_coop_launch(ES_API_cuLaunchCooperativeKernel, ES_NEXT(cuLaunchCooperativeKernel),
                          f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                          sharedMemBytes, hStream, kernelParams);
}

ES_EXPORT CUresult cuLaunchCooperativeKernel_ptsz ES_COOP_PARAMS {
    return es_coop_launch(ES_API_cuLaunchCooperativeKernel_ptsz,
                          ES_NEXT(cuLaunchCooperativeKernel_ptsz), f, gridDimX, gridDimY,
                          gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes, hStream,
                          kernelParams);
}

#define ES_NCCL_WRAP(name, params, args, count, type, op, peer)                      \
    ES_EXPORT ncclResult_t name params {                                              \
        es_fn_##name *next = ES_NEXT(name);                                           \
        ES_PASS_OR_FAIL(next, ncclInternalError, args);                         \
        es_depth++;                                                                   \
        ncclResult_t r = next args;                                                   \
        es_note_collective(ES_API_##name, count, type, op, peer, comm, stream,        \
                           r != ncclSuccess);                                         \
        es_depth--;                                                                   \
        return r;                                                                     \
    }

ES_NCCL_WRAP(ncclAllReduce,
             (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, op, comm, stream), count, datatype, op, -1)
ES_NCCL_WRAP(ncclAllGather,
             (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, sendcount, datatype, comm, stream), sendcount, datatype, 0, -1)
ES_NCCL_WRAP(ncclReduceScatter,
             (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,
              ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, recvcount, datatype, op, comm, stream), recvcount, datatype,
             op, -1)
ES_NCCL_WRAP(ncclBroadcast,
             (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
              int root, ncclComm_t comm, cudaStream_t stream),
             (sendbuff, recvbuff, count, datatype, root, comm, stream), count, datatype, 0, root)
ES_NCCL_WRAP(ncclSend,
             (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer,
              ncclComm_t comm, cudaStream_t stream),
             (sendbuff, count, datatype, peer, comm, stream), count, datatype, 0, peer)
ES_NCCL_WRAP(ncclRecv,
             (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
              cudaStream_t stream),
             (recvbuff, count, datatype, peer, comm, stream), count, datatype, 0, peer)

/* ---- cuGetProcAddress --------------------------------------------------------------
 * The runtime asks the driver for entry points by base name ("cuLaunchKernel"), with
 * flags choosing the per-thread-default-stream variant and cudaVersion choosing the ABI
 * version.  When the answer is one of our driver symbols, the caller gets a trampoline
 * that records and then calls exactly the pointer the driver (or the next hook) returned,
 * so the variant and version the caller asked for are preserved.  The first pointer seen
 * for a variant is kept; a different later answer is handed back unwrapped. */
#define ES_GPA_TARGETS(X)                                                    \
    X(0, cuLaunchKernel, "cuLaunchKernel", 0, 0)                             \
    X(1, cuLaunchKernel_ptsz, "cuLaunchKernel", 1, 0)                        \
    X(2, cuLaunchKernelEx, "cuLaunchKernelEx", 0, 0)                         \
    X(3, cuLaunchKernelEx_ptsz, "cuLaunchKernelEx", 1, 0)                    \
    X(4, cuMemAlloc_v2, "cuMemAlloc", -1, 3020)                              \
    X(5, cuMemFree_v2, "cuMemFree", -1, 3020)                                \
    X(6, cuGetProcAddress, "cuGetProcAddress", -1, -12000)                   \
    X(7, cuGetProcAddress_v2, "cuGetProcAddress", -1, 12000)                 \
    X(8, cuGraphLaunch, "cuGraphLaunch", 0, 0)                               \
    X(9, cuGraphLaunch_ptsz, "cuGraphLaunch", 1, 0)                          \
    X(10, cuLaunchCooperativeKernel, "cuLaunchCooperativeKernel", 0, 0)      \
    X(11, cuLaunchCooperativeKernel_ptsz, "cuLaunchCooperativeKernel", 1, 0) \
    X(12, cuMemCreate, "cuMemCreate", -1, 0)                                 \
    X(13, cuMemRelease, "cuMemRelease", -1, 0)
#define ES_GPA_COUNT 14
static void *es_gpa_next[ES_GPA_COUNT];

static void *es_gpa_wrap(const char *symbol, void *real, int version, int ptds);

/* Whether a lookup asked for the per-thread-default-stream variant: an explicit flag
 * decides, else the entry point's own default (per-thread for the _ptsz ones). */
static int es_gpa_ptds(cuuint64_t flags, int default_ptds) {
    if (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) return 1;
    if (flags & CU_GET_PROC_ADDRESS_LEGACY_STREAM) return 0;
    return default_ptds;
}

static CUresult es_gpa_t0 ES_LAUNCH_PARAMS {
    return es_launch(ES_API_cuLaunchKernel, (es_fn_cuLaunchKernel *)es_gpa_next[0], f, gridDimX,
                     gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                     hStream, kernelParams, extra);
}
static CUresult es_gpa_t1 ES_LAUNCH_PARAMS {
    return es_launch(ES_API_cuLaunchKernel_ptsz, (es_fn_cuLaunchKernel *)es_gpa_next[1], f,
                     gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ,
                     sharedMemBytes, hStream, kernelParams, extra);
}
static CUresult es_gpa_t2 ES_LAUNCH_EX_PARAMS {
    return es_launch_ex(ES_API_cuLaunchKernelEx, (es_fn_cuLaunchKernelEx *)es_gpa_next[2],
                        config, f, kernelParams, extra);
}
static CUresult es_gpa_t3 ES_LAUNCH_EX_PARAMS {
    return es_launch_ex(ES_API_cuLaunchKernelEx_ptsz, (es_fn_cuLaunchKernelEx *)es_gpa_next[3],
                        config, f, kernelParams, extra);
}
static CUresult es_gpa_t4(CUdeviceptr *dptr, size_t bytesize) {
    return es_mem_alloc((es_fn_cuMemAlloc_v2 *)es_gpa_next[4], dptr, bytesize);
}
static CUresult es_gpa_t5(CUdeviceptr dptr) {
    return es_mem_free((es_fn_cuMemFree_v2 *)es_gpa_next[5], dptr);
}
static CUresult es_gpa_t6(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    es_fn_cuGetProcAddress *next = (es_fn_cuGetProcAddress *)es_gpa_next[6];
    CUresult r = next(symbol, pfn, version, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = es_gpa_wrap(symbol, *pfn, version, es_gpa_ptds(flags, 0));
    return r;
}
static CUresult es_gpa_t7(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) {
    es_fn_cuGetProcAddress_v2 *next = (es_fn_cuGetProcAddress_v2 *)es_gpa_next[7];
    CUresult r = next(symbol, pfn, version, flags, status);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = es_gpa_wrap(symbol, *pfn, version, es_gpa_ptds(flags, 0));
    return r;
}

static CUresult es_gpa_t8(CUgraphExec g, CUstream s) {
    return es_graph_launch(ES_API_cuGraphLaunch, (es_fn_cuGraphLaunch *)es_gpa_next[8], g, s);
}
static CUresult es_gpa_t9(CUgraphExec g, CUstream s) {
    return es_graph_launch(ES_API_cuGraphLaunch_ptsz, (es_fn_cuGraphLaunch *)es_gpa_next[9], g,
                           s);
}
static CUresult es_gpa_t10 ES_COOP_PARAMS {
    return es_coop_launch(ES_API_cuLaunchCooperativeKernel,
                          (es_fn_cuLaunchCooperativeKernel *)es_gpa_next[10], f, gridDimX,
                          gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                          hStream, kernelParams);
}
static CUresult es_gpa_t11 ES_COOP_PARAMS {
    return es_coop_launch(ES_API_cuLaunchCooperativeKernel_ptsz,
                          (es_fn_cuLaunchCooperativeKernel *)es_gpa_next[11], f, gridDimX,
                          gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes,
                          hStream, kernelParams);
}
static CUresult es_gpa_t12(CUmemGenericAllocationHandle *h, size_t n,
                           const CUmemAllocationProp *prop, unsigned long long flags) {
    return es_mem_create((es_fn_cuMemCreate *)es_gpa_next[12], h, n, prop, flags);
}
static CUresult es_gpa_t13(CUmemGenericAllocationHandle h) {
    return es_mem_release((es_fn_cuMemRelease *)es_gpa_next[13], h);
}

static void *const es_gpa_trampolines[ES_GPA_COUNT] = {
    (void *)es_gpa_t0, (void *)es_gpa_t1, (void *)es_gpa_t2, (void *)es_gpa_t3,
    (void *)es_gpa_t4, (void *)es_gpa_t5, (void *)es_gpa_t6, (void *)es_gpa_t7,
    (void *)es_gpa_t8, (void *)es_gpa_t9, (void *)es_gpa_t10, (void *)es_gpa_t11,
    (void *)es_gpa_t12, (void *)es_gpa_t13};

/* version rule: v > 0 means cudaVersion >= v, v < 0 means cudaVersion < -v, 0 any. */
static void *es_gpa_wrap(const char *symbol, void *real, int version, int ptds) {
    if (!symbol) return real;
#define ES_GPA_MATCH(i, api, base, want_ptds, vrule)                                         \
    if (strcmp(symbol, base) == 0 && ((want_ptds) < 0 || (want_ptds) == ptds) &&              \
        ((vrule) == 0 || ((vrule) > 0 && version >= (vrule)) ||                               \
         ((vrule) < 0 && version < -(vrule)))) {                                              \
        void *expected = NULL;                                                                \
        if (real == es_gpa_trampolines[i]) return real;                                       \
        if (!__atomic_compare_exchange_n(&es_gpa_next[i], &expected, real, 0,                 \
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE) &&               \
            expected != real)                                                                 \
            return real;                                                                      \
        return es_gpa_trampolines[i];                                                         \
    }
    ES_GPA_TARGETS(ES_GPA_MATCH)
#undef ES_GPA_MATCH
    return real;
}

ES_EXPORT CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion,
                                    cuuint64_t flags) {
    es_fn_cuGetProcAddress *next = ES_NEXT(cuGetProcAddress);
    if (ES_UNLIKELY(!next)) return CUDA_ERROR_NOT_FOUND;
    CUresult r = next(symbol, pfn, cudaVersion, flags);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = es_gpa_wrap(symbol, *pfn, cudaVersion, es_gpa_ptds(flags, 0));
    return r;
}

ES_EXPORT CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion,
                                       cuuint64_t flags,
                                       CUdriverProcAddressQueryResult *symbolStatus) {
    es_fn_cuGetProcAddress_v2 *next = ES_NEXT(cuGetProcAddress_v2);
    if (ES_UNLIKELY(!next)) return CUDA_ERROR_NOT_FOUND;
    CUresult r = next(symbol, pfn, cudaVersion, flags, symbolStatus);
    if (r == CUDA_SUCCESS && pfn && *pfn)
        *pfn = es_gpa_wrap(symbol, *pfn, cudaVersion, es_gpa_ptds(flags, 0));
    return r;
}

/* ---- cudaGetDriverEntryPoint* -------------------------------------------------------
 * The runtime answers these from the cuGetProcAddress it looked up in its own handle of
 * libcuda: the shim's wrapper when that lookup went through the shim's dlsym, else the
 * driver's own, so the pointer it hands out gets the treatment cuGetProcAddress's answers
 * get (one that is already a trampoline is handed back as it is).  The plain variants
 * look up at the runtime's own version (cudaRuntimeGetVersion); when that cannot be
 * asked, 12000, the version of the signatures hooked here (CUDA 11's had no
 * driverStatus). */
typedef cudaError_t es_fn_cudaRuntimeGetVersion(int *runtimeVersion);

static int es_runtime_version(const void *caller) {
    static int known;
    int version = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (version) return version;
    es_fn_cudaRuntimeGetVersion *get = es_lookup("cudaRuntimeGetVersion", caller);
    if (!get || get(&version) != cudaSuccess || version <= 0) version = 12000;
    __atomic_store_n(&known, version, __ATOMIC_RELAXED);
    return version;
}

/* `version` 0 means the runtime's own. */
static void es_entry_wrap(cudaError_t r, const char *symbol, void **funcPtr, int version,
                          unsigned long long flags, int ptsz, const void *caller) {
    if (r != cudaSuccess || !funcPtr || !*funcPtr) return;
    if (!version) version = es_runtime_version(caller);
    *funcPtr = es_gpa_wrap(symbol, *funcPtr, version, es_gpa_ptds(flags, ptsz));
}

#define ES_ENTRY_WRAP(name, params, args, version, ptsz)                                   \
    ES_EXPORT cudaError_t name params {                                                   \
        es_fn_##name *next = ES_NEXT(name);                                               \
        if (ES_UNLIKELY(!next)) return cudaErrorSymbolNotFound;                           \
        cudaError_t r = next args;                                                        \
        es_entry_wrap(r, symbol, funcPtr, version, flags, ptsz, __builtin_return_address(0)); \
        return r;                                                                         \
    }

ES_ENTRY_WRAP(cudaGetDriverEntryPoint, ES_ENTRY_PARAMS, ES_ENTRY_ARGS, 0, 0)
ES_ENTRY_WRAP(cudaGetDriverEntryPoint_ptsz, ES_ENTRY_PARAMS, ES_ENTRY_ARGS, 0, 1)
ES_ENTRY_WRAP(cudaGetDriverEntryPointByVersion, ES_ENTRY_BY_VERSION_PARAMS,
              ES_ENTRY_BY_VERSION_ARGS, (int)cudaVersion, 0)
ES_ENTRY_WRAP(cudaGetDriverEntryPointByVersion_ptsz, ES_ENTRY_BY_VERSION_PARAMS,
              ES_ENTRY_BY_VERSION_ARGS, (int)cudaVersion, 1)

/* Compile-time consistency check: every listed symbol is defined with the listed type. */
#define ES_CHECK(name, ret, params, args, fail) \
    __attribute__((unused)) static es_fn_##name *const es_check_##name = name;
ES_HOOKED_SYMBOLS(ES_CHECK)
#undef ES_CHECK

/* ---- dlsym ---------------------------------------------------------------------------
 * Triton's kernel launcher (torch.compile's kernels, many of vLLM's), ctypes (vLLM's
 * pynccl and cudart wrappers, Numba) and cuda-python fetch driver, runtime and NCCL
 * functions themselves with dlsym on a handle of the library they opened, which answers
 * with the library's own function, past any preload.  The shim's dlsym answers such a
 * lookup with the shim's wrapper when the name is one the shim hooks and the handle's
 * answer is the very function that wrapper calls for this caller (a hook library's or
 * another copy's function of the same name is handed back as it is).  RTLD_DEFAULT and
 * RTLD_NEXT, whose answer depends on the caller's address, and every other name go on to
 * the real dlsym as a sibling call, so it sees the caller's own return address: no lock,
 * no allocation, one strcmp loop only for names starting like a hooked one.  dlvsym is
 * left alone: it is how the real dlsym is found, and nothing known fetches CUDA or NCCL
 * entry points with it. */
#ifdef ES_DLSYM_FIRST_VERSION
#if defined(__has_attribute)
#if __has_attribute(musttail)
#define ES_MUSTTAIL __attribute__((musttail))
#endif
#endif
#ifndef ES_MUSTTAIL
#define ES_MUSTTAIL /* -O2 makes it a sibling call (tests/test_shim_interpose.py checks) */
#endif

/* The shim's own wrappers, by hidden aliases: `&name` would be whichever definition the
 * dynamic linker binds first. */
#define ES_OWN(name, ret, params, args, fail) \
    extern es_fn_##name es_own_##name __attribute__((alias(#name), visibility("hidden")));
ES_HOOKED_SYMBOLS(ES_OWN)
#undef ES_OWN
static void *const es_own[ES_API_COUNT] = {
#define ES_OWN_ADDRESS(name, ret, params, args, fail) (void *)es_own_##name,
    ES_HOOKED_SYMBOLS(ES_OWN_ADDRESS)
#undef ES_OWN_ADDRESS
};

/* The index of a hooked name, else -1.  Every hooked name starts with cu, nc or __
 * (tests/test_shim_layout.py checks), which most names looked up at start-up do not. */
static inline int es_api_index(const char *name) {
    uint16_t start = name && name[0] ? (uint16_t)(name[0] | name[1] << 8) : 0;
    if (start != ('c' | 'u' << 8) && start != ('n' | 'c' << 8) && start != ('_' | '_' << 8))
        return -1;
    for (int i = 0; i < ES_API_COUNT; i++)
        if (strcmp(name, es_api_names[i]) == 0) return i;
    return -1;
}

/* What a handle's lookup of the hooked `api` gave (`found`) becomes: the shim's wrapper
 * when `found` is the real function the wrapper calls for `caller`.  Disabled, the shim
 * looks nothing up; a lookup is no launch, so no ring is started.  The lookups resolving
 * the real function may leave an error that dlerror() would report for a lookup that
 * succeeded. */
__attribute__((noinline)) static void *es_dlsym_answer(void *found, int api,
                                                       const void *caller) {
    if (!found || __atomic_load_n(&es_g.state, __ATOMIC_ACQUIRE) == ES_DISABLED ||
        es_env_disabled())
        return found;
    void *real = es_next(api, caller);
    dlerror();
    return real == found ? es_own[api] : found;
}

ES_EXPORT void *dlsym(void *handle, const char *name) {
    es_fn_dlsym *real = es_dlsym_next();
    if (ES_UNLIKELY(!real)) return NULL;
    int api = handle == RTLD_DEFAULT || handle == RTLD_NEXT ? -1 : es_api_index(name);
    if (ES_LIKELY(api < 0)) ES_MUSTTAIL return real(handle, name);
    return es_dlsym_answer(real(handle, name), api, __builtin_return_address(0));
}
#endif

/* ---- lifecycle: fork, thread exit, process exit, exec ----------------------------- */
/* From the prepare handler to the parent or child one the forking thread holds both
 * locks, and its reentrancy depth is raised: a CUDA call it makes in between (a signal
 * handler's, another library's fork handler's: those registered before the shim's run
 * inside the window) passes straight through, as a call made inside a wrapper does,
 * where it would wait for a lock its own thread holds (an allocation, the process's
 * first call) for good. */
static void es_fork_prepare(void) {
    pthread_mutex_lock(&es_g.lock);
    pthread_mutex_lock(&es_g.alloc_lock);
    es_depth++;
}

static void es_fork_parent(void) {
    es_depth--;
    pthread_mutex_unlock(&es_g.alloc_lock);
    pthread_mutex_unlock(&es_g.lock);
}

/* The child starts a ring of its own on its first call; nothing of the parent's pending
 * counts or allocations is attributed to it.  The forking thread's launch cache goes too:
 * only a thread without one attaches, and attaching is what starts the child's ring (a
 * cache kept here would aggregate the child's launches for no ring, and publish the
 * first one a slot evicts through the parent's unmapped header). */
static void es_fork_child(void) {
    pthread_mutex_init(&es_g.lock, NULL);
    pthread_mutex_init(&es_g.alloc_lock, NULL);
    es_depth--; /* the forking thread's, raised in es_fork_prepare */
    if (es_g.state == ES_ACTIVE || es_g.state == ES_ORPHAN) {
        munmap(es_g.hdr, es_g.map_bytes);
        es_g.hdr = NULL;
        es_g.ring = NULL;
        es_g.state = ES_UNINIT;
    }
    if (es_g.allocs) munmap(es_g.allocs, es_g.alloc_slots * sizeof(es_alloc_entry));
    es_g.allocs = NULL;
    es_g.alloc_slots = es_g.alloc_used = es_g.alloc_live = 0;
    es_g.epoch = 0;
    es_g.ended = 0;
    if (es_tls) {
        munmap(es_tls, sizeof *es_tls);
        es_tls = NULL;
        if (es_g.key_ok) pthread_setspecific(es_g.thread_key, NULL);
    }
}

/* Publish what the calling thread still aggregates, then a tick marked `flags`: at the
 * destructor, and before the process ends or replaces its image without it.  Only what a
 * forked child or a signal handler may do (atomics on the ring, clock_gettime, getpid):
 * no lock, which a fork may have left held, and no allocation.  The final tick is written
 * once (an atexit handler or a destructor may still call _exit); an exec's at each try,
 * since an exec that fails leaves the process running. */
static void es_flush_at_end(uint16_t flags) {
    if (__atomic_load_n(&es_g.state, __ATOMIC_ACQUIRE) != ES_ACTIVE) return;
    /* A vfork child (subprocess, posix_spawn's fallback) runs on in the parent's memory
     * until it execs or exits: the ring, the cache and the thread are the parent's. */
    if (es_g.hdr->pid != (uint64_t)getpid()) return;
    if ((flags & ES_FLAG_FINAL) && __atomic_exchange_n(&es_g.ended, 1, __ATOMIC_ACQ_REL))
        return;
    es_depth++;
    if (es_tls) es_thread_flush(es_tls);
    es_emit_tick(flags);
    es_depth--;
}

/* The real exit and exec calls, resolved in the constructor: a forked child that execs
 * or exits must not call dlsym, which may lock and allocate. */
enum {
#define ES_PROC_ENUM(name, ret, params, args) ES_PROC_##name,
    ES_PROCESS_HOOKS(ES_PROC_ENUM)
#undef ES_PROC_ENUM
    ES_PROC_COUNT
};
static const char *const es_proc_names[ES_PROC_COUNT] = {
#define ES_PROC_NAME(name, ret, params, args) #name,
    ES_PROCESS_HOOKS(ES_PROC_NAME)
#undef ES_PROC_NAME
};
static void *es_proc_real[ES_PROC_COUNT];

#define ES_PROC_TYPEDEF(name, ret, params, args) typedef ret es_fn_##name params;
ES_PROCESS_HOOKS(ES_PROC_TYPEDEF)
#undef ES_PROC_TYPEDEF
#define ES_PROC_DECLARE(name, ret, params, args) ES_EXPORT ret name params;
ES_PROCESS_HOOKS(ES_PROC_DECLARE)
#undef ES_PROC_DECLARE

static void es_proc_resolve(void) {
    for (int i = 0; i < ES_PROC_COUNT; i++)
        if (!es_proc_real[i]) es_proc_real[i] = es_sym(RTLD_NEXT, es_proc_names[i]);
}

/* The real call; looked up here only when the constructor has not run yet (a constructor
 * of another library that ends the process). */
static void *es_proc_next(int i) {
    if (ES_UNLIKELY(!es_proc_real[i])) es_proc_resolve();
    return es_proc_real[i];
}

/* Without a real _exit (none can be found only in a broken process) the process still
 * ends, by the system call.  Both calls take `int status`. */
#define ES_EXIT_WRAP(name, ret, params, args)                            \
    ES_EXPORT void name params {                                         \
        es_flush_at_end(ES_FLAG_FINAL);                                  \
        es_fn_##name *next = es_proc_next(ES_PROC_##name);               \
        if (ES_LIKELY(next != NULL)) next args;                          \
        syscall(SYS_exit_group, status);                                 \
        __builtin_unreachable();                                         \
    }
ES_EXIT_HOOKS(ES_EXIT_WRAP)
#undef ES_EXIT_WRAP

#define ES_EXEC_WRAP(name, ret, params, args)                            \
    ES_EXPORT int name params {                                          \
        es_fn_##name *next = es_proc_next(ES_PROC_##name);               \
        if (ES_UNLIKELY(!next)) {                                        \
            errno = ENOSYS;                                              \
            return -1;                                                   \
        }                                                                \
        es_flush_at_end(ES_FLAG_EXEC);                                   \
        return next args;                                                \
    }
ES_EXEC_HOOKS(ES_EXEC_WRAP)
#undef ES_EXEC_WRAP

/* The list forms: their arguments up to the NULL become the vector the vector form takes
 * (on the stack, as the C library does), and that form's wrapper publishes. */
static size_t es_list_size(const char *arg, va_list ap) {
    size_t n = 1;
    for (; arg; arg = va_arg(ap, const char *)) n++;
    return n;
}

/* Leaves `ap` after the NULL, where execle's environment follows. */
static void es_list_fill(char **argv, const char *arg, va_list *ap) {
    size_t i = 0;
    for (; arg; arg = va_arg(*ap, const char *)) argv[i++] = (char *)arg;
    argv[i] = NULL;
}

#define ES_LIST_DECLARE(name, vector) ES_EXPORT int name(const char *, const char *, ...);
ES_EXEC_LIST_FORMS(ES_LIST_DECLARE)
#undef ES_LIST_DECLARE

#define ES_LIST_VECTOR(argv, arg, ap)        \
    va_list ap, ap_size_;                    \
    va_start(ap, arg);                       \
    va_copy(ap_size_, ap);                   \
    char *argv[es_list_size(arg, ap_size_)]; \
    va_end(ap_size_);                        \
    es_list_fill(argv, arg, &ap)

ES_EXPORT int execl(const char *path, const char *arg, ...) {
    ES_LIST_VECTOR(argv, arg, ap);
    va_end(ap);
    return execv(path, argv);
}

ES_EXPORT int execle(const char *path, const char *arg, ...) {
    ES_LIST_VECTOR(argv, arg, ap);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}

ES_EXPORT int execlp(const char *file, const char *arg, ...) {
    ES_LIST_VECTOR(argv, arg, ap);
    va_end(ap);
    return execvp(file, argv);
}

/* The final flush at exit() runs as late as it can: after every destructor.  The
 * preloaded shim is no dependency of the workload's libraries, so the dynamic linker
 * finalises it before them (libcudart, libcuda, a framework's libraries), whose
 * destructors may still launch, allocate and free.  exit() runs its handlers last
 * registered first; the one that runs every destructor (_dl_fini) is registered by
 * __libc_start_main, after the constructors of preloaded and needed libraries ran, so a
 * handler the shim's constructor registers runs after it.  It is registered with no DSO
 * handle (atexit() from a library would tie it to the library's own finalisation), so it
 * must never point into an unloaded shim: the shim is linked -z nodelete (build.py).
 * Where the registration failed the destructor flushes instead.  A shim loaded with
 * dlopen once main runs (not how it is deployed) registers after _dl_fini, so its
 * handler runs before every destructor, whose launches are then all lost (as were
 * those of the ones finalised after it before). */
extern int __cxa_atexit(void (*fn)(void *), void *arg, void *dso_handle);
static int es_exit_late;

static void es_exit_handler(void *arg) {
    (void)arg;
    es_flush_at_end(ES_FLAG_FINAL);
}

__attribute__((constructor)) static void es_constructor(void) {
    es_g.key_ok = pthread_key_create(&es_g.thread_key, es_thread_exit) == 0;
    pthread_atfork(es_fork_prepare, es_fork_parent, es_fork_child);
    es_proc_resolve();
    es_exit_late = __cxa_atexit(es_exit_handler, NULL, NULL) == 0;
}

/* Threads still running at exit keep whatever their caches hold; joined threads and the
 * exiting thread have published everything. */
__attribute__((destructor)) static void es_destructor(void) {
    if (!es_exit_late) es_flush_at_end(ES_FLAG_FINAL);
}

/* ---- introspection for the decoder twin and the tests ---------------------------- */
ES_EXPORT const char *elastico_shim_layout(void) {
    static char text[4096];
    static int done;
    if (__atomic_load_n(&done, __ATOMIC_ACQUIRE)) return text;
    pthread_mutex_lock(&es_g.lock);
    if (!done) {
        size_t n = 0;
#define ES_PUT(...) n += (size_t)snprintf(text + n, sizeof text - n, __VA_ARGS__)
        ES_PUT("version=%d\nrecord=%d", ES_LAYOUT_VERSION, ES_RECORD_SIZE);
#define ES_RF(ctype, name, code) \
    ES_PUT(" %s:%s@%zu", #name, code, (size_t)__builtin_offsetof(es_record, name));
        ES_RECORD_FIELDS(ES_RF)
#undef ES_RF
        ES_PUT("\nheader=%d", ES_HEADER_SIZE);
#define ES_HF(ctype, name, code) \
    ES_PUT(" %s:%s@%zu", #name, code, (size_t)__builtin_offsetof(es_header, name));
        ES_HEADER_FIELDS(ES_HF)
#undef ES_HF
        ES_PUT("\nmagic=%u\napis=", ES_MAGIC);
        for (int i = 0; i < ES_API_COUNT; i++) ES_PUT("%s%s", i ? "," : "", es_api_names[i]);
        ES_PUT("\nkinds=");
#define ES_KP(name, value) ES_PUT("%s=%d,", #name, value);
        ES_KINDS(ES_KP)
#undef ES_KP
        text[n - 1] = '\n';
        ES_PUT("flags=");
#define ES_FP(name, value) ES_PUT("%s=%d,", #name, value);
        ES_FLAGS(ES_FP)
#undef ES_FP
        text[n - 1] = '\0';
#undef ES_PUT
        __atomic_store_n(&done, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&es_g.lock);
    return text;
}

/* Path of this process's ring ("" before the first hooked call or when disabled). */
ES_EXPORT const char *elastico_shim_ring_path(void) {
    return es_g.state == ES_ACTIVE ? es_g.path : "";
}
