/* target.c: the frozen target's one interface (target.h): ddt_target_open(_with) dispatching on
 * config.json's model_type to the dense target (target_dense.c, made an implementation here:
 * its prefill, and its decoding cache from target_dense_cache.c) or the Qwen3.5 hybrid one
 * (target_qwen35.c, its own); the prefill and the logits on any implementation; the frozen head
 * of an open target copied to the host (ddt_target_head_copy); the decoding cache's checks and
 * bookkeeping around an implementation's (ddt_target_cache: lengths, the pending block, a
 * tree's parents for the path rollback); the drafter's default taps. Not here: what the
 * targets share (target_layers.c), sampling (generate.c).
 * Tested by tests/engine/data/test_source.c (the dispatch, the dense cache through the interface),
 * tests/engine/test_engine.c (the default taps), tests/engine/model/test_qwen35.c, tests/engine/eval/test_speculate.c (a tree's
 * verify and rollback) and tests/engine/model/test_target_cuda.c (on a GPU).
 *
 * Legend: T tokens, H hidden, V vocabulary.
 */
#include "target.h"
#include "target_layers.h"
#include "target_qwen35.h"
#include "ddk_bf16.h"
#include "base/errors.h"
#include "base/json_fields.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * The drafter's default taps
 */

/* Python's int(round(1 + (i * span) / (n - 1))) on the same doubles: rint rounds half to even
 * in the default rounding mode, as round() does (z-lab dflash/model.py, SpecForge
 * specforge/modeling/draft/dflash.py and SGLang python/sglang/srt/speculative/dflash_utils.py
 * build_target_layer_ids). lround rounds halves away from zero: N = 7, n = 3 would give
 * [1, 3, 4] where they give [1, 2, 4]. */
void ddt_target_default_taps(int64_t target_layers, int64_t drafter_layers, int32_t *ids)
{
    if (drafter_layers == 1) {
        ids[0] = (int32_t)(target_layers / 2);
        return;
    }
    for (int64_t i = 0; i < drafter_layers; i++)
        ids[i] = (int32_t)rint(1.0 + (double)(i * (target_layers - 4)) / (double)(drafter_layers - 1));
}

/* ------------------------------------------------------------------------------------------
 * The one target interface, and its dense implementation
 */

static int dense_prefill(const ddk_backend *be, const ddt_target_model *m, const int32_t *tokens, int64_t T,
                         const int32_t *tap_ids, int n_taps, float *features, float *final_hidden)
{
    return ddt_target_forward(be, m->impl, tokens, T, tap_ids, n_taps, features, final_hidden);
}

static void dense_free(ddt_target_model *m)
{
    ddt_target_free(m->impl);
    free(m->impl);
}

static const ddt_target_ops dense_ops = {
    .name = "dense",
    .prefill = dense_prefill,
    .free = dense_free,
    .cache_open = ddt_dense_cache_open,
    .cache_close = ddt_dense_cache_close,
    .extend = ddt_dense_extend,
    .verify = ddt_dense_verify,
    .rollback = ddt_dense_rollback,
};

/* m over t (heap, loaded), which m then owns */
static void dense_model(ddt_target *t, ddt_target_model *m)
{
    const int fast = !t->bf16 && !t->generic && ddt_target_host_backend(t->be);
    *m = (ddt_target_model){ &dense_ops, t->cfg.qwen3 ? "qwen3" : "llama", t->cfg.hidden, t->cfg.vocab,
                             t->cfg.layers, t->cfg.tie_word_embeddings,
                             fast ? t->embed_tokens : NULL, fast ? t->lm_head : NULL, t,
                             t->be, t->bf16, fast, t->embed_tokens, t->lm_head };
}

int ddt_target_type_is_qwen35(const char *model_type)
{
    return model_type && (!strcmp(model_type, "qwen3_5") || !strcmp(model_type, "qwen3_5_text"));
}

/* 1 when DIR/config.json names a Qwen3.5 text model; 0 otherwise, and when it cannot be read
 * (the dense loader then says why) */
