/* test_store_read.c: the read-only queries of daemon/engine/record/store_read.c.
 *
 * A store written through store.h (three runs created out of time order and updated, 30 steps
 * of one run with 0..3 devices each plus two of another, events with object, escaped and
 * malformed details, evals with and without NULLs) is read back while its writer is open, and
 * again after it is closed: runs in created order with every field and their NULLs as -1/NULL;
 * steps as JSON (every column of API.md in order, NULLs as null, the devices of each step, an
 * integer above 2^53 printed exactly) and as CSV (header, numbers that parse back to the very
 * doubles written, empty NULLs); the after/limit windows and the clamping of limit; events with
 * the detail embedded as JSON (or as a string when malformed) and their after_id window; the
 * newest eval; an unknown run gives empty arrays and -ENOENT; a missing database is -ENOENT
 * with its path in the message; a file that is not a database is -EINVAL.
 *
 * Fixtures live in a mkdtemp directory under /tmp, removed at the end.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "record/store.h"
#include "record/store_read.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static char tmp_dir[] = "/tmp/ddtree_test_store_read.XXXXXX";
static char db[300];        /* the fixture database, written by test_fixture */
static ddt_store *store;    /* its writer, open until test_closed_store */

enum { ALPHA_STEPS = 30, BIG_STEP = 7 };
static const int64_t big_bytes = (INT64_C(1) << 53) + 1;   /* not a double: must stay exact */

static const char *const step_columns[] = {
    "step", "ts_ms", "loss", "ce", "kl", "cap", "acc", "lr", "grad_norm", "tokens", "positions",
    "step_ms", "tokens_per_s", "positions_per_s", "peak_bytes", "chunk", "vocab_tile", "sel", "sel_acc",
};
enum { STEP_COLUMNS = sizeof step_columns / sizeof step_columns[0] };

static const char *const csv_header =
    "step,ts_ms,loss,ce,kl,cap,acc,lr,grad_norm,tokens,positions,step_ms,tokens_per_s,"
    "positions_per_s,peak_bytes,chunk,vocab_tile,sel,sel_acc";

/* ------------------------------------------------------------------------------------------
 * The fixture: what is written, and so what each read must give back
 */

/* step `step` of run "alpha": doubles that %.15g would not round-trip, a NaN cap (NULL) on
 * even steps, step % 4 devices, one device NaN step_ms, one peak above 2^53 */
static ddt_step_record alpha_step(int64_t step)
{
    ddt_step_record r = { .step = step, .ts_ms = 1700000000000 + step * 250 };
    snprintf(r.run_id, sizeof r.run_id, "alpha");
    r.loss = 1.0 / 3.0 + 1.0 / (double)(step + 7);
    r.ce = r.loss * 0.7;
    r.kl = r.loss * 0.3;
    r.cap = step % 2 ? 0.1 * (double)step : NAN;
    r.acc = 0.01 * (double)step + 1e-17;
    r.lr = 6e-4 * (double)step / 30.0;
    r.grad_norm = 1.0 + M_PI * (double)step;
    r.tokens = 4096 * step;
    r.positions = 24 * 1024 * step;
    r.step_ms = 123.456 + (double)step;
    r.tokens_per_s = (double)r.tokens / (r.step_ms / 1e3);
    r.positions_per_s = (double)r.positions / (r.step_ms / 1e3);
    r.peak_bytes = step == BIG_STEP ? big_bytes : INT64_C(30000000000) + step;
    r.chunk = 4096;
    r.vocab_tile = step % 5;
    r.sel = step % 3 ? 0.25 + 1.0 / (double)(step + 3) : NAN;   /* a DFlash2 step, or none */
    r.sel_acc = step % 3 ? 0.5 - 1e-17 * (double)step : NAN;
    r.devices = (int)(step % 4);
    for (int d = 0; d < r.devices; d++) {
        r.device_peak_bytes[d] = 1000 * step + d;
        r.device_step_ms[d] = step == 3 && d == 1 ? NAN : 10.5 + d + 0.001 * (double)step;
    }
    return r;
}

