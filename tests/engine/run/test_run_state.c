/* test_run_state.c: the run lifecycle of daemon/engine/run/run_state.h through its one writer,
 * ddt_store_run_transition (daemon/engine/record/store.c).
 *
 * Every (from, to) pair of the 8 states, each on a run of its own put in `from` by the
 * fixture writer (ddt_store_run_update): a legal pair, by the matrix below (written from the
 * diagram, not from the table, so that a wrong table fails here), is answered 0 and found in
 * the SQLite file (read back through store_read.c): the row's state, step, updated_ms,
 * last_checkpoint_step, started_ms (set when it first runs), finished_ms (final states), error,
 * and exactly one "state" event {"state": to, "step": step} (with "error" into failed); an
 * illegal pair is answered -EPERM and leaves the row and the events as they were. Also: a
 * walk through the lifecycle writes its events in order; a row that is not in `from` (-ESTALE)
 * and an unknown run (-ENOENT) write nothing; a transition whose event the database refuses
 * leaves the row as it was (one transaction); the two halves (ddt_store_run_transition_enqueue,
 * ddt_store_wait) write many legs enqueued at once in order; the names are API.md's (which /metrics labels
 * with too) and parse back; the final states are completed, failed and
 * cancelled; the store's run ids read "rYYYYMMDD-HHMMSS-xxxxxx" (UTC now) and differ.
 *
 * Fixtures live in a mkdtemp directory under /tmp, removed at the end.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "metrics.h"
#include "run/run_state.h"
#include "record/store.h"
#include "record/store_read.h"

#include <cjson/cJSON.h>
#include <sqlite3.h>

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static char tmp_dir[] = "/tmp/ddtree_test_run_state.XXXXXX";

enum { Q = DDT_RUN_QUEUED, R = DDT_RUN_RUNNING, PG = DDT_RUN_PAUSING, PD = DDT_RUN_PAUSED,
       C = DDT_RUN_COMPLETED, F = DDT_RUN_FAILED, X = DDT_RUN_CANCELLED, I = DDT_RUN_INTERRUPTED,
       N = DDT_RUN_STATE_COUNT };

/* legal[from][to], from the diagram of run_state.h */
static const int legal[N][N] = {
    /*          Q  R  PG PD C  F  X  I */
    /* Q  */ { 0, 1, 0, 0, 0, 1, 1, 0 },   /* start; cannot start; cancel */
    /* R  */ { 0, 0, 1, 1, 1, 1, 1, 1 },   /* pause; stop-after; last step; fails; cancel; shutdown */
    /* PG */ { 0, 1, 0, 1, 1, 1, 1, 1 },   /* resume; boundary; last step; fails; cancel; shutdown */
    /* PD */ { 1, 1, 0, 0, 0, 0, 1, 1 },   /* resume (no worker); resume; cancel; shutdown of a held run */
    /* C  */ { 0, 0, 0, 0, 0, 0, 0, 0 },
    /* F  */ { 0, 0, 0, 0, 0, 0, 0, 0 },
    /* X  */ { 0, 0, 0, 0, 0, 0, 0, 0 },
    /* I  */ { 1, 1, 0, 0, 0, 1, 1, 0 },   /* resume; start; cannot start; cancel */
};

/* what each pair's run holds before its transition (the fixture) and is given by it */
enum { BEFORE_STEP = 3, BEFORE_MS = 2000, STEP = 7, CHECKPOINT_STEP = 5 };
static const char failure[] = "a step failed: \"out of memory\" at chunk 512";

/* ------------------------------------------------------------------------------------------
 * Helpers
 */

static ddt_store *open_store(const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", tmp_dir, name);
    char err[512] = "";
    ddt_store *s = NULL;
    int rc = ddt_store_open(path, &s, err, sizeof err);
    check(rc == 0 && s, "ddt_store_open(%s) = %d: %s", path, rc, err);
    return rc == 0 ? s : NULL;
}

/* a new run `id` in state `state` at BEFORE_STEP, updated BEFORE_MS, nothing else set */
static int put_run(ddt_store *s, const char *id, ddt_run_state state)
{
    int rc = ddt_store_run_create(s, id, "t", "{}", 10, 1000);
    if (!rc)
        rc = ddt_store_run_update(s, id, ddt_run_state_name(state), BEFORE_STEP, -1, BEFORE_MS, -1, -1, NULL);
    check(rc == 0, "fixture run %s in %s: %d", id, ddt_run_state_name(state), rc);
    return rc;
}

