/* target_qwen35.c: the Qwen3.5 / Qwen3.6 hybrid target (SPEC.md section 3.1): its tensor table
 * and loader, its forward (taps and final hidden state of one sequence, or of rows after a
 * cache), its decoding cache (SPEC.md 3.1 'Decoding with a cache': extend, verify, rollback)
 * and its place behind target.h's interface. Not here: the dense llama / qwen3 targets
 * (target.c, whose table has no per-layer kinds).
 *
 * One table of tensors (names without the prefix, shapes, where each pointer goes, whether the
 * zero-centred `1 +` is folded in) drives the allocation and the loading. Every problem of the
 * checkpoint is collected before failing, so one error names every missing or mis-shaped tensor.
 * The forward mirrors target.c's dense one: every product is the backend's matmul, every norm
 * its rmsnorm on the folded weights, attention its causal_attention, the DeltaNet core its
 * gated_delta; the few element-wise steps SPEC.md 3.1 adds (the q / gate split, the sigmoid
 * gate, l2norm, beta and g) are host loops, as the dense forward's positions are: the CPU
 * backend's memory is the host's (a GPU path needs them as ops).
 * Tested by tests/test_qwen35.c and tests/qwen35_features_check.py.
 *
 * Legend: as target_qwen35.h.
 */
#include "target_qwen35.h"
#include "ddk_rng.h"
#include "errors.h"
#include "target.h"
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

/* Random weights of the table's shapes (benchmarks: no checkpoint): embeddings N(0, 1), matrices
 * and the conv N(0, 1/fan_in), norms 1 (already folded), A_log 0 and dt_bias 0 (g = -softplus(a)) */
int ddt_qwen35_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, ddt_qwen35 *t)
{
    memset(t, 0, sizeof *t);
    t->cfg = *cfg;
    q35_tensor *table = calloc((size_t)(Q35_GLOBAL + Q35_PER_LAYER * cfg->layers), sizeof *table);
    if (!table)
        return -ENOMEM;
    const int count = q35_table(t, table);
    int64_t total = 0;
    for (int i = 0; i < count; i++)
        total += q35_numel(&table[i]);
    t->weight_bytes = (size_t)total * sizeof(float);
    t->weights = ddk_malloc(ddk_allocator_cpu(), t->weight_bytes);
    if (!t->weights) {
        free(table);
        return -ENOMEM;
    }
    float *w = t->weights;
    for (int i = 0; i < count; i++) {
        const q35_tensor *e = &table[i];
        const int64_t n = q35_numel(e), fan_in = e->ndim == 3 ? e->dims[2] : e->ndim == 2 ? e->dims[1] : 0;
        const int vec = e->ndim == 1, embed = e->slot == &t->embed_tokens;
        const double std = embed ? 1.0 : vec ? 0.0 : 1.0 / sqrt((double)fan_in);
        uint64_t s = seed * 0x100000001B3ull + (uint64_t)i;
        *e->slot = w;
        for (int64_t k = 0; k < n; k++)
            w[k] = vec ? (e->norm1p ? 1.0f : 0.0f) : (float)(std * ddk_rng_normal(&s));
        w += n;
    }
    for (int64_t l = 0; l < cfg->layers; l++)   /* the DeltaNet output norms (plain w): 1 */
        if (t->layer[l].norm)
            for (int64_t k = 0; k < cfg->value_head_dim; k++)
                t->layer[l].norm[k] = 1.0f;
    if (cfg->tie_word_embeddings)
        t->lm_head = t->embed_tokens;
    free(table);
    return 0;
}

void ddt_qwen35_free(ddt_qwen35 *t)
{
    if (t->weights)
        ddk_free(ddk_allocator_cpu(), t->weights, t->weight_bytes);
    t->weights = NULL;
}

/* ------------------------------------------------------------------------------------------
 * The forward
 */

enum { Q35_CHUNK = 64 };                        /* the DeltaNet core's chunk (SPEC.md 3.1) */
static const float Q35_L2NORM_EPS = 1e-6f;      /* SPEC.md 3.1: inside l2norm's sqrt, not rms_norm_eps */
static const float Q35_SOFTPLUS_LINEAR = 20.0f; /* softplus(x) = x above it (torch's threshold) */

