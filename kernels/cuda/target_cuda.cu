/* target_cuda.cu: the frozen target's small ops on the GPU (contracts in ddk.h, struct
 * ddk_backend): the bf16 embedding gather (embedding_w16), the rounding of matmul_w16's fp32
 * operand into bf16 (ddk_cuda_round_bf16_rows, called by matmul_cuda.cu's matmul_w16), and the
 * Qwen3.5 target's element-wise steps: the DeltaNet's q / k l2 normalisation (l2norm_heads) and
 * gates (delta_gates), the gated attention's output gate (sigmoid_mul). Plain kernels, each queued
 * on the backend's stream (backend_cuda.cu); none allocates.
 *
 * Numbers against the CPU backend (the reference): the gather and the rounding are exact (bf16
 * widening; round to nearest even, __float2bfloat16_rn, as ddk_bf16.h does for every non-NaN
 * value); l2norm_heads sums its squares per lane then by a shuffle tree (the CPU: in index
 * order), a fixed order, so results are deterministic for a given shape and GPU; expf and
 * log1pf are CUDA's (2 and 1 ulp), IEEE division and sqrtf (nvcc's defaults). test_backend_ops.c
 * holds the tolerances and why.
 *
 * Deliberately not here: fusing these steps with the projections around them (each is
 * O(T x width), memory-bound, small next to the O(T x width x H) products; CONVENTIONS.md).
 *
 * Tested by tests/kernels/test_backend_ops.c (every op x shapes, against the CPU backend; skipped
 * without a GPU).
 *
 * Legend: rows gathered tokens, H hidden size, V vocabulary; T tokens, heads of d values (row
 * stride ld), nv value heads; count elements.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

/* ------------------------------------------------------------------------------------------
 * Launch helpers (as ops_cuda.cu's)
 */

static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* grid-stride kernels stop growing at this many blocks per multiprocessor */
enum { BLOCKS_PER_SM = 32, THREADS = 256 };

static unsigned grid_for(const ddk_backend *be, int64_t blocks_wanted)
{
    return (unsigned)min64(blocks_wanted < 1 ? 1 : blocks_wanted,
                           (int64_t)ddk_cuda_multiprocessors(be) * BLOCKS_PER_SM);
}

/* ------------------------------------------------------------------------------------------
 * bf16 in and out: the embedding gather from the bf16 table, and matmul_w16's operand rounded
 */

__device__ static float bf16_bits_to_float(uint16_t x)
{
    return __uint_as_float((uint32_t)x << 16);
}

/* One block per row (grid-stride), its threads along H */
__global__ static void embedding_w16_kernel(const uint16_t *table,  /* (V, H) bf16 */
                                            const int32_t *tokens,  /* (rows) */
                                            int64_t rows, int64_t H,
                                            float *out)             /* (rows, H) */
{
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const uint16_t *src = table + (int64_t)tokens[r] * H;
        float *dst = out + r * H;
        for (int64_t i = threadIdx.x; i < H; i += blockDim.x)
            dst[i] = bf16_bits_to_float(src[i]);
    }
}

void ddk_cuda_embedding_w16(const ddk_backend *be, const uint16_t *table, const int32_t *tokens,
                            int64_t rows, int64_t H, float *out)
{
    if (rows <= 0 || H <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    const unsigned threads = (unsigned)min64(THREADS, ceil_div(H, 32) * 32);
    DDK_LAUNCH(embedding_w16_kernel, grid_for(be, rows), threads, 0, stream, table, tokens, rows, H, out);
    LAUNCH_CHECK();
}

/* dst (rows, ld_dst) bf16 = round(src (rows, cols), row stride ld_src): one thread an element,
 * grid-stride over rows x cols; dst's columns past cols are not written */
__global__ static void round_bf16_kernel(const float *src, int64_t ld_src, int64_t rows,
                                         int64_t cols, __nv_bfloat16 *dst, int64_t ld_dst)
{
    const int64_t n = rows * cols;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < n;
         e += (int64_t)gridDim.x * blockDim.x) {
        if (ld_src == cols && ld_dst == cols) {   /* contiguous: no division */
            dst[e] = __float2bfloat16_rn(src[e]);
            continue;
        }
        const int64_t r = e / cols, c = e % cols;
        dst[r * ld_dst + c] = __float2bfloat16_rn(src[r * ld_src + c]);
    }
}

