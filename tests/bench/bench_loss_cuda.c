/* bench_loss_cuda.c: figures of the fused, chunked loss on GPU 0 (the CUDA backend's `loss`),
 * with bf16 tensor-core products (the default, the seed's precision) or in fp32, beside three
 * matrix-product ceilings of the same card. Prints, never fails on speed; exits 77
 * ("SKIPPED: no GPU", then a JSON line {"impl":"ddtree-cuda","skipped":"no GPU"}) when libddk
 * has no CUDA or the machine no GPU, 1 when an allocation or the loss fails or a loss is not
 * finite.
 *
 *   bench_loss_cuda [--n N] [--hidden H] [--vocab V] [--chunk C] [--tile T] [--reps R]
 *                   [--kl-weight A] [--cap-weight L] [--bf16 0|1|2] [--ceiling 0|1] [--json]
 *
 * It prints a table, then one JSON line (--json: the JSON line alone).
 *
 * Defaults are the seed's scale: n 24,576 positions, H 5,120, V 248,320, chunk 4,096, and the
 * two memory modes vocab_tile 0 and vocab_tile T = 8,192; kl_weight 0.15, labels the teacher's
 * argmax (labels = NULL), weights all 1. tests/gpu/check.sh runs it on the device machine.
 *
 * --bf16 1 (default) sets ddk_loss_params.bf16_products: the logit and gradient products take
 * their operands rounded to bf16 on the tensor cores (the backend's matmul_bf16, cuBLAS
 * CUBLAS_COMPUTE_32F_FAST_16BF), fp32 accumulation; storage and softmax statistics stay fp32.
 * The JSON's "dtype" says "bf16-products"; --bf16 0 is the all-fp32 loss ("fp32"). --bf16 2
 * ("bf16-head") holds the head W as bf16 (as a GPU's target replica does) and the loss reads it
 * in place (ddk_loss_params.head_bf16, with bf16_products): the hidden states and g are rounded
 * in the backend's scratch panel by panel, bf16 tensor cores (CUBLAS_COMPUTE_32F).
 *
 * What it measures, and how:
 *   - inputs hs, ht (n, H), W (V, H) and grad (n, H) live in device memory from
 *     ddk_malloc(ddk_allocator_cuda(0), ...); they are filled on the host one slice at a time
 *     (SLICE floats) and copied with the backend's copy, so the host never holds more than one
 *     slice. Values are uniform with the standard deviations bench_loss draws normals with
 *     (hs, ht: 1; W: 2 / sqrt(H), logits of std ~2): 1.3e9 Box-Muller draws at the seed's
 *     scale would take longer than the loss;
 *   - time: ddk_cuda_synchronize, then CLOCK_MONOTONIC around the call, then
 *     ddk_cuda_synchronize again (no CUDA events); one warm-up call, then the median (and
 *     minimum) of --reps calls;
 *   - TFLOP/s count the logit-sized products the mode performs, 2 n V H FLOP each: 3 when the
 *     logits are materialised (vocab_tile 0: student and teacher logits, d hs = g W), 5 when
 *     tiled (both logits again in the gradient pass). The softmax statistics are not counted;
 *   - workspace: the CUDA allocator's peak during the calls minus its level before them
 *     (ddk_loss_workspace_bytes is printed beside it);
 *   - the ceilings (--ceiling 1), each the best rate over three products, median of 5 after a
 *     warm-up, timed like the loss: the loss's own product shapes at this chunk (C x V x H with
 *     op(W) transposed, and C x H x V) and one square 8192 product:
 *       fp32:          the backend's matmul (cublasSgemm, never TF32), fp32 operands;
 *       bf16-products: the backend's matmul_bf16 (fp32 operands in memory, rounded to bf16 by
 *                      cuBLAS), what the loss uses with --bf16 1;
 *       bf16-native:   the card's own bf16 GEMM, cublasGemmEx with CUDA_R_16BF A and B, CUDA_R_32F
 *                      C, CUBLAS_COMPUTE_32F, on buffers from cudaMalloc filled with a repeated
 *                      host slice of random bf16 values (built only with DDTREE_BENCH_CUBLAS:
 *                      tests/bench/CMakeLists.txt links cuBLAS and cudart when CUDA is on;
 *                      otherwise the row says "not built").
 *     "of ceiling" is the loss's rate against the bf16-native ceiling with --bf16 1 (the goal:
 *     the loss at >= 60% of the measured bf16 ceiling; bf16-products when native is not built)
 *     and against the fp32 one with --bf16 0.
 *
 * Dimension legend: n positions, H hidden size, V vocabulary, C chunk.
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

#define SLICE ((int64_t)1 << 24)   /* floats per host slice (64 MiB) */
#define MAX_REPS 64
#define CEIL_CASES 3               /* products per ceiling */
#define CEIL_REPS 5                /* timed calls per product, after one warm-up */

