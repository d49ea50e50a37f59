/* attention_cuda.cu: DFlash block attention (forward and backward), plain causal attention and
 * tree attention (the DDTree verify, forward only) on the GPU, fp32 SIMT kernels (contracts in
 * ddk.h, struct ddk_backend; SPEC.md section 2 step 4, sections 3 and 7), flash-style: no mask
 * and no score matrix ever exists, memory is the inputs and outputs only. Tree attention has its
 * own kernel and its own notes at the end of the file; what follows describes the other two.
 *
 * A first, plainly correct version (speed later, each step measured; CONVENTIONS.md):
 *
 *   - One thread block per (block j, query head h, group of up to ROWS_PER_CTA slots of the
 *     block) for DFlash, per (group of up to ROWS_PER_CTA query rows, query head h) for causal
 *     attention, whose T query rows are the last T of S positions (p0 = S - T: 0 for a
 *     prefill, S - 1 for a decoding step; row t sees keys [0, p0 + t]). One warp per query row.
 *     Query head h reads kv head h / (nh / nkv).
 *   - Keys are streamed in tiles of KEY_TILE (32) rows: all warps load the tile's K and V rows
 *     into shared memory together, then each warp uses the part of the tile its row sees. A row
 *     sees ONE contiguous range of keys per pass (the CPU backend's observation, attention_cpu.c):
 *     context [0, a_j), or [a_j + o - (window - 1), a_j) with a window; then the own block's slots
 *     S + j*B + [0, B), or [0, o] with a window (unless bidirectional: DFlash2); causal
 *     [0, p0 + t]. So a key's visibility is two comparisons, never a mask. Lane l scores key
 *     t0 + l (a dot product over d from shared memory), the warp takes the tile's max and sum by
 *     shuffles, and the accumulator (lane l holds elements l, l + 32, ... of the output row, in
 *     registers) is rescaled and updated: online softmax in fp32. out = acc / sum,
 *     lse = max + log(sum).
 *   - Backward: the same tiles; p = exp(s - lse) recomputed from the forward's lse,
 *     D = rowsum(dout * out), ds = p (dout.v - D) * scale. dq of a row is held in registers by
 *     its warp and added into dq once at the end (each (row, head) belongs to one thread block:
 *     deterministic). dk and dv of a tile are first summed over the thread block's rows in shared
 *     memory (shared-memory atomics), then added into dk, dv with one global atomicAdd per
 *     element and tile.
 *
 * NON-DETERMINISM (dk, dv only): a context key is seen by every block j whose anchor lies after
 * it and by every query head of its kv group, i.e. by many thread blocks, whose global atomicAdds
 * land in an order fixed by timing. The sum is then rounded in a different order from run to
 * run: the difference is float rounding of that sum, relative ~1e-7 * sqrt(number of thread
 * blocks adding into the element) (<= A * nh / nkv * ceil(B / 16) terms; ~1e-6 at A = 64,
 * G = 8), far below what training notices and inside test_backend_ops.c's tolerances. Within a
 * thread block the shared-memory sum is also order-free (several warps); out, lse and dq are
 * deterministic for a given shape and GPU. A deterministic per-key pass would be the choice if
 * bit-exact reruns of training are ever required.
 *
 * Limits of this version: d <= MAX_D = DDK_CUDA_MAX_HEAD_DIM = 256 (ddk.h: the daemon refuses a
 * larger head_dim for a GPU run; the accumulator is NC = ceil(d/32) <= 8 registers a lane);
 * larger d, or a tile that needs more shared memory than the GPU allows a block, is refused with
 * -EINVAL, nothing written, and the caller takes the CPU path. At d = 256 and 16 warps the
 * forward takes 82,176 bytes and the backward 164,352 (160.5 KiB) of shared memory, inside
 * H100/H200's 232,448 (227 KiB, opt-in; checked at compile time below); parts with less may
 * refuse the backward. Also not here: bf16, tensor cores, splitting long key ranges over thread
 * blocks (so a decoding step, q_rows = 1, is nh warps each walking all S keys: correct, not yet
 * fast; a split over key ranges is the measured step to come).
 *
 * Integer widths: key positions, row indices and global offsets are int64 (a long context's
 * (key * nkv + hk) * d passes 2^31); everything inside a tile is int (n <= KEY_TILE,
 * d <= MAX_D), and a tile is copied a key row per warp, so no element ever pays a division.
 *
 * Anchors are clamped to [0, S] like the CPU backend; padded blocks (keep = 0) write out = 0 and
 * lse = 0 (forward) and contribute nothing (backward). A = 0 or T = 0: nothing to do.
 * Calls return when the kernels are queued on the backend's stream (backend_cuda.cu).
 *
 * Since the tensor-core kernels (attention_flash.cu) arrived these are the fallback and the
 * "before" of the benchmark: they run when DDTREE_CUDA_ATTENTION=simt (or
 * ddk_cuda_set_attention_kernels) asks for them, on a GPU below sm_80, or for a shape the flash
 * kernels refuse (ddk.h, ddk_cuda_attention_kernels); the checks and the entry points below are
 * shared by both.
 *
 * Tested by tests/kernels/test_backend_ops.c against the CPU backend (skipped without a GPU), with both
 * kernel sets (tree attention, which has one kernel, once).
 *
 * Legend: S context rows, A blocks, B block size, nh query heads, nkv kv heads, G = nh / nkv,
 * d head dim, W window, R rows (warps) of a thread block, n keys of the current tile; tree
 * attention: N nodes, the last N of S keys, P = S - N cached keys before them, L a path's length.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * Sizes
 */

