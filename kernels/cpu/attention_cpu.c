/* attention_cpu.c: DFlash block attention (forward and backward), plain causal attention and
 * tree attention (the DDTree verify, forward only) on the CPU (SPEC.md section 2 step 4,
 * sections 3 and 7), flash-style.
 *
 * No mask and no score matrix ever exists for a whole sequence. The queries are taken in
 * groups (consecutive kept blocks, or consecutive positions for causal attention, times the
 * query heads that share one kv head, 16 to 256 rows) and every query row carries the
 * range [lo, hi) of keys it may see. Because the visible keys of a row are ONE contiguous range
 * per pass (context: [0, a_j) or the sliding [a_j + o - (Wn-1), a_j); own block: all B slots
 * (full_attention, or every layer of a bidirectional DFlash2 drafter) or slots 0..o; causal:
 * [0, t]), a key tile needs no mask: a row's scores outside its range are simply not used, and
 * the rows that see a tile at all form a contiguous run of the group (anchors are sorted), so
 * each tile is one matrix product over that run. A DFlash group makes
 * two passes: the context keys, then each block's own keys; causal attention's one pass, whose
 * queries may be the last q_rows of S positions (a cached step: only their ranges move). Tree
 * attention makes causal attention's pass over the cache, then gathers each node's root path
 * (not a range) a tile at a time (path_tile).
 * Forward keeps a running max, sum and rescaled accumulator per row (online softmax) and ends
 * with out = acc / sum and lse = max + log(sum); the backward recomputes each tile's probabilities from lse
 * (p = exp(s - lse)) and follows the standard flash backward with D = rowsum(dout * out).
 * Workspace is O(group rows x (d + KEY_TILE)), independent of S and A, from be->alloc.
 *
 * Deliberately not here: threads. The tile products are sized to run on the calling thread
 * (see KEY_TILE), so one call uses one core; splitting kv heads over threads would be the next
 * step if a profile of the training step ever shows attention, which next to the loss's
 * vocabulary-sized products it does not yet. Also not here: bf16 (the CUDA backend's job),
 * dropout or other masks. The engine does not need the anchors sorted for correctness, only for
 * speed: an unsorted group makes the run of rows per tile longer, its extra rows use nothing.
 * Anchors are clamped to [0, S]; padded blocks' anchors are never read.
 * Tested by tests/kernels/test_attention.c (float64 dense-mask reference, finite differences, guard
 * words, budgets; tree attention against a float64 reference of the tree's mask and, on a
 * chain, against causal attention); benchmarked against a dense-mask implementation by
 * tests/bench/bench_attention.c.
 *
 * Legend: S context rows, A anchors (blocks), B block size, nh query heads, nkv kv heads,
 * G = nh / nkv query heads per kv head, d head dim, R rows of a query group, n keys of a tile,
 * N tree nodes (their keys the last N of S), P = S - N cached keys before them.
 * Row-major; q (A*B, nh, d); k, v (S + A*B, nkv, d); a kv head's key rows have stride nkv*d.
 */
#include "ddk.h"
#include "cpu_backend.h"
#include "ddk_vmath.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <string.h>

/* KEY_TILE keys per tile. A group has about group_rows(d) query rows, so that every tile
 * product is rows x KEY_TILE x d <= SINGLE_THREAD_MNK multiply-adds: OpenBLAS computes such a
 * product on the calling thread, above it wakes its pool, and for products this small the
 * hand-off cost more than it gained (A=64 B=16 S=512 nh=8 d=32, forward + backward: 128 x 128
 * tiles took 22-28 ms with 2 BLAS threads and 14-17 ms with 1; 64-row x 64-key tiles take
 * 15-18 ms either way, and with one thread tile sizes from 64 to 256 were within noise).
 * Scores (rows x KEY_TILE) and accumulators (rows x d) then stay in L2. */
enum { KEY_TILE = 64, MAX_GROUP_ROWS = 256, SINGLE_THREAD_MNK = 1 << 18 };

static inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
static inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

