/* Test program: launches through driver functions fetched with the runtime's
 * cudaGetDriverEntryPoint* (as CUTLASS, Transformer Engine and PyTorch do), each CALLS
 * times (default 100), and checks every result.  Usage: entry_points [CALLS]
 *   cudaGetDriverEntryPoint("cuLaunchKernel", default)               f=0x7100
 *   cudaGetDriverEntryPoint_ptsz("cuLaunchKernel", default)          f=0x7200 (per-thread)
 *   cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", 12000)      f=0x7300
 *   cudaGetDriverEntryPointByVersion_ptsz("cuLaunchKernel", 12000)   f=0x7400 (per-thread)
 *   cudaGetDriverEntryPoint("cuGetProcAddress") -> "cuLaunchKernel"  f=0x7500
 * all with grid=(3,1,1) block=(96,1,1) smem=0 stream=0x300; then one cuMemAlloc(4096) and
 * cuMemFree fetched the same way, and a lookup of a symbol the driver lacks, whose
 * driverStatus must come back as the driver gave it.  Prints "OK <pid>". */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include "hooks.h"
#include "check.h"

typedef CUresult launch_fn ES_LAUNCH_PARAMS;
typedef CUresult launch_ex_fn ES_LAUNCH_EX_PARAMS;
typedef CUresult gpa_fn(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
typedef CUresult alloc_fn(CUdeviceptr *, size_t);
typedef CUresult free_fn(CUdeviceptr);

static int failures;

static void launch(launch_fn *fn, unsigned long f, int calls) {
    void *params[1] = {(void *)0xc0ffee};
    for (int i = 0; i < calls && fn; i++)
        CHECK(fn((CUfunction)f, 3, 1, 1, 96, 1, 1, 0, (CUstream)0x300, params, NULL),
              CUDA_SUCCESS);
}

int main(int argc, char **argv) {
    int calls = argc > 1 ? atoi(argv[1]) : 100;
    cudaDriverEntryPointQueryResult st = cudaDriverEntryPointVersionNotSufficent;
    void *p = NULL;

    CHECK(cudaGetDriverEntryPoint("cuLaunchKernel", &p, cudaEnableDefault, &st), cudaSuccess);
    CHECK(st, cudaDriverEntryPointSuccess);
    launch((launch_fn *)p, 0x7100, calls);

    CHECK(cudaGetDriverEntryPoint_ptsz("cuLaunchKernel", &p, cudaEnableDefault, &st),
          cudaSuccess);
    launch((launch_fn *)p, 0x7200, calls);

    CHECK(cudaGetDriverEntryPointByVersion("cuLaunchKernelEx", &p, 12000, cudaEnableDefault,
                                           NULL), cudaSuccess);
    CUlaunchConfig c = {3, 1, 1, 96, 1, 1, 0, (CUstream)0x300, NULL, 0};
    void *params[1] = {(void *)0xc0ffee};
    for (int i = 0; i < calls && p; i++)
        CHECK(((launch_ex_fn *)p)(&c, (CUfunction)0x7300, params, NULL), CUDA_SUCCESS);

    CHECK(cudaGetDriverEntryPointByVersion_ptsz("cuLaunchKernel", &p, 12000, cudaEnableDefault,
                                                &st), cudaSuccess);
    launch((launch_fn *)p, 0x7400, calls);

    gpa_fn *gpa = NULL;
    CHECK(cudaGetDriverEntryPoint("cuGetProcAddress", (void **)&gpa, cudaEnableDefault, &st),
          cudaSuccess);
    CHECK(gpa != NULL, 1);
    CUdriverProcAddressQueryResult dst = CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT;
    if (gpa) CHECK(gpa("cuLaunchKernel", &p, 12000, 0, &dst), CUDA_SUCCESS);
    CHECK(dst, CU_GET_PROC_ADDRESS_SUCCESS);
    launch((launch_fn *)p, 0x7500, calls);

    alloc_fn *alloc = NULL;
    free_fn *release = NULL;
    CHECK(cudaGetDriverEntryPoint("cuMemAlloc", (void **)&alloc, cudaEnableDefault, NULL),
          cudaSuccess);
    CHECK(cudaGetDriverEntryPoint("cuMemFree", (void **)&release, cudaEnableDefault, NULL),
          cudaSuccess);
    CUdeviceptr d = 0;
    if (alloc) CHECK(alloc(&d, 4096), CUDA_SUCCESS);
    if (release) CHECK(release(d), CUDA_SUCCESS);

    p = (void *)1;
    CHECK(cudaGetDriverEntryPoint("cuNoSuchFunction", &p, cudaEnableDefault, &st), cudaSuccess);
    CHECK(p == NULL, 1);
    CHECK(st, cudaDriverEntryPointSymbolNotFound);

    if (failures) return 1;
    printf("OK %d\n", (int)getpid());
    return 0;
}
