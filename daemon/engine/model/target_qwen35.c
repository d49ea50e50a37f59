/* target_qwen35.c: the Qwen3.5 / Qwen3.6 hybrid target (SPEC.md section 3.1): its tensor table
 * and loader, its forward (taps and final hidden state of one sequence, or of rows after a
 * cache), its decoding cache (SPEC.md 3.1 'Decoding with a cache': extend, verify, rollback)
 * and its place behind target.h's interface. Not here: the dense llama / qwen3 targets
 * (target_dense.c, whose table has no per-layer kinds), what both targets share
 * (target_layers.c).
 *
 * One table of tensors (names without the prefix, shapes, where each pointer goes, whether the
 * zero-centred `1 +` is folded in) drives the allocation (one block of the backend's allocator,
 * fp32 or the matrices bf16) and the loading, tensor by tensor through a host staging buffer. Every problem of the
 * checkpoint is collected before failing, so one error names every missing or mis-shaped tensor.
 * The forward mirrors target_dense.c's dense one and is backend ops only, so it runs on any backend
 * that has them (the CPU's and CUDA's): every product is ddt_target_linear (matmul, or
 * matmul_w16 on bf16 weights), every norm rmsnorm on the folded weights, the q / gate split
 * two products (q_proj's rows are split at load), l2norm, the v columns, beta and g, the output
 * gate, the cache's row copies and the conv window's advance their own ops (l2norm_heads,
 * copy_rows, delta_gates, sigmoid_mul, copy), attention causal_attention (with q_rows over the
 * cache's keys for a cached step), the DeltaNet core gated_delta. The host only runs control
 * flow, and on an fp32 CPU target the plain-C cached attention (q35_fast).
 * Tested by tests/engine/model/test_qwen35.c and tests/oracle/qwen35_features_check.py.
 *
 * Legend: as target_qwen35.h.
 */
#include "target_qwen35.h"
#include "ddk_rng.h"
#include "base/errors.h"
#include "target_layers.h"
#include "target_ops.h"
#include "safetensors.h"
#include "tensor_load.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * The tensor table
 */

typedef struct q35_tensor {
    char name[112];         /* without the prefix, except lm_head.weight (at the top) */
    int ndim;
    int64_t dims[3];
    int norm1p;             /* RMSNorm1p weight: stored as 1 + w */
    int top;                /* no prefix */
    int split;              /* q_proj: split into the query and the gate rows (its slot holds both) */
    void *slot;             /* float ** (vectors, conv1d) or void ** (matrices: ndim 2) */
} q35_tensor;

enum { Q35_PER_LAYER = 14, Q35_GLOBAL = 3 };   /* the most tensors one layer has (DeltaNet); embed, norm, head */

static int q35_table(ddt_qwen35 *t, q35_tensor *table)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, I = c->intermediate, hd = c->head_dim, nh = c->heads,
                  nkv = c->kv_heads, nv = c->value_heads, dv = c->value_head_dim,
                  Ck = c->key_heads * c->key_head_dim, Cv = nv * dv, Cc = 2 * Ck + Cv, K = c->conv_kernel;
    int n = 0;
#define ADD(slot_, norm1p_, ndim_, d0, d1, d2, ...)                                 \
    do {                                                                            \
        q35_tensor *e = &table[n++];                                                \
        snprintf(e->name, sizeof e->name, __VA_ARGS__);                             \
        e->ndim = ndim_;                                                            \
        e->dims[0] = d0, e->dims[1] = d1, e->dims[2] = d2;                          \
        e->norm1p = norm1p_;                                                        \
        e->top = 0;                                                                 \
        e->split = 0;                                                               \
        e->slot = slot_;                                                            \
    } while (0)
    ADD(&t->embed_tokens, 0, 2, c->vocab, H, 0, "embed_tokens.weight");
    for (int64_t i = 0; i < c->layers; i++) {
        ddt_qwen35_layer *L = &t->layer[i];
        const long long l = (long long)i;
        ADD(&L->input_layernorm, 1, 1, H, 0, 0, "layers.%lld.input_layernorm.weight", l);
        if (c->full_attention[i]) {
            ADD(&L->q_proj, 0, 2, 2 * nh * hd, H, 0, "layers.%lld.self_attn.q_proj.weight", l);
            table[n - 1].split = 1;
            ADD(&L->k_proj, 0, 2, nkv * hd, H, 0, "layers.%lld.self_attn.k_proj.weight", l);
            ADD(&L->v_proj, 0, 2, nkv * hd, H, 0, "layers.%lld.self_attn.v_proj.weight", l);
            ADD(&L->o_proj, 0, 2, H, nh * hd, 0, "layers.%lld.self_attn.o_proj.weight", l);
            ADD(&L->q_norm, 1, 1, hd, 0, 0, "layers.%lld.self_attn.q_norm.weight", l);
            ADD(&L->k_norm, 1, 1, hd, 0, 0, "layers.%lld.self_attn.k_norm.weight", l);
        } else {
            ADD(&L->in_proj_qkv, 0, 2, Cc, H, 0, "layers.%lld.linear_attn.in_proj_qkv.weight", l);
            ADD(&L->in_proj_z, 0, 2, Cv, H, 0, "layers.%lld.linear_attn.in_proj_z.weight", l);
            ADD(&L->in_proj_b, 0, 2, nv, H, 0, "layers.%lld.linear_attn.in_proj_b.weight", l);
            ADD(&L->in_proj_a, 0, 2, nv, H, 0, "layers.%lld.linear_attn.in_proj_a.weight", l);
            ADD(&L->conv1d, 0, 3, Cc, 1, K, "layers.%lld.linear_attn.conv1d.weight", l);
            ADD(&L->A_log, 0, 1, nv, 0, 0, "layers.%lld.linear_attn.A_log", l);
            ADD(&L->dt_bias, 0, 1, nv, 0, 0, "layers.%lld.linear_attn.dt_bias", l);
            ADD(&L->norm, 0, 1, dv, 0, 0, "layers.%lld.linear_attn.norm.weight", l);
            ADD(&L->out_proj, 0, 2, H, Cv, 0, "layers.%lld.linear_attn.out_proj.weight", l);
        }
        ADD(&L->post_attention_layernorm, 1, 1, H, 0, 0, "layers.%lld.post_attention_layernorm.weight", l);
        ADD(&L->gate_proj, 0, 2, I, H, 0, "layers.%lld.mlp.gate_proj.weight", l);
        ADD(&L->up_proj, 0, 2, I, H, 0, "layers.%lld.mlp.up_proj.weight", l);
        ADD(&L->down_proj, 0, 2, H, I, 0, "layers.%lld.mlp.down_proj.weight", l);
    }
    ADD(&t->norm, 1, 1, H, 0, 0, "norm.weight");
    if (!c->tie_word_embeddings) {
        ADD(&t->lm_head, 0, 2, c->vocab, H, 0, "lm_head.weight");
        table[n - 1].top = 1;
    }
