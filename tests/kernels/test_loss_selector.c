/* test_loss_selector.c: the DFlash2 path selector's term inside the fused loss (SPEC.md 2.1),
 * ddk_loss_cpu() with ddk_loss_params.selector.
 *
 * What it checks:
 *   - a table of small cases against the float64 reference (tests/kernels/loss_reference.c):
 *     loss, every result field (sel, sel_covered, sel_correct with the rest), l_i, d hs and the
 *     selector's dA, dBs, dHp (ADDED into what the buffers held; untouched where the reference
 *     is 0); strict and inject, stop_gradient on and off, weight 0, 1 and 0.5, given labels and
 *     the teacher's argmax, KL and CAP on, materialised and streamed (tiles not dividing V),
 *     bf16_products; guard words after every output; the same forward without the gradients;
 *   - chunk and vocab_tile change nothing beyond float rounding, and the candidates not at all
 *     (sel_covered, sel_correct and the rows of dBs touched are the same);
 *   - ties in zs (exact in float and double): the lower id is the candidate, in both modes and
 *     for tiles that cut between the tied ids;
 *   - the reference's gradients (hs, A, Bs, Hp) against central finite differences of its own
 *     loss, which checks SPEC.md 2.1's gradient formulas;
 *   - selector NULL: the sel fields 0; weight 0: loss, l_i and d hs bit for bit those without a
 *     selector and the selector tensors untouched; stop_gradient: d hs bit for bit that without a
 *     selector, dA, dBs, dHp bit for bit those without stop_gradient;
 *   - a bf16 head in place: bit for bit bf16_products on the widened head, selector included;
 *   - refusals (-EINVAL, nothing written, no workspace left), the workspace exactly
 *     ddk_loss_workspace_bytes (-ENOMEM one byte short, nothing written), and its growth: the
 *     selector's (chunk, K) and (chunk, r) buffers, nothing vocabulary-sized.
 * What it does not: the CUDA loss (tests/simt, tests/kernels/test_backend_ops.c), topk_rows
 * (tests/kernels/test_topk.c), the plain loss (tests/kernels/test_loss.c).
 *
 * Data: rows are drawn again until, in double, the K-th and (K+1)-th logits, the two largest
 * logits, the teacher's two largest (its argmax labels) and the two largest scores differ by a
 * margin, so float rounding picks the same candidates, c_i, labels and pick as the reference
 * (the ties case makes its ties exact instead).
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 * Legend: n positions, H hidden, V vocabulary, K candidates, r the selector's rank.
 */
#include "ddk.h"
#include "check.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "loss_reference.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Tolerances (test_loss.c's, with the same reasons)
 */

/* loss and its parts, l_i: float logits move a logsumexp by ~H eps32 relative */
static const double scalar_rel = 1e-5, scalar_abs = 1e-6;
/* d hs, dA, dBs, dHp as max error / max |reference|: per-logit errors, then float sums */
static const double grad_rel = 1e-4;
/* bf16_products: the gradient products take g and dq rounded to bf16 (2^-9 relative each) */
static const double grad_rel_bf16 = 1e-2;
/* another chunk / vocab_tile: only the order of float sums changes */
static const double invariance_rel = 1e-5, invariance_abs = 1e-6;

static int close_to(double got, double want, double rel, double abs_tol)
{
    return isfinite(got) && fabs(got - want) <= rel * fabs(want) + abs_tol;
}

static float rng_sym(uint64_t *state)
{
    return (float)(2.0 * ddk_rng_uniform(state) - 1.0);
}

/* ------------------------------------------------------------------------------------------
 * Test data
 */

enum { LABELS_TEACHER, LABELS_GIVEN };

typedef struct {
    const char *name;
    int64_t n, H, V, K, r, chunk, vocab_tile;
    float alpha, T, lambda, Tc;
    int teacher;       /* 1: ht = hs + noise; 0: none (needs given labels, alpha 0) */
    int labels;        /* LABELS_* */
    int weights;       /* 1: fractional, some 0 or negative; 0: NULL */
    float weight;      /* alpha_sel */
    int inject, stop_gradient, bf16;
} sel_case;

typedef struct {
    ddk_loss_params p;     /* p.selector is set by each run */
    ddk_selector s;        /* its dA, dBs, dHp are set by each run */
    float *hs, *ht, *W;    /* (n, H), (n, H) or NULL, (V, H) */
    float *A, *Bs, *Hp;    /* (V, r), (V, r), (r, H) */
    int32_t *labels;       /* (n) or NULL */
    int32_t *pred;         /* (n) */
    float *weights;        /* (n) or NULL */
} sel_data;

static ddk_loss_params case_params(const sel_case *c)
{
    ddk_loss_params p = { .n = c->n, .hidden = c->H, .vocab = c->V, .chunk = c->chunk,
                          .vocab_tile = c->vocab_tile, .kl_weight = c->alpha,
                          .kl_temperature = c->T, .cap_weight = c->lambda,
                          .cap_temperature = c->Tc, .bf16_products = c->bf16 };
    return p;
}

/* z (V) = W x in double */
static void logits_d(const sel_data *d, const float *x, double *z)
{
    const int64_t H = d->p.hidden;
    for (int64_t v = 0; v < d->p.vocab; v++) {
        double acc = 0.0;
        for (int64_t h = 0; h < H; h++)
            acc += (double)d->W[v * H + h] * x[h];
        z[v] = acc;
    }
}

