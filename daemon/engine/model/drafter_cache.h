/* drafter_cache.h: the drafter's context cache for speculative decoding (SPEC.md 7): each
 * layer's context K (normed and rotated) and V kept across calls, so that a call projects only
 * the rows committed since the last one and drafts its block over the cache, as DFlash servers
 * do (the context gets no input_layernorm and is the same for every layer, SPEC.md 2). The
 * per-layer code is drafter.c's own (ddt_drafter_context_append, ddt_drafter_block_forward).
 * Tested by tests/engine/eval/test_speculate.c (decoding with and without the cache: the same
 * tokens and calls, prompt by prompt; DFlash and DFlash2, chain and trees).
 *
 * Legend: R rows the cache holds at most, n layers, nkv*d a layer's key width, B block size.
 */
#ifndef DDT_DRAFTER_CACHE_H
#define DDT_DRAFTER_CACHE_H

#include "drafter.h"

typedef struct ddt_drafter_cache ddt_drafter_cache;

/* bytes one cache of max_rows context rows allocates on its backend (the planner's figure) */
size_t ddt_drafter_cache_bytes(const ddt_drafter_config *c, int64_t max_rows);
/* a cache for up to max_rows context rows of drafter c, allocated once on be: 0 or -ENOMEM */
int ddt_drafter_cache_open(ddt_drafter_cache **out, const ddk_backend *be, const ddt_drafter_config *c,
                           int64_t max_rows);
void ddt_drafter_cache_close(ddt_drafter_cache *k);
/* forgets every row (a new prompt) */
void ddt_drafter_cache_reset(ddt_drafter_cache *k);
/* the context rows cached */
int64_t ddt_drafter_cache_rows(const ddt_drafter_cache *k);
/* appends n context rows from their features X (n, L_t*H, the backend's memory) with weights w:
 * 0, -ENOMEM, or -ENOSPC past max_rows */
int ddt_drafter_cache_append(ddt_drafter_cache *k, const ddt_drafter_weights *w, const float *X, int64_t n);
/* hs (B, H, the backend's memory) of one block after the cached rows: slot 0 = token at position
 * ddt_drafter_cache_rows(k), what ddt_drafter_forward makes of that block over the same context */
int ddt_drafter_cache_draft(ddt_drafter_cache *k, const ddt_drafter_weights *w, const ddt_head *head, int32_t token,
                            float *hs);

#endif
