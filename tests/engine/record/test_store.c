/* test_store.c: the SQLite store of daemon/engine/record/store.c (API.md, "SQLite").
 *
 * A fresh database gets the newest user_version, WAL, and every table and column of API.md;
 * reopening changes nothing; a database of a newer ddtreed is refused byte for byte untouched;
 * a missing parent directory is an error that says so; a version-1 database (before the
 * speculative and unary columns) is migrated keeping its rows, and the teacher-forced and
 * speculative columns of one evals row are written without touching each other. Writes: 10,000 step records from 4
 * threads (more than the queue holds, so producers block) are all there after a flush, with
 * their step_devices rows; events, evals and checkpoints read back as written; run create
 * (duplicate: -EEXIST), update (optional fields left alone) and a checkpoint's update (the
 * state left alone; the transitions are tests/engine/run/test_run_state.c's); a step written twice (a resumed
 * run) replaces the first; a record the database refuses is logged as one "<3>" line, makes
 * the next flush -EIO (and only that one), and costs no other record of its batch; a separate
 * read-only connection sees commits while it holds an older snapshot (WAL); close writes what
 * is queued. Leaks are the ASan build's business (ctest label "sanitize").
 *
 * Fixtures live in a mkdtemp directory under /tmp, removed at the end.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "record/store.h"

#include <sqlite3.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[] = "/tmp/ddtree_test_store.XXXXXX";

/* ------------------------------------------------------------------------------------------
 * Helpers
 */

/* a fresh database path in tmp_dir */
static void db_path(char *out, size_t len, const char *name)
{
    snprintf(out, len, "%s/%s", tmp_dir, name);
}

static ddt_store *open_store(const char *path)
{
    char err[512] = "";
    ddt_store *s = NULL;
    int rc = ddt_store_open(path, &s, err, sizeof err);
    check(rc == 0 && s, "ddt_store_open(%s) = %d: %s", path, rc, err);
    return rc == 0 ? s : NULL;
}

/* a read-only connection of our own, as the HTTP handlers and tools will have */
static sqlite3 *open_reader(const char *path)
{
    sqlite3 *db = NULL;
    if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
        check(0, "reader cannot open %s: %s", path, db ? sqlite3_errmsg(db) : "?");
        sqlite3_close(db);
        return NULL;
    }
    sqlite3_busy_timeout(db, 5000);
    return db;
}

/* sql prepared and stepped once: the statement (sqlite3_finalize() it), *row set when it is on
 * a row; NULL, a failed check, when sql does not prepare */
static sqlite3_stmt *first_row(sqlite3 *db, const char *sql, int *row)
{
    sqlite3_stmt *st;
    *row = 0;
    if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) {
        check(0, "query \"%s\": %s", sql, sqlite3_errmsg(db));
        return NULL;
    }
    *row = sqlite3_step(st) == SQLITE_ROW;
    return st;
}

/* the first column of the first row as an integer; -999 when the query fails or is empty */
static int64_t query_int(sqlite3 *db, const char *sql)
{
    int row;
    sqlite3_stmt *st = first_row(db, sql, &row);
    int64_t v = row ? sqlite3_column_int64(st, 0) : -999;
    sqlite3_finalize(st);
    return v;
}

/* the first column of the first row as text into out ("" when NULL or none) */
static void query_text(sqlite3 *db, const char *sql, char *out, size_t len)
{
    int row;
    sqlite3_stmt *st = first_row(db, sql, &row);
    out[0] = '\0';
    if (row && sqlite3_column_text(st, 0))
        snprintf(out, len, "%s", (const char *)sqlite3_column_text(st, 0));
    sqlite3_finalize(st);
}

static int64_t count_in(const char *path, const char *sql)
{
    sqlite3 *db = open_reader(path);
    if (!db)
        return -999;
    int64_t v = query_int(db, sql);
    sqlite3_close(db);
    return v;
}

/* a whole file into a malloc'd buffer (*len bytes); NULL if it cannot be read */
static unsigned char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *bytes = xcalloc((size_t)n + 1, 1);
    *len = fread(bytes, 1, (size_t)n, f);
    fclose(f);
    return bytes;
}

static int file_exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* whether the database at path has a -wal file beside it */
static int wal_exists(const char *path)
{
    char wal[300];
    snprintf(wal, sizeof wal, "%s-wal", path);
    return file_exists(wal);
}

static ddt_step_record make_step(const char *run_id, int64_t step, int devices)
{
    ddt_step_record r;
    memset(&r, 0, sizeof r);
    snprintf(r.run_id, sizeof r.run_id, "%s", run_id);
    r.step = step;
    r.ts_ms = 1700000000000 + step;
    r.loss = 1.0 + (double)step / 1024.0;   /* exact in binary: round trips bit for bit */
    r.ce = 0.5;
    r.kl = 0.25;
    r.cap = 0.0;
    r.acc = 0.125;
    r.lr = 6e-4;
    r.grad_norm = 0.75;
    r.tokens = 4096;
    r.positions = 24576;
    r.step_ms = 12.5;
    r.tokens_per_s = 327680.0;
    r.positions_per_s = 1966080.0;
    r.chunk = 4096;
    r.vocab_tile = 0;
    r.devices = devices;
    for (int d = 0; d < devices; d++) {
        r.device_peak_bytes[d] = (int64_t)(d + 1) << 30;
        r.device_step_ms[d] = 12.0 + d;
        if (r.device_peak_bytes[d] > r.peak_bytes)
            r.peak_bytes = r.device_peak_bytes[d];
    }
    return r;
}

static int create_run(ddt_store *s, const char *run_id)
{
    int rc = ddt_store_run_create(s, run_id, "test", "{\"train\": {\"steps\": 100}}", 100, 1000);
    check(rc == 0, "run_create(%s) = %d", run_id, rc);
    return rc;
}

/* the store of a fresh database `name` in tmp_dir (its path into path), with the run run_id
 * created when not NULL; NULL, a failed check, when it does not open */
