/* comm_nccl.cu: the collectives between data-parallel ranks on GPUs (ddk.h, ddk_comm_*) over
 * NCCL, and the process's one order of NCCL operations (nccl_order.h) that they share with the
 * link's copies (link_nccl.cu). One host thread drives every local rank: ncclCommInitRank and
 * ncclAllReduce are issued for all of them inside one ncclGroupStart/ncclGroupEnd, which is how
 * NCCL lets one thread manage several GPUs.
 *
 * The all-reduce is queued on each GPU's backend stream (backend_cuda.cu), so it runs after
 * the ops queued there before it (the gradients it sums) and before the ops queued after it,
 * and, under the NCCL lock, after the NCCL operations queued on its GPUs before it (a link's
 * copies: nccl_order.h). The call then waits for the streams by polling, not by
 * cudaStreamSynchronize, and without the lock: a peer that died or a broken network leaves the
 * collective hanging on the GPU, and only ncclCommGetAsyncError says so. On such an error every
 * local communicator is aborted (ncclCommAbort, NCCL's only safe way out) and the call returns
 * -EIO with NCCL's message. A CUDA error on a local GPU is no peer's: a device error, which ends
 * the process (ddk_fatal).
 *
 * Built only with CUDA (comm_none.c otherwise). Tested by tests/kernels/test_comm.c: argument checks
 * and unique ids without a GPU, a 1-rank all-reduce on one GPU, a 2-rank sum on two, and with
 * two an all-reduce while another thread copies over a link between the same GPUs.
 */
#include "ddk.h"
#include "comm_internal.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "nccl_order.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static_assert(sizeof(ncclUniqueId) * 2 == DDK_COMM_ID_HEX, "DDK_COMM_ID_HEX is not NCCL's id");

enum { COMM_MAX_LOCAL = 64 };   /* device_cuda.cu's limit on the GPUs of a process */

/* ------------------------------------------------------------------------------------------
 * The process's order of NCCL operations (nccl_order.h)
 */

static pthread_mutex_t nccl_lock = PTHREAD_MUTEX_INITIALIZER;
/* per GPU: recorded after its last NCCL operation; NULL before its first. Never destroyed: it
 * lives as long as the process, as the backends' streams do. */
static cudaEvent_t nccl_last[COMM_MAX_LOCAL];

void ddk_nccl_lock(void)
{
    pthread_mutex_lock(&nccl_lock);
}

void ddk_nccl_unlock(void)
{
    pthread_mutex_unlock(&nccl_lock);
}

static cudaEvent_t *last_of(int device)
{
    if (device < 0 || device >= COMM_MAX_LOCAL)   /* the callers' GPUs come from ddk_cuda_device_count */
        ddk_fatal(__FILE__, __LINE__, "cuda:%d is past the %d GPUs a process may drive", device, COMM_MAX_LOCAL);
    return &nccl_last[device];
}

cudaError_t ddk_nccl_after(int device, cudaStream_t stream)
{
    cudaEvent_t last = *last_of(device);
    return last ? cudaStreamWaitEvent(stream, last, 0) : cudaSuccess;
}

cudaError_t ddk_nccl_queued(int device, cudaStream_t stream)
{
    cudaEvent_t *last = last_of(device);
    cudaError_t e = cudaSetDevice(device);   /* the event is made on its GPU */
    if (e == cudaSuccess && !*last) {
        cudaEvent_t made;
        if ((e = cudaEventCreateWithFlags(&made, cudaEventDisableTiming)) == cudaSuccess)
            *last = made;
    }
    return e == cudaSuccess ? cudaEventRecord(*last, stream) : e;
}

/* ------------------------------------------------------------------------------------------
 * The communicator
 */

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

/* Aborts every local rank's communicator; NULLs them, so destroy frees only the struct. Under
 * the NCCL lock, as are fail_nccl and fail_cuda, which call it. */
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
/* NCCL's asynchronous state of local rank i's communicator (a failed query is its error) */
static ncclResult_t rank_state(const ddk_comm *c, int i)
{
    ncclResult_t state = ncclSuccess, q = ncclCommGetAsyncError(c->ranks[i].nccl, &state);
    return q != ncclSuccess ? q : state;
}

/* the state of local ranks 0..local-1: the first one's error (*at its rank), else ncclInProgress
 * while one is in progress, else ncclSuccess */
static ncclResult_t ranks_state(const ddk_comm *c, int local, int *at)
{
    ncclResult_t all = ncclSuccess;
    for (int i = 0; i < local; i++) {
        const ncclResult_t state = rank_state(c, i);
        if (state != ncclSuccess && state != ncclInProgress) {
            *at = i;
            return state;
        }
        if (state == ncclInProgress)
            all = ncclInProgress;
    }
    return all;
}

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
     * other daemons never join is given up after peer_deadline_s instead of waited for forever.
     * Under the NCCL lock until they are: no other NCCL call of the process meanwhile. */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ddk_nccl_lock();
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
        int failed = 0;
        const ncclResult_t state = ranks_state(c, local, &failed);
        pending = state == ncclInProgress;
        if (!pending && state != ncclSuccess)
            rc = fail_nccl(c, failed, "ncclCommInitRankConfig", state, init_advice, err, err_len);
        if (rc == 0 && pending && seconds_since(&t0) > peer_deadline_s) {
            ddk_comm_error(-ETIMEDOUT, err, err_len, "the communicator's %d ranks did not all join within %.0f s: "
                           "start the run on every daemon of the cluster; %s", world, peer_deadline_s, init_advice);
            abort_all(c);
            rc = -ETIMEDOUT;
        }
        if (rc == 0 && pending)
            nanosleep(&nap, NULL);
    }
    ddk_nccl_unlock();
    if (rc) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* -ETIMEDOUT with err: the all-reduce's peers were silent for peer_deadline_s; every local
 * communicator is aborted. Under the NCCL lock. */
