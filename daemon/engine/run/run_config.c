/* run_config.c: the run configuration's one table, its parser and its checks (run_config.h).
 * The table is the single statement of every field: JSON path, type, default, bounds, help;
 * each kind of field (the scalars, and each list-shaped field) has one parse function.
 * A pure parser: it reads no file and asks nothing of the node. The target's shape is read by
 * the source (ddt_source_target_shape), "devices" is resolved against the node by devices.c, and
 * so is "target.devices" "auto" (co-located on GPU ranks, the host target on CPU ranks). The
 * resolve step reads one key of the target's config.json, max_position_embeddings (for the
 * export), through model_config.c.
 * memory.card is one of libddk's device profiles (ddk_device_profile_find), never a copy of
 * their figures.
 * Tested by tests/engine/train/test_trainer.c, tests/engine/test_engine.c (the auto taps and sliding_window
 * refusals, max_position_embeddings, memory.card) and tests/fuzz/fuzz_run_config.c.
 */
#include "run_config.h"
#include "model/model_config.h"
#include "model/target.h"
#include "base/json_fields.h"
#include "ddk.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The kinds of field. A scalar is one JSON value stored at its offset, with its default and
 * bounds in the table; a list kind is the one field of that shape, parsed (and defaulted) by
 * its own function into the members it names below. kinds[] (after the parsers) gives each
 * its parse and default functions and its name in the reference. */
typedef enum field_type {
    F_INT, F_F32, F_F64, F_BOOL, F_STR, F_ENUM,
    F_PATHS,        /* target.shards: file paths (shards, shard_count) */
    F_LAYER_TYPES,  /* drafter.layer_types (drafter.sliding, layer_types_count) */
    F_LAYER_IDS,    /* drafter.target_layer_ids: "auto" or ids (target_layer_ids, taps, taps_auto) */
    F_BUDGETS,      /* eval.tree_budgets (tree_budgets, n_budgets) */
    F_DEVICES,      /* devices: "all", "cpu", a count or GPU names (devices_kind, ranks, gpu_ids) */
    F_TARGET_DEVICES, /* target.devices: "auto", "host", "same" or GPU names (target_place,
                         target_devices_count, target_gpu_ids) */
    F_BYTES,        /* memory.budget_bytes: null (0) or a positive integer, at offset */
    F_CARD,         /* memory.card: null or the name of one of libddk's device profiles (card) */
    F_CHAT_FILES,   /* target.data.files: JSON Lines paths (chat_files, chat_file_count) */
    F_SECTION,      /* eval.speculative: an optional object whose presence means something: the int
                       at offset := 1, its keys are the table's fields under its path */
    F_SPEC_BUDGETS, /* eval.speculative.tree_budgets (spec_budgets, spec_n_budgets) */
} field_type;

typedef struct config_field {
    const char *path;       /* JSON path, e.g. "train.lr" */
    field_type type;
    size_t offset;          /* of the value in ddt_run_config (scalars, F_BYTES) */
    double dflt, lo, hi;    /* numbers (F_INT, F_F32, F_F64, F_BOOL) */
    const char *text;       /* F_STR: default; F_ENUM: "a|b|c" (dflt is the default's index) */
    size_t size;            /* F_STR: buffer size */
    const char *help;
} config_field;

#define OFF(member) offsetof(ddt_run_config, member)
#define BIG 9.0e15   /* integers up to 2^53: exact in JSON's doubles */

