/* ranks.c: the ranks on their devices (ddt_trainer_alloc_ranks, at open): each rank's backend (a
 * CPU rank or a GPU) under the memory budget; co-located, its own replica of the target (fp32 on
 * a CPU rank, bf16 on a GPU), or a split's target ranks (split.c); the head its step reads (a
 * replica's in place, or its copy of the host's: fp32, or bf16 in a split and with
 * train.precision bf16); its gradients; on a GPU its replica of the weights and the moments; its
 * slice of the batch in one slot, or a split's two.
 * Tested by tests/engine/train/test_trainer.c (1, 2 and 3 ranks; co-located and split runs on CPU ranks against
 * the host target's; their measured peaks against the plan's; a GPU the node does not have) and
 * tests/engine/train/test_step_cuda.c (GPU ranks against CPU ones; skipped without a GPU).
 */
#include "trainer.h"
#include "trainer_impl.h"
#include "base/errors.h"
#include "data/batch.h"
#include "split.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

/* The rank's slice of the batch in its blocks, for `slots` batches (a split's two): the index
 * arrays in batch_block, the features after them there (a CPU rank) or in dev_batch_block (a GPU). */
static void carve_batch(rank_state *rs, int slots, int64_t n, int64_t S, int64_t A, int64_t LH, int64_t H,
                        int teacher)
{
    rank_batch *const b[2] = { &rs->b, &rs->ahead };
    char *p = rs->batch_block;
    for (int k = 0; k < slots; k++) {
        b[k]->input_ids = (int32_t *)p;
        p += (size_t)(n * S) * sizeof(int32_t);
        b[k]->anchors = (int32_t *)p;
        p += (size_t)(n * A) * sizeof(int32_t);
        b[k]->loss_mask = (uint8_t *)p;
        p += (size_t)(n * S);
        b[k]->keep = (uint8_t *)p;
        p += (size_t)(n * A);
        p += (64 - (uintptr_t)p % 64) % 64;   /* the next slot's, or the features', alignment */
    }
    float *f = rs->dev_batch_block ? rs->dev_batch_block : (float *)p;
    for (int k = 0; k < slots; k++) {
        b[k]->features = f;
        b[k]->teacher = teacher ? f + n * S * LH : NULL;
        f += n * S * (LH + (teacher ? H : 0));
    }
    if (rs->staging) {
        rs->staged_features = rs->staging;
        rs->staged_teacher = teacher ? rs->staged_features + n * S * LH : NULL;
    }
}

/* Rank rs's own replica of the target on its backend (co-located): fp32 on a CPU rank (its
 * weights on the rank's allocator), bf16 on a GPU; generated data: its generator too. */
static int open_replica(ddt_trainer *t, rank_state *rs, int r, char *err, size_t err_len)
{
    char why[900];
    int rc = ddt_replica_open(&t->cfg, rs->be, rs->gpu >= 0, &rs->replica, t->generates ? &rs->gen : NULL, why,
                              sizeof why);
    if (rc)
        snprintf(err, err_len, "rank %d (%s:%d): its replica of the target (target.devices co-located): %s%s", r,
                 rs->be->name, rs->gpu >= 0 ? rs->gpu : r, why,
                 rc == -ENOMEM ? "; see `ddtreed plan`, or \"target.devices\": \"host\"" : "");
    return rc;
}

/* The head the ranks read when co-located or split (no host target has one: such a run opens
 * none), into t->embed / lm_head (rank 0's replica's is the trainer's, for the plan):
 *   - CPU ranks: a replica's fp32 head in place (each co-located rank its own; in a split,
 *     target rank 0's);
 *   - co-located GPUs: each rank its own replica's bf16 head in place (t's: rank 0's);
 *   - a split's GPUs: target rank 0's bf16 head brought to the host (head16), for
 *     ddt_trainer_alloc_ranks to upload to every drafter GPU, then freed. */
