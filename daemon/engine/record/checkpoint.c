/* checkpoint.c: resumable checkpoints (SPEC.md section 5; see checkpoint.h): the weights and
 * the AdamW moments in state.safetensors, the typed state.json, and their reading back.
 *
 * A checkpoint is a directory put in place as an export is (export.c's ddt_install_dir: built
 * and fsynced under a temporary name, renamed in, the parent fsynced; one of the same step
 * renamed aside and removed after), so a crash leaves the whole checkpoint or none of it.
 * Checkpoint temporaries are named ".tmp-*" inside RUN_DIR/checkpoints/: ddt_checkpoint_latest
 * skips them and the next write removes them.
 * state.json is written and read here only (ddt_checkpoint_meta); its drafter is the export's
 * config.json object (export.c's drafter_keys, through export_impl.h).
 * state.json records state.safetensors' size and xxHash64 (base/checksum.h), taken from the
 * bytes as they are written; every read of the tensors first reads the file back whole against
 * them and refuses it, naming the file, both checksums and what to do, when it differs. A resume
 * (ddt_checkpoint_read_newest) passes over newer checkpoints that do not verify, newest first.
 * state.json versions 3, 2 and 1 (the first form) are read too, their tensors unverified (a
 * warning logged): what their drafter did not say comes from its layer_types and, for
 * max_position_embeddings, from the run config's target.
 * The export of a kept checkpoint (ddt_checkpoint_export) is made from the checkpoint alone:
 * its state.json says the drafter, its tensors the weights, and export.c writes the export.
 *
 * Not here: several writers on one run directory (one trainer owns it), what the run config
 * in state.json says (run_config.c's; parsed here only to read the forms before version 3),
 * the export's format (export.c).
 * Tested by tests/engine/record/test_checkpoint.c, and through `ddtreed train --resume` and `ddtreed export`
 * by tests/daemon/train_cli_test.sh.
 *
 * Legend: P floats in all parameters (the table's total), n entries of the parameter table.
 */
#include "base/checksum.h"
#include "base/read_file.h"
#include "base/errors.h"
#include "base/fault.h"
#include "checkpoint.h"
#include "export_impl.h"
#include "base/json_fields.h"
#include "base/log.h"
#include "run/run_config.h"
#include "model/safetensors.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CKPT_NAME_MAX = DDT_CHECKPOINT_NAME_MAX };
/* state.json is kilobytes (the run config, the drafter's keys); the cap only stops a
 * corrupted file from being read whole. */
#define CKPT_STATE_JSON_MAX (64u << 20)
/* state.json's "version"; the first form had none (and "resolved" for "drafter"), version 2's
 * drafter lacked the keys of drafter_keys marked `since` 3, versions before 4 had no "files"
 * (their checkpoints are read unverified) */
enum { STATE_VERSION = 4, FILES_SINCE = 4 };
static const char tensors_name[] = "state.safetensors", state_name[] = "state.json";
static const char checkpoint_remedy[] =
    "resume or export from an earlier checkpoint (`ddtreed verify RUN_DIR` says which are good; `ddtreed export "
    "RUN_DIR --step N`), or restore this one from a copy";

static const char *const state_prefix[3] = { "param.", "adam_m.", "adam_v." };
static const char step_tensor[] = "adam_step";
static const char checkpoint_format[] = "ddtree-checkpoint", checkpoint_version[] = "1";

/* ------------------------------------------------------------------------------------------
 * Step directories: "step-" and at least 8 digits
 */

typedef ddt_checkpoint_dir step_dir;

static int parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *digits = name + 5;
    size_t len = strlen(digits);
    if (len < 8 || len > 18 || strspn(digits, "0123456789") != len)
        return 0;
    *step = strtoll(digits, NULL, 10);
    return 1;
}

static int step_dir_newer_first(const void *a, const void *b)
{
    const step_dir *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : strcmp(x->name, y->name);
}

/* The step-* entries of ckdir, newest first (*dirs malloc'd, NULL when none): 0 or -errno */
static int list_steps(const char *ckdir, step_dir **dirs, int *count)
{
    *dirs = NULL;
    *count = 0;
    DIR *d = opendir(ckdir);
    if (!d)
        return -errno;
    int cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_step_name(e->d_name, &step) || strlen(e->d_name) >= CKPT_NAME_MAX)
            continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            step_dir *grown = realloc(*dirs, (size_t)cap * sizeof **dirs);
            if (!grown) {
                rc = -ENOMEM;
                break;
            }
            *dirs = grown;
        }
        (*dirs)[*count].step = step;
        snprintf((*dirs)[*count].name, CKPT_NAME_MAX, "%s", e->d_name);
        (*count)++;
    }
    closedir(d);
    if (rc != 0) {
        free(*dirs);
        *dirs = NULL;
        *count = 0;
        return rc;
    }
    if (*count > 1)
        qsort(*dirs, (size_t)*count, sizeof **dirs, step_dir_newer_first);
    return 0;
}

int ddt_checkpoint_dirs(const char *run_dir, ddt_checkpoint_dir **dirs, int *count)
{
    char ckdir[CKPT_PATH_MAX];
    *dirs = NULL;
    *count = 0;
    if (!run_dir)
        return -EINVAL;
    if (ddt_path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir))
        return -ENAMETOOLONG;
    return list_steps(ckdir, dirs, count);
}

