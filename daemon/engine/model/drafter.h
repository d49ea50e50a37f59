/* drafter.h: the DFlash block-diffusion drafter (SPEC.md section 2) and its DFlash2 form (section
 * 2.1: the two-tap block convolutions and the path selector): its configuration, the ONE
 * parameter table (names and shapes in export order) that drives initialisation, checkpoint
 * I/O, export, the optimiser and tests, and one training step's forward, loss and backward.
 * Tested by tests/oracle/step_torch_check.py (PyTorch float64 reference of SPEC.md section 2 through
 * `ddtreed step`) and tests/engine/test_engine.c.
 *
 * Legend: H hidden, L_t tapped target layers, nh / nkv query / key-value heads, d head dim,
 * I intermediate, V vocabulary, S sequence length, A anchors, B block size.
 */
#ifndef DDT_DRAFTER_H
#define DDT_DRAFTER_H

#include "ddk.h"

#include <stddef.h>
#include <stdint.h>

enum { DDT_MAX_LAYERS = 64, DDT_MAX_TAPS = 64, DDT_MAX_PARAMS = 6 + 15 * DDT_MAX_LAYERS,
       DDT_MAX_CONV_TAPS = 8 };

typedef struct ddt_drafter_config {
    int64_t hidden;           /* H */
    int64_t layers;           /* n */
    int64_t heads, kv_heads;  /* nh, nkv */
    int64_t head_dim;         /* d */
    int64_t intermediate;     /* I */
    int64_t vocab;            /* V of the target */
    int64_t block_size;       /* B */
    int64_t sliding_window;   /* Wn */
    float rms_norm_eps, rope_theta;
    int sliding[DDT_MAX_LAYERS];            /* layer_types: 1 = sliding_attention */
    int64_t taps;                           /* L_t */
    int32_t target_layer_ids[DDT_MAX_TAPS];
    int32_t mask_token_id;
    int64_t num_target_layers;              /* of the target (export's num_target_layers) */
    int64_t max_positions;                  /* the target's max_position_embeddings (the export's;
                                               0 = not resolved, refused by the export) */
    /* DFlash2 (SPEC.md 2.1); the sizes are 0 for a DFlash drafter */
    int dflash2;                            /* architecture: 0 "dflash", 1 "dflash2" */
    int64_t conv_taps;                      /* conv_kernel_size, in [1, DDT_MAX_CONV_TAPS] */
    int64_t conv_group_size;                /* gs, divides H; G = H / gs */
    int64_t selector_rank;                  /* r */
    int64_t selector_top_k;                 /* K, in [1, min(V, DDK_SELECTOR_MAX_K)] */
} ddt_drafter_config;

/* G, the convolution's coefficient groups per tap (H / gs); 0 for DFlash */
static inline int64_t ddt_conv_groups(const ddt_drafter_config *c)
{
    return c->dflash2 ? c->hidden / c->conv_group_size : 0;
}

/* Checks ranges and relations (nh % nkv, d even, ids...): 0, or -EINVAL with err naming the
 * field and what it must be. */
int ddt_drafter_config_check(const ddt_drafter_config *c, char *err, size_t err_len);

/* Pointers to every parameter (or to every gradient: the same layout). */
typedef struct ddt_layer_weights {
    float *input_layernorm;           /* (H) */
    float *post_attention_layernorm;  /* (H) */
    float *q_proj;                    /* (nh*d, H) */
    float *k_proj;                    /* (nkv*d, H) */
    float *v_proj;                    /* (nkv*d, H) */
    float *o_proj;                    /* (H, nh*d) */
    float *q_norm;                    /* (d) */
    float *k_norm;                    /* (d) */
    float *gate_proj;                 /* (I, H) */
    float *up_proj;                   /* (I, H) */
    float *down_proj;                 /* (H, I) */
    /* DFlash2 only (NULL otherwise); G = H / gs */
    float *attn_conv_base;            /* (2, taps, H) attention_conv.base_kernel */
    float *attn_conv_proj;            /* (2*taps*G, H) attention_conv.kernel_projection */
    float *mlp_conv_base;             /* (2, taps, H) mlp_conv.base_kernel */
    float *mlp_conv_proj;             /* (2*taps*G, H) mlp_conv.kernel_projection */
} ddt_layer_weights;

