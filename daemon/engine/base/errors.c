/* errors.c: "what is wrong" and "PATH: what is wrong" errors, and the writes, fsyncs and
 * directory fsync of files written to last, and the free space checked before them (errors.h). */
#include "errors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
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

int ddt_write_all(int fd, const void *data, size_t n)
{
    const unsigned char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        if (w == 0)
            return -EIO;
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

const char *ddt_sync_close(int fd, int *rc)
{
    const char *failed = NULL;
    if (fsync(fd) != 0) {
        *rc = -errno;
        failed = "fsync";
    }
    if (close(fd) != 0 && !failed) {
        *rc = -errno;
        failed = "close";
    }
    return failed;
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

/* bytes as "N.N MB", or "N.N KB" below 10 MB (a tiny run's sizes would all read 0.1 MB) */
static void size_text(unsigned long long bytes, char *out, size_t len)
{
    if (bytes >= 10000000ull)
        snprintf(out, len, "%.1f MB", bytes / 1e6);
    else
        snprintf(out, len, "%.1f KB", bytes / 1e3);
}

int ddt_check_free_space(const char *dir, const char *what, unsigned long long need, char *err, size_t err_len)
{
    char at[4096];
    snprintf(at, sizeof at, "%s", dir);
    struct statvfs fs;
    int rc;
    while ((rc = statvfs(at, &fs)) != 0 && errno == ENOENT && strrchr(at, '/') && strrchr(at, '/') != at)
        *strrchr(at, '/') = '\0';   /* not made yet: the file system it will be made on */
    if (rc != 0)
        return 0;
    unsigned long long free_bytes = (unsigned long long)fs.f_bavail * fs.f_frsize;
    if (free_bytes >= need)
        return 0;
    char needed[32], left[32];
    size_text(need, needed, sizeof needed);
    size_text(free_bytes, left, sizeof left);
    return ddt_fail_path(err, err_len, -ENOSPC, at, "%s needs %s, the file system has %s free: free space there", what,
                         needed, left);
}
