/* runs_scheduler.c: the run manager's scheduler (runs_impl.h): the queue, which starts a worker
 * thread for a waiting run while a slot and its GPUs are free; the worker, the state machine
 * driving one training run (its trainer's loop, the requests applied at step boundaries: pause
 * and resume, cancel, rechunk, checkpoint, export, speculate); and the manager's open, which
 * loads every run of the store and marks those the daemon stopped (or died) under interrupted
 * to resume from their newest checkpoint (crash recovery), and its close.
 * Tested by tests/daemon/api_e2e.py (the real daemon and client: runs to completion, controls, a
 * kill -9 and restart mid-run) and tests/fuzz/fuzz_api.c (open and close).
 */
#include "runs_impl.h"

#include "base/ddt_time.h"
#include "base/log.h"
#include "record/store_read.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
void ddt_runs_schedule(ddt_runs *r)
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
            ddt_runs_set_state(r, u, DDT_RUN_FAILED, "could not start its worker thread");
        }
    }
}

static void record_step(ddt_runs *r, run *u, const ddt_step_record *rec)
{
    u->has_record = 1;
    u->last = *rec;
    if (rec->peak_bytes > u->peak_bytes)
        u->peak_bytes = rec->peak_bytes;
    for (int d = 0; d < rec->devices && d < DDT_STORE_MAX_DEVICES; d++)
        if (rec->device_peak_bytes[d] > u->device_peak_bytes[d])
            u->device_peak_bytes[d] = rec->device_peak_bytes[d];
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
    const ddt_acceptance unary = ddt_acceptance_unary(a);   /* a DFlash2 drafter's, beside its selector's */
    u->tau_chain = ddt_acceptance_tau_chain(a);
    u->unary_tau_chain = a->selector ? ddt_acceptance_tau_chain(&unary) : -1;
    u->n_budgets = a->n_budgets;
    for (int i = 0; i < a->n_budgets; i++) {
        u->budgets[i] = a->budgets[i];
        u->tau_tree[i] = ddt_acceptance_tau_tree(a, i);
        u->unary_tau_tree[i] = ddt_acceptance_tau_tree(&unary, i);
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

/* an "error" event {"step", "message"} of what a request asked for and failed after its 202 */
static void error_event(ddt_runs *r, run *u, int64_t step, const char *message)
{
    if (!r->store)
        return;
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "step", (double)step);
    cJSON_AddStringToObject(d, "message", message);
    ddt_store_event_object(r->store, u->id, ddt_wall_ms(), "error", d);
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
    char message[1200];
    snprintf(message, sizeof message, "the speculative evaluation (POST speculate) failed: %s", err);
    error_event(r, u, q->step >= 0 ? q->step : ddt_trainer_step_count(t), message);
    return rc;
}

/* A checkpoint asked for (always), or the one of a stop (ddt_trainer_hold), outside the lock */
static void checkpoint(run *u, ddt_trainer *t, int always)
{
    char err[1024];
    if ((always ? ddt_trainer_checkpoint : ddt_trainer_hold)(t, err, sizeof err))
        ddt_log(DDT_LOG_ERR, "run=%s checkpoint failed: %s", u->id, err);
}

/* POST export, outside the lock: into dir, the request's destination (runs_requests.c); a failure
 * is logged and an error event (the request was answered 202 before) */
static void export_now(ddt_runs *r, run *u, ddt_trainer *t, const char *dir)
{
    char err[1024];
    if (!ddt_trainer_export(t, dir, err, sizeof err))
        return;
    ddt_log(DDT_LOG_ERR, "run=%s export into %s failed: %s", u->id, dir, err);
    char message[3400];   /* the directory (2200) and err (1024) whole */
    snprintf(message, sizeof message, "the export (POST export) into %s failed: %s", dir, err);
    error_event(r, u, ddt_trainer_step_count(t), message);
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
        ddt_runs_set_state(r, u, DDT_RUN_FAILED, err);
        goto done;
    }
    u->resume = 1;   /* from now on a restart continues from its checkpoints */
    u->step = ddt_trainer_step_count(t);
    if (*ddt_trainer_devices_note(t))
        ddt_log(DDT_LOG_INFO, "run=%s %s", u->id, ddt_trainer_devices_note(t));
    ddt_runs_set_state(r, u, DDT_RUN_RUNNING, NULL);
    ddt_trainer_outcome o;
    for (;;) {
        /* ---- the step boundary: requests ---- */
        if (r->closing || u->want_cancel) {
            /* a cancel wins over a shutdown (a run the user paused and cancelled is not resumed) */
            ddt_run_state end = u->want_cancel ? DDT_RUN_CANCELLED : DDT_RUN_INTERRUPTED;
            ddt_runs_unlock(r);
            checkpoint(u, t, 0);   /* a final checkpoint is kept */
            pthread_mutex_lock(&r->lock);
            note_checkpoint(u, t);
            ddt_runs_set_state(r, u, end, NULL);
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
        char export_dir[sizeof u->export_dir];
        snprintf(export_dir, sizeof export_dir, "%s", u->export_dir);
        u->want_checkpoint = u->want_export = u->want_spec = 0;
        ddt_runs_unlock(r);
        if (want_ckpt || (pause && !u->hold))
            checkpoint(u, t, want_ckpt);
        if (want_export)
            export_now(r, u, t, export_dir);
        ddt_speculate_totals spec;
        int spec_done = want_spec && speculate_now(r, u, t, &spec_request, &spec) == 0;
        /* a hold: the store cannot write, or a checkpoint or the export is owed; recorded as
         * "held: WHY" (run_state.h's DDT_HOLD_PREFIX) */
        char why[1600], reason[sizeof why + 8];
        int held = !pause && !ddt_trainer_ready(t, why, sizeof why);
        snprintf(reason, sizeof reason, DDT_HOLD_PREFIX "%s", held ? why : "");
        pthread_mutex_lock(&r->lock);
        note_checkpoint(u, t);
        if (spec_done)
            record_spec(u, spec_request.step >= 0 ? spec_request.step : ddt_trainer_step_count(t), &spec);
        if (held && !u->hold) {
            u->hold = 1;
            ddt_log(DDT_LOG_WARNING, "run=%s paused at step %lld, it goes on by itself once this is over: %s", u->id,
                    (long long)ddt_trainer_step_count(t), why);
        }
        if (pause || held) {
            u->want_pause = 0;
            if (u->state != DDT_RUN_PAUSED)
                ddt_runs_set_state(r, u, DDT_RUN_PAUSED, held ? reason : NULL);
            else if (held)
                snprintf(u->error, sizeof u->error, "%s", reason);
            ddt_runs_settle(r);
            while (!u->want_resume && !u->want_cancel && !r->closing && !u->want_checkpoint && !u->want_export &&
                   !u->want_spec) {
                if (!u->hold) {
                    pthread_cond_wait(&r->wake, &r->lock);
                    continue;
                }
                /* held: is it over? asked about once a second, outside the lock */
                struct timespec at;
                clock_gettime(CLOCK_REALTIME, &at);
                at.tv_sec += 1;
                if (pthread_cond_timedwait(&r->wake, &r->lock, &at) != ETIMEDOUT || !u->hold)
                    continue;
                ddt_runs_unlock(r);
                int ready = ddt_trainer_ready(t, why, sizeof why);
                pthread_mutex_lock(&r->lock);
                note_checkpoint(u, t);
                if (ready && u->hold) {
                    ddt_log(DDT_LOG_NOTICE, "run=%s goes on: what held it is over", u->id);
                    u->want_resume = 1;
                } else if (u->hold) {   /* the reason now (the trainer says a change: a "held" event) */
                    snprintf(reason, sizeof reason, DDT_HOLD_PREFIX "%s", why);
                    snprintf(u->error, sizeof u->error, "%s", reason);
                }
            }
            if (u->want_resume) {   /* the user's, or the hold is over */
                u->want_resume = 0;
                if (u->hold)   /* the user's resume tries an owed checkpoint at once, not at its next try */
                    ddt_trainer_retry_now(t);
                ddt_runs_set_state(r, u, DDT_RUN_RUNNING, u->hold ? "" : NULL);   /* (clears the hold) */
            } else if (r->closing && !u->want_cancel) {
                if (u->hold)   /* not the user's pause: the next start goes on from its newest checkpoint */
                    ddt_runs_set_state(r, u, DDT_RUN_INTERRUPTED, NULL);
                break;   /* a paused one stays paused (checkpointed): a restart leaves it to the user */
            } else if (!u->want_cancel && !r->closing) {
                u->want_pause = !u->hold;   /* a checkpoint, export or speculation while paused: do it, stay paused */
            }
            continue;
        }
        ddt_runs_unlock(r);

        /* ---- the trainer's next thing (a step and what falls due after it), outside the lock ---- */
        rc = ddt_trainer_advance(t, &o, err, sizeof err);
        char finish_err[1024] = "";
        if (rc == 0 && o.done && ddt_trainer_finish(t, finish_err, sizeof finish_err))
            ddt_log(DDT_LOG_ERR, "run=%s at its end: %s", u->id, finish_err);   /* owed: the run holds */
        if (*o.warning)
            ddt_log(DDT_LOG_ERR, "run=%s %s", u->id, o.warning);
        pthread_mutex_lock(&r->lock);
        note_checkpoint(u, t);
        if (rc == -ENODATA) {   /* its data could not be read: fixed, a resume goes on from its newest checkpoint */
            char unread[2300];
            snprintf(unread, sizeof unread, "%.2000s; fix it, then resume the run: it goes on from its newest "
                     "checkpoint", err);
            ddt_runs_set_state(r, u, DDT_RUN_PAUSED, unread);
            break;
        }
        if (rc) {
            ddt_runs_set_state(r, u, DDT_RUN_FAILED, err);
            break;
        }
        if (o.done && !*finish_err) {   /* complete: the final checkpoint and the export are written */
            ddt_runs_set_state(r, u, DDT_RUN_COMPLETED, NULL);
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
    if (u->want_export) {   /* asked for during the last step (or before a cancel): its reply named dir */
        char export_dir[sizeof u->export_dir];
        snprintf(export_dir, sizeof export_dir, "%s", u->export_dir);
        u->want_export = 0;
        ddt_runs_unlock(r);
        export_now(r, u, t, export_dir);
        pthread_mutex_lock(&r->lock);
    }
done:
    ddt_runs_unlock(r);
    ddt_trainer_close(t);   /* before the next run starts: it gives the ranks' memory back */
    pthread_mutex_lock(&r->lock);
    u->thread_done = 1;
    ddt_runs_schedule(r);   /* a slot is free */
    ddt_runs_unlock(r);
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * Open (crash recovery) and close
 */

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
        run *u = ddt_runs_new_run(r, rows[i].id, json, strlen(json));
        if (!u || ddt_runs_add_run(r, u)) {
            if (u)
                ddt_runs_free_run(u);
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
        int bad = ddt_runs_active(u->state)
                      ? ddt_runs_prepare(u, json, strlen(json), 0, why, sizeof why, field, sizeof field)
                      : 0;
        if (bad) {
            u->config_rc = bad;
            snprintf(u->config_error, sizeof u->config_error, "%s", why);
            ddt_log(DDT_LOG_WARNING, "run=%s its config does not parse: %s", u->id, why);
        }
        /* the daemon stopped (or died) under these, or while a fault held them: they resume from
         * their checkpoints; one it died under while pausing was paused by the user (the pause was
         * committed before POST /pause answered, its boundary's checkpoint and PAUSED were not, though
         * GET may have shown them): it stays paused, to resume from its newest checkpoint */
        if (u->state == DDT_RUN_PAUSING)
            ddt_runs_set_state(r, u, DDT_RUN_PAUSED, "");
        else if (u->state == DDT_RUN_RUNNING ||
                 (u->state == DDT_RUN_PAUSED && !strncmp(u->error, DDT_HOLD_PREFIX, strlen(DDT_HOLD_PREFIX))))
            ddt_runs_set_state(r, u, DDT_RUN_INTERRUPTED, "");
    }
    ddt_store_free_runs(rows, count);
    if (rc == 0)
        ddt_runs_schedule(r);
    ddt_runs_unlock(r);
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
        ddt_runs_free_run(r->runs[i]);
    free(r->runs);
    pthread_mutex_destroy(&r->lock);
    pthread_cond_destroy(&r->wake);
    free(r);
}

void ddt_runs_set_parallel(ddt_runs *r, int max_parallel)
{
    pthread_mutex_lock(&r->lock);
    r->max_parallel = max_parallel;
    ddt_runs_schedule(r);
    ddt_runs_unlock(r);
}