static int64_t group_rows(int64_t d)
{
    return min64(MAX_GROUP_ROWS, max64(16, SINGLE_THREAD_MNK / (KEY_TILE * d)));
}

/* c (m, n) = alpha op(a) op(b) + beta c, row-major: the tile products */
static void gemm(int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                 const float *a, int64_t lda, const float *b, int64_t ldb, float beta,
                 float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* ------------------------------------------------------------------------------------------
 * One query group against one kv head: its gathered rows, their visible key ranges, and the
 * workspace of one tile. Shared by the forward and the backward (the backward's fields are
 * NULL in the forward and the other way round).
 */

typedef struct attn_group {
    int64_t R, d;       /* rows in the group, head dim */
    float scale;        /* 1 / sqrt(d) */
    const float *k;     /* key row 0 of this kv head; row t at k + t * ldk */
    const float *v;     /* value row 0 of this kv head, same stride */
    int64_t ldk;        /* nkv * d */
    float *q;           /* (R, d) the group's queries, gathered */
    int64_t *lo, *hi;   /* (R) key range [lo, hi) each row sees in the current pass */
    float *s;           /* (R, KEY_TILE) one tile's scores, then probabilities */
    /* forward */
    float *acc;         /* (R, d) unnormalised output, rescaled as the running max moves */
    float *m, *l;       /* (R) running max of the scaled scores, running sum of exp(s - m) */
    /* backward */
    float *dout;        /* (R, d) the rows' output gradients, gathered */
    float *dq;          /* (R, d) their query gradients, added into dq at the end */
    float *lse;         /* (R) the forward's log-sum-exp */
    float *D;           /* (R) rowsum(dout * out): the softmax backward's correction */
    float *dp;          /* (R, KEY_TILE) dout v^T, then ds */
    float *dk, *dv;     /* key/value gradient row 0 of this kv head, stride ldk */
} attn_group;

/* Forward over keys [t0, t1) for rows [r0, r1): the first and the last row that see part of
 * the tile, and the rows between them (which, with sorted anchors, see part of it too). */
static void forward_tile(attn_group *g, int64_t r0, int64_t r1, int64_t t0, int64_t t1)
{
    const int64_t n = t1 - t0, d = g->d;
    float *s = g->s;   /* (r1 - r0, n) */
    gemm(0, 1, r1 - r0, n, d, g->scale, g->q + r0 * d, d, g->k + t0 * g->ldk, g->ldk, 0.0f, s,
         n);
    for (int64_t r = r0; r < r1; r++) {
        float *sr = s + (r - r0) * n;   /* (n) */
        /* the row's visible columns [c0, c1); the rest of its scores are not used */
        const int64_t c0 = max64(g->lo[r], t0) - t0, c1 = min64(g->hi[r], t1) - t0;
        if (c0 >= c1) {   /* inside the run of rows but sees nothing here (unsorted anchors) */
            memset(sr, 0, (size_t)n * sizeof *sr);
            continue;
        }
        const float m_old = g->m[r];
        const float m_new = fmaxf(m_old, ddk_vmax(sr + c0, c1 - c0));
        /* m_old = -inf before the row's first key: expf(-inf) = 0 drops the empty state */
        const float rescale = expf(m_old - m_new);
        float sum = 0.0f;
        for (int64_t c = 0; c < c0; c++)
            sr[c] = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int64_t c = c0; c < c1; c++) {
            float p = ddk_expf(sr[c] - m_new);
            sr[c] = p;
            sum += p;
        }
        for (int64_t c = c1; c < n; c++)
            sr[c] = 0.0f;
        g->l[r] = g->l[r] * rescale + sum;
        g->m[r] = m_new;
        if (rescale != 1.0f) {
            float *ar = g->acc + r * d;   /* (d) */
#pragma omp simd
            for (int64_t i = 0; i < d; i++)
                ar[i] *= rescale;
        }
    }
    gemm(0, 0, r1 - r0, d, n, 1.0f, s, n, g->v + t0 * g->ldk, g->ldk, 1.0f, g->acc + r0 * d, d);
}

