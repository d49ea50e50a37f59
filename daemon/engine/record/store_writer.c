/* store_writer.c: the store's writer thread (store_impl.h): the items of its queue, the one
 * writer connection's statements, each item's rows, and the batches: everything taken from the
 * ring, up to BATCH_MAX items, written in one BEGIN IMMEDIATE transaction; a database that cannot
 * be written for a cause not of the items (its file system full, another process's write lock,
 * an I/O error) waited out, the batch kept and tried again, the store degraded meanwhile
 * (wait_writable; never given up unless closing); a batch with an item that fails on its own
 * (a constraint: a bug of the caller) rolled back and written again one item per transaction,
 * so that only the bad item is lost, and logged with its run and step; the answers to the
 * waiting callers in queue order.
 * Tested through store.h by tests/engine/record/test_store.c and tests/engine/run/test_run_state.c.
 */
#include "store_impl.h"
#include "store_schema.h"
#include "base/ddt_time.h"
#include "base/fault.h"
#include "base/log.h"
#include "run/run_state.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------
 * Items of the queue
 */

const char *const ddt_store_item_names[] = {
    [ITEM_STEP] = "step",           [ITEM_EVENT] = "event",
    [ITEM_EVAL] = "eval",           [ITEM_CHECKPOINT] = "checkpoint",
    [ITEM_RUN_CREATE] = "run_create", [ITEM_RUN_UPDATE] = "run_update",
    [ITEM_RUN_TRANSITION] = "run_transition", [ITEM_FLUSH] = "flush", [ITEM_ANSWERED] = "answered",
};

void ddt_store_item_free(store_item *item)
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
        free(item->eval.unary_json);
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

const char *const ddt_store_stmt_sql[STMT_COUNT] = {
    [STMT_BEGIN] = "BEGIN IMMEDIATE",
    [STMT_COMMIT] = "COMMIT",
    [STMT_ROLLBACK] = "ROLLBACK",
    [STMT_STEP] =
        "INSERT OR REPLACE INTO steps (run_id, step, ts_ms, loss, ce, kl, cap, acc, lr, grad_norm,"
        " tokens, positions, step_ms, tokens_per_s, positions_per_s, peak_bytes, chunk, vocab_tile, sel,"
        " sel_acc) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,"
        " ?19, ?20)",
    [STMT_STEP_DEVICE] =
        "INSERT OR REPLACE INTO step_devices (run_id, step, device, peak_bytes, step_ms)"
        " VALUES (?1, ?2, ?3, ?4, ?5)",
    [STMT_EVENT] = "INSERT INTO events (run_id, ts_ms, kind, detail_json) VALUES (?1, ?2, ?3, ?4)",
    /* the teacher-forced columns and the speculative ones of one step's row, each written
     * without touching the other's (a speculation posted at a step evaluated before) */
    [STMT_EVAL] =
        "INSERT INTO evals (run_id, step, tau_chain, tau_tree_json, acc_json, unary_json)"
        " VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
        " ON CONFLICT (run_id, step) DO UPDATE SET tau_chain = excluded.tau_chain,"
        " tau_tree_json = excluded.tau_tree_json, acc_json = excluded.acc_json, unary_json = excluded.unary_json",
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
 * Log lines
 */

/* a value safe inside key="...": no quotes, no line breaks */
void ddt_store_copy_quotable(char *out, size_t out_len, const char *text)
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
    ddt_store_copy_quotable(s->why, sizeof s->why, sqlite3_errmsg(s->db));
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
                       int_value(r->peak_bytes), int_value(r->chunk), int_value(r->vocab_tile),
                       double_value(r->sel), double_value(r->sel_acc));   /* NaN binds as NULL */
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
        if (item->eval.spec)
            rc = RUN_BOUND(s, STMT_EVAL_SPEC, text_value(item->eval.run_id), int_value(item->eval.step),
                           double_value(item->eval.tau_chain), text_value(item->eval.tau_tree_json),
                           text_value(item->eval.acc_json));
        else
            rc = RUN_BOUND(s, STMT_EVAL, text_value(item->eval.run_id), int_value(item->eval.step),
                           double_value(item->eval.tau_chain), text_value(item->eval.tau_tree_json),
                           text_value(item->eval.acc_json), text_value(item->eval.unary_json));
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
    case ITEM_ANSWERED:
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
    case ITEM_ANSWERED:
        break;
    }
    char run_id[64] = "", step[32] = "";
    ddt_store_copy_quotable(run_id, sizeof run_id, id);   /* NULL: "" */
    if (step_of)
        snprintf(step, sizeof step, " step=%lld", (long long)*step_of);
    ddt_log(DDT_LOG_ERR, "store: write failed, record lost kind=%s run_id=\"%s\"%s error=\"%s\" hint=\"%s\"",
              ddt_store_item_names[item->kind], run_id, step, s->why, failure_hint(s->why_code));
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