/* Both files present and state.safetensors opens (every rule of the format holds). */
static int checkpoint_complete(const char *dir)
{
    char path[CKPT_PATH_MAX], why[512];
    struct stat st;
    if (ddt_path_join(path, sizeof path, "%s/state.json", dir) || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    ddt_st_file f;
    if (ddt_path_join(path, sizeof path, "%s/state.safetensors", dir) || ddt_st_open(path, &f, why, sizeof why))
        return 0;
    ddt_st_close(&f);
    return 1;
}

/* Removes complete checkpoints beyond the newest `keep`, never `written` (best effort: the
 * new checkpoint is in place, and the next write tries again). Incomplete step-* directories
 * cannot come from this writer; they are left alone and do not count. */
static void prune_checkpoints(const char *ckdir, int keep, const char *written)
{
    step_dir *dirs;
    int count;
    if (list_steps(ckdir, &dirs, &count) != 0)
        return;
    int kept = 0;
    for (int i = 0; i < count; i++) {
        char dir[CKPT_PATH_MAX];
        if (ddt_path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name))
            continue;
        int is_written = strcmp(dirs[i].name, written) == 0;
        if (!is_written && !checkpoint_complete(dir))
            continue;
        if (kept < keep || is_written)
            kept++;
        else
            ddt_remove_tree(dir);
    }
    free(dirs);
}

/* Removes the ".tmp-*" entries of ckdir: what a crashed write left (best effort). */
static void remove_stale_temporaries(const char *ckdir)
{
    DIR *d = opendir(ckdir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[CKPT_PATH_MAX];
        if (strncmp(e->d_name, ".tmp-", 5) == 0 && !ddt_path_join(path, sizeof path, "%s/%s", ckdir, e->d_name))
            ddt_remove_tree(path);   /* readdir tolerates entries removed while it runs */
    }
    closedir(d);
}

/* ------------------------------------------------------------------------------------------
 * state.json: a ddt_checkpoint_meta (docs/formats.md). Every key checked at read; the first
 * form (no "version") is read too: its drafter is the run config's, completed by "resolved".
 */

/* obj's key as an object (*out): 0, or -EINVAL naming it */
static int object_key(const ddt_json_ctx *j, const cJSON *obj, const char *key, const cJSON **out)
{
    *out = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!*out)
        return ddt_json_fail(j, key, "is missing");
    return cJSON_IsObject(*out) ? 0 : ddt_json_fail(j, key, "must be an object");
}

/* obj's key as a string (*out, inside obj): 0, or -EINVAL naming it */
static int text_key(const ddt_json_ctx *j, const cJSON *obj, const char *key, const char **out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = cJSON_GetStringValue(v);
    if (!v)
        return ddt_json_fail(j, key, "is missing");
    return *out ? 0 : ddt_json_fail(j, key, "must be a string");
}

static const struct meta_int {
    const char *key;
    size_t offset;   /* of an int64_t in ddt_checkpoint_meta */
    int64_t lo;      /* and json_int_max */
} meta_ints[] = {
    { "step", offsetof(ddt_checkpoint_meta, step), 0 },
    { "cursor", offsetof(ddt_checkpoint_meta, cursor), 0 },
    { "chunk", offsetof(ddt_checkpoint_meta, chunk), 1 },
    { "vocab_tile", offsetof(ddt_checkpoint_meta, vocab_tile), 0 },
};
enum { META_INTS = sizeof meta_ints / sizeof meta_ints[0] };
static const char *const state_keys[] = { "version", "run_id", "step", "cursor", "chunk", "vocab_tile",
                                          "config", "drafter", "files", "seal", NULL };
/* versions 2 and 3: the same but "files" */
static const char *const unsummed_state_keys[] = { "version", "run_id", "step", "cursor", "chunk", "vocab_tile",
                                                   "config", "drafter", NULL };
static const char *const files_keys[] = { tensors_name, NULL };
static const char *const first_state_keys[] = { "run_id", "step", "cursor", "chunk", "vocab_tile", "config",
                                                "resolved", NULL };
/* what the first form's run config left to the target */
static const char *const resolved_keys[] = { "hidden_size", "vocab_size", "num_target_layers", "mask_token_id",
                                             "target_layer_ids", NULL };

static int64_t *meta_int(const ddt_checkpoint_meta *m, int i)
{
    return (int64_t *)((const char *)m + meta_ints[i].offset);
}

void ddt_checkpoint_meta_free(ddt_checkpoint_meta *meta)
{
    if (!meta)
        return;
    free(meta->config_json);
    meta->config_json = NULL;
}

