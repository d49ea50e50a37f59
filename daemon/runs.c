/* runs.c: the run manager (runs.h).
 *
 * One mutex guards every run's snapshot and requests; a worker thread per active run owns its
 * trainer and looks at its requests only between steps, so a step is never torn. Each state
 * change goes through set_state: along run_state.h's table (its diagram shows which request
 * makes which change), enqueued under the lock (ddt_store_run_transition_enqueue: the runs row
 * and its "state" event together, in the order of the changes) and waited for by unlock() once
 * the lock is released: no thread waits on the disk while holding the lock every HTTP handler
 * takes. A run's row is created (a write waited for) before the run joins the list, unlocked.
 * A run's config is parsed, validated and resolved once (prepare: at submit, or when the run is
 * loaded at start-up) and kept: the scheduler reads its devices, the worker hands it to the
 * trainer. The loop's cadence (evaluations, checkpoints, the export) is the trainer's
 * (ddt_trainer_advance / _finish, as in `ddtreed train`); the worker keeps the requests and the
 * states.
 * Tested by tests/api_e2e.py.
 */
#include "base/ddt_time.h"
#include "runs.h"
#include "record/checkpoint.h"
#include "base/log.h"
#include "run/planner.h"
#include "run/run_config.h"
#include "record/store_read.h"
#include "train/trainer.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct run {
    char id[40], name[DDT_RUN_NAME];
    char *config_json;                  /* as submitted: the row's, the checkpoints' */
    ddt_run_config config;              /* parsed once (prepare), resolved; active runs only */
    ddt_devices devices;                /* its ranks on this node */
    int config_rc;                      /* 0, or why it cannot start here (config_error) */
    char config_error[512];
    ddt_run_state state;
    int64_t step, max_steps, last_checkpoint_step;
    int64_t created_ms, started_ms, updated_ms, finished_ms;
    char error[512];
    int has_record;
    ddt_step_record last;               /* the newest step */
    double tokens_total;
    uint64_t oom_recoveries;
    double tau_chain;                   /* < 0 until evaluated */
    int n_budgets;
    int64_t budgets[DDT_MAX_EVAL_BUDGETS];
    double tau_tree[DDT_MAX_EVAL_BUDGETS];
    /* the newest speculative evaluation (SPEC.md 7: eval.speculative or POST .../speculate) */
    double tau_spec;                    /* < 0 until one */
    int n_spec_budgets;
    int64_t spec_budgets[DDT_MAX_EVAL_BUDGETS];
    double tau_spec_tree[DDT_MAX_EVAL_BUDGETS];
    int64_t spec_step, spec_prompts, spec_mismatched;
    double spec_seconds;
    int64_t chunk, vocab_tile;
    /* the worker */
    int has_thread, thread_done, resume;
    uint64_t gpus;                      /* the GPUs its worker holds (bit i: cuda:i) */
    pthread_t thread;
    double last_progress_s;             /* monotonic time of its last step or control */
    /* requests, applied at the next step boundary */
    int want_pause, want_resume, want_cancel, want_checkpoint, want_export, want_spec;
    ddt_trainer_spec_request spec_request;   /* want_spec's */
    int64_t want_chunk, want_tile;      /* -1: none */
    struct ddt_runs *owner;
} run;

struct ddt_runs {
    char state_dir[1024], db_path[1100];
    ddt_store *store;
    pthread_mutex_t lock;
    pthread_cond_t wake;                /* paused workers wait on it */
    run **runs;
    int count, capacity, max_parallel, closing;
    void (*notify)(void *);
    void *notify_ctx;
    uint64_t step_buckets[DDT_METRICS_BUCKETS + 1];
    double step_seconds_sum;
    uint64_t step_count;
};

static run *find(ddt_runs *r, const char *id)
{
    for (int i = 0; i < r->count; i++)
        if (!strcmp(r->runs[i]->id, id))
            return r->runs[i];
    return NULL;
}

static int active(ddt_run_state s)
{
    return !ddt_run_state_final(s);
}

/* The state writes this thread enqueued while holding the lock (set_state), newest first;
 * unlock() waits for them once the lock is released. */
typedef struct pending_write {
    ddt_store *store;
    ddt_store_pending *pending;
    char id[40];
    ddt_run_state from, to;
    struct pending_write *next;
} pending_write;
static _Thread_local pending_write *pending_writes;

/* Releases the lock, then waits for the state writes this thread enqueued under it: a state
 * change is committed when the call that made it returns, as when it was written under the
 * lock, but no one waits on the disk while holding it. */
static void unlock(ddt_runs *r)
{
    pending_write *w = pending_writes;
    pending_writes = NULL;
    pthread_mutex_unlock(&r->lock);
    while (w) {   /* in any order: the store commits them in the order they were enqueued */
        int rc = ddt_store_wait(w->store, w->pending);
        if (rc)
            ddt_log(DDT_LOG_ERR, "run=%s state change from=%s to=%s not recorded: %s", w->id,
                    ddt_run_state_name(w->from), ddt_run_state_name(w->to), strerror(-rc));
        pending_write *next = w->next;
        free(w);
        w = next;
    }
}

