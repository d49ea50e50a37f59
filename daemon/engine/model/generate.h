/* generate.h: sequences sampled from a frozen target, the target-generated training data of
 * the online sources (source.h). The target is reached only through target.h's interface: its
 * decoding cache (ddt_target_cache: the dense target's KV cache, the qwen3_5 target's states)
 * takes a prefill of the prompt, then one token at a time, so a sequence of S tokens costs
 * O(S^2), not the O(S^3) of re-running the full forward per token.
 * Sampling: logits = final_norm(h) lm_head^T; temperature 0 is greedy (argmax, ties: lowest
 * id); otherwise softmax(logits / temperature) restricted to the nucleus (the fewest most
 * likely tokens whose probability reaches top_p; ties ordered by id). A stop token (the
 * regeneration of chat data's assistant turns: `<|im_end|>`) ends a sequence early; the tokens
 * up to it are those the same call without a stop gives. A sequence depends
 * only on (target, seed, prompt, length, temperature, top_p): never on what was generated
 * before or on threads (nor on the backend, for an fp32 target on any CPU backend: the same ops). Not here: batching several sequences per step (a BLAS may sum a row
 * differently in a taller product, which would make tokens depend on the batch).
 * Tested by tests/engine/data/test_source.c (decode hidden == full forward's, greedy == argmax of the
 * full forward's logits, determinism, top_p -> 0 == greedy, the stop token) and
 * tests/daemon/train_qwen35_test.sh.
 *
 * Legend: S tokens, P prompt tokens, H hidden, V vocabulary, C rows per prefill chunk.
 */
#ifndef DDT_GENERATE_H
#define DDT_GENERATE_H

#include "ddk.h"
#include "target.h"

#include <stddef.h>
#include <stdint.h>

/* A seed for sequence `index` of the named stream ("train", "heldout", "epoch", ...) of a run
 * seed: distinct streams and indices never share a seed in practice (splitmix64 chain). */
uint64_t ddt_generate_seed(uint64_t seed, int64_t index, const char *stream);

typedef struct ddt_generate_params {
    float temperature;   /* >= 0; 0 = greedy */
    float top_p;         /* (0, 1]; 1 = the whole distribution */
} ddt_generate_params;

/* A decoder for one target and sequences up to max_len tokens: the target's cache and the
 * sampling workspace, allocated once. be: the backend the target was opened on, any: on a CPU
 * backend the whole workspace is one block of its allocator and sampling reads the logits where
 * ddt_target_logits wrote them; on a GPU the hidden states and the logits are the device's (its
 * allocator), and each decode step's logits are copied (be->copy, then its synchronize) into a
 * host block (page-locked staging, ddk_host_alloc_pinned) beside the probabilities and the
 * candidates, which sampling reads. One generator per thread; the target is only read, so
 * generators may share it. */
typedef struct ddt_generator {
    ddt_target_cache tc;   /* the target's decoding cache (its backend, model and max_len) */
    float *hidden;         /* (C, H) final-normed, when the caller keeps none: be's memory */
    float *dev_logits;     /* (V) be's memory, or NULL on a CPU backend (logits serves) */
    float *logits, *probs; /* (V) each, host memory */
    void *candidates;      /* (V) nucleus sorting, host memory */
    void *block;           /* be's allocation: hidden [.. candidates on a CPU backend] */
    size_t block_bytes;
    void *host_block;      /* GPU backends: logits .. candidates (pinned); else NULL */
    size_t host_bytes;
} ddt_generator;

/* bytes of a generator's workspace beside its cache (ddt_target_cache_bytes or the qwen3_5
 * target's): the planner's figure, all on the backend's device for a CPU one; on a GPU the device
 * holds (C*H + V) floats of it and the host the rest (an overcount of 2V floats there) */
int64_t ddt_generator_workspace_bytes(int64_t hidden, int64_t vocab);
/* 0, or ddt_target_cache_open's error (-ENOTSUP for a target without a cache, -EINVAL for
 * max_len < 1 or a shape its cache refuses, -ENOMEM), with err. */
int ddt_generator_open(ddt_generator *g, const ddk_backend *be, const ddt_target_model *m, int64_t max_len,
                       char *err, size_t err_len);
void ddt_generator_free(ddt_generator *g);

/* tokens (S): prompt (P tokens, P <= S; prompt NULL or P = 0: the first token drawn uniformly
 * from [0, V) by the seed), then S - P sampled ones. hidden (S, H) or NULL (be's memory): the final-normed
 * hidden state of every position (those of the prompt from the prefill, the others from the
 * decode steps), what ddt_target_prefill's final_hidden gives up to float rounding.
 * 0, or -EINVAL (S outside [1, max_len], a prompt token outside [0, V), bad params). */
int ddt_generate(ddt_generator *g, const ddt_generate_params *p, uint64_t seed,
                 const int32_t *prompt, int64_t P, int64_t S, int32_t *tokens, float *hidden);

/* ddt_generate, ending right after the first sampled token equal to stop (-1: none): *len (NULL:
 * not wanted) is the tokens written, P + the sampled ones with the stop, <= S; tokens (and
 * hidden) past it are untouched. tokens[0 .. *len) are ddt_generate's for the same arguments. */
int ddt_generate_until(ddt_generator *g, const ddt_generate_params *p, uint64_t seed, const int32_t *prompt,
                       int64_t P, int64_t S, int32_t stop, int32_t *tokens, float *hidden, int64_t *len);

#endif
