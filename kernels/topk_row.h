/* topk_row.h: the order of a top-K and one row's running top-K list, written once for both
 * backends: the CPU's topk_rows and the fused loss's online top-K (kernels/cpu/vector_cpu.c's
 * ddk_cpu_topk_merge), and the CUDA topk kernel (kernels/cuda/vector_cuda.cu: a list per thread,
 * then the block's lists merged). Not installed; C and CUDA (nvcc: __host__ __device__; the SIMT
 * emulation: host C++); no CUDA types.
 *
 * The order (ddk_topk_before): the larger value first, equal values by the lower index, a NaN
 * after every number (NaNs by index); -inf is a number. On pairs with distinct indices it is a
 * strict total order, so the k first pairs of a row are one list whatever tiles the row is cut
 * into and in whatever order the pieces are merged: the loss's candidates are the same for every
 * chunk and vocab_tile, and the GPU's are the CPU's. A row with fewer than k numbers ends in its
 * NaNs (by index): topk_rows "passes NaNs over".
 *
 * Deliberately not here: the scan of a row (the CPU's 8-lane filter, the GPU's threads). Tested by
 * tests/kernels/test_topk.c (topk_rows against a naive sort: ties, NaNs, -inf, k = 1 and n, rows
 * merged from tiles) and through the loss (tests/kernels/test_loss_selector.c: the same candidates
 * for every chunk and vocab_tile, ties to the lower id), and on the GPU's side by the SIMT
 * emulation (tests/simt) and tests/kernels/test_backend_ops.c.
 */
#ifndef DDK_TOPK_ROW_H
#define DDK_TOPK_ROW_H

#include <stdint.h>

#ifdef __CUDACC__
#define DDK_TOPK_FN static __forceinline__ __host__ __device__
#else
#define DDK_TOPK_FN static inline
#endif

/* (a, ia) comes before (b, ib): a larger, or equal at a lower index; a number before a NaN */
DDK_TOPK_FN int ddk_topk_before(float a, int32_t ia, float b, int32_t ib)
{
    if (a > b)
        return 1;
    if (a < b)
        return 0;
    if (a == b)
        return ia < ib;
    const int a_nan = a != a, b_nan = b != b;   /* unordered: one of them is a NaN */
    return a_nan == b_nan ? ia < ib : b_nan;
}

/* (x, id) into the list val, idx (*count <= k pairs, in ddk_topk_before's order): placed when
 * the list has room or it comes before the last pair, which then drops out */
DDK_TOPK_FN void ddk_topk_insert(float *val, int32_t *idx, int *count, int k, float x, int32_t id)
{
    int j = *count;
    if (j == k) {
        if (!ddk_topk_before(x, id, val[k - 1], idx[k - 1]))
            return;
        j = k - 1;
    } else {
        (*count)++;
    }
    for (; j > 0 && ddk_topk_before(x, id, val[j - 1], idx[j - 1]); j--) {
        val[j] = val[j - 1];
        idx[j] = idx[j - 1];
    }
    val[j] = x;
    idx[j] = id;
}

#endif
