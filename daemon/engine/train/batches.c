/* batches.c: a step's batch into the ranks' buffers (ddt_trainer_load_batch): the source's
 * sequences in cursor order, each rank its slice (a GPU's features through its pinned staging
 * block), anchors and noise seeded per sequence; co-located, the tokens only (generated data:
 * the cursor only, the ranks sample); a split's batch made by its target ranks, the next step's
 * taken ahead into the ranks' second slots.
 * Tested by tests/engine/train/test_trainer.c (exact resume; 1, 2 and 3 ranks; a split's losses and
 * evaluation against the host target's run bit for bit, and its exact resume from a checkpoint
 * taken with the next batch in flight).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/errors.h"
#include "data/batch.h"
#include "split.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * A split: the target ranks fill the drafter ranks' second slots (ahead) with the next step's
 * batch while the drafter trains on the first (b); the slots swap at the next step. The batch of
 * step k is the host path's (ddt_trainer_load_batch): sequence gi from cursor + gi, its anchors
 * and noise from (seed, k, gi), so a split run on CPU ranks repeats a host-target run bit for
 * bit. The data taken ahead is not the steps' yet: checkpoints record the cursor without it
 * (ddt_trainer_done_cursor), and a batch dropped gives it back (split_rewind).
 */

/* the data's cursor := cursor (a batch dropped, or taken halfway) */
static int split_rewind(ddt_trainer *t, int64_t cursor)
{
    if (t->generates) {
        t->cursor = cursor;
        return 0;
    }
    return ddt_source_seek(t->source, cursor);
}

/* Step `step`'s batch (0-based: run when t->step == step) into the ranks' slots (ahead or b) and
 * t->dest: the source's tokens and masks, or generated data's indices (the target ranks sample
 * the tokens, the masks are all ones); the anchors; where each sequence's features go. Takes
 * the batch's data (the source's next sequences, or the generated cursor's). */
static int split_prepare(ddt_trainer *t, int ahead, int64_t step, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, A = c->max_anchors, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const int64_t first = t->cursor;
    if (t->generates)
        t->cursor += c->sequences_per_step;
    for (int64_t gi = 0; gi < c->sequences_per_step; gi++) {
        const int r = (int)ddt_slice_part(c->sequences_per_step, t->world, gi);   /* a split is one daemon's */
        rank_state *rs = &t->rank[r];
        rank_batch *b = ahead ? &rs->ahead : &rs->b;
        const int64_t i = gi - rs->first;
        if (t->generates) {
            memset(b->loss_mask + i * S, 1, (size_t)S);
        } else {
            ddt_sequence q;
            int rc = ddt_source_next(t->source, &q, err, err_len);
            if (!rc && q.S != S)
                rc = ddt_fail(err, err_len, -EINVAL, "the source gave a sequence of %lld tokens, not seq_len %lld",
                              (long long)q.S, (long long)S);
            if (rc)
                return rc;
            memcpy(b->input_ids + i * S, q.input_ids, (size_t)S * sizeof(int32_t));
            memcpy(b->loss_mask + i * S, q.loss_mask, (size_t)S);
        }
        ddt_sample_anchors(b->loss_mask + i * S, S, A, ddt_batch_seed(c->seed, step, gi, SEED_ANCHORS),
                           b->anchors + i * A, b->keep + i * A);
        t->dest[gi] = (ddt_split_dest){ .drafter = r, .tokens = b->input_ids + i * S,
                                        .features = b->features + i * S * LH,
                                        .teacher = b->teacher ? b->teacher + i * S * H : NULL,
                                        .sample = t->generates, .index = first + gi, .noise = 1,
                                        .noise_seed = ddt_batch_seed(c->seed, step, gi, SEED_NOISE) };
    }
    return 0;
}

void ddt_trainer_split_settle(ddt_trainer *t)
{
    if (t->ahead != AHEAD_RUNNING)
        return;
    t->ahead_rc = ddt_split_wait(t->split, t->ahead_err, sizeof t->ahead_err);
    t->ahead = AHEAD_DONE;
}

/* This step's batch in the ranks' b slots (the one made ahead, else made now), then the next
 * step's started into their ahead slots unless this is the run's last step. A batch that failed
 * ahead fails this step with its error, its data given back; so does one made now. */
static int split_batch(ddt_trainer *t, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    ddt_trainer_split_settle(t);
    const int64_t cursor = ddt_trainer_done_cursor(t);
    int rc = 0;
    if (t->ahead == AHEAD_DONE) {
        t->ahead = AHEAD_NONE;
        if ((rc = t->ahead_rc))
            snprintf(err, err_len, "%s", t->ahead_err);
        for (int r = 0; r < t->ranks && !rc; r++) {
            rank_batch b = t->rank[r].b;
            t->rank[r].b = t->rank[r].ahead;
            t->rank[r].ahead = b;
        }
    } else if (!(rc = split_prepare(t, 0, t->step, err, err_len))) {
        ddt_split_start(t->split, t->dest, c->sequences_per_step);
        rc = ddt_split_wait(t->split, err, err_len);
    }
    if (rc) {
        split_rewind(t, cursor);
        return rc;
    }
    if (t->step + 1 >= c->steps)
        return 0;
    const int64_t next = ddt_trainer_done_cursor(t);
    char why[512];   /* the next step reports it, when it makes its batch again */
    if (split_prepare(t, 1, t->step + 1, why, sizeof why)) {
        split_rewind(t, next);
        return 0;
    }
    ddt_split_start(t->split, t->dest, c->sequences_per_step);
    t->ahead = AHEAD_RUNNING;
    return 0;
}