static const config_field fields[] = {
    { "name", F_STR, OFF(name), 0, 0, 0, "run", DDT_RUN_NAME, "a name for people; runs are identified by id" },
    { "target.kind", F_ENUM, OFF(target_kind), 0, 0, 0, "synthetic|hf|shards", 0,
      "synthetic: a seeded random target that generates its own data; hf: a llama/qwen3 directory; shards: feature shards" },
    { "target.path", F_STR, OFF(target_path), 0, 0, 0, "", DDT_RUN_PATH,
      "hf: the model directory; shards: the directory embed_tokens and lm_head are read from" },
    { "target.tokens", F_STR, OFF(target_tokens), 0, 0, 0, "", DDT_RUN_PATH,
      "hf: a token file (safetensors input_ids + offsets); empty: the target generates the data" },
    { "target.shards", F_PATHS, 0, 0, 0, 0, NULL, 0, "shards: the feature shard files (SPEC.md section 4)" },
    { "target.hidden_size", F_INT, OFF(synthetic.hidden), 64, 2, 65536, NULL, 0, "synthetic: H (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.num_hidden_layers", F_INT, OFF(synthetic.layers), 6, 1, DDT_MAX_TARGET_LAYERS, NULL, 0, "synthetic: layers (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.num_attention_heads", F_INT, OFF(synthetic.heads), 4, 1, 1024, NULL, 0, "synthetic: query heads" },
    { "target.num_key_value_heads", F_INT, OFF(synthetic.kv_heads), 2, 1, 1024, NULL, 0, "synthetic: key/value heads" },
    { "target.head_dim", F_INT, OFF(synthetic.head_dim), 16, 2, 1024, NULL, 0, "synthetic: head dim (even)" },
    { "target.intermediate_size", F_INT, OFF(synthetic.intermediate), 172, 1, 1 << 20, NULL, 0, "synthetic: MLP width" },
    { "target.vocab_size", F_INT, OFF(synthetic.vocab), 512, 2, 1 << 24, NULL, 0, "synthetic: vocabulary (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.devices", F_TARGET_DEVICES, 0, 0, 0, 0, NULL, 0,
      "where the target runs (hf, synthetic): \"auto\" (the default: \"same\" on GPU ranks, \"host\" on CPU ranks), \"host\" (one fp32 target on the host CPU computes every rank's features), \"same\" (co-located: each drafter rank holds its own replica on its device, fp32 on a CPU rank, bf16 on a GPU, and computes its features there; the plan proposes a split when it does not fit) or a split: target ranks apart from the drafter's, each with its own replica, handing the features of their sequences to the drafter ranks one step ahead (double-buffered): GPUs [\"cuda:N\", ...] apart from devices' (NCCL send/recv), or a number N (the node's last N GPUs the drafter does not take; N CPU ranks beside CPU drafter ranks)" },
    { "target.temperature", F_F32, OFF(temperature), 1.0, 0, 100, NULL, 0, "generated data: sampling temperature (0: greedy)" },
    { "target.top_p", F_F32, OFF(top_p), 0.95, 1e-9, 1, NULL, 0, "generated data: nucleus mass" },
    { "target.data.kind", F_ENUM, OFF(data_kind), 0, 0, 0, "auto|generate|tokens|chat", 0,
      "hf's data: generated by the target, a token file (target.tokens), or chat (JSON Lines conversations, target.data.files, with the target's tokenizer.json; docs/chat-data.md); auto: chat when target.data.files is given, tokens when target.tokens is, else generate" },
    { "target.data.files", F_CHAT_FILES, 0, 0, 0, 0, NULL, 0,
      "chat: 1 to 16 JSON Lines files of conversations (\"messages\" or ShareGPT \"conversations\"), one a line; a line that cannot be used is skipped and reported as a data_skipped event" },
    { "target.data.chat_template", F_ENUM, OFF(chat_template), 0, 0, 0, "qwen3|qwen3.5|qwen3.6", 0,
      "chat: the template rendered natively (the target's own; its control tokens must be the tokenizer's)" },
    { "target.data.system_prompt", F_STR, OFF(system_prompt), 0, 0, 0, "", DDT_CHAT_SYSTEM_PROMPT_MAX,
      "chat: a system message put first when a conversation has none (\"\": none, as the real templates)" },
    { "target.data.train_only_last_turn", F_BOOL, OFF(train_only_last_turn), 0, 0, 1, NULL, 0,
      "chat: the loss mask covers only the last assistant turn" },
    { "target.data.drop_reasoning", F_BOOL, OFF(drop_reasoning), 0, 0, 1, NULL, 0,
      "chat: every assistant turn rendered without its reasoning (the template's empty think blocks stay)" },
    { "target.data.regenerate", F_BOOL, OFF(regenerate), 0, 0, 1, NULL, 0,
      "chat: the assistant turn after the last user message sampled by the target (target.temperature, target.top_p; stopped at the end-of-turn token) in place of the data's; the mask covers the sampled tokens and the end token" },
    { "target.data.max_new_tokens", F_INT, OFF(max_new_tokens), 0, 0, 1 << 24, NULL, 0,
      "chat, regenerate: the answer's cap in tokens (0: what seq_len leaves after the prompt)" },

    { "drafter.architecture", F_ENUM, OFF(drafter.dflash2), 0, 0, 0, "dflash|dflash2", 0,
      "dflash: SPEC.md section 2; dflash2: section 2.1, the same plus two-tap block convolutions in every layer, "
      "bidirectional blocks and a path selector over the top-K of each slot (architectures [\"DFlash2DraftModel\"])" },
    { "drafter.conv_kernel_size", F_INT, OFF(drafter.conv_taps), 2, 1, DDT_MAX_CONV_TAPS, NULL, 0,
      "dflash2: taps of the block convolutions" },
    { "drafter.conv_group_size", F_INT, OFF(drafter.conv_group_size), 16, 1, 65536, NULL, 0,
      "dflash2: channels sharing one dynamic coefficient (divides the target's hidden_size)" },
    { "drafter.selector_rank", F_INT, OFF(drafter.selector_rank), 256, 1, 65536, NULL, 0,
      "dflash2: r, the selector's codebook width (its two codebooks are 2 x vocab x r parameters)" },
    { "drafter.selector_top_k", F_INT, OFF(drafter.selector_top_k), 16, 1, DDK_SELECTOR_MAX_K, NULL, 0,
      "dflash2: K, the candidates of each slot the selector re-ranks" },
    { "drafter.num_hidden_layers", F_INT, OFF(drafter.layers), 2, 1, DDT_MAX_LAYERS, NULL, 0, "drafter layers" },
    { "drafter.num_attention_heads", F_INT, OFF(drafter.heads), 4, 1, 1024, NULL, 0, "query heads" },
    { "drafter.num_key_value_heads", F_INT, OFF(drafter.kv_heads), 2, 1, 1024, NULL, 0, "key/value heads" },
    { "drafter.head_dim", F_INT, OFF(drafter.head_dim), 16, 2, 1024, NULL, 0, "head dim (even; at most 256 on GPUs, the CUDA attention's limit)" },
    { "drafter.intermediate_size", F_INT, OFF(drafter.intermediate), 172, 1, 1 << 20, NULL, 0, "MLP width" },
    { "drafter.layer_types", F_LAYER_TYPES, 0, 0, 0, 0, NULL, 0,
      "per layer \"full_attention\" or \"sliding_attention\" (default: all full)" },
    { "drafter.sliding_window", F_INT, OFF(drafter.sliding_window), 2048, 1, 1 << 30, NULL, 0, "Wn of sliding layers: >= block_size when a layer is sliding_attention" },
    { "drafter.block_size", F_INT, OFF(drafter.block_size), 16, 2, 256, NULL, 0, "B: slots per block" },
    { "drafter.target_layer_ids", F_LAYER_IDS, 0, 0, 0, 0, NULL, 0, "\"auto\" (SPEC.md section 3: refused when it would repeat a layer) or a list of target layer ids" },
    { "drafter.mask_token_id", F_INT, OFF(mask_token_id), -1, 0, 1 << 30, NULL, 0, "the mask token (default: vocab - 1)" },
    { "drafter.rope_theta", F_F32, OFF(drafter.rope_theta), 10000.0, 1, 1e12, NULL, 0, "RoPE base" },
    { "drafter.rms_norm_eps", F_F32, OFF(drafter.rms_norm_eps), 1e-6, 1e-12, 1, NULL, 0, "RMSNorm epsilon" },

    { "train.steps", F_INT, OFF(steps), 1000, 1, 1e12, NULL, 0, "optimiser steps" },
    { "train.sequences_per_step", F_INT, OFF(sequences_per_step), 4, 1, 1 << 20, NULL, 0, "global batch, in sequences" },
    { "train.grad_accum", F_INT, OFF(grad_accum), 1, 1, 1 << 20, NULL, 0,
      "micro-batches per step and rank: gradients accumulated, activations of one micro-batch at a time" },
    { "train.seq_len", F_INT, OFF(seq_len), 128, 2, 1 << 24, NULL, 0, "S: tokens per sequence" },
    { "train.max_anchors", F_INT, OFF(max_anchors), 16, 1, 1 << 20, NULL, 0, "A: blocks per sequence" },
    { "train.heldout", F_INT, OFF(heldout), 32, 0, 1 << 20, NULL, 0, "sequences kept apart for acceptance" },
    { "train.gamma", F_F32, OFF(gamma), 10.0, 1e-6, 1e6, NULL, 0, "slot weight decay exp(-(k-1)/gamma)" },
    { "train.noise_std", F_F32, OFF(noise_std), 0.0, 0, 100, NULL, 0, "uniform feature noise U(-s, s)" },
    { "train.ce_target", F_ENUM, OFF(ce_target_teacher), 1, 0, 0, "data|teacher", 0,
      "CE labels: the teacher's argmax, or the data's next token" },
    { "train.lr", F_F64, OFF(lr), 6e-4, 0, 10, NULL, 0, "peak learning rate" },
    { "train.warmup_fraction", F_F64, OFF(warmup_fraction), 0.04, 0, 1, NULL, 0, "linear warm-up, as a fraction of steps" },
    { "train.weight_decay", F_F64, OFF(weight_decay), 0.0, 0, 10, NULL, 0, "AdamW decoupled decay (not on norms)" },
    { "train.grad_clip", F_F64, OFF(grad_clip), 1.0, 0, 1e9, NULL, 0, "global L2 norm clip (0: none)" },
    { "train.seed", F_INT, OFF(seed), 0, 0, BIG, NULL, 0, "seeds initialisation, data and anchors" },
    { "train.precision", F_ENUM, OFF(bf16), 0, 0, 0, "fp32|bf16", 0,
      "matrix products: fp32, or bf16 operands with fp32 accumulation (tensor cores; a bf16 copy of the weights, refreshed by every AdamW update, activations rounded once a product, the MLP's gate and up kept in bf16, a GPU's frozen head in bf16; master weights, moments and statistics stay fp32); GPU ranks that read the target's bf16 head in place (co-located or split) take bf16 operands either way" },

    { "train.selector_weight", F_F32, OFF(selector_weight), 1.0, 0, 1e6, NULL, 0,
      "dflash2: alpha_sel, the selector term's weight in the loss" },
    { "train.selector_candidates", F_ENUM, OFF(selector_inject), 0, 0, 0, "strict|inject", 0,
      "dflash2: a label outside the top-K adds no selector term (strict), or replaces the last candidate (inject)" },
    { "train.selector_stop_gradient", F_BOOL, OFF(selector_stop_gradient), 0, 0, 1, NULL, 0,
      "dflash2: the selector term trains the selector's tensors only, not the backbone" },
    { "train.anchors", F_ENUM, OFF(anchor_walk), 0, 0, 0, "uniform|walk|tree_walk", 0,
      "where anchors are drawn: uniform over the candidates (SPEC.md 2); walk: where speculative decoding "
      "would start its blocks under the current weights (SPEC.md 7: from each span's first candidate, each block's "
      "teacher-forced accepted length plus the bonus to the next), on train.walk_share of the sequences, "
      "the rest uniform; tree_walk: the same along DDTree's accepted depth with train.tree_budget nodes" },
    { "train.walk_share", F_F64, OFF(walk_share), 0.5, 0, 1, NULL, 0,
      "walk, tree_walk: the fraction of the run's sequences (spread evenly) whose anchors come from the walk "
      "(its cost, a forward at every position of those sequences, grows with it)" },
    { "train.tree_weight", F_F64, OFF(tree_weight), 0.0, 0, 16, NULL, 0,
      "lambda of the tree term (any anchors): each training block's slot weights scaled by 1 + 4 lambda times "
      "the sum, over the labels' prefixes from that slot on, of sigma'(margin), margin = the prefix's summed "
      "log-probability minus the last node's of the best-first DDTree of train.tree_budget nodes (SPEC.md 6) "
      "under the current weights (the loss normalised by the scaled weights); 0: none" },
    { "train.tree_budget", F_INT, OFF(tree_budget), 32, 1, DDK_SELECTOR_MAX_K, NULL, 0,
      "K, the DDTree nodes of tree_walk's accepted depth and of the tree term's margins (each slot's top K "
      "ranks are taken on the device: 64 at most)" },
    { "train.selector_warmup", F_F64, OFF(selector_warmup), 0.0, 0, 1, NULL, 0,
      "dflash2: the first fraction of the steps with alpha_sel 0" },
    { "train.selector_ramp", F_F64, OFF(selector_ramp), 0.0, 0, 1, NULL, 0,
      "dflash2: the fraction of the steps after the warm-up over which alpha_sel rises linearly to its weight" },

    { "loss.kl_weight", F_F32, OFF(kl_weight), 0.15, 0, 1, NULL, 0, "alpha" },
    { "loss.kl_temperature", F_F32, OFF(kl_temperature), 1.0, 1e-6, 1e6, NULL, 0, "T" },
    { "loss.cap_weight", F_F32, OFF(cap_weight), 0.0, 0, 1e6, NULL, 0, "lambda (CAP)" },
    { "loss.cap_temperature", F_F32, OFF(cap_temperature), 1.0, 1e-6, 1e6, NULL, 0, "Tc" },
    { "loss.chunk", F_INT, OFF(chunk), 4096, 1, BIG, NULL, 0, "positions per loss chunk" },
    { "loss.vocab_tile", F_INT, OFF(vocab_tile), 0, 0, BIG, NULL, 0, "0: whole vocabulary per chunk; > 0: streamed tiles" },
    { "loss.auto_rechunk", F_BOOL, OFF(auto_rechunk), 1, 0, 1, NULL, 0, "halve chunk (then tile) when a step runs out of memory" },

    { "devices", F_DEVICES, 0, 0, 0, 0, NULL, 0,
      "\"all\" (every GPU, but no more than train.sequences_per_step; one CPU rank without GPUs), N (GPUs 0..N-1; N CPU ranks without GPUs), \"cpu\", or [\"cuda:0\", ...]; every rank needs a sequence of each step: more ranks named than train.sequences_per_step are refused" },
    { "cluster.unique_id", F_STR, OFF(cluster_id), 0, 0, 0, "", 257, "several daemons, one run: rank 0's NCCL id (POST /nccl/unique-id)" },
    { "cluster.world_size", F_INT, OFF(cluster_world), 0, 0, 1 << 16, NULL, 0, "ranks of all the daemons together (0: this daemon alone)" },
    { "cluster.first_rank", F_INT, OFF(cluster_first), 0, 0, 1 << 16, NULL, 0, "the global rank of this daemon's first device" },
    { "memory.budget_bytes", F_BYTES, OFF(budget_bytes), 0, 0, 0, NULL, 0,
      "null, or a per-device budget in bytes (with memory.card: at most the card's memory)" },
    { "memory.card", F_CARD, 0, 0, 0, 0, NULL, 0,
      "null, or the card the GPUs are: `ddtreed plan` (and POST /plan) shows its limits (memory, shared memory "
      "per block, threads per SM) and, without memory.budget_bytes, plans GPU ranks with its memory as their "
      "budget; the run itself reads the limits of the GPUs it runs on" },
    { "checkpoint.every_steps", F_INT, OFF(checkpoint_every), 500, 1, BIG, NULL, 0, "steps between checkpoints" },
    { "checkpoint.keep", F_INT, OFF(checkpoint_keep), 3, 1, 1000, NULL, 0, "checkpoints kept" },
    { "eval.every_steps", F_INT, OFF(eval_every), 200, 1, BIG, NULL, 0, "steps between acceptance evaluations" },
    { "eval.sequences", F_INT, OFF(eval_sequences), 32, 0, 1 << 20, NULL, 0, "held-out sequences per evaluation" },
    { "eval.blocks_per_sequence", F_INT, OFF(eval_blocks), 64, 1, 1 << 20, NULL, 0,
      "blocks (anchors) drawn per held-out sequence, at most train.max_anchors" },
    { "eval.tree_budgets", F_BUDGETS, 0, 0, 0, 0, NULL, 0, "DDTree node budgets K (default [16, 64])" },
    { "eval.speculative", F_SECTION, OFF(spec), 0, 0, 0, NULL, 0,
      "speculative decoding on held-out prompts (SPEC.md section 7) at teacher-forced evaluations: absent, none; "
      "{} takes the defaults below. Each prompt is the first prompt_len tokens of a held-out sequence; chat data: "
      "the held-out conversation through its last user message, then the generation prompt (its last prompt_len "
      "tokens when longer), <|im_end|> ending the answer. Needs the target on rank 0 "
      "at train time: refused for target.kind \"shards\" and for a split target.devices" },
    { "eval.speculative.prompts", F_INT, OFF(spec_prompts), 8, 1, 1 << 20, NULL, 0,
      "held-out prompts decoded (one a held-out sequence: train.heldout of them at most, fewer when it is smaller)" },
    { "eval.speculative.prompt_len", F_INT, OFF(spec_prompt_len), 64, 1, 1 << 24, NULL, 0,
      "P: tokens of each prompt (the first P of held-out sequence i), < train.seq_len" },
    { "eval.speculative.gen_len", F_INT, OFF(spec_gen_len), 64, 1, 1 << 24, NULL, 0,
      "G: tokens generated after each prompt; P + G + block_size must fit the target's context" },
    { "eval.speculative.tree_budgets", F_SPEC_BUDGETS, 0, 0, 0, 0, NULL, 0,
      "DDTree node budgets K of the tree decoding (default [8, 32]; [] the chain only); the largest is the "
      "planned cap of POST /runs/{id}/speculate" },
    { "eval.speculative.every_evals", F_INT, OFF(spec_every_evals), 1, 1, 1 << 20, NULL, 0,
      "on every E-th teacher-forced evaluation (the step-0 baseline is the first)" },
};
enum { FIELD_COUNT = sizeof fields / sizeof fields[0] };

