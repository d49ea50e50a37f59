/* run_config.h: a run's configuration, the body of POST /runs and /plan and the file of
 * `ddtreed train` / `plan` (API.md, "Run config"). ONE table (run_config.c) names every field
 * with its JSON path, type, default, bounds and help; parsing, validation, defaults and the
 * documentation all read it. Unknown keys, wrong types and out-of-range values are errors
 * naming the field's JSON path. "target.devices" is an enum here (ddt_target_place): "auto",
 * "host", "same" or a split's GPUs; ddt_run_config_devices resolves "auto" against the ranks.
 * Tested by tests/engine/train/test_trainer.c and tests/fuzz/fuzz_run_config.c.
 */
#ifndef DDT_RUN_CONFIG_H
#define DDT_RUN_CONFIG_H

#include "ddk.h"       /* ddk_device_profile: memory.card */
#include "model/drafter.h"
#include "data/source.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum { DDT_MAX_EVAL_BUDGETS = 8, DDT_RUN_NAME = 128, DDT_RUN_PATH = 1024 };
enum { DDT_MAX_RANKS = 64 };   /* ranks of one daemon (devices.h resolves them) */

/* What "devices" asked for; the trainer resolves it against the node (ddt_run_config_devices). */
typedef enum ddt_devices_kind {
    DDT_DEVICES_ALL,      /* "all": every GPU, or one CPU rank on a node without GPUs */
    DDT_DEVICES_COUNT,    /* N: GPUs 0..N-1, or N CPU ranks on a node without GPUs */
    DDT_DEVICES_CPU,      /* "cpu": one CPU rank even where there are GPUs */
    DDT_DEVICES_LIST      /* ["cuda:0", "cuda:3"]: those GPUs */
} ddt_devices_kind;

/* Where the target runs ("target.devices"); devices.c resolves AUTO against the ranks
 * (ddt_devices_colocated). */
typedef enum ddt_target_place {
    DDT_TARGET_AUTO,      /* "auto" (the default): SAME on GPU ranks, HOST on CPU ranks */
    DDT_TARGET_HOST,      /* "host": one fp32 target on the host CPU, in the source's loader */
    DDT_TARGET_SAME,      /* "same": a replica on every drafter rank's own backend (co-located) */
    DDT_TARGET_SPLIT      /* ["cuda:N", ...]: target GPUs apart from the drafter's (target_gpu_ids);
                             or N: N target ranks (GPUs devices.c picks, or CPU ranks) */
} ddt_target_place;

/* train.anchors: where a step's anchors are drawn (SPEC.md 2 draws them uniformly; the walks
 * draw them where speculative decoding would start its blocks, SPEC.md 7, train/walk.c) */
typedef enum ddt_anchor_walk { DDT_ANCHORS_UNIFORM, DDT_ANCHORS_WALK, DDT_ANCHORS_TREE_WALK } ddt_anchor_walk;

/* What "target.data.kind" asked for; AUTO resolves at parse: chat with target.data.files, tokens
 * with target.tokens, else generate. */
typedef enum ddt_data_kind { DDT_DATA_AUTO, DDT_DATA_GENERATE, DDT_DATA_TOKENS, DDT_DATA_CHAT } ddt_data_kind;

