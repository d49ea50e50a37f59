/* speculate.h: speculative decoding on the target interface (SPEC.md section 7): greedy chain
 * decoding with the drafter and DDTree tree decoding (the best-first tree of SPEC.md 6 from the
 * same block's per-slot distributions, verified in one target call with tree attention), beside
 * plain greedy decoding of the target, for one prompt at a time; the acceptance a server sees,
 * tau_spec and tau_spec_tree(K), and the greedy-equality verdict (the contract: whatever the
 * drafter, the generated tokens equal plain greedy decoding).
 * Reached through target.h's interface only (ddt_target_cache: prefill, verify a chain or a
 * tree, roll back to the accepted path), so every target kind and backend speculates. The
 * drafter: any weights of its parameter table in the backend's memory (a run's live weights, a
 * checkpoint's, or an export read back from disk: ddt_export_read), its head the target's own
 * embed_tokens / lm_head as stored. A DFlash2 drafter drafts along its path selector (SPEC.md
 * 2.1): the chain its greedy path, the tree its lattice over each slot's K candidates.
 * Counting: the first generated token comes from the prefill; each verification call yields
 * the accepted drafts and the target's bonus token; tau = tokens yielded by verification calls
 * (up to gen_len - 1, the prefill's token not counted) / calls, so 1 <= tau <= B.
 * Tested by tests/engine/eval/test_speculate.c (lossless on a dense synthetic target, the tiny Qwen3.5
 * target and stories260K when ../shared is present: random and exported-then-reloaded
 * drafters, DFlash2 drafters with random selectors; tau_spec and tau_spec_tree(K) in [1, B]; a
 * DFlash2 drafter with Bs = 0 drafting as the DFlash drafter of its backbone; bad input). A
 * best-first tree need not contain the chain, so tau_spec_tree(K) may fall below tau_spec even
 * with K >= B - 1 (SPEC.md 7: measured, not promised).
 *
 * Legend: P prompt tokens, G generated tokens, B block size, K node budget, N = K + 1 tree
 * nodes with the root, H hidden, L_t taps, V vocabulary.
 */
#ifndef DDT_SPECULATE_H
#define DDT_SPECULATE_H

#include "acceptance.h"
#include "model/drafter.h"
#include "model/target.h"

#include <stddef.h>
#include <stdint.h>

/* What one prompt is decoded with. */
typedef struct ddt_speculate_params {
    int64_t gen_len;                     /* G >= 1: tokens generated after the prompt */
    int n_budgets;                       /* tree budgets K, each >= 1 (0: the chain only) */
    int64_t budgets[DDT_MAX_BUDGETS];
    int32_t stop;                        /* an end token (chat: <|im_end|>), -1: none */
    int uncached;                        /* 1: draft with ddt_drafter_forward over the whole context
                                            each call, not the drafter's context cache (the
                                            reference the cache is tested and timed against) */
} ddt_speculate_params;

/* One way of decoding one prompt: the tokens it generated (after the prompt; the prompt is not
 * repeated) and the target calls it took. */
typedef struct ddt_speculate_run {
    const int32_t *tokens;   /* (n) the speculator's memory, valid until its next prompt */
    int64_t n;               /* generated, <= G (fewer: the stop token was generated) */
    int64_t calls;           /* verification calls (0 for plain greedy: n decode calls) */
    double seconds;          /* wall time of the whole decode, prefill included */
} ddt_speculate_run;

typedef struct ddt_speculate_prompt_result {
    ddt_speculate_run greedy;                 /* plain greedy decoding of the target */
    ddt_speculate_run chain;                  /* the drafter's chain, verified a block a call */
    ddt_speculate_run tree[DDT_MAX_BUDGETS];  /* the tree of each budget, in params order */
    int equal;                                /* 1: chain and every tree equal greedy token for token */
} ddt_speculate_prompt_result;

