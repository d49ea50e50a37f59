/* tokenizer_unicode.h: the Unicode of Hugging Face's tokenizers where it differs from this
 * machine's libraries (tokenizer_unicode.c): the characters its Oniguruma has in a general
 * category and Debian's lacks (tokenizer_unicode_table.h), and NFC as its normaliser does it.
 * Internal to the tokenizer's files, not a public header.
 * Tested by tests/engine/data/test_tokenizer.c.
 */
#ifndef DDT_TOKENIZER_UNICODE_H
#define DDT_TOKENIZER_UNICODE_H

#include <stddef.h>
#include <stdint.h>

/* tokenizer_unicode.c: the characters Hugging Face's Oniguruma has in a general category and
 * Debian's lacks (tokenizer_unicode_table.h) */
typedef struct ddt_tok_class_added {
    const char *name;               /* "L", "Lu", "N", ... as in \p{NAME} */
    const uint32_t (*ranges)[2];    /* (count): first and last code point */
    int count;
} ddt_tok_class_added;

/* 1 when tokenizers' NFC takes cp for an unassigned starter and utf8proc does not */
int ddt_tok_nfc_unassigned(uint32_t cp);

/* the table: its classes, *count of them */
const ddt_tok_class_added *ddt_tok_classes_added_table(int *count);

/* pattern with those characters added to each of its \p{NAME} / \P{NAME}: malloc'd, NULL when
 * out of memory */
char *ddt_tok_regex_upgrade(const char *pattern);

/* the NFC form of s (n bytes, valid UTF-8): *out malloc'd (*out_len) or, when s is already NFC
 * by the quick test, *out NULL. 0 or -ENOMEM. */
int ddt_tok_nfc(const char *s, size_t n, char **out, size_t *out_len);

#endif