static ddt_store *open_fresh(char *path, size_t len, const char *name, const char *run_id)
{
    db_path(path, len, name);
    ddt_store *s = open_store(path);
    if (s && run_id)
        create_run(s, run_id);
    return s;
}

/* steps [from, to) of run_id, each on `devices` devices */
static void write_steps(ddt_store *s, const char *run_id, int64_t from, int64_t to, int devices)
{
    for (int64_t step = from; step < to; step++) {
        ddt_step_record r = make_step(run_id, step, devices);
        ddt_store_step(s, &r);
    }
}

/* ------------------------------------------------------------------------------------------
 * Opening, schema, migrations
 */

typedef struct {
    const char *table;
    const char *columns[24];   /* NULL-terminated, in API.md's order */
} table_spec;

static const table_spec api_tables[] = {
    { "runs", { "id", "name", "state", "config_json", "created_ms", "started_ms", "updated_ms",
                "finished_ms", "step", "max_steps", "last_checkpoint_step", "error", NULL } },
    { "steps", { "run_id", "step", "ts_ms", "loss", "ce", "kl", "cap", "acc", "lr", "grad_norm",
                 "tokens", "positions", "step_ms", "tokens_per_s", "positions_per_s", "peak_bytes",
                 "chunk", "vocab_tile", "sel", "sel_acc", NULL } },
    { "step_devices", { "run_id", "step", "device", "peak_bytes", "step_ms", NULL } },
    { "evals", { "run_id", "step", "tau_chain", "tau_tree_json", "acc_json", "tau_spec", "tau_spec_tree_json",
                 "spec_json", "unary_json", NULL } },
    { "events", { "id", "run_id", "ts_ms", "kind", "detail_json", NULL } },
    { "checkpoints", { "run_id", "step", "path", "bytes", "ts_ms", NULL } },
};

static void test_fresh_schema(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "fresh.db", NULL);
    if (!s)
        return;
    check(ddt_store_schema_version() >= 1, "schema version %d", ddt_store_schema_version());
    sqlite3 *db = open_reader(path);
    if (db) {
        check(query_int(db, "PRAGMA user_version") == ddt_store_schema_version(),
              "user_version %lld, newest %d", (long long)query_int(db, "PRAGMA user_version"),
              ddt_store_schema_version());
        for (size_t t = 0; t < sizeof api_tables / sizeof api_tables[0]; t++) {
            const table_spec *spec = &api_tables[t];
            char sql[128];
            snprintf(sql, sizeof sql, "PRAGMA table_info(%s)", spec->table);
            sqlite3_stmt *st;
            int prepared = sqlite3_prepare_v2(db, sql, -1, &st, NULL) == SQLITE_OK;
            check(prepared, "%s: %s", sql, sqlite3_errmsg(db));
            if (!prepared)
                continue;
            int j = 0, pk_run_id = 0, pk_step = 0;
            while (sqlite3_step(st) == SQLITE_ROW) {
                const char *name = (const char *)sqlite3_column_text(st, 1);
                int pk = sqlite3_column_int(st, 5);
                check(spec->columns[j] && strcmp(name, spec->columns[j]) == 0,
                      "%s column %d is %s, API.md says %s", spec->table, j, name,
                      spec->columns[j] ? spec->columns[j] : "(none)");
                if (strcmp(name, "run_id") == 0)
                    pk_run_id = pk;
                if (strcmp(name, "step") == 0)
                    pk_step = pk;
                if (spec->columns[j])
                    j++;
            }
            sqlite3_finalize(st);
            check(!spec->columns[j], "%s lacks column %s", spec->table,
                  spec->columns[j] ? spec->columns[j] : "");
            if (strcmp(spec->table, "steps") == 0)
                check(pk_run_id == 1 && pk_step == 2, "steps' primary key is not (run_id, step)");
            if (strcmp(spec->table, "runs") == 0)
                check(query_int(db, "SELECT pk FROM pragma_table_info('runs') WHERE name = 'id'") == 1,
                      "runs.id is not the primary key");
        }
        /* events(run_id, id): GET /runs/{id}/events without a scan */
        check(query_int(db, "SELECT count(*) FROM pragma_index_list('events') l, "
                            "pragma_index_info(l.name) i1, pragma_index_info(l.name) i2 "
                            "WHERE i1.seqno = 0 AND i1.name = 'run_id' AND i2.seqno = 1 "
                            "AND i2.name = 'id'") == 1,
              "no index on events(run_id, id)");
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

static void test_wal_mode(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "fresh.db", NULL);
    if (!s)
        return;
    sqlite3 *db = open_reader(path);
    if (db) {
        char mode[32];
        query_text(db, "PRAGMA journal_mode", mode, sizeof mode);
        check(strcmp(mode, "wal") == 0, "journal_mode is %s", mode);
        sqlite3_close(db);
    }
    /* WAL is a property of the file: header bytes 18 and 19 are 2 */
    size_t len = 0;
    unsigned char *bytes = read_file(path, &len);
    check(bytes && len >= 100 && bytes[18] == 2 && bytes[19] == 2, "the file header is not WAL");
    free(bytes);
    ddt_store_close(s);
}

static void test_reopen_idempotent(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "reopen.db", "r1");
    if (!s)
        return;
    ddt_store_close(s);

    char schema_before[8192], schema_after[8192];
    sqlite3 *db = open_reader(path);
    if (!db)
        return;
    query_text(db, "SELECT group_concat(sql, ';') FROM (SELECT sql FROM sqlite_master ORDER BY name)",
               schema_before, sizeof schema_before);
    sqlite3_close(db);

    for (int again = 0; again < 2; again++) {
        s = open_store(path);
        if (!s)
            return;
        check(ddt_store_run_create(s, "r1", "x", "{}", 1, 1) == -EEXIST,
              "the run of the first open is gone after reopening");
        ddt_store_close(s);
    }
    db = open_reader(path);
    if (!db)
        return;
    query_text(db, "SELECT group_concat(sql, ';') FROM (SELECT sql FROM sqlite_master ORDER BY name)",
               schema_after, sizeof schema_after);
    check(strcmp(schema_before, schema_after) == 0, "reopening changed the schema");
    check(query_int(db, "PRAGMA user_version") == ddt_store_schema_version(), "user_version changed");
    check(query_int(db, "SELECT count(*) FROM runs") == 1, "runs rows changed");
    sqlite3_close(db);
}

