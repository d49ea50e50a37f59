/* tokenizer_load.c: ddt_tokenizer_open: a tokenizer.json read with cJSON, every component
 * checked against the one kind tokenizer.h supports (anything else refused with its path in the
 * JSON named), and turned into the tables the encoder reads: token bytes, the vocabulary and
 * merge hashes, the compiled Split regexes, the added-token sets.
 * Tested by tests/engine/data/test_tokenizer.c (the refusals on hand-made files; the real Qwen3 file).
 */
#include "tokenizer.h"
#include "tokenizer_tables.h"
#include "tokenizer_unicode.h"

#include "base/errors.h"
#include "base/json_fields.h"
#include "base/read_file.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* GPT-2's split, what ByteLevel with use_regex applies (tokenizers' pre_tokenizers/byte_level.rs) */
static const char gpt2_split[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

enum { max_file_bytes = 1 << 30 };

typedef struct loader {
    const char *path;
    char *err;
    size_t err_len;
    ddt_tokenizer *t;
    int16_t byte_of_cp[324];   /* the byte-level alphabet: code point -> byte, -1 outside it */
    size_t bytes_used, bytes_cap;
} loader;

static int fail(loader *ld, const char *fmt, const char *a, const char *b)
{
    char what[512];
    snprintf(what, sizeof what, fmt, a, b);
    return ddt_fail_path(ld->err, ld->err_len, -EINVAL, ld->path, "%s", what);
}

static uint64_t pow2_at_least(uint64_t n)
{
    uint64_t c = 16;
    while (c < n)
        c <<= 1;
    return c;
}

/* ------------------------------------------------------------------------------------------
 * Tokens
 */

static void byte_level_alphabet(loader *ld)
{
    int n = 0;
    for (int c = 0; c < 324; c++)
        ld->byte_of_cp[c] = -1;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        ld->byte_of_cp[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* s (UTF-8 of byte-level characters) -> its bytes in out (at most strlen(s)); -1 when a
 * character is outside the alphabet */
static int byte_level_decode(const loader *ld, const char *s, char *out, size_t *n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    while (*p) {
        int cp;
        if (p[0] < 0x80) {
            cp = p[0];
            p += 1;
        } else if ((p[0] & 0xe0) == 0xc0 && (p[1] & 0xc0) == 0x80) {
            cp = (p[0] & 0x1f) << 6 | (p[1] & 0x3f);
            p += 2;
        } else {
            return -1;   /* every character of the alphabet is below U+0800 */
        }
        if (cp >= 324 || ld->byte_of_cp[cp] < 0)
            return -1;
        out[k++] = (char)ld->byte_of_cp[cp];
    }
    *n = k;
    return 0;
}

static int set_token(loader *ld, int32_t id, const char *bytes, size_t n, int kind)
{
    ddt_tokenizer *t = ld->t;
    if (ld->bytes_used + n > ld->bytes_cap || n >= (1u << 24))
        return ddt_fail_path(ld->err, ld->err_len, -EINVAL, ld->path, "token %d is too long", (int)id);
    memcpy(t->token_bytes + ld->bytes_used, bytes, n);
    t->token_at[id] = (uint64_t)ld->bytes_used << 24 | n;
    t->kind[id] = (uint8_t)kind;
    ld->bytes_used += n;
    return 0;
}

static int load_vocab(loader *ld, const cJSON *vocab, const cJSON *added)
{
    ddt_tokenizer *t = ld->t;
    if (!cJSON_IsObject(vocab))
        return fail(ld, "model.vocab must be an object of token -> id", NULL, NULL);
    if (added && !cJSON_IsArray(added))
        return fail(ld, "added_tokens must be a list", NULL, NULL);
    double max_id = -1;
    size_t text_bytes = 0;
    int count = 0;
    for (const cJSON *v = vocab->child; v; v = v->next, count++) {
        if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble > 0x7ffffffe ||
            v->valuedouble != (double)(int32_t)v->valuedouble)
            return fail(ld, "model.vocab[\"%s\"] must be an id in [0, 2^31 - 1)", v->string, NULL);
        max_id = v->valuedouble > max_id ? v->valuedouble : max_id;
        text_bytes += strlen(v->string);
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(a, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(a, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble > 0x7ffffffe ||
            id->valuedouble != (double)(int32_t)id->valuedouble || !cJSON_IsString(content) ||
            !content->valuestring[0])
            return fail(ld, "added_tokens: each must have an id in [0, 2^31 - 1) and a non-empty content", NULL, NULL);
        max_id = id->valuedouble > max_id ? id->valuedouble : max_id;
        text_bytes += strlen(content->valuestring);
    }
    t->n_ids = (int32_t)max_id + 1;
    ld->bytes_cap = text_bytes;
    t->token_bytes = malloc(text_bytes ? text_bytes : 1);
    t->token_at = calloc((size_t)t->n_ids + 1, sizeof *t->token_at);
    t->kind = calloc((size_t)t->n_ids + 1, 1);
    uint64_t cap = pow2_at_least(2 * (uint64_t)count);
    t->vocab_slots = calloc(cap, sizeof *t->vocab_slots);
    t->vocab_mask = cap - 1;
    if (!t->token_bytes || !t->token_at || !t->kind || !t->vocab_slots)
        return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for the vocabulary");

    char *bytes = malloc(text_bytes + 1);
    if (!bytes)
        return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for the vocabulary");
    int rc = 0;
    for (const cJSON *v = vocab->child; v && !rc; v = v->next) {
        int32_t id = (int32_t)v->valuedouble;
        size_t n;
        if (byte_level_decode(ld, v->string, bytes, &n) || !n)
            rc = fail(ld, "model.vocab[\"%s\"] has a character outside the byte-level alphabet (not a byte-level BPE vocabulary)", v->string, NULL);
        else if (t->kind[id] != DDT_TOK_NONE)
            rc = fail(ld, "model.vocab[\"%s\"]: its id is another token's too", v->string, NULL);
        else if (ddt_tok_vocab_find(t, bytes, n) >= 0)
            rc = fail(ld, "model.vocab[\"%s\"] appears twice", v->string, NULL);
        else if (!(rc = set_token(ld, id, bytes, n, DDT_TOK_VOCAB))) {
            uint64_t s = ddt_tok_hash(bytes, n) & t->vocab_mask;
            while (t->vocab_slots[s])
                s = (s + 1) & t->vocab_mask;
            t->vocab_slots[s] = (uint32_t)id + 1;
        }
    }
    free(bytes);
    for (int b = 0; b < 256 && !rc; b++) {
        char c = (char)b;
        t->byte_id[b] = ddt_tok_vocab_find(t, &c, 1);
        if (t->byte_id[b] < 0) {
            char hex[8];
            snprintf(hex, sizeof hex, "0x%02x", b);
            rc = fail(ld, "model.vocab lacks the token of byte %s (not a byte-level BPE vocabulary)", hex, NULL);
        }
    }
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Merges
 */

/* one merge's two parts, from "a b" or ["a", "b"] */
static int merge_parts(const cJSON *m, const char **a, const char **b, char *scratch, size_t cap)
{
    if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(m->child) &&
        cJSON_IsString(m->child->next)) {
        *a = m->child->valuestring;
        *b = m->child->next->valuestring;
        return 0;
    }
    if (!cJSON_IsString(m))
        return -1;
    const char *space = strchr(m->valuestring, ' ');
    size_t n = strlen(m->valuestring);
    if (!space || strchr(space + 1, ' ') || n >= cap)
        return -1;
    memcpy(scratch, m->valuestring, n + 1);
    scratch[space - m->valuestring] = 0;
    *a = scratch;
    *b = scratch + (space - m->valuestring) + 1;
    return 0;
}

static int load_merges(loader *ld, const cJSON *merges)
{
    ddt_tokenizer *t = ld->t;
    if (!cJSON_IsArray(merges))
        return fail(ld, "model.merges must be a list", NULL, NULL);
    int count = cJSON_GetArraySize(merges);
    uint64_t cap = pow2_at_least(2 * (uint64_t)count);
    t->merges = malloc(cap * sizeof *t->merges);
    t->merge_mask = cap - 1;
    t->merge_shift = 64 - __builtin_ctzll(cap);
    if (!t->merges)
        return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for the merges");
    for (uint64_t s = 0; s < cap; s++)
        t->merges[s].key = ~0ull;
    char scratch[1024], left[512], right[512], joined[1024];
    uint32_t rank = 0;
    for (const cJSON *m = merges->child; m; m = m->next, rank++) {
        const char *a, *b;
        size_t na, nb;
        char at[32];
        snprintf(at, sizeof at, "%u", rank);
        if (merge_parts(m, &a, &b, scratch, sizeof scratch) || strlen(a) >= sizeof left ||
            strlen(b) >= sizeof right)
            return fail(ld, "model.merges[%s] must be \"A B\" or [\"A\", \"B\"]", at, NULL);
        if (byte_level_decode(ld, a, left, &na) || byte_level_decode(ld, b, right, &nb))
            return fail(ld, "model.merges[%s] has a character outside the byte-level alphabet", at, NULL);
        int32_t ia = ddt_tok_vocab_find(t, left, na), ib = ddt_tok_vocab_find(t, right, nb);
        memcpy(joined, left, na);
        memcpy(joined + na, right, nb);
        int32_t ij = ddt_tok_vocab_find(t, joined, na + nb);
        if (ia < 0 || ib < 0 || ij < 0)
            return fail(ld, "model.merges[%s]: a part or the merged token is not in model.vocab", at, NULL);
        uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
        uint64_t s = ddt_tok_merge_slot(t, key);
        while (t->merges[s].key != ~0ull && t->merges[s].key != key)
            s = (s + 1) & t->merge_mask;
        /* a pair listed twice keeps its later rank, as tokenizers does */
        t->merges[s] = (ddt_tok_merge){.key = key, .rank = rank, .id = ij};
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * The model, the normaliser, the pre-tokenizer, the decoder
 */

static int is_null_or_absent(const cJSON *x) { return !x || cJSON_IsNull(x); }

static int load_model(loader *ld, const cJSON *model, const cJSON *added)
{
    if (!cJSON_IsObject(model))
        return fail(ld, "model must be an object", NULL, NULL);
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE"))
        return fail(ld, "model.type '%s' is not supported (only byte-level BPE)",
                    cJSON_IsString(type) ? type->valuestring : "(missing)", NULL);
    static const char *const must_be_null[] = {"dropout", "unk_token"};
    for (size_t k = 0; k < 2; k++)
        if (!is_null_or_absent(cJSON_GetObjectItemCaseSensitive(model, must_be_null[k])))
            return fail(ld, "model.%s is not supported (only null)", must_be_null[k], NULL);
    static const char *const must_be_empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, must_be_empty[k]);
        if (!is_null_or_absent(x) && !(cJSON_IsString(x) && !x->valuestring[0]))
            return fail(ld, "model.%s is not supported (only null or \"\")", must_be_empty[k], NULL);
    }
    static const char *const must_be_false[] = {"fuse_unk", "byte_fallback"};
    for (size_t k = 0; k < 2; k++) {
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(model, must_be_false[k]);
        if (!is_null_or_absent(x) && !cJSON_IsFalse(x))
            return fail(ld, "model.%s is not supported (only false)", must_be_false[k], NULL);
    }
    const cJSON *ignore = cJSON_GetObjectItemCaseSensitive(model, "ignore_merges");
    if (!is_null_or_absent(ignore) && !cJSON_IsBool(ignore))
        return fail(ld, "model.ignore_merges must be true or false", NULL, NULL);
    ld->t->ignore_merges = cJSON_IsTrue(ignore);
    int rc = load_vocab(ld, cJSON_GetObjectItemCaseSensitive(model, "vocab"), added);
    return rc ? rc : load_merges(ld, cJSON_GetObjectItemCaseSensitive(model, "merges"));
}

static const char *type_of(const cJSON *x)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(x, "type");
    return cJSON_IsString(type) ? type->valuestring : "(no type)";
}

static int load_normalizer(loader *ld, const cJSON *n)
{
    if (is_null_or_absent(n))
        return 0;
    if (!strcmp(type_of(n), "NFC")) {
        ld->t->nfc = 1;
        return 0;
    }
    if (!strcmp(type_of(n), "Sequence")) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(n, "normalizers");
        int k = 0;
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next, k++) {
            char at[48];
            snprintf(at, sizeof at, "normalizer.normalizers[%d]", k);
            if (strcmp(type_of(x), "NFC"))
                return fail(ld, "%s.type '%s' is not supported (only NFC, or no normalizer)", at, type_of(x));
            ld->t->nfc = 1;
        }
        return 0;
    }
    return fail(ld, "normalizer.type '%s' is not supported (only NFC, or no normalizer)", type_of(n), NULL);
}

