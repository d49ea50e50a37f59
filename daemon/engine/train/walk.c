/* walk.c: training for what serving sees, before a step's forward (SPEC.md 6 and 7).
 * The walks (train.anchors "walk" | "tree_walk"): speculative decoding starts each block right
 * after the drafter's last miss, where the walk of teacher-forced accepted lengths lands
 * (p -> p + accepted + 1, the identity tests/engine/eval/test_speculate.c pins), not uniformly.
 * Each walked sequence (train.walk_share of the run's sequences, spread evenly over them) is
 * drafted at every candidate position with the step's weights (forward only, in groups of A
 * anchors), each block's accepted length taken against the step's own labels (the teacher's
 * argmax or the data's next token: SPEC.md 2), and ddt_walk_anchors draws its anchors from the
 * walk's starts. "walk" follows the chain (leading slots whose argmax equals the label);
 * "tree_walk" DDTree's accepted depth over train.tree_budget nodes.
 * The tree term (train.tree_weight): every kept block of the slice drafted at its anchor, its
 * slots' weights scaled (rs->slot_scale) by sigma' of its labels' prefix margins against its
 * DDTree of train.tree_budget nodes (ddt_tree_margins). The loss stays normalised by the sum of
 * the weights, scaled: the term re-weights the slots (CE, KL, CAP and a DFlash2 selector's term
 * alike), it adds no gradient of its own.
 * What leaves the device per row: argmax indices (the chain), or each slot's top tree_budget
 * ranks (topk_rows) and the label's log-probability (logsumexp_rows); the trees are built on the
 * host from those. A DFlash2 drafter's blocks are its unary head's.
 * Workspace (the rank's memory, freed before the step's own): the forward's (A*B, H) besides the
 * forward's own arena (fp32, whatever train.precision), and R x V logits, R the whole blocks of
 * the loss's (chunk, vocab_tile or V) tile and one block at least. Not in the memory plan; an
 * out-of-memory walk shrinks the step's chunk as the step's own would.
 * Deterministic for (seed, step, sequence).
 * Tested by tests/engine/data/test_batch.c (the walk's starts and draws) and
 * tests/engine/train/test_trainer.c (a walked step's anchors are the starts of the walk that a
 * host recomputation of its blocks' lengths gives, chain with the teacher's labels and tree with
 * the data's; the tree term's scales against the margins recomputed from the blocks' logits;
 * exact resume of both; 1, 2, 3 ranks and micro-batches agree).
 *
 * Legend: S tokens, A anchors, B slots, H hidden, V vocabulary, R logit rows at a time.
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "data/batch.h"
#include "eval/acceptance.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* the run's n-th sequence (step * sequences_per_step + its index in the step) is walked:
 * train.walk_share of them, evenly spread over the run (share 1: all; one sequence a step at
 * share 0.5: every other step's) */
static int walked(double share, int64_t n)
{
    return (int64_t)((double)(n + 1) * share) > (int64_t)((double)n * share);
}

typedef struct walk_work {
    const ddk_backend *be;
    int64_t R, Kmax;       /* logit rows at a time (whole blocks); ranks a slot (the trees') */
    float *hs;             /* (A*B, H) backend */
    float *logits_dev;     /* (R, V) backend */
    int32_t *idx_dev;      /* (R, Kmax) backend: argmax_rows' or topk_rows' indices */
    float *val_dev;        /* (R, Kmax) backend: topk_rows' values */
    int32_t *col_dev;      /* (R) backend: each row's label */
    float *lse_dev, *lp_dev;   /* (R) each, backend: logsumexp_rows' */
    int32_t *idx;          /* (R, Kmax) host */
    float *val;            /* (R, Kmax) host */
    int32_t *col;          /* (R) host */
    float *lse, *lp;       /* (R) each, host */
    double *logp;          /* (B - 1, Kmax) host: one block's ranks' log-probabilities */
    int32_t *labels;       /* (S) host: the label of position p (-1: none) */
    int32_t *len;          /* (S) host: accepted + 1 at each candidate drafted (else 1) */
    int32_t *positions;    /* (S) host: the positions to draft */
    int32_t *anchors;      /* (A) host: a group's */
    uint8_t *keep;         /* (A) host */
} walk_work;

