/* checkpoint.c: resumable checkpoints and the serving export (SPEC.md section 5; see
 * checkpoint.h).
 *
 * Both are directories built under a temporary name next to their final place: every file
 * written and fsynced, the directory fsynced, renamed into place, the parent fsynced. A crash
 * therefore leaves the whole directory or none of it. A directory already in place (same
 * checkpoint step, or an earlier export) is renamed aside, the new one renamed in, the parent
 * fsynced, and only then the old one removed. Checkpoint temporaries are named ".tmp-*" inside
 * RUN_DIR/checkpoints/: ddt_checkpoint_latest skips them and the next write removes them.
 * state.json is written and read here only (ddt_checkpoint_meta); its drafter is the export's
 * config.json object, one table of keys (drafter_keys) for the export, the write and the read.
 * An export is read back here too (ddt_export_read: model_config.c's reader of config.json, the
 * tensors by the parameter table), so one file owns the export format both ways.
 * state.json versions 2 and 1 (the first form) are read too: what their drafter did not say
 * comes from its layer_types and, for max_position_embeddings, from the run config's target.
 *
 * Not here: several writers on one run directory (one trainer owns it), what the run config
 * in state.json says (run_config.c's; parsed here only to read the forms before version 3),
 * sharded or compressed exports (a drafter is a few GB at most), removing an export's
 * temporaries left by a crash (they sit next to a directory the user named, so nothing there
 * is deleted by pattern).
 * Tested by tests/test_checkpoint.c, and by tests/export_loaders_check.py (an export read back
 * as Hugging Face's Qwen3Config, SpecForge, vLLM, SGLang and z-lab read it).
 *
 * Legend: P floats in all parameters (the table's total), n entries of the parameter table.
 */
#include "base/errors.h"
#include "checkpoint.h"
#include "base/json_fields.h"
#include "model/model_config.h"
#include "run/run_config.h"
#include "model/safetensors.h"
#include "model/tensor_load.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <ftw.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CKPT_PATH_MAX = 4096, CKPT_NAME_MAX = 96 };
/* state.json is kilobytes (the run config, the drafter's keys); the cap only stops a
 * corrupted file from being read whole. */
#define CKPT_STATE_JSON_MAX (64u << 20)
/* state.json's "version"; the first form had none (and "resolved" for "drafter"), version 2's
 * drafter lacked the keys of drafter_keys marked `since` 3 */
enum { STATE_VERSION = 3 };

static const char *const state_prefix[3] = { "param.", "adam_m.", "adam_v." };
static const char step_tensor[] = "adam_step";
static const char checkpoint_format[] = "ddtree-checkpoint", checkpoint_version[] = "1";

/* ------------------------------------------------------------------------------------------
 * Errors, paths and files
 */

/* out = the formatted path: 0, or -ENAMETOOLONG */
__attribute__((format(printf, 3, 4)))
static int path_join(char *out, size_t len, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(out, len, fmt, args);
    va_end(args);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* path created (it must not exist) with text, fsynced: 0, or -errno with nothing left */
static int write_text_file(const char *path, const char *text, char *err, size_t err_len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return ddt_fail(err, err_len, -errno, "%s: cannot create: %s", path, strerror(errno));
    int rc = ddt_write_all(fd, text, strlen(text));
    const char *failed = rc ? "write" : NULL;
    if (failed)
        close(fd);
    else
        failed = ddt_sync_close(fd, &rc);
    if (failed) {
        unlink(path);
        return ddt_fail(err, err_len, rc, "%s: cannot %s: %s", path, failed, strerror(-rc));
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path) != 0 ? -1 : 0;
}

/* path and everything under it (symbolic links removed, never followed); a missing path is
 * not an error. 0, or -errno. */
static int remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -errno;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 ? -(errno ? errno : EIO) : 0;
}

/* The directory built at tmp becomes final: one already there is renamed to aside, tmp renamed
 * in, parent fsynced, then the old one removed. On failure the old one is back in place and
 * the new one is at tmp again (the caller removes it). */