static int compile_split(loader *ld, const char *pattern, const char *at)
{
    ddt_tokenizer *t = ld->t;
    if (t->n_splits == DDT_TOK_MAX_SPLITS)
        return fail(ld, "%s: more Split stages than this reader handles", at, NULL);
    OnigErrorInfo info;
    /* its classes with the newer Unicode of tokenizers' Oniguruma (tokenizer_unicode.c), and a
     * branch that never matches (after (?!)) holding 32 empty groups: Oniguruma copies its match
     * stack to the heap at the end of every match when it began on alloca (STACK_SAVE, for a
     * search that resumes), and starts it on the heap without a copy once a pattern has more than
     * 25 groups (ALLOCA_PTR_NUM_LIMIT): 190 -> 80 ns a match here, the same matches. */
    char *classes = ddt_tok_regex_upgrade(pattern);
    size_t n = classes ? strlen(classes) : 0;
    char *upgraded = classes ? malloc(n + 128) : NULL;
    if (upgraded)
        snprintf(upgraded, n + 128, "(?:%s)|(?!)%s", classes,
                 "()()()()()()()()()()()()()()()()()()()()()()()()()()()()()()()()");
    free(classes);
    if (!upgraded)
        return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for a Split regex");
    /* what the onig crate's Regex::new does: no options, the default (Oniguruma) syntax, UTF-8 */
    int r = onig_new(&t->split[t->n_splits], (const OnigUChar *)upgraded,
                     (const OnigUChar *)upgraded + strlen(upgraded), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                     ONIG_SYNTAX_DEFAULT, &info);
    free(upgraded);
    if (r != ONIG_NORMAL) {
        OnigUChar msg[ONIG_MAX_ERROR_MESSAGE_LEN];
        onig_error_code_to_str(msg, r, &info);
        return fail(ld, "%s.pattern.Regex does not compile: %s", at, (const char *)msg);
    }
    t->n_splits++;
    return 0;
}

