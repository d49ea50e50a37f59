/* target_footprint.c: what a target costs a run, from its config.json alone
 * (target_footprint.h): its weights (elements, and the bytes the loaders allocate for them
 * in fp32 and in the stored type), one prefill's workspace, one generating sequence's cache and the prefill's matrix
 * FLOPs, and eval.speculative's speculator (its cache from the same arithmetic). The workspace and cache figures are the implementations' own arithmetic (with the
 * CPU causal attention's workspace, ddk_causal_attention_workspace_bytes; the DeltaNet core's
 * few kilobytes of scratch are left out) (target_dense.c's ddt_target_rows_bytes,
 * target_dense_cache.c's ddt_target_cache_bytes, target_qwen35.c's ddt_qwen35_*), so the plan
 * and the allocations agree by construction; the parameter counts come from the same tensor
 * tables the loaders read.
 * Tested by tests/engine/train/test_trainer.c (the host's measured peak of CPU runs against the plan) and
 * tests/daemon/train_cli_test.sh (`ddtreed plan` of the examples).
 *
 * Legend: T tokens (seq_len), H hidden, V vocabulary, L layers.
 */
#include "target_footprint.h"
#include "base/errors.h"
#include "generate.h"
#include "base/json_fields.h"
#include "target.h"
#include "target_qwen35.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

/* bytes per weight of config.json's "dtype" (transformers 5) or "torch_dtype", at the top or in
 * text_config; 2 (bf16, every Qwen3 / Qwen3.5 / Qwen3.6 release) when neither is there */
static int stored_bytes(const cJSON *root, char *dtype, size_t dtype_len)
{
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(root, "text_config");
    const char *keys[] = { "dtype", "torch_dtype" };
    for (int scope = 0; scope < 2; scope++)
        for (int k = 0; k < 2; k++) {
            const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(scope ? text : root, keys[k]));
            if (!v)
                continue;
            snprintf(dtype, dtype_len, "%s", v);
            return !strcmp(v, "float32") ? 4 : 2;
        }
    snprintf(dtype, dtype_len, "bfloat16 (config.json names no dtype)");
    return 2;
}

/* the dense target's matrix products over T tokens: 2 T per weight of the layers (not the
 * embedding; no lm_head: features need none), and the causal attention's two products */
static double dense_flops(const ddt_target_config *c, int64_t T)
{
    const double H = (double)c->hidden, qd = (double)(c->heads * c->head_dim),
                 kvd = (double)(c->kv_heads * c->head_dim), I = (double)c->intermediate, t = (double)T;
    const double layer = H * (2 * qd + 2 * kvd) + 3 * H * I;
    return (double)c->layers * (2 * t * layer + 2 * t * t * qd);
}

static double qwen35_flops(const ddt_qwen35_config *c, int64_t params, int64_t T)
{
    const double t = (double)T, embed = (double)(c->vocab * c->hidden) * (c->tie_word_embeddings ? 1 : 2);
    double attention = 0;
    for (int64_t l = 0; l < c->layers; l++)
        if (c->full_attention[l])
            attention += 2 * t * t * (double)(c->heads * c->head_dim);
    return 2 * t * ((double)params - embed) + attention;
}

void ddt_target_footprint_dense(const ddt_target_config *c, int stored, int64_t T, ddt_target_footprint *f)
{
    memset(f, 0, sizeof *f);
    snprintf(f->model_type, sizeof f->model_type, "%s", c->qwen3 ? "qwen3" : "llama");
    f->hidden = c->hidden, f->vocab = c->vocab, f->layers = c->layers, f->tied = c->tie_word_embeddings;
    f->params = ddt_target_param_count(c);
    f->stored_bytes = stored;
    f->fp32_bytes = ddt_target_weight_bytes(c, 0);
    f->stored_weight_bytes = stored == 2 ? ddt_target_weight_bytes(c, 1) : f->fp32_bytes;
    f->prefill_bytes = ddt_target_rows_bytes(c, T) + ddk_causal_attention_workspace_bytes(c->heads, c->kv_heads,
                                                                                          c->head_dim);
    f->cache_bytes = ddt_target_cache_bytes(c, T, 1) + ddt_generator_workspace_bytes(c->hidden, c->vocab);
    f->prefill_flops = dense_flops(c, T);
}

int ddt_target_footprint_qwen35(const ddt_qwen35_config *c, int stored, int64_t T, ddt_target_footprint *f)
{
    memset(f, 0, sizeof *f);
    snprintf(f->model_type, sizeof f->model_type, "qwen3_5");
    f->hidden = c->hidden, f->vocab = c->vocab, f->layers = c->layers, f->tied = c->tie_word_embeddings;
    if ((f->params = ddt_qwen35_param_count(c)) < 0)
        return -ENOMEM;
    f->stored_bytes = stored;
    f->fp32_bytes = ddt_qwen35_weight_bytes(c, 0);
    f->stored_weight_bytes = stored == 2 ? ddt_qwen35_weight_bytes(c, 1) : f->fp32_bytes;
    f->prefill_bytes = ddt_qwen35_rows_bytes(c, 0, T) + ddk_causal_attention_workspace_bytes(c->heads, c->kv_heads,
                                                                                             c->head_dim);
    f->cache_bytes = ddt_qwen35_cache_bytes(c, T, 1) + ddt_generator_workspace_bytes(c->hidden, c->vocab);
    f->prefill_flops = qwen35_flops(c, f->params, T);
    return 0;
}

int ddt_target_footprint_load(const char *dir, int64_t T, ddt_target_footprint *f, char *err, size_t err_len)
{
    char path[1100], dtype[64];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root = ddt_json_parse_file(path, 1 << 22, err, err_len);
    if (!root)
        return -EINVAL;
    const int qwen35 = ddt_target_type_is_qwen35(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(root,
                                                                                                "model_type")));
    const int stored = stored_bytes(root, dtype, sizeof dtype);
    cJSON_Delete(root);
    int rc;
    if (qwen35) {
        ddt_qwen35_config c;
        if ((rc = ddt_qwen35_config_load(dir, &c, err, err_len)))
            return rc;
        if (ddt_target_footprint_qwen35(&c, stored, T, f))
            return ddt_fail(err, err_len, -ENOMEM, "no memory to count the target's weights");
    } else {
        ddt_target_config c;
        if ((rc = ddt_target_config_load(dir, &c, err, err_len)))
            return rc;
        ddt_target_footprint_dense(&c, stored, T, f);
    }
    snprintf(f->dtype, sizeof f->dtype, "%s", dtype);
    return 0;
}

int ddt_target_footprint_speculator(const char *dir, const ddt_target_config *synthetic, int64_t max_len,
                                    int64_t max_block, int64_t rest, ddt_target_footprint *f, char *err,
                                    size_t err_len)
{
    int rc = 0;
    if (!dir) {
        f->speculator_bytes = rest + ddt_target_cache_bytes(synthetic, max_len, max_block);
    } else if (!strcmp(f->model_type, "qwen3_5")) {
        ddt_qwen35_config c;
        if ((rc = ddt_qwen35_config_load(dir, &c, err, err_len)) == 0)
            f->speculator_bytes = rest + ddt_qwen35_cache_bytes(&c, max_len, max_block);
    } else {
        ddt_target_config c;
        if ((rc = ddt_target_config_load(dir, &c, err, err_len)) == 0)
            f->speculator_bytes = rest + ddt_target_cache_bytes(&c, max_len, max_block);
    }
    return rc;
}
