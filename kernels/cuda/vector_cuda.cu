/* vector_cuda.cu: the whole-buffer ops of the trainer's gradient reduction and optimiser on the
 * GPU (contracts in ddk.h, struct ddk_backend): sumsq (the gradient norm's sum of squares), axpby
 * (gradient accumulation and averaging), the per-element AdamW update and the features' uniform
 * noise (bit for bit the CPU's), argmax_rows (the greedy argmax of logit rows, bit for bit the
 * CPU's indices), topk_rows with its merge into running lists, which the fused loss's online
 * top-K of the DFlash2 selector runs tile by tile (bit for bit the CPU's: topk_row.h's order is
 * total, so the k first are one list whatever the threads saw), and logsumexp_rows (a row's
 * log-sum-exp and a column's log-probability: expf terms summed in double, within ~1e-6 of the
 * CPU's float64 ones). Plain fp32 kernels
 * queued on the backend's stream (backend_cuda.cu), grid-stride with 64-bit indices: a count may
 * pass 2^31.
 *
 * sumsq is deterministic by construction: a FIXED grid (SUMSQ_BLOCKS blocks of THREADS threads,
 * whatever the GPU's multiprocessor count), thread t of block b squaring and adding in double the
 * elements b * THREADS + t + j * SUMSQ_BLOCKS * THREADS in j order, then a fixed tree per block
 * (shuffles, then the warps in order) into one double partial per block, then one block adding
 * the partials the same way. The order depends on count alone (not on the multiprocessor count),
 * so every call gives the same bits for the same buffer. The partials live in the backend's
 * scratch, under its lock; the call returns the value to the host, so it waits for the stream.
 *
 * axpby and adamw are elementwise and write each element from the thread that read it, so x may
 * be y (axpby). They follow the CPU's operation order (kernels/cpu/vector_cpu.c's adamw_loop);
 * contraction into FMAs may differ between nvcc and the C compiler, so results agree to float
 * rounding, not bit for bit (except axpby with beta = 0: one product, the same on both sides).
 *
 * Deliberately not here: vector (16-byte) loads, a fused norm-and-update. Memory-bound ops, each
 * one pass over its buffers; a faster variant is to buy a measured speed-up first.
 *
 * Tested by tests/kernels/test_backend_ops.c (every op against the CPU backend, sumsq run twice for the
 * same bits, a count past 2^31, logsumexp_rows against a float64 reference; skipped without a
 * GPU) and tests/simt/test_simt_kernels.cpp (every kernel here, from this source, against the CPU
 * backend under each card's limits).
 *
 * Legend: count elements; w, g, m, v a parameter tensor, its gradient and AdamW moments.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"
#include "ddk_rng.h"
#include "topk_row.h"   /* the top-K order and a running list, the CPU's too */

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * Errors abort (CONVENTIONS.md: a programming or device error)
 */



enum {
    THREADS = 256,
    SUMSQ_BLOCKS = 1024,   /* fixed: with THREADS, the order of sumsq's additions */
    BLOCKS_PER_SM = 32,    /* elementwise grids stop growing there (ops_cuda.cu's choice) */
};

/* blocks of THREADS for an elementwise pass over count values */
static unsigned grid_for(const ddk_backend *be, int64_t count)
{
    const int64_t wanted = (count + THREADS - 1) / THREADS;
    const int64_t most = (int64_t)ddk_cuda_multiprocessors(be) * BLOCKS_PER_SM;
    return (unsigned)(wanted < most ? wanted : most);
}

/* ------------------------------------------------------------------------------------------
 * sumsq
 */

/* the sum of v over the block (blockDim.x == THREADS) in a fixed order, returned to every
 * thread; one call per kernel (no barrier before the shared writes) */
__device__ static double block_sum_double(double v)
{
    DDK_SHARED(double, warp_sums, [THREADS / 32]);
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    if (threadIdx.x % 32 == 0)
        warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    double total = 0.0;
    for (int w = 0; w < THREADS / 32; w++)
        total += warp_sums[w];
    return total;
}

/* Launch: exactly SUMSQ_BLOCKS x THREADS. partials[b] = block b's sum of squares. A warp reads 32
 * consecutive floats per step (coalesced). */
