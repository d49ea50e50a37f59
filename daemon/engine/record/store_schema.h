/* store_schema.h: the store's schema and migrations, record-internal (store.c opens the
 * database through these; store.h is the store's interface): the embedded schema/NNNN_*.sql
 * migrations, the checks, pragmas and migrations ddt_store_open runs, in this order, on a new
 * connection, and SQLite's result codes as negative errnos. Each function answers 0 or a
 * negative errno with err = "PATH: what to do" (ddt_fail_path).
 * store_schema.c depends on nothing of store.c.
 * Tested through store.h by tests/engine/record/test_store.c.
 */
#ifndef DDT_STORE_SCHEMA_H
#define DDT_STORE_SCHEMA_H

#include <sqlite3.h>

#include <stddef.h>

/* The migrations, in order (schema_sql.c, generated from schema/NNNN_*.sql at build time). */
extern const char *const ddt_schema_sql[];
extern const char *const ddt_schema_names[];
extern const int ddt_schema_count;

/* SQLite's (extended) result code as a negative errno: -EBUSY, -ENOSPC, -EINVAL ..., else -EIO */
int ddt_store_errno_of(int code);

/* the parent directory of path exists and is a directory */
int ddt_store_check_parent(const char *path, char *err, size_t err_len);
/* *version, the database's user_version, read before anything is written: refused when newer
 * than this binary or not ddtreed's */
int ddt_store_check_version(sqlite3 *db, const char *path, int *version, char *err, size_t err_len);
/* journal_mode=WAL, synchronous=NORMAL, foreign_keys=ON */
int ddt_store_set_pragmas(sqlite3 *db, const char *path, char *err, size_t err_len);
/* migrations version+1 .. newest, each with its user_version in one transaction */
int ddt_store_migrate(sqlite3 *db, const char *path, int version, char *err, size_t err_len);

#endif
