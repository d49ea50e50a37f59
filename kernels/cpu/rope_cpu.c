/* rope_cpu.c: rotate-half ("NeoX") RoPE on the CPU, in place (SPEC.md section 2): for head
 * vector x of d values at position p, pair (x_i, x_{i+d/2}), i < d/2, turns by p * theta^(-2i/d).
 * The backward is the same rotation by the negative angle. Angles are formed in double, so
 * large positions keep their precision.
 * Tested by tests/test_ops.c (float64 reference; inverse(rope(x)) = x).
 * Legend: rows tokens, heads per token, d head dim (even).
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <math.h>

enum { DDK_ROPE_MAX_HALF = 512 };   /* head_dim <= 1024: callers check (ddk.h) */

void ddk_cpu_rope(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                  int64_t heads, int64_t d, float theta, int inverse)
{
    const int64_t half = d / 2;
    const double sign = inverse ? -1.0 : 1.0;
    double inv_freq[DDK_ROPE_MAX_HALF];   /* theta^(-2i/d) */
    for (int64_t i = 0; i < half && i < DDK_ROPE_MAX_HALF; i++)
        inv_freq[i] = pow((double)theta, -2.0 * (double)i / (double)d);
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
