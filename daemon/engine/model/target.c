/* target.c: the frozen dense target (SPEC.md section 3): loading Hugging Face llama / qwen3
 * weights (any float dtype, converted to float32, or the matrices and embedding to bf16) onto
 * any backend, a seeded synthetic target, and the causal forward (backend ops only) that yields
 * tapped layer outputs and the final-normed hidden state; the frozen head (embed_tokens,
 * lm_head) of any target directory, the only part feature shards need, or of an open target
 * (ddt_target_head_copy). What both targets share: the products and embedding on the weights'
 * storage, the token ids' upload, the staged loading of a tensor (ddt_weight_put: a bounded
 * host buffer, page-locked for a GPU, converted, narrowed to bf16, q_proj's rows reordered, then
 * the backend's copy).
 *
 * One table of tensors (Hugging Face names, shapes, where each pointer goes) drives both the
 * loading and the synthetic initialisation. Last, the one target interface (target.h) and its
 * dense implementation. Not here: the dense target's decoding cache (target_dense_cache.c),
 * sampling (generate.c), the Qwen3.5 hybrid target (target_qwen35.c, the interface's other
 * implementation).
 * Tested by tests/features_torch_check.py, tests/test_engine.c and tests/test_source.c.
 *
 * Legend: T tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate.
 */
#include "target.h"
#include "target_dense_cache.h"
#include "target_qwen35.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "base/errors.h"
#include "base/json_fields.h"
#include "safetensors.h"
#include "tensor_load.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * The tensor table
 */

/* The Hugging Face names the tie rule is about: without lm_head.weight, config.json must set
 * tie_word_embeddings (the head is embed_tokens). */
static const char EMBED_NAME[] = "model.embed_tokens.weight", HEAD_NAME[] = "lm_head.weight";

static int missing_head(const char *dir, char *err, size_t err_len)
{
    return ddt_fail(err, err_len, -EINVAL, "%s: %s is missing and config.json does not set "
                    "tie_word_embeddings: true", dir, HEAD_NAME);
}

typedef enum tensor_kind { KIND_NORM, KIND_MATRIX, KIND_EMBEDDING, KIND_HEAD } tensor_kind;

typedef struct target_tensor {
    char name[96];
    int64_t rows, cols;     /* cols = 0: a vector */
    tensor_kind kind;
    void *slot;             /* where its pointer goes in the ddt_target: float ** (KIND_NORM) or void ** */
} target_tensor;

/* Fills table (room for 4 + 11 per layer); returns the count. */
static int target_table(ddt_target *t, target_tensor *table)
{
    const ddt_target_config *c = &t->cfg;
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, d = c->head_dim;
    int n = 0;
#define ADD(slot_ptr, kind_, rows_, cols_, ...)                                     \
    do {                                                                            \
        target_tensor *e = &table[n++];                                             \
        snprintf(e->name, sizeof e->name, __VA_ARGS__);                             \
        e->rows = rows_;                                                            \
        e->cols = cols_;                                                            \
        e->kind = kind_;                                                            \
        e->slot = slot_ptr;                                                         \
    } while (0)
    ADD(&t->embed_tokens, KIND_EMBEDDING, c->vocab, H, "%s", EMBED_NAME);
    for (int64_t i = 0; i < c->layers; i++) {
        ddt_target_layer *L = &t->layer[i];
        ADD(&L->input_layernorm, KIND_NORM, H, 0, "model.layers.%lld.input_layernorm.weight", (long long)i);
        ADD(&L->q_proj, KIND_MATRIX, qd, H, "model.layers.%lld.self_attn.q_proj.weight", (long long)i);
        ADD(&L->k_proj, KIND_MATRIX, kvd, H, "model.layers.%lld.self_attn.k_proj.weight", (long long)i);
        ADD(&L->v_proj, KIND_MATRIX, kvd, H, "model.layers.%lld.self_attn.v_proj.weight", (long long)i);
        ADD(&L->o_proj, KIND_MATRIX, H, qd, "model.layers.%lld.self_attn.o_proj.weight", (long long)i);
        if (c->qwen3) {
            ADD(&L->q_norm, KIND_NORM, d, 0, "model.layers.%lld.self_attn.q_norm.weight", (long long)i);
            ADD(&L->k_norm, KIND_NORM, d, 0, "model.layers.%lld.self_attn.k_norm.weight", (long long)i);
        }
        ADD(&L->post_attention_layernorm, KIND_NORM, H, 0, "model.layers.%lld.post_attention_layernorm.weight",
            (long long)i);
        ADD(&L->gate_proj, KIND_MATRIX, I, H, "model.layers.%lld.mlp.gate_proj.weight", (long long)i);
        ADD(&L->up_proj, KIND_MATRIX, I, H, "model.layers.%lld.mlp.up_proj.weight", (long long)i);
        ADD(&L->down_proj, KIND_MATRIX, H, I, "model.layers.%lld.mlp.down_proj.weight", (long long)i);
    }
    ADD(&t->norm, KIND_NORM, H, 0, "model.norm.weight");
    if (!c->tie_word_embeddings)
        ADD(&t->lm_head, KIND_HEAD, c->vocab, H, "%s", HEAD_NAME);
#undef ADD
    return n;
}