typedef struct parse_ctx {
    ddt_run_config *c;
    char *err, *field;
    size_t err_len, field_len;
} parse_ctx;

static int fail(const parse_ctx *p, const char *path, const char *fmt, const char *detail)
{
    snprintf(p->field, p->field_len, "%s", path);
    char what[400];
    snprintf(what, sizeof what, fmt, detail);
    snprintf(p->err, p->err_len, "%s%s%s", path, *path ? ": " : "", what);
    return -EINVAL;
}

static const config_field *find(const char *path)
{
    for (int i = 0; i < FIELD_COUNT; i++)
        if (!strcmp(fields[i].path, path))
            return &fields[i];
    return NULL;
}

static int is_prefix(const char *path)   /* an object level of the table: "train", "loss"... */
{
    size_t n = strlen(path);
    for (int i = 0; i < FIELD_COUNT; i++)
        if (!strncmp(fields[i].path, path, n) && fields[i].path[n] == '.')
            return 1;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * One parse function per kind of field (and a default where the table's numbers do not say it)
 */

static int parse_number(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    void *at = (char *)p->c + f->offset;
    char bounds[120];
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    snprintf(bounds, sizeof bounds, "%s in [%g, %g]", f->type == F_INT ? "an integer" : "a number", f->lo, f->hi);
    if (!isfinite(x) || x < f->lo || x > f->hi || (f->type == F_INT && x != floor(x)))
        return fail(p, f->path, "must be %s", bounds);
    if (f->type == F_INT)
        *(int64_t *)at = (int64_t)x;
    else if (f->type == F_F32)
        *(float *)at = (float)x;
    else
        *(double *)at = x;
    return 0;
}

static int parse_bool(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    if (!cJSON_IsBool(v))
        return fail(p, f->path, "must be %s", "true or false");
    *(int *)((char *)p->c + f->offset) = cJSON_IsTrue(v);
    return 0;
}

static int parse_string(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    const char *s = cJSON_GetStringValue(v);
    if (!s || strlen(s) >= f->size) {
        char most[24];
        snprintf(most, sizeof most, "%zu", f->size - 1);
        return fail(p, f->path, "must be a string of at most %s characters", most);
    }
    snprintf((char *)p->c + f->offset, f->size, "%s", s);
    return 0;
}

static int parse_enum(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    const char *s = cJSON_GetStringValue(v);
    int index = 0;
    for (const char *choice = f->text; s && *choice; index++) {
        size_t n = strcspn(choice, "|");
        if (strlen(s) == n && !strncmp(s, choice, n)) {
            *(int *)((char *)p->c + f->offset) = index;
            return 0;
        }
        choice += n + (choice[n] == '|');
    }
    return fail(p, f->path, "must be one of %s", f->text);
}

static void default_scalar(ddt_run_config *c, const config_field *f)
{
    void *at = (char *)c + f->offset;
    switch (f->type) {
    case F_INT: *(int64_t *)at = (int64_t)f->dflt; break;
    case F_F32: *(float *)at = (float)f->dflt; break;
    case F_F64: *(double *)at = f->dflt; break;
    case F_BOOL:
    case F_ENUM: *(int *)at = f->type == F_BOOL ? f->dflt != 0 : (int)f->dflt; break;
    case F_STR: snprintf(at, f->size, "%s", f->text); break;
    default: break;
    }
}

/* entries of a JSON array, or -1 when v is not one */
static int array_size(const cJSON *v)
{
    return cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
}

/* the integer entries of a list in [lo, hi] into out[] (int32 or int64 by `wide`) */
static int parse_integers(const parse_ctx *p, const config_field *f, const cJSON *v, int n, double lo, double hi,
                          const char *what, void *out, int wide)
{
    for (int i = 0; i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(v, i);
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < lo ||
            x->valuedouble > hi)
            return fail(p, f->path, "entries must be %s", what);
        if (wide)
            ((int64_t *)out)[i] = (int64_t)x->valuedouble;
        else
            ((int32_t *)out)[i] = (int32_t)x->valuedouble;
    }
    return 0;
}

static int parse_chat_files(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const int n = array_size(v);
    if (n < 1 || n > DDT_MAX_CHAT_FILES)
        return fail(p, f->path, "must be a list of 1 to %s JSON Lines files", "16");
    for (int i = 0; i < n; i++) {
        const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
        if (!s || !*s || strlen(s) >= DDT_RUN_PATH)
            return fail(p, f->path, "entries must be %s", "non-empty paths of at most 1023 characters");
        snprintf(c->chat_files[i], DDT_RUN_PATH, "%s", s);
    }
    c->chat_file_count = n;
    return 0;
}

static int parse_paths(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const int n = array_size(v);
    if (n < 1 || n > DDT_MAX_SHARDS)
        return fail(p, f->path, "must be a list of 1 to %s shard files", "1024");
    free(c->shards);
    c->shards = calloc((size_t)n, sizeof *c->shards);
    c->shard_count = c->shards ? n : 0;
    if (!c->shards)
        return fail(p, f->path, "cannot be held: no memory for %s", "the list");
    for (int i = 0; i < n; i++) {
        const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
        if (!s || !*s || strlen(s) >= DDT_RUN_PATH)
            return fail(p, f->path, "entries must be %s", "file paths (non-empty strings)");
        snprintf(c->shards[i], DDT_RUN_PATH, "%s", s);
    }
    return 0;
}

static int parse_layer_types(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const int n = array_size(v);
    if (n < 1 || n > DDT_MAX_LAYERS)
        return fail(p, f->path, "must be a list of %s", "\"full_attention\" / \"sliding_attention\"");
    for (int i = 0; i < n; i++) {
        const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
        if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention")))
            return fail(p, f->path, "entries must be %s", "\"full_attention\" or \"sliding_attention\"");
        c->drafter.sliding[i] = !strcmp(s, "sliding_attention");
    }
    c->layer_types_count = n;   /* checked against num_hidden_layers after parsing */
    return 0;
}

static int parse_layer_ids(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const char *s = cJSON_GetStringValue(v);
    if (s && !strcmp(s, "auto")) {
        c->taps_auto = 1;
        return 0;
    }
    const int n = array_size(v);
    if (n < 1 || n > DDT_MAX_TAPS)
        return fail(p, f->path, "must be \"auto\" or a list of 1 to %s layer ids", "64");
    int rc = parse_integers(p, f, v, n, 0, 4096, "integer layer ids >= 0", c->drafter.target_layer_ids, 0);
    if (rc)
        return rc;
    c->drafter.taps = n;
    c->taps_auto = 0;
    return 0;
}

static void default_layer_ids(ddt_run_config *c, const config_field *f)
{
    (void)f;
    c->taps_auto = 1;
}

/* a list of at most 8 node budgets in [1, hi] into out, n_out */
static int parse_budget_list(const parse_ctx *p, const config_field *f, const cJSON *v, double hi,
                             const char *rule, int64_t *out, int *n_out)
{
    const int n = array_size(v);
    if (n < 0 || n > DDT_MAX_EVAL_BUDGETS)
        return fail(p, f->path, "must be a list of at most %s node budgets", "8");
    int rc = parse_integers(p, f, v, n, 1, hi, rule, out, 1);
    if (rc)
        return rc;
    *n_out = n;
    return 0;
}

static int parse_budgets(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    return parse_budget_list(p, f, v, 65536, "integers in [1, 65536]", p->c->tree_budgets, &p->c->n_budgets);
}

/* the speculator's tree: at most DDT_MAX_SLOTS^2 nodes (speculate.h) */
static int parse_spec_budgets(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    return parse_budget_list(p, f, v, 65536, "integers in [1, 65536] (the speculator's tree cap, 256^2)",
                             p->c->spec_budgets, &p->c->spec_n_budgets);
}

static void default_spec_budgets(ddt_run_config *c, const config_field *f)
{
    (void)f;
    c->spec_n_budgets = 2;
    c->spec_budgets[0] = 8;
    c->spec_budgets[1] = 32;
}

static int parse_object(const parse_ctx *p, const cJSON *obj, const char *prefix);

static int parse_section(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    if (!cJSON_IsObject(v))
        return fail(p, f->path, "must be %s", "an object (leave it out for none)");
    *(int *)((char *)p->c + f->offset) = 1;
    return parse_object(p, v, f->path);
}

static void default_budgets(ddt_run_config *c, const config_field *f)
{
    (void)f;
    c->n_budgets = 2;
    c->tree_budgets[0] = 16;
    c->tree_budgets[1] = 64;
}

/* v (n entries, 1 <= n <= 64) as GPU names "cuda:N" into ids */
static int parse_gpu_names(const parse_ctx *p, const config_field *f, const cJSON *v, int n, int32_t *ids)
{
    for (int i = 0; i < n; i++) {
        const char *name = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
        char *end = NULL;
        long id = name && !strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9'
                      ? strtol(name + 5, &end, 10) : -1;
        if (id < 0 || id >= DDT_MAX_RANKS || *end)
            return fail(p, f->path, "entries must be %s", "GPU names \"cuda:N\" (N in [0, 63])");
        for (int j = 0; j < i; j++)
            if (ids[j] == id)
                return fail(p, f->path, "names %s twice", name);
        ids[i] = (int32_t)id;
    }
    return 0;
}

static int parse_devices(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const char *s = cJSON_GetStringValue(v);
    const int n = array_size(v);
    c->ranks = 1;
    if (s && (!strcmp(s, "all") || !strcmp(s, "cpu"))) {
        c->devices_kind = !strcmp(s, "all") ? DDT_DEVICES_ALL : DDT_DEVICES_CPU;
        return 0;
    }
    if (n >= 1 && n <= DDT_MAX_RANKS) {
        if (parse_gpu_names(p, f, v, n, c->gpu_ids))
            return -EINVAL;
        c->devices_kind = DDT_DEVICES_LIST;
        c->ranks = n;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
        v->valuedouble > DDT_MAX_RANKS)
        return fail(p, f->path, "must be %s",
                    "\"all\", \"cpu\", a number of ranks in [1, 64] or a list of GPUs [\"cuda:0\", ...]");
    c->devices_kind = DDT_DEVICES_COUNT;
    c->ranks = (int64_t)v->valuedouble;
    return 0;
}

#define TARGET_DEVICES_RULE \
    "\"auto\", \"host\", \"same\", a list of GPUs [\"cuda:N\", ...] apart from devices' or a number of target ranks in [1, 64]"

/* target.devices: "auto", "host", "same", GPU names or a count (a split) */
static int parse_target_devices(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    static const char *const names[] = { [DDT_TARGET_AUTO] = "auto", [DDT_TARGET_HOST] = "host",
                                         [DDT_TARGET_SAME] = "same" };
    const char *s = cJSON_GetStringValue(v);
    const int n = array_size(v);
    p->c->target_devices_count = 0;
    for (int i = 0; s && i < (int)(sizeof names / sizeof *names); i++)
        if (!strcmp(s, names[i])) {
            p->c->target_place = (ddt_target_place)i;
            return 0;
        }
    p->c->target_named = n > 0;
    if (cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= DDT_MAX_RANKS &&
        v->valuedouble == (double)(int)v->valuedouble) {   /* N target ranks, placed by devices.c */
        p->c->target_place = DDT_TARGET_SPLIT;
        p->c->target_devices_count = (int)v->valuedouble;
        return 0;
    }
    if (n < 1 || n > DDT_MAX_RANKS)
        return fail(p, f->path, "must be %s", TARGET_DEVICES_RULE);
    if (parse_gpu_names(p, f, v, n, p->c->target_gpu_ids))
        return -EINVAL;
    p->c->target_place = DDT_TARGET_SPLIT;
    p->c->target_devices_count = n;
    return 0;
}

static void default_devices(ddt_run_config *c, const config_field *f)
{
    (void)f;
    c->devices_kind = DDT_DEVICES_ALL;
    c->ranks = 1;
}

static int parse_bytes(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    int64_t *at = (int64_t *)((char *)p->c + f->offset);
    if (cJSON_IsNull(v)) {
        *at = 0;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > BIG)
        return fail(p, f->path, "must be %s", "null or a positive number of bytes");
    *at = (int64_t)v->valuedouble;
    return 0;
}

/* the cards libddk knows, "h100, h200, ..." (its table is the one place they are written) */
static void card_names(char *out, size_t len)
{
    int count = 0;
    const ddk_device_profile *all = ddk_device_profiles(&count);
    size_t at = 0;
    *out = '\0';
    for (int i = 0; i < count && at < len; i++)
        at += (size_t)snprintf(out + at, len - at, "%s%s", i ? ", " : "", all[i].name);
}

const ddk_device_profile *ddt_run_config_card(const char *name, char *err, size_t err_len)
{
    const ddk_device_profile *card = ddk_device_profile_find(name);
    if (!card) {
        char names[128];
        card_names(names, sizeof names);
        snprintf(err, err_len, "\"%.64s\" is not a card ddtree knows: name one of %s", name, names);
    }
    return card;
}

static int parse_card(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    const char *name = cJSON_GetStringValue(v);
    char why[256];
    p->c->card = NULL;
    if (cJSON_IsNull(v))
        return 0;
    if (!name)
        return fail(p, f->path, "must be %s", "null or a card's name (a string)");
    if (!(p->c->card = ddt_run_config_card(name, why, sizeof why)))
        return fail(p, f->path, "%s (or null for none)", why);
    return 0;
}

int ddt_run_config_check_budget(const ddt_run_config *c, int64_t budget, const char *what, char *err,
                                size_t err_len)
{
    if (!c->card || budget <= c->card->memory_bytes)
        return 0;
    snprintf(err, err_len, "%s: %lld bytes (%.1f GB) is beyond the %s's memory, %lld bytes (%.1f GB): give at most "
             "the card's memory, or no budget (the card's memory is then the budget)", what, (long long)budget,
             budget / 1e9, c->card->name, (long long)c->card->memory_bytes, c->card->memory_bytes / 1e9);
    return -EINVAL;
}

typedef struct field_kind {
    const char *name;   /* the reference's type column */
    int (*parse)(const parse_ctx *p, const config_field *f, const cJSON *v);
    void (*set_default)(ddt_run_config *c, const config_field *f);   /* NULL: zero */
} field_kind;

static const field_kind kinds[] = {
    [F_INT] = { "integer", parse_number, default_scalar },
    [F_F32] = { "number", parse_number, default_scalar },
    [F_F64] = { "number", parse_number, default_scalar },
    [F_BOOL] = { "boolean", parse_bool, default_scalar },
    [F_STR] = { "string", parse_string, default_scalar },
    [F_ENUM] = { "enum", parse_enum, default_scalar },
    [F_PATHS] = { "list", parse_paths, NULL },
    [F_LAYER_TYPES] = { "list", parse_layer_types, NULL },
    [F_LAYER_IDS] = { "list", parse_layer_ids, default_layer_ids },
    [F_BUDGETS] = { "list", parse_budgets, default_budgets },
    [F_DEVICES] = { "list", parse_devices, default_devices },
    [F_TARGET_DEVICES] = { "list", parse_target_devices, NULL },
    [F_BYTES] = { "list", parse_bytes, NULL },
    [F_CARD] = { "enum", parse_card, NULL },
    [F_CHAT_FILES] = { "list", parse_chat_files, NULL },
    [F_SECTION] = { "object", parse_section, NULL },
    [F_SPEC_BUDGETS] = { "list", parse_spec_budgets, default_spec_budgets },
};

static void apply_defaults(ddt_run_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < FIELD_COUNT; i++)
        if (kinds[fields[i].type].set_default)
            kinds[fields[i].type].set_default(c, &fields[i]);
}

