/* Test program: physical memory of the virtual memory management API beside ordinary
 * allocations, as PyTorch's expandable segments and vLLM's sleep mode use it.
 * Usage: vmm [COUNT] (default 8):
 *   COUNT cuMemCreate of 2 MiB each, called directly, and COUNT more through
 *   cudaGetDriverEntryPoint("cuMemCreate"); one cuMemAlloc_v2 of 4096 bytes whose pointer
 *   has the value of the first handle; prints "PEAK <pid>" and waits for a line on stdin;
 *   then releases every handle (half directly, half through the fetched cuMemRelease),
 *   one cuMemRelease(0) that the driver refuses, and prints "OK <pid>" with the
 *   allocation still live. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "hooks.h"
#include "check.h"

typedef CUresult create_fn(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                           unsigned long long);
typedef CUresult release_fn(CUmemGenericAllocationHandle);

static int failures;

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 8;
    CUmemGenericAllocationHandle *h = calloc(2 * (size_t)count, sizeof *h);
    void *create = NULL, *release = NULL;
    cudaDriverEntryPointQueryResult st;
    CHECK(cudaGetDriverEntryPoint("cuMemCreate", &create, cudaEnableDefault, &st), cudaSuccess);
    CHECK(cudaGetDriverEntryPoint("cuMemRelease", &release, cudaEnableDefault, &st),
          cudaSuccess);
    if (!h || !create || !release) return 1;
    for (int i = 0; i < count; i++) {
        CHECK(cuMemCreate(&h[i], 2u << 20, NULL, 0), CUDA_SUCCESS);
        CHECK(((create_fn *)create)(&h[count + i], 2u << 20, NULL, 0), CUDA_SUCCESS);
    }
    CUdeviceptr d = 0;
    CHECK(cuMemAlloc_v2(&d, 4096), CUDA_SUCCESS);
    CHECK(d == (CUdeviceptr)h[0], 1);
    printf("PEAK %ld\n", (long)getpid());
    fflush(stdout);
    char line[8];
    if (!fgets(line, sizeof line, stdin)) return 1;
    for (int i = 0; i < 2 * count; i++)
        CHECK(i % 2 ? ((release_fn *)release)(h[i]) : cuMemRelease(h[i]), CUDA_SUCCESS);
    CHECK(cuMemRelease(0), CUDA_ERROR_INVALID_VALUE);
    if (failures) return 1;
    printf("OK %ld\n", (long)getpid());
    return 0;
}
