/* ddk_vmath.h: vectorisable float math for softmax-like loops (the CPU backend, generation).
 *
 * libm's expf is a call the compiler cannot vectorise; this one is branch-free arithmetic, so
 * `#pragma omp simd` loops over a vocabulary row run 8 or 16 lanes wide. Cephes' polynomial:
 * relative error below 2e-7 over the whole float range, exactly 0 below -87.3 (no denormals).
 * Tested through the loss against float64 references (tests/test_loss.c).
 */
#ifndef DDK_VMATH_H
#define DDK_VMATH_H

#include <stdint.h>
#include <string.h>

#pragma omp declare simd notinbranch
static inline float ddk_expf(float x)
{
    const float hi = 88.0f, lo = -87.3f;
    float xc = x > hi ? hi : (x < lo ? lo : x);
    /* x = k ln2 + r, |r| <= ln2/2; k by the round-to-nearest magic constant 1.5 * 2^23 */
    float kf = (xc * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = xc - kf * 0.693359375f + kf * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)kf + 127) << 23;   /* 2^k */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x < lo ? 0.0f : p * scale;
}

/* max of x[0..n), n >= 1 */
static inline float ddk_vmax(const float *x, int64_t n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* first i with x[i] == v (v taken from x), so ties go to the lowest index */
static inline int64_t ddk_first_index(const float *x, int64_t n, float v)
{
    for (int64_t i = 0; i < n; i++)
        if (x[i] == v)
            return i;
    return 0;
}

#endif