/* A meta the reader would refuse is refused before anything is written. */
static int check_meta(const ddt_checkpoint_meta *m, char *err, size_t err_len)
{
    if (!m->config_json || !memchr(m->run_id, '\0', sizeof m->run_id))
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: meta needs a run config and a run id of < 40 characters");
    for (int i = 0; i < META_INTS; i++) {
        int64_t v = *meta_int(m, i);
        if (v < meta_ints[i].lo || v > json_int_max)
            return ddt_fail(err, err_len, -EINVAL, "checkpoint: %s must be in [%lld, 2^53] (got %lld)", meta_ints[i].key,
                        (long long)meta_ints[i].lo, (long long)v);
    }
    /* the drafter as the reader will see it: what it would refuse is refused now */
    ddt_drafter_config back;
    cJSON *o = ddt_drafter_json(&m->drafter);
    int rc = o ? ddt_drafter_from_json(&(ddt_json_ctx){ "checkpoint: drafter", err, err_len }, o, STATE_VERSION, 0, &back)
               : ddt_fail(err, err_len, -ENOMEM, "checkpoint: out of memory");
    cJSON_Delete(o);
    return rc;
}

/* state.json's text for m, recording state.safetensors' checksum: malloc'd, NULL when out of
 * memory */
static char *meta_text(const ddt_checkpoint_meta *m, const ddt_checksum *tensors)
{
    cJSON *o = cJSON_CreateObject(), *files = NULL, *sum = NULL;
    int ok = o && cJSON_AddNumberToObject(o, "version", STATE_VERSION) && cJSON_AddStringToObject(o, "run_id", m->run_id);
    for (int i = 0; ok && i < META_INTS; i++)
        ok = cJSON_AddNumberToObject(o, meta_ints[i].key, (double)*meta_int(m, i)) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "config", m->config_json);
    cJSON *drafter = ok ? ddt_drafter_json(&m->drafter) : NULL;
    ok = drafter && cJSON_AddItemToObject(o, "drafter", drafter);
    if (!ok)
        cJSON_Delete(drafter);
    ok = ok && (files = cJSON_AddObjectToObject(o, "files")) && (sum = ddt_checksum_json(tensors)) &&
         cJSON_AddItemToObject(files, tensors_name, sum);
    if (!ok) {
        cJSON_Delete(sum);
        cJSON_Delete(o);
        return NULL;
    }
    char *text = cJSON_AddStringToObject(o, "seal", DDT_SEAL_ZERO) ? ddt_json_text(o) : (cJSON_Delete(o), NULL);
    if (text && ddt_checksum_seal(text)) {   /* the last key is the seal's: a bug if not */
        free(text);
        text = NULL;
    }
    return text;
}

/* What the forms before version 3 did not say, max_position_embeddings: the run config's
 * target's (ddt_run_config_max_positions), as the trainer resolves it. */
static int config_max_positions(const ddt_json_ctx *j, const char *config, int64_t *out)
{
    ddt_run_config cfg;
    memset(&cfg, 0, sizeof cfg);
    char why[1024], field[160];
    int rc = 0;
    if (ddt_run_config_parse(config, strlen(config), &cfg, why, sizeof why, field, sizeof field) ||
        ddt_run_config_max_positions(&cfg, out, why, sizeof why))
        rc = ddt_fail(j->err, j->err_len, -EINVAL, "%s: config: %s", j->path, why);
    ddt_run_config_free(&cfg);
    return rc;
}

/* The first form's drafter: the run config's drafter (parsed from `config`), completed by
 * root's "resolved" object. */
static int first_form_drafter(const ddt_json_ctx *j, const cJSON *root, const char *config, ddt_drafter_config *d)
{
    const cJSON *resolved;
    int rc = object_key(j, root, "resolved", &resolved);
    if (rc)
        return rc;
    char where[CKPT_PATH_MAX], why[1024], field[160];
    snprintf(where, sizeof where, "%s: resolved", j->path);
    ddt_json_ctx r = { where, j->err, j->err_len };
    if ((rc = ddt_json_only(&r, resolved, resolved_keys)))
        return rc;
    ddt_run_config cfg;
    memset(&cfg, 0, sizeof cfg);
    if (ddt_run_config_parse(config, strlen(config), &cfg, why, sizeof why, field, sizeof field))
        rc = ddt_fail(j->err, j->err_len, -EINVAL, "%s: config: %s", j->path, why);
    *d = cfg.drafter;
    ddt_run_config_free(&cfg);
    if (!rc)
        rc = config_max_positions(j, config, &d->max_positions);
    for (int i = 0; !rc && i < 3; i++)   /* hidden_size, vocab_size, num_target_layers */
        rc = ddt_read_drafter_key(&r, resolved, ddt_find_drafter_key(resolved_keys[i]), d);
    if (!rc)
        rc = ddt_read_dflash(&r, resolved, d);
    return rc ? rc : ddt_check_drafter(&r, d);
}

