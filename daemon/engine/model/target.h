/* target.h: the frozen target (SPEC.md section 3). Its one interface first (ddt_target_ops,
 * ggml's backend struct as the model): ddt_target_open dispatches on config.json's model_type
 * (llama, qwen3: the dense target below; qwen3_5: target_qwen35.h), and the sources,
 * generation (through ddt_target_cache) and `ddtreed features` call only it. Then the dense
 * target: Hugging Face llama and qwen3 directories (F32, BF16 or F16 weights, tied or separate
 * lm_head, sharded or not) and a seeded random target of any shape ("synthetic"); forward only,
 * one sequence at a time, yielding the tapped layer outputs and the final-normed last hidden
 * state, with or without a KV cache (target_dense_cache.c); and the frozen head alone
 * (embed_tokens, lm_head) of a target of any architecture, for feature shards.
 * Tested by tests/features_torch_check.py (PyTorch float64 reference, and the real
 * stories260K model when ../shared is present), tests/qwen35_features_check.py (the qwen3_5
 * target against tests/oracle/qwen35.py), tests/test_engine.c, tests/test_source.c (the dense
 * cache, ddt_target_open's dispatch) and tests/test_qwen35.c (the qwen3_5 cache).
 *
 * Where it runs (SPEC.md section 3, DESIGN.md 'Where the target runs'): on the backend it was
 * opened on (ddt_target_options), its weights in ONE allocation of that backend's allocator,
 * every step of its forward, cached decode, verify and rollback a backend op. Precision: fp32
 * (every tensor converted to float32: the CPU default, checked against float64) or bf16 (the
 * matrices and the embedding as bf16 bit patterns, F32 / F16 checkpoint tensors rounded to
 * nearest even, BF16 ones kept; products through matmul_w16 with fp32 accumulation; the norm
 * vectors, A_log, dt_bias and the conv1d weights stay fp32). Memory contract: tokens and
 * tap ids are host memory; features, final_hidden and logits are the backend's memory (host
 * memory on the CPU backend), written by its ops (on CUDA: queued, read them after the
 * backend's synchronize). A CPU fp32 target keeps two fast paths, plain-C matrix-vector
 * products for one row and a plain-C cached attention (target_dense_cache.c); every other
 * target (bf16, a GPU, or ddt_target_options.generic) takes the backend ops only.
 *
 * Legend: T tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate.
 */
#ifndef DDT_TARGET_H
#define DDT_TARGET_H

#include "ddk.h"
#include "model_config.h"

#include <stddef.h>
#include <stdint.h>

/* Where a target's weights live and in which precision (ddt_target_open_with). */
typedef struct ddt_target_options {
    const ddk_backend *be;   /* the backend whose memory holds the weights and which runs the
                                target; NULL: ddk_backend_cpu() */
    int bf16;                /* 1: matrices and embedding stored bf16 (products by matmul_w16) */
    int generic;             /* 1: no CPU fast path even for an fp32 CPU target (tests) */
} ddt_target_options;

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

/* ------------------------------------------------------------------------------------------
 * The one target interface
 */

typedef struct ddt_target_model ddt_target_model;

typedef struct ddt_target_ops {
    const char *name;   /* "dense", "qwen3_5" */
    /* One sequence from position 0, ddt_target_forward's contract: tokens (T) in [0, V);
     * features (T, n_taps*H) the residual stream after layers tap_ids in that order, or NULL;
     * final_hidden (T, H) after the final norm, or NULL. 0, -EINVAL (a tap id out of range),
     * -ENOMEM, or -ENOTSUP (an op the backend lacks). */
    int (*prefill)(const ddk_backend *be, const ddt_target_model *m, const int32_t *tokens, int64_t T,
                   const int32_t *tap_ids, int n_taps, float *features, float *final_hidden);
    void (*free)(ddt_target_model *m);
    /* The cache (SPEC.md 3.1 'Decoding with a cache'), through ddt_target_cache below; NULL where
     * an implementation has none (both of today's have one: target_dense_cache.c, target_qwen35.c).
     * cache_open: a cache for max_len positions and verify blocks (chains or trees) of up to
     * max_block tokens. extend: n tokens at positions p0 .. p0+n-1 committed to the cache (a
     * prefill: p0 = 0, or a decode step: n = 1). verify: n tokens fed but pending: a chain
     * (parents NULL) at p0 .. p0+n-1, or a tree (SPEC.md 7, DDTree): parents (n, host memory),
     * parents[i] in [-1, i), token i at position p0 + its depth (a parent of -1: depth 0), seeing
     * the cache and its own ancestors only; then rollback keeps `accepted` of them as if only
     * those had been fed at p0 .. p0+accepted-1: the first ones of a chain (path NULL), or the
     * root path path[0 .. accepted) of a tree (path[0]'s parent -1, path[k]'s parent path[k-1]).
     * The outputs, per fed row, are prefill's (a tree node's: those of the sequence of its root
     * path). */
    int (*cache_open)(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                      void **cache);
    void (*cache_close)(const ddk_backend *be, const ddt_target_model *m, void *cache);
    int (*extend)(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0, const int32_t *tokens,
                  int64_t n, const int32_t *tap_ids, int n_taps, float *features, float *final_hidden);
    int (*verify)(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0, const int32_t *tokens,
                  int64_t n, const int32_t *parents, const int32_t *tap_ids, int n_taps, float *features,
                  float *final_hidden);
    void (*rollback)(const ddt_target_model *m, void *cache, int64_t p0, const int32_t *path, int64_t accepted);
} ddt_target_ops;

