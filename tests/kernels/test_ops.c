/* test_ops.c: the CPU backend's elementwise ops (ddk.h, struct ddk_backend), one case per op x
 * shape, in the manner of ggml's test-backend-ops.
 *
 * Each case checks the forward against a float64 reference written here (normalised error
 * max|got - want| / max|want|), every backward against its float64 analytic gradient AND central
 * finite differences of the float64 forward, and the "backward ops ADD" convention (a second
 * call doubles, a pre-filled gradient keeps its content). NaN/Inf in any result is a failure;
 * forward outputs start as NaN, so an element an op forgets to write fails too; every buffer has
 * guard bytes on both sides that must survive the case (no out-of-bounds writes).
 * Ops: rmsnorm (+ backward), rope (inverse = backward: round trip, pair norms, adjoint, finite
 * differences), swiglu (+ backward; swiglu_16 on bf16 gate and up, its bits on the widened values), embedding, matmul (4 transposes, padded ld, alpha, beta, k = 0),
 * zero, copy; the whole-buffer ops sumsq (float64 lanes, overflow), axpby (beta = 0 over NaN,
 * in place), adamw (float64 formula of ddk.h; its bf16 copy w16 the new w rounded to nearest
 * even); matmul_bf16 (against a float64 product of the
 * operands rounded with ddk_round_bf16: 4 transposes, k at the 256-column panel edges, k = 0,
 * and a case where the rounding shows); and the loss's bf16_products (same loss as fp32 on
 * bf16-representable operands, bounded change on others, bf16_products = 2 refused); the
 * Qwen3.5 target's forward-only ops conv1d_silu (zero history or a given one), gated_rmsnorm,
 * rope_partial (dims past rd untouched, rd = d is rope bit for bit) and gated_delta (recurrence
 * and chunks of 1, 3, 64, > T against a float64 recurrence and each other, the state out
 * included, prefill then decode = one call); the frozen target's matmul_w16 and matmul_w16_nn
 * (W transposed or not: bit for bit matmul_bf16 on W widened, and the float64 product of the
 * rounded operands, across panel edges, k = 0), embedding_w16 (exact widening), copy_rows
 * (exact, padding untouched), and its element-wise l2norm_heads, sigmoid_mul, delta_gates
 * (float64 formulas, and bit for bit the engine's loops of daemon/engine/model/target_qwen35.c, copied
 * here; in place where allowed); causal attention over a
 * cache (q_rows 1, 5, S of S keys against the prefill's last rows and a float64
 * reference, q_rows outside [0, S] refused); the bf16 step's matmul_16 (both operands bf16 as
 * stored: bit for bit matmul_bf16 on the widened operands and the float64 product, 4 transposes,
 * k across the 256-column panel, padded ld with NaN padding, beta 0 over NaN, k = 0, an empty c
 * written nowhere) and round_bf16 (named edges: ties of either lsb, +-0, subnormals, +-inf,
 * FLT_MAX and the overflow tie to inf, NaNs whose truncation is inf; then every high half with
 * 16 low halves: ddk_f32_to_bf16's bits and a float64 nearest-even, NaN stays NaN); the DFlash2
 * drafter's block_conv (+ backward: float64 formula and finite differences, ddelta's columns
 * outside the op's left as they were, dx NULL the same dbase and ddelta bits, ADD). Not here:
 * the rest of the loss (tests/kernels/test_loss.c) and the rest of attention (tests/kernels/test_attention.c).
 * Only the CPU backend for now: another backend is to be compared with the same references,
 * case by case.
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 * DDTREE_OPS_VERBOSE=1 also prints every comparison's error next to its tolerance.
 *
 * Legend: rows independent vectors (tokens, or tokens*heads), d values per vector (head dim for
 * rope), heads per row (rope), count elements (swiglu), V vocabulary, H hidden size, and
 * (m, n, k) for c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c.
 */
#include "ddk.h"
#include "check.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"

#include <errno.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Tolerances (normalised error unless said otherwise), each with its reason
 */

/* rmsnorm forward: mean(x^2) in double, then rstd, x*rstd and *g: 3 float roundings */
static const double tol_rmsnorm = 1e-6;
/* rmsnorm backward: dx is s g dy - x k, two terms that partly cancel (fully at d = 1, hence the
 * larger eps there), and dg sums `rows` float terms (64 here), judged against sum |terms| */
static const double tol_rmsnorm_backward = 2e-6;
/* rope: cos and sin rounded to float, then two products and a sum per element */
static const double tol_rope = 1e-6;
/* swiglu: expf (1 ulp), a division and two or three products per element */
static const double tol_swiglu = 1e-6;
/* matmul: fp32 accumulation of k <= 130 products (BLAS order, FMA): ~sqrt(k) eps typically */
static const double tol_matmul = 1e-5;
/* matmul_bf16 against the float64 product of the same rounded operands: a product of two bf16
 * (8-bit significands) is exact in fp32, so only the fp32 accumulation of k <= 700 terms errs:
 * ~sqrt(k) 2^-24 = 1.6e-6 of the terms' size at k = 700 (random signs; measured <= 1.7e-7 of
 * max |c|). An operand left unrounded errs by ~2^-9 / sqrt(3) of a term each, ~1e-3 of c. */
static const double tol_matmul_bf16 = 2e-6;
/* sumsq: each x^2 is exact in float64 (a 48-bit product), so only the float64 summation of
 * `count` positive terms rounds: <= count 2^-53 relative (1001 terms: 1.1e-13) */
static const double tol_sumsq = 1e-12;
/* axpby, per element against |alpha x| + |beta y|: at most two float roundings (product, sum;
 * one with FMA), each <= 2^-24 of that sum: 2^-23 = 1.19e-7, plus the reference's 1e-16 */
static const double tol_axpby = 1.2e-7;
/* adamw m, v: two products and a sum (g^2 one product more) in float, each <= 2^-24 of terms
 * of the result's size (v's terms are positive; m's cancel at most to max |m|): 3e-7; 1e-6 */
static const double tol_adamw_moments = 1e-6;
/* adamw, the update w_new - w (normalised by its max, >= lr / 4 here): w_new's own rounding
 * (2^-24 |w| <= 6e-8 with |w| <= 1) over 0.0125 is 5e-6, the direction's ~5 roundings 3e-7 */
static const double tol_adamw_update = 1e-5;
/* a second backward call, or a pre-filled gradient: one float addition more per element (and
 * another summation order of dg's rows); an overwrite instead of an add errs by >= 0.5 */
static const double tol_adds = 1e-5;
/* the float64 analytic gradient vs central differences of the float64 forward: truncation
 * h^2 f'''/6 and rounding 1e-16/h with h = fd_step on O(1) inputs */
static const double tol_fd_reference = 1e-6;
static const double fd_step = 1e-5;

/* ------------------------------------------------------------------------------------------
 * Guarded buffers: every buffer of a case has GUARD bytes of guard_byte on both sides, checked
 * and freed by release_buffers() at the end of the case
 */

enum { GUARD = 64, MAX_BUFFERS = 64 };
static const unsigned char guard_byte = 0xcd;

static struct buffer {
    unsigned char *base;   /* GUARD, bytes, GUARD */
    size_t bytes;
    const char *name;
} buffers[MAX_BUFFERS];
static int buffer_count;

static void *buffer(size_t bytes, const char *name)
{
    if (buffer_count == MAX_BUFFERS) {
        fprintf(stderr, "test_ops: more than %d buffers in one case\n", MAX_BUFFERS);
        abort();
    }
    unsigned char *base = malloc(bytes + 2 * GUARD);
    if (!base) {
        perror("test_ops: malloc");
        abort();
    }
    memset(base, guard_byte, GUARD);
    memset(base + GUARD + bytes, guard_byte, GUARD);
    buffers[buffer_count++] = (struct buffer){ base, bytes, name };
    return base + GUARD;
}

static float *floats(int64_t n, const char *name)
{
    return buffer((size_t)n * sizeof(float), name);
}

static double *doubles(int64_t n, const char *name)
{
    return buffer((size_t)n * sizeof(double), name);
}

static int32_t *int32s(int64_t n, const char *name)
{
    return buffer((size_t)n * sizeof(int32_t), name);
}

static void release_buffers(void)
{
    for (int j = 0; j < buffer_count; j++) {
        const struct buffer *b = &buffers[j];
        int64_t before = 0, after = 0;
        for (size_t i = 0; i < GUARD; i++) {
            before += b->base[i] != guard_byte;
            after += b->base[GUARD + b->bytes + i] != guard_byte;
        }
        check(before == 0 && after == 0,
              "%s: guard bytes overwritten (%lld before, %lld after its %zu bytes)", b->name,
              (long long)before, (long long)after, b->bytes);
        free(b->base);
    }
    buffer_count = 0;
}

/* ------------------------------------------------------------------------------------------
 * Data and comparisons
 */

static uint64_t rng_state;   /* ddk_rng.h's generator */

static double rng_uniform(double lo, double hi)
{
    return lo + (hi - lo) * ddk_rng_uniform(&rng_state);
}

static void fill_uniform(float *x, int64_t n, double lo, double hi)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)rng_uniform(lo, hi);
}

static void fill_nan(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = NAN;
}

static void fill_zero(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = 0.0f;
}

static double *to_doubles(const float *x, int64_t n, const char *name)
{
    double *y = doubles(n, name);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i];
    return y;
}

static int verbose;

/* max|got - want| / max|want| (max|got - want| when want is all 0), or / scale when scale > 0,
 * against tol; got is float (gf) or double (gd). A value that is not finite fails whatever the
 * tolerance. */
static void expect_close(const char *what, const float *gf, const double *gd, const double *want,
                         int64_t n, double scale, double tol)
{
    double num = 0.0, den = 0.0;
    int64_t worst = 0, nonfinite = 0, first_nonfinite = 0;
    for (int64_t i = 0; i < n; i++) {
        double got = gf ? (double)gf[i] : gd[i];
        if (!isfinite(got) || !isfinite(want[i])) {
            if (nonfinite++ == 0)
                first_nonfinite = i;
            continue;
        }
        double diff = fabs(got - want[i]);
        if (diff > num) {
            num = diff;
            worst = i;
        }
        den = fmax(den, fabs(want[i]));
    }
    if (scale > 0.0)
        den = scale;
    double err = den > 0.0 ? num / den : num;
    if (verbose)
        printf("  . %-44s err %.2e  tol %.0e\n", what, err, tol);
    check(nonfinite == 0, "%s: %lld of %lld values not finite, first [%lld]: got %g, want %g",
          what, (long long)nonfinite, (long long)n, (long long)first_nonfinite,
          gf ? (double)gf[first_nonfinite] : gd[first_nonfinite], want[first_nonfinite]);
    check(err <= tol, "%s: normalised error %.3g > %.3g (worst [%lld]: got %.9g, want %.9g)", what,
          err, tol, (long long)worst, gf ? (double)gf[worst] : gd[worst], want[worst]);
}

static void expect_close_f(const char *what, const float *got, const double *want, int64_t n,
                           double tol)
{
    expect_close(what, got, NULL, want, n, 0.0, tol);
}

static void expect_close_d(const char *what, const double *got, const double *want, int64_t n,
                           double tol)
{
    expect_close(what, NULL, got, want, n, 0.0, tol);
}

/* got == base + contribution, to tol_adds: what "backward ops ADD" promises */
static void expect_added(const char *what, const float *got, const float *base,
                         const float *contribution, int64_t n)
{
    double *want = doubles(n, "expected sum");
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)base[i] + contribution[i];
    expect_close_f(what, got, want, n, tol_adds);
}

/* ------------------------------------------------------------------------------------------
 * The cases' table
 */

typedef struct op_case op_case;
struct op_case {
    char name[96];
    void (*run)(const ddk_backend *be, const op_case *c);
    int64_t rows, d, heads;    /* rmsnorm (rows, d); rope (rows, heads, d); swiglu count = rows * d;
                                * embedding (rows, H = d) */
    int64_t m, n, k;           /* matmul */
    int trans_a, trans_b;      /* matmul */
    float eps, theta, beta;    /* rmsnorm; rope; matmul (alpha is 0.75) */
    int extremes;              /* rmsnorm, swiglu: inputs at the edges of float, not O(1);
                                * sumsq: values of 1e20 (x^2 overflows float);
                                * matmul_bf16: operands with low mantissa bits set */
    float grad_scale, decay;   /* adamw: the clipping factor, weight decay (lr_wd = lr decay) */
    int64_t vocab_tile;        /* loss */
    int64_t block, taps, gs;   /* block_conv: B, taps, channels a group (rows, H = d) */
    int64_t ld_pad;            /* block_conv: delta's row stride past both sides' 2 taps G */
    int side;                  /* block_conv: delta starts at side * taps * G of its row */
    int no_dx;                 /* block_conv: dx NULL */
};

/* ------------------------------------------------------------------------------------------
 * RMSNorm: y = x s g, s = (mean(x^2) + eps)^(-1/2)
 */

static void ref_rmsnorm(const float *x, const float *g, int64_t rows, int64_t d, float eps,
                        double *y, double *rstd)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;   /* (d) */
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)xr[i] * xr[i];
        double s = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++)
            y[r * d + i] = xr[i] * s * g[i];
        rstd[r] = s;
    }
}

/* dx = s g dy - x s^3 / d sum(x g dy), dg = sum over rows of dy x s; ADDED into dx, dg */
static void ref_rmsnorm_backward(const float *x, const float *g, const float *dy, int64_t rows,
                                 int64_t d, float eps, double *dx, double *dg)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;   /* (d) */
        double ss = 0.0, dot = 0.0;
        for (int64_t i = 0; i < d; i++) {
            ss += (double)xr[i] * xr[i];
            dot += (double)xr[i] * g[i] * dyr[i];
        }
        double s = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++) {
            dx[r * d + i] += s * g[i] * dyr[i] - xr[i] * s * s * s / (double)d * dot;
            dg[i] += (double)dyr[i] * xr[i] * s;
        }
    }
}

/* L = sum dy rmsnorm(x; g) over one row, in float64 */
static double rmsnorm_row_loss(const double *x, const double *g, const double *dy, int64_t d,
                               double eps)
{
    double ss = 0.0, l = 0.0;
    for (int64_t i = 0; i < d; i++)
        ss += x[i] * x[i];
    double s = 1.0 / sqrt(ss / (double)d + eps);
    for (int64_t i = 0; i < d; i++)
        l += dy[i] * x[i] * s * g[i];
    return l;
}

/* dL/dx, dL/dg of L = sum dy rmsnorm(x; g) by central differences of the float64 forward */
static void fd_rmsnorm(const float *x, const float *g, const float *dy, int64_t rows, int64_t d,
                       float eps, double *dx, double *dg)
{
    double *xd = to_doubles(x, rows * d, "fd x"), *gd = to_doubles(g, d, "fd g");
    double *dyd = to_doubles(dy, rows * d, "fd dy");
    const double h = fd_step;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < d; i++) {
            double *xr = xd + r * d, keep = xr[i];
            xr[i] = keep + h;
            double lp = rmsnorm_row_loss(xr, gd, dyd + r * d, d, eps);
            xr[i] = keep - h;
            double lm = rmsnorm_row_loss(xr, gd, dyd + r * d, d, eps);
            xr[i] = keep;
            dx[r * d + i] = (lp - lm) / (2.0 * h);
        }
    for (int64_t i = 0; i < d; i++) {
        double keep = gd[i], lp = 0.0, lm = 0.0;
        for (int64_t r = 0; r < rows; r++) {
            gd[i] = keep + h;
            lp += rmsnorm_row_loss(xd + r * d, gd, dyd + r * d, d, eps);
            gd[i] = keep - h;
            lm += rmsnorm_row_loss(xd + r * d, gd, dyd + r * d, d, eps);
        }
        gd[i] = keep;
        dg[i] = (lp - lm) / (2.0 * h);
    }
}

/* max over i of sum over rows |dy x s|: the size of the terms dg is summed from. Float's error
 * scales with it, not with dg, when the terms cancel (at d = 1 dg is one sum of signed terms). */
static double rmsnorm_dg_scale(const float *x, const float *dy, const double *rstd, int64_t rows,
                               int64_t d)
{
    double scale = 0.0;
    for (int64_t i = 0; i < d; i++) {
        double terms = 0.0;
        for (int64_t r = 0; r < rows; r++)
            terms += fabs((double)dy[r * d + i] * x[r * d + i] * rstd[r]);
        scale = fmax(scale, terms);
    }
    return scale;
}

/* The kernel's forward (y, rstd; NaN before) and backward (into zeroed dx, dg) of one set of
 * inputs, and the float64 references of each */
typedef struct {
    float *y, *rstd, *dx, *dg;               /* (rows, d), (rows), (rows, d), (d) */
    double *y_want, *rstd_want, *dx_want, *dg_want;
} rmsnorm_run;

static rmsnorm_run run_rmsnorm(const ddk_backend *be, const float *x, const float *g,
                               const float *dy, int64_t rows, int64_t d, float eps)
{
    const int64_t n = rows * d;
    rmsnorm_run o;
    o.y = floats(n, "y"), o.rstd = floats(rows, "rstd");
    fill_nan(o.y, n), fill_nan(o.rstd, rows);
    be->rmsnorm(be, x, g, rows, d, eps, o.y, o.rstd);
    o.y_want = doubles(n, "y want"), o.rstd_want = doubles(rows, "rstd want");
    ref_rmsnorm(x, g, rows, d, eps, o.y_want, o.rstd_want);
    o.dx = floats(n, "dx"), o.dg = floats(d, "dg");
    fill_zero(o.dx, n), fill_zero(o.dg, d);
    be->rmsnorm_backward(be, x, g, o.rstd, dy, rows, d, o.dx, o.dg);
    o.dx_want = doubles(n, "dx want"), o.dg_want = doubles(d, "dg want");
    memset(o.dx_want, 0, (size_t)n * sizeof(double));
    memset(o.dg_want, 0, (size_t)d * sizeof(double));
    ref_rmsnorm_backward(x, g, dy, rows, d, eps, o.dx_want, o.dg_want);
    return o;
}

