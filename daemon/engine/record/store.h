/* store.h: the SQLite store of API.md ("SQLite"): runs, steps, step_devices, evals, events,
 * checkpoints. One writer thread owns the one writer connection and commits what the
 * trainers enqueue in batched BEGIN IMMEDIATE transactions (WAL, busy_timeout set before the
 * WAL pragma, persistent prepared statements); schema/ migrations by PRAGMA user_version.
 * A run's state changes only through ddt_store_run_transition, checked against run_state.h's
 * table; the store also names new runs (ddt_store_new_run_id). Readers open their own
 * connections. The daemon reuses this store as is.
 * Tested by tests/engine/record/test_store.c and tests/engine/run/test_run_state.c (every transition).
 */
#ifndef DDT_STORE_H
#define DDT_STORE_H

#include "run/run_state.h"
#include "store_records.h"

#include <stddef.h>
#include <stdint.h>


/* DIR/ddtree.db, created and migrated to the newest schema; starts the writer thread.
 * 0, or a negative errno with err saying what to do (e.g. a database newer than this binary). */
int ddt_store_open(const char *path, ddt_store **out, char *err, size_t err_len);
/* Commits everything queued, stops the writer, closes. */
void ddt_store_close(ddt_store *s);
/* Blocks until everything enqueued before the call is committed (0) or failed (-EIO). */
int ddt_store_flush(ddt_store *s);
/* ddt_store_flush, but while the store is degraded (ddt_store_get_health) it returns -EINPROGRESS
 * at once, the records left waiting in order: what a checkpoint asks first, so that a crash
 * after it never loses a record older than it (the run resumes after them). -ENOMEM. */
int ddt_store_commit_queued(ddt_store *s);
/* Whether the store can write now. Degraded: the writer's last try failed for a cause that is
 * not a record's (the state directory's file system full, another process holding ddtree.db's
 * write lock, an I/O error, a read-only file); the records wait in the queue, in order, and the
 * writer tries again (every busy_timeout for a lock, else after 0.25 s doubling to 5 s) until
 * one commits. Meanwhile a run's create or update is refused (-EBUSY, -ENOSPC, ...: nothing is
 * acknowledged that is not stored) and ddt_store_wait returns -EINPROGRESS, its transition kept
 * queued. A queue item is ~450 bytes and the queue holds QUEUE_CAPACITY (4096, 1.8 MB); a full
 * queue holds its producers, which is why runs pause while the store is degraded. */
typedef struct ddt_store_health {
    int degraded;
    int64_t since_ms;      /* wall clock when it became degraded (0: healthy) */
    int queued;            /* items waiting in the queue */
    int capacity;          /* what it holds (QUEUE_CAPACITY): full, it holds its producers */
    int64_t lock_waits;    /* tries that found the database locked, since the store opened */
    char cause[640];       /* degraded: what is wrong, the path, what to do ("" when healthy) */
} ddt_store_health;
void ddt_store_get_health(ddt_store *s, ddt_store_health *h);

/* Enqueued (never blocks on disk; a bounded queue applies back-pressure when full). */
void ddt_store_step(ddt_store *s, const ddt_step_record *r);
void ddt_store_event(ddt_store *s, const char *run_id, int64_t ts_ms, const char *kind,
                     const char *detail_json);
/* ddt_store_event of detail printed as JSON; detail is freed (NULL: nothing, out of memory) */
typedef struct cJSON cJSON;
void ddt_store_event_object(ddt_store *s, const char *run_id, int64_t ts_ms, const char *kind, cJSON *detail);
/* the teacher-forced columns of the step's evals row; unary_json: a DFlash2 drafter's unary
 * head's figures {"tau_chain", "tau_tree", "acc"} beside its selector's, NULL for DFlash */
void ddt_store_eval(ddt_store *s, const char *run_id, int64_t step, double tau_chain,
                    const char *tau_tree_json, const char *acc_json, const char *unary_json);
