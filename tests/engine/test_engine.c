/* test_engine.c: the engine's pieces that the oracle tests do not reach: configuration files
 * (every bad field an error naming the file and the field; the export's serving keys, optional
 * for old exports; a DFlash2 drafter's config.json read, every bad DFlash2 key, a DFlash2 key
 * beside DFlashDraftModel, an architecture ddtree does not implement and none refused by name),
 * the drafter's parameter table (names, shapes, order of SPEC.md section 2), initialisation, batch checks, the default target_layer_ids of SPEC.md section 3 (half to
 * even, a repeat refused by the resolve step), sliding_window >= block_size, the target's
 * max_position_embeddings as resolved, the synthetic target, and the bf16 step with the weights'
 * bf16 copy against the one without (the same bits on the CPU; the copy is what it reads), a
 * bf16 run's plan, and memory.card (libddk's device profiles: the names refused, the budget
 * against the card's memory, the card's memory as the plan's budget on GPU ranks).
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "check.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"
#include "model/drafter.h"
#include "model/model_config.h"
#include "run/planner.h"
#include "run/run_config.h"
#include "model/target.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[] = "/tmp/ddtree_test_engine.XXXXXX";

static void write_config(const char *json)
{
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    FILE *f = fopen(path, "w");
    fputs(json, f);
    fclose(f);
}

/* a drafter's sizes, between its architectures and its dflash_config */
#define DRAFTER_FIELDS                                                                          \
    " \"hidden_size\": 16, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"                \
    " \"num_key_value_heads\": 2, \"head_dim\": 8, \"intermediate_size\": 40, \"vocab_size\": 100," \
    " \"block_size\": 4, \"sliding_window\": 3, \"num_target_layers\": 7,"                      \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"rms_norm_eps\": 1e-6,"     \
    " \"rope_theta\": 10000,"
#define DRAFTER_OK                                                                              \
    "{\"architectures\": [\"DFlashDraftModel\"]," DRAFTER_FIELDS                                 \
    " \"dflash_config\": {\"mask_token_id\": 99, \"target_layer_ids\": [1, 3, 5]}"

static void config_with(const char *field, const char *value, char *out, size_t len);

static void test_drafter_config_ok(void)
{
    write_config(DRAFTER_OK "}");
    ddt_drafter_config c;
    char err[512] = "";
    int rc = ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
    check(rc == 0, "valid config refused: %s", err);
    check(c.hidden == 16 && c.layers == 2 && c.heads == 4 && c.kv_heads == 2 && c.head_dim == 8 &&
              c.intermediate == 40 && c.vocab == 100 && c.block_size == 4 && c.sliding_window == 3,
          "sizes read wrong");
    check(c.sliding[0] == 1 && c.sliding[1] == 0, "layer_types read wrong");
    check(c.taps == 3 && c.target_layer_ids[2] == 5 && c.mask_token_id == 99, "dflash_config read wrong");
    char json[2048];   /* rope_theta under rope_parameters (transformers 5, z-lab's DFlash2 exports) */
    config_with("rope_theta", "1", json, sizeof json);
    char *at = strstr(json, "\"rope_theta\": 1");
    snprintf(at, sizeof json - (size_t)(at - json), "\"rope_parameters\": {\"rope_theta\": 1000000}%s",
             strstr(DRAFTER_OK "}", "\"rope_theta\": 10000") + strlen("\"rope_theta\": 10000"));
    write_config(json);
    rc = ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
    check(rc == 0 && c.rope_theta == 1000000.0f, "rope_parameters.rope_theta not read (%g): %s",
          (double)c.rope_theta, err);
}

/* DRAFTER_OK with the value of one top-level field replaced */
static void config_with(const char *field, const char *value, char *out, size_t len)
{
    const char *base = DRAFTER_OK "}";
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", field);
    const char *at = strstr(base, key), *v = at + strlen(key), *end = v;
    int depth = 0;
    while (*end && (depth > 0 || (*end != ',' && *end != '}'))) {
        depth += *end == '[' || *end == '{';
        depth -= *end == ']' || *end == '}';
        end++;
    }
    snprintf(out, len, "%.*s %s%s", (int)(v - base), base, value, end);
}

/* each bad config must be refused with an error naming the field */
static void test_drafter_config_bad(void)
{
    static const struct { const char *field, *value, *named; } cases[] = {
        { "hidden_size", "-1", "hidden_size" },
        { "num_attention_heads", "3", "num_attention_heads" },
        { "head_dim", "7", "head_dim" },
        { "block_size", "1.5", "block_size" },
        { "layer_types", "[\"full_attention\"]", "layer_types" },
        { "layer_types", "[\"full_attention\", \"local\"]", "layer_types" },
        { "rope_theta", "\"big\"", "rope_theta" },
        { "dflash_config", "{\"mask_token_id\": 100, \"target_layer_ids\": [1]}", "mask_token_id" },
        { "dflash_config", "{\"mask_token_id\": 1, \"target_layer_ids\": []}", "target_layer_ids" },
        { "dflash_config", "{\"mask_token_id\": 1, \"target_layer_ids\": [7]}", "target_layer_ids" },
        { "dflash_config", "{\"mask_token_id\": 1, \"target_layer_ids\": [1, 6]}", "last layer" },
        { "dflash_config", "3", "dflash_config" },
    };
    char json[2048];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0] + 3; i++) {
        const char *named;
        if (i < sizeof cases / sizeof cases[0]) {
            config_with(cases[i].field, cases[i].value, json, sizeof json);
            named = cases[i].named;
        } else {   /* not an object, not JSON, a key twice */
            size_t k = i - sizeof cases / sizeof cases[0];
            snprintf(json, sizeof json, "%s", k == 0 ? "[1]" : k == 1 ? "{" : DRAFTER_OK ", \"block_size\": 8}");
            named = k == 0 ? "JSON object" : k == 1 ? "invalid JSON" : "block_size";
        }
        write_config(json);
        ddt_drafter_config c;
        char err[512] = "";
        int rc = ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
        check(rc == -EINVAL, "case %zu accepted (rc %d): %s", i, rc, json);
        check(strstr(err, named) && strstr(err, "config.json"),
              "case %zu: error '%s' does not name '%s' and the file", i, err, named);
    }
}

