/* selector_cuda.h: the DFlash2 path selector's kernels inside the CUDA loss (selector_cuda.cu),
 * what loss_cuda.cu calls chunk by chunk. Not installed; C++ (the CUDA files and the SIMT
 * emulation). */
#ifndef DDK_SELECTOR_CUDA_H
#define DDK_SELECTOR_CUDA_H

#include "ddk.h"
#include "loss_row.h"   /* ddk_loss_consts; loss_internal.h's rows and buffers */

/* One chunk of the selector's term (every pointer device memory, the chunk's) */
typedef struct ddk_cuda_sel_chunk {
    const ddk_loss_row *rows;     /* (m) the finished unary rows (loss_cuda.cu's reuse: c_dot CE_i, t_dot KL_i) */
    ddk_loss_sel_buffers b;       /* the workspace's */
    const int32_t *pred;          /* (m) predecessors */
    const float *weights;         /* (m), or NULL */
    float *per_position;          /* (m), or NULL: l_i rewritten where a row has a term */
    const float *A, *Bs;          /* (V, r) */
    int64_t m, K, r;
    double weight_sum;
    float weight;                 /* alpha_sel */
    int inject;
    int grads;                    /* gradients asked for and weight > 0: ds, dq, q * b */
    ddk_loss_consts k;
} ddk_cuda_sel_chunk;

/* After the chunk's vocabulary pass and q = Hp hs: each row's label among its candidates, u,
 * the scores, l_sel and its record, l_i, and with c->grads ds, dq and q * b */
void ddk_cuda_sel_rows(const ddk_backend *be, const ddk_cuda_sel_chunk *c);

/* The rows' ds added to their gradient rows g (m, w), columns off .. off+w, at their candidates
 * there */
void ddk_cuda_sel_grad_cols(const ddk_backend *be, const ddk_cuda_sel_chunk *c, float *g,
                            int64_t off, int64_t w);

/* dA (V, r) and dBs (V, r) += the chunk's rows, each token's sum over a group of rows in their order,
 * the groups in row order */
void ddk_cuda_sel_scatter(const ddk_backend *be, const ddk_cuda_sel_chunk *c, float *dA,
                          float *dBs);

#endif
