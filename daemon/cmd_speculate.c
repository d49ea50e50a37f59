/* cmd_speculate.c: `ddtreed speculate`: speculative decoding of a target with a drafter export,
 * read as a serving stack reads it (SPEC.md section 7): every prompt decoded by plain greedy
 * decoding of the target, by the drafter's chain (one block verified per target call) and by
 * the DDTree tree of each --tree budget, and the acceptance a server would see, tau_spec and
 * tau_spec_tree(K), with the greedy-equality verdict (the contract: speculative decoding is
 * lossless, so a mismatch is a bug and the exit status is 1). A DFlash2 drafter drafts along its
 * path selector (SPEC.md 2.1), so its figures are the selector's ("draft": "selector").
 *
 *   ddtreed speculate --target DIR --drafter EXPORT_DIR (--prompts FILE | --chat FILE.jsonl
 *                     --template qwen3|qwen3.5|qwen3.6) [--gen-len N] [--prompt-len P]
 *                     [--prompts-max K] [--tree K[,K2...]] [--stop ID] [--out FILE.json]
 *                     [--device cpu|cuda:N] [--weights fp32|bf16]
 *
 * The work is engine/eval/speculate.h's; this file reads and checks the inputs (the drafter against
 * the target field by field, each prompt against the target's context), and writes the result
 * as JSON: one summary line on stdout (the result without its per-prompt list), the whole of it
 * in --out (docs/formats.md, "Speculative decoding results").
 * Prompts: a token file's sequences, or --chat conversations each through its last user message
 * and the generation prompt (what the chat source regenerates from), `<|im_end|>` the stop.
 * Not here: sampling (greedy only, as the contract is stated).
 * Tested by tests/daemon/speculate_cli_test.sh (a tiny llama target written by the test, stories260K
 * when ../shared is present; the bad inputs) and tests/daemon/chat_train_test.sh (--chat with the
 * real Qwen3 tokenizer).
 */
#include "record/checkpoint.h"
#include "data/chat_tokens.h"
#include "commands.h"
#include "record/dir_kind.h"
#include "base/errors.h"
#include "data/shard.h"
#include "eval/speculate.h"
#include "model/target.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SPECULATE_USAGE                                                                                 \
    "usage: ddtreed speculate --target DIR --drafter EXPORT_DIR (--prompts FILE | --chat FILE.jsonl\n"   \
    "                         --template qwen3|qwen3.5|qwen3.6) [--gen-len N]\n"                        \
    "                         [--prompt-len P] [--prompts-max K] [--tree K[,K2...]] [--stop ID]\n"      \
    "                         [--out FILE.json] [--device cpu|cuda:N] [--weights fp32|bf16]\n"          \
    "  --prompts: a token file (input_ids I32, offsets I64), each sequence a prompt (its first\n"       \
    "  --prompt-len tokens when given); --gen-len: tokens generated per prompt (64); --tree: the\n"     \
    "  tree budgets K (nodes; the largest sizes the speculator); --stop: an end token id\n"            \
    "  --chat: conversations, each decoded from its last user message and the generation prompt\n"   \
    "  (TARGET/tokenizer.json, --template), stopping at <|im_end|> unless --stop says otherwise\n"

enum { SPEC_GEN_LEN_DEFAULT = 64, SPEC_MAX_BUDGET = DDT_MAX_SLOTS * DDT_MAX_SLOTS };

typedef struct spec_args {
    const char *target, *drafter, *prompts, *out, *device, *weights;
    const char *chat, *template_name;   /* --chat FILE.jsonl and its --template, instead of --prompts */
    int64_t gen_len, prompt_len, prompts_max, stop;   /* prompt_len, prompts_max 0: all; stop -1: none */
    int n_budgets;
    int64_t budgets[DDT_MAX_BUDGETS];
} spec_args;

