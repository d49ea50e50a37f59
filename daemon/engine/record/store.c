/* store.c: the SQLite store of API.md ("SQLite"), see store.h.
 *
 * One connection writes, and only the writer thread uses it once ddt_store_open has returned.
 * Producers (trainer threads, the run manager) put fixed-size items into a bounded ring
 * (QUEUE_CAPACITY); a full ring blocks the producer (back-pressure: records are never dropped).
 * The writer takes everything queued, up to BATCH_MAX items, and writes it in one
 * BEGIN IMMEDIATE transaction with persistent prepared statements. When an item's statement
 * fails, the batch is rolled back and written again one item per transaction, so that only the
 * bad item is lost and its failure is logged with its run and step. A database locked by another
 * process (a DB browser, a backup, a script holding BEGIN IMMEDIATE), a full file system or an
 * I/O error is waited out, as long as it takes, batch and all (the store is degraded meanwhile:
 * ddt_store_get_health, which the trainer's callers read to pause their runs); a full ring holds the
 * producers, and nothing is dropped. Synchronous calls (run
 * create / update, flush) travel through the same ring and wait for the answer of the writer,
 * which comes after the commit; items are answered in queue order, so a flush answers for
 * everything enqueued before it. A failed item is reported by the first flush answered after
 * it (-EIO), and logged to stderr as one line: "<3>store: ... key=value ...".
 *
 * Opening: busy_timeout (5 s) is set before the WAL pragma; store_schema.c's checks, pragmas
 * and migrations (store_schema.h) bring the database to the newest schema, then the writer's
 * statements are prepared and the writer thread (store_writer.c) started.
 *
 * Values: a NaN double is stored as NULL (SQLite's rule); run_update's NULL or negative optional
 * fields leave the column as it is, and an error of "" clears the column (a resumed run).
 *
 * A run's state: ddt_store_run_transition checks (from, to) against run_state.h's table before
 * anything is queued, then one item of the ring carries the row's update and its "state"
 * event, so the batch (or, replayed, its own transaction) writes both or neither; the update
 * matches the row only in state `from`, and without a match no event is written. The run manager
 * enqueues under its lock (ddt_store_run_transition_enqueue: the order of its changes is the
 * queue's) and waits for the answer (ddt_store_wait) after releasing it; while the store is
 * degraded the wait returns at once and the write stays queued, committed in its order later.
 *
 * Not here: reading (the HTTP handlers and tools open their own connections), deciding what a
 * run does while the store is degraded (the run manager and `ddtreed train` pause it), deleting runs or old checkpoints, the schema and its migrations (store_schema.c), the writer
 * thread and its batches (store_writer.c).
 *
 * Tested by tests/engine/record/test_store.c and tests/engine/run/test_run_state.c (every transition).
 */
#include "ddk_rng.h"
#include "base/ddt_time.h"
#include "base/errors.h"
#include "store.h"
#include "store_impl.h"
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
    ddt_store_item_free(item);
    char quoted[64];
    ddt_store_copy_quotable(quoted, sizeof quoted, run_id);
    ddt_log(DDT_LOG_ERR, "store: no memory to queue a record, record lost kind=%s run_id=\"%s\" "
              "hint=\"give ddtreed more memory\"", ddt_store_item_names[item->kind], quoted);
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

void ddt_store_event_object(ddt_store *s, const char *run_id, int64_t ts_ms, const char *kind, cJSON *detail)
{
    char *text = detail ? cJSON_PrintUnformatted(detail) : NULL;
    if (text)
        ddt_store_event(s, run_id, ts_ms, kind, text);
    free(text);
    cJSON_Delete(detail);
}

