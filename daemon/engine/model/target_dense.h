/* target_dense.h: the dense target (SPEC.md section 3): Hugging Face llama and qwen3 directories
 * (F32, BF16 or F16 weights, tied or separate lm_head, sharded or not) and a seeded random
 * target of any shape ("synthetic"); forward only, one sequence at a time, yielding the tapped
 * layer outputs and the final-normed last hidden state (with a KV cache: target_dense_cache.h);
 * behind target.h's interface, whose dense implementation target.c makes of it; and the frozen
 * head alone (embed_tokens, lm_head) of a target of any architecture, for feature shards.
 * Callers reach it through target.h.
 * Tested by tests/oracle/features_torch_check.py (PyTorch float64 reference, and the real stories260K
 * model when ../shared is present), tests/engine/test_engine.c and tests/engine/data/test_source.c.
 *
 * Legend: as target.h.
 */
#ifndef DDT_TARGET_DENSE_H
#define DDT_TARGET_DENSE_H

#include "ddk.h"
#include "model_config.h"
#include "target_ops.h"

#include <stddef.h>
#include <stdint.h>

/* The matrices and the embedding below are `void *`: float (fp32) or uint16_t bf16 bit patterns
 * (ddk_bf16.h) as the target's bf16 says, in its backend's memory; the vectors are fp32 always. */
typedef struct ddt_target_layer {
    float *input_layernorm, *post_attention_layernorm;   /* (H) */
    void *q_proj, *k_proj, *v_proj;                      /* (nh*d, H), (nkv*d, H) x 2 */
    void *o_proj;                                        /* (H, nh*d) */
    float *q_norm, *k_norm;                              /* (d): qwen3 only, else NULL */
    void *gate_proj, *up_proj;                           /* (I, H) */
    void *down_proj;                                     /* (H, I) */
} ddt_target_layer;

typedef struct ddt_target {
    ddt_target_config cfg;
    const ddk_backend *be;   /* where the weights are */
    int bf16;                /* the matrices' and embedding's storage: 1 bf16, 0 fp32 */
    int generic;             /* ddt_target_options.generic */
    void *embed_tokens;      /* (V, H) */
    void *lm_head;           /* (V, H): embed_tokens when tied */
    float *norm;             /* (H) */
    ddt_target_layer layer[DDT_MAX_TARGET_LAYERS];
    float *weights;          /* every tensor above, one allocation of be->alloc (fp32: the
                                tensors back to back; bf16: each at a 16-byte boundary) */
    size_t weight_bytes;
} ddt_target;

/* DIR (config.json + safetensors) on the CPU in fp32. 0, or a negative errno with err naming
 * file and tensor. */
int ddt_target_load(const char *dir, ddt_target *t, char *err, size_t err_len);
/* ... on o's backend in o's precision (NULL: CPU, fp32), tensor by tensor through a bounded host
 * staging buffer (page-locked for a GPU), never a whole host copy */
int ddt_target_load_with(const char *dir, const ddt_target_options *o, ddt_target *t, char *err,
                         size_t err_len);
/* Random weights of the given shape, from seed: embeddings N(0, 1), matrices N(0, 1/fan_in),
 * an untied lm_head N(0, 16/H) (logits of std ~4: peaked next-token distributions, so the
 * text it generates has learnable structure), norms 1. CPU, fp32. */
int ddt_target_synthetic(const ddt_target_config *cfg, uint64_t seed, ddt_target *t,
                         char *err, size_t err_len);
/* the same values on o's backend in o's precision (bf16: rounded to nearest even) */
int ddt_target_synthetic_with(const ddt_target_config *cfg, uint64_t seed, const ddt_target_options *o,
                              ddt_target *t, char *err, size_t err_len);
void ddt_target_free(ddt_target *t);
/* bytes of the weight block of a target of shape c stored as bf16 says (what the loaders
 * allocate; fp32: 4 ddt_target_param_count) */
int64_t ddt_target_weight_bytes(const ddt_target_config *c, int bf16);

/* What a target fed through feature shards contributes at train time: its frozen head. */
typedef struct ddt_target_head {
    int64_t vocab;           /* V */
    float *embed_tokens;     /* (V, H) */
    float *lm_head;          /* (V, H): embed_tokens when the directory has no lm_head.weight */
    float *weights;          /* both, one allocation of the CPU allocator */
    size_t weight_bytes;
} ddt_target_head;

/* embed_tokens (model.embed_tokens.weight, or model.language_model.embed_tokens.weight of
 * multimodal checkpoints) and lm_head.weight of DIR's safetensors, F32, BF16 or F16, of shape
 * [V, hidden] each, converted to float32. Any model_type (only tie_word_embeddings is read of
 * config.json, top level or text_config): a missing lm_head.weight needs it true (the tie
 * rule of ddt_target_load). 0, or a negative errno with err naming the directory and tensor. */
int ddt_target_load_head(const char *dir, int64_t hidden, ddt_target_head *h, char *err, size_t err_len);
void ddt_target_head_free(ddt_target_head *h);

/* the ops a target stored as bf16 says needs of be beyond the drafter's (ddt_target_forward's;
 * target.c refuses a backend without them before opening any target) */
int ddt_target_has_ops(const ddk_backend *be, int bf16);

/* One sequence: tokens (T) in [0, V). features (T, n_taps*H): outputs of layers tap_ids in
 * that order, or NULL; final_hidden (T, H): after the final norm, or NULL.
 * 0, -EINVAL (a tap id out of range), or -ENOMEM. */
int ddt_target_forward(const ddk_backend *be, const ddt_target *t, const int32_t *tokens,
                       int64_t T, const int32_t *tap_ids, int n_taps, float *features,
                       float *final_hidden);

/* What the planner needs of a dense target (planner.h), the arithmetic its code allocates by
 * (the same on every backend): the weights (elements; -ENOMEM when they cannot be counted) and
 * ddt_target_forward's workspace for T tokens, bytes (its decoding cache's:
 * target_dense_cache.h's ddt_target_cache_bytes). */
int64_t ddt_target_param_count(const ddt_target_config *c);
int64_t ddt_target_rows_bytes(const ddt_target_config *c, int64_t T);

#endif
