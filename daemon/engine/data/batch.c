/* batch.c: the random parts of a training batch (SPEC.md section 2): anchor sampling from
 * ddk_rng (splitmix64) and the seeds of it and of the feature noise (which the backends' own
 * uniform_noise adds where the features are), per (run seed, step, sequence, purpose) by
 * ddt_batch_seed, so a batch is the same on every machine, device and resumed run.
 * Not here: reading sequences (source.c / store.c), the forward (drafter.c).
 * Tested by tests/engine/data/test_batch.c (validity, determinism, uniformity over subsets, seeds).
 *
 * Legend: S tokens in the sequence, A anchors per sequence, n candidates.
 */
#include "batch.h"
#include "ddk.h"
#include "ddk_rng.h"

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------------------------------
 * Anchors
 */

/* uniform in [0, bound), bound >= 1, without modulo bias: reject the lowest 2^64 mod bound
 * values so that every residue is hit equally often */
static uint64_t uniform_below(uint64_t *rng, uint64_t bound)
{
    uint64_t threshold = (0 - bound) % bound;   /* 2^64 mod bound */
    for (;;) {
        uint64_t r = ddk_rng_next(rng);
        if (r >= threshold)
            return r % bound;
    }
}

static int position_compare(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int64_t ddt_sample_anchors(const uint8_t *loss_mask, int64_t S, int64_t A, uint64_t seed,
                           int32_t *anchors, uint8_t *keep)
{
    if (A <= 0)
        return 0;
    int64_t n = 0;
    int32_t *candidates = NULL;   /* (n) positions p with m[p] = m[p+1] = 1, ascending */
    if (S >= 2) {
        candidates = malloc((size_t)(S - 1) * sizeof(*candidates));
        if (!candidates) {
            ddk_fatal(__FILE__, __LINE__, "out of memory for %lld anchor candidates", (long long)(S - 1));
        }
        for (int64_t p = 0; p + 1 < S; p++)
            if (loss_mask[p] && loss_mask[p + 1])
                candidates[n++] = (int32_t)p;
    }

    /* partial Fisher-Yates: after step i, candidates[0..i] is a uniform draw without
     * replacement of i + 1 of the n, in random order; sorting it gives the rows' order */
    int64_t kept = n < A ? n : A;
    uint64_t rng = seed;
    for (int64_t i = 0; i < kept; i++) {
        int64_t j = i + (int64_t)uniform_below(&rng, (uint64_t)(n - i));
        int32_t chosen = candidates[j];
        candidates[j] = candidates[i];
        candidates[i] = chosen;
    }
    if (kept > 0)
        qsort(candidates, (size_t)kept, sizeof(*candidates), position_compare);

    for (int64_t j = 0; j < kept; j++) {
        anchors[j] = candidates[j];
        keep[j] = 1;
    }
    int32_t padding = kept > 0 ? candidates[kept - 1] : 0;   /* rows stay sorted */
    for (int64_t j = kept; j < A; j++) {
        anchors[j] = padding;
        keep[j] = 0;
    }
    free(candidates);
    return kept;
}

/* ------------------------------------------------------------------------------------------
 * Seeds
 */

/* Each field is absorbed through a bijection (h -> mix(h ^ mix(field + constant)), mix being
 * splitmix64's finaliser ddk_rng_mix, full avalanche), so
 * two tuples that differ in one field always get different seeds; the distinct constants
 * keep a step from acting like the same number as a sequence or purpose. Streams of
 * splitmix64 from unrelated 64-bit seeds overlap within N draws with probability about
 * N * draws / 2^64: never, for any run we make. */
uint64_t ddt_batch_seed(uint64_t run_seed, int64_t step, int64_t sequence, uint32_t purpose)
{
    uint64_t h = ddk_rng_mix(run_seed ^ 0x6A09E667F3BCC908ull);
    h = ddk_rng_mix(h ^ ddk_rng_mix((uint64_t)step + 0xBB67AE8584CAA73Bull));
    h = ddk_rng_mix(h ^ ddk_rng_mix((uint64_t)sequence + 0x3C6EF372FE94F82Bull));
    h = ddk_rng_mix(h ^ ddk_rng_mix((uint64_t)purpose + 0xA54FF53A5F1D36F1ull));
    return h;
}

int64_t ddt_slice_first(int64_t n, int64_t parts, int64_t j)
{
    return j * (n / parts) + (j < n % parts ? j : n % parts);
}

int64_t ddt_slice_part(int64_t n, int64_t parts, int64_t i)
{
    const int64_t base = n / parts, extra = n % parts, big = extra * (base + 1);
    return i < big ? i / (base + 1) : extra + (i - big) / base;   /* i >= big: base >= 1 */
}
