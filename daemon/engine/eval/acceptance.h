/* acceptance.h: what users want from a drafter (SPEC.md section 6), from its per-slot
 * distributions over held-out blocks: acc_k, the chain acceptance length tau_chain and the
 * DDTree acceptance length tau_tree(K) for node budgets K (best-first tree over the per-slot
 * top-K log-probabilities, walked along the labels); and that tree itself, the draft DDTree
 * speculative decoding verifies (speculate.h). A DFlash2 drafter's figures follow its path
 * selector (SPEC.md 2.1: its picks and its lattice tree, selector.h), its unary head's beside.
 * And for training (train/walk.c): one block's DDTree depth and the tree term's margins from its
 * per-slot ranks, the host's or a backend's.
 * Tested by tests/engine/eval/test_acceptance.c (hand-made distributions and selector views with
 * known answers; the margins and depth of a hand-made block).
 */
#ifndef DDT_ACCEPTANCE_H
#define DDT_ACCEPTANCE_H

#include "draft_tree.h"
#include "selector.h"

#include <stdint.h>

enum { DDT_MAX_BUDGETS = 8 };

typedef struct ddt_acceptance {
    int n_budgets;
    int64_t budgets[DDT_MAX_BUDGETS];       /* node budgets K, as configured */
    int64_t blocks;                         /* blocks accumulated */
    int64_t slot_count[DDT_MAX_SLOTS];      /* slots k with a valid label */
    int64_t slot_correct[DDT_MAX_SLOTS];    /* of those, argmax == label */
    double chain_sum;                       /* sum over blocks of the accepted chain length */
    double tree_sum[DDT_MAX_BUDGETS];       /* sum over blocks of the accepted tree depth */
    /* DFlash2 (ddt_acceptance_add_selector_block): the figures above are the path selector's;
     * these the same blocks' of the drafter's unary head (its argmax and per-slot tree) */
    int selector;                               /* 1: a DFlash2 drafter's, with unary_* beside (set by
                                                   ddt_acceptance_add_selector_block, or by a caller
                                                   that evaluates a DFlash2 drafter) */
    int64_t unary_slot_correct[DDT_MAX_SLOTS];
    double unary_chain_sum;
    double unary_tree_sum[DDT_MAX_BUDGETS];
} ddt_acceptance;

void ddt_acceptance_init(ddt_acceptance *a, const int64_t *budgets, int n_budgets);

/* One block of B slots: logits (B, V) of the drafter (row 0, the anchor's slot, unused);
 * labels (B): the token slot k must predict, < 0 where invalid (past the end or masked).
 * A block whose slot-1 label is invalid is not counted. */
void ddt_acceptance_add_block(ddt_acceptance *a, const float *logits, int64_t B, int64_t V,
                              const int32_t *labels);

/* One block of a DFlash2 drafter: as ddt_acceptance_add_block, its unary logits (B, V) counted
 * into unary_*, and its selector view v (v->B slots, B) into the figures: slot k's pick after
 * the token before it (v's pred row k, which the caller fills for every slot with a valid
 * label: the anchor's token for slot 1, else the label of slot k-1 where valid, as an accepted
 * chain has it, else the data token) and the lattice tree. */
void ddt_acceptance_add_selector_block(ddt_acceptance *a, const float *logits, const ddt_selector_view *v,
                                       int64_t V, const int32_t *labels);

/* The DDTree draft of one block (SPEC.md 6 and 7): the first K nodes (fewer when the block
 * holds fewer) of the best-first tree over the per-slot distributions logits (B, V) (row 0 unused),
 * the tree ddt_acceptance_add_block walks: tokens (K), parents (K) (-1: a child of the root, the
 * anchor's token; else an index < i: a parent comes before its children). Returns the nodes. */
int64_t ddt_tree_draft(const float *logits, int64_t B, int64_t V, int64_t K, int32_t *tokens, int32_t *parents);

/* One block's per-slot ranks: slots 1..B-1's first Kmax tokens in rank order (logit
 * descending, ties to the lower token) with their log-probabilities (log-softmax over the full
 * vocabulary): the host's (ddt_block_ranks_open, from the block's logits), or a backend's
 * (topk_rows and logsumexp_rows: the caller fills tokens and logp, base NULL). */
typedef struct ddt_block_ranks {
    int64_t Kmax;
    int32_t *tokens;   /* (B-1, Kmax) */
    double *logp;      /* (B-1, Kmax) */
    char *base;        /* the host's allocation (ddt_block_ranks_close frees it) */
} ddt_block_ranks;
/* ranks of logits (B, V) rows 1..B-1, Kmax = min(K, V) (ddk_fatal without memory) */
void ddt_block_ranks_open(ddt_block_ranks *r, const float *logits, int64_t B, int64_t V, int64_t K);
void ddt_block_ranks_close(ddt_block_ranks *r);

/* DDTree's accepted depth (SPEC.md 6) of a block of B slots with ranks r (Kmax >= min(K, V))
 * along labels (B; < 0 invalid), over the best-first tree of K nodes */
int64_t ddt_tree_depth(const ddt_block_ranks *r, int64_t B, int64_t K, const int32_t *labels);
/* The tree term's margins of that block (train.tree_weight): for the labels' prefixes of depth
 * d = 1.. while the labels are valid, z[d] = their summed log-probability (label_logp (B): slot
 * k's label's log-probability, -inf where it is not known) minus the score of the last node the
 * best-first tree of K nodes takes: z[d] >= 0 where the prefix is in the tree (up to ties).
 * Returns D, the depths with a valid label (z[1..D] set; 0 when slot 1's is invalid). */
int64_t ddt_tree_margins(const ddt_block_ranks *r, int64_t B, int64_t K, const int32_t *labels,
                         const double *label_logp, double *z);

/* Results: acc_k = slot_correct[k] / slot_count[k]; tau_chain = 1 + chain_sum / blocks;
 * tau_tree[i] = 1 + tree_sum[i] / blocks (all 1 when no block was counted). */
double ddt_acceptance_acc(const ddt_acceptance *a, int64_t k);
double ddt_acceptance_tau_chain(const ddt_acceptance *a);
double ddt_acceptance_tau_tree(const ddt_acceptance *a, int i);
/* The unary head's figures of a, as an acceptance of their own to read with the three above
 * (a's own for a DFlash drafter's) */
ddt_acceptance ddt_acceptance_unary(const ddt_acceptance *a);

#endif
