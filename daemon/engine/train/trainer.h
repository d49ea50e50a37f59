/* trainer.h: one run's training loop over its ranks: data from a feature source, batches
 * (anchors, noise), the drafter step on every rank, the weighted gradient all-reduce, AdamW,
 * out-of-memory recovery (halve chunk, then stream the vocabulary, down to a floor), records,
 * checkpoints, exact resume (bit for bit on CPU ranks; on GPUs the same data, anchors and
 * noise, the arithmetic to float rounding: the attention's backward uses atomics) and
 * acceptance evaluation, and the cadence of a run (which evaluations, checkpoints and the
 * export fall due after a step: ddt_trainer_advance / _finish). `ddtreed train` drives it in
 * the foreground, the daemon's run manager from worker threads, with the same calls.
 * Tested by tests/engine/train/test_trainer.c (exact resume, OOM recovery, 1 vs 2 ranks, plan vs peak).
 */
#ifndef DDT_TRAINER_H
#define DDT_TRAINER_H

#include "eval/acceptance.h"
#include "run/planner.h"
#include "run/run_config.h"
#include "eval/speculate.h"
#include "record/store.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_trainer ddt_trainer;

/* A new run from config_json (len bytes) under state_dir (runs/<id>/ is created; id is
 * run_id, or a new one from ddt_store_new_run_id when NULL; its row is created in the store,
 * queued, unless it exists: the trainer never writes the row's state), or, when
 * resume, run_id continued from its newest checkpoint (its config is the checkpoint's).
 * store may be NULL (no records). 0, or a negative errno with err (and, for config errors,
 * field = the JSON path at fault). */
int ddt_trainer_open(const char *config_json, size_t len, const char *state_dir,
                     const char *run_id, int resume, ddt_store *store, ddt_trainer **out,
                     char *err, size_t err_len, char *field, size_t field_len);

/* ddt_trainer_open for a config parsed and validated by the caller (ddt_run_config_parse;
 * copied: the caller keeps its own), its text config_json (kept in the run's checkpoints) and
 * its ranks on this node (ddt_run_config_devices): the run manager parses a run once, at submit
 * or when it loads it at start-up. When resume, config is run_id's (the row's, which its
 * checkpoints hold too). */
int ddt_trainer_open_parsed(const ddt_run_config *config, const char *config_json,
                            const ddt_devices *ranks, const char *state_dir, const char *run_id,
                            int resume, ddt_store *store, ddt_trainer **out, char *err,
                            size_t err_len);

void ddt_trainer_close(ddt_trainer *t);

const char *ddt_trainer_run_id(const ddt_trainer *t);
const char *ddt_trainer_run_dir(const ddt_trainer *t);
const ddt_run_config *ddt_trainer_config(const ddt_trainer *t);
int64_t ddt_trainer_step_count(const ddt_trainer *t);   /* optimizer steps done */
const ddt_memory_plan *ddt_trainer_plan(const ddt_trainer *t);
uint64_t ddt_trainer_oom_recoveries(const ddt_trainer *t);   /* since this trainer opened */
int64_t ddt_trainer_checkpoint_step(const ddt_trainer *t);   /* its newest checkpoint's; -1: none yet */
/* "" or a sentence on what "devices" left idle ("all" on more GPUs than sequences per step),
 * also recorded as the run's "devices" event */
const char *ddt_trainer_devices_note(const ddt_trainer *t);

/* One optimizer step over the global batch; rec describes it. An out-of-memory step is
 * retried smaller (recorded as an oom_recovery event) when auto_rechunk is on. */
int ddt_trainer_step(ddt_trainer *t, ddt_step_record *rec, char *err, size_t err_len);
/* chunk / vocab_tile for the next steps (<= 0 leaves one as is); recorded as a rechunk event */
int ddt_trainer_rechunk(ddt_trainer *t, int64_t chunk, int64_t vocab_tile, char *err, size_t err_len);
int ddt_trainer_checkpoint(ddt_trainer *t, char *err, size_t err_len);
/* acceptance on the held-out sequences (recorded as an eval when a store is attached) */
int ddt_trainer_eval(ddt_trainer *t, ddt_acceptance *out, char *err, size_t err_len);
/* Speculative decoding (SPEC.md section 7) of held-out prompts (the first
 * eval.speculative.prompt_len tokens of held-out sequence i) with rank 0's weights and the target
 * beside them (the co-located replica, or the host target on CPU ranks), recorded in the evals
 * row of the step (tau_spec, tau_spec_tree_json, spec_json) when a store is attached; a prompt
 * that is not greedy-equal is an "error" event naming it (a bug: the decoding is lossless).
 * q: step < 0 or the trainer's step: the live weights; else the kept checkpoint of that step;
 * prompts, gen_len (0: the config's, or the defaults 8 / 64 without eval.speculative) and the
 * budgets (n_budgets < 0: the config's), each at most what the speculator was opened for
 * (prompts at most train.heldout). The speculator is opened on first use when the config has no
 * eval.speculative. 0, or -EINVAL (err: the request's field at fault), -ENOENT (no checkpoint of
 * that step), -ENOTSUP (no target beside rank 0), the decoding's error. */