typedef struct ddt_drafter_weights {
    float *fc;            /* (H, L_t*H); the table's first tensor, so also the buffer's base */
    float *hidden_norm;   /* (H) */
    ddt_layer_weights layer[DDT_MAX_LAYERS];
    float *norm;          /* (H) */
    /* DFlash2's candidate selector (NULL otherwise) */
    float *sel_pred;      /* (V, r) candidate_selector.predecessor_codebook (A) */
    float *sel_succ;      /* (V, r) candidate_selector.successor_codebook (Bs) */
    float *sel_hidden;    /* (r, H) candidate_selector.hidden_projection (Hp) */
    const uint16_t *bf16; /* (total) the buffer's bf16 copy at the same offsets (the trainer's,
                             refreshed by every AdamW update), or NULL (ddt_drafter_bind's). A
                             bf16 step reads its matrices from it: drafter.c's products */
} ddt_drafter_weights;

/* How a parameter starts (ddt_drafter_init) */
typedef enum ddt_param_init {
    DDT_INIT_NORMAL,      /* N(0, 0.02^2): matrices, the selector's A and Hp */
    DDT_INIT_ONES,        /* RMSNorm gains */
    DDT_INIT_ZERO,        /* the convolutions' kernel_projection, the selector's Bs */
    DDT_INIT_IDENTITY,    /* a convolution's base_kernel (2, taps, H): tap 0 ones, the others 0 */
} ddt_param_init;

/* One row of the parameter table. */
typedef struct ddt_param {
    char name[80];        /* the export name, e.g. "layers.0.self_attn.q_proj.weight" */
    int ndim;             /* 1, 2 or 3 */
    int64_t shape[3];
    int64_t numel;
    int64_t offset;       /* in floats, into the one contiguous buffer */
    ddt_param_init init;
    int is_norm;          /* no weight decay: RMSNorm gains and the convolutions' base kernels
                             (identity at start, which a decay would pull towards 0) */
    int dflash2_only;     /* one of DFlash2's own tensors (SPEC.md 2.1) */
    size_t slot;          /* offset of its pointer inside ddt_drafter_weights */
} ddt_param;

/* Fills params (DDT_MAX_PARAMS) in export order; returns the count. *total = floats in all. */
int ddt_drafter_param_table(const ddt_drafter_config *c, ddt_param *params, int64_t *total);
/* Points every tensor of w into base (total floats), following the table. */
void ddt_drafter_bind(const ddt_drafter_config *c, float *base, ddt_drafter_weights *w);
/* The initialisation (documented in drafter.c): seeded, by each parameter's init. */
void ddt_drafter_init(const ddt_drafter_config *c, float *base, uint64_t seed);

/* A batch of independent sequences: the index arrays in host memory (the step forms its own
 * from them), the hidden states in the backend's memory. */
typedef struct ddt_batch {
    int64_t nseq, S, A;
    const int32_t *input_ids;       /* (nseq, S) host */
    const uint8_t *loss_mask;       /* (nseq, S) host */
    const float *features;          /* (nseq, S, L_t*H) backend */
    const float *teacher_hidden;    /* (nseq, S, H) backend, or NULL */
    const int32_t *anchors;         /* (nseq, A) host, sorted per row, padding after the kept ones */
    const uint8_t *keep;            /* (nseq, A) host */
    const float *slot_scale;        /* (nseq, A, B) host: multiplies each slot's weight w (the
                                       trainer's tree term, train.tree_weight), or NULL: SPEC.md 2's w */
} ddt_batch;

typedef struct ddt_loss_config {
    float gamma;              /* weight decay over slots: exp(-(k-1)/gamma) */
    int ce_target_teacher;    /* 1: labels are the teacher's argmax; 0: the data's next token */
    ddk_loss_params loss;     /* kl/cap weights and temperatures, chunk, vocab_tile (n, H, V set by
                                 the step); loss.bf16_products = 1 makes every product of the step
                                 (the drafter's and the loss's) take bf16 operands */
    /* DFlash2's selector term (SPEC.md 2.1; train.selector_* of the run config) */
    float selector_weight;    /* alpha_sel at this step (the trainer's warm-up and ramp applied) */
    int selector_inject;      /* 1: a label outside the top-K replaces the last candidate ("inject");
                                 0: it adds no selector term ("strict") */
    int selector_stop_gradient; /* 1: the selector term trains the selector's tensors only */
} ddt_loss_config;

/* Checks a batch against the configuration (token ids < V, anchors sorted and < S, keep
 * 1s then 0s, teacher present when needed): 0, or -EINVAL with err naming the tensor. */
int ddt_batch_check(const ddt_drafter_config *c, const ddt_batch *b, const ddt_loss_config *lc,
                    char *err, size_t err_len);

/* The target's frozen embed_tokens and lm_head (V, H each, one pointer twice when tied) as the
 * drafter reads them, in the backend's memory: fp32, or (bf16 1) bf16 bit patterns (uint16_t,
 * ddk_bf16.h), a GPU replica's weights in place as stored, read through the bf16 ops
 * (embedding_w16, and the loss's head_bf16, whose products take bf16 operands). With a bf16 head
 * ddt_drafter_step runs as with loss.bf16_products = 1 whatever the config says: every product of
 * the step, the drafter's own included, takes bf16 operands (a step with bf16 logits and fp32
 * layer products would be a third precision for no gain: an fp32 step needs an fp32 head).
 * ddt_drafter_forward keeps its fp32 products (it reads only embed from the head). */