/* root's keys beside "version" (and "files") into *meta, every key checked */
static int meta_from_json(const ddt_json_ctx *j, const cJSON *root, int64_t version, ddt_checkpoint_meta *meta)
{
    char where[CKPT_PATH_MAX + 16];
    ddt_checkpoint_meta m;
    memset(&m, 0, sizeof m);
    int rc = ddt_json_only(j, root, version == 1 ? first_state_keys : version < FILES_SINCE ? unsummed_state_keys
                                                                                             : state_keys);
    const char *run_id = NULL, *config = NULL;
    if (!rc && !(rc = text_key(j, root, "run_id", &run_id)) && strlen(run_id) >= sizeof m.run_id)
        rc = ddt_json_fail(j, "run_id", "must be shorter than 40 characters");
    for (int i = 0; !rc && i < META_INTS; i++)
        rc = ddt_json_int(j, root, meta_ints[i].key, meta_ints[i].lo, json_int_max, 0, 0, meta_int(&m, i));
    if (!rc)
        rc = text_key(j, root, "config", &config);
    const cJSON *drafter = NULL;
    int64_t max_positions = 0;   /* version 2's drafter does not say it */
    if (!rc && version == 1)
        rc = first_form_drafter(j, root, config, &m.drafter);
    else if (!rc && !(rc = object_key(j, root, "drafter", &drafter)) &&
             !(rc = version < 3 ? config_max_positions(j, config, &max_positions) : 0)) {
        snprintf(where, sizeof where, "%s: drafter", j->path);
        rc = ddt_drafter_from_json(&(ddt_json_ctx){ where, j->err, j->err_len }, drafter, version, max_positions,
                                   &m.drafter);
    }
    if (!rc && !(m.config_json = strdup(config)))
        rc = ddt_fail(j->err, j->err_len, -ENOMEM, "%s: out of memory", j->path);
    if (!rc) {
        snprintf(m.run_id, sizeof m.run_id, "%s", run_id);
        *meta = m;
    }
    return rc;
}

/* What state.json records of state.safetensors: from version 4 on, its checksum. */
typedef struct tensors_record {
    int recorded;   /* 0: a state.json written before checksums */
    ddt_checksum sum;
} tensors_record;

/* state.json's seal (base/checksum.h: a changed byte anywhere in it): 0, or -EBADMSG with err
 * naming the file and both checksums */
static int check_seal(const char *path, char *err, size_t err_len)
{
    char *text = ddt_read_text_file(path, CKPT_STATE_JSON_MAX, err, err_len);
    if (!text)
        return -EIO;
    uint64_t want = 0, got = 0;
    int rc = ddt_checksum_check_seal(text, strlen(text), &want, &got);
    free(text);
    char w[DDT_CHECKSUM_HEX], g[DDT_CHECKSUM_HEX];
    ddt_checksum_hex(want, w);
    ddt_checksum_hex(got, g);
    if (rc == -ENOENT)
        return ddt_fail(err, err_len, -EBADMSG, "%s is corrupt (its \"seal\", the last key, is missing or damaged)",
                        path);
    return rc ? ddt_fail(err, err_len, rc, "%s is corrupt (its seal: expected xxh64 %s, got %s)", path, w, g) : 0;
}

/* CKPT_DIR/state.json: into meta, every key checked (ddt_checkpoint_read_meta), or when meta is
 * NULL only its version and "files" (a read of the tensors alone); *rec its record of the
 * tensors. 0, or -EINVAL with err naming the file and the key; meta and rec as they were then. */
