/* backend_cuda.cu: the CUDA backend table of GPU d (ddk.h, struct ddk_backend), one per GPU, set
 * up at its first ddk_backend_cuda: memory (zero, copy, copy_rows, synchronize) here; its stream,
 * cuBLAS handle and scratch are stream_cuda.cu's, the matrix products matmul_cuda.cu's (fp32, bf16
 * on the tensor cores, and matmul_w16 / matmul_w16_nn against the target's bf16 weights as
 * stored), every other op is a kernel (kernel_ops.cu's list). The elementwise and normalisation
 * kernels are in ops_cuda.cu, the DFlash2 drafter's block convolution in block_conv_cuda.cu,
 * the whole-buffer ones (sumsq, axpby, adamw, uniform_noise) in vector_cuda.cu.
 *
 * Ordering (what callers rely on):
 *   - Each GPU has ONE stream (non-blocking, created on first use). Every op of this backend,
 *     zero and copy included, is queued on it, so ops run in the order they were issued and a
 *     buffer freed to the accounting allocator may be handed to the next op at once: its next
 *     user is on the same stream, after every op that used it before (a block the allocator
 *     gives back to CUDA goes through cudaFree, which waits for the device).
 *   - Calls return when the work is queued, not done. The host reads memory an op wrote (a copy
 *     to host memory included) only after ddk_cuda_synchronize(d); a host buffer given to copy as
 *     its source is not rewritten or freed before then either.
 *   - One host thread drives a GPU at a time (the trainer's one worker per rank). Several threads
 *     may still call in: the set-up of the stream, the cuBLAS handle and the scratch (at the
 *     first ddk_backend_cuda of the GPU, never inside an op) is guarded, and so are the ops with
 *     shared scratch (rmsnorm_backward's dg partials, sumsq's block partials, the loss's chunk
 *     sums).
 *   - A device error (a failed launch, a sticky CUDA error) aborts with the file, line and CUDA's
 *     message: the process cannot trust the GPU any more (DESIGN.md, "Failure policy"). Only the
 *     set-up reports out of memory (ddk_backend_cuda returns NULL, errno ENOMEM); no op allocates
 *     except the loss's workspace, whose refusal the loss returns as -ENOMEM.
 *
 * The loss is in loss_cuda.cu. DFlash attention (forward and backward), causal attention and
 * tree attention are in attention_cuda.cu. The Qwen3.5 target's DeltaNet core (gated_delta) is in
 * deltanet_cuda.cu, its conv1d + silu, gated RMSNorm and partial RoPE in ops_cuda.cu, its bf16
 * embedding gather, l2 norms, gates and output gate in target_cuda.cu.
 *
 * Tested by tests/kernels/test_backend_ops.c against the CPU backend (skipped without a GPU).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "stream_cuda.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>

enum { DDK_CUDA_MAX_GPUS = 64 };   /* device_cuda.cu's limit */

static cuda_backend backends[DDK_CUDA_MAX_GPUS];   /* stream_cuda.h */
static int backend_count;
static pthread_once_t backends_once = PTHREAD_ONCE_INIT;

/* ------------------------------------------------------------------------------------------
 * Memory
 */

/* bytes at dst (on this GPU) := 0, queued on the stream */
static void cuda_zero(const ddk_backend *be, void *dst, size_t bytes)
{
    if (bytes == 0)
        return;
    CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, ddk_cuda_stream(be)));
}

/* Any direction (host or device on either side: unified addressing tells them apart), queued
 * on the stream. Regions must not overlap (unlike the CPU backend's memmove). */
static void cuda_copy(const ddk_backend *be, void *dst, const void *src, size_t bytes)
{
    if (bytes == 0)
        return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, ddk_cuda_stream(be)));
}

/* cudaMemcpy2DAsync, any direction; pitches past INT_MAX bytes (beyond what some devices take
 * as a pitch, and no target's row) go row by row instead */
