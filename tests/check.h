/* check.h: what the C tests share. check() records a failed expectation of the current case
 * (case_failed) and prints why, indented under the case's line. Included once per test binary. */
#ifndef DDTREE_TESTS_CHECK_H
#define DDTREE_TESTS_CHECK_H

#include <stdarg.h>
#include <stdio.h>

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

#endif