static float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* dst (T, heads, d) = l2norm(src's rows) * scale, src (T, ld) holding `heads` heads of d from col 0 */
static void l2norm_heads(const float *src, int64_t ld, int64_t T, int64_t heads, int64_t d, float scale,
                         float *dst)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + t * ld + h * d;
            float *y = dst + (t * heads + h) * d, ss = 0.0f;
            for (int64_t i = 0; i < d; i++)
                ss += x[i] * x[i];
            const float f = scale / sqrtf(ss + Q35_L2NORM_EPS);
            for (int64_t i = 0; i < d; i++)
                y[i] = x[i] * f;
        }
}

/* The cache of one sequence: one allocation, carved per layer. A verify block of B rows keeps,
 * per DeltaNet layer, its B pre-convolution qkv rows and the state after each of its positions,
 * so a rollback to any accepted count is two copies; the attention rows past the accepted ones
 * are simply overwritten later (truncation). */
typedef struct q35_cache {
    int64_t max_len, max_block;
    float *conv[DDT_MAX_TARGET_LAYERS];          /* DeltaNet: (K-1, Cc) the last pre-conv qkv rows, oldest first */
    float *state[DDT_MAX_TARGET_LAYERS];         /* DeltaNet: (nv, dk, dv) after the committed positions */
    float *block_qkv[DDT_MAX_TARGET_LAYERS];     /* DeltaNet: (max_block, Cc) the verify block's qkv rows */
    float *block_state[DDT_MAX_TARGET_LAYERS];   /* DeltaNet: (max_block, nv, dk, dv) the state after each */
    float *keys[DDT_MAX_TARGET_LAYERS];          /* attention: (max_len, nkv hd) after k_norm and RoPE */
    float *values[DDT_MAX_TARGET_LAYERS];        /* attention: (max_len, nkv hd) */
    float *block;
    size_t block_bytes;
} q35_cache;

/* How rows are fed: without a cache (a prefill of its own), committed to one, or pending in one */
typedef enum { Q35_NO_CACHE, Q35_COMMIT, Q35_PENDING } q35_mode;

/* attn (n, nh, hd) for query rows q (n, nh, hd) at positions p0 + i over keys / values
 * (p0 + n, nkv, hd): row i sees positions 0 .. p0 + i. w (p0 + n) scratch. */
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

/* x (T, H) += the gated attention of u (T, H) at positions pos (p0 ..); with a cache, its keys
 * and values join the cached ones at p0 and the rows attend over all of them. scratch: the
 * forward's area. */
static int full_attention(const ddk_backend *be, const ddt_qwen35 *t, const ddt_qwen35_layer *L,
                          const float *u, const int32_t *pos, int64_t T, q35_cache *cache, int64_t l, int64_t p0,
                          float *scratch, float *x)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, hd = c->head_dim, qd = nh * hd,
                  kvd = nkv * hd;
    float *G = scratch, *q = G + T * 2 * qd, *gate = q + T * qd, *k = gate + T * qd, *v = k + T * kvd,
          *attn = v + T * kvd;   /* (T, nh, 2hd); (T, nh, hd) x 2; (T, nkv, hd) x 2; (T, nh, hd) */
    be->matmul(be, 0, 1, T, 2 * qd, H, 1.0f, u, H, L->q_proj, H, 0.0f, G, 2 * qd);
    be->matmul(be, 0, 1, T, kvd, H, 1.0f, u, H, L->k_proj, H, 0.0f, k, kvd);
    be->matmul(be, 0, 1, T, kvd, H, 1.0f, u, H, L->v_proj, H, 0.0f, v, kvd);
    for (int64_t r = 0; r < T * nh; r++) {   /* per head: hd query dims, then hd gate dims */
        memcpy(q + r * hd, G + r * 2 * hd, (size_t)hd * sizeof(float));
        memcpy(gate + r * hd, G + r * 2 * hd + hd, (size_t)hd * sizeof(float));
    }
    be->rmsnorm(be, q, L->q_norm, T * nh, hd, c->rms_norm_eps, q, NULL);    /* before RoPE */
    be->rmsnorm(be, k, L->k_norm, T * nkv, hd, c->rms_norm_eps, k, NULL);
    be->rope_partial(be, q, pos, T, nh, hd, c->rotary_dim, c->rope_theta);
    be->rope_partial(be, k, pos, T, nkv, hd, c->rotary_dim, c->rope_theta);
    if (cache) {
        memcpy(cache->keys[l] + p0 * kvd, k, (size_t)(T * kvd) * sizeof(float));
        memcpy(cache->values[l] + p0 * kvd, v, (size_t)(T * kvd) * sizeof(float));
        cached_attention(c, q, cache->keys[l], cache->values[l], p0, T, attn + T * qd, attn);
    } else {
        ddk_attention_shape shape = { .S = T, .nh = nh, .nkv = nkv, .d = hd };
        int rc = be->causal_attention(be, &shape, q, k, v, attn);
        if (rc)
            return rc;
    }
    for (int64_t i = 0; i < T * qd; i++)
        attn[i] *= sigmoidf(gate[i]);
    be->matmul(be, 0, 1, T, H, qd, 1.0f, attn, qd, L->o_proj, qd, 1.0f, x, H);   /* residual */
    return 0;
}