/* Backward over keys [t0, t1) for rows [r0, r1): p = exp(s - lse) recomputed, then
 * dv += p^T dout, ds = p (dout v^T - D), dq += scale ds k, dk += scale ds^T q. */
static void backward_tile(attn_group *g, int64_t r0, int64_t r1, int64_t t0, int64_t t1)
{
    const int64_t n = t1 - t0, d = g->d, rows = r1 - r0, ldk = g->ldk;
    float *p = g->s;     /* (rows, n) */
    float *ds = g->dp;   /* (rows, n) */
    gemm(0, 1, rows, n, d, g->scale, g->q + r0 * d, d, g->k + t0 * ldk, ldk, 0.0f, p, n);
    gemm(0, 1, rows, n, d, 1.0f, g->dout + r0 * d, d, g->v + t0 * ldk, ldk, 0.0f, ds, n);
    for (int64_t r = r0; r < r1; r++) {
        float *pr = p + (r - r0) * n, *dsr = ds + (r - r0) * n;   /* (n) */
        const int64_t c0 = min64(max64(g->lo[r], t0) - t0, n);
        const int64_t c1 = max64(min64(g->hi[r], t1) - t0, c0);
        const float lse = g->lse[r], D = g->D[r], scale = g->scale;
        for (int64_t c = 0; c < c0; c++)
            pr[c] = dsr[c] = 0.0f;
        /* ds carries the scale of s = scale q.k, so both products below take it as is */
#pragma omp simd
        for (int64_t c = c0; c < c1; c++) {
            float pc = ddk_expf(pr[c] - lse);
            pr[c] = pc;
            dsr[c] = pc * (dsr[c] - D) * scale;
        }
        for (int64_t c = c1; c < n; c++)
            pr[c] = dsr[c] = 0.0f;
    }
    gemm(1, 0, n, d, rows, 1.0f, p, n, g->dout + r0 * d, d, 1.0f, g->dv + t0 * ldk, ldk);
    gemm(0, 0, rows, d, n, 1.0f, ds, n, g->k + t0 * ldk, ldk, 1.0f, g->dq + r0 * d, d);
    gemm(1, 0, n, d, rows, 1.0f, ds, n, g->q + r0 * d, d, 1.0f, g->dk + t0 * ldk, ldk);
}

/* One pass of rows [ra, rb) over the keys they see (their lo/hi), KEY_TILE keys at a time.
 * Each tile's product covers only the run of rows from the first to the last that sees it. */
static void group_pass(attn_group *g, int64_t ra, int64_t rb, int backward)
{
    int64_t k0 = INT64_MAX, k1 = INT64_MIN;
    for (int64_t r = ra; r < rb; r++)
        if (g->lo[r] < g->hi[r]) {
            k0 = min64(k0, g->lo[r]);
            k1 = max64(k1, g->hi[r]);
        }
    for (int64_t t0 = k0; t0 < k1; t0 += KEY_TILE) {
        const int64_t t1 = min64(t0 + KEY_TILE, k1);
        int64_t r0 = ra, r1 = rb;
        while (r0 < rb && !(g->lo[r0] < t1 && g->hi[r0] > t0 && g->lo[r0] < g->hi[r0]))
            r0++;
        while (r1 > r0 && !(g->lo[r1 - 1] < t1 && g->hi[r1 - 1] > t0 &&
                            g->lo[r1 - 1] < g->hi[r1 - 1]))
            r1--;
        if (r0 == r1)
            continue;
        if (backward)
            backward_tile(g, r0, r1, t0, t1);
        else
            forward_tile(g, r0, r1, t0, t1);
    }
}

/* Forward state before the first pass. */
static void forward_begin(attn_group *g)
{
    for (int64_t r = 0; r < g->R; r++) {
        g->m[r] = -INFINITY;
        g->l[r] = 0.0f;
    }
    memset(g->acc, 0, (size_t)(g->R * g->d) * sizeof *g->acc);
}

/* ------------------------------------------------------------------------------------------
 * Workspace: one allocation, carved by one table for both directions.
 */