static int load_split(loader *ld, const cJSON *s, const char *at)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(s, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(s, "behavior");
    const cJSON *invert = cJSON_GetObjectItemCaseSensitive(s, "invert");
    if (!cJSON_IsString(regex))
        return fail(ld, "%s.pattern is not supported (only {\"Regex\": ...})", at, NULL);
    if (!cJSON_IsString(behavior) || strcmp(behavior->valuestring, "Isolated"))
        return fail(ld, "%s.behavior '%s' is not supported (only Isolated)", at,
                    cJSON_IsString(behavior) ? behavior->valuestring : "(missing)");
    if (!is_null_or_absent(invert) && !cJSON_IsFalse(invert))
        return fail(ld, "%s.invert is not supported (only false)", at, NULL);
    return compile_split(ld, regex->valuestring, at);
}

static int load_byte_level(loader *ld, const cJSON *b, const char *at)
{
    /* tokenizers' default for a missing add_prefix_space is true, for use_regex true */
    const cJSON *prefix = cJSON_GetObjectItemCaseSensitive(b, "add_prefix_space");
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(b, "use_regex");
    if (!cJSON_IsFalse(prefix))
        return fail(ld, "%s.add_prefix_space is not supported (only false)", at, NULL);
    if (!cJSON_IsFalse(use_regex))
        return compile_split(ld, gpt2_split, at);
    return 0;
}

