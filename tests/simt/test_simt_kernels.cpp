/* test_simt_kernels.cpp: every kernel of kernels/cuda/, compiled from its own source and run by
 * the SIMT emulator (simt.h), against the CPU backend, under the limits of each card ddtree plans
 * for (ddk_device_profile: h200 sm_90, b200 sm_100, rtx-pro-6000 sm_120), at small shapes. The ops
 * go through the CUDA backend's own entry points (simt_backend(): kernel_ops.cu's table), so the
 * host code that picks an instance for the card runs too; the launch log says which ran.
 *
 * Per profile: the norms, RoPE (full and partial), SwiGLU (fp32 and bf16 inputs), the gathers,
 * argmax, sumsq, axpby, AdamW with its bf16 copy, the noise, round_bf16 (flat, and in rows with
 * strides), conv1d + SiLU, the DeltaNet gates and l2norm, the Gated DeltaNet recurrence and
 * chunked form at dk 128 and 256 (the chunk the card allows), the fused loss (materialised and
 * tiled, teacher and given labels, a bf16 head read in place; with the DFlash2 selector strict and
 * inject, stop_gradient, its dA, dBs, dHp), topk_rows (ties, NaNs, -inf), the norms again on a card of one
 * multiprocessor (blocks that take several rows),
 * DFlash attention forward and backward with the flash kernels at d 64 / 128 / 256 (the seed's
 * 96-row groups included) and with the SIMT kernels (d 40, and d 256: half key tiles on a 99 KB
 * card), causal attention (a prefill of more rows than
 * a 99 KB card's block takes, and over a cache), tree attention; the DFlash2 drafter's
 * bidirectional blocks under a window with both kernel sets, and its block convolution (forward,
 * backward with and without dx, on a card of one multiprocessor too), and logsumexp_rows (rows
 * narrower and wider than a block: NaNs, -inf, +inf, +-1e30, a row of only -inf and NaN, col -1,
 * lp NULL; within 1e-6 of max(1, |cpu|)). Determinism: every flash
 * backward, the loss, block_conv's backward and logsumexp_rows are run again with blocks and
 * threads in the reverse order and must give the same bits; on no card may the flash path fall back to the SIMT kernels (the log must name the flash
 * kernels), nor the chunked DeltaNet be refused. Tolerances as tests/kernels/test_backend_ops.c, each with
 * its reason there; the emulated mma sums in double, so the flash ones hold with room.
 *
 * Usage: test_simt_kernels [CARD...] (default h200 b200 rtx-pro-6000). ctest: simt_kernels_CARD,
 * one test a card so that they run side by side (labels unit, sanitize); one line per case;
 * "N passed, M failed".
 * DDTREE_SIMT_VERBOSE=1 prints each case's launches; DDTREE_SIMT_FAIL_FAST=1 stops at the first
 * failed case (tests/simt/mutants.py).
 */
#include "simt.h"
#include "simt_backend.h"
#include "cuda_backend.h"
#include "ddk_bf16.h"
#include "check.h"

#include <string>
#include <vector>

static const ddk_backend *cpu, *emu;
static int verbose;
static uint64_t rng = 1;
static std::string launches;   /* this case's launch log */
static std::vector<void *> owned;

static double uniform(double lo, double hi)
{
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (double)(rng >> 11) / 9007199254740992.0;
}

template <typename T>
static T *buf(int64_t count)
{
    T *p = (T *)malloc((size_t)(count > 0 ? count : 1) * sizeof(T));
    memset(p, 0xff, (size_t)(count > 0 ? count : 1) * sizeof(T));   /* NaN floats: unwritten shows */
    owned.push_back(p);
    return p;
}

static float *rand_floats(int64_t count, double lo, double hi)
{
    float *x = buf<float>(count);
    for (int64_t i = 0; i < count; i++)
        x[i] = (float)uniform(lo, hi);
    return x;
}

static float *copy_of(const float *x, int64_t count)
{
    float *y = buf<float>(count);
    memcpy(y, x, (size_t)count * sizeof(float));
    return y;
}

/* the launches since the last call, added to this case's log */
static void read_launches(void)
{
    static char log[1 << 20];
    simt::take_launch_log(log, sizeof log);
    launches += log;
}

static void close_case(void)
{
    for (void *p : owned)
        free(p);
    owned.clear();
    read_launches();
    if (verbose)
        printf("%s", launches.c_str());
    launches.clear();
    check(cudaGetLastError() == cudaSuccess, "a launch was refused");
}

