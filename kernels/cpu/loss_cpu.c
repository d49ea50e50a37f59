/* loss_cpu.c: the fused, chunked lm_head + CE + KL + CAP loss on the CPU (SPEC.md section 1).
 *
 * Positions are processed `chunk` at a time, so the logits never exist for all n positions.
 * Within a chunk the vocabulary is one tile (vocab_tile = 0: the chunk's student and teacher
 * logits materialised, the gradient formed in place over the student's, three logit-sized
 * products) or streamed tiles of vocab_tile columns (online-softmax statistics merged tile by
 * tile, logits recomputed for the gradient: five products, workspace independent of V).
 * Both modes run the same code: "whole vocabulary" is the one-tile case.
 *
 * Per position the statistics pass keeps shifted sums (ddk_loss_row) from which CE, KL, CAP
 * and every softmax follow; the gradient pass turns each logit row into
 *   g = (w_i / sum w) [(1-a)(p - onehot(y)) + a T (ps - pt) - lambda (c/Tc) pc (log pc + H)]
 * in place, and one product g W accumulates d loss / d hs. 1 - p_y is carried as the sum over
 * v != y, so p_y -> 1 loses nothing to cancellation. A -inf (padded) column adds exactly 0 to
 * every statistic and has gradient 0: where a product would be 0 * -inf it is selected away.
 *
 * Speed: the products are the floor; the rest (one argmax pass per logit row, one pass of
 * exponential sums, one pass forming g) runs 8 lanes wide, ddk_expf8 and ddk_vargmax. On a
 * 2-core AVX2 machine (tests/bench/loss_vs_torch.py, n 2048, H 256, V 16000, chunk 512, one
 * thread) the whole-vocabulary loss takes 1.00-1.14x its three products' CPU time, 2.2-2.4x
 * with scalar exps before; docs/memory.md has the figures.
 *
 * Deliberately not here: threads of our own (the BLAS's pool runs the products, which are
 * almost all of the time), bf16 activations (the CUDA backend's job). bf16_products rounds the
 * products' operands to bf16 (be->matmul_bf16), the reference for the GPU's tensor cores; a bf16
 * head (head_bf16, the frozen target's lm_head as a GPU holds it) is read in place through
 * be->matmul_w16 (logits) and be->matmul_w16_nn (gradient), which widen it a panel at a time:
 * the same bits as bf16_products on the head widened to fp32, and the same workspace.
 * Tested by tests/test_loss.c (float64 C reference, finite differences, chunk/tile
 * invariance, budgets, the bf16 head bit for bit against the widened one, rows wider than a
 * sum block, logits of +-200, the 8-lane kernels against the scalar exp),
 * tests/test_loss_online.c (-inf columns, also whole -inf tiles: finite, gradient 0 there, the
 * values of the vocabulary without them) and tests/loss_torch_check.py (PyTorch autograd).
 *
 * Legend: n positions, H hidden, V vocabulary, m rows of the current chunk, w tile width.
 */
#include "ddk.h"
#include "loss_internal.h"
#include "cpu_backend.h"
#include "ddk_vmath.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* One call's constants. */
typedef struct loss_run {
    const ddk_backend *be;
    /* the products on an fp32 head: be->matmul, or be->matmul_bf16 when p->bf16_products */
    void (*product)(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                    int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                    int64_t ldb, float beta, float *c, int64_t ldc);
    const float *head32;      /* lm_head (V, H) fp32, or NULL ... */
    const uint16_t *head16;   /* ... when it is bf16 (p->head_bf16): be->matmul_w16 / _nn */
    int64_t H;
    float alpha, T, invT, lambda, invTc;
    int kl;          /* the KL term is computed (alpha > 0; the teacher is then present) */
    int kl_scaled;   /* ... with T != 1, so softmax(zs/T) is not softmax(zs) */
    int cap;         /* lambda > 0: CAP is trained on (its value is reported either way) */
    int cap_scaled;  /* Tc != 1, so softmax(zs/Tc) is not softmax(zs) */
    int given_labels;
} loss_run;