typedef struct attn_workspace {
    void *base;
    size_t bytes;
} attn_workspace;

/* Carves g's buffers for R rows out of ws (base NULL: only counts the bytes). */
static size_t carve(attn_group *g, int64_t R, int64_t d, int backward, char *base)
{
    size_t off = 0;
#define CARVE(field, count)                                                                    \
    do {                                                                                       \
        if (base)                                                                              \
            g->field = (void *)(base + off);                                                   \
        off += ((size_t)(count) * sizeof *g->field + 63) / 64 * 64;                            \
    } while (0)
    CARVE(q, R * d);
    CARVE(lo, R);
    CARVE(hi, R);
    CARVE(s, R * KEY_TILE);
    if (!backward) {
        CARVE(acc, R * d);
        CARVE(m, R);
        CARVE(l, R);
    } else {
        CARVE(dout, R * d);
        CARVE(dq, R * d);
        CARVE(lse, R);
        CARVE(D, R);
        CARVE(dp, R * KEY_TILE);
    }
#undef CARVE
    return off;
}

static int workspace_get(const ddk_backend *be, attn_group *g, int64_t R, int64_t d,
                         int backward, attn_workspace *ws)
{
    ws->bytes = carve(g, R, d, backward, NULL);
    ws->base = ddk_malloc(be->alloc, ws->bytes);
    if (!ws->base)
        return -ENOMEM;
    carve(g, R, d, backward, ws->base);
    return 0;
}

static void workspace_put(const ddk_backend *be, attn_workspace *ws)
{
    ddk_free(be->alloc, ws->base, ws->bytes);
}

/* ------------------------------------------------------------------------------------------
 * DFlash attention. A group is up to group_rows(d) / (B*G) consecutive kept blocks (at least one);
 * its row r = (ib * B + o) * G + hh is slot o of the group's block ib, query head g*G + hh.
 */

static int shape_ok(const ddk_attention_shape *sh)
{
    return sh->S >= 0 && sh->A >= 0 && sh->B >= 1 && sh->nh >= 1 && sh->nkv >= 1 &&
           sh->nh % sh->nkv == 0 && sh->d >= 1 && sh->window >= 0;
}

/* blocks per group and the rows that makes */
static int64_t blocks_per_group(const ddk_attention_shape *sh)
{
    const int64_t rows_per_block = sh->B * (sh->nh / sh->nkv);
    return max64(1, group_rows(sh->d) / rows_per_block);
}

/* The group's rows' key ranges for the context pass (own = 0) or the own-block pass. */
static void dflash_ranges(attn_group *g, const ddk_attention_shape *sh, const int64_t *blocks,
                          int64_t nb, const int32_t *anchors, int own)
{
    const int64_t B = sh->B, G = sh->nh / sh->nkv, W = sh->window;
    for (int64_t ib = 0; ib < nb; ib++) {
        const int64_t j = blocks[ib];
        const int64_t a = min64(max64(anchors[j], 0), sh->S);   /* context rows before the anchor */
        for (int64_t o = 0; o < B; o++) {
            int64_t lo, hi;
            if (!own) {
                lo = W > 0 ? min64(max64(a + o - (W - 1), 0), a) : 0;
                hi = a;
            } else {   /* slots <= o in a sliding layer, unless bidirectional (DFlash2) */
                lo = sh->S + j * B;
                hi = lo + (W > 0 && !sh->bidirectional ? o + 1 : B);
            }
            for (int64_t hh = 0; hh < G; hh++) {
                const int64_t r = (ib * B + o) * G + hh;
                g->lo[r] = lo;
                g->hi[r] = hi;
            }
        }
    }
}

