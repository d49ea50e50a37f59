/* backend_cpu.c: the CPU backend table (the reference every other backend is checked against),
 * its matrix product, which is one BLAS call (OpenBLAS), and its memory ops (zero, copy, the
 * strided copy_rows: a memcpy per row).
 *
 * Tested by tests/kernels/test_loss.c (matmul against a naive product, the loss op against the float64
 * reference) and tests/kernels/test_ops.c (matmul, zero, copy, copy_rows).
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <cblas.h>
#include <pthread.h>
#include <string.h>

static void cpu_matmul(const ddk_backend *be, int trans_a, int trans_b,
                       int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const float *b, int64_t ldb,
                       float beta, float *c, int64_t ldc)
{
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, (blasint)m, (blasint)n, (blasint)k, alpha,
                a, (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

static void cpu_zero(const ddk_backend *be, void *dst, size_t bytes)
{
    memset(dst, 0, bytes);
}

static void cpu_copy(const ddk_backend *be, void *dst, const void *src, size_t bytes)
{
    memmove(dst, src, bytes);
}

static void cpu_copy_rows(const ddk_backend *be, float *dst, int64_t ld_dst, const float *src,
                          int64_t ld_src, int64_t rows, int64_t cols)
{
    if (cols <= 0)
        return;
    for (int64_t r = 0; r < rows; r++)
        memcpy(dst + r * ld_dst, src + r * ld_src, (size_t)cols * sizeof(float));
}

static ddk_backend cpu_backend = {
    .name = "cpu",
    .matmul = cpu_matmul,
    .matmul_bf16 = ddk_cpu_matmul_bf16,
    .matmul_w16 = ddk_cpu_matmul_w16,
    .matmul_w16_nn = ddk_cpu_matmul_w16_nn,
    .matmul_16 = ddk_cpu_matmul_16,
    .round_bf16 = ddk_cpu_round_bf16,
    .loss = ddk_cpu_loss,
    .zero = cpu_zero,
    .copy = cpu_copy,
    .copy_rows = cpu_copy_rows,
    .synchronize = ddk_cpu_synchronize,
    .sumsq = ddk_cpu_sumsq,
    .argmax_rows = ddk_cpu_argmax_rows,
    .topk_rows = ddk_cpu_topk_rows,
    .logsumexp_rows = ddk_cpu_logsumexp_rows,
    .axpby = ddk_cpu_axpby,
    .adamw = ddk_cpu_adamw,
    .uniform_noise = ddk_cpu_uniform_noise,
    .rmsnorm = ddk_cpu_rmsnorm,
    .rmsnorm_backward = ddk_cpu_rmsnorm_backward,
    .block_conv = ddk_cpu_block_conv,
    .block_conv_backward = ddk_cpu_block_conv_backward,
    .rope = ddk_cpu_rope,
    .swiglu = ddk_cpu_swiglu,
    .swiglu_backward = ddk_cpu_swiglu_backward,
    .swiglu_16 = ddk_cpu_swiglu_16,
    .swiglu_backward_16 = ddk_cpu_swiglu_backward_16,
    .embedding = ddk_cpu_embedding,
    .embedding_w16 = ddk_cpu_embedding_w16,
    .dflash_attention = ddk_cpu_dflash_attention,
    .dflash_attention_backward = ddk_cpu_dflash_attention_backward,
    .causal_attention = ddk_cpu_causal_attention,
    .tree_attention = ddk_cpu_tree_attention,
    .conv1d_silu = ddk_cpu_conv1d_silu,
    .gated_rmsnorm = ddk_cpu_gated_rmsnorm,
    .rope_partial = ddk_cpu_rope_partial,
    .gated_delta = ddk_cpu_gated_delta,
    .l2norm_heads = ddk_cpu_l2norm_heads,
    .sigmoid_mul = ddk_cpu_sigmoid_mul,
    .delta_gates = ddk_cpu_delta_gates,
};

static pthread_once_t cpu_once = PTHREAD_ONCE_INIT;

static void cpu_backend_init(void)
{
    cpu_backend.alloc = ddk_allocator_cpu();
}

const ddk_backend *ddk_backend_cpu(void)
{
    pthread_once(&cpu_once, cpu_backend_init);   /* threads call this at once: set it once */
    return &cpu_backend;
}

enum { CPU_RANKS = 64 };
static ddk_backend rank_backends[CPU_RANKS];
static pthread_once_t rank_once = PTHREAD_ONCE_INIT;

static void rank_backends_init(void)
{
    ddk_backend_cpu();
    for (int r = 0; r < CPU_RANKS; r++) {
        rank_backends[r] = cpu_backend;
        rank_backends[r].alloc = ddk_allocator_cpu_rank(r);
    }
}

const ddk_backend *ddk_backend_cpu_rank(int rank)
{
    if (rank < 0 || rank >= CPU_RANKS)
        return NULL;
    pthread_once(&rank_once, rank_backends_init);
    return &rank_backends[rank];
}

void ddk_cpu_set_threads(int threads)
{
    if (threads > 0)
        openblas_set_num_threads(threads);
}

int ddk_loss_cpu(const ddk_loss_params *p, const float *student_hidden,
                 const float *teacher_hidden, const void *lm_head, const int32_t *labels,
                 const float *weights, float *grad_student, float *per_position,
                 ddk_loss_result *out)
{
    return ddk_cpu_loss(ddk_backend_cpu(), p, student_hidden, teacher_hidden, lm_head, labels,
                        weights, grad_student, per_position, out);
}