/* ------------------------------------------------------------------------------------------
 * Statistics of one tile row. The kernels are instantiated per term combination so that each
 * loop is branch-free (a generic loop would compute every exp for every term), and written on
 * ddk_vmath.h's 8-lane vectors: GCC does not vectorise ddk_expf in a `#pragma omp simd` loop
 * on AVX2, and scalar exps were half the loss's time there (ddk_vmath.h says why).
 */

typedef struct tile_sums {
    double s, rest, sT, c, cd, t, td;   /* as in ddk_loss_row, for this tile only */
} tile_sums;

/* 8 float lanes sum SUM_BLOCK columns, then merge into double */
enum { LANES = 8, SUM_BLOCK = 512 };

static const ddk_i8 lane_index = { 0, 1, 2, 3, 4, 5, 6, 7 };

/* x[0 .. count) in the first lanes, 0 in the others (count <= LANES): a row's last columns */
static inline ddk_f8 load_tail(const float *x, int64_t count)
{
    float v[LANES] = { 0 };
    memcpy(v, x, (size_t)count * sizeof(float));
    return ddk_f8_load(v);
}

typedef struct lane_sums {
    ddk_f8 s, rest, sT, c, cd, t, td;
} lane_sums;

/* Adds 8 columns (zs, zt: their logits) to the lane sums. keep: the lanes that count (all
 * but a row's padding); rest leaves out the lane whose column minus the label's is 0. A -inf
 * column adds 0 to every sum: e = 0 there, and the products with -inf (e dc, et (zt - zs)) are
 * selected away where their e is 0, never multiplied (SPEC.md section 1). */
static inline __attribute__((always_inline)) void
lane_sums_add(lane_sums *a, ddk_f8 zs, ddk_f8 zt, ddk_i8 keep, ddk_i8 from_label, float s_max,
              float t_max, float invT, float invTc, const int kl, const int kl_scaled,
              const int cap_scaled)
{
    const ddk_f8 zero = ddk_f8_splat(0.0f);
    ddk_f8 d = zs - s_max;                                /* <= 0 */
    ddk_f8 e = ddk_f8_select(keep, ddk_expf8(d), zero);
    a->s += e;
    a->rest += ddk_f8_select(from_label == 0, zero, e);
    if (kl_scaled)
        a->sT += ddk_f8_select(keep, ddk_expf8(d * invT), zero);
    ddk_f8 dc = cap_scaled ? d * invTc : d;
    ddk_f8 ec = cap_scaled ? ddk_f8_select(keep, ddk_expf8(dc), zero) : e;
    a->c += ec;
    a->cd += ddk_f8_select(ec != zero, ec * dc, zero);
    if (kl) {
        ddk_f8 et = ddk_f8_select(keep, ddk_expf8((zt - t_max) * invT), zero);
        a->t += et;
        a->td += ddk_f8_select(et != zero, et * ((zt - zs) * invT), zero);
    }
}

static inline __attribute__((always_inline)) tile_sums
tile_sums_impl(const float *zs, const float *zt, int64_t w, float s_max, float t_max,
               int64_t label_col, float invT, float invTc, const int kl, const int kl_scaled,
               const int cap_scaled)
{
    const ddk_i8 all = { -1, -1, -1, -1, -1, -1, -1, -1 };
    const ddk_f8 zero = ddk_f8_splat(0.0f);
    tile_sums out = { 0, 0, 0, 0, 0, 0, 0 };
    for (int64_t b0 = 0; b0 < w; b0 += SUM_BLOCK) {
        const int64_t b1 = w - b0 < SUM_BLOCK ? w : b0 + SUM_BLOCK;
        lane_sums a = { zero, zero, zero, zero, zero, zero, zero };
        ddk_i8 from_label = lane_index + (int32_t)(b0 - label_col);   /* column - label_col */
        int64_t v = b0;
        for (; v + LANES <= b1; v += LANES, from_label += LANES)
            lane_sums_add(&a, ddk_f8_load(zs + v), kl ? ddk_f8_load(zt + v) : zero, all,
                          from_label, s_max, t_max, invT, invTc, kl, kl_scaled, cap_scaled);
        if (v < b1)
            lane_sums_add(&a, load_tail(zs + v, b1 - v), kl ? load_tail(zt + v, b1 - v) : zero,
                          lane_index < (int32_t)(b1 - v), from_label, s_max, t_max, invT, invTc,
                          kl, kl_scaled, cap_scaled);
        out.s += ddk_f8_sum(a.s);
        out.rest += ddk_f8_sum(a.rest);
        out.sT += ddk_f8_sum(a.sT);
        out.c += ddk_f8_sum(a.c);
        out.cd += ddk_f8_sum(a.cd);
        out.t += ddk_f8_sum(a.t);
        out.td += ddk_f8_sum(a.td);
    }
    return out;
}

