/* target_dense_cache.c: the dense target's decoding cache (SPEC.md 3.1 'Decoding with a cache'
 * for llama / qwen3, behind target.h's ddt_target_cache): per layer the keys (after k_norm and
 * RoPE) and values of every position fed. One code path processes n new rows at positions
 * p0 .. p0+n-1 against the cache of positions < p0 + n, C rows at a time (so a long prefill's
 * products and workspace stay bounded); a decode step is one row. Taps and the final-normed
 * hidden state per fed row are ddt_target_forward's. A chain's verify block is fed like an
 * extend: the keys of rejected rows are simply overwritten later, so rollback has nothing to do.
 * A tree's (DDTree, SPEC.md 7) is fed in one pass (the workspace is max(C, max_block) rows tall):
 * node i's key and value at row p0 + i, RoPE at p0 + its depth, the attention the backend's
 * tree_attention; its rollback moves the accepted path's keys and values to p0, p0 + 1, ...
 * Every step is a backend op, as in ddt_target_forward (so both give the same rows up to the
 * order of float sums, and it runs on a GPU): the products (ddt_target_linear), the attention of
 * the new rows over the cache (causal_attention with q_rows). On an fp32 CPU target (m->fast)
 * two fast paths replace them: a decode step's matrix-vector products (ddt_target_linear's,
 * target_layers.c), and the attention (query rows against the cached keys, the softmax exp) in
 * plain C in 8-wide vectors (target_vec8.h): on stories260K (64 x 256 tokens, temperature 1,
 * one core) that took generation from 3.4k tokens/s (BLAS sgemm with m = 1, libm expf) to 23k
 * tokens/s.
 * Not here: batching sequences (a BLAS may sum a row differently in a taller product).
 * Tested by tests/engine/data/test_source.c (prefill == extend in pieces == decode == verify, rollback, a
 * tree's every root path == that path verified as a chain, the path rollback,
 * llama and qwen3, GQA, fp32 fast, generic and bf16; generation through it) and
 * tests/engine/model/test_target_cuda.c (on a GPU).
 *
 * Legend: as target.h; C rows per pass, n rows fed.
 */
#include "target_dense_cache.h"
#include "target_dense.h"
#include "target_layers.h"
#include "target_vec8.h"
#include "ddk_vmath.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

enum { DENSE_ROWS = 64 };   /* C: an extend's pass is this tall at most (a tree's: max_block) */

/* The cache of one sequence and the workspace of a pass, one allocation */
typedef struct dense_cache {
    const ddk_backend *be; /* the one it was opened on (rollback's) */
    int64_t max_len;
    int64_t rows;          /* max(C, max_block): the workspace's rows */
    float *kv;             /* per layer: keys (max_len, nkv*d) then values (max_len, nkv*d) */
    float *x, *u;          /* (C, H) residual stream, normed input */
    float *q, *attn;       /* (C, nh*d) */
    float *gate, *up;      /* (C, I) */
    float *scores;         /* (max_len) one query's attention weights (the CPU fast path's) */
    int32_t *ids;          /* (rows) tokens, (rows) positions, (rows) a tree's parents, of a pass */
    void *block;
    size_t block_bytes;
} dense_cache;

int64_t ddt_target_cache_bytes(const ddt_target_config *c, int64_t max_len, int64_t max_block)
{
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, C = max_block > DENSE_ROWS ? max_block : DENSE_ROWS;
    /* floats: kv, x, u, q, attn, gate, up, scores; then ids (tokens, positions, parents) */
    const int64_t floats = 2 * c->layers * max_len * kvd + 2 * C * H + 2 * C * qd + 2 * C * I + max_len;
    return floats * (int64_t)sizeof(float) + 3 * C * (int64_t)sizeof(int32_t);
}

int ddt_dense_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                         void **out)
{
    const ddt_target_config *c = &((const ddt_target *)m->impl)->cfg;
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, C = max_block > DENSE_ROWS ? max_block : DENSE_ROWS;
    if (c->head_dim > 1024 || c->head_dim % 2)
        return -EINVAL;
    dense_cache *dc = calloc(1, sizeof *dc);
    if (!dc)
        return -ENOMEM;
    dc->block_bytes = (size_t)ddt_target_cache_bytes(c, max_len, max_block);
    dc->block = ddk_malloc(be->alloc, dc->block_bytes);
    if (!dc->block) {
        free(dc);
        return -ENOMEM;
    }
    dc->be = be, dc->max_len = max_len;
    dc->rows = C;
    dc->kv = dc->block;
    dc->x = dc->kv + 2 * c->layers * max_len * kvd;
    dc->u = dc->x + C * H;
    dc->q = dc->u + C * H;
    dc->attn = dc->q + C * qd;
    dc->gate = dc->attn + C * qd;
    dc->up = dc->gate + C * I;
    dc->scores = dc->up + C * I;
    dc->ids = (int32_t *)(dc->scores + max_len);
    *out = dc;
    return 0;
}