static int install_dir(const char *tmp, const char *final, const char *aside, const char *parent,
                       char *err, size_t err_len)
{
    struct stat st;
    int replacing = lstat(final, &st) == 0;
    if (!replacing && errno != ENOENT)
        return ddt_fail(err, err_len, -errno, "%s: cannot stat: %s", final, strerror(errno));
    if (replacing && !S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOTDIR, "%s: exists and is not a directory (not replaced)", final);
    if (replacing) {
        int rc = remove_tree(aside);   /* a leftover of a crash with our name */
        if (rc == 0 && rename(final, aside) != 0)
            rc = -errno;
        if (rc != 0)
            return ddt_fail(err, err_len, rc, "%s: cannot move the old one aside to %s: %s", final, aside,
                        strerror(-rc));
    }
    if (rename(tmp, final) != 0) {
        int rc = -errno;
        if (replacing)
            rename(aside, final);
        return ddt_fail(err, err_len, rc, "%s: cannot rename %s into place: %s", final, tmp, strerror(-rc));
    }
    int rc = ddt_fsync_dir(parent);
    if (rc != 0) {   /* the rename may not survive a crash: undo it rather than report a maybe */
        rename(final, tmp);
        if (replacing)
            rename(aside, final);
        return ddt_fail(err, err_len, rc, "%s: fsync of %s failed: %s", final, parent, strerror(-rc));
    }
    if (replacing)
        remove_tree(aside);   /* best effort: a checkpoint's aside is a .tmp-* the next write removes */
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Step directories: "step-" and at least 8 digits
 */

typedef struct step_dir {
    int64_t step;
    char name[CKPT_NAME_MAX];
} step_dir;

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

/* Both files present and state.safetensors opens (every rule of the format holds). */
static int checkpoint_complete(const char *dir)
{
    char path[CKPT_PATH_MAX], why[512];
    struct stat st;
    if (path_join(path, sizeof path, "%s/state.json", dir) || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    ddt_st_file f;
    if (path_join(path, sizeof path, "%s/state.safetensors", dir) || ddt_st_open(path, &f, why, sizeof why))
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
        if (path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name))
            continue;
        int is_written = strcmp(dirs[i].name, written) == 0;
        if (!is_written && !checkpoint_complete(dir))
            continue;
        if (kept < keep || is_written)
            kept++;
        else
            remove_tree(dir);
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
        if (strncmp(e->d_name, ".tmp-", 5) == 0 && !path_join(path, sizeof path, "%s/%s", ckdir, e->d_name))
            remove_tree(path);   /* readdir tolerates entries removed while it runs */
    }
    closedir(d);
}

/* ------------------------------------------------------------------------------------------
 * The drafter in the export's config.json form (SPEC.md section 5): the export's config.json
 * and state.json's "drafter" are this one object, written by drafter_json and read back (from
 * state.json) by drafter_from_json, both walking drafter_keys.
 */

typedef enum {
    KEY_INT, KEY_FLOAT, KEY_TEXT, KEY_TEXTS, KEY_LAYER_TYPES, KEY_DFLASH, KEY_NULL, KEY_FALSE,
    KEY_USE_SLIDING,   /* true when a layer is sliding_attention, else false */
    KEY_WINDOW,        /* sliding_window when a layer is sliding_attention, else null */
} key_kind;

typedef struct drafter_key {
    const char *key;
    key_kind kind;
    size_t offset;       /* KEY_INT: of an int64_t, KEY_FLOAT: of a float, in ddt_drafter_config */
    const char *text;    /* KEY_TEXT: the value; KEY_TEXTS: the list's one entry */
    int since;           /* the state.json version whose drafter has it first (0: all) */
} drafter_key;

#define INT_KEY(name, field) { name, KEY_INT, offsetof(ddt_drafter_config, field), NULL, 0 }
#define FLOAT_KEY(name, field) { name, KEY_FLOAT, offsetof(ddt_drafter_config, field), NULL, 0 }

/* In the order written (num_hidden_layers before layer_types, which it sizes, and layer_types
 * before use_sliding_window and sliding_window, which it decides); integers in [0, 2^53], their
 * ranges ddt_drafter_config_check's. A key added here changes state.json's form: bump
 * STATE_VERSION, mark the key `since` it, and keep reading the one before.
 * The keys of version 3 are what the loaders need beyond SPEC.md section 2's: Hugging Face's
 * Qwen3Config (transformers src/transformers/models/qwen3/configuration_qwen3.py) sets
 * sliding_window to None unless use_sliding_window is true, and then SpecForge
 * (specforge/modeling/draft/dflash.py resolve_dflash_attention_layout), vLLM
 * (vllm/model_executor/models/qwen3_dflash.py _resolve_layer_attention) and SGLang
 * (python/sglang/srt/speculative/dflash_utils.py get_dflash_attention_sliding_window_size)
 * refuse a sliding_attention layer; z-lab's MLX loader (dflash/model_mlx.py load_draft)
 * requires max_position_embeddings, vLLM and SGLang size RoPE by it (32768 when missing);
 * torch_dtype is the transformers 4 name of the weights' dtype, dtype the transformers 5 one. */