static void case_rmsnorm(const ddk_backend *be, const op_case *c)
{
    const int64_t rows = c->rows, d = c->d, n = rows * d;
    const float eps = c->eps;
    float *x = floats(n, "x"), *g = floats(d, "g"), *dy = floats(n, "dy");   /* (rows, d), (d) */
    fill_uniform(x, n, -2.0, 2.0);
    fill_uniform(g, d, -1.5, 1.5);
    fill_uniform(dy, n, -1.0, 1.0);

    /* forward, with and without rstd */
    const rmsnorm_run o = run_rmsnorm(be, x, g, dy, rows, d, eps);
    float *y_bare = floats(n, "y (no rstd)");
    fill_nan(y_bare, n);
    be->rmsnorm(be, x, g, rows, d, eps, y_bare, NULL);
    expect_close_f("y", o.y, o.y_want, n, tol_rmsnorm);
    expect_close_f("rstd", o.rstd, o.rstd_want, rows, tol_rmsnorm);
    check(memcmp(o.y, y_bare, (size_t)n * sizeof(float)) == 0, "y differs when rstd is NULL");

    /* backward into zeroed gradients: analytic and finite differences */
    double *dx_fd = doubles(n, "dx fd"), *dg_fd = doubles(d, "dg fd");
    fd_rmsnorm(x, g, dy, rows, d, eps, dx_fd, dg_fd);
    expect_close_d("float64 dx: analytic vs finite differences", o.dx_want, dx_fd, n,
                   tol_fd_reference);
    const double dg_scale = rmsnorm_dg_scale(x, dy, o.rstd_want, rows, d);
    expect_close("float64 dg: analytic vs finite differences", NULL, o.dg_want, dg_fd, d,
                 dg_scale, tol_fd_reference);
    expect_close_f("dx vs analytic", o.dx, o.dx_want, n, tol_rmsnorm_backward);
    expect_close("dg vs analytic", o.dg, NULL, o.dg_want, d, dg_scale, tol_rmsnorm_backward);
    expect_close_f("dx vs finite differences", o.dx, dx_fd, n, tol_rmsnorm_backward);
    expect_close("dg vs finite differences", o.dg, NULL, dg_fd, d, dg_scale, tol_rmsnorm_backward);

    /* ADD: a second call doubles; pre-filled gradients keep their content */
    float *dx2 = floats(n, "dx twice"), *dg2 = floats(d, "dg twice");
    memcpy(dx2, o.dx, (size_t)n * sizeof(float)), memcpy(dg2, o.dg, (size_t)d * sizeof(float));
    be->rmsnorm_backward(be, x, g, o.rstd, dy, rows, d, dx2, dg2);
    expect_added("dx after two calls = 2 dx", dx2, o.dx, o.dx, n);
    expect_added("dg after two calls = 2 dg", dg2, o.dg, o.dg, d);
    float *dx_pre = floats(n, "dx pre-filled"), *dg_pre = floats(d, "dg pre-filled");
    float *dx_old = floats(n, "dx old"), *dg_old = floats(d, "dg old");
    fill_uniform(dx_old, n, -1.0, 1.0), fill_uniform(dg_old, d, -1.0, 1.0);
    memcpy(dx_pre, dx_old, (size_t)n * sizeof(float)), memcpy(dg_pre, dg_old, (size_t)d * sizeof(float));
    be->rmsnorm_backward(be, x, g, o.rstd, dy, rows, d, dx_pre, dg_pre);
    expect_added("pre-filled dx = old + dx", dx_pre, dx_old, o.dx, n);
    expect_added("pre-filled dg = old + dg", dg_pre, dg_old, o.dg, d);
}

/* Rows of zeros (s = eps^-1/2), of 1e20 (x^2 overflows float: the mean must be taken wider), of
 * 1e-20 (eps dominates) and O(1) with one 1e4 spike (a "massive activation"). Forward and
 * backward are compared row by row, since their magnitudes differ by 40 orders. The backward
 * of the 1e20 row is left out: the kernel's k = dot s^3 / d is a float below FLT_MIN there (a
 * denormal, ~2e-6 off at 1e20 and worse above), which no real activation reaches. */
static void case_rmsnorm_extremes(const ddk_backend *be, const op_case *c)
{
    enum { rows = 5 };
    static const double scale[rows] = { 0.0, 1e20, 1e-20, 1.0, 1e15 };
    const int64_t d = c->d, n = rows * d;
    const float eps = c->eps;
    float *x = floats(n, "x"), *g = floats(d, "g"), *dy = floats(n, "dy");
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < d; i++)
            x[r * d + i] = (float)(scale[r] * rng_uniform(-2.0, 2.0));
    x[3 * d + d / 2] = 1e4f;
    fill_uniform(g, d, -1.5, 1.5);
    fill_uniform(dy, n, -1.0, 1.0);
    const rmsnorm_run o = run_rmsnorm(be, x, g, dy, rows, d, eps);
    char what[64];
    for (int64_t r = 0; r < rows; r++) {
        snprintf(what, sizeof(what), "y, row of scale %g", scale[r]);
        expect_close_f(what, o.y + r * d, o.y_want + r * d, d, tol_rmsnorm);
        snprintf(what, sizeof(what), "rstd, row of scale %g", scale[r]);
        expect_close_f(what, o.rstd + r, o.rstd_want + r, 1, tol_rmsnorm);
        snprintf(what, sizeof(what), "dx, row of scale %g", scale[r]);
        if (scale[r] < 1e18)
            expect_close_f(what, o.dx + r * d, o.dx_want + r * d, d, tol_rmsnorm_backward);
    }
    expect_close("dg", o.dg, NULL, o.dg_want, d, rmsnorm_dg_scale(x, dy, o.rstd_want, rows, d),
                 tol_rmsnorm_backward);
}

/* ------------------------------------------------------------------------------------------
 * RoPE, rotate-half: pair (x_i, x_{i+d/2}), i < d/2, turned by pos theta^(-2i/d)
 */

static double rope_angle(int32_t pos, int64_t i, int64_t d, float theta)
{
    return (double)pos * pow((double)theta, -2.0 * (double)i / (double)d);
}

static void ref_rope(const float *x, const int32_t *pos, int64_t rows, int64_t heads, int64_t d,
                     float theta, double *y)
{
    const int64_t half = d / 2;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < half; i++) {
            double angle = rope_angle(pos[r], i, d, theta), cs = cos(angle), sn = sin(angle);
            for (int64_t h = 0; h < heads; h++) {
                int64_t o = (r * heads + h) * d;
                double a = x[o + i], b = x[o + i + half];
                y[o + i] = a * cs - b * sn;
                y[o + i + half] = b * cs + a * sn;
            }
        }
}

/* dL/dx of L = <rope(x), w> by central differences of the float64 forward: each element
 * moves only its own pair's two outputs */
static void fd_rope(const float *x, const float *w, const int32_t *pos, int64_t rows,
                    int64_t heads, int64_t d, float theta, double *dx)
{
    const int64_t half = d / 2;
    const double h = fd_step;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < half; i++) {
            double angle = rope_angle(pos[r], i, d, theta), cs = cos(angle), sn = sin(angle);
            for (int64_t hd = 0; hd < heads; hd++) {
                int64_t o = (r * heads + hd) * d;
                double a = x[o + i], b = x[o + i + half], wa = w[o + i], wb = w[o + i + half];
#define PAIR_LOSS(A, B) (((A) * cs - (B) * sn) * wa + ((B) * cs + (A) * sn) * wb)
                dx[o + i] = (PAIR_LOSS(a + h, b) - PAIR_LOSS(a - h, b)) / (2.0 * h);
                dx[o + i + half] = (PAIR_LOSS(a, b + h) - PAIR_LOSS(a, b - h)) / (2.0 * h);
#undef PAIR_LOSS
            }
        }
}

/* Row 0 at position 0 and the last row at 100000 (one row: 0 with one head, 100000 with more),
 * row 1 at 1, row rows-2 at 2^20 - 1 when rows >= 17, the others uniform in [0, 2^17). */
static void rope_positions(int32_t *pos, int64_t rows, int64_t heads)
{
    for (int64_t r = 0; r < rows; r++)
        pos[r] = (int32_t)(ddk_rng_next(&rng_state) % (1u << 17));
    pos[0] = rows == 1 && heads > 1 ? 100000 : 0;
    if (rows > 1)
        pos[rows - 1] = 100000;
    if (rows > 2)
        pos[1] = 1;
    if (rows >= 17)
        pos[rows - 2] = (1 << 20) - 1;
}

static void case_rope(const ddk_backend *be, const op_case *c)
{
    const int64_t rows = c->rows, heads = c->heads, d = c->d, half = d / 2;
    const int64_t n = rows * heads * d, row = heads * d;
    const float theta = c->theta;
    int32_t *pos = int32s(rows, "pos");
    rope_positions(pos, rows, heads);
    float *x = floats(n, "x"), *w = floats(n, "w");   /* (rows, heads, d) */
    fill_uniform(x, n, -1.0, 1.0);
    fill_uniform(w, n, -1.0, 1.0);

    /* forward */
    float *y = floats(n, "rope(x)");
    memcpy(y, x, (size_t)n * sizeof(float));
    be->rope(be, y, pos, rows, heads, d, theta, 0);
    double *y_want = doubles(n, "rope(x) want");
    ref_rope(x, pos, rows, heads, d, theta, y_want);
    expect_close_f("rope(x)", y, y_want, n, tol_rope);

    /* position 0 is the identity, bit for bit (cos 0 = 1, sin 0 = 0) */
    for (int64_t r = 0; r < rows; r++)
        if (pos[r] == 0)
            check(memcmp(y + r * row, x + r * row, (size_t)row * sizeof(float)) == 0,
                  "row %lld at position 0 changed", (long long)r);

    /* a rotation keeps each pair's norm */
    double worst_norm = 0.0;
    for (int64_t p = 0; p < n / d; p++)
        for (int64_t i = 0; i < half; i++) {
            const float *xp = x + p * d, *yp = y + p * d;
            double before = hypot(xp[i], xp[i + half]), after = hypot(yp[i], yp[i + half]);
            worst_norm = fmax(worst_norm, fabs(after - before) / fmax(before, 1e-30));
        }
    check(worst_norm <= tol_rope, "a pair's norm changed by %.3g relative (tol %.0e)", worst_norm,
          tol_rope);

    /* inverse(rope(x)) = x */
    float *round_trip = floats(n, "rope^-1(rope(x))");
    memcpy(round_trip, y, (size_t)n * sizeof(float));
    be->rope(be, round_trip, pos, rows, heads, d, theta, 1);
    expect_close_f("rope^-1(rope(x)) = x", round_trip, to_doubles(x, n, "x as double"), n,
                   tol_rope);

    /* the backward is the transpose: <rope(x), w> = <x, rope^-1(w)>, relative to |x| |w| */
    float *w_back = floats(n, "rope^-1(w)");
    memcpy(w_back, w, (size_t)n * sizeof(float));
    be->rope(be, w_back, pos, rows, heads, d, theta, 1);
    double lhs = 0.0, rhs = 0.0, xx = 0.0, ww = 0.0;
    for (int64_t i = 0; i < n; i++) {
        lhs += (double)y[i] * w[i];
        rhs += (double)x[i] * w_back[i];
        xx += (double)x[i] * x[i];
        ww += (double)w[i] * w[i];
    }
    double adjoint = fabs(lhs - rhs) / sqrt(xx * ww);
    if (verbose)
        printf("  . %-44s err %.2e  tol %.0e\n", "<rope(x), w> = <x, rope^-1(w)>", adjoint,
               tol_rope);
    check(adjoint <= tol_rope, "<rope(x), w> = %.9g but <x, rope^-1(w)> = %.9g", lhs, rhs);

    /* ... and the gradient of <rope(x), w>, by finite differences of the float64 forward */
    double *dx_fd = doubles(n, "dx fd");
    fd_rope(x, w, pos, rows, heads, d, theta, dx_fd);
    expect_close_f("rope^-1(w) vs finite differences", w_back, dx_fd, n, tol_rope);
}

/* ------------------------------------------------------------------------------------------
 * SwiGLU: h = silu(gate) up, silu(x) = x sigmoid(x)
 */

static double sigmoid64(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

static double silu64(double x)
{
    return x * sigmoid64(x);
}

/* silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))) */
static double silu64_grad(double x)
{
    double s = sigmoid64(x);
    return s * (1.0 + x * (1.0 - s));
}

static void case_swiglu(const ddk_backend *be, const op_case *c)
{
    /* gates past expf's range (|x| > 88) and around silu's minimum (-1.278) */
    static const float edges[] = { -1000.0f, -100.0f, -88.8f, -20.0f, -1.278465f, -0.0f, 0.0f,
                                   1e-30f,   20.0f,   88.8f,  100.0f, 1000.0f };
    const int64_t n = c->rows * c->d;
    float *gate = floats(n, "gate"), *up = floats(n, "up"), *dh = floats(n, "dh");   /* (count) */
    fill_uniform(gate, n, -8.0, 8.0);
    if (c->extremes)
        for (int64_t i = 0; i < n; i++)
            gate[i] = edges[i % (int64_t)(sizeof(edges) / sizeof(edges[0]))];
    fill_uniform(up, n, -2.0, 2.0);
    fill_uniform(dh, n, -1.0, 1.0);

    float *h = floats(n, "h");
    fill_nan(h, n);
    be->swiglu(be, gate, up, n, h);
    double *h_want = doubles(n, "h want");
    for (int64_t i = 0; i < n; i++)
        h_want[i] = silu64(gate[i]) * up[i];
    expect_close_f("h", h, h_want, n, tol_swiglu);

    float *dgate = floats(n, "dgate"), *dup = floats(n, "dup");
    fill_zero(dgate, n), fill_zero(dup, n);
    be->swiglu_backward(be, gate, up, dh, n, dgate, dup);
    double *dgate_want = doubles(n, "dgate want"), *dup_want = doubles(n, "dup want");
    double *dgate_fd = doubles(n, "dgate fd"), *dup_fd = doubles(n, "dup fd");
    const double step = fd_step;
    for (int64_t i = 0; i < n; i++) {
        double gi = gate[i], ui = up[i], dhi = dh[i];
        dgate_want[i] = dhi * ui * silu64_grad(gi);
        dup_want[i] = dhi * silu64(gi);
        /* L = sum dh silu(gate) up: element i moves only its own term */
        dgate_fd[i] = dhi * ui * (silu64(gi + step) - silu64(gi - step)) / (2.0 * step);
        dup_fd[i] = dhi * silu64(gi) * ((ui + step) - (ui - step)) / (2.0 * step);
    }
    expect_close_d("float64 dgate: analytic vs finite differences", dgate_want, dgate_fd, n,
                   tol_fd_reference);
    expect_close_d("float64 dup: analytic vs finite differences", dup_want, dup_fd, n,
                   tol_fd_reference);
    expect_close_f("dgate vs analytic", dgate, dgate_want, n, tol_swiglu);
    expect_close_f("dup vs analytic", dup, dup_want, n, tol_swiglu);
    expect_close_f("dgate vs finite differences", dgate, dgate_fd, n, tol_swiglu);
    expect_close_f("dup vs finite differences", dup, dup_fd, n, tol_swiglu);

    /* ADD */
    float *dgate2 = floats(n, "dgate twice"), *dup2 = floats(n, "dup twice");
    memcpy(dgate2, dgate, (size_t)n * sizeof(float)), memcpy(dup2, dup, (size_t)n * sizeof(float));
    be->swiglu_backward(be, gate, up, dh, n, dgate2, dup2);
    expect_added("dgate after two calls = 2 dgate", dgate2, dgate, dgate, n);
    expect_added("dup after two calls = 2 dup", dup2, dup, dup, n);
    float *dgate_old = floats(n, "dgate old"), *dup_old = floats(n, "dup old");
    float *dgate_pre = floats(n, "dgate pre-filled"), *dup_pre = floats(n, "dup pre-filled");
    fill_uniform(dgate_old, n, -1.0, 1.0), fill_uniform(dup_old, n, -1.0, 1.0);
    memcpy(dgate_pre, dgate_old, (size_t)n * sizeof(float));
    memcpy(dup_pre, dup_old, (size_t)n * sizeof(float));
    be->swiglu_backward(be, gate, up, dh, n, dgate_pre, dup_pre);
    expect_added("pre-filled dgate = old + dgate", dgate_pre, dgate_old, dgate, n);
    expect_added("pre-filled dup = old + dup", dup_pre, dup_old, dup, n);
}

/* ------------------------------------------------------------------------------------------
 * Embedding: out (rows, H) = table[tokens], table (V, H)
 */

static void case_embedding(const ddk_backend *be, const op_case *c)
{
    enum { V = 41 };
    const int64_t rows = c->rows, H = c->d;
    float *table = floats(V * H, "table"), *table_copy = floats(V * H, "table copy");
    fill_uniform(table, V * H, -1.0, 1.0);
    memcpy(table_copy, table, (size_t)(V * H) * sizeof(float));
    /* the last row V-1, row 0, a token repeated, the rest random */
    int32_t *tokens = int32s(rows, "tokens");
    for (int64_t r = 0; r < rows; r++)
        tokens[r] = (int32_t)(ddk_rng_next(&rng_state) % V);
    tokens[0] = V - 1;
    if (rows > 1)
        tokens[rows - 1] = 0;
    if (rows > 2)
        tokens[1] = V - 1;
    if (rows > 4)
        tokens[rows - 2] = tokens[2];
    float *out = floats(rows * H, "out");
    fill_nan(out, rows * H);
    be->embedding(be, table, tokens, rows, H, out);
    for (int64_t r = 0; r < rows; r++)
        check(memcmp(out + r * H, table + (int64_t)tokens[r] * H, (size_t)H * sizeof(float)) == 0,
              "out row %lld is not table row %d", (long long)r, tokens[r]);
    check(memcmp(table, table_copy, (size_t)(V * H) * sizeof(float)) == 0, "the table changed");
}

/* swiglu_16 and swiglu_backward_16 (gate and up bf16, as a bf16 step keeps them): the bits of
 * swiglu and swiglu_backward on the widened values, edges included (rows x d elements) */
static void case_swiglu_16(const ddk_backend *be, const op_case *c)
{
    const int64_t n = c->rows * c->d;
    uint16_t *gate = buffer((size_t)n * sizeof(uint16_t), "gate bf16"), *up = buffer((size_t)n * sizeof(uint16_t), "up bf16");
    float *gf = floats(n, "gate widened"), *uf = floats(n, "up widened"), *dh = floats(n, "dh");
    static const float edges[] = { -1000.0f, -88.8f, -1.278465f, -0.0f, 0.0f, 1e-30f, 88.8f, 1000.0f };
    for (int64_t i = 0; i < n; i++) {
        gate[i] = ddk_f32_to_bf16(i % 5 == 4 ? edges[i / 5 % 8] : (float)rng_uniform(-8.0, 8.0));
        up[i] = ddk_f32_to_bf16((float)rng_uniform(-2.0, 2.0));
        gf[i] = ddk_bf16_to_f32(gate[i]);
        uf[i] = ddk_bf16_to_f32(up[i]);
    }
    fill_uniform(dh, n, -1.0, 1.0);
    float *h16 = floats(n, "h (16)"), *h = floats(n, "h");
    fill_nan(h16, n), fill_nan(h, n);
    be->swiglu_16(be, gate, up, n, h16);
    be->swiglu(be, gf, uf, n, h);
    check(memcmp(h16, h, (size_t)n * sizeof(float)) == 0, "swiglu_16 differs from swiglu on the widened values");
    float *dg16 = floats(n, "dgate (16)"), *du16 = floats(n, "dup (16)"), *dg = floats(n, "dgate"),
          *du = floats(n, "dup");
    fill_uniform(dg, n, -1.0, 1.0);   /* the gradients' start: backward ops add */
    fill_uniform(du, n, -1.0, 1.0);
    memcpy(dg16, dg, (size_t)n * sizeof(float)), memcpy(du16, du, (size_t)n * sizeof(float));
    be->swiglu_backward_16(be, gate, up, dh, n, dg16, du16);
    be->swiglu_backward(be, gf, uf, dh, n, dg, du);
    check(memcmp(dg16, dg, (size_t)n * sizeof(float)) == 0 && memcmp(du16, du, (size_t)n * sizeof(float)) == 0,
          "swiglu_backward_16 differs from swiglu_backward on the widened values");
}

/* ------------------------------------------------------------------------------------------
 * Matmul: c (m, n) = alpha op(a) op(b) + beta c, every leading dimension longer than its row;
 * the padding of a and b is NaN (never read), that of c must stay as it was (never written).
 * beta = 0 takes c as NaN: the BLAS convention, c is then not read. matmul_bf16 is the same
 * product of the operands rounded to bf16 (ddk_round_bf16), which the reference rounds too.
 */

/* an operand value whose low 16 bits (those bf16 drops) are set, 0x4000..0x7fff: below the
 * tie, so it rounds down, always by a quarter to half a bf16 unit; positive, in [0.5, 2) */
static float low_bits_value(void)
{
    float x = ddk_round_bf16((float)rng_uniform(0.5, 2.0));
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u = (u & 0xffff0000u) | 0x4000u | (uint32_t)(ddk_rng_next(&rng_state) & 0x3fffu);
    memcpy(&x, &u, sizeof x);
    return x;
}

/* c (m, ldc) of a product against the float64 sums of op(a) op(b) over the operands' values as
 * the product takes them (rounded to bf16 by a bf16 product), av (rows of lda; op(a) = av^T when
 * ta) and bv (ldb; tb): within tol, the padding past column n as it started (c0), and for k = 0
 * exactly beta c (0 for beta = 0, whatever c held) */
static void expect_product_f64(const float *c, const float *c0, int64_t m, int64_t n, int64_t k,
                               int64_t ldc, float alpha, float beta, const float *av, int64_t lda,
                               int ta, const float *bv, int64_t ldb, int tb, double tol)
{
    float *got = floats(m * n, "c compact");
    double *want = doubles(m * n, "c want");
    int64_t padding_written = 0;
    for (int64_t i = 0; i < m; i++) {
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++)   /* op(a) (m, k) at (i, p), op(b) (k, n) at (p, j) */
                acc += (double)(ta ? av[p * lda + i] : av[i * lda + p]) *
                       (tb ? bv[j * ldb + p] : bv[p * ldb + j]);
            want[i * n + j] = alpha * acc + (beta == 0.0f ? 0.0 : beta * (double)c0[i * ldc + j]);
            got[i * n + j] = c[i * ldc + j];
        }
        for (int64_t j = n; j < ldc; j++)
            padding_written += memcmp(&c[i * ldc + j], &c0[i * ldc + j], sizeof(float)) != 0;
    }
    expect_close_f("c", got, want, m * n, tol);
    check(padding_written == 0, "%lld entries of c past column n written", (long long)padding_written);
    if (k == 0)
        for (int64_t i = 0; i < m * n; i++)
            check(got[i] == (float)want[i], "k = 0: c[%lld] = %g, want beta c = %g", (long long)i,
                  got[i], want[i]);
}

