/* test_batch.c: the random parts of a batch (daemon/engine/data/batch.c, SPEC.md section 2): anchors
 * are valid, sorted, distinct candidates, min(A, #candidates) of them, padded with keep = 0;
 * the same for a seed and different across seeds; uniform over the subsets of candidates
 * (chi-square); the uniform feature noise of the CPU backend (bounds, moments, determinism,
 * sigma = 0); the walk's starts and the anchors drawn from them (train.anchors walk); and the
 * seeds of ddt_batch_seed.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "data/batch.h"
#include "ddk.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Helpers
 */

enum { guard_slots = 8, guard_anchor = -12345, guard_keep = 0xee };

typedef struct {
    int32_t *anchors;   /* (A + guard_slots) */
    uint8_t *keep;      /* (A + guard_slots) */
} anchor_rows;

static anchor_rows rows_alloc(int64_t A)
{
    anchor_rows r = { xcalloc((size_t)A + guard_slots, sizeof(int32_t)), xcalloc((size_t)A + guard_slots, 1) };
    for (int64_t j = 0; j < A + guard_slots; j++) {
        r.anchors[j] = guard_anchor;
        r.keep[j] = guard_keep;
    }
    return r;
}

static void rows_free(anchor_rows *r)
{
    free(r->anchors);
    free(r->keep);
}

static int64_t count_candidates(const uint8_t *mask, int64_t S)
{
    int64_t n = 0;
    for (int64_t p = 0; p + 1 < S; p++)
        n += mask[p] && mask[p + 1];
    return n;
}

/* every property SPEC.md section 2 and batch.h promise, for one call; returns 1 when all hold */
static int check_rows(const uint8_t *mask, int64_t S, int64_t A, const anchor_rows *r, int64_t kept,
                      const char *what)
{
    int before = case_failed;
    int64_t n = count_candidates(mask, S), expect = n < A ? n : A;
    check(kept == expect, "%s: kept %lld, expected min(A=%lld, candidates=%lld)", what, (long long)kept,
          (long long)A, (long long)n);
    for (int64_t j = 0; j < kept && j < A; j++) {
        int32_t p = r->anchors[j];
        check(p >= 0 && p <= S - 2 && mask[p] && mask[p + 1], "%s: anchor %lld = %d is not a candidate", what,
              (long long)j, p);
        check(r->keep[j] == 1, "%s: keep[%lld] = %d for a kept anchor", what, (long long)j, r->keep[j]);
        if (j > 0)
            check(p > r->anchors[j - 1], "%s: anchors not strictly increasing at %lld (%d after %d)", what,
                  (long long)j, p, r->anchors[j - 1]);
    }
    int32_t padding = kept > 0 ? r->anchors[kept - 1] : 0;
    for (int64_t j = kept; j < A; j++)
        check(r->anchors[j] == padding && r->keep[j] == 0, "%s: slot %lld is (%d, keep %d), padding is (%d, 0)",
              what, (long long)j, r->anchors[j], r->keep[j], padding);
    for (int64_t j = A; j < A + guard_slots; j++)
        check(r->anchors[j] == guard_anchor && r->keep[j] == guard_keep, "%s: write past slot A at %lld", what,
              (long long)j);
    return case_failed == before;
}

/* upper chi-square quantile with k degrees of freedom at the normal deviate z (Wilson-Hilferty;
 * within ~1% of the exact quantile for k >= 10 at z <= 5) */
static double chi_square_bound(int k, double z)
{
    double a = 2.0 / (9.0 * k);
    double c = 1 - a + z * sqrt(a);
    return k * c * c * c;
}

/* ------------------------------------------------------------------------------------------
 * Anchors
 */

