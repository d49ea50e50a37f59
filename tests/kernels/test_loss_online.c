/* test_loss_online.c: the CUDA loss's one-pass statistics and gradient, emulated on the host,
 * and -inf (padded) vocabulary columns in both backends' loss (SPEC.md section 1).
 *
 * The CUDA kernels' arithmetic is kernels/cuda/loss_online.h, compiled here as C. The
 * emulation runs it as loss_cuda.cu does: per tile and row, 256 "threads" each taking the
 * kernel's groups of 4 columns (4 i, 4 i + 1024, ...; -inf past the row's end, as the scalar
 * loads give), the block's maxima and first columns merged over the threads, each thread's
 * sums brought to the row's maxima and added in float per warp of 32 threads (in order, not
 * by shuffles: only the rounding differs) and in double across warps, the row merged by
 * ddk_loss_row_merge, the finish, and per logit ddk_loss_grad_at. Nothing else runs that
 * algorithm before a GPU does; this is its test.
 *
 * What it checks:
 *   - the emulation against ddk_loss_cpu and the float64 reference (tests/kernels/loss_reference.c)
 *     on the same logits (lm_head = I, so the logits are exact and d hs is g itself): every
 *     result field, l_i and g; and each row's statistics before the finish (maxima, first
 *     argmax, label, zs_y, the seven sums) against sums in double, rest (sum over v != y)
 *     relative to its own size;
 *   - cases: the whole vocabulary and tiles, w % 4 == 0 (the kernel's float4 path) or not,
 *     w < 256 and < 1024 (threads without a column), given labels and labels from the teacher,
 *     CE alone, KL with T != 1 and CAP with Tc != 1, and T = Tc = 1; ties of the maximum
 *     across threads and tiles (the lowest column wins, earlier tiles keep ties); the
 *     teacher's argmax moving between tiles; p_y -> 1 (rest ~1e-15 of s, not 0, accurate);
 *     rising and falling rows (a rescale at every group);
 *   - -inf columns (a whole first tile, a whole thread's columns, scattered ones, the last
 *     ones; student and teacher): through ddk_loss_cpu (the logits made -inf by float
 *     overflow in the product, so the head stays finite) and through the emulation, with and
 *     without KL and CAP: everything finite, gradient exactly 0 there, and the values of the
 *     vocabulary without those columns.
 * What it does not: the kernels' loads and warp shuffles, or anything on a GPU
 * (tests/kernels/test_backend_ops.c does that, skipped without one).
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 * Dimension legend: n positions, V vocabulary, H hidden (here V + 1). Row-major.
 */
#include "ddk.h"
#include "check.h"
#include "ddk_rng.h"
#include "loss_reference.h"
#include "../../kernels/cuda/loss_online.h"   /* the CUDA kernels' arithmetic, host side */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Tolerances. The logits are exact (lm_head = I), so what differs is float32 rounding only.
 */

/* loss, ce, kl, cap, l_i against ddk_loss_cpu and the reference: both keep float32 sums
 * (per lane or thread, per warp) of V <= 4099 terms, and expf differs by an ulp or two */
static const double scalar_rel = 1e-5, scalar_abs = 1e-6;
/* g, as max error / max |g_ref|: float coefficients from those sums, then expf per logit */
static const double grad_rel = 1e-5;
/* a row's sums against the same sums in double: float sums of <= 1024 / 4 groups per thread
 * (plus their rescales) and of 32 threads per warp, relative to the sum of the terms' sizes */
static const double stats_rel = 1e-5;

static int close_to(double got, double want, double rel, double abs_tol)
{
    return isfinite(got) && fabs(got - want) <= rel * fabs(want) + abs_tol;
}

/* ------------------------------------------------------------------------------------------
 * A problem: logits given directly
 */

typedef struct {
    int64_t n, V, vocab_tile;
    float *zs;             /* (n, V) student logits, -inf at pad columns */
    float *zt;             /* (n, V) teacher logits, -inf at pad columns; or NULL */
    int32_t *labels;       /* (n), or NULL: the teacher's argmax */
    float *weights;        /* (n), or NULL */
    unsigned char *pad;    /* (V) 1: a -inf column of every row (student and teacher) */
} problem;

typedef struct {
    const char *name;
    float alpha, T, lambda, Tc;
} terms;

static const terms term_sets[] = {
    { "CE", 0.0f, 1.0f, 0.0f, 1.0f },
    { "KL T=2, CAP Tc=0.5", 0.5f, 2.0f, 0.3f, 0.5f },
    { "KL T=1, CAP Tc=1", 0.4f, 1.0f, 0.5f, 1.0f },
};
enum { TERM_SETS = sizeof term_sets / sizeof term_sets[0] };

static ddk_loss_params params_of(const problem *P, const terms *t)
{
    ddk_loss_params p = { .n = P->n, .hidden = P->V + 1, .vocab = P->V, .chunk = P->n,
                          .vocab_tile = P->vocab_tile, .kl_weight = t->alpha,
                          .kl_temperature = t->T, .cap_weight = t->lambda,
                          .cap_temperature = t->Tc };
    return p;
}

