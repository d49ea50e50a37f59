/* test_backend_ops.c: every op of the CUDA backend against the CPU backend (the reference), in
 * the manner of ggml's test-backend-ops: one case per op x shape (tiny, odd, unaligned, large).
 *
 * Each case makes its inputs on the host, runs the CPU backend's op on them, uploads the same
 * inputs to GPU 0 (ddk_malloc on ddk_allocator_cuda(0), the backend's copy), runs the CUDA op,
 * copies the results back and compares them by normalised error max|gpu - cpu| / max|cpu|. NaN
 * or Inf in a result fails whatever the tolerance; forward outputs start as NaN on the GPU, so
 * an element an op forgets to write fails too; backward gradients start with values, so an
 * overwrite instead of an ADD fails. Every GPU buffer has guard bytes before and after it, and
 * cases alternate between 64-byte aligned buffers and buffers 4 bytes off (no float4 luck); the
 * guards are checked at the end of the case. The gathers (embedding) and copies must be exact.
 * The backward of each op is checked against finite differences by tests/test_ops.c on the CPU;
 * here the GPU has to match the CPU.
 *
 * Skipped (exit 77, "SKIPPED: no GPU") when libddk has no CUDA or the machine no GPU: never
 * reported as passed. DDTREE_BACKEND_OPS_SELF_CHECK=1 runs every case with the CPU backend in
 * the GPU's place, a check of this test's own plumbing on a machine without a GPU (every
 * comparison is then exact). DDTREE_OPS_VERBOSE=1 prints each error next to its tolerance.
 *
 * ctest: label gpu; one line per case; a final "N passed, M failed"; exit 1 when a case failed.
 *
 * Legend: rows independent vectors (tokens, or tokens * heads), d values per vector (head dim
 * for rope), heads per row (rope), count elements (swiglu), V vocabulary, H hidden size, and
 * (m, n, k) for c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c.
 */
#include "ddk.h"
#include "check.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Tolerances (normalised error, GPU against the CPU backend), each with its reason
 */

/* rmsnorm forward: the GPU sums x^2 in float (<= 20 strided terms per thread, then a shuffle
 * tree), the CPU in double: ~1e-7 on rstd in a float emulation of the GPU's order at d = 5120,
 * then the same 2 roundings of y on both sides */
static const double tol_rmsnorm = 2e-6;
/* rmsnorm backward dx: the dot product sum(x g dy) in float on the GPU (double on the CPU) scales
 * the x k term; dx also holds its O(1) starting values */
static const double tol_rmsnorm_dx = 5e-6;
/* rmsnorm backward dg: the CPU adds the 1000 rows one by one in float, the GPU in slices and
 * row lanes; the two orders differ by 1.2e-6 at most in a float emulation of both (1000 rows,
 * d = 64 and 5120) */
static const double tol_rmsnorm_dg = 1e-5;
/* rope: angles, cos and sin in double on both sides, rounded to float; the two products and
 * the sum may be fused (FMA) differently by nvcc and by the C compiler: ~1 ulp of the largest term */
static const double tol_rope = 1e-6;
/* swiglu forward and backward: CUDA's expf (2 ulp) against glibc's (< 1 ulp), then the same
 * division and 2 or 3 products, and FMA contraction that may differ */
static const double tol_swiglu = 2e-6;
/* matmul: both sides accumulate in fp32 in different orders (cuBLAS's tiles, OpenBLAS's
 * kernels); rounding grows like sqrt(k) eps of the result's scale, so tol = 3e-7 sqrt(k) (2e-5 at
 * k = 5120, with margin), and at least 1e-6. A TF32 product (10-bit mantissa) would err ~100x
 * more: this also catches cuBLAS taking TF32 behind our back. */
static double tol_matmul(int64_t k)
{
    return fmax(1e-6, 3e-7 * sqrt((double)k));
}

/* ------------------------------------------------------------------------------------------
 * The backends, host buffers and GPU buffers of a case
 */

static const ddk_backend *cpu;   /* the reference */
static const ddk_backend *dev;   /* under test: ddk_backend_cuda(0), or the CPU in self-check */
static int verbose;
static uint64_t rng_state;       /* ddk_rng.h's generator, seeded per case */

enum { MAX_BUFFERS = 32, GUARD_BYTES = guard_words * 4 };

static void *host_buffers[MAX_BUFFERS];
static int host_count;

