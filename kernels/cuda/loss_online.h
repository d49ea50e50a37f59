/* loss_online.h: the arithmetic of the CUDA loss's kernels (loss_cuda.cu's stats_kernel and
 * grad_kernel, SPEC.md section 1) as plain inline functions that compile both for the device
 * (nvcc: __host__ __device__) and for the host (C), so that a host test runs the very code a
 * thread block runs. Not installed; C and CUDA; no CUDA types.
 *
 * stats_kernel takes a tile's logit row (zs, and zt when the teacher is used) in ONE pass, one
 * block of DDK_LOSS_THREADS threads per row. Thread i takes the groups of DDK_LOSS_GROUP (4)
 * columns that start at 4 i, 4 i + DDK_LOSS_STRIDE, ... (a float4 each where the row allows,
 * else 4 scalar loads, -inf past the row's end: the same values either way) and keeps online
 * statistics of them (ddk_loss_thread): its own running maxima of zs and zt with their first
 * columns, and the seven sums of ddk_loss_row shifted by ITS maxima. Per group it takes the
 * group's maxima first, rescales its sums once if a maximum rose (as online softmax does, and
 * as loss_cpu.c's row merge does per tile), then adds the 4 columns. Then the block: maxima and
 * first columns merged (ddk_loss_argmax_merge), each thread's sums brought to the row's maxima
 * after the tile (ddk_loss_thread_sums: s-group factor exp(m_t - M), c_dot shifted as the tile
 * merge does, t-group exp((tm_t - TM) / T)), added over the block (the kernel's block_sums),
 * and merged into the row in double (ddk_loss_row_merge: loss_cpu.c's row_stats_tile); after
 * the last tile the terms and what the gradient needs (ddk_loss_row_finish), and per logit
 * the gradient (ddk_loss_grad_at).
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
 * -inf columns (padded vocabulary) add exactly 0 to every sum and have gradient 0: e = 0
 * there, and the products that would be 0 * -inf (c_dot's e dc, t_dot's et (zt - zs), the CAP
 * gradient's e (dc + shift)) are masked where their e is 0. Sums whose maximum is still -inf
 * (a thread with no column, a thread or tile with only -inf ones) are 0 and are shifted by 0,
 * never rescaled (exp(-inf - -inf) would be NaN); a NaN logit still gives NaN.
 *
 * Deliberately not here: the loads and the block reductions (shuffles, shared memory), which
 * are the kernel's. Tested by tests/test_loss_online.c: it runs these functions on the host
 * with the kernel's column assignment and merge rules (the warps' float sums in order, not by
 * shuffles), against ddk_loss_cpu and the float64 reference, and checks the row statistics
 * against sums in double.
 *
 * Legend: w tile width, M and TM the row's maxima of zs and zt after a tile.
 */
#ifndef DDK_LOSS_ONLINE_H
#define DDK_LOSS_ONLINE_H

#ifdef __cplusplus
extern "C" {
#endif
#include "../loss_internal.h"   /* ddk_loss_row */
#ifdef __cplusplus
}
#endif

#include <limits.h>
#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define DDK_LOSS_FN static __forceinline__ __host__ __device__
#else
#define DDK_LOSS_FN static inline
#endif
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

/* the seven sums of ddk_loss_row, in the block's order */
enum { DDK_SUM_S, DDK_SUM_REST, DDK_SUM_ST, DDK_SUM_C, DDK_SUM_CD, DDK_SUM_T, DDK_SUM_TD,
       DDK_LOSS_SUMS };

