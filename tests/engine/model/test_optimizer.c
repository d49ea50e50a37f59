/* test_optimizer.c: the AdamW of daemon/engine/model/optimizer.c against a float64 reference written
 * here from SPEC.md section 2 and optimizer.c's header: the learning-rate schedule at its
 * corners, the global gradient norm, several updates with clipping active and inactive, weight
 * decay on matrices only, and bit-for-bit determinism.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "model/optimizer.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const double pi = 3.14159265358979323846;
#define cpu ddk_backend_cpu()   /* the optimiser's arithmetic is the backend's */

/* ------------------------------------------------------------------------------------------
 * A small parameter table: matrices and norm gains of odd sizes (vector bodies and tails)
 */

enum { param_count = 5 };

static int64_t make_table(ddt_param *table)
{
    static const struct { const char *name; int64_t rows, cols; int is_norm; } shapes[param_count] = {
        { "fc.weight", 33, 17, 0 },
        { "hidden_norm.weight", 1, 17, 1 },
        { "layers.0.self_attn.q_proj.weight", 5, 7, 0 },
        { "layers.0.self_attn.q_norm.weight", 1, 3, 1 },
        { "layers.0.mlp.down_proj.weight", 9, 1, 0 },
    };
    int64_t offset = 0;
    for (int p = 0; p < param_count; p++) {
        memset(&table[p], 0, sizeof table[p]);
        snprintf(table[p].name, sizeof table[p].name, "%s", shapes[p].name);
        table[p].ndim = shapes[p].is_norm ? 1 : 2;
        table[p].shape[0] = shapes[p].is_norm ? shapes[p].cols : shapes[p].rows;
        table[p].shape[1] = shapes[p].is_norm ? 0 : shapes[p].cols;
        table[p].numel = shapes[p].rows * shapes[p].cols;
        table[p].offset = offset;
        table[p].is_norm = shapes[p].is_norm;
        offset += table[p].numel;
    }
    return offset;
}

static ddt_adamw_config default_config(void)
{
    return (ddt_adamw_config){ .lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1,
                               .grad_clip = 0, .warmup_steps = 3, .total_steps = 10 };
}

/* ------------------------------------------------------------------------------------------
 * The float64 reference, written from the formulas (not from optimizer.c's loops)
 */

static double reference_lr(const ddt_adamw_config *c, int64_t step)
{
    if (step < c->warmup_steps)
        return c->lr * (double)(step + 1) / (double)c->warmup_steps;
    if (c->total_steps <= c->warmup_steps)
        return c->lr;
    if (step >= c->total_steps)
        return 0;
    double progress = (double)(step - c->warmup_steps) / (double)(c->total_steps - c->warmup_steps);
    return c->lr * 0.5 * (1 + cos(pi * progress));
}

/* one update of (w, m, v) in float64 from grads g (total); g is clipped in place; returns the
 * norm before clipping */