static void test_future_version_refused(void)
{
    char path[256];
    db_path(path, sizeof path, "future.db");
    sqlite3 *db = NULL;
    if (sqlite3_open(path, &db) != SQLITE_OK) {
        check(0, "cannot create %s", path);
        sqlite3_close(db);
        return;
    }
    char sql[128];
    snprintf(sql, sizeof sql, "CREATE TABLE runs (id TEXT PRIMARY KEY, future_column); "
                              "PRAGMA user_version = %d", ddt_store_schema_version() + 1);
    check(sqlite3_exec(db, sql, NULL, NULL, NULL) == SQLITE_OK, "fixture: %s", sqlite3_errmsg(db));
    sqlite3_close(db);

    size_t len_before = 0, len_after = 0;
    unsigned char *before = read_file(path, &len_before);
    char err[512] = "";
    ddt_store *s = (ddt_store *)&err;   /* must come back NULL */
    int rc = ddt_store_open(path, &s, err, sizeof err);
    check(rc < 0 && s == NULL, "a newer database was opened (rc %d)", rc);
    check(strstr(err, "upgrade ddtreed") != NULL, "the error does not say to upgrade: %s", err);
    check(strstr(err, path) != NULL, "the error does not name the file: %s", err);
    unsigned char *after = read_file(path, &len_after);
    check(before && after && len_before == len_after && memcmp(before, after, len_before) == 0,
          "the refused database was modified (%zu -> %zu bytes)", len_before, len_after);
    check(!wal_exists(path), "a WAL file was left beside the refused database");
    free(before);
    free(after);
    if (rc == 0 && s)
        ddt_store_close(s);
}

static void test_missing_directory(void)
{
    char path[256], err[512] = "";
    snprintf(path, sizeof path, "%s/no_such_dir/ddtree.db", tmp_dir);
    ddt_store *s = NULL;
    int rc = ddt_store_open(path, &s, err, sizeof err);
    check(rc == -ENOENT && s == NULL, "open under a missing directory: rc %d", rc);
    check(strstr(err, "does not exist") != NULL && strstr(err, "no_such_dir") != NULL,
          "the error does not name the missing directory: %s", err);
    if (s)
        ddt_store_close(s);
}

static void test_foreign_database_refused(void)
{
    char path[256], err[512] = "";
    db_path(path, sizeof path, "foreign.db");
    sqlite3 *db = NULL;
    sqlite3_open(path, &db);
    sqlite3_exec(db, "CREATE TABLE notes (text)", NULL, NULL, NULL);
    sqlite3_close(db);
    ddt_store *s = NULL;
    int rc = ddt_store_open(path, &s, err, sizeof err);
    check(rc < 0 && s == NULL, "a database with other tables and no user_version was opened");
    check(strstr(err, "did not create") != NULL, "the error does not say why: %s", err);
    if (s)
        ddt_store_close(s);
}

/* ------------------------------------------------------------------------------------------
 * Writes
 */

enum { PRODUCERS = 4, STEPS_EACH = 2500, DEVICES = 2 };

typedef struct {
    ddt_store *s;
    int producer;
} producer_arg;

static void *produce_steps(void *arg)
{
    const producer_arg *p = arg;
    write_steps(p->s, "many", (int64_t)p->producer * STEPS_EACH, (int64_t)(p->producer + 1) * STEPS_EACH,
                DEVICES);
    return NULL;
}

