/* errors.c: "PATH: what is wrong" errors (errors.h). */
#include "errors.h"

#include <stdarg.h>
#include <stdio.h>

int ddt_fail_path(char *err, size_t err_len, int rc, const char *path, const char *fmt, ...)
{
    if (err && err_len > 0) {
        int n = snprintf(err, err_len, "%s: ", path ? path : "(null)");
        if (n >= 0 && (size_t)n < err_len) {
            va_list args;
            va_start(args, fmt);
            vsnprintf(err + n, err_len - (size_t)n, fmt, args);
            va_end(args);
        }
    }
    return rc;
}
