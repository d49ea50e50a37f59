/* comm_nccl.cu: the collectives between data-parallel ranks on GPUs (ddk.h, ddk_comm_*) over
 * NCCL. One host thread drives every local rank: ncclCommInitRank and ncclAllReduce are issued
 * for all of them inside one ncclGroupStart/ncclGroupEnd, which is how NCCL lets one thread
 * manage several GPUs.
 *
 * The all-reduce is queued on each GPU's backend stream (backend_cuda.cu), so it runs after
 * the ops queued there before it (the gradients it sums) and before the ops queued after it.
 * The call then waits for the streams by polling, not by cudaStreamSynchronize: a peer that
 * died or a broken network leaves the collective hanging on the GPU, and only
 * ncclCommGetAsyncError says so. On such an error every local communicator is aborted
 * (ncclCommAbort, NCCL's only safe way out) and the call returns -EIO with NCCL's message.
 * A CUDA error on a local GPU is no peer's: a device error, which ends the process (ddk_fatal).
 *
 * Built only with CUDA (comm_none.c otherwise). Tested by tests/test_comm.c: argument checks
 * and unique ids without a GPU, a 1-rank all-reduce on one GPU, a 2-rank sum on two.
 */
#include "ddk.h"
#include "comm_internal.h"
#include "cuda_backend.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>


static_assert(sizeof(ncclUniqueId) * 2 == DDK_COMM_ID_HEX, "DDK_COMM_ID_HEX is not NCCL's id");

enum { COMM_MAX_LOCAL = 64 };   /* device_cuda.cu's limit on the GPUs of a process */

/* How long the all-reduce sleeps between two looks at its streams and communicators */
static const long poll_interval_ns = 100 * 1000;
/* How long the all-reduce and the communicator's formation wait for their peers at most: a
 * peer that stopped calling (its run failed for a reason of its own, or never started on its
 * daemon) raises no NCCL error, so silence this long is taken as a dead peer. Every rank enters
 * a step's all-reduce within one step of the others; no step takes minutes. */
static const double peer_deadline_s = 600.0;

static double seconds_since(const struct timespec *t0)
{
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)(now.tv_sec - t0->tv_sec) + 1e-9 * (double)(now.tv_nsec - t0->tv_nsec);
}

struct comm_rank {
    int device;                 /* its GPU */
    ncclComm_t nccl;            /* NULL once aborted */
    const ddk_backend *be;      /* ddk_backend_cuda(device): its stream orders the all-reduce */
};

struct ddk_comm {
    int first_rank, local;      /* ranks first_rank .. first_rank + local - 1 of the world */
    int aborted;                /* after an error: only ddk_comm_destroy is allowed */
    comm_rank ranks[COMM_MAX_LOCAL];
};

/* Aborts every local rank's communicator; NULLs them, so destroy frees only the struct */
static void abort_all(ddk_comm *c)
{
    for (int i = 0; i < c->local; i++)
        if (c->ranks[i].nccl) {
            ncclCommAbort(c->ranks[i].nccl);
            c->ranks[i].nccl = NULL;
        }
    c->aborted = 1;
}

/* -EIO: err says what failed on local rank i, NCCL's words for r and its last error (read
 * before the abort that follows), then advice; every local communicator is aborted */
static int fail_nccl(ddk_comm *c, int i, const char *what, ncclResult_t r, const char *advice,
                     char *err, size_t err_len)
{
    const char *last = ncclGetLastError(c->ranks[i].nccl);
    int has_last = last && *last;
    ddk_comm_error(-EIO, err, err_len, "%s on rank %d (cuda:%d) failed: %s%s%s; %s", what,
                   c->first_rank + i, c->ranks[i].device, ncclGetErrorString(r),
                   has_last ? ": " : "", has_last ? last : "", advice);
    abort_all(c);
    return -EIO;
}

/* the same for a CUDA error */
static int fail_cuda(ddk_comm *c, int i, const char *what, cudaError_t e, const char *advice,
                     char *err, size_t err_len)
{
    ddk_comm_error(-EIO, err, err_len, "%s on rank %d (cuda:%d) failed: %s; %s", what,
                   c->first_rank + i, c->ranks[i].device, cudaGetErrorString(e), advice);
    abort_all(c);
    return -EIO;
}

static const char init_advice[] =
    "every daemon of the run must be given the same unique id (from rank 0's daemon) and world "
    "size, distinct ranks, and reach rank 0's node over the network (NCCL_SOCKET_IFNAME names "
    "the interface; NCCL_DEBUG=INFO says more)";
static const char reduce_advice[] =
    "the communicator is aborted: destroy it and restart the run on every node (a peer that "
    "died or a network failure; NCCL_DEBUG=INFO says more)";

/* A new id from NCCL: 0, or -EIO with NCCL's message */
static int new_id(ncclUniqueId *id, char *err, size_t err_len)
{
    ncclResult_t r = ncclGetUniqueId(id);
    if (r == ncclSuccess)
        return 0;
    const char *last = ncclGetLastError(NULL);
    return ddk_comm_error(-EIO, err, err_len,
                          "ncclGetUniqueId failed: %s%s%s (it needs a network interface the "
                          "other nodes reach: NCCL_SOCKET_IFNAME names it)",
                          ncclGetErrorString(r), last && *last ? ": " : "", last && *last ? last : "");
}

