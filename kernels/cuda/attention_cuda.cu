/* attention_cuda.cu: DFlash block attention (forward and backward) and plain causal attention on
 * the GPU (contracts in ddk.h, struct ddk_backend; SPEC.md section 2 step 4, section 3),
 * flash-style: no mask and no score matrix ever exists, memory is the inputs and outputs only.
 *
 * A first, plainly correct version (speed later, each step measured; CONVENTIONS.md):
 *
 *   - One thread block per (block j, query head h, group of up to ROWS_PER_CTA slots of the
 *     block) for DFlash, per (group of ROWS_PER_CTA positions, query head h) for causal
 *     attention. One warp per query row. Query head h reads kv head h / (nh / nkv).
 *   - Keys are streamed in tiles of KEY_TILE (32) rows: all warps load the tile's K and V rows
 *     into shared memory together, then each warp uses the part of the tile its row sees. A row
 *     sees ONE contiguous range of keys per pass (the CPU backend's observation, attention_cpu.c):
 *     context [0, a_j), or [a_j + o - (window - 1), a_j) with a window; then the own block's slots
 *     S + j*B + [0, B), or [0, o] with a window; causal [0, t]. So a key's visibility is two
 *     comparisons, never a mask. Lane l scores key t0 + l (a dot product over d from shared
 *     memory), the warp takes the tile's max and sum by shuffles, and the accumulator (lane l
 *     holds elements l, l + 32, ... of the output row, in registers) is rescaled and updated:
 *     online softmax in fp32. out = acc / sum, lse = max + log(sum).
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
 * Limits of this version: d <= 256 (the accumulator is NC = ceil(d/32) <= 8 registers a lane);
 * larger d, or a tile that needs more shared memory than the GPU allows a block (the backward
 * at d = 256 takes ~164 KiB: H100/H200 yes, smaller parts may not), is refused with -EINVAL,
 * nothing written, and the caller takes the CPU path. Also not here: bf16, tensor cores, splitting
 * long key ranges over thread blocks.
 *
 * Anchors are clamped to [0, S] like the CPU backend; padded blocks (keep = 0) write out = 0 and
 * lse = 0 (forward) and contribute nothing (backward). A = 0 or T = 0: nothing to do.
 * Calls return when the kernels are queued on the backend's stream (backend_cuda.cu).
 *
 * Tested by tests/test_backend_ops.c against the CPU backend (skipped without a GPU).
 *
 * Legend: S context rows, A blocks, B block size, nh query heads, nkv kv heads, G = nh / nkv,
 * d head dim, W window, R rows (warps) of a thread block, n keys of the current tile.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * Launch helpers: a failed launch is a device error (abort with CUDA's message)
 */



enum {
    KEY_TILE = 32,       /* keys per tile: one per lane */
    ROWS_PER_CTA = 16,   /* query rows (warps) per thread block: 512 threads at most, declared
                            to nvcc (__launch_bounds__) so the registers fit such a block */
    MAX_D = 256,         /* NC = 8 accumulator registers a lane */
    MAX_GRID_YZ = 65535,
};

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
    float scale;
    int causal;                /* 1: causal attention over T positions; 0: DFlash */
} attn_params;

/* The calling warp's query row and, for the thread block, its key passes. Block-uniform fields
 * (npass, the pass ranges, skip) are the same for every warp; has_row and the row's ranges are
 * the warp's. */
typedef struct attn_rows {
    int skip;                  /* padded block: write zeros / add nothing */
    int has_row;               /* this warp has a query row */
    int64_t row;               /* the row's index in (rows, nh): (position or j*B + o) * nh + h */
    int64_t hk;                /* kv head */
    int npass;
    int64_t k0[2], k1[2];      /* block-uniform key range of each pass */
    int64_t lo[2], hi[2];      /* the row's visible keys in each pass */
} attn_rows;

__device__ static int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__device__ static int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