static void test_steps_from_threads(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "steps.db", "many");
    if (!s)
        return;
    pthread_t threads[PRODUCERS];
    producer_arg args[PRODUCERS];
    for (int t = 0; t < PRODUCERS; t++) {
        args[t] = (producer_arg){ s, t };
        pthread_create(&threads[t], NULL, produce_steps, &args[t]);
    }
    for (int t = 0; t < PRODUCERS; t++)
        pthread_join(threads[t], NULL);
    int rc = ddt_store_flush(s);
    check(rc == 0, "flush = %d", rc);

    const int64_t n = (int64_t)PRODUCERS * STEPS_EACH;
    sqlite3 *db = open_reader(path);
    if (db) {
        check(query_int(db, "SELECT count(*) FROM steps WHERE run_id = 'many'") == n,
              "steps rows %lld, expected %lld",
              (long long)query_int(db, "SELECT count(*) FROM steps"), (long long)n);
        check(query_int(db, "SELECT sum(step) FROM steps") == n * (n - 1) / 2, "steps missing or doubled");
        check(query_int(db, "SELECT count(*) FROM step_devices") == n * DEVICES,
              "step_devices rows %lld, expected %lld",
              (long long)query_int(db, "SELECT count(*) FROM step_devices"), (long long)n * DEVICES);
        check(query_int(db, "SELECT count(*) FROM step_devices WHERE device = 1 AND "
                            "peak_bytes = 2147483648 AND step_ms = 13.0") == n,
              "step_devices values wrong");
        /* one row, every column as written */
        sqlite3_stmt *st;
        sqlite3_prepare_v2(db, "SELECT ts_ms, loss, ce, kl, cap, acc, lr, grad_norm, tokens, positions,"
                               " step_ms, tokens_per_s, positions_per_s, peak_bytes, chunk, vocab_tile"
                               " FROM steps WHERE run_id = 'many' AND step = 7777", -1, &st, NULL);
        ddt_step_record r = make_step("many", 7777, DEVICES);
        if (sqlite3_step(st) == SQLITE_ROW) {
            check(sqlite3_column_int64(st, 0) == r.ts_ms, "ts_ms");
            const double want[] = { r.loss, r.ce, r.kl, r.cap, r.acc, r.lr, r.grad_norm };
            for (int j = 0; j < 7; j++)
                check(sqlite3_column_double(st, 1 + j) == want[j], "metric %d: %g != %g", j,
                      sqlite3_column_double(st, 1 + j), want[j]);
            check(sqlite3_column_int64(st, 8) == r.tokens && sqlite3_column_int64(st, 9) == r.positions,
                  "tokens / positions");
            check(sqlite3_column_double(st, 10) == r.step_ms && sqlite3_column_double(st, 11) == r.tokens_per_s &&
                      sqlite3_column_double(st, 12) == r.positions_per_s,
                  "timings");
            check(sqlite3_column_int64(st, 13) == r.peak_bytes && sqlite3_column_int64(st, 14) == r.chunk &&
                      sqlite3_column_int64(st, 15) == r.vocab_tile,
                  "peak_bytes / chunk / vocab_tile");
        } else {
            check(0, "step 7777 not found");
        }
        sqlite3_finalize(st);
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

static void test_events_evals_checkpoints(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "misc.db", "r");
    if (!s)
        return;
    ddt_store_event(s, "r", 100, "state", "{\"from\": \"queued\", \"to\": \"running\"}");
    ddt_store_event(s, "r", 200, "rechunk", "{\"chunk\": 2048, \"applies_from_step\": 11}");
    ddt_store_event(s, NULL, 300, "error", NULL);   /* the daemon's own; no detail */
    ddt_store_eval(s, "r", 200, 3.25, "{\"16\": 4.5, \"64\": 5.75}", "[0.9, 0.8]", NULL);
    ddt_store_checkpoint(s, "r", 500, "/var/lib/ddtreed/runs/r/step_000500", 123456789, 400);
    check(ddt_store_flush(s) == 0, "flush failed");

    sqlite3 *db = open_reader(path);
    if (db) {
        sqlite3_stmt *st;
        sqlite3_prepare_v2(db, "SELECT id, run_id, ts_ms, kind, detail_json FROM events ORDER BY id",
                           -1, &st, NULL);
        const char *kinds[] = { "state", "rechunk", "error" };
        const char *details[] = { "{\"from\": \"queued\", \"to\": \"running\"}",
                                  "{\"chunk\": 2048, \"applies_from_step\": 11}", "{}" };
        int rows = 0;
        int64_t last_id = 0;
        while (sqlite3_step(st) == SQLITE_ROW && rows < 3) {
            int64_t id = sqlite3_column_int64(st, 0);
            const char *run_id = (const char *)sqlite3_column_text(st, 1);
            check(id > last_id, "event ids do not increase");
            last_id = id;
            check(rows < 2 ? run_id && strcmp(run_id, "r") == 0 : run_id == NULL, "event %d run_id %s",
                  rows, run_id ? run_id : "NULL");
            check(sqlite3_column_int64(st, 2) == 100 * (rows + 1), "event %d ts_ms", rows);
            check(strcmp((const char *)sqlite3_column_text(st, 3), kinds[rows]) == 0, "event %d kind", rows);
            check(strcmp((const char *)sqlite3_column_text(st, 4), details[rows]) == 0,
                  "event %d detail %s", rows, (const char *)sqlite3_column_text(st, 4));
            rows++;
        }
        sqlite3_finalize(st);
        check(rows == 3 && query_int(db, "SELECT count(*) FROM events") == 3, "events: %d rows", rows);

        char text[256];
        check(query_int(db, "SELECT count(*) FROM evals WHERE run_id = 'r' AND step = 200 "
                            "AND tau_chain = 3.25") == 1, "eval row");
        query_text(db, "SELECT tau_tree_json FROM evals", text, sizeof text);
        check(strcmp(text, "{\"16\": 4.5, \"64\": 5.75}") == 0, "tau_tree_json %s", text);
        query_text(db, "SELECT acc_json FROM evals", text, sizeof text);
        check(strcmp(text, "[0.9, 0.8]") == 0, "acc_json %s", text);

        check(query_int(db, "SELECT count(*) FROM checkpoints WHERE run_id = 'r' AND step = 500 "
                            "AND bytes = 123456789 AND ts_ms = 400") == 1, "checkpoint row");
        query_text(db, "SELECT path FROM checkpoints", text, sizeof text);
        check(strcmp(text, "/var/lib/ddtreed/runs/r/step_000500") == 0, "checkpoint path %s", text);
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

/* the embedded migrations (cmake/embed_schema.cmake) */
extern const char *const ddt_schema_sql[];

static void test_migrate_speculative(void)
{
    char path[256];
    db_path(path, sizeof path, "v1.db");
    sqlite3 *db = NULL;
    int ok = sqlite3_open(path, &db) == SQLITE_OK &&
             sqlite3_exec(db, ddt_schema_sql[0], NULL, NULL, NULL) == SQLITE_OK &&
             sqlite3_exec(db, "PRAGMA user_version = 1;"
                          "INSERT INTO runs (id, name, state, config_json, created_ms, updated_ms, step, max_steps)"
                          " VALUES ('r', 'r', 'running', '{}', 1, 1, 10, 100);"
                          "INSERT INTO evals (run_id, step, tau_chain, tau_tree_json, acc_json)"
                          " VALUES ('r', 10, 2.5, '{\"16\": 3}', '{}');", NULL, NULL, NULL) == SQLITE_OK;
    check(ok, "a version-1 fixture: %s", db ? sqlite3_errmsg(db) : "?");
    sqlite3_close(db);
    if (!ok)
        return;
    ddt_store *s = open_store(path);
    if (!s)
        return;
    ddt_store_eval_spec(s, "r", 10, 1.75, "{\"8\": 2}", "{\"prompts\": 3}");   /* beside step 10's tau_chain */
    ddt_store_eval_spec(s, "r", 20, 1.5, "{}", "{}");                         /* a row of its own */
    ddt_store_eval(s, "r", 20, 2.75, "{}", "{}", "{\"tau_chain\": 2.5}");   /* leaves its tau_spec */
    check(ddt_store_flush(s) == 0, "flush failed");
    db = open_reader(path);
    if (db) {
        char text[128];
        check(query_int(db, "PRAGMA user_version") == ddt_store_schema_version() && ddt_store_schema_version() >= 2,
              "user_version %lld", (long long)query_int(db, "PRAGMA user_version"));
        check(query_int(db, "SELECT count(*) FROM evals WHERE step = 10 AND tau_chain = 2.5 AND tau_spec = 1.75") == 1,
              "step 10: the old row with its tau_chain and the new tau_spec");
        query_text(db, "SELECT tau_tree_json || tau_spec_tree_json || spec_json FROM evals WHERE step = 10", text,
                   sizeof text);
        check(!strcmp(text, "{\"16\": 3}{\"8\": 2}{\"prompts\": 3}"), "step 10's texts: %s", text);
        check(query_int(db, "SELECT count(*) FROM evals WHERE step = 20 AND tau_chain = 2.75 AND tau_spec = 1.5") == 1,
              "step 20: both writes kept");
        check(query_int(db, "SELECT count(*) FROM evals WHERE step = 10 AND unary_json IS NULL") == 1,
              "step 10: a DFlash row's unary_json not NULL");
        query_text(db, "SELECT unary_json FROM evals WHERE step = 20", text, sizeof text);
        check(!strcmp(text, "{\"tau_chain\": 2.5}"), "step 20's unary_json: %s", text);
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

static void test_run_create_duplicate(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "runs.db", NULL);
    if (!s)
        return;
    check(ddt_store_run_create(s, "dup", "first", "{\"a\": 1}", 10, 1000) == 0, "first create");
    int rc = ddt_store_run_create(s, "dup", "second", "{\"a\": 2}", 20, 2000);
    check(rc == -EEXIST, "a duplicate run id gave %d, not -EEXIST", rc);
    check(ddt_store_flush(s) == 0, "a duplicate create made flush fail");
    sqlite3 *db = open_reader(path);
    if (db) {
        char text[64];
        query_text(db, "SELECT name || '|' || state || '|' || config_json FROM runs WHERE id = 'dup'",
                   text, sizeof text);
        check(strcmp(text, "first|queued|{\"a\": 1}") == 0, "the first run was changed: %s", text);
        check(query_int(db, "SELECT count(*) FROM runs WHERE id = 'dup' AND max_steps = 10 AND "
                            "created_ms = 1000 AND updated_ms = 1000 AND step = 0 AND "
                            "started_ms IS NULL AND finished_ms IS NULL AND error IS NULL AND "
                            "last_checkpoint_step IS NULL") == 1,
              "a new run's columns are not as created");
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

static void test_run_update(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "update.db", "u");
    if (!s)
        return;
    sqlite3 *db = open_reader(path);
    if (!db) {
        ddt_store_close(s);
        return;
    }
    const char *row = "SELECT state || '|' || step || '|' || updated_ms || '|' || "
                      "ifnull(last_checkpoint_step, '-') || '|' || ifnull(started_ms, '-') || '|' || "
                      "ifnull(finished_ms, '-') || '|' || ifnull(error, '-') FROM runs WHERE id = 'u'";
    char text[256];

    check(ddt_store_run_update(s, "u", "running", 0, -1, 2000, 2000, -1, NULL) == 0, "update 1");
    query_text(db, row, text, sizeof text);
    check(strcmp(text, "running|0|2000|-|2000|-|-") == 0, "after start: %s", text);

    check(ddt_store_run_update(s, "u", "running", 42, 40, 3000, -1, -1, NULL) == 0, "update 2");
    query_text(db, row, text, sizeof text);
    check(strcmp(text, "running|42|3000|40|2000|-|-") == 0, "after steps: %s", text);

    check(ddt_store_run_update(s, "u", "failed", 43, -1, 4000, -1, 4000, "out of memory at chunk 512") == 0,
          "update 3");
    query_text(db, row, text, sizeof text);
    check(strcmp(text, "failed|43|4000|40|2000|4000|out of memory at chunk 512") == 0, "after failure: %s",
          text);

    check(ddt_store_run_update(s, "u", "queued", 43, -1, 5000, -1, -1, NULL) == 0, "update 4");
    query_text(db, row, text, sizeof text);
    check(strcmp(text, "queued|43|5000|40|2000|4000|out of memory at chunk 512") == 0,
          "NULL error did not leave it: %s", text);
    check(ddt_store_run_update(s, "u", "running", 43, -1, 6000, -1, -1, "") == 0, "update 5");
    query_text(db, row, text, sizeof text);
    check(strcmp(text, "running|43|6000|40|2000|4000|-") == 0, "\"\" did not clear the error: %s", text);

    int rc = ddt_store_run_update(s, "nobody", "running", 1, -1, 1, -1, -1, NULL);
    check(rc == -ENOENT, "update of an unknown run gave %d, not -ENOENT", rc);
    sqlite3_close(db);
    ddt_store_close(s);
}

/* a checkpoint moves step and last_checkpoint_step, and never the state (its owner's) */
static void test_run_checkpointed(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "checkpointed.db", "k");
    if (!s)
        return;
    check(ddt_store_run_update(s, "k", "paused", 40, 40, 2000, 1500, -1, NULL) == 0, "paused");
    check(ddt_store_run_checkpointed(s, "k", 40, 3000) == 0, "checkpointed");
    sqlite3 *db = open_reader(path);
    if (db) {
        char text[128];
        query_text(db, "SELECT state || '|' || step || '|' || last_checkpoint_step || '|' || updated_ms || '|' || "
                       "started_ms FROM runs WHERE id = 'k'", text, sizeof text);
        check(strcmp(text, "paused|40|40|3000|1500") == 0, "after a checkpoint while paused: %s", text);
        check(query_int(db, "SELECT count(*) FROM events") == 0, "a checkpoint of the row wrote an event");
        sqlite3_close(db);
    }
    int rc = ddt_store_run_checkpointed(s, "nobody", 1, 1);
    check(rc == -ENOENT, "a checkpoint of an unknown run gave %d, not -ENOENT", rc);
    ddt_store_close(s);
}

static void test_replace_on_resume(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "resume.db", "res");
    if (!s)
        return;
    write_steps(s, "res", 0, 10, 3);
    check(ddt_store_flush(s) == 0, "first flush");
    /* a crash after step 9, a resume from the checkpoint at 7: steps 7..9 again, on 1 device */
    for (int step = 7; step < 12; step++) {
        ddt_step_record r = make_step("res", step, 1);
        r.loss = 100.0 + step;
        ddt_store_step(s, &r);
    }
    int rc = ddt_store_flush(s);
    check(rc == 0, "re-running steps made flush %d", rc);
    sqlite3 *db = open_reader(path);
    if (db) {
        check(query_int(db, "SELECT count(*) FROM steps") == 12, "steps rows");
        check(query_int(db, "SELECT count(*) FROM steps WHERE loss >= 100") == 5, "not replaced");
        check(query_int(db, "SELECT count(*) FROM step_devices WHERE step >= 7") == 5,
              "old step_devices rows of replaced steps remain");
        check(query_int(db, "SELECT count(*) FROM step_devices WHERE step < 7") == 21,
              "step_devices rows of kept steps lost");
        sqlite3_close(db);
    }
    ddt_store_close(s);
}

static void test_nan_is_null(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "nan.db", "n");
    if (!s)
        return;
    ddt_step_record r = make_step("n", 1, 1);
    r.loss = NAN;
    ddt_store_step(s, &r);
    check(ddt_store_flush(s) == 0, "a diverged step (NaN loss) was not written");
    check(count_in(path, "SELECT count(*) FROM steps WHERE loss IS NULL AND ce = 0.5") == 1,
          "a NaN loss is not stored as NULL");
    ddt_store_close(s);
}

/* stderr (the store's log lines) into log_path until restore_stderr(the returned descriptor) */
static int capture_stderr(const char *log_path)
{
    fflush(stderr);
    int saved = dup(2), log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(log_fd, 2);
    close(log_fd);
    return saved;
}

static void restore_stderr(int saved)
{
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
}

/* a record the database refuses: one log line, flush -EIO once, the batch's others kept */
static void test_failure_reported(void)
{
    char path[256], log_path[256];
    db_path(log_path, sizeof log_path, "stderr.log");
    ddt_store *s = open_fresh(path, sizeof path, "fail.db", "ok");
    if (!s)
        return;

    int saved = capture_stderr(log_path);
    for (int step = 0; step < 50; step++) {
        ddt_step_record r = make_step(step == 25 ? "ghost" : "ok", step, 1);   /* ghost: no run */
        ddt_store_step(s, &r);
    }
    int first = ddt_store_flush(s);
    int second = ddt_store_flush(s);
    restore_stderr(saved);

    check(first == -EIO, "flush after a refused record = %d, not -EIO", first);
    check(second == 0, "the failure was reported twice (second flush %d)", second);
    check(count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'ok'") == 49,
          "records of the failed batch were lost with it");
    size_t len = 0;
    char *log = (char *)read_file(log_path, &len);
    check(log && strncmp(log, "<3>", 3) == 0, "no <3> line: %s", log ? log : "(none)");
    check(log && strstr(log, "run_id=\"ghost\"") && strstr(log, "step=25") && strstr(log, "kind=step"),
          "the line lacks kind, run_id or step: %s", log ? log : "");
    check(log && strchr(log, '\n') == log + len - 1, "not exactly one line: %s", log ? log : "");
    free(log);
    ddt_store_close(s);
}

/* polls h until the store says degraded (or 120 s): its health then */
static ddt_store_health wait_degraded(ddt_store *s)
{
    ddt_store_health h;
    ddt_store_get_health(s, &h);
    for (int tenths = 0; tenths < 1200 && !h.degraded; tenths++) {
        nanosleep(&(struct timespec){ 0, 100 * 1000 * 1000 }, NULL);
        ddt_store_get_health(s, &h);
    }
    return h;
}

/* another process's write lock (BEGIN IMMEDIATE from a DB browser, a backup, a script) is waited
 * out: the writer's BEGIN finds the database busy after busy_timeout, the store says degraded
 * with the cause, tries again, and every record queued meanwhile is committed once the lock is
 * gone; both moments logged. A run update queued with them is answered -EBUSY at the first wait,
 * not held up; a run's transition is kept (its wait returns -EINPROGRESS) and written after. */
static void test_locked_waited(void)
{
    char path[256], log_path[256];
    db_path(log_path, sizeof log_path, "locked.log");
    ddt_store *s = open_fresh(path, sizeof path, "locked.db", "lk");
    if (!s)
        return;
    sqlite3 *other = NULL;
    check(sqlite3_open_v2(path, &other, SQLITE_OPEN_READWRITE, NULL) == SQLITE_OK &&
              sqlite3_exec(other, "BEGIN IMMEDIATE", NULL, NULL, NULL) == SQLITE_OK,
          "the other connection cannot take the write lock");
    int saved = capture_stderr(log_path);
    for (int step = 0; step < 200; step++) {
        ddt_step_record r = make_step("lk", step, 1);
        ddt_store_step(s, &r);
    }
    /* answered while the lock is still held (this thread holds it until the call returns) */
    int update = ddt_store_run_update(s, "lk", NULL, 199, -1, 1000, -1, -1, NULL);
    ddt_store_health h = wait_degraded(s);
    int moved = ddt_store_run_transition(s, "lk", DDT_RUN_QUEUED, DDT_RUN_RUNNING, 199, -1, 1001, NULL);
    sqlite3_exec(other, "COMMIT", NULL, NULL, NULL);
    sqlite3_close(other);
    int rc = ddt_store_flush(s);
    ddt_store_health after;
    ddt_store_get_health(s, &after);
    restore_stderr(saved);

    check(h.degraded && h.lock_waits >= 1 && strstr(h.cause, "holds the write lock of") && strstr(h.cause, path),
          "the store did not say it waits for the lock (degraded %d, waits %lld, cause '%s')", h.degraded,
          (long long)h.lock_waits, h.cause);
    check(h.since_ms > 0 && h.queued >= 0, "since %lld, queued %d", (long long)h.since_ms, h.queued);
    check(update == -EBUSY, "a run update during the lock = %d, not -EBUSY at the first wait", update);
    check(moved == -EINPROGRESS, "a transition during the lock = %d, not kept queued (-EINPROGRESS)", moved);
    check(rc == 0, "flush after the lock = %d: records were lost", rc);
    check(!after.degraded && !*after.cause, "still degraded after the lock went: %s", after.cause);
    check(count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'lk'") == 200,
          "%lld of 200 steps queued during the lock were committed",
          (long long)count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'lk'"));
    check(count_in(path, "SELECT count(*) FROM runs WHERE id = 'lk' AND state = 'running'") == 1 &&
              count_in(path, "SELECT count(*) FROM events WHERE run_id = 'lk' AND kind = 'state'") == 1,
          "the transition kept during the lock was not written after it");
    size_t len = 0;
    char *log = (char *)read_file(log_path, &len);
    check(log && strstr(log, "store: cannot write, waiting; records are kept") &&
              strstr(log, "store: writable again after"),
          "the wait and its end are not logged: %s", log ? log : "(none)");
    free(log);
    ddt_store_close(s);
}

/* ---- A full disk, through a VFS over the default one whose writes fail with SQLITE_FULL while
 * disk_full is set (SQLite's own way to put a layer under a connection: the store's writer opens
 * its database through the default VFS, which this one becomes for the test). */
static sqlite3_vfs *unix_vfs;
static sqlite3_vfs full_vfs;
static sqlite3_io_methods full_methods;
static volatile int disk_full;
typedef struct full_file {
    sqlite3_file base;
    sqlite3_file *real;   /* the default VFS's file, right after this struct */
} full_file;
#define REAL(f) (((full_file *)(f))->real)

static int full_close(sqlite3_file *f) { return REAL(f)->pMethods->xClose(REAL(f)); }
static int full_read(sqlite3_file *f, void *b, int n, sqlite3_int64 o) { return REAL(f)->pMethods->xRead(REAL(f), b, n, o); }
static int full_write(sqlite3_file *f, const void *b, int n, sqlite3_int64 o)
{
    return disk_full ? SQLITE_FULL : REAL(f)->pMethods->xWrite(REAL(f), b, n, o);
}
static int full_truncate(sqlite3_file *f, sqlite3_int64 n) { return REAL(f)->pMethods->xTruncate(REAL(f), n); }
static int full_sync(sqlite3_file *f, int flags) { return REAL(f)->pMethods->xSync(REAL(f), flags); }
static int full_size(sqlite3_file *f, sqlite3_int64 *n) { return REAL(f)->pMethods->xFileSize(REAL(f), n); }
static int full_lock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xLock(REAL(f), l); }
static int full_unlock(sqlite3_file *f, int l) { return REAL(f)->pMethods->xUnlock(REAL(f), l); }
static int full_reserved(sqlite3_file *f, int *r) { return REAL(f)->pMethods->xCheckReservedLock(REAL(f), r); }
static int full_control(sqlite3_file *f, int op, void *a) { return REAL(f)->pMethods->xFileControl(REAL(f), op, a); }
static int full_sector(sqlite3_file *f) { return REAL(f)->pMethods->xSectorSize(REAL(f)); }
static int full_device(sqlite3_file *f) { return REAL(f)->pMethods->xDeviceCharacteristics(REAL(f)); }
static int full_shm_map(sqlite3_file *f, int i, int n, int w, void volatile **p) { return REAL(f)->pMethods->xShmMap(REAL(f), i, n, w, p); }
static int full_shm_lock(sqlite3_file *f, int o, int n, int fl) { return REAL(f)->pMethods->xShmLock(REAL(f), o, n, fl); }
static void full_shm_barrier(sqlite3_file *f) { REAL(f)->pMethods->xShmBarrier(REAL(f)); }
static int full_shm_unmap(sqlite3_file *f, int d) { return REAL(f)->pMethods->xShmUnmap(REAL(f), d); }
static int full_fetch(sqlite3_file *f, sqlite3_int64 o, int n, void **p) { return REAL(f)->pMethods->xFetch(REAL(f), o, n, p); }
static int full_unfetch(sqlite3_file *f, sqlite3_int64 o, void *p) { return REAL(f)->pMethods->xUnfetch(REAL(f), o, p); }

static int full_open(sqlite3_vfs *vfs, const char *name, sqlite3_file *f, int flags, int *out_flags)
{
    (void)vfs;
    full_file *ff = (full_file *)f;
    ff->real = (sqlite3_file *)(ff + 1);
    int rc = unix_vfs->xOpen(unix_vfs, name, ff->real, flags, out_flags);
    f->pMethods = rc == SQLITE_OK && ff->real->pMethods ? &full_methods : NULL;
    return rc;
}

static void full_vfs_install(void)
{
    unix_vfs = sqlite3_vfs_find(NULL);
    full_vfs = *unix_vfs;
    full_vfs.zName = "ddtree-test-full";
    full_vfs.szOsFile = (int)sizeof(full_file) + unix_vfs->szOsFile;
    full_vfs.xOpen = full_open;
    full_methods = (sqlite3_io_methods){ 3, full_close, full_read, full_write, full_truncate, full_sync, full_size,
                                         full_lock, full_unlock, full_reserved, full_control, full_sector,
                                         full_device, full_shm_map, full_shm_lock, full_shm_barrier,
                                         full_shm_unmap, full_fetch, full_unfetch };
    sqlite3_vfs_register(&full_vfs, 1);
}

/* The state directory's file system full: every write fails (SQLITE_FULL), the store says
 * degraded naming the file system and the path, keeps the records in order, and commits them all
 * once space is back (today's loss: "commit failed, records lost"). The test's own reads and
 * the store's opening come before the disk fills. */
static void test_full_waited(void)
{
    char path[256], log_path[256];
    db_path(log_path, sizeof log_path, "full.log");
    full_vfs_install();
    ddt_store *s = open_fresh(path, sizeof path, "full.db", "fu");
    if (!s) {
        sqlite3_vfs_unregister(&full_vfs);
        return;
    }
    write_steps(s, "fu", 0, 10, 1);
    int committed = ddt_store_commit_queued(s);
    check(committed == 0 && count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'fu'") == 10,
          "commit_queued before the disk filled = %d, %lld steps committed", committed,
          (long long)count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'fu'"));
    int saved = capture_stderr(log_path);
    disk_full = 1;
    write_steps(s, "fu", 10, 300, 2);
    ddt_store_event(s, "fu", 5, "note", "{\"step\": 299}");
    ddt_store_health h = wait_degraded(s);
    int created = ddt_store_run_create(s, "later", "", "{}", 5, 6);
    int kept = ddt_store_commit_queued(s);   /* a checkpoint's question: answered at once, not held */
    disk_full = 0;
    int rc = ddt_store_flush(s);
    restore_stderr(saved);
    sqlite3_vfs_unregister(&full_vfs);

    check(h.degraded && strstr(h.cause, "file system is full") && strstr(h.cause, path),
          "the store did not say the disk is full: degraded %d, cause '%s'", h.degraded, h.cause);
    check(created == -ENOSPC, "a run created on a full disk = %d, not refused with -ENOSPC", created);
    check(kept == -EINPROGRESS, "commit_queued while the disk is full = %d, not -EINPROGRESS", kept);
    check(rc == 0, "flush after space came back = %d: records were lost", rc);
    check(count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'fu'") == 300 &&
              count_in(path, "SELECT count(*) FROM step_devices WHERE run_id = 'fu'") == 10 + 290 * 2 &&
              count_in(path, "SELECT count(*) FROM events WHERE run_id = 'fu' AND kind = 'note'") == 1,
          "%lld of 300 steps (and their devices, the event) written after the disk was full",
          (long long)count_in(path, "SELECT count(*) FROM steps WHERE run_id = 'fu'"));
    check(count_in(path, "SELECT count(*) FROM runs WHERE id = 'later'") == 0, "a refused run was written");
    size_t len = 0;
    char *log = (char *)read_file(log_path, &len);
    check(log && strstr(log, "file system is full") && strstr(log, "writable again after") &&
              !strstr(log, "records lost"),
          "the log does not say the wait and its end, or says records lost: %s", log ? log : "(none)");
    free(log);
    ddt_store_close(s);
}

/* a reader holding a snapshot does not stop the writer (WAL) and sees the commits after it */
static void test_reader_during_writes(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "reader.db", "w");
    if (!s)
        return;
    write_steps(s, "w", 0, 100, 1);
    check(ddt_store_flush(s) == 0, "first flush");
    sqlite3 *db = open_reader(path);
    if (!db) {
        ddt_store_close(s);
        return;
    }
    check(query_int(db, "SELECT count(*) FROM steps") == 100, "the reader does not see committed rows");
    sqlite3_exec(db, "BEGIN", NULL, NULL, NULL);
    check(query_int(db, "SELECT count(*) FROM steps") == 100, "snapshot");
    write_steps(s, "w", 100, 300, 1);
    int rc = ddt_store_flush(s);   /* would wait out busy_timeout and fail without WAL */
    check(rc == 0, "the writer failed while a reader held a snapshot: %d", rc);
    check(query_int(db, "SELECT count(*) FROM steps") == 100, "the snapshot changed under the reader");
    sqlite3_exec(db, "COMMIT", NULL, NULL, NULL);
    check(query_int(db, "SELECT count(*) FROM steps") == 300, "the reader does not see the new commits");
    sqlite3_close(db);
    ddt_store_close(s);
}

/* close writes what is queued; a later open finds it */
static void test_close_drains(void)
{
    char path[256];
    ddt_store *s = open_fresh(path, sizeof path, "close.db", "c");
    if (!s)
        return;
    write_steps(s, "c", 0, 3000, 1);
    ddt_store_event(s, "c", 1, "state", "{}");
    ddt_store_close(s);   /* no flush */
    check(!wal_exists(path), "close left the WAL behind (not checkpointed)");
    check(count_in(path, "SELECT count(*) FROM steps") == 3000, "close lost queued steps");
    check(count_in(path, "SELECT count(*) FROM events") == 1, "close lost a queued event");
}

/* ------------------------------------------------------------------------------------------ */

int main(void)
{
    scratch_dir(tmp_dir);
    static const test_case cases[] = {
        { "fresh database: newest user_version, API.md's tables and columns", test_fresh_schema },
        { "a version-1 database migrated: speculative and unary columns, rows kept, upserts apart",
          test_migrate_speculative },
        { "journal_mode is WAL", test_wal_mode },
        { "reopening is idempotent", test_reopen_idempotent },
        { "a database of a newer ddtreed is refused and left untouched", test_future_version_refused },
        { "a missing parent directory is named", test_missing_directory },
        { "a database ddtreed did not create is refused", test_foreign_database_refused },
        { "10,000 steps from 4 threads, with step_devices", test_steps_from_threads },
        { "events, evals and checkpoints round trip", test_events_evals_checkpoints },
        { "run create: duplicate id is -EEXIST", test_run_create_duplicate },
        { "run update: fields set, optional ones left", test_run_update },
        { "run checkpointed: step and last checkpoint, the state left", test_run_checkpointed },
        { "a re-run step replaces the first (resume)", test_replace_on_resume },
        { "a NaN metric is stored as NULL", test_nan_is_null },
        { "a refused record: logged, flush -EIO once, batch kept", test_failure_reported },
        { "a reader sees commits while the writer runs (WAL)", test_reader_during_writes },
        { "another process's write lock is waited out, no record lost", test_locked_waited },
        { "a full file system is waited out, the store degraded meanwhile, no record lost", test_full_waited },
        { "close writes what is queued", test_close_drains },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    remove_tree(tmp_dir);
    return cases_summary();
}