/* One call's constants (loss_cpu.c's loss_run) */
typedef struct ddk_loss_consts {
    float alpha, T, invT, lambda, invTc;
    int kl;          /* alpha > 0 (the teacher is then present) */
    int kl_scaled;   /* ... with T != 1 */
    int cap;         /* lambda > 0: CAP has a gradient */
    int cap_scaled;  /* Tc != 1 */
    int given_labels;
} ddk_loss_consts;

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
        const float d = zs[q] - s_shift;   /* <= 0 */
        const float e = expf(d);
        a->s += e;
        if (q == skip)
            a->held = e;
        else
            a->rest += e;
        if (k->kl_scaled)
            a->sT += expf(d * k->invT);
        const float dc = k->cap_scaled ? d * k->invTc : d;
        const float ec = k->cap_scaled ? expf(dc) : e;
        a->c += ec;
        a->cd += ec != 0.0f ? ec * dc : 0.0f;   /* a -inf column: 0, not 0 * -inf */
        if (k->kl) {
            const float et = expf((zt[q] - t_shift) * k->invT);
            a->t += et;
            a->td += et != 0.0f ? et * ((zt[q] - zs[q]) * k->invT) : 0.0f;
        }
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
 * The tile into the row (loss_cpu.c's row_stats_tile)
 */

/* the given label's column in the tile off .. off+w, or -1 (also with labels from the teacher) */
DDK_LOSS_FN int ddk_loss_given_label_col(const ddk_loss_row *R, int64_t off, int64_t w,
                                         const ddk_loss_consts *k)
{
    return k->given_labels && R->label >= off && R->label < off + w ? (int)(R->label - off) : -1;
}

/* What the block's maxima decide for the row R (before the tile) */
typedef struct ddk_loss_tile {
    int first;         /* the row's first tile */
    int s_moved;       /* the tile holds the row's new student max (earlier tiles keep ties) */
    float s_max, t_max;   /* the row's maxima after the tile */
    int label_col;     /* the label's column in the tile, or -1; from the teacher: it moved here */
} ddk_loss_tile;

/* tile_*: the block's maxima and the teacher's first column (unused when !has_teacher) */
DDK_LOSS_FN ddk_loss_tile ddk_loss_tile_of(const ddk_loss_row *R, float tile_s_max,
                                           float tile_t_max, int tile_t_arg, int has_teacher,
                                           int64_t off, int64_t w, const ddk_loss_consts *k)
{
    ddk_loss_tile p;
    p.first = R->s_arg < 0;
    p.s_moved = p.first || tile_s_max > R->s_max;
    p.s_max = p.s_moved ? tile_s_max : R->s_max;
    p.t_max = R->t_max;
    p.label_col = ddk_loss_given_label_col(R, off, w, k);
    if (has_teacher) {
        const int moved = p.first || tile_t_max > R->t_max;
        if (moved)
            p.t_max = tile_t_max;
        if (!k->given_labels && moved)
            p.label_col = tile_t_arg;
    }
    return p;
}

/* Merges the block's sums ts (at p's maxima, in double) into R, in double, as the CPU does.
 * The caller then sets z_label (and zt_y) from the tile when p->label_col >= 0. */
DDK_LOSS_FN void ddk_loss_row_merge(ddk_loss_row *R, const ddk_loss_tile *p, int tile_s_arg,
                                    const double ts[DDK_LOSS_SUMS], int64_t off,
                                    const ddk_loss_consts *k)
{
    if (p->s_moved)
        R->s_arg = (int32_t)(off + tile_s_arg);
    /* bring what earlier tiles summed to the new maxima (from a max of -inf those sums are 0) */
    if (!p->first && R->s_max > -INFINITY) {
        const double ds = (double)R->s_max - p->s_max, f = exp(ds);
        R->s_sum *= f;
        R->s_rest *= f;
        if (k->kl_scaled)
            R->sT_sum *= exp(ds * k->invT);
        const double dc = ds * k->invTc, fc = exp(dc);
        R->c_dot = fc * (R->c_dot + R->c_sum * dc);
        R->c_sum *= fc;
    }
    if (!p->first && k->kl && R->t_max > -INFINITY) {
        const double ft = exp(((double)R->t_max - p->t_max) * k->invT);
        R->t_sum *= ft;
        R->t_dot *= ft;
    }
    R->s_max = p->s_max;
    R->t_max = p->t_max;
    if (p->label_col >= 0 && !k->given_labels) {
        /* the teacher's argmax moved into this tile: the old label's mass becomes "rest" */
        R->s_rest = R->s_sum + ts[DDK_SUM_REST];
        R->label = (int32_t)(off + p->label_col);
    } else {
        R->s_rest += ts[DDK_SUM_REST];
    }
    R->s_sum += ts[DDK_SUM_S];
    R->sT_sum += ts[DDK_SUM_ST];
    R->c_sum += ts[DDK_SUM_C];
    R->c_dot += ts[DDK_SUM_CD];
    R->t_sum += ts[DDK_SUM_T];
    R->t_dot += ts[DDK_SUM_TD];
}

/* ------------------------------------------------------------------------------------------
 * After the last tile: the terms and what the gradient needs of the row
 */

/* loss_cpu.c's grad_coeffs, less what the row or the call already hold (s_max, t_max, invT,
 * invTc), plus the label's element */
typedef struct ddk_loss_grad_coeffs {
    float a;           /* of exp(zs - s_max): (1-alpha) softmax, plus the KL's ps when T = 1 */
    float b;           /* of exp((zs - s_max)/T): the KL's ps when T != 1 */
    float bt;          /* of exp((zt - t_max)/T): the KL's pt */
    float kc;          /* of pc (log pc + H): CAP */
    float cap_shift;   /* H - log c_sum, so log pc + H = (zs - s_max)/Tc + cap_shift */
    float g_label;     /* g at v = y */
} ddk_loss_grad_coeffs;

/* loss_cpu.c's row_grad_coeffs and grad_at_label, the same expressions in the same order, from
 * the row's final statistics (confident and entropy formed). scale = w_i / sum w; zt_label the
 * teacher's logit at y (read only for the KL). */
DDK_LOSS_FN ddk_loss_grad_coeffs ddk_loss_row_grad_coeffs(const ddk_loss_consts *k,
                                                          const ddk_loss_row *R, double scale,
                                                          float zt_label)
{
    ddk_loss_grad_coeffs g;
    const double kl_coef = scale * k->alpha * k->T;
    g.a = (float)(scale * (1.0 - k->alpha) / R->s_sum);
    g.b = g.bt = g.kc = g.cap_shift = 0.0f;
    if (k->kl) {
        if (k->kl_scaled)
            g.b = (float)(kl_coef / R->sT_sum);
        else
            g.a += (float)(kl_coef / R->s_sum);
        g.bt = (float)(kl_coef / R->t_sum);
    }
    const int cap = k->cap && R->confident;   /* c_i = 0: no CAP gradient */
    if (cap) {
        g.kc = (float)(-scale * k->lambda * k->invTc / R->c_sum);
        g.cap_shift = (float)(R->entropy - log(R->c_sum));
    }
    /* the label's element in double: p_y - 1 = -rest / s_sum */
    const double d = (double)R->z_label - R->s_max;
    double gy = -(1.0 - k->alpha) * R->s_rest / R->s_sum;
    if (k->kl) {
        const double ps = k->kl_scaled ? exp(d * k->invT) / R->sT_sum : exp(d) / R->s_sum;
        const double pt = exp(((double)zt_label - R->t_max) * k->invT) / R->t_sum;
        gy += k->alpha * k->T * (ps - pt);
    }
    if (cap) {
        const double dc = d * k->invTc, log_pc = dc - log(R->c_sum);
        gy -= k->lambda * k->invTc * exp(log_pc) * (log_pc + R->entropy);
    }
    g.g_label = (float)(scale * gy);
    return g;
}

/* loss_cpu.c's row_terms on the final statistics, then the row's reuse (loss_cuda.cu's header):
 * c_dot := CE_i, t_dot := KL_i, and the gradient's coefficients into the sums. scale =
 * w_i / sum w; R->scale holds zt_y (0 without a teacher) until here. Returns l_i. */
DDK_LOSS_FN double ddk_loss_row_finish(ddk_loss_row *R, const ddk_loss_consts *k, double scale)
{
    const float zt_label = (float)R->scale;
    const double d_y = (double)R->z_label - R->s_max;
    const double ce = d_y > -600.0 ? log1p(R->s_rest * exp(-d_y)) : log(R->s_sum) - d_y;
    double kl = 0.0;
    if (k->kl) {
        const double sT = k->kl_scaled ? R->sT_sum : R->s_sum;
        kl = (double)k->T * k->T *
             (R->t_dot / R->t_sum + ((double)R->s_max - R->t_max) * k->invT + log(sT) -
              log(R->t_sum));
    }
    R->confident = R->s_arg == R->label;
    R->entropy = log(R->c_sum) - R->c_dot / R->c_sum;
    const double cap = R->confident ? R->entropy : 0.0;
    const double l = (1.0 - k->alpha) * ce + k->alpha * kl + k->lambda * cap;
    const ddk_loss_grad_coeffs g = ddk_loss_row_grad_coeffs(k, R, scale, zt_label);
    R->c_dot = ce;
    R->t_dot = kl;
    R->s_sum = g.a;   /* floats in double fields: exact */
    R->sT_sum = g.b;
    R->t_sum = g.bt;
    R->c_sum = g.kc;
    R->s_rest = g.cap_shift;
    R->scale = g.g_label;
    return l;
}

/* ------------------------------------------------------------------------------------------
 * The gradient per logit (loss_cpu.c's grad_lanes)
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
    const float d = zs - G->s_max;
    float gv = G->g.a * expf(d);
    if (k->kl_scaled)
        gv += G->g.b * expf(d * k->invT);
    if (k->kl)
        gv -= G->g.bt * expf((zt - G->t_max) * k->invT);
    if (G->cap) {
        const float dc = d * k->invTc, ec = expf(dc);
        gv += ec != 0.0f ? G->g.kc * ec * (dc + G->g.cap_shift) : 0.0f;   /* not 0 * -inf */
    }
    return gv;
}

#endif
