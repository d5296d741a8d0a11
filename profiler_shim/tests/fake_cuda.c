/* Fake libcuda for tests: the real exported names and signatures, no GPU.
 * cuGetProcAddress hands out internal entry points (not the exported addresses), as a
 * driver or a hook further down the chain may, so the shim cannot rely on dlsym
 * pointers matching what the runtime receives. */
#include <string.h>
#include "hooks.h"
#include "fake_stats.h"

static struct fake_cuda_stats stats;

static CUresult launch(unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                       unsigned bz, unsigned smem) {
    __atomic_fetch_add(&stats.launch_calls, 1, __ATOMIC_RELAXED);
    if (gx == 0) return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&stats.launch_checksum,
                       (unsigned long long)gx * gy * gz * bx * by * bz + smem, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}

#define LAUNCH_PARAMS ES_LAUNCH_PARAMS
static CUresult impl_launch LAUNCH_PARAMS {
    return launch(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes);
}
static CUresult impl_launch_ex ES_LAUNCH_EX_PARAMS {
    if (!config) return CUDA_ERROR_INVALID_VALUE;
    return launch(config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->sharedMemBytes);
}
static CUresult impl_launch_coop ES_COOP_PARAMS {
    return launch(gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes);
}
/* A graph replay counts as a call whose checksum is the graph's handle. */
static CUresult impl_graph_launch(CUgraphExec g, CUstream s) {
    __atomic_fetch_add(&stats.launch_calls, 1, __ATOMIC_RELAXED);
    if (!g) return CUDA_ERROR_INVALID_VALUE;
    __atomic_fetch_add(&stats.launch_checksum, (unsigned long long)(uintptr_t)g, __ATOMIC_RELAXED);
    return CUDA_SUCCESS;
}
static CUresult impl_alloc(CUdeviceptr *dptr, size_t n) {
    __atomic_fetch_add(&stats.alloc_calls, 1, __ATOMIC_RELAXED);
    if (n > (1ull << 40)) return CUDA_ERROR_OUT_OF_MEMORY;
    unsigned long long k = __atomic_add_fetch(&stats.next_block, 1, __ATOMIC_RELAXED);
    *dptr = 0x7f0000000000ull + k * 0x1000000ull;
    return CUDA_SUCCESS;
}
static CUresult impl_free(CUdeviceptr p) {
    __atomic_fetch_add(&stats.free_calls, 1, __ATOMIC_RELAXED);
    return p ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
/* Physical allocations of the virtual memory API: handles take the values the device
 * pointers of impl_alloc take, as nothing in the real API keeps the two apart. */
static unsigned long long next_handle;
static CUresult impl_mem_create(CUmemGenericAllocationHandle *h, size_t n,
                                const CUmemAllocationProp *prop, unsigned long long flags) {
    __atomic_fetch_add(&stats.alloc_calls, 1, __ATOMIC_RELAXED);
    if (!h || n == 0 || n > (1ull << 40)) return CUDA_ERROR_INVALID_VALUE;
    *h = 0x7f0000000000ull + __atomic_add_fetch(&next_handle, 1, __ATOMIC_RELAXED) * 0x1000000ull;
    return CUDA_SUCCESS;
}
static CUresult impl_mem_release(CUmemGenericAllocationHandle h) {
    __atomic_fetch_add(&stats.free_calls, 1, __ATOMIC_RELAXED);
    return h ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult impl_gpa2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status);
static CUresult impl_gpa(const char *symbol, void **pfn, int version, cuuint64_t flags) {
    return impl_gpa2(symbol, pfn, version, flags, NULL);
}
static CUresult impl_gpa2(const char *symbol, void **pfn, int version, cuuint64_t flags,
                          CUdriverProcAddressQueryResult *status) {
    void *p = NULL;
    if (!strcmp(symbol, "cuLaunchKernel")) p = (void *)impl_launch;
    else if (!strcmp(symbol, "cuLaunchKernelEx")) p = (void *)impl_launch_ex;
    else if (!strcmp(symbol, "cuGraphLaunch")) p = (void *)impl_graph_launch;
    else if (!strcmp(symbol, "cuLaunchCooperativeKernel")) p = (void *)impl_launch_coop;
    else if (!strcmp(symbol, "cuMemAlloc")) p = (void *)impl_alloc;
    else if (!strcmp(symbol, "cuMemCreate")) p = (void *)impl_mem_create;
    else if (!strcmp(symbol, "cuMemRelease")) p = (void *)impl_mem_release;
    else if (!strcmp(symbol, "cuMemFree")) p = (void *)impl_free;
    else if (!strcmp(symbol, "cuGetProcAddress"))
        p = version >= 12000 ? (void *)impl_gpa2 : (void *)impl_gpa;
    if (status) *status = p ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    if (pfn) *pfn = p;
    return p ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuLaunchKernel LAUNCH_PARAMS { return impl_launch ES_LAUNCH_ARGS; }
CUresult cuLaunchKernel_ptsz LAUNCH_PARAMS { return impl_launch ES_LAUNCH_ARGS; }
CUresult cuLaunchKernelEx ES_LAUNCH_EX_PARAMS { return impl_launch_ex ES_LAUNCH_EX_ARGS; }
CUresult cuLaunchKernelEx_ptsz ES_LAUNCH_EX_PARAMS { return impl_launch_ex ES_LAUNCH_EX_ARGS; }
CUresult cuGraphLaunch(CUgraphExec g, CUstream s) { return impl_graph_launch(g, s); }
CUresult cuGraphLaunch_ptsz(CUgraphExec g, CUstream s) { return impl_graph_launch(g, s); }
CUresult cuLaunchCooperativeKernel ES_COOP_PARAMS { return impl_launch_coop ES_COOP_ARGS; }
CUresult cuLaunchCooperativeKernel_ptsz ES_COOP_PARAMS { return impl_launch_coop ES_COOP_ARGS; }
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t n) { return impl_alloc(dptr, n); }
CUresult cuMemFree_v2(CUdeviceptr p) { return impl_free(p); }
CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t n, const CUmemAllocationProp *prop,
                     unsigned long long flags) {
    return impl_mem_create(h, n, prop, flags);
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) { return impl_mem_release(h); }
CUresult cuGetProcAddress(const char *s, void **pfn, int v, cuuint64_t f) {
    return impl_gpa(s, pfn, v, f);
}
CUresult cuGetProcAddress_v2(const char *s, void **pfn, int v, cuuint64_t f,
                             CUdriverProcAddressQueryResult *st) {
    return impl_gpa2(s, pfn, v, f, st);
}
void fake_cuda_get_stats(struct fake_cuda_stats *out) { *out = stats; }
/* The fake runtime's private way to the driver's lookup (FAKE_CUDART_DRIVER=private),
 * standing in for cuGetExportTable's tables: a name no preload hooks. */
void *fake_cuda_private_gpa(void);
void *fake_cuda_private_gpa(void) { return (void *)impl_gpa2; }