static const drafter_key drafter_keys[] = {
    { "architectures", KEY_TEXTS, 0, "DFlashDraftModel", 0 },
    { "model_type", KEY_TEXT, 0, "qwen3", 0 },
    INT_KEY("hidden_size", hidden),
    INT_KEY("num_hidden_layers", layers),
    INT_KEY("num_attention_heads", heads),
    INT_KEY("num_key_value_heads", kv_heads),
    INT_KEY("head_dim", head_dim),
    INT_KEY("intermediate_size", intermediate),
    FLOAT_KEY("rms_norm_eps", rms_norm_eps),
    FLOAT_KEY("rope_theta", rope_theta),
    { "layer_types", KEY_LAYER_TYPES, 0, NULL, 0 },
    { "use_sliding_window", KEY_USE_SLIDING, 0, NULL, 3 },
    { "sliding_window", KEY_WINDOW, offsetof(ddt_drafter_config, sliding_window), NULL, 0 },
    INT_KEY("block_size", block_size),
    INT_KEY("num_target_layers", num_target_layers),
    { "dflash_config", KEY_DFLASH, 0, NULL, 0 },
    { "rope_scaling", KEY_NULL, 0, NULL, 0 },
    { "tie_word_embeddings", KEY_FALSE, 0, NULL, 0 },
    { "attention_bias", KEY_FALSE, 0, NULL, 0 },
    { "hidden_act", KEY_TEXT, 0, "silu", 0 },
    INT_KEY("vocab_size", vocab),
    { "max_position_embeddings", KEY_INT, offsetof(ddt_drafter_config, max_positions), NULL, 3 },
    { "torch_dtype", KEY_TEXT, 0, "bfloat16", 3 },
    { "dtype", KEY_TEXT, 0, "bfloat16", 3 },
};
enum { DRAFTER_KEYS = sizeof drafter_keys / sizeof drafter_keys[0] };
static const char *const dflash_keys[] = { "mask_token_id", "target_layer_ids", NULL };   /* in order */
/* integers a JSON number (a double) holds exactly */
static const int64_t json_int_max = (int64_t)1 << 53;

static int any_sliding(const ddt_drafter_config *c)
{
    int any = 0;
    for (int64_t i = 0; i < c->layers && i < DDT_MAX_LAYERS; i++)
        any |= c->sliding[i];
    return any;
}

/* The shortest decimal that reads back as x, as the double a JSON reader gets from it (cJSON
 * prints that double with those digits): rms_norm_eps 1e-6f is written 1e-06, not
 * 9.9999999747524271e-07, and (float) of what is read back is x again. */
static double float_for_json(float x)
{
    char text[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)x);
        double back = strtod(text, NULL);
        if ((float)back == x)
            return back;
    }
    return (double)x;   /* not reached: 9 significant digits always identify a float */
}

/* the value of key k for c: NULL when out of memory */
static cJSON *drafter_value(const ddt_drafter_config *c, const drafter_key *k)
{
    const char *field = (const char *)c + k->offset;
    cJSON *v = NULL;
    int ok = 1;
    switch (k->kind) {
    case KEY_INT:
        return cJSON_CreateNumber((double)*(const int64_t *)field);
    case KEY_FLOAT:
        return cJSON_CreateNumber(float_for_json(*(const float *)field));
    case KEY_TEXT:
        return cJSON_CreateString(k->text);
    case KEY_TEXTS:
        return cJSON_CreateStringArray(&k->text, 1);
    case KEY_NULL:
        return cJSON_CreateNull();
    case KEY_FALSE:
        return cJSON_CreateFalse();
    case KEY_USE_SLIDING:
        return cJSON_CreateBool(any_sliding(c));
    case KEY_WINDOW:
        return any_sliding(c) ? cJSON_CreateNumber((double)*(const int64_t *)field) : cJSON_CreateNull();
    case KEY_LAYER_TYPES:
        ok = (v = cJSON_CreateArray()) != NULL;
        for (int64_t i = 0; ok && i < c->layers; i++)
            ok = cJSON_AddItemToArray(v, cJSON_CreateString(c->sliding[i] ? "sliding_attention" : "full_attention"));
        break;
    case KEY_DFLASH:
        ok = (v = cJSON_CreateObject()) != NULL && cJSON_AddNumberToObject(v, dflash_keys[0], (double)c->mask_token_id);
        ok = ok && cJSON_AddItemToObject(v, dflash_keys[1], cJSON_CreateIntArray(c->target_layer_ids, (int)c->taps));
        break;
    }
    if (!ok) {
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

/* c as the export's config.json object: NULL when out of memory */
static cJSON *drafter_json(const ddt_drafter_config *c)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < DRAFTER_KEYS; i++) {
        cJSON *v = drafter_value(c, &drafter_keys[i]);
        if (!v || !cJSON_AddItemToObject(o, drafter_keys[i].key, v)) {
            cJSON_Delete(v);
            cJSON_Delete(o);
            o = NULL;
        }
    }
    return o;
}

