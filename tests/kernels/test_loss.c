/* test_loss.c: the fused loss ddk_loss_cpu() (SPEC.md section 1) and the CPU backend's ops.
 *
 * What it checks:
 *   - a table of small, odd cases against the float64 reference of tests/kernels/loss_reference.c:
 *     every result field, l_i and d loss / d hs; guard words after every output;
 *   - nothing counted (all labels < 0; all weights 0): zeros everywhere, no NaN;
 *   - p_y -> 1: CE ~1e-14 and p_y - 1 at the label keep their relative accuracy;
 *   - ps ~ pt: KL ~1e-9 is not drowned by float32 rounding, and not negative;
 *   - chunk and vocab_tile change nothing beyond float rounding;
 *   - the gradient against central finite differences (the library's loss in float32, and the
 *     reference's loss in double, which validates SPEC.md's CAP and KL gradient formulas);
 *   - bad parameters: -EINVAL and nothing written; workspace over budget: -ENOMEM and nothing
 *     written; the workspace is exactly ddk_loss_workspace_bytes();
 *   - ddk_backend_cpu(): its loss is ddk_loss_cpu() bit for bit; its matmul is the naive product
 *     for every transpose combination;
 *   - a bf16 head read in place (head_bf16): on every table case (whole vocabulary and tiles,
 *     with and without teacher, KL and CAP) the loss, every result field, l_i and the gradient
 *     are bit for bit those of bf16_products on the head widened to fp32, and not those of fp32
 *     products; its workspace is the fp32 head's, exactly; head_bf16 without bf16_products (or
 *     not 0 / 1) is refused.
 *   - ddk_vmath.h's 8-lane kernels the loss runs on: ddk_expf8 is ddk_expf bit for bit
 *     (clamps, -inf, NaN, a sweep), ddk_vargmax finds the first maximum in body and tail;
 *     table cases wider than their 512-column sum blocks and with logits of ~+-200;
 * What it does not: the bf16 products' numbers against a reference (tests/kernels/test_ops.c), the CUDA
 * backend (GPU-labelled targets), speed (tests/bench/).
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 * Dimension legend: n positions, H hidden size, V vocabulary. Row-major; W is (V, H).
 */
#include "ddk.h"
#include "check.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
/* built without -fopenmp-simd: its simd pragmas are not for this file */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunknown-pragmas"
#include "ddk_vmath.h"
#pragma GCC diagnostic pop
#include "loss_reference.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Helpers (check(), the case lines and the guarded buffers are in check.h)
 */


/* uniform in [-1, 1), from ddk_rng.h's generator (rand() is not the same everywhere) */
static float rng_sym(uint64_t *state)
{
    return (float)(2.0 * ddk_rng_uniform(state) - 1.0);
}

/* ------------------------------------------------------------------------------------------
 * Tolerances. Each is a bound on float32 error, not a fudge: the library forms logits in
 * float32 (H-term dot products) and its softmax statistics in float32 or wider.
 */

/* loss, ce, kl, cap, weight_sum, l_i: logits carry ~H*eps32 relative error (worst case,
 * sqrt(H)*eps32 typical), which moves a logsumexp or an entropy by about as much */
static const double scalar_rel = 1e-5, scalar_abs = 1e-6;
/* d loss / d hs, as max error / max |g_ref|: per-logit errors as above, then a float32
 * product over V terms and a sum over vocabulary tiles */
static const double grad_rel = 1e-4;
/* the same case under another chunk / vocab_tile: only the order of float32 sums changes
 * (tile sums, online-softmax rescaling), a few ulp times log V at most; KL and CAP are sums
 * of float32 log-probabilities of size |z| + log V ~ 5, so their error is absolute (~1e-6,
 * a few ulp of that), not relative to their own, possibly small, size */
static const double invariance_rel = 1e-5, invariance_abs = 1e-6;

static int close_to(double got, double want, double rel, double abs_tol)
{
    return isfinite(got) && fabs(got - want) <= rel * fabs(want) + abs_tol;
}

/* ------------------------------------------------------------------------------------------
 * Test data: one loss problem, generated from a case description and a seed
 */

enum { TEACHER_NONE, TEACHER_NEAR, TEACHER_FAR };   /* ht absent, hs + noise, independent */
enum {
    LABELS_TEACHER,        /* labels = NULL: the teacher's argmax */
    LABELS_GIVEN,          /* uniform in [0, V) */
    LABELS_SOME_IGNORED,   /* as GIVEN, about a quarter negative */
    LABELS_MIXED,          /* half the student's argmax (so CAP's c_i = 1), some negative */
};
enum { WEIGHTS_NONE, WEIGHTS_GIVEN };   /* NULL; fractional with some 0 and negative */

typedef struct {
    const char *name;
    int64_t n, H, V, chunk, vocab_tile;
    float alpha, T, lambda, Tc;
    int teacher, labels, weights;
    float hs_scale;   /* logits are about this large */
} loss_case;

typedef struct {
    ddk_loss_params p;
    float *hs;          /* (n, H) */
    float *ht;          /* (n, H) or NULL */
    float *W;           /* (V, H) */
    int32_t *labels;    /* (n) or NULL */
    float *weights;     /* (n) or NULL */
} loss_data;

static ddk_loss_params case_params(const loss_case *c)
{
    ddk_loss_params p = { .n = c->n, .hidden = c->H, .vocab = c->V, .chunk = c->chunk,
                          .vocab_tile = c->vocab_tile, .kl_weight = c->alpha,
                          .kl_temperature = c->T, .cap_weight = c->lambda,
                          .cap_temperature = c->Tc };
    return p;
}

/* z (V) = W h in double; returns the argmax (ties: lowest) and the gap to the runner-up */
static int64_t student_argmax(const float *W, const float *h, int64_t V, int64_t H, double *gap)
{
    int64_t best = 0;
    double top = -INFINITY, second = -INFINITY;
    for (int64_t v = 0; v < V; v++) {
        double z = 0.0;
        for (int64_t k = 0; k < H; k++)
            z += (double)W[v * H + k] * (double)h[k];
        if (z > top) {
            second = top, top = z, best = v;
        } else if (z > second) {
            second = z;
        }
    }
    if (gap)
        *gap = V > 1 ? top - second : INFINITY;
    return best;
}

static loss_data make_data(const loss_case *c, uint64_t seed)
{
    loss_data d = { .p = case_params(c) };
    const int64_t n = c->n, H = c->H, V = c->V;
    const float hs_scale = c->hs_scale > 0.0f ? c->hs_scale : 1.0f;
    const float w_scale = 1.5f / sqrtf((float)H);   /* rows of W have norm ~0.87 */
    uint64_t s = seed;
    d.W = xcalloc((size_t)(V * H), sizeof(float));
    d.hs = xcalloc((size_t)(n * H), sizeof(float));
    for (int64_t j = 0; j < V * H; j++)
        d.W[j] = w_scale * rng_sym(&s);
    for (int64_t j = 0; j < n * H; j++)
        d.hs[j] = hs_scale * rng_sym(&s);
    if (c->teacher != TEACHER_NONE) {
        d.ht = xcalloc((size_t)(n * H), sizeof(float));
        for (int64_t j = 0; j < n * H; j++)
            d.ht[j] = c->teacher == TEACHER_NEAR ? d.hs[j] + 0.5f * hs_scale * rng_sym(&s)
                                                  : hs_scale * rng_sym(&s);
    }
    if (c->labels != LABELS_TEACHER) {
        d.labels = xcalloc((size_t)n, sizeof(int32_t));
        for (int64_t i = 0; i < n; i++) {
            d.labels[i] = (int32_t)(ddk_rng_next(&s) % (uint64_t)V);
            if (c->labels == LABELS_MIXED && ddk_rng_uniform(&s) < 0.5)
                d.labels[i] = (int32_t)student_argmax(d.W, d.hs + i * H, V, H, NULL);
            /* position 0 is always counted, so no table case is empty */
            int drop = c->labels != LABELS_GIVEN && i > 0 && ddk_rng_uniform(&s) < 0.25;
            if (drop)
                d.labels[i] = ddk_rng_uniform(&s) < 0.5 ? -1 : -7;
        }
    }
    if (c->weights == WEIGHTS_GIVEN) {
        d.weights = xcalloc((size_t)n, sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            double u = ddk_rng_uniform(&s);
            d.weights[i] = (float)(0.25 + 1.75 * ddk_rng_uniform(&s));
            if (i > 0 && u < 0.15)
                d.weights[i] = 0.0f;
            else if (i > 0 && u < 0.25)
                d.weights[i] = -0.5f;
        }
    }
    return d;
}

