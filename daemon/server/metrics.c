/* metrics.c: GET /metrics as Prometheus text exposition 0.0.4, written by hand from a
 * ddt_metrics_snapshot (see metrics.h and API.md, "Metrics").
 *
 * Every family has its # HELP and # TYPE lines, also when it has no sample (no runs yet), so a
 * scraper learns the names at once. Label values are escaped (backslash, quote, newline); numbers
 * are the shortest decimal that reads back as the same double, NaN and infinities as the
 * format spells them (NaN, +Inf, -Inf). The step histogram takes the snapshot's counts as
 * they are: already cumulative, the last one +Inf.
 *
 * Not here: collecting the snapshot (the run manager and the HTTP server fill it), OpenMetrics
 * (# EOF, _created), timestamps.
 *
 * Tested by tests/daemon/server/test_metrics.c (lines, escaping, the histogram; parsed by
 * python3-prometheus-client when installed) and tests/daemon/api_e2e.py.
 */
#include "metrics.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double ddt_metrics_bucket_bounds[DDT_METRICS_BUCKETS] = {
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 15.0, 60.0,
};

/* ------------------------------------------------------------------------------------------
 * A growing text
 */

typedef struct text {
    char *data;
    size_t len, capacity;
    int failed;   /* out of memory: the render returns NULL */
} text;

static int reserve(text *t, size_t extra)
{
    if (t->failed)
        return 0;
    if (t->len + extra + 1 <= t->capacity)
        return 1;
    size_t capacity = t->capacity ? t->capacity : 8192;
    while (capacity < t->len + extra + 1)
        capacity *= 2;
    char *grown = realloc(t->data, capacity);
    if (!grown) {
        t->failed = 1;
        return 0;
    }
    t->data = grown;
    t->capacity = capacity;
    return 1;
}

__attribute__((format(printf, 2, 3))) static void put(text *t, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    if (n < 0 || !reserve(t, (size_t)n))
        return;
    va_start(args, fmt);
    vsnprintf(t->data + t->len, (size_t)n + 1, fmt, args);
    va_end(args);
    t->len += (size_t)n;
}

/* a label value: backslash, double quote and newline escaped */
static void put_escaped(text *t, const char *value)
{
    for (const char *c = value ? value : ""; *c; c++) {
        if (!reserve(t, 2))
            return;
        if (*c == '\\' || *c == '"' || *c == '\n')
            t->data[t->len++] = '\\';
        t->data[t->len++] = *c == '\n' ? 'n' : *c;
        t->data[t->len] = '\0';
    }
}

/* a double: the shortest %g that reads back the same; NaN, +Inf, -Inf */
static void put_double(text *t, double v)
{
    if (isnan(v)) {
        put(t, "NaN");
        return;
    }
    if (isinf(v)) {
        put(t, v > 0 ? "+Inf" : "-Inf");
        return;
    }
    char number[40];
    for (int precision = 15; precision <= 17; precision++) {
        snprintf(number, sizeof number, "%.*g", precision, v);
        if (strtod(number, NULL) == v)
            break;
    }
    put(t, "%s", number);
}

/* ------------------------------------------------------------------------------------------
 * Families and samples
 */

