/* bench_step_cuda.c: one training step of the drafter on GPU 0 (forward, the fused loss,
 * backward, and the AdamW update), at the Qwen3.6-27B drafter's shape by default: positions
 * per second, the matrix-product rate it reaches, and its peak memory. Prints, never fails on
 * speed; exits 77 ("SKIPPED: no GPU") without a GPU, 1 when the step fails or a loss is not
 * finite.
 *
 *   bench_step_cuda [--hidden 5120] [--layers 5] [--heads 32] [--kv-heads 8] [--head-dim 128]
 *                   [--intermediate 17408] [--window 2048] [--block 24] [--anchors 1024]
 *                   [--seq 4096] [--vocab 248320] [--taps 5] [--chunk 1024] [--tile 0]
 *                   [--bf16 1] [--copies 1] [--reps 3] [--json] [--cpu] [--dflash2]
 *
 * --dflash2: a DFlash2 drafter of the same shape (SPEC.md 2.1: two-tap convolutions, group 16,
 * the selector at rank 256 and top-16 with alpha_sel 1); run both in one session for the ratio.
 * --copies 1 (with --bf16 1) is the trainer's bf16 step: a bf16 copy of the weights, refreshed by
 * every AdamW update, activations rounded once per product (be->matmul_16), the frozen head in
 * bf16 (read as stored); --copies 0 the step before it (be->matmul_bf16 on fp32 operands, cuBLAS
 * converting both in every product, an fp32 head), kept selectable for the before/after figure
 * in one run.
 * --cpu runs the same code on the CPU backend (small shapes only): a check of this benchmark's
 * own plumbing on a machine without a GPU.
 * The shape (issue 6): H 5120, 5 layers (4 sliding with window 2048, then 1 full), 32/8 heads
 * of 128, intermediate 17408, block 24, 1024 anchors, S 4096, the target's 248,320 vocabulary,
 * 5 tapped layers; loss as the seed's (ce_target teacher, kl_weight 0.15). Everything lives in
 * GPU memory from the CUDA allocator: fp32 master weights, gradients, AdamW moments, the
 * frozen embed_tokens and lm_head, one sequence's features and teacher hidden states.
 * Weights and inputs are one random 64 MiB slice repeated (its values N(0, 0.02^2)-sized for
 * weights, norm gains 1; features std 1): the timing does not depend on the values, and the
 * host never holds the 17 GB of the full state.
 *
 * Measured, after one warm-up step: the median of --reps steps, each from a zeroed gradient
 * to the updated weights (ddt_drafter_step then ddt_adamw_update, the trainer's two calls on
 * one rank), wall time between two synchronisations; the update's share separately. Peak:
 * the CUDA allocator's high-water mark over all of it. TFLOP/s count the matrix products the
 * step performs (the drafter's, forward and backward: 3x the forward's except fc, whose input
 * has no gradient: 2x; the loss's 3 logit-sized products, 5 when tiled), not attention or
 * elementwise work. tests/gpu/check.sh runs it on the device machine.
 *
 * Legend: H hidden, S sequence length, A anchors, B block size, AB = A*B, SAB = S + AB,
 * I intermediate, V vocabulary, LH = taps * H.
 */
#include "bench_util.h"
#include "ddk_rng.h"
#include "model/drafter.h"
#include "model/optimizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLICE ((int64_t)1 << 24)   /* floats per host slice (64 MiB) */

static const ddk_backend *be;
static float *slice_random, *slice_ones;   /* (SLICE) each, host */

/* count floats on the GPU, from a slice repeated */
static float *device_fill(int64_t count, const float *slice)
{
    float *d = ddk_malloc(be->alloc, (size_t)count * sizeof(float));
    for (int64_t at = 0; d && at < count; at += SLICE)
        be->copy(be, d + at, slice, (size_t)(count - at < SLICE ? count - at : SLICE) * sizeof(float));
    return d;
}

/* count bf16 values on the GPU: a slice repeated, times scale, rounded (through one slice of
 * fp32 on the GPU, freed again) */
static uint16_t *device_fill16(int64_t count, const float *slice, float scale)
{
    uint16_t *d = ddk_malloc(be->alloc, (size_t)count * sizeof(uint16_t));
    float *tmp = ddk_malloc(be->alloc, (size_t)SLICE * sizeof(float));
    for (int64_t at = 0; d && tmp && at < count; at += SLICE) {
        const int64_t n = count - at < SLICE ? count - at : SLICE;
        be->copy(be, tmp, slice, (size_t)n * sizeof(float));
        be->axpby(be, n, scale, tmp, 0.0f, tmp);
        be->round_bf16(be, tmp, n, d + at);
    }
    be->synchronize(be);
    ddk_free(be->alloc, tmp, (size_t)SLICE * sizeof(float));
    return tmp ? d : NULL;
}

