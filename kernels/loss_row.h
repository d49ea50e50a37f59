/* loss_row.h: the fused loss's arithmetic per position (SPEC.md section 1), written once for
 * both backends: loss_cpu.c runs it on its 8-lane vectors and in double, the CUDA kernels of
 * loss_cuda.cu (through loss_online.h) per thread and in double. So the two compute the same
 * expressions in the same order, and a change to one is a change to both. Not installed; C and
 * CUDA (nvcc: __host__ __device__; the SIMT emulation: host C++); no CUDA types.
 *
 * What a backend keeps is its own: the loads, the argmax passes, the order in which the sums
 * are added (lanes and blocks of columns on the CPU, threads, warps and the block on the GPU),
 * and which column rest leaves out. What is here:
 *   - ddk_loss_consts: one call's constants (ddk_loss_consts_of), and a row's set-up
 *     (ddk_loss_row_init);
 *   - per column of a tile row, in the column's type: its terms of the shifted sums
 *     (DDK_LOSS_COLUMN) and its gradient (DDK_LOSS_GRAD). They are statement macros over the
 *     type T, float (one column of a CUDA thread) or ddk_vmath.h's ddk_f8 (8 columns, a lane
 *     each, on the CPU): the caller names T's exp (EXP) and T's "x where e != 0, else 0"
 *     (NONZERO; DDK_LOSS_NONZERO for float);
 *   - a tile into the row's running statistics, in double: what the tile's maxima decide
 *     (ddk_loss_tile_of), the row brought to the new maxima (ddk_loss_row_rescale: online
 *     softmax's rescale of what earlier tiles summed), then the tile's sums added
 *     (ddk_loss_row_add);
 *   - after the last tile: CE, KL, CAP and l (ddk_loss_row_terms, ddk_loss_combine), the
 *     gradient's row coefficients (ddk_loss_row_grad_coeffs) and the label's element
 *     (ddk_loss_grad_at_label).
 *
 * -inf columns (padded vocabulary) add exactly 0 to every sum and have gradient 0: e = 0 there,
 * and the products that would be 0 * -inf (c_dot's e dc, t_dot's et (zt - zs), the CAP
 * gradient's e (dc + shift)) are NONZERO's 0 where their e is 0. Sums whose maximum is still
 * -inf (a tile or row with only -inf columns so far) are 0 and are shifted by 0, never
 * rescaled (exp(-inf - -inf) would be NaN); a NaN logit still gives NaN.
 *
 * Tested through both backends: tests/kernels/test_loss.c (ddk_loss_cpu against a float64 reference,
 * finite differences, tile and chunk invariance), tests/kernels/test_loss_online.c (the CUDA kernels'
 * arithmetic on the host, against ddk_loss_cpu and sums in double, -inf columns) and the SIMT
 * emulation (tests/simt: loss_cuda.cu's kernels against the CPU backend under each card).
 *
 * Legend: w tile width, y the label, T and Tc the KL's and CAP's temperatures.
 */
#ifndef DDK_LOSS_ROW_H
#define DDK_LOSS_ROW_H

#ifdef __cplusplus
extern "C" {
#endif
#include "loss_internal.h"   /* ddk_loss_row */
#ifdef __cplusplus
}
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DDK_LOSS_FN static __forceinline__ __host__ __device__
#else
#define DDK_LOSS_FN static inline
#endif

/* the seven sums of ddk_loss_row, in the order of a tile's sums (ts) */
enum { DDK_SUM_S, DDK_SUM_REST, DDK_SUM_ST, DDK_SUM_C, DDK_SUM_CD, DDK_SUM_T, DDK_SUM_TD,
       DDK_LOSS_SUMS };

