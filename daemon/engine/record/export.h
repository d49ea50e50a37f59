/* export.h: the serving export (SPEC.md section 5).
 *
 * The export is a serving directory: config.json (architectures DFlashDraftModel or
 * DFlash2DraftModel, the keys of SPEC.md section 5, docs/formats.md), model.safetensors in BF16 with exactly the parameter
 * names, and ddtree-manifest.json (each of those two files' size and xxHash64: base/checksum.h),
 * written under a temporary name, every file fsynced, then renamed (and the parent fsynced).
 * ddt_export_read reads one back (`ddtreed step --drafter`, `ddtreed speculate --drafter`),
 * refusing a file that does not match the manifest; ddt_export_verify says what an export's files
 * are worth (`ddtreed verify`); checkpoint.h's ddt_checkpoint_export makes one from a checkpoint
 * alone.
 * checkpoint.h includes this header: its callers find these functions there.
 * Tested by tests/engine/record/test_checkpoint.c, tests/daemon/export_loaders_check.py and, through the tools,
 * tests/oracle/step_torch_check.py and tests/daemon/speculate_cli_test.sh.
 */
#ifndef DDT_EXPORT_H
#define DDT_EXPORT_H

#include "base/checksum.h"
#include "model/drafter.h"

#include <stddef.h>

/* the export's file of every file's size and checksum (docs/formats.md) */
#define DDT_EXPORT_MANIFEST "ddtree-manifest.json"

/* The serving export of params into out_dir (created; replaced atomically if present); c must
 * have its max_positions (ddt_run_config_resolve sets it). */
int ddt_export_write(const char *out_dir, const ddt_drafter_config *c, const float *params,
                     char *err, size_t err_len);

/* DIR's files against its manifest into *v: GOOD; UNVERIFIED without a manifest (an export
 * written before checksums, or by another trainer) when config.json and model.safetensors are
 * there; INCOMPLETE naming a file the manifest lists (or, without one, either of those two) that
 * is missing; CORRUPT naming the first file whose size or checksum differs, or the manifest when
 * it does not read. 0, or -errno when DIR is not a directory (*v untouched). */
int ddt_export_verify(const char *dir, ddt_verdict *v);

/* DIR/config.json into c (ddt_drafter_config_load) once it matches the manifest, as
 * ddt_export_read checks it: what a caller reads before the weights. */
int ddt_export_read_config(const char *dir, ddt_drafter_config *c, char *err, size_t err_len);

/* A serving export read back as a serving stack reads it, once every file matches the manifest
 * (else -EBADMSG, or -ENOENT for a missing file, with err = "DIR/FILE is corrupt (expected
 * xxh64 X, got Y): what to do"; one without a manifest is read with a warning logged):
 * DIR/config.json into c (ddt_drafter_config_load: every key checked) and DIR/model.safetensors,
 * F32 or BF16 (F16, F64 too), holding exactly the tensors of c's parameter table: a missing, mistyped or misshapen one,
 * or one the table does not have, is -EINVAL with err naming the file and the tensor
 * ("DIR/model.safetensors: tensor 'layers.1.mlp.up_proj.weight' is missing"). *params: the
 * weights converted to fp32 in the table's layout (P floats, ddt_drafter_param_table's total),
 * 64-byte aligned from posix_memalign: free() it. On failure *params is NULL and c undefined.
 * 0, -ENOMEM, or the file's -errno. */
int ddt_export_read(const char *dir, ddt_drafter_config *c, float **params, char *err, size_t err_len);

#endif
