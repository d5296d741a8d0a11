/* Launch-overhead benchmark: THREADS threads each call cuLaunchKernel CALLS times
 * (cycling through KEYS distinct launch shapes) at up to RATE calls/s in total (0 = as fast
 * as possible).  Prints one line:  threads calls keys rate ns_per_call_cpu calls_per_s_wall
 * where ns_per_call_cpu is thread CPU time per call (not inflated by time-slicing when
 * there are more threads than cores, nor by the pacing sleeps).  Usage: bench_launch THREADS CALLS KEYS RATE */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "hooks.h"

static long calls, keys;
static double rate_per_thread;
static double cpu_ns[64];

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* CPU time is summed over chunks of calls only, so the pacing sleeps and wake-ups are
 * not charged to the calls (they dominate and are the same with and without the shim). */
static void *worker(void *arg) {
    long t = (long)arg;
    CUstream s = (CUstream)(0x200 + t);
    double start = now(CLOCK_MONOTONIC), busy = 0;
    const long chunk = 1000;
    for (long i = 0; i < calls;) {
        long stop = i + chunk < calls ? i + chunk : calls;
        double c0 = now(CLOCK_THREAD_CPUTIME_ID);
        for (; i < stop; i++) {
            unsigned k = (unsigned)(i % keys);
            cuLaunchKernel((CUfunction)(uintptr_t)(0x1000 + k), 1 + k, 1, 1, 128, 1, 1, 0, s,
                           NULL, NULL);
        }
        busy += now(CLOCK_THREAD_CPUTIME_ID) - c0;
        if (rate_per_thread > 0) {
            double wait = start + i * 1e9 / rate_per_thread - now(CLOCK_MONOTONIC);
            if (wait > 0) {
                struct timespec ts = {(time_t)(wait / 1e9), (long)((long long)wait % 1000000000)};
                nanosleep(&ts, NULL);
            }
        }
    }
    cpu_ns[t] = busy;
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 5) return 2;
    int threads = atoi(argv[1]);
    calls = atol(argv[2]);
    keys = atol(argv[3]);
    double rate = atof(argv[4]);
    if (threads < 1 || threads > 64 || calls < 1 || keys < 1) return 2;
    rate_per_thread = rate / threads;
    pthread_t tid[64];
    double start = now(CLOCK_MONOTONIC);
    for (long t = 0; t < threads; t++) pthread_create(&tid[t], NULL, worker, (void *)t);
    double total_cpu = 0;
    for (int t = 0; t < threads; t++) {
        pthread_join(tid[t], NULL);
        total_cpu += cpu_ns[t];
    }
    double wall = now(CLOCK_MONOTONIC) - start;
    printf("%d %ld %ld %.0f %.2f %.0f\n", threads, calls, keys, rate,
           total_cpu / ((double)calls * threads), (double)calls * threads / (wall / 1e9));
    return 0;
}
