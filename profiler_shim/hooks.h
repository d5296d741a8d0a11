/*
 * The one list of hooked symbols (STYLE habit 15).
 *
 * ES_HOOKED_SYMBOLS(X) expands X(name, return type, (parameters), (arguments), failure value)
 * once per interposed entry point.  Everything else reads this list:
 *   - shim.c: the API index enum (the record's `api` byte), the name table used to
 *     resolve the real symbol with dlsym(RTLD_NEXT), the function-pointer typedefs
 *     and a compile-time check that every exported wrapper has exactly this signature;
 *   - elastico_shim_layout(): the API names the Python decoder twin must agree with;
 *   - tests/test_shim_layout.py: the dynamic symbol table of the built library must
 *     export exactly these names (plus the elastico_shim_* introspection calls).
 * The failure value is returned only when the real symbol cannot be found at all
 * (the shim never invents a result for a call that reached the real library).
 *
 * Signatures are those of cuda.h (12.x), cuda_runtime_api.h and nccl.h; the minimal
 * type declarations below are ABI-compatible with those headers so that the shim
 * builds without a CUDA toolkit.
 */
#ifndef ELASTICO_SHIM_HOOKS_H
#define ELASTICO_SHIM_HOOKS_H

#include <stddef.h>
#include <stdint.h>

/* ---- cuda.h ---------------------------------------------------------------------- */
typedef enum cudaError_enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_FOUND = 500
} CUresult;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUgraphExec_st *CUgraphExec;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUmemAllocationProp_st CUmemAllocationProp;
typedef unsigned long long CUdeviceptr;
typedef uint64_t cuuint64_t;
typedef struct CUlaunchAttribute_st CUlaunchAttribute;
typedef struct CUlaunchConfig_st {
    unsigned int gridDimX, gridDimY, gridDimZ;
    unsigned int blockDimX, blockDimY, blockDimZ;
    unsigned int sharedMemBytes;
    CUstream hStream;
    CUlaunchAttribute *attrs;
    unsigned int numAttrs;
} CUlaunchConfig;
typedef enum CUdriverProcAddressQueryResult_enum {
    CU_GET_PROC_ADDRESS_SUCCESS = 0,
    CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
    CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2
} CUdriverProcAddressQueryResult;
#define CU_GET_PROC_ADDRESS_LEGACY_STREAM (1ULL << 0)
#define CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM (1ULL << 1)

/* ---- cuda_runtime_api.h ------------------------------------------------------------ */
typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorMemoryAllocation = 2,
    cudaErrorSymbolNotFound = 500
} cudaError_t;
typedef struct CUstream_st *cudaStream_t;
typedef struct CUgraphExec_st *cudaGraphExec_t;
typedef struct dim3 { unsigned int x, y, z; } dim3;
typedef struct cudaLaunchAttribute_st cudaLaunchAttribute;
typedef struct cudaLaunchConfig_st {
    dim3 gridDim;
    dim3 blockDim;
    size_t dynamicSmemBytes;
    cudaStream_t stream;
    cudaLaunchAttribute *attrs;
    unsigned int numAttrs;
} cudaLaunchConfig_t;
typedef enum cudaDriverEntryPointQueryResult {
    cudaDriverEntryPointSuccess = 0,
    cudaDriverEntryPointSymbolNotFound = 1,
    cudaDriverEntryPointVersionNotSufficent = 2 /* sic, as spelled in the header */
} cudaDriverEntryPointQueryResult;
#define cudaEnableDefault 0x0
#define cudaEnableLegacyStream 0x1
#define cudaEnablePerThreadDefaultStream 0x2

/* ---- nccl.h ------------------------------------------------------------------------ */
typedef enum { ncclSuccess = 0, ncclUnhandledCudaError = 1, ncclSystemError = 2,
               ncclInternalError = 3, ncclInvalidArgument = 4 } ncclResult_t;
typedef enum { ncclInt8 = 0, ncclUint8 = 1, ncclInt32 = 2, ncclUint32 = 3, ncclInt64 = 4,
               ncclUint64 = 5, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8,
               ncclBfloat16 = 9, ncclFloat8e4m3 = 10, ncclFloat8e5m2 = 11 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
typedef struct ncclComm *ncclComm_t;

/* ---- the list --------------------------------------------------------------------- */
#define ES_LAUNCH_PARAMS (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, \
    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, \
    unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
#define ES_LAUNCH_ARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, \
    sharedMemBytes, hStream, kernelParams, extra)
