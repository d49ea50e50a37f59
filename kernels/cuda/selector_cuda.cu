/* selector_cuda.cu: the DFlash2 path selector's small per-row kernels inside the CUDA loss
 * (SPEC.md 2.1), the same steps as kernels/cpu/selector_cpu.c; loss_cuda.cu runs the products
 * (q = Hp hs, dq Hp, dq^T hs) and the online top-K (vector_cuda.cu's topk kernel, tile by tile).
 * Per chunk:
 *   1. sel_rows_kernel, one block per row: thread 0 places the label among the candidates
 *      (selector_row.h: strict, or inject), the threads form u = A[p] * q, each warp a
 *      candidate's score s_k = cz_k + u . Bs[cand_k] (lanes over r, then shuffles: a fixed
 *      order), thread 0 l_sel, the pick and ds (selector_row.h, in double) and l_i; then the
 *      threads b = sum_k ds_k Bs[cand_k] (k in order), dq = A[p] * b and q * b (dA's row);
 *   2. sel_grad_cols_kernel, a thread per row: ds_k added into the row's gradient g at column
 *      cand_k when the tile holds it (a row's candidates are distinct: no two threads meet);
 *   3. sel_scatter_kernel, twice per group of rows of at most SCATTER_ENTRIES entries (dA: a row's
 *      predecessor and q * b; dBs: each candidate and ds_k u): the rows of a group adding into one
 *      token's row are summed by one block only, the one of the token's first entry in the group
 *      (found by scanning the group's entries from the start: a block that meets an earlier entry
 *      of its token leaves), in entry order, and added once; the groups in row order. No atomics:
 *      the same bits at every call, whatever the schedule. O(entries x SCATTER_ENTRIES) key reads
 *      a chunk (compacted tile by tile, a block prefix sum per tile of THREADS entries): linear in
 *      the chunk, where one launch over the chunk was quadratic (chunk 4096 x K 16 = 65,536
 *      entries); not measured on a GPU yet.
 * Everything is deterministic: fixed orders, no atomics.
 *
 * Tested by tests/simt/test_simt_kernels.cpp (the CUDA loss with a selector, from these sources,
 * against the CPU backend under each card's limits, the same bits in the reverse schedule) and on
 * a GPU by tests/kernels/test_backend_ops.c.
 *
 * Legend: m rows of the chunk, K candidates, r the selector's rank, w tile width.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"
#include "selector_cuda.h"
#include "selector_row.h"   /* the K-long arithmetic, the CPU's too */

#include <cuda_runtime.h>

enum { THREADS = 256, WARPS = THREADS / 32 };

static unsigned grid_of(int64_t blocks)
{
    return (unsigned)(blocks < 1 ? 1 : blocks < 65535 ? blocks : 65535);
}

/* ------------------------------------------------------------------------------------------
 * 1. The rows' terms
 */

