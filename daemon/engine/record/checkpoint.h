/* checkpoint.h: resumable checkpoints, and the serving export of one (SPEC.md section 5; the
 * export itself: export.h, included here).
 *
 * A checkpoint is a directory RUN_DIR/checkpoints/step-NNNNNNNN/ holding
 *   state.safetensors: F32 "param.<name>", "adam_m.<name>", "adam_v.<name>" for every
 *                      parameter of the drafter's table, and I64 scalar "adam_step";
 *   state.json:        a ddt_checkpoint_meta (below): where the run stands, its config, and
 *                      the drafter in the export's config.json form (docs/formats.md);
 * written under a temporary name, every file fsynced, then renamed (and the parent fsynced),
 * so a crash leaves either the whole checkpoint or none. Only the newest `keep` remain.
 * A checkpoint holds all an export needs: ddt_checkpoint_export makes one without a trainer.
 * Tested by tests/engine/record/test_checkpoint.c and, through the tools, tests/daemon/train_cli_test.sh.
 */
#ifndef DDT_CHECKPOINT_H
#define DDT_CHECKPOINT_H

#include "export.h"
#include "model/drafter.h"
#include "model/optimizer.h"

#include <stddef.h>
#include <stdint.h>

/* What state.json holds beside the tensors. */
typedef struct ddt_checkpoint_meta {
    char run_id[40];
    int64_t step;                /* optimizer steps done */
    int64_t cursor;              /* the data source's: training sequences handed out */
    int64_t chunk, vocab_tile;   /* the loss's, as in force (after any out-of-memory recovery) */
    char *config_json;           /* the run config as given; a read mallocs it (meta_free) */
    ddt_drafter_config drafter;  /* resolved against the target: what the export needs */
} ddt_checkpoint_meta;

/* Frees what a read allocated in meta (config_json); meta stays valid, empty. */
void ddt_checkpoint_meta_free(ddt_checkpoint_meta *meta);

/* Writes the checkpoint of meta->step, the tensors of meta->drafter's table, then removes all
 * but the newest `keep` (>= 1). path_out (the final directory) and *bytes_out (its size) on
 * success. 0, or a negative errno with err; on failure nothing of the new checkpoint remains. */
int ddt_checkpoint_write(const char *run_dir, const ddt_checkpoint_meta *meta, const float *params,
                         const ddt_adamw_state *adam, int keep, char *path_out, size_t path_len,
                         int64_t *bytes_out, char *err, size_t err_len);

/* The newest complete checkpoint: 0 with *step and its path, -ENOENT when there is none. */
int ddt_checkpoint_latest(const char *run_dir, int64_t *step, char *path, size_t path_len);
/* The complete checkpoint of `step`: 0 with its path, -ENOENT when none is kept, -ENAMETOOLONG. */
int ddt_checkpoint_find(const char *run_dir, int64_t step, char *path, size_t path_len);

/* CKPT_DIR/state.json into meta (the caller frees it with ddt_checkpoint_meta_free). Every key
 * is checked: a missing, mistyped or unknown one is -EINVAL with err naming the file and the
 * key. Versions 2 (its drafter without use_sliding_window, max_position_embeddings, torch_dtype
 * and dtype: max_position_embeddings then comes from the run config's target) and the form
 * before state.json had a "version" (a "resolved" object beside the run config) are read too.
 * On failure meta is left as it was. */
int ddt_checkpoint_read_meta(const char *ckpt_dir, ddt_checkpoint_meta *meta, char *err, size_t err_len);

/* Reads a checkpoint's tensors into params and, unless adam is NULL, adam (sized by the table
 * of c; adam->m, v allocated by the caller), and, unless meta is NULL, its state.json as
 * ddt_checkpoint_read_meta does. 0, or -EINVAL with err naming the file and what does not
 * match c; a failure leaves every output as it was. */
int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *err, size_t err_len);

/* The serving export of RUN_DIR's checkpoint of `step` (-1: the newest) into out_dir, from the
 * checkpoint alone (no trainer, target or data); ckpt receives the checkpoint's path.
 * 0, -ENOENT when there is no complete checkpoint, or a negative errno with err. */
int ddt_checkpoint_export(const char *run_dir, int64_t step, const char *out_dir, char *ckpt,
                          size_t ckpt_len, char *err, size_t err_len);

#endif