typedef struct ddt_head {
    const void *embed, *lm_head;
    int bf16;
} ddt_head;

/* One forward + loss + backward. grads ADD into g (callers zero it once per accumulation).
 * w, g and the head in the backend's memory. A bf16 step (loss.bf16_products, or a bf16 head)
 * keeps the MLP's gate and up in bf16 (rounded once when made, read widened by swiglu_16), and
 * with w->bf16 set it takes its weight operands from that copy and rounds each activation operand
 * once (be->round_bf16, be->matmul_16): the same values as rounding both in every product
 * (be->matmul_bf16, the step without a copy), on the CPU the same bits. 0, -EINVAL
 * (batch), or -ENOMEM: then g holds a partial sum, and a retry (smaller chunk) starts from
 * zeroed gradients. On a backend whose ops are queued (CUDA) g is written when the call
 * returns only in the queue: be->synchronize before the host reads it. */
int ddt_drafter_step(const ddk_backend *be, const ddt_drafter_config *c,
                     const ddt_drafter_weights *w, ddt_drafter_weights *g,
                     const ddt_head *head, const ddt_batch *b, const ddt_loss_config *lc,
                     ddk_loss_result *out);

/* The final-normed block hidden states hs (nseq*A*B, H, the backend's memory or the host's) of
 * a batch, no gradients, fp32 products (the acceptance evaluation). 0 or -ENOMEM. */
int ddt_drafter_forward(const ddk_backend *be, const ddt_drafter_config *c,
                        const ddt_drafter_weights *w, const ddt_head *head, const ddt_batch *b,
                        float *hs);

/* Cached drafting (SPEC.md 7; drafter_cache.h keeps the cache): the context's part of the
 * forward, which depends on the context rows only, made once a row, and one block over it.
 * k[l], v[l] (n layers): a layer's keys (normed and rotated, as the attention reads them) and
 * values (rows, nkv*d) in the backend's memory, context row t at row t; work: the backend's
 * memory of ddt_drafter_block_work_bytes(c, rows) for appends of up to `rows` rows.
 * fp32 products, as ddt_drafter_forward. */
size_t ddt_drafter_block_work_bytes(const ddt_drafter_config *c, int64_t rows);
/* context rows pos0 .. pos0+n-1 from their features X (n, L_t*H): C = RMSNorm(X fc^T;
 * hidden_norm), then each layer's K and V into rows pos0.. of k[l], v[l]. 0 or -ENOMEM. */
int ddt_drafter_context_append(const ddk_backend *be, const ddt_drafter_config *c, const ddt_drafter_weights *w,
                               const float *X, int64_t n, int64_t pos0, float *const *k, float *const *v, void *work);
/* hs (B, H) of one block after S context rows (those of k, v): slot 0 = token at position S,
 * slots 1..B-1 mask_token_id; the block's own K, V are written at rows S .. S+B-1 of k[l], v[l].
 * The same hidden states as ddt_drafter_forward on a batch of that one block (its per-layer code),
 * up to the order of the context products' sums. 0 or the attention's error. */
int ddt_drafter_block_forward(const ddk_backend *be, const ddt_drafter_config *c, const ddt_drafter_weights *w,
                              const ddt_head *head, int32_t token, int64_t S, float *const *k, float *const *v,
                              void *work, float *hs);

/* Bytes of activations one step allocates for nseq sequences of S tokens and A anchors
 * (the loss's and attention's workspaces come on top): the planner's figure. bf16: the step's
 * products take bf16 operands (loss.bf16_products or a bf16 head), so it keeps the MLP's gate
 * and up in bf16; staged16: it also reads bf16 copies of the weights (w->bf16), so it holds its
 * activation operands rounded to bf16 (three buffers, drafter.c's products). */
size_t ddt_drafter_step_bytes(const ddt_drafter_config *c, int64_t nseq, int64_t S, int64_t A,
                              int uses_teacher, int bf16, int staged16);
/* The matrix-product FLOPs of one step (forward and backward) for one sequence of S tokens and A
 * anchors: the feature projection, the layers' products (3x the forward's), and `loss_products`
 * products of the positions' hidden states against the vocabulary (3 when it is materialised, 5
 * when streamed in tiles). What bench_step_cuda counts and the planner weighs a split by. */
double ddt_drafter_step_flops(const ddt_drafter_config *c, int64_t S, int64_t A, int loss_products);

#endif
