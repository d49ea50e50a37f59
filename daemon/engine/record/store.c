/* store.c: the SQLite store of API.md ("SQLite"), see store.h.
 *
 * One connection writes, and only the writer thread uses it once ddt_store_open has returned.
 * Producers (trainer threads, the run manager) put fixed-size items into a bounded ring
 * (QUEUE_CAPACITY); a full ring blocks the producer (back-pressure: records are never dropped).
 * The writer takes everything queued, up to BATCH_MAX items, and writes it in one
 * BEGIN IMMEDIATE transaction with persistent prepared statements. When an item's statement
 * fails, the batch is rolled back and written again one item per transaction, so that only the
 * bad item is lost and its failure is logged with its run and step. Synchronous calls (run
 * create / update, flush) travel through the same ring and wait for the answer of the writer,
 * which comes after the commit; items are answered in queue order, so a flush answers for
 * everything enqueued before it. A failed item is reported by the first flush answered after
 * it (-EIO), and logged to stderr as one line: "<3>store: ... key=value ...".
 *
 * Opening: busy_timeout (5 s) is set before the WAL pragma; store_schema.c's checks, pragmas
 * and migrations (store_schema.h) bring the database to the newest schema, then the writer's
 * statements are prepared and the writer thread started.
 *
 * Values: a NaN double is stored as NULL (SQLite's rule); run_update's NULL or negative optional
 * fields leave the column as it is, and an error of "" clears the column (a resumed run).
 *
 * A run's state: ddt_store_run_transition checks (from, to) against run_state.h's table before
 * anything is queued, then one item of the ring carries the row's update and its "state"
 * event, so the batch (or, replayed, its own transaction) writes both or neither; the update
 * matches the row only in state `from`, and without a match no event is written. The run manager
 * enqueues under its lock (ddt_store_run_transition_enqueue: the order of its changes is the
 * queue's) and waits for the answer (ddt_store_wait) after releasing it.
 *
 * Not here: reading (the HTTP handlers and tools open their own connections), retrying a
 * failed write (a locked or full disk is logged and reported by flush; the trainer decides),
 * deleting runs or old checkpoints, the schema and its migrations (store_schema.c).
 *
 * Tested by tests/engine/record/test_store.c and tests/engine/run/test_run_state.c (every transition).
 */
#include "ddk_rng.h"
#include "base/errors.h"
#include "store.h"
#include "store_schema.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
    QUEUE_CAPACITY = 4096,   /* ~1.8 MB of items: seconds of steps of every run at once */
    BATCH_MAX = 512,         /* items per transaction: one fsync-free WAL commit each */
    BUSY_TIMEOUT_MS = 5000,  /* another connection's write lock (a reader never takes one) */
    LOG_FAILURES_PER_BATCH = 4,
};

/* ------------------------------------------------------------------------------------------
 * Items of the queue
 */

typedef enum {
    ITEM_STEP,
    ITEM_EVENT,
    ITEM_EVAL,
    ITEM_CHECKPOINT,
    ITEM_RUN_CREATE,
    ITEM_RUN_UPDATE,
    ITEM_RUN_TRANSITION,
    ITEM_FLUSH,
} item_kind;

static const char *const item_names[] = {
    [ITEM_STEP] = "step",           [ITEM_EVENT] = "event",
    [ITEM_EVAL] = "eval",           [ITEM_CHECKPOINT] = "checkpoint",
    [ITEM_RUN_CREATE] = "run_create", [ITEM_RUN_UPDATE] = "run_update",
    [ITEM_RUN_TRANSITION] = "run_transition", [ITEM_FLUSH] = "flush",
};

/* What a synchronous caller waits for; on its stack, answered under the store's lock. */
typedef struct sync_answer {
    int done;
    int rc;
} sync_answer;

/* run_create / run_update / run_transition: the caller's strings, valid while it waits */
typedef struct run_request {
    sync_answer answer;
    const char *run_id, *name, *config_json, *state, *error;
    const char *from_state, *detail_json;   /* run_transition: the state it leaves, its event */
    int starts, finishes;                   /* run_transition: to running, to a final state */
    int64_t max_steps, created_ms, step, last_checkpoint_step, now_ms, started_ms, finished_ms;
} run_request;

typedef struct store_item {
    item_kind kind;
    union {
        ddt_step_record step;
        struct {
            char *run_id, *kind, *detail_json;   /* owned copies; run_id may be NULL */
            int64_t ts_ms;
        } event;
        struct {
            char *run_id, *tau_tree_json, *acc_json;   /* owned copies; spec: tau_spec_tree_json, spec_json */
            int64_t step;
            double tau_chain;                          /* spec: tau_spec */
            int spec;                                  /* 1: the speculative columns (ddt_store_eval_spec) */
        } eval;
        struct {
            char *run_id, *path;   /* owned copies */
            int64_t step, bytes, ts_ms;
        } checkpoint;
        run_request *run;       /* ITEM_RUN_CREATE, ITEM_RUN_UPDATE, ITEM_RUN_TRANSITION */
        sync_answer *flush;     /* ITEM_FLUSH */
    };
} store_item;