typedef tile_sums (*tile_sums_fn)(const float *zs, const float *zt, int64_t w, float s_max,
                                  float t_max, int64_t label_col, float invT, float invTc);
#define TILE_SUMS(kl, sc, cap)                                                                 \
    static tile_sums tile_sums_##kl##sc##cap(const float *zs, const float *zt, int64_t w,      \
                                             float s_max, float t_max, int64_t label_col,      \
                                             float invT, float invTc)                          \
    {                                                                                          \
        return tile_sums_impl(zs, zt, w, s_max, t_max, label_col, invT, invTc, kl, sc, cap);   \
    }
TILE_SUMS(0, 0, 0) TILE_SUMS(0, 0, 1) TILE_SUMS(1, 0, 0) TILE_SUMS(1, 0, 1)
TILE_SUMS(1, 1, 0) TILE_SUMS(1, 1, 1)

static tile_sums_fn pick_tile_sums(const loss_run *k)
{
    static const tile_sums_fn table[2][2][2] = {   /* [kl][kl_scaled][cap_scaled] */
        { { tile_sums_000, tile_sums_001 }, { tile_sums_000, tile_sums_001 } },
        { { tile_sums_100, tile_sums_101 }, { tile_sums_110, tile_sums_111 } },
    };
    return table[k->kl][k->kl_scaled][k->cap_scaled];
}

static void row_init(const loss_run *k, ddk_loss_row *r, int32_t label, float weight)
{
    memset(r, 0, sizeof *r);
    r->s_arg = -1;
    r->label = label;
    r->ignored = label < 0 && k->given_labels ? 1 : !(weight > 0.0f);
}

/* Merges one tile (columns off .. off+w) of one position into its running statistics.
 * zs (w), zt (w) or NULL when no teacher logits are used. While a maximum is -inf (a tile of
 * -inf columns first) its sums are 0: they are shifted by 0 and never rescaled (from -inf,
 * exp(-inf - -inf) would be NaN). */