static void test_anchors_valid(void)
{
    uint64_t rng = 2024;
    static const int64_t lengths[] = { 0, 1, 2, 3, 5, 16, 17, 64, 257 };
    static const int64_t anchor_counts[] = { 1, 2, 3, 8, 40, 300 };
    static const double densities[] = { 0.0, 0.3, 0.7, 0.95, 1.0 };
    int all_ok = 1, calls = 0;
    for (size_t a = 0; a < sizeof lengths / sizeof lengths[0]; a++)
        for (size_t b = 0; b < sizeof anchor_counts / sizeof anchor_counts[0]; b++)
            for (size_t d = 0; d < sizeof densities / sizeof densities[0]; d++)
                for (int trial = 0; trial < 4 && all_ok; trial++) {
                    int64_t S = lengths[a], A = anchor_counts[b];
                    uint8_t *mask = xcalloc((size_t)S, 1);
                    for (int64_t p = 0; p < S; p++)
                        mask[p] = ddk_rng_uniform(&rng) < densities[d];
                    anchor_rows r = rows_alloc(A);
                    int64_t kept = ddt_sample_anchors(mask, S, A, ddk_rng_next(&rng), r.anchors, r.keep);
                    char what[96];
                    snprintf(what, sizeof what, "S=%lld A=%lld density=%.2f", (long long)S, (long long)A,
                             densities[d]);
                    all_ok &= check_rows(mask, S, A, &r, kept, what);
                    calls++;
                    rows_free(&r);
                    free(mask);
                }
    check(calls == 9 * 6 * 5 * 4, "stopped after the first failing call (%d calls)", calls);
}

static void test_anchors_none(void)
{
    uint8_t masked[12] = { 0 };
    uint8_t isolated[12] = { 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0 };   /* no two adjacent: no candidate */
    uint8_t last_only[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1 }; /* one candidate, p = S - 2 */
    anchor_rows r = rows_alloc(4);
    int64_t kept = ddt_sample_anchors(masked, 12, 4, 1, r.anchors, r.keep);
    check(kept == 0, "an all-masked sequence keeps nothing (kept %lld)", (long long)kept);
    check_rows(masked, 12, 4, &r, kept, "all masked");
    kept = ddt_sample_anchors(isolated, 12, 4, 1, r.anchors, r.keep);
    check(kept == 0, "isolated loss positions keep nothing (kept %lld)", (long long)kept);
    check_rows(isolated, 12, 4, &r, kept, "isolated");
    kept = ddt_sample_anchors(last_only, 12, 4, 1, r.anchors, r.keep);
    check(kept == 1 && r.anchors[0] == 10, "the only candidate is p = S - 2 = 10 (kept %lld, anchor %d)",
          (long long)kept, r.anchors[0]);
    check_rows(last_only, 12, 4, &r, kept, "last only");
    check(r.anchors[3] == 10 && r.keep[3] == 0, "padding repeats the last kept anchor");
    kept = ddt_sample_anchors(masked, 12, 0, 1, r.anchors, r.keep);
    check(kept == 0 && r.anchors[0] == 10, "A = 0 writes nothing");
    rows_free(&r);
}

static void test_anchors_deterministic(void)
{
    enum { S = 300, A = 10 };
    uint8_t mask[S];
    for (int p = 0; p < S; p++)
        mask[p] = p % 7 != 3;   /* 214 candidates */
    anchor_rows first = rows_alloc(A), again = rows_alloc(A);
    int same_seed_same = 1, distinct_seeds_differ = 1;
    for (uint64_t seed = 0; seed < 200; seed++) {
        ddt_sample_anchors(mask, S, A, seed, first.anchors, first.keep);
        ddt_sample_anchors(mask, S, A, seed, again.anchors, again.keep);
        same_seed_same &= memcmp(first.anchors, again.anchors, A * sizeof(int32_t)) == 0;
        /* C(214, 10) ~ 1e17 subsets: two seeds agreeing would be a broken generator */
        ddt_sample_anchors(mask, S, A, seed + 1, again.anchors, again.keep);
        distinct_seeds_differ &= memcmp(first.anchors, again.anchors, A * sizeof(int32_t)) != 0;
    }
    check(same_seed_same, "the same seed gives the same anchors");
    check(distinct_seeds_differ, "neighbouring seeds give different anchors");
    rows_free(&first);
    rows_free(&again);
}

/* Every 2-subset of 6 scattered candidates equally often: the draw is uniform without
 * replacement (a biased shuffle, e.g. Sattolo's j in [i+1, n), or "the first A" fails).
 * 15 subsets x 2000 expected: chi-square with 14 degrees of freedom; the bound is its upper
 * 1e-6 quantile (z = 4.75), so a correct sampler fails with probability 1e-6 over seeds, and
 * the seeds are fixed so the outcome never changes between runs. */
