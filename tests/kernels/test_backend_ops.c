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
 * The ops: zero, copy, synchronize (every download waits through it), matmul, matmul_bf16 (on
 * fp32 values, and on bf16 values where nothing is rounded; both at k = 0: beta c exactly),
 * rmsnorm (+ backward), rope, swiglu (+ backward), embedding, DFlash and causal attention
 * (+ backward: out, lse, dq, dk, dv; with both CUDA kernel sets, the tensor-core flash ones
 * also at their tile shapes and run twice for the same bits: ddk_cuda_set_attention_kernels;
 * DFlash2's bidirectional blocks under sliding windows with both sets), the DFlash2 drafter's
 * block_conv (+ backward from gradients with values: one side of a projection's rows, the other
 * side and the padding untouched, dx NULL, run twice for the same bits),
 * the fused loss (every result field, l_i and the gradient, both memory modes, fp32 and bf16
 * products, a bf16 head read in place across the loss's panels of rows and of k, workspace =
 * ddk_loss_workspace_bytes, refusals with nothing written; with the DFlash2 selector strict and
 * inject, stop_gradient, weight 0.5, both modes, fp32, bf16 products and a bf16 head: its result
 * fields, l_i, d hs and dA, dBs, dHp ADDED into their values, run twice for the same bits),
 * topk_rows (indices and values bit for bit the CPU's: ties, NaNs, -inf, the seed's vocabulary),
 * logsumexp_rows (lse and lp against a float64 reference from each row's max, relative 1e-6 of
 * max(1, |want|): rows with NaNs and -infs, of only -inf and NaN, with +inf, with +-1e30 and of
 * values near 1000 where a plain sum of exp overflows, constant rows; col -1, at a NaN, -inf
 * and +inf; n = 1 to the seed's vocabulary; again with lp and col NULL, the same lse) and the
 * whole-buffer ops sumsq (run twice: the same bits), axpby (beta = 0 over NaN, in place), adamw
 * (its bf16 copy w16 bit for bit each side's new w rounded to nearest even; the update without
 * the copy the same bits) and uniform_noise (bit for bit the CPU's), with sumsq and axpby past
 * 2^31 elements (2^24 in self-check mode), and the Qwen3.5 target's forward-only ops
 * (conv1d_silu with and without history, gated_rmsnorm also in place, rope_partial with rd = d
 * bit for bit the backend's own rope, gated_delta's recurrence and chunked form, the chunked
 * form also against the backend's own recurrence, and its refusals), and the frozen target's matmul_w16 and matmul_w16_nn (bf16
 * weights as stored, W transposed or not: across scratch panels of rows and of k, k = 0),
 * embedding_w16 and copy_rows (exact;
 * copy_rows also from the host), l2norm_heads, sigmoid_mul and delta_gates (also in place) and
 * causal attention over a cache (q_rows 1, 5, S, 0 of S keys; q_rows > S refused), tree
 * attention (random and deep trees, with and without a cache; a node its own parent: -EINVAL on
 * the CPU, NaN rows on the GPU), each reported
 * "SKIPPED: OP not implemented on CUDA yet" should a table leave it NULL; and the bf16 step's
 * matmul_16 (both operands bf16 as stored, NaN padding never read: four transposes, odd shapes,
 * beta 0 over NaN, past the CPU's 256-column panel, the drafter's products at a scaled-down
 * width, 1000 x 130 x 5000, k = 0, an empty c) and round_bf16 (the CPU's bits at every non-NaN
 * input: ties of either lsb, +-0, subnormals, +-inf, FLT_MAX and the overflow tie to inf, every
 * high half; NaN stays NaN; counts 1 to 2^20 + 3). The backward of each op is checked against
 * finite differences by tests/kernels/test_ops.c on the CPU; here the GPU has to match the CPU.
 *
 * First, on every machine, the CPU backend's own logsumexp_rows against the same float64
 * reference, relative 1e-6 (its sums are double); the rest is the GPU's: skipped (exit 77,
 * "SKIPPED: no GPU", or exit 1 should a CPU case have failed) when libddk has no CUDA or the
 * machine no GPU, never reported as passed. DDTREE_BACKEND_OPS_SELF_CHECK=1 runs every case
 * with the CPU backend in the GPU's place, a check of this test's own plumbing on a machine
 * without a GPU (every comparison is then exact, logsumexp_rows' within tol_lse). DDTREE_OPS_VERBOSE=1 prints each error next to its tolerance.
 * DDTREE_BACKEND_OPS_SMALL=1 runs the past-2^31 case at 2^24 + 5 elements instead (8 GiB is more
 * than compute-sanitizer's memcheck, which tracks every byte, can take in the check's time).
 *
 * ctest: label gpu; one line per case; a final "N passed, M failed"; exit 1 when a case failed.
 *
 * Legend: rows independent vectors (tokens, or tokens * heads), d values per vector (head dim
 * for rope), heads per row (rope), count elements (swiglu), V vocabulary, H hidden size, and
 * (m, n, k) for c (m, n) = alpha op(a) (m, k) op(b) (k, n) + beta c.
 */
#include "ddk.h"
#include "ddk_bf16.h"
#include "check.h"
#include "ddk_rng.h"

#include <errno.h>
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
/* matmul_bf16 on fp32 values, per element relative to |alpha| sum_k |a_ik||b_kj| + |beta c_ij|
 * (what the roundings act on): the CPU rounds both operands to the nearest bf16 (2^-8 of each at
 * most), so each of its products is within 2 2^-8 + 2^-16 of the exact one. cuBLAS's conversion
 * is undocumented and its header lets it take TF32 instead (2^-10 per operand even truncated,
 * 2^-9 per product); rounding to nearest as the CPU does, it gives the CPU's operands and the two
 * differ by fp32 sums alone. At worst the bounds add: 2^-7 + 2^-9 + 2^-16, plus the fp32 sums
 * (tol_matmul). Layouts and transposes are checked tightly by the bf16-exact cases: with operands
 * that are bf16 values nothing is rounded and the fp32 tol_matmul(k) holds. */
static double tol_matmul_bf16(int64_t k)
{
    return ldexp(1.0, -7) + ldexp(1.0, -9) + ldexp(1.0, -16) + tol_matmul(k);
}
/* sumsq, relative: each square is exact in double (a 48-bit product) and a double sum of
 * non-negative terms errs by at most (count - 1) 2^-53 of itself in any order, 1.1e-10 on each
 * side at 10^6 + 3 terms; 1e-9 covers both up to 4.5e6 terms. A float accumulator would err by
 * 1e-7 and more. */
static const double tol_sumsq = 1e-9;
/* axpby with beta != 0, per element relative to |alpha x| + |beta y|: each side rounds the two
 * products and the sum, or fuses one product into the sum (FMA), ~2 2^-24 of that scale each.
 * With beta = 0 both sides round the one product alpha x: the same bits. */
static const double tol_axpby = 3e-7;
/* adamw, each of w, m, v normalised by its max: the same float operations in the same order on
 * both sides, FMA contraction aside (a few roundings, ~4 2^-24 of m's and v's scale); w's update
 * (lr = 1e-2) carries the direction's few-ulp error times lr, below w's own last bit. g is one
 * product on both sides: the same bits. */
static const double tol_adamw = 1e-6;

/* logsumexp_rows, lse and lp per row against the float64 reference, |got - want| <= tol_lse
 * max(least, |want|) (infinities exactly). The CPU sums exp in double and rounds once (6e-8 of
 * |want|): relative, least 0. The GPU's terms are expf's (2 ulp, 2.4e-7 of each) summed in
 * double, so its log s errs by up to ~2.4e-7 absolute before the rounding: least 1. */
static const double tol_lse = 1e-6;

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

/* Waits for the device under test through its table's synchronize (a no-op for the CPU in
 * self-check mode): every download relies on it */
static void dev_sync(void)
{
    dev->synchronize(dev);
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

/* count bf16 bit patterns at p (on the device under test) into a new host buffer */
static uint16_t *download16(const uint16_t *p, int64_t count)
{
    uint16_t *x = host((size_t)count * sizeof(uint16_t));
    dev->copy(dev, x, p, (size_t)count * sizeof(uint16_t));
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
    if (count == 0)   /* nothing to compare (and the messages below read element 0) */
        return;
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

/* max over elements of |got - want| / scale, scale (> 0, or 0 where want must be exact) the sum
 * of the magnitudes of the terms behind each value; NaN or Inf in either fails */
static void expect_close_scaled(const char *what, const float *got, const float *want,
                                const float *scale, int64_t count, double tol)
{
    if (count == 0)   /* as expect_close */
        return;
    double err = 0.0;
    int64_t worst = 0, nonfinite = 0;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) {
            nonfinite++;
            continue;
        }
        const double diff = fabs((double)got[i] - want[i]);
        const double e = diff == 0.0 ? 0.0 : scale[i] > 0.0f ? diff / scale[i] : INFINITY;
        if (e > err) {
            err = e;
            worst = i;
        }
    }
    if (verbose)
        printf("  . %-16s err %.2e  tol %.0e\n", what, err, tol);
    check(nonfinite == 0, "%s: %lld of %lld values not finite", what, (long long)nonfinite,
          (long long)count);
    check(err <= tol,
          "%s: error %.3g of the terms' scale > %.3g (worst [%lld]: gpu %.9g, cpu %.9g, scale %.3g)",
          what, err, tol, (long long)worst, (double)got[worst], (double)want[worst],
          (double)scale[worst]);
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
 * Matrix products (matmul, and matmul_bf16 on fp32 values and on bf16 values). Row strides pad
 * past the row (the padding must stay as it was: a write there is out of bounds within the
 * buffer); beta = 0 starts c as NaN (BLAS never reads c then).
 */

enum { MATMUL_FP32, MATMUL_BF16, MATMUL_BF16_EXACT };   /* the op, and its operands */
static const char *const matmul_mode_name[] = { "matmul", "matmul_bf16",
                                                "matmul_bf16 bf16-values" };

static void round_bf16(float *x, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        x[i] = ddk_round_bf16(x[i]);
}

static float *abs_copy(const float *x, int64_t count)
{
    float *y = host_floats(count);
    for (int64_t i = 0; i < count; i++)
        y[i] = fabsf(x[i]);
    return y;
}

typedef struct {
    int64_t m, n, k;
    int trans_a, trans_b;
    int64_t pad;          /* added to every leading dimension */
    float alpha, beta;
} matmul_shape;

/* A product's c (m rows, row stride ldc) from the device (got) and the CPU (want): their (m, n)
 * blocks into new host buffers for the caller's comparison, and every row's padding past
 * column n checked to be exactly as it started (c0) */
static void c_blocks(const float *got, const float *want, const float *c0, int64_t m, int64_t n,
                     int64_t ldc, float **got_block, float **want_block)
{
    *got_block = host_floats(m * n), *want_block = host_floats(m * n);
    int64_t pad_changed = 0;
    for (int64_t i = 0; i < m; i++) {
        memcpy(*got_block + i * n, got + i * ldc, (size_t)n * sizeof(float));
        memcpy(*want_block + i * n, want + i * ldc, (size_t)n * sizeof(float));
        pad_changed += memcmp(got + i * ldc + n, c0 + i * ldc + n, (size_t)(ldc - n) * sizeof(float)) != 0;
    }
    check(pad_changed == 0, "c: the padding of %lld rows was written", (long long)pad_changed);
}

static void case_matmul(const matmul_shape *s, int mode)
{
    snprintf(case_name, sizeof case_name, "%s %lldx%lldx%lld %c%c pad=%lld alpha=%g beta=%g",
             matmul_mode_name[mode], (long long)s->m, (long long)s->n, (long long)s->k,
             s->trans_a ? 'T' : 'N', s->trans_b ? 'T' : 'N', (long long)s->pad, (double)s->alpha,
             (double)s->beta);
    /* a as stored: (m, k), or (k, m) when trans_a; b: (k, n), or (n, k) when trans_b */
    const int64_t a_rows = s->trans_a ? s->k : s->m, a_cols = s->trans_a ? s->m : s->k;
    const int64_t b_rows = s->trans_b ? s->n : s->k, b_cols = s->trans_b ? s->k : s->n;
    const int64_t lda = a_cols + s->pad, ldb = b_cols + s->pad, ldc = s->n + s->pad;
    float *a = host_floats(a_rows * lda), *b = host_floats(b_rows * ldb);
    float *c0 = host_floats(s->m * ldc);   /* c's start */
    fill_uniform(a, a_rows * lda, -1.0, 1.0);
    fill_uniform(b, b_rows * ldb, -1.0, 1.0);
    fill_uniform(c0, s->m * ldc, -1.0, 1.0);
    if (mode == MATMUL_BF16_EXACT) {
        round_bf16(a, a_rows * lda);
        round_bf16(b, b_rows * ldb);
    }
    if (s->beta == 0.0f)
        for (int64_t i = 0; i < s->m; i++)
            for (int64_t j = 0; j < s->n; j++)
                c0[i * ldc + j] = NAN;
    float *c = host_copy(c0, s->m * ldc);
    (mode == MATMUL_FP32 ? cpu->matmul : cpu->matmul_bf16)(cpu, s->trans_a, s->trans_b, s->m, s->n,
                                                           s->k, s->alpha, a, lda, b, ldb, s->beta,
                                                           c, ldc);

    float *a_dev = dev_floats(a, a_rows * lda, "a"), *b_dev = dev_floats(b, b_rows * ldb, "b");
    float *c_dev = dev_floats(c0, s->m * ldc, "c");
    (mode == MATMUL_FP32 ? dev->matmul : dev->matmul_bf16)(dev, s->trans_a, s->trans_b, s->m, s->n,
                                                           s->k, s->alpha, a_dev, lda, b_dev, ldb,
                                                           s->beta, c_dev, ldc);
    float *got = download(c_dev, s->m * ldc);
    /* the (m, n) block by normalised error, the padding exactly as it started */
    float *got_block, *want_block;
    c_blocks(got, c, c0, s->m, s->n, ldc, &got_block, &want_block);
    if (mode == MATMUL_BF16) {
        /* scale (m, n) = |alpha| |op(a)| |op(b)| + |beta| |c0| (fp32: a scale need not be exact) */
        float *scale = host_floats(s->m * s->n);
        if (s->beta != 0.0f)
            for (int64_t i = 0; i < s->m; i++)
                for (int64_t j = 0; j < s->n; j++)
                    scale[i * s->n + j] = fabsf(c0[i * ldc + j]);
        cpu->matmul(cpu, s->trans_a, s->trans_b, s->m, s->n, s->k, fabsf(s->alpha),
                    abs_copy(a, a_rows * lda), lda, abs_copy(b, b_rows * ldb), ldb,
                    fabsf(s->beta), scale, s->n);
        expect_close_scaled("c", got_block, want_block, scale, s->m * s->n,
                            tol_matmul_bf16(s->k));
    } else {
        expect_close("c", got_block, want_block, s->m * s->n, tol_matmul(s->k));
    }
    if (s->k == 0)   /* nothing summed: beta c is one rounding on both sides, 0 for beta = 0 */
        expect_same("c (k = 0: beta c)", got_block, want_block,
                    (size_t)(s->m * s->n) * sizeof(float));
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
 * Whole buffers: sumsq, axpby, adamw (the trainer's gradient reduction and optimiser)
 */

/* the indices of the CPU's exactly: uniform rows with a planted tie for the maximum (the lower
 * index wins), NaNs sprinkled (passed over), and last a row of only -inf and NaN (0) */
static void case_argmax_rows(int64_t rows, int64_t n)
{
    snprintf(case_name, sizeof case_name, "argmax_rows rows=%lld n=%lld", (long long)rows, (long long)n);
    float *x = host_floats(rows * n);
    fill_uniform(x, rows * n, -4.0, 4.0);
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;
        row[(r * 7919) % n] = 9.0f, row[(r * 104729 + n / 2) % n] = 9.0f;   /* a tie (or one 9) */
        row[(r * 31) % n] = NAN;
        if (r == rows - 1 && rows > 1)
            for (int64_t j = 0; j < n; j++)
                row[j] = j % 3 ? -INFINITY : NAN;
    }
    int32_t *want = xcalloc((size_t)rows, sizeof(int32_t));
    cpu->argmax_rows(cpu, x, rows, n, want);
    const float *x_dev = dev_floats(x, rows * n, "x");
    int32_t *out_dev = dev_buffer(NULL, (size_t)rows * sizeof(int32_t), "out"), *got = xcalloc((size_t)rows, sizeof(int32_t));
    dev->argmax_rows(dev, x_dev, rows, n, out_dev);
    dev->copy(dev, got, out_dev, (size_t)rows * sizeof(int32_t));
    dev_sync();
    expect_same("indices", got, want, (size_t)rows * sizeof(int32_t));
    check(rows < 2 || want[rows - 1] == 0, "cpu: a row of -inf and NaN gave %d, not 0", (int)want[rows - 1]);
    free(want), free(got);
    end_case(case_name);
}

/* the indices and values of the CPU's exactly (topk_row.h's order on both sides): values of few
 * levels (ties everywhere), NaNs and -infs sprinkled, the last row all NaN (its first k by index)
 * when rows > 1 */
static void case_topk_rows(int64_t rows, int64_t n, int64_t k)
{
    snprintf(case_name, sizeof case_name, "topk_rows rows=%lld n=%lld k=%lld", (long long)rows,
             (long long)n, (long long)k);
    float *x = host_floats(rows * n);
    for (int64_t i = 0; i < rows * n; i++) {
        const double u = ddk_rng_uniform(&rng_state);
        x[i] = u < 0.03 ? NAN : u < 0.06 ? -INFINITY : (float)rng_below(40) * 0.25f;
    }
    if (rows > 1)
        for (int64_t j = 0; j < n; j++)
            x[(rows - 1) * n + j] = NAN;
    int32_t *want_i = host((size_t)(rows * k) * sizeof(int32_t));
    float *want_v = host_floats(rows * k);
    cpu->topk_rows(cpu, x, rows, n, k, want_i, want_v);
    const float *x_dev = dev_floats(x, rows * n, "x");
    int32_t *idx_dev = dev_buffer(NULL, (size_t)(rows * k) * sizeof(int32_t), "idx");
    int32_t *idx2_dev = dev_buffer(NULL, (size_t)(rows * k) * sizeof(int32_t), "idx (val NULL)");
    float *val_dev = dev_floats(NULL, rows * k, "val");
    dev->topk_rows(dev, x_dev, rows, n, k, idx_dev, val_dev);
    dev->topk_rows(dev, x_dev, rows, n, k, idx2_dev, NULL);
    int32_t *got_i = host((size_t)(rows * k) * sizeof(int32_t));
    dev->copy(dev, got_i, idx_dev, (size_t)(rows * k) * sizeof(int32_t));
    dev_sync();
    expect_same("indices", got_i, want_i, (size_t)(rows * k) * sizeof(int32_t));
    expect_same("values", download(val_dev, rows * k), want_v, (size_t)(rows * k) * sizeof(float));
    dev->copy(dev, got_i, idx2_dev, (size_t)(rows * k) * sizeof(int32_t));
    dev_sync();
    expect_same("indices with val NULL", got_i, want_i, (size_t)(rows * k) * sizeof(int32_t));
    end_case(case_name);
}

/* logsumexp_rows' inputs: x (rows, n) and col (rows), each row one of six kinds by r % 6:
 * uniform in [-8, 8] with NaNs and -infs sprinkled (col at a planted NaN or -inf every few such
 * rows); only -inf and NaN; with +inf (two where n > 1; col at one, or next to it); with
 * +-1e30 at every 7th column (a sum of exp from 0 overflows); uniform in [1000, 1010] (exp
 * overflows even in double); constant 2.5 (every term exactly 1). col -1 where r % 4 == 3. */
static void lse_inputs(float *x, int64_t rows, int64_t n, int32_t *col)
{
    for (int64_t r = 0; r < rows; r++) {
        float *row = x + r * n;   /* (n) */
        const int kind = (int)(r % 6), turn = (int)(r / 6 % 3);
        col[r] = r % 4 == 3 ? -1 : (int32_t)rng_below(n);
        for (int64_t j = 0; j < n; j++) {
            const double u = ddk_rng_uniform(&rng_state);
            row[j] = u < 0.03   ? NAN
                     : u < 0.06 ? -INFINITY
                                : (float)(-8.0 + 16.0 * ddk_rng_uniform(&rng_state));
            if (kind == 1)
                row[j] = j % 3 ? -INFINITY : NAN;
            else if (kind == 3 && j % 7 == 0)
                row[j] = j / 7 % 2 ? -1e30f : 1e30f;
            else if (kind == 4)
                row[j] = (float)(1000.0 + 10.0 * u);
            else if (kind == 5)
                row[j] = 2.5f;
        }
        if (kind == 0 && turn > 0 && col[r] >= 0)
            row[col[r]] = turn == 1 ? NAN : -INFINITY;
        if (kind == 2) {
            const int64_t at = rng_below(n);
            row[at] = row[(at + n / 2) % n] = INFINITY;
            col[r] = (int32_t)(turn == 1 ? (at + 1) % n : at);
        }
    }
}

/* The float64 reference of one row x (n), ddk.h's contract read plainly: the max m over the
 * numbers; s = the sum over the numbers of exp(x - m), or with m = +inf the count of its +infs;
 * lse = m + log s, lp = (x[col] - m) - log s (-inf for a NaN there, a col outside [0, n), or a
 * row of only -inf and NaN) */
static void lse_reference(const float *x, int64_t n, int32_t col, double *lse, double *lp)
{
    double m = -INFINITY, s = 0.0;
    for (int64_t j = 0; j < n; j++)
        if (!isnan(x[j]) && x[j] > m)
            m = x[j];
    for (int64_t j = 0; j < n; j++)
        if (!isnan(x[j]))
            s += isinf(m) ? (x[j] == m) : exp((double)x[j] - m);
    *lse = m == -INFINITY ? -INFINITY : m + log(s);
    if (m == -INFINITY || col < 0 || col >= n || isnan(x[col]))
        *lp = -INFINITY;
    else if (isinf(m))
        *lp = x[col] == m ? -log(s) : -INFINITY;
    else
        *lp = ((double)x[col] - m) - log(s);
}

/* got (count) against want (count): infinities exactly, else |got - want| <= tol_lse
 * max(least, |want|); NaN fails */
static void expect_lse(const char *what, const float *got, const double *want, int64_t count,
                       double least)
{
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < count; i++) {
        const double diff = fabs((double)got[i] - want[i]);
        const double e = isinf(want[i]) ? (got[i] == want[i] ? 0.0 : INFINITY)
                         : diff == 0.0  ? 0.0   /* want 0 exactly at least 0 */
                                        : diff / fmax(least, fabs(want[i]));
        if (isnan(e) || e > worst)   /* a NaN got: the worst there is */
            worst = isnan(e) ? INFINITY : e, at = i;
    }
    if (verbose)
        printf("  . %-16s err %.2e  tol %.0e\n", what, worst, tol_lse);
    check(worst <= tol_lse, "%s: error %.3g > %.3g (worst [%lld]: got %.9g, want %.17g)", what, worst,
          tol_lse, (long long)at, (double)got[at], want[at]);
}

/* x (rows, n), col (rows) of lse_inputs and their references want_lse, want_lp (rows), in this
 * case's host buffers */
static void lse_case_data(int64_t rows, int64_t n, float **x, int32_t **col, double **want_lse,
                          double **want_lp)
{
    *x = host_floats(rows * n);
    *col = host((size_t)rows * sizeof(int32_t));
    *want_lse = host((size_t)rows * sizeof(double));
    *want_lp = host((size_t)rows * sizeof(double));
    lse_inputs(*x, rows, n, *col);
    for (int64_t r = 0; r < rows; r++)
        lse_reference(*x + r * n, n, (*col)[r], *want_lse + r, *want_lp + r);
}

/* the CPU backend's logsumexp_rows (host memory) against the reference, relative; outputs start
 * as NaN; again with lp and col NULL: the same lse bits */
static void case_logsumexp_rows_cpu(int64_t rows, int64_t n)
{
    snprintf(case_name, sizeof case_name, "logsumexp_rows cpu rows=%lld n=%lld", (long long)rows,
             (long long)n);
    float *x;
    int32_t *col;
    double *want_lse, *want_lp;
    lse_case_data(rows, n, &x, &col, &want_lse, &want_lp);
    float *lse = host_floats(rows), *lp = host_floats(rows), *lse2 = host_floats(rows);
    for (int64_t r = 0; r < rows; r++)
        lse[r] = lp[r] = lse2[r] = NAN;
    cpu->logsumexp_rows(cpu, x, rows, n, col, lse, lp);
    cpu->logsumexp_rows(cpu, x, rows, n, NULL, lse2, NULL);
    expect_lse("lse", lse, want_lse, rows, 0.0);
    expect_lse("lp", lp, want_lp, rows, 0.0);
    expect_same("lse with lp NULL", lse2, lse, (size_t)rows * sizeof(float));
    end_case(case_name);
}

/* the device's logsumexp_rows against the reference, tol_lse of max(1, |want|); outputs start as
 * NaN; again with lp and col NULL: the same lse bits (col never read) */
static void case_logsumexp_rows(int64_t rows, int64_t n)
{
    snprintf(case_name, sizeof case_name, "logsumexp_rows rows=%lld n=%lld", (long long)rows,
             (long long)n);
    float *x;
    int32_t *col;
    double *want_lse, *want_lp;
    lse_case_data(rows, n, &x, &col, &want_lse, &want_lp);
    const float *x_dev = dev_floats(x, rows * n, "x");
    const int32_t *col_dev = dev_buffer(col, (size_t)rows * sizeof(int32_t), "col");
    float *lse_dev = dev_floats(NULL, rows, "lse"), *lp_dev = dev_floats(NULL, rows, "lp"),
          *lse2_dev = dev_floats(NULL, rows, "lse (lp NULL)");
    dev->logsumexp_rows(dev, x_dev, rows, n, col_dev, lse_dev, lp_dev);
    dev->logsumexp_rows(dev, x_dev, rows, n, NULL, lse2_dev, NULL);
    const float *lse = download(lse_dev, rows);
    expect_lse("lse", lse, want_lse, rows, 1.0);
    expect_lse("lp", download(lp_dev, rows), want_lp, rows, 1.0);
    expect_same("lse with lp NULL", download(lse2_dev, rows), lse, (size_t)rows * sizeof(float));
    end_case(case_name);
}

/* (rows, n): every kind at n = 1; odd; narrower and wider than a block of 256; the seed's
 * vocabulary (248,320), every kind */
static const int64_t lse_shapes[][2] = { { 6, 1 }, { 3, 7 }, { 12, 300 }, { 33, 1000 }, { 6, 248320 } };

/* against the CPU's, relative; run twice: the same bits (the order depends on count alone);
 * x itself untouched */
static void case_sumsq(int64_t count)
{
    snprintf(case_name, sizeof case_name, "sumsq count=%lld", (long long)count);
    float *x = host_floats(count);
    fill_uniform(x, count, -2.0, 2.0);
    const double want = cpu->sumsq(cpu, x, count);
    float *x_dev = dev_floats(x, count, "x");
    const double got = dev->sumsq(dev, x_dev, count), again = dev->sumsq(dev, x_dev, count);
    const double err = want > 0.0 ? fabs(got - want) / want : fabs(got);
    if (verbose)
        printf("  . %-16s err %.2e  tol %.0e\n", "sum", err, tol_sumsq);
    check(isfinite(got) && err <= tol_sumsq, "sum: gpu %.17g, cpu %.17g (error %.3g > %.3g)", got,
          want, err, tol_sumsq);
    expect_same("sum twice", &again, &got, sizeof got);
    expect_same("x untouched", download(x_dev, count), x, (size_t)count * sizeof(float));
    end_case(case_name);
}

/* y = alpha x + beta y; beta = 0 starts y as NaN, which must not leak (and gives the CPU's bits);
 * in_place: x is y */
static void case_axpby(int64_t count, float alpha, float beta, int in_place)
{
    snprintf(case_name, sizeof case_name, "axpby count=%lld alpha=%g beta=%g%s", (long long)count,
             (double)alpha, (double)beta, in_place ? " in place" : "");
    float *x = host_floats(count), *y0 = host_floats(count);   /* y0: y's start */
    fill_uniform(x, count, -1.0, 1.0);
    fill_uniform(y0, count, -1.0, 1.0);
    if (in_place)
        memcpy(x, y0, (size_t)count * sizeof(float));
    else if (beta == 0.0f)
        for (int64_t i = 0; i < count; i++)
            y0[i] = NAN;
    float *y = host_copy(y0, count);
    cpu->axpby(cpu, count, alpha, in_place ? y : x, beta, y);

    float *y_dev = dev_floats(y0, count, "y");
    float *x_dev = in_place ? y_dev : dev_floats(x, count, "x");
    dev->axpby(dev, count, alpha, x_dev, beta, y_dev);
    float *got = download(y_dev, count);
    if (beta == 0.0f) {
        expect_same("y", got, y, (size_t)count * sizeof(float));
    } else {
        float *scale = host_floats(count);   /* |alpha x| + |beta y| */
        for (int64_t i = 0; i < count; i++)
            scale[i] = fabsf(alpha * x[i]) + fabsf(beta * y0[i]);
        expect_close_scaled("y", got, y, scale, count, tol_axpby);
    }
    if (!in_place)
        expect_same("x untouched", download(x_dev, count), x, (size_t)count * sizeof(float));
    end_case(case_name);
}

/* The features' noise: counter draws and one fmaf on both sides, so the bits must agree exactly
 * (x with magnitudes up to 100, so the rounding of the sum matters); sigma 0 leaves x alone. */
static void case_uniform_noise(int64_t count, float sigma, uint64_t seed)
{
    snprintf(case_name, sizeof case_name, "uniform_noise count=%lld sigma=%g", (long long)count, (double)sigma);
    float *x0 = host_floats(count);
    fill_uniform(x0, count, -100.0, 100.0);
    float *x = host_copy(x0, count);
    cpu->uniform_noise(cpu, x, count, sigma, seed);
    float *x_dev = dev_floats(x0, count, "x");
    dev->uniform_noise(dev, x_dev, count, sigma, seed);
    expect_same("x", download(x_dev, count), x, (size_t)count * sizeof(float));
    if (sigma == 0.0f)
        expect_same("x untouched at sigma 0", x, x0, (size_t)count * sizeof(float));
    end_case(case_name);
}

/* how many of w16 (count) are not ddk_f32_to_bf16 of w (count): a bf16 copy's errors */
static int64_t copy_errors(const uint16_t *w16, const float *w, int64_t count)
{
    int64_t wrong = 0;
    for (int64_t i = 0; i < count; i++)
        wrong += w16[i] != ddk_f32_to_bf16(w[i]);
    return wrong;
}

/* One update at step t = 3 (bias corrections well away from 1) with lr = 1e-2, so the update
 * shows above w's last bits; every 97th element has g = m = v = 0 (direction 0 / eps = 0). Both
 * sides also write the bf16 copy w16 (from NaN bits): bit for bit ddk_f32_to_bf16 of their own
 * new w; the device's update without the copy (w16 NULL) gives the same w, g, m, v bits. */
static void case_adamw(int64_t count, float grad_scale, float weight_decay)
{
    snprintf(case_name, sizeof case_name, "adamw count=%lld grad_scale=%g weight_decay=%g",
             (long long)count, (double)grad_scale, (double)weight_decay);
    const double beta1 = 0.9, beta2 = 0.999, lr = 1e-2, t = 3.0;
    const ddk_adamw_scalars sc = {
        grad_scale, (float)beta1, (float)(1.0 - beta1), (float)beta2, (float)(1.0 - beta2),
        (float)(1.0 / (1.0 - pow(beta1, t))), (float)(1.0 / (1.0 - pow(beta2, t))), 1e-8f,
        (float)lr, (float)(lr * weight_decay),
    };
    float *w0 = host_floats(count), *g0 = host_floats(count), *m0 = host_floats(count),
          *v0 = host_floats(count);   /* the starts */
    fill_uniform(w0, count, -1.0, 1.0);
    fill_uniform(g0, count, -1.0, 1.0);
    fill_uniform(m0, count, -0.1, 0.1);
    fill_uniform(v0, count, 0.0, 0.01);
    for (int64_t i = 5; i < count; i += 97)
        g0[i] = m0[i] = v0[i] = 0.0f;
    float *w = host_copy(w0, count), *g = host_copy(g0, count), *m = host_copy(m0, count),
          *v = host_copy(v0, count);
    uint16_t *w16 = host((size_t)count * sizeof(uint16_t));   /* (count) bf16 */
    memset(w16, 0xff, (size_t)count * sizeof(uint16_t));
    cpu->adamw(cpu, w, g, m, v, w16, count, &sc);
    int64_t wrong = copy_errors(w16, w, count);
    check(wrong == 0, "cpu: %lld of %lld bf16 copies are not the new w rounded to nearest even",
          (long long)wrong, (long long)count);

    float *w_dev = dev_floats(w0, count, "w"), *g_dev = dev_floats(g0, count, "g"),
          *m_dev = dev_floats(m0, count, "m"), *v_dev = dev_floats(v0, count, "v");
    uint16_t *w16_dev = dev_buffer(NULL, (size_t)count * sizeof(uint16_t), "w16");
    dev->adamw(dev, w_dev, g_dev, m_dev, v_dev, w16_dev, count, &sc);
    float *w_got = download(w_dev, count), *g_got = download(g_dev, count);
    float *m_got = download(m_dev, count), *v_got = download(v_dev, count);
    expect_close("w", w_got, w, count, tol_adamw);
    expect_same("g", g_got, g, (size_t)count * sizeof(float));
    expect_close("m", m_got, m, count, tol_adamw);
    expect_close("v", v_got, v, count, tol_adamw);
    wrong = copy_errors(download16(w16_dev, count), w_got, count);
    check(wrong == 0, "%lld of %lld bf16 copies are not the device's new w rounded to nearest even",
          (long long)wrong, (long long)count);

    float *w2_dev = dev_floats(w0, count, "w (no copy)"), *g2_dev = dev_floats(g0, count, "g (no copy)"),
          *m2_dev = dev_floats(m0, count, "m (no copy)"), *v2_dev = dev_floats(v0, count, "v (no copy)");
    dev->adamw(dev, w2_dev, g2_dev, m2_dev, v2_dev, NULL, count, &sc);
    const size_t bytes = (size_t)count * sizeof(float);
    expect_same("w without the copy", download(w2_dev, count), w_got, bytes);
    expect_same("g without the copy", download(g2_dev, count), g_got, bytes);
    expect_same("m without the copy", download(m2_dev, count), m_got, bytes);
    expect_same("v without the copy", download(v2_dev, count), v_got, bytes);
    end_case(case_name);
}

/* sumsq and axpby past 2^31 elements, where an int index would wrap: x = 1, then 2 (axpby
 * alpha = 2, beta = 0, in place), then 1 again (alpha = 1, beta = -0.5, in place); every sum of
 * squares is an integer below 2^53, exact in double in any order, so no CPU reference is needed.
 * 8 GiB on the GPU, no guards (their staging copy would be 8 GiB of host memory: the other cases
 * check guards). Self-check mode runs it at 2^24 + 5. */
static void case_vector_large(int64_t count)
{
    snprintf(case_name, sizeof case_name, "sumsq+axpby count=%lld (exact sums)", (long long)count);
    const int64_t chunk = (int64_t)1 << 24;   /* floats of ones per host -> device copy */
    float *ones = host_floats(chunk);
    for (int64_t i = 0; i < chunk; i++)
        ones[i] = 1.0f;
    const size_t bytes = (size_t)count * sizeof(float);
    float *x_dev = ddk_malloc(dev->alloc, bytes);
    check(x_dev != NULL, "no %zu bytes on %s", bytes, ddk_allocator_device(dev->alloc));
    if (x_dev) {
        for (int64_t off = 0; off < count; off += chunk)
            dev->copy(dev, x_dev + off, ones,
                      (size_t)(count - off < chunk ? count - off : chunk) * sizeof(float));
        const double n = (double)count;
        double got = dev->sumsq(dev, x_dev, count);
        check(got == n, "x = 1: sumsq %.17g, expected %.17g", got, n);
        dev->axpby(dev, count, 2.0f, x_dev, 0.0f, x_dev);
        got = dev->sumsq(dev, x_dev, count);
        check(got == 4.0 * n, "x = 2: sumsq %.17g, expected %.17g", got, 4.0 * n);
        dev->axpby(dev, count, 1.0f, x_dev, -0.5f, x_dev);
        got = dev->sumsq(dev, x_dev, count);
        check(got == n, "x = 1 again: sumsq %.17g, expected %.17g", got, n);
        float tail[2];   /* the last two elements, past 2^31 on the GPU */
        dev->copy(dev, tail, x_dev + count - 2, sizeof tail);
        dev_sync();
        check(tail[0] == 1.0f && tail[1] == 1.0f, "the last elements are %g, %g", (double)tail[0],
              (double)tail[1]);
        ddk_free(dev->alloc, x_dev, bytes);
    }
    end_case(case_name);
}

static const int64_t sumsq_counts[] = { 0, 1, 3, 17, 1000, (1 << 18) + 3, 1000003 };

static const struct { int64_t count; float alpha, beta; int in_place; } axpby_cases[] = {
    { 0, 1.0f, 0.0f, 0 },        { 1, 2.0f, 0.0f, 0 },      { 3, 0.5f, 0.0f, 0 },
    { 17, -1.5f, 0.25f, 0 },     { 1000, 1.0f, 1.0f, 0 },   { 17, 3.0f, 0.0f, 1 },
    { 1000003, 0.125f, -0.5f, 0 }, { 1000003, 2.0f, 0.9f, 1 }, { 1000003, -0.75f, 0.0f, 0 },
};

static const struct { int64_t count; float grad_scale, weight_decay; } adamw_cases[] = {
    { 0, 1.0f, 0.1f }, { 1, 1.0f, 0.0f }, { 17, 0.5f, 0.1f }, { 1000, 1.0f, 0.1f },
    { 1000003, 0.37f, 0.0f }, { 1000003, 0.5f, 0.1f },
};

/* every whole-buffer case, reseeded like main's (seq continues its count) */
static void run_vector_cases(uint64_t *seq, int self_check)
{
    check(dev->sumsq && dev->axpby && dev->adamw, "sumsq, axpby or adamw is NULL");
    case_done("whole-buffer table");
    if (!dev->sumsq || !dev->axpby || !dev->adamw)
        return;
    for (size_t i = 0; i < sizeof sumsq_counts / sizeof sumsq_counts[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_sumsq(sumsq_counts[i]);
    }
    for (size_t i = 0; i < sizeof axpby_cases / sizeof axpby_cases[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_axpby(axpby_cases[i].count, axpby_cases[i].alpha, axpby_cases[i].beta,
                   axpby_cases[i].in_place);
    }
    for (size_t i = 0; i < sizeof adamw_cases / sizeof adamw_cases[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_adamw(adamw_cases[i].count, adamw_cases[i].grad_scale, adamw_cases[i].weight_decay);
    }
    static const struct { int64_t count; float sigma; } noise_cases[] = {
        { 1, 0.05f }, { 1000003, 0.05f }, { 4099, 3.0f }, { 777, 0.0f },
    };
    for (size_t i = 0; dev->uniform_noise && i < sizeof noise_cases / sizeof noise_cases[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_uniform_noise(noise_cases[i].count, noise_cases[i].sigma, 0x9000u + i);
    }
    const char *small = getenv("DDTREE_BACKEND_OPS_SMALL");
    const int large = !self_check && !(small && *small && strcmp(small, "0") != 0);
    case_vector_large(large ? ((int64_t)1 << 31) + 5 : ((int64_t)1 << 24) + 5);
}

/* ------------------------------------------------------------------------------------------
 * Attention: DFlash forward + backward and causal attention (attention_cuda.cu) against the CPU
 * backend. q, k in [-2, 2] so that softmaxes are peaked as well as flat; anchors sorted, with
 * the first at 0 (no context), the last at S - 1, two equal (overlapping blocks) and padded
 * blocks (keep 0) whose anchors are garbage (never to be read as positions). Tolerances:
 */

/* out and lse: fp32 online softmax on both sides, keys summed in different orders (tiles of 64
 * keys through BLAS on the CPU, 32 per warp on the GPU) and different exps (ddk_expf < 2e-7,
 * CUDA's expf 2 ulp): rounding of a sum of up to ~2000 terms, ~1e-7 sqrt(n) ~ 5e-6 at worst */
static const double tol_attn_fwd = 1e-5;
/* dq, dk, dv increments (got - start against want - start): ds = p (dout.v - D) subtracts two
 * nearly equal fp32 sums when a row's attention is spread, which amplifies their rounding by up
 * to ~10-100; dk, dv then add contributions of up to A * B * nh / nkv rows (on the GPU with
 * atomics, in an order that changes from run to run: attention_cuda.cu) */
static const double tol_attn_grad = 1e-4;
/* The tensor-core kernels (attention_flash.cu, DDK_CUDA_ATTENTION_FLASH) take q, k, v and dout
 * rounded to bf16 (2^-9 relative each) and round p before p v and ds before ds k, ds^T q; sums
 * stay fp32. A score then errs by ~2^-9 of sum |q_i k_i| / sqrt(d) in a random walk, which moves
 * p by that relative amount. A float64 emulation of exactly these roundings against the exact
 * result, on these tables' shapes (q, k in [-2, 2]), gave normalised errors of out <= 6.0e-3,
 * lse <= 2.0e-3, dq, dk, dv <= 9.7e-3 (dk at S 40, B 3, d 8): the tolerances leave 2.5-3x
 * over those. Index or masking errors (a key seen that is not, a row of another block) are
 * O(1e-1) and more at these shapes. */
static const double tol_flash_fwd = 1.5e-2;
static const double tol_flash_grad = 3e-2;
/* which CUDA kernels the attention cases run (ddk_cuda_set_attention_kernels): their tolerances */
static int attn_flash;
/* the DFlash cases' ddk_attention_shape.bidirectional (DFlash2's blocks: all slots seen also in a
 * sliding layer) */
static int attn_bidirectional;

/* 1 when the CUDA backend's attention runs the flash kernels now: selected (or the default) on
 * an sm_80 or later GPU (below it the flash selection runs the SIMT kernels: ddk.h) */
static int attention_is_flash(int self_check)
{
    ddk_device_info info;
    if (self_check || ddk_cuda_device_info(0, &info) != 0 || info.compute_capability < 80)
        return 0;
    return ddk_cuda_attention_kernels() != DDK_CUDA_ATTENTION_SIMT;
}

/* compares the increments got - start and want - start (an overwrite instead of an ADD is then
 * off by the O(1) start) */
static void expect_close_added(const char *what, const float *got, const float *want,
                               const float *start, int64_t count, double tol)
{
    float *g = xcalloc((size_t)count, sizeof(float)), *w = xcalloc((size_t)count, sizeof(float));
    for (int64_t i = 0; i < count; i++) {
        g[i] = got[i] - start[i];
        w[i] = want[i] - start[i];
    }
    expect_close(what, g, w, count, tol);
    free(g);
    free(w);
}

typedef struct {
    int64_t S, A, B, nh, nkv, d, window;
} attn_case_shape;

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static void case_dflash_attention(const attn_case_shape *s)
{
    snprintf(case_name, sizeof case_name,
             "dflash_attention S=%lld A=%lld B=%lld nh=%lld nkv=%lld d=%lld window=%lld%s",
             (long long)s->S, (long long)s->A, (long long)s->B, (long long)s->nh,
             (long long)s->nkv, (long long)s->d, (long long)s->window,
             attn_bidirectional ? " bidirectional" : "");
    const ddk_attention_shape sh = { .S = s->S, .A = s->A, .B = s->B, .nh = s->nh, .nkv = s->nkv,
                                     .d = s->d, .window = s->window,
                                     .bidirectional = attn_bidirectional };
    const int64_t A = s->A, nq = A * s->B * s->nh * s->d, nk = (s->S + A * s->B) * s->nkv * s->d;
    const int64_t nl = A * s->B * s->nh;
    float *q = host_floats(nq), *k = host_floats(nk), *v = host_floats(nk);
    fill_uniform(q, nq, -2.0, 2.0);
    fill_uniform(k, nk, -2.0, 2.0);
    fill_uniform(v, nk, -1.0, 1.0);
    int32_t *anchors = host((size_t)A * sizeof(int32_t));
    uint8_t *keep = host((size_t)A);
    for (int64_t j = 0; j < A; j++)
        anchors[j] = (int32_t)rng_below(s->S);
    qsort(anchors, (size_t)A, sizeof *anchors, cmp_i32);
    anchors[0] = 0;
    if (A >= 2)
        anchors[A - 1] = (int32_t)(s->S - 1);
    if (A >= 4)
        anchors[1] = anchors[2];   /* two blocks at one anchor */
    for (int64_t j = 0; j < A; j++) {
        keep[j] = !(j % 5 == 3 || (A > 1 && j == A - 2));
        if (!keep[j])
            anchors[j] = j % 2 ? -12345 : 1 << 30;   /* a padded block's anchor is not read */
    }
    float *out = host_floats(nq), *lse = host_floats(nl);
    check(cpu->dflash_attention(cpu, &sh, q, k, v, anchors, keep, out, lse) == 0, "cpu forward");
    float *dout = host_floats(nq), *dq0 = host_floats(nq), *dk0 = host_floats(nk),
          *dv0 = host_floats(nk);
    fill_uniform(dout, nq, -1.0, 1.0);
    fill_uniform(dq0, nq, -1.0, 1.0);
    fill_uniform(dk0, nk, -1.0, 1.0);
    fill_uniform(dv0, nk, -1.0, 1.0);
    float *dq = host_copy(dq0, nq), *dk = host_copy(dk0, nk), *dv = host_copy(dv0, nk);
    check(cpu->dflash_attention_backward(cpu, &sh, q, k, v, anchors, keep, out, lse, dout, dq, dk,
                                         dv) == 0,
          "cpu backward");

    float *q_dev = dev_floats(q, nq, "q"), *k_dev = dev_floats(k, nk, "k"),
          *v_dev = dev_floats(v, nk, "v");
    int32_t *anchors_dev = dev_buffer(anchors, (size_t)A * sizeof(int32_t), "anchors");
    uint8_t *keep_dev = dev_buffer(keep, (size_t)A, "keep");
    float *out_dev = dev_floats(NULL, nq, "out"), *lse_dev = dev_floats(NULL, nl, "lse");
    int rc = dev->dflash_attention(dev, &sh, q_dev, k_dev, v_dev, anchors_dev, keep_dev, out_dev,
                                   lse_dev);
    check(rc == 0, "forward returned %d", rc);
    const double tol_fwd = attn_flash ? tol_flash_fwd : tol_attn_fwd;
    const double tol_grad = attn_flash ? tol_flash_grad : tol_attn_grad;
    expect_close("out", download(out_dev, nq), out, nq, tol_fwd);
    expect_close("lse", download(lse_dev, nl), lse, nl, tol_fwd);
    /* the backward from the CPU's out and lse: each side's backward on the same inputs */
    float *outc_dev = dev_floats(out, nq, "out (cpu)"), *lsec_dev = dev_floats(lse, nl, "lse (cpu)");
    float *dout_dev = dev_floats(dout, nq, "dout"), *dq_dev = dev_floats(dq0, nq, "dq");
    float *dk_dev = dev_floats(dk0, nk, "dk"), *dv_dev = dev_floats(dv0, nk, "dv");
    rc = dev->dflash_attention_backward(dev, &sh, q_dev, k_dev, v_dev, anchors_dev, keep_dev,
                                        outc_dev, lsec_dev, dout_dev, dq_dev, dk_dev, dv_dev);
    check(rc == 0, "backward returned %d", rc);
    float *dq_got = download(dq_dev, nq), *dk_got = download(dk_dev, nk), *dv_got = download(dv_dev, nk);
    expect_close_added("dq", dq_got, dq, dq0, nq, tol_grad);
    expect_close_added("dk", dk_got, dk, dk0, nk, tol_grad);
    expect_close_added("dv", dv_got, dv, dv0, nk, tol_grad);
    if (attn_flash) {
        /* no atomics (ddk.h): the same call again, from the same starting gradients, gives the
         * same bits; the forward too */
        float *dq2_dev = dev_floats(dq0, nq, "dq again"), *dk2_dev = dev_floats(dk0, nk, "dk again");
        float *dv2_dev = dev_floats(dv0, nk, "dv again");
        rc = dev->dflash_attention_backward(dev, &sh, q_dev, k_dev, v_dev, anchors_dev, keep_dev,
                                            outc_dev, lsec_dev, dout_dev, dq2_dev, dk2_dev, dv2_dev);
        check(rc == 0, "backward again returned %d", rc);
        expect_same("dq run twice", download(dq2_dev, nq), dq_got, (size_t)nq * sizeof(float));
        expect_same("dk run twice", download(dk2_dev, nk), dk_got, (size_t)nk * sizeof(float));
        expect_same("dv run twice", download(dv2_dev, nk), dv_got, (size_t)nk * sizeof(float));
        float *out_got = download(out_dev, nq);
        rc = dev->dflash_attention(dev, &sh, q_dev, k_dev, v_dev, anchors_dev, keep_dev, out_dev,
                                   lse_dev);
        check(rc == 0, "forward again returned %d", rc);
        expect_same("out run twice", download(out_dev, nq), out_got, (size_t)nq * sizeof(float));
    }
    end_case(case_name);
}

static void case_causal_attention(int64_t T, int64_t nh, int64_t nkv, int64_t d)
{
    snprintf(case_name, sizeof case_name, "causal_attention T=%lld nh=%lld nkv=%lld d=%lld",
             (long long)T, (long long)nh, (long long)nkv, (long long)d);
    const ddk_attention_shape sh = { .S = T, .nh = nh, .nkv = nkv, .d = d };
    const int64_t nq = T * nh * d, nk = T * nkv * d;
    float *q = host_floats(nq), *k = host_floats(nk), *v = host_floats(nk);
    fill_uniform(q, nq, -2.0, 2.0);
    fill_uniform(k, nk, -2.0, 2.0);
    fill_uniform(v, nk, -1.0, 1.0);
    float *out = host_floats(nq);
    check(cpu->causal_attention(cpu, &sh, q, k, v, out) == 0, "cpu causal");
    float *q_dev = dev_floats(q, nq, "q"), *k_dev = dev_floats(k, nk, "k"),
          *v_dev = dev_floats(v, nk, "v"), *out_dev = dev_floats(NULL, nq, "out");
    const int rc = dev->causal_attention(dev, &sh, q_dev, k_dev, v_dev, out_dev);
    check(rc == 0, "causal returned %d", rc);
    expect_close("out", download(out_dev, nq), out, nq, attn_flash ? tol_flash_fwd : tol_attn_fwd);
    end_case(case_name);
}

/* nh % nkv != 0: -EINVAL from all three, nothing written (out, lse NaN as they started; dq,
 * dk, dv as they started) */
static void case_attention_einval(void)
{
    snprintf(case_name, sizeof case_name, "attention bad shape (nh=3 nkv=2): -EINVAL");
    const ddk_attention_shape sh = { .S = 4, .A = 2, .B = 3, .nh = 3, .nkv = 2, .d = 8 };
    const int64_t nq = 2 * 3 * 3 * 8, nk = (4 + 6) * 2 * 8, nl = 2 * 3 * 3;
    float *x = host_floats(nk);
    fill_uniform(x, nk, -1.0, 1.0);
    const int32_t anchors[2] = { 1, 3 };
    const uint8_t keep[2] = { 1, 1 };
    float *x_dev = dev_floats(x, nk, "q, k, v, out, dout");
    int32_t *anchors_dev = dev_buffer(anchors, sizeof anchors, "anchors");
    uint8_t *keep_dev = dev_buffer(keep, sizeof keep, "keep");
    float *out_dev = dev_floats(NULL, nq, "out"), *lse_dev = dev_floats(NULL, nl, "lse");
    float *g_dev = dev_floats(x, nk, "dq, dk, dv");
    int rf = dev->dflash_attention(dev, &sh, x_dev, x_dev, x_dev, anchors_dev, keep_dev, out_dev,
                                   lse_dev);
    int rb = dev->dflash_attention_backward(dev, &sh, x_dev, x_dev, x_dev, anchors_dev, keep_dev,
                                            x_dev, x_dev, x_dev, g_dev, g_dev, g_dev);
    int rcz = dev->causal_attention(dev, &sh, x_dev, x_dev, x_dev, out_dev);
    check(rf == -EINVAL && rb == -EINVAL && rcz == -EINVAL,
          "returned %d, %d, %d instead of -EINVAL", rf, rb, rcz);
    unsigned char *nan_bytes = host((size_t)nq * sizeof(float));
    memset(nan_bytes, 0xff, (size_t)nq * sizeof(float));
    expect_same("out untouched", download(out_dev, nq), nan_bytes, (size_t)nq * sizeof(float));
    expect_same("lse untouched", download(lse_dev, nl), nan_bytes, (size_t)nl * sizeof(float));
    expect_same("gradients untouched", download(g_dev, nk), x, (size_t)nk * sizeof(float));
    end_case(case_name);
}

static const attn_case_shape attn_shapes[] = {
    /* S, A, B, nh, nkv, d, window */
    { 1, 1, 3, 1, 1, 8, 0 },          /* one block at anchor 0: its own slots only */
    { 40, 5, 3, 2, 1, 8, 2 },         /* window 2 < B */
    { 100, 7, 16, 4, 2, 64, 0 },
    { 100, 7, 16, 4, 4, 64, 5 },      /* window 5 < B */
    { 300, 33, 24, 4, 1, 128, 0 },    /* B = 24: two row groups, the second partial */
    { 513, 12, 24, 1, 1, 128, 7 },
    { 777, 9, 16, 2, 2, 100, 0 },     /* d not a multiple of 32 */
    { 2048, 64, 16, 4, 2, 128, 0 },
    { 2048, 64, 16, 2, 2, 64, 9 },
    { 2048, 1, 24, 4, 4, 8, 0 },      /* one block at anchor 0 */
    { 2048, 20, 3, 4, 1, 128, 2048 }, /* window larger than any context: full but causal slots */
};

static const struct { int64_t T, nh, nkv, d; } causal_shapes[] = {
    { 1, 1, 1, 8 }, { 17, 2, 1, 64 }, { 300, 4, 2, 128 }, { 2048, 4, 4, 64 }, { 129, 2, 2, 100 },
};

/* every attention case, reseeded like main's (seq continues its count) */
static void run_attention_cases(uint64_t *seq)
{
    check(dev->dflash_attention && dev->dflash_attention_backward && dev->causal_attention,
          "an attention op is NULL");
    case_done("attention table");
    if (!dev->dflash_attention || !dev->dflash_attention_backward || !dev->causal_attention)
        return;
    for (size_t i = 0; i < sizeof attn_shapes / sizeof attn_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_dflash_attention(&attn_shapes[i]);
    }
    for (size_t i = 0; i < sizeof causal_shapes / sizeof causal_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_causal_attention(causal_shapes[i].T, causal_shapes[i].nh, causal_shapes[i].nkv,
                              causal_shapes[i].d);
    }
    rng_state = 0x5eed0000u + *seq;
    misalign = (*seq)++ % 2 * 4;
    case_attention_einval();
}

/* head dims past 128, up to DDK_CUDA_MAX_HEAD_DIM: the kernels' widest instance (8 values per
 * lane) and the backward's largest shared memory (160.5 KiB at d 256); appended to main's
 * order so that the cases before keep their seeds */
static const attn_case_shape attn_wide_shapes[] = {
    /* S, A, B, nh, nkv, d, window */
    { 300, 7, 16, 2, 1, DDK_CUDA_MAX_HEAD_DIM, 0 },
    { 513, 9, 24, 4, 2, 160, 7 },     /* d 160 (not a power of two), window 7 < B */
};
static const struct { int64_t T, nh, nkv, d; } causal_wide_shapes[] = {
    { 257, 2, 1, DDK_CUDA_MAX_HEAD_DIM },
};

/* The shapes of the tensor-core kernels' tiles (attention_flash.cu): block 24 (B G = 24..192
 * rows: one block of rows, or two), GQA 1/2/4/8, head_dim 64/128/256 and between (zero-padded
 * columns), S not a multiple of the 64- (32- at d 256) key tiles, windows that cut a block
 * (W < B) and windows that cut the context tiles, the seed's 32/8 heads of 128 */
static const attn_case_shape attn_flash_shapes[] = {
    /* S, A, B, nh, nkv, d, window */
    { 333, 9, 24, 1, 1, 64, 0 },      /* GQA 1: 24 rows, two warps, the second half empty */
    { 333, 9, 24, 2, 1, 128, 0 },     /* GQA 2: 48 rows */
    { 1000, 17, 24, 32, 8, 128, 0 },  /* the seed's heads, GQA 4: 96 rows */
    { 1000, 17, 24, 32, 8, 128, 100 },/* the same, sliding: windows across context tiles */
    { 517, 11, 24, 8, 1, 128, 5 },    /* GQA 8: 192 rows in two blocks; window 5 cuts the block */
    { 517, 11, 24, 16, 2, 64, 23 },   /* GQA 8, window B - 1 */
    { 300, 7, 24, 8, 2, 256, 0 },     /* d 256: 32-key tiles, 64-row dq blocks, split dk / dv */
    { 300, 7, 24, 4, 1, 256, 30 },
    { 130, 5, 24, 4, 2, 96, 0 },      /* d 96 on the 128 instance */
    { 65, 3, 24, 4, 4, 36, 40 },      /* d 36 (not a multiple of 8) on the 64 instance */
    { 1, 3, 24, 4, 2, 64, 0 },        /* anchors all 0: the own slots alone, a context tile no row sees */
    { 64, 40, 70, 2, 1, 64, 0 },      /* B 70 > the key-major tile: own slots in two tiles */
};
static const struct { int64_t T, nh, nkv, d; } causal_flash_shapes[] = {
    { 1000, 32, 8, 128 }, { 77, 8, 1, 64 }, { 333, 4, 2, 256 }, { 130, 2, 1, 100 },
    { 5, 48, 1, 64 },   /* G 48: rows of one position across blocks */
};

static void run_attention_flash_cases(uint64_t *seq)
{
    for (size_t i = 0; dev->dflash_attention && i < sizeof attn_flash_shapes / sizeof attn_flash_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_dflash_attention(&attn_flash_shapes[i]);
    }
    for (size_t i = 0; dev->causal_attention && i < sizeof causal_flash_shapes / sizeof causal_flash_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_causal_attention(causal_flash_shapes[i].T, causal_flash_shapes[i].nh,
                              causal_flash_shapes[i].nkv, causal_flash_shapes[i].d);
    }
}

/* DFlash2's bidirectional blocks (attn_bidirectional = 1) with windows: below B, cutting the
 * context tiles, B - 1, past S; the seed's heads; d 256; B past the key-major tile; and one full
 * layer (where the flag changes nothing) */
static const attn_case_shape attn_bidirectional_shapes[] = {
    /* S, A, B, nh, nkv, d, window */
    { 40, 5, 3, 2, 1, 8, 2 },
    { 100, 7, 16, 4, 4, 64, 5 },
    { 333, 9, 24, 2, 1, 128, 5 },
    { 1000, 17, 24, 32, 8, 128, 100 },
    { 517, 11, 24, 16, 2, 64, 23 },
    { 300, 7, 24, 4, 1, 256, 30 },
    { 65, 3, 24, 4, 4, 36, 40 },
    { 64, 40, 70, 2, 1, 64, 3 },
    { 513, 9, 24, 4, 2, 160, 7 },
    { 300, 33, 24, 4, 1, 128, 0 },
};

static void run_attention_bidirectional_cases(uint64_t *seq)
{
    attn_bidirectional = 1;
    for (size_t i = 0; dev->dflash_attention && i < sizeof attn_bidirectional_shapes / sizeof attn_bidirectional_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_dflash_attention(&attn_bidirectional_shapes[i]);
    }
    attn_bidirectional = 0;
}

static void run_attention_wide_cases(uint64_t *seq)
{
    for (size_t i = 0; dev->dflash_attention && i < sizeof attn_wide_shapes / sizeof attn_wide_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_dflash_attention(&attn_wide_shapes[i]);
    }
    for (size_t i = 0; dev->causal_attention && i < sizeof causal_wide_shapes / sizeof causal_wide_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_causal_attention(causal_wide_shapes[i].T, causal_wide_shapes[i].nh, causal_wide_shapes[i].nkv,
                              causal_wide_shapes[i].d);
    }
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

/* k = 0: c = beta c (0 over NaN for beta = 0) in two transposes; each mode of case_matmul */
static const matmul_shape matmul_k0_shapes[] = {
    { 4, 3, 0, 0, 0, 2, 1.0f, 0.5f },
    { 4, 3, 0, 1, 1, 2, 1.0f, 0.0f },
};

/* ------------------------------------------------------------------------------------------
 * The loss (SPEC.md section 1): the device's loss against ddk_loss_cpu, same inputs
 */

/* loss, ce, kl, cap and per_position, by |gpu - cpu| / max(1, max|cpu|): the logits come from two
 * fp32 products (cuBLAS, OpenBLAS) that differ by ~3e-7 sqrt(H) of the logits' scale
 * (tol_matmul), ~1e-6 absolute at |z| ~ 3 and H = 130. Log-sum-exps and expectations carry that
 * as an absolute error, and KL and CAP are differences of O(1..10) quantities, hence the floor of
 * 1 instead of a relative error; float sums per thread and warp on the GPU against float blocks of
 * 512 merged in double on the CPU add ~1e-7 at V = 5000. 3e-5 is a margin of ~10 over that and
 * still far below what a wrong term or a misplaced tile costs (1e-2 and more). */
static const double tol_loss_value = 3e-5;
/* d loss / d hs, normalised by max|cpu|: g = d l / d zs inherits the logits' ~1e-6 relative error,
 * then one more fp32 product over V (tol_matmul(V)) */
static double tol_loss_grad(int64_t V)
{
    return 2e-5 + 2.0 * tol_matmul(V);
}
/* The same with bf16_products, on inputs that are bf16 values (loss_make_inputs rounds them): the
 * logit products round nothing and stay fp32 sums, so the values keep tol_loss_value. With a bf16
 * head (head_bf16) the hidden states are not bf16 values, but both sides round them to nearest
 * even (ddk_cuda_round_bf16_rows, exact against ddk_bf16.h) before products that are exact in
 * fp32: the logits again differ by the fp32 sums' order alone. The
 * gradient product's operand g = d l / d zs is formed in fp32 and rounded to bf16 on both sides
 * (loss_cpu.c calls matmul_bf16 as well): where the two sides' g (~1e-6 apart) straddle a rounding
 * boundary they round to neighbours one bf16 step apart, at most 2^-7 of that g_v; and if cuBLAS
 * rounds otherwise (TF32, truncation) every term moves by at most 2^-8 + 2^-10 of itself, with
 * random signs. Either is below 2^-7 of the gradient's scale, on top of the fp32 differences. */
static double tol_loss_grad_bf16(int64_t V)
{
    return ldexp(1.0, -7) + tol_loss_grad(V);
}

typedef struct {
    int64_t n, H, V, chunk, vocab_tile;
    int labels;    /* 0: NULL (the teacher's argmax); 1: given, every 7th ignored; 2: all ignored */
    int weights;   /* 0: NULL; 1: in [0.25, 2], every 11th 0 and every 13th -1 (ignored) */
    float alpha, T, lambda, Tc;
    int no_outputs;   /* 1: grad_student and per_position NULL */
    int bf16;         /* 1: bf16_products, on hidden states and lm_head that are bf16 values;
                         2: a bf16 head read in place (head_bf16), hidden states as drawn */
} loss_case;

static void loss_scalar(const char *what, double got, double want)
{
    double err = fabs(got - want) / fmax(1.0, fabs(want));
    if (verbose)
        printf("  . %-16s err %.2e  tol %.0e\n", what, err, tol_loss_value);
    check(isfinite(got) && err <= tol_loss_value, "%s: gpu %.9g, cpu %.9g (error %.3g > %.3g)",
          what, got, want, err, tol_loss_value);
}

/* The inputs of a loss case on the host: hs, ht (n, H), W (V, H), labels, weights (n) */
typedef struct {
    float *hs, *ht, *W, *weights;
    int32_t *labels;
} loss_inputs;

static loss_inputs loss_make_inputs(const loss_case *s)
{
    loss_inputs in = { 0 };
    const int64_t n = s->n, H = s->H, V = s->V;
    in.hs = host_floats(n * H);
    in.ht = host_floats(n * H);
    in.W = host_floats(V * H);
    fill_uniform(in.hs, n * H, -1.0, 1.0);
    fill_uniform(in.ht, n * H, -0.3, 0.3);
    for (int64_t i = 0; i < n * H; i++)
        in.ht[i] += in.hs[i];   /* a teacher near the student: argmax agrees often, not always */
    const double a = 6.0 / sqrt((double)H);   /* logits of standard deviation ~2 */
    fill_uniform(in.W, V * H, -a, a);
    if (s->bf16 == 1) {
        round_bf16(in.hs, n * H);
        round_bf16(in.ht, n * H);
    }
    if (s->bf16)
        round_bf16(in.W, V * H);
    if (s->labels) {
        in.labels = host((size_t)n * sizeof(int32_t));
        for (int64_t i = 0; i < n; i++)
            in.labels[i] = s->labels == 2 || i % 7 == 3 ? -1 : (int32_t)rng_below(V);
    }
    if (s->weights) {
        in.weights = host_floats(n);
        fill_uniform(in.weights, n, 0.25, 2.0);
        for (int64_t i = 0; i < n; i++)
            in.weights[i] = i % 11 == 5 ? 0.0f : i % 13 == 6 ? -1.0f : in.weights[i];
    }
    return in;
}

static void case_loss(const loss_case *s)
{
    int len = snprintf(case_name, sizeof case_name,
             "loss n=%lld H=%lld V=%lld chunk=%lld tile=%lld labels=%s%s alpha=%g T=%g "
             "lambda=%g Tc=%g%s%s",
             (long long)s->n, (long long)s->H, (long long)s->V, (long long)s->chunk,
             (long long)s->vocab_tile,
             s->labels == 0 ? "teacher" : s->labels == 1 ? "given" : "ignored",
             s->weights ? " weights" : "", (double)s->alpha, (double)s->T, (double)s->lambda,
             (double)s->Tc, s->no_outputs ? " no outputs" : "",
             s->bf16 == 2 ? " bf16 head" : s->bf16 ? " bf16" : "");
    if (len >= (int)sizeof case_name)   /* a long name is cut, never overrun */
        case_name[sizeof case_name - 1] = '\0';
    const int64_t n = s->n, H = s->H, V = s->V;
    const ddk_loss_params p = { n,        H,    V,         s->chunk, s->vocab_tile,
                                s->alpha, s->T, s->lambda, s->Tc,    s->bf16 != 0, s->bf16 == 2, NULL };
    loss_inputs in = loss_make_inputs(s);
    const int uses_teacher = ddk_loss_uses_teacher(&p, in.labels != NULL);
    float *grad = s->no_outputs ? NULL : host_floats(n * H);
    float *pp = s->no_outputs ? NULL : host_floats(n);
    uint16_t *W16 = s->bf16 == 2 ? host((size_t)(V * H) * sizeof(uint16_t)) : NULL;   /* (V, H) */
    for (int64_t i = 0; W16 && i < V * H; i++)
        W16[i] = ddk_f32_to_bf16(in.W[i]);   /* exact: in.W holds bf16 values */
    const void *W = W16 ? (const void *)W16 : in.W;
    const size_t W_bytes = (size_t)(V * H) * (W16 ? sizeof(uint16_t) : sizeof(float));
    ddk_loss_result want;
    int rc = ddk_loss_cpu(&p, in.hs, uses_teacher ? in.ht : NULL, W, in.labels, in.weights,
                          grad, pp, &want);
    check(rc == 0, "ddk_loss_cpu returned %d", rc);

    float *hs_dev = dev_floats(in.hs, n * H, "student_hidden");
    float *ht_dev = uses_teacher ? dev_floats(in.ht, n * H, "teacher_hidden") : NULL;
    void *W_dev = dev_buffer(W, W_bytes, "lm_head");
    int32_t *labels_dev =
        in.labels ? dev_buffer(in.labels, (size_t)n * sizeof(int32_t), "labels") : NULL;
    float *weights_dev = in.weights ? dev_floats(in.weights, n, "weights") : NULL;
    float *grad_dev[2] = { NULL, NULL }, *pp_dev[2] = { NULL, NULL };
    if (!s->no_outputs)
        for (int t = 0; t < 2; t++) {
            grad_dev[t] = dev_floats(NULL, n * H, t ? "grad_student (2nd run)" : "grad_student");
            pp_dev[t] = dev_floats(NULL, n, t ? "per_position (2nd run)" : "per_position");
        }

    /* run twice: the same bits (the reduction order is fixed); the workspace is exactly
     * ddk_loss_workspace_bytes (none when no position is counted) and is given back */
    ddk_loss_result got[2];
    const size_t before = ddk_allocator_stats(dev->alloc).current;
    const int64_t ws = ddk_loss_workspace_bytes(&p, uses_teacher);
    for (int t = 0; t < 2; t++) {
        ddk_allocator_reset_peak(dev->alloc);
        rc = dev->loss(dev, &p, hs_dev, ht_dev, W_dev, labels_dev, weights_dev, grad_dev[t],
                       pp_dev[t], &got[t]);
        dev_sync();
        check(rc == 0, "run %d returned %d", t + 1, rc);
        ddk_alloc_stats st = ddk_allocator_stats(dev->alloc);
        check(st.current == before, "run %d: %zu bytes still allocated", t + 1, st.current - before);
        size_t used = st.peak - before, expected = want.counted ? (size_t)ws : 0;
        check(used == expected, "run %d: workspace peak %zu bytes, ddk_loss_workspace_bytes %zu",
              t + 1, used, expected);
    }
    if (rc == 0) {
        loss_scalar("loss", got[0].loss, want.loss);
        loss_scalar("ce", got[0].ce, want.ce);
        loss_scalar("kl", got[0].kl, want.kl);
        loss_scalar("cap", got[0].cap, want.cap);
        check(got[0].weight_sum == want.weight_sum, "weight_sum: gpu %.17g, cpu %.17g",
              got[0].weight_sum, want.weight_sum);
        /* correct +-1: a near-tie between two logits may round to a different argmax on the
         * tensor cores (another summation order); counted is exact */
        check(got[0].counted == want.counted && llabs(got[0].correct - want.correct) <= 1,
              "counted %lld correct %lld, cpu %lld and %lld", (long long)got[0].counted,
              (long long)got[0].correct, (long long)want.counted, (long long)want.correct);
        expect_same("result twice", &got[1], &got[0], sizeof got[0]);
    }
    if (!s->no_outputs) {
        float *pp_got = download(pp_dev[0], n), *grad_got = download(grad_dev[0], n * H);
        /* per_position by the scalars' rule: max(1, max|cpu|) */
        double num = 0.0, den = 1.0;
        int64_t nonfinite = 0;
        for (int64_t i = 0; i < n; i++) {
            nonfinite += !isfinite(pp_got[i]);
            num = fmax(num, fabs((double)pp_got[i] - pp[i]));
            den = fmax(den, fabs((double)pp[i]));
        }
        check(nonfinite == 0 && num / den <= tol_loss_value,
              "per_position: %lld not finite, error %.3g > %.3g", (long long)nonfinite, num / den,
              tol_loss_value);
        expect_close("grad_student", grad_got, grad, n * H,
                     s->bf16 ? tol_loss_grad_bf16(V) : tol_loss_grad(V));
        expect_same("per_position twice", download(pp_dev[1], n), pp_got, (size_t)n * sizeof(float));
        expect_same("grad_student twice", download(grad_dev[1], n * H), grad_got,
                    (size_t)(n * H) * sizeof(float));
    }
    end_case(case_name);
}

/* -ENOMEM (a budget one byte short of the workspace) and -EINVAL (a label = V, read from device
 * memory): nothing written, out and the outputs as they were */
static void case_loss_refused(void)
{
    snprintf(case_name, sizeof case_name, "loss refused: -ENOMEM, then -EINVAL (label = V)");
    const loss_case s = { 37, 64, 257, 8, 0, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 };
    const ddk_loss_params p = { s.n, s.H, s.V, s.chunk, s.vocab_tile, s.alpha, s.T, s.lambda, s.Tc,
                                0, 0, NULL };
    loss_inputs in = loss_make_inputs(&s);
    float *hs_dev = dev_floats(in.hs, s.n * s.H, "student_hidden");
    float *ht_dev = dev_floats(in.ht, s.n * s.H, "teacher_hidden");
    float *W_dev = dev_floats(in.W, s.V * s.H, "lm_head");
    int32_t *labels_dev = dev_buffer(in.labels, (size_t)s.n * sizeof(int32_t), "labels");
    float *weights_dev = dev_floats(in.weights, s.n, "weights");
    float *grad_dev = dev_floats(NULL, s.n * s.H, "grad_student");
    float *pp_dev = dev_floats(NULL, s.n, "per_position");
    const int64_t ws = ddk_loss_workspace_bytes(&p, 1);
    ddk_loss_result out, sentinel;
    memset(&sentinel, sentinel_byte, sizeof sentinel);

    for (int t = 0; t < 2; t++) {
        if (t == 0) {
            ddk_allocator_set_budget(dev->alloc, ddk_allocator_stats(dev->alloc).current + (size_t)ws - 1);
        } else {
            int32_t bad = (int32_t)s.V;
            dev->copy(dev, labels_dev + 5, &bad, sizeof bad);
            dev_sync();
        }
        memcpy(&out, &sentinel, sizeof out);
        int rc = dev->loss(dev, &p, hs_dev, ht_dev, W_dev, labels_dev, weights_dev, grad_dev,
                           pp_dev, &out);
        dev_sync();
        ddk_allocator_set_budget(dev->alloc, 0);
        int expected = t == 0 ? -ENOMEM : -EINVAL;
        check(rc == expected, "returned %d instead of %d", rc, expected);
        expect_same(t == 0 ? "out untouched (ENOMEM)" : "out untouched (EINVAL)", &out, &sentinel,
                    sizeof out);
        unsigned char *nan_bytes = host((size_t)(s.n * s.H) * sizeof(float));
        memset(nan_bytes, 0xff, (size_t)(s.n * s.H) * sizeof(float));
        expect_same("grad_student untouched", download(grad_dev, s.n * s.H), nan_bytes,
                    (size_t)(s.n * s.H) * sizeof(float));
        expect_same("per_position untouched", download(pp_dev, s.n), nan_bytes,
                    (size_t)s.n * sizeof(float));
    }
    end_case(case_name);
}

static const loss_case loss_cases[] = {
    /* n, H, V, chunk, vocab_tile, labels, weights, alpha, T, lambda, Tc, no_outputs, bf16 */
    { 1, 8, 2, 1, 0, 1, 0, 0.0f, 1.0f, 0.0f, 1.0f, 0, 0 },
    { 1, 8, 2, 4, 1, 0, 0, 1.0f, 2.0f, 0.1f, 2.0f, 0, 0 },       /* tiles of one column */
    { 37, 64, 257, 8, 0, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 },
    { 37, 64, 257, 16, 64, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 }, /* last tile of one column */
    { 37, 8, 257, 37, 100, 0, 1, 0.0f, 2.0f, 0.5f, 1.0f, 0, 0 },  /* the teacher only for labels */
    { 37, 64, 257, 5, 0, 2, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 },   /* every position ignored */
    { 300, 130, 5000, 128, 0, 0, 0, 1.0f, 2.0f, 0.1f, 1.5f, 0, 0 },
    { 300, 130, 5000, 300, 1000, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 },
    { 300, 64, 5000, 64, 777, 0, 1, 0.15f, 1.0f, 0.2f, 1.0f, 0, 0 }, /* T = 1, Tc = 1 */
    { 300, 130, 5000, 100, 999, 1, 0, 0.15f, 2.0f, 0.1f, 1.5f, 1, 0 },
};

/* bf16_products in both memory modes: the whole vocabulary (teacher labels, KL, CAP) and tiles */
static const loss_case loss_bf16_cases[] = {
    { 37, 64, 257, 8, 0, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 1 },
    { 300, 130, 5000, 128, 0, 0, 0, 1.0f, 2.0f, 0.1f, 1.5f, 0, 1 },
    { 300, 130, 5000, 300, 1000, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 1 },
};

/* a bf16 head read in place, both memory modes: the whole vocabulary with the gradient's g
 * (300, 5000) in two k-panels of the loss's operand panel, then 600 rows (two row panels of 512
 * and 88, k-panels of 2048 columns), then tiles (one panel each) with given labels */
static const loss_case loss_head16_cases[] = {
    { 300, 130, 5000, 300, 0, 0, 0, 1.0f, 2.0f, 0.1f, 1.5f, 0, 2 },
    { 600, 64, 3000, 600, 0, 1, 1, 0.15f, 1.0f, 0.2f, 1.0f, 0, 2 },
    { 300, 130, 5000, 128, 1000, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 2 },
};

/* The loss with the DFlash2 selector (SPEC.md 2.1): a loss case plus K, r, weight, inject and
 * stop_gradient. A third of given labels are set to the student's argmax and a third to one of
 * its top K (the CPU's), so terms exist in strict mode; dA, dBs, dHp start with values (ADDED).
 * Tolerances: the values tol_loss_value; d hs and dHp (a product of dq and hs) the loss gradient's;
 * dA and dBs come from ds and q (one more product, fp32 or of bf16 values) as d hs does: the
 * same. sel_covered and sel_correct +-1 as correct (a near-tie at the K-th logit or between two
 * scores may round otherwise); run twice: the same bits. */
typedef struct {
    loss_case base;
    int64_t K, r;
    float weight;
    int inject, stop_gradient;
} selector_case;

static void case_loss_selector(const selector_case *c)
{
    const loss_case *s = &c->base;
    int len = snprintf(case_name, sizeof case_name,
                       "loss+selector n=%lld V=%lld chunk=%lld tile=%lld K=%lld r=%lld w=%g%s%s%s%s",
                       (long long)s->n, (long long)s->V, (long long)s->chunk,
                       (long long)s->vocab_tile, (long long)c->K, (long long)c->r,
                       (double)c->weight, c->inject ? " inject" : " strict",
                       c->stop_gradient ? " stop" : "", s->labels ? " given" : " teacher",
                       s->bf16 == 2 ? " bf16 head" : s->bf16 ? " bf16" : "");
    if (len >= (int)sizeof case_name)
        case_name[sizeof case_name - 1] = '\0';
    const int64_t n = s->n, H = s->H, V = s->V, K = c->K, r = c->r;
    ddk_loss_params p = { n,        H,    V,         s->chunk, s->vocab_tile,
                          s->alpha, s->T, s->lambda, s->Tc,    s->bf16 != 0, s->bf16 == 2, NULL };
    loss_inputs in = loss_make_inputs(s);
    float *A = host_floats(V * r), *Bs = host_floats(V * r), *Hp = host_floats(r * H);
    fill_uniform(A, V * r, -0.7, 0.7);
    fill_uniform(Bs, V * r, -0.7, 0.7);
    fill_uniform(Hp, r * H, -1.5 / sqrt((double)H), 1.5 / sqrt((double)H));
    if (s->bf16 == 1)
        round_bf16(Hp, r * H);   /* a product's operand, as hs and W */
    int32_t *pred = host((size_t)n * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++)
        pred[i] = (int32_t)rng_below(V);
    if (in.labels) {   /* a third the argmax, a third one of the top K: terms in strict mode */
        float *z = host_floats(n * V);
        int32_t *top = host((size_t)(n * K) * sizeof(int32_t));
        cpu->matmul(cpu, 0, 1, n, V, H, 1.0f, in.hs, H, in.W, H, 0.0f, z, V);
        cpu->topk_rows(cpu, z, n, V, K, top, NULL);
        for (int64_t i = 0; i < n; i++)
            if (in.labels[i] >= 0 && i % 3 < 2)
                in.labels[i] = top[i * K + (i % 3 ? i % K : 0)];
    }
    float *d0 = host_floats(2 * V * r + r * H);   /* dA, dBs, dHp's starting values */
    fill_uniform(d0, 2 * V * r + r * H, -0.1, 0.1);
    const int uses_teacher = ddk_loss_uses_teacher(&p, in.labels != NULL);
    float *grad = host_floats(n * H), *pp = host_floats(n), *d = host_copy(d0, 2 * V * r + r * H);
    uint16_t *W16 = s->bf16 == 2 ? host((size_t)(V * H) * sizeof(uint16_t)) : NULL;
    for (int64_t i = 0; W16 && i < V * H; i++)
        W16[i] = ddk_f32_to_bf16(in.W[i]);
    const void *W = W16 ? (const void *)W16 : in.W;
    const size_t W_bytes = (size_t)(V * H) * (W16 ? sizeof(uint16_t) : sizeof(float));
    ddk_selector sel = { K, r, c->weight, c->inject, c->stop_gradient, pred, A, Bs, Hp,
                         d, d + V * r, d + 2 * V * r };
    p.selector = &sel;
    ddk_loss_result want;
    int rc = ddk_loss_cpu(&p, in.hs, uses_teacher ? in.ht : NULL, W, in.labels, in.weights, grad,
                          pp, &want);
    check(rc == 0, "ddk_loss_cpu returned %d", rc);

    float *hs_dev = dev_floats(in.hs, n * H, "student_hidden");
    float *ht_dev = uses_teacher ? dev_floats(in.ht, n * H, "teacher_hidden") : NULL;
    void *W_dev = dev_buffer(W, W_bytes, "lm_head");
    int32_t *labels_dev = in.labels ? dev_buffer(in.labels, (size_t)n * sizeof(int32_t), "labels") : NULL;
    float *weights_dev = in.weights ? dev_floats(in.weights, n, "weights") : NULL;
    ddk_selector sel_dev = sel;
    sel_dev.predecessors = dev_buffer(pred, (size_t)n * sizeof(int32_t), "predecessors");
    sel_dev.A = dev_floats(A, V * r, "A");
    sel_dev.Bs = dev_floats(Bs, V * r, "Bs");
    sel_dev.Hp = dev_floats(Hp, r * H, "Hp");
    float *grad_dev[2], *pp_dev[2], *d_dev[2];
    for (int t = 0; t < 2; t++) {
        grad_dev[t] = dev_floats(NULL, n * H, "grad_student");
        pp_dev[t] = dev_floats(NULL, n, "per_position");
        d_dev[t] = dev_floats(d0, 2 * V * r + r * H, "dA, dBs, dHp");
    }
    ddk_loss_result got[2];
    const size_t before = ddk_allocator_stats(dev->alloc).current;
    const int64_t ws = ddk_loss_workspace_bytes(&p, uses_teacher);
    for (int t = 0; t < 2; t++) {
        sel_dev.dA = d_dev[t];
        sel_dev.dBs = d_dev[t] + V * r;
        sel_dev.dHp = d_dev[t] + 2 * V * r;
        p.selector = &sel_dev;
        ddk_allocator_reset_peak(dev->alloc);
        rc = dev->loss(dev, &p, hs_dev, ht_dev, W_dev, labels_dev, weights_dev, grad_dev[t],
                       pp_dev[t], &got[t]);
        dev_sync();
        check(rc == 0, "run %d returned %d", t + 1, rc);
        ddk_alloc_stats st = ddk_allocator_stats(dev->alloc);
        size_t used = st.peak - before, expected = want.counted ? (size_t)ws : 0;
        check(used == expected, "run %d: workspace peak %zu bytes, ddk_loss_workspace_bytes %zu",
              t + 1, used, expected);
    }
    if (rc == 0) {
        loss_scalar("loss", got[0].loss, want.loss);
        loss_scalar("ce", got[0].ce, want.ce);
        loss_scalar("kl", got[0].kl, want.kl);
        loss_scalar("cap", got[0].cap, want.cap);
        loss_scalar("sel", got[0].sel, want.sel);
        check(got[0].counted == want.counted && llabs(got[0].correct - want.correct) <= 1 &&
                  llabs(got[0].sel_covered - want.sel_covered) <= 1 &&
                  llabs(got[0].sel_correct - want.sel_correct) <= 1,
              "counted %lld correct %lld covered %lld sel_correct %lld, cpu %lld %lld %lld %lld",
              (long long)got[0].counted, (long long)got[0].correct, (long long)got[0].sel_covered,
              (long long)got[0].sel_correct, (long long)want.counted, (long long)want.correct,
              (long long)want.sel_covered, (long long)want.sel_correct);
        check(want.counted == 0 || want.sel_covered > 0, "setup: no label among the candidates");
        expect_same("result twice", &got[1], &got[0], sizeof got[0]);
    }
    const double g_tol = s->bf16 ? tol_loss_grad_bf16(V) : tol_loss_grad(V);
    float *pp_got = download(pp_dev[0], n), *grad_got = download(grad_dev[0], n * H);
    float *d_got = download(d_dev[0], 2 * V * r + r * H);
    double num = 0.0, den = 1.0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, isfinite(pp_got[i]) ? fabs((double)pp_got[i] - pp[i]) : INFINITY);
        den = fmax(den, fabs((double)pp[i]));
    }
    check(num / den <= tol_loss_value, "per_position: error %.3g > %.3g", num / den, tol_loss_value);
    expect_close("grad_student", grad_got, grad, n * H, g_tol);
    /* the selector's gradients, each against its change on the CPU (what was added) */
    float *added[2][3];
    for (int side = 0; side < 2; side++) {
        const float *x = side ? d : d_got;
        for (int t = 0; t < 3; t++) {
            const int64_t at = t * V * r, count = t < 2 ? V * r : r * H;
            added[side][t] = host_floats(count);
            for (int64_t j = 0; j < count; j++)
                added[side][t][j] = x[at + j] - d0[at + j];
        }
    }
    expect_close("dA", added[0][0], added[1][0], V * r, g_tol);
    expect_close("dBs", added[0][1], added[1][1], V * r, g_tol);
    expect_close("dHp", added[0][2], added[1][2], r * H, g_tol);
    expect_same("per_position twice", download(pp_dev[1], n), pp_got, (size_t)n * sizeof(float));
    expect_same("grad_student twice", download(grad_dev[1], n * H), grad_got,
                (size_t)(n * H) * sizeof(float));
    expect_same("dA, dBs, dHp twice", download(d_dev[1], 2 * V * r + r * H), d_got,
                (size_t)(2 * V * r + r * H) * sizeof(float));
    end_case(case_name);
}

static const selector_case loss_selector_cases[] = {
    /* { n, H, V, chunk, vocab_tile, labels, weights, alpha, T, lambda, Tc, no_outputs, bf16 },
     *   K, r, weight, inject, stop_gradient */
    { { 37, 64, 257, 8, 0, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 }, 16, 24, 1.0f, 0, 0 },
    { { 37, 64, 257, 16, 64, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 }, 16, 24, 1.0f, 1, 0 },
    { { 300, 130, 5000, 128, 0, 0, 0, 0.15f, 1.0f, 0.1f, 1.0f, 0, 0 }, 16, 32, 0.5f, 1, 0 },
    { { 300, 130, 5000, 300, 1000, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 }, 64, 256, 1.0f, 0, 1 },
    { { 300, 130, 5000, 128, 0, 0, 1, 0.15f, 1.0f, 0.1f, 1.0f, 0, 1 }, 16, 32, 1.0f, 1, 0 },
    { { 300, 130, 5000, 128, 1000, 1, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 2 }, 16, 64, 1.0f, 0, 0 },
    { { 37, 64, 257, 5, 0, 2, 1, 0.15f, 2.0f, 0.1f, 1.5f, 0, 0 }, 16, 24, 1.0f, 1, 0 },   /* all ignored */
};

/* every loss case, reseeded like main's (seq continues its count) */
static void run_loss_cases(uint64_t *seq)
{
    check(dev->loss != NULL, "loss is NULL");
    case_done("loss table");
    if (!dev->loss)
        return;
    for (size_t i = 0; i < sizeof loss_cases / sizeof loss_cases[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_loss(&loss_cases[i]);
    }
    rng_state = 0x5eed0000u + *seq;
    misalign = (*seq)++ % 2 * 4;
    case_loss_refused();
    for (size_t i = 0; dev->matmul_bf16 && i < sizeof loss_bf16_cases / sizeof loss_bf16_cases[0];
         i++) {   /* a NULL matmul_bf16 fails main's "matmul_bf16 table" */
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_loss(&loss_bf16_cases[i]);
    }
    for (size_t i = 0; i < sizeof loss_head16_cases / sizeof loss_head16_cases[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_loss(&loss_head16_cases[i]);
    }
    for (size_t i = 0; dev->matmul_bf16 && i < sizeof loss_selector_cases / sizeof loss_selector_cases[0];
         i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_loss_selector(&loss_selector_cases[i]);
    }
}

/* ------------------------------------------------------------------------------------------
 * The Qwen3.5 target's forward-only ops (SPEC.md 3.1): conv1d_silu, gated_rmsnorm,
 * rope_partial, gated_delta. A NULL op (a backend without them) prints "SKIPPED: OP not
 * implemented on CUDA yet" and runs no case (neither passed nor failed); self-check runs them on
 * the CPU.
 */

/* conv1d_silu and gated_rmsnorm: expf on both sides (CUDA's 2 ulp) after the same few float
 * products and sums, in an order and FMA contraction that may differ */
static const double tol_q35_elementwise = 2e-6;
/* gated_delta, against the CPU and chunked against the recurrence: the state carries each side's
 * rounding (tests/kernels/test_ops.c: <= 4.3e-7 against float64 on the CPU, dk <= 32; it grows like
 * sqrt(dk)), and the GPU sums its products in another order (the chunked form also folds the
 * CPU's U - W S into one solve and cuts chunks past 64): a float emulation of the GPU's order
 * differs from the CPU by <= 1.0e-6 (dk = 256), 7.5e-7 (dk = 128), and from its own recurrence
 * by <= 4e-7; FMA contraction and CUDA's exp add ulps, not orders of magnitude */
static const double tol_q35_delta = 4e-6;

static int q35_op_present(const void *op, const char *name)
{
    if (!op)
        printf("SKIPPED: %s not implemented on CUDA yet\n", name);
    return op != NULL;
}

static void case_conv1d_silu(int64_t T, int64_t C, int64_t K, int with_history)
{
    snprintf(case_name, sizeof case_name, "conv1d_silu T=%lld C=%lld K=%lld%s", (long long)T,
             (long long)C, (long long)K, with_history ? " history" : "");
    float *x = host_floats(T * C), *w = host_floats(C * K), *hist = host_floats((K - 1) * C + 1);
    fill_uniform(x, T * C, -2.0, 2.0);
    fill_uniform(w, C * K, -1.0, 1.0);
    fill_uniform(hist, (K - 1) * C + 1, -2.0, 2.0);
    float *y = host_floats(T * C);
    cpu->conv1d_silu(cpu, x, w, with_history ? hist : NULL, T, C, K, y);
    float *x_dev = dev_floats(x, T * C, "x"), *w_dev = dev_floats(w, C * K, "w");
    float *h_dev = with_history ? dev_floats(hist, (K - 1) * C + 1, "history") : NULL;
    float *y_dev = dev_floats(NULL, T * C, "y");
    dev->conv1d_silu(dev, x_dev, w_dev, h_dev, T, C, K, y_dev);
    expect_close("y", download(y_dev, T * C), y, T * C, tol_q35_elementwise);
    end_case(case_name);
}

static const char *const gated_where[] = { "", " y=x", " y=z" };

static void case_gated_rmsnorm(int64_t rows, int64_t d, int where)
{
    snprintf(case_name, sizeof case_name, "gated_rmsnorm rows=%lld d=%lld%s", (long long)rows,
             (long long)d, gated_where[where]);
    float *x = host_floats(rows * d), *z = host_floats(rows * d), *w = host_floats(d);
    fill_uniform(x, rows * d, -2.0, 2.0);
    fill_uniform(z, rows * d, -8.0, 8.0);
    fill_uniform(w, d, -1.5, 1.5);
    float *y = host_floats(rows * d);
    cpu->gated_rmsnorm(cpu, x, z, w, rows, d, 1e-6f, y);
    float *x_dev = dev_floats(x, rows * d, "x"), *z_dev = dev_floats(z, rows * d, "z");
    float *w_dev = dev_floats(w, d, "w");
    float *y_dev = where == 1 ? x_dev : where == 2 ? z_dev : dev_floats(NULL, rows * d, "y");
    dev->gated_rmsnorm(dev, x_dev, z_dev, w_dev, rows, d, 1e-6f, y_dev);
    expect_close("y", download(y_dev, rows * d), y, rows * d, tol_q35_elementwise);
    end_case(case_name);
}

static void case_rope_partial(int64_t rows, int64_t heads, int64_t d, int64_t rd)
{
    snprintf(case_name, sizeof case_name, "rope_partial rows=%lld heads=%lld d=%lld rd=%lld",
             (long long)rows, (long long)heads, (long long)d, (long long)rd);
    const int64_t n = rows * heads * d;
    int32_t *pos = host((size_t)rows * sizeof(int32_t));
    for (int64_t r = 0; r < rows; r++)
        pos[r] = (int32_t)(r == rows - 1 ? 100000 : r * 37);
    float *x = host_floats(n);
    fill_uniform(x, n, -1.0, 1.0);
    float *y = host_copy(x, n);
    cpu->rope_partial(cpu, y, pos, rows, heads, d, rd, 1e7f);
    float *x_dev = dev_floats(x, n, "x");
    int32_t *pos_dev = dev_buffer(pos, (size_t)rows * sizeof(int32_t), "pos");
    dev->rope_partial(dev, x_dev, pos_dev, rows, heads, d, rd, 1e7f);
    float *got = download(x_dev, n);
    expect_close("x", got, y, n, tol_rope);
    if (rd == d) {   /* ddk.h: rd = d is the backend's own rope (inverse 0) bit for bit */
        float *r_dev = dev_floats(x, n, "x for rope");
        dev->rope(dev, r_dev, pos_dev, rows, heads, d, 1e7f, 0);
        expect_same("x vs rope", got, download(r_dev, n), (size_t)n * sizeof(float));
    }
    end_case(case_name);
}

static void case_gated_delta(int64_t T, int64_t nk, int64_t nv, int64_t dk, int64_t dv, int64_t chunk)
{
    snprintf(case_name, sizeof case_name, "gated_delta T=%lld nk=%lld nv=%lld dk=%lld dv=%lld chunk=%lld",
             (long long)T, (long long)nk, (long long)nv, (long long)dk, (long long)dv, (long long)chunk);
    const ddk_delta_shape s = { .T = T, .nk = nk, .nv = nv, .dk = dk, .dv = dv, .chunk = chunk };
    const int64_t nq = T * nk * dk, no = T * nv * dv, ns = nv * dk * dv;
    float *q = host_floats(nq), *k = host_floats(nq), *v = host_floats(no);
    float *beta = host_floats(T * nv), *g = host_floats(T * nv), *S0 = host_floats(ns);
    fill_uniform(q, nq, -1.0, 1.0);
    fill_uniform(k, nq, -1.0, 1.0);
    for (int64_t r = 0; r < T * nk; r++) {   /* l2-normed rows, q scaled by 1/sqrt(dk) */
        double qq = 0.0, kk = 0.0;
        for (int64_t i = 0; i < dk; i++)
            qq += (double)q[r * dk + i] * q[r * dk + i], kk += (double)k[r * dk + i] * k[r * dk + i];
        for (int64_t i = 0; i < dk; i++)
            q[r * dk + i] = (float)(q[r * dk + i] / sqrt(qq * dk)), k[r * dk + i] = (float)(k[r * dk + i] / sqrt(kk));
    }
    fill_uniform(v, no, -1.0, 1.0);
    fill_uniform(beta, T * nv, 0.04, 0.96);
    fill_uniform(g, T * nv, -2.8, -0.0003);
    fill_uniform(S0, ns, -0.5, 0.5);
    float *S = host_copy(S0, ns), *out = host_floats(no);
    check(cpu->gated_delta(cpu, &s, q, k, v, beta, g, S, out) == 0, "the CPU's gated_delta failed");
    float *q_dev = dev_floats(q, nq, "q"), *k_dev = dev_floats(k, nq, "k"), *v_dev = dev_floats(v, no, "v");
    float *b_dev = dev_floats(beta, T * nv, "beta"), *g_dev = dev_floats(g, T * nv, "g");
    float *S_dev = dev_floats(S0, ns, "state"), *out_dev = dev_floats(NULL, no, "out");
    check(dev->gated_delta(dev, &s, q_dev, k_dev, v_dev, b_dev, g_dev, S_dev, out_dev) == 0, "gated_delta failed");
    float *out_got = download(out_dev, no), *S_got = download(S_dev, ns);
    expect_close("out", out_got, out, no, tol_q35_delta);
    expect_close("state", S_got, S, ns, tol_q35_delta);
    if (chunk > 0) {   /* the chunked form against the backend's own recurrence */
        ddk_delta_shape r = s;
        r.chunk = 0;
        float *S2_dev = dev_floats(S0, ns, "state (recurrence)");
        float *out2_dev = dev_floats(NULL, no, "out (recurrence)");
        check(dev->gated_delta(dev, &r, q_dev, k_dev, v_dev, b_dev, g_dev, S2_dev, out2_dev) == 0,
              "gated_delta's recurrence failed");
        expect_close("out vs recurrence", out_got, download(out2_dev, no), no, tol_q35_delta);
        expect_close("state vs recurrence", S_got, download(S2_dev, ns), ns, tol_q35_delta);
    }
    end_case(case_name);
}

/* -EINVAL for nv % nk != 0 on every backend; on the GPU also past dk, dv = 256 (its limit,
 * ddk.h). Refused before any pointer is touched: NULL buffers. */
static void case_gated_delta_refused(int self_check)
{
    static const ddk_delta_shape bad[] = {
        { .T = 4, .nk = 2, .nv = 3, .dk = 8, .dv = 8, .chunk = 0 },
        { .T = 4, .nk = 2, .nv = 3, .dk = 8, .dv = 8, .chunk = 64 },
        { .T = 4, .nk = 1, .nv = 1, .dk = 8, .dv = 8, .chunk = -1 },
        { .T = 4, .nk = 1, .nv = 1, .dk = 257, .dv = 8, .chunk = 0 },   /* GPU only from here */
        { .T = 4, .nk = 1, .nv = 1, .dk = 8, .dv = 257, .chunk = 64 },
    };
    const size_t n = self_check ? 3 : sizeof bad / sizeof bad[0];
    for (size_t i = 0; i < n; i++) {
        const int rc = dev->gated_delta(dev, &bad[i], NULL, NULL, NULL, NULL, NULL, NULL, NULL);
        check(rc == -EINVAL, "gated_delta T=%lld nk=%lld nv=%lld dk=%lld dv=%lld chunk=%lld: rc %d, not -EINVAL",
              (long long)bad[i].T, (long long)bad[i].nk, (long long)bad[i].nv, (long long)bad[i].dk,
              (long long)bad[i].dv, (long long)bad[i].chunk, rc);
    }
    end_case("gated_delta refusals");
}

static void run_qwen35_cases(uint64_t *seq, int self_check)
{
#define NEXT_Q35() (rng_state = 0x5eed0000u + *seq, misalign = ((*seq)++ % 2) * 4)
    /* (T, C, K): T < K - 1 (history rows only), C past and short of the 256-thread block */
    static const int64_t conv[][3] = { { 1, 3, 4 }, { 17, 130, 4 }, { 513, 1030, 4 }, { 40, 257, 3 } };
    if (q35_op_present((const void *)dev->conv1d_silu, "conv1d_silu"))
        for (size_t i = 0; i < sizeof conv / sizeof conv[0]; i++)
            for (int h = 0; h <= 1; h++) {
                NEXT_Q35();
                case_conv1d_silu(conv[i][0], conv[i][1], conv[i][2], h);
            }
    /* (rows, d): the DeltaNet's dv = 128, odd d, a part-filled warp and block */
    static const int64_t gnorm[][2] = { { 1, 1 }, { 17, 130 }, { 1000, 128 }, { 33, 257 }, { 5, 5120 } };
    if (q35_op_present((const void *)dev->gated_rmsnorm, "gated_rmsnorm")) {
        for (size_t i = 0; i < sizeof gnorm / sizeof gnorm[0]; i++) {
            NEXT_Q35();
            case_gated_rmsnorm(gnorm[i][0], gnorm[i][1], 0);
        }
        for (int where = 1; where <= 2; where++) {
            NEXT_Q35();
            case_gated_rmsnorm(17, 257, where);
        }
    }
    /* (rows, heads, d, rd): Qwen3.6's 64 of 256, rd/2 not a multiple of 32, rd = d (bit for bit
     * the backend's rope) */
    static const int64_t partial[][4] = { { 1, 1, 2, 2 }, { 17, 3, 32, 8 }, { 300, 24, 256, 64 },
                                          { 33, 5, 128, 42 }, { 17, 3, 64, 64 }, { 9, 4, 130, 130 },
                                          { 5, 2, 256, 256 } };
    if (q35_op_present((const void *)dev->rope_partial, "rope_partial"))
        for (size_t i = 0; i < sizeof partial / sizeof partial[0]; i++) {
            NEXT_Q35();
            case_rope_partial(partial[i][0], partial[i][1], partial[i][2], partial[i][3]);
        }
    /* (T, nk, nv, dk, dv, chunk): tiny and odd shapes, T not a multiple of the chunk, Qwen3.6's
     * dk = dv = 128 with nv = 3 nk and 2 nk, dims that part-fill a warp and a column block,
     * dk = dv = 256 (the GPU's limit, its largest shared memory), a chunk past the GPU's 64 */
    static const int64_t delta[][6] = { { 1, 1, 1, 1, 1, 0 }, { 7, 2, 4, 5, 3, 3 }, { 200, 2, 6, 16, 16, 64 },
                                        { 130, 4, 12, 128, 128, 64 }, { 3, 4, 12, 128, 128, 0 },
                                        { 130, 2, 4, 128, 128, 64 }, { 130, 2, 4, 128, 128, 0 },
                                        { 77, 3, 6, 33, 37, 64 }, { 77, 3, 6, 33, 37, 0 },
                                        { 5, 1, 1, 7, 40, 2 }, { 70, 1, 2, 256, 256, 64 },
                                        { 70, 1, 2, 256, 256, 0 }, { 100, 1, 2, 64, 64, 105 } };
    if (q35_op_present((const void *)dev->gated_delta, "gated_delta")) {
        for (size_t i = 0; i < sizeof delta / sizeof delta[0]; i++) {
            NEXT_Q35();
            case_gated_delta(delta[i][0], delta[i][1], delta[i][2], delta[i][3], delta[i][4], delta[i][5]);
        }
        case_gated_delta_refused(self_check);
    }
#undef NEXT_Q35
}

/* ------------------------------------------------------------------------------------------
 * The frozen target on bf16 weights and its element-wise steps: matmul_w16, embedding_w16,
 * copy_rows, l2norm_heads, sigmoid_mul, delta_gates, and causal attention over a cache
 * (q_rows). A NULL op prints "SKIPPED: OP not implemented on CUDA yet" (q35_op_present).
 */

/* matmul_w16: the same bf16 operands on both sides (a rounded to nearest even by each, W as
 * stored), products exact in fp32: only the fp32 sums' order differs, tol_matmul(k) */

/* trans 1: matmul_w16 (W (n, k)), 0: matmul_w16_nn (W (k, n)); m, n, k, pad (every leading
 * dimension), alpha, beta */
static void case_matmul_w16(int trans, int64_t m, int64_t n, int64_t k, int64_t pad, float alpha,
                            float beta)
{
    snprintf(case_name, sizeof case_name, "%s %lldx%lldx%lld pad=%lld alpha=%g beta=%g",
             trans ? "matmul_w16" : "matmul_w16_nn", (long long)m, (long long)n, (long long)k,
             (long long)pad, (double)alpha, (double)beta);
    const int64_t w_rows = trans ? n : k, ldw = (trans ? k : n) + pad;
    const int64_t lda = k + pad, ldc = n + pad;
    float *a = host_floats(m * lda), *c0 = host_floats(m * ldc);
    uint16_t *w = host((size_t)(w_rows * ldw) * sizeof(uint16_t));   /* (w_rows, ldw) bf16 */
    fill_uniform(a, m * lda, -1.0, 1.0);
    fill_uniform(c0, m * ldc, -1.0, 1.0);
    for (int64_t i = 0; i < w_rows * ldw; i++)
        w[i] = ddk_f32_to_bf16((float)(-1.0 + 2.0 * ddk_rng_uniform(&rng_state)));
    if (beta == 0.0f)
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                c0[i * ldc + j] = NAN;
    float *c = host_copy(c0, m * ldc);
    (trans ? cpu->matmul_w16 : cpu->matmul_w16_nn)(cpu, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
    float *a_dev = dev_floats(a, m * lda, "a"), *c_dev = dev_floats(c0, m * ldc, "c");
    uint16_t *w_dev = dev_buffer(w, (size_t)(w_rows * ldw) * sizeof(uint16_t), "W");
    (trans ? dev->matmul_w16 : dev->matmul_w16_nn)(dev, m, n, k, alpha, a_dev, lda, w_dev, ldw,
                                                   beta, c_dev, ldc);
    float *got = download(c_dev, m * ldc);
    float *got_block, *want_block;
    c_blocks(got, c, c0, m, n, ldc, &got_block, &want_block);
    expect_close("c", got_block, want_block, m * n, tol_matmul(k));
    end_case(case_name);
}

static void case_embedding_w16(int64_t rows, int64_t H, int64_t V)
{
    snprintf(case_name, sizeof case_name, "embedding_w16 rows=%lld H=%lld V=%lld", (long long)rows,
             (long long)H, (long long)V);
    uint16_t *table = host((size_t)(V * H) * sizeof(uint16_t));   /* (V, H) bf16, any finite bits */
    for (int64_t i = 0; i < V * H; i++)
        do
            table[i] = (uint16_t)ddk_rng_next(&rng_state);
        while ((table[i] & 0x7f80u) == 0x7f80u);
    int32_t *tokens = host((size_t)rows * sizeof(int32_t));
    for (int64_t r = 0; r < rows; r++)
        tokens[r] = (int32_t)(r == 0 ? V - 1 : r == rows - 1 ? 0 : rng_below(V));
    float *out = host_floats(rows * H);
    cpu->embedding_w16(cpu, table, tokens, rows, H, out);
    uint16_t *table_dev = dev_buffer(table, (size_t)(V * H) * sizeof(uint16_t), "table");
    int32_t *tokens_dev = dev_buffer(tokens, (size_t)rows * sizeof(int32_t), "tokens");
    float *out_dev = dev_floats(NULL, rows * H, "out");
    dev->embedding_w16(dev, table_dev, tokens_dev, rows, H, out_dev);
    expect_same("out", download(out_dev, rows * H), out, (size_t)(rows * H) * sizeof(float));
    end_case(case_name);
}

/* device to device, and host to device (copy_rows takes any pointers, as copy): exact, the
 * padding of dst as it started */
static void case_copy_rows(int64_t rows, int64_t cols, int64_t pad_src, int64_t pad_dst)
{
    snprintf(case_name, sizeof case_name, "copy_rows rows=%lld cols=%lld ld_src=+%lld ld_dst=+%lld",
             (long long)rows, (long long)cols, (long long)pad_src, (long long)pad_dst);
    const int64_t ld_src = cols + pad_src, ld_dst = cols + pad_dst;
    float *src = host_floats(rows * ld_src), *dst0 = host_floats(rows * ld_dst);
    fill_uniform(src, rows * ld_src, -1.0, 1.0);
    fill_uniform(dst0, rows * ld_dst, 5.0, 6.0);
    float *want = host_copy(dst0, rows * ld_dst);
    cpu->copy_rows(cpu, want, ld_dst, src, ld_src, rows, cols);
    float *src_dev = dev_floats(src, rows * ld_src, "src");
    float *dst_dev = dev_floats(dst0, rows * ld_dst, "dst"), *dst2_dev = dev_floats(dst0, rows * ld_dst, "dst (from host)");
    dev->copy_rows(dev, dst_dev, ld_dst, src_dev, ld_src, rows, cols);
    dev->copy_rows(dev, dst2_dev, ld_dst, src, ld_src, rows, cols);
    expect_same("dst", download(dst_dev, rows * ld_dst), want, (size_t)(rows * ld_dst) * sizeof(float));
    expect_same("dst from host", download(dst2_dev, rows * ld_dst), want, (size_t)(rows * ld_dst) * sizeof(float));
    end_case(case_name);
}

/* l2norm_heads: the GPU sums d squares per lane and by a shuffle tree, the CPU in index order,
 * both in float (~sqrt(d) 2^-24); then the same sqrtf, division and product (IEEE on both) */
static void case_l2norm_heads(int64_t T, int64_t heads, int64_t d, int64_t pad, int in_place)
{
    snprintf(case_name, sizeof case_name, "l2norm_heads T=%lld heads=%lld d=%lld ld=+%lld%s",
             (long long)T, (long long)heads, (long long)d, (long long)pad, in_place ? " in place" : "");
    const int64_t ld = heads * d + pad, n = T * heads * d;
    const float scale = 1.0f / sqrtf((float)d);
    float *src = host_floats(T * ld);
    fill_uniform(src, T * ld, -2.0, 2.0);
    float *dst = host_floats(n);
    cpu->l2norm_heads(cpu, src, ld, T, heads, d, scale, 1e-6f, dst);
    float *src_dev = dev_floats(src, T * ld, "src");
    float *dst_dev = in_place ? src_dev : dev_floats(NULL, n, "dst");
    dev->l2norm_heads(dev, src_dev, ld, T, heads, d, scale, 1e-6f, dst_dev);
    expect_close("dst", download(dst_dev, n), dst, n, tol_q35_elementwise);
    end_case(case_name);
}

static void case_sigmoid_mul(int64_t count)
{
    snprintf(case_name, sizeof case_name, "sigmoid_mul count=%lld", (long long)count);
    float *x = host_floats(count), *gate = host_floats(count);
    fill_uniform(x, count, -3.0, 3.0);
    fill_uniform(gate, count, -30.0, 30.0);
    float *want = host_copy(x, count);
    cpu->sigmoid_mul(cpu, want, gate, count);
    float *x_dev = dev_floats(x, count, "x"), *gate_dev = dev_floats(gate, count, "gate");
    dev->sigmoid_mul(dev, x_dev, gate_dev, count);
    expect_close("x", download(x_dev, count), want, count, tol_q35_elementwise);
    end_case(case_name);
}

/* delta_gates: CUDA's expf and log1pf (2 and 1 ulp) against glibc's, a product: a few ulps */
static void case_delta_gates(int64_t T, int64_t nv, int in_place)
{
    snprintf(case_name, sizeof case_name, "delta_gates T=%lld nv=%lld%s", (long long)T, (long long)nv,
             in_place ? " in place" : "");
    const int64_t n = T * nv;
    float *b = host_floats(n), *a = host_floats(n), *A_log = host_floats(nv), *dt_bias = host_floats(nv);
    fill_uniform(b, n, -10.0, 10.0);
    fill_uniform(a, n, -25.0, 25.0);   /* a + dt_bias past the softplus threshold 20 both ways */
    fill_uniform(A_log, nv, -3.0, 2.0);
    fill_uniform(dt_bias, nv, -5.0, 5.0);
    float *beta = host_floats(n), *g = host_floats(n);
    cpu->delta_gates(cpu, b, a, A_log, dt_bias, T, nv, beta, g);
    float *b_dev = dev_floats(b, n, "b"), *a_dev = dev_floats(a, n, "a");
    float *A_dev = dev_floats(A_log, nv, "A_log"), *dt_dev = dev_floats(dt_bias, nv, "dt_bias");
    float *beta_dev = in_place ? b_dev : dev_floats(NULL, n, "beta");
    float *g_dev = in_place ? a_dev : dev_floats(NULL, n, "g");
    dev->delta_gates(dev, b_dev, a_dev, A_dev, dt_dev, T, nv, beta_dev, g_dev);
    expect_close("beta", download(beta_dev, n), beta, n, tol_q35_elementwise);
    expect_close("g", download(g_dev, n), g, n, tol_q35_elementwise);
    end_case(case_name);
}

/* causal attention of the last q_rows of S positions (tol_attn_fwd's reason) */
static void case_causal_cached(int64_t S, int64_t q_rows, int64_t nh, int64_t nkv, int64_t d)
{
    snprintf(case_name, sizeof case_name, "causal_attention S=%lld q_rows=%lld nh=%lld nkv=%lld d=%lld",
             (long long)S, (long long)q_rows, (long long)nh, (long long)nkv, (long long)d);
    const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = q_rows };
    const int64_t T = q_rows ? q_rows : S, nq = T * nh * d, nk = S * nkv * d;
    float *q = host_floats(nq), *k = host_floats(nk), *v = host_floats(nk);
    fill_uniform(q, nq, -2.0, 2.0);
    fill_uniform(k, nk, -2.0, 2.0);
    fill_uniform(v, nk, -1.0, 1.0);
    float *out = host_floats(nq);
    check(cpu->causal_attention(cpu, &sh, q, k, v, out) == 0, "cpu causal");
    float *q_dev = dev_floats(q, nq, "q"), *k_dev = dev_floats(k, nk, "k"),
          *v_dev = dev_floats(v, nk, "v"), *out_dev = dev_floats(NULL, nq, "out");
    int rc = dev->causal_attention(dev, &sh, q_dev, k_dev, v_dev, out_dev);
    check(rc == 0, "causal returned %d", rc);
    expect_close("out", download(out_dev, nq), out, nq, attn_flash ? tol_flash_fwd : tol_attn_fwd);
    const ddk_attention_shape bad = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = S + 1 };
    rc = dev->causal_attention(dev, &bad, q_dev, k_dev, v_dev, out_dev);
    check(rc == -EINVAL, "q_rows = S + 1: rc %d, not -EINVAL", rc);
    end_case(case_name);
}

/* tree attention (the DDTree verify) of N nodes over P cached keys, parents random in [-1, i)
 * (deep: 31 in 32 are i - 1, paths of ~N nodes); the CUDA kernel has no flash variant, so
 * tol_attn_fwd's reason holds (fp32 online softmax both sides, keys in other orders). Then the
 * node 3 of the same tree made its own parent: the CPU refuses it (-EINVAL); the GPU cannot check
 * parents on the host, so it writes NaN into the rows whose path reaches the bad parent and must
 * neither read past parents (the guards) nor hang */
static void case_tree_attention(int64_t N, int64_t P, int64_t nh, int64_t nkv, int64_t d, int deep)
{
    snprintf(case_name, sizeof case_name, "tree_attention N=%lld P=%lld nh=%lld nkv=%lld d=%lld%s",
             (long long)N, (long long)P, (long long)nh, (long long)nkv, (long long)d,
             deep ? " deep" : "");
    const int64_t S = P + N, nq = N * nh * d, nk = S * nkv * d;
    const ddk_attention_shape sh = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = N };
    int32_t *parents = host((size_t)N * sizeof(int32_t));
    for (int64_t i = 0; i < N; i++)
        parents[i] = deep && i > 0 && rng_below(32) != 0 ? (int32_t)(i - 1)
                                                         : (int32_t)(rng_below(i + 1) - 1);
    float *q = host_floats(nq), *k = host_floats(nk), *v = host_floats(nk);
    fill_uniform(q, nq, -2.0, 2.0);
    fill_uniform(k, nk, -2.0, 2.0);
    fill_uniform(v, nk, -1.0, 1.0);
    float *out = host_floats(nq);
    check(cpu->tree_attention(cpu, &sh, q, k, v, parents, out) == 0, "cpu tree");
    float *q_dev = dev_floats(q, nq, "q"), *k_dev = dev_floats(k, nk, "k"),
          *v_dev = dev_floats(v, nk, "v"), *out_dev = dev_floats(NULL, nq, "out");
    int32_t *parents_dev = dev_buffer(parents, (size_t)N * sizeof(int32_t), "parents");
    int rc = dev->tree_attention(dev, &sh, q_dev, k_dev, v_dev, parents_dev, out_dev);
    check(rc == 0, "tree returned %d", rc);
    expect_close("out", download(out_dev, nq), out, nq, tol_attn_fwd);
    const ddk_attention_shape bad = { .S = S, .nh = nh, .nkv = nkv, .d = d, .q_rows = S + 1 };
    rc = dev->tree_attention(dev, &bad, q_dev, k_dev, v_dev, parents_dev, out_dev);
    check(rc == -EINVAL, "q_rows = S + 1: rc %d, not -EINVAL", rc);
    if (N > 3) {
        int32_t *looped = host((size_t)N * sizeof(int32_t));
        memcpy(looped, parents, (size_t)N * sizeof(int32_t));
        looped[3] = 3;
        int32_t *looped_dev = dev_buffer(looped, (size_t)N * sizeof(int32_t), "parents (bad)");
        float *bad_dev = dev_floats(NULL, nq, "out (bad tree)");
        rc = dev->tree_attention(dev, &sh, q_dev, k_dev, v_dev, looped_dev, bad_dev);
        if (dev == cpu) {   /* self-check */
            check(rc == -EINVAL, "a node its own parent: rc %d, not -EINVAL", rc);
        } else {
            check(rc == 0, "a node its own parent: rc %d (the GPU cannot see it)", rc);
            const float *got = download(bad_dev, nq);
            int64_t wrong = 0;
            for (int64_t i = 0; i < N; i++) {
                int reaches = 0;   /* does node i's path pass node 3? */
                for (int64_t j = i; j >= 0 && !reaches; j = j == 3 ? -1 : looped[j])
                    reaches = j == 3;
                for (int64_t e = 0; e < nh * d; e++) {
                    const float x = got[i * nh * d + e], want = out[i * nh * d + e];
                    wrong += reaches ? !isnan(x) : !(fabsf(x - want) <= 1e-3f);
                }
            }
            check(wrong == 0, "a node its own parent: %lld values not NaN where the path reaches "
                  "it or far from the good tree's elsewhere", (long long)wrong);
        }
    }
    end_case(case_name);
}

static void run_target_cases(uint64_t *seq)
{
#define NEXT_T() (rng_state = 0x5eed0000u + *seq, misalign = ((*seq)++ % 2) * 4)
    /* (m, n, k, pad, alpha, beta): tiny, odd, one token through a Qwen3.6-wide projection, a
     * prefill past one scratch panel (1000 rows of k 5120: 384-row panels), k past the scratch
     * (2^21 + 5 columns: two k-panels accumulating), k = 0 */
    static const struct { int64_t m, n, k, pad; float alpha, beta; } w16[] = {
        { 1, 1, 1, 0, 1.0f, 0.0f }, { 3, 5, 7, 3, 0.5f, 0.25f }, { 17, 33, 65, 1, -1.0f, 1.0f },
        { 130, 64, 2, 0, 1.0f, 0.0f }, { 1, 4096, 5120, 0, 1.0f, 0.0f }, { 1000, 130, 5120, 5, 1.0f, 1.0f },
        { 2, 3, (1 << 21) + 5, 1, 1.0f, 0.5f }, { 4, 3, 0, 2, 1.0f, 0.5f },
    };
    if (q35_op_present((const void *)dev->matmul_w16, "matmul_w16"))
        for (size_t i = 0; i < sizeof w16 / sizeof w16[0]; i++) {
            NEXT_T();
            case_matmul_w16(1, w16[i].m, w16[i].n, w16[i].k, w16[i].pad, w16[i].alpha, w16[i].beta);
        }
    /* matmul_w16_nn, W (k, n): the same shapes, and the loss's gradient product d hs = g W (k
     * the vocabulary: rows of a in 384-row panels at k 5000) */
    if (q35_op_present((const void *)dev->matmul_w16_nn, "matmul_w16_nn")) {
        for (size_t i = 0; i < sizeof w16 / sizeof w16[0]; i++) {
            NEXT_T();
            case_matmul_w16(0, w16[i].m, w16[i].n, w16[i].k, w16[i].pad, w16[i].alpha, w16[i].beta);
        }
        NEXT_T();
        case_matmul_w16(0, 1000, 130, 5000, 3, 1.0f, 1.0f);
    }
    static const int64_t emb[][3] = { { 1, 2, 3 }, { 3, 6, 5 }, { 17, 130, 1000 }, { 1000, 5120, 300 } };
    if (q35_op_present((const void *)dev->embedding_w16, "embedding_w16"))
        for (size_t i = 0; i < sizeof emb / sizeof emb[0]; i++) {
            NEXT_T();
            case_embedding_w16(emb[i][0], emb[i][1], emb[i][2]);
        }
    static const int64_t crow[][4] = { { 1, 1, 0, 0 }, { 3, 5, 2, 0 }, { 17, 130, 0, 7 }, { 1000, 128, 10240, 3 } };
    if (q35_op_present((const void *)dev->copy_rows, "copy_rows"))
        for (size_t i = 0; i < sizeof crow / sizeof crow[0]; i++) {
            NEXT_T();
            case_copy_rows(crow[i][0], crow[i][1], crow[i][2], crow[i][3]);
        }
    /* (T, heads, d, ld padding, in place): Qwen3.6's 16 key heads of 128 in a row of 10240 */
    static const int64_t l2[][5] = { { 1, 1, 1, 0, 0 }, { 7, 3, 5, 4, 0 }, { 300, 16, 128, 8192, 0 },
                                     { 33, 2, 257, 0, 1 }, { 17, 16, 128, 0, 1 } };
    if (q35_op_present((const void *)dev->l2norm_heads, "l2norm_heads"))
        for (size_t i = 0; i < sizeof l2 / sizeof l2[0]; i++) {
            NEXT_T();
            case_l2norm_heads(l2[i][0], l2[i][1], l2[i][2], l2[i][3], (int)l2[i][4]);
        }
    static const int64_t sig[] = { 1, 17, 1000003 };
    if (q35_op_present((const void *)dev->sigmoid_mul, "sigmoid_mul"))
        for (size_t i = 0; i < sizeof sig / sizeof sig[0]; i++) {
            NEXT_T();
            case_sigmoid_mul(sig[i]);
        }
    static const int64_t gates[][3] = { { 1, 1, 0 }, { 17, 48, 0 }, { 1000, 48, 1 }, { 3, 5, 1 } };
    if (q35_op_present((const void *)dev->delta_gates, "delta_gates"))
        for (size_t i = 0; i < sizeof gates / sizeof gates[0]; i++) {
            NEXT_T();
            case_delta_gates(gates[i][0], gates[i][1], (int)gates[i][2]);
        }
    /* (S, q_rows, nh, nkv, d): a decoding step and a verify block over 70 keys, q_rows = S and
     * 0 (the same call), a long cache, the widest head */
    static const int64_t cached[][5] = { { 70, 1, 4, 2, 64 }, { 70, 5, 4, 2, 64 }, { 70, 70, 2, 1, 32 },
                                         { 70, 0, 2, 1, 32 }, { 2048, 1, 8, 2, 128 }, { 300, 17, 4, 4, 100 },
                                         { 257, 3, 2, 1, DDK_CUDA_MAX_HEAD_DIM } };
    if (dev->causal_attention)
        for (size_t i = 0; i < sizeof cached / sizeof cached[0]; i++) {
            NEXT_T();
            case_causal_cached(cached[i][0], cached[i][1], cached[i][2], cached[i][3], cached[i][4]);
        }
    /* (N, P, nh, nkv, d, deep): the root alone, no cache; a small tree; a cache past the key
     * chunks; the seed's heads over a long cache; d not a multiple of 32 with G = 1; the widest
     * head with paths of ~150 nodes (past the 32-key chunks); one warp's worth of nodes, deep */
    static const int64_t tree[][6] = { { 1, 0, 4, 2, 16, 0 }, { 17, 0, 4, 2, 16, 0 },
                                       { 33, 100, 4, 2, 16, 0 }, { 64, 4000, 32, 8, 128, 0 },
                                       { 200, 300, 4, 4, 100, 0 },
                                       { 150, 70, 2, 1, DDK_CUDA_MAX_HEAD_DIM, 1 },
                                       { 32, 5, 8, 2, 64, 1 } };
    check(dev->tree_attention != NULL, "tree_attention is NULL");
    case_done("tree_attention table");
    if (dev->tree_attention)
        for (size_t i = 0; i < sizeof tree / sizeof tree[0]; i++) {
            NEXT_T();
            case_tree_attention(tree[i][0], tree[i][1], tree[i][2], tree[i][3], tree[i][4],
                                (int)tree[i][5]);
        }
    /* (rows, n): one element; odd; the tree's nodes over a small vocabulary; a block over the
     * seed's vocabulary (248,320); the last row all -inf and NaN in each */
    static const int64_t argmax[][2] = { { 1, 1 }, { 3, 7 }, { 33, 1000 }, { 24, 248320 }, { 5, 300 } };
    check(dev->argmax_rows != NULL, "argmax_rows is NULL");
    for (size_t i = 0; dev->argmax_rows && i < sizeof argmax / sizeof argmax[0]; i++) {
        NEXT_T();
        case_argmax_rows(argmax[i][0], argmax[i][1]);
    }
    /* (rows, n, k): k = n = 1; k = n; a row wider than a block at the selector's K; the seed's
     * vocabulary; k = 64 */
    static const int64_t topk[][3] = { { 1, 1, 1 }, { 3, 7, 7 }, { 33, 1000, 16 }, { 24, 248320, 16 },
                                       { 5, 300, 64 } };
    check(dev->topk_rows != NULL, "topk_rows is NULL");
    for (size_t i = 0; dev->topk_rows && i < sizeof topk / sizeof topk[0]; i++) {
        NEXT_T();
        case_topk_rows(topk[i][0], topk[i][1], topk[i][2]);
    }
#undef NEXT_T
}

/* ------------------------------------------------------------------------------------------
 * The bf16 step's products (daemon/engine/model/drafter.c): matmul_16 on the weights' bf16 copies,
 * against activations rounded once by round_bf16 (and the copies refreshed by adamw's w16, in
 * case_adamw)
 */

/* x (rows, ld) bf16: random values in [-1, 1] in the first cols columns, NaN bits past them (a
 * product that read its padding would show NaN in c) */
static void bf16_values(uint16_t *x, int64_t rows, int64_t cols, int64_t ld)
{
    for (int64_t r = 0; r < rows; r++)
        for (int64_t q = 0; q < ld; q++)
            x[r * ld + q] = q < cols ? ddk_f32_to_bf16((float)(-1.0 + 2.0 * ddk_rng_uniform(&rng_state)))
                                     : 0x7fc0u;
}

/* matmul_16: the same bf16 operands on both sides, as stored (nothing rounded anywhere), products
 * exact in fp32: only the fp32 sums' order differs (cuBLAS's tiles, OpenBLAS's kernels over the
 * CPU's 256-column panels), tol_matmul(k) as matmul_w16. beta = 0 starts c as NaN; c's padding
 * must stay as it was. */
static void case_matmul_16(const matmul_shape *s)
{
    snprintf(case_name, sizeof case_name, "matmul_16 %lldx%lldx%lld %c%c pad=%lld alpha=%g beta=%g",
             (long long)s->m, (long long)s->n, (long long)s->k, s->trans_a ? 'T' : 'N',
             s->trans_b ? 'T' : 'N', (long long)s->pad, (double)s->alpha, (double)s->beta);
    /* a as stored: (m, k), or (k, m) when trans_a; b: (k, n), or (n, k) when trans_b */
    const int64_t a_rows = s->trans_a ? s->k : s->m, a_cols = s->trans_a ? s->m : s->k;
    const int64_t b_rows = s->trans_b ? s->n : s->k, b_cols = s->trans_b ? s->k : s->n;
    const int64_t lda = a_cols + s->pad, ldb = b_cols + s->pad, ldc = s->n + s->pad;
    const size_t a_bytes = (size_t)(a_rows * lda) * sizeof(uint16_t),
                 b_bytes = (size_t)(b_rows * ldb) * sizeof(uint16_t);
    uint16_t *a = host(a_bytes), *b = host(b_bytes);   /* bf16 */
    float *c0 = host_floats(s->m * ldc);                /* c's start */
    bf16_values(a, a_rows, a_cols, lda);
    bf16_values(b, b_rows, b_cols, ldb);
    fill_uniform(c0, s->m * ldc, -1.0, 1.0);
    if (s->beta == 0.0f)
        for (int64_t i = 0; i < s->m; i++)
            for (int64_t j = 0; j < s->n; j++)
                c0[i * ldc + j] = NAN;
    float *c = host_copy(c0, s->m * ldc);
    cpu->matmul_16(cpu, s->trans_a, s->trans_b, s->m, s->n, s->k, s->alpha, a, lda, b, ldb, s->beta,
                   c, ldc);

    uint16_t *a_dev = dev_buffer(a, a_bytes, "a"), *b_dev = dev_buffer(b, b_bytes, "b");
    float *c_dev = dev_floats(c0, s->m * ldc, "c");
    dev->matmul_16(dev, s->trans_a, s->trans_b, s->m, s->n, s->k, s->alpha, a_dev, lda, b_dev, ldb,
                   s->beta, c_dev, ldc);
    float *got = download(c_dev, s->m * ldc);
    /* the (m, n) block by normalised error, the padding exactly as it started */
    float *got_block, *want_block;
    c_blocks(got, c, c0, s->m, s->n, ldc, &got_block, &want_block);
    expect_close("c", got_block, want_block, s->m * s->n, tol_matmul(s->k));
    end_case(case_name);
}

/* (m, n, k, trans_a, trans_b, pad, alpha, beta): tiny; odd in all four transposes; beta 0 over
 * NaN in all four; past the CPU's 256-column panel; the drafter's products at a scaled-down width
 * (H 512, I 1536, 5 taps: LH 2560; S 1024 context rows, 256 block rows): the feature projection
 * y = x fc^T and its dW = dy^T x, a gate projection, the down projection's dx = dy W and dW (beta
 * 1: gradients add); a large-ish one with padding; k = 0 (c = beta c: 0 over NaN); an empty c */
static const matmul_shape matmul16_shapes[] = {
    { 1, 1, 1, 0, 0, 0, 1.0f, 0.0f },
    { 3, 5, 7, 0, 0, 3, 0.5f, 0.25f },     { 3, 5, 7, 1, 0, 3, 0.5f, 0.25f },
    { 3, 5, 7, 0, 1, 3, 0.5f, 0.25f },     { 3, 5, 7, 1, 1, 3, 0.5f, 0.25f },
    { 17, 33, 65, 0, 0, 1, 1.0f, 0.0f },   { 17, 33, 65, 1, 0, 1, 1.0f, 0.0f },
    { 17, 33, 65, 0, 1, 1, -1.0f, 0.0f },  { 17, 33, 65, 1, 1, 1, 0.75f, 0.0f },
    { 5, 7, 300, 1, 1, 2, 0.75f, -1.5f },  { 9, 11, 700, 0, 1, 3, -1.0f, 0.5f },
    { 1024, 512, 2560, 0, 1, 0, 1.0f, 0.0f },   /* fc: y = x W^T */
    { 512, 2560, 1024, 1, 0, 0, 1.0f, 1.0f },   /* fc: dW += dy^T x */
    { 256, 1536, 512, 0, 1, 0, 1.0f, 0.0f },    /* gate_proj: y = m W^T */
    { 256, 1536, 512, 0, 0, 0, 1.0f, 1.0f },    /* down_proj: dx += dy W */
    { 512, 1536, 256, 1, 0, 0, 1.0f, 1.0f },    /* down_proj: dW += dy^T x */
    { 1000, 130, 5000, 0, 1, 5, 1.0f, 1.0f },   { 1000, 130, 5000, 1, 0, 3, 0.5f, 0.0f },
    { 4, 3, 0, 0, 0, 2, 1.0f, 0.5f },      { 4, 3, 0, 1, 1, 2, 1.0f, 0.0f },
    { 0, 5, 7, 0, 1, 1, 1.0f, 0.5f },      { 4, 0, 7, 1, 0, 2, 1.0f, 0.5f },
};

/* round_bf16: the CPU's bits (ddk_f32_to_bf16's, checked too) at every non-NaN input, a NaN at
 * every NaN input (the GPU's NaN may be another one); y starts as NaN bits on the device, so an
 * element left unwritten fails at any non-NaN input; x untouched. Inputs: the edges first, then
 * high halves scattered over all 2^16 (every sign, exponent, subnormal, inf and NaN), each with
 * 8 low halves: exact, a tie, either side of one, the smallest and largest, 2 random. */
static const uint32_t round_edges[] = {
    0x00000000u, 0x80000000u,              /* +0, -0 */
    0x3f808000u, 0x3f818000u, 0xbf818000u, /* ties: an even lsb stays, an odd one goes up */
    0x00000001u, 0x00008000u, 0x00018000u, /* subnormals: the smallest, ties of either lsb */
    0x807fffffu,                           /* -(the largest subnormal): rounds to -normal */
    0x7f800000u, 0xff800000u,              /* +-inf */
    0x7f7fffffu, 0xff7fffffu, 0x7f7f8000u, /* +-FLT_MAX and the overflow tie: inf */
    0x7f7f7fffu, 0x7f7e8000u,              /* just below it, a tie below it (even lsb) */
    0x7fc00000u, 0x7f800001u, 0xff800001u, 0xffffffffu,   /* NaNs, two whose truncation is inf */
};

static void case_round_bf16(int64_t count)
{
    snprintf(case_name, sizeof case_name, "round_bf16 count=%lld", (long long)count);
    static const uint16_t lows[] = { 0x0000u, 0x8000u, 0x7fffu, 0x8001u, 0x0001u, 0xffffu };
    const int64_t edges = (int64_t)(sizeof round_edges / sizeof round_edges[0]);
    float *x = host_floats(count);
    for (int64_t i = 0; i < count; i++) {
        if (i < edges) {
            x[i] = ddk_f32_from_bits(round_edges[i]);
            continue;
        }
        const int64_t j = i - edges;   /* the sweep's element: high half j / 8, low half j % 8 */
        const uint32_t high = (uint32_t)((j / 8) * 40503) & 0xffffu;   /* an odd multiplier: all 2^16 */
        const uint32_t low = j % 8 < 6 ? lows[j % 8] : (uint32_t)(ddk_rng_next(&rng_state) & 0xffffu);
        x[i] = ddk_f32_from_bits((high << 16) | low);
    }
    uint16_t *want = host((size_t)count * sizeof(uint16_t));
    cpu->round_bf16(cpu, x, count, want);

    float *x_dev = dev_floats(x, count, "x");
    uint16_t *y_dev = dev_buffer(NULL, (size_t)count * sizeof(uint16_t), "y");
    dev->round_bf16(dev, x_dev, count, y_dev);
    const uint16_t *got = download16(y_dev, count);
    int64_t wrong = 0, cpu_wrong = 0, nan_lost = 0, first = -1;
    for (int64_t i = 0; i < count; i++) {
        if (isnan(x[i])) {
            nan_lost += (got[i] & 0x7fffu) <= 0x7f80u || (want[i] & 0x7fffu) <= 0x7f80u;
            continue;
        }
        cpu_wrong += want[i] != ddk_f32_to_bf16(x[i]);
        if (got[i] != want[i] && wrong++ == 0)
            first = i;
    }
    check(wrong == 0, "%lld of %lld values differ from the CPU's, first x = 0x%08x: gpu 0x%04x, cpu 0x%04x",
          (long long)wrong, (long long)count, first < 0 ? 0u : ddk_f32_bits(x[first]),
          first < 0 ? 0u : (unsigned)got[first], first < 0 ? 0u : (unsigned)want[first]);
    check(cpu_wrong == 0, "cpu: %lld values not ddk_f32_to_bf16's bits", (long long)cpu_wrong);
    check(nan_lost == 0, "%lld NaNs not NaN any more", (long long)nan_lost);
    expect_same("x untouched", download(x_dev, count), x, (size_t)count * sizeof(float));
    end_case(case_name);
}

/* every case of this section, reseeded like main's (seq continues its count) */
/* swiglu_16 and swiglu_backward_16 (gate, up bf16 as a bf16 step keeps them) against the CPU's,
 * at swiglu's tolerance */
static void case_swiglu_16(int64_t count)
{
    snprintf(case_name, sizeof case_name, "swiglu_16 + backward count=%lld", (long long)count);
    float *gate = host_floats(count), *up = host_floats(count), *dh = host_floats(count);
    fill_uniform(gate, count, -12.0, 12.0);
    fill_uniform(up, count, -2.0, 2.0);
    fill_uniform(dh, count, -1.0, 1.0);
    uint16_t *g16 = host((size_t)count * sizeof(uint16_t)), *u16 = host((size_t)count * sizeof(uint16_t));
    for (int64_t i = 0; i < count; i++)
        g16[i] = ddk_f32_to_bf16(gate[i]), u16[i] = ddk_f32_to_bf16(up[i]);
    float *h = host_floats(count), *dgate0 = host_floats(count), *dup0 = host_floats(count);
    fill_uniform(dgate0, count, -1.0, 1.0);
    fill_uniform(dup0, count, -1.0, 1.0);
    float *dgate = host_copy(dgate0, count), *dup = host_copy(dup0, count);
    cpu->swiglu_16(cpu, g16, u16, count, h);
    cpu->swiglu_backward_16(cpu, g16, u16, dh, count, dgate, dup);

    uint16_t *g_dev = dev_buffer(g16, (size_t)count * sizeof(uint16_t), "gate"),
             *u_dev = dev_buffer(u16, (size_t)count * sizeof(uint16_t), "up");
    float *h_dev = dev_floats(NULL, count, "h"), *dh_dev = dev_floats(dh, count, "dh");
    float *dgate_dev = dev_floats(dgate0, count, "dgate"), *dup_dev = dev_floats(dup0, count, "dup");
    dev->swiglu_16(dev, g_dev, u_dev, count, h_dev);
    dev->swiglu_backward_16(dev, g_dev, u_dev, dh_dev, count, dgate_dev, dup_dev);
    expect_close("h", download(h_dev, count), h, count, tol_swiglu);
    expect_close("dgate", download(dgate_dev, count), dgate, count, tol_swiglu);
    expect_close("dup", download(dup_dev, count), dup, count, tol_swiglu);
    end_case(case_name);
}

static void run_bf16_copy_cases(uint64_t *seq)
{
    check(dev->matmul_16 != NULL && dev->round_bf16 != NULL, "matmul_16 or round_bf16 is NULL");
    case_done("matmul_16 and round_bf16 table");
    if (!dev->matmul_16 || !dev->round_bf16)
        return;
    for (size_t i = 0; i < sizeof matmul16_shapes / sizeof matmul16_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_matmul_16(&matmul16_shapes[i]);
    }
    static const int64_t round_counts[] = { 1, sizeof round_edges / sizeof round_edges[0], 1000,
                                            (1 << 20) + 3 };
    for (size_t i = 0; i < sizeof round_counts / sizeof round_counts[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_round_bf16(round_counts[i]);
    }
    check(dev->swiglu_16 != NULL && dev->swiglu_backward_16 != NULL, "swiglu_16 or swiglu_backward_16 is NULL");
    case_done("swiglu_16 table");
    static const int64_t swiglu16_counts[] = { 1, 1000, (1 << 20) + 7 };
    for (size_t i = 0; dev->swiglu_16 && dev->swiglu_backward_16 && i < sizeof swiglu16_counts / sizeof swiglu16_counts[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_swiglu_16(swiglu16_counts[i]);
    }
}

/* ------------------------------------------------------------------------------------------
 * The DFlash2 drafter's block convolution (block_conv, block_conv_backward; SPEC.md 2.1): delta
 * one side of a projection's rows (ld_delta = 2 taps G + pad), gradients starting with values
 */

/* y, dx, ddelta: the same <= taps (y, dx) or gs (ddelta) float products summed in the same order
 * on both sides; only FMA contraction differs (nvcc's and the C compiler's), a rounding or two
 * of the terms' size */
static const double tol_block_conv = 2e-6;
/* dbase: as rmsnorm's dg, a column's rows summed in two orders (the CPU one by one, the GPU in
 * 16 row lanes): ~2^-24 sqrt(rows) of the result's scale on random-signed terms, 2e-6 at 2048 */
static const double tol_block_conv_dbase = 1e-5;

/* 1 where the op writes row t's column col of ddelta (tap col / G, which must be <= t % B) */
static int conv_writes(int64_t t, int64_t col, int64_t B, int64_t taps, int64_t G)
{
    return col >= 0 && col < taps * G && col / G <= t % B;
}

static void case_block_conv(int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                            int64_t pad, int side, int with_dx)
{
    snprintf(case_name, sizeof case_name,
             "block_conv + backward rows=%lld B=%lld H=%lld taps=%lld gs=%lld side %d pad %lld%s",
             (long long)rows, (long long)B, (long long)H, (long long)taps, (long long)gs, side,
             (long long)pad, with_dx ? "" : " dx NULL");
    const int64_t G = H / gs, ld = 2 * taps * G + pad, off = side * taps * G;
    const int64_t n = rows * H, nb = taps * H, nd = rows * ld;
    float *x = host_floats(n), *base = host_floats(nb), *proj = host_floats(nd), *dy = host_floats(n);
    fill_uniform(x, n, -2.0, 2.0);          /* (rows, H) */
    fill_uniform(base, nb, -1.0, 1.0);      /* (taps, H) */
    fill_uniform(proj, nd, -0.5, 0.5);      /* (rows, ld): both sides' coefficients */
    fill_uniform(dy, n, -1.0, 1.0);         /* (rows, H) */
    float *dx0 = host_floats(n), *db0 = host_floats(nb), *dp0 = host_floats(nd);   /* the start */
    fill_uniform(dx0, n, -1.0, 1.0);
    fill_uniform(db0, nb, -1.0, 1.0);
    fill_uniform(dp0, nd, -1.0, 1.0);
    float *y = host_floats(n), *dx = host_copy(dx0, n), *db = host_copy(db0, nb), *dp = host_copy(dp0, nd);
    cpu->block_conv(cpu, x, base, proj + off, ld, rows, B, H, taps, gs, y);
    cpu->block_conv_backward(cpu, x, base, proj + off, ld, dy, rows, B, H, taps, gs,
                             with_dx ? dx : NULL, db, dp + off);

    float *x_dev = dev_floats(x, n, "x"), *base_dev = dev_floats(base, nb, "base");
    float *proj_dev = dev_floats(proj, nd, "projection"), *dy_dev = dev_floats(dy, n, "dy");
    float *y_dev = dev_floats(NULL, n, "y");
    dev->block_conv(dev, x_dev, base_dev, proj_dev + off, ld, rows, B, H, taps, gs, y_dev);
    expect_close("y", download(y_dev, n), y, n, tol_block_conv);
    /* twice from the same start: the same bits (no atomics) */
    float *dx_dev[2], *db_dev[2], *dp_dev[2], *dx_got[2], *db_got[2], *dp_got[2];
    for (int run = 0; run < 2; run++) {
        dx_dev[run] = dev_floats(dx0, n, run ? "dx again" : "dx");
        db_dev[run] = dev_floats(db0, nb, run ? "dbase again" : "dbase");
        dp_dev[run] = dev_floats(dp0, nd, run ? "dprojection again" : "dprojection");
        dev->block_conv_backward(dev, x_dev, base_dev, proj_dev + off, ld, dy_dev, rows, B, H, taps,
                                 gs, with_dx ? dx_dev[run] : NULL, db_dev[run], dp_dev[run] + off);
        dx_got[run] = download(dx_dev[run], n);
        db_got[run] = download(db_dev[run], nb);
        dp_got[run] = download(dp_dev[run], nd);
    }
    expect_close_added("dx", dx_got[0], dx, dx0, n, tol_block_conv);
    expect_close_added("dbase", db_got[0], db, db0, nb, tol_block_conv_dbase);
    expect_close_added("ddelta", dp_got[0], dp, dp0, nd, tol_block_conv);
    int64_t untouched_bad = 0;   /* the projection's other side and padding, the taps past a slot */
    for (int64_t t = 0; t < rows; t++)
        for (int64_t col = 0; col < ld; col++)
            if (!conv_writes(t, col - off, B, taps, G))
                untouched_bad += memcmp(&dp_got[0][t * ld + col], &dp0[t * ld + col], sizeof(float)) != 0;
    check(untouched_bad == 0, "ddelta: %lld values outside the op's columns changed", (long long)untouched_bad);
    if (!with_dx)
        expect_same("dx NULL: dx untouched", dx_got[0], dx0, (size_t)n * sizeof(float));
    expect_same("dx run twice", dx_got[1], dx_got[0], (size_t)n * sizeof(float));
    expect_same("dbase run twice", db_got[1], db_got[0], (size_t)nb * sizeof(float));
    expect_same("ddelta run twice", dp_got[1], dp_got[0], (size_t)nd * sizeof(float));
    end_case(case_name);
}

/* (rows, B, H, taps, gs, pad, side, dx): tiny; the drafters' gs 16 at H 5120, one block and 64
 * of 16 slots; B 24 with a padded row stride and dx NULL; taps 3 at odd sizes; gs = H (one
 * thread a row's coefficient), and at H 257 (no whole warp of columns) over 2048 rows; B 1 and
 * gs 1; more taps than slots */
static const struct { int64_t rows, B, H, taps, gs, pad; int side, with_dx; } block_conv_shapes[] = {
    { 1, 1, 1, 1, 1, 0, 0, 1 },          { 16, 16, 5120, 2, 16, 0, 1, 1 },
    { 1024, 16, 5120, 2, 16, 0, 0, 1 },  { 300, 24, 1000, 2, 8, 3, 1, 0 },
    { 77, 7, 130, 3, 13, 1, 1, 1 },      { 50, 5, 96, 2, 96, 0, 0, 1 },
    { 2048, 16, 257, 2, 257, 2, 0, 1 },  { 48, 1, 64, 2, 1, 0, 1, 1 },
    { 30, 2, 40, 3, 4, 0, 1, 1 },
};

static void run_block_conv_cases(uint64_t *seq)
{
    check(dev->block_conv && dev->block_conv_backward, "block_conv or block_conv_backward is NULL");
    case_done("block_conv table");
    for (size_t i = 0; dev->block_conv && dev->block_conv_backward &&
                       i < sizeof block_conv_shapes / sizeof block_conv_shapes[0]; i++) {
        rng_state = 0x5eed0000u + *seq;
        misalign = (*seq)++ % 2 * 4;
        case_block_conv(block_conv_shapes[i].rows, block_conv_shapes[i].B, block_conv_shapes[i].H,
                        block_conv_shapes[i].taps, block_conv_shapes[i].gs, block_conv_shapes[i].pad,
                        block_conv_shapes[i].side, block_conv_shapes[i].with_dx);
    }
}

int main(void)
{
    const char *v = getenv("DDTREE_OPS_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const char *self = getenv("DDTREE_BACKEND_OPS_SELF_CHECK");
    const int self_check = self && *self && strcmp(self, "0") != 0;

    cpu = ddk_backend_cpu();
    /* the CPU backend's own logsumexp_rows against the float64 reference: on every machine */
    for (size_t i = 0; i < sizeof lse_shapes / sizeof lse_shapes[0]; i++) {
        rng_state = 0x15e0000u + i;
        case_logsumexp_rows_cpu(lse_shapes[i][0], lse_shapes[i][1]);
    }
    if (self_check) {
        dev = cpu;
        printf("self-check: the CPU backend in the GPU's place\n");
    } else {
        if (!ddk_has_cuda() || ddk_cuda_device_count() == 0) {
            printf("SKIPPED: no GPU\n");
            return cases_failed ? cases_summary() : 77;   /* a failed CPU case still fails */
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
    check(dev && dev->zero && dev->copy && dev->synchronize && dev->matmul && dev->rmsnorm &&
              dev->rmsnorm_backward && dev->rope && dev->swiglu && dev->swiglu_backward &&
              dev->embedding,
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
        case_matmul(&matmul_shapes[i], MATMUL_FP32);
    }
    static const size_t copy_bytes[] = { 1, 3, 17, 4097, ((size_t)1 << 20) + 5 };
    for (size_t i = 0; i < sizeof copy_bytes / sizeof copy_bytes[0]; i++) {
        NEXT_CASE();
        misalign = i % 3;   /* byte offsets 0, 1, 2: copies and memsets are byte-granular */
        case_copy_zero(copy_bytes[i]);
    }
    const uint64_t attn_seq = seq;
    attn_flash = attention_is_flash(self_check);
    printf("attention with the %s kernels (the default)\n", attn_flash ? "flash" : "SIMT");
    run_attention_cases(&seq);
    run_loss_cases(&seq);
    /* the ops added after the cases above (appended, so those keep their seeds) */
    check(dev->matmul_bf16 != NULL, "matmul_bf16 is NULL");
    case_done("matmul_bf16 table");
    for (int mode = MATMUL_BF16; dev->matmul_bf16 && mode <= MATMUL_BF16_EXACT; mode++)
        for (size_t i = 0; i < sizeof matmul_shapes / sizeof matmul_shapes[0]; i++) {
            NEXT_CASE();
            case_matmul(&matmul_shapes[i], mode);
        }
    run_vector_cases(&seq, self_check);
    const uint64_t wide_seq = seq;
    run_attention_wide_cases(&seq);
    run_qwen35_cases(&seq, self_check);
    run_target_cases(&seq);
    /* the attention cases again with the other CUDA kernels (ddk.h, ddk_cuda_attention_kernels),
     * with the seeds of the first time; then the flash kernels' own shapes with both */
    ddk_cuda_set_attention_kernels(attn_flash ? DDK_CUDA_ATTENTION_SIMT : DDK_CUDA_ATTENTION_FLASH);
    attn_flash = attention_is_flash(self_check);
    printf("attention again with the %s kernels\n", attn_flash ? "flash" : "SIMT");
    uint64_t again = attn_seq;
    run_attention_cases(&again);
    again = wide_seq;
    run_attention_wide_cases(&again);
    for (int flash = 1; flash >= 0; flash--) {
        ddk_cuda_set_attention_kernels(flash ? DDK_CUDA_ATTENTION_FLASH : DDK_CUDA_ATTENTION_SIMT);
        attn_flash = attention_is_flash(self_check);
        printf("attention with the %s kernels: their tile shapes\n", attn_flash ? "flash" : "SIMT");
        again = seq;
        run_attention_flash_cases(&again);
    }
    ddk_cuda_set_attention_kernels(-1);
    run_bf16_copy_cases(&seq);   /* appended, so that the cases above keep their seeds */
    const int last_mode = dev->matmul_bf16 ? MATMUL_BF16_EXACT : MATMUL_FP32;
    for (int mode = MATMUL_FP32; mode <= last_mode; mode++)   /* k = 0, appended too */
        for (size_t i = 0; i < sizeof matmul_k0_shapes / sizeof matmul_k0_shapes[0]; i++) {
            NEXT_CASE();
            case_matmul(&matmul_k0_shapes[i], mode);
        }
    /* the DFlash2 drafter's ops (appended too): its bidirectional attention with both kernel
     * sets (the same seeds for each), then its block convolution */
    for (int flash = 1; flash >= 0; flash--) {
        ddk_cuda_set_attention_kernels(flash ? DDK_CUDA_ATTENTION_FLASH : DDK_CUDA_ATTENTION_SIMT);
        attn_flash = attention_is_flash(self_check);
        printf("attention with the %s kernels: bidirectional blocks\n", attn_flash ? "flash" : "SIMT");
        again = seq;
        run_attention_bidirectional_cases(&again);
    }
    ddk_cuda_set_attention_kernels(-1);
    seq = again;
    run_block_conv_cases(&seq);
    /* logsumexp_rows (appended too) against the float64 reference */
    check(dev->logsumexp_rows != NULL, "logsumexp_rows is NULL");
    case_done("logsumexp_rows table");
    for (size_t i = 0; dev->logsumexp_rows && i < sizeof lse_shapes / sizeof lse_shapes[0]; i++) {
        NEXT_CASE();
        case_logsumexp_rows(lse_shapes[i][0], lse_shapes[i][1]);
    }
#undef NEXT_CASE
    return cases_summary();
}