typedef struct ddt_run_config {
    char name[DDT_RUN_NAME];

    /* target */
    ddt_source_kind target_kind;
    char target_path[DDT_RUN_PATH];        /* hf: the model; shards: where embed/lm_head are */
    char target_tokens[DDT_RUN_PATH];      /* hf: token file ("" = target-generated data) */
    int shard_count;
    char (*shards)[DDT_RUN_PATH];          /* shards: (shard_count) files, malloc'd */
    ddt_target_config synthetic;           /* synthetic: the target's shape */
    float temperature, top_p;              /* generation of target data, and regeneration */
    /* target.data: chat data (SPEC.md section 8), read by source_chat.c */
    int data_kind;                         /* ddt_data_kind, resolved (never AUTO after parse) */
    int chat_file_count;
    char chat_files[DDT_MAX_CHAT_FILES][DDT_RUN_PATH];
    int chat_template;                     /* ddt_chat_template: qwen3, qwen3.5, qwen3.6 */
    char system_prompt[DDT_CHAT_SYSTEM_PROMPT_MAX];
    int train_only_last_turn, drop_reasoning, regenerate;
    int64_t max_new_tokens;                /* regeneration's cap on the answer (0: seq_len) */

    /* drafter (hidden_size and vocab come from the target) */
    ddt_drafter_config drafter;
    int taps_auto;                         /* target_layer_ids "auto" (SPEC.md section 3) */
    int layer_types_count;                 /* entries of layer_types given (0: all full) */
    int64_t mask_token_id;                 /* -1: vocab - 1 */

    /* train */
    int64_t steps, sequences_per_step, grad_accum, seq_len, max_anchors, heldout;
    float gamma, noise_std;
    int ce_target_teacher;                 /* train.ce_target: 1 "teacher", 0 "data" */
    int bf16;                              /* train.precision: 1 "bf16" products, 0 "fp32" */
    double lr, warmup_fraction, weight_decay, grad_clip;
    uint64_t seed;
    float selector_weight;                 /* DFlash2: alpha_sel */
    int selector_inject;                   /* train.selector_candidates: 1 "inject", 0 "strict" */
    int selector_stop_gradient;
    double selector_warmup, selector_ramp; /* fractions of train.steps */
    int anchor_walk;                       /* train.anchors: ddt_anchor_walk */
    double walk_share;                     /* train.walk_share: of a step's sequences, walked */
    int64_t tree_budget;                   /* train.tree_budget: K of the tree walk and the tree term */
    double tree_weight;                    /* train.tree_weight: lambda of the tree term (0: none) */

    /* loss */
    float kl_weight, kl_temperature, cap_weight, cap_temperature;
    int64_t chunk, vocab_tile;
    int auto_rechunk;

    /* devices, memory, checkpoints, eval */
    int64_t ranks;                         /* data-parallel workers of this daemon ("devices") */
    ddt_devices_kind devices_kind;
    int32_t gpu_ids[DDT_MAX_RANKS];        /* DDT_DEVICES_LIST: the GPUs, ranks of them */
    ddt_target_place target_place;         /* target.devices */
    int target_devices_count;              /* DDT_TARGET_SPLIT: its target ranks; else 0 */
    int target_named;                      /* DDT_TARGET_SPLIT: 1 they are the GPUs target_gpu_ids */
    int32_t target_gpu_ids[DDT_MAX_RANKS];
    char cluster_id[260];                  /* cluster.unique_id: "" = this daemon alone */
    int64_t cluster_world, cluster_first;  /* cluster.world_size (0 = alone), cluster.first_rank */
    int64_t budget_bytes;                  /* 0: no budget */
    const ddk_device_profile *card;        /* memory.card: the GPUs' card (libddk's profile); NULL: none */
    int64_t checkpoint_every, checkpoint_keep;
    int64_t eval_every, eval_sequences, eval_blocks;
    int n_budgets;
    int64_t tree_budgets[DDT_MAX_EVAL_BUDGETS];
    /* eval.speculative (SPEC.md section 7): absent (spec 0) = no speculative evaluation */
    int spec;                              /* 1: the object was given */
    int64_t spec_prompts, spec_prompt_len, spec_gen_len, spec_every_evals;
    int spec_n_budgets;
    int64_t spec_budgets[DDT_MAX_EVAL_BUDGETS];
} ddt_run_config;

/* Parses and validates a run config (JSON text of len bytes). 0; -EBADMSG when the text is not
 * JSON at all (a raw NUL included); -EINVAL when it is not a valid run config. err gets a
 * sentence and field the JSON path at fault (e.g. "train.lr"; "" when none). */
int ddt_run_config_parse(const char *json, size_t len, ddt_run_config *c, char *err,
                         size_t err_len, char *field, size_t field_len);
void ddt_run_config_free(ddt_run_config *c);

/* Completes what depends on the target (hidden size, vocab, layers): drafter.hidden, vocab,
 * default taps (refused when "auto" would repeat a layer), mask token and max_positions
 * (ddt_run_config_max_positions); then checks the drafter. 0 or -EINVAL with err. */
int ddt_run_config_resolve(ddt_run_config *c, int64_t target_hidden, int64_t target_vocab,
                           int64_t target_layers, char *err, size_t err_len);

