/* chat_data.c: JSON Lines conversations -> normalised ddt_chat (chat_data.h).
 * Strictness follows Python's json.loads (what a Hugging Face user loads the same line with):
 * raw control characters inside strings and invalid UTF-8 are refused, and so is \u0000,
 * which cJSON would silently cut a string at. Tested by tests/engine/data/test_chat_template.c.
 */
#include "chat_data.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const refusal_names[DDT_CHAT_REFUSAL_COUNT] = {
    [DDT_CHAT_OK] = "ok",
    [DDT_CHAT_LINE_TOO_LONG] = "line_too_long",
    [DDT_CHAT_BAD_UTF8] = "invalid_utf8",
    [DDT_CHAT_BAD_JSON] = "invalid_json",
    [DDT_CHAT_NOT_CONVERSATION] = "not_a_conversation",
    [DDT_CHAT_NO_CONTENT] = "no_content",
    [DDT_CHAT_UNKNOWN_ROLE] = "unknown_role",
    [DDT_CHAT_BAD_FIELD] = "bad_field",
    [DDT_CHAT_NO_USER] = "no_user_message",
    [DDT_CHAT_SPECIAL_TOKEN] = "special_token",
    [DDT_CHAT_TEMPLATE_REFUSED] = "template_refused",
    [DDT_CHAT_NOT_TRAINED] = "too_few_trained_tokens",
    [DDT_CHAT_PROMPT_TOO_LONG] = "prompt_too_long",
    [DDT_CHAT_BLANK] = "blank_line",
};

const char *ddt_chat_refusal_name(ddt_chat_refusal reason)
{
    return (unsigned)reason < DDT_CHAT_REFUSAL_COUNT ? refusal_names[reason] : "unknown";
}

const char *ddt_chat_role_name(ddt_chat_role role)
{
    static const char *const names[] = {"system", "user", "assistant", "tool"};
    return (unsigned)role < 4 ? names[role] : "unknown";
}

ddt_chat_refusal ddt_chat_refuse(char *err, size_t err_len, ddt_chat_refusal reason, const char *fmt, ...)
{
    if (err && err_len) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, err_len, fmt, args);
        va_end(args);
    }
    return reason;
}

static char *dup_or_abort(const char *s)
{
    char *copy = strdup(s);
    if (!copy)
        abort();
    return copy;
}

// ----------------------------------------------------------------------------
// byte-level checks before cJSON sees the line

/* 0 when text is valid UTF-8 (no overlong forms, surrogates or code points past U+10FFFF),
 * else the 1-based offset of the first bad byte */
static size_t utf8_invalid_at(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned c = s[i];
        size_t n;
        uint32_t cp, min;
        if (c < 0x80) {
            i++;
            continue;
        } else if ((c & 0xE0) == 0xC0) {
            n = 1, cp = c & 0x1F, min = 0x80;
        } else if ((c & 0xF0) == 0xE0) {
            n = 2, cp = c & 0x0F, min = 0x800;
        } else if ((c & 0xF8) == 0xF0) {
            n = 3, cp = c & 0x07, min = 0x10000;
        } else {
            return i + 1;
        }
        if (i + n >= len)
            return i + 1;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return i + 1;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF))
            return i + 1;
        i += n + 1;
    }
    return 0;
}

/* Inside JSON strings: a raw control character (json.loads refuses it) or a \u0000 escape
 * (cJSON would end the string there). NULL when neither, else what was found. */
static const char *string_defect(const char *s, size_t len, size_t *at)
{
    int in_string = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!in_string) {
            in_string = c == '"';
            continue;
        }
        if (c == '"') {
            in_string = 0;
        } else if (c < 0x20) {
            *at = i + 1;
            return "a raw control character inside a string (write it as an escape)";
        } else if (c == '\\' && i + 1 < len) {
            if (s[i + 1] == 'u' && i + 5 < len && memcmp(s + i + 2, "0000", 4) == 0) {
                *at = i + 1;
                return "a \\u0000 (NUL) inside a string";
            }
            i++;   // the escaped character
        }
    }
    return NULL;
}

