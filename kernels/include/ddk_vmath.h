/* ddk_vmath.h: vectorisable float math for softmax-like loops (the CPU backend, generation).
 *
 * libm's expf is a call the compiler cannot vectorise; ddk_expf is branch-free arithmetic
 * (Cephes' polynomial: relative error below 2e-7 over the whole float range, exactly 0 below
 * -87.3, so no denormals), which `#pragma omp simd` loops vectorise where the target has
 * masked arithmetic (AVX-512). On AVX2 GCC does not: under the default -ftrapping-math it
 * turns the clamps into branches and will not speculate the polynomial across them. ddk_expf8
 * is the same function on 8 lanes of GCC's vector extension (clang has it too), where the
 * clamps are lane masks, so hot loops (the loss) run 8 lanes wide on any x86-64 (two SSE halves
 * without AVX); its lanes equal ddk_expf's bit for bit. Tested through the loss against float64
 * references (tests/kernels/test_loss.c, which also checks ddk_expf8 against ddk_expf).
 */
#ifndef DDK_VMATH_H
#define DDK_VMATH_H

#include <math.h>
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

/* ------------------------------------------------------------------------------------------
 * 8 lanes: ddk_f8 (floats), ddk_i8 (their masks: -1 true, 0 false)
 */

typedef float ddk_f8 __attribute__((vector_size(32)));
typedef int32_t ddk_i8 __attribute__((vector_size(32)));

static inline ddk_f8 ddk_f8_load(const float *x)   /* x[0..8), any alignment */
{
    ddk_f8 v;
    memcpy(&v, x, sizeof v);
    return v;
}

static inline void ddk_f8_store(float *x, ddk_f8 v)
{
    memcpy(x, &v, sizeof v);
}

static inline ddk_f8 ddk_f8_splat(float x)
{
    return (ddk_f8){ x, x, x, x, x, x, x, x };
}

/* lanes of a where m, else b */
static inline ddk_f8 ddk_f8_select(ddk_i8 m, ddk_f8 a, ddk_f8 b)
{
    return (ddk_f8)(((ddk_i8)a & m) | ((ddk_i8)b & ~m));
}

static inline float ddk_f8_sum(ddk_f8 v)
{
    return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

/* ddk_expf on each lane, the same operations in the same order */
static inline ddk_f8 ddk_expf8(ddk_f8 x)
{
    const ddk_f8 hi = ddk_f8_splat(88.0f), lo = ddk_f8_splat(-87.3f);
    const ddk_f8 magic = ddk_f8_splat(12582912.0f);
    ddk_i8 below = x < lo;
    ddk_f8 xc = ddk_f8_select(x > hi, hi, ddk_f8_select(below, lo, x));
    ddk_f8 kf = (xc * 1.44269504088896341f + magic) - magic;
    ddk_f8 r = xc - kf * 0.693359375f + kf * 2.12194440e-4f;
    ddk_f8 p = ddk_f8_splat(1.9875691500e-4f);
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    ddk_i8 bits = (__builtin_convertvector(kf, ddk_i8) + 127) << 23;   /* 2^k */
    return (ddk_f8)((ddk_i8)(p * (ddk_f8)bits) & ~below);
}

/* ------------------------------------------------------------------------------------------ */

/* max of x[0..n), n >= 1 */
static inline float ddk_vmax(const float *x, int64_t n)
{
    float m = x[0];
#pragma omp simd reduction(max : m)
    for (int64_t i = 0; i < n; i++)
        m = x[i] > m ? x[i] : m;
    return m;
}

/* the first i of the largest x[i] (ties go to the lowest index), its value in *max;
 * 1 <= n < 2^31. One pass, 8 lanes: each lane keeps its own maximum and where it first saw it.
 * NaNs are passed over (a row of NaNs and -infs gives -inf at 0). */
static inline int64_t ddk_vargmax(const float *x, int64_t n, float *max)
{
    ddk_i8 index = { 0, 1, 2, 3, 4, 5, 6, 7 };              /* of x[i .. i+8) */
    ddk_f8 m = ddk_f8_splat(-INFINITY);
    ddk_i8 at = index - index;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8, index += 8) {
        ddk_f8 v = ddk_f8_load(x + i);
        ddk_i8 up = v > m;                                   /* strictly: earlier lanes keep ties */
        m = ddk_f8_select(up, v, m);
        at = (at & ~up) | (index & up);
    }
    float best = m[0];
    int64_t best_at = at[0];
    for (int l = 1; l < 8; l++)
        if (m[l] > best || (m[l] == best && at[l] < best_at))
            best = m[l], best_at = at[l];
    for (; i < n; i++)                                       /* the last n % 8 */
        if (x[i] > best)
            best = x[i], best_at = i;
    *max = best;
    return best_at;
}

#endif