static void family(text *t, const char *name, const char *type, const char *help)
{
    put(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* a family of one sample without labels: its HELP and TYPE, then "name value" */
static void unlabeled(text *t, const char *name, const char *type, const char *help, uint64_t value)
{
    family(t, name, type, help);
    put(t, "%s %" PRIu64 "\n", name, value);
}

/* name{key="value" : the caller adds more labels with label(), then ends with a value */
static void sample(text *t, const char *name, const char *key, const char *value)
{
    put(t, "%s{%s=\"", name, key);
    put_escaped(t, value);
    put(t, "\"");
}

static void label(text *t, const char *key, const char *value)
{
    put(t, ",%s=\"", key);
    put_escaped(t, value);
    put(t, "\"");
}

static void end_double(text *t, double v)
{
    put(t, "} ");
    put_double(t, v);
    put(t, "\n");
}

static void end_int(text *t, int64_t v)
{
    put(t, "} %" PRId64 "\n", v);
}

static void end_uint(text *t, uint64_t v)
{
    put(t, "} %" PRIu64 "\n", v);
}

static int clamp(int n, int max)
{
    return n < 0 ? 0 : n > max ? max : n;
}

/* ddtree_run_acceptance_length{run, kind, budget} of n budgets; values < 0 or NaN: none yet */
static void budget_samples(text *t, const char *run, const char *kind, int n, const int64_t *budgets,
                           const double *values)
{
    for (int b = 0; b < n; b++) {
        if (!(values[b] >= 0))
            continue;
        char budget[24];
        snprintf(budget, sizeof budget, "%" PRId64, budgets[b]);
        sample(t, "ddtree_run_acceptance_length", "run", run);
        label(t, "kind", kind);
        label(t, "budget", budget);
        end_double(t, values[b]);
    }
}

/* ------------------------------------------------------------------------------------------
 * The exposition
 */

char *ddt_metrics_render(const ddt_metrics_snapshot *m, size_t *len)
{
    text t = {0};
    const int runs = m->runs && m->run_count > 0 ? m->run_count : 0;
    const int devices = clamp(m->device_count, DDT_METRICS_MAX_DEVICES);
    const int codes = clamp(m->code_count, DDT_METRICS_MAX_CODES);

    family(&t, "ddtree_build_info", "gauge", "The version of ddtreed (always 1).");
    sample(&t, "ddtree_build_info", "version", m->version ? m->version : "unknown");
    end_int(&t, 1);

    family(&t, "ddtree_runs", "gauge", "Runs known to the daemon, by state.");
    for (int j = 0; j < DDT_RUN_STATE_COUNT; j++) {
        sample(&t, "ddtree_runs", "state", ddt_run_state_name(j));
        end_int(&t, m->runs_by_state[j]);
    }

    family(&t, "ddtree_run_step", "gauge", "The last completed step of a run.");
    for (int r = 0; r < runs; r++) {
        sample(&t, "ddtree_run_step", "run", m->runs[r].id);
        end_int(&t, m->runs[r].step);
    }

    family(&t, "ddtree_run_loss", "gauge",
           "The loss of a run's last step: total and its terms ce, kl, cap.");
    for (int r = 0; r < runs; r++) {
        const ddt_metrics_run *run = &m->runs[r];
        const char *terms[4] = {"total", "ce", "kl", "cap"};
        const double values[4] = {run->loss, run->ce, run->kl, run->cap};
        for (int k = 0; k < 4; k++) {
            sample(&t, "ddtree_run_loss", "run", run->id);
            label(&t, "term", terms[k]);
            end_double(&t, values[k]);
        }
    }

    family(&t, "ddtree_run_tokens_total", "counter", "Tokens a run has trained on.");
    for (int r = 0; r < runs; r++) {
        sample(&t, "ddtree_run_tokens_total", "run", m->runs[r].id);
        end_double(&t, m->runs[r].tokens_total);
    }

    family(&t, "ddtree_run_tokens_per_second", "gauge", "A run's training throughput.");
    for (int r = 0; r < runs; r++) {
        sample(&t, "ddtree_run_tokens_per_second", "run", m->runs[r].id);
        end_double(&t, m->runs[r].tokens_per_second);
    }

    family(&t, "ddtree_run_acceptance_length", "gauge",
           "Mean accepted length of the last evaluation: teacher-forced (chain, tree of budget nodes) or speculative decoding (spec, spec_tree: tokens per target call).");
    for (int r = 0; r < runs; r++) {
        const ddt_metrics_run *run = &m->runs[r];
        if (run->tau_chain >= 0) {   /* < 0 or NaN: no evaluation yet */
            sample(&t, "ddtree_run_acceptance_length", "run", run->id);
            label(&t, "kind", "chain");
            end_double(&t, run->tau_chain);
        }
        budget_samples(&t, run->id, "tree", clamp(run->n_budgets, DDT_METRICS_MAX_BUDGETS), run->budgets,
                       run->tau_tree);
        if (run->tau_spec > 0) {   /* speculative decoding on held-out prompts (SPEC.md 7) */
            sample(&t, "ddtree_run_acceptance_length", "run", run->id);
            label(&t, "kind", "spec");
            end_double(&t, run->tau_spec);
        }
        if (run->tau_spec > 0)
            budget_samples(&t, run->id, "spec_tree", clamp(run->n_spec_budgets, DDT_METRICS_MAX_BUDGETS),
                           run->spec_budgets, run->tau_spec_tree);
    }

    family(&t, "ddtree_device_memory_peak_bytes", "gauge",
           "The peak of a device's accounted allocations.");
    for (int d = 0; d < devices; d++) {
        sample(&t, "ddtree_device_memory_peak_bytes", "device", m->device_names[d]);
        end_int(&t, m->device_peak_bytes[d]);
    }

    family(&t, "ddtree_device_memory_used_bytes", "gauge",
           "A device's accounted allocations now.");
    for (int d = 0; d < devices; d++) {
        sample(&t, "ddtree_device_memory_used_bytes", "device", m->device_names[d]);
        end_int(&t, m->device_used_bytes[d]);
    }

    family(&t, "ddtree_step_duration_seconds", "histogram",
           "Wall time of a training step, over all runs.");
    for (int b = 0; b <= DDT_METRICS_BUCKETS; b++) {
        put(&t, "ddtree_step_duration_seconds_bucket{le=\"");
        put_double(&t, b < DDT_METRICS_BUCKETS ? ddt_metrics_bucket_bounds[b] : INFINITY);
        put(&t, "\"} %" PRIu64 "\n", m->step_buckets[b]);
    }
    put(&t, "ddtree_step_duration_seconds_sum ");
    put_double(&t, m->step_seconds_sum);
    put(&t, "\nddtree_step_duration_seconds_count %" PRIu64 "\n", m->step_count);

    family(&t, "ddtree_oom_recoveries_total", "counter",
           "Out-of-memory steps a run recovered from (retried with a smaller chunk).");
    for (int r = 0; r < runs; r++) {
        sample(&t, "ddtree_oom_recoveries_total", "run", m->runs[r].id);
        end_uint(&t, m->runs[r].oom_recoveries);
    }

    family(&t, "ddtree_http_requests_total", "counter", "HTTP responses, by status code.");
    for (int c = 0; c < codes; c++) {
        char code[16];
        snprintf(code, sizeof code, "%d", m->codes[c]);
        sample(&t, "ddtree_http_requests_total", "code", code);
        end_uint(&t, m->code_counts[c]);
    }

    unlabeled(&t, "ddtree_ui_login_failures_total", "counter",
              "Wrong tokens at the web view's login (each logged with its client address).", m->login_failures);
    unlabeled(&t, "ddtree_ui_login_refused_total", "counter",
              "Login tries answered 429: their address had to wait after wrong tokens.", m->login_refused);
    unlabeled(&t, "ddtree_store_degraded", "gauge",
              "1 while the store cannot write (file system full, ddtree.db locked by another process, I/O error): "
              "its records wait, runs are held.", (uint64_t)m->store_degraded);
    unlabeled(&t, "ddtree_store_queued_records", "gauge", "Records waiting in the store's queue to be committed.",
              (uint64_t)m->store_queued);
    unlabeled(&t, "ddtree_store_lock_waits_total", "counter",
              "Writes that found ddtree.db locked by another process and waited.", m->store_lock_waits);
    unlabeled(&t, "ddtree_runs_held", "gauge",
              "Runs paused by a fault (the store cannot write, a checkpoint or export failed), to go on by themselves.",
              (uint64_t)m->runs_held);

    if (t.failed || !t.data) {
        free(t.data);
        return NULL;
    }
    *len = t.len;
    return t.data;
}