static void matmul_check(const ddk_backend *be, const op_case *c, int bf16)
{
    const int64_t m = c->m, n = c->n, k = c->k;
    const int ta = c->trans_a, tb = c->trans_b;
    const float alpha = 0.75f, beta = c->beta;
    const int64_t rows_a = ta ? k : m, cols_a = ta ? m : k, lda = cols_a + 3;
    const int64_t rows_b = tb ? n : k, cols_b = tb ? k : n, ldb = cols_b + 5;
    const int64_t ldc = n + 2;
    float *a = floats(rows_a * lda, "a");   /* (rows_a, lda) */
    float *b = floats(rows_b * ldb, "b");   /* (rows_b, ldb) */
    float *cm = floats(m * ldc, "c");       /* (m, ldc) */
    float *c_old = floats(m * ldc, "c before");
    fill_nan(a, rows_a * lda), fill_nan(b, rows_b * ldb);
    for (int64_t i = 0; i < rows_a; i++)
        for (int64_t j = 0; j < cols_a; j++)
            a[i * lda + j] = c->extremes ? low_bits_value() : (float)rng_uniform(-1, 1);
    for (int64_t i = 0; i < rows_b; i++)
        for (int64_t j = 0; j < cols_b; j++)
            b[i * ldb + j] = c->extremes ? low_bits_value() : (float)rng_uniform(-1, 1);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++)
            cm[i * ldc + j] = j >= n ? 12345.0f : beta == 0.0f ? NAN : (float)rng_uniform(-1, 1);
    memcpy(c_old, cm, (size_t)(m * ldc) * sizeof(float));

    (bf16 ? be->matmul_bf16 : be->matmul)(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, cm,
                                          ldc);

    const int64_t a_count = rows_a * lda, b_count = rows_b * ldb;
    float *av = floats(a_count, "a as taken"), *bv = floats(b_count, "b as taken");
    for (int64_t i = 0; i < a_count; i++)
        av[i] = bf16 ? ddk_round_bf16(a[i]) : a[i];
    for (int64_t i = 0; i < b_count; i++)
        bv[i] = bf16 ? ddk_round_bf16(b[i]) : b[i];
    expect_product_f64(cm, c_old, m, n, k, ldc, alpha, beta, av, lda, ta, bv, ldb, tb,
                       bf16 ? tol_matmul_bf16 : tol_matmul);

    if (bf16 && c->extremes) {
        /* the rounding shows: the fp32 product of the same operands is farther from this one
         * than fp32 rounding (tol_matmul_bf16) by far; each operand lost 1/4..1/2 of a bf16
         * unit (2^-8 relative in [1, 2)), so c is ~1.5e-3 smaller. 5e-4 > 25x the tolerance. */
        float *c_fp32 = floats(m * ldc, "c fp32");
        memcpy(c_fp32, c_old, (size_t)(m * ldc) * sizeof(float));
        be->matmul(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c_fp32, ldc);
        double *fp32 = doubles(m * n, "c fp32 as double");
        double diff = 0.0, scale = 0.0;
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++) {
                fp32[i * n + j] = c_fp32[i * ldc + j];
                diff = fmax(diff, fabs(fp32[i * n + j] - cm[i * ldc + j]));
                scale = fmax(scale, fabs(fp32[i * n + j]));
            }
        if (verbose)
            printf("  . %-44s err %.2e  min %.0e\n", "bf16 product vs fp32 product", diff / scale,
                   5e-4);
        check(diff > 5e-4 * scale, "matmul_bf16 differs from the fp32 product by only %.3g of c: "
              "were the operands rounded?", diff / scale);
    }
}

static void case_matmul(const ddk_backend *be, const op_case *c)
{
    matmul_check(be, c, 0);
}

static void case_matmul_bf16(const ddk_backend *be, const op_case *c)
{
    matmul_check(be, c, 1);
}

/* ------------------------------------------------------------------------------------------
 * The bf16 step's products (daemon/engine/model/drafter.c): matmul_16 on the weights' bf16 copies,
 * against activations rounded once by round_bf16
 */

/* x (rows, ld) bf16 of random values in [-1, 1] in its first cols columns, the padding NaN bits
 * (never to be read), and xf the same widened to fp32 (exact) with the same stride */
static void bf16_operand(uint16_t *x, float *xf, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t q = 0; q < ld; q++) {
            x[r * ld + q] = q < cols ? ddk_f32_to_bf16((float)rng_uniform(-1, 1)) : 0x7fc0u;
            xf[r * ld + q] = ddk_bf16_to_f32(x[r * ld + q]);
        }
}

/* (m, n, k), the transposes and beta as matmul_check, alpha 0.75; a and b bf16 with padded
 * leading dimensions (NaN padding), c's padding must stay. Bit for bit matmul_bf16 on a and b
 * widened to fp32 with the same strides (the same panels, nothing left to round), and against
 * the float64 product of the widened values (tol_matmul_bf16's reason); k = 0 gives exactly
 * beta c, m or n = 0 writes nothing. */
static void case_matmul_16(const ddk_backend *be, const op_case *c)
{
    const int64_t m = c->m, n = c->n, k = c->k;
    const int ta = c->trans_a, tb = c->trans_b;
    const float alpha = 0.75f, beta = c->beta;
    const int64_t rows_a = ta ? k : m, cols_a = ta ? m : k, lda = cols_a + 3;
    const int64_t rows_b = tb ? n : k, cols_b = tb ? k : n, ldb = cols_b + 5;
    const int64_t ldc = n + 2;
    uint16_t *a = buffer((size_t)(rows_a * lda) * sizeof(uint16_t), "a bf16");   /* (rows_a, lda) */
    uint16_t *b = buffer((size_t)(rows_b * ldb) * sizeof(uint16_t), "b bf16");   /* (rows_b, ldb) */
    float *af = floats(rows_a * lda, "a widened"), *bf = floats(rows_b * ldb, "b widened");
    float *c16 = floats(m * ldc, "c (matmul_16)"), *cb = floats(m * ldc, "c (matmul_bf16)");
    float *c0 = floats(m * ldc, "c before");   /* (m, ldc) each */
    bf16_operand(a, af, rows_a, cols_a, lda);
    bf16_operand(b, bf, rows_b, cols_b, ldb);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++)
            c0[i * ldc + j] = j >= n ? 12345.0f : beta == 0.0f ? NAN : (float)rng_uniform(-1, 1);
    memcpy(c16, c0, (size_t)(m * ldc) * sizeof(float));
    memcpy(cb, c0, (size_t)(m * ldc) * sizeof(float));

    be->matmul_16(be, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c16, ldc);
    be->matmul_bf16(be, ta, tb, m, n, k, alpha, af, lda, bf, ldb, beta, cb, ldc);
    check(memcmp(c16, cb, (size_t)(m * ldc) * sizeof(float)) == 0,
          "matmul_16 differs from matmul_bf16 on the widened operands");
    if (m == 0 || n == 0) {   /* an empty c: nothing to compare, nothing may be written */
        check(memcmp(c16, c0, (size_t)(m * ldc) * sizeof(float)) == 0, "c written by an empty product");
        return;
    }

    expect_product_f64(c16, c0, m, n, k, ldc, alpha, beta, af, lda, ta, bf, ldb, tb, tol_matmul_bf16);
}

/* The bf16 nearest to x by distance in float64, ties to the even significand: round to nearest
 * even worked out apart from ddk_f32_to_bf16's carry trick. below is x's bf16 toward zero, above
 * the next one away from zero (a carry into the exponent included); past the largest finite bf16
 * the next value is 2^128 (IEEE's overflow rule: a magnitude of at least the largest finite plus
 * half a unit rounds to inf), whose significand is even. x not NaN. */
static uint16_t nearest_bf16(float x)
{
    const uint16_t below = (uint16_t)(ddk_f32_bits(x) >> 16), above = (uint16_t)(below + 1);
    if (isinf(x) || (ddk_f32_bits(x) & 0xffffu) == 0)
        return below;   /* a bf16 value already */
    const double at = fabs((double)x), lo = fabs((double)ddk_bf16_to_f32(below));
    const double hi = (above & 0x7fffu) == 0x7f80u ? ldexp(1.0, 128)
                                                    : fabs((double)ddk_bf16_to_f32(above));
    if (at - lo != hi - at)   /* both differences exact in float64 */
        return at - lo < hi - at ? below : above;
    return below & 1u ? above : below;
}

/* The named edges: (input bits, the bf16 it must round to); NaNs only need to stay NaN */
static const struct { uint32_t x; uint16_t y; } round_edges[] = {
    { 0x00000000u, 0x0000u }, { 0x80000000u, 0x8000u },   /* +0, -0 */
    { 0x3f808000u, 0x3f80u }, { 0x3f818000u, 0x3f82u },   /* ties: even lsb stays, odd goes up */
    { 0xbf808000u, 0xbf80u }, { 0xbf818000u, 0xbf82u },   /* the same, negative */
    { 0x3f807fffu, 0x3f80u }, { 0x3f808001u, 0x3f81u },   /* just below and above a tie */
    { 0x00000001u, 0x0000u }, { 0x00008000u, 0x0000u },   /* subnormals: the smallest, a tie */
    { 0x00018000u, 0x0002u }, { 0x807fffffu, 0x8080u },   /* an odd tie; -(the largest): -normal */
    { 0x7f800000u, 0x7f80u }, { 0xff800000u, 0xff80u },   /* +-inf */
    { 0x7f7fffffu, 0x7f80u }, { 0xff7fffffu, 0xff80u },   /* +-FLT_MAX: past the largest bf16, inf */
    { 0x7f7f8000u, 0x7f80u }, { 0x7f7f7fffu, 0x7f7fu },   /* the overflow tie (odd lsb: inf), below it */
    { 0x7f7e8000u, 0x7f7eu },                             /* a tie below it with an even lsb */
    { 0x7fc00000u, 0x7fc0u }, { 0x7f800001u, 0x7fc0u },   /* NaNs (any NaN will do), one whose */
    { 0xffffffffu, 0xffffu }, { 0xff800001u, 0xffc0u },   /* truncation would be +-inf */
};
enum { ROUND_EDGES = sizeof(round_edges) / sizeof(round_edges[0]) };
/* the low halves of the sweep: exact, ties, either side of a tie, the smallest and largest */
static const uint16_t round_lows[] = { 0x0000u, 0x8000u, 0x7fffu, 0x8001u,
                                       0x0001u, 0xffffu, 0x4000u, 0xc000u };

/* count = rows: the named edges, then every high half (all signs, exponents, subnormals, inf and
 * NaN) with each of round_lows and random low halves. Non-NaN: ddk_f32_to_bf16's bits and the
 * float64 nearest; NaN stays NaN; y starts as NaN bits (a value not written fails); x unchanged */
static void case_round_bf16(const ddk_backend *be, const op_case *c)
{
    const int64_t count = c->rows;
    float *x = floats(count, "x"), *x0 = floats(count, "x before");
    uint16_t *y = buffer((size_t)count * sizeof(uint16_t), "y");
    for (int64_t i = 0; i < count; i++) {
        if (i < ROUND_EDGES) {
            x[i] = ddk_f32_from_bits(round_edges[i].x);
            continue;
        }
        /* sweep element j: high half j mod 2^16; in the first 8 groups of 2^16 the low halves
         * rotate so that every high half meets every one of round_lows */
        const int64_t j = i - ROUND_EDGES, group = j >> 16;
        const uint32_t low = group < 8 ? round_lows[(j + group) % 8]
                                       : (uint32_t)(ddk_rng_next(&rng_state) & 0xffffu);
        x[i] = ddk_f32_from_bits(((uint32_t)(j & 0xffff) << 16) | low);
    }
    memcpy(x0, x, (size_t)count * sizeof(float));
    memset(y, 0xff, (size_t)count * sizeof(uint16_t));
    be->round_bf16(be, x, count, y);

    int64_t wrong = 0, not_nearest = 0, nan_lost = 0, edges_wrong = 0, first = -1;
    for (int64_t i = 0; i < count; i++) {
        const int nan_in = isnan(x0[i]), nan_out = (y[i] & 0x7fffu) > 0x7f80u;
        if (nan_in) {
            nan_lost += !nan_out;
        } else {
            wrong += y[i] != ddk_f32_to_bf16(x0[i]);
            not_nearest += y[i] != nearest_bf16(x0[i]);
        }
        if (i < ROUND_EDGES)
            edges_wrong += nan_in ? !nan_out : y[i] != round_edges[i].y;
        if (first < 0 && (nan_in ? !nan_out : y[i] != ddk_f32_to_bf16(x0[i])))
            first = i;
    }
    check(wrong == 0, "%lld of %lld values not ddk_f32_to_bf16's bits, first x = 0x%08x: 0x%04x",
          (long long)wrong, (long long)count, first < 0 ? 0u : ddk_f32_bits(x0[first]),
          first < 0 ? 0u : (unsigned)y[first]);
    check(not_nearest == 0, "%lld values not the nearest bf16 (ties to even)", (long long)not_nearest);
    check(nan_lost == 0, "%lld NaNs not NaN any more", (long long)nan_lost);
    check(edges_wrong == 0, "%lld of the %d named edges wrong", (long long)edges_wrong, (int)ROUND_EDGES);
    check(memcmp(x, x0, (size_t)count * sizeof(float)) == 0, "x changed");
}

/* ------------------------------------------------------------------------------------------
 * Whole buffers: sumsq, axpby, adamw (the trainer's reduction and optimiser)
 */

/* sum of x^2 in float64: the same at every call and at another alignment (order fixed by the
 * count); 1e20 values (x^2 = 1e40 overflows float) stay finite */
