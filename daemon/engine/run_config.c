/* run_config.c: the run configuration's one table, its parser and its checks (run_config.h).
 * The table is the single statement of every field: JSON path, type, default, bounds, help.
 * Tested by tests/test_run_config.c.
 */
#include "run_config.h"
#include "safetensors.h"
#include "shard.h"
#include "target.h"
#include "ddk.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef enum field_type { F_INT, F_F32, F_F64, F_BOOL, F_STR, F_ENUM, F_LIST } field_type;

typedef struct config_field {
    const char *path;       /* JSON path, e.g. "train.lr" */
    field_type type;
    size_t offset;          /* of the value in ddt_run_config */
    double dflt, lo, hi;    /* numbers (F_INT, F_F32, F_F64, F_BOOL) */
    const char *text;       /* F_STR: default; F_ENUM: "a|b|c" (dflt is the default's index) */
    size_t size;            /* F_STR: buffer size */
    const char *help;
} config_field;

#define OFF(member) offsetof(ddt_run_config, member)
#define BIG 9.0e15   /* integers up to 2^53: exact in JSON's doubles */

/* F_LIST fields are parsed by parse_list() by path. */
static const config_field fields[] = {
    { "name", F_STR, OFF(name), 0, 0, 0, "run", DDT_RUN_NAME, "a name for people; runs are identified by id" },
    { "target.kind", F_ENUM, OFF(target_kind), 0, 0, 0, "synthetic|hf|shards", 0,
      "synthetic: a seeded random target that generates its own data; hf: a llama/qwen3 directory; shards: feature shards" },
    { "target.path", F_STR, OFF(target_path), 0, 0, 0, "", DDT_RUN_PATH,
      "hf: the model directory; shards: the directory embed_tokens and lm_head are read from" },
    { "target.tokens", F_STR, OFF(target_tokens), 0, 0, 0, "", DDT_RUN_PATH,
      "hf: a token file (safetensors input_ids + offsets); empty: the target generates the data" },
    { "target.shards", F_LIST, 0, 0, 0, 0, NULL, 0, "shards: the feature shard files (SPEC.md section 4)" },
    { "target.hidden_size", F_INT, OFF(synthetic.hidden), 64, 2, 65536, NULL, 0, "synthetic: H (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.num_hidden_layers", F_INT, OFF(synthetic.layers), 4, 1, DDT_MAX_TARGET_LAYERS, NULL, 0, "synthetic: layers (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.num_attention_heads", F_INT, OFF(synthetic.heads), 4, 1, 1024, NULL, 0, "synthetic: query heads" },
    { "target.num_key_value_heads", F_INT, OFF(synthetic.kv_heads), 2, 1, 1024, NULL, 0, "synthetic: key/value heads" },
    { "target.head_dim", F_INT, OFF(synthetic.head_dim), 16, 2, 1024, NULL, 0, "synthetic: head dim (even)" },
    { "target.intermediate_size", F_INT, OFF(synthetic.intermediate), 172, 1, 1 << 20, NULL, 0, "synthetic: MLP width" },
    { "target.vocab_size", F_INT, OFF(synthetic.vocab), 512, 2, 1 << 24, NULL, 0, "synthetic: vocabulary (other kinds: the shape `ddtreed plan` assumes when the target is not at hand)" },
    { "target.temperature", F_F32, OFF(temperature), 1.0, 0, 100, NULL, 0, "generated data: sampling temperature (0: greedy)" },
    { "target.top_p", F_F32, OFF(top_p), 0.95, 1e-9, 1, NULL, 0, "generated data: nucleus mass" },

    { "drafter.num_hidden_layers", F_INT, OFF(drafter.layers), 2, 1, DDT_MAX_LAYERS, NULL, 0, "drafter layers" },
    { "drafter.num_attention_heads", F_INT, OFF(drafter.heads), 4, 1, 1024, NULL, 0, "query heads" },
    { "drafter.num_key_value_heads", F_INT, OFF(drafter.kv_heads), 2, 1, 1024, NULL, 0, "key/value heads" },
    { "drafter.head_dim", F_INT, OFF(drafter.head_dim), 16, 2, 1024, NULL, 0, "head dim (even; at most 256 on GPUs, the CUDA attention's limit)" },
    { "drafter.intermediate_size", F_INT, OFF(drafter.intermediate), 172, 1, 1 << 20, NULL, 0, "MLP width" },
    { "drafter.layer_types", F_LIST, 0, 0, 0, 0, NULL, 0,
      "per layer \"full_attention\" or \"sliding_attention\" (default: all full)" },
    { "drafter.sliding_window", F_INT, OFF(drafter.sliding_window), 2048, 1, 1 << 30, NULL, 0, "Wn of sliding layers" },
    { "drafter.block_size", F_INT, OFF(drafter.block_size), 16, 2, 256, NULL, 0, "B: slots per block" },
    { "drafter.target_layer_ids", F_LIST, 0, 0, 0, 0, NULL, 0, "\"auto\" (SPEC.md section 3) or a list of target layer ids" },
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
      "matrix products: fp32, or bf16 operands with fp32 accumulation (tensor cores; weights, moments and statistics stay fp32)" },

    { "loss.kl_weight", F_F32, OFF(kl_weight), 0.15, 0, 1, NULL, 0, "alpha" },
    { "loss.kl_temperature", F_F32, OFF(kl_temperature), 1.0, 1e-6, 1e6, NULL, 0, "T" },
    { "loss.cap_weight", F_F32, OFF(cap_weight), 0.0, 0, 1e6, NULL, 0, "lambda (CAP)" },
    { "loss.cap_temperature", F_F32, OFF(cap_temperature), 1.0, 1e-6, 1e6, NULL, 0, "Tc" },
    { "loss.chunk", F_INT, OFF(chunk), 4096, 1, BIG, NULL, 0, "positions per loss chunk" },
    { "loss.vocab_tile", F_INT, OFF(vocab_tile), 0, 0, BIG, NULL, 0, "0: whole vocabulary per chunk; > 0: streamed tiles" },
    { "loss.auto_rechunk", F_BOOL, OFF(auto_rechunk), 1, 0, 1, NULL, 0, "halve chunk (then tile) when a step runs out of memory" },

    { "devices", F_LIST, 0, 0, 0, 0, NULL, 0,
      "\"all\" (every GPU, but no more than train.sequences_per_step; one CPU rank without GPUs), N (GPUs 0..N-1; N CPU ranks without GPUs), \"cpu\", or [\"cuda:0\", ...]; every rank needs a sequence of each step: more ranks named than train.sequences_per_step are refused" },
    { "cluster.unique_id", F_STR, OFF(cluster_id), 0, 0, 0, "", 257, "several daemons, one run: rank 0's NCCL id (POST /nccl/unique-id)" },
    { "cluster.world_size", F_INT, OFF(cluster_world), 0, 0, 1 << 16, NULL, 0, "ranks of all the daemons together (0: this daemon alone)" },
    { "cluster.first_rank", F_INT, OFF(cluster_first), 0, 0, 1 << 16, NULL, 0, "the global rank of this daemon's first device" },
    { "memory.budget_bytes", F_LIST, 0, 0, 0, 0, NULL, 0, "null, or a per-device budget in bytes" },
    { "checkpoint.every_steps", F_INT, OFF(checkpoint_every), 500, 1, BIG, NULL, 0, "steps between checkpoints" },
    { "checkpoint.keep", F_INT, OFF(checkpoint_keep), 3, 1, 1000, NULL, 0, "checkpoints kept" },
    { "eval.every_steps", F_INT, OFF(eval_every), 200, 1, BIG, NULL, 0, "steps between acceptance evaluations" },
    { "eval.sequences", F_INT, OFF(eval_sequences), 32, 0, 1 << 20, NULL, 0, "held-out sequences per evaluation" },
    { "eval.blocks_per_sequence", F_INT, OFF(eval_blocks), 64, 1, 1 << 20, NULL, 0,
      "blocks (anchors) drawn per held-out sequence, at most train.max_anchors" },
    { "eval.tree_budgets", F_LIST, 0, 0, 0, 0, NULL, 0, "DDTree node budgets K (default [16, 64])" },
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

