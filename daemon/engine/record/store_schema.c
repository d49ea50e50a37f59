/* store_schema.c: the store's database brought to this binary's schema (see store_schema.h):
 * the checks before anything is written, the pragmas, the migrations of schema/; and SQLite's
 * result codes as negative errnos, for the writer (store_writer.c) too.
 *
 * Opening (store.c's ddt_store_open calls these in this order, after the connection's
 * busy_timeout): the parent directory must exist; user_version is read before anything is
 * written, so that a database of a newer ddtreed is refused untouched; then journal_mode=WAL,
 * synchronous=NORMAL, foreign_keys=ON, and the migrations of schema/ (embedded by
 * cmake/embed_schema.cmake) from user_version + 1 to the newest, each in its own transaction
 * together with its PRAGMA user_version.
 *
 * Not here: the connection, its statements and the writer thread (store.c, store_writer.c),
 * reading (store_read.c), a migration down to an older schema (a newer database is refused).
 *
 * Tested by tests/engine/record/test_store.c (a fresh database, reopening, a newer one refused untouched, a
 * missing directory, a database ddtreed did not create, the migration from version 1).
 */
#include "base/errors.h"
#include "store_schema.h"

#include <sqlite3.h>

#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

int ddt_store_errno_of(int code)
{
    switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_FULL:
        return -ENOSPC;
    case SQLITE_NOMEM:
        return -ENOMEM;
    case SQLITE_READONLY:
        return -EROFS;
    case SQLITE_PERM:
    case SQLITE_AUTH:
        return -EACCES;
    case SQLITE_CONSTRAINT:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
    case SQLITE_TOOBIG:
        return -EINVAL;
    default:
        return -EIO;
    }
}

/* ------------------------------------------------------------------------------------------
 * Opening: checks, pragmas, migrations
 */

/* the parent directory of path exists and is a directory */
int ddt_store_check_parent(const char *path, char *err, size_t err_len)
{
    char dir[PATH_MAX];
    size_t len = strlen(path);
    if (len == 0 || len >= sizeof dir)
        return ddt_fail_path(err, err_len, len ? -ENAMETOOLONG : -EINVAL, path,
                         "not a usable database path: give the state directory's ddtree.db");
    memcpy(dir, path, len + 1);
    char *slash = strrchr(dir, '/');
    if (!slash)
        strcpy(dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        if (e == ENOENT)
            return ddt_fail_path(err, err_len, -ENOENT, path, "the directory %s does not exist: create "
                             "it (mkdir -p %s) or choose another state directory", dir, dir);
        return ddt_fail_path(err, err_len, -e, path, "cannot reach the directory %s: %s", dir,
                         strerror(e));
    }
    if (!S_ISDIR(st.st_mode))
        return ddt_fail_path(err, err_len, -ENOTDIR, path, "%s is not a directory: choose another "
                         "state directory", dir);
    return 0;
}

/* The first column of the first row of sql, as an integer (value, when not NULL) and as text
 * (out, when not NULL; "" unless there is a row): SQLITE_OK, SQLITE_NOTFOUND when there is no
 * row, or an SQLite code. */
static int query_first(sqlite3 *db, const char *sql, int64_t *value, char *out, size_t out_len)
{
    sqlite3_stmt *st;
    if (out)
        out[0] = '\0';
    int rc = sqlite3_prepare_v2(db, sql, -1, &st, NULL);
    if (rc != SQLITE_OK)
        return rc;
    rc = sqlite3_step(st);
    if (rc == SQLITE_ROW) {
        if (value)
            *value = sqlite3_column_int64(st, 0);
        if (out) {
            const unsigned char *text = sqlite3_column_text(st, 0);
            snprintf(out, out_len, "%s", text ? (const char *)text : "");
        }
        rc = SQLITE_OK;
    } else if (rc == SQLITE_DONE) {
        rc = SQLITE_NOTFOUND;
    }
    sqlite3_finalize(st);
    return rc;
}

/* the first column of the first row of sql as an integer (*value), or an SQLite code */
static int query_int(sqlite3 *db, const char *sql, int64_t *value)
{
    return query_first(db, sql, value, NULL, 0);
}

/* the text of the first row of a pragma (lower case as SQLite gives it), or "" */
static int query_text(sqlite3 *db, const char *sql, char *out, size_t out_len)
{
    int rc = query_first(db, sql, NULL, out, out_len);
    return rc == SQLITE_NOTFOUND ? SQLITE_OK : rc;
}

static int exec(sqlite3 *db, const char *sql)
{
    return sqlite3_exec(db, sql, NULL, NULL, NULL);
}

