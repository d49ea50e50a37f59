/* bench_util.h: what the benchmarks share: a monotonic clock, the median of repeated timings
 * (a figure robust to one noisy run on a shared machine) and the parsing of their options
 * ("--name value" numbers and bare flags, from one table). Header-only. */
#ifndef DDTREE_BENCH_UTIL_H
#define DDTREE_BENCH_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

typedef enum bench_kind {
    BENCH_I64,    /* int64_t *: --name N */
    BENCH_INT,    /* int *: --name N */
    BENCH_F32,    /* float *: --name X */
    BENCH_SET,    /* int *: --name alone sets it to 1 */
    BENCH_CLEAR,  /* int *: --name alone sets it to 0 */
} bench_kind;

typedef struct bench_opt {
    const char *name;   /* "--n" */
    bench_kind kind;
    void *value;
} bench_opt;

/* argv into the table's values (non-negative numbers): 0, or -1 after a message naming the
 * option and what is wrong (prog names the benchmark). */
static inline int bench_parse(const char *prog, int argc, char **argv, const bench_opt *opts, int count)
{
    for (int i = 1; i < argc; i++) {
        const bench_opt *o = NULL;
        for (int k = 0; k < count && !o; k++)
            if (!strcmp(argv[i], opts[k].name))
                o = &opts[k];
        if (!o) {
            fprintf(stderr, "%s: unknown option %s (see the comment at the top of %s.c)\n", prog, argv[i], prog);
            return -1;
        }
        if (o->kind == BENCH_SET || o->kind == BENCH_CLEAR) {
            *(int *)o->value = o->kind == BENCH_SET;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "%s: %s needs a value\n", prog, argv[i]);
            return -1;
        }
        char *end;
        double v = strtod(argv[++i], &end);
        if (*end || !(v >= 0)) {
            fprintf(stderr, "%s: %s wants a non-negative number, got '%s'\n", prog, o->name, argv[i]);
            return -1;
        }
        if (o->kind == BENCH_I64)
            *(int64_t *)o->value = (int64_t)v;
        else if (o->kind == BENCH_INT)
            *(int *)o->value = (int)v;
        else
            *(float *)o->value = (float)v;
    }
    return 0;
}

#endif
