/* test_attention.c: the CPU backend's DFlash attention (forward, backward), causal attention and
 * tree attention (SPEC.md section 2 step 4, sections 3 and 7; contracts in ddk.h, struct
 * ddk_backend).
 *
 * What it checks:
 *   - a table of DFlash cases against a float64 reference that builds the explicit dense
 *     visibility mask of SPEC.md (allowed here, never in the library): out, lse, and dq, dk, dv
 *     from the analytic softmax backward in double; GQA ratios 1, 2, 4; d 4, 8, 64; B 1, 3, 5,
 *     16; A 1..6 (and 50, several query groups); sliding windows smaller than the block, larger
 *     than S, full layers; DFlash2's bidirectional blocks (every slot of the own block also in
 *     a sliding layer, the window still on the context; in a full layer the same); overlapping
 *     anchors, anchors at 0 and at S-1; padded blocks (out and lse exactly 0, their dq exactly
 *     0, their own keys' dk, dv exactly 0; their anchors are out of range, so reading one would
 *     show); S past the key tile with tile boundaries inside a block's context; unsorted
 *     anchors (not promised by ddk.h, but the kernel's result does not depend on order, only
 *     its speed);
 *   - guard words after every output (no write out of bounds); the backward ADDS (called twice
 *     it gives twice the gradients);
 *   - the backward against central finite differences of sum(out * R) in float32, through the
 *     library's own forward (checks the gradient formulas independently of the reference);
 *   - causal attention against a float64 reference, T not a multiple of the key tile;
 *   - tree attention against a float64 reference of the tree's mask (random trees, parents in
 *     [-1, i); GQA 2, 4 and 1; no cache and a cache past a key tile; paths longer than a key
 *     tile), a chain tree against causal attention (1e-5), and its refusals (bad parents, N
 *     outside [1, S], bad heads or d: -EINVAL, nothing written);
 *   - the CUDA flash kernels' row rules (kernels/cuda/attention_rows.h, compiled here for the
 *     CPU): the keys each DFlash (bidirectional or not) and causal query row sees, key by key
 *     against reference_mask's SPEC.md rules, and their bounds nondecreasing in the row (the
 *     kernels' tile ranges);
 *   - workspace over budget: -ENOMEM and nothing written; bad shapes: -EINVAL, nothing written;
 *     the workspace does not grow with S or A (no dense matrix).
 * What it does not: speed and memory figures (tests/bench/bench_attention.c), the CUDA backend.
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 * Legend: S context rows, A anchors (blocks), B block size, nh query heads, nkv kv heads,
 * G = nh / nkv, d head dim, W sliding window (0: full), T causal length, N tree nodes.
 * q (A*B, nh, d); k, v (S + A*B, nkv, d); out (A*B, nh, d); lse (A*B, nh).
 */
#include "ddk.h"
#include "check.h"
#include "ddk_rng.h"
#include "../../kernels/cuda/attention_rows.h"   /* the CUDA flash kernels' row rules, host side */

#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Helpers
 */


/* uniform in [-1, 1), from ddk_rng.h's generator */
static float rng_sym(uint64_t *state)
{
    return (float)(2.0 * ddk_rng_uniform(state) - 1.0);
}

/* ------------------------------------------------------------------------------------------
 * Tolerances: bounds on float32 error, each with its reason.
 */

/* out: a score is a d-term float dot product (d <= 64: relative error ~1e-6 of |s| <= ~10),
 * ddk_expf adds 2e-7; out is a convex combination of v rows, so errors stay relative to max |v| */
static const double out_tol = 1e-5;
/* lse = max + log(sum): the same score error, absolute, plus float rounding of a value ~10 */
static const double lse_rel = 2e-5, lse_abs = 2e-5;
/* dq, dk, dv (normalised): p recomputed from the float lse, ds = p (dp - D) subtracts two
 * O(max|dp|) numbers, and dk, dv sum over up to A*B*G rows in float */
static const double grad_tol = 5e-5;
/* calling the backward twice: the second call adds the same terms onto the first result, so
 * only the order of float additions differs (a few ulp of the gradient's size) */
static const double twice_tol = 1e-5;
/* finite differences in float32 with step 1e-2: truncation h^2 f''' ~1e-4, rounding of f
 * (a float sum of ~500 terms) ~1e-6 / 2h ~1e-4; analytic gradients are O(0.1..1) */
static const double fd_abs = 2e-3, fd_rel = 2e-2;

/* ------------------------------------------------------------------------------------------
 * The float64 reference: an explicit dense mask, as SPEC.md states the rules.
 */

/* mask (A*B, S + A*B): 1 where query (j, o) sees key t */
static unsigned char *reference_mask(const ddk_attention_shape *sh, const int32_t *anchors,
                                     const uint8_t *keep)
{
    const int64_t S = sh->S, A = sh->A, B = sh->B, W = sh->window, keys = S + A * B;
    unsigned char *mask = xcalloc((size_t)(A * B * keys), 1);
    for (int64_t j = 0; j < A; j++) {
        if (!keep[j])
            continue;
        for (int64_t o = 0; o < B; o++) {
            unsigned char *row = mask + (j * B + o) * keys;   /* (keys) */
            for (int64_t t = 0; t < S; t++)
                row[t] = t < anchors[j] && (W == 0 || t >= anchors[j] + o - (W - 1));
            for (int64_t o2 = 0; o2 < B; o2++)
                row[S + j * B + o2] = W == 0 || sh->bidirectional || o2 <= o;
        }
    }
    return mask;
}

/* Attention of nq query rows over nk keys with a dense mask (nq, nk), in double.
 * q (nq, nh, d); k, v (nk, nkv, d); out (nq, nh, d); lse (nq, nh) or NULL; rows with no
 * visible key get 0. With dout: dq (nq, nh, d), dk, dv (nk, nkv, d) += the analytic backward. */