__global__ static void sumsq_blocks_kernel(const float *x,     /* (count) */
                                           int64_t count,
                                           double *partials)   /* (SUMSQ_BLOCKS) */
{
    const int64_t stride = (int64_t)SUMSQ_BLOCKS * THREADS;
    double acc = 0.0;
    for (int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x; i < count; i += stride) {
        const double xi = x[i];
        acc += xi * xi;   /* exact square (48 bits), one rounding per addition */
    }
    acc = block_sum_double(acc);
    if (threadIdx.x == 0)
        partials[blockIdx.x] = acc;
}

/* Launch: 1 x THREADS. *sum = the partials added in a fixed order */
__global__ static void sumsq_final_kernel(const double *partials,   /* (SUMSQ_BLOCKS) */
                                          double *sum)              /* (1) */
{
    double acc = 0.0;
    for (int b = threadIdx.x; b < SUMSQ_BLOCKS; b += THREADS)
        acc += partials[b];
    acc = block_sum_double(acc);
    if (threadIdx.x == 0)
        *sum = acc;
}

double ddk_cuda_sumsq(const ddk_backend *be, const float *x, int64_t count)
{
    if (count <= 0)
        return 0.0;
    cudaStream_t stream = ddk_cuda_stream(be);
    /* the partials, then the sum, in the backend's scratch (no allocation: none can fail) */
    static_assert((SUMSQ_BLOCKS + 1) * sizeof(double) <= DDK_CUDA_SCRATCH_FLOATS * sizeof(float),
                  "sumsq's partials fit the scratch");
    double *partials = (double *)ddk_cuda_scratch_lock(be);
    DDK_LAUNCH(sumsq_blocks_kernel, SUMSQ_BLOCKS, THREADS, 0, stream, x, count, partials);
    LAUNCH_CHECK();
    DDK_LAUNCH(sumsq_final_kernel, 1, THREADS, 0, stream, partials, partials + SUMSQ_BLOCKS);
    LAUNCH_CHECK();
    double sum = 0.0;
    CUDA_CHECK(cudaMemcpyAsync(&sum, partials + SUMSQ_BLOCKS, sizeof sum, cudaMemcpyDeviceToHost,
                               stream));
    ddk_cuda_scratch_unlock(be);   /* all queued: the next holder's launches run after them */
    CUDA_CHECK(cudaStreamSynchronize(stream));
    return sum;
}

/* ------------------------------------------------------------------------------------------
 * argmax_rows: one block of THREADS per row. Each thread keeps the best (value, index) of its
 * strided elements (a strictly larger value, in index order: -inf and NaN never win; index n
 * stands for "none yet"), then a tree by shuffles and over the warps (a larger value, or an
 * equal one at a lower index, wins): the first index of the row's largest value, as the CPU's ddk_vargmax.
 */

__device__ static void argmax_merge(float *v, int32_t *i, float v2, int32_t i2)
{
    if (v2 > *v || (v2 == *v && i2 < *i))
        *v = v2, *i = i2;
}

__global__ static void argmax_rows_kernel(const float *x,   /* (rows, n) */
                                          int64_t n, int32_t *out)   /* (rows) */
{
    DDK_SHARED(float, warp_v, [THREADS / 32]);
    DDK_SHARED(int32_t, warp_i, [THREADS / 32]);
    const float *row = x + (int64_t)blockIdx.x * n;
    float best = -INFINITY;
    int32_t at = (int32_t)n;
    for (int64_t j = threadIdx.x; j < n; j += THREADS)   /* strictly larger: -inf and NaN never win */
        if (row[j] > best)
            best = row[j], at = (int32_t)j;
    for (int offset = 16; offset > 0; offset /= 2)
        argmax_merge(&best, &at, __shfl_xor_sync(0xffffffffu, best, offset),
                     __shfl_xor_sync(0xffffffffu, at, offset));
    if (threadIdx.x % 32 == 0)
        warp_v[threadIdx.x / 32] = best, warp_i[threadIdx.x / 32] = at;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < THREADS / 32; w++)   /* thread 0 holds warp 0's */
            argmax_merge(&best, &at, warp_v[w], warp_i[w]);
        out[blockIdx.x] = at < n ? at : 0;   /* a row of NaNs and -infs: 0 */
    }
}

