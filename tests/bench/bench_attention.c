/* bench_attention.c: figures of the CPU DFlash attention (forward + backward) beside a
 * dense-mask implementation. Prints, never fails on speed.
 *
 *   bench_attention [--A 256] [--B 16] [--S 2048] [--nh 8] [--d 64] [--window 0]
 *                   [--reps 3] [--threads K] [--no-dense]
 *
 * For nkv = nh and nkv = nh / 4 it times the library's dflash_attention and its backward and
 * reads their peak workspace from the accounting allocator (reset_peak before, peak - current
 * after). Beside it, the naive way (what a framework does with an attention mask): the
 * (A*B) x (S + A*B) float mask, materialised once, and per head a score matrix of the same
 * size, softmaxed in place and kept for the backward (as autograd keeps attention weights),
 * with one more such matrix for dP in the backward. Its bytes are given analytically, and its
 * time is measured (its buffers also come from the allocator, so its peak is measured too);
 * --no-dense skips the measurement. The dense run also serves as a cross-check: the largest
 * difference of out and dq between the two is printed.
 *
 * Legend: S context rows, A anchors (blocks), B block size, nh query heads, nkv kv heads,
 * G = nh / nkv, d head dim, n = A*B query rows, N = S + A*B key rows.
 */
#include "bench_util.h"
#include "ddk.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct bench_args {
    int64_t A, B, S, nh, d, window;
    int reps, threads, dense;
} bench_args;

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static float *fill_uniform(int64_t count, float amplitude)
{
    float *x = malloc((size_t)count * sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_attention: out of host memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < count; i++)
        x[i] = (float)(amplitude * (2.0 * ddk_rng_uniform(&rng_state) - 1.0));
    return x;
}

static float *zeros(int64_t count)
{
    float *x = calloc((size_t)count, sizeof *x);
    if (!x) {
        fprintf(stderr, "bench_attention: out of host memory\n");
        exit(1);
    }
    return x;
}

