/* target_dense.c: the frozen dense target (SPEC.md section 3, target_dense.h): loading Hugging
 * Face llama / qwen3 weights (any float dtype, converted to float32, or the matrices and
 * embedding to bf16) onto any backend, a seeded synthetic target, and the causal forward
 * (backend ops only) that yields tapped layer outputs and the final-normed hidden state; the
 * frozen head (embed_tokens, lm_head) of any target directory, the only part feature shards
 * need.
 *
 * One table of tensors (Hugging Face names, shapes, where each pointer goes) drives both the
 * loading and the synthetic initialisation, each tensor written through the staging buffer of
 * target_layers.c. Not here: what it shares with the Qwen3.5 hybrid target (target_layers.c:
 * the products, the MLP, the taps, the staged loading), its decoding cache
 * (target_dense_cache.c), its place behind the one target interface (target.c).
 * Tested by tests/oracle/features_torch_check.py, tests/engine/test_engine.c and tests/engine/data/test_source.c.
 *
 * Legend: T tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate.
 */
#include "target_dense.h"
#include "target_layers.h"
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

/* ------------------------------------------------------------------------------------------
 * Forward
 */

int ddt_target_has_ops(const ddk_backend *be, int bf16)
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
    if (!ddt_target_has_ops(be, w16))
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
