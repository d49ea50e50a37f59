/* acceptance.c: the acceptance metrics of SPEC.md section 6 over held-out blocks: acc_k, the
 * chain acceptance length tau_chain and the DDTree acceptance length tau_tree(K), from the
 * drafter's per-slot logits and the labels. Not here: sampling anchors or running the drafter
 * (the caller passes one block's logits), and the target's own verification (the labels stand
 * for what the target would accept).
 * Tested by tests/engine/eval/test_acceptance.c (hand-made blocks with known answers, a brute-force tree).
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
 * The tree: best-first over rank paths
 */

typedef struct tree_node {
    double score;        /* summed logp along the path */
    int32_t parent;      /* index in the tree; -1: the root */
    int32_t slot;        /* depth, 1..B-1 */
    int32_t rank;        /* rank at its slot */
    int32_t token;
} tree_node;

typedef struct candidate {
    double score;
    int32_t parent, slot, rank;
} candidate;

typedef struct tree_build {
    tree_node *nodes;      /* (N) in best-first order */
    int64_t n;
    candidate *heap;       /* (N + 1) max-heap of the frontier */
    int64_t heap_n;
} tree_build;

/* path (slot) of ranks from slot 1 to c's slot */
static int rank_path(const tree_node *nodes, candidate c, int32_t *path)
{
    path[c.slot - 1] = c.rank;
    for (int32_t p = c.parent; p >= 0; p = nodes[p].parent)
        path[nodes[p].slot - 1] = nodes[p].rank;
    return c.slot;
}

/* a comes before b: higher score, then the lexicographically smaller rank path */
static int candidate_before(const tree_node *nodes, candidate a, candidate b)
{
    if (a.score != b.score)
        return a.score > b.score;
    int32_t pa[DDT_MAX_SLOTS], pb[DDT_MAX_SLOTS];
    int la = rank_path(nodes, a, pa), lb = rank_path(nodes, b, pb);
    for (int i = 0; i < la && i < lb; i++)
        if (pa[i] != pb[i])
            return pa[i] < pb[i];
    return la < lb;   /* for a total order only: a node never shares the heap with its ancestor */
}

static void candidate_push(tree_build *t, candidate c)
{
    int64_t i = t->heap_n++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!candidate_before(t->nodes, c, t->heap[up]))
            break;
        t->heap[i] = t->heap[up];
        i = up;
    }
    t->heap[i] = c;
}

static candidate candidate_pop(tree_build *t)
{
    candidate best = t->heap[0], x = t->heap[--t->heap_n];
    int64_t n = t->heap_n, i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && candidate_before(t->nodes, t->heap[c + 1], t->heap[c]))
            c++;
        if (!candidate_before(t->nodes, t->heap[c], x))
            break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n > 0)
        t->heap[i] = x;
    return best;
}

/* the first `cap` nodes of the best-first order over B-1 slots of Kmax ranks each;
 * tokens, logp: ((B-1), Kmax) */
static void build_tree(tree_build *t, int64_t cap, int64_t B, int64_t Kmax, const int32_t *tokens,
                       const double *logp)
{
    t->n = 0;
    t->heap_n = 0;
    candidate_push(t, (candidate){ 0.0 + logp[0], -1, 1, 0 });
    while (t->n < cap && t->heap_n > 0) {
        candidate c = candidate_pop(t);
        const int64_t row = (int64_t)(c.slot - 1) * Kmax;
        int32_t self = (int32_t)t->n++;
        t->nodes[self] = (tree_node){ c.score, c.parent, c.slot, c.rank, tokens[row + c.rank] };
        if (c.rank + 1 < Kmax) {
            double base = c.parent < 0 ? 0.0 : t->nodes[c.parent].score;
            candidate_push(t, (candidate){ base + logp[row + c.rank + 1], c.parent, c.slot, c.rank + 1 });
        }
        if (c.slot + 1 <= B - 1)
            candidate_push(t, (candidate){ c.score + logp[row + Kmax], self, c.slot + 1, 0 });
    }
}

/* ------------------------------------------------------------------------------------------
 * One block
 */

/* nodes a tree of B-1 slots with Kmax ranks each can hold, saturated at cap */
static int64_t possible_nodes(int64_t B, int64_t Kmax, int64_t cap)
{
    int64_t total = 0, level = 1;
    for (int64_t k = 1; k <= B - 1 && total < cap; k++) {
        level = level > cap / Kmax ? cap : level * Kmax;
        total = total > cap - level ? cap : total + level;
    }
    return total < cap ? total : cap;
}

/* One block's working set, one allocation (widest members first): the ranks of slots 1..B-1
 * and the tree of up to N nodes over them */
typedef struct block_ranks {
    double *logp;       /* (B-1, Kmax) */
    int32_t *tokens;    /* (B-1, Kmax) */
    tree_build tree;    /* nodes (N), heap (N + 1) */
    int64_t Kmax;
    char *base;
} block_ranks;

