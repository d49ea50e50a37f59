/* link_nccl.cu: copies between the GPUs of this process over NCCL send/recv (ddk.h, ddk_link_*):
 * the split placement's hand-off of the target's features from its GPUs to the drafter's.
 *
 * One communicator per member from ncclCommInitAll (one process, no unique id). Each member
 * has a stream of its own beside its backend's, where its sends and receives run, so a copy
 * overlaps the compute queued on both GPUs; events order them, the host never waits:
 *   - a send waits for what the sender's backend queued before it (the features it sends), and
 *     the sender's backend waits for the send before what it queues next (which may rewrite the
 *     buffer);
 *   - a fence on a member is a barrier both ways between its backend and its link stream: the
 *     backend waits for every receive queued into the member before it (the data it reads
 *     next), and every receive queued after it waits for what the backend queued before it
 *     (which may still read the buffers those receives rewrite). The receive waits for the
 *     backend at the fence, not at each send: a send made while the receiver's backend has a
 *     step queued would stall the sender's compute (a send ends only when its receive has run)
 *     behind that whole step, and a split's target ranks would no longer overlap the drafter's.
 *     ddk_link_init fences every member: a receive also waits for what was queued before the
 *     link was made.
 * A send and its receive are one NCCL group, issued by the calling thread under the process's
 * NCCL lock (nccl_order.h): a communicator is one thread's at a time, several target ranks
 * (threads) send, and the data-parallel all-reduce (comm_nccl.cu) shares the GPUs: on each GPU
 * a copy runs after the NCCL operations queued there before it, and before those after it.
 * Copies into one member run in the order they were queued (its one stream).
 *
 * Built only with CUDA and NCCL (comm_none.c otherwise). Tested by tests/kernels/test_comm.c: argument
 * checks without a GPU; with two GPUs a copy ordered against both backends (a receive after the
 * receiver's queued reads of its buffer) and copies from another thread during all-reduces on
 * the same GPUs (skipped with fewer).
 */
#include "ddk.h"
#include "comm_internal.h"
#include "cuda_backend.h"
#include "nccl_order.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <nccl.h>
#include <stdlib.h>

enum { LINK_MAX = 64 };   /* device_cuda.cu's limit on the GPUs of a process */

struct link_member {
    int device;
    ncclComm_t nccl;             /* NULL once aborted */
    const ddk_backend *be;       /* ddk_backend_cuda(device) */
    cudaStream_t stream;         /* the link's, on device */
    cudaEvent_t queued;          /* on be's stream: before a send from this member */
    cudaEvent_t sent;            /* on stream: after a send from it */
    cudaEvent_t received;        /* on stream: at a fence, after the receives into it */
    cudaEvent_t fenced;          /* on be's stream: at a fence, before the later receives */
};

/* Its members and flag change under the NCCL lock only */
struct ddk_link {
    int n, aborted;
    link_member m[LINK_MAX];
};

/* Under the NCCL lock */
static void abort_link(ddk_link *l)
{
    for (int i = 0; i < l->n; i++)
        if (l->m[i].nccl) {
            ncclCommAbort(l->m[i].nccl);
            l->m[i].nccl = NULL;
        }
    l->aborted = 1;
}

static const char link_advice[] =
    "the link is aborted: the run stops; NCCL_DEBUG=INFO says more (NCCL_P2P_DISABLE=1 falls back "
    "from NVLink/PCIe peer copies to host memory)";

/* -EIO with err, the link aborted: under the NCCL lock, as link_fail_cuda */
static int link_fail_nccl(ddk_link *l, const char *what, ncclResult_t r, char *err, size_t err_len)
{
    ddk_comm_error(-EIO, err, err_len, "%s failed: %s; %s", what, ncclGetErrorString(r), link_advice);
    abort_link(l);
    return -EIO;
}

static int link_fail_cuda(ddk_link *l, const char *what, int device, cudaError_t e, char *err, size_t err_len)
{
    ddk_comm_error(-EIO, err, err_len, "%s on cuda:%d failed: %s; %s", what, device, cudaGetErrorString(e),
                   link_advice);
    abort_link(l);
    return -EIO;
}

