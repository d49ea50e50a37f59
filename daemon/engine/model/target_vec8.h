/* target_vec8.h: the 8-wide vector loops of an fp32 CPU target's decode step, header only (static
 * inline, so each loop keeps them inlined): what target_layers.c's matrix-vector product and
 * target_dense_cache.c's cached attention share; internal to model/. Tested through them: tests/engine/data/test_source.c (the
 * dense cache's fast path against prefills) and tests/engine/model/test_qwen35.c (the qwen3_5 cache's).
 */
#ifndef DDT_TARGET_VEC8_H
#define DDT_TARGET_VEC8_H

#include <stdint.h>

/* The decode's small loops use 8-wide vectors (GCC / Clang vector extension; plain SSE or
 * NEON code where AVX is absent): without -ffast-math the compiler would not vectorise a float
 * sum, and its own attempt at these loops spilled registers (half the speed). */
typedef float ddt_v8 __attribute__((vector_size(32)));
typedef float ddt_v8_unaligned __attribute__((vector_size(32), aligned(4)));
#define DDT_LOAD8(p) (*(const ddt_v8_unaligned *)(p))   /* 8 floats from any float address */

/* by pointer: a 32-byte vector by value is an ABI warning where AVX is not enabled */
static inline float ddt_sum8(const ddt_v8 *v)
{
    return (((*v)[0] + (*v)[4]) + ((*v)[1] + (*v)[5])) + (((*v)[2] + (*v)[6]) + ((*v)[3] + (*v)[7]));
}

/* sum_j a[j] b[j] */
static inline float ddt_dot(const float *a, const float *b, int64_t n)
{
    ddt_v8 acc = { 0 };
    int64_t j = 0;
    for (; j + 8 <= n; j += 8)
        acc += DDT_LOAD8(a + j) * DDT_LOAD8(b + j);
    float tail = 0.0f;
    for (; j < n; j++)
        tail += a[j] * b[j];
    return tail + ddt_sum8(&acc);
}

#endif
