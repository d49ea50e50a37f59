/* cuda_backend.h: what the CUDA backend's files share (not installed): the stream, grid and
 * scratch helpers of stream_cuda.cu and every op's entry point (contracts in ddk.h, struct
 * ddk_backend). C++ linkage: the names carry their parameter types, so a declaration that drifted
 * from its definition is a link error, not a silent mismatch.
 */
#ifndef DDK_CUDA_BACKEND_H
#define DDK_CUDA_BACKEND_H

#include "ddk.h"

#include <cuda_runtime.h>

/* stream_cuda.cu: be's stream (and its GPU made current), its multiprocessors, its scratch of
 * DDK_CUDA_SCRATCH_FLOATS floats (made with the stream, held under a lock) */
enum { DDK_CUDA_SCRATCH_FLOATS = 1 << 20 };
cudaStream_t ddk_cuda_stream(const ddk_backend *be);
int ddk_cuda_multiprocessors(const ddk_backend *be);
float *ddk_cuda_scratch_lock(const ddk_backend *be);
void ddk_cuda_scratch_unlock(const ddk_backend *be);

/* attention_select.c (C): records a fallback to the SIMT attention kernels, said in `what`
 * (ddk.h, ddk_cuda_fallbacks) */
extern "C" void ddk_cuda_note_fallback(const char *what);

/* attention_flash.cu: the flash instances that fit `limit` bytes of shared memory a block at
 * padded head dim D (64, 128, 256): query rows of a forward and a dq block, the key-major pass's
 * query rows a chunk; 0 where none fits (the SIMT kernels run) */
void ddk_cuda_flash_instances(size_t limit, int D, int *fwd_rows, int *dq_rows, int *dkv_rq);
/* deltanet_cuda.cu: tokens of a chunk of the chunked form for `want` at key dim dk, within limit */
int ddk_cuda_delta_chunk(int64_t want, int dk, size_t limit);

/* kernel_ops.cu: sets every op of t that is one of this folder's kernels (all but the products,
 * zero, copy, copy_rows and synchronize) */
void ddk_cuda_kernel_ops(ddk_backend *t);

/* ops_cuda.cu */
void ddk_cuda_rmsnorm(const ddk_backend *be, const float *x, const float *g, int64_t rows,
                      int64_t d, float eps, float *y, float *rstd);
void ddk_cuda_rmsnorm_backward(const ddk_backend *be, const float *x, const float *g,
                               const float *rstd, const float *dy, int64_t rows, int64_t d,
                               float *dx, float *dg);
void ddk_cuda_rope(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                   int64_t heads, int64_t d, float theta, int inverse);
void ddk_cuda_swiglu(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                     float *h);
void ddk_cuda_swiglu_backward(const ddk_backend *be, const float *gate, const float *up,
                              const float *dh, int64_t count, float *dgate, float *dup);
void ddk_cuda_swiglu_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                        int64_t count, float *h);
void ddk_cuda_swiglu_backward_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                                 const float *dh, int64_t count, float *dgate, float *dup);
void ddk_cuda_embedding(const ddk_backend *be, const float *table, const int32_t *tokens,
                        int64_t rows, int64_t H, float *out);
void ddk_cuda_rope_partial(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                           int64_t heads, int64_t d, int64_t rd, float theta);
void ddk_cuda_conv1d_silu(const ddk_backend *be, const float *x, const float *w,
                          const float *history, int64_t T, int64_t C, int64_t K, float *y);
void ddk_cuda_gated_rmsnorm(const ddk_backend *be, const float *x, const float *z, const float *w,
                            int64_t rows, int64_t d, float eps, float *y);
/* block_conv_cuda.cu: the DFlash2 drafter's block convolution */
void ddk_cuda_block_conv(const ddk_backend *be, const float *x, const float *base,
                         const float *delta, int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                         int64_t taps, int64_t gs, float *y);
void ddk_cuda_block_conv_backward(const ddk_backend *be, const float *x, const float *base,
                                  const float *delta, int64_t ld_delta, const float *dy,
                                  int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                                  float *dx, float *dbase, float *ddelta);
/* vector_cuda.cu */
double ddk_cuda_sumsq(const ddk_backend *be, const float *x, int64_t count);
void ddk_cuda_argmax_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int32_t *out);
void ddk_cuda_topk_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int64_t k,
                        int32_t *idx, float *val);
void ddk_cuda_logsumexp_rows(const ddk_backend *be, const float *x, int64_t rows, int64_t n,
                             const int32_t *col, float *lse, float *lp);
/* x (rows, w), columns off .. off+w of each row, merged into the rows' running top-k lists idx,
 * val (rows, k) (merge 1: each holding min(off, k) pairs, every index below off; val required) or
 * into new ones (merge 0), which then hold min(off + w, k) pairs (so w < k is allowed: the loss's
 * narrow tiles); topk_row.h's order. topk_rows is the merge 0, off 0, k <= n case. */
void ddk_cuda_topk_merge(const ddk_backend *be, const float *x, int64_t rows, int64_t w,
                         int64_t off, int64_t k, int merge, int32_t *idx, float *val);
void ddk_cuda_axpby(const ddk_backend *be, int64_t count, float alpha, const float *x, float beta,
                    float *y);