enum {
    KEY_TILE = 32,       /* keys per tile: one per lane */
    ROWS_PER_CTA = 16,   /* query rows (warps) per thread block: 512 threads at most, declared
                            to nvcc (__launch_bounds__) so the registers fit such a block */
    MAX_D = DDK_CUDA_MAX_HEAD_DIM,   /* ddk.h, one source of truth with the daemon's check */
    MAX_GRID_YZ = 65535,
};
static_assert(MAX_D <= 8 * 32, "kernel_for's largest instance (NC = 8) covers d <= MAX_D");

/* ------------------------------------------------------------------------------------------
 * What a thread block works on
 */

typedef struct attn_params {
    const float *q, *k, *v;    /* q (rows, nh, d); k, v (keys, nkv, d) */
    const int32_t *anchors;    /* DFlash: (A) */
    const uint8_t *keep;       /* DFlash: (A) */
    const float *out, *dout;   /* backward: (rows, nh, d) */
    const float *lse_in;       /* backward: (rows, nh) */
    float *y;                  /* forward: out (rows, nh, d) */
    float *lse;                /* forward: (rows, nh), or NULL (causal) */
    float *dq, *dk, *dv;       /* backward */
    int64_t S, B, nh, nkv, d, W, T;
    int bidir;                 /* DFlash: a block's rows see all its slots also when W > 0 */
    int64_t p0;                /* causal: the position of query row 0 (S - T; 0 for a prefill) */
    float scale;
    int causal;                /* 1: causal attention of T query rows; 0: DFlash */
    int kt;                    /* backward: keys a tile, KEY_TILE or half of it (launch) */
} attn_params;

/* One pass over keys: the block-uniform range [k0, k1) whose tiles the block loads, and the
 * part [lo, hi) of it that the calling warp's row sees. */
typedef struct key_pass {
    int64_t k0, k1;
    int64_t lo, hi;
} key_pass;

/* The calling warp's query row and, for the thread block, its key passes. Block-uniform fields
 * (npass, the pass ranges, skip) are the same for every warp; has_row and the row's ranges are
 * the warp's. The two passes are named fields, not an array: the kernels loop over a runtime
 * pass, and an array indexed by it would live in local memory (pass_of selects instead). */
typedef struct attn_rows {
    int skip;                  /* padded block: write zeros / add nothing */
    int has_row;               /* this warp has a query row */
    int64_t row;               /* the row's index in (rows, nh): (position or j*B + o) * nh + h */
    int64_t hk;                /* kv head */
    int npass;                 /* 2 for DFlash (context, own block), 1 for causal (pass0 only) */
    key_pass pass0, pass1;
} attn_rows;

__device__ static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

/* pass 0 or 1 of r, by a select per field, so r stays in registers */
__device__ static key_pass pass_of(const attn_rows &r, int pass)
{
    key_pass kp;
    kp.k0 = pass == 0 ? r.pass0.k0 : r.pass1.k0;
    kp.k1 = pass == 0 ? r.pass0.k1 : r.pass1.k1;
    kp.lo = pass == 0 ? r.pass0.lo : r.pass1.lo;
    kp.hi = pass == 0 ? r.pass0.hi : r.pass1.hi;
    return kp;
}

__device__ static attn_rows attn_rows_of(const attn_params &p, int warp, int warps)
{
    attn_rows r;
    const int64_t h = blockIdx.y, G = p.nh / p.nkv;
    r.hk = h / G;
    r.skip = 0;
    if (p.causal) {   /* query row t is position p0 + t and sees keys [0, p0 + t] */
        const int64_t first = (int64_t)blockIdx.x * warps, t = first + warp;
        const int64_t last = imin(p.T - 1, first + warps - 1);
        r.has_row = t < p.T;
        r.row = t * p.nh + h;
        r.npass = 1;
        r.pass0.k0 = 0;
        r.pass0.k1 = p.p0 + last + 1;
        r.pass0.lo = 0;
        r.pass0.hi = p.p0 + t + 1;
        r.pass1.k0 = r.pass1.k1 = r.pass1.lo = r.pass1.hi = 0;
        return r;
    }
    const int64_t j = blockIdx.x, first = (int64_t)blockIdx.z * warps, o = first + warp;
    r.skip = !p.keep[j];
    r.has_row = o < p.B;
    r.row = (j * p.B + o) * p.nh + h;
    const int64_t a = imin(imax(p.anchors[j], 0), p.S);
    r.npass = 2;
    /* context: the row's window start is nondecreasing in o, so the first row's is the union's */
    r.pass0.k0 = p.W > 0 ? imin(imax(a + first - (p.W - 1), 0), a) : 0;
    r.pass0.k1 = a;
    r.pass0.lo = p.W > 0 ? imin(imax(a + o - (p.W - 1), 0), a) : 0;
    r.pass0.hi = a;
    /* own block: slots <= o in a sliding layer, all B in a full one or a bidirectional drafter's */
    r.pass1.k0 = p.S + j * p.B;
    r.pass1.k1 = r.pass1.k0 + p.B;
    r.pass1.lo = r.pass1.k0;
    r.pass1.hi = r.pass1.k0 + (p.W > 0 && !p.bidir ? o + 1 : p.B);
    return r;
}

