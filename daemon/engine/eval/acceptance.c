/* acceptance.c: the acceptance metrics of SPEC.md section 6 over held-out blocks: acc_k, the
 * chain acceptance length tau_chain and the DDTree acceptance length tau_tree(K), from the
 * drafter's per-slot logits and the labels; for a DFlash2 drafter along its path selector
 * (SPEC.md 2.1, selector.c's picks and lattice tree), its unary head's figures beside. For
 * training (train/walk.c): a block's DDTree depth and the tree term's margins from its per-slot
 * ranks (the host's, or a backend's topk_rows and logsumexp_rows). Not here: sampling anchors or running the drafter (the caller passes one block's logits and
 * selector view), building a tree (draft_tree.c), and the target's own verification (the labels
 * stand for what the target would accept).
 * Tested by tests/engine/eval/test_acceptance.c (hand-made blocks and selector views with known
 * answers, brute-force trees).
 *
 * Legend: B slots in the block (slot 0 is the anchor's), V vocabulary, K a node budget,
 * Kmax = min(largest budget, V) ranks kept per slot, N nodes in the tree (N <= largest budget).
 *
 * The exact definition implemented, for one block:
 *  - Logits are cleaned first: NaN counts as -inf (never proposed ahead of a real logit), +inf
 *    as FLT_MAX. Each slot row 1..B-1 is log-softmaxed in double: m = max, lse = m +
 *    log(sum_v exp(x_v - m)), logp_v = x_v - lse (a row of only -inf: every logp is -inf).
 *  - Rank order within a slot: logit descending, ties to the lower token index; the argmax is
 *    rank 0. acc_k counts slot k when its label is valid (0 for a slot never counted);
 *    chain = number of leading slots 1, 2, ... whose label is valid and equals the argmax.
 *  - The tree: the root is the anchor's token (depth 0, not counted in a budget). A node at
 *    depth k (slot k) is a rank path (r_1, ..., r_k); its score is the left fold
 *    ((0 + logp_1[r_1]) + logp_2[r_2]) + ... in double. Nodes are totally ordered by score
 *    descending, then by rank path lexicographically ascending (a prefix before its
 *    extensions). Both a node's parent and its previous sibling come strictly before it in
 *    this order, so taking nodes best-first from a max-heap (start with (0); on popping
 *    (..., r) at depth k push its next sibling (..., r + 1) if r + 1 < Kmax and its first
 *    child (..., r, 0) if k + 1 <= B - 1) yields the order itself; the tree of budget K is
 *    its first K nodes (all nodes when fewer exist), and every budget's tree is a prefix of
 *    the largest one's. The first node is always (0), slot 1's argmax.
 *  - The walk: from the root, at depth k, while slot k + 1's label is valid and a child of the
 *    current node at slot k + 1 carries that token and is among the tree's first K nodes, move
 *    to it. The accepted depth is the number of moves; tau_tree(K) = 1 + its mean.
 *  - DFlash2 (ddt_acceptance_add_selector_block): acc_k and the chain take the selector's
 *    teacher-forced picks in place of the argmax (slot k's pick after the token before it, the
 *    view's pred row k), the tree is the selector's lattice (selector.h: a node's children are
 *    the K candidates of the next slot ranked after its token, edge logp the log-softmax over
 *    them), walked the same way; the unary figures above are counted beside, over the same
 *    blocks.
 *  - A block whose slot-1 label is invalid (or with B = 1) is skipped entirely, acc_k
 *    included. A label >= V, B outside [1, DDT_MAX_SLOTS], V < 1, a budget < 1 or more than
 *    DDT_MAX_BUDGETS budgets are programming errors: they end the process through ddk_fatal
 *    (the file and line, the daemon's hook flushing its records, then abort), as does running
 *    out of memory for the block's working set.
 *
 * Cost per block: two passes over each of the B-1 rows (a bounded min-heap of Kmax for the
 * ranks, skipping 64-token chunks that cannot enter it, then the exp sum), and O(N log N) heap
 * steps for the tree; no sort of V. The scalar double exp dominates: B = 32, V = 248320 took
 * about 40 ms with K = 64 and 60 ms with K = 1024 on a busy 2-core machine. A vectorised
 * float exp would cut that, at the price of logp no longer reproducible by plain libm code
 * (which tests/engine/eval/test_acceptance.c relies on to compare with its brute-force tree).
 */
#include "acceptance.h"
#include "draft_tree.h"
#include "ddk.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


