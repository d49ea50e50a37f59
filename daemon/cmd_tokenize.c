/* cmd_tokenize.c: `ddtreed tokenize`: JSON Lines conversations in, a token file out (input_ids,
 * offsets and the assistant-only loss_mask; docs/formats.md), by SPEC.md section 8: each line
 * parsed and normalised (chat_data.h), rendered by the named template and encoded with the
 * target's tokenizer.json (chat_tokens.h).
 *
 *   ddtreed tokenize --model DIR --chat FILE.jsonl [--chat FILE2.jsonl ...]
 *                    --template qwen3|qwen3.5|qwen3.6 --out FILE [--system-prompt TEXT]
 *                    [--train-only-last-turn] [--drop-reasoning] [--max-len N]
 *
 * A line that is refused is skipped, its file, line number, reason and message on stderr, and
 * counted; nothing else is harmed. A tokenizer.json of an unsupported kind, a template whose
 * control tokens the tokenizer lacks, a file that cannot be read or no conversation kept at all
 * fail before anything is written. --max-len cuts longer conversations (counted as truncated;
 * the drop rule applies after the cut). The counts go to stdout as one JSON object:
 * {"read", "kept", "dropped": {REASON: n}, "tokens", "masked_tokens", "truncated"}.
 * Tested by tests/daemon/chat_train_test.sh (the real Qwen3 tokenizer, generated lines, bad ones
 * among them). Speed: tests/bench/bench_tokenize.sh.
 */
#include "data/chat_tokens.h"
#include "commands.h"
#include "base/errors.h"
#include "data/shard.h"
#include "model/target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKENIZE_USAGE                                                                              \
    "usage: ddtreed tokenize --model DIR --chat FILE.jsonl [--chat FILE ...]\n"                     \
    "                        --template qwen3|qwen3.5|qwen3.6 --out FILE [--system-prompt TEXT]\n" \
    "                        [--train-only-last-turn] [--drop-reasoning] [--max-len N]\n"

enum { MAX_CHAT_FILES = 64 };

/* the token file being formed: every kept conversation back to back */
typedef struct token_file {
    int32_t *ids;
    uint8_t *mask;
    int64_t total, cap;
    int64_t *offsets;   /* (nseq + 1) */
    int64_t nseq, offsets_cap;
} token_file;

static void append(token_file *tf, const ddt_chat_tokens *t)
{
    const int64_t T = (int64_t)t->ids.count;
    if (tf->total + T > tf->cap) {
        int64_t cap = tf->cap ? tf->cap : 1 << 16;
        while (cap < tf->total + T)
            cap *= 2;
        tf->ids = realloc(tf->ids, (size_t)cap * sizeof *tf->ids);
        tf->mask = realloc(tf->mask, (size_t)cap);
        tf->cap = cap;
    }
    if (tf->nseq + 2 > tf->offsets_cap) {
        tf->offsets_cap = tf->offsets_cap ? 2 * tf->offsets_cap : 1024;
        tf->offsets = realloc(tf->offsets, (size_t)tf->offsets_cap * sizeof *tf->offsets);
    }
    if (!tf->ids || !tf->mask || !tf->offsets)
        ddk_fatal(__FILE__, __LINE__, "out of memory for %lld tokens", (long long)(tf->total + T));
    memcpy(tf->ids + tf->total, t->ids.ids, (size_t)T * sizeof *tf->ids);
    memcpy(tf->mask + tf->total, t->mask, (size_t)T);
    tf->offsets[tf->nseq] = tf->total;
    tf->total += T;
    tf->offsets[++tf->nseq] = tf->total;
}

static void print_counts(int64_t read, int64_t kept, const int64_t *dropped, const token_file *tf, int64_t masked,
                         int64_t truncated)
{
    printf("{\"read\": %lld, \"kept\": %lld, \"dropped\": {", (long long)read, (long long)kept);
    for (int r = 1, first = 1; r < DDT_CHAT_REFUSAL_COUNT; r++)
        if (dropped[r]) {
            printf("%s\"%s\": %lld", first ? "" : ", ", ddt_chat_refusal_name((ddt_chat_refusal)r),
                   (long long)dropped[r]);
            first = 0;
        }
    printf("}, \"tokens\": %lld, \"masked_tokens\": %lld, \"truncated\": %lld}\n", (long long)tf->total,
           (long long)masked, (long long)truncated);
}

/* every line of the files through the encoder into tf, counted; 0, or 1 (a file unreadable) */
static int tokenize_files(const ddt_chat_encoder *e, char *const *files, int n_files, int64_t max_len,
                          token_file *tf, int64_t *read, int64_t *dropped, int64_t *masked, int64_t *truncated)
{
    ddt_chat_tokens t = { 0 };
    char err[1024];
    for (int k = 0; k < n_files; k++) {
        ddt_chat_file f;
        if (ddt_chat_file_open(files[k], &f, err, sizeof err)) {
            fprintf(stderr, "ddtreed tokenize: %s\n", err);
            ddt_chat_tokens_free(&t);
            return 1;
        }
        for (int64_t i = 0; i < f.n_lines; i++) {
            size_t len;
            const char *line = ddt_chat_file_line(&f, i, &len);
            ++*read;
            ddt_chat_refusal why = ddt_chat_tokens_line(e, line, len, max_len, &t, err, sizeof err);
            if (why) {
                dropped[why]++;
                fprintf(stderr, "%s:%lld: %s: %s\n", files[k], (long long)i + 1, ddt_chat_refusal_name(why), err);
                continue;
            }
            append(tf, &t);
            *masked += t.masked;
            *truncated += t.truncated;
        }
        ddt_chat_file_close(&f);
    }
    ddt_chat_tokens_free(&t);
    return 0;
}