static void row_stats_tile(const loss_run *k, tile_sums_fn sums, ddk_loss_row *r,
                           const float *zs, const float *zt, int64_t off, int64_t w)
{
    int first = r->s_arg < 0;
    float tile_s_max;
    int64_t tile_s_arg = ddk_vargmax(zs, w, &tile_s_max);
    float s_max = first || tile_s_max > r->s_max ? tile_s_max : r->s_max;
    if (first || tile_s_max > r->s_max)              /* strictly: earlier tiles keep ties */
        r->s_arg = (int32_t)(off + tile_s_arg);

    int64_t label_col = -1;                          /* the label's column in this tile */
    float t_max = r->t_max;
    if (zt) {
        float tile_t_max;
        int64_t tile_t_arg = ddk_vargmax(zt, w, &tile_t_max);
        int moved = first || tile_t_max > r->t_max;
        if (moved)
            t_max = tile_t_max;
        if (!k->given_labels && moved)
            label_col = tile_t_arg;
    }
    if (k->given_labels && r->label >= off && r->label < off + w)
        label_col = r->label - off;

    /* bring what earlier tiles summed to the new maxima */
    if (!first && r->s_max > -INFINITY) {
        double ds = (double)r->s_max - s_max, f = exp(ds);
        r->s_sum *= f;
        r->s_rest *= f;
        if (k->kl_scaled)
            r->sT_sum *= exp(ds * k->invT);
        double dc = ds * k->invTc, fc = exp(dc);
        r->c_dot = fc * (r->c_dot + r->c_sum * dc);
        r->c_sum *= fc;
    }
    if (!first && k->kl && r->t_max > -INFINITY) {
        double ft = exp(((double)r->t_max - t_max) * k->invT);
        r->t_sum *= ft;
        r->t_dot *= ft;
    }
    r->s_max = s_max;
    r->t_max = t_max;

    tile_sums ts = sums(zs, zt, w, s_max > -INFINITY ? s_max : 0.0f,
                        t_max > -INFINITY ? t_max : 0.0f, label_col, k->invT, k->invTc);
    if (label_col >= 0 && !k->given_labels) {
        /* the teacher's argmax moved into this tile: the old label's mass becomes "rest" */
        r->s_rest = r->s_sum + ts.rest;
        r->label = (int32_t)(off + label_col);
    } else {
        r->s_rest += ts.rest;
    }
    if (label_col >= 0)
        r->z_label = zs[label_col];
    r->s_sum += ts.s;
    r->sT_sum += ts.sT;
    r->c_sum += ts.c;
    r->c_dot += ts.cd;
    r->t_sum += ts.t;
    r->t_dot += ts.td;
}

/* ------------------------------------------------------------------------------------------
 * Per-position terms, from the finished statistics.
 */

typedef struct loss_terms {
    double ce, kl, cap, l;
} loss_terms;

static loss_terms row_terms(const loss_run *k, ddk_loss_row *r)
{
    loss_terms t = { 0, 0, 0, 0 };
    double d_y = (double)r->z_label - r->s_max;      /* log p_y + log s_sum, <= 0 */
    /* CE = log(s_sum / e_y) = log1p(rest / e_y): exact as p_y -> 1 */
    t.ce = d_y > -600.0 ? log1p(r->s_rest * exp(-d_y)) : log(r->s_sum) - d_y;
    if (k->kl) {
        double sT = k->kl_scaled ? r->sT_sum : r->s_sum;
        /* sum pt (log pt - log ps) = E_pt[(zt - zs)/T] - lse(zt/T) + lse(zs/T) */
        t.kl = (double)k->T * k->T *
               (r->t_dot / r->t_sum + ((double)r->s_max - r->t_max) * k->invT +
                log(sT) - log(r->t_sum));
    }
    r->confident = r->s_arg == r->label;
    r->entropy = log(r->c_sum) - r->c_dot / r->c_sum;
    t.cap = r->confident ? r->entropy : 0.0;
    t.l = (1.0 - k->alpha) * t.ce + k->alpha * t.kl + k->lambda * t.cap;
    return t;
}

/* ------------------------------------------------------------------------------------------
 * Gradient of one tile row, formed in place over the student logits.
 */

typedef struct grad_coeffs {
    float s_max, t_max;
    float a;          /* of exp(zs - s_max): (1-alpha) softmax, plus the KL's ps when T = 1 */
    float b;          /* of exp((zs - s_max)/T): the KL's ps when T != 1 */
    float bt;         /* of exp((zt - t_max)/T): the KL's pt */
    float kc;         /* of pc (log pc + H): CAP */
    float cap_shift;  /* H - log c_sum, so log pc + H = (zs - s_max)/Tc + cap_shift */
    float invT, invTc;
} grad_coeffs;