/* the alpha record's column c as a double (NaN: NULL) */
static double alpha_value(const ddt_step_record *r, int c)
{
    const double values[STEP_COLUMNS] = {
        (double)r->step, (double)r->ts_ms, r->loss, r->ce, r->kl, r->cap, r->acc, r->lr,
        r->grad_norm, (double)r->tokens, (double)r->positions, r->step_ms, r->tokens_per_s,
        r->positions_per_s, (double)r->peak_bytes, (double)r->chunk, (double)r->vocab_tile, r->sel, r->sel_acc,
    };
    return values[c];
}

static const char *const state_detail = "{\"from\":\"queued\",\"to\":\"running\"}";
static const char *const rechunk_detail =
    "{\"chunk\":2048,\"note\":\"a \\\"quoted\\\"\\nline\",\"tiles\":[1,2]}";
static const char *const malformed_detail = "not json {\"";
static const char *const weird_kind = "we\"ird\\kind";
/* 126 ASCII bytes, then a 2-byte character across ddt_run_row.name's last byte (127) */
#define LONG_NAME_ASCII 126
static const char long_name[] =
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9 and more";

static void test_fixture(void)
{
    char err[512] = "";
    int rc = ddt_store_open(db, &store, err, sizeof err);
    check(rc == 0 && store, "ddt_store_open(%s) = %d: %s", db, rc, err);
    if (rc)
        return;
    /* created out of time order: alpha 1000, beta 2000, gamma 1500 */
    check(ddt_store_run_create(store, "alpha", "Alpha \"one\"\n", "{\"train\":{\"steps\":100}}",
                               100, 1000) == 0, "create alpha");
    check(ddt_store_run_create(store, "beta", "B\xc3\xa9ta", "{}", 50, 2000) == 0, "create beta");
    check(ddt_store_run_create(store, "gamma", long_name, "{\"g\":1}", 10, 1500) == 0,
          "create gamma");
    check(ddt_store_run_update(store, "alpha", "running", 30, 20, 5000, 1100, -1, NULL) == 0,
          "update alpha");
    check(ddt_store_run_update(store, "beta", "failed", 2, -1, 6000, 2100, 6000,
                               "out of memory: \"x\"") == 0, "update beta");

    for (int64_t step = 0; step < ALPHA_STEPS; step++) {
        ddt_step_record r = alpha_step(step);
        ddt_store_step(store, &r);
    }
    for (int64_t step = 0; step < 2; step++) {   /* another run's steps and devices */
        ddt_step_record r = { .step = step, .ts_ms = 9, .tokens = 1, .positions = 1,
                              .peak_bytes = 5, .chunk = 8, .vocab_tile = 0, .devices = 1 };
        snprintf(r.run_id, sizeof r.run_id, "beta");
        r.loss = r.ce = r.kl = r.cap = r.acc = r.lr = r.grad_norm = 99.0;
        r.step_ms = r.tokens_per_s = r.positions_per_s = 99.0;
        r.device_peak_bytes[0] = 77;
        r.device_step_ms[0] = 7.0;
        ddt_store_step(store, &r);
    }

    ddt_store_event(store, "alpha", 1100, "state", state_detail);
    ddt_store_event(store, "beta", 2100, "state", "{}");
    ddt_store_event(store, "alpha", 1200, "rechunk", rechunk_detail);
    ddt_store_event(store, NULL, 1250, "daemon", "{}");   /* the daemon's own */
    ddt_store_event(store, "alpha", 1300, "error", malformed_detail);
    ddt_store_event(store, "alpha", 1400, weird_kind, "[1, 2.5, null]");

    ddt_store_eval(store, "alpha", 10, 2.5, "[2.0,2.25]", "[0.9]", NULL);
    ddt_store_eval(store, "alpha", 20, 3.25, "{\"16\":3.5,\"64\":4.125}", "[0.95,0.5]", NULL);
    ddt_store_eval(store, "gamma", 0, NAN, NULL, NULL, NULL);
    rc = ddt_store_flush(store);
    check(rc == 0, "ddt_store_flush = %d", rc);
}

/* ------------------------------------------------------------------------------------------
 * Helpers
 */

/* The JSON answer of the reader's call `what` (its rc, text, len and err) parsed, text freed;
 * NULL (a failed check) when the call failed or the answer is not JSON. */