void ddk_cuda_argmax_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int32_t *out)
{
    if (rows <= 0)
        return;
    if (rows > 0x7fffffff || n < 1 || n > 0x7fffffff)
        ddk_fatal(__FILE__, __LINE__, "argmax_rows: %lld rows of %lld: rows and n in [1, 2^31)", (long long)rows,
                  (long long)n);
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(argmax_rows_kernel, (unsigned)rows, THREADS, 0, stream, x, n, out);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * topk: one block of THREADS per row (grid-stride over rows). Each thread keeps its own top-k list
 * of its strided columns (topk_row.h's, in local memory), passing over every column that cannot
 * come before the last of the row's running list when that list is full (merge); thread 0's list
 * starts as the running list. Then k rounds: every thread offers its list's next pair (an empty
 * list a NaN at index INT32_MAX, after everything), the block's first in topk_row.h's order is
 * found by shuffles and then over the warps in order (a total order: any tree gives the same
 * pair), written out, and its thread moves on. The running list of a row that has seen off
 * columns holds min(off, k) pairs (every column enters while it has room), as on the CPU.
 */

__global__ static void topk_kernel(const float *x,      /* (rows, w) */
                                   int64_t rows, int64_t w, int64_t off, int k, int merge,
                                   int32_t *idx,        /* (rows, k) */
                                   float *val)          /* (rows, k), or NULL (merge: given) */
{
    DDK_SHARED(float, warp_v, [THREADS / 32]);
    DDK_SHARED(int32_t, warp_i, [THREADS / 32]);
    const int have = merge ? (off < k ? (int)off : k) : 0;   /* the running list's pairs */
    const int64_t total = have + w;
    const int out = total < k ? (int)total : k;
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {   /* block-uniform */
        const float *row = x + r * w;
        int32_t *ri = idx + r * k;
        float *rv = val ? val + r * k : NULL;
        float lv[DDK_SELECTOR_MAX_K];
        int32_t li[DDK_SELECTOR_MAX_K];
        int count = 0;
        if (threadIdx.x == 0)
            for (int j = 0; j < have; j++)
                ddk_topk_insert(lv, li, &count, k, rv[j], ri[j]);
        const int full = have == k;   /* then only what comes before its last can enter */
        const float last_v = full ? rv[k - 1] : 0.0f;
        const int32_t last_i = full ? ri[k - 1] : 0;
        for (int64_t j = threadIdx.x; j < w; j += THREADS) {
            const float v = row[j];
            const int32_t id = (int32_t)(off + j);
            if (!full || ddk_topk_before(v, id, last_v, last_i))
                ddk_topk_insert(lv, li, &count, k, v, id);
        }
        int head = 0;
        for (int t = 0; t < out; t++) {
            float bv = head < count ? lv[head] : NAN;
            int32_t bi = head < count ? li[head] : INT32_MAX;
            for (int offset = 16; offset > 0; offset /= 2) {
                const float ov = __shfl_xor_sync(0xffffffffu, bv, offset);
                const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, offset);
                if (ddk_topk_before(ov, oi, bv, bi))
                    bv = ov, bi = oi;
            }
            __syncthreads();   /* the previous round's (and the running list's) readers are done */
            if (threadIdx.x % 32 == 0)
                warp_v[threadIdx.x / 32] = bv, warp_i[threadIdx.x / 32] = bi;
            __syncthreads();
            bv = warp_v[0];
            bi = warp_i[0];
            for (int wp = 1; wp < THREADS / 32; wp++)
                if (ddk_topk_before(warp_v[wp], warp_i[wp], bv, bi))
                    bv = warp_v[wp], bi = warp_i[wp];
            if (head < count && li[head] == bi)   /* indices are distinct: the owner */
                head++;
            if (threadIdx.x == 0) {
                ri[t] = bi;
                if (rv)
                    rv[t] = bv;
            }
        }
    }
}

