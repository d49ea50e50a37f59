/* runs_snapshots.c: what the HTTP handlers read of the run manager (runs.h, runs_impl.h), each
 * under its lock and never waiting for a step: a run as API.md's GET /runs/{id} object, the list
 * (of a state), the counts per state, the run on a device, the metrics snapshot, whether the
 * workers progress (the watchdog) and systemd's status line.
 * Tested by tests/daemon/api_e2e.py (the real daemon and client) and tests/fuzz/fuzz_api.c.
 */
#include "runs_impl.h"

#include "base/ddt_time.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void add_number_or_null(cJSON *o, const char *key, int has, double v)
{
    if (has && isfinite(v))
        cJSON_AddNumberToObject(o, key, v);
    else
        cJSON_AddNullToObject(o, key);
}

/* o[key] = {"K": values[i], ...} over n budgets (n 0: {}) */
static void add_budgets(cJSON *o, const char *key, int n, const int64_t *budgets, const double *values)
{
    cJSON *b = cJSON_AddObjectToObject(o, key);
    for (int i = 0; i < n; i++) {
        char k[24];
        snprintf(k, sizeof k, "%lld", (long long)budgets[i]);
        cJSON_AddNumberToObject(b, k, values[i]);
    }
}

static cJSON *run_json(const run *u)
{
    cJSON *o = cJSON_CreateObject();
    const ddt_step_record *s = &u->last;
    int has = u->has_record;
    cJSON_AddStringToObject(o, "id", u->id);
    cJSON_AddStringToObject(o, "name", u->name);
    cJSON_AddStringToObject(o, "state", ddt_run_state_name(u->state));
    cJSON_AddNumberToObject(o, "step", (double)u->step);
    cJSON_AddNumberToObject(o, "max_steps", (double)u->max_steps);
    add_number_or_null(o, "loss", has, s->loss);
    add_number_or_null(o, "ce", has, s->ce);
    add_number_or_null(o, "kl", has, s->kl);
    add_number_or_null(o, "cap", has, s->cap);
    add_number_or_null(o, "acc", has, s->acc);
    add_number_or_null(o, "tau_chain", u->tau_chain >= 0, u->tau_chain);
    add_budgets(o, "tau_tree", u->tau_chain >= 0 ? u->n_budgets : 0, u->budgets, u->tau_tree);
    if (u->unary_tau_chain >= 0) {   /* a DFlash2 run: the figures above are its selector's */
        cJSON *unary = cJSON_AddObjectToObject(o, "unary");
        cJSON_AddNumberToObject(unary, "tau_chain", u->unary_tau_chain);
        add_budgets(unary, "tau_tree", u->n_budgets, u->budgets, u->unary_tau_tree);
    } else {
        cJSON_AddNullToObject(o, "unary");
    }
    add_number_or_null(o, "tau_spec", u->tau_spec >= 0, u->tau_spec);
    add_budgets(o, "tau_spec_tree", u->tau_spec >= 0 ? u->n_spec_budgets : 0, u->spec_budgets, u->tau_spec_tree);
    if (u->tau_spec >= 0) {   /* the newest speculative evaluation's step, prompts, verdict, cost */
        cJSON *spec = cJSON_AddObjectToObject(o, "speculative");
        cJSON_AddNumberToObject(spec, "step", (double)u->spec_step);
        cJSON_AddNumberToObject(spec, "prompts", (double)u->spec_prompts);
        cJSON_AddBoolToObject(spec, "greedy_equal", u->spec_mismatched == 0);
        cJSON_AddNumberToObject(spec, "seconds", u->spec_seconds);
    } else {
        cJSON_AddNullToObject(o, "speculative");
    }
    add_number_or_null(o, "tokens_per_s", has, s->tokens_per_s);
    add_number_or_null(o, "positions_per_s", has, s->positions_per_s);
    /* the run's peak: the largest over its steps (a re-chunk to a smaller chunk lowers the
     * newest step's, newest_step, not the run's), per device too */
    cJSON *peak = cJSON_AddObjectToObject(o, "peak_memory_bytes");
    add_number_or_null(peak, "max", has, (double)u->peak_bytes);
    cJSON *devices = cJSON_AddObjectToObject(peak, "devices");
    for (int d = 0; has && d < s->devices; d++) {
        char k[24];
        snprintf(k, sizeof k, "cpu:%d", d);
        cJSON_AddNumberToObject(devices, k, (double)u->device_peak_bytes[d]);
    }
    add_number_or_null(peak, "newest_step", has, (double)s->peak_bytes);
    add_number_or_null(o, "chunk", has || u->chunk > 0, (double)(has ? s->chunk : u->chunk));
    add_number_or_null(o, "vocab_tile", has || u->chunk > 0, (double)(has ? s->vocab_tile : u->vocab_tile));
    cJSON_AddNumberToObject(o, "tokens_total", u->tokens_total);
    cJSON_AddNumberToObject(o, "oom_recoveries", (double)u->oom_recoveries);
    add_number_or_null(o, "created_ms", u->created_ms > 0, (double)u->created_ms);
    add_number_or_null(o, "started_ms", u->started_ms > 0, (double)u->started_ms);
    add_number_or_null(o, "updated_ms", u->updated_ms > 0, (double)u->updated_ms);
    add_number_or_null(o, "finished_ms", u->finished_ms > 0, (double)u->finished_ms);
    add_number_or_null(o, "last_checkpoint_step", u->last_checkpoint_step >= 0, (double)u->last_checkpoint_step);
    if (*u->error)
        cJSON_AddStringToObject(o, "error", u->error);
    else
        cJSON_AddNullToObject(o, "error");
    cJSON_AddBoolToObject(o, "held", u->hold);   /* paused by a fault: it goes on by itself (error says why) */
    /* a worker holds it (checkpoint and export at its next step boundary; without one, export
     * writes the newest checkpoint's) */
    cJSON_AddBoolToObject(o, "worker", ddt_runs_has_worker(u));
    return o;
}