static cJSON *parsed_answer(const char *what, int rc, char *text, size_t len, const char *err)
{
    check(rc == 0 && text, "%s = %d: %s", what, rc, err);
    if (rc || !text) {
        free(text);
        return NULL;
    }
    check(len == strlen(text), "len %zu, strlen %zu", len, strlen(text));
    cJSON *root = cJSON_Parse(text);
    check(root != NULL, "%s: the answer is not JSON: %.200s", what, text);
    free(text);
    return root;
}

/* steps text of run through the reader, parsed; NULL (a failed check) when it is not JSON */
static cJSON *read_steps_json(const char *run, int64_t after, int64_t limit)
{
    char err[512] = "", *text = NULL, what[160];
    size_t len = 0;
    int rc = ddt_store_read_steps(db, run, after, limit, 0, &text, &len, err, sizeof err);
    snprintf(what, sizeof what, "read_steps(%s, after %" PRId64 ", limit %" PRId64 ")", run, after, limit);
    return parsed_answer(what, rc, text, len, err);
}

static cJSON *read_events_json(const char *run, int64_t after_id, int64_t limit)
{
    char err[512] = "", *text = NULL, what[160];
    size_t len = 0;
    int rc = ddt_store_read_events(db, run, after_id, limit, &text, &len, err, sizeof err);
    snprintf(what, sizeof what, "read_events(%s)", run);
    return parsed_answer(what, rc, text, len, err);
}

/* the array named key of root, checked; NULL when absent */
static cJSON *array_of(cJSON *root, const char *key)
{
    cJSON *array = cJSON_GetObjectItemCaseSensitive(root, key);
    check(cJSON_IsArray(array), "no \"%s\" array", key);
    return cJSON_IsArray(array) ? array : NULL;
}

/* the step numbers of a steps answer, into numbers (at most max); how many */
static int step_numbers(cJSON *root, int64_t *numbers, int max)
{
    cJSON *steps = array_of(root, "steps"), *item;
    int n = 0;
    cJSON_ArrayForEach(item, steps) {
        cJSON *step = cJSON_GetObjectItemCaseSensitive(item, "step");
        if (n < max)
            numbers[n] = cJSON_IsNumber(step) ? (int64_t)step->valuedouble : -999;
        n++;
    }
    return n;
}

/* one alpha step object against what was written: keys in order, values, nulls, devices */
static void check_alpha_step(cJSON *object)
{
    cJSON *step_item = cJSON_GetObjectItemCaseSensitive(object, "step");
    if (!cJSON_IsNumber(step_item)) {
        check(0, "a step without its number");
        return;
    }
    int64_t step = (int64_t)step_item->valuedouble;
    ddt_step_record r = alpha_step(step);
    cJSON *item = object->child;
    for (int c = 0; c < STEP_COLUMNS; c++, item = item ? item->next : NULL) {
        if (!item || strcmp(item->string, step_columns[c]) != 0) {
            check(0, "step %" PRId64 ": key %d is \"%s\", not \"%s\"", step, c,
                  item ? item->string : "(none)", step_columns[c]);
            return;
        }
        double want = alpha_value(&r, c);
        if (isnan(want))
            check(cJSON_IsNull(item), "step %" PRId64 " %s: NULL written, not null", step,
                  step_columns[c]);
        else if (c == 14 && step == BIG_STEP)   /* beyond a double: checked in the text */
            check(cJSON_IsNumber(item), "step %" PRId64 " peak_bytes not a number", step);
        else
            check(cJSON_IsNumber(item) && item->valuedouble == want,
                  "step %" PRId64 " %s = %.17g, want %.17g", step, step_columns[c],
                  cJSON_IsNumber(item) ? item->valuedouble : NAN, want);
    }
    check(item && strcmp(item->string, "devices") == 0 && !item->next,
          "step %" PRId64 ": \"devices\" is not the last and only other key", step);
    cJSON *devices = cJSON_GetObjectItemCaseSensitive(object, "devices"), *device;
    check(cJSON_GetArraySize(devices) == r.devices, "step %" PRId64 ": %d devices, want %d", step,
          cJSON_GetArraySize(devices), r.devices);
    int d = 0;
    cJSON_ArrayForEach(device, devices) {
        if (d >= r.devices)
            break;
        cJSON *number = cJSON_GetObjectItemCaseSensitive(device, "device");
        cJSON *peak = cJSON_GetObjectItemCaseSensitive(device, "peak_bytes");
        cJSON *ms = cJSON_GetObjectItemCaseSensitive(device, "step_ms");
        check(cJSON_IsNumber(number) && number->valuedouble == d, "step %" PRId64 " device %d:"
              " wrong number", step, d);
        check(cJSON_IsNumber(peak) && peak->valuedouble == (double)r.device_peak_bytes[d],
              "step %" PRId64 " device %d: peak_bytes", step, d);
        if (isnan(r.device_step_ms[d]))
            check(cJSON_IsNull(ms), "step %" PRId64 " device %d: NULL step_ms not null", step, d);
        else
            check(cJSON_IsNumber(ms) && ms->valuedouble == r.device_step_ms[d],
                  "step %" PRId64 " device %d: step_ms", step, d);
        d++;
    }
}