static void case_sumsq(const ddk_backend *be, const op_case *c)
{
    const int64_t n = c->rows;
    const double scale = c->extremes ? 1e20 : 1.0;
    float *x = floats(n, "x"), *shifted = floats(n + 1, "x shifted by one float");   /* (n) */
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * rng_uniform(-2.0, 2.0));
    memcpy(shifted + 1, x, (size_t)n * sizeof(float));
    double want = 0.0;
    for (int64_t i = 0; i < n; i++)
        want += (double)x[i] * x[i];

    double got = be->sumsq(be, x, n);
    be->synchronize(be);   /* nothing queued on the CPU: a no-op that must not crash */
    double err = want > 0.0 ? fabs(got - want) / want : fabs(got);
    if (verbose)
        printf("  . %-44s err %.2e  tol %.0e\n", "sumsq", err, tol_sumsq);
    check(isfinite(got) && err <= tol_sumsq, "sumsq %.17g, want %.17g (relative error %.3g)", got,
          want, err);
    if (n == 0)
        check(got == 0.0, "sumsq of nothing is %g, want 0", got);
    double again = be->sumsq(be, x, n), elsewhere = be->sumsq(be, shifted + 1, n);
    check(memcmp(&again, &got, sizeof got) == 0, "a second call gave %.17g, the first %.17g",
          again, got);
    check(memcmp(&elsewhere, &got, sizeof got) == 0,
          "at another alignment %.17g, aligned %.17g (the order must depend on count alone)",
          elsewhere, got);
}

/* y[i] against want[i] to tol_axpby of |alpha x| + |beta y|, or bit for bit when exact */
static void expect_axpby(const char *what, const float *y, const double *want,
                         const double *terms, int64_t n, int exact)
{
    int64_t bad = 0, first = 0;
    double worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs((double)y[i] - (exact ? (double)(float)want[i] : want[i]));
        double bound = exact ? 0.0 : tol_axpby * terms[i];
        int ok = isfinite(y[i]) && (exact ? y[i] == (float)want[i] : err <= bound);
        if (!ok && bad++ == 0)
            first = i;
        if (terms[i] > 0.0)
            worst = fmax(worst, err / terms[i]);
    }
    if (verbose)
        printf("  . %-44s err %.2e  tol %.0e\n", what, worst, exact ? 0.0 : tol_axpby);
    check(bad == 0, "%s: %lld of %lld wrong, first [%lld]: got %.9g, want %.9g%s", what,
          (long long)bad, (long long)n, (long long)first, n ? (double)y[first] : 0.0,
          n ? want[first] : 0.0, exact ? " (bit for bit)" : "");
}

/* y = alpha x + beta y: beta = 0 over a NaN y (y not read: alpha x, one rounding, so bit for
 * bit (float)(alpha x)), beta != 0, and in place (x == y) with both */
static void case_axpby(const ddk_backend *be, const op_case *c)
{
    const int64_t n = c->rows;
    const float alpha = -0.7f, beta = 1.3f;
    float *x = floats(n, "x"), *x_copy = floats(n, "x copy"), *y = floats(n, "y");
    float *y_old = floats(n, "y before");
    double *want = doubles(n, "y want"), *terms = doubles(n, "|alpha x| + |beta y|");
    fill_uniform(x, n, -2.0, 2.0);
    memcpy(x_copy, x, (size_t)n * sizeof(float));

    fill_nan(y, n);
    be->axpby(be, n, alpha, x, 0.0f, y);
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)alpha * x[i], terms[i] = fabs(want[i]);
    expect_axpby("beta 0 over NaN: y = alpha x", y, want, terms, n, 1);

    fill_uniform(y, n, -2.0, 2.0);
    memcpy(y_old, y, (size_t)n * sizeof(float));
    be->axpby(be, n, alpha, x, beta, y);
    for (int64_t i = 0; i < n; i++) {
        want[i] = (double)alpha * x[i] + (double)beta * y_old[i];
        terms[i] = fabs((double)alpha * x[i]) + fabs((double)beta * y_old[i]);
    }
    expect_axpby("y = alpha x + beta y", y, want, terms, n, 0);
    check(memcmp(x, x_copy, (size_t)n * sizeof(float)) == 0, "x changed");

    /* in place: y = alpha y + beta y, then y = alpha y */
    memcpy(y_old, y, (size_t)n * sizeof(float));
    be->axpby(be, n, alpha, y, beta, y);
    for (int64_t i = 0; i < n; i++) {
        want[i] = ((double)alpha + beta) * y_old[i];
        terms[i] = (fabs((double)alpha) + fabs((double)beta)) * fabs((double)y_old[i]);
    }
    expect_axpby("in place: y = alpha y + beta y", y, want, terms, n, 0);
    memcpy(y_old, y, (size_t)n * sizeof(float));
    be->axpby(be, n, alpha, y, 0.0f, y);
    for (int64_t i = 0; i < n; i++)
        want[i] = (double)alpha * y_old[i], terms[i] = fabs(want[i]);
    expect_axpby("in place, beta 0: y = alpha y", y, want, terms, n, 1);
}

/* One AdamW update at step 3 against the float64 formula of ddk.h, with the float scalars:
 * g scaled (stored back, bit for bit the float product), m, v, and the change of w. When
 * n >= 3, elements 0 and n-1 have g = m = v = 0 (a parameter that has seen no gradient: only
 * decay moves it; with one element the change would be decay alone, too small for the
 * tolerance's premise). */
static void case_adamw(const ddk_backend *be, const op_case *c)
{
    const int64_t n = c->rows;
    const double b1 = 0.9, b2 = 0.95, lr = 0.05;
    const ddk_adamw_scalars s = {
        .grad_scale = c->grad_scale,
        .beta1 = (float)b1, .one_minus_beta1 = (float)(1.0 - b1),
        .beta2 = (float)b2, .one_minus_beta2 = (float)(1.0 - b2),
        .inv_bc1 = (float)(1.0 / (1.0 - b1 * b1 * b1)), .inv_bc2 = (float)(1.0 / (1.0 - b2 * b2 * b2)),
        .eps = 1e-8f, .lr = (float)lr, .lr_wd = (float)(lr * c->decay),
    };
    float *w = floats(n, "w"), *g = floats(n, "g"), *m = floats(n, "m"), *v = floats(n, "v");
    float *w0 = floats(n, "w before"), *g0 = floats(n, "g before");
    fill_uniform(w, n, -1.0, 1.0);
    fill_uniform(g, n, -1.0, 1.0);
    fill_uniform(m, n, -0.3, 0.3);
    fill_uniform(v, n, 0.01, 0.3);
    if (n >= 3)
        g[0] = m[0] = v[0] = g[n - 1] = m[n - 1] = v[n - 1] = 0.0f;
    memcpy(w0, w, (size_t)n * sizeof(float)), memcpy(g0, g, (size_t)n * sizeof(float));
    double *m_want = doubles(n, "m want"), *v_want = doubles(n, "v want");
    double *dw_want = doubles(n, "w change want"), *dw = doubles(n, "w change");
    for (int64_t i = 0; i < n; i++) {
        double gi = (double)g0[i] * s.grad_scale;
        m_want[i] = (double)s.beta1 * m[i] + (double)s.one_minus_beta1 * gi;
        v_want[i] = (double)s.beta2 * v[i] + (double)s.one_minus_beta2 * gi * gi;
        double direction = m_want[i] * s.inv_bc1 / (sqrt(v_want[i] * s.inv_bc2) + (double)s.eps);
        dw_want[i] = -((double)s.lr * direction + (double)s.lr_wd * w0[i]);
    }

    uint16_t *w16 = malloc((size_t)n * sizeof(uint16_t));   /* the bf16 copy, from garbage */
    check(w16 != NULL, "no memory for w16");
    memset(w16, 0xab, (size_t)n * sizeof(uint16_t));
    be->adamw(be, w, g, m, v, w16, n, &s);

    int64_t g_wrong = 0, copy_wrong = 0;
    for (int64_t i = 0; i < n; i++) {
        g_wrong += g[i] != g0[i] * s.grad_scale;   /* one float product: exactly this */
        copy_wrong += w16[i] != ddk_f32_to_bf16(w[i]);   /* the new w, rounded */
        dw[i] = (double)w[i] - w0[i];
    }
    free(w16);
    check(g_wrong == 0, "%lld of %lld g not stored back as g * grad_scale", (long long)g_wrong,
          (long long)n);
    check(copy_wrong == 0, "%lld of %lld bf16 copies are not the updated w rounded to nearest even",
          (long long)copy_wrong, (long long)n);
    expect_close_f("m", m, m_want, n, tol_adamw_moments);
    expect_close_f("v", v, v_want, n, tol_adamw_moments);
    expect_close_d("w_new - w", dw, dw_want, n, tol_adamw_update);
    /* element 0 saw no gradient: unchanged without decay, moved by it otherwise */
    if (n >= 3 && c->decay == 0.0f)
        check(w[0] == w0[0], "w[0] moved from %.9g to %.9g with g = m = v = 0 and no decay",
              w0[0], w[0]);
    else if (n >= 3)
        check(w[0] != w0[0], "w[0] = %.9g did not decay", w[0]);
}

/* ------------------------------------------------------------------------------------------
 * The loss's bf16 products (ddk_loss_params.bf16_products), through be->loss: n positions,
 * H hidden, V vocabulary; H and V past the 256-column panel of matmul_bf16; chunk 10 (the last
 * one short), vocab_tile 0 or 256; KL (T = 2), CAP (Tc = 1.5); labels with two ignored,
 * weights with one 0.
 */

enum { LOSS_N = 23, LOSS_H = 300, LOSS_V = 600 };
static const double tol_loss_bf16_grad = 0x1p-7;   /* case_loss_bf16_exact says why */

typedef struct {
    float *hs, *ht, *head, *weights;   /* (n, H), (n, H), (V, H), (n) */
    int32_t *labels;                   /* (n) */
} loss_inputs;

static loss_inputs loss_data(int bf16_representable)
{
    const int64_t n = LOSS_N, H = LOSS_H, V = LOSS_V;
    loss_inputs in = { floats(n * H, "student hidden"), floats(n * H, "teacher hidden"),
                       floats(V * H, "lm_head"), floats(n, "weights"), int32s(n, "labels") };
    fill_uniform(in.hs, n * H, -1.0, 1.0);
    for (int64_t i = 0; i < n * H; i++)   /* a teacher close to the student: CAP has hits */
        in.ht[i] = in.hs[i] + (float)rng_uniform(-0.3, 0.3);
    fill_uniform(in.head, V * H, -0.2, 0.2);   /* logits of std ~1.2 */
    fill_uniform(in.weights, n, 0.5, 1.5);
    in.weights[4] = 0.0f;
    for (int64_t i = 0; i < n; i++)
        in.labels[i] = (int32_t)(ddk_rng_next(&rng_state) % V);
    if (bf16_representable) {
        float *all[] = { in.hs, in.ht, in.head };
        const int64_t sizes[] = { n * H, n * H, V * H };
        for (int j = 0; j < 3; j++)
            for (int64_t i = 0; i < sizes[j]; i++)
                all[j][i] = ddk_round_bf16(all[j][i]);
    }
    for (int64_t i = 0; i < n; i += 3) {   /* every third label the student's argmax: c_i = 1 */
        double best = -INFINITY;
        for (int64_t v = 0; v < V; v++) {
            double z = 0.0;
            for (int64_t k = 0; k < H; k++)
                z += (double)in.hs[i * H + k] * in.head[v * H + k];
            if (z > best)
                best = z, in.labels[i] = (int32_t)v;
        }
    }
    in.labels[2] = in.labels[n - 1] = -1;
    return in;
}

static ddk_loss_params loss_params(const op_case *c, int bf16)
{
    return (ddk_loss_params){ .n = LOSS_N, .hidden = LOSS_H, .vocab = LOSS_V, .chunk = 10,
                              .vocab_tile = c->vocab_tile, .kl_weight = 0.3f,
                              .kl_temperature = 2.0f, .cap_weight = 0.1f,
                              .cap_temperature = 1.5f, .bf16_products = bf16 };
}

typedef struct {
    ddk_loss_result r;
    float *grad, *per_position;   /* (n, H), (n) */
} loss_output;

static loss_output loss_run_once(const ddk_backend *be, const op_case *c, const loss_inputs *in,
                                 int bf16)
{
    const ddk_loss_params p = loss_params(c, bf16);
    loss_output o = { { 0 }, floats(LOSS_N * LOSS_H, "grad"), floats(LOSS_N, "per position") };
    fill_nan(o.grad, LOSS_N * LOSS_H), fill_nan(o.per_position, LOSS_N);
    int rc = be->loss(be, &p, in->hs, in->ht, in->head, in->labels, in->weights, o.grad,
                      o.per_position, &o.r);
    check(rc == 0, "loss (bf16_products %d) failed: %d", bf16, rc);
    return o;
}

/* |got - want| <= tol max(|want|, scale), one scalar of the loss */
static void expect_scalar(const char *what, double got, double want, double scale, double tol)
{
    double err = fabs(got - want) / fmax(fabs(want), scale);
    if (verbose)
        printf("  . %-44s err %.2e  tol %.0e  (%.6g)\n", what, err, tol, want);
    check(isfinite(got) && err <= tol, "%s: %.12g, want %.12g (relative %.3g > %.3g)", what, got,
          want, err, tol);
}

/* With hidden states and lm_head already bf16, the logit products round nothing: the same
 * products as fp32 in another summation order (panels of 256 along H), so loss, CE, KL, CAP
 * and l_i agree to fp32 rounding of the logits: ~sqrt(H) 2^-24 sum |h w| ~ 1e-7 absolute,
 * through softmax statistics in double; 1e-6 relative (measured <= 1e-8). The KL (~0.06) is a
 * difference of log-sum-exps of such logits: its error is absolute, judged against the loss
 * (~4) as the others are against themselves (measured 2e-8 of the loss). The gradient product
 * g W does round g (the logit gradient, fp32) to bf16: element (i, h) errs by at most
 * 2^-9 sum_v |g_v W_vh|; g is a difference of softmaxes, sum_v |g_v| <= 2 (1-a) + 2 a T + CAP's
 * ~ 2.7 times its largest element, and W's entries are alike, so sum |g W| <= ~4 max |g W|:
 * normalised error <= 2^-7 = 7.8e-3 (tol_loss_bf16_grad; measured 1.7e-3..2.2e-3). And it
 * must differ from fp32 by more than fp32 rounding (1e-5), else g was not rounded. */
static void case_loss_bf16_exact(const ddk_backend *be, const op_case *c)
{
    const loss_inputs in = loss_data(1);
    const loss_output f = loss_run_once(be, c, &in, 0), h = loss_run_once(be, c, &in, 1);
    const double tol = 1e-6, loss = fabs(f.r.loss);
    expect_scalar("loss", h.r.loss, f.r.loss, loss, tol);
    expect_scalar("ce", h.r.ce, f.r.ce, loss, tol);
    expect_scalar("kl", h.r.kl, f.r.kl, loss, tol);
    expect_scalar("cap", h.r.cap, f.r.cap, loss, tol);
    check(h.r.weight_sum == f.r.weight_sum && h.r.counted == f.r.counted &&
              h.r.correct == f.r.correct,
          "weight_sum %g / %g, counted %lld / %lld, correct %lld / %lld (bf16 / fp32)",
          h.r.weight_sum, f.r.weight_sum, (long long)h.r.counted, (long long)f.r.counted,
          (long long)h.r.correct, (long long)f.r.correct);
    check(f.r.cap > 0.0 && f.r.correct > 0, "no position is confident: CAP untested");
    expect_close_f("l_i", h.per_position, to_doubles(f.per_position, LOSS_N, "fp32 l_i"), LOSS_N,
                   tol);
    double *grad_fp32 = to_doubles(f.grad, LOSS_N * LOSS_H, "fp32 grad");
    expect_close_f("grad (g rounded to bf16)", h.grad, grad_fp32, LOSS_N * LOSS_H,
                   tol_loss_bf16_grad);
    double diff = 0.0, scale = 0.0;
    for (int64_t i = 0; i < LOSS_N * LOSS_H; i++) {
        diff = fmax(diff, fabs(h.grad[i] - grad_fp32[i]));
        scale = fmax(scale, fabs(grad_fp32[i]));
    }
    check(diff > 1e-5 * scale, "the bf16 gradient is within %.3g of fp32's: was g rounded?",
          diff / scale);
}

/* Unrounded operands: the loss is that of the operands rounded to bf16 (fp32 loss of rounded
 * copies, to the tolerances above); against fp32 of the operands as they are, each logit moves
 * by at most 2^-8 sum_h |h| |w| (both operands rounded by
 * <= 2^-9, first order), and each l_i by at most that times sum_v |d l_i / d z_v| over student
 * and teacher logits: (1-a) 2 + a T 2 for CE and the KL on zs, about as much for the KL on zt,
 * lambda / Tc E|log pc + H| for CAP: 4 bounds it here. The weighted means move no more than
 * the worst l_i. Some l_i must move (a product that did not round would leave them to ~1e-7). */
