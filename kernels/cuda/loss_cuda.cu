/* loss_cuda.cu: the fused, chunked lm_head + CE + KL + CAP loss on the GPU (SPEC.md section 1),
 * the backend's `loss` (contract of ddk_loss_cpu, every pointer but `out` in device memory).
 *
 * The same algorithm as kernels/cpu/loss_cpu.c, step for step, so the two agree to float
 * rounding: positions `chunk` at a time; per chunk the vocabulary is one tile (vocab_tile = 0:
 * student and teacher logits materialised, the gradient formed in place) or streamed tiles with
 * online-softmax statistics and recomputed logits. Per chunk:
 *   1. rows_init_kernel: the chunk's ddk_loss_row statistics (loss_internal.h) from labels and
 *      weights;
 *   2. per tile: the logits by cuBLAS (be->matmul: cublasSgemm, fp32, never TF32; with
 *      bf16_products every product here is be->matmul_bf16, the tensor cores'; with a bf16
 *      head, head_bf16, the head is read in place and the hidden states are rounded to bf16
 *      into the scratch's panel half, ddk_cuda_w16_product, bf16 tensor cores), then
 *      stats_kernel, one block per row, ONE pass over the row's logits (loss_online.h, whose
 *      header has the details): each thread takes groups of 4 columns (a float4 where the row
 *      is 16-byte aligned and w % 4 == 0, else scalar loads) and keeps its own running maxima
 *      and first columns and the seven sums shifted by its maxima in float, rescaled once per
 *      group when a maximum rises (online softmax; rest leaves out the given label's column, or
 *      each thread's teacher-argmax candidate, held apart until the block knows the label);
 *      then the block's max / argmax (lowest index on ties), each thread's sums brought to the
 *      row's maxima, added in float per warp (shuffles) and in double across warps in warp
 *      order, and thread 0 merges the tile into the row in double with the CPU's online
 *      rescaling; after the last tile it also forms CE, KL, CAP, the entropy, c_i,
 *      per_position and, once per row, everything of the gradient that depends on the row
 *      alone: loss_row.h's ddk_loss_row_grad_coeffs (the float coefficients a, b, bt, kc,
 *      cap_shift, with the row factor w_i / sum w in them) and ddk_loss_grad_at_label (the
 *      label's element, in double from the statistics: 1 - p_y is s_rest / s_sum, no
 *      cancellation as p_y -> 1). -inf columns add 0 to every sum and get gradient 0
 *      (0 * -inf is masked), as on the CPU;
 *   3. per tile (recomputed when tiled): grad_kernel forms g = d l_i / d zs in place over the
 *      student logits from those coefficients, in float per logit exactly as loss_cpu.c's
 *      grad_tile (which is float per logit too, with the same float coefficients: so the two
 *      differ by expf's rounding only, ~1e-7 relative, far inside tol_loss_grad), the label's
 *      element being the value stored; then d hs (+)= g W by cuBLAS (fp32 accumulation over
 *      tiles: beta = 1 after the first; with a bf16 head g is rounded into the panel, W read
 *      not transposed in place: matmul_w16_nn's product);
 *   4. reduce_kernel: one block adds the chunk's weighted terms in double in a fixed tree order
 *      and writes them at index c of an array of chunk sums in the backend's scratch; after the
 *      last chunk ONE copy brings the array to the host, which adds the chunks in order. So the
 *      result is deterministic (the same bits for the same inputs and GPU).
 * With the DFlash2 selector (p->selector, SPEC.md 2.1; loss_cpu.c's steps, selector_cpu.c's
 * arithmetic): in step 2 each tile's logits also go through vector_cuda.cu's topk kernel, merged
 * into the rows' running candidates (ties to the lower id: the CPU's candidates exactly); after
 * the vocabulary pass q = Hp hs (a product, fp32 or bf16 as the head's) and selector_cuda.cu's
 * sel_rows_kernel (the label placed, the scores, l_sel, ds, dq; l_i rewritten with the term); in
 * step 3 its sel_grad_cols_kernel adds ds into g at the candidates' columns before each tile's
 * product with W; after the tiles d hs += dq Hp and dHp += dq^T hs (products) and its
 * sel_scatter_kernel adds dA's and dBs's rows without atomics; reduce_kernel adds the term into
 * sum w l and sums w l_sel, covered and the selector's correct. Without a selector none of it
 * runs and the chunk sums' first five are formed as before: the same bits.
 *
 * Fields of ddk_loss_row (loss_internal.h, shared with the CPU) that this file reuses once
 * nothing reads them any more; float values held in double fields are exact:
 *   - during the statistics, scale (set only at the finish) holds zt_y, the teacher's logit at
 *     the label, from the tile that holds the label to the finish (ddk_loss_grad_at_label's
 *     input);
 *   - after the finish, c_dot holds CE_i and t_dot KL_i for reduce_kernel (CAP_i is c_i *
 *     entropy), and s_sum, sT_sum, t_sum, c_sum, s_rest, scale hold the gradient's a, b, bt, kc,
 *     cap_shift and the label's element (ddk_loss_row_finish, ddk_loss_grad_row_of).
 *
 * Validation (the choice the brief asked to document): ddk_loss_check_call reads labels and
 * weights from host memory, so they are copied to host buffers (malloc, n x 8 bytes at most,
 * n x 12 with a selector's predecessors, on the backend's stream, then waited for) and the CPU's
 * very checks (ddk_loss_check_selector's too) run on the copies; the
 * weight sum and the count are then formed on the host exactly as loss_cpu.c forms them. That
 * costs one small transfer and one wait per call, next to 3 to 5 logit-sized products; in
 * exchange no rule of validity exists twice. -EINVAL and -ENOMEM return with nothing written.
 *
 * Workspace: exactly ddk_loss_workspace_bytes (same layout as the CPU's: rows, student logits,
 * teacher logits when used), from be->alloc, with an fp32 or a bf16 head; -ENOMEM when refused,
 * before anything is written. The workspace has no room that outlives a chunk (its rounding
 * leaves < 64 bytes, often 0), so the chunk sums, ceil(n / chunk) x 64 bytes, go to the
 * backend's scratch (cuda_backend.h: 4 MiB made with the stream, outside the accounting
 * allocator, so no allocation and no failure; held under its lock from before the first chunk
 * until the last copy is queued). Its first half holds 32,768 chunks' sums; a call with more
 * copies each full batch of them on (the result is the same, it is only more copies). Its
 * second half is the bf16 head's operand panel (2^20 values: up to PANEL_ROWS rows of a
 * 2^20 / rows column k-panel; be->matmul_w16 cannot be called here, it would take the lock the
 * loss holds). The host holds the same ceil(n / chunk) x 64 bytes (malloc).
 *
 * Synchronisation: the call returns with its work done (out is a host struct): it waits on the
 * stream once for labels / weights and once at the end, after the one copy of the chunk sums
 * (to pageable memory, which waits as well: nothing is left to overlap with at that point).
 *
 * Deliberately not here: bf16 activations in memory (the head's panel is the only bf16 copy of
 * one: a product's operand, rounded panel by panel), fusion of the softmax into the products,
 * templated kernels per term combination (the flags are block-uniform branches), a block per
 * several rows or several blocks per row (a chunk is hundreds of rows or more: enough blocks),
 * a vectorised or fused grad_kernel. Each is to buy a measured speed-up.
 *
 * Tested by tests/simt/test_simt_kernels.cpp, always, without a GPU: this file's kernels from this
 * source against the CPU backend under each card's limits (both modes, a bf16 head, the selector
 * strict and inject, stop_gradient, the same bits in the reverse schedule); by
 * tests/kernels/test_loss_online.c: stats_kernel's and grad_kernel's
 * arithmetic (loss_online.h) emulated on the host with the kernel's column assignment and merge
 * rules, against ddk_loss_cpu, the float64 reference and sums in double (tiles, ties, labels
 * moving between tiles, p_y -> 1, -inf columns); and on a GPU by tests/kernels/test_backend_ops.c (loss
 * cases against ddk_loss_cpu, fp32 and bf16 heads) and tests/engine/train/test_step_cuda.c (the drafter's
 * step, bf16 head included), skipped without one.
 *
 * Legend: n positions, H hidden, V vocabulary, m rows of the current chunk, w tile width.
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"
#include "selector_cuda.h"   /* the DFlash2 selector's kernels */