__device__ static attn_rows attn_rows_of(const attn_params &p, int warp, int warps)
{
    attn_rows r;
    const int64_t h = blockIdx.y, G = p.nh / p.nkv;
    r.hk = h / G;
    r.skip = 0;
    if (p.causal) {
        const int64_t first = (int64_t)blockIdx.x * warps, t = first + warp;
        const int64_t last = imin(p.T - 1, first + warps - 1);
        r.has_row = t < p.T;
        r.row = t * p.nh + h;
        r.npass = 1;
        r.k0[0] = 0;
        r.k1[0] = last + 1;
        r.lo[0] = 0;
        r.hi[0] = t + 1;
        r.k0[1] = r.k1[1] = r.lo[1] = r.hi[1] = 0;
        return r;
    }
    const int64_t j = blockIdx.x, first = (int64_t)blockIdx.z * warps, o = first + warp;
    r.skip = !p.keep[j];
    r.has_row = o < p.B;
    r.row = (j * p.B + o) * p.nh + h;
    const int64_t a = imin(imax(p.anchors[j], 0), p.S);
    r.npass = 2;
    /* context: the row's window start is nondecreasing in o, so the first row's is the union's */
    r.k0[0] = p.W > 0 ? imin(imax(a + first - (p.W - 1), 0), a) : 0;
    r.k1[0] = a;
    r.lo[0] = p.W > 0 ? imin(imax(a + o - (p.W - 1), 0), a) : 0;
    r.hi[0] = a;
    /* own block */
    r.k0[1] = p.S + j * p.B;
    r.k1[1] = r.k0[1] + p.B;
    r.lo[1] = r.k0[1];
    r.hi[1] = r.k0[1] + (p.W > 0 ? o + 1 : p.B);
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
__device__ static float dot_row(const float *a, const float *b, int64_t d)
{
    float s = 0.0f;
    for (int64_t i = 0; i < d; i++)
        s = fmaf(a[i], b[i], s);
    return s;
}

/* keys [t0, t0 + n) of kv head hk (k, v (keys, nkv, d)) into dst (n, ldt), by the whole block */
__device__ static void load_tile(float *dst, const float *src, int64_t t0, int64_t n, int64_t nkv,
                                 int64_t hk, int64_t d, int64_t ldt)
{
    for (int64_t idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
        const int64_t c = idx / d, i = idx % d;
        dst[c * ldt + i] = src[((t0 + c) * nkv + hk) * d + i];
    }
}

/* ------------------------------------------------------------------------------------------
 * Forward. Shared: q rows (R, d), K tile (KEY_TILE, d + 1), V tile (KEY_TILE, d + 1); the +1
 * keeps lane l's walk along key row l off the other lanes' banks.
 */

template <int NC>
__global__ void __launch_bounds__(ROWS_PER_CTA * 32) attn_forward_kernel(attn_params p)
{
    extern __shared__ float smem[];
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    const int64_t d = p.d, ldt = d + 1;
    float *sq = smem, *sk = sq + warps * d, *sv = sk + KEY_TILE * ldt;
    const attn_rows r = attn_rows_of(p, warp, warps);

    if (r.skip) {   /* padded block: its rows are 0 (block-uniform: the whole block returns) */
        if (r.has_row) {
            for (int64_t i = lane; i < d; i += 32)
                p.y[r.row * d + i] = 0.0f;
            if (lane == 0 && p.lse)
                p.lse[r.row] = 0.0f;
        }
        return;
    }
    float *qr = sq + warp * d;   /* (d) */
    if (r.has_row)
        for (int64_t i = lane; i < d; i += 32)
            qr[i] = p.q[r.row * d + i];

    float m = -INFINITY, l = 0.0f, acc[NC];
#pragma unroll
    for (int cc = 0; cc < NC; cc++)
        acc[cc] = 0.0f;

    for (int pass = 0; pass < r.npass; pass++) {
        const int64_t lo = r.lo[pass], hi = r.hi[pass];
        for (int64_t t0 = r.k0[pass]; t0 < r.k1[pass]; t0 += KEY_TILE) {
            const int64_t n = imin(KEY_TILE, r.k1[pass] - t0);
            __syncthreads();   /* the previous tile is used up (and q is stored, first time) */
            load_tile(sk, p.k, t0, n, p.nkv, r.hk, d, ldt);
            load_tile(sv, p.v, t0, n, p.nkv, r.hk, d, ldt);
            __syncthreads();
            /* warp-uniform: does this row see any key of the tile? */
            if (!r.has_row || lo >= hi || lo >= t0 + n || hi <= t0)
                continue;
            const int64_t t = t0 + lane;
            const bool vis = lane < n && t >= lo && t < hi;
            const float s = vis ? p.scale * dot_row(qr, sk + lane * ldt, d) : -INFINITY;
            const float m_new = fmaxf(m, warp_max(s));   /* finite: one key at least is seen */
            const float pl = vis ? expf(s - m_new) : 0.0f;
            const float rescale = expf(m - m_new);       /* m = -inf first: 0 */
            l = l * rescale + warp_sum(pl);
            m = m_new;
#pragma unroll
            for (int cc = 0; cc < NC; cc++)
                acc[cc] *= rescale;
            const int64_t c0 = imax(lo, t0) - t0, c1 = imin(hi, t0 + n) - t0;
            for (int64_t c = c0; c < c1; c++) {
                const float pc = __shfl_sync(0xffffffffu, pl, (int)c);
                const float *vr = sv + c * ldt;
#pragma unroll
                for (int cc = 0; cc < NC; cc++) {
                    const int64_t i = lane + 32 * cc;
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
        const int64_t i = lane + 32 * cc;
        if (i < d)
            p.y[r.row * d + i] = acc[cc] * inv;
    }
    if (lane == 0 && p.lse)
        p.lse[r.row] = m + logf(l);
}

/* ------------------------------------------------------------------------------------------
 * Backward. Shared: q rows (R, d), dout rows (R, d), K, V tiles and the tile's dK, dV sums
 * (KEY_TILE, d + 1) each.
 */

template <int NC>
__global__ void __launch_bounds__(ROWS_PER_CTA * 32) attn_backward_kernel(attn_params p)
{
    extern __shared__ float smem[];
    const int lane = (int)(threadIdx.x % 32), warp = (int)(threadIdx.x / 32);
    const int warps = (int)(blockDim.x / 32);
    const int64_t d = p.d, ldt = d + 1;
    float *sq = smem, *sdo = sq + warps * d, *sk = sdo + warps * d, *sv = sk + KEY_TILE * ldt;
    float *sdk = sv + KEY_TILE * ldt, *sdv = sdk + KEY_TILE * ldt;
    const attn_rows r = attn_rows_of(p, warp, warps);
    if (r.skip)   /* padded block: no gradient either way (block-uniform) */
        return;

    float *qr = sq + warp * d, *dor = sdo + warp * d;   /* (d) each */
    float qreg[NC], doreg[NC], dq[NC];
    float D = 0.0f, lse = 0.0f;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int64_t i = lane + 32 * cc;
        qreg[cc] = doreg[cc] = dq[cc] = 0.0f;
        if (r.has_row && i < d) {
            qreg[cc] = qr[i] = p.q[r.row * d + i];
            doreg[cc] = dor[i] = p.dout[r.row * d + i];
            D = fmaf(doreg[cc], p.out[r.row * d + i], D);
        }
    }
    D = warp_sum(D);
    if (r.has_row)
        lse = p.lse_in[r.row];

    for (int pass = 0; pass < r.npass; pass++) {
        const int64_t lo = r.lo[pass], hi = r.hi[pass];
        for (int64_t t0 = r.k0[pass]; t0 < r.k1[pass]; t0 += KEY_TILE) {
            const int64_t n = imin(KEY_TILE, r.k1[pass] - t0);
            __syncthreads();   /* the previous tile and its sums are used up */
            load_tile(sk, p.k, t0, n, p.nkv, r.hk, d, ldt);
            load_tile(sv, p.v, t0, n, p.nkv, r.hk, d, ldt);
            for (int64_t idx = threadIdx.x; idx < n * ldt; idx += blockDim.x)
                sdk[idx] = sdv[idx] = 0.0f;
            __syncthreads();
            if (r.has_row && lo < hi && lo < t0 + n && hi > t0) {   /* warp-uniform */
                const int64_t t = t0 + lane;
                const bool vis = lane < n && t >= lo && t < hi;
                float pl = 0.0f, ds = 0.0f;
                if (vis) {
                    const float s = p.scale * dot_row(qr, sk + lane * ldt, d);
                    const float dp = dot_row(dor, sv + lane * ldt, d);
                    pl = expf(s - lse);
                    ds = pl * (dp - D) * p.scale;   /* carries s's scale for dq and dk */
                }
                const int64_t c0 = imax(lo, t0) - t0, c1 = imin(hi, t0 + n) - t0;
                for (int64_t c = c0; c < c1; c++) {
                    const float pc = __shfl_sync(0xffffffffu, pl, (int)c);
                    const float dsc = __shfl_sync(0xffffffffu, ds, (int)c);
                    const float *kr = sk + c * ldt;
                    float *dkr = sdk + c * ldt, *dvr = sdv + c * ldt;
#pragma unroll
                    for (int cc = 0; cc < NC; cc++) {
                        const int64_t i = lane + 32 * cc;
                        if (i < d) {
                            dq[cc] = fmaf(dsc, kr[i], dq[cc]);
                            atomicAdd(dvr + i, pc * doreg[cc]);
                            atomicAdd(dkr + i, dsc * qreg[cc]);
                        }
                    }
                }
            }
            __syncthreads();
            /* the tile's sums over this block's rows into dk, dv (see NON-DETERMINISM above) */
            for (int64_t idx = threadIdx.x; idx < n * d; idx += blockDim.x) {
                const int64_t c = idx / d, i = idx % d;
                const int64_t at = ((t0 + c) * p.nkv + r.hk) * d + i;
                const float gk = sdk[c * ldt + i], gv = sdv[c * ldt + i];
                if (gk != 0.0f)
                    atomicAdd(p.dk + at, gk);
                if (gv != 0.0f)
                    atomicAdd(p.dv + at, gv);
            }
        }
    }
    if (!r.has_row)
        return;
#pragma unroll
    for (int cc = 0; cc < NC; cc++) {
        const int64_t i = lane + 32 * cc;
        if (i < d)
            p.dq[r.row * d + i] += dq[cc];   /* this (row, head) is this warp's alone */
    }
}

/* ------------------------------------------------------------------------------------------
 * Host side: checks, shared-memory sizes, launches
 */

static size_t forward_smem(int64_t warps, int64_t d)
{
    return (size_t)(warps * d + 2 * KEY_TILE * (d + 1)) * sizeof(float);
}

static size_t backward_smem(int64_t warps, int64_t d)
{
    return (size_t)(2 * warps * d + 4 * KEY_TILE * (d + 1)) * sizeof(float);
}

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

/* Queues the kernel on be's stream; -EINVAL when its shared memory does not fit this GPU. */
static int launch(const ddk_backend *be, const attn_params &p, dim3 grid, int64_t warps,
                  int backward)
{
    cudaStream_t stream = ddk_cuda_stream(be);   /* also makes be's GPU current */
    const size_t smem = backward ? backward_smem(warps, p.d) : forward_smem(warps, p.d);
    if (smem > smem_limit())
        return -EINVAL;
    attn_kernel kernel = kernel_for(p.d, backward);
    if (smem > 48 * 1024)
        CUDA_CHECK(cudaFuncSetAttribute((const void *)kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kernel<<<grid, (unsigned)(warps * 32), smem, stream>>>(p);
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

int ddk_cuda_dflash_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                              const float *q, const float *k, const float *v,
                              const int32_t *anchors, const uint8_t *keep, float *out, float *lse)
{
    attn_params p;
    int rc = dflash_inputs(shape, q, k, v, anchors, keep, &p);
    if (rc)
        return rc > 0 ? 0 : rc;
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
    if (!heads_ok(shape) || shape->S < 0)
        return -EINVAL;
    const int64_t T = shape->S, warps = ROWS_PER_CTA, blocks = (T + warps - 1) / warps;
    if (blocks > INT32_MAX)
        return -EINVAL;
    if (T == 0)
        return 0;
    attn_params p = {};
    p.q = q;
    p.k = k;
    p.v = v;
    p.y = out;
    p.lse = NULL;
    p.nh = shape->nh;
    p.nkv = shape->nkv;
    p.d = shape->d;
    p.T = T;
    p.causal = 1;
    p.scale = (float)(1.0 / sqrt((double)shape->d));
    return launch(be, p, dim3((unsigned)blocks, (unsigned)shape->nh, 1), warps, 0);
}
