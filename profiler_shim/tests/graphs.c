/* Test program: CUDA graph replays through every way a program reaches them, each CALLS
 * times (default 100), checking every result.  Usage: graphs [CALLS]
 *   cudaGraphLaunch                                             graph=0x8100 stream=0x400
 *   cudaGraphLaunch_ptsz (--default-stream per-thread)           graph=0x8200 stream=0x400
 *   cuGraphLaunch                                               graph=0x8300 stream=0x400
 *   cuGraphLaunch_ptsz                                          graph=0x8400 stream=0x400
 *   cudaGetDriverEntryPoint("cuGraphLaunch")                    graph=0x8500 stream=0x400
 * then one cuGraphLaunch of a null graph, which the driver refuses (counted as an error).
 * Prints "OK <pid>". */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "hooks.h"
#include "check.h"

typedef CUresult graph_launch_fn(CUgraphExec, CUstream);

static int failures;

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 100;
    CUstream s = (CUstream)0x400;
    for (int i = 0; i < calls; i++) {
        CHECK(cudaGraphLaunch((cudaGraphExec_t)0x8100, s), cudaSuccess);
        CHECK(cudaGraphLaunch_ptsz((cudaGraphExec_t)0x8200, s), cudaSuccess);
        CHECK(cuGraphLaunch((CUgraphExec)0x8300, s), CUDA_SUCCESS);
        CHECK(cuGraphLaunch_ptsz((CUgraphExec)0x8400, s), CUDA_SUCCESS);
    }
    void *p = NULL;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPoint("cuGraphLaunch", &p, cudaEnableDefault, &st), cudaSuccess);
    CHECK(st, cudaDriverEntryPointSuccess);
    for (int i = 0; i < calls && p; i++)
        CHECK(((graph_launch_fn *)p)((CUgraphExec)0x8500, s), CUDA_SUCCESS);
    CHECK(cuGraphLaunch(NULL, s), CUDA_ERROR_INVALID_VALUE);
    if (failures) return 1;
    printf("OK %ld\n", (long)getpid());
    return 0;
}