/* run id's row as store_read.c reads it from the file: 1 when found */
static int read_row(const char *db, const char *id, ddt_run_row *out)
{
    ddt_run_row *rows = NULL;
    int count = 0, found = 0;
    char err[512];
    int rc = ddt_store_read_runs(db, &rows, &count, err, sizeof err);
    check(rc == 0, "ddt_store_read_runs: %s", err);
    for (int i = 0; rc == 0 && i < count && !found; i++)
        if (!strcmp(rows[i].id, id)) {
            *out = rows[i];
            out->config_json = NULL;
            out->error = rows[i].error ? strdup(rows[i].error) : NULL;
            found = 1;
        }
    ddt_store_free_runs(rows, count);
    return found;
}

/* run id's events, {"events": [...]}, as GET /runs/{id}/events answers them (cJSON_Delete) */
static cJSON *read_events(const char *db, const char *id)
{
    char *text = NULL, err[512];
    size_t len = 0;
    int rc = ddt_store_read_events(db, id, 0, 1000, &text, &len, err, sizeof err);
    check(rc == 0, "ddt_store_read_events(%s): %s", id, err);
    cJSON *o = rc == 0 ? cJSON_Parse(text) : NULL;
    free(text);
    cJSON *events = cJSON_GetObjectItemCaseSensitive(o, "events");
    if (!cJSON_IsArray(events)) {
        check(0, "the events of %s are not {\"events\": [...]}", id);
        cJSON_Delete(o);
        return cJSON_CreateArray();
    }
    cJSON_DetachItemViaPointer(o, events);
    cJSON_Delete(o);
    return events;
}

