/* store_read.h: read-only queries of the SQLite store for the daemon's HTTP handlers and its
 * start-up, each through a connection of its own (WAL: readers never wait for the writer).
 * Tested by tests/engine/record/test_store_read.c.
 */
#ifndef DDT_STORE_READ_H
#define DDT_STORE_READ_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_run_row {
    char id[40], name[128], state[16];
    char *config_json;             /* malloc'd */
    char *error;                   /* malloc'd or NULL */
    int64_t created_ms, started_ms, updated_ms, finished_ms;   /* -1 when NULL */
    int64_t step, max_steps, last_checkpoint_step;             /* -1 when NULL */
} ddt_run_row;

/* Every run, oldest first. 0, or a negative errno with err. */
int ddt_store_read_runs(const char *db_path, ddt_run_row **rows, int *count, char *err, size_t err_len);
void ddt_store_free_runs(ddt_run_row *rows, int count);

/* Steps of run_id with step > after, at most limit (1..10000), ascending: as JSON
 * {"steps": [{"step": .., "ts_ms": .., "loss": .., ... every column of API.md's steps,
 * plus "devices": [{"device": .., "peak_bytes": .., "step_ms": ..}]}]} or as CSV (a header line
 * of the steps columns, then one line per step). *text malloc'd. */
int ddt_store_read_steps(const char *db_path, const char *run_id, int64_t after, int64_t limit,
                         int csv, char **text, size_t *len, char *err, size_t err_len);

/* The same JSON for the whole history after `after` thinned to at most max_points + 1 steps
 * (max_points 1..10000): the first, every k-th step number after it (k = ceil((last - first + 1)
 * / max_points); fewer where steps are missing) and the last, so that a chart of a 100,000-step run stays light; the caller asks
 * for the recent window in full with ddt_store_read_steps. */
int ddt_store_read_steps_sampled(const char *db_path, const char *run_id, int64_t after, int64_t max_points,
                                 char **text, size_t *len, char *err, size_t err_len);

/* Evals of run_id with step > after, ascending: {"evals": [{"step": .., "tau_chain": .., "tau_tree":
 * {..}, "acc": [..], ...}]}: every column of the evals table but run_id, a *_json column parsed,
 * under its name without the suffix (so a later column, e.g. tau_spec, comes without a change). */
int ddt_store_read_evals(const char *db_path, const char *run_id, int64_t after, char **text, size_t *len,
                         char *err, size_t err_len);

/* Events of run_id with id > after_id, at most limit, ascending:
 * {"events": [{"id": .., "ts_ms": .., "kind": "..", "detail": <the detail_json as JSON>}]} */
int ddt_store_read_events(const char *db_path, const char *run_id, int64_t after_id,
                          int64_t limit, char **text, size_t *len, char *err, size_t err_len);

/* The newest eval of run_id: 0 with its fields, -ENOENT when none. tau_tree_json and acc_json
 * malloc'd. */
int ddt_store_read_last_eval(const char *db_path, const char *run_id, int64_t *step,
                             double *tau_chain, char **tau_tree_json, char **acc_json);

#endif