/* bytes of host memory, freed at the end of the case */
static void *host(size_t bytes)
{
    if (host_count == MAX_BUFFERS) {
        fprintf(stderr, "test_backend_ops: more than %d host buffers in one case\n", MAX_BUFFERS);
        abort();
    }
    return host_buffers[host_count++] = xcalloc(bytes, 1);
}

static float *host_floats(int64_t count)
{
    return host((size_t)count * sizeof(float));
}

static float *host_copy(const float *x, int64_t count)
{
    return memcpy(host_floats(count), x, (size_t)count * sizeof(float));
}

static struct dev_buffer {
    unsigned char *base;    /* from ddk_malloc(dev->alloc, total) */
    size_t before, bytes;   /* guard (GUARD_BYTES + misalign), then the buffer, then GUARD_BYTES */
    const char *name;
} dev_buffers[MAX_BUFFERS];
static int dev_count;
static size_t misalign;   /* bytes past a 64-byte boundary at which this case's GPU buffers start */

/* Waits for the device under test (a no-op for the CPU in self-check mode) */
static void dev_sync(void)
{
    ddk_cuda_synchronize(0);
}

/* bytes on the device under test holding src's bytes, or NaN (all bits set) when src is NULL,
 * between guards of sentinel_byte */
static void *dev_buffer(const void *src, size_t bytes, const char *name)
{
    if (dev_count == MAX_BUFFERS) {
        fprintf(stderr, "test_backend_ops: more than %d GPU buffers in one case\n", MAX_BUFFERS);
        abort();
    }
    const size_t before = GUARD_BYTES + misalign, total = before + bytes + GUARD_BYTES;
    unsigned char *base = ddk_malloc(dev->alloc, total);
    if (!base) {
        fprintf(stderr, "test_backend_ops: no %zu bytes on %s for %s\n", total,
                ddk_allocator_device(dev->alloc), name);
        exit(2);
    }
    unsigned char *staging = xcalloc(total, 1);
    memset(staging, sentinel_byte, total);
    if (src)
        memcpy(staging + before, src, bytes);
    else
        memset(staging + before, 0xff, bytes);
    dev->copy(dev, base, staging, total);
    dev_sync();   /* the copy contract: a host source lives until the device is synchronised */
    free(staging);
    dev_buffers[dev_count++] = (struct dev_buffer){ base, before, bytes, name };
    return base + before;
}

static float *dev_floats(const float *src, int64_t count, const char *name)
{
    return dev_buffer(src, (size_t)count * sizeof(float), name);
}

/* count floats at p (on the device under test) into a new host buffer */
static float *download(const float *p, int64_t count)
{
    float *x = host_floats(count);
    dev->copy(dev, x, p, (size_t)count * sizeof(float));
    dev_sync();
    return x;
}

/* The end of a case: every GPU buffer's guards read back and checked, all freed, its line */
static void end_case(const char *name)
{
    for (int j = 0; j < dev_count; j++) {
        const struct dev_buffer *b = &dev_buffers[j];
        const size_t total = b->before + b->bytes + GUARD_BYTES;
        unsigned char *staging = xcalloc(total, 1);
        dev->copy(dev, staging, b->base, total);
        dev_sync();
        size_t hit_before = 0, hit_after = 0;
        for (size_t i = 0; i < b->before; i++)
            hit_before += staging[i] != sentinel_byte;
        for (size_t i = 0; i < GUARD_BYTES; i++)
            hit_after += staging[b->before + b->bytes + i] != sentinel_byte;
        check(hit_before == 0 && hit_after == 0,
              "%s: guard bytes overwritten (%zu before, %zu after its %zu bytes)", b->name,
              hit_before, hit_after, b->bytes);
        free(staging);
        ddk_free(dev->alloc, b->base, total);
    }
    dev_count = 0;
    for (int j = 0; j < host_count; j++)
        free(host_buffers[j]);
    host_count = 0;
    case_done(name);
}

/* ------------------------------------------------------------------------------------------
 * Data and comparisons
 */

static void fill_uniform(float *x, int64_t count, double lo, double hi)
{
    for (int64_t i = 0; i < count; i++)
        x[i] = (float)(lo + (hi - lo) * ddk_rng_uniform(&rng_state));
}

static int64_t rng_below(int64_t n)
{
    return (int64_t)(ddk_rng_next(&rng_state) % (uint64_t)n);
}

