/* selector_row.h: the DFlash2 path selector's term of one position (SPEC.md 2.1), the part that
 * is K numbers long, written once for both backends: kernels/cpu/selector_cpu.c runs it per row,
 * kernels/cuda/selector_cuda.cu in one thread of a row's block. The r-long parts (u = A[p] q, the
 * scores' dot products with Bs rows, b = sum_k ds_k Bs[cand_k]) and the products are each
 * backend's own. Not installed; C and CUDA (nvcc: __host__ __device__; the SIMT emulation: host
 * C++); no CUDA types.
 *
 * Per position that counts, after the online top-K of zs (topk_row.h) gave cand (K ids) and cz
 * (their zs): the label y is looked up among them (ddk_sel_place_label: covered, and with
 * inject the last candidate replaced by y and its own unary logit zs[y]); with a term, from the
 * scores s_k = cz_k + sum_r A[p, r] q_r Bs[cand_k, r] (the backend's), l_sel = logsumexp(s) -
 * s[k*] and ds = coef (softmax(s) - onehot(k*)), coef = w_i / sum w * weight (ddk_sel_terms).
 * In double from the float scores; softmax - 1 at k* is -(sum of the others) / sum and l_sel is
 * log1p(others / e_k*), as the unary CE (loss_row.h): exact as the selector grows sure.
 *
 * Tested through both backends: tests/kernels/test_loss_selector.c (ddk_loss_cpu against the
 * float64 reference, tests/kernels/loss_reference.c) and the SIMT emulation (tests/simt: the CUDA
 * loss with a selector against the CPU backend under each card).
 *
 * Legend: K candidates (top_k), k* the label's index among them.
 */
#ifndef DDK_SELECTOR_ROW_H
#define DDK_SELECTOR_ROW_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DDK_SEL_FN static __forceinline__ __host__ __device__
#else
#define DDK_SEL_FN static inline
#endif

/* The label y among the candidates cand (K) of a row that counts: its index k*, or -1 when the
 * row has no term. *covered: y was among them (the strict sense). With inject and y not among
 * them, the last candidate becomes y with its unary logit z_y (cz its zs), so k* = K - 1. */
DDK_SEL_FN int ddk_sel_place_label(int32_t *cand, float *cz, int K, int32_t y, float z_y,
                                   int inject, int *covered)
{
    for (int k = 0; k < K; k++)
        if (cand[k] == y) {
            *covered = 1;
            return k;
        }
    *covered = 0;
    if (!inject)
        return -1;
    cand[K - 1] = y;
    cz[K - 1] = z_y;
    return K - 1;
}

/* From the scores s (K, float) of a row with a term at k*: returns l_sel = logsumexp(s) -
 * s[k*], sets *pick to the first index of the largest score (a NaN after the first score never
 * wins; a NaN score makes l_sel NaN either way, as a NaN logit makes CE NaN), and, when
 * want_ds, overwrites s with ds_k = coef (softmax(s)_k - [k = k*]) */
DDK_SEL_FN double ddk_sel_terms(float *s, int K, int kstar, double coef, int want_ds, int *pick)
{
    int top = 0;
    for (int k = 1; k < K; k++)
        if (s[k] > s[top])
            top = k;
    *pick = top;
    const double m = s[top];
    double sum = 0.0, rest = 0.0;   /* sum_k exp(s_k - m); the same without k* */
    for (int k = 0; k < K; k++) {
        const double e = exp((double)s[k] - m);
        sum += e;
        if (k != kstar)
            rest += e;
    }
    const double d = (double)s[kstar] - m;   /* <= 0 */
    const double l = d > -600.0 ? log1p(rest * exp(-d)) : log(sum) - d;
    if (want_ds)
        for (int k = 0; k < K; k++)
            s[k] = k == kstar ? (float)(-coef * rest / sum)
                              : (float)(coef * exp((double)s[k] - m) / sum);
    return l;
}

#endif
