/* kernel_ops.cu: the ops of a CUDA backend's table that are this folder's kernels (every op but
 * the cuBLAS products, zero, copy, copy_rows and synchronize), in one place for both tables that
 * hold them: the GPU's (backend_cuda.cu) and the SIMT emulation's (tests/simt/simt_backend.cpp,
 * which runs them from these same sources on the CPU); and ddk_cuda_instances, what a GPU's
 * limits choose of them. Tested through both: tests/kernels/test_backend_ops.c on a GPU,
 * tests/simt/test_simt_kernels.cpp everywhere (the instances of each card's profile). */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"

#include <errno.h>
#include <stdio.h>

/* round_bf16 on a flat vector: one row of count values */
static void round_bf16_flat(const ddk_backend *be, const float *x, int64_t count, uint16_t *y)
{
    ddk_cuda_round_bf16_rows(be, x, count, 1, count, y, count);
}

void ddk_cuda_kernel_ops(ddk_backend *t)
{
    t->round_bf16 = round_bf16_flat;
    t->loss = ddk_cuda_loss;
    t->sumsq = ddk_cuda_sumsq;
    t->argmax_rows = ddk_cuda_argmax_rows;
    t->topk_rows = ddk_cuda_topk_rows;
    t->logsumexp_rows = ddk_cuda_logsumexp_rows;
    t->axpby = ddk_cuda_axpby;
    t->adamw = ddk_cuda_adamw;
    t->uniform_noise = ddk_cuda_uniform_noise;
    t->rmsnorm = ddk_cuda_rmsnorm;
    t->rmsnorm_backward = ddk_cuda_rmsnorm_backward;
    t->block_conv = ddk_cuda_block_conv;
    t->block_conv_backward = ddk_cuda_block_conv_backward;
    t->rope = ddk_cuda_rope;
    t->swiglu = ddk_cuda_swiglu;
    t->swiglu_backward = ddk_cuda_swiglu_backward;
    t->swiglu_16 = ddk_cuda_swiglu_16;
    t->swiglu_backward_16 = ddk_cuda_swiglu_backward_16;
    t->embedding = ddk_cuda_embedding;
    t->embedding_w16 = ddk_cuda_embedding_w16;
    t->dflash_attention = ddk_cuda_dflash_attention;
    t->dflash_attention_backward = ddk_cuda_dflash_attention_backward;
    t->causal_attention = ddk_cuda_causal_attention;
    t->tree_attention = ddk_cuda_tree_attention;
    t->conv1d_silu = ddk_cuda_conv1d_silu;
    t->gated_rmsnorm = ddk_cuda_gated_rmsnorm;
    t->rope_partial = ddk_cuda_rope_partial;
    t->gated_delta = ddk_cuda_gated_delta;
    t->l2norm_heads = ddk_cuda_l2norm_heads;
    t->sigmoid_mul = ddk_cuda_sigmoid_mul;
    t->delta_gates = ddk_cuda_delta_gates;
}

/* ddk.h: the card's limits and the instances chosen under them, one line */
extern "C" int ddk_cuda_instances(int device, char *text, size_t len)
{
    int smem = 0, per_sm = 0, threads = 0, sms = 0, major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess) {
        cudaGetLastError();
        if (text && len)
            snprintf(text, len, "cuda:%d: no such GPU", device);
        return -EINVAL;
    }
    CUDA_CHECK(cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&threads, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    int n = snprintf(text, len, "sm_%d%d, %d SMs, shared memory %d a block (opt-in), %d an SM, %d threads an SM;"
                     " flash rows forward/dq/dkv-chunk", major, minor, sms, smem, per_sm, threads);
    static const int dims[] = { 64, 128, 256 };
    for (int D : dims) {
        int f, q, r;
        ddk_cuda_flash_instances((size_t)smem, D, &f, &q, &r);
        if (n >= 0 && (size_t)n < len)
            n += snprintf(text + n, len - (size_t)n, " d%d %d/%d/%d", D, f, q, r);
    }
    if (n >= 0 && (size_t)n < len)
        snprintf(text + n, len - (size_t)n, "; gated delta chunk dk128 %d, dk256 %d",
                 ddk_cuda_delta_chunk(INT64_MAX, 128, (size_t)smem), ddk_cuda_delta_chunk(INT64_MAX, 256, (size_t)smem));
    return 0;
}
