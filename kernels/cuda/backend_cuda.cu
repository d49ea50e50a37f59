/* backend_cuda.cu: the CUDA backend table of GPU d (ddk.h, struct ddk_backend): its stream, its
 * cuBLAS handle, memory (zero, copy, copy_rows, synchronize) and the matrix products (fp32, bf16
 * on the tensor cores, and matmul_w16 / matmul_w16_nn against the target's bf16 weights as
 * stored, W transposed or not; their panel loop ddk_cuda_w16_product serves the loss's bf16 head
 * too). The elementwise and normalisation kernels are in ops_cuda.cu, the whole-buffer ones
 * (sumsq, axpby, adamw, uniform_noise) in vector_cuda.cu.
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
 * Tested by tests/test_backend_ops.c against the CPU backend (skipped without a GPU).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * One backend per GPU: the table first (a const ddk_backend * is a pointer to it), then the
 * device's stream, cuBLAS handle and scratch, all three made together by the first
 * ddk_backend_cuda(device) (device_setup), before any run sets a budget on the GPU's allocator
 */

enum { DDK_CUDA_MAX_GPUS = 64 };   /* device_cuda.cu's limit */

/* rmsnorm_backward's per-slice dg partials: 4 MiB bounds the slices at 2^20 / d (ops_cuda.cu);
 * sumsq's block partials take 8 KiB of it (vector_cuda.cu), the loss its first half for chunk
 * sums (40 bytes a chunk) and the second for its bf16 operand panel (loss_cuda.cu), matmul_w16
 * and matmul_w16_nn all of it for their bf16 panel of a (2^21 values) */
static const size_t scratch_floats = DDK_CUDA_SCRATCH_FLOATS;
/* cuBLAS's workspace, given to it (cublasSetWorkspace) instead of its own lazy allocation:
 * 32 MiB, what NVIDIA recommends for Hopper and Blackwell */
static const size_t cublas_workspace_bytes = (size_t)32 << 20;

typedef struct cuda_backend {
    ddk_backend table;          /* must stay first */
    int device;
    int multiprocessors;        /* read once, for grid sizes */
    pthread_mutex_t lock;       /* guards the set-up below */
    int ready;                  /* stream, cublas, scratch made; read with acquire, written
                                   with release under lock */
    cudaStream_t stream;
    cublasHandle_t cublas;
    pthread_mutex_t scratch_lock;   /* held from the first to the last launch that uses it */
    float *scratch;             /* scratch_floats, then cuBLAS's workspace: one cudaMalloc outside
                                   the accounting allocator */
} cuda_backend;

static cuda_backend backends[DDK_CUDA_MAX_GPUS];
static int backend_count;
static pthread_once_t backends_once = PTHREAD_ONCE_INIT;

static cuda_backend *cuda_of(const ddk_backend *be)
{
    return (cuda_backend *)be;   /* table is the first member */
}

/* Makes this host thread's current device be's GPU (current devices are per thread) and returns
 * its stream. be came from ddk_backend_cuda, which made the stream. */
cudaStream_t ddk_cuda_stream(const ddk_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    CUDA_CHECK(cudaSetDevice(cb->device));
    return cb->stream;
}

int ddk_cuda_multiprocessors(const ddk_backend *be)
{
    return cuda_of(be)->multiprocessors;
}

/* The cuBLAS handle of be's GPU, bound to its stream. cuBLAS allows one handle to be used by
 * several threads as long as its settings do not change, and they are set once, in
 * device_setup. */
static cublasHandle_t cuda_cublas(const ddk_backend *be)
{
    ddk_cuda_stream(be);   /* be's GPU current for the call */
    return cuda_of(be)->cublas;
}

/* Locks be's scratch (DDK_CUDA_SCRATCH_FLOATS floats, made with the stream: never NULL) and
 * returns it. Always pair with ddk_cuda_scratch_unlock(), called after the last launch that uses
 * it is queued: launches are stream-ordered, so the next holder's launches run after them. */
float *ddk_cuda_scratch_lock(const ddk_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    pthread_mutex_lock(&cb->scratch_lock);
    return cb->scratch;
}

void ddk_cuda_scratch_unlock(const ddk_backend *be)
{
    pthread_mutex_unlock(&cuda_of(be)->scratch_lock);
}

/* The stream, the cuBLAS handle and the scratch of cb's GPU, all or nothing. They are made here
 * once, so that no op allocates on its first call inside a run: cuBLAS's handle and its 32 MiB
 * workspace and the 4 MiB scratch are the backend's, outside the accounting allocator and any
 * budget a run sets. (The driver still loads a kernel's module at its first launch.)
 * 0; -ENOMEM when the GPU has no memory for them (what was made is undone, and a later call tries
 * again); any other failure is a device error and ends the process (CUDA_CHECK). */