/* CSV text split into its lines (NUL-terminated in place); how many */
static int csv_lines(char *text, char **lines, int max)
{
    int n = 0;
    for (char *line = text; *line && n < max;) {
        char *end = strchr(line, '\n');
        check(end != NULL, "the last CSV line has no newline");
        if (!end)
            break;
        *end = '\0';
        lines[n++] = line;
        line = end + 1;
    }
    return n;
}

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void check_runs(void)
{
    ddt_run_row *rows = NULL;
    int count = -1;
    char err[512] = "";
    int rc = ddt_store_read_runs(db, &rows, &count, err, sizeof err);
    check(rc == 0, "read_runs = %d: %s", rc, err);
    check(count == 3, "%d runs, want 3", count);
    if (rc || count != 3) {
        ddt_store_free_runs(rows, count);
        return;
    }
    /* oldest first by created_ms: alpha 1000, gamma 1500, beta 2000 */
    check(!strcmp(rows[0].id, "alpha") && !strcmp(rows[1].id, "gamma") &&
          !strcmp(rows[2].id, "beta"), "order %s %s %s, want alpha gamma beta", rows[0].id,
          rows[1].id, rows[2].id);
    const ddt_run_row *a = &rows[0], *g = &rows[1], *b = &rows[2];
    check(!strcmp(a->name, "Alpha \"one\"\n") && !strcmp(a->state, "running"), "alpha name/state");
    check(a->config_json && !strcmp(a->config_json, "{\"train\":{\"steps\":100}}"),
          "alpha config_json %s", a->config_json ? a->config_json : "(null)");
    check(a->error == NULL, "alpha error should be NULL");
    check(a->created_ms == 1000 && a->started_ms == 1100 && a->updated_ms == 5000 &&
          a->finished_ms == -1, "alpha times %" PRId64 " %" PRId64 " %" PRId64 " %" PRId64,
          a->created_ms, a->started_ms, a->updated_ms, a->finished_ms);
    check(a->step == 30 && a->max_steps == 100 && a->last_checkpoint_step == 20,
          "alpha step %" PRId64 " max %" PRId64 " ckpt %" PRId64, a->step, a->max_steps,
          a->last_checkpoint_step);
    check(!strcmp(b->name, "B\xc3\xa9ta") && !strcmp(b->state, "failed"), "beta name/state");
    check(b->error && !strcmp(b->error, "out of memory: \"x\""), "beta error %s",
          b->error ? b->error : "(null)");
    check(b->finished_ms == 6000 && b->started_ms == 2100 && b->last_checkpoint_step == -1 &&
          b->step == 2 && b->max_steps == 50, "beta numbers");
    /* a long name is cut before the character that would not fit whole */
    check(strlen(g->name) == LONG_NAME_ASCII && !strncmp(g->name, long_name, LONG_NAME_ASCII),
          "gamma's long name cut to %zu bytes, want %d", strlen(g->name), LONG_NAME_ASCII);
    check(!strcmp(g->state, "queued") && !strcmp(g->config_json, "{\"g\":1}"),
          "gamma state/config");
    check(g->created_ms == 1500 && g->updated_ms == 1500 && g->started_ms == -1 &&
          g->finished_ms == -1 && g->step == 0 && g->max_steps == 10 &&
          g->last_checkpoint_step == -1 && g->error == NULL, "gamma NULLs are not -1/NULL");
    ddt_store_free_runs(rows, count);
}

