/* target_qwen35.h: the frozen Qwen3.5 / Qwen3.6 hybrid target (SPEC.md section 3.1): gated
 * full-attention layers and Gated DeltaNet layers, loaded from any of the real checkpoint
 * variants (model.language_model.* or model.* names, one file or shards through
 * model.safetensors.index.json, BF16 / F16 / F32 per tensor) into float32 or, the matrices and
 * the embedding, bf16 (target_ops.h's ddt_target_options), on any backend; mtp.* and
 * model.visual.* are ignored. The zero-centred norms' `1 +` is folded into the stored weights
 * at load, so every norm here is a plain `x / rms(x) * w` (the DeltaNet output norm is plain in
 * the checkpoint already and is stored as it is).
 * Its prefill (one sequence from position 0: the taps, the final-normed hidden state) and its
 * decoding cache (extend, verify, rollback: target.h's ddt_target_cache) are the second
 * implementation of target.h's interface, which ddt_qwen35_open returns.
 * Tested by tests/engine/model/test_qwen35.c (the three shared variants, malformed checkpoints, the cache
 * against fresh prefills), tests/daemon/train_qwen35_test.sh (an online run generating through it) and
 * tests/oracle/qwen35_features_check.py (`ddtreed features` against tests/oracle/qwen35.py, float64).
 *
 * Legend: T tokens, H hidden, V vocabulary, L layers, I intermediate; full attention: nh / nkv
 * heads of hd dims; DeltaNet: nk key heads of dk, nv value heads of dv, Ck = nk dk, Cv = nv dv,
 * Cc = 2 Ck + Cv, K conv taps.
 */
#ifndef DDT_TARGET_QWEN35_H
#define DDT_TARGET_QWEN35_H

#include "ddk.h"
#include "model_config.h"

#include <stddef.h>
#include <stdint.h>

/* The matrices (void *) are float or bf16 bit patterns as the target's bf16 says, in its
 * backend's memory (target_ops.h's ddt_target_options); the vectors and conv1d are fp32 always. */
typedef struct ddt_qwen35_layer {
    float *input_layernorm, *post_attention_layernorm;   /* (H): 1 + w */
    void *gate_proj, *up_proj;                           /* (I, H) */
    void *down_proj;                                     /* (H, I) */
    /* full-attention layers (else NULL): the checkpoint's q_proj (2 nh hd, H), per head hd query
     * rows then hd gate rows, split at load into two matrices, so one product writes each */
    void *q_proj;                                        /* (nh hd, H): the query rows, head-major */
    void *q_gate;                                        /* (nh hd, H): the gate rows, after q_proj's */
    void *k_proj, *v_proj;                               /* (nkv hd, H) */
    void *o_proj;                                        /* (H, nh hd) */
    float *q_norm, *k_norm;                              /* (hd): 1 + w */
    /* Gated DeltaNet layers (else NULL) */
    void *in_proj_qkv;                                   /* (Cc, H): all q, all k, all v rows */
    void *in_proj_z;                                     /* (Cv, H) */
    void *in_proj_b, *in_proj_a;                         /* (nv, H) */
    float *conv1d;                                       /* (Cc, K): [Cc, 1, K] in the checkpoint */
    float *A_log, *dt_bias;                              /* (nv) */
    float *norm;                                         /* (dv): plain (RMSNormGated) */
    void *out_proj;                                      /* (H, Cv) */
} ddt_qwen35_layer;

typedef struct ddt_qwen35 {
    ddt_qwen35_config cfg;
    const ddk_backend *be;   /* where the weights are */
    int bf16;                /* the matrices' and embedding's storage: 1 bf16, 0 fp32 */
    int generic;             /* no CPU fast path (target_ops.h's ddt_target_options.generic) */
    void *embed_tokens;      /* (V, H) */
    void *lm_head;           /* (V, H): embed_tokens when tied */
    float *norm;             /* (H): 1 + w */
    ddt_qwen35_layer layer[DDT_MAX_TARGET_LAYERS];
    float *weights;          /* every tensor above, one allocation of be->alloc (fp32: back to
                                back in the table's order; bf16: each at a 16-byte boundary) */
    size_t weight_bytes;
} ddt_qwen35;