__device__ static float warp_sum(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

__device__ static float warp_max(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
    return x;
}

/* dot of a (d) and b (d), both in shared memory, by one thread */
__device__ static float dot_row(const float *a, const float *b, int d)
{
    float s = 0.0f;
    for (int i = 0; i < d; i++)
        s = fmaf(a[i], b[i], s);
    return s;
}

/* keys [t0, t0 + n) of kv head hk (k, v (keys, nkv, d)) into dst (n, ldt), by the whole block:
 * warp w copies key rows w, w + warps, ... (d contiguous floats each, coalesced); the row's
 * global offset is formed once in 64 bits, the offsets within the tile are int */
__device__ static void load_tile(float *dst, const float *src, int64_t t0, int n, int64_t nkv,
                                 int64_t hk, int d, int ldt)
{
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    for (int c = warp; c < n; c += warps) {
        const float *key = src + ((t0 + c) * nkv + hk) * d;   /* (d) */
        for (int i = lane; i < d; i += 32)
            dst[c * ldt + i] = key[i];
    }
}

/* ------------------------------------------------------------------------------------------
 * Registers. Each kernel's __launch_bounds__ also names the thread blocks per SM its registers
 * must allow: 2 where shared memory allows two blocks of 16 warps at every d of the instance
 * (the forward at any d <= 256: 82,176 bytes a block at most; the backward at d <= 128: 82,432),
 * 1 for the backward at d in (128, 256] (164,352 bytes at 256: one block per SM). Left to itself
 * ptxas chose otherwise per architecture and instance (-Xptxas -v, CUDA 13.0): 111 registers
 * for the backward at d <= 128 on sm_90 (one block per SM instead of two), and spills (stack
 * frames of 24 and 48 bytes) on sm_100. With these bounds no instance has a stack frame or a
 * spill on sm_90 or sm_100, and sm_90 keeps the blocks per SM it had with the earlier code.
 */

/* ------------------------------------------------------------------------------------------
 * Forward. Shared: q rows (R, d), K tile (KEY_TILE, d + 1), V tile (KEY_TILE, d + 1); the +1
 * keeps lane l's walk along key row l off the other lanes' banks.
 */

template <int NC>
__global__ void __launch_bounds__(ROWS_PER_CTA * 32, 2) attn_forward_kernel(attn_params p)
{
    DDK_DYNAMIC_SHARED(float, smem);
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    const int d = (int)p.d, ldt = d + 1;   /* d <= MAX_D (heads_ok) */
    float *sq = smem, *sk = sq + warps * d, *sv = sk + KEY_TILE * ldt;
    const attn_rows r = attn_rows_of(p, warp, warps);
    const int64_t row_at = r.row * d;   /* the row's offset in q and out (rows, nh, d) */

    if (r.skip) {   /* padded block: its rows are 0 (block-uniform: the whole block returns) */
        if (r.has_row) {
            for (int i = lane; i < d; i += 32)
                p.y[row_at + i] = 0.0f;
            if (lane == 0 && p.lse)
                p.lse[r.row] = 0.0f;
        }
        return;
    }
    float *qr = sq + warp * d;   /* (d) */
    if (r.has_row)
        for (int i = lane; i < d; i += 32)
            qr[i] = p.q[row_at + i];

    float m = -INFINITY, l = 0.0f, acc[NC];
#pragma unroll
    for (int cc = 0; cc < NC; cc++)
        acc[cc] = 0.0f;

    for (int pass = 0; pass < r.npass; pass++) {
        const key_pass kp = pass_of(r, pass);
        for (int64_t t0 = kp.k0; t0 < kp.k1; t0 += KEY_TILE) {
            const int n = (int)imin(KEY_TILE, kp.k1 - t0);
            __syncthreads();   /* the previous tile is used up (and q is stored, first time) */
            load_tile(sk, p.k, t0, n, p.nkv, r.hk, d, ldt);
            load_tile(sv, p.v, t0, n, p.nkv, r.hk, d, ldt);
            __syncthreads();
            /* warp-uniform: does this row see any key of the tile? */
            if (!r.has_row || kp.lo >= kp.hi || kp.lo >= t0 + n || kp.hi <= t0)
                continue;
            /* the keys it sees, as tile columns [c0, c1), 0 <= c0 < c1 <= n: lane l's key
             * t0 + l is seen iff c0 <= l < c1 */
            const int c0 = (int)(imax(kp.lo, t0) - t0), c1 = (int)(imin(kp.hi, t0 + n) - t0);
            const bool vis = lane >= c0 && lane < c1;
            const float s = vis ? p.scale * dot_row(qr, sk + lane * ldt, d) : -INFINITY;
            const float m_new = fmaxf(m, warp_max(s));   /* finite: one key at least is seen */
            const float pl = vis ? expf(s - m_new) : 0.0f;
            const float rescale = expf(m - m_new);       /* m = -inf first: 0 */
            l = l * rescale + warp_sum(pl);
            m = m_new;
#pragma unroll
            for (int cc = 0; cc < NC; cc++)
                acc[cc] *= rescale;
            for (int c = c0; c < c1; c++) {
                const float pc = __shfl_sync(0xffffffffu, pl, c);
                const float *vr = sv + c * ldt;
#pragma unroll
                for (int cc = 0; cc < NC; cc++) {
                    const int i = lane + 32 * cc;
                    if (i < d)
                        acc[cc] = fmaf(pc, vr[i], acc[cc]);
                }
            }
        }
    }
    if (!r.has_row)
        return;
    /* every row of a kept block sees its own slot 0 at least (causal: key t): l > 0 */
    const float inv = 1.0f / l;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int i = lane + 32 * cc;
        if (i < d)
            p.y[row_at + i] = acc[cc] * inv;
    }
    if (lane == 0 && p.lse)
        p.lse[r.row] = m + logf(l);
}

