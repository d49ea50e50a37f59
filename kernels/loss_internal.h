/* loss_internal.h: what every backend's loss shares: parameter checks, the workspace layout
 * (the planner's prediction is this exact arithmetic) and the per-position softmax statistics.
 * Not installed; tested through ddk_loss_cpu in tests/kernels/test_loss.c.
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

/* The shape of one call's work, derived from validated parameters. */
typedef struct ddk_loss_shape {
    int64_t chunk;            /* rows per chunk: min(p->chunk, n) */
    int64_t width;            /* columns per tile: V, or min(vocab_tile, V) */
    int uses_teacher;         /* teacher logits needed (labels or KL) */
    size_t rows_bytes;        /* chunk rows of statistics, rounded up to 64 bytes */
    size_t logits_bytes;      /* one logit buffer: chunk x width floats, rounded up to 64 bytes */
    size_t workspace_bytes;   /* statistics + student (+ teacher) logits */
} ddk_loss_shape;

/* Checks parameters (not memory): 0 or -EINVAL, and fills *shape. */
int ddk_loss_shape_of(const ddk_loss_params *p, int uses_teacher, ddk_loss_shape *shape);

/* Checks a whole call that reads host memory for labels and weights: 0 or -EINVAL. */
int ddk_loss_check_call(const ddk_loss_params *p, const float *student_hidden,
                        const float *teacher_hidden, const void *lm_head,
                        const int32_t *labels, const float *weights, const ddk_loss_result *out);

/* The sum of w_i (weights, or 1 each when NULL) over the positions that count, and in *counted
 * their number: a position does not count when its label is < 0 (labels, host memory, or NULL)
 * or its weight is not > 0. */
double ddk_loss_weight_sum(int64_t n, const int32_t *labels, const float *weights,
                           int64_t *counted);

#endif
