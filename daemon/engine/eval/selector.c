/* selector.c: DFlash2's path selector over one block's view (selector.h): its scores, the
 * teacher-forced picks, the greedy chain and the lattice tree; and the view made on the
 * drafter's backend. Not here: the drafter's forward or its unary logits (the caller's, as the
 * unary path has them), the acceptance metrics (acceptance.c) and verification (speculate.c).
 * Tested by tests/engine/eval/test_acceptance.c and tests/engine/eval/test_speculate.c.
 *
 * Legend: as selector.h; L lattice child lists computed for one tree (<= 1 + (B-2) K).
 *
 * Arithmetic: a score is (double)z + sum_r (double)A[p,r] q[r] Bs[c,r], in r order; with Bs = 0
 * it is z exactly, so a fresh DFlash2 drafter picks what its unary argmax picks. A child list's
 * log-softmax sums exp(S - max) over the candidates in ascending token order, as the unary
 * ranks' does over the vocabulary (acceptance.c), so that with Bs = 0 and K = V the lattice tree
 * is the unary tree bit for bit.
 * Memory per block: the view, O(B K r) floats on the device and the host (no (B, V) copy: the
 * backend's topk_rows picks the candidates where z is); a tree's child lists O(min(N, L) K).
 * Work per block: (B-1) K r multiply-adds for the picks or the chain, min(N, L) K r for a tree
 * (B = 16, K = 16, r = 256, N = 1024: under 1e6, where the unary ranks take an exp per logit).
 */
#include "selector.h"
#include "base/errors.h"
#include "ddk.h"

#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static void check_view(const ddt_selector_view *v)
{
    if (v->B < 1 || v->B > DDT_MAX_SLOTS || v->K < 1 || v->K > DDK_SELECTOR_MAX_K || v->r < 1)
        ddk_fatal(__FILE__, __LINE__, "selector view of %lld slots, %lld candidates, rank %lld: slots in [1, %d], "
                  "candidates in [1, %d], rank >= 1", (long long)v->B, (long long)v->K, (long long)v->r,
                  (int)DDT_MAX_SLOTS, (int)DDK_SELECTOR_MAX_K);
}

void ddt_selector_scores(const ddt_selector_view *v, int64_t k, const float *a, double *scores)
{
    const int64_t K = v->K, r = v->r;
    const float *q = v->q + k * r, *z = v->z + k * K, *succ = v->succ + k * K * r;
    for (int64_t i = 0; i < K; i++) {
        double s = 0;
        for (int64_t j = 0; j < r; j++)
            s += (double)a[j] * (double)q[j] * (double)succ[i * r + j];
        s += (double)z[i];
        scores[i] = s != s ? -INFINITY : (s > DBL_MAX ? DBL_MAX : s);
    }
}

/* the candidate index of slot k's pick after a = A[p]: the first largest score */
static int64_t pick(const ddt_selector_view *v, int64_t k, const float *a)
{
    double scores[DDK_SELECTOR_MAX_K];
    ddt_selector_scores(v, k, a, scores);
    int64_t best = 0;
    for (int64_t i = 1; i < v->K; i++)
        best = scores[i] > scores[best] ? i : best;
    return best;
}

void ddt_selector_picks(const ddt_selector_view *v, int32_t *picks)
{
    check_view(v);
    for (int64_t k = 1; k < v->B; k++)
        picks[k] = v->cand[k * v->K + pick(v, k, v->pred + k * v->r)];
}

void ddt_selector_chain(const ddt_selector_view *v, int32_t *draft)
{
    check_view(v);
    const int64_t K = v->K, r = v->r;
    const float *a = v->pred + r;   /* p_1: the anchor's token */
    for (int64_t k = 1; k < v->B; k++) {
        const int64_t i = pick(v, k, a);
        draft[k] = v->cand[k * K + i];
        a = v->cand_pred + (k * K + i) * r;   /* p_{k+1} = c_k (read only while k + 1 < B) */
    }
}

/* ------------------------------------------------------------------------------------------
 * The lattice: a node's children, computed when the tree first asks for them
 */