int ddt_runs_known(ddt_runs *r, const char *id)
{
    pthread_mutex_lock(&r->lock);
    int known = ddt_runs_find(r, id) != NULL;
    pthread_mutex_unlock(&r->lock);
    return known;
}

cJSON *ddt_runs_get(ddt_runs *r, const char *id)
{
    pthread_mutex_lock(&r->lock);
    run *u = ddt_runs_find(r, id);
    cJSON *o = u ? run_json(u) : NULL;
    pthread_mutex_unlock(&r->lock);
    return o;
}

cJSON *ddt_runs_list(ddt_runs *r, const char *state, char *err, size_t err_len)
{
    ddt_run_state want = DDT_RUN_QUEUED;
    if (state && ddt_run_state_parse(state, &want)) {
        char names[160] = "";
        for (int s = 0; s < DDT_RUN_STATE_COUNT; s++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", s ? ", " : "",
                     ddt_run_state_name((ddt_run_state)s));
        snprintf(err, err_len, "state must be one of %s (got \"%s\")", names, state);
        return NULL;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(o, "runs");
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->count; i++)
        if (!state || r->runs[i]->state == want)
            cJSON_AddItemToArray(list, run_json(r->runs[i]));
    pthread_mutex_unlock(&r->lock);
    return o;
}

void ddt_runs_counts(ddt_runs *r, int64_t counts[DDT_RUN_STATE_COUNT])
{
    memset(counts, 0, sizeof(int64_t) * DDT_RUN_STATE_COUNT);
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->count; i++)
        counts[r->runs[i]->state]++;
    pthread_mutex_unlock(&r->lock);
}

int ddt_runs_on_device(ddt_runs *r, int rank, char *id, size_t id_len)
{
    int found = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->count && !found; i++) {   /* a live run holds cpu:0 .. its ranks - 1 */
        run *u = r->runs[i];
        int ranks = u->has_record ? u->last.devices : 1;
        if (u->has_thread && !u->thread_done && rank < ranks) {
            snprintf(id, id_len, "%s", u->id);
            found = 1;
        }
    }
    pthread_mutex_unlock(&r->lock);
    return found;
}