#include "loss_online.h"   /* the kernels' arithmetic (with loss_row.h's, the CPU's too) */

#include <cuda_runtime.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One call's constants are a ddk_loss_consts (loss_row.h, as on the CPU). */
enum { THREADS = DDK_LOSS_THREADS, WARPS = THREADS / 32, NSUMS = DDK_LOSS_SUMS, NTERMS = 8 };

/* ------------------------------------------------------------------------------------------
 * Block reductions (blockDim.x == THREADS). The order is fixed by thread indices.
 */

/* the block's max of v0 and its lowest index i0, and the same of (v1, i1), returned to every
 * thread (ddk_loss_argmax_merge's rule: an order-free choice, so the tree's shape is free) */
__device__ static void block_argmax2(float &v0, int &i0, float &v1, int &i1)
{
    DDK_SHARED(float, sv, [2][WARPS]);
    DDK_SHARED(int, si, [2][WARPS]);
    for (int offset = 16; offset > 0; offset /= 2) {
        const float ov0 = __shfl_xor_sync(0xffffffffu, v0, offset);
        const int oi0 = __shfl_xor_sync(0xffffffffu, i0, offset);
        const float ov1 = __shfl_xor_sync(0xffffffffu, v1, offset);
        const int oi1 = __shfl_xor_sync(0xffffffffu, i1, offset);
        ddk_loss_argmax_merge(&v0, &i0, ov0, oi0);
        ddk_loss_argmax_merge(&v1, &i1, ov1, oi1);
    }
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();   /* a previous call's readers are done */
    if (lane == 0) {
        sv[0][warp] = v0;
        si[0][warp] = i0;
        sv[1][warp] = v1;
        si[1][warp] = i1;
    }
    __syncthreads();
    v0 = sv[0][0];
    i0 = si[0][0];
    v1 = sv[1][0];
    i1 = si[1][0];
    for (int w = 1; w < WARPS; w++) {
        ddk_loss_argmax_merge(&v0, &i0, sv[0][w], si[0][w]);
        ddk_loss_argmax_merge(&v1, &i1, sv[1][w], si[1][w]);
    }
}

