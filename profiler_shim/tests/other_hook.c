/* Another preload hook (standing in for e.g. HAMi-core from /etc/ld.so.preload): wraps
 * cuLaunchKernel and cudaMalloc with RTLD_NEXT and appends "launches mallocs" at exit to the
 * file named by OTHER_HOOK_OUT, so a test can check both hooks saw every call. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include "hooks.h"

static unsigned long long launches, mallocs;

CUresult cuLaunchKernel ES_LAUNCH_PARAMS {
    static CUresult (*next) ES_LAUNCH_PARAMS;
    if (!next) next = dlsym(RTLD_NEXT, "cuLaunchKernel");
    __atomic_fetch_add(&launches, 1, __ATOMIC_RELAXED);
    return next ES_LAUNCH_ARGS;
}
cudaError_t cudaMalloc(void **p, size_t n) {
    static cudaError_t (*next)(void **, size_t);
    if (!next) next = dlsym(RTLD_NEXT, "cudaMalloc");
    __atomic_fetch_add(&mallocs, 1, __ATOMIC_RELAXED);
    return next(p, n);
}
__attribute__((destructor)) static void report(void) {
    const char *out = getenv("OTHER_HOOK_OUT");
    FILE *f = out ? fopen(out, "a") : NULL;
    if (!f) return;
    fprintf(f, "%llu %llu\n", launches, mallocs);
    fclose(f);
}