/* 1 when code says another connection holds the write lock (after busy_timeout's wait) */
static int is_locked(int code)
{
    return (code & 0xff) == SQLITE_BUSY || (code & 0xff) == SQLITE_LOCKED;
}

/* 1 when code is the database's, not the item's: the file system full, a lock, an I/O error, a
 * read-only or vanished file, no memory, a damaged file. Such a failure is waited out, the batch
 * kept; any other (a constraint, a malformed record: a bug of the caller) loses the item alone. */
static int is_unwritable(int code)
{
    switch (code & 0xff) {
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_FULL:
    case SQLITE_IOERR:
    case SQLITE_READONLY:
    case SQLITE_CANTOPEN:
    case SQLITE_PERM:
    case SQLITE_NOMEM:
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
    case SQLITE_PROTOCOL:
        return 1;
    default:
        return 0;
    }
}

/* The process that holds ddtree.db's write lock, or 0 when it cannot be known: in WAL mode the
 * writer's lock is a POSIX write lock on byte 120 of the -shm file (SQLite's WAL_WRITE_LOCK),
 * which /proc/locks lists with its owner. Read there, not by F_GETLK: opening and closing the
 * -shm file here would drop every POSIX lock this process holds on it (close() releases them
 * all), SQLite's own included. */
static pid_t lock_holder(const char *db_path)
{
    char shm[1200], line[256];
    struct stat st;
    snprintf(shm, sizeof shm, "%s-shm", db_path);
    FILE *locks = stat(shm, &st) == 0 ? fopen("/proc/locks", "re") : NULL;
    pid_t pid = 0;
    while (locks && !pid && fgets(line, sizeof line, locks)) {
        /* "1: POSIX  ADVISORY  WRITE 4711 08:01:123456 120 120" (a waiter's line has "->") */
        char kind[16], mode[16], rw[16], end[24];
        long owner;
        unsigned maj, min;
        unsigned long long ino, start;
        if (!strstr(line, "->") &&
            sscanf(line, "%*d: %15s %15s %15s %ld %x:%x:%llu %llu %23s", kind, mode, rw, &owner, &maj, &min, &ino,
                   &start, end) == 9 &&
            !strcmp(kind, "POSIX") && !strcmp(rw, "WRITE") && maj == major(st.st_dev) && min == minor(st.st_dev) &&
            ino == (unsigned long long)st.st_ino && start <= 120 &&
            (!strcmp(end, "EOF") || strtoull(end, NULL, 10) >= 120) && owner != getpid())
            pid = (pid_t)owner;
    }
    if (locks)
        fclose(locks);
    return pid;
}

/* cause: what keeps code's write out, where, and what to do */
static void describe_cause(const ddt_store *s, int code, char *cause, size_t len)
{
    if (is_locked(code)) {
        pid_t pid = lock_holder(s->path);
        char who[64] = "another process";
        if (pid > 0)
            snprintf(who, sizeof who, "another process (pid %d)", (int)pid);
        snprintf(cause, len, "%s holds the write lock of %s: stop it or let it finish (only ddtreed "
                 "writes it); the records wait", who, s->path);
    } else if ((code & 0xff) == SQLITE_FULL) {
        snprintf(cause, len, "the state directory's file system is full: %s cannot grow; free "
                 "space there; the records wait", s->path);
    } else {
        snprintf(cause, len, "%s cannot be written: %s; %s; the records wait", s->path, s->why,
                 failure_hint(code));
    }
}

