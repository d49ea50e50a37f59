/* store_read.c: read-only queries of the SQLite store (API.md, "SQLite"), see store_read.h.
 *
 * Every call opens a connection of its own (SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX: one
 * thread uses it, then it is closed), sets busy_timeout (5 s) and runs statements with bound
 * parameters only. In WAL a reader never waits for the writer; a call that runs two statements
 * (steps and their step_devices) runs them in one read transaction, so both see one snapshot.
 *
 * Values: a NULL column is JSON null, -1 in ddt_run_row, an empty CSV field, NaN for
 * tau_chain. A value is printed by its storage class: an INTEGER exactly (PRId64, in JSON too,
 * where cJSON's doubles would round above 2^53), a REAL so that it reads back as the same
 * double: %.17g in CSV, the shortest of %.15g..%.17g in JSON (cJSON's own printing loses the
 * last bit), where a non-finite value becomes null (CSV prints it as inf). An event's
 * detail_json is embedded as JSON, or as a JSON string when it does not parse (the writer never
 * refuses a malformed detail). Every string goes through cJSON, so it is escaped.
 * Windows: a limit outside [1, 10000] is clamped to it (not refused: the HTTP handler decides
 * what a bad ?limit= is); after / after_id are exclusive, so -1 (or any negative) starts at the
 * beginning. "Newest eval" is the one of the highest step.
 * Fixed-size ddt_run_row fields (id, name, state) are cut at a UTF-8 character boundary when
 * the stored text is longer.
 *
 * Errors: a negative errno with err as "PATH: what happened (what to do)": -ENOENT when there
 * is no database file, -EINVAL for a file that is not ddtreed's store, -EBUSY when it stayed
 * locked past the timeout, -ENOMEM, -EIO for the disk.
 *
 * Not here: writing (store.c), a cache of connections or statements (a request opens its own;
 * opening and a one-row query take ~0.2 ms, a 10,000-step answer ~50 ms as CSV and ~170 ms as
 * JSON on a 2-core VM), the runs' CSV.
 *
 * Tested by tests/engine/record/test_store_read.c.
 */
#include "base/errors.h"
#include "store_read.h"

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum {
    BUSY_TIMEOUT_MS = 5000,   /* as the writer's: a checkpoint or recovery may hold a lock */
    LIMIT_MAX = 10000,        /* rows per answer: a few MB of JSON at most */
};

/* ------------------------------------------------------------------------------------------
 * The steps table's columns, in API.md's order (run_id aside): the SELECT, the JSON keys and
 * the CSV header all come from here. A value is printed by its storage class (INTEGER exactly,
 * REAL as a double: SQLite hands back a REAL column's integral values as REAL), so the table
 * needs no types.
 */

static const char *const step_columns[] = {
    "step", "ts_ms", "loss", "ce", "kl", "cap", "acc", "lr", "grad_norm", "tokens", "positions",
    "step_ms", "tokens_per_s", "positions_per_s", "peak_bytes", "chunk", "vocab_tile", "sel", "sel_acc",
};
enum { STEP_COLUMNS = sizeof step_columns / sizeof step_columns[0] };

/* The sampled window (?3 max_points): of the steps after ?2, the first, every k-th step number
 * after it (k = ceil((last - first + 1) / ?3)) and the last: at most ?3 + 1 rows (fewer where
 * steps are missing), each found through the primary key; ~30 ms for 1,500 of 100,000 steps,
 * where a scan of the window (a ROW_NUMBER() over it) takes ten times as long */
#define SAMPLED_WINDOW \
    "WITH RECURSIVE r AS (SELECT first, last, (last - first + ?3) / ?3 AS k FROM" \
    " (SELECT (SELECT step FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step LIMIT 1) AS first," \
    " (SELECT step FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step DESC LIMIT 1) AS last))," \
    " pick(step) AS (SELECT first FROM r WHERE first IS NOT NULL" \
    " UNION ALL SELECT pick.step + r.k FROM pick, r WHERE pick.step + r.k < r.last) "