static void free_data(loss_data *d)
{
    free(d->hs), free(d->ht), free(d->W), free(d->labels), free(d->weights);
    memset(d, 0, sizeof(*d));
}

/* ------------------------------------------------------------------------------------------
 * Running the library and the reference
 */

typedef struct {
    int rc;
    ddk_loss_result r;
    float *grad;   /* (n, H) + guard_words, or NULL */
    float *per;    /* (n) + guard_words, or NULL */
} impl_run;

/* ddk_loss_cpu on d with parameters p and the head W (d->W, or its bf16 form with
 * p->head_bf16); outputs pre-filled with the sentinel; guards checked */
static impl_run run_impl_head(const loss_data *d, const ddk_loss_params *p, const void *W,
                              int want_grad, int want_per)
{
    impl_run o;
    const int64_t n = p->n, H = p->hidden;
    o.grad = want_grad ? sentinel_floats(n * H) : NULL;
    o.per = want_per ? sentinel_floats(n) : NULL;
    memset(&o.r, sentinel_byte, sizeof(o.r));
    o.rc = ddk_loss_cpu(p, d->hs, d->ht, W, d->labels, d->weights, o.grad, o.per, &o.r);
    check(!o.grad || guard_intact(o.grad, n * H), "write past the end of grad_student");
    check(!o.per || guard_intact(o.per, n), "write past the end of per_position");
    return o;
}

static impl_run run_impl(const loss_data *d, const ddk_loss_params *p, int want_grad,
                         int want_per)
{
    return run_impl_head(d, p, d->W, want_grad, want_per);
}

static void free_run(impl_run *o)
{
    free(o->grad), free(o->per);
}

typedef struct {
    ddk_loss_result r;
    double *grad;   /* (n, H) */
    double *per;    /* (n) */
} ref_run;

static ref_run run_ref(const loss_data *d, const ddk_loss_params *p)
{
    ref_run o;
    o.grad = xcalloc((size_t)(p->n * p->hidden), sizeof(double));
    o.per = xcalloc((size_t)p->n, sizeof(double));
    int rc = loss_reference(p, d->hs, d->ht, d->W, d->labels, d->weights, o.grad, o.per, &o.r);
    if (rc != 0) {
        fprintf(stderr, "test_loss: the reference refused a test case (%d)\n", rc);
        exit(2);
    }
    return o;
}

static void free_ref(ref_run *o)
{
    free(o->grad), free(o->per);
}

/* every field of the library's run against the reference's */
static void compare_with_ref(const impl_run *got, const ref_run *want, const ddk_loss_params *p,
                             double rel, double abs_tol, double g_rel)
{
    const ddk_loss_result *a = &got->r, *b = &want->r;
    check(got->rc == 0, "rc %d, want 0", got->rc);
    if (got->rc != 0)
        return;
    check(close_to(a->loss, b->loss, rel, abs_tol), "loss %.9g, reference %.9g", a->loss, b->loss);
    check(close_to(a->ce, b->ce, rel, abs_tol), "ce %.9g, reference %.9g", a->ce, b->ce);
    check(close_to(a->kl, b->kl, rel, abs_tol), "kl %.9g, reference %.9g", a->kl, b->kl);
    check(close_to(a->cap, b->cap, rel, abs_tol), "cap %.9g, reference %.9g", a->cap, b->cap);
    check(close_to(a->weight_sum, b->weight_sum, rel, abs_tol), "weight_sum %.9g, reference %.9g",
          a->weight_sum, b->weight_sum);
    check(a->counted == b->counted, "counted %lld, reference %lld", (long long)a->counted,
          (long long)b->counted);
    check(a->correct == b->correct, "correct %lld, reference %lld", (long long)a->correct,
          (long long)b->correct);
    if (got->per)
        for (int64_t i = 0; i < p->n; i++)
            check(close_to(got->per[i], want->per[i], rel, abs_tol),
                  "per_position[%lld] %.9g, reference %.9g", (long long)i, got->per[i],
                  want->per[i]);
    if (got->grad) {
        double e = normalised_error(got->grad, want->grad, p->n * p->hidden);
        check(e <= g_rel, "gradient error %.3g of max|g|, tolerance %.1g", e, g_rel);
    }
}

/* the same problem run two ways by the library: equal within float rounding */
static void compare_runs(const impl_run *got, const impl_run *want, const ddk_loss_params *p,
                         const char *what)
{
    const ddk_loss_result *a = &got->r, *b = &want->r;
    const double rel = invariance_rel, abs_tol = invariance_abs;
    check(got->rc == 0, "%s: rc %d", what, got->rc);
    if (got->rc != 0)
        return;
    check(close_to(a->loss, b->loss, rel, abs_tol) && close_to(a->ce, b->ce, rel, abs_tol) &&
              close_to(a->kl, b->kl, rel, abs_tol) && close_to(a->cap, b->cap, rel, abs_tol) &&
              close_to(a->weight_sum, b->weight_sum, rel, abs_tol),
          "%s: loss/ce/kl/cap/weight_sum %.9g %.9g %.9g %.9g %.9g, want %.9g %.9g %.9g %.9g %.9g",
          what, a->loss, a->ce, a->kl, a->cap, a->weight_sum, b->loss, b->ce, b->kl, b->cap,
          b->weight_sum);
    check(a->counted == b->counted && a->correct == b->correct,
          "%s: counted/correct %lld/%lld, want %lld/%lld", what, (long long)a->counted,
          (long long)a->correct, (long long)b->counted, (long long)b->correct);
    if (got->per && want->per)
        for (int64_t i = 0; i < p->n; i++)
            check(close_to(got->per[i], want->per[i], rel, abs_tol),
                  "%s: per_position[%lld] %.9g, want %.9g", what, (long long)i, got->per[i],
                  want->per[i]);
    if (got->grad && want->grad) {
        double e = normalised_error_ff(got->grad, want->grad, p->n * p->hidden);
        check(e <= rel, "%s: gradient differs by %.3g of max|g|", what, e);
    }
}

/* ------------------------------------------------------------------------------------------
 * Random cases against the reference
 */