#undef ADD
    return n;
}

static int64_t q35_numel(const q35_tensor *e)
{
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->dims[i];
    return n;
}

int64_t ddt_qwen35_param_count(const ddt_qwen35_config *c)
{
    ddt_qwen35 *t = calloc(1, sizeof *t);
    q35_tensor *table = calloc((size_t)(Q35_GLOBAL + Q35_PER_LAYER * c->layers), sizeof *table);
    int64_t total = t && table ? 0 : -ENOMEM;
    if (t && table) {
        t->cfg = *c;
        const int count = q35_table(t, table);
        for (int i = 0; i < count; i++)
            total += q35_numel(&table[i]);
    }
    free(table);
    free(t);
    return total;
}

/* ------------------------------------------------------------------------------------------
 * Loading
 */

/* Appends "; what" (or the first "what") to err: every problem of a checkpoint in one message */
__attribute__((format(printf, 4, 5)))
static void add_problem(char *err, size_t err_len, int *problems, const char *fmt, ...)
{
    size_t used = *problems ? strlen(err) : 0;
    if (*problems && used + 2 < err_len)
        used += (size_t)snprintf(err + used, err_len - used, "; ");
    if (used < err_len) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err + used, err_len - used, fmt, args);
        va_end(args);
    }
    (*problems)++;
}

/* the shard holding t, for errors */
static const char *file_of(const ddt_st_model *m, const ddt_st_tensor *t)
{
    for (int f = 0; f < m->file_count; f++)
        if (t >= m->files[f].tensors && t < m->files[f].tensors + m->files[f].count)
            return m->files[f].path;
    return "?";
}

/* Qwen3-Next's fused projection (q, k, v, z interleaved per key head): a different layout */
static int refuse_qwen3_next(const char *dir, const ddt_st_model *m, char *err, size_t err_len)
{
    for (int f = 0; f < m->file_count; f++)
        for (int k = 0; k < m->files[f].count; k++)
            if (strstr(m->files[f].tensors[k].name, "in_proj_qkvz"))
                return ddt_fail(err, err_len, -EINVAL, "%s: tensor '%s' is a Qwen3-Next layout, not "
                                "Qwen3.5's (in_proj_qkv and in_proj_z): refusing to guess its order",
                                m->files[f].path, m->files[f].tensors[k].name);
    (void)dir;
    return 0;
}

/* The weight block: tensors in the table's order, matrices (ndim 2) bf16 when t->bf16 */
static int q35_w16(const ddt_qwen35 *t, const q35_tensor *e)
{
    return t->bf16 && e->ndim == 2;
}

static void *q35_slot(const q35_tensor *e)
{
    return e->ndim == 2 ? *(void **)e->slot : (void *)*(float **)e->slot;
}

static size_t q35_block_bytes(const ddt_qwen35 *t, const q35_tensor *table, int count)
{
    size_t total = 0;
    for (int i = 0; i < count; i++)
        total += ddt_weight_slot_bytes(q35_numel(&table[i]), q35_w16(t, &table[i]), t->bf16);
    return total;
}

int64_t ddt_qwen35_weight_bytes(const ddt_qwen35_config *c, int bf16)
{
    ddt_qwen35 *t = calloc(1, sizeof *t);
    q35_tensor *table = calloc((size_t)(Q35_GLOBAL + Q35_PER_LAYER * c->layers), sizeof *table);
    int64_t total = t && table ? 0 : -ENOMEM;
    if (t && table) {
        t->cfg = *c, t->bf16 = bf16;
        total = (int64_t)q35_block_bytes(t, table, q35_table(t, table));
    }
    free(table);
    free(t);
    return total;
}

/* allocates the block on t->be, points every slot into it (q_gate after q_proj's query rows) */
static int q35_carve(ddt_qwen35 *t, q35_tensor *table, int count, char *err, size_t err_len)
{
    t->weight_bytes = q35_block_bytes(t, table, count);
    t->weights = ddk_malloc(t->be->alloc, t->weight_bytes);
    if (!t->weights)
        return ddt_fail(err, err_len, -ENOMEM, "no memory on %s for the target's weights (%.2f GB as %s)",
                        ddk_allocator_device(t->be->alloc), t->weight_bytes / 1e9, t->bf16 ? "bf16" : "float32");
    size_t offset = 0;
    for (int i = 0; i < count; i++) {
        const q35_tensor *e = &table[i];
        void *p = (char *)t->weights + offset;
        if (e->ndim == 2)
            *(void **)e->slot = p;
        else
            *(float **)e->slot = p;
        offset += ddt_weight_slot_bytes(q35_numel(e), q35_w16(t, e), t->bf16);
    }
    const int64_t half = t->cfg.heads * t->cfg.head_dim * t->cfg.hidden;   /* (nh hd, H) */
    for (int64_t l = 0; l < t->cfg.layers; l++)
        if (t->layer[l].q_proj)
            t->layer[l].q_gate = (char *)t->layer[l].q_proj + half * (t->bf16 ? 2 : 4);
    if (t->cfg.tie_word_embeddings)
        t->lm_head = t->embed_tokens;
    return 0;
}