#define SAMPLED_WHERE " AND step IN (SELECT step FROM pick UNION SELECT last FROM r)"

/* "SELECT step, ts_ms, ... FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step LIMIT ?3",
 * or the sampled window */
static void steps_sql(char *out, size_t out_len, int sampled)
{
    size_t n = (size_t)snprintf(out, out_len, "%sSELECT ", sampled ? SAMPLED_WINDOW : "");
    for (int c = 0; c < STEP_COLUMNS && n < out_len; c++)
        n += (size_t)snprintf(out + n, out_len - n, "%s%s", c ? ", " : "", step_columns[c]);
    if (n < out_len)
        snprintf(out + n, out_len - n, "%s", sampled ?
                 " FROM steps WHERE run_id = ?1" SAMPLED_WHERE " ORDER BY step" :
                 " FROM steps WHERE run_id = ?1 AND step > ?2 ORDER BY step LIMIT ?3");
}

static const char *const step_devices_sql =
    "SELECT step, device, peak_bytes, step_ms FROM step_devices"
    " WHERE run_id = ?1 AND step > ?2 ORDER BY step, device";

/* ... of the sampled steps only */
static const char *const step_devices_sampled_sql =
    SAMPLED_WINDOW "SELECT step, device, peak_bytes, step_ms FROM step_devices"
    " WHERE run_id = ?1" SAMPLED_WHERE " ORDER BY step, device";

static const char *const runs_sql =
    "SELECT id, name, state, config_json, error, created_ms, started_ms, updated_ms,"
    " finished_ms, step, max_steps, last_checkpoint_step FROM runs ORDER BY created_ms, rowid";

static const char *const events_sql =
    "SELECT id, ts_ms, kind, detail_json FROM events WHERE run_id = ?1 AND id > ?2"
    " ORDER BY id LIMIT ?3";

static const char *const evals_sql =
    "SELECT * FROM evals WHERE run_id = ?1 AND step > ?2 ORDER BY step LIMIT 10000";

static const char *const last_eval_sql =
    "SELECT step, tau_chain, tau_tree_json, acc_json FROM evals WHERE run_id = ?1"
    " ORDER BY step DESC LIMIT 1";

/* ------------------------------------------------------------------------------------------
 * Connections and errors
 */


static int errno_of(int code)
{
    switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return -EBUSY;
    case SQLITE_NOMEM:
        return -ENOMEM;
    case SQLITE_PERM:
    case SQLITE_AUTH:
    case SQLITE_CANTOPEN:
    case SQLITE_READONLY:
        return -EACCES;
    case SQLITE_ERROR:     /* no such table / column: not ddtreed's schema */
    case SQLITE_NOTADB:
    case SQLITE_MISMATCH:
    case SQLITE_RANGE:
        return -EINVAL;
    default:
        return -EIO;
    }
}

/* what an operator can do about a failed query, by SQLite's code */
static const char *query_hint(int code)
{
    switch (code & 0xff) {
    case SQLITE_ERROR:
    case SQLITE_NOTADB:
        return "not a ddtreed store of this version: check the state directory";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return "the database stayed locked for 5 s: try again";
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_READONLY:
        return "a reader needs the -wal and -shm files or a writable state directory: run as "
               "ddtreed's user";
    case SQLITE_NOMEM:
        return "give the process more memory";
    default:
        return "check the disk (dmesg)";
    }
}

static int query_fail(sqlite3 *db, const char *path, const char *what, char *err, size_t err_len)
{
    int code = sqlite3_extended_errcode(db);
    return ddt_fail_path(err, err_len, errno_of(code), path, "cannot read %s: %s (%s)", what,
                         sqlite3_errmsg(db), query_hint(code));
}

