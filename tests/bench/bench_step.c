/* bench_step.c: positions per second of one drafter training step (forward + loss + backward)
 * on the CPU backend, and its peak memory. Prints figures, never fails on speed.
 *
 *   bench_step [--hidden 256] [--layers 2] [--heads 8] [--kv-heads 8] [--head-dim 32]
 *              [--intermediate 768] [--block 16] [--anchors 64] [--seq 512] [--vocab 8192]
 *              [--nseq 1] [--taps 2] [--window 0] [--threads 1] [--reps 3] [--json]
 *              [--dflash2 [--rank 256] [--top-k 16] [--group 16]]
 *
 * Weights from ddt_drafter_init, inputs random (features N(0, 1), tokens uniform, anchors
 * evenly spread), ce_target "teacher", kl_weight 0.15 (the seed's loss); --dflash2: a DFlash2 drafter
 * (SPEC.md 2.1: two-tap convolutions, the selector's term, alpha_sel 1) of the same shape, its
 * convolutions and Bs away from their identity / zero start. tests/bench/
 * step_vs_torch.py runs it beside a PyTorch float32 autograd step of the same shapes.
 */
#include "bench_util.h"
#include "ddk_rng.h"
#include "model/drafter.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static uint64_t rng = 0x2545F4914F6CDD1Dull;   /* ddk_rng.h */
int main(int argc, char **argv)
{
    int64_t hidden = 256, layers = 2, heads = 8, kv_heads = 8, head_dim = 32, inter = 768,
            block = 16, anchors = 64, seq = 512, vocab = 8192, nseq = 1, taps = 2, window = 0,
            threads = 1, reps = 3, rank = 256, top_k = 16, group = 16;
    int json = 0, dflash2 = 0;
    const bench_opt opts[] = {
        { "--hidden", BENCH_I64, &hidden }, { "--layers", BENCH_I64, &layers }, { "--heads", BENCH_I64, &heads },
        { "--kv-heads", BENCH_I64, &kv_heads }, { "--head-dim", BENCH_I64, &head_dim },
        { "--intermediate", BENCH_I64, &inter }, { "--block", BENCH_I64, &block },
        { "--anchors", BENCH_I64, &anchors }, { "--seq", BENCH_I64, &seq }, { "--vocab", BENCH_I64, &vocab },
        { "--nseq", BENCH_I64, &nseq }, { "--taps", BENCH_I64, &taps }, { "--window", BENCH_I64, &window },
        { "--threads", BENCH_I64, &threads }, { "--reps", BENCH_I64, &reps }, { "--json", BENCH_SET, &json },
        { "--dflash2", BENCH_SET, &dflash2 }, { "--rank", BENCH_I64, &rank }, { "--top-k", BENCH_I64, &top_k },
        { "--group", BENCH_I64, &group },
    };
    if (bench_parse("bench_step", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return 2;
    if (reps < 1 || reps > 64 || anchors * block > seq * 64) {
        fprintf(stderr, "bench_step: --reps must be in [1, 64]\n");
        return 2;
    }

    ddt_drafter_config c = { .hidden = hidden, .layers = layers, .heads = heads, .kv_heads = kv_heads,
                             .head_dim = head_dim, .intermediate = inter, .vocab = vocab,
                             .block_size = block, .sliding_window = window, .rms_norm_eps = 1e-6f,
                             .rope_theta = 10000.0f, .taps = taps, .mask_token_id = (int32_t)(vocab - 1),
                             .dflash2 = dflash2, .conv_taps = dflash2 ? 2 : 0, .conv_group_size = dflash2 ? group : 0,
                             .selector_rank = dflash2 ? rank : 0, .selector_top_k = dflash2 ? top_k : 0 };
    for (int64_t l = 0; l < layers; l++)
        c.sliding[l] = window > 0 && l + 1 < layers;   /* the seed's shape: sliding, then full */
    for (int64_t i = 0; i < taps; i++)
        c.target_layer_ids[i] = (int32_t)i;
    char err[512];
    if (ddt_drafter_config_check(&c, err, sizeof err)) {
        fprintf(stderr, "bench_step: %s\n", err);
        return 2;
    }
    ddk_cpu_set_threads((int)threads);

    static ddt_param params[DDT_MAX_PARAMS];
    int64_t total;
    const int count = ddt_drafter_param_table(&c, params, &total);
    float *weights = malloc((size_t)total * sizeof(float)), *grads = malloc((size_t)total * sizeof(float));
    ddt_drafter_init(&c, weights, 1);
    for (int i = 0; i < count; i++)
        if (params[i].init == DDT_INIT_ZERO || params[i].init == DDT_INIT_IDENTITY)   /* DFlash2's starts */
            for (int64_t j = 0; j < params[i].numel; j++)
                weights[params[i].offset + j] += (float)(0.02 * ddk_rng_normal(&rng));
    ddt_drafter_weights w, g;
    ddt_drafter_bind(&c, weights, &w);
    ddt_drafter_bind(&c, grads, &g);

    const int64_t H = hidden, S = seq, A = anchors;
    float *embed = malloc((size_t)(vocab * H) * sizeof(float));      /* (V, H) */
    float *head = malloc((size_t)(vocab * H) * sizeof(float));       /* (V, H) */
    float *features = malloc((size_t)(nseq * S * taps * H) * sizeof(float));
    float *teacher = malloc((size_t)(nseq * S * H) * sizeof(float));
    int32_t *ids = malloc((size_t)(nseq * S) * sizeof(int32_t));
    uint8_t *mask = malloc((size_t)(nseq * S));
    int32_t *anchor = malloc((size_t)(nseq * A) * sizeof(int32_t));
    uint8_t *keep = malloc((size_t)(nseq * A));
    for (int64_t i = 0; i < vocab * H; i++) {
        embed[i] = (float)ddk_rng_normal(&rng);
        head[i] = (float)ddk_rng_normal(&rng) / sqrtf((float)H);
    }
    for (int64_t i = 0; i < nseq * S * taps * H; i++)
        features[i] = (float)ddk_rng_normal(&rng);
    for (int64_t i = 0; i < nseq * S * H; i++)
        teacher[i] = (float)ddk_rng_normal(&rng);
    for (int64_t i = 0; i < nseq * S; i++) {
        ids[i] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)vocab);
        mask[i] = 1;
    }
    for (int64_t s = 0; s < nseq; s++)
        for (int64_t j = 0; j < A; j++) {
            anchor[s * A + j] = (int32_t)(j * (S - 1) / A);
            keep[s * A + j] = 1;
        }
    ddt_batch b = { nseq, S, A, ids, mask, features, teacher, anchor, keep, NULL };
    ddt_loss_config lc = { .gamma = 10.0f, .ce_target_teacher = 1,
                           .loss = { .chunk = nseq * A * block, .kl_weight = 0.15f,
                                     .kl_temperature = 1.0f, .cap_temperature = 1.0f },
                           .selector_weight = 1.0f };

    double t[64];
    ddk_loss_result r;
    ddk_allocator *alloc = ddk_allocator_cpu();
    ddk_allocator_reset_peak(alloc);
    size_t base = ddk_allocator_stats(alloc).current;
    for (int64_t k = -1; k < reps; k++) {   /* k = -1: warm-up */
        memset(grads, 0, (size_t)total * sizeof(float));
        double t0 = bench_now_s();
        int rc = ddt_drafter_step(ddk_backend_cpu(), &c, &w, &g, &(ddt_head){ embed, head, 0 }, &b, &lc, &r);
        if (rc) {
            fprintf(stderr, "bench_step: the step failed (%d)\n", rc);
            return 1;
        }
        if (k >= 0)
            t[k] = bench_now_s() - t0;
    }
    size_t peak = ddk_allocator_stats(alloc).peak - base;
    double med = bench_median(t, (int)reps), positions = (double)(nseq * A * block);
    if (json)
        printf("{\"impl\":\"ddtree%s\",\"seconds_median\":%.6f,\"positions\":%.0f,\"positions_per_s\":%.1f,"
               "\"peak_workspace_bytes\":%zu,\"loss\":%.9g,\"threads\":%lld}\n",
               dflash2 ? "-dflash2" : "", med, positions, positions / med, peak, r.loss, (long long)threads);
    else
        printf("%s step: H %lld, %lld layers, %lldx%lld heads (%lld kv), I %lld, block %lld, "
               "%lld anchors, S %lld, V %lld, %lld seq: %.3f s, %.0f positions/s, peak workspace %.1f MB, "
               "loss %.4f\n", dflash2 ? "DFlash2" : "DFlash", (long long)H, (long long)layers, (long long)heads, (long long)head_dim,
               (long long)kv_heads, (long long)inter, (long long)block, (long long)A, (long long)S,
               (long long)vocab, (long long)nseq, med, positions / med, peak / 1e6, r.loss);
    free(weights);
    free(grads);
    free(embed);
    free(head);
    free(features);
    free(teacher);
    free(ids);
    free(mask);
    free(anchor);
    free(keep);
    return 0;
}