static const loss_case table[] = {
    /* name                         n   H    V  chunk tile alpha  T    lambda Tc   teacher       labels               weights        scale */
    { "n1_V2_H1",                   1,  1,   2,  1,   0,  0.5f, 1.0f, 0.0f, 1.0f, TEACHER_NEAR, LABELS_TEACHER,      WEIGHTS_NONE,  1.0f },
    { "n1_V2_H1_tile1_cap",         1,  1,   2,  3,   1,  0.3f, 2.0f, 0.4f, 0.5f, TEACHER_NEAR, LABELS_GIVEN,        WEIGHTS_NONE,  2.0f },
    { "V2_H1_tile1_ignored",        5,  1,   2,  2,   1,  0.3f, 2.0f, 0.2f, 0.5f, TEACHER_NEAR, LABELS_SOME_IGNORED, WEIGHTS_GIVEN, 1.0f },
    { "tile_not_dividing_V_T05",    7,  5,  13,  3,   4, 0.25f, 0.5f, 0.0f, 1.0f, TEACHER_NEAR, LABELS_TEACHER,      WEIGHTS_GIVEN, 1.0f },
    { "chunk_gt_n_alpha1_cap",      6,  8,  17, 10,   0,  1.0f, 2.0f, 0.5f, 2.0f, TEACHER_FAR,  LABELS_MIXED,        WEIGHTS_NONE,  1.0f },
    { "tile_gt_V_alpha0_cap",       9,  7,  11,  4,  16,  0.0f, 1.0f, 0.3f, 0.7f, TEACHER_NEAR, LABELS_TEACHER,      WEIGHTS_GIVEN, 1.5f },
    { "no_teacher",                 8,  6,  19,  3,   5,  0.0f, 1.0f, 0.0f, 1.0f, TEACHER_NONE, LABELS_SOME_IGNORED, WEIGHTS_GIVEN, 1.0f },
    { "no_teacher_cap",            10,  9,  23,  7,   0,  0.0f, 1.0f, 0.4f, 1.5f, TEACHER_NONE, LABELS_MIXED,        WEIGHTS_NONE,  2.0f },
    { "chunk1_tile1",               4,  3,   9,  1,   1,  0.7f, 0.5f, 0.1f, 0.5f, TEACHER_FAR,  LABELS_MIXED,        WEIGHTS_GIVEN, 1.0f },
    { "alpha1_T05_tiled",          12, 16,  37,  5,   8,  1.0f, 0.5f, 0.0f, 1.0f, TEACHER_NEAR, LABELS_TEACHER,      WEIGHTS_NONE,  1.0f },
    { "alpha015_tiled",            33, 24, 101,  8,  32, 0.15f, 1.0f,0.25f, 0.8f, TEACHER_NEAR, LABELS_MIXED,        WEIGHTS_GIVEN, 1.0f },
    { "alpha015_whole_T2",         33, 24, 101, 33,   0, 0.15f, 2.0f,0.25f, 0.8f, TEACHER_NEAR, LABELS_MIXED,        WEIGHTS_GIVEN, 1.0f },
    { "peaked_T05_Tc05",           16, 12,  50,  6,   7,  0.5f, 0.5f, 0.5f, 0.5f, TEACHER_NEAR, LABELS_MIXED,        WEIGHTS_GIVEN, 3.0f },
    { "tile_eq_V_chunk_n_minus_1",  5,  4,   7,  4,   7,  0.6f, 1.3f, 0.2f, 1.7f, TEACHER_NEAR, LABELS_TEACHER,      WEIGHTS_GIVEN, 1.0f },
    { "teacher_unused_alpha0",      6,  5,   9,  2,   3,  0.0f, 1.0f, 0.0f, 1.0f, TEACHER_FAR,  LABELS_GIVEN,        WEIGHTS_NONE,  1.0f },
    /* rows wider than the 8-lane kernels' 512-column sum blocks, labels in either block, tails */
    { "wide_V1100_whole",           9,  8, 1100,  4,   0,  0.3f, 1.0f, 0.2f, 1.0f, TEACHER_NEAR, LABELS_MIXED,        WEIGHTS_GIVEN, 2.0f },
    { "wide_V1100_tile600_T2",      7,  8, 1100,  3, 600,  0.5f, 2.0f, 0.3f, 0.5f, TEACHER_FAR,  LABELS_TEACHER,      WEIGHTS_NONE,  1.5f },
    /* logits of ~+-200: most exponentials underflow to exactly 0 */
    { "extreme_logits_tiled",       6, 16,  300,  4, 128,  0.5f, 1.0f, 0.3f, 2.0f, TEACHER_NEAR, LABELS_MIXED,        WEIGHTS_GIVEN, 400.0f },
};