static int replica_head(ddt_trainer *t, char *err, size_t err_len)
{
    const ddt_target_model *m = t->split ? ddt_split_replica(t->split) : &t->rank[0].replica;
    if (!t->gpu) {
        t->embed = m->embed_tokens;
        t->lm_head = m->lm_head;
        if (!t->embed || !t->lm_head)   /* an fp32 CPU target has them (target.h) */
            return ddt_fail(err, err_len, -EINVAL, "rank 0: its replica of the target has no fp32 head on the host");
        return 0;
    }
    if (!m->bf16)   /* a GPU's replica is opened bf16 (ddt_replica_open) */
        return ddt_fail(err, err_len, -EINVAL, "the target's GPU replica holds no bf16 head");
    t->head_bf16 = 1;
    t->embed = m->embed_stored;
    t->lm_head = m->lm_head_stored;
    if (t->colocated)
        return 0;
    const size_t bytes = (size_t)(m->vocab * m->hidden) * sizeof(uint16_t);
    const int tied = m->embed_stored == m->lm_head_stored;
    if (!(t->head16 = malloc(tied ? bytes : 2 * bytes)))
        return ddt_fail(err, err_len, -ENOMEM, "no host memory for the target's head (%.2f GB in bf16)",
                        (tied ? 1 : 2) * bytes / 1e9);
    m->be->copy(m->be, t->head16, m->lm_head_stored, bytes);
    if (!tied)
        m->be->copy(m->be, t->head16 + m->vocab * m->hidden, m->embed_stored, bytes);
    m->be->synchronize(m->be);
    t->lm_head = t->head16;
    t->embed = tied ? t->head16 : t->head16 + m->vocab * m->hidden;
    return 0;
}

/* GPU ranks with train.precision bf16 reading the host's fp32 head (target.devices "host", or
 * features from shards): each GPU keeps it in bf16, as a split's GPUs do (half the bytes; the
 * loss reads it as stored, the same values as rounding it in every product). embed_tokens is
 * rounded too, exact for a bf16 checkpoint's weights. Rounded on the host into head16, for
 * ddt_trainer_alloc_ranks to upload to every GPU, then freed. */
static int round_host_head(ddt_trainer *t, char *err, size_t err_len)
{
    const int64_t count = t->cfg.drafter.vocab * t->cfg.drafter.hidden;
    const int tied = t->embed == t->lm_head;
    const size_t bytes = (size_t)count * sizeof(uint16_t) * (tied ? 1 : 2);
    if (!(t->head16 = malloc(bytes)))
        return ddt_fail(err, err_len, -ENOMEM, "no host memory for the target's head in bf16 (%.2f GB)",
                        bytes / 1e9);
    const ddk_backend *cpu = ddk_backend_cpu();
    cpu->round_bf16(cpu, t->lm_head, count, t->head16);
    if (!tied)
        cpu->round_bf16(cpu, t->embed, count, t->head16 + count);
    t->head_bf16 = 1;
    t->lm_head = t->head16;
    t->embed = tied ? t->head16 : t->head16 + count;
    return 0;
}