void ddk_cuda_round_bf16_rows(const ddk_backend *be, const float *src, int64_t ld_src,
                              int64_t rows, int64_t cols, uint16_t *dst, int64_t ld_dst)
{
    if (rows <= 0 || cols <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(round_bf16_kernel, grid_for(be, ceil_div(rows * cols, THREADS)), THREADS, 0, stream,
        src, ld_src, rows, cols, (__nv_bfloat16 *)dst, ld_dst);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * The Qwen3.5 target's element-wise steps
 */

__device__ static float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

__device__ static float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

/* One warp per (token, head), grid-stride over T x heads: lane l sums the squares of elements
 * l, l + 32, ..., the warp adds the lanes (a fixed tree), then every lane scales its elements.
 * In place is safe: a lane writes only the elements it read. */
__global__ static void l2norm_heads_kernel(const float *src, int64_t ld,  /* (T, ld) */
                                           int64_t T, int64_t heads, int64_t d, float scale,
                                           float eps, float *dst)         /* (T, heads, d) */
{
    const int lane = (int)(threadIdx.x % 32);
    const int64_t warps_per_block = blockDim.x / 32;
    const int64_t first = (int64_t)blockIdx.x * warps_per_block + threadIdx.x / 32;
    for (int64_t th = first; th < T * heads; th += (int64_t)gridDim.x * warps_per_block) {
        const int64_t t = th / heads, h = th % heads;
        const float *x = src + t * ld + h * d;   /* (d) */
        float *y = dst + th * d;                 /* (d) */
        float ss = 0.0f;
        for (int64_t i = lane; i < d; i += 32)
            ss += x[i] * x[i];
        ss = warp_sum(ss);
        const float f = scale / sqrtf(ss + eps);
        for (int64_t i = lane; i < d; i += 32)
            y[i] = x[i] * f;
    }
}

void ddk_cuda_l2norm_heads(const ddk_backend *be, const float *src, int64_t ld, int64_t T,
                           int64_t heads, int64_t d, float scale, float eps, float *dst)
{
    if (T <= 0 || heads <= 0 || d <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(l2norm_heads_kernel, grid_for(be, ceil_div(T * heads, THREADS / 32)), THREADS, 0, stream,
        src, ld, T, heads, d, scale, eps, dst);
    LAUNCH_CHECK();
}

__global__ static void sigmoid_mul_kernel(float *x, const float *gate, int64_t count)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x)
        x[i] *= sigmoid(gate[i]);
}

void ddk_cuda_sigmoid_mul(const ddk_backend *be, float *x, const float *gate, int64_t count)
{
    if (count <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(sigmoid_mul_kernel, grid_for(be, ceil_div(count, THREADS)), THREADS, 0, stream, x, gate, count);
    LAUNCH_CHECK();
}

/* softplus(s) = s above this (torch's threshold), as the CPU backend */
#define SOFTPLUS_LINEAR 20.0f

/* One thread per (token, value head), grid-stride; each reads its b and a before writing beta
 * and g, so beta = b and g = a (in place) are safe */
__global__ static void delta_gates_kernel(const float *b, const float *a,          /* (T, nv) */
                                          const float *A_log, const float *dt_bias, /* (nv) */
                                          int64_t count, int64_t nv,
                                          float *beta, float *g)                    /* (T, nv) */
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < count;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t j = i % nv;
        const float s = a[i] + dt_bias[j], bi = b[i];
        beta[i] = sigmoid(bi);
        g[i] = -expf(A_log[j]) * (s > SOFTPLUS_LINEAR ? s : log1pf(expf(s)));   /* log decay <= 0 */
    }
}

void ddk_cuda_delta_gates(const ddk_backend *be, const float *b, const float *a, const float *A_log,
                          const float *dt_bias, int64_t T, int64_t nv, float *beta, float *g)
{
    if (T <= 0 || nv <= 0)
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(delta_gates_kernel, grid_for(be, ceil_div(T * nv, THREADS)), THREADS, 0, stream,
        b, a, A_log, dt_bias, T * nv, nv, beta, g);
    LAUNCH_CHECK();
}