static void test_table_case(const loss_case *c, uint64_t seed)
{
    loss_data d = make_data(c, seed);
    ref_run want = run_ref(&d, &d.p);
    impl_run got = run_impl(&d, &d.p, 1, 1);
    compare_with_ref(&got, &want, &d.p, scalar_rel, scalar_abs, grad_rel);
    /* the same without the optional outputs: the forward must not depend on them */
    impl_run bare = run_impl(&d, &d.p, 0, 0);
    compare_runs(&bare, &got, &d.p, "grad and per_position NULL");
    free_run(&bare);
    free_run(&got);
    free_ref(&want);
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * Nothing counted
 */

static void check_all_zero(const impl_run *o, const ddk_loss_params *p, const char *what)
{
    check(o->rc == 0, "%s: rc %d, want 0", what, o->rc);
    if (o->rc != 0)
        return;
    const ddk_loss_result *r = &o->r;
    check(r->loss == 0.0 && r->ce == 0.0 && r->kl == 0.0 && r->cap == 0.0,
          "%s: loss/ce/kl/cap %g %g %g %g, want 0", what, r->loss, r->ce, r->kl, r->cap);
    check(r->weight_sum == 0.0 && r->counted == 0 && r->correct == 0,
          "%s: weight_sum %g counted %lld correct %lld, want 0", what, r->weight_sum,
          (long long)r->counted, (long long)r->correct);
    int64_t bad = 0;
    for (int64_t j = 0; j < p->n * p->hidden; j++)
        bad += o->grad[j] != 0.0f;   /* also catches NaN and the sentinel left unwritten */
    check(bad == 0, "%s: %lld gradient entries not 0", what, (long long)bad);
    bad = 0;
    for (int64_t i = 0; i < p->n; i++)
        bad += o->per[i] != 0.0f;
    check(bad == 0, "%s: %lld per_position entries not 0", what, (long long)bad);
}

static void test_nothing_counted(void)
{
    loss_case c = { "empty", 6, 5, 11, 4, 0, 0.5f, 1.5f, 0.3f, 0.7f, TEACHER_NEAR,
                    LABELS_GIVEN, WEIGHTS_GIVEN, 1.0f };
    for (int64_t tile = 0; tile <= 4; tile += 4) {
        c.vocab_tile = tile;
        loss_data d = make_data(&c, 77);
        /* every label negative, weights positive */
        for (int64_t i = 0; i < c.n; i++) {
            d.labels[i] = i % 2 ? -1 : -100;
            d.weights[i] = 1.0f;
        }
        impl_run o = run_impl(&d, &d.p, 1, 1);
        check_all_zero(&o, &d.p, tile ? "labels < 0, tiled" : "labels < 0");
        free_run(&o);
        /* valid labels, every weight 0 */
        for (int64_t i = 0; i < c.n; i++) {
            d.labels[i] = (int32_t)(i % c.V);
            d.weights[i] = 0.0f;
        }
        o = run_impl(&d, &d.p, 1, 1);
        check_all_zero(&o, &d.p, tile ? "weights 0, tiled" : "weights 0");
        free_run(&o);
        /* the same with the teacher's labels */
        free(d.labels);
        d.labels = NULL;
        o = run_impl(&d, &d.p, 1, 1);
        check_all_zero(&o, &d.p, tile ? "teacher labels, weights 0, tiled" : "teacher labels, weights 0");
        free_run(&o);
        free_data(&d);
    }
}

/* ------------------------------------------------------------------------------------------
 * p_y -> 1: W = [I | R], so d hs_i[v] = g_v / n for v < V exactly (no other row touches
 * column v), and the gradient at the label, p_y - 1 ~ -1e-14, can be read off directly.
 */

static void test_confident(void)
{
    enum { n = 4, V = 16, extra = 5, H = V + extra };
    static const double margins[n] = { 31.0, 33.0, 35.0, 37.5 };   /* CE ~ V e^-margin */
    uint64_t s = 99;
    float W[V * H];    /* (V, H) */
    float hs[n * H];   /* (n, H) */
    int32_t labels[n];
    for (int64_t v = 0; v < V; v++)
        for (int64_t k = 0; k < H; k++)
            W[v * H + k] = k < V ? (k == v ? 1.0f : 0.0f) : 0.1f * rng_sym(&s);
    for (int64_t i = 0; i < n; i++) {
        labels[i] = (int32_t)(ddk_rng_next(&s) % V);
        for (int64_t k = 0; k < H; k++)
            hs[i * H + k] = k < V ? 0.5f * rng_sym(&s) : 0.3f * rng_sym(&s);
        hs[i * H + labels[i]] += (float)margins[i];   /* along the label's row of W */
    }
    loss_data d = { .p = { .n = n, .hidden = H, .vocab = V, .chunk = 3, .kl_weight = 0.0f,
                           .kl_temperature = 1.0f, .cap_weight = 0.0f, .cap_temperature = 1.0f },
                    .hs = hs, .W = W, .labels = labels };
    ref_run want = run_ref(&d, &d.p);
    /* relative accuracy of things ~1e-14: float32 logits err by ~|z| eps32 ~ 4e-6 absolute,
     * which moves exp(z_v - z_y) by 4e-6 relative; 1e-3 leaves room, while a cancelled
     * p_y - 1 or logsumexp - z_y would be wrong by 100% (or exactly 0) */
    const double rel = 1e-3;
    for (int64_t tile = 0; tile <= 5; tile += 5) {
        d.p.vocab_tile = tile;
        impl_run got = run_impl(&d, &d.p, 1, 1);
        const char *how = tile ? "tiled" : "whole";
        check(got.rc == 0, "%s: rc %d", how, got.rc);
        if (got.rc == 0) {
            check(want.r.ce > 1e-17 && want.r.ce < 1e-11, "setup: reference CE %g not tiny",
                  want.r.ce);
            check(close_to(got.r.ce, want.r.ce, rel, 0.0), "%s: ce %.6g, reference %.6g", how,
                  got.r.ce, want.r.ce);
            check(close_to(got.r.loss, want.r.loss, rel, 0.0), "%s: loss %.6g, reference %.6g",
                  how, got.r.loss, want.r.loss);
            check(got.r.correct == n, "%s: correct %lld, want %d", how, (long long)got.r.correct,
                  n);
            for (int64_t i = 0; i < n; i++) {
                check(close_to(got.per[i], want.per[i], rel, 0.0),
                      "%s: CE_%lld %.6g, reference %.6g", how, (long long)i, got.per[i],
                      want.per[i]);
                for (int64_t v = 0; v < V; v++) {
                    double g = got.grad[i * H + v], g_ref = want.grad[i * H + v];
                    check(close_to(g, g_ref, rel, 0.0), "%s: d hs[%lld][%lld] = %.6g, reference "
                          "%.6g%s", how, (long long)i, (long long)v, g, g_ref,
                          v == labels[i] ? " (the label: (p_y - 1) / n)" : "");
                }
            }
            double e = normalised_error(got.grad, want.grad, n * H);
            check(e <= grad_rel, "%s: gradient error %.3g of max|g|", how, e);
        }
        free_run(&got);
    }
    free_ref(&want);
}

/* ------------------------------------------------------------------------------------------
 * ps ~ pt: the teacher is the student plus 1e-4 noise, alpha = 1, so KL ~1e-9
 */

static void test_kl_small(void)
{
    enum { n = 8, H = 16, V = 40 };
    loss_case c = { "kl_small", n, H, V, 3, 0, 1.0f, 1.0f, 0.0f, 1.0f, TEACHER_NEAR,
                    LABELS_GIVEN, WEIGHTS_NONE, 1.0f };
    static const float temperatures[] = { 1.0f, 2.0f };
    for (int t = 0; t < 2; t++) {
        for (int64_t tile = 0; tile <= 7; tile += 7) {
            c.T = temperatures[t];
            c.vocab_tile = tile;
            loss_data d = make_data(&c, 4242);
            uint64_t s = 17;
            for (int64_t j = 0; j < n * H; j++)
                d.ht[j] = d.hs[j] + 1e-4f * rng_sym(&s);
            ref_run want = run_ref(&d, &d.p);
            impl_run got = run_impl(&d, &d.p, 1, 1);
            double z_max = 0.0, w_max = 0.0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t v = 0; v < V; v++) {
                    double z = 0.0;
                    for (int64_t k = 0; k < H; k++)
                        z += (double)d.W[v * H + k] * d.hs[i * H + k];
                    z_max = fmax(z_max, fabs(z));
                }
            for (int64_t j = 0; j < V * H; j++)
                w_max = fmax(w_max, fabs(d.W[j]));
            /* the library's log pt - log ps, ~1e-4, is formed from float32 numbers of size
             * |z|/T + log V (scaled logits, logsumexps), each good to ~eps32 of that; the
             * error of the float32 logits themselves cancels to first order (dKL/dz ~ ps - pt).
             * Summed with weights pt and scaled by T^2: */
            const double T = c.T;
            const double kl_tol = 8.0 * FLT_EPSILON * T * T * (z_max / T + log((double)V));
            /* T (ps - pt) W / n from float32 probabilities each good to ~eps32 relative:
             * sum_v (ps_v + pt_v) eps32 |W_vk| <= 2 eps32 max|W|, a few roundings more */
            const double g_tol = 8.0 * FLT_EPSILON * T * w_max / n;
            char how[64];
            snprintf(how, sizeof(how), "T=%g tile=%lld", T, (long long)tile);
            check(got.rc == 0, "%s: rc %d", how, got.rc);
            if (got.rc == 0) {
                check(want.r.kl > 0.0 && want.r.kl < 1e-6, "setup: reference KL %g", want.r.kl);
                check(isfinite(got.r.kl) && fabs(got.r.kl - want.r.kl) <= kl_tol,
                      "%s: kl %.6g, reference %.6g, tolerance %.2g", how, got.r.kl, want.r.kl,
                      kl_tol);
                check(got.r.kl >= -kl_tol, "%s: kl %.6g is negative beyond rounding", how,
                      got.r.kl);
                for (int64_t i = 0; i < n; i++)
                    check(isfinite(got.per[i]) && fabs(got.per[i] - want.per[i]) <= kl_tol,
                          "%s: KL_%lld %.6g, reference %.6g", how, (long long)i, got.per[i],
                          want.per[i]);
                double err = 0.0;
                for (int64_t j = 0; j < n * H; j++)
                    err = fmax(err, isfinite(got.grad[j]) ? fabs(got.grad[j] - want.grad[j])
                                                          : INFINITY);
                check(err <= g_tol, "%s: gradient error %.3g, tolerance %.2g", how, err, g_tol);
            }
            free_run(&got);
            free_ref(&want);
            free_data(&d);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * chunk and vocab_tile change nothing beyond rounding
 */

static void test_invariance(void)
{
    const loss_case c = { "invariance", 10, 12, 29, 10, 0, 0.4f, 1.7f, 0.3f, 0.6f,
                          TEACHER_NEAR, LABELS_MIXED, WEIGHTS_GIVEN, 1.5f };
    loss_data d = make_data(&c, 2024);
    impl_run base = run_impl(&d, &d.p, 1, 1);
    check(base.rc == 0, "base run: rc %d", base.rc);
    const int64_t n = c.n, V = c.V;
    const int64_t chunks[] = { 1, 2, 3, n - 1, n, n + 7 };
    const int64_t tiles[] = { 0, 1, 3, V - 1, V, V + 5 };
    for (size_t a = 0; a < sizeof(chunks) / sizeof(chunks[0]) && base.rc == 0; a++)
        for (size_t b = 0; b < sizeof(tiles) / sizeof(tiles[0]); b++) {
            ddk_loss_params p = d.p;
            p.chunk = chunks[a];
            p.vocab_tile = tiles[b];
            impl_run o = run_impl(&d, &p, 1, 1);
            char what[64];
            snprintf(what, sizeof(what), "chunk=%lld tile=%lld", (long long)p.chunk,
                     (long long)p.vocab_tile);
            compare_runs(&o, &base, &p, what);
            free_run(&o);
        }
    /* and the base itself is right */
    ref_run want = run_ref(&d, &d.p);
    compare_with_ref(&base, &want, &d.p, scalar_rel, scalar_abs, grad_rel);
    check(want.r.correct > 0 && want.r.correct < want.r.counted,
          "setup: want some but not all positions correct (CAP on and off)");
    free_ref(&want);
    free_run(&base);
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * Finite differences. The case keeps argmax(zs) at least `margin` from a tie, so that no step
 * flips CAP's c_i (the loss is smooth there).
 */

static loss_data make_smooth_case(int64_t vocab_tile)
{
    const loss_case c = { "smooth", 6, 8, 13, 4, vocab_tile, 0.4f, 1.5f, 0.3f, 0.7f,
                          TEACHER_NEAR, LABELS_TEACHER, WEIGHTS_GIVEN, 1.0f };
    loss_data d = make_data(&c, 31337);
    const double margin = 0.3;
    const int64_t H = c.H, V = c.V;
    for (int64_t i = 0; i < c.n; i++) {
        d.weights[i] = 0.5f + 0.25f * (float)i;   /* all counted, not all equal */
        for (int iter = 0; iter < 100; iter++) {
            double gap;
            int64_t top = student_argmax(d.W, d.hs + i * H, V, H, &gap);
            if (gap >= margin)
                break;
            for (int64_t k = 0; k < H; k++)   /* push hs_i along the winner's row */
                d.hs[i * H + k] += 0.1f * d.W[top * H + k];
        }
    }
    return d;
}

/* the library's loss at hs with hs[j] = value */
static double impl_loss_at(const loss_data *d, int64_t j, float value)
{
    loss_data moved = *d;
    moved.hs = xcalloc((size_t)(d->p.n * d->p.hidden), sizeof(float));
    memcpy(moved.hs, d->hs, (size_t)(d->p.n * d->p.hidden) * sizeof(float));
    moved.hs[j] = value;
    ddk_loss_result r;
    int rc = ddk_loss_cpu(&moved.p, moved.hs, moved.ht, moved.W, moved.labels, moved.weights,
                          NULL, NULL, &r);
    check(rc == 0, "loss at a moved point: rc %d", rc);
    free(moved.hs);
    return rc == 0 ? r.loss : NAN;
}

/* the reference's loss at hs with hs[j] = value */
static double ref_loss_at(const loss_data *d, int64_t j, float value)
{
    float *hs = xcalloc((size_t)(d->p.n * d->p.hidden), sizeof(float));
    memcpy(hs, d->hs, (size_t)(d->p.n * d->p.hidden) * sizeof(float));
    hs[j] = value;
    ddk_loss_result r;
    loss_reference(&d->p, hs, d->ht, d->W, d->labels, d->weights, NULL, NULL, &r);
    free(hs);
    return r.loss;
}

static void test_finite_differences_impl(void)
{
    for (int64_t tile = 0; tile <= 5; tile += 5) {
        loss_data d = make_smooth_case(tile);
        const int64_t count = d.p.n * d.p.hidden;
        impl_run got = run_impl(&d, &d.p, 1, 0);
        check(got.rc == 0, "rc %d", got.rc);
        if (got.rc != 0) {
            free_run(&got);
            free_data(&d);
            continue;
        }
        check(got.r.correct > 0, "setup: no position has c_i = 1, CAP untested");
        double g_max = 0.0;
        for (int64_t j = 0; j < count; j++)
            g_max = fmax(g_max, fabs(got.grad[j]));
        /* eps = 2^-6: logits move by <= |W| eps ~ 0.01, far below the 0.3 margin. The loss
         * (from float32 l_i) is good to a few eps32 of its size per evaluation, which the
         * division by 2 eps magnifies; the O(eps^2) truncation, eps^2/6 |f'''|, is ~1e-6,
         * inside 1e-4 of max|g| (~0.1). A wrong factor in any term is off by >= 1e-3. */
        const float eps = 0x1.0p-6f;
        const double tol = 8.0 * FLT_EPSILON * fabs(got.r.loss) / (2.0 * eps) + 1e-4 * g_max;
        uint64_t s = 5 + (uint64_t)tile;
        for (int k = 0; k < 10; k++) {
            int64_t j = (int64_t)(ddk_rng_next(&s) % (uint64_t)count);
            float up = d.hs[j] + eps, down = d.hs[j] - eps;
            double fd = (impl_loss_at(&d, j, up) - impl_loss_at(&d, j, down)) /
                        ((double)up - (double)down);
            check(isfinite(fd) && fabs(fd - got.grad[j]) <= tol,
                  "tile=%lld: d loss / d hs[%lld]: analytic %.7g, finite difference %.7g, "
                  "tolerance %.2g", (long long)tile, (long long)j, got.grad[j], fd, tol);
        }
        free_run(&got);
        free_data(&d);
    }
}

static void test_finite_differences_ref(void)
{
    loss_data d = make_smooth_case(0);
    const int64_t count = d.p.n * d.p.hidden;
    ref_run want = run_ref(&d, &d.p);
    check(want.r.correct > 0 && want.r.kl > 0.0 && want.r.cap > 0.0,
          "setup: CE, KL and CAP must all be active");
    double g_max = 0.0;
    for (int64_t j = 0; j < count; j++)
        g_max = fmax(g_max, fabs(want.grad[j]));
    /* eps = 2^-12 in double arithmetic: truncation eps^2/6 |f'''| ~ 1e-8, rounding 1e-16 / eps
     * ~ 1e-12; 1e-6 of max|g| is tight enough that a wrong factor (T, 1/Tc, H(pc)) fails */
    const float eps = 0x1.0p-12f;
    const double tol = 1e-6 * g_max;
    for (int64_t j = 0; j < count; j++) {   /* every coordinate: it is cheap in double */
        float up = d.hs[j] + eps, down = d.hs[j] - eps;
        double fd = (ref_loss_at(&d, j, up) - ref_loss_at(&d, j, down)) /
                    ((double)up - (double)down);
        check(fabs(fd - want.grad[j]) <= tol,
              "reference d loss / d hs[%lld]: analytic %.10g, finite difference %.10g",
              (long long)j, want.grad[j], fd);
    }
    free_ref(&want);
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * A bf16 head (head_bf16): the widened head's bf16 products, bit for bit
 */

/* d->W (V, H) rounded to bf16 in place (so d->W is the widened head) and its bit patterns */
static uint16_t *round_head(loss_data *d)
{
    const int64_t count = d->p.vocab * d->p.hidden;
    uint16_t *w16 = xcalloc((size_t)count, sizeof(uint16_t));   /* (V, H) */
    for (int64_t j = 0; j < count; j++) {
        w16[j] = ddk_f32_to_bf16(d->W[j]);
        d->W[j] = ddk_bf16_to_f32(w16[j]);
    }
    return w16;
}

/* two runs that must agree in every bit: result fields, l_i and the gradient */
static void compare_bits(const impl_run *got, const impl_run *want, const ddk_loss_params *p,
                         const char *what)
{
    const ddk_loss_result *a = &got->r, *b = &want->r;
    check(got->rc == 0 && want->rc == 0, "%s: rc %d, %d", what, got->rc, want->rc);
    if (got->rc != 0 || want->rc != 0)
        return;
    check(memcmp(a, b, sizeof *a) == 0, "%s: result differs: loss %.17g vs %.17g, ce %.17g vs "
          "%.17g, correct %lld vs %lld", what, a->loss, b->loss, a->ce, b->ce,
          (long long)a->correct, (long long)b->correct);
    check(!got->per || memcmp(got->per, want->per, (size_t)p->n * sizeof(float)) == 0,
          "%s: per_position differs", what);
    check(!got->grad || memcmp(got->grad, want->grad, (size_t)(p->n * p->hidden) * sizeof(float)) == 0,
          "%s: gradient differs", what);
}

static void test_bf16_head_case(const loss_case *c, uint64_t seed)
{
    loss_data d = make_data(c, seed);
    uint16_t *w16 = round_head(&d);
    ddk_loss_params widened = d.p, in_place = d.p;
    widened.bf16_products = 1;
    in_place.bf16_products = 1;
    in_place.head_bf16 = 1;
    impl_run want = run_impl_head(&d, &widened, d.W, 1, 1);
    impl_run got = run_impl_head(&d, &in_place, w16, 1, 1);
    compare_bits(&got, &want, &d.p, "bf16 head vs widened head");
    impl_run bare = run_impl_head(&d, &in_place, w16, 0, 0);
    compare_bits(&bare, &want, &d.p, "bf16 head, grad and per_position NULL");
    /* the operands were rounded: fp32 products on the same head give other bits */
    impl_run fp32 = run_impl_head(&d, &d.p, d.W, 1, 0);
    check(fp32.rc == 0 && got.rc == 0 &&
              memcmp(fp32.grad, got.grad, (size_t)(c->n * c->H) * sizeof(float)) != 0,
          "bf16 head: the gradient equals the fp32 products' (hidden states not rounded?)");
    free_run(&fp32);
    free_run(&bare);
    free_run(&got);
    free_run(&want);
    free(w16);
    free_data(&d);
}

/* every table case with H > 1 (with H = 1 the rounded and fp32 products may coincide) */
static void test_bf16_head(void)
{
    for (size_t j = 0; j < sizeof(table) / sizeof(table[0]); j++)
        if (table[j].H > 1)
            test_bf16_head_case(&table[j], 2000 + j);
}

/* ------------------------------------------------------------------------------------------
 * ddk_vmath.h's 8-lane kernels: the loss's exponentials and row maxima
 */

/* ddk_expf8's lanes are ddk_expf's bits, at the clamps, specials and a sweep of the range */
static void test_expf8(void)
{
    const float special[] = { 0.0f, -0.0f, 1.0f, -1.0f, 88.0f, 88.5f, -87.3f, -87.29999f,
                              -87.30001f, -88.0f, -103.9f, 1e-40f, -1e-40f, FLT_MAX, -FLT_MAX,
                              INFINITY, -INFINITY, NAN };
    int64_t count = (int64_t)(sizeof special / sizeof special[0]), bad = 0;
    enum { SWEEP = 1 << 16 };
    for (int64_t j = 0; j < count + SWEEP; j += 8) {
        float x[8];
        for (int l = 0; l < 8; l++) {
            int64_t i = j + l;
            x[l] = i < count ? special[i] : -100.0f + 200.0f * (float)(i - count) / SWEEP;
        }
        ddk_f8 y = ddk_expf8(ddk_f8_load(x));
        for (int l = 0; l < 8; l++) {
            float want = ddk_expf(x[l]), got = y[l];
            bad += isnan(want) ? !isnan(got) : memcmp(&want, &got, sizeof got) != 0;
        }
    }
    check(bad == 0, "ddk_expf8 differs from ddk_expf on %lld inputs", (long long)bad);
    float x[8] = { -INFINITY, -1000.0f, -87.31f, 0.0f, 1.0f, 88.0f, 1000.0f, INFINITY };
    ddk_f8 y = ddk_expf8(ddk_f8_load(x));
    check(y[0] == 0.0f && y[1] == 0.0f && y[2] == 0.0f && y[3] == 1.0f, "exp(-inf, -1000, -87.31, 0)");
    check(fabsf(y[4] - 2.7182817f) <= 2e-7f * 2.7182817f, "exp(1) = %.9g", (double)y[4]);
    check(y[5] == y[6] && y[6] == y[7] && isfinite(y[7]), "exp clamps at 88 (no inf)");
}

/* ddk_vargmax: the first index of the maximum, in the 8-lane body and in the tail */
static void test_vargmax(void)
{
    float x[37];
    for (int n = 1; n <= 37; n++) {
        for (int at = 0; at < n; at++) {
            for (int i = 0; i < n; i++)
                x[i] = (float)((i * 7) % 5) - 10.0f;   /* below the maximum, with ties */
            x[at] = 3.0f;
            if (at + 8 < n)
                x[at + 8] = 3.0f;                     /* the same lane, later: a tie */
            if (at + 3 < n)
                x[at + 3] = 3.0f;                     /* another lane, later: a tie */
            float m;
            int64_t got = ddk_vargmax(x, n, &m);
            check(got == at && m == 3.0f, "n %d: argmax %lld (want %d), max %g", n, (long long)got,
                  at, (double)m);
        }
    }
    for (int i = 0; i < 37; i++)
        x[i] = -INFINITY;
    float m;
    check(ddk_vargmax(x, 37, &m) == 0 && m == -INFINITY, "a row of -inf: index 0, max -inf");
}

/* ------------------------------------------------------------------------------------------
 * Bad parameters: -EINVAL, and not a byte of out, grad or per_position written
 */

enum {
    BAD_P_NULL, BAD_OUT_NULL, BAD_HS_NULL, BAD_W_NULL, BAD_N, BAD_HIDDEN, BAD_VOCAB, BAD_CHUNK,
    BAD_TILE, BAD_ALPHA_NEG, BAD_ALPHA_BIG, BAD_ALPHA_NAN, BAD_T_ZERO, BAD_T_NEG, BAD_T_NAN,
    BAD_T_INF, BAD_LAMBDA_NEG, BAD_LAMBDA_NAN, BAD_TC_ZERO, BAD_TC_NEG, BAD_TC_NAN,
    BAD_NO_TEACHER_NO_LABELS, BAD_NO_TEACHER_ALPHA, BAD_LABEL_V, BAD_WEIGHT_NAN,
    BAD_HEAD_FP32_PRODUCTS, BAD_HEAD_FLAG, BAD_COUNT
};
static const char *const bad_names[BAD_COUNT] = {
    "p NULL", "out NULL", "hs NULL", "W NULL", "n 0", "hidden 0", "vocab 0", "chunk 0",
    "vocab_tile -1", "kl_weight -0.1", "kl_weight 1.5", "kl_weight NaN", "kl_temperature 0",
    "kl_temperature -1", "kl_temperature NaN", "kl_temperature inf", "cap_weight -0.1",
    "cap_weight NaN", "cap_temperature 0", "cap_temperature -1", "cap_temperature NaN",
    "teacher NULL, labels NULL", "teacher NULL, kl_weight 0.5", "label = V", "weight NaN",
    "head_bf16 1, bf16_products 0", "head_bf16 2",
};

static void test_bad_parameters(void)
{
    enum { n = 4, H = 3, V = 5 };
    const loss_case c = { "bad", n, H, V, 2, 0, 0.5f, 1.0f, 0.1f, 1.0f, TEACHER_NEAR,
                          LABELS_GIVEN, WEIGHTS_GIVEN, 1.0f };
    loss_data d = make_data(&c, 1);
    /* the valid case first, or every refusal below would prove nothing */
    impl_run ok = run_impl(&d, &d.p, 1, 1);
    check(ok.rc == 0, "the valid base case: rc %d", ok.rc);
    free_run(&ok);

    for (int bad = 0; bad < BAD_COUNT; bad++) {
        ddk_loss_params p = d.p;
        const ddk_loss_params *pp = &p;
        const float *hs = d.hs, *ht = d.ht, *W = d.W;
        int32_t labels[n];
        float weights[n];
        memcpy(labels, d.labels, sizeof(labels));
        memcpy(weights, d.weights, sizeof(weights));
        const int32_t *lp = labels;
        int params_only = 1;   /* the fault is in the struct: workspace_bytes refuses it too */
        switch (bad) {
        case BAD_P_NULL: pp = NULL, params_only = 0; break;
        case BAD_OUT_NULL: params_only = 0; break;
        case BAD_HS_NULL: hs = NULL, params_only = 0; break;
        case BAD_W_NULL: W = NULL, params_only = 0; break;
        case BAD_N: p.n = 0; break;
        case BAD_HIDDEN: p.hidden = 0; break;
        case BAD_VOCAB: p.vocab = 0; break;
        case BAD_CHUNK: p.chunk = 0; break;
        case BAD_TILE: p.vocab_tile = -1; break;
        case BAD_ALPHA_NEG: p.kl_weight = -0.1f; break;
        case BAD_ALPHA_BIG: p.kl_weight = 1.5f; break;
        case BAD_ALPHA_NAN: p.kl_weight = NAN; break;
        case BAD_T_ZERO: p.kl_temperature = 0.0f; break;
        case BAD_T_NEG: p.kl_temperature = -1.0f; break;
        case BAD_T_NAN: p.kl_temperature = NAN; break;
        case BAD_T_INF: p.kl_temperature = INFINITY; break;
        case BAD_LAMBDA_NEG: p.cap_weight = -0.1f; break;
        case BAD_LAMBDA_NAN: p.cap_weight = NAN; break;
        case BAD_TC_ZERO: p.cap_temperature = 0.0f; break;
        case BAD_TC_NEG: p.cap_temperature = -1.0f; break;
        case BAD_TC_NAN: p.cap_temperature = NAN; break;
        case BAD_NO_TEACHER_NO_LABELS: ht = NULL, lp = NULL, p.kl_weight = 0.0f, params_only = 0; break;
        case BAD_NO_TEACHER_ALPHA: ht = NULL, params_only = 0; break;
        case BAD_LABEL_V: labels[2] = V, params_only = 0; break;
        case BAD_WEIGHT_NAN: weights[1] = NAN, params_only = 0; break;
        case BAD_HEAD_FP32_PRODUCTS: p.head_bf16 = 1; break;
        case BAD_HEAD_FLAG: p.head_bf16 = 2, p.bf16_products = 1; break;
        }
        /* out, grad and per_position full of the sentinel, and copies to compare with */
        ddk_loss_result out, out_before;
        float grad[n * H], grad_before[n * H], per[n], per_before[n];
        memset(&out, sentinel_byte, sizeof(out));
        memset(grad, sentinel_byte, sizeof(grad));
        memset(per, sentinel_byte, sizeof(per));
        memcpy(&out_before, &out, sizeof(out));
        memcpy(grad_before, grad, sizeof(grad));
        memcpy(per_before, per, sizeof(per));
        ddk_alloc_stats s0 = ddk_allocator_stats(ddk_allocator_cpu());
        int rc = ddk_loss_cpu(pp, hs, ht, W, lp, weights, grad, per,
                              bad == BAD_OUT_NULL ? NULL : &out);
        check(rc == -EINVAL, "%s: rc %d, want -EINVAL (%d)", bad_names[bad], rc, -EINVAL);
        check(memcmp(&out, &out_before, sizeof(out)) == 0, "%s: out written", bad_names[bad]);
        check(memcmp(grad, grad_before, sizeof(grad)) == 0, "%s: grad written", bad_names[bad]);
        check(memcmp(per, per_before, sizeof(per)) == 0, "%s: per_position written",
              bad_names[bad]);
        check(ddk_allocator_stats(ddk_allocator_cpu()).current == s0.current,
              "%s: workspace left allocated", bad_names[bad]);
        if (params_only) {
            int64_t ws = ddk_loss_workspace_bytes(&p, 1);
            check(ws == -EINVAL, "%s: ddk_loss_workspace_bytes %lld, want -EINVAL",
                  bad_names[bad], (long long)ws);
        }
    }
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * Workspace: exactly ddk_loss_workspace_bytes() from the accounting allocator; one byte less
 * of budget is -ENOMEM with nothing written
 */

/* head_bf16: the head in place as bf16, whose workspace must be the fp32 head's */
static void test_budget_case(const loss_case *c, const char *what, int head_bf16)
{
    ddk_allocator *alloc = ddk_allocator_cpu();
    loss_data d = make_data(c, 555);
    const int64_t n = c->n, H = c->H;
    const int uses_teacher = ddk_loss_uses_teacher(&d.p, d.labels != NULL);
    const int64_t ws_fp32 = ddk_loss_workspace_bytes(&d.p, uses_teacher);
    uint16_t *w16 = head_bf16 ? round_head(&d) : NULL;
    const void *head = head_bf16 ? (const void *)w16 : d.W;
    d.p.head_bf16 = head_bf16;
    d.p.bf16_products = head_bf16;
    int64_t ws = ddk_loss_workspace_bytes(&d.p, uses_teacher);
    check(ws > 0 && ws == ws_fp32, "%s: workspace_bytes %lld, the fp32 head's %lld", what,
          (long long)ws, (long long)ws_fp32);
    if (ws <= 0) {
        free(w16);
        free_data(&d);
        return;
    }
    size_t current = ddk_allocator_stats(alloc).current;

    /* one byte short */
    ddk_allocator_set_budget(alloc, current + (size_t)ws - 1);
    impl_run o = run_impl_head(&d, &d.p, head, 1, 1);
    check(o.rc == -ENOMEM, "%s: budget ws - 1: rc %d, want -ENOMEM (%d)", what, o.rc, -ENOMEM);
    unsigned char expect[sizeof(ddk_loss_result)];
    memset(expect, sentinel_byte, sizeof(expect));
    check(memcmp(&o.r, expect, sizeof(expect)) == 0, "%s: -ENOMEM but out written", what);
    int64_t touched = 0;
    for (int64_t j = 0; j < n * H; j++)
        touched += memcmp(&o.grad[j], expect, sizeof(float)) != 0;
    for (int64_t i = 0; i < n; i++)
        touched += memcmp(&o.per[i], expect, sizeof(float)) != 0;
    check(touched == 0, "%s: -ENOMEM but %lld floats of grad/per_position written", what,
          (long long)touched);
    check(ddk_allocator_stats(alloc).current == current, "%s: -ENOMEM leaked %lld bytes", what,
          (long long)(ddk_allocator_stats(alloc).current - current));
    free_run(&o);

    /* exactly enough */
    ddk_allocator_set_budget(alloc, current + (size_t)ws);
    ddk_allocator_reset_peak(alloc);
    o = run_impl_head(&d, &d.p, head, 1, 1);
    ddk_alloc_stats s = ddk_allocator_stats(alloc);
    check(o.rc == 0, "%s: budget = ws: rc %d", what, o.rc);
    check(s.peak == current + (size_t)ws, "%s: peak %zu, want current + ws = %zu", what, s.peak,
          current + (size_t)ws);
    check(s.current == current, "%s: current %zu after the call, want %zu", what, s.current,
          current);
    free_run(&o);
    ddk_allocator_set_budget(alloc, 0);
    free(w16);
    free_data(&d);
}

static void test_budget(void)
{
    const loss_case whole = { "ws_whole", 9, 6, 21, 4, 0, 0.5f, 1.0f, 0.2f, 0.8f,
                              TEACHER_NEAR, LABELS_TEACHER, WEIGHTS_GIVEN, 1.0f };
    const loss_case tiled = { "ws_tiled", 9, 6, 21, 4, 5, 0.5f, 1.0f, 0.2f, 0.8f,
                              TEACHER_NEAR, LABELS_SOME_IGNORED, WEIGHTS_NONE, 1.0f };
    const loss_case student_only = { "ws_no_teacher", 9, 6, 21, 3, 0, 0.0f, 1.0f, 0.0f, 1.0f,
                                     TEACHER_NONE, LABELS_GIVEN, WEIGHTS_NONE, 1.0f };
    for (int head_bf16 = 0; head_bf16 <= 1; head_bf16++) {
        test_budget_case(&whole, head_bf16 ? "whole vocabulary, bf16 head" : "whole vocabulary", head_bf16);
        test_budget_case(&tiled, head_bf16 ? "tiled, bf16 head" : "tiled", head_bf16);
        test_budget_case(&student_only, head_bf16 ? "no teacher, bf16 head" : "no teacher", head_bf16);
    }
}

static void test_workspace_scaling(void)
{
    ddk_loss_params p = { .n = 64, .hidden = 32, .vocab = 1000, .chunk = 16, .vocab_tile = 0,
                          .kl_weight = 0.5f, .kl_temperature = 1.0f, .cap_weight = 0.0f,
                          .cap_temperature = 1.0f };
    int64_t small = ddk_loss_workspace_bytes(&p, 1);
    p.vocab = 50000;
    int64_t large = ddk_loss_workspace_bytes(&p, 1);
    check(small > 0 && large > small, "vocab_tile 0: ws(V=1000) %lld, ws(V=50000) %lld: want "
          "growth with V", (long long)small, (long long)large);
    /* at least the two chunk x V logit buffers of SPEC.md */
    check(large >= 2 * 16 * 50000 * (int64_t)sizeof(float), "vocab_tile 0: ws %lld below "
          "2 x chunk x V floats", (long long)large);
    int64_t student_only = ddk_loss_workspace_bytes(&p, 0);
    check(student_only > 0 && student_only < large, "no teacher: ws %lld, with teacher %lld",
          (long long)student_only, (long long)large);

    p.vocab_tile = 64;
    p.vocab = 1000;
    int64_t tiled = ddk_loss_workspace_bytes(&p, 1);
    p.vocab = 50000;
    int64_t tiled_big_v = ddk_loss_workspace_bytes(&p, 1);
    p.n = 100000;
    int64_t tiled_big_n = ddk_loss_workspace_bytes(&p, 1);
    check(tiled > 0 && tiled_big_v <= tiled && tiled_big_n <= tiled,
          "vocab_tile 64: ws %lld (V=1000), %lld (V=50000), %lld (n=100000): must not grow",
          (long long)tiled, (long long)tiled_big_v, (long long)tiled_big_n);
    check(tiled < large, "tiled ws %lld not below the whole-vocabulary ws %lld", (long long)tiled,
          (long long)large);
}

/* ------------------------------------------------------------------------------------------
 * The CPU backend
 */

static void test_backend_loss(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    check(be != NULL && be->loss != NULL && be->matmul != NULL, "the CPU backend is incomplete");
    if (!be || !be->loss)
        return;
    check(strcmp(be->name, "cpu") == 0, "backend name '%s'", be->name);
    check(be->alloc == ddk_allocator_cpu(), "the CPU backend's allocator is not the cpu one");
    const loss_case c = { "backend", 11, 10, 27, 4, 6, 0.3f, 1.2f, 0.2f, 0.9f, TEACHER_NEAR,
                          LABELS_MIXED, WEIGHTS_GIVEN, 1.0f };
    loss_data d = make_data(&c, 8);
    impl_run direct = run_impl(&d, &d.p, 1, 1);
    impl_run via = direct;
    via.grad = xcalloc((size_t)(c.n * c.H), sizeof(float));
    via.per = xcalloc((size_t)c.n, sizeof(float));
    via.rc = be->loss(be, &d.p, d.hs, d.ht, d.W, d.labels, d.weights, via.grad, via.per, &via.r);
    check(direct.rc == 0 && via.rc == 0, "rc %d (direct), %d (backend)", direct.rc, via.rc);
    const ddk_loss_result *a = &via.r, *b = &direct.r;
    check(a->loss == b->loss && a->ce == b->ce && a->kl == b->kl && a->cap == b->cap &&
              a->weight_sum == b->weight_sum && a->counted == b->counted &&
              a->correct == b->correct,
          "backend result differs from ddk_loss_cpu: loss %.17g vs %.17g", a->loss, b->loss);
    check(memcmp(via.grad, direct.grad, (size_t)(c.n * c.H) * sizeof(float)) == 0,
          "backend gradient not bit-identical");
    check(memcmp(via.per, direct.per, (size_t)c.n * sizeof(float)) == 0,
          "backend per_position not bit-identical");
    free_run(&via);
    free_run(&direct);
    free_data(&d);
}

static void test_backend_matmul(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    if (!be || !be->matmul) {
        check(0, "no matmul");
        return;
    }
    enum { m = 7, n = 5, k = 9, pad = 3 };
    const float alpha = 0.7f, beta = -0.3f;
    uint64_t s = 123;
    for (int trans_a = 0; trans_a <= 1; trans_a++)
        for (int trans_b = 0; trans_b <= 1; trans_b++) {
            /* op(a) (m, k), op(b) (k, n); every leading dimension longer than its row */
            const int64_t rows_a = trans_a ? k : m, cols_a = trans_a ? m : k;
            const int64_t rows_b = trans_b ? n : k, cols_b = trans_b ? k : n;
            const int64_t lda = cols_a + pad, ldb = cols_b + pad + 1, ldc = n + pad + 2;
            float *a = xcalloc((size_t)(rows_a * lda), sizeof(float));   /* (rows_a, lda) */
            float *b = xcalloc((size_t)(rows_b * ldb), sizeof(float));   /* (rows_b, ldb) */
            float *c = xcalloc((size_t)(m * ldc), sizeof(float));        /* (m, ldc) */
            float *c0 = xcalloc((size_t)(m * ldc), sizeof(float));
            for (int64_t j = 0; j < rows_a * lda; j++)
                a[j] = rng_sym(&s);
            for (int64_t j = 0; j < rows_b * ldb; j++)
                b[j] = rng_sym(&s);
            for (int64_t j = 0; j < m * ldc; j++)
                c[j] = c0[j] = rng_sym(&s);
            be->matmul(be, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
            double worst = 0.0;
            int64_t pad_touched = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t j = 0; j < ldc; j++) {
                    if (j >= n) {
                        pad_touched += c[i * ldc + j] != c0[i * ldc + j];
                        continue;
                    }
                    double acc = 0.0, mag = 0.0;
                    for (int64_t l = 0; l < k; l++) {
                        double x = trans_a ? a[l * lda + i] : a[i * lda + l];
                        double y = trans_b ? b[j * ldb + l] : b[l * ldb + j];
                        acc += x * y;
                        mag += fabs(x * y);
                    }
                    double want = alpha * acc + beta * c0[i * ldc + j];
                    /* fp32 products and sums over k terms: a few eps32 of the magnitudes */
                    double tol = 8.0 * k * FLT_EPSILON * (fabs(alpha) * mag + fabs(beta * c0[i * ldc + j]));
                    double err = fabs(c[i * ldc + j] - want);
                    if (!(err <= tol))
                        worst = fmax(worst, isfinite(err) ? err / tol : INFINITY);
                }
            check(worst == 0.0, "trans_a=%d trans_b=%d: error %.3g x tolerance", trans_a,
                  trans_b, worst);
            check(pad_touched == 0, "trans_a=%d trans_b=%d: %lld entries beyond n in c written",
                  trans_a, trans_b, (long long)pad_touched);
            free(a), free(b), free(c), free(c0);
        }
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

int main(void)
{
    for (size_t j = 0; j < sizeof(table) / sizeof(table[0]); j++) {
        test_table_case(&table[j], 1000 + j);
        char name[96];
        snprintf(name, sizeof(name), "reference %s", table[j].name);
        case_done(name);
    }
    static const test_case cases[] = {
        { "nothing counted", test_nothing_counted },
        { "p_y -> 1 (no cancellation)", test_confident },
        { "ps ~ pt (tiny KL)", test_kl_small },
        { "chunk and vocab_tile invariance", test_invariance },
        { "gradient vs finite differences (library)", test_finite_differences_impl },
        { "gradient vs finite differences (reference)", test_finite_differences_ref },
        { "bf16 head = bf16_products on the widened head, bit for bit", test_bf16_head },
        { "ddk_expf8 = ddk_expf, bit for bit", test_expf8 },
        { "ddk_vargmax: first index of the maximum", test_vargmax },
        { "bad parameters refused, nothing written", test_bad_parameters },
        { "budget: -ENOMEM at ws - 1, peak = ws (fp32 and bf16 heads)", test_budget },
        { "workspace scaling", test_workspace_scaling },
        { "backend loss = ddk_loss_cpu", test_backend_loss },
        { "backend matmul", test_backend_matmul },
    };
    run_cases(cases, sizeof(cases) / sizeof(cases[0]));
    ddk_allocator_set_budget(ddk_allocator_cpu(), 0);
    return cases_summary();
}
