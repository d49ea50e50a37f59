/* api.c: ddtreed's routes and handlers (api.h). Every error is
 * {"error": {"code", "message", "field"?}} with a 4xx/5xx status; nothing is stored by a
 * refused request. Every request first goes through the browser's access rules (ui_access.h);
 * the web view's pages are routed to ui.c.
 * Tested by tests/daemon/api_e2e.py and fuzzed by tests/fuzz/fuzz_api.c.
 */
#include "base/ddt_time.h"
#include "api.h"
#include "ddk.h"
#include "metrics.h"
#include "run/planner.h"
#include "run/run_config.h"
#include "record/store_read.h"
#include "ui.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void reply(ddt_http_response *res, int status, cJSON *o)
{
    ddt_http_json(res, status, cJSON_PrintUnformatted(o));
    cJSON_Delete(o);
}

/* ------------------------------------------------------------------------------------------
 * Handlers
 */

/* The daemon's health into o: "status" "ok", or "degraded" while the store cannot write (its
 * records wait in its queue and the runs it would record are held, paused until it can), and
 * "store": {"degraded", "cause", "since_ms", "queued", "lock_waits"}, "runs_held". */
static void add_health(ddt_api *a, cJSON *o)
{
    ddt_store_health h = { 0 };
    if (a->store)
        ddt_store_get_health(a->store, &h);
    cJSON_AddStringToObject(o, "status", h.degraded ? "degraded" : "ok");
    cJSON *store = cJSON_AddObjectToObject(o, "store");
    cJSON_AddBoolToObject(store, "degraded", h.degraded);
    if (h.degraded) {
        cJSON_AddStringToObject(store, "cause", h.cause);
        cJSON_AddNumberToObject(store, "since_ms", (double)h.since_ms);
    } else {
        cJSON_AddNullToObject(store, "cause");
        cJSON_AddNullToObject(store, "since_ms");
    }
    cJSON_AddNumberToObject(store, "queued", h.queued);
    cJSON_AddNumberToObject(store, "lock_waits", (double)h.lock_waits);
    cJSON_AddNumberToObject(o, "runs_held", (double)ddt_runs_held(a->runs));
}

/* 200 while the daemon answers, degraded or not: a degraded store is waited out, not a reason
 * to restart the daemon (its body says which) */
static void get_healthz(ddt_api *a, ddt_http_response *res)
{
    cJSON *o = cJSON_CreateObject();
    add_health(a, o);
    cJSON_AddStringToObject(o, "version", DDK_VERSION);
    reply(res, 200, o);
}

static void get_status(ddt_api *a, ddt_http_response *res)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "version", DDK_VERSION);
    cJSON_AddNumberToObject(o, "uptime_s", ddt_mono_s() - a->started_s);
    int gpus = ddk_cuda_device_count();
    cJSON_AddStringToObject(o, "backend", gpus > 0 ? "cuda" : "cpu");
    cJSON *devices = cJSON_AddArrayToObject(o, "devices");
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE), cores = sysconf(_SC_NPROCESSORS_ONLN);
    char run[40];
    for (int d = 0; d < gpus; d++) {
        ddk_device_info info;
        if (ddk_cuda_device_info(d, &info))
            continue;
        cJSON *x = cJSON_CreateObject();
        char id[24];
        snprintf(id, sizeof id, "cuda:%d", d);
        cJSON_AddStringToObject(x, "id", id);
        cJSON_AddStringToObject(x, "name", info.name);
        cJSON_AddNumberToObject(x, "memory_total_bytes", (double)info.memory_total_bytes);
        cJSON_AddNumberToObject(x, "memory_used_bytes", (double)ddk_allocator_stats(ddk_allocator_cuda(d)).current);
        cJSON_AddNullToObject(x, "run");
        cJSON_AddItemToArray(devices, x);
    }
    cJSON *cpu = cJSON_CreateObject();
    char name[64];
    snprintf(name, sizeof name, "CPU (%ld cores)", cores);
    cJSON_AddStringToObject(cpu, "id", "cpu:0");
    cJSON_AddStringToObject(cpu, "name", name);
    cJSON_AddNumberToObject(cpu, "memory_total_bytes", (double)pages * (double)page);
    cJSON_AddNumberToObject(cpu, "memory_used_bytes", (double)ddk_allocator_stats(ddk_allocator_cpu_rank(0)).current);
    if (ddt_runs_on_device(a->runs, 0, run, sizeof run))
        cJSON_AddStringToObject(cpu, "run", run);
    else
        cJSON_AddNullToObject(cpu, "run");
    cJSON_AddItemToArray(devices, cpu);
    int64_t counts[DDT_RUN_STATE_COUNT];
    ddt_runs_counts(a->runs, counts);
    cJSON *runs = cJSON_AddObjectToObject(o, "runs");
    for (int s = 0; s < DDT_RUN_STATE_COUNT; s++)
        cJSON_AddNumberToObject(runs, ddt_run_state_name(s), (double)counts[s]);
    cJSON_AddItemToObject(o, "config", ddt_daemon_config_json(a->config));
    add_health(a, cJSON_AddObjectToObject(o, "health"));
    reply(res, 200, o);
}

