/* checkpoint.h: resumable checkpoints and the serving export (SPEC.md section 5).
 *
 * A checkpoint is a directory RUN_DIR/checkpoints/step-NNNNNNNN/ holding
 *   state.safetensors: F32 "param.<name>", "adam_m.<name>", "adam_v.<name>" for every
 *                      parameter of the drafter's table, and I64 scalar "adam_step";
 *   state.json:        the trainer's own state, opaque here (step, data cursor, RNG, config);
 * written under a temporary name, every file fsynced, then renamed (and the parent fsynced),
 * so a crash leaves either the whole checkpoint or none. Only the newest `keep` remain.
 * The export is a serving directory: config.json (architectures DFlashDraftModel, the keys of
 * SPEC.md section 5) and model.safetensors in BF16 with exactly the parameter names.
 * Tested by tests/test_checkpoint.c.
 */
#ifndef DDT_CHECKPOINT_H
#define DDT_CHECKPOINT_H

#include "drafter.h"
#include "optimizer.h"

#include <stddef.h>
#include <stdint.h>

/* Writes the checkpoint of `step`, then removes all but the newest `keep` (>= 1).
 * path_out (the final directory) and *bytes_out (its size) on success.
 * 0, or a negative errno with err; on failure nothing of the new checkpoint remains. */
int ddt_checkpoint_write(const char *run_dir, int64_t step, const ddt_drafter_config *c,
                         const float *params, const ddt_adamw_state *adam, const char *state_json,
                         int keep, char *path_out, size_t path_len, int64_t *bytes_out,
                         char *err, size_t err_len);

/* The newest complete checkpoint: 0 with *step and its path, -ENOENT when there is none. */
int ddt_checkpoint_latest(const char *run_dir, int64_t *step, char *path, size_t path_len);

/* Reads a checkpoint into params and adam (both sized by the table of c; adam->m, v
 * allocated by the caller) and *state_json (malloc'd, the caller frees).
 * 0, or -EINVAL with err naming the file and what does not match c. */
int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, char **state_json, char *err, size_t err_len);

/* The serving export of params into out_dir (created; replaced atomically if present). */
int ddt_export_write(const char *out_dir, const ddt_drafter_config *c, const float *params,
                     char *err, size_t err_len);

#endif