typedef struct ddt_trainer_spec_request {
    int64_t step;                          /* < 0: the live weights */
    int64_t prompts, gen_len;              /* 0: the config's */
    int n_budgets;                         /* < 0: the config's */
    int64_t budgets[DDT_MAX_BUDGETS];
} ddt_trainer_spec_request;
int ddt_trainer_speculate(ddt_trainer *t, const ddt_trainer_spec_request *q, ddt_speculate_totals *out, char *err,
                          size_t err_len);
/* the serving export of the current weights into out_dir (recorded as an export event) */
int ddt_trainer_export(ddt_trainer *t, const char *out_dir, char *err, size_t err_len);

/* ---- The cadence: the one loop of a run, driven by the daemon's worker and `ddtreed train`
 * alike, so that both write the same steps, evals, checkpoints and events for one config:
 *
 *     open -> advance ... advance (until outcome.done) -> finish
 *             a control between two advances: rechunk, checkpoint, export as asked; a pause,
 *             a cancel or a stop: ddt_trainer_hold, then the caller's state change
 *
 * Each advance does the next thing due: a new run's baseline evaluation (at step 0, before
 * any step), or one step and then, after step s, the evaluation when s % eval.every_steps == 0
 * or s == train.steps (with eval.speculative, the speculative one after it on every E-th: the
 * k-th evaluation, k = ceil(s / eval.every_steps), when k % E == 0), and the checkpoint when s % checkpoint.every_steps == 0 and
 * s < train.steps (the last one is finish's). A due evaluation or checkpoint that fails is an
 * "error" event and a warning in the outcome; after a failed evaluation the run goes on, after a
 * failed checkpoint (or export) it holds (ddt_trainer_ready) until it is written. The callers own
 * the run's state (run_state.h) and the controls. */
typedef struct ddt_trainer_outcome {
    int done;                     /* every step is done: nothing happened; finish is next */
    int stepped;                  /* rec is the step just done */
    ddt_step_record rec;
    int evaluated;                /* acceptance holds the evaluation at the trainer's step */
    ddt_acceptance acceptance;
    int checkpointed;             /* a checkpoint of this step was written */
    int speculated;               /* spec holds the speculative evaluation (eval.speculative) at the step */
    ddt_speculate_totals spec;
    char warning[1024];           /* "" or the evaluation or checkpoint that failed, and why */
} ddt_trainer_outcome;

/* Whether the run may go on at this boundary: 1, or 0 with why (a hold, which the callers make a
 * pause that ends by itself once this answers 1 again):
 *   - the store cannot write (ddt_store_get_health: a full file system, another process's write
 *     lock on ddtree.db, an I/O error), or its queue is more than half full: its records wait in
 *     its queue, and no step is taken that would add to them;
 *   - a checkpoint or the final export failed (ENOSPC, EIO, EROFS, no room by statvfs): no step
 *     is taken without a restart point. This call tries it again (after 1 s, doubling to 60 s
 *     between tries), and answers 1 once it is written.
 * The callers (the daemon's worker, `ddtreed train`) ask before each advance and, while held,
 * about once a second. */
int ddt_trainer_ready(ddt_trainer *t, char *why, size_t why_len);
/* An owed checkpoint or export tried at the next ddt_trainer_ready, not after its wait (a user's
 * resume of a held run). */
void ddt_trainer_retry_now(ddt_trainer *t);

/* 0 (see *o), or a step's failure with err: the run has failed (-ENODATA: its data could not be
 * read, base/mapped.h; the callers pause it, to go on from its newest checkpoint once the file
 * is fixed). */
int ddt_trainer_advance(ddt_trainer *t, ddt_trainer_outcome *o, char *err, size_t err_len);
/* A stop at a step boundary (a pause, a cancel, the daemon stopping): a checkpoint, unless
 * this trainer already wrote one at this step; a failure is also an "error" event. */
int ddt_trainer_hold(ddt_trainer *t, char *err, size_t err_len);
/* After the last step: the final checkpoint (ddt_trainer_hold) and the serving export into
 * runs/<id>/export (once: a second call after a failure writes only what is missing). Both are
 * tried; 0, or the first failure with err (each failure is also an "error" event, and owed: the
 * callers hold the run, not complete, until ddt_trainer_ready has written it). */
int ddt_trainer_finish(ddt_trainer *t, char *err, size_t err_len);

#endif
