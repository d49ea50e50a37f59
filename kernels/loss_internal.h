/* loss_internal.h: what every backend's loss shares: parameter checks, the workspace layout
 * (the planner's prediction is this exact arithmetic), the per-position softmax statistics and
 * the DFlash2 selector's per-position record and buffers (SPEC.md 2.1).
 * Not installed; tested through ddk_loss_cpu in tests/kernels/test_loss.c and
 * tests/kernels/test_loss_selector.c.
 *
 * Legend: K the selector's top_k, r its rank.
 */
#ifndef DDK_LOSS_INTERNAL_H
#define DDK_LOSS_INTERNAL_H

#include "ddk.h"

/* Running softmax statistics of one position, merged over vocabulary tiles (online softmax).
 * Sums are shifted by the running maxima so they never overflow; they are kept in double so
 * merging many tiles loses nothing. */
typedef struct ddk_loss_row {
    float s_max, t_max;       /* running max of zs and of zt */
    int32_t s_arg;            /* argmax zs (lowest index on ties) */
    int32_t label;            /* y: given, or argmax zt so far; < 0 ignored */
    float z_label;            /* zs[y] */
    int32_t ignored;          /* y < 0 or w <= 0: no statistics, no gradient */
    double s_sum;             /* sum_v exp(zs_v - s_max) */
    double s_rest;            /* the same without v = y: 1 - p_y without cancellation */
    double sT_sum;            /* sum_v exp((zs_v - s_max) / T)   (KL, T != 1) */
    double t_sum;             /* sum_v exp((zt_v - t_max) / T)   (KL) */
    double t_dot;             /* sum_v exp((zt_v - t_max) / T) (zt_v - zs_v) / T */
    double c_sum;             /* sum_v exp((zs_v - s_max) / Tc)  (CAP) */
    double c_dot;             /* sum_v exp((zs_v - s_max) / Tc) (zs_v - s_max) / Tc */
    double scale;             /* w_i / sum w, 0 when ignored: the gradient's row factor */
    double entropy;           /* H(softmax(zs / Tc)) */
    int32_t confident;        /* c_i = [argmax zs == y] */
    int32_t pad2_;
} ddk_loss_row;

/* The selector's term of one position (SPEC.md 2.1), beside its ddk_loss_row */
typedef struct ddk_loss_sel_row {
    double l_sel;             /* logsumexp s - s[k*]; 0 without a term */
    int32_t kstar;            /* the label's index among the candidates (after inject); -1: no term */
    int32_t covered;          /* the label among the unary top-K (strict, before inject) */
    int32_t correct;          /* cand[first argmax of s] is the label */
    int32_t pad_;
} ddk_loss_sel_row;

/* The shape of one call's work, derived from validated parameters. */
typedef struct ddk_loss_shape {
    int64_t chunk;            /* rows per chunk: min(p->chunk, n) */
    int64_t width;            /* columns per tile: V, or min(vocab_tile, V) */
    int uses_teacher;         /* teacher logits needed (labels or KL) */
    size_t rows_bytes;        /* chunk rows of statistics, rounded up to 64 bytes */
    size_t logits_bytes;      /* one logit buffer: chunk x width floats, rounded up to 64 bytes */
    /* the selector's buffers (ddk_loss_sel_carve), after the logits; all 0 without a selector */
    size_t sel_rows_bytes;    /* chunk ddk_loss_sel_rows */
    size_t sel_k_bytes;       /* one (chunk, K) buffer of 4-byte values */
    size_t sel_r_bytes;       /* one (chunk, r) buffer of floats */
    size_t workspace_bytes;   /* statistics + student (+ teacher) logits (+ the selector's) */
} ddk_loss_shape;

/* The selector's buffers in a workspace of shape s (each on a 64-byte line): what a chunk keeps
 * between its vocabulary pass, its rows' terms and its gradient. */
typedef struct ddk_loss_sel_buffers {
    ddk_loss_sel_row *rows;   /* (chunk) */
    int32_t *cand;            /* (chunk, K) the candidates: the online top-K of zs, then the label injected */
    float *cz;                /* (chunk, K) zs at the candidates (kept: the materialised gradient overwrites zs) */
    float *ds;                /* (chunk, K) the scores s, then d loss / d s */
    float *q;                 /* (chunk, r) Hp hs, then q * b with b = sum_k ds_k Bs[cand_k] (dA's rows) */
    float *u;                 /* (chunk, r) A[p] * q (the scores' and dBs's rows) */
    float *dq;                /* (chunk, r) d loss / d q = A[p] * b; 0 in rows without a term */
} ddk_loss_sel_buffers;

static inline ddk_loss_sel_buffers ddk_loss_sel_carve(const ddk_loss_shape *s, char *workspace)
{
    char *at = workspace + s->rows_bytes + s->logits_bytes * (s->uses_teacher ? 2u : 1u);
    ddk_loss_sel_buffers b;
    b.rows = (ddk_loss_sel_row *)at;
    at += s->sel_rows_bytes;
    b.cand = (int32_t *)at;
    b.cz = (float *)(at + s->sel_k_bytes);
    b.ds = (float *)(at + 2 * s->sel_k_bytes);
    at += 3 * s->sel_k_bytes;
    b.q = (float *)at;
    b.u = (float *)(at + s->sel_r_bytes);
    b.dq = (float *)(at + 2 * s->sel_r_bytes);
    return b;
}

/* Checks parameters (not memory): 0 or -EINVAL, and fills *shape. */
int ddk_loss_shape_of(const ddk_loss_params *p, int uses_teacher, ddk_loss_shape *shape);

/* Checks a whole call that reads host memory for labels and weights: 0 or -EINVAL. */
int ddk_loss_check_call(const ddk_loss_params *p, const float *student_hidden,
                        const float *teacher_hidden, const void *lm_head,
                        const int32_t *labels, const float *weights, const ddk_loss_result *out);

/* With p->selector (else 0): its pointers (dA, dBs, dHp all NULL iff grad_student is), and
 * predecessors (host memory, the selector's or a copy) in [0, V) at every position that counts
 * (ddk_loss_weight_sum's rule on the host labels and weights; the others are never read):
 * 0 or -EINVAL. */
int ddk_loss_check_selector(const ddk_loss_params *p, const int32_t *predecessors,
                            const int32_t *labels, const float *weights,
                            const float *grad_student);

/* The sum of w_i (weights, or 1 each when NULL) over the positions that count, and in *counted
 * their number: a position does not count when its label is < 0 (labels, host memory, or NULL)
 * or its weight is not > 0. */
double ddk_loss_weight_sum(int64_t n, const int32_t *labels, const float *weights,
                           int64_t *counted);

#endif
