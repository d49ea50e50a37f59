/* drafter_cache.c: the drafter's context cache (drafter_cache.h has the contract): its memory,
 * one allocation on the backend (per layer K and V of max_rows + B rows: the context's, then
 * the block drafted last, which the next append overwrites), and its row count. The forward
 * itself is drafter.c's. Appends go in chunks of APPEND_ROWS rows, so a long prompt needs no
 * workspace of its length.
 * Tested by tests/engine/eval/test_speculate.c (cached and uncached decoding agree).
 *
 * Legend: as drafter_cache.h; kvd = nkv*d.
 */
#include "drafter_cache.h"

#include <errno.h>
#include <stdlib.h>

enum { APPEND_ROWS = 64 };

struct ddt_drafter_cache {
    const ddk_backend *be;
    ddt_drafter_config c;
    int64_t rows, max_rows;
    float *k[DDT_MAX_LAYERS], *v[DDT_MAX_LAYERS];   /* (max_rows + B, kvd) each */
    void *work;                                     /* ddt_drafter_block_work_bytes(c, APPEND_ROWS) */
    void *block;
    size_t bytes;
};

/* bytes of one layer's K or V, rounded up so that every part starts 256-byte aligned */
static size_t kv_bytes(const ddt_drafter_config *c, int64_t max_rows)
{
    const size_t bytes = (size_t)((max_rows + c->block_size) * c->kv_heads * c->head_dim) * sizeof(float);
    return (bytes + 255) / 256 * 256;
}

size_t ddt_drafter_cache_bytes(const ddt_drafter_config *c, int64_t max_rows)
{
    return 2 * (size_t)c->layers * kv_bytes(c, max_rows) + ddt_drafter_block_work_bytes(c, APPEND_ROWS);
}

int ddt_drafter_cache_open(ddt_drafter_cache **out, const ddk_backend *be, const ddt_drafter_config *c,
                           int64_t max_rows)
{
    *out = NULL;
    ddt_drafter_cache *k = calloc(1, sizeof *k);
    if (!k)
        return -ENOMEM;
    *k = (ddt_drafter_cache){ .be = be, .c = *c, .max_rows = max_rows,
                              .bytes = ddt_drafter_cache_bytes(c, max_rows) };
    k->block = ddk_malloc(be->alloc, k->bytes);
    if (!k->block) {
        free(k);
        return -ENOMEM;
    }
    const size_t layer = kv_bytes(c, max_rows);
    char *p = k->block;
    for (int64_t l = 0; l < c->layers; l++) {
        k->k[l] = (float *)(p + (2 * l) * layer);
        k->v[l] = (float *)(p + (2 * l + 1) * layer);
    }
    k->work = p + 2 * c->layers * layer;
    *out = k;
    return 0;
}

void ddt_drafter_cache_close(ddt_drafter_cache *k)
{
    if (!k)
        return;
    ddk_free(k->be->alloc, k->block, k->bytes);
    free(k);
}

void ddt_drafter_cache_reset(ddt_drafter_cache *k)
{
    k->rows = 0;
}

int64_t ddt_drafter_cache_rows(const ddt_drafter_cache *k)
{
    return k->rows;
}

int ddt_drafter_cache_append(ddt_drafter_cache *k, const ddt_drafter_weights *w, const float *X, int64_t n)
{
    if (n < 0 || k->rows + n > k->max_rows)
        return -ENOSPC;
    const int64_t LH = k->c.taps * k->c.hidden;
    for (int64_t done = 0; done < n;) {
        const int64_t chunk = n - done < APPEND_ROWS ? n - done : APPEND_ROWS;
        int rc = ddt_drafter_context_append(k->be, &k->c, w, X + done * LH, chunk, k->rows, k->k, k->v, k->work);
        if (rc)
            return rc;
        k->rows += chunk;
        done += chunk;
    }
    return 0;
}

int ddt_drafter_cache_draft(ddt_drafter_cache *k, const ddt_drafter_weights *w, const ddt_head *head, int32_t token,
                            float *hs)
{
    return ddt_drafter_block_forward(k->be, &k->c, w, head, token, k->rows, k->k, k->v, k->work, hs);
}
