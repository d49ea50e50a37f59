/* ddk_rng.h: the one seeded random number generator of ddtree (splitmix64): the same numbers
 * on every machine and device, for initialisation, synthetic data, feature noise (ddk_rng_at, on
 * the GPU too), tests and benchmarks. Header-only.
 * Tested through its users (tests/engine/test_engine.c checks determinism of initialisation).
 */
#ifndef DDK_RNG_H
#define DDK_RNG_H

#include <math.h>
#include <stdint.h>

#if defined(__CUDACC__)
#define DDK_RNG_HD __host__ __device__
#else
#define DDK_RNG_HD
#endif

/* splitmix64's output function of a state */
static inline DDK_RNG_HD uint64_t ddk_rng_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* next 64 random bits; *state advances */
static inline uint64_t ddk_rng_next(uint64_t *state)
{
    return ddk_rng_mix(*state += 0x9E3779B97F4A7C15ull);
}

/* draw number i (0-based) of the stream seeded with seed, without the draws before it: what
 * i + 1 calls of ddk_rng_next from state seed return last (a GPU thread's draw for element i) */
static inline DDK_RNG_HD uint64_t ddk_rng_at(uint64_t seed, uint64_t i)
{
    return ddk_rng_mix(seed + (i + 1) * 0x9E3779B97F4A7C15ull);
}

/* uniform in [0, 1) with 53 random bits */
static inline double ddk_rng_uniform(uint64_t *state)
{
    return (double)(ddk_rng_next(state) >> 11) * 0x1.0p-53;
}

/* standard normal (Box-Muller) */
static inline double ddk_rng_normal(uint64_t *state)
{
    double u = ((double)(ddk_rng_next(state) >> 11) + 0.5) * 0x1.0p-53, v = ddk_rng_uniform(state);
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}

#endif