/* the speculative columns of the step's evals row (SPEC.md 7: tau_spec, tau_spec_tree_json
 * {"K": tau}, spec_json: prompts, gen_len, mismatched, seconds ...); ddt_store_eval leaves them
 * as they are and this the teacher-forced ones */
void ddt_store_eval_spec(ddt_store *s, const char *run_id, int64_t step, double tau_spec,
                         const char *tau_spec_tree_json, const char *spec_json);
void ddt_store_checkpoint(ddt_store *s, const char *run_id, int64_t step, const char *path,
                          int64_t bytes, int64_t ts_ms);

/* A new run id, "rYYYYMMDD-HHMMSS-xxxxxx": its UTC time (ids sort by creation), then 24 bits
 * mixed from the pid, the nanoseconds and a counter (two made in one second, by one process
 * or two, differ). Needs no store: a trainer without one names its run too. */
void ddt_store_new_run_id(char *out, size_t len);

/* Run rows, written synchronously through the writer (they are rare and must be durable):
 * 0, or a negative errno. ddt_store_run_create: the row of a new run, in state queued (where
 * run_state.h's lifecycle starts); -EEXIST when run_id has one. */
int ddt_store_run_create(ddt_store *s, const char *run_id, const char *name,
                         const char *config_json, int64_t max_steps, int64_t created_ms);
/* THE writer of a run's state after its creation: run_id from state `from` to `to`, the runs
 * row (state, step, updated_ms = ts_ms, last_checkpoint_step unless < 0, started_ms = ts_ms
 * the first time it is running, finished_ms = ts_ms in a final state, error unless NULL) and
 * its "state" event ({"state": to, "step": step, "error": error when not NULL or ""}) in one
 * transaction: both are written or neither. Refused with nothing written: -EPERM when the
 * table of run_state.h lacks (from, to) (before anything is queued), -ESTALE when the row is
 * not in `from`, -ENOENT when run_id has no row, -EINVAL for a bad argument. */
int ddt_store_run_transition(ddt_store *s, const char *run_id, ddt_run_state from, ddt_run_state to,
                             int64_t step, int64_t last_checkpoint_step, int64_t ts_ms,
                             const char *error);
/* ddt_store_run_transition in two halves, for a caller that holds a lock while it changes a
 * state and must not wait on the disk under it (the run manager): _enqueue checks and queues the
 * write (with copies of the strings) in the order of the calls, and gives *pending; ddt_store_wait
 * waits for its commit and answers what ddt_store_run_transition would have (it frees *pending:
 * call it exactly once), or, while the store is degraded, returns -EINPROGRESS at once: the write
 * stays queued and is committed in its order (ddt_store_run_transition answers the same). -EPERM, -EINVAL or -ENOMEM come from _enqueue, with nothing queued
 * and *pending NULL. */
typedef struct ddt_store_pending ddt_store_pending;
int ddt_store_run_transition_enqueue(ddt_store *s, const char *run_id, ddt_run_state from, ddt_run_state to,
                                     int64_t step, int64_t last_checkpoint_step, int64_t ts_ms,
                                     const char *error, ddt_store_pending **pending);
int ddt_store_wait(ddt_store *s, ddt_store_pending *pending);
/* A checkpoint of run_id at step: the row's step and last_checkpoint_step, updated_ms = ts_ms;
 * its state is left as it is. -ENOENT when run_id has no row. */
int ddt_store_run_checkpointed(ddt_store *s, const char *run_id, int64_t step, int64_t ts_ms);
/* The row as given, state included, with no check and no event: for fixtures (tests). Sets
 * state (NULL leaves it), step, updated_ms, and started_ms / finished_ms / error when given
 * (NULL or < 0 leaves them; an error of "" clears it). */
int ddt_store_run_update(ddt_store *s, const char *run_id, const char *state, int64_t step,
                         int64_t last_checkpoint_step, int64_t now_ms, int64_t started_ms,
                         int64_t finished_ms, const char *error);

/* The schema version this binary writes (the number of schema/ migrations). */
int ddt_store_schema_version(void);

#endif