typedef struct lattice {
    const ddt_selector_view *v;
    int32_t *list_of;     /* (1 + (B-2) K) the list of (slot 1) or of (slot k >= 2, parent candidate i); -1: none yet */
    int32_t *tokens;      /* (L, K) each list's children in rank order */
    double *logp;         /* (L, K) */
    int64_t lists, max_lists;
} lattice;

/* row (K) of ranks: candidate indices by score descending, ties to the earlier candidate */
static void rank_candidates(const double *scores, int64_t K, int32_t *order)
{
    for (int64_t i = 0; i < K; i++) {   /* insertion: stable, so equal scores keep candidate order */
        int64_t at = i;
        while (at > 0 && scores[i] > scores[order[at - 1]]) {
            order[at] = order[at - 1];
            at--;
        }
        order[at] = (int32_t)i;
    }
}

/* the children list of slot k after a = A[p], into list l */
static void lattice_list(lattice *x, int64_t k, const float *a, int64_t l)
{
    const ddt_selector_view *v = x->v;
    const int64_t K = v->K;
    const int32_t *cand = v->cand + k * K;
    double scores[DDK_SELECTOR_MAX_K];
    int32_t order[DDK_SELECTOR_MAX_K], by_token[DDK_SELECTOR_MAX_K];
    ddt_selector_scores(v, k, a, scores);
    rank_candidates(scores, K, order);
    for (int64_t i = 0; i < K; i++) {   /* candidates by ascending token, for the softmax's sum */
        int64_t at = i;
        while (at > 0 && cand[i] < cand[by_token[at - 1]]) {
            by_token[at] = by_token[at - 1];
            at--;
        }
        by_token[at] = (int32_t)i;
    }
    double m = scores[0];   /* the largest */
    for (int64_t i = 1; i < K; i++)
        m = scores[i] > m ? scores[i] : m;
    double lse = 0;   /* every score -inf: every logp stays -inf */
    if (m > -INFINITY) {
        double sum = 0;
        for (int64_t i = 0; i < K; i++)
            sum += exp(scores[by_token[i]] - m);
        lse = m + log(sum);
    }
    for (int64_t rank = 0; rank < K; rank++) {
        x->tokens[l * K + rank] = cand[order[rank]];
        x->logp[l * K + rank] = scores[order[rank]] - lse;
    }
}

static ddt_tree_children lattice_children(void *source, int64_t slot, int32_t token)
{
    lattice *x = source;
    const ddt_selector_view *v = x->v;
    const int64_t K = v->K, r = v->r;
    int64_t key = 0;
    const float *a = v->pred + r;   /* slot 1: after the anchor's token */
    if (slot >= 2) {
        int64_t i = 0;
        while (i < K && v->cand[(slot - 1) * K + i] != token)
            i++;
        if (i == K)
            ddk_fatal(__FILE__, __LINE__, "a tree node at slot %lld holds %d, not one of its candidates",
                      (long long)slot - 1, (int)token);
        key = 1 + (slot - 2) * K + i;
        a = v->cand_pred + ((slot - 1) * K + i) * r;
    }
    if (x->list_of[key] < 0) {
        if (x->lists == x->max_lists)
            ddk_fatal(__FILE__, __LINE__, "lattice: more child lists than the %lld planned", (long long)x->max_lists);
        x->list_of[key] = (int32_t)x->lists;
        lattice_list(x, slot, a, x->lists++);
    }
    const int64_t l = x->list_of[key];
    return (ddt_tree_children){ x->tokens + l * K, x->logp + l * K, K };
}

void ddt_selector_tree(const ddt_selector_view *v, ddt_tree *t)
{
    check_view(v);
    const int64_t K = v->K, keys = 1 + (v->B > 2 ? (v->B - 2) * K : 0);
    const int64_t max_lists = 1 + t->cap < keys ? 1 + t->cap : keys;   /* the root's, then one a node */
    lattice x = { .v = v, .max_lists = max_lists };
    x.list_of = malloc((size_t)keys * sizeof *x.list_of);
    x.tokens = malloc((size_t)(max_lists * K) * sizeof *x.tokens);
    x.logp = malloc((size_t)(max_lists * K) * sizeof *x.logp);
    if (!x.list_of || !x.tokens || !x.logp)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a lattice of %lld child lists", (long long)max_lists);
    memset(x.list_of, 0xff, (size_t)keys * sizeof *x.list_of);
    ddt_tree_build(t, v->B, lattice_children, &x);   /* the root's token: pred row 1 stands for it */
    for (int64_t i = 0; i < t->n; i++)
        t->nodes[i].children = (ddt_tree_children){ 0 };
    t->root = (ddt_tree_children){ 0 };
    free(x.list_of);
    free(x.tokens);
    free(x.logp);
}