/* a DFlash2 drafter's config.json: DRAFTER_FIELDS with `top` after them (the is_causal pair, or
 * other top-level keys: "" for none) and dflash_config's `sizes` after mask_token_id and
 * target_layer_ids ("" for none) */
#define DFLASH2_SIZES "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4"
static void dflash2_config(const char *architecture, const char *top, const char *sizes, char *out, size_t len)
{
    snprintf(out, len, "{\"architectures\": [\"%s\"]," DRAFTER_FIELDS "%s%s \"dflash_config\": {\"mask_token_id\": 99,"
             " \"target_layer_ids\": [1, 3, 5]%s%s}}", architecture, top, top[0] ? "," : "", sizes[0] ? ", " : "",
             sizes);
}

/* a DFlash2 config.json read: the architecture and the four sizes; block_size in dflash_config
 * alone; is_causal may be absent without a sliding layer; the neutral values of the keys ddtree
 * does not implement pass */
static void test_drafter_config_dflash2(void)
{
    char json[2048], err[512] = "";
    ddt_drafter_config c;
    dflash2_config("DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"block_size\": 4", json, sizeof json);
    write_config(json);
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0, "a DFlash2 config refused: %s", err);
    check(c.dflash2 == 1 && c.conv_taps == 2 && c.conv_group_size == 4 && c.selector_rank == 8 &&
              c.selector_top_k == 4 && c.block_size == 4 && c.hidden == 16,
          "DFlash2 read wrong: dflash2 %d taps %lld gs %lld r %lld K %lld", c.dflash2, (long long)c.conv_taps,
          (long long)c.conv_group_size, (long long)c.selector_rank, (long long)c.selector_top_k);
    write_config(DRAFTER_OK "}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && c.dflash2 == 0 && c.conv_taps == 0 &&
              c.selector_rank == 0,
          "a DFlash config must read as DFlash with no DFlash2 sizes: %s", err);

    static const struct { const char *top, *sizes, *why; } ok[] = {
        { "\"is_causal\": false", DFLASH2_SIZES ", \"block_size\": 4, \"output_multiplier\": 1, "
          "\"final_logit_softcapping\": null, \"input_embedding_scale\": 1", "the neutral values" },
        { "\"is_causal\": false", DFLASH2_SIZES ", \"final_logit_softcapping\": 0", "softcapping 0 (off)" },
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        dflash2_config("DFlash2DraftModel", ok[i].top, ok[i].sizes, json, sizeof json);
        write_config(json);
        check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0, "%s refused: %s", ok[i].why, err);
    }
    /* block_size in dflash_config alone (z-lab's newer exports) */
    dflash2_config("DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"block_size\": 4", json, sizeof json);
    char *top = strstr(json, " \"block_size\": 4,");
    memmove(top, top + strlen(" \"block_size\": 4,"), strlen(top + strlen(" \"block_size\": 4,")) + 1);
    write_config(json);
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && c.block_size == 4,
          "block_size in dflash_config alone: %s (got %lld)", err, (long long)c.block_size);
    /* all full_attention: is_causal may be absent (the servers' default is then bidirectional) */
    dflash2_config("DFlash2DraftModel", "", DFLASH2_SIZES, json, sizeof json);
    top = strstr(json, "\"sliding_attention\"");
    memcpy(top, "\"full_attention\"   ", strlen("\"sliding_attention\""));
    write_config(json);
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && !c.sliding[0],
          "a DFlash2 config without a sliding layer and without is_causal: %s", err);
}

/* every bad DFlash2 key (and DFlash2's keys beside a DFlash architecture) refused, the error
 * naming the file and the field */
