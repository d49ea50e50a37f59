/* drafter.c: the DFlash block-diffusion drafter (SPEC.md section 2) and DFlash2 (section 2.1):
 * configuration checks, the parameter table, initialisation, batch checks and one training step
 * (forward over the context and the blocks, the fused chunked loss of kernels/ with DFlash2's
 * selector term, backward into every parameter). DFlash2's layer adds four block convolutions
 * (be->block_conv: on the normed input and the output of the attention and of the MLP, their
 * coefficients projected from the normed inputs) and sees its whole block in every layer.
 *
 * Activations of every sequence are kept from the forward for the backward (one allocation);
 * the loss runs once over the slots of all sequences (one global normalisation). Attention
 * is the backend's flash-style DFlash kernel, so no (A*B) x (S + A*B) matrix ever exists.
 * The block part of a layer (block_layer) is shared with cached drafting (ddt_drafter_block_forward,
 * drafter_cache.c keeps the context's K/V), so both run the same code.
 * Not here: noise on the features (the trainer's), the optimiser, data.
 * Tested by tests/oracle/step_torch_check.py (PyTorch float64 reference of SPEC.md section 2 through
 * `ddtreed step`) and tests/engine/test_engine.c.
 *
 * Legend: H hidden, L_t taps, nh / nkv heads, d head dim, I intermediate, V vocabulary,
 * S sequence length, A anchors, B block size, AB = A*B block rows, SAB = S + A*B key rows.
 */
#include "drafter.h"
#include "ddk_rng.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Configuration and the parameter table
 */

int ddt_drafter_config_check(const ddt_drafter_config *c, char *err, size_t err_len)
{
#define REQUIRE(cond, ...)                              \
    do {                                                \
        if (!(cond)) {                                  \
            snprintf(err, err_len, __VA_ARGS__);        \
            return -EINVAL;                             \
        }                                               \
    } while (0)
    REQUIRE(c->hidden >= 1, "hidden_size must be >= 1 (got %lld)", (long long)c->hidden);
    REQUIRE(c->layers >= 1 && c->layers <= DDT_MAX_LAYERS, "num_hidden_layers must be in [1, %d] (got %lld)",
            DDT_MAX_LAYERS, (long long)c->layers);
    REQUIRE(c->heads >= 1 && c->kv_heads >= 1 && c->heads % c->kv_heads == 0,
            "num_attention_heads (%lld) must be a positive multiple of num_key_value_heads (%lld)",
            (long long)c->heads, (long long)c->kv_heads);
    REQUIRE(c->head_dim >= 2 && c->head_dim % 2 == 0 && c->head_dim <= 1024,
            "head_dim must be even and in [2, 1024] (got %lld)", (long long)c->head_dim);
    REQUIRE(c->intermediate >= 1, "intermediate_size must be >= 1 (got %lld)", (long long)c->intermediate);
    REQUIRE(c->vocab >= 2 && c->vocab <= INT32_MAX, "vocab_size must be in [2, 2^31) (got %lld)", (long long)c->vocab);
    REQUIRE(c->block_size >= 2, "block_size must be >= 2 (got %lld)", (long long)c->block_size);
    REQUIRE(c->rms_norm_eps > 0 && isfinite(c->rms_norm_eps), "rms_norm_eps must be > 0");
    REQUIRE(c->rope_theta > 0 && isfinite(c->rope_theta), "rope_theta must be > 0");
    REQUIRE(c->taps >= 1 && c->taps <= DDT_MAX_TAPS, "dflash_config.target_layer_ids must hold 1 to %d ids",
            DDT_MAX_TAPS);
    REQUIRE(c->mask_token_id >= 0 && c->mask_token_id < c->vocab,
            "dflash_config.mask_token_id must be in [0, vocab_size) (got %d)", c->mask_token_id);
    if (c->dflash2) {
        REQUIRE(c->conv_taps >= 1 && c->conv_taps <= DDT_MAX_CONV_TAPS,
                "dflash_config.conv_kernel_size must be in [1, %d] (got %lld)", DDT_MAX_CONV_TAPS,
                (long long)c->conv_taps);
        REQUIRE(c->conv_taps <= c->block_size,
                "dflash_config.conv_kernel_size must be at most block_size %lld (got %lld): the convolution "
                "stays inside one block, and SpecForge and speculators refuse a longer one",
                (long long)c->block_size, (long long)c->conv_taps);
        REQUIRE(c->conv_group_size >= 1 && c->hidden % c->conv_group_size == 0,
                "dflash_config.conv_group_size must divide hidden_size %lld (got %lld)",
                (long long)c->hidden, (long long)c->conv_group_size);
        REQUIRE(c->selector_rank >= 1 && c->selector_rank <= 65536,
                "dflash_config.selector_rank must be in [1, 65536] (got %lld)", (long long)c->selector_rank);
        REQUIRE(c->selector_top_k >= 1 && c->selector_top_k <= DDK_SELECTOR_MAX_K && c->selector_top_k <= c->vocab,
                "dflash_config.selector_top_k must be in [1, %d] and at most vocab_size (got %lld)",
                DDK_SELECTOR_MAX_K, (long long)c->selector_top_k);
    }
    int any_sliding = 0;
    for (int64_t i = 0; i < c->layers; i++)
        any_sliding |= c->sliding[i];
    REQUIRE(!any_sliding || c->sliding_window >= 1, "sliding_window must be >= 1 when a layer is sliding_attention");
    for (int64_t i = 0; i < c->taps; i++) {
        REQUIRE(c->target_layer_ids[i] >= 0 &&
                    (c->num_target_layers <= 0 || c->target_layer_ids[i] < c->num_target_layers),
                "dflash_config.target_layer_ids[%lld] = %d is not a layer of the target (%lld layers)",
                (long long)i, c->target_layer_ids[i], (long long)c->num_target_layers);
        REQUIRE(c->num_target_layers <= 0 || c->target_layer_ids[i] < c->num_target_layers - 1,
                "dflash_config.target_layer_ids[%lld] = %d is the target's last layer: Hugging Face's "
                "hidden_states there is final-normed while the serving stacks tap the residual before the norm, "
                "so the drafter would be served on other features than it was trained on (SPEC.md section 3); "
                "tap a layer in [0, %lld]", (long long)i, c->target_layer_ids[i], (long long)c->num_target_layers - 2);
    }
#undef REQUIRE
    return 0;
}

static void table_add(ddt_param *params, int *count, int64_t *total, size_t slot, ddt_param_init init,
                      int64_t d0, int64_t d1, int64_t d2, const char *fmt, int layer)
{
    ddt_param *p = &params[(*count)++];
    snprintf(p->name, sizeof p->name, fmt, layer);
    p->ndim = d2 ? 3 : d1 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1;
    p->shape[2] = d2;
    p->numel = d0 * (d1 ? d1 : 1) * (d2 ? d2 : 1);
    p->offset = *total;
    p->init = init;
    p->is_norm = init == DDT_INIT_ONES || init == DDT_INIT_IDENTITY;
    p->dflash2_only = !strstr(fmt, "layers.%d.self_attn") && (strstr(fmt, "_conv.") || strstr(fmt, "candidate_selector."));
    p->slot = slot;
    *total += p->numel;
}