/* The usual names of other trainers (Hugging Face's TrainingArguments, PyTorch) for the
 * table's, at the same level: "did you mean" hints where the spelling is too far apart. */
static const char *const aliases[] = {
    "learning_rate", "lr", "max_steps", "steps", "num_steps", "steps", "train_steps", "steps",
    "batch_size", "sequences_per_step", "per_device_train_batch_size", "sequences_per_step",
    "gradient_accumulation_steps", "grad_accum", "max_grad_norm", "grad_clip", "warmup_ratio", "warmup_fraction",
    "max_seq_len", "seq_len", "max_length", "seq_len", "sequence_length", "seq_len", "model", "path",
    "model_path", "path", "dir", "path", "dataset", "data", NULL, NULL,
};

/* The known path nearest to an unknown one (ddt_json_nearest over the table's paths and their
 * object levels), into out: 1, or 0 when none is near. */
static int nearest_field(const char *path, char *out, size_t len)
{
    const char *known[FIELD_COUNT * 4 + 1];
    char levels[FIELD_COUNT * 2][64];
    int n = 0, n_levels = 0;
    for (int i = 0; i < FIELD_COUNT; i++) {
        known[n++] = fields[i].path;
        for (const char *dot = strchr(fields[i].path, '.'); dot; dot = strchr(dot + 1, '.')) {
            size_t at = (size_t)(dot - fields[i].path);
            int seen = at >= sizeof levels[0];
            for (int k = 0; k < n_levels && !seen; k++)
                seen = strlen(levels[k]) == at && !strncmp(levels[k], fields[i].path, at);
            if (!seen && n_levels < (int)(sizeof levels / sizeof *levels)) {
                snprintf(levels[n_levels], sizeof levels[0], "%.*s", (int)at, fields[i].path);
                known[n++] = levels[n_levels++];
            }
        }
    }
    known[n] = NULL;
    return ddt_json_nearest(path, known, aliases, out, len);
}