/* One call's constants */
typedef struct ddk_loss_consts {
    float alpha, T, invT, lambda, invTc;
    int kl;          /* alpha > 0 (the teacher is then present) */
    int kl_scaled;   /* ... with T != 1, so softmax(zs/T) is not softmax(zs) */
    int cap;         /* lambda > 0: CAP has a gradient (its value is reported either way) */
    int cap_scaled;  /* Tc != 1, so softmax(zs/Tc) is not softmax(zs) */
    int given_labels;
} ddk_loss_consts;

/* p's constants (p valid: ddk_loss_shape_of); given_labels: labels != NULL */
DDK_LOSS_FN ddk_loss_consts ddk_loss_consts_of(const ddk_loss_params *p, int given_labels)
{
    ddk_loss_consts k;
    k.alpha = p->kl_weight;
    k.T = p->kl_temperature;
    k.invT = 1.0f / p->kl_temperature;
    k.lambda = p->cap_weight;
    k.invTc = 1.0f / p->cap_temperature;
    k.kl = p->kl_weight > 0.0f;
    k.kl_scaled = p->kl_weight > 0.0f && p->kl_temperature != 1.0f;
    k.cap = p->cap_weight > 0.0f;
    k.cap_scaled = p->cap_temperature != 1.0f;
    k.given_labels = given_labels;
    return k;
}

/* A position before its first tile: label y (given, or -1 until the teacher's argmax), weight
 * w_i; ignored when its given label is < 0 or its weight not > 0 */
DDK_LOSS_FN void ddk_loss_row_init(ddk_loss_row *r, int32_t label, float weight,
                                   int given_labels)
{
    memset(r, 0, sizeof *r);
    r->s_arg = -1;
    r->label = label;
    r->ignored = label < 0 && given_labels ? 1 : !(weight > 0.0f);
}

/* ------------------------------------------------------------------------------------------
 * Per column, in the column's type T (float, or ddk_f8: 8 columns)
 */

/* NONZERO for float: x where e != 0, else 0 (never 0 * -inf) */
#define DDK_LOSS_NONZERO(e, x) ((e) != 0.0f ? (x) : 0.0f)

/* Adds one column's terms to the shifted sums of *a (fields s, sT, c, cd, t, td, of type T;
 * as in ddk_loss_row, less rest), and sets e (a T the caller declares) to the column's
 * exp(zs - s_shift), its term of s and of rest (which column rest leaves out is the caller's).
 * zs, zt: the column's logits (zt read only for the KL); s_shift, t_shift: the maxima the sums
 * are shifted by (0 while a maximum is -inf); kl, kl_scaled, cap_scaled, invT, invTc as in
 * ddk_loss_consts; EXP(x): exp in T (0 in lanes that are not columns); NONZERO(e, x) as
 * DDK_LOSS_NONZERO. */
#define DDK_LOSS_COLUMN(T, a, e, zs, zt, s_shift, t_shift, invT, invTc, kl, kl_scaled,         \
                        cap_scaled, EXP, NONZERO)                                              \
    do {                                                                                       \
        const T d_ = (zs) - (s_shift); /* <= 0 */                                              \
        (e) = EXP(d_);                                                                         \
        (a)->s += (e);                                                                         \
        if (kl_scaled)                                                                         \
            (a)->sT += EXP(d_ * (invT));                                                       \
        const T dc_ = (cap_scaled) ? d_ * (invTc) : d_;                                        \
        const T ec_ = (cap_scaled) ? EXP(dc_) : (e);                                           \
        (a)->c += ec_;                                                                         \
        (a)->cd += NONZERO(ec_, ec_ * dc_);                                                    \
        if (kl) {                                                                              \
            const T et_ = EXP(((zt) - (t_shift)) * (invT));                                    \
            (a)->t += et_;                                                                     \
            (a)->td += NONZERO(et_, et_ * (((zt) - (zs)) * (invT)));                           \
        }                                                                                      \
    } while (0)

