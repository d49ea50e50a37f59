/* bench_attention_cuda.c: the CUDA backend's DFlash attention (forward + backward) and causal
 * prefill on GPU 0, with both kernel sets side by side in one run (ddk.h,
 * ddk_cuda_set_attention_kernels: the fp32 SIMT kernels, "before", and the tensor-core flash
 * kernels, "after"), beside the card's measured bf16 GEMM ceiling. Prints, never fails on speed;
 * exits 77 ("SKIPPED: no GPU", then a JSON line {"impl":"ddtree-cuda-attention","skipped":"no GPU"}) when
 * libddk has no CUDA or the machine no GPU, 1 when an allocation or an op fails.
 *
 *   bench_attention_cuda [--S S] [--A A] [--B B] [--nh NH] [--nkv NKV] [--d D] [--window W]
 *                        [--causal-T T] [--causal-nh NH] [--causal-nkv NKV] [--causal-d D]
 *                        [--reps R] [--simt 0|1] [--json]
 *
 * Defaults: the seed's drafter layer (S 4,096, 1,024 anchors, block 24, 32/8 heads of 128,
 * full attention) and the Qwen3.6-27B target's full-attention prefill (4,096 tokens, 24/4 heads
 * of 256). tests/gpu/check.sh runs it on the device machine. --simt 0 skips the SIMT kernels
 * (they take seconds at the seed's shape).
 *
 * What it measures, and how:
 *   - inputs on the GPU from ddk_malloc(ddk_allocator_cuda(0)), filled with a repeated host slice
 *     of uniform values (q, k in [-2, 2], v, dout in [-1, 1]); anchors uniform on [0, S - 2],
 *     sorted, every block kept;
 *   - time: ddk_cuda_synchronize, CLOCK_MONOTONIC around the call, ddk_cuda_synchronize; one
 *     warm-up, then the median of --reps calls; forward and backward timed apart;
 *   - FLOP: the visible (query, key) pairs counted exactly from the anchors, times 4 d for the
 *     forward (q k^T, p v) and 10 d for the backward (FlashAttention's count: s, dp, dv, dk, dq;
 *     the recomputations the kernels do are not counted); causal: T (T + 1) / 2 nh pairs, 4 d;
 *   - the ceiling: cublasGemmEx with bf16 A, B, fp32 C, CUBLAS_COMPUTE_32F, the best of a square
 *     8192 and a 4096 x 8192 x 128 product, median of 5 (built only with DDTREE_BENCH_CUBLAS, as
 *     bench_loss_cuda's); "of ceiling" is the forward + backward rate against it (the goal:
 *     >= 40%).
 *
 * Legend: S context rows, A anchors, B block size, nh / nkv heads, d head dim, T causal tokens.
 */
#include "bench_util.h"
#include "ddk.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef DDTREE_BENCH_CUBLAS
#include <cublas_v2.h>
#include <cuda_runtime.h>
#endif

enum { SLICE = 1 << 20, CEIL_REPS = 5 };

typedef struct bench_args {
    int64_t S, A, B, nh, nkv, d, window;
    int64_t cT, cnh, cnkv, cd;
    int reps, simt, json;
} bench_args;

static const ddk_backend *be;
static float *slice;
static uint64_t rng = 0xa77e5eedu;

static float *dev_uniform(int64_t count, float lo, float hi)
{
    float *p = ddk_malloc(be->alloc, (size_t)count * sizeof(float));
    if (!p) {
        fprintf(stderr, "bench_attention_cuda: no %lld floats on the GPU\n", (long long)count);
        exit(1);
    }
    for (int64_t i = 0; i < SLICE; i++)
        slice[i] = lo + (hi - lo) * (float)(ddk_rng_next(&rng) >> 40) * 0x1.0p-24f;
    for (int64_t off = 0; off < count; off += SLICE) {
        const int64_t m = count - off < SLICE ? count - off : SLICE;
        be->copy(be, p + off, slice, (size_t)m * sizeof(float));
        ddk_cuda_synchronize(0);
    }
    return p;
}