static void reference_attention(int64_t nq, int64_t nk, int64_t nh, int64_t nkv, int64_t d,
                                const float *q, const float *k, const float *v,
                                const unsigned char *mask, double *out, double *lse,
                                const float *dout, double *dq, double *dk, double *dv)
{
    const int64_t G = nh / nkv;
    const double scale = 1.0 / sqrt((double)d);
    double *p = xcalloc((size_t)nk, sizeof(double));    /* (nk) */
    double *dp = xcalloc((size_t)nk, sizeof(double));   /* (nk) */
    for (int64_t i = 0; i < nq; i++)
        for (int64_t h = 0; h < nh; h++) {
            const int64_t hk = h / G;
            const float *qi = q + (i * nh + h) * d;   /* (d) */
            double *oi = out + (i * nh + h) * d;      /* (d) */
            double mx = -INFINITY;
            for (int64_t t = 0; t < nk; t++)
                if (mask[i * nk + t]) {
                    double s = 0.0;
                    for (int64_t c = 0; c < d; c++)
                        s += (double)qi[c] * k[(t * nkv + hk) * d + c];
                    p[t] = s * scale;
                    mx = fmax(mx, p[t]);
                }
            for (int64_t c = 0; c < d; c++)
                oi[c] = 0.0;
            if (lse)
                lse[i * nh + h] = 0.0;
            if (mx == -INFINITY)
                continue;
            double sum = 0.0;
            for (int64_t t = 0; t < nk; t++)
                if (mask[i * nk + t])
                    sum += (p[t] = exp(p[t] - mx));
            for (int64_t t = 0; t < nk; t++)
                if (mask[i * nk + t]) {
                    p[t] /= sum;
                    for (int64_t c = 0; c < d; c++)
                        oi[c] += p[t] * v[(t * nkv + hk) * d + c];
                }
            if (lse)
                lse[i * nh + h] = mx + log(sum);
            if (!dout)
                continue;
            /* dv_t += p_t dout; dp_t = dout . v_t; ds_t = p_t (dp_t - sum_t' p_t' dp_t') */
            const float *gi = dout + (i * nh + h) * d;   /* (d) */
            double D = 0.0;
            for (int64_t t = 0; t < nk; t++)
                if (mask[i * nk + t]) {
                    dp[t] = 0.0;
                    for (int64_t c = 0; c < d; c++) {
                        dp[t] += (double)gi[c] * v[(t * nkv + hk) * d + c];
                        dv[(t * nkv + hk) * d + c] += p[t] * gi[c];
                    }
                    D += p[t] * dp[t];
                }
            for (int64_t t = 0; t < nk; t++)
                if (mask[i * nk + t]) {
                    const double ds = p[t] * (dp[t] - D) * scale;
                    for (int64_t c = 0; c < d; c++) {
                        dq[(i * nh + h) * d + c] += ds * k[(t * nkv + hk) * d + c];
                        dk[(t * nkv + hk) * d + c] += ds * qi[c];
                    }
                }
        }
    free(p), free(dp);
}

/* ------------------------------------------------------------------------------------------
 * DFlash cases
 */

enum { max_anchors = 64 };
enum { ANCHORS_GIVEN, ANCHORS_RANDOM };   /* the table's list; sorted random in [0, S) */

typedef struct {
    const char *name;
    int64_t S, A, B, nh, nkv, d, window;
    int anchor_mode;
    int32_t anchors[8];   /* ANCHORS_GIVEN: the first A */
    uint8_t pad[8];       /* 1: block padded (keep = 0); absent: all kept */
    float q_scale;        /* scores are about this large: peaked or flat softmax */
} attn_case;

static const attn_case table[] = {
    { "A=1 B=1 full, no context", 8, 1, 1, 1, 1, 4, 0, ANCHORS_GIVEN, { 0 }, { 0 }, 1 },
    { "A=1 B=5 full", 12, 1, 5, 2, 1, 8, 0, ANCHORS_GIVEN, { 7 }, { 0 }, 1 },
    { "A=2 B=3 G=2 sliding W=2", 20, 2, 3, 4, 2, 8, 2, ANCHORS_GIVEN, { 4, 11 }, { 0 }, 2 },
    { "A=3 B=5 G=1 sliding W=2 < B", 24, 3, 5, 2, 2, 8, 2, ANCHORS_GIVEN, { 0, 9, 22 }, { 0 }, 2 },
    { "A=4 B=5 G=4 sliding W=3 overlapping", 30, 4, 5, 4, 1, 4, 3, ANCHORS_GIVEN,
      { 5, 7, 8, 20 }, { 0 }, 2 },
    { "A=5 B=3 G=2 sliding W > S", 16, 5, 3, 4, 2, 8, 64, ANCHORS_GIVEN, { 0, 1, 2, 9, 15 },
      { 0 }, 1 },
    { "A=6 B=16 G=4 full, S-1, padded", 40, 6, 16, 8, 2, 8, 0, ANCHORS_GIVEN,
      { 0, 3, 10, 30, 39, 39 }, { 0, 1, 0, 0, 0, 1 }, 1 },
    { "A=6 B=16 G=1 d=64 sliding W=7", 48, 6, 16, 2, 2, 64, 7, ANCHORS_GIVEN,
      { 2, 9, 17, 25, 40, 47 }, { 0, 0, 1, 0, 0, 0 }, 3 },
    { "A=3 B=16 G=2 d=64 full S=300 tile crossing", 300, 3, 16, 4, 2, 64, 0, ANCHORS_GIVEN,
      { 127, 200, 299 }, { 0 }, 2 },
    { "A=4 B=5 G=4 d=8 sliding W=150 S=300", 300, 4, 5, 8, 2, 8, 150, ANCHORS_GIVEN,
      { 100, 129, 200, 280 }, { 0, 0, 1, 0 }, 2 },
    { "A=5 B=3 G=1 d=4 full S=300, all padded but one", 300, 5, 3, 1, 1, 4, 0, ANCHORS_GIVEN,
      { 3, 130, 131, 250, 260 }, { 1, 1, 0, 1, 1 }, 1 },
    { "A=50 B=3 G=1 d=64 full S=300 (several groups)", 300, 50, 3, 2, 2, 64, 0, ANCHORS_RANDOM,
      { 0 }, { 0 }, 1 },
    { "A=50 B=3 G=2 sliding W=40 S=300", 300, 50, 3, 4, 2, 8, 40, ANCHORS_RANDOM, { 0 }, { 0 },
      2 },
    { "A=5 B=16 G=4 d=64 full, peaked", 200, 5, 16, 8, 2, 64, 0, ANCHORS_GIVEN,
      { 1, 60, 61, 128, 199 }, { 0, 0, 0, 0, 1 }, 6 },
    { "A=4 B=5 G=2 full, unsorted anchors", 300, 4, 5, 4, 2, 8, 0, ANCHORS_GIVEN,
      { 250, 3, 140, 60 }, { 0 }, 1 },
    { "A=4 B=5 G=1 sliding W=20, unsorted anchors", 300, 4, 5, 1, 1, 8, 20, ANCHORS_GIVEN,
      { 250, 3, 140, 141 }, { 0 }, 1 },
};

