/* runs_list.c: the run manager's list of runs (runs_impl.h) under its lock: a run's record made,
 * its config prepared once (parsed, validated, resolved), added to the list, found in it and
 * freed; and every state change of a run, enqueued under the lock and waited for once the lock
 * is released.
 * Tested by tests/daemon/api_e2e.py (the real daemon and client) and tests/fuzz/fuzz_api.c.
 */
#include "runs_impl.h"

#include "base/ddt_time.h"
#include "base/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

run *ddt_runs_find(ddt_runs *r, const char *id)
{
    for (int i = 0; i < r->count; i++)
        if (!strcmp(r->runs[i]->id, id))
            return r->runs[i];
    return NULL;
}

int ddt_runs_active(ddt_run_state s)
{
    return !ddt_run_state_final(s);
}

int ddt_runs_has_worker(const run *u)
{
    return u->has_thread && !u->thread_done &&
           (u->state == DDT_RUN_RUNNING || u->state == DDT_RUN_PAUSING || u->state == DDT_RUN_PAUSED);
}

/* The state writes this thread enqueued while holding the lock (ddt_runs_set_state), newest
 * first; ddt_runs_unlock() waits for them once the lock is released. */
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
void ddt_runs_unlock(ddt_runs *r)
{
    pending_write *w = pending_writes;
    pending_writes = NULL;
    pthread_mutex_unlock(&r->lock);
    while (w) {   /* in any order: the store commits them in the order they were enqueued */
        int rc = ddt_store_wait(w->store, w->pending);
        if (rc == -EINPROGRESS)   /* the store is degraded: the write waits in its queue, in order */
            ddt_log(DDT_LOG_WARNING, "run=%s state change from=%s to=%s kept in the store's queue: written once "
                    "ddtree.db can be written", w->id, ddt_run_state_name(w->from), ddt_run_state_name(w->to));
        else if (rc)
            ddt_log(DDT_LOG_ERR, "run=%s state change from=%s to=%s not recorded: %s", w->id,
                    ddt_run_state_name(w->from), ddt_run_state_name(w->to), strerror(-rc));
        pending_write *next = w->next;
        free(w);
        w = next;
    }
}

/* ddt_runs_unlock() and lock again: before a wait on the condition, the writes are waited for */
void ddt_runs_settle(ddt_runs *r)
{
    if (pending_writes) {
        ddt_runs_unlock(r);
        pthread_mutex_lock(&r->lock);
    }
}

/* A state change, with the lock: the snapshot, the runs row and its "state" event (one
 * transition enqueued; the caller's ddt_runs_unlock() waits for it), the log, the main loop. A
 * change that run_state.h's table lacks is a bug of the manager: logged, and nothing changes. */
void ddt_runs_set_state(ddt_runs *r, run *u, ddt_run_state s, const char *error)
{
    ddt_run_state from = u->state;
    if (!ddt_run_transition_legal(from, s)) {
        ddt_log(DDT_LOG_ERR, "run=%s illegal state change from=%s to=%s left undone (a bug of the run "
                "manager)", u->id, ddt_run_state_name(from), ddt_run_state_name(s));
        return;
    }
    u->state = s;
    if (s != DDT_RUN_PAUSED)
        u->hold = 0;   /* a held run is paused: any other state ends the hold */
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

/* A run record of config_json (len bytes), not yet in the list; NULL without memory. */
run *ddt_runs_new_run(ddt_runs *r, const char *id, const char *config_json, size_t len)
{
    run *u = calloc(1, sizeof *u);
    if (!u || !(u->config_json = strndup(config_json, len))) {
        free(u);
        return NULL;
    }
    snprintf(u->id, sizeof u->id, "%s", id);
    u->owner = r;
    u->tau_chain = u->tau_spec = u->unary_tau_chain = -1;
    u->started_ms = u->finished_ms = u->last_checkpoint_step = -1;
    u->want_chunk = u->want_tile = -1;
    return u;
}

void ddt_runs_free_run(run *u)
{
    ddt_run_config_free(&u->config);
    free(u->config_json);
    free(u);
}

/* u into the list (with the lock); -ENOMEM */
int ddt_runs_add_run(ddt_runs *r, run *u)
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
 * attention), the target's shape and the drafter, and, when submitting, the paths (absolute:
 * ddt_run_config_check_absolute) and the files the run reads (ddt_run_config_check_files: at
 * start-up a file not there yet, a mount that comes up after the daemon, fails the run when it
 * starts, saying so, not for good). 0, or the config's error (err, field). A
 * GPU this node lacks (-ENODEV) is not an error of the config: it is kept in u->config_rc and
 * u->config_error, and the run fails at its start naming it. */
int ddt_runs_prepare(run *u, const char *json, size_t len, int submitting, char *err, size_t err_len, char *field,
                     size_t field_len)
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
    /* the paths first: a relative one would be read against the daemon's working directory */
    if (submitting && (rc = ddt_run_config_check_absolute(c, err, err_len, field, field_len)))
        return rc;
    int64_t hidden, vocab, layers;
    int tied;
    rc = ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, err, err_len);
    if (!rc && (rc = ddt_run_config_resolve(c, hidden, vocab, layers, err, err_len))) {
        /* its sentence starts with the field's JSON path ("drafter.target_layer_ids: ...") */
        const size_t n = strcspn(err, ": ");
        snprintf(field, field_len, "%.*s", err[n] == ':' && n < field_len ? (int)n : 7, err[n] == ':' ? err : "drafter");
    }
    if (rc && !*field)   /* the target's config.json or first shard */
        snprintf(field, field_len, c->target_kind == DDT_SOURCE_SHARDS ? "target.shards" : "target.path");
    /* what the run would fail on at its step 0: its files, the chat data's tokenizer */
    if (!rc && submitting)
        rc = ddt_run_config_check_files(c, vocab, err, err_len, field, field_len);
    return rc;
}