static void test_drafter_config_dflash2_bad(void)
{
    static const struct { const char *architecture, *top, *sizes, *named; } cases[] = {
        { "Qwen3ForCausalLM", "", "", "architectures" },
        { "DFlash3DraftModel", "\"is_causal\": false", DFLASH2_SIZES, "architectures" },
        { "DFlash2DraftModel\", \"DFlashDraftModel", "\"is_causal\": false", DFLASH2_SIZES, "architectures" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4", "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 2, \"selector_rank\": 8, \"selector_top_k\": 4", "dflash_config.conv_group_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_top_k\": 4", "dflash_config.selector_rank" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_rank\": 8", "dflash_config.selector_top_k" },
        { "DFlash2DraftModel", "\"is_causal\": false", "", "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 0, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4",
          "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 9, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4",
          "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",   /* longer than the block of 4 */
          "\"conv_kernel_size\": 5, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4",
          "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 1.5, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 4",
          "dflash_config.conv_kernel_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",   /* does not divide hidden_size 16 */
          "\"conv_kernel_size\": 2, \"conv_group_size\": 3, \"selector_rank\": 8, \"selector_top_k\": 4",
          "dflash_config.conv_group_size" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_rank\": 0, \"selector_top_k\": 4",
          "dflash_config.selector_rank" },
        { "DFlash2DraftModel", "\"is_causal\": false",   /* more than the vocabulary of 100 */
          "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": 101",
          "dflash_config.selector_top_k" },
        { "DFlash2DraftModel", "\"is_causal\": false",
          "\"conv_kernel_size\": 2, \"conv_group_size\": 4, \"selector_rank\": 8, \"selector_top_k\": \"4\"",
          "dflash_config.selector_top_k" },
        { "DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"block_size\": 8", "block_size" },
        { "DFlash2DraftModel", "\"is_causal\": true", DFLASH2_SIZES, "is_causal" },
        { "DFlash2DraftModel", "", DFLASH2_SIZES, "is_causal" },   /* absent, with a sliding layer */
        { "DFlash2DraftModel", "\"is_causal\": 0", DFLASH2_SIZES, "is_causal" },
        { "DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"output_multiplier\": 2",
          "dflash_config.output_multiplier" },
        { "DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"final_logit_softcapping\": 30",
          "dflash_config.final_logit_softcapping" },
        { "DFlash2DraftModel", "\"is_causal\": false", DFLASH2_SIZES ", \"input_embedding_scale\": 0.5",
          "dflash_config.input_embedding_scale" },
        { "DFlashDraftModel", "", "\"conv_kernel_size\": 2", "dflash_config.conv_kernel_size" },
        { "DFlashDraftModel", "", "\"selector_top_k\": 4", "dflash_config.selector_top_k" },
        { "DFlashDraftModel", "\"is_causal\": false", "", "is_causal" },   /* its sliding layer is causal */
        { "DFlashDraftModel", "\"is_causal\": true", "", "is_causal" },    /* its full layer is not */
    };
    char json[2048], err[512];
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dflash2_config(cases[i].architecture, cases[i].top, cases[i].sizes, json, sizeof json);
        write_config(json);
        ddt_drafter_config c;
        err[0] = '\0';
        int rc = ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
        check(rc == -EINVAL, "case %zu accepted (rc %d): %s", i, rc, json);
        check(strstr(err, cases[i].named) && strstr(err, "config.json"),
              "case %zu: error '%s' does not name '%s' and the file", i, err, cases[i].named);
    }
    /* a config.json without architectures: every export ddtree wrote has it */
    char bare[2048];
    dflash2_config("DFlashDraftModel", "", "", json, sizeof json);
    snprintf(bare, sizeof bare, "{%s", strchr(json, ']') + 2);
    write_config(bare);
    ddt_drafter_config c;
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == -EINVAL && strstr(err, "architectures is missing"),
          "a config.json without architectures must be refused by name: '%s'", err);
}

static void test_target_config(void)
{
    write_config("{\"model_type\": \"qwen3\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
                 " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64,"
                 " \"vocab_size\": 50, \"tie_word_embeddings\": true}");
    ddt_target_config c;
    char err[512] = "";
    check(ddt_target_config_load(tmpdir, &c, err, sizeof err) == 0, "valid target refused: %s", err);
    check(c.qwen3 && c.head_dim == 8 && c.tie_word_embeddings && c.kv_heads == 2,
          "defaults or fields read wrong (head_dim %lld)", (long long)c.head_dim);
    check(c.rope_theta == 10000.0f, "rope_theta defaults to 10000 (got %g)", (double)c.rope_theta);
    /* transformers 5 writes rope_theta under rope_parameters: read there, not defaulted */
    write_config("{\"model_type\": \"qwen3\", \"hidden_size\": 32, \"num_hidden_layers\": 3,"
                 " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 64,"
                 " \"vocab_size\": 50, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000}}");
    check(ddt_target_config_load(tmpdir, &c, err, sizeof err) == 0 && c.rope_theta == 1000000.0f,
          "rope_parameters.rope_theta not read (%g): %s", (double)c.rope_theta, err);
    write_config("{\"model_type\": \"qwen3_next\", \"hidden_size\": 32}");
    check(ddt_target_config_load(tmpdir, &c, err, sizeof err) == -EINVAL && strstr(err, "model_type"),
          "an unsupported model_type must be refused by name: '%s'", err);
    char missing[300];
    snprintf(missing, sizeof missing, "%s/nowhere", tmpdir);
    check(ddt_target_config_load(missing, &c, err, sizeof err) != 0 && strstr(err, "nowhere/config.json"),
          "a missing directory must name the file: '%s'", err);
}

static void test_param_table(void)
{
    write_config(DRAFTER_OK "}");
    ddt_drafter_config c;
    char err[512];
    ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
    static ddt_param p[DDT_MAX_PARAMS];
    int64_t total = 0;
    int n = ddt_drafter_param_table(&c, p, &total);
    check(n == 3 + 11 * 2, "%d parameters, want 25", n);
    check(!strcmp(p[0].name, "fc.weight") && p[0].shape[0] == 16 && p[0].shape[1] == 48, "fc.weight [H, L_t*H]");
    check(!strcmp(p[1].name, "hidden_norm.weight") && p[1].is_norm, "hidden_norm.weight second");
    check(!strcmp(p[4].name, "layers.0.self_attn.q_proj.weight") && p[4].shape[0] == 32 && p[4].shape[1] == 16,
          "q_proj [nh*d, H]: %s", p[4].name);
    check(!strcmp(p[5].name, "layers.0.self_attn.k_proj.weight") && p[5].shape[0] == 16, "k_proj [nkv*d, H]");
    check(!strcmp(p[7].name, "layers.0.self_attn.o_proj.weight") && p[7].shape[0] == 16 && p[7].shape[1] == 32,
          "o_proj [H, nh*d]");
    check(!strcmp(p[8].name, "layers.0.self_attn.q_norm.weight") && p[8].numel == 8 && p[8].is_norm, "q_norm [d]");
    check(!strcmp(p[12].name, "layers.0.mlp.down_proj.weight") && p[12].shape[0] == 16 && p[12].shape[1] == 40,
          "down_proj [H, I]");
    check(!strcmp(p[n - 1].name, "norm.weight"), "norm.weight last");
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        check(p[i].offset == sum, "%s not contiguous", p[i].name);
        sum += p[i].numel;
    }
    check(sum == total, "total %lld != sum %lld", (long long)total, (long long)sum);

    float *base = calloc((size_t)total, sizeof(float));
    ddt_drafter_weights w;
    ddt_drafter_bind(&c, base, &w);
    check(w.fc == base && w.layer[1].down_proj == base + p[23].offset && w.norm == base + p[24].offset,
          "bind does not follow the table");
    ddt_drafter_init(&c, base, 7);
    double sq = 0;
    for (int64_t i = 0; i < p[4].numel; i++)
        sq += (double)w.layer[0].q_proj[i] * w.layer[0].q_proj[i];
    double std = sqrt(sq / (double)p[4].numel);
    check(std > 0.015 && std < 0.025, "matrices should be N(0, 0.02^2): std %g", std);
    check(w.layer[1].q_norm[3] == 1.0f && w.hidden_norm[0] == 1.0f, "norms initialise to 1");
    float first = w.fc[0];
    ddt_drafter_init(&c, base, 7);
    check(w.fc[0] == first, "the same seed must give the same weights");
    ddt_drafter_init(&c, base, 8);
    check(w.fc[0] != first, "another seed must give other weights");
    free(base);
}