/* an eval row's teacher-forced columns (spec 0) or its speculative ones (spec 1) */
static void enqueue_eval(ddt_store *s, const char *run_id, int64_t step, double tau, const char *tree_json,
                         const char *per_json, const char *unary_json, int spec)
{
    store_item item = { .kind = ITEM_EVAL };
    item.eval.spec = spec;
    item.eval.step = step;
    item.eval.tau_chain = tau;
    enqueue_copied(s, &item, run_id,
                   copy_text(&item.eval.run_id, run_id) || copy_text(&item.eval.tau_tree_json, tree_json) ||
                       copy_text(&item.eval.acc_json, per_json) || copy_text(&item.eval.unary_json, unary_json));
}

void ddt_store_eval(ddt_store *s, const char *run_id, int64_t step, double tau_chain,
                    const char *tau_tree_json, const char *acc_json, const char *unary_json)
{
    enqueue_eval(s, run_id, step, tau_chain, tau_tree_json, acc_json, unary_json, 0);
}

void ddt_store_eval_spec(ddt_store *s, const char *run_id, int64_t step, double tau_spec,
                         const char *tau_spec_tree_json, const char *spec_json)
{
    enqueue_eval(s, run_id, step, tau_spec, tau_spec_tree_json, spec_json, NULL, 1);
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

/* Waits for a's answer unless the store is degraded: 1 when answered (the caller frees what
 * holds a); 0 when left to the writer, which answers it later and frees it then (abandoned). */
static int wait_unless_degraded(ddt_store *s, sync_answer *a)
{
    pthread_mutex_lock(&s->lock);
    while (!a->done && !s->degraded)
        pthread_cond_wait(&s->answered, &s->lock);
    int answered = a->done;
    a->abandoned = !answered;
    pthread_mutex_unlock(&s->lock);
    return answered;
}

int ddt_store_wait(ddt_store *s, ddt_store_pending *p)
{
    if (!wait_unless_degraded(s, &p->q.answer))
        return -EINPROGRESS;   /* kept in the queue: the writer writes it, then frees it */
    int rc = p->q.answer.rc;
    ddt_store_pending_free(p);
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

void ddt_store_get_health(ddt_store *s, ddt_store_health *h)
{
    pthread_mutex_lock(&s->lock);
    *h = (ddt_store_health){ .degraded = s->degraded, .since_ms = s->degraded ? s->degraded_since_ms : 0,
                             .queued = s->count, .capacity = QUEUE_CAPACITY, .lock_waits = s->lock_waits };
    snprintf(h->cause, sizeof h->cause, "%s", s->degraded ? s->cause : "");
    pthread_mutex_unlock(&s->lock);
}

int ddt_store_commit_queued(ddt_store *s)
{
    sync_answer *answer = calloc(1, sizeof *answer);
    if (!answer)
        return -ENOMEM;
    store_item item = { .kind = ITEM_FLUSH, .flush = answer };
    enqueue(s, &item);
    if (!wait_unless_degraded(s, answer))
        return -EINPROGRESS;   /* kept in the queue: the writer answers it, then frees it */
    int rc = answer->rc;
    free(answer);
    return rc;
}

int ddt_store_flush(ddt_store *s)
{
    sync_answer answer = { 0 };
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
        sq = sqlite3_prepare_v3(s->db, ddt_store_stmt_sql[j], -1, SQLITE_PREPARE_PERSISTENT, &s->stmt[j], NULL);
        if (sq != SQLITE_OK)
            rc = ddt_fail_path(err, err_len, -EINVAL, path, "the schema lacks what this ddtreed "
                           "writes (%s): restore a ddtreed that matches it", sqlite3_errmsg(s->db));
    }
    if (!rc && (sq = pthread_create(&s->writer, NULL, ddt_store_writer_main, s)) != 0)
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
        s->stopping_since_s = ddt_mono_s();
        pthread_cond_signal(&s->not_empty);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->writer, NULL);   /* it writes everything queued before it exits */
    }
    if (s->failures)
        ddt_log(DDT_LOG_WARNING, "store: closed with records lost since the last flush path=\"%s\" lost=%lld "
                  "hint=\"see the errors above\"", s->path, (long long)s->failures);
    store_free(s);
}