static int64_t numel(const target_tensor *e)
{
    return e->cols ? e->rows * e->cols : e->rows;
}

int64_t ddt_target_param_count(const ddt_target_config *c)
{
    ddt_target *t = calloc(1, sizeof *t);
    target_tensor *table = calloc((size_t)(4 + 11 * c->layers), sizeof *table);
    int64_t total = t && table ? 0 : -ENOMEM;
    if (t && table) {
        t->cfg = *c;
        const int count = target_table(t, table);
        for (int i = 0; i < count; i++)
            total += numel(&table[i]);
    }
    free(table);
    free(t);
    return total;
}

int64_t ddt_target_rows_bytes(const ddt_target_config *c, int64_t T)
{
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim, I = c->intermediate;
    /* x, u (T, H); q, attn (T, nh*d); k, v (T, nkv*d); gate, up (T, I); tokens, pos (T) */
    return T * (2 * H + 2 * qd + 2 * kvd + 2 * I) * (int64_t)sizeof(float) + 2 * T * (int64_t)sizeof(int32_t);
}

static int is_matrix(const target_tensor *e)
{
    return e->kind != KIND_NORM;
}

static void set_slot(const target_tensor *e, void *p)
{
    if (is_matrix(e))
        *(void **)e->slot = p;
    else
        *(float **)e->slot = p;
}

static void *slot_of(const target_tensor *e)
{
    return is_matrix(e) ? *(void **)e->slot : (void *)*(float **)e->slot;
}

static size_t block_bytes(const ddt_target *t, const target_tensor *table, int count)
{
    size_t total = 0;
    for (int i = 0; i < count; i++)
        total += ddt_weight_slot_bytes(numel(&table[i]), t->bf16 && is_matrix(&table[i]), t->bf16);
    return total;
}

/* Allocates the one weight block on t->be and points every slot into it. */
static int carve_weights(ddt_target *t, target_tensor *table, int count, char *err, size_t err_len)
{
    t->weight_bytes = block_bytes(t, table, count);
    t->weights = ddk_malloc(t->be->alloc, t->weight_bytes);
    if (!t->weights) {
        snprintf(err, err_len, "no memory on %s for the target's weights (%.2f GB as %s)",
                 ddk_allocator_device(t->be->alloc), t->weight_bytes / 1e9, t->bf16 ? "bf16" : "float32");
        return -ENOMEM;
    }
    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        set_slot(&table[i], (char *)t->weights + offset);
        offset += ddt_weight_slot_bytes(numel(&table[i]), t->bf16 && is_matrix(&table[i]), t->bf16);
    }
    if (t->cfg.tie_word_embeddings)
        t->lm_head = t->embed_tokens;
    return 0;
}

int64_t ddt_target_weight_bytes(const ddt_target_config *c, int bf16)
{
    ddt_target *t = calloc(1, sizeof *t);
    target_tensor *table = calloc((size_t)(4 + 11 * c->layers), sizeof *table);
    int64_t total = t && table ? 0 : -ENOMEM;
    if (t && table) {
        t->cfg = *c, t->bf16 = bf16;
        total = (int64_t)block_bytes(t, table, target_table(t, table));
    }
    free(table);
    free(t);
    return total;
}

static target_tensor *new_table(const ddt_target_config *c, char *err, size_t err_len)
{
    if (c->layers > DDT_MAX_TARGET_LAYERS) {
        snprintf(err, err_len, "targets of more than %d layers are not supported (got %lld)",
                 DDT_MAX_TARGET_LAYERS, (long long)c->layers);
        return NULL;
    }
    target_tensor *table = calloc((size_t)(4 + 11 * c->layers), sizeof *table);
    if (!table)
        snprintf(err, err_len, "no memory for the target's tensor table");
    return table;
}

