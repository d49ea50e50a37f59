/* attention_flash.cu: DFlash attention (forward and backward) and the target's causal attention
 * (forward) on the tensor cores: bf16 operands, fp32 softmax statistics and accumulation,
 * mma.sync m16n8k16 (sm_80 and later; the build's archs are sm_90, sm_100 and sm_120). Contracts in
 * ddk.h (struct ddk_backend); attention_cuda.cu checks the shapes, picks these kernels or its
 * SIMT ones (ddk_cuda_attention_kernels, DDTREE_CUDA_ATTENTION) and calls in here.
 *
 * Design (FlashAttention-2's, on mma.sync, no ldmatrix, no cp.async, no wgmma: the first
 * tensor-core version, to be measured before it is made cleverer):
 *   - The inputs are fp32 in global memory; each tile is read once by the thread block, rounded
 *     to bf16 (round to nearest even) and stored in shared memory in the layout its mma operand
 *     wants, transposed where the product needs it (so every fragment is one 32-bit shared load of
 *     two adjacent bf16). Rows are padded by 8 bf16 (16 bytes): a row stride of 4 (mod 32) words
 *     puts the 8 rows x 4 words of a fragment load on 32 distinct banks.
 *   - Query-major kernels (forward, and the backward's dq pass): one thread block per (anchor
 *     block j, kv head) covering every query row of the group, rows r = o * G + hh (slot o, query
 *     head hk * G + hh): B * G rows (96 at the seed's B 24, G 4), split over several blocks (as
 *     even as 16-row warps allow) only past 96 rows at d <= 128 (128 for the forward and 64 for
 *     the dq pass at d 256). Causal attention: the T * G rows (position, head) of one kv head in
 *     blocks of that size. One warp per 16 rows; K/V tiles of KT keys
 *     (64; 32 at d 256) are loaded once per block and used by all its warps. Rows see one
 *     contiguous key range per pass (attention_rows.h), so a tile that every row of a warp sees
 *     whole needs no mask, one it sees in part is masked per element, one it does not see at all
 *     is skipped by the warp. Online softmax in base 2 (s log2(e) / sqrt(d)), fp32.
 *   - Backward, no atomics: D = rowsum(dout * out) and lse are formed per block as its rows are
 *     loaded. dq: the query-major pass above recomputes p = exp(s - lse) and ds = p (dp - D) and
 *     keeps dq in registers (one block owns each (row, head)). dk, dv: a key-major pass, one
 *     thread block per (tile of 64 keys, kv head) (32 keys at d 256), each warp owning 16 keys
 *     (at d 256 two warps share 16 keys, each with half of the columns), dk and dv in registers;
 *     it walks the blocks that see its keys (context tiles: every kept block whose rows see
 *     part of the tile, anchors in any order; a block's own slots: that block), 64 of their query
 *     rows at a time (32 at d 256). Every output element is written by one thread in a fixed
 *     order: the results are the same bits at every call on a given GPU and shape.
 *   - Work order: blocks with later anchors (more context) and the first context key tiles (seen
 *     by the most blocks) are launched first.
 * Resources per thread block (shared bytes at the largest R, formulas in *_smem below; registers
 * from ptxas -v, CUDA 13.0, sm_90 / sm_100, no stack frame and no spill in any instance; blocks
 * per SM on H100/H200: 227 KiB of shared memory, 64 K registers):
 *   forward  d 64: 192 threads, 166 / 168 registers, 2 blocks; d 128: 192 threads, 167 / 163,
 *            61,952 B: 2 blocks (12 warps); d 256: 256 threads, 238 / 244, 104,960 B: 1 (8 warps)
 *   dq       d 64: 192 threads, 166 / 168: 2; d 128: 192 threads, 238 / 254, 106,240 B: 1 block
 *            (6 warps: two would cap it at 168 registers and spill); d 256: 128 threads,
 *            242 / 242, 122,368 B: 1
 *   dk / dv  128 threads: d 64 151 / 166, 56,832 B; d 128 239 / 240, 108,032 B: 2 blocks
 *            (8 warps); d 256 241 / 238, 109,312 B: 2 blocks
 * On a card with 99 KB of shared memory a block (RTX PRO 6000, sm_120: ddk_device_profile) the
 * instances are chosen from the GPU's opt-in limit at run time (ddk_cuda_flash_instances): the
 * query-major blocks take fewer rows (forward at most 112 at d 256: 96,512 B; dq 80 at d 128:
 * 97,408 B, 32 at d 256: 88,320 B), the key-major pass half its query chunk (RQ 32 at d 128:
 * 73,472 B, 16 at d 256: 75,648 B: two instances more). The same code, the same bits at every
 * call; only the split of the work differs. ddk_cuda_instances says what a GPU got.
 * The loops along d are unrolled by 2 only: fully unrolled, the nine instances for two archs
 * added 4 MB to libddk.so and the GPU bundle passed its 60 MiB cap.
 *
 * Head dims: instances for D = 64, 128, 256; a head dim d <= D runs on the smallest D >= d with
 * the columns past d zero (exact: they add nothing to a score and are never stored). Refused
 * (-ENOTSUP, the caller runs the SIMT kernels and says so: ddk_cuda_fallbacks): d > 256, S + A B
 * or T past 2^30, a GPU without the shared memory for 16 rows, or below sm_80.
 *
 * Numerics against the CPU's fp32: q, k, v, dout rounded to bf16 (2^-9 relative each), the
 * probabilities rounded to bf16 before p v, ds before ds k and ds^T q; every sum fp32. Tested by
 * tests/kernels/test_backend_ops.c against the CPU backend at bf16 tolerances (skipped without a GPU),
 * including two identical backward calls giving the same bits; the row rules by
 * tests/kernels/test_attention.c on the CPU; and without a GPU, from this source, by the SIMT emulation
 * under each card's limits (tests/simt/test_simt_kernels.cpp: the instances each card gets, the
 * same bits with blocks and threads run in the reverse order).
 *
 * Legend: S context rows, A blocks, B block size, nh / nkv heads, G = nh / nkv, d head dim,
 * D the instance's padded head dim, KT keys of a query-major tile, KTB of a key-major tile,
 * R rows of a query-major block, RQ query rows of a key-major chunk, g = lane / 4, t4 = lane % 4
 * (the mma fragment coordinates).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"
#include "attention_rows.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.69314718055994531f;
constexpr int MAX_ROWS = 128;   /* query rows of a query-major block (8 warps) */
constexpr int PAD = 8;          /* bf16 of padding per shared row */
/* query rows of a query-major block: 96 (6 warps) at D <= 128, so that two blocks' registers fit
 * an SM (<= 168 a thread: __launch_bounds__), 128 at D 256 (one block) */
