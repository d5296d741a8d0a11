/* Fake libnccl: nccl.h signatures; a NULL communicator is an invalid argument. */
#include "hooks.h"

static unsigned long long calls;
static ncclResult_t note(ncclComm_t comm) {
    __atomic_fetch_add(&calls, 1, __ATOMIC_RELAXED);
    return comm ? ncclSuccess : ncclInvalidArgument;
}
ncclResult_t ncclAllReduce(const void *s, void *r, size_t n, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t st) { return note(comm); }
ncclResult_t ncclAllGather(const void *s, void *r, size_t n, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t st) { return note(comm); }
ncclResult_t ncclReduceScatter(const void *s, void *r, size_t n, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t st) {
    return note(comm);
}
ncclResult_t ncclBroadcast(const void *s, void *r, size_t n, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t st) { return note(comm); }
ncclResult_t ncclSend(const void *s, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st) { return note(comm); }
ncclResult_t ncclRecv(void *r, size_t n, ncclDataType_t t, int peer, ncclComm_t comm,
                      cudaStream_t st) { return note(comm); }
unsigned long long fake_nccl_calls(void) { return calls; }
