/* test_topk.c: the CPU backend's topk_rows (ddk.h) against a naive sort.
 *
 * What it checks: rows of values drawn from a few levels (many ties), with NaNs, -inf and +inf,
 * of lengths below, at and off a multiple of the 8-lane filter's width, for k = 1, k = n,
 * k = DDK_SELECTOR_MAX_K and values between, val given and NULL (idx the same either way):
 * idx and val are the first k of the row sorted by value descending, ties to the lower index,
 * NaNs after every number (by index). Rows that are all NaN, all -inf, and descending or
 * ascending runs (the list's every insertion path). What it does not: the CUDA kernel
 * (tests/simt/test_simt_kernels.cpp, tests/kernels/test_backend_ops.c), the loss's online top-K
 * over tiles (tests/kernels/test_loss_selector.c).
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 */
#include "ddk.h"
#include "check.h"
#include "ddk_rng.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* a before b in the naive order: the larger number, the lower index on ties, NaNs last */
static int naive_before(const float *x, int32_t a, int32_t b)
{
    const int na = isnan(x[a]), nb = isnan(x[b]);
    if (na || nb)
        return na == nb ? a < b : nb;
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}

/* x (n) sorted into order (n) by insertion, the plainest way */
static void naive_sort(const float *x, int64_t n, int32_t *order)
{
    for (int64_t i = 0; i < n; i++) {
        int64_t j = i;
        for (; j > 0 && naive_before(x, (int32_t)i, order[j - 1]); j--)
            order[j] = order[j - 1];
        order[j] = (int32_t)i;
    }
}

static int same_float(float a, float b)
{
    return (isnan(a) && isnan(b)) || memcmp(&a, &b, sizeof a) == 0;
}

/* rows (rows, n) through topk_rows at k, against the naive sort */
static void check_rows(const char *what, const float *x, int64_t rows, int64_t n, int64_t k)
{
    const ddk_backend *be = ddk_backend_cpu();
    int32_t *idx = xcalloc((size_t)(rows * k), sizeof(int32_t));
    int32_t *idx2 = xcalloc((size_t)(rows * k), sizeof(int32_t));
    float *val = sentinel_floats(rows * k);
    int32_t *order = xcalloc((size_t)n, sizeof(int32_t));
    be->topk_rows(be, x, rows, n, k, idx, val);
    be->topk_rows(be, x, rows, n, k, idx2, NULL);
    check(guard_intact(val, rows * k), "%s: k %lld: write past the end of val", what, (long long)k);
    check(memcmp(idx, idx2, (size_t)(rows * k) * sizeof(int32_t)) == 0,
          "%s: k %lld: idx differs with val NULL", what, (long long)k);
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; r++) {
        naive_sort(x + r * n, n, order);
        for (int64_t j = 0; j < k; j++) {
            const int32_t got = idx[r * k + j];
            if (got != order[j] || !same_float(val[r * k + j], x[r * n + order[j]])) {
                if (wrong++ < 3)
                    check(0, "%s: k %lld row %lld place %lld: index %d value %g, want %d (%g)",
                          what, (long long)k, (long long)r, (long long)j, got, val[r * k + j],
                          order[j], x[r * n + order[j]]);
            }
        }
    }
    check(wrong == 0, "%s: k %lld: %lld places wrong", what, (long long)k, (long long)wrong);
    free(idx), free(idx2), free(val), free(order);
}

/* every k worth checking for rows of n */
static void check_ks(const char *what, const float *x, int64_t rows, int64_t n)
{
    const int64_t max_k = n < DDK_SELECTOR_MAX_K ? n : DDK_SELECTOR_MAX_K;
    const int64_t ks[] = { 1, 2, 3, 7, 8, 9, 16, max_k - 1, max_k };
    for (size_t j = 0; j < sizeof ks / sizeof ks[0]; j++)
        if (ks[j] >= 1 && ks[j] <= max_k)
            check_rows(what, x, rows, n, ks[j]);
}

static void test_random_rows(void)
{
    static const int64_t lengths[] = { 1, 2, 7, 8, 9, 16, 63, 64, 65, 100, 1001 };
    uint64_t s = 7;
    for (size_t l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
        const int64_t n = lengths[l], rows = 5;
        float *x = xcalloc((size_t)(rows * n), sizeof(float));
        for (int64_t j = 0; j < rows * n; j++) {
            const double u = ddk_rng_uniform(&s);
            /* few levels: ties everywhere; some NaN, -inf, +inf */
            x[j] = u < 0.05   ? NAN
                   : u < 0.1  ? -INFINITY
                   : u < 0.12 ? INFINITY
                              : (float)(ddk_rng_next(&s) % 13) * 0.25f - 1.5f;
        }
        char what[64];
        snprintf(what, sizeof what, "n %lld", (long long)n);
        check_ks(what, x, rows, n);
        free(x);
    }
}

static void test_special_rows(void)
{
    enum { n = 70 };
    float x[6 * n];
    for (int64_t j = 0; j < n; j++) {
        x[0 * n + j] = NAN;                              /* only NaNs: the first k by index */
        x[1 * n + j] = -INFINITY;                        /* only -inf: a value, by index */
        x[2 * n + j] = (float)(n - j);                   /* descending: every new one is smaller */
        x[3 * n + j] = (float)j;                         /* ascending: every new one is first */
        x[4 * n + j] = j % 10 == 3 ? 1.0f : NAN;         /* fewer numbers than k: NaNs after them */
        x[5 * n + j] = j < 60 ? -INFINITY : NAN;         /* -inf before NaN */
    }
    check_ks("special rows", x, 6, n);
}

int main(void)
{
    static const test_case cases[] = {
        { "topk_rows: random rows with ties, NaN, +-inf, every k", test_random_rows },
        { "topk_rows: NaN and -inf rows, runs, fewer numbers than k", test_special_rows },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