/* ------------------------------------------------------------------------------------------
 * Backward. Shared: q rows (R, d), dout rows (R, d), K, V tiles and the tile's dK, dV sums
 * (kt, d + 1) each: kt = KEY_TILE keys a tile, or 16 where the GPU's shared memory is smaller
 * (99 KB cards at d > 157: lanes 16..31 then see no key, c1 <= n <= kt).
 */

template <int NC>
__global__ void __launch_bounds__(ROWS_PER_CTA * 32, NC <= 4 ? 2 : 1)
attn_backward_kernel(attn_params p)
{
    DDK_DYNAMIC_SHARED(float, smem);
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    const int d = (int)p.d, ldt = d + 1;   /* d <= MAX_D (heads_ok) */
    const int kt = p.kt;
    float *sq = smem, *sdo = sq + warps * d, *sk = sdo + warps * d, *sv = sk + kt * ldt;
    float *sdk = sv + kt * ldt, *sdv = sdk + kt * ldt;
    const attn_rows r = attn_rows_of(p, warp, warps);
    if (r.skip)   /* padded block: no gradient either way (block-uniform) */
        return;
    const int64_t row_at = r.row * d;   /* the row's offset in q, out, dout, dq (rows, nh, d) */

    float *qr = sq + warp * d, *dor = sdo + warp * d;   /* (d) each */
    float qreg[NC], doreg[NC], dq[NC];
    float D = 0.0f, lse = 0.0f;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int i = lane + 32 * cc;
        qreg[cc] = doreg[cc] = dq[cc] = 0.0f;
        if (r.has_row && i < d) {
            qreg[cc] = qr[i] = p.q[row_at + i];
            doreg[cc] = dor[i] = p.dout[row_at + i];
            D = fmaf(doreg[cc], p.out[row_at + i], D);
        }
    }
    D = warp_sum(D);
    if (r.has_row)
        lse = p.lse_in[r.row];

    for (int pass = 0; pass < r.npass; pass++) {
        const key_pass kp = pass_of(r, pass);
        for (int64_t t0 = kp.k0; t0 < kp.k1; t0 += kt) {
            const int n = (int)imin(kt, kp.k1 - t0);
            __syncthreads();   /* the previous tile and its sums are used up */
            load_tile(sk, p.k, t0, n, p.nkv, r.hk, d, ldt);
            load_tile(sv, p.v, t0, n, p.nkv, r.hk, d, ldt);
            for (int idx = (int)threadIdx.x; idx < n * ldt; idx += (int)blockDim.x)
                sdk[idx] = sdv[idx] = 0.0f;
            __syncthreads();
            if (r.has_row && kp.lo < kp.hi && kp.lo < t0 + n && kp.hi > t0) {   /* warp-uniform */
                /* the keys the row sees, as tile columns [c0, c1), 0 <= c0 < c1 <= n: lane l's
                 * key t0 + l is seen iff c0 <= l < c1 */
                const int c0 = (int)(imax(kp.lo, t0) - t0), c1 = (int)(imin(kp.hi, t0 + n) - t0);
                const bool vis = lane >= c0 && lane < c1;
                float pl = 0.0f, ds = 0.0f;
                if (vis) {
                    const float s = p.scale * dot_row(qr, sk + lane * ldt, d);
                    const float dp = dot_row(dor, sv + lane * ldt, d);
                    pl = expf(s - lse);
                    ds = pl * (dp - D) * p.scale;   /* carries s's scale for dq and dk */
                }
                for (int c = c0; c < c1; c++) {
                    const float pc = __shfl_sync(0xffffffffu, pl, c);
                    const float dsc = __shfl_sync(0xffffffffu, ds, c);
                    const float *kr = sk + c * ldt;
                    float *dkr = sdk + c * ldt, *dvr = sdv + c * ldt;
#pragma unroll
                    for (int cc = 0; cc < NC; cc++) {
                        const int i = lane + 32 * cc;
                        if (i < d) {
                            dq[cc] = fmaf(dsc, kr[i], dq[cc]);
                            atomicAdd(dvr + i, pc * doreg[cc]);
                            atomicAdd(dkr + i, dsc * qreg[cc]);
                        }
                    }
                }
            }
            __syncthreads();
            /* the tile's sums over this block's rows into dk, dv (see NON-DETERMINISM above):
             * a key row per warp, as load_tile */
            for (int c = warp; c < n; c += warps) {
                const int64_t key_at = ((t0 + c) * p.nkv + r.hk) * d;   /* key t0 + c, head hk */
                for (int i = lane; i < d; i += 32) {
                    const float gk = sdk[c * ldt + i], gv = sdv[c * ldt + i];
                    if (gk != 0.0f)
                        atomicAdd(p.dk + key_at + i, gk);
                    if (gv != 0.0f)
                        atomicAdd(p.dv + key_at + i, gv);
                }
            }
        }
    }
    if (!r.has_row)
        return;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int i = lane + 32 * cc;
        if (i < d)
            p.dq[row_at + i] += dq[cc];   /* this (row, head) is this warp's alone */
    }
}

