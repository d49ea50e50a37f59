/* generate.c: KV-cache sampling from a frozen target (generate.h). One code path processes
 * n new rows at positions p0 .. p0+n-1 against the cache of positions < p0 + n: the prefill
 * runs it over the prompt C rows at a time, a decode step over one row. Norms, RoPE, SwiGLU
 * and embedding are the backend's ops, as in ddt_target_forward, so both give the same hidden
 * states up to the order of float sums. The decode's matrix-vector products, its attention
 * (one query row against the cached keys) and the softmax exp are plain C in 8-wide vectors:
 * on stories260K (64 x 256 tokens, temperature 1, one core) that took generation from 3.4k
 * tokens/s (BLAS sgemm with m = 1, libm expf) to 23k tokens/s.
 * Any other target (qwen3_5) generates through target.h's cache (ddt_target_extend, prefill
 * and decode steps alike) with the same sampling.
 * Not here: batching sequences, the full-sequence features (ddt_target_forward computes them
 * once the tokens exist). Tested by tests/test_source.c.
 *
 * Legend: S tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate,
 * C rows per prefill chunk, n rows of one step.
 */
#include "ddk_vmath.h"
#include "generate.h"
#include "ddk_rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PREFILL_ROWS = 64 };   /* C: the prefill's matrix products are this tall at most */

/* ------------------------------------------------------------------------------------------
 * Seeds
 */

uint64_t ddt_generate_seed(uint64_t seed, int64_t index, const char *stream)
{
    uint64_t name = 0xcbf29ce484222325ull;   /* FNV-1a of the stream's name */
    for (const unsigned char *c = (const unsigned char *)stream; *c; c++)
        name = (name ^ *c) * 0x100000001B3ull;
    uint64_t s = seed;
    s = ddk_rng_next(&s) ^ name;
    s = ddk_rng_next(&s) ^ (uint64_t)index;
    return ddk_rng_next(&s);
}

/* ------------------------------------------------------------------------------------------
 * The generator's memory: one block, carved
 */

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

int ddt_generator_init(ddt_generator *g, const ddk_backend *be, const ddt_target *t,
                       int64_t max_len, char *err, size_t err_len)
{
    memset(g, 0, sizeof *g);
    const ddt_target_config *c = &t->cfg;
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, V = c->vocab, C = PREFILL_ROWS;
    if (max_len < 1 || c->head_dim > 1024 || c->head_dim % 2) {
        snprintf(err, err_len, "generator: max_len %lld must be >= 1 and head_dim %lld even and <= 1024",
                 (long long)max_len, (long long)c->head_dim);
        return -EINVAL;
    }
    /* floats: cache, x, u, q, attn, gate, up, hidden, scores, logits, probs; then pos, candidates */
    const size_t floats = (size_t)(2 * c->layers * max_len * kvd + 2 * C * H + 2 * C * qd + 2 * C * I
                                   + C * H + max_len + 2 * V);
    g->block_bytes = floats * sizeof(float) + (size_t)C * sizeof(int32_t) + (size_t)V * sizeof(candidate);
    g->block = ddk_malloc(be->alloc, g->block_bytes);
    if (!g->block) {
        snprintf(err, err_len, "generator: no memory for a KV cache of %lld tokens (%.1f MB in all)",
                 (long long)max_len, g->block_bytes / 1e6);
        return -ENOMEM;
    }
    g->be = be;
    g->t = t;
    g->hidden_size = H, g->vocab = V, g->lm_head = t->lm_head;
    g->max_len = max_len;
    g->cache = g->block;
    g->x = g->cache + 2 * c->layers * max_len * kvd;
    g->u = g->x + C * H;
    g->q = g->u + C * H;
    g->attn = g->q + C * qd;
    g->gate = g->attn + C * qd;
    g->up = g->gate + C * I;
    g->hidden = g->up + C * I;
    g->scores = g->hidden + C * H;
    g->logits = g->scores + max_len;
    g->probs = g->logits + V;
    g->pos = (int32_t *)(g->probs + V);
    g->candidates = g->pos + C;   /* 4-byte aligned: candidate is two 4-byte fields */
    return 0;
}

