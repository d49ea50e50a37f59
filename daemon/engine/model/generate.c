/* generate.c: sampling from a frozen target (generate.h) through target.h's decoding cache,
 * the only way it reaches the target: the prompt is extended C rows at a time (the hidden
 * states of a chunk stay bounded when the caller keeps none), then each sampled token is one
 * decode step; the logits of the newest position are ddt_target_logits (a plain C
 * matrix-vector product). What is fast in a dense decode step (8-wide matrix-vector products,
 * target_layers.c; the cached attention, target_dense_cache.c). The softmax exp is ddk_vmath.h's.
 * A target on a GPU (a co-located trainer rank's replica) decodes on the device; its logits come
 * to the host once per sampled token (V floats) and sampling runs on the host, as for a CPU one.
 * Not here: batching sequences, the full-sequence features (ddt_target_prefill computes them
 * once the tokens exist). Tested by tests/engine/data/test_source.c.
 *
 * Legend: S tokens, H hidden, V vocabulary, C rows per prefill chunk.
 */
#include "ddk_vmath.h"
#include "generate.h"
#include "ddk_rng.h"
#include "target_layers.h"   /* ddt_target_host_backend */

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { PREFILL_ROWS = 64 };   /* C: the rows of one extend of the prompt */

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
 * The generator's memory: the target's cache, and one block carved for sampling
 */

typedef struct candidate {
    float logit;
    int32_t id;
} candidate;

int64_t ddt_generator_workspace_bytes(int64_t H, int64_t V)
{
    /* floats: hidden (C, H), logits, probs; then candidates */
    return (PREFILL_ROWS * H + 2 * V) * (int64_t)sizeof(float) + V * (int64_t)sizeof(candidate);
}

int ddt_generator_open(ddt_generator *g, const ddk_backend *be, const ddt_target_model *m, int64_t max_len,
                       char *err, size_t err_len)
{
    memset(g, 0, sizeof *g);
    const int64_t H = m->hidden, V = m->vocab, C = PREFILL_ROWS;
    int rc = ddt_target_cache_open(be, m, max_len, 1, &g->tc, err, err_len);
    if (rc)
        return rc;
    const size_t total = (size_t)ddt_generator_workspace_bytes(H, V);
    const int host = ddt_target_host_backend(be);
    g->block_bytes = host ? total : (size_t)(C * H + V) * sizeof(float);
    g->block = ddk_malloc(be->alloc, g->block_bytes);
    if (g->block && !host) {
        g->host_bytes = total - (size_t)(C * H) * sizeof(float);   /* logits, probs, candidates */
        g->host_block = ddk_host_alloc_pinned(g->host_bytes);
    }
    if (!g->block || (!host && !g->host_block)) {
        snprintf(err, err_len, "generator: no memory for its workspace (%.1f MB)", total / 1e6);
        ddt_generator_free(g);
        return -ENOMEM;
    }
    g->hidden = g->block;
    g->dev_logits = host ? NULL : g->hidden + C * H;
    g->logits = host ? g->hidden + C * H : g->host_block;
    g->probs = g->logits + V;
    g->candidates = g->probs + V;   /* 4-byte aligned: candidate is two 4-byte fields */
    return 0;
}

void ddt_generator_free(ddt_generator *g)
{
    if (g->block)
        ddk_free(g->tc.be->alloc, g->block, g->block_bytes);
    ddk_host_free_pinned(g->host_block);   /* NULL: a no-op */
    if (g->tc.impl)
        ddt_target_cache_close(&g->tc);
    memset(g, 0, sizeof *g);
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
    const int64_t V = g->tc.m->vocab;
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
    return ddt_generate_until(g, p, seed, prompt, P, S, -1, tokens, hidden, NULL);
}

int ddt_generate_until(ddt_generator *g, const ddt_generate_params *p, uint64_t seed, const int32_t *prompt,
                       int64_t P, int64_t S, int32_t stop, int32_t *tokens, float *hidden, int64_t *len)
{
    if (len)
        *len = S;
    ddt_target_cache *c = &g->tc;
    const int64_t H = c->m->hidden, V = c->m->vocab;
    if (!prompt)
        P = 0;
    if (S < 1 || S > c->max_len || P < 0 || P > S || !(p->temperature >= 0.0f) ||
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
    ddt_target_cache_reset(c);
    for (int64_t p0 = 0; p0 < known; p0 += PREFILL_ROWS) {
        const int64_t n = known - p0 < PREFILL_ROWS ? known - p0 : PREFILL_ROWS;
        float *out = hidden ? hidden + p0 * H : g->hidden;
        int rc = ddt_target_extend(c, tokens + p0, n, NULL, 0, NULL, out, NULL);
        if (rc)
            return rc;
        last = out + (n - 1) * H;
    }
    /* decode: sample position t from the hidden state of t-1, then feed it (the last one only
     * when its hidden state is wanted) */
    for (int64_t t = known; t < S; t++) {
        if (g->dev_logits) {   /* a GPU's: to the host, where sampling reads them */
            ddt_target_logits(c->be, c->m, last, 1, g->dev_logits);
            c->be->copy(c->be, g->logits, g->dev_logits, (size_t)V * sizeof(float));
            c->be->synchronize(c->be);
        } else {
            ddt_target_logits(c->be, c->m, last, 1, g->logits);
        }
        tokens[t] = sample(g, p, &rng);
        const int stopped = tokens[t] == stop;
        if ((t + 1 < S && !stopped) || hidden) {
            float *out = hidden ? hidden + t * H : g->hidden;
            int rc = ddt_target_decode(c, tokens[t], NULL, 0, NULL, out, NULL);
            if (rc)
                return rc;
            last = out;
        }
        if (stopped) {
            if (len)
                *len = t + 1;
            break;
        }
    }
    return 0;
}