/* ------------------------------------------------------------------------------------------
 * Host side: checks, shared-memory sizes, launches
 */

static constexpr size_t forward_smem(int64_t warps, int64_t d)
{
    return (size_t)(warps * d + 2 * KEY_TILE * (d + 1)) * sizeof(float);
}

static constexpr size_t backward_smem(int64_t warps, int64_t d, int64_t kt = KEY_TILE)
{
    return (size_t)(2 * warps * d + 4 * kt * (d + 1)) * sizeof(float);
}

/* The largest launch (ROWS_PER_CTA warps, d = MAX_D) fits H100/H200, whose opt-in limit for a
 * block is 227 KiB: DDK_CUDA_MAX_HEAD_DIM is a promise the GPUs we run on keep. At d = MAX_D the
 * backward takes 164,352 bytes (shared memory alone would allow d up to 362, the forward 725). */
enum { H100_SMEM_OPTIN = 232448 };
static_assert(forward_smem(ROWS_PER_CTA, MAX_D) <= H100_SMEM_OPTIN, "forward fits at MAX_D");
static_assert(backward_smem(ROWS_PER_CTA, MAX_D) <= H100_SMEM_OPTIN, "backward fits at MAX_D");
/* and with half tiles, a card of 99 KB a block (RTX PRO 6000, sm_120) */
static_assert(backward_smem(ROWS_PER_CTA, MAX_D, KEY_TILE / 2) <= 101376, "backward fits 99 KB at MAX_D");

/* the most dynamic shared memory a block of be's GPU may have */
static size_t smem_limit(void)
{
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return (size_t)bytes;
}

typedef void (*attn_kernel)(attn_params);

template <int NC>
static attn_kernel pick(int backward)
{
    return backward ? attn_backward_kernel<NC> : attn_forward_kernel<NC>;
}

static attn_kernel kernel_for(int64_t d, int backward)
{
    if (d <= 32)
        return pick<1>(backward);
    if (d <= 64)
        return pick<2>(backward);
    if (d <= 128)
        return pick<4>(backward);
    return pick<8>(backward);
}

/* Queues the kernel on be's stream (the backward with whole key tiles, or half ones where this
 * GPU's shared memory is smaller); -EINVAL when its shared memory does not fit this GPU. */