#define ES_LAUNCH_EX_PARAMS (const CUlaunchConfig *config, CUfunction f, void **kernelParams, \
    void **extra)
#define ES_LAUNCH_EX_ARGS (config, f, kernelParams, extra)
#define ES_RT_LAUNCH_PARAMS (const void *func, dim3 gridDim, dim3 blockDim, void **args, \
    size_t sharedMem, cudaStream_t stream)
#define ES_RT_LAUNCH_ARGS (func, gridDim, blockDim, args, sharedMem, stream)
#define ES_COOP_PARAMS (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, \
    unsigned int gridDimZ, unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ, \
    unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)
#define ES_COOP_ARGS (f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, \
    sharedMemBytes, hStream, kernelParams)
#define ES_RT_LAUNCH_EX_PARAMS (const cudaLaunchConfig_t *config, const void *func, void **args)
#define ES_RT_LAUNCH_EX_ARGS (config, func, args)
#define ES_ENTRY_PARAMS (const char *symbol, void **funcPtr, unsigned long long flags, \
    cudaDriverEntryPointQueryResult *driverStatus)
#define ES_ENTRY_ARGS (symbol, funcPtr, flags, driverStatus)
#define ES_ENTRY_BY_VERSION_PARAMS (const char *symbol, void **funcPtr, unsigned int cudaVersion, \
    unsigned long long flags, cudaDriverEntryPointQueryResult *driverStatus)
#define ES_ENTRY_BY_VERSION_ARGS (symbol, funcPtr, cudaVersion, flags, driverStatus)

