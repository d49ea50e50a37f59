/* fuzz_api.c: libFuzzer target for ddtreed's HTTP/JSON API (daemon/api.h): ddt_api_handle, the
 * function the transport calls once a request's body is in, driven here without a socket.
 *
 * Input bytes -> one request:
 *   byte 0          the method: 'G' GET, 'P' POST, anything else one of PUT, DELETE, HEAD,
 *                   PATCH, OPTIONS, "" (byte % 6)
 *   up to a NUL     the path ("/runs/r-paused/rechunk"); the whole rest when there is no NUL
 *   up to a NUL     the query "k=v&k2&k3=v3" (at most 8 pairs, as the transport allows)
 *   the rest        the body, handed over as the transport does: a NUL-terminated copy
 * corpus/api/ has one seed per route (and refusals); `printf 'G/runs\0state=queued\0'` writes
 * one more.
 *
 * The run manager is real: a store (SQLite) and a ddt_runs in a mkdtemp directory under
 * $TMPDIR (or /tmp), removed at exit. It holds six runs with fixed ids, one per interesting
 * state: r-queued, r-running (marked interrupted at open, as after a crash), r-paused (a real
 * one-step checkpoint of a tiny synthetic run, so export has something to export), r-completed
 * (with step, event, eval and checkpoint records), r-failed, r-cancelled. max_parallel is 0
 * from the start (ddt_runs_open, not 1 then ddt_runs_set_parallel: a queued run would start
 * in between), so nothing ever trains: a valid POST /runs only queues.
 * A request that changes a run (201, 202, or any change in the counts by state) marks the
 * manager dirty; the next input first restores it from a copy of the database made at
 * start-up. So every input meets the same six runs (crashes reproduce from the one input;
 * coverage does not drift), and queued runs never pile up: memory stays flat however long
 * the fuzzer runs. (Only r-paused's export directory outlives a restore: each export
 * rewrites it.) FUZZ_API_FRESH=1 restores before every input; FUZZ_API_LOG=1 keeps the
 * daemon's log lines; FUZZ_API_TRACE=1 prints each request and the start of its answer (to
 * see which route a seed reaches).
 *
 * Checked for every request (a broken expectation prints and aborts: libFuzzer's crash):
 * a status in [200, 599]; a body of body_len readable bytes; a JSON body that parses, and for
 * 4xx/5xx the API.md error shape {"error": {"code", "message", "field"?}} with strings; a
 * refused request (4xx/5xx) changes no run (counts by state before and after); a 201 adds
 * exactly one queued run and sets Location /runs/<id>.
 */
#include "api.h"
#include "config.h"
#include "http.h"
#include "base/log.h"
#include "metrics.h"
#include "runs.h"
#include "record/store.h"
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void remove_state_dir(void);

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "fuzz_api: expectation failed: %s: ", #cond);   \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            remove_state_dir();                                             \
            abort();                                                        \
        }                                                                   \
    } while (0)

/* set-up failures are the harness's, not findings: say so and stop */
#define SETUP(cond, ...)                                                    \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "fuzz_api: set-up failed: ");                   \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            exit(2);                                                        \
        }                                                                   \
    } while (0)

/* ------------------------------------------------------------------------------------------
 * The daemon's state: a store and a run manager over a database restored from a template
 */

static struct {
    char dir[512];             /* the state dir: ddtree.db, template.db, runs/r-paused/ */
    char db[600], template_db[600];
    ddt_daemon_config config;
    ddt_store *store;
    ddt_runs *runs;
    ddt_api api;
    int open, dirty, fresh, trace;
} env;

/* the tiny synthetic run whose checkpoint r-paused holds (one step: well under a second) */
static const char tiny_run[] =
    "{\"name\": \"fuzz-tiny\","
    " \"target\": {\"kind\": \"synthetic\", \"hidden_size\": 16, \"num_hidden_layers\": 4,"
    "  \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8,"
    "  \"intermediate_size\": 24, \"vocab_size\": 64},"
    " \"drafter\": {\"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
    "  \"head_dim\": 8, \"intermediate_size\": 24, \"block_size\": 4},"
    " \"train\": {\"steps\": 4, \"sequences_per_step\": 1, \"seq_len\": 16, \"max_anchors\": 2,"
    "  \"heldout\": 1, \"seed\": 3},"
    " \"loss\": {\"chunk\": 8},"
    " \"checkpoint\": {\"every_steps\": 1, \"keep\": 1},"
    " \"eval\": {\"every_steps\": 2, \"sequences\": 1, \"tree_budgets\": [2]}}";

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