static int launch(const ddk_backend *be, const attn_params &shape_p, dim3 grid, int64_t warps,
                  int backward)
{
    cudaStream_t stream = ddk_cuda_stream(be);   /* also makes be's GPU current */
    const size_t limit = smem_limit();
    attn_params p = shape_p;
    p.kt = backward && backward_smem(warps, p.d) > limit ? KEY_TILE / 2 : KEY_TILE;
    const size_t smem = backward ? backward_smem(warps, p.d, p.kt) : forward_smem(warps, p.d);
    if (smem > limit)
        return -EINVAL;
    attn_kernel simt_attention = kernel_for(p.d, backward);
    if (smem > 48 * 1024) {
        /* the instance's largest need (all warps, its widest d), so that two threads launching
         * the same instance with different shapes never lower it under each other */
        const int64_t d_inst = p.d <= 32 ? 32 : p.d <= 64 ? 64 : p.d <= 128 ? 128 : MAX_D;
        size_t most = backward ? backward_smem(ROWS_PER_CTA, d_inst) : forward_smem(ROWS_PER_CTA, d_inst);
        most = most < limit ? most : limit;
        CUDA_CHECK(cudaFuncSetAttribute((const void *)simt_attention,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    }
    DDK_LAUNCH(simt_attention, grid, (unsigned)(warps * 32), smem, stream, p);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}

static int heads_ok(const ddk_attention_shape *sh)
{
    return sh->nh >= 1 && sh->nkv >= 1 && sh->nh % sh->nkv == 0 && sh->nh <= MAX_GRID_YZ &&
           sh->d >= 1 && sh->d <= MAX_D;
}

static int dflash_shape_ok(const ddk_attention_shape *sh)
{
    return heads_ok(sh) && sh->S >= 0 && sh->A >= 0 && sh->A <= INT32_MAX && sh->B >= 1 &&
           (sh->B + ROWS_PER_CTA - 1) / ROWS_PER_CTA <= MAX_GRID_YZ && sh->window >= 0;
}

static attn_params dflash_params(const ddk_attention_shape *sh)
{
    attn_params p = {};
    p.S = sh->S;
    p.B = sh->B;
    p.nh = sh->nh;
    p.nkv = sh->nkv;
    p.d = sh->d;
    p.W = sh->window;
    p.bidir = sh->bidirectional != 0;
    p.scale = (float)(1.0 / sqrt((double)sh->d));
    return p;
}

static int dflash_launch(const ddk_backend *be, const ddk_attention_shape *sh,
                         const attn_params &p, int backward)
{
    const int64_t warps = sh->B < ROWS_PER_CTA ? sh->B : (int64_t)ROWS_PER_CTA;
    const dim3 grid((unsigned)sh->A, (unsigned)sh->nh,
                    (unsigned)((sh->B + ROWS_PER_CTA - 1) / ROWS_PER_CTA));
    return launch(be, p, grid, warps, backward);
}

/* What the DFlash forward and backward share: the shape checked and the inputs set.
 * 0 ready, 1 nothing to do (A = 0), -EINVAL. */
static int dflash_inputs(const ddk_attention_shape *shape, const float *q, const float *k,
                         const float *v, const int32_t *anchors, const uint8_t *keep, attn_params *p)
{
    if (!dflash_shape_ok(shape))
        return -EINVAL;
    if (shape->A == 0)
        return 1;
    *p = dflash_params(shape);
    p->q = q;
    p->k = k;
    p->v = v;
    p->anchors = anchors;
    p->keep = keep;
    return 0;
}

/* The flash kernels said -ENOTSUP (no instance takes the shape on this GPU): the SIMT ones run
 * instead, and ddk_cuda_fallbacks says so */
static void fell_back(const char *op, const ddk_attention_shape *sh, int64_t keys)
{
    int device = 0, major = 0, minor = 0, smem = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    char what[320];
    snprintf(what, sizeof what,
             "%s at head dim %lld over %lld keys on GPU %d (sm_%d%d, %d bytes of shared memory a "
             "block) ran the SIMT attention kernels: no tensor-core instance takes it (slower; "
             "the backward's float atomics are not the same bits at every call)",
             op, (long long)sh->d, (long long)keys, device, major, minor, smem);
    ddk_cuda_note_fallback(what);
}

/* The tensor-core kernels (attention_flash.cu) unless DDTREE_CUDA_ATTENTION or
 * ddk_cuda_set_attention_kernels asked for these, or be's GPU is older than sm_80 (ddk.h) */
static int use_flash(const ddk_backend *be)
{
    if (ddk_cuda_attention_kernels() == DDK_CUDA_ATTENTION_SIMT)
        return 0;
    int device = 0, major = 0;
    ddk_cuda_stream(be);   /* be's GPU current */
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    return major >= 8;
}

int ddk_cuda_dflash_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                              const float *q, const float *k, const float *v,
                              const int32_t *anchors, const uint8_t *keep, float *out, float *lse)
{
    attn_params p;
    int rc = dflash_inputs(shape, q, k, v, anchors, keep, &p);
    if (rc)
        return rc > 0 ? 0 : rc;
    if (use_flash(be)) {
        rc = ddk_cuda_flash_dflash(be, shape, q, k, v, anchors, keep, out, lse);
        if (rc != -ENOTSUP)
            return rc;
        fell_back("dflash_attention", shape, shape->S + shape->A * shape->B);
    }
    p.y = out;
    p.lse = lse;
    return dflash_launch(be, shape, p, 0);
}

int ddk_cuda_dflash_attention_backward(const ddk_backend *be, const ddk_attention_shape *shape,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *anchors, const uint8_t *keep,
                                       const float *out, const float *lse, const float *dout,
                                       float *dq, float *dk, float *dv)
{
    attn_params p;
    int rc = dflash_inputs(shape, q, k, v, anchors, keep, &p);
    if (rc)
        return rc > 0 ? 0 : rc;
    if (use_flash(be)) {
        rc = ddk_cuda_flash_dflash_backward(be, shape, q, k, v, anchors, keep, out, lse, dout, dq,
                                            dk, dv);
        if (rc != -ENOTSUP)
            return rc;
        fell_back("dflash_attention_backward", shape, shape->S + shape->A * shape->B);
    }
    p.out = out;
    p.lse_in = lse;
    p.dout = dout;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    return dflash_launch(be, shape, p, 1);
}

int ddk_cuda_causal_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                              const float *q, const float *k, const float *v, float *out)
{
    if (!heads_ok(shape) || shape->S < 0 || shape->q_rows < 0 || shape->q_rows > shape->S)
        return -EINVAL;
    /* T query rows, the last of S positions; a decoding step (T = 1) takes one warp a head */
    const int64_t T = shape->q_rows ? shape->q_rows : shape->S;
    const int64_t warps = T < ROWS_PER_CTA ? T : (int64_t)ROWS_PER_CTA;
    const int64_t blocks = warps ? (T + warps - 1) / warps : 0;
    if (blocks > INT32_MAX)
        return -EINVAL;
    if (T == 0)
        return 0;
    if (use_flash(be)) {
        const int rc = ddk_cuda_flash_causal(be, shape, q, k, v, out);
        if (rc != -ENOTSUP)
            return rc;
        fell_back("causal_attention", shape, shape->S);
    }
    attn_params p = {};
    p.q = q;
    p.k = k;
    p.v = v;
    p.y = out;
    p.lse = NULL;
    p.nh = shape->nh;
    p.nkv = shape->nkv;
    p.d = shape->d;
    p.S = shape->S;
    p.T = T;
    p.p0 = shape->S - T;
    p.causal = 1;
    p.scale = (float)(1.0 / sqrt((double)shape->d));
    return launch(be, p, dim3((unsigned)blocks, (unsigned)shape->nh, 1), warps, 0);
}

