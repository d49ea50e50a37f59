/* target_cpu.c: the Qwen3.5 target's element-wise steps on the CPU (contracts in ddk.h, struct
 * ddk_backend): the DeltaNet's q / k l2 normalisation (l2norm_heads) and its gates
 * (delta_gates: beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias)), and the gated
 * attention's output gate (sigmoid_mul).
 *
 * These are the engine's own loops (daemon/engine/model/target_qwen35.c) moved behind the backend, and
 * they must give its bits: float sums in index order, each operation rounded as written. This
 * file is therefore built with -ffp-contract=off (kernels/CMakeLists.txt; the rest of libddk
 * contracts a * b + c into FMAs, the engine's ISO C build does not), and without
 * `#pragma omp simd` (a vectorised sum would reorder it). expf and log1pf are libm's, as there.
 * Deliberately not here: threads or vectorisation (each op is O(T x width), next to the
 * projections' O(T x width x H)).
 *
 * Tested by tests/kernels/test_ops.c (against float64 formulas, and bit for bit against a copy of the
 * engine's loops).
 *
 * Legend: T tokens, heads of d values (l2norm_heads, row stride ld), nv value heads, count
 * elements.
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <math.h>

/* softplus(s) = s above this (torch's threshold, as the Qwen3.5 reference uses it) */
static const float SOFTPLUS_LINEAR = 20.0f;

static float sigmoidf(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

void ddk_cpu_l2norm_heads(const ddk_backend *be, const float *src, int64_t ld, int64_t T,
                          int64_t heads, int64_t d, float scale, float eps, float *dst)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t h = 0; h < heads; h++) {
            const float *x = src + t * ld + h * d;   /* (d) */
            float *y = dst + (t * heads + h) * d;    /* (d), may be x */
            float ss = 0.0f;
            for (int64_t i = 0; i < d; i++)
                ss += x[i] * x[i];
            const float f = scale / sqrtf(ss + eps);
            for (int64_t i = 0; i < d; i++)
                y[i] = x[i] * f;
        }
}

void ddk_cpu_sigmoid_mul(const ddk_backend *be, float *x, const float *gate, int64_t count)
{
    for (int64_t i = 0; i < count; i++)
        x[i] *= sigmoidf(gate[i]);
}

void ddk_cpu_delta_gates(const ddk_backend *be, const float *b, const float *a, const float *A_log,
                         const float *dt_bias, int64_t T, int64_t nv, float *beta, float *g)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t j = 0; j < nv; j++) {
            const int64_t i = t * nv + j;
            const float s = a[i] + dt_bias[j];
            beta[i] = sigmoidf(b[i]);
            g[i] = -expf(A_log[j]) * (s > SOFTPLUS_LINEAR ? s : log1pf(expf(s)));   /* log decay <= 0 */
        }
}
