/* block_conv_cuda.cu: the DFlash2 drafter's grouped dynamic causal convolution over the slots of
 * each block (SPEC.md 2.1), forward and backward, on the GPU (contract in ddk.h, struct
 * ddk_backend: block_conv, block_conv_backward). Plain fp32 kernels queued on the backend's
 * stream (backend_cuda.cu), launched through launch.h so that the SIMT emulation runs them too.
 * The forward overwrites y; the backward ADDS into dx, dbase and ddelta.
 *
 * Deterministic: no atomics. Every output element is written by one thread, which sums its
 * terms in a fixed order: y and dx over the taps, ddelta over the group's gs channels (both as
 * the CPU backend, kernels/cpu/block_conv_cpu.c), dbase over the rows in row lanes summed in
 * lane order (the CPU adds the rows one by one: the two differ by float rounding). An element's
 * bits do not depend on the grid (the grid-stride grids grow with the GPU's multiprocessors,
 * but each element is one thread's whole sum), so they are the same on every card.
 *
 * Deliberately not here: fusion with the projection that makes delta or with the products
 * around the convolution, vector loads, bf16. The op is memory-bound and a few multiply-adds an
 * element, small next to the drafter's matrix products; each such step is to buy a measured
 * speed-up first (CONVENTIONS.md).
 *
 * Tested by tests/kernels/test_backend_ops.c against the CPU backend (skipped without a GPU) and,
 * without a GPU, from this source by tests/simt/test_simt_kernels.cpp under each card's limits
 * (the same bits with blocks and threads run in the reverse order).
 *
 * Legend: rows block rows (a multiple of B), B block size (row t is slot t % B), H channels,
 * taps kernel taps, gs channels a group, G = H / gs groups, ld_delta delta's row stride.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"

#include <cuda_runtime.h>

/* ------------------------------------------------------------------------------------------
 * Launch helpers (as ops_cuda.cu's)
 */

__host__ __device__ static int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

__host__ __device__ static int64_t min64(int64_t a, int64_t b)
{
    return a < b ? a : b;
}

/* grid-stride grids stop growing at this many blocks of 256 threads per multiprocessor */
enum { BLOCKS_PER_SM = 32, THREADS = 256 };

static unsigned grid_for(const ddk_backend *be, int64_t elements)
{
    return (unsigned)min64(ceil_div(elements, THREADS),
                           (int64_t)ddk_cuda_multiprocessors(be) * BLOCKS_PER_SM);
}

/* ------------------------------------------------------------------------------------------
 * Forward, and the backward's dx. Launch: grid-stride, 256 threads, one (t, c) per thread per
 * step: consecutive threads take consecutive channels of a row, so each tap reads a coalesced
 * row of x (dy) and the gs threads of a group read one delta value.
 */

__global__ static void block_conv_kernel(const float *x,      /* (rows, H) */
                                         const float *base,   /* (taps, H) */
                                         const float *delta,  /* (rows, ld_delta) */
                                         int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                                         int64_t taps, int64_t gs,
                                         float *y)            /* (rows, H) */
{
    const int64_t G = H / gs;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * H;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / H, c = e % H, g = c / gs;
        const int64_t nt = min64(taps, t % B + 1);   /* taps that stay in the block */
        float acc = 0.0f;
        for (int64_t j = 0; j < nt; j++)
            acc += (base[j * H + c] + delta[t * ld_delta + j * G + g]) * x[(t - j) * H + c];
        y[e] = acc;
    }
}

/* dx[s, c] += sum_{j < taps, s % B + j < B} (base[j, c] + delta[s + j, j*G + c/gs]) dy[s + j, c] */
__global__ static void block_conv_dx_kernel(const float *base,   /* (taps, H) */
                                            const float *delta,  /* (rows, ld_delta) */
                                            int64_t ld_delta,
                                            const float *dy,     /* (rows, H) */
                                            int64_t rows, int64_t B, int64_t H, int64_t taps,
                                            int64_t gs,
                                            float *dx)           /* (rows, H) += */
{
    const int64_t G = H / gs;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * H;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t s = e / H, c = e % H, g = c / gs;
        const int64_t nt = min64(taps, B - s % B);   /* the block's rows that read row s */
        float acc = 0.0f;
        for (int64_t j = 0; j < nt; j++)
            acc += (base[j * H + c] + delta[(s + j) * ld_delta + j * G + g]) * dy[(s + j) * H + c];
        dx[e] += acc;
    }
}

/* ------------------------------------------------------------------------------------------
 * The backward's ddelta: ddelta[t, j*G + g] += sum_{c in group g} dy[t, c] x[t - j, c], j <= t % B.
 * Launch: grid-stride over (t, j, g), 256 threads, one thread per coefficient summing its gs
 * channels in order (a group's reduction has one owner: no atomics). Consecutive threads take
 * consecutive groups, each reading gs consecutive floats of the same two rows, which the block's
 * threads read whole between them. At gs = H a row's whole reduction is one thread's: correct,
 * and slow only for a shape no drafter has (gs is 16 in the published ones).
 */