void ddt_runs_metrics(ddt_runs *r, ddt_metrics_snapshot *m)
{
    ddt_runs_counts(r, m->runs_by_state);
    pthread_mutex_lock(&r->lock);
    m->runs = calloc((size_t)(r->count ? r->count : 1), sizeof *m->runs);
    m->run_count = 0;
    for (int i = 0; m->runs && i < r->count; i++) {
        const run *u = r->runs[i];
        if (!ddt_runs_active(u->state))
            continue;
        ddt_metrics_run *x = &m->runs[m->run_count++];
        snprintf(x->id, sizeof x->id, "%s", u->id);
        x->step = u->step;
        x->loss = u->has_record ? u->last.loss : NAN;
        x->ce = u->has_record ? u->last.ce : NAN;
        x->kl = u->has_record ? u->last.kl : NAN;
        x->cap = u->has_record ? u->last.cap : NAN;
        x->tokens_total = u->tokens_total;
        x->tokens_per_second = u->has_record ? u->last.tokens_per_s : 0;
        x->tau_chain = u->tau_chain;
        x->n_budgets = u->n_budgets < DDT_METRICS_MAX_BUDGETS ? u->n_budgets : DDT_METRICS_MAX_BUDGETS;
        for (int b = 0; b < x->n_budgets; b++) {
            x->budgets[b] = u->budgets[b];
            x->tau_tree[b] = u->tau_tree[b];
        }
        x->tau_spec = u->tau_spec;
        x->n_spec_budgets = u->n_spec_budgets < DDT_METRICS_MAX_BUDGETS ? u->n_spec_budgets : DDT_METRICS_MAX_BUDGETS;
        for (int b = 0; b < x->n_spec_budgets; b++) {
            x->spec_budgets[b] = u->spec_budgets[b];
            x->tau_spec_tree[b] = u->tau_spec_tree[b];
        }
        x->oom_recoveries = u->oom_recoveries;
    }
    uint64_t cumulative = 0;   /* Prometheus buckets count every step at or below their bound */
    for (int b = 0; b <= DDT_METRICS_BUCKETS; b++)
        m->step_buckets[b] = cumulative += r->step_buckets[b];
    m->step_seconds_sum = r->step_seconds_sum;
    for (int i = 0; i < r->count; i++)
        m->runs_held += r->runs[i]->hold;
    m->step_count = r->step_count;
    pthread_mutex_unlock(&r->lock);
}

int64_t ddt_runs_held(ddt_runs *r)
{
    int64_t n = 0;
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->count; i++)
        n += r->runs[i]->hold;
    pthread_mutex_unlock(&r->lock);
    return n;
}

int ddt_runs_progressing(ddt_runs *r, double stall_s)
{
    int ok = 1;
    double now = ddt_mono_s();
    pthread_mutex_lock(&r->lock);
    for (int i = 0; i < r->count && ok; i++) {
        const run *u = r->runs[i];
        if (u->has_thread && !u->thread_done && u->state == DDT_RUN_RUNNING && now - u->last_progress_s > stall_s)
            ok = 0;
    }
    pthread_mutex_unlock(&r->lock);
    return ok;
}

void ddt_runs_summary(ddt_runs *r, char *out, size_t len)
{
    int64_t counts[DDT_RUN_STATE_COUNT];
    ddt_runs_counts(r, counts);
    snprintf(out, len, "%lld running, %lld queued, %lld paused, %lld done", (long long)counts[DDT_RUN_RUNNING],
             (long long)counts[DDT_RUN_QUEUED], (long long)counts[DDT_RUN_PAUSED],
             (long long)(counts[DDT_RUN_COMPLETED] + counts[DDT_RUN_FAILED] + counts[DDT_RUN_CANCELLED]));
}
