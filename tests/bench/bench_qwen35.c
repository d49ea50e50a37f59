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
 */
#include "bench_util.h"
#include "ddk_rng.h"
#include "target.h"
#include "target_qwen35.h"

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

int main(int argc, char **argv)
{
    int64_t H = 1024, layers = 8, interval = 4, nh = 8, nkv = 2, hd = 128, nk = 4, nv = 8, dk = 128, dv = 128,
            K = 4, I = 3072, V = 32000, T = 2048, threads = 1, reps = 3, steps = 16;
    int json = 0;
    const bench_opt opts[] = {
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
    ddt_target_model m;
    if (ddt_qwen35_open_synthetic(&c, 1, &m)) {
        fprintf(stderr, "bench_qwen35: no memory for the model\n");
        return 1;
    }
    const ddt_qwen35 *t = m.impl;
    base = ddk_backend_cpu();
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    int32_t *tokens = malloc((size_t)(T + steps) * sizeof(int32_t));
    float *final = malloc((size_t)(T * H) * sizeof(float));
    for (int64_t i = 0; i < T + steps; i++)
        tokens[i] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)V);

    double pt[64], dt[64];
    for (int64_t k = -1; k < reps; k++) {   /* k = -1: warm-up */
        double t0 = bench_now_s();
        int rc = ddt_qwen35_forward(base, t, tokens, T, NULL, 0, NULL, final);
        if (rc) {
            fprintf(stderr, "bench_qwen35: the prefill failed (%d)\n", rc);
            return 1;
        }
        if (k >= 0)
            pt[k] = bench_now_s() - t0;
    }
    double check = 0.0;
    for (int64_t i = 0; i < T * H; i++)
        check += (double)final[i] * final[i];
    ddk_backend timed = *base;
    timed.gated_delta = timed_delta, timed.matmul = timed_matmul, timed.causal_attention = timed_attention;
    double t0 = bench_now_s();
    ddt_qwen35_forward(&timed, t, tokens, T, NULL, 0, NULL, final);
    const double profiled = bench_now_s() - t0;

    char err[256];
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
        double d0 = bench_now_s();
        if (ddt_target_decode(&cache, tokens[T + s], NULL, 0, NULL, final, NULL)) {
            fprintf(stderr, "bench_qwen35: the decode step failed\n");
            return 1;
        }
        dt[s] = bench_now_s() - d0;
    }
    ddt_target_cache_close(&cache);
    const double med = bench_median(pt, (int)reps), dmed = bench_median(dt, (int)steps);
    const double sd = t_delta / profiled, sm = t_matmul / profiled, sa = t_attn / profiled;
    if (json)
        printf("{\"impl\":\"ddtree\",\"tokens\":%lld,\"threads\":%lld,\"prefill_s\":%.6f,\"tokens_per_s\":%.1f,"
               "\"decode_ms\":%.4f,\"delta_share\":%.4f,\"matmul_share\":%.4f,\"attention_share\":%.4f,"
               "\"profiled_s\":%.6f,\"final_sumsq\":%.6g}\n",
               (long long)T, (long long)threads, med, T / med, dmed * 1e3, sd, sm, sa, profiled, check);
    else
        printf("qwen3_5 prefill: H %lld, %lld layers (every %lld full), I %lld, T %lld, %lld thread(s): "
               "%.3f s, %.0f tokens/s; decode step %.2f ms; prefill shares: gated_delta %.1f%%, matmul %.1f%%, "
               "attention %.1f%%, rest %.1f%%\n", (long long)H, (long long)layers, (long long)interval,
               (long long)I, (long long)T, (long long)threads, med, T / med, dmed * 1e3, 100 * sd, 100 * sm,
               100 * sa, 100 * (1 - sd - sm - sa));
    ddt_target_close(&m);
    free(tokens);
    free(final);
    return 0;
}