/* rows (ib, o, hh) of the group <-> x (A*B, nh, d) at head gk*G + hh: copy in or out */
static void dflash_gather(float *rows, const float *x, const ddk_attention_shape *sh,
                          const int64_t *blocks, int64_t nb, int64_t gk)
{
    const int64_t B = sh->B, G = sh->nh / sh->nkv, d = sh->d, nh = sh->nh;
    for (int64_t ib = 0; ib < nb; ib++)
        for (int64_t o = 0; o < B; o++)   /* the G heads of one slot are contiguous in x */
            memcpy(rows + (ib * B + o) * G * d, x + ((blocks[ib] * B + o) * nh + gk * G) * d,
                   (size_t)(G * d) * sizeof *rows);
}

/* What the DFlash forward and backward share before their loops: the shape checked, the
 * group sized and its workspace taken. 0 ready, 1 nothing to do (A = 0), or a negative errno. */
static int dflash_begin(const ddk_backend *be, const ddk_attention_shape *shape, int backward,
                        attn_group *g, attn_workspace *ws)
{
    if (!shape_ok(shape))
        return -EINVAL;
    if (shape->A == 0)
        return 1;
    const int64_t G = shape->nh / shape->nkv;
    *g = (attn_group){ .R = blocks_per_group(shape) * shape->B * G, .d = shape->d,
                       .scale = (float)(1.0 / sqrt((double)shape->d)), .ldk = shape->nkv * shape->d };
    return workspace_get(be, g, g->R, shape->d, backward, ws) ? -ENOMEM : 0;
}

int64_t ddk_attention_workspace_bytes(const ddk_attention_shape *shape, int backward)
{
    if (!shape_ok(shape))
        return -EINVAL;
    attn_group g = { .R = blocks_per_group(shape) * shape->B * (shape->nh / shape->nkv), .d = shape->d };
    return (int64_t)carve(&g, g.R, shape->d, backward, NULL);
}

int ddk_cpu_dflash_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                             const float *q, const float *k, const float *v,
                             const int32_t *anchors, const uint8_t *keep, float *out, float *lse)
{
    attn_group g;
    attn_workspace ws;
    int rc = dflash_begin(be, shape, 0, &g, &ws);
    if (rc)
        return rc > 0 ? 0 : rc;
    const int64_t A = shape->A, B = shape->B, nh = shape->nh, nkv = shape->nkv, d = shape->d;
    const int64_t G = nh / nkv, per_group = blocks_per_group(shape);

    int64_t blocks[MAX_GROUP_ROWS];   /* the current group's block indices (per_group of them) */
    int64_t j = 0;
    for (;;) {
        int64_t nb = 0;   /* the next group: up to per_group kept blocks, padded ones zeroed */
        for (; j < A && nb < per_group; j++) {
            if (keep[j]) {
                blocks[nb++] = j;
            } else {
                memset(out + j * B * nh * d, 0, (size_t)(B * nh * d) * sizeof *out);
                memset(lse + j * B * nh, 0, (size_t)(B * nh) * sizeof *lse);
            }
        }
        if (nb == 0)
            break;
        const int64_t R = nb * B * G;
        for (int64_t gk = 0; gk < nkv; gk++) {
            g.R = R;
            g.k = k + gk * d;
            g.v = v + gk * d;
            dflash_gather(g.q, q, shape, blocks, nb, gk);
            forward_begin(&g);
            dflash_ranges(&g, shape, blocks, nb, anchors, 0);
            group_pass(&g, 0, R, 0);
            dflash_ranges(&g, shape, blocks, nb, anchors, 1);
            for (int64_t ib = 0; ib < nb; ib++)   /* own keys differ per block: one run each */
                group_pass(&g, ib * B * G, (ib + 1) * B * G, 0);
            /* every kept row saw at least its own slot, so l > 0 */
            for (int64_t r = 0; r < R; r++) {
                const int64_t ib = r / (B * G), o = r / G % B, hh = r % G;
                const int64_t row = (blocks[ib] * B + o) * nh + gk * G + hh;
                const float inv = 1.0f / g.l[r];
                const float *ar = g.acc + r * d;   /* (d) */
                float *yr = out + row * d;         /* (d) */
#pragma omp simd
                for (int64_t i = 0; i < d; i++)
                    yr[i] = ar[i] * inv;
                lse[row] = g.m[r] + logf(g.l[r]);
            }
        }
    }
    workspace_put(be, &ws);
    return 0;
}