/* unlock() and lock again: before a wait on the condition, the writes are waited for */
static void settle(ddt_runs *r)
{
    if (pending_writes) {
        unlock(r);
        pthread_mutex_lock(&r->lock);
    }
}

/* A state change, with the lock: the snapshot, the runs row and its "state" event (one
 * transition enqueued; the caller's unlock() waits for it), the log, the main loop. A change
 * that run_state.h's table lacks is a bug of the manager: logged, and nothing changes. */
static void set_state(ddt_runs *r, run *u, ddt_run_state s, const char *error)
{
    ddt_run_state from = u->state;
    if (!ddt_run_transition_legal(from, s)) {
        ddt_log(DDT_LOG_ERR, "run=%s illegal state change from=%s to=%s left undone (a bug of the run "
                "manager)", u->id, ddt_run_state_name(from), ddt_run_state_name(s));
        return;
    }
    u->state = s;
    u->updated_ms = ddt_wall_ms();
    if (s == DDT_RUN_RUNNING && u->started_ms < 0)   /* as the store does to the row */
        u->started_ms = u->updated_ms;
    if (ddt_run_state_final(s))
        u->finished_ms = u->updated_ms;
    if (error)
        snprintf(u->error, sizeof u->error, "%s", error);
    int rc = 0;
    if (r->store) {
        pending_write *w = calloc(1, sizeof *w);
        rc = w ? ddt_store_run_transition_enqueue(r->store, u->id, from, s, u->step, u->last_checkpoint_step,
                                                  u->updated_ms, error, &w->pending)
               : -ENOMEM;
        if (rc == 0) {
            *w = (pending_write){ r->store, w->pending, "", from, s, pending_writes };
            snprintf(w->id, sizeof w->id, "%s", u->id);
            pending_writes = w;
        } else {
            free(w);
        }
    }
    if (rc)
        ddt_log(DDT_LOG_ERR, "run=%s state change from=%s to=%s not recorded: %s", u->id,
                ddt_run_state_name(from), ddt_run_state_name(s), strerror(-rc));
    ddt_log(s == DDT_RUN_FAILED ? DDT_LOG_ERR : DDT_LOG_INFO, "run=%s state=%s step=%lld%s%s", u->id,
            ddt_run_state_name(s), (long long)u->step, error ? " error=" : "", error ? error : "");
    if (r->notify)
        r->notify(r->notify_ctx);
}

/* ------------------------------------------------------------------------------------------
 * The worker: one training run
 */

static void *worker_main(void *arg);

/* The GPUs a run's ranks take on this node (its kept devices). CPU ranks are not held: runs on
 * the CPU share its cores (and the per-rank accounting). A config that names what the node
 * lacks takes nothing here: its worker fails at once naming it. */
static uint64_t run_gpus(const run *u)
{
    uint64_t gpus = 0;
    if (u->config_rc == 0 && u->devices.gpu)
        for (int i = 0; i < u->devices.ranks; i++)   /* "all": only the GPUs it trains on */
            gpus |= (uint64_t)1 << u->devices.gpu_ids[i];
    return gpus;
}

/* Starts workers for queued (and interrupted) runs while slots are free and their GPUs are not
 * held by a running one (a run owns its GPUs until its worker ends); in queue order, a run whose
 * GPUs are busy letting a later one with free GPUs start. With the lock. */
static void schedule(ddt_runs *r)
{
    int busy = 0;
    uint64_t held = 0;
    for (int i = 0; i < r->count; i++)
        if (r->runs[i]->has_thread && !r->runs[i]->thread_done) {
            busy++;
            held |= r->runs[i]->gpus;
        }
    for (int i = 0; i < r->count && busy < r->max_parallel && !r->closing; i++) {
        run *u = r->runs[i];
        if ((u->state != DDT_RUN_QUEUED && u->state != DDT_RUN_INTERRUPTED) || (u->has_thread && !u->thread_done))
            continue;
        u->gpus = run_gpus(u);
        if (u->gpus & held)
            continue;   /* waits for its GPUs */
        held |= u->gpus;
        if (u->has_thread) {   /* a finished worker of an earlier life of this run */
            pthread_join(u->thread, NULL);
            u->has_thread = 0;
        }
        u->thread_done = 0;
        u->last_progress_s = ddt_mono_s();
        if (pthread_create(&u->thread, NULL, worker_main, u) == 0) {
            u->has_thread = 1;
            busy++;
        } else {
            set_state(r, u, DDT_RUN_FAILED, "could not start its worker thread");
        }
    }
}

static void record_step(ddt_runs *r, run *u, const ddt_step_record *rec)
{
    u->has_record = 1;
    u->last = *rec;
    u->step = rec->step;
    u->tokens_total += (double)rec->tokens;
    u->chunk = rec->chunk;
    u->vocab_tile = rec->vocab_tile;
    u->updated_ms = rec->ts_ms;
    u->last_progress_s = ddt_mono_s();
    double s = rec->step_ms / 1e3;
    int b = 0;
    while (b < DDT_METRICS_BUCKETS && s > ddt_metrics_bucket_bounds[b])
        b++;
    r->step_buckets[b]++;
    r->step_seconds_sum += s;
    r->step_count++;
}