static void copy_file(const char *from, const char *to)
{
    FILE *in = fopen(from, "rb"), *out = fopen(to, "wb");
    SETUP(in && out, "cannot copy %s to %s", from, to);
    char block[1 << 16];
    size_t n;
    while ((n = fread(block, 1, sizeof block, in)) > 0)
        SETUP(fwrite(block, 1, n, out) == n, "cannot write %s", to);
    SETUP(!ferror(in) && fclose(out) == 0, "cannot copy %s", from);
    fclose(in);
}

/* r-paused: a real run directory with a one-step checkpoint (no store: the rows come below) */
static void train_paused_run(void)
{
    ddt_trainer *t = NULL;
    char err[1024] = "", field[160] = "";
    int rc = ddt_trainer_open(tiny_run, strlen(tiny_run), env.dir, "r-paused", 0, NULL, &t, err, sizeof err, field,
                              sizeof field);
    ddt_step_record rec;
    if (!rc)
        rc = ddt_trainer_step(t, &rec, err, sizeof err);
    if (!rc)
        rc = ddt_trainer_checkpoint(t, err, sizeof err);
    ddt_trainer_close(t);
    if (rc)   /* export then answers 409 instead of 200: less coverage, no false finding */
        fprintf(stderr, "fuzz_api: warning: no checkpoint for r-paused (%d: %s)\n", rc, err);
}

/* template.db: the six runs and their records */
static void write_template(void)
{
    ddt_store *s = NULL;
    char err[512] = "";
    SETUP(ddt_store_open(env.template_db, &s, err, sizeof err) == 0, "store %s: %s", env.template_db, err);
    static const struct { const char *id, *state, *error; int64_t step, checkpoint; } rows[] = {
        { "r-queued", "queued", NULL, 0, -1 },
        { "r-running", "running", NULL, 7, 5 },
        { "r-paused", "paused", NULL, 1, 1 },
        { "r-completed", "completed", NULL, 3, 3 },
        { "r-failed", "failed", "a step produced a NaN gradient", 2, -1 },
        { "r-cancelled", "cancelled", NULL, 0, -1 },
    };
    int64_t t0 = now_ms();
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        SETUP(ddt_store_run_create(s, rows[i].id, rows[i].id + 2, tiny_run, 4, t0) == 0, "run %s", rows[i].id);
        int done = !strcmp(rows[i].state, "completed") || !strcmp(rows[i].state, "failed") ||
                   !strcmp(rows[i].state, "cancelled");
        SETUP(ddt_store_run_update(s, rows[i].id, rows[i].state, rows[i].step, rows[i].checkpoint, t0 + 10,
                                   rows[i].step > 0 ? t0 + 1 : -1, done ? t0 + 10 : -1, rows[i].error) == 0,
              "update %s", rows[i].id);
    }
    for (int64_t step = 1; step <= 3; step++) {
        ddt_step_record r;
        memset(&r, 0, sizeof r);
        snprintf(r.run_id, sizeof r.run_id, "r-completed");
        r.step = step;
        r.ts_ms = t0 + step;
        r.loss = 5.0 / (double)step, r.ce = 4.0 / (double)step, r.kl = 0.5, r.cap = 0.0, r.acc = 0.1 * (double)step;
        r.lr = 1e-3, r.grad_norm = 1.5, r.tokens = 64, r.positions = 32, r.step_ms = 12.5;
        r.tokens_per_s = 5000, r.positions_per_s = 2500, r.peak_bytes = 1 << 20, r.chunk = 8, r.vocab_tile = 0;
        r.devices = 1;
        r.device_peak_bytes[0] = 1 << 20;
        r.device_step_ms[0] = 12.5;
        ddt_store_step(s, &r);
    }
    ddt_store_event(s, "r-completed", t0 + 1, "state", "{\"state\":\"running\",\"step\":0}");
    ddt_store_event(s, "r-completed", t0 + 2, "rechunk", "{\"chunk\":4,\"vocab_tile\":0}");
    ddt_store_event(s, "r-completed", t0 + 3, "oom_recovery", "{\"chunk\":2}");
    ddt_store_eval(s, "r-completed", 2, 1.75, "{\"2\":1.9}", "[0.5,0.25]", NULL);
    ddt_store_checkpoint(s, "r-completed", 3, "/nonexistent/ckpt-3", 4096, t0 + 4);
    ddt_store_event(s, "r-failed", t0 + 5, "error", "{\"error\":\"a step produced a NaN gradient\"}");
    SETUP(ddt_store_flush(s) == 0, "flush %s", env.template_db);
    ddt_store_close(s);
}