/* g of 8 columns (z, zt: their logits); 0 at a -inf column (and its teacher's) */
static inline __attribute__((always_inline)) ddk_f8
grad_lanes(ddk_f8 z, ddk_f8 zt, const grad_coeffs *g, const int kl, const int kl_scaled,
           const int cap)
{
    ddk_f8 d = z - g->s_max;
    ddk_f8 gv = g->a * ddk_expf8(d);
    if (kl_scaled)
        gv += g->b * ddk_expf8(d * g->invT);
    if (kl)
        gv -= g->bt * ddk_expf8((zt - g->t_max) * g->invT);
    if (cap) {   /* a -inf column: 0, not 0 * -inf */
        ddk_f8 dc = d * g->invTc, ec = ddk_expf8(dc);
        gv += ddk_f8_select(ec != ddk_f8_splat(0.0f), g->kc * ec * (dc + g->cap_shift),
                            ddk_f8_splat(0.0f));
    }
    return gv;
}

static inline __attribute__((always_inline)) void
grad_tile_impl(float *z, const float *zt, int64_t w, const grad_coeffs *g, const int kl,
               const int kl_scaled, const int cap)
{
    const ddk_f8 zero = ddk_f8_splat(0.0f);
    int64_t v = 0;
    for (; v + LANES <= w; v += LANES)
        ddk_f8_store(z + v, grad_lanes(ddk_f8_load(z + v), kl ? ddk_f8_load(zt + v) : zero, g,
                                       kl, kl_scaled, cap));
    if (v < w) {
        float tail[LANES];
        ddk_f8_store(tail, grad_lanes(load_tail(z + v, w - v), kl ? load_tail(zt + v, w - v) : zero,
                                      g, kl, kl_scaled, cap));
        memcpy(z + v, tail, (size_t)(w - v) * sizeof(float));
    }
}

typedef void (*grad_tile_fn)(float *z, const float *zt, int64_t w, const grad_coeffs *g);
#define GRAD_TILE(kl, sc, cap)                                                                 \
    static void grad_tile_##kl##sc##cap(float *z, const float *zt, int64_t w,                 \
                                        const grad_coeffs *g)                                  \
    {                                                                                          \
        grad_tile_impl(z, zt, w, g, kl, sc, cap);                                              \
    }
GRAD_TILE(0, 0, 0) GRAD_TILE(0, 0, 1) GRAD_TILE(1, 0, 0) GRAD_TILE(1, 0, 1)
GRAD_TILE(1, 1, 0) GRAD_TILE(1, 1, 1)

static grad_tile_fn pick_grad_tile(const loss_run *k, int confident)
{
    static const grad_tile_fn table[2][2][2] = {   /* [kl][kl_scaled][cap] */
        { { grad_tile_000, grad_tile_001 }, { grad_tile_000, grad_tile_001 } },
        { { grad_tile_100, grad_tile_101 }, { grad_tile_110, grad_tile_111 } },
    };
    return table[k->kl][k->kl_scaled][k->cap && confident];   /* c_i = 0: no CAP gradient */
}

static grad_coeffs row_grad_coeffs(const loss_run *k, const ddk_loss_row *r)
{
    double scale = r->scale;
    double kl_coef = scale * k->alpha * k->T;
    grad_coeffs g = {
        .s_max = r->s_max,
        .t_max = r->t_max,
        .a = (float)(scale * (1.0 - k->alpha) / r->s_sum),
        .invT = k->invT,
        .invTc = k->invTc,
    };
    if (k->kl) {
        if (k->kl_scaled)
            g.b = (float)(kl_coef / r->sT_sum);
        else
            g.a += (float)(kl_coef / r->s_sum);
        g.bt = (float)(kl_coef / r->t_sum);
    }
    if (k->cap && r->confident) {
        g.kc = (float)(-scale * k->lambda * k->invTc / r->c_sum);
        g.cap_shift = (float)(r->entropy - log(r->c_sum));
    }
    return g;
}