static void item_free(store_item *item)
{
    switch (item->kind) {
    case ITEM_EVENT:
        free(item->event.run_id);
        free(item->event.kind);
        free(item->event.detail_json);
        break;
    case ITEM_EVAL:
        free(item->eval.run_id);
        free(item->eval.tau_tree_json);
        free(item->eval.acc_json);
        break;
    case ITEM_CHECKPOINT:
        free(item->checkpoint.run_id);
        free(item->checkpoint.path);
        break;
    default:
        break;
    }
}

/* an item the writer answers to a waiting caller, rather than counting its failure for flush */
static int item_is_sync(item_kind kind)
{
    return kind == ITEM_RUN_CREATE || kind == ITEM_RUN_UPDATE || kind == ITEM_RUN_TRANSITION ||
           kind == ITEM_FLUSH;
}

/* ------------------------------------------------------------------------------------------
 * Prepared statements of the writer connection (SQLITE_PREPARE_PERSISTENT)
 */

enum {
    STMT_BEGIN,
    STMT_COMMIT,
    STMT_ROLLBACK,
    STMT_STEP,
    STMT_STEP_DEVICE,
    STMT_EVENT,
    STMT_EVAL,
    STMT_EVAL_SPEC,
    STMT_CHECKPOINT,
    STMT_RUN_CREATE,
    STMT_RUN_UPDATE,
    STMT_RUN_TRANSITION,
    STMT_RUN_EXISTS,
    STMT_COUNT
};

static const char *const stmt_sql[STMT_COUNT] = {
    [STMT_BEGIN] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    [STMT_STEP] =
        "INSERT OR REPLACE INTO steps (run_id, step, ts_ms, loss, ce, kl, cap, acc, lr, grad_norm,"
        " tokens, positions, step_ms, tokens_per_s, positions_per_s, peak_bytes, chunk, vocab_tile)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18)",
    [STMT_STEP_DEVICE] =
        "INSERT OR REPLACE INTO step_devices (run_id, step, device, peak_bytes, step_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5)",
    [STMT_EVENT] = "INSERT INTO events (run_id, ts_ms, kind, detail_json) VALUES (?1, ?2, ?3, ?4)",
    /* the teacher-forced columns and the speculative ones of one step's row, each written
     * without touching the other's (a speculation posted at a step evaluated before) */
    [STMT_EVAL] =
        "INSERT INTO evals (run_id, step, tau_chain, tau_tree_json, acc_json) VALUES (?1, ?2, ?3, ?4, ?5)"
        " ON CONFLICT (run_id, step) DO UPDATE SET tau_chain = excluded.tau_chain,"
        " tau_tree_json = excluded.tau_tree_json, acc_json = excluded.acc_json",
    [STMT_EVAL_SPEC] =
        "INSERT INTO evals (run_id, step, tau_spec, tau_spec_tree_json, spec_json) VALUES (?1, ?2, ?3, ?4, ?5)"
        " ON CONFLICT (run_id, step) DO UPDATE SET tau_spec = excluded.tau_spec,"
        " tau_spec_tree_json = excluded.tau_spec_tree_json, spec_json = excluded.spec_json",
    [STMT_CHECKPOINT] =
        "INSERT OR REPLACE INTO checkpoints (run_id, step, path, bytes, ts_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5)",
    /* DO NOTHING on a duplicate id: no error, so a batch is not replayed for it; the caller
     * learns -EEXIST from sqlite3_changes() == 0 */
    [STMT_RUN_CREATE] =
        "INSERT INTO runs (id, name, state, config_json, created_ms, updated_ms, step, max_steps)"
        " VALUES (?1, ?2, ?6, ?3, ?4, ?4, 0, ?5) ON CONFLICT (id) DO NOTHING",
    [STMT_RUN_UPDATE] =
        "UPDATE runs SET state = coalesce(?2, state), step = ?3, updated_ms = ?4,"
        " last_checkpoint_step = coalesce(?5, last_checkpoint_step),"
        " started_ms = coalesce(?6, started_ms), finished_ms = coalesce(?7, finished_ms),"
        " error = CASE WHEN ?8 IS NULL THEN error ELSE nullif(?8, '') END"
        " WHERE id = ?1",
    /* only from ?6, the state the caller saw: no match (sqlite3_changes() == 0), no event */
    [STMT_RUN_TRANSITION] =
        "UPDATE runs SET state = ?2, step = ?3, updated_ms = ?4,"
        " last_checkpoint_step = coalesce(?5, last_checkpoint_step),"
        " started_ms = CASE WHEN ?7 THEN coalesce(started_ms, ?4) ELSE started_ms END,"
        " finished_ms = CASE WHEN ?8 THEN ?4 ELSE finished_ms END,"
        " error = CASE WHEN ?9 IS NULL THEN error ELSE nullif(?9, '') END"
        " WHERE id = ?1 AND state = ?6",
    [STMT_RUN_EXISTS] = "SELECT 1 FROM runs WHERE id = ?1",
};

/* ------------------------------------------------------------------------------------------
 * The store
 */