/* o printed, with the final newline a text file ends with: malloc'd, NULL when out of memory.
 * o is deleted. */
static char *json_text(cJSON *o)
{
    char *printed = o ? cJSON_Print(o) : NULL;
    cJSON_Delete(o);
    if (!printed)
        return NULL;
    size_t len = strlen(printed);
    char *text = malloc(len + 2);
    if (text) {
        memcpy(text, printed, len);
        memcpy(text + len, "\n", 2);
    }
    cJSON_free(printed);
    return text;
}

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

/* obj's mask_token_id and target_layer_ids (dflash_config, or the first form's "resolved") */
static int read_dflash(const ddt_json_ctx *j, const cJSON *obj, ddt_drafter_config *d)
{
    int64_t mask = 0;
    int rc = ddt_json_int(j, obj, dflash_keys[0], 0, INT32_MAX, 0, 0, &mask);
    d->mask_token_id = (int32_t)mask;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(obj, dflash_keys[1]);
    int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
    if (!rc && !ids)
        rc = ddt_json_fail(j, dflash_keys[1], "is missing");
    else if (!rc && (n < 1 || n > DDT_MAX_TAPS))
        rc = ddt_json_fail(j, dflash_keys[1], "must be a list of 1 to 64 layer ids");
    d->taps = n;
    for (int i = 0; !rc && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(ids, i);
        double x = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
        if (x != floor(x) || x < 0 || x > INT32_MAX)
            rc = ddt_json_fail(j, dflash_keys[1], "entries must be integers in [0, 2^31)");
        else
            d->target_layer_ids[i] = (int32_t)x;
    }
    return rc;
}

/* o's key k into d: present, of its type, a fixed one with its value */
static int read_drafter_key(const ddt_json_ctx *j, const cJSON *o, const drafter_key *k, ddt_drafter_config *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k->key);
    char *field = (char *)d + k->offset, what[96];
    double x;
    if (!v)
        return ddt_json_fail(j, k->key, "is missing");
    switch (k->kind) {
    case KEY_INT:
        return ddt_json_int(j, o, k->key, 0, json_int_max, 0, 0, (int64_t *)field);
    case KEY_FLOAT: {
        int rc = ddt_json_number(j, o, k->key, 0.0, 1, FLT_MAX, 0, 0, &x);
        *(float *)field = (float)x;
        return rc;
    }
    case KEY_TEXT:
        snprintf(what, sizeof what, "must be \"%s\"", k->text);
        return cJSON_IsString(v) && !strcmp(v->valuestring, k->text) ? 0 : ddt_json_fail(j, k->key, what);
    case KEY_TEXTS:
        snprintf(what, sizeof what, "must be [\"%s\"]", k->text);
        return cJSON_IsArray(v) && cJSON_GetArraySize(v) == 1 && cJSON_IsString(cJSON_GetArrayItem(v, 0)) &&
                       !strcmp(cJSON_GetArrayItem(v, 0)->valuestring, k->text)
                   ? 0
                   : ddt_json_fail(j, k->key, what);
    case KEY_NULL:
        return cJSON_IsNull(v) ? 0 : ddt_json_fail(j, k->key, "must be null");
    case KEY_FALSE:
        return cJSON_IsFalse(v) ? 0 : ddt_json_fail(j, k->key, "must be false");
    case KEY_USE_SLIDING:
        if (!cJSON_IsBool(v) || cJSON_IsTrue(v) != any_sliding(d))
            return ddt_json_fail(j, k->key, "must be true when a layer is sliding_attention, false otherwise");
        return 0;
    case KEY_WINDOW:   /* null only without a sliding layer; version 2 wrote a number always */
        if (cJSON_IsNull(v) && !any_sliding(d))
            return 0;
        return cJSON_IsNull(v) ? ddt_json_fail(j, k->key, "must be a number with a sliding_attention layer")
                               : ddt_json_int(j, o, k->key, 0, json_int_max, 0, 0, (int64_t *)field);
    case KEY_LAYER_TYPES:
        if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != d->layers)
            return ddt_json_fail(j, k->key, "must be a list of num_hidden_layers strings");
        for (int i = 0; i < d->layers; i++) {
            const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
            d->sliding[i] = t && !strcmp(t, "sliding_attention");
            if (!d->sliding[i] && (!t || strcmp(t, "full_attention")))
                return ddt_json_fail(j, k->key, "entries must be \"full_attention\" or \"sliding_attention\"");
        }
        return 0;
    case KEY_DFLASH: {
        char where[CKPT_PATH_MAX];
        snprintf(where, sizeof where, "%s.%s", j->path, k->key);
        ddt_json_ctx inner = { where, j->err, j->err_len };
        if (!cJSON_IsObject(v))
            return ddt_json_fail(j, k->key, "must be an object");
        int rc = ddt_json_only(&inner, v, dflash_keys);
        return rc ? rc : read_dflash(&inner, v, d);
    }
    }
    return ddt_json_fail(j, k->key, "has a kind this reader does not know");   /* not reached */
}