static void test_anchors_uniform_subsets(void)
{
    /* candidates p = 0, 3, 4, 7, 10, 11 */
    static const uint8_t mask[14] = { 1, 1, 0, 1, 1, 1, 0, 1, 1, 0, 1, 1, 1, 0 };
    static const int candidates[6] = { 0, 3, 4, 7, 10, 11 };
    enum { trials = 30000, subsets = 15 };
    int counts[6][6] = { { 0 } };
    int32_t anchors[2];
    uint8_t keep[2];
    for (int t = 0; t < trials; t++) {
        ddt_sample_anchors(mask, 14, 2, ddt_batch_seed(77, t, 3, 1), anchors, keep);
        int a = -1, b = -1;
        for (int k = 0; k < 6; k++) {
            a = candidates[k] == anchors[0] ? k : a;
            b = candidates[k] == anchors[1] ? k : b;
        }
        if (a < 0 || b <= a) {
            check(0, "trial %d: anchors (%d, %d) are not two sorted candidates", t, anchors[0], anchors[1]);
            return;
        }
        counts[a][b]++;
    }
    double expected = (double)trials / subsets, statistic = 0;
    int least = trials, most = 0;
    for (int a = 0; a < 6; a++)
        for (int b = a + 1; b < 6; b++) {
            statistic += (counts[a][b] - expected) * (counts[a][b] - expected) / expected;
            least = counts[a][b] < least ? counts[a][b] : least;
            most = counts[a][b] > most ? counts[a][b] : most;
        }
    double bound = chi_square_bound(subsets - 1, 4.75);
    check(statistic < bound, "subset counts %d..%d of %.0f expected: chi-square %.1f >= %.1f", least, most, expected,
          statistic, bound);
}

/* Each of 20 candidates is in the draw of 5 with probability 1/4. Over T draws the counts O_i
 * have mean E = T/4 and covariance T p (1-p) n/(n-1) (I - 11'/n) (sampling without replacement,
 * p = A/n), so (n-1)/n * sum (O_i - E)^2 / (T p (1-p)) is chi-square with n - 1 = 19 degrees of
 * freedom; bound at its upper 1e-6 quantile as above. Plain consecutive seeds here. */
static void test_anchors_uniform_marginals(void)
{
    enum { S = 80, A = 5, n = 20, trials = 20000 };
    uint8_t mask[S];
    for (int p = 0; p < S; p++)
        mask[p] = (p / 2) % 2 == 0;   /* 1 1 0 0 1 1 0 0 ...: candidates p = 0, 4, ..., 76 */
    check(count_candidates(mask, S) == n, "fixture: %lld candidates, meant %d", (long long)count_candidates(mask, S), n);
    int counts[S] = { 0 };
    int32_t anchors[A];
    uint8_t keep[A];
    for (uint64_t seed = 0; seed < trials; seed++) {
        ddt_sample_anchors(mask, S, A, seed, anchors, keep);
        for (int j = 0; j < A; j++)
            counts[anchors[j]]++;
    }
    double p = (double)A / n, expected = trials * p, statistic = 0;
    for (int k = 0; k < S; k++) {
        if (k % 4 == 0)
            statistic += (counts[k] - expected) * (counts[k] - expected);
        else
            check(counts[k] == 0, "position %d is not a candidate but was drawn %d times", k, counts[k]);
    }
    statistic *= (double)(n - 1) / n / (trials * p * (1 - p));
    double bound = chi_square_bound(n - 1, 4.75);
    check(statistic < bound, "chi-square of candidate counts %.1f >= %.1f", statistic, bound);
}

/* ------------------------------------------------------------------------------------------
 * Noise and seeds
 */

/* the trainer's noise: the backends' uniform_noise (the CPU's here; test_backend_ops holds the
 * GPU's to the same bits) */
/* ------------------------------------------------------------------------------------------
 * The walk (train.anchors walk / tree_walk)
 */

