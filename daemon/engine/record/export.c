/* export.c: the serving export (SPEC.md section 5; see export.h) of a DFlash or DFlash2 drafter:
 * config.json, model.safetensors and the manifest of both (ddtree-manifest.json: each file's size and
 * xxHash64, taken as it is written), written and read back, every file checked against the
 * manifest before it is read, so one file owns the export format both ways.
 *
 * An export is a directory built under a temporary name next to its final place: every file
 * written and fsynced, the directory fsynced, renamed into place, the parent fsynced. A crash
 * therefore leaves the whole directory or none of it. A directory already in place (an earlier
 * export, or for a checkpoint the same step) is renamed aside, the new one renamed in, the
 * parent fsynced, and only then the old one removed: checkpoint.c builds its checkpoints with
 * these functions too (export_impl.h). The drafter's config.json object is one table of keys
 * (drafter_keys) for the export and for state.json's "drafter", which checkpoint.c writes and
 * reads back through ddt_drafter_json and ddt_drafter_from_json. An export is read back here
 * too (ddt_export_read: model_config.c's reader of config.json, the tensors by the parameter
 * table).
 *
 * Not here: checkpoints and the export of a kept one (checkpoint.c), sharded or compressed
 * exports (a drafter is a few GB at most), removing an export's temporaries left by a crash
 * (they sit next to a directory the user named, so nothing there is deleted by pattern).
 * Tested by tests/engine/record/test_checkpoint.c, by tests/daemon/export_loaders_check.py (an export read back
 * as Hugging Face's Qwen3Config, SpecForge, vLLM, SGLang, z-lab and, a DFlash2 one, speculators read it) and
 * through the tools by tests/daemon/dflash2_cli_test.sh.
 *
 * Legend: P floats in all parameters (the table's total), n entries of the parameter table.
 */
#include "base/checksum.h"
#include "base/errors.h"
#include "base/fault.h"
#include "export.h"
#include "export_impl.h"
#include "base/json_fields.h"
#include "base/log.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/tensor_load.h"

#include <cjson/cJSON.h>

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

/* ------------------------------------------------------------------------------------------
 * Errors, paths and files (checkpoint.c's too)
 */

/* out = the formatted path: 0, or -ENAMETOOLONG */
__attribute__((format(printf, 3, 4)))
int ddt_path_join(char *out, size_t len, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(out, len, fmt, args);
    va_end(args);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* path created (it must not exist) with text, fsynced: 0, or -errno with nothing left */
int ddt_write_text_file(const char *path, const char *text, char *err, size_t err_len)
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

/* 0 when path is a directory (followed through links), else -errno (-ENOTDIR) */
int ddt_directory(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return -errno;
    return S_ISDIR(st.st_mode) ? 0 : -ENOTDIR;
}

/* path and everything under it (symbolic links removed, never followed); a missing path is
 * not an error. 0, or -errno. */
int ddt_remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -errno;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 ? -(errno ? errno : EIO) : 0;
}

/* The directory built at tmp becomes final: one already there is renamed to aside, tmp renamed
 * in, parent fsynced, then the old one removed. On failure the old one is back in place and
 * the new one is at tmp again (the caller removes it). */