static double reference_update(const ddt_adamw_config *c, const ddt_param *table, int count, double *w,
                               double *m, double *v, double *g, int64_t total, int64_t step)
{
    double sum = 0;
    for (int64_t i = 0; i < total; i++)
        sum += g[i] * g[i];
    double norm = sqrt(sum);
    if (c->grad_clip > 0 && norm > c->grad_clip)
        for (int64_t i = 0; i < total; i++)
            g[i] *= c->grad_clip / norm;
    double lr = reference_lr(c, step), t = (double)(step + 1);
    for (int p = 0; p < count; p++) {
        double wd = table[p].is_norm ? 0 : c->weight_decay;
        for (int64_t i = table[p].offset; i < table[p].offset + table[p].numel; i++) {
            m[i] = c->beta1 * m[i] + (1 - c->beta1) * g[i];
            v[i] = c->beta2 * v[i] + (1 - c->beta2) * g[i] * g[i];
            double m_hat = m[i] / (1 - pow(c->beta1, t)), v_hat = v[i] / (1 - pow(c->beta2, t));
            w[i] -= lr * (m_hat / (sqrt(v_hat) + c->eps) + wd * w[i]);
        }
    }
    return norm;
}

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void test_schedule(void)
{
    ddt_adamw_config c = default_config();
    c.lr = 1e-3;
    c.warmup_steps = 10;
    c.total_steps = 110;
    /* each is exact up to a few ulps of double arithmetic */
    const double tol = 1e-15;
    check(fabs(ddt_adamw_lr(&c, 0) - 1e-4) < tol, "warm-up start: lr/warmup = 1e-4, got %.17g", ddt_adamw_lr(&c, 0));
    check(fabs(ddt_adamw_lr(&c, 4) - 5e-4) < tol, "warm-up middle: lr*5/10, got %.17g", ddt_adamw_lr(&c, 4));
    check(fabs(ddt_adamw_lr(&c, 9) - 1e-3) < tol, "warm-up end: lr at step warmup-1, got %.17g", ddt_adamw_lr(&c, 9));
    check(fabs(ddt_adamw_lr(&c, 10) - 1e-3) < tol, "cosine start: lr at step warmup, got %.17g", ddt_adamw_lr(&c, 10));
    check(fabs(ddt_adamw_lr(&c, 35) - 1e-3 * 0.5 * (1 + cos(pi / 4))) < tol, "a quarter into the cosine: %.17g",
          ddt_adamw_lr(&c, 35));
    check(fabs(ddt_adamw_lr(&c, 60) - 5e-4) < tol, "mid-cosine: lr/2, got %.17g", ddt_adamw_lr(&c, 60));
    check(ddt_adamw_lr(&c, 109) > 0 && ddt_adamw_lr(&c, 109) < 1e-6, "last step before the end: small, positive: %g",
          ddt_adamw_lr(&c, 109));
    check(ddt_adamw_lr(&c, 110) == 0, "0 at total_steps, got %g", ddt_adamw_lr(&c, 110));
    check(ddt_adamw_lr(&c, 1000) == 0, "0 after total_steps, got %g", ddt_adamw_lr(&c, 1000));
    double worst = 0;
    for (int64_t s = 0; s < 130; s++) {
        worst = fmax(worst, fabs(ddt_adamw_lr(&c, s) - reference_lr(&c, s)));
        if (s > 10)
            check(ddt_adamw_lr(&c, s) <= ddt_adamw_lr(&c, s - 1), "not increasing after warm-up (step %lld)",
                  (long long)s);
        if (s > 0 && s < 10)
            check(ddt_adamw_lr(&c, s) > ddt_adamw_lr(&c, s - 1), "increasing in warm-up (step %lld)", (long long)s);
    }
    check(worst < tol, "schedule differs from the reference by %g", worst);

    ddt_adamw_config no_warmup = c;
    no_warmup.warmup_steps = 0;
    check(ddt_adamw_lr(&no_warmup, 0) == c.lr, "no warm-up: the full rate at step 0, got %g", ddt_adamw_lr(&no_warmup, 0));
    check(fabs(ddt_adamw_lr(&no_warmup, 55) - 5e-4) < tol, "no warm-up: mid-cosine lr/2, got %g",
          ddt_adamw_lr(&no_warmup, 55));
    ddt_adamw_config no_decay = c;
    no_decay.total_steps = 0;
    check(fabs(ddt_adamw_lr(&no_decay, 5) - 6e-4) < tol && ddt_adamw_lr(&no_decay, 5000) == c.lr,
          "no decay phase: warm-up then constant (%g, %g)", ddt_adamw_lr(&no_decay, 5), ddt_adamw_lr(&no_decay, 5000));
}

static void test_grad_norm(void)
{
    float pythagoras[2] = { 3, -4 };
    check(ddt_grad_norm(cpu, pythagoras, 2) == 5, "norm of (3, -4) = 5, got %.17g", ddt_grad_norm(cpu, pythagoras, 2));
    check(ddt_grad_norm(cpu, pythagoras, 0) == 0, "norm of nothing = 0");
    /* lengths around the accumulator width: every element counted once */
    uint64_t rng = 7;
    float *g = xcalloc(1001, sizeof(float));
    for (int i = 0; i < 1001; i++)
        g[i] = (float)ddk_rng_normal(&rng);
    static const int64_t lengths[] = { 1, 7, 8, 9, 15, 16, 17, 1001 };
    for (size_t k = 0; k < sizeof lengths / sizeof lengths[0]; k++) {
        double sum = 0;
        for (int64_t i = 0; i < lengths[k]; i++)
            sum += (double)g[i] * g[i];
        double got = ddt_grad_norm(cpu, g, lengths[k]);
        /* float64 sums in another order: a few ulps */
        check(fabs(got - sqrt(sum)) <= 1e-14 * sqrt(sum), "length %lld: %.17g, reference %.17g",
              (long long)lengths[k], got, sqrt(sum));
    }
    /* squares of 1e20 overflow float32 (max 3.4e38): the sum must be float64 */
    for (int i = 0; i < 1001; i++)
        g[i] = 1e20f;
    double expect = sqrt(1001.0) * (double)1e20f;
    check(fabs(ddt_grad_norm(cpu, g, 1001) - expect) <= 1e-14 * expect, "norm of 1001 x 1e20: %g, expected %g",
          ddt_grad_norm(cpu, g, 1001), expect);
    free(g);
}