int ddt_trainer_alloc_ranks(ddt_trainer *t, const ddt_devices *dev, char *err, size_t err_len)
{
    const int32_t *gpu_ids = dev->gpu_ids;
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    const int64_t S = c->seq_len, A = c->max_anchors, LH = d->taps * d->hidden, H = d->hidden,
                  V = d->vocab, steps = c->sequences_per_step, g = t->first_rank;
    const int teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
    const size_t bytes = (size_t)t->total * sizeof(float);
    for (int r = 0; r < t->ranks; r++) {   /* the backends, and the replicas on them */
        rank_state *rs = &t->rank[r];
        rs->t = t;
        rs->tokens_for = -1;
        rs->gpu = t->gpu ? gpu_ids[r] : -1;
        char why[400] = "";
        rs->be = t->gpu ? ddk_backend_cuda_or_why(rs->gpu, why, sizeof why) : ddk_backend_cpu_rank(r);
        if (!rs->be) {   /* a GPU this build has no code for, or out of memory */
            const int rc = errno == ENOMEM ? -ENOMEM : -ENODEV;
            snprintf(err, err_len, "rank %d: %s", r, why);
            return rc;
        }
        if (c->budget_bytes)   /* the weights allocated before count towards it too */
            ddk_allocator_set_budget(rs->be->alloc, (size_t)c->budget_bytes);
        int rc = t->colocated ? open_replica(t, rs, r, err, err_len) : 0;
        if (rc)
            return rc;
    }
    int rc = 0;
    if (t->target_ranks) {   /* the split's target ranks, handing off to these */
        const ddk_backend *be[MAX_RANKS];
        for (int r = 0; r < t->ranks; r++)
            be[r] = t->rank[r].be;
        rc = ddt_split_open(&t->cfg, dev, be, t->ranks, t->generates, &t->split, err, err_len);
        if (!rc && !(t->dest = calloc((size_t)c->sequences_per_step, sizeof *t->dest)))
            rc = ddt_fail(err, err_len, -ENOMEM, "no memory for the split's batch");
    }
    if (!rc && (t->colocated || t->split))
        rc = replica_head(t, err, err_len);
    else if (!rc && t->gpu && c->bf16)
        rc = round_host_head(t, err, err_len);
    if (rc)
        return rc;
    const int slots = t->split ? 2 : 1;
    const int bf16_step = c->bf16 || t->head_bf16;   /* ddt_drafter_step's bf16 products: with copies */
    const size_t bytes16 = (size_t)t->total * sizeof(uint16_t);
    if (!t->gpu && bf16_step && !(t->params16 = ddk_malloc(ddk_allocator_cpu_rank(0), bytes16)))
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the bf16 copy of the drafter's weights "
                        "(%.3f GB); see `ddtreed plan`", bytes16 / 1e9);
    t->tied = t->embed == t->lm_head;
    const int tied = t->tied;
    const size_t head = (size_t)(V * H) * (t->head_bf16 ? sizeof(uint16_t) : sizeof(float));
    for (int r = 0; r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        rs->first = ddt_slice_first(steps, t->world, g + r);
        rs->nseq = ddt_slice_first(steps, t->world, g + r + 1) - rs->first;   /* >= 1 */
        ddk_allocator *a = rs->be->alloc;
        const int64_t n = rs->nseq > 0 ? rs->nseq : 1;
        const size_t features = (size_t)(n * S) * (size_t)(LH + (teacher ? H : 0)) * sizeof(float),
                     index = (size_t)(n * S) * (sizeof(int32_t) + 1) + (size_t)(n * A) * (sizeof(int32_t) + 1) + 64;
        rs->batch_bytes = (size_t)slots * (index + (t->gpu ? 0 : features));
        rs->grads = ddk_malloc(a, bytes + (t->gpu ? REDUCED * sizeof(float) : 0));
        int ok = rs->grads != NULL;
        if (c->grad_accum > 1 && rs->nseq > 1)
            ok &= (rs->micro_grads = ddk_malloc(a, bytes)) != NULL;
        if (c->tree_weight > 0)
            ok &= (rs->slot_scale = malloc((size_t)(n * A * d->block_size) * sizeof(float))) != NULL;
        if (t->gpu) {
            /* the staging block is allocated once: the rank's slice, hence its size, is the
             * same every step; a co-located GPU needs none (its replica writes its features) */
            rs->batch_block = malloc(rs->batch_bytes);
            rs->dev_batch_bytes = (size_t)slots * features;
            if (!t->colocated && !t->split)
                ok &= (rs->staging = ddk_host_alloc_pinned(features)) != NULL;
            ok &= rs->batch_block && (rs->dev_batch_block = ddk_malloc(a, rs->dev_batch_bytes)) != NULL;
            ok &= (rs->params = ddk_malloc(a, bytes)) && (rs->m = ddk_malloc(a, bytes)) &&
                  (rs->v = ddk_malloc(a, bytes)) != NULL;
            if (bf16_step)
                ok &= (rs->params16 = ddk_malloc(a, bytes16)) != NULL;
            if (t->colocated) {   /* its replica's bf16 head, in place */
                rs->embed = rs->replica.embed_stored;
                rs->lm_head = rs->replica.lm_head_stored;
            } else {              /* its copy: the host target's fp32 head, or a split's bf16 one */
                rs->head_bytes = head;
                ok &= (rs->own_lm_head = ddk_malloc(a, head)) && (tied || (rs->own_embed = ddk_malloc(a, head)));
                if (ok) {
                    rs->be->copy(rs->be, rs->own_lm_head, t->lm_head, head);
                    if (!tied)
                        rs->be->copy(rs->be, rs->own_embed, t->embed, head);
                    rs->be->synchronize(rs->be);
                }
                rs->lm_head = rs->own_lm_head;
                rs->embed = tied ? rs->own_lm_head : rs->own_embed;
            }
            rs->head_bf16 = t->head_bf16;
        } else {
            ok &= (rs->batch_block = ddk_malloc(a, rs->batch_bytes)) != NULL;
            rs->embed = t->colocated ? rs->replica.embed_tokens : t->embed;   /* in place */
            rs->lm_head = t->colocated ? rs->replica.lm_head : t->lm_head;
        }
        if (!ok) {
            snprintf(err, err_len, "rank %d (%s:%d): no memory for its gradients, batch%s; see `ddtreed plan`", r,
                     rs->be->name, t->gpu ? rs->gpu : r, t->gpu ? ", weights, moments and the target's head" : "");
            return -ENOMEM;
        }
        ddt_drafter_bind(d, rs->micro_grads ? rs->micro_grads : rs->grads, &rs->step_grads);
        ddt_drafter_bind(d, t->gpu ? rs->params : t->params, &rs->w);
        rs->w.bf16 = t->gpu ? rs->params16 : t->params16;
        carve_batch(rs, slots, n, S, A, LH, H, teacher);
    }
    if (t->head16) {   /* every GPU has its copy: the host's goes */
        free(t->head16);
        t->head16 = NULL;
        t->embed = t->lm_head = NULL;
    }
    return 0;
}