static void check_steps_json(void)
{
    cJSON *root = read_steps_json("alpha", -1, 10000);
    cJSON *steps = array_of(root, "steps"), *item;
    check(cJSON_GetArraySize(steps) == ALPHA_STEPS, "%d steps, want %d",
          cJSON_GetArraySize(steps), ALPHA_STEPS);
    int64_t expected = 0;
    cJSON_ArrayForEach(item, steps) {
        cJSON *step = cJSON_GetObjectItemCaseSensitive(item, "step");
        check(cJSON_IsNumber(step) && step->valuedouble == (double)expected,
              "step %" PRId64 " out of order", expected);
        check_alpha_step(item);
        expected++;
    }
    cJSON_Delete(root);

    /* the integer above 2^53 in the text itself, digit for digit */
    char err[512], *text = NULL, want[64];
    size_t len;
    int rc = ddt_store_read_steps(db, "alpha", BIG_STEP - 1, 1, 0, &text, &len, err, sizeof err);
    snprintf(want, sizeof want, "\"peak_bytes\":%" PRId64 ",", big_bytes);
    check(rc == 0 && text && strstr(text, want), "%s not in %.300s", want, text ? text : err);
    free(text);
}

static void check_steps_window(void)
{
    int64_t numbers[64];
    struct {
        int64_t after, limit;
        int first, count;   /* the steps expected: first, first + 1, ... */
    } windows[] = {
        { 9, 5, 10, 5 },            /* inside */
        { 27, 100, 28, 2 },         /* the tail */
        { ALPHA_STEPS - 1, 10, 0, 0 },   /* past the end */
        { -100, 3, 0, 3 },          /* a negative after starts at the beginning */
        { 4, 0, 5, 1 },             /* limit 0 clamped to 1 */
        { 4, -7, 5, 1 },            /* a negative limit clamped to 1 */
        { -1, 1000000, 0, ALPHA_STEPS },   /* beyond 10000 clamped: all of them here */
    };
    for (size_t w = 0; w < sizeof windows / sizeof windows[0]; w++) {
        cJSON *root = read_steps_json("alpha", windows[w].after, windows[w].limit);
        int n = step_numbers(root, numbers, 64);
        check(n == windows[w].count, "after %" PRId64 " limit %" PRId64 ": %d steps, want %d",
              windows[w].after, windows[w].limit, n, windows[w].count);
        for (int j = 0; j < n && j < windows[w].count; j++)
            check(numbers[j] == windows[w].first + j, "after %" PRId64 ": step %" PRId64
                  " at %d, want %d", windows[w].after, numbers[j], j, windows[w].first + j);
        cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(root, "steps"))
            check_alpha_step(item);   /* each window's devices are its own steps' */
        cJSON_Delete(root);
    }

    /* beta's steps are only beta's */
    cJSON *root = read_steps_json("beta", -1, 100);
    int n = step_numbers(root, numbers, 64);
    check(n == 2 && numbers[0] == 0 && numbers[1] == 1, "beta: %d steps", n);
    cJSON *first = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(root, "steps"), 0);
    cJSON *devices = cJSON_GetObjectItemCaseSensitive(first, "devices");
    cJSON *peak = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(devices, 0), "peak_bytes");
    check(cJSON_GetArraySize(devices) == 1 && cJSON_IsNumber(peak) && peak->valuedouble == 77,
          "beta step 0: devices not its own");
    cJSON_Delete(root);
}

