/* CHECK for the test programs: a call's result against the expected one, counted in the
 * program's own `failures` (atomically: the workload checks from several threads). */
#ifndef CHECK_H
#define CHECK_H
#include <stdio.h>

#define CHECK(expr, want)                                                               \
    do {                                                                                \
        long got_ = (long)(expr);                                                       \
        if (got_ != (long)(want)) {                                                     \
            fprintf(stderr, "%s:%d: %s returned %ld, expected %ld\n", __FILE__, __LINE__, \
                    #expr, got_, (long)(want));                                         \
            __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);                         \
        }                                                                               \
    } while (0)
#endif