constexpr int fwd_max_rows(int D) { return D == 256 ? MAX_ROWS : 96; }
constexpr int dq_max_rows(int D) { return D == 256 ? 64 : 96; }
/* blocks per SM the dq kernel's registers must allow: 2 at D 64 (166 registers); at D 128 two
 * would cap it at 168 and spill (216 bytes, ptxas on sm_90), so one (238 registers) */
constexpr int dq_min_blocks(int D) { return D == 64 ? 2 : 1; }

struct flash_params {
    const float *q, *k, *v;    /* q (rows, nh, d); k, v (keys, nkv, d) */
    const int32_t *anchors;    /* DFlash (A) */
    const uint8_t *keep;       /* DFlash (A) */
    const float *out, *dout;   /* backward (rows, nh, d) */
    const float *lse_in;       /* backward (rows, nh) */
    float *y, *lse;            /* forward: out, lse (DFlash) or NULL (causal) */
    float *dq, *dk, *dv;       /* backward */
    int64_t S, A, B, nh, nkv, d, W, G;
    int bidir;                 /* DFlash: a block's rows see all its slots also when W > 0 */
    int64_t rows_unit;         /* query rows of one kv head's unit: B G (block j) or T G (causal) */
    int64_t p0;                /* causal: position of query 0 */
    int64_t n_ctx_tiles;       /* key-major: tiles of the context, then n_own_tiles per block */
    int64_t n_own_tiles;
    int causal;
    int rows_cta;              /* R: rows of a query-major block, a multiple of 16 */
    int vec;                   /* d % 4 == 0 and every fp32 tensor 16-byte aligned: float4 loads */
    float scale, scale_log2;
};

/* ------------------------------------------------------------------------------------------
 * Fragments and the product
 */

__device__ __forceinline__ uint32_t ld32(const uint16_t *p)
{
    return *reinterpret_cast<const uint32_t *>(p);
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);   /* .x (lo) in the low half */
    return *reinterpret_cast<const uint32_t *>(&v);
}

__device__ __forceinline__ uint16_t bf16_bits(float x)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(x));
}

/* c (16 x 8, fp32) += a (16 x 16, bf16, row) b (16 x 8, bf16, col) */
__device__ __forceinline__ void mma16816(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
#ifdef DDK_SIMT
    const uint32_t a[4] = { a0, a1, a2, a3 }, b[2] = { b0, b1 };
    simt::mma_m16n8k16_bf16(c, a, b, __FILE__, __LINE__);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

/* A fragment (rows m0.., k cols k0..) of a row-major [m][k] bf16 tile with row stride ld:
 * a[0] (g, 2t4), a[1] (g + 8, 2t4), a[2] (g, 2t4 + 8), a[3] (g + 8, 2t4 + 8), two values each */
__device__ __forceinline__ void frag_a(uint32_t a[4], const uint16_t *s, int ld, int m0, int k0,
                                       int g, int t4)
{
    const uint16_t *p = s + (m0 + g) * ld + k0 + 2 * t4;
    a[0] = ld32(p);
    a[1] = ld32(p + 8 * ld);
    a[2] = ld32(p + 8);
    a[3] = ld32(p + 8 * ld + 8);
}

/* B fragment (n cols n0.., k rows k0..) from an [n][k] bf16 tile (B's column n contiguous in k):
 * b[0] (k 2t4, n g), b[1] (k 2t4 + 8, n g) */
__device__ __forceinline__ void frag_b(uint32_t b[2], const uint16_t *s, int ld, int n0, int k0,
                                       int g, int t4)
{
    const uint16_t *p = s + (n0 + g) * ld + k0 + 2 * t4;
    b[0] = ld32(p);
    b[1] = ld32(p + 8);
}

/* acc (16 x D, this warp's C fragments) += S B: S (16 x KT) this warp's C fragments of a
 * previous product (those of key columns 16 kk.. are the A fragment of k-step kk, rounded to
 * bf16), B (KT x D) from an [n][k] bf16 tile (frag_b) */
template <int KT, int D>
__device__ __forceinline__ void mma_c_as_a(float (*acc)[4], const float (*s)[4], const uint16_t *sB, int ld,
                                           int g, int t4)
{
#pragma unroll
    for (int kk = 0; kk < KT / 16; kk++) {
        const uint32_t a0 = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        const uint32_t a1 = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        const uint32_t a2 = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        const uint32_t a3 = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++) {
            uint32_t b[2];
            frag_b(b, sB, ld, nt * 8, kk * 16, g, t4);
            mma16816(acc[nt], a0, a1, a2, a3, b[0], b[1]);
        }
    }
}

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int off = 16; off > 0; off >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, off);
    return x;
}

/* ------------------------------------------------------------------------------------------
 * Rows and tiles
 */

/* A query row of kv head hk: its offset row (in (rows, nh)) and the keys it sees; unit row u
 * of block j (DFlash) or of the causal queries. Rows past the unit see nothing. */
struct qrow {
    int64_t gr;
    ddk_row_keys keys;
    int valid;
};

__device__ qrow row_of(const flash_params &p, int64_t hk, int64_t j, int64_t u)
{
    qrow r;
    r.valid = u < p.rows_unit;
    r.gr = 0;
    r.keys.ctx_lo = r.keys.ctx_hi = r.keys.own_lo = r.keys.own_hi = 0;
    if (!r.valid)
        return r;
    const int64_t i = u / p.G, hh = u % p.G;
    if (p.causal) {
        r.gr = i * p.nh + hk * p.G + hh;
        r.keys = ddk_causal_row_keys(p.p0, i);
    } else {
        r.gr = (j * p.B + i) * p.nh + hk * p.G + hh;
        r.keys = ddk_dflash_row_keys(p.S, p.B, p.W, p.bidir, j, p.anchors[j], i);
    }
    return r;
}

__device__ __forceinline__ int64_t gr_of(const flash_params &p, int64_t hk, int64_t j, int64_t u)
{
    const int64_t i = u / p.G, hh = u % p.G;
    return (p.causal ? i : j * p.B + i) * p.nh + hk * p.G + hh;
}

/* a row's key ranges in 32 bits (keys < 2^30: flash_common), x/y the context, z/w its own */
__device__ __forceinline__ int4 keys32(const qrow &r)
{
    return make_int4((int)r.keys.ctx_lo, (int)r.keys.ctx_hi, (int)r.keys.own_lo, (int)r.keys.own_hi);
}

__device__ __forceinline__ bool sees_key(const int4 &k, int t)
{
    return (t >= k.x && t < k.y) || (t >= k.z && t < k.w);
}

__device__ __forceinline__ bool sees_any(const int4 &k, int t0, int t1)
{
    return (k.x < k.y && k.x < t1 && k.y > t0) || (k.z < k.w && k.z < t1 && k.w > t0);
}

