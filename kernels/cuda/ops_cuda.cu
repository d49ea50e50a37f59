/* ops_cuda.cu: the drafter's and the target's small ops on the GPU (contracts in ddk.h, struct
 * ddk_backend): RMSNorm forward and backward, rotate-half RoPE (whole and partial), SwiGLU
 * forward and backward, the embedding gather, and the Qwen3.5 target's conv1d + silu and gated
 * RMSNorm (its DeltaNet core is in deltanet_cuda.cu). Plain fp32 kernels, one per op and pass,
 * each queued on the backend's stream (backend_cuda.cu); forward ops overwrite, backward ops ADD
 * into their gradients.
 *
 * Deliberately not here: fusion with the matrix products, vector (16-byte) loads, bf16. These
 * ops are memory-bound and small next to the matrix products and attention; each such step is
 * to buy a measured speed-up first (CONVENTIONS.md).
 *
 * Numbers against the CPU backend (the reference): reductions are float here (double there),
 * in a fixed order, so results are deterministic for a given shape and GPU; the RoPE angles are
 * formed in double as on the CPU. tests/kernels/test_backend_ops.c holds the tolerances and why.
 *
 * Tested by tests/kernels/test_backend_ops.c (every op x shapes, against the CPU backend; skipped
 * without a GPU).
 *
 * Legend: rows independent vectors (tokens, or tokens * heads), d values per vector, heads per
 * token (rope), rd rotated dims (rope_partial), count elements (swiglu), H hidden size, V
 * vocabulary, T tokens, C channels and K taps (conv1d_silu).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * Launch helpers
 */

/* A launch that failed (bad configuration, a sticky error) is a device error: abort with the
 * file, line and CUDA's message. Faults inside a kernel surface at ddk_cuda_synchronize. */


__host__ __device__ static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

__host__ __device__ static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* threads for a block that walks d values: whole warps, at most 256, so a row of d = 5120 is
 * 20 strided values per thread and a head of d = 64 is two warps, not eight idle ones */
static unsigned row_threads(int64_t d)
{
    return (unsigned)min64(256, ceil_div(d < 1 ? 1 : d, 32) * 32);
}

/* grids of grid-stride kernels stop growing at this many blocks per multiprocessor: more only
 * adds scheduling, and it keeps gridDim.x far below its 2^31 - 1 limit */
enum { BLOCKS_PER_SM = 32 };

static unsigned grid_for(const ddk_backend *be, int64_t blocks_wanted)
{
    return (unsigned)min64(blocks_wanted, (int64_t)ddk_cuda_multiprocessors(be) * BLOCKS_PER_SM);
}

/* ------------------------------------------------------------------------------------------
 * Reductions. Both return the same bits for the same inputs: the order is fixed by the
 * thread indices, never by timing.
 */

__device__ static float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* the sum of v over the block (blockDim.x a multiple of 32, <= 1024), returned to every thread */
__device__ static float block_sum(float v)
{
    DDK_SHARED(float, warp_sums, [32]);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    v = warp_sum(v);
    __syncthreads();   /* a previous call's readers are done with warp_sums */
    if (lane == 0)
        warp_sums[warp] = v;
    __syncthreads();
    return warp_sum(lane < warps ? warp_sums[lane] : 0.0f);   /* every warp, the same order */
}

/* ------------------------------------------------------------------------------------------
 * RMSNorm forward. y = x s g, s = (mean(x^2) + eps)^(-1/2).
 * Launch: one block per row (grid-stride over rows), row_threads(d) threads striding over d.
 * Why: a row is the unit of the reduction, and the block's warps sum it with shuffles and one
 * shared-memory exchange, no atomics. The sum of squares is float (the CPU's is double): the
 * tolerance in the test says what that costs. y may be x: every read of a row happens before
 * block_sum's barriers, every write after.
 */

__global__ static void rmsnorm_kernel(const float *x,   /* (rows, d) */
                                      const float *g,   /* (d) */
                                      int64_t rows, int64_t d, float eps,
                                      float *y,         /* (rows, d) */
                                      float *rstd)      /* (rows) or NULL */
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * d;
        float *yr = y + r * d;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            ss += xr[i] * xr[i];
        ss = block_sum(ss);
        const float s = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));   /* once per row */
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            yr[i] = xr[i] * s * g[i];
        if (rstd && threadIdx.x == 0)
            rstd[r] = s;
    }
}