void ddt_dense_cache_close(const ddk_backend *be, const ddt_target_model *m, void *cache)
{
    (void)m;
    dense_cache *dc = cache;
    ddk_free(be->alloc, dc->block, dc->block_bytes);
    free(dc);
}

void ddt_dense_rollback(const ddt_target_model *m, void *cache, int64_t p0, const int32_t *path, int64_t accepted)
{
    const ddt_target *t = m->impl;
    const dense_cache *dc = cache;
    const int64_t kvd = t->cfg.kv_heads * t->cfg.head_dim;
    for (int64_t l = 0; path && l < t->cfg.layers; l++) {
        float *keys = dc->kv + 2 * l * dc->max_len * kvd;
        ddt_target_kv_compact(dc->be, keys, keys + dc->max_len * kvd, kvd, p0, path, accepted);
    }
}

/* ------------------------------------------------------------------------------------------
 * The forward of n new rows over the cache
 */

/* x (n) = e^(x - shift); returns their sum */
static float exp_shifted(float *x, int64_t n, float shift)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = ddk_expf(x[i] - shift);
    ddt_v8 acc = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc += DDT_LOAD8(x + i);
    float tail = 0.0f;
    for (; i < n; i++)
        tail += x[i];
    return tail + ddt_sum8(&acc);
}

/* dc->attn (n, nh, d) for query rows dc->q (n, nh, d) at positions p0 + i, over keys / values
 * (p0 + n, nkv, d) of the cache: row i sees positions 0 .. p0 + i. Not inlined: inside the
 * forward its value loop spilled the weights' pointer and the key stride to the stack (5% more
 * instructions per stories260K token under callgrind). */
__attribute__((noinline)) static void cached_attention(const ddt_target_config *c, dense_cache *dc,
                                                       const float *keys, const float *values, int64_t p0,
                                                       int64_t n)
{
    const int64_t nh = c->heads, nkv = c->kv_heads, d = c->head_dim, kvd = nkv * d, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)d);
    float *w = dc->scores;   /* (p0 + n) */
    for (int64_t i = 0; i < n; i++) {
        const int64_t last = p0 + i;
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = dc->q + (i * nh + h) * d;   /* (d) */
            const float *kh = keys + (h / group) * d, *vh = values + (h / group) * d;
            float *out = dc->attn + (i * nh + h) * d;     /* (d) */
            float max = -INFINITY;
            for (int64_t t = 0; t <= last; t++) {
                w[t] = ddt_dot(qh, kh + t * kvd, d) * scale;
                max = w[t] > max ? w[t] : max;
            }
            const float inv = 1.0f / exp_shifted(w, last + 1, max);
            int64_t j0 = 0;
            for (; j0 + 8 <= d; j0 += 8) {   /* 8 output values in a register over all t */
                ddt_v8 acc = { 0 };
                for (int64_t t = 0; t <= last; t++)
                    acc += w[t] * DDT_LOAD8(vh + t * kvd + j0);
                for (int l = 0; l < 8; l++)
                    out[j0 + l] = acc[l] * inv;
            }
            for (; j0 < d; j0++) {   /* head_dim not a multiple of 8 */
                float acc = 0.0f;
                for (int64_t t = 0; t <= last; t++)
                    acc += w[t] * vh[t * kvd + j0];
                out[j0] = acc * inv;
            }
        }
    }
}

/* tokens (n) at positions p0 .. p0+n-1 (n <= rows), or a tree's (parents, host: positions p0 +
 * depth): their keys and values into the cache at rows p0 .., their taps into features (n,
 * n_taps*H) and final-normed hidden states into final_hidden (n, H), each when not NULL. The
 * attention: a chain's, the fast plain-C loop on an fp32 CPU target (m->fast), else the
 * backend's causal_attention of n query rows over the cache's p0 + n keys; a tree's, the
 * backend's tree_attention. 0, -EINVAL (a tap id out of range: nothing written) or the
 * attention's error. */