void ddk_cuda_topk_merge(const ddk_backend *be, const float *x, int64_t rows, int64_t w,
                         int64_t off, int64_t k, int merge, int32_t *idx, float *val)
{
    if (rows <= 0)
        return;
    if (k < 1 || k > DDK_SELECTOR_MAX_K || w < 1 || off < 0 || off + w > 0x7fffffff ||
        (merge && !val))
        ddk_fatal(__FILE__, __LINE__, "topk: k %lld of rows of %lld (at %lld): 1 <= k <= %d",
                  (long long)k, (long long)w, (long long)off, DDK_SELECTOR_MAX_K);
    cudaStream_t stream = ddk_cuda_stream(be);
    const unsigned grid = (unsigned)(rows < 65535 ? rows : 65535);
    DDK_LAUNCH(topk_kernel, grid, THREADS, 0, stream, x, rows, w, off, (int)k, merge, idx, val);
    LAUNCH_CHECK();
}

void ddk_cuda_topk_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int64_t k,
                        int32_t *idx, float *val)
{
    if (rows > 0 && (k < 1 || k > n))
        ddk_fatal(__FILE__, __LINE__, "topk_rows: k %lld of rows of %lld: 1 <= k <= min(n, %d)",
                  (long long)k, (long long)n, DDK_SELECTOR_MAX_K);
    ddk_cuda_topk_merge(be, x, rows, n, 0, k, 0, idx, val);
}

/* ------------------------------------------------------------------------------------------
 * logsumexp_rows: one block of THREADS per row, as argmax_rows: the rows it serves are logit
 * rows of a vocabulary (thousands to the seed's 248,320 columns), where a block streams one
 * row at the memory's rate; a warp per row would leave such a row to 32 threads, and the narrow
 * rows of small vocabularies cost little either way. Each thread takes the max of its strided
 * columns (NaNs passed over), the block's max comes by shuffles and over the warps (fmaxf:
 * exact, any order); then each thread adds exp(x - max) of its columns in double (expf in
 * float, each term in [0, 1]: a float sum of ~1000 terms a thread would err by up to 6e-5 of
 * the sum, double by the terms' own 2 ulp; a conversion and an add a column, which sm_120's fp64
 * rate, 1/64 of its fp32, still does about twice as fast as its memory delivers columns),
 * block_sum_double's fixed tree adds the threads' sums, and thread 0
 * writes lse = max + log s and lp = (x[col] - max) - log s, in double and rounded once, with
 * vector_cpu.c's rules for NaN, +-inf, a row of only -inf and NaN and a col outside [0, n).
 * Deterministic: the same order at every call, no atomics.
 */

/* the largest v of the block (blockDim.x == THREADS; no thread's v is NaN), returned to every
 * thread; one call per kernel (no barrier before the shared writes) */
__device__ static float block_max(float v)
{
    DDK_SHARED(float, warp_max, [THREADS / 32]);
    for (int offset = 16; offset > 0; offset /= 2)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
    if (threadIdx.x % 32 == 0)
        warp_max[threadIdx.x / 32] = v;
    __syncthreads();   /* every warp's max written */
    for (int w = 0; w < THREADS / 32; w++)
        v = fmaxf(v, warp_max[w]);
    return v;
}

/* x's term of its row's sum, exp(x - m) (m the row's max): 0 for a NaN, 1 where x is the max
 * itself (a +inf max: inf - inf would be NaN) */
__device__ static float lse_term(float x, float m)
{
    return x != x ? 0.0f : x == m ? 1.0f : expf(x - m);
}

/* x - m in double, the exponent of a column's probability: -inf for a NaN, 0 at the max itself */
__device__ static double lse_shift(float x, float m)
{
    return x != x ? -INFINITY : x == m ? 0.0 : (double)x - (double)m;
}