static int is_qwen35(const char *dir)
{
    char path[1100], err[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root = ddt_json_parse_file(path, 1 << 22, err, sizeof err);
    int yes = ddt_target_type_is_qwen35(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type")));
    cJSON_Delete(root);
    return yes;
}

static int refuse_backend(const ddt_target_options *o, char *err, size_t err_len)
{
    const ddk_backend *be = o && o->be ? o->be : ddk_backend_cpu();
    if (!ddt_target_has_ops(be, o && o->bf16))
        return ddt_fail(err, err_len, -ENOTSUP, "the %s backend lacks an op the target needs (copy_rows, "
                        "causal_attention%s)", be->name, o && o->bf16 ? ", matmul_w16, embedding_w16" : "");
    return 0;
}

int ddt_target_open_with(const char *dir, const ddt_target_options *o, ddt_target_model *m, char *err,
                         size_t err_len)
{
    memset(m, 0, sizeof *m);
    int rc = refuse_backend(o, err, err_len);
    if (rc)
        return rc;
    if (is_qwen35(dir))
        return ddt_qwen35_open_with(dir, o, m, err, err_len);
    ddt_target *t = malloc(sizeof *t);
    if (!t)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the target");
    rc = ddt_target_load_with(dir, o, t, err, err_len);
    if (rc)
        free(t);
    else
        dense_model(t, m);
    return rc;
}

int ddt_target_open(const char *dir, ddt_target_model *m, char *err, size_t err_len)
{
    return ddt_target_open_with(dir, NULL, m, err, err_len);
}

int ddt_target_open_synthetic_with(const ddt_target_config *cfg, uint64_t seed, const ddt_target_options *o,
                                   ddt_target_model *m, char *err, size_t err_len)
{
    memset(m, 0, sizeof *m);
    int rc = refuse_backend(o, err, err_len);
    if (rc)
        return rc;
    ddt_target *t = malloc(sizeof *t);
    if (!t)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the target");
    rc = ddt_target_synthetic_with(cfg, seed, o, t, err, err_len);
    if (rc)
        free(t);
    else
        dense_model(t, m);
    return rc;
}

int ddt_target_open_synthetic(const ddt_target_config *cfg, uint64_t seed, ddt_target_model *m, char *err,
                              size_t err_len)
{
    return ddt_target_open_synthetic_with(cfg, seed, NULL, m, err, err_len);
}

int ddt_target_head_copy(const ddt_target_model *m, ddt_target_head *h, char *err, size_t err_len)
{
    memset(h, 0, sizeof *h);
    const int64_t V = m->vocab, H = m->hidden, n = V * H;
    const int two = m->lm_head_stored != m->embed_stored;
    h->vocab = V;
    h->weight_bytes = (size_t)((two ? 2 : 1) * n) * sizeof(float);
    h->weights = ddk_malloc(ddk_allocator_cpu(), h->weight_bytes);
    ddt_weight_stager s = { 0 };
    if (!h->weights || ddt_weight_stager_init(&s, m->be, n)) {
        ddk_free(ddk_allocator_cpu(), h->weights, h->weight_bytes);
        memset(h, 0, sizeof *h);
        return ddt_fail(err, err_len, -ENOMEM, "no host memory for the target's embed_tokens and lm_head");
    }
    h->embed_tokens = h->weights;
    h->lm_head = two ? h->weights + n : h->weights;
    const size_t esize = m->bf16 ? sizeof(uint16_t) : sizeof(float);
    for (int which = 0; which < (two ? 2 : 1); which++) {
        const char *src = which ? m->lm_head_stored : m->embed_stored;
        float *out = which ? h->lm_head : h->embed_tokens;
        for (int64_t first = 0; first < n; first += s.floats) {   /* through the staging buffer */
            const int64_t count = n - first < s.floats ? n - first : s.floats;
            m->be->copy(m->be, s.buf, src + first * (int64_t)esize, (size_t)count * esize);
            m->be->synchronize(m->be);
            if (!m->bf16) {
                memcpy(out + first, s.buf, (size_t)count * sizeof(float));
                continue;
            }
            for (int64_t i = 0; i < count; i++) {
                uint16_t b;
                memcpy(&b, (const char *)s.buf + i * 2, sizeof b);
                out[first + i] = ddk_bf16_to_f32(b);
            }
        }
    }
    ddt_weight_stager_free(&s);
    return 0;
}

void ddt_target_close(ddt_target_model *m)
{
    if (m->ops)
        m->ops->free(m);
    memset(m, 0, sizeof *m);
}

int ddt_target_prefill(const ddk_backend *be, const ddt_target_model *m, const int32_t *tokens, int64_t T,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden,
                       float *logits)
{
    if (logits && !final_hidden)
        return -EINVAL;
    int rc = m->ops->prefill(be, m, tokens, T, tap_ids, n_taps, features, final_hidden);
    if (rc == 0 && logits)
        ddt_target_logits(be, m, final_hidden, T, logits);
    return rc;
}

void ddt_target_logits(const ddk_backend *be, const ddt_target_model *m, const float *final_hidden, int64_t n,
                       float *logits)
{
    ddt_target_linear(be, m->bf16, m->fast, n, m->vocab, m->hidden, final_hidden, m->lm_head_stored, 0, logits);
}

/* ------------------------------------------------------------------------------------------
 * The cache, through the interface
 */

int ddt_target_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                          ddt_target_cache *c, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    if (!m->ops->cache_open)
        return ddt_fail(err, err_len, -ENOTSUP, "a %s target has no decoding cache behind the target interface",
                        m->model_type);
    if (max_len < 1 || max_block < 1 || max_block > max_len)
        return ddt_fail(err, err_len, -EINVAL, "target cache: max_len %lld and max_block %lld must be >= 1, "
                        "max_block <= max_len", (long long)max_len, (long long)max_block);
    if (!(c->parents = malloc((size_t)max_block * sizeof *c->parents)))
        return ddt_fail(err, err_len, -ENOMEM, "no memory for a target cache of %lld positions", (long long)max_len);
    int rc = m->ops->cache_open(be, m, max_len, max_block, &c->impl);
    if (rc) {
        free(c->parents);
        c->parents = NULL;
        return ddt_fail(err, err_len, rc, "target cache of %lld positions: %s", (long long)max_len, strerror(-rc));
    }
    c->be = be, c->m = m, c->max_len = max_len, c->max_block = max_block;
    return 0;
}

void ddt_target_cache_close(ddt_target_cache *c)
{
    if (c->impl)
        c->m->ops->cache_close(c->be, c->m, c->impl);
    free(c->parents);
    memset(c, 0, sizeof *c);
}

void ddt_target_cache_reset(ddt_target_cache *c)
{
    c->len = c->pending = 0;
}

int ddt_target_extend(ddt_target_cache *c, const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps,
                      float *features, float *final_hidden, float *logits)
{
    if (c->pending || n < 1 || c->len + n > c->max_len || (logits && !final_hidden))
        return -EINVAL;
    int rc = c->m->ops->extend(c->be, c->m, c->impl, c->len, tokens, n, tap_ids, n_taps, features, final_hidden);
    if (rc)
        return rc;
    c->len += n;
    if (logits)
        ddt_target_logits(c->be, c->m, final_hidden, n, logits);
    return 0;
}

int ddt_target_decode(ddt_target_cache *c, int32_t token, const int32_t *tap_ids, int n_taps, float *features,
                      float *final_hidden, float *logits)
{
    return ddt_target_extend(c, &token, 1, tap_ids, n_taps, features, final_hidden, logits);
}

/* a chain (parents NULL) or a tree of n rows pending after len: what verify and verify_tree share */
static int verify_rows(ddt_target_cache *c, const int32_t *tokens, const int32_t *parents, int64_t n,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden, float *logits)
{
    if (c->pending || n < 1 || n > c->max_block || c->len + n > c->max_len || (logits && !final_hidden))
        return -EINVAL;
    for (int64_t i = 0; parents && i < n; i++)
        if (parents[i] < -1 || parents[i] >= i)
            return -EINVAL;
    int rc = c->m->ops->verify(c->be, c->m, c->impl, c->len, tokens, n, parents, tap_ids, n_taps, features,
                               final_hidden);
    if (rc)
        return rc;
    for (int64_t i = 0; i < n; i++)
        c->parents[i] = parents ? parents[i] : (int32_t)(i - 1);
    c->pending = n;
    if (logits)
        ddt_target_logits(c->be, c->m, final_hidden, n, logits);
    return 0;
}

int ddt_target_verify(ddt_target_cache *c, const int32_t *tokens, int64_t B, const int32_t *tap_ids, int n_taps,
                      float *features, float *final_hidden, float *logits)
{
    return verify_rows(c, tokens, NULL, B, tap_ids, n_taps, features, final_hidden, logits);
}

int ddt_target_verify_tree(ddt_target_cache *c, const int32_t *tokens, const int32_t *parents, int64_t n,
                           const int32_t *tap_ids, int n_taps, float *features, float *final_hidden, float *logits)
{
    if (!c->be->tree_attention)
        return -ENOTSUP;
    return verify_rows(c, tokens, parents, n, tap_ids, n_taps, features, final_hidden, logits);
}

int ddt_target_rollback(ddt_target_cache *c, int64_t accepted)
{
    if (!c->pending || accepted < 0 || accepted > c->pending)
        return -EINVAL;
    for (int64_t k = 0; k < accepted; k++)   /* a chain's first ones: a tree's rows are not a chain */
        if (c->parents[k] != k - 1)
            return -EINVAL;
    c->m->ops->rollback(c->m, c->impl, c->len, NULL, accepted);
    c->len += accepted;
    c->pending = 0;
    return 0;
}

int ddt_target_rollback_path(ddt_target_cache *c, const int32_t *path, int64_t n)
{
    if (!c->pending || n < 0 || n > c->pending)
        return -EINVAL;
    int chain = 1;
    for (int64_t k = 0; k < n; k++) {
        if (path[k] < 0 || path[k] >= c->pending || c->parents[path[k]] != (k ? path[k - 1] : -1))
            return -EINVAL;
        chain = chain && path[k] == k;
    }
    c->m->ops->rollback(c->m, c->impl, c->len, chain ? NULL : path, n);
    c->len += n;
    c->pending = 0;
    return 0;
}

int ddt_target_config_shape(const char *dir, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                            char *err, size_t err_len)
{
    int rc;
    if (is_qwen35(dir)) {
        ddt_qwen35_config q;
        if ((rc = ddt_qwen35_config_load(dir, &q, err, err_len)) == 0)
            *hidden = q.hidden, *vocab = q.vocab, *layers = q.layers, *tied = q.tie_word_embeddings;
    } else {
        ddt_target_config t;
        if ((rc = ddt_target_config_load(dir, &t, err, err_len)) == 0)
            *hidden = t.hidden, *vocab = t.vocab, *layers = t.layers, *tied = t.tie_word_embeddings;
    }
    return rc;
}
