/* model_config.c: config.json of drafters (export format: DFlash and DFlash2) and of targets,
 * read with cJSON as untrusted input: types and ranges checked before narrowing, errors naming
 * the field; a drafter of an architecture ddtree does not implement, or with a key that would
 * make the servers run it otherwise than ddtree does, is refused; and a target's
 * max_position_embeddings for the export.
 * Tested by tests/engine/test_engine.c and tests/engine/record/test_checkpoint.c.
 */
#include "model_config.h"
#include "base/json_fields.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* positive number, default when missing */
static int get_positive(const ddt_json_ctx *j, const cJSON *obj, const char *field, double dflt, float *out)
{
    double x;
    int rc = ddt_json_number(j, obj, field, 0.0, 1, 1e30, 1, dflt, &x);
    *out = (float)x;
    return rc;
}

/* DIR/config.json parsed, its path in path (for errors), the config (config_bytes) zeroed first
 * so that it is defined even when the file cannot be read; NULL with err. */
static cJSON *parse_config(const char *dir, void *config, size_t config_bytes, char *path,
                           size_t path_len, char *err, size_t err_len)
{
    memset(config, 0, config_bytes);
    snprintf(path, path_len, "%s/config.json", dir);
    return ddt_json_parse_file(path, 1 << 20, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * A drafter's config.json
 */

const char *const ddt_drafter_architectures[2] = { "DFlashDraftModel", "DFlash2DraftModel" };

const ddt_dflash2_key ddt_dflash2_keys[DDT_DFLASH2_KEYS] = {
    { "conv_kernel_size", offsetof(ddt_drafter_config, conv_taps) },
    { "conv_group_size", offsetof(ddt_drafter_config, conv_group_size) },
    { "selector_rank", offsetof(ddt_drafter_config, selector_rank) },
    { "selector_top_k", offsetof(ddt_drafter_config, selector_top_k) },
};

static int any_sliding(const ddt_drafter_config *c)
{
    int any = 0;
    for (int64_t i = 0; i < c->layers && i < DDT_MAX_LAYERS; i++)
        any |= c->sliding[i];
    return any;
}

int ddt_drafter_architecture_of(const cJSON *architectures)
{
    const cJSON *a = architectures;
    const char *name = cJSON_IsArray(a) && cJSON_GetArraySize(a) == 1 ? cJSON_GetStringValue(a->child) : NULL;
    for (int i = 0; name && i < 2; i++)
        if (!strcmp(name, ddt_drafter_architectures[i]))
            return i;
    return -1;
}

/* architectures, exactly one of ddt_drafter_architectures, into c->dflash2. Every export ddtree
 * has written carries it (export.c since its first form), as does every Hugging Face
 * save_pretrained (z-lab's, SpecForge's, speculators' drafters): a config.json without it is no
 * drafter ddtree can tell how to run. */
static int drafter_architecture(const ddt_json_ctx *j, const cJSON *root, ddt_drafter_config *c)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(root, "architectures");
    int arch = ddt_drafter_architecture_of(a);
    if (arch >= 0) {
        c->dflash2 = arch;
        return 0;
    }
    char *got = a ? cJSON_PrintUnformatted(a) : NULL, what[400];
    snprintf(what, sizeof what, "%s%.120s: it must be [\"%s\"] (SPEC.md section 2) or [\"%s\"] (section 2.1), the "
             "drafters ddtree implements", a ? "is " : "is missing", got ? got : "", ddt_drafter_architectures[0],
             ddt_drafter_architectures[1]);
    cJSON_free(got);
    return ddt_json_fail(j, "architectures", what);
}

/* dflash_config's integer key in [lo, hi] into *out, named "dflash_config.KEY" in errors;
 * `missing` says why it is needed */
static int dflash_int(const ddt_json_ctx *j, const cJSON *dflash, const char *key, int64_t lo, int64_t hi,
                      const char *missing, int64_t *out)
{
    char field[64], what[96];
    snprintf(field, sizeof field, "dflash_config.%s", key);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(dflash, key);
    if (!v)
        return ddt_json_fail(j, field, missing);
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!(x >= (double)lo && x <= (double)hi && x == floor(x))) {
        snprintf(what, sizeof what, "must be an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return ddt_json_fail(j, field, what);
    }
    *out = (int64_t)x;
    return 0;
}

/* block_size at the top (ddtree's exports; SpecForge reads it there), in dflash_config (z-lab's
 * newer exports; SGLang and z-lab read it there first, speculators' vLLM plugin only there), or
 * both, equal */
static int drafter_block_size(const ddt_json_ctx *j, const cJSON *root, const cJSON *dflash, ddt_drafter_config *c)
{
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(dflash, "block_size");
    if (!inner || cJSON_IsNull(inner))
        return ddt_json_int(j, root, "block_size", 2, 4096, 0, 0, &c->block_size);
    int64_t top = 0;
    int rc = dflash_int(j, dflash, "block_size", 2, 4096, "", &c->block_size);
    if (!rc && !(rc = ddt_json_int(j, root, "block_size", 2, 4096, 1, c->block_size, &top)) && top != c->block_size) {
        char what[160];
        snprintf(what, sizeof what, "%lld differs from dflash_config.block_size %lld: the servers read one or "
                 "the other", (long long)top, (long long)c->block_size);
        rc = ddt_json_fail(j, "block_size", what);
    }
    return rc;
}

/* DFlash2's sizes (ddt_dflash2_keys): each required of a DFlash2 drafter (their ranges are
 * ddt_drafter_config_check's), refused beside DFlashDraftModel (SGLang's DFlashDraftModel builds
 * the convolutions when dflash_config has conv_kernel_size, vLLM's does not) */
static int dflash2_sizes(const ddt_json_ctx *j, const cJSON *dflash, ddt_drafter_config *c)
{
    for (int i = 0; i < DDT_DFLASH2_KEYS; i++) {
        const char *key = ddt_dflash2_keys[i].key;
        int64_t *field = (int64_t *)((char *)c + ddt_dflash2_keys[i].offset);
        int rc = 0;
        if (c->dflash2)
            rc = dflash_int(j, dflash, key, 1, INT32_MAX, "is missing: a DFlash2 drafter's dflash_config says "
                            "conv_kernel_size, conv_group_size, selector_rank and selector_top_k (SPEC.md 2.1)", field);
        else if (cJSON_GetObjectItemCaseSensitive(dflash, key)) {
            char name[64];
            snprintf(name, sizeof name, "dflash_config.%s", key);
            rc = ddt_json_fail(j, name, "is a DFlash2 size, but architectures says DFlashDraftModel: say "
                               "[\"DFlash2DraftModel\"], or remove it (the servers differ on such a drafter: SGLang "
                               "builds the convolutions)");
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* is_causal: true makes every layer's block causal for vLLM, SGLang and z-lab, false none, and
 * without it the sliding_attention layers only. DFlash's rule is the last (SPEC.md section 2),
 * DFlash2's the second (section 2.1): its exports say false. c's architecture and layer_types
 * read. */
static int drafter_causality(const ddt_json_ctx *j, const cJSON *root, const ddt_drafter_config *c)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "is_causal");
    int sliding = any_sliding(c), every = 1;
    for (int64_t i = 0; i < c->layers; i++)
        every &= c->sliding[i];
    if (v && !cJSON_IsNull(v) && !cJSON_IsBool(v))
        return ddt_json_fail(j, "is_causal", "must be true or false");
    if (c->dflash2 && (cJSON_IsTrue(v) || (!cJSON_IsBool(v) && sliding)))
        return ddt_json_fail(j, "is_causal", "must be false: a DFlash2 drafter's blocks are bidirectional in every "
                             "layer (SPEC.md 2.1), and the servers make its sliding_attention layers causal "
                             "without it");
    if (!c->dflash2 && (cJSON_IsTrue(v) ? !every : cJSON_IsFalse(v) && sliding))
        return ddt_json_fail(j, "is_causal", cJSON_IsTrue(v)
                             ? "is true, which makes the servers run every layer causal, but a DFlash drafter's "
                               "full_attention layers see their whole block (SPEC.md section 2): remove it"
                             : "is false, which makes the servers run every layer bidirectional, but a DFlash "
                               "drafter's sliding_attention layers are causal (SPEC.md section 2): remove it");
    return 0;
}

/* dflash_config's keys that change the drafter's arithmetic in vLLM, SGLang and z-lab and that
 * ddtree does not implement: absent, or their neutral value (softcapping: null or <= 0, off) */
static int unimplemented_keys(const ddt_json_ctx *j, const cJSON *dflash)
{
    static const char *const keys[] = { "input_embedding_scale", "output_multiplier", "final_logit_softcapping" };
    for (int i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(dflash, keys[i]);
        int softcap = i == 2;
        if (!v || (cJSON_IsNull(v) && softcap))
            continue;
        if (cJSON_IsNumber(v) && (softcap ? v->valuedouble <= 0 : v->valuedouble == 1.0))
            continue;
        char field[64];
        snprintf(field, sizeof field, "dflash_config.%s", keys[i]);
        return ddt_json_fail(j, field, softcap ? "must be null or <= 0 (off): ddtree does not implement it, and the "
                                                 "servers would run another drafter than ddtree's"
                                               : "must be 1: ddtree does not implement it, and the servers would run "
                                                 "another drafter than ddtree's");
    }
    return 0;
}

/* The keys an export carries for Hugging Face's Qwen3Config and the servers, each optional:
 * use_sliding_window a bool, and not false with a sliding_attention layer (Qwen3Config sets
 * sliding_window to None unless it is true: transformers' models/qwen3/configuration_qwen3.py);
 * torch_dtype and dtype strings. c's layer_types read. */
static int serving_keys(const ddt_json_ctx *j, const cJSON *root, const ddt_drafter_config *c)
{
    const cJSON *use = cJSON_GetObjectItemCaseSensitive(root, "use_sliding_window");
    if (use && !cJSON_IsBool(use))
        return ddt_json_fail(j, "use_sliding_window", "must be true or false");
    if (cJSON_IsFalse(use) && any_sliding(c))
        return ddt_json_fail(j, "use_sliding_window", "is false but a layer is sliding_attention: Hugging Face's "
                             "Qwen3Config then drops sliding_window and the servers refuse the drafter (make it true)");
    static const char *const dtype_keys[] = { "torch_dtype", "dtype" };
    for (int k = 0; k < 2; k++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, dtype_keys[k]);
        if (v && !cJSON_IsNull(v) && !cJSON_IsString(v))
            return ddt_json_fail(j, dtype_keys[k], "must be a string (e.g. \"bfloat16\")");
    }
    return 0;
}

/* rope_parameters.KEY, else text_config.KEY (the top of the text fields), else dflt: transformers 5
 * writes rope_theta under rope_parameters for every model (Qwen3 and z-lab's DFlash2 drafters
 * too), older versions at the top */
static int rope_field(const ddt_json_ctx *j, const cJSON *text, const char *key, double lo, double hi,
                      double dflt, float *out)
{
    const cJSON *rope = cJSON_GetObjectItemCaseSensitive(text, "rope_parameters");
    double x;
    int rc;
    if (rope && !cJSON_IsNull(rope) && !cJSON_IsObject(rope))
        return ddt_json_fail(j, "rope_parameters", "must be an object");
    if (rope && cJSON_GetObjectItemCaseSensitive(rope, key)) {
        char field[64];
        snprintf(field, sizeof field, "rope_parameters.%s", key);
        char what[96];
        snprintf(what, sizeof what, "must be a number in (%g, %g]", lo, hi);
        rc = ddt_json_number(j, rope, key, lo, 1, hi, 0, 0.0, &x);
        if (rc)   /* named with its path, not the bare key */
            rc = ddt_json_fail(j, field, what);
    } else {
        rc = ddt_json_number(j, text, key, lo, 1, hi, 1, dflt, &x);
    }
    *out = (float)x;
    return rc;
}

int ddt_drafter_config_load(const char *dir, ddt_drafter_config *c, char *err, size_t err_len)
{
    char path[4096];
    cJSON *root = parse_config(dir, c, sizeof *c, path, sizeof path, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    int64_t mask = 0, taps_total = 0;
    const cJSON *dflash = cJSON_GetObjectItemCaseSensitive(root, "dflash_config");
    int rc = drafter_architecture(&j, root, c);
    if (!rc) rc = ddt_json_int(&j, root, "hidden_size", 1, 1 << 20, 0, 0, &c->hidden);
    if (!rc) rc = ddt_json_int(&j, root, "num_hidden_layers", 1, DDT_MAX_LAYERS, 0, 0, &c->layers);
    if (!rc) rc = ddt_json_int(&j, root, "num_attention_heads", 1, 4096, 0, 0, &c->heads);
    if (!rc) rc = ddt_json_int(&j, root, "num_key_value_heads", 1, 4096, 1, c->heads, &c->kv_heads);
    if (!rc) rc = ddt_json_int(&j, root, "head_dim", 2, 1024, 1, c->heads ? c->hidden / c->heads : 0, &c->head_dim);
    if (!rc) rc = ddt_json_int(&j, root, "intermediate_size", 1, 1 << 24, 0, 0, &c->intermediate);
    if (!rc) rc = ddt_json_int(&j, root, "vocab_size", 2, INT32_MAX, 0, 0, &c->vocab);
    if (!rc && !cJSON_IsObject(dflash))
        rc = ddt_json_fail(&j, "dflash_config", "must be an object with target_layer_ids and mask_token_id");
    if (!rc) rc = drafter_block_size(&j, root, dflash, c);
    if (!rc) rc = ddt_json_int(&j, root, "sliding_window", 0, INT32_MAX, 1, 0, &c->sliding_window);
    if (!rc) rc = ddt_json_int(&j, root, "num_target_layers", 0, 4096, 1, 0, &c->num_target_layers);
    if (!rc) rc = get_positive(&j, root, "rms_norm_eps", 1e-6, &c->rms_norm_eps);
    if (!rc) rc = rope_field(&j, root, "rope_theta", 0.0, 1e30, 10000.0, &c->rope_theta);
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
    if (!rc) rc = drafter_causality(&j, root, c);
    if (!rc) rc = ddt_json_int(&j, root, "max_position_embeddings", 1, (int64_t)1 << 53, 1, 0, &c->max_positions);
    if (!rc) rc = serving_keys(&j, root, c);
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
    if (!rc) rc = dflash2_sizes(&j, dflash, c);
    if (!rc) rc = unimplemented_keys(&j, dflash);
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
    char path[4096];
    cJSON *root = parse_config(dir, c, sizeof *c, path, sizeof path, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    int rc = 0;
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type"));
    if (!type || (strcmp(type, "llama") && strcmp(type, "qwen3")))
        rc = ddt_json_fail(&j, "model_type", "must be \"llama\" or \"qwen3\" (a dense target; \"qwen3_5\" is the hybrid one)");
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
    if (!rc) rc = rope_field(&j, root, "rope_theta", 0.0, 1e30, 10000.0, &c->rope_theta);
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

/* ------------------------------------------------------------------------------------------
 * Qwen3.5 / Qwen3.6 (SPEC.md section 3.1)
 */

/* layer_types, or every full_attention_interval-th layer full attention */
static int qwen35_layer_types(const ddt_json_ctx *j, const cJSON *text, ddt_qwen35_config *c)
{
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(text, "layer_types");
    if (types && !cJSON_IsNull(types)) {
        if (!cJSON_IsArray(types) || cJSON_GetArraySize(types) != c->layers)
            return ddt_json_fail(j, "layer_types", "must be a list of num_hidden_layers strings");
        for (int64_t i = 0; i < c->layers; i++) {
            const char *t = cJSON_GetStringValue(cJSON_GetArrayItem(types, (int)i));
            if (!t || (strcmp(t, "full_attention") && strcmp(t, "linear_attention")))
                return ddt_json_fail(j, "layer_types", "entries must be \"full_attention\" or \"linear_attention\"");
            c->full_attention[i] = !strcmp(t, "full_attention");
        }
        return 0;
    }
    int64_t interval;
    int rc = ddt_json_int(j, text, "full_attention_interval", 1, DDT_MAX_TARGET_LAYERS, 1, 4, &interval);
    for (int64_t i = 0; !rc && i < c->layers; i++)
        c->full_attention[i] = (i + 1) % interval == 0;
    return rc;
}

static int qwen35_fields(const ddt_json_ctx *j, const cJSON *text, ddt_qwen35_config *c)
{
    int rc = ddt_json_int(j, text, "hidden_size", 1, 1 << 20, 0, 0, &c->hidden);
    if (!rc) rc = ddt_json_int(j, text, "num_hidden_layers", 1, DDT_MAX_TARGET_LAYERS, 0, 0, &c->layers);
    if (!rc) rc = ddt_json_int(j, text, "intermediate_size", 1, 1 << 24, 0, 0, &c->intermediate);
    if (!rc) rc = ddt_json_int(j, text, "vocab_size", 2, INT32_MAX, 0, 0, &c->vocab);
    double eps = 0.0;
    if (!rc) rc = ddt_json_number(j, text, "rms_norm_eps", 0.0, 1, 1.0, 0, 0.0, &eps);
    c->rms_norm_eps = (float)eps;
    if (!rc) rc = ddt_json_int(j, text, "num_attention_heads", 1, 4096, 0, 0, &c->heads);
    if (!rc) rc = ddt_json_int(j, text, "num_key_value_heads", 1, 4096, 0, 0, &c->kv_heads);
    if (!rc) rc = ddt_json_int(j, text, "head_dim", 2, 1024, 0, 0, &c->head_dim);
    if (!rc) rc = ddt_json_int(j, text, "linear_num_key_heads", 1, 4096, 0, 0, &c->key_heads);
    if (!rc) rc = ddt_json_int(j, text, "linear_num_value_heads", 1, 4096, 0, 0, &c->value_heads);
    if (!rc) rc = ddt_json_int(j, text, "linear_key_head_dim", 1, 4096, 0, 0, &c->key_head_dim);
    if (!rc) rc = ddt_json_int(j, text, "linear_value_head_dim", 1, 4096, 0, 0, &c->value_head_dim);
    if (!rc) rc = ddt_json_int(j, text, "linear_conv_kernel_dim", 1, 64, 0, 0, &c->conv_kernel);
    if (!rc) rc = rope_field(j, text, "rope_theta", 0.0, 1e30, 10000.0, &c->rope_theta);
    if (!rc) rc = rope_field(j, text, "partial_rotary_factor", 0.0, 1.0, 0.25, &c->partial_rotary_factor);
    if (!rc) rc = qwen35_layer_types(j, text, c);
    if (!rc) {
        const cJSON *tie = cJSON_GetObjectItemCaseSensitive(text, "tie_word_embeddings");
        if (tie && !cJSON_IsNull(tie) && !cJSON_IsBool(tie))
            rc = ddt_json_fail(j, "tie_word_embeddings", "must be true or false");
        c->tie_word_embeddings = cJSON_IsTrue(tie);
    }
    if (rc)
        return rc;
    /* int(hd * factor) as Python truncates it, on the float64 product */
    c->rotary_dim = (int64_t)((double)c->head_dim * (double)c->partial_rotary_factor);
    if (c->heads % c->kv_heads)
        return ddt_json_fail(j, "num_attention_heads", "must be a multiple of num_key_value_heads");
    if (c->value_heads % c->key_heads)
        return ddt_json_fail(j, "linear_num_value_heads", "must be a multiple of linear_num_key_heads");
    if (c->rotary_dim < 2 || c->rotary_dim % 2)
        return ddt_json_fail(j, "partial_rotary_factor", "must make int(head_dim * factor) even and >= 2");
    return 0;
}

int ddt_qwen35_config_load(const char *dir, ddt_qwen35_config *c, char *err, size_t err_len)
{
    char path[4096];
    cJSON *root = parse_config(dir, c, sizeof *c, path, sizeof path, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root, "model_type"));
    const cJSON *text = root;
    int rc = 0;
    if (type && !strcmp(type, "qwen3_5")) {
        text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
        const char *inner = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(text, "model_type"));
        if (!cJSON_IsObject(text))
            rc = ddt_json_fail(&j, "text_config", "is missing (model_type qwen3_5 keeps the text model's fields there)");
        else if (!inner || strcmp(inner, "qwen3_5_text"))
            rc = ddt_json_fail(&j, "text_config.model_type", "must be \"qwen3_5_text\"");
        c->nested = 1;
    } else if (!type || strcmp(type, "qwen3_5_text")) {
        rc = ddt_json_fail(&j, "model_type", "must be \"qwen3_5\" or \"qwen3_5_text\"");
    }
    if (!rc && (rc = qwen35_fields(&j, text, c)) && c->nested) {
        /* "PATH: field ..." becomes "PATH: text_config.field ..." */
        char rest[1024];
        size_t skip = strlen(path) + 2;
        snprintf(rest, sizeof rest, "%s", strlen(err) > skip ? err + skip : "");
        if (strncmp(rest, "text_config", 11))
            snprintf(err, err_len, "%s: text_config.%s", path, rest);
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The target's max_position_embeddings (the export repeats it: SPEC.md section 5)
 */

int ddt_target_max_positions(const char *dir, int64_t *out, char *err, size_t err_len)
{
    char path[4096];
    *out = DDT_MAX_POSITIONS_DEFAULT;
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (access(path, F_OK) != 0)
        return 0;
    cJSON *root = ddt_json_parse_file(path, 1 << 20, err, err_len);
    if (!root)
        return -EINVAL;
    ddt_json_ctx j = { path, err, err_len };
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const char *field = "max_position_embeddings";
    const cJSON *at = root;
    if (!cJSON_GetObjectItemCaseSensitive(root, field) && cJSON_IsObject(text)) {
        at = text;
        field = "text_config.max_position_embeddings";
    }
    int rc = ddt_json_int(&j, at, "max_position_embeddings", 1, (int64_t)1 << 53, 1, DDT_MAX_POSITIONS_DEFAULT, out);
    if (rc && at == text)   /* named with its path */
        rc = ddt_json_fail(&j, field, "must be an integer in [1, 2^53]");
    cJSON_Delete(root);
    return rc;
}