/* a read-only connection of our own: 0, or a negative errno with err (-ENOENT: no file) */
static int reader_open(const char *path, sqlite3 **db, char *err, size_t err_len)
{
    *db = NULL;
    if (err && err_len > 0)
        err[0] = '\0';
    if (!path || !*path)
        return ddt_fail_path(err, err_len, -EINVAL, path, "no database path given");
    int sq = sqlite3_open_v2(path, db, SQLITE_OPEN_READONLY | SQLITE_OPEN_NOMUTEX, NULL);
    if (sq != SQLITE_OK) {
        int e = *db ? sqlite3_system_errno(*db) : 0;
        struct stat st;
        if (e == 0 && stat(path, &st) != 0)
            e = errno;
        int rc;
        if (e == ENOENT)
            rc = ddt_fail_path(err, err_len, -ENOENT, path, "no such database (ddtreed "
                               "creates it in its state directory when it first starts: check "
                               "the path)");
        else
            rc = ddt_fail_path(err, err_len, e ? -e : errno_of(sq), path, "cannot open it "
                               "read-only: %s (check the permissions of the file and its "
                               "directory)", *db ? sqlite3_errmsg(*db) : "no memory");
        sqlite3_close(*db);   /* NULL is a no-op */
        *db = NULL;
        return rc;
    }
    sqlite3_extended_result_codes(*db, 1);
    sqlite3_busy_timeout(*db, BUSY_TIMEOUT_MS);
    return 0;
}

static int prepare(sqlite3 *db, const char *path, const char *sql, const char *what,
                   sqlite3_stmt **st, char *err, size_t err_len)
{
    if (sqlite3_prepare_v2(db, sql, -1, st, NULL) != SQLITE_OK) {
        *st = NULL;
        return query_fail(db, path, what, err, err_len);
    }
    return 0;
}

/* Steps st onto its next row: 1 when there is one; 0 when there is none, with *rc 0, or when
 * the step failed, with *rc from query_fail (what: the rows, for the message). */
static int next_row(sqlite3 *db, sqlite3_stmt *st, const char *path, const char *what, int *rc,
                    char *err, size_t err_len)
{
    int sq = sqlite3_step(st);
    if (sq == SQLITE_ROW)
        return 1;
    *rc = sq == SQLITE_DONE ? 0 : query_fail(db, path, what, err, err_len);
    return 0;
}

/* The start of a read of one run's rows: the outputs cleared, the run id checked, a connection
 * opened (*db). 0, or a negative errno with err. */
static int run_reader_open(const char *path, const char *run_id, char **text, size_t *len, sqlite3 **db,
                           char *err, size_t err_len)
{
    *text = NULL;
    *len = 0;
    if (!run_id)
        return ddt_fail_path(err, err_len, -EINVAL, path, "no run id given");
    return reader_open(path, db, err, err_len);
}

/* ?1 the run id, ?2 the exclusive start of the window */
static void bind_run_after(sqlite3_stmt *st, const char *run_id, int64_t after)
{
    sqlite3_bind_text(st, 1, run_id, -1, SQLITE_STATIC);
    sqlite3_bind_int64(st, 2, after);
}

static int64_t clamp_limit(int64_t limit)
{
    return limit < 1 ? 1 : limit > LIMIT_MAX ? LIMIT_MAX : limit;
}

static int64_t optional_int(sqlite3_stmt *st, int column)
{
    return sqlite3_column_type(st, column) == SQLITE_NULL ? -1 : sqlite3_column_int64(st, column);
}

/* text into out[out_len], cut at a UTF-8 character boundary when too long */
static void copy_column(char *out, size_t out_len, sqlite3_stmt *st, int column)
{
    const char *text = (const char *)sqlite3_column_text(st, column);
    size_t n = text ? (size_t)sqlite3_column_bytes(st, column) : 0;
    if (n >= out_len) {
        n = out_len - 1;
        while (n > 0 && ((unsigned char)text[n] & 0xc0) == 0x80)   /* text[n]: the first cut */
            n--;
    }
    if (n)
        memcpy(out, text, n);
    out[n] = '\0';
}