static int64_t q35_largest(const q35_tensor *table, int count)
{
    int64_t n = 1;
    for (int i = 0; i < count; i++)
        n = q35_numel(&table[i]) > n ? q35_numel(&table[i]) : n;
    return n;
}

/* e as the stager writes it: (rows, cols) = (dims[0], the rest), q_proj in runs of hd rows */
static ddt_weight_src q35_src(const ddt_qwen35 *t, const q35_tensor *e)
{
    return (ddt_weight_src){ .rows = e->dims[0], .cols = q35_numel(e) / e->dims[0],
                             .split_rows = e->split ? t->cfg.head_dim : 0, .w16 = q35_w16(t, e) };
}

static void q35_place(ddt_qwen35 *t, const ddt_target_options *o)
{
    t->be = o && o->be ? o->be : ddk_backend_cpu();
    t->bf16 = o ? o->bf16 != 0 : 0;
    t->generic = o ? o->generic != 0 : 0;
}

int ddt_qwen35_load_with(const char *dir, const ddt_target_options *o, ddt_qwen35 *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
    q35_place(t, o);
    int rc = ddt_qwen35_config_load(dir, &t->cfg, err, err_len);
    if (rc)
        return rc;
    q35_tensor *table = calloc((size_t)(Q35_GLOBAL + Q35_PER_LAYER * t->cfg.layers), sizeof *table);
    if (!table)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the target's tensor table");
    ddt_st_model model;
    if ((rc = ddt_st_model_open(dir, &model, err, err_len))) {
        free(table);
        return rc;
    }
    rc = refuse_qwen3_next(dir, &model, err, err_len);
    /* the multimodal checkpoints' prefix, else the text-only one, whatever config.json nests */
    const char *prefix = ddt_st_model_find(&model, "model.language_model.embed_tokens.weight")
                             ? "model.language_model." : "model.";
    const int count = q35_table(t, table);
    const ddt_st_tensor **found = calloc((size_t)count, sizeof *found);
    if (!rc && !found)
        rc = ddt_fail(err, err_len, -ENOMEM, "no memory for the target's tensor table");
    int problems = 0;
    for (int i = 0; !rc && i < count; i++) {
        q35_tensor *e = &table[i];
        char name[160], why[512];
        snprintf(name, sizeof name, "%s%s", e->top ? "" : prefix, e->name);
        const ddt_st_tensor *st = ddt_st_model_find(&model, name);
        ddt_tensor_want want = { name, DDT_F32, e->ndim, e->dims };
        if (!st && e->top)
            add_problem(err, err_len, &problems, "%s: tensor '%s' is missing and config.json does not set "
                        "tie_word_embeddings: true", dir, name);
        else if (!st)
            add_problem(err, err_len, &problems, "%s: tensor '%s' is missing", dir, name);
        else if (ddt_tensor_check(st, file_of(&model, st), &want, why, sizeof why))
            add_problem(err, err_len, &problems, "%s", why);
        found[i] = st;
    }
    if (!rc && problems)
        rc = -EINVAL;
    if (!rc)
        rc = q35_carve(t, table, count, err, err_len);
    ddt_weight_stager stager = { 0 };
    if (!rc && ddt_weight_stager_init(&stager, t->be, q35_largest(table, count)))
        rc = ddt_fail(err, err_len, -ENOMEM, "no host memory to stage the target's tensors");
    for (int i = 0; !rc && i < count; i++) {
        ddt_weight_src src = q35_src(t, &table[i]);
        src.st = found[i];
        src.add = table[i].norm1p ? 1.0f : 0.0f;   /* RMSNorm1p: x / rms(x) * (1 + w) */
        ddt_weight_put(&stager, &src, q35_slot(&table[i]));
    }
    ddt_weight_stager_free(&stager);
    free(found);
    ddt_st_model_close(&model);
    free(table);
    if (rc)
        ddt_qwen35_free(t);
    return rc;
}

int ddt_qwen35_load(const char *dir, ddt_qwen35 *t, char *err, size_t err_len)
{
    return ddt_qwen35_load_with(dir, NULL, t, err, err_len);
}

/* Random weights of the table's shapes (benchmarks: no checkpoint): embeddings N(0, 1), matrices
 * and the conv N(0, 1/fan_in), norms 1 (already folded, and the DeltaNet output norm's plain 1),
 * A_log 0 and dt_bias 0 (g = -softplus(a)) */
int ddt_qwen35_synthetic_with(const ddt_qwen35_config *cfg, uint64_t seed, const ddt_target_options *o,
                              ddt_qwen35 *t)
{
    memset(t, 0, sizeof *t);
    q35_place(t, o);
    t->cfg = *cfg;
    q35_tensor *table = calloc((size_t)(Q35_GLOBAL + Q35_PER_LAYER * cfg->layers), sizeof *table);
    if (!table)
        return -ENOMEM;
    const int count = q35_table(t, table);
    char err[256];
    int rc = q35_carve(t, table, count, err, sizeof err);
    ddt_weight_stager stager = { 0 };
    if (!rc && ddt_weight_stager_init(&stager, t->be, q35_largest(table, count)))
        rc = -ENOMEM;
    for (int i = 0; !rc && i < count; i++) {
        const q35_tensor *e = &table[i];
        const int64_t fan_in = e->ndim == 3 ? e->dims[2] : e->ndim == 2 ? e->dims[1] : 0;
        const int vec = e->ndim == 1, embed = e->slot == (void *)&t->embed_tokens;
        ddt_weight_src src = q35_src(t, e);
        src.seed = seed * 0x100000001B3ull + (uint64_t)i;
        src.std = embed ? 1.0 : vec ? 0.0 : 1.0 / sqrt((double)fan_in);
        src.fill = e->norm1p || strstr(e->name, "linear_attn.norm.weight") ? 1.0f : 0.0f;
        ddt_weight_put(&stager, &src, q35_slot(e));
    }
    ddt_weight_stager_free(&stager);
    free(table);
    if (rc)
        ddt_qwen35_free(t);
    return rc;
}