static void record_eval(run *u, const ddt_acceptance *a)
{
    u->tau_chain = ddt_acceptance_tau_chain(a);
    u->n_budgets = a->n_budgets;
    for (int i = 0; i < a->n_budgets; i++) {
        u->budgets[i] = a->budgets[i];
        u->tau_tree[i] = ddt_acceptance_tau_tree(a, i);
    }
}

static void record_spec(run *u, int64_t step, const ddt_speculate_totals *t)
{
    u->tau_spec = ddt_speculate_tau(t);
    u->n_spec_budgets = t->n_budgets;
    for (int i = 0; i < t->n_budgets; i++) {
        u->spec_budgets[i] = t->budgets[i];
        u->tau_spec_tree[i] = ddt_speculate_tau_tree(t, i);
    }
    u->spec_step = step;
    u->spec_prompts = t->prompts;
    u->spec_mismatched = t->mismatched;
    u->spec_seconds = t->greedy_seconds + t->chain_seconds;
    for (int i = 0; i < t->n_budgets; i++)
        u->spec_seconds += t->tree_seconds[i];
}

/* POST /runs/{id}/speculate, outside the lock: 0 with the totals, or logged and an error event */
static int speculate_now(ddt_runs *r, run *u, ddt_trainer *t, const ddt_trainer_spec_request *q,
                         ddt_speculate_totals *out)
{
    char err[1024];
    int rc = ddt_trainer_speculate(t, q, out, err, sizeof err);
    if (!rc)
        return 0;
    ddt_log(DDT_LOG_ERR, "run=%s speculative evaluation failed: %s", u->id, err);
    if (r->store) {
        cJSON *d = cJSON_CreateObject();
        char message[1200];
        snprintf(message, sizeof message, "the speculative evaluation (POST speculate) failed: %s", err);
        cJSON_AddNumberToObject(d, "step", (double)(q->step >= 0 ? q->step : ddt_trainer_step_count(t)));
        cJSON_AddStringToObject(d, "message", message);
        char *detail = cJSON_PrintUnformatted(d);
        if (detail)
            ddt_store_event(r->store, u->id, ddt_wall_ms(), "error", detail);
        free(detail);
        cJSON_Delete(d);
    }
    return rc;
}

/* A checkpoint asked for (always), or the one of a stop (ddt_trainer_hold), outside the lock */
static void checkpoint(run *u, ddt_trainer *t, int always)
{
    char err[1024];
    if ((always ? ddt_trainer_checkpoint : ddt_trainer_hold)(t, err, sizeof err))
        ddt_log(DDT_LOG_ERR, "run=%s checkpoint failed: %s", u->id, err);
}

static void export_now(run *u, ddt_trainer *t)
{
    char dir[2200], err[1024];
    snprintf(dir, sizeof dir, "%s/export", ddt_trainer_run_dir(t));
    if (ddt_trainer_export(t, dir, err, sizeof err))
        ddt_log(DDT_LOG_ERR, "run=%s export failed: %s", u->id, err);
}

/* what the trainer did, into the snapshot (with the lock) */
static void note_checkpoint(run *u, const ddt_trainer *t)
{
    if (ddt_trainer_checkpoint_step(t) >= 0)
        u->last_checkpoint_step = ddt_trainer_checkpoint_step(t);
    u->last_progress_s = ddt_mono_s();
}