int64_t ddt_selector_tree_draft(const ddt_selector_view *v, int64_t K, int32_t *tokens, int32_t *parents)
{
    check_view(v);
    if (K < 1 || K > INT32_MAX)
        ddk_fatal(__FILE__, __LINE__, "node budget %lld outside [1, 2^31)", (long long)K);
    ddt_tree t;
    ddt_tree_init(&t, ddt_tree_possible_nodes(v->B, v->K, K));
    ddt_selector_tree(v, &t);
    for (int64_t i = 0; i < t.n; i++)
        tokens[i] = t.nodes[i].token, parents[i] = t.nodes[i].parent;
    const int64_t n = t.n;
    ddt_tree_free(&t);
    return n;
}

/* ------------------------------------------------------------------------------------------
 * The view, made on the drafter's backend
 */

struct ddt_selector {
    const ddk_backend *be;
    int64_t B, K, r, H, V;
    /* be's memory, one allocation; rows of slots 1 .. B-1 (the candidates of B-2 for cand_pred) */
    int32_t *dev_cand;       /* (B-1, K) topk_rows' ids, the gathers' tokens */
    float *dev_z;            /* (B-1, K) topk_rows' values */
    int32_t *dev_pred_tokens;/* (B-1) */
    float *dev_q;            /* (B, r) */
    float *dev_succ;         /* (B-1, K, r) */
    float *dev_cand_pred;    /* (B-2, K, r) */
    float *dev_pred;         /* (B-1, r) */
    void *dev_block;
    size_t dev_bytes;
    /* host memory, one allocation: the view's arrays, row 0 included */
    int32_t *cand, *pred_tokens;   /* (B, K), (B-1) */
    float *z, *q, *succ, *cand_pred, *pred;
    void *host_block;
    ddt_selector_view view;
};

/* floats (int32 counted as floats: both 4 bytes) of the device workspace */
static int64_t device_words(int64_t B, int64_t K, int64_t r)
{
    return 2 * (B - 1) * K + (B - 1) + B * r + (B - 1) * K * r + (B - 2) * K * r + (B - 1) * r;
}

int64_t ddt_selector_workspace_bytes(const ddt_drafter_config *dc)
{
    if (!dc->dflash2 || dc->block_size < 2)
        return 0;
    return device_words(dc->block_size, dc->selector_top_k, dc->selector_rank) * (int64_t)sizeof(float);
}

int ddt_selector_open(ddt_selector **out, const ddk_backend *be, const ddt_drafter_config *dc, char *err,
                      size_t err_len)
{
    *out = NULL;
    const int64_t B = dc->block_size, K = dc->selector_top_k, r = dc->selector_rank, V = dc->vocab;
    if (!dc->dflash2 || B < 2 || B > DDT_MAX_SLOTS || K < 1 || K > DDK_SELECTOR_MAX_K || K > V || r < 1)
        return ddt_fail(err, err_len, -EINVAL, "the path selector is DFlash2's (drafter.architecture \"dflash2\"), "
                        "with block_size in [2, %d] and selector_top_k in [1, min(%d, vocab_size)] (got "
                        "architecture %s, block_size %lld, selector_top_k %lld)", (int)DDT_MAX_SLOTS,
                        (int)DDK_SELECTOR_MAX_K, dc->dflash2 ? "dflash2" : "dflash", (long long)B, (long long)K);
    ddt_selector *s = calloc(1, sizeof *s);
    if (!s)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the path selector");
    *s = (ddt_selector){ .be = be, .B = B, .K = K, .r = r, .H = dc->hidden, .V = V };
    s->dev_bytes = (size_t)ddt_selector_workspace_bytes(dc);
    s->dev_block = ddk_malloc(be->alloc, s->dev_bytes);
    const size_t host_floats = (size_t)(2 * B * K + (B - 1) + B * r + 2 * B * K * r + B * r);
    s->host_block = malloc(host_floats * sizeof(float));
    if (!s->dev_block || !s->host_block) {
        ddt_selector_close(s);
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the path selector's block (%lld slots, %lld "
                        "candidates, rank %lld)", (long long)B, (long long)K, (long long)r);
    }
    s->dev_cand = s->dev_block;
    s->dev_z = (float *)(s->dev_cand + (B - 1) * K);
    s->dev_pred_tokens = (int32_t *)(s->dev_z + (B - 1) * K);
    s->dev_q = (float *)(s->dev_pred_tokens + (B - 1));
    s->dev_succ = s->dev_q + B * r;
    s->dev_cand_pred = s->dev_succ + (B - 1) * K * r;
    s->dev_pred = s->dev_cand_pred + (B - 2) * K * r;
    s->cand = s->host_block;
    s->z = (float *)(s->cand + B * K);
    s->pred_tokens = (int32_t *)(s->z + B * K);
    s->q = (float *)(s->pred_tokens + (B - 1));
    s->succ = s->q + B * r;
    s->cand_pred = s->succ + B * K * r;
    s->pred = s->cand_pred + B * K * r;
    memset(s->host_block, 0, host_floats * sizeof(float));   /* row 0 of every array, pred's unnamed rows */
    s->view = (ddt_selector_view){ B, K, r, s->cand, s->z, s->q, s->succ, s->cand_pred, s->pred };
    *out = s;
    return 0;
}

