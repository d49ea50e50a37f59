/* tokenizer_unicode.c: the Unicode of Hugging Face's tokenizers where it differs from this
 * machine's libraries. Split regexes: the
 * tokenizers library (0.23.2, onig crate 6.5.3) bundles an Oniguruma with newer Unicode data
 * (CJK Extension J is in its \p{L}: Unicode 17) than Debian 12's 6.9.8 (Unicode 15.0), so a
 * character assigned since is in its \p{L} or \p{N} and in none of ours, and ids differ around
 * it. ddt_tok_regex_upgrade() adds those characters to every general-category class of a
 * pattern, from the table tokenizer_unicode_table.h (what that Oniguruma has in each class and
 * ours lacks; nothing is in ours and not in its). \s and the other escapes are the same in both.
 * NFC: tokenizers' normaliser has Unicode 9 combining classes, so a mark assigned since is a
 * starter that composes with nothing there, and utf8proc reorders or composes it:
 * ddt_tok_nfc_unassigned() names those characters (the table's nfc_unassigned), and the
 * normaliser (tokenizer.c) cuts the text at them, each piece normalised alone.
 * Tested by tests/test_tokenizer.c (the Qwen3 corpus's random code points of every plane, and
 * every added character against tokenizers); the table is made by
 * `test_tokenizer --unicode-table` (see tokenizer_unicode_table.h).
 */
#include "tokenizer_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_unicode_table.h"

typedef struct text_out {
    char *s;
    size_t len, cap;
    int failed;
} text_out;

static void put(text_out *o, const char *s, size_t n)
{
    if (o->failed)
        return;
    if (o->len + n + 1 > o->cap) {
        size_t cap = (o->len + n + 1) * 2;
        char *grown = realloc(o->s, cap);
        if (!grown) {
            o->failed = 1;
            return;
        }
        o->s = grown;
        o->cap = cap;
    }
    memcpy(o->s + o->len, s, n);
    o->len += n;
    o->s[o->len] = 0;
}

static void put_str(text_out *o, const char *s) { put(o, s, strlen(s)); }

static const ddt_tok_class_added *class_added(const char *name, size_t n)
{
    for (size_t k = 0; k < sizeof ddt_tok_classes_added / sizeof ddt_tok_classes_added[0]; k++)
        if (strlen(ddt_tok_classes_added[k].name) == n && !memcmp(ddt_tok_classes_added[k].name, name, n))
            return &ddt_tok_classes_added[k];
    return NULL;
}

/* \p{NAME} (or, negated, [^\p{NAME}...]) with the added ranges; a bracket opened here unless the
 * property is a plain member of a class already open */
static void put_class(text_out *o, const ddt_tok_class_added *c, int negated, int in_class)
{
    int bracket = !in_class || negated;
    if (bracket)
        put_str(o, negated ? "[^" : "[");
    char b[64];
    snprintf(b, sizeof b, "\\p{%s}", c->name);
    put_str(o, b);
    for (int k = 0; k < c->count; k++) {
        snprintf(b, sizeof b, "\\x{%x}-\\x{%x}", c->ranges[k][0], c->ranges[k][1]);
        put_str(o, b);
    }
    if (bracket)
        put_str(o, "]");
}

int ddt_tok_nfc_unassigned(uint32_t cp)
{
    size_t lo = 0, hi = sizeof nfc_unassigned / sizeof nfc_unassigned[0];
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < nfc_unassigned[mid][0])
            hi = mid;
        else if (cp > nfc_unassigned[mid][1])
            lo = mid + 1;
        else
            return 1;
    }
    return 0;
}

const ddt_tok_class_added *ddt_tok_classes_added_table(int *count)
{
    *count = (int)(sizeof ddt_tok_classes_added / sizeof ddt_tok_classes_added[0]);
    return ddt_tok_classes_added;
}

char *ddt_tok_regex_upgrade(const char *p)
{
    text_out o = {0};
    put(&o, "", 0);
    int depth = 0;   /* open brackets */
    for (size_t i = 0; p[i];) {
        if (p[i] == '\\' && (p[i + 1] == 'p' || p[i + 1] == 'P') && p[i + 2] == '{') {
            const char *name = p + i + 3, *close = strchr(name, '}');
            int negated = p[i + 1] == 'P';
            if (close && *name == '^') {
                negated = !negated;
                name++;
            }
            const ddt_tok_class_added *c = close ? class_added(name, (size_t)(close - name)) : NULL;
            if (c) {
                put_class(&o, c, negated, depth > 0);
                i = (size_t)(close - p) + 1;
                continue;
            }
        }
        if (p[i] == '\\' && p[i + 1]) {   /* any other escape, as it is */
            put(&o, p + i, 2);
            i += 2;
            continue;
        }
        if (p[i] == '[')
            depth++;
        else if (p[i] == ']' && depth > 0)
            depth--;
        put(&o, p + i, 1);
        i++;
    }
    if (o.failed) {
        free(o.s);
        return NULL;
    }
    return o.s;
}