/* ------------------------------------------------------------------------------------------
 * Tree attention (the target's DDTree verify), forward only: N node rows, the last N of S keys,
 * after P = S - N cached ones; node i sees the cache and its root path. One thread block per
 * (node i, query head h), TREE_WARPS warps:
 *   1. thread 0 walks the path i, parents[i], ... (parents in device memory) into shared memory,
 *      at most N steps (parents[j] < j makes it at most i + 1). A parent outside [-1, j) ends
 *      the walk and the row is written as NaN: the CPU refuses such a tree with -EINVAL, this
 *      side cannot see the parents without a copy and a synchronisation, and a NaN row is loud.
 *   2. the block's keys are c = 0 .. P + L - 1 (L the path's length), key c at row c < P ? c :
 *      P + path[c - P]. Warp w takes the chunks of 32 keys w, w + warps, ...: each score is a
 *      dot product over d by the whole warp (lane l holds q elements l, l + 32, ..., coalesced
 *      key reads) reduced by shuffles, lane c keeping key c's; then the online softmax of the
 *      kernels above, per warp (running max m, sum l, accumulator in registers).
 *   3. the warps' (m, l, acc) are combined through shared memory: M = max m_w,
 *      out = sum_w acc_w exp(m_w - M) / sum_w l_w exp(m_w - M). A warp that saw no key has
 *      m = -inf, l = 0, acc = 0 and adds nothing; some warp saw node i itself, so M is finite.
 * Plainly correct, not tuned: no key tiles in shared memory, nor tensor cores. out (N, nh, d) fp32.
 */

enum { TREE_WARPS = 8 };

typedef struct tree_params {
    const float *q, *k, *v;    /* q (N, nh, d); k, v (S, nkv, d) */
    const int32_t *parents;    /* (N), device memory */
    float *y;                  /* out (N, nh, d) */
    int64_t N, P, nh, nkv, d;  /* P = S - N cached keys */
    float scale;
} tree_params;