/* t's backend and precision from o (NULL: the CPU, fp32) */
static void target_place(ddt_target *t, const ddt_target_options *o)
{
    t->be = o && o->be ? o->be : ddk_backend_cpu();
    t->bf16 = o ? o->bf16 != 0 : 0;
    t->generic = o ? o->generic != 0 : 0;
}

static int64_t largest(const target_tensor *table, int count)
{
    int64_t n = 1;
    for (int i = 0; i < count; i++)
        n = numel(&table[i]) > n ? numel(&table[i]) : n;
    return n;
}

int ddt_target_load_with(const char *dir, const ddt_target_options *o, ddt_target *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    target_place(t, o);
    int rc = ddt_target_config_load(dir, &t->cfg, err, err_len);
    if (rc)
        return rc;
    target_tensor *table = new_table(&t->cfg, err, err_len);
    if (!table)
        return -EINVAL;
    ddt_st_model model;
    if ((rc = ddt_st_model_open(dir, &model, err, err_len))) {
        free(table);
        return rc;
    }
    int count = target_table(t, table);
    ddt_weight_stager stager = { 0 };
    if (!t->cfg.tie_word_embeddings && !ddt_st_model_find(&model, HEAD_NAME))
        rc = missing_head(dir, err, err_len);
    for (int i = 0; i < count && !rc; i++) {   /* every tensor checked before anything is allocated */
        const target_tensor *e = &table[i];
        const ddt_st_tensor *st = ddt_st_model_find(&model, e->name);
        int64_t dims[2] = { e->rows, e->cols };
        ddt_tensor_want want = { e->name, DDT_F32, e->cols ? 2 : 1, dims };
        if (!st) {
            snprintf(err, err_len, "%s: tensor '%s' is missing", dir, e->name);
            rc = -EINVAL;
        } else {
            rc = ddt_tensor_check(st, dir, &want, err, err_len);
        }
    }
    if (!rc)
        rc = carve_weights(t, table, count, err, err_len);
    if (!rc && (rc = ddt_weight_stager_init(&stager, t->be, largest(table, count))))
        snprintf(err, err_len, "no host memory to stage the target's tensors");
    for (int i = 0; i < count && !rc; i++) {
        const target_tensor *e = &table[i];
        ddt_weight_src src = { .st = ddt_st_model_find(&model, e->name), .rows = e->rows,
                               .cols = e->cols ? e->cols : 1, .w16 = t->bf16 && is_matrix(e) };
        ddt_weight_put(&stager, &src, slot_of(e));
    }
    ddt_weight_stager_free(&stager);
    ddt_st_model_close(&model);
    free(table);
    if (rc)
        ddt_target_free(t);
    return rc;
}

int ddt_target_load(const char *dir, ddt_target *t, char *err, size_t err_len)
{
    return ddt_target_load_with(dir, NULL, t, err, err_len);
}

/* The synthetic head gives logits of this standard deviation: next-token distributions are
 * peaked (a few tokens carry most of the mass), so the text it generates has structure a
 * drafter can learn; with 1 (a plain 1/sqrt(H) init) they are close to uniform over V. */
enum { SYNTHETIC_LOGIT_STD = 4 };

int ddt_target_synthetic_with(const ddt_target_config *cfg, uint64_t seed, const ddt_target_options *o,
                              ddt_target *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    target_place(t, o);
    t->cfg = *cfg;
    target_tensor *table = new_table(cfg, err, err_len);
    if (!table)
        return -EINVAL;
    int count = target_table(t, table);
    int rc = carve_weights(t, table, count, err, err_len);
    ddt_weight_stager stager = { 0 };
    if (!rc && (rc = ddt_weight_stager_init(&stager, t->be, largest(table, count))))
        snprintf(err, err_len, "no host memory to stage the target's tensors");
    for (int i = 0; i < count && !rc; i++) {
        const target_tensor *e = &table[i];
        double std = e->kind == KIND_EMBEDDING ? 1.0
                   : e->kind == KIND_MATRIX ? 1.0 / sqrt((double)e->cols)
                   : e->kind == KIND_HEAD ? SYNTHETIC_LOGIT_STD / sqrt((double)e->cols) : 0.0;
        ddt_weight_src src = { .seed = seed * 0x100000001B3ull + (uint64_t)i, .std = std, .fill = 1.0f,
                               .rows = e->rows, .cols = e->cols ? e->cols : 1, .w16 = t->bf16 && is_matrix(e) };
        ddt_weight_put(&stager, &src, slot_of(e));
    }
    ddt_weight_stager_free(&stager);
    free(table);
    if (rc)
        ddt_target_free(t);
    return rc;
}