int ddt_qwen35_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, ddt_qwen35 *t)
{
    return ddt_qwen35_synthetic_with(cfg, seed, NULL, t);
}

void ddt_qwen35_free(ddt_qwen35 *t)
{
    if (t->weights)
        ddk_free(t->be->alloc, t->weights, t->weight_bytes);
    t->weights = NULL;
}

/* ------------------------------------------------------------------------------------------
 * The forward
 */

enum { Q35_CHUNK = 64 };                        /* the DeltaNet core's chunk (SPEC.md 3.1) */
static const float Q35_L2NORM_EPS = 1e-6f;      /* SPEC.md 3.1: inside l2norm's sqrt, not rms_norm_eps */

/* 1 when be has every op this target's forward takes (w16: bf16 weights) */
static int q35_has_ops(const ddk_backend *be, int w16)
{
    return be->conv1d_silu && be->gated_rmsnorm && be->rope_partial && be->gated_delta && be->l2norm_heads &&
           be->sigmoid_mul && be->delta_gates && be->copy_rows && be->causal_attention &&
           (!w16 || (be->matmul_w16 && be->embedding_w16));
}

/* The cache of one sequence: one allocation, carved per layer. A verify block of B rows (a
 * chain, or a tree's nodes) keeps, per DeltaNet layer, its B pre-convolution qkv rows and the
 * state after each of its rows (a tree node's: after its root path), so a rollback to any
 * accepted count is two copies (a tree's path: its qkv rows gathered, its attention keys and
 * values moved to p0 ..); the attention rows past the accepted ones are simply overwritten
 * later (truncation). Per tree node, at the Qwen3.6-27B shape (48 DeltaNet layers, 48 value
 * heads of 128 x 128 fp32, Cc = 10,240): 48 x (786,432 + 10,240) floats = 153 MB, so a tree
 * of K = 32 nodes and its root holds 5.0 GB (the planner counts max_block = K + 1 of it). */
typedef struct q35_cache {
    const ddk_backend *be;                       /* the one it was opened on (rollback's) */
    int64_t max_len, max_block;
    float *conv[DDT_MAX_TARGET_LAYERS];          /* DeltaNet: (K-1, Cc) the last pre-conv qkv rows, oldest first */
    float *state[DDT_MAX_TARGET_LAYERS];         /* DeltaNet: (nv, dk, dv) after the committed positions */
    float *block_qkv[DDT_MAX_TARGET_LAYERS];     /* DeltaNet: (max_block, Cc) the verify block's qkv rows */
    float *block_state[DDT_MAX_TARGET_LAYERS];   /* DeltaNet: (max_block, nv, dk, dv) the state after each */
    float *keys[DDT_MAX_TARGET_LAYERS];          /* attention: (max_len, nkv hd) after k_norm and RoPE */
    float *values[DDT_MAX_TARGET_LAYERS];        /* attention: (max_len, nkv hd) */
    float *window;                               /* (K-1, Cc): a conv window's shift goes through it */
    float *block;
    size_t block_bytes;
} q35_cache;

/* How rows are fed: without a cache (a prefill of its own), committed to one, or pending in one */
typedef enum { Q35_NO_CACHE, Q35_COMMIT, Q35_PENDING } q35_mode;

/* The CPU fast path of an fp32 target: attn (n, nh, hd) for query rows q (n, nh, hd) at
 * positions p0 + i over keys / values (p0 + n, nkv, hd): row i sees positions 0 .. p0 + i.
 * w (p0 + n) scratch. */
static void cached_attention(const ddt_qwen35_config *c, const float *q, const float *keys, const float *values,
                             int64_t p0, int64_t n, float *w, float *attn)
{
    const int64_t nh = c->heads, nkv = c->kv_heads, hd = c->head_dim, kvd = nkv * hd, group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int64_t i = 0; i < n; i++)
        for (int64_t h = 0; h < nh; h++) {
            const float *qh = q + (i * nh + h) * hd, *kh = keys + (h / group) * hd, *vh = values + (h / group) * hd;
            float *out = attn + (i * nh + h) * hd, max = -INFINITY, sum = 0.0f;
            for (int64_t p = 0; p <= p0 + i; p++) {
                float s = 0.0f;
                for (int64_t e = 0; e < hd; e++)
                    s += qh[e] * kh[p * kvd + e];
                w[p] = s * scale;
                max = w[p] > max ? w[p] : max;
            }
            for (int64_t p = 0; p <= p0 + i; p++)
                sum += w[p] = expf(w[p] - max);
            memset(out, 0, (size_t)hd * sizeof(float));
            for (int64_t p = 0; p <= p0 + i; p++)
                for (int64_t e = 0; e < hd; e++)
                    out[e] += w[p] * vh[p * kvd + e];
            for (int64_t e = 0; e < hd; e++)
                out[e] /= sum;
        }
}

/* the CPU fast paths: an fp32 target on a CPU backend, not generic */
static int q35_fast(const ddk_backend *be, const ddt_qwen35 *t)
{
    return !t->bf16 && !t->generic && ddt_target_host_backend(be);
}

