/* swiglu_cpu.c: the drafter's and the target's MLP gate on the CPU: h = silu(gate) * up,
 * silu(x) = x sigmoid(x), and its backward.
 * Tested by tests/test_ops.c (float64 reference, finite differences).
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <math.h>

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

void ddk_cpu_swiglu(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                    float *h)
{
    for (int64_t i = 0; i < count; i++)
        h[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

/* silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))) */
void ddk_cpu_swiglu_backward(const ddk_backend *be, const float *gate, const float *up,
                             const float *dh, int64_t count, float *dgate, float *dup)
{
    for (int64_t i = 0; i < count; i++) {
        float s = sigmoid(gate[i]);
        dgate[i] += dh[i] * up[i] * s * (1.0f + gate[i] * (1.0f - s));
        dup[i] += dh[i] * gate[i] * s;
    }
}