void ddk_cuda_adamw(const ddk_backend *be, float *w, float *g, float *m, float *v, uint16_t *w16,
                    int64_t count, const ddk_adamw_scalars *s);
void ddk_cuda_uniform_noise(const ddk_backend *be, float *x, int64_t count, float sigma, uint64_t seed);

/* matmul_cuda.cu: the products (cuBLAS), and matmul_w16's (trans_w 1) and matmul_w16_nn's
 * (trans_w 0) panel loop on a panel of rows x ceil8(kp) bf16 values in scratch the caller holds
 * locked (contract there) */
void ddk_cuda_matmul(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                     int64_t k, float alpha, const float *a, int64_t lda, const float *b,
                     int64_t ldb, float beta, float *c, int64_t ldc);
void ddk_cuda_matmul_bf16(const ddk_backend *be, int trans_a, int trans_b, int64_t m,
                          int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
                          const float *b, int64_t ldb, float beta, float *c, int64_t ldc);
void ddk_cuda_matmul_w16(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                         float beta, float *c, int64_t ldc);
void ddk_cuda_matmul_w16_nn(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, const uint16_t *w, int64_t ldw,
                            float beta, float *c, int64_t ldc);
void ddk_cuda_matmul_16(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                        int64_t k, float alpha, const uint16_t *a, int64_t lda,
                        const uint16_t *b, int64_t ldb, float beta, float *c, int64_t ldc);
void ddk_cuda_w16_product(const ddk_backend *be, int trans_w, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const uint16_t *w,
                          int64_t ldw, float beta, float *c, int64_t ldc, uint16_t *panel,
                          int64_t rows, int64_t kp);

/* loss_cuda.cu: the backend's loss (contract of ddk_loss_cpu) */
int ddk_cuda_loss(const ddk_backend *be, const ddk_loss_params *p, const float *student_hidden,
                  const float *teacher_hidden, const void *lm_head, const int32_t *labels,
                  const float *weights, float *grad_student, float *per_position,
                  ddk_loss_result *out);
/* attention_cuda.cu */
int ddk_cuda_dflash_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                              const float *q, const float *k, const float *v,
                              const int32_t *anchors, const uint8_t *keep, float *out, float *lse);
int ddk_cuda_dflash_attention_backward(const ddk_backend *be, const ddk_attention_shape *shape,
                                       const float *q, const float *k, const float *v,
                                       const int32_t *anchors, const uint8_t *keep,
                                       const float *out, const float *lse, const float *dout,
                                       float *dq, float *dk, float *dv);
int ddk_cuda_causal_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                              const float *q, const float *k, const float *v, float *out);
int ddk_cuda_tree_attention(const ddk_backend *be, const ddk_attention_shape *shape,
                            const float *q, const float *k, const float *v, const int32_t *parents,
                            float *out);
/* attention_flash.cu: the tensor-core kernels of the same contracts, on a shape attention_cuda.cu
 * has checked (A >= 1 or T >= 1); 0 when queued, -ENOTSUP (nothing queued) when the shape or
 * the GPU is not theirs: the caller runs the SIMT kernels */
int ddk_cuda_flash_dflash(const ddk_backend *be, const ddk_attention_shape *shape, const float *q,
                          const float *k, const float *v, const int32_t *anchors,
                          const uint8_t *keep, float *out, float *lse);
int ddk_cuda_flash_dflash_backward(const ddk_backend *be, const ddk_attention_shape *shape,
                                   const float *q, const float *k, const float *v,
                                   const int32_t *anchors, const uint8_t *keep, const float *out,
                                   const float *lse, const float *dout, float *dq, float *dk,
                                   float *dv);
int ddk_cuda_flash_causal(const ddk_backend *be, const ddk_attention_shape *shape, const float *q,
                          const float *k, const float *v, float *out);
/* target_cuda.cu: the frozen target's bf16 gather and element-wise steps, and matmul_w16's
 * operand rounding: dst (rows, ld_dst) bf16 bits = src (rows, cols) (row stride ld_src) rounded
 * to nearest even, queued on be's stream (columns past cols of dst untouched) */
void ddk_cuda_embedding_w16(const ddk_backend *be, const uint16_t *table, const int32_t *tokens,
                            int64_t rows, int64_t H, float *out);
void ddk_cuda_round_bf16_rows(const ddk_backend *be, const float *src, int64_t ld_src,
                              int64_t rows, int64_t cols, uint16_t *dst, int64_t ld_dst);
void ddk_cuda_l2norm_heads(const ddk_backend *be, const float *src, int64_t ld, int64_t T,
                           int64_t heads, int64_t d, float scale, float eps, float *dst);
void ddk_cuda_sigmoid_mul(const ddk_backend *be, float *x, const float *gate, int64_t count);
void ddk_cuda_delta_gates(const ddk_backend *be, const float *b, const float *a, const float *A_log,
                          const float *dt_bias, int64_t T, int64_t nv, float *beta, float *g);
/* deltanet_cuda.cu: the Gated DeltaNet core (recurrence and chunked form) */
int ddk_cuda_gated_delta(const ddk_backend *be, const ddk_delta_shape *shape, const float *q,
                         const float *k, const float *v, const float *beta, const float *g,
                         float *state, float *out);

#endif
