/* bench_qwen35.c: the qwen3_5 target's CPU prefill (tokens per second) and one decode step
 * after it (milliseconds), on a seeded random model of the given shape built in memory (no
 * checkpoint), and the share of the prefill spent in the DeltaNet core (backend gated_delta),
 * the matrix products (backend matmul) and the causal attention. Prints figures, never fails
 * on speed.
 *
 *   bench_qwen35 [--hidden 1024] [--layers 8] [--interval 4] [--heads 8] [--kv-heads 2]
 *                [--head-dim 128] [--key-heads 4] [--value-heads 8] [--key-dim 128]
 *                [--value-dim 128] [--conv 4] [--intermediate 3072] [--vocab 32000]
 *                [--tokens 2048] [--threads 1] [--reps 3] [--decode-steps 16] [--json]
 *
 * Layers l with (l + 1) % interval == 0 are full attention, the others Gated DeltaNet;
 * partial_rotary_factor 0.25, rope_theta 1e7. The prefill (ddt_qwen35_forward, no taps, the
 * final hidden state, no logits) is timed as the median of --reps after a warm-up; then one
 * more prefill runs through a copy of the CPU backend whose gated_delta, matmul and
 * causal_attention are wrapped in a clock (the shares; that run is not in the median). The
 * decode step: ddt_target_decode (no logits) after a cache prefill of --tokens, the median of
 * --decode-steps. tests/bench/qwen35_vs_torch.py runs it beside tests/bench/qwen35_torch_peer.py.
 *
 * --cuda: the same on cuda:0 with the weights resident in bf16 (ddt_target_options), each
 * timing between synchronize calls, no shares (the device's ops are asynchronous); adds the
 * prefill's TFLOP/s (target_footprint.c's count: 2 T per layer weight plus the causal
 * attention) and the product ceiling: matmul_w16 of (T, H) against (I, H), the layer's largest.
 * The GPU check runs it at the Qwen3.6-27B shape beside tests/gpu/target_transformers_gpu.py.
 */
#include "bench_util.h"
#include "ddk_bf16.h"
#include "run/planner.h"
#include "ddk_rng.h"
#include "model/target.h"
#include "model/target_qwen35.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const ddk_backend *base;
static double t_delta, t_matmul, t_attn;

static int timed_delta(const ddk_backend *be, const ddk_delta_shape *shape, const float *q, const float *k,
                       const float *v, const float *beta, const float *g, float *state, float *out)
{
    (void)be;
    double t0 = bench_now_s();
    int rc = base->gated_delta(base, shape, q, k, v, beta, g, state, out);
    t_delta += bench_now_s() - t0;
    return rc;
}

