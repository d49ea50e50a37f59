/* target.h: the frozen dense target (SPEC.md section 3): Hugging Face llama and qwen3
 * directories (F32, BF16 or F16 weights, tied or separate lm_head, sharded or not) and a
 * seeded random target of any shape ("synthetic"); forward only, one sequence at a time,
 * yielding the tapped layer outputs and the final-normed last hidden state; and the frozen
 * head alone (embed_tokens, lm_head) of a target of any architecture, for feature shards.
 * Tested by tests/features_torch_check.py (PyTorch float64 reference, and the real
 * stories260K model when ../shared is present) and tests/test_engine.c.
 *
 * Legend: T tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate.
 */
#ifndef DDT_TARGET_H
#define DDT_TARGET_H

#include "ddk.h"
#include "model_config.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_target_layer {
    float *input_layernorm, *post_attention_layernorm;   /* (H) */
    float *q_proj, *k_proj, *v_proj;                     /* (nh*d, H), (nkv*d, H) x 2 */
    float *o_proj;                                       /* (H, nh*d) */
    float *q_norm, *k_norm;                              /* (d): qwen3 only, else NULL */
    float *gate_proj, *up_proj;                          /* (I, H) */
    float *down_proj;                                    /* (H, I) */
} ddt_target_layer;

typedef struct ddt_target {
    ddt_target_config cfg;
    float *embed_tokens;     /* (V, H) */
    float *lm_head;          /* (V, H): embed_tokens when tied */
    float *norm;             /* (H) */
    ddt_target_layer layer[DDT_MAX_TARGET_LAYERS];
    float *weights;          /* every tensor above, one allocation of the CPU allocator */
    size_t weight_bytes;
} ddt_target;

/* DIR (config.json + safetensors). 0, or a negative errno with err naming file and tensor. */
int ddt_target_load(const char *dir, ddt_target *t, char *err, size_t err_len);
/* Random weights of the given shape, from seed: embeddings N(0, 1), matrices N(0, 1/fan_in),
 * an untied lm_head N(0, 16/H) (logits of std ~4: peaked next-token distributions, so the
 * text it generates has learnable structure), norms 1. */
int ddt_target_synthetic(const ddt_target_config *cfg, uint64_t seed, ddt_target *t,
                         char *err, size_t err_len);
void ddt_target_free(ddt_target *t);

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

/* Layer ids the drafter taps by default (SPEC.md section 3): round(1 + i (N-4)/(n-1)). */
void ddt_target_default_taps(int64_t target_layers, int64_t drafter_layers, int32_t *ids);

/* One sequence: tokens (T) in [0, V). features (T, n_taps*H): outputs of layers tap_ids in
 * that order, or NULL; final_hidden (T, H): after the final norm, or NULL.
 * 0, -EINVAL (a tap id out of range), or -ENOMEM. */
int ddt_target_forward(const ddk_backend *be, const ddt_target *t, const int32_t *tokens,
                       int64_t T, const int32_t *tap_ids, int n_taps, float *features,
                       float *final_hidden);

#endif