__device__ __forceinline__ bool sees_all(const int4 &k, int t0, int t1)
{
    return (k.x <= t0 && k.y >= t1) || (k.z <= t0 && k.w >= t1);
}

/* Rows [0, nrows) of a bf16 tile from fp32 rows of d values: row r at src + off(r) (off < 0: a
 * row of zeros), columns d..D-1 zero. dst (nrows, ld) row-major and / or dst_t (D, ldt) its
 * transpose (either may be NULL). By the whole thread block, 4 columns a thread at a time. */
template <int D, typename Off>
__device__ void load_tile(uint16_t *dst, int ld, uint16_t *dst_t, int ldt, const float *src,
                          int nrows, int d, int vec, Off off)
{
    constexpr int C4 = D / 4;
    for (int idx = (int)threadIdx.x; idx < nrows * C4; idx += (int)blockDim.x) {
        const int r = idx / C4, c = idx % C4 * 4;
        const int64_t o = off(r);
        float x[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
        if (o >= 0 && c < d) {
            if (vec) {   /* d % 4 == 0: the 4 columns are all inside the row */
                const float4 f = *reinterpret_cast<const float4 *>(src + o + c);
                x[0] = f.x;
                x[1] = f.y;
                x[2] = f.z;
                x[3] = f.w;
            } else {
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (c + e < d)
                        x[e] = src[o + c + e];
            }
        }
        uint16_t h[4];
#pragma unroll
        for (int e = 0; e < 4; e++)
            h[e] = bf16_bits(x[e]);
        if (dst)
            *reinterpret_cast<uint2 *>(dst + r * ld + c) =
                make_uint2((uint32_t)h[0] | (uint32_t)h[1] << 16, (uint32_t)h[2] | (uint32_t)h[3] << 16);
        if (dst_t) {
#pragma unroll
            for (int e = 0; e < 4; e++)
                dst_t[(c + e) * ldt + r] = h[e];
        }
    }
}

/* The query-major block's place: kv head, block j (DFlash; the last anchors first) and its
 * first unit row */
struct qplace {
    int64_t hk, j, r0;
};

__device__ qplace place_of(const flash_params &p)
{
    qplace q;
    q.hk = blockIdx.y;
    if (p.causal) {
        q.j = 0;
        q.r0 = (int64_t)(gridDim.x - 1 - blockIdx.x) * p.rows_cta;
    } else {
        q.j = p.A - 1 - (int64_t)blockIdx.x;
        q.r0 = (int64_t)blockIdx.z * p.rows_cta;
    }
    return q;
}

/* ------------------------------------------------------------------------------------------
 * Forward. Shared: sQ (R, D + PAD), sK (KT, D + PAD), sVt (D, KT + PAD).
 */

template <int D, int KT>
__global__ void __launch_bounds__(fwd_max_rows(D) * 2, D == 256 ? 1 : 2) flash_forward_kernel(flash_params p)
{
    DDK_DYNAMIC_SHARED(uint4, smem_raw);
    constexpr int LDQ = D + PAD, LDV = KT + PAD;
    const int R = p.rows_cta, d = (int)p.d;
    uint16_t *sQ = reinterpret_cast<uint16_t *>(smem_raw), *sK = sQ + R * LDQ, *sVt = sK + KT * LDQ;
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const qplace pl = place_of(p);
    const int64_t rlast = (pl.r0 + R < p.rows_unit ? pl.r0 + R : p.rows_unit) - 1;

    if (!p.causal && !p.keep[pl.j]) {   /* padded block: out and lse 0 (block-uniform) */
        for (int64_t idx = threadIdx.x; idx < (rlast - pl.r0 + 1) * p.d; idx += blockDim.x) {
            const int64_t u = pl.r0 + idx / p.d;
            p.y[gr_of(p, pl.hk, pl.j, u) * p.d + idx % p.d] = 0.0f;
            if (idx % p.d == 0 && p.lse)
                p.lse[gr_of(p, pl.hk, pl.j, u)] = 0.0f;
        }
        return;
    }
    const qrow ra = row_of(p, pl.hk, pl.j, pl.r0 + warp * 16 + g);
    const qrow rb = row_of(p, pl.hk, pl.j, pl.r0 + warp * 16 + g + 8);
    const int4 ka = keys32(ra), kb = keys32(rb);
    const qrow first = row_of(p, pl.hk, pl.j, pl.r0), last = row_of(p, pl.hk, pl.j, rlast);
    const int pass_k0[2] = { (int)first.keys.ctx_lo, (int)first.keys.own_lo };
    const int pass_k1[2] = { (int)last.keys.ctx_hi, (int)last.keys.own_hi };
    load_tile<D>(sQ, LDQ, (uint16_t *)nullptr, 0, p.q, R, d, p.vec, [&](int r) -> int64_t {
        const int64_t u = pl.r0 + r;
        return u < p.rows_unit ? gr_of(p, pl.hk, pl.j, u) * p.d : -1;
    });

    float acc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;
    float m_a = -INFINITY, m_b = -INFINITY, l_a = 0.0f, l_b = 0.0f;   /* l: this thread's part */

    for (int pass = 0; pass < 2; pass++) {
        /* the union of the block's rows' ranges (monotone in the row: attention_rows.h) */
        const int k0 = pass ? pass_k0[1] : pass_k0[0], k1 = pass ? pass_k1[1] : pass_k1[0];
        for (int t0 = k0; t0 < k1; t0 += KT) {
            const int n = k1 - t0 < KT ? k1 - t0 : KT;
            __syncthreads();   /* the previous tile is used up (first time: sQ stored) */
            auto key_at = [&](int c) -> int64_t { return c < n ? ((int64_t)(t0 + c) * p.nkv + pl.hk) * p.d : -1; };
            load_tile<D>(sK, LDQ, (uint16_t *)nullptr, 0, p.k, KT, d, p.vec, key_at);
            load_tile<D>((uint16_t *)nullptr, 0, sVt, LDV, p.v, KT, d, p.vec, key_at);
            __syncthreads();
            if (!__any_sync(0xffffffffu, sees_any(ka, t0, t0 + n) || sees_any(kb, t0, t0 + n)))
                continue;   /* warp-uniform */
            const bool whole = __all_sync(0xffffffffu, n == KT && ra.valid && rb.valid &&
                                                           sees_all(ka, t0, t0 + KT) && sees_all(kb, t0, t0 + KT));
            float s[KT / 8][4];
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
                s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll 2   /* along d: smem addresses only, so a short loop (code size: the bundle's cap) */
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4];
                frag_a(a, sQ, LDQ, warp * 16, kk * 16, g, t4);
#pragma unroll
                for (int nt = 0; nt < KT / 8; nt++) {
                    uint32_t b[2];
                    frag_b(b, sK, LDQ, nt * 8, kk * 16, g, t4);
                    mma16816(s[nt], a[0], a[1], a[2], a[3], b[0], b[1]);
                }
            }
            float mx_a = -INFINITY, mx_b = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = nt * 8 + 2 * t4 + (e & 1);
                    float x = s[nt][e] * p.scale_log2;
                    if (!whole && !(c < n && sees_key(e < 2 ? ka : kb, t0 + c)))
                        x = -INFINITY;
                    s[nt][e] = x;
                    if (e < 2)
                        mx_a = fmaxf(mx_a, x);
                    else
                        mx_b = fmaxf(mx_b, x);
                }
            mx_a = fmaxf(m_a, quad_max(mx_a));
            mx_b = fmaxf(m_b, quad_max(mx_b));
            /* a row that has seen nothing yet keeps -inf: exponents against 0 give 0 */
            const float use_a = mx_a == -INFINITY ? 0.0f : mx_a, use_b = mx_b == -INFINITY ? 0.0f : mx_b;
            const float alpha_a = exp2f(m_a - use_a), alpha_b = exp2f(m_b - use_b);
            m_a = mx_a;
            m_b = mx_b;
            float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++) {
                s[nt][0] = exp2f(s[nt][0] - use_a);
                s[nt][1] = exp2f(s[nt][1] - use_a);
                s[nt][2] = exp2f(s[nt][2] - use_b);
                s[nt][3] = exp2f(s[nt][3] - use_b);
                sum_a += s[nt][0] + s[nt][1];
                sum_b += s[nt][2] + s[nt][3];
            }
            l_a = l_a * alpha_a + sum_a;
            l_b = l_b * alpha_b + sum_b;
