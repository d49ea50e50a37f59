/* norm_cpu.c: RMSNorm forward and backward on the CPU (SPEC.md section 2: plain Qwen3 form,
 * float32, also used per head for q_norm/k_norm with rows = tokens * heads), and the gated
 * RMSNorm of Qwen3.5's DeltaNet output (SPEC.md 3.1, forward only).
 * Tested by tests/kernels/test_ops.c (float64 reference, finite differences).
 * Legend: rows independent vectors of d values.
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <math.h>

/* 1 / sqrt(mean(x^2) + eps) of one row, the sum in double */
static float row_rstd(const float *x, int64_t d, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < d; i++)
        ss += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(ss / d + eps));
}

void ddk_cpu_rmsnorm(const ddk_backend *be, const float *x, const float *g, int64_t rows,
                     int64_t d, float eps, float *y, float *rstd)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d;   /* (d) */
        float *yr = y + r * d;         /* (d) */
        const float s = row_rstd(xr, d, eps);
        for (int64_t i = 0; i < d; i++)
            yr[i] = xr[i] * s * g[i];
        if (rstd)
            rstd[r] = s;
    }
}

/* y = x s g with s = (mean(x^2) + eps)^(-1/2):
 * dx = s (g dy) - x s^3 / d * sum(x g dy);  dg = sum over rows of dy x s */
void ddk_cpu_rmsnorm_backward(const ddk_backend *be, const float *x, const float *g,
                              const float *rstd, const float *dy, int64_t rows, int64_t d,
                              float *dx, float *dg)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *dyr = dy + r * d;   /* (d) */
        float *dxr = dx + r * d;                            /* (d) */
        const float s = rstd[r];
        double dot = 0.0;
        for (int64_t i = 0; i < d; i++)
            dot += (double)xr[i] * g[i] * dyr[i];
        const float k = (float)(dot * s * s * s / d);
        for (int64_t i = 0; i < d; i++) {
            dxr[i] += s * g[i] * dyr[i] - xr[i] * k;
            dg[i] += dyr[i] * xr[i] * s;
        }
    }
}

/* y = x s w silu(z), silu(z) = z / (1 + exp(-z)); the norm of x before the gate */
void ddk_cpu_gated_rmsnorm(const ddk_backend *be, const float *x, const float *z, const float *w,
                           int64_t rows, int64_t d, float eps, float *y)
{
    for (int64_t r = 0; r < rows; r++) {
        const float *xr = x + r * d, *zr = z + r * d;   /* (d) */
        float *yr = y + r * d;                            /* (d) */
        const float s = row_rstd(xr, d, eps);
        for (int64_t i = 0; i < d; i++)
            yr[i] = xr[i] * s * w[i] * (zr[i] / (1.0f + expf(-zr[i])));
    }
}