static problem new_problem(int64_t n, int64_t V, int64_t vocab_tile, int teacher, int labels)
{
    problem P = { .n = n, .V = V, .vocab_tile = vocab_tile };
    P.zs = xcalloc((size_t)(n * V), sizeof(float));
    P.zt = teacher ? xcalloc((size_t)(n * V), sizeof(float)) : NULL;
    P.labels = labels ? xcalloc((size_t)n, sizeof(int32_t)) : NULL;
    P.pad = xcalloc((size_t)V, 1);
    return P;
}

static void free_problem(problem *P)
{
    free(P->zs), free(P->zt), free(P->labels), free(P->weights), free(P->pad);
    memset(P, 0, sizeof *P);
}

static float rng_sym(uint64_t *s)
{
    return (float)(2.0 * ddk_rng_uniform(s) - 1.0);
}

/* the first v of the largest x[v] (a NaN never wins); -inf at 0 for a row of -inf only */
static int64_t first_argmax(const float *x, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[best])
            best = v;
    return best;
}

/* random logits of size ~scale; teacher = student + noise (so CAP's c_i is often 1); given
 * labels: half the student's argmax, the others uniform */
static problem random_problem(int64_t n, int64_t V, int64_t vocab_tile, int labels, float scale,
                              uint64_t seed)
{
    problem P = new_problem(n, V, vocab_tile, 1, labels);
    uint64_t s = seed;
    for (int64_t j = 0; j < n * V; j++) {
        P.zs[j] = scale * (float)ddk_rng_normal(&s);
        P.zt[j] = P.zs[j] + 0.5f * scale * rng_sym(&s);
    }
    if (labels)
        for (int64_t i = 0; i < n; i++)
            P.labels[i] = i % 2 ? (int32_t)first_argmax(P.zs + i * V, V)
                                : (int32_t)(ddk_rng_next(&s) % (uint64_t)V);
    P.weights = xcalloc((size_t)n, sizeof(float));
    for (int64_t i = 0; i < n; i++)
        P.weights[i] = i == n - 1 && n > 2 ? 0.0f : (float)(0.25 + 1.75 * ddk_rng_uniform(&s));
    return P;
}

/* ------------------------------------------------------------------------------------------
 * The emulated CUDA loss (loss_cuda.cu's ddk_cuda_loss, one chunk of all n rows)
 */

typedef struct {
    ddk_loss_result r;
    double *per;          /* (n) l_i */
    float *g;             /* (n, V) d loss / d zs (the row factor w_i / sum w in it) */
    ddk_loss_row *stats;  /* (n) each row after its last tile's merge, before the finish */
} emu_run;

/* loss_cuda.cu's load_group (both of its paths give these values) */
static void load_group(const float *x, int64_t v, int64_t w, float z[DDK_LOSS_GROUP])
{
    for (int j = 0; j < DDK_LOSS_GROUP; j++)
        z[j] = v + j < w ? x[v + j] : -INFINITY;
}

/* stats_kernel's block on one row of one tile: s, t (w) the tile's logits (t NULL: no teacher) */
static void emu_stats_tile(ddk_loss_row *R, const float *s, const float *t, int64_t off,
                           int64_t w, const ddk_loss_consts *k)
{
    static ddk_loss_thread th[DDK_LOSS_THREADS];
    const int given_col = ddk_loss_given_label_col(R, off, w, k);
    for (int i = 0; i < DDK_LOSS_THREADS; i++) {
        ddk_loss_thread_init(&th[i]);
        for (int64_t v = (int64_t)i * DDK_LOSS_GROUP; v < w; v += DDK_LOSS_STRIDE) {
            float s4[DDK_LOSS_GROUP], t4[DDK_LOSS_GROUP];
            load_group(s, v, w, s4);
            if (t)
                load_group(t, v, w, t4);
            ddk_loss_thread_add(&th[i], s4, t ? t4 : NULL, (int)v, given_col, k);
        }
    }
    float s_max = th[0].s_max, t_max = th[0].t_max;
    int s_arg = th[0].s_arg, t_arg = th[0].t_arg;
    for (int i = 1; i < DDK_LOSS_THREADS; i++) {
        ddk_loss_argmax_merge(&s_max, &s_arg, th[i].s_max, th[i].s_arg);
        ddk_loss_argmax_merge(&t_max, &t_arg, th[i].t_max, th[i].t_arg);
    }
    const ddk_loss_tile p = ddk_loss_tile_of(R, s_max, t_max, t_arg, t != NULL, off, w, k);
    double ts[DDK_LOSS_SUMS] = { 0 };
    for (int warp = 0; warp < DDK_LOSS_THREADS / 32; warp++) {
        float acc[DDK_LOSS_SUMS] = { 0 };
        for (int lane = 0; lane < 32; lane++) {
            float part[DDK_LOSS_SUMS];
            ddk_loss_thread_sums(&th[warp * 32 + lane], p.s_max, p.t_max, p.label_col, k, part);
            for (int j = 0; j < DDK_LOSS_SUMS; j++)
                acc[j] += part[j];
        }
        for (int j = 0; j < DDK_LOSS_SUMS; j++)
            ts[j] += acc[j];
    }
    ddk_loss_row_merge(R, &p, s_arg, ts, off, k);
    if (p.label_col >= 0) {
        R->z_label = s[p.label_col];
        if (t)
            R->scale = t[p.label_col];
    }
}