#pragma unroll
            for (int nt = 0; nt < D / 8; nt++) {
                acc[nt][0] *= alpha_a;
                acc[nt][1] *= alpha_a;
                acc[nt][2] *= alpha_b;
                acc[nt][3] *= alpha_b;
            }
            /* acc += p v */
            mma_c_as_a<KT, D>(acc, s, sVt, LDV, g, t4);
        }
    }
    l_a = quad_sum(l_a);
    l_b = quad_sum(l_b);
    /* every row of a kept block sees its own slot 0 (causal: key 0): l > 0 */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const qrow &r = half ? rb : ra;
        const float l = half ? l_b : l_a, m = half ? m_b : m_a;
        if (!r.valid)
            continue;
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *yr = p.y + r.gr * p.d;   /* (d) */
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = nt * 8 + 2 * t4 + e;
                if (col < d)
                    yr[col] = acc[nt][2 * half + e] * inv;
            }
        if (t4 == 0 && p.lse)
            p.lse[r.gr] = l > 0.0f ? (m + log2f(l)) * LN2 : -INFINITY;
    }
}

/* ------------------------------------------------------------------------------------------
 * Backward, dq (query-major). Shared: sQ, sdO (R, D + PAD); sK, sV (KT, D + PAD);
 * sKt (D, KT + PAD); then fp32 lse (base 2) and D of the R rows.
 */

template <int D, int KT>
__global__ void __launch_bounds__(dq_max_rows(D) * 2, dq_min_blocks(D)) flash_dq_kernel(flash_params p)
{
    DDK_DYNAMIC_SHARED(uint4, smem_raw);
    constexpr int LDQ = D + PAD, LDT = KT + PAD;
    const int R = p.rows_cta, d = (int)p.d;
    uint16_t *sQ = reinterpret_cast<uint16_t *>(smem_raw), *sdO = sQ + R * LDQ;
    uint16_t *sK = sdO + R * LDQ, *sV = sK + KT * LDQ, *sKt = sV + KT * LDQ;
    float *sL = reinterpret_cast<float *>(sKt + D * LDT), *sD = sL + R;
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const int warps = (int)blockDim.x / 32;
    const qplace pl = place_of(p);
    if (!p.causal && !p.keep[pl.j])   /* padded block: no gradient (block-uniform) */
        return;
    const int64_t rlast = (pl.r0 + R < p.rows_unit ? pl.r0 + R : p.rows_unit) - 1;
    const qrow ra = row_of(p, pl.hk, pl.j, pl.r0 + warp * 16 + g);
    const qrow rb = row_of(p, pl.hk, pl.j, pl.r0 + warp * 16 + g + 8);
    const int4 ka = keys32(ra), kb = keys32(rb);
    const qrow first = row_of(p, pl.hk, pl.j, pl.r0), last = row_of(p, pl.hk, pl.j, rlast);
    const int pass_k0[2] = { (int)first.keys.ctx_lo, (int)first.keys.own_lo };
    const int pass_k1[2] = { (int)last.keys.ctx_hi, (int)last.keys.own_hi };
    auto row_at = [&](int r) -> int64_t {
        const int64_t u = pl.r0 + r;
        return u < p.rows_unit ? gr_of(p, pl.hk, pl.j, u) * p.d : -1;
    };
    load_tile<D>(sQ, LDQ, (uint16_t *)nullptr, 0, p.q, R, d, p.vec, row_at);
    load_tile<D>(sdO, LDQ, (uint16_t *)nullptr, 0, p.dout, R, d, p.vec, row_at);
    for (int r = warp; r < R; r += warps) {   /* D = rowsum(dout * out) in fp32, lse in base 2 */
        const int64_t at = row_at(r);
        float dsum = 0.0f;
        if (at >= 0)
            for (int i = lane; i < d; i += 32)
                dsum = fmaf(p.dout[at + i], p.out[at + i], dsum);
        dsum = warp_sum(dsum);
        if (lane == 0) {
            sD[r] = dsum;
            sL[r] = at >= 0 ? p.lse_in[at / p.d] * LOG2E : 0.0f;
        }
    }
    __syncthreads();
    const float L_a = sL[warp * 16 + g], L_b = sL[warp * 16 + g + 8];
    const float D_a = sD[warp * 16 + g], D_b = sD[warp * 16 + g + 8];

    float acc[D / 8][4];
#pragma unroll
    for (int nt = 0; nt < D / 8; nt++)
        acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.0f;

    for (int pass = 0; pass < 2; pass++) {
        const int k0 = pass ? pass_k0[1] : pass_k0[0], k1 = pass ? pass_k1[1] : pass_k1[0];
        for (int t0 = k0; t0 < k1; t0 += KT) {
            const int n = k1 - t0 < KT ? k1 - t0 : KT;
            __syncthreads();
            auto key_at = [&](int c) -> int64_t { return c < n ? ((int64_t)(t0 + c) * p.nkv + pl.hk) * p.d : -1; };
            load_tile<D>(sK, LDQ, sKt, LDT, p.k, KT, d, p.vec, key_at);
            load_tile<D>(sV, LDQ, (uint16_t *)nullptr, 0, p.v, KT, d, p.vec, key_at);
            __syncthreads();
            if (!__any_sync(0xffffffffu, sees_any(ka, t0, t0 + n) || sees_any(kb, t0, t0 + n)))
                continue;
            const bool whole = __all_sync(0xffffffffu, n == KT && ra.valid && rb.valid &&
                                                           sees_all(ka, t0, t0 + KT) && sees_all(kb, t0, t0 + KT));
            float s[KT / 8][4], dp[KT / 8][4];
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    s[nt][e] = dp[nt][e] = 0.0f;
#pragma unroll 2   /* along d: smem addresses only, so a short loop (code size: the bundle's cap) */
            for (int kk = 0; kk < D / 16; kk++) {
                uint32_t a[4], ao[4];
                frag_a(a, sQ, LDQ, warp * 16, kk * 16, g, t4);
                frag_a(ao, sdO, LDQ, warp * 16, kk * 16, g, t4);
#pragma unroll
                for (int nt = 0; nt < KT / 8; nt++) {
                    uint32_t b[2], bv[2];
                    frag_b(b, sK, LDQ, nt * 8, kk * 16, g, t4);
                    frag_b(bv, sV, LDQ, nt * 8, kk * 16, g, t4);
                    mma16816(s[nt], a[0], a[1], a[2], a[3], b[0], b[1]);
                    mma16816(dp[nt], ao[0], ao[1], ao[2], ao[3], bv[0], bv[1]);
                }
            }
            /* p = exp(s - lse), ds = p (dp - D), into s */
#pragma unroll
            for (int nt = 0; nt < KT / 8; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = nt * 8 + 2 * t4 + (e & 1);
                    const bool vis = whole || (c < n && sees_key(e < 2 ? ka : kb, t0 + c));
                    const float pe = vis ? exp2f(s[nt][e] * p.scale_log2 - (e < 2 ? L_a : L_b)) : 0.0f;
                    s[nt][e] = pe * (dp[nt][e] - (e < 2 ? D_a : D_b));
                }
            /* dq += ds k */
            mma_c_as_a<KT, D>(acc, s, sKt, LDT, g, t4);
        }
    }
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const qrow &r = half ? rb : ra;
        if (!r.valid)
            continue;
        float *dqr = p.dq + r.gr * p.d;   /* (d): this (row, head) is this thread quad's alone */
#pragma unroll
        for (int nt = 0; nt < D / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = nt * 8 + 2 * t4 + e;
                if (col < d)
                    dqr[col] += acc[nt][2 * half + e] * p.scale;
            }
    }
}

