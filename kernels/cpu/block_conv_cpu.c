/* block_conv_cpu.c: the DFlash2 drafter's grouped dynamic causal convolution over the slots of
 * each block (SPEC.md 2.1), forward and backward, on the CPU (contract in ddk.h, struct
 * ddk_backend: block_conv, block_conv_backward). Plain loops: the op is a few multiply-adds per
 * element next to the drafter's matrix products. Forward overwrites y; the backward ADDS.
 *
 * Every sum runs in one fixed order: y and dx over the taps in tap order, dbase over the rows in
 * row order (straight into dbase, as rmsnorm_backward's dg), ddelta over a group's gs channels in
 * channel order. The CUDA kernels (kernels/cuda/block_conv_cuda.cu) sum in the same orders except
 * dbase's (row lanes there), so they match to rounding.
 *
 * Tested by tests/kernels/test_ops.c (a float64 reference of the formula, the backward against it
 * and against central finite differences, ADD, dx NULL, a strided delta with columns that must stay
 * untouched, guard bytes).
 *
 * Legend: rows block rows (a multiple of B), B block size (row t is slot t % B), H channels,
 * taps kernel taps, gs channels a group, G = H / gs groups, ld_delta delta's row stride.
 */
#include "ddk.h"
#include "cpu_backend.h"

/* y[t, c] = sum_{j < taps, j <= t % B} (base[j, c] + delta[t, j*G + c/gs]) x[t - j, c] */
void ddk_cpu_block_conv(const ddk_backend *be, const float *x, const float *base,
                        const float *delta, int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                        int64_t taps, int64_t gs, float *y)
{
    const int64_t G = H / gs;
    for (int64_t t = 0; t < rows; t++) {
        const int64_t nt = taps < t % B + 1 ? taps : t % B + 1;   /* taps that stay in the block */
        const float *dt = delta + t * ld_delta;                  /* (taps, G) */
        float *yt = y + t * H;                                   /* (H) */
        for (int64_t c = 0; c < H; c++) {
            float acc = 0.0f;
            for (int64_t j = 0; j < nt; j++)
                acc += (base[j * H + c] + dt[j * G + c / gs]) * x[(t - j) * H + c];
            yt[c] = acc;
        }
    }
}

/* dx[s, c]      += sum_{j: s % B + j < B} (base[j, c] + delta[s + j, j*G + c/gs]) dy[s + j, c]
 * dbase[j, c]   += sum_{t: t % B >= j} dy[t, c] x[t - j, c]
 * ddelta[t, j*G + g] += sum_{c in group g} dy[t, c] x[t - j, c]   (j <= t % B) */
void ddk_cpu_block_conv_backward(const ddk_backend *be, const float *x, const float *base,
                                 const float *delta, int64_t ld_delta, const float *dy,
                                 int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                                 float *dx, float *dbase, float *ddelta)
{
    const int64_t G = H / gs;
    for (int64_t t = 0; t < rows; t++) {
        const int64_t o = t % B;
        const float *dyt = dy + t * H;   /* (H) */
        if (dx) {   /* row t's x feeds rows t .. t + taps - 1 of its block */
            const int64_t nt = taps < B - o ? taps : B - o;
            float *dxt = dx + t * H;   /* (H) */
            for (int64_t c = 0; c < H; c++) {
                float acc = 0.0f;
                for (int64_t j = 0; j < nt; j++)
                    acc += (base[j * H + c] + delta[(t + j) * ld_delta + j * G + c / gs]) *
                           dy[(t + j) * H + c];
                dxt[c] += acc;
            }
        }
        const int64_t nt = taps < o + 1 ? taps : o + 1;
        for (int64_t j = 0; j < nt; j++) {
            const float *xs = x + (t - j) * H;         /* (H) the row tap j reads */
            float *dbj = dbase + j * H;                /* (H) */
            float *ddt = ddelta + t * ld_delta + j * G;   /* (G) */
            for (int64_t g = 0; g < G; g++) {
                float acc = 0.0f;
                for (int64_t c = g * gs; c < (g + 1) * gs; c++) {
                    const float p = dyt[c] * xs[c];
                    acc += p;
                    dbj[c] += p;
                }
                ddt[g] += acc;
            }
        }
    }
}
