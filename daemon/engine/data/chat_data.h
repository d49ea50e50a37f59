/* chat_data.h: one JSON Lines conversation (SPEC.md section 8) -> a normalised conversation,
 * or a refusal with its reason, for the caller to count by reason with the line number.
 *
 * Accepted shapes: {"messages": [{"role", "content", "reasoning_content"?, "tool_calls"?}]}
 * or ShareGPT {"conversations": [{"from", "value"}]} (human -> user, gpt -> assistant). A content
 * may be a list of parts, OpenAI's [{"type": "text", "text": "..."}]: their texts joined with
 * nothing between them, as Qwen3.5's template renders them (render_content); a part that is not
 * text (an image) refuses the line (no_content).
 * Normalisation (as SpecForge does): messages before the first user message are dropped
 * except a first system message, kept as given; the conversation is cut at the first
 * assistant message that does not follow a user or tool message, or tool message that does
 * not follow an assistant or tool message. Every message of the line is checked (role,
 * content string) before anything is dropped, so one bad message drops the line whole.
 * It does not render (chat_template.h) or tokenize.
 * Tested by tests/engine/data/test_chat_template.c (hand-made lines with their refusal reasons, and the
 * normalised conversations of a generated set rendered against jinja2).
 */
#ifndef DDT_CHAT_DATA_H
#define DDT_CHAT_DATA_H

#include <stddef.h>

/* The longest line accepted (bytes, without its newline): a conversation of a few hundred
 * thousand tokens; anything longer is refused as DDT_CHAT_LINE_TOO_LONG. */
#define DDT_CHAT_LINE_MAX ((size_t)8 << 20)

/* Why a conversation was refused (0: it was not). Shared by the parser and the renderer;
 * ddt_chat_refusal_name() gives the short key that counts are kept under. */
typedef enum ddt_chat_refusal {
    DDT_CHAT_OK = 0,
    DDT_CHAT_LINE_TOO_LONG,      /* over DDT_CHAT_LINE_MAX bytes */
    DDT_CHAT_BAD_UTF8,           /* not valid UTF-8, or a \u0000 in a string */
    DDT_CHAT_BAD_JSON,           /* not parseable JSON */
    DDT_CHAT_NOT_CONVERSATION,   /* not an object with a "messages" or "conversations" list */
    DDT_CHAT_NO_CONTENT,         /* a message without a content string */
    DDT_CHAT_UNKNOWN_ROLE,       /* a role other than system/user/human/assistant/gpt/tool */
    DDT_CHAT_BAD_FIELD,          /* reasoning_content or tool_calls of the wrong shape */
    DDT_CHAT_NO_USER,            /* no user message, so nothing is left after normalisation */
    DDT_CHAT_SPECIAL_TOKEN,      /* user/system/tool text spells a special token */
    DDT_CHAT_TEMPLATE_REFUSED,   /* the template itself raises on this conversation */
    DDT_CHAT_NOT_TRAINED,        /* fewer than two consecutive masked tokens (chat_tokens.h),
                                    after any cut to a length */
    DDT_CHAT_PROMPT_TOO_LONG,    /* regeneration: the prompt leaves no room for an answer */
    DDT_CHAT_BLANK,              /* an empty line, or spaces alone: no conversation, not bad JSON */
    DDT_CHAT_REFUSAL_COUNT
} ddt_chat_refusal;

/* "invalid_json", "unknown_role", ...: a stable key for counts and events */
const char *ddt_chat_refusal_name(ddt_chat_refusal reason);
/* err := the sentence (when err and err_len); returns reason: how the chat code refuses */
ddt_chat_refusal ddt_chat_refuse(char *err, size_t err_len, ddt_chat_refusal reason, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

typedef enum ddt_chat_role {
    DDT_CHAT_SYSTEM,
    DDT_CHAT_USER,
    DDT_CHAT_ASSISTANT,
    DDT_CHAT_TOOL
} ddt_chat_role;

/* "system", "user", "assistant", "tool" */
const char *ddt_chat_role_name(ddt_chat_role role);

/* An assistant's call of a tool (OpenAI shape {"function": {"name", "arguments"}} or the flat
 * {"name", "arguments"}); arguments is a JSON string or object as given (cJSON, owned), or
 * NULL when absent. */
typedef struct ddt_chat_tool_call {
    char *name;
    struct cJSON *arguments;
} ddt_chat_tool_call;

typedef struct ddt_chat_message {
    ddt_chat_role role;
    char *content;                  /* UTF-8, never NULL */
    char *reasoning;                /* assistant's reasoning_content; NULL when absent or null */
    ddt_chat_tool_call *tool_calls; /* assistant only; n_tool_calls of them */
    int n_tool_calls;
} ddt_chat_message;

typedef struct ddt_chat {
    ddt_chat_message *messages;
    int n_messages;
} ddt_chat;

/* Parses and normalises one line (len bytes, no newline needed; it need not be
 * NUL-terminated). DDT_CHAT_OK with *chat filled (ddt_chat_free), or the refusal with
 * err = a sentence naming what is wrong (and *chat empty). Running out of memory aborts
 * (the process is at fault, not the line). */
ddt_chat_refusal ddt_chat_parse_line(const char *line, size_t len, ddt_chat *chat, char *err,
                                     size_t err_len);
void ddt_chat_free(ddt_chat *chat);

/* The conversation as the `messages` list a Hugging Face chat template receives (what the
 * jinja2 reference renders): a cJSON array, the caller's to cJSON_Delete. */
struct cJSON *ddt_chat_to_json(const ddt_chat *chat);

#endif