static void expect_close(const char *what, const float *got, const float *want, int64_t count, double tol)
{
    double err = 0.0, scale = 0.0;
    for (int64_t i = 0; i < count; i++) {
        if (!isfinite(got[i]) && isfinite(want[i])) {
            check(0, "%s[%lld] = %g, want %g", what, (long long)i, got[i], want[i]);
            return;
        }
        err = fmax(err, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    const double e = scale > 0.0 ? err / scale : err;
    if (verbose)
        printf("  %s: %.3g (tolerance %.3g)\n", what, e, tol);
    check(e <= tol, "%s: normalised error %.3g over %.3g", what, e, tol);
}

static void expect_same(const char *what, const void *got, const void *want, size_t bytes)
{
    check(memcmp(got, want, bytes) == 0, "%s: not the same bits", what);
}

static void expect_ran(const char *kernel)
{
    read_launches();
    check(launches.find(kernel) != std::string::npos, "%s did not run; the launches:\n%s", kernel,
          launches.c_str());
}

/* ------------------------------------------------------------------------------------------
 * Element-wise, norms, gathers, vectors
 */

/* rows 9 and 70 (the backward's dg in slices, summed by its reduce kernel) */
static void norms_case(int64_t rows)
{
    const int64_t d = 70;
    const float *x = rand_floats(rows * d, -2, 2), *g = rand_floats(d, 0.5, 1.5), *dy = rand_floats(rows * d, -1, 1);
    float *y[2] = { buf<float>(rows * d), buf<float>(rows * d) }, *rstd[2] = { buf<float>(rows), buf<float>(rows) };
    const ddk_backend *be[2] = { cpu, emu };
    float *dx0 = rand_floats(rows * d, -1, 1), *dg0 = rand_floats(d, -1, 1);
    float *dx[2] = { copy_of(dx0, rows * d), copy_of(dx0, rows * d) }, *dg[2] = { copy_of(dg0, d), copy_of(dg0, d) };
    for (int b = 0; b < 2; b++) {
        be[b]->rmsnorm(be[b], x, g, rows, d, 1e-6f, y[b], rstd[b]);
        be[b]->rmsnorm_backward(be[b], x, g, rstd[0], dy, rows, d, dx[b], dg[b]);
    }
    expect_close("rmsnorm y", y[1], y[0], rows * d, 2e-6);
    expect_close("rmsnorm rstd", rstd[1], rstd[0], rows, 2e-6);
    expect_close("rmsnorm dx", dx[1], dx[0], rows * d, 5e-6);
    expect_close("rmsnorm dg", dg[1], dg[0], d, 1e-5);
    /* the same bits with blocks and threads in the reverse order (no atomics, a fixed sum order) */
    float *dx2 = copy_of(dx0, rows * d), *dg2 = copy_of(dg0, d);
    simt::set_schedule(1);
    emu->rmsnorm_backward(emu, x, g, rstd[0], dy, rows, d, dx2, dg2);
    const double ss2 = emu->sumsq(emu, dy, rows * d);
    simt::set_schedule(0);
    expect_same("rmsnorm dx, reverse schedule", dx2, dx[1], (size_t)(rows * d) * sizeof(float));
    expect_same("rmsnorm dg, reverse schedule", dg2, dg[1], (size_t)d * sizeof(float));
    const double ss1 = emu->sumsq(emu, dy, rows * d);
    check(ss1 == ss2, "sumsq, reverse schedule: %.17g, then %.17g", ss1, ss2);
    const float *z = rand_floats(rows * d, -3, 3);
    const int64_t T = 3, heads = 2, hd = 32, ld = heads * hd + 5;
    const float *src = rand_floats(T * ld, -2, 2);
    float *gy[2] = { buf<float>(rows * d), buf<float>(rows * d) }, *l2[2] = { buf<float>(T * heads * hd), buf<float>(T * heads * hd) };
    for (int b = 0; b < 2; b++) {
        be[b]->gated_rmsnorm(be[b], x, z, g, rows, d, 1e-6f, gy[b]);
        be[b]->l2norm_heads(be[b], src, ld, T, heads, hd, 0.25f, 1e-6f, l2[b]);
    }
    expect_close("gated_rmsnorm", gy[1], gy[0], rows * d, 2e-6);
    expect_close("l2norm_heads", l2[1], l2[0], T * heads * hd, 2e-6);
}

static void case_norms(void)
{
    norms_case(9);
    norms_case(70);
    expect_ran("rmsnorm_backward_dg_reduce_kernel");
    /* the card with one multiprocessor: 32 blocks, so a block takes several rows (grid-stride)
     * and its reductions run again over shared memory the last row's still read */
    const ddk_device_profile *card = simt::profile();
    ddk_device_profile one = *card;
    one.multiprocessors = 1;
    simt::set_profile(&one);
    norms_case(70);
    simt::set_profile(card);
}

static void case_rope_swiglu(void)
{
    const int64_t rows = 5, heads = 3, d = 16, count = 1003;
    int32_t *pos = buf<int32_t>(rows);
    for (int64_t i = 0; i < rows; i++)
        pos[i] = (int32_t)(i * 7 + 1);
    const float *x0 = rand_floats(rows * heads * d, -1, 1);
    const ddk_backend *be[2] = { cpu, emu };
    float *x[3][2];
    for (int b = 0; b < 2; b++) {
        for (int m = 0; m < 3; m++)
            x[m][b] = copy_of(x0, rows * heads * d);
        be[b]->rope(be[b], x[0][b], pos, rows, heads, d, 1e4f, 0);
        be[b]->rope(be[b], x[1][b], pos, rows, heads, d, 1e6f, 1);
        be[b]->rope_partial(be[b], x[2][b], pos, rows, heads, d, 8, 1e4f);
    }
    expect_close("rope", x[0][1], x[0][0], rows * heads * d, 1e-6);
    expect_close("rope inverse", x[1][1], x[1][0], rows * heads * d, 1e-6);
    expect_close("rope_partial", x[2][1], x[2][0], rows * heads * d, 1e-6);

    const float *gate = rand_floats(count, -6, 6), *up = rand_floats(count, -2, 2), *dh = rand_floats(count, -1, 1);
    uint16_t *g16 = buf<uint16_t>(count), *u16 = buf<uint16_t>(count);
    for (int64_t i = 0; i < count; i++) {
        g16[i] = ddk_f32_to_bf16(gate[i]);
        u16[i] = ddk_f32_to_bf16(up[i]);
    }
    float *h[2][2], *dg[2][2], *du[2][2];
    for (int b = 0; b < 2; b++) {
        for (int w = 0; w < 2; w++) {
            h[w][b] = buf<float>(count);
            dg[w][b] = buf<float>(count);
            du[w][b] = buf<float>(count);
        }
        be[b]->swiglu(be[b], gate, up, count, h[0][b]);
        be[b]->swiglu_backward(be[b], gate, up, dh, count, dg[0][b], du[0][b]);
        be[b]->swiglu_16(be[b], g16, u16, count, h[1][b]);
        be[b]->swiglu_backward_16(be[b], g16, u16, dh, count, dg[1][b], du[1][b]);
    }
    for (int w = 0; w < 2; w++) {
        expect_close(w ? "swiglu_16" : "swiglu", h[w][1], h[w][0], count, 2e-6);
        expect_close(w ? "swiglu_backward_16 dgate" : "swiglu_backward dgate", dg[w][1], dg[w][0], count, 2e-6);
        expect_close(w ? "swiglu_backward_16 dup" : "swiglu_backward dup", du[w][1], du[w][0], count, 2e-6);
    }
}

static void case_gathers_vectors(void)
{
    const int64_t rows = 6, H = 40, V = 11, count = 1003;
    const ddk_backend *be[2] = { cpu, emu };
    const float *table = rand_floats(V * H, -1, 1);
    uint16_t *t16 = buf<uint16_t>(V * H);
    for (int64_t i = 0; i < V * H; i++)
        t16[i] = ddk_f32_to_bf16(table[i]);
    int32_t *tok = buf<int32_t>(rows);
    for (int64_t i = 0; i < rows; i++)
        tok[i] = (int32_t)((i * 5 + 3) % V);
    float *e[2][2];
    int32_t *am[2];
    const int64_t ar = 4, an = 300;
    float *ax = rand_floats(ar * an, -1, 1);
    ax[1 * an + 299] = 5.0f;   /* a maximum in the last column, one in a tie */
    ax[2 * an + 10] = ax[2 * an + 200] = 7.0f;
    double ss[2];
    const float *xv = rand_floats(count, -1, 1), *y0 = rand_floats(count, -1, 1);
    float *y[2], *noise[2];
    for (int b = 0; b < 2; b++) {
        e[0][b] = buf<float>(rows * H);
        e[1][b] = buf<float>(rows * H);
        be[b]->embedding(be[b], table, tok, rows, H, e[0][b]);
        be[b]->embedding_w16(be[b], t16, tok, rows, H, e[1][b]);
        am[b] = buf<int32_t>(ar);
        be[b]->argmax_rows(be[b], ax, ar, an, am[b]);
        ss[b] = be[b]->sumsq(be[b], xv, count);
        y[b] = copy_of(y0, count);
        be[b]->axpby(be[b], count, 0.5f, xv, -1.25f, y[b]);
        noise[b] = buf<float>(count);
        memset(noise[b], 0, (size_t)count * sizeof(float));
        be[b]->uniform_noise(be[b], noise[b], count, 0.05f, 99);
    }
    expect_same("embedding", e[0][1], e[0][0], (size_t)(rows * H) * sizeof(float));
    expect_same("embedding_w16", e[1][1], e[1][0], (size_t)(rows * H) * sizeof(float));
    expect_same("argmax_rows", am[1], am[0], (size_t)ar * sizeof(int32_t));
    check(fabs(ss[1] - ss[0]) <= 1e-9 * ss[0], "sumsq %.17g, want %.17g", ss[1], ss[0]);
    expect_close("axpby", y[1], y[0], count, 3e-7);
    expect_same("uniform_noise", noise[1], noise[0], (size_t)count * sizeof(float));

    /* AdamW with the bf16 copy: each side's copy is its own new w rounded to nearest even */
    const ddk_adamw_scalars s = { 0.8f, 0.9f, 0.1f, 0.95f, 0.05f, 1.5f, 2.0f, 1e-8f, 1e-3f, 1e-5f };
    float *w0 = rand_floats(count, -1, 1), *g0 = rand_floats(count, -1, 1), *m0 = rand_floats(count, -0.1, 0.1),
          *v0 = rand_floats(count, 0, 0.01);
    float *w[2], *m[2], *v[2], *g[2];
    uint16_t *w16[2];
    for (int b = 0; b < 2; b++) {
        w[b] = copy_of(w0, count);
        m[b] = copy_of(m0, count);
        v[b] = copy_of(v0, count);
        g[b] = copy_of(g0, count);
        w16[b] = buf<uint16_t>(count);
        be[b]->adamw(be[b], w[b], g[b], m[b], v[b], w16[b], count, &s);
    }
    expect_close("adamw w", w[1], w[0], count, 1e-6);
    expect_close("adamw m", m[1], m[0], count, 1e-6);
    expect_close("adamw v", v[1], v[0], count, 1e-6);
    int64_t copy_bad = 0;
    for (int64_t i = 0; i < count; i++)
        copy_bad += w16[1][i] != ddk_f32_to_bf16(w[1][i]);
    check(copy_bad == 0, "adamw's bf16 copy: %lld values are not the new w rounded", (long long)copy_bad);

    /* round_bf16: the CPU's bits at every non-NaN input (ties, subnormals, inf, the overflow tie) */
    static const uint32_t special[] = { 0x3f808000u, 0x3f818000u, 0x00000001u, 0x80008000u, 0x7f7fffffu,
                                        0x7f7f8000u, 0xff800000u, 0x00000000u, 0x80000000u, 0x7fc00001u };
    const int64_t nr = (int64_t)(sizeof special / sizeof special[0]) + 200;
    float *rx = rand_floats(nr, -1e3, 1e3);
    memcpy(rx, special, sizeof special);
    uint16_t *r[2] = { buf<uint16_t>(nr), buf<uint16_t>(nr) };
    for (int b = 0; b < 2; b++)
        be[b]->round_bf16(be[b], rx, nr, r[b]);
    for (int64_t i = 0; i < nr; i++) {
        if (isnan(rx[i]))
            check(isnan(ddk_bf16_to_f32(r[1][i])), "round_bf16 of NaN is not NaN");
        else
            check(r[1][i] == r[0][i], "round_bf16 of 0x%08x: 0x%04x, want 0x%04x", ddk_f32_bits(rx[i]),
                  r[1][i], r[0][i]);
    }
}

/* matmul_w16's operand rounding (rows with strides): each row's first cols rounded, the rest of
 * dst's row untouched */
static void round_rows_case(void)
{
    const int64_t rows = 3, cols = 5, ld_src = 7, ld_dst = 8;
    const float *src = rand_floats(rows * ld_src, -100, 100);
    uint16_t *dst = buf<uint16_t>(rows * ld_dst);
    for (int64_t i = 0; i < rows * ld_dst; i++)
        dst[i] = 0xaaaa;
    ddk_cuda_round_bf16_rows(emu, src, ld_src, rows, cols, dst, ld_dst);
    int64_t bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < ld_dst; c++)
            bad += dst[r * ld_dst + c] != (c < cols ? ddk_f32_to_bf16(src[r * ld_src + c]) : 0xaaaa);
    check(bad == 0, "round_bf16_rows: %lld values wrong or written past cols", (long long)bad);
}

static void case_target_ops(void)
{
    round_rows_case();
    const int64_t T = 7, C = 10, K = 4, nv = 6, count = 300;
    const ddk_backend *be[2] = { cpu, emu };
    const float *x = rand_floats(T * C, -1, 1), *w = rand_floats(C * K, -1, 1), *hist = rand_floats((K - 1) * C, -1, 1);
    const float *gate = rand_floats(count, -3, 3), *x0 = rand_floats(count, -1, 1);
    const float *bb = rand_floats(T * nv, -2, 2), *aa = rand_floats(T * nv, -2, 2), *alog = rand_floats(nv, -1, 1),
                *dtb = rand_floats(nv, -1, 1);
    float *y[2][2], *sm[2], *beta[2], *g[2];
    for (int b = 0; b < 2; b++) {
        y[0][b] = buf<float>(T * C);
        y[1][b] = buf<float>(T * C);
        be[b]->conv1d_silu(be[b], x, w, NULL, T, C, K, y[0][b]);
        be[b]->conv1d_silu(be[b], x, w, hist, T, C, K, y[1][b]);
        sm[b] = copy_of(x0, count);
        be[b]->sigmoid_mul(be[b], sm[b], gate, count);
        beta[b] = buf<float>(T * nv);
        g[b] = buf<float>(T * nv);
        be[b]->delta_gates(be[b], bb, aa, alog, dtb, T, nv, beta[b], g[b]);
    }
    expect_close("conv1d_silu", y[0][1], y[0][0], T * C, 2e-6);
    expect_close("conv1d_silu history", y[1][1], y[1][0], T * C, 2e-6);
    expect_close("sigmoid_mul", sm[1], sm[0], count, 2e-6);
    expect_close("delta_gates beta", beta[1], beta[0], T * nv, 2e-6);
    expect_close("delta_gates g", g[1], g[0], T * nv, 2e-6);
}

/* the recurrence, and the chunked form over 70 tokens (chunks of 64, or what the card allows) */
static void delta_case(int64_t dk, int64_t T)
{
    const int64_t nk = 1, nv = 2, dv = dk;
    const ddk_backend *be[2] = { cpu, emu };
    const float *q = rand_floats(T * nk * dk, -0.2, 0.2), *k = rand_floats(T * nk * dk, -0.2, 0.2),
                *v = rand_floats(T * nv * dv, -1, 1), *beta = rand_floats(T * nv, 0.1, 0.9),
                *g = rand_floats(T * nv, -0.3, -0.01), *s0 = rand_floats(nv * dk * dv, -0.1, 0.1);
    for (int chunk = 0; chunk <= 64; chunk += 64) {
        float *st[2], *out[2];
        for (int b = 0; b < 2; b++) {
            const ddk_delta_shape sh = { T, nk, nv, dk, dv, chunk };
            st[b] = copy_of(s0, nv * dk * dv);
            out[b] = buf<float>(T * nv * dv);
            const int rc = be[b]->gated_delta(be[b], &sh, q, k, v, beta, g, st[b], out[b]);
            check(rc == 0, "gated_delta dk %lld chunk %d on %s: %d", (long long)dk, chunk, be[b]->name, rc);
        }
        expect_close(chunk ? "gated_delta chunked out" : "gated_delta recurrence out", out[1], out[0], T * nv * dv, 2e-5);
        expect_close(chunk ? "gated_delta chunked state" : "gated_delta recurrence state", st[1], st[0], nv * dk * dv, 2e-5);
    }
    expect_ran("delta_chunked_kernel");
}

static void case_delta_128(void) { delta_case(128, 70); }
static void case_delta_256(void) { delta_case(256, 30); }

/* ------------------------------------------------------------------------------------------
 * The DFlash2 drafter's block convolution: delta one side of a projection's rows
 */

/* forward and backward (gradients with values: ADD), CPU against the kernels; the backward again
 * in the reverse order and with dx NULL: the same bits; the columns of ddelta the op must not
 * write as they were */
static void block_conv_case(int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs, int64_t pad, int side)
{
    const int64_t G = H / gs, ld = 2 * taps * G + pad, off = side * taps * G;
    const int64_t n = rows * H, nb = taps * H, nd = rows * ld;
    const float *x = rand_floats(n, -2, 2), *base = rand_floats(nb, -1, 1), *proj = rand_floats(nd, -0.5, 0.5),
                *dy = rand_floats(n, -1, 1);
    const float *dx0 = rand_floats(n, -1, 1), *db0 = rand_floats(nb, -1, 1), *dp0 = rand_floats(nd, -1, 1);
    float *y[2], *dx[3], *db[4], *dp[4];
    for (int t = 0; t < 4; t++) {   /* CPU, emulated, emulated in the reverse order, emulated dx NULL */
        const ddk_backend *be = t ? emu : cpu;
        simt::set_schedule(t == 2);
        if (t < 2) {
            y[t] = buf<float>(n);
            be->block_conv(be, x, base, proj + off, ld, rows, B, H, taps, gs, y[t]);
        }
        if (t < 3)
            dx[t] = copy_of(dx0, n);
        db[t] = copy_of(db0, nb);
        dp[t] = copy_of(dp0, nd);
        be->block_conv_backward(be, x, base, proj + off, ld, dy, rows, B, H, taps, gs, t < 3 ? dx[t] : NULL,
                                db[t], dp[t] + off);
    }
    simt::set_schedule(0);
    expect_close("block_conv y", y[1], y[0], n, 2e-6);
    expect_close("block_conv dx", dx[1], dx[0], n, 2e-6);
    expect_close("block_conv dbase", db[1], db[0], nb, 1e-5);
    expect_close("block_conv ddelta", dp[1], dp[0], nd, 2e-6);
    int64_t untouched_bad = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t col = 0; col < ld; col++) {
            const int64_t c = col - off;
            if (!(c >= 0 && c < taps * G && c / G <= r % B))
                untouched_bad += memcmp(&dp[1][r * ld + col], &dp0[r * ld + col], sizeof(float)) != 0;
        }
    check(untouched_bad == 0, "block_conv ddelta: %lld values outside the op's columns changed", (long long)untouched_bad);
    expect_same("block_conv dx, reverse schedule", dx[2], dx[1], (size_t)n * sizeof(float));
    expect_same("block_conv dbase, reverse schedule", db[2], db[1], (size_t)nb * sizeof(float));
    expect_same("block_conv ddelta, reverse schedule", dp[2], dp[1], (size_t)nd * sizeof(float));
    expect_same("block_conv dbase, dx NULL", db[3], db[1], (size_t)nb * sizeof(float));
    expect_same("block_conv ddelta, dx NULL", dp[3], dp[1], (size_t)nd * sizeof(float));
}