static void apply_defaults(ddt_run_config *c)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < FIELD_COUNT; i++) {
        const config_field *f = &fields[i];
        void *at = (char *)c + f->offset;
        switch (f->type) {
        case F_INT: *(int64_t *)at = (int64_t)f->dflt; break;
        case F_F32: *(float *)at = (float)f->dflt; break;
        case F_F64: *(double *)at = f->dflt; break;
        case F_BOOL: *(int *)at = f->dflt != 0; break;
        case F_STR: snprintf(at, f->size, "%s", f->text); break;
        case F_ENUM: *(int *)at = (int)f->dflt; break;
        case F_LIST: break;
        }
    }
    c->taps_auto = 1;
    c->ranks = 1;
    c->n_budgets = 2;
    c->tree_budgets[0] = 16;
    c->tree_budgets[1] = 64;
}

static int parse_enum(const parse_ctx *p, const config_field *f, const cJSON *v, int *out)
{
    const char *s = cJSON_GetStringValue(v);
    int index = 0;
    for (const char *choice = f->text; s && *choice; index++) {
        size_t n = strcspn(choice, "|");
        if (strlen(s) == n && !strncmp(s, choice, n)) {
            *out = index;
            return 0;
        }
        choice += n + (choice[n] == '|');
    }
    return fail(p, f->path, "must be one of %s", f->text);
}

