/* swiglu_cpu.c: the drafter's and the target's MLP gate on the CPU: h = silu(gate) * up,
 * silu(x) = x sigmoid(x), and its backward; gate and up fp32, or bf16 as a bf16 step keeps them
 * (widened: the same arithmetic, so the same bits as on fp32 copies of the values).
 * Tested by tests/kernels/test_ops.c (float64 reference, finite differences; the bf16 forms bit for bit
 * against the fp32 ones).
 */
#include "ddk.h"
#include "ddk_bf16.h"
#include "cpu_backend.h"

#include <math.h>

static inline float sigmoid(float x)
{
    return 1.0f / (1.0f + expf(-x));
}

static inline float swiglu_at(float g, float u)
{
    return g * sigmoid(g) * u;
}

/* silu'(x) = sigmoid(x) (1 + x (1 - sigmoid(x))) */
static inline void swiglu_grad_at(float g, float u, float dh, float *dg, float *du)
{
    float s = sigmoid(g);
    *dg += dh * u * s * (1.0f + g * (1.0f - s));
    *du += dh * g * s;
}

void ddk_cpu_swiglu(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                    float *h)
{
    for (int64_t i = 0; i < count; i++)
        h[i] = swiglu_at(gate[i], up[i]);
}

void ddk_cpu_swiglu_backward(const ddk_backend *be, const float *gate, const float *up,
                             const float *dh, int64_t count, float *dgate, float *dup)
{
    for (int64_t i = 0; i < count; i++)
        swiglu_grad_at(gate[i], up[i], dh[i], &dgate[i], &dup[i]);
}

void ddk_cpu_swiglu_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                       int64_t count, float *h)
{
    for (int64_t i = 0; i < count; i++)
        h[i] = swiglu_at(ddk_bf16_to_f32(gate[i]), ddk_bf16_to_f32(up[i]));
}

void ddk_cpu_swiglu_backward_16(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                                const float *dh, int64_t count, float *dgate, float *dup)
{
    for (int64_t i = 0; i < count; i++)
        swiglu_grad_at(ddk_bf16_to_f32(gate[i]), ddk_bf16_to_f32(up[i]), dh[i], &dgate[i], &dup[i]);
}