/* 3 blocks of 5 at H 70 (dbase's last warp of columns part-filled), gs 5, taps 2, the second side
 * of a padded row; more taps than slots with gs = H; then, on a card of one multiprocessor, 64
 * rows of 160 (the grid-stride kernels take several elements a thread) */
static void case_block_conv(void)
{
    block_conv_case(15, 5, 70, 2, 5, 3, 1);
    block_conv_case(8, 2, 40, 3, 40, 0, 0);
    const ddk_device_profile *card = simt::profile();
    ddk_device_profile one = *card;
    one.multiprocessors = 1;
    simt::set_profile(&one);
    block_conv_case(64, 16, 160, 2, 16, 0, 1);
    simt::set_profile(card);
    expect_ran("block_conv_kernel");
    expect_ran("block_conv_dx_kernel");
    expect_ran("block_conv_ddelta_kernel");
    expect_ran("block_conv_dbase_kernel");
}

/* ------------------------------------------------------------------------------------------
 * The loss
 */

/* head16: the target's bf16 head read in place (bf16 products: the backend's matmul_w16 panels) */
static void loss_case(int64_t vocab_tile, int given_labels, int head16)
{
    const int64_t n = 13, H = 32, V = 300;   /* 75 of a row's 256 threads hold columns */
    const ddk_loss_params p = { n, H, V, 5, vocab_tile, 0.15f, 2.0f, 0.1f, 1.5f, head16, head16, NULL };
    const float *hs = rand_floats(n * H, -1, 1), *W32 = rand_floats(V * H, -0.5, 0.5);
    float *ht = rand_floats(n * H, -1, 1);
    for (int64_t i = 1; i < n; i += 2)   /* the teacher's argmax the student's: "correct" counts */
        memcpy(ht + i * H, hs + i * H, (size_t)H * sizeof(float));
    uint16_t *W16 = buf<uint16_t>(V * H);
    for (int64_t i = 0; i < V * H; i++)
        W16[i] = ddk_f32_to_bf16(W32[i]);
    const void *W = head16 ? (const void *)W16 : (const void *)W32;
    const float *wts = rand_floats(n, 0.2, 1.0);
    /* given labels: every odd position's the student's argmax (so that "correct" counts, and a
     * wrong argmax shows), position 4 ignored */
    int32_t *labels = given_labels ? buf<int32_t>(n) : NULL, *argmax = buf<int32_t>(n);
    float *z = buf<float>(n * V);   /* (n, V) the student's fp32 logits */
    cpu->matmul(cpu, 0, 1, n, V, H, 1.0f, hs, H, W32, H, 0.0f, z, V);
    cpu->argmax_rows(cpu, z, n, V, argmax);
    for (int64_t i = 0; labels && i < n; i++)
        labels[i] = i == 4 ? -1 : i % 2 ? argmax[i] : (int32_t)((i * 17) % V);
    ddk_loss_result r[3];
    float *grad[3], *pp[3];
    for (int t = 0; t < 3; t++) {   /* CPU, emulated, emulated in the reverse order */
        const ddk_backend *be = t ? emu : cpu;
        simt::set_schedule(t == 2);
        grad[t] = buf<float>(n * H);
        pp[t] = buf<float>(n);
        const int rc = be->loss(be, &p, hs, ht, W, labels, wts, grad[t], pp[t], &r[t]);
        check(rc == 0, "loss on %s: %d", be->name, rc);
    }
    simt::set_schedule(0);
    check(fabs(r[1].loss - r[0].loss) <= 1e-5 * fabs(r[0].loss), "loss %.9g, want %.9g", r[1].loss, r[0].loss);
    check(fabs(r[1].ce - r[0].ce) <= 1e-5 * fabs(r[0].ce), "ce %.9g, want %.9g", r[1].ce, r[0].ce);
    check(fabs(r[1].kl - r[0].kl) <= 1e-5 * fabs(r[0].kl) + 1e-9, "kl %.9g, want %.9g", r[1].kl, r[0].kl);
    check(fabs(r[1].cap - r[0].cap) <= 1e-5 * fabs(r[0].cap) + 1e-9, "cap %.9g, want %.9g", r[1].cap, r[0].cap);
    check(r[0].correct >= 3, "the labels meant to be right are not: %lld correct", (long long)r[0].correct);
    check(r[1].counted == r[0].counted && r[1].correct == r[0].correct, "counted %lld correct %lld, want %lld %lld",
          (long long)r[1].counted, (long long)r[1].correct, (long long)r[0].counted, (long long)r[0].correct);
    expect_close("loss grad_student", grad[1], grad[0], n * H, 1e-5);
    expect_close("loss per_position", pp[1], pp[0], n, 1e-5);
    expect_same("loss grad, reverse schedule", grad[2], grad[1], (size_t)(n * H) * sizeof(float));
    check(memcmp(&r[2], &r[1], sizeof r[1]) == 0, "loss result, reverse schedule: not the same bits");
    expect_ran("stats_kernel");
    expect_ran("grad_kernel");
}

