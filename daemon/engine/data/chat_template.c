/* chat_template.c: the qwen3 / qwen3.5 / qwen3.6 chat templates in C (chat_template.h).
 * Each step names the Jinja expression it stands for; Python string semantics are kept where
 * the templates rely on them (str.strip() with no argument strips Unicode whitespace, split()
 * on "</think>" takes the first and last pieces). Tested by tests/engine/data/test_chat_template.c.
 */
#include "chat_template.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ddt_chat_template_from_name(const char *name, ddt_chat_template *tmpl)
{
    static const ddt_chat_template all[] = {DDT_CHAT_TEMPLATE_QWEN3, DDT_CHAT_TEMPLATE_QWEN35,
                                            DDT_CHAT_TEMPLATE_QWEN36};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (strcmp(name, ddt_chat_template_name(all[i])) == 0) {
            *tmpl = all[i];
            return 0;
        }
    return -EINVAL;
}

const char *ddt_chat_template_name(ddt_chat_template tmpl)
{
    switch (tmpl) {
    case DDT_CHAT_TEMPLATE_QWEN3: return "qwen3";
    case DDT_CHAT_TEMPLATE_QWEN35: return "qwen3.5";
    case DDT_CHAT_TEMPLATE_QWEN36: return "qwen3.6";
    }
    return "unknown";
}

ddt_chat_template_options ddt_chat_template_defaults(ddt_chat_template tmpl)
{
    return (ddt_chat_template_options){.tmpl = tmpl, .enable_thinking = 1};
}

const char *const *ddt_chat_qwen_special_tokens(int *n)
{
    static const char *const specials[] = {
        "<|endoftext|>",    "<|im_start|>",     "<|im_end|>",     "<|object_ref_start|>",
        "<|object_ref_end|>", "<|box_start|>",  "<|box_end|>",    "<|quad_start|>",
        "<|quad_end|>",     "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
        "<|image_pad|>",    "<|video_pad|>"};
    *n = (int)(sizeof specials / sizeof specials[0]);
    return specials;
}


// ----------------------------------------------------------------------------
// string views with Python's semantics

typedef struct sv {
    const char *p;
    size_t n;
} sv;

static sv sv_of(const char *s) { return (sv){s, strlen(s)}; }

static long sv_find(sv s, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= s.n; i++)
        if (memcmp(s.p + i, needle, k) == 0)
            return (long)i;
    return -1;
}

static long sv_rfind(sv s, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = s.n + 1; i-- > 0;)
        if (i + k <= s.n && memcmp(s.p + i, needle, k) == 0)
            return (long)i;
    return -1;
}

static int sv_starts(sv s, const char *prefix)
{
    size_t k = strlen(prefix);
    return s.n >= k && memcmp(s.p, prefix, k) == 0;
}

static int sv_ends(sv s, const char *suffix)
{
    size_t k = strlen(suffix);
    return s.n >= k && memcmp(s.p + s.n - k, suffix, k) == 0;
}

static sv sv_lstrip_nl(sv s)   // .lstrip('\n')
{
    while (s.n && s.p[0] == '\n')
        s.p++, s.n--;
    return s;
}

static sv sv_rstrip_nl(sv s)   // .rstrip('\n')
{
    while (s.n && s.p[s.n - 1] == '\n')
        s.n--;
    return s;
}