static void check_steps_csv(void)
{
    char err[512] = "", *text = NULL;
    size_t len = 0;
    int rc = ddt_store_read_steps(db, "alpha", -1, 10000, 1, &text, &len, err, sizeof err);
    check(rc == 0 && text, "read_steps csv = %d: %s", rc, err);
    if (rc || !text) {
        free(text);
        return;
    }
    check(len == strlen(text), "csv len %zu, strlen %zu", len, strlen(text));
    char *lines[64];
    int n = csv_lines(text, lines, 64);
    check(n == ALPHA_STEPS + 1, "%d CSV lines, want header + %d", n, ALPHA_STEPS);
    check(n > 0 && !strcmp(lines[0], csv_header), "header \"%s\"", n > 0 ? lines[0] : "");
    for (int j = 1; j < n; j++) {
        ddt_step_record r = alpha_step(j - 1);
        char *field = lines[j];
        for (int c = 0; c < STEP_COLUMNS; c++) {
            char *comma = strchr(field, ',');
            check((comma != NULL) == (c < STEP_COLUMNS - 1), "line %d: %d fields", j, c + 1);
            if (comma)
                *comma = '\0';
            double want = alpha_value(&r, c);
            if (isnan(want)) {
                check(*field == '\0', "line %d %s: \"%s\" for NULL", j, step_columns[c], field);
            } else if (c == 14) {   /* peak_bytes, an integer: exact, above 2^53 too */
                char *end;
                long long got = strtoll(field, &end, 10);
                check(*field && !*end && got == r.peak_bytes, "line %d peak_bytes \"%s\", want %"
                      PRId64, j, field, r.peak_bytes);
            } else {
                char *end;
                double got = strtod(field, &end);
                check(*field && !*end && got == want, "line %d %s \"%s\", want %.17g", j,
                      step_columns[c], field, want);
            }
            if (!comma)
                break;
            field = comma + 1;
        }
    }
    free(text);

    /* a window, in CSV too */
    rc = ddt_store_read_steps(db, "alpha", 27, 5, 1, &text, &len, err, sizeof err);
    n = rc == 0 ? csv_lines(text, lines, 64) : 0;
    check(n == 3 && !strncmp(lines[1], "28,", 3) && !strncmp(lines[2], "29,", 3),
          "csv after 27: %d lines", n);
    free(text);
}

static void check_events(void)
{
    cJSON *root = read_events_json("alpha", -1, 100);
    cJSON *events = array_of(root, "events");
    check(cJSON_GetArraySize(events) == 4, "%d alpha events, want 4", cJSON_GetArraySize(events));
    const char *kinds[] = { "state", "rechunk", "error", weird_kind };
    const int64_t times[] = { 1100, 1200, 1300, 1400 };
    int64_t ids[4] = { 0 }, previous = -1;
    int j = 0;
    cJSON *event;
    cJSON_ArrayForEach(event, events) {
        if (j >= 4)
            break;
        cJSON *id = cJSON_GetObjectItemCaseSensitive(event, "id");
        cJSON *ts = cJSON_GetObjectItemCaseSensitive(event, "ts_ms");
        cJSON *kind = cJSON_GetObjectItemCaseSensitive(event, "kind");
        check(cJSON_IsNumber(id) && id->valuedouble > (double)previous, "event %d: id not "
              "ascending", j);
        ids[j] = previous = cJSON_IsNumber(id) ? (int64_t)id->valuedouble : previous;
        check(cJSON_IsNumber(ts) && ts->valuedouble == (double)times[j], "event %d: ts_ms", j);
        check(cJSON_IsString(kind) && !strcmp(kind->valuestring, kinds[j]), "event %d: kind %s",
              j, cJSON_IsString(kind) ? kind->valuestring : "?");
        j++;
    }
    /* the details: objects and an array embedded, a malformed one as a string */
    cJSON *detail = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 0), "detail");
    cJSON *want = cJSON_Parse(state_detail);
    check(cJSON_IsObject(detail) && cJSON_Compare(detail, want, 1), "state detail not embedded");
    cJSON_Delete(want);
    detail = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 1), "detail");
    cJSON *note = cJSON_GetObjectItemCaseSensitive(detail, "note");
    check(cJSON_IsObject(detail) && cJSON_IsString(note) &&
          !strcmp(note->valuestring, "a \"quoted\"\nline"), "rechunk detail's note");
    check(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(detail, "tiles")) == 2,
          "rechunk detail's tiles");
    detail = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 2), "detail");
    check(cJSON_IsString(detail) && !strcmp(detail->valuestring, malformed_detail),
          "a malformed detail is not embedded as its string");
    detail = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 3), "detail");
    check(cJSON_IsArray(detail) && cJSON_GetArraySize(detail) == 3 &&
          cJSON_IsNull(cJSON_GetArrayItem(detail, 2)), "an array detail");
    cJSON_Delete(root);

    /* the after_id window and the limit */
    root = read_events_json("alpha", ids[0], 100);
    events = array_of(root, "events");
    cJSON *first = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 0), "id");
    check(cJSON_GetArraySize(events) == 3 && cJSON_IsNumber(first) &&
          (int64_t)first->valuedouble == ids[1], "after the first id: %d events",
          cJSON_GetArraySize(events));
    cJSON_Delete(root);
    root = read_events_json("alpha", ids[1], 1);
    events = array_of(root, "events");
    first = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(events, 0), "id");
    check(cJSON_GetArraySize(events) == 1 && cJSON_IsNumber(first) &&
          (int64_t)first->valuedouble == ids[2], "limit 1: %d events", cJSON_GetArraySize(events));
    cJSON_Delete(root);
    root = read_events_json("beta", -1, 100);
    check(cJSON_GetArraySize(array_of(root, "events")) == 1, "beta's events are only its own");
    cJSON_Delete(root);
}