static void case_loss_materialised(void) { loss_case(0, 0, 0); }
static void case_loss_tiled(void) { loss_case(64, 1, 0); }
static void case_loss_head16(void) { loss_case(32, 1, 1); }

/* The loss with the DFlash2 selector (SPEC.md 2.1): its online top-K over tiles, its rows'
 * kernel, ds into the gradient, dA / dBs without atomics. vocab_tile 0 or streamed, given or
 * teacher labels, a bf16 head, inject, stop_gradient. dA, dBs, dHp are added into what they held. */
static void loss_selector_case(int64_t vocab_tile, int given_labels, int head16, int inject, int stop,
                               int64_t n = 21, int64_t chunk = 6)
{
    const int64_t H = 32, V = 300, K = 16, r = 20;
    ddk_loss_params p = { n, H, V, chunk, vocab_tile, 0.15f, 1.0f, 0.1f, 1.0f, head16, head16, NULL };
    const float *hs = rand_floats(n * H, -1, 1), *W32 = rand_floats(V * H, -0.5, 0.5);
    float *ht = rand_floats(n * H, -1, 1);
    for (int64_t i = 1; i < n; i += 2)   /* the teacher's argmax the student's: covered */
        memcpy(ht + i * H, hs + i * H, (size_t)H * sizeof(float));
    uint16_t *W16 = buf<uint16_t>(V * H);
    for (int64_t i = 0; i < V * H; i++)
        W16[i] = ddk_f32_to_bf16(W32[i]);
    const void *W = head16 ? (const void *)W16 : (const void *)W32;
    const float *wts = rand_floats(n, 0.2, 1.0);
    const float *A = rand_floats(V * r, -0.7, 0.7), *Bs = rand_floats(V * r, -0.7, 0.7);
    const float *Hp = rand_floats(r * H, -0.3, 0.3), *before = rand_floats(2 * V * r + r * H, -0.1, 0.1);
    int32_t *pred = buf<int32_t>(n), *labels = given_labels ? buf<int32_t>(n) : NULL;
    int32_t *top = buf<int32_t>(n * K);
    float *z = buf<float>(n * V);   /* (n, V) the student's fp32 logits */
    cpu->matmul(cpu, 0, 1, n, V, H, 1.0f, hs, H, W32, H, 0.0f, z, V);
    cpu->topk_rows(cpu, z, n, V, K, top, NULL);
    for (int64_t i = 0; i < n; i++) {
        pred[i] = (int32_t)((i * 37 + 5) % V);
        /* given: a third the argmax, a third one of the top K, the rest mostly outside; 4 ignored */
        if (labels)
            labels[i] = i == 4 ? -1 : i % 3 == 0 ? top[i * K] : i % 3 == 1 ? top[i * K + i % K]
                                                            : (int32_t)((i * 17) % V);
    }
    pred[4] = -3;   /* position 4 never counts (given: label -1; teacher: weight 0) */
    float *wts_used = copy_of(wts, n);
    wts_used[4] = labels ? wts_used[4] : 0.0f;
    ddk_selector sel = { K, r, 0.75f, inject, stop, pred, A, Bs, Hp, NULL, NULL, NULL };
    p.selector = &sel;
    ddk_loss_result res[3];
    float *grad[3], *pp[3], *d[3];
    for (int t = 0; t < 3; t++) {   /* CPU, emulated, emulated in the reverse order */
        const ddk_backend *be = t ? emu : cpu;
        simt::set_schedule(t == 2);
        grad[t] = buf<float>(n * H);
        pp[t] = buf<float>(n);
        d[t] = copy_of(before, 2 * V * r + r * H);   /* dA, dBs, dHp */
        sel.dA = d[t];
        sel.dBs = d[t] + V * r;
        sel.dHp = d[t] + 2 * V * r;
        const int rc = be->loss(be, &p, hs, ht, W, labels, wts_used, grad[t], pp[t], &res[t]);
        check(rc == 0, "loss on %s: %d", be->name, rc);
    }
    simt::set_schedule(0);
    const ddk_loss_result &a = res[1], &b = res[0];
    check(fabs(a.loss - b.loss) <= 1e-5 * fabs(b.loss), "loss %.9g, want %.9g", a.loss, b.loss);
    check(fabs(a.ce - b.ce) <= 1e-5 * fabs(b.ce), "ce %.9g, want %.9g", a.ce, b.ce);
    check(fabs(a.kl - b.kl) <= 1e-5 * fabs(b.kl) + 1e-9, "kl %.9g, want %.9g", a.kl, b.kl);
    check(fabs(a.cap - b.cap) <= 1e-5 * fabs(b.cap) + 1e-9, "cap %.9g, want %.9g", a.cap, b.cap);
    check(fabs(a.sel - b.sel) <= 1e-5 * fabs(b.sel) + 1e-9, "sel %.9g, want %.9g", a.sel, b.sel);
    check(a.counted == b.counted && a.correct == b.correct && a.sel_covered == b.sel_covered &&
              a.sel_correct == b.sel_correct,
          "counted %lld correct %lld covered %lld sel_correct %lld, want %lld %lld %lld %lld",
          (long long)a.counted, (long long)a.correct, (long long)a.sel_covered, (long long)a.sel_correct,
          (long long)b.counted, (long long)b.correct, (long long)b.sel_covered, (long long)b.sel_correct);
    check(b.sel_covered >= 5 && b.sel_covered < b.counted, "setup: %lld of %lld labels covered",
          (long long)b.sel_covered, (long long)b.counted);
    expect_close("selector loss grad_student", grad[1], grad[0], n * H, 1e-5);
    expect_close("selector loss per_position", pp[1], pp[0], n, 1e-5);
    expect_close("selector dA", d[1], d[0], V * r, 1e-5);
    expect_close("selector dBs", d[1] + V * r, d[0] + V * r, V * r, 1e-5);
    expect_close("selector dHp", d[1] + 2 * V * r, d[0] + 2 * V * r, r * H, 1e-5);
    expect_same("selector loss grad, reverse schedule", grad[2], grad[1], (size_t)(n * H) * sizeof(float));
    expect_same("selector dA, dBs, dHp, reverse schedule", d[2], d[1],
                (size_t)(2 * V * r + r * H) * sizeof(float));
    check(memcmp(&res[2], &res[1], sizeof res[1]) == 0, "selector loss result, reverse schedule: not the same bits");
    expect_ran("topk_kernel");
    expect_ran("sel_rows_kernel");
    expect_ran("sel_scatter_kernel");
    if (!stop)
        expect_ran("sel_grad_cols_kernel");
}