__global__ static void sel_rows_kernel(ddk_cuda_sel_chunk c)
{
    DDK_SHARED(int, kstar_shared, [1]);
    const int K = (int)c.K;
    const int64_t r = c.r;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t i = blockIdx.x; i < c.m; i += gridDim.x) {   /* block-uniform */
        const ddk_loss_row *R = &c.rows[i];
        ddk_loss_sel_row *S = &c.b.rows[i];
        int32_t *cand = c.b.cand + i * K;   /* (K) */
        float *cz = c.b.cz + i * K;         /* (K) */
        float *s = c.b.ds + i * K;          /* (K) the scores, then ds */
        float *q = c.b.q + i * r;           /* (r) */
        float *u = c.b.u + i * r;           /* (r) */
        float *dq = c.b.dq + i * r;         /* (r) */
        __syncthreads();   /* the previous row's readers of kstar_shared are done */
        if (threadIdx.x == 0) {
            int covered = 0, kstar = -1;
            if (!R->ignored)
                kstar = ddk_sel_place_label(cand, cz, K, R->label, R->z_label, c.inject, &covered);
            S->l_sel = 0.0;
            S->kstar = kstar;
            S->covered = covered;
            S->correct = 0;
            S->pad_ = 0;
            kstar_shared[0] = kstar;
        }
        __syncthreads();
        const int kstar = kstar_shared[0];
        if (kstar < 0) {   /* no term: dq's row 0 (the products read every row) */
            if (c.grads)
                for (int64_t j = threadIdx.x; j < r; j += THREADS)
                    dq[j] = 0.0f;
            continue;
        }
        const float *a = c.A + (int64_t)c.pred[i] * r;   /* (r) A[p] */
        for (int64_t j = threadIdx.x; j < r; j += THREADS)
            u[j] = a[j] * q[j];
        __syncthreads();   /* u, and an injected candidate, for every warp */
        for (int k = warp; k < K; k += WARPS) {
            const float *bs = c.Bs + (int64_t)cand[k] * r;   /* (r) Bs[cand_k] */
            float dot = 0.0f;
            for (int64_t j = lane; j < r; j += 32)
                dot += u[j] * bs[j];
            for (int offset = 16; offset > 0; offset /= 2)
                dot += __shfl_xor_sync(0xffffffffu, dot, offset);
            if (lane == 0)
                s[k] = cz[k] + dot;
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            const double wi = c.weights ? (double)c.weights[i] : 1.0;
            int pick;
            const double l = ddk_sel_terms(s, K, kstar, wi / c.weight_sum * c.weight, c.grads, &pick);
            S->l_sel = l;
            S->correct = pick == kstar;
            if (c.per_position) {   /* l_i as the CPU forms it: the unary terms, then the term */
                const double unary = ddk_loss_combine(&c.k, R->c_dot, R->t_dot,
                                                      R->confident ? R->entropy : 0.0);
                c.per_position[i] = (float)(unary + c.weight * l);
            }
        }
        if (!c.grads)
            continue;
        __syncthreads();   /* ds */
        for (int64_t j = threadIdx.x; j < r; j += THREADS) {
            float b = 0.0f;   /* sum_k ds_k Bs[cand_k, j], k in order */
            for (int k = 0; k < K; k++)
                b += s[k] * c.Bs[(int64_t)cand[k] * r + j];
            dq[j] = a[j] * b;
            q[j] *= b;
        }
    }
}

void ddk_cuda_sel_rows(const ddk_backend *be, const ddk_cuda_sel_chunk *c)
{
    DDK_LAUNCH(sel_rows_kernel, grid_of(c->m), THREADS, 0, ddk_cuda_stream(be), *c);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * 2. ds into a tile's gradient rows
 */

__global__ static void sel_grad_cols_kernel(const ddk_loss_sel_row *S, const int32_t *cand,
                                            const float *ds, int64_t m, int K, float *g,
                                            int64_t off, int64_t w)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < m;
         i += (int64_t)gridDim.x * blockDim.x) {
        if (S[i].kstar < 0)
            continue;
        for (int k = 0; k < K; k++) {
            const int64_t col = (int64_t)cand[i * K + k] - off;
            if (col >= 0 && col < w)
                g[i * w + col] += ds[i * K + k];
        }
    }
}

void ddk_cuda_sel_grad_cols(const ddk_backend *be, const ddk_cuda_sel_chunk *c, float *g,
                            int64_t off, int64_t w)
{
    DDK_LAUNCH(sel_grad_cols_kernel, grid_of((c->m + THREADS - 1) / THREADS), THREADS, 0,
               ddk_cuda_stream(be), c->b.rows, c->b.cand, c->b.ds, c->m, (int)c->K, g, off, w);
    LAUNCH_CHECK();
}

/* ------------------------------------------------------------------------------------------
 * 3. Rows added into tokens' rows, deterministically
 */

/* dst (V, r) += for each token the sum, in entry order, of coef[e] src[e / per_row] (r) over
 * the entries e < N whose key is the token and whose row has a term (S[e / per_row].kstar >= 0);
 * coef NULL: 1. One block per entry (grid-stride); only the block of a token's first entry
 * sums and adds. */
