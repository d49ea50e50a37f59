/* tokenizer.c: encode and decode with a loaded ddt_tokenizer (tokenizer.h): UTF-8 checked, added
 * tokens split out, NFC (tokenizer_unicode.c), the Split regexes (Oniguruma), BPE by merge rank
 * through the sharded piece cache; and the lookups. The loader is tokenizer_load.c, the tables
 * it fills tokenizer_tables.h.
 * Tested by tests/engine/data/test_tokenizer.c (ids against Hugging Face `tokenizers`, round trips, threads).
 */
#include "tokenizer.h"
#include "tokenizer_tables.h"
#include "tokenizer_unicode.h"

#include "base/errors.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

void ddt_token_ids_free(ddt_token_ids *t)
{
    free(t->ids);
    *t = (ddt_token_ids){0};
}

static int push_ids(ddt_token_ids *out, const int32_t *ids, size_t n)
{
    if (out->count + n > out->cap) {
        size_t cap = out->cap ? out->cap : 256;
        while (cap < out->count + n)
            cap *= 2;
        int32_t *grown = realloc(out->ids, cap * sizeof *grown);
        if (!grown)
            return -ENOMEM;
        out->ids = grown;
        out->cap = cap;
    }
    memcpy(out->ids + out->count, ids, n * sizeof *ids);
    out->count += n;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * UTF-8
 */

/* the offset of the first byte that is not valid UTF-8 (RFC 3629: no overlongs, surrogates or
 * code points past U+10FFFF), or n */
static size_t utf8_invalid_at(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        while (i + 8 <= n) {   /* ASCII eight at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= n)
            break;
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t k = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : 2;
        if (c < 0xc2 || c > 0xf4 || i + k > n)
            return i;
        for (size_t j = 1; j < k; j++)
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
        if ((c == 0xe0 && s[i + 1] < 0xa0) || (c == 0xed && s[i + 1] >= 0xa0) ||
            (c == 0xf0 && s[i + 1] < 0x90) || (c == 0xf4 && s[i + 1] >= 0x90))
            return i;
        i += k;
    }
    return n;
}

/* ------------------------------------------------------------------------------------------
 * BPE
 */

enum { no_rank = UINT32_MAX, short_piece = 48 };

static inline uint32_t merge_find(const ddt_tokenizer *t, int32_t a, int32_t b, int32_t *merged)
{
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint64_t s = ddt_tok_merge_slot(t, key);; s = (s + 1) & t->merge_mask) {
        const ddt_tok_merge *m = &t->merges[s];
        if (m->key == key) {
            *merged = m->id;
            return m->rank;
        }
        if (m->key == ~0ull)
            return no_rank;
    }
}

/* A short piece: symbols in an array, the rank of each neighbouring pair beside them, the lowest
 * (leftmost on ties) merged until none is left. n <= short_piece. Returns the symbol count. */
static size_t bpe_short(const ddt_tokenizer *t, const unsigned char *p, size_t n, int32_t *sym)
{
    uint32_t rank[short_piece];
    int32_t merged[short_piece];
    for (size_t i = 0; i < n; i++)
        sym[i] = t->byte_id[p[i]];
    for (size_t i = 0; i + 1 < n; i++)
        rank[i] = merge_find(t, sym[i], sym[i + 1], &merged[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best])
                best = i;
        if (rank[best] == no_rank)
            break;
        sym[best] = merged[best];
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
        memmove(rank + best + 1, rank + best + 2, (n - best - 2) * sizeof *rank);
        memmove(merged + best + 1, merged + best + 2, (n - best - 2) * sizeof *merged);
        n--;
        if (best > 0)
            rank[best - 1] = merge_find(t, sym[best - 1], sym[best], &merged[best - 1]);
        if (best + 1 < n)
            rank[best] = merge_find(t, sym[best], sym[best + 1], &merged[best]);
    }
    return n;
}

typedef struct heap_item {
    uint32_t rank, pos;   /* ordered by rank, then position: ties to the leftmost pair */
} heap_item;

static inline int heap_less(heap_item a, heap_item b)
{
    return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos);
}

static void heap_push(heap_item *h, size_t *n, heap_item x)
{
    size_t i = (*n)++;
    while (i && heap_less(x, h[(i - 1) / 2])) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = x;
}

static heap_item heap_pop(heap_item *h, size_t *n)
{
    heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && heap_less(h[c + 1], h[c]))
            c++;
        if (!heap_less(h[c], last))
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n)
        h[i] = last;
    return top;
}

/* A long piece (n > short_piece): symbols in a linked list, the candidate merges in a heap
 * (an entry is stale once its pair is gone). Writes the ids to sym; returns their count. */