static void case_loss_selector_materialised(void) { loss_selector_case(0, 1, 0, 0, 0); }
static void case_loss_selector_tiled(void) { loss_selector_case(64, 0, 0, 1, 0); }
static void case_loss_selector_head16(void) { loss_selector_case(37, 1, 1, 1, 1); }
static void case_loss_selector_narrow(void) { loss_selector_case(7, 0, 0, 0, 0); }   /* tiles narrower than K */
/* chunks of 150 rows: dA's and dBs's scatter in groups (selector_cuda.cu: 64 rows at K 16) */
static void case_loss_selector_groups(void) { loss_selector_case(0, 1, 0, 0, 0, 170, 150); }

/* topk_rows: rows of few levels (ties), NaNs and -inf, wider and narrower than a block */
static void case_topk(void)
{
    static const int64_t shapes[][2] = { { 5, 300 }, { 3, 1000 }, { 4, 70 }, { 2, 16 } };
    for (const auto &sh : shapes) {
        const int64_t rows = sh[0], n = sh[1];
        float *x = buf<float>(rows * n);
        for (int64_t i = 0; i < rows * n; i++) {
            const double u = uniform(0, 1);
            x[i] = u < 0.05 ? NAN : u < 0.1 ? -INFINITY : (float)(int)(uniform(0, 12)) * 0.5f;
        }
        for (int64_t j = 0; j < n; j++)   /* a row of only NaNs: the first k by index */
            x[j] = NAN;
        const int64_t ks[] = { 1, 7, 16, n < (int64_t)DDK_SELECTOR_MAX_K ? n : (int64_t)DDK_SELECTOR_MAX_K };
        for (int64_t k : ks) {
            int32_t *idx[2] = { buf<int32_t>(rows * k), buf<int32_t>(rows * k) };
            float *val[2] = { buf<float>(rows * k), buf<float>(rows * k) };
            cpu->topk_rows(cpu, x, rows, n, k, idx[0], val[0]);
            emu->topk_rows(emu, x, rows, n, k, idx[1], val[1]);
            char what[64];
            snprintf(what, sizeof what, "topk_rows %lld x %lld, k %lld", (long long)rows, (long long)n, (long long)k);
            expect_same(what, idx[1], idx[0], (size_t)(rows * k) * sizeof(int32_t));
            expect_same(what, val[1], val[0], (size_t)(rows * k) * sizeof(float));
        }
    }
    expect_ran("topk_kernel");
}

