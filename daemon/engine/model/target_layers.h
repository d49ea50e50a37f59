/* target_layers.h: what both frozen targets (the dense one, target_dense.h and
 * target_dense_cache.h; the Qwen3.5 one, target_qwen35.h) share, internal to the engine: the
 * products and the embedding on the weights as stored, the token ids' upload, the SwiGLU MLP,
 * the taps, a tree rollback's compaction of keys and values, and the staged loading of their
 * weight blocks (target_layers.c). Callers reach it through target.h.
 * Tested through both targets: tests/engine/test_engine.c, tests/engine/data/test_source.c,
 * tests/engine/model/test_qwen35.c and tests/oracle/features_torch_check.py.
 *
 * Legend: as target.h.
 */
#ifndef DDT_TARGET_LAYERS_H
#define DDT_TARGET_LAYERS_H

#include "ddk.h"
#include "safetensors.h"

#include <stddef.h>
#include <stdint.h>

/* 1 when be's memory is the host's (a CPU backend: "cpu", any rank) */
int ddt_target_host_backend(const ddk_backend *be);

/* y (n, out) = x (n, in) W^T (+ y when accumulate), W (out, in) stored as w16 says (bf16 bits:
 * matmul_w16; fp32: matmul), in be's memory. fast (an fp32 target on a CPU backend, not
 * generic): for n = 1 a matrix-vector product in plain C (a decode step's products, and its
 * logits: ddt_target_logits) */
void ddt_target_linear(const ddk_backend *be, int w16, int fast, int64_t n, int64_t out, int64_t in,
                       const float *x, const void *W, int accumulate, float *y);
/* out (rows, H) = table[ids] with table (V, H) stored as w16 says, ids (rows) in be's memory */
void ddt_target_embed(const ddk_backend *be, int w16, const void *table, const int32_t *ids, int64_t rows,
                      int64_t H, float *out);
/* dst (be's memory) = tokens (n, host), then their positions: the embedding's ids and RoPE's
 * positions of n rows (2n int32): p0 .. p0+n-1 for a chain (parents NULL); for a tree (parents
 * (n, host) as ops->verify's) p0 + each node's depth, then the parents themselves (3n int32: the
 * tree attention's); returns when host memory given to the copy may be reused */
void ddt_target_put_ids(const ddk_backend *be, const int32_t *tokens, int64_t n, int64_t p0, const int32_t *parents,
                        int32_t *dst);

/* The forwards' SwiGLU MLP, x (T, H) += down(silu(u gate^T) * (u up^T)) with gate, up (T, I)
 * scratch, the weights stored as bf16 says (fast: the n = 1 fast path of ddt_target_linear
 * allowed); and the taps, the residual stream x (T, H) after layer l copied into features
 * (T, n_taps*H) wherever tap_ids names l (features NULL: none), one copy_rows each. */
void ddt_target_mlp(const ddk_backend *be, int bf16, int fast, const float *u, const void *gate_proj,
                    const void *up_proj, const void *down_proj, int64_t T, int64_t H, int64_t I, float *gate,
                    float *up, float *x);
void ddt_target_tap(const ddk_backend *be, const float *x, int64_t T, int64_t H, int64_t l,
                    const int32_t *tap_ids, int n_taps, float *features);

/* the keys and values (rows of kvd floats, max_len rows each) of one layer's cache: rows p0 +
 * path[k] moved to p0 + k (path ascending, path[k] >= k: no row is overwritten before it is
 * read), backend copies; what both targets' tree rollbacks share */
void ddt_target_kv_compact(const ddk_backend *be, float *keys, float *values, int64_t kvd, int64_t p0,
                           const int32_t *path, int64_t n);

/* One tensor as the loaders write it: its values (the checkpoint's, or seeded N(0, std^2), or
 * all `fill`), + add (RMSNorm1p's folded 1), row-major (rows, cols), stored fp32 or bf16 */
typedef struct ddt_weight_src {
    const ddt_st_tensor *st;   /* NULL: synthetic */
    uint64_t seed;             /* synthetic: std > 0 draws N(0, std^2) from seed, else fill */
    double std;
    float fill, add;
    int64_t rows, cols;
    int64_t split_rows;        /* > 0: rows in runs of split_rows alternating a / b (q_proj's per-head
                                  query and gate rows), stored all a runs then all b runs */
    int w16;
} ddt_weight_src;

/* The host staging buffer the loaders write every tensor through */
typedef struct ddt_weight_stager {
    const ddk_backend *be;
    float *buf;                /* (floats) */
    int64_t floats;
    int pinned;                /* from ddk_host_alloc_pinned (a GPU backend) */
} ddt_weight_stager;

/* a stager for be of at most 16M floats (64 MiB; fewer when the largest tensor, max_numel, is
 * smaller). 0 or -ENOMEM */
int ddt_weight_stager_init(ddt_weight_stager *s, const ddk_backend *be, int64_t max_numel);
void ddt_weight_stager_free(ddt_weight_stager *s);
/* src into dst (be's memory, rows * cols elements as src->w16 says), piece by piece */
void ddt_weight_put(ddt_weight_stager *s, const ddt_weight_src *src, void *dst);
/* bytes of one tensor in a weight block: fp32 back to back, bf16 blocks at 16-byte boundaries */
size_t ddt_weight_slot_bytes(int64_t numel, int w16, int bf16_block);

#endif
