/* chat_template.h: the Qwen chat templates rendered natively (no Jinja engine), SPEC.md
 * section 8: a normalised conversation (chat_data.h) -> the UTF-8 text the model's own Jinja
 * `chat_template` gives under Hugging Face, plus each assistant turn's byte span, for the
 * tokenizer to turn into the loss mask (token edge = len(encode(text[:byte edge]))).
 *
 * Templates: `qwen3` (Qwen3's tokenizer_config.json), `qwen3.5` (Qwen3.5, the thinking
 * variant shipped by 4B and larger), `qwen3.6` (Qwen3.6: Qwen3.5's, with non-string tool
 * arguments always as JSON). The `tools` list of the Jinja templates (a system block of
 * function signatures) is not supported: conversations are rendered as apply_chat_template
 * renders them without `tools`. Where the Jinja template raises, the render refuses
 * (DDT_CHAT_TEMPLATE_REFUSED), naming the template's reason.
 * Tool-call arguments given as objects are written as Python's json.dumps writes them; a number
 * with an integral value is written as an integer (a JSON `1.0` gives `1` where Python keeps
 * `1.0`), and integers past 2^53 lose precision (cJSON holds numbers as doubles).
 * Tested by tests/engine/data/test_chat_template.c against jinja2 (tests/engine/data/chat_template_jinja.py).
 */
#ifndef DDT_CHAT_TEMPLATE_H
#define DDT_CHAT_TEMPLATE_H

#include "chat_data.h"

#include <stddef.h>

typedef enum ddt_chat_template {
    DDT_CHAT_TEMPLATE_QWEN3,
    DDT_CHAT_TEMPLATE_QWEN35,
    DDT_CHAT_TEMPLATE_QWEN36
} ddt_chat_template;

/* "qwen3" / "qwen3.5" / "qwen3.6" -> 0 and *tmpl, else -EINVAL */
int ddt_chat_template_from_name(const char *name, ddt_chat_template *tmpl);
const char *ddt_chat_template_name(ddt_chat_template tmpl);

/* The system prompt SPEC.md 8 names for qwen3. The real Qwen3 template prepends none, so it is
 * not a default here: pass it as system_prompt to have it. */
#define DDT_CHAT_QWEN3_SYSTEM_PROMPT "You are a helpful assistant."

typedef struct ddt_chat_template_options {
    ddt_chat_template tmpl;
    const char *system_prompt;     /* a system message put first when the conversation has
                                      none; NULL: none (what both real templates do) */
    int train_only_last_turn;      /* only the last assistant turn's span */
    int drop_reasoning;            /* every assistant turn rendered as if it had no reasoning:
                                      reasoning_content and any <think>...</think> in its content
                                      removed (the template still writes its empty think
                                      blocks); 0: the template's own rule (reasoning of turns
                                      after the last user query kept, earlier ones removed) */
    int add_generation_prompt;     /* the assistant header after the last message */
    int enable_thinking;           /* the generation prompt's think block: 1 (the default) lets
                                      the model think, 0 gives an empty one */
    const char *const *special_tokens;   /* refuse user/system/tool text spelling one of these
                                            (DDT_CHAT_SPECIAL_TOKEN); NULL: not checked */
    int n_special_tokens;
} ddt_chat_template_options;

/* tmpl with every option at its default (no system prompt, all turns, the template's
 * reasoning rule, no generation prompt, thinking enabled, special tokens not checked) */
ddt_chat_template_options ddt_chat_template_defaults(ddt_chat_template tmpl);

/* An assistant turn in the rendered text: bytes [start, end), from just after the assistant
 * header (`<|im_start|>assistant\n`; for qwen3.5/3.6 turns after the last user query, which
 * get a think block, `<|im_start|>assistant\n<think>\n`, what the generation prompt ends with)
 * through its `<|im_end|>\n`. */
typedef struct ddt_chat_span {
    size_t start, end;
} ddt_chat_span;

typedef struct ddt_chat_rendered {
    char *text;   /* NUL-terminated, len bytes */
    size_t len;
    ddt_chat_span *spans;   /* in order; n_spans of them */
    int n_spans;
} ddt_chat_rendered;

/* Renders chat: DDT_CHAT_OK with *out (ddt_chat_rendered_free), or DDT_CHAT_SPECIAL_TOKEN /
 * DDT_CHAT_TEMPLATE_REFUSED with err saying why (*out empty). Out of memory aborts. */
ddt_chat_refusal ddt_chat_render(const ddt_chat *chat, const ddt_chat_template_options *opt,
                                 ddt_chat_rendered *out, char *err, size_t err_len);

/* The prompt for regeneration: the messages through the last user message, then the
 * generation prompt (opt's add_generation_prompt is ignored). DDT_CHAT_NO_USER when there is
 * no user message. */
ddt_chat_refusal ddt_chat_render_prompt(const ddt_chat *chat, const ddt_chat_template_options *opt,
                                        ddt_chat_rendered *out, char *err, size_t err_len);

void ddt_chat_rendered_free(ddt_chat_rendered *r);

/* The first of specials spelled in a user, system or tool message of chat: its message index
 * and *which, or -1. (Assistant text is the model's own and is not checked.) */
int ddt_chat_find_special(const ddt_chat *chat, const char *const *specials, int n_specials,
                          const char **which);

/* Qwen2/Qwen3's added tokens with `special: true` (tokenizer_config.json), for the tests and
 * as an example; a real run takes the list from its tokenizer. */
const char *const *ddt_chat_qwen_special_tokens(int *n);

#endif