/* x (T, H) += the gated attention of u (T, H) at positions pos (p0 ..); with a cache, its keys
 * and values join the cached ones at p0 and the rows attend over all of them (causal_attention
 * with q_rows = T over p0 + T keys), or, for a tree (tree: its parents (T), be's memory), over
 * the cache and their ancestors (tree_attention). scratch: the forward's area. */
static int full_attention(const ddk_backend *be, const ddt_qwen35 *t, const ddt_qwen35_layer *L,
                          const float *u, const int32_t *pos, const int32_t *tree, int64_t T, q35_cache *cache,
                          int64_t l, int64_t p0, float *scratch, float *x)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, hd = c->head_dim, qd = nh * hd,
                  kvd = nkv * hd;
    const int w16 = t->bf16;
    float *q = scratch, *gate = q + T * qd, *k = gate + T * qd, *v = k + T * kvd,
          *attn = v + T * kvd;   /* (T, nh, hd) x 2; (T, nkv, hd) x 2; (T, nh, hd) */
    ddt_target_linear(be, w16, 0, T, qd, H, u, L->q_proj, 0, q);   /* the split q_proj: queries, */
    ddt_target_linear(be, w16, 0, T, qd, H, u, L->q_gate, 0, gate);   /* then gates, per head */
    ddt_target_linear(be, w16, 0, T, kvd, H, u, L->k_proj, 0, k);
    ddt_target_linear(be, w16, 0, T, kvd, H, u, L->v_proj, 0, v);
    be->rmsnorm(be, q, L->q_norm, T * nh, hd, c->rms_norm_eps, q, NULL);    /* before RoPE */
    be->rmsnorm(be, k, L->k_norm, T * nkv, hd, c->rms_norm_eps, k, NULL);
    be->rope_partial(be, q, pos, T, nh, hd, c->rotary_dim, c->rope_theta);
    be->rope_partial(be, k, pos, T, nkv, hd, c->rotary_dim, c->rope_theta);
    int rc = 0;
    if (cache) {
        be->copy(be, cache->keys[l] + p0 * kvd, k, (size_t)(T * kvd) * sizeof(float));
        be->copy(be, cache->values[l] + p0 * kvd, v, (size_t)(T * kvd) * sizeof(float));
        if (tree) {   /* a tree's nodes see the cache and their own ancestors */
            ddk_attention_shape shape = { .S = p0 + T, .nh = nh, .nkv = nkv, .d = hd, .q_rows = T };
            rc = be->tree_attention(be, &shape, q, cache->keys[l], cache->values[l], tree, attn);
        } else if (q35_fast(be, t)) {
            cached_attention(c, q, cache->keys[l], cache->values[l], p0, T, attn + T * qd, attn);
        } else {
            ddk_attention_shape shape = { .S = p0 + T, .nh = nh, .nkv = nkv, .d = hd, .q_rows = T };
            rc = be->causal_attention(be, &shape, q, cache->keys[l], cache->values[l], attn);
        }
    } else {
        ddk_attention_shape shape = { .S = T, .nh = nh, .nkv = nkv, .d = hd };
        rc = be->causal_attention(be, &shape, q, k, v, attn);
    }
    if (rc)
        return rc;
    be->sigmoid_mul(be, attn, gate, T * qd);
    ddt_target_linear(be, w16, 0, T, H, qd, attn, L->o_proj, 1, x);   /* residual */
    return 0;
}

/* window (K-1, Cc) = the last K-1 rows of [window; rows (n, Cc)], backend copies; a shift of the
 * window within itself goes through tmp (K-1, Cc) (the regions would overlap) */
static void conv_window_advance(const ddk_backend *be, float *window, const float *rows, int64_t n, int64_t K,
                                int64_t Cc, float *tmp)
{
    const int64_t w = K - 1;
    if (n >= w) {
        be->copy(be, window, rows + (n - w) * Cc, (size_t)(w * Cc) * sizeof(float));
        return;
    }
    be->copy(be, tmp, window + n * Cc, (size_t)((w - n) * Cc) * sizeof(float));
    be->copy(be, window, tmp, (size_t)((w - n) * Cc) * sizeof(float));
    be->copy(be, window + (w - n) * Cc, rows, (size_t)(n * Cc) * sizeof(float));
}

/* window (K-1, Cc) = the K-1 pre-conv qkv rows before tree node r on its root path, oldest
 * first: its ancestors' rows of qkv (T, Cc) nearest last, then, above the root, the committed
 * window's newest rows; backend copies */
static void tree_window(const ddk_backend *be, const float *committed, const float *qkv, const int32_t *parents,
                        int64_t r, int64_t K, int64_t Cc, float *window)
{
    const size_t row = (size_t)Cc * sizeof(float);
    int64_t slot = K - 2, at = parents[r];
    for (; slot >= 0 && at >= 0; slot--, at = parents[at])
        be->copy(be, window + slot * Cc, qkv + at * Cc, row);
    if (slot >= 0)   /* the committed window's newest slot + 1 rows */
        be->copy(be, window, committed + (K - 2 - slot) * Cc, (size_t)(slot + 1) * row);
}

/* x (T, H) += the Gated DeltaNet of u (T, H). Without a cache: from a zero state, the core
 * chunked. Committed to one: from its conv window and state, which advance (chunked for a
 * prefill, the recurrence for a decode step). Pending: the recurrence token by token from a
 * copy of its state (a tree's node from its parent's: parents (T), host memory), each node's
 * state and the qkv rows kept for rollback. scratch: the forward's area. */
