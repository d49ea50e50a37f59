/* rope_cpu.c: rotate-half ("NeoX") RoPE on the CPU, in place (SPEC.md sections 2 and 3.1): for
 * head vector x at position p, pair (x_i, x_{i+rd/2}), i < rd/2, turns by p * theta^(-2i/rd);
 * rope rotates the whole head (rd = d), rope_partial the first rd dims only (Qwen3.5's partial
 * rotary), both through one loop, so rope_partial with rd = d is rope bit for bit. The backward
 * (rope only; the target is frozen) is the same rotation by the negative angle. Angles are formed
 * in double, so large positions keep their precision.
 * Tested by tests/kernels/test_ops.c (float64 reference; inverse(rope(x)) = x; rope_partial against its
 * own reference, rd = d against rope).
 * Legend: rows tokens, heads per token, d head dim, rd rotated dims (even, <= d).
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <math.h>

enum { DDK_ROPE_MAX_HALF = 512 };   /* head_dim <= 1024: callers check (ddk.h) */

static void rope_rows(float *x, const int32_t *pos, int64_t rows, int64_t heads, int64_t d,
                      int64_t rd, float theta, double sign)
{
    const int64_t half = rd / 2;
    double inv_freq[DDK_ROPE_MAX_HALF];   /* theta^(-2i/rd) */
    for (int64_t i = 0; i < half && i < DDK_ROPE_MAX_HALF; i++)
        inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)rd);
    for (int64_t r = 0; r < rows; r++) {
        for (int64_t i = 0; i < half; i++) {
            double angle = sign * pos[r] * inv_freq[i];
            float c = (float)cos(angle), s = (float)sin(angle);
            for (int64_t h = 0; h < heads; h++) {
                float *xh = x + (r * heads + h) * d;   /* (d) */
                float a = xh[i], b = xh[i + half];
                xh[i] = a * c - b * s;
                xh[i + half] = b * c + a * s;
            }
        }
    }
}

void ddk_cpu_rope(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                  int64_t heads, int64_t d, float theta, int inverse)
{
    rope_rows(x, pos, rows, heads, d, d, theta, inverse ? -1.0 : 1.0);
}

void ddk_cpu_rope_partial(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                          int64_t heads, int64_t d, int64_t rd, float theta)
{
    rope_rows(x, pos, rows, heads, d, rd, theta, 1.0);
}
