/* source_config.h: what a feature source is asked for (ddt_source_config: the kind of data, its
 * files, the taps, generation's sampling, chat data's rendering, the seed and the held-out count)
 * and what it yields (ddt_sequence), shared by the public API (source.h), the implementations
 * behind it (source_impl.h) and generated data's rule (generated_tokens.h).
 * Tested through source.h by tests/engine/data/test_source.c.
 *
 * Legend: S tokens of a sequence, H hidden, L_t taps.
 */
#ifndef DDT_SOURCE_CONFIG_H
#define DDT_SOURCE_CONFIG_H

#include "model/target.h"

#include <stddef.h>
#include <stdint.h>

typedef enum ddt_source_kind { DDT_SOURCE_SYNTHETIC, DDT_SOURCE_HF, DDT_SOURCE_SHARDS } ddt_source_kind;

enum { DDT_MAX_SHARDS = 1024, DDT_MAX_CHAT_FILES = 16, DDT_CHAT_SYSTEM_PROMPT_MAX = 4096 };

typedef struct ddt_source_config {
    ddt_source_kind kind;
    ddt_target_config synthetic;   /* synthetic: the target's shape */
    char model_dir[1024];          /* hf: the target; shards: where embed/lm_head are read */
    char tokens_file[1024];        /* hf: token file, or "" to generate */
    int shard_count;
    char (*shards)[1024];          /* shards: (shard_count) paths */
    int64_t seq_len;               /* S of every training sequence (generated, or cut/skipped) */
    int n_taps;
    int32_t taps[64];              /* target layer ids, in feature order */
    int want_teacher;              /* produce teacher_hidden (ce_target teacher or KL) */
    int tokens_only;               /* 1: no features nor teacher (the caller computes them) */
    float temperature, top_p;      /* generation (and chat data's regeneration) */
    /* hf chat data (SPEC.md section 8): JSON Lines files, the target's tokenizer.json */
    int chat_file_count;           /* 0: not chat data */
    char chat_files[DDT_MAX_CHAT_FILES][1024];
    int chat_template;             /* ddt_chat_template (chat_template.h) */
    char system_prompt[DDT_CHAT_SYSTEM_PROMPT_MAX];   /* "" none */
    int train_only_last_turn, drop_reasoning;
    int regenerate;                /* the assistant turn sampled by the target from the prompt */
    int64_t max_new_tokens;        /* regeneration's cap (0: up to seq_len) */
    uint64_t seed;
    int64_t heldout;               /* sequences kept apart for acceptance */
    int prefetch;                  /* queue depth (>= 1) */
} ddt_source_config;

/* One sequence; its arrays belong to the source until the next call that returns one. */
typedef struct ddt_sequence {
    int64_t S;
    int32_t *input_ids;       /* (S) */
    uint8_t *loss_mask;       /* (S) */
    float *features;          /* (S, L_t*H), or NULL: tokens_only */
    float *teacher_hidden;    /* (S, H), or NULL when not wanted / not in the shard / tokens_only */
} ddt_sequence;

#endif
