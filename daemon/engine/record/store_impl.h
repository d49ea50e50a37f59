/* store_impl.h: what the store's two files share: the items of its queue, its writer
 * connection's statements and the store itself (struct ddt_store). store.c (the producers,
 * opening and closing) uses store_writer.c (the writer thread), never the other way.
 * Not a public header. Tested through store.h by tests/engine/record/test_store.c.
 */
#ifndef DDT_STORE_IMPL_H
#define DDT_STORE_IMPL_H

#include "store_records.h"

#include <sqlite3.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

enum {
    QUEUE_CAPACITY = 4096,   /* ~1.8 MB of items: seconds of steps of every run at once */
    BATCH_MAX = 512,         /* items per transaction: one fsync-free WAL commit each */
    BUSY_TIMEOUT_MS = 5000,  /* another connection's write lock (a reader never takes one) */
    LOG_FAILURES_PER_BATCH = 4,
    UNWRITABLE_GIVE_UP_STOPPING_S = 30,   /* closing: how long an unwritable database is waited for */
};
/* The pause between two tries of a batch the database did not take (not for a lock: busy_timeout
 * has waited inside SQLite): from the first to the longest, doubling. */
#define RETRY_PAUSE_FIRST_S 0.25
#define RETRY_PAUSE_LONGEST_S 5.0

/* ------------------------------------------------------------------------------------------
 * Items of the queue
 */

typedef enum {
    ITEM_STEP,
    ITEM_EVENT,
    ITEM_EVAL,
    ITEM_CHECKPOINT,
    ITEM_RUN_CREATE,
    ITEM_RUN_UPDATE,
    ITEM_RUN_TRANSITION,
    ITEM_FLUSH,
    ITEM_ANSWERED,   /* a run's create or update answered while the database could not be written:
                        nothing to write */
} item_kind;

/* What a synchronous caller waits for; on its stack, answered under the store's lock. */
typedef struct sync_answer {
    int done;
    int rc;
    int abandoned;   /* its waiter left (the store degraded): the writer frees what holds it
                        (a commit_queued flush, a transition's pending) */
} sync_answer;

/* run_create / run_update / run_transition: the caller's strings, valid while it waits */
typedef struct run_request {
    sync_answer answer;
    const char *run_id, *name, *config_json, *state, *error;
    const char *from_state, *detail_json;   /* run_transition: the state it leaves, its event */
    int starts, finishes;                   /* run_transition: to running, to a final state */
    int64_t max_steps, created_ms, step, last_checkpoint_step, now_ms, started_ms, finished_ms;
} run_request;

typedef struct store_item {
    item_kind kind;
    union {
        ddt_step_record step;
        struct {
            char *run_id, *kind, *detail_json;   /* owned copies; run_id may be NULL */
            int64_t ts_ms;
        } event;
        struct {
            char *run_id, *tau_tree_json, *acc_json;   /* owned copies; spec: tau_spec_tree_json, spec_json */
            char *unary_json;                          /* owned copy or NULL; not spec's */
            int64_t step;
            double tau_chain;                          /* spec: tau_spec */
            int spec;                                  /* 1: the speculative columns (ddt_store_eval_spec) */
        } eval;
        struct {
            char *run_id, *path;   /* owned copies */
            int64_t step, bytes, ts_ms;
        } checkpoint;
        run_request *run;       /* ITEM_RUN_CREATE, ITEM_RUN_UPDATE, ITEM_RUN_TRANSITION */
        sync_answer *flush;     /* ITEM_FLUSH */
    };
} store_item;

/* A transition in flight (ddt_store_run_transition_enqueue): the request the writer answers and
 * the copies of the strings it reads; freed by ddt_store_wait, or by the writer when its waiter
 * left it queued (q.answer.abandoned). */
struct ddt_store_pending {
    run_request q;   /* first: the writer finds the pending from its request */
    char *run_id, *error, *detail;
};
void ddt_store_pending_free(struct ddt_store_pending *p);

/* the item kinds' names, for the log */
extern const char *const ddt_store_item_names[];
void ddt_store_item_free(store_item *item);

/* ------------------------------------------------------------------------------------------
 * Prepared statements of the writer connection (SQLITE_PREPARE_PERSISTENT)
 */

enum {
    STMT_BEGIN,
    STMT_COMMIT,
    STMT_ROLLBACK,
    STMT_STEP,
    STMT_STEP_DEVICE,
    STMT_EVENT,
    STMT_EVAL,
    STMT_EVAL_SPEC,
    STMT_CHECKPOINT,
    STMT_RUN_CREATE,
    STMT_RUN_UPDATE,
    STMT_RUN_TRANSITION,
    STMT_RUN_EXISTS,
    STMT_COUNT
};

/* the SQL of each statement, prepared by ddt_store_open (SQLITE_PREPARE_PERSISTENT) */
extern const char *const ddt_store_stmt_sql[STMT_COUNT];

/* ------------------------------------------------------------------------------------------
 * The store
 */

struct ddt_store {
    sqlite3 *db;                         /* the writer connection */
    sqlite3_stmt *stmt[STMT_COUNT];
    char *path;

    pthread_mutex_t lock;                /* guards everything below up to the writer's own */
    pthread_cond_t not_empty, not_full, answered;
    store_item *queue;                   /* ring of QUEUE_CAPACITY */
    int head, count;
    int stopping;
    double stopping_since_s;             /* monotonic: when ddt_store_close began */
    int64_t failures;                    /* failed items not yet reported by a flush */
    /* degraded: the writer's last try failed for a cause not of the items (a full file system,
     * another process's write lock, an I/O error): the batch waits and is tried again */
    int degraded;
    int degraded_code;                   /* its SQLite extended code */
    double degraded_since_s;             /* monotonic */
    int64_t degraded_since_ms;           /* wall clock, for the health */
    char cause[640];                     /* what is wrong, where, what to do (ddt_store_get_health) */
    pthread_t writer;
    int writer_started;

    /* the writer thread's own */
    store_item *batch;                   /* BATCH_MAX */
    int batch_count;                     /* items in it now */
    int *results;                        /* per batch item: 0 or a negative errno */
    int batch_logged;                    /* failures logged in this batch */
    int64_t lock_waits;                  /* tries that found the database locked and were repeated
                                            (under lock: ddt_store_get_health) */
    double retry_pause_s;                /* the next pause before a try (RETRY_PAUSE_*) */
    char why[512];                       /* the last failure, for the log */
    int why_code;                        /* its SQLite extended code (0: not SQLite's) */
    int had_row;                         /* the last run_stmt's statement gave a row */
};

/* a value safe inside key="...": no quotes, no line breaks */
void ddt_store_copy_quotable(char *out, size_t out_len, const char *text);
/* the writer thread (arg: the store): writes what is queued until the store stops */
void *ddt_store_writer_main(void *arg);

#endif
