/* export_impl.h: what export.c lends checkpoint.c, record-internal: directories written under a
 * temporary name and put in place (a checkpoint is written as an export is), the parameter
 * table, and the drafter as the export's config.json object, which is state.json's "drafter"
 * too (one table of keys, drafter_keys, for the export's config.json and for state.json).
 * checkpoint.c depends on export.c, never the other way round.
 * Tested through checkpoint.h and export.h by tests/engine/record/test_checkpoint.c.
 */
#ifndef DDT_EXPORT_IMPL_H
#define DDT_EXPORT_IMPL_H

#include "base/json_fields.h"
#include "model/drafter.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

enum { CKPT_PATH_MAX = 4096 };
/* integers a JSON number (a double) holds exactly */
static const int64_t json_int_max = (int64_t)1 << 53;

/* ------------------------------------------------------------------------------------------
 * Paths and files
 */

/* out = the formatted path: 0, or -ENAMETOOLONG */
__attribute__((format(printf, 3, 4)))
int ddt_path_join(char *out, size_t len, const char *fmt, ...);
/* path created (it must not exist) with text, fsynced: 0, or -errno with nothing left */
int ddt_write_text_file(const char *path, const char *text, char *err, size_t err_len);
/* 0 when path is a directory (a link followed), else -errno (-ENOTDIR) */
int ddt_directory(const char *path);
/* path and everything under it, never following a link; a missing path is no error: 0 or -errno */
int ddt_remove_tree(const char *path);
/* The directory built at tmp becomes final (one already there renamed to aside, removed once
 * the parent is fsynced); on failure tmp is left for the caller to remove. */
int ddt_install_dir(const char *tmp, const char *final, const char *aside, const char *parent,
                    char *err, size_t err_len);
/* The table of c (malloc'd, DDT_MAX_PARAMS rows): its count, or -1 when out of memory */
int ddt_param_table(const ddt_drafter_config *c, ddt_param **table, int64_t *total);

/* ------------------------------------------------------------------------------------------
 * The drafter as the export's config.json object (export.c's drafter_keys)
 */

/* one key of the export's config.json (export.c's) */
typedef struct drafter_key drafter_key;

/* c as the export's config.json object: NULL when out of memory */
cJSON *ddt_drafter_json(const ddt_drafter_config *c);
/* o printed with a final newline, malloc'd (NULL when out of memory); o is deleted */
char *ddt_json_text(cJSON *o);
/* The object o, as state.json `version` holds it, into *c, every key checked (a key newer than
 * the version may be absent: max_position_embeddings is then max_positions): 0, or -EINVAL
 * with err = "WHERE: key what" and *c untouched. */
int ddt_drafter_from_json(const ddt_json_ctx *j, const cJSON *o, int64_t version, int64_t max_positions,
                          ddt_drafter_config *c);
/* The pieces of that reading, for state.json's first form: obj's mask_token_id and
 * target_layer_ids; o's key k; the key named `key` (NULL when none); d checked as a whole. */
int ddt_read_dflash(const ddt_json_ctx *j, const cJSON *obj, ddt_drafter_config *d);
int ddt_read_drafter_key(const ddt_json_ctx *j, const cJSON *o, const drafter_key *k, ddt_drafter_config *d);
const drafter_key *ddt_find_drafter_key(const char *key);
int ddt_check_drafter(const ddt_json_ctx *j, const ddt_drafter_config *d);

#endif