void ddt_acceptance_init(ddt_acceptance *a, const int64_t *budgets, int n_budgets)
{
    if (n_budgets < 0 || n_budgets > DDT_MAX_BUDGETS)
        ddk_fatal(__FILE__, __LINE__, "%d node budgets, at most %d", n_budgets, (int)DDT_MAX_BUDGETS);
    memset(a, 0, sizeof *a);
    a->n_budgets = n_budgets;
    for (int i = 0; i < n_budgets; i++) {
        if (budgets[i] < 1)
            ddk_fatal(__FILE__, __LINE__, "node budget %lld: a tree holds at least the slot-1 argmax",
                             (long long)budgets[i]);
        a->budgets[i] = budgets[i];
    }
}

/* ------------------------------------------------------------------------------------------
 * Ranks of one slot row: the top Kmax tokens by a bounded min-heap
 */

typedef struct ranked {
    float logit;      /* cleaned */
    int32_t token;
} ranked;

/* NaN as -inf, +inf as FLT_MAX, so that the softmax and every comparison are defined */
static inline float clean_logit(float x)
{
    return x != x ? -INFINITY : (x > FLT_MAX ? FLT_MAX : x);
}

/* a after b in the rank order (logit descending, ties to the lower token) */
static inline int ranked_after(ranked a, ranked b)
{
    return a.logit < b.logit || (a.logit == b.logit && a.token > b.token);
}

/* min-heap by rank order: heap[0] is the last-ranked kept token */
static void ranked_sift_up(ranked *heap, int64_t i)
{
    ranked x = heap[i];
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!ranked_after(x, heap[up]))
            break;
        heap[i] = heap[up];
        i = up;
    }
    heap[i] = x;
}

static void ranked_sift_down(ranked *heap, int64_t n, int64_t i)
{
    ranked x = heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && ranked_after(heap[c + 1], heap[c]))
            c++;
        if (!ranked_after(heap[c], x))
            break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = x;
}

/* The Kmax (<= V) first tokens of row (V) in rank order with their log-probabilities:
 * tokens (Kmax), logp (Kmax); heap (Kmax) is scratch. */
static void rank_row(const float *row, int64_t V, int64_t Kmax, ranked *heap, int32_t *tokens,
                     double *logp)
{
    int64_t n = 0;
    for (; n < Kmax; n++) {
        heap[n] = (ranked){ clean_logit(row[n]), (int32_t)n };
        ranked_sift_up(heap, n);
    }
    /* Once full, most tokens lose to the last-ranked kept one: a branch-free (vectorised)
     * test over a chunk skips it whole. A raw NaN fails `>` like the -inf it stands for, a
     * raw +inf passes like FLT_MAX. Equal logits rank after (v's index is the highest yet). */
    enum { CHUNK = 64 };
    for (int64_t start = Kmax; start < V; start += CHUNK) {
        const int64_t end = V - start < CHUNK ? V : start + CHUNK;
        const float last = heap[0].logit;
        int any = 0;
        for (int64_t v = start; v < end; v++)
            any |= row[v] > last;
        for (int64_t v = start; any && v < end; v++) {
            float x = clean_logit(row[v]);
            if (x > heap[0].logit) {
                heap[0] = (ranked){ x, (int32_t)v };
                ranked_sift_down(heap, n, 0);
            }
        }
    }
    for (int64_t r = n - 1; r >= 0; r--) {   /* pop the last-ranked into the last free rank */
        tokens[r] = heap[0].token;
        logp[r] = heap[0].logit;   /* the logit for now; made a log-probability below */
        heap[0] = heap[r];
        ranked_sift_down(heap, r, 0);
    }

    const double m = logp[0];   /* the row's max */
    double lse = 0;             /* a row of only -inf: every logp stays -inf */
    if (m > -INFINITY) {
        double sum = 0;
        for (int64_t v = 0; v < V; v++)
            sum += exp((double)clean_logit(row[v]) - m);
        lse = m + log(sum);
    }
    for (int64_t r = 0; r < n; r++)
        logp[r] -= lse;
}

/* ------------------------------------------------------------------------------------------
 * One block
 */

void ddt_block_ranks_open(ddt_block_ranks *r, const float *logits, int64_t B, int64_t V, int64_t K)
{
    const int64_t S = B - 1, Kmax = K < V ? K : V;
    const size_t logp_bytes = (size_t)(S * Kmax) * sizeof(double),
                 rank_bytes = (size_t)Kmax * sizeof(ranked),
                 token_bytes = (size_t)(S * Kmax) * sizeof(int32_t);
    char *base = malloc(logp_bytes + rank_bytes + token_bytes);
    if (!base)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a block of %lld slots and %lld ranks", (long long)B,
                  (long long)Kmax);
    *r = (ddt_block_ranks){ .logp = (double *)base, .Kmax = Kmax, .base = base };
    ranked *scratch = (ranked *)(base + logp_bytes);
    r->tokens = (int32_t *)(base + logp_bytes + rank_bytes);
    for (int64_t k = 1; k < B; k++)
        rank_row(logits + k * V, V, Kmax, scratch, r->tokens + (k - 1) * Kmax, r->logp + (k - 1) * Kmax);
}

