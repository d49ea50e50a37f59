/* speculate.c: speculative decoding on the target interface (SPEC.md section 7; speculate.h has
 * the contract). One prompt is decoded three ways on ONE target cache, each from a fresh
 * prefill: plain greedy (a decode call per token), the drafter's chain (a verify call per
 * block of B) and, per budget K, the drafter's DDTree (a tree verify call of K + 1 nodes).
 * Drafting is training's forward on one block: slot 0 the last generated token at its position
 * `len` (the committed length), slots 1..B-1 mask_token_id, the context the tapped features of
 * rows 0 .. len-1, which the target's prefill and each verify's accepted rows append (the
 * rejected rows' features are dropped with them). The drafter's context cache
 * (drafter_cache.h) projects each committed row once, when the next block is drafted; a
 * params->uncached decode runs ddt_drafter_forward over the whole context instead (the
 * reference the cache is tested against).
 * Argmax everywhere: logit descending, ties to the lowest id, as generate.c's greedy, on the
 * device (the backend's argmax_rows: only the indices come back); a tree's draft reads the
 * block's logits (B, V) back for its ranks. A DFlash2 drafter drafts with its path selector
 * (SPEC.md 2.1; selector.h): its block's selector view made on the device, the chain the
 * selector's greedy path, the tree its lattice; no logits come back. Not here: batching prompts
 * (a target's rows would then depend on the batch), sampling (speculation is greedy, so it must
 * equal greedy decoding).
 * Tested by tests/engine/eval/test_speculate.c.
 *
 * Legend: as speculate.h; len committed positions, n nodes of one verify call.
 */
#include "speculate.h"
#include "selector.h"

#include "model/drafter_cache.h"

#include "base/ddt_time.h"
#include "base/errors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct ddt_speculator {
    const ddk_backend *be;
    const ddt_target_model *m;
    ddt_drafter_config dc;
    ddt_target_cache tc;                 /* max_len = max_prompt + max_gen + max_block */
    int64_t max_prompt, max_gen, max_budget, max_block;   /* max_block = max(B, max_budget + 1) */
    /* be's memory, one allocation */
    float *features;       /* (max_len, L_t*H) the committed rows' taps: the drafter's context */
    float *node_features;  /* (max_block, L_t*H) a verify call's */
    float *hidden;         /* (max(max_prompt, max_block), H) final-normed, the prefill's or a call's */
    float *dev_logits;     /* (max_block, V) */
    float *hs;             /* (B, H) the drafter's block */
    ddt_drafter_cache *cache;   /* the drafter's context K/V, max_prompt + max_gen rows */
    int32_t *dev_argmax;   /* (max_block) argmax_rows' */
    void *dev_block;
    size_t dev_bytes;
    /* host memory, one allocation */
    float *logits;         /* (max_block, V) read back */
    int32_t *seq;          /* (max_len) the prompt and what was generated */
    uint8_t *mask;         /* (max_len) ones: the drafter's loss mask */
    int32_t *out;          /* (2 + DDT_MAX_BUDGETS, max_gen) greedy, chain, each tree's tokens */
    int32_t *node_tokens, *node_parents, *path, *argmax;   /* (max_block) each */
    void *host_block;
    /* a DFlash2 drafter's path selector (NULL for DFlash): the view of the block drafted last */
    ddt_selector *selector;
    const ddt_selector_view *view;
    int32_t predecessors[DDT_MAX_SLOTS];   /* (B) [1] the anchor's token; none teacher-forced */
};

static int64_t max_of(int64_t a, int64_t b)
{
    return a > b ? a : b;
}

static int64_t spec_max_block(const ddt_drafter_config *dc, int64_t max_budget)
{
    return max_of(dc->block_size, max_budget + 1);
}

/* floats of the device workspace beside the cache */
static int64_t device_floats(int64_t H, int64_t V, const ddt_drafter_config *dc, int64_t max_prompt,
                             int64_t max_len, int64_t max_block)
{
    const int64_t LH = dc->taps * H;
    return max_len * LH + max_block * LH + max_of(max_prompt, max_block) * H + max_block * V +
           dc->block_size * H + max_block;   /* the last: int32 argmaxes */
}

