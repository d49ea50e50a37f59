/* generate.h: sequences sampled from a frozen target (target.h) with a KV cache, the
 * target-generated training data of the online sources (source.h): a prefill of the prompt,
 * then one token at a time, each step attending its one query row over the cached keys, so a
 * sequence of S tokens costs O(S^2), not the O(S^3) of re-running the full forward per token.
 * Sampling: logits = final_norm(h) lm_head^T; temperature 0 is greedy (argmax, ties: lowest
 * id); otherwise softmax(logits / temperature) restricted to the nucleus (the fewest most
 * likely tokens whose probability reaches top_p; ties ordered by id). A sequence depends
 * only on (target, seed, prompt, length, temperature, top_p): never on what was generated
 * before or on threads. Not here: batching several sequences per step (a BLAS may sum a row
 * differently in a taller product, which would make tokens depend on the batch).
 * Tested by tests/test_source.c (decode hidden == full forward's, greedy == argmax of the
 * full forward's logits, determinism, top_p -> 0 == greedy).
 *
 * Legend: S tokens, P prompt tokens, H hidden, V vocabulary, nh / nkv heads, d head dim,
 * I intermediate, C rows per prefill chunk.
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

/* A decoder for one target and sequences up to max_len tokens: the KV cache and every
 * workspace, allocated once (from the backend's allocator). be must be a backend whose memory
 * the host reads (the CPU backend: the target's weights are host float32, sampling reads the
 * logits). One generator per thread; the target is only read, so generators may share it. */
typedef struct ddt_generator {
    const ddk_backend *be;
    const ddt_target *t;   /* the dense target (its own KV cache below), or NULL: */
    ddt_target_cache tc;   /* any other target's cache, through target.h's interface */
    int64_t hidden_size, vocab, max_len;
    const float *lm_head;  /* (V, H) */
    float *cache;          /* per layer: keys (max_len, nkv*d) then values (max_len, nkv*d); dense only */
    float *x, *u;          /* (C, H) residual stream, normed input */
    float *q, *attn;       /* (C, nh*d) */
    float *gate, *up;      /* (C, I) */
    float *hidden;         /* (C, H) final-normed, when the caller keeps none */
    float *scores;         /* (max_len) one query's attention weights */
    float *logits, *probs; /* (V) each */
    int32_t *pos;          /* (C) positions of the rows of a step */
    void *candidates;      /* (V) nucleus sorting */
    void *block;           /* the one allocation all of the above live in */
    size_t block_bytes;
} ddt_generator;

/* 0, -EINVAL (max_len < 1, or a head_dim the RoPE op refuses) or -ENOMEM, with err. */
int ddt_generator_init(ddt_generator *g, const ddk_backend *be, const ddt_target *t,
                       int64_t max_len, char *err, size_t err_len);
/* A generator for any target: ddt_generator_init for the dense one, else the target's cache
 * (ddt_target_cache_open; -ENOTSUP, with err, for a target that has none). Same sampling. */
int ddt_generator_open(ddt_generator *g, const ddk_backend *be, const ddt_target_model *m, int64_t max_len,
                       char *err, size_t err_len);
void ddt_generator_free(ddt_generator *g);

/* tokens (S): prompt (P tokens, P <= S; prompt NULL or P = 0: the first token drawn uniformly
 * from [0, V) by the seed), then S - P sampled ones. hidden (S, H) or NULL: the final-normed
 * hidden state of every position (those of the prompt from the prefill, the others from the
 * decode steps), what ddt_target_forward's final_hidden gives up to float rounding.
 * 0, or -EINVAL (S outside [1, max_len], a prompt token outside [0, V), bad params). */
int ddt_generate(ddt_generator *g, const ddt_generate_params *p, uint64_t seed,
                 const int32_t *prompt, int64_t P, int64_t S, int32_t *tokens, float *hidden);

#endif
