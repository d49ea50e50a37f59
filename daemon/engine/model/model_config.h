/* model_config.h: Hugging Face config.json files read into the engine's configurations: the
 * drafter's export format (SPEC.md section 5, DFlash and DFlash2), the dense targets (llama, qwen3; section 3) and
 * the Qwen3.5 / Qwen3.6 hybrid targets (qwen3_5; section 3.1).
 * Every missing, mistyped or out-of-range field is an error naming the file and the field.
 * Also the target's max_position_embeddings, which the drafter's export repeats.
 * Tested by tests/engine/test_engine.c, tests/engine/record/test_checkpoint.c and, through the tools, by the oracle
 * tests.
 */
#ifndef DDT_MODEL_CONFIG_H
#define DDT_MODEL_CONFIG_H

#include "drafter.h"

#include <stddef.h>
#include <stdint.h>

struct cJSON;

enum { DDT_MAX_TARGET_LAYERS = 256 };
/* max_position_embeddings where the target does not say it (a synthetic target, a config.json
 * without the key, shards whose target.path has no config.json): Hugging Face's Qwen3Config
 * default, and what vLLM (qwen3_dflash.py reads config.max_position_embeddings through
 * Qwen3Config) and SGLang (models/dflash.py, getattr(..., 32768)) assume when it is missing. */
enum { DDT_MAX_POSITIONS_DEFAULT = 32768 };

typedef struct ddt_target_config {
    int qwen3;                /* model_type "qwen3" (per-head q_norm / k_norm); else "llama" */
    int64_t hidden, layers, heads, kv_heads, head_dim, intermediate, vocab;
    float rms_norm_eps, rope_theta;
    int tie_word_embeddings;
} ddt_target_config;

/* A Qwen3.5 / Qwen3.6 text model (SPEC.md section 3.1): the fields of text_config (or of the top
 * level of a text-only Qwen3_5ForCausalLM directory), every one required but those SPEC gives a
 * fallback (rope_parameters' two keys, layer_types / full_attention_interval,
 * tie_word_embeddings: false). */
typedef struct ddt_qwen35_config {
    int64_t hidden, layers, intermediate, vocab;       /* H, L, I, V */
    int64_t heads, kv_heads, head_dim;                 /* full attention: nh, nkv, hd */
    int64_t key_heads, value_heads;                    /* Gated DeltaNet: nk, nv (nv % nk == 0) */
    int64_t key_head_dim, value_head_dim, conv_kernel; /* dk, dv, K */
    int64_t rotary_dim;                                /* rd = int(hd * partial_rotary_factor), even */
    float rms_norm_eps, rope_theta, partial_rotary_factor;
    int tie_word_embeddings;
    int nested;                                        /* the fields were in text_config */
    uint8_t full_attention[DDT_MAX_TARGET_LAYERS];     /* (L): 1 full attention, 0 DeltaNet */
} ddt_qwen35_config;

/* The drafters ddtree implements, as config.json's architectures names them: index 0 DFlash
 * (SPEC.md section 2), 1 DFlash2 (section 2.1), ddt_drafter_config's dflash2. */
extern const char *const ddt_drafter_architectures[2];
/* The drafter a config.json's architectures value names: its index in ddt_drafter_architectures,
 * or -1 when it is not a list of exactly one of them */
int ddt_drafter_architecture_of(const struct cJSON *architectures);

/* DFlash2's sizes in dflash_config (SPEC.md 2.1), in the order the export writes them: the key
 * every loader reads (vLLM, SGLang, SpecForge, z-lab, speculators) and its ddt_drafter_config
 * field (an int64_t). */
typedef struct ddt_dflash2_key {
    const char *key;
    size_t offset;
} ddt_dflash2_key;
enum { DDT_DFLASH2_KEYS = 4 };
extern const ddt_dflash2_key ddt_dflash2_keys[DDT_DFLASH2_KEYS];

/* DIR/config.json. 0, or -EINVAL / -errno with err = "PATH: field: what is wrong".
 * The drafter's: the keys of SPEC.md section 5; architectures ["DFlashDraftModel"] or
 * ["DFlash2DraftModel"] and nothing else (c->dflash2), a DFlash2 drafter's sizes in
 * dflash_config (ddt_dflash2_keys) required and a DFlash drafter's refused, block_size at the top
 * or in dflash_config (both: equal), is_causal false or absent for DFlash2 (absent only without a
 * sliding_attention layer) and agreeing with layer_types for DFlash, dflash_config's
 * input_embedding_scale, output_multiplier and final_logit_softcapping absent or neutral (ddtree
 * implements none); use_sliding_window, max_position_embeddings (c->max_positions, 0 when
 * absent), torch_dtype and dtype may be absent (exports written before them, other trainers'),
 * but use_sliding_window false with a sliding_attention layer is refused (Hugging Face's
 * Qwen3Config would drop sliding_window, and the servers refuse the drafter). */
int ddt_drafter_config_load(const char *dir, ddt_drafter_config *c, char *err, size_t err_len);
int ddt_target_config_load(const char *dir, ddt_target_config *c, char *err, size_t err_len);
/* DIR/config.json of model_type qwen3_5 (fields in text_config of model_type qwen3_5_text) or
 * qwen3_5_text (fields at the top). Same errors: "PATH: field is missing" for a field it lacks. */
int ddt_qwen35_config_load(const char *dir, ddt_qwen35_config *c, char *err, size_t err_len);

/* A target directory's max_position_embeddings (DIR/config.json's, else its text_config's, as
 * Qwen3.5 / Qwen3.6 keep it): DDT_MAX_POSITIONS_DEFAULT when the file or the key is absent.
 * 0, or -EINVAL with err naming the file and the field when it is there but not an integer in
 * [1, 2^53] (or the file is not JSON). */
int ddt_target_max_positions(const char *dir, int64_t *out, char *err, size_t err_len);

#endif