static void case_loss_bf16_rounds(const ddk_backend *be, const op_case *c)
{
    const loss_inputs in = loss_data(0);
    const loss_output f = loss_run_once(be, c, &in, 0), h = loss_run_once(be, c, &in, 1);
    double worst = 0.0;   /* max over positions and tokens of sum_h |h| |w|, student or teacher */
    for (int64_t i = 0; i < LOSS_N; i++)
        for (int64_t v = 0; v < LOSS_V; v++) {
            double s = 0.0, t = 0.0;
            for (int64_t k = 0; k < LOSS_H; k++) {
                s += fabs((double)in.hs[i * LOSS_H + k] * in.head[v * LOSS_H + k]);
                t += fabs((double)in.ht[i * LOSS_H + k] * in.head[v * LOSS_H + k]);
            }
            worst = fmax(worst, fmax(s, t));
        }
    const double bound = 0x1p-8 * worst * 4.0;
    const double moved[] = { fabs(h.r.loss - f.r.loss), fabs(h.r.ce - f.r.ce),
                             fabs(h.r.kl - f.r.kl), fabs(h.r.cap - f.r.cap) };
    static const char *names[] = { "loss", "ce", "kl", "cap" };
    for (int j = 0; j < 4; j++) {
        if (verbose)
            printf("  . %-44s moved %.2e  bound %.1e\n", names[j], moved[j], bound);
        check(isfinite(moved[j]) && moved[j] <= bound, "%s moved by %.3g > %.3g", names[j],
              moved[j], bound);
    }
    /* per position, not the mean: the positions' moves are of both signs, and 23 of them can
     * cancel in the weighted mean to ~1e-9 (seen with one draw of this data) */
    double moved_most = 0.0, loss_most = 0.0;
    for (int64_t i = 0; i < LOSS_N; i++) {
        moved_most = fmax(moved_most, fabs((double)h.per_position[i] - f.per_position[i]));
        loss_most = fmax(loss_most, fabs((double)f.per_position[i]));
    }
    check(moved_most > 1e-5 * loss_most, "no l_i moved by more than %.3g: were the operands rounded?",
          moved_most);

    /* the tight form: the products round exactly as ddk_round_bf16 does, so this is the fp32
     * loss of operands rounded beforehand (case_loss_bf16_exact's tolerances and reasons) */
    loss_inputs rounded = in;
    rounded.hs = floats(LOSS_N * LOSS_H, "student hidden, rounded");
    rounded.ht = floats(LOSS_N * LOSS_H, "teacher hidden, rounded");
    rounded.head = floats(LOSS_V * LOSS_H, "lm_head, rounded");
    for (int64_t i = 0; i < LOSS_N * LOSS_H; i++)
        rounded.hs[i] = ddk_round_bf16(in.hs[i]), rounded.ht[i] = ddk_round_bf16(in.ht[i]);
    for (int64_t i = 0; i < LOSS_V * LOSS_H; i++)
        rounded.head[i] = ddk_round_bf16(in.head[i]);
    const loss_output r = loss_run_once(be, c, &rounded, 0);
    const double tol = 1e-6, loss = fabs(r.r.loss);
    expect_scalar("loss vs fp32 of rounded operands", h.r.loss, r.r.loss, loss, tol);
    expect_scalar("ce vs fp32 of rounded operands", h.r.ce, r.r.ce, loss, tol);
    expect_scalar("kl vs fp32 of rounded operands", h.r.kl, r.r.kl, loss, tol);
    expect_scalar("cap vs fp32 of rounded operands", h.r.cap, r.r.cap, loss, tol);
    expect_close_f("l_i vs fp32 of rounded operands", h.per_position,
                   to_doubles(r.per_position, LOSS_N, "l_i of rounded operands"), LOSS_N, tol);
    expect_close_f("grad vs fp32 of rounded operands", h.grad,
                   to_doubles(r.grad, LOSS_N * LOSS_H, "grad of rounded operands"),
                   LOSS_N * LOSS_H, tol_loss_bf16_grad);
}

/* bf16_products is 0 or 1: 2 and -1 are refused with -EINVAL and nothing written (outputs all
 * sentinel bytes); the workspace size refuses them too */
static void case_loss_bf16_refused(const ddk_backend *be, const op_case *c)
{
    const loss_inputs in = loss_data(0);
    const int bad[] = { 2, -1 };
    for (int j = 0; j < 2; j++) {
        ddk_loss_params p = loss_params(c, 0);
        p.bf16_products = bad[j];
        float *grad = floats(LOSS_N * LOSS_H, "grad"), *per = floats(LOSS_N, "per position");
        memset(grad, sentinel_byte, (size_t)(LOSS_N * LOSS_H) * sizeof(float));
        memset(per, sentinel_byte, (size_t)LOSS_N * sizeof(float));
        ddk_loss_result out, out_sentinel;
        memset(&out, sentinel_byte, sizeof out), memset(&out_sentinel, sentinel_byte, sizeof out);
        int rc = be->loss(be, &p, in.hs, in.ht, in.head, in.labels, in.weights, grad, per, &out);
        check(rc == -EINVAL, "bf16_products = %d: rc %d, want -EINVAL", bad[j], rc);
        check(all_sentinel(grad, LOSS_N * LOSS_H) && all_sentinel(per, LOSS_N) &&
                  memcmp(&out, &out_sentinel, sizeof out) == 0,
              "bf16_products = %d: something was written", bad[j]);
        int64_t bytes = ddk_loss_workspace_bytes(&p, 1);
        check(bytes == -EINVAL, "bf16_products = %d: workspace bytes %lld, want -EINVAL", bad[j],
              (long long)bytes);
    }
}

/* ------------------------------------------------------------------------------------------
 * The DFlash2 drafter's block convolution (SPEC.md 2.1):
 *   y[t, c] = sum_{j < taps, j <= t % B} (base[j, c] + delta[t, j*G + c/gs]) x[t - j, c]
 * delta is one side of a projection row that holds both (ld_delta = 2 taps G + ld_pad)
 */

/* y, and the backward's dx and ddelta: a sum of <= taps terms (dx, y) or gs terms (ddelta),
 * dbase of <= rows terms, each a float product (y's and dx's of a rounded base + delta); a float
 * sum of n terms errs by at most (n - 1) 2^-24 of sum |terms| (plus a rounding per product): n
 * <= 64 here, 4e-6; judged against the largest sum |terms| of the output, not its value, since
 * the terms cancel */
static const double tol_block_conv = 5e-6;

typedef struct {
    int64_t rows, B, H, taps, gs, G, ld;   /* ld: delta's row stride */
} conv_shape;

/* L = sum dy y in float64 over x, base, delta (rows, ld: the columns the op reads) */
static double conv_loss(const conv_shape *s, const double *x, const double *base,
                        const double *delta, const float *dy)
{
    double L = 0.0;
    for (int64_t t = 0; t < s->rows; t++)
        for (int64_t c = 0; c < s->H; c++)
            for (int64_t j = 0; j < s->taps && j <= t % s->B; j++) {
                const double coef = base[j * s->H + c] + delta[t * s->ld + j * s->G + c / s->gs];
                L += (double)dy[t * s->H + c] * coef * x[(t - j) * s->H + c];
            }
    return L;
}

/* the float64 forward y and the scale of its terms (max over elements of sum |terms|) */
static double ref_block_conv(const conv_shape *s, const float *x, const float *base,
                             const float *delta, double *y)
{
    double scale = 0.0;
    for (int64_t t = 0; t < s->rows; t++)
        for (int64_t c = 0; c < s->H; c++) {
            double acc = 0.0, terms = 0.0;
            for (int64_t j = 0; j < s->taps && j <= t % s->B; j++) {
                const double coef = (double)base[j * s->H + c] + delta[t * s->ld + j * s->G + c / s->gs];
                const double term = coef * x[(t - j) * s->H + c];
                acc += term;
                terms += fabs(term);
            }
            y[t * s->H + c] = acc;
            scale = fmax(scale, terms);
        }
    return scale;
}

/* the float64 backward into zeroed dx (rows, H), dbase (taps, H), ddelta (rows, ld), each term
 * added where it lands; scales[3] the largest sum |terms| of dx's, dbase's and ddelta's elements */
static void ref_block_conv_backward(const conv_shape *s, const float *x, const float *base,
                                    const float *delta, const float *dy, double *dx, double *dbase,
                                    double *ddelta, double scales[3])
{
    const int64_t H = s->H, counts[3] = { s->rows * H, s->taps * H, s->rows * s->ld };
    double *grads[3] = { dx, dbase, ddelta };
    double *terms[3] = { doubles(counts[0], "dx terms"), doubles(counts[1], "dbase terms"),
                         doubles(counts[2], "ddelta terms") };
    for (int i = 0; i < 3; i++) {
        memset(grads[i], 0, (size_t)counts[i] * sizeof(double));
        memset(terms[i], 0, (size_t)counts[i] * sizeof(double));
    }
    for (int64_t t = 0; t < s->rows; t++)
        for (int64_t c = 0; c < H; c++)
            for (int64_t j = 0; j < s->taps && j <= t % s->B; j++) {
                const int64_t at = t * s->ld + j * s->G + c / s->gs;
                const double g = dy[t * H + c], xv = x[(t - j) * H + c];
                const double coef = (double)base[j * H + c] + delta[at];
                dx[(t - j) * H + c] += g * coef;
                terms[0][(t - j) * H + c] += fabs(g * coef);
                dbase[j * H + c] += g * xv;
                terms[1][j * H + c] += fabs(g * xv);
                ddelta[at] += g * xv;
                terms[2][at] += fabs(g * xv);
            }
    for (int i = 0; i < 3; i++) {
        scales[i] = 0.0;
        for (int64_t e = 0; e < counts[i]; e++)
            scales[i] = fmax(scales[i], terms[i][e]);
    }
}

/* 1 where the op writes ddelta (rows, ld): row t's tap-j columns for j <= t % B */
static int conv_writes(const conv_shape *s, int64_t t, int64_t col)
{
    return col < s->taps * s->G && col / s->G <= t % s->B;
}

/* dL/dx, dL/dbase, dL/ddelta (ddelta: every column of (rows, ld); 0 where delta is not read) by
 * central differences of conv_loss. L is linear in each value, so they are exact but for
 * rounding: they check the backward's formula, not its conditioning. */
static void fd_block_conv(const conv_shape *s, const float *x, const float *base,
                          const float *delta, const float *dy, double *dx, double *dbase,
                          double *ddelta)
{
    double *xd = to_doubles(x, s->rows * s->H, "fd x"), *bd = to_doubles(base, s->taps * s->H, "fd base");
    double *dd = to_doubles(delta, s->rows * s->ld, "fd delta");
    struct { double *v, *g; int64_t n; } wrt[3] = {
        { xd, dx, s->rows * s->H }, { bd, dbase, s->taps * s->H }, { dd, ddelta, s->rows * s->ld },
    };
    const double h = fd_step;
    for (int w = 0; w < 3; w++)
        for (int64_t i = 0; i < wrt[w].n; i++) {
            const double keep = wrt[w].v[i];
            wrt[w].v[i] = keep + h;
            const double lp = conv_loss(s, xd, bd, dd, dy);
            wrt[w].v[i] = keep - h;
            const double lm = conv_loss(s, xd, bd, dd, dy);
            wrt[w].v[i] = keep;
            wrt[w].g[i] = (lp - lm) / (2.0 * h);
        }
}

/* The op on one side of a projection's rows: the forward against the float64 formula; the
 * backward (into zeroed gradients, ddelta's other columns holding a sentinel that must survive)
 * against the float64 analytic gradient and finite differences; with dx NULL (or, when the case
 * says dx NULL, with dx given) dbase and ddelta the same bits; then ADD into pre-filled gradients */
static void case_block_conv(const ddk_backend *be, const op_case *c)
{
    conv_shape s = { c->rows, c->block, c->d, c->taps, c->gs, c->d / c->gs, 0 };
    s.ld = 2 * s.taps * s.G + c->ld_pad;
    const int64_t rows = s.rows, H = s.H, n = rows * H, nb = s.taps * H, nd = rows * s.ld;
    const int64_t off = c->side * s.taps * s.G;   /* this side's first column of a row */
    float *x = floats(n, "x"), *base = floats(nb, "base"), *proj = floats(nd, "projection");
    float *dy = floats(n, "dy"), *y = floats(n, "y");   /* (rows, H), (taps, H), (rows, ld) */
    fill_uniform(x, n, -2.0, 2.0);
    fill_uniform(base, nb, -1.0, 1.0);
    fill_uniform(proj, nd, -0.5, 0.5);
    fill_uniform(dy, n, -1.0, 1.0);
    const float *delta = proj + off;
    /* the reference's delta (rows, ld): this side's columns from column 0 */
    float *dref = floats(nd, "delta from column 0");
    for (int64_t t = 0; t < rows; t++)
        for (int64_t col = 0; col < s.ld; col++)
            dref[t * s.ld + col] = off + col < s.ld ? delta[t * s.ld + col] : 0.0f;

    fill_nan(y, n);
    be->block_conv(be, x, base, delta, s.ld, rows, s.B, H, s.taps, s.gs, y);
    double *y_want = doubles(n, "y want");
    const double y_scale = ref_block_conv(&s, x, base, dref, y_want);
    expect_close("y", y, NULL, y_want, n, y_scale, tol_block_conv);

    /* the backward, first with dx as the case says, then with the other */
    const float sentinel = 3.25f;
    float *dx[2] = { floats(n, "dx"), floats(n, "dx, second call") };
    float *dbase[2] = { floats(nb, "dbase"), floats(nb, "dbase, second call") };
    float *dproj[2] = { floats(nd, "dprojection"), floats(nd, "dprojection, second call") };
    int64_t untouched_bad = 0;
    for (int call = 0; call < 2; call++) {
        fill_zero(dx[call], n), fill_zero(dbase[call], nb);
        for (int64_t t = 0; t < rows; t++)
            for (int64_t col = 0; col < s.ld; col++)
                dproj[call][t * s.ld + col] = col >= off && conv_writes(&s, t, col - off) ? 0.0f : sentinel;
        const int with_dx = call == 0 ? !c->no_dx : c->no_dx;
        be->block_conv_backward(be, x, base, delta, s.ld, dy, rows, s.B, H, s.taps, s.gs,
                                with_dx ? dx[call] : NULL, dbase[call], dproj[call] + off);
        for (int64_t t = 0; t < rows; t++)
            for (int64_t col = 0; col < s.ld; col++)
                if (!(col >= off && conv_writes(&s, t, col - off)))
                    untouched_bad += memcmp(&dproj[call][t * s.ld + col], &sentinel, sizeof sentinel) != 0;
    }
    check(untouched_bad == 0, "ddelta: %lld values outside the op's columns changed", (long long)untouched_bad);
    check(memcmp(dbase[0], dbase[1], (size_t)nb * sizeof(float)) == 0 &&
              memcmp(dproj[0], dproj[1], (size_t)nd * sizeof(float)) == 0,
          "dbase or ddelta differ between dx given and dx NULL");
    const float *dx_got = dx[c->no_dx ? 1 : 0];   /* the call that had dx */

    double *dx_want = doubles(n, "dx want"), *db_want = doubles(nb, "dbase want");
    double *dd_want = doubles(nd, "ddelta want"), scales[3];
    ref_block_conv_backward(&s, x, base, dref, dy, dx_want, db_want, dd_want, scales);
    double *dx_fd = doubles(n, "dx fd"), *db_fd = doubles(nb, "dbase fd"), *dd_fd = doubles(nd, "ddelta fd");
    fd_block_conv(&s, x, base, dref, dy, dx_fd, db_fd, dd_fd);
    expect_close_d("float64 dx: analytic vs finite differences", dx_want, dx_fd, n, tol_fd_reference);
    expect_close_d("float64 dbase: analytic vs finite differences", db_want, db_fd, nb, tol_fd_reference);
    expect_close_d("float64 ddelta: analytic vs finite differences", dd_want, dd_fd, nd, tol_fd_reference);
    /* the op's ddelta as the reference holds it: (rows, ld) from column 0, 0 where not written */
    float *dd_got = floats(nd, "ddelta from column 0");
    for (int64_t t = 0; t < rows; t++)
        for (int64_t col = 0; col < s.ld; col++)
            dd_got[t * s.ld + col] = conv_writes(&s, t, col) ? dproj[0][t * s.ld + off + col] : 0.0f;
    expect_close("dx vs analytic", dx_got, NULL, dx_want, n, scales[0], tol_block_conv);
    expect_close("dbase vs analytic", dbase[0], NULL, db_want, nb, scales[1], tol_block_conv);
    expect_close("ddelta vs analytic", dd_got, NULL, dd_want, nd, scales[2], tol_block_conv);
    expect_close("dx vs finite differences", dx_got, NULL, dx_fd, n, scales[0], tol_block_conv);
    expect_close("dbase vs finite differences", dbase[0], NULL, db_fd, nb, scales[1], tol_block_conv);
    expect_close("ddelta vs finite differences", dd_got, NULL, dd_fd, nd, scales[2], tol_block_conv);

    /* ADD: pre-filled gradients keep their content (every column of the projection's rows) */
    float *dx_old = floats(n, "dx old"), *db_old = floats(nb, "dbase old"), *dp_old = floats(nd, "dprojection old");
    float *dx_pre = floats(n, "dx pre-filled"), *db_pre = floats(nb, "dbase pre-filled");
    float *dp_pre = floats(nd, "dprojection pre-filled"), *dp_inc = floats(nd, "dprojection increments");
    fill_uniform(dx_old, n, -1.0, 1.0), fill_uniform(db_old, nb, -1.0, 1.0), fill_uniform(dp_old, nd, -1.0, 1.0);
    memcpy(dx_pre, dx_old, (size_t)n * sizeof(float)), memcpy(db_pre, db_old, (size_t)nb * sizeof(float));
    memcpy(dp_pre, dp_old, (size_t)nd * sizeof(float));
    be->block_conv_backward(be, x, base, delta, s.ld, dy, rows, s.B, H, s.taps, s.gs, dx_pre, db_pre, dp_pre + off);
    for (int64_t i = 0; i < nd; i++)   /* the first call's increments, 0 where nothing is written */
        dp_inc[i] = i % s.ld >= off && conv_writes(&s, i / s.ld, i % s.ld - off) ? dproj[0][i] : 0.0f;
    expect_added("pre-filled dx = old + dx", dx_pre, dx_old, dx_got, n);
    expect_added("pre-filled dbase = old + dbase", db_pre, db_old, dbase[0], nb);
    expect_added("pre-filled ddelta = old + ddelta", dp_pre, dp_old, dp_inc, nd);
}

/* ------------------------------------------------------------------------------------------
 * zero and copy: exact bytes, nothing around them touched
 */

enum { BYTES = 5000 };
static const struct { size_t offset, bytes; } spans[] = {
    { 0, 0 }, { 0, 1 }, { 3, 7 }, { 1, 64 }, { 64, 4096 }, { 5, 4099 }, { 0, BYTES },
};

/* ------------------------------------------------------------------------------------------
 * The Qwen3.5 target's ops (SPEC.md 3.1), forward only: conv1d_silu, gated_rmsnorm,
 * rope_partial, gated_delta
 */

/* conv1d_silu: K float products summed in float, then expf (1 ulp) and a division: a few
 * roundings of terms no larger than max |y| + K max |w x| (K <= 5, O(1) values) */
