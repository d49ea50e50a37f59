/* walk.c: serving-matched anchors (train.anchors "walk" | "tree_walk"). Speculative decoding
 * (SPEC.md 7) starts each block right after the drafter's last miss: its blocks start where
 * the walk of teacher-forced accepted lengths lands (p -> p + accepted + 1, the identity
 * tests/engine/eval/test_speculate.c pins), not uniformly. Before a step's forward, each walked
 * sequence of the rank's slice (train.walk_share of the step's sequences, spread evenly over
 * its indices) is drafted at every candidate position with the step's weights (forward only,
 * in groups of A anchors), each block's accepted length taken against the step's own labels
 * (the teacher's argmax or the data's next token: SPEC.md 2), and ddt_walk_anchors draws the
 * sequence's anchors from the walk's starts. "walk" follows the chain (leading slots whose argmax
 * equals the label, read back as argmax indices: 4 bytes a row); "tree_walk" DDTree's accepted
 * depth over train.walk_budget nodes (SPEC.md 6: the block's logits read back, B x V floats a
 * position, fit for small vocabularies). A DFlash2 drafter's walk follows its unary head.
 * Workspace (the rank's memory, freed at the end): the forward's (A*B, H) and rows x V logits,
 * rows = A*B capped by the step's loss chunk (so an out-of-memory step's smaller chunk shrinks
 * it too). Deterministic for (seed, step, sequence).
 * Tested by tests/engine/data/test_batch.c (the walk's starts and draws) and
 * tests/engine/train/test_trainer.c (a walked step's anchors are the starts of the walk a host
 * recomputation of the chain lengths gives; tree_walk; a resumed run's the same).
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

/* sequence gi of the step's n is walked: train.walk_share of them, evenly spread (share 1: all) */
static int walked(double share, int64_t gi)
{
    return (int64_t)((double)(gi + 1) * share) > (int64_t)((double)gi * share);
}

typedef struct walk_work {
    const ddk_backend *be;
    float *hs;             /* (A*B, H) backend */
    float *logits_dev;     /* (R, V) backend */
    int32_t *argmax_dev;   /* (R) backend */
    float *logits;         /* (B, V) host: tree_walk */
    int32_t *argmax;       /* (R) host */
    int32_t *labels;       /* (S) host: the label of position p (-1: none) */
    int32_t *len;          /* (S) host: accepted + 1 at each candidate drafted (else 1) */
    int32_t *positions;    /* (S) host: the positions to draft */
    int32_t *anchors;      /* (A) host: a group's */
    uint8_t *keep;         /* (A) host */
    int64_t R;
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
        be->argmax_rows(be, w->logits_dev, rows, V, w->argmax_dev);
        be->copy(be, w->argmax, w->argmax_dev, (size_t)rows * sizeof(int32_t));
        be->synchronize(be);
        for (int64_t r = 0; r < rows; r++)
            if (w->labels[r0 + r + 1] >= 0)
                w->labels[r0 + r + 1] = w->argmax[r];
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
    TREE_LENGTHS,    /* len[p]: DDTree's accepted depth + 1 (the block's logits read back) */
    TREE_SCALES      /* scale (n, B): the tree term's slot scales of block j (positions: the anchors) */
} block_use;

/* train.tree_weight: the scales (B) of one block from its logits (B, V) and labels (B): slot k's
 * 1 + 4 lambda sum over d >= k of s(z_d), s = sigma' of the margins z of ddt_tree_margins: the CE
 * gradient it weights is the gradient of lambda * 4 * sum_d sigma(z_d), the smoothed count of the
 * labels' prefixes in the tree of K nodes (its accepted depth), the tree's threshold held fixed */
static void tree_scales(const ddt_run_config *c, const float *logits, const int32_t *labels, float *scale)
{
    const int64_t B = c->drafter.block_size, V = c->drafter.vocab;
    double z[DDT_MAX_SLOTS], tail = 0;
    const int64_t D = ddt_tree_margins(logits, B, V, c->tree_budget, labels, z);
    for (int64_t k = B - 1; k >= 0; k--) {
        if (k >= 1 && k <= D) {
            const double sig = 1.0 / (1.0 + exp(-z[k]));
            tail += sig * (1.0 - sig);
        }
        scale[k] = (float)(1.0 + 4.0 * c->tree_weight * tail);
    }
}

/* Blocks of sequence i at positions (n, candidates), drafted with the step's weights in groups
 * of A (one forward each), each taken as `use` says */