static void *worker_main(void *arg)
{
    run *u = arg;
    ddt_runs *r = u->owner;
    char err[2048] = "";
    ddt_trainer *t = NULL;
    int rc = u->config_rc;
    if (rc)
        snprintf(err, sizeof err, "%s", u->config_error);
    else
        rc = ddt_trainer_open_parsed(&u->config, u->config_json, &u->devices, r->state_dir, u->id, u->resume,
                                     r->store, &t, err, sizeof err);
    pthread_mutex_lock(&r->lock);
    if (rc) {
        set_state(r, u, DDT_RUN_FAILED, err);
        goto done;
    }
    u->resume = 1;   /* from now on a restart continues from its checkpoints */
    u->step = ddt_trainer_step_count(t);
    if (*ddt_trainer_devices_note(t))
        ddt_log(DDT_LOG_INFO, "run=%s %s", u->id, ddt_trainer_devices_note(t));
    set_state(r, u, DDT_RUN_RUNNING, NULL);
    ddt_trainer_outcome o;
    for (;;) {
        /* ---- the step boundary: requests ---- */
        if (r->closing || u->want_cancel) {
            ddt_run_state end = r->closing ? DDT_RUN_INTERRUPTED : DDT_RUN_CANCELLED;
            unlock(r);
            checkpoint(u, t, 0);   /* a final checkpoint is kept */
            pthread_mutex_lock(&r->lock);
            note_checkpoint(u, t);
            set_state(r, u, end, NULL);
            break;
        }
        if (u->want_chunk >= 0 || u->want_tile >= 0) {
            ddt_trainer_rechunk(t, u->want_chunk > 0 ? u->want_chunk : -1, u->want_tile, err, sizeof err);
            u->chunk = u->want_chunk > 0 ? u->want_chunk : u->chunk;
            u->vocab_tile = u->want_tile >= 0 ? u->want_tile : u->vocab_tile;
            u->want_chunk = u->want_tile = -1;
        }
        int want_ckpt = u->want_checkpoint, want_export = u->want_export, pause = u->want_pause,
            want_spec = u->want_spec;
        const ddt_trainer_spec_request spec_request = u->spec_request;
        u->want_checkpoint = u->want_export = u->want_spec = 0;
        unlock(r);
        if (want_ckpt || pause)
            checkpoint(u, t, want_ckpt);
        if (want_export)
            export_now(u, t);
        ddt_speculate_totals spec;
        int spec_done = want_spec && speculate_now(r, u, t, &spec_request, &spec) == 0;
        pthread_mutex_lock(&r->lock);
        note_checkpoint(u, t);
        if (spec_done)
            record_spec(u, spec_request.step >= 0 ? spec_request.step : ddt_trainer_step_count(t), &spec);
        if (pause) {
            u->want_pause = 0;
            if (u->state != DDT_RUN_PAUSED)
                set_state(r, u, DDT_RUN_PAUSED, NULL);
            settle(r);
            while (!u->want_resume && !u->want_cancel && !r->closing && !u->want_checkpoint && !u->want_export &&
                   !u->want_spec)
                pthread_cond_wait(&r->wake, &r->lock);
            if (u->want_resume) {
                u->want_resume = 0;
                set_state(r, u, DDT_RUN_RUNNING, NULL);
            } else if (r->closing && !u->want_cancel) {
                break;   /* it stays paused (checkpointed): a restart leaves it to the user */
            } else if (!u->want_cancel && !r->closing) {
                u->want_pause = 1;   /* a checkpoint, export or speculation while paused: do it, stay paused */
            }
            continue;
        }
        unlock(r);

        /* ---- the trainer's next thing (a step and what falls due after it), outside the lock ---- */
        rc = ddt_trainer_advance(t, &o, err, sizeof err);
        char finish_err[1024];
        if (rc == 0 && o.done && ddt_trainer_finish(t, finish_err, sizeof finish_err))
            ddt_log(DDT_LOG_ERR, "run=%s at its end: %s", u->id, finish_err);
        if (*o.warning)
            ddt_log(DDT_LOG_ERR, "run=%s %s", u->id, o.warning);
        pthread_mutex_lock(&r->lock);
        note_checkpoint(u, t);
        if (rc) {
            set_state(r, u, DDT_RUN_FAILED, err);
            break;
        }
        if (o.done) {   /* the training is complete, even when its export failed (an error event) */
            set_state(r, u, DDT_RUN_COMPLETED, NULL);
            break;
        }
        u->oom_recoveries = ddt_trainer_oom_recoveries(t);
        if (o.stepped)
            record_step(r, u, &o.rec);
        if (o.evaluated)
            record_eval(u, &o.acceptance);
        if (o.speculated)
            record_spec(u, ddt_trainer_step_count(t), &o.spec);
    }
done:
    unlock(r);
    ddt_trainer_close(t);   /* before the next run starts: it gives the ranks' memory back */
    pthread_mutex_lock(&r->lock);
    u->thread_done = 1;
    schedule(r);            /* a slot is free */
    unlock(r);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Open, close, submit
 */

/* A run record of config_json (len bytes), not yet in the list; NULL without memory. */
static run *new_run(ddt_runs *r, const char *id, const char *config_json, size_t len)
{
    run *u = calloc(1, sizeof *u);
    if (!u || !(u->config_json = strndup(config_json, len))) {
        free(u);
        return NULL;
    }
    snprintf(u->id, sizeof u->id, "%s", id);
    u->owner = r;
    u->tau_chain = u->tau_spec = -1;
    u->started_ms = u->finished_ms = u->last_checkpoint_step = -1;
    u->want_chunk = u->want_tile = -1;
    return u;
}

static void free_run(run *u)
{
    ddt_run_config_free(&u->config);
    free(u->config_json);
    free(u);
}

/* u into the list (with the lock); -ENOMEM */
static int add_run(ddt_runs *r, run *u)
{
    if (r->count == r->capacity) {
        int cap = r->capacity ? 2 * r->capacity : 16;
        run **grown = realloc(r->runs, (size_t)cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        r->runs = grown;
        r->capacity = cap;
    }
    r->runs[r->count++] = u;
    return 0;
}

/* The run's config (json, len bytes: what it was submitted with), parsed, validated and
 * resolved once, kept in u: what can be checked before the run starts is, the devices against
 * what the config asks of them (more ranks than sequences per step, a head_dim beyond the GPUs'
 * attention), the target's shape and the drafter. 0, or the config's error (err, field). A
 * GPU this node lacks (-ENODEV) is not an error of the config: it is kept in u->config_rc and
 * u->config_error, and the run fails at its start naming it. */
static int prepare(run *u, const char *json, size_t len, char *err, size_t err_len, char *field, size_t field_len)
{
    ddt_run_config *c = &u->config;
    int rc = ddt_run_config_parse(json, len, c, err, err_len, field, field_len);
    if (rc)
        return rc;
    rc = ddt_run_config_devices(c, ddt_node_here(), &u->devices, err, err_len, field, field_len);
    if (rc == -ENODEV) {
        u->config_rc = rc;
        snprintf(u->config_error, sizeof u->config_error, "%s", err);
        rc = 0;
        *field = '\0';
    }
    if (rc)
        return rc;
    int64_t hidden, vocab, layers;
    int tied;
    rc = ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, err, err_len);
    if (!rc && (rc = ddt_run_config_resolve(c, hidden, vocab, layers, err, err_len))) {
        /* its sentence starts with the field's JSON path ("drafter.target_layer_ids: ...") */
        const size_t n = strcspn(err, ": ");
        snprintf(field, field_len, "%.*s", err[n] == ':' && n < field_len ? (int)n : 7, err[n] == ':' ? err : "drafter");
    }
    if (rc && !*field)
        snprintf(field, field_len, "target");
    return rc;
}

/* a row's state; failed for a name that is none (a database edited by hand) */
static ddt_run_state state_of(const char *name)
{
    ddt_run_state s = DDT_RUN_FAILED;
    ddt_run_state_parse(name, &s);
    return s;
}

int ddt_runs_open(const char *state_dir, const char *db_path, ddt_store *store, int max_parallel,
                  void (*notify)(void *), void *notify_ctx, ddt_runs **out, char *err, size_t err_len)
{
    ddt_runs *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, err_len, "no memory for the run manager");
        return -ENOMEM;
    }
    snprintf(r->state_dir, sizeof r->state_dir, "%s", state_dir);
    snprintf(r->db_path, sizeof r->db_path, "%s", db_path);
    r->store = store;
    r->max_parallel = max_parallel;
    r->notify = notify;
    r->notify_ctx = notify_ctx;
    pthread_mutex_init(&r->lock, NULL);
    pthread_cond_init(&r->wake, NULL);
    ddt_run_row *rows = NULL;
    int count = 0;
    int rc = ddt_store_read_runs(db_path, &rows, &count, err, err_len);
    pthread_mutex_lock(&r->lock);
    for (int i = 0; rc == 0 && i < count; i++) {
        const char *json = rows[i].config_json ? rows[i].config_json : "{}";
        run *u = new_run(r, rows[i].id, json, strlen(json));
        if (!u || add_run(r, u)) {
            if (u)
                free_run(u);
            snprintf(err, err_len, "no memory for the run list");
            rc = -ENOMEM;
            break;
        }
        snprintf(u->name, sizeof u->name, "%s", rows[i].name);
        u->state = state_of(rows[i].state);
        u->step = rows[i].step > 0 ? rows[i].step : 0;
        u->max_steps = rows[i].max_steps;
        u->last_checkpoint_step = rows[i].last_checkpoint_step;
        u->created_ms = rows[i].created_ms;
        u->started_ms = rows[i].started_ms;
        u->updated_ms = rows[i].updated_ms;
        u->finished_ms = rows[i].finished_ms;
        if (rows[i].error)
            snprintf(u->error, sizeof u->error, "%s", rows[i].error);
        u->resume = u->last_checkpoint_step >= 0 || u->step > 0;
        /* a run that may start again is parsed now, once; one that no longer parses (a database
         * of another version, edited by hand) fails when it starts, saying why */
        char why[512], field[160];
        int bad = active(u->state) ? prepare(u, json, strlen(json), why, sizeof why, field, sizeof field) : 0;
        if (bad) {
            u->config_rc = bad;
            snprintf(u->config_error, sizeof u->config_error, "%s", why);
            ddt_log(DDT_LOG_WARNING, "run=%s its config does not parse: %s", u->id, why);
        }
        /* the daemon stopped (or died) under these: they resume from their checkpoints */
        if (u->state == DDT_RUN_RUNNING || u->state == DDT_RUN_PAUSING)
            set_state(r, u, DDT_RUN_INTERRUPTED, NULL);
    }
    ddt_store_free_runs(rows, count);
    if (rc == 0)
        schedule(r);
    unlock(r);
    if (rc) {
        ddt_runs_close(r);
        return rc;
    }
    *out = r;
    return 0;
}