/* s[NSUMS] summed over the block: float within warps (shuffles), double across warps in warp
 * order; every thread gets the same totals */
__device__ static void block_sums(float s[NSUMS], double total[NSUMS])
{
    DDK_SHARED(double, ws, [NSUMS][WARPS]);
    for (int k = 0; k < NSUMS; k++)
        for (int offset = 16; offset > 0; offset /= 2)
            s[k] += __shfl_xor_sync(0xffffffffu, s[k], offset);
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    __syncthreads();
    if (lane == 0)
        for (int k = 0; k < NSUMS; k++)
            ws[k][warp] = s[k];
    __syncthreads();
    for (int k = 0; k < NSUMS; k++) {
        double t = 0.0;
        for (int w = 0; w < WARPS; w++)
            t += ws[k][w];
        total[k] = t;
    }
}

/* ------------------------------------------------------------------------------------------
 * 1. Rows (loss_row.h's ddk_loss_row_init, as on the CPU). labels, weights: the chunk's (m), or
 * NULL.
 */

__global__ static void rows_init_kernel(ddk_loss_row *rows, int64_t m, const int32_t *labels,
                                        const float *weights, int given_labels)
{
    for (int64_t r = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; r < m;
         r += (int64_t)gridDim.x * blockDim.x) {
        ddk_loss_row row;
        ddk_loss_row_init(&row, labels ? labels[r] : -1, weights ? weights[r] : 1.0f,
                          given_labels);
        rows[r] = row;
    }
}

/* ------------------------------------------------------------------------------------------
 * 2. Statistics of one tile (loss_cpu.c's row_stats_tile), and after the last tile the terms
 * (ddk_loss_row_terms). One block per row (grid-stride over rows), one pass over the row: the
 * arithmetic is loss_online.h's, this kernel adds the loads and the block reductions.
 * zs, zt (m, w): the tile's logits (zt NULL when the teacher is not used); columns off..off+w.
 * weights (m) or NULL, per_position (m) or NULL: the chunk's.
 */

/* the group of 4 columns at v of the row x (w): one float4 when vec (the row's base 16-byte
 * aligned and w % 4 == 0), else scalar loads with -inf past the row's end (the same values) */
__device__ static void load_group(const float *x, int64_t v, int64_t w, int vec,
                                  float z[DDK_LOSS_GROUP])
{
    if (vec) {
        const float4 q = *reinterpret_cast<const float4 *>(x + v);
        z[0] = q.x;
        z[1] = q.y;
        z[2] = q.z;
        z[3] = q.w;
    } else {
        for (int j = 0; j < DDK_LOSS_GROUP; j++)
            z[j] = v + j < w ? x[v + j] : -INFINITY;
    }
}