/* "4,16": 1 to DDT_MAX_BUDGETS budgets in [1, SPEC_MAX_BUDGET]; 0, or -1 with why */
static int parse_budgets(const char *text, spec_args *a, char *why, size_t why_len)
{
    a->n_budgets = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',')) {
            snprintf(why, why_len, "--tree wants comma-separated node budgets, got '%s'", text);
            return -1;
        }
        if (v < 1 || v > SPEC_MAX_BUDGET) {
            snprintf(why, why_len, "--tree: %lld is not a node budget in [1, %d] (the tree's cap)", v,
                     SPEC_MAX_BUDGET);
            return -1;
        }
        if (a->n_budgets == DDT_MAX_BUDGETS) {
            snprintf(why, why_len, "--tree: at most %d budgets", DDT_MAX_BUDGETS);
            return -1;
        }
        a->budgets[a->n_budgets++] = v;
        p = *end ? end + 1 : end;
    }
    if (a->n_budgets == 0) {
        snprintf(why, why_len, "--tree wants at least one node budget");
        return -1;
    }
    return 0;
}

/* 0, 2 (usage: the sentence printed), or -1 for --help (printed) */
static int parse_args(int argc, char **argv, spec_args *a)
{
    *a = (spec_args){ .device = "cpu", .gen_len = SPEC_GEN_LEN_DEFAULT, .stop = -1 };
    char why[256] = "";
    for (int i = 1; i < argc && !why[0]; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(SPECULATE_USAGE, stdout);
            return -1;
        }
        const char **slot = !strcmp(k, "--target") ? &a->target : !strcmp(k, "--drafter") ? &a->drafter
                          : !strcmp(k, "--prompts") ? &a->prompts : !strcmp(k, "--out") ? &a->out
                          : !strcmp(k, "--chat") ? &a->chat : !strcmp(k, "--template") ? &a->template_name
                          : !strcmp(k, "--device") ? &a->device : !strcmp(k, "--weights") ? &a->weights : NULL;
        int64_t *number = !strcmp(k, "--gen-len") ? &a->gen_len : !strcmp(k, "--prompt-len") ? &a->prompt_len
                        : !strcmp(k, "--prompts-max") ? &a->prompts_max : !strcmp(k, "--stop") ? &a->stop : NULL;
        const int tree = !strcmp(k, "--tree");
        if ((!slot && !number && !tree) || !v) {
            snprintf(why, sizeof why, "%s %s", k, v ? "is not an option" : "needs a value");
        } else if (slot) {
            *slot = v;
        } else if (tree) {
            parse_budgets(v, a, why, sizeof why);
        } else if (ddt_parse_count(v, number) || (number != &a->stop && *number < 1) ||
                   (number == &a->stop && *number > INT32_MAX)) {
            snprintf(why, sizeof why, "%s wants a %s integer, got '%s'", k,
                     number == &a->stop ? "token id (non-negative)" : "positive", v);
        }
        i++;
    }
    ddt_chat_template tmpl;
    if (!why[0] && (!a->target || !a->drafter || !a->prompts == !a->chat))
        snprintf(why, sizeof why, "--target, --drafter and one of --prompts and --chat are required");
    else if (!why[0] && a->chat && (!a->template_name || ddt_chat_template_from_name(a->template_name, &tmpl)))
        snprintf(why, sizeof why, "--chat needs --template qwen3, qwen3.5 or qwen3.6");
    else if (!why[0] && !a->chat && a->template_name)
        snprintf(why, sizeof why, "--template goes with --chat");
    if (!why[0] && a->weights && strcmp(a->weights, "fp32") && strcmp(a->weights, "bf16"))
        snprintf(why, sizeof why, "--weights is fp32 or bf16, got '%s'", a->weights);
    if (why[0]) {
        fprintf(stderr, "ddtreed speculate: %s\n" SPECULATE_USAGE, why);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The inputs checked against each other: every refusal names the file and the field
 */

/* --drafter names an export (or a directory this cannot tell): 0; else -EINVAL with err saying
 * what it is and what to give instead */
static int drafter_is_export(const char *dir, char *err, size_t err_len)
{
    ddt_dir_kind kind = ddt_dir_kind_of(dir);
    const char *instead = kind == DDT_DIR_RUN ? "give its export, RUN_DIR/export (written when the run completes), "
                                                "or write one: ddtreed export RUN_DIR --out DIR"
                          : kind == DDT_DIR_CHECKPOINT ? "export it first: ddtreed export RUN_DIR --step N --out DIR"
                          : kind == DDT_DIR_STATE ? "give a run's export: DIR/runs/<id>/export"
                          : kind == DDT_DIR_MODEL ? "that is --target's; --drafter takes a drafter export (RUN_DIR/"
                                                    "export, or ddtreed export RUN_DIR --out DIR)"
                                                  : NULL;
    return instead ? ddt_fail(err, err_len, -EINVAL, "--drafter %s is %s, not a drafter export: %s", dir,
                              ddt_dir_kind_name(kind), instead)
                   : 0;
}

/* ddt_speculate_check_drafter, said with both files named */
static int check_drafter(const spec_args *a, const ddt_drafter_config *dc, const ddt_target_model *m, char *err,
                         size_t err_len)
{
    char why[512];
    int rc = ddt_speculate_check_drafter(m, dc, why, sizeof why);
    return rc ? ddt_fail(err, err_len, rc, "%s/config.json: %s (%s/config.json)", a->drafter, why, a->target) : 0;
}

/* One prompt: sequence s of the token file, its first prompt_len tokens. */
typedef struct spec_prompt {
    const int32_t *ids;   /* (P) into the token file's input_ids */
    int64_t P;
} spec_prompt;

/* The prompts (K of them) out of tf; every one non-empty and, with gen_len tokens after it,
 * within the target's context ctx */
static int pick_prompts(const spec_args *a, const ddt_shard_tokens *tf, int64_t ctx, spec_prompt *prompts,
                        int64_t K, int64_t *longest, char *err, size_t err_len)
{
    *longest = 1;
    for (int64_t s = 0; s < K; s++) {
        const int64_t len = tf->offsets[s + 1] - tf->offsets[s];
        const int64_t P = a->prompt_len && len > a->prompt_len ? a->prompt_len : len;
        if (P < 1)
            return ddt_fail(err, err_len, -EINVAL, "%s: prompt %lld (sequence %lld) is empty: a prompt needs a token",
                            a->prompts ? a->prompts : a->chat, (long long)s, (long long)s);
        if (P > ctx)
            return ddt_fail(err, err_len, -EINVAL,
                            "%s: prompt %lld has %lld tokens, longer than the target's context of %lld "
                            "(%s/config.json max_position_embeddings; --prompt-len cuts prompts)",
                            a->prompts ? a->prompts : a->chat, (long long)s, (long long)P, (long long)ctx, a->target);
        if (P + a->gen_len > ctx)
            return ddt_fail(err, err_len, -EINVAL,
                            "%s: prompt %lld's %lld tokens and --gen-len %lld pass the target's context of %lld "
                            "(%s/config.json max_position_embeddings)",
                            a->prompts ? a->prompts : a->chat, (long long)s, (long long)P, (long long)a->gen_len, (long long)ctx, a->target);
        prompts[s] = (spec_prompt){ tf->input_ids + tf->offsets[s], P };
        *longest = P > *longest ? P : *longest;
    }
    return 0;
}

/* --chat: every conversation's prompt as the chat source regenerates from it
 * (ddt_chat_tokens_prompt: through its last user message, then the generation prompt, SPEC.md
 * sections 7 and 8), encoded with TARGET/tokenizer.json and --template, into tf as a token file
 * would hold them; *im_end the end of an assistant turn. A refused line is skipped, named on
 * stderr (as `ddtreed tokenize` does); none kept is an error. */
static int chat_prompts(const spec_args *a, int64_t vocab, ddt_shard_tokens *tf, int32_t *im_end, char *err,
                        size_t err_len)
{
    char path[4200], why[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", a->target);
    ddt_chat_template tmpl = DDT_CHAT_TEMPLATE_QWEN3;
    ddt_chat_template_from_name(a->template_name, &tmpl);   /* checked by parse_args */
    ddt_tokenizer *tok = ddt_tokenizer_open(path, err, err_len);
    if (!tok)
        return -EINVAL;
    ddt_chat_template_options opt = ddt_chat_template_defaults(tmpl);
    ddt_chat_encoder e = { 0 };
    ddt_chat_file f = { 0 };
    int rc = ddt_chat_encoder_init(&e, tok, &opt, err, err_len) ? -EINVAL : 0;
    if (!rc && ddt_tokenizer_vocab_size(tok) > vocab)
        rc = ddt_fail(err, err_len, -EINVAL, "%s: the tokenizer's ids run to %lld, past the target's vocab_size "
                      "%lld: the tokenizer is not this target's", path, (long long)ddt_tokenizer_vocab_size(tok) - 1,
                      (long long)vocab);
    if (!rc)
        rc = ddt_chat_file_open(a->chat, &f, err, err_len);
    ddt_token_ids ids = { 0 };
    int32_t *all = NULL;         /* (total) every kept prompt back to back */
    int64_t *offsets = calloc(1, sizeof *offsets), total = 0, nseq = 0;   /* (nseq + 1) */
    if (!rc && !offsets)
        rc = ddt_fail(err, err_len, -ENOMEM, "out of memory for the prompts of %s", a->chat);
    for (int64_t i = 0; !rc && i < f.n_lines && (!a->prompts_max || nseq < a->prompts_max); i++) {
        size_t len;
        const char *line = ddt_chat_file_line(&f, i, &len);
        ddt_chat chat;
        ddt_chat_refusal r = ddt_chat_parse_line(line, len, &chat, why, sizeof why);
        if (r == DDT_CHAT_OK) {
            r = ddt_chat_tokens_prompt(&e, &chat, &ids, why, sizeof why);
            ddt_chat_free(&chat);
        }
        if (r != DDT_CHAT_OK) {
            fprintf(stderr, "ddtreed speculate: %s line %lld skipped (%s): %s\n", a->chat, (long long)i + 1,
                    ddt_chat_refusal_name(r), why);
            continue;
        }
        const int64_t T = (int64_t)ids.count;
        int32_t *grown = realloc(all, (size_t)(total + T) * sizeof *all);
        int64_t *more = grown ? realloc(offsets, (size_t)(nseq + 2) * sizeof *offsets) : NULL;
        if (grown)
            all = grown;
        if (!more) {
            rc = ddt_fail(err, err_len, -ENOMEM, "out of memory for the prompts of %s", a->chat);
            break;
        }
        offsets = more;
        memcpy(all + total, ids.ids, (size_t)T * sizeof *all);
        total += T;
        offsets[++nseq] = total;
    }
    if (!rc && nseq == 0)
        rc = ddt_fail(err, err_len, -EINVAL, "%s: no conversation gave a prompt (every line was refused, above)",
                      a->chat);
    if (!rc) {   /* as a token file's: copies from the CPU allocator (ddt_shard_tokens_close frees them) */
        *tf = (ddt_shard_tokens){ .total = total, .nseq = nseq, .ids_bytes = (size_t)total * sizeof(int32_t),
                                  .offsets_bytes = (size_t)(nseq + 1) * sizeof(int64_t) };
        tf->input_ids = ddk_malloc(ddk_allocator_cpu(), tf->ids_bytes);
        tf->offsets = ddk_malloc(ddk_allocator_cpu(), tf->offsets_bytes);
        if (tf->input_ids && tf->offsets) {
            memcpy(tf->input_ids, all, tf->ids_bytes);
            memcpy(tf->offsets, offsets, tf->offsets_bytes);
        } else {
            ddt_shard_tokens_close(tf);
            rc = ddt_fail(err, err_len, -ENOMEM, "out of memory for the prompts of %s", a->chat);
        }
    }
    free(all);
    free(offsets);
    *im_end = e.im_end;
    ddt_token_ids_free(&ids);
    ddt_chat_file_close(&f);
    ddt_chat_encoder_free(&e);
    ddt_tokenizer_close(tok);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The result as JSON (docs/formats.md)
 */

static cJSON *ids_json(const int32_t *ids, int64_t n)
{
    cJSON *arr = cJSON_CreateArray();
    for (int64_t i = 0; arr && i < n; i++)
        cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
    return arr;
}

static double per_second(int64_t tokens, double seconds)
{
    return seconds > 0 ? (double)tokens / seconds : 0.0;
}

/* everything but the per-prompt list; chain_n, tree_n: tokens each way generated in all */
static cJSON *summary_json(const spec_args *a, const ddt_drafter_config *dc, const ddt_speculate_totals *t,
                           int64_t chain_n, const int64_t *tree_n)
{
    double tau_tree[DDT_MAX_BUDGETS], calls_tree[DDT_MAX_BUDGETS], tps_tree[DDT_MAX_BUDGETS];
    for (int i = 0; i < t->n_budgets; i++) {
        tau_tree[i] = ddt_speculate_tau_tree(t, i);
        calls_tree[i] = (double)t->tree_calls[i];
        tps_tree[i] = per_second(tree_n[i], t->tree_seconds[i]);
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "tau_spec", ddt_speculate_tau(t));
    cJSON_AddItemToObject(o, "tau_spec_tree", ddt_speculate_budgets_json(t, tau_tree));
    cJSON *calls = cJSON_AddObjectToObject(o, "calls");
    cJSON_AddNumberToObject(calls, "chain", (double)t->chain_calls);
    cJSON_AddItemToObject(calls, "tree", ddt_speculate_budgets_json(t, calls_tree));
    cJSON *tps = cJSON_AddObjectToObject(o, "tokens_per_s");
    cJSON_AddNumberToObject(tps, "greedy", per_second(t->generated, t->greedy_seconds));
    cJSON_AddNumberToObject(tps, "chain", per_second(chain_n, t->chain_seconds));
    cJSON_AddItemToObject(tps, "tree", ddt_speculate_budgets_json(t, tps_tree));
    cJSON_AddBoolToObject(o, "greedy_equal", t->mismatched == 0);
    cJSON_AddNumberToObject(o, "prompt_count", (double)t->prompts);
    cJSON_AddNumberToObject(o, "generated", (double)t->generated);
    cJSON_AddStringToObject(o, "target", a->target);
    cJSON_AddStringToObject(o, "drafter", a->drafter);
    cJSON_AddStringToObject(o, "device", a->device);
    cJSON_AddNumberToObject(o, "gen_len", (double)a->gen_len);
    cJSON_AddNumberToObject(o, "block_size", (double)dc->block_size);
    cJSON_AddStringToObject(o, "draft", dc->dflash2 ? "selector" : "argmax");
    return o;
}

static cJSON *prompt_json(const ddt_speculate_params *p, const ddt_speculate_prompt_result *r, int64_t P)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "prompt_len", (double)P);
    cJSON_AddItemToObject(o, "generated", ids_json(r->greedy.tokens, r->greedy.n));
    cJSON_AddBoolToObject(o, "equal", r->equal);
    cJSON *calls = cJSON_AddObjectToObject(o, "calls");
    cJSON_AddNumberToObject(calls, "chain", (double)r->chain.calls);
    cJSON *tree = cJSON_AddObjectToObject(calls, "tree");
    for (int i = 0; i < p->n_budgets; i++) {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)p->budgets[i]);
        cJSON_AddNumberToObject(tree, key, (double)r->tree[i].calls);
    }
    return o;
}