void ddt_block_ranks_close(ddt_block_ranks *r)
{
    free(r->base);
    r->base = NULL;
}

/* the unary tree's children: slot k's ranks, whatever the parent */
static ddt_tree_children rank_children(void *source, int64_t slot, int32_t token)
{
    (void)token;
    const ddt_block_ranks *r = source;
    return (ddt_tree_children){ r->tokens + (slot - 1) * r->Kmax, r->logp + (slot - 1) * r->Kmax, r->Kmax };
}

/* the block's B and V checked: the programming errors of the file's comment */
static void check_block(int64_t B, int64_t V)
{
    if (B < 1 || B > DDT_MAX_SLOTS || V < 1 || V > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "block of %lld slots over %lld tokens: slots in [1, %d], tokens in "
                         "[1, 2^31)", (long long)B, (long long)V, (int)DDT_MAX_SLOTS);
}

/* The best-first tree of K nodes over ranks r of a block of B slots into t (ddt_tree_free it;
 * r must outlive t's children arrays) */
static void unary_tree(const ddt_block_ranks *r, int64_t B, int64_t K, ddt_tree *t)
{
    ddt_tree_init(t, ddt_tree_possible_nodes(B, r->Kmax, K));
    ddt_tree_build(t, B, rank_children, (void *)r);
}

int64_t ddt_tree_draft(const float *logits, int64_t B, int64_t V, int64_t K, int32_t *tokens, int32_t *parents)
{
    check_block(B, V);
    if (K < 1 || K > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "node budget %lld outside [1, 2^31)", (long long)K);
    if (B < 2)
        return 0;
    ddt_block_ranks r;
    ddt_block_ranks_open(&r, logits, B, V, K);
    ddt_tree t;
    unary_tree(&r, B, K, &t);
    for (int64_t i = 0; i < t.n; i++)
        tokens[i] = t.nodes[i].token, parents[i] = t.nodes[i].parent;
    const int64_t n = t.n;
    ddt_tree_free(&t);
    ddt_block_ranks_close(&r);
    return n;
}

int64_t ddt_tree_depth(const ddt_block_ranks *r, int64_t B, int64_t K, const int32_t *labels)
{
    ddt_tree t;
    unary_tree(r, B, K, &t);
    int64_t path[DDT_MAX_SLOTS];
    int64_t depth = ddt_tree_walk(&t, B, labels, path);   /* path indices grow: all < t.n <= K */
    ddt_tree_free(&t);
    return depth;
}

int64_t ddt_tree_margins(const ddt_block_ranks *r, int64_t B, int64_t K, const int32_t *labels,
                         const double *label_logp, double *z)
{
    int64_t D = 0;
    while (D + 1 < B && labels[D + 1] >= 0)
        D++;
    if (D == 0)
        return 0;
    ddt_tree t;
    unary_tree(r, B, K, &t);
    const double last = t.nodes[t.n - 1].score;   /* the tree's lowest: n >= 1 (slot 1's first rank) */
    ddt_tree_free(&t);
    double prefix = 0;
    for (int64_t d = 1; d <= D; d++) {
        prefix += label_logp[d];
        z[d] = prefix - last;
    }
    return D;
}

/* The largest budget (at least 1: the argmax is needed even without a tree) */
static int64_t max_budget(const ddt_acceptance *a)
{
    int64_t max = 1;
    for (int i = 0; i < a->n_budgets; i++)
        max = a->budgets[i] > max ? a->budgets[i] : max;
    return max;
}

/* A tree of cap nodes over `width` children per node (none without budgets) */
static void open_tree(const ddt_acceptance *a, ddt_tree *t, int64_t B, int64_t width)
{
    const int64_t N = a->n_budgets > 0 ? ddt_tree_possible_nodes(B, width, max_budget(a)) : 0;
    if (N > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "a tree of %lld nodes: node budgets are below 2^31", (long long)N);
    ddt_tree_init(t, N);
}

/* One way of drafting's figures over a block: its picks (B) against the labels (B) (slot_correct
 * (B) and *chain_sum), and the walk along them through its tree (tree_sum (budgets)). */
