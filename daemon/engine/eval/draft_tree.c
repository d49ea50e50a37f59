/* draft_tree.c: the best-first DDTree over ranked children (draft_tree.h has the order it
 * builds). Not here: where the children come from (acceptance.c's per-slot ranks, selector.c's
 * lattice) or what the tree is for (acceptance's walk along labels, speculative decoding's
 * verify call).
 * Tested by tests/engine/eval/test_acceptance.c (brute-force trees of both sources).
 *
 * Legend: B slots, N nodes (<= cap).
 *
 * Scores are left folds in double, ((0 + logp_1) + logp_2) + ..., each node's from its parent's,
 * so that equal paths score equally whichever way they were reached. A frontier entry is a node
 * not yet taken: its parent, slot and rank; its token and children are looked up when it is.
 * Cost: O(N log N) heap steps, each comparison of tied scores walking two rank paths (<= B).
 */
#include "draft_tree.h"
#include "ddk.h"

#include <stdlib.h>

struct ddt_tree_frontier {
    double score;
    int32_t parent, slot, rank;
};

typedef ddt_tree_frontier frontier;

int64_t ddt_tree_possible_nodes(int64_t B, int64_t width, int64_t cap)
{
    int64_t total = 0, level = 1;
    for (int64_t k = 1; k <= B - 1 && total < cap; k++) {
        level = level > cap / width ? cap : level * width;
        total = total > cap - level ? cap : total + level;
    }
    return total < cap ? total : cap;
}

void ddt_tree_init(ddt_tree *t, int64_t cap)
{
    *t = (ddt_tree){ .cap = cap };
    t->nodes = malloc((size_t)(cap > 0 ? cap : 1) * sizeof *t->nodes);
    t->heap = malloc((size_t)(cap + 1) * sizeof *t->heap);
    if (!t->nodes || !t->heap)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a tree of %lld nodes", (long long)cap);
}

void ddt_tree_free(ddt_tree *t)
{
    free(t->nodes);
    free(t->heap);
    *t = (ddt_tree){ 0 };
}

/* ------------------------------------------------------------------------------------------
 * The frontier: a max-heap in the tree's order
 */

/* path (slot) of ranks from slot 1 to c's slot */
static int rank_path(const ddt_tree_node *nodes, frontier c, int32_t *path)
{
    path[c.slot - 1] = c.rank;
    for (int32_t p = c.parent; p >= 0; p = nodes[p].parent)
        path[nodes[p].slot - 1] = nodes[p].rank;
    return c.slot;
}

/* a comes before b: higher score, then the lexicographically smaller rank path */
static int frontier_before(const ddt_tree_node *nodes, frontier a, frontier b)
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

static void frontier_push(ddt_tree *t, frontier c)
{
    int64_t i = t->heap_n++;
    while (i > 0) {
        int64_t up = (i - 1) / 2;
        if (!frontier_before(t->nodes, c, t->heap[up]))
            break;
        t->heap[i] = t->heap[up];
        i = up;
    }
    t->heap[i] = c;
}

static frontier frontier_pop(ddt_tree *t)
{
    frontier best = t->heap[0], x = t->heap[--t->heap_n];
    int64_t n = t->heap_n, i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n)
            break;
        if (c + 1 < n && frontier_before(t->nodes, t->heap[c + 1], t->heap[c]))
            c++;
        if (!frontier_before(t->nodes, t->heap[c], x))
            break;
        t->heap[i] = t->heap[c];
        i = c;
    }
    if (n > 0)
        t->heap[i] = x;
    return best;
}

/* ------------------------------------------------------------------------------------------
 * Building and walking
 */

/* the children c is one of: its parent's, or the root's */
static const ddt_tree_children *siblings(const ddt_tree *t, frontier c)
{
    return c.parent < 0 ? &t->root : &t->nodes[c.parent].children;
}

void ddt_tree_build(ddt_tree *t, int64_t B, ddt_tree_children_of of, void *source)
{
    t->n = 0;
    t->heap_n = 0;
    if (B < 2 || t->cap < 1)
        return;
    t->root = of(source, 1, -1);
    if (t->root.n > 0)
        frontier_push(t, (frontier){ 0.0 + t->root.logp[0], -1, 1, 0 });
    while (t->n < t->cap && t->heap_n > 0) {
        frontier c = frontier_pop(t);
        const ddt_tree_children *row = siblings(t, c);
        const int32_t self = (int32_t)t->n++;
        ddt_tree_node *x = &t->nodes[self];
        *x = (ddt_tree_node){ c.score, c.parent, c.slot, c.rank, row->tokens[c.rank], { 0 } };
        if (c.rank + 1 < row->n) {
            const double base = c.parent < 0 ? 0.0 : t->nodes[c.parent].score;
            frontier_push(t, (frontier){ base + row->logp[c.rank + 1], c.parent, c.slot, c.rank + 1 });
        }
        if (c.slot + 1 <= B - 1) {
            x->children = of(source, c.slot + 1, x->token);
            if (x->children.n > 0)
                frontier_push(t, (frontier){ c.score + x->children.logp[0], self, c.slot + 1, 0 });
        }
    }
}

int64_t ddt_tree_walk(const ddt_tree *t, int64_t B, const int32_t *labels, int64_t *path)
{
    int64_t depth = 0, at = -1;
    for (int64_t k = 1; k < B && labels[k] >= 0; k++) {
        int64_t next = -1;
        for (int64_t j = at + 1; j < t->n && next < 0; j++)   /* children come after their parent */
            if (t->nodes[j].parent == at && t->nodes[j].token == labels[k])
                next = j;
        if (next < 0)
            break;
        path[depth++] = next;
        at = next;
    }
    return depth;
}