template <int NC>
__global__ void __launch_bounds__(TREE_WARPS * 32) tree_forward_kernel(tree_params p)
{
    /* dynamic only (tree_smem): a static __shared__ would count against the opt-in limit the
     * launch gives the dynamic part */
    DDK_DYNAMIC_SHARED(float, smem);
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    const int d = (int)p.d;   /* d <= MAX_D (heads_ok) */
    const int64_t i = blockIdx.x, h = blockIdx.y, hk = h / (p.nh / p.nkv);
    int *walk = (int *)smem;               /* (2) the path's length, 1 if a parent was bad */
    float *wm = smem + 2, *wl = wm + warps;   /* (warps) each warp's running max and sum */
    float *wacc = wl + warps;              /* (warps, d) each warp's accumulator */
    int *path = (int *)(wacc + warps * d); /* (N) node indices of the root path, i first */
    const int64_t row_at = (i * p.nh + h) * d;   /* the row's offset in q and out (N, nh, d) */

    if (threadIdx.x == 0) {
        int len = 0, bad = 0;
        for (int64_t node = i; node >= 0 && len < p.N;) {
            path[len++] = (int)node;
            const int64_t parent = p.parents[node];
            if (parent < -1 || parent >= node) {
                bad = 1;
                break;
            }
            node = parent;
        }
        walk[0] = len;
        walk[1] = bad;
    }
    __syncthreads();
    const int path_len = walk[0];
    if (walk[1]) {   /* block-uniform */
        for (int idx = (int)threadIdx.x; idx < d; idx += (int)blockDim.x)
            p.y[row_at + idx] = NAN;
        return;
    }

    float qreg[NC], acc[NC], m = -INFINITY, l = 0.0f;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int e = lane + 32 * cc;
        qreg[cc] = e < d ? p.q[row_at + e] : 0.0f;
        acc[cc] = 0.0f;
    }
    const int64_t keys = p.P + path_len;
    for (int64_t c0 = (int64_t)warp * 32; c0 < keys; c0 += (int64_t)warps * 32) {
        const int n = (int)imin(32, keys - c0);
        /* lane c's key row (lanes >= n: unused) */
        const int64_t c = c0 + lane;
        const int64_t key = c < p.P ? c : lane < n ? p.P + path[c - p.P] : 0;
        float s_mine = -INFINITY;
        for (int j = 0; j < n; j++) {
            const int64_t kj = __shfl_sync(0xffffffffu, key, j);
            const float *kr = p.k + (kj * p.nkv + hk) * d;   /* (d) */
            float part = 0.0f;
#pragma unroll
            for (int cc = 0; cc < NC; cc++) {
                const int e = lane + 32 * cc;
                if (e < d)
                    part = fmaf(qreg[cc], kr[e], part);
            }
            const float s = p.scale * warp_sum(part);
            if (lane == j)
                s_mine = s;
        }
        const float m_new = fmaxf(m, warp_max(s_mine));   /* finite: n >= 1 */
        const float pl = lane < n ? expf(s_mine - m_new) : 0.0f;
        const float rescale = expf(m - m_new);           /* m = -inf first: 0 */
        l = l * rescale + warp_sum(pl);
        m = m_new;
#pragma unroll
        for (int cc = 0; cc < NC; cc++)
            acc[cc] *= rescale;
        for (int j = 0; j < n; j++) {
            const float pj = __shfl_sync(0xffffffffu, pl, j);
            const int64_t kj = __shfl_sync(0xffffffffu, key, j);
            const float *vr = p.v + (kj * p.nkv + hk) * d;   /* (d) */
#pragma unroll
            for (int cc = 0; cc < NC; cc++) {
                const int e = lane + 32 * cc;
                if (e < d)
                    acc[cc] = fmaf(pj, vr[e], acc[cc]);
            }
        }
    }

    if (lane == 0) {
        wm[warp] = m;
        wl[warp] = l;
    }
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int e = lane + 32 * cc;
        if (e < d)
            wacc[warp * d + e] = acc[cc];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < warps; w++)
        M = fmaxf(M, wm[w]);
    float L = 0.0f;
    for (int w = 0; w < warps; w++)
        L += wl[w] * expf(wm[w] - M);   /* a warp without keys: 0 * 0 */
    const float inv = 1.0f / L;
    for (int e = (int)threadIdx.x; e < d; e += (int)blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < warps; w++)
            o = fmaf(wacc[w * d + e], expf(wm[w] - M), o);
        p.y[row_at + e] = o * inv;
    }
}

static size_t tree_smem(int64_t warps, int64_t d, int64_t N)
{
    return (size_t)(2 + 2 * warps + warps * d) * sizeof(float) + (size_t)N * sizeof(int);
}

typedef void (*tree_kernel)(tree_params);

static tree_kernel tree_kernel_for(int64_t d)
{
    if (d <= 32)
        return tree_forward_kernel<1>;
    if (d <= 64)
        return tree_forward_kernel<2>;
    if (d <= 128)
        return tree_forward_kernel<4>;
    return tree_forward_kernel<8>;
}

int ddk_cuda_tree_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                            const float *q, const float *k, const float *v, const int32_t *parents,
                            float *out)
{
    if (!heads_ok(shape) || shape->q_rows < 1 || shape->q_rows > shape->S ||
        shape->q_rows > INT32_MAX)
        return -EINVAL;
    cudaStream_t stream = ddk_cuda_stream(be);   /* also makes be's GPU current */
    const size_t smem = tree_smem(TREE_WARPS, shape->d, shape->q_rows), limit = smem_limit();
    if (smem > limit)   /* a tree of some 50,000 nodes on H100/H200 */
        return -EINVAL;
    tree_kernel tree_forward = tree_kernel_for(shape->d);
    /* the limit, not this call's need, so that a concurrent launch never lowers it */
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute((const void *)tree_forward,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)limit));
    tree_params p = {};
    p.q = q;
    p.k = k;
    p.v = v;
    p.parents = parents;
    p.y = out;
    p.N = shape->q_rows;
    p.P = shape->S - shape->q_rows;
    p.nh = shape->nh;
    p.nkv = shape->nkv;
    p.d = shape->d;
    p.scale = (float)(1.0 / sqrt((double)shape->d));
    const dim3 grid((unsigned)p.N, (unsigned)p.nh, 1);
    DDK_LAUNCH(tree_forward, grid, TREE_WARPS * 32, smem, stream, p);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