/* max|got - want| / max|want| (max|got - want| when want is all 0) within tol; NaN or Inf in
 * either fails */
static void expect_close(const char *what, const float *got, const float *want, int64_t count,
                         double tol)
{
    double num = 0.0, den = 0.0;
    int64_t worst = 0, nonfinite = 0, first_nonfinite = 0;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) {
            if (nonfinite++ == 0)
                first_nonfinite = i;
            continue;
        }
        double diff = fabs((double)got[i] - want[i]);
        if (diff > num) {
            num = diff;
            worst = i;
        }
        den = fmax(den, fabs((double)want[i]));
    }
    double err = den > 0.0 ? num / den : num;
    if (verbose)
        printf("  . %-16s err %.2e  tol %.0e\n", what, err, tol);
    check(nonfinite == 0, "%s: %lld of %lld values not finite, first [%lld]: gpu %g, cpu %g", what,
          (long long)nonfinite, (long long)count, (long long)first_nonfinite,
          (double)got[first_nonfinite], (double)want[first_nonfinite]);
    check(err <= tol, "%s: normalised error %.3g > %.3g (worst [%lld]: gpu %.9g, cpu %.9g)", what,
          err, tol, (long long)worst, (double)got[worst], (double)want[worst]);
}

/* the same bytes (gathers, copies, a deterministic op run twice) */
static void expect_same(const char *what, const void *got, const void *want, size_t bytes)
{
    const unsigned char *g = got, *w = want;
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < bytes; i++)
        if (g[i] != w[i] && differ++ == 0)
            first = i;
    check(differ == 0, "%s: %zu of %zu bytes differ, first at byte %zu", what, differ, bytes,
          first);
}

static char case_name[128];

/* ------------------------------------------------------------------------------------------
 * RMSNorm
 */

static void case_rmsnorm(int64_t rows, int64_t d, int in_place)
{
    snprintf(case_name, sizeof case_name, "rmsnorm rows=%lld d=%lld%s", (long long)rows,
             (long long)d, in_place ? " in place, no rstd" : "");
    const float eps = 1e-6f;
    float *x = host_floats(rows * d), *g = host_floats(d);   /* (rows, d), (d) */
    fill_uniform(x, rows * d, -2.0, 2.0);
    fill_uniform(g, d, 0.5, 1.5);
    float *y = host_floats(rows * d), *rstd = host_floats(rows);
    cpu->rmsnorm(cpu, x, g, rows, d, eps, y, rstd);

    float *x_dev = dev_floats(x, rows * d, "x"), *g_dev = dev_floats(g, d, "g");
    float *y_dev = in_place ? x_dev : dev_floats(NULL, rows * d, "y");
    float *rstd_dev = in_place ? NULL : dev_floats(NULL, rows, "rstd");
    dev->rmsnorm(dev, x_dev, g_dev, rows, d, eps, y_dev, rstd_dev);
    expect_close("y", download(y_dev, rows * d), y, rows * d, tol_rmsnorm);
    if (rstd_dev)
        expect_close("rstd", download(rstd_dev, rows), rstd, rows, tol_rmsnorm);
    end_case(case_name);
}

/* dx, dg start with values (the ADD); the GPU runs twice from the same start and must give the
 * same bits (the dg reduction's order is fixed: ops_cuda.cu) */