static void test_walk_starts(void)
{
    /* all candidates: 0 -> 0+2 -> 2+1 -> 3+4 -> 7+1 -> 8+3 = 11 (past S - 2 = 10: done) */
    enum { S = 12 };
    uint8_t all[S];
    memset(all, 1, sizeof all);
    const int32_t len[S] = { 2, 9, 1, 4, 9, 9, 9, 1, 3, 9, 9, 9 };
    int32_t starts[S];
    int64_t n = ddt_walk_starts(all, S, len, starts);
    const int32_t want[] = { 0, 2, 3, 7, 8 };
    check(n == 5, "%lld starts, expected 5", (long long)n);
    for (int64_t i = 0; i < n && i < 5; i++)
        check(starts[i] == want[i], "start %lld = %d, expected %d", (long long)i, starts[i], want[i]);
    /* a masked gap: the walk lands on 3 (not a candidate: m[4] = 0), moves on to 5, the next
     * span's first candidate; len < 1 counts as 1 */
    uint8_t gap[S] = { 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 1 };
    const int32_t len2[S] = { 3, 9, 9, 9, 9, 0, 5, 9, 9, 9, 9, 9 };
    n = ddt_walk_starts(gap, S, len2, starts);
    const int32_t want2[] = { 0, 5, 6 };   /* 0 -> 3 (no), 5 -> 6 (len 0 = 1) -> 11 */
    check(n == 3, "gap: %lld starts, expected 3", (long long)n);
    for (int64_t i = 0; i < n && i < 3; i++)
        check(starts[i] == want2[i], "gap: start %lld = %d, expected %d", (long long)i, starts[i], want2[i]);
    uint8_t none[S] = { 0 };
    check(ddt_walk_starts(none, S, len, starts) == 0, "a sequence without candidates has no walk");
}

static void test_walk_anchors(void)
{
    enum { S = 40, A = 6 };
    uint8_t mask[S];
    int32_t len[S], starts[S];
    for (int64_t p = 0; p < S; p++) {
        mask[p] = p % 13 != 12;
        len[p] = (int32_t)(1 + p % 4);
    }
    const int64_t w = ddt_walk_starts(mask, S, len, starts);
    check(w > A, "the fixture's walk has %lld starts, more than A = %d", (long long)w, A);
    uint8_t is_start[S] = { 0 };
    for (int64_t i = 0; i < w; i++)
        is_start[starts[i]] = 1;
    /* more starts than A: every anchor a start, each start about equally often over seeds */
    int64_t hits[S] = { 0 };
    const int trials = 4000;
    for (int t = 0; t < trials; t++) {
        anchor_rows r = rows_alloc(A);
        int64_t kept = ddt_walk_anchors(mask, S, len, A, 1000 + (uint64_t)t, r.anchors, r.keep);
        if (!check_rows(mask, S, A, &r, kept, "walk anchors")) {
            rows_free(&r);
            return;
        }
        for (int64_t j = 0; j < kept; j++) {
            check(is_start[r.anchors[j]], "anchor %d is not one of the walk's starts", r.anchors[j]);
            hits[r.anchors[j]]++;
        }
        rows_free(&r);
    }
    const double expect = (double)trials * A / (double)w;
    double chi = 0;
    for (int64_t i = 0; i < w; i++)
        chi += (hits[starts[i]] - expect) * (hits[starts[i]] - expect) / expect;
    check(chi < chi_square_bound((int)w - 1, 4.0), "starts drawn unevenly: chi-square %.1f over %lld starts", chi,
          (long long)w);
    /* fewer starts than A: all of them, the rest from the other candidates */
    enum { A2 = 30 };
    anchor_rows r = rows_alloc(A2);
    int64_t kept = ddt_walk_anchors(mask, S, len, A2, 7, r.anchors, r.keep);
    check_rows(mask, S, A2, &r, kept, "walk anchors, A above the starts");
    int64_t found = 0;
    for (int64_t j = 0; j < kept; j++)
        found += is_start[r.anchors[j]];
    check(found == w, "%lld of the walk's %lld starts among %lld anchors", (long long)found, (long long)w,
          (long long)kept);
    /* deterministic per seed */
    anchor_rows again = rows_alloc(A2);
    ddt_walk_anchors(mask, S, len, A2, 7, again.anchors, again.keep);
    check(memcmp(r.anchors, again.anchors, A2 * sizeof(int32_t)) == 0, "the same seed drew other anchors");
    rows_free(&r);
    rows_free(&again);
}

