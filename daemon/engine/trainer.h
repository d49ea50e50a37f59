/* trainer.h: one run's training loop over its ranks: data from a feature source, batches
 * (anchors, noise), the drafter step on every rank, the weighted gradient all-reduce, AdamW,
 * out-of-memory recovery (halve chunk, then stream the vocabulary, down to a floor), records,
 * checkpoints, exact resume (bit for bit on CPU ranks; on GPUs the same data, anchors and
 * noise, the arithmetic to float rounding: the attention's backward uses atomics) and
 * acceptance evaluation. `ddtreed train` drives it in the foreground; the daemon's run
 * manager will drive it from worker threads.
 * Tested by tests/test_trainer.c (exact resume, OOM recovery, 1 vs 2 ranks, plan vs peak).
 */
#ifndef DDT_TRAINER_H
#define DDT_TRAINER_H

#include "acceptance.h"
#include "planner.h"
#include "run_config.h"
#include "store.h"

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

void ddt_trainer_close(ddt_trainer *t);

const char *ddt_trainer_run_id(const ddt_trainer *t);
const char *ddt_trainer_run_dir(const ddt_trainer *t);
const ddt_run_config *ddt_trainer_config(const ddt_trainer *t);
int64_t ddt_trainer_step_count(const ddt_trainer *t);   /* optimizer steps done */
const ddt_memory_plan *ddt_trainer_plan(const ddt_trainer *t);
uint64_t ddt_trainer_oom_recoveries(const ddt_trainer *t);   /* since this trainer opened */
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
/* the serving export of the current weights into out_dir */
int ddt_trainer_export(ddt_trainer *t, const char *out_dir, char *err, size_t err_len);

#endif
