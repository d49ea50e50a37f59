/* errors.h: the engine's one way to report a failure: err = "what is wrong" (ddt_fail) or
 * "PATH: what is wrong" (ddt_fail_path), printf-style, and the negative errno returned for the
 * caller to pass on. err may be NULL or err_len 0 (nothing written).
 * Tested through its users (tests/test_safetensors.c, test_store.c, test_store_read.c). */
#ifndef DDT_ERRORS_H
#define DDT_ERRORS_H

#include <stddef.h>

__attribute__((format(printf, 4, 5)))
int ddt_fail(char *err, size_t err_len, int rc, const char *fmt, ...);
__attribute__((format(printf, 5, 6)))
int ddt_fail_path(char *err, size_t err_len, int rc, const char *path, const char *fmt, ...);

/* fsync of a directory, so that the names created or renamed in it survive a crash:
 * 0 or -errno (a filesystem that cannot sync directories counts as success). */
int ddt_fsync_dir(const char *dir);

#endif