/* order (V) = the ids by z descending, ties to the lower id (a selection sort: V is small) */
static void sort_ids(const double *z, int64_t V, int64_t *order)
{
    for (int64_t v = 0; v < V; v++)
        order[v] = v;
    for (int64_t a = 0; a < V; a++)
        for (int64_t b = a + 1; b < V; b++)
            if (z[order[b]] > z[order[a]] || (z[order[b]] == z[order[a]] && order[b] < order[a])) {
                int64_t t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
}

/* the label of position i: given, or the teacher's argmax */
static int64_t label_of(const sel_data *d, int64_t i, double *zt, int64_t *order)
{
    if (d->labels)
        return d->labels[i];
    logits_d(d, d->ht + i * d->p.hidden, zt);
    sort_ids(zt, d->p.vocab, order);
    return order[0];
}

/* The smallest gap, in double, of what float rounding must not reorder at position i: the K-th
 * and (K+1)-th logits, the two largest logits (CAP's c_i), the teacher's two largest (its label)
 * and the two largest scores (the pick); INFINITY when none applies */
static double row_gap(const sel_data *d, int64_t i)
{
    const int64_t H = d->p.hidden, V = d->p.vocab, K = d->s.top_k, r = d->s.rank;
    double *z = xcalloc((size_t)V, sizeof(double)), *zt = xcalloc((size_t)V, sizeof(double));
    int64_t *order = xcalloc((size_t)V, sizeof(int64_t));
    double gap = INFINITY;
    if (!d->labels) {
        label_of(d, i, zt, order);
        gap = fmin(gap, V > 1 ? zt[order[0]] - zt[order[1]] : INFINITY);
    }
    const int64_t y = label_of(d, i, zt, order);
    logits_d(d, d->hs + i * H, z);
    sort_ids(z, V, order);
    if (K < V)
        gap = fmin(gap, z[order[K - 1]] - z[order[K]]);
    if (V > 1)
        gap = fmin(gap, z[order[0]] - z[order[1]]);
    const float w = d->weights ? d->weights[i] : 1.0f;
    if (y >= 0 && w > 0.0f) {
        int64_t cand[DDK_SELECTOR_MAX_K], kstar = -1;
        for (int64_t k = 0; k < K; k++) {
            cand[k] = order[k];
            if (cand[k] == y)
                kstar = k;
        }
        if (kstar < 0 && d->s.inject)
            cand[kstar = K - 1] = y;
        if (kstar >= 0 && K > 1) {
            double q[512], s[DDK_SELECTOR_MAX_K], top = -INFINITY, second = -INFINITY;
            for (int64_t j = 0; j < r; j++) {
                q[j] = 0.0;
                for (int64_t h = 0; h < H; h++)
                    q[j] += (double)d->Hp[j * H + h] * d->hs[i * H + h];
            }
            for (int64_t k = 0; k < K; k++) {
                s[k] = z[cand[k]];
                for (int64_t j = 0; j < r; j++)
                    s[k] += (double)d->A[d->pred[i] * r + j] * q[j] * d->Bs[cand[k] * r + j];
                if (s[k] > top)
                    second = top, top = s[k];
                else if (s[k] > second)
                    second = s[k];
            }
            gap = fmin(gap, top - second);
        }
    }
    free(z), free(zt), free(order);
    return gap;
}

static float maybe_bf16(float x, int bf16)
{
    return bf16 ? ddk_round_bf16(x) : x;
}

/* Position i drawn (hs, ht, predecessor, given label) */
static void draw_row(sel_data *d, const sel_case *c, int64_t i, uint64_t *s)
{
    const int64_t H = c->H, V = c->V, K = c->K;
    for (int64_t h = 0; h < H; h++)
        d->hs[i * H + h] = maybe_bf16(rng_sym(s), c->bf16);
    if (d->ht)
        for (int64_t h = 0; h < H; h++)
            d->ht[i * H + h] = maybe_bf16(d->hs[i * H + h] + 0.5f * rng_sym(s), c->bf16);
    d->pred[i] = (int32_t)(ddk_rng_next(s) % (uint64_t)V);
    if (!d->labels)
        return;
    /* a third the student's argmax, a third one of its top K, the rest outside it (any id when
     * K = V); some ignored */
    double *z = xcalloc((size_t)V, sizeof(double));
    int64_t *order = xcalloc((size_t)V, sizeof(int64_t));
    logits_d(d, d->hs + i * H, z);
    sort_ids(z, V, order);
    const double u = ddk_rng_uniform(s);
    d->labels[i] = (int32_t)(u < 0.3   ? order[0]
                             : u < 0.6 || K == V ? order[ddk_rng_next(s) % (uint64_t)K]
                                                 : order[K + ddk_rng_next(s) % (uint64_t)(V - K)]);
    if (i > 0 && ddk_rng_uniform(s) < 0.1)
        d->labels[i] = -1;
    free(z), free(order);
}

static sel_data make_data(const sel_case *c, uint64_t seed, double margin)
{
    sel_data d = { .p = case_params(c) };
    const int64_t n = c->n, H = c->H, V = c->V, r = c->r;
    uint64_t s = seed;
    d.s = (ddk_selector){ .top_k = c->K, .rank = r, .weight = c->weight, .inject = c->inject,
                          .stop_gradient = c->stop_gradient };
    d.W = xcalloc((size_t)(V * H), sizeof(float));
    d.Hp = xcalloc((size_t)(r * H), sizeof(float));
    d.A = xcalloc((size_t)(V * r), sizeof(float));
    d.Bs = xcalloc((size_t)(V * r), sizeof(float));
    d.hs = xcalloc((size_t)(n * H), sizeof(float));
    d.ht = c->teacher ? xcalloc((size_t)(n * H), sizeof(float)) : NULL;
    d.pred = xcalloc((size_t)n, sizeof(int32_t));
    d.labels = c->labels == LABELS_GIVEN ? xcalloc((size_t)n, sizeof(int32_t)) : NULL;
    /* logits and scores of order 1: W rows of norm ~0.9, q ~ Hp hs of order 0.5, A q Bs summed
     * over r of order 1 */
    for (int64_t j = 0; j < V * H; j++)
        d.W[j] = maybe_bf16(1.5f / sqrtf((float)H) * rng_sym(&s), c->bf16);
    for (int64_t j = 0; j < r * H; j++)
        d.Hp[j] = maybe_bf16(1.5f / sqrtf((float)H) * rng_sym(&s), c->bf16);
    const float ab = 2.0f / powf((float)r, 0.25f);
    for (int64_t j = 0; j < V * r; j++) {
        d.A[j] = ab * rng_sym(&s);
        d.Bs[j] = ab * rng_sym(&s);
    }
    if (c->weights) {
        d.weights = xcalloc((size_t)n, sizeof(float));
        for (int64_t i = 0; i < n; i++) {
            const double u = ddk_rng_uniform(&s);
            d.weights[i] = (float)(0.25 + 1.75 * ddk_rng_uniform(&s));
            if (i > 0 && u < 0.1)
                d.weights[i] = 0.0f;
            else if (i > 0 && u < 0.15)
                d.weights[i] = -0.5f;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        int tries = 0;
        do
            draw_row(&d, c, i, &s);
        while (row_gap(&d, i) < margin && ++tries < 1000);
        if (tries >= 1000) {
            fprintf(stderr, "test_loss_selector: %s: no row with gaps of %g\n", c->name, margin);
            exit(2);
        }
    }
    return d;
}

static void free_data(sel_data *d)
{
    free(d->hs), free(d->ht), free(d->W), free(d->A), free(d->Bs), free(d->Hp);
    free(d->labels), free(d->pred), free(d->weights);
}

/* ------------------------------------------------------------------------------------------
 * Running the library and the reference
 */

/* what dA, dBs, dHp hold before a call (they are ADDED into) */
static float before(int64_t j)
{
    return 0.125f * (float)((j * 37) % 17 - 8) / 8.0f;
}

static float *filled(int64_t count)
{
    float *x = sentinel_floats(count);
    for (int64_t j = 0; j < count; j++)
        x[j] = before(j);
    return x;
}

typedef struct {
    int rc;
    ddk_loss_result r;
    float *grad, *per;        /* (n, H), (n) + guards, or NULL */
    float *dA, *dBs, *dHp;    /* (V, r), (V, r), (r, H) + guards, or NULL */
} lib_run;

/* ddk_loss_cpu on d with parameters p, selector sel (or NULL) and head (d->W or its bf16 form);
 * want_grad: grad_student and the selector's gradients */
static lib_run run_lib_head(const sel_data *d, const ddk_loss_params *p, const ddk_selector *sel,
                            const void *head, int want_grad, int want_per)
{
    lib_run o = { 0 };
    const int64_t n = p->n, H = p->hidden, V = p->vocab;
    ddk_loss_params q = *p;
    ddk_selector s;
    if (sel) {
        const int64_t r = sel->rank;
        s = *sel;
        s.predecessors = d->pred;
        s.A = d->A;
        s.Bs = d->Bs;
        s.Hp = d->Hp;
        s.dA = s.dBs = s.dHp = NULL;
        if (want_grad) {
            s.dA = o.dA = filled(V * r);
            s.dBs = o.dBs = filled(V * r);
            s.dHp = o.dHp = filled(r * H);
        }
        q.selector = &s;
    } else {
        q.selector = NULL;
    }
    o.grad = want_grad ? sentinel_floats(n * H) : NULL;
    o.per = want_per ? sentinel_floats(n) : NULL;
    memset(&o.r, sentinel_byte, sizeof(o.r));
    o.rc = ddk_loss_cpu(&q, d->hs, d->ht, head, d->labels, d->weights, o.grad, o.per, &o.r);
    check(!o.grad || guard_intact(o.grad, n * H), "write past the end of grad_student");
    check(!o.per || guard_intact(o.per, n), "write past the end of per_position");
    if (sel && want_grad) {
        check(guard_intact(o.dA, V * sel->rank), "write past the end of dA");
        check(guard_intact(o.dBs, V * sel->rank), "write past the end of dBs");
        check(guard_intact(o.dHp, sel->rank * H), "write past the end of dHp");
    }
    return o;
}

static lib_run run_lib(const sel_data *d, const ddk_loss_params *p, const ddk_selector *sel,
                       int want_grad, int want_per)
{
    return run_lib_head(d, p, sel, d->W, want_grad, want_per);
}

static void free_lib(lib_run *o)
{
    free(o->grad), free(o->per), free(o->dA), free(o->dBs), free(o->dHp);
}

typedef struct {
    ddk_loss_result r;
    double *grad, *per, *dA, *dBs, *dHp;
} ref_run;

static ref_run run_ref(const sel_data *d, const ddk_loss_params *p, const ddk_selector *sel)
{
    ref_run o;
    const int64_t n = p->n, H = p->hidden, V = p->vocab, r = sel->rank;
    ddk_loss_params q = *p;
    ddk_selector s = *sel;
    s.predecessors = d->pred;
    s.A = d->A;
    s.Bs = d->Bs;
    s.Hp = d->Hp;
    q.selector = &s;
    o.grad = xcalloc((size_t)(n * H), sizeof(double));
    o.per = xcalloc((size_t)n, sizeof(double));
    o.dA = xcalloc((size_t)(V * r), sizeof(double));
    o.dBs = xcalloc((size_t)(V * r), sizeof(double));
    o.dHp = xcalloc((size_t)(r * H), sizeof(double));
    const loss_reference_sel_grads sg = { o.dA, o.dBs, o.dHp };
    int rc = loss_reference_selector(&q, d->hs, d->ht, d->W, d->labels, d->weights, o.grad,
                                     o.per, &o.r, &sg);
    if (rc) {
        fprintf(stderr, "test_loss_selector: the reference refused a case (%d)\n", rc);
        exit(2);
    }
    return o;
}

static void free_ref(ref_run *o)
{
    free(o->grad), free(o->per), free(o->dA), free(o->dBs), free(o->dHp);
}

/* an ADDED-into gradient got (count) against before() + want: normalised error, and untouched
 * (before() bit for bit) wherever want is exactly 0 */
static void check_added(const char *what, const float *got, const double *want, int64_t count,
                        double tol)
{
    double err = 0.0, scale = 0.0;
    int64_t touched = 0;
    for (int64_t j = 0; j < count; j++) {
        if (!isfinite(got[j])) {
            check(0, "%s[%lld] = %g", what, (long long)j, got[j]);
            return;
        }
        if (want[j] == 0.0)
            touched += got[j] != before(j);
        err = fmax(err, fabs((double)got[j] - before(j) - want[j]));
        scale = fmax(scale, fabs(want[j]));
    }
    const double e = scale > 0.0 ? err / scale : err;
    check(e <= tol, "%s: error %.3g of max|ref| %.3g, tolerance %.1g", what, e, scale, tol);
    check(touched == 0, "%s: %lld entries written where the reference has 0", what,
          (long long)touched);
}

static void compare_with_ref(const lib_run *got, const ref_run *want, const ddk_loss_params *p,
                             const ddk_selector *sel, double g_rel, double dhp_rel)
{
    const ddk_loss_result *a = &got->r, *b = &want->r;
    const double rel = scalar_rel, abs_tol = scalar_abs;
    check(got->rc == 0, "rc %d, want 0", got->rc);
    if (got->rc != 0)
        return;
    check(close_to(a->loss, b->loss, rel, abs_tol), "loss %.9g, reference %.9g", a->loss, b->loss);
    check(close_to(a->ce, b->ce, rel, abs_tol), "ce %.9g, reference %.9g", a->ce, b->ce);
    check(close_to(a->kl, b->kl, rel, abs_tol), "kl %.9g, reference %.9g", a->kl, b->kl);
    check(close_to(a->cap, b->cap, rel, abs_tol), "cap %.9g, reference %.9g", a->cap, b->cap);
    check(close_to(a->sel, b->sel, rel, abs_tol), "sel %.9g, reference %.9g", a->sel, b->sel);
    check(close_to(a->weight_sum, b->weight_sum, rel, abs_tol), "weight_sum %.9g, reference %.9g",
          a->weight_sum, b->weight_sum);
    check(a->counted == b->counted && a->correct == b->correct,
          "counted %lld correct %lld, reference %lld %lld", (long long)a->counted,
          (long long)a->correct, (long long)b->counted, (long long)b->correct);
    check(a->sel_covered == b->sel_covered && a->sel_correct == b->sel_correct,
          "sel_covered %lld sel_correct %lld, reference %lld %lld", (long long)a->sel_covered,
          (long long)a->sel_correct, (long long)b->sel_covered, (long long)b->sel_correct);
    const double parts = (1.0 - p->kl_weight) * a->ce + p->kl_weight * a->kl +
                         p->cap_weight * a->cap + sel->weight * a->sel;
    check(close_to(a->loss, parts, rel, abs_tol), "loss %.9g, its parts give %.9g", a->loss, parts);
    if (got->per)
        for (int64_t i = 0; i < p->n; i++)
            check(close_to(got->per[i], want->per[i], rel, abs_tol),
                  "per_position[%lld] %.9g, reference %.9g", (long long)i, got->per[i],
                  want->per[i]);
    if (got->grad) {
        const double e = normalised_error(got->grad, want->grad, p->n * p->hidden);
        check(e <= g_rel, "d hs: error %.3g of max|g|, tolerance %.1g", e, g_rel);
    }
    if (got->dA) {
        const int64_t V = p->vocab, H = p->hidden, r = sel->rank;
        check_added("dA", got->dA, want->dA, V * r, grad_rel);
        check_added("dBs", got->dBs, want->dBs, V * r, grad_rel);
        check_added("dHp", got->dHp, want->dHp, r * H, dhp_rel);
    }
}

/* the same problem run two ways: equal within float rounding, the discrete fields exactly, and
 * the same rows of dBs touched (the same candidates) */
static void compare_runs(const lib_run *got, const lib_run *want, const ddk_loss_params *p,
                         const ddk_selector *sel, const char *what)
{
    const ddk_loss_result *a = &got->r, *b = &want->r;
    const double rel = invariance_rel, abs_tol = invariance_abs;
    check(got->rc == 0, "%s: rc %d", what, got->rc);
    if (got->rc != 0)
        return;
    check(close_to(a->loss, b->loss, rel, abs_tol) && close_to(a->ce, b->ce, rel, abs_tol) &&
              close_to(a->kl, b->kl, rel, abs_tol) && close_to(a->cap, b->cap, rel, abs_tol) &&
              close_to(a->sel, b->sel, rel, abs_tol),
          "%s: loss/ce/kl/cap/sel %.9g %.9g %.9g %.9g %.9g, want %.9g %.9g %.9g %.9g %.9g", what,
          a->loss, a->ce, a->kl, a->cap, a->sel, b->loss, b->ce, b->kl, b->cap, b->sel);
    check(a->counted == b->counted && a->correct == b->correct &&
              a->sel_covered == b->sel_covered && a->sel_correct == b->sel_correct,
          "%s: counted/correct/sel_covered/sel_correct %lld %lld %lld %lld, want %lld %lld %lld %lld",
          what, (long long)a->counted, (long long)a->correct, (long long)a->sel_covered,
          (long long)a->sel_correct, (long long)b->counted, (long long)b->correct,
          (long long)b->sel_covered, (long long)b->sel_correct);
    if (got->per && want->per)
        for (int64_t i = 0; i < p->n; i++)
            check(close_to(got->per[i], want->per[i], rel, abs_tol),
                  "%s: per_position[%lld] %.9g, want %.9g", what, (long long)i, got->per[i],
                  want->per[i]);
    if (got->grad && want->grad) {
        double e = normalised_error_ff(got->grad, want->grad, p->n * p->hidden);
        check(e <= rel, "%s: d hs differs by %.3g of max|g|", what, e);
    }
    if (got->dA && want->dA) {
        const int64_t V = p->vocab, r = sel->rank, H = p->hidden;
        check(normalised_error_ff(got->dA, want->dA, V * r) <= rel, "%s: dA differs", what);
        check(normalised_error_ff(got->dBs, want->dBs, V * r) <= rel, "%s: dBs differs", what);
        check(normalised_error_ff(got->dHp, want->dHp, r * H) <= rel, "%s: dHp differs", what);
        int64_t rows = 0;
        for (int64_t v = 0; v < V; v++) {
            int touched_a = 0, touched_b = 0;
            for (int64_t j = 0; j < r; j++) {
                touched_a |= got->dBs[v * r + j] != before(v * r + j);
                touched_b |= want->dBs[v * r + j] != before(v * r + j);
            }
            rows += touched_a != touched_b;
        }
        check(rows == 0, "%s: %lld rows of dBs touched in one run and not the other", what,
              (long long)rows);
    }
}

/* ------------------------------------------------------------------------------------------
 * The table against the reference
 */

static const sel_case table[] = {
    /* name                       n   H    V   K   r chunk tile alpha  T    lambda Tc  teach labels         wts weight inject stop bf16 */
    { "strict_whole_teacher",    12,  8,  40,  5,  6,   5,   0, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_TEACHER, 1, 1.0f,  0, 0, 0 },
    { "inject_whole_given",      12,  8,  40,  5,  6,   5,   0, 0.2f, 1.5f, 0.3f, 0.7f, 1, LABELS_GIVEN,   1, 1.0f,  1, 0, 0 },
    { "strict_tiled_7_given",    11,  9,  45,  6,  5,   4,   7, 0.3f, 2.0f, 0.2f, 0.5f, 1, LABELS_GIVEN,   1, 0.5f,  0, 0, 0 },
    { "inject_tiled_7_teacher",  11,  9,  45,  6,  5,   4,   7, 0.3f, 1.0f, 0.2f, 1.0f, 1, LABELS_TEACHER, 0, 0.5f,  1, 0, 0 },
    { "stop_gradient_tiled",     10,  7,  33,  4,  8,   3,   5, 0.5f, 1.0f, 0.1f, 1.0f, 1, LABELS_GIVEN,   1, 1.0f,  1, 1, 0 },
    { "stop_gradient_whole",     10,  7,  33,  4,  8,   3,   0, 0.0f, 1.0f, 0.0f, 1.0f, 0, LABELS_GIVEN,   1, 1.0f,  0, 1, 0 },
    { "weight0_tiled",            9,  6,  30,  3,  4,   4,  11, 0.2f, 1.0f, 0.2f, 1.0f, 1, LABELS_TEACHER, 1, 0.0f,  1, 0, 0 },
    { "K1_no_teacher",            9,  6,  30,  1,  3,   2,   4, 0.0f, 1.0f, 0.3f, 1.0f, 0, LABELS_GIVEN,   0, 1.0f,  1, 0, 0 },
    { "K_eq_V_chunk1",            6,  5,   8,  8,  4,   1,   3, 0.4f, 1.0f, 0.0f, 1.0f, 1, LABELS_GIVEN,   1, 1.0f,  0, 0, 0 },
    { "r1_tile1",                 7,  5,  17,  4,  1,   3,   1, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_TEACHER, 1, 1.0f,  1, 0, 0 },
    { "wide_V600_K16_tile256",    8, 16, 600, 16, 12,   3, 256, 0.15f,1.0f, 0.1f, 1.0f, 1, LABELS_GIVEN,   1, 1.0f,  1, 0, 0 },
    { "wide_V600_K16_whole",      8, 16, 600, 16, 12,   8,   0, 0.15f,1.0f, 0.1f, 1.0f, 1, LABELS_GIVEN,   1, 1.0f,  0, 0, 0 },
    { "bf16_whole_inject",       10,  8,  40,  5,  6,   4,   0, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_GIVEN,   1, 1.0f,  1, 0, 1 },
    { "bf16_tiled_strict",       10,  8,  40,  5,  6,   4,   9, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_TEACHER, 1, 0.5f,  0, 0, 1 },
};

static void test_table_case(const sel_case *c, uint64_t seed)
{
    sel_data d = make_data(c, seed, 2e-3);
    ref_run want = run_ref(&d, &d.p, &d.s);
    lib_run got = run_lib(&d, &d.p, &d.s, 1, 1);
    compare_with_ref(&got, &want, &d.p, &d.s, c->bf16 ? grad_rel_bf16 : grad_rel,
                     c->bf16 ? grad_rel_bf16 : grad_rel);
    check(want.r.sel_covered > 0, "setup: no label among the candidates");
    if (c->K < c->V && c->labels == LABELS_GIVEN)
        check(want.r.sel_covered < want.r.counted, "setup: every label among the candidates");
    /* the forward does not depend on the optional outputs */
    lib_run bare = run_lib(&d, &d.p, &d.s, 0, 0);
    compare_runs(&bare, &got, &d.p, &d.s, "no gradients, no per_position");
    free_lib(&bare);
    free_lib(&got);
    free_ref(&want);
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * chunk and vocab_tile
 */

static void test_invariance(void)
{
    static const sel_case c = { "invariance", 13, 8, 37, 6, 5, 13, 0, 0.3f, 1.5f, 0.2f, 0.8f, 1,
                                LABELS_GIVEN, 1, 1.0f, 1, 0, 0 };
    sel_data d = make_data(&c, 2024, 2e-3);
    lib_run base = run_lib(&d, &d.p, &d.s, 1, 1);
    const int64_t chunks[] = { 1, 2, 5, 12, 13, 20 };
    const int64_t tiles[] = { 0, 1, 3, 6, 7, 10, 36, 37, 50 };
    for (size_t a = 0; a < sizeof chunks / sizeof chunks[0]; a++)
        for (size_t b = 0; b < sizeof tiles / sizeof tiles[0]; b++) {
            ddk_loss_params p = d.p;
            p.chunk = chunks[a];
            p.vocab_tile = tiles[b];
            lib_run o = run_lib(&d, &p, &d.s, 1, 1);
            char what[64];
            snprintf(what, sizeof what, "chunk=%lld tile=%lld", (long long)p.chunk,
                     (long long)p.vocab_tile);
            compare_runs(&o, &base, &p, &d.s, what);
            free_lib(&o);
        }
    ref_run want = run_ref(&d, &d.p, &d.s);
    compare_with_ref(&base, &want, &d.p, &d.s, grad_rel, grad_rel);
    free_ref(&want);
    free_lib(&base);
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * Ties: W's rows and hs in quarters and halves with H = 4, so every logit is exact in float
 * and in double, and rows repeated so that ids tie; the candidates must be the lower ids.
 */

static void test_ties(void)
{
    enum { n = 6, H = 4, V = 24, K = 5, r = 3 };
    static const sel_case c = { "ties", n, H, V, K, r, 4, 0, 0.0f, 1.0f, 0.2f, 1.0f, 0,
                                LABELS_GIVEN, 0, 1.0f, 0, 0, 0 };
    sel_data d = make_data(&c, 7, 0.0);
    /* W[v] = W[v % 8]: every logit value is held by 3 ids (v, v + 8, v + 16) */
    uint64_t s = 91;
    for (int64_t v = 0; v < V; v++)
        for (int64_t h = 0; h < H; h++)
            d.W[v * H + h] = v < 8 ? 0.25f * (float)((int)(ddk_rng_next(&s) % 9) - 4)
                                   : d.W[(v % 8) * H + h];
    for (int64_t j = 0; j < n * H; j++)
        d.hs[j] = 0.5f * (float)((int)(ddk_rng_next(&s) % 7) - 3);
    /* the labels: the tied ids of the K-th logit, below and above the cut; one far below */
    double z[V];
    int64_t order[V];
    for (int64_t i = 0; i < n; i++) {
        logits_d(&d, d.hs + i * H, z);
        sort_ids(z, V, order);
        int64_t tied = order[K - 1] % 8;   /* the K-th's value is held by tied, +8, +16 */
        d.labels[i] = (int32_t)(i % 3 == 0 ? tied : i % 3 == 1 ? tied + 16 : order[V - 1]);
    }
    int64_t expect_covered = 0;
    for (int64_t i = 0; i < n; i++) {
        logits_d(&d, d.hs + i * H, z);
        sort_ids(z, V, order);
        for (int64_t k = 0; k < K; k++)
            expect_covered += order[k] == d.labels[i];
    }
    for (int inject = 0; inject <= 1; inject++) {
        d.s.inject = inject;
        ref_run want = run_ref(&d, &d.p, &d.s);
        check(want.r.sel_covered == expect_covered, "setup: covered %lld, want %lld",
              (long long)want.r.sel_covered, (long long)expect_covered);
        check(want.r.sel_covered > 0 && want.r.sel_covered < want.r.counted,
              "setup: the tie should cover some labels and not others");
        const int64_t tiles[] = { 0, 1, 5, 8, 9, 16, 17 };   /* cutting between tied ids */
        for (size_t t = 0; t < sizeof tiles / sizeof tiles[0]; t++) {
            ddk_loss_params p = d.p;
            p.vocab_tile = tiles[t];
            lib_run got = run_lib(&d, &p, &d.s, 1, 1);
            compare_with_ref(&got, &want, &p, &d.s, grad_rel, grad_rel);
            check(got.r.sel_covered == want.r.sel_covered, "inject %d tile %lld: covered %lld, want %lld",
                  inject, (long long)tiles[t], (long long)got.r.sel_covered,
                  (long long)want.r.sel_covered);
            free_lib(&got);
        }
        free_ref(&want);
    }
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * The reference's gradients against central finite differences of its own loss
 */

/* the reference's loss with one float of x (hs, A, Bs or Hp of d) set to value */
static double ref_loss_at(sel_data *d, float *x, int64_t j, float value)
{
    const float old = x[j];
    x[j] = value;
    ddk_loss_params q = d->p;
    ddk_selector s = d->s;
    s.predecessors = d->pred;
    s.A = d->A;
    s.Bs = d->Bs;
    s.Hp = d->Hp;
    q.selector = &s;
    ddk_loss_result r;
    const int rc = loss_reference(&q, d->hs, d->ht, d->W, d->labels, d->weights, NULL, NULL, &r);
    x[j] = old;
    check(rc == 0, "the reference at a moved point: rc %d", rc);
    return r.loss;
}

/* count entries of x (the reference's gradient g) against finite differences: the ones with
 * the largest |g| first, then some at random (mostly 0) */
static void fd_tensor(sel_data *d, const char *what, float *x, const double *g, int64_t count,
                      uint64_t *s)
{
    double g_max = 0.0;
    int64_t top = 0;
    for (int64_t j = 0; j < count; j++)
        if (fabs(g[j]) > g_max)
            g_max = fabs(g[j]), top = j;
    check(g_max > 0.0, "%s: the reference's gradient is 0 everywhere", what);
    /* eps: logits and scores move by <= ~eps, far below the 0.05 margins; the loss in double
     * is good to ~1e-15, so the error is the truncation, eps^2 / 6 |f'''| ~ 1e-7 */
    const float eps = 0x1.0p-10f;
    for (int t = 0; t < 8; t++) {
        const int64_t j = t == 0 ? top : (int64_t)(ddk_rng_next(s) % (uint64_t)count);
        const float up = x[j] + eps, down = x[j] - eps;
        const double fd = (ref_loss_at(d, x, j, up) - ref_loss_at(d, x, j, down)) /
                          ((double)up - (double)down);
        check(fabs(fd - g[j]) <= 1e-5 * g_max + 1e-9, "%s[%lld]: reference %.9g, finite "
              "differences %.9g", what, (long long)j, g[j], fd);
    }
}

static void test_finite_differences_ref(void)
{
    static const sel_case cases[] = {
        { "fd_inject", 7, 6, 20, 4, 5, 3, 0, 0.3f, 1.5f, 0.2f, 0.8f, 1, LABELS_GIVEN, 1, 0.7f, 1, 0, 0 },
        { "fd_strict_teacher", 7, 6, 20, 4, 5, 3, 0, 0.3f, 1.0f, 0.0f, 1.0f, 1, LABELS_TEACHER, 1, 1.0f, 0, 0, 0 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sel_data d = make_data(&cases[k], 4242 + k, 0.05);
        ref_run want = run_ref(&d, &d.p, &d.s);
        check(want.r.sel_covered > 0, "%s: setup: no term", cases[k].name);
        uint64_t s = 3 + k;
        const int64_t n = d.p.n, H = d.p.hidden, V = d.p.vocab, r = d.s.rank;
        fd_tensor(&d, "hs", d.hs, want.grad, n * H, &s);
        fd_tensor(&d, "A", d.A, want.dA, V * r, &s);
        fd_tensor(&d, "Bs", d.Bs, want.dBs, V * r, &s);
        fd_tensor(&d, "Hp", d.Hp, want.dHp, r * H, &s);
        free_ref(&want);
        free_data(&d);
    }
}

/* ------------------------------------------------------------------------------------------
 * What the options must leave exactly as they were
 */

static int same_bits(const void *a, const void *b, size_t bytes)
{
    return memcmp(a, b, bytes) == 0;
}

static void test_exact_options(void)
{
    static const sel_case c = { "options", 11, 8, 29, 5, 6, 4, 6, 0.3f, 1.0f, 0.2f, 1.0f, 1,
                                LABELS_GIVEN, 1, 1.0f, 1, 0, 0 };
    sel_data d = make_data(&c, 99, 2e-3);
    const int64_t n = c.n, H = c.H, V = c.V, r = c.r;
    lib_run plain = run_lib(&d, &d.p, NULL, 1, 1);
    check(plain.rc == 0 && plain.r.sel == 0.0 && plain.r.sel_covered == 0 &&
              plain.r.sel_correct == 0,
          "selector NULL: sel %g covered %lld correct %lld, want 0", plain.r.sel,
          (long long)plain.r.sel_covered, (long long)plain.r.sel_correct);
    lib_run full = run_lib(&d, &d.p, &d.s, 1, 1);

    /* weight 0: the plain loss bit for bit, the term reported, the tensors untouched */
    ddk_selector s0 = d.s;
    s0.weight = 0.0f;
    lib_run w0 = run_lib(&d, &d.p, &s0, 1, 1);
    check(w0.r.loss == plain.r.loss && w0.r.ce == plain.r.ce && w0.r.kl == plain.r.kl &&
              w0.r.cap == plain.r.cap && w0.r.correct == plain.r.correct,
          "weight 0: loss %.17g, without a selector %.17g", w0.r.loss, plain.r.loss);
    check(same_bits(w0.grad, plain.grad, (size_t)(n * H) * sizeof(float)),
          "weight 0: d hs not the plain loss's bits");
    check(same_bits(w0.per, plain.per, (size_t)n * sizeof(float)),
          "weight 0: l_i not the plain loss's bits");
    check(w0.r.sel == full.r.sel && w0.r.sel_covered == full.r.sel_covered &&
              w0.r.sel_correct == full.r.sel_correct,
          "weight 0: sel %.17g covered %lld, with weight 1 %.17g %lld", w0.r.sel,
          (long long)w0.r.sel_covered, full.r.sel, (long long)full.r.sel_covered);
    int64_t touched = 0;
    for (int64_t j = 0; j < V * r; j++)
        touched += (w0.dA[j] != before(j)) + (w0.dBs[j] != before(j));
    for (int64_t j = 0; j < r * H; j++)
        touched += w0.dHp[j] != before(j);
    check(touched == 0, "weight 0: %lld entries of dA, dBs, dHp written", (long long)touched);

    /* stop_gradient: d hs the plain loss's bits, the tensors' gradients those without it */
    ddk_selector ss = d.s;
    ss.stop_gradient = 1;
    lib_run stop = run_lib(&d, &d.p, &ss, 1, 1);
    check(stop.r.loss == full.r.loss && stop.r.sel == full.r.sel,
          "stop_gradient: loss %.17g, without %.17g", stop.r.loss, full.r.loss);
    check(same_bits(stop.grad, plain.grad, (size_t)(n * H) * sizeof(float)),
          "stop_gradient: d hs not the plain loss's bits");
    check(same_bits(stop.dA, full.dA, (size_t)(V * r) * sizeof(float)) &&
              same_bits(stop.dBs, full.dBs, (size_t)(V * r) * sizeof(float)) &&
              same_bits(stop.dHp, full.dHp, (size_t)(r * H) * sizeof(float)),
          "stop_gradient: dA, dBs, dHp not the bits without it");
    check(!same_bits(full.grad, plain.grad, (size_t)(n * H) * sizeof(float)),
          "setup: the selector's term changes nothing of d hs");
    free_lib(&plain), free_lib(&full), free_lib(&w0), free_lib(&stop);
    free_data(&d);
}

/* a bf16 head in place: bf16_products on the head widened, bit for bit, selector included */
static void test_bf16_head(void)
{
    static const sel_case cases[] = {
        { "head16_whole", 9, 8, 31, 4, 5, 4, 0, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_GIVEN, 1, 1.0f, 1, 0, 1 },
        { "head16_tiled", 9, 8, 31, 4, 5, 4, 7, 0.2f, 1.0f, 0.1f, 1.0f, 1, LABELS_TEACHER, 1, 1.0f, 0, 0, 1 },
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        sel_data d = make_data(&cases[k], 77 + k, 2e-3);
        const int64_t n = d.p.n, H = d.p.hidden, V = d.p.vocab, r = d.s.rank;
        uint16_t *w16 = xcalloc((size_t)(V * H), sizeof(uint16_t));
        for (int64_t j = 0; j < V * H; j++)
            w16[j] = ddk_f32_to_bf16(d.W[j]);   /* exact: W is bf16 already */
        ddk_loss_params in_place = d.p;
        in_place.head_bf16 = 1;
        lib_run want = run_lib(&d, &d.p, &d.s, 1, 1);
        lib_run got = run_lib_head(&d, &in_place, &d.s, w16, 1, 1);
        check(got.rc == 0 && want.rc == 0, "rc %d, %d", got.rc, want.rc);
        check(same_bits(&got.r, &want.r, sizeof got.r), "%s: result not the same bits",
              cases[k].name);
        check(same_bits(got.grad, want.grad, (size_t)(n * H) * sizeof(float)) &&
                  same_bits(got.per, want.per, (size_t)n * sizeof(float)) &&
                  same_bits(got.dA, want.dA, (size_t)(V * r) * sizeof(float)) &&
                  same_bits(got.dBs, want.dBs, (size_t)(V * r) * sizeof(float)) &&
                  same_bits(got.dHp, want.dHp, (size_t)(r * H) * sizeof(float)),
              "%s: an output not the same bits", cases[k].name);
        free_lib(&got), free_lib(&want);
        free(w16);
        free_data(&d);
    }
}

/* ------------------------------------------------------------------------------------------
 * Refusals
 */

enum {
    BAD_K0, BAD_K_OVER_V, BAD_K_OVER_MAX, BAD_R0, BAD_WEIGHT_NEG, BAD_WEIGHT_NAN, BAD_WEIGHT_INF,
    BAD_INJECT, BAD_STOP, BAD_PRED_NULL, BAD_A_NULL, BAD_BS_NULL, BAD_HP_NULL, BAD_DA_NULL,
    BAD_DBS_NULL, BAD_DHP_NULL, BAD_GRADS_WITHOUT_GRAD, BAD_PRED_NEG, BAD_PRED_V, BAD_COUNT
};
static const char *const bad_names[BAD_COUNT] = {
    "top_k 0", "top_k > V", "top_k > DDK_SELECTOR_MAX_K", "rank 0", "weight < 0", "weight NaN",
    "weight inf", "inject 2", "stop_gradient 2", "predecessors NULL", "A NULL", "Bs NULL",
    "Hp NULL", "dA NULL with grad_student", "dBs NULL with grad_student",
    "dHp NULL with grad_student", "dA given without grad_student", "a predecessor < 0",
    "a predecessor = V",
};

static void test_refusals(void)
{
    static const sel_case c = { "refusals", 6, 5, 70, 4, 3, 4, 0, 0.2f, 1.0f, 0.1f, 1.0f, 1,
                                LABELS_GIVEN, 1, 1.0f, 0, 0, 0 };
    sel_data d = make_data(&c, 5, 0.0);
    const int64_t n = c.n, H = c.H, V = c.V, r = c.r;
    d.weights[1] = 1.0f;   /* position 1 counts: its predecessor is read */
    d.labels[1] = 3;
    for (int bad = 0; bad < BAD_COUNT; bad++) {
        ddk_loss_params p = d.p;
        ddk_selector s = d.s;
        int32_t pred[6];
        memcpy(pred, d.pred, sizeof pred);
        s.predecessors = pred;
        s.A = d.A, s.Bs = d.Bs, s.Hp = d.Hp;
        float *dA = filled(V * r), *dBs = filled(V * r), *dHp = filled(r * H);
        s.dA = dA, s.dBs = dBs, s.dHp = dHp;
        float *grad = sentinel_floats(n * H), *per = sentinel_floats(n);
        float *grad_arg = grad;
        int params_only = 1;   /* the fault is in the struct: workspace_bytes refuses it too */
        switch (bad) {
        case BAD_K0: s.top_k = 0; break;
        case BAD_K_OVER_V: s.top_k = V + 1; break;
        case BAD_K_OVER_MAX: s.top_k = DDK_SELECTOR_MAX_K + 1; break;   /* V = 70 > 65 */
        case BAD_R0: s.rank = 0; break;
        case BAD_WEIGHT_NEG: s.weight = -0.5f; break;
        case BAD_WEIGHT_NAN: s.weight = NAN; break;
        case BAD_WEIGHT_INF: s.weight = INFINITY; break;
        case BAD_INJECT: s.inject = 2; break;
        case BAD_STOP: s.stop_gradient = 2; break;
        case BAD_PRED_NULL: s.predecessors = NULL, params_only = 0; break;
        case BAD_A_NULL: s.A = NULL, params_only = 0; break;
        case BAD_BS_NULL: s.Bs = NULL, params_only = 0; break;
        case BAD_HP_NULL: s.Hp = NULL, params_only = 0; break;
        case BAD_DA_NULL: s.dA = NULL, params_only = 0; break;
        case BAD_DBS_NULL: s.dBs = NULL, params_only = 0; break;
        case BAD_DHP_NULL: s.dHp = NULL, params_only = 0; break;
        case BAD_GRADS_WITHOUT_GRAD: grad_arg = NULL, s.dBs = s.dHp = NULL, params_only = 0; break;
        case BAD_PRED_NEG: pred[1] = -1, params_only = 0; break;
        case BAD_PRED_V: pred[1] = (int32_t)V, params_only = 0; break;
        }
        p.selector = &s;
        ddk_loss_result out, out_before;
        memset(&out, sentinel_byte, sizeof out);
        out_before = out;
        ddk_alloc_stats s0 = ddk_allocator_stats(ddk_allocator_cpu());
        const int rc = ddk_loss_cpu(&p, d.hs, d.ht, d.W, d.labels, d.weights, grad_arg, per, &out);
        check(rc == -EINVAL, "%s: rc %d, want -EINVAL", bad_names[bad], rc);
        check(same_bits(&out, &out_before, sizeof out), "%s: out written", bad_names[bad]);
        check(all_sentinel(grad, n * H) && all_sentinel(per, n), "%s: grad or per_position written",
              bad_names[bad]);
        int64_t touched = 0;
        for (int64_t j = 0; j < V * r; j++)
            touched += (dA[j] != before(j)) + (dBs[j] != before(j));
        for (int64_t j = 0; j < r * H; j++)
            touched += dHp[j] != before(j);
        check(touched == 0, "%s: %lld entries of dA, dBs, dHp written", bad_names[bad],
              (long long)touched);
        check(ddk_allocator_stats(ddk_allocator_cpu()).current == s0.current,
              "%s: workspace left allocated", bad_names[bad]);
        if (params_only)
            check(ddk_loss_workspace_bytes(&p, 1) == -EINVAL,
                  "%s: ddk_loss_workspace_bytes accepts it", bad_names[bad]);
        free(dA), free(dBs), free(dHp), free(grad), free(per);
    }
    /* K above a vocabulary smaller than DDK_SELECTOR_MAX_K */
    ddk_selector small = d.s;
    ddk_loss_params tiny = d.p;
    tiny.vocab = 10;
    tiny.selector = &small;
    small.top_k = 10;
    check(ddk_loss_workspace_bytes(&tiny, 1) > 0, "top_k = V = 10 refused");
    small.top_k = 11;
    check(ddk_loss_workspace_bytes(&tiny, 1) == -EINVAL, "top_k 11 > V = 10 accepted");
    /* a predecessor out of range where the position does not count is never read */
    ddk_loss_params p = d.p;
    ddk_selector s = d.s;
    int32_t pred[6];
    memcpy(pred, d.pred, sizeof pred);
    d.labels[2] = -1;
    pred[2] = -5;
    s.predecessors = pred;
    s.A = d.A, s.Bs = d.Bs, s.Hp = d.Hp;
    p.selector = &s;
    ddk_loss_result out;
    check(ddk_loss_cpu(&p, d.hs, d.ht, d.W, d.labels, d.weights, NULL, NULL, &out) == 0,
          "a bad predecessor at an ignored position refused");
    free_data(&d);
}

/* ------------------------------------------------------------------------------------------
 * Workspace
 */

static void test_budget(void)
{
    static const sel_case cases[] = {
        { "ws_whole", 9, 6, 21, 4, 7, 4, 0, 0.5f, 1.0f, 0.2f, 0.8f, 1, LABELS_TEACHER, 1, 1.0f, 1, 0, 0 },
        { "ws_tiled", 9, 6, 21, 3, 5, 4, 5, 0.0f, 1.0f, 0.0f, 1.0f, 0, LABELS_GIVEN, 0, 1.0f, 0, 0, 0 },
    };
    ddk_allocator *alloc = ddk_allocator_cpu();
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const sel_case *c = &cases[k];
        sel_data d = make_data(c, 555, 0.0);
        const int64_t n = c->n, H = c->H, V = c->V, r = c->r;
        const int uses_teacher = ddk_loss_uses_teacher(&d.p, d.labels != NULL);
        ddk_loss_params p = d.p;
        const int64_t plain = ddk_loss_workspace_bytes(&p, uses_teacher);
        p.selector = &d.s;
        const int64_t ws = ddk_loss_workspace_bytes(&p, uses_teacher);
        /* chunk records of 24 bytes, three (chunk, K) and three (chunk, r) buffers, each on 64 */
        const int64_t chunk = c->chunk < n ? c->chunk : n;
#define LINE(b) (((b) + 63) / 64 * 64)
        const int64_t growth = LINE(chunk * 24) + 3 * LINE(chunk * c->K * 4) + 3 * LINE(chunk * r * 4);
        check(ws - plain == growth, "%s: the selector adds %lld bytes, want %lld", c->name,
              (long long)(ws - plain), (long long)growth);
        size_t current = ddk_allocator_stats(alloc).current;
        ddk_allocator_set_budget(alloc, current + (size_t)ws - 1);
        lib_run o = run_lib(&d, &d.p, &d.s, 1, 1);
        check(o.rc == -ENOMEM, "%s: budget ws - 1: rc %d, want -ENOMEM", c->name, o.rc);
        int64_t touched = 0;
        for (int64_t j = 0; j < V * r; j++)
            touched += (o.dA[j] != before(j)) + (o.dBs[j] != before(j));
        for (int64_t j = 0; j < r * H; j++)
            touched += o.dHp[j] != before(j);
        check(touched == 0 && all_sentinel(o.grad, n * H) && all_sentinel(o.per, n),
              "%s: -ENOMEM but outputs written", c->name);
        free_lib(&o);
        ddk_allocator_set_budget(alloc, current + (size_t)ws);
        ddk_allocator_reset_peak(alloc);
        o = run_lib(&d, &d.p, &d.s, 1, 1);
        const ddk_alloc_stats st = ddk_allocator_stats(alloc);
        check(o.rc == 0 && st.peak == current + (size_t)ws && st.current == current,
              "%s: rc %d, peak %zu, want %zu", c->name, o.rc, st.peak, current + (size_t)ws);
        free_lib(&o);
        ddk_allocator_set_budget(alloc, 0);
        free_data(&d);
    }
    /* the seed's shape (examples/seed-ddtree.json: chunk 1024, the whole vocabulary, the
     * teacher's labels and KL; Qwen3.6-27B's H and V; K 16, r 256): the figures of the report */
    ddk_selector s = { .top_k = 16, .rank = 256, .weight = 1.0f };
    ddk_loss_params p = { .n = 24576, .hidden = 5120, .vocab = 248320, .chunk = 1024,
                          .vocab_tile = 0, .kl_weight = 0.15f, .kl_temperature = 1.0f,
                          .cap_weight = 0.1f, .cap_temperature = 1.0f };
    const int64_t plain = ddk_loss_workspace_bytes(&p, 1);
    p.selector = &s;
    const int64_t with = ddk_loss_workspace_bytes(&p, 1);
    printf("  # seed shape, chunk 1024, whole vocabulary: %lld bytes, with the selector %lld "
           "(+%lld)\n", (long long)plain, (long long)with, (long long)(with - plain));
    check(with - plain == LINE(1024 * 24) + 3 * LINE(1024 * 16 * 4) + 3 * LINE(1024 * 256 * 4),
          "seed shape: the selector adds %lld bytes", (long long)(with - plain));
#undef LINE
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

int main(void)
{
    for (size_t j = 0; j < sizeof table / sizeof table[0]; j++) {
        test_table_case(&table[j], 1000 + j);
        char name[96];
        snprintf(name, sizeof name, "reference %s", table[j].name);
        case_done(name);
    }
    static const test_case cases[] = {
        { "chunk and vocab_tile invariance, the same candidates", test_invariance },
        { "ties in zs: the lower ids, every tile", test_ties },
        { "reference gradients vs finite differences (hs, A, Bs, Hp)", test_finite_differences_ref },
        { "selector NULL, weight 0, stop_gradient: exactly what they must leave", test_exact_options },
        { "bf16 head = bf16_products on the widened head, bit for bit", test_bf16_head },
        { "bad selectors refused, nothing written", test_refusals },
        { "budget: -ENOMEM at ws - 1, peak = ws; the selector's growth", test_budget },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    ddk_allocator_set_budget(ddk_allocator_cpu(), 0);
    return cases_summary();
}