static int parse_value(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    void *at = (char *)p->c + f->offset;
    char bounds[120];
    switch (f->type) {
    case F_INT:
    case F_F32:
    case F_F64: {
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
    case F_BOOL:
        if (!cJSON_IsBool(v))
            return fail(p, f->path, "must be %s", "true or false");
        *(int *)at = cJSON_IsTrue(v);
        return 0;
    case F_STR: {
        const char *s = cJSON_GetStringValue(v);
        if (!s || strlen(s) >= f->size)
        {
            char most[24];
            snprintf(most, sizeof most, "%zu", f->size - 1);
            return fail(p, f->path, "must be a string of at most %s characters", most);
        }
        snprintf(at, f->size, "%s", s);
        return 0;
    }
    case F_ENUM:
        return parse_enum(p, f, v, at);
    case F_LIST:
        break;
    }
    return 0;
}

/* The fields whose JSON is not one scalar. */
static int parse_list(const parse_ctx *p, const config_field *f, const cJSON *v)
{
    ddt_run_config *c = p->c;
    const char *path = f->path;
    int n = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : -1;
    if (!strcmp(path, "target.shards")) {
        if (n < 1 || n > DDT_MAX_SHARDS)
            return fail(p, path, "must be a list of 1 to %s shard files", "1024");
        free(c->shards);
        c->shards = calloc((size_t)n, sizeof *c->shards);
        c->shard_count = n;
        for (int i = 0; i < n; i++) {
            const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
            if (!s || !*s || strlen(s) >= DDT_RUN_PATH)
                return fail(p, path, "entries must be %s", "file paths (non-empty strings)");
            snprintf(c->shards[i], DDT_RUN_PATH, "%s", s);
        }
        return 0;
    }
    if (!strcmp(path, "drafter.layer_types")) {
        if (n < 1 || n > DDT_MAX_LAYERS)
            return fail(p, path, "must be a list of %s", "\"full_attention\" / \"sliding_attention\"");
        for (int i = 0; i < n; i++) {
            const char *s = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
            if (!s || (strcmp(s, "full_attention") && strcmp(s, "sliding_attention")))
                return fail(p, path, "entries must be %s", "\"full_attention\" or \"sliding_attention\"");
            c->drafter.sliding[i] = !strcmp(s, "sliding_attention");
        }
        c->layer_types_count = n;   /* checked against num_hidden_layers after parsing */
        return 0;
    }
    if (!strcmp(path, "drafter.target_layer_ids")) {
        const char *s = cJSON_GetStringValue(v);
        if (s && !strcmp(s, "auto")) {
            c->taps_auto = 1;
            return 0;
        }
        if (n < 1 || n > DDT_MAX_TAPS)
            return fail(p, path, "must be \"auto\" or a list of 1 to %s layer ids", "64");
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
                x->valuedouble > 4096)
                return fail(p, path, "entries must be %s", "integer layer ids >= 0");
            c->drafter.target_layer_ids[i] = (int32_t)x->valuedouble;
        }
        c->drafter.taps = n;
        c->taps_auto = 0;
        return 0;
    }
    if (!strcmp(path, "eval.tree_budgets")) {
        if (n < 0 || n > DDT_MAX_EVAL_BUDGETS)
            return fail(p, path, "must be a list of at most %s node budgets", "8");
        for (int i = 0; i < n; i++) {
            const cJSON *x = cJSON_GetArrayItem(v, i);
            if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 1 ||
                x->valuedouble > 65536)
                return fail(p, path, "entries must be %s", "integers in [1, 65536]");
            c->tree_budgets[i] = (int64_t)x->valuedouble;
        }
        c->n_budgets = n;
        return 0;
    }
    if (!strcmp(path, "devices")) {
        const char *s = cJSON_GetStringValue(v);
        c->ranks = 1;
        if (s && (!strcmp(s, "all") || !strcmp(s, "cpu"))) {
            c->devices_kind = !strcmp(s, "all") ? DDT_DEVICES_ALL : DDT_DEVICES_CPU;
            return 0;
        }
        if (n >= 1 && n <= DDT_MAX_RANKS) {
            for (int i = 0; i < n; i++) {
                const char *name = cJSON_GetStringValue(cJSON_GetArrayItem(v, i));
                char *end = NULL;
                long id = name && !strncmp(name, "cuda:", 5) && name[5] >= '0' && name[5] <= '9'
                              ? strtol(name + 5, &end, 10) : -1;
                if (id < 0 || id >= DDT_MAX_RANKS || *end)
                    return fail(p, path, "entries must be %s", "GPU names \"cuda:N\" (N in [0, 63])");
                for (int j = 0; j < i; j++)
                    if (c->gpu_ids[j] == id)
                        return fail(p, path, "names %s twice", name);
                c->gpu_ids[i] = (int32_t)id;
            }
            c->devices_kind = DDT_DEVICES_LIST;
            c->ranks = n;
            return 0;
        }
        if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 ||
            v->valuedouble > DDT_MAX_RANKS)
            return fail(p, path, "must be %s",
                        "\"all\", \"cpu\", a number of ranks in [1, 64] or a list of GPUs [\"cuda:0\", ...]");
        c->devices_kind = DDT_DEVICES_COUNT;
        c->ranks = (int64_t)v->valuedouble;
        return 0;
    }
    /* memory.budget_bytes */
    if (cJSON_IsNull(v)) {
        c->budget_bytes = 0;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < 1 || v->valuedouble > BIG)
        return fail(p, path, "must be %s", "null or a positive number of bytes");
    c->budget_bytes = (int64_t)v->valuedouble;
    return 0;
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
            rc = fail(p, path, "is not a known field (%s)", "unknown keys are errors, not ignored");
        } else {
            rc = f->type == F_LIST ? parse_list(p, f, item) : parse_value(p, f, item);
        }
        if (rc)
            return rc;
    }
    return 0;
}

