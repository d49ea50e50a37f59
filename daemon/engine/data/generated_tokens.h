/* generated_tokens.h: generated data's one rule, without a source: a sequence's tokens sampled
 * by any replica of the target from the seed of its stream and index, and the held-out ones
 * kept once sampled. The generated source (source_generated.c) and a co-located trainer's
 * ranks (which open no source for generated data, train/step.c) both sample through it.
 * Tested by tests/engine/data/test_source.c and tests/engine/train/test_trainer.c.
 *
 * Legend: S tokens of a sequence.
 */
#ifndef DDT_GENERATED_TOKENS_H
#define DDT_GENERATED_TOKENS_H

#include "source_config.h"

#include <stddef.h>
#include <stdint.h>

struct ddt_generator;
/* 1 when c's sequences are sampled by its target (synthetic, or hf without a token file) */
int ddt_source_generates(const ddt_source_config *c);
/* Generated data's training sequence `index` (heldout 0: what the source yields at cursor index)
 * or held-out sequence `index` (heldout 1): its seq_len tokens sampled by gen (a generator over
 * any replica of c's target: the same tokens as the source's when it is fp32 on a CPU backend)
 * with the seed ddt_generate_seed(seed, index, "train" / "heldout"), the first token drawn from
 * it, and its loss mask, all ones (NULL: not wanted). 0, or the generator's error with err. */
int ddt_source_generate(const ddt_source_config *c, struct ddt_generator *gen, int heldout, int64_t index,
                        int32_t *tokens, uint8_t *loss_mask, char *err, size_t err_len);
/* Host bytes of generated data's held-out tokens kept once sampled (tokens, and a flag each) */
int64_t ddt_source_heldout_token_bytes(const ddt_source_config *c);
/* Those tokens, the generated source's and a co-located trainer's (which has no source): one
 * allocation of the host's allocator, each sequence sampled the first time it is asked for. */
typedef struct ddt_heldout_tokens {
    int32_t *tokens;   /* (heldout, S), row i valid once known[i] */
    uint8_t *known;    /* (heldout) */
    size_t bytes;      /* ddt_source_heldout_token_bytes */
} ddt_heldout_tokens;
/* 0, or -ENOMEM with err */
int ddt_heldout_tokens_init(ddt_heldout_tokens *h, const ddt_source_config *c, char *err, size_t err_len);
void ddt_heldout_tokens_free(ddt_heldout_tokens *h);
/* held-out sequence i's tokens (S), sampled by gen (ddt_source_generate) the first time; 0, or the
 * generator's error with err */
int ddt_heldout_tokens_get(ddt_heldout_tokens *h, const ddt_source_config *c, struct ddt_generator *gen, int64_t i,
                           int32_t **tokens, char *err, size_t err_len);

#endif