static void case_rmsnorm_backward(int64_t rows, int64_t d)
{
    snprintf(case_name, sizeof case_name, "rmsnorm_backward rows=%lld d=%lld", (long long)rows,
             (long long)d);
    const float eps = 1e-6f;
    float *x = host_floats(rows * d), *g = host_floats(d), *dy = host_floats(rows * d);
    fill_uniform(x, rows * d, -2.0, 2.0);
    fill_uniform(g, d, 0.5, 1.5);
    fill_uniform(dy, rows * d, -1.0, 1.0);
    float *y = host_floats(rows * d), *rstd = host_floats(rows);
    cpu->rmsnorm(cpu, x, g, rows, d, eps, y, rstd);
    float *dx0 = host_floats(rows * d), *dg0 = host_floats(d);   /* the gradients' start */
    fill_uniform(dx0, rows * d, -1.0, 1.0);
    fill_uniform(dg0, d, -1.0, 1.0);
    float *dx = host_copy(dx0, rows * d), *dg = host_copy(dg0, d);
    cpu->rmsnorm_backward(cpu, x, g, rstd, dy, rows, d, dx, dg);

    float *x_dev = dev_floats(x, rows * d, "x"), *g_dev = dev_floats(g, d, "g");
    float *rstd_dev = dev_floats(rstd, rows, "rstd"), *dy_dev = dev_floats(dy, rows * d, "dy");
    float *dx_dev = dev_floats(dx0, rows * d, "dx"), *dg_dev = dev_floats(dg0, d, "dg");
    float *dx2_dev = dev_floats(dx0, rows * d, "dx again"), *dg2_dev = dev_floats(dg0, d, "dg again");
    dev->rmsnorm_backward(dev, x_dev, g_dev, rstd_dev, dy_dev, rows, d, dx_dev, dg_dev);
    dev->rmsnorm_backward(dev, x_dev, g_dev, rstd_dev, dy_dev, rows, d, dx2_dev, dg2_dev);
    float *dx_got = download(dx_dev, rows * d), *dg_got = download(dg_dev, d);
    expect_close("dx", dx_got, dx, rows * d, tol_rmsnorm_dx);
    expect_close("dg", dg_got, dg, d, tol_rmsnorm_dg);
    expect_same("dx run twice", download(dx2_dev, rows * d), dx_got, (size_t)(rows * d) * sizeof(float));
    expect_same("dg run twice", download(dg2_dev, d), dg_got, (size_t)d * sizeof(float));
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * RoPE (in place; inverse = the backward)
 */

static void case_rope(int64_t rows, int64_t heads, int64_t d, float theta, int inverse)
{
    snprintf(case_name, sizeof case_name, "rope rows=%lld heads=%lld d=%lld theta=%g%s",
             (long long)rows, (long long)heads, (long long)d, (double)theta,
             inverse ? " inverse" : "");
    const int64_t count = rows * heads * d;
    float *x = host_floats(count);   /* (rows, heads, d) */
    fill_uniform(x, count, -2.0, 2.0);
    int32_t *pos = host((size_t)rows * sizeof(int32_t));   /* (rows): 0 and up to 10^5 */
    for (int64_t r = 0; r < rows; r++)
        pos[r] = r == 0 ? 0 : (int32_t)rng_below(100001);
    float *want = host_copy(x, count);
    cpu->rope(cpu, want, pos, rows, heads, d, theta, inverse);

    float *x_dev = dev_floats(x, count, "x");
    int32_t *pos_dev = dev_buffer(pos, (size_t)rows * sizeof(int32_t), "pos");
    dev->rope(dev, x_dev, pos_dev, rows, heads, d, theta, inverse);
    expect_close("x", download(x_dev, count), want, count, tol_rope);
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * SwiGLU. Gates in [-12, 12]: sigmoid saturates at both ends.
 */

static const char *const swiglu_where[] = { "", " h=gate", " h=up" };

static void case_swiglu(int64_t count, int where)
{
    snprintf(case_name, sizeof case_name, "swiglu count=%lld%s", (long long)count,
             swiglu_where[where]);
    float *gate = host_floats(count), *up = host_floats(count);
    fill_uniform(gate, count, -12.0, 12.0);
    fill_uniform(up, count, -2.0, 2.0);
    float *h = host_floats(count);
    cpu->swiglu(cpu, gate, up, count, h);

    float *gate_dev = dev_floats(gate, count, "gate"), *up_dev = dev_floats(up, count, "up");
    float *h_dev = where == 1 ? gate_dev : where == 2 ? up_dev : dev_floats(NULL, count, "h");
    dev->swiglu(dev, gate_dev, up_dev, count, h_dev);
    expect_close("h", download(h_dev, count), h, count, tol_swiglu);
    end_case(case_name);
}

static void case_swiglu_backward(int64_t count)
{
    snprintf(case_name, sizeof case_name, "swiglu_backward count=%lld", (long long)count);
    float *gate = host_floats(count), *up = host_floats(count), *dh = host_floats(count);
    fill_uniform(gate, count, -12.0, 12.0);
    fill_uniform(up, count, -2.0, 2.0);
    fill_uniform(dh, count, -1.0, 1.0);
    float *dgate0 = host_floats(count), *dup0 = host_floats(count);   /* the gradients' start */
    fill_uniform(dgate0, count, -1.0, 1.0);
    fill_uniform(dup0, count, -1.0, 1.0);
    float *dgate = host_copy(dgate0, count), *dup = host_copy(dup0, count);
    cpu->swiglu_backward(cpu, gate, up, dh, count, dgate, dup);

    float *gate_dev = dev_floats(gate, count, "gate"), *up_dev = dev_floats(up, count, "up");
    float *dh_dev = dev_floats(dh, count, "dh");
    float *dgate_dev = dev_floats(dgate0, count, "dgate"), *dup_dev = dev_floats(dup0, count, "dup");
    dev->swiglu_backward(dev, gate_dev, up_dev, dh_dev, count, dgate_dev, dup_dev);
    expect_close("dgate", download(dgate_dev, count), dgate, count, tol_swiglu);
    expect_close("dup", download(dup_dev, count), dup, count, tol_swiglu);
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * Embedding (a gather: exact)
 */

static void case_embedding(int64_t rows, int64_t H, int64_t V)
{
    snprintf(case_name, sizeof case_name, "embedding rows=%lld H=%lld V=%lld", (long long)rows,
             (long long)H, (long long)V);
    float *table = host_floats(V * H);   /* (V, H) */
    fill_uniform(table, V * H, -1.0, 1.0);
    int32_t *tokens = host((size_t)rows * sizeof(int32_t));   /* (rows): both ends of [0, V) */
    for (int64_t r = 0; r < rows; r++)
        tokens[r] = (int32_t)(r == 0 ? V - 1 : r == rows - 1 ? 0 : rng_below(V));
    float *out = host_floats(rows * H);
    cpu->embedding(cpu, table, tokens, rows, H, out);

    float *table_dev = dev_floats(table, V * H, "table");
    int32_t *tokens_dev = dev_buffer(tokens, (size_t)rows * sizeof(int32_t), "tokens");
    float *out_dev = dev_floats(NULL, rows * H, "out");
    dev->embedding(dev, table_dev, tokens_dev, rows, H, out_dev);
    expect_same("out", download(out_dev, rows * H), out, (size_t)(rows * H) * sizeof(float));
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * Matrix product. Row strides pad past the row (the padding must stay as it was: a write there
 * is out of bounds within the buffer); beta = 0 starts c as NaN (BLAS never reads c then).
 */

typedef struct {
    int64_t m, n, k;
    int trans_a, trans_b;
    int64_t pad;          /* added to every leading dimension */
    float alpha, beta;
} matmul_shape;

static void case_matmul(const matmul_shape *s)
{
    snprintf(case_name, sizeof case_name, "matmul %lldx%lldx%lld %c%c pad=%lld alpha=%g beta=%g",
             (long long)s->m, (long long)s->n, (long long)s->k, s->trans_a ? 'T' : 'N',
             s->trans_b ? 'T' : 'N', (long long)s->pad, (double)s->alpha, (double)s->beta);
    /* a as stored: (m, k), or (k, m) when trans_a; b: (k, n), or (n, k) when trans_b */
    const int64_t a_rows = s->trans_a ? s->k : s->m, a_cols = s->trans_a ? s->m : s->k;
    const int64_t b_rows = s->trans_b ? s->n : s->k, b_cols = s->trans_b ? s->k : s->n;
    const int64_t lda = a_cols + s->pad, ldb = b_cols + s->pad, ldc = s->n + s->pad;
    float *a = host_floats(a_rows * lda), *b = host_floats(b_rows * ldb);
    float *c0 = host_floats(s->m * ldc);   /* c's start */
    fill_uniform(a, a_rows * lda, -1.0, 1.0);
    fill_uniform(b, b_rows * ldb, -1.0, 1.0);
    fill_uniform(c0, s->m * ldc, -1.0, 1.0);
    if (s->beta == 0.0f)
        for (int64_t i = 0; i < s->m; i++)
            for (int64_t j = 0; j < s->n; j++)
                c0[i * ldc + j] = NAN;
    float *c = host_copy(c0, s->m * ldc);
    cpu->matmul(cpu, s->trans_a, s->trans_b, s->m, s->n, s->k, s->alpha, a, lda, b, ldb, s->beta,
                c, ldc);

    float *a_dev = dev_floats(a, a_rows * lda, "a"), *b_dev = dev_floats(b, b_rows * ldb, "b");
    float *c_dev = dev_floats(c0, s->m * ldc, "c");
    dev->matmul(dev, s->trans_a, s->trans_b, s->m, s->n, s->k, s->alpha, a_dev, lda, b_dev, ldb,
                s->beta, c_dev, ldc);
    float *got = download(c_dev, s->m * ldc);
    /* the (m, n) block by normalised error, the padding exactly as it started */
    float *got_block = host_floats(s->m * s->n), *want_block = host_floats(s->m * s->n);
    int64_t pad_changed = 0;
    for (int64_t i = 0; i < s->m; i++) {
        memcpy(got_block + i * s->n, got + i * ldc, (size_t)s->n * sizeof(float));
        memcpy(want_block + i * s->n, c + i * ldc, (size_t)s->n * sizeof(float));
        pad_changed += memcmp(got + i * ldc + s->n, c0 + i * ldc + s->n,
                              (size_t)s->pad * sizeof(float)) != 0;
    }
    expect_close("c", got_block, want_block, s->m * s->n, tol_matmul(s->k));
    check(pad_changed == 0, "c: the padding of %lld rows was written", (long long)pad_changed);
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * Memory: copy host -> GPU -> GPU -> host and zero, at odd byte counts and offsets (exact)
 */

static void case_copy_zero(size_t bytes)
{
    snprintf(case_name, sizeof case_name, "copy+zero bytes=%zu offset=%zu", bytes, misalign);
    unsigned char *src = host(bytes);
    for (size_t i = 0; i < bytes; i++)
        src[i] = (unsigned char)ddk_rng_next(&rng_state);
    unsigned char *first = dev_buffer(NULL, bytes, "copy's first"),
                  *second = dev_buffer(NULL, bytes, "copy's second");
    dev->copy(dev, first, src, bytes);      /* host -> GPU */
    dev->copy(dev, second, first, bytes);   /* GPU -> GPU */
    unsigned char *back = host(bytes);
    dev->copy(dev, back, second, bytes);    /* GPU -> host */
    dev_sync();
    expect_same("copied", back, src, bytes);
    dev->zero(dev, second, bytes);
    dev->copy(dev, back, second, bytes);
    dev_sync();
    unsigned char *zeros = host(bytes);
    expect_same("zeroed", back, zeros, bytes);
    end_case(case_name);
}

/* ------------------------------------------------------------------------------------------
 * The table: tiny, odd, unaligned and large shapes
 */

static const int64_t norm_rows[] = { 1, 3, 17, 1000 };
static const int64_t norm_d[] = { 2, 6, 64, 130, 5120 };

static const struct { int64_t rows, heads, d; } rope_shapes[] = {
    { 1, 1, 2 }, { 3, 2, 6 }, { 17, 4, 64 }, { 5, 3, 130 }, { 1000, 8, 128 }, { 7, 2, 1024 },
};

static const int64_t swiglu_counts[] = { 1, 3, 17, 1000, 1000003 };

static const struct { int64_t rows, H, V; } embedding_shapes[] = {
    { 1, 2, 3 }, { 3, 6, 5 }, { 4, 64, 1 }, { 17, 130, 1000 }, { 1000, 5120, 300 },
};

static const matmul_shape matmul_shapes[] = {
    { 1, 1, 1, 0, 0, 0, 1.0f, 0.0f },
    { 3, 5, 7, 0, 0, 3, 0.5f, 0.25f },
    { 3, 5, 7, 1, 0, 3, 0.5f, 0.25f },
    { 3, 5, 7, 0, 1, 3, 0.5f, 0.25f },
    { 3, 5, 7, 1, 1, 3, 0.5f, 0.25f },
    { 17, 33, 65, 0, 0, 1, 1.0f, 1.0f },
    { 17, 33, 65, 1, 0, 1, 1.0f, 0.0f },
    { 17, 33, 65, 0, 1, 1, -1.0f, 1.0f },
    { 17, 33, 65, 1, 1, 1, 0.75f, -0.5f },
    { 130, 64, 2, 0, 1, 0, 1.0f, 0.0f },
    { 1000, 130, 64, 1, 0, 5, 1.0f, 1.0f },
    { 1, 4096, 5120, 0, 1, 0, 1.0f, 0.0f },        /* one token through a projection */
    /* a training step's three products at Qwen3-8B-like widths: y = x W^T, dx = dy W, dW = dy^T x */
    { 1024, 4096, 5120, 0, 1, 0, 1.0f, 0.0f },
    { 1024, 5120, 4096, 0, 0, 0, 1.0f, 1.0f },
    { 4096, 5120, 1024, 1, 0, 0, 1.0f, 1.0f },
};

int main(void)
{
    const char *v = getenv("DDTREE_OPS_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const char *self = getenv("DDTREE_BACKEND_OPS_SELF_CHECK");
    const int self_check = self && *self && strcmp(self, "0") != 0;

    cpu = ddk_backend_cpu();
    if (self_check) {
        dev = cpu;
        printf("self-check: the CPU backend in the GPU's place\n");
    } else {
        if (!ddk_has_cuda() || ddk_cuda_device_count() == 0) {
            printf("SKIPPED: no GPU\n");
            return 77;
        }
        dev = ddk_backend_cuda(0);
        ddk_device_info info;
        if (ddk_cuda_device_info(0, &info) == 0)
            printf("cuda:0 %s, sm_%d\n", info.name, info.compute_capability);
        check(dev != NULL, "ddk_backend_cuda(0) is NULL with %d GPU(s)", ddk_cuda_device_count());
        if (dev) {
            check(strcmp(dev->name, "cuda") == 0, "name is \"%s\"", dev->name);
            check(dev->alloc == ddk_allocator_cuda(0), "alloc is not ddk_allocator_cuda(0)");
        }
        check(ddk_backend_cuda(-1) == NULL && ddk_backend_cuda(ddk_cuda_device_count()) == NULL,
              "a backend for a GPU that does not exist");
    }
    check(dev && dev->zero && dev->copy && dev->matmul && dev->rmsnorm && dev->rmsnorm_backward &&
              dev->rope && dev->swiglu && dev->swiglu_backward && dev->embedding,
          "an op tested here is NULL");
    case_done("backend table");
    if (cases_failed)
        return cases_summary();

    /* every case reseeds, so each is reproducible on its own; odd cases run 4 bytes off */
    uint64_t seq = 0;
#define NEXT_CASE() (rng_state = 0x5eed0000u + seq, misalign = (seq++ % 2) * 4)
    for (size_t i = 0; i < sizeof norm_rows / sizeof norm_rows[0]; i++)
        for (size_t j = 0; j < sizeof norm_d / sizeof norm_d[0]; j++) {
            NEXT_CASE();
            case_rmsnorm(norm_rows[i], norm_d[j], 0);
        }
    NEXT_CASE();
    case_rmsnorm(17, 130, 1);
    for (size_t i = 0; i < sizeof norm_rows / sizeof norm_rows[0]; i++)
        for (size_t j = 0; j < sizeof norm_d / sizeof norm_d[0]; j++) {
            NEXT_CASE();
            case_rmsnorm_backward(norm_rows[i], norm_d[j]);
        }
    for (size_t i = 0; i < sizeof rope_shapes / sizeof rope_shapes[0]; i++)
        for (int inverse = 0; inverse <= 1; inverse++) {
            NEXT_CASE();
            case_rope(rope_shapes[i].rows, rope_shapes[i].heads, rope_shapes[i].d,
                      i % 2 ? 1e6f : 1e4f, inverse);
        }
    for (size_t i = 0; i < sizeof swiglu_counts / sizeof swiglu_counts[0]; i++) {
        for (int where = 0; where < 3; where++) {
            NEXT_CASE();
            case_swiglu(swiglu_counts[i], where);
        }
        NEXT_CASE();
        case_swiglu_backward(swiglu_counts[i]);
    }
    for (size_t i = 0; i < sizeof embedding_shapes / sizeof embedding_shapes[0]; i++) {
        NEXT_CASE();
        case_embedding(embedding_shapes[i].rows, embedding_shapes[i].H, embedding_shapes[i].V);
    }
    for (size_t i = 0; i < sizeof matmul_shapes / sizeof matmul_shapes[0]; i++) {
        NEXT_CASE();
        case_matmul(&matmul_shapes[i]);
    }
    static const size_t copy_bytes[] = { 1, 3, 17, 4097, ((size_t)1 << 20) + 5 };
    for (size_t i = 0; i < sizeof copy_bytes / sizeof copy_bytes[0]; i++) {
        NEXT_CASE();
        misalign = i % 3;   /* byte offsets 0, 1, 2: copies and memsets are byte-granular */
        case_copy_zero(copy_bytes[i]);
    }
#undef NEXT_CASE
    return cases_summary();
}