__device__ static int aligned16(const float *x)
{
    return (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
}

/* the blocks of THREADS per SM that stats_kernel keeps room for: 3 on sm_90 (80 registers, no
 * spill in ptxas -v; the compiler's own choice, 96, leaves room for 2, and 4 blocks, 64
 * registers, would spill); elsewhere the compiler's choice (sm_100 takes ~200, one block, as
 * the two-pass kernel's 158 did: capped at 128 or 80 it spills). Not measured on a GPU yet. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900
#define STATS_MIN_BLOCKS 3
#else
#define STATS_MIN_BLOCKS 1
#endif

__global__ static void __launch_bounds__(THREADS, STATS_MIN_BLOCKS)
stats_kernel(ddk_loss_row *rows, int64_t m, const float *zs, const float *zt, int64_t off,
             int64_t w, ddk_loss_consts k, int finish, const float *weights, double weight_sum,
             float *per_position)
{
    for (int64_t r = blockIdx.x; r < m; r += gridDim.x) {
        const ddk_loss_row *row = &rows[r];   /* read by all, written by thread 0 at the end */
        if (row->ignored) {                   /* block-uniform */
            if (finish && per_position && threadIdx.x == 0)
                per_position[r] = 0.0f;
            continue;
        }
        const float *s = zs + r * w;
        const float *t = zt ? zt + r * w : NULL;
        const int vec = w % DDK_LOSS_GROUP == 0 && aligned16(s) && (!t || aligned16(t));

        /* the one pass: this thread's groups (loss_online.h's column assignment) */
        ddk_loss_thread a;
        ddk_loss_thread_init(&a);
        const int given_col = ddk_loss_given_label_col(row, off, w, &k);
        for (int64_t v = (int64_t)threadIdx.x * DDK_LOSS_GROUP; v < w; v += DDK_LOSS_STRIDE) {
            float s4[DDK_LOSS_GROUP], t4[DDK_LOSS_GROUP];
            load_group(s, v, w, vec, s4);
            if (t)
                load_group(t, v, w, vec, t4);
            ddk_loss_thread_add(&a, s4, t ? t4 : NULL, (int)v, given_col, &k);
        }

        /* the block's maxima and first columns: thread 0 always has column 0, so a row of -inf
         * or NaN only ends at index 0, as the CPU's ddk_vargmax does, never outside the row */
        float tile_s_max = a.s_max, tile_t_max = a.t_max;
        int tile_s_arg = a.s_arg, tile_t_arg = a.t_arg;
        block_argmax2(tile_s_max, tile_s_arg, tile_t_max, tile_t_arg);
        const ddk_loss_tile p =
            ddk_loss_tile_of(row, tile_s_max, tile_t_max, tile_t_arg, t != NULL, off, w, &k);

        float part[NSUMS];
        ddk_loss_thread_sums(&a, p.s_max, p.t_max, p.label_col, &k, part);
        double ts[NSUMS];
        block_sums(part, ts);
        if (threadIdx.x != 0)
            continue;

        /* thread 0: the merge in double, as on the CPU */
        ddk_loss_row R = *row;
        ddk_loss_row_merge(&R, &p, tile_s_arg, ts, off, &k);
        if (p.label_col >= 0) {
            R.z_label = s[p.label_col];
            if (t)
                R.scale = t[p.label_col];   /* zt_y until the finish (see the header) */
        }
        if (finish) {   /* the terms, then c_dot := CE_i and t_dot := KL_i (see the header) */
            const double wi = weights ? (double)weights[r] : 1.0;
            const double l = ddk_loss_row_finish(&R, &k, wi / weight_sum);
            if (per_position)
                per_position[r] = (float)l;
        }
        rows[r] = R;
    }
}

/* ------------------------------------------------------------------------------------------
 * 3. The gradient of one tile, in place over the student logits (loss_cpu.c's grad_tile, with
 * the coefficients and the label's element stats_kernel formed). grid (column blocks, rows),
 * both grid-stride. zs (m, w) becomes g; zt (m, w) read only for the KL (NULL otherwise).
 * Per logit everything is float, as on the CPU (ddk_loss_grad_at); the row's double fields are
 * converted once per thread block and row (thread 0), never per logit.
 */