struct ddt_target_options;
/* DIR (config.json + safetensors), on the CPU in fp32. 0, or a negative errno with err naming
 * the file and every missing or mis-shaped tensor (a Qwen3-Next checkpoint, with in_proj_qkvz,
 * is refused by that name). Nothing is left allocated on failure. */
int ddt_qwen35_load(const char *dir, ddt_qwen35 *t, char *err, size_t err_len);
/* ... on o's backend in o's precision (NULL: as ddt_qwen35_load), tensor by tensor through a
 * bounded host staging buffer */
int ddt_qwen35_load_with(const char *dir, const struct ddt_target_options *o, ddt_qwen35 *t, char *err,
                         size_t err_len);
void ddt_qwen35_free(ddt_qwen35 *t);
/* Seeded random weights of cfg's shape, no checkpoint (tests/bench/bench_qwen35.c): embeddings
 * N(0, 1), matrices and the conv N(0, 1/fan_in), every norm 1, A_log and dt_bias 0; on o's
 * backend in o's precision (NULL: CPU, fp32). 0 or -ENOMEM. */
int ddt_qwen35_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, ddt_qwen35 *t);
int ddt_qwen35_synthetic_with(const ddt_qwen35_config *cfg, uint64_t seed, const struct ddt_target_options *o,
                              ddt_qwen35 *t);
/* bytes of the weight block (what the loaders allocate) of cfg stored as bf16 says */
int64_t ddt_qwen35_weight_bytes(const ddt_qwen35_config *c, int bf16);

/* One sequence from position 0 (SPEC.md 3.1's forward, the DeltaNet core chunked): tokens (T) in
 * [0, V); features (T, n_taps*H) the residual stream after layers tap_ids in that order, or
 * NULL; final_hidden (T, H) after the final norm, or NULL (be's memory). Activations fp32 on every
 * backend. 0, -EINVAL (a tap id out of range), -ENOMEM, or -ENOTSUP (be lacks one of the ops). */
int ddt_qwen35_forward(const ddk_backend *be, const ddt_qwen35 *t, const int32_t *tokens, int64_t T,
                       const int32_t *tap_ids, int n_taps, float *features, float *final_hidden);

/* What the planner needs (planner.h), the same arithmetic the code allocates by: the weights
 * (elements, any dtype; -ENOMEM when the count cannot be made); one forward's workspace for T
 * rows at positions p0 .. (a prefill: p0 = 0); one sequence's cache of max_len positions and
 * verify blocks up to max_block (ddt_target_cache_open). Bytes, fp32, the same on every backend. */
int64_t ddt_qwen35_param_count(const ddt_qwen35_config *c);
int64_t ddt_qwen35_rows_bytes(const ddt_qwen35_config *c, int64_t p0, int64_t T);
int64_t ddt_qwen35_cache_bytes(const ddt_qwen35_config *c, int64_t max_len, int64_t max_block);

/* DIR loaded (ddt_qwen35_load) behind target.h's interface, which then owns it */
struct ddt_target_model;
int ddt_qwen35_open(const char *dir, struct ddt_target_model *m, char *err, size_t err_len);
/* ... on o's backend in o's precision (NULL: ddt_qwen35_open); -ENOTSUP with err when the backend
 * lacks one of the Qwen3.5 ops */
int ddt_qwen35_open_with(const char *dir, const struct ddt_target_options *o, struct ddt_target_model *m,
                         char *err, size_t err_len);
/* ddt_qwen35_synthetic_with behind the interface (o NULL: the CPU in fp32); 0, or -ENOTSUP /
 * -ENOMEM with err */
int ddt_qwen35_open_synthetic(const ddt_qwen35_config *cfg, uint64_t seed, const struct ddt_target_options *o,
                              struct ddt_target_model *m, char *err, size_t err_len);

#endif