static void test_batch_check(void)
{
    write_config(DRAFTER_OK "}");
    ddt_drafter_config c;
    char err[512];
    ddt_drafter_config_load(tmpdir, &c, err, sizeof err);
    int32_t ids[2 * 6] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
    uint8_t mask[12] = { 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1 };
    float features[12 * 48] = { 0 }, teacher[12 * 16] = { 0 };
    int32_t anchors[4] = { 0, 3, 1, 0 };
    uint8_t keep[4] = { 1, 1, 1, 0 };
    ddt_batch b = { 2, 6, 2, ids, mask, features, teacher, anchors, keep, NULL };
    ddt_loss_config lc = { .gamma = 4.0f, .ce_target_teacher = 1 };
    check(ddt_batch_check(&c, &b, &lc, err, sizeof err) == 0, "valid batch refused: %s", err);
    ids[5] = 100;
    check(ddt_batch_check(&c, &b, &lc, err, sizeof err) == -EINVAL && strstr(err, "input_ids[0][5]"),
          "a token outside the vocabulary must be named: '%s'", err);
    ids[5] = 6;
    anchors[1] = 6;
    check(ddt_batch_check(&c, &b, &lc, err, sizeof err) == -EINVAL && strstr(err, "anchors[0][1]"),
          "an anchor >= S must be named: '%s'", err);
    anchors[1] = 3;
    keep[2] = 0;
    keep[3] = 1;
    check(ddt_batch_check(&c, &b, &lc, err, sizeof err) == -EINVAL && strstr(err, "keep[1]"),
          "kept blocks after padding must be refused: '%s'", err);
    keep[2] = 1;
    keep[3] = 0;
    b.teacher_hidden = NULL;
    check(ddt_batch_check(&c, &b, &lc, err, sizeof err) == -EINVAL && strstr(err, "teacher_hidden"),
          "teacher labels without teacher_hidden must be refused: '%s'", err);
}

static void test_default_taps(void)
{
    int32_t ids[5];
    ddt_target_default_taps(64, 5, ids);   /* Qwen3.6-27B-like: round(1 + i * 60 / 4) */
    check(ids[0] == 1 && ids[1] == 16 && ids[2] == 31 && ids[3] == 46 && ids[4] == 61,
          "taps for N=64, n=5: %d %d %d %d %d", ids[0], ids[1], ids[2], ids[3], ids[4]);
    ddt_target_default_taps(36, 1, ids);
    check(ids[0] == 18, "one drafter layer taps N/2: %d", ids[0]);
    ddt_target_default_taps(7, 3, ids);   /* 1 + 1.5 = 2.5: Python's round gives 2, not 3 */
    check(ids[0] == 1 && ids[1] == 2 && ids[2] == 4, "taps for N=7, n=3 (half to even): %d %d %d", ids[0], ids[1],
          ids[2]);
    ddt_target_default_taps(9, 5, ids);   /* 1 + 5/4 * i: 2.25, 3.5 -> 4, 4.75 */
    check(ids[0] == 1 && ids[1] == 2 && ids[2] == 4 && ids[3] == 5 && ids[4] == 6,
          "taps for N=9, n=5: %d %d %d %d %d", ids[0], ids[1], ids[2], ids[3], ids[4]);
}

/* a run config over a synthetic target of `layers` layers, a drafter of `drafter` layers */
static int parse_run(const char *drafter_json, int64_t layers, ddt_run_config *c, char *err, size_t len,
                     char *field, size_t field_len)
{
    char json[1024];
    snprintf(json, sizeof json, "{\"target\": {\"kind\": \"synthetic\", \"num_hidden_layers\": %lld}, "
             "\"drafter\": %s}", (long long)layers, drafter_json);
    return ddt_run_config_parse(json, strlen(json), c, err, len, field, field_len);
}

/* "auto" that repeats a layer is refused asking for explicit ids; distinct ones resolve */
static void test_auto_taps_refused(void)
{
    ddt_run_config c;
    char err[1024] = "", field[128] = "";
    int rc = parse_run("{\"num_hidden_layers\": 3, \"target_layer_ids\": \"auto\"}", 5, &c, err, sizeof err,
                       field, sizeof field);
    check(rc == 0, "parse: %s", err);
    rc = rc ? rc : ddt_run_config_resolve(&c, 64, 512, 5, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "drafter.target_layer_ids") && strstr(err, "[1, 2, 2]") &&
              strstr(err, "explicitly"),
          "stories260K-sized auto taps must be refused asking for ids: rc %d '%s'", rc, err);
    ddt_run_config_free(&c);
    rc = parse_run("{\"num_hidden_layers\": 3, \"target_layer_ids\": [1, 2, 3]}", 5, &c, err, sizeof err, field,
                   sizeof field);
    check(rc == 0 && ddt_run_config_resolve(&c, 64, 512, 5, err, sizeof err) == 0, "explicit ids refused: %s", err);
    ddt_run_config_free(&c);
    rc = parse_run("{\"num_hidden_layers\": 3}", 7, &c, err, sizeof err, field, sizeof field);
    check(rc == 0 && ddt_run_config_resolve(&c, 64, 512, 7, err, sizeof err) == 0 && c.drafter.taps == 3 &&
              c.drafter.target_layer_ids[1] == 2 && c.drafter.target_layer_ids[2] == 4,
          "auto over 7 layers: %s", err);
    ddt_run_config_free(&c);
}