/* DFlash2's (shape->bidirectional = 1): every slot of the own block also in sliding layers */
static const attn_case bidirectional_table[] = {
    { "A=3 B=5 G=1 sliding W=2 < B", 24, 3, 5, 2, 2, 8, 2, ANCHORS_GIVEN, { 0, 9, 22 }, { 0 }, 2 },
    { "A=4 B=5 G=4 sliding W=3 overlapping", 30, 4, 5, 4, 1, 4, 3, ANCHORS_GIVEN, { 5, 7, 8, 20 },
      { 0 }, 2 },
    { "A=6 B=16 G=1 d=64 sliding W=7, padded", 48, 6, 16, 2, 2, 64, 7, ANCHORS_GIVEN,
      { 2, 9, 17, 25, 40, 47 }, { 0, 0, 1, 0, 0, 0 }, 3 },
    { "A=50 B=3 G=2 sliding W=40 S=300", 300, 50, 3, 4, 2, 8, 40, ANCHORS_RANDOM, { 0 }, { 0 }, 2 },
    { "A=6 B=16 G=4 full, S-1, padded", 40, 6, 16, 8, 2, 8, 0, ANCHORS_GIVEN,
      { 0, 3, 10, 30, 39, 39 }, { 0, 1, 0, 0, 0, 1 }, 1 },
};

typedef struct {
    ddk_attention_shape sh;
    int32_t anchors[max_anchors];
    uint8_t keep[max_anchors];
    float *q, *k, *v;   /* (A*B, nh, d); (S + A*B, nkv, d) x 2 */
    float *dout;        /* (A*B, nh, d) */
    int64_t nq, nk;     /* A*B query rows, S + A*B key rows */
} attn_data;

static attn_data make_data(const attn_case *c, uint64_t seed)
{
    attn_data x;
    memset(&x, 0, sizeof x);
    x.sh = (ddk_attention_shape){ .S = c->S, .A = c->A, .B = c->B, .nh = c->nh, .nkv = c->nkv,
                                  .d = c->d, .window = c->window };
    x.nq = c->A * c->B;
    x.nk = c->S + c->A * c->B;
    uint64_t rng = seed;
    for (int64_t j = 0; j < c->A; j++) {
        x.keep[j] = c->A <= 8 ? !c->pad[j] : 1;
        x.anchors[j] = c->anchor_mode == ANCHORS_GIVEN ? c->anchors[j]
                                                       : (int32_t)(ddk_rng_next(&rng) % c->S);
    }
    if (c->anchor_mode == ANCHORS_RANDOM)   /* sorted, repeats allowed (overlapping blocks) */
        for (int64_t j = 1; j < c->A; j++)
            for (int64_t i = j; i > 0 && x.anchors[i - 1] > x.anchors[i]; i--) {
                int32_t t = x.anchors[i];
                x.anchors[i] = x.anchors[i - 1];
                x.anchors[i - 1] = t;
            }
    for (int64_t j = 0; j < c->A; j++)   /* a padded block's anchor is never to be read */
        if (!x.keep[j])
            x.anchors[j] = j % 2 ? INT32_MAX : -1000;
    x.q = xcalloc((size_t)(x.nq * c->nh * c->d), sizeof(float));
    x.dout = xcalloc((size_t)(x.nq * c->nh * c->d), sizeof(float));
    x.k = xcalloc((size_t)(x.nk * c->nkv * c->d), sizeof(float));
    x.v = xcalloc((size_t)(x.nk * c->nkv * c->d), sizeof(float));
    for (int64_t i = 0; i < x.nq * c->nh * c->d; i++) {
        x.q[i] = c->q_scale * rng_sym(&rng);
        x.dout[i] = rng_sym(&rng);
    }
    for (int64_t i = 0; i < x.nk * c->nkv * c->d; i++) {
        x.k[i] = rng_sym(&rng);
        x.v[i] = rng_sym(&rng);
    }
    return x;
}

static void free_data(attn_data *x)
{
    free(x->q), free(x->k), free(x->v), free(x->dout);
}

