/* target.h: the frozen target (SPEC.md section 3), what every caller includes. Its one
 * interface (ddt_target_ops, ggml's backend struct as the model; the types in target_ops.h):
 * ddt_target_open dispatches on config.json's model_type (llama, qwen3: the dense target,
 * target_dense.h; qwen3_5: target_qwen35.h), and the sources, generation (through
 * ddt_target_cache) and `ddtreed features` call only it. With it come the dense target itself
 * (target_dense.h: its weights, forward and frozen head), its decoding cache
 * (target_dense_cache.h) and what both targets share (target_layers.h).
 * Tested by tests/oracle/features_torch_check.py (PyTorch float64 reference, and the real
 * stories260K model when ../shared is present), tests/oracle/qwen35_features_check.py (the qwen3_5
 * target against tests/oracle/qwen35.py), tests/engine/test_engine.c, tests/engine/data/test_source.c (the dense
 * cache, ddt_target_open's dispatch), tests/engine/model/test_qwen35.c (the qwen3_5 cache) and
 * tests/engine/model/test_target_cuda.c (on a GPU).
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
 * products for one row (target_layers.c) and a plain-C cached attention (target_dense_cache.c);
 * every other target (bf16, a GPU, or ddt_target_options.generic) takes the backend ops only.
 *
 * Legend: T tokens, H hidden, V vocabulary, nh / nkv heads, d head dim, I intermediate.
 */
#ifndef DDT_TARGET_H
#define DDT_TARGET_H

#include "ddk.h"
#include "model_config.h"
#include "target_dense.h"
#include "target_dense_cache.h"
#include "target_layers.h"
#include "target_ops.h"

#include <stddef.h>
#include <stdint.h>

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

/* Layer ids the drafter taps by default (SPEC.md section 3): round(1 + i (N-4)/(n-1)). */
void ddt_target_default_taps(int64_t target_layers, int64_t drafter_layers, int32_t *ids);

#endif