/* item answered now with code's errno when it is a run's create or update: its caller's strings
 * live on its stack and its answer is wanted now (a transition owns copies and stays queued) */
static void answer_if_run_request(store_item *item, int code)
{
    if (item->kind == ITEM_RUN_CREATE || item->kind == ITEM_RUN_UPDATE) {
        item->run->answer.rc = ddt_store_errno_of(code);
        item->run->answer.done = 1;
        item->kind = ITEM_ANSWERED;
    }
}

/* The writer found the database unwritable (code) writing from batch[first] on: the store
 * is degraded (said once in the log, and by ddt_store_get_health), the run creates and updates in
 * batch[first, first + count) and the ring are answered with code's errno (the API answers, refused, not held up;
 * the waiters of transitions return, their writes kept queued), then a pause before the next
 * try (none after a lock: busy_timeout waited). 0: try again; -1: give up, only when the store
 * has been closing for UNWRITABLE_GIVE_UP_STOPPING_S. */
static int wait_writable(ddt_store *s, int code, int first, int count)
{
    double now = ddt_mono_s();
    /* degraded_code is the writer's own; the cause is made outside the lock (/proc/locks) */
    const int new_cause = s->degraded_code != code;
    char cause[sizeof s->cause];
    if (new_cause)
        describe_cause(s, code, cause, sizeof cause);
    pthread_mutex_lock(&s->lock);
    int first_failure = !s->degraded;
    if (first_failure) {
        s->degraded = 1;
        s->degraded_since_s = now;
        s->degraded_since_ms = ddt_wall_ms();
        s->retry_pause_s = RETRY_PAUSE_FIRST_S;
    }
    s->degraded_code = code;
    if (new_cause)
        snprintf(s->cause, sizeof s->cause, "%s", cause);
    if (is_locked(code))
        s->lock_waits++;
    int give_up = s->stopping && now - s->stopping_since_s > UNWRITABLE_GIVE_UP_STOPPING_S;
    double pause = is_locked(code) ? 0 : s->retry_pause_s;
    if (!is_locked(code))
        s->retry_pause_s = pause * 2 < RETRY_PAUSE_LONGEST_S ? pause * 2 : RETRY_PAUSE_LONGEST_S;
    for (int i = first; i < first + count; i++)
        answer_if_run_request(&s->batch[i], code);
    for (int k = 0; k < s->count; k++)
        answer_if_run_request(&s->queue[(s->head + k) % QUEUE_CAPACITY], code);
    pthread_cond_broadcast(&s->answered);
    pthread_mutex_unlock(&s->lock);
    if (new_cause)
        ddt_log(DDT_LOG_WARNING, "store: cannot write, waiting; records are kept error=\"%s\" cause=\"%s\"", s->why,
                s->cause);
    if (give_up)
        return -1;
    if (pause > 0)
        nanosleep(&(struct timespec){ (time_t)pause, (long)((pause - (time_t)pause) * 1e9) }, NULL);
    return 0;
}

/* a commit after the store was degraded: healthy again, said in the log */
static void writable_again(ddt_store *s)
{
    pthread_mutex_lock(&s->lock);
    int was = s->degraded;
    double since = s->degraded_since_s;
    s->degraded = 0;
    s->degraded_code = 0;
    pthread_mutex_unlock(&s->lock);
    if (was)
        ddt_log(DDT_LOG_NOTICE, "store: writable again after %.0f s, the records kept are written path=\"%s\"",
                ddt_mono_s() - since, s->path);
}

/* batch[first, first + count) in one transaction: SQLITE_OK, or the failing code (s->why) with
 * *bad the item that failed (-1: BEGIN or COMMIT) and the transaction rolled back */