struct ddt_store {
    sqlite3 *db;                         /* the writer connection */
    sqlite3_stmt *stmt[STMT_COUNT];
    char *path;

    pthread_mutex_t lock;                /* guards everything below up to the writer's own */
    pthread_cond_t not_empty, not_full, answered;
    store_item *queue;                   /* ring of QUEUE_CAPACITY */
    int head, count;
    int stopping;
    int64_t failures;                    /* failed items not yet reported by a flush */
    pthread_t writer;
    int writer_started;

    /* the writer thread's own */
    store_item *batch;                   /* BATCH_MAX */
    int *results;                        /* per batch item: 0 or a negative errno */
    int batch_logged;                    /* failures logged in this batch */
    char why[512];                       /* the last failure, for the log */
    int why_code;                        /* its SQLite extended code (0: not SQLite's) */
    int had_row;                         /* the last run_stmt's statement gave a row */
};

/* a value safe inside key="...": no quotes, no line breaks */
static void copy_quotable(char *out, size_t out_len, const char *text)
{
    size_t j = 0;
    for (; text && text[j] && j + 1 < out_len; j++)
        out[j] = text[j] == '"' ? '\'' : (text[j] == '\n' || text[j] == '\r') ? ' ' : text[j];
    out[j] = '\0';
}

/* what an operator can do about a failed write, by SQLite's code */
static const char *failure_hint(int code)
{
    if (code == SQLITE_CONSTRAINT_FOREIGNKEY)
        return "create the run before writing its records (a bug of the caller)";
    switch (code & 0xff) {
    case SQLITE_FULL:
        return "free space on the state directory's file system";
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
        return "another process holds ddtree.db's write lock: stop it (only ddtreed writes it)";
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
        return "make the state directory and ddtree.db writable by ddtreed";
    case SQLITE_IOERR:
    case SQLITE_CORRUPT:
        return "check the disk (dmesg); restore ddtree.db from a backup if it is damaged";
    case SQLITE_CONSTRAINT:
        return "a value out of range (a bug of the caller)";
    default:
        return "see the error";
    }
}

/* ------------------------------------------------------------------------------------------
 * The writer: statements of one item
 */

/* runs a bound statement to completion (s->had_row: whether its first step gave a row) and
 * resets it: SQLITE_OK, or its code with s->why set */
static int run_stmt(ddt_store *s, sqlite3_stmt *st)
{
    int rc = sqlite3_step(st);
    s->had_row = rc == SQLITE_ROW;
    if (rc == SQLITE_DONE || rc == SQLITE_ROW) {
        sqlite3_reset(st);
        return SQLITE_OK;
    }
    s->why_code = sqlite3_extended_errcode(s->db);
    copy_quotable(s->why, sizeof s->why, sqlite3_errmsg(s->db));
    sqlite3_reset(st);
    return s->why_code ? s->why_code : rc;
}

/* One parameter of a statement, bound by bind_and_run */
typedef struct sql_value {
    enum { VALUE_TEXT, VALUE_INT, VALUE_OPTIONAL, VALUE_DOUBLE } type;
    const char *text;
    int64_t integer;
    double real;
} sql_value;

/* text (the caller's, SQLITE_STATIC), or NULL */
static sql_value text_value(const char *text)
{
    return (sql_value){ .type = VALUE_TEXT, .text = text };
}

static sql_value int_value(int64_t integer)
{
    return (sql_value){ .type = VALUE_INT, .integer = integer };
}

/* an optional integer: NULL when negative (leave the column / not known) */
static sql_value optional_value(int64_t integer)
{
    return (sql_value){ .type = VALUE_OPTIONAL, .integer = integer };
}

/* a double; SQLite binds a NaN as NULL */
static sql_value double_value(double real)
{
    return (sql_value){ .type = VALUE_DOUBLE, .real = real };
}

/* binds values[0..n) to ?1..?n of the writer's statement `which`, then run_stmt */
static int bind_and_run(ddt_store *s, int which, const sql_value *values, int n)
{
    sqlite3_stmt *st = s->stmt[which];
    for (int j = 0; j < n; j++) {
        const sql_value *v = &values[j];
        int column = j + 1;
        if (v->type == VALUE_DOUBLE)
            sqlite3_bind_double(st, column, v->real);
        else if (v->type == VALUE_TEXT && v->text)
            sqlite3_bind_text(st, column, v->text, -1, SQLITE_STATIC);
        else if (v->type == VALUE_INT || (v->type == VALUE_OPTIONAL && v->integer >= 0))
            sqlite3_bind_int64(st, column, v->integer);
        else   /* a NULL text, a negative optional integer */
            sqlite3_bind_null(st, column);
    }
    return run_stmt(s, st);
}

/* RUN_BOUND(s, STMT_X, text_value(a), int_value(b), ...): bind_and_run with those values */
#define RUN_BOUND(s, which, ...)                                                                  \
    bind_and_run((s), (which), (const sql_value[]){ __VA_ARGS__ },                                \
                 (int)(sizeof((const sql_value[]){ __VA_ARGS__ }) / sizeof(sql_value)))