static int bpe_long(const ddt_tokenizer *t, const unsigned char *p, size_t n, int32_t *sym, size_t *count)
{
    int32_t *next = malloc(n * sizeof *next), *prev = malloc(n * sizeof *prev);
    heap_item *heap = malloc(2 * n * sizeof *heap);
    if (!next || !prev || !heap) {
        free(next), free(prev), free(heap);
        return -ENOMEM;
    }
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        sym[i] = t->byte_id[p[i]];
        next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        prev[i] = (int32_t)i - 1;
    }
    int32_t merged = -1;   /* set by every merge_find that finds the pair */
    for (size_t i = 0; i + 1 < n; i++) {
        uint32_t r = merge_find(t, sym[i], sym[i + 1], &merged);
        if (r != no_rank)
            heap_push(heap, &hn, (heap_item){r, (uint32_t)i});
    }
    while (hn) {
        heap_item m = heap_pop(heap, &hn);
        int32_t i = (int32_t)m.pos, j = next[i];
        if (sym[i] < 0 || j < 0 || merge_find(t, sym[i], sym[j], &merged) != m.rank)
            continue;   /* stale: one of its symbols was merged into another pair */
        sym[i] = merged;
        sym[j] = -1;
        next[i] = next[j];
        if (next[j] >= 0)
            prev[next[j]] = i;
        uint32_t r;
        if (prev[i] >= 0 && (r = merge_find(t, sym[prev[i]], sym[i], &merged)) != no_rank)
            heap_push(heap, &hn, (heap_item){r, (uint32_t)prev[i]});
        if (next[i] >= 0 && (r = merge_find(t, sym[i], sym[next[i]], &merged)) != no_rank)
            heap_push(heap, &hn, (heap_item){r, (uint32_t)i});
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = next[i])
        sym[k++] = sym[i];
    *count = k;
    free(next), free(prev), free(heap);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The piece cache
 */

static inline ddt_tok_cache_shard *cache_shard(const ddt_tokenizer *t, uint64_t h)
{
    return &t->cache[h % DDT_TOK_CACHE_SHARDS];
}

static inline size_t cache_set(uint64_t h) { return (size_t)(h >> 32) & (DDT_TOK_CACHE_SETS - 1); }

/* the cached ids of piece p (n <= DDT_TOK_CACHE_PIECE) into ids: their count, or -1 */
static int cache_get(const ddt_tokenizer *t, uint64_t h, const char *p, size_t n, int32_t *ids)
{
    ddt_tok_cache_shard *s = cache_shard(t, h);
    int found = -1;
    pthread_mutex_lock(&s->lock);
    const ddt_tok_cache_entry *set = s->entry[cache_set(h)];
    for (int w = 0; w < DDT_TOK_CACHE_WAYS; w++)
        if (set[w].hash == h && set[w].len == n && !memcmp(set[w].bytes, p, n)) {
            found = set[w].n_ids;
            memcpy(ids, set[w].ids, (size_t)found * sizeof *ids);
            break;
        }
    pthread_mutex_unlock(&s->lock);
    return found;
}

static void cache_put(const ddt_tokenizer *t, uint64_t h, const char *p, size_t n, const int32_t *ids, size_t n_ids)
{
    ddt_tok_cache_shard *s = cache_shard(t, h);
    size_t k = cache_set(h);
    pthread_mutex_lock(&s->lock);
    ddt_tok_cache_entry *e = &s->entry[k][s->next_way[k]];
    s->next_way[k] = (uint8_t)((s->next_way[k] + 1) % DDT_TOK_CACHE_WAYS);
    e->hash = h;
    e->len = (uint8_t)n;
    e->n_ids = (uint8_t)n_ids;
    memcpy(e->bytes, p, n);
    memcpy(e->ids, ids, n_ids * sizeof *ids);
    pthread_mutex_unlock(&s->lock);
}

/* ------------------------------------------------------------------------------------------
 * Encode
 */

/* one pre-tokenized piece's ids appended to out */
static int encode_piece(const ddt_tokenizer *t, const char *p, size_t n, ddt_token_ids *out)
{
    if (n == 1)
        return push_ids(out, &t->byte_id[(unsigned char)p[0]], 1);
    if (t->ignore_merges) {
        int32_t whole = ddt_tok_vocab_find(t, p, n);
        if (whole >= 0)
            return push_ids(out, &whole, 1);
    }
    int cached = n <= DDT_TOK_CACHE_PIECE;
    uint64_t h = 0;
    if (cached) {
        int32_t ids[DDT_TOK_CACHE_IDS];
        h = ddt_tok_hash(p, n);
        int hit = cache_get(t, h, p, n, ids);
        if (hit >= 0)
            return push_ids(out, ids, (size_t)hit);
    }
    int rc = 0;
    size_t count;
    if (n <= short_piece) {
        int32_t sym[short_piece];
        count = bpe_short(t, (const unsigned char *)p, n, sym);
        rc = push_ids(out, sym, count);
        if (!rc && cached && count <= DDT_TOK_CACHE_IDS)
            cache_put(t, h, p, n, sym, count);
    } else {
        int32_t *sym = malloc(n * sizeof *sym);
        rc = sym ? bpe_long(t, (const unsigned char *)p, n, sym, &count) : -ENOMEM;
        if (!rc)
            rc = push_ids(out, sym, count);
        free(sym);
    }
    return rc;
}

