/* attention_rows.h: which keys a query row of the CUDA flash attention sees (SPEC.md section 2
 * step 4, section 3), as plain inline functions that compile both for the kernels
 * (attention_flash.cu, __host__ __device__) and for the CPU (tests/kernels/test_attention.c checks them
 * against SPEC.md's rules written out key by key, and their monotonicity in the row, on which
 * the kernels' per-tile key ranges rest). Not installed; C and CUDA.
 *
 * A row sees at most two contiguous key ranges: [ctx_lo, ctx_hi) of the context (or, causal,
 * of the sequence) and [own_lo, own_hi) of its own block's slots (empty for causal attention).
 * Every bound is nondecreasing in the row (slot o of one block, or the query position), so the
 * union of the ranges of rows first..last is [lo(first), hi(last)) per pass.
 *
 * Legend: S context rows, B block size, W window (0: full_attention), bidir 1 when the block's
 * rows see all of it whatever W (DFlash2), j block, a its anchor, o slot, p0 position of causal
 * query 0, t a causal query's index.
 */
#ifndef DDK_ATTENTION_ROWS_H
#define DDK_ATTENTION_ROWS_H

#include <stdint.h>

#ifdef __CUDACC__
#define DDK_ROWS_FN static inline __host__ __device__
#else
#define DDK_ROWS_FN static inline
#endif

typedef struct ddk_row_keys {
    int64_t ctx_lo, ctx_hi;   /* context keys [ctx_lo, ctx_hi) */
    int64_t own_lo, own_hi;   /* own block keys [own_lo, own_hi) (key S + j*B + o') */
} ddk_row_keys;

DDK_ROWS_FN int64_t ddk_rows_min(int64_t a, int64_t b) { return a < b ? a : b; }
DDK_ROWS_FN int64_t ddk_rows_max(int64_t a, int64_t b) { return a > b ? a : b; }

/* DFlash query (j, o) of a kept block with the stored anchor a_raw (clamped to [0, S] as the
 * CPU backend does): context t < a, and t >= a + o - (W - 1) with a window; own slots all B
 * (W = 0, or bidir: a DFlash2 drafter's, ddk_attention_shape.bidirectional) or o' <= o (W > 0).
 * With bidir own_hi is the same for every slot: still nondecreasing. */
DDK_ROWS_FN ddk_row_keys ddk_dflash_row_keys(int64_t S, int64_t B, int64_t W, int bidir,
                                             int64_t j, int64_t a_raw, int64_t o)
{
    const int64_t a = ddk_rows_min(ddk_rows_max(a_raw, 0), S);
    ddk_row_keys r;
    r.ctx_lo = W > 0 ? ddk_rows_min(ddk_rows_max(a + o - (W - 1), 0), a) : 0;
    r.ctx_hi = a;
    r.own_lo = S + j * B;
    r.own_hi = r.own_lo + (W > 0 && !bidir ? o + 1 : B);
    return r;
}

/* causal query t of T over S keys (position p0 + t, p0 = S - T): keys [0, p0 + t] */
DDK_ROWS_FN ddk_row_keys ddk_causal_row_keys(int64_t p0, int64_t t)
{
    ddk_row_keys r;
    r.ctx_lo = 0;
    r.ctx_hi = p0 + t + 1;
    r.own_lo = r.own_hi = 0;
    return r;
}

/* 1 when the row sees key t */
DDK_ROWS_FN int ddk_row_sees(const ddk_row_keys *r, int64_t t)
{
    return (t >= r->ctx_lo && t < r->ctx_hi) || (t >= r->own_lo && t < r->own_hi);
}

#undef DDK_ROWS_FN
#endif