static int cmp_i32(const void *a, const void *b)
{
    const int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

typedef struct timing {
    double fwd_s, bwd_s;    /* medians */
    double tflops;          /* (forward + backward FLOP) / (fwd_s + bwd_s), or the forward's alone */
} timing;

typedef struct dflash_bufs {
    ddk_attention_shape sh;
    float *q, *k, *v, *out, *lse, *dout, *dq, *dk, *dv;
    int32_t *anchors;
    uint8_t *keep;
    double fwd_flop, bwd_flop;
} dflash_bufs;

static int time_dflash(const dflash_bufs *b, int reps, timing *t)
{
    double *ft = calloc((size_t)reps, sizeof(double)), *bt = calloc((size_t)reps, sizeof(double));
    for (int r = -1; r < reps; r++) {
        ddk_cuda_synchronize(0);
        double t0 = bench_now_s();
        int rc = be->dflash_attention(be, &b->sh, b->q, b->k, b->v, b->anchors, b->keep, b->out, b->lse);
        ddk_cuda_synchronize(0);
        double t1 = bench_now_s();
        rc = rc ? rc
                : be->dflash_attention_backward(be, &b->sh, b->q, b->k, b->v, b->anchors, b->keep, b->out,
                                                b->lse, b->dout, b->dq, b->dk, b->dv);
        ddk_cuda_synchronize(0);
        double t2 = bench_now_s();
        if (rc) {
            fprintf(stderr, "bench_attention_cuda: dflash attention returned %d\n", rc);
            free(ft), free(bt);
            return rc;
        }
        if (r >= 0) {
            ft[r] = t1 - t0;
            bt[r] = t2 - t1;
        }
    }
    t->fwd_s = bench_median(ft, reps);
    t->bwd_s = bench_median(bt, reps);
    t->tflops = (b->fwd_flop + b->bwd_flop) / (t->fwd_s + t->bwd_s) / 1e12;
    free(ft), free(bt);
    return 0;
}

static int time_causal(const ddk_attention_shape *sh, const float *q, const float *k, const float *v,
                       float *out, double flop, int reps, timing *t)
{
    double *ft = calloc((size_t)reps, sizeof(double));
    for (int r = -1; r < reps; r++) {
        ddk_cuda_synchronize(0);
        double t0 = bench_now_s();
        int rc = be->causal_attention(be, sh, q, k, v, out);
        ddk_cuda_synchronize(0);
        if (rc) {
            fprintf(stderr, "bench_attention_cuda: causal attention returned %d\n", rc);
            free(ft);
            return rc;
        }
        if (r >= 0)
            ft[r] = bench_now_s() - t0;
    }
    t->fwd_s = bench_median(ft, reps);
    t->bwd_s = 0;
    t->tflops = flop / t->fwd_s / 1e12;
    free(ft);
    return 0;
}

/* the card's bf16 GEMM ceiling in TFLOP/s, or 0 (not built / failed) */
static double bf16_ceiling(void)
{
#ifdef DDTREE_BENCH_CUBLAS
    const int64_t n = 8192;
    uint16_t *A = NULL, *B = NULL, *h = NULL;
    float *C = NULL;
    cublasHandle_t handle = NULL;
    double best = 0;
    if (cudaMalloc((void **)&A, (size_t)(n * n) * 2) != cudaSuccess ||
        cudaMalloc((void **)&B, (size_t)(n * n) * 2) != cudaSuccess ||
        cudaMalloc((void **)&C, (size_t)(n * n) * 4) != cudaSuccess || cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS)
        goto done;
    h = malloc((size_t)SLICE * 2);
    for (int64_t i = 0; i < SLICE; i++)
        h[i] = ddk_f32_to_bf16((float)(ddk_rng_next(&rng) >> 40) * 0x1.0p-23f - 1.0f);
    for (int64_t off = 0; off < n * n; off += SLICE) {
        cudaMemcpy(A + off, h, (size_t)SLICE * 2, cudaMemcpyHostToDevice);
        cudaMemcpy(B + off, h, (size_t)SLICE * 2, cudaMemcpyHostToDevice);
    }
    static const int64_t shapes[2][3] = { { 8192, 8192, 8192 }, { 4096, 8192, 128 } };   /* m, n, k */
    for (int s = 0; s < 2; s++) {
        const int64_t m = shapes[s][0], nn = shapes[s][1], k = shapes[s][2];
        const float one = 1.0f, zero = 0.0f;
        double t[CEIL_REPS];
        for (int r = -1; r < CEIL_REPS; r++) {
            cudaDeviceSynchronize();
            double t0 = bench_now_s();
            if (cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)nn, (int)m, (int)k, &one, B, CUDA_R_16BF,
                             (int)k, A, CUDA_R_16BF, (int)k, &zero, C, CUDA_R_32F, (int)nn, CUBLAS_COMPUTE_32F,
                             CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS ||
                cudaDeviceSynchronize() != cudaSuccess)
                goto done;
            if (r >= 0)
                t[r] = bench_now_s() - t0;
        }
        const double tf = 2.0 * m * nn * k / bench_median(t, CEIL_REPS) / 1e12;
        if (tf > best)
            best = tf;
    }
done:
    if (handle)
        cublasDestroy(handle);
    free(h);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaGetLastError();
    return best;
#else
    return 0;
#endif
}

