/* loss_cpu.c: the fused, chunked lm_head + CE + KL + CAP loss on the CPU (SPEC.md section 1).
 *
 * Positions are processed `chunk` at a time, so the logits never exist for all n positions.
 * Within a chunk the vocabulary is one tile (vocab_tile = 0: the chunk's student and teacher
 * logits materialised, the gradient formed in place over the student's, three logit-sized
 * products) or streamed tiles of vocab_tile columns (online-softmax statistics merged tile by
 * tile, logits recomputed for the gradient: five products, workspace independent of V).
 * Both modes run the same code: "whole vocabulary" is the one-tile case.
 *
 * With the DFlash2 selector (p->selector, SPEC.md 2.1) selector_cpu.c adds its term inside the
 * same passes: an online top-K of each tile's logits, after the vocabulary pass its per-row
 * scores (l_i += weight l_sel, in the same weighted sum), ds_k added into g at the candidates'
 * columns before g's product with W, then dq Hp into d hs and the selector tensors' gradients.
 * Without it (NULL) nothing of it runs: the results are the plain loss's, bit for bit.
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
 * Tested by tests/kernels/test_loss.c (float64 C reference, finite differences, chunk/tile
 * invariance, budgets, the bf16 head bit for bit against the widened one, rows wider than a
 * sum block, logits of +-200, the 8-lane kernels against the scalar exp),
 * tests/kernels/test_loss_selector.c (the selector's term: reference, finite differences,
 * invariance, ties, refusals, budgets),
 * tests/kernels/test_loss_online.c (-inf columns, also whole -inf tiles: finite, gradient 0 there, the
 * values of the vocabulary without them) and tests/oracle/loss_torch_check.py (PyTorch autograd).
 *
 * Legend: n positions, H hidden, V vocabulary, m rows of the current chunk, w tile width.
 */
#include "ddk.h"
#include "loss_row.h"   /* the arithmetic per position, the CUDA kernels' too; loss_internal.h */
#include "cpu_backend.h"
#include "selector_cpu.h"   /* the DFlash2 selector's term */
#include "ddk_vmath.h"

#include <errno.h>
#include <math.h>
#include <string.h>

/* One call's products against the head (its constants are a ddk_loss_consts, loss_row.h). */
typedef struct loss_run {
    const ddk_backend *be;
    /* the products on an fp32 head: be->matmul, or be->matmul_bf16 when p->bf16_products */
    ddk_cpu_product_fn product;
    const float *head32;      /* lm_head (V, H) fp32, or NULL ... */
    const uint16_t *head16;   /* ... when it is bf16 (p->head_bf16): be->matmul_w16 / _nn */
    int64_t H;
} loss_run;

/* ------------------------------------------------------------------------------------------
 * Statistics of one tile row. The kernels are instantiated per term combination so that each
 * loop is branch-free (a generic loop would compute every exp for every term), and written on
 * ddk_vmath.h's 8-lane vectors: GCC does not vectorise ddk_expf in a `#pragma omp simd` loop
 * on AVX2, and scalar exps were half the loss's time there (ddk_vmath.h says why). A column's
 * terms and its gradient are loss_row.h's (DDK_LOSS_COLUMN, DDK_LOSS_GRAD), on 8 lanes.
 */