/* window (K-1, Cc) = the last K-1 rows of [window; rows (n, Cc)] */
static void conv_window_advance(float *window, const float *rows, int64_t n, int64_t K, int64_t Cc)
{
    const int64_t w = K - 1;
    if (n >= w) {
        memcpy(window, rows + (n - w) * Cc, (size_t)(w * Cc) * sizeof(float));
        return;
    }
    memmove(window, window + n * Cc, (size_t)((w - n) * Cc) * sizeof(float));
    memcpy(window + (w - n) * Cc, rows, (size_t)(n * Cc) * sizeof(float));
}

/* x (T, H) += the Gated DeltaNet of u (T, H). Without a cache: from a zero state, the core
 * chunked. Committed to one: from its conv window and state, which advance (chunked for a
 * prefill, the recurrence for a decode step). Pending: the recurrence token by token from a
 * copy of its state, each position's state and the qkv rows kept for rollback. scratch: the
 * forward's area. */
static int deltanet(const ddk_backend *be, const ddt_qwen35 *t, const ddt_qwen35_layer *L, const float *u,
                    int64_t T, q35_cache *cache, q35_mode mode, int64_t l, float *scratch, float *x)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, nk = c->key_heads, nv = c->value_heads, dk = c->key_head_dim,
                  dv = c->value_head_dim, Ck = nk * dk, Cv = nv * dv, Cc = 2 * Ck + Cv, K = c->conv_kernel;
    float *qkv = scratch, *act = qkv + T * Cc, *qh = act + T * Cc, *kh = qh + T * Ck, *v = kh + T * Ck,
          *z = v + T * Cv, *o = z + T * Cv, *beta = o + T * Cv, *g = beta + T * nv, *state = g + T * nv;
    /* (T, Cc) x 2; (T, nk, dk) x 2; (T, nv, dv) x 3; (T, nv) x 2; (nv, dk, dv) */
    be->matmul(be, 0, 1, T, Cc, H, 1.0f, u, H, L->in_proj_qkv, H, 0.0f, qkv, Cc);
    be->matmul(be, 0, 1, T, Cv, H, 1.0f, u, H, L->in_proj_z, H, 0.0f, z, Cv);
    be->matmul(be, 0, 1, T, nv, H, 1.0f, u, H, L->in_proj_b, H, 0.0f, beta, nv);
    be->matmul(be, 0, 1, T, nv, H, 1.0f, u, H, L->in_proj_a, H, 0.0f, g, nv);
    be->conv1d_silu(be, qkv, L->conv1d, cache ? cache->conv[l] : NULL, T, Cc, K, act);   /* NULL: zero before t = 0 */
    if (mode == Q35_COMMIT)
        conv_window_advance(cache->conv[l], qkv, T, K, Cc);
    else if (mode == Q35_PENDING)
        memcpy(cache->block_qkv[l], qkv, (size_t)(T * Cc) * sizeof(float));
    l2norm_heads(act, Cc, T, nk, dk, 1.0f / sqrtf((float)dk), qh);
    l2norm_heads(act + Ck, Cc, T, nk, dk, 1.0f, kh);
    for (int64_t r = 0; r < T; r++)
        memcpy(v + r * Cv, act + r * Cc + 2 * Ck, (size_t)Cv * sizeof(float));
    for (int64_t r = 0; r < T; r++)
        for (int64_t j = 0; j < nv; j++) {
            float *b = &beta[r * nv + j], *a = &g[r * nv + j], s = *a + L->dt_bias[j];
            *b = sigmoidf(*b);
            *a = -expf(L->A_log[j]) * (s > Q35_SOFTPLUS_LINEAR ? s : log1pf(expf(s)));   /* log decay <= 0 */
        }
    const int64_t S = nv * dk * dv;
    int rc = 0;
    if (mode == Q35_PENDING) {
        memcpy(state, cache->state[l], (size_t)S * sizeof(float));
        ddk_delta_shape shape = { .T = 1, .nk = nk, .nv = nv, .dk = dk, .dv = dv, .chunk = 0 };
        for (int64_t r = 0; r < T && rc == 0; r++) {
            rc = be->gated_delta(be, &shape, qh + r * Ck, kh + r * Ck, v + r * Cv, beta + r * nv, g + r * nv, state,
                                 o + r * Cv);
            memcpy(cache->block_state[l] + r * S, state, (size_t)S * sizeof(float));
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
    be->matmul(be, 0, 1, T, H, Cv, 1.0f, o, Cv, L->out_proj, Cv, 1.0f, x, H);   /* residual */
    return 0;
}

/* a prefill (p0 = 0) starts from an empty conv window and a zero state */
static void q35_cache_start(const ddt_qwen35 *t, q35_cache *q)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t Cc = 2 * c->key_heads * c->key_head_dim + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim;
    for (int64_t l = 0; l < c->layers; l++)
        if (!c->full_attention[l])
            memset(q->conv[l], 0, (size_t)((c->conv_kernel - 1) * Cc + S) * sizeof(float));   /* conv, state */
}