static emu_run emulate(const problem *P, const ddk_loss_params *p)
{
    const int64_t n = P->n, V = P->V;
    const int64_t width = p->vocab_tile > 0 && p->vocab_tile < V ? p->vocab_tile : V;
    ddk_loss_consts k = {
        .alpha = p->kl_weight, .T = p->kl_temperature, .invT = 1.0f / p->kl_temperature,
        .lambda = p->cap_weight, .invTc = 1.0f / p->cap_temperature,
        .kl = p->kl_weight > 0.0f,
        .kl_scaled = p->kl_weight > 0.0f && p->kl_temperature != 1.0f,
        .cap = p->cap_weight > 0.0f, .cap_scaled = p->cap_temperature != 1.0f,
        .given_labels = P->labels != NULL,
    };
    const int uses_teacher = ddk_loss_uses_teacher(p, P->labels != NULL);
    emu_run o;
    memset(&o, 0, sizeof o);
    o.per = xcalloc((size_t)n, sizeof(double));
    o.g = xcalloc((size_t)(n * V), sizeof(float));
    o.stats = xcalloc((size_t)n, sizeof(ddk_loss_row));

    double weight_sum = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) {
        float wi = P->weights ? P->weights[i] : 1.0f;
        if ((P->labels && P->labels[i] < 0) || !(wi > 0.0f))
            continue;
        weight_sum += wi;
        counted++;
    }
    double sums[5] = { 0, 0, 0, 0, 0 };   /* reduce_kernel's: sum w l, w CE, w KL, w CAP, correct */
    for (int64_t i = 0; i < n; i++) {
        ddk_loss_row R;   /* rows_init_kernel */
        memset(&R, 0, sizeof R);
        const int32_t label = P->labels ? P->labels[i] : -1;
        const float weight = P->weights ? P->weights[i] : 1.0f;
        R.s_arg = -1;
        R.label = label;
        R.ignored = label < 0 && P->labels ? 1 : !(weight > 0.0f);
        const float *zs = P->zs + i * V, *zt = uses_teacher ? P->zt + i * V : NULL;
        if (!R.ignored)
            for (int64_t off = 0; off < V; off += width) {
                const int64_t w = V - off < width ? V - off : width;
                emu_stats_tile(&R, zs + off, zt ? zt + off : NULL, off, w, &k);
            }
        o.stats[i] = R;
        if (R.ignored)
            continue;   /* per_position 0, gradient 0 */
        const double wi = weight;
        o.per[i] = ddk_loss_row_finish(&R, &k, wi / weight_sum);
        const double ce = R.c_dot, kl = R.t_dot, cap = R.confident ? R.entropy : 0.0;
        sums[0] += wi * ((1.0 - k.alpha) * ce + k.alpha * kl + k.lambda * cap);
        sums[1] += wi * ce;
        sums[2] += wi * kl;
        sums[3] += wi * cap;
        sums[4] += R.confident;
        /* grad_kernel: zt read only for the KL */
        const ddk_loss_grad_row G = ddk_loss_grad_row_of(&R, &k);
        for (int64_t v = 0; v < V; v++)
            o.g[i * V + v] = v == G.label ? G.g.g_label
                                          : ddk_loss_grad_at(&G, zs[v], k.kl ? zt[v] : 0.0f, &k);
    }
    if (counted > 0) {
        o.r.loss = sums[0] / weight_sum;
        o.r.ce = sums[1] / weight_sum;
        o.r.kl = sums[2] / weight_sum;
        o.r.cap = sums[3] / weight_sum;
        o.r.correct = (int64_t)sums[4];
    }
    o.r.weight_sum = weight_sum;
    o.r.counted = counted;
    return o;
}

static void free_emu(emu_run *o)
{
    free(o->per), free(o->g), free(o->stats);
}

/* ------------------------------------------------------------------------------------------
 * The same problem through ddk_loss_cpu and the float64 reference
 *
 * lm_head (V, H = V + 1): W[v][v] = 1 for a column that is not padding, W[v][V] = -FLT_MAX for
 * one that is; hidden states hs[v] = zs[v] (0 at a pad), hs[V] = 2. So a logit is its hs
 * exactly, a pad's is -FLT_MAX * 2 = -inf by overflow with every operand finite, and
 * d hs[v] = g[v] (0 at a pad) while d hs[V] = sum over pads of g * -FLT_MAX: 0 exactly when
 * the pads' gradient is.
 */

typedef struct {
    ddk_loss_result r;
    float *per;      /* (n) */
    float *g;        /* (n, V): d hs without its last column */
    double pad_g;    /* max |d hs[V]|: the pads' gradient times -FLT_MAX */
    int finite;      /* no NaN or Inf in l_i, d hs or the result */
} cpu_run;

static float *head_of(const problem *P)
{
    const int64_t V = P->V, H = V + 1;
    float *W = xcalloc((size_t)(V * H), sizeof(float));
    for (int64_t v = 0; v < V; v++) {
        if (P->pad[v])
            W[v * H + V] = -FLT_MAX;
        else
            W[v * H + v] = 1.0f;
    }
    return W;
}