struct ddt_target_model {
    const ddt_target_ops *ops;
    const char *model_type;               /* "llama", "qwen3" or "qwen3_5" */
    int64_t hidden, vocab, layers;        /* H, V, L */
    int tie_word_embeddings;
    /* (V, H) each, fp32 host memory: the implementation's own tensors for a CPU fp32 target;
     * NULL for a bf16 or a GPU target (embed_stored / lm_head_stored below) */
    const float *embed_tokens, *lm_head;
    void *impl;                           /* the implementation's (ddt_target, ddt_qwen35) */
    const ddk_backend *be;                /* where the weights are: the backend to run it on */
    int bf16;                             /* the matrices' and embedding's storage */
    int fast;                             /* an fp32 CPU target, not generic: the CPU fast paths */
    const void *embed_stored, *lm_head_stored;   /* (V, H) each as stored, in be's memory */
};

/* 1 when a config.json's model_type names a Qwen3.5 / 3.6 text model (qwen3_5, qwen3_5_text) */
int ddt_target_type_is_qwen35(const char *model_type);
/* DIR as its config.json's model_type says: llama / qwen3 (ddt_target_load), qwen3_5 or
 * qwen3_5_text (ddt_qwen35_load), on the CPU in fp32. 0, or the loader's negative errno and err. */
int ddt_target_open(const char *dir, ddt_target_model *m, char *err, size_t err_len);
/* ... on o's backend in o's precision (NULL: ddt_target_open). The target is then run with that
 * backend (a CPU target: any CPU backend, whose memory is the host's). -ENOTSUP with err when the
 * backend lacks an op the target needs. */
int ddt_target_open_with(const char *dir, const ddt_target_options *o, ddt_target_model *m, char *err,
                         size_t err_len);
/* ddt_target_synthetic behind the interface */
int ddt_target_open_synthetic(const ddt_target_config *cfg, uint64_t seed, ddt_target_model *m, char *err,
                              size_t err_len);
int ddt_target_open_synthetic_with(const ddt_target_config *cfg, uint64_t seed, const ddt_target_options *o,
                                   ddt_target_model *m, char *err, size_t err_len);
void ddt_target_close(ddt_target_model *m);
/* h (ddt_target_head: one fp32 allocation of the CPU allocator, ddt_target_head_free) = m's
 * embed_tokens and lm_head widened to fp32 and copied to the host: the frozen head of a bf16 or
 * GPU target for the trainer (a CPU fp32 target's m->embed_tokens / lm_head serve as they are).
 * 0 or -ENOMEM with err. */
int ddt_target_head_copy(const ddt_target_model *m, struct ddt_target_head *h, char *err, size_t err_len);
/* m's prefill (ops->prefill); logits (T, V) = final_hidden lm_head^T as well when logits is not
 * NULL (final_hidden then required). */
int ddt_target_prefill(const ddk_backend *be, const ddt_target_model *m, const int32_t *tokens, int64_t T,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden,
                       float *logits);
/* logits (n, V) = final_hidden (n, H) lm_head^T, the backend's memory (n = 1 on an fp32 CPU
 * target: a matrix-vector product in plain C, faster than the backend's matmul for a decode step) */
void ddt_target_logits(const ddk_backend *be, const ddt_target_model *m, const float *final_hidden, int64_t n,
                       float *logits);
/* One sequence's cache of m (its ops' cache_open, ...): len positions committed, and pending
 * tokens of a verify block after them until ddt_target_rollback. The outputs of extend, decode
 * and verify are per fed row, as ddt_target_prefill's (logits then needs final_hidden). */
typedef struct ddt_target_cache {
    const ddk_backend *be;
    const ddt_target_model *m;
    void *impl;
    int64_t max_len, max_block;
    int64_t len;       /* positions committed */
    int64_t pending;   /* tokens of the last verify block, 0 after rollback */
    int32_t *parents;  /* (max_block) host: the pending tree's, or a chain's (i - 1) */
} ddt_target_cache;