static void timed_matmul(const ddk_backend *be, int ta, int tb, int64_t m, int64_t n, int64_t k, float alpha,
                         const float *a, int64_t lda, const float *b, int64_t ldb, float beta, float *c,
                         int64_t ldc)
{
    (void)be;
    double t0 = bench_now_s();
    base->matmul(base, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    t_matmul += bench_now_s() - t0;
}

static int timed_attention(const ddk_backend *be, const ddk_attention_shape *shape, const float *q,
                           const float *k, const float *v, float *out)
{
    (void)be;
    double t0 = bench_now_s();
    int rc = base->causal_attention(base, shape, q, k, v, out);
    t_attn += bench_now_s() - t0;
    return rc;
}

/* TFLOP/s of matmul_w16 of (T, H) fp32 against (I, H) bf16 on be, the median of 5 after a warm-up */
static double ceiling_tflops(const ddk_backend *be, int64_t T, int64_t H, int64_t I)
{
    float *a = ddk_malloc(be->alloc, (size_t)(T * H) * sizeof(float)), *c = ddk_malloc(be->alloc, (size_t)(T * I) * sizeof(float));
    uint16_t *w = ddk_malloc(be->alloc, (size_t)(I * H) * sizeof(uint16_t));
    if (!a || !c || !w)
        return 0.0;
    be->zero(be, a, (size_t)(T * H) * sizeof(float));
    be->zero(be, w, (size_t)(I * H) * sizeof(uint16_t));
    double t[5];
    for (int k = -1; k < 5; k++) {
        be->synchronize(be);
        double t0 = bench_now_s();
        be->matmul_w16(be, T, I, H, 1.0f, a, H, w, H, 0.0f, c, I);
        be->synchronize(be);
        if (k >= 0)
            t[k] = bench_now_s() - t0;
    }
    ddk_free(be->alloc, a, (size_t)(T * H) * sizeof(float));
    ddk_free(be->alloc, c, (size_t)(T * I) * sizeof(float));
    ddk_free(be->alloc, w, (size_t)(I * H) * sizeof(uint16_t));
    return 2.0 * (double)T * (double)H * (double)I / bench_median(t, 5) / 1e12;
}

int main(int argc, char **argv)
{
    int64_t H = 1024, layers = 8, interval = 4, nh = 8, nkv = 2, hd = 128, nk = 4, nv = 8, dk = 128, dv = 128,
            K = 4, I = 3072, V = 32000, T = 2048, threads = 1, reps = 3, steps = 16;
    int json = 0, cuda = 0;
    const bench_opt opts[] = {
        { "--cuda", BENCH_SET, &cuda },
        { "--hidden", BENCH_I64, &H }, { "--layers", BENCH_I64, &layers }, { "--interval", BENCH_I64, &interval },
        { "--heads", BENCH_I64, &nh }, { "--kv-heads", BENCH_I64, &nkv }, { "--head-dim", BENCH_I64, &hd },
        { "--key-heads", BENCH_I64, &nk }, { "--value-heads", BENCH_I64, &nv }, { "--key-dim", BENCH_I64, &dk },
        { "--value-dim", BENCH_I64, &dv }, { "--conv", BENCH_I64, &K }, { "--intermediate", BENCH_I64, &I },
        { "--vocab", BENCH_I64, &V }, { "--tokens", BENCH_I64, &T }, { "--threads", BENCH_I64, &threads },
        { "--reps", BENCH_I64, &reps }, { "--decode-steps", BENCH_I64, &steps }, { "--json", BENCH_SET, &json },
    };
    if (bench_parse("bench_qwen35", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return 2;
    if (reps < 1 || reps > 64 || steps < 1 || steps > 64 || T < 1 || layers < 1 || layers > DDT_MAX_TARGET_LAYERS ||
        interval < 1 || nkv < 1 || nh % nkv || nk < 1 || nv % nk || K < 2 || V < 1) {
        fprintf(stderr, "bench_qwen35: a bad shape (reps / decode-steps in [1, 64], nh %% nkv = 0, nv %% nk = 0, "
                "conv >= 2, layers <= %d)\n", DDT_MAX_TARGET_LAYERS);
        return 2;
    }
    ddt_qwen35_config c = { .hidden = H, .layers = layers, .intermediate = I, .vocab = V, .heads = nh,
                            .kv_heads = nkv, .head_dim = hd, .key_heads = nk, .value_heads = nv,
                            .key_head_dim = dk, .value_head_dim = dv, .conv_kernel = K,
                            .rotary_dim = (int64_t)(hd * 0.25), .rms_norm_eps = 1e-6f, .rope_theta = 1e7f,
                            .partial_rotary_factor = 0.25f, .tie_word_embeddings = 1 };
    for (int64_t l = 0; l < layers; l++)
        c.full_attention[l] = (l + 1) % interval == 0;
    ddk_cpu_set_threads((int)threads);
    base = cuda ? ddk_backend_cuda(0) : ddk_backend_cpu();
    if (!base) {
        fprintf(stderr, "bench_qwen35: SKIPPED: no GPU (cuda:0)\n");
        return 77;
    }
    const ddt_target_options o = { .be = base, .bf16 = cuda };
    ddt_target_model m;
    char err[512];
    if (ddt_qwen35_open_synthetic(&c, 1, &o, &m, err, sizeof err)) {
        fprintf(stderr, "bench_qwen35: %s\n", err);
        return 1;
    }
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    int32_t *tokens = malloc((size_t)(T + steps) * sizeof(int32_t));
    float *host_final = malloc((size_t)(T * H) * sizeof(float));
    float *final = cuda ? ddk_malloc(base->alloc, (size_t)(T * H) * sizeof(float)) : host_final;
    if (!tokens || !host_final || !final) {
        fprintf(stderr, "bench_qwen35: no memory for %lld tokens' hidden states\n", (long long)T);
        return 1;
    }
    for (int64_t i = 0; i < T + steps; i++)
        tokens[i] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);

    double pt[64], dt[64];
    for (int64_t k = -1; k < reps; k++) {   /* k = -1: warm-up */
        base->synchronize(base);
        double t0 = bench_now_s();
        int rc = ddt_target_prefill(base, &m, tokens, T, NULL, 0, NULL, final, NULL);
        base->synchronize(base);
        if (rc) {
            fprintf(stderr, "bench_qwen35: the prefill failed (%d)\n", rc);
            return 1;
        }
        if (k >= 0)
            pt[k] = bench_now_s() - t0;
    }
    base->copy(base, host_final, final, (size_t)(T * H) * sizeof(float));
    double check = 0.0;
    for (int64_t i = 0; i < T * H; i++)
        check += (double)host_final[i] * host_final[i];
    double profiled = 0.0;
    if (!cuda) {   /* the shares: the CPU's ops wrapped in a clock */
        ddk_backend timed = *base;
        timed.gated_delta = timed_delta, timed.matmul = timed_matmul, timed.causal_attention = timed_attention;
        double t0 = bench_now_s();
        ddt_target_prefill(&timed, &m, tokens, T, NULL, 0, NULL, final, NULL);
        profiled = bench_now_s() - t0;
    }

    ddt_target_cache cache;
    if (ddt_target_cache_open(base, &m, T + steps, 1, &cache, err, sizeof err)) {
        fprintf(stderr, "bench_qwen35: %s\n", err);
        return 1;
    }
    if (ddt_target_extend(&cache, tokens, T, NULL, 0, NULL, NULL, NULL)) {
        fprintf(stderr, "bench_qwen35: the cache prefill failed\n");
        return 1;
    }
    for (int64_t s = 0; s < steps; s++) {
        base->synchronize(base);
        double d0 = bench_now_s();
        if (ddt_target_decode(&cache, tokens[T + s], NULL, 0, NULL, final, NULL)) {
            fprintf(stderr, "bench_qwen35: the decode step failed\n");
            return 1;
        }
        base->synchronize(base);
        dt[s] = bench_now_s() - d0;
    }
    ddt_target_cache_close(&cache);
    const double med = bench_median(pt, (int)reps), dmed = bench_median(dt, (int)steps);
    if (cuda) {
        ddt_target_footprint f;
        if (ddt_target_footprint_qwen35(&c, 2, T, &f)) {
            fprintf(stderr, "bench_qwen35: no memory to count the weights\n");
            return 1;
        }
        const double ceiling = ceiling_tflops(base, T, H, I);
        printf("{\"impl\":\"ddtree-cuda-target\",\"layers\":%lld,\"tokens\":%lld,\"prefill_s\":%.6f,\"tokens_per_s\":%.1f,"
               "\"tflops\":%.2f,\"ceiling_tflops\":%.2f,\"prefill_s_64_layers\":%.4f,\"decode_ms\":%.4f,"
               "\"weight_bytes\":%lld,\"peak_bytes\":%zu,\"final_sumsq\":%.6g}\n",
               (long long)layers, (long long)T, med, T / med, f.prefill_flops / med / 1e12, ceiling,
               med * 64 / (double)layers, dmed * 1e3, (long long)f.stored_weight_bytes,
               ddk_allocator_stats(base->alloc).peak, check);
    } else if (json) {
        const double sd = t_delta / profiled, sm = t_matmul / profiled, sa = t_attn / profiled;
        printf("{\"impl\":\"ddtree\",\"tokens\":%lld,\"threads\":%lld,\"prefill_s\":%.6f,\"tokens_per_s\":%.1f,"
               "\"decode_ms\":%.4f,\"delta_share\":%.4f,\"matmul_share\":%.4f,\"attention_share\":%.4f,"
               "\"profiled_s\":%.6f,\"final_sumsq\":%.6g}\n",
               (long long)T, (long long)threads, med, T / med, dmed * 1e3, sd, sm, sa, profiled, check);
    } else {
        const double sd = t_delta / profiled, sm = t_matmul / profiled, sa = t_attn / profiled;
        printf("qwen3_5 prefill: H %lld, %lld layers (every %lld full), I %lld, T %lld, %lld thread(s): "
               "%.3f s, %.0f tokens/s; decode step %.2f ms; prefill shares: gated_delta %.1f%%, matmul %.1f%%, "
               "attention %.1f%%, rest %.1f%%\n", (long long)H, (long long)layers, (long long)interval,
               (long long)I, (long long)T, (long long)threads, med, T / med, dmed * 1e3, 100 * sd, 100 * sm,
               100 * sa, 100 * (1 - sd - sm - sa));
    }
    if (cuda)
        ddk_free(base->alloc, final, (size_t)(T * H) * sizeof(float));
    ddt_target_close(&m);
    free(tokens);
    free(host_final);
    return 0;
}