/* ------------------------------------------------------------------------------------------
 * Backward, dk and dv (key-major). NKG groups of 16 keys (KTB = 16 NKG keys), NSPLIT warps per
 * group each holding D / NSPLIT columns of dk and dv. Shared: sK, sV (KTB, D + PAD); sQ, sdO
 * (RQ, D + PAD); sQt, sdOt (D, RQ + PAD); then per chunk row its lse (base 2), D and key ranges.
 */

template <int D, int NSPLIT, int NKG, int RQ>
__global__ void __launch_bounds__(NKG * NSPLIT * 32, 2) flash_dkv_kernel(flash_params p)
{
    DDK_DYNAMIC_SHARED(uint4, smem_raw);
    constexpr int KTB = NKG * 16, DH = D / NSPLIT, LDQ = D + PAD, LDT = RQ + PAD;
    const int d = (int)p.d;
    uint16_t *sK = reinterpret_cast<uint16_t *>(smem_raw), *sV = sK + KTB * LDQ;
    uint16_t *sQ = sV + KTB * LDQ, *sdO = sQ + RQ * LDQ, *sQt = sdO + RQ * LDQ, *sdOt = sQt + D * LDT;
    int4 *sKeys = reinterpret_cast<int4 *>(sdOt + D * LDT);   /* 16-byte aligned: see dkv_smem */
    float *sL = reinterpret_cast<float *>(sKeys + RQ), *sD = sL + RQ;
    const int lane = (int)threadIdx.x % 32, warp = (int)threadIdx.x / 32, g = lane / 4, t4 = lane % 4;
    const int warps = (int)blockDim.x / 32, kg = warp / NSPLIT, hf = warp % NSPLIT;
    const int64_t hk = blockIdx.y, x = blockIdx.x;

    /* the tile: context keys, or slots of one block j; the blocks whose rows may see it */
    int64_t t0, n64, j_begin, j_end;
    const int ctx = x < p.n_ctx_tiles;
    if (ctx) {
        t0 = x * KTB;
        n64 = p.S - t0 < KTB ? p.S - t0 : KTB;
        j_begin = 0;
        j_end = p.A;
    } else {
        const int64_t xo = x - p.n_ctx_tiles, jo = xo / p.n_own_tiles;
        t0 = p.S + jo * p.B + xo % p.n_own_tiles * KTB;
        n64 = p.S + jo * p.B + p.B - t0 < KTB ? p.S + jo * p.B + p.B - t0 : KTB;
        j_begin = jo;
        j_end = jo + 1;
    }
    const int n = (int)n64;
    auto key_at = [&](int c) -> int64_t { return c < n ? ((t0 + c) * p.nkv + hk) * p.d : -1; };
    load_tile<D>(sK, LDQ, (uint16_t *)nullptr, 0, p.k, KTB, d, p.vec, key_at);
    load_tile<D>(sV, LDQ, (uint16_t *)nullptr, 0, p.v, KTB, d, p.vec, key_at);

    const int ca = kg * 16 + g, cb = ca + 8;   /* this thread's two keys, tile columns */
    const int64_t key_a = t0 + ca, key_b = t0 + cb;
    float dk[DH / 8][4], dv[DH / 8][4];
#pragma unroll
    for (int nt = 0; nt < DH / 8; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            dk[nt][e] = dv[nt][e] = 0.0f;

    for (int64_t j = j_begin; j < j_end; j++) {
        if (!p.keep[j])   /* block-uniform, as every condition of this loop */
            continue;
        const int64_t a = p.anchors[j] < 0 ? 0 : p.anchors[j] > p.S ? p.S : p.anchors[j];
        if (ctx) {
            if (a <= t0)
                continue;   /* every row of block j sees keys < a only */
            const ddk_row_keys k0 = ddk_dflash_row_keys(p.S, p.B, p.W, p.bidir, j, a, 0);
            if (k0.ctx_lo >= t0 + n)
                continue;   /* its first slot's window starts past the tile, the others later */
        }
        for (int64_t rq0 = 0; rq0 < p.rows_unit; rq0 += RQ) {
            __syncthreads();   /* the previous chunk is used up (first time: sK, sV stored) */
            auto row_at = [&](int r) -> int64_t {
                const int64_t u = rq0 + r;
                return u < p.rows_unit ? gr_of(p, hk, j, u) * p.d : -1;
            };
            load_tile<D>(sQ, LDQ, sQt, LDT, p.q, RQ, d, p.vec, row_at);
            load_tile<D>(sdO, LDQ, sdOt, LDT, p.dout, RQ, d, p.vec, row_at);
            for (int r = warp; r < RQ; r += warps) {
                const int64_t at = row_at(r);
                float dsum = 0.0f;
                if (at >= 0)
                    for (int i = lane; i < d; i += 32)
                        dsum = fmaf(p.dout[at + i], p.out[at + i], dsum);
                dsum = warp_sum(dsum);
                if (lane == 0) {
                    const qrow qr = row_of(p, hk, j, rq0 + r);
                    sD[r] = dsum;
                    sL[r] = at >= 0 ? p.lse_in[at / p.d] * LOG2E : 0.0f;
                    /* keys < 2^30 (flash_ok): int */
                    sKeys[r] = make_int4((int)qr.keys.ctx_lo, (int)qr.keys.ctx_hi,
                                         (int)qr.keys.own_lo, (int)qr.keys.own_hi);
                }
            }
            __syncthreads();
            for (int sub = 0; sub < RQ / 16; sub++) {
                /* which (key, query) pairs of this warp's fragment are seen */
                unsigned vis = 0;
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = sub * 16 + nt * 8 + 2 * t4 + (e & 1);
                        const int c = e < 2 ? ca : cb;
                        const int64_t key = e < 2 ? key_a : key_b;
                        const int4 kr = sKeys[qi];
                        const bool seen = c < n && ((key >= kr.x && key < kr.y) || (key >= kr.z && key < kr.w));
                        vis |= (unsigned)seen << (nt * 4 + e);
                    }
                if (!__any_sync(0xffffffffu, vis != 0))
                    continue;   /* warp-uniform */
                /* s^T = k q^T and dp^T = v dout^T: 16 keys x 16 queries */
                float st[2][4], dpt[2][4];
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        st[nt][e] = dpt[nt][e] = 0.0f;
#pragma unroll 2
                for (int kk = 0; kk < D / 16; kk++) {
                    uint32_t ak[4], av[4];
                    frag_a(ak, sK, LDQ, kg * 16, kk * 16, g, t4);
                    frag_a(av, sV, LDQ, kg * 16, kk * 16, g, t4);
#pragma unroll
                    for (int nt = 0; nt < 2; nt++) {
                        uint32_t bq[2], bo[2];
                        frag_b(bq, sQ, LDQ, sub * 16 + nt * 8, kk * 16, g, t4);
                        frag_b(bo, sdO, LDQ, sub * 16 + nt * 8, kk * 16, g, t4);
                        mma16816(st[nt], ak[0], ak[1], ak[2], ak[3], bq[0], bq[1]);
                        mma16816(dpt[nt], av[0], av[1], av[2], av[3], bo[0], bo[1]);
                    }
                }
                /* p^T into st, ds^T into dpt */
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int qi = sub * 16 + nt * 8 + 2 * t4 + (e & 1);
                        const float pe = (vis >> (nt * 4 + e)) & 1u
                                             ? exp2f(st[nt][e] * p.scale_log2 - sL[qi])
                                             : 0.0f;
                        st[nt][e] = pe;
                        dpt[nt][e] = pe * (dpt[nt][e] - sD[qi]);
                    }
                const uint32_t p0 = pack_bf16(st[0][0], st[0][1]), p1 = pack_bf16(st[0][2], st[0][3]);
                const uint32_t p2 = pack_bf16(st[1][0], st[1][1]), p3 = pack_bf16(st[1][2], st[1][3]);
                const uint32_t s0 = pack_bf16(dpt[0][0], dpt[0][1]), s1 = pack_bf16(dpt[0][2], dpt[0][3]);
                const uint32_t s2 = pack_bf16(dpt[1][0], dpt[1][1]), s3 = pack_bf16(dpt[1][2], dpt[1][3]);
                /* dv += p^T dout, dk += ds^T q over this warp's columns */
#pragma unroll
                for (int nt = 0; nt < DH / 8; nt++) {
                    uint32_t bo[2], bq[2];
                    frag_b(bo, sdOt, LDT, hf * DH + nt * 8, sub * 16, g, t4);
                    frag_b(bq, sQt, LDT, hf * DH + nt * 8, sub * 16, g, t4);
                    mma16816(dv[nt], p0, p1, p2, p3, bo[0], bo[1]);
                    mma16816(dk[nt], s0, s1, s2, s3, bq[0], bq[1]);
                }
            }
        }
    }
    /* this (key, head) is this block's alone: add without atomics */