/* The row's gradient coefficients (ddk_loss_row_grad_coeffs) and its label's element */
typedef struct ddk_loss_grad_coeffs {
    float a;           /* of exp(zs - s_max): (1-alpha) softmax, plus the KL's ps when T = 1 */
    float b;           /* of exp((zs - s_max)/T): the KL's ps when T != 1 */
    float bt;          /* of exp((zt - t_max)/T): the KL's pt */
    float kc;          /* of pc (log pc + H): CAP */
    float cap_shift;   /* H - log c_sum, so log pc + H = (zs - s_max)/Tc + cap_shift */
    float g_label;     /* g at v = y (ddk_loss_grad_at_label; not set by the coefficients) */
} ddk_loss_grad_coeffs;

/* Sets gv (a T) to g = d l_i / d zs at a column that is not the label's, in T: zs, zt its
 * logits (zt read only for the KL), g a const ddk_loss_grad_coeffs *, s_max, t_max the row's
 * maxima; cap: lambda > 0 and c_i = 1 (CAP has a gradient); EXP, NONZERO as in
 * DDK_LOSS_COLUMN. A -inf column (and its teacher's) gives 0. */
#define DDK_LOSS_GRAD(T, gv, zs, zt, g, s_max, t_max, invT, invTc, kl, kl_scaled, cap, EXP,     \
                      NONZERO)                                                                 \
    do {                                                                                       \
        const T d_ = (zs) - (s_max);                                                           \
        (gv) = (g)->a * EXP(d_);                                                               \
        if (kl_scaled)                                                                         \
            (gv) += (g)->b * EXP(d_ * (invT));                                                 \
        if (kl)                                                                                \
            (gv) -= (g)->bt * EXP(((zt) - (t_max)) * (invT));                                  \
        if (cap) {                                                                             \
            const T dc_ = d_ * (invTc), ec_ = EXP(dc_);                                        \
            (gv) += NONZERO(ec_, (g)->kc * ec_ * (dc_ + (g)->cap_shift));                      \
        }                                                                                      \
    } while (0)

/* ------------------------------------------------------------------------------------------
 * A tile into the row, in double
 */

/* the given label's column in the tile off .. off+w, or -1 (also with labels from the teacher) */
DDK_LOSS_FN int ddk_loss_given_label_col(const ddk_loss_row *R, int64_t off, int64_t w,
                                         const ddk_loss_consts *k)
{
    return k->given_labels && R->label >= off && R->label < off + w ? (int)(R->label - off) : -1;
}

/* What the tile's maxima decide for the row R (before the tile) */
typedef struct ddk_loss_tile {
    int first;         /* the row's first tile */
    int s_moved;       /* the tile holds the row's new student max (earlier tiles keep ties) */
    float s_max, t_max;   /* the row's maxima after the tile */
    int label_col;     /* the label's column in the tile, or -1; from the teacher: it moved here */
} ddk_loss_tile;

/* tile_*: the tile's maxima and the teacher's first column (unused when !has_teacher) */
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

/* R (before the tile) brought to p's maxima: its student argmax (tile_s_arg, the tile's first
 * column of its max) when the tile holds a new max, and what earlier tiles summed rescaled to
 * the new maxima (from a max of -inf those sums are 0). The tile's sums follow
 * (ddk_loss_row_add). */
DDK_LOSS_FN void ddk_loss_row_rescale(ddk_loss_row *R, const ddk_loss_tile *p, int tile_s_arg,
                                      int64_t off, const ddk_loss_consts *k)
{
    if (p->s_moved)
        R->s_arg = (int32_t)(off + tile_s_arg);
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
}

/* Adds the tile's sums ts (DDK_SUM_* order, at p's maxima) to R (ddk_loss_row_rescale'd). The
 * caller then sets z_label from the tile when p->label_col >= 0. */
