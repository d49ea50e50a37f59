/* target_dense_cache.h: the dense target's decoding cache (target_dense_cache.c), internal to
 * the engine: target.c hooks these into the dense target's ddt_target_ops, whose contracts
 * (target.h) they follow; everyone else reaches them through ddt_target_cache.
 *
 * Legend: as target.h.
 */
#ifndef DDT_TARGET_DENSE_CACHE_H
#define DDT_TARGET_DENSE_CACHE_H

#include "target.h"

/* -EINVAL (a head_dim the RoPE op refuses: odd, or > 1024) or -ENOMEM */
int ddt_dense_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                         void **cache);
void ddt_dense_cache_close(const ddk_backend *be, const ddt_target_model *m, void *cache);
/* extend and verify alike: a KV cache's pending rows are written where committed ones would be,
 * and the rows past the accepted ones are overwritten by what is fed next */
int ddt_dense_extend(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                     const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps, float *features,
                     float *final_hidden);
/* nothing to undo: ddt_target_rollback's len + accepted is the whole of it */
void ddt_dense_rollback(const ddt_target_model *m, void *cache, int64_t p0, int64_t accepted);

/* y (n, out) = x (n, in) W^T (+ y when accumulate), W (out, in), in host memory: the backend's
 * matmul, or for n = 1 a matrix-vector product in plain C (a decode step's products, and its
 * logits: ddt_target_logits) */
void ddt_target_linear(const ddk_backend *be, int64_t n, int64_t out, int64_t in, const float *x, const float *W,
                       int accumulate, float *y);

#endif