#pragma unroll
    for (int half = 0; half < 2; half++) {
        const int c = half ? cb : ca;
        if (c >= n)
            continue;
        const int64_t at = ((half ? key_b : key_a) * p.nkv + hk) * p.d;
#pragma unroll
        for (int nt = 0; nt < DH / 8; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int col = hf * DH + nt * 8 + 2 * t4 + e;
                if (col < d) {
                    p.dk[at + col] += dk[nt][2 * half + e] * p.scale;
                    p.dv[at + col] += dv[nt][2 * half + e];
                }
            }
    }
}

/* ------------------------------------------------------------------------------------------
 * Host side: instances, shared memory, launches
 */

constexpr int kt_of(int D) { return D == 256 ? 32 : 64; }

constexpr size_t forward_smem(int D, int R)
{
    return (size_t)(R * (D + PAD) + kt_of(D) * (D + PAD) + D * (kt_of(D) + PAD)) * 2;
}

constexpr size_t dq_smem(int D, int R)
{
    return (size_t)(2 * R * (D + PAD) + 2 * kt_of(D) * (D + PAD) + D * (kt_of(D) + PAD)) * 2 +
           (size_t)2 * R * sizeof(float);
}

/* key-major instances per D: NSPLIT, NKG, and RQ query rows a chunk: dkv_rq(D), or half of it
 * where that does not fit the GPU (99 KB cards at D >= 128) */
constexpr int dkv_nsplit(int D) { return D == 256 ? 2 : 1; }
constexpr int dkv_nkg(int D) { return D == 256 ? 2 : 4; }
constexpr int dkv_rq(int D) { return D == 256 ? 32 : 64; }

constexpr size_t dkv_smem(int D, int RQ)
{
    /* the int4 keys after the bf16 arrays need 16-byte alignment: the bf16 part is
     * (2 KTB + 2 RQ) (D + 8) + 2 D (RQ + 8) values, a multiple of 8 */
    return (size_t)(2 * dkv_nkg(D) * 16 * (D + PAD) + 2 * RQ * (D + PAD) + 2 * D * (RQ + PAD)) * 2 +
           (size_t)RQ * (sizeof(int4) + 2 * sizeof(float));
}