/* (n, V + 1) hidden states giving the logits x (n, V) through head_of's W */
static float *hidden_of(const problem *P, const float *x)
{
    const int64_t n = P->n, V = P->V, H = V + 1;
    float *h = xcalloc((size_t)(n * H), sizeof(float));
    for (int64_t i = 0; i < n; i++) {
        for (int64_t v = 0; v < V; v++)
            h[i * H + v] = P->pad[v] ? 0.0f : x[i * V + v];
        h[i * H + V] = 2.0f;
    }
    return h;
}

static cpu_run run_cpu(const problem *P, const ddk_loss_params *p)
{
    const int64_t n = P->n, V = P->V, H = V + 1;
    float *W = head_of(P), *hs = hidden_of(P, P->zs), *ht = P->zt ? hidden_of(P, P->zt) : NULL;
    float *grad = xcalloc((size_t)(n * H), sizeof(float));
    cpu_run o;
    memset(&o, 0, sizeof o);
    o.per = xcalloc((size_t)n, sizeof(float));
    o.g = xcalloc((size_t)(n * V), sizeof(float));
    int rc = ddk_loss_cpu(p, hs, ht, W, P->labels, P->weights, grad, o.per, &o.r);
    check(rc == 0, "ddk_loss_cpu: rc %d", rc);
    o.finite = isfinite(o.r.loss) && isfinite(o.r.ce) && isfinite(o.r.kl) && isfinite(o.r.cap);
    for (int64_t i = 0; i < n; i++) {
        o.finite &= isfinite(o.per[i]);
        for (int64_t v = 0; v < H; v++)
            o.finite &= isfinite(grad[i * H + v]);
        for (int64_t v = 0; v < V; v++)
            o.g[i * V + v] = grad[i * H + v];
        o.pad_g = fmax(o.pad_g, fabs(grad[i * H + V]));
    }
    free(W), free(hs), free(ht), free(grad);
    return o;
}

static void free_cpu(cpu_run *o)
{
    free(o->per), free(o->g);
}

typedef struct {
    ddk_loss_result r;
    double *per;   /* (n) */
    double *g;     /* (n, V) */
} ref_run;

/* the reference on a problem without pads (it has no -inf rule of its own) */
static ref_run run_ref(const problem *P, const ddk_loss_params *p)
{
    const int64_t n = P->n, V = P->V, H = V + 1;
    float *W = head_of(P), *hs = hidden_of(P, P->zs), *ht = P->zt ? hidden_of(P, P->zt) : NULL;
    double *grad = xcalloc((size_t)(n * H), sizeof(double));
    ref_run o;
    o.per = xcalloc((size_t)n, sizeof(double));
    o.g = xcalloc((size_t)(n * V), sizeof(double));
    int rc = loss_reference(p, hs, ht, W, P->labels, P->weights, grad, o.per, &o.r);
    check(rc == 0, "loss_reference: rc %d", rc);
    for (int64_t i = 0; i < n; i++)
        for (int64_t v = 0; v < V; v++)
            o.g[i * V + v] = grad[i * H + v];
    free(W), free(hs), free(ht), free(grad);
    return o;
}

static void free_ref(ref_run *o)
{
    free(o->per), free(o->g);
}

/* ------------------------------------------------------------------------------------------
 * Comparisons
 */

/* a result against another (want), l_i and g too; rel_only: loss, CE and l_i relative alone
 * (p_y -> 1 with CE alone: CE ~1e-15 would pass any absolute bound; the entropy, reported
 * there too, is a float-limited cancellation near 0, so it keeps the absolute bound) */
static void compare_result(const char *what, const ddk_loss_result *a, const double *per,
                           const float *g, const ddk_loss_result *b, const double *per_want,
                           const double *g_want, int64_t n, int64_t V, int rel_only)
{
    const double abs_tol = rel_only ? 0.0 : scalar_abs;
    const double got[4] = { a->loss, a->ce, a->kl, a->cap };
    const double want[4] = { b->loss, b->ce, b->kl, b->cap };
    static const char *const names[4] = { "loss", "ce", "kl", "cap" };
    for (int j = 0; j < 4; j++)
        check(close_to(got[j], want[j], scalar_rel, j < 2 ? abs_tol : scalar_abs),
              "%s: %s %.17g, want %.17g", what, names[j], got[j], want[j]);
    check(close_to(a->weight_sum, b->weight_sum, 1e-12, 0.0), "%s: weight_sum %.17g, want %.17g",
          what, a->weight_sum, b->weight_sum);
    check(a->counted == b->counted, "%s: counted %lld, want %lld", what, (long long)a->counted,
          (long long)b->counted);
    check(a->correct == b->correct, "%s: correct %lld, want %lld", what, (long long)a->correct,
          (long long)b->correct);
    for (int64_t i = 0; i < n; i++)
        check(close_to(per[i], per_want[i], scalar_rel, abs_tol), "%s: l_%lld %.17g, want %.17g",
              what, (long long)i, per[i], per_want[i]);
    double err = normalised_error(g, g_want, n * V);
    check(err <= grad_rel, "%s: gradient normalised error %.3g > %.0e", what, err, grad_rel);
}