static void check_last_eval(void)
{
    int64_t step = -1;
    double tau = 0.0;
    char *tree = NULL, *acc = NULL;
    int rc = ddt_store_read_last_eval(db, "alpha", &step, &tau, &tree, &acc);
    check(rc == 0, "last_eval(alpha) = %d", rc);
    check(step == 20 && tau == 3.25, "alpha: step %" PRId64 " tau %g, want 20 3.25", step, tau);
    check(tree && !strcmp(tree, "{\"16\":3.5,\"64\":4.125}"), "tau_tree_json %s",
          tree ? tree : "(null)");
    check(acc && !strcmp(acc, "[0.95,0.5]"), "acc_json %s", acc ? acc : "(null)");
    free(tree);
    free(acc);

    tree = acc = (char *)"stale";
    rc = ddt_store_read_last_eval(db, "gamma", &step, &tau, &tree, &acc);
    check(rc == 0 && step == 0 && isnan(tau) && !tree && !acc,
          "gamma's NULLs: rc %d step %" PRId64 " tau %g tree %p acc %p", rc, step, tau,
          (void *)tree, (void *)acc);

    rc = ddt_store_read_last_eval(db, "beta", &step, &tau, &tree, &acc);
    check(rc == -ENOENT && !tree && !acc, "beta has no eval: %d, want -ENOENT", rc);
    rc = ddt_store_read_last_eval(db, "alpha", NULL, NULL, NULL, NULL);
    check(rc == 0, "every output optional: %d", rc);
}

static void check_unknown_run(void)
{
    char err[512] = "", *text = NULL;
    size_t len = 0;
    int rc = ddt_store_read_steps(db, "nope", -1, 100, 0, &text, &len, err, sizeof err);
    check(rc == 0 && text && !strcmp(text, "{\"steps\":[]}"), "steps of nothing: %d %s", rc,
          text ? text : err);
    free(text);
    rc = ddt_store_read_steps(db, "nope", -1, 100, 1, &text, &len, err, sizeof err);
    char header[512];
    snprintf(header, sizeof header, "%s\n", csv_header);
    check(rc == 0 && text && !strcmp(text, header), "csv of nothing: %d %s", rc, text ? text : err);
    free(text);
    rc = ddt_store_read_events(db, "nope", -1, 100, &text, &len, err, sizeof err);
    check(rc == 0 && text && !strcmp(text, "{\"events\":[]}"), "events of nothing: %d %s", rc,
          text ? text : err);
    free(text);
    /* a run id that would be SQL if it were pasted in: it is a bound parameter */
    rc = ddt_store_read_events(db, "x' OR '1'='1", -1, 100, &text, &len, err, sizeof err);
    check(rc == 0 && text && !strcmp(text, "{\"events\":[]}"), "quoted id: %d %s", rc,
          text ? text : err);
    free(text);
    rc = ddt_store_read_last_eval(db, "nope", NULL, NULL, NULL, NULL);
    check(rc == -ENOENT, "last_eval of nothing: %d", rc);
}

static void test_runs(void) { check_runs(); }
static void test_steps_json(void) { check_steps_json(); }
static void test_steps_window(void) { check_steps_window(); }
static void test_steps_csv(void) { check_steps_csv(); }
static void test_events(void) { check_events(); }
static void test_last_eval(void) { check_last_eval(); }
static void test_unknown_run(void) { check_unknown_run(); }

/* the cases above read while the writer is open, as the daemon's handlers do; with the writer
 * closed (its WAL checkpointed away) the answers are the same */
