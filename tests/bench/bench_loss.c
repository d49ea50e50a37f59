/* bench_loss.c: figures of the fused, chunked loss on the CPU. Prints, never fails on speed.
 *
 *   bench_loss [--n N] [--hidden H] [--vocab V] [--chunk C] [--tile T] [--threads K]
 *              [--reps R] [--kl-weight A] [--cap-weight L] [--json] [--seed-arithmetic]
 *
 * For one shape it times both memory modes (vocab_tile 0, and vocab_tile T), reads each one's
 * workspace from the accounting allocator (and the process's peak RSS growth, the measure the
 * PyTorch peer gets too), and times the floor: the three logit-sized matrix products alone,
 * with the chunk shapes the loss uses. Each figure is a median of wall-clock times and, beside
 * it, of the process's CPU time: on a shared machine the CPU time is the steadier measure of
 * a one-thread run (other processes' load stretches the wall clock, not the CPU time).
 * --seed-arithmetic prints the seed documents' memory
 * arithmetic (24,576 positions x 248,320 vocabulary) from ddk_loss_workspace_bytes.
 * tests/bench/loss_vs_torch.py runs this beside the PyTorch approach in one invocation.
 */
#include "bench_util.h"
#include "ddk.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct bench_args {
    int64_t n, hidden, vocab, chunk, tile;
    int threads, reps, json, seed_arithmetic;
    float kl_weight, cap_weight;
} bench_args;