extern "C" int ddk_has_nccl(void)
{
    return 1;
}

extern "C" int ddk_comm_unique_id(char *hex, char *err, size_t err_len)
{
    ncclUniqueId id;
    int rc = new_id(&id, err, err_len);
    if (rc)
        return rc;
    ddk_comm_id_encode((const unsigned char *)id.internal, hex);
    return 0;
}

/* 0, or -EINVAL with err naming the argument at fault; checks the cheap arguments before
 * asking the machine for its GPUs */
static int check_init(const char *id_hex, int world, int first_rank, int local,
                      const int *devices, char *err, size_t err_len)
{
    if (world < 1)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "world (the run's ranks over every node) must be >= 1, got %d", world);
    if (local < 1)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "local (the ranks this process drives) must be >= 1, got %d", local);
    if (first_rank < 0 || (long long)first_rank + local > world)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "first_rank %d with %d local rank(s) does not fit a world of %d "
                              "ranks: first_rank must be in [0, %lld]",
                              first_rank, local, world, (long long)world - local);
    if (!id_hex && world != local)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "a world of %d ranks with %d here spans several processes: give "
                              "every one of them the unique id of rank 0's daemon "
                              "(POST /nccl/unique-id)", world, local);
    if (id_hex && !ddk_comm_id_valid(id_hex))
        return ddk_comm_error(-EINVAL, err, err_len,
                              "the unique id is not %d hex digits: copy it whole from rank 0's "
                              "daemon's answer to POST /nccl/unique-id", DDK_COMM_ID_HEX);
    int gpus = ddk_cuda_device_count();
    if (local > gpus)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "%d local rank(s) need as many GPUs, but this process sees %d "
                              "(check CUDA_VISIBLE_DEVICES and nvidia-smi)", local, gpus);
    if (!devices)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "devices must list the GPU of each of the %d local ranks", local);
    for (int i = 0; i < local; i++) {
        if (devices[i] < 0 || devices[i] >= gpus)
            return ddk_comm_error(-EINVAL, err, err_len,
                                  "devices[%d] = %d: no such GPU (this process sees cuda:0 to "
                                  "cuda:%d)", i, devices[i], gpus - 1);
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return ddk_comm_error(-EINVAL, err, err_len,
                                      "devices[%d] and devices[%d] are both cuda:%d: each local "
                                      "rank needs a GPU of its own", j, i, devices[i]);
    }
    return 0;
}