int ddt_drafter_param_table(const ddt_drafter_config *c, ddt_param *params, int64_t *total)
{
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, d = c->head_dim, taps = c->conv_taps,
                  proj = 2 * taps * ddt_conv_groups(c), r = c->selector_rank, V = c->vocab;
    const ddt_param_init N = DDT_INIT_NORMAL, ONE = DDT_INIT_ONES;
    int count = 0;
    *total = 0;
    table_add(params, &count, total, offsetof(ddt_drafter_weights, fc), N, H, c->taps * H, 0, "fc.weight", 0);
    table_add(params, &count, total, offsetof(ddt_drafter_weights, hidden_norm), ONE, H, 0, 0, "hidden_norm.weight", 0);
    for (int i = 0; i < (int)c->layers; i++) {
        size_t L = offsetof(ddt_drafter_weights, layer) + (size_t)i * sizeof(ddt_layer_weights);
#define LAYER(field, init, d0, d1, d2, name) \
    table_add(params, &count, total, L + offsetof(ddt_layer_weights, field), init, d0, d1, d2, name, i)
        LAYER(input_layernorm, ONE, H, 0, 0, "layers.%d.input_layernorm.weight");
        LAYER(post_attention_layernorm, ONE, H, 0, 0, "layers.%d.post_attention_layernorm.weight");
        LAYER(q_proj, N, qd, H, 0, "layers.%d.self_attn.q_proj.weight");
        LAYER(k_proj, N, kvd, H, 0, "layers.%d.self_attn.k_proj.weight");
        LAYER(v_proj, N, kvd, H, 0, "layers.%d.self_attn.v_proj.weight");
        LAYER(o_proj, N, H, qd, 0, "layers.%d.self_attn.o_proj.weight");
        LAYER(q_norm, ONE, d, 0, 0, "layers.%d.self_attn.q_norm.weight");
        LAYER(k_norm, ONE, d, 0, 0, "layers.%d.self_attn.k_norm.weight");
        LAYER(gate_proj, N, I, H, 0, "layers.%d.mlp.gate_proj.weight");
        LAYER(up_proj, N, I, H, 0, "layers.%d.mlp.up_proj.weight");
        LAYER(down_proj, N, H, I, 0, "layers.%d.mlp.down_proj.weight");
        if (c->dflash2) {
            LAYER(attn_conv_base, DDT_INIT_IDENTITY, 2, taps, H, "layers.%d.attention_conv.base_kernel");
            LAYER(attn_conv_proj, DDT_INIT_ZERO, proj, H, 0, "layers.%d.attention_conv.kernel_projection.weight");
            LAYER(mlp_conv_base, DDT_INIT_IDENTITY, 2, taps, H, "layers.%d.mlp_conv.base_kernel");
            LAYER(mlp_conv_proj, DDT_INIT_ZERO, proj, H, 0, "layers.%d.mlp_conv.kernel_projection.weight");
        }
#undef LAYER
    }
    table_add(params, &count, total, offsetof(ddt_drafter_weights, norm), ONE, H, 0, 0, "norm.weight", 0);
    if (c->dflash2) {
        table_add(params, &count, total, offsetof(ddt_drafter_weights, sel_pred), N, V, r, 0,
                  "candidate_selector.predecessor_codebook", 0);
        table_add(params, &count, total, offsetof(ddt_drafter_weights, sel_succ), DDT_INIT_ZERO, V, r, 0,
                  "candidate_selector.successor_codebook", 0);
        table_add(params, &count, total, offsetof(ddt_drafter_weights, sel_hidden), N, r, H, 0,
                  "candidate_selector.hidden_projection.weight", 0);
    }
    return count;
}

void ddt_drafter_bind(const ddt_drafter_config *c, float *base, ddt_drafter_weights *w)
{
    static _Thread_local ddt_param params[DDT_MAX_PARAMS];
    int64_t total;
    int count = ddt_drafter_param_table(c, params, &total);
    memset(w, 0, sizeof *w);
    for (int i = 0; i < count; i++)
        *(float **)((char *)w + params[i].slot) = base + params[i].offset;
}

/* Each parameter as its init says (SPEC.md 2, 2.1): norm gains 1; matrices, and the selector's A
 * and Hp, N(0, 0.02^2) (the Qwen3 / Hugging Face initializer_range); the convolutions at
 * identity (base_kernel's tap 0 ones, its other taps and kernel_projection 0) and the selector's
 * Bs 0, so that a fresh DFlash2 drafter proposes what DFlash would. Each random parameter comes
 * from its own stream seeded by (seed, its index among DFlash's tensors, or among DFlash2's own),
 * so the values of one parameter do not depend on the shapes of the others, and a DFlash2
 * drafter's backbone starts as the DFlash drafter of the same seed. */
void ddt_drafter_init(const ddt_drafter_config *c, float *base, uint64_t seed)
{
    static _Thread_local ddt_param params[DDT_MAX_PARAMS];
    int64_t total;
    int count = ddt_drafter_param_table(c, params, &total);
    uint64_t index[2] = { 0, 1u << 20 };   /* the next stream of DFlash's tensors, of DFlash2's own */
    for (int i = 0; i < count; i++) {
        const ddt_param *p = &params[i];
        float *x = base + p->offset;
        uint64_t s = seed * 0x100000001B3ull + index[p->dflash2_only]++;
        for (int64_t j = 0; j < p->numel; j++)
            switch (p->init) {
            case DDT_INIT_NORMAL: x[j] = (float)(0.02 * ddk_rng_normal(&s)); break;
            case DDT_INIT_ONES: x[j] = 1.0f; break;
            case DDT_INIT_ZERO: x[j] = 0.0f; break;
            case DDT_INIT_IDENTITY: x[j] = (j / p->shape[2]) % p->shape[1] == 0 ? 1.0f : 0.0f; break;
            }
    }
}

/* ------------------------------------------------------------------------------------------
 * Batches
 */