__global__ static void grad_kernel(const ddk_loss_row *rows, int64_t m, float *zs,
                                   const float *zt, int64_t off, int64_t w, ddk_loss_consts k)
{
    DDK_SHARED(ddk_loss_grad_row, row_shared, [1]);   /* the current row's, by thread 0 */
    const int64_t v0 = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = blockIdx.y; r < m; r += gridDim.y) {   /* block-uniform: the barriers hold */
        __syncthreads();   /* every thread has read the previous row's */
        if (threadIdx.x == 0)
            row_shared[0] = ddk_loss_grad_row_of(&rows[r], &k);
        __syncthreads();
        const ddk_loss_grad_row G = row_shared[0];
        float *g = zs + r * w;
        if (G.ignored) {
            for (int64_t v = v0; v < w; v += stride)
                g[v] = 0.0f;
            continue;
        }
        const float *t = zt ? zt + r * w : NULL;
        const int64_t label_col = G.label >= off && G.label < off + w ? G.label - off : -1;
        for (int64_t v = v0; v < w; v += stride) {
            if (v == label_col) {
                g[v] = G.g.g_label;
                continue;
            }
            g[v] = ddk_loss_grad_at(&G, g[v], k.kl ? t[v] : 0.0f, &k);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * 4. The chunk's weighted sums: one block, THREADS rows per step in thread order, then a fixed
 * tree. out[NTERMS] = sum w l, sum w CE, sum w KL, sum w CAP, correct, and with a selector (sel
 * its rows, else NULL and 0) sum w l_sel, covered, the selector's correct (exact in double); l
 * holds sel_weight l_sel.
 */

__global__ static void reduce_kernel(const ddk_loss_row *rows, int64_t m, const float *weights,
                                     ddk_loss_consts k, const ddk_loss_sel_row *sel,
                                     float sel_weight, double *out)
{
    DDK_SHARED(double, sh, [NTERMS][THREADS]);
    double acc[NTERMS] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int64_t r = threadIdx.x; r < m; r += blockDim.x) {
        const ddk_loss_row &R = rows[r];
        if (R.ignored)
            continue;
        const double wi = weights ? (double)weights[r] : 1.0;
        const double ce = R.c_dot, kl = R.t_dot, cap = R.confident ? R.entropy : 0.0;
        double l = ddk_loss_combine(&k, ce, kl, cap);
        if (sel) {   /* the term in l, as the CPU adds it */
            l += sel_weight * sel[r].l_sel;
            acc[5] += wi * sel[r].l_sel;
            acc[6] += sel[r].covered;
            acc[7] += sel[r].correct;
        }
        acc[0] += wi * l;
        acc[1] += wi * ce;
        acc[2] += wi * kl;
        acc[3] += wi * cap;
        acc[4] += R.confident;
    }
    for (int j = 0; j < NTERMS; j++)
        sh[j][threadIdx.x] = acc[j];
    __syncthreads();
    for (int half = THREADS / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half)
            for (int j = 0; j < NTERMS; j++)
                sh[j][threadIdx.x] += sh[j][threadIdx.x + half];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        for (int j = 0; j < NTERMS; j++)
            out[j] = sh[j][0];
}

/* ------------------------------------------------------------------------------------------
 * The products against the head (V, H), tile by tile (loss_cpu.c's tile_logits and tile_grad)
 */

/* the bf16 head's operand panel: at most this many rows (a multiple of 128: cuBLAS's tiles are
 * not cut), the k-panel as wide as the rest of the panel allows */
static const int64_t PANEL_ROWS = 512;

typedef struct head_products {
    const ddk_backend *be;
    decltype(ddk_backend::matmul) product;   /* an fp32 head: be->matmul, or matmul_bf16 */
    const float *head32;                     /* (V, H) fp32, or NULL ... */
    const uint16_t *head16;                  /* ... when bf16 (head_bf16), read in place */
    uint16_t *panel;                         /* (panel_values) bf16: the scratch's second half */
    int64_t panel_values;
    int64_t H;
} head_products;

/* ddk_cuda_w16_product on the loss's panel: rows and k-panel width for an (m, k) operand */
static void w16_product(const head_products &h, int trans_w, int64_t m, int64_t n, int64_t k,
                        const float *a, int64_t lda, const uint16_t *w, float beta, float *c,
                        int64_t ldc)
{
    const int64_t rows = m < PANEL_ROWS ? m : PANEL_ROWS;
    const int64_t room = h.panel_values / rows / 8 * 8;   /* >= 2048: whole 16-byte rows */
    const int64_t kp = k < room ? k : room;
    ddk_cuda_w16_product(h.be, trans_w, m, n, k, 1.0f, a, lda, w, h.H, beta, c, ldc, h.panel,
                         rows, kp);   /* W's rows are the head's: stride H */
}

/* z (m, w) = x (m, H) . W[off .. off+w) (w, H)^T */
static void tile_logits(const head_products &h, const float *x, int64_t m, int64_t off,
                        int64_t w, float *z)
{
    const int64_t H = h.H;
    if (h.head16)
        w16_product(h, 1, m, w, H, x, H, h.head16 + off * H, 0.0f, z, w);
    else
        h.product(h.be, 0, 1, m, w, H, 1.0f, x, H, h.head32 + off * H, H, 0.0f, z, w);
}

/* dhs (m, H) = g (m, w) . W[off .. off+w) (w, H) + beta dhs */
static void tile_grad(const head_products &h, const float *g, int64_t m, int64_t off, int64_t w,
                      float beta, float *dhs)
{
    const int64_t H = h.H;
    if (h.head16)
        w16_product(h, 0, m, H, w, g, w, h.head16 + off * H, beta, dhs, H);
    else
        h.product(h.be, 0, 0, m, H, w, 1.0f, g, w, h.head32 + off * H, H, beta, dhs, H);
}

/* ------------------------------------------------------------------------------------------
 * The call
 */

static unsigned grid_rows(int64_t m)
{
    return (unsigned)(m < 65535 ? m : 65535);
}

int ddk_cuda_loss(const ddk_backend *be, const ddk_loss_params *p, const float *student_hidden,
                  const float *teacher_hidden, const void *lm_head, const int32_t *labels,
                  const float *weights, float *grad_student, float *per_position,
                  ddk_loss_result *out)
{
    ddk_loss_shape shape;
    int rc = ddk_loss_shape_of(p, p ? ddk_loss_uses_teacher(p, labels != NULL) : 0, &shape);
    if (rc)
        return rc;
    /* check_call's pointer rules first, so no device memory is read for a call refused anyway */
    const ddk_selector *sp = p->selector;
    if (!student_hidden || !lm_head || !out ||
        (!teacher_hidden && (!labels || p->kl_weight > 0.0f)) || (sp && !sp->predecessors))
        return -EINVAL;

    const int64_t n = p->n, H = p->hidden, V = p->vocab;
    cudaStream_t stream = ddk_cuda_stream(be);

    /* labels and weights to the host: the CPU's checks, weight sum and count on them */
    int32_t *labels_host = labels ? (int32_t *)malloc((size_t)n * sizeof(int32_t)) : NULL;
    float *weights_host = weights ? (float *)malloc((size_t)n * sizeof(float)) : NULL;
    int32_t *pred_host = sp ? (int32_t *)malloc((size_t)n * sizeof(int32_t)) : NULL;
    const int64_t chunks = (n + shape.chunk - 1) / shape.chunk;
    double *partials = (double *)malloc((size_t)chunks * NTERMS * sizeof(double));
    if ((labels && !labels_host) || (weights && !weights_host) || (sp && !pred_host) || !partials) {
        free(labels_host);
        free(weights_host);
        free(pred_host);
        free(partials);
        return -ENOMEM;
    }
    if (labels)
        CUDA_CHECK(cudaMemcpyAsync(labels_host, labels, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDefault, stream));
    if (weights)
        CUDA_CHECK(cudaMemcpyAsync(weights_host, weights, (size_t)n * sizeof(float),
                                   cudaMemcpyDefault, stream));
    if (sp)
        CUDA_CHECK(cudaMemcpyAsync(pred_host, sp->predecessors, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDefault, stream));
    if (labels || weights || sp)
        CUDA_CHECK(cudaStreamSynchronize(stream));
    rc = ddk_loss_check_call(p, student_hidden, teacher_hidden, lm_head, labels_host,
                             weights_host, out);
    if (rc == 0)
        rc = ddk_loss_check_selector(p, pred_host, labels_host, weights_host, grad_student);
    int64_t counted = 0;
    const double weight_sum = rc ? 0.0 : ddk_loss_weight_sum(n, labels_host, weights_host, &counted);
    free(labels_host);
    free(weights_host);
    free(pred_host);
    if (rc) {
        free(partials);
        return rc;
    }

    if (counted == 0) {   /* nothing to learn from: loss 0, gradient 0 */
        free(partials);
        if (grad_student)
            CUDA_CHECK(cudaMemsetAsync(grad_student, 0, (size_t)(n * H) * sizeof(float), stream));
        if (per_position)
            CUDA_CHECK(cudaMemsetAsync(per_position, 0, (size_t)n * sizeof(float), stream));
        CUDA_CHECK(cudaStreamSynchronize(stream));   /* the call returns with its work done */
        *out = ddk_loss_result{};
        return 0;
    }

    char *workspace = (char *)ddk_malloc(be->alloc, shape.workspace_bytes);
    if (!workspace) {
        free(partials);
        return -ENOMEM;
    }
    ddk_loss_row *rows = (ddk_loss_row *)workspace;                          /* (chunk) */
    float *zs = (float *)(workspace + shape.rows_bytes);                     /* (chunk, width) */
    float *zt = shape.uses_teacher ? (float *)(workspace + shape.rows_bytes + shape.logits_bytes)
                                   : NULL;                                   /* (chunk, width) */

    const ddk_loss_consts k = ddk_loss_consts_of(p, labels != NULL);
    const int64_t width = shape.width;
    const int tiled = width < V;
    /* the selector's chunk (selector_cuda.h): its buffers, rows and pointers set per chunk */
    const int sel_grads = sp && grad_student && sp->weight > 0.0f;
    const int sel_to_hidden = sel_grads && !sp->stop_gradient;
    ddk_cuda_sel_chunk sc = {};
    if (sp) {
        sc.rows = rows;
        sc.b = ddk_loss_sel_carve(&shape, workspace);
        sc.A = sp->A;
        sc.Bs = sp->Bs;
        sc.K = sp->top_k;
        sc.r = sp->rank;
        sc.weight_sum = weight_sum;
        sc.weight = sp->weight;
        sc.inject = sp->inject;
        sc.grads = sel_grads;
        sc.k = k;
    }
    /* the scratch (see the header): the chunks' sums (scratch_chunks, NTERMS) in its first half,
     * the bf16 head's operand panel in its second */
    const size_t half_bytes = DDK_CUDA_SCRATCH_FLOATS * sizeof(float) / 2;
    const int64_t scratch_chunks = (int64_t)(half_bytes / (NTERMS * sizeof(double)));
    float *scratch = ddk_cuda_scratch_lock(be);
    double *chunk_sums = (double *)scratch;
    /* every product of the call: the logits and the gradient */
    head_products h;
    h.be = be;
    h.product = p->bf16_products ? be->matmul_bf16 : be->matmul;
    h.head32 = p->head_bf16 ? NULL : (const float *)lm_head;
    h.head16 = p->head_bf16 ? (const uint16_t *)lm_head : NULL;
    h.panel = (uint16_t *)((char *)scratch + half_bytes);
    h.panel_values = (int64_t)(half_bytes / sizeof(uint16_t));
    h.H = H;

    for (int64_t r0 = 0, c = 0; r0 < n; r0 += shape.chunk, c++) {
        const int64_t m = n - r0 < shape.chunk ? n - r0 : shape.chunk;
        const float *hs = student_hidden + r0 * H;                            /* (m, H) */
        const float *ht = zt ? teacher_hidden + r0 * H : NULL;                /* (m, H) */
        const float *wc = weights ? weights + r0 : NULL;                      /* (m) */
        DDK_LAUNCH(rows_init_kernel, (unsigned)((m + THREADS - 1) / THREADS), THREADS, 0, stream,
            rows, m, labels ? labels + r0 : NULL, wc, k.given_labels);
        LAUNCH_CHECK();

        for (int64_t off = 0; off < V; off += width) {
            const int64_t w = V - off < width ? V - off : width;
            tile_logits(h, hs, m, off, w, zs);
            if (zt)
                tile_logits(h, ht, m, off, w, zt);
            DDK_LAUNCH(stats_kernel, grid_rows(m), THREADS, 0, stream,
                rows, m, zs, zt, off, w, k, off + w >= V, wc, weight_sum,
                per_position ? per_position + r0 : NULL);
            LAUNCH_CHECK();
            if (sp)   /* the tile into the rows' running candidates */
                ddk_cuda_topk_merge(be, zs, m, w, off, sp->top_k, off > 0, sc.b.cand, sc.b.cz);
        }
        if (sp) {   /* q (m, r) = hs Hp^T, then the rows' terms */
            h.product(be, 0, 1, m, sp->rank, H, 1.0f, hs, H, sp->Hp, H, 0.0f, sc.b.q, sp->rank);
            sc.m = m;
            sc.pred = sp->predecessors + r0;
            sc.weights = wc;
            sc.per_position = per_position ? per_position + r0 : NULL;
            ddk_cuda_sel_rows(be, &sc);
        }

        if (grad_student) {
            float *dhs = grad_student + r0 * H;                                /* (m, H) */
            for (int64_t off = 0; off < V; off += width) {
                const int64_t w = V - off < width ? V - off : width;
                if (tiled) {
                    tile_logits(h, hs, m, off, w, zs);
                    if (k.kl)
                        tile_logits(h, ht, m, off, w, zt);
                }
                const int64_t col_blocks = (w + THREADS - 1) / THREADS;
                dim3 grid((unsigned)(col_blocks < 1024 ? col_blocks : 1024), grid_rows(m));
                DDK_LAUNCH(grad_kernel, grid, THREADS, 0, stream, rows, m, zs, k.kl ? zt : NULL, off, w, k);
                LAUNCH_CHECK();
                if (sel_to_hidden)   /* the selector's ds at its candidates in this tile */
                    ddk_cuda_sel_grad_cols(be, &sc, zs, off, w);
                tile_grad(h, zs, m, off, w, off == 0 ? 0.0f : 1.0f, dhs);   /* over tiles */
            }
            if (sel_to_hidden)   /* d hs (m, H) += dq (m, r) Hp (r, H) */
                h.product(be, 0, 0, m, H, sp->rank, 1.0f, sc.b.dq, sp->rank, sp->Hp, H, 1.0f,
                          dhs, H);
            if (sel_grads) {   /* dHp (r, H) += dq^T (r, m) hs (m, H); dA, dBs */
                h.product(be, 1, 0, sp->rank, H, m, 1.0f, sc.b.dq, sp->rank, hs, H, 1.0f,
                          sp->dHp, H);
                ddk_cuda_sel_scatter(be, &sc, sp->dA, sp->dBs);
            }
        }

        /* the chunk's sums at index c (of the scratch's batch), to the host after the last
         * chunk: one copy (or one per full batch, past 32,768 chunks) */
        const int64_t slot = c % scratch_chunks;
        DDK_LAUNCH(reduce_kernel, 1, THREADS, 0, stream, rows, m, wc, k,
                   sp ? (const ddk_loss_sel_row *)sc.b.rows : NULL, sp ? sp->weight : 0.0f,
                   chunk_sums + slot * NTERMS);
        LAUNCH_CHECK();
        if (c == chunks - 1 || slot == scratch_chunks - 1)
            CUDA_CHECK(cudaMemcpyAsync(partials + (c - slot) * NTERMS, chunk_sums,
                                       (size_t)(slot + 1) * NTERMS * sizeof(double),
                                       cudaMemcpyDeviceToHost, stream));
    }
    ddk_cuda_scratch_unlock(be);   /* all queued: the next holder's launches run after them */
    CUDA_CHECK(cudaStreamSynchronize(stream));
    ddk_free(be->alloc, workspace, shape.workspace_bytes);

    double sums[NTERMS] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int64_t c = 0; c < chunks; c++)
        for (int j = 0; j < NTERMS; j++)
            sums[j] += partials[c * NTERMS + j];
    free(partials);

    ddk_loss_result result = {};
    result.loss = sums[0] / weight_sum;
    result.ce = sums[1] / weight_sum;
    result.kl = sums[2] / weight_sum;
    result.cap = sums[3] / weight_sum;
    result.weight_sum = weight_sum;
    result.counted = counted;
    result.correct = (int64_t)sums[4];
    result.sel = sums[5] / weight_sum;
    result.sel_covered = (int64_t)sums[6];
    result.sel_correct = (int64_t)sums[7];
    *out = result;
    return 0;
}