typedef struct bench_args {
    int64_t n, hidden, vocab, chunk, tile;
    int reps, json, ceiling, bf16;
    float kl_weight, cap_weight;
} bench_args;

/* the JSON's "dtype" of --bf16 0, 1, 2 */
static const char *dtype_name(int bf16)
{
    return bf16 == 2 ? "bf16-head" : bf16 ? "bf16-products" : "fp32";
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){ .n = 24576, .hidden = 5120, .vocab = 248320, .chunk = 4096, .tile = 8192,
                       .reps = 3, .ceiling = 1, .bf16 = 1, .kl_weight = 0.15f };
    const bench_opt opts[] = {
        { "--n", BENCH_I64, &a->n }, { "--hidden", BENCH_I64, &a->hidden }, { "--vocab", BENCH_I64, &a->vocab },
        { "--chunk", BENCH_I64, &a->chunk }, { "--tile", BENCH_I64, &a->tile }, { "--reps", BENCH_INT, &a->reps },
        { "--kl-weight", BENCH_F32, &a->kl_weight }, { "--cap-weight", BENCH_F32, &a->cap_weight },
        { "--bf16", BENCH_INT, &a->bf16 }, { "--ceiling", BENCH_INT, &a->ceiling }, { "--json", BENCH_SET, &a->json },
    };
    if (bench_parse("bench_loss_cuda", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return -1;
    if (a->n < 1 || a->hidden < 1 || a->vocab < 1 || a->chunk < 1 || a->tile < 1 || a->reps < 1) {
        fprintf(stderr, "bench_loss_cuda: --n, --hidden, --vocab, --chunk, --tile and --reps must be >= 1\n");
        return -1;
    }
    if (a->bf16 < 0 || a->bf16 > 2 || (a->ceiling != 0 && a->ceiling != 1)) {
        fprintf(stderr, "bench_loss_cuda: --bf16 takes 0, 1 or 2 (a bf16 head), --ceiling 0 or 1\n");
        return -1;
    }
    if (a->reps > MAX_REPS)
        a->reps = MAX_REPS;
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

static const ddk_backend *be;
static ddk_allocator *gpu;

static float *dev_alloc(int64_t count, const char *what)
{
    float *p = ddk_malloc(gpu, (size_t)count * sizeof(float));
    if (!p) {
        ddk_alloc_stats s = ddk_allocator_stats(gpu);
        fprintf(stderr, "bench_loss_cuda: cannot allocate %s (%.3f GB) on cuda:0 (%.3f GB live)\n",
                what, (double)count * sizeof(float) / 1e9, s.current / 1e9);
        exit(1);
    }
    return p;
}

/* dst (count) on the GPU := uniform values of standard deviation std, one host slice at a time */
static void fill_device(float *dst, int64_t count, float std, float *slice, uint64_t *rng)
{
    const float half_width = std * 1.7320508f;   /* uniform on [-a, a] has std a / sqrt(3) */
    for (int64_t off = 0; off < count; off += SLICE) {
        int64_t m = count - off < SLICE ? count - off : SLICE;
        for (int64_t i = 0; i < m; i++) {
            uint64_t r = ddk_rng_next(rng);
            slice[i] = half_width * ((float)(r >> 40) * 0x1.0p-23f - 1.0f);
        }
        be->copy(be, dst + off, slice, (size_t)m * sizeof(float));
        ddk_cuda_synchronize(0);   /* the slice is rewritten next: the copy must be done */
    }
}

/* dst (count) bf16 on the GPU := uniform values of standard deviation std rounded to bf16, one host
 * slice at a time (the slice's floats hold twice as many bf16 values) */
static void fill_device_bf16(uint16_t *dst, int64_t count, float std, float *slice, uint64_t *rng)
{
    const float half_width = std * 1.7320508f;
    uint16_t *h = (uint16_t *)(void *)slice;
    for (int64_t off = 0; off < count; off += 2 * SLICE) {
        int64_t m = count - off < 2 * SLICE ? count - off : 2 * SLICE;
        for (int64_t i = 0; i < m; i++)
            h[i] = ddk_f32_to_bf16(half_width * ((float)(ddk_rng_next(rng) >> 40) * 0x1.0p-23f - 1.0f));
        be->copy(be, dst + off, h, (size_t)m * sizeof(uint16_t));
        ddk_cuda_synchronize(0);
    }
}

typedef struct mode_figures {
    int64_t tile;
    double median, min;        /* seconds */
    double flop;               /* counted products, 2 n V H each */
    size_t workspace;          /* allocator peak above the level before the calls */
    int64_t workspace_analytic;
    ddk_loss_result result;
} mode_figures;

/* W (V, H): fp32, or bf16 with --bf16 2 */
static int time_loss(const bench_args *a, int64_t tile, const float *hs, const float *ht,
                     const void *W, float *grad, mode_figures *f)
{
    ddk_loss_params p = { .n = a->n, .hidden = a->hidden, .vocab = a->vocab, .chunk = a->chunk,
                          .vocab_tile = tile, .kl_weight = a->kl_weight, .kl_temperature = 1.0f,
                          .cap_weight = a->cap_weight, .cap_temperature = 1.0f,
                          .bf16_products = a->bf16 != 0, .head_bf16 = a->bf16 == 2 };
    double t[MAX_REPS];
    f->tile = tile;
    f->flop = (tile > 0 && tile < a->vocab ? 5.0 : 3.0) * 2.0 * (double)a->n * a->vocab * a->hidden;
    f->workspace_analytic = ddk_loss_workspace_bytes(&p, 1);
    ddk_cuda_synchronize(0);
    ddk_allocator_trim(gpu);   /* a cached block of the same size would hide the workspace */
    ddk_allocator_reset_peak(gpu);
    size_t base = ddk_allocator_stats(gpu).current;
    int rc = be->loss(be, &p, hs, ht, W, NULL, NULL, grad, NULL, &f->result);   /* warm-up */
    ddk_cuda_synchronize(0);
    for (int r = 0; r < a->reps && rc == 0; r++) {
        double t0 = bench_now_s();
        rc = be->loss(be, &p, hs, ht, W, NULL, NULL, grad, NULL, &f->result);
        ddk_cuda_synchronize(0);
        t[r] = bench_now_s() - t0;
    }
    if (rc) {
        fprintf(stderr, "bench_loss_cuda: the loss (vocab_tile %lld) failed with %d\n", (long long)tile, rc);
        return rc;
    }
    f->workspace = ddk_allocator_stats(gpu).peak - base;
    f->median = bench_median(t, a->reps);   /* sorts t */
    f->min = t[0];
    if (!isfinite(f->result.loss)) {
        fprintf(stderr, "bench_loss_cuda: the loss (vocab_tile %lld) is %g\n", (long long)tile, f->result.loss);
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The ceilings: the best rate of one kind of product over the loss's product shapes and one
 * square 8192 product
 */

typedef struct gemm_case {
    const char *what;
    int trans_b;
    int64_t m, n, k;
    double tflops;
} gemm_case;

typedef struct ceiling {
    const char *key;       /* the JSON's name: fp32, bf16_products, bf16_native */
    const char *what;      /* the text's */
    const char *status;    /* "ok", "not run", "not built", or why it failed */
    gemm_case cases[CEIL_CASES];
    double best;           /* TFLOP/s, 0 unless status is "ok" */
} ceiling;

static void ceiling_shapes(const bench_args *a, ceiling *c)
{
    int64_t ch = a->chunk < a->n ? a->chunk : a->n, H = a->hidden, V = a->vocab, sq = 8192;
    c->cases[0] = (gemm_case){ "C x V x H (logits = h W^T)", 1, ch, V, H, 0 };
    c->cases[1] = (gemm_case){ "C x H x V (d h = g W)", 0, ch, H, V, 0 };
    c->cases[2] = (gemm_case){ "8192 x 8192 x 8192", 0, sq, sq, sq, 0 };
    c->best = 0;
}

/* the backend's matmul (bf16 0) or matmul_bf16 (bf16 1), row-major as the backend takes it */
static double time_gemm(int bf16, int trans_b, int64_t m, int64_t n, int64_t k, const float *A,
                        const float *B, float *C)
{
    double t[CEIL_REPS];
    int64_t ldb = trans_b ? k : n;
    for (int r = -1; r < CEIL_REPS; r++) {   /* r = -1: warm-up */
        ddk_cuda_synchronize(0);
        double t0 = bench_now_s();
        (bf16 ? be->matmul_bf16 : be->matmul)(be, 0, trans_b, m, n, k, 1.0f, A, k, B, ldb, 0.0f, C, n);
        ddk_cuda_synchronize(0);
        if (r >= 0)
            t[r] = bench_now_s() - t0;
    }
    return 2.0 * m * n * k / bench_median(t, CEIL_REPS) / 1e12;
}

/* the fp32 and bf16-products ceilings on the same buffers. W (V, H) is the B of the loss's two
 * shapes; A and C are allocated here, big enough for every case, and filled with random values
 * (never timed on zeros). */
static void backend_ceilings(const bench_args *a, const float *W, float *slice, uint64_t *rng,
                             ceiling *fp32, ceiling *bf16)
{
    int64_t c = a->chunk < a->n ? a->chunk : a->n, H = a->hidden, V = a->vocab, sq = 8192;
    int64_t a_count = c * (V > H ? V : H), c_count = c * (V > H ? V : H);
    if (a_count < sq * sq) a_count = sq * sq;
    if (c_count < sq * sq) c_count = sq * sq;
    float *A = dev_alloc(a_count, "the ceiling's A");
    float *C = dev_alloc(c_count, "the ceiling's C");
    float *B = dev_alloc(sq * sq, "the ceiling's square B");
    fill_device(A, a_count, 1.0f, slice, rng);
    fill_device(B, sq * sq, 1.0f / sqrtf((float)sq), slice, rng);
    ceiling *kinds[2] = { fp32, bf16 };
    for (int kind = 0; kind < 2; kind++) {
        ceiling *ce = kinds[kind];
        if (kind == 1 && !be->matmul_bf16) {
            ce->status = "the backend has no matmul_bf16";
            continue;
        }
        for (int i = 0; i < CEIL_CASES; i++) {
            gemm_case *g = &ce->cases[i];
            g->tflops = time_gemm(kind, g->trans_b, g->m, g->n, g->k, A, i < 2 ? W : B, C);
            if (g->tflops > ce->best)
                ce->best = g->tflops;
        }
        ce->status = "ok";
    }
    ddk_free(gpu, A, (size_t)a_count * sizeof(float));
    ddk_free(gpu, C, (size_t)c_count * sizeof(float));
    ddk_free(gpu, B, (size_t)(sq * sq) * sizeof(float));
    ddk_cuda_synchronize(0);
    ddk_allocator_trim(gpu);   /* give the cached blocks back for the native buffers */
}

#ifdef DDTREE_BENCH_CUBLAS
/* x rounded to the nearest bf16, ties to even (finite x) */
static uint16_t bf16_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* count bf16 values on the GPU from the host slice `h` (hcount values) repeated */
static int fill_bf16(uint16_t *dst, int64_t count, const uint16_t *h, int64_t hcount)
{
    for (int64_t off = 0; off < count; off += hcount) {
        int64_t m = count - off < hcount ? count - off : hcount;
        if (cudaMemcpy(dst + off, h, (size_t)m * sizeof(uint16_t), cudaMemcpyHostToDevice) != cudaSuccess)
            return -1;
    }
    return 0;
}

/* the card's bf16 GEMM: row-major C (m, n) fp32 = A (m, k) bf16 times op(B) bf16 (B (n, k)
 * when trans_b, else (k, n)), fp32 accumulation; cuBLAS is column-major, so it computes
 * C^T = op(B)^T A^T. Returns TFLOP/s, or -1 with *err set. */
static double time_gemm_native(cublasHandle_t h, int trans_b, int64_t m, int64_t n, int64_t k,
                               const uint16_t *A, const uint16_t *B, float *C, const char **err)
{
    double t[CEIL_REPS];
    const float one = 1.0f, zero = 0.0f;
    int64_t ldb = trans_b ? k : n;
    for (int r = -1; r < CEIL_REPS; r++) {   /* r = -1: warm-up */
        cudaDeviceSynchronize();
        double t0 = bench_now_s();
        cublasStatus_t st = cublasGemmEx(h, trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)m,
                                         (int)k, &one, B, CUDA_R_16BF, (int)ldb, A, CUDA_R_16BF, (int)k, &zero,
                                         C, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        cudaError_t ce = cudaDeviceSynchronize();
        if (st != CUBLAS_STATUS_SUCCESS || ce != cudaSuccess) {
            *err = st != CUBLAS_STATUS_SUCCESS ? "cublasGemmEx failed" : cudaGetErrorString(ce);
            return -1;
        }
        if (r >= 0)
            t[r] = bench_now_s() - t0;
    }
    return 2.0 * m * n * k / bench_median(t, CEIL_REPS) / 1e12;
}

static void native_ceiling(const bench_args *a, float *slice, uint64_t *rng, ceiling *ce)
{
    int64_t c = a->chunk < a->n ? a->chunk : a->n, H = a->hidden, V = a->vocab, sq = 8192;
    int64_t a_count = c * (V > H ? V : H), b_count = V * H, c_count = c * (V > H ? V : H);
    if (a_count < sq * sq) a_count = sq * sq;
    if (b_count < sq * sq) b_count = sq * sq;
    if (c_count < sq * sq) c_count = sq * sq;
    /* the host slice, as 2 SLICE bf16 values uniform on [-1, 1] */
    uint16_t *h = (uint16_t *)(void *)slice;
    const int64_t hcount = 2 * SLICE;
    for (int64_t i = 0; i < hcount; i++)
        h[i] = bf16_bits((float)(ddk_rng_next(rng) >> 40) * 0x1.0p-23f - 1.0f);
    uint16_t *A = NULL, *B = NULL;
    float *C = NULL;
    cublasHandle_t handle = NULL;
    ce->status = "cudaMalloc failed";
    if (cudaMalloc((void **)&A, (size_t)a_count * sizeof(uint16_t)) != cudaSuccess ||
        cudaMalloc((void **)&B, (size_t)b_count * sizeof(uint16_t)) != cudaSuccess ||
        cudaMalloc((void **)&C, (size_t)c_count * sizeof(float)) != cudaSuccess)
        goto done;
    ce->status = "cudaMemcpy failed";
    if (fill_bf16(A, a_count, h, hcount) || fill_bf16(B, b_count, h, hcount))
        goto done;
    ce->status = "cublasCreate failed";
    if (cublasCreate(&handle) != CUBLAS_STATUS_SUCCESS) {
        handle = NULL;
        goto done;
    }
    for (int i = 0; i < CEIL_CASES; i++) {
        gemm_case *g = &ce->cases[i];
        const char *err = NULL;
        g->tflops = time_gemm_native(handle, g->trans_b, g->m, g->n, g->k, A, B, C, &err);
        if (g->tflops < 0) {
            ce->status = err;
            ce->best = 0;
            goto done;
        }
        if (g->tflops > ce->best)
            ce->best = g->tflops;
    }
    ce->status = "ok";
done:
    if (strcmp(ce->status, "ok"))
        fprintf(stderr, "bench_loss_cuda: the native bf16 ceiling: %s\n", ce->status);
    if (handle)
        cublasDestroy(handle);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
    cudaGetLastError();   /* a failed allocation must not stick to later calls */
}
#endif

static void print_ceiling_text(const ceiling *ce)
{
    printf("    %-15s %s: ", ce->key, ce->what);
    if (strcmp(ce->status, "ok")) {
        printf("%s\n", ce->status);
        return;
    }
    printf("best %.1f TFLOP/s\n", ce->best);
    for (int i = 0; i < CEIL_CASES; i++)
        printf("      %-28s %6lld x %6lld x %6lld  %7.1f TFLOP/s\n", ce->cases[i].what, (long long)ce->cases[i].m,
               (long long)ce->cases[i].n, (long long)ce->cases[i].k, ce->cases[i].tflops);
}

static void print_ceiling_json(const ceiling *ce)
{
    printf(",\"ceiling_%s_tflops\":%.3f,\"ceiling_%s_status\":\"%s\",\"ceiling_%s_cases\":[", ce->key, ce->best,
           ce->key, ce->status, ce->key);
    for (int i = 0; !strcmp(ce->status, "ok") && i < CEIL_CASES; i++)
        printf("%s{\"m\":%lld,\"n\":%lld,\"k\":%lld,\"trans_b\":%d,\"tflops\":%.3f}", i ? "," : "",
               (long long)ce->cases[i].m, (long long)ce->cases[i].n, (long long)ce->cases[i].k,
               ce->cases[i].trans_b, ce->cases[i].tflops);
    printf("]");
}

/* ------------------------------------------------------------------------------------------ */

int main(int argc, char **argv)
{
    bench_args a;
    if (parse_args(argc, argv, &a))
        return 2;
    if (!ddk_has_cuda() || ddk_cuda_device_count() == 0) {
        printf("SKIPPED: no GPU (%s)\n", ddk_has_cuda() ? "none visible" : "libddk built without CUDA");
        printf("{\"impl\":\"ddtree-cuda\",\"skipped\":\"no GPU\",\"dtype\":\"%s\"}\n", dtype_name(a.bf16));
        return 77;
    }
    be = ddk_backend_cuda(0);
    gpu = ddk_allocator_cuda(0);
    if (!be || !gpu || !be->loss || !be->matmul || !be->copy || (a.bf16 && !be->matmul_bf16)) {
        fprintf(stderr, "bench_loss_cuda: the CUDA backend of GPU 0 is missing or incomplete\n");
        return 1;
    }
    ddk_device_info info;
    memset(&info, 0, sizeof info);
    if (ddk_cuda_device_info(0, &info) != 0)
        snprintf(info.name, sizeof info.name, "cuda:0");
    const char *dtype = dtype_name(a.bf16);

    int64_t n = a.n, H = a.hidden, V = a.vocab;
    float *slice = malloc((size_t)SLICE * sizeof(float));
    if (!slice) {
        fprintf(stderr, "bench_loss_cuda: out of host memory for one slice\n");
        return 1;
    }
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    double t_fill = bench_now_s();
    float *hs = dev_alloc(n * H, "hs");       /* (n, H) */
    float *ht = dev_alloc(n * H, "ht");       /* (n, H) */
    float *W = dev_alloc(V * H, "W");         /* (V, H) */
    float *grad = dev_alloc(n * H, "grad");   /* (n, H) */
    fill_device(hs, n * H, 1.0f, slice, &rng);
    fill_device(ht, n * H, 1.0f, slice, &rng);
    fill_device(W, V * H, 2.0f / sqrtf((float)H), slice, &rng);
    uint16_t *W16 = NULL;   /* (V, H) bf16, --bf16 2 */
    if (a.bf16 == 2) {
        W16 = ddk_malloc(gpu, (size_t)(V * H) * sizeof(uint16_t));
        if (!W16) {
            fprintf(stderr, "bench_loss_cuda: cannot allocate the bf16 head (%.3f GB) on cuda:0\n", V * H * 2.0 / 1e9);
            return 1;
        }
        fill_device_bf16(W16, V * H, 2.0f / sqrtf((float)H), slice, &rng);
    }
    const void *head = W16 ? (const void *)W16 : W;
    t_fill = bench_now_s() - t_fill;
    size_t inputs_bytes = ddk_allocator_stats(gpu).current;

    mode_figures m[2];
    if (time_loss(&a, 0, hs, ht, head, grad, &m[0]) || time_loss(&a, a.tile, hs, ht, head, grad, &m[1]))
        return 1;

    ceiling ceil_fp32 = { .key = "fp32", .what = "the backend's matmul (cublasSgemm, no TF32)", .status = "not run" };
    ceiling ceil_bf16 = { .key = "bf16_products", .status = "not run",
                          .what = "the backend's matmul_bf16 (fp32 in memory, COMPUTE_32F_FAST_16BF)" };
    ceiling ceil_native = { .key = "bf16_native", .what = "cublasGemmEx, bf16 A and B, fp32 C, COMPUTE_32F",
                            .status = "not run" };
    ceiling_shapes(&a, &ceil_fp32);
    ceiling_shapes(&a, &ceil_bf16);
    ceiling_shapes(&a, &ceil_native);
    if (a.ceiling) {
        backend_ceilings(&a, W, slice, &rng, &ceil_fp32, &ceil_bf16);
#ifdef DDTREE_BENCH_CUBLAS
        native_ceiling(&a, slice, &rng, &ceil_native);
#else
        ceil_native.status = "not built";
#endif
    }
    /* the reference of "of ceiling": the native bf16 GEMM for bf16 products (the goal),
     * the backend's matmul_bf16 when that is all there is; fp32 for the fp32 loss */
    const ceiling *ref = NULL;
    if (!a.bf16 && ceil_fp32.best > 0)
        ref = &ceil_fp32;
    else if (a.bf16 && ceil_native.best > 0)
        ref = &ceil_native;
    else if (a.bf16 && ceil_bf16.best > 0)
        ref = &ceil_bf16;
    double rel = fabs(m[0].result.loss - m[1].result.loss) / fmax(fabs(m[0].result.loss), 1e-30);

    if (!a.json) {
        printf("CUDA loss benchmark on cuda:0 %s (sm_%d): n %lld, H %lld, V %lld, chunk %lld, "
               "kl_weight %.3g, cap_weight %.3g, labels the teacher's argmax, %s, median of %d\n",
               info.name, info.compute_capability, (long long)n, (long long)H, (long long)V,
               (long long)a.chunk, a.kl_weight, a.cap_weight,
               a.bf16 == 2 ? "a bf16 head read in place, bf16 products (fp32 accumulation and statistics)"
               : a.bf16 ? "bf16 products (operands rounded to bf16, fp32 accumulation and statistics)" : "fp32",
               a.reps);
        printf("  inputs %.2f GB on the GPU, filled in %.1f s (host slices of %lld MB)\n",
               inputs_bytes / 1e9, t_fill, (long long)(SLICE * 4 >> 20));
        printf("  %-16s %9s %9s %9s %9s %13s %13s %11s\n", "mode", "median s", "min s", "products",
               "TFLOP/s*", "workspace GB", "analytic GB", "of ceiling");
        for (int i = 0; i < 2; i++) {
            char name[32];
            snprintf(name, sizeof name, "vocab_tile %lld", (long long)m[i].tile);
            double tf = m[i].flop / m[i].median / 1e12;
            char frac[16] = "-";
            if (ref)
                snprintf(frac, sizeof frac, "%.0f%%", 100.0 * tf / ref->best);
            printf("  %-16s %9.3f %9.3f %9.0f %9.1f %13.3f %13.3f %11s\n", name, m[i].median, m[i].min,
                   m[i].flop / (2.0 * n * V * H), tf, m[i].workspace / 1e9, m[i].workspace_analytic / 1e9, frac);
        }
        printf("  * 2 n V H FLOP per logit-sized product the mode performs (3 materialised, 5 tiled);\n"
               "    softmax statistics not counted. loss %.6f (tile 0) vs %.6f (tile %lld): rel. diff %.2e\n",
               m[0].result.loss, m[1].result.loss, (long long)a.tile, rel);
        if (a.ceiling) {
            printf("  matmul ceilings, best of the loss's product shapes and 8192^3, median of %d each:\n",
                   CEIL_REPS);
            print_ceiling_text(&ceil_fp32);
            print_ceiling_text(&ceil_bf16);
            print_ceiling_text(&ceil_native);
            if (ref)
                printf("  \"of ceiling\" is against %s (%.1f TFLOP/s)\n", ref->key, ref->best);
            else
                printf("  \"of ceiling\": no %s ceiling measured\n", a.bf16 ? "bf16" : "fp32");
        }
    }

    printf("{\"impl\":\"ddtree-cuda\",\"device\":\"%s\",\"sm\":%d,\"dtype\":\"%s\",\"bf16_products\":%d,\"head_bf16\":%d,"
           "\"n\":%lld,\"hidden\":%lld,\"vocab\":%lld,\"chunk\":%lld,\"tile\":%lld,\"reps\":%d,"
           "\"kl_weight\":%.9g,\"cap_weight\":%.9g,\"inputs_bytes\":%zu,\"fill_seconds\":%.3f",
           info.name, info.compute_capability, dtype, a.bf16 != 0, a.bf16 == 2, (long long)n, (long long)H, (long long)V,
           (long long)a.chunk, (long long)a.tile, a.reps, a.kl_weight, a.cap_weight, inputs_bytes, t_fill);
    for (int i = 0; i < 2; i++) {
        const double tf = m[i].flop / m[i].median / 1e12;
        printf(",\"%s\":{\"vocab_tile\":%lld,\"seconds_median\":%.6f,\"seconds_min\":%.6f,"
               "\"products\":%.0f,\"tflops\":%.3f,\"workspace_bytes\":%zu,\"workspace_analytic_bytes\":%lld,"
               "\"loss\":%.9g,\"ce\":%.9g,\"kl\":%.9g,\"of_ceiling\":",
               i ? "tiled" : "full", (long long)m[i].tile, m[i].median, m[i].min,
               m[i].flop / (2.0 * n * V * H), tf, m[i].workspace,
               (long long)m[i].workspace_analytic, m[i].result.loss, m[i].result.ce, m[i].result.kl);
        if (ref)
            printf("%.4f}", tf / ref->best);
        else
            printf("null}");
    }
    printf(",\"loss_rel_diff\":%.3e,\"ceiling_reference\":\"%s\",\"ceiling_reference_tflops\":%.3f", rel,
           ref ? ref->key : "none", ref ? ref->best : 0.0);
    print_ceiling_json(&ceil_fp32);
    print_ceiling_json(&ceil_bf16);
    print_ceiling_json(&ceil_native);
    printf("}\n");

    ddk_free(gpu, hs, (size_t)(n * H) * sizeof(float));
    ddk_free(gpu, ht, (size_t)(n * H) * sizeof(float));
    ddk_free(gpu, W, (size_t)(V * H) * sizeof(float));
    ddk_free(gpu, W16, (size_t)(V * H) * sizeof(uint16_t));
    ddk_free(gpu, grad, (size_t)(n * H) * sizeof(float));
    free(slice);
    return 0;
}