/* The max_position_embeddings the export repeats: target.path's config.json's (hf, shards;
 * ddt_target_max_positions), DDT_MAX_POSITIONS_DEFAULT for a synthetic target or where the
 * directory does not say it. 0, or -EINVAL with err when the file says it wrongly. */
int ddt_run_config_max_positions(const ddt_run_config *c, int64_t *out, char *err, size_t err_len);

/* The target's hidden size, vocabulary, layers and tied head: hf from its config.json;
 * shards from the first shard's metadata when it can be read; otherwise (synthetic, or shards
 * not at hand) the config's target.* shape fields. 0 or -EINVAL with err. The files are read
 * by the source (ddt_source_target_shape over ddt_run_config_source's configuration). */
int ddt_run_config_target_shape(const ddt_run_config *c, int64_t *hidden, int64_t *vocab,
                                int64_t *layers, int *tied, char *err, size_t err_len);

/* The source configuration of a run (shards point into c). */
void ddt_run_config_source(const ddt_run_config *c, ddt_source_config *s);

/* The largest of eval.speculative.tree_budgets (0: none): the speculator's planned cap. */
int64_t ddt_run_config_spec_max_budget(const ddt_run_config *c);
/* What a speculative evaluation of the run may ask for (POST /runs/{id}/speculate): prompts
 * (eval.speculative.prompts, at most train.heldout), gen_len and the largest tree budget, as
 * eval.speculative sets them, or without it the defaults 8, 64 and 32 ([8, 32]). */
void ddt_run_config_spec_caps(const ddt_run_config *c, int64_t *prompts, int64_t *gen_len, int64_t *max_budget);

/* The card called name (libddk's profiles, ddk_device_profile_find), or NULL with err: a sentence
 * naming the cards known. */
const ddk_device_profile *ddt_run_config_card(const char *name, char *err, size_t err_len);

/* A per-GPU budget (0: none) against c's card: 0, or -EINVAL with err naming both figures when it
 * is beyond the card's memory. `what` names where the budget came from ("memory.budget_bytes",
 * "--budget"). The parser checks memory.budget_bytes; `ddtreed plan` its --budget and --card. */
int ddt_run_config_check_budget(const ddt_run_config *c, int64_t budget, const char *what, char *err,
                                size_t err_len);

/* run_files.c: the files c names, checked before a run is accepted (POST /runs, `ddtreed
 * train`, `ddtreed plan`), cheaply: target.path a directory, target.tokens, target.shards[i] and
 * target.data.files[i] files; with chat data, target.path's tokenizer.json there, of a supported
 * kind, its ids within vocab (the target's vocab_size: ddt_run_config_target_shape). 0, or
 * -EINVAL with err (what is wrong and what to do) and field ("target.data.files[0]"). */
int ddt_run_config_check_files(const ddt_run_config *c, int64_t vocab, char *err, size_t err_len, char *field,
                               size_t field_len);
/* Every path c names absolute (what the API requires: the daemon's working directory is not
 * the user's): 0, or -EINVAL naming the first relative one's field. */
int ddt_run_config_check_absolute(const ddt_run_config *c, char *err, size_t err_len, char *field, size_t field_len);
/* The config text json with its relative paths (target.path, target.tokens, target.shards[],
 * target.data.files[]) made dir/PATH (dir: the config file's folder, absolute), for the commands
 * that read a config file. A new string (free() it), json's copy when nothing changes or it is
 * not a JSON object (the parser then says why); NULL without memory. */
char *ddt_run_config_rebase(const char *json, const char *dir);
/* A config file (at most 1 MB) read and rebased against its own folder (ddt_run_config_rebase):
 * what `ddtreed train` and `ddtreed plan` parse. NULL with err. */
char *ddt_run_config_read_file(const char *path, char *err, size_t err_len);

/* Markdown table of every field (path, type, default, bounds, help): the reference docs. */
void ddt_run_config_print_reference(FILE *out);

/* dst := src, with its own copy of the lists (ddt_run_config_free frees it): the run manager
 * keeps a run's parsed config and the trainer takes a copy. 0, or -ENOMEM (dst then holds no
 * shards and can be freed). */
int ddt_run_config_copy(ddt_run_config *dst, const ddt_run_config *src);

#endif