int main(int argc, char **argv)
{
    int64_t hidden = 5120, layers = 5, heads = 32, kv_heads = 8, head_dim = 128, inter = 17408,
            window = 2048, block = 24, anchors = 1024, seq = 4096, vocab = 248320, taps = 5,
            chunk = 1024, tile = 0, bf16 = 1, copies = 1, reps = 3;
    int json = 0, on_cpu = 0, dflash2 = 0;
    const bench_opt opts[] = {
        { "--hidden", BENCH_I64, &hidden }, { "--layers", BENCH_I64, &layers }, { "--heads", BENCH_I64, &heads },
        { "--kv-heads", BENCH_I64, &kv_heads }, { "--head-dim", BENCH_I64, &head_dim },
        { "--intermediate", BENCH_I64, &inter }, { "--window", BENCH_I64, &window },
        { "--block", BENCH_I64, &block }, { "--anchors", BENCH_I64, &anchors }, { "--seq", BENCH_I64, &seq },
        { "--vocab", BENCH_I64, &vocab }, { "--taps", BENCH_I64, &taps }, { "--chunk", BENCH_I64, &chunk },
        { "--tile", BENCH_I64, &tile }, { "--bf16", BENCH_I64, &bf16 }, { "--copies", BENCH_I64, &copies },
        { "--reps", BENCH_I64, &reps },
        { "--json", BENCH_SET, &json }, { "--cpu", BENCH_SET, &on_cpu }, { "--dflash2", BENCH_SET, &dflash2 },
    };
    if (bench_parse("bench_step_cuda", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return 2;
    if (reps < 1 || reps > 64 || anchors < 1 || anchors > seq || (bf16 != 0 && bf16 != 1) || (copies != 0 && copies != 1) || layers < 1 ||
        layers > DDT_MAX_LAYERS || taps < 1 || taps > DDT_MAX_TAPS) {
        fprintf(stderr, "bench_step_cuda: --reps must be in [1, 64], --anchors in [1, --seq], --bf16 and --copies 0 or 1, "
                "--layers and --taps in [1, 64]\n");
        return 2;
    }
    be = on_cpu ? ddk_backend_cpu() : ddk_backend_cuda(0);
    if (!be) {
        printf("SKIPPED: no GPU (%s)\n", ddk_has_cuda() ? "none visible" : "libddk built without CUDA");
        printf("{\"impl\": \"ddtree-cuda-step\", \"skipped\": \"no GPU\"}\n");
        return 77;
    }

    ddt_drafter_config c = { .hidden = hidden, .layers = layers, .heads = heads, .kv_heads = kv_heads,
                             .head_dim = head_dim, .intermediate = inter, .vocab = vocab,
                             .block_size = block, .sliding_window = window, .rms_norm_eps = 1e-6f,
                             .rope_theta = 1e7f, .taps = taps, .mask_token_id = (int32_t)(vocab - 1),
                             .dflash2 = dflash2, .conv_taps = dflash2 ? 2 : 0, .conv_group_size = dflash2 ? 16 : 0,
                             .selector_rank = dflash2 ? 256 : 0, .selector_top_k = dflash2 ? 16 : 0 };
    for (int64_t l = 0; l < layers; l++)
        c.sliding[l] = window > 0 && l + 1 < layers;   /* the seed's shape: sliding, then full */
    for (int64_t i = 0; i < taps; i++)
        c.target_layer_ids[i] = (int32_t)(1 + i * 15);
    char err[512];
    if (ddt_drafter_config_check(&c, err, sizeof err)) {
        fprintf(stderr, "bench_step_cuda: %s\n", err);
        return 2;
    }
    static ddt_param table[DDT_MAX_PARAMS];
    int64_t total;
    const int count = ddt_drafter_param_table(&c, table, &total);
    const int64_t H = hidden, S = seq, A = anchors, LH = taps * H;

    uint64_t rng = 0x2545F4914F6CDD1Dull;
    slice_random = malloc((size_t)SLICE * sizeof(float));
    slice_ones = malloc((size_t)SLICE * sizeof(float));
    int32_t *ids = malloc((size_t)S * sizeof(int32_t)), *anchor = malloc((size_t)A * sizeof(int32_t));
    uint8_t *mask = malloc((size_t)S), *keep = malloc((size_t)A);
    if (!slice_random || !slice_ones || !ids || !anchor || !mask || !keep) {
        fprintf(stderr, "bench_step_cuda: no host memory for the slices\n");
        return 1;
    }
    for (int64_t i = 0; i < SLICE; i++) {
        slice_random[i] = (float)(2.0 * ddk_rng_uniform(&rng) - 1.0);   /* std 0.58 */
        slice_ones[i] = 1.0f;
    }
    for (int64_t t = 0; t < S; t++) {
        ids[t] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)vocab);
        mask[t] = 1;
    }
    for (int64_t j = 0; j < A; j++) {   /* evenly spread, sorted, all kept */
        anchor[j] = (int32_t)(j * (S - 1) / A);
        keep[j] = 1;
    }

    ddk_allocator_reset_peak(be->alloc);
    const size_t bytes = (size_t)total * sizeof(float);
    float *params = ddk_malloc(be->alloc, bytes);
    for (int i = 0; params && i < count; i++) {   /* matrices: the random slice scaled; gains 1 */
        const ddt_param *p = &table[i];
        for (int64_t at = 0; at < p->numel; at += SLICE) {
            const int64_t n = p->numel - at < SLICE ? p->numel - at : SLICE;
            be->copy(be, params + p->offset + at, p->is_norm ? slice_ones : slice_random, (size_t)n * sizeof(float));
            if (!p->is_norm)
                be->axpby(be, n, 0.02f / 0.58f, params + p->offset + at, 0.0f, params + p->offset + at);
        }
    }
    float *grads = ddk_malloc(be->alloc, bytes), *m = ddk_malloc(be->alloc, bytes), *v = ddk_malloc(be->alloc, bytes);
    /* the frozen head: fp32, or bf16 in the trainer's bf16 step (--copies 1: co-located GPUs read
     * their replica's, others keep a bf16 copy) */
    const int head16 = bf16 && copies;
    void *embed = head16 ? (void *)device_fill16(vocab * H, slice_random, 1.0f)
                         : (void *)device_fill(vocab * H, slice_random);
    void *head = head16 ? (void *)device_fill16(vocab * H, slice_random, 0.05f)
                        : (void *)device_fill(vocab * H, slice_random);
    float *features = device_fill(S * LH, slice_random), *teacher = device_fill(S * H, slice_random);
    if (!params || !grads || !m || !v || !embed || !head || !features || !teacher) {
        fprintf(stderr, "bench_step_cuda: the GPU has no memory for the state (%.1f GB of weights, gradients, "
                "moments; %.1f GB of embed_tokens and lm_head)\n", 4.0 * (double)bytes / 1e9,
                2.0 * (double)(vocab * H) * 4 / 1e9);
        return 1;
    }
    if (!head16)   /* logits of std ~ 0.05 * 0.58^2 * sqrt(H) */
        be->axpby(be, vocab * H, 0.05f, head, 0.0f, head);
    be->zero(be, m, bytes);
    be->zero(be, v, bytes);
    uint16_t *params16 = NULL;   /* the bf16 copy (--copies 1 with --bf16 1) */
    const size_t bytes16 = (size_t)total * sizeof(uint16_t);
    if (bf16 && copies && !(params16 = ddk_malloc(be->alloc, bytes16))) {
        fprintf(stderr, "bench_step_cuda: the GPU has no memory for the weights' bf16 copy (%.1f GB)\n",
                (double)bytes16 / 1e9);
        return 1;
    }
    if (params16)
        be->round_bf16(be, params, total, params16);
    be->synchronize(be);
    ddk_allocator_reset_peak(be->alloc);   /* the state alone: not device_fill16's passing slice */

    ddt_drafter_weights w, g;
    ddt_drafter_bind(&c, params, &w);
    w.bf16 = params16;
    ddt_drafter_bind(&c, grads, &g);
    ddt_batch b = { 1, S, A, ids, mask, features, teacher, anchor, keep, NULL };
    ddt_loss_config lc = { .gamma = 7.0f, .ce_target_teacher = 1,
                           .loss = { .chunk = chunk, .vocab_tile = tile, .kl_weight = 0.15f, .kl_temperature = 1.0f,
                                     .cap_temperature = 1.0f, .bf16_products = (int)bf16 },
                           .selector_weight = 1.0f };
    ddt_adamw_config ac = { .lr = 6e-4, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .grad_clip = 1.0,
                            .total_steps = 1000 };
    ddt_adamw_state state = { 0, m, v };

    double step_s[64], update_s[64], loss = NAN;
    for (int64_t r = -1; r < reps; r++) {   /* r = -1: the warm-up */
        be->zero(be, grads, bytes);
        be->synchronize(be);
        double t0 = bench_now_s();
        ddk_loss_result out;
        int rc = ddt_drafter_step(be, &c, &w, &g, &(ddt_head){ embed, head, head16 }, &b, &lc, &out);
        be->synchronize(be);
        double t1 = bench_now_s();
        if (rc) {
            fprintf(stderr, "bench_step_cuda: the step failed: %s (peak %.2f GB; try --chunk or --tile)\n",
                    rc == -12 ? "out of memory" : "error", (double)ddk_allocator_stats(be->alloc).peak / 1e9);
            return 1;
        }
        double norm = ddt_adamw_update(be, &ac, table, count, params, params16, grads, &state, NULL);
        be->synchronize(be);
        double t2 = bench_now_s();
        if (!isfinite(out.loss) || !isfinite(norm)) {
            fprintf(stderr, "bench_step_cuda: loss %g, gradient norm %g: not finite\n", out.loss, norm);
            return 1;
        }
        loss = out.loss;
        if (r >= 0) {
            step_s[r] = t2 - t0;
            update_s[r] = t2 - t1;
        }
    }
    const double median = bench_median(step_s, (int)reps), update = bench_median(update_s, (int)reps);
    const double positions = (double)(A * block), peak = (double)ddk_allocator_stats(be->alloc).peak;
    const double flops = ddt_drafter_step_flops(&c, S, A, tile > 0 && tile < vocab ? 5 : 3);
    ddk_device_info info = { .name = "the CPU" };
    if (!on_cpu && ddk_cuda_device_info(0, &info))
        snprintf(info.name, sizeof info.name, "cuda:0");
    if (!json) {
        printf("%s step on %s: H %lld, %lld layers, %lld/%lld heads of %lld, I %lld, window %lld, block %lld,\n"
               "  %lld anchors, S %lld, V %lld, %lld taps; chunk %lld, vocab_tile %lld; %s products%s\n",
               dflash2 ? "DFlash2" : "DFlash", info.name, (long long)hidden, (long long)layers, (long long)heads,
               (long long)kv_heads, (long long)head_dim, (long long)inter, (long long)window, (long long)block, (long long)anchors,
               (long long)seq, (long long)vocab, (long long)taps, (long long)chunk, (long long)tile,
               bf16 ? "bf16" : "fp32", params16 ? " (bf16 weight copies, activations rounded once)" : "");
        printf("  step (median of %lld) %.3f s, of which AdamW %.3f s\n", (long long)reps, median, update);
        printf("  %.0f positions/s, %.0f tokens/s; matrix products %.1f TFLOP/s (%.1f TFLOP per step)\n",
               positions / median, (double)S / median, flops / median / 1e12, flops / 1e12);
        printf("  peak memory %.2f GB (activations %.2f GB of it); loss %.6f\n", peak / 1e9,
               (double)ddt_drafter_step_bytes(&c, 1, S, A, 1, (int)bf16, params16 != NULL) / 1e9, loss);
    }
    printf("{\"impl\": \"ddtree-cuda-step%s\", \"device\": \"%s\", \"hidden\": %lld, \"layers\": %lld, \"anchors\": %lld, "
           "\"block\": %lld, \"seq\": %lld, \"vocab\": %lld, \"chunk\": %lld, \"vocab_tile\": %lld, \"bf16\": %lld, "
           "\"copies\": %d, "
           "\"step_s\": %.6f, \"adamw_s\": %.6f, \"positions_per_s\": %.1f, \"tflops\": %.2f, \"peak_bytes\": %.0f, "
           "\"loss\": %.6f}\n",
           dflash2 ? "-dflash2" : "", info.name, (long long)hidden, (long long)layers, (long long)anchors,
           (long long)block, (long long)seq,
           (long long)vocab, (long long)chunk, (long long)tile, (long long)bf16, params16 != NULL, median, update,
           positions / median,
           flops / median / 1e12, peak, loss);
    return 0;
}