/* a malloc'd copy of a text column; *missing set when it is NULL (then NULL is returned) */
static char *dup_column(sqlite3_stmt *st, int column, int *missing)
{
    const char *text = (const char *)sqlite3_column_text(st, column);
    *missing = text == NULL;
    return text ? strdup(text) : NULL;
}

/* ------------------------------------------------------------------------------------------
 * JSON values (cJSON: every string escaped)
 */

/* an integer printed exactly, whatever its size (cJSON's numbers are doubles) */
static cJSON *json_int(int64_t value)
{
    char text[24];
    snprintf(text, sizeof text, "%" PRId64, value);   /* 20 digits and a sign at most */
    return cJSON_CreateRaw(text);
}

/* a double as the shortest of %.15g..%.17g that reads back as the very same double (cJSON's
 * own printing accepts a 15-digit text within an epsilon: the last bit is lost); a
 * non-finite value, which JSON lacks, as null */
static cJSON *json_double(double value)
{
    if (!isfinite(value))
        return cJSON_CreateNull();
    char text[32];
    for (int digits = 15; digits <= 17; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, value);
        if (strtod(text, NULL) == value)
            break;
    }
    return cJSON_CreateRaw(text);
}

/* a column by its storage class: null, an exact integer, a double, or a string */
static cJSON *json_column(sqlite3_stmt *st, int column)
{
    switch (sqlite3_column_type(st, column)) {
    case SQLITE_NULL:
        return cJSON_CreateNull();
    case SQLITE_INTEGER:
        return json_int(sqlite3_column_int64(st, column));
    case SQLITE_FLOAT:
        return json_double(sqlite3_column_double(st, column));
    default: {   /* text (kind), or what the writer never stores in a number's column */
        const char *text = (const char *)sqlite3_column_text(st, column);
        return cJSON_CreateString(text ? text : "");
    }
    }
}

/* a new object at the end of array; NULL when there is no memory */
static cJSON *json_add_object(cJSON *array)
{
    cJSON *object = cJSON_CreateObject();
    if (!object || !cJSON_AddItemToArray(array, object)) {
        cJSON_Delete(object);
        return NULL;
    }
    return object;
}

/* item added to object under key; -ENOMEM (item freed) when either is missing */
static int json_add(cJSON *object, const char *key, cJSON *item)
{
    if (!item)
        return -ENOMEM;
    if (!object || !cJSON_AddItemToObject(object, key, item)) {
        cJSON_Delete(item);
        return -ENOMEM;
    }
    return 0;
}

/* the unformatted text of root, malloc'd (free()) */
static int json_finish(cJSON *root, char **text, size_t *len)
{
    *text = cJSON_PrintUnformatted(root);
    if (!*text)
        return -ENOMEM;
    *len = strlen(*text);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * A growing text (CSV)
 */

typedef struct text_buffer {
    char *bytes;
    size_t len, cap;
    int failed;   /* no memory: everything after is dropped */
} text_buffer;

__attribute__((format(printf, 2, 3)))
static void text_append(text_buffer *b, const char *fmt, ...)
{
    if (b->failed)
        return;
    va_list args;
    va_start(args, fmt);
    va_list again;
    va_copy(again, args);
    int n = vsnprintf(b->bytes ? b->bytes + b->len : NULL, b->bytes ? b->cap - b->len : 0, fmt,
                      args);
    va_end(args);
    if (n >= 0 && b->bytes && (size_t)n < b->cap - b->len) {
        b->len += (size_t)n;
        va_end(again);
        return;
    }
    size_t need = b->len + (size_t)(n < 0 ? 0 : n) + 1;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < need)
        cap *= 2;
    char *bytes = n < 0 ? NULL : realloc(b->bytes, cap);
    if (!bytes) {
        b->failed = 1;
        va_end(again);
        return;
    }
    b->bytes = bytes;
    b->cap = cap;
    vsnprintf(b->bytes + b->len, b->cap - b->len, fmt, again);
    va_end(again);
    b->len += (size_t)n;
}