void ddk_cuda_rmsnorm(const ddk_backend *be, const float *x, const float *g, int64_t rows,
                      int64_t d, float eps, float *y, float *rstd)
{
    if (rows <= 0 || d <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(rmsnorm_kernel, grid_for(be, rows), row_threads(d), 0, stream, x, g, rows, d, eps, y, rstd);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * RMSNorm backward: dx = s (g dy) - x s^3 / d * sum(x g dy), dg = sum over rows of dy x s.
 *
 * dx: one block per row, as the forward (the dot product is a row reduction).
 *
 * dg is a reduction over rows, per column. Choice: deterministic per-slice partials, not
 * atomicAdd. Pass 1 cuts the rows into `slices`; each block sums one slice for 32 columns into a
 * partial (or, with one slice, straight into dg); pass 2 adds the partials to dg in slice order.
 * Atomics would need no scratch and no second pass, but their order follows timing, so two
 * identical steps could differ in the last bits and exact-resume checks could not be exact.
 * The partials live in the backend's scratch (4 MiB, made with the stream, held under a lock
 * from pass 1 to pass 2); the number of slices depends on rows, d and the GPU's multiprocessor
 * count, so the bits are the same for the same shape on the same kind of GPU.
 */

__global__ static void rmsnorm_backward_dx_kernel(const float *x,    /* (rows, d) */
                                                  const float *g,    /* (d) */
                                                  const float *rstd, /* (rows) */
                                                  const float *dy,   /* (rows, d) */
                                                  int64_t rows, int64_t d,
                                                  float *dx)         /* (rows, d) += */
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * d, *dyr = dy + r * d;
        float *dxr = dx + r * d;
        const float s = rstd[r];
        float dot = 0.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            dot += xr[i] * g[i] * dyr[i];
        dot = block_sum(dot);
        const float k = (float)((double)dot * s * s * s / (double)d);
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            dxr[i] += s * g[i] * dyr[i] - xr[i] * k;
    }
}

enum { DG_COLS = 32, DG_ROW_LANES = 8 };   /* pass 1's block: a warp's width of columns x 8 row lanes */

/* Launch: grid (ceil(d / 32), slices), block (32, 8). Each warp reads 32 consecutive columns of
 * one row (one 128-byte line), the 8 warps of the block take every 8th row of the slice, and the
 * block sums its 8 row lanes in shared memory in lane order. */
__global__ static void rmsnorm_backward_dg_kernel(const float *x,    /* (rows, d) */
                                                  const float *rstd, /* (rows) */
                                                  const float *dy,   /* (rows, d) */
                                                  int64_t rows, int64_t d, int64_t rows_per_slice,
                                                  float *partials,   /* (slices, d), or NULL: */
                                                  float *dg)         /* (d) += when partials is NULL */
{
    DDK_SHARED(float, lanes, [DG_ROW_LANES][DG_COLS]);
    const int64_t col = (int64_t)blockIdx.x * DG_COLS + threadIdx.x;
    const int64_t r0 = (int64_t)blockIdx.y * rows_per_slice;
    const int64_t r1 = min64(rows, r0 + rows_per_slice);
    float acc = 0.0f;
    if (col < d)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += DG_ROW_LANES)
            acc += dy[r * d + col] * x[r * d + col] * rstd[r];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < d) {
        float sum = 0.0f;
        for (int lane = 0; lane < DG_ROW_LANES; lane++)
            sum += lanes[lane][threadIdx.x];
        if (partials)
            partials[(int64_t)blockIdx.y * d + col] = sum;
        else
            dg[col] += sum;
    }
}

/* Launch: ceil(d / 256) blocks of 256 threads, a thread per column; consecutive threads read
 * consecutive columns of each slice's partial row. */
__global__ static void rmsnorm_backward_dg_reduce_kernel(const float *partials, /* (slices, d) */
                                                         int64_t slices, int64_t d,
                                                         float *dg)             /* (d) += */
{
    const int64_t col = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= d)
        return;
    float sum = 0.0f;
    for (int64_t p = 0; p < slices; p++)
        sum += partials[p * d + col];
    dg[col] += sum;
}