/* `steps` updates from one initial point with gradients of varying magnitude (gradient_scale
 * per step), checked against the reference after every step */
static void run_against_reference(const ddt_adamw_config *c, const double *gradient_scale, int steps,
                                  int expect_clipped_steps)
{
    ddt_param table[param_count];
    int64_t total = make_table(table);
    float *w = zero_floats(total), *g = zero_floats(total);
    float *m = zero_floats(total), *v = zero_floats(total);
    double *w_ref = xcalloc((size_t)total, sizeof(double)), *g_ref = xcalloc((size_t)total, sizeof(double));
    double *m_ref = xcalloc((size_t)total, sizeof(double)), *v_ref = xcalloc((size_t)total, sizeof(double));
    uint64_t rng = 12345;
    for (int64_t i = 0; i < total; i++) {
        w[i] = (float)(0.5 * ddk_rng_normal(&rng));
        w_ref[i] = w[i];
    }
    ddt_adamw_state state = { .step = 0, .m = m, .v = v };
    uint16_t *w16 = xcalloc((size_t)total, sizeof(uint16_t));   /* the bf16 copy: every update's */
    int clipped_steps = 0;
    for (int s = 0; s < steps; s++) {
        for (int64_t i = 0; i < total; i++) {
            g[i] = (float)(gradient_scale[s] * ddk_rng_normal(&rng));
            g_ref[i] = g[i];
        }
        double lr = -1;
        double norm = ddt_adamw_update(cpu, c, table, param_count, w, w16, g, &state, &lr);
        int64_t copy_wrong = 0;
        for (int64_t i = 0; i < total; i++)
            copy_wrong += w16[i] != ddk_f32_to_bf16(w[i]);
        check(copy_wrong == 0, "step %d: %lld bf16 copies are not the updated weights rounded", s,
              (long long)copy_wrong);
        double norm_ref = reference_update(c, table, param_count, w_ref, m_ref, v_ref, g_ref, total, s);
        clipped_steps += c->grad_clip > 0 && norm_ref > c->grad_clip;

        check(fabs(norm - norm_ref) <= 1e-13 * norm_ref, "step %d: norm %.17g, reference %.17g", s, norm, norm_ref);
        check(fabs(lr - reference_lr(c, s)) <= 1e-16, "step %d: lr %.17g, reference %.17g", s, lr, reference_lr(c, s));
        check(state.step == s + 1, "step %d: state.step = %lld", s, (long long)state.step);
        /* Error budget per element and step, float32 state against float64: the rounding of w
         * (2^-24 |w|, taken as 2e-7 |w| for the few roundings of the update), and the rounding
         * of the direction m_hat / sqrt(v_hat) (|direction| < ~3, a few ulps each of m, v, the
         * bias corrections, sqrt and the division: 1e-5 lr is generous yet ~100x smaller than
         * the smallest real change a wrong formula makes, e.g. lr * wd * |w| = 5e-4). */
        double worst_w = 0, worst_ratio = 0, worst_m = 0, worst_v = 0, worst_g = 0, max_m = 0, max_v = 0;
        for (int64_t i = 0; i < total; i++) {
            double diff = fabs(w[i] - w_ref[i]);
            double budget = (s + 1) * (1e-5 * c->lr + 2e-7 * fabs(w_ref[i]));
            worst_w = fmax(worst_w, diff);
            worst_ratio = fmax(worst_ratio, diff / budget);
            worst_m = fmax(worst_m, fabs(m[i] - m_ref[i]));
            worst_v = fmax(worst_v, fabs(v[i] - v_ref[i]));
            worst_g = fmax(worst_g, fabs(g[i] - g_ref[i]) / fmax(fabs(g_ref[i]), 1e-30));
            max_m = fmax(max_m, fabs(m_ref[i]));
            max_v = fmax(max_v, fabs(v_ref[i]));
        }
        check(worst_ratio <= 1, "step %d: params differ by %g (%.2f of the budget)", s, worst_w, worst_ratio);
        /* m and v: one float rounding per step each, relative to their scale */
        check(worst_m <= (s + 1) * 4e-7 * max_m, "step %d: m differs by %g (scale %g)", s, worst_m, max_m);
        check(worst_v <= (s + 1) * 4e-7 * max_v, "step %d: v differs by %g (scale %g)", s, worst_v, max_v);
        /* grads come back clipped in place: one float rounding of g * scale */
        check(worst_g <= 1.2e-7, "step %d: grads after clipping differ by %g (relative)", s, worst_g);
        check(guard_intact(w, total) && guard_intact(g, total) && guard_intact(m, total) && guard_intact(v, total),
              "step %d: a write past the end of a buffer", s);
    }
    check(clipped_steps == expect_clipped_steps, "%d steps clipped, the test meant %d", clipped_steps,
          expect_clipped_steps);
    free(w), free(w16), free(g), free(m), free(v), free(w_ref), free(g_ref), free(m_ref), free(v_ref);
}