static void test_dflash_case(const attn_case *c, uint64_t seed, int bidirectional)
{
    const ddk_backend *be = ddk_backend_cpu();
    attn_data x = make_data(c, seed);
    x.sh.bidirectional = bidirectional;
    const ddk_attention_shape *sh = &x.sh;
    const int64_t B = sh->B, nh = sh->nh, nkv = sh->nkv, d = sh->d;
    const int64_t n_out = x.nq * nh * d, n_lse = x.nq * nh, n_kv = x.nk * nkv * d;

    /* reference */
    unsigned char *mask = reference_mask(sh, x.anchors, x.keep);
    double *out_ref = xcalloc((size_t)n_out, sizeof(double));
    double *lse_ref = xcalloc((size_t)n_lse, sizeof(double));
    double *dq_ref = xcalloc((size_t)n_out, sizeof(double));
    double *dk_ref = xcalloc((size_t)n_kv, sizeof(double));
    double *dv_ref = xcalloc((size_t)n_kv, sizeof(double));
    reference_attention(x.nq, x.nk, nh, nkv, d, x.q, x.k, x.v, mask, out_ref, lse_ref, x.dout,
                        dq_ref, dk_ref, dv_ref);

    /* forward: outputs pre-filled with the sentinel, so padded rows must be written */
    float *out = sentinel_floats(n_out), *lse = sentinel_floats(n_lse);
    int rc = be->dflash_attention(be, sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse);
    check(rc == 0, "forward returned %d", rc);
    check(guard_intact(out, n_out), "forward wrote past the end of out");
    check(guard_intact(lse, n_lse), "forward wrote past the end of lse");
    double e = normalised_error(out, out_ref, n_out);
    check(e <= out_tol, "out: normalised error %.3g > %.3g", e, out_tol);
    int lse_bad = 0, pad_nonzero = 0;
    for (int64_t i = 0; i < n_lse; i++)
        lse_bad += !(fabs(lse[i] - lse_ref[i]) <= lse_rel * fabs(lse_ref[i]) + lse_abs);
    check(lse_bad == 0, "lse: %d entries off", lse_bad);
    for (int64_t j = 0; j < sh->A; j++)
        if (!x.keep[j]) {
            for (int64_t i = j * B * nh * d; i < (j + 1) * B * nh * d; i++)
                pad_nonzero += out[i] != 0.0f;
            for (int64_t i = j * B * nh; i < (j + 1) * B * nh; i++)
                pad_nonzero += lse[i] != 0.0f;
        }
    check(pad_nonzero == 0, "padded blocks: %d out/lse entries not exactly 0", pad_nonzero);

    /* backward into zeroed gradients, then again into the same: twice the gradients */
    float *dq = zero_floats(n_out), *dk = zero_floats(n_kv), *dv = zero_floats(n_kv);
    rc = be->dflash_attention_backward(be, sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse,
                                       x.dout, dq, dk, dv);
    check(rc == 0, "backward returned %d", rc);
    check(guard_intact(dq, n_out) && guard_intact(dk, n_kv) && guard_intact(dv, n_kv),
          "backward wrote past the end of dq, dk or dv");
    e = normalised_error(dq, dq_ref, n_out);
    check(e <= grad_tol, "dq: normalised error %.3g > %.3g", e, grad_tol);
    e = normalised_error(dk, dk_ref, n_kv);
    check(e <= grad_tol, "dk: normalised error %.3g > %.3g", e, grad_tol);
    e = normalised_error(dv, dv_ref, n_kv);
    check(e <= grad_tol, "dv: normalised error %.3g > %.3g", e, grad_tol);
    pad_nonzero = 0;
    for (int64_t j = 0; j < sh->A; j++)
        if (!x.keep[j]) {
            for (int64_t i = j * B * nh * d; i < (j + 1) * B * nh * d; i++)
                pad_nonzero += dq[i] != 0.0f;
            for (int64_t i = (sh->S + j * B) * nkv * d; i < (sh->S + (j + 1) * B) * nkv * d; i++)
                pad_nonzero += (dk[i] != 0.0f) + (dv[i] != 0.0f);
        }
    check(pad_nonzero == 0, "padded blocks: %d gradient entries not exactly 0", pad_nonzero);

    double *twice = xcalloc((size_t)(n_out + 2 * n_kv), sizeof(double));
    for (int64_t i = 0; i < n_out; i++)
        twice[i] = 2.0 * dq[i];
    for (int64_t i = 0; i < n_kv; i++) {
        twice[n_out + i] = 2.0 * dk[i];
        twice[n_out + n_kv + i] = 2.0 * dv[i];
    }
    rc = be->dflash_attention_backward(be, sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse,
                                       x.dout, dq, dk, dv);
    check(rc == 0, "second backward returned %d", rc);
    double e_twice = fmax(normalised_error(dq, twice, n_out),
                          fmax(normalised_error(dk, twice + n_out, n_kv),
                               normalised_error(dv, twice + n_out + n_kv, n_kv)));
    check(e_twice <= twice_tol, "backward twice is not 2x (normalised error %.3g)", e_twice);
    check(guard_intact(dq, n_out) && guard_intact(dk, n_kv) && guard_intact(dv, n_kv),
          "second backward wrote past the end of dq, dk or dv");

    free(mask), free(out_ref), free(lse_ref), free(dq_ref), free(dk_ref), free(dv_ref);
    free(out), free(lse), free(dq), free(dk), free(dv), free(twice);
    free_data(&x);
}

/* ------------------------------------------------------------------------------------------
 * Finite differences of f = sum(out * R) in float32 through the library's own forward
 */

static double objective(const ddk_backend *be, const attn_data *x, const float *R, float *out,
                        float *lse)
{
    int rc = be->dflash_attention(be, &x->sh, x->q, x->k, x->v, x->anchors, x->keep, out, lse);
    check(rc == 0, "forward returned %d", rc);
    double f = 0.0;
    for (int64_t i = 0; i < x->nq * x->sh.nh * x->sh.d; i++)
        f += (double)out[i] * R[i];
    return f;
}

static void test_finite_differences_case(const attn_case *c, uint64_t seed, int bidirectional)
{
    const ddk_backend *be = ddk_backend_cpu();
    attn_data x = make_data(c, seed);
    x.sh.bidirectional = bidirectional;
    const int64_t n_out = x.nq * c->nh * c->d, n_kv = x.nk * c->nkv * c->d;
    float *out = zero_floats(n_out), *lse = zero_floats(x.nq * c->nh);
    float *dq = zero_floats(n_out), *dk = zero_floats(n_kv), *dv = zero_floats(n_kv);
    /* dout = R, so the backward's gradients are those of f */
    objective(be, &x, x.dout, out, lse);
    int rc = be->dflash_attention_backward(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse,
                                           x.dout, dq, dk, dv);
    check(rc == 0, "backward returned %d", rc);

    const float h = 1e-2f;
    struct { const char *name; float *x, *g; int64_t count; } wrt[] = {
        { "q", x.q, dq, n_out }, { "k", x.k, dk, n_kv }, { "v", x.v, dv, n_kv },
    };
    uint64_t rng = seed ^ 0x5eedull;
    int bad = 0, nonzero = 0;
    for (int w = 0; w < 3; w++)
        for (int trial = 0; trial < 40; trial++) {
            const int64_t i = (int64_t)(ddk_rng_next(&rng) % (uint64_t)wrt[w].count);
            const float saved = wrt[w].x[i];
            wrt[w].x[i] = saved + h;
            const double fp = objective(be, &x, x.dout, out, lse);
            wrt[w].x[i] = saved - h;
            const double fm = objective(be, &x, x.dout, out, lse);
            wrt[w].x[i] = saved;
            const double fd = (fp - fm) / (2.0 * h), an = wrt[w].g[i];
            nonzero += an != 0.0;
            if (!(fabs(fd - an) <= fd_abs + fd_rel * fabs(an))) {
                if (bad < 5)
                    printf("  # d f / d %s[%lld]: finite differences %.6g, backward %.6g\n",
                           wrt[w].name, (long long)i, fd, an);
                bad++;
            }
        }
    check(bad == 0, "%d of 120 gradient entries disagree with finite differences", bad);
    check(nonzero >= 60, "only %d of 120 sampled gradient entries are nonzero", nonzero);
    free(out), free(lse), free(dq), free(dk), free(dv);
    free_data(&x);
}