int main(int argc, char **argv)
{
    bench_args a = { .S = 4096, .A = 1024, .B = 24, .nh = 32, .nkv = 8, .d = 128, .window = 0,
                     .cT = 4096, .cnh = 24, .cnkv = 4, .cd = 256, .reps = 3, .simt = 1 };
    const bench_opt opts[] = {
        { "--S", BENCH_I64, &a.S }, { "--A", BENCH_I64, &a.A }, { "--B", BENCH_I64, &a.B },
        { "--nh", BENCH_I64, &a.nh }, { "--nkv", BENCH_I64, &a.nkv }, { "--d", BENCH_I64, &a.d },
        { "--window", BENCH_I64, &a.window }, { "--causal-T", BENCH_I64, &a.cT },
        { "--causal-nh", BENCH_I64, &a.cnh }, { "--causal-nkv", BENCH_I64, &a.cnkv },
        { "--causal-d", BENCH_I64, &a.cd }, { "--reps", BENCH_INT, &a.reps }, { "--simt", BENCH_INT, &a.simt },
        { "--json", BENCH_SET, &a.json },
    };
    if (bench_parse("bench_attention_cuda", argc, argv, opts, sizeof opts / sizeof opts[0]))
        return 2;
    if (a.reps < 1 || a.S < 2 || a.A < 1 || a.B < 1 || a.nkv < 1 || a.nh % a.nkv || a.cnkv < 1 ||
        a.cnh % a.cnkv || a.cT < 1) {
        fprintf(stderr, "bench_attention_cuda: bad sizes (reps >= 1, S >= 2, nh %% nkv == 0)\n");
        return 2;
    }
    if (!ddk_has_cuda() || ddk_cuda_device_count() == 0) {
        printf("SKIPPED: no GPU\n{\"impl\":\"ddtree-cuda-attention\",\"skipped\":\"no GPU\"}\n");
        return 77;
    }
    be = ddk_backend_cuda(0);
    ddk_device_info info;
    if (!be || ddk_cuda_device_info(0, &info)) {
        fprintf(stderr, "bench_attention_cuda: no backend for GPU 0\n");
        return 1;
    }
    slice = malloc((size_t)SLICE * sizeof(float));

    /* DFlash: the seed's layer */
    dflash_bufs b = { .sh = { .S = a.S, .A = a.A, .B = a.B, .nh = a.nh, .nkv = a.nkv, .d = a.d,
                              .window = a.window } };
    const int64_t nq = a.A * a.B * a.nh * a.d, nk = (a.S + a.A * a.B) * a.nkv * a.d;
    int32_t *anchors = malloc((size_t)a.A * sizeof(int32_t));
    uint8_t *keep = malloc((size_t)a.A);
    for (int64_t j = 0; j < a.A; j++) {
        anchors[j] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)(a.S - 1));
        keep[j] = 1;
    }
    qsort(anchors, (size_t)a.A, sizeof *anchors, cmp_i32);
    double pairs = 0;   /* visible (query row, key) pairs of one query head */
    for (int64_t j = 0; j < a.A; j++)
        for (int64_t o = 0; o < a.B; o++) {
            const int64_t lo = a.window > 0 ? (anchors[j] + o - (a.window - 1) > 0 ? anchors[j] + o - (a.window - 1) : 0) : 0;
            pairs += (double)(anchors[j] > lo ? anchors[j] - lo : 0) + (double)(a.window > 0 ? o + 1 : a.B);
        }
    b.fwd_flop = 4.0 * (double)a.d * pairs * (double)a.nh;
    b.bwd_flop = 10.0 * (double)a.d * pairs * (double)a.nh;
    b.q = dev_uniform(nq, -2, 2);
    b.k = dev_uniform(nk, -2, 2);
    b.v = dev_uniform(nk, -1, 1);
    b.dout = dev_uniform(nq, -1, 1);
    b.out = dev_uniform(nq, 0, 0);
    b.dq = dev_uniform(nq, 0, 0);
    b.dk = dev_uniform(nk, 0, 0);
    b.dv = dev_uniform(nk, 0, 0);
    b.lse = dev_uniform(a.A * a.B * a.nh, 0, 0);
    b.anchors = ddk_malloc(be->alloc, (size_t)a.A * sizeof(int32_t));
    b.keep = ddk_malloc(be->alloc, (size_t)a.A);
    if (!b.anchors || !b.keep) {
        fprintf(stderr, "bench_attention_cuda: no room for the anchors\n");
        return 1;
    }
    be->copy(be, b.anchors, anchors, (size_t)a.A * sizeof(int32_t));
    be->copy(be, b.keep, keep, (size_t)a.A);
    ddk_cuda_synchronize(0);

    /* causal: the target's prefill */
    const ddk_attention_shape csh = { .S = a.cT, .nh = a.cnh, .nkv = a.cnkv, .d = a.cd };
    const int64_t cq = a.cT * a.cnh * a.cd, ck = a.cT * a.cnkv * a.cd;
    float *c_q = dev_uniform(cq, -2, 2), *c_k = dev_uniform(ck, -2, 2), *c_v = dev_uniform(ck, -1, 1);
    float *c_out = dev_uniform(cq, 0, 0);
    const double c_flop = 4.0 * (double)a.cd * (double)a.cT * (double)(a.cT + 1) / 2.0 * (double)a.cnh;

    timing ts = { 0 }, tf = { 0 }, cs = { 0 }, cf = { 0 };
    int rc = 0;
    if (a.simt) {
        ddk_cuda_set_attention_kernels(DDK_CUDA_ATTENTION_SIMT);
        rc = rc ? rc : time_dflash(&b, a.reps, &ts);
        rc = rc ? rc : time_causal(&csh, c_q, c_k, c_v, c_out, c_flop, a.reps, &cs);
    }
    ddk_cuda_set_attention_kernels(DDK_CUDA_ATTENTION_FLASH);
    rc = rc ? rc : time_dflash(&b, a.reps, &tf);
    rc = rc ? rc : time_causal(&csh, c_q, c_k, c_v, c_out, c_flop, a.reps, &cf);
    ddk_cuda_set_attention_kernels(-1);
    if (rc)
        return 1;
    const double ceiling = bf16_ceiling();
    const int flash_runs = info.compute_capability >= 80;

    if (!a.json) {
        printf("cuda:0 %s, sm_%d; flash kernels %s\n", info.name, info.compute_capability,
               flash_runs ? "run" : "NOT available (below sm_80: the flash rows are the SIMT kernels)");
        printf("dflash S %lld, A %lld, B %lld, heads %lld/%lld of %lld, window %lld: %.3g TFLOP fwd + %.3g bwd\n",
               (long long)a.S, (long long)a.A, (long long)a.B, (long long)a.nh, (long long)a.nkv,
               (long long)a.d, (long long)a.window, b.fwd_flop / 1e12, b.bwd_flop / 1e12);
        printf("  %-6s %10s %10s %12s %10s\n", "kernel", "fwd ms", "bwd ms", "TFLOP/s", "of ceil");
        if (a.simt)
            printf("  %-6s %10.2f %10.2f %12.1f %9.1f%%\n", "simt", ts.fwd_s * 1e3, ts.bwd_s * 1e3, ts.tflops,
                   ceiling > 0 ? 100 * ts.tflops / ceiling : 0);
        printf("  %-6s %10.2f %10.2f %12.1f %9.1f%%\n", "flash", tf.fwd_s * 1e3, tf.bwd_s * 1e3, tf.tflops,
               ceiling > 0 ? 100 * tf.tflops / ceiling : 0);
        if (a.simt)
            printf("  flash / simt: %.1fx\n", tf.tflops / ts.tflops);
        printf("causal prefill T %lld, heads %lld/%lld of %lld: %.3g TFLOP\n", (long long)a.cT, (long long)a.cnh,
               (long long)a.cnkv, (long long)a.cd, c_flop / 1e12);
        if (a.simt)
            printf("  %-6s %10.2f ms %10.1f TFLOP/s\n", "simt", cs.fwd_s * 1e3, cs.tflops);
        printf("  %-6s %10.2f ms %10.1f TFLOP/s\n", "flash", cf.fwd_s * 1e3, cf.tflops);
        if (ceiling > 0)
            printf("bf16 GEMM ceiling (cublasGemmEx bf16, fp32 accumulation): %.1f TFLOP/s\n", ceiling);
        else
            printf("bf16 GEMM ceiling: not built (no cuBLAS linked) or failed\n");
    }
    printf("{\"impl\":\"ddtree-cuda-attention\",\"gpu\":\"%s\",\"sm\":%d,\"flash_runs\":%d,"
           "\"S\":%lld,\"A\":%lld,\"B\":%lld,\"nh\":%lld,\"nkv\":%lld,\"d\":%lld,\"window\":%lld,"
           "\"simt_fwd_ms\":%.3f,\"simt_bwd_ms\":%.3f,\"simt_tflops\":%.2f,"
           "\"flash_fwd_ms\":%.3f,\"flash_bwd_ms\":%.3f,\"flash_tflops\":%.2f,\"flash_over_simt\":%.2f,"
           "\"causal_simt_tflops\":%.2f,\"causal_flash_tflops\":%.2f,\"ceiling_tflops\":%.1f,"
           "\"flash_of_ceiling\":%.3f}\n",
           info.name, info.compute_capability, flash_runs, (long long)a.S, (long long)a.A, (long long)a.B,
           (long long)a.nh, (long long)a.nkv, (long long)a.d, (long long)a.window, ts.fwd_s * 1e3,
           ts.bwd_s * 1e3, ts.tflops, tf.fwd_s * 1e3, tf.bwd_s * 1e3, tf.tflops,
           a.simt && ts.tflops > 0 ? tf.tflops / ts.tflops : 0, cs.tflops, cf.tflops, ceiling,
           ceiling > 0 ? tf.tflops / ceiling : 0);
    free(slice);
    free(anchors);
    free(keep);
    return 0;
}