static int write_step(ddt_store *s, const ddt_step_record *r)
{
    size_t id_len = strnlen(r->run_id, sizeof r->run_id);
    if (id_len == 0 || id_len == sizeof r->run_id || r->devices < 0 ||
        r->devices > DDT_STORE_MAX_DEVICES) {
        snprintf(s->why, sizeof s->why, "malformed record: run_id must be 1..%zu bytes and "
                 "NUL-terminated, devices in [0, %d] (got %d)", sizeof r->run_id - 1,
                 DDT_STORE_MAX_DEVICES, r->devices);
        s->why_code = 0;
        return SQLITE_MISUSE;
    }
    /* run_id is NUL-terminated within its array (checked above) */
    int rc = RUN_BOUND(s, STMT_STEP, text_value(r->run_id), int_value(r->step), int_value(r->ts_ms),
                       double_value(r->loss), double_value(r->ce), double_value(r->kl), double_value(r->cap),
                       double_value(r->acc), double_value(r->lr), double_value(r->grad_norm),
                       int_value(r->tokens), int_value(r->positions), double_value(r->step_ms),
                       double_value(r->tokens_per_s), double_value(r->positions_per_s),
                       int_value(r->peak_bytes), int_value(r->chunk), int_value(r->vocab_tile));
    /* a replaced steps row took its old step_devices rows with it (ON DELETE CASCADE) */
    for (int d = 0; d < r->devices && rc == SQLITE_OK; d++)
        rc = RUN_BOUND(s, STMT_STEP_DEVICE, text_value(r->run_id), int_value(r->step), int_value(d),
                       int_value(r->device_peak_bytes[d]), double_value(r->device_step_ms[d]));
    return rc;
}

/* The row from q->from_state to q->state, then its event; neither when the row is elsewhere
 * (*result -ESTALE) or missing (-ENOENT). SQLITE_OK, or the failing code with s->why set. */
static int write_transition(ddt_store *s, const run_request *q, int *result)
{
    int rc = RUN_BOUND(s, STMT_RUN_TRANSITION, text_value(q->run_id), text_value(q->state),
                       int_value(q->step), int_value(q->now_ms), optional_value(q->last_checkpoint_step),
                       text_value(q->from_state), int_value(q->starts), int_value(q->finishes),
                       text_value(q->error));
    if (rc != SQLITE_OK)
        return rc;
    if (sqlite3_changes(s->db) == 0) {   /* no such run, or not in `from` */
        rc = RUN_BOUND(s, STMT_RUN_EXISTS, text_value(q->run_id));
        if (rc == SQLITE_OK)
            *result = s->had_row ? -ESTALE : -ENOENT;
        return rc;
    }
    return RUN_BOUND(s, STMT_EVENT, text_value(q->run_id), int_value(q->now_ms), text_value("state"),
                     text_value(q->detail_json));
}

/* One item's statements: SQLITE_OK (with *result its answer: 0, or -EEXIST / -ENOENT / -ESTALE
 * for a run call), or the failing code with s->why set. */