static void env_close(void)
{
    if (!env.open)
        return;
    ddt_runs_close(env.runs);
    ddt_store_close(env.store);
    env.runs = NULL;
    env.store = NULL;
    env.open = 0;
}

/* ddtree.db as template.db, then the store and the run manager over it */
static void env_open(void)
{
    char path[700];
    unlink(env.db);
    snprintf(path, sizeof path, "%s-wal", env.db);
    unlink(path);
    snprintf(path, sizeof path, "%s-shm", env.db);
    unlink(path);
    copy_file(env.template_db, env.db);
    snprintf(path, sizeof path, "%s-wal", env.template_db);
    if (access(path, F_OK) == 0) {
        char to[700];
        snprintf(to, sizeof to, "%s-wal", env.db);
        copy_file(path, to);
    }
    char err[512] = "";
    SETUP(ddt_store_open(env.db, &env.store, err, sizeof err) == 0, "store %s: %s", env.db, err);
    SETUP(ddt_runs_open(env.dir, env.db, env.store, 0, NULL, NULL, &env.runs, err, sizeof err) == 0,
          "run manager: %s", err);
    env.api.runs = env.runs;
    env.open = 1;
    env.dirty = 0;
}

/* on a broken expectation: the directory, nothing else (a sanitizer's report ends the process
 * without atexit: its directory stays behind, a few MB under $TMPDIR) */
