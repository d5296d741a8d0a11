/* Test program: the launch entry points besides cuLaunchKernel[Ex] and cudaLaunchKernel,
 * each CALLS times (default 100), checking every result.  Usage: launches [CALLS]
 *   __cudaLaunchKernel (nvcc 13's <<<...>>>)           f=0x9100
 *   __cudaLaunchKernel_ptsz                            f=0x9200
 *   cudaLaunchKernelExC                                f=0x9300
 *   cudaLaunchKernelExC_ptsz                           f=0x9400
 *   cudaLaunchCooperativeKernel                        f=0x9500
 *   cudaLaunchCooperativeKernel_ptsz                   f=0x9600
 *   cuLaunchCooperativeKernel                          f=0x9700
 *   cuLaunchCooperativeKernel_ptsz                     f=0x9800
 *   cudaGetDriverEntryPoint("cuLaunchCooperativeKernel") f=0x9900
 * all with grid=(4,2,1) block=(32,4,1) smem=256 stream=0x500.  Prints "OK <pid>". */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "hooks.h"
#include "check.h"

typedef CUresult coop_fn ES_COOP_PARAMS;

static int failures;

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 100;
    dim3 g = {4, 2, 1}, b = {32, 4, 1};
    cudaStream_t s = (cudaStream_t)0x500;
    void *args[1] = {(void *)0xc0ffee};
    cudaLaunchConfig_t c = {g, b, 256, s, NULL, 0};
    void *p = NULL;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointSymbolNotFound;
    CHECK(cudaGetDriverEntryPoint("cuLaunchCooperativeKernel", &p, cudaEnableDefault, &st),
          cudaSuccess);
    CHECK(st, cudaDriverEntryPointSuccess);
    for (int i = 0; i < calls; i++) {
        CHECK(__cudaLaunchKernel((const void *)0x9100, g, b, args, 256, s), cudaSuccess);
        CHECK(__cudaLaunchKernel_ptsz((const void *)0x9200, g, b, args, 256, s), cudaSuccess);
        CHECK(cudaLaunchKernelExC(&c, (const void *)0x9300, args), cudaSuccess);
        CHECK(cudaLaunchKernelExC_ptsz(&c, (const void *)0x9400, args), cudaSuccess);
        CHECK(cudaLaunchCooperativeKernel((const void *)0x9500, g, b, args, 256, s), cudaSuccess);
        CHECK(cudaLaunchCooperativeKernel_ptsz((const void *)0x9600, g, b, args, 256, s),
              cudaSuccess);
        CHECK(cuLaunchCooperativeKernel((CUfunction)0x9700, 4, 2, 1, 32, 4, 1, 256, s, args),
              CUDA_SUCCESS);
        CHECK(cuLaunchCooperativeKernel_ptsz((CUfunction)0x9800, 4, 2, 1, 32, 4, 1, 256, s, args),
              CUDA_SUCCESS);
        if (p)
            CHECK(((coop_fn *)p)((CUfunction)0x9900, 4, 2, 1, 32, 4, 1, 256, s, args),
                  CUDA_SUCCESS);
    }
    if (failures) return 1;
    printf("OK %ld\n", (long)getpid());
    return 0;
}
