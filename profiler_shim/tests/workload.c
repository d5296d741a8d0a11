/* Test program: makes a known pattern of CUDA/NCCL calls from several threads and checks
 * every result it gets back.  Usage: workload THREADS ITERATIONS [fork]
 *
 * Per thread t (0-based) and iteration i (0-based):
 *   cuLaunchKernel    f=0x1000+t grid=(1+i%5,2,1) block=(128,1,1) smem=(i%2)*1024 stream=0x200+t
 *   cudaLaunchKernel  f=0x3000+t grid=(4,1,1) block=(256,1,1) smem=0 stream=0x200+t
 *                     (the fake runtime reaches the driver via cuGetProcAddress_v2)
 *   gpa pointer       f=0x5000+t grid=(8,8,1) block=(32,4,1) smem=0 stream=0
 *                     (cuGetProcAddress_v2("cuLaunchKernel") resolved once per thread)
 *   cuLaunchKernelEx  f=0x6000+t grid=(2,2,2) block=(64,1,1) smem=512 stream=0x200+t
 *   when i%10 == 0:   cudaMalloc((t+1)*4096+i) + cudaFree, cuMemAlloc_v2(1 MiB) + cuMemFree_v2,
 *                     cudaMallocAsync(777, 0x200+t) + cudaFreeAsync,
 *                     ncclAllReduce(1000+i, float32, sum), ncclAllGather(500, float16),
 *                     ncclReduceScatter(250, bfloat16, max), ncclBroadcast(100, int8, root 0),
 *                     ncclSend(64, float64, peer 1), ncclRecv(64, float64, peer 0);
 *                     comm=0xc0+t, stream=0x200+t
 * Once per thread before the loop, three failing calls whose errors must come back as is:
 *   cuLaunchKernel f=0x9000 grid=(0,1,1) block=(1,1,1) -> CUDA_ERROR_INVALID_VALUE
 *   cudaMalloc(2^41) -> cudaErrorMemoryAllocation;  ncclAllReduce(comm=NULL) -> ncclInvalidArgument
 * With "fork", the process then forks a child that runs one thread of 10 iterations.
 * Prints "OK <pid> [child <pid>]" and exits 0 only when every check passed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "hooks.h"
#include "fake_stats.h"
#include "check.h"

static int iterations;
static int failures;

typedef CUresult launch_fn ES_LAUNCH_PARAMS;

static void *worker(void *arg) {
    long t = (long)arg;
    CUstream s = (CUstream)(0x200 + t);
    ncclComm_t comm = (ncclComm_t)(0xc0 + t);
    launch_fn *via_gpa = NULL;
    CUdriverProcAddressQueryResult st;
    CHECK(cuGetProcAddress_v2("cuLaunchKernel", (void **)&via_gpa, 12000, 0, &st), CUDA_SUCCESS);
    void *params[1] = {(void *)0xc0ffee};
    void *p;
    CHECK(cuLaunchKernel((CUfunction)0x9000, 0, 1, 1, 1, 1, 1, 0, s, params, NULL),
          CUDA_ERROR_INVALID_VALUE);
    CHECK(cudaMalloc(&p, 1ull << 41), cudaErrorMemoryAllocation);
    CHECK(ncclAllReduce(NULL, NULL, 1, ncclFloat32, ncclSum, NULL, s), ncclInvalidArgument);
    for (int i = 0; i < iterations; i++) {
        CHECK(cuLaunchKernel((CUfunction)(0x1000 + t), 1 + i % 5, 2, 1, 128, 1, 1,
                             (i % 2) * 1024, s, params, NULL), CUDA_SUCCESS);
        dim3 g = {4, 1, 1}, b = {256, 1, 1};
        CHECK(cudaLaunchKernel((const void *)(0x3000 + t), g, b, params, 0, s), cudaSuccess);
        CHECK(via_gpa((CUfunction)(0x5000 + t), 8, 8, 1, 32, 4, 1, 0, NULL, params, NULL),
              CUDA_SUCCESS);
        CUlaunchConfig c = {2, 2, 2, 64, 1, 1, 512, s, NULL, 0};
        CHECK(cuLaunchKernelEx(&c, (CUfunction)(0x6000 + t), params, NULL), CUDA_SUCCESS);
        if (i % 10) continue;
        CHECK(cudaMalloc(&p, (size_t)(t + 1) * 4096 + i), cudaSuccess);
        CHECK(cudaFree(p), cudaSuccess);
        CUdeviceptr d;
        CHECK(cuMemAlloc_v2(&d, 1 << 20), CUDA_SUCCESS);
        CHECK(cuMemFree_v2(d), CUDA_SUCCESS);
        CHECK(cudaMallocAsync(&p, 777, s), cudaSuccess);
        CHECK(cudaFreeAsync(p, s), cudaSuccess);
        CHECK(ncclAllReduce(NULL, NULL, 1000 + i, ncclFloat32, ncclSum, comm, s), ncclSuccess);
        CHECK(ncclAllGather(NULL, NULL, 500, ncclFloat16, comm, s), ncclSuccess);
        CHECK(ncclReduceScatter(NULL, NULL, 250, ncclBfloat16, ncclMax, comm, s), ncclSuccess);
        CHECK(ncclBroadcast(NULL, NULL, 100, ncclInt8, 0, comm, s), ncclSuccess);
        CHECK(ncclSend(NULL, 64, ncclFloat64, 1, comm, s), ncclSuccess);
        CHECK(ncclRecv(NULL, 64, ncclFloat64, 0, comm, s), ncclSuccess);
    }
    return NULL;
}

static int run(int threads) {
    pthread_t tid[64];
    for (long t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, (void *)t);
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    struct fake_cuda_stats fs;
    fake_cuda_get_stats(&fs);
    /* every call reached the library exactly once with its arguments intact */
    unsigned long long per_iter = 0, sum_checksum = 0;
    for (int i = 0; i < iterations; i++)
        sum_checksum += (1ull + i % 5) * 2 * 128 + (i % 2) * 1024 + 4 * 256 + 64 * 32 * 4 +
                        8 * 64 + 512;
    per_iter = 4;
    CHECK(fs.launch_calls, (unsigned long long)threads * (per_iter * iterations + 1));
    CHECK(fs.launch_checksum, (unsigned long long)threads * sum_checksum);
    CHECK(fake_nccl_calls(), (unsigned long long)threads * (6 * ((iterations + 9) / 10) + 1));
    return failures;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 4;
    iterations = argc > 2 ? atoi(argv[2]) : 1000;
    int do_fork = argc > 3 && !strcmp(argv[3], "fork");
    if (threads < 1 || threads > 64) return 2;
    if (run(threads)) return 1;
    if (do_fork) {
        fflush(stdout);
        pid_t child = fork();
        if (child == 0) {
            iterations = 10;
            void *p;
            CHECK(cudaMalloc(&p, 12345), cudaSuccess);
            worker((void *)7);
            if (failures) _exit(1);
            printf("child %d\n", (int)getpid());
            exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status)) return 1;
    }
    printf("OK %d\n", (int)getpid());
    return 0;
}