int ddt_install_dir(const char *tmp, const char *final, const char *aside, const char *parent,
                    char *err, size_t err_len)
{
    struct stat st;
    int replacing = lstat(final, &st) == 0;
    if (!replacing && errno != ENOENT)
        return ddt_fail(err, err_len, -errno, "%s: cannot stat: %s", final, strerror(errno));
    if (replacing && !S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOTDIR, "%s: exists and is not a directory (not replaced)", final);
    if (replacing) {
        int rc = ddt_remove_tree(aside);   /* a leftover of a crash with our name */
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
    ddt_fault_point("dir.renamed");   /* a test hook (base/fault.h) */
    int rc = ddt_fsync_dir(parent);
    if (rc != 0) {   /* the rename may not survive a crash: undo it rather than report a maybe */
        rename(final, tmp);
        if (replacing)
            rename(aside, final);
        return ddt_fail(err, err_len, rc, "%s: fsync of %s failed: %s", final, parent, strerror(-rc));
    }
    if (replacing)
        ddt_remove_tree(aside);   /* best effort: a checkpoint's aside is a .tmp-* the next write removes */
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The drafter in the export's config.json form (SPEC.md section 5): the export's config.json
 * and state.json's "drafter" are this one object, written by ddt_drafter_json and read back
 * (from state.json) by ddt_drafter_from_json, both walking drafter_keys.
 */

typedef enum {
    KEY_INT, KEY_FLOAT, KEY_TEXT, KEY_LAYER_TYPES, KEY_DFLASH, KEY_NULL, KEY_FALSE,
    KEY_ARCH,          /* [ddt_drafter_architectures[dflash2]]: the drafter's architecture */
    KEY_USE_SLIDING,   /* true when a layer is sliding_attention, else false */
    KEY_WINDOW,        /* sliding_window when a layer is sliding_attention, else null */
    KEY_CAUSAL,        /* DFlash2's alone: false (its blocks are bidirectional in every layer) */
} key_kind;

typedef struct drafter_key {
    const char *key;
    key_kind kind;
    size_t offset;       /* KEY_INT: of an int64_t, KEY_FLOAT: of a float, in ddt_drafter_config */
    const char *text;    /* KEY_TEXT: the value */
    int since;           /* the state.json version whose drafter has it first (0: all) */
} drafter_key;

#define INT_KEY(name, field) { name, KEY_INT, offsetof(ddt_drafter_config, field), NULL, 0 }
#define FLOAT_KEY(name, field) { name, KEY_FLOAT, offsetof(ddt_drafter_config, field), NULL, 0 }

/* In the order written (architectures first, which decides DFlash2's keys; num_hidden_layers
 * before layer_types, which it sizes, and layer_types before use_sliding_window, sliding_window
 * and is_causal, which it decides; block_size before dflash_config, which repeats it for
 * DFlash2); integers in [0, 2^53], their ranges ddt_drafter_config_check's. A key added here
 * changes state.json's form: bump checkpoint.c's STATE_VERSION, mark the key `since` it, and
 * keep reading the one before (DFlash2's keys change no DFlash drafter's form, and a build
 * before them refuses a DFlash2 drafter by its architectures, as it should: it cannot run one).
 * The keys of version 3 are what the loaders need beyond SPEC.md section 2's: Hugging Face's
 * Qwen3Config (transformers src/transformers/models/qwen3/configuration_qwen3.py) sets
 * sliding_window to None unless use_sliding_window is true, and then SpecForge
 * (specforge/modeling/draft/dflash.py resolve_dflash_attention_layout), vLLM
 * (vllm/model_executor/models/qwen3_dflash.py _resolve_layer_attention) and SGLang
 * (python/sglang/srt/speculative/dflash_utils.py get_dflash_attention_sliding_window_size)
 * refuse a sliding_attention layer; z-lab's MLX loader (dflash/model_mlx.py load_draft)
 * requires max_position_embeddings, vLLM and SGLang size RoPE by it (32768 when missing);
 * torch_dtype is the transformers 4 name of the weights' dtype, dtype the transformers 5 one.
 * A DFlash2 drafter's (SPEC.md 2.1, docs/formats.md; each loader's rule restated in
 * tests/daemon/export_loaders_check.py): architectures ["DFlash2DraftModel"], which vLLM (PR
 * #52816: model_executor/models/registry.py, v1/worker/gpu/spec_decode/__init__.py), SGLang
 * (srt/models/dflash.py EntryClass) and z-lab (dflash/model.py) dispatch on; is_causal false,
 * without which vLLM (qwen3_dflash.py _dflash_layer_causal), SGLang (_get_dflash_attention_type)
 * and z-lab (Qwen3DFlashAttention) make the sliding_attention layers causal; and dflash_config's
 * conv_kernel_size, conv_group_size, selector_rank, selector_top_k (model_config.h's
 * ddt_dflash2_keys: vLLM's qwen3_dflash2.py and SpecForge's dflash2.py require each) and
 * block_size (SpecForge reads the top-level one, speculators' vLLM plugin dflash_config's). */
static const drafter_key drafter_keys[] = {
    { "architectures", KEY_ARCH, 0, NULL, 0 },
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
    { "is_causal", KEY_CAUSAL, 0, NULL, 0 },
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
/* then, a DFlash2 drafter's: block_size and model_config.h's ddt_dflash2_keys */
enum { DFLASH2_KEYS = 3 + DDT_DFLASH2_KEYS };

/* whether c's config.json has key k (is_causal: DFlash2's alone) */
static int key_applies(const ddt_drafter_config *c, const drafter_key *k)
{
    return k->kind != KEY_CAUSAL || c->dflash2;
}

/* a DFlash2 drafter's dflash_config keys, NULL-terminated, into keys (DFLASH2_KEYS + 1) */
static void dflash2_key_list(const char **keys)
{
    keys[0] = dflash_keys[0];
    keys[1] = dflash_keys[1];
    keys[2] = "block_size";
    for (int i = 0; i < DDT_DFLASH2_KEYS; i++)
        keys[3 + i] = ddt_dflash2_keys[i].key;
    keys[DFLASH2_KEYS] = NULL;
}

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
    case KEY_ARCH:
        return cJSON_CreateStringArray(&ddt_drafter_architectures[c->dflash2], 1);
    case KEY_CAUSAL:
        return cJSON_CreateFalse();
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
        ok = ok && (!c->dflash2 || cJSON_AddNumberToObject(v, "block_size", (double)c->block_size));
        for (int i = 0; ok && c->dflash2 && i < DDT_DFLASH2_KEYS; i++) {
            const int64_t *size = (const int64_t *)((const char *)c + ddt_dflash2_keys[i].offset);
            ok = cJSON_AddNumberToObject(v, ddt_dflash2_keys[i].key, (double)*size) != NULL;
        }
        break;
    }
    if (!ok) {
        cJSON_Delete(v);
        v = NULL;
    }
    return v;
}

/* c as the export's config.json object: NULL when out of memory */
cJSON *ddt_drafter_json(const ddt_drafter_config *c)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; o && i < DRAFTER_KEYS; i++) {
        if (!key_applies(c, &drafter_keys[i]))
            continue;
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
char *ddt_json_text(cJSON *o)
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

/* obj's mask_token_id and target_layer_ids (dflash_config, or the first form's "resolved") */
int ddt_read_dflash(const ddt_json_ctx *j, const cJSON *obj, ddt_drafter_config *d)
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

/* a DFlash2 drafter's dflash_config (obj; its mask_token_id and target_layer_ids read): its
 * block_size, d's, and its sizes */
static int read_dflash2_sizes(const ddt_json_ctx *j, const cJSON *obj, ddt_drafter_config *d)
{
    int64_t block = 0;
    int rc = ddt_json_int(j, obj, "block_size", 0, json_int_max, 0, 0, &block);
    if (!rc && block != d->block_size)
        rc = ddt_json_fail(j, "block_size", "must be the top-level block_size");
    for (int i = 0; !rc && i < DDT_DFLASH2_KEYS; i++)
        rc = ddt_json_int(j, obj, ddt_dflash2_keys[i].key, 0, json_int_max, 0, 0,
                          (int64_t *)((char *)d + ddt_dflash2_keys[i].offset));
    return rc;
}

/* o's key k into d: present (a key of DFlash2's alone: present exactly for DFlash2), of its type,
 * a fixed one with its value; architectures read first */
int ddt_read_drafter_key(const ddt_json_ctx *j, const cJSON *o, const drafter_key *k, ddt_drafter_config *d)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k->key);
    char *field = (char *)d + k->offset, what[160];
    double x;
    if (v && !key_applies(d, k))
        return ddt_json_fail(j, k->key, "is a DFlash2DraftModel's key (architectures says DFlashDraftModel)");
    if (!v && !key_applies(d, k))
        return 0;
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
    case KEY_ARCH:
        if ((d->dflash2 = ddt_drafter_architecture_of(v)) >= 0)
            return 0;
        snprintf(what, sizeof what, "must be [\"%s\"] or [\"%s\"], the drafters ddtree implements",
                 ddt_drafter_architectures[0], ddt_drafter_architectures[1]);
        return ddt_json_fail(j, k->key, what);
    case KEY_CAUSAL:
        return cJSON_IsFalse(v) ? 0 : ddt_json_fail(j, k->key, "must be false (a DFlash2 drafter's blocks are "
                                                               "bidirectional in every layer: SPEC.md 2.1)");
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
        const char *dflash2[DFLASH2_KEYS + 1];
        dflash2_key_list(dflash2);
        if (!cJSON_IsObject(v))
            return ddt_json_fail(j, k->key, "must be an object");
        int rc = ddt_json_only(&inner, v, d->dflash2 ? dflash2 : dflash_keys);
        if (!rc)
            rc = ddt_read_dflash(&inner, v, d);
        return rc || !d->dflash2 ? rc : read_dflash2_sizes(&inner, v, d);
    }
    }
    return ddt_json_fail(j, k->key, "has a kind this reader does not know");   /* not reached */
}