void ddt_runs_close(ddt_runs *r)
{
    if (!r)
        return;
    pthread_mutex_lock(&r->lock);
    r->closing = 1;
    pthread_cond_broadcast(&r->wake);
    pthread_mutex_unlock(&r->lock);
    for (int i = 0; i < r->count; i++)
        if (r->runs[i]->has_thread)
            pthread_join(r->runs[i]->thread, NULL);
    for (int i = 0; i < r->count; i++)
        free_run(r->runs[i]);
    free(r->runs);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->wake);
    free(r);
}

void ddt_runs_set_parallel(ddt_runs *r, int max_parallel)
{
    pthread_mutex_lock(&r->lock);
    r->max_parallel = max_parallel;
    schedule(r);
    unlock(r);
}

int ddt_runs_submit(ddt_runs *r, const char *json, size_t len, char *id, size_t id_len,
                    char *err, size_t err_len, char *field, size_t field_len)
{
    char new_id[40];
    ddt_store_new_run_id(new_id, sizeof new_id);
    run *u = new_run(r, new_id, json, len);
    if (!u) {
        snprintf(err, err_len, "no memory for another run");
        return -ENOMEM;
    }
    int rc = prepare(u, json, len, err, err_len, field, field_len);
    if (rc) {
        free_run(u);
        return rc;
    }
    snprintf(u->name, sizeof u->name, "%s", u->config.name);
    u->state = DDT_RUN_QUEUED;
    u->max_steps = u->config.steps;
    u->created_ms = u->updated_ms = ddt_wall_ms();
    /* the row before the run is in the list, outside the lock (its write is waited for); the
     * store refuses an id it has (two in the same second): another one then */
    for (int tries = 0; r->store && tries < 8; tries++) {
        rc = ddt_store_run_create(r->store, u->id, u->name, u->config_json, u->max_steps, u->created_ms);
        if (rc != -EEXIST)
            break;
        ddt_store_new_run_id(u->id, sizeof u->id);
    }
    if (rc) {
        snprintf(err, err_len, "the database refused the run (%s)", strerror(-rc));
        free_run(u);
        return rc;
    }
    pthread_mutex_lock(&r->lock);
    while (!r->store && find(r, u->id))   /* no store to refuse a repeated id */
        ddt_store_new_run_id(u->id, sizeof u->id);
    if (add_run(r, u)) {
        pthread_mutex_unlock(&r->lock);
        snprintf(err, err_len, "no memory for another run");
        free_run(u);   /* its row stays queued: the next start of the daemon runs it */
        return -ENOMEM;
    }
    snprintf(id, id_len, "%s", u->id);
    ddt_log(DDT_LOG_INFO, "run=%s name=\"%s\" queued steps=%lld", u->id, u->name, (long long)u->max_steps);
    schedule(r);
    unlock(r);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Controls
 */

static int illegal(run *u, const char *what, char *err, size_t err_len)
{
    snprintf(err, err_len, "cannot %s run %s: it is %s", what, u->id, ddt_run_state_name(u->state));
    return -EBUSY;
}

static cJSON *state_reply(ddt_run_state s)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "state", ddt_run_state_name(s));
    return o;
}