DDK_LOSS_FN void ddk_loss_row_add(ddk_loss_row *R, const ddk_loss_tile *p,
                                  const double ts[DDK_LOSS_SUMS], int64_t off,
                                  const ddk_loss_consts *k)
{
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
 * After the last tile
 */

typedef struct ddk_loss_terms {
    double ce, kl, cap, l;
} ddk_loss_terms;

/* l_i from its terms */
DDK_LOSS_FN double ddk_loss_combine(const ddk_loss_consts *k, double ce, double kl, double cap)
{
    return (1.0 - k->alpha) * ce + k->alpha * kl + k->lambda * cap;
}

/* The row's terms from its final statistics; sets R's confident (c_i) and entropy */
DDK_LOSS_FN ddk_loss_terms ddk_loss_row_terms(const ddk_loss_consts *k, ddk_loss_row *R)
{
    ddk_loss_terms t = { 0, 0, 0, 0 };
    const double d_y = (double)R->z_label - R->s_max;   /* log p_y + log s_sum, <= 0 */
    /* CE = log(s_sum / e_y) = log1p(rest / e_y): exact as p_y -> 1 */
    t.ce = d_y > -600.0 ? log1p(R->s_rest * exp(-d_y)) : log(R->s_sum) - d_y;
    if (k->kl) {
        const double sT = k->kl_scaled ? R->sT_sum : R->s_sum;
        /* sum pt (log pt - log ps) = E_pt[(zt - zs)/T] - lse(zt/T) + lse(zs/T) */
        t.kl = (double)k->T * k->T *
               (R->t_dot / R->t_sum + ((double)R->s_max - R->t_max) * k->invT + log(sT) -
                log(R->t_sum));
    }
    R->confident = R->s_arg == R->label;
    R->entropy = log(R->c_sum) - R->c_dot / R->c_sum;
    t.cap = R->confident ? R->entropy : 0.0;
    t.l = ddk_loss_combine(k, t.ce, t.kl, t.cap);
    return t;
}

/* The gradient's coefficients of the row (ddk_loss_row_terms done: confident and entropy
 * formed), g_label 0. scale = w_i / sum w. */
DDK_LOSS_FN ddk_loss_grad_coeffs ddk_loss_row_grad_coeffs(const ddk_loss_consts *k,
                                                          const ddk_loss_row *R, double scale)
{
    ddk_loss_grad_coeffs g;
    const double kl_coef = scale * k->alpha * k->T;
    g.a = (float)(scale * (1.0 - k->alpha) / R->s_sum);
    g.b = g.bt = g.kc = g.cap_shift = g.g_label = 0.0f;
    if (k->kl) {
        if (k->kl_scaled)
            g.b = (float)(kl_coef / R->sT_sum);
        else
            g.a += (float)(kl_coef / R->s_sum);
        g.bt = (float)(kl_coef / R->t_sum);
    }
    if (k->cap && R->confident) {   /* c_i = 0: no CAP gradient */
        g.kc = (float)(-scale * k->lambda * k->invTc / R->c_sum);
        g.cap_shift = (float)(R->entropy - log(R->c_sum));
    }
    return g;
}

/* The label's element of the gradient, from the statistics in double: p_y - 1 = -rest / s_sum.
 * zt_label: the teacher's logit at y (read only for the KL). */
DDK_LOSS_FN float ddk_loss_grad_at_label(const ddk_loss_consts *k, const ddk_loss_row *R,
                                         double scale, float zt_label)
{
    const double d = (double)R->z_label - R->s_max;
    double gy = -(1.0 - k->alpha) * R->s_rest / R->s_sum;
    if (k->kl) {
        const double ps = k->kl_scaled ? exp(d * k->invT) / R->sT_sum : exp(d) / R->s_sum;
        const double pt = exp(((double)zt_label - R->t_max) * k->invT) / R->t_sum;
        gy += k->alpha * k->T * (ps - pt);
    }
    if (k->cap && R->confident) {
        const double dc = d * k->invTc, log_pc = dc - log(R->c_sum);
        gy -= k->lambda * k->invTc * exp(log_pc) * (log_pc + R->entropy);
    }
    return (float)(scale * gy);
}

#endif