int ddt_target_synthetic(const ddt_target_config *cfg, uint64_t seed, ddt_target *t,
                         char *err, size_t err_len)
{
    return ddt_target_synthetic_with(cfg, seed, NULL, t, err, err_len);
}

void ddt_target_free(ddt_target *t)
{
    if (t->weights)
        ddk_free(t->be->alloc, t->weights, t->weight_bytes);
    t->weights = NULL;
}

/* ------------------------------------------------------------------------------------------
 * The frozen head alone
 */

/* tie_word_embeddings of DIR/config.json (top level or text_config); 0 when absent, and when
 * the file cannot be read (the head's tensors then decide) */
static int config_ties(const char *dir)
{
    char path[1100], err[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root = ddt_json_parse_file(path, 1 << 22, err, sizeof err);
    if (!root)
        return 0;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (!tie)
        tie = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "text_config"),
                                               "tie_word_embeddings");
    int tied = cJSON_IsTrue(tie);
    cJSON_Delete(root);
    return tied;
}

int ddt_target_load_head(const char *dir, int64_t hidden, ddt_target_head *h, char *err, size_t err_len)
{
    memset(h, 0, sizeof *h);
    ddt_st_model m;
    int rc = ddt_st_model_open(dir, &m, err, err_len);
    if (rc)
        return rc;
    const ddt_st_tensor *embed = ddt_st_model_find(&m, EMBED_NAME);
    if (!embed)
        embed = ddt_st_model_find(&m, "model.language_model.embed_tokens.weight");
    const ddt_st_tensor *head = ddt_st_model_find(&m, HEAD_NAME);
    const ddt_st_tensor *both[2] = { embed, head };
    if (!embed)
        rc = ddt_fail(err, err_len, -EINVAL, "%s: neither %s nor model.language_model.embed_tokens.weight is "
                      "there", dir, EMBED_NAME);
    else if (!head && !config_ties(dir))
        rc = missing_head(dir, err, err_len);
    for (int i = 0; i < 2 && !rc && both[i]; i++) {
        const ddt_st_tensor *t = both[i];
        if ((t->dtype != DDT_F32 && t->dtype != DDT_BF16 && t->dtype != DDT_F16) || t->ndim != 2 ||
            t->shape[1] != hidden || t->shape[0] < 2 || t->shape[0] > INT32_MAX || t->shape[0] != embed->shape[0])
            rc = ddt_fail(err, err_len, -EINVAL, "%s: %s must be F32, BF16 or F16 of shape [V, %lld] (the drafter's "
                          "hidden size), the same V for embed_tokens and lm_head", dir, t->name, (long long)hidden);
    }
    if (!rc) {
        h->vocab = embed->shape[0];
        h->weight_bytes = (size_t)((head ? 2 : 1) * h->vocab * hidden) * sizeof(float);
        h->weights = ddk_malloc(ddk_allocator_cpu(), h->weight_bytes);
        if (!h->weights)
            rc = ddt_fail(err, err_len, -ENOMEM, "%s: no memory for embed_tokens and lm_head", dir);
    }
    if (!rc) {
        h->embed_tokens = h->weights;
        h->lm_head = head ? h->weights + h->vocab * hidden : h->weights;
        ddt_st_to_f32(embed, h->embed_tokens);
        if (head)
            ddt_st_to_f32(head, h->lm_head);
    }
    ddt_st_model_close(&m);
    return rc;
}

void ddt_target_head_free(ddt_target_head *h)
{
    if (h->weights)
        ddk_free(ddk_allocator_cpu(), h->weights, h->weight_bytes);
    memset(h, 0, sizeof *h);
}

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
 * Forward
 */

int ddt_target_host_backend(const ddk_backend *be)
{
    return !strcmp(be->name, "cpu");
}

void ddt_target_embed(const ddk_backend *be, int w16, const void *table, const int32_t *ids, int64_t rows,
                      int64_t H, float *out)
{
    if (w16)
        be->embedding_w16(be, table, ids, rows, H, out);
    else
        be->embedding(be, table, ids, rows, H, out);
}