/* pass 1's blocks wanted per multiprocessor: 8 blocks of 256 threads fill one (2048 threads) */
enum { DG_BLOCKS_PER_SM = 8, DG_MIN_ROWS_PER_SLICE = 32 };

void ddk_cuda_rmsnorm_backward(const ddk_backend *be, const float *x, const float *g,
                               const float *rstd, const float *dy, int64_t rows, int64_t d,
                               float *dx, float *dg)
{
    if (rows <= 0 || d <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(rmsnorm_backward_dx_kernel, grid_for(be, rows), row_threads(d), 0, stream,
        x, g, rstd, dy, rows, d, dx);
    LAUNCH_CHECK();

    /* slices: enough blocks to fill the GPU, each slice 32 rows or more (4 per row lane), at
     * most 65535 (gridDim.y) and as many as the scratch holds */
    const int64_t col_tiles = ceil_div(d, DG_COLS);
    int64_t slices = ceil_div((int64_t)ddk_cuda_multiprocessors(be) * DG_BLOCKS_PER_SM, col_tiles);
    slices = min64(slices, ceil_div(rows, DG_MIN_ROWS_PER_SLICE));
    slices = min64(slices, 65535);
    float *partials = NULL;
    if (slices > 1) {
        partials = ddk_cuda_scratch_lock(be);
        slices = min64(slices, (int64_t)DDK_CUDA_SCRATCH_FLOATS / d);
        if (slices <= 1) {   /* d too wide for the scratch: one slice, straight into dg */
            ddk_cuda_scratch_unlock(be);
            partials = NULL;
            slices = 1;
        }
    } else {
        slices = 1;
    }
    const int64_t rows_per_slice = ceil_div(rows, slices);
    slices = ceil_div(rows, rows_per_slice);   /* no empty slice at the end */
    const dim3 grid((unsigned)col_tiles, (unsigned)slices), block(DG_COLS, DG_ROW_LANES);
    DDK_LAUNCH(rmsnorm_backward_dg_kernel, grid, block, 0, stream, x, rstd, dy, rows, d, rows_per_slice,
               partials, dg);
    LAUNCH_CHECK();
    if (partials) {
        DDK_LAUNCH(rmsnorm_backward_dg_reduce_kernel, (unsigned)ceil_div(d, 256), 256, 0, stream,
            partials, slices, d, dg);
        LAUNCH_CHECK();
        ddk_cuda_scratch_unlock(be);   /* both passes queued: the next holder runs after them */
    }
}

/* ------------------------------------------------------------------------------------------
 * RoPE, rotate-half, in place: pair (x_i, x_{i+rd/2}) of every head of row r turns by
 * pos[r] * theta^(-2i/rd) (the negative angle when inverse); rope is rd = d, rope_partial (the
 * Qwen3.5 target's partial rotary) rd < d, dims rd..d-1 untouched. One kernel for both, so
 * rope_partial with rd = d is rope bit for bit (the same expressions on the same values).
 * Launch: blocks of whole warps covering rd/2 (<= 512) threads, grid-stride over rows. Thread i
 * owns frequency i: it forms theta^(-2i/d) once, then per row the angle, its cos and sin, and
 * turns pair i of every head of the row, so a warp touches 32 consecutive floats of each half.
 * Angles, cos and sin are double as on the CPU (pos up to 10^5 times a frequency near 1 would
 * lose 3 digits of the angle in float), then rounded to float as there.
 */

__global__ static void rope_kernel(float *x,            /* (rows, heads, d) in place */
                                   const int32_t *pos,  /* (rows) */
                                   int64_t rows, int64_t heads, int64_t d, int64_t rd,
                                   float theta, double sign)
{
    const int64_t half = rd / 2, i = threadIdx.x;
    if (i >= half)
        return;   /* no barrier below: idle threads may leave */
    const double inv_freq = pow((double)theta, -2.0 * (double)i / (double)rd);
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        double sin_d, cos_d;
        sincos(sign * (double)pos[r] * inv_freq, &sin_d, &cos_d);
        const float c = (float)cos_d, s = (float)sin_d;
        for (int64_t h = 0; h < heads; h++) {
            float *xh = x + (r * heads + h) * d;
            const float a = xh[i], b = xh[i + half];
            xh[i] = a * c - b * s;
            xh[i + half] = b * c + a * s;
        }
    }
}