__global__ static void block_conv_ddelta_kernel(const float *x,    /* (rows, H) */
                                                const float *dy,   /* (rows, H) */
                                                int64_t rows, int64_t B, int64_t H,
                                                int64_t taps, int64_t gs,
                                                int64_t ld_delta,
                                                float *ddelta)     /* (rows, ld_delta) += */
{
    const int64_t G = H / gs, per_row = taps * G;
    for (int64_t e = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; e < rows * per_row;
         e += (int64_t)gridDim.x * blockDim.x) {
        const int64_t t = e / per_row, jg = e % per_row, j = jg / G, g = jg % G;
        if (j > t % B)
            continue;   /* tap j reaches before the block: no term, ddelta untouched */
        const float *dyt = dy + t * H + g * gs, *xs = x + (t - j) * H + g * gs;   /* (gs) each */
        float acc = 0.0f;
        for (int64_t i = 0; i < gs; i++)
            acc += dyt[i] * xs[i];
        ddelta[t * ld_delta + jg] += acc;
    }
}

/* ------------------------------------------------------------------------------------------
 * The backward's dbase: dbase[j, c] += sum_{t: t % B >= j} dy[t, c] x[t - j, c], a reduction over
 * the rows per column. Launch: grid (ceil(H / 32), taps; 65535 taps a launch at most, block y
 * taking tap j0 + y), block (32, DB_ROW_LANES): each warp reads 32 consecutive columns of a row
 * (one 128-byte line), the row lanes take every DB_ROW_LANES-th row, and the block sums its lanes
 * in shared memory in lane order. Every
 * (tap, column) belongs to one block: deterministic, one pass, no scratch (rmsnorm_backward's dg
 * slices its rows over blocks for more parallelism; here a column's rows stay in one block so
 * that the bits do not depend on the GPU's multiprocessors). 16 row lanes: 512 threads a block,
 * so that a drafter's ceil(H / 32) * taps blocks (320 at H 5120, taps 2) keep every one of an
 * H100's or H200's 132 multiprocessors busy with 2 or 3 blocks; a guess, not measured yet.
 */

enum { DB_COLS = 32, DB_ROW_LANES = 16 };

__global__ static void block_conv_dbase_kernel(const float *x,    /* (rows, H) */
                                               const float *dy,   /* (rows, H) */
                                               int64_t rows, int64_t B, int64_t H, int64_t j0,
                                               float *dbase)      /* (taps, H) += */
{
    DDK_SHARED(float, lanes, [DB_ROW_LANES][DB_COLS]);
    const int64_t col = (int64_t)blockIdx.x * DB_COLS + threadIdx.x, j = j0 + blockIdx.y;
    float acc = 0.0f;
    if (col < H)
        for (int64_t t = threadIdx.y; t < rows; t += DB_ROW_LANES)
            if (t % B >= j)   /* tap j of row t reads row t - j of the same block */
                acc += dy[t * H + col] * x[(t - j) * H + col];
    lanes[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && col < H) {
        float sum = 0.0f;
        for (int lane = 0; lane < DB_ROW_LANES; lane++)
            sum += lanes[lane][threadIdx.x];
        dbase[j * H + col] += sum;
    }
}

/* ------------------------------------------------------------------------------------------
 * Entry points
 */

static int shape_ok(int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs)
{
    return rows > 0 && B > 0 && H > 0 && taps > 0 && gs > 0;
}

void ddk_cuda_block_conv(const ddk_backend *be, const float *x, const float *base,
                         const float *delta, int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                         int64_t taps, int64_t gs, float *y)
{
    if (!shape_ok(rows, B, H, taps, gs))
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    DDK_LAUNCH(block_conv_kernel, grid_for(be, rows * H), THREADS, 0, stream, x, base, delta,
               ld_delta, rows, B, H, taps, gs, y);
    LAUNCH_CHECK();
}

void ddk_cuda_block_conv_backward(const ddk_backend *be, const float *x, const float *base,
                                  const float *delta, int64_t ld_delta, const float *dy,
                                  int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                                  float *dx, float *dbase, float *ddelta)
{
    if (!shape_ok(rows, B, H, taps, gs))
        return;
    cudaStream_t stream = ddk_cuda_stream(be);
    if (dx) {
        DDK_LAUNCH(block_conv_dx_kernel, grid_for(be, rows * H), THREADS, 0, stream, base, delta,
                   ld_delta, dy, rows, B, H, taps, gs, dx);
        LAUNCH_CHECK();
    }
    DDK_LAUNCH(block_conv_ddelta_kernel, grid_for(be, rows * taps * (H / gs)), THREADS, 0, stream,
               x, dy, rows, B, H, taps, gs, ld_delta, ddelta);
    LAUNCH_CHECK();
    for (int64_t j0 = 0; j0 < taps; j0 += 65535) {   /* gridDim.y's limit; a drafter's taps are 2 */
        const dim3 grid((unsigned)ceil_div(H, DB_COLS), (unsigned)min64(taps - j0, 65535)),
            block(DB_COLS, DB_ROW_LANES);
        DDK_LAUNCH(block_conv_dbase_kernel, grid, block, 0, stream, x, dy, rows, B, H, j0, dbase);
        LAUNCH_CHECK();
    }
}
