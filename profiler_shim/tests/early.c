/* Test library: one the shim is no dependency of, as libcudart, libcuda and a framework's
 * libraries are, so the dynamic linker initialises it before the preloaded shim and
 * finalises it after.  Linked into exits_early (exits.c).  By the environment:
 *   EARLY_DESTRUCTOR_LAUNCHES=N  its destructor launches N kernels of one key (f=0xd000,
 *                                grid=(3,1,1), block=(32,1,1), stream=0x700) and
 *                                allocates and frees 4096 bytes, as a library that
 *                                tears down at exit does
 *   EARLY_FORK_SIGNAL=1          its pthread_atfork prepare handler, registered before
 *                                the shim's and so run after it, raises SIGUSR1, whose
 *                                handler launches a kernel (f=0xd100) and allocates and
 *                                frees 4096 bytes: a signal the forking thread takes
 *                                while fork() is under way
 * A call that fails makes the process exit 3 at the end (the destructor's own: _exit). */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "hooks.h"

static int failed;

static void launch_and_allocate(CUfunction f, long launches) {
    for (long i = 0; i < launches; i++)
        if (cuLaunchKernel(f, 3, 1, 1, 32, 1, 1, 0, (CUstream)0x700, NULL, NULL) != CUDA_SUCCESS)
            failed = 1;
    CUdeviceptr p = 0;
    if (cuMemAlloc_v2(&p, 4096) != CUDA_SUCCESS || cuMemFree_v2(p) != CUDA_SUCCESS) failed = 1;
}

static void on_signal(int sig) { launch_and_allocate((CUfunction)0xd100, 1); }

static void prepare(void) { raise(SIGUSR1); }

__attribute__((constructor)) static void early_init(void) {
    const char *v = getenv("EARLY_FORK_SIGNAL");
    if (v && !strcmp(v, "1")) {
        signal(SIGUSR1, on_signal);
        pthread_atfork(prepare, NULL, NULL);
    }
}

__attribute__((destructor)) static void early_fini(void) {
    const char *v = getenv("EARLY_DESTRUCTOR_LAUNCHES");
    if (v) launch_and_allocate((CUfunction)0xd000, atol(v));
    if (failed) _exit(3);
}