static void test_closed_store(void)
{
    ddt_store_close(store);
    store = NULL;
    char wal[320];
    snprintf(wal, sizeof wal, "%s-wal", db);
    struct stat st;
    check(stat(wal, &st) != 0, "the WAL is still there after close");
    check_runs();
    check_steps_json();
    check_events();
    check_last_eval();
}

static void test_missing_database(void)
{
    char path[320], err[512], *text = (char *)"stale";
    size_t len = 7;
    snprintf(path, sizeof path, "%s/absent.db", tmp_dir);
    static ddt_run_row stale;
    ddt_run_row *rows = &stale;
    int count = 5;
    int rc = ddt_store_read_runs(path, &rows, &count, err, sizeof err);
    check(rc == -ENOENT && strstr(err, path), "runs: %d \"%s\"", rc, err);
    check(rows == NULL && count == 0, "runs: outputs not cleared");
    err[0] = '\0';
    rc = ddt_store_read_steps(path, "alpha", -1, 10, 0, &text, &len, err, sizeof err);
    check(rc == -ENOENT && strstr(err, path) && !text && len == 0, "steps: %d \"%s\"", rc, err);
    err[0] = '\0';
    rc = ddt_store_read_steps(path, "alpha", -1, 10, 1, &text, &len, err, sizeof err);
    check(rc == -ENOENT && strstr(err, path), "steps csv: %d \"%s\"", rc, err);
    err[0] = '\0';
    rc = ddt_store_read_events(path, "alpha", -1, 10, &text, &len, err, sizeof err);
    check(rc == -ENOENT && strstr(err, path) && !text, "events: %d \"%s\"", rc, err);
    rc = ddt_store_read_last_eval(path, "alpha", NULL, NULL, NULL, NULL);
    check(rc == -ENOENT, "last_eval: %d", rc);
    check(stat(path, &(struct stat){ 0 }) != 0, "a read created %s", path);

    snprintf(path, sizeof path, "%s/no/such/dir/ddtree.db", tmp_dir);
    err[0] = '\0';
    rc = ddt_store_read_runs(path, &rows, &count, err, sizeof err);
    check(rc == -ENOENT && strstr(err, path), "runs in a missing directory: %d \"%s\"", rc, err);
}

static void test_not_a_database(void)
{
    char path[320], err[512] = "";
    snprintf(path, sizeof path, "%s/notes.txt", tmp_dir);
    FILE *f = fopen(path, "w");
    check(f != NULL, "cannot write %s", path);
    if (!f)
        return;
    for (int j = 0; j < 200; j++)
        fputs("this is not a SQLite database, whatever its name says\n", f);
    fclose(f);
    ddt_run_row *rows = NULL;
    int count = 0;
    int rc = ddt_store_read_runs(path, &rows, &count, err, sizeof err);
    check(rc == -EINVAL && strstr(err, path), "runs of a text file: %d \"%s\"", rc, err);
    char *text = NULL;
    size_t len = 0;
    rc = ddt_store_read_events(path, "alpha", -1, 10, &text, &len, err, sizeof err);
    check(rc == -EINVAL && !text, "events of a text file: %d \"%s\"", rc, err);
}

/* ------------------------------------------------------------------------------------------ */

int main(void)
{
    scratch_dir(tmp_dir);
    snprintf(db, sizeof db, "%s/ddtree.db", tmp_dir);
    static const test_case cases[] = {
        { "fixture written through store.h", test_fixture },
        { "runs: oldest first, every field, NULLs as -1/NULL", test_runs },
        { "steps JSON: every column in order, nulls, devices, exact int64", test_steps_json },
        { "steps after/limit windows, limit clamped to [1, 10000]", test_steps_window },
        { "steps CSV: header, numbers parse back exactly, empty NULLs", test_steps_csv },
        { "events: detail embedded (string when malformed), after_id/limit", test_events },
        { "last eval: the newest, NULLs, none is -ENOENT", test_last_eval },
        { "an unknown run: empty arrays, header only, -ENOENT", test_unknown_run },
        { "reads after the writer closed", test_closed_store },
        { "a missing database is -ENOENT naming its path", test_missing_database },
        { "a file that is not a database is -EINVAL", test_not_a_database },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    if (store)
        ddt_store_close(store);
    remove_tree(tmp_dir);
    return cases_summary();
}
