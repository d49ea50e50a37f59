/* chat_tokens.h: a conversation (chat_data.h) -> its rendered text (chat_template.h) -> input
 * ids and the loss mask of SPEC.md section 8, with the target's tokenizer (tokenizer.h).
 *
 * The mask: 1 on every token of each assistant span (from just after the assistant header
 * through its `<|im_end|>` and the following `\n`), 0 elsewhere; only the last span with
 * train_only_last_turn. A span edge at byte e of the text is token len(encode(text[:e])),
 * computed as the tokens of the whole text up to the last special token ending at or before
 * e, plus the tokens of the piece from there to e (added tokens are split out before anything
 * else, so both are the same). A header `\n` merged with the content's leading whitespace into
 * one token therefore leaves that token untrained. A conversation whose mask has fewer than two
 * consecutive ones (after any cut) is refused as DDT_CHAT_NOT_TRAINED; user, system or tool
 * text that spells one of the tokenizer's special added tokens as DDT_CHAT_SPECIAL_TOKEN.
 * Before anything is encoded, the template is checked against the tokenizer: the control
 * tokens it writes must be added tokens there (`<|im_start|>` and `<|im_end|>` special).
 * JSON Lines files are mapped read-only with their lines indexed (ddt_chat_file), for
 * `ddtreed tokenize` and the chat source to read line i at any time.
 * Not here: counting refusals (ddtreed tokenize, source_chat.c), regenerating (the chat source
 * samples from the prompt ddt_chat_tokens_prompt gives).
 * Tested by tests/engine/data/test_chat_tokens.c: masks against re-encoded prefixes of the rendered text
 * (multi-turn, reasoning, tools, merged whitespace) with the real Qwen3 tokenizer.json when
 * scripts/test installed it; the template check with a hand-made byte-level tokenizer.
 *
 * Legend: T tokens of a conversation.
 */
#ifndef DDT_CHAT_TOKENS_H
#define DDT_CHAT_TOKENS_H

#include "chat_data.h"
#include "chat_template.h"
#include "tokenizer.h"

#include <stddef.h>
#include <stdint.h>

/* A template bound to a tokenizer: what every conversation is encoded with. Read-only after
 * init, so any number of threads may encode with one (the tokenizer allows it). */
typedef struct ddt_chat_encoder {
    const ddt_tokenizer *tok;        /* the caller's; outlives the encoder */
    ddt_chat_template_options opt;   /* special_tokens: the tokenizer's (owned) */
    char **specials;                 /* (n_specials) contents of the special added tokens */
    int32_t im_end;                  /* `<|im_end|>`: the end of an assistant turn */
} ddt_chat_encoder;

/* opt's template against tok (its control tokens must be tok's added tokens), then the
 * encoder; opt's special_tokens are replaced by tok's. 0, or -EINVAL ("the tokenizer has no
 * added token `<|im_start|>`: template qwen3 does not match it") / -ENOMEM with err. */
int ddt_chat_encoder_init(ddt_chat_encoder *e, const ddt_tokenizer *tok, const ddt_chat_template_options *opt,
                          char *err, size_t err_len);
void ddt_chat_encoder_free(ddt_chat_encoder *e);   /* a zeroed one is a no-op */

/* One conversation's ids and loss mask; a zeroed one is empty, each encode refills it. */
typedef struct ddt_chat_tokens {
    ddt_token_ids ids;   /* (T) */
    uint8_t *mask;       /* (T) 0 or 1 */
    size_t mask_cap;
    int64_t masked;      /* ones in mask */
    int truncated;       /* 1: cut to max_len */
} ddt_chat_tokens;

void ddt_chat_tokens_free(ddt_chat_tokens *t);   /* back to zeroed */

/* chat rendered and encoded into out; max_len > 0 cuts it to max_len tokens first (truncated).
 * DDT_CHAT_OK, or the refusal (special token, template, not UTF-8, not trained) with err. Out
 * of memory aborts (the process is at fault, not the conversation). */
ddt_chat_refusal ddt_chat_tokens_encode(const ddt_chat_encoder *e, const ddt_chat *chat, int64_t max_len,
                                        ddt_chat_tokens *out, char *err, size_t err_len);

/* One JSON Lines line (chat_data.h's shapes) parsed, then encoded as above. */
ddt_chat_refusal ddt_chat_tokens_line(const ddt_chat_encoder *e, const char *line, size_t len, int64_t max_len,
                                      ddt_chat_tokens *out, char *err, size_t err_len);

/* The regeneration prompt's ids (ddt_chat_render_prompt: through the last user message, then
 * the generation prompt) into out (cleared first). DDT_CHAT_OK or the refusal with err. */
ddt_chat_refusal ddt_chat_tokens_prompt(const ddt_chat_encoder *e, const ddt_chat *chat, ddt_token_ids *out,
                                        char *err, size_t err_len);

/* 1 when mask (n) has two consecutive ones (an anchor fits), else 0: the drop rule */
int ddt_chat_mask_trainable(const uint8_t *mask, size_t n);

/* ------------------------------------------------------------------------------------------
 * JSON Lines files
 */

/* A file mapped whole, its lines found: line i is bytes [starts[i], starts[i + 1]) without
 * the newline ("\n" or "\r\n") that ends it; the bytes after the last newline are a last
 * line when there are any. */
typedef struct ddt_chat_file {
    const char *data;   /* (size) the mapping; NULL for an empty file */
    size_t size;
    int64_t n_lines;
    int64_t *starts;    /* (n_lines + 1) */
    char *path;         /* the mapping's, and */
    int fd;             /* its descriptor, open while mapped (for ddt_chat_file_copy_line) */
} ddt_chat_file;

/* 0, or a negative errno with err ("PATH: ...") when it cannot be read. */
int ddt_chat_file_open(const char *path, ddt_chat_file *f, char *err, size_t err_len);
void ddt_chat_file_close(ddt_chat_file *f);   /* a zeroed one is a no-op */
/* line i in [0, n_lines), *len its bytes without the newline, in the mapping: for a file read
 * once, at once (a page that cannot be read raises SIGBUS) */
const char *ddt_chat_file_line(const ddt_chat_file *f, int64_t i, size_t *len);
/* line i copied out of the mapping into *buf (grown as needed, *cap its size; NUL-terminated),
 * *len its bytes, through base/mapped.h's guarded read: what a run reads again and again while
 * the file may change under it. 0, or -EIO ("PATH: ... offset ...": the file shrank or a page
 * cannot be read) or -ENOMEM, with err. */
int ddt_chat_file_copy_line(const ddt_chat_file *f, int64_t i, char **buf, size_t *cap, size_t *len, char *err,
                            size_t err_len);

#endif