/* lse and lp (rows) of the emulated kernel against the CPU's: infinities exactly, else within
 * 1e-6 of max(1, |cpu|) (test_backend_ops.c's tol_lse: expf terms summed in double against the
 * CPU's exp in double) */
static void expect_lse(const char *what, const float *got, const float *want, int64_t rows)
{
    for (int64_t r = 0; r < rows; r++) {
        const double d = fabs((double)got[r] - want[r]), scale = fmax(1.0, fabs((double)want[r]));
        const int ok = isinf(want[r]) ? got[r] == want[r] : d <= 1e-6 * scale;   /* NaN: never */
        if (verbose)
            printf("  %s[%lld]: %.9g, cpu %.9g\n", what, (long long)r, got[r], want[r]);
        check(ok, "%s[%lld] = %.9g, cpu %.9g", what, (long long)r, got[r], want[r]);
    }
}

/* logsumexp_rows: rows narrower and wider than a block, by r % 4: numbers with NaNs and -infs;
 * only -inf and NaN; a +inf at col; +-1e30 at every 5th column (a plain sum of exp overflows);
 * col -1 where r % 5 == 4; again with lp and col NULL in the reverse order (the same lse bits) */
static void case_logsumexp(void)
{
    static const int64_t shapes[][2] = { { 4, 1 }, { 5, 300 }, { 4, 1000 }, { 8, 70 }, { 4, 2000 } };
    for (const auto &sh : shapes) {
        const int64_t rows = sh[0], n = sh[1];
        float *x = buf<float>(rows * n);   /* (rows, n) */
        int32_t *col = buf<int32_t>(rows);
        for (int64_t r = 0; r < rows; r++) {
            float *row = x + r * n;
            col[r] = (int32_t)uniform(0, (double)n);
            for (int64_t j = 0; j < n; j++) {
                const double u = uniform(0, 1);
                row[j] = u < 0.05 ? NAN : u < 0.1 ? -INFINITY : (float)uniform(-8, 8);
                if (r % 4 == 1)
                    row[j] = j % 3 ? -INFINITY : NAN;
                else if (r % 4 == 3 && j % 5 == 0)
                    row[j] = j / 5 % 2 ? -1e30f : 1e30f;
            }
            if (r % 4 == 2)
                row[col[r]] = INFINITY;
            if (r % 5 == 4)
                col[r] = -1;
        }
        float *lse[2] = { buf<float>(rows), buf<float>(rows) }, *lp[2] = { buf<float>(rows), buf<float>(rows) },
              *lse2 = buf<float>(rows);
        cpu->logsumexp_rows(cpu, x, rows, n, col, lse[0], lp[0]);
        emu->logsumexp_rows(emu, x, rows, n, col, lse[1], lp[1]);
        simt::set_schedule(1);   /* blocks and threads in the reverse order: the same bits */
        emu->logsumexp_rows(emu, x, rows, n, NULL, lse2, NULL);
        simt::set_schedule(0);
        char what[64];
        snprintf(what, sizeof what, "lse %lld x %lld", (long long)rows, (long long)n);
        expect_lse(what, lse[1], lse[0], rows);
        expect_same(what, lse2, lse[1], (size_t)rows * sizeof(float));
        snprintf(what, sizeof what, "lp %lld x %lld", (long long)rows, (long long)n);
        expect_lse(what, lp[1], lp[0], rows);
    }
    expect_ran("logsumexp_rows_kernel");
}

/* ------------------------------------------------------------------------------------------
 * Attention
 */

struct attn_inputs {
    float *q, *k, *v, *dout;
    int32_t *anchors;
    uint8_t *keep;
};

static attn_inputs attn_make(const ddk_attention_shape *s)
{
    const int64_t rows = s->A * s->B, keys = s->S + rows;
    attn_inputs in;
    in.q = rand_floats(rows * s->nh * s->d, -1, 1);
    in.k = rand_floats(keys * s->nkv * s->d, -1, 1);
    in.v = rand_floats(keys * s->nkv * s->d, -1, 1);
    in.dout = rand_floats(rows * s->nh * s->d, -1, 1);
    in.anchors = buf<int32_t>(s->A);
    in.keep = buf<uint8_t>(s->A);
    for (int64_t j = 0; j < s->A; j++) {
        in.anchors[j] = (int32_t)((j * 11 + 5) % (s->S + 1));
        in.keep[j] = j != 1;   /* one padded block */
    }
    return in;
}

