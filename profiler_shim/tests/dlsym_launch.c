/* Test program: launches as Triton's launcher does (also ctypes and cuda-python): through
 * driver functions it looks up itself with dlsym on its own handle of libcuda.so.1, never
 * by name, each lookup checked with dlerror() as Triton checks it.  Usage:
 * dlsym_launch [CALLS [LIBRARY]]; CALLS (default 100) launches each of
 *   dlsym(handle, "cuLaunchKernel")                             f=0xa100
 *   dlsym(handle, "cuLaunchKernelEx")                           f=0xa200
 *   dlsym(handle, "cuGetProcAddress_v2") -> "cuLaunchKernel"    f=0xa300
 * all with grid=(5,1,1) block=(64,1,1) smem=0 stream=0x600.  Then: the fake driver saw
 * every launch (its fake_cuda_get_stats looked up the same way); a symbol the driver lacks
 * is NULL with an error; RTLD_DEFAULT and RTLD_NEXT find the driver from the caller's own
 * scope, as without a preload, when it was loaded before the program opened it (built as
 * a library with main=workload_main and loaded by local_loader, libcuda is in that
 * library's local scope only; built without libcuda, in no scope); LIBRARY, another library
 * defining cuLaunchKernel (a hook), gives back its own function.  Prints
 * "cuLaunchKernel <file of the function the lookup gave>", then "OK <pid>". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hooks.h"
#include "check.h"
#include "fake_stats.h"

typedef CUresult launch_fn ES_LAUNCH_PARAMS;
typedef CUresult launch_ex_fn ES_LAUNCH_EX_PARAMS;
typedef CUresult gpa_fn(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef void stats_fn(struct fake_cuda_stats *);

static int failures;

/* dlsym as Triton calls it: the error cleared first, checked after. */
static void *lookup(void *handle, const char *name) {
    dlerror();
    void *p = dlsym(handle, name);
    const char *error = dlerror();
    if (error) {
        fprintf(stderr, "dlsym(%s): %s\n", name, error);
        __atomic_fetch_add(&failures, 1, __ATOMIC_RELAXED);
    }
    return p;
}

static void launch(launch_fn *fn, unsigned long f, int calls) {
    void *params[1] = {(void *)0xc0ffee};
    for (int i = 0; i < calls && fn; i++)
        CHECK(fn((CUfunction)f, 5, 1, 1, 64, 1, 1, 0, (CUstream)0x600, params, NULL),
              CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 100;
    int linked = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD) != NULL;
    void *driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!driver) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    stats_fn *stats = (stats_fn *)lookup(driver, "fake_cuda_get_stats");
    struct fake_cuda_stats before = {0}, after = {0};
    if (stats) stats(&before);

    void *plain = lookup(driver, "cuLaunchKernel");
    Dl_info from = {0};
    printf("cuLaunchKernel %s\n", plain && dladdr(plain, &from) ? from.dli_fname : "?");
    launch((launch_fn *)plain, 0xa100, calls);

    launch_ex_fn *launch_ex = (launch_ex_fn *)lookup(driver, "cuLaunchKernelEx");
    CUlaunchConfig c = {5, 1, 1, 64, 1, 1, 0, (CUstream)0x600, NULL, 0};
    void *params[1] = {(void *)0xc0ffee};
    for (int i = 0; i < calls && launch_ex; i++)
        CHECK(launch_ex(&c, (CUfunction)0xa200, params, NULL), CUDA_SUCCESS);

    gpa_fn *gpa = (gpa_fn *)lookup(driver, "cuGetProcAddress_v2");
    void *p = NULL;
    if (gpa) CHECK(gpa("cuLaunchKernel", &p, 12000, 0, NULL), CUDA_SUCCESS);
    launch((launch_fn *)p, 0xa300, calls);

    if (stats) stats(&after);
    CHECK(after.launch_calls - before.launch_calls, 3 * calls);

    dlerror();
    CHECK(dlsym(driver, "cuNoSuchFunction") == NULL, 1);
    CHECK(dlerror() != NULL, 1);

    CHECK(dlsym(RTLD_DEFAULT, "fake_cuda_get_stats") == (void *)stats, linked);
    CHECK(dlsym(RTLD_NEXT, "fake_cuda_get_stats") == (void *)stats, linked);

    if (argc > 2) {
        void *other = dlopen(argv[2], RTLD_LAZY | RTLD_LOCAL);
        Dl_info at = {0};
        void *own = other ? lookup(other, "cuLaunchKernel") : NULL;
        CHECK(own && dladdr(own, &at) && at.dli_fname && !strcmp(at.dli_fname, argv[2]), 1);
    }

    if (failures) return 1;
    printf("OK %d\n", (int)getpid());
    return 0;
}