/* Split stage k on s: each match and each gap between them a piece (Isolated), each piece on to
 * the next stage, the last stage's to BPE. Matches are found as the onig crate's find_iter finds
 * them (tokenizers' SysRegex): searched from the end of the previous one over the whole piece,
 * an empty match right after the previous match skipped one character. A match that starts
 * where the search does (every one of these patterns, which cover all text) is found by
 * onig_match alone, which is the same match without the search's scan. */
static int split_stage(const ddt_tokenizer *t, int k, const char *s, size_t n, ddt_token_ids *out)
{
    if (k == t->n_splits)
        return n ? encode_piece(t, s, n, out) : 0;
    const OnigUChar *str = (const OnigUChar *)s, *end = str + n;
    size_t at = 0, gap = 0;
    long last_end = -1;
    int rc = 0;
    while (at <= n && !rc) {
        int len = onig_match(t->split[k], str, end, str + at, NULL, ONIG_OPTION_NONE);
        size_t start = at;
        if (len < 0) {
            int found = onig_search(t->split[k], str, end, str + at, end, NULL, ONIG_OPTION_NONE);
            if (found < 0)
                break;
            start = (size_t)found;
            len = onig_match(t->split[k], str, end, str + start, NULL, ONIG_OPTION_NONE);
        }
        if (len == 0 && last_end == (long)start) {
            if (at == n)
                break;
            at += (size_t)utf8proc_utf8class[(unsigned char)s[at]];
            continue;
        }
        if (start > gap)
            rc = split_stage(t, k + 1, s + gap, start - gap, out);
        if (!rc && len > 0)
            rc = split_stage(t, k + 1, s + start, (size_t)len, out);
        at = gap = start + (size_t)len;
        last_end = (long)at;
        if (len == 0 && at == n)
            break;
    }
    if (!rc && gap < n)
        rc = split_stage(t, k + 1, s + gap, n - gap, out);
    return rc;
}

/* The first entry of set at s[0..n) (the longest there), or NULL. */
static inline const ddt_tok_added *added_at(const ddt_tok_added_set *set, const char *s, size_t n)
{
    unsigned char b = (unsigned char)s[0];
    for (int k = set->bucket[b]; k < set->bucket[b + 1]; k++) {
        const ddt_tok_added *a = &set->tok[k];
        if (a->len <= n && !memcmp(a->text, s, a->len))
            return a;
    }
    return NULL;
}

/* What is done with the text between added tokens and with each added token: encode's ids, or
 * find_special's look. A handler returns 0 to go on, 1 to stop there, or a negative errno. */
typedef struct added_visit {
    const ddt_tokenizer *t;
    /* a stretch of normalised text without added tokens (NULL: not needed) */
    int (*text)(struct added_visit *v, const char *s, size_t n);
    /* an added token at byte at of the raw text (one matched after normalisation: at its
     * stretch's start) */
    int (*token)(struct added_visit *v, const ddt_tok_added *a, size_t at);
    ddt_token_ids *out;   /* encode */
    int32_t found_id;     /* find_special */
    size_t found_at;
} added_visit;

/* A stretch of raw text at byte raw_at: normalised, the normalised added tokens split out of it
 * (leftmost-longest), the rest to v->text. */
static int visit_normalised(added_visit *v, const char *s, size_t n, size_t raw_at)
{
    const ddt_tokenizer *t = v->t;
    const ddt_tok_added_set *set = &t->added_norm;
    if (!v->text && !set->count)
        return 0;
    char *nf = NULL;
    size_t len = n;
    if (t->nfc && ddt_tok_nfc(s, n, &nf, &len))
        return -ENOMEM;
    const char *p = nf ? nf : s;
    size_t gap = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc && set->count;) {
        unsigned char b = (unsigned char)p[i];
        const ddt_tok_added *a = set->bucket[b] < set->bucket[b + 1] ? added_at(set, p + i, len - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        if (i > gap && v->text)
            rc = v->text(v, p + gap, i - gap);
        if (!rc)
            rc = v->token(v, a, raw_at);
        i += a->len;
        gap = i;
    }
    if (!rc && gap < len && v->text)
        rc = v->text(v, p + gap, len - gap);
    free(nf);
    return rc;
}

/* The raw added tokens split out of text (leftmost-longest), each stretch between them to
 * visit_normalised. */
