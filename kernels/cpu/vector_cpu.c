/* vector_cpu.c: the CPU backend's whole-buffer ops (sum of squares, axpby, the AdamW update,
 * the features' uniform noise, the argmax of rows: ddk_vargmax's 8 lanes; the top-K of rows and
 * its running merge, which the fused loss's online top-K uses too: topk_row.h's order behind an
 * 8-lane filter; the log-sum-exp of rows and a column's log-probability, in double from the
 * row's max)
 * and its bf16 products (matmul with both operands rounded to bf16, the reference for the GPU's
 * tensor-core product, and matmul_w16 / matmul_w16_nn, the same product against bf16 weights as
 * stored, transposed or not, and matmul_16 with both operands bf16 in memory: one emulation,
 * bf16_panels, so they agree bit for bit; round_bf16, the activations' rounding). Contracts
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
 * Tested by tests/kernels/test_ops.c (against plain loops and a float64 product of rounded operands),
 * tests/engine/model/test_optimizer.c (the update, through the trainer's optimiser),
 * tests/kernels/test_topk.c (topk_rows against a naive sort) and tests/kernels/test_backend_ops.c
 * (logsumexp_rows against a naive float64 reference, on every machine).
 */
#include "ddk.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "ddk_vmath.h"
#include "cpu_backend.h"
#include "topk_row.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* a lane of m set */
static inline int any_lane(ddk_i8 m)
{
    return (m[0] | m[1] | m[2] | m[3] | m[4] | m[5] | m[6] | m[7]) != 0;
}

void ddk_cpu_topk_merge(const float *x, int64_t w, int64_t off, int k, float *val, int32_t *idx,
                        int *count)
{
    int64_t v = 0;
    while (v < w) {
        if (*count < k || val[k - 1] != val[k - 1]) {   /* room, or a NaN last: every pair */
            ddk_topk_insert(val, idx, count, k, x[v], (int32_t)(off + v));
            v++;
            continue;
        }
        /* full with a number last: only a larger value comes before it (x's indices are above
         * the list's), so 8 columns at a time are passed over until one lane is larger */
        const ddk_f8 last = ddk_f8_splat(val[k - 1]);
        while (v + 8 <= w && !any_lane(ddk_f8_load(x + v) > last))
            v += 8;
        for (const int64_t end = v + 8 < w ? v + 8 : w; v < end; v++)
            if (x[v] > val[k - 1])
                ddk_topk_insert(val, idx, count, k, x[v], (int32_t)(off + v));
    }
}

void ddk_cpu_topk_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int64_t k,
                       int32_t *idx, float *val)
{
    (void)be;
    if (rows <= 0)
        return;
    if (k < 1 || k > n || k > DDK_SELECTOR_MAX_K || n > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "topk_rows: k %lld of rows of %lld: 1 <= k <= min(n, %d)",
                  (long long)k, (long long)n, DDK_SELECTOR_MAX_K);
    for (int64_t r = 0; r < rows; r++) {
        float best[DDK_SELECTOR_MAX_K];
        int count = 0;
        ddk_cpu_topk_merge(x + r * n, n, 0, (int)k, best, idx + r * k, &count);
        if (val)
            memcpy(val + r * k, best, (size_t)k * sizeof(float));
    }
}

/* x - m in double, the exponent of x's term of its row's sum (m the row's max): -inf for a NaN,
 * 0 where x is the max itself (so a row's +infs are terms of 1, where inf - inf would be NaN) */
static inline double lse_shift(float x, double m)
{
    return x != x ? -INFINITY : x == m ? 0.0 : (double)x - m;
}

/* The row's max m (NaNs passed over), then s = sum exp(x - m) in double in index order (each
 * term in (0, 1], the max's 1: no overflow, whatever the magnitudes); lse = m + log s and
 * lp = (x[col] - m) - log s, each rounded once to float. A row of only -inf and NaN gives -inf
 * for both; a row with +inf gives lse +inf and lp -log(its +infs) at one of them (-inf
 * elsewhere). A col outside [0, n) gives lp -inf (x is never read there). */