static int draft_blocks(const ddt_trainer *t, const rank_state *rs, walk_work *w, int64_t i, const float *th,
                        const int32_t *positions, int64_t n, block_use use, float *scale)
{
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    const int64_t S = c->seq_len, A = c->max_anchors, B = d->block_size, H = d->hidden, V = d->vocab,
                  LH = d->taps * H;
    const ddk_backend *be = w->be;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    for (int64_t g0 = 0; g0 < n; g0 += A) {
        const int64_t m = n - g0 < A ? n - g0 : A;
        for (int64_t j = 0; j < A; j++) {
            w->anchors[j] = positions[g0 + (j < m ? j : m - 1)];
            w->keep[j] = j < m;
        }
        ddt_batch b = { 1, S, A, rs->b.input_ids + i * S, rs->b.loss_mask + i * S, rs->b.features + i * S * LH,
                        th, w->anchors, w->keep, NULL };
        int rc = ddt_drafter_forward(be, d, &rs->w, &head, &b, w->hs);
        if (rc)
            return rc;
        int32_t labels[DDT_MAX_SLOTS];
        if (use != CHAIN_LENGTHS) {
            for (int64_t j = 0; j < m; j++) {
                ddt_head_logits(be, &head, B, V, H, w->hs + j * B * H, w->logits_dev);
                be->copy(be, w->logits, w->logits_dev, (size_t)(B * V) * sizeof(float));
                be->synchronize(be);
                block_labels(w, S, B, w->anchors[j], labels);
                if (use == TREE_SCALES) {
                    tree_scales(c, w->logits, labels, scale + (g0 + j) * B);
                    continue;
                }
                ddt_acceptance acc;
                ddt_acceptance_init(&acc, &c->tree_budget, 1);
                ddt_acceptance_add_block(&acc, w->logits, B, V, labels);
                w->len[w->anchors[j]] = 1 + (int32_t)acc.tree_sum[0];
            }
            continue;
        }
        for (int64_t r0 = 0; r0 < m * B; r0 += w->R) {   /* R is a multiple of B */
            const int64_t rows = m * B - r0 < w->R ? m * B - r0 : w->R;
            ddt_head_logits(be, &head, rows, V, H, w->hs + r0 * H, w->logits_dev);
            be->argmax_rows(be, w->logits_dev, rows, V, w->argmax_dev);
            be->copy(be, w->argmax, w->argmax_dev, (size_t)rows * sizeof(int32_t));
            be->synchronize(be);
            for (int64_t j = r0 / B; j < (r0 + rows) / B; j++) {
                block_labels(w, S, B, w->anchors[j], labels);
                int32_t accepted = 0;
                for (int64_t k = 1; k < B && labels[k] >= 0 && w->argmax[j * B + k - r0] == labels[k]; k++)
                    accepted++;
                w->len[w->anchors[j]] = 1 + accepted;
            }
        }
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
    int64_t groups = t->chunk / B < A ? t->chunk / B : A;
    walk_work w = { .be = be, .R = (groups > 1 ? groups : 1) * B };
    const size_t hs_bytes = (size_t)(A * B * H) * sizeof(float), logit_bytes = (size_t)(w.R * V) * sizeof(float),
                 index_bytes = (size_t)w.R * sizeof(int32_t);
    w.hs = ddk_malloc(be->alloc, hs_bytes);
    w.logits_dev = ddk_malloc(be->alloc, logit_bytes);
    w.argmax_dev = ddk_malloc(be->alloc, index_bytes);
    const int host_logits = c->anchor_walk == DDT_ANCHORS_TREE_WALK || c->tree_weight > 0;
    w.logits = host_logits ? malloc((size_t)(B * V) * sizeof(float)) : NULL;
    w.argmax = malloc(index_bytes);
    w.labels = malloc((size_t)S * sizeof(int32_t));
    w.len = malloc((size_t)S * sizeof(int32_t));
    w.positions = malloc((size_t)S * sizeof(int32_t));
    w.anchors = malloc((size_t)A * sizeof(int32_t));
    w.keep = malloc((size_t)A);
    int rc = w.hs && w.logits_dev && w.argmax_dev && w.argmax && w.labels && w.len && w.positions && w.anchors && w.keep &&
             (w.logits || !host_logits) ? 0 : -ENOMEM;
    for (int64_t i = 0; i < rs->nseq && rc == 0; i++) {
        const int64_t gi = rs->first + i;
        const int walk = c->anchor_walk != DDT_ANCHORS_UNIFORM && walked(c->walk_share, gi);
        int32_t *anchors = rs->b.anchors + i * A;
        uint8_t *keep = rs->b.keep + i * A;
        const float *th = rs->b.teacher ? rs->b.teacher + i * S * H : NULL;
        const uint8_t *mask = rs->b.loss_mask + i * S;
        if (walk || c->tree_weight > 0)
            sequence_labels(t, rs, &w, i, th);
        if (walk) {   /* every candidate drafted, the walk along their lengths */
            int64_t n = 0;
            for (int64_t p = 0; p < S; p++) {
                w.len[p] = 1;
                if (p + 1 < S && mask[p] && mask[p + 1])
                    w.positions[n++] = (int32_t)p;
            }
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
    ddk_free(be->alloc, w.hs, hs_bytes);
    ddk_free(be->alloc, w.logits_dev, logit_bytes);
    ddk_free(be->alloc, w.argmax_dev, index_bytes);
    free(w.logits);
    free(w.argmax);
    free(w.labels);
    free(w.len);
    free(w.positions);
    free(w.anchors);
    free(w.keep);
    return rc;
}