static void test_finite_differences(void)
{
    static const attn_case fd_cases[] = {
        { "fd full", 20, 3, 4, 4, 2, 8, 0, ANCHORS_GIVEN, { 0, 9, 19 }, { 0, 1, 0 }, 2 },
        { "fd sliding", 20, 3, 4, 4, 2, 8, 3, ANCHORS_GIVEN, { 2, 9, 10 }, { 0 }, 2 },
    };
    for (size_t j = 0; j < sizeof fd_cases / sizeof fd_cases[0]; j++)
        test_finite_differences_case(&fd_cases[j], 77 + j, 0);
    test_finite_differences_case(&fd_cases[1], 79, 1);   /* sliding, DFlash2's bidirectional block */
}

/* ------------------------------------------------------------------------------------------
 * Causal attention
 */

static void test_causal_case(int64_t T, int64_t nh, int64_t nkv, int64_t d, uint64_t seed)
{
    const ddk_backend *be = ddk_backend_cpu();
    const ddk_attention_shape sh = { .S = T, .nh = nh, .nkv = nkv, .d = d };
    uint64_t rng = seed;
    float *q = xcalloc((size_t)(T * nh * d), sizeof(float));
    float *k = xcalloc((size_t)(T * nkv * d), sizeof(float));
    float *v = xcalloc((size_t)(T * nkv * d), sizeof(float));
    for (int64_t i = 0; i < T * nh * d; i++)
        q[i] = 2.0f * rng_sym(&rng);
    for (int64_t i = 0; i < T * nkv * d; i++) {
        k[i] = rng_sym(&rng);
        v[i] = rng_sym(&rng);
    }
    unsigned char *mask = xcalloc((size_t)(T * T), 1);
    for (int64_t t = 0; t < T; t++)
        for (int64_t u = 0; u <= t; u++)
            mask[t * T + u] = 1;
    double *ref = xcalloc((size_t)(T * nh * d), sizeof(double));
    reference_attention(T, T, nh, nkv, d, q, k, v, mask, ref, NULL, NULL, NULL, NULL, NULL);
    float *out = sentinel_floats(T * nh * d);
    int rc = be->causal_attention(be, &sh, q, k, v, out);
    check(rc == 0, "T=%lld: returned %d", (long long)T, rc);
    check(guard_intact(out, T * nh * d), "T=%lld: wrote past the end of out", (long long)T);
    double e = normalised_error(out, ref, T * nh * d);
    check(e <= out_tol, "T=%lld nh=%lld nkv=%lld d=%lld: normalised error %.3g > %.3g",
          (long long)T, (long long)nh, (long long)nkv, (long long)d, e, out_tol);
    free(q), free(k), free(v), free(mask), free(ref), free(out);
}

static void test_causal(void)
{
    test_causal_case(1, 2, 1, 8, 1);
    test_causal_case(5, 4, 4, 4, 2);
    test_causal_case(130, 4, 2, 8, 3);    /* not a multiple of the key tile */
    test_causal_case(300, 8, 2, 64, 4);   /* several query groups and key tiles */
    test_causal_case(129, 4, 1, 8, 5);    /* G = 4 */
}

/* ------------------------------------------------------------------------------------------
 * Tree attention: N nodes, the last N of S keys; node i sees the S - N cached keys and its root
 * path (i, parents[i], ..., while >= 0). q (N, nh, d); k, v (S, nkv, d); out (N, nh, d).
 */

enum { TREE_RANDOM, TREE_DEEP };   /* parents uniform in [-1, i); or 31 in 32 i - 1 (long paths) */

/* parents (N) of a random tree, each in [-1, i) */
static void random_parents(int32_t *parents, int64_t N, int shape, uint64_t *rng)
{
    for (int64_t i = 0; i < N; i++) {
        if (shape == TREE_DEEP && i > 0 && ddk_rng_next(rng) % 32 != 0)
            parents[i] = (int32_t)(i - 1);
        else
            parents[i] = (int32_t)((int64_t)(ddk_rng_next(rng) % (uint64_t)(i + 1)) - 1);
    }
}

/* q, k, v of a tree case, q in [-2, 2) (peaked and flat softmaxes), k, v in [-1, 1) */
static void tree_inputs(int64_t N, int64_t S, int64_t nh, int64_t nkv, int64_t d, uint64_t *rng,
                        float **q, float **k, float **v)
{
    *q = xcalloc((size_t)(N * nh * d), sizeof(float));
    *k = xcalloc((size_t)(S * nkv * d), sizeof(float));
    *v = xcalloc((size_t)(S * nkv * d), sizeof(float));
    for (int64_t i = 0; i < N * nh * d; i++)
        (*q)[i] = 2.0f * rng_sym(rng);
    for (int64_t i = 0; i < S * nkv * d; i++) {
        (*k)[i] = rng_sym(rng);
        (*v)[i] = rng_sym(rng);
    }
}

static void test_tree_case(int64_t N, int64_t P, int64_t nh, int64_t nkv, int64_t d, int shape,
                           uint64_t seed)
{
    const ddk_backend *be = ddk_backend_cpu();
    const int64_t S = P + N;
    const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = N };
    uint64_t rng = seed;
    int32_t *parents = xcalloc((size_t)N, sizeof(int32_t));
    random_parents(parents, N, shape, &rng);
    float *q, *k, *v;
    tree_inputs(N, S, nh, nkv, d, &rng, &q, &k, &v);
    /* the dense mask (N, S), straight from the rule: the cache, then the nodes of the path */
    unsigned char *mask = xcalloc((size_t)(N * S), 1);
    int64_t depth = 0;
    for (int64_t i = 0; i < N; i++) {
        for (int64_t t = 0; t < P; t++)
            mask[i * S + t] = 1;
        int64_t len = 0;
        for (int64_t j = i; j >= 0; j = parents[j], len++)
            mask[i * S + P + j] = 1;
        depth = len > depth ? len : depth;
    }
    double *ref = xcalloc((size_t)(N * nh * d), sizeof(double));
    reference_attention(N, S, nh, nkv, d, q, k, v, mask, ref, NULL, NULL, NULL, NULL, NULL);
    float *out = sentinel_floats(N * nh * d);
    int rc = be->tree_attention(be, &sh, q, k, v, parents, out);
    check(rc == 0, "N=%lld P=%lld: returned %d", (long long)N, (long long)P, rc);
    check(guard_intact(out, N * nh * d), "N=%lld P=%lld: wrote past the end of out", (long long)N,
          (long long)P);
    double e = normalised_error(out, ref, N * nh * d);
    check(e <= out_tol,
          "N=%lld P=%lld nh=%lld nkv=%lld d=%lld depth=%lld: normalised error %.3g > %.3g",
          (long long)N, (long long)P, (long long)nh, (long long)nkv, (long long)d,
          (long long)depth, e, out_tol);
    if (shape == TREE_DEEP && N > 100)   /* the CPU's path tiles are 64 nodes */
        check(depth > 64, "N=%lld: the deep tree's longest path is %lld, not past a key tile",
              (long long)N, (long long)depth);
    free(parents), free(q), free(k), free(v), free(mask), free(ref), free(out);
}

