/* source_generated.c: the generated implementation of source_impl.h (target.kind synthetic, or
 * hf with neither a token file nor chat files): the target samples every sequence with its
 * cache (generate.h, through target.h's interface), then its forward gives the features and
 * the teacher.
 * The held-out tokens are cached once sampled (the decode is the cost), their features are not.
 * tokens_only: the same tokens, and no forward. The rule that makes a sequence (its seed, length
 * and mask) is generated_tokens.c's ddt_source_generate, which a co-located trainer's ranks
 * sample through as well.
 * Tested through source.h by tests/engine/data/test_source.c, ddt_source_generate on another backend's
 * replica by tests/engine/data/test_source.c and tests/engine/train/test_trainer.c.
 *
 * Legend: S tokens of a sequence.
 */
#include "generated_tokens.h"
#include "source_impl.h"
#include "base/errors.h"
#include "model/generate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct generated {
    ddt_target_model target;
    ddt_heldout_tokens held;
} generated;

static int check(const ddt_source_config *c, int64_t hidden, char *err, size_t err_len)
{
    if (!(c->temperature >= 0.0f && c->temperature < 1e6f))
        return ddt_fail(err, err_len, -EINVAL, "source: temperature %g must be >= 0", (double)c->temperature);
    if (!(c->top_p > 0.0f && c->top_p <= 1.0f))
        return ddt_fail(err, err_len, -EINVAL, "source: top_p %g must be in (0, 1]", (double)c->top_p);
    if (c->kind != DDT_SOURCE_SYNTHETIC)
        return 0;
    const ddt_target_config *t = &c->synthetic;
    if (t->hidden != hidden)
        return ddt_fail(err, err_len, -EINVAL, "source: the synthetic target's hidden size %lld differs from the "
                        "drafter's %lld", (long long)t->hidden, (long long)hidden);
    if (t->layers < 1 || t->layers > DDT_MAX_TARGET_LAYERS || t->heads < 1 || t->kv_heads < 1 ||
        t->heads % t->kv_heads || t->head_dim < 2 || t->head_dim > 1024 || t->head_dim % 2 ||
        t->intermediate < 1 || t->vocab < 2 || t->vocab > INT32_MAX || !(t->rms_norm_eps > 0.0f) ||
        !(t->rope_theta > 0.0f))
        return ddt_fail(err, err_len, -EINVAL, "source: the synthetic target's shape is invalid (layers 1..%d, "
                        "heads a multiple of kv_heads, head_dim even <= 1024, vocab >= 2, eps and theta > 0)",
                        DDT_MAX_TARGET_LAYERS);
    return 0;
}

/* synthetic: the declared shape (already in the outputs) */
static int shape(const ddt_source_config *c, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                 char *err, size_t err_len)
{
    return c->kind == DDT_SOURCE_HF ? ddt_source_config_shape(c->model_dir, hidden, vocab, layers, tied, err, err_len)
                                    : 0;
}

static int open_generated(ddt_source_base *b, const ddt_source_config *c, char *err, size_t err_len)
{
    generated *g = calloc(1, sizeof *g);
    if (!g)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    b->data = g;
    const int synthetic = c->kind == DDT_SOURCE_SYNTHETIC;
    int rc = synthetic ? ddt_target_open_synthetic(&c->synthetic, ddt_generate_seed(c->seed, 0, "target"),
                                                   &g->target, err, err_len)
                       : ddt_target_open(c->model_dir, &g->target, err, err_len);
    if (rc)
        return rc;
    if (!g->target.ops->cache_open)   /* the generator decodes with a cache */
        return ddt_fail(err, err_len, -EINVAL, "%s: a %s target cannot generate sequences (it has no decoding "
                        "cache): give it target.tokens or feature shards", c->model_dir, g->target.model_type);
    if ((rc = ddt_source_use_target(b, &g->target, synthetic ? "synthetic target" : c->model_dir, err, err_len)))
        return rc;
    b->n_heldout = c->heldout;
    return ddt_heldout_tokens_init(&g->held, c, err, err_len);
}

static void close_generated(ddt_source_base *b)
{
    generated *g = b->data;
    if (!g)
        return;
    ddt_heldout_tokens_free(&g->held);
    ddt_target_close(&g->target);
    free(g);
    b->data = NULL;
}

/* both threads need a generator (the KV cache of one sequence) */
static int worker_open(const ddt_source_base *b, int trains, void **w, char *err, size_t err_len)
{
    (void)trains;
    const generated *g = b->data;
    ddt_generator *gen = calloc(1, sizeof *gen);
    if (!gen)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    int rc = ddt_generator_open(gen, b->be, &g->target, b->cfg.seq_len, err, err_len);
    if (rc) {
        free(gen);
        return rc;
    }
    *w = gen;
    return 0;
}

static void worker_close(void *w)
{
    ddt_generator *gen = w;
    if (gen->block)
        ddt_generator_free(gen);
    free(gen);
}

static int train(const ddt_source_base *b, void *w, int64_t cursor, ddt_sequence *q, char *err, size_t err_len)
{
    const generated *g = b->data;
    q->S = b->cfg.seq_len;
    int rc = ddt_source_generate(&b->cfg, w, 0, cursor, q->input_ids, q->loss_mask, err, err_len);
    return rc ? rc : ddt_source_target_features(b, &g->target, q, err, err_len);
}

static int heldout(ddt_source_base *b, void *w, int64_t i, ddt_sequence *q, char *err, size_t err_len)
{
    generated *g = b->data;
    const int64_t S = b->cfg.seq_len;
    int32_t *tokens;
    int rc = ddt_heldout_tokens_get(&g->held, &b->cfg, w, i, &tokens, err, err_len);
    if (rc)
        return rc;
    q->S = S;
    memcpy(q->input_ids, tokens, (size_t)S * sizeof *tokens);
    memset(q->loss_mask, 1, (size_t)S);
    return ddt_source_target_features(b, &g->target, q, err, err_len);
}

const ddt_source_ops ddt_source_generated = {
    .name = "generated",
    .accepts = ddt_source_generates,
    .check = check,
    .shape = shape,
    .open = open_generated,
    .close = close_generated,
    .worker_open = worker_open,
    .worker_close = worker_close,
    .train = train,
    .heldout = heldout,
};