extern "C" void ddk_link_destroy(ddk_link *l)
{
    if (!l)
        return;
    ddk_nccl_lock();
    abort_link(l);   /* nothing in flight: abort only frees, without a collective */
    ddk_nccl_unlock();
    for (int i = 0; i < l->n; i++) {
        link_member *m = &l->m[i];
        if (!m->stream)
            continue;
        cudaSetDevice(m->device);
        cudaEventDestroy(m->queued);
        cudaEventDestroy(m->sent);
        cudaEventDestroy(m->received);
        cudaEventDestroy(m->fenced);
        cudaStreamDestroy(m->stream);
    }
    free(l);
}

/* Member b's barrier (ddk_link_fence): both events recorded before either wait, so neither
 * stream waits on what the other queues after the fence (no cycle). Under the NCCL lock. */
static cudaError_t fence_member(link_member *b)
{
    cudaStream_t compute = ddk_cuda_stream(b->be);   /* also makes b's GPU current */
    cudaError_t e = cudaEventRecord(b->received, b->stream);
    if (e == cudaSuccess)
        e = cudaEventRecord(b->fenced, compute);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(b->stream, b->fenced, 0);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(compute, b->received, 0);
    return e;
}

extern "C" int ddk_link_init(int n, const int *devices, ddk_link **out, char *err, size_t err_len)
{
    if (!out)
        return ddk_comm_error(-EINVAL, err, err_len, "out must point to where the link goes");
    *out = NULL;
    const int gpus = ddk_cuda_device_count();
    if (n < 2 || n > LINK_MAX || !devices)
        return ddk_comm_error(-EINVAL, err, err_len, "a link joins 2 to %d GPUs, got %d", LINK_MAX, n);
    for (int i = 0; i < n; i++) {
        if (devices[i] < 0 || devices[i] >= gpus)
            return ddk_comm_error(-EINVAL, err, err_len, "devices[%d] = %d: no such GPU (this process sees %d)", i,
                                  devices[i], gpus);
        for (int j = 0; j < i; j++)
            if (devices[j] == devices[i])
                return ddk_comm_error(-EINVAL, err, err_len, "devices[%d] and devices[%d] are both cuda:%d", j, i,
                                      devices[i]);
    }
    ddk_link *l = (ddk_link *)calloc(1, sizeof *l);
    if (!l)
        return ddk_comm_error(-ENOMEM, err, err_len, "no host memory for a link");
    l->n = n;
    for (int i = 0; i < n; i++) {
        link_member *m = &l->m[i];
        m->device = devices[i];
        if (!(m->be = ddk_backend_cuda(devices[i]))) {
            ddk_link_destroy(l);
            return ddk_comm_error(-ENOMEM, err, err_len, "cuda:%d has no memory left for its stream and scratch",
                                  devices[i]);
        }
        cudaError_t e = cudaSetDevice(m->device);
        if (e == cudaSuccess)
            e = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&m->queued, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&m->sent, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&m->received, cudaEventDisableTiming);
        if (e == cudaSuccess)
            e = cudaEventCreateWithFlags(&m->fenced, cudaEventDisableTiming);
        if (e != cudaSuccess) {
            ddk_link_destroy(l);
            return ddk_comm_error(-EIO, err, err_len, "the link's stream and events on cuda:%d failed: %s; %s",
                                  devices[i], cudaGetErrorString(e), link_advice);
        }
    }
    ncclComm_t comms[LINK_MAX];
    ddk_nccl_lock();
    ncclResult_t r = ncclCommInitAll(comms, n, devices);
    int rc = 0;
    if (r != ncclSuccess)
        rc = ddk_comm_error(-EIO, err, err_len, "ncclCommInitAll over %d GPUs failed: %s (NCCL_DEBUG=INFO says more)",
                            n, ncclGetErrorString(r));
    for (int i = 0; i < n && !rc; i++)
        l->m[i].nccl = comms[i];
    for (int i = 0; i < n && !rc; i++) {   /* a receive waits for what was queued before the link */
        cudaError_t e = fence_member(&l->m[i]);
        if (e != cudaSuccess)
            rc = link_fail_cuda(l, "the link's first fence", l->m[i].device, e, err, err_len);
    }
    ddk_nccl_unlock();
    if (rc) {
        ddk_link_destroy(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* 0 when l may be used for members a and b, else -EINVAL / -EIO with err */
static int check_members(const ddk_link *l, int a, int b, char *err, size_t err_len)
{
    if (!l || a < 0 || a >= l->n || b < 0 || b >= l->n)
        return ddk_comm_error(-EINVAL, err, err_len, "link members %d and %d: the link has %d", a, b, l ? l->n : 0);
    if (l->aborted)
        return ddk_comm_error(-EIO, err, err_len, "the link was aborted after an earlier error: destroy it");
    return 0;
}

/* The copy of ddk_link_send, its arguments checked: 0, or -EIO with err, the link aborted.
 * Under the NCCL lock. */
static int queue_copy(ddk_link *l, int from, int to, const void *src, void *dst, size_t bytes, char *err,
                      size_t err_len)
{
    link_member *a = &l->m[from], *b = &l->m[to];
    cudaStream_t compute = ddk_cuda_stream(a->be);   /* also makes a's GPU current */
    cudaError_t e = cudaEventRecord(a->queued, compute);
    if (e == cudaSuccess)
        e = cudaStreamWaitEvent(a->stream, a->queued, 0);
    if (e == cudaSuccess)
        e = ddk_nccl_after(a->device, a->stream);
    if (e == cudaSuccess)
        e = ddk_nccl_after(b->device, b->stream);
    if (e != cudaSuccess)
        return link_fail_cuda(l, "the link copy's ordering", a->device, e, err, err_len);
    ncclResult_t r = ncclGroupStart();
    if (r == ncclSuccess)
        r = ncclSend(src, bytes, ncclChar, to, a->nccl, a->stream);
    if (r == ncclSuccess)
        r = ncclRecv(dst, bytes, ncclChar, from, b->nccl, b->stream);
    ncclResult_t end = ncclGroupEnd();   /* blocking communicators: queued on return */
    if (r != ncclSuccess || end != ncclSuccess)
        return link_fail_nccl(l, "ncclSend/ncclRecv", r != ncclSuccess ? r : end, err, err_len);
    if ((e = ddk_nccl_queued(b->device, b->stream)) == cudaSuccess &&
        (e = ddk_nccl_queued(a->device, a->stream)) == cudaSuccess &&   /* leaves a's GPU current */
        (e = cudaEventRecord(a->sent, a->stream)) == cudaSuccess)
        e = cudaStreamWaitEvent(compute, a->sent, 0);
    return e == cudaSuccess ? 0 : link_fail_cuda(l, "the link copy's ordering", a->device, e, err, err_len);
}

extern "C" int ddk_link_send(ddk_link *l, int from, int to, const void *src, void *dst, size_t bytes, char *err,
                             size_t err_len)
{
    ddk_nccl_lock();
    int rc = check_members(l, from, to, err, err_len);
    if (!rc && (from == to || !src || !dst))
        rc = ddk_comm_error(-EINVAL, err, err_len, "a link copy needs two members and two buffers");
    if (!rc && bytes)
        rc = queue_copy(l, from, to, src, dst, bytes, err, err_len);
    ddk_nccl_unlock();
    return rc;
}

extern "C" int ddk_link_fence(ddk_link *l, int to, char *err, size_t err_len)
{
    ddk_nccl_lock();
    int rc = check_members(l, to, to, err, err_len);
    cudaError_t e = rc ? cudaSuccess : fence_member(&l->m[to]);
    if (e != cudaSuccess)
        rc = link_fail_cuda(l, "the link's fence", l->m[to].device, e, err, err_len);
    ddk_nccl_unlock();
    return rc;
}