void ddk_cpu_logsumexp_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n,
                            const int32_t *col, float *lse, float *lp)
{
    (void)be;
    if (rows <= 0)
        return;
    if (n < 1 || n > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "logsumexp_rows: %lld rows of %lld: n in [1, 2^31)",
                  (long long)rows, (long long)n);
    for (int64_t r = 0; r < rows; r++) {
        const float *row = x + r * n;   /* (n) */
        float max;
        ddk_vargmax(row, n, &max);
        const double m = max;
        double s = 0.0;
        for (int64_t j = 0; j < n; j++)
            s += exp(lse_shift(row[j], m));
        const double log_s = log(s);
        lse[r] = max == -INFINITY ? -INFINITY : (float)(m + log_s);
        if (lp) {
            const int64_t c = col[r];
            lp[r] = max == -INFINITY || c < 0 || c >= n ? -INFINITY
                                                        : (float)(lse_shift(row[c], m) - log_s);
        }
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

/* restrict: w, g, m, v (and w16) never alias; the scalars as locals so the loop is all float32.
 * The bf16 copy is a second loop over the updated w (the first stays vectorised), while the
 * block of w is still in cache. */
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

void ddk_cpu_round_bf16(const ddk_backend *be, const float *x, int64_t count, uint16_t *y)
{
    (void)be;
    for (int64_t i = 0; i < count; i++)
        y[i] = ddk_f32_to_bf16(x[i]);
}

void ddk_cpu_adamw(const ddk_backend *be, float *w, float *g, float *m, float *v, uint16_t *w16,
                   int64_t count, const ddk_adamw_scalars *s)
{
    enum { BLOCK = 4096 };   /* floats of w per pass: 16 KiB, in L1 for the rounding */
    for (int64_t i = 0; i < count; i += BLOCK) {
        const int64_t n = count - i < BLOCK ? count - i : BLOCK;
        adamw_loop(w + i, g + i, m + i, v + i, n, *s);
        if (w16)
            ddk_cpu_round_bf16(be, w + i, n, w16 + i);
    }
}

enum { PANEL = 256 };

/* The bf16 product's one emulation: op(a) (m, k) and op(b) (k, n) as bf16 values PANEL columns
 * of k at a time, each panel's fp32 product accumulated in c. Each operand is fp32 (a, b:
 * rounded here) or bf16 (a16, b16 when not NULL: widened, exact), so that matmul_w16,
 * matmul_w16_nn and matmul_16 are matmul_bf16 bit for bit. */
typedef struct panel_operand {
    const float *f;      /* fp32, rounded to bf16 here ... */
    const uint16_t *h;   /* ... or bf16 (when not NULL), widened */
    int64_t ld;
    int trans;
} panel_operand;

static inline float panel_value(const panel_operand *x, int64_t row, int64_t col)
{
    const int64_t at = x->trans ? col * x->ld + row : row * x->ld + col;
    return x->h ? ddk_bf16_to_f32(x->h[at]) : ddk_round_bf16(x->f[at]);
}

static void bf16_panels(int64_t m, int64_t n, int64_t k, float alpha, panel_operand a,
                        panel_operand b, float beta, float *c, int64_t ldc)
{
    float *ap = malloc((size_t)(m + n) * PANEL * sizeof(float));   /* (m, PANEL) then (PANEL, n) */
    if (!ap)   /* a reference path: no recovery from a host without (m + n) x 1 KiB */
        ddk_fatal(__FILE__, __LINE__, "matmul_bf16: no memory for a %lld x %d panel", (long long)(m + n), PANEL);
    float *bp = ap + m * PANEL;
    for (int64_t k0 = 0; k0 < k; k0 += PANEL) {
        const int64_t kb = k - k0 < PANEL ? k - k0 : PANEL;
        for (int64_t i = 0; i < m; i++)      /* op(a) (m, k): row i, column k0 + p */
            for (int64_t p = 0; p < kb; p++)
                ap[i * kb + p] = panel_value(&a, i, k0 + p);
        for (int64_t p = 0; p < kb; p++)     /* op(b) (k, n): row k0 + p, column j */
            for (int64_t j = 0; j < n; j++)
                bp[p * n + j] = panel_value(&b, k0 + p, j);
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
    bf16_panels(m, n, k, alpha, (panel_operand){ a, NULL, lda, trans_a },
                (panel_operand){ b, NULL, ldb, trans_b }, beta, c, ldc);
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
    bf16_panels(m, n, k, alpha, (panel_operand){ a, NULL, lda, 0 },
                (panel_operand){ NULL, w, ldw, trans_w }, beta, c, ldc);
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

void ddk_cpu_matmul_16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                       int64_t ldb, float beta, float *c, int64_t ldc)
{
    (void)be;
    if (m == 0 || n == 0)
        return;   /* c is empty */
    if (k == 0) {   /* nothing to sum */
        scale_only(m, n, beta, c, ldc);
        return;
    }
    bf16_panels(m, n, k, alpha, (panel_operand){ NULL, a, lda, trans_a },
                (panel_operand){ NULL, b, ldb, trans_b }, beta, c, ldc);
}