/* The global batch's sequences into the ranks' buffers, anchors and noise seeded per sequence.
 * Global rank g's slice is sequences [ddt_slice_first(g), ddt_slice_first(g + 1)); the slices of other
 * daemons' ranks are read and dropped, so every daemon's cursor stays the same. Features go
 * to the rank's memory (its GPU's), where the rank's backend adds their noise.
 *
 * A GPU rank's features and teacher states go through its pinned staging block: the host
 * copies sequence i into slot i there, the copy to the GPU is queued on the rank's stream
 * (be->copy, a DMA that returns at once from page-locked memory) and the host goes on with the
 * next sequence while it runs; the source's buffers are free again as soon as the host copy is
 * done. A slot is rewritten only by the next step's ddt_trainer_load_batch, and by then every
 * copy queued from it is done: each rank_main (step.c) ends with the rank's synchronize, after
 * the step's ops on the same stream, which come after these copies (then the all-reduce, which
 * also waits). The synchronize at the top makes that explicit and covers a step that never
 * reached rank_main (a source error halfway through the batch, a failed thread start); with
 * nothing queued it returns at once. CPU ranks copy before their copy returns: nothing changes
 * for them.
 * Co-located, the source gives tokens only: the ranks compute the features (rank_main); for
 * generated data there is no source: the cursor advances by the step's sequences and the ranks
 * sample their own (prefill_slice). */
int ddt_trainer_load_batch(ddt_trainer *t, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, A = c->max_anchors, H = c->drafter.hidden, LH = c->drafter.taps * H;
    if (t->split)
        return split_batch(t, err, err_len);
    if (t->generates) {   /* the ranks sample the tokens; the masks are all ones, the anchors theirs */
        t->batch_cursor = t->cursor;
        t->cursor += c->sequences_per_step;   /* every daemon's sequences, as the source's next would */
        for (int r = 0; r < t->ranks; r++) {
            rank_state *rs = &t->rank[r];
            memset(rs->b.loss_mask, 1, (size_t)(rs->nseq * S));
            for (int64_t i = 0; i < rs->nseq; i++)
                ddt_sample_anchors(rs->b.loss_mask + i * S, S, A,
                                   ddt_batch_seed(c->seed, t->step, rs->first + i, SEED_ANCHORS),
                                   rs->b.anchors + i * A, rs->b.keep + i * A);
        }
        return 0;
    }
    for (int r = 0; t->gpu && r < t->ranks; r++)
        t->rank[r].be->synchronize(t->rank[r].be);   /* no copy from the staging block in flight */
    for (int64_t gi = 0; gi < c->sequences_per_step; gi++) {
        ddt_sequence q;
        int rc = ddt_source_next(t->source, &q, err, err_len);
        if (rc)
            return rc;
        if (q.S != S) {
            snprintf(err, err_len, "the source gave a sequence of %lld tokens, not seq_len %lld",
                     (long long)q.S, (long long)S);
            return -EINVAL;
        }
        const int64_t r = ddt_slice_part(c->sequences_per_step, t->world, gi) - t->first_rank;
        if (r < 0 || r >= t->ranks)
            continue;   /* another daemon's */
        rank_state *rs = &t->rank[r];
        const ddk_backend *be = rs->be;
        const int64_t i = gi - rs->first;
        const size_t fbytes = (size_t)(S * LH) * sizeof(float), tbytes = (size_t)(S * H) * sizeof(float);
        const float *features = q.features, *teacher = q.teacher_hidden;
        if (rs->staging) {
            memcpy(rs->staged_features + i * S * LH, q.features, fbytes);
            features = rs->staged_features + i * S * LH;
            if (rs->b.teacher) {
                memcpy(rs->staged_teacher + i * S * H, q.teacher_hidden, tbytes);
                teacher = rs->staged_teacher + i * S * H;
            }
        }
        memcpy(rs->b.input_ids + i * S, q.input_ids, (size_t)S * sizeof(int32_t));
        memcpy(rs->b.loss_mask + i * S, q.loss_mask, (size_t)S);
        if (!t->colocated) {
            be->copy(be, rs->b.features + i * S * LH, features, fbytes);
            if (rs->b.teacher)
                be->copy(be, rs->b.teacher + i * S * H, teacher, tbytes);
            be->uniform_noise(be, rs->b.features + i * S * LH, S * LH, c->noise_std,
                              ddt_batch_seed(c->seed, t->step, gi, SEED_NOISE));
        }
        ddt_sample_anchors(rs->b.loss_mask + i * S, S, A, ddt_batch_seed(c->seed, t->step, gi, SEED_ANCHORS),
                           rs->b.anchors + i * A, rs->b.keep + i * A);
        if (!rs->staging)
            be->synchronize(be);   /* q's buffers are the source's again at its next call */
    }
    return 0;
}