/* a run config's parse error as the API answers it: 400 invalid_json when the body is not JSON
 * at all, 400 invalid_config for any other refusal, else 500 */
static void config_error(ddt_http_response *res, int rc, const char *field, const char *err)
{
    if (rc == -EBADMSG)
        ddt_http_error(res, 400, "invalid_json", NULL, "%s", err);
    else if (rc == -EAGAIN)   /* the store cannot write now (its health says why): nothing was stored */
        ddt_http_error(res, 503, "store_unavailable", NULL, "%s; try again once it can", err);
    else
        ddt_http_error(res, rc == -EINVAL ? 400 : 500, rc == -EINVAL ? "invalid_config" : "internal",
                       *field ? field : NULL, "%s", err);
}

static void post_runs(ddt_api *a, const ddt_http_request *req, ddt_http_response *res)
{
    char id[40], err[1024] = "", field[160] = "";
    int rc = ddt_runs_submit(a->runs, req->body, req->body_len, id, sizeof id, err, sizeof err, field, sizeof field);
    if (rc) {
        config_error(res, rc, field, err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "state", ddt_run_state_name(DDT_RUN_QUEUED));
    snprintf(res->location, sizeof res->location, "/runs/%s", id);
    reply(res, 201, o);
}

static void get_runs(ddt_api *a, const ddt_http_request *req, ddt_http_response *res)
{
    char err[256];
    cJSON *o = ddt_runs_list(a->runs, ddt_http_query(req, "state"), err, sizeof err);
    if (!o)
        ddt_http_error(res, 400, "invalid_query", "state", "%s", err);
    else
        reply(res, 200, o);
}

static void get_run(ddt_api *a, const char *id, ddt_http_response *res)
{
    cJSON *o = ddt_runs_get(a->runs, id);
    if (!o)
        ddt_http_error(res, 404, "not_found", NULL, "no run %s", id);
    else
        reply(res, 200, o);
}

static void post_control(ddt_api *a, const char *id, const char *verb, const ddt_http_request *req,
                         ddt_http_response *res)
{
    static const struct { const char *verb; ddt_run_action action; } verbs[] = {
        { "pause", DDT_RUN_PAUSE }, { "resume", DDT_RUN_RESUME }, { "cancel", DDT_RUN_CANCEL },
        { "rechunk", DDT_RUN_RECHUNK }, { "checkpoint", DDT_RUN_CHECKPOINT }, { "export", DDT_RUN_EXPORT },
        { "speculate", DDT_RUN_SPECULATE },
    };
    int v = -1;
    for (size_t i = 0; i < sizeof verbs / sizeof verbs[0] && v < 0; i++)
        if (!strcmp(verb, verbs[i].verb))
            v = (int)i;
    if (v < 0) {
        ddt_http_error(res, 404, "not_found", NULL, "no action %s (pause, resume, cancel, rechunk, checkpoint, export, speculate)", verb);
        return;
    }
    cJSON *body = NULL;
    /* speculate's and export's bodies are optional (every field is): none is {} */
    if (verbs[v].action == DDT_RUN_RECHUNK ||
        ((verbs[v].action == DDT_RUN_SPECULATE || verbs[v].action == DDT_RUN_EXPORT) && req->body_len > 0)) {
        const char *end = NULL;
        body = cJSON_ParseWithLengthOpts(req->body, req->body_len + 1, &end, 1);
        if (!body) {
            ddt_http_error(res, 400, "invalid_json", NULL, "the body is not valid JSON (near byte %ld)",
                           (long)(end ? end - req->body : 0));
            return;
        }
    }
    cJSON *out = NULL;
    int status = 202;
    char err[1024] = "", field[160] = "";
    int rc = ddt_runs_control(a->runs, id, verbs[v].action, body, &out, &status, err, sizeof err, field, sizeof field);
    cJSON_Delete(body);
    if (rc == -ENOENT)
        ddt_http_error(res, 404, "not_found", NULL, "%s", err);
    else if (rc == -EBUSY)
        ddt_http_error(res, 409, "illegal_transition", NULL, "%s", err);
    else if (rc == -EINVAL)
        ddt_http_error(res, 400, "invalid_value", *field ? field : NULL, "%s", err);
    else if (rc)
        ddt_http_error(res, 500, "internal", NULL, "%s", err);
    else
        reply(res, status, out);
}

/* an optional count of the query: dflt when absent */
static int query_count(const ddt_http_request *req, const char *key, int64_t dflt, int64_t *out)
{
    const char *text = ddt_http_query(req, key);
    *out = dflt;
    return text ? ddt_parse_count(text, out) : 0;
}

typedef enum record_kind { RECORD_STEPS, RECORD_EVENTS, RECORD_EVALS } record_kind;

static void get_records(ddt_api *a, const char *id, record_kind kind, const ddt_http_request *req,
                        ddt_http_response *res)
{
    if (!ddt_runs_known(a->runs, id)) {
        ddt_http_error(res, 404, "not_found", NULL, "no run %s", id);
        return;
    }
    int events = kind == RECORD_EVENTS;
    int64_t after, limit, max_points;
    if (query_count(req, "after", events ? 0 : -1, &after)) {
        ddt_http_error(res, 400, "invalid_query", "after", "after must be a non-negative integer");
        return;
    }
    if (query_count(req, "limit", 1000, &limit) || limit < 1 || limit > 10000) {
        ddt_http_error(res, 400, "invalid_query", "limit", "limit must be an integer in [1, 10000]");
        return;
    }
    const char *format = ddt_http_query(req, "format");
    if (format && strcmp(format, "csv") && strcmp(format, "json")) {
        ddt_http_error(res, 400, "invalid_query", "format", "format must be csv or json");
        return;
    }
    if (query_count(req, "max_points", 0, &max_points) || max_points > 10000 ||
        (ddt_http_query(req, "max_points") && max_points < 1) ||
        (max_points && (kind != RECORD_STEPS || (format && strcmp(format, "json"))))) {
        ddt_http_error(res, 400, "invalid_query", "max_points", "max_points must be an integer in [1, 10000], "
                       "for the steps as JSON");
        return;
    }
    int csv = kind == RECORD_STEPS && format && !strcmp(format, "csv");
    char *text = NULL, err[512];
    size_t len = 0;
    int rc = events ? ddt_store_read_events(a->db_path, id, after, limit, &text, &len, err, sizeof err)
           : kind == RECORD_EVALS ? ddt_store_read_evals(a->db_path, id, after, &text, &len, err, sizeof err)
           : max_points ? ddt_store_read_steps_sampled(a->db_path, id, after, max_points, &text, &len, err, sizeof err)
           : ddt_store_read_steps(a->db_path, id, after, limit, csv, &text, &len, err, sizeof err);
    if (rc) {
        ddt_http_error(res, 500, "store", NULL, "%s", err);
        return;
    }
    res->status = 200;
    res->body = text;
    res->body_len = len;
    res->content_type = csv ? "text/csv; charset=utf-8" : "application/json";
}

/* the run config as it was submitted (the runs row's config_json) */
static void get_run_config(ddt_api *a, const char *id, ddt_http_response *res)
{
    ddt_run_row *rows;
    int count;
    char err[512];
    if (ddt_store_read_runs(a->db_path, &rows, &count, err, sizeof err)) {
        ddt_http_error(res, 500, "store", NULL, "%s", err);
        return;
    }
    int found = 0;
    for (int j = 0; j < count && !found; j++)
        if (!strcmp(rows[j].id, id)) {
            found = 1;
            ddt_http_json(res, 200, rows[j].config_json);
            rows[j].config_json = NULL;   /* the response's now */
        }
    if (!found)
        ddt_http_error(res, 404, "not_found", NULL, "no run %s", id);
    ddt_store_free_runs(rows, count);
}

static void post_plan(ddt_api *a, const ddt_http_request *req, ddt_http_response *res)
{
    ddt_run_config c;
    char err[1024] = "", field[160] = "";
    int prc = ddt_run_config_parse(req->body, req->body_len, &c, err, sizeof err, field, sizeof field);
    if (prc) {
        config_error(res, prc == -EBADMSG ? prc : -EINVAL, field, err);
        return;
    }
    /* as POST /runs: a relative path would be the daemon's working directory's */
    if (ddt_run_config_check_absolute(&c, err, sizeof err, field, sizeof field)) {
        ddt_run_config_free(&c);
        config_error(res, -EINVAL, field, err);
        return;
    }
    ddt_memory_plan plan;
    char note[256], remark[2048];
    if (ddt_plan_config(&c, ddt_node_here(), 0, &plan, note, sizeof note, remark, sizeof remark, err, sizeof err,
                        field, sizeof field)) {
        ddt_http_error(res, 400, "invalid_config", *field ? field : "drafter", "%s", err);
        ddt_run_config_free(&c);
        return;
    }
    ddt_http_json(res, 200, ddt_plan_json(&c, &plan, note));
    ddt_run_config_free(&c);
}

static void get_metrics(ddt_api *a, ddt_http_response *res)
{
    ddt_metrics_snapshot m;
    memset(&m, 0, sizeof m);
    m.version = DDK_VERSION;
    ddt_runs_metrics(a->runs, &m);
    for (int d = 0; d < DDT_METRICS_MAX_DEVICES; d++) {   /* the CPU ranks that were ever used */
        ddk_alloc_stats s = ddk_allocator_stats(ddk_allocator_cpu_rank(d));
        if (d > 0 && s.peak == 0)
            continue;
        snprintf(m.device_names[m.device_count], sizeof m.device_names[0], "cpu:%d", d);
        m.device_used_bytes[m.device_count] = (int64_t)s.current;
        m.device_peak_bytes[m.device_count] = (int64_t)s.peak;
        m.device_count++;
    }
    if (a->http)
        m.code_count = ddt_http_counts(a->http, m.codes, m.code_counts, DDT_METRICS_MAX_CODES);
    ddt_ui_login_counts(&a->login_limit, &m.login_failures, &m.login_refused);
    if (a->store) {
        ddt_store_health h;
        ddt_store_get_health(a->store, &h);
        m.store_degraded = h.degraded;
        m.store_queued = h.queued;
        m.store_lock_waits = (uint64_t)h.lock_waits;
    }
    size_t len = 0;
    res->status = 200;
    res->body = ddt_metrics_render(&m, &len);
    res->body_len = len;
    res->content_type = "text/plain; version=0.0.4; charset=utf-8";
    free(m.runs);
}

/* A new NCCL unique id: what rank 0's daemon hands to the daemons of the other nodes of a
 * multi-node run (docs/api.md, "NCCL unique id") */
static void post_nccl_unique_id(ddt_http_response *res)
{
    char hex[DDK_COMM_ID_HEX + 1], err[512] = "";
    int rc = ddk_comm_unique_id(hex, err, sizeof err);
    if (rc == -ENOSYS) {
        ddt_http_error(res, 501, "not_implemented", NULL, "%s", err);
        return;
    }
    if (rc) {
        ddt_http_error(res, 500, "nccl", NULL, "%s", err);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "nccl_unique_id", hex);
    reply(res, 200, o);
}

/* ------------------------------------------------------------------------------------------
 * Routing
 */

static int method_is(const ddt_http_request *req, const char *method, ddt_http_response *res, const char *allowed)
{
    if (!strcmp(req->method, method))
        return 1;
    ddt_http_error(res, 405, "method_not_allowed", NULL, "%s %s: use %s", req->method, req->path, allowed);
    snprintf(res->allow, sizeof res->allow, "%s", allowed);
    for (char *c = res->allow; *c; c++)   /* "GET or POST" -> "GET, POST" */
        if (!strncmp(c, " or", 3))
            memcpy(c, ",  ", 3);
    return 0;
}

void ddt_api_handle(void *ctx, const ddt_http_request *req, ddt_http_response *res)
{
    ddt_api *a = ctx;
    const char *p = req->path;
    ddt_ui_verdict verdict = ddt_ui_access_check(&a->access, req, res);
    if (verdict == DDT_UI_REFUSED)
        return;
    if (!strcmp(p, "/ui") || !strncmp(p, "/ui/", 4)) {
        ddt_ui_handle(&a->access, &a->login_limit, verdict, req, res);
    } else if (!strcmp(p, "/healthz")) {
        if (method_is(req, "GET", res, "GET"))
            get_healthz(a, res);
    } else if (!strcmp(p, "/status")) {
        if (method_is(req, "GET", res, "GET"))
            get_status(a, res);
    } else if (!strcmp(p, "/metrics")) {
        if (method_is(req, "GET", res, "GET"))
            get_metrics(a, res);
    } else if (!strcmp(p, "/plan")) {
        if (method_is(req, "POST", res, "POST"))
            post_plan(a, req, res);
    } else if (!strcmp(p, "/nccl/unique-id")) {
        if (method_is(req, "POST", res, "POST"))
            post_nccl_unique_id(res);
    } else if (!strcmp(p, "/runs")) {
        if (!strcmp(req->method, "POST"))
            post_runs(a, req, res);
        else if (method_is(req, "GET", res, "GET or POST"))
            get_runs(a, req, res);
    } else if (!strncmp(p, "/runs/", 6) && p[6]) {
        char id[64], verb[32] = "";
        const char *slash = strchr(p + 6, '/');
        size_t n = slash ? (size_t)(slash - (p + 6)) : strlen(p + 6);
        if (n >= sizeof id || (slash && (strlen(slash + 1) >= sizeof verb || strchr(slash + 1, '/')))) {
            ddt_http_error(res, 404, "not_found", NULL, "no such path: %s", p);
            return;
        }
        memcpy(id, p + 6, n);
        id[n] = '\0';
        if (slash)
            snprintf(verb, sizeof verb, "%s", slash + 1);
        if (!*verb) {
            if (method_is(req, "GET", res, "GET"))
                get_run(a, id, res);
        } else if (!strcmp(verb, "steps") || !strcmp(verb, "events") || !strcmp(verb, "evals")) {
            if (method_is(req, "GET", res, "GET"))
                get_records(a, id, !strcmp(verb, "steps") ? RECORD_STEPS : !strcmp(verb, "events") ? RECORD_EVENTS
                                                                                                 : RECORD_EVALS, req, res);
        } else if (!strcmp(verb, "config")) {
            if (method_is(req, "GET", res, "GET"))
                get_run_config(a, id, res);
        } else if (method_is(req, "POST", res, "POST")) {
            post_control(a, id, verb, req, res);
        }
    } else {
        ddt_http_error(res, 404, "not_found", NULL, "no such path: %s", p);
    }
}