/* str.isspace() of one code point (Unicode White_Space as Python 3 defines it) */
static int py_isspace(uint32_t cp)
{
    return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
           cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
           cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

/* the code point of the valid UTF-8 sequence at s (its length in *len) */
static uint32_t utf8_at(const unsigned char *s, size_t *len)
{
    if (s[0] < 0x80)
        return *len = 1, s[0];
    if ((s[0] & 0xE0) == 0xC0)
        return *len = 2, ((uint32_t)(s[0] & 0x1F) << 6) | (s[1] & 0x3F);
    if ((s[0] & 0xF0) == 0xE0)
        return *len = 3,
               ((uint32_t)(s[0] & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    return *len = 4, ((uint32_t)(s[0] & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                         ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

static sv sv_trim(sv s)   // Jinja's |trim: str.strip()
{
    size_t len;
    while (s.n && py_isspace(utf8_at((const unsigned char *)s.p, &len)))
        s.p += len, s.n -= len;
    while (s.n) {
        size_t start = s.n - 1;
        while (start > 0 && ((unsigned char)s.p[start] & 0xC0) == 0x80)
            start--;
        if (!py_isspace(utf8_at((const unsigned char *)s.p + start, &len)))
            break;
        s.n = start;
    }
    return s;
}

/* content.split('</think>')[-1].lstrip('\n') */
static sv after_think(sv content)
{
    long last = sv_rfind(content, "</think>");
    return last < 0 ? content : sv_lstrip_nl((sv){content.p + last + 8, content.n - last - 8});
}

/* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
static sv think_of(sv content)
{
    sv before = sv_rstrip_nl((sv){content.p, (size_t)sv_find(content, "</think>")});
    long open = sv_rfind(before, "<think>");
    if (open >= 0)
        before = (sv){before.p + open + 7, before.n - open - 7};
    return sv_lstrip_nl(before);
}

// ----------------------------------------------------------------------------
// the output text

typedef struct text_buf {
    char *p;
    size_t len, cap;
} text_buf;

static void put(text_buf *b, const char *p, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *grown = realloc(b->p, cap);
        if (!grown)
            abort();
        b->p = grown, b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void put_s(text_buf *b, const char *s) { put(b, s, strlen(s)); }
static void put_sv(text_buf *b, sv s) { put(b, s.p, s.n); }

/* json.dumps(string, ensure_ascii=False) */
static void put_json_string(text_buf *b, const char *s)
{
    put_s(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n"
                        : c == '\r' ? "\\r" : c == '\t' ? "\\t" : c == '\b' ? "\\b"
                        : c == '\f' ? "\\f" : NULL;
        char hex[8];
        if (!esc && c < 0x20) {
            snprintf(hex, sizeof hex, "\\u%04x", c);
            esc = hex;
        }
        if (esc)
            put_s(b, esc);
        else
            put(b, (const char *)&c, 1);
    }
    put_s(b, "\"");
}

/* repr() of a number as json.loads gives it: an integer when integral (see the header),
 * else Python's shortest round-trip float repr (exponent form past 1e16 or below 1e-4) */
static void put_py_number(text_buf *b, double v)
{
    char out[64];
    if (isinf(v)) {
        put_s(b, v > 0 ? "Infinity" : "-Infinity");
        return;
    }
    if (v == floor(v) && fabs(v) < 9.2e18) {
        snprintf(out, sizeof out, "%.0f", v == 0 ? 0.0 : v);
        put_s(b, out);
        return;
    }
    char e[40];
    for (int precision = 1; precision <= 17; precision++) {
        snprintf(e, sizeof e, "%.*e", precision - 1, v);
        if (strtod(e, NULL) == v)
            break;
    }
    // e = [-]d[.ddd]e[+-]XX: the digits, and the decimal point's place decpt (v = 0.digits * 10^decpt)
    const char *p = e;
    int negative = *p == '-';
    p += negative;
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.')
            digits[nd++] = *p;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    digits[nd] = '\0';
    int decpt = atoi(p + 1) + 1;
    size_t o = 0;
    if (negative)
        out[o++] = '-';
    if (decpt > 16 || decpt < -3) {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            memcpy(out + o, digits + 1, (size_t)nd - 1);
            o += (size_t)nd - 1;
        }
        snprintf(out + o, sizeof out - o, "e%c%02d", decpt - 1 < 0 ? '-' : '+', abs(decpt - 1));
    } else if (decpt <= 0) {
        snprintf(out + o, sizeof out - o, "0.%.*s%s", -decpt, "0000", digits);
    } else if (decpt < nd) {
        snprintf(out + o, sizeof out - o, "%.*s.%s", decpt, digits, digits + decpt);
    } else {
        snprintf(out + o, sizeof out - o, "%s%.*s.0", digits, decpt - nd, "0000000000000000");
    }
    put_s(b, out);
}

/* HF's tojson: json.dumps(value, ensure_ascii=False), separators ", " and ": " */
static void put_tojson(text_buf *b, const cJSON *v)
{
    if (cJSON_IsString(v)) {
        put_json_string(b, v->valuestring);
    } else if (cJSON_IsNumber(v)) {
        put_py_number(b, v->valuedouble);
    } else if (cJSON_IsBool(v)) {
        put_s(b, cJSON_IsTrue(v) ? "true" : "false");
    } else if (cJSON_IsNull(v)) {
        put_s(b, "null");
    } else {
        int object = cJSON_IsObject(v);
        put_s(b, object ? "{" : "[");
        for (const cJSON *item = v->child; item; item = item->next) {
            if (item != v->child)
                put_s(b, ", ");
            if (object) {
                put_json_string(b, item->string);
                put_s(b, ": ");
            }
            put_tojson(b, item);
        }
        put_s(b, object ? "}" : "]");
    }
}

/* Jinja's |string of a JSON scalar: str() in Python (True, False, None) */
static void put_py_str(text_buf *b, const cJSON *v)
{
    if (cJSON_IsString(v))
        put_s(b, v->valuestring);
    else if (cJSON_IsBool(v))
        put_s(b, cJSON_IsTrue(v) ? "True" : "False");
    else if (cJSON_IsNull(v))
        put_s(b, "None");
    else
        put_py_number(b, v->valuedouble);
}

// ----------------------------------------------------------------------------
// the templates

typedef struct render_state {
    text_buf text;
    ddt_chat_span *spans;
    int n_spans;
} render_state;

static void span_begin(render_state *r)
{
    r->spans[r->n_spans].start = r->text.len;
}

static void span_end(render_state *r)
{
    r->spans[r->n_spans++].end = r->text.len;
}

/* An assistant turn's (content, reasoning) before the template's own parsing: as given, or
 * with drop_reasoning, the content's think block cut off and an empty reasoning_content. */
static void assistant_input(const ddt_chat_message *m, int drop_reasoning, sv *content,
                            const char **reasoning)
{
    *content = sv_of(m->content);
    *reasoning = m->reasoning;
    if (drop_reasoning) {
        *content = after_think(*content);
        *reasoning = "";
    }
}

/* The index of the last user query (a user message not wholly a <tool_response>), or -1 */
static int last_query(const ddt_chat_message *m, int n, int trim)
{
    for (int i = n - 1; i >= 0; i--) {
        sv c = trim ? sv_trim(sv_of(m[i].content)) : sv_of(m[i].content);
        if (m[i].role == DDT_CHAT_USER &&
            !(sv_starts(c, "<tool_response>") && sv_ends(c, "</tool_response>")))
            return i;
    }
    return -1;
}

/* Qwen3's tokenizer_config.json chat_template, without `tools` */
static ddt_chat_refusal render_qwen3(const ddt_chat_message *m, int n,
                                     const ddt_chat_template_options *opt, render_state *r,
                                     char *err, size_t err_len)
{
    text_buf *b = &r->text;
    int lqi = last_query(m, n, 0);
    if (lqi < 0)
        lqi = n - 1;   // ns.last_query_index's initial value
    for (int i = 0; i < n; i++) {
        const ddt_chat_message *msg = &m[i];
        if (msg->role == DDT_CHAT_USER || msg->role == DDT_CHAT_SYSTEM) {
            put_s(b, "<|im_start|>");
            put_s(b, ddt_chat_role_name(msg->role));
            put_s(b, "\n");
            put_s(b, msg->content);
            put_s(b, "<|im_end|>\n");
        } else if (msg->role == DDT_CHAT_ASSISTANT) {
            sv content;
            const char *given;
            assistant_input(msg, opt->drop_reasoning, &content, &given);
            sv reasoning = {"", 0};
            if (given) {   // reasoning_content is defined and not none
                reasoning = sv_of(given);
            } else if (sv_find(content, "</think>") >= 0) {
                reasoning = think_of(content);
                content = after_think(content);
            }
            put_s(b, "<|im_start|>assistant\n");
            span_begin(r);
            if (i > lqi && (i == n - 1 || reasoning.n)) {
                put_s(b, "<think>\n");
                put_sv(b, sv_rstrip_nl(sv_lstrip_nl(reasoning)));   // .strip('\n')
                put_s(b, "\n</think>\n\n");
                put_sv(b, sv_lstrip_nl(content));
            } else {
                put_sv(b, content);
            }
            for (int k = 0; k < msg->n_tool_calls; k++) {
                const ddt_chat_tool_call *tc = &msg->tool_calls[k];
                if (!tc->arguments)
                    return ddt_chat_refuse(err, err_len, DDT_CHAT_TEMPLATE_REFUSED,
                                  "qwen3: tool call \"%.40s\" of message %d has no arguments "
                                  "(the template cannot write them)", tc->name, i);
                if (k > 0 || content.n)
                    put_s(b, "\n");
                put_s(b, "<tool_call>\n{\"name\": \"");
                put_s(b, tc->name);
                put_s(b, "\", \"arguments\": ");
                if (cJSON_IsString(tc->arguments))
                    put_s(b, tc->arguments->valuestring);
                else
                    put_tojson(b, tc->arguments);
                put_s(b, "}\n</tool_call>");
            }
            put_s(b, "<|im_end|>\n");
            span_end(r);
        } else {   // tool: consecutive ones share one user block
            if (i == 0 || m[i - 1].role != DDT_CHAT_TOOL)
                put_s(b, "<|im_start|>user");
            put_s(b, "\n<tool_response>\n");
            put_s(b, msg->content);
            put_s(b, "\n</tool_response>");
            if (i == n - 1 || m[i + 1].role != DDT_CHAT_TOOL)
                put_s(b, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt)
        put_s(b, opt->enable_thinking ? "<|im_start|>assistant\n"
                                      : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return DDT_CHAT_OK;
}

/* A tool-call argument's value: Qwen3.5 writes mappings and lists as JSON and scalars with
 * Python's str(); Qwen3.6 writes everything but strings as JSON. */
static void put_tool_argument(text_buf *b, const cJSON *v, ddt_chat_template tmpl)
{
    if (cJSON_IsString(v))
        put_s(b, v->valuestring);
    else if (tmpl == DDT_CHAT_TEMPLATE_QWEN36 || cJSON_IsObject(v) || cJSON_IsArray(v))
        put_tojson(b, v);
    else
        put_py_str(b, v);
}

/* Qwen3.5's (and Qwen3.6's) chat_template.jinja, without `tools` or images */
static ddt_chat_refusal render_qwen35(const ddt_chat_message *m, int n,
                                      const ddt_chat_template_options *opt, render_state *r,
                                      char *err, size_t err_len)
{
    text_buf *b = &r->text;
    const char *name = ddt_chat_template_name(opt->tmpl);
    if (m[0].role == DDT_CHAT_SYSTEM) {
        put_s(b, "<|im_start|>system\n");
        put_sv(b, sv_trim(sv_of(m[0].content)));
        put_s(b, "<|im_end|>\n");
    }
    int lqi = last_query(m, n, 1);
    if (lqi < 0)
        return ddt_chat_refuse(err, err_len, DDT_CHAT_TEMPLATE_REFUSED,
                      "%s: no user query (every user message is a <tool_response>): the "
                      "template raises 'No user query found in messages.'", name);
    for (int i = 0; i < n; i++) {
        const ddt_chat_message *msg = &m[i];
        sv content = sv_trim(sv_of(msg->content));
        if (msg->role == DDT_CHAT_SYSTEM) {
            if (i > 0)
                return ddt_chat_refuse(err, err_len, DDT_CHAT_TEMPLATE_REFUSED,
                              "%s: message %d is a system message after the start: the template "
                              "raises 'System message must be at the beginning.'", name, i);
        } else if (msg->role == DDT_CHAT_USER) {
            put_s(b, "<|im_start|>user\n");
            put_sv(b, content);
            put_s(b, "<|im_end|>\n");
        } else if (msg->role == DDT_CHAT_ASSISTANT) {
            const char *given;
            assistant_input(msg, opt->drop_reasoning, &content, &given);
            content = sv_trim(content);
            sv reasoning = {"", 0};
            if (given) {   // reasoning_content is string
                reasoning = sv_of(given);
            } else if (sv_find(content, "</think>") >= 0) {
                reasoning = think_of(content);
                content = after_think(content);
            }
            reasoning = sv_trim(reasoning);
            if (i > lqi) {
                put_s(b, "<|im_start|>assistant\n<think>\n");
                span_begin(r);
                put_sv(b, reasoning);
                put_s(b, "\n</think>\n\n");
            } else {
                put_s(b, "<|im_start|>assistant\n");
                span_begin(r);
            }
            put_sv(b, content);
            for (int k = 0; k < msg->n_tool_calls; k++) {
                const ddt_chat_tool_call *tc = &msg->tool_calls[k];
                if (tc->arguments && !cJSON_IsObject(tc->arguments))
                    return ddt_chat_refuse(err, err_len, DDT_CHAT_TEMPLATE_REFUSED,
                                  "%s: tool call \"%.40s\" of message %d has arguments as a "
                                  "string; the template needs an object", name, tc->name, i);
                put_s(b, k > 0 ? "\n<tool_call>\n<function="
                         : sv_trim(content).n ? "\n\n<tool_call>\n<function="
                                              : "<tool_call>\n<function=");
                put_s(b, tc->name);
                put_s(b, ">\n");
                for (const cJSON *arg = tc->arguments ? tc->arguments->child : NULL; arg;
                     arg = arg->next) {
                    put_s(b, "<parameter=");
                    put_s(b, arg->string);
                    put_s(b, ">\n");
                    put_tool_argument(b, arg, opt->tmpl);
                    put_s(b, "\n</parameter>\n");
                }
                put_s(b, "</function>\n</tool_call>");
            }
            put_s(b, "<|im_end|>\n");
            span_end(r);
        } else {   // tool
            if (i > 0 && m[i - 1].role != DDT_CHAT_TOOL)
                put_s(b, "<|im_start|>user");
            put_s(b, "\n<tool_response>\n");
            put_sv(b, content);
            put_s(b, "\n</tool_response>");
            if (i == n - 1 || m[i + 1].role != DDT_CHAT_TOOL)
                put_s(b, "<|im_end|>\n");
        }
    }
    if (opt->add_generation_prompt)
        put_s(b, opt->enable_thinking ? "<|im_start|>assistant\n<think>\n"
                                      : "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    return DDT_CHAT_OK;
}

// ----------------------------------------------------------------------------
// entry points

int ddt_chat_find_special(const ddt_chat *chat, const char *const *specials, int n_specials,
                          const char **which)
{
    for (int i = 0; i < chat->n_messages; i++) {
        const ddt_chat_message *m = &chat->messages[i];
        if (m->role == DDT_CHAT_ASSISTANT)
            continue;
        for (int k = 0; k < n_specials; k++)
            if (specials[k][0] && strstr(m->content, specials[k])) {
                *which = specials[k];
                return i;
            }
    }
    return -1;
}

static ddt_chat_refusal render(const ddt_chat *chat, int n, const ddt_chat_template_options *opt,
                               ddt_chat_rendered *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    // the messages rendered: chat's first n, after the system_prompt when one is put first
    int prepend = opt->system_prompt && (n == 0 || chat->messages[0].role != DDT_CHAT_SYSTEM);
    int total = n + prepend;
    ddt_chat_message *view = calloc((size_t)total + 1, sizeof *view);
    render_state r = {.spans = calloc((size_t)total + 1, sizeof *r.spans)};
    if (!view || !r.spans)
        abort();
    if (prepend)
        view[0] = (ddt_chat_message){.role = DDT_CHAT_SYSTEM, .content = (char *)opt->system_prompt};
    memcpy(view + prepend, chat->messages, (size_t)n * sizeof *view);

    ddt_chat_refusal rc = DDT_CHAT_OK;
    const char *which = NULL;
    int at = opt->special_tokens ? ddt_chat_find_special(&(ddt_chat){view, total},
                                                         opt->special_tokens,
                                                         opt->n_special_tokens, &which)
                                 : -1;
    if (at >= 0 && at < prepend)
        rc = ddt_chat_refuse(err, err_len, DDT_CHAT_SPECIAL_TOKEN,
                    "the system_prompt option spells the special token %s", which);
    else if (at >= 0)
        rc = ddt_chat_refuse(err, err_len, DDT_CHAT_SPECIAL_TOKEN,
                    "message %d (%s) spells the special token %s: refused rather than turned "
                    "into a control token", at - prepend, ddt_chat_role_name(view[at].role), which);
    else if (total == 0)
        rc = ddt_chat_refuse(err, err_len, DDT_CHAT_NO_USER, "no messages to render");
    else if (opt->tmpl == DDT_CHAT_TEMPLATE_QWEN3)
        rc = render_qwen3(view, total, opt, &r, err, err_len);
    else
        rc = render_qwen35(view, total, opt, &r, err, err_len);
    free(view);
    if (rc != DDT_CHAT_OK) {
        free(r.text.p);
        free(r.spans);
        return rc;
    }
    if (!r.text.p)
        put(&r.text, "", 0);
    if (opt->train_only_last_turn && r.n_spans > 1) {
        r.spans[0] = r.spans[r.n_spans - 1];
        r.n_spans = 1;
    }
    *out = (ddt_chat_rendered){r.text.p, r.text.len, r.spans, r.n_spans};
    return DDT_CHAT_OK;
}

ddt_chat_refusal ddt_chat_render(const ddt_chat *chat, const ddt_chat_template_options *opt,
                                 ddt_chat_rendered *out, char *err, size_t err_len)
{
    return render(chat, chat->n_messages, opt, out, err, err_len);
}

ddt_chat_refusal ddt_chat_render_prompt(const ddt_chat *chat, const ddt_chat_template_options *opt,
                                        ddt_chat_rendered *out, char *err, size_t err_len)
{
    int last_user = -1;
    for (int i = 0; i < chat->n_messages; i++)
        if (chat->messages[i].role == DDT_CHAT_USER)
            last_user = i;
    if (last_user < 0) {
        memset(out, 0, sizeof *out);
        return ddt_chat_refuse(err, err_len, DDT_CHAT_NO_USER, "no user message to prompt with");
    }
    ddt_chat_template_options prompt = *opt;
    prompt.add_generation_prompt = 1;
    return render(chat, last_user + 1, &prompt, out, err, err_len);
}

void ddt_chat_rendered_free(ddt_chat_rendered *r)
{
    free(r->text);
    free(r->spans);
    memset(r, 0, sizeof *r);
}