static int deltanet(const ddk_backend *be, const ddt_qwen35 *t, const ddt_qwen35_layer *L, const float *u,
                    int64_t T, q35_cache *cache, q35_mode mode, const int32_t *parents, int64_t l, float *scratch,
                    float *x)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, nk = c->key_heads, nv = c->value_heads, dk = c->key_head_dim,
                  dv = c->value_head_dim, Ck = nk * dk, Cv = nv * dv, Cc = 2 * Ck + Cv, K = c->conv_kernel;
    const int w16 = t->bf16;
    float *qkv = scratch, *act = qkv + T * Cc, *qh = act + T * Cc, *kh = qh + T * Ck, *v = kh + T * Ck,
          *z = v + T * Cv, *o = z + T * Cv, *beta = o + T * Cv, *g = beta + T * nv, *state = g + T * nv;
    /* (T, Cc) x 2; (T, nk, dk) x 2; (T, nv, dv) x 3; (T, nv) x 2; (nv, dk, dv) */
    ddt_target_linear(be, w16, 0, T, Cc, H, u, L->in_proj_qkv, 0, qkv);
    ddt_target_linear(be, w16, 0, T, Cv, H, u, L->in_proj_z, 0, z);
    ddt_target_linear(be, w16, 0, T, nv, H, u, L->in_proj_b, 0, beta);
    ddt_target_linear(be, w16, 0, T, nv, H, u, L->in_proj_a, 0, g);
    if (parents)   /* a tree: each node's window is its own path's */
        for (int64_t r = 0; r < T; r++) {
            tree_window(be, cache->conv[l], qkv, parents, r, K, Cc, cache->window);
            be->conv1d_silu(be, qkv + r * Cc, L->conv1d, cache->window, 1, Cc, K, act + r * Cc);
        }
    else
        be->conv1d_silu(be, qkv, L->conv1d, cache ? cache->conv[l] : NULL, T, Cc, K, act);   /* NULL: zero before t = 0 */
    if (mode == Q35_COMMIT)
        conv_window_advance(be, cache->conv[l], qkv, T, K, Cc, cache->window);
    else if (mode == Q35_PENDING)
        be->copy(be, cache->block_qkv[l], qkv, (size_t)(T * Cc) * sizeof(float));
    be->l2norm_heads(be, act, Cc, T, nk, dk, 1.0f / sqrtf((float)dk), Q35_L2NORM_EPS, qh);
    be->l2norm_heads(be, act + Ck, Cc, T, nk, dk, 1.0f, Q35_L2NORM_EPS, kh);
    be->copy_rows(be, v, Cv, act + 2 * Ck, Cc, T, Cv);
    be->delta_gates(be, beta, g, L->A_log, L->dt_bias, T, nv, beta, g);   /* in place; log decay <= 0 */
    const int64_t S = nv * dk * dv;
    int rc = 0;
    if (mode == Q35_PENDING) {
        ddk_delta_shape shape = { .T = 1, .nk = nk, .nv = nv, .dk = dk, .dv = dv, .chunk = 0 };
        for (int64_t r = 0; r < T && rc == 0; r++) {
            const int64_t from = parents ? parents[r] : r - 1;   /* the state after its parent */
            if (r == 0 || from != r - 1)
                be->copy(be, state, from < 0 ? cache->state[l] : cache->block_state[l] + from * S,
                         (size_t)S * sizeof(float));
            rc = be->gated_delta(be, &shape, qh + r * Ck, kh + r * Ck, v + r * Cv, beta + r * nv, g + r * nv, state,
                                 o + r * Cv);
            be->copy(be, cache->block_state[l] + r * S, state, (size_t)S * sizeof(float));
        }
    } else {
        if (mode == Q35_NO_CACHE)
            be->zero(be, state, (size_t)S * sizeof(float));
        ddk_delta_shape shape = { .T = T, .nk = nk, .nv = nv, .dk = dk, .dv = dv, .chunk = T > 1 ? Q35_CHUNK : 0 };
        rc = be->gated_delta(be, &shape, qh, kh, v, beta, g, mode == Q35_COMMIT ? cache->state[l] : state, o);
    }
    if (rc)
        return rc;
    be->gated_rmsnorm(be, o, z, L->norm, T * nv, dv, c->rms_norm_eps, o);
    ddt_target_linear(be, w16, 0, T, H, Cv, o, L->out_proj, 1, x);   /* residual */
    return 0;
}

/* a prefill (p0 = 0) starts from an empty conv window and a zero state */
static void q35_cache_start(const ddk_backend *be, const ddt_qwen35 *t, q35_cache *q)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t Cc = 2 * c->key_heads * c->key_head_dim + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim;
    for (int64_t l = 0; l < c->layers; l++)
        if (!c->full_attention[l])
            be->zero(be, q->conv[l], (size_t)((c->conv_kernel - 1) * Cc + S) * sizeof(float));   /* conv, state */
}

/* floats of the area the mixer and the MLP take in turn: the largest of the full attention's
 * (with the fast cached attention's weights (p0 + T)), the DeltaNet's (its state included) and
 * the MLP's (gate, up (T, I)) */
static int64_t rows_area(const ddt_qwen35_config *c, int64_t p0, int64_t T)
{
    const int64_t I = c->intermediate, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  nv = c->value_heads, Ck = c->key_heads * c->key_head_dim, Cv = nv * c->value_head_dim,
                  Cc = 2 * Ck + Cv;
    const int64_t full = T * (3 * qd + 2 * kvd) + p0 + T, delta = T * (2 * Cc + 2 * Ck + 3 * Cv + 2 * nv) +
                         nv * c->key_head_dim * c->value_head_dim, mlp = 2 * T * I;
    return full > delta ? (full > mlp ? full : mlp) : (delta > mlp ? delta : mlp);
}