/* the database's version, refused when newer than this binary or not ddtreed's */
int ddt_store_check_version(sqlite3 *db, const char *path, int *version, char *err, size_t err_len)
{
    int64_t v = 0, tables = 0;
    int rc = query_int(db, "PRAGMA user_version", &v);
    if (rc == SQLITE_NOTADB)
        return ddt_fail_path(err, err_len, -EINVAL, path, "not a SQLite database: move it away or "
                         "choose another state directory");
    if (rc != SQLITE_OK)
        return ddt_fail_path(err, err_len, ddt_store_errno_of(rc), path, "cannot read it: %s (check its "
                         "permissions and the disk)", sqlite3_errmsg(db));
    if (v > ddt_schema_count)
        return ddt_fail_path(err, err_len, -EPROTONOSUPPORT, path, "schema version %lld was written "
                         "by a newer ddtreed (this one knows up to version %d): upgrade ddtreed; "
                         "the database was not changed", (long long)v, ddt_schema_count);
    if (v < 0)
        return ddt_fail_path(err, err_len, -EINVAL, path, "user_version %lld is not a ddtreed schema "
                         "version: move it away or choose another state directory", (long long)v);
    if (v == 0) {
        rc = query_int(db, "SELECT count(*) FROM sqlite_master", &tables);
        if (rc != SQLITE_OK)
            return ddt_fail_path(err, err_len, ddt_store_errno_of(rc), path, "cannot read it: %s (check its "
                             "permissions and the disk)", sqlite3_errmsg(db));
        if (tables > 0)
            return ddt_fail_path(err, err_len, -EINVAL, path, "a SQLite database that ddtreed did not "
                             "create (tables but no user_version): move it away or choose "
                             "another state directory");
    }
    *version = (int)v;
    return 0;
}

int ddt_store_set_pragmas(sqlite3 *db, const char *path, char *err, size_t err_len)
{
    char mode[32];
    int rc = query_text(db, "PRAGMA journal_mode = WAL", mode, sizeof mode);
    if (rc != SQLITE_OK || strcmp(mode, "wal") != 0)
        return ddt_fail_path(err, err_len, rc != SQLITE_OK ? ddt_store_errno_of(rc) : -ENOTSUP, path,
                         "cannot switch to WAL (%s): put the state directory on a local file "
                         "system that supports shared memory maps",
                         rc != SQLITE_OK ? sqlite3_errmsg(db) : mode);
    int64_t fk = 0;
    if ((rc = exec(db, "PRAGMA synchronous = NORMAL")) != SQLITE_OK ||
        (rc = exec(db, "PRAGMA foreign_keys = ON")) != SQLITE_OK ||
        (rc = query_int(db, "PRAGMA foreign_keys", &fk)) != SQLITE_OK || fk != 1)
        return ddt_fail_path(err, err_len, rc != SQLITE_OK ? ddt_store_errno_of(rc) : -ENOTSUP, path,
                         "cannot set synchronous=NORMAL and foreign_keys=ON: %s (this libsqlite3 "
                         "lacks foreign keys: install Debian's libsqlite3-0)",
                         rc != SQLITE_OK ? sqlite3_errmsg(db) : "foreign_keys stays off");
    return 0;
}

/* migrations version+1 .. newest, each with its user_version in one transaction */
int ddt_store_migrate(sqlite3 *db, const char *path, int version, char *err, size_t err_len)
{
    for (int v = version + 1; v <= ddt_schema_count; v++) {
        char set_version[64];
        snprintf(set_version, sizeof set_version, "PRAGMA user_version = %d", v);
        int rc = exec(db, "BEGIN IMMEDIATE");
        if (rc != SQLITE_OK)
            return ddt_fail_path(err, err_len, ddt_store_errno_of(rc), path, "cannot begin migration %s: %s "
                             "(another process holds the write lock? only ddtreed writes it)",
                             ddt_schema_names[v - 1], sqlite3_errmsg(db));
        if ((rc = exec(db, ddt_schema_sql[v - 1])) != SQLITE_OK ||
            (rc = exec(db, set_version)) != SQLITE_OK || (rc = exec(db, "COMMIT")) != SQLITE_OK) {
            int e = ddt_fail_path(err, err_len, ddt_store_errno_of(rc), path, "migration schema/%s failed: %s; "
                              "the database stays at schema version %d (report this with the "
                              "message)", ddt_schema_names[v - 1], sqlite3_errmsg(db), v - 1);
            if (!sqlite3_get_autocommit(db))
                exec(db, "ROLLBACK");
            return e;
        }
    }
    return 0;
}