/* The steps' text: handed over (*text, *len) when rc is 0 and b is whole; otherwise freed, and
 * rc returned (a b that ran out of memory: -ENOMEM, said). */
static int text_finish(text_buffer *b, int rc, const char *path, char **text, size_t *len, char *err,
                       size_t err_len)
{
    if (!rc && b->failed)
        rc = ddt_fail_path(err, err_len, -ENOMEM, path, "no memory for the steps");
    if (rc) {
        free(b->bytes);
        return rc;
    }
    *text = b->bytes;
    *len = b->len;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Runs
 */

void ddt_store_free_runs(ddt_run_row *rows, int count)
{
    for (int j = 0; rows && j < count; j++) {
        free(rows[j].config_json);
        free(rows[j].error);
    }
    free(rows);
}

/* one runs row into r (zeroed); 0 or -ENOMEM */
static int run_row(sqlite3_stmt *st, ddt_run_row *r)
{
    int missing;
    copy_column(r->id, sizeof r->id, st, 0);
    copy_column(r->name, sizeof r->name, st, 1);
    copy_column(r->state, sizeof r->state, st, 2);
    r->config_json = dup_column(st, 3, &missing);
    if (missing)   /* NOT NULL in the schema; JSON's word for nothing, should it happen */
        r->config_json = strdup("null");
    if (!r->config_json)
        return -ENOMEM;
    r->error = dup_column(st, 4, &missing);
    if (!missing && !r->error)
        return -ENOMEM;
    r->created_ms = optional_int(st, 5);
    r->started_ms = optional_int(st, 6);
    r->updated_ms = optional_int(st, 7);
    r->finished_ms = optional_int(st, 8);
    r->step = optional_int(st, 9);
    r->max_steps = optional_int(st, 10);
    r->last_checkpoint_step = optional_int(st, 11);
    return 0;
}

int ddt_store_read_runs(const char *db_path, ddt_run_row **rows, int *count, char *err,
                        size_t err_len)
{
    *rows = NULL;
    *count = 0;
    sqlite3 *db;
    int rc = reader_open(db_path, &db, err, err_len);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = prepare(db, db_path, runs_sql, "the runs", &st, err, err_len);
    ddt_run_row *list = NULL;
    int n = 0, cap = 0;
    while (!rc && next_row(db, st, db_path, "the runs", &rc, err, err_len)) {
        if (n == cap) {
            int grown = cap ? cap * 2 : 16;
            ddt_run_row *more = realloc(list, (size_t)grown * sizeof *list);
            if (!more) {
                rc = -ENOMEM;
                break;
            }
            list = more;
            cap = grown;
        }
        memset(&list[n], 0, sizeof list[n]);
        rc = run_row(st, &list[n]);
        n++;   /* counted even when it failed, so that its copies are freed */
    }
    if (rc == -ENOMEM)
        ddt_fail_path(err, err_len, rc, db_path, "no memory for the runs");
    sqlite3_finalize(st);
    sqlite3_close(db);   /* statements finalized: it cannot be busy */
    if (rc) {
        ddt_store_free_runs(list, n);
        return rc;
    }
    *rows = list;
    *count = n;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Steps
 */

/* one steps row as an object with an empty "devices" array (*devices) */
static cJSON *step_object(sqlite3_stmt *st, cJSON **devices)
{
    cJSON *object = cJSON_CreateObject();
    int rc = object ? 0 : -ENOMEM;
    for (int c = 0; c < STEP_COLUMNS && !rc; c++)
        rc = json_add(object, step_columns[c], json_column(st, c));
    if (!rc)
        rc = json_add(object, "devices", *devices = cJSON_CreateArray());
    if (rc) {
        cJSON_Delete(object);
        return NULL;
    }
    return object;
}

/* the device row at dev into devices: 0 or -ENOMEM */
static int device_object(sqlite3_stmt *dev, cJSON *devices)
{
    cJSON *device = json_add_object(devices);
    if (!device)
        return -ENOMEM;
    int rc;
    if ((rc = json_add(device, "device", json_column(dev, 1))) ||
        (rc = json_add(device, "peak_bytes", json_column(dev, 2))) ||
        (rc = json_add(device, "step_ms", json_column(dev, 3))))
        return rc;
    return 0;
}

/* The steps as {"steps": [...]}. Each step is built as a cJSON object, printed and freed
 * before the next, so memory is the text plus one step (a tree of 10,000 steps would be
 * ~260,000 nodes); dev walks step_devices alongside (both ascend by step, dev from the primary
 * key without a sort), stepped only as far as the steps go. */
static int steps_json(sqlite3 *db, sqlite3_stmt *st, sqlite3_stmt *dev, const char *path,
                      char **text, size_t *len, char *err, size_t err_len)
{
    text_buffer b = { 0 };
    text_append(&b, "{\"steps\":[");
    int rc = 0, dev_sq = sqlite3_step(dev);
    for (int64_t n = 0; !rc && !b.failed; n++) {
        if (dev_sq != SQLITE_ROW && dev_sq != SQLITE_DONE) {
            rc = query_fail(db, path, "the step_devices", err, err_len);
            break;
        }
        if (!next_row(db, st, path, "the steps", &rc, err, err_len))
            break;
        cJSON *devices = NULL, *object = step_object(st, &devices);
        if (!object) {
            rc = -ENOMEM;
            break;
        }
        int64_t step = sqlite3_column_int64(st, 0);
        /* rows of earlier steps have no step (none while foreign keys hold): skipped */
        while (!rc && dev_sq == SQLITE_ROW && sqlite3_column_int64(dev, 0) <= step) {
            if (sqlite3_column_int64(dev, 0) == step)
                rc = device_object(dev, devices);
            dev_sq = sqlite3_step(dev);
        }
        char *one = rc ? NULL : cJSON_PrintUnformatted(object);
        if (!rc && !one)
            rc = -ENOMEM;
        if (one)
            text_append(&b, "%s%s", n ? "," : "", one);
        cJSON_free(one);
        cJSON_Delete(object);
    }
    text_append(&b, "]}");
    if (rc == -ENOMEM)
        ddt_fail_path(err, err_len, rc, path, "no memory for the steps");
    return text_finish(&b, rc, path, text, len, err, err_len);
}

/* a column by its storage class: empty for NULL, an exact integer, or %.17g (what reads
 * back as the same double) */
static void csv_field(text_buffer *b, sqlite3_stmt *st, int column)
{
    switch (sqlite3_column_type(st, column)) {
    case SQLITE_NULL:
        break;
    case SQLITE_INTEGER:
        text_append(b, "%" PRId64, (int64_t)sqlite3_column_int64(st, column));
        break;
    default:
        text_append(b, "%.17g", sqlite3_column_double(st, column));
        break;
    }
}

/* the steps as a header line and one line per step */
static int steps_csv(sqlite3 *db, sqlite3_stmt *st, const char *path, char **text, size_t *len,
                     char *err, size_t err_len)
{
    text_buffer b = { 0 };
    for (int c = 0; c < STEP_COLUMNS; c++)
        text_append(&b, "%s%s", c ? "," : "", step_columns[c]);
    text_append(&b, "\n");
    int rc = 0;
    while (!rc && !b.failed && next_row(db, st, path, "the steps", &rc, err, err_len)) {
        for (int c = 0; c < STEP_COLUMNS; c++) {
            if (c)
                text_append(&b, ",");
            csv_field(&b, st, c);
        }
        text_append(&b, "\n");
    }
    return text_finish(&b, rc, path, text, len, err, err_len);
}

/* the steps as JSON or CSV, limit rows, or (sampled) about limit rows over the whole window */
static int read_steps(const char *db_path, const char *run_id, int64_t after, int64_t limit, int csv,
                      int sampled, char **text, size_t *len, char *err, size_t err_len)
{
    sqlite3 *db;
    int rc = run_reader_open(db_path, run_id, text, len, &db, err, err_len);
    if (rc)
        return rc;
    /* steps and step_devices from one snapshot: a resumed run may replace steps in between */
    if (sqlite3_exec(db, "BEGIN", NULL, NULL, NULL) != SQLITE_OK) {
        rc = query_fail(db, db_path, "the steps", err, err_len);
        sqlite3_close(db);
        return rc;
    }
    char sql[2048];
    steps_sql(sql, sizeof sql, sampled);
    sqlite3_stmt *st, *dev = NULL;
    rc = prepare(db, db_path, sql, "the steps", &st, err, err_len);
    if (!rc && !csv)
        rc = prepare(db, db_path, sampled ? step_devices_sampled_sql : step_devices_sql, "the step_devices", &dev,
                     err, err_len);
    if (!rc) {
        bind_run_after(st, run_id, after);
        sqlite3_bind_int64(st, 3, clamp_limit(limit));
        if (dev)
            bind_run_after(dev, run_id, after);
        if (dev && sampled)
            sqlite3_bind_int64(dev, 3, clamp_limit(limit));
        rc = csv ? steps_csv(db, st, db_path, text, len, err, err_len)
                 : steps_json(db, st, dev, db_path, text, len, err, err_len);
    }
    sqlite3_finalize(st);
    sqlite3_finalize(dev);
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);   /* a read: nothing to lose if it fails */
    sqlite3_close(db);
    return rc;
}

int ddt_store_read_steps(const char *db_path, const char *run_id, int64_t after, int64_t limit,
                         int csv, char **text, size_t *len, char *err, size_t err_len)
{
    return read_steps(db_path, run_id, after, limit, csv, 0, text, len, err, err_len);
}

int ddt_store_read_steps_sampled(const char *db_path, const char *run_id, int64_t after, int64_t max_points,
                                 char **text, size_t *len, char *err, size_t err_len)
{
    return read_steps(db_path, run_id, after, max_points, 0, 1, text, len, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Events
 */

/* detail_json as JSON; as a JSON string when it does not parse; null when NULL */
static cJSON *json_detail(sqlite3_stmt *st, int column)
{
    const char *detail = (const char *)sqlite3_column_text(st, column);
    if (!detail)
        return cJSON_CreateNull();
    size_t bytes = (size_t)sqlite3_column_bytes(st, column);
    /* NUL-terminated by SQLite: the length includes it, and nothing may follow the value */
    cJSON *parsed = cJSON_ParseWithLengthOpts(detail, bytes + 1, NULL, 1);
    return parsed ? parsed : cJSON_CreateString(detail);
}

int ddt_store_read_events(const char *db_path, const char *run_id, int64_t after_id,
                          int64_t limit, char **text, size_t *len, char *err, size_t err_len)
{
    sqlite3 *db;
    int rc = run_reader_open(db_path, run_id, text, len, &db, err, err_len);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = prepare(db, db_path, events_sql, "the events", &st, err, err_len);
    cJSON *root = NULL;
    if (!rc) {
        bind_run_after(st, run_id, after_id);
        sqlite3_bind_int64(st, 3, clamp_limit(limit));
        root = cJSON_CreateObject();
    }
    cJSON *events = root ? cJSON_AddArrayToObject(root, "events") : NULL;
    if (!rc && !events)
        rc = -ENOMEM;
    while (!rc && next_row(db, st, db_path, "the events", &rc, err, err_len)) {
        cJSON *event = json_add_object(events);
        if (!event) {
            rc = -ENOMEM;
            break;
        }
        if ((rc = json_add(event, "id", json_column(st, 0))) ||
            (rc = json_add(event, "ts_ms", json_column(st, 1))) ||
            (rc = json_add(event, "kind", json_column(st, 2))) ||
            (rc = json_add(event, "detail", json_detail(st, 3))))
            break;
    }
    if (!rc)
        rc = json_finish(root, text, len);
    if (rc == -ENOMEM)
        ddt_fail_path(err, err_len, rc, db_path, "no memory for the events");
    cJSON_Delete(root);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Evals
 */

int ddt_store_read_evals(const char *db_path, const char *run_id, int64_t after, char **text, size_t *len,
                         char *err, size_t err_len)
{
    sqlite3 *db;
    int rc = run_reader_open(db_path, run_id, text, len, &db, err, err_len);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = prepare(db, db_path, evals_sql, "the evals", &st, err, err_len);
    cJSON *root = NULL;
    if (!rc) {
        bind_run_after(st, run_id, after);
        root = cJSON_CreateObject();
    }
    cJSON *evals = root ? cJSON_AddArrayToObject(root, "evals") : NULL;
    if (!rc && !evals)
        rc = -ENOMEM;
    while (!rc && next_row(db, st, db_path, "the evals", &rc, err, err_len)) {
        cJSON *eval = json_add_object(evals);
        rc = eval ? 0 : -ENOMEM;
        for (int c = 0; !rc && c < sqlite3_column_count(st); c++) {
            const char *name = sqlite3_column_name(st, c);
            size_t n = strlen(name);
            if (!strcmp(name, "run_id"))
                continue;
            if (n > 5 && !strcmp(name + n - 5, "_json")) {
                char key[64];
                snprintf(key, sizeof key, "%.*s", (int)(n - 5), name);
                rc = json_add(eval, key, json_detail(st, c));
            } else {
                rc = json_add(eval, name, json_column(st, c));
            }
        }
    }
    if (!rc)
        rc = json_finish(root, text, len);
    if (rc == -ENOMEM)
        ddt_fail_path(err, err_len, rc, db_path, "no memory for the evals");
    cJSON_Delete(root);
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}

int ddt_store_read_last_eval(const char *db_path, const char *run_id, int64_t *step,
                             double *tau_chain, char **tau_tree_json, char **acc_json)
{
    /* every output optional; the texts NULL unless set, so that a caller may always free them */
    if (tau_tree_json)
        *tau_tree_json = NULL;
    if (acc_json)
        *acc_json = NULL;
    if (!run_id)
        return -EINVAL;
    char err[256];   /* this call's callers want the code only (start-up: no eval yet or not) */
    sqlite3 *db;
    int rc = reader_open(db_path, &db, err, sizeof err);
    if (rc)
        return rc;
    sqlite3_stmt *st;
    rc = prepare(db, db_path, last_eval_sql, "the evals", &st, err, sizeof err);
    if (!rc) {
        sqlite3_bind_text(st, 1, run_id, -1, SQLITE_STATIC);
        int sq = sqlite3_step(st);
        if (sq == SQLITE_DONE) {
            rc = -ENOENT;
        } else if (sq != SQLITE_ROW) {
            rc = query_fail(db, db_path, "the evals", err, sizeof err);
        } else {
            int tree_missing = 1, acc_missing = 1;
            char *tree = tau_tree_json ? dup_column(st, 2, &tree_missing) : NULL;
            char *acc = acc_json ? dup_column(st, 3, &acc_missing) : NULL;
            if ((!tree_missing && !tree) || (!acc_missing && !acc)) {
                free(tree);
                free(acc);
                rc = -ENOMEM;
            } else {
                if (step)
                    *step = sqlite3_column_int64(st, 0);
                if (tau_chain)
                    *tau_chain = sqlite3_column_type(st, 1) == SQLITE_NULL
                                     ? NAN : sqlite3_column_double(st, 1);
                if (tau_tree_json)
                    *tau_tree_json = tree;
                if (acc_json)
                    *acc_json = acc;
            }
        }
    }
    sqlite3_finalize(st);
    sqlite3_close(db);
    return rc;
}
