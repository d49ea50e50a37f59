/* model_config.h: Hugging Face config.json files read into the engine's configurations: the
 * drafter's export format (SPEC.md section 5) and the dense targets (llama, qwen3; section 3).
 * Every missing, mistyped or out-of-range field is an error naming the file and the field.
 * Tested by tests/test_engine.c and, through the tools, by the oracle tests.
 */
#ifndef DDT_MODEL_CONFIG_H
#define DDT_MODEL_CONFIG_H

#include "drafter.h"

#include <stddef.h>

typedef struct ddt_target_config {
    int qwen3;                /* model_type "qwen3" (per-head q_norm / k_norm); else "llama" */
    int64_t hidden, layers, heads, kv_heads, head_dim, intermediate, vocab;
    float rms_norm_eps, rope_theta;
    int tie_word_embeddings;
} ddt_target_config;

/* The whole file, NUL-terminated, at most max_bytes: NULL with err on failure (free() it). */
char *ddt_read_text_file(const char *path, size_t max_bytes, char *err, size_t err_len);

/* DIR/config.json. 0, or -EINVAL / -errno with err = "PATH: field: what is wrong". */
int ddt_drafter_config_load(const char *dir, ddt_drafter_config *c, char *err, size_t err_len);
int ddt_target_config_load(const char *dir, ddt_target_config *c, char *err, size_t err_len);

#endif