static const drafter_key *find_drafter_key(const char *key)
{
    for (int i = 0; i < DRAFTER_KEYS; i++)
        if (!strcmp(drafter_keys[i].key, key))
            return &drafter_keys[i];
    return NULL;
}

/* What an export needs of c: ddt_drafter_config_check's rules and a max_positions resolved.
 * 0, or -EINVAL with why. */
static int export_check(const ddt_drafter_config *c, char *why, size_t why_len)
{
    int rc = ddt_drafter_config_check(c, why, why_len);
    if (!rc && (c->max_positions < 1 || c->max_positions > json_int_max))
        rc = ddt_fail(why, why_len, -EINVAL, "max_position_embeddings must be in [1, 2^53] (got %lld: the target's, "
                      "set when the run config is resolved)", (long long)c->max_positions);
    return rc;
}

/* d checked as a whole (export_check): 0, or -EINVAL with err = "WHERE: why" */
static int check_drafter(const ddt_json_ctx *j, const ddt_drafter_config *d)
{
    char why[512];
    if (export_check(d, why, sizeof why))
        return ddt_fail(j->err, j->err_len, -EINVAL, "%s: %s", j->path, why);
    return 0;
}

/* The export's config.json object o, as state.json `version` holds it, into *c: every key of
 * drafter_keys of that version present with its type (the fixed ones with their value), no
 * other, and the whole passing export_check. A key newer than the version may be absent: then
 * max_position_embeddings is max_positions, the others follow from layer_types. j->path says
 * where o is. 0, or -EINVAL with err = "WHERE: key what"; *c untouched then. */
static int drafter_from_json(const ddt_json_ctx *j, const cJSON *o, int64_t version, int64_t max_positions,
                             ddt_drafter_config *c)
{
    ddt_drafter_config d;
    memset(&d, 0, sizeof d);
    d.max_positions = max_positions;
    int rc = 0;
    for (const cJSON *item = o->child; !rc && item; item = item->next)
        if (!find_drafter_key(item->string))
            rc = ddt_json_fail(j, item->string, "is not a key of the export's config.json");
    for (int i = 0; !rc && i < DRAFTER_KEYS; i++)
        if (drafter_keys[i].since <= version || cJSON_GetObjectItemCaseSensitive(o, drafter_keys[i].key))
            rc = read_drafter_key(j, o, &drafter_keys[i], &d);
    if (!rc && !(rc = check_drafter(j, &d)))
        *c = d;
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * state.json: a ddt_checkpoint_meta (docs/formats.md). Every key checked at read; the first
 * form (no "version") is read too: its drafter is the run config's, completed by "resolved".
 */

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
                                          "config", "drafter", NULL };
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
    cJSON *o = drafter_json(&m->drafter);
    int rc = o ? drafter_from_json(&(ddt_json_ctx){ "checkpoint: drafter", err, err_len }, o, STATE_VERSION, 0, &back)
               : ddt_fail(err, err_len, -ENOMEM, "checkpoint: out of memory");
    cJSON_Delete(o);
    return rc;
}

/* state.json's text for m: malloc'd, NULL when out of memory */
static char *meta_text(const ddt_checkpoint_meta *m)
{
    cJSON *o = cJSON_CreateObject();
    int ok = o && cJSON_AddNumberToObject(o, "version", STATE_VERSION) && cJSON_AddStringToObject(o, "run_id", m->run_id);
    for (int i = 0; ok && i < META_INTS; i++)
        ok = cJSON_AddNumberToObject(o, meta_ints[i].key, (double)*meta_int(m, i)) != NULL;
    ok = ok && cJSON_AddStringToObject(o, "config", m->config_json);
    cJSON *drafter = ok ? drafter_json(&m->drafter) : NULL;
    if (!drafter || !cJSON_AddItemToObject(o, "drafter", drafter)) {
        cJSON_Delete(drafter);
        cJSON_Delete(o);
        return NULL;
    }
    return json_text(o);
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
        rc = read_drafter_key(&r, resolved, find_drafter_key(resolved_keys[i]), d);
    if (!rc)
        rc = read_dflash(&r, resolved, d);
    return rc ? rc : check_drafter(&r, d);
}