static void test_tree(void)
{
    test_tree_case(1, 0, 4, 2, 16, TREE_RANDOM, 21);      /* the root alone: no cache */
    test_tree_case(1, 5, 4, 2, 16, TREE_RANDOM, 22);      /* a decoding step's one node */
    test_tree_case(17, 0, 4, 2, 16, TREE_RANDOM, 23);     /* S - N = 0 */
    test_tree_case(33, 100, 4, 2, 16, TREE_RANDOM, 24);   /* cache past a key tile */
    test_tree_case(200, 300, 4, 2, 16, TREE_RANDOM, 25);  /* several query groups */
    test_tree_case(150, 70, 4, 2, 16, TREE_DEEP, 26);     /* paths past a key tile of nodes */
    test_tree_case(40, 9, 8, 2, 64, TREE_RANDOM, 27);     /* G = 4, d 64 */
    test_tree_case(30, 0, 3, 3, 5, TREE_DEEP, 28);        /* G = 1, odd d */
}

/* a chain (parents[i] = i - 1) is causal attention of its N rows over the same S keys */
static void test_tree_chain(void)
{
    static const int64_t shapes[][5] = {   /* N, P, nh, nkv, d */
        { 1, 0, 4, 2, 16 }, { 20, 0, 4, 2, 16 }, { 20, 45, 4, 2, 16 }, { 150, 37, 4, 2, 16 },
        { 64, 200, 8, 2, 64 },
    };
    const ddk_backend *be = ddk_backend_cpu();
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        const int64_t N = shapes[c][0], S = shapes[c][1] + N, nh = shapes[c][2],
                      nkv = shapes[c][3], d = shapes[c][4];
        const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = N };
        uint64_t rng = 31 + c;
        float *q, *k, *v;
        tree_inputs(N, S, nh, nkv, d, &rng, &q, &k, &v);
        int32_t *parents = xcalloc((size_t)N, sizeof(int32_t));
        for (int64_t i = 0; i < N; i++)
            parents[i] = (int32_t)(i - 1);
        float *tree = sentinel_floats(N * nh * d), *causal = sentinel_floats(N * nh * d);
        int rt = be->tree_attention(be, &sh, q, k, v, parents, tree);
        int rc = be->causal_attention(be, &sh, q, k, v, causal);
        check(rt == 0 && rc == 0, "N=%lld S=%lld: tree returned %d, causal %d", (long long)N,
              (long long)S, rt, rc);
        /* the same keys and weights, summed in another order (the path tile walks the nodes
         * from the leaf up): float rounding only, ~1e-7 of out's scale */
        double worst = 0.0;
        for (int64_t i = 0; i < N * nh * d; i++)
            worst = fmax(worst, fabs((double)tree[i] - causal[i]));
        check(worst <= 1e-5, "N=%lld S=%lld: chain differs from causal by %.3g > 1e-5",
              (long long)N, (long long)S, worst);
        free(q), free(k), free(v), free(parents), free(tree), free(causal);
    }
}

/* refusals: -EINVAL, nothing written */
static void test_tree_einval(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    const int64_t N = 6, S = 10, nh = 4, nkv = 2, d = 16;
    uint64_t rng = 41;
    float *q, *k, *v;
    tree_inputs(N, S, nh, nkv, d, &rng, &q, &k, &v);
    const int32_t good[6] = { -1, 0, 0, 1, 3, 2 };
    static const struct { int at; int32_t parent; const char *what; } bad_parents[] = {
        { 3, 3, "a node its own parent" }, { 4, 5, "a parent after its child" },
        { 2, -2, "a parent below -1" },   { 0, 0, "the first node with a parent" },
        { 5, INT32_MAX, "a parent past N" },
    };
    float *out = sentinel_floats(N * nh * d);
    const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = N };
    for (size_t c = 0; c < sizeof bad_parents / sizeof bad_parents[0]; c++) {
        int32_t parents[6];
        memcpy(parents, good, sizeof parents);
        parents[bad_parents[c].at] = bad_parents[c].parent;
        int rc = be->tree_attention(be, &sh, q, k, v, parents, out);
        check(rc == -EINVAL, "%s: returned %d, not -EINVAL", bad_parents[c].what, rc);
    }
    static const struct { int64_t S, nh, nkv, d, q_rows; const char *what; } bad_shapes[] = {
        { 10, 4, 2, 16, 0, "N = 0" },       { 5, 4, 2, 16, 6, "N > S" },
        { 10, 3, 2, 16, 6, "nh % nkv != 0" }, { 10, 4, 0, 16, 6, "nkv = 0" },
        { 10, 4, 2, 0, 6, "d = 0" },
    };
    for (size_t c = 0; c < sizeof bad_shapes / sizeof bad_shapes[0]; c++) {
        const ddk_attention_shape b = { .S = bad_shapes[c].S, .nh = bad_shapes[c].nh,
                                        .nkv = bad_shapes[c].nkv, .d = bad_shapes[c].d,
                                        .q_rows = bad_shapes[c].q_rows };
        int rc = be->tree_attention(be, &b, q, k, v, good, out);
        check(rc == -EINVAL, "%s: returned %d, not -EINVAL", bad_shapes[c].what, rc);
    }
    check(all_sentinel(out, N * nh * d + guard_words), "a refused call wrote out");
    int rc = be->tree_attention(be, &sh, q, k, v, good, out);
    check(rc == 0, "the good tree after the refusals returned %d", rc);
    free(q), free(k), free(v), free(out);
}

/* ------------------------------------------------------------------------------------------
 * Budgets, bad shapes, workspace size
 */

