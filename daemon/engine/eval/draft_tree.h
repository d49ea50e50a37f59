/* draft_tree.h: the best-first DDTree (SPEC.md sections 6, 7 and 2.1) over ranked children: a
 * node at depth k-1 has the children its source gives for slot k (the unary head: the same
 * per-slot ranks under every node; DFlash2's path selector: the K candidates of slot k ranked
 * by their scores after that node's token), each with an edge log-probability; nodes are taken
 * best-first by the summed log-probability. And the walk along a block's labels that the
 * acceptance metrics take through it.
 * Tested through its two sources: tests/engine/eval/test_acceptance.c (brute-force trees of the
 * unary ranks and of the selector's lattice against these).
 *
 * Legend: B slots in the block (slot 0 the anchor's, the root), N nodes (<= a cap).
 */
#ifndef DDT_DRAFT_TREE_H
#define DDT_DRAFT_TREE_H

#include <stdint.h>

enum { DDT_MAX_SLOTS = 256 };   /* the largest block (B) anything here is built for */

/* The children of one node at one slot, in rank order: logp non-increasing, ties already
 * broken by the source (the rank is the order). */
typedef struct ddt_tree_children {
    const int32_t *tokens;   /* (n) */
    const double *logp;      /* (n) each child's edge log-probability */
    int64_t n;
} ddt_tree_children;

/* The source of children: those at slot `slot` (1 .. B-1) of the node holding `token` at depth
 * slot - 1 (slot 1: the root's, token -1: the source knows the anchor's). The arrays stay valid
 * while the tree is built. */
typedef ddt_tree_children (*ddt_tree_children_of)(void *source, int64_t slot, int32_t token);

typedef struct ddt_tree_node {
    double score;                  /* summed logp along its path from the root */
    int32_t parent;                /* index in the tree; -1: a child of the root */
    int32_t slot;                  /* depth, 1 .. B-1 */
    int32_t rank;                  /* its rank among its parent's children */
    int32_t token;
    ddt_tree_children children;    /* its own children (n 0 at slot B-1) */
} ddt_tree_node;

typedef struct ddt_tree_frontier ddt_tree_frontier;

/* A tree of up to cap nodes, in best-first order. */
typedef struct ddt_tree {
    ddt_tree_node *nodes;          /* (n) */
    int64_t n, cap;
    ddt_tree_frontier *heap;       /* (cap + 1) the build's max-heap */
    int64_t heap_n;
    ddt_tree_children root;        /* the root's children (slot 1) */
} ddt_tree;

/* The nodes a tree of B-1 slots with `width` children per node can hold, saturated at cap. */
int64_t ddt_tree_possible_nodes(int64_t B, int64_t width, int64_t cap);

/* Room for a tree of cap nodes (ddk_fatal without memory); ddt_tree_free releases it. */
void ddt_tree_init(ddt_tree *t, int64_t cap);
void ddt_tree_free(ddt_tree *t);

/* The first cap nodes (all, when fewer exist) of the best-first order over a block of B slots,
 * children from `of(source, ...)`. The order: score descending,
 * then the rank path (ranks from slot 1 down) lexicographically ascending, a prefix before its
 * extensions. Both a node's parent and its previous sibling come strictly before it, so a
 * max-heap that starts with the root's first child and, on popping a node, pushes its next
 * sibling and its first child yields the order itself; a smaller budget's tree is a prefix. */
void ddt_tree_build(ddt_tree *t, int64_t B, ddt_tree_children_of of, void *source);

/* The walk along labels (B; < 0: invalid) from the root: at depth k, while slot k + 1's label
 * is valid and a child of the current node carries it, move there. path (B) gets the node
 * indices of the moves; returns their count. Indices grow along a path, so the tree of budget
 * K accepts the leading path nodes with index < K. */
int64_t ddt_tree_walk(const ddt_tree *t, int64_t B, const int32_t *labels, int64_t *path);

#endif