static int write_item(ddt_store *s, const store_item *item, int *result)
{
    int rc = SQLITE_OK;
    *result = 0;
    switch (item->kind) {
    case ITEM_STEP:
        rc = write_step(s, &item->step);
        break;
    case ITEM_EVENT:
        rc = RUN_BOUND(s, STMT_EVENT, text_value(item->event.run_id), int_value(item->event.ts_ms),
                       text_value(item->event.kind),
                       text_value(item->event.detail_json ? item->event.detail_json : "{}"));
        break;
    case ITEM_EVAL:
        rc = RUN_BOUND(s, item->eval.spec ? STMT_EVAL_SPEC : STMT_EVAL, text_value(item->eval.run_id),
                       int_value(item->eval.step),
                       double_value(item->eval.tau_chain), text_value(item->eval.tau_tree_json),
                       text_value(item->eval.acc_json));
        break;
    case ITEM_CHECKPOINT:
        rc = RUN_BOUND(s, STMT_CHECKPOINT, text_value(item->checkpoint.run_id),
                       int_value(item->checkpoint.step), text_value(item->checkpoint.path),
                       int_value(item->checkpoint.bytes), int_value(item->checkpoint.ts_ms));
        break;
    case ITEM_RUN_CREATE: {
        const run_request *q = item->run;
        rc = RUN_BOUND(s, STMT_RUN_CREATE, text_value(q->run_id), text_value(q->name ? q->name : ""),
                       text_value(q->config_json), int_value(q->created_ms), int_value(q->max_steps),
                       text_value(ddt_run_state_name(DDT_RUN_QUEUED)));
        if (rc == SQLITE_OK && sqlite3_changes(s->db) == 0)
            *result = -EEXIST;
        break;
    }
    case ITEM_RUN_UPDATE: {
        const run_request *q = item->run;
        rc = RUN_BOUND(s, STMT_RUN_UPDATE, text_value(q->run_id), text_value(q->state), int_value(q->step),
                       int_value(q->now_ms), optional_value(q->last_checkpoint_step),
                       optional_value(q->started_ms), optional_value(q->finished_ms), text_value(q->error));
        if (rc == SQLITE_OK && sqlite3_changes(s->db) == 0)
            *result = -ENOENT;
        break;
    }
    case ITEM_RUN_TRANSITION:
        rc = write_transition(s, item->run, result);
        break;
    case ITEM_FLUSH:
        break;
    }
    if (rc != SQLITE_OK)
        *result = ddt_store_errno_of(rc);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The writer: batches
 */

static void log_item_failure(ddt_store *s, const store_item *item)
{
    if (s->batch_logged++ >= LOG_FAILURES_PER_BATCH)
        return;   /* a full disk fails every item: the summary line counts the rest */
    const char *id = NULL;   /* the item's run, and its step where it has one */
    const int64_t *step_of = NULL;
    switch (item->kind) {
    case ITEM_STEP:
        id = item->step.run_id;
        step_of = &item->step.step;
        break;
    case ITEM_EVENT:
        id = item->event.run_id;
        break;
    case ITEM_EVAL:
        id = item->eval.run_id;
        step_of = &item->eval.step;
        break;
    case ITEM_CHECKPOINT:
        id = item->checkpoint.run_id;
        step_of = &item->checkpoint.step;
        break;
    case ITEM_RUN_CREATE:
    case ITEM_RUN_UPDATE:
    case ITEM_RUN_TRANSITION:
        id = item->run->run_id;
        break;
    case ITEM_FLUSH:
        break;
    }
    char run_id[64] = "", step[32] = "";
    copy_quotable(run_id, sizeof run_id, id);   /* NULL: "" */
    if (step_of)
        snprintf(step, sizeof step, " step=%lld", (long long)*step_of);
    ddt_log(DDT_LOG_ERR, "store: write failed, record lost kind=%s run_id=\"%s\"%s error=\"%s\" hint=\"%s\"",
              item_names[item->kind], run_id, step, s->why, failure_hint(s->why_code));
}

static void rollback_if_open(ddt_store *s)
{
    /* some errors (SQLITE_FULL, IOERR, BUSY, NOMEM) have rolled the transaction back already */
    if (!sqlite3_get_autocommit(s->db) && run_stmt(s, s->stmt[STMT_ROLLBACK]) != SQLITE_OK)
        ddt_log(DDT_LOG_ERR, "store: rollback failed error=\"%s\" hint=\"%s\"", s->why, failure_hint(s->why_code));
}

/* every item of the batch answered with rc, after BEGIN or COMMIT failed (one log line) */
static void fail_batch(ddt_store *s, int n, const char *what)
{
    ddt_log(DDT_LOG_ERR, "store: %s failed, records lost items=%d error=\"%s\" hint=\"%s\"", what, n, s->why,
              failure_hint(s->why_code));
    int rc = ddt_store_errno_of(s->why_code ? s->why_code : SQLITE_ERROR);
    for (int i = 0; i < n; i++)
        s->results[i] = rc;
    s->batch_logged = n;
}

/* one item in its own transaction (the replay of a failed batch) */
static void write_alone(ddt_store *s, int i)
{
    const store_item *item = &s->batch[i];
    if (item->kind == ITEM_FLUSH) {
        s->results[i] = 0;
        return;
    }
    int rc = run_stmt(s, s->stmt[STMT_BEGIN]);
    if (rc == SQLITE_OK) {
        rc = write_item(s, item, &s->results[i]);
        if (rc == SQLITE_OK)
            rc = run_stmt(s, s->stmt[STMT_COMMIT]);
        if (rc != SQLITE_OK)
            rollback_if_open(s);
    }
    if (rc != SQLITE_OK) {
        s->results[i] = ddt_store_errno_of(rc);
        log_item_failure(s, item);
    }
}

/* s->batch[0..n) written, s->results[] filled */
static void write_batch(ddt_store *s, int n)
{
    s->batch_logged = 0;
    if (run_stmt(s, s->stmt[STMT_BEGIN]) != SQLITE_OK) {
        fail_batch(s, n, "begin");
        return;
    }
    int failed = 0;
    for (int i = 0; i < n && !failed; i++)
        failed = write_item(s, &s->batch[i], &s->results[i]) != SQLITE_OK;
    if (!failed) {
        if (run_stmt(s, s->stmt[STMT_COMMIT]) == SQLITE_OK)
            return;
        rollback_if_open(s);
        fail_batch(s, n, "commit");
        return;
    }
    /* an item failed: nothing of the batch is kept; again one item at a time, so that only
     * the failing items are lost (and each is logged) */
    rollback_if_open(s);
    for (int i = 0; i < n; i++)
        write_alone(s, i);
    if (s->batch_logged > LOG_FAILURES_PER_BATCH)
        ddt_log(DDT_LOG_ERR, "store: more records lost in this batch, not logged one by one failed=%d items=%d",
                  s->batch_logged - LOG_FAILURES_PER_BATCH, n);
}

static void *writer_main(void *arg)
{
    ddt_store *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->lock);
        while (s->count == 0 && !s->stopping)
            pthread_cond_wait(&s->not_empty, &s->lock);
        if (s->count == 0) {   /* stopping, and everything written */
            pthread_mutex_unlock(&s->lock);
            break;
        }
        int n = s->count < BATCH_MAX ? s->count : BATCH_MAX;
        for (int i = 0; i < n; i++)
            s->batch[i] = s->queue[(s->head + i) % QUEUE_CAPACITY];
        s->head = (s->head + n) % QUEUE_CAPACITY;
        s->count -= n;
        pthread_cond_broadcast(&s->not_full);
        pthread_mutex_unlock(&s->lock);

        write_batch(s, n);

        /* answers, in queue order: a flush counts the failures of everything before it */
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < n; i++) {
            store_item *item = &s->batch[i];
            if (item->kind == ITEM_FLUSH) {
                item->flush->rc = s->failures ? -EIO : 0;
                item->flush->done = 1;
                s->failures = 0;
            } else if (item_is_sync(item->kind)) {
                item->run->answer.rc = s->results[i];
                item->run->answer.done = 1;
            } else if (s->results[i] != 0) {
                s->failures++;
            }
        }
        pthread_cond_broadcast(&s->answered);
        pthread_mutex_unlock(&s->lock);
        for (int i = 0; i < n; i++)
            item_free(&s->batch[i]);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Producers
 */

