/* tokenizer_tables.h: the inside of a ddt_tokenizer, the tables its loader (tokenizer_load.c,
 * the tokenizer.json reader) fills and its encoder (tokenizer.c) reads, and their lookups
 * (tokenizer_tables.c). Not a public header.
 * Tested through tokenizer.h (tests/engine/data/test_tokenizer.c).
 *
 * Legend: N ids (vocabulary and added tokens), M merges.
 */
#ifndef DDT_TOKENIZER_TABLES_H
#define DDT_TOKENIZER_TABLES_H

#include <oniguruma.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddt_tokenizer ddt_tokenizer;   /* as tokenizer.h names it */

enum {
    DDT_TOK_MAX_SPLITS = 8,            /* Split stages of one pre-tokenizer */
    DDT_TOK_CACHE_SHARDS = 32,         /* piece cache shards, each with its mutex */
    DDT_TOK_CACHE_SETS = 256,          /* sets of a shard (a power of two): 2 MiB in all, near the CPU */
    DDT_TOK_CACHE_WAYS = 4,            /* entries of a set */
    DDT_TOK_CACHE_PIECE = 22,          /* the longest piece cached (bytes) */
    DDT_TOK_CACHE_IDS = 8,             /* ... and the most ids it may have */
};

/* What an id is. */
enum { DDT_TOK_NONE, DDT_TOK_VOCAB, DDT_TOK_ADDED, DDT_TOK_SPECIAL };

/* Added tokens matched in one pass, sorted by first byte then by length descending, so the
 * first that matches at a position is the longest (leftmost-longest, as aho-corasick's
 * MatchKind::LeftmostLongest in Hugging Face). */
typedef struct ddt_tok_added {
    const char *text;      /* the pattern (a normalised token's content normalised) */
    uint32_t len;
    int32_t id;
} ddt_tok_added;

typedef struct ddt_tok_added_set {
    int count;
    ddt_tok_added *tok;    /* (count) */
    int bucket[257];       /* entries of first byte b: [bucket[b], bucket[b+1]) */
} ddt_tok_added_set;

typedef struct ddt_tok_merge {
    uint64_t key;     /* left id << 32 | right id; ~0: empty */
    uint32_t rank;
    int32_t id;       /* the merged token */
} ddt_tok_merge;

/* One cached piece and its ids, a cache line. */
typedef struct ddt_tok_cache_entry {
    uint64_t hash;                           /* 0: empty */
    uint8_t len, n_ids;
    char bytes[DDT_TOK_CACHE_PIECE];
    int32_t ids[DDT_TOK_CACHE_IDS];
} ddt_tok_cache_entry;

/* A set-associative cache: a piece's hash picks a shard and a set; a new piece replaces the
 * set's entries in turn, so text of pieces never seen again (random code points) evicts only
 * what it displaces. */
typedef struct ddt_tok_cache_shard {
    pthread_mutex_t lock;
    uint8_t next_way[DDT_TOK_CACHE_SETS];    /* the entry of each set a new piece replaces */
    ddt_tok_cache_entry entry[DDT_TOK_CACHE_SETS][DDT_TOK_CACHE_WAYS];
} ddt_tok_cache_shard;

struct ddt_tokenizer {
    int32_t n_ids;          /* N */
    char *token_bytes;      /* every token's bytes, back to back */
    uint64_t *token_at;     /* (N): offset << 24 | length; length 0 with kind NONE: no token */
    uint8_t *kind;          /* (N): DDT_TOK_* */

    /* the model's vocabulary: its bytes -> id (open addressing; slot holds id + 1, 0 empty) */
    uint32_t *vocab_slots;
    uint64_t vocab_mask;
    int32_t byte_id[256];   /* the token of each single byte */

    /* merges: (left id << 32 | right id) -> rank and result (open addressing, key ~0 empty; one
     * slot a probe, in one cache line) */
    ddt_tok_merge *merges;
    uint64_t merge_mask;
    int merge_shift;        /* 64 - log2(slots): a key's slot is the top bits of key * golden */
    int ignore_merges;

    int nfc;                                     /* the normaliser: NFC or none */
    int n_splits;
    OnigRegex split[DDT_TOK_MAX_SPLITS];         /* the pre-tokenizer's Split stages */

    ddt_tok_added_set added_raw;                 /* added tokens with normalized: false */
    ddt_tok_added_set added_norm;                /* ... with normalized: true */
    char *added_text;                            /* the normalised patterns' bytes */

    ddt_tok_cache_shard *cache;                  /* (DDT_TOK_CACHE_SHARDS) */
};

/* the first slot of a merge's key */
static inline uint64_t ddt_tok_merge_slot(const ddt_tokenizer *t, uint64_t key)
{
    return (key * 0x9e3779b97f4a7c15ull) >> t->merge_shift;
}

/* The token's bytes (length in *len), NULL when id has none. */
static inline const char *ddt_tok_bytes(const ddt_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->n_ids || t->kind[id] == DDT_TOK_NONE)
        return NULL;
    *len = (size_t)(t->token_at[id] & 0xffffff);
    return t->token_bytes + (t->token_at[id] >> 24);
}

/* 64-bit hash of bytes: a multiply-mix over 8-byte words; never 0 */
uint64_t ddt_tok_hash(const char *p, size_t n);
/* id of the vocabulary token with these bytes, or -1 */
int32_t ddt_tok_vocab_find(const ddt_tokenizer *t, const char *p, size_t n);
#endif