static const char *string_of(const cJSON *o, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void test_names(void)
{
    static const char *const api[N] = { "queued", "running", "pausing", "paused", "completed",
                                        "failed", "cancelled", "interrupted" };
    for (int s = 0; s < N; s++) {
        ddt_run_state back = DDT_RUN_STATE_COUNT;
        check(!strcmp(ddt_run_state_name((ddt_run_state)s), api[s]), "state %d is named %s, not %s", s,
              ddt_run_state_name((ddt_run_state)s), api[s]);
        check(ddt_run_state_parse(api[s], &back) == 0 && back == (ddt_run_state)s, "%s parses to %d",
              api[s], (int)back);
        check(ddt_run_state_final((ddt_run_state)s) == (s == C || s == F || s == X),
              "%s final: %d", api[s], ddt_run_state_final((ddt_run_state)s));
    }
    ddt_run_state left = DDT_RUN_PAUSED;
    check(ddt_run_state_parse("Running", &left) == -EINVAL && left == DDT_RUN_PAUSED,
          "a name in another case is a state");
    check(ddt_run_state_parse(NULL, &left) == -EINVAL, "NULL is a state");
    check(!*ddt_run_state_name(DDT_RUN_STATE_COUNT), "a value past the states has a name");
}

/* the pair (from, to) on run "from-to" of s: answered, written or not, as legal[][] says */
static void check_pair(ddt_store *s, const char *db, int from, int to, int64_t ts)
{
    const char *f = ddt_run_state_name((ddt_run_state)from), *t = ddt_run_state_name((ddt_run_state)to);
    char id[40];
    snprintf(id, sizeof id, "%s-%s", f, t);
    if (put_run(s, id, (ddt_run_state)from))
        return;
    int is_legal = legal[from][to];
    check(ddt_run_transition_legal((ddt_run_state)from, (ddt_run_state)to) == is_legal,
          "the table says %s -> %s is %s", f, t, is_legal ? "illegal" : "legal");
    int rc = ddt_store_run_transition(s, id, (ddt_run_state)from, (ddt_run_state)to, STEP, CHECKPOINT_STEP,
                                      ts, to == F ? failure : NULL);
    check(rc == (is_legal ? 0 : -EPERM), "%s -> %s answered %d, not %d", f, t, rc, is_legal ? 0 : -EPERM);

    ddt_run_row row;
    if (!read_row(db, id, &row)) {
        check(0, "%s -> %s: no row", f, t);
        return;
    }
    int wrote = is_legal;
    int final = to == C || to == F || to == X;
    check(!strcmp(row.state, wrote ? t : f), "%s -> %s: the row is %s", f, t, row.state);
    check(row.step == (wrote ? STEP : BEFORE_STEP) && row.updated_ms == (wrote ? ts : BEFORE_MS) &&
              row.last_checkpoint_step == (wrote ? CHECKPOINT_STEP : -1),
          "%s -> %s: step %lld, updated_ms %lld, last_checkpoint_step %lld", f, t, (long long)row.step,
          (long long)row.updated_ms, (long long)row.last_checkpoint_step);
    check(row.started_ms == (wrote && to == R ? ts : -1) && row.finished_ms == (wrote && final ? ts : -1),
          "%s -> %s: started_ms %lld, finished_ms %lld", f, t, (long long)row.started_ms,
          (long long)row.finished_ms);
    check(wrote && to == F ? row.error && !strcmp(row.error, failure) : !row.error, "%s -> %s: error %s", f, t,
          row.error ? row.error : "NULL");
    free(row.error);

    cJSON *events = read_events(db, id);
    int count = cJSON_GetArraySize(events);
    check(count == wrote, "%s -> %s: %d events, not %d", f, t, count, wrote);
    const cJSON *e = cJSON_GetArrayItem(events, 0), *detail = cJSON_GetObjectItemCaseSensitive(e, "detail");
    const cJSON *ts_ms = cJSON_GetObjectItemCaseSensitive(e, "ts_ms");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(detail, "step");
    if (wrote && e) {
        const char *kind = string_of(e, "kind"), *state = string_of(detail, "state"), *error = string_of(detail, "error");
        check(kind && !strcmp(kind, "state") && cJSON_IsNumber(ts_ms) && ts_ms->valuedouble == (double)ts,
              "%s -> %s: the event is of kind %s at %g", f, t, kind ? kind : "?",
              cJSON_IsNumber(ts_ms) ? ts_ms->valuedouble : -1.0);
        check(state && !strcmp(state, t) && cJSON_IsNumber(step) && step->valuedouble == STEP,
              "%s -> %s: the event says %s at step %g", f, t, state ? state : "?",
              cJSON_IsNumber(step) ? step->valuedouble : -1.0);
        check(to == F ? error && !strcmp(error, failure) : !cJSON_GetObjectItemCaseSensitive(detail, "error"),
              "%s -> %s: the event's error is %s", f, t, error ? error : "absent");
        check(cJSON_GetArraySize(detail) == 2 + (to == F), "%s -> %s: the event has %d fields", f, t,
              cJSON_GetArraySize(detail));
    }
    cJSON_Delete(events);
}

static void test_every_pair(void)
{
    char db[300];
    ddt_store *s = open_store("pairs.db", db, sizeof db);
    if (!s)
        return;
    int legal_count = 0;
    for (int from = 0; from < N; from++)
        for (int to = 0; to < N; to++) {
            check_pair(s, db, from, to, 10000 + from * N + to);
            legal_count += legal[from][to];
        }
    check(legal_count == DDT_RUN_TRANSITION_COUNT, "the diagram has %d transitions, the table %d", legal_count,
          (int)DDT_RUN_TRANSITION_COUNT);
    check(ddt_store_flush(s) == 0, "a refused transition made flush fail");
    ddt_store_close(s);
}

/* a store (file name) holding one queued run, id */
static ddt_store *open_walk(const char *name, const char *id, char *db, size_t len)
{
    ddt_store *s = open_store(name, db, len);
    if (s)
        check(ddt_store_run_create(s, id, name, "{}", 10, 1000) == 0, "create");
    return s;
}

/* run id's "state" events are the states of path[1 .. legs], in order */
static void check_walk_events(const char *db, const char *id, const int *path, int legs)
{
    cJSON *events = read_events(db, id);
    check(cJSON_GetArraySize(events) == legs, "%d events for %d legs", cJSON_GetArraySize(events), legs);
    for (int i = 0; i < legs && i < cJSON_GetArraySize(events); i++) {
        const char *state = string_of(cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, i), "detail"), "state");
        check(state && !strcmp(state, ddt_run_state_name((ddt_run_state)path[i + 1])), "event %d is %s, not %s", i,
              state ? state : "?", ddt_run_state_name((ddt_run_state)path[i + 1]));
    }
    cJSON_Delete(events);
}