/* The label's element, from the statistics in double: p_y - 1 = -rest / s_sum. */
static float grad_at_label(const loss_run *k, const ddk_loss_row *r, float zt_label)
{
    double scale = r->scale, d = (double)r->z_label - r->s_max;
    double g = -(1.0 - k->alpha) * r->s_rest / r->s_sum;
    if (k->kl) {
        double ps = k->kl_scaled ? exp(d * k->invT) / r->sT_sum : exp(d) / r->s_sum;
        double pt = exp(((double)zt_label - r->t_max) * k->invT) / r->t_sum;
        g += k->alpha * k->T * (ps - pt);
    }
    if (k->cap && r->confident) {
        double dc = d * k->invTc, log_pc = dc - log(r->c_sum);
        g -= k->lambda * k->invTc * exp(log_pc) * (log_pc + r->entropy);
    }
    return (float)(scale * g);
}

/* ------------------------------------------------------------------------------------------
 * The call.
 */

/* z (m, w) = x (m, H) . W[off .. off+w) (w, H)^T */
static void tile_logits(const loss_run *k, const float *x, int64_t m, int64_t off, int64_t w,
                        float *z)
{
    const int64_t H = k->H;
    if (k->head16)
        k->be->matmul_w16(k->be, m, w, H, 1.0f, x, H, k->head16 + off * H, H, 0.0f, z, w);
    else
        k->product(k->be, 0, 1, m, w, H, 1.0f, x, H, k->head32 + off * H, H, 0.0f, z, w);
}

/* dhs (m, H) = g (m, w) . W[off .. off+w) (w, H) + beta dhs */
static void tile_grad(const loss_run *k, const float *g, int64_t m, int64_t off, int64_t w,
                      float beta, float *dhs)
{
    const int64_t H = k->H;
    if (k->head16)
        k->be->matmul_w16_nn(k->be, m, H, w, 1.0f, g, w, k->head16 + off * H, H, beta, dhs, H);
    else
        k->product(k->be, 0, 0, m, H, w, 1.0f, g, w, k->head32 + off * H, H, beta, dhs, H);
}