static const double tol_conv = 1e-6;
/* gated_rmsnorm: rmsnorm's 3 roundings, then silu(z) (expf, a division) and one product more */
static const double tol_gated_norm = 2e-6;
/* gated_delta against the float64 recurrence: every token's update is a contraction of the state
 * (decay <= 1, I - beta k k^T with |k| = 1, beta < 1), so float's rounding does not grow with T:
 * each step adds ~dk float roundings of the state's size, sqrt(dk) 2^-24 typically (dk <= 32:
 * 3.4e-7); the chunked form adds the solve's and the chunk products' (<= 64 terms) as many
 * again. Measured <= 4.3e-7 (out and state, every chunk size, T up to 200) */
static const double tol_delta = 2e-6;
/* chunked against the op's own recurrence (both float): the two errors above add */
static const double tol_delta_chunked = 4e-6;

static double ref_silu(double x)
{
    return x / (1.0 + exp(-x));
}

/* T = rows, C = d, K = k; extremes: with a history of K-1 rows */
static void case_conv1d_silu(const ddk_backend *be, const op_case *c)
{
    const int64_t T = c->rows, C = c->d, K = c->k;
    float *x = floats(T * C, "x"), *w = floats(C * K, "w"), *y = floats(T * C, "y");
    float *history = c->extremes && K > 1 ? floats((K - 1) * C, "history") : NULL;
    fill_uniform(x, T * C, -2.0, 2.0);
    fill_uniform(w, C * K, -1.0, 1.0);
    if (history)
        fill_uniform(history, (K - 1) * C, -2.0, 2.0);
    fill_nan(y, T * C);
    be->conv1d_silu(be, x, w, history, T, C, K, y);
    double *want = doubles(T * C, "y want");
    for (int64_t t = 0; t < T; t++)
        for (int64_t ch = 0; ch < C; ch++) {
            double acc = 0.0;
            for (int64_t m = 0; m < K; m++) {
                int64_t s = t - (K - 1) + m;   /* before 0: the history's row K-1+s, or 0 */
                double xs = s >= 0 ? x[s * C + ch] : history ? history[(K - 1 + s) * C + ch] : 0.0;
                acc += (double)w[ch * K + m] * xs;
            }
            want[t * C + ch] = ref_silu(acc);
        }
    expect_close_f("y", y, want, T * C, tol_conv);
    /* a causal conv: the first row of T = 1 with that history equals row t of the whole */
    if (T > K) {
        float *one = floats(C, "y of one row");
        fill_nan(one, C);
        be->conv1d_silu(be, x + (T - 1) * C, w, x + (T - K) * C, 1, C, K, one);
        check(memcmp(one, y + (T - 1) * C, (size_t)C * sizeof(float)) == 0,
              "the last row from a history of the K-1 before it differs from the whole's");
    }
}

static void case_gated_rmsnorm(const ddk_backend *be, const op_case *c)
{
    const int64_t rows = c->rows, d = c->d, n = rows * d;
    float *x = floats(n, "x"), *z = floats(n, "z"), *w = floats(d, "w"), *y = floats(n, "y");
    fill_uniform(x, n, -2.0, 2.0);
    fill_uniform(z, n, -8.0, 8.0);
    fill_uniform(w, d, -1.5, 1.5);
    fill_nan(y, n);
    be->gated_rmsnorm(be, x, z, w, rows, d, c->eps, y);
    double *want = doubles(n, "y want");
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i];
        double s = 1.0 / sqrt(ss / (double)d + (double)c->eps);
        for (int64_t i = 0; i < d; i++)
            want[r * d + i] = x[r * d + i] * s * w[i] * ref_silu(z[r * d + i]);
    }
    expect_close_f("y", y, want, n, tol_gated_norm);
    float *xy = floats(n, "x, then y (in place)");
    memcpy(xy, x, (size_t)n * sizeof(float));
    be->gated_rmsnorm(be, xy, z, w, rows, d, c->eps, xy);
    check(memcmp(xy, y, (size_t)n * sizeof(float)) == 0, "in place (y = x) differs");
}

/* rows, heads, d; m = rd */
static void case_rope_partial(const ddk_backend *be, const op_case *c)
{
    const int64_t rows = c->rows, heads = c->heads, d = c->d, rd = c->m, n = rows * heads * d;
    int32_t *pos = int32s(rows, "pos");
    rope_positions(pos, rows, heads);
    float *x = floats(n, "x"), *y = floats(n, "y");
    fill_uniform(x, n, -1.0, 1.0);
    memcpy(y, x, (size_t)n * sizeof(float));
    be->rope_partial(be, y, pos, rows, heads, d, rd, c->theta);
    double *want = to_doubles(x, n, "y want");
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < rd / 2; j++) {
            double angle = (double)pos[r] * pow((double)c->theta, -2.0 * (double)j / (double)rd);
            for (int64_t h = 0; h < heads; h++) {
                int64_t o = (r * heads + h) * d;
                double a = x[o + j], b = x[o + j + rd / 2];
                want[o + j] = a * cos(angle) - b * sin(angle);
                want[o + j + rd / 2] = b * cos(angle) + a * sin(angle);
            }
        }
    expect_close_f("y", y, want, n, tol_rope);
    int64_t moved = 0;   /* dims rd..d-1 pass through, bit for bit */
    for (int64_t i = 0; i < rows * heads; i++)
        for (int64_t e = rd; e < d; e++)
            moved += memcmp(&y[i * d + e], &x[i * d + e], sizeof(float)) != 0;
    check(moved == 0, "%lld of the dims past rd changed", (long long)moved);
    if (rd == d) {   /* the whole head: rope itself, bit for bit */
        float *full = floats(n, "rope's y");
        memcpy(full, x, (size_t)n * sizeof(float));
        be->rope(be, full, pos, rows, heads, d, c->theta, 0);
        check(memcmp(full, y, (size_t)n * sizeof(float)) == 0, "rd = d differs from rope");
    }
}

/* the float64 recurrence of ddk.h's gated_delta; S (nv, dk, dv) in/out */
static void ref_delta(const ddk_delta_shape *s, const float *q, const float *k, const float *v,
                      const float *beta, const float *g, double *S, double *out)
{
    const int64_t nk = s->nk, nv = s->nv, dk = s->dk, dv = s->dv, r = nv / nk;
    double *u = doubles(dv, "ref u");
    for (int64_t t = 0; t < s->T; t++)
        for (int64_t j = 0; j < nv; j++) {
            const float *qt = q + (t * nk + j / r) * dk, *kt = k + (t * nk + j / r) * dk;
            const float *vt = v + (t * nv + j) * dv;
            double *Sj = S + j * dk * dv, decay = exp((double)g[t * nv + j]), b = beta[t * nv + j];
            for (int64_t e = 0; e < dk * dv; e++)
                Sj[e] *= decay;
            for (int64_t e = 0; e < dv; e++) {
                double kv = 0.0;
                for (int64_t a = 0; a < dk; a++)
                    kv += Sj[a * dv + e] * kt[a];
                u[e] = b * (vt[e] - kv);
            }
            for (int64_t a = 0; a < dk; a++)
                for (int64_t e = 0; e < dv; e++)
                    Sj[a * dv + e] += kt[a] * u[e];
            for (int64_t e = 0; e < dv; e++) {
                double o = 0.0;
                for (int64_t a = 0; a < dk; a++)
                    o += Sj[a * dv + e] * qt[a];
                out[(t * nv + j) * dv + e] = o;
            }
        }
}

/* x (rows, d) scaled to unit length, then by scale */
static void unit_rows(float *x, int64_t rows, int64_t d, double scale)
{
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0.0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i];
        for (int64_t i = 0; i < d; i++)
            x[r * d + i] = (float)(x[r * d + i] / sqrt(ss) * scale);
    }
}

/* rows = T, heads = nk, m = nv, d = dk, n = dv; extremes: decays down to 0.06 (c reaches -180
 * in a chunk of 64), else in [0.5, 0.9997]. The recurrence (chunk 0) and chunks of 1, 3, 64 and
 * T + 5, each against the float64 recurrence, the chunked ones against the op's recurrence too,
 * the state out as well as the output. */
static void case_gated_delta(const ddk_backend *be, const op_case *c)
{
    const ddk_delta_shape base = { .T = c->rows, .nk = c->heads, .nv = c->m, .dk = c->d, .dv = c->n };
    const int64_t T = base.T, nk = base.nk, nv = base.nv, dk = base.dk, dv = base.dv;
    const int64_t nq = T * nk * dk, nvv = T * nv * dv, ns = nv * dk * dv;
    float *q = floats(nq, "q"), *k = floats(nq, "k"), *v = floats(nvv, "v");
    float *beta = floats(T * nv, "beta"), *g = floats(T * nv, "g"), *S0 = floats(ns, "entering state");
    fill_uniform(q, nq, -1.0, 1.0);
    fill_uniform(k, nq, -1.0, 1.0);
    unit_rows(q, T * nk, dk, 1.0 / sqrt((double)dk));   /* as the layer hands them: l2-normed, q scaled */
    unit_rows(k, T * nk, dk, 1.0);
    fill_uniform(v, nvv, -1.0, 1.0);
    fill_uniform(beta, T * nv, 0.04, 0.96);
    for (int64_t i = 0; i < T * nv; i++)
        g[i] = (float)log(rng_uniform(c->extremes ? 0.06 : 0.5, 0.9997));
    fill_uniform(S0, ns, -0.5, 0.5);

    double *S_want = to_doubles(S0, ns, "state want"), *out_want = doubles(nvv, "out want");
    ref_delta(&base, q, k, v, beta, g, S_want, out_want);

    static const int64_t chunks[] = { 0, 1, 3, 64, -1 };   /* -1: T + 5, one short chunk */
    float *out_rec = NULL, *S_rec = NULL;
    for (size_t ci = 0; ci < sizeof chunks / sizeof chunks[0]; ci++) {
        ddk_delta_shape s = base;
        s.chunk = chunks[ci] < 0 ? T + 5 : chunks[ci];
        float *out = floats(nvv, "out"), *S = floats(ns, "state");
        fill_nan(out, nvv);
        memcpy(S, S0, (size_t)ns * sizeof(float));
        int rc = be->gated_delta(be, &s, q, k, v, beta, g, S, out);
        check(rc == 0, "chunk %lld: rc %d", (long long)s.chunk, rc);
        char what[96];
        snprintf(what, sizeof what, "chunk %lld: out vs float64 recurrence", (long long)s.chunk);
        expect_close_f(what, out, out_want, nvv, tol_delta);
        snprintf(what, sizeof what, "chunk %lld: state vs float64 recurrence", (long long)s.chunk);
        expect_close_f(what, S, S_want, ns, tol_delta);
        if (s.chunk == 0) {
            out_rec = out, S_rec = S;
            continue;
        }
        double *rec = to_doubles(out_rec, nvv, "recurrence's out"), *srec = to_doubles(S_rec, ns, "recurrence's state");
        snprintf(what, sizeof what, "chunk %lld: out vs the op's recurrence", (long long)s.chunk);
        expect_close_f(what, out, rec, nvv, tol_delta_chunked);
        snprintf(what, sizeof what, "chunk %lld: state vs the op's recurrence", (long long)s.chunk);
        expect_close_f(what, S, srec, ns, tol_delta_chunked);
    }
    /* a sequence in two calls (prefill, then the rest token by token) = one call */
    if (T > 2) {
        ddk_delta_shape head = base, tail = base;
        head.T = T / 2, head.chunk = 64, tail.T = 1, tail.chunk = 0;
        float *out = floats(nvv, "out in pieces"), *S = floats(ns, "state in pieces");
        memcpy(S, S0, (size_t)ns * sizeof(float));
        int rc = be->gated_delta(be, &head, q, k, v, beta, g, S, out);
        for (int64_t t = head.T; t < T && !rc; t++)
            rc = be->gated_delta(be, &tail, q + t * nk * dk, k + t * nk * dk, v + t * nv * dv,
                                 beta + t * nv, g + t * nv, S, out + t * nv * dv);
        check(rc == 0, "in pieces: rc %d", rc);
        expect_close_f("prefill then decode: out vs float64 recurrence", out, out_want, nvv, tol_delta);
        expect_close_f("prefill then decode: state vs float64 recurrence", S, S_want, ns, tol_delta);
    }
    ddk_delta_shape bad = base;
    bad.nk = nv + 1;   /* nv % nk != 0 */
    check(be->gated_delta(be, &bad, q, k, v, beta, g, S0, v) == -EINVAL, "nv %% nk != 0 not refused");
}

/* ------------------------------------------------------------------------------------------
 * The frozen target on bf16 weights (matmul_w16, embedding_w16), its row plumbing (copy_rows),
 * its Qwen3.5 element-wise steps (l2norm_heads, sigmoid_mul, delta_gates) and causal attention
 * over a cache (q_rows)
 */

/* l2norm_heads, sigmoid_mul and delta_gates against float64: a sum of d <= 257 float squares
 * (~sqrt(d) 2^-24 relative), a sqrtf, a division and a product; expf and log1pf (< 1 ulp each,
 * glibc) with a division or product: a few float roundings of the result */
static const double tol_target_elementwise = 1e-6;
/* causal attention, a cached step's rows against the prefill's last rows (both float): the key
 * tiles are the same, but BLAS multiplies a group of other rows (another kernel, another
 * summation order within a tile's dot products): float rounding of softmax sums of <= 70 terms */
static const double tol_causal_cached = 1e-6;
/* causal attention against the float64 dense reference: out is a convex combination of v rows,
 * summed in float over <= 70 keys in tiles */
static const double tol_causal_ref = 2e-6;

/* the engine's own loops (daemon/engine/model/target_qwen35.c), copied as they are there: the CPU
 * backend's l2norm_heads, sigmoid_mul and delta_gates must give their bits */
static float engine_sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static void engine_l2norm_heads(const float *src, int64_t ld, int64_t T, int64_t heads, int64_t d,
                                float scale, float eps, float *dst)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + t * ld + h * d;
            float *y = dst + (t * heads + h) * d, ss = 0.0f;
            for (int64_t i = 0; i < d; i++)
                ss += x[i] * x[i];
            const float f = scale / sqrtf(ss + eps);
            for (int64_t i = 0; i < d; i++)
                y[i] = x[i] * f;
        }
}

static void engine_delta_gates(float *beta, float *g, const float *A_log, const float *dt_bias,
                               int64_t T, int64_t nv)
{
    for (int64_t r = 0; r < T; r++)
        for (int64_t j = 0; j < nv; j++) {
            float *b = &beta[r * nv + j], *a = &g[r * nv + j], s = *a + dt_bias[j];
            *b = engine_sigmoidf(*b);
            *a = -expf(A_log[j]) * (s > 20.0f ? s : log1pf(expf(s)));
        }
}

/* m, n, k, beta; trans_b 1: matmul_w16 (W (n, k), c = a W^T), 0: matmul_w16_nn (W (k, n),
 * c = a W); every leading dimension padded (a's and W's padding NaN / NaN bits, c's padding must
 * stay). Bit for bit matmul_bf16 (N, trans_b) on W widened to fp32 with the same strides, and
 * against the float64 product of the rounded operands (tol_matmul_bf16's reason). */
static void case_matmul_w16(const ddk_backend *be, const op_case *c)
{
    const int trans = c->trans_b;
    const int64_t m = c->m, n = c->n, k = c->k, lda = k + 3, ldc = n + 2;
    const int64_t w_rows = trans ? n : k, w_cols = trans ? k : n, ldw = w_cols + 5;
    const float alpha = 0.75f, beta = c->beta;
    float *a = floats(m * lda, "a"), *wf = floats(w_rows * ldw, "W widened");
    uint16_t *w = buffer((size_t)(w_rows * ldw) * sizeof(uint16_t), "W bf16");
    float *cw = floats(m * ldc, "c (w16)"), *cb = floats(m * ldc, "c (bf16)"), *c0 = floats(m * ldc, "c before");
    fill_nan(a, m * lda);
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++)
            a[i * lda + p] = c->extremes ? low_bits_value() : (float)rng_uniform(-1, 1);
    for (int64_t r = 0; r < w_rows; r++)
        for (int64_t q = 0; q < ldw; q++) {
            w[r * ldw + q] = q < w_cols ? ddk_f32_to_bf16((float)rng_uniform(-1, 1)) : 0x7fc0u;   /* NaN pad */
            wf[r * ldw + q] = ddk_bf16_to_f32(w[r * ldw + q]);
        }
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < ldc; j++)
            c0[i * ldc + j] = j >= n ? 12345.0f : beta == 0.0f ? NAN : (float)rng_uniform(-1, 1);
    memcpy(cw, c0, (size_t)(m * ldc) * sizeof(float));
    memcpy(cb, c0, (size_t)(m * ldc) * sizeof(float));
    (trans ? be->matmul_w16 : be->matmul_w16_nn)(be, m, n, k, alpha, a, lda, w, ldw, beta, cw, ldc);
    be->matmul_bf16(be, 0, trans, m, n, k, alpha, a, lda, wf, ldw, beta, cb, ldc);
    check(memcmp(cw, cb, (size_t)(m * ldc) * sizeof(float)) == 0,
          "%s differs from matmul_bf16 on the widened W", trans ? "matmul_w16" : "matmul_w16_nn");
    float *ar = floats(m * lda, "a rounded");   /* the values the product takes */
    for (int64_t i = 0; i < m * lda; i++)
        ar[i] = ddk_round_bf16(a[i]);
    expect_product_f64(cw, c0, m, n, k, ldc, alpha, beta, ar, lda, 0, wf, ldw, trans, tol_matmul_bf16);
}