/* one run along the lifecycle: the events in order, started_ms the first start's */
static void test_walk(void)
{
    static const int path[] = { Q, R, PG, PD, Q, R, I, R, PG, R, C };
    enum { LEGS = sizeof path / sizeof path[0] - 1 };
    char db[300];
    ddt_store *s = open_walk("walk.db", "w", db, sizeof db);
    if (!s)
        return;
    for (int i = 0; i < LEGS; i++) {
        int rc = ddt_store_run_transition(s, "w", (ddt_run_state)path[i], (ddt_run_state)path[i + 1], i, -1,
                                          2000 + i, NULL);
        check(rc == 0, "leg %d, %s -> %s: %d", i, ddt_run_state_name((ddt_run_state)path[i]),
              ddt_run_state_name((ddt_run_state)path[i + 1]), rc);
    }
    check_walk_events(db, "w", path, LEGS);
    ddt_run_row row;
    if (read_row(db, "w", &row)) {
        check(row.started_ms == 2000 && row.finished_ms == 2000 + LEGS - 1 && !strcmp(row.state, "completed"),
              "after the walk: %s, started_ms %lld (the first start), finished_ms %lld", row.state,
              (long long)row.started_ms, (long long)row.finished_ms);
        free(row.error);
    }
    ddt_store_close(s);
}

/* the two halves (enqueue under a lock, wait after it): every leg of a walk enqueued before
 * any is waited for, from strings the caller overwrites at once, is written in order; a stale
 * leg is answered -ESTALE by its wait, an illegal one -EPERM by the enqueue, with nothing queued */
static void test_enqueued(void)
{
    static const int path[] = { Q, R, PG, PD, R, C };
    enum { LEGS = sizeof path / sizeof path[0] - 1 };
    char db[300];
    ddt_store *s = open_walk("enqueued.db", "e", db, sizeof db);
    if (!s)
        return;
    ddt_store_pending *pending[LEGS + 1];
    char id[8];
    for (int i = 0; i < LEGS; i++) {
        snprintf(id, sizeof id, "e");
        int rc = ddt_store_run_transition_enqueue(s, id, (ddt_run_state)path[i], (ddt_run_state)path[i + 1], i, -1,
                                                  2000 + i, NULL, &pending[i]);
        check(rc == 0 && pending[i], "enqueue of leg %d: %d", i, rc);
        memset(id, 'x', sizeof id - 1);   /* the store keeps its own copies */
    }
    /* a leg from a state the run will not be in when it is written */
    int rc = ddt_store_run_transition_enqueue(s, "e", DDT_RUN_QUEUED, DDT_RUN_RUNNING, 9, -1, 3000, NULL,
                                              &pending[LEGS]);
    check(rc == 0, "enqueue of the stale leg: %d", rc);
    ddt_store_pending *none = (ddt_store_pending *)&rc;
    check(ddt_store_run_transition_enqueue(s, "e", DDT_RUN_COMPLETED, DDT_RUN_RUNNING, 1, -1, 1, NULL, &none) ==
              -EPERM && none == NULL, "an illegal pair was not refused by the enqueue");
    for (int i = 0; i < LEGS; i++)
        check(ddt_store_wait(s, pending[i]) == 0, "leg %d answered non-zero", i);
    check(rc != 0 || ddt_store_wait(s, pending[LEGS]) == -ESTALE, "the stale leg was not answered -ESTALE");
    check_walk_events(db, "e", path, LEGS);
    ddt_store_close(s);
}

/* refused with nothing written: a row elsewhere than `from`, no row, bad arguments */
static void test_refused(void)
{
    char db[300];
    ddt_store *s = open_store("refused.db", db, sizeof db);
    if (!s)
        return;
    if (put_run(s, "busy", DDT_RUN_RUNNING) == 0) {
        int rc = ddt_store_run_transition(s, "busy", DDT_RUN_QUEUED, DDT_RUN_RUNNING, STEP, -1, 5000, NULL);
        check(rc == -ESTALE, "a row not in `from` gave %d, not -ESTALE", rc);
        ddt_run_row row;
        if (read_row(db, "busy", &row)) {
            check(!strcmp(row.state, "running") && row.updated_ms == BEFORE_MS && row.started_ms == -1,
                  "the stale transition changed the row: %s at %lld", row.state, (long long)row.updated_ms);
            free(row.error);
        }
    }
    int rc = ddt_store_run_transition(s, "nobody", DDT_RUN_QUEUED, DDT_RUN_RUNNING, 1, -1, 5000, NULL);
    check(rc == -ENOENT, "an unknown run gave %d, not -ENOENT", rc);
    check(ddt_store_run_transition(s, NULL, DDT_RUN_QUEUED, DDT_RUN_RUNNING, 1, -1, 1, NULL) == -EINVAL &&
              ddt_store_run_transition(s, "busy", DDT_RUN_STATE_COUNT, DDT_RUN_RUNNING, 1, -1, 1, NULL) == -EINVAL &&
              ddt_store_run_transition(s, "busy", DDT_RUN_RUNNING, (ddt_run_state)-1, 1, -1, 1, NULL) == -EINVAL,
          "bad arguments are not -EINVAL");
    cJSON *events = read_events(db, "busy"), *none = read_events(db, "nobody");
    check(cJSON_GetArraySize(events) == 0 && cJSON_GetArraySize(none) == 0, "a refused transition wrote an event");
    cJSON_Delete(events);
    cJSON_Delete(none);
    check(ddt_store_flush(s) == 0, "a refused transition made flush fail");
    ddt_store_close(s);
}