static void enqueue(ddt_store *s, const store_item *item)
{
    pthread_mutex_lock(&s->lock);
    while (s->count == QUEUE_CAPACITY)   /* back-pressure: wait for the writer, never drop */
        pthread_cond_wait(&s->not_full, &s->lock);
    s->queue[(s->head + s->count) % QUEUE_CAPACITY] = *item;
    s->count++;
    pthread_cond_signal(&s->not_empty);
    pthread_mutex_unlock(&s->lock);
}

/* enqueues item and waits for the writer's answer (after the commit of its batch) */
static int enqueue_and_wait(ddt_store *s, const store_item *item, sync_answer *answer)
{
    enqueue(s, item);
    pthread_mutex_lock(&s->lock);
    while (!answer->done)
        pthread_cond_wait(&s->answered, &s->lock);
    pthread_mutex_unlock(&s->lock);
    return answer->rc;
}

/* an owned copy of text (NULL stays NULL); 0, or -ENOMEM */
static int copy_text(char **out, const char *text)
{
    *out = NULL;
    if (!text)
        return 0;
    *out = strdup(text);
    return *out ? 0 : -ENOMEM;
}

/* Queues an item that owns copies of the caller's strings; when a copy failed (copy_failed)
 * the record cannot even be queued: freed, logged, and reported by the next flush. */
static void enqueue_copied(ddt_store *s, store_item *item, const char *run_id, int copy_failed)
{
    if (!copy_failed) {
        enqueue(s, item);
        return;
    }
    item_free(item);
    char quoted[64];
    copy_quotable(quoted, sizeof quoted, run_id);
    ddt_log(DDT_LOG_ERR, "store: no memory to queue a record, record lost kind=%s run_id=\"%s\" "
              "hint=\"give ddtreed more memory\"", item_names[item->kind], quoted);
    pthread_mutex_lock(&s->lock);
    s->failures++;
    pthread_mutex_unlock(&s->lock);
}

void ddt_store_step(ddt_store *s, const ddt_step_record *r)
{
    store_item item = { .kind = ITEM_STEP, .step = *r };
    enqueue(s, &item);
}

void ddt_store_event(ddt_store *s, const char *run_id, int64_t ts_ms, const char *kind,
                     const char *detail_json)
{
    store_item item = { .kind = ITEM_EVENT };
    item.event.ts_ms = ts_ms;
    enqueue_copied(s, &item, run_id,
                   copy_text(&item.event.run_id, run_id) || copy_text(&item.event.kind, kind) ||
                       copy_text(&item.event.detail_json, detail_json));
}

void ddt_store_eval(ddt_store *s, const char *run_id, int64_t step, double tau_chain,
                    const char *tau_tree_json, const char *acc_json)
{
    store_item item = { .kind = ITEM_EVAL };
    item.eval.step = step;
    item.eval.tau_chain = tau_chain;
    enqueue_copied(s, &item, run_id,
                   copy_text(&item.eval.run_id, run_id) || copy_text(&item.eval.tau_tree_json, tau_tree_json) ||
                       copy_text(&item.eval.acc_json, acc_json));
}

void ddt_store_eval_spec(ddt_store *s, const char *run_id, int64_t step, double tau_spec,
                         const char *tau_spec_tree_json, const char *spec_json)
{
    store_item item = { .kind = ITEM_EVAL };
    item.eval.spec = 1;
    item.eval.step = step;
    item.eval.tau_chain = tau_spec;
    enqueue_copied(s, &item, run_id,
                   copy_text(&item.eval.run_id, run_id) || copy_text(&item.eval.tau_tree_json, tau_spec_tree_json) ||
                       copy_text(&item.eval.acc_json, spec_json));
}