static void test_budget(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    const attn_case c = { "budget", 40, 3, 5, 4, 2, 8, 0, ANCHORS_GIVEN, { 1, 20, 39 },
                          { 0, 1, 0 }, 1 };
    attn_data x = make_data(&c, 9);
    const int64_t n_out = x.nq * c.nh * c.d, n_kv = x.nk * c.nkv * c.d;
    float *out = sentinel_floats(n_out), *lse = sentinel_floats(x.nq * c.nh);
    float *dq = sentinel_floats(n_out), *dk = sentinel_floats(n_kv), *dv = sentinel_floats(n_kv);
    ddk_allocator *a = ddk_allocator_cpu();
    ddk_allocator_set_budget(a, ddk_allocator_stats(a).current + 16);   /* any workspace fails */
    int rc = be->dflash_attention(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse);
    check(rc == -ENOMEM, "forward over budget returned %d, not -ENOMEM", rc);
    check(all_sentinel(out, n_out + guard_words) && all_sentinel(lse, x.nq * c.nh + guard_words),
          "forward over budget wrote out or lse");
    rc = be->dflash_attention_backward(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse,
                                       x.dout, dq, dk, dv);
    check(rc == -ENOMEM, "backward over budget returned %d, not -ENOMEM", rc);
    check(all_sentinel(dq, n_out + guard_words) && all_sentinel(dk, n_kv + guard_words) &&
              all_sentinel(dv, n_kv + guard_words),
          "backward over budget wrote dq, dk or dv");
    const ddk_attention_shape causal = { .S = 10, .nh = c.nh, .nkv = c.nkv, .d = c.d };   /* T=10 fits x's */
    rc = be->causal_attention(be, &causal, x.q, x.k, x.v, out);
    check(rc == -ENOMEM, "causal over budget returned %d, not -ENOMEM", rc);
    check(all_sentinel(out, n_out + guard_words), "causal over budget wrote out");
    const ddk_attention_shape tree = { .S = 10, .nh = c.nh, .nkv = c.nkv, .d = c.d, .q_rows = 4 };
    const int32_t parents[4] = { -1, 0, 0, 2 };
    rc = be->tree_attention(be, &tree, x.q, x.k, x.v, parents, out);
    check(rc == -ENOMEM, "tree over budget returned %d, not -ENOMEM", rc);
    check(all_sentinel(out, n_out + guard_words), "tree over budget wrote out");
    ddk_allocator_set_budget(a, 0);
    rc = be->dflash_attention(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse);
    check(rc == 0, "forward after the budget is lifted returned %d", rc);
    free(out), free(lse), free(dq), free(dk), free(dv);
    free_data(&x);
}

static void test_bad_shapes(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    const attn_case c = { "bad", 10, 2, 3, 3, 2, 4, 0, ANCHORS_GIVEN, { 1, 5 }, { 0 }, 1 };
    attn_data x = make_data(&c, 11);   /* nh = 3 is not a multiple of nkv = 2 */
    float *out = sentinel_floats(x.nq * 3 * 4), *lse = sentinel_floats(x.nq * 3);
    int rc = be->dflash_attention(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse);
    check(rc == -EINVAL, "nh %% nkv != 0: forward returned %d, not -EINVAL", rc);
    rc = be->causal_attention(be, &x.sh, x.q, x.k, x.v, out);
    check(rc == -EINVAL, "nh %% nkv != 0: causal returned %d, not -EINVAL", rc);
    check(all_sentinel(out, x.nq * 12 + guard_words) && all_sentinel(lse, x.nq * 3 + guard_words),
          "a refused call wrote its outputs");
    free(out), free(lse);
    free_data(&x);
}

/* peak workspace of one forward + backward on these dimensions */
static size_t workspace_of(const attn_case *c)
{
    const ddk_backend *be = ddk_backend_cpu();
    attn_data x = make_data(c, 13);
    const int64_t n_out = x.nq * c->nh * c->d, n_kv = x.nk * c->nkv * c->d;
    float *out = zero_floats(n_out), *lse = zero_floats(x.nq * c->nh);
    float *dq = zero_floats(n_out), *dk = zero_floats(n_kv), *dv = zero_floats(n_kv);
    ddk_allocator *a = ddk_allocator_cpu();
    ddk_allocator_reset_peak(a);
    const size_t before = ddk_allocator_stats(a).current;
    int rc = be->dflash_attention(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse);
    rc |= be->dflash_attention_backward(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out, lse,
                                        x.dout, dq, dk, dv);
    check(rc == 0, "forward or backward failed");
    const size_t after = ddk_allocator_stats(a).current;
    check(after == before, "workspace not given back: %zu bytes", after - before);
    const size_t peak = ddk_allocator_stats(a).peak - before;
    free(out), free(lse), free(dq), free(dk), free(dv);
    free_data(&x);
    return peak;
}

static void test_workspace_scaling(void)
{
    /* the workspace depends on B, G and d only; small heads keep the large case quick */
    const attn_case small = { "small", 20, 2, 16, 4, 2, 8, 0, ANCHORS_RANDOM, { 0 }, { 0 }, 1 };
    const attn_case large = { "large", 1000, 40, 16, 4, 2, 8, 0, ANCHORS_RANDOM, { 0 }, { 0 }, 1 };
    const size_t ws_small = workspace_of(&small), ws_large = workspace_of(&large);
    /* a dense (A*B) x (S + A*B) float score matrix of the large case, for one head */
    const size_t dense = (size_t)(40 * 16) * (1000 + 40 * 16) * sizeof(float);
    check(ws_small > 0, "no workspace measured");
    check(ws_large == ws_small, "workspace grows with S and A: %zu -> %zu bytes", ws_small,
          ws_large);
    check(ws_large * 8 < dense, "workspace %zu bytes is not far below a dense score matrix %zu",
          ws_large, dense);
}

/* bidirectional changes only a sliding layer's own-block rule: in a full layer (window 0) it is
 * the same call bit for bit, forward and backward */
