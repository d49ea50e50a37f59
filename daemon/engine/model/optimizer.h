/* optimizer.h: AdamW with decoupled weight decay (none on norm gains, per the drafter's
 * parameter table), linear warm-up then cosine decay to 0, global L2-norm gradient clipping.
 * State is float32 master weights' moments m and v (same layout as the parameters) and the
 * step count; checkpoints store it as is.
 * Tested by tests/engine/model/test_optimizer.c (against a float64 reference of the update).
 */
#ifndef DDT_OPTIMIZER_H
#define DDT_OPTIMIZER_H

#include "drafter.h"

#include <stdint.h>

typedef struct ddt_adamw_config {
    double lr;               /* peak learning rate */
    double beta1, beta2, eps;/* 0.9, 0.95, 1e-8 unless said otherwise */
    double weight_decay;     /* decoupled: w -= lr * wd * w, not on is_norm parameters */
    double grad_clip;        /* global L2 norm; 0 = no clipping */
    int64_t warmup_steps;    /* linear from lr/warmup to lr over these steps */
    int64_t total_steps;     /* cosine from lr to 0 between warmup_steps and total_steps */
} ddt_adamw_config;

typedef struct ddt_adamw_state {
    int64_t step;            /* updates applied so far */
    float *m, *v;            /* (total) each, same layout as the parameters, on the backend's memory */
} ddt_adamw_state;

/* learning rate of update number `step` (0-based) */
double ddt_adamw_lr(const ddt_adamw_config *c, int64_t step);

/* L2 norm of grads (total floats, on be's memory), accumulated in float64 by be->sumsq */
double ddt_grad_norm(const ddk_backend *be, const float *grads, int64_t total);

/* One update of params (total) from grads (total), all on be's memory (the ops are be->sumsq and
 * be->adamw), clipping by the global norm first (grads are scaled in place when clipped);
 * params16 (total, bf16) when not NULL: the weights' bf16 copy, rewritten in the same pass.
 * Returns the norm before clipping; *lr_out the rate used. When the norm is not finite nothing
 * is changed (weights, their copy, moments, step) and the norm is returned for the caller to
 * refuse. */
double ddt_adamw_update(const ddk_backend *be, const ddt_adamw_config *c, const ddt_param *table,
                        int count, float *params, uint16_t *params16, float *grads,
                        ddt_adamw_state *state, double *lr_out);

#endif
