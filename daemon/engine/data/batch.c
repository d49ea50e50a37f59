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
#include <string.h>

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

/* partial Fisher-Yates: afterwards items[0..k) is a uniform draw without replacement of k of
 * the n items, in random order (k <= n) */
static void draw(int32_t *items, int64_t n, int64_t k, uint64_t *rng)
{
    for (int64_t i = 0; i < k; i++) {
        int64_t j = i + (int64_t)uniform_below(rng, (uint64_t)(n - i));
        int32_t chosen = items[j];
        items[j] = items[i];
        items[i] = chosen;
    }
}

/* chosen (kept) into anchors (A) and keep (A): sorted, the padding after it */
static int64_t place(int32_t *chosen, int64_t kept, int64_t A, int32_t *anchors, uint8_t *keep)
{
    if (kept > 0)
        qsort(chosen, (size_t)kept, sizeof(*chosen), position_compare);
    for (int64_t j = 0; j < kept; j++) {
        anchors[j] = chosen[j];
        keep[j] = 1;
    }
    int32_t padding = kept > 0 ? chosen[kept - 1] : 0;   /* rows stay sorted */
    for (int64_t j = kept; j < A; j++) {
        anchors[j] = padding;
        keep[j] = 0;
    }
    return kept;
}

/* p in [0, S-2] is an anchor candidate: m[p] = m[p+1] = 1 */
static int is_candidate(const uint8_t *loss_mask, int64_t S, int64_t p)
{
    return p + 1 < S && loss_mask[p] && loss_mask[p + 1];
}

int64_t ddt_anchor_candidates(const uint8_t *loss_mask, int64_t S, int32_t *candidates)
{
    int64_t n = 0;
    for (int64_t p = 0; p + 1 < S; p++)
        if (is_candidate(loss_mask, S, p))
            candidates[n++] = (int32_t)p;
    return n;
}

/* the candidates (n) into a malloc'd array (S - 1 entries) */
static int32_t *candidates_of(const uint8_t *loss_mask, int64_t S, int64_t *n)
{
    int32_t *c = malloc((size_t)(S > 1 ? S - 1 : 1) * sizeof(*c));
    if (!c)
        ddk_fatal(__FILE__, __LINE__, "out of memory for %lld anchor candidates", (long long)(S - 1));
    *n = ddt_anchor_candidates(loss_mask, S, c);
    return c;
}

int64_t ddt_sample_anchors(const uint8_t *loss_mask, int64_t S, int64_t A, uint64_t seed,
                           int32_t *anchors, uint8_t *keep)
{
    if (A <= 0)
        return 0;
    int64_t n;
    int32_t *candidates = candidates_of(loss_mask, S, &n);
    int64_t kept = n < A ? n : A;
    uint64_t rng = seed;
    draw(candidates, n, kept, &rng);
    kept = place(candidates, kept, A, anchors, keep);
    free(candidates);
    return kept;
}

int64_t ddt_walk_starts(const uint8_t *loss_mask, int64_t S, const int32_t *len, int32_t *starts)
{
    int64_t n = 0;
    for (int64_t p = 0; p + 1 < S;) {
        if (!is_candidate(loss_mask, S, p)) {
            p++;   /* not a candidate: the next one starts a walk of its own */
            continue;
        }
        starts[n++] = (int32_t)p;
        p += len[p] > 1 ? len[p] : 1;
    }
    return n;
}

int64_t ddt_walk_anchors(const uint8_t *loss_mask, int64_t S, const int32_t *len, int64_t A, uint64_t seed,
                         int32_t *anchors, uint8_t *keep)
{
    if (A <= 0)
        return 0;
    int64_t n;
    int32_t *candidates = candidates_of(loss_mask, S, &n);
    int32_t *starts = malloc((size_t)(S > 1 ? S - 1 : 1) * sizeof(*starts));   /* then the chosen */
    uint8_t *is_start = calloc((size_t)(S > 0 ? S : 1), 1);
    if (!starts || !is_start)
        ddk_fatal(__FILE__, __LINE__, "out of memory for the walk of %lld positions", (long long)S);
    int64_t w = ddt_walk_starts(loss_mask, S, len, starts), others = 0;
    for (int64_t i = 0; i < w; i++)
        is_start[starts[i]] = 1;
    for (int64_t i = 0; i < n; i++)   /* the candidates that are not starts */
        if (!is_start[candidates[i]])
            candidates[others++] = candidates[i];
    uint64_t rng = seed;
    const int64_t from_walk = w < A ? w : A, rest = A - from_walk < others ? A - from_walk : others;
    draw(starts, w, from_walk, &rng);
    draw(candidates, others, rest, &rng);
    memcpy(starts + from_walk, candidates, (size_t)rest * sizeof(*starts));   /* from_walk + rest <= n */
    int64_t kept = place(starts, from_walk + rest, A, anchors, keep);
    free(is_start);
    free(starts);
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