void ddt_target_put_ids(const ddk_backend *be, const int32_t *tokens, int64_t n, int64_t p0, const int32_t *parents,
                        int32_t *dst)
{
    const int64_t count = (parents ? 3 : 2) * n;
    int32_t *host = ddt_target_host_backend(be) ? dst : malloc((size_t)count * sizeof *host);
    if (!host)
        ddk_fatal(__FILE__, __LINE__, "no host memory for %lld token ids", (long long)n);
    memcpy(host, tokens, (size_t)n * sizeof *host);
    for (int64_t i = 0; i < n; i++)   /* a tree node's position: p0 + its depth (its parent's + 1) */
        host[n + i] = (int32_t)(parents ? (parents[i] < 0 ? p0 : host[n + parents[i]] + 1) : p0 + i);
    if (parents)
        memcpy(host + 2 * n, parents, (size_t)n * sizeof *host);
    if (host != dst) {
        be->copy(be, dst, host, (size_t)count * sizeof *host);
        be->synchronize(be);   /* before the host buffer goes */
        free(host);
    }
}

/* ------------------------------------------------------------------------------------------
 * Loading through a staging buffer
 */

enum { STAGING_FLOATS = 1 << 24 };   /* 64 MiB: a tensor larger than this goes in pieces */

size_t ddt_weight_slot_bytes(int64_t numel, int w16, int bf16_block)
{
    const size_t bytes = (size_t)numel * (w16 ? sizeof(uint16_t) : sizeof(float));
    return bf16_block ? (bytes + 15) / 16 * 16 : bytes;
}

int ddt_weight_stager_init(ddt_weight_stager *s, const ddk_backend *be, int64_t max_numel)
{
    memset(s, 0, sizeof *s);
    s->be = be;
    s->floats = max_numel < STAGING_FLOATS ? (max_numel > 0 ? max_numel : 1) : STAGING_FLOATS;
    s->pinned = !ddt_target_host_backend(be);
    s->buf = s->pinned ? ddk_host_alloc_pinned((size_t)s->floats * sizeof(float))
                       : malloc((size_t)s->floats * sizeof(float));
    return s->buf ? 0 : -ENOMEM;
}

void ddt_weight_stager_free(ddt_weight_stager *s)
{
    if (s->pinned)
        ddk_host_free_pinned(s->buf);
    else
        free(s->buf);
    s->buf = NULL;
}

void ddt_weight_put(ddt_weight_stager *s, const ddt_weight_src *src, void *dst)
{
    const int64_t rows = src->rows, cols = src->cols, esize = src->w16 ? 2 : 4,
                  run = src->split_rows > 0 ? src->split_rows : rows,
                  per = s->floats / cols > 0 ? s->floats / cols : 1;   /* rows a piece */
    uint64_t rng = src->seed;
    if (cols > s->floats)   /* a stager holds a row at least (ddt_weight_stager_init's bound) */
        ddk_fatal(__FILE__, __LINE__, "a weight row of %lld values passes the staging buffer", (long long)cols);
    for (int64_t r = 0; r < rows;) {
        const int64_t run_end = (r / run + 1) * run < rows ? (r / run + 1) * run : rows,
                      n = per < run_end - r ? per : run_end - r, count = n * cols;
        float *v = s->buf;
        if (src->st)
            ddt_st_range_to_f32(src->st, r * cols, count, v);
        else
            for (int64_t i = 0; i < count; i++)
                v[i] = src->std > 0 ? (float)(src->std * ddk_rng_normal(&rng)) : src->fill;
        for (int64_t i = 0; src->add != 0.0f && i < count; i++)
            v[i] += src->add;
        int64_t to = r;
        if (src->split_rows > 0) {   /* run k: head k / 2, its a (k even) or b rows */
            const int64_t k = r / run;
            to = (k % 2) * (rows / 2) + (k / 2) * run + r % run;
        }
        if (src->w16)   /* narrowed in place, front to back (through memcpy: no aliasing) */
            for (int64_t i = 0; i < count; i++) {
                const uint16_t b = ddk_f32_to_bf16(v[i]);
                memcpy((char *)v + i * 2, &b, sizeof b);
            }
        s->be->copy(s->be, (char *)dst + to * cols * esize, v, (size_t)(count * esize));
        if (s->pinned)
            s->be->synchronize(s->be);   /* before the buffer is rewritten */
        r += n;
    }
}

/* ------------------------------------------------------------------------------------------
 * Forward
 */

