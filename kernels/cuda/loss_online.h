/* loss_online.h: the arithmetic of the CUDA loss's kernels (loss_cuda.cu's stats_kernel and
 * grad_kernel, SPEC.md section 1) as plain inline functions that compile both for the device
 * (nvcc: __host__ __device__) and for the host (C), so that a host test runs the very code a
 * thread block runs. What the CPU's loss computes too (a column's terms, the tile's merge into
 * the row in double, the row's terms and gradient coefficients, a logit's gradient) is
 * loss_row.h's, which both backends use; this adds what is a thread block's alone. Not
 * installed; C and CUDA; no CUDA types.
 *
 * stats_kernel takes a tile's logit row (zs, and zt when the teacher is used) in ONE pass, one
 * block of DDK_LOSS_THREADS threads per row. Thread i takes the groups of DDK_LOSS_GROUP (4)
 * columns that start at 4 i, 4 i + DDK_LOSS_STRIDE, ... (a float4 each where the row allows,
 * else 4 scalar loads, -inf past the row's end: the same values either way) and keeps online
 * statistics of them (ddk_loss_thread): its own running maxima of zs and zt with their first
 * columns, and the seven sums of ddk_loss_row shifted by ITS maxima. Per group it takes the
 * group's maxima first, rescales its sums once if a maximum rose (as online softmax does, and
 * as loss_row.h's ddk_loss_row_rescale does per tile), then adds the 4 columns
 * (DDK_LOSS_COLUMN). Then the block: maxima and first columns merged (ddk_loss_argmax_merge),
 * each thread's sums brought to the row's maxima after the tile (ddk_loss_thread_sums: s-group
 * factor exp(m_t - M), c_dot shifted as the tile merge does, t-group exp((tm_t - TM) / T)),
 * added over the block (the kernel's block_sums), and merged into the row in double
 * (ddk_loss_row_merge: loss_row.h's rescale and add, as loss_cpu.c merges a tile); after the
 * last tile the terms and what the gradient needs (ddk_loss_row_finish), and per logit the
 * gradient (ddk_loss_grad_at: DDK_LOSS_GRAD).
 *
 * rest (the sum over v != y, so 1 - p_y has no cancellation as p_y -> 1) is never s - e_y.
 * Given labels: the label's column is known before the pass and is left out directly. Labels
 * from the teacher (its argmax, lowest column on ties): the column is known only after the
 * block's teacher argmax, so each thread leaves out its own running candidate (the first
 * column of its zt max) and keeps that column's e apart, `held`; when its candidate changes,
 * the old held joins rest. At the block merge the thread whose candidate is the block's argmax
 * gives rest alone when the label moved into this tile, every other thread rest + held (the
 * label then lies in an earlier tile: this tile's every column counts).
 *
 * -inf columns: as loss_row.h says; a thread's sums whose maximum is still -inf (a thread with
 * no column, or only -inf ones) are 0 and are shifted by 0, never rescaled.
 *
 * Deliberately not here: the loads and the block reductions (shuffles, shared memory), which
 * are the kernel's. Tested by tests/kernels/test_loss_online.c: it runs these functions on the host
 * with the kernel's column assignment and merge rules (the warps' float sums in order, not by
 * shuffles), against ddk_loss_cpu and the float64 reference, and checks the row statistics
 * against sums in double.
 *
 * Legend: w tile width, M and TM the row's maxima of zs and zt after a tile.
 */
#ifndef DDK_LOSS_ONLINE_H
#define DDK_LOSS_ONLINE_H

#include "../loss_row.h"   /* the arithmetic loss_cpu.c shares, and loss_internal.h */

#include <limits.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDA_ARCH__   /* nvcc's device pass: its host compiler does not know the pragma */
#define DDK_LOSS_UNROLL _Pragma("unroll")
#else
#define DDK_LOSS_UNROLL
#endif

enum {
    DDK_LOSS_THREADS = 256,                                 /* a stats_kernel block */
    DDK_LOSS_GROUP = 4,                                     /* columns per load: a float4 */
    DDK_LOSS_STRIDE = DDK_LOSS_THREADS * DDK_LOSS_GROUP,    /* from a thread's group to its next */
    DDK_LOSS_NO_COLUMN = INT_MAX,                           /* an argmax before any column */
};

/* (v, i) := (ov, oi) when ov is larger, or equal at a lower index; a NaN never wins */
DDK_LOSS_FN void ddk_loss_argmax_merge(float *v, int *i, float ov, int oi)
{
    if (ov > *v || (ov == *v && oi < *i)) {
        *v = ov;
        *i = oi;
    }
}

/* ------------------------------------------------------------------------------------------
 * One thread's columns of a tile row
 */