int ddt_checkpoint_read_meta(const char *ckpt_dir, ddt_checkpoint_meta *meta, char *err, size_t err_len)
{
    if (!ckpt_dir || !meta)
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    char path[CKPT_PATH_MAX], where[CKPT_PATH_MAX + 16];
    if (path_join(path, sizeof path, "%s/state.json", ckpt_dir))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
    cJSON *root = ddt_json_parse_file(path, CKPT_STATE_JSON_MAX, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    ddt_checkpoint_meta m;
    memset(&m, 0, sizeof m);
    int64_t version = 1;   /* the first form had no "version" */
    int rc = 0;
    if (cJSON_GetObjectItemCaseSensitive(root, "version") &&
        ddt_json_int(&j, root, "version", 2, STATE_VERSION, 0, 0, &version))
        rc = ddt_json_fail(&j, "version", "must be 2 or 3 (this build reads those and the first form, without one)");
    if (!rc)
        rc = ddt_json_only(&j, root, version == 1 ? first_state_keys : state_keys);
    const char *run_id = NULL, *config = NULL;
    if (!rc && !(rc = text_key(&j, root, "run_id", &run_id)) && strlen(run_id) >= sizeof m.run_id)
        rc = ddt_json_fail(&j, "run_id", "must be shorter than 40 characters");
    for (int i = 0; !rc && i < META_INTS; i++)
        rc = ddt_json_int(&j, root, meta_ints[i].key, meta_ints[i].lo, json_int_max, 0, 0, meta_int(&m, i));
    if (!rc)
        rc = text_key(&j, root, "config", &config);
    const cJSON *drafter = NULL;
    int64_t max_positions = 0;   /* version 2's drafter does not say it */
    if (!rc && version == 1)
        rc = first_form_drafter(&j, root, config, &m.drafter);
    else if (!rc && !(rc = object_key(&j, root, "drafter", &drafter)) &&
             !(rc = version < STATE_VERSION ? config_max_positions(&j, config, &max_positions) : 0)) {
        snprintf(where, sizeof where, "%s: drafter", path);
        rc = drafter_from_json(&(ddt_json_ctx){ where, err, err_len }, drafter, version, max_positions, &m.drafter);
    }
    if (!rc && !(m.config_json = strdup(config)))
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory", path);
    if (!rc) {
        snprintf(m.run_id, sizeof m.run_id, "%s", run_id);
        *meta = m;
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * state.safetensors
 */

/* The table of c (malloc'd, DDT_MAX_PARAMS rows): its count, or -1 when out of memory */
static int param_table(const ddt_drafter_config *c, ddt_param **table, int64_t *total)
{
    *table = malloc(DDT_MAX_PARAMS * sizeof **table);
    return *table ? ddt_drafter_param_table(c, *table, total) : -1;
}

static int write_state(const char *tmp, const ddt_drafter_config *c, const float *params,
                       const ddt_adamw_state *adam, const char *state_text, char *err, size_t err_len)
{
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
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
            e->data = family[k] + table[i].offset;
        }
    entries[3 * n] = (ddt_st_entry){ .name = step_tensor, .dtype = DDT_I64, .ndim = 0, .data = &adam->step };
    const char *const keys[] = { "format", "version" };
    const char *const values[] = { checkpoint_format, checkpoint_version };
    char path[CKPT_PATH_MAX];
    rc = path_join(path, sizeof path, "%s/state.safetensors", tmp);
    if (rc == 0)
        rc = ddt_st_write(path, entries, 3 * n + 1, keys, values, 2, err, err_len);
    if (rc == 0 && !(rc = path_join(path, sizeof path, "%s/state.json", tmp)))
        rc = write_text_file(path, state_text, err, err_len);
    if (rc == -ENAMETOOLONG)
        ddt_fail(err, err_len, rc, "%s: path too long", tmp);
done:
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
    const ddt_drafter_config *c = &meta->drafter;
    const int64_t step = meta->step;
    struct stat st;
    if (stat(run_dir, &st) != 0)
        return ddt_fail(err, err_len, -errno, "%s: run directory: %s", run_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOTDIR, "%s: run directory is not a directory", run_dir);

    char ckdir[CKPT_PATH_MAX], final[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], aside[CKPT_PATH_MAX],
        longest[CKPT_PATH_MAX];
    long pid = (long)getpid();
    if (path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir) ||
        path_join(final, sizeof final, "%s/step-%08lld", ckdir, (long long)step) ||
        path_join(tmp, sizeof tmp, "%s/.tmp-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        path_join(aside, sizeof aside, "%s/.tmp-replaced-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        path_join(longest, sizeof longest, "%s/state.safetensors.tmp", tmp))
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

    char *state_text = meta_text(meta);
    if (!state_text)
        return ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for state.json", final);
    rc = mkdir(tmp, 0755) != 0 ? ddt_fail(err, err_len, -errno, "%s: cannot create: %s", tmp, strerror(errno)) : 0;
    if (rc != 0) {
        free(state_text);
        return rc;
    }
    rc = write_state(tmp, c, params, adam, state_text, err, err_len);
    free(state_text);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        ddt_fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = install_dir(tmp, final, aside, ckdir, err, err_len);
    if (rc != 0) {
        remove_tree(tmp);
        return rc;
    }

    int64_t bytes = 0;
    static const char *const files[] = { "state.safetensors", "state.json" };
    for (int i = 0; i < 2; i++) {
        char path[CKPT_PATH_MAX];
        if (!path_join(path, sizeof path, "%s/%s", final, files[i]) && stat(path, &st) == 0)
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
    if (path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir))
        return -ENAMETOOLONG;
    step_dir *dirs;
    int count, rc = list_steps(ckdir, &dirs, &count);
    if (rc != 0)
        return rc;   /* -ENOENT when there is no checkpoints/ yet */
    rc = -ENOENT;
    for (int i = 0; i < count && rc == -ENOENT; i++) {
        char dir[CKPT_PATH_MAX];
        if (path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name) || !checkpoint_complete(dir))
            continue;
        if (path && path_join(path, path_len, "%s", dir)) {
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
            if (t->ndim != table[i].ndim || t->shape[0] != table[i].shape[0] ||
                (t->ndim == 2 && t->shape[1] != table[i].shape[1])) {
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

int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, ddt_checkpoint_meta *meta, char *err, size_t err_len)
{
    if (!ckpt_dir || !c || !params || (adam && (!adam->m || !adam->v)))
        return ddt_fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    char why[512], path[CKPT_PATH_MAX];
    if (ddt_drafter_config_check(c, why, sizeof why))
        return ddt_fail(err, err_len, -EINVAL, "%s: the drafter configuration: %s", ckpt_dir, why);
    if (path_join(path, sizeof path, "%s/state.safetensors", ckpt_dir))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc != 0)
        return rc;
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
    ddt_checkpoint_meta read_meta;
    if (n < 0)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory", path);
    if (rc == 0)
        rc = check_state(&f, table, n, err, err_len);
    if (rc == 0 && meta)   /* before any output is written: a failure leaves them as they were */
        rc = ddt_checkpoint_read_meta(ckpt_dir, &read_meta, err, err_len);
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
    }
    free(table);
    ddt_st_close(&f);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The serving export
 */

/* config.json and model.safetensors (BF16, the table's names, format pt) into dir */
static int write_export_files(const char *dir, const ddt_drafter_config *c, const float *params,
                              char *err, size_t err_len)
{
    char path[CKPT_PATH_MAX];
    char *config = json_text(drafter_json(c));
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
    uint16_t *weights = n >= 0 ? malloc((size_t)total * sizeof *weights) : NULL;   /* (P) BF16 */
    ddt_st_entry *entries = n >= 0 ? calloc((size_t)n, sizeof *entries) : NULL;
    int rc = 0;
    if (!config || !weights || !entries)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the export", dir);
    if (rc == 0 && !(rc = path_join(path, sizeof path, "%s/config.json", dir)))
        rc = write_text_file(path, config, err, err_len);
    if (rc == 0) {
        for (int64_t j = 0; j < total; j++)
            weights[j] = ddt_f32_to_bf16(params[j]);
        for (int i = 0; i < n; i++)
            entries[i] = (ddt_st_entry){ .name = table[i].name, .dtype = DDT_BF16, .ndim = table[i].ndim,
                                         .shape = { table[i].shape[0], table[i].shape[1] },
                                         .data = weights + table[i].offset };
        const char *const key[] = { "format" }, *const value[] = { "pt" };
        if (!(rc = path_join(path, sizeof path, "%s/model.safetensors", dir)))
            rc = ddt_st_write(path, entries, n, key, value, 1, err, err_len);
    }
    if (rc == -ENAMETOOLONG)
        ddt_fail(err, err_len, rc, "%s: path too long", dir);
    free(entries);
    free(weights);
    free(table);
    free(config);
    return rc;
}

int ddt_export_write(const char *out_dir, const ddt_drafter_config *c, const float *params,
                     char *err, size_t err_len)
{
    if (!out_dir || !out_dir[0] || !c || !params)
        return ddt_fail(err, err_len, -EINVAL, "export: a required argument is NULL or empty");
    char why[512];
    if (export_check(c, why, sizeof why))
        return ddt_fail(err, err_len, -EINVAL, "%s: the drafter configuration: %s", out_dir, why);
    char out[CKPT_PATH_MAX], parent[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], aside[CKPT_PATH_MAX],
        longest[CKPT_PATH_MAX];
    long pid = (long)getpid();
    int too_long = path_join(out, sizeof out, "%s", out_dir);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')   /* "dir/" names dir: its siblings are "dir.tmp-*" */
        out[--len] = '\0';
    if (too_long || path_join(tmp, sizeof tmp, "%s.tmp-%ld", out, pid) ||
        path_join(aside, sizeof aside, "%s.old-%ld", out, pid) ||
        path_join(longest, sizeof longest, "%s/model.safetensors.tmp", tmp))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long for an export", out_dir);
    const char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        snprintf(parent, sizeof parent, "%.*s", slash == out ? 1 : (int)(slash - out), out);
    struct stat st;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOENT, "%s: the directory it goes in (%s) does not exist", out_dir, parent);

    int rc = remove_tree(tmp);   /* a leftover of a crash with our name */
    if (rc == 0 && mkdir(tmp, 0755) != 0)
        rc = -errno;
    if (rc != 0)
        return ddt_fail(err, err_len, rc, "%s: cannot create: %s", tmp, strerror(-rc));
    rc = write_export_files(tmp, c, params, err, err_len);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        ddt_fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = install_dir(tmp, out, aside, parent, err, err_len);
    if (rc != 0)
        remove_tree(tmp);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * An export read back: config.json by model_config.c's reader, the tensors by the table
 */

/* f's tensors into params (P): every one of the table's present and as its row says, none
 * beside them */
static int export_tensors(const ddt_st_file *f, const char *path, const ddt_param *table, int n, float *params,
                          char *err, size_t err_len)
{
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const ddt_param *p = &table[i];
        int64_t dims[2] = { p->shape[0], p->shape[1] };
        const ddt_tensor_want want = { p->name, DDT_F32, p->ndim, dims };
        const ddt_st_tensor *t = ddt_st_find(f, p->name);
        if (!t)
            rc = ddt_fail(err, err_len, -EINVAL, "%.900s: tensor '%s' is missing", path, p->name);
        else if (!(rc = ddt_tensor_check(t, path, &want, err, err_len)))
            ddt_st_to_f32(t, params + p->offset);
    }
    for (int i = 0; i < f->count && rc == 0; i++) {
        int known = 0;
        for (int k = 0; k < n && !known; k++)
            known = !strcmp(f->tensors[i].name, table[k].name);
        if (!known)
            rc = ddt_fail(err, err_len, -EINVAL,
                          "%.900s: tensor '%s' is not a parameter of this drafter (config.json)", path,
                          f->tensors[i].name);
    }
    return rc;
}

int ddt_export_read(const char *dir, ddt_drafter_config *c, float **params, char *err, size_t err_len)
{
    if (!dir || !c || !params)
        return ddt_fail(err, err_len, -EINVAL, "export read: a required argument is NULL");
    *params = NULL;
    int rc = ddt_drafter_config_load(dir, c, err, err_len);
    if (rc != 0)
        return rc;
    char path[CKPT_PATH_MAX];
    if (path_join(path, sizeof path, "%s/model.safetensors", dir))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long for an export", dir);
    ddt_param *table;
    int64_t total;
    const int n = param_table(c, &table, &total);
    void *base = NULL;   /* (P) */
    if (n < 0 || posix_memalign(&base, 64, (size_t)total * sizeof(float) + 1) != 0) {
        free(table);
        return ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for %lld drafter parameters", dir,
                        n < 0 ? 0LL : (long long)total);
    }
    ddt_st_file f;
    if ((rc = ddt_st_open(path, &f, err, err_len)) == 0) {
        rc = export_tensors(&f, path, table, n, base, err, err_len);
        ddt_st_close(&f);
    }
    free(table);
    if (rc != 0)
        free(base);
    else
        *params = base;
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The export of a kept checkpoint: its state.json says the drafter, its tensors the weights
 */

int ddt_checkpoint_find(const char *run_dir, int64_t step, char *path, size_t path_len)
{
    if (path_join(path, path_len, "%s/checkpoints/step-%08lld", run_dir, (long long)step))
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
    float *params = param_table(&meta.drafter, &table, &total) >= 0 ? malloc((size_t)total * sizeof *params)
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