void ddk_cuda_rope(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                   int64_t heads, int64_t d, float theta, int inverse)
{
    if (rows <= 0 || heads <= 0 || d < 2)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    const unsigned threads = (unsigned)(ceil_div(d / 2, 32) * 32);   /* d <= 1024: <= 512 */
    DDK_LAUNCH(rope_kernel, grid_for(be, rows), threads, 0, stream, x, pos, rows, heads, d, d, theta,
                                                            inverse ? -1.0 : 1.0);
    LAUNCH_CHECK();
}

/* the first rd of each head's d dims (ddk.h: rd even, 2 <= rd <= d <= 1024) */
void ddk_cuda_rope_partial(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                           int64_t heads, int64_t d, int64_t rd, float theta)
{
    if (rows <= 0 || heads <= 0 || rd < 2 || rd > d)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    const unsigned threads = (unsigned)(ceil_div(rd / 2, 32) * 32);   /* rd <= 1024: <= 512 */
    DDK_LAUNCH(rope_kernel, grid_for(be, rows), threads, 0, stream, x, pos, rows, heads, d, rd, theta,
                                                            1.0);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * SwiGLU: h = silu(gate) up, silu(x) = x sigmoid(x); backward
 * dgate += dh up silu'(gate), silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))), dup += dh silu(gate).
 * Launch: grid-stride, 256 threads per block, one element per thread per step: elementwise and
 * memory-bound, coalesced. expf and the division are CUDA's accurate ones (no fast math).
 * h may be gate or up: each element is read before it is written, by the same thread.
 */

__device__ static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* gate and up as fp32, or as a bf16 step keeps them (bf16 bits, widened exactly) */
__device__ static float value_of(float x)
{
    return x;
}

__device__ static float value_of(uint16_t x)
{
    return __uint_as_float((uint32_t)x << 16);
}

template <typename T>
__global__ static void swiglu_kernel(const T *gate, const T *up, /* (count) */
                                     int64_t count, float *h)    /* (count) */
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = value_of(gate[i]);
        h[i] = g * sigmoid(g) * value_of(up[i]);
    }
}

template <typename T>
__global__ static void swiglu_backward_kernel(const T *gate, const T *up,
                                              const float *dh,          /* (count) */
                                              int64_t count,
                                              float *dgate, float *dup) /* (count) += */
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const float g = value_of(gate[i]), u = value_of(up[i]);
        const float s = sigmoid(g);
        dgate[i] += dh[i] * u * s * (1.0f + g * (1.0f - s));
        dup[i] += dh[i] * g * s;
    }
}

template <typename T>
static void swiglu_launch(const ddk_backend *be, const T *gate, const T *up, int64_t count, float *h)
{
    if (count <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(swiglu_kernel<T>, grid_for(be, ceil_div(count, 256)), 256, 0, stream, gate, up, count, h);
    LAUNCH_CHECK();
}

template <typename T>
static void swiglu_backward_launch(const ddk_backend *be, const T *gate, const T *up,
                                   const float *dh, int64_t count, float *dgate, float *dup)
{
    if (count <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(swiglu_backward_kernel<T>, grid_for(be, ceil_div(count, 256)), 256, 0, stream,
        gate, up, dh, count, dgate, dup);
    LAUNCH_CHECK();
}

void ddk_cuda_swiglu(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                     float *h)
{
    swiglu_launch(be, gate, up, count, h);
}

void ddk_cuda_swiglu_backward(const ddk_backend *be, const float *gate, const float *up,
                              const float *dh, int64_t count, float *dgate, float *dup)
{
    swiglu_backward_launch(be, gate, up, dh, count, dgate, dup);
}

void ddk_cuda_swiglu_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                        int64_t count, float *h)
{
    swiglu_launch(be, gate, up, count, h);
}

void ddk_cuda_swiglu_backward_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                                 const float *dh, int64_t count, float *dgate, float *dup)
{
    swiglu_backward_launch(be, gate, up, dh, count, dgate, dup);
}