/* rows, H = d; V = 41 with the last row, row 0 and a repeat; the widening is exact */
static void case_embedding_w16(const ddk_backend *be, const op_case *c)
{
    enum { V = 41 };
    const int64_t rows = c->rows, H = c->d;
    uint16_t *table = buffer((size_t)(V * H) * sizeof(uint16_t), "table");
    for (int64_t i = 0; i < V * H; i++)   /* random bit patterns but NaN: every exponent, sign, subnormal */
        do
            table[i] = (uint16_t)ddk_rng_next(&rng_state);
        while ((table[i] & 0x7f80u) == 0x7f80u && (table[i] & 0x007fu));
    int32_t *tokens = int32s(rows, "tokens");
    for (int64_t r = 0; r < rows; r++)
        tokens[r] = (int32_t)(r == 0 ? V - 1 : r == rows - 1 ? 0 : (int64_t)(ddk_rng_next(&rng_state) % V));
    float *out = floats(rows * H, "out");
    fill_nan(out, rows * H);
    be->embedding_w16(be, table, tokens, rows, H, out);
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < H; i++) {
            const uint32_t want = (uint32_t)table[tokens[r] * H + i] << 16;
            uint32_t got;
            memcpy(&got, &out[r * H + i], sizeof got);
            wrong += got != want;
        }
    check(wrong == 0, "%lld values are not their bf16 bits widened", (long long)wrong);
}

/* rows, cols = d; m, n: the padding of src's and dst's rows; exact, dst's padding untouched */
static void case_copy_rows(const ddk_backend *be, const op_case *c)
{
    const int64_t rows = c->rows, cols = c->d, ld_src = cols + c->m, ld_dst = cols + c->n;
    float *src = floats(rows * ld_src + 1, "src"), *dst = floats(rows * ld_dst + 1, "dst");
    fill_uniform(src, rows * ld_src + 1, -1.0, 1.0);
    for (int64_t i = 0; i < rows * ld_dst + 1; i++)
        dst[i] = 777.0f;
    be->copy_rows(be, dst, ld_dst, src, ld_src, rows, cols);
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < ld_dst; j++) {
            const float want = j < cols ? src[r * ld_src + j] : 777.0f;
            wrong += memcmp(&dst[r * ld_dst + j], &want, sizeof want) != 0;
        }
    wrong += dst[rows * ld_dst] != 777.0f;
    check(wrong == 0, "%lld floats wrong (rows %lld cols %lld ld_src %lld ld_dst %lld)", (long long)wrong,
          (long long)rows, (long long)cols, (long long)ld_src, (long long)ld_dst);
    be->copy_rows(be, dst, ld_dst, src, ld_src, 0, cols);   /* nothing to do: no access */
    be->copy_rows(be, dst, ld_dst, src, ld_src, rows, 0);
}

/* T = rows, heads, d, m: the padding of src's rows past heads * d; extremes: in place
 * (ld = heads * d), and one head of zeros (ss = 0: x eps^(-1/2) = 0) */
static void case_l2norm_heads(const ddk_backend *be, const op_case *c)
{
    const int64_t T = c->rows, heads = c->heads, d = c->d, ld = heads * d + c->m, n = T * heads * d;
    const float scale = 1.0f / sqrtf((float)d), eps = 1e-6f;
    float *src = floats(T * ld, "src"), *dst = floats(n, "dst"), *mine = floats(n, "engine's dst");
    fill_uniform(src, T * ld, -2.0, 2.0);
    if (c->extremes)
        fill_zero(src, d);
    fill_nan(dst, n);
    be->l2norm_heads(be, src, ld, T, heads, d, scale, eps, dst);
    engine_l2norm_heads(src, ld, T, heads, d, scale, eps, mine);
    check(memcmp(dst, mine, (size_t)n * sizeof(float)) == 0, "differs from the engine's loop");
    double *want = doubles(n, "dst want");
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + t * ld + h * d;
            double ss = 0.0;
            for (int64_t i = 0; i < d; i++)
                ss += (double)x[i] * x[i];
            for (int64_t i = 0; i < d; i++)
                want[(t * heads + h) * d + i] = x[i] * (double)scale / sqrt(ss + (double)eps);
        }
    expect_close_f("dst", dst, want, n, tol_target_elementwise);
    if (c->extremes && c->m == 0) {
        float *xy = floats(n, "src, then dst (in place)");
        memcpy(xy, src, (size_t)n * sizeof(float));
        be->l2norm_heads(be, xy, ld, T, heads, d, scale, eps, xy);
        check(memcmp(xy, dst, (size_t)n * sizeof(float)) == 0, "in place differs");
    }
}

/* count = rows; gates over [-30, 30] and 0, +-100 (sigmoid 1 and 0) */
static void case_sigmoid_mul(const ddk_backend *be, const op_case *c)
{
    const int64_t n = c->rows;
    float *x = floats(n, "x"), *gate = floats(n, "gate"), *mine = floats(n, "engine's x");
    fill_uniform(x, n, -3.0, 3.0);
    fill_uniform(gate, n, -30.0, 30.0);
    gate[0] = 0.0f;
    if (n > 2)
        gate[1] = 100.0f, gate[2] = -100.0f;
    double *want = doubles(n, "x want");
    for (int64_t i = 0; i < n; i++) {
        want[i] = x[i] / (1.0 + exp(-(double)gate[i]));
        mine[i] = x[i] * engine_sigmoidf(gate[i]);
    }
    be->sigmoid_mul(be, x, gate, n);
    check(memcmp(x, mine, (size_t)n * sizeof(float)) == 0, "differs from the engine's loop");
    expect_close_f("x", x, want, n, tol_target_elementwise);
}

/* T = rows, nv = d; extremes: in place (beta = b, g = a). a + dt_bias over [-30, 30] (past the
 * softplus threshold 20 both ways), A_log over [-3, 2] */
static void case_delta_gates(const ddk_backend *be, const op_case *c)
{
    const int64_t T = c->rows, nv = c->d, n = T * nv;
    float *b = floats(n, "b"), *a = floats(n, "a"), *A_log = floats(nv, "A_log"), *dt_bias = floats(nv, "dt_bias");
    fill_uniform(b, n, -10.0, 10.0);
    fill_uniform(a, n, -25.0, 25.0);
    fill_uniform(A_log, nv, -3.0, 2.0);
    fill_uniform(dt_bias, nv, -5.0, 5.0);
    a[0] = 20.0f - dt_bias[0];   /* at the threshold, give or take the rounding of the sum */
    float *beta = floats(n, "beta"), *g = floats(n, "g");
    float *mb = floats(n, "engine's beta"), *mg = floats(n, "engine's g");
    memcpy(mb, b, (size_t)n * sizeof(float));
    memcpy(mg, a, (size_t)n * sizeof(float));
    engine_delta_gates(mb, mg, A_log, dt_bias, T, nv);
    if (c->extremes) {   /* in place on copies */
        memcpy(beta, b, (size_t)n * sizeof(float));
        memcpy(g, a, (size_t)n * sizeof(float));
        be->delta_gates(be, beta, g, A_log, dt_bias, T, nv, beta, g);
    } else {
        fill_nan(beta, n), fill_nan(g, n);
        be->delta_gates(be, b, a, A_log, dt_bias, T, nv, beta, g);
    }
    check(memcmp(beta, mb, (size_t)n * sizeof(float)) == 0, "beta differs from the engine's loop");
    check(memcmp(g, mg, (size_t)n * sizeof(float)) == 0, "g differs from the engine's loop");
    double *wb = doubles(n, "beta want"), *wg = doubles(n, "g want");
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < nv; j++) {
            const int64_t i = t * nv + j;
            const double s = (double)(a[i] + dt_bias[j]);   /* the float sum, as the op forms it */
            wb[i] = 1.0 / (1.0 + exp(-(double)b[i]));
            wg[i] = -exp((double)A_log[j]) * (s > 20.0 ? s : log1p(exp(s)));
        }
    expect_close_f("beta", beta, wb, n, tol_target_elementwise);
    expect_close_f("g", g, wg, n, tol_target_elementwise);
}

/* float64 causal attention of T query rows at positions S - T .. S - 1 over S keys */
static void ref_causal(const float *q, const float *k, const float *v, int64_t S, int64_t T,
                       int64_t nh, int64_t nkv, int64_t d, double *out)
{
    double *w = doubles(S, "ref weights");
    for (int64_t i = 0; i < T; i++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t p = S - T + i, hk = h / (nh / nkv);
            const float *qi = q + (i * nh + h) * d;
            double max = -INFINITY, sum = 0.0;
            for (int64_t t = 0; t <= p; t++) {
                double s = 0.0;
                for (int64_t e = 0; e < d; e++)
                    s += (double)qi[e] * k[(t * nkv + hk) * d + e];
                w[t] = s / sqrt((double)d);
                max = fmax(max, w[t]);
            }
            for (int64_t t = 0; t <= p; t++)
                sum += w[t] = exp(w[t] - max);
            for (int64_t e = 0; e < d; e++) {
                double o = 0.0;
                for (int64_t t = 0; t <= p; t++)
                    o += w[t] * v[(t * nkv + hk) * d + e];
                out[(i * nh + h) * d + e] = o / sum;
            }
        }
}

/* S = rows, nh = heads, nkv = k, d: q_rows 1, 5 and S against the prefill's last rows and the
 * float64 reference; q_rows = S is the prefill bit for bit; q_rows > S and < 0 refused */
static void case_causal_cached(const ddk_backend *be, const op_case *c)
{
    const int64_t S = c->rows, nh = c->heads, nkv = c->k, d = c->d;
    const int64_t nq = S * nh * d, nk = S * nkv * d;
    float *q = floats(nq, "q"), *k = floats(nk, "k"), *v = floats(nk, "v"), *full = floats(nq, "prefill out");
    fill_uniform(q, nq, -2.0, 2.0);
    fill_uniform(k, nk, -2.0, 2.0);
    fill_uniform(v, nk, -1.0, 1.0);
    fill_nan(full, nq);
    const ddk_attention_shape prefill = { .S = S, .nh = nh, .nkv = nkv, .d = d };
    check(be->causal_attention(be, &prefill, q, k, v, full) == 0, "the prefill failed");
    const int64_t q_rows[] = { 1, 5, S };
    for (size_t j = 0; j < sizeof q_rows / sizeof q_rows[0]; j++) {
        const int64_t T = q_rows[j], rows = T * nh * d;
        const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = T };
        float *out = floats(rows, "cached out");
        fill_nan(out, rows);
        int rc = be->causal_attention(be, &sh, q + (S - T) * nh * d, k, v, out);
        check(rc == 0, "q_rows %lld: rc %d", (long long)T, rc);
        char what[96];
        snprintf(what, sizeof what, "q_rows %lld vs the prefill's last rows", (long long)T);
        expect_close_f(what, out, to_doubles(full + (S - T) * nh * d, rows, "prefill rows"), rows,
                       tol_causal_cached);
        double *want = doubles(rows, "reference out");
        ref_causal(q + (S - T) * nh * d, k, v, S, T, nh, nkv, d, want);
        snprintf(what, sizeof what, "q_rows %lld vs float64", (long long)T);
        expect_close_f(what, out, want, rows, tol_causal_ref);
        if (T == S)
            check(memcmp(out, full, (size_t)nq * sizeof(float)) == 0, "q_rows = S differs from the prefill");
    }
    const int64_t bad[] = { S + 1, -1 };
    for (int j = 0; j < 2; j++) {
        const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = bad[j] };
        check(be->causal_attention(be, &sh, q, k, v, full) == -EINVAL, "q_rows %lld not refused",
              (long long)bad[j]);
    }
}

static void case_zero(const ddk_backend *be, const op_case *c)
{
    (void)c;   /* one case, no parameters */
    unsigned char *mem = buffer(BYTES, "memory");
    for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++) {
        memset(mem, 0xa5, BYTES);
        be->zero(be, mem + spans[s].offset, spans[s].bytes);
        size_t wrong = 0;
        for (size_t i = 0; i < BYTES; i++) {
            int inside = i >= spans[s].offset && i < spans[s].offset + spans[s].bytes;
            wrong += mem[i] != (inside ? 0x00 : 0xa5);
        }
        check(wrong == 0, "zero(+%zu, %zu bytes): %zu bytes wrong", spans[s].offset,
              spans[s].bytes, wrong);
    }
}

