/* Fake libcudart: reaches the driver the way CUDA 12 and 13 runtimes do.  Launches and
 * graph replays go through driver entry points it fetched with the cuGetProcAddress_v2 it
 * looked up in its own handle of libcuda (dlopen + dlsym, as libcudart does), which the
 * shim's dlsym answers with the shim's wrapper; with FAKE_CUDART_DRIVER=private, through
 * a private export of the fake driver instead (standing in for cuGetExportTable's tables),
 * which no preloaded library sees: then only the runtime's exported launch functions can
 * be seen (on a real H200 with CUDA 13, not one of PyTorch's launches reached an
 * interposed cuLaunchKernel).  cudaMalloc / cudaFree call the driver directly, so the
 * shim's reentrancy guard is exercised.  cudaGetDriverEntryPoint* answer from that same
 * private cuGetProcAddress_v2. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include "hooks.h"

#define FAKE_CUDART_VERSION 12040

typedef CUresult gpa_fn(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);
static gpa_fn *driver_gpa;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

static void open_driver(void) {
    void *driver = dlopen("libcuda.so", RTLD_NOW | RTLD_NOLOAD);
    const char *way = getenv("FAKE_CUDART_DRIVER");
    if (driver && way && !strcmp(way, "private")) {
        typedef gpa_fn *private_gpa_fn(void);
        private_gpa_fn *private_gpa = (private_gpa_fn *)dlsym(driver, "fake_cuda_private_gpa");
        driver_gpa = private_gpa ? private_gpa() : NULL;
    } else if (driver) {
        driver_gpa = (gpa_fn *)dlsym(driver, "cuGetProcAddress_v2");
    }
}

/* The runtime's private table entry for `symbol` (per-thread variant when `ptsz`). */
static void *driver_entry(const char *symbol, int ptsz) {
    pthread_once(&driver_once, open_driver);
    void *p = NULL;
    CUdriverProcAddressQueryResult st;
    if (driver_gpa)
        driver_gpa(symbol, &p, 12000, ptsz ? CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM : 0,
                   &st);
    return p;
}

typedef CUresult launch_fn ES_LAUNCH_PARAMS;
static launch_fn *driver_launch[2];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void) {
    driver_launch[0] = (launch_fn *)driver_entry("cuLaunchKernel", 0);
    driver_launch[1] = (launch_fn *)driver_entry("cuLaunchKernel", 1);
}