static void count_block(const ddt_acceptance *a, int64_t B, const int32_t *labels, const int32_t *picks,
                        const ddt_tree *tree, int64_t *slot_correct, double *chain_sum, double *tree_sum)
{
    int chain_open = 1;
    int64_t chain = 0;
    for (int64_t k = 1; k < B; k++) {
        if (labels[k] < 0) {
            chain_open = 0;
            continue;
        }
        const int correct = picks[k] == labels[k];
        slot_correct[k] += correct;
        chain_open = chain_open && correct;
        chain += chain_open;
    }
    *chain_sum += (double)chain;

    int64_t path[DDT_MAX_SLOTS];
    const int64_t depth = tree->cap > 0 ? ddt_tree_walk(tree, B, labels, path) : 0;
    for (int i = 0; i < a->n_budgets; i++) {
        int64_t accepted = 0;
        while (accepted < depth && path[accepted] < a->budgets[i])
            accepted++;
        tree_sum[i] += (double)accepted;
    }
}

/* The labels checked; 1 when the block counts (its slot-1 label is valid), its slots counted */
static int count_slots(ddt_acceptance *a, int64_t B, int64_t V, const int32_t *labels)
{
    check_block(B, V);
    for (int64_t k = 1; k < B; k++)
        if (labels[k] >= V)
            ddk_fatal(__FILE__, __LINE__, "label %d at slot %lld is outside the vocabulary of %lld",
                             (int)labels[k], (long long)k, (long long)V);
    if (B < 2 || labels[1] < 0)
        return 0;
    a->blocks++;
    for (int64_t k = 1; k < B; k++)
        a->slot_count[k] += labels[k] >= 0;
    return 1;
}

/* The unary head's figures of a block: its argmax and its tree of per-slot ranks */
static void count_unary(const ddt_acceptance *a, const float *logits, int64_t B, int64_t V, const int32_t *labels,
                        int64_t *slot_correct, double *chain_sum, double *tree_sum)
{
    ddt_block_ranks r;
    ddt_block_ranks_open(&r, logits, B, V, max_budget(a));
    int32_t argmax[DDT_MAX_SLOTS];
    for (int64_t k = 1; k < B; k++)
        argmax[k] = r.tokens[(k - 1) * r.Kmax];
    ddt_tree tree;
    open_tree(a, &tree, B, r.Kmax);
    ddt_tree_build(&tree, B, rank_children, &r);
    count_block(a, B, labels, argmax, &tree, slot_correct, chain_sum, tree_sum);
    ddt_tree_free(&tree);
    ddt_block_ranks_close(&r);
}

void ddt_acceptance_add_block(ddt_acceptance *a, const float *logits, int64_t B, int64_t V,
                              const int32_t *labels)
{
    if (count_slots(a, B, V, labels))
        count_unary(a, logits, B, V, labels, a->slot_correct, &a->chain_sum, a->tree_sum);
}

void ddt_acceptance_add_selector_block(ddt_acceptance *a, const float *logits, const ddt_selector_view *v,
                                       int64_t V, const int32_t *labels)
{
    const int64_t B = v->B;
    a->selector = 1;
    if (!count_slots(a, B, V, labels))
        return;
    count_unary(a, logits, B, V, labels, a->unary_slot_correct, &a->unary_chain_sum, a->unary_tree_sum);
    int32_t picks[DDT_MAX_SLOTS];
    ddt_selector_picks(v, picks);
    ddt_tree tree;
    open_tree(a, &tree, B, v->K);
    ddt_selector_tree(v, &tree);
    count_block(a, B, labels, picks, &tree, a->slot_correct, &a->chain_sum, a->tree_sum);
    ddt_tree_free(&tree);
}

/* ------------------------------------------------------------------------------------------
 * Results
 */

double ddt_acceptance_acc(const ddt_acceptance *a, int64_t k)
{
    if (k < 0 || k >= DDT_MAX_SLOTS)
        ddk_fatal(__FILE__, __LINE__, "slot %lld outside [0, %d)", (long long)k, (int)DDT_MAX_SLOTS);
    return a->slot_count[k] > 0 ? (double)a->slot_correct[k] / (double)a->slot_count[k] : 0.0;
}

double ddt_acceptance_tau_chain(const ddt_acceptance *a)
{
    return a->blocks > 0 ? 1.0 + a->chain_sum / (double)a->blocks : 1.0;
}

double ddt_acceptance_tau_tree(const ddt_acceptance *a, int i)
{
    if (i < 0 || i >= a->n_budgets)
        ddk_fatal(__FILE__, __LINE__, "budget %d of %d", i, a->n_budgets);
    return a->blocks > 0 ? 1.0 + a->tree_sum[i] / (double)a->blocks : 1.0;
}

ddt_acceptance ddt_acceptance_unary(const ddt_acceptance *a)
{
    ddt_acceptance u = *a;
    if (a->selector) {
        memcpy(u.slot_correct, a->unary_slot_correct, sizeof u.slot_correct);
        u.chain_sum = a->unary_chain_sum;
        memcpy(u.tree_sum, a->unary_tree_sum, sizeof u.tree_sum);
        u.selector = 0;
    }
    return u;
}