/* labels (S) of sequence i as the step has them: label[p] for p >= 1 where m[p], the teacher's
 * argmax after p - 1 (th row p - 1) or the data's token */
static void sequence_labels(const ddt_trainer *t, const rank_state *rs, walk_work *w, int64_t i, const float *th)
{
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, H = c->drafter.hidden, V = c->drafter.vocab;
    const int32_t *ids = rs->b.input_ids + i * S;
    const uint8_t *mask = rs->b.loss_mask + i * S;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    const ddk_backend *be = w->be;
    w->labels[0] = -1;
    for (int64_t p = 1; p < S; p++)
        w->labels[p] = mask[p] ? ids[p] : -1;
    if (!(c->ce_target_teacher && th))
        return;
    for (int64_t r0 = 0; r0 + 1 < S; r0 += w->R) {   /* th rows r0.. label positions r0 + 1.. */
        const int64_t rows = S - 1 - r0 < w->R ? S - 1 - r0 : w->R;
        ddt_head_logits(be, &head, rows, V, H, th + r0 * H, w->logits_dev);
        be->argmax_rows(be, w->logits_dev, rows, V, w->idx_dev);
        be->copy(be, w->idx, w->idx_dev, (size_t)rows * sizeof(int32_t));
        be->synchronize(be);
        for (int64_t r = 0; r < rows; r++)
            if (w->labels[r0 + r + 1] >= 0)
                w->labels[r0 + r + 1] = w->idx[r];
    }
}

/* the block at anchor p's labels (B): slot 0 none, slot k the label of p + k (-1 past S) */
static void block_labels(const walk_work *w, int64_t S, int64_t B, int64_t p, int32_t *labels)
{
    labels[0] = -1;
    for (int64_t k = 1; k < B; k++)
        labels[k] = p + k < S ? w->labels[p + k] : -1;
}

/* What draft_blocks takes from each block */
typedef enum block_use {
    CHAIN_LENGTHS,   /* len[p]: the chain's accepted length + 1 (argmax indices read back) */
    TREE_LENGTHS,    /* len[p]: DDTree's accepted depth + 1 (the slots' ranks read back) */
    TREE_SCALES      /* scale (n, B): the tree term's slot scales of block j (positions: the anchors) */
} block_use;

/* train.tree_weight: the scales (B) of one block from its ranks r, labels (B) and the labels'
 * log-probabilities (B): slot k's 1 + 4 lambda sum over d >= k of s(z_d), s = sigma' of the
 * margins z of ddt_tree_margins: the CE gradient it weights is the gradient of 4 lambda
 * sum_d sigma(z_d), the smoothed count of the labels' prefixes in the tree of K nodes (its
 * accepted depth), the tree's threshold held fixed */
static void tree_scales(const ddt_run_config *c, const ddt_block_ranks *r, const int32_t *labels,
                        const double *label_logp, float *scale)
{
    const int64_t B = c->drafter.block_size;
    double z[DDT_MAX_SLOTS], tail = 0;
    const int64_t D = ddt_tree_margins(r, B, c->tree_budget, labels, label_logp, z);
    for (int64_t k = B - 1; k >= 0; k--) {
        if (k >= 1 && k <= D) {
            const double sig = 1.0 / (1.0 + exp(-z[k]));
            tail += sig * (1.0 - sig);
        }
        scale[k] = (float)(1.0 + 4.0 * c->tree_weight * tail);
    }
}

/* The blocks of rows r0 .. r0 + rows - 1 of w->hs (whole blocks: j0 = r0 / B on) taken as `use`
 * says: their logits on the device, then only argmax indices (the chain) or each slot's top
 * Kmax ranks with the labels' log-probabilities (the trees) read back */
