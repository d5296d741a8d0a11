/* Counters the fake libraries keep, so a test program can check that every call it made
 * reached the real (fake) library exactly once, with its arguments intact. */
#ifndef FAKE_STATS_H
#define FAKE_STATS_H
struct fake_cuda_stats {
    unsigned long long launch_calls, launch_checksum, alloc_calls, free_calls, next_block;
};
void fake_cuda_get_stats(struct fake_cuda_stats *out);
unsigned long long fake_nccl_calls(void);
#endif