static void compare_emu_cpu(const char *what, const emu_run *e, const cpu_run *c, int64_t n,
                            int64_t V, int rel_only)
{
    double *per = xcalloc((size_t)n, sizeof(double)), *g = xcalloc((size_t)(n * V), sizeof(double));
    for (int64_t i = 0; i < n; i++)
        per[i] = c->per[i];
    for (int64_t j = 0; j < n * V; j++)
        g[j] = c->g[j];
    compare_result(what, &e->r, e->per, e->g, &c->r, per, g, n, V, rel_only);
    free(per), free(g);
}

/* A row's statistics after its last tile against the same sums in double */
static void check_stats(const char *what, int64_t i, const ddk_loss_row *R, const problem *P,
                        const ddk_loss_params *p)
{
    const int64_t V = P->V;
    const float *zs = P->zs + i * V, *zt = P->zt ? P->zt + i * V : NULL;
    const int uses_teacher = ddk_loss_uses_teacher(p, P->labels != NULL);
    const double T = p->kl_temperature, Tc = p->cap_temperature;
    const int kl = p->kl_weight > 0.0f;
    const int64_t s_arg = first_argmax(zs, V);
    const float s_max = zs[s_arg];
    const int64_t t_arg = uses_teacher ? first_argmax(zt, V) : -1;
    const float t_max = uses_teacher ? zt[t_arg] : 0.0f;
    const int64_t y = P->labels ? P->labels[i] : t_arg;
    check(R->s_max == s_max && R->s_arg == s_arg,
          "%s row %lld: student max %g at %d, want %g at %lld", what, (long long)i, R->s_max,
          R->s_arg, s_max, (long long)s_arg);
    check(!uses_teacher || R->t_max == t_max, "%s row %lld: teacher max %g, want %g", what,
          (long long)i, R->t_max, t_max);
    check(R->label == y && R->z_label == zs[y], "%s row %lld: label %d (zs %g), want %lld (zs %g)",
          what, (long long)i, R->label, R->z_label, (long long)y, zs[y]);

    double s = 0, rest = 0, sT = 0, c = 0, cd = 0, cd_size = 0, t = 0, td = 0, td_size = 0;
    for (int64_t v = 0; v < V; v++) {
        if (zs[v] == -INFINITY)
            continue;
        const double d = (double)zs[v] - s_max, e = exp(d), ec = exp(d / Tc);
        s += e;
        rest += v == y ? 0.0 : e;
        sT += exp(d / T);
        c += ec;
        cd += ec * d / Tc;
        cd_size += fabs(ec * d / Tc);
        if (kl && zt[v] != -INFINITY) {
            const double et = exp(((double)zt[v] - t_max) / T);
            t += et;
            td += et * ((double)zt[v] - zs[v]) / T;
            td_size += fabs(et * ((double)zt[v] - zs[v]) / T);
        }
    }
    const double got[] = { R->s_sum, R->s_rest, R->sT_sum, R->c_sum, R->c_dot, R->t_sum, R->t_dot };
    const double want[] = { s, rest, sT, c, cd, t, td };
    const double size[] = { s, rest, sT, c, cd_size, t, td_size };
    const int used[] = { 1, 1, kl && T != 1.0, 1, 1, kl, kl };
    static const char *const names[] = { "s", "rest", "sT", "c", "cd", "t", "td" };
    for (int j = 0; j < 7; j++)
        check(!used[j] || (isfinite(got[j]) && fabs(got[j] - want[j]) <= stats_rel * size[j]),
              "%s row %lld: %s %.17g, want %.17g", what, (long long)i, names[j], got[j], want[j]);
    check(rest > 0.0 ? R->s_rest > 0.0 : 1, "%s row %lld: rest 0, want %.3g", what, (long long)i,
          rest);
}

/* The emulation of P, for every term set (a problem without a teacher: CE alone): its rows'
 * statistics against sums in double, and its results against ddk_loss_cpu, and against the
 * reference for one set (the second, KL and CAP at T, Tc != 1; the first without a teacher)
 * where n V^2 <= 3e7: the reference is O(n V H), seconds at V ~ 4000 (ddk_loss_cpu, which
 * test_loss.c holds to the reference, stands for it on the larger problems).
 * confident (p_y -> 1): results with CE alone, compared relative alone; the other sets'
 * statistics only (their results' KL, entropy and gradient are cancellations of float sums near
 * 0 or 1 there, in every implementation: SPEC.md protects 1 - p_y, which CE alone shows) */