/* an integer member of a control body in [lo, hi] */
static int body_integer(const cJSON *item, double lo, double hi, int64_t *out, char *err, size_t err_len,
                        char *field, size_t field_len)
{
    double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
    if (!(v == floor(v)) || v < lo || v > hi) {
        snprintf(field, field_len, "%s", item->string);
        snprintf(err, err_len, "%s must be an integer in [%.0f, %.0f]", item->string, lo, hi);
        return -EINVAL;
    }
    *out = (int64_t)v;
    return 0;
}

/* POST /runs/{id}/speculate's body {"step": N?, "prompts": K?, "gen_len": G?, "tree_budgets": [..]?}
 * against the run's speculator caps (ddt_run_config_spec_caps): 0 with q, or -EINVAL */
static int parse_speculate(const cJSON *body, const ddt_run_config *c, ddt_trainer_spec_request *q, char *err,
                           size_t err_len, char *field, size_t field_len)
{
    int64_t max_prompts, max_gen, max_budget;
    ddt_run_config_spec_caps(c, &max_prompts, &max_gen, &max_budget);
    *q = (ddt_trainer_spec_request){ .step = -1, .n_budgets = -1 };
    if (body && !cJSON_IsObject(body)) {
        snprintf(err, err_len, "the body must be a JSON object {\"step\": N, \"prompts\": K, \"gen_len\": G, "
                 "\"tree_budgets\": [..]} (each may be omitted)");
        return -EINVAL;
    }
    for (const cJSON *item = body ? body->child : NULL; item; item = item->next) {
        int rc = 0;
        if (!strcmp(item->string, "step")) {
            rc = body_integer(item, 0, 9.0e15, &q->step, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "prompts")) {
            rc = body_integer(item, 1, (double)max_prompts, &q->prompts, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "gen_len")) {
            rc = body_integer(item, 1, (double)max_gen, &q->gen_len, err, err_len, field, field_len);
        } else if (!strcmp(item->string, "tree_budgets")) {
            int n = cJSON_IsArray(item) ? cJSON_GetArraySize(item) : -1;
            if (n < 0 || n > DDT_MAX_BUDGETS) {
                snprintf(field, field_len, "tree_budgets");
                snprintf(err, err_len, "tree_budgets must be a list of at most %d node budgets", DDT_MAX_BUDGETS);
                return -EINVAL;
            }
            q->n_budgets = n;
            for (int i = 0; i < n && !rc; i++) {
                const cJSON *k = cJSON_GetArrayItem(item, i);
                double v = cJSON_IsNumber(k) ? k->valuedouble : NAN;
                if (!(v == floor(v)) || v < 1 || v > (double)max_budget) {
                    snprintf(field, field_len, "tree_budgets");
                    snprintf(err, err_len, "tree_budgets entries must be integers in [1, %lld]: the speculator's "
                             "trees are planned for at most %lld nodes (the largest of "
                             "eval.speculative.tree_budgets%s)", (long long)max_budget, (long long)max_budget,
                             c->spec ? "" : ", [8, 32] without it");
                    rc = -EINVAL;
                } else {
                    q->budgets[i] = (int64_t)v;
                }
            }
        } else {
            snprintf(field, field_len, "%s", item->string);
            snprintf(err, err_len, "%s is not a speculate field (step, prompts, gen_len, tree_budgets)", item->string);
            rc = -EINVAL;
        }
        if (rc)
            return rc;
    }
    return 0;
}