int64_t ddt_speculator_workspace_bytes(const ddt_drafter_config *dc, int64_t max_prompt, int64_t max_gen,
                                       int64_t max_budget, int64_t *max_len, int64_t *max_block)
{
    *max_block = spec_max_block(dc, max_budget);
    *max_len = max_prompt + max_gen + *max_block;
    return device_floats(dc->hidden, dc->vocab, dc, max_prompt, *max_len, *max_block) * (int64_t)sizeof(float) +
           (int64_t)ddt_drafter_cache_bytes(dc, max_prompt + max_gen) + ddt_selector_workspace_bytes(dc);
}

int ddt_speculate_check_drafter(const ddt_target_model *m, const ddt_drafter_config *dc, char *err, size_t err_len)
{
    if (dc->hidden != m->hidden)
        return ddt_fail(err, err_len, -EINVAL, "hidden_size %lld does not match the target's %lld",
                        (long long)dc->hidden, (long long)m->hidden);
    if (dc->vocab != m->vocab)
        return ddt_fail(err, err_len, -EINVAL, "vocab_size %lld does not match the target's %lld",
                        (long long)dc->vocab, (long long)m->vocab);
    if (dc->num_target_layers && dc->num_target_layers != m->layers)
        return ddt_fail(err, err_len, -EINVAL, "num_target_layers %lld does not match the target's %lld layers",
                        (long long)dc->num_target_layers, (long long)m->layers);
    for (int64_t i = 0; i < dc->taps; i++)
        if (dc->target_layer_ids[i] < 0 || dc->target_layer_ids[i] >= m->layers)
            return ddt_fail(err, err_len, -EINVAL, "dflash_config.target_layer_ids: %d is not a layer of the target "
                            "(target_layer_ids[%lld]; the target's layers are 0 .. %lld)", (int)dc->target_layer_ids[i],
                            (long long)i, (long long)m->layers - 1);
    if (dc->block_size < 2)
        return ddt_fail(err, err_len, -EINVAL, "block_size %lld: speculation drafts at least 2 slots",
                        (long long)dc->block_size);
    if (dc->block_size > DDT_MAX_SLOTS)
        return ddt_fail(err, err_len, -EINVAL, "block_size %lld: speculation drafts at most %d slots",
                        (long long)dc->block_size, (int)DDT_MAX_SLOTS);
    if (dc->mask_token_id < 0 || dc->mask_token_id >= m->vocab)
        return ddt_fail(err, err_len, -EINVAL, "dflash_config.mask_token_id %d is outside the target's vocabulary "
                        "of %lld", (int)dc->mask_token_id, (long long)m->vocab);
    return 0;
}

/* -EINVAL with err unless the drafter dc fits target m and the sizes are in range */
static int check_fit(const ddt_target_model *m, const ddt_drafter_config *dc, int64_t max_prompt, int64_t max_gen,
                     int64_t max_budget, char *err, size_t err_len)
{
    int rc = ddt_speculate_check_drafter(m, dc, err, err_len);
    if (rc)
        return rc;
    if (max_prompt < 1 || max_gen < 1)
        return ddt_fail(err, err_len, -EINVAL, "prompts of %lld tokens generating %lld: both must be >= 1",
                        (long long)max_prompt, (long long)max_gen);
    if (max_budget < 0 || max_budget > (int64_t)DDT_MAX_SLOTS * DDT_MAX_SLOTS)
        return ddt_fail(err, err_len, -EINVAL, "tree budget %lld outside [0, %d]", (long long)max_budget,
                        (int)(DDT_MAX_SLOTS * DDT_MAX_SLOTS));
    return 0;
}