/* Launch: rows x THREADS, one block a row */
__global__ static void logsumexp_rows_kernel(const float *x,       /* (rows, n) */
                                             int64_t n,
                                             const int32_t *col,   /* (rows), read when lp */
                                             float *lse,           /* (rows) */
                                             float *lp)            /* (rows), or NULL */
{
    const float *row = x + (int64_t)blockIdx.x * n;
    float m = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += THREADS)   /* strictly larger: NaN never */
        if (row[j] > m)
            m = row[j];
    m = block_max(m);
    double s = 0.0;
    for (int64_t j = threadIdx.x; m > -INFINITY && j < n; j += THREADS)   /* m: block-uniform */
        s += (double)lse_term(row[j], m);
    s = block_sum_double(s);
    if (threadIdx.x != 0)
        return;
    const double log_s = log(s);
    lse[blockIdx.x] = m == -INFINITY ? -INFINITY : (float)((double)m + log_s);
    if (lp) {
        const int64_t c = col[blockIdx.x];
        lp[blockIdx.x] = m == -INFINITY || c < 0 || c >= n ? -INFINITY
                                                           : (float)(lse_shift(row[c], m) - log_s);
    }
}

void ddk_cuda_logsumexp_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n,
                             const int32_t *col, float *lse, float *lp)
{
    if (rows <= 0)
        return;
    if (rows > 0x7fffffff || n < 1 || n > 0x7fffffff)
        ddk_fatal(__FILE__, __LINE__, "logsumexp_rows: %lld rows of %lld: rows and n in [1, 2^31)",
                  (long long)rows, (long long)n);
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(logsumexp_rows_kernel, (unsigned)rows, THREADS, 0, stream, x, n, col, lse, lp);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * axpby: y = alpha x + beta y; with beta = 0, y = alpha x without reading y (a NaN there must
 * not leak through 0 * NaN). Launch: grid-stride, THREADS per block, one element per step.
 */

__global__ static void axpby_kernel(int64_t count, float alpha,
                                    const float *x,   /* (count) */
                                    float beta,
                                    float *y)         /* (count), may be x */
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float ax = alpha * x[i];
        y[i] = beta == 0.0f ? ax : ax + beta * y[i];
    }
}

void ddk_cuda_axpby(const ddk_backend *be, int64_t count, float alpha, const float *x, float beta,
                    float *y)
{
    if (count <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(axpby_kernel, grid_for(be, count), THREADS, 0, stream, count, alpha, x, beta, y);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * AdamW, per element in float32, in vector_cpu.c's adamw_loop order (ddk.h has the formula).
 * Launch: grid-stride, THREADS per block. sqrtf and the division are IEEE (no fast math).
 */

__global__ static void adamw_kernel(float *w, float *g, float *m, float *v,   /* (count) each */
                                    __nv_bfloat16 *w16,                       /* (count) or NULL */
                                    int64_t count, ddk_adamw_scalars s)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float gi = g[i] * s.grad_scale;
        g[i] = gi;
        const float mi = s.beta1 * m[i] + s.one_minus_beta1 * gi;
        const float vi = s.beta2 * v[i] + s.one_minus_beta2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        const float direction = (mi * s.inv_bc1) / (sqrtf(vi * s.inv_bc2) + s.eps);
        const float wi = w[i] - (s.lr * direction + s.lr_wd * w[i]);
        w[i] = wi;
        if (w16)   /* the bf16 copy, round to nearest even as ddk_f32_to_bf16 */
            w16[i] = __float2bfloat16_rn(wi);
    }
}

void ddk_cuda_adamw(const ddk_backend *be, float *w, float *g, float *m, float *v, uint16_t *w16,
                    int64_t count, const ddk_adamw_scalars *s)
{
    if (count <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(adamw_kernel, grid_for(be, count), THREADS, 0, stream, w, g, m, v, (__nv_bfloat16 *)w16,
                                                              count, *s);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * The features' noise: element i from its own counter draw (ddk_rng_at), one fmaf: the CPU's
 * bits. Launch: grid-stride, THREADS per block.
 */

__global__ static void uniform_noise_kernel(float *x,   /* (count) */
                                            int64_t count, float sigma, uint64_t seed)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float t = (float)(ddk_rng_at(seed, (uint64_t)i) >> 40) * 0x1p-23f - 1.0f;   /* exact */
        x[i] = fmaf(sigma, t, x[i]);
    }
}

void ddk_cuda_uniform_noise(const ddk_backend *be, float *x, int64_t count, float sigma, uint64_t seed)
{
    if (count <= 0 || sigma == 0.0f)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(uniform_noise_kernel, grid_for(be, count), THREADS, 0, stream, x, count, sigma, seed);
    LAUNCH_CHECK();
}