typedef struct ddk_loss_thread {
    float s_max, t_max;   /* the running max of its zs and zt; -inf before any column */
    int s_arg, t_arg;     /* their first columns (of the tile); DDK_LOSS_NO_COLUMN before any */
    float s, rest, sT, c, cd;   /* as in ddk_loss_row, shifted by s_max (by 0 while it is -inf) */
    float held;           /* e of the column left out of rest: the label's or the candidate's */
    float t, td;          /* as in ddk_loss_row, shifted by t_max (by 0 while it is -inf) */
} ddk_loss_thread;

DDK_LOSS_FN void ddk_loss_thread_init(ddk_loss_thread *a)
{
    a->s_max = a->t_max = -INFINITY;
    a->s_arg = a->t_arg = DDK_LOSS_NO_COLUMN;
    a->s = a->rest = a->sT = a->c = a->cd = a->held = a->t = a->td = 0.0f;
}

/* the largest of z[0 .. 4) and its first index; (-inf, 0) when they are all -inf or NaN */
DDK_LOSS_FN void ddk_loss_group_argmax(const float z[DDK_LOSS_GROUP], float *v, int *j)
{
    *v = -INFINITY;
    *j = 0;
    DDK_LOSS_UNROLL
    for (int q = 0; q < DDK_LOSS_GROUP; q++)
        if (z[q] > *v) {
            *v = z[q];
            *j = q;
        }
}

/* Adds one group: columns col .. col+3 of the tile, zs and zt (NULL without a teacher) their
 * logits, -inf past the row's end. label_col: the given label's column in the tile, or -1 (and
 * unused with labels from the teacher). */
DDK_LOSS_FN void ddk_loss_thread_add(ddk_loss_thread *a, const float zs[DDK_LOSS_GROUP],
                                     const float *zt, int col, int label_col,
                                     const ddk_loss_consts *k)
{
    float m;
    int j;
    ddk_loss_group_argmax(zs, &m, &j);
    const float s_from = a->s_max;
    ddk_loss_argmax_merge(&a->s_max, &a->s_arg, m, col + j);
    if (a->s_max > s_from && s_from > -INFINITY) {   /* from -inf: every sum is still 0 */
        const float ds = s_from - a->s_max, f = expf(ds);
        a->s *= f;
        a->rest *= f;
        a->held *= f;
        if (k->kl_scaled)
            a->sT *= expf(ds * k->invT);
        const float dc = k->cap_scaled ? ds * k->invTc : ds;
        const float fc = k->cap_scaled ? expf(dc) : f;
        a->cd = fc * (a->cd + a->c * dc);
        a->c *= fc;
    }

    int skip = label_col - col;   /* the group's column left out of rest (0 .. 3), if any */
    if (zt) {
        float tm;
        int tj;
        ddk_loss_group_argmax(zt, &tm, &tj);
        const float t_from = a->t_max;
        const int candidate = a->t_arg;
        ddk_loss_argmax_merge(&a->t_max, &a->t_arg, tm, col + tj);
        if (k->kl && a->t_max > t_from && t_from > -INFINITY) {
            const float ft = expf((t_from - a->t_max) * k->invT);
            a->t *= ft;
            a->td *= ft;
        }
        if (!k->given_labels) {   /* the candidate moved here: the old one's e joins rest */
            skip = -1;
            if (a->t_arg != candidate) {
                a->rest += a->held;
                skip = tj;
            }
        }
    }

    const float s_shift = a->s_max > -INFINITY ? a->s_max : 0.0f;
    const float t_shift = a->t_max > -INFINITY ? a->t_max : 0.0f;
    DDK_LOSS_UNROLL
    for (int q = 0; q < DDK_LOSS_GROUP; q++) {
        float e;
        DDK_LOSS_COLUMN(float, a, e, zs[q], zt[q], s_shift, t_shift, k->invT, k->invTc, k->kl,
                        k->kl_scaled, k->cap_scaled, expf, DDK_LOSS_NONZERO);
        if (q == skip)
            a->held = e;
        else
            a->rest += e;
    }
}

/* The thread's sums in block order (out[DDK_SUM_*]) at the row's maxima after the tile
 * (s_max >= the thread's, t_max >= the thread's). label_col: ddk_loss_tile's, so with labels
 * from the teacher >= 0 only when the label moved into this tile. */
