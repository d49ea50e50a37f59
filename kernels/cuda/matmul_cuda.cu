/* matmul_cuda.cu: the CUDA backend's matrix products, cuBLAS on the GPU's stream (ddk.h, struct
 * ddk_backend): matmul (fp32), matmul_bf16 (the tensor cores), matmul_w16 / matmul_w16_nn against
 * the target's bf16 weights as stored, W transposed or not (their panel loop,
 * ddk_cuda_w16_product, serves the loss's bf16 head too), matmul_16 (both operands bf16), which
 * backend_cuda.cu sets into a GPU's table (declared in cuda_backend.h).
 *
 * Tested by tests/kernels/test_backend_ops.c against the CPU backend (skipped without a GPU).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "stream_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <limits.h>

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
    CUBLAS_CHECK(cublasSgeam(ddk_cuda_cublas(be), CUBLAS_OP_N, CUBLAS_OP_N, to_int(n), to_int(m),
                             &beta, c, to_int(ldc), &zero, c, to_int(ldc), c, to_int(ldc)));
    return 1;
}

void ddk_cuda_matmul(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    cublasHandle_t handle = ddk_cuda_cublas(be);
    CUBLAS_CHECK(cublasSgemm(handle, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                             trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n), to_int(m), to_int(k),
                             &alpha, b, to_int(ldb), a, to_int(lda), &beta, c, to_int(ldc)));
}

/* c (m, n) row-major = alpha op(a) op(b) + beta c with a and b of type ab (fp32 c): one
 * cublasGemmEx of the column-major transpose, c^T = op(b)^T op(a)^T, under compute */
static void row_major_gemm(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k,
                           float alpha, const void *a, int64_t lda, const void *b, int64_t ldb, cudaDataType ab,
                           float beta, float *c, int64_t ldc, cublasComputeType_t compute)
{
    CUBLAS_CHECK(cublasGemmEx(ddk_cuda_cublas(be), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                              trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n), to_int(m), to_int(k), &alpha, b, ab,
                              to_int(ldb), a, ab, to_int(lda), &beta, c, CUDA_R_32F, to_int(ldc), compute,
                              CUBLAS_GEMM_DEFAULT));
}

/* The same product on the tensor cores: fp32 in memory (a, b, c all CUDA_R_32F), cuBLAS
 * down-converts a and b to bf16 (CUBLAS_COMPUTE_32F_FAST_16BF; its header says "or TF32", which
 * is finer) and accumulates in fp32. The rounding mode of that conversion is not documented:
 * tests/kernels/test_backend_ops.c holds the tolerance against the CPU's round-to-nearest-even. */
void ddk_cuda_matmul_bf16(const ddk_backend *be, int trans_a, int trans_b, int64_t m,
                          int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                          const float *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    row_major_gemm(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, CUDA_R_32F, beta, c, ldc,
                   CUBLAS_COMPUTE_32F_FAST_16BF);
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
    cublasHandle_t handle = ddk_cuda_cublas(be);
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
void ddk_cuda_matmul_16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (no_product(be, m, n, k, beta, c, ldc))
        return;
    row_major_gemm(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, CUDA_R_16BF, beta, c, ldc,
                   CUBLAS_COMPUTE_32F);
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
    const int64_t capacity = 2 * (int64_t)DDK_CUDA_SCRATCH_FLOATS; /* bf16 values in the scratch */
    const int64_t kp = k < capacity ? k : capacity;                /* columns of a k-panel */
    int64_t rows = capacity / ((kp + 7) / 8 * 8);
    rows = rows >= 128 ? rows / 128 * 128 : rows;
    rows = rows < m ? rows : m;
    uint16_t *panel = (uint16_t *)ddk_cuda_scratch_lock(be);
    ddk_cuda_w16_product(be, trans_w, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc, panel, rows, kp);
    ddk_cuda_scratch_unlock(be);
}

void ddk_cuda_matmul_w16(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                         float beta, float *c, int64_t ldc)
{
    cuda_matmul_w16_op(be, 1, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}

void ddk_cuda_matmul_w16_nn(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                            float beta, float *c, int64_t ldc)
{
    cuda_matmul_w16_op(be, 0, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}
