/* selector_cpu.h: the DFlash2 path selector's term inside the CPU's fused loss (SPEC.md 2.1):
 * what loss_cpu.c calls of selector_cpu.c, chunk by chunk. Not installed. */
#ifndef DDK_SELECTOR_CPU_H
#define DDK_SELECTOR_CPU_H

#include "loss_internal.h"   /* ddk_loss_row, ddk_loss_sel_buffers */

/* the CPU loss's products: be->matmul, or be->matmul_bf16 with bf16_products */
typedef void (*ddk_cpu_product_fn)(const ddk_backend *be, int trans_a, int trans_b, int64_t m,
                                   int64_t n, int64_t k, float alpha, const float *a,
                                   int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                                   int64_t ldc);

/* One call's selector */
typedef struct ddk_cpu_selector {
    const ddk_backend *be;
    ddk_cpu_product_fn product;
    const ddk_selector *s;       /* p->selector */
    ddk_loss_sel_buffers b;      /* the workspace's (ddk_loss_sel_carve) */
    int64_t H, K, r;
    int grads;                   /* gradients asked for (grad_student) and weight > 0 */
    int to_hidden;               /* ... and not stop_gradient: the term's gradient into d hs */
} ddk_cpu_selector;

/* One tile (columns off .. off+w) of the chunk's rows into their online top-K: zs (m, w) the
 * tile's logits; ignored rows are passed over. Tiles come in column order. */
void ddk_cpu_sel_tile(const ddk_cpu_selector *S, const ddk_loss_row *rows, int64_t m,
                      const float *zs, int64_t off, int64_t w);

/* After the chunk's vocabulary pass: q (m, r) = hs (m, H) Hp^T */
void ddk_cpu_sel_project(const ddk_cpu_selector *S, const float *hs, int64_t m);

/* Row i of the chunk, its unary statistics final (row): its term's record (S->b.rows[i]), and
 * with S->grads its ds, dq and dA's and dBs's rows. predecessor: p_i; scale: w_i / sum w.
 * Returns l_sel (0 without a term or for an ignored row). */
double ddk_cpu_sel_row(const ddk_cpu_selector *S, int64_t i, const ddk_loss_row *row,
                       int32_t predecessor, double scale);

/* With S->to_hidden: row i's ds added to its gradient row g (w), columns off .. off+w, at its
 * candidates there (before g's product with W) */
void ddk_cpu_sel_grad_tile(const ddk_cpu_selector *S, int64_t i, float *g, int64_t off,
                           int64_t w);

/* With S->grads, after the chunk's d hs (m, H) over the vocabulary: d hs += dq Hp (to_hidden),
 * dHp += dq^T hs, and dA, dBs's rows added in row order. hs (m, H), predecessors (m): the
 * chunk's. */
void ddk_cpu_sel_backward(const ddk_cpu_selector *S, const float *hs, int64_t m,
                          const int32_t *predecessors, float *dhs);

#endif
