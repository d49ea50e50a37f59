/* errors.c: "what is wrong" and "PATH: what is wrong" errors and the directory fsync of atomic writes (errors.h). */
#include "errors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

int ddt_fail(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, err_len, fmt, args);
        va_end(args);
    }
    return rc;
}

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

int ddt_fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = 0;
    if (fsync(fd) != 0 && errno != EINVAL)   /* EINVAL: this filesystem cannot sync a directory */
        rc = -errno;
    close(fd);
    return rc;
}
