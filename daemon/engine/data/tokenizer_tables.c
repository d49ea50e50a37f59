/* tokenizer_tables.c: the lookups of a loaded tokenizer's tables (tokenizer_tables.h) that its
 * loader and its encoder share: the bytes' hash, and a vocabulary token by its bytes.
 * Tested through tokenizer.h (tests/engine/data/test_tokenizer.c).
 */
#include "tokenizer_tables.h"

#include <string.h>

uint64_t ddt_tok_hash(const char *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    if (n) {
        uint64_t w = 0;
        memcpy(&w, p, n);
        h = (h ^ w) * 0x94d049bb133111ebull;
    }
    h ^= h >> 31;
    h *= 0xd6e8feb86659fd93ull;
    h ^= h >> 32;
    return h ? h : 1;
}

int32_t ddt_tok_vocab_find(const ddt_tokenizer *t, const char *p, size_t n)
{
    for (uint64_t s = ddt_tok_hash(p, n) & t->vocab_mask;; s = (s + 1) & t->vocab_mask) {
        uint32_t v = t->vocab_slots[s];
        if (!v)
            return -1;
        size_t len = 0;
        const char *b = ddt_tok_bytes(t, (int32_t)(v - 1), &len);
        if (len == n && !memcmp(b, p, n))
            return (int32_t)(v - 1);
    }
}