static int visit_added(added_visit *v, const char *text, size_t len)
{
    const ddt_tok_added_set *set = &v->t->added_raw;
    size_t gap = 0;
    int rc = 0;
    for (size_t i = 0; i < len && !rc && set->count;) {
        unsigned char b = (unsigned char)text[i];
        const ddt_tok_added *a = set->bucket[b] < set->bucket[b + 1] ? added_at(set, text + i, len - i) : NULL;
        if (!a) {
            i++;
            continue;
        }
        if (i > gap)
            rc = visit_normalised(v, text + gap, i - gap, gap);
        if (!rc)
            rc = v->token(v, a, i);
        i += a->len;
        gap = i;
    }
    if (!rc && gap < len)
        rc = visit_normalised(v, text + gap, len - gap, gap);
    return rc;
}

static int text_ids(added_visit *v, const char *s, size_t n) { return split_stage(v->t, 0, s, n, v->out); }

static int token_id(added_visit *v, const ddt_tok_added *a, size_t at)
{
    (void)at;
    return push_ids(v->out, &a->id, 1);
}

int ddt_tokenizer_encode(const ddt_tokenizer *t, const char *text, size_t len, unsigned flags,
                         ddt_token_ids *out, char *err, size_t err_len)
{
    size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return ddt_fail(err, err_len, -EILSEQ, "text is not valid UTF-8 at byte %zu", bad);
    size_t before = out->count;
    int rc;
    if (flags & DDT_TOKENIZE_ADDED) {
        added_visit v = {.t = t, .text = text_ids, .token = token_id, .out = out};
        rc = visit_added(&v, text, len);
    } else {
        char *nf = NULL;
        size_t nf_len = len;
        rc = t->nfc ? ddt_tok_nfc(text, len, &nf, &nf_len) : 0;
        if (!rc)
            rc = split_stage(t, 0, nf ? nf : text, nf_len, out);
        free(nf);
    }
    if (rc) {
        out->count = before;
        return ddt_fail(err, err_len, rc, "out of memory encoding %zu bytes of text", len);
    }
    return 0;
}

static int token_special(added_visit *v, const ddt_tok_added *a, size_t at)
{
    if (v->t->kind[a->id] != DDT_TOK_SPECIAL)
        return 0;
    v->found_id = a->id;
    v->found_at = at;
    return 1;
}

int ddt_tokenizer_find_special(const ddt_tokenizer *t, const char *text, size_t len, int32_t *id,
                               size_t *at, char *err, size_t err_len)
{
    size_t bad = utf8_invalid_at((const unsigned char *)text, len);
    if (bad < len)
        return ddt_fail(err, err_len, -EILSEQ, "text is not valid UTF-8 at byte %zu", bad);
    added_visit v = {.t = t, .token = token_special};
    int rc = visit_added(&v, text, len);
    if (rc < 0)
        return ddt_fail(err, err_len, rc, "out of memory looking at %zu bytes of text", len);
    if (rc == 1) {
        if (id)
            *id = v.found_id;
        if (at)
            *at = v.found_at;
    }
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Decode and lookups
 */

int ddt_tokenizer_decode(const ddt_tokenizer *t, const int32_t *ids, size_t count, char **text,
                         size_t *len, char *err, size_t err_len)
{
    size_t total = 0, n;
    for (size_t k = 0; k < count; k++) {
        if (!ddt_tok_bytes(t, ids[k], &n))
            return ddt_fail(err, err_len, -EINVAL, "id %d (at %zu) is not a token of this tokenizer", (int)ids[k], k);
        total += n;
    }
    char *out = malloc(total + 1);
    if (!out)
        return ddt_fail(err, err_len, -ENOMEM, "out of memory for %zu bytes of decoded text", total);
    size_t at = 0;
    for (size_t k = 0; k < count; k++) {
        const char *b = ddt_tok_bytes(t, ids[k], &n);
        memcpy(out + at, b, n);
        at += n;
    }
    out[at] = 0;
    *text = out;
    *len = at;
    return 0;
}

const char *ddt_tokenizer_token_bytes(const ddt_tokenizer *t, int32_t id, size_t *len)
{
    return ddt_tok_bytes(t, id, len);
}

int32_t ddt_tokenizer_vocab_size(const ddt_tokenizer *t) { return t->n_ids; }

int32_t ddt_tokenizer_token_id(const ddt_tokenizer *t, const char *token)
{
    size_t n = strlen(token);
    if (!n)
        return -1;
    const ddt_tok_added_set *sets[2] = {&t->added_raw, &t->added_norm};
    for (int s = 0; s < 2; s++) {
        const ddt_tok_added *a = added_at(sets[s], token, n);
        if (a && a->len == n)
            return a->id;
    }
    return ddt_tok_vocab_find(t, token, n);
}

int ddt_tokenizer_is_special(const ddt_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->n_ids && t->kind[id] == DDT_TOK_SPECIAL;
}