static int device_setup(cuda_backend *cb)
{
    CUDA_CHECK(cudaSetDevice(cb->device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, cb->device));
    cb->multiprocessors = prop.multiProcessorCount;
    /* non-blocking: the legacy default stream (cudaMalloc's neighbours, other libraries) does not
     * serialise with it; our ops order themselves on it */
    cudaError_t err = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return -ENOMEM;
    }
    CUDA_CHECK(err);
    /* one block: the scratch, then cuBLAS's workspace (so that its first product allocates
     * nothing either) */
    err = cudaMalloc((void **)&cb->scratch, scratch_floats * sizeof(float) + cublas_workspace_bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        CUDA_CHECK(cudaStreamDestroy(cb->stream));
        return -ENOMEM;
    }
    CUDA_CHECK(err);
    const cublasStatus_t st = cublasCreate(&cb->cublas);
    if (st == CUBLAS_STATUS_ALLOC_FAILED) {
        cudaGetLastError();   /* cuBLAS's own failed cudaMalloc: not sticky, not ours to report */
        CUDA_CHECK(cudaFree(cb->scratch));
        CUDA_CHECK(cudaStreamDestroy(cb->stream));
        return -ENOMEM;
    }
    CUBLAS_CHECK(st);
    CUBLAS_CHECK(cublasSetStream(cb->cublas, cb->stream));   /* resets the workspace: set it after */
    CUBLAS_CHECK(cublasSetWorkspace(cb->cublas, cb->scratch + scratch_floats, cublas_workspace_bytes));
    /* plain fp32 FMA with fp32 accumulation, never TF32 (cuBLAS's default, made explicit): the
     * CPU backend's numbers. TF32 would be a later, measured choice. */
    CUBLAS_CHECK(cublasSetMathMode(cb->cublas, CUBLAS_DEFAULT_MATH));
    return 0;
}

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
 * Matrix product: cuBLAS, column-major. A row-major (r, c) matrix with row stride ld is, read
 * column-major, its (c, r) transpose with leading dimension ld. So the row-major
 * c = op(a) op(b) is the column-major c^T = op(b)^T op(a)^T: swap the operands and m with n,
 * keep each operand's transpose flag.
 */

static int to_int(int64_t v)
{
    if (v < 0 || v > INT_MAX)   /* a programming error: no caller's dimension is near 2^31 */
        ddk_fatal(__FILE__, __LINE__, "matmul dimension %lld does not fit cuBLAS's int", (long long)v);
    return (int)v;
}

/* 1 when c (m, n) = alpha op(a) op(b) + beta c has no product to run, c then done: nothing for
 * an empty c (m or n 0); c = beta c for k = 0 (BLAS's rule: 0 for beta = 0, whatever c held,
 * NaN included), without relying on cuBLAS's k = 0 behaviour (undocumented): a 2-D memset for
 * beta = 0, else cublasSgeam in place (C = beta C + 0 C, in-place C = A with ldc = lda is
 * documented). Every product of this file starts with it. */
static int no_product(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float beta, float *c,
                      int64_t ldc)
{
    if (m == 0 || n == 0)
        return 1;
    if (k != 0)
        return 0;
    if (beta == 0.0f) {
        CUDA_CHECK(cudaMemset2DAsync(c, (size_t)ldc * sizeof(float), 0, (size_t)n * sizeof(float),
                                     (size_t)m, ddk_cuda_stream(be)));
        return 1;
    }
    const float zero = 0.0f;
    CUBLAS_CHECK(cublasSgeam(cuda_cublas(be), CUBLAS_OP_N, CUBLAS_OP_N, to_int(n), to_int(m), &beta, c,
                             to_int(ldc), &zero, c, to_int(ldc), c, to_int(ldc)));
    return 1;
}

static void cuda_matmul(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    cublasHandle_t handle = cuda_cublas(be);
    CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n), to_int(m), to_int(k),
                             &alpha, b, to_int(ldb), a, to_int(lda), &beta, c, to_int(ldc)));
}

/* The same product on the tensor cores: fp32 in memory (a, b, c all CUDA_R_32F), cuBLAS
 * down-converts a and b to bf16 (CUBLAS_COMPUTE_32F_FAST_16BF; its header says "or TF32", which
 * is finer) and accumulates in fp32. The rounding mode of that conversion is not documented:
 * tests/test_backend_ops.c holds the tolerance against the CPU's round-to-nearest-even. */
static void cuda_matmul_bf16(const ddk_backend *be, int trans_a, int trans_b, int64_t m,
                             int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                             const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    cublasHandle_t handle = cuda_cublas(be);
    CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n), to_int(m), to_int(k),
                              &alpha, b, CUDA_R_32F, to_int(ldb), a, CUDA_R_32F, to_int(lda),
                              &beta, c, CUDA_R_32F, to_int(ldc), CUBLAS_COMPUTE_32F_FAST_16BF,
                              CUBLAS_GEMM_DEFAULT));
}