/* a sliding layer needs sliding_window >= block_size; without one the window is not used */
static void test_sliding_window_rule(void)
{
    ddt_run_config c;
    char err[1024] = "", field[128] = "";
    int rc = parse_run("{\"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                       "\"sliding_window\": 3, \"block_size\": 4, \"target_layer_ids\": [1, 2]}", 4, &c, err,
                       sizeof err, field, sizeof field);
    check(rc == -EINVAL && !strcmp(field, "drafter.sliding_window") && strstr(err, "block_size") &&
              strstr(err, "training does not"),
          "a window below the block must be refused naming the field: rc %d [%s] '%s'", rc, field, err);
    rc = parse_run("{\"num_hidden_layers\": 2, \"layer_types\": [\"sliding_attention\", \"full_attention\"], "
                   "\"sliding_window\": 4, \"block_size\": 4}", 4, &c, err, sizeof err, field, sizeof field);
    check(rc == 0, "sliding_window = block_size refused: %s", err);
    if (rc == 0)
        ddt_run_config_free(&c);
    rc = parse_run("{\"num_hidden_layers\": 2, \"sliding_window\": 3, \"block_size\": 4}", 4, &c, err,
                   sizeof err, field, sizeof field);
    check(rc == 0, "a window below the block without sliding layers refused: %s", err);
    if (rc == 0)
        ddt_run_config_free(&c);
}

/* resolve takes max_position_embeddings from target.path's config.json (or its text_config), the
 * documented default where it is not said, and refuses a wrong one naming the field */