static void add_noise(float *x, int64_t count, float sigma, uint64_t seed)
{
    ddk_backend_cpu()->uniform_noise(ddk_backend_cpu(), x, count, sigma, seed);
}

static void test_noise(void)
{
    enum { count = 300000 };
    const float sigma = 0.5f;
    float *x = zero_floats(count);
    add_noise(x, count, sigma, 11);
    check(guard_intact(x, count), "a write past the end");
    double sum = 0, sum_squares = 0, lowest = 0, highest = 0;
    int inside = 1;
    for (int i = 0; i < count; i++) {
        inside &= x[i] >= -sigma && x[i] <= sigma;
        sum += x[i];
        sum_squares += (double)x[i] * x[i];
        lowest = fmin(lowest, x[i]);
        highest = fmax(highest, x[i]);
    }
    check(inside, "noise outside [-sigma, sigma]");
    /* the mean of U(-s, s) over N draws has sd s / sqrt(3N) = 5.3e-4: 6 sd */
    double mean = sum / count, mean_sd = sigma / sqrt(3.0 * count);
    check(fabs(mean) < 6 * mean_sd, "mean %g, more than 6 sd (%g) from 0", mean, mean_sd);
    /* E x^2 = s^2/3; its estimate has sd s^2 sqrt(4 / (45 N)) = 1.4e-4: 6 sd */
    double second = sum_squares / count, second_sd = sigma * sigma * sqrt(4.0 / (45.0 * count));
    check(fabs(second - sigma * sigma / 3) < 6 * second_sd, "mean square %g, expected %g", second, sigma * sigma / 3);
    /* N draws leave a gap of about 2s/N at each end */
    check(lowest < -0.999 * sigma && highest > 0.999 * sigma, "range [%g, %g] does not reach the bounds", lowest,
          highest);

    /* added to data: x' - x within sigma plus the rounding of x' (half an ulp of |x| <= 8) */
    float *y = zero_floats(count), *y0 = zero_floats(count);
    uint64_t rng = 5;
    for (int i = 0; i < count; i++)
        y0[i] = y[i] = (float)(8 * (2 * ddk_rng_uniform(&rng) - 1));
    add_noise(y, count, sigma, 12);
    double worst = 0;
    for (int i = 0; i < count; i++)
        worst = fmax(worst, fabs((double)y[i] - y0[i]));
    check(worst <= sigma + 0x1p-21, "|x' - x| up to %.9g > sigma", worst);
    check(worst > 0.99 * sigma, "|x' - x| only up to %g", worst);

    /* deterministic, seed-dependent */
    float *a = zero_floats(count), *b = zero_floats(count);
    add_noise(a, count, sigma, 11);
    check(memcmp(a, x, count * sizeof(float)) == 0, "the same seed gives the same noise");
    add_noise(b, count, sigma, 13);
    int equal = 0;
    for (int i = 0; i < count; i++)
        equal += a[i] == b[i];
    check(equal < 10, "seeds 11 and 13 agree on %d of %d values", equal, count);
    free(x), free(y), free(y0), free(a), free(b);
}

static void test_noise_sigma_zero(void)
{
    /* -0 + (+0) is +0, and sigma * (2u - 1) is +0 for about half the draws: bit-for-bit
     * identity on 64 negative zeros means nothing was added at all */
    float x[70] = { 1.5f, -2.0f, 0.0f, INFINITY, NAN, 1e-30f }, x0[70];
    for (int i = 6; i < 70; i++)
        x[i] = -0.0f;
    memcpy(x0, x, sizeof x);
    add_noise(x, 70, 0.0f, 99);
    check(memcmp(x, x0, sizeof x) == 0, "sigma = 0 leaves x bit for bit");
    float *g = sentinel_floats(0);
    add_noise(g, 0, 1.0f, 99);
    check(guard_intact(g, 0), "count = 0 writes nothing");
    free(g);
}