/* DFlash forward and backward, CPU against the kernel set `kind`; flash: the backward again in
 * the reverse order, the same bits */
static void dflash_case(const ddk_attention_shape *s, int kind)
{
    ddk_cuda_set_attention_kernels(kind);
    const attn_inputs in = attn_make(s);
    const int64_t qn = s->A * s->B * s->nh * s->d, kn = (s->S + s->A * s->B) * s->nkv * s->d,
                  ln = s->A * s->B * s->nh;
    float *out[2], *lse[2], *dq[3], *dk[3], *dv[3];
    const float *dq0 = rand_floats(qn, -1, 1), *dk0 = rand_floats(kn, -1, 1), *dv0 = rand_floats(kn, -1, 1);
    for (int t = 0; t < 3; t++) {
        const ddk_backend *be = t ? emu : cpu;
        const int b = t ? 1 : 0;
        simt::set_schedule(t == 2);
        if (t < 2) {
            out[b] = buf<float>(qn);
            lse[b] = buf<float>(ln);
            const int rc = be->dflash_attention(be, s, in.q, in.k, in.v, in.anchors, in.keep, out[b], lse[b]);
            check(rc == 0, "dflash_attention on %s: %d", be->name, rc);
        }
        dq[t] = copy_of(dq0, qn);
        dk[t] = copy_of(dk0, kn);
        dv[t] = copy_of(dv0, kn);
        const int rc = be->dflash_attention_backward(be, s, in.q, in.k, in.v, in.anchors, in.keep, out[0],
                                                     lse[0], in.dout, dq[t], dk[t], dv[t]);
        check(rc == 0, "dflash_attention_backward on %s: %d", be->name, rc);
        if (kind == DDK_CUDA_ATTENTION_SIMT && t == 1)
            break;   /* float atomics: no bit-for-bit claim */
    }
    simt::set_schedule(0);
    ddk_cuda_set_attention_kernels(-1);
    const int flash = kind == DDK_CUDA_ATTENTION_FLASH;
    const double tf = flash ? 1.5e-2 : 1e-5, tg = flash ? 3e-2 : 1e-4;
    expect_close("out", out[1], out[0], qn, tf);
    expect_close("lse", lse[1], lse[0], ln, tf);
    expect_close("dq", dq[1], dq[0], qn, tg);
    expect_close("dk", dk[1], dk[0], kn, tg);
    expect_close("dv", dv[1], dv[0], kn, tg);
    if (flash) {
        expect_same("dq, reverse schedule", dq[2], dq[1], (size_t)qn * sizeof(float));
        expect_same("dk, reverse schedule", dk[2], dk[1], (size_t)kn * sizeof(float));
        expect_same("dv, reverse schedule", dv[2], dv[1], (size_t)kn * sizeof(float));
        expect_ran("flash_forward");
        expect_ran("flash_dq");
        expect_ran("flash_dkv");
    } else {
        expect_ran("simt_attention");
    }
}

/* S, A, B, nh, nkv, d, window, q_rows (unused), bidirectional */
static const ddk_attention_shape dflash_d64 = { 40, 3, 5, 4, 2, 64, 0, 0, 0 };
static const ddk_attention_shape dflash_seed_rows = { 20, 2, 24, 4, 1, 128, 16, 0, 0 };   /* 96 rows a group */
static const ddk_attention_shape dflash_d256 = { 30, 3, 4, 4, 1, 256, 0, 0, 0 };
static const ddk_attention_shape dflash_simt = { 30, 3, 5, 4, 2, 40, 12, 0, 0 };
static const ddk_attention_shape dflash_simt_d256 = { 40, 2, 20, 2, 1, 256, 0, 0, 0 };   /* 16 rows a block: half tiles on 99 KB */
/* DFlash2's bidirectional blocks under a window below B (it still cuts the context) */
static const ddk_attention_shape dflash_bidir_d64 = { 40, 3, 5, 4, 2, 64, 3, 0, 1 };
static const ddk_attention_shape dflash_bidir_seed_rows = { 40, 2, 24, 4, 1, 128, 16, 0, 1 };
static const ddk_attention_shape dflash_bidir_simt = { 30, 3, 5, 4, 2, 40, 3, 0, 1 };
static void case_dflash_d64(void) { dflash_case(&dflash_d64, DDK_CUDA_ATTENTION_FLASH); }
static void case_dflash_seed_rows(void) { dflash_case(&dflash_seed_rows, DDK_CUDA_ATTENTION_FLASH); }
static void case_dflash_d256(void) { dflash_case(&dflash_d256, DDK_CUDA_ATTENTION_FLASH); }
static void case_dflash_simt(void) { dflash_case(&dflash_simt, DDK_CUDA_ATTENTION_SIMT); }
static void case_dflash_simt_d256(void) { dflash_case(&dflash_simt_d256, DDK_CUDA_ATTENTION_SIMT); }
static void case_dflash_bidir_d64(void) { dflash_case(&dflash_bidir_d64, DDK_CUDA_ATTENTION_FLASH); }
static void case_dflash_bidir_seed_rows(void) { dflash_case(&dflash_bidir_seed_rows, DDK_CUDA_ATTENTION_FLASH); }
static void case_dflash_bidir_simt(void) { dflash_case(&dflash_bidir_simt, DDK_CUDA_ATTENTION_SIMT); }

/* causal prefill: 6 query heads a kv head, 40 positions: 240 rows, past what a 99 KB card's
 * block takes at d 256 (112); and 5 queries over a cache of 40 */
static void case_causal(void)
{
    const ddk_backend *be[2] = { cpu, emu };
    for (int cached = 0; cached <= 1; cached++) {
        const ddk_attention_shape s = { 40, 0, 0, 6, 1, 256, 0, cached ? 5 : 0, 0 };
        const int64_t T = cached ? 5 : 40;
        const float *q = rand_floats(T * 6 * 256, -1, 1), *k = rand_floats(40 * 256, -1, 1), *v = rand_floats(40 * 256, -1, 1);
        float *out[2];
        for (int b = 0; b < 2; b++) {
            out[b] = buf<float>(T * 6 * 256);
            const int rc = be[b]->causal_attention(be[b], &s, q, k, v, out[b]);
            check(rc == 0, "causal_attention on %s: %d", be[b]->name, rc);
        }
        expect_close(cached ? "causal over a cache" : "causal prefill", out[1], out[0], T * 6 * 256, 1.5e-2);
    }
    expect_ran("flash_forward");
}

/* tree attention: 7 nodes after a cache of 9 keys (parents -1 = the cache's last) */
static void case_tree(void)
{
    const ddk_backend *be[2] = { cpu, emu };
    static const int32_t parents[] = { -1, 0, 0, 1, 2, 2, 5 };
    const int64_t n = 7, cache = 9, nh = 4, nkv = 2, d = 32;
    const ddk_attention_shape s = { cache + n, 0, 0, nh, nkv, d, 0, n, 0 };
    const float *q = rand_floats(n * nh * d, -1, 1), *k = rand_floats((cache + n) * nkv * d, -1, 1),
                *v = rand_floats((cache + n) * nkv * d, -1, 1);
    float *out[2];
    for (int b = 0; b < 2; b++) {
        out[b] = buf<float>(n * nh * d);
        const int rc = be[b]->tree_attention(be[b], &s, q, k, v, parents, out[b]);
        check(rc == 0, "tree_attention on %s: %d", be[b]->name, rc);
    }
    expect_close("tree attention", out[1], out[0], n * nh * d, 1e-5);
    expect_ran("tree_forward");
}