#define ES_HOOKED_SYMBOLS(X)                                                                  \
    /* driver API: symbol lookup (CUDA 11.3+ runtimes reach the driver through it) */          \
    X(cuGetProcAddress, CUresult,                                                             \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),                     \
      (symbol, pfn, cudaVersion, flags), CUDA_ERROR_NOT_FOUND)                                 \
    X(cuGetProcAddress_v2, CUresult,                                                          \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                      \
       CUdriverProcAddressQueryResult *symbolStatus),                                          \
      (symbol, pfn, cudaVersion, flags, symbolStatus), CUDA_ERROR_NOT_FOUND)                   \
    /* driver API: kernel launches */                                                          \
    X(cuLaunchKernel, CUresult, ES_LAUNCH_PARAMS, ES_LAUNCH_ARGS, CUDA_ERROR_NOT_FOUND)        \
    X(cuLaunchKernel_ptsz, CUresult, ES_LAUNCH_PARAMS, ES_LAUNCH_ARGS, CUDA_ERROR_NOT_FOUND)   \
    X(cuLaunchKernelEx, CUresult, ES_LAUNCH_EX_PARAMS, ES_LAUNCH_EX_ARGS, CUDA_ERROR_NOT_FOUND) \
    X(cuLaunchKernelEx_ptsz, CUresult, ES_LAUNCH_EX_PARAMS, ES_LAUNCH_EX_ARGS,                 \
      CUDA_ERROR_NOT_FOUND)                                                                    \
    /* driver API: memory */                                                                   \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize),         \
      CUDA_ERROR_NOT_FOUND)                                                                    \
    X(cuMemFree_v2, CUresult, (CUdeviceptr dptr), (dptr), CUDA_ERROR_NOT_FOUND)                \
    /* runtime API */                                                                          \
    X(cudaLaunchKernel, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,                   \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaLaunchKernel_ptsz, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,              \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaMalloc, cudaError_t, (void **devPtr, size_t size), (devPtr, size),                   \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaFree, cudaError_t, (void *devPtr), (devPtr), cudaErrorSymbolNotFound)                \
    X(cudaMallocAsync, cudaError_t, (void **devPtr, size_t size, cudaStream_t hStream),        \
      (devPtr, size, hStream), cudaErrorSymbolNotFound)                                        \
    X(cudaFreeAsync, cudaError_t, (void *devPtr, cudaStream_t hStream), (devPtr, hStream),     \
      cudaErrorSymbolNotFound)                                                                 \
    /* NCCL collectives and point-to-point */                                                  \
    X(ncclAllReduce, ncclResult_t,                                                            \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,            \
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                  \
      (sendbuff, recvbuff, count, datatype, op, comm, stream), ncclInternalError)              \
    X(ncclAllGather, ncclResult_t,                                                            \
      (const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype,        \
       ncclComm_t comm, cudaStream_t stream),                                                  \
      (sendbuff, recvbuff, sendcount, datatype, comm, stream), ncclInternalError)              \
    X(ncclReduceScatter, ncclResult_t,                                                        \
      (const void *sendbuff, void *recvbuff, size_t recvcount, ncclDataType_t datatype,        \
       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream),                                  \
      (sendbuff, recvbuff, recvcount, datatype, op, comm, stream), ncclInternalError)          \
    X(ncclBroadcast, ncclResult_t,                                                            \
      (const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, int root,  \
       ncclComm_t comm, cudaStream_t stream),                                                  \
      (sendbuff, recvbuff, count, datatype, root, comm, stream), ncclInternalError)            \
    X(ncclSend, ncclResult_t,                                                                 \
      (const void *sendbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm, \
       cudaStream_t stream),                                                                   \
      (sendbuff, count, datatype, peer, comm, stream), ncclInternalError)                      \
    X(ncclRecv, ncclResult_t,                                                                 \
      (void *recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,       \
       cudaStream_t stream),                                                                   \
      (recvbuff, count, datatype, peer, comm, stream), ncclInternalError)                      \
    /* runtime API: driver entry points (CUDA 12 signatures; CUTLASS, Transformer Engine and   \
       PyTorch fetch driver functions, cuLaunchKernelEx among them, through these) */          \
    X(cudaGetDriverEntryPoint, cudaError_t, ES_ENTRY_PARAMS, ES_ENTRY_ARGS,                   \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaGetDriverEntryPoint_ptsz, cudaError_t, ES_ENTRY_PARAMS, ES_ENTRY_ARGS,              \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaGetDriverEntryPointByVersion, cudaError_t, ES_ENTRY_BY_VERSION_PARAMS,              \
      ES_ENTRY_BY_VERSION_ARGS, cudaErrorSymbolNotFound)                                       \
    X(cudaGetDriverEntryPointByVersion_ptsz, cudaError_t, ES_ENTRY_BY_VERSION_PARAMS,         \
      ES_ENTRY_BY_VERSION_ARGS, cudaErrorSymbolNotFound)                                       \
    /* runtime API: what cudaMallocAsync/cudaFreeAsync become under --default-stream per-thread */ \
    X(cudaMallocAsync_ptsz, cudaError_t, (void **devPtr, size_t size, cudaStream_t hStream),   \
      (devPtr, size, hStream), cudaErrorSymbolNotFound)                                        \
    X(cudaFreeAsync_ptsz, cudaError_t, (void *devPtr, cudaStream_t hStream), (devPtr, hStream), \
      cudaErrorSymbolNotFound)                                                                 \
    /* CUDA graph replays: one call runs a whole captured step (PyTorch's CUDAGraph.replay,   \
       vLLM's decode, torch.compile's reduce-overhead), none of whose kernels passes through   \
       the launch calls above; each counts as one launch of the graph */                       \
    X(cuGraphLaunch, CUresult, (CUgraphExec hGraphExec, CUstream hStream),                    \
      (hGraphExec, hStream), CUDA_ERROR_NOT_FOUND)                                             \
    X(cuGraphLaunch_ptsz, CUresult, (CUgraphExec hGraphExec, CUstream hStream),               \
      (hGraphExec, hStream), CUDA_ERROR_NOT_FOUND)                                             \
    X(cudaGraphLaunch, cudaError_t, (cudaGraphExec_t graphExec, cudaStream_t stream),         \
      (graphExec, stream), cudaErrorSymbolNotFound)                                            \
    X(cudaGraphLaunch_ptsz, cudaError_t, (cudaGraphExec_t graphExec, cudaStream_t stream),    \
      (graphExec, stream), cudaErrorSymbolNotFound)                                            \
    /* runtime API: what nvcc 13 makes of <<<...>>> (the kernel handle of __cudaGetKernel in   \
       place of the host stub: PyTorch's own kernels reach the GPU only through these),        \
       the extensible launch (large parameter buffers, PDL, clusters) and cooperative ones */  \
    X(__cudaLaunchKernel, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,                 \
      cudaErrorSymbolNotFound)                                                                 \
    X(__cudaLaunchKernel_ptsz, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,            \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaLaunchKernelExC, cudaError_t, ES_RT_LAUNCH_EX_PARAMS, ES_RT_LAUNCH_EX_ARGS,          \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaLaunchKernelExC_ptsz, cudaError_t, ES_RT_LAUNCH_EX_PARAMS, ES_RT_LAUNCH_EX_ARGS,     \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaLaunchCooperativeKernel, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,        \
      cudaErrorSymbolNotFound)                                                                 \
    X(cudaLaunchCooperativeKernel_ptsz, cudaError_t, ES_RT_LAUNCH_PARAMS, ES_RT_LAUNCH_ARGS,   \
      cudaErrorSymbolNotFound)                                                                 \
    X(cuLaunchCooperativeKernel, CUresult, ES_COOP_PARAMS, ES_COOP_ARGS, CUDA_ERROR_NOT_FOUND) \
    X(cuLaunchCooperativeKernel_ptsz, CUresult, ES_COOP_PARAMS, ES_COOP_ARGS,                  \
      CUDA_ERROR_NOT_FOUND)                                                                    \
    /* driver API: physical memory of the virtual memory management API (PyTorch's            \
       expandable_segments, vLLM's sleep mode), held from create to release */                 \
    X(cuMemCreate, CUresult,                                                                  \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,     \
       unsigned long long flags),                                                              \
      (handle, size, prop, flags), CUDA_ERROR_NOT_FOUND)                                       \
    X(cuMemRelease, CUresult, (CUmemGenericAllocationHandle handle), (handle),                \
      CUDA_ERROR_NOT_FOUND)