static void cuda_copy_rows(const ddk_backend *be, float *dst, int64_t ld_dst, const float *src,
                           int64_t ld_src, int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    const size_t width = (size_t)cols * sizeof(float);
    if (ld_dst <= INT_MAX / (int64_t)sizeof(float) && ld_src <= INT_MAX / (int64_t)sizeof(float)) {
        CUDA_CHECK(cudaMemcpy2DAsync(dst, (size_t)ld_dst * sizeof(float), src,
                                     (size_t)ld_src * sizeof(float), width, (size_t)rows,
                                     cudaMemcpyDefault, stream));
        return;
    }
    for (int64_t r = 0; r < rows; r++)
        CUDA_CHECK(cudaMemcpyAsync(dst + r * ld_dst, src + r * ld_src, width, cudaMemcpyDefault,
                                   stream));
}

static void cuda_synchronize(const ddk_backend *be)
{
    ddk_cuda_synchronize(cuda_of(be)->device);
}

/* ------------------------------------------------------------------------------------------
 * The tables
 */

static void backends_init(void)
{
    backend_count = ddk_cuda_device_count();
    if (backend_count > DDK_CUDA_MAX_GPUS)
        backend_count = DDK_CUDA_MAX_GPUS;
    for (int d = 0; d < backend_count; d++) {
        cuda_backend *cb = &backends[d];
        cb->table.name = "cuda";
        cb->table.alloc = ddk_allocator_cuda(d);
        cb->table.matmul = ddk_cuda_matmul;
        cb->table.matmul_bf16 = ddk_cuda_matmul_bf16;
        cb->table.matmul_w16 = ddk_cuda_matmul_w16;
        cb->table.matmul_w16_nn = ddk_cuda_matmul_w16_nn;
        cb->table.matmul_16 = ddk_cuda_matmul_16;
        cb->table.zero = cuda_zero;
        cb->table.copy = cuda_copy;
        cb->table.copy_rows = cuda_copy_rows;
        cb->table.synchronize = cuda_synchronize;
        ddk_cuda_kernel_ops(&cb->table);   /* kernel_ops.cu: every op that is a kernel */
        cb->device = d;
        pthread_mutex_init(&cb->lock, NULL);
        pthread_mutex_init(&cb->scratch_lock, NULL);
    }
}

extern "C" const ddk_backend *ddk_backend_cuda(int device)
{
    pthread_once(&backends_once, backends_init);
    if (device < 0 || device >= backend_count) {
        errno = EINVAL;
        return NULL;
    }
    cuda_backend *cb = &backends[device];
    if (!__atomic_load_n(&cb->ready, __ATOMIC_ACQUIRE)) {
        pthread_mutex_lock(&cb->lock);
        int rc = 0;
        if (!cb->ready && !(rc = ddk_cuda_device_usable(device, NULL, 0)))
            rc = ddk_cuda_stream_setup(cb);
        if (rc == 0)
            __atomic_store_n(&cb->ready, 1, __ATOMIC_RELEASE);
        pthread_mutex_unlock(&cb->lock);
        if (rc) {
            errno = -rc;
            return NULL;
        }
    }
    return &cb->table;
}

extern "C" const ddk_backend *ddk_backend_cuda_or_why(int device, char *why, size_t why_len)
{
    const ddk_backend *be = ddk_backend_cuda(device);
    if (be || !why || !why_len)
        return be;
    const int e = errno;
    if (e == ENOMEM)
        snprintf(why, why_len, "cuda:%d: no memory left on the GPU for the backend's stream, cuBLAS "
                 "handle and scratch (another process holds it? see nvidia-smi)", device);
    else
        ddk_cuda_device_usable(device, why, why_len);
    errno = e;
    return NULL;
}

extern "C" void ddk_cuda_synchronize(int device)
{
    pthread_once(&backends_once, backends_init);
    if (device < 0 || device >= backend_count)
        return;
    cuda_backend *cb = &backends[device];
    if (!__atomic_load_n(&cb->ready, __ATOMIC_ACQUIRE))
        return;   /* nothing was ever queued */
    CUDA_CHECK(cudaSetDevice(device));
    /* also reports an earlier kernel's fault (an illegal address) here, with its message */
    CUDA_CHECK(cudaStreamSynchronize(cb->stream));
}