static int reduce_timed_out(ddk_comm *c, char *err, size_t err_len)
{
    ddk_comm_error(-ETIMEDOUT, err, err_len, "the all-reduce waited %.0f s for its peers (a rank "
                   "whose run stopped, or a hung node); %s", peer_deadline_s, reduce_advice);
    abort_all(c);
    return -ETIMEDOUT;
}

/* Queues the all-reduce on every local rank's backend stream after the last NCCL operation on
 * its GPU, and waits until NCCL has queued it (a non-blocking communicator may queue it in the
 * background: ncclInProgress until then), so that it is the last on each GPU. 0, or -EIO /
 * -ETIMEDOUT with err, the communicator aborted. Under the NCCL lock. */
static int queue_allreduce(ddk_comm *c, float *const *bufs, int64_t count,
                           const struct timespec *t0, char *err, size_t err_len)
{
    for (int i = 0; i < c->local; i++)
        CUDA_CHECK(ddk_nccl_after(c->ranks[i].device, ddk_cuda_stream(c->ranks[i].be)));
    ncclResult_t r = ncclGroupStart();
    int at = 0;   /* ends at the rank that failed, or local */
    while (r == ncclSuccess && at < c->local) {
        r = ncclAllReduce(bufs[at], bufs[at], (size_t)count, ncclFloat, ncclSum, c->ranks[at].nccl,
                          ddk_cuda_stream(c->ranks[at].be));   /* also makes its GPU current */
        if (r == ncclSuccess || r == ncclInProgress) {   /* non-blocking communicators */
            r = ncclSuccess;
            at++;
        }
    }
    ncclResult_t end = ncclGroupEnd();   /* ncclInProgress: queued when the state says so */
    if (r != ncclSuccess || (end != ncclSuccess && end != ncclInProgress))
        return fail_nccl(c, at < c->local ? at : 0, "ncclAllReduce", r != ncclSuccess ? r : end,
                         reduce_advice, err, err_len);
    const struct timespec nap = { 0, poll_interval_ns };
    for (int pending = 1; pending;) {
        int failed = 0;
        const ncclResult_t state = ranks_state(c, c->local, &failed);
        pending = state == ncclInProgress;
        if (!pending && state != ncclSuccess)
            return fail_nccl(c, failed, "the all-reduce", state, reduce_advice, err, err_len);
        if (pending && seconds_since(t0) > peer_deadline_s)
            return reduce_timed_out(c, err, err_len);
        if (pending)
            nanosleep(&nap, NULL);
    }
    for (int i = 0; i < c->local; i++)
        CUDA_CHECK(ddk_nccl_queued(c->ranks[i].device, ddk_cuda_stream(c->ranks[i].be)));
    return 0;
}

/* Returns when the queued all-reduce is in every buffer: each stream has run everything queued
 * on it. Without the NCCL lock (ncclCommGetAsyncError may be called beside other threads' NCCL
 * calls; the lock is taken to abort). 0, or -EIO / -ETIMEDOUT as queue_allreduce. */
static int wait_allreduce(ddk_comm *c, const struct timespec *t0, char *err, size_t err_len)
{
    const struct timespec nap = { 0, poll_interval_ns };
    for (;;) {
        int pending = 0, failed = -1;
        ncclResult_t async = ncclSuccess;
        for (int i = 0; i < c->local; i++) {
            async = rank_state(c, i);
            if (async == ncclInProgress) {   /* queued, so not expected: wait all the same */
                pending = 1;
                continue;
            }
            if (async != ncclSuccess) {
                failed = i;
                break;
            }
            cudaError_t e = cudaStreamQuery(ddk_cuda_stream(c->ranks[i].be));   /* its GPU current */
            if (e == cudaErrorNotReady) {
                (void)cudaGetLastError();   /* not an error: not to be seen by the next launch check */
                pending = 1;
            } else if (e != cudaSuccess) {   /* a fault of this GPU, not a peer's */
                ddk_fatal(__FILE__, __LINE__, "the all-reduce's stream on cuda:%d (rank %d) failed: %s",
                          c->ranks[i].device, c->first_rank + i, cudaGetErrorString(e));
            }
        }
        if (failed < 0 && !pending)
            return 0;
        if (failed < 0 && seconds_since(t0) <= peer_deadline_s) {
            nanosleep(&nap, NULL);
            continue;
        }
        ddk_nccl_lock();
        int rc = failed >= 0 ? fail_nccl(c, failed, "the all-reduce", async, reduce_advice, err, err_len)
                             : reduce_timed_out(c, err, err_len);
        ddk_nccl_unlock();
        return rc;
    }
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
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ddk_nccl_lock();
    int rc = queue_allreduce(c, bufs, count, &t0, err, err_len);
    ddk_nccl_unlock();
    return rc ? rc : wait_allreduce(c, &t0, err, err_len);
}

/* Abort, not ncclCommDestroy: destroy is collective in current NCCL and would wait for peers
 * whose runs may have stopped; with nothing in flight (the trainer synchronised) abort only
 * frees. */
extern "C" void ddk_comm_destroy(ddk_comm *c)
{
    if (!c)
        return;
    ddk_nccl_lock();
    abort_all(c);
    ddk_nccl_unlock();
    free(c);
}