void ddt_target_mlp(const ddk_backend *be, int bf16, int fast, const float *u, const void *gate_proj,
                    const void *up_proj, const void *down_proj, int64_t T, int64_t H, int64_t I, float *gate,
                    float *up, float *x)
{
    ddt_target_linear(be, bf16, fast, T, I, H, u, gate_proj, 0, gate);
    ddt_target_linear(be, bf16, fast, T, I, H, u, up_proj, 0, up);
    be->swiglu(be, gate, up, T * I, gate);
    ddt_target_linear(be, bf16, fast, T, H, I, gate, down_proj, 1, x);   /* residual */
}

void ddt_target_tap(const ddk_backend *be, const float *x, int64_t T, int64_t H, int64_t l,
                    const int32_t *tap_ids, int n_taps, float *features)
{
    for (int i = 0; features && i < n_taps; i++)
        if (tap_ids[i] == l)
            be->copy_rows(be, features + i * H, n_taps * H, x, H, T, H);
}

/* the ops a target stored as bf16 says needs of be beyond the drafter's */
static int has_target_ops(const ddk_backend *be, int bf16)
{
    return be->copy_rows && be->causal_attention && (!bf16 || (be->matmul_w16 && be->embedding_w16));
}

int ddt_target_forward(const ddk_backend *be, const ddt_target *t, const int32_t *tokens,
                       int64_t T, const int32_t *tap_ids, int n_taps, float *features,
                       float *final_hidden)
{
    const ddt_target_config *c = &t->cfg;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, d = c->head_dim,
                  qd = nh * d, kvd = nkv * d, I = c->intermediate;
    const int w16 = t->bf16;
    for (int i = 0; i < n_taps; i++)
        if (tap_ids[i] < 0 || tap_ids[i] >= c->layers)
            return -EINVAL;
    if (!has_target_ops(be, w16))
        return -ENOTSUP;

    const size_t bytes = (size_t)ddt_target_rows_bytes(c, T);   /* the layout below */
    float *x = ddk_malloc(be->alloc, bytes);
    if (!x)
        return -ENOMEM;
    float *u = x + T * H, *q = u + T * H, *attn = q + T * qd, *k = attn + T * qd,
          *v = k + T * kvd, *gate = v + T * kvd, *up = gate + T * I;
    int32_t *ids = (int32_t *)(up + T * I), *pos = ids + T;   /* (T) tokens, (T) positions */
    ddt_target_put_ids(be, tokens, T, 0, NULL, ids);

    ddt_target_embed(be, w16, t->embed_tokens, ids, T, H, x);
    int rc = 0;
    for (int64_t l = 0; l < c->layers && rc == 0; l++) {
        const ddt_target_layer *L = &t->layer[l];
        be->rmsnorm(be, x, L->input_layernorm, T, H, c->rms_norm_eps, u, NULL);
        ddt_target_linear(be, w16, 0, T, qd, H, u, L->q_proj, 0, q);
        ddt_target_linear(be, w16, 0, T, kvd, H, u, L->k_proj, 0, k);
        ddt_target_linear(be, w16, 0, T, kvd, H, u, L->v_proj, 0, v);
        if (c->qwen3) {   /* per-head RMSNorm before RoPE, in place (no backward here) */
            be->rmsnorm(be, q, L->q_norm, T * nh, d, c->rms_norm_eps, q, NULL);
            be->rmsnorm(be, k, L->k_norm, T * nkv, d, c->rms_norm_eps, k, NULL);
        }
        be->rope(be, q, pos, T, nh, d, c->rope_theta, 0);
        be->rope(be, k, pos, T, nkv, d, c->rope_theta, 0);
        ddk_attention_shape shape = { .S = T, .nh = nh, .nkv = nkv, .d = d };
        rc = be->causal_attention(be, &shape, q, k, v, attn);
        if (rc)
            break;
        ddt_target_linear(be, w16, 0, T, H, qd, attn, L->o_proj, 1, x);   /* residual */
        be->rmsnorm(be, x, L->post_attention_layernorm, T, H, c->rms_norm_eps, u, NULL);
        ddt_target_mlp(be, w16, 0, u, L->gate_proj, L->up_proj, L->down_proj, T, H, I, gate, up, x);
        ddt_target_tap(be, x, T, H, l, tap_ids, n_taps, features);
    }
    if (rc == 0 && final_hidden)
        be->rmsnorm(be, x, t->norm, T, H, c->rms_norm_eps, final_hidden, NULL);
    ddk_free(be->alloc, x, bytes);   /* (a GPU's allocator reuses it in stream order) */
    return rc;
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
    if (!has_target_ops(be, o && o->bf16))
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