int ddt_generator_open(ddt_generator *g, const ddk_backend *be, const ddt_target_model *m, int64_t max_len,
                       char *err, size_t err_len)
{
    if (ddt_target_dense(m))
        return ddt_generator_init(g, be, ddt_target_dense(m), max_len, err, err_len);
    memset(g, 0, sizeof *g);
    const int64_t H = m->hidden, V = m->vocab, C = PREFILL_ROWS;
    int rc = ddt_target_cache_open(be, m, max_len, 1, &g->tc, err, err_len);
    if (rc)
        return rc;
    /* floats: hidden (C, H), logits, probs; then candidates */
    g->block_bytes = (size_t)(C * H + 2 * V) * sizeof(float) + (size_t)V * sizeof(candidate);
    g->block = ddk_malloc(be->alloc, g->block_bytes);
    if (!g->block) {
        ddt_target_cache_close(&g->tc);
        snprintf(err, err_len, "generator: no memory for its workspace (%.1f MB)", g->block_bytes / 1e6);
        return -ENOMEM;
    }
    g->be = be;
    g->hidden_size = H, g->vocab = V, g->lm_head = m->lm_head;
    g->max_len = max_len;
    g->hidden = g->block;
    g->logits = g->hidden + C * H;
    g->probs = g->logits + V;
    g->candidates = g->probs + V;
    return 0;
}

void ddt_generator_free(ddt_generator *g)
{
    if (g->block)
        ddk_free(g->be->alloc, g->block, g->block_bytes);
    if (g->tc.impl)
        ddt_target_cache_close(&g->tc);
    memset(g, 0, sizeof *g);
}

/* ------------------------------------------------------------------------------------------
 * The forward of n new rows over the cache
 */

/* The decode's small loops use 8-wide vectors (GCC / Clang vector extension; plain SSE or
 * NEON code where AVX is absent): without -ffast-math the compiler would not vectorise a float
 * sum, and its own attempt at these loops spilled registers (half the speed). */
typedef float v8 __attribute__((vector_size(32)));
typedef float v8_unaligned __attribute__((vector_size(32), aligned(4)));
#define LOAD8(p) (*(const v8_unaligned *)(p))   /* 8 floats from any float address */

/* by pointer: a 32-byte vector by value is an ABI warning where AVX is not enabled */
static inline float sum8(const v8 *v)
{
    return (((*v)[0] + (*v)[4]) + ((*v)[1] + (*v)[5])) + (((*v)[2] + (*v)[6]) + ((*v)[3] + (*v)[7]));
}


/* x (n) = e^(x - shift); returns their sum */
static float exp_shifted(float *x, int64_t n, float shift)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = ddk_expf(x[i] - shift);
    v8 acc = { 0 };
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        acc += LOAD8(x + i);
    float tail = 0.0f;
    for (; i < n; i++)
        tail += x[i];
    return tail + sum8(&acc);
}

/* sum_j a[j] b[j] */
static inline float dot(const float *a, const float *b, int64_t n)
{
    v8 acc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += LOAD8(a + j) * LOAD8(b + j);
    float tail = 0.0f;
    for (; j < n; j++)
        tail += a[j] * b[j];
    return tail + sum8(&acc);
}

/* y (out) = W x (+ y when accumulate), W (out, in): 4 rows at a time, sharing the loads of x */
static void matvec(const float *W, const float *x, int64_t out, int64_t in, int accumulate, float *y)
{
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        const float *w0 = W + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        v8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
        int64_t j = 0;
        for (; j + 8 <= in; j += 8) {
            const v8 xj = LOAD8(x + j);
            a0 += LOAD8(w0 + j) * xj;
            a1 += LOAD8(w1 + j) * xj;
            a2 += LOAD8(w2 + j) * xj;
            a3 += LOAD8(w3 + j) * xj;
        }
        float s[4] = { sum8(&a0), sum8(&a1), sum8(&a2), sum8(&a3) };
        for (; j < in; j++) {
            s[0] += w0[j] * x[j];
            s[1] += w1[j] * x[j];
            s[2] += w2[j] * x[j];
            s[3] += w3[j] * x[j];
        }
        for (int r = 0; r < 4; r++)
            y[o + r] = (accumulate ? y[o + r] : 0.0f) + s[r];
    }
    for (; o < out; o++)
        y[o] = (accumulate ? y[o] : 0.0f) + dot(W + o * in, x, in);
}

/* y (n, out) = x (n, in) W^T (+ y when accumulate), W (out, in). A decode step (n = 1) is a
 * matrix-vector product, which OpenBLAS's sgemm does by packing all of W first: matvec is
 * faster at every size tried (2x on a 2048-hidden, 32K-vocabulary target, BLAS on 2 threads). */