/* floats of the area the mixer and the MLP take in turn: the largest of the full attention's
 * (with the cached attention's weights (p0 + T)), the DeltaNet's (its state included) and the
 * MLP's (gate, up (T, I)) */
static int64_t rows_area(const ddt_qwen35_config *c, int64_t p0, int64_t T)
{
    const int64_t I = c->intermediate, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  nv = c->value_heads, Ck = c->key_heads * c->key_head_dim, Cv = nv * c->value_head_dim,
                  Cc = 2 * Ck + Cv;
    const int64_t full = T * (5 * qd + 2 * kvd) + p0 + T, delta = T * (2 * Cc + 2 * Ck + 3 * Cv + 2 * nv) +
                         nv * c->key_head_dim * c->value_head_dim, mlp = 2 * T * I;
    return full > delta ? (full > mlp ? full : mlp) : (delta > mlp ? delta : mlp);
}

int64_t ddt_qwen35_rows_bytes(const ddt_qwen35_config *c, int64_t p0, int64_t T)
{
    /* x, u (T, H), the area, pos (T) */
    return (2 * T * c->hidden + rows_area(c, p0, T)) * (int64_t)sizeof(float) + T * (int64_t)sizeof(int32_t);
}

/* T rows at positions p0 .. p0+T-1, fed as mode says (p0 = 0 without a cache); the outputs as
 * ddt_qwen35_forward's */