/* the event refused by the database (a trigger of the test's): the row's update goes with it */
static void test_one_transaction(void)
{
    char db[300], log_path[320];
    ddt_store *s = open_store("atomic.db", db, sizeof db);
    if (!s || put_run(s, "atomic", DDT_RUN_QUEUED)) {
        ddt_store_close(s);
        return;
    }
    sqlite3 *side = NULL;
    int sq = sqlite3_open(db, &side);
    if (sq == SQLITE_OK)
        sqlite3_busy_timeout(side, 5000);
    if (sq == SQLITE_OK)
        sq = sqlite3_exec(side, "CREATE TRIGGER refuse_events BEFORE INSERT ON events WHEN NEW.run_id = 'atomic' "
                                "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END", NULL, NULL, NULL);
    check(sq == SQLITE_OK, "the test's trigger: %s", side ? sqlite3_errmsg(side) : "no memory");
    sqlite3_close(side);

    snprintf(log_path, sizeof log_path, "%s/stderr.log", tmp_dir);
    fflush(stderr);
    int saved = dup(2), log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(log_fd, 2);
    close(log_fd);
    int rc = ddt_store_run_transition(s, "atomic", DDT_RUN_QUEUED, DDT_RUN_RUNNING, STEP, -1, 5000, NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);

    check(rc < 0, "a transition whose event was refused answered %d", rc);
    ddt_run_row row;
    if (read_row(db, "atomic", &row)) {
        check(!strcmp(row.state, "queued") && row.updated_ms == BEFORE_MS && row.started_ms == -1,
              "the row changed without its event: %s at %lld", row.state, (long long)row.updated_ms);
        free(row.error);
    }
    FILE *log = fopen(log_path, "r");
    char line[1024] = "";
    if (log && !fgets(line, sizeof line, log))
        line[0] = '\0';
    if (log)
        fclose(log);
    check(!strncmp(line, "<3>", 3) && strstr(line, "kind=run_transition") && strstr(line, "run_id=\"atomic\""),
          "the failure was not logged as one <3> line of the run_transition: %s", line);
    ddt_store_close(s);
}

/* the store's run ids: "rYYYYMMDD-HHMMSS-xxxxxx", UTC now, different from each other */
static void test_run_ids(void)
{
    char before[32], a[40], b[40], after[32];
    time_t t0 = time(NULL);
    ddt_store_new_run_id(a, sizeof a);
    ddt_store_new_run_id(b, sizeof b);
    time_t t1 = time(NULL);
    struct tm tm;
    strftime(before, sizeof before, "r%Y%m%d-%H%M%S-", gmtime_r(&t0, &tm));
    strftime(after, sizeof after, "r%Y%m%d-%H%M%S-", gmtime_r(&t1, &tm));
    for (const char *id = a; id; id = id == a ? b : NULL) {
        int hex = strlen(id) == 23;
        for (int j = 17; hex && j < 23; j++)
            hex = isxdigit((unsigned char)id[j]) && !isupper((unsigned char)id[j]);
        check(hex && (!strncmp(id, before, 17) || !strncmp(id, after, 17)),
              "run id %s is not %sxxxxxx (six lowercase hex digits)", id, before);
    }
    check(strcmp(a, b) != 0, "two run ids in a row are the same: %s", a);
}

/* ------------------------------------------------------------------------------------------ */

int main(void)
{
    scratch_dir(tmp_dir);
    static const test_case cases[] = {
        { "the states' names are API.md's; completed, failed, cancelled are final", test_names },
        { "every (from, to): legal ones written with their event, the others refused", test_every_pair },
        { "a walk through the lifecycle: its events in order", test_walk },
        { "a stale or unknown run, bad arguments: refused, nothing written", test_refused },
        { "enqueued, then waited for: in order, from copies; stale and illegal refused", test_enqueued },
        { "the row and its event in one transaction", test_one_transaction },
        { "run ids from the store: rYYYYMMDD-HHMMSS-xxxxxx, distinct", test_run_ids },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    remove_tree(tmp_dir);
    return cases_summary();
}