static_assert(forward_smem(128, 96) == 61952 && dq_smem(128, 96) == 106240 &&
              dkv_smem(128, 64) == 108032 && dkv_smem(256, 32) == 109312 && dkv_smem(64, 64) == 56832 &&
              forward_smem(256, 128) == 104960 && dq_smem(256, 64) == 122368 &&
              forward_smem(256, 112) == 96512 && dq_smem(128, 80) == 97408 &&
              dq_smem(256, 32) == 88320 && dkv_smem(128, 32) == 73472 && dkv_smem(256, 16) == 75648,
              "the figures in the header comment");
/* the smallest opt-in shared memory of a card we plan for (ddk_device_profile: RTX PRO 6000,
 * sm_120) and H100/H200/B200's: the largest instances fit the latter, the smaller ones the former */
enum { SMEM_OPTIN_99K = 101376, SMEM_OPTIN_227K = 232448 };
static_assert(forward_smem(256, fwd_max_rows(256)) <= SMEM_OPTIN_227K &&
              dq_smem(256, dq_max_rows(256)) <= SMEM_OPTIN_227K &&
              dq_smem(128, dq_max_rows(128)) <= SMEM_OPTIN_227K && dkv_smem(256, 32) <= SMEM_OPTIN_227K,
              "every largest instance fits H100/H200/B200");
static_assert(forward_smem(256, 16) <= SMEM_OPTIN_99K && dq_smem(256, 16) <= SMEM_OPTIN_99K &&
              dkv_smem(256, dkv_rq(256) / 2) <= SMEM_OPTIN_99K && dkv_smem(128, dkv_rq(128) / 2) <= SMEM_OPTIN_99K,
              "an instance fits the 99 KB cards at every D");

constexpr int padded_d(int64_t d) { return d <= 64 ? 64 : d <= 128 ? 128 : 256; }

size_t smem_optin(void)
{
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return (size_t)bytes;
}

/* The rows of a query-major block: the largest multiple of 16 up to `most` whose shared memory
 * (smem(D, R)) fits `limit`; 0 when not even 16 rows fit */
int rows_that_fit(int D, int most, size_t limit, size_t (*smem)(int, int))
{
    for (int r = most; r >= 16; r -= 16)
        if (smem(D, r) <= limit)
            return r;
    return 0;
}

/* Launches kernel with `smem` bytes, raising its limit to `most` (the instance's largest need:
 * two threads launching one instance with different shapes never lower it under each other).
 * -ENOTSUP when this GPU cannot give `smem`. */
int launch(const void *kernel, void (*call)(dim3, dim3, size_t, cudaStream_t, const flash_params &),
           const flash_params &p, dim3 grid, dim3 block, size_t smem, size_t most, cudaStream_t stream)
{
    const size_t limit = smem_optin();
    if (smem > limit)
        return -ENOTSUP;
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        (int)(most < limit ? most : limit)));
    call(grid, block, smem, stream, p);
    LAUNCH_CHECK();
    return 0;
}

template <int D>
void call_forward(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const flash_params &p)
{
    void (*const flash_forward)(flash_params) = flash_forward_kernel<D, kt_of(D)>;
    DDK_LAUNCH(flash_forward, grid, block, smem, stream, p);
}

template <int D>
void call_dq(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const flash_params &p)
{
    void (*const flash_dq)(flash_params) = flash_dq_kernel<D, kt_of(D)>;
    DDK_LAUNCH(flash_dq, grid, block, smem, stream, p);
}

template <int D, int RQ>
void call_dkv(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const flash_params &p)
{
    void (*const flash_dkv)(flash_params) = flash_dkv_kernel<D, dkv_nsplit(D), dkv_nkg(D), RQ>;
    DDK_LAUNCH(flash_dkv, grid, block, smem, stream, p);
}

template <int D>
int run_forward(const flash_params &p, dim3 grid, cudaStream_t stream)
{
    return launch((const void *)flash_forward_kernel<D, kt_of(D)>, call_forward<D>, p, grid,
                  dim3((unsigned)(p.rows_cta / 16 * 32)), forward_smem(D, p.rows_cta),
                  forward_smem(D, fwd_max_rows(D)), stream);
}

template <int D>
int run_dq(const flash_params &p, dim3 grid, cudaStream_t stream)
{
    return launch((const void *)flash_dq_kernel<D, kt_of(D)>, call_dq<D>, p, grid,
                  dim3((unsigned)(p.rows_cta / 16 * 32)), dq_smem(D, p.rows_cta),
                  dq_smem(D, dq_max_rows(D)), stream);
}

template <int D, int RQ>
int run_dkv_rq(const flash_params &p, dim3 grid, cudaStream_t stream)
{
    return launch((const void *)flash_dkv_kernel<D, dkv_nsplit(D), dkv_nkg(D), RQ>, call_dkv<D, RQ>,
                  p, grid, dim3((unsigned)(dkv_nkg(D) * dkv_nsplit(D) * 32)), dkv_smem(D, RQ),
                  dkv_smem(D, RQ), stream);
}

/* the key-major pass with the larger chunk of query rows that fits the GPU (dkv_rq_fit); at
 * D 64 the whole chunk fits every card (56,832 bytes), so there is no half instance */
template <int D>
int run_dkv(const flash_params &p, dim3 grid, cudaStream_t stream, int rq)
{
    if constexpr (D == 64)
        return run_dkv_rq<D, dkv_rq(D)>(p, grid, stream);
    else
        return rq == dkv_rq(D) ? run_dkv_rq<D, dkv_rq(D)>(p, grid, stream)
                               : run_dkv_rq<D, dkv_rq(D) / 2>(p, grid, stream);
}

/* dkv_rq(D) when it fits `limit`, else half of it (D >= 128), else 0 (none fits) */
int dkv_rq_fit(int D, size_t limit)
{
    const int rq = dkv_rq(D);
    if (dkv_smem(D, rq) <= limit)
        return rq;
    return D >= 128 && dkv_smem(D, rq / 2) <= limit ? rq / 2 : 0;
}

int aligned16(const void *x)
{
    return ((uintptr_t)x & 15u) == 0;
}

/* rows of a query-major block for a unit of `rows` rows at most `max_rows` a block: the fewest
 * blocks, their rows balanced and rounded up to 16 */
void split_rows(int64_t rows, int max_rows, int64_t *splits, int *rows_cta)
{
    *splits = (rows + max_rows - 1) / max_rows;
    const int64_t per = (rows + *splits - 1) / *splits;
    *rows_cta = (int)((per + 15) / 16 * 16);
}

} /* namespace */

