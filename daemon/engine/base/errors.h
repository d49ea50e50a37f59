/* errors.h: the engine's one way to report a failure: err = "what is wrong" (ddt_fail) or
 * "PATH: what is wrong" (ddt_fail_path), printf-style, and the negative errno returned for the
 * caller to pass on. err may be NULL or err_len 0 (nothing written).
 * Tested through its users (tests/engine/model/test_safetensors.c, test_store.c, test_store_read.c). */
#ifndef DDT_ERRORS_H
#define DDT_ERRORS_H

#include <stddef.h>

__attribute__((format(printf, 4, 5)))
int ddt_fail(char *err, size_t err_len, int rc, const char *fmt, ...);
__attribute__((format(printf, 5, 6)))
int ddt_fail_path(char *err, size_t err_len, int rc, const char *path, const char *fmt, ...);

/* n bytes of data to fd, through short writes and EINTR: 0 or -errno (-EIO for a write of 0). */
int ddt_write_all(int fd, const void *data, size_t n);
/* fsync, then close fd (closed whatever happens): NULL, or the step that failed ("fsync",
 * "close") with *rc = -errno. The tail of every file written to last. */
const char *ddt_sync_close(int fd, int *rc);

/* fsync of a directory, so that the names created or renamed in it survive a crash:
 * 0 or -errno (a filesystem that cannot sync directories counts as success). */
int ddt_fsync_dir(const char *dir);

/* Before a file of known size is written under dir (a checkpoint, an export): 0 when dir's file
 * system (its nearest existing parent's, when dir is not made yet) has room for need bytes
 * (statvfs: the blocks free to an unprivileged user), else -ENOSPC with err "DIR: WHAT needs
 * N KB, the file system has M KB free: free space there" (MB from 10 MB),
 * so that a run pauses before a half-written file rather than after. A failing statvfs is
 * not a refusal (the write then says what is wrong). */
int ddt_check_free_space(const char *dir, const char *what, unsigned long long need, char *err, size_t err_len);

#endif
