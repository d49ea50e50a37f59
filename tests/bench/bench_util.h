/* bench_util.h: what the benchmarks share: a monotonic clock and the median of repeated
 * timings (a figure robust to one noisy run on a shared machine). Header-only. */
#ifndef DDTREE_BENCH_UTIL_H
#define DDTREE_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

static inline double bench_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int bench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* sorts v (k >= 1) and returns its median */
static inline double bench_median(double *v, int k)
{
    qsort(v, (size_t)k, sizeof *v, bench_cmp_double);
    return k % 2 ? v[k / 2] : 0.5 * (v[k / 2 - 1] + v[k / 2]);
}

#endif