void ddt_store_checkpoint(ddt_store *s, const char *run_id, int64_t step, const char *path,
                          int64_t bytes, int64_t ts_ms)
{
    store_item item = { .kind = ITEM_CHECKPOINT };
    item.checkpoint.step = step;
    item.checkpoint.bytes = bytes;
    item.checkpoint.ts_ms = ts_ms;
    enqueue_copied(s, &item, run_id,
                   copy_text(&item.checkpoint.run_id, run_id) || copy_text(&item.checkpoint.path, path));
}

int ddt_store_run_create(ddt_store *s, const char *run_id, const char *name,
                         const char *config_json, int64_t max_steps, int64_t created_ms)
{
    if (!run_id || !*run_id || !config_json)
        return -EINVAL;
    run_request q = { .run_id = run_id, .name = name, .config_json = config_json,
                      .max_steps = max_steps, .created_ms = created_ms };
    store_item item = { .kind = ITEM_RUN_CREATE, .run = &q };
    return enqueue_and_wait(s, &item, &q.answer);
}

int ddt_store_run_update(ddt_store *s, const char *run_id, const char *state, int64_t step,
                         int64_t last_checkpoint_step, int64_t now_ms, int64_t started_ms,
                         int64_t finished_ms, const char *error)
{
    if (!run_id)
        return -EINVAL;
    run_request q = { .run_id = run_id, .state = state, .step = step,
                      .last_checkpoint_step = last_checkpoint_step, .now_ms = now_ms,
                      .started_ms = started_ms, .finished_ms = finished_ms, .error = error };
    store_item item = { .kind = ITEM_RUN_UPDATE, .run = &q };
    return enqueue_and_wait(s, &item, &q.answer);
}

/* A transition in flight (ddt_store_run_transition_enqueue): the request the writer answers and
 * the copies of the strings it reads, freed by ddt_store_wait. */
struct ddt_store_pending {
    run_request q;
    char *run_id, *error, *detail;
};

int ddt_store_run_transition_enqueue(ddt_store *s, const char *run_id, ddt_run_state from, ddt_run_state to,
                                     int64_t step, int64_t last_checkpoint_step, int64_t ts_ms,
                                     const char *error, ddt_store_pending **pending)
{
    *pending = NULL;
    if (!run_id || !*run_id || !*ddt_run_state_name(from) || !*ddt_run_state_name(to))
        return -EINVAL;
    if (!ddt_run_transition_legal(from, to))
        return -EPERM;
    ddt_store_pending *p = calloc(1, sizeof *p);
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "state", ddt_run_state_name(to));
    cJSON_AddNumberToObject(d, "step", (double)step);
    if (error && *error)
        cJSON_AddStringToObject(d, "error", error);
    char *detail = cJSON_PrintUnformatted(d);
    cJSON_Delete(d);
    if (!p || !detail || copy_text(&p->run_id, run_id) || copy_text(&p->error, error)) {
        if (p) {
            free(p->run_id);
            free(p->error);
        }
        free(p);
        free(detail);
        return -ENOMEM;
    }
    p->detail = detail;
    p->q = (run_request){ .run_id = p->run_id, .from_state = ddt_run_state_name(from),
                          .state = ddt_run_state_name(to), .step = step,
                          .last_checkpoint_step = last_checkpoint_step, .now_ms = ts_ms, .error = p->error,
                          .detail_json = detail, .starts = to == DDT_RUN_RUNNING,
                          .finishes = ddt_run_state_final(to) };
    store_item item = { .kind = ITEM_RUN_TRANSITION, .run = &p->q };
    enqueue(s, &item);
    *pending = p;
    return 0;
}

int ddt_store_wait(ddt_store *s, ddt_store_pending *p)
{
    pthread_mutex_lock(&s->lock);
    while (!p->q.answer.done)
        pthread_cond_wait(&s->answered, &s->lock);
    pthread_mutex_unlock(&s->lock);
    int rc = p->q.answer.rc;
    free(p->run_id);
    free(p->error);
    free(p->detail);
    free(p);
    return rc;
}

int ddt_store_run_transition(ddt_store *s, const char *run_id, ddt_run_state from, ddt_run_state to,
                             int64_t step, int64_t last_checkpoint_step, int64_t ts_ms,
                             const char *error)
{
    ddt_store_pending *p;
    int rc = ddt_store_run_transition_enqueue(s, run_id, from, to, step, last_checkpoint_step, ts_ms, error, &p);
    return rc ? rc : ddt_store_wait(s, p);
}

int ddt_store_run_checkpointed(ddt_store *s, const char *run_id, int64_t step, int64_t ts_ms)
{
    return ddt_store_run_update(s, run_id, NULL, step, step, ts_ms, -1, -1, NULL);
}

void ddt_store_new_run_id(char *out, size_t len)
{
    static unsigned counter;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    struct timespec ns;
    clock_gettime(CLOCK_REALTIME, &ns);
    /* pid, nanoseconds and a counter, mixed: two processes in one second differ */
    uint64_t x = ((uint64_t)getpid() << 32) ^ (uint64_t)ns.tv_nsec ^
                 ((uint64_t)__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) << 48);
    x = ddk_rng_next(&x);
    snprintf(out, len, "r%04d%02d%02d-%02d%02d%02d-%06x", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
             tm.tm_hour, tm.tm_min, tm.tm_sec, (unsigned)(x >> 40));
}

