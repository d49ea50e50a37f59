/* runs_impl.h: what the files of the run manager share (runs.h is its API; this header is theirs
 * alone): a run's record, the manager's, and the functions one file calls in another. They
 * depend one way, requests -> scheduler -> list, snapshots -> list:
 *   runs_list.c       the run list under its lock: a run's record made, its config prepared,
 *                     added, found, freed; every state change, recorded once the lock is released
 *   runs_scheduler.c  the queue and a worker thread per running run (the state machine driving
 *                     it), open with crash recovery, close
 *   runs_requests.c   what the API asks: submit, and the controls with their checks and answers
 *   runs_snapshots.c  what the handlers read: a run as JSON, the list, counts, metrics
 *
 * One mutex guards every run's snapshot and requests; a worker thread per active run owns its
 * trainer and looks at its requests only between steps, so a step is never torn. Each state
 * change goes through ddt_runs_set_state: along run_state.h's table (its diagram shows which
 * request makes which change), enqueued under the lock (ddt_store_run_transition_enqueue: the
 * runs row and its "state" event together, in the order of the changes) and waited for by
 * ddt_runs_unlock() once the lock is released: no thread waits on the disk while holding the
 * lock every HTTP handler takes. A run's row is created (a write waited for) before the run
 * joins the list, unlocked. A run's config is parsed, validated and resolved once
 * (ddt_runs_prepare: at submit, or when the run is loaded at start-up) and kept: the scheduler
 * reads its devices, the worker hands it to the trainer. The loop's cadence (evaluations,
 * checkpoints, the export) is the trainer's (ddt_trainer_advance / _finish, as in `ddtreed
 * train`); the worker keeps the requests and the states.
 * Tested by tests/daemon/api_e2e.py (the real daemon and client) and tests/fuzz/fuzz_api.c (the
 * handlers on a manager of no workers).
 */
#ifndef DDT_RUNS_IMPL_H
#define DDT_RUNS_IMPL_H

#include "runs.h"
#include "train/trainer.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

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
    char error[1700];                   /* the failure, or why a fault holds it ("held: ...") */
    int has_record;
    ddt_step_record last;               /* the newest step */
    int64_t peak_bytes;                 /* the largest of its steps' peaks (a re-chunk lowers the
                                           newest step's, not this), and per device */
    int64_t device_peak_bytes[DDT_STORE_MAX_DEVICES];
    double tokens_total;
    uint64_t oom_recoveries;
    double tau_chain;                   /* < 0 until evaluated */
    int n_budgets;
    int64_t budgets[DDT_MAX_EVAL_BUDGETS];
    double tau_tree[DDT_MAX_EVAL_BUDGETS];
    double unary_tau_chain;             /* a DFlash2 run's unary head's, beside its selector's
                                           above; < 0: none (DFlash, or not evaluated) */
    double unary_tau_tree[DDT_MAX_EVAL_BUDGETS];
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
    int hold;                           /* paused by ddt_trainer_ready (the store cannot write, a
                                           checkpoint or the export owed), not by the user: it goes
                                           on by itself, and a shutdown leaves it interrupted */
    /* requests, applied at the next step boundary */
    int want_pause, want_resume, want_cancel, want_checkpoint, want_export, want_spec;
    ddt_trainer_spec_request spec_request;   /* want_spec's */
    char export_dir[2200];              /* want_export's destination (POST export's reply says it) */
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

/* runs_list.c */
run *ddt_runs_find(ddt_runs *r, const char *id);   /* with the lock; NULL when unknown */
int ddt_runs_active(ddt_run_state s);              /* 1 unless s is final */
/* 1 while a worker holds u at its step boundaries (running, pausing, paused), with the lock: a
 * checkpoint, export or speculation asked of it is done by the worker. Not once the worker has
 * left its loop (completed, failed, cancelled or interrupted, its thread still closing): what
 * was asked then would never be done */
int ddt_runs_has_worker(const run *u);
/* releases the lock, then waits for the state writes made under it */
void ddt_runs_unlock(ddt_runs *r);
/* ddt_runs_unlock and lock again, when there are writes to wait for */
void ddt_runs_settle(ddt_runs *r);
/* a change of u's state, with the lock (error: NULL, or the run's error) */
void ddt_runs_set_state(ddt_runs *r, run *u, ddt_run_state s, const char *error);
run *ddt_runs_new_run(ddt_runs *r, const char *id, const char *config_json, size_t len);
void ddt_runs_free_run(run *u);
int ddt_runs_add_run(ddt_runs *r, run *u);
/* u's config parsed, validated and resolved, kept in u (submitting: its paths and files checked
 * too): 0, or the config's error */
int ddt_runs_prepare(run *u, const char *json, size_t len, int submitting, char *err, size_t err_len, char *field,
                     size_t field_len);

/* runs_scheduler.c: starts the workers of the runs waiting while slots and GPUs are free, with
 * the lock */
void ddt_runs_schedule(ddt_runs *r);

#endif