// ----------------------------------------------------------------------------
// messages

static int role_from_name(const char *name, ddt_chat_role *role)
{
    static const struct {
        const char *name;
        ddt_chat_role role;
    } roles[] = {{"system", DDT_CHAT_SYSTEM}, {"user", DDT_CHAT_USER},
                 {"human", DDT_CHAT_USER},    {"assistant", DDT_CHAT_ASSISTANT},
                 {"gpt", DDT_CHAT_ASSISTANT}, {"tool", DDT_CHAT_TOOL}};
    for (size_t i = 0; i < sizeof roles / sizeof roles[0]; i++)
        if (strcmp(name, roles[i].name) == 0) {
            *role = roles[i].role;
            return 1;
        }
    return 0;
}

/* 1 when an object anywhere in value repeats a key (json.loads would keep only the last) */
static int has_duplicate_key(const cJSON *value)
{
    for (const cJSON *a = value ? value->child : NULL; a; a = a->next) {
        if (cJSON_IsObject(value))
            for (const cJSON *b = a->next; b; b = b->next)
                if (strcmp(a->string, b->string) == 0)
                    return 1;
        if (has_duplicate_key(a))
            return 1;
    }
    return 0;
}

static ddt_chat_refusal parse_tool_calls(const cJSON *calls, int index, ddt_chat_message *m,
                                         char *err, size_t err_len)
{
    if (!calls || cJSON_IsNull(calls))
        return DDT_CHAT_OK;
    if (!cJSON_IsArray(calls))
        return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                      "message %d: tool_calls is not a list", index);
    int n = cJSON_GetArraySize(calls);
    if (n == 0)
        return DDT_CHAT_OK;
    m->tool_calls = calloc((size_t)n, sizeof *m->tool_calls);
    if (!m->tool_calls)
        abort();
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        if (!cJSON_IsObject(call))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                          "message %d: tool call %d is not an object", index, m->n_tool_calls);
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        if (!cJSON_IsObject(fn))
            fn = call;   // the flat shape {"name", "arguments"}
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (!cJSON_IsString(name))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                          "message %d: tool call %d has no name string", index, m->n_tool_calls);
        if (args && !cJSON_IsString(args) && !cJSON_IsObject(args))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                          "message %d: tool call %d: arguments is neither a string nor an object",
                          index, m->n_tool_calls);
        if (has_duplicate_key(args))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                          "message %d: tool call %d: arguments repeat a key", index,
                          m->n_tool_calls);
        ddt_chat_tool_call *tc = &m->tool_calls[m->n_tool_calls++];
        tc->name = dup_or_abort(name->valuestring);
        if (args && !(tc->arguments = cJSON_Duplicate(args, 1)))
            abort();
    }
    return DDT_CHAT_OK;
}

/* One message of the list, checked whole; its role for the normalisation. */
/* content as a list of parts [{"type": "text", "text": "..."}]: the texts joined with nothing
 * between them (Qwen3.5's render_content); a part without a text string (an image) is refused */
static ddt_chat_refusal content_parts(const cJSON *parts, int index, ddt_chat_message *m, char *err,
                                      size_t err_len)
{
    size_t total = 1, at = 0;
    int k = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, parts) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text"),
                    *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        if (!cJSON_IsString(text) || (type && !(cJSON_IsString(type) && !strcmp(type->valuestring, "text"))))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_NO_CONTENT, "message %d: content part %d is not "
                                   "{\"type\": \"text\", \"text\": \"...\"} (only text is trained on)", index, k);
        total += strlen(text->valuestring);
        k++;
    }
    m->content = malloc(total);
    if (!m->content)
        abort();
    cJSON_ArrayForEach(part, parts) {
        const char *text = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
        memcpy(m->content + at, text, strlen(text));
        at += strlen(text);
    }
    m->content[at] = '\0';
    return DDT_CHAT_OK;
}