int ddt_batch_check(const ddt_drafter_config *c, const ddt_batch *b, const ddt_loss_config *lc,
                    char *err, size_t err_len)
{
    if (b->nseq < 1 || b->S < 2 || b->A < 1) {
        snprintf(err, err_len, "a batch needs nseq >= 1, S >= 2, A >= 1 (got %lld, %lld, %lld)",
                 (long long)b->nseq, (long long)b->S, (long long)b->A);
        return -EINVAL;
    }
    for (int64_t i = 0; i < b->nseq * b->S; i++)
        if (b->input_ids[i] < 0 || b->input_ids[i] >= c->vocab) {
            snprintf(err, err_len, "input_ids[%lld][%lld] = %d is outside the vocabulary [0, %lld)",
                     (long long)(i / b->S), (long long)(i % b->S), b->input_ids[i], (long long)c->vocab);
            return -EINVAL;
        }
    for (int64_t s = 0; s < b->nseq; s++) {
        const int32_t *a = b->anchors + s * b->A;
        const uint8_t *keep = b->keep + s * b->A;
        for (int64_t j = 0; j < b->A; j++) {
            if (keep[j] > 1 || (j > 0 && keep[j] && !keep[j - 1])) {
                snprintf(err, err_len, "keep[%lld] must be 1s then 0s (padding after the kept blocks)",
                         (long long)s);
                return -EINVAL;
            }
            if (keep[j] && (a[j] < 0 || a[j] >= b->S || (j > 0 && a[j] < a[j - 1]))) {
                snprintf(err, err_len, "anchors[%lld][%lld] = %d: kept anchors must be sorted and in [0, %lld)",
                         (long long)s, (long long)j, a[j], (long long)b->S);
                return -EINVAL;
            }
        }
    }
    int needs_teacher = lc->ce_target_teacher || lc->loss.kl_weight > 0.0f;
    if (needs_teacher && !b->teacher_hidden) {
        snprintf(err, err_len, "teacher_hidden is required by %s",
                 lc->ce_target_teacher ? "ce_target \"teacher\"" : "kl_weight > 0");
        return -EINVAL;
    }
    if (!(lc->gamma > 0.0f) || !isfinite(lc->gamma)) {
        snprintf(err, err_len, "gamma must be > 0 (got %g)", (double)lc->gamma);
        return -EINVAL;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Activations: one allocation, carved twice (a sizing pass with base NULL, then for real).
 */

typedef struct arena {
    char *base;
    size_t used;
} arena;

static void *take(arena *a, size_t bytes)
{
    void *p = a->base ? a->base + a->used : NULL;
    a->used += (bytes + 63) / 64 * 64;
    return p;
}
#define TAKE(a, type, count) ((type *)take((a), (size_t)(count) * sizeof(type)))

/* Kept per layer. What a cheap op makes again is not: the normed inputs u and m of the
 * attention and the MLP (in the scratch `normed`), the normed and rotated q and k (in dq_pre
 * and dk_pre, free until the attention's backward has run) and silu(gate) * up (in dact, then
 * dgate). The backward recomputes them bit for bit (the same op on the same input rewrites the
 * same rstd), which saves 3 (AB, H) + (AB, nh*d) + (SAB, nkv*d) + (AB, I) floats per layer. */
typedef struct layer_acts {
    float *rstd_u;                    /* (AB): input_layernorm */
    float *q_pre, *rstd_q;            /* (AB, nh*d), (AB*nh): before q_norm + RoPE */
    float *k_pre, *rstd_k;            /* (SAB, nkv*d), (SAB*nkv): before k_norm + RoPE */
    float *v;                         /* (SAB, nkv*d) */
    float *attn, *lse;                /* (AB, nh*d), (AB, nh) */
    float *h_mid;                     /* (AB, H) after the attention's residual */
    float *rstd_m;                    /* (AB): post_attention_layernorm */
    float *gate, *up;                 /* (AB, I) each; silu(gate) * up is recomputed by the backward */
    uint16_t *gate16, *up16;          /* (AB, I) each: a bf16 step keeps them in bf16 instead
                                         (gate, up NULL), rounded once, read widened */
    /* DFlash2 (NULL otherwise); P = 2*taps*G. The convolved inputs u' and m' are recomputed. */
    float *da, *dm;                   /* (AB, P) the attention's and the MLP's coefficients */
    float *o, *mlp;                   /* (AB, H) attn o_proj^T and the MLP's output, before
                                         their output convolutions */
} layer_acts;

typedef struct seq_acts {
    /* index arrays, formed on the host and copied in at once (carve_index) */
    int32_t *anchors;                 /* (A) padded blocks take the last kept anchor */
    int32_t *tokens;                  /* (AB) x[a_j] then mask tokens */
    int32_t *pos;                     /* (SAB) context 0..S-1, then a_j + o */
    int32_t *teacher_rows;            /* (AB) slot (j, k) is taught by th[a_j + k - 1] (clamped) */
    uint8_t *keep;                    /* (A) the batch's */
    float *xf, *ctx, *rstd_ctx;       /* (S, H) fc output, (S, H) context C, (S) */
    float *h[DDT_MAX_LAYERS + 1];     /* (AB, H) residual stream before each layer, and after */
    float *hs_rstd;                   /* (AB) final norm */
    layer_acts layer[DDT_MAX_LAYERS];
} seq_acts;

typedef struct grad_scratch {
    float *normed;                    /* (AB, H) u or m of the layer at hand (forward and backward) */
    float *dh, *dh_mid, *dm, *du;     /* (AB, H) */
    float *dact, *dgate, *dup;        /* (AB, I); dact is also the forward's silu(gate) * up */
    float *dattn, *dq, *dq_pre;       /* (AB, nh*d) */
    float *dk, *dv, *dk_pre;          /* (SAB, nkv*d) */
    float *dctx, *dxf;                /* (S, H) */
    float *conved, *dconv;            /* DFlash2: (AB, H) u' or m', and its gradient */
    float *dcoef;                     /* DFlash2: (AB, P) the gradient of da or dm */
} grad_scratch;

typedef struct step_memory {
    seq_acts *seq;                    /* (nseq), host structs pointing into the arena */
    int32_t *labels;                  /* (nseq*AB) the data's, or -1 (then the teacher's argmax) */
    int32_t *preds;                   /* (nseq*AB) DFlash2: slot (j, k)'s predecessor x[a_j + k - 1]
                                         (clamped, as teacher_rows), else NULL */
    float *weights;                   /* (nseq*AB) */
    float *hs, *dhs;                  /* (nseq*AB, H) student hidden and its gradient */
    float *teacher;                   /* (nseq*AB, H) th[a_j + k - 1], or NULL */
    grad_scratch g;
    uint16_t *x16, *dy16, *keep16;    /* a staged16 step's bf16 operands (products), else NULL */
} step_memory;

/* The index arrays: the arena's first bytes, carved the same way over a host buffer, where
 * they are formed, and over the backend's arena, where one copy puts them. */
static void carve_index(arena *a, const ddt_drafter_config *c, const ddt_batch *b, step_memory *m)
{
    const int64_t AB = b->A * c->block_size, SAB = b->S + AB;
    for (int64_t s = 0; s < b->nseq; s++) {
        seq_acts *q = &m->seq[s];
        q->anchors = TAKE(a, int32_t, b->A);
        q->tokens = TAKE(a, int32_t, AB);
        q->pos = TAKE(a, int32_t, SAB);
        q->teacher_rows = TAKE(a, int32_t, AB);
        q->keep = TAKE(a, uint8_t, b->A);
    }
    m->labels = TAKE(a, int32_t, b->nseq * AB);
    m->weights = TAKE(a, float, b->nseq * AB);
    m->preds = c->dflash2 ? TAKE(a, int32_t, b->nseq * AB) : NULL;
}

static int64_t max3(int64_t x, int64_t y, int64_t z)
{
    const int64_t xy = x > y ? x : y;
    return xy > z ? xy : z;
}

static void carve(arena *a, const ddt_drafter_config *c, const ddt_batch *b, int uses_teacher,
                  int bf16, int staged16, step_memory *m)
{
    const int64_t H = c->hidden, qd = c->heads * c->head_dim, kvd = c->kv_heads * c->head_dim,
                  I = c->intermediate, S = b->S, AB = b->A * c->block_size, SAB = S + AB,
                  N = b->nseq * AB, P2 = 2 * c->conv_taps * ddt_conv_groups(c);
    carve_index(a, c, b, m);
    for (int64_t s = 0; s < b->nseq; s++) {
        seq_acts *q = &m->seq[s];
        q->xf = TAKE(a, float, S * H);
        q->ctx = TAKE(a, float, S * H);
        q->rstd_ctx = TAKE(a, float, S);
        for (int64_t l = 0; l <= c->layers; l++)
            q->h[l] = TAKE(a, float, AB * H);
        q->hs_rstd = TAKE(a, float, AB);
        for (int64_t l = 0; l < c->layers; l++) {
            layer_acts *L = &q->layer[l];
            L->rstd_u = TAKE(a, float, AB);
            L->q_pre = TAKE(a, float, AB * qd);
            L->rstd_q = TAKE(a, float, AB * c->heads);
            L->k_pre = TAKE(a, float, SAB * kvd);
            L->rstd_k = TAKE(a, float, SAB * c->kv_heads);
            L->v = TAKE(a, float, SAB * kvd);
            L->attn = TAKE(a, float, AB * qd);
            L->lse = TAKE(a, float, AB * c->heads);
            L->h_mid = TAKE(a, float, AB * H);
            L->rstd_m = TAKE(a, float, AB);
            if (bf16) {
                L->gate16 = TAKE(a, uint16_t, AB * I);
                L->up16 = TAKE(a, uint16_t, AB * I);
            } else {
                L->gate = TAKE(a, float, AB * I);
                L->up = TAKE(a, float, AB * I);
            }
            if (c->dflash2) {
                L->da = TAKE(a, float, AB * P2);
                L->dm = TAKE(a, float, AB * P2);
                L->o = TAKE(a, float, AB * H);
                L->mlp = TAKE(a, float, AB * H);
            }
        }
    }
    m->hs = TAKE(a, float, N * H);
    m->dhs = TAKE(a, float, N * H);
    m->teacher = uses_teacher ? TAKE(a, float, N * H) : NULL;
    grad_scratch *g = &m->g;
    g->normed = TAKE(a, float, AB * H);
    g->dh = TAKE(a, float, AB * H);
    g->dh_mid = TAKE(a, float, AB * H);
    g->dm = TAKE(a, float, AB * H);
    g->du = TAKE(a, float, AB * H);
    g->dact = TAKE(a, float, AB * I);
    g->dgate = TAKE(a, float, AB * I);
    g->dup = TAKE(a, float, AB * I);
    g->dattn = TAKE(a, float, AB * qd);
    g->dq = TAKE(a, float, AB * qd);
    g->dq_pre = TAKE(a, float, AB * qd);
    g->dk = TAKE(a, float, SAB * kvd);
    g->dv = TAKE(a, float, SAB * kvd);
    g->dk_pre = TAKE(a, float, SAB * kvd);
    g->dctx = TAKE(a, float, S * H);
    g->dxf = TAKE(a, float, S * H);
    if (c->dflash2) {
        g->conved = TAKE(a, float, AB * H);
        g->dconv = TAKE(a, float, AB * H);
        g->dcoef = TAKE(a, float, AB * P2);
    }
    if (staged16) {   /* the largest operand of each role, over every product of a sequence (DFlash2's
                         coefficient gradient (AB, P2) among the backward's: P2 > H when 2 taps > gs) */
        m->x16 = TAKE(a, uint16_t, max3(S * c->taps * H, max3(S * H, AB * H, AB * qd), AB * I));
        m->dy16 = TAKE(a, uint16_t, max3(max3(S * H, AB * H, AB * qd), AB * I, max3(SAB * kvd, AB * P2, 0)));
        m->keep16 = TAKE(a, uint16_t, AB * H);
    }
}

/* ------------------------------------------------------------------------------------------
 * Linear layers: y (M, N) = x (M, K) W^T with W (N, K), the Hugging Face layout.
 */

/* The step's products. Without bf16 copies: be->matmul, or be->matmul_bf16 when
 * loss.bf16_products asks for bf16 operands (train.precision "bf16": the tensor cores' product;
 * fp32 accumulation either way) or the head is bf16 (drafter.h, ddt_head). With them (w->bf16
 * and bf16 operands): be->matmul_16 on the weights' copy and on activations rounded once into
 * the arena's staging buffers (be->round_bf16): x16 for a product's input, dy16 for a backward's
 * output gradient (and the forward's context, constant over the layers), keep16 for an input
 * that several products read (u: q, k, v; m: gate, up). */
typedef void (*product_fn)(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                           int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                           int64_t ldb, float beta, float *c, int64_t ldc);

typedef struct products {
    const ddk_backend *be;
    int bf16;                    /* bf16 operands (loss.bf16_products or a bf16 head): gate and up
                                    are then kept in bf16 too (layer_acts) */
    product_fn mul;              /* without copies */
    const float *base;           /* w->fc: the buffer the matrices point into */
    const uint16_t *w16;         /* its bf16 copy (w->bf16), or NULL: then mul */
    uint16_t *x16, *dy16, *keep16;   /* staging (step_memory's) */
} products;

/* x (count) rounded into buf when the products read bf16 copies; NULL (nothing done) otherwise */
static const uint16_t *stage(const products *P, const float *x, int64_t count, uint16_t *buf)
{
    if (!P->w16)
        return NULL;
    P->be->round_bf16(P->be, x, count, buf);
    return buf;
}

static const uint16_t *weight16(const products *P, const float *W)
{
    return P->w16 + (W - P->base);
}

/* y (M, N) = x W^T + beta y; x16: x rounded already (stage), or NULL to round it here */
static void linear(const products *P, const float *x, const uint16_t *x16, int64_t M, int64_t K,
                   const float *W, int64_t N, float beta, float *y)
{
    if (!P->w16) {
        P->mul(P->be, 0, 1, M, N, K, 1.0f, x, K, W, K, beta, y, N);
        return;
    }
    if (!x16)
        x16 = stage(P, x, M * K, P->x16);
    P->be->matmul_16(P->be, 0, 1, M, N, K, 1.0f, x16, K, weight16(P, W), K, beta, y, N);
}

/* dx (M, K) += dy W (when dx), dW (N, K) += dy^T x; x16 as for linear */
static void linear_backward(const products *P, const float *x, const uint16_t *x16, int64_t M,
                            int64_t K, const float *W, int64_t N, const float *dy, float *dx,
                            float *dW)
{
    const ddk_backend *be = P->be;
    if (!P->w16) {
        if (dx)
            P->mul(be, 0, 0, M, K, N, 1.0f, dy, N, W, K, 1.0f, dx, K);
        P->mul(be, 1, 0, N, K, M, 1.0f, dy, N, x, K, 1.0f, dW, K);
        return;
    }
    const uint16_t *dy16 = stage(P, dy, M * N, P->dy16);
    if (!x16)
        x16 = stage(P, x, M * K, P->x16);
    if (dx)
        be->matmul_16(be, 0, 0, M, K, N, 1.0f, dy16, N, weight16(P, W), K, 1.0f, dx, K);
    be->matmul_16(be, 1, 0, N, K, M, 1.0f, dy16, N, x16, K, 1.0f, dW, K);
}

/* ------------------------------------------------------------------------------------------
 * DFlash2's block convolutions (SPEC.md 2.1): coef (AB, P) is a layer's projection of its normed
 * input, P = 2*taps*G: side 0's coefficients, then side 1's; base (2, taps, H) likewise.
 */

/* y (AB, H) = conv(x; base[side], coef[:, side]) */
static void conv_side(const ddk_backend *be, const ddt_drafter_config *c, const float *x,
                      const float *base, const float *coef, int side, int64_t AB, float *y)
{
    const int64_t H = c->hidden, taps = c->conv_taps, G = ddt_conv_groups(c);
    be->block_conv(be, x, base + side * taps * H, coef + side * taps * G, 2 * taps * G, AB,
                   c->block_size, H, taps, c->conv_group_size, y);
}

/* dx (AB, H) +=, dbase[side] +=, dcoef[:, side] += from dy (AB, H) */
static void conv_side_backward(const ddk_backend *be, const ddt_drafter_config *c, const float *x,
                               const float *base, const float *coef, int side, int64_t AB,
                               const float *dy, float *dx, float *dbase, float *dcoef)
{
    const int64_t H = c->hidden, taps = c->conv_taps, G = ddt_conv_groups(c);
    be->block_conv_backward(be, x, base + side * taps * H, coef + side * taps * G, 2 * taps * G, dy, AB,
                            c->block_size, H, taps, c->conv_group_size, dx, dbase + side * taps * H,
                            dcoef + side * taps * G);
}

/* A layer's convolved input (the attention's u', the MLP's m'): coef (AB, P) = x Kp^T, then
 * y (AB, H) = conv(x; base[0], coef[:, 0]) */
static void conv_input(const products *P, const ddt_drafter_config *c, const float *x, const float *proj,
                       const float *base, int64_t AB, float *coef, float *y)
{
    linear(P, x, NULL, AB, c->hidden, proj, 2 * c->conv_taps * ddt_conv_groups(c), 0.0f, coef);
    conv_side(P->be, c, x, base, coef, 0, AB, y);
}

/* its backward: dx (AB, H) := the gradient of x from dy (y's) and through coef, whose gradient
 * dcoef (AB, P) holds side 1's already; dproj, dbase += */
static void conv_input_backward(const products *P, const ddt_drafter_config *c, const float *x,
                                const float *proj, const float *base, const float *coef, int64_t AB,
                                const float *dy, float *dx, float *dproj, float *dbase, float *dcoef)
{
    P->be->zero(P->be, dx, (size_t)(AB * c->hidden) * sizeof(float));
    conv_side_backward(P->be, c, x, base, coef, 0, AB, dy, dx, dbase, dcoef);
    linear_backward(P, x, NULL, AB, c->hidden, proj, 2 * c->conv_taps * ddt_conv_groups(c), dcoef, dx, dproj);
}

/* out (AB, H) = res + conv(x; base[side], coef[:, side]): a DFlash2 residual branch, the
 * convolution made in scratch (AB, H) */
static void conv_residual(const ddk_backend *be, const ddt_drafter_config *c, const float *res,
                          const float *x, const float *base, const float *coef, int64_t AB,
                          float *scratch, float *out)
{
    conv_side(be, c, x, base, coef, 1, AB, scratch);
    be->copy(be, out, res, (size_t)(AB * c->hidden) * sizeof(float));
    be->axpby(be, AB * c->hidden, 1.0f, scratch, 1.0f, out);
}

/* ------------------------------------------------------------------------------------------
 * Forward of one sequence. Its index arrays (anchors, tokens, positions, teacher rows, keep,
 * labels, weights) are formed on the host from the batch's host arrays.
 */

static void sequence_inputs(const ddt_drafter_config *c, const ddt_batch *b, int64_t s,
                            seq_acts *q, int32_t *labels, float *weights, int32_t *preds, float gamma,
                            int data_labels)
{
    const int64_t S = b->S, B = c->block_size;
    const int32_t *x = b->input_ids + s * S;
    const uint8_t *mask = b->loss_mask + s * S;
    const int32_t *a = b->anchors + s * b->A;
    const uint8_t *keep = b->keep + s * b->A;
    int32_t last = 0;
    for (int64_t j = 0; j < b->A; j++) {
        q->anchors[j] = keep[j] ? a[j] : last;   /* padding keeps the anchors sorted */
        q->keep[j] = keep[j];
        last = q->anchors[j];
    }
    for (int64_t t = 0; t < S; t++)
        q->pos[t] = (int32_t)t;
    for (int64_t j = 0; j < b->A; j++) {
        const int64_t aj = q->anchors[j];
        for (int64_t k = 0; k < B; k++) {
            const int64_t r = j * B + k, target = aj + k;
            q->tokens[r] = k == 0 ? x[aj] : c->mask_token_id;
            q->pos[S + r] = (int32_t)target;
            const int64_t taught = target - 1;   /* clamped: such slots weigh 0 */
            q->teacher_rows[r] = (int32_t)(taught < 0 ? 0 : taught >= S ? S - 1 : taught);
            if (preds)
                preds[r] = x[q->teacher_rows[r]];
            int valid = keep[j] && k >= 1 && target < S && mask[target];
            weights[r] = valid ? (float)exp(-(double)(k - 1) / gamma) : 0.0f;
            if (b->slot_scale)
                weights[r] *= b->slot_scale[(s * b->A + j) * B + k];
            labels[r] = data_labels && target < S ? x[target] : -1;
        }
    }
}

/* act (count) = silu(gate) * up from the layer's kept gate and up, fp32 or bf16 */
static void mlp_gate(const ddk_backend *be, const layer_acts *L, int64_t count, float *act)
{
    if (L->gate16)
        be->swiglu_16(be, L->gate16, L->up16, count, act);
    else
        be->swiglu(be, L->gate, L->up, count, act);
}

/* One layer's context keys and values, rows [0, n) at positions pos (n): kr (n, nkv*d) =
 * RoPE(k_norm(C Wk^T)) as the attention reads it, v (n, nkv*d) = C Wv^T; k_pre, rstd_k the
 * norm's input and scale (kept by a step for its backward). C (n, H) gets no input_layernorm;
 * ctx16: C staged once for every layer (stage), or NULL. */
static void context_layer(const products *P, const ddt_drafter_config *c, const ddt_layer_weights *W,
                          const float *C, const uint16_t *ctx16, int64_t n, const int32_t *pos, float *k_pre,
                          float *rstd_k, float *kr, float *v)
{
    const int64_t H = c->hidden, nkv = c->kv_heads, d = c->head_dim, kvd = nkv * d;
    linear(P, C, ctx16, n, H, W->k_proj, kvd, 0.0f, k_pre);
    P->be->rmsnorm(P->be, k_pre, W->k_norm, n * nkv, d, c->rms_norm_eps, kr, rstd_k);
    P->be->rope(P->be, kr, pos, n, nkv, d, c->rope_theta, 0);
    linear(P, C, ctx16, n, H, W->v_proj, kvd, 0.0f, v);
}

/* Where one layer's block forward reads and writes: S context rows before the A blocks, the
 * blocks' anchors and keep (A), their rows' positions (AB), and the layer's keys kr and values
 * v (S + AB, nkv*d) whose first S rows (context_layer's) are made: the block rows' go after
 * them, their k_norm input and scale into k_pre (AB, nkv*d) and rstd_k (AB*nkv). */
typedef struct block_keys {
    int64_t S, A;
    const int32_t *anchors, *pos;
    const uint8_t *keep;
    float *kr, *v, *k_pre, *rstd_k;
} block_keys;

/* One layer over the block rows (SPEC.md 2 step 4, DFlash2's convolutions of 2.1): h (AB, H)
 * in, h_out (AB, H) out, the rest of what a step keeps in L; scratch from t. The training
 * forward and the cached drafting forward (ddt_drafter_block_forward) both run it. */
static int block_layer(const products *P, const ddt_drafter_config *c, const ddt_layer_weights *W, int64_t l,
                       layer_acts *L, const grad_scratch *t, const block_keys *K, const float *h, float *h_out)
{
    const ddk_backend *be = P->be;
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, d = c->head_dim, qd = nh * d,
                  kvd = nkv * d, I = c->intermediate, B = c->block_size, AB = K->A * B;
    const float eps = c->rms_norm_eps, theta = c->rope_theta;
    const int v2 = c->dflash2;
    float *const u = t->normed, *const m = t->normed, *const act = t->dact, *const qr = t->dq_pre;   /* scratch */

    be->rmsnorm(be, h, W->input_layernorm, AB, H, eps, u, L->rstd_u);
    const float *ub = u;   /* the block rows' input to q, k, v: u, or DFlash2's u' */
    if (v2) {
        conv_input(P, c, u, W->attn_conv_proj, W->attn_conv_base, AB, L->da, t->conved);
        ub = t->conved;
    }
    const uint16_t *u16 = stage(P, ub, AB * H, P->keep16);

    /* Q for block rows; the block rows' K, V after the context's */
    linear(P, ub, u16, AB, H, W->q_proj, qd, 0.0f, L->q_pre);
    be->rmsnorm(be, L->q_pre, W->q_norm, AB * nh, d, eps, qr, L->rstd_q);
    be->rope(be, qr, K->pos, AB, nh, d, theta, 0);
    float *const kb = K->kr + K->S * kvd;   /* (AB, nkv*d) */
    linear(P, ub, u16, AB, H, W->k_proj, kvd, 0.0f, K->k_pre);
    be->rmsnorm(be, K->k_pre, W->k_norm, AB * nkv, d, eps, kb, K->rstd_k);
    be->rope(be, kb, K->pos, AB, nkv, d, theta, 0);
    linear(P, ub, u16, AB, H, W->v_proj, kvd, 0.0f, K->v + K->S * kvd);

    ddk_attention_shape shape = { .S = K->S, .A = K->A, .B = B, .nh = nh, .nkv = nkv, .d = d,
                                  .window = c->sliding[l] ? c->sliding_window : 0,
                                  .bidirectional = v2 };
    int rc = be->dflash_attention(be, &shape, qr, K->kr, K->v, K->anchors, K->keep, L->attn, L->lse);
    if (rc)
        return rc;
    if (v2) {
        linear(P, L->attn, NULL, AB, qd, W->o_proj, H, 0.0f, L->o);
        conv_residual(be, c, h, L->o, W->attn_conv_base, L->da, AB, t->conved, L->h_mid);
    } else {
        be->copy(be, L->h_mid, h, (size_t)(AB * H) * sizeof(float));
        linear(P, L->attn, NULL, AB, qd, W->o_proj, H, 1.0f, L->h_mid);
    }

    be->rmsnorm(be, L->h_mid, W->post_attention_layernorm, AB, H, eps, m, L->rstd_m);
    const float *mb = m;   /* the MLP's input: m, or DFlash2's m' */
    if (v2) {
        conv_input(P, c, m, W->mlp_conv_proj, W->mlp_conv_base, AB, L->dm, t->conved);
        mb = t->conved;
    }
    const uint16_t *m16 = stage(P, mb, AB * H, P->keep16);
    if (L->gate16) {   /* made in fp32 in the free gradient scratch, kept rounded */
        linear(P, mb, m16, AB, H, W->gate_proj, I, 0.0f, t->dgate);
        linear(P, mb, m16, AB, H, W->up_proj, I, 0.0f, t->dup);
        be->round_bf16(be, t->dgate, AB * I, L->gate16);
        be->round_bf16(be, t->dup, AB * I, L->up16);
    } else {
        linear(P, mb, m16, AB, H, W->gate_proj, I, 0.0f, L->gate);
        linear(P, mb, m16, AB, H, W->up_proj, I, 0.0f, L->up);
    }
    mlp_gate(be, L, AB * I, act);
    if (v2) {
        linear(P, act, NULL, AB, I, W->down_proj, H, 0.0f, L->mlp);
        conv_residual(be, c, L->h_mid, L->mlp, W->mlp_conv_base, L->dm, AB, t->conved, h_out);
    } else {
        be->copy(be, h_out, L->h_mid, (size_t)(AB * H) * sizeof(float));
        linear(P, act, NULL, AB, I, W->down_proj, H, 1.0f, h_out);
    }
    return 0;
}

/* the block inputs h (AB, H) = embed[tokens], fp32 or the head's bf16 as stored */
static void block_inputs(const ddk_backend *be, const ddt_head *head, const int32_t *tokens, int64_t AB, int64_t H,
                         float *h)
{
    if (head->bf16)
        be->embedding_w16(be, head->embed, tokens, AB, H, h);
    else
        be->embedding(be, head->embed, tokens, AB, H, h);
}

static int forward_sequence(const ddk_backend *be, const products *P, const ddt_drafter_config *c,
                            const ddt_drafter_weights *w, const ddt_head *head, const ddt_batch *b,
                            int64_t s, seq_acts *q, const grad_scratch *t, float *hs)
{
    const int64_t H = c->hidden, nkv = c->kv_heads, kvd = nkv * c->head_dim, S = b->S, A = b->A,
                  AB = A * c->block_size, LH = c->taps * H;
    const float eps = c->rms_norm_eps;

    /* context: C = RMSNorm(X fc^T; hidden_norm) (S, H) */
    const float *X = b->features + s * S * LH;   /* (S, L_t*H) */
    linear(P, X, NULL, S, LH, w->fc, H, 0.0f, q->xf);
    be->rmsnorm(be, q->xf, w->hidden_norm, S, H, eps, q->ctx, q->rstd_ctx);
    const uint16_t *ctx16 = stage(P, q->ctx, S * H, P->dy16);   /* for every layer's K, V */

    block_inputs(be, head, q->tokens, AB, H, q->h[0]);
    for (int64_t l = 0; l < c->layers; l++) {
        layer_acts *L = &q->layer[l];
        float *const kr = t->dk_pre;   /* (SAB, nkv*d) scratch: the keys as the attention reads them */
        context_layer(P, c, &w->layer[l], q->ctx, ctx16, S, q->pos, L->k_pre, L->rstd_k, kr, L->v);
        const block_keys K = { .S = S, .A = A, .anchors = q->anchors, .pos = q->pos + S, .keep = q->keep,
                               .kr = kr, .v = L->v, .k_pre = L->k_pre + S * kvd, .rstd_k = L->rstd_k + S * nkv };
        int rc = block_layer(P, c, &w->layer[l], l, L, t, &K, q->h[l], q->h[l + 1]);
        if (rc)
            return rc;
    }
    be->rmsnorm(be, q->h[c->layers], w->norm, AB, H, eps, hs, q->hs_rstd);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Backward of one sequence, from dhs (AB, H); gradients ADD into g.
 */

static int backward_sequence(const ddk_backend *be, const products *P, const ddt_drafter_config *c,
                             const ddt_drafter_weights *w, ddt_drafter_weights *gw,
                             const ddt_batch *b, int64_t s, const seq_acts *q, const float *dhs,
                             const grad_scratch *t)
{
    const int64_t H = c->hidden, nh = c->heads, nkv = c->kv_heads, d = c->head_dim,
                  qd = nh * d, kvd = nkv * d, I = c->intermediate, S = b->S, A = b->A,
                  B = c->block_size, AB = A * B, SAB = S + AB, LH = c->taps * H;
    const float eps = c->rms_norm_eps, theta = c->rope_theta;
    const size_t ab_h = (size_t)(AB * H) * sizeof(float);
    const int v2 = c->dflash2;
    const int64_t P2 = 2 * c->conv_taps * ddt_conv_groups(c);
    /* recomputed, as the forward had them */
    float *const u = t->normed, *const m = t->normed, *const qr = t->dq_pre, *const kr = t->dk_pre;

    be->zero(be, t->dctx, (size_t)(S * H) * sizeof(float));
    be->zero(be, t->dh, ab_h);
    be->rmsnorm_backward(be, q->h[c->layers], w->norm, q->hs_rstd, dhs, AB, H, t->dh, gw->norm);

    for (int64_t l = c->layers - 1; l >= 0; l--) {
        const ddt_layer_weights *W = &w->layer[l];
        ddt_layer_weights *G = &gw->layer[l];
        const layer_acts *L = &q->layer[l];
        const size_t ab_p = (size_t)(AB * P2) * sizeof(float);

        /* MLP: h_out = h_mid + swiglu(m Wg^T, m Wu^T) Wd^T; m and the swiglu recomputed.
         * DFlash2: h_out = h_mid + conv(mlp; base_m[1], dm[:,1]), the MLP's input m' = conv(m;
         * base_m[0], dm[:,0]), dm = m Km^T (m' recomputed) */
        be->rmsnorm(be, L->h_mid, W->post_attention_layernorm, AB, H, eps, m, L->rstd_m);
        be->copy(be, t->dh_mid, t->dh, ab_h);
        const float *mb = m, *dmlp = t->dh;   /* the MLP's input; its output's gradient */
        float *dmb = t->dm;                   /* the gradient of mb */
        if (v2) {
            be->zero(be, t->du, ab_h);   /* free until the attention's part */
            be->zero(be, t->dcoef, ab_p);
            conv_side_backward(be, c, L->mlp, W->mlp_conv_base, L->dm, 1, AB, t->dh, t->du,
                               G->mlp_conv_base, t->dcoef);
            conv_side(be, c, m, W->mlp_conv_base, L->dm, 0, AB, t->conved);
            mb = t->conved;
            dmlp = t->du;
            dmb = t->dconv;
        }
        be->zero(be, t->dact, (size_t)(AB * I) * sizeof(float));
        mlp_gate(be, L, AB * I, t->dgate);
        linear_backward(P, t->dgate, NULL, AB, I, W->down_proj, H, dmlp, t->dact, G->down_proj);
        be->zero(be, t->dgate, (size_t)(AB * I) * sizeof(float));
        be->zero(be, t->dup, (size_t)(AB * I) * sizeof(float));
        if (L->gate16)
            be->swiglu_backward_16(be, L->gate16, L->up16, t->dact, AB * I, t->dgate, t->dup);
        else
            be->swiglu_backward(be, L->gate, L->up, t->dact, AB * I, t->dgate, t->dup);
        be->zero(be, dmb, ab_h);
        const uint16_t *m16 = stage(P, mb, AB * H, P->keep16);
        linear_backward(P, mb, m16, AB, H, W->gate_proj, I, t->dgate, dmb, G->gate_proj);
        linear_backward(P, mb, m16, AB, H, W->up_proj, I, t->dup, dmb, G->up_proj);
        if (v2)
            conv_input_backward(P, c, m, W->mlp_conv_proj, W->mlp_conv_base, L->dm, AB, t->dconv, t->dm,
                                G->mlp_conv_proj, G->mlp_conv_base, t->dcoef);
        be->rmsnorm_backward(be, L->h_mid, W->post_attention_layernorm, L->rstd_m, t->dm, AB, H,
                             t->dh_mid, G->post_attention_layernorm);

        /* attention: h_mid = h + attn Wo^T (DFlash2: h + conv(attn Wo^T; base_a[1], da[:,1])) */
        const float *dout = t->dh_mid;   /* the gradient of attn Wo^T */
        if (v2) {
            be->zero(be, t->dm, ab_h);
            be->zero(be, t->dcoef, ab_p);
            conv_side_backward(be, c, L->o, W->attn_conv_base, L->da, 1, AB, t->dh_mid, t->dm,
                               G->attn_conv_base, t->dcoef);
            dout = t->dm;
        }
        be->zero(be, t->dattn, (size_t)(AB * qd) * sizeof(float));
        linear_backward(P, L->attn, NULL, AB, qd, W->o_proj, H, dout, t->dattn, G->o_proj);
        be->zero(be, t->dq, (size_t)(AB * qd) * sizeof(float));
        be->zero(be, t->dk, (size_t)(SAB * kvd) * sizeof(float));
        be->zero(be, t->dv, (size_t)(SAB * kvd) * sizeof(float));
        ddk_attention_shape shape = { .S = S, .A = A, .B = B, .nh = nh, .nkv = nkv, .d = d,
                                      .window = c->sliding[l] ? c->sliding_window : 0,
                                      .bidirectional = v2 };
        be->rmsnorm(be, L->q_pre, W->q_norm, AB * nh, d, eps, qr, L->rstd_q);
        be->rope(be, qr, q->pos + S, AB, nh, d, theta, 0);
        be->rmsnorm(be, L->k_pre, W->k_norm, SAB * nkv, d, eps, kr, L->rstd_k);
        be->rope(be, kr, q->pos, SAB, nkv, d, theta, 0);
        int rc = be->dflash_attention_backward(be, &shape, qr, kr, L->v, q->anchors, q->keep,
                                               L->attn, L->lse, t->dattn, t->dq, t->dk, t->dv);
        if (rc)
            return rc;

        /* V = [C ; u] Wv^T, u recomputed (DFlash2: the block rows' u' = conv(u; base_a[0],
         * da[:,0]), da = u Ka^T) */
        be->rmsnorm(be, q->h[l], W->input_layernorm, AB, H, eps, u, L->rstd_u);
        const float *ub = u;
        float *dub = t->du;
        if (v2) {
            conv_side(be, c, u, W->attn_conv_base, L->da, 0, AB, t->conved);
            ub = t->conved;
            dub = t->dconv;
        }
        const uint16_t *u16 = stage(P, ub, AB * H, P->keep16);
        be->zero(be, dub, ab_h);
        linear_backward(P, q->ctx, NULL, S, H, W->v_proj, kvd, t->dv, t->dctx, G->v_proj);
        linear_backward(P, ub, u16, AB, H, W->v_proj, kvd, t->dv + S * kvd, dub, G->v_proj);
        /* K = RoPE(k_norm([C ; u] Wk^T)) */
        be->rope(be, t->dk, q->pos, SAB, nkv, d, theta, 1);
        be->zero(be, t->dk_pre, (size_t)(SAB * kvd) * sizeof(float));
        be->rmsnorm_backward(be, L->k_pre, W->k_norm, L->rstd_k, t->dk, SAB * nkv, d, t->dk_pre, G->k_norm);
        linear_backward(P, q->ctx, NULL, S, H, W->k_proj, kvd, t->dk_pre, t->dctx, G->k_proj);
        linear_backward(P, ub, u16, AB, H, W->k_proj, kvd, t->dk_pre + S * kvd, dub, G->k_proj);
        /* Q = RoPE(q_norm(u Wq^T)) */
        be->rope(be, t->dq, q->pos + S, AB, nh, d, theta, 1);
        be->zero(be, t->dq_pre, (size_t)(AB * qd) * sizeof(float));
        be->rmsnorm_backward(be, L->q_pre, W->q_norm, L->rstd_q, t->dq, AB * nh, d, t->dq_pre, G->q_norm);
        linear_backward(P, ub, u16, AB, H, W->q_proj, qd, t->dq_pre, dub, G->q_proj);
        if (v2)
            conv_input_backward(P, c, u, W->attn_conv_proj, W->attn_conv_base, L->da, AB, t->dconv, t->du,
                                G->attn_conv_proj, G->attn_conv_base, t->dcoef);

        /* u = RMSNorm(h; input_layernorm), plus the residual */
        be->copy(be, t->dh, t->dh_mid, ab_h);
        be->rmsnorm_backward(be, q->h[l], W->input_layernorm, L->rstd_u, t->du, AB, H, t->dh,
                             G->input_layernorm);
    }
    /* the block inputs are the frozen embedding: the context is what remains */
    be->zero(be, t->dxf, (size_t)(S * H) * sizeof(float));
    be->rmsnorm_backward(be, q->xf, w->hidden_norm, q->rstd_ctx, t->dctx, S, H, t->dxf, gw->hidden_norm);
    linear_backward(P, b->features + s * S * LH, NULL, S, LH, w->fc, H, t->dxf, NULL, gw->fc);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The step
 */

/* The arena of one call (forward only: no gradient scratch needed, but the same layout keeps
 * one carving; the planner's activation figure is this size). */
static size_t arena_bytes(const ddt_drafter_config *c, const ddt_batch *b, int uses_teacher,
                          int bf16, int staged16, seq_acts *seqs)
{
    step_memory m = { .seq = seqs };
    arena sizing = { NULL, 0 };
    carve(&sizing, c, b, uses_teacher, bf16, staged16, &m);
    return sizing.used;
}

size_t ddt_drafter_step_bytes(const ddt_drafter_config *c, int64_t nseq, int64_t S, int64_t A,
                              int uses_teacher, int bf16, int staged16)
{
    seq_acts *seqs = calloc((size_t)nseq, sizeof *seqs);
    if (!seqs)
        return 0;
    ddt_batch b = { .nseq = nseq, .S = S, .A = A };
    size_t bytes = arena_bytes(c, &b, uses_teacher, bf16, staged16, seqs);
    free(seqs);
    return bytes;
}

/* Shared by the step and the forward: the arena, the index arrays (formed on the host, one
 * copy in), the teacher rows and the forward of every sequence. On success *base is the arena
 * (the caller frees it). */
static int forward_batch(const ddk_backend *be, products *P, const ddt_drafter_config *c,
                         const ddt_drafter_weights *w, const ddt_head *head, const ddt_batch *b,
                         const ddt_loss_config *lc, int uses_teacher, step_memory *m,
                         char **base, size_t *bytes)
{
    const int64_t H = c->hidden, AB = b->A * c->block_size;
    const int staged16 = P->w16 != NULL;
    *bytes = arena_bytes(c, b, uses_teacher, P->bf16, staged16, m->seq);
    *base = ddk_malloc(be->alloc, *bytes);
    if (!*base)
        return -ENOMEM;
    arena a = { *base, 0 };
    carve(&a, c, b, uses_teacher, P->bf16, staged16, m);
    P->x16 = m->x16;
    P->dy16 = m->dy16;
    P->keep16 = m->keep16;

    step_memory staged = { .seq = calloc((size_t)b->nseq, sizeof(seq_acts)) };
    arena sizing = { NULL, 0 };
    if (staged.seq)
        carve_index(&sizing, c, b, &staged);
    char *host = staged.seq ? malloc(sizing.used) : NULL;
    if (!host) {
        free(staged.seq);
        ddk_free(be->alloc, *base, *bytes);
        *base = NULL;
        return -ENOMEM;
    }
    arena h = { host, 0 };
    carve_index(&h, c, b, &staged);
    for (int64_t s = 0; s < b->nseq; s++)
        sequence_inputs(c, b, s, &staged.seq[s], staged.labels + s * AB, staged.weights + s * AB,
                        staged.preds ? staged.preds + s * AB : NULL, lc->gamma, !lc->ce_target_teacher);
    be->copy(be, *base, host, sizing.used);
    be->synchronize(be);   /* the host buffer is read by then */
    free(host);
    free(staged.seq);

    int rc = 0;
    for (int64_t s = 0; s < b->nseq && rc == 0; s++) {
        seq_acts *q = &m->seq[s];
        if (uses_teacher)   /* teacher (AB, H) = th[teacher_rows] with th (S, H) */
            be->embedding(be, b->teacher_hidden + s * b->S * H, q->teacher_rows, AB, H,
                          m->teacher + s * AB * H);
        rc = forward_sequence(be, P, c, w, head, b, s, q, &m->g, m->hs + s * AB * H);
    }
    return rc;
}

int ddt_drafter_forward(const ddk_backend *be, const ddt_drafter_config *c,
                        const ddt_drafter_weights *w, const ddt_head *head, const ddt_batch *b,
                        float *hs)
{
    seq_acts *seqs = calloc((size_t)b->nseq, sizeof *seqs);
    if (!seqs)
        return -ENOMEM;
    step_memory m = { .seq = seqs };
    ddt_loss_config lc = { .gamma = 1.0f, .ce_target_teacher = 1 };
    char *base = NULL;
    size_t bytes = 0;
    products P = { .be = be, .mul = be->matmul };   /* fp32: no copies */
    int rc = forward_batch(be, &P, c, w, head, b, &lc, 0, &m, &base, &bytes);
    if (rc == 0) {
        be->copy(be, hs, m.hs, (size_t)(b->nseq * b->A * c->block_size * c->hidden) * sizeof(float));
        be->synchronize(be);   /* before the arena goes back: hs may be host memory */
    }
    ddk_free(be->alloc, base, bytes);
    free(seqs);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Cached drafting (drafter_cache.c keeps the cache): context rows appended once, then blocks
 * over them. The workspace: one block's arena (a batch of one block after S = 0 context rows:
 * its index arrays first, as a step's), then the appended rows' positions and context.
 */

typedef struct append_work {
    int32_t *pos;                 /* (n) */
    float *xf, *ctx, *rstd_ctx;   /* (n, H), (n, H), (n) */
    float *k_pre, *rstd_k;        /* (n, nkv*d), (n*nkv) */
} append_work;

static void carve_append(arena *a, const ddt_drafter_config *c, int64_t n, append_work *x)
{
    const int64_t H = c->hidden, kvd = c->kv_heads * c->head_dim;
    x->pos = TAKE(a, int32_t, n);
    x->xf = TAKE(a, float, n * H);
    x->ctx = TAKE(a, float, n * H);
    x->rstd_ctx = TAKE(a, float, n);
    x->k_pre = TAKE(a, float, n * kvd);
    x->rstd_k = TAKE(a, float, n * c->kv_heads);
}

static const ddt_batch one_block = { .nseq = 1, .S = 0, .A = 1 };

static size_t block_arena_bytes(const ddt_drafter_config *c)
{
    seq_acts q;
    return arena_bytes(c, &one_block, 0, 0, 0, &q);
}

size_t ddt_drafter_block_work_bytes(const ddt_drafter_config *c, int64_t rows)
{
    append_work x;
    arena sizing = { NULL, block_arena_bytes(c) };
    carve_append(&sizing, c, rows, &x);
    return sizing.used;
}

int ddt_drafter_context_append(const ddk_backend *be, const ddt_drafter_config *c, const ddt_drafter_weights *w,
                               const float *X, int64_t n, int64_t pos0, float *const *k, float *const *v, void *work)
{
    const int64_t H = c->hidden, kvd = c->kv_heads * c->head_dim, LH = c->taps * H;
    append_work x;
    arena a = { work, block_arena_bytes(c) };
    carve_append(&a, c, n, &x);
    int32_t *pos = malloc((size_t)n * sizeof *pos);
    if (!pos)
        return -ENOMEM;
    for (int64_t t = 0; t < n; t++)
        pos[t] = (int32_t)(pos0 + t);
    be->copy(be, x.pos, pos, (size_t)n * sizeof *pos);
    be->synchronize(be);   /* the host positions are read by then */
    free(pos);
    const products P = { .be = be, .mul = be->matmul };   /* fp32, as ddt_drafter_forward */
    linear(&P, X, NULL, n, LH, w->fc, H, 0.0f, x.xf);
    be->rmsnorm(be, x.xf, w->hidden_norm, n, H, c->rms_norm_eps, x.ctx, x.rstd_ctx);
    for (int64_t l = 0; l < c->layers; l++)
        context_layer(&P, c, &w->layer[l], x.ctx, NULL, n, x.pos, x.k_pre, x.rstd_k, k[l] + pos0 * kvd,
                      v[l] + pos0 * kvd);
    return 0;
}

int ddt_drafter_block_forward(const ddk_backend *be, const ddt_drafter_config *c, const ddt_drafter_weights *w,
                              const ddt_head *head, int32_t token, int64_t S, float *const *k, float *const *v,
                              void *work, float *hs)
{
    const int64_t H = c->hidden, B = c->block_size;
    seq_acts q = { 0 };   /* what the carve does not set stays NULL (a bf16 step's gate16) */
    step_memory m = { .seq = &q };
    char *const base = work;
    arena block = { base, 0 };
    carve(&block, c, &one_block, 0, 0, 0, &m);

    /* the index arrays, formed on the host in the arena's layout, one copy in */
    seq_acts hq;
    step_memory hm = { .seq = &hq };
    arena sizing = { NULL, 0 };
    carve_index(&sizing, c, &one_block, &hm);
    char *host = calloc(1, sizing.used);
    if (!host)
        return -ENOMEM;
    arena h = { host, 0 };
    carve_index(&h, c, &one_block, &hm);
    hq.anchors[0] = (int32_t)S;
    hq.keep[0] = 1;
    for (int64_t o = 0; o < B; o++) {
        hq.tokens[o] = o == 0 ? token : c->mask_token_id;
        hq.pos[o] = (int32_t)(S + o);
    }
    be->copy(be, base, host, sizing.used);
    be->synchronize(be);
    free(host);

    const products P = { .be = be, .mul = be->matmul };
    block_inputs(be, head, q.tokens, B, H, q.h[0]);
    for (int64_t l = 0; l < c->layers; l++) {
        layer_acts *L = &q.layer[l];
        const block_keys K = { .S = S, .A = 1, .anchors = q.anchors, .pos = q.pos, .keep = q.keep,
                               .kr = k[l], .v = v[l], .k_pre = L->k_pre, .rstd_k = L->rstd_k };
        int rc = block_layer(&P, c, &w->layer[l], l, L, &m.g, &K, q.h[l], q.h[l + 1]);
        if (rc)
            return rc;
    }
    be->rmsnorm(be, q.h[c->layers], w->norm, B, H, c->rms_norm_eps, hs, q.hs_rstd);
    return 0;
}

int ddt_drafter_step(const ddk_backend *be, const ddt_drafter_config *c,
                     const ddt_drafter_weights *w, ddt_drafter_weights *g,
                     const ddt_head *head, const ddt_batch *b, const ddt_loss_config *lc,
                     ddk_loss_result *out)
{
    const int64_t H = c->hidden, AB = b->A * c->block_size, N = b->nseq * AB;
    ddk_loss_params p = lc->loss;
    p.n = N;
    p.hidden = H;
    p.vocab = c->vocab;
    const int data_labels = !lc->ce_target_teacher;
    const int uses_teacher = b->teacher_hidden && ddk_loss_uses_teacher(&p, data_labels);
    p.head_bf16 = head->bf16 != 0;  /* the loss reads a bf16 head in place ... */
    p.bf16_products |= p.head_bf16; /* ... with bf16 operands, and so does the whole step */

    seq_acts *seqs = calloc((size_t)b->nseq, sizeof *seqs);   /* pointers into the arena */
    if (!seqs)
        return -ENOMEM;
    step_memory m = { .seq = seqs };
    char *base = NULL;
    size_t bytes = 0;
    products P = { .be = be, .bf16 = p.bf16_products,
                   .mul = p.bf16_products ? be->matmul_bf16 : be->matmul, .base = w->fc,
                   .w16 = p.bf16_products ? w->bf16 : NULL };
    int rc = forward_batch(be, &P, c, w, head, b, lc, uses_teacher, &m, &base, &bytes);
    ddk_selector sel = { .top_k = c->selector_top_k, .rank = c->selector_rank,
                         .weight = lc->selector_weight, .inject = lc->selector_inject,
                         .stop_gradient = lc->selector_stop_gradient, .predecessors = m.preds,
                         .A = w->sel_pred, .Bs = w->sel_succ, .Hp = w->sel_hidden,
                         .dA = g->sel_pred, .dBs = g->sel_succ, .dHp = g->sel_hidden };
    p.selector = c->dflash2 ? &sel : NULL;
    if (rc == 0)
        rc = be->loss(be, &p, m.hs, m.teacher, head->lm_head, data_labels ? m.labels : NULL, m.weights,
                      m.dhs, NULL, out);
    for (int64_t s = 0; s < b->nseq && rc == 0; s++)
        rc = backward_sequence(be, &P, c, w, g, b, s, &m.seq[s], m.dhs + s * AB * H, &m.g);
    ddk_free(be->alloc, base, bytes);   /* stream-ordered: the backward's ops run before reuse */
    free(seqs);
    return rc;
}

double ddt_drafter_step_flops(const ddt_drafter_config *c, int64_t S, int64_t A, int loss_products)
{
    const double H = (double)c->hidden, qd = (double)(c->heads * c->head_dim),
                 kvd = (double)(c->kv_heads * c->head_dim), I = (double)c->intermediate,
                 AB = (double)(A * c->block_size), SAB = (double)S + AB, LH = (double)(c->taps * c->hidden);
    const double P2 = (double)(2 * c->conv_taps * ddt_conv_groups(c)), r = (double)c->selector_rank,
                 K = (double)c->selector_top_k;
    /* DFlash2: the two coefficient projections of each layer, and the selector's q = Hp hs and
     * its K codebook rows a position */
    const double layer = 2 * AB * H * qd + 2 * 2 * SAB * H * kvd + 2 * AB * qd * H + 3 * 2 * AB * H * I +
                         2 * 2 * AB * H * P2;
    return 2 * 2 * (double)S * LH * H + 3 * (double)c->layers * layer + loss_products * 2.0 * AB * (double)c->vocab * H +
           3 * 2 * AB * r * (H + K);
}