static long peak_rss_bytes(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss * 1024L;
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;   /* ddk_rng.h */
static void fill_normal(float *x, int64_t count, float std)
{
    for (int64_t i = 0; i < count; i++) {
        x[i] = (float)(std * ddk_rng_normal(&rng_state));
    }
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes);
    if (!p) {
        fprintf(stderr, "bench_loss: out of host memory for %zu bytes\n", bytes);
        exit(1);
    }
    memset(p, 0, bytes);   /* touch, so the inputs are in the RSS baseline */
    return p;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){ .n = 2048, .hidden = 256, .vocab = 16000, .chunk = 512, .tile = 2048,
                       .threads = 1, .reps = 3, .kl_weight = 0.15f };
    const bench_opt opts[] = {
        { "--n", BENCH_I64, &a->n }, { "--hidden", BENCH_I64, &a->hidden }, { "--vocab", BENCH_I64, &a->vocab },
        { "--chunk", BENCH_I64, &a->chunk }, { "--tile", BENCH_I64, &a->tile },
        { "--threads", BENCH_INT, &a->threads }, { "--reps", BENCH_INT, &a->reps },
        { "--kl-weight", BENCH_F32, &a->kl_weight }, { "--cap-weight", BENCH_F32, &a->cap_weight },
        { "--json", BENCH_SET, &a->json }, { "--seed-arithmetic", BENCH_SET, &a->seed_arithmetic },
    };
    if (bench_parse("bench_loss", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return -1;
    if (a->n < 1 || a->hidden < 1 || a->vocab < 1 || a->chunk < 1 || a->reps < 1 || a->threads < 1) {
        fprintf(stderr, "bench_loss: --n, --hidden, --vocab, --chunk, --reps and --threads must be >= 1\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------ */

static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct mode_figures {
    double seconds;       /* median over reps */
    double cpu_seconds;   /* median over reps of the process's CPU time */
    size_t workspace;     /* allocator peak above the baseline */
    long rss_growth;      /* peak RSS growth during the reps */
    ddk_loss_result result;
} mode_figures;

static int time_loss(const bench_args *a, int64_t tile, const float *hs, const float *ht,
                     const float *W, float *grad, mode_figures *f)
{
    ddk_loss_params p = { .n = a->n, .hidden = a->hidden, .vocab = a->vocab, .chunk = a->chunk,
                          .vocab_tile = tile, .kl_weight = a->kl_weight, .kl_temperature = 1.0f,
                          .cap_weight = a->cap_weight, .cap_temperature = 1.0f };
    ddk_allocator *alloc = ddk_allocator_cpu();
    double t[64], c[64];
    int reps = a->reps < 64 ? a->reps : 64;
    long rss0 = peak_rss_bytes();
    ddk_allocator_reset_peak(alloc);
    size_t base = ddk_allocator_stats(alloc).current;
    int rc = ddk_loss_cpu(&p, hs, ht, W, NULL, NULL, grad, NULL, &f->result);   /* warm-up */
    for (int r = 0; r < reps && rc == 0; r++) {
        double t0 = bench_now_s(), c0 = cpu_now_s();
        rc = ddk_loss_cpu(&p, hs, ht, W, NULL, NULL, grad, NULL, &f->result);
        t[r] = bench_now_s() - t0;
        c[r] = cpu_now_s() - c0;
    }
    if (rc) {
        fprintf(stderr, "bench_loss: the loss failed with %d\n", rc);
        return rc;
    }
    f->seconds = bench_median(t, reps);
    f->cpu_seconds = bench_median(c, reps);
    f->workspace = ddk_allocator_stats(alloc).peak - base;
    f->rss_growth = peak_rss_bytes() - rss0;
    return 0;
}

/* The three logit-sized products of the materialised mode, chunk by chunk, nothing else:
 * the median wall-clock seconds, and the CPU seconds' in *cpu_seconds. */
static double time_floor(const bench_args *a, const float *hs, const float *ht, const float *W,
                         float *grad, double *cpu_seconds)
{
    const ddk_backend *be = ddk_backend_cpu();
    int64_t c = a->chunk < a->n ? a->chunk : a->n, H = a->hidden, V = a->vocab;
    float *zs = xmalloc((size_t)(c * V) * sizeof(float));   /* (c, V) */
    float *zt = xmalloc((size_t)(c * V) * sizeof(float));   /* (c, V) */
    double t[64], cpu[64];
    int reps = a->reps < 64 ? a->reps : 64;
    for (int r = -1; r < reps; r++) {   /* r = -1: warm-up */
        double t0 = bench_now_s(), c0 = cpu_now_s();
        for (int64_t r0 = 0; r0 < a->n; r0 += c) {
            int64_t m = a->n - r0 < c ? a->n - r0 : c;
            be->matmul(be, 0, 1, m, V, H, 1.0f, hs + r0 * H, H, W, H, 0.0f, zs, V);
            be->matmul(be, 0, 1, m, V, H, 1.0f, ht + r0 * H, H, W, H, 0.0f, zt, V);
            be->matmul(be, 0, 0, m, H, V, 1.0f, zs, V, W, H, 0.0f, grad + r0 * H, H);
        }
        if (r >= 0) {
            t[r] = bench_now_s() - t0;
            cpu[r] = cpu_now_s() - c0;
        }
    }
    free(zs);
    free(zt);
    *cpu_seconds = bench_median(cpu, reps);
    return bench_median(t, reps);
}

/* ------------------------------------------------------------------------------------------ */

static void print_seed_arithmetic(void)
{
    const int64_t n = 24576, V = 248320, H = 5120;
    const double GB = 1e9;
    printf("\nThe seed's arithmetic: n = 24,576 positions (1024 anchors x block 24), V = 248,320\n");
    printf("  one logits tensor, bf16:          24,576 x 248,320 x 2 B = %6.1f GB\n", (double)n * V * 2 / GB);
    printf("  naive KL (3 such tensors):                                 %6.1f GB\n", 3.0 * n * V * 2 / GB);
    printf("  seed fix, lm_head chunk 4096:      4,096 x 248,320 x 2 B = %6.2f GB per chunk\n", 4096.0 * V * 2 / GB);
    printf("  seed fix, KL chunk 2048 (3 interm.): 3 x 2,048 x 248,320 x 2 B = %6.2f GB per chunk\n", 3 * 2048.0 * V * 2 / GB);
    printf("ddtree's loss workspace (fp32 logits and statistics; ddk_loss_workspace_bytes):\n");
    printf("  %-8s %-11s %16s\n", "chunk", "vocab_tile", "workspace");
    const int64_t cases[][2] = { { 4096, 0 }, { 2048, 0 }, { 1024, 0 }, { 4096, 8192 },
                                 { 2048, 4096 }, { 1024, 2048 }, { 512, 2048 } };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ddk_loss_params p = { .n = n, .hidden = H, .vocab = V, .chunk = cases[i][0],
                              .vocab_tile = cases[i][1], .kl_weight = 0.15f,
                              .kl_temperature = 1.0f, .cap_temperature = 1.0f };
        int64_t ws = ddk_loss_workspace_bytes(&p, 1);
        printf("  %-8lld %-11lld %13.3f GB\n", (long long)cases[i][0], (long long)cases[i][1], ws / GB);
    }
    printf("  (vocab_tile > 0: the workspace does not grow with V or n, only with chunk x tile)\n");
}

int main(int argc, char **argv)
{
    bench_args a;
    if (parse_args(argc, argv, &a))
        return 2;
    ddk_cpu_set_threads(a.threads);
    int64_t n = a.n, H = a.hidden, V = a.vocab;
    float *hs = xmalloc((size_t)(n * H) * sizeof(float));     /* (n, H) */
    float *ht = xmalloc((size_t)(n * H) * sizeof(float));     /* (n, H) */
    float *W = xmalloc((size_t)(V * H) * sizeof(float));      /* (V, H) */
    float *grad = xmalloc((size_t)(n * H) * sizeof(float));   /* (n, H) */
    fill_normal(hs, n * H, 1.0f);
    fill_normal(ht, n * H, 1.0f);
    fill_normal(W, V * H, 2.0f / sqrtf((float)H));   /* logits with std ~2 */

    mode_figures full, tiled;
    if (time_loss(&a, 0, hs, ht, W, grad, &full) || time_loss(&a, a.tile, hs, ht, W, grad, &tiled))
        return 1;
    double floor_cpu_s;
    double floor_s = time_floor(&a, hs, ht, W, grad, &floor_cpu_s);
    double flop3 = 3.0 * 2.0 * n * V * H;

    if (a.json) {
        printf("{\"impl\":\"ddtree\",\"n\":%lld,\"hidden\":%lld,\"vocab\":%lld,\"chunk\":%lld,"
               "\"tile\":%lld,\"threads\":%d,\"reps\":%d,"
               "\"full\":{\"seconds_median\":%.6f,\"cpu_seconds_median\":%.6f,\"workspace_bytes\":%zu,"
               "\"workspace_rss_bytes\":%ld,\"loss\":%.9g},"
               "\"tiled\":{\"seconds_median\":%.6f,\"cpu_seconds_median\":%.6f,\"workspace_bytes\":%zu,"
               "\"workspace_rss_bytes\":%ld,\"loss\":%.9g},"
               "\"floor_seconds\":%.6f,\"floor_cpu_seconds\":%.6f}\n",
               (long long)n, (long long)H, (long long)V, (long long)a.chunk, (long long)a.tile,
               a.threads, a.reps, full.seconds, full.cpu_seconds, full.workspace, full.rss_growth,
               full.result.loss, tiled.seconds, tiled.cpu_seconds, tiled.workspace,
               tiled.rss_growth, tiled.result.loss, floor_s, floor_cpu_s);
    } else {
        printf("loss benchmark: n %lld, H %lld, V %lld, chunk %lld, %d thread(s), median of %d\n",
               (long long)n, (long long)H, (long long)V, (long long)a.chunk, a.threads, a.reps);
        printf("  %-24s %10s %10s %10s %10s %14s %12s\n", "mode", "time s", "x floor", "cpu s",
               "x floor", "workspace MB", "GFLOP/s*");
        printf("  %-24s %10.3f %10.2f %10.3f %10.2f %14s %12.1f\n", "3 products alone (floor)",
               floor_s, 1.0, floor_cpu_s, 1.0, "-", flop3 / floor_s / 1e9);
        printf("  %-24s %10.3f %10.2f %10.3f %10.2f %14.1f %12.1f\n", "vocab_tile 0", full.seconds,
               full.seconds / floor_s, full.cpu_seconds, full.cpu_seconds / floor_cpu_s,
               full.workspace / 1e6, flop3 / full.seconds / 1e9);
        char name[32];
        snprintf(name, sizeof name, "vocab_tile %lld", (long long)a.tile);
        printf("  %-24s %10.3f %10.2f %10.3f %10.2f %14.1f %12.1f\n", name, tiled.seconds,
               tiled.seconds / floor_s, tiled.cpu_seconds, tiled.cpu_seconds / floor_cpu_s,
               tiled.workspace / 1e6, flop3 / tiled.seconds / 1e9);
        printf("  loss %.6f (tile 0) vs %.6f (tile %lld); * counting the 3 products of the floor\n",
               full.result.loss, tiled.result.loss, (long long)a.tile);
    }
    if (a.seed_arithmetic)
        print_seed_arithmetic();
    free(hs);
    free(ht);
    free(W);
    free(grad);
    return 0;
}