/* ------------------------------------------------------------------------------------------
 * Embedding gather: out[r] = table[tokens[r]].
 * Launch: one block per row (grid-stride), row_threads(H) threads copying the row in strides:
 * every warp reads and writes 32 consecutive floats. Tokens are in [0, V) (callers check).
 */

__global__ static void embedding_kernel(const float *table,     /* (V, H) */
                                        const int32_t *tokens,  /* (rows) */
                                        int64_t rows, int64_t H,
                                        float *out)             /* (rows, H) */
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *src = table + (int64_t)tokens[r] * H;
        float *dst = out + r * H;
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
            dst[i] = src[i];
    }
}

void ddk_cuda_embedding(const ddk_backend *be, const float *table, const int32_t *tokens,
                        int64_t rows, int64_t H, float *out)
{
    if (rows <= 0 || H <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(embedding_kernel, grid_for(be, rows), row_threads(H), 0, stream, table, tokens, rows, H,
                                                                        out);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * The Qwen3.5 target's causal depthwise conv1d + silu (SPEC.md 3.1):
 * y[t, c] = silu(sum_{m < K} w[c, m] x[t - (K-1) + m, c]), rows before t = 0 from history
 * (K-1, C) or 0.
 * Launch: grid-stride, 256 threads per block, one (t, c) per thread per step: consecutive
 * threads take consecutive channels of a row, so each tap reads a coalesced row of x. The K
 * taps are summed in float in tap order, as on the CPU. y overlaps neither x nor history (ddk.h).
 */

__global__ static void conv1d_silu_kernel(const float *x,        /* (T, C) */
                                          const float *w,        /* (C, K) */
                                          const float *history,  /* (K-1, C) or NULL */
                                          int64_t T, int64_t C, int64_t K,
                                          float *y)              /* (T, C) */
{
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < T * C;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / C, c = e % C;
        const float *wc = w + c * K;   /* (K): tap m reads row t - (K-1) + m */
        float acc = 0.0f;
        for (int64_t m = 0; m < K; m++) {
            const int64_t s = t - (K - 1) + m;
            const float xs = s >= 0   ? x[s * C + c]
                             : history ? history[(K - 1 + s) * C + c]   /* (K-1, C) */
                                       : 0.0f;
            acc += wc[m] * xs;
        }
        y[e] = acc / (1.0f + expf(-acc));
    }
}

void ddk_cuda_conv1d_silu(const ddk_backend *be, const float *x, const float *w,
                          const float *history, int64_t T, int64_t C, int64_t K, float *y)
{
    if (T <= 0 || C <= 0 || K <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(conv1d_silu_kernel, grid_for(be, ceil_div(T * C, 256)), 256, 0, stream, x, w, history, T,
                                                                               C, K, y);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * Gated RMSNorm (the DeltaNet output norm, SPEC.md 3.1): y = x s w silu(z),
 * s = (mean(x^2) + eps)^(-1/2), the norm of x before the gate.
 * Launch: as rmsnorm's forward (one block per row, grid-stride, row_threads(d) threads, the sum
 * of squares in float through block_sum). y may be x or z: every read of x for the sum happens
 * before block_sum's barriers, and each element's x and z are read by the thread that then
 * writes its y.
 */

__global__ static void gated_rmsnorm_kernel(const float *x,   /* (rows, d) */
                                            const float *z,   /* (rows, d) */
                                            const float *w,   /* (d) */
                                            int64_t rows, int64_t d, float eps,
                                            float *y)         /* (rows, d) */
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * d, *zr = z + r * d;
        float *yr = y + r * d;
        float ss = 0.0f;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            ss += xr[i] * xr[i];
        ss = block_sum(ss);
        const float s = (float)(1.0 / sqrt((double)ss / (double)d + (double)eps));   /* once per row */
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) {
            const float zi = zr[i];
            yr[i] = xr[i] * s * w[i] * (zi / (1.0f + expf(-zi)));
        }
    }
}

void ddk_cuda_gated_rmsnorm(const ddk_backend *be, const float *x, const float *z, const float *w,
                            int64_t rows, int64_t d, float eps, float *y)
{
    if (rows <= 0 || d <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(gated_rmsnorm_kernel, grid_for(be, rows), row_threads(d), 0, stream, x, z, w, rows, d, eps,
                                                                            y);
    LAUNCH_CHECK();
}