void ddk_cuda_flash_instances(size_t limit, int D, int *fwd_rows, int *dq_rows, int *dkv_rq)
{
    *fwd_rows = rows_that_fit(D, fwd_max_rows(D), limit, forward_smem);
    *dq_rows = rows_that_fit(D, dq_max_rows(D), limit, dq_smem);
    *dkv_rq = dkv_rq_fit(D, limit);
}

namespace {

/* rows of a forward block at head dim d on this GPU (0: no instance fits) */
int forward_rows(int64_t d)
{
    const int D = padded_d(d);
    return rows_that_fit(D, fwd_max_rows(D), smem_optin(), forward_smem);
}

/* what every call shares; 0 or -ENOTSUP */
int flash_common(const ddk_attention_shape *sh, int64_t keys, flash_params *p)
{
    if (sh->d > 256 || keys > ((int64_t)1 << 30))
        return -ENOTSUP;
    *p = flash_params{};
    p->S = sh->S;
    p->A = sh->A;
    p->B = sh->B;
    p->nh = sh->nh;
    p->nkv = sh->nkv;
    p->d = sh->d;
    p->W = sh->window;
    p->bidir = sh->bidirectional != 0;
    p->G = sh->nh / sh->nkv;
    p->scale = (float)(1.0 / sqrt((double)sh->d));
    p->scale_log2 = (float)(1.0 / sqrt((double)sh->d) * 1.4426950408889634);
    return 0;
}

} /* namespace */

/* ------------------------------------------------------------------------------------------
 * Entry points (attention_cuda.cu has checked the shape; A >= 1, T >= 1)
 */

int ddk_cuda_flash_dflash(const ddk_backend *be, const ddk_attention_shape *sh, const float *q,
                          const float *k, const float *v, const int32_t *anchors,
                          const uint8_t *keep, float *out, float *lse)
{
    flash_params p;
    if (flash_common(sh, sh->S + sh->A * sh->B, &p))
        return -ENOTSUP;
    p.q = q;
    p.k = k;
    p.v = v;
    p.anchors = anchors;
    p.keep = keep;
    p.y = out;
    p.lse = lse;
    p.rows_unit = sh->B * p.G;
    p.vec = sh->d % 4 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
    cudaStream_t stream = ddk_cuda_stream(be);   /* be's GPU current: its limits below */
    const int max_rows = forward_rows(sh->d);
    if (!max_rows)
        return -ENOTSUP;
    int64_t splits;
    split_rows(p.rows_unit, max_rows, &splits, &p.rows_cta);
    if (splits > 65535)
        return -ENOTSUP;
    const dim3 grid((unsigned)sh->A, (unsigned)sh->nkv, (unsigned)splits);
    switch (padded_d(sh->d)) {
    case 64: return run_forward<64>(p, grid, stream);
    case 128: return run_forward<128>(p, grid, stream);
    default: return run_forward<256>(p, grid, stream);
    }
}

int ddk_cuda_flash_dflash_backward(const ddk_backend *be, const ddk_attention_shape *sh,
                                   const float *q, const float *k, const float *v,
                                   const int32_t *anchors, const uint8_t *keep, const float *out,
                                   const float *lse, const float *dout, float *dq, float *dk,
                                   float *dv)
{
    flash_params p;
    if (flash_common(sh, sh->S + sh->A * sh->B, &p))
        return -ENOTSUP;
    p.q = q;
    p.k = k;
    p.v = v;
    p.anchors = anchors;
    p.keep = keep;
    p.out = out;
    p.lse_in = lse;
    p.dout = dout;
    p.dq = dq;
    p.dk = dk;
    p.dv = dv;
    p.rows_unit = sh->B * p.G;
    p.vec = sh->d % 4 == 0 && aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dout);
    const int D = padded_d(sh->d);
    cudaStream_t stream = ddk_cuda_stream(be);   /* be's GPU current: its limits below */
    /* both passes' instances chosen to fit this GPU before either runs: all or nothing */
    const size_t limit = smem_optin();
    const int dq_rows = rows_that_fit(D, dq_max_rows(D), limit, dq_smem), rq = dkv_rq_fit(D, limit);
    if (!dq_rows || !rq)
        return -ENOTSUP;
    int64_t splits;
    split_rows(p.rows_unit, dq_rows, &splits, &p.rows_cta);
    const int64_t ktb = D == 256 ? dkv_nkg(256) * 16 : dkv_nkg(128) * 16;
    p.n_ctx_tiles = (sh->S + ktb - 1) / ktb;
    p.n_own_tiles = (sh->B + ktb - 1) / ktb;
    const int64_t key_tiles = p.n_ctx_tiles + sh->A * p.n_own_tiles;
    if (splits > 65535 || key_tiles > INT32_MAX)
        return -ENOTSUP;
    const dim3 grid_q((unsigned)sh->A, (unsigned)sh->nkv, (unsigned)splits);
    const dim3 grid_k((unsigned)key_tiles, (unsigned)sh->nkv, 1);
    int rc;
    switch (D) {
    case 64:
        rc = run_dq<64>(p, grid_q, stream);
        return rc ? rc : run_dkv<64>(p, grid_k, stream, rq);
    case 128:
        rc = run_dq<128>(p, grid_q, stream);
        return rc ? rc : run_dkv<128>(p, grid_k, stream, rq);
    default:
        rc = run_dq<256>(p, grid_q, stream);
        return rc ? rc : run_dkv<256>(p, grid_k, stream, rq);
    }
}

int ddk_cuda_flash_causal(const ddk_backend *be, const ddk_attention_shape *sh, const float *q,
                          const float *k, const float *v, float *out)
{
    flash_params p;
    if (flash_common(sh, sh->S, &p))
        return -ENOTSUP;
    const int64_t T = sh->q_rows ? sh->q_rows : sh->S;
    p.q = q;
    p.k = k;
    p.v = v;
    p.y = out;
    p.lse = NULL;
    p.causal = 1;
    p.p0 = sh->S - T;
    p.A = 0;
    p.B = 0;
    p.W = 0;
    p.bidir = 0;
    p.rows_unit = T * p.G;
    p.vec = sh->d % 4 == 0 && aligned16(q) && aligned16(k) && aligned16(v);
    cudaStream_t stream = ddk_cuda_stream(be);   /* be's GPU current: its limits below */
    const int max_rows = forward_rows(sh->d);
    if (!max_rows)
        return -ENOTSUP;
    int64_t splits;
    split_rows(p.rows_unit, max_rows, &splits, &p.rows_cta);
    if (splits > INT32_MAX)
        return -ENOTSUP;
    const dim3 grid((unsigned)splits, (unsigned)sh->nkv, 1);
    switch (padded_d(sh->d)) {
    case 64: return run_forward<64>(p, grid, stream);
    case 128: return run_forward<128>(p, grid, stream);
    default: return run_forward<256>(p, grid, stream);
    }
}