/* gradient magnitudes that vary by step, so that clipping changes the direction of Adam's
 * update (a constant scale on every step would cancel in m_hat / sqrt(v_hat)) */
static const double gradient_scales[8] = { 1.0, 0.05, 3.0, 0.2, 0.01, 2.0, 0.5, 0.1 };

static void test_update_unclipped(void)
{
    ddt_adamw_config c = default_config();
    run_against_reference(&c, gradient_scales, 8, 0);
    c.grad_clip = 1e6;   /* set, but never reached */
    run_against_reference(&c, gradient_scales, 8, 0);
}

static void test_update_clipped(void)
{
    /* total = 625 floats of N(0, scale^2): norm ~ 25 * scale (+- 0.03 relative); a clip of 6
     * catches the steps of scale 1, 3, 2 and 0.5 (norms ~25, 75, 50, 12.5) and leaves the others
     * (5, 2.5, 1.25, 0.25) alone */
    ddt_adamw_config c = default_config();
    c.grad_clip = 6.0;
    run_against_reference(&c, gradient_scales, 8, 4);
}

static void test_clip_scales_grads(void)
{
    ddt_param table[param_count];
    int64_t total = make_table(table);
    float *w = zero_floats(total), *g = zero_floats(total), *m = zero_floats(total), *v = zero_floats(total);
    float *g0 = zero_floats(total);
    uint64_t rng = 99;
    for (int64_t i = 0; i < total; i++)
        g0[i] = g[i] = (float)ddk_rng_normal(&rng);
    ddt_adamw_config c = default_config();
    c.grad_clip = 0.5;
    ddt_adamw_state state = { 0, m, v };
    double norm = ddt_adamw_update(cpu, &c, table, param_count, w, NULL, g, &state, NULL);
    check(fabs(norm - ddt_grad_norm(cpu, g0, total)) <= 1e-14 * norm, "returns the norm before clipping: %g", norm);
    double after = ddt_grad_norm(cpu, g, total);
    check(fabs(after - 0.5) <= 1e-6, "grads scaled in place to the clip norm: %.9g", after);
    /* first step: m = (1 - beta1) g exactly up to rounding, so m carries the clipped grads */
    double worst = 0;
    for (int64_t i = 0; i < total; i++)
        worst = fmax(worst, fabs(m[i] - 0.1 * g0[i] * 0.5 / norm));
    check(worst <= 1e-8, "m holds (1 - beta1) times the clipped grads (diff %g)", worst);

    /* grad_clip = 0: no clipping however large the norm */
    for (int64_t i = 0; i < total; i++)
        g[i] = 1000 * g0[i];
    c.grad_clip = 0;
    ddt_adamw_update(cpu, &c, table, param_count, w, NULL, g, &state, NULL);
    int same = 1;
    for (int64_t i = 0; i < total; i++)
        same &= g[i] == 1000 * g0[i];
    check(same, "grad_clip = 0 leaves the grads as they are");
    free(w), free(g), free(m), free(v), free(g0);
}

