/* Test program: ROUNDS times, allocates LIVE blocks of 1000 bytes with cudaMallocAsync
 * (every block at a new address: the fake runtime never reuses one), keeping all of them
 * live, then frees them all; then CHURN allocate-free pairs, each at a new address again.
 * Usage: allocs LIVE ROUNDS CHURN [ptsz]; with ptsz, through cudaMallocAsync_ptsz and
 * cudaFreeAsync_ptsz (what those names become in code built with --default-stream
 * per-thread).  Prints "OK <pid> <seconds>" when every call succeeded. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <string.h>
#include "hooks.h"

typedef cudaError_t malloc_fn(void **, size_t, cudaStream_t);
typedef cudaError_t free_fn(void *, cudaStream_t);

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    long live = atol(argv[1]), rounds = atol(argv[2]), churn = atol(argv[3]);
    int ptsz = argc > 4 && !strcmp(argv[4], "ptsz");
    malloc_fn *cudaMallocAsync_ = ptsz ? cudaMallocAsync_ptsz : cudaMallocAsync;
    free_fn *cudaFreeAsync_ = ptsz ? cudaFreeAsync_ptsz : cudaFreeAsync;
    void **blocks = calloc((size_t)live + 1, sizeof *blocks);
    cudaStream_t s = (cudaStream_t)0x400;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < live; i++)
            if (cudaMallocAsync_(&blocks[i], 1000, s) != cudaSuccess) return 1;
        for (long i = 0; i < live; i++)
            if (cudaFreeAsync_(blocks[i], s) != cudaSuccess) return 1;
    }
    for (long i = 0; i < churn; i++) {
        if (cudaMallocAsync_(&blocks[0], 1000, s) != cudaSuccess) return 1;
        if (cudaFreeAsync_(blocks[0], s) != cudaSuccess) return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("OK %d %.3f\n", (int)getpid(), (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    free(blocks);
    return 0;
}