/* What a run on GPUs needs beyond what the CPU needs: the drafter's attention runs on the CUDA
 * attention, which holds head_dim <= DDK_CUDA_MAX_HEAD_DIM (ddk.h); refused here rather than
 * by the attention at the first step. The target needs no such check: its forward (the online
 * sources' generation and taps, source.c) runs on the CPU backend even in a GPU run. field may
 * be NULL. 0 or -EINVAL with err ("drafter.head_dim: ..."). */
/* What a GPU run of `ranks` ranks (over all daemons) needs of this build: a head_dim the CUDA
 * attention takes, and NCCL for more than one rank. */
static int check_gpu_limits(const ddt_run_config *c, ddt_node node, int64_t ranks, char *err, size_t err_len,
                            char *field, size_t field_len)
{
    if (ranks > 1 && node.single_gpu) {
        if (field)
            snprintf(field, field_len, c->cluster_world ? "cluster.world_size" : "devices");
        snprintf(err, err_len, "%s: %lld GPU ranks need NCCL, and this ddtreed was built without it: train "
                 "on one GPU (\"devices\": [\"cuda:0\"]), or rebuild with NCCL found (tests/gpu/README.md, "
                 "README.md: Building by hand)", c->cluster_world ? "cluster.world_size" : "devices",
                 (long long)ranks);
        return -EINVAL;
    }
    if (c->drafter.head_dim <= DDK_CUDA_MAX_HEAD_DIM)
        return 0;
    if (field)
        snprintf(field, field_len, "drafter.head_dim");
    snprintf(err, err_len, "drafter.head_dim: %lld is more than the %d the CUDA attention supports, and this "
             "run's devices are GPUs: use \"devices\": \"cpu\", or a drafter.head_dim <= %d",
             (long long)c->drafter.head_dim, DDK_CUDA_MAX_HEAD_DIM, DDK_CUDA_MAX_HEAD_DIM);
    return -EINVAL;
}