static ddt_chat_refusal parse_message(const cJSON *item, int index, ddt_chat_message *m,
                                      char *err, size_t err_len)
{
    if (!cJSON_IsObject(item))
        return ddt_chat_refuse(err, err_len, DDT_CHAT_NOT_CONVERSATION, "message %d is not an object",
                      index);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
    if (!role)
        role = cJSON_GetObjectItemCaseSensitive(item, "from");
    if (!cJSON_IsString(role))
        return ddt_chat_refuse(err, err_len, DDT_CHAT_UNKNOWN_ROLE,
                      "message %d has no \"role\" (or \"from\") string", index);
    if (!role_from_name(role->valuestring, &m->role))
        return ddt_chat_refuse(err, err_len, DDT_CHAT_UNKNOWN_ROLE,
                      "message %d: unknown role \"%.40s\" (system, user, human, assistant, gpt "
                      "or tool)", index, role->valuestring);
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
    if (!content)
        content = cJSON_GetObjectItemCaseSensitive(item, "value");
    if (cJSON_IsArray(content)) {   /* text parts, joined; then the same as a string's */
        ddt_chat_refusal why = content_parts(content, index, m, err, err_len);
        if (why != DDT_CHAT_OK)
            return why;
    } else if (!cJSON_IsString(content)) {
        return ddt_chat_refuse(err, err_len, DDT_CHAT_NO_CONTENT,
                      "message %d (%s) has no \"content\" (or \"value\") string, nor a list of "
                      "text parts", index, role->valuestring);
    } else {
        m->content = dup_or_abort(content->valuestring);
    }
    if (m->role != DDT_CHAT_ASSISTANT)
        return DDT_CHAT_OK;
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(item, "reasoning_content");
    if (reasoning && !cJSON_IsNull(reasoning)) {
        if (!cJSON_IsString(reasoning))
            return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_FIELD,
                          "message %d: reasoning_content is not a string", index);
        m->reasoning = dup_or_abort(reasoning->valuestring);
    }
    return parse_tool_calls(cJSON_GetObjectItemCaseSensitive(item, "tool_calls"), index, m, err,
                            err_len);
}

static void message_free(ddt_chat_message *m)
{
    free(m->content);
    free(m->reasoning);
    for (int i = 0; i < m->n_tool_calls; i++) {
        free(m->tool_calls[i].name);
        cJSON_Delete(m->tool_calls[i].arguments);
    }
    free(m->tool_calls);
    memset(m, 0, sizeof *m);
}

void ddt_chat_free(ddt_chat *chat)
{
    for (int i = 0; i < chat->n_messages; i++)
        message_free(&chat->messages[i]);
    free(chat->messages);
    chat->messages = NULL;
    chat->n_messages = 0;
}

/* SpecForge's rule: a first system message, then from the first user message on, up to the
 * first assistant not after user/tool or tool not after assistant/tool. Moves the survivors
 * to the front (freeing the rest) and returns how many. A survivor only moves down (kept <= i),
 * so m[i - 1] is still the original previous message when message i is judged. */
static int normalise(ddt_chat_message *m, int n, int first_user)
{
    int kept = 0, cut = 0;
    for (int i = 0; i < n; i++) {
        int keep = 1;
        if (cut) {
            keep = 0;
        } else if (i < first_user) {
            keep = i == 0 && m[0].role == DDT_CHAT_SYSTEM;
        } else if (i > first_user) {
            ddt_chat_role prev = m[i - 1].role;
            if (m[i].role == DDT_CHAT_ASSISTANT)
                keep = prev == DDT_CHAT_USER || prev == DDT_CHAT_TOOL;
            else if (m[i].role == DDT_CHAT_TOOL)
                keep = prev == DDT_CHAT_ASSISTANT || prev == DDT_CHAT_TOOL;
            cut = !keep;
        }
        if (keep)
            m[kept++] = m[i];
        else
            message_free(&m[i]);
    }
    return kept;
}