const drafter_key *ddt_find_drafter_key(const char *key)
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
int ddt_check_drafter(const ddt_json_ctx *j, const ddt_drafter_config *d)
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
int ddt_drafter_from_json(const ddt_json_ctx *j, const cJSON *o, int64_t version, int64_t max_positions,
                          ddt_drafter_config *c)
{
    ddt_drafter_config d;
    memset(&d, 0, sizeof d);
    d.max_positions = max_positions;
    int rc = 0;
    for (const cJSON *item = o->child; !rc && item; item = item->next)
        if (!ddt_find_drafter_key(item->string))
            rc = ddt_json_fail(j, item->string, "is not a key of the export's config.json");
    for (int i = 0; !rc && i < DRAFTER_KEYS; i++)
        if (drafter_keys[i].since <= version || cJSON_GetObjectItemCaseSensitive(o, drafter_keys[i].key))
            rc = ddt_read_drafter_key(j, o, &drafter_keys[i], &d);
    if (!rc && !(rc = ddt_check_drafter(j, &d)))
        *c = d;
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The serving export
 */

/* The table of c (malloc'd, DDT_MAX_PARAMS rows): its count, or -1 when out of memory */
int ddt_param_table(const ddt_drafter_config *c, ddt_param **table, int64_t *total)
{
    *table = malloc(DDT_MAX_PARAMS * sizeof **table);
    return *table ? ddt_drafter_param_table(c, *table, total) : -1;
}

/* ------------------------------------------------------------------------------------------
 * The manifest: every file of the export with its size and checksum (docs/formats.md)
 */

static const char manifest_name[] = DDT_EXPORT_MANIFEST, manifest_format[] = "ddtree-manifest";
enum { MANIFEST_VERSION = 1, EXPORT_FILES = 2 };
static const char *const export_files[EXPORT_FILES] = { "config.json", "model.safetensors" };
static const char *const manifest_keys[] = { "format", "version", "files", NULL };
/* the manifest is a few hundred bytes; the cap only stops a damaged one from being read whole */
#define MANIFEST_MAX (1u << 20)
static const char export_remedy[] =
    "write the export again from its run's checkpoint (`ddtreed export RUN_DIR --out DIR`) or restore it from a "
    "copy; `ddtreed verify DIR` checks every file";

/* the manifest of the export's files, sums[i] that of export_files[i]: malloc'd text, NULL when
 * out of memory */
static char *manifest_text(const ddt_checksum sums[EXPORT_FILES])
{
    cJSON *o = cJSON_CreateObject(), *files = NULL;
    int ok = o && cJSON_AddStringToObject(o, "format", manifest_format) &&
             cJSON_AddNumberToObject(o, "version", MANIFEST_VERSION) && (files = cJSON_AddObjectToObject(o, "files"));
    for (int i = 0; ok && i < EXPORT_FILES; i++) {
        cJSON *entry = ddt_checksum_json(&sums[i]);
        ok = entry && cJSON_AddItemToObject(files, export_files[i], entry);
        if (!ok)
            cJSON_Delete(entry);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return ddt_json_text(o);
}

/* A manifest's file name: a plain name inside the export, never a path out of it. */
static int plain_name(const char *name)
{
    return name[0] && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") && strlen(name) < 200;
}

/* The manifest's "files" (manifest: its parsed root, j its path), each of the export's files
 * listed: 0, or -EINVAL with err saying what is wrong. */
static int manifest_files(const ddt_json_ctx *j, const cJSON *manifest, const cJSON **files)
{
    int64_t version = 0;
    const char *format = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(manifest, "format"));
    int rc = ddt_json_only(j, manifest, manifest_keys);
    if (!rc && (!format || strcmp(format, manifest_format)))
        rc = ddt_json_fail(j, "format", "must be \"ddtree-manifest\"");
    if (!rc)
        rc = ddt_json_int(j, manifest, "version", MANIFEST_VERSION, MANIFEST_VERSION, 0, 0, &version);
    *files = cJSON_GetObjectItemCaseSensitive(manifest, "files");
    if (!rc && !cJSON_IsObject(*files))
        rc = ddt_json_fail(j, "files", "must be an object of file name -> {size, xxh64}");
    for (int i = 0; !rc && i < EXPORT_FILES; i++)
        if (!cJSON_GetObjectItemCaseSensitive(*files, export_files[i]))
            rc = ddt_fail(j->err, j->err_len, -EINVAL, "%s: files does not list %s", j->path, export_files[i]);
    for (const cJSON *f = rc ? NULL : (*files)->child; !rc && f; f = f->next)
        if (!plain_name(f->string))
            rc = ddt_fail(j->err, j->err_len, -EINVAL, "%s: files: \"%.200s\" is not a file name in the export",
                          j->path, f->string);
    return rc;
}

/* DIR's files against its manifest into *v, the one named `only` (NULL: every one listed). No
 * manifest: UNVERIFIED when config.json and model.safetensors are there (an export written
 * before checksums, or by another trainer), INCOMPLETE naming the one that is not. */
static void verify_export(const char *dir, const char *only, ddt_verdict *v)
{
    char path[CKPT_PATH_MAX], why[1200] = "";
    struct stat st;
    ddt_verdict_good(v);
    if (ddt_path_join(path, sizeof path, "%s/%s", dir, manifest_name)) {
        ddt_verdict_set(v, DDT_VERDICT_CORRUPT, manifest_name, "path too long to read");
        return;
    }
    if (lstat(path, &st) != 0 && errno == ENOENT) {
        for (int i = 0; i < EXPORT_FILES && v->state == DDT_VERDICT_GOOD; i++) {
            char file[CKPT_PATH_MAX];
            if (!ddt_path_join(file, sizeof file, "%s/%s", dir, export_files[i]) && stat(file, &st) != 0)
                ddt_verdict_set(v, DDT_VERDICT_INCOMPLETE, export_files[i], "missing");
        }
        if (v->state == DDT_VERDICT_GOOD)
            v->state = DDT_VERDICT_UNVERIFIED;
        return;
    }
    cJSON *manifest = ddt_json_parse_file(path, MANIFEST_MAX, why, sizeof why);
    ddt_json_ctx j = { path, why, sizeof why };
    const cJSON *files = NULL;
    int rc = manifest ? manifest_files(&j, manifest, &files) : -EINVAL;
    for (const cJSON *f = rc ? NULL : files->child; f && v->state == DDT_VERDICT_GOOD; f = f->next) {
        ddt_checksum want;
        if (only && strcmp(f->string, only))
            continue;
        if ((rc = ddt_checksum_from_json(&j, files, f->string, &want)))
            break;
        ddt_checksum_verify(dir, f->string, &want, v);
    }
    if (rc)
        ddt_verdict_unreadable(v, manifest_name, path, why);
    cJSON_Delete(manifest);
}

int ddt_export_verify(const char *dir, ddt_verdict *v)
{
    int rc = dir && v ? ddt_directory(dir) : -EINVAL;
    if (rc == 0)
        verify_export(dir, NULL, v);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The export written
 */

/* config.json, model.safetensors (BF16, the table's names, format pt) and the manifest of
 * both into dir: each checksum taken from the bytes as they are written */
static int write_export_files(const char *dir, const ddt_drafter_config *c, const float *params,
                              char *err, size_t err_len)
{
    char path[CKPT_PATH_MAX];
    ddt_checksum sums[EXPORT_FILES];   /* of export_files */
    char *config = ddt_json_text(ddt_drafter_json(c));
    ddt_param *table;
    int64_t total;
    int n = ddt_param_table(c, &table, &total);
    uint16_t *weights = n >= 0 ? malloc((size_t)total * sizeof *weights) : NULL;   /* (P) BF16 */
    ddt_st_entry *entries = n >= 0 ? calloc((size_t)n, sizeof *entries) : NULL;
    int rc = 0;
    if (!config || !weights || !entries)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the export", dir);
    if (rc == 0 && !(rc = ddt_path_join(path, sizeof path, "%s/%s", dir, export_files[0]))) {
        sums[0] = ddt_checksum_of(config, strlen(config));
        rc = ddt_write_text_file(path, config, err, err_len);
    }
    ddt_fault_point("export.config_written");   /* a test hook (base/fault.h) */
    if (rc == 0) {
        for (int64_t j = 0; j < total; j++)
            weights[j] = ddt_f32_to_bf16(params[j]);
        for (int i = 0; i < n; i++)
            entries[i] = (ddt_st_entry){ .name = table[i].name, .dtype = DDT_BF16, .ndim = table[i].ndim,
                                         .shape = { table[i].shape[0], table[i].shape[1], table[i].shape[2] },
                                         .data = weights + table[i].offset };
        const char *const key[] = { "format" }, *const value[] = { "pt" };
        if (!(rc = ddt_path_join(path, sizeof path, "%s/%s", dir, export_files[1])))
            rc = ddt_st_write_summed(path, entries, n, key, value, 1, &sums[1], err, err_len);
    }
    char *manifest = rc == 0 ? manifest_text(sums) : NULL;
    if (rc == 0 && !manifest)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the manifest", dir);
    if (rc == 0 && !(rc = ddt_path_join(path, sizeof path, "%s/%s", dir, manifest_name)))
        rc = ddt_write_text_file(path, manifest, err, err_len);
    free(manifest);
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
    /* names of this call alone: two exports into one directory at once (two requests) must not
     * remove each other's half-written files */
    static unsigned calls;
    long pid = (long)getpid();
    unsigned call = __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    int too_long = ddt_path_join(out, sizeof out, "%s", out_dir);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')   /* "dir/" names dir: its siblings are "dir.tmp-*" */
        out[--len] = '\0';
    if (too_long || ddt_path_join(tmp, sizeof tmp, "%s.tmp-%ld-%u", out, pid, call) ||
        ddt_path_join(aside, sizeof aside, "%s.old-%ld-%u", out, pid, call) ||
        ddt_path_join(longest, sizeof longest, "%s/model.safetensors.tmp", tmp))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long for an export", out_dir);
    const char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        snprintf(parent, sizeof parent, "%.*s", slash == out ? 1 : (int)(slash - out), out);
    struct stat st;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        return ddt_fail(err, err_len, -ENOENT, "%s: the directory it goes in (%s) does not exist", out_dir, parent);

    int rc = ddt_remove_tree(tmp);   /* a leftover of a crash with our name */
    if (rc == 0 && mkdir(tmp, 0755) != 0)
        rc = -errno;
    if (rc != 0)
        return ddt_fail(err, err_len, rc, "%s: cannot create: %s", tmp, strerror(-rc));
    rc = write_export_files(tmp, c, params, err, err_len);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        ddt_fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = ddt_install_dir(tmp, out, aside, parent, err, err_len);
    if (rc != 0)
        ddt_remove_tree(tmp);
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
        int64_t dims[3] = { p->shape[0], p->shape[1], p->shape[2] };
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

int ddt_export_read_config(const char *dir, ddt_drafter_config *c, char *err, size_t err_len)
{
    if (!dir || !c)
        return ddt_fail(err, err_len, -EINVAL, "export read: a required argument is NULL");
    ddt_verdict v;
    verify_export(dir, export_files[0], &v);
    if (v.state == DDT_VERDICT_INCOMPLETE || v.state == DDT_VERDICT_CORRUPT)
        return ddt_verdict_fail(&v, dir, export_remedy, err, err_len);
    return ddt_drafter_config_load(dir, c, err, err_len);
}

int ddt_export_read(const char *dir, ddt_drafter_config *c, float **params, char *err, size_t err_len)
{
    if (!dir || !c || !params)
        return ddt_fail(err, err_len, -EINVAL, "export read: a required argument is NULL");
    *params = NULL;
    ddt_verdict v;
    verify_export(dir, NULL, &v);
    if (v.state == DDT_VERDICT_INCOMPLETE || v.state == DDT_VERDICT_CORRUPT)
        return ddt_verdict_fail(&v, dir, export_remedy, err, err_len);
    if (v.state == DDT_VERDICT_UNVERIFIED)
        ddt_log(DDT_LOG_WARNING, "export: read unverified path=\"%s\" reason=\"no %s: written before checksums, or "
                "not by ddtree\"", dir, manifest_name);
    int rc = ddt_drafter_config_load(dir, c, err, err_len);
    if (rc != 0)
        return rc;
    char path[CKPT_PATH_MAX];
    if (ddt_path_join(path, sizeof path, "%s/model.safetensors", dir))
        return ddt_fail(err, err_len, -ENAMETOOLONG, "%s: path too long for an export", dir);
    ddt_param *table;
    int64_t total;
    const int n = ddt_param_table(c, &table, &total);
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