static cudaError_t rt_launch(int ptsz, const void *func, dim3 g, dim3 b, void **args,
                             size_t smem, cudaStream_t s) {
    pthread_once(&once, resolve);
    CUresult r = driver_launch[ptsz]((CUfunction)func, g.x, g.y, g.z, b.x, b.y, b.z,
                                     (unsigned)smem, s, args, NULL);
    return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaLaunchKernel ES_RT_LAUNCH_PARAMS {
    return rt_launch(0, func, gridDim, blockDim, args, sharedMem, stream);
}
cudaError_t cudaLaunchKernel_ptsz ES_RT_LAUNCH_PARAMS {
    return rt_launch(1, func, gridDim, blockDim, args, sharedMem, stream);
}
/* nvcc 13's <<<...>>> and the extensible and cooperative launches, as the runtime makes
 * them: through the same driver entry points its cuGetProcAddress_v2 handed out. */
cudaError_t __cudaLaunchKernel ES_RT_LAUNCH_PARAMS {
    return rt_launch(0, func, gridDim, blockDim, args, sharedMem, stream);
}
cudaError_t __cudaLaunchKernel_ptsz ES_RT_LAUNCH_PARAMS {
    return rt_launch(1, func, gridDim, blockDim, args, sharedMem, stream);
}
static cudaError_t rt_launch_ex(int ptsz, const cudaLaunchConfig_t *c, const void *func,
                                void **args) {
    if (!c) return cudaErrorInvalidValue;
    return rt_launch(ptsz, func, c->gridDim, c->blockDim, args, c->dynamicSmemBytes, c->stream);
}
cudaError_t cudaLaunchKernelExC ES_RT_LAUNCH_EX_PARAMS { return rt_launch_ex(0, config, func, args); }
cudaError_t cudaLaunchKernelExC_ptsz ES_RT_LAUNCH_EX_PARAMS {
    return rt_launch_ex(1, config, func, args);
}
cudaError_t cudaLaunchCooperativeKernel ES_RT_LAUNCH_PARAMS {
    return rt_launch(0, func, gridDim, blockDim, args, sharedMem, stream);
}
cudaError_t cudaLaunchCooperativeKernel_ptsz ES_RT_LAUNCH_PARAMS {
    return rt_launch(1, func, gridDim, blockDim, args, sharedMem, stream);
}

typedef CUresult graph_launch_fn(CUgraphExec, CUstream);
static graph_launch_fn *driver_graph_launch[2];
static pthread_once_t graph_once = PTHREAD_ONCE_INIT;

static void resolve_graph(void) {
    driver_graph_launch[0] = (graph_launch_fn *)driver_entry("cuGraphLaunch", 0);
    driver_graph_launch[1] = (graph_launch_fn *)driver_entry("cuGraphLaunch", 1);
}

static cudaError_t rt_graph_launch(int ptsz, cudaGraphExec_t g, cudaStream_t s) {
    pthread_once(&graph_once, resolve_graph);
    return driver_graph_launch[ptsz](g, s) == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t g, cudaStream_t s) { return rt_graph_launch(0, g, s); }
cudaError_t cudaGraphLaunch_ptsz(cudaGraphExec_t g, cudaStream_t s) {
    return rt_graph_launch(1, g, s);
}
cudaError_t cudaMalloc(void **p, size_t n) {
    CUdeviceptr d = 0;
    CUresult r = cuMemAlloc_v2(&d, n);
    if (r != CUDA_SUCCESS) return cudaErrorMemoryAllocation;
    *p = (void *)d;
    return cudaSuccess;
}
cudaError_t cudaFree(void *p) {
    if (!p) return cudaSuccess;
    return cuMemFree_v2((CUdeviceptr)p) == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
static unsigned long long pool = 0x500000000000ull;
static cudaError_t malloc_async(void **p, size_t n) {
    if (n > (1ull << 40)) return cudaErrorMemoryAllocation;
    *p = (void *)__atomic_add_fetch(&pool, 0x10000, __ATOMIC_RELAXED);
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) { return malloc_async(p, n); }
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return cudaSuccess; }
cudaError_t cudaMallocAsync_ptsz(void **p, size_t n, cudaStream_t s) {
    return malloc_async(p, n);
}
cudaError_t cudaFreeAsync_ptsz(void *p, cudaStream_t s) { return cudaSuccess; }

cudaError_t cudaRuntimeGetVersion(int *runtimeVersion) {
    if (!runtimeVersion) return cudaErrorInvalidValue;
    *runtimeVersion = FAKE_CUDART_VERSION;
    return cudaSuccess;
}

static cudaError_t entry_point(const char *symbol, void **funcPtr, int version,
                               unsigned long long flags, int ptsz,
                               cudaDriverEntryPointQueryResult *driverStatus) {
    pthread_once(&driver_once, open_driver);
    if (!symbol || !funcPtr || !driver_gpa) return cudaErrorInvalidValue;
    if (ptsz && !(flags & (cudaEnableLegacyStream | cudaEnablePerThreadDefaultStream)))
        flags |= cudaEnablePerThreadDefaultStream;
    CUdriverProcAddressQueryResult status;
    CUresult r = driver_gpa(symbol, funcPtr, version, flags, &status);
    if (driverStatus) *driverStatus = (cudaDriverEntryPointQueryResult)status;
    /* the real runtime reports a symbol the driver lacks in driverStatus, not as an error */
    return r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_FOUND ? cudaSuccess : cudaErrorInvalidValue;
}

cudaError_t cudaGetDriverEntryPoint ES_ENTRY_PARAMS {
    return entry_point(symbol, funcPtr, FAKE_CUDART_VERSION, flags, 0, driverStatus);
}
cudaError_t cudaGetDriverEntryPoint_ptsz ES_ENTRY_PARAMS {
    return entry_point(symbol, funcPtr, FAKE_CUDART_VERSION, flags, 1, driverStatus);
}
cudaError_t cudaGetDriverEntryPointByVersion ES_ENTRY_BY_VERSION_PARAMS {
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, 0, driverStatus);
}
cudaError_t cudaGetDriverEntryPointByVersion_ptsz ES_ENTRY_BY_VERSION_PARAMS {
    return entry_point(symbol, funcPtr, (int)cudaVersion, flags, 1, driverStatus);
}