__global__ static void sel_scatter_kernel(const int32_t *keys, int per_row, const float *coef,
                                          const ddk_loss_sel_row *S, int64_t N,
                                          const float *src, int64_t r, float *dst)
{
    DDK_SHARED(int32_t, list, [THREADS]);      /* a tile's entries of the token, in order */
    DDK_SHARED(int32_t, warp_count, [WARPS]);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    for (int64_t e = blockIdx.x; e < N; e += gridDim.x) {   /* block-uniform */
        if (S[e / per_row].kstar < 0)
            continue;
        const int32_t key = keys[e];
        int owner = 1;
        for (int64_t c0 = 0; c0 < r && owner; c0 += THREADS) {
            const int64_t col = c0 + threadIdx.x;
            float acc = 0.0f;
            for (int64_t base = 0; base < N; base += THREADS) {
                const int64_t j = base + threadIdx.x;
                const int match = j < N && S[j / per_row].kstar >= 0 && keys[j] == key;
                int x = match;   /* inclusive prefix count of the warp's matches */
                for (int o = 1; o < 32; o *= 2) {
                    const int y = __shfl_sync(0xffffffffu, x, lane >= o ? lane - o : lane);
                    if (lane >= o)
                        x += y;
                }
                /* two barriers a tile suffice: warp_count is written before the first and read
                 * between them, list written between them and read after the second, so no warp
                 * writes either while another still reads the previous tile's */
                if (lane == 31)
                    warp_count[warp] = x;
                __syncthreads();
                int earlier = 0, total = 0;
                for (int wp = 0; wp < WARPS; wp++) {
                    earlier += wp < warp ? warp_count[wp] : 0;
                    total += warp_count[wp];
                }
                if (match)
                    list[earlier + x - 1] = (int32_t)j;
                __syncthreads();
                if (total == 0)
                    continue;
                if (list[0] < e) {   /* an earlier entry's block owns the token */
                    owner = 0;
                    break;
                }
                if (col < r)
                    for (int t = 0; t < total; t++) {
                        const int64_t jj = list[t];
                        acc += (coef ? coef[jj] : 1.0f) * src[(jj / per_row) * r + col];
                    }
            }
            if (owner && col < r)
                dst[(int64_t)key * r + col] += acc;
        }
    }
}

/* The rows a scatter launch takes: its blocks scan every entry of the launch for their token, so
 * the work is quadratic in the entries of one launch; launches of at most SCATTER_ENTRIES entries,
 * queued in row order, keep it linear in the chunk (the sums then go into dst group by group:
 * the same bits at every call still); 64 rows at K 16, 4 launches per 256 rows */
enum { SCATTER_ENTRIES = 1024 };

void ddk_cuda_sel_scatter(const ddk_backend *be, const ddk_cuda_sel_chunk *c, float *dA,
                          float *dBs)
{
    cudaStream_t stream = ddk_cuda_stream(be);
    const int64_t K = c->K, r = c->r, group = SCATTER_ENTRIES / K > 0 ? SCATTER_ENTRIES / K : 1;
    for (int64_t first = 0; first < c->m; first += group) {
        const int64_t g = c->m - first < group ? c->m - first : group;
        /* dA[p_i] += q_i * b_i (over q) */
        DDK_LAUNCH(sel_scatter_kernel, grid_of(g), THREADS, 0, stream, c->pred + first, 1,
                   (const float *)NULL, c->b.rows + first, g, (const float *)c->b.q + first * r, r, dA);
        LAUNCH_CHECK();
        /* dBs[cand_ik] += ds_ik u_i */
        DDK_LAUNCH(sel_scatter_kernel, grid_of(g * K), THREADS, 0, stream,
                   (const int32_t *)c->b.cand + first * K, (int)K, (const float *)c->b.ds + first * K,
                   c->b.rows + first, g * K, (const float *)c->b.u + first * r, r, dBs);
        LAUNCH_CHECK();
    }
}
