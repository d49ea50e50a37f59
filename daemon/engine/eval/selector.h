/* selector.h: DFlash2's path selector at evaluation and in speculative decoding (SPEC.md 2.1).
 * A block's selector view holds, on the host, what the selector reads of one block: each slot's
 * K candidates (the top-K of its unary logits z_k) and their logits, q_k = Hp hs_k, the Bs rows
 * of the candidates and the A rows of the predecessors it may meet (the anchor's token, the
 * teacher-forced predecessors, every candidate). ddt_selector_fill makes it on the drafter's
 * backend from the block's hidden states and unary logits; the walks over it are the selector's
 * teacher-forced picks, its greedy chain draft and its lattice tree draft, with
 *   S_k(p -> c) = z_k[c] + sum_r A[p, r] q_k[r] Bs[c, r]      for c in cand_k.
 * Tested by tests/engine/eval/test_acceptance.c (hand-made views with known answers, a
 * brute-force lattice, a view filled on the CPU backend against the host's arithmetic) and tests/engine/eval/test_speculate.c (DFlash2 drafters decoding).
 *
 * Legend: B slots (slot 0 the anchor's), K candidates per slot (selector_top_k), r the
 * selector's rank (selector_rank), H hidden, V vocabulary.
 */
#ifndef DDT_SELECTOR_H
#define DDT_SELECTOR_H

#include "draft_tree.h"
#include "model/drafter.h"

#include <stddef.h>
#include <stdint.h>

/* One block's selector view; row k is slot k's (row 0 unused). */
typedef struct ddt_selector_view {
    int64_t B, K, r;
    const int32_t *cand;       /* (B, K) cand_k: the top-K ids of z_k, descending, ties to the lower id */
    const float *z;            /* (B, K) z_k[cand_k] */
    const float *q;            /* (B, r) Hp hs_k */
    const float *succ;         /* (B, K, r) Bs[cand_k[i]] */
    const float *cand_pred;    /* (B, K, r) A[cand_k[i]], slots 1 .. B-2: the predecessors slot k + 1
                                  meets on the selector's own paths (row B-1 unused) */
    const float *pred;         /* (B, r) row k: A[the token before slot k]; row 1 the anchor's token,
                                  rows 2 .. B-1 the teacher-forced predecessors (zeros where none) */
} ddt_selector_view;

/* scores (K) = S_k(p -> cand_k[i]) in double, a = A[p] (r); NaN as -inf, +inf as DBL_MAX */
void ddt_selector_scores(const ddt_selector_view *v, int64_t k, const float *a, double *scores);

/* picks (B): picks[k] = slot k's pick after its teacher-forced predecessor (pred row k): the
 * candidate of the largest score, the first of equal ones; k in 1 .. B-1 (picks[0] untouched) */
void ddt_selector_picks(const ddt_selector_view *v, int32_t *picks);

/* draft (B): the greedy chain, draft[k] = c_k for k in 1 .. B-1: p_1 the anchor's token,
 * c_k = slot k's pick after p_k, p_{k+1} = c_k (draft[0] untouched) */
void ddt_selector_chain(const ddt_selector_view *v, int32_t *draft);

/* The lattice tree into t (ddt_tree_init'd: its first t->cap nodes): a node at depth k-1
 * holding p has the K candidates of slot k as children, ranked by S_k(p -> .) descending, ties
 * to the earlier candidate (so the first child is the greedy pick), edge log-probability
 * log softmax over the K scores; best-first as draft_tree.h says. The nodes' children are not
 * kept past the call (the walk reads tokens and parents). */
void ddt_selector_tree(const ddt_selector_view *v, ddt_tree *t);

/* The lattice DDTree draft of budget K: as ddt_tree_draft (acceptance.h) gives the unary one:
 * tokens (K), parents (K) (-1: a child of the root), at most K nodes; returns the nodes. */
int64_t ddt_selector_tree_draft(const ddt_selector_view *v, int64_t K, int32_t *tokens, int32_t *parents);

/* ------------------------------------------------------------------------------------------
 * Making a view on the drafter's backend
 */

typedef struct ddt_selector ddt_selector;

/* bytes ddt_selector_open allocates on the backend for drafter dc (0 for a DFlash drafter) */
int64_t ddt_selector_workspace_bytes(const ddt_drafter_config *dc);

/* A view maker for DFlash2 drafter dc on be: its device workspace and host view, allocated
 * once. 0, -EINVAL (dc is not a DFlash2 drafter or its block is outside [2, DDT_MAX_SLOTS]) or
 * -ENOMEM, with err. */
int ddt_selector_open(ddt_selector **out, const ddk_backend *be, const ddt_drafter_config *dc, char *err,
                      size_t err_len);
void ddt_selector_close(ddt_selector *s);

/* The view of one block, valid until the next fill: hs (B, H) the block's final-normed hidden
 * states and z (B, V) its unary logits, both in be's memory; w the drafter's weights (A, Bs, Hp
 * in be's memory); pred (B, host): pred[1] the anchor's token, pred[k] (k >= 2) slot k's
 * teacher-forced predecessor or < 0 for none; tokens in [0, V). z's top-K is the backend's
 * topk_rows (descending, NaNs after every number, ties to the lower id). */
const ddt_selector_view *ddt_selector_fill(ddt_selector *s, const ddt_drafter_weights *w, const float *hs,
                                           const float *z, const int32_t *pred);

#endif