static int forward_rows(const ddk_backend *be, const ddt_target_model *m, dense_cache *dc, int64_t p0,
                        const int32_t *tokens, int64_t n, const int32_t *parents, const int32_t *tap_ids,
                        int n_taps, float *features, float *final_hidden)
{
    const ddt_target *t = m->impl;
    const ddt_target_config *c = &t->cfg;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, d = c->head_dim,
                  qd = nh * d, kvd = nkv * d, I = c->intermediate;
    const int w16 = t->bf16, fast = m->fast;
    for (int i = 0; i < n_taps; i++)
        if (tap_ids[i] < 0 || tap_ids[i] >= c->layers)
            return -EINVAL;
    float *x = dc->x, *u = dc->u, *q = dc->q, *attn = dc->attn, *gate = dc->gate, *up = dc->up;
    const int32_t *pos = dc->ids + n, *tree = parents ? dc->ids + 2 * n : NULL;   /* put_ids' layout */
    ddt_target_put_ids(be, tokens, n, p0, parents, dc->ids);

    ddt_target_embed(be, w16, t->embed_tokens, dc->ids, n, H, x);
    for (int64_t l = 0; l < c->layers; l++) {
        const ddt_target_layer *L = &t->layer[l];
        float *keys = dc->kv + 2 * l * dc->max_len * kvd;    /* (max_len, nkv*d) */
        float *values = keys + dc->max_len * kvd;            /* (max_len, nkv*d) */
        float *k = keys + p0 * kvd, *v = values + p0 * kvd;   /* this pass's rows */
        be->rmsnorm(be, x, L->input_layernorm, n, H, c->rms_norm_eps, u, NULL);
        ddt_target_linear(be, w16, fast, n, qd, H, u, L->q_proj, 0, q);
        ddt_target_linear(be, w16, fast, n, kvd, H, u, L->k_proj, 0, k);
        ddt_target_linear(be, w16, fast, n, kvd, H, u, L->v_proj, 0, v);
        if (c->qwen3) {
            be->rmsnorm(be, q, L->q_norm, n * nh, d, c->rms_norm_eps, q, NULL);
            be->rmsnorm(be, k, L->k_norm, n * nkv, d, c->rms_norm_eps, k, NULL);
        }
        be->rope(be, q, pos, n, nh, d, c->rope_theta, 0);
        be->rope(be, k, pos, n, nkv, d, c->rope_theta, 0);
        if (tree) {
            ddk_attention_shape shape = { .S = p0 + n, .nh = nh, .nkv = nkv, .d = d, .q_rows = n };
            int rc = be->tree_attention(be, &shape, q, keys, values, tree, attn);
            if (rc)
                return rc;
        } else if (fast) {
            cached_attention(c, dc, keys, values, p0, n);
        } else {
            ddk_attention_shape shape = { .S = p0 + n, .nh = nh, .nkv = nkv, .d = d, .q_rows = n };
            int rc = be->causal_attention(be, &shape, q, keys, values, attn);
            if (rc)
                return rc;
        }
        ddt_target_linear(be, w16, fast, n, H, qd, attn, L->o_proj, 1, x);   /* residual */
        be->rmsnorm(be, x, L->post_attention_layernorm, n, H, c->rms_norm_eps, u, NULL);
        ddt_target_mlp(be, w16, fast, u, L->gate_proj, L->up_proj, L->down_proj, n, H, I, gate, up, x);
        ddt_target_tap(be, x, n, H, l, tap_ids, n_taps, features);
    }
    if (final_hidden)
        be->rmsnorm(be, x, t->norm, n, H, c->rms_norm_eps, final_hidden, NULL);
    return 0;
}

int ddt_dense_extend(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                     const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps, float *features,
                     float *final_hidden)
{
    const ddt_target *t = m->impl;
    const int64_t H = t->cfg.hidden;
    int rc = 0;
    for (int64_t r = 0; r < n && rc == 0; r += DENSE_ROWS) {
        const int64_t rows = n - r < DENSE_ROWS ? n - r : DENSE_ROWS;
        rc = forward_rows(be, m, cache, p0 + r, tokens + r, rows, NULL, tap_ids, n_taps,
                          features ? features + r * n_taps * H : NULL, final_hidden ? final_hidden + r * H : NULL);
    }
    return rc;
}

int ddt_dense_verify(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                     const int32_t *tokens, int64_t n, const int32_t *parents, const int32_t *tap_ids, int n_taps,
                     float *features, float *final_hidden)
{
    if (!parents)
        return ddt_dense_extend(be, m, cache, p0, tokens, n, tap_ids, n_taps, features, final_hidden);
    if (n > ((dense_cache *)cache)->rows)
        return -EINVAL;
    return forward_rows(be, m, cache, p0, tokens, n, parents, tap_ids, n_taps, features, final_hidden);
}