int ddt_runs_control(ddt_runs *r, const char *id, ddt_run_action action, const cJSON *body,
                     cJSON **reply, int *status, char *err, size_t err_len, char *field,
                     size_t field_len)
{
    *field = '\0';
    *status = 202;
    int64_t chunk = -1, tile = -1;
    if (action == DDT_RUN_RECHUNK) {   /* {"chunk": N, "vocab_tile": M}, either may be omitted */
        if (!cJSON_IsObject(body)) {
            snprintf(err, err_len, "the body must be a JSON object {\"chunk\": N, \"vocab_tile\": M}");
            return -EINVAL;
        }
        for (const cJSON *item = body->child; item; item = item->next) {
            int is_chunk = !strcmp(item->string, "chunk"), is_tile = !strcmp(item->string, "vocab_tile");
            double v = cJSON_IsNumber(item) ? item->valuedouble : NAN;
            if (!is_chunk && !is_tile) {
                snprintf(field, field_len, "%s", item->string);
                snprintf(err, err_len, "%s is not a rechunk field (chunk, vocab_tile)", item->string);
                return -EINVAL;
            }
            if (!(v == floor(v)) || v < (is_chunk ? 1 : 0) || v > 9.0e15) {
                snprintf(field, field_len, "%s", item->string);
                snprintf(err, err_len, "%s must be an integer >= %d", item->string, is_chunk ? 1 : 0);
                return -EINVAL;
            }
            *(is_chunk ? &chunk : &tile) = (int64_t)v;
        }
        if (chunk < 0 && tile < 0) {
            snprintf(err, err_len, "give chunk, vocab_tile or both");
            return -EINVAL;
        }
    }
    pthread_mutex_lock(&r->lock);
    run *u = find(r, id);
    int rc = 0;
    if (!u) {
        snprintf(err, err_len, "no run %s", id);
        rc = -ENOENT;
        goto out;
    }
    int live = u->has_thread && !u->thread_done;
    switch (action) {
    case DDT_RUN_PAUSE:
        if (u->state != DDT_RUN_RUNNING && u->state != DDT_RUN_PAUSING) {
            rc = illegal(u, "pause", err, err_len);
            break;
        }
        u->want_pause = 1;
        if (u->state == DDT_RUN_RUNNING)
            set_state(r, u, DDT_RUN_PAUSING, NULL);
        *reply = state_reply(DDT_RUN_PAUSING);
        break;
    case DDT_RUN_RESUME:
        if (u->state == DDT_RUN_PAUSING || (u->state == DDT_RUN_RUNNING && u->want_pause)) {
            u->want_pause = 0;   /* not paused yet: the request is withdrawn */
            if (u->state == DDT_RUN_PAUSING)
                set_state(r, u, DDT_RUN_RUNNING, NULL);
            *reply = state_reply(DDT_RUN_RUNNING);
        } else if (u->state == DDT_RUN_PAUSED && live) {
            u->want_resume = 1;
            pthread_cond_broadcast(&r->wake);
            *reply = state_reply(DDT_RUN_RUNNING);
        } else if (u->state == DDT_RUN_PAUSED || u->state == DDT_RUN_INTERRUPTED) {
            set_state(r, u, DDT_RUN_QUEUED, NULL);   /* its worker is gone: continue from a checkpoint */
            schedule(r);
            *reply = state_reply(u->state);
        } else {
            rc = illegal(u, "resume", err, err_len);
        }
        break;
    case DDT_RUN_CANCEL:
        if (!active(u->state)) {
            rc = illegal(u, "cancel", err, err_len);
            break;
        }
        if (live) {
            u->want_cancel = 1;
            pthread_cond_broadcast(&r->wake);
        } else {
            set_state(r, u, DDT_RUN_CANCELLED, NULL);
        }
        *reply = state_reply(live ? u->state : DDT_RUN_CANCELLED);
        cJSON_AddStringToObject(*reply, "requested", "cancel");   /* at the next step boundary */
        break;
    case DDT_RUN_RECHUNK:
        if (!active(u->state)) {
            rc = illegal(u, "rechunk", err, err_len);
            break;
        }
        u->want_chunk = chunk;
        u->want_tile = tile;
        *reply = cJSON_CreateObject();
        /* a running worker is inside step + 1 now: the boundary after it applies the request */
        cJSON_AddNumberToObject(*reply, "applies_from_step",
                                (double)(u->step + (live && u->state == DDT_RUN_RUNNING ? 2 : 1)));
        break;
    case DDT_RUN_CHECKPOINT:
        if (!live || u->state == DDT_RUN_QUEUED) {
            rc = illegal(u, "checkpoint", err, err_len);
            break;
        }
        u->want_checkpoint = 1;
        pthread_cond_broadcast(&r->wake);
        *reply = cJSON_CreateObject();
        cJSON_AddNumberToObject(*reply, "applies_from_step", (double)(u->step + (u->state == DDT_RUN_PAUSED ? 0 : 1)));
        break;
    case DDT_RUN_SPECULATE: {
        /* the worker holds the target and the speculator: a run without one is refused */
        if (!live || (u->state != DDT_RUN_RUNNING && u->state != DDT_RUN_PAUSING && u->state != DDT_RUN_PAUSED)) {
            snprintf(err, err_len, "cannot speculate on run %s: it is %s and has no worker holding its target; "
                     "run `ddtreed speculate` on its export", u->id, ddt_run_state_name(u->state));
            rc = -EBUSY;
            break;
        }
        if (u->config.target_kind == DDT_SOURCE_SHARDS || u->devices.target_ranks ||
            (u->devices.gpu && !u->devices.colocated)) {   /* no target beside rank 0's drafter */
            snprintf(err, err_len, "cannot speculate on run %s: its target is not beside rank 0's drafter (%s); run "
                     "`ddtreed speculate` on its export", u->id,
                     u->config.target_kind == DDT_SOURCE_SHARDS ? "a shards run has none at train time"
                     : u->devices.target_ranks ? "a split puts it on other devices"
                                               : "GPU ranks with target.devices \"host\"");
            rc = -EBUSY;
            break;
        }
        if (u->want_spec) {
            snprintf(err, err_len, "run %s already has a speculative evaluation waiting for the next step boundary",
                     u->id);
            rc = -EBUSY;
            break;
        }
        ddt_trainer_spec_request q;
        if ((rc = parse_speculate(body, &u->config, &q, err, err_len, field, field_len)))
            break;
        if (q.step == u->step && u->state == DDT_RUN_PAUSED)
            q.step = -1;   /* the live weights are that step's */
        if (q.step >= 0) {
            char run_dir[2200], dir[2300];
            snprintf(run_dir, sizeof run_dir, "%s/runs/%s", r->state_dir, u->id);
            if (ddt_checkpoint_find(run_dir, q.step, dir, sizeof dir)) {
                snprintf(field, field_len, "step");
                if (q.step == u->step)   /* running: the weights move on before the next boundary */
                    snprintf(err, err_len, "step %lld has no kept checkpoint and the run is training past it: "
                             "leave step out for the live weights at the next step boundary, or pause the run "
                             "first", (long long)q.step);
                else
                    snprintf(err, err_len, "step %lld has no kept checkpoint (the newest is %lld; checkpoint.keep "
                             "keeps the newest); leave step out for the live weights", (long long)q.step,
                             (long long)u->last_checkpoint_step);
                rc = -EINVAL;
                break;
            }
        }
        u->spec_request = q;
        u->want_spec = 1;
        pthread_cond_broadcast(&r->wake);
        *reply = cJSON_CreateObject();
        cJSON_AddStringToObject(*reply, "weights", q.step >= 0 ? "checkpoint" : "live");
        if (q.step >= 0)
            cJSON_AddNumberToObject(*reply, "step", (double)q.step);
        else   /* the live weights at the next step boundary */
            cJSON_AddNumberToObject(*reply, "step",
                                    (double)(u->step + (u->state == DDT_RUN_PAUSED ? 0 : 1)));
        break;
    }
    case DDT_RUN_EXPORT: {
        char dir[2200];
        snprintf(dir, sizeof dir, "%s/runs/%s/export", r->state_dir, u->id);
        *reply = cJSON_CreateObject();
        cJSON_AddStringToObject(*reply, "path", dir);
        if (live && u->state != DDT_RUN_QUEUED) {
            u->want_export = 1;
            pthread_cond_broadcast(&r->wake);
        } else {   /* no worker: from its newest checkpoint, now (outside the lock) */
            char run_dir[2100], ckpt[2400];
            snprintf(run_dir, sizeof run_dir, "%s/runs/%s", r->state_dir, u->id);
            unlock(r);
            rc = ddt_checkpoint_export(run_dir, -1, dir, ckpt, sizeof ckpt, err, err_len);
            if (rc) {
                cJSON_Delete(*reply);
                *reply = NULL;
                return rc == -ENOENT ? -EBUSY : rc;
            }
            *status = 200;
            return 0;
        }
        break;
    }
    }
out:
    if (rc == 0)
        u->last_progress_s = ddt_mono_s();
    unlock(r);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Snapshots
 */

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
    cJSON *peak = cJSON_AddObjectToObject(o, "peak_memory_bytes");
    add_number_or_null(peak, "max", has, (double)s->peak_bytes);
    cJSON *devices = cJSON_AddObjectToObject(peak, "devices");
    for (int d = 0; has && d < s->devices; d++) {
        char k[24];
        snprintf(k, sizeof k, "cpu:%d", d);
        cJSON_AddNumberToObject(devices, k, (double)s->device_peak_bytes[d]);
    }
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
    return o;
}

int ddt_runs_known(ddt_runs *r, const char *id)
{
    pthread_mutex_lock(&r->lock);
    int known = find(r, id) != NULL;
    pthread_mutex_unlock(&r->lock);
    return known;
}

cJSON *ddt_runs_get(ddt_runs *r, const char *id)
{
    pthread_mutex_lock(&r->lock);
    run *u = find(r, id);
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
        if (!active(u->state))
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
    m->step_count = r->step_count;
    pthread_mutex_unlock(&r->lock);
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