static void linear(const ddk_backend *be, int64_t n, int64_t out, int64_t in, const float *x, const float *W,
                   int accumulate, float *y)
{
    if (n > 1)
        be->matmul(be, 0, 1, n, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
    else
        matvec(W, x, out, in, accumulate, y);
}

/* attn (n, nh, d) for query rows q (n, nh, d) at positions p0 + i, over keys / values
 * (p0 + n, nkv, d) of the cache: row i sees positions 0 .. p0 + i. */
static void cached_attention(ddt_generator *g, const float *keys, const float *values, int64_t p0,
                             int64_t n)
{
    const ddt_target_config *c = &g->t->cfg;
    const int64_t nh = c->heads, nkv = c->kv_heads, d = c->head_dim, kvd = nkv * d,
                  group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)d);
    float *w = g->scores;   /* (p0 + n) */
    for (int64_t i = 0; i < n; i++) {
        const int64_t last = p0 + i;
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = g->q + (i * nh + h) * d;   /* (d) */
            const float *kh = keys + (h / group) * d, *vh = values + (h / group) * d;
            float *out = g->attn + (i * nh + h) * d;     /* (d) */
            float max = -INFINITY;
            for (int64_t t = 0; t <= last; t++) {
                w[t] = dot(qh, kh + t * kvd, d) * scale;
                max = w[t] > max ? w[t] : max;
            }
            const float inv = 1.0f / exp_shifted(w, last + 1, max);
            int64_t j0 = 0;
            for (; j0 + 8 <= d; j0 += 8) {   /* 8 output values in a register over all t */
                v8 acc = { 0 };
                for (int64_t t = 0; t <= last; t++)
                    acc += w[t] * LOAD8(vh + t * kvd + j0);
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

/* tokens (n) at positions p0 .. p0+n-1 (n <= C): their keys and values into the cache, their
 * final-normed hidden states into hidden (n, H). */
static void forward_rows(ddt_generator *g, const int32_t *tokens, int64_t p0, int64_t n,
                         float *hidden)
{
    const ddk_backend *be = g->be;
    const ddt_target *t = g->t;
    const ddt_target_config *c = &t->cfg;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, d = c->head_dim,
                  qd = nh * d, kvd = nkv * d, I = c->intermediate;
    float *x = g->x, *u = g->u, *q = g->q, *attn = g->attn, *gate = g->gate, *up = g->up;
    for (int64_t i = 0; i < n; i++)
        g->pos[i] = (int32_t)(p0 + i);

    be->embedding(be, t->embed_tokens, tokens, n, H, x);
    for (int64_t l = 0; l < c->layers; l++) {
        const ddt_target_layer *L = &t->layer[l];
        float *keys = g->cache + 2 * l * g->max_len * kvd;   /* (max_len, nkv*d) */
        float *values = keys + g->max_len * kvd;             /* (max_len, nkv*d) */
        float *k = keys + p0 * kvd, *v = values + p0 * kvd;   /* this step's rows */
        be->rmsnorm(be, x, L->input_layernorm, n, H, c->rms_norm_eps, u, NULL);
        linear(be, n, qd, H, u, L->q_proj, 0, q);
        linear(be, n, kvd, H, u, L->k_proj, 0, k);
        linear(be, n, kvd, H, u, L->v_proj, 0, v);
        if (c->qwen3) {
            be->rmsnorm(be, q, L->q_norm, n * nh, d, c->rms_norm_eps, q, NULL);
            be->rmsnorm(be, k, L->k_norm, n * nkv, d, c->rms_norm_eps, k, NULL);
        }
        be->rope(be, q, g->pos, n, nh, d, c->rope_theta, 0);
        be->rope(be, k, g->pos, n, nkv, d, c->rope_theta, 0);
        cached_attention(g, keys, values, p0, n);
        linear(be, n, H, qd, attn, L->o_proj, 1, x);   /* residual */
        be->rmsnorm(be, x, L->post_attention_layernorm, n, H, c->rms_norm_eps, u, NULL);
        linear(be, n, I, H, u, L->gate_proj, 0, gate);
        linear(be, n, I, H, u, L->up_proj, 0, up);
        be->swiglu(be, gate, up, n * I, gate);
        linear(be, n, H, I, gate, L->down_proj, 1, x);   /* residual */
    }
    be->rmsnorm(be, x, t->norm, n, H, c->rms_norm_eps, hidden, NULL);
}

/* forward_rows for the dense target, the cache's extend for any other */
static int feed_rows(ddt_generator *g, const int32_t *tokens, int64_t p0, int64_t n, float *hidden)
{
    if (!g->t)
        return ddt_target_extend(&g->tc, tokens, n, NULL, 0, NULL, hidden, NULL);
    forward_rows(g, tokens, p0, n, hidden);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Sampling
 */

/* logit descending, then id ascending: the nucleus order, and its head is the argmax */
static int by_logit(const void *a, const void *b)
{
    const candidate *x = a, *y = b;
    if (x->logit != y->logit)
        return x->logit > y->logit ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int32_t argmax(const float *logits, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (logits[v] > logits[best])
            best = v;
    return (int32_t)best;
}

/* the next token from g->logits (V) */
static int32_t sample(ddt_generator *g, const ddt_generate_params *p, uint64_t *rng)
{
    const int64_t V = g->vocab;
    const float *z = g->logits;
    const int32_t best = argmax(z, V);
    if (p->temperature <= 0.0f)
        return best;
    const float max = z[best], inv_t = 1.0f / p->temperature;
    float *prob = g->probs;   /* unnormalised: exp((z - max) / temperature), in (0, 1] */
    for (int64_t v = 0; v < V; v++)
        prob[v] = ddk_expf((z[v] - max) * inv_t);
    double sum = 0.0;
    for (int64_t v = 0; v < V; v++)
        sum += prob[v];
    if (p->top_p >= 1.0f) {   /* the whole distribution, in id order: no sort */
        double target = ddk_rng_uniform(rng) * sum, acc = 0.0;
        for (int64_t v = 0; v < V; v++) {
            acc += prob[v];
            if (target < acc)
                return (int32_t)v;
        }
        return best;   /* rounding left target >= acc: the most likely token */
    }
    /* Only the head of the order is needed: sort the tokens whose logit is within `width` of
     * the max once their mass reaches the nucleus (they are a prefix of the whole order), not
     * all V of them (a 150K vocabulary would cost milliseconds per token). */
    candidate *cand = g->candidates;
    const double nucleus = p->top_p * sum;
    int64_t n = 0;
    for (float width = 8.0f * p->temperature;; width *= 2.0f) {   /* e^-8: 3e-4 of the max's weight */
        const float cut = max - width;
        double inside = 0.0;
        n = 0;
        for (int64_t v = 0; v < V; v++)
            if (z[v] >= cut) {
                cand[n++] = (candidate){ z[v], (int32_t)v };
                inside += prob[v];
            }
        if (inside >= nucleus || n == V)
            break;
    }
    qsort(cand, (size_t)n, sizeof *cand, by_logit);
    double mass = 0.0;
    int64_t k = 0;
    while (k < n && (k == 0 || mass < nucleus))   /* the fewest tokens whose mass reaches top_p */
        mass += prob[cand[k++].id];
    double target = ddk_rng_uniform(rng) * mass, acc = 0.0;
    for (int64_t j = 0; j < k; j++) {
        acc += prob[cand[j].id];
        if (target < acc)
            return cand[j].id;
    }
    return cand[0].id;
}

/* ------------------------------------------------------------------------------------------
 * A sequence
 */

int ddt_generate(ddt_generator *g, const ddt_generate_params *p, uint64_t seed,
                 const int32_t *prompt, int64_t P, int64_t S, int32_t *tokens, float *hidden)
{
    const ddk_backend *be = g->be;
    const int64_t H = g->hidden_size, V = g->vocab;
    if (!prompt)
        P = 0;
    if (S < 1 || S > g->max_len || P < 0 || P > S || !(p->temperature >= 0.0f) ||
        !(p->top_p > 0.0f && p->top_p <= 1.0f))
        return -EINVAL;
    for (int64_t i = 0; i < P; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return -EINVAL;
    uint64_t rng = seed;
    if (P > 0)
        memcpy(tokens, prompt, (size_t)P * sizeof *tokens);
    else
        tokens[0] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);
    const int64_t known = P > 0 ? P : 1;

    /* prefill: C rows at a time */
    const float *last = NULL;   /* (H) the hidden state of the newest position */
    ddt_target_cache_reset(&g->tc);
    for (int64_t p0 = 0; p0 < known; p0 += PREFILL_ROWS) {
        const int64_t n = known - p0 < PREFILL_ROWS ? known - p0 : PREFILL_ROWS;
        float *out = hidden ? hidden + p0 * H : g->hidden;
        int rc = feed_rows(g, tokens + p0, p0, n, out);
        if (rc)
            return rc;
        last = out + (n - 1) * H;
    }
    /* decode: sample position t from the hidden state of t-1, then feed it (the last one only
     * when its hidden state is wanted) */
    for (int64_t t = known; t < S; t++) {
        linear(be, 1, V, H, last, g->lm_head, 0, g->logits);
        tokens[t] = sample(g, p, &rng);
        if (t + 1 < S || hidden) {
            float *out = hidden ? hidden + t * H : g->hidden;
            int rc = feed_rows(g, tokens + t, t, 1, out);
            if (rc)
                return rc;
            last = out;
        }
    }
    return 0;
}