/* ---- process lifecycle -------------------------------------------------------------
 * ES_PROCESS_HOOKS(X) expands X(name, return type, (parameters), (arguments)) once per C
 * library call that ends the process (ES_EXIT_HOOKS) or replaces its image
 * (ES_EXEC_HOOKS) without exit()'s handlers or the shim's destructor: the shim publishes
 * the calling thread's pending counts and a tick before handing on to the real call,
 * resolved when the shim loads.  Inside these the C library reaches its own execve and
 * _exit without the dynamic linker, so each is hooked by name.  ES_EXEC_LIST_FORMS(X)
 * names the variadic execl, execle and execlp, X(name, the vector form it hands on to):
 * shim.c builds the vector and calls that form, as the C library does itself.  The
 * types are those of <unistd.h> and <stdlib.h>. */
#define ES_EXIT_HOOKS(X)                   \
    X(_exit, void, (int status), (status)) \
    X(_Exit, void, (int status), (status))

#define ES_EXEC_HOOKS(X)                                                                    \
    X(execve, int, (const char *path, char *const argv[], char *const envp[]),              \
      (path, argv, envp))                                                                   \
    X(execv, int, (const char *path, char *const argv[]), (path, argv))                     \
    X(execvp, int, (const char *file, char *const argv[]), (file, argv))                    \
    X(execvpe, int, (const char *file, char *const argv[], char *const envp[]),             \
      (file, argv, envp))                                                                   \
    X(fexecve, int, (int fd, char *const argv[], char *const envp[]), (fd, argv, envp))     \
    X(execveat, int,                                                                        \
      (int dirfd, const char *path, char *const argv[], char *const envp[], int flags),     \
      (dirfd, path, argv, envp, flags))

#define ES_PROCESS_HOOKS(X) ES_EXIT_HOOKS(X) ES_EXEC_HOOKS(X)

#define ES_EXEC_LIST_FORMS(X) X(execl, execv) X(execle, execve) X(execlp, execvp)

/* Plain prototypes of the listed API, for the fake libraries and test programs (which
 * thereby fail to compile if their signatures drift from the list). */
#ifdef ES_DECLARE_PROTOTYPES
#define ES_PROTOTYPE(name, ret, params, args, fail) ret name params;
ES_HOOKED_SYMBOLS(ES_PROTOTYPE)
#undef ES_PROTOTYPE
#endif

#endif /* ELASTICO_SHIM_HOOKS_H */
