/* check.h: what the C tests share. xcalloc() never returns NULL; check() records a failed expectation of the current case
 * (case_failed) and prints why, indented under the case's line. Included once per test binary. */
#ifndef DDTREE_TESTS_CHECK_H
#define DDTREE_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

#include <stdlib.h>

static int case_failed;   /* set by check() within the current case */

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

#endif