/* ranks of logits (B, V) rows 1..B-1, Kmax = min(K, V) each, room for a tree of N nodes */
static void block_ranks_open(block_ranks *r, const float *logits, int64_t B, int64_t V, int64_t K, int64_t N)
{
    const int64_t S = B - 1, Kmax = K < V ? K : V;
    const size_t logp_bytes = (size_t)(S * Kmax) * sizeof(double),
                 node_bytes = (size_t)N * sizeof(tree_node),
                 heap_bytes = (size_t)(N + 1) * sizeof(candidate),
                 rank_bytes = (size_t)Kmax * sizeof(ranked),
                 token_bytes = (size_t)(S * Kmax) * sizeof(int32_t);
    char *base = malloc(logp_bytes + node_bytes + heap_bytes + rank_bytes + token_bytes);
    if (!base)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a block of %lld slots and %lld ranks", (long long)B,
                  (long long)Kmax);
    *r = (block_ranks){ .logp = (double *)base, .Kmax = Kmax, .base = base };
    r->tree.nodes = (tree_node *)(base + logp_bytes);
    r->tree.heap = (candidate *)(base + logp_bytes + node_bytes);
    ranked *scratch = (ranked *)(base + logp_bytes + node_bytes + heap_bytes);
    r->tokens = (int32_t *)(base + logp_bytes + node_bytes + heap_bytes + rank_bytes);
    for (int64_t k = 1; k < B; k++)
        rank_row(logits + k * V, V, Kmax, scratch, r->tokens + (k - 1) * Kmax, r->logp + (k - 1) * Kmax);
}

/* the block's B and V checked: the programming errors of the file's comment */
static void check_block(int64_t B, int64_t V)
{
    if (B < 1 || B > DDT_MAX_SLOTS || V < 1 || V > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "block of %lld slots over %lld tokens: slots in [1, %d], tokens in "
                         "[1, 2^31)", (long long)B, (long long)V, (int)DDT_MAX_SLOTS);
}

int64_t ddt_tree_draft(const float *logits, int64_t B, int64_t V, int64_t K, int32_t *tokens, int32_t *parents)
{
    check_block(B, V);
    if (K < 1 || K > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "node budget %lld outside [1, 2^31)", (long long)K);
    if (B < 2)
        return 0;
    const int64_t N = possible_nodes(B, K < V ? K : V, K);
    block_ranks r;
    block_ranks_open(&r, logits, B, V, K, N);
    build_tree(&r.tree, N, B, r.Kmax, r.tokens, r.logp);
    for (int64_t i = 0; i < r.tree.n; i++)
        tokens[i] = r.tree.nodes[i].token, parents[i] = r.tree.nodes[i].parent;
    const int64_t n = r.tree.n;
    free(r.base);
    return n;
}

void ddt_acceptance_add_block(ddt_acceptance *a, const float *logits, int64_t B, int64_t V,
                              const int32_t *labels)
{
    check_block(B, V);
    for (int64_t k = 1; k < B; k++)
        if (labels[k] >= V)
            ddk_fatal(__FILE__, __LINE__, "label %d at slot %lld is outside the vocabulary of %lld",
                             (int)labels[k], (long long)k, (long long)V);
    if (B < 2 || labels[1] < 0)
        return;

    int64_t max_budget = 1;   /* the argmax is needed even without a tree */
    for (int i = 0; i < a->n_budgets; i++)
        max_budget = a->budgets[i] > max_budget ? a->budgets[i] : max_budget;
    const int64_t Kmax = max_budget < V ? max_budget : V;
    const int64_t N = a->n_budgets > 0 ? possible_nodes(B, Kmax, max_budget) : 0;
    if (N > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "a tree of %lld nodes: node budgets are below 2^31", (long long)N);
    block_ranks r;
    block_ranks_open(&r, logits, B, V, max_budget, N);
    const int32_t *tokens = r.tokens;
    tree_build tree = r.tree;

    a->blocks++;
    int chain_open = 1;
    int64_t chain = 0;
    for (int64_t k = 1; k < B; k++) {
        if (labels[k] < 0) {
            chain_open = 0;
            continue;
        }
        int correct = tokens[(k - 1) * Kmax] == labels[k];
        a->slot_count[k]++;
        a->slot_correct[k] += correct;
        chain_open = chain_open && correct;
        chain += chain_open;
    }
    a->chain_sum += (double)chain;

    if (N > 0) {
        build_tree(&tree, N, B, Kmax, tokens, r.logp);
        /* walk the whole tree once; node indices grow along a path (a parent is popped before
         * its children), so budget K accepts the leading path nodes with index < K */
        int64_t path[DDT_MAX_SLOTS];
        int64_t depth = 0, at = -1;
        for (int64_t k = 1; k < B && labels[k] >= 0; k++) {
            int64_t next = -1;
            for (int64_t j = at + 1; j < tree.n && next < 0; j++)
                if (tree.nodes[j].parent == at && tree.nodes[j].token == labels[k])
                    next = j;
            if (next < 0)
                break;
            path[depth++] = next;
            at = next;
        }
        for (int i = 0; i < a->n_budgets; i++) {
            int64_t accepted = 0;
            while (accepted < depth && path[accepted] < a->budgets[i])
                accepted++;
            a->tree_sum[i] += (double)accepted;
        }
    }
    free(r.base);
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