int ddt_store_flush(ddt_store *s)
{
    sync_answer answer = { 0, 0 };
    store_item item = { .kind = ITEM_FLUSH, .flush = &answer };
    return enqueue_and_wait(s, &item, &answer);
}

int ddt_store_schema_version(void)
{
    return ddt_schema_count;
}

/* ------------------------------------------------------------------------------------------
 * Opening and closing (the checks, pragmas and migrations: store_schema.c)
 */

static void store_free(ddt_store *s)
{
    for (int j = 0; j < STMT_COUNT; j++)
        sqlite3_finalize(s->stmt[j]);   /* NULL is a no-op */
    if (s->db && sqlite3_close(s->db) != SQLITE_OK)
        ddt_log(DDT_LOG_ERR, "store: close failed path=\"%s\" error=\"%s\"", s->path ? s->path : "",
                  sqlite3_errmsg(s->db));
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->not_empty);
    pthread_cond_destroy(&s->not_full);
    pthread_cond_destroy(&s->answered);
    free(s->queue);
    free(s->batch);
    free(s->results);
    free(s->path);
    free(s);
}

int ddt_store_open(const char *path, ddt_store **out, char *err, size_t err_len)
{
    *out = NULL;
    if (err && err_len)
        err[0] = '\0';
    if (!path)
        return ddt_fail_path(err, err_len, -EINVAL, "(null)", "no database path given");
    int rc = ddt_store_check_parent(path, err, err_len);
    if (rc)
        return rc;

    ddt_store *s = calloc(1, sizeof *s);
    if (!s)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "no memory for the store");
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->not_empty, NULL);
    pthread_cond_init(&s->not_full, NULL);
    pthread_cond_init(&s->answered, NULL);
    s->queue = calloc(QUEUE_CAPACITY, sizeof *s->queue);
    s->batch = calloc(BATCH_MAX, sizeof *s->batch);
    s->results = calloc(BATCH_MAX, sizeof *s->results);
    s->path = strdup(path);
    if (!s->queue || !s->batch || !s->results || !s->path) {
        store_free(s);
        return ddt_fail_path(err, err_len, -ENOMEM, path, "no memory for the store's queue");
    }

    /* NOMUTEX: the connection is used by one thread at a time (this one, then the writer) */
    int sq = sqlite3_open_v2(path, &s->db,
                             SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
    if (sq != SQLITE_OK) {
        int e = s->db ? sqlite3_system_errno(s->db) : ENOMEM;
        rc = ddt_fail_path(err, err_len, e ? -e : ddt_store_errno_of(sq), path, "cannot open: %s (check the "
                       "permissions of the file and its directory)",
                       s->db ? sqlite3_errmsg(s->db) : "no memory");
        store_free(s);
        return rc;
    }
    sqlite3_extended_result_codes(s->db, 1);
    sqlite3_busy_timeout(s->db, BUSY_TIMEOUT_MS);   /* before the WAL pragma, which may wait */

    int version = 0;
    rc = ddt_store_check_version(s->db, path, &version, err, err_len);
    if (rc) {
        /* a refused database stays as it was: no checkpoint of someone else's WAL on close */
        sqlite3_db_config(s->db, SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1, (int *)NULL);
        store_free(s);
        return rc;
    }
    rc = ddt_store_set_pragmas(s->db, path, err, err_len);
    if (!rc)
        rc = ddt_store_migrate(s->db, path, version, err, err_len);
    for (int j = 0; j < STMT_COUNT && !rc; j++) {
        sq = sqlite3_prepare_v3(s->db, stmt_sql[j], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[j], NULL);
        if (sq != SQLITE_OK)
            rc = ddt_fail_path(err, err_len, -EINVAL, path, "the schema lacks what this ddtreed "
                           "writes (%s): restore a ddtreed that matches it", sqlite3_errmsg(s->db));
    }
    if (!rc && (sq = pthread_create(&s->writer, NULL, writer_main, s)) != 0)
        rc = ddt_fail_path(err, err_len, -sq, path, "cannot start the store's writer thread: %s",
                       strerror(sq));
    if (rc) {
        store_free(s);
        return rc;
    }
    s->writer_started = 1;
    *out = s;
    return 0;
}

void ddt_store_close(ddt_store *s)
{
    if (!s)
        return;
    if (s->writer_started) {
        pthread_mutex_lock(&s->lock);
        s->stopping = 1;
        pthread_cond_signal(&s->not_empty);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->writer, NULL);   /* it writes everything queued before it exits */
    }
    if (s->failures)
        ddt_log(DDT_LOG_WARNING, "store: closed with records lost since the last flush path=\"%s\" lost=%lld "
                  "hint=\"see the errors above\"", s->path, (long long)s->failures);
    store_free(s);
}