/* Sums over prompts: what an eval stores. */
typedef struct ddt_speculate_totals {
    int n_budgets;
    int64_t budgets[DDT_MAX_BUDGETS];
    int64_t prompts, mismatched;         /* prompts decoded, of which not greedy-equal */
    int64_t chain_tokens, chain_calls;   /* tokens from verification calls, calls */
    int64_t tree_tokens[DDT_MAX_BUDGETS], tree_calls[DDT_MAX_BUDGETS];
    int64_t generated;                   /* tokens generated in all (greedy's) */
    double greedy_seconds, chain_seconds, tree_seconds[DDT_MAX_BUDGETS];
} ddt_speculate_totals;

void ddt_speculate_totals_init(ddt_speculate_totals *t, const ddt_speculate_params *p);
void ddt_speculate_totals_add(ddt_speculate_totals *t, const ddt_speculate_prompt_result *r);
/* tau_spec = chain_tokens / chain_calls; tau_spec_tree(budget i) likewise (1 with no call) */
double ddt_speculate_tau(const ddt_speculate_totals *t);
double ddt_speculate_tau_tree(const ddt_speculate_totals *t, int i);
/* {"K": values[i], ...} over t's budgets (a cJSON object; NULL without memory): the JSON of the
 * per-budget figures `ddtreed speculate` prints and the evals row stores */
struct cJSON *ddt_speculate_budgets_json(const ddt_speculate_totals *t, const double *values);

typedef struct ddt_speculator ddt_speculator;

/* 0, or -EINVAL with err naming the drafter's config.json field that does not fit target m:
 * hidden_size, vocab_size, num_target_layers, a dflash_config.target_layer_ids entry outside the
 * target's layers, block_size outside [2, DDT_MAX_SLOTS], dflash_config.mask_token_id outside
 * the vocabulary (ddt_speculator_open's first check) */
int ddt_speculate_check_drafter(const ddt_target_model *m, const ddt_drafter_config *dc, char *err, size_t err_len);

/* A speculator for target m on be (the backend m was opened on) and drafter configuration dc:
 * the target's cache for prompts of up to max_prompt tokens and G = max_gen tokens, trees of
 * up to max_budget nodes (0: the chain only), and the drafter's and the tree's workspace, all
 * allocated once (the drafter's context cache of max_prompt + max_gen rows and a DFlash2
 * drafter's path selector's too). Refused (-EINVAL, err naming the field) when the
 * drafter does not fit the target (ddt_speculate_check_drafter) or max_budget is above
 * DDT_MAX_SLOTS^2; -ENOTSUP for a target without a cache; -ENOMEM. */
int ddt_speculator_open(ddt_speculator **out, const ddk_backend *be, const ddt_target_model *m,
                        const ddt_drafter_config *dc, int64_t max_prompt, int64_t max_gen, int64_t max_budget,
                        char *err, size_t err_len);
void ddt_speculator_close(ddt_speculator *s);
/* bytes a speculator of these sizes allocates on its backend beside the target's cache (the
 * drafter's context cache with its one-block workspace and a DFlash2 drafter's selector
 * included; not an uncached decode's per-call forward, a test's reference), and that cache's
 * sizes: max_len positions, verify blocks of max_block (the planner adds the cache from the
 * target's config alone, target_footprint.c) */
int64_t ddt_speculator_workspace_bytes(const ddt_drafter_config *dc, int64_t max_prompt, int64_t max_gen,
                                       int64_t max_budget, int64_t *max_len, int64_t *max_block);

/* One prompt (P tokens in [0, V), 1 <= P <= max_prompt) decoded greedily, by the chain and by
 * the tree of each of p's budgets, with drafter weights w (be's memory, dc's table). 0, or
 * -EINVAL with err (a prompt longer than the speculator's, a token outside the vocabulary,
 * gen_len above max_gen, a budget above max_budget: the planned cap), or the target's error. */
int ddt_speculate_prompt(ddt_speculator *s, const ddt_drafter_weights *w, const ddt_speculate_params *p,
                         const int32_t *prompt, int64_t P, ddt_speculate_prompt_result *r, char *err,
                         size_t err_len);

#endif