static void take_rows(const ddt_run_config *c, const rank_state *rs, walk_work *w, int64_t r0, int64_t rows,
                      block_use use, float *scale)
{
    const int64_t S = c->seq_len, B = c->drafter.block_size, H = c->drafter.hidden, V = c->drafter.vocab,
                  K = w->Kmax;
    const ddk_backend *be = w->be;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    ddt_head_logits(be, &head, rows, V, H, w->hs + r0 * H, w->logits_dev);
    for (int64_t j = r0 / B; j < (r0 + rows) / B; j++)   /* each row's label */
        block_labels(w, S, B, w->anchors[j], w->col + j * B - r0);
    if (use == CHAIN_LENGTHS) {
        be->argmax_rows(be, w->logits_dev, rows, V, w->idx_dev);
        be->copy(be, w->idx, w->idx_dev, (size_t)rows * sizeof(int32_t));
    } else {
        be->copy(be, w->col_dev, w->col, (size_t)rows * sizeof(int32_t));
        be->topk_rows(be, w->logits_dev, rows, V, K, w->idx_dev, w->val_dev);
        be->logsumexp_rows(be, w->logits_dev, rows, V, w->col_dev, w->lse_dev, w->lp_dev);
        be->copy(be, w->idx, w->idx_dev, (size_t)(rows * K) * sizeof(int32_t));
        be->copy(be, w->val, w->val_dev, (size_t)(rows * K) * sizeof(float));
        be->copy(be, w->lse, w->lse_dev, (size_t)rows * sizeof(float));
        be->copy(be, w->lp, w->lp_dev, (size_t)rows * sizeof(float));
    }
    be->synchronize(be);
    for (int64_t j = r0 / B; j < (r0 + rows) / B; j++) {
        const int64_t at = j * B - r0;   /* the block's first row in this batch of rows */
        const int32_t *labels = w->col + at;
        if (use == CHAIN_LENGTHS) {
            int32_t accepted = 0;
            for (int64_t k = 1; k < B && labels[k] >= 0 && w->idx[at + k] == labels[k]; k++)
                accepted++;
            w->len[w->anchors[j]] = 1 + accepted;
            continue;
        }
        double label_logp[DDT_MAX_SLOTS];
        for (int64_t k = 1; k < B; k++) {   /* slots 1..B-1: rows at + 1 .. at + B - 1 */
            label_logp[k] = w->lp[at + k];
            for (int64_t q = 0; q < K; q++)
                w->logp[(k - 1) * K + q] = (double)w->val[(at + k) * K + q] - w->lse[at + k];
        }
        const ddt_block_ranks ranks = { K, w->idx + (at + 1) * K, w->logp, NULL };
        if (use == TREE_SCALES)
            tree_scales(c, &ranks, labels, label_logp, scale + j * B);
        else
            w->len[w->anchors[j]] = 1 + (int32_t)ddt_tree_depth(&ranks, B, c->tree_budget, labels);
    }
}

/* Blocks of sequence i at positions (n, candidates), drafted with the step's weights in groups
 * of A (one forward each), each taken as `use` says (scale: TREE_SCALES' (n, B)) */
static int draft_blocks(const ddt_trainer *t, const rank_state *rs, walk_work *w, int64_t i, const float *th,
                        const int32_t *positions, int64_t n, block_use use, float *scale)
{
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    const int64_t S = c->seq_len, A = c->max_anchors, B = d->block_size, LH = d->taps * d->hidden;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    for (int64_t g0 = 0; g0 < n; g0 += A) {
        const int64_t m = n - g0 < A ? n - g0 : A;
        for (int64_t j = 0; j < A; j++) {
            w->anchors[j] = positions[g0 + (j < m ? j : m - 1)];
            w->keep[j] = j < m;
        }
        ddt_batch b = { 1, S, A, rs->b.input_ids + i * S, rs->b.loss_mask + i * S, rs->b.features + i * S * LH,
                        th, w->anchors, w->keep, NULL };
        int rc = ddt_drafter_forward(w->be, d, &rs->w, &head, &b, w->hs);
        if (rc)
            return rc;
        for (int64_t r0 = 0; r0 < m * B; r0 += w->R)   /* R is a multiple of B */
            take_rows(c, rs, w, r0, m * B - r0 < w->R ? m * B - r0 : w->R, use, scale ? scale + g0 * B : NULL);
    }
    return 0;
}