static int q35_rows(const ddk_backend *be, const ddt_qwen35 *t, q35_cache *cache, q35_mode mode, int64_t p0,
                    const int32_t *tokens, int64_t T, const int32_t *tap_ids, int n_taps, float *features,
                    float *final_hidden)
{
    const ddt_qwen35_config *c = &t->cfg;
    const int64_t H = c->hidden, I = c->intermediate;
    for (int i = 0; i < n_taps; i++)
        if (tap_ids[i] < 0 || tap_ids[i] >= c->layers)
            return -EINVAL;
    /* the weights, the q / gate split, l2norm, beta and g are host memory and host loops: the
     * CPU backend only, until the target has its device form (CUDA has the four ops now) */
    if (strcmp(be->name, "cpu") || !be->conv1d_silu || !be->gated_rmsnorm || !be->rope_partial || !be->gated_delta)
        return -ENOTSUP;

    const int64_t area = rows_area(c, p0, T);
    const size_t bytes = (size_t)ddt_qwen35_rows_bytes(c, p0, T);
    float *x = ddk_malloc(be->alloc, bytes);
    if (!x)
        return -ENOMEM;
    float *u = x + T * H, *scratch = u + T * H, *gate = scratch, *up = gate + T * I;
    int32_t *pos = (int32_t *)(scratch + area);
    for (int64_t i = 0; i < T; i++)
        pos[i] = (int32_t)(p0 + i);

    if (cache && p0 == 0)
        q35_cache_start(t, cache);
    be->embedding(be, t->embed_tokens, tokens, T, H, x);
    int rc = 0;
    for (int64_t l = 0; l < c->layers && rc == 0; l++) {
        const ddt_qwen35_layer *L = &t->layer[l];
        be->rmsnorm(be, x, L->input_layernorm, T, H, c->rms_norm_eps, u, NULL);
        rc = c->full_attention[l] ? full_attention(be, t, L, u, pos, T, cache, l, p0, scratch, x)
                                  : deltanet(be, t, L, u, T, cache, mode, l, scratch, x);
        if (rc)
            break;
        be->rmsnorm(be, x, L->post_attention_layernorm, T, H, c->rms_norm_eps, u, NULL);
        ddt_target_mlp(be, u, L->gate_proj, L->up_proj, L->down_proj, T, H, I, gate, up, x);
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
    return q35_rows(be, t, NULL, Q35_NO_CACHE, 0, tokens, T, tap_ids, n_taps, features, final_hidden);
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
    int64_t floats = 0;
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
    q->max_len = max_len, q->max_block = max_block;
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
    return q35_rows(be, m->impl, cache, Q35_COMMIT, p0, tokens, n, tap_ids, n_taps, features, final_hidden);
}

static int q35_verify(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                      const int32_t *tokens, int64_t B, const int32_t *tap_ids, int n_taps, float *features,
                      float *final_hidden)
{
    return q35_rows(be, m->impl, cache, Q35_PENDING, p0, tokens, B, tap_ids, n_taps, features, final_hidden);
}

/* the state after the last accepted position, the window advanced over the accepted qkv rows */
static void q35_rollback(const ddt_target_model *m, void *cache, int64_t p0, int64_t accepted)
{
    (void)p0;
    const ddt_qwen35_config *c = &((const ddt_qwen35 *)m->impl)->cfg;
    q35_cache *q = cache;
    const int64_t Cc = 2 * c->key_heads * c->key_head_dim + c->value_heads * c->value_head_dim,
                  S = c->value_heads * c->key_head_dim * c->value_head_dim;
    for (int64_t l = 0; accepted > 0 && l < c->layers; l++)
        if (!c->full_attention[l]) {
            memcpy(q->state[l], q->block_state[l] + (accepted - 1) * S, (size_t)S * sizeof(float));
            conv_window_advance(q->conv[l], q->block_qkv[l], accepted, c->conv_kernel, Cc);
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

int ddt_qwen35_open_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, ddt_target_model *m)
{
    memset(m, 0, sizeof *m);
    ddt_qwen35 *t = malloc(sizeof *t);
    if (!t)
        return -ENOMEM;
    int rc = ddt_qwen35_synthetic(cfg, seed, t);
    if (rc) {
        free(t);
        return rc;
    }
    *m = (ddt_target_model){ &q35_ops, "qwen3_5", t->cfg.hidden, t->cfg.vocab, t->cfg.layers,
                             t->cfg.tie_word_embeddings, t->embed_tokens, t->lm_head, t };
    return 0;
}

int ddt_qwen35_open(const char *dir, ddt_target_model *m, char *err, size_t err_len)
{
    memset(m, 0, sizeof *m);
    ddt_qwen35 *t = malloc(sizeof *t);
    if (!t)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the target");
    int rc = ddt_qwen35_load(dir, t, err, err_len);
    if (rc) {
        free(t);
        return rc;
    }
    *m = (ddt_target_model){ &q35_ops, "qwen3_5", t->cfg.hidden, t->cfg.vocab, t->cfg.layers,
                             t->cfg.tie_word_embeddings, t->embed_tokens, t->lm_head, t };
    return 0;
}