int64_t ddt_qwen35_rows_bytes(const ddt_qwen35_config *c, int64_t p0, int64_t T)
{
    /* x, u (T, H), the area, tokens, positions and a tree's parents (T) */
    return (2 * T * c->hidden + rows_area(c, p0, T)) * (int64_t)sizeof(float) + 3 * T * (int64_t)sizeof(int32_t);
}

/* T rows at positions p0 .. p0+T-1, fed as mode says (p0 = 0 without a cache), or a pending
 * tree's (parents (T), host memory: positions p0 + depth); the outputs as ddt_qwen35_forward's */
static int q35_rows(const ddk_backend *be, const ddt_qwen35 *t, q35_cache *cache, q35_mode mode, int64_t p0,
                    const int32_t *tokens, int64_t T, const int32_t *parents, const int32_t *tap_ids, int n_taps,
                    float *features, float *final_hidden)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, I = c->intermediate;
    for (int i = 0; i < n_taps; i++)
        if (tap_ids[i] < 0 || tap_ids[i] >= c->layers)
            return -EINVAL;
    if (!q35_has_ops(be, t->bf16))
        return -ENOTSUP;

    const int64_t area = rows_area(c, p0, T);
    const size_t bytes = (size_t)ddt_qwen35_rows_bytes(c, p0, T);
    float *x = ddk_malloc(be->alloc, bytes);
    if (!x)
        return -ENOMEM;
    float *u = x + T * H, *scratch = u + T * H, *gate = scratch, *up = gate + T * I;
    int32_t *ids = (int32_t *)(scratch + area), *pos = ids + T;   /* (T) tokens, (T) positions */
    const int32_t *tree = parents ? ids + 2 * T : NULL;          /* (T) parents, be's memory */
    ddt_target_put_ids(be, tokens, T, p0, parents, ids);

    if (cache && p0 == 0)
        q35_cache_start(be, t, cache);
    ddt_target_embed(be, t->bf16, t->embed_tokens, ids, T, H, x);
    int rc = 0;
    for (int64_t l = 0; l < c->layers && rc == 0; l++) {
        const ddt_qwen35_layer *L = &t->layer[l];
        be->rmsnorm(be, x, L->input_layernorm, T, H, c->rms_norm_eps, u, NULL);
        rc = c->full_attention[l] ? full_attention(be, t, L, u, pos, tree, T, cache, l, p0, scratch, x)
                                  : deltanet(be, t, L, u, T, cache, mode, parents, l, scratch, x);
        if (rc)
            break;
        be->rmsnorm(be, x, L->post_attention_layernorm, T, H, c->rms_norm_eps, u, NULL);
        ddt_target_mlp(be, t->bf16, 0, u, L->gate_proj, L->up_proj, L->down_proj, T, H, I, gate, up, x);
        ddt_target_tap(be, x, T, H, l, tap_ids, n_taps, features);
    }
    if (rc == 0 && final_hidden)
        be->rmsnorm(be, x, t->norm, T, H, c->rms_norm_eps, final_hidden, NULL);
    ddk_free(be->alloc, x, bytes);
    return rc;
}

int ddt_qwen35_forward(const ddk_backend *be, const ddt_qwen35 *t, const int32_t *tokens, int64_t T,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden)
{
    return q35_rows(be, t, NULL, Q35_NO_CACHE, 0, tokens, T, NULL, tap_ids, n_taps, features, final_hidden);
}

/* ------------------------------------------------------------------------------------------
 * The cache
 */

/* floats of one layer's cache: a full-attention layer's keys and values (max_len, nkv hd) each;
 * a DeltaNet layer's conv window (K-1, Cc) and state (nv, dk, dv), and a verify block's rows
 * (max_block, Cc) and states (max_block, nv, dk, dv) to roll back to */
static int64_t cache_layer_floats(const ddt_qwen35_config *c, int full_attention, int64_t max_len,
                                  int64_t max_block)
{
    const int64_t Cc = 2 * c->key_heads * c->key_head_dim + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim;
    return full_attention ? 2 * max_len * c->kv_heads * c->head_dim
                          : (c->conv_kernel - 1) * Cc + S + max_block * (Cc + S);
}

int64_t ddt_qwen35_cache_bytes(const ddt_qwen35_config *c, int64_t max_len, int64_t max_block)
{
    /* the layers', then one window (K-1, Cc) the conv windows shift through */
    int64_t floats = (c->conv_kernel - 1) * (2 * c->key_heads * c->key_head_dim +
                                             c->value_heads * c->value_head_dim);
    for (int64_t l = 0; l < c->layers; l++)
        floats += cache_layer_floats(c, c->full_attention[l], max_len, max_block);
    return floats * (int64_t)sizeof(float);
}

static int q35_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                          void **out)
{
    const ddt_qwen35 *t = m->impl;
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t Ck = c->key_heads * c->key_head_dim, Cc = 2 * Ck + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim, kvd = c->kv_heads * c->head_dim,
                  delta = cache_layer_floats(c, 0, max_len, max_block), full = cache_layer_floats(c, 1, max_len, max_block);
    q35_cache *q = calloc(1, sizeof *q);
    if (!q)
        return -ENOMEM;
    q->block_bytes = (size_t)ddt_qwen35_cache_bytes(c, max_len, max_block);
    q->block = ddk_malloc(be->alloc, q->block_bytes);
    if (!q->block) {
        free(q);
        return -ENOMEM;
    }
    float *p = q->block;
    for (int64_t l = 0; l < c->layers; l++)
        if (c->full_attention[l]) {
            q->keys[l] = p, q->values[l] = p + max_len * kvd;
            p += full;
        } else {
            q->conv[l] = p, q->state[l] = p + (c->conv_kernel - 1) * Cc;
            q->block_qkv[l] = q->state[l] + S, q->block_state[l] = q->block_qkv[l] + max_block * Cc;
            p += delta;
        }
    q->window = p;
    q->be = be, q->max_len = max_len, q->max_block = max_block;
    *out = q;
    return 0;
}