int ddt_trainer_match_serving(rank_state *rs)
{
    const ddt_trainer *t = rs->t;
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    const int64_t S = c->seq_len, A = c->max_anchors, B = d->block_size, H = d->hidden, V = d->vocab;
    const ddk_backend *be = rs->be;
    /* R x V logits within the loss's own (chunk, vocab_tile or V) tile; whole blocks, A at most */
    const int64_t tile = t->vocab_tile > 0 && t->vocab_tile < V ? t->vocab_tile : V,
                  fit = t->chunk * tile / V / B, blocks = fit < A ? fit : A;
    const int trees = c->anchor_walk == DDT_ANCHORS_TREE_WALK || c->tree_weight > 0;
    walk_work w = { .be = be, .R = (blocks > 1 ? blocks : 1) * B,
                    .Kmax = trees ? (c->tree_budget < V ? c->tree_budget : V) : 1 };
    const int64_t R = w.R, RK = w.R * w.Kmax;
    ddk_allocator *a = be->alloc;
    const size_t dev_bytes[] = { (size_t)(A * B * H) * sizeof(float), (size_t)(R * V) * sizeof(float),
                                 (size_t)RK * sizeof(int32_t), (size_t)RK * sizeof(float), (size_t)R * sizeof(int32_t),
                                 (size_t)R * sizeof(float), (size_t)R * sizeof(float) };
    void **dev[] = { (void **)&w.hs, (void **)&w.logits_dev, (void **)&w.idx_dev, (void **)&w.val_dev,
                     (void **)&w.col_dev, (void **)&w.lse_dev, (void **)&w.lp_dev };
    enum { DEV = sizeof dev_bytes / sizeof dev_bytes[0] };
    int rc = 0;
    for (int k = 0; k < DEV; k++)
        if (!(*dev[k] = ddk_malloc(a, dev_bytes[k])))
            rc = -ENOMEM;
    w.idx = malloc((size_t)RK * sizeof(int32_t));
    w.val = malloc((size_t)RK * sizeof(float));
    w.col = malloc((size_t)R * sizeof(int32_t));
    w.lse = malloc((size_t)R * sizeof(float));
    w.lp = malloc((size_t)R * sizeof(float));
    w.logp = malloc((size_t)((B - 1) * w.Kmax) * sizeof(double));
    w.labels = malloc((size_t)S * sizeof(int32_t));
    w.len = malloc((size_t)S * sizeof(int32_t));
    w.positions = malloc((size_t)S * sizeof(int32_t));
    w.anchors = malloc((size_t)A * sizeof(int32_t));
    w.keep = malloc((size_t)A);
    if (!(w.idx && w.val && w.col && w.lse && w.lp && w.logp && w.labels && w.len && w.positions && w.anchors &&
          w.keep))
        rc = -ENOMEM;
    for (int64_t i = 0; i < rs->nseq && rc == 0; i++) {
        const int64_t gi = rs->first + i;
        const int walk = c->anchor_walk != DDT_ANCHORS_UNIFORM &&
                         walked(c->walk_share, t->step * c->sequences_per_step + gi);
        int32_t *anchors = rs->b.anchors + i * A;
        uint8_t *keep = rs->b.keep + i * A;
        const float *th = rs->b.teacher ? rs->b.teacher + i * S * H : NULL;
        const uint8_t *mask = rs->b.loss_mask + i * S;
        if (walk || c->tree_weight > 0)
            sequence_labels(t, rs, &w, i, th);
        if (walk) {   /* every candidate drafted, the walk along their lengths */
            for (int64_t p = 0; p < S; p++)
                w.len[p] = 1;
            const int64_t n = ddt_anchor_candidates(mask, S, w.positions);
            if ((rc = draft_blocks(t, rs, &w, i, th, w.positions, n,
                                   c->anchor_walk == DDT_ANCHORS_TREE_WALK ? TREE_LENGTHS : CHAIN_LENGTHS, NULL)))
                break;
            ddt_walk_anchors(mask, S, w.len, A, ddt_batch_seed(c->seed, t->step, gi, SEED_WALK), anchors, keep);
        }
        if (c->tree_weight > 0) {   /* the anchors' blocks, their slots scaled */
            float *scale = rs->slot_scale + i * A * B;
            int64_t n = 0;
            while (n < A && keep[n])
                n++;
            for (int64_t k = n * B; k < A * B; k++)
                scale[k] = 1.0f;   /* padding: its weights are 0 anyway */
            if ((rc = draft_blocks(t, rs, &w, i, th, anchors, n, TREE_SCALES, scale)))
                break;
        }
    }
    for (int k = 0; k < DEV; k++)
        ddk_free(a, *dev[k], dev_bytes[k]);
    free(w.idx), free(w.val), free(w.col), free(w.lse), free(w.lp), free(w.logp);
    free(w.labels), free(w.len), free(w.positions), free(w.anchors), free(w.keep);
    return rc;
}