/* c (m, n) = alpha bf16(a) op(W) + beta c with W bf16 as stored: op(W) = W^T, W (n, k), when
 * trans_w (matmul_w16); W itself, W (k, n), when not (matmul_w16_nn). cuBLAS takes both operands
 * of a product in one type, so a is rounded to bf16 first (round to nearest even, as the CPU),
 * into panel (rows, ld_panel), part of the backend's scratch that the caller holds locked:
 * `rows` rows of a kp-column k-panel at a time, ld_panel = kp rounded up to 8 (16-byte rows for
 * the tensor cores), rows x ld_panel within the panel. Each panel is then one cublasGemmEx with
 * bf16 operands, fp32 accumulation and fp32 c (CUBLAS_COMPUTE_32F). The products of bf16 values
 * are exact in fp32, so GPU and CPU differ by their fp32 sums' order alone. Panels along k
 * accumulate into c with beta 1, as the CPU's do; stream order keeps each panel's rounding
 * behind the previous product. m, n, k >= 1. */
void ddk_cuda_w16_product(const ddk_backend *be, int trans_w, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const uint16_t *w,
                          int64_t ldw, float beta, float *c, int64_t ldc, uint16_t *panel,
                          int64_t rows, int64_t kp)
{
    cublasHandle_t handle = cuda_cublas(be);
    const int64_t ld_panel = (kp + 7) / 8 * 8;
    for (int64_t k0 = 0; k0 < k; k0 += kp) {
        const int64_t kb = k - k0 < kp ? k - k0 : kp;
        const float beta_panel = k0 == 0 ? beta : 1.0f;
        /* column-major, W read as W^T (n, k) with OP_T, or as itself (n, k) with OP_N */
        const uint16_t *wk = trans_w ? w + k0 : w + k0 * ldw;
        for (int64_t m0 = 0; m0 < m; m0 += rows) {
            const int64_t mb = m - m0 < rows ? m - m0 : rows;
            ddk_cuda_round_bf16_rows(be, a + m0 * lda + k0, lda, mb, kb, panel, ld_panel);
            CUBLAS_CHECK(cublasGemmEx(handle, trans_w ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N,
                                      to_int(n), to_int(mb), to_int(kb), &alpha, wk, CUDA_R_16BF,
                                      to_int(ldw), panel, CUDA_R_16BF, to_int(ld_panel),
                                      &beta_panel, c + m0 * ldc, CUDA_R_32F, to_int(ldc),
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        }
    }
}

/* Both operands bf16 in memory (matmul_16): one cublasGemmEx, CUDA_R_16BF a and b, fp32
 * accumulation and c (CUBLAS_COMPUTE_32F: cuBLAS picks its cuBLASLt tensor-core kernel), no
 * conversion and no scratch. */
static void cuda_matmul_16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const uint16_t *a, int64_t lda,
                           const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    cublasHandle_t handle = cuda_cublas(be);
    CUBLAS_CHECK(cublasGemmEx(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n), to_int(m), to_int(k),
                              &alpha, b, CUDA_R_16BF, to_int(ldb), a, CUDA_R_16BF, to_int(lda),
                              &beta, c, CUDA_R_32F, to_int(ldc), CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

/* matmul_w16 and matmul_w16_nn: the whole scratch is the panel (2^21 values), whole k up to
 * 2^21 columns (k-panels only past that), rows a multiple of 128 when there are that many, so
 * cuBLAS's tiles are not cut. The scratch stays locked until the last product is queued. */
static void cuda_matmul_w16_op(const ddk_backend *be, int trans_w, int64_t m, int64_t n, int64_t k,
                               float alpha, const float *a, int64_t lda, const uint16_t *w,
                               int64_t ldw, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    const int64_t capacity = 2 * (int64_t)scratch_floats;          /* bf16 values in the scratch */
    const int64_t kp = k < capacity ? k : capacity;                /* columns of a k-panel */
    int64_t rows = capacity / ((kp + 7) / 8 * 8);
    rows = rows >= 128 ? rows / 128 * 128 : rows;
    rows = rows < m ? rows : m;
    uint16_t *panel = (uint16_t *)ddk_cuda_scratch_lock(be);
    ddk_cuda_w16_product(be, trans_w, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc, panel, rows, kp);
    ddk_cuda_scratch_unlock(be);
}

static void cuda_matmul_w16(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                            float beta, float *c, int64_t ldc)
{
    cuda_matmul_w16_op(be, 1, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}

static void cuda_matmul_w16_nn(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                               const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                               float beta, float *c, int64_t ldc)
{
    cuda_matmul_w16_op(be, 0, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
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
        cb->table.matmul = cuda_matmul;
        cb->table.matmul_bf16 = cuda_matmul_bf16;
        cb->table.matmul_w16 = cuda_matmul_w16;
        cb->table.matmul_w16_nn = cuda_matmul_w16_nn;
        cb->table.matmul_16 = cuda_matmul_16;
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
            rc = device_setup(cb);
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