static int load_pre_tokenizer(loader *ld, const cJSON *p)
{
    if (is_null_or_absent(p))
        return fail(ld, "pre_tokenizer null is not supported (byte-level BPE needs ByteLevel)", NULL, NULL);
    if (!strcmp(type_of(p), "ByteLevel"))
        return load_byte_level(ld, p, "pre_tokenizer");
    if (strcmp(type_of(p), "Sequence"))
        return fail(ld, "pre_tokenizer.type '%s' is not supported (only ByteLevel, or a Sequence of Splits then ByteLevel)", type_of(p), NULL);
    const cJSON *list = cJSON_GetObjectItemCaseSensitive(p, "pretokenizers");
    int count = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0, k = 0;
    for (const cJSON *x = count ? list->child : NULL; x; x = x->next, k++) {
        char at[64];
        snprintf(at, sizeof at, "pre_tokenizer.pretokenizers[%d]", k);
        int rc;
        if (!strcmp(type_of(x), "Split") && k < count - 1)
            rc = load_split(ld, x, at);
        else if (!strcmp(type_of(x), "ByteLevel") && k == count - 1)
            rc = load_byte_level(ld, x, at);
        else
            rc = fail(ld, "%s.type '%s' is not supported here (only Splits, then ByteLevel last)", at, type_of(x));
        if (rc)
            return rc;
    }
    if (!count)
        return fail(ld, "pre_tokenizer.pretokenizers must end with ByteLevel", NULL, NULL);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Added tokens
 */

/* first byte, then longest first, then bytes (so that a duplicate is a neighbour) */
static int added_cmp(const void *x, const void *y)
{
    const ddt_tok_added *a = x, *b = y;
    unsigned char fa = (unsigned char)a->text[0], fb = (unsigned char)b->text[0];
    if (fa != fb)
        return fa - fb;
    if (a->len != b->len)
        return a->len < b->len ? 1 : -1;
    return memcmp(a->text, b->text, a->len);
}

/* Sorts set's entries into its buckets; -1 when two are the same text. */
static int sort_added(ddt_tok_added_set *set)
{
    qsort(set->tok, (size_t)set->count, sizeof *set->tok, added_cmp);
    memset(set->bucket, 0, sizeof set->bucket);
    for (int k = 0; k < set->count; k++) {
        if (k && !added_cmp(&set->tok[k - 1], &set->tok[k]))
            return -1;
        set->bucket[(unsigned char)set->tok[k].text[0] + 1]++;
    }
    for (int b = 0; b < 256; b++)
        set->bucket[b + 1] += set->bucket[b];
    return 0;
}

static int load_added(loader *ld, const cJSON *added)
{
    ddt_tokenizer *t = ld->t;
    int count = added ? cJSON_GetArraySize(added) : 0, k = 0;
    ddt_tok_added_set *sets[2] = {&t->added_raw, &t->added_norm};
    for (int s = 0; s < 2; s++)
        if (!(sets[s]->tok = malloc((size_t)(count + 1) * sizeof *sets[s]->tok)))
            return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for added_tokens");
    size_t norm_bytes = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next)
        norm_bytes += 4 * strlen(cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring) + 1;
    t->added_text = malloc(norm_bytes + 1);
    if (!t->added_text)
        return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for added_tokens");
    size_t norm_used = 0;
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next, k++) {
        char at[48];
        snprintf(at, sizeof at, "added_tokens[%d]", k);
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        const char *content = cJSON_GetObjectItemCaseSensitive(a, "content")->valuestring;
        size_t n = strlen(content);
        static const char *const must_be_false[] = {"single_word", "lstrip", "rstrip"};
        for (int f = 0; f < 3; f++)
            if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, must_be_false[f])))
                return fail(ld, "%s.%s is not supported (only false)", at, must_be_false[f]);
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "special"));
        int normalized = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(a, "normalized"));
        int32_t in_vocab = ddt_tok_vocab_find(t, content, n);
        if (t->kind[id] == DDT_TOK_ADDED || t->kind[id] == DDT_TOK_SPECIAL)
            return fail(ld, "%s: its id is another added token's too", at, NULL);
        if (in_vocab >= 0 && in_vocab != id)
            return fail(ld, "%s: its content is in model.vocab under another id", at, NULL);
        if (t->kind[id] == DDT_TOK_VOCAB && in_vocab != id)
            return fail(ld, "%s: its id is model.vocab's token of other content", at, NULL);
        if (t->kind[id] == DDT_TOK_VOCAB)
            t->kind[id] = special ? DDT_TOK_SPECIAL : DDT_TOK_ADDED;
        else {
            int rc = set_token(ld, id, content, n, special ? DDT_TOK_SPECIAL : DDT_TOK_ADDED);
            if (rc)
                return rc;
        }
        ddt_tok_added_set *set = normalized ? &t->added_norm : &t->added_raw;
        const char *pattern = content;
        size_t plen = n;
        if (normalized && t->nfc) {   /* matched in normalised text: its normal form */
            char *nf;
            size_t nf_len;
            if (ddt_tok_nfc(content, n, &nf, &nf_len))
                return ddt_fail_path(ld->err, ld->err_len, -ENOMEM, ld->path, "out of memory for added_tokens");
            if (nf) {
                if (nf_len > 4 * n) {
                    free(nf);
                    return fail(ld, "%s: its normal form is too long", at, NULL);
                }
                memcpy(t->added_text + norm_used, nf, nf_len);
                free(nf);
                pattern = t->added_text + norm_used;
                plen = nf_len;
                norm_used += nf_len + 1;
            }
        }
        size_t len;
        set->tok[set->count++] = (ddt_tok_added){
            .text = pattern == content ? ddt_tok_bytes(t, id, &len) : pattern, .len = (uint32_t)plen, .id = id};
    }
    for (int s = 0; s < 2; s++)
        if (sort_added(sets[s]))
            return fail(ld, "added_tokens: two have the same content", NULL, NULL);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Open and close
 */