int ddk_cpu_dflash_attention_backward(const ddk_backend *be, const ddk_attention_shape *shape,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *anchors, const uint8_t *keep,
                                      const float *out, const float *lse, const float *dout,
                                      float *dq, float *dk, float *dv)
{
    attn_group g;
    attn_workspace ws;
    int rc = dflash_begin(be, shape, 1, &g, &ws);
    if (rc)
        return rc > 0 ? 0 : rc;
    const int64_t A = shape->A, B = shape->B, nh = shape->nh, nkv = shape->nkv, d = shape->d;
    const int64_t G = nh / nkv, per_group = blocks_per_group(shape);

    int64_t blocks[MAX_GROUP_ROWS];
    int64_t j = 0;
    for (;;) {
        int64_t nb = 0;   /* padded blocks get and give no gradient: they are simply left out */
        for (; j < A && nb < per_group; j++)
            if (keep[j])
                blocks[nb++] = j;
        if (nb == 0)
            break;
        const int64_t R = nb * B * G;
        for (int64_t gk = 0; gk < nkv; gk++) {
            g.R = R;
            g.k = k + gk * d;
            g.v = v + gk * d;
            g.dk = dk + gk * d;
            g.dv = dv + gk * d;
            dflash_gather(g.q, q, shape, blocks, nb, gk);
            dflash_gather(g.dout, dout, shape, blocks, nb, gk);
            memset(g.dq, 0, (size_t)(R * d) * sizeof *g.dq);
            for (int64_t r = 0; r < R; r++) {
                const int64_t ib = r / (B * G), o = r / G % B, hh = r % G;
                const int64_t row = (blocks[ib] * B + o) * nh + gk * G + hh;
                const float *yr = out + row * d, *dyr = g.dout + r * d;   /* (d) */
                float D = 0.0f;
#pragma omp simd reduction(+ : D)
                for (int64_t i = 0; i < d; i++)
                    D += yr[i] * dyr[i];
                g.D[r] = D;
                g.lse[r] = lse[row];
            }
            dflash_ranges(&g, shape, blocks, nb, anchors, 0);
            group_pass(&g, 0, R, 1);
            dflash_ranges(&g, shape, blocks, nb, anchors, 1);
            for (int64_t ib = 0; ib < nb; ib++)
                group_pass(&g, ib * B * G, (ib + 1) * B * G, 1);
            for (int64_t ib = 0; ib < nb; ib++)   /* add the group's dq into dq */
                for (int64_t o = 0; o < B; o++) {
                    const float *src = g.dq + (ib * B + o) * G * d;      /* (G, d) */
                    float *dst = dq + ((blocks[ib] * B + o) * nh + gk * G) * d; /* (G, d) */
#pragma omp simd
                    for (int64_t i = 0; i < G * d; i++)
                        dst[i] += src[i];
                }
        }
    }
    workspace_put(be, &ws);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Causal attention (the target's forward): T query rows at positions p0 = S - T .. S - 1 (a
 * prefill: T = S, p0 = 0). A group is up to group_rows(d) / G consecutive query rows; its row
 * r = (t - t_first) * G + hh, query head gk*G + hh; query t sees keys [0, p0 + t].
 */

/* g's rows for kv head gk: the G query heads of rows first .. first+np-1 of q (T, nh, d), each
 * row i seeing keys [0, hi0 + hi_step * i) of k, v (S, nkv, d) */
static void group_load(attn_group *g, const float *q, const float *k, const float *v, int64_t first, int64_t np,
                       int64_t nh, int64_t gk, int64_t G, int64_t hi0, int64_t hi_step)
{
    const int64_t d = g->d;
    g->R = np * G;
    g->k = k + gk * d;
    g->v = v + gk * d;
    for (int64_t i = 0; i < np; i++) {
        memcpy(g->q + i * G * d, q + ((first + i) * nh + gk * G) * d, (size_t)(G * d) * sizeof *g->q);
        for (int64_t hh = 0; hh < G; hh++) {
            g->lo[i * G + hh] = 0;
            g->hi[i * G + hh] = hi0 + hi_step * i;
        }
    }
}

/* out (T, nh, d) rows first .. of kv head gk's G query heads = g's accumulators / their sums */
static void group_store(const attn_group *g, float *out, int64_t first, int64_t R, int64_t nh, int64_t gk, int64_t G)
{
    const int64_t d = g->d;
    for (int64_t r = 0; r < R; r++) {
        const float inv = 1.0f / g->l[r];
        const float *ar = g->acc + r * d;                                 /* (d) */
        float *yr = out + ((first + r / G) * nh + gk * G + r % G) * d;    /* (d) */
#pragma omp simd
        for (int64_t i = 0; i < d; i++)
            yr[i] = ar[i] * inv;
    }
}

/* Positions per group of the causal and the tree forward: a group is their G heads each */
static int64_t positions_per_group(int64_t nh, int64_t nkv, int64_t d)
{
    return max64(1, group_rows(d) / (nh / nkv));
}

/* What the causal and the tree forward share before their loops: the group of
 * positions_per_group positions sized and its workspace taken. 0 or -ENOMEM. */
static int positions_begin(const ddk_backend *be, const ddk_attention_shape *shape, attn_group *g,
                           attn_workspace *ws)
{
    const int64_t G = shape->nh / shape->nkv;
    *g = (attn_group){ .R = positions_per_group(shape->nh, shape->nkv, shape->d) * G, .d = shape->d,
                       .scale = (float)(1.0 / sqrt((double)shape->d)), .ldk = shape->nkv * shape->d };
    return workspace_get(be, g, g->R, shape->d, 0, ws);
}

int64_t ddk_causal_attention_workspace_bytes(int64_t nh, int64_t nkv, int64_t d)
{
    if (nh < 1 || nkv < 1 || nh % nkv || d < 1)
        return -EINVAL;
    attn_group g = { .R = positions_per_group(nh, nkv, d) * (nh / nkv), .d = d };
    return (int64_t)carve(&g, g.R, d, 0, NULL);
}

int ddk_cpu_causal_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                             const float *q, const float *k, const float *v, float *out)
{
    if (!(shape->S >= 0 && shape->nh >= 1 && shape->nkv >= 1 && shape->nh % shape->nkv == 0 &&
          shape->d >= 1 && shape->q_rows >= 0 && shape->q_rows <= shape->S))
        return -EINVAL;
    const int64_t T = shape->q_rows ? shape->q_rows : shape->S, p0 = shape->S - T;
    const int64_t nh = shape->nh, nkv = shape->nkv, G = nh / nkv;
    if (T == 0)
        return 0;
    attn_group g;
    attn_workspace ws;
    if (positions_begin(be, shape, &g, &ws))
        return -ENOMEM;
    const int64_t per_group = g.R / G;   /* positions a group */

    for (int64_t t_first = 0; t_first < T; t_first += per_group) {
        const int64_t np = min64(per_group, T - t_first), R = np * G;
        for (int64_t gk = 0; gk < nkv; gk++) {
            group_load(&g, q, k, v, t_first, np, nh, gk, G, p0 + t_first + 1, 1);
            forward_begin(&g);
            group_pass(&g, 0, R, 0);
            group_store(&g, out, t_first, R, nh, gk, G);
        }
    }
    workspace_put(be, &ws);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Tree attention (the target's DDTree verify): N node rows, the last N of S key positions, after
 * P = S - N cached keys. Every node sees the whole cache, one contiguous range for all of them,
 * so the cache pass is causal attention's with [lo, hi) = [0, P) for every row of a group
 * (same groups: row r = (i - i_first) * G + hh). The root path of node i (i, parents[i], ...)
 * is not a range: its keys are gathered, KEY_TILE at a time, and each of the node's G rows
 * continues its online softmax over them (path_tile). Paths are short (a tree of a few hundred
 * nodes), the cache long, so the BLAS tiles carry the bulk.
 */

/* Row r of g over the gathered key rows keys[0..n) (n <= KEY_TILE): the online-softmax update
 * of forward_tile, with scores from one dot product per key. g->s is free after the cache pass. */
static void path_tile(attn_group *g, int64_t r, const int64_t *keys, int64_t n)
{
    const int64_t d = g->d;
    const float *qr = g->q + r * d;   /* (d) */
    float *ar = g->acc + r * d;       /* (d) */
    float *sr = g->s + r * KEY_TILE;  /* (n) the row's scores, then probabilities */
    for (int64_t c = 0; c < n; c++) {
        const float *kr = g->k + keys[c] * g->ldk;   /* (d) */
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int64_t i = 0; i < d; i++)
            s += qr[i] * kr[i];
        sr[c] = g->scale * s;
    }
    const float m_old = g->m[r], m_new = fmaxf(m_old, ddk_vmax(sr, n));
    const float rescale = expf(m_old - m_new);   /* m_old = -inf (no cache): 0 */
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t c = 0; c < n; c++) {
        float p = ddk_expf(sr[c] - m_new);
        sr[c] = p;
        sum += p;
    }
    g->l[r] = g->l[r] * rescale + sum;
    g->m[r] = m_new;
    if (rescale != 1.0f) {
#pragma omp simd
        for (int64_t i = 0; i < d; i++)
            ar[i] *= rescale;
    }
    for (int64_t c = 0; c < n; c++) {
        const float p = sr[c], *vr = g->v + keys[c] * g->ldk;   /* (d) */
#pragma omp simd
        for (int64_t i = 0; i < d; i++)
            ar[i] += p * vr[i];
    }
}

