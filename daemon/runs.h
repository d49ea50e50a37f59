/* runs.h: the run manager of ddtreed: the queue, one worker thread per training run (the
 * trainer's loop), the state machine of API.md (run_state.h: its table and diagram), controls
 * applied at step boundaries (pause, resume, cancel, rechunk, checkpoint, export, speculate) and recorded
 * as events, the snapshots the HTTP handlers read, and crash recovery: at start, runs the
 * daemon stopped under (or was killed under) are marked interrupted and resumed from their
 * newest checkpoint.
 * Handlers never wait for a step: they read a mutex-guarded snapshot or post a request.
 * Made of runs_requests.c, runs_scheduler.c, runs_list.c and runs_snapshots.c (runs_impl.h: what
 * they share, and how they depend on each other).
 * Tested by tests/daemon/api_e2e.py (the real daemon and client).
 */
#ifndef DDT_RUNS_H
#define DDT_RUNS_H

#include "metrics.h"
#include "run/run_state.h"
#include "record/store.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

typedef enum ddt_run_action {
    DDT_RUN_PAUSE, DDT_RUN_RESUME, DDT_RUN_CANCEL, DDT_RUN_RECHUNK, DDT_RUN_CHECKPOINT, DDT_RUN_EXPORT,
    DDT_RUN_SPECULATE   /* body {"step": N?, "prompts": K?, "gen_len": G?, "tree_budgets": [..]?}: SPEC.md 7 */
} ddt_run_action;

typedef struct ddt_runs ddt_runs;

/* Loads every run of the store (db_path) and resumes those interrupted. notify(ctx) is called
 * from any thread when a run changes state (the main loop's wake-up). */
int ddt_runs_open(const char *state_dir, const char *db_path, ddt_store *store, int max_parallel,
                  void (*notify)(void *), void *notify_ctx, ddt_runs **out, char *err, size_t err_len);
/* Stops every worker at its next step boundary with a checkpoint (they become interrupted and
 * resume at the next start), joins them, frees everything. */
void ddt_runs_close(ddt_runs *r);
void ddt_runs_set_parallel(ddt_runs *r, int max_parallel);

/* Validates and queues a run config: 0 with its id, or -EINVAL with err and field, or -EAGAIN
 * while the store cannot write (nothing is stored; err says why). */
int ddt_runs_submit(ddt_runs *r, const char *json, size_t len, char *id, size_t id_len,
                    char *err, size_t err_len, char *field, size_t field_len);
/* A control request: 0 with *reply (the 2xx body; *status 200 or 202), -ENOENT (no such run),
 * -EBUSY (illegal in its state: err says why), -EINVAL (bad values: err, field). */
int ddt_runs_control(ddt_runs *r, const char *id, ddt_run_action action, const cJSON *body,
                     cJSON **reply, int *status, char *err, size_t err_len, char *field,
                     size_t field_len);

/* 1 when the manager knows run id */
int ddt_runs_known(ddt_runs *r, const char *id);
/* One run as API.md's GET /runs/{id} object; NULL when unknown. */
cJSON *ddt_runs_get(ddt_runs *r, const char *id);
/* {"runs": [...]} of every run, or of those in state (NULL: all); NULL with err for an
 * unknown state name. */
cJSON *ddt_runs_list(ddt_runs *r, const char *state, char *err, size_t err_len);
void ddt_runs_counts(ddt_runs *r, int64_t counts[DDT_RUN_STATE_COUNT]);
/* The run trained on CPU rank `rank` now, or NULL (copied into id). */
int ddt_runs_on_device(ddt_runs *r, int rank, char *id, size_t id_len);
/* Fills the runs, devices and step-duration parts of a metrics snapshot (m->runs malloc'd). */
void ddt_runs_metrics(ddt_runs *r, ddt_metrics_snapshot *m);
/* 1 when every running worker finished a step (or a control) within stall_s seconds. */
int ddt_runs_progressing(ddt_runs *r, double stall_s);
/* "2 running, 1 queued" for systemd's STATUS= */
void ddt_runs_summary(ddt_runs *r, char *out, size_t len);
/* runs paused by a fault (the store cannot write, a checkpoint or the export owed) that go on by
 * themselves once it is over */
int64_t ddt_runs_held(ddt_runs *r);

#endif