static int try_items(ddt_store *s, int first, int count, int *bad)
{
    *bad = -1;
    int rc = run_stmt(s, s->stmt[STMT_BEGIN]);
    for (int i = first; i < first + count && rc == SQLITE_OK; i++)
        if ((rc = write_item(s, &s->batch[i], &s->results[i])) != SQLITE_OK)
            *bad = i;
    if (rc == SQLITE_OK) {
        ddt_fault_point("store.mid_commit");   /* a test hook (base/fault.h) */
        rc = run_stmt(s, s->stmt[STMT_COMMIT]);
    }
    if (rc != SQLITE_OK)
        rollback_if_open(s);
    return rc;
}

/* batch[first, first + count) written, waiting out an unwritable database (wait_writable) as
 * long as it takes: SQLITE_OK, or the code of an item's own failure (*bad), or of giving up. */
static int write_waiting(ddt_store *s, int first, int count, int *bad)
{
    for (;;) {
        int rc = try_items(s, first, count, bad);
        if (rc == SQLITE_OK) {
            writable_again(s);
            return rc;
        }
        /* the run requests answered are the batch's from `first` to its end: those before are
         * committed (a replay one item at a time) */
        if (!is_unwritable(rc) || wait_writable(s, rc, first, s->batch_count - first))
            return rc;
    }
}

/* one item in its own transaction (the replay of a batch with a bad item) */
static void write_alone(ddt_store *s, int i)
{
    const store_item *item = &s->batch[i];
    if (item->kind == ITEM_FLUSH || item->kind == ITEM_ANSWERED) {
        s->results[i] = 0;
        return;
    }
    int bad;
    int rc = write_waiting(s, i, 1, &bad);
    if (rc != SQLITE_OK) {
        s->results[i] = ddt_store_errno_of(rc);
        log_item_failure(s, item);
    }
}

/* s->batch[0..n) written, s->results[] filled */
static void write_batch(ddt_store *s, int n)
{
    s->batch_logged = 0;
    int bad;
    int rc = write_waiting(s, 0, n, &bad);
    if (rc == SQLITE_OK)
        return;
    if (bad < 0 || is_unwritable(rc)) {   /* given up: the store is closing on an unwritable database */
        fail_batch(s, n, "write");
        return;
    }
    /* an item failed: nothing of the batch is kept; again one item at a time, so that only
     * the failing items are lost (and each is logged) */
    for (int i = 0; i < n; i++)
        write_alone(s, i);
    if (s->batch_logged > LOG_FAILURES_PER_BATCH)
        ddt_log(DDT_LOG_ERR, "store: more records lost in this batch, not logged one by one failed=%d items=%d",
                  s->batch_logged - LOG_FAILURES_PER_BATCH, n);
}

void ddt_store_pending_free(struct ddt_store_pending *p)
{
    free(p->run_id);
    free(p->error);
    free(p->detail);
    free(p);
}

void *ddt_store_writer_main(void *arg)
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

        s->batch_count = n;
        write_batch(s, n);

        struct ddt_store_pending *abandoned[BATCH_MAX];   /* transitions whose waiters left */
        int n_abandoned = 0;
        /* answers, in queue order: a flush counts the failures of everything before it */
        pthread_mutex_lock(&s->lock);
        for (int i = 0; i < n; i++) {
            store_item *item = &s->batch[i];
            if (item->kind == ITEM_FLUSH) {
                item->flush->rc = s->failures ? -EIO : 0;
                item->flush->done = 1;
                s->failures = 0;
                if (item->flush->abandoned)   /* ddt_store_commit_queued's, on the heap */
                    free(item->flush);
            } else if (item_is_sync(item->kind)) {
                item->run->answer.rc = s->results[i];
                item->run->answer.done = 1;
                if (item->kind == ITEM_RUN_TRANSITION && item->run->answer.abandoned)
                    abandoned[n_abandoned++] = (struct ddt_store_pending *)item->run;
            } else if (item->kind != ITEM_ANSWERED && s->results[i] != 0) {
                s->failures++;
            }
        }
        pthread_cond_broadcast(&s->answered);
        pthread_mutex_unlock(&s->lock);
        for (int i = 0; i < n; i++)
            ddt_store_item_free(&s->batch[i]);
        for (int i = 0; i < n_abandoned; i++)
            ddt_store_pending_free(abandoned[i]);
    }
    return NULL;
}