static void check_problem(const char *what, const problem *P, int confident)
{
    for (int j = 0; j < TERM_SETS; j++) {
        if (!P->zt && term_sets[j].alpha > 0.0f)
            continue;
        char name[160];
        snprintf(name, sizeof name, "%s, %s", what, term_sets[j].name);
        ddk_loss_params p = params_of(P, &term_sets[j]);
        emu_run e = emulate(P, &p);
        for (int64_t i = 0; i < P->n; i++)
            if (!e.stats[i].ignored)
                check_stats(name, i, &e.stats[i], P, &p);
        if (!confident || j == 0) {
            cpu_run c = run_cpu(P, &p);
            char vs[200];
            snprintf(vs, sizeof vs, "%s vs ddk_loss_cpu", name);
            compare_emu_cpu(vs, &e, &c, P->n, P->V, confident);
            free_cpu(&c);
        }
        if (j == (P->zt && !confident ? 1 : 0) && (double)P->n * P->V * P->V <= 3e7) {
            ref_run r = run_ref(P, &p);
            char vs[200];
            snprintf(vs, sizeof vs, "%s vs the reference", name);
            compare_result(vs, &e.r, e.per, e.g, &r.r, r.per, r.g, P->n, P->V, confident);
            free_ref(&r);
        }
        free_emu(&e);
    }
}

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void test_random(void)
{
    static const struct {
        const char *name;
        int64_t n, V, vocab_tile;
        int labels;
    } shapes[] = {
        { "whole vocabulary 2048 (float4 path), given labels", 4, 2048, 0, 1 },
        { "whole vocabulary 2051 (scalar path), teacher labels", 4, 2051, 0, 0 },
        { "tiles of 1100 of 2251, teacher labels", 4, 2251, 1100, 0 },
        { "tiles of 1024 of 2560 (float4 path), given labels", 4, 2560, 1024, 1 },
        { "whole vocabulary 4099, teacher labels", 3, 4099, 0, 0 },
        { "tiles of 1500 of 4099, given labels", 3, 4099, 1500, 1 },
        { "tiles of 100 of 1001 (w < 256, a last tile of 1), given labels", 4, 1001, 100, 1 },
        { "tiles of 250 of 1001 (w < 256), teacher labels", 4, 1001, 250, 0 },
        { "whole vocabulary 37 (w < 256)", 3, 37, 0, 0 },
        { "whole vocabulary 700 (threads without a column), given labels", 3, 700, 0, 1 },
    };
    for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++) {
        problem P = random_problem(shapes[j].n, shapes[j].V, shapes[j].vocab_tile,
                                   shapes[j].labels, 3.0f, 100 + j);
        check_problem(shapes[j].name, &P, 0);
        free_problem(&P);
    }
}

/* Logits from a few values only, so maxima repeat within threads, across threads and across
 * tiles; the lowest column must win everywhere */
static void test_ties(void)
{
    const int64_t n = 6, V = 3000;
    for (int labels = 0; labels < 2; labels++)
        for (int tiled = 0; tiled < 2; tiled++) {
            problem P = new_problem(n, V, tiled ? 1000 : 0, 1, labels);
            uint64_t s = 7 + (uint64_t)labels;
            for (int64_t j = 0; j < n * V; j++) {
                P.zs[j] = (float)(ddk_rng_next(&s) % 5) * 0.5f;
                P.zt[j] = (float)(ddk_rng_next(&s) % 5) * 0.5f;
            }
            /* the top at columns in one group, in other threads, in later tiles */
            static const int64_t top[] = { 1029, 1030, 5, 2500, 1026, 2999 };
            for (int64_t i = 0; i < n; i++) {
                float *zs = P.zs + i * V, *zt = P.zt + i * V;
                for (size_t q = i % 2; q < sizeof top / sizeof top[0]; q++)
                    zs[top[q]] = zt[top[(q + i) % 6]] = 5.0f;
            }
            if (labels)
                for (int64_t i = 0; i < n; i++)   /* the first maximum (c_i = 1), or a later one */
                    P.labels[i] = (int32_t)(i < 3 ? first_argmax(P.zs + i * V, V) : top[3]);
            char name[96];
            snprintf(name, sizeof name, "ties, %s labels, %s", labels ? "given" : "teacher",
                     tiled ? "tiles of 1000" : "whole vocabulary");
            check_problem(name, &P, 0);
            free_problem(&P);
        }
}

/* Labels from the teacher whose argmax moves between tiles: up in a later tile, down, a tie
 * with an earlier tile (which keeps it), within one thread's later group; the student's mass
 * large at the old labels, so an old label left out of rest is seen */
static void test_label_moves(void)
{
    const int64_t n = 5, V = 4000;
    problem P = new_problem(n, V, 1000, 1, 0);
    uint64_t s = 11;
    for (int64_t j = 0; j < n * V; j++) {
        P.zs[j] = rng_sym(&s);
        P.zt[j] = rng_sym(&s);
    }
    static const struct {
        int64_t col[3];
        float zt[3];
    } moves[] = {
        { { 10, 2100, 3500 }, { 4.0f, 5.0f, 6.0f } },    /* up in every later tile */
        { { 3500, 10, 1500 }, { 6.0f, 5.0f, 4.0f } },    /* the last tile's stays */
        { { 700, 2700, 1700 }, { 5.0f, 5.0f, 3.0f } },   /* a tie: the earlier tile keeps it */
        { { 1003, 2023, 2021 }, { 4.0f, 4.5f, 4.5f } },  /* a tie within one group */
        { { 2, 1026, 3998 }, { 3.0f, 3.5f, 9.0f } },
    };
    for (int64_t i = 0; i < n; i++)
        for (int q = 0; q < 3; q++) {
            P.zt[i * V + moves[i].col[q]] = moves[i].zt[q];
            P.zs[i * V + moves[i].col[q]] = 6.0f + (float)q;   /* old labels hold mass */
        }
    check_problem("the teacher's argmax moving between tiles", &P, 0);
    free_problem(&P);
}