static int parse_object(const parse_ctx *p, const cJSON *obj, const char *prefix)
{
    for (const cJSON *item = obj->child; item; item = item->next) {
        char path[160];
        snprintf(path, sizeof path, "%s%s%s", prefix, *prefix ? "." : "", item->string);
        for (const cJSON *other = item->next; other; other = other->next)
            if (!strcmp(other->string, item->string))
                return fail(p, path, "appears %s in one object", "twice");
        const config_field *f = find(path);
        int rc;
        if (!f && is_prefix(path)) {
            if (!cJSON_IsObject(item))
                return fail(p, path, "must be %s", "an object");
            rc = parse_object(p, item, path);
        } else if (!f) {
            char near[200];
            rc = nearest_field(path, near, sizeof near)
                     ? fail(p, path, "is not a known field: did you mean %s? (unknown keys are errors, not ignored)", near)
                     : fail(p, path, "is not a known field (%s)", "unknown keys are errors, not ignored");
        } else {
            rc = kinds[f->type].parse(p, f, item);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* target.data against target.kind and target.tokens; AUTO resolved */
static int check_data(const parse_ctx *p)
{
    ddt_run_config *c = p->c;
    if (c->data_kind == DDT_DATA_AUTO)
        c->data_kind = c->chat_file_count ? DDT_DATA_CHAT : *c->target_tokens ? DDT_DATA_TOKENS : DDT_DATA_GENERATE;
    if (c->data_kind == DDT_DATA_CHAT) {
        if (c->target_kind != DDT_SOURCE_HF)
            return fail(p, "target.data.kind", "\"chat\" needs %s", "target.kind \"hf\" (the tokenizer.json and the target)");
        if (!c->chat_file_count)
            return fail(p, "target.data.files", "is required for %s", "target.data.kind \"chat\"");
        if (*c->target_tokens)
            return fail(p, "target.tokens", "must be empty with %s", "chat data (one kind of data a run)");
        return 0;
    }
    static const struct { const char *path; size_t offset; } chat_only[] = {
        { "target.data.files", OFF(chat_file_count) }, { "target.data.chat_template", OFF(chat_template) },
        { "target.data.train_only_last_turn", OFF(train_only_last_turn) },
        { "target.data.drop_reasoning", OFF(drop_reasoning) }, { "target.data.regenerate", OFF(regenerate) },
    };
    for (size_t i = 0; i < sizeof chat_only / sizeof *chat_only; i++)
        if (*(int *)((char *)c + chat_only[i].offset))
            return fail(p, chat_only[i].path, "is for %s", "target.data.kind \"chat\"");
    if (*c->system_prompt || c->max_new_tokens)
        return fail(p, *c->system_prompt ? "target.data.system_prompt" : "target.data.max_new_tokens", "is for %s",
                    "target.data.kind \"chat\"");
    if (c->data_kind == DDT_DATA_TOKENS && !*c->target_tokens)
        return fail(p, "target.tokens", "is required for %s", "target.data.kind \"tokens\"");
    if (c->data_kind == DDT_DATA_GENERATE && *c->target_tokens)
        return fail(p, "target.tokens", "must be empty for %s", "target.data.kind \"generate\"");
    return 0;
}

/* eval.speculative against the rest: where it cannot run, refused now, in words */
static int check_speculative(const parse_ctx *p)
{
    const ddt_run_config *c = p->c;
    if (!c->spec)
        return 0;
    if (c->target_kind == DDT_SOURCE_SHARDS)
        return fail(p, "eval.speculative", "needs the target at train time, but %s",
                    "a shards run has none (its features are in the shards): leave it out and run `ddtreed "
                    "speculate` on the export");
    if (c->target_place == DDT_TARGET_SPLIT)
        return fail(p, "eval.speculative", "needs the target beside rank 0's drafter, but %s",
                    "a split target.devices puts it on other devices: use \"same\" (co-located) or \"host\" on "
                    "CPU ranks, or leave it out and run `ddtreed speculate` on the export");
    if (c->spec_prompt_len >= c->seq_len)
        return fail(p, "eval.speculative.prompt_len", "must be < %s",
                    "train.seq_len (a prompt is the first prompt_len tokens of a held-out sequence)");
    if (c->heldout < 1)
        return fail(p, "eval.speculative", "needs held-out prompts: %s", "train.heldout must be >= 1");
    return 0;
}

/* The first of fields (section, key pairs) present in root: its JSON path into path, or 0 */
static int first_present(const cJSON *root, const char *const (*paths)[2], size_t n, char *path, size_t len)
{
    for (size_t i = 0; i < n; i++) {
        const cJSON *section = cJSON_GetObjectItemCaseSensitive(root, paths[i][0]);
        if (cJSON_IsObject(section) && cJSON_GetObjectItemCaseSensitive(section, paths[i][1])) {
            snprintf(path, len, "%s.%s", paths[i][0], paths[i][1]);
            return 1;
        }
    }
    return 0;
}

/* Settings of a mode the config does not choose are refused, naming the first: a forgotten
 * drafter.architecture or train.anchors would otherwise train without them without a word.
 * DFlash2's own fields in a DFlash run config; the walks' share in a run of uniform anchors;
 * DDTree's budget where neither the tree walk nor the tree term reads it. */
static int check_mode_fields(const parse_ctx *p, const cJSON *root)
{
    static const char *const dflash2[][2] = {
        { "drafter", "conv_kernel_size" }, { "drafter", "conv_group_size" }, { "drafter", "selector_rank" },
        { "drafter", "selector_top_k" }, { "train", "selector_weight" }, { "train", "selector_candidates" },
        { "train", "selector_stop_gradient" }, { "train", "selector_warmup" }, { "train", "selector_ramp" },
    };
    static const char *const share[][2] = { { "train", "walk_share" } }, *const budget[][2] = {
        { "train", "tree_budget" } };
    const ddt_run_config *c = p->c;
    char path[64];
    if (!c->drafter.dflash2 && first_present(root, dflash2, sizeof dflash2 / sizeof dflash2[0], path, sizeof path))
        return fail(p, path, "is a DFlash2 setting (SPEC.md 2.1): %s",
                    "set drafter.architecture to \"dflash2\", or leave it out for a DFlash drafter");
    if (c->anchor_walk != DDT_ANCHORS_UNIFORM && c->walk_share == 0)
        return fail(p, "train.walk_share", "must be above 0 with a walk (%s)",
                    "0 walks no sequence: leave train.anchors out for uniform anchors");
    if (c->anchor_walk == DDT_ANCHORS_UNIFORM && first_present(root, share, 1, path, sizeof path))
        return fail(p, path, "is a setting of the walks: %s",
                    "set train.anchors to \"walk\" or \"tree_walk\", or leave it out for uniform anchors");
    if (c->anchor_walk != DDT_ANCHORS_TREE_WALK && c->tree_weight == 0 &&
        first_present(root, budget, 1, path, sizeof path))
        return fail(p, path, "is a setting of DDTree's training: %s",
                    "set train.anchors to \"tree_walk\" or train.tree_weight above 0, or leave it out");
    return 0;
}

/* Relations between fields, after parsing. */
static int check_relations(const parse_ctx *p)
{
    ddt_run_config *c = p->c;
    int data_rc = check_data(p);
    if (data_rc)
        return data_rc;
    if (c->layer_types_count && c->layer_types_count != c->drafter.layers)
        return fail(p, "drafter.layer_types", "must have one entry per drafter layer (%s)",
                    "drafter.num_hidden_layers");
    if (c->target_kind == DDT_SOURCE_HF && !*c->target_path)
        return fail(p, "target.path", "is required for %s", "target.kind \"hf\" (the model directory)");
    if (c->target_kind == DDT_SOURCE_SHARDS && (!*c->target_path || c->shard_count == 0))
        return fail(p, c->shard_count ? "target.path" : "target.shards", "is required for %s",
                    "target.kind \"shards\"");
    if (c->drafter.heads % c->drafter.kv_heads || c->drafter.head_dim % 2)
        return fail(p, "drafter.num_attention_heads", "must be a multiple of num_key_value_heads %s",
                    "(and head_dim even)");
    if (c->target_kind == DDT_SOURCE_SYNTHETIC &&
        (c->synthetic.heads % c->synthetic.kv_heads || c->synthetic.head_dim % 2))
        return fail(p, "target.num_attention_heads", "must be a multiple of num_key_value_heads %s",
                    "(and head_dim even)");
    int any_sliding = 0;
    for (int64_t i = 0; i < c->drafter.layers && i < DDT_MAX_LAYERS; i++)
        any_sliding |= c->drafter.sliding[i];
    if (any_sliding && c->drafter.sliding_window < c->drafter.block_size)
        return fail(p, "drafter.sliding_window", "must be >= drafter.block_size with a sliding_attention layer: %s",
                    "vLLM and SGLang window the block rows too, training does not, and with a window below the "
                    "block the drafter served differs from the one trained (SPEC.md section 2)");
    if (c->drafter.dflash2 && c->drafter.conv_taps > c->drafter.block_size)
        return fail(p, "drafter.conv_kernel_size", "must be at most drafter.block_size: %s",
                    "the convolution runs over one block's slots (SpecForge and speculators refuse more)");
    if (c->selector_warmup + c->selector_ramp > 1.0)
        return fail(p, "train.selector_ramp", "plus train.selector_warmup must be at most 1 (%s)",
                    "both are fractions of train.steps");
    if (!c->drafter.dflash2)   /* DFlash has none of these tensors */
        c->drafter.conv_taps = c->drafter.conv_group_size = c->drafter.selector_rank = c->drafter.selector_top_k = 0;
    if (c->max_anchors * c->drafter.block_size > (int64_t)1 << 30)
        return fail(p, "train.max_anchors", "times block_size is %s", "too large");
    if ((c->target_place == DDT_TARGET_HOST || c->target_place == DDT_TARGET_SAME) &&
        c->target_kind == DDT_SOURCE_SHARDS)
        return fail(p, "target.devices", "must be \"auto\" (or left out) for target.kind \"shards\": %s",
                    "a shards run has no target at train time, its features are in the shards");
    if (c->target_devices_count && c->target_kind == DDT_SOURCE_SHARDS)
        return fail(p, "target.devices", "asks for a split, but %s", "a shards run has no target at train time");
    if (c->target_named && c->devices_kind == DDT_DEVICES_CPU)
        return fail(p, "target.devices", "names GPUs, but %s", "the drafter trains on CPU ranks (devices \"cpu\"): give a number of CPU target ranks instead");
    if (c->target_devices_count && c->cluster_world)
        return fail(p, "target.devices", "must be \"auto\", \"host\" or \"same\" in %s",
                    "a cluster run (a split is within one daemon)");
    for (int i = 0; c->target_named && c->devices_kind == DDT_DEVICES_LIST && i < c->target_devices_count; i++)
        for (int r = 0; r < c->ranks; r++)
            if (c->gpu_ids[r] == c->target_gpu_ids[i]) {
                char what[64];
                snprintf(what, sizeof what, "cuda:%d, a drafter GPU too (devices)", c->gpu_ids[r]);
                return fail(p, "target.devices", "names %s: a split's target GPUs are apart from the drafter's", what);
            }
    if (*c->cluster_id && !ddk_comm_id_valid(c->cluster_id))
        return fail(p, "cluster.unique_id", "must be %s", "the 256 hex digits POST /nccl/unique-id answered");
    if (*c->cluster_id != '\0' && c->cluster_world < 2)
        return fail(p, "cluster.world_size", "must be >= 2 with %s", "cluster.unique_id (the ranks of all daemons)");
    if (c->cluster_first && !c->cluster_world)
        return fail(p, "cluster.first_rank", "needs %s", "cluster.world_size and cluster.unique_id");
    if (c->cluster_world && !*c->cluster_id)
        return fail(p, "cluster.unique_id", "is required with %s", "cluster.world_size");
    if (c->cluster_world && c->cluster_first + c->ranks > c->cluster_world)
        return fail(p, "cluster.first_rank", "plus this daemon's ranks must be <= %s", "cluster.world_size");
    if (c->cluster_world && c->devices_kind != DDT_DEVICES_LIST && c->devices_kind != DDT_DEVICES_COUNT)
        return fail(p, "devices", "must name the GPUs (a count or [\"cuda:N\", ...]) with %s",
                    "a cluster section: the ranks must be known before the run starts");
    if (ddt_run_config_check_budget(c, c->budget_bytes, "memory.budget_bytes", p->err, p->err_len)) {
        snprintf(p->field, p->field_len, "memory.budget_bytes");
        return -EINVAL;
    }
    return check_speculative(p);
}

int ddt_run_config_parse(const char *json, size_t len, ddt_run_config *c, char *err,
                         size_t err_len, char *field, size_t field_len)
{
    apply_defaults(c);
    c->synthetic.rms_norm_eps = 1e-6f;
    c->synthetic.rope_theta = 10000.0f;
    *field = '\0';
    parse_ctx p = { c, err, field, err_len, field_len };
    char *text = malloc(len + 1);
    if (!text)
        return fail(&p, "", "no memory for a %s config", "run");
    memcpy(text, json, len);
    text[len] = '\0';
    /* not JSON at all (a raw NUL included, where cJSON's text ends): -EBADMSG, the API's
     * invalid_json */
    const char *nul = memchr(json, '\0', len), *end = NULL;
    cJSON *root = nul ? NULL : cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    int rc;
    if (!root) {
        char where[64];
        snprintf(where, sizeof where, "%ld", (long)(nul ? nul - json : end ? end - text : 0));
        fail(&p, "", "the body is not valid JSON (near byte %s)", where);
        free(text);
        return -EBADMSG;
    }
    /* cJSON cuts keys and strings at a NUL: "steps\u0000x" would pass as "steps" */
    if (strstr(text, "\\u0000"))
        rc = fail(&p, "", "the run config holds a NUL character (%s)", "as \\u0000");
    else if (!cJSON_IsObject(root)) {
        rc = fail(&p, "", "the run config must be a JSON %s", "object");
    } else {
        rc = parse_object(&p, root, "");
    }
    if (rc == 0)
        rc = check_mode_fields(&p, root);
    if (rc == 0)
        rc = check_relations(&p);
    cJSON_Delete(root);
    free(text);
    if (rc)
        ddt_run_config_free(c);
    return rc;
}

void ddt_run_config_free(ddt_run_config *c)
{
    free(c->shards);
    c->shards = NULL;
    c->shard_count = 0;
}

/* "auto"'s ids (SPEC.md section 3) must be distinct: with too few target layers the formula
 * repeats one (5 layers, 3 drafter layers: [1, 2, 2]), and two taps of one layer only waste fc. */
static int check_auto_taps(const ddt_drafter_config *d, int64_t target_layers, char *err, size_t err_len)
{
    for (int64_t i = 1; i < d->taps; i++)
        if (d->target_layer_ids[i] == d->target_layer_ids[i - 1]) {
            char ids[256];
            size_t at = 0;
            for (int64_t k = 0; k < d->taps && at < sizeof ids; k++)
                at += (size_t)snprintf(ids + at, sizeof ids - at, "%s%d", k ? ", " : "", d->target_layer_ids[k]);
            snprintf(err, err_len, "drafter.target_layer_ids: \"auto\" gives [%s] for a target of %lld layers and "
                     "a drafter of %lld, repeating layer %d; give %lld distinct layer ids in [0, %lld) explicitly",
                     ids, (long long)target_layers, (long long)d->layers, d->target_layer_ids[i],
                     (long long)d->layers, (long long)target_layers);
            return -EINVAL;
        }
    return 0;
}

int ddt_run_config_max_positions(const ddt_run_config *c, int64_t *out, char *err, size_t err_len)
{
    *out = DDT_MAX_POSITIONS_DEFAULT;
    if (c->target_kind == DDT_SOURCE_SYNTHETIC || !c->target_path[0])
        return 0;
    char why[1024];
    if (ddt_target_max_positions(c->target_path, out, why, sizeof why)) {
        snprintf(err, err_len, "target.path: %s", why);
        return -EINVAL;
    }
    return 0;
}

int ddt_run_config_resolve(ddt_run_config *c, int64_t target_hidden, int64_t target_vocab,
                           int64_t target_layers, char *err, size_t err_len)
{
    ddt_drafter_config *d = &c->drafter;
    d->hidden = target_hidden;
    d->vocab = target_vocab;
    d->num_target_layers = target_layers;
    if (c->taps_auto) {
        if (target_layers < 1) {
            snprintf(err, err_len, "drafter.target_layer_ids: \"auto\" needs the target's number of layers; "
                     "give the list (shard targets do not say it)");
            return -EINVAL;
        }
        d->taps = d->layers;
        ddt_target_default_taps(target_layers, d->layers, d->target_layer_ids);
        int rc = check_auto_taps(d, target_layers, err, err_len);
        if (rc)
            return rc;
    }
    int rc = ddt_run_config_max_positions(c, &d->max_positions, err, err_len);
    if (rc)
        return rc;
    if (c->spec && c->spec_prompt_len + c->spec_gen_len + d->block_size > d->max_positions) {
        snprintf(err, err_len, "eval.speculative.gen_len: prompt_len %lld + gen_len %lld + block_size %lld is beyond "
                 "the target's context (max_position_embeddings %lld): shorten the prompts or the generation",
                 (long long)c->spec_prompt_len, (long long)c->spec_gen_len, (long long)d->block_size,
                 (long long)d->max_positions);
        return -EINVAL;
    }
    d->mask_token_id = (int32_t)(c->mask_token_id < 0 ? target_vocab - 1 : c->mask_token_id);
    if (d->dflash2 && target_hidden % d->conv_group_size) {
        snprintf(err, err_len, "drafter.conv_group_size: %lld does not divide the target's hidden_size %lld (the "
                 "convolutions have hidden_size / conv_group_size coefficient groups)",
                 (long long)d->conv_group_size, (long long)target_hidden);
        return -EINVAL;
    }
    if (d->dflash2 && d->selector_top_k > target_vocab) {
        snprintf(err, err_len, "drafter.selector_top_k: %lld is more than the target's vocabulary (%lld)",
                 (long long)d->selector_top_k, (long long)target_vocab);
        return -EINVAL;
    }
    char why[512];
    if (ddt_drafter_config_check(d, why, sizeof why)) {
        snprintf(err, err_len, "drafter: %s", why);
        return -EINVAL;
    }
    /* sizes the planner and the engine compute in 64-bit integers: a config beyond them is
     * refused here, in words, rather than overflowing there */
    const double limit = 0x1p60, H = (double)d->hidden, S = (double)c->seq_len,
                 rows = S + (double)c->max_anchors * (double)d->block_size,
                 width = 8 * H + 3 * (double)d->intermediate + 3 * (double)(d->heads * d->head_dim) +
                         6 * (double)(d->kv_heads * d->head_dim),
                 params = H * (double)d->taps * H + (double)d->layers * width * H +
                          (2 * (double)d->vocab + H) * (double)d->selector_rank,
                 batch = (double)c->sequences_per_step * S * ((double)d->taps + 1) * H * 4,
                 acts = (double)c->sequences_per_step * rows * ((double)d->layers + 1) * width * 4,
                 head = (double)d->vocab * H * 8;
    if (params * 16 > limit || batch > limit || acts > limit || head > limit) {
        snprintf(err, err_len, "the run is beyond 2^60 bytes (parameters %.3g, batch %.3g, activations %.3g, "
                 "head %.3g): shrink train.sequences_per_step, train.seq_len, train.max_anchors or the drafter",
                 params * 16, batch, acts, head);
        return -EINVAL;
    }
    return 0;
}

int ddt_run_config_target_shape(const ddt_run_config *c, int64_t *hidden, int64_t *vocab,
                                int64_t *layers, int *tied, char *err, size_t err_len)
{
    ddt_source_config s;
    ddt_run_config_source(c, &s);
    int rc = ddt_source_target_shape(&s, hidden, vocab, layers, tied, err, err_len);
    if (rc && strncmp(err, "target.", 7)) {   /* the file at fault is target.path's config.json */
        char why[1024];
        snprintf(why, sizeof why, "%s", err);
        snprintf(err, err_len, "target.path: %s", why);
    }
    return rc;
}

void ddt_run_config_source(const ddt_run_config *c, ddt_source_config *s)
{
    memset(s, 0, sizeof *s);
    s->kind = c->target_kind;
    s->synthetic = c->synthetic;
    snprintf(s->model_dir, sizeof s->model_dir, "%s", c->target_path);
    snprintf(s->tokens_file, sizeof s->tokens_file, "%s", c->target_tokens);
    s->shard_count = c->shard_count;
    s->shards = c->shards;
    s->seq_len = c->seq_len;
    s->n_taps = (int)c->drafter.taps;
    memcpy(s->taps, c->drafter.target_layer_ids, sizeof(int32_t) * (size_t)c->drafter.taps);
    s->want_teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
    s->temperature = c->temperature;
    s->top_p = c->top_p;
    s->seed = c->seed;
    s->heldout = c->heldout;
    s->prefetch = 8;
    if (c->data_kind == DDT_DATA_CHAT) {
        s->chat_file_count = c->chat_file_count;
        memcpy(s->chat_files, c->chat_files, sizeof s->chat_files);
        s->chat_template = c->chat_template;
        snprintf(s->system_prompt, sizeof s->system_prompt, "%s", c->system_prompt);
        s->train_only_last_turn = c->train_only_last_turn;
        s->drop_reasoning = c->drop_reasoning;
        s->regenerate = c->regenerate;
        s->max_new_tokens = c->max_new_tokens;
    }
}

int64_t ddt_run_config_spec_max_budget(const ddt_run_config *c)
{
    int64_t k = 0;
    for (int i = 0; i < c->spec_n_budgets; i++)
        k = c->spec_budgets[i] > k ? c->spec_budgets[i] : k;
    return k;
}

void ddt_run_config_spec_caps(const ddt_run_config *c, int64_t *prompts, int64_t *gen_len, int64_t *max_budget)
{
    /* without eval.speculative its fields hold the table's defaults all the same */
    *prompts = c->spec_prompts < c->heldout ? c->spec_prompts : c->heldout;
    *gen_len = c->spec_gen_len;
    *max_budget = ddt_run_config_spec_max_budget(c);
}

void ddt_run_config_print_reference(FILE *out)
{
    fprintf(out, "| field | type | default | bounds | meaning |\n|---|---|---|---|---|\n");
    for (int i = 0; i < FIELD_COUNT; i++) {
        const config_field *f = &fields[i];
        char dflt[64] = "", bounds[256] = "";
        if (f->type == F_STR || f->type == F_ENUM) {
            const char *d = f->text;
            for (int k = 0; f->type == F_ENUM && k < (int)f->dflt; k++)
                d += strcspn(d, "|") + 1;
            size_t n = f->type == F_ENUM ? strcspn(d, "|") : strlen(d);
            snprintf(dflt, sizeof dflt, "\"%.*s\"", (int)n, d);
            if (f->type == F_ENUM)
                snprintf(bounds, sizeof bounds, "%s", f->text);
        } else if (f->type == F_BOOL) {
            snprintf(dflt, sizeof dflt, "%s", f->dflt ? "true" : "false");
        } else if (f->type == F_INT) {
            snprintf(dflt, sizeof dflt, f->dflt < 0 ? "auto" : "%.0f", f->dflt);
            snprintf(bounds, sizeof bounds, f->hi >= BIG ? "[%.0f, 2^53]" : "[%.0f, %.0f]", f->lo, f->hi);
        } else if (f->type == F_F32 || f->type == F_F64) {
            snprintf(dflt, sizeof dflt, "%g", f->dflt);
            snprintf(bounds, sizeof bounds, "[%g, %g]", f->lo, f->hi);
        } else if (f->type == F_CARD) {
            card_names(bounds, sizeof bounds);
        }
        fprintf(out, "| `%s` | %s | %s | %s | %s |\n", f->path, kinds[f->type].name, dflt, bounds, f->help);
    }
}

int ddt_run_config_copy(ddt_run_config *dst, const ddt_run_config *src)
{
    *dst = *src;
    dst->shards = NULL;
    if (src->shard_count > 0) {
        size_t bytes = (size_t)src->shard_count * sizeof *src->shards;
        if (!(dst->shards = malloc(bytes))) {
            dst->shard_count = 0;
            return -ENOMEM;
        }
        memcpy(dst->shards, src->shards, bytes);
    }
    return 0;
}
