/* Fake libcudart: reaches the driver the way CUDA 12 runtimes do, through
 * cuGetProcAddress_v2 for launches and through direct driver calls inside cudaMalloc /
 * cudaFree, so the shim's cuGetProcAddress hook and reentrancy guard are exercised. */
#include <pthread.h>
#include "hooks.h"

typedef CUresult launch_fn ES_LAUNCH_PARAMS;
static launch_fn *driver_launch[2];
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void) {
    CUdriverProcAddressQueryResult st;
    cuGetProcAddress_v2("cuLaunchKernel", (void **)&driver_launch[0], 12000, 0, &st);
    cuGetProcAddress_v2("cuLaunchKernel", (void **)&driver_launch[1], 12000,
                        CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, &st);
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
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s) {
    if (n > (1ull << 40)) return cudaErrorMemoryAllocation;
    *p = (void *)__atomic_add_fetch(&pool, 0x10000, __ATOMIC_RELAXED);
    return cudaSuccess;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s) { return cudaSuccess; }