static void test_weight_decay_on_matrices_only(void)
{
    /* zero gradients: m = v = 0, so the update is the weight decay alone */
    ddt_param table[param_count];
    int64_t total = make_table(table);
    float *w = zero_floats(total), *w0 = zero_floats(total), *g = zero_floats(total);
    float *m = zero_floats(total), *v = zero_floats(total);
    uint64_t rng = 3;
    for (int64_t i = 0; i < total; i++)
        w0[i] = w[i] = (float)(1 + ddk_rng_uniform(&rng));
    ddt_adamw_config c = default_config();
    ddt_adamw_state state = { 0, m, v };
    double lr = 0;
    ddt_adamw_update(cpu, &c, table, param_count, w, NULL, g, &state, &lr);
    int norms_unchanged = 1;
    double worst = 0;
    for (int p = 0; p < param_count; p++)
        for (int64_t i = table[p].offset; i < table[p].offset + table[p].numel; i++) {
            if (table[p].is_norm)
                norms_unchanged &= w[i] == w0[i];
            else
                worst = fmax(worst, fabs(w[i] - w0[i] * (1 - lr * c.weight_decay)) / w0[i]);
        }
    check(norms_unchanged, "norm gains get no weight decay");
    /* one float rounding of w and of lr * wd * w */
    check(worst <= 2.4e-7, "matrices decay by (1 - lr wd): relative error %g", worst);
    check(fabs(w[0] - w0[0]) > 1e-4 * w0[0], "the decay is visible (lr * wd = %g)", lr * c.weight_decay);
    free(w), free(w0), free(g), free(m), free(v);
}

static void test_deterministic(void)
{
    ddt_param table[param_count];
    int64_t total = make_table(table);
    ddt_adamw_config c = default_config();
    c.grad_clip = 2;
    float *runs[2][3];
    for (int r = 0; r < 2; r++) {
        float *w = zero_floats(total), *m = zero_floats(total), *v = zero_floats(total), *g = zero_floats(total);
        uint64_t rng = 42;
        for (int64_t i = 0; i < total; i++)
            w[i] = (float)ddk_rng_normal(&rng);
        ddt_adamw_state state = { 0, m, v };
        for (int s = 0; s < 8; s++) {
            for (int64_t i = 0; i < total; i++)
                g[i] = (float)(gradient_scales[s] * ddk_rng_normal(&rng));
            ddt_adamw_update(cpu, &c, table, param_count, w, NULL, g, &state, NULL);
        }
        runs[r][0] = w, runs[r][1] = m, runs[r][2] = v;
        free(g);
    }
    for (int k = 0; k < 3; k++)
        check(memcmp(runs[0][k], runs[1][k], (size_t)total * sizeof(float)) == 0, "%s differs between two runs",
              k == 0 ? "params" : k == 1 ? "m" : "v");
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++)
            free(runs[r][k]);
}

/* a NaN or Inf gradient: the norm says so and nothing moves (the trainer refuses the step) */
static void test_not_finite_changes_nothing(void)
{
    ddt_param table[param_count];
    int64_t total = make_table(table);
    float *w = zero_floats(total), *g = zero_floats(total), *m = zero_floats(total), *v = zero_floats(total);
    for (int64_t i = 0; i < total; i++)
        w[i] = m[i] = v[i] = g[i] = 0.25f;
    g[total / 2] = NAN;
    ddt_adamw_config c = default_config();
    ddt_adamw_state state = { 3, m, v };
    double norm = ddt_adamw_update(cpu, &c, table, param_count, w, NULL, g, &state, NULL);
    int same = 1;
    for (int64_t i = 0; i < total; i++)
        same &= w[i] == 0.25f && m[i] == 0.25f && v[i] == 0.25f;
    check(isnan(norm), "a NaN gradient gives a NaN norm (%g)", norm);
    check(same && state.step == 3, "weights, moments and the step count are left as they were");
    free(w), free(g), free(m), free(v);
}

int main(void)
{
    static const test_case cases[] = {
        { "lr schedule: warm-up start/end, cosine, end", test_schedule },
        { "grad norm in float64", test_grad_norm },
        { "8 updates vs float64 reference, no clipping", test_update_unclipped },
        { "8 updates vs float64 reference, clipping on 4", test_update_clipped },
        { "clipping scales grads in place; 0 = off", test_clip_scales_grads },
        { "weight decay on matrices only", test_weight_decay_on_matrices_only },
        { "deterministic", test_deterministic },
        { "a gradient that is not finite changes nothing", test_not_finite_changes_nothing },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
