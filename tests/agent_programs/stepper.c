/* A "training loop" for the launch-rate test: every step makes the same LAUNCHES kernel
 * launches (cuLaunchKernel over three functions, as a fixed model would), then waits for
 * the next step time.  Steps are paced on absolute CLOCK_MONOTONIC deadlines, so a late
 * step is caught up, not lost.  Usage:
 *     stepper LAUNCHES RATE1 SECONDS1 RATE2 SECONDS2 [LOAD]
 * runs RATE1 steps/s for SECONDS1, then RATE2 steps/s for SECONDS2, and prints
 * "phase <n> <steps> <seconds>" per phase (what it really achieved).  With LOAD, it
 * first allocates device memory and launches nothing for LOAD seconds, as a workload
 * loading its model does (the allocation starts the shim's ring). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "hooks.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void sleep_until(double t) {
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static int phase(int n, int launches, double rate, double seconds) {
    void *params[1] = {(void *)0x1};
    double start = now_s(), next = start, stop = start + seconds;
    long steps = 0;
    while (next < stop) {
        for (int k = 0; k < launches; k++) {
            CUresult r = cuLaunchKernel((CUfunction)(uintptr_t)(0x7000 + k % 3), 8, 1, 1, 128, 1, 1, 0,
                                        (CUstream)0, params, NULL);
            if (r != CUDA_SUCCESS) return 1;
        }
        steps++;
        next = start + steps / rate;
        sleep_until(next);
    }
    printf("phase %d %ld %.6f\n", n, steps, now_s() - start);
    fflush(stdout);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 6 && argc != 7) {
        fprintf(stderr, "usage: stepper LAUNCHES RATE1 SECONDS1 RATE2 SECONDS2 [LOAD]\n");
        return 2;
    }
    if (argc == 7) {
        CUdeviceptr weights;
        if (cuMemAlloc_v2(&weights, 1 << 20) != CUDA_SUCCESS) return 1;
        sleep_until(now_s() + atof(argv[6]));
    }
    int launches = atoi(argv[1]);
    if (phase(1, launches, atof(argv[2]), atof(argv[3]))) return 1;
    if (phase(2, launches, atof(argv[4]), atof(argv[5]))) return 1;
    return 0;
}