static void case_copy(const ddk_backend *be, const op_case *c)
{
    (void)c;   /* one case, no parameters */
    unsigned char *src = buffer(BYTES, "src"), *dst = buffer(BYTES, "dst");
    for (size_t i = 0; i < BYTES; i++)
        src[i] = (unsigned char)ddk_rng_next(&rng_state);
    for (size_t s = 0; s < sizeof(spans) / sizeof(spans[0]); s++) {
        const size_t at = spans[s].offset, bytes = spans[s].bytes;
        const size_t from = (at + 11) % (BYTES - bytes + 1);   /* another alignment than dst's */
        memset(dst, 0xa5, BYTES);
        be->copy(be, dst + at, src + from, bytes);
        size_t wrong = 0;
        for (size_t i = 0; i < BYTES; i++)
            wrong += dst[i] != (i >= at && i < at + bytes ? src[from + i - at] : 0xa5);
        check(wrong == 0, "copy(+%zu <- +%zu, %zu bytes): %zu bytes wrong", at, from, bytes,
              wrong);
    }
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

enum { MAX_CASES = 384 };
static op_case cases[MAX_CASES];
static int case_count;

static op_case *add_case(void (*run)(const ddk_backend *, const op_case *))
{
    if (case_count == MAX_CASES) {
        fprintf(stderr, "test_ops: more than %d cases\n", MAX_CASES);
        abort();
    }
    op_case *c = &cases[case_count++];
    memset(c, 0, sizeof(*c));
    c->run = run;
    return c;
}

/* A bf16 product's cases at each k of ks in all four transposes: m = 5..8, n = 7, alpha 0.75,
 * beta 0 (over a NaN c) and -1.5 alternating */
static void add_transposed_cases(void (*run)(const ddk_backend *, const op_case *), const char *op,
                                 const int64_t *ks, size_t count)
{
    for (size_t j = 0; j < count; j++)
        for (int t = 0; t < 4; t++) {
            op_case *c = add_case(run);
            c->m = 5 + t, c->n = 7, c->k = ks[j];
            c->trans_a = t >> 1, c->trans_b = t & 1;
            c->beta = (t + (int)j) % 2 ? 0.0f : -1.5f;
            snprintf(c->name, sizeof(c->name), "%s %c%c m=%lld n=%lld k=%lld alpha=0.75 beta=%g", op,
                     c->trans_a ? 'T' : 'N', c->trans_b ? 'T' : 'N', (long long)c->m,
                     (long long)c->n, (long long)c->k, c->beta);
        }
}

static void build_cases(void)
{
    static const int64_t rows[] = { 1, 3, 17, 64 };
    static const int64_t dims[] = { 1, 2, 6, 8, 64, 130 };
    enum { nrows = sizeof(rows) / sizeof(rows[0]), ndims = sizeof(dims) / sizeof(dims[0]) };
    op_case *c;

    for (int j = 0; j < ndims; j++)
        for (int i = 0; i < nrows; i++) {
            c = add_case(case_rmsnorm);
            c->rows = rows[i], c->d = dims[j];
            /* at d = 1, dx = g dy eps / (x^2 + eps)^(3/2) is all cancellation: with eps = 1e-6
             * it sits at float rounding of its two terms; eps = 0.5 keeps it checkable */
            c->eps = dims[j] == 1 ? 0.5f : 1e-6f;
            snprintf(c->name, sizeof(c->name), "rmsnorm rows=%lld d=%lld eps=%g",
                     (long long)c->rows, (long long)c->d, c->eps);
        }
    c = add_case(case_rmsnorm_extremes);
    c->d = 130, c->eps = 1e-6f;
    snprintf(c->name, sizeof(c->name), "rmsnorm d=130 rows of 0, 1e20, 1e-20, a 1e4 spike, 1e15");

    for (int j = 1; j < ndims; j++)   /* d even */
        for (int i = 0; i < nrows; i++)
            for (int64_t heads = 1; heads <= 3; heads += 2) {
                c = add_case(case_rope);
                c->rows = rows[i], c->heads = heads, c->d = dims[j];
                c->theta = (i + heads / 3) % 2 ? 1e6f : 1e4f;
                snprintf(c->name, sizeof(c->name), "rope rows=%lld heads=%lld d=%lld theta=%g",
                         (long long)c->rows, (long long)heads, (long long)c->d, c->theta);
            }

    static const int64_t counts[][2] = { { 1, 1 }, { 3, 1 }, { 17, 6 }, { 3, 130 }, { 64, 130 } };
    for (size_t j = 0; j < sizeof(counts) / sizeof(counts[0]); j++) {
        c = add_case(case_swiglu);
        c->rows = counts[j][0], c->d = counts[j][1];
        snprintf(c->name, sizeof(c->name), "swiglu count=%lld", (long long)(c->rows * c->d));
    }
    c = add_case(case_swiglu);
    c->rows = 4, c->d = 12, c->extremes = 1;
    snprintf(c->name, sizeof(c->name), "swiglu count=48 gates 0, +-20, +-88.8, +-100, +-1000");

    static const int64_t embeddings[][2] = { { 1, 1 }, { 3, 2 }, { 17, 130 }, { 64, 64 }, { 64, 6 } };
    for (size_t j = 0; j < sizeof(embeddings) / sizeof(embeddings[0]); j++) {
        c = add_case(case_embedding);
        c->rows = embeddings[j][0], c->d = embeddings[j][1];
        snprintf(c->name, sizeof(c->name), "embedding V=41 rows=%lld H=%lld", (long long)c->rows,
                 (long long)c->d);
    }

    static const int64_t mnk[][3] = { { 1, 1, 1 }, { 3, 5, 7 }, { 17, 130, 64 }, { 64, 6, 130 } };
    for (size_t j = 0; j < sizeof(mnk) / sizeof(mnk[0]); j++)
        for (int t = 0; t < 4; t++) {
            c = add_case(case_matmul);
            c->m = mnk[j][0], c->n = mnk[j][1], c->k = mnk[j][2];
            c->trans_a = t >> 1, c->trans_b = t & 1;
            c->beta = j == 1 ? 0.0f : -1.5f;
            snprintf(c->name, sizeof(c->name),
                     "matmul %c%c m=%lld n=%lld k=%lld alpha=0.75 beta=%g", c->trans_a ? 'T' : 'N',
                     c->trans_b ? 'T' : 'N', (long long)c->m, (long long)c->n, (long long)c->k,
                     c->beta);
        }

    /* matmul_bf16: k = 1, either side of the 256-column panel, 700 (three panels, the last
     * short); beta 0 (c NaN) for the first transpose pair, -1.5 for the others; k = 0 */
    static const int64_t ks[] = { 1, 255, 256, 257, 700 };
    add_transposed_cases(case_matmul_bf16, "matmul_bf16", ks, sizeof(ks) / sizeof(ks[0]));
    for (int j = 0; j < 2; j++) {
        c = add_case(case_matmul_bf16);
        c->m = 4, c->n = 3, c->k = 0, c->trans_a = j, c->beta = j ? 0.0f : -1.5f;
        snprintf(c->name, sizeof(c->name), "matmul_bf16 %cN k=0 beta=%g: c = beta c",
                 j ? 'T' : 'N', c->beta);
    }
    c = add_case(case_matmul_bf16);
    c->m = 9, c->n = 11, c->k = 300, c->trans_b = 1, c->beta = 0.0f, c->extremes = 1;
    snprintf(c->name, sizeof(c->name),
             "matmul_bf16 NT m=9 n=11 k=300 low mantissa bits: rounded, unlike fp32");

    static const int64_t lengths[] = { 0, 1, 7, 8, 9, 1001 };
    for (size_t j = 0; j < sizeof(lengths) / sizeof(lengths[0]); j++) {
        c = add_case(case_sumsq);
        c->rows = lengths[j];
        snprintf(c->name, sizeof(c->name), "sumsq count=%lld", (long long)c->rows);
    }
    c = add_case(case_sumsq);
    c->rows = 1001, c->extremes = 1;
    snprintf(c->name, sizeof(c->name), "sumsq count=1001 values of 1e20 (x^2 past float)");

    static const int64_t axpby_lengths[] = { 0, 1, 7, 1001 };
    for (size_t j = 0; j < sizeof(axpby_lengths) / sizeof(axpby_lengths[0]); j++) {
        c = add_case(case_axpby);
        c->rows = axpby_lengths[j];
        snprintf(c->name, sizeof(c->name),
                 "axpby count=%lld: beta 0 over NaN, beta 1.3, in place", (long long)c->rows);
    }

    static const struct { int64_t count; float grad_scale, decay; } adamw[] = {
        { 301, 1.0f, 0.1f }, { 301, 0.37f, 0.0f }, { 300, 0.37f, 0.1f }, { 1, 2.5f, 0.1f },
        { 5000, 0.37f, 0.1f },   /* past the CPU's 4096-float block of the update and its bf16 copy */
    };
    for (size_t j = 0; j < sizeof(adamw) / sizeof(adamw[0]); j++) {
        c = add_case(case_adamw);
        c->rows = adamw[j].count, c->grad_scale = adamw[j].grad_scale, c->decay = adamw[j].decay;
        snprintf(c->name, sizeof(c->name), "adamw count=%lld grad_scale=%g weight_decay=%g (lr_wd %s)",
                 (long long)c->rows, c->grad_scale, c->decay, c->decay > 0.0f ? "on" : "off");
    }

    for (int64_t tile = 0; tile <= 256; tile += 256) {
        c = add_case(case_loss_bf16_exact);
        c->vocab_tile = tile;
        snprintf(c->name, sizeof(c->name),
                 "loss bf16_products=1 vocab_tile=%lld, bf16 operands: = fp32 loss, grad to 2^-7",
                 (long long)tile);
        c = add_case(case_loss_bf16_rounds);
        c->vocab_tile = tile;
        snprintf(c->name, sizeof(c->name),
                 "loss bf16_products=1 vocab_tile=%lld, fp32 operands: rounded, within bf16 bound",
                 (long long)tile);
    }
    c = add_case(case_loss_bf16_refused);
    snprintf(c->name, sizeof(c->name), "loss bf16_products=2 and -1 refused, nothing written");

    /* the Qwen3.5 target's ops */
    static const int64_t conv[][3] = { { 1, 1, 1 }, { 1, 3, 4 }, { 7, 5, 4 }, { 17, 130, 4 }, { 9, 6, 2 }, { 33, 3, 5 } };
    for (size_t j = 0; j < sizeof(conv) / sizeof(conv[0]); j++)
        for (int history = 0; history <= 1; history++) {
            c = add_case(case_conv1d_silu);
            c->rows = conv[j][0], c->d = conv[j][1], c->k = conv[j][2], c->extremes = history;
            snprintf(c->name, sizeof(c->name), "conv1d_silu T=%lld C=%lld K=%lld%s", (long long)c->rows,
                     (long long)c->d, (long long)c->k, history ? " history" : "");
        }
    static const int64_t gnorm[][2] = { { 1, 1 }, { 3, 16 }, { 17, 130 }, { 64, 6 } };
    for (size_t j = 0; j < sizeof(gnorm) / sizeof(gnorm[0]); j++) {
        c = add_case(case_gated_rmsnorm);
        c->rows = gnorm[j][0], c->d = gnorm[j][1], c->eps = gnorm[j][1] == 1 ? 0.5f : 1e-6f;
        snprintf(c->name, sizeof(c->name), "gated_rmsnorm rows=%lld d=%lld", (long long)c->rows, (long long)c->d);
    }
    static const int64_t partial[][4] = { { 1, 1, 2, 2 }, { 3, 3, 32, 8 }, { 17, 2, 64, 64 }, { 17, 1, 130, 34 }, { 5, 3, 6, 4 } };
    for (size_t j = 0; j < sizeof(partial) / sizeof(partial[0]); j++) {
        c = add_case(case_rope_partial);
        c->rows = partial[j][0], c->heads = partial[j][1], c->d = partial[j][2], c->m = partial[j][3];
        c->theta = j % 2 ? 1e7f : 1e4f;
        snprintf(c->name, sizeof(c->name), "rope_partial rows=%lld heads=%lld d=%lld rd=%lld theta=%g",
                 (long long)c->rows, (long long)c->heads, (long long)c->d, (long long)c->m, c->theta);
    }
    static const int64_t delta[][6] = {   /* T, nk, nv, dk, dv, strong decays */
        { 1, 1, 1, 1, 1, 0 }, { 7, 2, 4, 5, 3, 0 }, { 70, 2, 6, 16, 16, 0 }, { 130, 1, 2, 8, 7, 1 },
        { 200, 2, 4, 32, 16, 1 }, { 65, 3, 3, 4, 9, 0 },
    };
    for (size_t j = 0; j < sizeof(delta) / sizeof(delta[0]); j++) {
        c = add_case(case_gated_delta);
        c->rows = delta[j][0], c->heads = delta[j][1], c->m = delta[j][2], c->d = delta[j][3];
        c->n = delta[j][4], c->extremes = (int)delta[j][5];
        snprintf(c->name, sizeof(c->name), "gated_delta T=%lld nk=%lld nv=%lld dk=%lld dv=%lld decays %s",
                 (long long)c->rows, (long long)c->heads, (long long)c->m, (long long)c->d, (long long)c->n,
                 c->extremes ? "to 0.06" : "0.5..0.9997");
    }

    /* the frozen target on bf16 weights, its row plumbing and element-wise steps */
    static const int64_t w16[][3] = { { 1, 1, 1 }, { 5, 7, 255 }, { 6, 7, 256 }, { 7, 3, 257 }, { 9, 11, 700 }, { 4, 3, 0 } };
    for (int trans = 1; trans >= 0; trans--) {   /* matmul_w16 (W^T), then matmul_w16_nn (W) */
        const char *op = trans ? "matmul_w16" : "matmul_w16_nn";
        for (size_t j = 0; j < sizeof(w16) / sizeof(w16[0]); j++) {
            c = add_case(case_matmul_w16);
            c->m = w16[j][0], c->n = w16[j][1], c->k = w16[j][2], c->beta = j % 2 ? 0.0f : -1.5f;
            c->trans_b = trans;
            snprintf(c->name, sizeof(c->name), "%s m=%lld n=%lld k=%lld alpha=0.75 beta=%g", op,
                     (long long)c->m, (long long)c->n, (long long)c->k, c->beta);
        }
        c = add_case(case_matmul_w16);
        c->m = 9, c->n = 11, c->k = 300, c->beta = 0.0f, c->extremes = 1, c->trans_b = trans;
        snprintf(c->name, sizeof(c->name), "%s m=9 n=11 k=300 a with low mantissa bits: rounded", op);
    }
    static const int64_t emb16[][2] = { { 1, 1 }, { 3, 2 }, { 17, 130 }, { 64, 6 } };
    for (size_t j = 0; j < sizeof(emb16) / sizeof(emb16[0]); j++) {
        c = add_case(case_embedding_w16);
        c->rows = emb16[j][0], c->d = emb16[j][1];
        snprintf(c->name, sizeof(c->name), "embedding_w16 V=41 rows=%lld H=%lld", (long long)c->rows,
                 (long long)c->d);
    }
    static const int64_t crow[][4] = { { 1, 1, 0, 0 }, { 3, 5, 2, 0 }, { 17, 130, 0, 7 }, { 9, 64, 70, 3 } };
    for (size_t j = 0; j < sizeof(crow) / sizeof(crow[0]); j++) {
        c = add_case(case_copy_rows);
        c->rows = crow[j][0], c->d = crow[j][1], c->m = crow[j][2], c->n = crow[j][3];
        snprintf(c->name, sizeof(c->name), "copy_rows rows=%lld cols=%lld ld_src=+%lld ld_dst=+%lld",
                 (long long)c->rows, (long long)c->d, (long long)c->m, (long long)c->n);
    }
    static const int64_t l2[][5] = {   /* T, heads, d, ld padding, in place + a zero head */
        { 1, 1, 1, 0, 0 }, { 7, 3, 5, 4, 0 }, { 33, 4, 128, 256, 0 }, { 17, 2, 257, 0, 1 }, { 5, 16, 128, 0, 1 },
    };
    for (size_t j = 0; j < sizeof(l2) / sizeof(l2[0]); j++) {
        c = add_case(case_l2norm_heads);
        c->rows = l2[j][0], c->heads = l2[j][1], c->d = l2[j][2], c->m = l2[j][3], c->extremes = (int)l2[j][4];
        snprintf(c->name, sizeof(c->name), "l2norm_heads T=%lld heads=%lld d=%lld ld=+%lld%s",
                 (long long)c->rows, (long long)c->heads, (long long)c->d, (long long)c->m,
                 c->extremes ? " zero head, in place" : "");
    }
    static const int64_t sig[] = { 1, 3, 1001 };
    for (size_t j = 0; j < sizeof(sig) / sizeof(sig[0]); j++) {
        c = add_case(case_sigmoid_mul);
        c->rows = sig[j];
        snprintf(c->name, sizeof(c->name), "sigmoid_mul count=%lld", (long long)c->rows);
    }
    static const int64_t gates[][3] = { { 1, 1, 0 }, { 17, 48, 0 }, { 64, 32, 1 }, { 3, 5, 1 } };
    for (size_t j = 0; j < sizeof(gates) / sizeof(gates[0]); j++) {
        c = add_case(case_delta_gates);
        c->rows = gates[j][0], c->d = gates[j][1], c->extremes = (int)gates[j][2];
        snprintf(c->name, sizeof(c->name), "delta_gates T=%lld nv=%lld%s", (long long)c->rows,
                 (long long)c->d, c->extremes ? " in place" : "");
    }
    static const int64_t cached[][4] = { { 70, 4, 2, 16 }, { 70, 3, 3, 64 }, { 5, 2, 1, 8 }, { 200, 2, 1, 32 } };
    for (size_t j = 0; j < sizeof(cached) / sizeof(cached[0]); j++) {
        c = add_case(case_causal_cached);
        c->rows = cached[j][0], c->heads = cached[j][1], c->k = cached[j][2], c->d = cached[j][3];
        snprintf(c->name, sizeof(c->name), "causal_attention S=%lld nh=%lld nkv=%lld d=%lld q_rows 1, 5, S",
                 (long long)c->rows, (long long)c->heads, (long long)c->k, (long long)c->d);
    }

    c = add_case(case_zero);
    snprintf(c->name, sizeof(c->name), "zero 0..5000 bytes at odd offsets");
    c = add_case(case_copy);
    snprintf(c->name, sizeof(c->name), "copy 0..5000 bytes at odd offsets");

    /* the bf16 step's products (appended, so that the cases above keep their seeds): matmul_16 at
     * k = 1, below the 256-column panel, at it, either side past it and over three panels; beta
     * 0 (c NaN) and -1.5 alternating; k = 0; an empty c */
    static const int64_t ks16[] = { 1, 100, 256, 257, 300, 700 };
    add_transposed_cases(case_matmul_16, "matmul_16", ks16, sizeof(ks16) / sizeof(ks16[0]));
    for (int j = 0; j < 2; j++) {
        c = add_case(case_matmul_16);
        c->m = 4, c->n = 3, c->k = 0, c->trans_a = j, c->trans_b = j, c->beta = j ? 0.0f : -1.5f;
        snprintf(c->name, sizeof(c->name), "matmul_16 %c%c k=0 beta=%g: c = beta c",
                 j ? 'T' : 'N', j ? 'T' : 'N', c->beta);
    }
    static const int64_t empty16[][2] = { { 0, 7 }, { 5, 0 } };
    for (int j = 0; j < 2; j++) {
        c = add_case(case_matmul_16);
        c->m = empty16[j][0], c->n = empty16[j][1], c->k = 300, c->trans_a = j, c->beta = -1.5f;
        snprintf(c->name, sizeof(c->name), "matmul_16 %cN m=%lld n=%lld k=300: nothing written",
                 j ? 'T' : 'N', (long long)c->m, (long long)c->n);
    }
    static const int64_t rounds[] = { 0, 1, ROUND_EDGES, ROUND_EDGES + ((int64_t)16 << 16) };
    for (size_t j = 0; j < sizeof(rounds) / sizeof(rounds[0]); j++) {
        c = add_case(case_round_bf16);
        c->rows = rounds[j];
        snprintf(c->name, sizeof(c->name), "round_bf16 count=%lld%s", (long long)c->rows,
                 j == 2 ? ": ties, +-0, subnormals, +-inf, FLT_MAX to inf, NaN"
                 : j == 3 ? ": and every high half with 16 low halves" : "");
    }
    static const int64_t swiglu16[][2] = { { 1, 1 }, { 17, 6 }, { 64, 130 } };
    for (size_t j = 0; j < sizeof(swiglu16) / sizeof(swiglu16[0]); j++) {
        c = add_case(case_swiglu_16);
        c->rows = swiglu16[j][0], c->d = swiglu16[j][1];
        snprintf(c->name, sizeof(c->name), "swiglu_16 + backward count=%lld: swiglu's bits on the widened values",
                 (long long)(c->rows * c->d));
    }

    /* matmul at k = 0 (appended, so that the cases above keep their seeds): c = beta c exactly,
     * 0 over NaN for beta = 0, as matmul_bf16's k = 0 cases above */
    for (int j = 0; j < 2; j++) {
        c = add_case(case_matmul);
        c->m = 4, c->n = 3, c->k = 0, c->trans_a = j, c->trans_b = j, c->beta = j ? 0.0f : -1.5f;
        snprintf(c->name, sizeof(c->name), "matmul %c%c k=0 beta=%g: c = beta c", j ? 'T' : 'N',
                 j ? 'T' : 'N', c->beta);
    }

    /* the DFlash2 drafter's block convolution (appended, so that the cases above keep their
     * seeds): taps 1, 2, 3 (and more taps than slots), gs 1, gs = H and the drafters' 16, B 1
     * (only tap 0 has a term) and several blocks, either side of the projection's row (delta at
     * an offset, ld_delta = 2 taps G, or wider), dx NULL */
    static const struct { int64_t rows, B, H, taps, gs, ld_pad; int side, no_dx; } convs[] = {
        { 1, 1, 1, 1, 1, 0, 0, 0 },    { 5, 1, 8, 2, 4, 0, 1, 0 },     { 12, 4, 16, 2, 16, 0, 1, 0 },
        { 20, 5, 12, 2, 1, 3, 1, 0 },  { 48, 16, 64, 2, 16, 0, 1, 0 }, { 48, 16, 64, 2, 16, 5, 0, 0 },
        { 24, 6, 30, 3, 5, 2, 0, 0 },  { 12, 2, 8, 3, 2, 1, 1, 0 },    { 20, 5, 12, 2, 3, 0, 1, 1 },
        { 9, 3, 7, 1, 7, 4, 1, 1 },
    };
    for (size_t j = 0; j < sizeof(convs) / sizeof(convs[0]); j++) {
        c = add_case(case_block_conv);
        c->rows = convs[j].rows, c->block = convs[j].B, c->d = convs[j].H, c->taps = convs[j].taps;
        c->gs = convs[j].gs, c->ld_pad = convs[j].ld_pad, c->side = convs[j].side, c->no_dx = convs[j].no_dx;
        snprintf(c->name, sizeof(c->name),
                 "block_conv + backward rows=%lld B=%lld H=%lld taps=%lld gs=%lld side %d ld=2tG+%lld%s",
                 (long long)c->rows, (long long)c->block, (long long)c->d, (long long)c->taps,
                 (long long)c->gs, c->side, (long long)c->ld_pad, c->no_dx ? " dx NULL" : "");
    }
}

int main(void)
{
    const char *v = getenv("DDTREE_OPS_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const ddk_backend *be = ddk_backend_cpu();

    /* the CPU backend is complete: without that no case below can run */
    check(be != NULL && be->rmsnorm && be->rmsnorm_backward && be->rope && be->swiglu &&
              be->swiglu_backward && be->embedding && be->matmul && be->zero && be->copy &&
              be->synchronize && be->sumsq && be->axpby && be->adamw && be->matmul_bf16 &&
              be->loss && be->conv1d_silu && be->gated_rmsnorm && be->rope_partial && be->gated_delta &&
              be->matmul_w16 && be->matmul_w16_nn && be->embedding_w16 && be->copy_rows && be->l2norm_heads &&
              be->sigmoid_mul && be->delta_gates && be->causal_attention && be->matmul_16 &&
              be->round_bf16 && be->block_conv && be->block_conv_backward,
          "an op of the CPU backend is NULL");
    case_done("cpu backend has every op tested here");
    if (cases_failed)
        return cases_summary();

    build_cases();
    for (int j = 0; j < case_count; j++) {
        rng_state = 0x5eed0000u + (uint64_t)j;   /* each case reproducible on its own */
        cases[j].run(be, &cases[j]);
        release_buffers();   /* its guard checks belong to the case */
        case_done(cases[j].name);
    }
    return cases_summary();
}
