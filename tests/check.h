/* check.h: what the C tests share. Included once per test binary.
 *
 * check() records a failed expectation of the current case (case_failed) and prints why,
 * indented under the case's line. case_done() ends a case: it prints "ok   NAME" or
 * "FAIL NAME", counts it and clears case_failed; run_case() runs a void(void) case and reports
 * it, run_cases() a table of them; cases_summary() prints the final "N passed, M failed" and
 * gives the exit status (1 when a case failed). normalised_error() is max |got - want| /
 * max |want| of a float result against a double reference (normalised_error_ff(): against a
 * float one). xcalloc() never returns NULL.
 * scratch_dir() makes a test's fixture directory (mkdtemp), remove_tree() removes it whole.
 * Guarded float buffers: sentinel_floats() / zero_floats() allocate count floats followed by
 * guard_words words of sentinel_byte, which guard_intact() checks after the code under test
 * has written.
 */
#ifndef DDTREE_TESTS_CHECK_H
#define DDTREE_TESTS_CHECK_H

#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int case_failed;                 /* set by check() within the current case */
static int cases_passed, cases_failed;  /* counted by case_done() */

__attribute__((format(printf, 2, 3))) static void check(int ok, const char *fmt, ...)
{
    if (ok)
        return;
    va_list args;
    va_start(args, fmt);
    printf("  # ");
    vprintf(fmt, args);
    printf("\n");
    va_end(args);
    case_failed = 1;
}

/* the end of a case: its line ("ok   NAME" or "FAIL NAME"), its count; case_failed cleared */
static inline void case_done(const char *name)
{
    printf("%s %s\n", case_failed ? "FAIL" : "ok  ", name);
    fflush(stdout);
    if (case_failed)
        cases_failed++;
    else
        cases_passed++;
    case_failed = 0;
}

/* one case: run() from a clear case_failed, then its line */
static inline void run_case(const char *name, void (*run)(void))
{
    case_failed = 0;
    run();
    case_done(name);
}

typedef struct {
    const char *name;
    void (*run)(void);
} test_case;

/* every case of a table, in order: run_cases(cases, sizeof cases / sizeof cases[0]) */
static inline void run_cases(const test_case *cases, size_t count)
{
    for (size_t j = 0; j < count; j++)
        run_case(cases[j].name, cases[j].run);
}

/* the last line, "N passed, M failed"; returns main()'s exit status (1 when a case failed) */
static inline int cases_summary(void)
{
    printf("%d passed, %d failed\n", cases_passed, cases_failed);
    return cases_failed ? 1 : 0;
}

/* max |got - want| / max |want|; 0 when both are all zero, INFINITY on NaN/Inf in got */
static inline double normalised_error(const float *got, const double *want, int64_t count)
{
    double err = 0.0, scale = 0.0;
    for (int64_t j = 0; j < count; j++) {
        if (!isfinite(got[j]))
            return INFINITY;
        err = fmax(err, fabs((double)got[j] - want[j]));
        scale = fmax(scale, fabs(want[j]));
    }
    return err == 0.0 ? 0.0 : err / scale;
}

/* the same of a float result against a float reference; INFINITY on NaN/Inf in either */
static inline double normalised_error_ff(const float *got, const float *want, int64_t count)
{
    double err = 0.0, scale = 0.0;
    for (int64_t j = 0; j < count; j++) {
        if (!isfinite(got[j]) || !isfinite(want[j]))
            return INFINITY;
        err = fmax(err, fabs((double)got[j] - (double)want[j]));
        scale = fmax(scale, fabs((double)want[j]));
    }
    return err == 0.0 ? 0.0 : err / scale;
}

/* calloc that ends the test (exit 2) when the machine has no memory for it */
static inline void *xcalloc(size_t count, size_t size)
{
    void *x = calloc(count ? count : 1, size);
    if (!x) {
        fprintf(stderr, "out of memory for %zu x %zu bytes\n", count, size);
        exit(2);
    }
    return x;
}

/* mkdtemp(path_template), e.g. "/tmp/ddtree_test_x.XXXXXX" (rewritten in place to the
 * directory's path); ends the test (exit 2) when it cannot be made */
static inline void scratch_dir(char *path_template)
{
    if (!mkdtemp(path_template)) {
        perror("mkdtemp");
        exit(2);
    }
}

static inline int remove_tree_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* dir and everything under it removed, depth first, links not followed */
static inline void remove_tree(const char *dir)
{
    nftw(dir, remove_tree_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* Guard words after an output buffer; any change to them is a write past its end */
enum { guard_words = 16, sentinel_byte = 0xa7 };   /* 0xa7a7a7a7: a finite, nonzero float */

/* count floats + guard words, all set to the sentinel (free() it) */
static inline float *sentinel_floats(int64_t count)
{
    float *x = (float *)xcalloc((size_t)(count + guard_words), sizeof(float));
    memset(x, sentinel_byte, (size_t)(count + guard_words) * sizeof(float));
    return x;
}

/* count floats of 0 + guard words of sentinel (free() it) */
static inline float *zero_floats(int64_t count)
{
    float *x = sentinel_floats(count);
    memset(x, 0, (size_t)count * sizeof(float));
    return x;
}

/* whether the count floats at x are all still the sentinel (nothing written there) */
static inline int all_sentinel(const float *x, int64_t count)
{
    const unsigned char *b = (const unsigned char *)x;
    for (size_t j = 0; j < (size_t)count * sizeof(float); j++)
        if (b[j] != sentinel_byte)
            return 0;
    return 1;
}

/* whether the guard words after x's count floats are intact */
static inline int guard_intact(const float *x, int64_t count)
{
    return all_sentinel(x + count, guard_words);
}

#endif
