/* model_config.c: config.json of drafters (export format) and dense targets, read with cJSON
 * as untrusted input: types and ranges checked before narrowing, errors naming the field.
 * Tested by tests/test_engine.c.
 */
#include "model_config.h"
#include "json_fields.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *ddt_read_text_file(const char *path, size_t max_bytes, char *err, size_t err_len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(err, err_len, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    char *text = malloc(max_bytes + 1);
    size_t len = text ? fread(text, 1, max_bytes + 1, f) : 0;
    int failed = !text || ferror(f);
    fclose(f);
    if (failed || len > max_bytes) {
        snprintf(err, err_len, failed ? "%s: cannot read it" : "%s: larger than %zu bytes", path, max_bytes);
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* positive number, default when missing */
static int get_positive(const ddt_json_ctx *j, const cJSON *obj, const char *field, double dflt, float *out)
{
    double x;
    int rc = ddt_json_number(j, obj, field, 0.0, 1, 1e30, 1, dflt, &x);
    *out = (float)x;
    return rc;
}

/* DIR/config.json parsed, its path in path (for errors); NULL with err. */
static cJSON *parse_config(const char *dir, char *path, size_t path_len, char *err, size_t err_len)
{
    snprintf(path, path_len, "%s/config.json", dir);
    return ddt_json_parse_file(path, 1 << 20, err, err_len);
}

/* ------------------------------------------------------------------------------------------ */

int ddt_drafter_config_load(const char *dir, ddt_drafter_config *c, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    char path[4096];
    cJSON *root = parse_config(dir, path, sizeof path, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    memset(c, 0, sizeof *c);
    int64_t mask = 0, taps_total = 0;
    int rc = ddt_json_int(&j, root, "hidden_size", 1, 1 << 20, 0, 0, &c->hidden);
    if (!rc) rc = ddt_json_int(&j, root, "num_hidden_layers", 1, DDT_MAX_LAYERS, 0, 0, &c->layers);
    if (!rc) rc = ddt_json_int(&j, root, "num_attention_heads", 1, 4096, 0, 0, &c->heads);
    if (!rc) rc = ddt_json_int(&j, root, "num_key_value_heads", 1, 4096, 1, c->heads, &c->kv_heads);
    if (!rc) rc = ddt_json_int(&j, root, "head_dim", 2, 1024, 1, c->heads ? c->hidden / c->heads : 0, &c->head_dim);
    if (!rc) rc = ddt_json_int(&j, root, "intermediate_size", 1, 1 << 24, 0, 0, &c->intermediate);
    if (!rc) rc = ddt_json_int(&j, root, "vocab_size", 2, INT32_MAX, 0, 0, &c->vocab);
    if (!rc) rc = ddt_json_int(&j, root, "block_size", 2, 4096, 0, 0, &c->block_size);
    if (!rc) rc = ddt_json_int(&j, root, "sliding_window", 0, INT32_MAX, 1, 0, &c->sliding_window);
    if (!rc) rc = ddt_json_int(&j, root, "num_target_layers", 0, 4096, 1, 0, &c->num_target_layers);
    if (!rc) rc = get_positive(&j, root, "rms_norm_eps", 1e-6, &c->rms_norm_eps);
    if (!rc) rc = get_positive(&j, root, "rope_theta", 10000.0, &c->rope_theta);
    if (!rc) {
        const cJSON *types = cJSON_GetObjectItemCaseSensitive(root, "layer_types");
        if (types && !cJSON_IsNull(types)) {
            if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->layers)
                rc = ddt_json_fail(&j, "layer_types", "must be a list of num_hidden_layers strings");
            for (int i = 0; !rc && i < c->layers; i++) {
                const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(types, i));
                if (t && !strcmp(t, "sliding_attention"))
                    c->sliding[i] = 1;
                else if (!t || strcmp(t, "full_attention"))
                    rc = ddt_json_fail(&j, "layer_types", "entries must be \"full_attention\" or \"sliding_attention\"");
            }
        }
    }
    const cJSON *dflash = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    if (!rc && !cJSON_IsObject(dflash))
        rc = ddt_json_fail(&j, "dflash_config", "must be an object with target_layer_ids and mask_token_id");
    if (!rc) rc = ddt_json_int(&j, dflash, "mask_token_id", 0, INT32_MAX, 0, 0, &mask);
    if (!rc) {
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(dflash, "target_layer_ids");
        taps_total = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : 0;
        if (taps_total < 1 || taps_total > DDT_MAX_TAPS)
            rc = ddt_json_fail(&j, "dflash_config.target_layer_ids", "must be a list of 1 to 64 layer ids");
        for (int i = 0; !rc && i < taps_total; i++) {
            const cJSON *v = cJSON_GetArrayItem(ids, i);
            if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 0 ||
                v->valuedouble > 4096)
                rc = ddt_json_fail(&j, "dflash_config.target_layer_ids", "entries must be integers in [0, 4096]");
            else
                c->target_layer_ids[i] = (int32_t)v->valuedouble;
        }
    }
    c->taps = taps_total;
    c->mask_token_id = (int32_t)mask;
    cJSON_Delete(root);
    if (rc)
        return rc;
    char why[512];
    if (ddt_drafter_config_check(c, why, sizeof why)) {
        snprintf(err, err_len, "%s: %s", path, why);
        return -EINVAL;
    }
    return 0;
}

int ddt_target_config_load(const char *dir, ddt_target_config *c, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);   /* defined even when the file cannot be read */
    char path[4096];
    cJSON *root = parse_config(dir, path, sizeof path, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    memset(c, 0, sizeof *c);
    int rc = 0;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type"));
    if (!type || (strcmp(type, "llama") && strcmp(type, "qwen3")))
        rc = ddt_json_fail(&j, "model_type", "must be \"llama\" or \"qwen3\" (other targets are fed through feature shards)");
    else
        c->qwen3 = !strcmp(type, "qwen3");
    if (!rc) rc = ddt_json_int(&j, root, "hidden_size", 1, 1 << 20, 0, 0, &c->hidden);
    if (!rc) rc = ddt_json_int(&j, root, "num_hidden_layers", 1, 4096, 0, 0, &c->layers);
    if (!rc) rc = ddt_json_int(&j, root, "num_attention_heads", 1, 4096, 0, 0, &c->heads);
    if (!rc) rc = ddt_json_int(&j, root, "num_key_value_heads", 1, 4096, 1, c->heads, &c->kv_heads);
    if (!rc) rc = ddt_json_int(&j, root, "head_dim", 2, 1024, 1, c->hidden / c->heads, &c->head_dim);
    if (!rc) rc = ddt_json_int(&j, root, "intermediate_size", 1, 1 << 24, 0, 0, &c->intermediate);
    if (!rc) rc = ddt_json_int(&j, root, "vocab_size", 2, INT32_MAX, 0, 0, &c->vocab);
    if (!rc) rc = get_positive(&j, root, "rms_norm_eps", 1e-6, &c->rms_norm_eps);
    if (!rc) rc = get_positive(&j, root, "rope_theta", 10000.0, &c->rope_theta);
    if (!rc) {
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
        if (tie && !cJSON_IsBool(tie))
            rc = ddt_json_fail(&j, "tie_word_embeddings", "must be true or false");
        c->tie_word_embeddings = tie ? cJSON_IsTrue(tie) : 0;
    }
    if (!rc && (c->heads % c->kv_heads || c->head_dim % 2))
        rc = ddt_json_fail(&j, "num_attention_heads", "must be a multiple of num_key_value_heads, with an even head_dim");
    cJSON_Delete(root);
    return rc;
}