typedef struct tile_sums {
    double v[DDK_LOSS_SUMS];   /* as in ddk_loss_row, for this tile only (DDK_SUM_* order) */
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

/* loss_row.h's NONZERO on 8 lanes: x where e != 0, else 0 (selected, never 0 * -inf) */
#define LANES_NONZERO(e, x) ddk_f8_select((e) != ddk_f8_splat(0.0f), (x), ddk_f8_splat(0.0f))
/* its EXP for the sums: 0 in the lanes that are not columns (keep, lane_sums_add's) */
#define KEPT_EXPF8(x) ddk_f8_select(keep, ddk_expf8(x), ddk_f8_splat(0.0f))

/* Adds 8 columns (zs, zt: their logits) to the lane sums (DDK_LOSS_COLUMN). keep: the lanes
 * that count (all but a row's padding); rest leaves out the lane whose column minus the
 * label's is 0. A -inf column adds 0 to every sum (loss_row.h). */
static inline __attribute__((always_inline)) void
lane_sums_add(lane_sums *a, ddk_f8 zs, ddk_f8 zt, ddk_i8 keep, ddk_i8 from_label, float s_max,
              float t_max, float invT, float invTc, const int kl, const int kl_scaled,
              const int cap_scaled)
{
    ddk_f8 e;
    DDK_LOSS_COLUMN(ddk_f8, a, e, zs, zt, s_max, t_max, invT, invTc, kl, kl_scaled, cap_scaled,
                    KEPT_EXPF8, LANES_NONZERO);
    a->rest += ddk_f8_select(from_label == 0, ddk_f8_splat(0.0f), e);
}

static inline __attribute__((always_inline)) tile_sums
tile_sums_impl(const float *zs, const float *zt, int64_t w, float s_max, float t_max,
               int64_t label_col, float invT, float invTc, const int kl, const int kl_scaled,
               const int cap_scaled)
{
    const ddk_i8 all = { -1, -1, -1, -1, -1, -1, -1, -1 };
    const ddk_f8 zero = ddk_f8_splat(0.0f);
    tile_sums out = { { 0, 0, 0, 0, 0, 0, 0 } };
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
        out.v[DDK_SUM_S] += ddk_f8_sum(a.s);
        out.v[DDK_SUM_REST] += ddk_f8_sum(a.rest);
        out.v[DDK_SUM_ST] += ddk_f8_sum(a.sT);
        out.v[DDK_SUM_C] += ddk_f8_sum(a.c);
        out.v[DDK_SUM_CD] += ddk_f8_sum(a.cd);
        out.v[DDK_SUM_T] += ddk_f8_sum(a.t);
        out.v[DDK_SUM_TD] += ddk_f8_sum(a.td);
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

static tile_sums_fn pick_tile_sums(const ddk_loss_consts *k)
{
    static const tile_sums_fn table[2][2][2] = {   /* [kl][kl_scaled][cap_scaled] */
        { { tile_sums_000, tile_sums_001 }, { tile_sums_000, tile_sums_001 } },
        { { tile_sums_100, tile_sums_101 }, { tile_sums_110, tile_sums_111 } },
    };
    return table[k->kl][k->kl_scaled][k->cap_scaled];
}

/* Merges one tile (columns off .. off+w) of one position into its running statistics
 * (loss_row.h): the tile's maxima decide, what earlier tiles summed is brought to the new
 * maxima, then this tile's sums at them are added. zs (w), zt (w) or NULL when no teacher
 * logits are used. */
static void row_stats_tile(const ddk_loss_consts *k, tile_sums_fn sums, ddk_loss_row *r,
                           const float *zs, const float *zt, int64_t off, int64_t w)
{
    float tile_s_max, tile_t_max = 0.0f;
    const int64_t tile_s_arg = ddk_vargmax(zs, w, &tile_s_max);
    const int64_t tile_t_arg = zt ? ddk_vargmax(zt, w, &tile_t_max) : 0;
    const ddk_loss_tile p =
        ddk_loss_tile_of(r, tile_s_max, tile_t_max, (int)tile_t_arg, zt != NULL, off, w, k);
    ddk_loss_row_rescale(r, &p, (int)tile_s_arg, off, k);
    const tile_sums ts = sums(zs, zt, w, p.s_max > -INFINITY ? p.s_max : 0.0f,
                              p.t_max > -INFINITY ? p.t_max : 0.0f, p.label_col, k->invT,
                              k->invTc);
    ddk_loss_row_add(r, &p, ts.v, off, k);
    if (p.label_col >= 0)
        r->z_label = zs[p.label_col];
}

/* ------------------------------------------------------------------------------------------
 * Gradient of one tile row, formed in place over the student logits.
 */

typedef struct grad_coeffs {
    float s_max, t_max;
    ddk_loss_grad_coeffs g;   /* loss_row.h's (g_label unused: the label's element is apart) */
    float invT, invTc;
} grad_coeffs;

/* g of 8 columns (z, zt: their logits), DDK_LOSS_GRAD; 0 at a -inf column (and its teacher's) */
static inline __attribute__((always_inline)) ddk_f8
grad_lanes(ddk_f8 z, ddk_f8 zt, const grad_coeffs *g, const int kl, const int kl_scaled,
           const int cap)
{
    ddk_f8 gv;
    DDK_LOSS_GRAD(ddk_f8, gv, z, zt, &g->g, g->s_max, g->t_max, g->invT, g->invTc, kl, kl_scaled,
                  cap, ddk_expf8, LANES_NONZERO);
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

static grad_tile_fn pick_grad_tile(const ddk_loss_consts *k, int confident)
{
    static const grad_tile_fn table[2][2][2] = {   /* [kl][kl_scaled][cap] */
        { { grad_tile_000, grad_tile_001 }, { grad_tile_000, grad_tile_001 } },
        { { grad_tile_100, grad_tile_101 }, { grad_tile_110, grad_tile_111 } },
    };
    return table[k->kl][k->kl_scaled][k->cap && confident];   /* c_i = 0: no CAP gradient */
}

/* the row's coefficients (loss_row.h) with what grad_lanes reads beside them */
static grad_coeffs row_grad_coeffs(const ddk_loss_consts *k, const ddk_loss_row *r)
{
    grad_coeffs c = {
        .s_max = r->s_max,
        .t_max = r->t_max,
        .g = ddk_loss_row_grad_coeffs(k, r, r->scale),
        .invT = k->invT,
        .invTc = k->invTc,
    };
    return c;
}

/* ------------------------------------------------------------------------------------------
 * The call.
 */

/* z (m, w) = x (m, H) . W[off .. off+w) (w, H)^T */
static void tile_logits(const loss_run *run, const float *x, int64_t m, int64_t off, int64_t w,
                        float *z)
{
    const int64_t H = run->H;
    if (run->head16)
        run->be->matmul_w16(run->be, m, w, H, 1.0f, x, H, run->head16 + off * H, H, 0.0f, z, w);
    else
        run->product(run->be, 0, 1, m, w, H, 1.0f, x, H, run->head32 + off * H, H, 0.0f, z, w);
}

/* dhs (m, H) = g (m, w) . W[off .. off+w) (w, H) + beta dhs */
static void tile_grad(const loss_run *run, const float *g, int64_t m, int64_t off, int64_t w,
                      float beta, float *dhs)
{
    const int64_t H = run->H;
    if (run->head16)
        run->be->matmul_w16_nn(run->be, m, H, w, 1.0f, g, w, run->head16 + off * H, H, beta, dhs,
                               H);
    else
        run->product(run->be, 0, 0, m, H, w, 1.0f, g, w, run->head32 + off * H, H, beta, dhs, H);
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
    if (rc == 0 && p->selector)
        rc = ddk_loss_check_selector(p, p->selector->predecessors, labels, weights, grad_student);
    if (rc)
        return rc;

    const int64_t n = p->n, H = p->hidden, V = p->vocab;
    int64_t counted;
    const double weight_sum = ddk_loss_weight_sum(n, labels, weights, &counted);
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

    const loss_run run = {
        .be = be,
        .product = p->bf16_products ? be->matmul_bf16 : be->matmul,
        .head32 = p->head_bf16 ? NULL : lm_head,
        .head16 = p->head_bf16 ? lm_head : NULL,
        .H = H,
    };
    const ddk_loss_consts k = ddk_loss_consts_of(p, labels != NULL);
    tile_sums_fn sums = pick_tile_sums(&k);
    const int64_t width = shape.width;
    const int tiled = width < V;
    double sum_l = 0, sum_ce = 0, sum_kl = 0, sum_cap = 0, sum_sel = 0;
    int64_t correct = 0, sel_covered = 0, sel_correct = 0;
    const ddk_selector *sp = p->selector;
    ddk_cpu_selector sel = { 0 };   /* read only when sp */
    if (sp)
        sel = (ddk_cpu_selector){
            .be = be,
            .product = run.product,
            .s = sp,
            .b = ddk_loss_sel_carve(&shape, workspace),
            .H = H,
            .K = sp->top_k,
            .r = sp->rank,
            .grads = grad_student && sp->weight > 0.0f,
            .to_hidden = grad_student && sp->weight > 0.0f && !sp->stop_gradient,
        };

    for (int64_t r0 = 0; r0 < n; r0 += shape.chunk) {
        const int64_t m = n - r0 < shape.chunk ? n - r0 : shape.chunk;
        const float *hs = student_hidden + r0 * H;                            /* (m, H) */
        const float *ht = zt ? teacher_hidden + r0 * H : NULL;                /* (m, H) */
        for (int64_t r = 0; r < m; r++)
            ddk_loss_row_init(&rows[r], labels ? labels[r0 + r] : -1,
                              weights ? weights[r0 + r] : 1.0f, k.given_labels);

        for (int64_t off = 0; off < V; off += width) {
            const int64_t w = V - off < width ? V - off : width;
            tile_logits(&run, hs, m, off, w, zs);
            if (zt)
                tile_logits(&run, ht, m, off, w, zt);
            for (int64_t r = 0; r < m; r++)
                if (!rows[r].ignored)
                    row_stats_tile(&k, sums, &rows[r], zs + r * w, zt ? zt + r * w : NULL, off, w);
            if (sp)
                ddk_cpu_sel_tile(&sel, rows, m, zs, off, w);
        }
        if (sp)
            ddk_cpu_sel_project(&sel, hs, m);

        for (int64_t r = 0; r < m; r++) {
            ddk_loss_row *row = &rows[r];
            double l = 0.0;
            if (!row->ignored) {
                double w = weights ? weights[r0 + r] : 1.0;
                const ddk_loss_terms t = ddk_loss_row_terms(&k, row);
                row->scale = w / weight_sum;
                l = t.l;
                if (sp) {   /* l_i += weight l_sel, in the same weighted sum */
                    const double l_sel =
                        ddk_cpu_sel_row(&sel, r, row, sp->predecessors[r0 + r], row->scale);
                    l += sp->weight * l_sel;
                    sum_sel += w * l_sel;
                    sel_covered += sel.b.rows[r].covered;
                    sel_correct += sel.b.rows[r].correct;
                }
                sum_l += w * l;
                sum_ce += w * t.ce;
                sum_kl += w * t.kl;
                sum_cap += w * t.cap;
                correct += row->confident;
            } else if (sp) {
                ddk_cpu_sel_row(&sel, r, row, 0, 0.0);   /* no term; dq's row 0 */
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
                tile_logits(&run, hs, m, off, w, zs);
                if (k.kl)
                    tile_logits(&run, ht, m, off, w, zt);
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
                    g[row->label - off] = ddk_loss_grad_at_label(&k, row, row->scale,
                                                                 zt_label);
                if (sp && sel.to_hidden)   /* the selector's ds at its candidates here */
                    ddk_cpu_sel_grad_tile(&sel, r, g, off, w);
            }
            tile_grad(&run, zs, m, off, w, off == 0 ? 0.0f : 1.0f, dhs);   /* accumulated over tiles */
        }
        if (sp && sel.grads)
            ddk_cpu_sel_backward(&sel, hs, m, sp->predecessors + r0, dhs);
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
        .sel = sum_sel / weight_sum,
        .sel_covered = sel_covered,
        .sel_correct = sel_correct,
    };
    return 0;
}