static void q35_cache_close(const ddk_backend *be, const ddt_target_model *m, void *cache)
{
    (void)m;
    q35_cache *q = cache;
    ddk_free(be->alloc, q->block, q->block_bytes);
    free(q);
}

static int q35_extend(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                      const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps, float *features,
                      float *final_hidden)
{
    return q35_rows(be, m->impl, cache, Q35_COMMIT, p0, tokens, n, NULL, tap_ids, n_taps, features, final_hidden);
}

static int q35_verify(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                      const int32_t *tokens, int64_t n, const int32_t *parents, const int32_t *tap_ids, int n_taps,
                      float *features, float *final_hidden)
{
    if (n > ((q35_cache *)cache)->max_block)
        return -EINVAL;
    return q35_rows(be, m->impl, cache, Q35_PENDING, p0, tokens, n, parents, tap_ids, n_taps, features,
                    final_hidden);
}

/* the state after the last accepted node, the window advanced over the accepted qkv rows (a
 * tree's path: its rows gathered first, in place), the attention layers' keys and values of a
 * tree's path moved to p0 ..: copies on the cache's backend */
static void q35_rollback(const ddt_target_model *m, void *cache, int64_t p0, const int32_t *path, int64_t accepted)
{
    const ddt_qwen35_config *c = &((const ddt_qwen35 *)m->impl)->cfg;
    q35_cache *q = cache;
    const ddk_backend *be = q->be;
    const int64_t Cc = 2 * c->key_heads * c->key_head_dim + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim, kvd = c->kv_heads * c->head_dim;
    for (int64_t l = 0; accepted > 0 && l < c->layers; l++)
        if (c->full_attention[l]) {
            if (path)
                ddt_target_kv_compact(be, q->keys[l], q->values[l], kvd, p0, path, accepted);
        } else {
            const int64_t last = path ? path[accepted - 1] : accepted - 1;
            be->copy(be, q->state[l], q->block_state[l] + last * S, (size_t)S * sizeof(float));
            for (int64_t k = 0; path && k < accepted; k++)   /* path[k] >= k: ascending is safe */
                if (path[k] != k)
                    be->copy(be, q->block_qkv[l] + k * Cc, q->block_qkv[l] + path[k] * Cc, (size_t)Cc * sizeof(float));
            conv_window_advance(be, q->conv[l], q->block_qkv[l], accepted, c->conv_kernel, Cc, q->window);
        }
}

/* ------------------------------------------------------------------------------------------
 * Behind target.h's interface
 */

static int q35_prefill(const ddk_backend *be, const ddt_target_model *m, const int32_t *tokens, int64_t T,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden)
{
    return ddt_qwen35_forward(be, m->impl, tokens, T, tap_ids, n_taps, features, final_hidden);
}

static void q35_free(ddt_target_model *m)
{
    ddt_qwen35_free(m->impl);
    free(m->impl);
}

static const ddt_target_ops q35_ops = {
    .name = "qwen3_5",
    .prefill = q35_prefill,
    .free = q35_free,
    .cache_open = q35_cache_open,
    .cache_close = q35_cache_close,
    .extend = q35_extend,
    .verify = q35_verify,
    .rollback = q35_rollback,
};

/* m over t (heap, loaded), which m then owns */
static void q35_model(ddt_qwen35 *t, ddt_target_model *m)
{
    const int fast = q35_fast(t->be, t);
    *m = (ddt_target_model){ &q35_ops, "qwen3_5", t->cfg.hidden, t->cfg.vocab, t->cfg.layers,
                             t->cfg.tie_word_embeddings, fast ? t->embed_tokens : NULL,
                             fast ? t->lm_head : NULL, t, t->be, t->bf16, fast, t->embed_tokens, t->lm_head };
}

/* what both openers share first: o's backend checked, the target's struct allocated (*t) */
static int q35_open_begin(const ddt_target_options *o, ddt_target_model *m, ddt_qwen35 **t, char *err,
                          size_t err_len)
{
    memset(m, 0, sizeof *m);
    const ddk_backend *be = o && o->be ? o->be : ddk_backend_cpu();
    if (!q35_has_ops(be, o && o->bf16))
        return ddt_fail(err, err_len, -ENOTSUP, "the %s backend lacks an op the qwen3_5 target needs", be->name);
    if (!(*t = malloc(sizeof **t)))
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the target");
    return 0;
}

/* ... and last: t behind the interface once its loader succeeded (rc 0), else freed */
static int q35_open_end(ddt_qwen35 *t, ddt_target_model *m, int rc)
{
    if (rc)
        free(t);
    else
        q35_model(t, m);
    return rc;
}

int ddt_qwen35_open_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, const ddt_target_options *o,
                              ddt_target_model *m, char *err, size_t err_len)
{
    ddt_qwen35 *t;
    int rc = q35_open_begin(o, m, &t, err, err_len);
    if (rc)
        return rc;
    if ((rc = ddt_qwen35_synthetic_with(cfg, seed, o, t)))
        ddt_fail(err, err_len, rc, "a synthetic qwen3_5 target: %s", strerror(-rc));
    return q35_open_end(t, m, rc);
}

int ddt_qwen35_open_with(const char *dir, const ddt_target_options *o, ddt_target_model *m, char *err,
                         size_t err_len)
{
    ddt_qwen35 *t;
    int rc = q35_open_begin(o, m, &t, err, err_len);
    return rc ? rc : q35_open_end(t, m, ddt_qwen35_load_with(dir, o, t, err, err_len));
}

int ddt_qwen35_open(const char *dir, ddt_target_model *m, char *err, size_t err_len)
{
    return ddt_qwen35_open_with(dir, NULL, m, err, err_len);
}