static void test_batch_seed(void)
{
    enum { runs = 3, steps = 16, sequences = 16, purposes = 4, total = runs * steps * sequences * purposes };
    uint64_t *seeds = xcalloc(total, sizeof(uint64_t));
    int k = 0;
    for (int r = 0; r < runs; r++)
        for (int s = 0; s < steps; s++)
            for (int q = 0; q < sequences; q++)
                for (uint32_t u = 0; u < purposes; u++)
                    seeds[k++] = ddt_batch_seed((uint64_t)r, s, q, u);
    int collisions = 0;
    for (int i = 0; i < total; i++)
        for (int j = i + 1; j < total; j++)
            collisions += seeds[i] == seeds[j];
    check(collisions == 0, "%d equal seeds among %d tuples", collisions, total);
    check(ddt_batch_seed(1, 2, 3, 4) == ddt_batch_seed(1, 2, 3, 4), "deterministic");
    check(ddt_batch_seed(0, 1, 2, 0) != ddt_batch_seed(0, 2, 1, 0), "step and sequence are not interchangeable");
    check(ddt_batch_seed(0, 0, 0, 0) != 0, "the all-zero tuple still gets a mixed seed");
    /* avalanche: flipping one input bit flips about half of the 64 output bits; the mean over
     * 4 x 64 flips has sd ~ 4 / sqrt(256) = 0.25 bits: [30, 34] is 8 sd wide */
    double flipped = 0;
    int flips = 0;
    for (int bit = 0; bit < 64; bit++) {
        uint64_t base = ddt_batch_seed(5, 100, 7, 2);
        flipped += __builtin_popcountll(base ^ ddt_batch_seed(5ull ^ (1ull << bit), 100, 7, 2));
        flipped += __builtin_popcountll(base ^ ddt_batch_seed(5, (int64_t)(100ull ^ (1ull << bit)), 7, 2));
        flipped += __builtin_popcountll(base ^ ddt_batch_seed(5, 100, (int64_t)(7ull ^ (1ull << bit)), 2));
        flipped += __builtin_popcountll(base ^ ddt_batch_seed(5, 100, 7, 2u ^ (1u << (bit % 32))));
        flips += 4;
    }
    check(flipped / flips > 30 && flipped / flips < 34, "one flipped input bit flips %.2f output bits on average",
          flipped / flips);
    free(seeds);
}

/* n items over parts <= n: contiguous, in order, sizes differing by one at most (the larger
 * first), every part non-empty, and ddt_slice_part the inverse */
static void test_slices(void)
{
    for (int64_t n = 1; n <= 40; n++)
        for (int64_t parts = 1; parts <= n; parts++) {
            check(ddt_slice_first(n, parts, 0) == 0 && ddt_slice_first(n, parts, parts) == n,
                  "n %lld over %lld: first %lld, end %lld", (long long)n, (long long)parts,
                  (long long)ddt_slice_first(n, parts, 0), (long long)ddt_slice_first(n, parts, parts));
            for (int64_t j = 0; j < parts; j++) {
                const int64_t a = ddt_slice_first(n, parts, j), b = ddt_slice_first(n, parts, j + 1);
                const int64_t want = n / parts + (j < n % parts);
                check(b - a == want, "n %lld over %lld: part %lld has %lld, want %lld", (long long)n,
                      (long long)parts, (long long)j, (long long)(b - a), (long long)want);
                for (int64_t i = a; i < b; i++)
                    check(ddt_slice_part(n, parts, i) == j, "n %lld over %lld: item %lld in part %lld, want %lld",
                          (long long)n, (long long)parts, (long long)i, (long long)ddt_slice_part(n, parts, i),
                          (long long)j);
            }
        }
}

int main(void)
{
    static const test_case cases[] = {
        { "anchors: valid, sorted, distinct, min(A, n), padded", test_anchors_valid },
        { "anchors: no candidates, one candidate, A = 0", test_anchors_none },
        { "anchors: deterministic per seed, differ across seeds", test_anchors_deterministic },
        { "anchors: uniform over subsets (chi-square)", test_anchors_uniform_subsets },
        { "anchors: uniform marginals (chi-square)", test_anchors_uniform_marginals },
        { "walk: starts by hand, a masked gap, no candidates", test_walk_starts },
        { "walk anchors: starts first, uniform over them, then the others", test_walk_anchors },
        { "noise: bounds, moments, deterministic", test_noise },
        { "noise: sigma = 0 and count = 0", test_noise_sigma_zero },
        { "batch seeds: distinct, avalanche", test_batch_seed },
        { "slices of a step over ranks: even, contiguous, inverted", test_slices },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