static int parse_args(int argc, char **argv, bench_args *a)
{
    *a = (bench_args){ .A = 256, .B = 16, .S = 2048, .nh = 8, .d = 64, .window = 0, .reps = 3,
                       .threads = 0, .dense = 1 };
    const bench_opt opts[] = {
        { "--A", BENCH_I64, &a->A }, { "--B", BENCH_I64, &a->B }, { "--S", BENCH_I64, &a->S },
        { "--nh", BENCH_I64, &a->nh }, { "--d", BENCH_I64, &a->d }, { "--window", BENCH_I64, &a->window },
        { "--reps", BENCH_INT, &a->reps }, { "--threads", BENCH_INT, &a->threads },
        { "--no-dense", BENCH_CLEAR, &a->dense },
    };
    if (bench_parse("bench_attention", argc, argv, opts, (int)(sizeof opts / sizeof opts[0])))
        return -1;
    if (a->A < 1 || a->B < 1 || a->S < 2 || a->nh < 1 || a->d < 1 || a->reps < 1) {
        fprintf(stderr, "bench_attention: --A, --B, --nh, --d, --reps must be >= 1, --S >= 2\n");
        return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The problem: one sequence's q, k, v, dout and sorted anchors, all blocks kept.
 */

typedef struct problem {
    ddk_attention_shape sh;
    int64_t n, N;        /* A*B query rows, S + A*B key rows */
    float *q, *dout;     /* (n, nh, d) */
    float *k, *v;        /* (N, nkv, d) */
    int32_t *anchors;    /* (A) */
    uint8_t *keep;       /* (A) */
} problem;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static problem make_problem(const bench_args *a, int64_t nkv)
{
    problem p;
    p.sh = (ddk_attention_shape){ .S = a->S, .A = a->A, .B = a->B, .nh = a->nh, .nkv = nkv,
                                  .d = a->d, .window = a->window };
    p.n = a->A * a->B;
    p.N = a->S + p.n;
    p.q = fill_uniform(p.n * a->nh * a->d, 2.0f);
    p.dout = fill_uniform(p.n * a->nh * a->d, 1.0f);
    p.k = fill_uniform(p.N * nkv * a->d, 1.0f);
    p.v = fill_uniform(p.N * nkv * a->d, 1.0f);
    p.anchors = malloc((size_t)a->A * sizeof *p.anchors);
    p.keep = malloc((size_t)a->A);
    for (int64_t j = 0; j < a->A; j++) {   /* SPEC.md: candidates in [0, S-2], sorted */
        p.anchors[j] = (int32_t)(ddk_rng_uniform(&rng_state) * (double)(a->S - 1));
        p.keep[j] = 1;
    }
    qsort(p.anchors, (size_t)a->A, sizeof *p.anchors, cmp_i32);
    return p;
}

static void free_problem(problem *p)
{
    free(p->q), free(p->dout), free(p->k), free(p->v), free(p->anchors), free(p->keep);
}

/* ------------------------------------------------------------------------------------------
 * The dense-mask implementation: what the library must never do.
 */

/* bytes the dense way holds at its peak: the mask, nh kept probability matrices, one dP */
static double dense_bytes(const ddk_attention_shape *sh)
{
    const double n = (double)(sh->A * sh->B), N = (double)(sh->S + sh->A * sh->B);
    return (1.0 + sh->nh + 1.0) * n * N * sizeof(float);
}

typedef struct dense_buffers {
    float *mask;   /* (n, N): 0 where visible, -inf elsewhere */
    float *P;      /* (nh, n, N): softmax probabilities, kept for the backward */
    float *dP;     /* (n, N) */
} dense_buffers;

static int dense_alloc(const problem *p, dense_buffers *b)
{
    ddk_allocator *al = ddk_allocator_cpu();
    const size_t nN = (size_t)(p->n * p->N) * sizeof(float);
    b->mask = ddk_malloc(al, nN);
    b->P = ddk_malloc(al, nN * (size_t)p->sh.nh);
    b->dP = ddk_malloc(al, nN);
    if (!b->mask || !b->P || !b->dP) {
        ddk_free(al, b->mask, nN), ddk_free(al, b->P, nN * (size_t)p->sh.nh);
        ddk_free(al, b->dP, nN);
        return -1;
    }
    return 0;
}

static void dense_free(const problem *p, dense_buffers *b)
{
    ddk_allocator *al = ddk_allocator_cpu();
    const size_t nN = (size_t)(p->n * p->N) * sizeof(float);
    ddk_free(al, b->mask, nN), ddk_free(al, b->P, nN * (size_t)p->sh.nh), ddk_free(al, b->dP, nN);
}

static void dense_forward(const problem *p, dense_buffers *b, float *out)
{
    const ddk_backend *be = ddk_backend_cpu();
    const ddk_attention_shape *sh = &p->sh;
    const int64_t n = p->n, N = p->N, S = sh->S, B = sh->B, nh = sh->nh, nkv = sh->nkv,
                  d = sh->d, W = sh->window, G = nh / nkv;
    const float scale = (float)(1.0 / sqrt((double)d));
    for (int64_t i = 0; i < n; i++) {   /* SPEC.md section 2 step 4, as a dense mask */
        const int64_t j = i / B, o = i % B, a = p->anchors[j];
        float *mr = b->mask + i * N;   /* (N) */
        for (int64_t t = 0; t < N; t++) {
            int vis = t < S ? t < a && (W == 0 || t >= a + o - (W - 1))
                            : (t - S) / B == j && (W == 0 || (t - S) % B <= o);
            mr[t] = vis ? 0.0f : -INFINITY;
        }
    }
    for (int64_t h = 0; h < nh; h++) {
        float *P = b->P + h * n * N;   /* (n, N) */
        be->matmul(be, 0, 1, n, N, d,
                    scale, p->q + h * d, (nh * d), p->k + h / G * d, (nkv * d),
                    0.0f, P, N);
        for (int64_t i = 0; i < n; i++) {
            float *pr = P + i * N;
            const float *mr = b->mask + i * N;
            float mx = -INFINITY;
            for (int64_t t = 0; t < N; t++) {
                pr[t] += mr[t];
                mx = pr[t] > mx ? pr[t] : mx;
            }
            float sum = 0.0f;
            for (int64_t t = 0; t < N; t++)
                sum += (pr[t] = expf(pr[t] - mx));
            for (int64_t t = 0; t < N; t++)
                pr[t] /= sum;
        }
        be->matmul(be, 0, 0, n, d, N,
                    1.0f, P, N, p->v + h / G * d, (nkv * d), 0.0f, out + h * d,
                    (nh * d));
    }
}

static void dense_backward(const problem *p, dense_buffers *b, const float *out, float *dq,
                           float *dk, float *dv)
{
    const ddk_backend *be = ddk_backend_cpu();
    const ddk_attention_shape *sh = &p->sh;
    const int64_t n = p->n, N = p->N, nh = sh->nh, nkv = sh->nkv, d = sh->d, G = nh / nkv;
    const float scale = (float)(1.0 / sqrt((double)d));
    for (int64_t h = 0; h < nh; h++) {
        const float *P = b->P + h * n * N;   /* (n, N) */
        const float *kh = p->k + h / G * d, *vh = p->v + h / G * d;
        be->matmul(be, 1, 0, N, d, n,
                    1.0f, P, N, p->dout + h * d, (nh * d), 1.0f, dv + h / G * d,
                    (nkv * d));
        be->matmul(be, 0, 1, n, N, d,
                    1.0f, p->dout + h * d, (nh * d), vh, (nkv * d), 0.0f, b->dP,
                    N);
        for (int64_t i = 0; i < n; i++) {
            const float *yr = out + (i * nh + h) * d, *gr = p->dout + (i * nh + h) * d;
            float D = 0.0f;
            for (int64_t c = 0; c < d; c++)
                D += yr[c] * gr[c];
            float *dpr = b->dP + i * N;
            const float *pr = P + i * N;
            for (int64_t t = 0; t < N; t++)
                dpr[t] = pr[t] * (dpr[t] - D) * scale;
        }
        be->matmul(be, 0, 0, n, d, N,
                    1.0f, b->dP, N, kh, (nkv * d), 1.0f, dq + h * d,
                    (nh * d));
        be->matmul(be, 1, 0, N, d, n,
                    1.0f, b->dP, N, p->q + h * d, (nh * d), 1.0f, dk + h / G * d,
                    (nkv * d));
    }
}

/* ------------------------------------------------------------------------------------------ */

typedef struct figures {
    double fwd_s, bwd_s;   /* medians */
    double workspace;      /* allocator peak above the baseline, bytes */
    double out_diff, dq_diff;   /* flash vs dense: max |difference| / max |dense| */
    int ran;
} figures;

static double rel_diff(const float *x, const float *y, int64_t count)
{
    double err = 0.0, scale = 0.0;
    for (int64_t i = 0; i < count; i++) {
        err = fmax(err, fabs((double)x[i] - y[i]));
        scale = fmax(scale, fabs((double)y[i]));
    }
    return scale > 0.0 ? err / scale : err;
}

static void run_shape(const bench_args *a, int64_t nkv)
{
    const ddk_backend *be = ddk_backend_cpu();
    ddk_allocator *al = ddk_allocator_cpu();
    problem p = make_problem(a, nkv);
    const int64_t n_out = p.n * a->nh * a->d, n_kv = p.N * nkv * a->d;
    float *out = zeros(n_out), *lse = zeros(p.n * a->nh);
    float *dq = zeros(n_out), *dk = zeros(n_kv), *dv = zeros(n_kv);
    figures flash = { 0 }, dense = { 0 };
    double tf[64], tb[64];
    const int reps = a->reps < 64 ? a->reps : 64;

    /* flash: one warm-up, then reps; the peak covers forward and backward */
    int rc = be->dflash_attention(be, &p.sh, p.q, p.k, p.v, p.anchors, p.keep, out, lse);
    rc |= be->dflash_attention_backward(be, &p.sh, p.q, p.k, p.v, p.anchors, p.keep, out, lse,
                                        p.dout, dq, dk, dv);
    ddk_allocator_reset_peak(al);
    const size_t base = ddk_allocator_stats(al).current;
    for (int r = 0; r < reps && rc == 0; r++) {
        memset(dq, 0, (size_t)n_out * sizeof *dq);
        memset(dk, 0, (size_t)n_kv * sizeof *dk);
        memset(dv, 0, (size_t)n_kv * sizeof *dv);
        double t0 = bench_now_s();
        rc |= be->dflash_attention(be, &p.sh, p.q, p.k, p.v, p.anchors, p.keep, out, lse);
        double t1 = bench_now_s();
        rc |= be->dflash_attention_backward(be, &p.sh, p.q, p.k, p.v, p.anchors, p.keep, out,
                                            lse, p.dout, dq, dk, dv);
        tf[r] = t1 - t0;
        tb[r] = bench_now_s() - t1;
    }
    if (rc) {
        fprintf(stderr, "bench_attention: the library's attention failed (%d)\n", rc);
        exit(1);
    }
    flash.fwd_s = bench_median(tf, reps);
    flash.bwd_s = bench_median(tb, reps);
    flash.workspace = (double)(ddk_allocator_stats(al).peak - base);
    flash.ran = 1;

    /* dense: one timed run (it is the slow one), its buffers through the allocator */
    if (a->dense) {
        dense_buffers b;
        float *out_d = zeros(n_out), *dq_d = zeros(n_out), *dk_d = zeros(n_kv),
              *dv_d = zeros(n_kv);
        ddk_allocator_reset_peak(al);
        const size_t base_d = ddk_allocator_stats(al).current;
        if (dense_alloc(&p, &b) == 0) {
            /* first touch outside the timing, as a framework's caching allocator has it warm */
            const size_t nN = (size_t)(p.n * p.N) * sizeof(float);
            memset(b.mask, 0, nN), memset(b.P, 0, nN * (size_t)a->nh), memset(b.dP, 0, nN);
            double t0 = bench_now_s();
            dense_forward(&p, &b, out_d);
            double t1 = bench_now_s();
            dense_backward(&p, &b, out_d, dq_d, dk_d, dv_d);
            dense.bwd_s = bench_now_s() - t1;
            dense.fwd_s = t1 - t0;
            dense.workspace = (double)(ddk_allocator_stats(al).peak - base_d);
            dense.ran = 1;
            flash.out_diff = rel_diff(out, out_d, n_out);
            flash.dq_diff = rel_diff(dq, dq_d, n_out);
            dense_free(&p, &b);
        }
        free(out_d), free(dq_d), free(dk_d), free(dv_d);
    }

    const double MB = 1e6;
    printf("%-6s %4lld %4lld %10.1f %10.1f %10.1f %14.3f %14.1f\n", "flash", (long long)a->nh,
           (long long)nkv, flash.fwd_s * 1e3, flash.bwd_s * 1e3, (flash.fwd_s + flash.bwd_s) * 1e3,
           flash.workspace / MB, dense_bytes(&p.sh) / MB);
    if (dense.ran)
        printf("%-6s %4lld %4lld %10.1f %10.1f %10.1f %14.1f %14.1f   flash vs dense: out %.1e, dq %.1e\n",
               "dense", (long long)a->nh, (long long)nkv, dense.fwd_s * 1e3, dense.bwd_s * 1e3,
               (dense.fwd_s + dense.bwd_s) * 1e3, dense.workspace / MB, dense_bytes(&p.sh) / MB,
               flash.out_diff, flash.dq_diff);
    else if (a->dense)
        printf("%-6s %4lld %4lld %10s %10s %10s %14s %14.1f   (did not fit)\n", "dense",
               (long long)a->nh, (long long)nkv, "-", "-", "-", "-", dense_bytes(&p.sh) / MB);
    fflush(stdout);
    free(out), free(lse), free(dq), free(dk), free(dv);
    free_problem(&p);
}

int main(int argc, char **argv)
{
    bench_args a;
    if (parse_args(argc, argv, &a))
        return 2;
    if (a.threads > 0)
        ddk_cpu_set_threads(a.threads);
    printf("DFlash attention, one sequence: A=%lld B=%lld (n = A*B = %lld queries), S=%lld, "
           "d=%lld, %s, BLAS threads %s\n",
           (long long)a.A, (long long)a.B, (long long)(a.A * a.B), (long long)a.S, (long long)a.d,
           a.window ? "sliding" : "full_attention", a.threads > 0 ? "set by --threads" : "as the BLAS chose");
    if (a.window)
        printf("window %lld\n", (long long)a.window);
    printf("workspace: allocator peak - current of forward+backward; dense bytes: mask + nh "
           "probability matrices + dP, each (A*B) x (S+A*B) float\n");
    printf("%-6s %4s %4s %10s %10s %10s %14s %14s\n", "impl", "nh", "nkv", "fwd ms", "bwd ms",
           "total ms", "workspace MB", "dense MB");
    const int64_t kv_counts[2] = { a.nh, a.nh >= 4 && a.nh % 4 == 0 ? a.nh / 4 : 1 };
    for (int i = 0; i < 2; i++)
        if (i == 0 || kv_counts[1] != kv_counts[0])
            run_shape(&a, kv_counts[i]);
    return 0;
}