/* p_y -> 1: zs_y 40 above the rest, so rest / s ~ V e^-40 ~ 1e-14 */
static void test_confident(void)
{
    const int64_t n = 4, V = 2053;
    for (int labels = 0; labels < 2; labels++)
        for (int tiled = 0; tiled < 2; tiled++) {
            problem P = new_problem(n, V, tiled ? 700 : 0, 1, labels);
            uint64_t s = 21;
            for (int64_t i = 0; i < n; i++) {
                const int64_t y = (int64_t)(ddk_rng_next(&s) % (uint64_t)V);
                for (int64_t v = 0; v < V; v++) {
                    P.zs[i * V + v] = rng_sym(&s);
                    P.zt[i * V + v] = rng_sym(&s);
                }
                P.zs[i * V + y] = 41.0f;
                P.zt[i * V + y] = 30.0f;
                if (labels)
                    P.labels[i] = (int32_t)y;
            }
            char name[96];
            snprintf(name, sizeof name, "p_y -> 1, %s labels, %s", labels ? "given" : "teacher",
                     tiled ? "tiles of 700" : "whole vocabulary");
            check_problem(name, &P, 1);
            free_problem(&P);
        }
}

/* Rows rising (every group raises its thread's maxima: a rescale each time) and falling */
static void test_ramps(void)
{
    const int64_t n = 4, V = 4097;
    for (int tiled = 0; tiled < 2; tiled++) {
        problem P = new_problem(n, V, tiled ? 1500 : 0, 1, 0);
        uint64_t s = 31;
        for (int64_t i = 0; i < n; i++)
            for (int64_t v = 0; v < V; v++) {
                const float x = 12.0f * (float)v / (float)V;
                P.zs[i * V + v] = (i % 2 ? 12.0f - x : x) + 0.1f * rng_sym(&s);
                P.zt[i * V + v] = (i / 2 ? 12.0f - x : x) + 0.1f * rng_sym(&s);
            }
        check_problem(tiled ? "rising and falling rows, tiles of 1500"
                            : "rising and falling rows, whole vocabulary", &P, 0);
        free_problem(&P);
    }
}

/* ------------------------------------------------------------------------------------------
 * -inf columns
 */

/* P without its pad columns (labels renumbered) */
static problem without_pads(const problem *P)
{
    int64_t kept = 0;
    for (int64_t v = 0; v < P->V; v++)
        kept += !P->pad[v];
    problem Q = new_problem(P->n, kept, P->vocab_tile, P->zt != NULL, P->labels != NULL);
    for (int64_t i = 0; i < P->n; i++) {
        int64_t u = 0;
        for (int64_t v = 0; v < P->V; v++) {
            if (P->pad[v])
                continue;
            Q.zs[i * kept + u] = P->zs[i * P->V + v];
            if (P->zt)
                Q.zt[i * kept + u] = P->zt[i * P->V + v];
            if (P->labels && P->labels[i] == v)
                Q.labels[i] = (int32_t)u;
            u++;
        }
    }
    if (P->weights) {
        Q.weights = xcalloc((size_t)P->n, sizeof(float));
        memcpy(Q.weights, P->weights, (size_t)P->n * sizeof(float));
    }
    return Q;
}

/* V columns, pads: the first 512 (whole first tiles of 512 or 256), the columns of thread 17 (every
 * group 4 * 17 + 1024 j), every 13th, the last 40; -inf in zs and zt; labels never a pad */
static problem padded_problem(int64_t n, int64_t V, int64_t vocab_tile, int labels, uint64_t seed)
{
    problem P = random_problem(n, V, vocab_tile, 0, 3.0f, seed);
    free(P.weights);
    P.weights = NULL;
    for (int64_t v = 0; v < V; v++)
        P.pad[v] = v < 512 || (v / DDK_LOSS_GROUP) % DDK_LOSS_THREADS == 17 || v % 13 == 0 ||
                   v >= V - 40;
    for (int64_t i = 0; i < n; i++)
        for (int64_t v = 0; v < V; v++)
            if (P.pad[v])
                P.zs[i * V + v] = P.zt[i * V + v] = -INFINITY;
    if (labels) {
        P.labels = xcalloc((size_t)n, sizeof(int32_t));
        uint64_t s = seed + 1;
        for (int64_t i = 0; i < n; i++) {
            int64_t y = i % 2 ? first_argmax(P.zs + i * V, V)
                              : (int64_t)(ddk_rng_next(&s) % (uint64_t)V);
            while (P.pad[y])
                y = (y + 1) % V;
            P.labels[i] = (int32_t)y;
        }
    }
    return P;
}

/* every pad's gradient exactly 0, every other g that of the vocabulary without the pads */
static void check_padded_grad(const char *what, const float *g, const problem *P,
                              const float *g_kept, int64_t kept)
{
    int64_t bad = 0;
    double err = 0.0, size = 0.0;
    for (int64_t i = 0; i < P->n; i++) {
        int64_t u = 0;
        for (int64_t v = 0; v < P->V; v++) {
            const float x = g[i * P->V + v];
            if (P->pad[v]) {
                bad += x != 0.0f;
                continue;
            }
            const float want = g_kept[i * kept + u++];
            err = isfinite(x) ? fmax(err, fabs((double)x - want)) : INFINITY;
            size = fmax(size, fabs(want));
        }
    }
    check(bad == 0, "%s: %lld pad columns with a gradient", what, (long long)bad);
    check(err <= grad_rel * size, "%s: gradient error %.3g of %.3g vs without the pads", what, err,
          size);
}

