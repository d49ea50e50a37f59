/* checkpoint.h: resumable checkpoints, and the serving export of one (SPEC.md section 5; the
 * export itself: export.h, included here).
 *
 * A checkpoint is a directory RUN_DIR/checkpoints/step-NNNNNNNN/ holding
 *   state.safetensors: F32 "param.<name>", "adam_m.<name>", "adam_v.<name>" for every
 *                      parameter of the drafter's table, and I64 scalar "adam_step";
 *   state.json:        a ddt_checkpoint_meta (below): where the run stands, its config, and
 *                      the drafter in the export's config.json form (docs/formats.md), and
 *                      state.safetensors' size and xxHash64 ("files", base/checksum.h);
 * written under a temporary name, every file fsynced, then renamed (and the parent fsynced),
 * so a crash leaves either the whole checkpoint or none. Only the newest `keep` remain.
 * Every read of the tensors verifies them against state.json first; a checkpoint whose
 * state.json predates checksums (version < 4) is read unverified, with a warning logged.
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

/* A step directory, RUN_DIR/checkpoints/NAME ("step-" and 8 to 18 digits). */
enum { DDT_CHECKPOINT_NAME_MAX = 96 };
typedef struct ddt_checkpoint_dir {
    int64_t step;
    char name[DDT_CHECKPOINT_NAME_MAX];
} ddt_checkpoint_dir;

/* RUN_DIR's step directories, complete or not, newest first: *dirs malloc'd (free() it; NULL
 * when none). 0, or -errno (-ENOENT without checkpoints/). */
int ddt_checkpoint_dirs(const char *run_dir, ddt_checkpoint_dir **dirs, int *count);

/* The newest complete checkpoint (both files there, state.safetensors well formed; its
 * checksum is not read): 0 with *step and its path, -ENOENT when there is none. */
int ddt_checkpoint_latest(const char *run_dir, int64_t *step, char *path, size_t path_len);
/* The complete checkpoint of `step`: 0 with its path, -ENOENT when none is kept, -ENAMETOOLONG. */
int ddt_checkpoint_find(const char *run_dir, int64_t step, char *path, size_t path_len);

/* CKPT_DIR/state.json into meta (the caller frees it with ddt_checkpoint_meta_free). Every key
 * is checked: a missing, mistyped or unknown one is -EINVAL with err naming the file and the
 * key. Versions 3 (without "files"), 2 (its drafter without use_sliding_window,
 * max_position_embeddings, torch_dtype and dtype: max_position_embeddings then comes from the
 * run config's target) and the form before state.json had a "version" (a "resolved" object
 * beside the run config) are read too. On failure meta is left as it was. */
int ddt_checkpoint_read_meta(const char *ckpt_dir, ddt_checkpoint_meta *meta, char *err, size_t err_len);

/* Reads a checkpoint's tensors into params and, unless adam is NULL, adam (sized by the table
 * of c; adam->m, v allocated by the caller), and, unless meta is NULL, its state.json as
 * ddt_checkpoint_read_meta does (else only its record of the tensors). The tensors are first
 * verified against state.json: a missing file is -ENOENT, state.safetensors not as recorded
 * -EBADMSG, with err = "CKPT_DIR/state.safetensors is corrupt (expected xxh64 X, got Y): what to
 * do". 0, or -EINVAL with err naming the file and what does not match c; a failure leaves every
 * output as it was. */
int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *err, size_t err_len);

/* What CKPT_DIR's files are worth (`ddtreed verify`), into *v: GOOD; UNVERIFIED (state.json
 * before version 4, state.safetensors well formed); INCOMPLETE naming the missing file; CORRUPT
 * naming state.safetensors (size or checksum not those recorded, or, unverified, malformed) or
 * state.json (its reader refuses it). 0, or -errno when CKPT_DIR is not a directory. */
int ddt_checkpoint_verify(const char *ckpt_dir, ddt_verdict *v);

/* The meta of RUN_DIR's newest checkpoint whose state.json reads (where a resume takes its run
 * config from: every checkpoint of a run holds the same), path its directory. -ENOENT when
 * there is no step directory; else, when none reads, the newest one's error. */
int ddt_checkpoint_newest_meta(const char *run_dir, ddt_checkpoint_meta *meta, char *path, size_t path_len,
                               char *err, size_t err_len);

/* A checkpoint a resume passed over: its directory, its step, what its files are worth. */
typedef struct ddt_checkpoint_passed {
    char dir[4096];
    int64_t step;
    ddt_verdict verdict;   /* INCOMPLETE or CORRUPT */
} ddt_checkpoint_passed;

/* ddt_checkpoint_read of RUN_DIR's newest checkpoint that verifies (good, or unverified), trying
 * them newest first; path receives its directory. *passed (malloc'd, free() it; NULL when none)
 * and *passed_count: the newer ones passed over, newest first, incomplete or corrupt. -ENOENT
 * when RUN_DIR has no step directory; -EBADMSG when none verifies, err naming each and what to
 * do; any other failure of a read (a checkpoint of another configuration) as
 * ddt_checkpoint_read says it, no older one tried. */
int ddt_checkpoint_read_newest(const char *run_dir, const ddt_drafter_config *c, float *params,
                               ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *path, size_t path_len,
                               ddt_checkpoint_passed **passed, int *passed_count, char *err, size_t err_len);

/* The serving export of RUN_DIR's checkpoint of `step` (-1: the newest) into out_dir, from the
 * checkpoint alone (no trainer, target or data); ckpt receives the checkpoint's path.
 * 0, -ENOENT when there is no complete checkpoint, or a negative errno with err. */
int ddt_checkpoint_export(const char *run_dir, int64_t step, const char *out_dir, char *ckpt,
                          size_t ckpt_len, char *err, size_t err_len);

#endif