/* 0, -ENOTSUP (m's ops have no cache), -EINVAL (max_len or max_block < 1, or the implementation
 * refuses m's shape) or -ENOMEM, with err. */
int ddt_target_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                          ddt_target_cache *c, char *err, size_t err_len);
void ddt_target_cache_close(ddt_target_cache *c);
/* empties the cache (a new sequence), keeping its memory */
void ddt_target_cache_reset(ddt_target_cache *c);
/* n tokens committed after the cache's len (a prefill when it is empty). 0, or -EINVAL (a pending
 * verify block, len + n > max_len, n < 1), or the implementation's error. */
int ddt_target_extend(ddt_target_cache *c, const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps,
                      float *features, float *final_hidden, float *logits);
/* one token at position len: ddt_target_extend of n = 1 */
int ddt_target_decode(ddt_target_cache *c, int32_t token, const int32_t *tap_ids, int n_taps, float *features,
                      float *final_hidden, float *logits);
/* B tokens after len, pending (B <= max_block); -EINVAL as extend's, or B > max_block */
int ddt_target_verify(ddt_target_cache *c, const int32_t *tokens, int64_t B, const int32_t *tap_ids, int n_taps,
                      float *features, float *final_hidden, float *logits);
/* A tree of n nodes after len, pending (n <= max_block): parents (n, host) as ops->verify's, node
 * i at position len + its depth, seeing the cache and its ancestors (one target call: the
 * attention through the backend's tree_attention). -EINVAL as verify's, or a parent outside
 * [-1, i). */
int ddt_target_verify_tree(ddt_target_cache *c, const int32_t *tokens, const int32_t *parents, int64_t n,
                           const int32_t *tap_ids, int n_taps, float *features, float *final_hidden, float *logits);
/* keeps accepted (0 .. pending) of a chain's verify block: the cache as if only they had been fed.
 * -EINVAL without a pending block or accepted outside 0 .. pending. */
int ddt_target_rollback(ddt_target_cache *c, int64_t accepted);
/* keeps the root path path[0 .. n) of a pending tree (a chain's: path[k] = k), as if only those
 * tokens had been fed. -EINVAL without a pending block, or a path that is not one of the
 * verified tree's (ddt_target_verify_tree keeps its parents to check it). */
int ddt_target_rollback_path(ddt_target_cache *c, const int32_t *path, int64_t n);

/* hidden size, vocabulary, layers and tie of DIR/config.json, any model_type ddt_target_open
 * takes; the outputs untouched on failure */
int ddt_target_config_shape(const char *dir, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                            char *err, size_t err_len);

/* What both implementations' forwards share: the SwiGLU MLP, x (T, H) += down(silu(u gate^T) *
 * (u up^T)) with gate, up (T, I) scratch, the weights stored as bf16 says (fast: the n = 1
 * fast path of ddt_target_linear allowed); and the taps, the residual stream x (T, H) after
 * layer l copied into features (T, n_taps*H) wherever tap_ids names l (features NULL: none),
 * one copy_rows each. */
void ddt_target_mlp(const ddk_backend *be, int bf16, int fast, const float *u, const void *gate_proj,
                    const void *up_proj, const void *down_proj, int64_t T, int64_t H, int64_t I, float *gate,
                    float *up, float *x);
void ddt_target_tap(const ddk_backend *be, const float *x, int64_t T, int64_t H, int64_t l,
                    const int32_t *tap_ids, int n_taps, float *features);

/* Layer ids the drafter taps by default (SPEC.md section 3): round(1 + i (N-4)/(n-1)). */
void ddt_target_default_taps(int64_t target_layers, int64_t drafter_layers, int32_t *ids);

/* One sequence: tokens (T) in [0, V). features (T, n_taps*H): outputs of layers tap_ids in
 * that order, or NULL; final_hidden (T, H): after the final norm, or NULL.
 * 0, -EINVAL (a tap id out of range), or -ENOMEM. */
int ddt_target_forward(const ddk_backend *be, const ddt_target *t, const int32_t *tokens,
                       int64_t T, const int32_t *tap_ids, int n_taps, float *features,
                       float *final_hidden);

/* What the planner needs of a dense target (planner.h), the arithmetic its code allocates by
 * (the same on every backend):
 * the weights (elements; -ENOMEM when they cannot be counted), ddt_target_forward's workspace
 * for T tokens, and one sequence's decoding cache of max_len positions and verify blocks up to
 * max_block (ddt_target_cache_open). Bytes. */
int64_t ddt_target_param_count(const ddt_target_config *c);
int64_t ddt_target_rows_bytes(const ddt_target_config *c, int64_t T);
int64_t ddt_target_cache_bytes(const ddt_target_config *c, int64_t max_len, int64_t max_block);

#endif