static void test_max_positions(void)
{
    char json[512], err[1024] = "", field[128] = "";
    snprintf(json, sizeof json, "{\"target\": {\"kind\": \"hf\", \"path\": \"%s\"}}", tmpdir);
    static const struct {
        const char *config;
        int64_t want;   /* -1: refused */
    } cases[] = {
        { "{\"max_position_embeddings\": 262144}", 262144 },
        { "{\"text_config\": {\"max_position_embeddings\": 131072}}", 131072 },
        { "{\"model_type\": \"llama\"}", DDT_MAX_POSITIONS_DEFAULT },
        { "{\"max_position_embeddings\": \"long\"}", -1 },
        { "{\"text_config\": {\"max_position_embeddings\": 0}}", -1 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_config(cases[i].config);
        ddt_run_config c;
        int rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
        check(rc == 0, "parse: %s", err);
        if (rc)
            continue;
        rc = ddt_run_config_resolve(&c, 64, 512, 8, err, sizeof err);
        if (cases[i].want < 0)
            check(rc == -EINVAL && strstr(err, "target.path") && strstr(err, "max_position_embeddings") &&
                      strstr(err, "config.json"),
                  "case %zu: a wrong max_position_embeddings must be refused naming it: rc %d '%s'", i, rc, err);
        else
            check(rc == 0 && c.drafter.max_positions == cases[i].want, "case %zu: rc %d max_positions %lld: %s", i,
                  rc, (long long)c.drafter.max_positions, err);
        ddt_run_config_free(&c);
    }
    ddt_run_config c;
    check(ddt_run_config_parse("{}", 2, &c, err, sizeof err, field, sizeof field) == 0, "parse {}: %s", err);
    int64_t n = 0;
    check(ddt_run_config_max_positions(&c, &n, err, sizeof err) == 0 && n == DDT_MAX_POSITIONS_DEFAULT,
          "a synthetic target's max_position_embeddings: %lld", (long long)n);
    ddt_run_config_free(&c);
}

/* the export's serving keys: read when there, absent in old exports, use_sliding_window false
 * with a sliding layer refused */
static void test_drafter_serving_keys(void)
{
    ddt_drafter_config c;
    char err[512] = "";
    write_config(DRAFTER_OK ", \"use_sliding_window\": true, \"max_position_embeddings\": 40960,"
                 " \"torch_dtype\": \"bfloat16\", \"dtype\": \"bfloat16\"}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && c.max_positions == 40960,
          "the serving keys: %s (max_positions %lld)", err, (long long)c.max_positions);
    write_config(DRAFTER_OK "}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && c.max_positions == 0,
          "an export without them: %s", err);
    write_config(DRAFTER_OK ", \"use_sliding_window\": false}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == -EINVAL && strstr(err, "use_sliding_window") &&
              strstr(err, "config.json"),
          "use_sliding_window false with a sliding layer must be refused: '%s'", err);
    write_config(DRAFTER_OK ", \"dtype\": 16}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == -EINVAL && strstr(err, "dtype"),
          "a dtype that is not a string must be refused: '%s'", err);
    write_config("{\"architectures\": [\"DFlashDraftModel\"], \"hidden_size\": 16, \"num_hidden_layers\": 1,"
                 " \"num_attention_heads\": 4,"
                 " \"num_key_value_heads\": 2, \"head_dim\": 8, \"intermediate_size\": 40, \"vocab_size\": 100,"
                 " \"block_size\": 4, \"use_sliding_window\": false, \"sliding_window\": null,"
                 " \"layer_types\": [\"full_attention\"], \"dflash_config\": {\"mask_token_id\": 99,"
                 " \"target_layer_ids\": [1]}}");
    check(ddt_drafter_config_load(tmpdir, &c, err, sizeof err) == 0 && c.sliding_window == 0 && !c.sliding[0],
          "no sliding layer, sliding_window null: %s", err);
}

/* the synthetic target: deterministic, its taps are the residual stream, causal */
static void test_synthetic_target(void)
{
    ddt_target_config cfg = { .qwen3 = 1, .hidden = 16, .layers = 3, .heads = 4, .kv_heads = 2,
                              .head_dim = 4, .intermediate = 24, .vocab = 40,
                              .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f };
    static ddt_target t;
    char err[256];
    check(ddt_target_synthetic(&cfg, 3, &t, err, sizeof err) == 0, "synthetic target: %s", err);
    int32_t tokens[7] = { 1, 5, 9, 2, 39, 0, 7 }, taps[2] = { 2, 0 };
    float f1[7 * 32], h1[7 * 16], f2[7 * 32], h2[7 * 16];
    check(ddt_target_forward(ddk_backend_cpu(), &t, tokens, 7, taps, 2, f1, h1) == 0, "forward failed");
    check(ddt_target_forward(ddk_backend_cpu(), &t, tokens, 5, taps, 2, f2, h2) == 0, "forward failed");
    double diff = 0;
    for (int i = 0; i < 5 * 16; i++)
        diff = fmax(diff, fabs(h1[i] - h2[i]));
    check(diff < 1e-5, "causal: a prefix's hidden states do not depend on later tokens (diff %g)", diff);
    double rms = 0;
    for (int i = 0; i < 16; i++)
        rms += (double)h1[i] * h1[i];
    check(fabs(sqrt(rms / 16) - 1.0) < 1e-3, "the final norm has unit RMS with unit gains: %g", sqrt(rms / 16));
    int32_t bad_tap = 3;
    check(ddt_target_forward(ddk_backend_cpu(), &t, tokens, 7, &bad_tap, 1, f1, h1) == -EINVAL,
          "a tap beyond the last layer must be refused");
    ddt_target_free(&t);
}

/* The plan of a bf16 run (ddt_plan's arithmetic, which the trainer allocates): the weights' bf16
 * copy (2 bytes a parameter) on every rank, the bf16 step's activations (gate and up in bf16,
 * the staging), and on GPU ranks a bf16 copy of the frozen head instead of fp32 (train/ranks.c
 * round_host_head) */
static void test_plan_bf16(void)
{
    ddt_run_config c;
    char err[1024] = "", field[128] = "";
    int rc = parse_run("{\"num_hidden_layers\": 2, \"target_layer_ids\": [1, 2, 3]}", 5, &c, err, sizeof err,
                       field, sizeof field);
    check(rc == 0 && ddt_run_config_resolve(&c, 64, 512, 5, err, sizeof err) == 0, "config: %s", err);
    if (rc)
        return;
    ddt_param table[DDT_MAX_PARAMS];
    int64_t total;
    ddt_drafter_param_table(&c.drafter, table, &total);
    const int64_t VH = c.drafter.vocab * c.drafter.hidden;
    ddt_memory_plan p[2][2];   /* [gpu][bf16] */
    for (int gpu = 0; gpu < 2; gpu++)
        for (int bf16 = 0; bf16 < 2; bf16++) {
            c.bf16 = bf16;
            check(ddt_plan(&c, 0, 0, NULL, gpu, 0, 0, &p[gpu][bf16]) == 0, "plan gpu %d bf16 %d", gpu, bf16);
        }
    for (int gpu = 0; gpu < 2; gpu++) {
        check(p[gpu][0].weights == 4 * total && p[gpu][1].weights == 6 * total,
              "gpu %d: weights %lld (fp32), %lld (bf16); want %lld and %lld", gpu,
              (long long)p[gpu][0].weights, (long long)p[gpu][1].weights, (long long)(4 * total),
              (long long)(6 * total));
        /* the step's own sizing: gate and up in bf16, the three staging buffers */
        const int64_t micro = p[gpu][1].positions / (c.max_anchors * c.drafter.block_size);
        const int teacher = c.ce_target_teacher || c.kl_weight > 0.0f;
        const int64_t want16 = (int64_t)ddt_drafter_step_bytes(&c.drafter, micro, c.seq_len, c.max_anchors,
                                                               teacher, 1, 1),
                      want32 = (int64_t)ddt_drafter_step_bytes(&c.drafter, micro, c.seq_len, c.max_anchors,
                                                               teacher, 0, 0);
        check(p[gpu][1].activations == want16 && p[gpu][0].activations == want32 && want16 != want32,
              "gpu %d: activations %lld (bf16), %lld (fp32); the step sizes them %lld and %lld", gpu,
              (long long)p[gpu][1].activations, (long long)p[gpu][0].activations, (long long)want16,
              (long long)want32);
        check(p[gpu][0].frozen_head == 2 * VH * 4, "gpu %d fp32: frozen head %lld", gpu,
              (long long)p[gpu][0].frozen_head);
    }
    check(p[1][1].frozen_head == 2 * VH * 2 && p[0][1].frozen_head == 2 * VH * 4,
          "bf16: the frozen head is bf16 on a GPU (%lld), fp32 on a CPU rank (%lld)",
          (long long)p[1][1].frozen_head, (long long)p[0][1].frozen_head);
    ddt_run_config_free(&c);
}

/* memory.card: a profile's name is that profile; an unknown one is refused naming memory.card and
 * every card known; a budget is at most the card's memory; the plan's budget is the card's memory
 * on GPU ranks when none is given, the budget given otherwise, none on CPU ranks. The figures are
 * libddk's table's (ddk_device_profiles), not restated here. */
static void test_memory_card(void)
{
    int count = 0;
    const ddk_device_profile *all = ddk_device_profiles(&count), *card = ddk_device_profile_find("rtx-pro-6000");
    check(count > 0 && card, "libddk knows no rtx-pro-6000 (%d profiles)", count);
    if (!card)
        return;
    char json[512], err[1024] = "", field[128] = "";
    ddt_run_config c;
    const char *drafter = "\"drafter\": {\"target_layer_ids\": [1, 2]}";
    snprintf(json, sizeof json, "{%s, \"memory\": {\"card\": \"RTX-PRO-6000\"}}", drafter);
    int rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
    check(rc == 0 && c.card == card, "memory.card \"RTX-PRO-6000\": rc %d '%s'", rc, err);
    if (rc == 0) {
        rc = ddt_run_config_resolve(&c, 64, 512, 5, err, sizeof err);
        check(rc == 0, "resolve: %s", err);
        ddt_memory_plan gpu, cpu;
        ddt_plan(&c, 0, 0, NULL, 1, 0, 0, &gpu);
        ddt_plan(&c, 0, 0, NULL, 0, 0, 0, &cpu);
        check(gpu.budget == card->memory_bytes && gpu.budget_card && cpu.budget == 0 && !cpu.budget_card,
              "the plan's budget: %lld on GPU ranks (want the card's %lld), %lld on CPU ranks (want none)",
              (long long)gpu.budget, (long long)card->memory_bytes, (long long)cpu.budget);
        ddt_plan(&c, card->memory_bytes / 2, 0, NULL, 1, 0, 0, &gpu);
        check(gpu.budget == card->memory_bytes / 2 && !gpu.budget_card, "a budget given is the plan's: %lld",
              (long long)gpu.budget);
        char *text = ddt_plan_json(&c, &gpu, NULL);
        check(text && strstr(text, "\"card\":{\"name\":\"rtx-pro-6000\"") && strstr(text, "\"budget_from\":\"given\""),
              "the plan's JSON names the card: %s", text ? text : "(null)");
        free(text);
        check(ddt_run_config_check_budget(&c, card->memory_bytes, "--budget", err, sizeof err) == 0,
              "the card's whole memory refused as a budget: %s", err);
        rc = ddt_run_config_check_budget(&c, card->memory_bytes + 1, "--budget", err, sizeof err);
        check(rc == -EINVAL && strstr(err, "--budget") && strstr(err, "rtx-pro-6000"),
              "a budget a byte beyond the card: rc %d '%s'", rc, err);
        ddt_run_config_free(&c);
    }
    snprintf(json, sizeof json, "{%s, \"memory\": {\"card\": \"rtx6000\"}}", drafter);
    rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
    int named = rc == -EINVAL && !strcmp(field, "memory.card") && strstr(err, "\"rtx6000\"");
    for (int i = 0; i < count; i++)
        named &= strstr(err, all[i].name) != NULL;
    check(named, "an unknown card must be refused naming memory.card and every card known: rc %d '%s' '%s'", rc,
          field, err);
    snprintf(json, sizeof json, "{%s, \"memory\": {\"card\": \"rtx-pro-6000\", \"budget_bytes\": %lld}}", drafter,
             (long long)card->memory_bytes + 1);
    rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
    check(rc == -EINVAL && !strcmp(field, "memory.budget_bytes") && strstr(err, "beyond the rtx-pro-6000's memory"),
          "memory.budget_bytes beyond the card must be refused: rc %d '%s' '%s'", rc, field, err);
    snprintf(json, sizeof json, "{%s, \"memory\": {\"card\": null, \"budget_bytes\": %lld}}", drafter,
             (long long)card->memory_bytes + 1);
    rc = ddt_run_config_parse(json, strlen(json), &c, err, sizeof err, field, sizeof field);
    check(rc == 0 && c.card == NULL && c.budget_bytes == card->memory_bytes + 1,
          "without a card a budget has no bound but its own: rc %d '%s'", rc, err);
    if (rc == 0)
        ddt_run_config_free(&c);
}

/* The bf16 step with the weights' bf16 copy (w->bf16: be->round_bf16 + be->matmul_16) is the
 * bf16 step without it (be->matmul_bf16 rounding both operands in every product) bit for bit on
 * the CPU: loss and every gradient. And the copy is what it reads: a copy that is not the
 * weights rounded (one matrix halved) changes the result. Sizes past the 256-column panel of
 * the bf16 products (L_t*H = 3 x 96 = 288), two layers (sliding, full), KL and CAP on. */
static void test_step_bf16_copies(void)
{
    ddt_drafter_config c = { .hidden = 96, .layers = 2, .heads = 4, .kv_heads = 2, .head_dim = 8,
                             .intermediate = 40, .vocab = 300, .block_size = 4, .sliding_window = 5,
                             .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f, .taps = 3,
                             .mask_token_id = 299, .num_target_layers = 7 };
    c.sliding[0] = 1;
    c.target_layer_ids[0] = 1, c.target_layer_ids[1] = 3, c.target_layer_ids[2] = 5;
    char err[256];
    check(ddt_drafter_config_check(&c, err, sizeof err) == 0, "config: %s", err);
    const ddk_backend *cpu = ddk_backend_cpu();
    ddt_param table[DDT_MAX_PARAMS];
    int64_t total;
    ddt_drafter_param_table(&c, table, &total);
    enum { NSEQ = 2, S = 19, A = 3 };
    const int64_t H = c.hidden, V = c.vocab, LH = c.taps * H;
    float *params = malloc((size_t)total * sizeof(float));
    float *g_plain = calloc((size_t)total, sizeof(float)), *g_copy = calloc((size_t)total, sizeof(float)),
          *g_wrong = calloc((size_t)total, sizeof(float));
    uint16_t *copy = malloc((size_t)total * sizeof(uint16_t));
    float *embed = malloc((size_t)(V * H) * sizeof(float)), *head = malloc((size_t)(V * H) * sizeof(float));
    float *features = malloc((size_t)(NSEQ * S * LH) * sizeof(float));
    float *teacher = malloc((size_t)(NSEQ * S * H) * sizeof(float));
    int32_t ids[NSEQ * S], anchors[NSEQ * A];
    uint8_t mask[NSEQ * S], keep[NSEQ * A];
    check(params && g_plain && g_copy && g_wrong && copy && embed && head && features && teacher,
          "no memory");
    ddt_drafter_init(&c, params, 7);
    uint64_t rng = 99;
    for (int64_t i = 0; i < V * H; i++) {
        embed[i] = (float)(0.5 * ddk_rng_normal(&rng));
        head[i] = (float)(0.1 * ddk_rng_normal(&rng));
    }
    for (int64_t i = 0; i < NSEQ * S * LH; i++)
        features[i] = (float)ddk_rng_normal(&rng);
    for (int64_t i = 0; i < NSEQ * S * H; i++)
        teacher[i] = (float)ddk_rng_normal(&rng);
    for (int64_t i = 0; i < NSEQ * S; i++) {
        ids[i] = (int32_t)(ddk_rng_next(&rng) % (uint64_t)(V - 1));
        mask[i] = i % 7 != 3;
    }
    for (int64_t s = 0; s < NSEQ; s++)
        for (int64_t j = 0; j < A; j++) {
            anchors[s * A + j] = (int32_t)(1 + j * 5 + s);
            keep[s * A + j] = s == 0 || j < 2;   /* one padded block */
        }
    ddt_batch b = { NSEQ, S, A, ids, mask, features, teacher, anchors, keep, NULL };
    ddt_loss_config lc = { .gamma = 4.0f, .ce_target_teacher = 1,
                           .loss = { .chunk = 7, .kl_weight = 0.3f, .kl_temperature = 2.0f,
                                     .cap_weight = 0.1f, .cap_temperature = 1.5f, .bf16_products = 1 } };
    const ddt_head h = { embed, head, 0 };
    ddt_drafter_weights w, g;
    ddt_drafter_bind(&c, params, &w);
    check(w.bf16 == NULL, "ddt_drafter_bind leaves no bf16 copy");
    ddk_loss_result plain, copied, wrong;
    ddt_drafter_bind(&c, g_plain, &g);
    check(ddt_drafter_step(cpu, &c, &w, &g, &h, &b, &lc, &plain) == 0, "the bf16 step failed");

    cpu->round_bf16(cpu, params, total, copy);
    w.bf16 = copy;
    ddt_drafter_bind(&c, g_copy, &g);
    check(ddt_drafter_step(cpu, &c, &w, &g, &h, &b, &lc, &copied) == 0, "the bf16 step with copies failed");
    check(isfinite(plain.loss) && plain.counted > 0, "loss %g over %lld positions", plain.loss,
          (long long)plain.counted);
    check(memcmp(&plain.loss, &copied.loss, sizeof plain.loss) == 0 && plain.ce == copied.ce &&
              plain.kl == copied.kl && plain.cap == copied.cap && plain.correct == copied.correct,
          "with copies the loss is %.17g, without %.17g: not the same bits", copied.loss, plain.loss);
    int64_t differ = 0;
    for (int64_t i = 0; i < total; i++)
        differ += memcmp(&g_plain[i], &g_copy[i], sizeof(float)) != 0;
    check(differ == 0, "%lld of %lld gradients differ with copies (bit for bit expected)",
          (long long)differ, (long long)total);

    /* a copy that is not the weights: the step must read it */
    const ddt_param *q = &table[2 + 2];   /* layers.0.self_attn.q_proj.weight */
    check(strcmp(q->name, "layers.0.self_attn.q_proj.weight") == 0, "table order: %s", q->name);
    for (int64_t i = 0; i < q->numel; i++)
        copy[q->offset + i] = ddk_f32_to_bf16(0.5f * params[q->offset + i]);
    ddt_drafter_bind(&c, g_wrong, &g);
    check(ddt_drafter_step(cpu, &c, &w, &g, &h, &b, &lc, &wrong) == 0, "the step failed");
    check(wrong.loss != plain.loss, "a halved q_proj copy left the loss at %.17g: the copy is not read",
          wrong.loss);
    /* and without bf16 products the copy is ignored: the fp32 step */
    lc.loss.bf16_products = 0;
    ddk_loss_result fp32_a, fp32_b;
    ddt_drafter_bind(&c, g_wrong, &g);
    check(ddt_drafter_step(cpu, &c, &w, &g, &h, &b, &lc, &fp32_a) == 0, "the fp32 step failed");
    w.bf16 = NULL;
    check(ddt_drafter_step(cpu, &c, &w, &g, &h, &b, &lc, &fp32_b) == 0, "the fp32 step failed");
    check(fp32_a.loss == fp32_b.loss && fp32_a.loss != plain.loss,
          "the fp32 step read the bf16 copy (loss %.17g with it, %.17g without)", fp32_a.loss, fp32_b.loss);
    free(params), free(g_plain), free(g_copy), free(g_wrong), free(copy), free(embed), free(head);
    free(features), free(teacher);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    static const test_case cases[] = {
        { "drafter config read", test_drafter_config_ok },
        { "drafter config errors name the field", test_drafter_config_bad },
        { "DFlash2 drafter config read", test_drafter_config_dflash2 },
        { "DFlash2 drafter config errors name the field", test_drafter_config_dflash2_bad },
        { "target config", test_target_config },
        { "parameter table, bind, init", test_param_table },
        { "batch checks", test_batch_check },
        { "default target_layer_ids", test_default_taps },
        { "auto target_layer_ids that repeat a layer refused", test_auto_taps_refused },
        { "sliding_window >= block_size", test_sliding_window_rule },
        { "the target's max_position_embeddings resolved", test_max_positions },
        { "the export's serving keys read", test_drafter_serving_keys },
        { "synthetic target", test_synthetic_target },
        { "the bf16 step with the weights' bf16 copy: the same bits", test_step_bf16_copies },
        { "a bf16 run's plan: the weights' copy, staging, a bf16 head on GPUs", test_plan_bf16 },
        { "memory.card: known cards, the budget against the card's memory", test_memory_card },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    char path[256];
    snprintf(path, sizeof path, "%s/config.json", tmpdir);
    unlink(path);
    rmdir(tmpdir);
    return cases_summary();
}
