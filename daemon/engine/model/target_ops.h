/* target_ops.h: the types of the frozen target's one interface (target.h), header only: where a
 * target's weights live and in which precision (ddt_target_options), what an implementation
 * provides (ddt_target_ops, ggml's backend struct as the model) and the model the interface
 * hands out (ddt_target_model). Apart from target.h so that the implementations (the dense
 * target, target_dense.h and target_dense_cache.h; the Qwen3.5 one, target_qwen35.c) fill them
 * without including the dispatcher that calls them; every caller gets them through target.h.
 * Tested through the interface: tests/engine/data/test_source.c (the dense target, ddt_target_open's
 * dispatch), tests/engine/model/test_qwen35.c (the qwen3_5 target) and tests/engine/model/test_target_cuda.c (on a GPU).
 *
 * Legend: as target.h.
 */
#ifndef DDT_TARGET_OPS_H
#define DDT_TARGET_OPS_H

#include "ddk.h"

#include <stdint.h>

/* Where a target's weights live and in which precision (ddt_target_open_with). */
typedef struct ddt_target_options {
    const ddk_backend *be;   /* the backend whose memory holds the weights and which runs the
                                target; NULL: ddk_backend_cpu() */
    int bf16;                /* 1: matrices and embedding stored bf16 (products by matmul_w16) */
    int generic;             /* 1: no CPU fast path even for an fp32 CPU target (tests) */
} ddt_target_options;

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
    /* The cache (SPEC.md 3.1 'Decoding with a cache'), through target.h's ddt_target_cache; NULL where
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

#endif
