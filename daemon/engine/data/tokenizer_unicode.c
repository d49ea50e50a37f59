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
 * normaliser (ddt_tok_nfc, below) cuts the text at them, each piece normalised alone.
 * Tested by tests/engine/data/test_tokenizer.c (the Qwen3 corpus's random code points of every plane, and
 * every added character against tokenizers); the table is made by
 * `test_tokenizer --unicode-table` (see tokenizer_unicode_table.h).
 */
#include "tokenizer_unicode.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

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

/* ------------------------------------------------------------------------------------------
 * NFC as tokenizers' normaliser does it
 */

/* The characters of the Basic Multilingual Plane that NFC keeps as they are whatever surrounds
 * them: a starter (combining class 0) that is its own NFC and never the second of a composition
 * (utf8proc's comb_index of a second is 0x8000 or more), Hangul jamo left out (composed
 * algorithmically). A text of only these is NFC: utf8proc is not called. */
static uint8_t nfc_stable_bmp[0x10000 / 8];
static pthread_once_t nfc_stable_once = PTHREAD_ONCE_INIT;

static void nfc_stable_init(void)
{
    for (utf8proc_int32_t cp = 0; cp < 0x10000; cp++) {
        if ((cp >= 0xd800 && cp <= 0xdfff) || (cp >= 0x1100 && cp <= 0x11ff))
            continue;
        const utf8proc_property_t *p = utf8proc_get_property(cp);
        if (p->combining_class || (p->comb_index != UINT16_MAX && p->comb_index >= 0x8000))
            continue;
        utf8proc_uint8_t b[4], *nf = NULL;
        utf8proc_ssize_t n = utf8proc_encode_char(cp, b);
        utf8proc_ssize_t m = utf8proc_map(b, n, &nf, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m == n && !memcmp(nf, b, (size_t)n))
            nfc_stable_bmp[cp >> 3] |= (uint8_t)(1u << (cp & 7));
        free(nf);
    }
}

/* whether s is NFC by nfc_stable_bmp (and the emoji planes' pictographs, all starters) */
static int quick_nfc(const unsigned char *s, size_t n)
{
    pthread_once(&nfc_stable_once, nfc_stable_init);
    for (size_t i = 0; i < n;) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate(s + i, (utf8proc_ssize_t)(n - i), &cp);
        i += (size_t)k;
        if (cp < 0x10000 ? nfc_stable_bmp[cp >> 3] >> (cp & 7) & 1 : cp >= 0x1f300 && cp <= 0x1faff)
            continue;
        return 0;
    }
    return 1;
}

/* s (n bytes) appended to o (*len of *cap used); 0 or -ENOMEM */
static int nfc_append_raw(const char *s, size_t n, char **o, size_t *len, size_t *cap)
{
    if (!n)
        return 0;
    if (*len + n + 1 > *cap) {
        size_t grown_cap = 2 * (*len + n + 1);
        char *grown = realloc(*o, grown_cap);
        if (!grown)
            return -ENOMEM;
        *o = grown;
        *cap = grown_cap;
    }
    memcpy(*o + *len, s, n);
    *len += n;
    return 0;
}

/* utf8proc's NFC of s (n bytes) appended to o; 0 or -ENOMEM */
static int nfc_append(const char *s, size_t n, char **o, size_t *len, size_t *cap)
{
    utf8proc_uint8_t *nf = NULL;
    utf8proc_ssize_t m = n ? utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nf,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE)
                           : 0;
    if (m < 0)
        return -ENOMEM;   /* the input is valid UTF-8: only memory can fail */
    int rc = nfc_append_raw((const char *)nf, (size_t)m, o, len, cap);
    free(nf);
    return rc;
}

int ddt_tok_nfc(const char *s, size_t n, char **out, size_t *out_len)
{
    *out = NULL;
    if (quick_nfc((const unsigned char *)s, n))
        return 0;
    /* cut at the characters tokenizers' NFC takes for unassigned starters (tokenizer_unicode.c):
     * nothing reorders or composes across a starter that composes with nothing */
    char *o = NULL;
    size_t len = 0, cap = 0, piece = 0;
    int rc = 0;
    for (size_t i = 0; i < n && !rc;) {
        utf8proc_int32_t cp;
        utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
        if (cp >= 0x300 && ddt_tok_nfc_unassigned((uint32_t)cp)) {
            rc = nfc_append(s + piece, i - piece, &o, &len, &cap);
            if (!rc)
                rc = nfc_append_raw(s + i, (size_t)k, &o, &len, &cap);
            piece = i + (size_t)k;
        }
        i += (size_t)k;
    }
    if (!rc)
        rc = nfc_append(s + piece, n - piece, &o, &len, &cap);
    if (rc || !o) {   /* !o: an empty text */
        free(o);
        return rc;
    }
    *out = o;
    *out_len = len;
    return 0;
}