DDK_LOSS_FN void ddk_loss_thread_sums(const ddk_loss_thread *a, float s_max, float t_max,
                                      int label_col, const ddk_loss_consts *k,
                                      float out[DDK_LOSS_SUMS])
{
    /* a thread with no column or only -inf ones has sums 0 (NaN after a NaN logit) and a max
     * of -inf: shifted by 0, never by -inf - M (NaN when M is -inf, and 0 * -inf in c_dot) */
    const float ds = a->s_max > -INFINITY ? a->s_max - s_max : 0.0f;
    const float dt = a->t_max > -INFINITY ? a->t_max - t_max : 0.0f;
    const float f = expf(ds);
    float rest = a->rest;
    if (!k->given_labels && a->t_arg != label_col)
        rest += a->held;   /* its candidate is not the label: a column like any other */
    out[DDK_SUM_S] = f * a->s;
    out[DDK_SUM_REST] = f * rest;
    out[DDK_SUM_ST] = k->kl_scaled ? expf(ds * k->invT) * a->sT : 0.0f;
    const float dc = k->cap_scaled ? ds * k->invTc : ds;
    const float fc = k->cap_scaled ? expf(dc) : f;
    out[DDK_SUM_C] = fc * a->c;
    out[DDK_SUM_CD] = fc * (a->cd + a->c * dc);
    const float ft = k->kl ? expf(dt * k->invT) : 0.0f;
    out[DDK_SUM_T] = ft * a->t;
    out[DDK_SUM_TD] = ft * a->td;
}

/* ------------------------------------------------------------------------------------------
 * The tile into the row, and after the last tile
 */

/* Merges the block's sums ts (at p's maxima, in double) into R, in double, as the CPU does
 * (loss_row.h: rescale, then add). The caller then sets z_label (and zt_y) from the tile when
 * p->label_col >= 0. */
DDK_LOSS_FN void ddk_loss_row_merge(ddk_loss_row *R, const ddk_loss_tile *p, int tile_s_arg,
                                    const double ts[DDK_LOSS_SUMS], int64_t off,
                                    const ddk_loss_consts *k)
{
    ddk_loss_row_rescale(R, p, tile_s_arg, off, k);
    ddk_loss_row_add(R, p, ts, off, k);
}

/* The row's terms (loss_row.h) on the final statistics, then the row's reuse (loss_cuda.cu's
 * header): c_dot := CE_i, t_dot := KL_i, and the gradient's coefficients and the label's
 * element into the sums. scale = w_i / sum w; R->scale holds zt_y (0 without a teacher) until
 * here. Returns l_i. */
DDK_LOSS_FN double ddk_loss_row_finish(ddk_loss_row *R, const ddk_loss_consts *k, double scale)
{
    const float zt_label = (float)R->scale;
    const ddk_loss_terms t = ddk_loss_row_terms(k, R);
    ddk_loss_grad_coeffs g = ddk_loss_row_grad_coeffs(k, R, scale);
    g.g_label = ddk_loss_grad_at_label(k, R, scale, zt_label);
    R->c_dot = t.ce;
    R->t_dot = t.kl;
    R->s_sum = g.a;   /* floats in double fields: exact */
    R->sT_sum = g.b;
    R->t_sum = g.bt;
    R->c_sum = g.kc;
    R->s_rest = g.cap_shift;
    R->scale = g.g_label;
    return t.l;
}

/* ------------------------------------------------------------------------------------------
 * The gradient per logit (loss_row.h's DDK_LOSS_GRAD, as loss_cpu.c's grad_lanes)
 */

/* A finished row as grad_kernel reads it: floats and ints only */
typedef struct ddk_loss_grad_row {
    ddk_loss_grad_coeffs g;
    float s_max, t_max;
    int32_t label;   /* y */
    int ignored;
    int cap;         /* lambda > 0 and c_i = 1: CAP has a gradient here */
} ddk_loss_grad_row;

DDK_LOSS_FN ddk_loss_grad_row ddk_loss_grad_row_of(const ddk_loss_row *R, const ddk_loss_consts *k)
{
    ddk_loss_grad_row G;
    G.g.a = (float)R->s_sum;   /* exact: ddk_loss_row_finish stored floats */
    G.g.b = (float)R->sT_sum;
    G.g.bt = (float)R->t_sum;
    G.g.kc = (float)R->c_sum;
    G.g.cap_shift = (float)R->s_rest;
    G.g.g_label = (float)R->scale;
    G.s_max = R->s_max;
    G.t_max = R->t_max;
    G.label = R->label;
    G.ignored = R->ignored;
    G.cap = k->cap && R->confident;
    return G;
}

/* g at a column other than the label's: zs its logit, zt the teacher's (read only for the KL).
 * In float, as loss_cpu.c's grad_lanes; a -inf column (and its teacher's) gives 0. */
DDK_LOSS_FN float ddk_loss_grad_at(const ddk_loss_grad_row *G, float zs, float zt,
                                   const ddk_loss_consts *k)
{
    float gv;
    DDK_LOSS_GRAD(float, gv, zs, zt, &G->g, G->s_max, G->t_max, k->invT, k->invTc, k->kl,
                  k->kl_scaled, G->cap, expf, DDK_LOSS_NONZERO);
    return gv;
}

#endif