static int write_json(const char *path, const cJSON *o, char *err, size_t err_len)
{
    char *text = cJSON_Print(o);
    FILE *f = text ? fopen(path, "w") : NULL;
    int rc = 0;
    if (!text)
        rc = ddt_fail(err, err_len, -ENOMEM, "%s: out of memory for the result", path);
    else if (!f)
        rc = ddt_fail(err, err_len, -errno, "%s: cannot write: %s", path, strerror(errno));
    else if (fputs(text, f) < 0 || fputc('\n', f) < 0 || fclose(f) != 0)
        rc = ddt_fail(err, err_len, -EIO, "%s: write failed", path);
    if (rc && f)
        fclose(f);
    free(text);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The command
 */

/* The backend of --device: 0, or 1 with the sentence printed */
static int pick_backend(const spec_args *a, const ddk_backend **be, long *gpu)
{
    char *end = NULL;
    *gpu = !strncmp(a->device, "cuda:", 5) && a->device[5] >= '0' && a->device[5] <= '9'
               ? strtol(a->device + 5, &end, 10) : -1;
    if (strcmp(a->device, "cpu") && (*gpu < 0 || *end)) {
        fprintf(stderr, "ddtreed speculate: --device is cpu or cuda:N, got '%s'\n" SPECULATE_USAGE, a->device);
        return 2;
    }
    char why[400];
    *be = *gpu < 0 ? ddk_backend_cpu() : ddk_backend_cuda_or_why((int)*gpu, why, sizeof why);
    if (!*be) {
        fprintf(stderr, "ddtreed speculate: --device %s: %s\n", a->device, why);
        return 1;
    }
    return 0;
}

int ddt_cmd_speculate(int argc, char **argv)
{
    spec_args a;
    int status = parse_args(argc, argv, &a);
    if (status)
        return status < 0 ? 0 : status;
    const ddk_backend *be;
    long gpu;
    if ((status = pick_backend(&a, &be, &gpu)))
        return status;

    char err[1536] = "";
    const ddt_target_options o = { .be = be, .bf16 = a.weights ? !strcmp(a.weights, "bf16") : gpu >= 0 };
    ddt_target_model m = { 0 };
    ddt_drafter_config dc;
    float *host_params = NULL;                      /* (P) ddt_export_read's */
    float *params = NULL;                           /* (P) be's memory */
    size_t param_bytes = 0;
    ddt_shard_tokens tf = { 0 };
    spec_prompt *prompts = NULL;                    /* (K) */
    ddt_speculator *s = NULL;
    cJSON *result = NULL, *prompt_list = NULL;
    int64_t ctx = 0, K = 0, longest = 1, mismatch_first = -1;
    int target_open = 0;

    int rc = ddt_target_open_with(a.target, &o, &m, err, sizeof err);
    target_open = rc == 0;
    if (!rc) rc = ddt_target_max_positions(a.target, &ctx, err, sizeof err);
    /* the configuration against the target first (a wrong hidden_size is said as such, not as
     * the tensor shapes it implies), then the whole export; each file against the export's
     * manifest before it is read */
    if (!rc) rc = drafter_is_export(a.drafter, err, sizeof err);
    if (!rc) rc = ddt_export_read_config(a.drafter, &dc, err, sizeof err);
    if (!rc) rc = check_drafter(&a, &dc, &m, err, sizeof err);
    if (!rc) rc = ddt_export_read(a.drafter, &dc, &host_params, err, sizeof err);
    if (!rc && a.stop >= m.vocab)
        rc = ddt_fail(err, sizeof err, -EINVAL,
                      "--stop %lld is outside the target's vocabulary of %lld (%s/config.json)", (long long)a.stop,
                      (long long)m.vocab, a.target);
    if (!rc && a.chat) {   /* conversations: <|im_end|> ends a generation unless --stop names another */
        int32_t im_end = -1;
        rc = chat_prompts(&a, m.vocab, &tf, &im_end, err, sizeof err);
        if (a.stop < 0)
            a.stop = im_end;
    } else if (!rc) {
        rc = ddt_shard_tokens_open(a.prompts, m.vocab, &tf, err, sizeof err);
    }
    if (!rc) {
        K = a.prompts_max && a.prompts_max < tf.nseq ? a.prompts_max : tf.nseq;
        prompts = calloc((size_t)K + 1, sizeof *prompts);
        rc = prompts ? pick_prompts(&a, &tf, ctx, prompts, K, &longest, err, sizeof err)
                     : ddt_fail(err, sizeof err, -ENOMEM, "out of memory for %lld prompts", (long long)K);
    }
    /* the drafter's weights in the backend's memory, as the speculator reads them */
    if (!rc) {
        ddt_param *table = malloc(DDT_MAX_PARAMS * sizeof *table);
        int64_t total = 0;
        if (table)
            ddt_drafter_param_table(&dc, table, &total);
        free(table);
        param_bytes = (size_t)total * sizeof(float);
        params = table ? ddk_malloc(be->alloc, param_bytes) : NULL;
        if (!params)
            rc = ddt_fail(err, sizeof err, -ENOMEM, "no memory on %s for the drafter's %lld parameters", a.device,
                          (long long)total);
        else {
            be->copy(be, params, host_params, param_bytes);
            be->synchronize(be);
        }
    }
    int64_t max_budget = 0;
    for (int i = 0; i < a.n_budgets; i++)
        max_budget = a.budgets[i] > max_budget ? a.budgets[i] : max_budget;   /* the planned cap */
    if (!rc) {
        char why[1024] = "";
        rc = ddt_speculator_open(&s, be, &m, &dc, longest, a.gen_len, max_budget, why, sizeof why);
        if (rc)
            ddt_fail(err, sizeof err, rc, "%s with %s: %s", a.target, a.drafter, why[0] ? why : strerror(-rc));
    }

    ddt_speculate_params p = { .gen_len = a.gen_len, .n_budgets = a.n_budgets, .stop = (int32_t)a.stop };
    memcpy(p.budgets, a.budgets, sizeof p.budgets);
    ddt_speculate_totals totals;
    ddt_speculate_totals_init(&totals, &p);
    int64_t chain_n = 0, tree_n[DDT_MAX_BUDGETS] = { 0 };
    prompt_list = rc ? NULL : cJSON_CreateArray();
    if (!rc && !prompt_list)
        rc = ddt_fail(err, sizeof err, -ENOMEM, "out of memory for the result");
    if (!rc) {
        ddt_drafter_weights w;
        ddt_drafter_bind(&dc, params, &w);
        for (int64_t i = 0; i < K && !rc; i++) {
            ddt_speculate_prompt_result r;
            char why[1024] = "";
            rc = ddt_speculate_prompt(s, &w, &p, prompts[i].ids, prompts[i].P, &r, why, sizeof why);
            if (rc) {
                ddt_fail(err, sizeof err, rc, "%s: prompt %lld: %s", a.prompts ? a.prompts : a.chat, (long long)i,
                         why[0] ? why : strerror(-rc));
                break;
            }
            ddt_speculate_totals_add(&totals, &r);
            chain_n += r.chain.n;
            for (int k = 0; k < p.n_budgets; k++)
                tree_n[k] += r.tree[k].n;
            if (!r.equal && mismatch_first < 0)
                mismatch_first = i;
            cJSON_AddItemToArray(prompt_list, prompt_json(&p, &r, prompts[i].P));
        }
    }
    if (!rc) {
        result = summary_json(&a, &dc, &totals, chain_n, tree_n);
        char *line = cJSON_PrintUnformatted(result);   /* the summary, before the prompts join it */
        if (line)
            printf("%s\n", line);
        free(line);
        cJSON_AddItemToObject(result, "prompts", prompt_list);
        prompt_list = NULL;
        if (a.out)
            rc = write_json(a.out, result, err, sizeof err);
    }

    cJSON_Delete(result);
    cJSON_Delete(prompt_list);
    if (s)
        ddt_speculator_close(s);
    if (params)
        ddk_free(be->alloc, params, param_bytes);
    free(host_params);
    free(prompts);
    ddt_shard_tokens_close(&tf);
    if (target_open)
        ddt_target_close(&m);
    if (rc) {
        fprintf(stderr, "ddtreed speculate: %s\n", err);
        return 1;
    }
    if (mismatch_first >= 0) {
        fprintf(stderr, "ddtreed speculate: %lld of %lld prompts (the first: prompt %lld) were not decoded exactly "
                "as plain greedy decoding: speculative decoding must be lossless, so this is a bug\n",
                (long long)totals.mismatched, (long long)totals.prompts, (long long)mismatch_first);
        return 1;
    }
    return 0;
}
