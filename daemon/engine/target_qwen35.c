/* target_qwen35.c: the Qwen3.5 / Qwen3.6 hybrid target (SPEC.md section 3.1): its tensor table
 * and loader. Not here yet: its forward and cache (the next step of issue 12), the dense
 * llama / qwen3 targets (target.c, whose table has no per-layer kinds).
 *
 * One table of tensors (names without the prefix, shapes, where each pointer goes, whether the
 * zero-centred `1 +` is folded in) drives the allocation and the loading. Every problem of the
 * checkpoint is collected before failing, so one error names every missing or mis-shaped tensor.
 * Tested by tests/test_qwen35.c.
 *
 * Legend: as target_qwen35.h.
 */
#include "target_qwen35.h"
#include "errors.h"
#include "safetensors.h"
#include "tensor_load.h"

#include <errno.h>
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
    float **slot;
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
        e->slot = slot_;                                                            \
    } while (0)
    ADD(&t->embed_tokens, 0, 2, c->vocab, H, 0, "embed_tokens.weight");
    for (int64_t i = 0; i < c->layers; i++) {
        ddt_qwen35_layer *L = &t->layer[i];
        const long long l = (long long)i;
        ADD(&L->input_layernorm, 1, 1, H, 0, 0, "layers.%lld.input_layernorm.weight", l);
        if (c->full_attention[i]) {
            ADD(&L->q_proj, 0, 2, 2 * nh * hd, H, 0, "layers.%lld.self_attn.q_proj.weight", l);
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

int ddt_qwen35_load(const char *dir, ddt_qwen35 *t, char *err, size_t err_len)
{
    memset(t, 0, sizeof *t);
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
    int64_t total = 0;
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
        total += q35_numel(e);
    }
    if (!rc && problems)
        rc = -EINVAL;
    if (!rc) {
        t->weight_bytes = (size_t)total * sizeof(float);
        t->weights = ddk_malloc(ddk_allocator_cpu(), t->weight_bytes);
        if (!t->weights)
            rc = ddt_fail(err, err_len, -ENOMEM, "no memory for the target's %lld weights (%.2f GB as float32)",
                          (long long)total, t->weight_bytes / 1e9);
    }
    int64_t offset = 0;
    for (int i = 0; !rc && i < count; i++) {
        float *w = *table[i].slot = t->weights + offset;
        const int64_t n = q35_numel(&table[i]);
        ddt_st_to_f32(found[i], w);
        for (int64_t k = 0; table[i].norm1p && k < n; k++)   /* RMSNorm1p: x / rms(x) * (1 + w) */
            w[k] += 1.0f;
        offset += n;
    }
    if (!rc && t->cfg.tie_word_embeddings)
        t->lm_head = t->embed_tokens;
    free(found);
    ddt_st_model_close(&model);
    free(table);
    if (rc)
        ddt_qwen35_free(t);
    return rc;
}

void ddt_qwen35_free(ddt_qwen35 *t)
{
    if (t->weights)
        ddk_free(ddk_allocator_cpu(), t->weights, t->weight_bytes);
    t->weights = NULL;
}
