/* ddk_bf16.h: bfloat16 <-> float32, round to nearest even (the one rounding of the project:
 * the safetensors writer, the CPU backend's bf16 products). Header-only; tested by
 * tests/engine/model/test_safetensors.c (conversions, ties, NaN, overflow) and tests/kernels/test_ops.c (bf16 products).
 */
#ifndef DDK_BF16_H
#define DDK_BF16_H

#include <stdint.h>
#include <string.h>

/* a float's bit pattern and back, through memcpy (no type punning through pointers) */
static inline uint32_t ddk_f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static inline float ddk_f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static inline uint16_t ddk_f32_to_bf16(float x)
{
    uint32_t u = ddk_f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)   /* NaN: keep sign and top payload, force quiet */
        return (uint16_t)((u >> 16) | 0x0040u);
    /* round to nearest even on the 16 bits dropped; a carry into the exponent is correct, and
     * the largest finite floats round up to inf */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float ddk_bf16_to_f32(uint16_t x)
{
    return ddk_f32_from_bits((uint32_t)x << 16);
}

/* x rounded to the nearest bf16 value, as a float */
static inline float ddk_round_bf16(float x)
{
    return ddk_bf16_to_f32(ddk_f32_to_bf16(x));
}

#endif