extern "C" int ddk_comm_init(const char *id_hex, int world, int first_rank, int local,
                             const int *devices, ddk_comm **out, char *err, size_t err_len)
{
    if (!out)
        return ddk_comm_error(-EINVAL, err, err_len, "out must point to where the communicator goes");
    *out = NULL;
    int rc = check_init(id_hex, world, first_rank, local, devices, err, err_len);
    if (rc)
        return rc;

    ncclUniqueId id;
    if (id_hex)
        ddk_comm_id_decode(id_hex, (unsigned char *)id.internal);
    else if ((rc = new_id(&id, err, err_len)))
        return rc;

    ddk_comm *c = (ddk_comm *)calloc(1, sizeof *c);
    if (!c)
        return ddk_comm_error(-ENOMEM, err, err_len, "no host memory for a communicator");
    c->first_rank = first_rank;
    c->local = local;
    for (int i = 0; i < local; i++) {   /* the streams are made now, not inside the NCCL group */
        c->ranks[i].device = devices[i];
        if (!(c->ranks[i].be = ddk_backend_cuda(devices[i]))) {
            free(c);
            return ddk_comm_error(-ENOMEM, err, err_len,
                                  "cuda:%d has no memory left for its stream, cuBLAS handle and "
                                  "scratch", devices[i]);
        }
    }

    /* non-blocking communicators: the inits (and later the collectives) may answer
     * ncclInProgress, and ncclCommGetAsyncError says when they are done, so a world whose
     * other daemons never join is given up after peer_deadline_s instead of waited for forever */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclGroupStart();
    cudaError_t e = cudaSuccess;
    int at = 0;   /* ends at the rank that failed, or local */
    while (r == ncclSuccess && at < local) {
        e = cudaSetDevice(devices[at]);
        if (e != cudaSuccess)
            break;
        r = ncclCommInitRankConfig(&c->ranks[at].nccl, world, id, first_rank + at, &config);
        if (r == ncclSuccess || r == ncclInProgress) {
            r = ncclSuccess;
            at++;
        }
    }
    ncclResult_t end = ncclGroupEnd();   /* the inits proceed with every rank of the world */
    if (e != cudaSuccess)
        rc = fail_cuda(c, at, "cudaSetDevice", e, init_advice, err, err_len);
    else if (r != ncclSuccess || (end != ncclSuccess && end != ncclInProgress))
        rc = fail_nccl(c, at < local ? at : 0, "ncclCommInitRankConfig", r != ncclSuccess ? r : end,
                       init_advice, err, err_len);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    const struct timespec nap = { 0, poll_interval_ns };
    for (int pending = 1; rc == 0 && pending;) {
        pending = 0;
        for (int i = 0; i < local && rc == 0; i++) {
            ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(c->ranks[i].nccl, &state);
            if (q != ncclSuccess)
                state = q;
            if (state == ncclInProgress)
                pending = 1;
            else if (state != ncclSuccess)
                rc = fail_nccl(c, i, "ncclCommInitRankConfig", state, init_advice, err, err_len);
        }
        if (rc == 0 && pending && seconds_since(&t0) > peer_deadline_s) {
            ddk_comm_error(-ETIMEDOUT, err, err_len, "the communicator's %d ranks did not all join within %.0f s: "
                           "start the run on every daemon of the cluster; %s", world, peer_deadline_s, init_advice);
            abort_all(c);
            rc = -ETIMEDOUT;
        }
        if (rc == 0 && pending)
            nanosleep(&nap, NULL);
    }
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

extern "C" int ddk_comm_allreduce_sum(ddk_comm *c, float *const *bufs, int64_t count, char *err,
                                      size_t err_len)
{
    if (!c || !bufs || count < 0)
        return ddk_comm_error(-EINVAL, err, err_len,
                              "the all-reduce needs a communicator, a buffer per local rank and "
                              "count >= 0 (got count %lld)", (long long)count);
    if (c->aborted)
        return ddk_comm_error(-EIO, err, err_len,
                              "this communicator was aborted after an earlier error: destroy it "
                              "and restart the run on every node");
    for (int i = 0; i < c->local; i++)
        if (!bufs[i])
            return ddk_comm_error(-EINVAL, err, err_len, "bufs[%d] (rank %d) is NULL", i,
                                  c->first_rank + i);
    if (count == 0)   /* every rank has the same count: nothing to exchange anywhere */
        return 0;

    cudaStream_t streams[COMM_MAX_LOCAL];
    ncclResult_t r = ncclGroupStart();
    int at = 0;   /* ends at the rank that failed, or local */
    while (r == ncclSuccess && at < c->local) {
        streams[at] = ddk_cuda_stream(c->ranks[at].be);   /* also makes its GPU current */
        r = ncclAllReduce(bufs[at], bufs[at], (size_t)count, ncclFloat, ncclSum, c->ranks[at].nccl,
                          streams[at]);
        if (r == ncclSuccess || r == ncclInProgress) {   /* non-blocking communicators */
            r = ncclSuccess;
            at++;
        }
    }
    ncclResult_t end = ncclGroupEnd();   /* ncclInProgress: enqueued when the state says so */
    if (r != ncclSuccess || (end != ncclSuccess && end != ncclInProgress))
        return fail_nccl(c, at < c->local ? at : 0, "ncclAllReduce", r != ncclSuccess ? r : end,
                         reduce_advice, err, err_len);

    /* Returns when the sum is in every buffer: NCCL has enqueued it (its state is no longer
     * ncclInProgress) and each stream has run everything queued on it */
    const struct timespec nap = { 0, poll_interval_ns };
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        int pending = 0;
        for (int i = 0; i < c->local; i++) {
            ncclResult_t async = ncclSuccess;
            ncclResult_t q = ncclCommGetAsyncError(c->ranks[i].nccl, &async);
            if (q != ncclSuccess)
                async = q;
            if (async == ncclInProgress) {   /* not enqueued yet: the stream may look idle */
                pending = 1;
                continue;
            }
            if (async != ncclSuccess)
                return fail_nccl(c, i, "the all-reduce", async, reduce_advice, err, err_len);
            cudaError_t e = cudaStreamQuery(ddk_cuda_stream(c->ranks[i].be));   /* its GPU current */
            if (e == cudaErrorNotReady) {
                (void)cudaGetLastError();   /* not an error: not to be seen by the next launch check */
                pending = 1;
            } else if (e != cudaSuccess) {   /* a fault of this GPU, not a peer's */
                ddk_fatal(__FILE__, __LINE__, "the all-reduce's stream on cuda:%d (rank %d) failed: %s",
                          c->ranks[i].device, c->first_rank + i, cudaGetErrorString(e));
            }
        }
        if (!pending)
            return 0;
        if (seconds_since(&t0) > peer_deadline_s) {
            ddk_comm_error(-ETIMEDOUT, err, err_len, "the all-reduce waited %.0f s for its peers (a rank "
                           "whose run stopped, or a hung node); %s", peer_deadline_s, reduce_advice);
            abort_all(c);
            return -ETIMEDOUT;
        }
        nanosleep(&nap, NULL);
    }
}

/* Abort, not ncclCommDestroy: destroy is collective in current NCCL and would wait for peers
 * whose runs may have stopped; with nothing in flight (the trainer synchronised) abort only
 * frees. */
extern "C" void ddk_comm_destroy(ddk_comm *c)
{
    if (!c)
        return;
    abort_all(c);
    free(c);
}