static void test_bidirectional_full(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    const attn_case c = { "full", 40, 4, 6, 4, 2, 8, 0, ANCHORS_GIVEN, { 0, 7, 20, 39 }, { 0, 1 }, 2 };
    attn_data x = make_data(&c, 17);
    const int64_t n_out = x.nq * c.nh * c.d, n_lse = x.nq * c.nh, n_kv = x.nk * c.nkv * c.d;
    float *out[2], *lse[2], *dq[2], *dk[2], *dv[2];
    for (int b = 0; b < 2; b++) {
        x.sh.bidirectional = b;
        out[b] = zero_floats(n_out), lse[b] = zero_floats(n_lse);
        dq[b] = zero_floats(n_out), dk[b] = zero_floats(n_kv), dv[b] = zero_floats(n_kv);
        int rc = be->dflash_attention(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out[b], lse[b]);
        rc |= be->dflash_attention_backward(be, &x.sh, x.q, x.k, x.v, x.anchors, x.keep, out[b],
                                            lse[b], x.dout, dq[b], dk[b], dv[b]);
        check(rc == 0, "bidirectional %d: an op failed", b);
    }
    check(memcmp(out[0], out[1], (size_t)n_out * sizeof(float)) == 0 &&
              memcmp(lse[0], lse[1], (size_t)n_lse * sizeof(float)) == 0 &&
              memcmp(dq[0], dq[1], (size_t)n_out * sizeof(float)) == 0 &&
              memcmp(dk[0], dk[1], (size_t)n_kv * sizeof(float)) == 0 &&
              memcmp(dv[0], dv[1], (size_t)n_kv * sizeof(float)) == 0,
          "window 0: bidirectional 1 is not the same bits as 0");
    for (int b = 0; b < 2; b++)
        free(out[b]), free(lse[b]), free(dq[b]), free(dk[b]), free(dv[b]);
    free_data(&x);
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

/* attention_rows.h against reference_mask over random shapes (windows below B, cutting the
 * context, past S; anchors at 0, S - 1 and repeated), and the bounds' monotonicity */
static void test_flash_row_rules(void)
{
    uint64_t rng = 0x70775eedu;
    int64_t wrong = 0, unordered = 0, causal_wrong = 0;
    for (int trial = 0; trial < 300; trial++) {
        const int64_t S = (int64_t)(ddk_rng_next(&rng) % 200), A = 1 + (int64_t)(ddk_rng_next(&rng) % 6);
        const int64_t B = 1 + (int64_t)(ddk_rng_next(&rng) % 30);
        static const int64_t windows[] = { 0, 1, 2, 5, 23, 24, 40, 1000 };
        const int64_t W = windows[ddk_rng_next(&rng) % 8], keys = S + A * B;
        int32_t anchors[6];
        uint8_t keep[6];
        for (int64_t j = 0; j < A; j++) {
            anchors[j] = S ? (int32_t)(ddk_rng_next(&rng) % (uint64_t)S) : 0;
            keep[j] = ddk_rng_next(&rng) % 4 != 0;
        }
        if (S)
            anchors[A - 1] = (int32_t)(S - 1);
        for (int bidir = 0; bidir <= 1; bidir++) {   /* section 2's rule, then DFlash2's */
            const ddk_attention_shape sh = { .S = S, .A = A, .B = B, .nh = 1, .nkv = 1, .d = 4,
                                             .window = W, .bidirectional = bidir };
            unsigned char *mask = reference_mask(&sh, anchors, keep);
            for (int64_t j = 0; j < A; j++) {
                if (!keep[j])
                    continue;
                ddk_row_keys prev = ddk_dflash_row_keys(S, B, W, bidir, j, anchors[j], 0);
                for (int64_t o = 0; o < B; o++) {
                    const ddk_row_keys r = ddk_dflash_row_keys(S, B, W, bidir, j, anchors[j], o);
                    for (int64_t t = 0; t < keys; t++)
                        wrong += ddk_row_sees(&r, t) != mask[(j * B + o) * keys + t];
                    unordered += r.ctx_lo < prev.ctx_lo || r.ctx_hi < prev.ctx_hi ||
                                 r.own_lo < prev.own_lo || r.own_hi < prev.own_hi;
                    prev = r;
                }
            }
            free(mask);
        }
        /* causal: the last T of S positions; query t sees keys 0..S - T + t */
        const int64_t Sc = 1 + S, T = 1 + (int64_t)(ddk_rng_next(&rng) % (uint64_t)Sc);
        for (int64_t t = 0; t < T; t++) {
            const ddk_row_keys r = ddk_causal_row_keys(Sc - T, t);
            for (int64_t key = 0; key < Sc; key++)
                causal_wrong += ddk_row_sees(&r, key) != (key <= Sc - T + t);
        }
    }
    check(wrong == 0, "dflash rows: %lld (row, key) pairs differ from SPEC.md's mask", (long long)wrong);
    check(unordered == 0, "dflash rows: %lld bounds decrease with the slot", (long long)unordered);
    check(causal_wrong == 0, "causal rows: %lld (row, key) pairs wrong", (long long)causal_wrong);
}

int main(void)
{
    const ddk_backend *be = ddk_backend_cpu();
    if (!be->dflash_attention || !be->dflash_attention_backward || !be->causal_attention ||
        !be->tree_attention) {
        printf("the CPU backend has no attention ops\n0 passed, 1 failed\n");
        return 1;
    }
    for (size_t j = 0; j < sizeof table / sizeof table[0]; j++) {
        test_dflash_case(&table[j], 1000 + j, 0);
        char name[128];
        snprintf(name, sizeof name, "dflash %s", table[j].name);
        case_done(name);
    }
    for (size_t j = 0; j < sizeof bidirectional_table / sizeof bidirectional_table[0]; j++) {
        test_dflash_case(&bidirectional_table[j], 2000 + j, 1);
        char name[128];
        snprintf(name, sizeof name, "dflash bidirectional %s", bidirectional_table[j].name);
        case_done(name);
    }
    static const test_case cases[] = {
        { "dflash backward vs finite differences (float32; sliding also bidirectional)", test_finite_differences },
        { "causal attention vs reference", test_causal },
        { "tree attention vs reference (random trees, GQA, cache and none)", test_tree },
        { "tree attention of a chain = causal attention", test_tree_chain },
        { "tree attention refusals: -EINVAL, nothing written", test_tree_einval },
        { "budget: -ENOMEM, nothing written", test_budget },
        { "bad shapes: -EINVAL, nothing written", test_bad_shapes },
        { "workspace independent of S and A", test_workspace_scaling },
        { "CUDA flash row rules (attention_rows.h) vs the SPEC mask", test_flash_row_rules },
        { "bidirectional in a full layer: the same bits as without", test_bidirectional_full },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    ddk_allocator_set_budget(ddk_allocator_cpu(), 0);
    return cases_summary();
}
