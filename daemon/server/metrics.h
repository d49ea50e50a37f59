/* metrics.h: the Prometheus text exposition (format 0.0.4) of GET /metrics, written by hand
 * from a snapshot the run manager and the HTTP server fill (API.md, "Metrics"). Base units,
 * counters end in _total, label values escaped, the step duration as a histogram.
 * Tested by tests/daemon/api_e2e.py (parsed by python3-prometheus-client) and tests/daemon/server/test_metrics.c.
 */
#ifndef DDT_METRICS_H
#define DDT_METRICS_H

#include "run/run_state.h"

#include <stddef.h>
#include <stdint.h>

enum { DDT_METRICS_BUCKETS = 12, DDT_METRICS_MAX_DEVICES = 16, DDT_METRICS_MAX_BUDGETS = 8,
       DDT_METRICS_MAX_CODES = 32 };

/* upper bounds of ddtree_step_duration_seconds, seconds (+Inf is implicit) */
extern const double ddt_metrics_bucket_bounds[DDT_METRICS_BUCKETS];

typedef struct ddt_metrics_run {
    char id[40];
    int64_t step;
    double loss, ce, kl, cap;
    double tokens_total, tokens_per_second;
    double tau_chain;                               /* < 0: no evaluation yet */
    int n_budgets;
    int64_t budgets[DDT_METRICS_MAX_BUDGETS];
    double tau_tree[DDT_METRICS_MAX_BUDGETS];
    double tau_spec;                                /* <= 0 (zeroed): no speculative evaluation yet; >= 1 (SPEC.md 7) */
    int n_spec_budgets;
    int64_t spec_budgets[DDT_METRICS_MAX_BUDGETS];
    double tau_spec_tree[DDT_METRICS_MAX_BUDGETS];
    uint64_t oom_recoveries;
} ddt_metrics_run;

typedef struct ddt_metrics_snapshot {
    const char *version;
    int64_t runs_by_state[DDT_RUN_STATE_COUNT];     /* indexed by ddt_run_state (run_state.h) */
    int run_count;
    ddt_metrics_run *runs;                          /* (run_count) runs not finished */
    int device_count;
    char device_names[DDT_METRICS_MAX_DEVICES][24]; /* "cpu:0", "cuda:1" */
    int64_t device_used_bytes[DDT_METRICS_MAX_DEVICES], device_peak_bytes[DDT_METRICS_MAX_DEVICES];
    uint64_t step_buckets[DDT_METRICS_BUCKETS + 1]; /* cumulative counts per bound, then +Inf */
    double step_seconds_sum;
    uint64_t step_count;
    int code_count;
    int codes[DDT_METRICS_MAX_CODES];
    uint64_t code_counts[DDT_METRICS_MAX_CODES];
    uint64_t login_failures, login_refused;         /* the web view's login (ui_login_limit.h) */
    int store_degraded;                             /* the store cannot write now (store.h's health) */
    int64_t store_queued;                           /* records waiting in its queue */
    uint64_t store_lock_waits;                      /* tries that found ddtree.db locked */
    int64_t runs_held;                              /* runs paused by a fault, to go on by themselves */
} ddt_metrics_snapshot;

/* The exposition text (malloc'd), *len its length. */
char *ddt_metrics_render(const ddt_metrics_snapshot *m, size_t *len);

#endif
