/* target_dense_cache.h: the dense target's decoding cache (target_dense_cache.c), internal to
 * the engine: target.c hooks these into the dense target's ddt_target_ops, whose contracts
 * (target_ops.h) they follow; everyone else reaches them through target.h's ddt_target_cache.
 * What both targets share (the products, the embedding, the staged loading) is target_layers.h,
 * included here for the callers that reach it through this header.
 * Tested by tests/engine/data/test_source.c (the cache against prefills, verify and rollback) and
 * tests/engine/eval/test_speculate.c.
 *
 * Legend: as target.h.
 */
#ifndef DDT_TARGET_DENSE_CACHE_H
#define DDT_TARGET_DENSE_CACHE_H

#include "model_config.h"
#include "target_layers.h"
#include "target_ops.h"

/* -EINVAL (a head_dim the RoPE op refuses: odd, or > 1024) or -ENOMEM */
int ddt_dense_cache_open(const ddk_backend *be, const ddt_target_model *m, int64_t max_len, int64_t max_block,
                         void **cache);
void ddt_dense_cache_close(const ddk_backend *be, const ddt_target_model *m, void *cache);
/* n rows committed at p0 (extend), or pending (verify: a chain written where committed rows
 * would be, rows past the accepted ones overwritten by what is fed next; a tree in one pass,
 * node i's key and value at row p0 + i until rollback moves the accepted path's to p0 .. ) */
int ddt_dense_extend(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                     const int32_t *tokens, int64_t n, const int32_t *tap_ids, int n_taps, float *features,
                     float *final_hidden);
int ddt_dense_verify(const ddk_backend *be, const ddt_target_model *m, void *cache, int64_t p0,
                     const int32_t *tokens, int64_t n, const int32_t *parents, const int32_t *tap_ids, int n_taps,
                     float *features, float *final_hidden);
/* a chain: nothing to undo (ddt_target_rollback's len + accepted is the whole of it); a tree's
 * path: its keys and values moved to rows p0 .. p0+accepted-1 */
void ddt_dense_rollback(const ddt_target_model *m, void *cache, int64_t p0, const int32_t *path, int64_t accepted);

/* What the planner needs of the dense target's cache (planner.h), the arithmetic
 * ddt_dense_cache_open allocates by (the same on every backend): one sequence's decoding cache
 * of max_len positions and verify blocks up to max_block (ddt_target_cache_open). Bytes. */
int64_t ddt_target_cache_bytes(const ddt_target_config *c, int64_t max_len, int64_t max_block);

#endif