static int read_state(const char *ckpt_dir, ddt_checkpoint_meta *meta, tensors_record *rec, char *err,
                      size_t err_len)
{
    char path[CKPT_PATH_MAX];
    if (ddt_path_join(path, sizeof path, "%s/%s", ckpt_dir, state_name))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
    cJSON *root = ddt_json_parse_file(path, CKPT_STATE_JSON_MAX, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    int64_t version = 1;   /* the first form had no "version" */
    tensors_record r = { 0 };
    int rc = 0;
    if (cJSON_GetObjectItemCaseSensitive(root, "version") &&
        ddt_json_int(&j, root, "version", 2, STATE_VERSION, 0, 0, &version))
        rc = ddt_json_fail(&j, "version", "must be 2, 3 or 4 (this build reads those and the first form, without one)");
    const cJSON *files = NULL;
    if (!rc && version >= FILES_SINCE)
        rc = check_seal(path, err, err_len);
    if (!rc && version >= FILES_SINCE && !(rc = object_key(&j, root, "files", &files))) {
        char where[CKPT_PATH_MAX + 16];
        snprintf(where, sizeof where, "%s: files", path);
        ddt_json_ctx f = { where, err, err_len };
        if (!(rc = ddt_json_only(&f, files, files_keys)) && !(rc = ddt_checksum_from_json(&f, files, tensors_name, &r.sum)))
            r.recorded = 1;
    }
    if (!rc && meta)
        rc = meta_from_json(&j, root, version, meta);
    if (!rc)
        *rec = r;
    cJSON_Delete(root);
    return rc;
}

int ddt_checkpoint_read_meta(const char *ckpt_dir, ddt_checkpoint_meta *meta, char *err, size_t err_len)
{
    if (!ckpt_dir || !meta)
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    tensors_record rec;
    return read_state(ckpt_dir, meta, &rec, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * state.safetensors
 */

/* state.safetensors, then state.json recording its checksum (taken as it is written), into tmp */
static int write_state(const char *tmp, const ddt_checkpoint_meta *meta, const float *params,
                       const ddt_adamw_state *adam, char *err, size_t err_len)
{
    const ddt_drafter_config *c = &meta->drafter;
    ddt_checksum sum;
    char *state_text = NULL;
    ddt_param *table;
    int64_t total;
    int n = ddt_param_table(c, &table, &total);
    ddt_st_entry *entries = n >= 0 ? calloc(3 * (size_t)n + 1, sizeof *entries) : NULL;
    char (*names)[CKPT_NAME_MAX] = n >= 0 ? calloc(3 * (size_t)n, sizeof *names) : NULL;
    int rc = 0;
    if (!entries || !names) {
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the tensor list", tmp);
        goto done;
    }
    const float *family[3] = { params, adam->m, adam->v };   /* (P) each */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) {
            ddt_st_entry *e = &entries[k * n + i];
            snprintf(names[k * n + i], CKPT_NAME_MAX, "%s%s", state_prefix[k], table[i].name);
            e->name = names[k * n + i];
            e->dtype = DDT_F32;
            e->ndim = table[i].ndim;
            e->shape[0] = table[i].shape[0];
            e->shape[1] = table[i].shape[1];
            e->shape[2] = table[i].shape[2];
            e->data = family[k] + table[i].offset;
        }
    entries[3 * n] = (ddt_st_entry){ .name = step_tensor, .dtype = DDT_I64, .ndim = 0, .data = &adam->step };
    const char *const keys[] = { "format", "version" };
    const char *const values[] = { checkpoint_format, checkpoint_version };
    char path[CKPT_PATH_MAX];
    rc = ddt_path_join(path, sizeof path, "%s/%s", tmp, tensors_name);
    if (rc == 0)
        rc = ddt_st_write_summed(path, entries, 3 * n + 1, keys, values, 2, &sum, err, err_len);
    if (rc == 0 && !(state_text = meta_text(meta, &sum)))
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for state.json", tmp);
    if (rc == 0 && !(rc = ddt_path_join(path, sizeof path, "%s/%s", tmp, state_name)))
        rc = ddt_write_text_file(path, state_text, err, err_len);
    if (rc == -ENAMETOOLONG)
        ddt_fail(err, err_len, rc, "%s: path too long", tmp);
done:
    free(state_text);
    free(names);
    free(entries);
    free(table);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Checkpoints
 */

int ddt_checkpoint_write(const char *run_dir, const ddt_checkpoint_meta *meta, const float *params,
                         const ddt_adamw_state *adam, int keep, char *path_out, size_t path_len,
                         int64_t *bytes_out, char *err, size_t err_len)
{
    if (path_out && path_len > 0)
        path_out[0] = '\0';
    if (bytes_out)
        *bytes_out = 0;
    if (!run_dir || !meta || !params || !adam || !adam->m || !adam->v)
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    if (keep < 1)
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: keep must be >= 1 (got %d)", keep);
    int rc = check_meta(meta, err, err_len);
    if (rc != 0)
        return rc;
    const int64_t step = meta->step;
    struct stat st;
    if (stat(run_dir, &st) != 0)
        return ddt_fail(err, err_len, -errno, "%s: run directory: %s", run_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOTDIR, "%s: run directory is not a directory", run_dir);

    char ckdir[CKPT_PATH_MAX], final[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], aside[CKPT_PATH_MAX],
        longest[CKPT_PATH_MAX];
    long pid = (long)getpid();
    if (ddt_path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir) ||
        ddt_path_join(final, sizeof final, "%s/step-%08lld", ckdir, (long long)step) ||
        ddt_path_join(tmp, sizeof tmp, "%s/.tmp-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        ddt_path_join(aside, sizeof aside, "%s/.tmp-replaced-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        ddt_path_join(longest, sizeof longest, "%s/state.safetensors.tmp", tmp))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long for a checkpoint", run_dir);
    if (path_out && strlen(final) >= path_len)
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: longer than path_out (%zu bytes)", final, path_len);

    if (mkdir(ckdir, 0755) == 0) {
        rc = ddt_fsync_dir(run_dir);
        if (rc != 0)
            return ddt_fail(err, err_len, rc, "%s: fsync after creating checkpoints/: %s", run_dir, strerror(-rc));
    } else if (errno != EEXIST) {
        return ddt_fail(err, err_len, -errno, "%s: cannot create: %s", ckdir, strerror(errno));
    } else if (stat(ckdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return ddt_fail(err, err_len, -ENOTDIR, "%s: exists and is not a directory", ckdir);
    }
    remove_stale_temporaries(ckdir);

    if (mkdir(tmp, 0755) != 0)
        return ddt_fail(err, err_len, -errno, "%s: cannot create: %s", tmp, strerror(errno));
    rc = write_state(tmp, meta, params, adam, err, err_len);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        ddt_fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    ddt_fault_point("checkpoint.tensors_written");   /* a test hook (base/fault.h) */
    if (rc == 0)
        rc = ddt_install_dir(tmp, final, aside, ckdir, err, err_len);
    if (rc != 0) {
        ddt_remove_tree(tmp);
        return rc;
    }

    int64_t bytes = 0;
    static const char *const files[] = { "state.safetensors", "state.json" };
    for (int i = 0; i < 2; i++) {
        char path[CKPT_PATH_MAX];
        if (!ddt_path_join(path, sizeof path, "%s/%s", final, files[i]) && stat(path, &st) == 0)
            bytes += (int64_t)st.st_size;
    }
    prune_checkpoints(ckdir, keep, strrchr(final, '/') + 1);
    if (path_out)
        snprintf(path_out, path_len, "%s", final);
    if (bytes_out)
        *bytes_out = bytes;
    return 0;
}

int ddt_checkpoint_latest(const char *run_dir, int64_t *step, char *path, size_t path_len)
{
    char ckdir[CKPT_PATH_MAX];
    if (!run_dir)
        return -EINVAL;
    if (ddt_path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir))
        return -ENAMETOOLONG;
    step_dir *dirs;
    int count, rc = list_steps(ckdir, &dirs, &count);
    if (rc != 0)
        return rc;   /* -ENOENT when there is no checkpoints/ yet */
    rc = -ENOENT;
    for (int i = 0; i < count && rc == -ENOENT; i++) {
        char dir[CKPT_PATH_MAX];
        if (ddt_path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name) || !checkpoint_complete(dir))
            continue;
        if (path && ddt_path_join(path, path_len, "%s", dir)) {
            rc = -ENAMETOOLONG;
            break;
        }
        if (step)
            *step = dirs[i].step;
        rc = 0;
    }
    free(dirs);
    return rc;
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

/* Whether the file's tensor `name` is one a checkpoint of this table holds. */
static int expected_name(const char *name, const ddt_param *table, int n)
{
    if (!strcmp(name, step_tensor))
        return 1;
    for (int k = 0; k < 3; k++) {
        size_t plen = strlen(state_prefix[k]);
        if (strncmp(name, state_prefix[k], plen) != 0)
            continue;
        for (int i = 0; i < n; i++)
            if (!strcmp(name + plen, table[i].name))
                return 1;
    }
    return 0;
}

/* Every tensor the table of c wants, present as F32 of its shape, adam_step as I64 0-d, and no
 * other: 0, or -EINVAL naming the file and the first tensor that does not match. */
static int check_state(const ddt_st_file *f, const ddt_param *table, int n, char *err, size_t err_len)
{
    const char *format = ddt_st_metadata(f, "format"), *version = ddt_st_metadata(f, "version");
    if (!format || strcmp(format, checkpoint_format) || !version || strcmp(version, checkpoint_version))
        return ddt_fail(err, err_len, -EINVAL, "%s: __metadata__ format/version is '%s'/'%s', expected '%s'/'%s'",
                    f->path, format ? format : "(none)", version ? version : "(none)", checkpoint_format,
                    checkpoint_version);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) {
            char name[CKPT_NAME_MAX], got[128], want[128];
            snprintf(name, sizeof name, "%s%s", state_prefix[k], table[i].name);
            const ddt_st_tensor *t = ddt_st_find(f, name);
            if (!t)
                return ddt_fail(err, err_len, -EINVAL, "%s: tensor '%s' is missing", f->path, name);
            if (t->dtype != DDT_F32)
                return ddt_fail(err, err_len, -EINVAL, "%s: tensor '%s' is %s, expected F32", f->path, name,
                            ddt_dtype_name(t->dtype));
            int same = t->ndim == table[i].ndim;
            for (int d = 0; same && d < t->ndim; d++)
                same = t->shape[d] == table[i].shape[d];
            if (!same) {
                shape_text(got, sizeof got, t->ndim, t->shape);
                shape_text(want, sizeof want, table[i].ndim, table[i].shape);
                return ddt_fail(err, err_len, -EINVAL,
                            "%s: tensor '%s' has shape %s, expected %s (a checkpoint of another drafter configuration?)",
                            f->path, name, got, want);
            }
        }
    const ddt_st_tensor *s = ddt_st_find(f, step_tensor);
    if (!s)
        return ddt_fail(err, err_len, -EINVAL, "%s: tensor '%s' is missing", f->path, step_tensor);
    int64_t step = -1;
    if (s->dtype == DDT_I64 && s->ndim == 0)
        memcpy(&step, s->data, sizeof step);
    if (step < 0)
        return ddt_fail(err, err_len, -EINVAL, "%s: tensor '%s' must be an I64 scalar >= 0", f->path, step_tensor);
    for (int j = 0; f->count != 3 * n + 1 && j < f->count; j++)
        if (!expected_name(f->tensors[j].name, table, n))
            return ddt_fail(err, err_len, -EINVAL,
                        "%s: tensor '%s' is not a parameter of this drafter configuration", f->path,
                        f->tensors[j].name);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Verification: state.safetensors against state.json's record, read back whole
 */

/* ckpt_dir's files into *v: both present, state.json read as read_state reads it (into meta
 * unless NULL), state.safetensors' size and checksum those it records. 0 when they verify (v
 * GOOD, or UNVERIFIED: a state.json before version 4); else err says v with what to do:
 * -ENOENT (a file missing), -EINVAL (state.json refused, as its reader says it), -EBADMSG
 * (state.safetensors not as recorded); meta as it was then. */
static int verify_checkpoint(const char *dir, ddt_checkpoint_meta *meta, ddt_verdict *v, char *err, size_t err_len)
{
    static const char *const files[] = { state_name, tensors_name };
    char path[CKPT_PATH_MAX];
    struct stat st;
    ddt_verdict_good(v);
    for (int i = 0; i < 2; i++) {
        if (ddt_path_join(path, sizeof path, "%s/%s", dir, files[i]))
            return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long", dir);
        if (stat(path, &st) != 0 && errno == ENOENT) {
            ddt_verdict_set(v, DDT_VERDICT_INCOMPLETE, files[i], "missing");
            return ddt_verdict_fail(v, dir, checkpoint_remedy, err, err_len);
        }
    }
    tensors_record rec;
    int rc = read_state(dir, meta, &rec, err, err_len);
    if (rc) {
        ddt_path_join(path, sizeof path, "%s/%s", dir, state_name);
        ddt_verdict_unreadable(v, state_name, path, err);
        return rc;
    }
    if (!rec.recorded)
        v->state = DDT_VERDICT_UNVERIFIED;
    else if (ddt_checksum_verify(dir, tensors_name, &rec.sum, v) != DDT_VERDICT_GOOD) {
        ddt_checkpoint_meta_free(meta);
        return ddt_verdict_fail(v, dir, checkpoint_remedy, err, err_len);
    }
    return 0;
}

int ddt_checkpoint_verify(const char *ckpt_dir, ddt_verdict *v)
{
    int rc = ckpt_dir && v ? ddt_directory(ckpt_dir) : -EINVAL;
    if (rc != 0)
        return rc;
    ddt_checkpoint_meta meta;
    char err[2048], path[CKPT_PATH_MAX];
    if (verify_checkpoint(ckpt_dir, &meta, v, err, sizeof err) == 0)
        ddt_checkpoint_meta_free(&meta);
    ddt_st_file f;   /* what a checkpoint before checksums can still be checked for: the format */
    if (v->state == DDT_VERDICT_UNVERIFIED && !ddt_path_join(path, sizeof path, "%s/%s", ckpt_dir, tensors_name)) {
        if (ddt_st_open(path, &f, err, sizeof err))
            ddt_verdict_unreadable(v, tensors_name, path, err);
        else
            ddt_st_close(&f);
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Reading a checkpoint back
 */

/* ddt_checkpoint_read, and *v: what its files are worth when that is why it failed (INCOMPLETE,
 * CORRUPT: a resume passes it over); GOOD or UNVERIFIED otherwise. */
static int read_checkpoint(const char *ckpt_dir, const ddt_drafter_config *c, float *params, ddt_adamw_state *adam,
                           ddt_checkpoint_meta *meta, ddt_verdict *v, char *err, size_t err_len)
{
    ddt_verdict_good(v);
    if (!ckpt_dir || !c || !params || (adam && (!adam->m || !adam->v)))
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    char why[512], path[CKPT_PATH_MAX];
    if (ddt_drafter_config_check(c, why, sizeof why))
        return ddt_fail(err, err_len, -EINVAL, "%s: the drafter configuration: %s", ckpt_dir, why);
    if (ddt_path_join(path, sizeof path, "%s/%s", ckpt_dir, tensors_name))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
    ddt_checkpoint_meta read_meta;   /* before any output is written: a failure leaves them as they were */
    int rc = verify_checkpoint(ckpt_dir, meta ? &read_meta : NULL, v, err, err_len);
    if (rc != 0)
        return rc;
    if (v->state == DDT_VERDICT_UNVERIFIED)
        ddt_log(DDT_LOG_WARNING, "checkpoint: read unverified path=\"%s\" reason=\"state.json records no checksum: "
                "written before checksums\"", ckpt_dir);
    ddt_st_file f;
    if ((rc = ddt_st_open(path, &f, err, err_len)) != 0) {
        ddt_verdict_unreadable(v, tensors_name, path, err);
        if (meta)
            ddt_checkpoint_meta_free(&read_meta);
        return rc;
    }
    ddt_param *table;
    int64_t total;
    int n = ddt_param_table(c, &table, &total);
    if (n < 0)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory", path);
    if (rc == 0)
        rc = check_state(&f, table, n, err, err_len);
    if (rc == 0) {
        float *family[3] = { params, adam ? adam->m : NULL, adam ? adam->v : NULL };   /* (P) each */
        for (int k = 0; k < 3 && family[k]; k++)
            for (int i = 0; i < n; i++) {
                char name[CKPT_NAME_MAX];
                snprintf(name, sizeof name, "%s%s", state_prefix[k], table[i].name);
                const ddt_st_tensor *t = ddt_st_find(&f, name);
                memcpy(family[k] + table[i].offset, t->data, (size_t)table[i].numel * sizeof(float));
            }
        if (adam)
            memcpy(&adam->step, ddt_st_find(&f, step_tensor)->data, sizeof adam->step);
        if (meta)
            *meta = read_meta;
    } else if (meta) {
        ddt_checkpoint_meta_free(&read_meta);
    }
    free(table);
    ddt_st_close(&f);
    return rc;
}

int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *err, size_t err_len)
{
    ddt_verdict v;
    return read_checkpoint(ckpt_dir, c, params, adam, meta, &v, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * A resume: the newest checkpoint that verifies
 */

int ddt_checkpoint_newest_meta(const char *run_dir, ddt_checkpoint_meta *meta, char *path, size_t path_len,
                               char *err, size_t err_len)
{
    char why[1024];
    step_dir *dirs;
    int count;
    if (!run_dir || !meta || !path)
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    int rc = ddt_checkpoint_dirs(run_dir, &dirs, &count);
    if (rc != 0 || count == 0)
        return ddt_fail(err, err_len, rc ? rc : -ENOENT, "%s has no checkpoint", run_dir);
    rc = -ENOENT;
    for (int i = 0; i < count && rc != 0; i++) {
        if (ddt_path_join(path, path_len, "%s/checkpoints/%s", run_dir, dirs[i].name))
            rc = ddt_fail(err, err_len, -ENAMETOOLONG, "%s: a checkpoint's path is longer than the buffer", run_dir);
        else   /* the newest one's error is the one said when none reads */
            rc = ddt_checkpoint_read_meta(path, meta, i ? why : err, i ? sizeof why : err_len);
    }
    free(dirs);
    return rc;
}

int ddt_checkpoint_read_newest(const char *run_dir, const ddt_drafter_config *c, float *params,
                               ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *path, size_t path_len,
                               ddt_checkpoint_passed **passed, int *passed_count, char *err, size_t err_len)
{
    step_dir *dirs;
    int count;
    *passed = NULL;
    *passed_count = 0;
    int rc = ddt_checkpoint_dirs(run_dir, &dirs, &count);
    if (rc != 0 || count == 0)
        return ddt_fail(err, err_len, rc ? rc : -ENOENT, "%s has no checkpoint to resume from", run_dir);
    ddt_checkpoint_passed *over = calloc((size_t)count, sizeof *over);   /* the ones passed over */
    int n_over = 0, looking = over != NULL;
    rc = over ? -EBADMSG : ddt_fail(err, err_len, -ENOMEM, "%s: out of memory", run_dir);
    for (int i = 0; looking && i < count; i++) {
        ddt_checkpoint_passed *p = &over[n_over];
        p->step = dirs[i].step;
        if (ddt_path_join(p->dir, sizeof p->dir, "%s/checkpoints/%s", run_dir, dirs[i].name))
            rc = ddt_fail(err, err_len, -ENAMETOOLONG, "%s: a checkpoint's path is too long", run_dir);
        else
            rc = read_checkpoint(p->dir, c, params, adam, meta, &p->verdict, err, err_len);
        looking = rc != 0 && (p->verdict.state == DDT_VERDICT_CORRUPT || p->verdict.state == DDT_VERDICT_INCOMPLETE);
        if (looking) {   /* the next, older one */
            n_over++;
            rc = -EBADMSG;
        } else if (rc == 0 && ddt_path_join(path, path_len, "%s", p->dir)) {
            rc = ddt_fail(err, err_len, -ENAMETOOLONG, "%s: longer than the path buffer", p->dir);
        }
    }
    if (rc == -EBADMSG) {   /* none verifies: each one named */
        size_t at = (size_t)snprintf(err, err_len, "%s: no checkpoint to resume from verifies:", run_dir);
        for (int i = 0; i < n_over && at < err_len; i++) {
            char said[1024];
            ddt_verdict_text(&over[i].verdict, said, sizeof said);
            at += (size_t)snprintf(err + at, err_len - at, " %s %s;", strrchr(over[i].dir, '/') + 1, said);
        }
        if (at < err_len)
            snprintf(err + at, err_len - at, " restore one from a copy (`ddtreed verify %s` checks them), or start "
                     "the run again", run_dir);
    }
    free(dirs);
    if (n_over > 0) {
        *passed = over;
        *passed_count = n_over;
    } else {
        free(over);
    }
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The export of a kept checkpoint: its state.json says the drafter, its tensors the weights
 */

int ddt_checkpoint_find(const char *run_dir, int64_t step, char *path, size_t path_len)
{
    if (ddt_path_join(path, path_len, "%s/checkpoints/step-%08lld", run_dir, (long long)step))
        return -ENAMETOOLONG;
    return checkpoint_complete(path) ? 0 : -ENOENT;
}

int ddt_checkpoint_export(const char *run_dir, int64_t step, const char *out_dir, char *ckpt,
                          size_t ckpt_len, char *err, size_t err_len)
{
    if (!run_dir || !out_dir || !ckpt || ckpt_len == 0)
        return ddt_fail(err, err_len, -EINVAL, "export: a required argument is NULL");
    int rc = 0;
    if (step < 0) {
        rc = ddt_checkpoint_latest(run_dir, &step, ckpt, ckpt_len);
        if (rc == -ENOENT)
            return ddt_fail(err, err_len, rc, "%s has no complete checkpoint", run_dir);
    } else if ((rc = ddt_checkpoint_find(run_dir, step, ckpt, ckpt_len)) == -ENOENT) {
        return ddt_fail(err, err_len, rc, "%s: no complete checkpoint of step %lld", ckpt, (long long)step);
    }
    if (rc != 0)
        return ddt_fail(err, err_len, rc, "%s: the checkpoint's path: %s", run_dir, strerror(-rc));
    ddt_checkpoint_meta meta;
    rc = ddt_checkpoint_read_meta(ckpt, &meta, err, err_len);
    if (rc != 0)
        return rc;
    ddt_param *table;
    int64_t total;
    float *params = ddt_param_table(&meta.drafter, &table, &total) >= 0 ? malloc((size_t)total * sizeof *params)
                                                                        : NULL;   /* (P) */
    rc = params ? ddt_checkpoint_read(ckpt, &meta.drafter, params, NULL, NULL, err, err_len)
                : ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the weights", ckpt);
    if (rc == 0)
        rc = ddt_export_write(out_dir, &meta.drafter, params, err, err_len);
    free(params);
    free(table);
    ddt_checkpoint_meta_free(&meta);
    return rc;
}
