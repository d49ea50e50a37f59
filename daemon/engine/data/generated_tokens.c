/* generated_tokens.c: generated data's one rule (generated_tokens.h): which configs generate,
 * a sequence sampled from its stream's seed, and the held-out tokens kept once sampled.
 * Training sequence i is sampled with seed ddt_generate_seed(seed, i, "train"), held-out i with
 * (seed, i, "heldout"): the two streams are disjoint and each sequence a pure function of the
 * config and its index.
 * Tested by tests/engine/data/test_source.c and tests/engine/train/test_trainer.c.
 *
 * Legend: S tokens of a sequence.
 */
#include "generated_tokens.h"
#include "base/errors.h"
#include "model/generate.h"

#include <errno.h>
#include <string.h>

/* synthetic, or hf with neither a token file nor chat files */
int ddt_source_generates(const ddt_source_config *c)
{
    return c->kind == DDT_SOURCE_SYNTHETIC ||
           (c->kind == DDT_SOURCE_HF && !c->tokens_file[0] && !c->chat_file_count);
}

/* the one rule of a generated sequence: seq_len tokens from the stream's seed, mask all ones */
int ddt_source_generate(const ddt_source_config *c, ddt_generator *gen, int heldout, int64_t index,
                        int32_t *tokens, uint8_t *loss_mask, char *err, size_t err_len)
{
    const ddt_generate_params p = { c->temperature, c->top_p };
    const uint64_t seed = ddt_generate_seed(c->seed, index, heldout ? "heldout" : "train");
    int rc = ddt_generate(gen, &p, seed, NULL, 0, c->seq_len, tokens, NULL);
    if (rc)
        return ddt_fail(err, err_len, rc, "generation failed: %s", strerror(-rc));
    if (loss_mask)
        memset(loss_mask, 1, (size_t)c->seq_len);
    return 0;
}

int64_t ddt_source_heldout_token_bytes(const ddt_source_config *c)
{
    return c->heldout * (c->seq_len * (int64_t)sizeof(int32_t) + 1);
}

int ddt_heldout_tokens_init(ddt_heldout_tokens *h, const ddt_source_config *c, char *err, size_t err_len)
{
    memset(h, 0, sizeof *h);
    h->bytes = (size_t)ddt_source_heldout_token_bytes(c);
    if (!h->bytes)
        return 0;
    if (!(h->tokens = ddk_malloc(ddk_allocator_cpu(), h->bytes)))
        return ddt_fail(err, err_len, -ENOMEM, "no memory for %lld held-out sequences' tokens", (long long)c->heldout);
    h->known = (uint8_t *)(h->tokens + c->heldout * c->seq_len);   /* after the tokens */
    memset(h->known, 0, (size_t)c->heldout);
    return 0;
}

void ddt_heldout_tokens_free(ddt_heldout_tokens *h)
{
    ddk_free(ddk_allocator_cpu(), h->tokens, h->bytes);
    memset(h, 0, sizeof *h);
}

int ddt_heldout_tokens_get(ddt_heldout_tokens *h, const ddt_source_config *c, ddt_generator *gen, int64_t i,
                           int32_t **tokens, char *err, size_t err_len)
{
    int32_t *row = h->tokens + i * c->seq_len;
    if (!h->known[i]) {
        int rc = ddt_source_generate(c, gen, 1, i, row, NULL, err, err_len);
        if (rc)
            return rc;
        h->known[i] = 1;
    }
    *tokens = row;
    return 0;
}