int ddk_cpu_loss(const ddk_backend *be, const ddk_loss_params *p,
                 const float *student_hidden,  /* (n, H) */
                 const float *teacher_hidden,  /* (n, H) or NULL */
                 const void *lm_head,          /* (V, H): float, or uint16_t bf16 (p->head_bf16) */
                 const int32_t *labels,        /* (n) or NULL */
                 const float *weights,         /* (n) or NULL */
                 float *grad_student,          /* (n, H) or NULL */
                 float *per_position,          /* (n) or NULL */
                 ddk_loss_result *out)
{
    ddk_loss_shape shape;
    int rc = ddk_loss_shape_of(p, p ? ddk_loss_uses_teacher(p, labels != NULL) : 0, &shape);
    if (rc == 0)
        rc = ddk_loss_check_call(p, student_hidden, teacher_hidden, lm_head, labels, weights, out);
    if (rc)
        return rc;

    const int64_t n = p->n, H = p->hidden, V = p->vocab;
    double weight_sum = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < n; i++) {
        float w = weights ? weights[i] : 1.0f;
        if ((labels && labels[i] < 0) || !(w > 0.0f))
            continue;
        weight_sum += w;
        counted++;
    }
    if (counted == 0) {   /* nothing to learn from: loss 0, gradient 0 */
        if (grad_student)
            memset(grad_student, 0, (size_t)(n * H) * sizeof(float));
        if (per_position)
            memset(per_position, 0, (size_t)n * sizeof(float));
        *out = (ddk_loss_result){ 0 };
        return 0;
    }

    char *workspace = ddk_malloc(be->alloc, shape.workspace_bytes);
    if (!workspace)
        return -ENOMEM;
    ddk_loss_row *rows = (ddk_loss_row *)workspace;                          /* (chunk) */
    float *zs = (float *)(workspace + shape.rows_bytes);                     /* (chunk, width) */
    float *zt = shape.uses_teacher ? (float *)(workspace + shape.rows_bytes + shape.logits_bytes)
                                   : NULL;                                   /* (chunk, width) */

    loss_run k = {
        .be = be,
        .product = p->bf16_products ? be->matmul_bf16 : be->matmul,
        .head32 = p->head_bf16 ? NULL : lm_head,
        .head16 = p->head_bf16 ? lm_head : NULL,
        .H = H,
        .alpha = p->kl_weight,
        .T = p->kl_temperature,
        .invT = 1.0f / p->kl_temperature,
        .lambda = p->cap_weight,
        .invTc = 1.0f / p->cap_temperature,
        .kl = p->kl_weight > 0.0f,
        .kl_scaled = p->kl_weight > 0.0f && p->kl_temperature != 1.0f,
        .cap = p->cap_weight > 0.0f,
        .cap_scaled = p->cap_temperature != 1.0f,
        .given_labels = labels != NULL,
    };
    tile_sums_fn sums = pick_tile_sums(&k);
    const int64_t width = shape.width;
    const int tiled = width < V;
    double sum_l = 0, sum_ce = 0, sum_kl = 0, sum_cap = 0;
    int64_t correct = 0;

    for (int64_t r0 = 0; r0 < n; r0 += shape.chunk) {
        const int64_t m = n - r0 < shape.chunk ? n - r0 : shape.chunk;
        const float *hs = student_hidden + r0 * H;                            /* (m, H) */
        const float *ht = zt ? teacher_hidden + r0 * H : NULL;                /* (m, H) */
        for (int64_t r = 0; r < m; r++)
            row_init(&k, &rows[r], labels ? labels[r0 + r] : -1, weights ? weights[r0 + r] : 1.0f);

        for (int64_t off = 0; off < V; off += width) {
            const int64_t w = V - off < width ? V - off : width;
            tile_logits(&k, hs, m, off, w, zs);
            if (zt)
                tile_logits(&k, ht, m, off, w, zt);
            for (int64_t r = 0; r < m; r++)
                if (!rows[r].ignored)
                    row_stats_tile(&k, sums, &rows[r], zs + r * w, zt ? zt + r * w : NULL, off, w);
        }

        for (int64_t r = 0; r < m; r++) {
            ddk_loss_row *row = &rows[r];
            double l = 0.0;
            if (!row->ignored) {
                double w = weights ? weights[r0 + r] : 1.0;
                loss_terms t = row_terms(&k, row);
                row->scale = w / weight_sum;
                l = t.l;
                sum_l += w * t.l;
                sum_ce += w * t.ce;
                sum_kl += w * t.kl;
                sum_cap += w * t.cap;
                correct += row->confident;
            }
            if (per_position)
                per_position[r0 + r] = (float)l;
        }

        if (!grad_student)
            continue;
        float *dhs = grad_student + r0 * H;                                    /* (m, H) */
        for (int64_t off = 0; off < V; off += width) {
            const int64_t w = V - off < width ? V - off : width;
            if (tiled) {
                tile_logits(&k, hs, m, off, w, zs);
                if (k.kl)
                    tile_logits(&k, ht, m, off, w, zt);
            }
            for (int64_t r = 0; r < m; r++) {
                const ddk_loss_row *row = &rows[r];
                float *g = zs + r * w;                                         /* (w) */
                const float *t = zt ? zt + r * w : NULL;                       /* (w) */
                if (row->ignored) {
                    memset(g, 0, (size_t)w * sizeof(float));
                    continue;
                }
                float zt_label = t && row->label >= off && row->label < off + w ? t[row->label - off] : 0.0f;
                grad_coeffs c = row_grad_coeffs(&k, row);
                pick_grad_tile(&k, row->confident)(g, t, w, &c);
                if (row->label >= off && row->label < off + w)
                    g[row->label - off] = grad_at_label(&k, row, zt_label);
            }
            tile_grad(&k, zs, m, off, w, off == 0 ? 0.0f : 1.0f, dhs);   /* accumulated over tiles */
        }
    }
    ddk_free(be->alloc, workspace, shape.workspace_bytes);

    *out = (ddk_loss_result){
        .loss = sum_l / weight_sum,
        .ce = sum_ce / weight_sum,
        .kl = sum_kl / weight_sum,
        .cap = sum_cap / weight_sum,
        .weight_sum = weight_sum,
        .counted = counted,
        .correct = correct,
    };
    return 0;
}