int ddt_cmd_tokenize(int argc, char **argv)
{
    const char *model = NULL, *template_name = NULL, *out = NULL, *system_prompt = NULL, *max_len_text = NULL;
    char *files[MAX_CHAT_FILES];
    int n_files = 0, last_turn = 0, drop_reasoning = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(TOKENIZE_USAGE, stdout);
            return 0;
        }
        if (!strcmp(k, "--train-only-last-turn") || !strcmp(k, "--drop-reasoning")) {
            *(k[2] == 't' ? &last_turn : &drop_reasoning) = 1;
            continue;
        }
        if (!strcmp(k, "--chat") && v && n_files < MAX_CHAT_FILES) {
            files[n_files++] = argv[++i];
            continue;
        }
        const char **slot = !strcmp(k, "--model") ? &model : !strcmp(k, "--template") ? &template_name
                          : !strcmp(k, "--out") ? &out : !strcmp(k, "--system-prompt") ? &system_prompt
                          : !strcmp(k, "--max-len") ? &max_len_text : NULL;
        if (!slot || !v) {
            fprintf(stderr, "ddtreed tokenize: %s %s\n" TOKENIZE_USAGE, k,
                    !strcmp(k, "--chat") && v ? "is given more than 64 times" : v ? "is not an option" : "needs a value");
            return 2;
        }
        *slot = v;
        i++;
    }
    char *end = NULL;
    const long long max_len = max_len_text ? strtoll(max_len_text, &end, 10) : 0;
    ddt_chat_template tmpl = DDT_CHAT_TEMPLATE_QWEN3;
    if (!model || !n_files || !template_name || !out) {
        fprintf(stderr, "ddtreed tokenize: --model, --chat, --template and --out are required\n" TOKENIZE_USAGE);
        return 2;
    }
    if (ddt_chat_template_from_name(template_name, &tmpl) || (max_len_text && (*end || max_len < 2))) {
        fprintf(stderr, "ddtreed tokenize: --template is qwen3, qwen3.5 or qwen3.6; --max-len an integer >= 2\n"
                TOKENIZE_USAGE);
        return 2;
    }

    char path[1100], err[1024] = "";
    snprintf(path, sizeof path, "%s/tokenizer.json", model);
    ddt_tokenizer *tok = ddt_tokenizer_open(path, err, sizeof err);
    if (!tok) {
        fprintf(stderr, "ddtreed tokenize: %s\n", err);
        return 1;
    }
    ddt_chat_template_options opt = ddt_chat_template_defaults(tmpl);
    opt.system_prompt = system_prompt;
    opt.train_only_last_turn = last_turn;
    opt.drop_reasoning = drop_reasoning;
    ddt_chat_encoder e;
    if (ddt_chat_encoder_init(&e, tok, &opt, err, sizeof err)) {
        fprintf(stderr, "ddtreed tokenize: %s: %s\n", path, err);
        ddt_tokenizer_close(tok);
        return 1;
    }
    /* the ids must be the target's: its config.json's vocabulary, where it says one */
    int64_t vocab = ddt_tokenizer_vocab_size(tok), hidden, declared = 0, layers;
    int tied;
    char why[512];
    if (ddt_target_config_shape(model, &hidden, &declared, &layers, &tied, why, sizeof why) == 0 && declared < vocab) {
        fprintf(stderr, "ddtreed tokenize: %s: the tokenizer's ids run to %lld, past the model's vocab_size %lld: "
                "the tokenizer is not this model's\n", model, (long long)vocab - 1, (long long)declared);
        ddt_chat_encoder_free(&e);
        ddt_tokenizer_close(tok);
        return 1;
    }

    token_file tf = { 0 };
    int64_t read = 0, dropped[DDT_CHAT_REFUSAL_COUNT] = { 0 }, masked = 0, truncated = 0;
    int rc = tokenize_files(&e, files, n_files, max_len, &tf, &read, dropped, &masked, &truncated);
    if (!rc && tf.nseq == 0) {
        fprintf(stderr, "ddtreed tokenize: no conversation of the %lld lines was kept (their reasons above); "
                "nothing written\n", (long long)read);
        rc = 1;
    }
    if (!rc && ddt_shard_tokens_write(out, tf.ids, tf.total, tf.offsets, tf.nseq, tf.mask, vocab, err, sizeof err)) {
        fprintf(stderr, "ddtreed tokenize: %s\n", err);
        rc = 1;
    }
    print_counts(read, tf.nseq, dropped, &tf, masked, truncated);
    free(tf.ids);
    free(tf.mask);
    free(tf.offsets);
    ddt_chat_encoder_free(&e);
    ddt_tokenizer_close(tok);
    return rc;
}
