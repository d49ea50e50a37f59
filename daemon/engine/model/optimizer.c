/* optimizer.c: AdamW for the drafter (SPEC.md section 2): global L2-norm gradient clipping,
 * bias-corrected moments, decoupled weight decay on every parameter except the RMSNorm gains
 * (ddt_param.is_norm), and the learning-rate schedule below. The arithmetic is the backend's
 * (be->sumsq for the norm in float64, be->adamw per parameter tensor in float32), so the same
 * code updates weights in host memory and on a GPU.
 * Mixed precision is the bf16 copy of the weights (params16), rewritten by the same be->adamw
 * pass. Not here: parameter groups other than "norm or not", the checkpoint I/O of
 * the state (checkpoint.c stores ddt_adamw_state as is).
 * Tested by tests/engine/model/test_optimizer.c (against a float64 reference of the schedule and update).
 *
 * The schedule, for update number s = 0, 1, 2, ... (W = warmup_steps, T = total_steps):
 *   s < W:                 lr(s) = lr * (s + 1) / W        (lr/W at s = 0, lr at s = W - 1)
 *   s >= W, T <= W:        lr(s) = lr                      (no decay phase configured)
 *   s >= W, T > W:         lr(s) = lr * (1 + cos(pi * min(1, (s - W) / (T - W)))) / 2
 *                                                          (lr at s = W, 0 at s >= T)
 * W <= 0 means no warm-up; a negative s is taken as 0.
 *
 * One update, with g the gradient after clipping (g *= grad_clip / norm when grad_clip > 0 and
 * norm > grad_clip, norm the float64 global L2 norm over every parameter of the table),
 * t = step + 1, wd = weight_decay (0 for is_norm parameters):
 *   m = beta1 m + (1 - beta1) g;   v = beta2 v + (1 - beta2) g^2
 *   w -= lr(step) * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + wd * w)
 *
 * Legend: total = floats in all parameters (the drafter's one contiguous buffer).
 */
#include "optimizer.h"

#include <math.h>

/* ------------------------------------------------------------------------------------------
 * Schedule and norm
 */

double ddt_adamw_lr(const ddt_adamw_config *c, int64_t step)
{
    if (step < 0)
        step = 0;
    if (c->warmup_steps > 0 && step < c->warmup_steps)
        return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    int64_t warmup = c->warmup_steps > 0 ? c->warmup_steps : 0;
    if (c->total_steps <= warmup)
        return c->lr;
    const double pi = 3.14159265358979323846;
    double progress = (double)(step - warmup) / (double)(c->total_steps - warmup);
    if (progress >= 1.0)
        return 0.0;
    return c->lr * 0.5 * (1.0 + cos(pi * progress));
}

double ddt_grad_norm(const ddk_backend *be, const float *grads, int64_t total)
{
    return total > 0 ? sqrt(be->sumsq(be, grads, total)) : 0.0;
}

/* ------------------------------------------------------------------------------------------
 * The update
 */

double ddt_adamw_update(const ddk_backend *be, const ddt_adamw_config *c, const ddt_param *table,
                        int count, float *params, uint16_t *params16, float *grads,
                        ddt_adamw_state *state, double *lr_out)
{
    int64_t total = count ? table[count - 1].offset + table[count - 1].numel : 0;
    double norm = ddt_grad_norm(be, grads, total);   /* the table covers one contiguous buffer */
    if (!isfinite(norm))
        return norm;
    double grad_scale = 1.0;
    if (c->grad_clip > 0 && norm > c->grad_clip)
        grad_scale = c->grad_clip / norm;

    double lr = ddt_adamw_lr(c, state->step);
    double t = (double)(state->step + 1);
    double inv_bc1 = 1.0 / (1.0 - pow(c->beta1, t));
    double inv_bc2 = 1.0 / (1.0 - pow(c->beta2, t));
    for (int p = 0; p < count; p++) {
        const ddt_param *param = &table[p];
        double wd = param->is_norm ? 0.0 : c->weight_decay;
        int64_t o = param->offset;
        ddk_adamw_scalars s = { .grad_scale = (float)grad_scale, .beta1 = (float)c->beta1,
                                .one_minus_beta1 = (float)(1.0 - c->beta1), .beta2 = (float)c->beta2,
                                .one_minus_beta2 = (float)(1.0 - c->beta2), .inv_bc1 = (float)inv_bc1,
                                .inv_bc2 = (float)inv_bc2, .eps = (float)c->eps, .lr = (float)lr,
                                .lr_wd = (float)(lr * wd) };
        be->adamw(be, params + o, grads + o, state->m + o, state->v + o, params16 ? params16 + o : NULL,
                  param->numel, &s);
    }
    state->step++;
    if (lr_out)
        *lr_out = lr;
    return norm;
}