int ddt_speculator_open(ddt_speculator **out, const ddk_backend *be, const ddt_target_model *m,
                        const ddt_drafter_config *dc, int64_t max_prompt, int64_t max_gen, int64_t max_budget,
                        char *err, size_t err_len)
{
    *out = NULL;
    int rc = check_fit(m, dc, max_prompt, max_gen, max_budget, err, err_len);
    if (rc)
        return rc;
    ddt_speculator *s = calloc(1, sizeof *s);
    if (!s)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for a speculator");
    const int64_t H = m->hidden, LH = dc->taps * H, V = m->vocab,
                  max_block = spec_max_block(dc, max_budget), max_len = max_prompt + max_gen + max_block;
    *s = (ddt_speculator){ .be = be, .m = m, .dc = *dc, .max_prompt = max_prompt, .max_gen = max_gen,
                           .max_budget = max_budget, .max_block = max_block };
    if ((rc = ddt_target_cache_open(be, m, max_len, max_block, &s->tc, err, err_len))) {
        free(s);
        return rc;
    }
    s->dev_bytes = (size_t)device_floats(H, V, dc, max_prompt, max_len, max_block) * sizeof(float);
    s->dev_block = ddk_malloc(be->alloc, s->dev_bytes);
    const size_t host_bytes = (size_t)(max_block * V) * sizeof(float) + (size_t)max_len * (sizeof(int32_t) + 1) +
                              (size_t)((2 + DDT_MAX_BUDGETS) * max_gen + 4 * max_block) * sizeof(int32_t);
    s->host_block = malloc(host_bytes);
    if (!s->dev_block || !s->host_block) {
        ddt_speculator_close(s);
        return ddt_fail(err, err_len, -ENOMEM, "no memory for a speculator of %lld positions", (long long)max_len);
    }
    s->features = s->dev_block;
    s->node_features = s->features + max_len * LH;
    s->hidden = s->node_features + max_block * LH;
    s->dev_logits = s->hidden + max_of(max_prompt, max_block) * H;
    s->hs = s->dev_logits + max_block * V;
    s->dev_argmax = (int32_t *)(s->hs + dc->block_size * H);
    be->zero(be, s->features, (size_t)(max_len * LH) * sizeof(float));   /* rows past len: finite */
    s->logits = s->host_block;
    s->seq = (int32_t *)(s->logits + max_block * V);
    s->out = s->seq + max_len;
    s->node_tokens = s->out + (2 + DDT_MAX_BUDGETS) * max_gen;
    s->node_parents = s->node_tokens + max_block;
    s->path = s->node_parents + max_block;
    s->argmax = s->path + max_block;
    s->mask = (uint8_t *)(s->argmax + max_block);
    memset(s->mask, 1, (size_t)max_len);
    for (int64_t k = 0; k < dc->block_size; k++)
        s->predecessors[k] = -1;
    if ((rc = ddt_drafter_cache_open(&s->cache, be, dc, max_prompt + max_gen))) {
        ddt_speculator_close(s);
        return ddt_fail(err, err_len, rc, "no memory for the drafter's context cache of %lld rows",
                        (long long)(max_prompt + max_gen));
    }
    if (dc->dflash2 && (rc = ddt_selector_open(&s->selector, be, dc, err, err_len))) {
        ddt_speculator_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ddt_speculator_close(ddt_speculator *s)
{
    if (!s)
        return;
    ddt_target_cache_close(&s->tc);
    ddt_selector_close(s->selector);
    ddt_drafter_cache_close(s->cache);
    if (s->dev_block)
        ddk_free(s->be->alloc, s->dev_block, s->dev_bytes);
    free(s->host_block);
    free(s);
}

/* ------------------------------------------------------------------------------------------
 * One decode
 */

/* out (n, host) = the argmax of each of the n rows of logits (n, V) on the device */
static void read_argmax(ddt_speculator *s, const float *logits, int64_t n, int32_t *out)
{
    s->be->argmax_rows(s->be, logits, n, s->m->vocab, s->dev_argmax);
    s->be->copy(s->be, out, s->dev_argmax, (size_t)n * sizeof(int32_t));
    s->be->synchronize(s->be);
}

/* the prefill of prompt (P) on the empty cache, its taps into s->features rows 0 .. P-1; the
 * first generated token */
static int prefill(ddt_speculator *s, const int32_t *prompt, int64_t P, int32_t *first)
{
    const ddt_drafter_config *dc = &s->dc;
    ddt_target_cache_reset(&s->tc);
    int rc = ddt_target_extend(&s->tc, prompt, P, dc->target_layer_ids, (int)dc->taps, s->features, s->hidden,
                               NULL);
    if (rc)
        return rc;
    ddt_target_logits(s->be, s->m, s->hidden + (P - 1) * s->m->hidden, 1, s->dev_logits);
    read_argmax(s, s->dev_logits, 1, first);
    return 0;
}

/* the drafter's block after the committed len rows: slot 0 = seq[len] at position len, the
 * rows not cached yet appended to the cache first (uncached: the whole context's forward); its
 * logits (B, V) in s->dev_logits, and read back into s->logits (host) for a tree (ranks), or, for
 * a DFlash2 drafter, its selector view in s->view */
static int draft(ddt_speculator *s, const ddt_drafter_weights *w, int64_t len, int tree, int uncached)
{
    const ddt_drafter_config *dc = &s->dc;
    const int64_t B = dc->block_size, V = s->m->vocab, LH = dc->taps * s->m->hidden;
    const ddt_head head = { s->m->embed_stored, s->m->lm_head_stored, s->m->bf16 };
    int rc;
    if (uncached) {
        const int32_t anchor = (int32_t)len;
        const uint8_t keep = 1;
        ddt_batch b = { 1, len + 1, 1, s->seq, s->mask, s->features, NULL, &anchor, &keep, NULL };
        rc = ddt_drafter_forward(s->be, dc, w, &head, &b, s->hs);
    } else {
        const int64_t cached = ddt_drafter_cache_rows(s->cache);
        rc = ddt_drafter_cache_append(s->cache, w, s->features + cached * LH, len - cached);
        if (rc == 0)
            rc = ddt_drafter_cache_draft(s->cache, w, &head, s->seq[len], s->hs);
    }
    if (rc)
        return rc;
    ddt_target_logits(s->be, s->m, s->hs, B, s->dev_logits);
    if (s->selector) {
        s->predecessors[1] = s->seq[len];
        s->view = ddt_selector_fill(s->selector, w, s->hs, s->dev_logits, s->predecessors);
    } else if (tree) {
        s->be->copy(s->be, s->logits, s->dev_logits, (size_t)(B * V) * sizeof(float));
        s->be->synchronize(s->be);
    }
    return 0;
}

/* The verify nodes of one call after a draft (node 0: seq[len], the root): the chain (budget 0:
 * the argmax of slots 1..B-1, or the selector's greedy path) or the tree of `budget` nodes (the
 * unary ranks', or the selector's lattice). Returns n. */
static int64_t draft_nodes(ddt_speculator *s, int64_t len, int64_t budget)
{
    const int64_t B = s->dc.block_size, V = s->m->vocab;
    s->node_tokens[0] = s->seq[len];
    s->node_parents[0] = -1;
    if (budget == 0) {   /* the argmax of slots 1..B-1, on the device */
        if (s->selector)
            ddt_selector_chain(s->view, s->node_tokens);
        else
            read_argmax(s, s->dev_logits + V, B - 1, s->node_tokens + 1);
        for (int64_t k = 1; k < B; k++)
            s->node_parents[k] = (int32_t)(k - 1);
        return B;
    }
    const int64_t n = s->selector ? ddt_selector_tree_draft(s->view, budget, s->node_tokens + 1, s->node_parents + 1)
                                  : ddt_tree_draft(s->logits, B, V, budget, s->node_tokens + 1, s->node_parents + 1);
    for (int64_t i = 1; i <= n; i++)   /* the tree's -1 (a child of the root) is node 0 */
        s->node_parents[i] += 1;
    return n + 1;
}

/* s->path (returned length) = the deepest root path of the n verified nodes whose every node
 * is the target's argmax after its parent; *bonus = the target's token after its last node */
static int64_t accept(ddt_speculator *s, int64_t n, int32_t *bonus)
{
    int64_t depth = 1, at = 0;
    s->path[0] = 0;
    for (;;) {
        int64_t next = -1;
        for (int64_t c = at + 1; c < n && next < 0; c++)   /* siblings carry distinct tokens */
            if (s->node_parents[c] == at && s->node_tokens[c] == s->argmax[at])
                next = c;
        if (next < 0)
            break;
        s->path[depth++] = (int32_t)next;
        at = next;
    }
    *bonus = s->argmax[at];
    return depth;
}

/* appends tok to run r's output unless it is full or stopped; returns 1 while it may go on */
static int emit(ddt_speculate_run *r, int32_t *out, int64_t G, int32_t stop, int32_t tok)
{
    out[r->n++] = tok;
    return r->n < G && tok != stop;
}

/* Plain greedy: the prefill's token, then a decode call per token */
static int decode_greedy(ddt_speculator *s, const ddt_speculate_params *p, const int32_t *prompt, int64_t P,
                         int32_t *out, ddt_speculate_run *r)
{
    const double t0 = ddt_mono_s();
    *r = (ddt_speculate_run){ .tokens = out };
    int32_t tok;
    int rc = prefill(s, prompt, P, &tok);
    while (rc == 0 && emit(r, out, p->gen_len, p->stop, tok)) {
        if ((rc = ddt_target_decode(&s->tc, tok, NULL, 0, NULL, s->hidden, s->dev_logits)) == 0)
            read_argmax(s, s->dev_logits, 1, &tok);
    }
    r->seconds = ddt_mono_s() - t0;
    return rc;
}

/* Speculative: budget 0 the chain, else the tree of that many nodes */
static int decode_speculative(ddt_speculator *s, const ddt_drafter_weights *w, const ddt_speculate_params *p,
                              int64_t budget, const int32_t *prompt, int64_t P, int32_t *out, ddt_speculate_run *r)
{
    const ddt_drafter_config *dc = &s->dc;
    const int64_t LH = dc->taps * s->m->hidden, G = p->gen_len;
    const size_t row = (size_t)LH * sizeof(float);
    const double t0 = ddt_mono_s();
    *r = (ddt_speculate_run){ .tokens = out };
    memcpy(s->seq, prompt, (size_t)P * sizeof(int32_t));
    ddt_drafter_cache_reset(s->cache);
    int rc = prefill(s, prompt, P, &s->seq[P]);
    int64_t len = P;   /* committed; seq[len] is the last generated token, not yet fed */
    int going = rc == 0 && emit(r, out, G, p->stop, s->seq[P]);
    while (going) {
        if ((rc = draft(s, w, len, budget > 0, p->uncached)))
            break;
        const int64_t n = draft_nodes(s, len, budget);
        rc = budget ? ddt_target_verify_tree(&s->tc, s->node_tokens, s->node_parents, n, dc->target_layer_ids,
                                             (int)dc->taps, s->node_features, s->hidden, s->dev_logits)
                    : ddt_target_verify(&s->tc, s->node_tokens, n, dc->target_layer_ids, (int)dc->taps,
                                        s->node_features, s->hidden, s->dev_logits);
        if (rc)
            break;
        read_argmax(s, s->dev_logits, n, s->argmax);
        int32_t bonus;
        const int64_t depth = accept(s, n, &bonus);
        if ((rc = ddt_target_rollback_path(&s->tc, s->path, depth)))   /* a chain's path: 0, 1, ... */
            break;
        for (int64_t k = 0; k < depth; k++)   /* the accepted rows' taps join the context */
            s->be->copy(s->be, s->features + (len + k) * LH, s->node_features + s->path[k] * LH, row);
        len += depth;
        r->calls++;
        for (int64_t k = 1; k <= depth && going; k++) {   /* the accepted drafts, then the bonus */
            const int32_t tok = k < depth ? s->node_tokens[s->path[k]] : bonus;
            s->seq[len - depth + k] = tok;
            going = emit(r, out, G, p->stop, tok);
        }
    }
    r->seconds = ddt_mono_s() - t0;
    return rc;
}

int ddt_speculate_prompt(ddt_speculator *s, const ddt_drafter_weights *w, const ddt_speculate_params *p,
                         const int32_t *prompt, int64_t P, ddt_speculate_prompt_result *r, char *err,
                         size_t err_len)
{
    memset(r, 0, sizeof *r);
    if (P < 1 || P > s->max_prompt)
        return ddt_fail(err, err_len, -EINVAL, "a prompt of %lld tokens: this speculator takes 1 .. %lld",
                        (long long)P, (long long)s->max_prompt);
    if (p->gen_len < 1 || p->gen_len > s->max_gen)
        return ddt_fail(err, err_len, -EINVAL, "gen_len %lld: this speculator generates 1 .. %lld",
                        (long long)p->gen_len, (long long)s->max_gen);
    if (p->n_budgets < 0 || p->n_budgets > DDT_MAX_BUDGETS)
        return ddt_fail(err, err_len, -EINVAL, "%d tree budgets: at most %d", p->n_budgets, (int)DDT_MAX_BUDGETS);
    for (int i = 0; i < p->n_budgets; i++)
        if (p->budgets[i] < 1 || p->budgets[i] > s->max_budget)
            return ddt_fail(err, err_len, -EINVAL, "tree budget %lld is outside 1 .. %lld, the planned cap",
                            (long long)p->budgets[i], (long long)s->max_budget);
    for (int64_t i = 0; i < P; i++)
        if (prompt[i] < 0 || prompt[i] >= s->m->vocab)
            return ddt_fail(err, err_len, -EINVAL, "prompt token %lld is %d, outside the vocabulary of %lld",
                            (long long)i, (int)prompt[i], (long long)s->m->vocab);
    const int64_t G = s->max_gen;
    int rc = decode_greedy(s, p, prompt, P, s->out, &r->greedy);
    if (rc == 0)
        rc = decode_speculative(s, w, p, 0, prompt, P, s->out + G, &r->chain);
    for (int i = 0; i < p->n_budgets && rc == 0; i++)
        rc = decode_speculative(s, w, p, p->budgets[i], prompt, P, s->out + (2 + i) * G, &r->tree[i]);
    if (rc)
        return ddt_fail(err, err_len, rc, "speculative decoding of a %lld-token prompt: the %s failed: %s",
                        (long long)P, rc == -ENOMEM ? "memory" : "target or drafter call", strerror(-rc));
    r->equal = 1;
    for (int i = -1; i < p->n_budgets; i++) {
        const ddt_speculate_run *x = i < 0 ? &r->chain : &r->tree[i];
        r->equal = r->equal && x->n == r->greedy.n &&
                   !memcmp(x->tokens, r->greedy.tokens, (size_t)x->n * sizeof(int32_t));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Totals
 */

void ddt_speculate_totals_init(ddt_speculate_totals *t, const ddt_speculate_params *p)
{
    memset(t, 0, sizeof *t);
    t->n_budgets = p->n_budgets;
    memcpy(t->budgets, p->budgets, sizeof t->budgets);
}

/* tokens a speculative run's verification calls yielded: all but the prefill's */
static int64_t verified(const ddt_speculate_run *r)
{
    return r->n > 0 ? r->n - 1 : 0;
}

void ddt_speculate_totals_add(ddt_speculate_totals *t, const ddt_speculate_prompt_result *r)
{
    t->prompts++;
    t->mismatched += !r->equal;
    t->generated += r->greedy.n;
    t->greedy_seconds += r->greedy.seconds;
    t->chain_tokens += verified(&r->chain);
    t->chain_calls += r->chain.calls;
    t->chain_seconds += r->chain.seconds;
    for (int i = 0; i < t->n_budgets; i++) {
        t->tree_tokens[i] += verified(&r->tree[i]);
        t->tree_calls[i] += r->tree[i].calls;
        t->tree_seconds[i] += r->tree[i].seconds;
    }
}

double ddt_speculate_tau(const ddt_speculate_totals *t)
{
    return t->chain_calls > 0 ? (double)t->chain_tokens / (double)t->chain_calls : 1.0;
}

double ddt_speculate_tau_tree(const ddt_speculate_totals *t, int i)
{
    return t->tree_calls[i] > 0 ? (double)t->tree_tokens[i] / (double)t->tree_calls[i] : 1.0;
}

cJSON *ddt_speculate_budgets_json(const ddt_speculate_totals *t, const double *values)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < t->n_budgets; i++) {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)t->budgets[i]);
        cJSON_AddNumberToObject(o, key, values[i]);
    }
    return o;
}