static void remove_state_dir(void)
{
    if (env.dir[0])
        nftw(env.dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

static void env_teardown(void)
{
    env_close();
    remove_state_dir();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    const char *log = getenv("FUZZ_API_LOG");
    ddt_log_set_level(log && *log == '1' ? DDT_LOG_DEBUG : 0);
    const char *fresh = getenv("FUZZ_API_FRESH");
    env.fresh = fresh && *fresh == '1';
    const char *trace = getenv("FUZZ_API_TRACE");
    env.trace = trace && *trace == '1';
    const char *tmp = getenv("TMPDIR");
    snprintf(env.dir, sizeof env.dir, "%s/ddtree_fuzz_api.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    SETUP(mkdtemp(env.dir), "mkdtemp %s", env.dir);
    atexit(env_teardown);
    snprintf(env.db, sizeof env.db, "%s/ddtree.db", env.dir);
    snprintf(env.template_db, sizeof env.template_db, "%s/template.db", env.dir);
    char err[512] = "";
    SETUP(ddt_daemon_config_load(NULL, &env.config, err, sizeof err) == 0, "daemon config: %s", err);
    snprintf(env.config.state_dir, sizeof env.config.state_dir, "%s", env.dir);
    train_paused_run();
    write_template();
    env.api = (ddt_api){ .config = &env.config, .started_s = mono_s(), .http = NULL };
    snprintf(env.api.db_path, sizeof env.api.db_path, "%s", env.db);
    ddt_ui_login_limit_init(&env.api.login_limit);
    env_open();
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * One request
 */

/* the next field up to a NUL (or the end), advancing *at */
static const uint8_t *take(const uint8_t **at, const uint8_t *end, size_t *len, int *terminated)
{
    const uint8_t *start = *at, *nul = memchr(start, '\0', (size_t)(end - start));
    *len = (size_t)((nul ? nul : end) - start);
    *terminated = nul != NULL;
    *at = nul ? nul + 1 : end;
    return start;
}

static char *copy_text(const uint8_t *p, size_t n)
{
    char *s = malloc(n + 1);
    EXPECT(s, "out of memory");
    memcpy(s, p, n);
    s[n] = '\0';
    return s;
}

static int64_t total(const int64_t counts[DDT_RUN_STATE_COUNT])
{
    int64_t n = 0;
    for (int s = 0; s < DDT_RUN_STATE_COUNT; s++)
        n += counts[s];
    return n;
}

/* a JSON body: it parses; an error body has API.md's shape */
static void check_json_body(const ddt_http_response *res)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(res->body, res->body_len, &end, 0);
    EXPECT(root, "status %d: the JSON body does not parse near byte %ld: %.*s", res->status,
           (long)(end ? end - res->body : 0), (int)(res->body_len > 400 ? 400 : res->body_len), res->body);
    if (res->status >= 400) {
        const cJSON *error = cJSON_GetObjectItemCaseSensitive(root, "error");
        const cJSON *code = cJSON_GetObjectItemCaseSensitive(error, "code");
        const cJSON *message = cJSON_GetObjectItemCaseSensitive(error, "message");
        const cJSON *field = cJSON_GetObjectItemCaseSensitive(error, "field");
        EXPECT(cJSON_IsObject(root) && cJSON_IsObject(error) && cJSON_IsString(code) && cJSON_IsString(message) &&
                   (!field || cJSON_IsString(field)),
               "status %d: not an API.md error body: %.*s", res->status, (int)(res->body_len > 400 ? 400 : res->body_len),
               res->body);
    }
    cJSON_Delete(root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    if (env.dirty || env.fresh) {
        env_close();
        env_open();
    }

    static const char *const others[] = { "PUT", "DELETE", "HEAD", "PATCH", "OPTIONS", "" };
    const uint8_t *at = data + 1, *end = data + size;
    const char *method = data[0] == 'G' ? "GET" : data[0] == 'P' ? "POST" : others[data[0] % 6];
    size_t path_len, query_len, body_len;
    int path_done, query_done;
    const uint8_t *path_bytes = take(&at, end, &path_len, &path_done);
    const uint8_t *query_bytes = path_done ? take(&at, end, &query_len, &query_done) : at;
    if (!path_done)
        query_len = 0;
    const uint8_t *body_bytes = at;
    body_len = (size_t)(end - at);

    ddt_http_request req;
    memset(&req, 0, sizeof req);
    char *path = copy_text(path_bytes, path_len);
    char *query = copy_text(query_bytes, query_len);   /* split in place: k=v&k&k=v */
    char *body = copy_text(body_bytes, body_len);
    req.method = method;
    req.path = path;
    req.body = body;
    req.body_len = body_len;
    for (char *pair = query; *query && pair && req.query_count < DDT_HTTP_MAX_QUERY;) {
        char *next = strchr(pair, '&');
        if (next)
            *next++ = '\0';
        char *eq = strchr(pair, '=');
        if (eq)
            *eq++ = '\0';
        req.query_keys[req.query_count] = pair;
        req.query_values[req.query_count] = eq ? eq : "";
        req.query_count++;
        pair = next;
    }

    int64_t before[DDT_RUN_STATE_COUNT], after[DDT_RUN_STATE_COUNT];
    ddt_runs_counts(env.runs, before);
    ddt_http_response res;
    memset(&res, 0, sizeof res);
    ddt_api_handle(&env.api, &req, &res);
    ddt_runs_counts(env.runs, after);
    if (env.trace)
        fprintf(stderr, "fuzz_api: %s %s (%d query, %zu body bytes) -> %d %.*s\n", method, path, req.query_count,
                body_len, res.status, res.body ? (int)(res.body_len > 300 ? 300 : res.body_len) : 0,
                res.body ? res.body : "");

    EXPECT(res.status >= 200 && res.status <= 599, "%s %s: status %d", method, path, res.status);
    EXPECT(memchr(res.location, '\0', sizeof res.location), "Location not terminated");
    EXPECT(res.body || res.body_len == 0, "no body but body_len %zu", res.body_len);
    if (res.body) {
        volatile unsigned char sum = 0;   /* every byte readable (ASan) */
        for (size_t i = 0; i < res.body_len; i++)
            sum ^= (unsigned char)res.body[i];
        (void)sum;
        if (!res.content_type)
            check_json_body(&res);
    }
    EXPECT(res.status < 400 || res.body, "%s %s: status %d without an error body", method, path, res.status);
    if (res.status >= 400)
        EXPECT(!memcmp(before, after, sizeof before), "%s %s: refused (%d) but a run changed state", method, path,
               res.status);
    if (res.status == 201) {
        EXPECT(total(after) == total(before) + 1 && after[DDT_RUN_QUEUED] == before[DDT_RUN_QUEUED] + 1,
               "201 without exactly one more queued run");
        EXPECT(!strncmp(res.location, "/runs/", 6) && res.location[6], "201 with Location \"%s\"", res.location);
    }
    if (res.status == 201 || res.status == 202 || memcmp(before, after, sizeof before))
        env.dirty = 1;   /* restored before the next input */

    free(res.body);
    free(path);
    free(query);
    free(body);
    return 0;
}