/* a card with 16 KB of shared memory a block (none we plan for): no flash instance fits (20,736
 * bytes at the smallest), so the SIMT forward runs, and ddk_cuda_fallbacks says so, once a call */
static void case_fallback_said(void)
{
    ddk_device_profile small = *ddk_device_profile_find("h200");
    small.name = "16 KB";
    small.smem_per_block_optin = 16384;
    simt::set_profile(&small);
    const ddk_attention_shape s = { 30, 2, 5, 4, 2, 32, 0, 0, 0 };
    const attn_inputs in = attn_make(&s);
    float *out[2] = { buf<float>(2 * 5 * 4 * 32), buf<float>(2 * 5 * 4 * 32) },
          *lse[2] = { buf<float>(2 * 5 * 4), buf<float>(2 * 5 * 4) };
    const uint64_t before = ddk_cuda_fallbacks(NULL, 0);
    const ddk_backend *be[2] = { cpu, emu };
    for (int b = 0; b < 2; b++)
        check(be[b]->dflash_attention(be[b], &s, in.q, in.k, in.v, in.anchors, in.keep, out[b], lse[b]) == 0,
              "dflash_attention on %s", be[b]->name);
    expect_close("out after the fallback", out[1], out[0], 2 * 5 * 4 * 32, 1e-5);
    expect_ran("simt_attention");
    char what[320];
    check(ddk_cuda_fallbacks(what, sizeof what) == before + 1, "the fallback was not counted once");
    check(strstr(what, "dflash_attention at head dim 32") && strstr(what, "16384 bytes") &&
              strstr(what, "SIMT attention kernels"), "the fallback's sentence: \"%s\"", what);
}

/* what each card gets (attention_flash.cu's and deltanet_cuda.cu's figures): flash rows a block
 * forward / dq / key-major chunk at d 64, 128, 256, then the Gated DeltaNet chunk */
static const char *expected_instances(const char *card)
{
    return !strcmp(card, "rtx-pro-6000")
               ? "d64 96/96/64 d128 96/80/32 d256 112/32/16; gated delta chunk dk128 46, dk256 23"
               : "d64 96/96/64 d128 96/96/64 d256 128/64/32; gated delta chunk dk128 64, dk256 64";
}

int main(int argc, char **argv)
{
    const char *v = getenv("DDTREE_SIMT_VERBOSE");
    verbose = v && *v && strcmp(v, "0") != 0;
    const char *ff = getenv("DDTREE_SIMT_FAIL_FAST");
    const int fail_fast = ff && *ff && strcmp(ff, "0") != 0;
    cpu = ddk_backend_cpu();
    emu = simt_backend();
    static const test_case cases[] = {
        { "rmsnorm (+ backward), gated_rmsnorm, l2norm_heads", case_norms },
        { "rope, rope_partial, swiglu (+ backward, bf16 inputs)", case_rope_swiglu },
        { "embedding (fp32, bf16), argmax, sumsq, axpby, noise, adamw + bf16 copy, round_bf16", case_gathers_vectors },
        { "round_bf16_rows, conv1d_silu, sigmoid_mul, delta_gates", case_target_ops },
        { "gated_delta dk 128: recurrence, chunked over 70 tokens", case_delta_128 },
        { "gated_delta dk 256: recurrence, chunked", case_delta_256 },
        { "loss materialised, teacher labels; same bits reversed", case_loss_materialised },
        { "loss tiled 64 (a short last tile), given labels; same bits reversed", case_loss_tiled },
        { "loss tiled 32, bf16 head in place; same bits reversed", case_loss_head16 },
        { "loss + selector materialised, strict, given labels; same bits reversed", case_loss_selector_materialised },
        { "loss + selector tiled 64, inject, teacher labels; same bits reversed", case_loss_selector_tiled },
        { "loss + selector tiled 37, bf16 head, inject, stop_gradient; same bits reversed", case_loss_selector_head16 },
        { "loss + selector, chunks of 150 rows (the scatter's groups); same bits reversed", case_loss_selector_groups },
        { "loss + selector tiled 7 (< K), strict, teacher labels; same bits reversed", case_loss_selector_narrow },
        { "topk_rows: ties, NaNs, -inf, k 1 to 64", case_topk },
        { "dflash flash d 64; backward same bits reversed", case_dflash_d64 },
        { "dflash flash d 128, 96-row groups, window; same bits reversed", case_dflash_seed_rows },
        { "dflash flash d 256; same bits reversed", case_dflash_d256 },
        { "dflash SIMT kernels d 40, window", case_dflash_simt },
        { "dflash SIMT kernels d 256 (16-key tiles on 99 KB)", case_dflash_simt_d256 },
        { "causal flash d 256: prefill of 240 rows, over a cache", case_causal },
        { "tree attention", case_tree },
        /* the DFlash2 drafter's (appended, so that the cases above keep their seeds) */
        { "dflash flash d 64, bidirectional blocks, window 3 < B; same bits reversed", case_dflash_bidir_d64 },
        { "dflash flash d 128, 96-row groups, bidirectional, window; same bits reversed", case_dflash_bidir_seed_rows },
        { "dflash SIMT kernels d 40, bidirectional blocks, window 3 < B", case_dflash_bidir_simt },
        { "block_conv (+ backward, dx NULL; one multiprocessor); same bits reversed", case_block_conv },
        { "logsumexp_rows: NaNs, -inf, +inf, +-1e30, col -1; lp NULL reversed the same bits", case_logsumexp },
    };
    static const char *const all[] = { "h200", "b200", "rtx-pro-6000" };
    const char *const *cards = argc > 1 ? (const char *const *)argv + 1 : all;
    const int ncards = argc > 1 ? argc - 1 : 3;
    for (int ci = 0; ci < ncards; ci++) {
        const char *name = cards[ci];
        const ddk_device_profile *p = ddk_device_profile_find(name);
        if (!p) {
            fprintf(stderr, "test_simt_kernels: %s is not a card of ddk_device_profiles\n", name);
            return 2;
        }
        simt::set_profile(p);
        char inst[400];
        ddk_cuda_instances(0, inst, sizeof inst);
        printf("# %s: %s\n", p->name, inst);
        case_failed = 0;
        check(strstr(inst, expected_instances(p->name)) != NULL, "the instances are not \"%s\"",
              expected_instances(p->name));
        char line[200];
        snprintf(line, sizeof line, "%s: the instances chosen for its limits", p->name);
        case_done(line);
        for (const test_case &c : cases) {
            rng = 0x5eed + (uint64_t)(&c - cases);
            case_failed = 0;
            c.run();
            close_case();
            char line[200];
            snprintf(line, sizeof line, "%s: %s", p->name, c.name);
            case_done(line);
            if (fail_fast && cases_failed)
                return cases_summary();
        }
    }
    run_case("a fallback to the SIMT kernels is counted and said (a 16 KB card)", case_fallback_said);
    close_case();
    return cases_summary();
}