void ddt_selector_close(ddt_selector *s)
{
    if (!s)
        return;
    if (s->dev_block)
        ddk_free(s->be->alloc, s->dev_block, s->dev_bytes);
    free(s->host_block);
    free(s);
}

const ddt_selector_view *ddt_selector_fill(ddt_selector *s, const ddt_drafter_weights *w, const float *hs,
                                           const float *z, const int32_t *pred)
{
    const ddk_backend *be = s->be;
    const int64_t B = s->B, K = s->K, r = s->r, H = s->H, V = s->V, S1 = B - 1;
    const size_t F = sizeof(float);
    for (int64_t k = 1; k < B; k++)
        if (pred[k] >= V || (k == 1 && pred[k] < 0))
            ddk_fatal(__FILE__, __LINE__, "the predecessor of slot %lld is %d: the anchor's token is needed, every "
                      "one in [0, %lld)", (long long)k, (int)pred[k], (long long)V);
    /* the candidates of slots 1 .. B-1 and their logits */
    be->topk_rows(be, z + V, S1, V, K, s->dev_cand, s->dev_z);
    be->copy(be, s->cand + K, s->dev_cand, (size_t)(S1 * K) * sizeof(int32_t));
    be->copy(be, s->z + K, s->dev_z, (size_t)(S1 * K) * F);
    for (int64_t k = 1; k < B; k++)   /* unnamed teacher-forced predecessors: gathered as the anchor's */
        s->pred_tokens[k - 1] = pred[k] >= 0 ? pred[k] : pred[1];
    be->copy(be, s->dev_pred_tokens, s->pred_tokens, (size_t)S1 * sizeof(int32_t));
    /* q = hs Hp^T; the Bs rows of the candidates, the A rows of the predecessors */
    be->matmul(be, 0, 1, B, r, H, 1.0f, hs, H, w->sel_hidden, H, 0.0f, s->dev_q, r);
    be->embedding(be, w->sel_succ, s->dev_cand, S1 * K, r, s->dev_succ);
    if (B > 2)
        be->embedding(be, w->sel_pred, s->dev_cand, (B - 2) * K, r, s->dev_cand_pred);
    be->embedding(be, w->sel_pred, s->dev_pred_tokens, S1, r, s->dev_pred);
    be->copy(be, s->q, s->dev_q, (size_t)(B * r) * F);
    be->copy(be, s->succ + K * r, s->dev_succ, (size_t)(S1 * K * r) * F);
    be->copy(be, s->cand_pred + K * r, s->dev_cand_pred, (size_t)((B - 2) * K * r) * F);
    be->copy(be, s->pred + r, s->dev_pred, (size_t)(S1 * r) * F);
    be->synchronize(be);
    for (int64_t k = 2; k < B; k++)
        if (pred[k] < 0)
            memset(s->pred + k * r, 0, (size_t)r * F);
    return &s->view;
}
