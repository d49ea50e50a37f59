/* cpu_backend.h: the CPU backend's ops, shared between its files (not installed). */
#ifndef DDK_CPU_BACKEND_H
#define DDK_CPU_BACKEND_H

#include "ddk.h"

/* The loss of SPEC.md section 1 (loss_cpu.c); contract of ddk_loss_cpu. */
int ddk_cpu_loss(const ddk_backend *be, const ddk_loss_params *p,
                 const float *student_hidden, const float *teacher_hidden, const void *lm_head,
                 const int32_t *labels, const float *weights,
                 float *grad_student, float *per_position, ddk_loss_result *out);

/* The drafter's and the target's ops; contracts in ddk.h (struct ddk_backend). */
void ddk_cpu_rmsnorm(const ddk_backend *be, const float *x, const float *g, int64_t rows,
                     int64_t d, float eps, float *y, float *rstd);
void ddk_cpu_rmsnorm_backward(const ddk_backend *be, const float *x, const float *g,
                              const float *rstd, const float *dy, int64_t rows, int64_t d,
                              float *dx, float *dg);
void ddk_cpu_rope(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                  int64_t heads, int64_t d, float theta, int inverse);
void ddk_cpu_swiglu(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                    float *h);
void ddk_cpu_swiglu_backward(const ddk_backend *be, const float *gate, const float *up,
                             const float *dh, int64_t count, float *dgate, float *dup);
void ddk_cpu_swiglu_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                       int64_t count, float *h);
void ddk_cpu_swiglu_backward_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                                const float *dh, int64_t count, float *dgate, float *dup);
/* The DFlash2 drafter's block convolution (block_conv_cpu.c) */
void ddk_cpu_block_conv(const ddk_backend *be, const float *x, const float *base,
                        const float *delta, int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                        int64_t taps, int64_t gs, float *y);
void ddk_cpu_block_conv_backward(const ddk_backend *be, const float *x, const float *base,
                                 const float *delta, int64_t ld_delta, const float *dy,
                                 int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                                 float *dx, float *dbase, float *ddelta);
void ddk_cpu_embedding(const ddk_backend *be, const float *table, const int32_t *tokens,
                       int64_t rows, int64_t H, float *out);
void ddk_cpu_embedding_w16(const ddk_backend *be, const uint16_t *table, const int32_t *tokens,
                           int64_t rows, int64_t H, float *out);

/* DFlash, causal and tree attention (attention_cpu.c); contracts in ddk.h. */
int ddk_cpu_dflash_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                             const float *q, const float *k, const float *v,
                             const int32_t *anchors, const uint8_t *keep, float *out, float *lse);
int ddk_cpu_dflash_attention_backward(const ddk_backend *be, const ddk_attention_shape *shape,
                                      const float *q, const float *k, const float *v,
                                      const int32_t *anchors, const uint8_t *keep,
                                      const float *out, const float *lse, const float *dout,
                                      float *dq, float *dk, float *dv);
int ddk_cpu_causal_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                             const float *q, const float *k, const float *v, float *out);
int ddk_cpu_tree_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                           const float *q, const float *k, const float *v, const int32_t *parents,
                           float *out);

/* The Qwen3.5 target's ops (norm_cpu.c, rope_cpu.c, deltanet_cpu.c); contracts in ddk.h. */
void ddk_cpu_gated_rmsnorm(const ddk_backend *be, const float *x, const float *z, const float *w,
                           int64_t rows, int64_t d, float eps, float *y);
void ddk_cpu_rope_partial(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                          int64_t heads, int64_t d, int64_t rd, float theta);
void ddk_cpu_conv1d_silu(const ddk_backend *be, const float *x, const float *w, const float *history,
                         int64_t T, int64_t C, int64_t K, float *y);
int ddk_cpu_gated_delta(const ddk_backend *be, const ddk_delta_shape *shape, const float *q,
                        const float *k, const float *v, const float *beta, const float *g,
                        float *state, float *out);
/* target_cpu.c: the Qwen3.5 target's element-wise steps, the engine's loops bit for bit */
void ddk_cpu_l2norm_heads(const ddk_backend *be, const float *src, int64_t ld, int64_t T,
                          int64_t heads, int64_t d, float scale, float eps, float *dst);
void ddk_cpu_sigmoid_mul(const ddk_backend *be, float *x, const float *gate, int64_t count);
void ddk_cpu_delta_gates(const ddk_backend *be, const float *b, const float *a, const float *A_log,
                         const float *dt_bias, int64_t T, int64_t nv, float *beta, float *g);

/* Whole buffers and the bf16 products (vector_cpu.c); contracts in ddk.h. */
void ddk_cpu_synchronize(const ddk_backend *be);
double ddk_cpu_sumsq(const ddk_backend *be, const float *x, int64_t count);
void ddk_cpu_argmax_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int32_t *out);
void ddk_cpu_topk_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int64_t k,
                       int32_t *idx, float *val);
void ddk_cpu_logsumexp_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n,
                            const int32_t *col, float *lse, float *lp);
/* x (w), the columns off .. off+w of a row, merged into its running top-k list val, idx
 * (*count <= k pairs, topk_row.h's order; every index of the list below off) */
void ddk_cpu_topk_merge(const float *x, int64_t w, int64_t off, int k, float *val, int32_t *idx,
                        int *count);
void ddk_cpu_axpby(const ddk_backend *be, int64_t count, float alpha, const float *x, float beta,
                   float *y);
void ddk_cpu_uniform_noise(const ddk_backend *be, float *x, int64_t count, float sigma, uint64_t seed);
void ddk_cpu_adamw(const ddk_backend *be, float *w, float *g, float *m, float *v, uint16_t *w16,
                   int64_t count, const ddk_adamw_scalars *s);
void ddk_cpu_round_bf16(const ddk_backend *be, const float *x, int64_t count, uint16_t *y);
void ddk_cpu_matmul_16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                       int64_t k, float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                       int64_t ldb, float beta, float *c, int64_t ldc);
void ddk_cpu_matmul_bf16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                         int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                         int64_t ldb, float beta, float *c, int64_t ldc);
void ddk_cpu_matmul_w16(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                        float *c, int64_t ldc);
void ddk_cpu_matmul_w16_nn(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                           const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                           float *c, int64_t ldc);

#endif