ddt_chat_refusal ddt_chat_parse_line(const char *line, size_t len, ddt_chat *chat, char *err,
                                     size_t err_len)
{
    memset(chat, 0, sizeof *chat);
    if (len > DDT_CHAT_LINE_MAX)
        return ddt_chat_refuse(err, err_len, DDT_CHAT_LINE_TOO_LONG,
                      "the line has %zu bytes, over the %zu-byte cap (DDT_CHAT_LINE_MAX): split "
                      "the conversation", len, DDT_CHAT_LINE_MAX);
    size_t at = utf8_invalid_at((const unsigned char *)line, len);
    if (at)
        return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_UTF8, "invalid UTF-8 at byte %zu", at);
    const char *defect = string_defect(line, len, &at);
    if (defect)
        return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_UTF8, "%s at byte %zu", defect, at);

    size_t blank = 0;
    while (blank < len && strchr(" \t\r\n", line[blank]) && line[blank])
        blank++;
    if (blank == len)
        return ddt_chat_refuse(err, err_len, DDT_CHAT_BLANK, "a blank line (no conversation)");

    char *text = malloc(len + 1);
    if (!text)
        abort();
    memcpy(text, line, len);
    text[len] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, &end, 1);
    if (!root) {
        size_t where = end && end >= text ? (size_t)(end - text) + 1 : 0;
        free(text);
        return ddt_chat_refuse(err, err_len, DDT_CHAT_BAD_JSON, "not valid JSON (near byte %zu)", where);
    }
    free(text);

    ddt_chat_refusal rc = DDT_CHAT_OK;
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!list)
        list = cJSON_GetObjectItemCaseSensitive(root, "conversations");
    if (!cJSON_IsObject(root) || !cJSON_IsArray(list)) {
        cJSON_Delete(root);
        return ddt_chat_refuse(err, err_len, DDT_CHAT_NOT_CONVERSATION,
                      "not a JSON object with a \"messages\" or \"conversations\" list");
    }
    int n = cJSON_GetArraySize(list), first_user = -1;
    ddt_chat_message *m = calloc(n > 0 ? (size_t)n : 1, sizeof *m);
    if (!m)
        abort();
    int parsed = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, list) {
        rc = parse_message(item, parsed, &m[parsed], err, err_len);
        parsed++;
        if (rc != DDT_CHAT_OK)
            break;
        if (first_user < 0 && m[parsed - 1].role == DDT_CHAT_USER)
            first_user = parsed - 1;
    }
    cJSON_Delete(root);
    if (rc == DDT_CHAT_OK && first_user < 0)
        rc = ddt_chat_refuse(err, err_len, DDT_CHAT_NO_USER, "no user message among the %d messages", n);
    if (rc != DDT_CHAT_OK) {
        for (int i = 0; i < parsed; i++)
            message_free(&m[i]);
        free(m);
        return rc;
    }
    chat->n_messages = normalise(m, n, first_user);
    chat->messages = m;
    return DDT_CHAT_OK;
}

cJSON *ddt_chat_to_json(const ddt_chat *chat)
{
    cJSON *list = cJSON_CreateArray();
    if (!list)
        abort();
    for (int i = 0; i < chat->n_messages; i++) {
        const ddt_chat_message *m = &chat->messages[i];
        cJSON *msg = cJSON_CreateObject();
        if (!msg || !cJSON_AddStringToObject(msg, "role", ddt_chat_role_name(m->role)) ||
            !cJSON_AddStringToObject(msg, "content", m->content) ||
            (m->reasoning && !cJSON_AddStringToObject(msg, "reasoning_content", m->reasoning)))
            abort();
        if (m->n_tool_calls) {
            cJSON *calls = cJSON_AddArrayToObject(msg, "tool_calls");
            for (int k = 0; calls && k < m->n_tool_calls; k++) {
                cJSON *call = cJSON_CreateObject(), *fn = cJSON_CreateObject();
                if (!call || !fn || !cJSON_AddStringToObject(call, "type", "function") ||
                    !cJSON_AddStringToObject(fn, "name", m->tool_calls[k].name))
                    abort();
                if (m->tool_calls[k].arguments)
                    cJSON_AddItemToObject(fn, "arguments",
                                          cJSON_Duplicate(m->tool_calls[k].arguments, 1));
                cJSON_AddItemToObject(call, "function", fn);
                cJSON_AddItemToArray(calls, call);
            }
            if (!calls)
                abort();
        }
        cJSON_AddItemToArray(list, msg);
    }
    return list;
}