static void test_inf_columns(void)
{
    static const struct {
        const char *name;
        int64_t V, vocab_tile;
        int labels;
    } shapes[] = {
        { "whole vocabulary, given labels", 2600, 0, 1 },
        { "whole vocabulary, teacher labels", 2600, 0, 0 },
        { "tiles of 512 (the first all -inf), given labels", 2600, 512, 1 },
        { "tiles of 512 (the first all -inf), teacher labels", 2600, 512, 0 },
        { "tiles of 256 (the first two all -inf), teacher labels", 2600, 256, 0 },
        { "tiles of 600, teacher labels", 2603, 600, 0 },
    };
    for (size_t j = 0; j < sizeof shapes / sizeof shapes[0]; j++)
        for (int ts = 0; ts < TERM_SETS; ts++) {
            problem P = padded_problem(4, shapes[j].V, shapes[j].vocab_tile, shapes[j].labels,
                                       40 + j);
            problem Q = without_pads(&P);
            char name[200];
            snprintf(name, sizeof name, "-inf columns, %s, %s", shapes[j].name, term_sets[ts].name);
            ddk_loss_params p = params_of(&P, &term_sets[ts]), q = params_of(&Q, &term_sets[ts]);
            cpu_run c = run_cpu(&P, &p), cq = run_cpu(&Q, &q);
            emu_run e = emulate(&P, &p);
            char what[260];

            /* ddk_loss_cpu with the pads against itself without them */
            snprintf(what, sizeof what, "%s: ddk_loss_cpu", name);
            check(c.finite, "%s: a NaN or Inf", what);
            check(c.pad_g == 0.0, "%s: the pads' gradient times -FLT_MAX is %g", what, c.pad_g);
            const double got[4] = { c.r.loss, c.r.ce, c.r.kl, c.r.cap };
            const double want[4] = { cq.r.loss, cq.r.ce, cq.r.kl, cq.r.cap };
            for (int f = 0; f < 4; f++)
                check(close_to(got[f], want[f], scalar_rel, scalar_abs),
                      "%s: result field %d %.17g, want %.17g", what, f, got[f], want[f]);
            check(c.r.correct == cq.r.correct, "%s: correct %lld, want %lld", what,
                  (long long)c.r.correct, (long long)cq.r.correct);
            for (int64_t i = 0; i < P.n; i++)
                check(close_to(c.per[i], cq.per[i], scalar_rel, scalar_abs),
                      "%s: l_%lld %.9g, want %.9g", what, (long long)i, c.per[i], cq.per[i]);
            /* the pads' d hs columns are 0 by construction: their gradient is in pad_g */
            check_padded_grad(what, c.g, &P, cq.g, Q.V);

            /* the emulated CUDA loss with the pads against ddk_loss_cpu without them */
            snprintf(what, sizeof what, "%s: emulated CUDA", name);
            int finite = 1;
            for (int64_t jj = 0; jj < P.n * P.V; jj++)
                finite &= isfinite(e.g[jj]);
            check(finite && isfinite(e.r.loss), "%s: a NaN or Inf", what);
            const double egot[4] = { e.r.loss, e.r.ce, e.r.kl, e.r.cap };
            for (int f = 0; f < 4; f++)
                check(close_to(egot[f], want[f], scalar_rel, scalar_abs),
                      "%s: result field %d %.17g, want %.17g", what, f, egot[f], want[f]);
            check(e.r.correct == cq.r.correct, "%s: correct %lld, want %lld", what,
                  (long long)e.r.correct, (long long)cq.r.correct);
            for (int64_t i = 0; i < P.n; i++) {
                check(close_to(e.per[i], cq.per[i], scalar_rel, scalar_abs),
                      "%s: l_%lld %.9g, want %.9g", what, (long long)i, e.per[i], cq.per[i]);
                check_stats(what, i, &e.stats[i], &P, &p);
            }
            check_padded_grad(what, e.g, &P, cq.g, Q.V);
            free_cpu(&c), free_cpu(&cq), free_emu(&e);
            free_problem(&P), free_problem(&Q);
        }
}

int main(void)
{
    static const test_case cases[] = {
        { "emulated CUDA loss: random rows, tiles and widths", test_random },
        { "emulated CUDA loss: ties go to the lowest column", test_ties },
        { "emulated CUDA loss: the teacher's argmax moving between tiles", test_label_moves },
        { "emulated CUDA loss: p_y -> 1 (rest tiny, not 0, accurate)", test_confident },
        { "emulated CUDA loss: rising and falling rows", test_ramps },
        { "-inf columns: ddk_loss_cpu and the emulated CUDA loss", test_inf_columns },
    };
    run_cases(cases, sizeof(cases) / sizeof(cases[0]));
    return cases_summary();
}
