/* vector_cpu.c: the CPU backend's whole-buffer ops (sum of squares, axpby, the AdamW update,
 * the features' uniform noise, the argmax of rows: ddk_vargmax's 8 lanes)
 * and its bf16 products (matmul with both operands rounded to bf16, the reference for the GPU's
 * tensor-core product, and matmul_w16 / matmul_w16_nn, the same product against bf16 weights as
 * stored, transposed or not: one emulation, bf16_panels, so they agree bit for bit). Contracts
 * in ddk.h (struct ddk_backend).
 *
 * sumsq keeps eight float64 lanes (gcc vectorises them; no -ffast-math, so the order is fixed
 * by count alone); adamw is one float32 loop that gcc vectorises at -O3 because this file is
 * built with -fno-math-errno (kernels/CMakeLists.txt: with errno every sqrtf carries a branch
 * to libm; v >= 0, so errno would never be set anyway). matmul_bf16 rounds op(a) and op(b) to
 * bf16 (round to nearest even) in panels of PANEL columns of k, so its scratch is
 * (m + n) x PANEL floats whatever k is, and accumulates the panels' fp32 products in c;
 * matmul_w16 (W^T) and matmul_w16_nn (W) widen their W panel instead of rounding it (exact),
 * never all of W at once.
 *
 * Tested by tests/test_ops.c (against plain loops and a float64 product of rounded operands)
 * and tests/test_optimizer.c (the update, through the trainer's optimiser).
 */
#include "ddk.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "ddk_vmath.h"
#include "cpu_backend.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>

void ddk_cpu_synchronize(const ddk_backend *be)
{
    (void)be;   /* every CPU op is done when it returns */
}

double ddk_cpu_sumsq(const ddk_backend *be, const float *x, int64_t count)
{
    enum { lanes = 8 };
    double acc[lanes] = { 0 };
    int64_t i = 0;
    for (; i + lanes <= count; i += lanes)
        for (int k = 0; k < lanes; k++)
            acc[k] += (double)x[i + k] * (double)x[i + k];
    double sum = 0;
    for (; i < count; i++)
        sum += (double)x[i] * (double)x[i];
    for (int k = 0; k < lanes; k++)
        sum += acc[k];
    return sum;
}

void ddk_cpu_argmax_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int32_t *out)
{
    (void)be;
    for (int64_t r = 0; r < rows; r++) {
        float max;
        out[r] = (int32_t)ddk_vargmax(x + r * n, n, &max);
    }
}

void ddk_cpu_axpby(const ddk_backend *be, int64_t count, float alpha, const float *x, float beta,
                   float *y)
{
    if (beta == 0.0f)
        for (int64_t i = 0; i < count; i++)
            y[i] = alpha * x[i];
    else
        for (int64_t i = 0; i < count; i++)
            y[i] = alpha * x[i] + beta * y[i];
}

void ddk_cpu_uniform_noise(const ddk_backend *be, float *x, int64_t count, float sigma, uint64_t seed)
{
    if (sigma == 0.0f)
        return;
    for (int64_t i = 0; i < count; i++) {
        const float t = (float)(ddk_rng_at(seed, (uint64_t)i) >> 40) * 0x1p-23f - 1.0f;   /* exact */
        x[i] = fmaf(sigma, t, x[i]);
    }
}

/* restrict: w, g, m, v never alias; the scalars as locals so the loop is all float32 */
static void adamw_loop(float *restrict w, float *restrict g, float *restrict m, float *restrict v,
                       int64_t count, ddk_adamw_scalars s)
{
    for (int64_t i = 0; i < count; i++) {
        float gi = g[i] * s.grad_scale;
        g[i] = gi;
        float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
        float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float direction = (mi * s.inv_bc1) / (sqrtf(vi * s.inv_bc2) + s.eps);
        w[i] -= s.lr * direction + s.lr_wd * w[i];
    }
}

void ddk_cpu_adamw(const ddk_backend *be, float *w, float *g, float *m, float *v, int64_t count,
                   const ddk_adamw_scalars *s)
{
    adamw_loop(w, g, m, v, count, *s);
}

enum { PANEL = 256 };

/* The bf16 product's one emulation: op(a) (m, k) and op(b) (k, n) rounded to bf16 PANEL columns
 * of k at a time, each panel's fp32 product accumulated in c. The second operand is b (fp32,
 * rounded here) or, when w is not NULL, op(w) with w bf16 (n, k) when trans_b, (k, n) when not,
 * row stride ldw (widened, exact), so that matmul_w16 and matmul_w16_nn are matmul_bf16 bit for
 * bit. */
static void bf16_panels(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                        int64_t ldb, const uint16_t *w, int64_t ldw, float beta, float *c,
                        int64_t ldc)
{
    float *ap = malloc((size_t)(m + n) * PANEL * sizeof(float));   /* (m, PANEL) then (PANEL, n) */
    if (!ap)   /* a reference path: no recovery from a host without (m + n) x 1 KiB */
        ddk_fatal(__FILE__, __LINE__, "matmul_bf16: no memory for a %lld x %d panel", (long long)(m + n), PANEL);
    float *bp = ap + m * PANEL;
    for (int64_t k0 = 0; k0 < k; k0 += PANEL) {
        const int64_t kb = k - k0 < PANEL ? k - k0 : PANEL;
        for (int64_t i = 0; i < m; i++)
            for (int64_t p = 0; p < kb; p++)
                ap[i * kb + p] = ddk_round_bf16(trans_a ? a[(k0 + p) * lda + i] : a[i * lda + k0 + p]);
        if (w)
            for (int64_t p = 0; p < kb; p++)
                for (int64_t j = 0; j < n; j++)
                    bp[p * n + j] = ddk_bf16_to_f32(trans_b ? w[j * ldw + k0 + p] : w[(k0 + p) * ldw + j]);
        else
            for (int64_t p = 0; p < kb; p++)
                for (int64_t j = 0; j < n; j++)
                    bp[p * n + j] = ddk_round_bf16(trans_b ? b[j * ldb + k0 + p] : b[(k0 + p) * ldb + j]);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)m, (blasint)n, (blasint)kb,
                    alpha, ap, (blasint)kb, bp, (blasint)n, k0 == 0 ? beta : 1.0f, c, (blasint)ldc);
    }
    free(ap);
}

void ddk_cpu_matmul_bf16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc)
{
    if (m == 0 || n == 0)
        return;   /* c is empty */
    if (k == 0) {   /* nothing to round: c = beta c */
        be->matmul(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    bf16_panels(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, NULL, 0, beta, c, ldc);
}

/* c (m, n) = beta c for a product over k = 0 (0 for beta = 0, whatever c held: BLAS's rule) */
static void scale_only(int64_t m, int64_t n, float beta, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
}

/* matmul_w16 (trans_w 1: W (n, k)) and matmul_w16_nn (trans_w 0: W (k, n)) */
static void matmul_w16_op(const ddk_backend *be, int trans_w, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                          float beta, float *c, int64_t ldc)
{
    if (m == 0 || n == 0)
        return;   /* c is empty */
    if (k == 0) {   /* nothing to sum */
        scale_only(m, n, beta, c, ldc);
        return;
    }
    bf16_panels(be, 0, trans_w, m, n, k, alpha, a, lda, NULL, 0, w, ldw, beta, c, ldc);
}

void ddk_cpu_matmul_w16(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                        float *c, int64_t ldc)
{
    matmul_w16_op(be, 1, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}

void ddk_cpu_matmul_w16_nn(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                           float *c, int64_t ldc)
{
    matmul_w16_op(be, 0, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}