static pthread_once_t onig_once = PTHREAD_ONCE_INIT;
static void onig_start(void)
{
    OnigEncoding utf8 = ONIG_ENCODING_UTF8;
    onig_initialize(&utf8, 1);
}

static int load(loader *ld, const cJSON *root)
{
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (cJSON_IsNull(added))
        added = NULL;
    int rc = load_model(ld, cJSON_GetObjectItemCaseSensitive(root, "model"), added);
    if (!rc)
        rc = load_normalizer(ld, cJSON_GetObjectItemCaseSensitive(root, "normalizer"));
    if (!rc)
        rc = load_pre_tokenizer(ld, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer"));
    const cJSON *decoder = cJSON_GetObjectItemCaseSensitive(root, "decoder");
    if (!rc && strcmp(type_of(decoder), "ByteLevel"))
        rc = fail(ld, "decoder.type '%s' is not supported (only ByteLevel)",
                  is_null_or_absent(decoder) ? "null" : type_of(decoder), NULL);
    /* post_processor, truncation and padding are not applied (tokenizer.h) */
    if (!rc)
        rc = load_added(ld, added);
    return rc;
}

ddt_tokenizer *ddt_tokenizer_open(const char *path, char *err, size_t err_len)
{
    pthread_once(&onig_once, onig_start);
    /* not ddt_json_parse_file: its duplicate-key check is quadratic in an object's keys, and a
     * vocabulary has 150,000 of them */
    struct stat st;
    if (stat(path, &st) != 0 && errno == ENOENT) {   /* the common first mistake: say what it must be */
        ddt_fail_path(err, err_len, -ENOENT, path, "no such file: chat data is tokenized with the model's own "
                      "Hugging Face tokenizer.json: put the one that came with the model (its Hub repository has "
                      "it) in the model directory");
        return NULL;
    }
    char *text = ddt_read_text_file(path, max_file_bytes, err, err_len);
    if (!text)
        return NULL;
    cJSON *root = ddt_json_parse_object(path, text, err, err_len);
    free(text);
    if (!root)
        return NULL;
    loader ld = {.path = path, .err = err, .err_len = err_len};
    byte_level_alphabet(&ld);
    ld.t = calloc(1, sizeof *ld.t);
    int rc = ld.t ? load(&ld, root) : ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    cJSON_Delete(root);
    if (!rc) {
        ld.t->cache = calloc(DDT_TOK_CACHE_SHARDS, sizeof *ld.t->cache);
        if (!ld.t->cache)
            rc = ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory for the piece cache");
        for (int s = 0; s < DDT_TOK_CACHE_SHARDS && !rc; s++)
            pthread_mutex_init(&ld.t->cache[s].lock, NULL);
    }
    if (rc) {
        ddt_tokenizer_close(ld.t);
        return NULL;
    }
    return ld.t;
}

void ddt_tokenizer_close(ddt_tokenizer *t)
{
    if (!t)
        return;
    for (int k = 0; k < t->n_splits; k++)
        onig_free(t->split[k]);
    if (t->cache)
        for (int s = 0; s < DDT_TOK_CACHE_SHARDS; s++)
            pthread_mutex_destroy(&t->cache[s].lock);
    ddt_tok_added_set *sets[2] = {&t->added_raw, &t->added_norm};
    for (int s = 0; s < 2; s++)
        free(sets[s]->tok);
    free(t->cache);
    free(t->added_text);
    free(t->merges);
    free(t->vocab_slots);
    free(t->token_bytes), free(t->token_at), free(t->kind);
    free(t);
}