/* Relations between fields, after parsing. */
static int check_relations(const parse_ctx *p)
{
    ddt_run_config *c = p->c;
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
    if (c->max_anchors * c->drafter.block_size > (int64_t)1 << 30)
        return fail(p, "train.max_anchors", "times block_size is %s", "too large");
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
    return 0;
}

/* err := "path: sentence", field := path; returns rc */
static int devices_fail(int rc, char *err, size_t err_len, char *field, size_t field_len, const char *path,
                        const char *fmt, ...) __attribute__((format(printf, 7, 8)));
static int devices_fail(int rc, char *err, size_t err_len, char *field, size_t field_len, const char *path,
                        const char *fmt, ...)
{
    if (field)
        snprintf(field, field_len, "%s", path);
    int n = snprintf(err, err_len, "%s: ", path);
    va_list ap;
    va_start(ap, fmt);
    if (n >= 0 && (size_t)n < err_len)
        vsnprintf(err + n, err_len - (size_t)n, fmt, ap);
    va_end(ap);
    return rc;
}

ddt_node ddt_node_here(void)
{
    return (ddt_node){ .gpus = ddk_cuda_device_count(), .single_gpu = ddk_has_cuda() && !ddk_has_nccl() };
}

int ddt_run_config_devices(const ddt_run_config *c, ddt_node node, ddt_devices *out, char *err,
                           size_t err_len, char *field, size_t field_len)
{
    const int gpus = node.gpus;
    memset(out, 0, sizeof *out);
    if (field)
        *field = '\0';
    out->ranks = (int)c->ranks;
    /* Every rank trains on one sequence of each step at least: an idle one would hold a whole
     * replica (weights, moments, the target's head: ~38 GB at the seed's shape) and all-reduce
     * zeros. Ranks named (a count, a list, a cluster's world) are the operator's word: too many
     * are refused; "all" takes only as many GPUs as there are sequences (below). */
    const int64_t world = c->cluster_world ? c->cluster_world : c->ranks;
    if ((c->devices_kind == DDT_DEVICES_COUNT || c->devices_kind == DDT_DEVICES_LIST) &&
        world > c->sequences_per_step)
        return devices_fail(-EINVAL, err, err_len, field, field_len, c->cluster_world ? "cluster.world_size" : "devices",
                            "%lld ranks but train.sequences_per_step is %lld: every rank needs at least one "
                            "sequence of each step (an idle one holds a whole replica and all-reduces zeros); "
                            "give at most %lld %s, or raise train.sequences_per_step", (long long)world,
                            (long long)c->sequences_per_step, (long long)c->sequences_per_step,
                            c->cluster_world ? "ranks over all the daemons" : "devices");
    /* GPUs named (a list; a cluster runs on GPUs): a GPU run wherever it is asked for */
    int rc;
    if ((c->devices_kind == DDT_DEVICES_LIST || c->cluster_world) &&
        (rc = check_gpu_limits(c, node, world, err, err_len, field, field_len)))
        return rc;
    switch (c->devices_kind) {
    case DDT_DEVICES_CPU:
        return 0;
    case DDT_DEVICES_ALL:
    case DDT_DEVICES_COUNT:
        if (gpus < 1) {   /* a node without GPUs: CPU ranks ("all": one) */
            if (c->cluster_world)
                return devices_fail(-ENODEV, err, err_len, field, field_len, "cluster",
                                    "this node has no GPU; a cluster run needs NCCL over GPUs");
            return 0;
        }
        out->gpu = 1;
        if (c->devices_kind == DDT_DEVICES_ALL) {
            /* every GPU, but no more than there are sequences in a step */
            int64_t most = c->sequences_per_step < DDT_MAX_RANKS ? c->sequences_per_step : DDT_MAX_RANKS;
            if (node.single_gpu)
                most = 1;   /* no all-reduce in this build: one GPU */
            out->ranks = gpus < most ? gpus : (int)most;
            if (out->ranks < gpus && most == 1 && c->sequences_per_step > 1) {
                snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but this ddtreed was built "
                         "without NCCL: training on cuda:0, the other %d stay idle", gpus, gpus - 1);
            } else if (out->ranks < gpus) {
                char used[40];
                snprintf(used, sizeof used, out->ranks > 1 ? "cuda:0..cuda:%d" : "cuda:0", out->ranks - 1);
                if (c->sequences_per_step < gpus)
                    snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but %lld sequence%s per "
                             "step (train.sequences_per_step): training on %s, the other %d stay idle", gpus,
                             (long long)c->sequences_per_step, c->sequences_per_step > 1 ? "s" : "", used,
                             gpus - out->ranks);
                else
                    snprintf(out->note, sizeof out->note, "devices \"all\": %d GPUs but at most %d ranks: "
                             "training on %s, the other %d stay idle", gpus, DDT_MAX_RANKS, used,
                             gpus - out->ranks);
            }
        } else if (out->ranks > gpus) {
            return devices_fail(-ENODEV, err, err_len, field, field_len, "devices",
                                "%d GPUs asked for, this node has %d", out->ranks, gpus);
        }
        for (int i = 0; i < out->ranks; i++)
            out->gpu_ids[i] = i;
        return check_gpu_limits(c, node, c->cluster_world ? c->cluster_world : out->ranks, err, err_len,
                                field, field_len);
    case DDT_DEVICES_LIST:
        for (int i = 0; i < c->ranks; i++)
            if (c->gpu_ids[i] >= gpus)
                return devices_fail(-ENODEV, err, err_len, field, field_len, "devices",
                                    "cuda:%d is not a GPU of this node (it has %d%s)", c->gpu_ids[i], gpus,
                                    gpus ? "" : ": none, or this ddtreed was built without CUDA");
        out->gpu = 1;
        memcpy(out->gpu_ids, c->gpu_ids, (size_t)c->ranks * sizeof *out->gpu_ids);
        return 0;
    }
    return 0;
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
    /* cJSON cuts keys and strings at a NUL: "steps\u0000x" would pass as "steps" */
    if (memchr(json, '\0', len) || strstr(text, "\\u0000")) {
        free(text);
        return fail(&p, "", "the run config holds a NUL character (%s)", "raw or as \\u0000");
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    int rc;
    if (!root) {
        char where[64];
        snprintf(where, sizeof where, "%ld", (long)(end ? end - text : 0));
        rc = fail(&p, "", "the body is not valid JSON (near byte %s)", where);
    } else if (!cJSON_IsObject(root)) {
        rc = fail(&p, "", "the run config must be a JSON %s", "object");
    } else {
        rc = parse_object(&p, root, "");
    }
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
    }
    d->mask_token_id = (int32_t)(c->mask_token_id < 0 ? target_vocab - 1 : c->mask_token_id);
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
                 params = H * (double)d->taps * H + (double)d->layers * width * H,
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
    *hidden = c->synthetic.hidden;
    *vocab = c->synthetic.vocab;
    *layers = c->synthetic.layers;
    *tied = 0;
    if (c->target_kind == DDT_SOURCE_HF) {
        ddt_target_config t;
        int rc = ddt_target_config_load(c->target_path, &t, err, err_len);
        if (rc == 0) {   /* on failure the declared shape stays, for callers that plan anyway */
            *hidden = t.hidden;
            *vocab = t.vocab;
            *layers = t.layers;
            *tied = t.tie_word_embeddings;
        }
        return rc;
    }
    if (c->target_kind == DDT_SOURCE_SHARDS) {   /* the first shard's metadata, when at hand */
        ddt_st_file f;
        char ignored[512];
        if (ddt_st_open(c->shards[0], &f, ignored, sizeof ignored) == 0) {
            const char *h = ddt_st_metadata(&f, ddt_shard_keys[DDT_SHARD_KEY_HIDDEN_SIZE]),
                       *v = ddt_st_metadata(&f, ddt_shard_keys[DDT_SHARD_KEY_VOCAB_SIZE]);
            if (h && v) {
                *hidden = atoll(h);
                *vocab = atoll(v);
            }
            ddt_st_close(&f);
        }
    }
    return 0;
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
}

void ddt_run_config_print_reference(FILE *out)
{
    fprintf(out, "| field | type | default | bounds | meaning |\n|---|---|---|---|---|\n");
    static const char *const names[] = { "integer", "number", "number", "boolean", "string", "enum", "list" };
    for (int i = 0; i < FIELD_COUNT; i++) {
        const config_field *f = &fields[i];
        char dflt[64] = "", bounds[64] = "";
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
        } else if (f->type != F_LIST) {
            snprintf(dflt, sizeof dflt, "%g", f->dflt);
            snprintf(bounds, sizeof bounds, "[%g, %g]", f->lo, f->hi);
        }
        fprintf(out, "| `%s` | %s | %s | %s | %s |\n", f->path, names[f->type], dflt, bounds, f->help);
    }
}