/* The G rows of node i (rows r0 .. r0 + G - 1 of g) over the node's root path, P the first node
 * key row; parents checked by the caller, so the walk ends (each step goes to a smaller node). */
static void path_pass(attn_group *g, int64_t r0, int64_t G, int64_t i, int64_t P,
                      const int32_t *parents)
{
    int64_t keys[KEY_TILE];   /* key rows of the next part of the path */
    int64_t n = 0;
    for (int64_t node = i; node >= 0; node = parents[node]) {
        keys[n++] = P + node;
        if (n == KEY_TILE || parents[node] < 0) {
            for (int64_t hh = 0; hh < G; hh++)
                path_tile(g, r0 + hh, keys, n);
            n = 0;
        }
    }
}

int ddk_cpu_tree_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                           const float *q, const float *k, const float *v, const int32_t *parents,
                           float *out)
{
    if (!(shape->nh >= 1 && shape->nkv >= 1 && shape->nh % shape->nkv == 0 && shape->d >= 1 &&
          shape->q_rows >= 1 && shape->q_rows <= shape->S))
        return -EINVAL;
    const int64_t N = shape->q_rows, P = shape->S - N;
    for (int64_t i = 0; i < N; i++)
        if (parents[i] < -1 || parents[i] >= i)
            return -EINVAL;   /* a parent must come before its child: a tree, and walks end */
    const int64_t nh = shape->nh, nkv = shape->nkv, G = nh / nkv;
    attn_group g;
    attn_workspace ws;
    if (positions_begin(be, shape, &g, &ws))
        return -ENOMEM;
    const int64_t per_group = g.R / G;   /* positions a group */

    for (int64_t i_first = 0; i_first < N; i_first += per_group) {
        const int64_t np = min64(per_group, N - i_first), R = np * G;
        for (int64_t gk = 0; gk < nkv; gk++) {
            group_load(&g, q, k, v, i_first, np, nh, gk, G, P, 0);
            forward_begin(&g);
            group_pass(&g, 0, R, 0);   /* the cache; nothing when P = 0 */
            for (int64_t j = 0; j < np; j++)
                path_pass(&g, j * G, G, i_first + j, P, parents);
            group_store(&g, out, i_first, R, nh, gk, G);   /* every node sees itself, so l > 0 */
        }
    }
    workspace_put(be, &ws);
    return 0;
}
