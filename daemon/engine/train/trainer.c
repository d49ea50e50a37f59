/* trainer.c: one run's training loop (trainer.h).
 *
 * A step: the main thread takes the global batch's sequences from the source in cursor order
 * and gives global rank g a contiguous slice (a daemon in a cluster reads the whole batch and
 * keeps its ranks' slices); every rank (a thread with its own backend: a CPU rank, or a GPU)
 * samples its anchors and noise from seeds of (run seed, step, global sequence index), runs
 * the drafter step into its own gradient buffer. Then the gradient of the one globally
 * normalised loss, each rank's weighted by its share of the global weight sum:
 *   - CPU ranks: summed in rank order on the host; AdamW updates the one set of weights;
 *   - GPU ranks: each scales its gradient by its weight sum and appends its loss sums
 *     (REDUCED floats), one NCCL all-reduce sums them over every rank of the run (of every
 *     daemon), each rank divides by the global weight sum and runs AdamW on its own replica of
 *     the weights and moments (the same update everywhere: the replicas stay equal). The host
 *     keeps a mirror of rank 0's weights, refreshed for checkpoints and exports.
 * Everything depends on (seed, step, cursor) only: a resumed run sees the same sequences,
 * anchors and noise as an uninterrupted one, and on CPU ranks repeats it bit for bit; on GPUs
 * to float rounding only, since the GPU attention's backward sums dk and dv with atomics in no
 * fixed order (attention_cuda.cu). 1 or 2 ranks give the same losses to float rounding.
 * Global rank g of W trains on a contiguous slice of the S_step sequences of a step, as even as
 * can be (the first S_step % W ranks take one more), and every rank on one at least
 * (ddt_run_config_devices refuses more ranks than sequences, or takes fewer GPUs for "all").
 * Where the features come from (ddt_devices.colocated, "target.devices"):
 *   - the host target ("host"; "auto" on CPU ranks): the source's loader computes them into host
 *     slots, load_batch copies them into each rank's batch buffers, a GPU's through a pinned
 *     staging buffer;
 *   - co-located ("same"; "auto" on GPU ranks): every rank holds its own replica of the target on
 *     its own backend (fp32 on a CPU rank, bf16 on a GPU) and, in its own thread before its step,
 *     prefills its sequences straight into its batch buffers (rank_main). A token file: the
 *     source yields tokens only. Generated data: no source and no host target at all; each
 *     rank first samples its sequences' tokens with a generator over its replica
 *     (ddt_source_generate, the generated source's own rule: seed (seed, index, "train"), mask
 *     all ones), global sequence gi of a step being index cursor + gi, where the trainer keeps
 *     the cursor the source would have (sequences handed out; checkpointed and restored the
 *     same way). Rank 0's replica computes the held-out features of an evaluation and, for
 *     generated data, samples the held-out tokens ("heldout" stream; kept once sampled, as the
 *     source keeps them). A rank reads its replica's embed_tokens / lm_head in place: fp32 on a
 *     CPU rank, bf16 on a GPU (the loss's bf16 head). On CPU ranks the same arithmetic runs on
 *     another CPU backend: the tokens, the losses and the evaluation are the host run's bit for
 *     bit. Not here: decoding several sequences per step (a rank samples its sequences one after
 *     another);
 *   - a split (a GPU list or a number): target ranks of their own (split.c) fill the drafter
 *     ranks' second batch slots with the next step's batch while the drafter trains on the
 *     first (split_batch); the drafter reads target rank 0's head: in place on CPU ranks, a bf16
 *     copy on each GPU. On CPU ranks the host run's losses bit for bit.
 * Speculative decoding (eval.speculative, POST /runs/{id}/speculate; SPEC.md section 7): rank 0
 * speculates with its own weights (or a checkpoint's, brought to its memory) over the target
 * beside it: its co-located replica, or on CPU ranks the source's host target (read-only; the
 * speculator keeps its own cache, so the loader thread may use the target meanwhile). Its
 * speculator is opened once, at open with eval.speculative, else at the first request. Not
 * here: a split's target (on other devices) and GPU ranks with a host target.
 * Tested by tests/test_trainer.c (CPU ranks) and tests/test_step_cuda.c (a GPU's step against
 * the CPU's; skipped without a GPU); the speculative path on a GPU is not tested here.
 */
#include "base/ddt_time.h"
#include "trainer.h"
#include "data/batch.h"
#include "model/model_config.h"
#include "record/checkpoint.h"
#include "base/errors.h"
#include "ddk.h"
#include "model/optimizer.h"
#include "model/generate.h"
#include "data/source.h"
#include "split.h"
#include "base/log.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

enum { MAX_RANKS = DDT_MAX_RANKS, CHUNK_FLOOR = 16, TILE_FLOOR = 256, SEED_ANCHORS = 1,
       SEED_NOISE = 2, SEED_EVAL = 3, SEED_INIT = 4 };

/* Floats appended to a GPU rank's gradient for the all-reduce: its weight sum, the weighted
 * sums of loss, ce, kl and cap, the counted and correct positions (exact below 2^24). */
enum { R_WEIGHT, R_LOSS, R_CE, R_KL, R_CAP, R_COUNTED, R_CORRECT, REDUCED };

enum { AHEAD_NONE, AHEAD_RUNNING, AHEAD_DONE };

/* A rank's slice of one step's batch */
typedef struct rank_batch {
    int32_t *input_ids;           /* (nseq, S) */
    uint8_t *loss_mask;           /* (nseq, S) */
    int32_t *anchors;             /* (nseq, A) */
    uint8_t *keep;                /* (nseq, A) */
    float *features;              /* (nseq, S, L_t*H) */
    float *teacher;               /* (nseq, S, H), or NULL */
} rank_batch;

typedef struct rank_state {
    const ddk_backend *be;
    int gpu;                      /* the GPU ordinal, or -1: a CPU rank */
    float *grads;                 /* (total [+ REDUCED on a GPU]) */
    float *micro_grads;           /* (total): one micro-batch's, when grad_accum > 1 */
    ddt_drafter_weights step_grads;   /* bound once: into micro_grads when accumulating, else grads */
    /* GPU ranks: the replica of the weights, the moments and the target's head on the GPU
     * (CPU ranks read the trainer's) */
    float *params, *m, *v;        /* (total) each */
    uint16_t *params16;           /* (total) the replica's bf16 copy in a bf16 step (else NULL) */
    void *own_embed, *own_lm_head;    /* (V, H) each, a GPU's copies (fp32, or bf16 in a split or
                                         with train.precision bf16);
                                         one buffer when tied */
    size_t head_bytes;            /* of each copy */
    ddt_target_model replica;     /* co-located: the rank's own target on be (ops NULL: none) */
    ddt_generator gen;            /* co-located generated data: its decoder over replica (else zeroed) */
    int64_t tokens_for;           /* the batch cursor whose tokens input_ids holds (-1: none): a
                                     retried step does not sample them again */
    const void *embed, *lm_head;  /* what the rank's step reads: its copies, its replica's, or the
                                     trainer's (ddt_head: fp32, or bf16 when head_bf16) */
    int head_bf16;
    ddt_drafter_weights w;        /* bound to the weights this rank's step reads */
    /* the rank's slice of the batch: the index arrays in host memory (batch_block: the rank's
     * allocator for a CPU rank, malloc for a GPU rank); the features in the rank's memory (in
     * batch_block too on a CPU rank, in dev_batch_block on a GPU, copied there through the
     * pinned staging block, laid out as dev_batch_block) */
    int64_t nseq, first;          /* sequences, index of the first in the global batch */
    rank_batch b;                 /* the step's */
    rank_batch ahead;             /* a split's second slot: the next step's, filled by the target
                                     ranks while the drafter trains on b (else unused) */
    float *staged_features;       /* GPU: (nseq, S, L_t*H) in staging, pinned host memory */
    float *staged_teacher;        /* GPU: (nseq, S, H) in staging, or NULL */
    size_t batch_bytes, dev_batch_bytes;
    void *batch_block, *dev_batch_block, *staging;   /* staging: dev_batch_bytes (GPU ranks) */
    /* per step */
    struct ddt_trainer *t;
    ddk_loss_result result;
    float reduced[REDUCED];       /* GPU: what this rank appends to its gradient */
    int rc;
    double seconds;
} rank_state;

struct ddt_trainer {
    ddt_run_config cfg;
    char *config_json;            /* the run's config, as given */
    char run_id[40], run_dir[2048];
    ddt_store *store;
    ddt_source *source;           /* NULL: co-located generated data (the ranks sample) */
    int generates;                /* co-located and generated: the ranks sample their sequences */
    ddt_source_config data;       /* generates: the data's rules (seed, seq_len, temperature, ...) */
    int64_t cursor;               /* generates: training sequences handed out (ddt_source_cursor's
                                     meaning), checkpointed as the source's is */
    int64_t batch_cursor;         /* generates: the cursor at the current step's first sequence */
    ddt_heldout_tokens held;      /* generates: the held-out tokens, sampled once each */
    const void *embed, *lm_head;  /* (V, H): the source's (host, fp32), or a replica's (replica_head) */
    int head_bf16;                /* they are bf16 (GPUs co-located or split, or bf16 GPU ranks:
                                     round_host_head) */
    uint16_t *head16;             /* a split's GPUs: target rank 0's bf16 head on the host, freed once
                                     every drafter GPU has its copy */
    int tied;                     /* embed_tokens is lm_head */
    int colocated;                /* every rank prefills its own sequences with its replica */
    ddt_split *split;             /* a split's target ranks (else NULL) */
    int target_ranks;             /* theirs (ddt_devices.target_ranks), known before they open */
    int ahead;                    /* a split's next batch: AHEAD_NONE, _RUNNING or _DONE (ahead_rc) */
    int ahead_rc;
    char ahead_err[600];
    ddt_split_dest *dest;         /* (sequences_per_step): where the split's batch goes */
    ddt_param table[DDT_MAX_PARAMS];
    int param_count;
    int64_t total;
    float *params;                /* (total) host: THE weights of CPU ranks, rank 0's mirror on GPUs */
    uint16_t *params16;           /* (total) CPU ranks: their bf16 copy in a bf16 step (a GPU rank
                                     has its own), on rank 0's allocator */
    ddt_adamw_state adam;         /* host moments likewise; adam.step counts for every rank */
    ddt_adamw_config adam_cfg;
    ddt_drafter_weights w;        /* bound to params */
    int64_t step, chunk, vocab_tile;
    uint64_t oom_recoveries;
    int ranks;                    /* this daemon's */
    int gpu;                      /* 1: the ranks are GPUs */
    int world, first_rank;        /* every daemon's ranks; this daemon's first global rank */
    char devices_note[256];       /* "" or what "devices" left idle (ddt_devices.note) */
    uint64_t fallbacks_at_open;   /* ddk_cuda_fallbacks when the run opened */
    int fallback_said;            /* its "kernel_fallback" event is recorded (once a run) */
    ddk_comm *comm;               /* GPU ranks, world > 1 */
    rank_state rank[MAX_RANKS];
    ddt_memory_plan plan;
    int baseline_done;            /* the step-0 evaluation of a new run (ddt_trainer_advance) */
    int64_t checkpoint_step;      /* the step of this trainer's newest checkpoint; -1: none yet */
    /* speculative decoding (eval.speculative, POST /runs/{id}/speculate): rank 0's speculator
     * over the target beside it, opened once (at open with eval.speculative, else on first use) */
    ddt_speculator *spec;
    const ddt_target_model *spec_target;   /* rank 0's replica, or the source's host target */
    int64_t spec_prompts, spec_prompt_len, spec_gen_len, spec_max_budget;   /* its caps */
};

static void event(ddt_trainer *t, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void event(ddt_trainer *t, const char *kind, const char *fmt, ...)
{
    if (!t->store)
        return;
    char detail[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    ddt_store_event(t->store, t->run_id, ddt_wall_ms(), kind, detail);
}

/* ------------------------------------------------------------------------------------------
 * Set-up
 */

static int make_dir(const char *path, char *err, size_t err_len)
{
    if (mkdir(path, 0750) && errno != EEXIST) {
        snprintf(err, err_len, "%s: cannot create the directory: %s", path, strerror(errno));
        return -errno;
    }
    return 0;
}

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
 *   - a split's GPUs: target rank 0's bf16 head brought to the host (head16), for alloc_ranks
 *     to upload to every drafter GPU, then freed. */
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
 * alloc_ranks to upload to every GPU, then freed. */
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

static int alloc_ranks(ddt_trainer *t, const ddt_devices *dev, char *err, size_t err_len)
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

/* The ranks' replicas := the host's weights and moments (after initialisation or a resume), and
 * the bf16 copies := the weights rounded (AdamW keeps them so after that). */
static void push_weights(ddt_trainer *t)
{
    const size_t bytes = (size_t)t->total * sizeof(float);
    if (t->params16)
        ddk_backend_cpu()->round_bf16(ddk_backend_cpu(), t->params, t->total, t->params16);
    for (int r = 0; t->gpu && r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        rs->be->copy(rs->be, rs->params, t->params, bytes);
        rs->be->copy(rs->be, rs->m, t->adam.m, bytes);
        rs->be->copy(rs->be, rs->v, t->adam.v, bytes);
        if (rs->params16)
            rs->be->round_bf16(rs->be, rs->params, t->total, rs->params16);
        rs->be->synchronize(rs->be);
    }
}

/* The host's weights and moments := rank 0's (before a checkpoint or an export). */
static void pull_weights(ddt_trainer *t)
{
    if (!t->gpu)
        return;
    const size_t bytes = (size_t)t->total * sizeof(float);
    rank_state *rs = &t->rank[0];
    rs->be->copy(rs->be, t->params, rs->params, bytes);
    rs->be->copy(rs->be, t->adam.m, rs->m, bytes);
    rs->be->copy(rs->be, t->adam.v, rs->v, bytes);
    rs->be->synchronize(rs->be);
}

/* The data's cursor after the steps done: the source's or the generated one's, less a split's
 * next batch taken already */
static int64_t done_cursor(const ddt_trainer *t)
{
    const int64_t cursor = t->source ? ddt_source_cursor(t->source) : t->cursor;
    return cursor - (t->ahead != AHEAD_NONE ? t->cfg.sequences_per_step : 0);
}

/* what state.json holds: where the run stands (config_json stays the trainer's) */
static ddt_checkpoint_meta checkpoint_meta(const ddt_trainer *t)
{
    ddt_checkpoint_meta m = { .step = t->step, .cursor = done_cursor(t),
                              .chunk = t->chunk,
                              .vocab_tile = t->vocab_tile, .config_json = t->config_json,
                              .drafter = t->cfg.drafter };
    snprintf(m.run_id, sizeof m.run_id, "%s", t->run_id);
    return m;
}

/* t's memory plan for budget (0: the config's): the ranks' devices, and the target where this
 * trainer runs it: co-located on the ranks, or in host memory beside them (the source's CPU
 * backend); never a proposal of something else. 0, or -EINVAL when the target's config.json
 * cannot be read again. */
static int plan(const ddt_trainer *t, int64_t budget, ddt_memory_plan *p, char *err, size_t err_len)
{
    ddt_target_footprint f;
    const int online = t->cfg.target_kind != DDT_SOURCE_SHARDS;
    int rc = online ? ddt_run_footprint(&t->cfg, &f, err, err_len) : 0;
    return rc ? rc : ddt_plan(&t->cfg, budget, t->tied, online ? &f : NULL, t->gpu, t->colocated, 0, p);
}

static int resume_from(ddt_trainer *t, const char *ckpt, char *err, size_t err_len)
{
    ddt_checkpoint_meta m;
    int rc = ddt_checkpoint_read(ckpt, &t->cfg.drafter, t->params, &t->adam, &m, err, err_len);
    if (rc)
        return rc;
    t->step = m.step;
    t->chunk = m.chunk;
    t->vocab_tile = m.vocab_tile;
    if (t->source)
        rc = ddt_source_seek(t->source, m.cursor);
    else if (m.cursor < 0)   /* generates: the ranks sample from this index on */
        rc = -EINVAL;
    else
        t->cursor = m.cursor;
    if (rc)
        snprintf(err, err_len, "the data source cannot seek to cursor %lld", (long long)m.cursor);
    ddt_checkpoint_meta_free(&m);
    return rc;
}

/* The config of a run to resume: the newest checkpoint's state.json. */
static char *resume_config(const char *run_dir, char *ckpt, size_t ckpt_len, char *err, size_t err_len)
{
    int64_t step;
    if (ddt_checkpoint_latest(run_dir, &step, ckpt, ckpt_len)) {
        snprintf(err, err_len, "%s has no complete checkpoint to resume from", run_dir);
        return NULL;
    }
    ddt_checkpoint_meta m;
    return ddt_checkpoint_read_meta(ckpt, &m, err, err_len) ? NULL : m.config_json;   /* the caller's now */
}

int ddt_trainer_open(const char *config_json, size_t len, const char *state_dir,
                     const char *run_id, int resume, ddt_store *store, ddt_trainer **out,
                     char *err, size_t err_len, char *field, size_t field_len)
{
    *field = '\0';
    char run_dir[2100], ckpt[2400];
    char *text = NULL;
    if (resume) {
        snprintf(run_dir, sizeof run_dir, "%s/runs/%s", state_dir, run_id);
        if (!(text = resume_config(run_dir, ckpt, sizeof ckpt, err, err_len)))
            return -ENOENT;
    } else if (!(text = strndup(config_json, len))) {
        snprintf(err, err_len, "no memory for a trainer");
        return -ENOMEM;
    }
    ddt_run_config c;
    ddt_devices dev;
    int rc = ddt_run_config_parse(text, strlen(text), &c, err, err_len, field, field_len);
    if (!rc) {
        /* the ranks before anything is made: a config this node cannot run fails at once */
        rc = ddt_run_config_devices(&c, ddt_node_here(), &dev, err, err_len, field, field_len);
        if (!rc)
            rc = ddt_trainer_open_parsed(&c, text, &dev, state_dir, run_id, resume, store, out, err, err_len);
        ddt_run_config_free(&c);
    }
    free(text);
    return rc;
}

static int open_speculator(ddt_trainer *t, char *err, size_t err_len);

int ddt_trainer_open_parsed(const ddt_run_config *config, const char *config_json,
                            const ddt_devices *ranks, const char *state_dir, const char *run_id,
                            int resume, ddt_store *store, ddt_trainer **out, char *err,
                            size_t err_len)
{
    ddt_trainer *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_len, "no memory for a trainer");
        return -ENOMEM;
    }
    t->store = store;
    t->checkpoint_step = -1;
    t->fallbacks_at_open = ddk_cuda_fallbacks(NULL, 0);
    /* CPU ranks are the CPU parallelism, beside the loader thread: the BLAS runs each product on
     * its caller's thread (OpenBLAS threads even tiny products, and its spinning workers cost
     * more than they give at drafter sizes). Set before the source starts its loader, whose
     * products would otherwise run on as many threads as the setting has when they start, and
     * a product's bits may depend on that: the same run would not repeat itself bit for bit. */
    ddk_cpu_set_threads(1);
    char path[2100], ckpt[2400] = "";
    const ddt_devices dev = *ranks;
    snprintf(path, sizeof path, "%s/runs", state_dir);
    int rc = make_dir(state_dir, err, err_len);
    if (!rc)
        rc = make_dir(path, err, err_len);
    if (!rc) {
        if (run_id)
            snprintf(t->run_id, sizeof t->run_id, "%s", run_id);
        else
            ddt_store_new_run_id(t->run_id, sizeof t->run_id);
        snprintf(t->run_dir, sizeof t->run_dir, "%s/runs/%s", state_dir, t->run_id);
        t->config_json = strdup(config_json);
        rc = t->config_json ? ddt_run_config_copy(&t->cfg, config) : -ENOMEM;
        if (rc)
            snprintf(err, err_len, "no memory for a trainer");
    }
    int64_t newest;
    if (!rc && resume && ddt_checkpoint_latest(t->run_dir, &newest, ckpt, sizeof ckpt)) {
        snprintf(err, err_len, "%s has no complete checkpoint to resume from", t->run_dir);
        rc = -ENOENT;
    } else if (!rc && !resume) {
        rc = make_dir(t->run_dir, err, err_len);
    }

    /* the target's shape completes the drafter; then the data */
    if (!rc) {
        ddt_run_config *c = &t->cfg;
        int64_t hidden, vocab, layers;
        int tied;
        rc = ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, err, err_len);
        if (!rc)
            rc = ddt_run_config_resolve(c, hidden, vocab, layers, err, err_len);
        ddt_source_config sc;
        ddt_run_config_source(c, &sc);
        sc.tokens_only = dev.colocated || dev.target_ranks;   /* the ranks compute the features */
        t->generates = sc.tokens_only && ddt_source_generates(&sc);   /* ... and sample the tokens */
        if (!rc && t->generates) {   /* no source: the data's rules, and the held-out tokens' room */
            rc = ddt_source_check(&sc, hidden, layers, err, err_len);
            t->data = sc;
            t->data.shards = NULL;
            if (!rc)
                rc = ddt_heldout_tokens_init(&t->held, &sc, err, err_len);
        } else if (!rc) {
            rc = ddt_source_open(&sc, hidden, &t->source, err, err_len);
        }
        if (!rc && t->source && ddt_source_vocab(t->source) != vocab) {
            snprintf(err, err_len, "the target's head has %lld rows but its vocabulary is %lld",
                     (long long)ddt_source_vocab(t->source), (long long)vocab);
            rc = -EINVAL;
        }
    }
    if (!rc) {
        t->embed = t->source ? ddt_source_embed(t->source) : NULL;   /* co-located, split: replica_head */
        t->lm_head = t->source ? ddt_source_lm_head(t->source) : NULL;
        t->param_count = ddt_drafter_param_table(&t->cfg.drafter, t->table, &t->total);
        t->gpu = dev.gpu;
        t->colocated = dev.colocated;
        t->target_ranks = dev.target_ranks;
        t->ranks = dev.ranks;
        snprintf(t->devices_note, sizeof t->devices_note, "%s", dev.note);
    }
    if (!rc) {
        const ddt_run_config *c = &t->cfg;
        t->cfg.ranks = t->ranks;   /* resolved ("all": the GPUs used): the plan's figures per rank */
        t->world = c->cluster_world ? (int)c->cluster_world : t->ranks;
        t->first_rank = (int)c->cluster_first;
        /* the weights of CPU ranks count on rank 0's device; a GPU run's host mirror on the host's */
        ddk_allocator *a0 = t->gpu ? ddk_allocator_cpu() : ddk_allocator_cpu_rank(0);
        size_t bytes = (size_t)t->total * sizeof(float);
        t->params = ddk_malloc(a0, bytes);
        t->adam.m = ddk_malloc(a0, bytes);
        t->adam.v = ddk_malloc(a0, bytes);
        if (!t->params || !t->adam.m || !t->adam.v) {
            snprintf(err, err_len, "no memory for the drafter's %lld parameters and their optimiser state "
                     "(%.3f GB); see `ddtreed plan`", (long long)t->total, 3.0 * bytes / 1e9);
            rc = -ENOMEM;
        }
    }
    if (!rc)
        rc = alloc_ranks(t, &dev, err, err_len);
    if (!rc && t->gpu && t->world > 1) {
        int32_t devices[MAX_RANKS];
        for (int r = 0; r < t->ranks; r++)
            devices[r] = t->rank[r].gpu;
        rc = ddk_comm_init(*t->cfg.cluster_id ? t->cfg.cluster_id : NULL, t->world, t->first_rank, t->ranks,
                           devices, &t->comm, err, err_len);
    }
    if (!rc) {
        ddt_drafter_bind(&t->cfg.drafter, t->params, &t->w);
        t->chunk = t->cfg.chunk;
        t->vocab_tile = t->cfg.vocab_tile;
        if (*ckpt) {
            rc = resume_from(t, ckpt, err, err_len);
        } else {
            ddt_drafter_init(&t->cfg.drafter, t->params, ddt_batch_seed(t->cfg.seed, 0, 0, SEED_INIT));
            memset(t->adam.m, 0, (size_t)t->total * sizeof(float));
            memset(t->adam.v, 0, (size_t)t->total * sizeof(float));
        }
        push_weights(t);
        const ddt_run_config *c = &t->cfg;
        t->adam_cfg = (ddt_adamw_config){ .lr = c->lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8,
                                          .weight_decay = c->weight_decay, .grad_clip = c->grad_clip,
                                          .warmup_steps = (int64_t)llround(c->warmup_fraction * c->steps),
                                          .total_steps = c->steps };
        if (!rc)
            rc = plan(t, 0, &t->plan, err, err_len);
    }
    if (!rc && t->cfg.spec)
        rc = open_speculator(t, err, err_len);
    if (!rc && store && !resume) {
        rc = ddt_store_run_create(store, t->run_id, t->cfg.name, t->config_json, t->cfg.steps, ddt_wall_ms());
        rc = rc == -EEXIST ? 0 : rc;   /* the daemon creates the row when it queues the run */
    }
    if (!rc && *t->devices_note) {   /* once the run's row exists; again at each resume */
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "message", t->devices_note);
        cJSON_AddNumberToObject(o, "ranks", t->ranks);
        char *detail = cJSON_PrintUnformatted(o);
        if (detail)
            event(t, "devices", "%s", detail);
        free(detail);
        cJSON_Delete(o);
    }
    if (rc) {
        if (!resume)
            rmdir(t->run_dir);   /* the new run's directory, when nothing was written in it */
        ddt_trainer_close(t);
        return rc;
    }
    *out = t;   /* the caller (ddtreed train, the run manager) records the run's states */
    return 0;
}

void ddt_trainer_close(ddt_trainer *t)
{
    if (!t)
        return;
    ddt_speculator_close(t->spec);   /* before rank 0's replica, whose cache it holds */
    size_t bytes = (size_t)t->total * sizeof(float);
    ddk_comm_destroy(t->comm);
    ddt_split_close(t->split);   /* waits for a batch in flight into the ranks' buffers */
    free(t->dest);
    for (int r = 0; r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        if (!rs->be)
            continue;
        ddk_allocator *a = rs->be->alloc;
        rs->be->synchronize(rs->be);   /* nothing queued may still use what is freed */
        ddk_free(a, rs->grads, bytes + (t->gpu ? REDUCED * sizeof(float) : 0));
        ddk_free(a, rs->micro_grads, bytes);
        if (t->gpu) {
            free(rs->batch_block);
            ddk_host_free_pinned(rs->staging);   /* after the synchronize above: no copy reads it */
            ddk_free(a, rs->dev_batch_block, rs->dev_batch_bytes);
            ddk_free(a, rs->params, bytes);
            ddk_free(a, rs->params16, (size_t)t->total * sizeof(uint16_t));
            ddk_free(a, rs->m, bytes);
            ddk_free(a, rs->v, bytes);
            ddk_free(a, rs->own_lm_head, rs->head_bytes);
            ddk_free(a, rs->own_embed, rs->head_bytes);
        } else {
            ddk_free(a, rs->batch_block, rs->batch_bytes);
        }
        ddt_generator_free(&rs->gen);      /* before its target; a zeroed one (none) is a no-op */
        ddt_target_close(&rs->replica);   /* a zeroed one (none) is a no-op */
        ddk_allocator_set_budget(a, 0);
    }
    ddk_allocator *a0 = t->gpu ? ddk_allocator_cpu() : ddk_allocator_cpu_rank(0);
    ddk_free(a0, t->params, bytes);
    ddk_free(a0, t->params16, (size_t)t->total * sizeof(uint16_t));
    ddk_free(a0, t->adam.m, bytes);
    ddk_free(a0, t->adam.v, bytes);
    free(t->head16);
    ddt_heldout_tokens_free(&t->held);
    if (t->source)
        ddt_source_close(t->source);
    ddt_run_config_free(&t->cfg);
    free(t->config_json);
    free(t);
}

const char *ddt_trainer_run_id(const ddt_trainer *t) { return t->run_id; }
const char *ddt_trainer_run_dir(const ddt_trainer *t) { return t->run_dir; }
const ddt_run_config *ddt_trainer_config(const ddt_trainer *t) { return &t->cfg; }
int64_t ddt_trainer_step_count(const ddt_trainer *t) { return t->step; }
const ddt_memory_plan *ddt_trainer_plan(const ddt_trainer *t) { return &t->plan; }
const char *ddt_trainer_devices_note(const ddt_trainer *t) { return t->devices_note; }
uint64_t ddt_trainer_oom_recoveries(const ddt_trainer *t) { return t->oom_recoveries; }
int64_t ddt_trainer_checkpoint_step(const ddt_trainer *t) { return t->checkpoint_step; }

/* ------------------------------------------------------------------------------------------
 * A step
 */

/* Co-located: generated data's tokens first, sampled by the rank's generator (sequence i of the
 * slice is the step's global sequence first + i: index batch_cursor + first + i, what the
 * source would have given that slot); then the rank's sequences through its replica, their taps
 * and final hidden states straight into its batch buffers, then their noise, as load_batch adds
 * it on the host path (the same op and seed: the same bits). Run again on a retried step: the
 * tokens are kept (tokens_for), the prefill rewrites the features, the noise is drawn again
 * from the same seed. */
static int prefill_slice(rank_state *rs)
{
    const ddt_trainer *t = rs->t;
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const ddk_backend *be = rs->be;
    if (t->generates && rs->tokens_for != t->batch_cursor) {
        rs->tokens_for = -1;
        char err[256];   /* the generator's errors are its errno (a bad length: a programming error) */
        for (int64_t i = 0; i < rs->nseq; i++) {
            int rc = ddt_source_generate(&t->data, &rs->gen, 0, t->batch_cursor + rs->first + i,
                                         rs->b.input_ids + i * S, NULL, err, sizeof err);
            if (rc)
                return rc;
        }
        rs->tokens_for = t->batch_cursor;
    }
    for (int64_t i = 0; i < rs->nseq; i++) {
        float *features = rs->b.features + i * S * LH;
        int rc = ddt_target_prefill(be, &rs->replica, rs->b.input_ids + i * S, S, c->drafter.target_layer_ids,
                                    (int)c->drafter.taps, features, rs->b.teacher ? rs->b.teacher + i * S * H : NULL,
                                    NULL);
        if (rc)
            return rc;
        be->uniform_noise(be, features, S * LH, c->noise_std,
                          ddt_batch_seed(c->seed, t->step, rs->first + i, SEED_NOISE));
    }
    return 0;
}

/* The rank's slice in micro-batches of at most ceil(nseq / grad_accum) sequences: each one's
 * gradient (of its own normalised loss) is weighted by its weight sum into the rank's, which
 * then is the gradient of the rank's normalised loss, as if the slice had run at once.
 * Co-located, the rank first computes its slice's features (prefill_slice). */
static void *rank_main(void *arg)
{
    rank_state *rs = arg;
    ddt_trainer *t = rs->t;
    const ddt_run_config *c = &t->cfg;
    const int64_t S = c->seq_len, A = c->max_anchors, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const int64_t micro = (rs->nseq + c->grad_accum - 1) / c->grad_accum;
    double t0 = ddt_mono_s();
    const int accumulate = micro < rs->nseq;   /* then micro_grads exists (alloc_ranks) */
    float *target = accumulate ? rs->micro_grads : rs->grads;
    ddt_drafter_weights *g = &rs->step_grads;
    const ddk_backend *be = rs->be;
    const size_t gbytes = (size_t)t->total * sizeof(float);
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    const float *features = rs->b.features, *teacher = rs->b.teacher;
    be->zero(be, rs->grads, gbytes);
    ddt_loss_config lc = { .gamma = c->gamma, .ce_target_teacher = c->ce_target_teacher,
                           .loss = { .chunk = t->chunk, .vocab_tile = t->vocab_tile,
                                     .kl_weight = c->kl_weight, .kl_temperature = c->kl_temperature,
                                     .cap_weight = c->cap_weight, .cap_temperature = c->cap_temperature,
                                     .bf16_products = c->bf16 } };
    ddk_loss_result sum = { 0 };
    double sum_loss = 0, sum_ce = 0, sum_kl = 0, sum_cap = 0;
    rs->rc = t->colocated ? prefill_slice(rs) : 0;
    for (int64_t first = 0; first < rs->nseq && rs->rc == 0; first += micro) {
        const int64_t n = rs->nseq - first < micro ? rs->nseq - first : micro;
        ddt_batch b = { n, S, A, rs->b.input_ids + first * S, rs->b.loss_mask + first * S,
                        features + first * S * LH, teacher ? teacher + first * S * H : NULL,
                        rs->b.anchors + first * A, rs->b.keep + first * A };
        ddk_loss_result r = { 0 };
        if (accumulate)
            be->zero(be, target, gbytes);
        rs->rc = ddt_drafter_step(be, &c->drafter, &rs->w, g, &head, &b, &lc, &r);
        if (accumulate && rs->rc == 0 && r.weight_sum > 0)
            be->axpby(be, t->total, (float)r.weight_sum, target, 1.0f, rs->grads);
        sum.weight_sum += r.weight_sum;
        sum.counted += r.counted;
        sum.correct += r.correct;
        sum_loss += r.weight_sum * r.loss;
        sum_ce += r.weight_sum * r.ce;
        sum_kl += r.weight_sum * r.kl;
        sum_cap += r.weight_sum * r.cap;
    }
    if (sum.weight_sum > 0) {
        sum.loss = sum_loss / sum.weight_sum;
        sum.ce = sum_ce / sum.weight_sum;
        sum.kl = sum_kl / sum.weight_sum;
        sum.cap = sum_cap / sum.weight_sum;
        if (accumulate)
            be->axpby(be, t->total, (float)(1.0 / sum.weight_sum), rs->grads, 0.0f, rs->grads);
    }
    be->synchronize(be);   /* the rank's time is its GPU's */
    rs->result = sum;
    rs->seconds = ddt_mono_s() - t0;
    return NULL;
}

/* ------------------------------------------------------------------------------------------
 * A split: the target ranks fill the drafter ranks' second slots (ahead) with the next step's
 * batch while the drafter trains on the first (b); the slots swap at the next step. The batch of
 * step k is the host path's (load_batch): sequence gi from cursor + gi, its anchors and noise
 * from (seed, k, gi), so a split run on CPU ranks repeats a host-target run bit for bit. The
 * data taken ahead is not the steps' yet: checkpoints record the cursor without it
 * (done_cursor), and a batch dropped gives it back (split_rewind).
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

/* The batch in flight waited for: its answer in ahead_rc / ahead_err */
static void split_settle(ddt_trainer *t)
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
    split_settle(t);
    const int64_t cursor = done_cursor(t);
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
    const int64_t next = done_cursor(t);
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
 * done. A slot is rewritten only by the next step's load_batch, and by then every copy queued
 * from it is done: each rank_main ends with the rank's synchronize, after the step's ops on the
 * same stream, which come after these copies (then the all-reduce, which also waits). The
 * synchronize at the top makes that explicit and covers a step that never reached rank_main
 * (a source error halfway through the batch, a failed thread start); with nothing queued it
 * returns at once. CPU ranks copy before their copy returns: nothing changes for them.
 * Co-located, the source gives tokens only: the ranks compute the features (rank_main); for
 * generated data there is no source: the cursor advances by the step's sequences and the ranks
 * sample their own (prefill_slice). */
static int load_batch(ddt_trainer *t, char *err, size_t err_len)
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

static int run_ranks(ddt_trainer *t)
{
    pthread_t threads[MAX_RANKS];
    for (int r = 1; r < t->ranks; r++)
        if (pthread_create(&threads[r], NULL, rank_main, &t->rank[r]))
            t->rank[r].rc = -EAGAIN;
    rank_main(&t->rank[0]);
    int rc = t->rank[0].rc;
    for (int r = 1; r < t->ranks; r++) {
        pthread_join(threads[r], NULL);
        if (t->rank[r].rc && !rc)
            rc = t->rank[r].rc;
    }
    return rc;
}

/* A smaller loss configuration after an out-of-memory step: 0, or -ENOMEM at the floor. */
static int shrink(ddt_trainer *t)
{
    const int64_t positions = t->plan.positions;
    int64_t chunk = t->chunk < positions ? t->chunk : positions;
    if (chunk > CHUNK_FLOOR) {
        t->chunk = chunk / 2;
        return 0;
    }
    if (t->vocab_tile == 0 || t->vocab_tile > TILE_FLOOR) {
        t->vocab_tile = t->vocab_tile ? t->vocab_tile / 2 : 8192;
        t->chunk = t->cfg.chunk;   /* a tile makes the workspace small: start large again */
        return 0;
    }
    return -ENOMEM;
}

/* The gradient of the globally normalised loss into every rank's grads (CPU ranks: rank 0's
 * only), and the step's figures (weighted means over every rank of the run) into *sums. */
static int reduce_gradients(ddt_trainer *t, ddk_loss_result *sums, char *err, size_t err_len)
{
    memset(sums, 0, sizeof *sums);
    if (t->gpu && t->world > 1) {   /* NCCL: sum of weight-scaled gradients and the figures */
        float *bufs[MAX_RANKS];
        for (int r = 0; r < t->ranks; r++) {
            rank_state *rs = &t->rank[r];
            const ddk_loss_result *res = &rs->result;
            const double w = res->weight_sum;
            const float x[REDUCED] = { [R_WEIGHT] = (float)w, [R_LOSS] = (float)(w * res->loss),
                                       [R_CE] = (float)(w * res->ce), [R_KL] = (float)(w * res->kl),
                                       [R_CAP] = (float)(w * res->cap), [R_COUNTED] = (float)res->counted,
                                       [R_CORRECT] = (float)res->correct };
            memcpy(rs->reduced, x, sizeof x);
            rs->be->axpby(rs->be, t->total, (float)w, rs->grads, 0.0f, rs->grads);
            rs->be->copy(rs->be, rs->grads + t->total, rs->reduced, sizeof rs->reduced);
            bufs[r] = rs->grads;
        }
        int rc = ddk_comm_allreduce_sum(t->comm, bufs, t->total + REDUCED, err, err_len);
        if (rc) {
            event(t, "error", "{\"step\": %lld, \"message\": \"the gradient all-reduce failed\"}",
                  (long long)t->step + 1);
            return rc;
        }
        float total[REDUCED];
        const ddk_backend *be0 = t->rank[0].be;
        be0->copy(be0, total, t->rank[0].grads + t->total, sizeof total);
        be0->synchronize(be0);
        const double w = total[R_WEIGHT];
        for (int r = 0; r < t->ranks && w > 0; r++)
            t->rank[r].be->axpby(t->rank[r].be, t->total, (float)(1.0 / w), t->rank[r].grads, 0.0f,
                                 t->rank[r].grads);
        *sums = (ddk_loss_result){ .weight_sum = w, .counted = (int64_t)total[R_COUNTED],
                                   .correct = (int64_t)total[R_CORRECT] };
        if (w > 0) {
            sums->loss = total[R_LOSS] / w;
            sums->ce = total[R_CE] / w;
            sums->kl = total[R_KL] / w;
            sums->cap = total[R_CAP] / w;
        }
        return 0;
    }
    /* CPU ranks (or one GPU): rank 0's grads := sum over ranks of share_r * grads_r */
    for (int r = 0; r < t->ranks; r++)
        sums->weight_sum += t->rank[r].result.weight_sum;
    const ddk_backend *be0 = t->rank[0].be;
    float *g0 = t->rank[0].grads;
    for (int r = 0; r < t->ranks; r++) {
        const ddk_loss_result *res = &t->rank[r].result;
        double share = sums->weight_sum > 0 ? res->weight_sum / sums->weight_sum : 0.0;
        sums->loss += share * res->loss;
        sums->ce += share * res->ce;
        sums->kl += share * res->kl;
        sums->cap += share * res->cap;
        sums->counted += res->counted;
        sums->correct += res->correct;
        if (t->ranks > 1)
            be0->axpby(be0, t->total, (float)share, t->rank[r].grads, r == 0 ? 0.0f : 1.0f, g0);
    }
    return 0;
}

/* AdamW on the weights: the trainer's (CPU ranks) or every GPU rank's replica, from the same
 * reduced gradient. Returns the gradient's norm; when it is not finite nothing was changed. */
static double update_weights(ddt_trainer *t, double *lr)
{
    if (!t->gpu)
        return ddt_adamw_update(t->rank[0].be, &t->adam_cfg, t->table, t->param_count, t->params,
                                t->params16, t->rank[0].grads, &t->adam, lr);
    double norm = 0;
    for (int r = 0; r < t->ranks; r++) {
        rank_state *rs = &t->rank[r];
        ddt_adamw_state replica = { t->adam.step, rs->m, rs->v };
        norm = ddt_adamw_update(rs->be, &t->adam_cfg, t->table, t->param_count, rs->params,
                                rs->params16, rs->grads, &replica, lr);
        if (!isfinite(norm))   /* the ranks' reduced gradients are the same bits: rank 0 already */
            return norm;       /* refused, and none was changed */
    }
    t->adam.step++;
    return norm;
}

int ddt_trainer_step(ddt_trainer *t, ddt_step_record *rec, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    double t0 = ddt_mono_s();
    if (t->split)   /* their figures: this step's batch, or the wait for it, and the next one's */
        ddt_split_reset_peaks(t->split);
    int rc = load_batch(t, err, err_len);
    for (char note[2048]; t->source && ddt_source_next_note(t->source, note, sizeof note);)   /* chat lines skipped */
        if (t->store)
            ddt_store_event(t->store, t->run_id, ddt_wall_ms(), "data_skipped", note);
    if (rc)
        return rc;
    for (int r = 0; r < t->ranks; r++)
        ddk_allocator_reset_peak(t->rank[r].be->alloc);
    for (;;) {
        rc = run_ranks(t);
        if (rc != -ENOMEM)
            break;
        int64_t old_chunk = t->chunk, old_tile = t->vocab_tile;
        if (!c->auto_rechunk || shrink(t)) {
            ddt_memory_plan fit = { 0 };
            plan(t, c->budget_bytes, &fit, err, err_len);
            snprintf(err, err_len, "step %lld ran out of memory at chunk %lld, vocab_tile %lld%s; "
                     "the plan for this config needs %.3f GB per device%s", (long long)t->step + 1,
                     (long long)old_chunk, (long long)old_tile,
                     c->auto_rechunk ? " (the floor of the automatic re-chunking)" : " and auto_rechunk is off",
                     fit.peak / 1e9, fit.fits ? "" : ": raise memory.budget_bytes or shrink the batch");
            event(t, "error", "{\"message\": \"out of memory at the floor\", \"chunk\": %lld, \"vocab_tile\": %lld}",
                  (long long)old_chunk, (long long)old_tile);
            return -ENOMEM;
        }
        t->oom_recoveries++;
        event(t, "oom_recovery", "{\"step\": %lld, \"from\": {\"chunk\": %lld, \"vocab_tile\": %lld}, "
              "\"to\": {\"chunk\": %lld, \"vocab_tile\": %lld}}", (long long)t->step + 1,
              (long long)old_chunk, (long long)old_tile, (long long)t->chunk, (long long)t->vocab_tile);
    }
    if (rc) {
        snprintf(err, err_len, "step %lld failed: %s", (long long)t->step + 1, strerror(-rc));
        return rc;
    }

    ddk_loss_result sums;
    if ((rc = reduce_gradients(t, &sums, err, err_len)))
        return rc;
    double lr = 0, norm = update_weights(t, &lr);
    if (!isfinite(norm)) {   /* an update now would ruin the weights and the moments */
        snprintf(err, err_len, "step %lld: the gradient is not finite (norm %g, loss %g): lower train.lr "
                 "or check the data; the weights were left as they were", (long long)t->step + 1, norm, sums.loss);
        event(t, "error", "{\"step\": %lld, \"message\": \"gradient not finite\"}", (long long)t->step + 1);
        return -ERANGE;
    }
    t->step++;
    const double loss = sums.loss, ce = sums.ce, kl = sums.kl, cap = sums.cap;
    const int64_t counted = sums.counted, correct = sums.correct;

    double seconds = ddt_mono_s() - t0;
    memset(rec, 0, sizeof *rec);
    snprintf(rec->run_id, sizeof rec->run_id, "%s", t->run_id);
    rec->step = t->step;
    rec->ts_ms = ddt_wall_ms();
    rec->loss = loss;
    rec->ce = ce;
    rec->kl = kl;
    rec->cap = cap;
    rec->acc = counted ? (double)correct / (double)counted : 0.0;
    rec->lr = lr;
    rec->grad_norm = norm;
    rec->tokens = c->sequences_per_step * c->seq_len;
    rec->positions = c->sequences_per_step * c->max_anchors * c->drafter.block_size;
    rec->step_ms = seconds * 1e3;
    rec->tokens_per_s = rec->tokens / seconds;
    rec->positions_per_s = rec->positions / seconds;
    rec->chunk = t->chunk;
    rec->vocab_tile = t->vocab_tile;
    rec->devices = t->ranks < DDT_STORE_MAX_DEVICES ? t->ranks : DDT_STORE_MAX_DEVICES;
    for (int r = 0; r < rec->devices; r++) {
        int64_t peak = (int64_t)ddk_allocator_stats(t->rank[r].be->alloc).peak;
        rec->device_peak_bytes[r] = peak;
        rec->device_step_ms[r] = t->rank[r].seconds * 1e3;
        if (peak > rec->peak_bytes)
            rec->peak_bytes = peak;
    }
    if (t->store)
        ddt_store_step(t->store, rec);
    return 0;
}

int ddt_trainer_rechunk(ddt_trainer *t, int64_t chunk, int64_t vocab_tile, char *err, size_t err_len)
{
    if (chunk == 0 || vocab_tile < -1) {
        snprintf(err, err_len, "chunk must be >= 1 and vocab_tile >= 0");
        return -EINVAL;
    }
    int64_t old_chunk = t->chunk, old_tile = t->vocab_tile;
    if (chunk > 0)
        t->chunk = chunk;
    if (vocab_tile >= 0)
        t->vocab_tile = vocab_tile;
    event(t, "rechunk", "{\"applies_from_step\": %lld, \"from\": {\"chunk\": %lld, \"vocab_tile\": %lld}, "
          "\"to\": {\"chunk\": %lld, \"vocab_tile\": %lld}}", (long long)t->step + 1, (long long)old_chunk,
          (long long)old_tile, (long long)t->chunk, (long long)t->vocab_tile);
    return 0;
}

int ddt_trainer_checkpoint(ddt_trainer *t, char *err, size_t err_len)
{
    pull_weights(t);
    const ddt_checkpoint_meta meta = checkpoint_meta(t);
    char path[2400];
    int64_t bytes = 0;
    int rc = ddt_checkpoint_write(t->run_dir, &meta, t->params, &t->adam, (int)t->cfg.checkpoint_keep, path,
                                  sizeof path, &bytes, err, err_len);
    if (rc == 0)
        t->checkpoint_step = t->step;
    if (rc == 0 && t->store) {
        ddt_store_checkpoint(t->store, t->run_id, t->step, path, bytes, ddt_wall_ms());
        event(t, "checkpoint", "{\"step\": %lld, \"bytes\": %lld}", (long long)t->step, (long long)bytes);
        ddt_store_run_checkpointed(t->store, t->run_id, t->step, ddt_wall_ms());   /* its state is the run's owner's */
    }
    return rc;
}

int ddt_trainer_export(ddt_trainer *t, const char *out_dir, char *err, size_t err_len)
{
    pull_weights(t);
    int rc = ddt_export_write(out_dir, &t->cfg.drafter, t->params, err, err_len);
    if (rc == 0)
        event(t, "export", "{\"step\": %lld, \"written\": true}", (long long)t->step);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The cadence (trainer.h): what falls due at a step boundary
 */

/* an event of kind {"step", ["prompt",] "message"} (prompt < 0: none; the message may be long:
 * cJSON escapes it, no fixed buffer cuts it) */
static void store_message(ddt_trainer *t, const char *kind, int64_t step, int64_t prompt,
                          const char *message)
{
    cJSON *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "step", (double)step);
    if (prompt >= 0)
        cJSON_AddNumberToObject(d, "prompt", (double)prompt);
    cJSON_AddStringToObject(d, "message", message);
    char *detail = cJSON_PrintUnformatted(d);
    if (detail)
        ddt_store_event(t->store, t->run_id, ddt_wall_ms(), kind, detail);
    free(detail);
    cJSON_Delete(d);
}

/* attention that ran the SIMT kernels for want of a tensor-core instance on a GPU
 * (ddk_cuda_fallbacks): said once a run, a log line and a "kernel_fallback" event */
static void say_fallback(ddt_trainer *t)
{
    char what[320];
    if (t->fallback_said || ddk_cuda_fallbacks(what, sizeof what) == t->fallbacks_at_open)
        return;
    t->fallback_said = 1;
    ddt_log(DDT_LOG_WARNING, "run %s, step %lld: %s", t->run_id, (long long)t->step, what);
    if (t->store)
        store_message(t, "kernel_fallback", t->step, -1, what);
}

/* A due evaluation, checkpoint or export that failed: an "error" event and, when o, the
 * outcome's warning. */
static void error_event(ddt_trainer *t, ddt_trainer_outcome *o, const char *what, const char *why)
{
    if (o)
        snprintf(o->warning, sizeof o->warning, "%s at step %lld failed: %.900s", what, (long long)t->step, why);
    if (!t->store)
        return;
    char message[1100];
    snprintf(message, sizeof message, "%s failed: %.1000s", what, why);
    store_message(t, "error", t->step, -1, message);
}

int ddt_trainer_advance(ddt_trainer *t, ddt_trainer_outcome *o, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    char why[1024];
    o->done = o->stepped = o->evaluated = o->checkpointed = o->speculated = 0;
    o->warning[0] = '\0';
    if (t->step >= c->steps) {
        o->done = 1;
        return 0;
    }
    int baseline = t->step == 0 && !t->baseline_done;
    if (!baseline) {
        int rc = ddt_trainer_step(t, &o->rec, err, err_len);
        if (rc)
            return rc;
        o->stepped = 1;
        say_fallback(t);
    }
    t->baseline_done = 1;
    if (baseline || t->step % c->eval_every == 0 || t->step == c->steps) {
        if (ddt_trainer_eval(t, &o->acceptance, why, sizeof why) == 0)
            o->evaluated = 1;
        else
            error_event(t, o, "the evaluation", why);
        /* the k-th evaluation (k = ceil(step / every_steps): 0 the baseline, the same k after a
         * resume) speculates on every E-th */
        const int64_t k = (t->step + c->eval_every - 1) / c->eval_every;
        if (c->spec && k % c->spec_every_evals == 0) {
            const ddt_trainer_spec_request q = { .step = -1, .n_budgets = -1 };
            if (ddt_trainer_speculate(t, &q, &o->spec, why, sizeof why) == 0)
                o->speculated = 1;
            else
                error_event(t, o, "the speculative evaluation", why);
        }
    }
    if (!baseline && t->step % c->checkpoint_every == 0 && t->step < c->steps) {
        if (ddt_trainer_checkpoint(t, why, sizeof why) == 0)
            o->checkpointed = 1;
        else
            error_event(t, o, "the checkpoint", why);
    }
    return 0;
}

int ddt_trainer_hold(ddt_trainer *t, char *err, size_t err_len)
{
    int rc = t->checkpoint_step == t->step ? 0 : ddt_trainer_checkpoint(t, err, err_len);
    if (rc)
        error_event(t, NULL, "the checkpoint", err);
    return rc;
}

int ddt_trainer_finish(ddt_trainer *t, char *err, size_t err_len)
{
    char dir[2200], why[1024];
    int rc = ddt_trainer_hold(t, err, err_len);
    snprintf(dir, sizeof dir, "%s/export", t->run_dir);
    int exported = ddt_trainer_export(t, dir, why, sizeof why);
    if (exported) {
        error_event(t, NULL, "the export", why);
        if (!rc)
            snprintf(err, err_len, "%s", why);
    }
    return rc ? rc : exported;
}

/* ------------------------------------------------------------------------------------------
 * Acceptance on held-out sequences
 */

/* logits (rows, V) = x (rows, H) lm_head^T, fp32 or on the bf16 head as it is stored */
static void head_logits(const ddk_backend *be, const ddt_head *head, int64_t rows, int64_t V, int64_t H,
                        const float *x, float *logits)
{
    if (head->bf16)
        be->matmul_w16(be, rows, V, H, 1.0f, x, H, head->lm_head, H, 0.0f, logits, V);
    else
        be->matmul(be, 0, 1, rows, V, H, 1.0f, x, H, head->lm_head, H, 0.0f, logits, V);
}

int ddt_trainer_eval(ddt_trainer *t, ddt_acceptance *acc, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    const ddt_drafter_config *d = &c->drafter;
    /* eval.blocks_per_sequence anchors per sequence: at the seed's shape (1024 x 24 slots, V
     * 248,320) every block costs two (B, V) logit products read back to the host */
    const int64_t S = c->seq_len, A = c->max_anchors < c->eval_blocks ? c->max_anchors : c->eval_blocks,
                  B = d->block_size, H = d->hidden, V = d->vocab, LH = d->taps * H;
    rank_state *rs = &t->rank[0];   /* rank 0 evaluates, on its device */
    if (t->split)
        split_settle(t);   /* target rank 0 is free: the next step's batch waits in ahead */
    const ddk_backend *be = rs->be;
    const ddt_head head = { rs->embed, rs->lm_head, rs->head_bf16 };
    ddt_acceptance_init(acc, c->tree_budgets, c->n_budgets);
    int64_t n = c->eval_sequences < c->heldout ? c->eval_sequences : c->heldout;
    size_t hs_bytes = (size_t)(A * B * H) * sizeof(float), logit_bytes = (size_t)(B * V) * sizeof(float);
    float *hs = ddk_malloc(be->alloc, hs_bytes);               /* (A*B, H) */
    float *logits_dev = ddk_malloc(be->alloc, logit_bytes);    /* (B, V) */
    float *logits = malloc(logit_bytes);                        /* (B, V) host */
    int32_t *greedy_dev = ddk_malloc(be->alloc, DDT_MAX_SLOTS * sizeof(int32_t));   /* (B - 1) */
    int32_t *anchors = malloc((size_t)A * sizeof(int32_t)), labels[DDT_MAX_SLOTS], greedy[DDT_MAX_SLOTS];
    uint8_t *keep = malloc((size_t)A);
    int rc = hs && logits_dev && logits && greedy_dev && anchors && keep ? 0 : -ENOMEM;
    if (rc)
        snprintf(err, err_len, "no memory for the acceptance evaluation");
    for (int64_t i = 0; i < n && rc == 0; i++) {
        ddt_sequence q;
        if (t->generates) {   /* rank 0's generator samples held-out i once, as the source would */
            int32_t *tokens;
            ddt_generator *gen = t->split ? ddt_split_generator(t->split) : &rs->gen;   /* target rank 0's */
            if ((rc = ddt_heldout_tokens_get(&t->held, &t->data, gen, i, &tokens, err, err_len)))
                break;
            memset(rs->b.loss_mask, 1, (size_t)S);   /* free between steps, as its features are */
            q = (ddt_sequence){ .S = S, .input_ids = tokens, .loss_mask = rs->b.loss_mask };
        } else if ((rc = ddt_source_heldout(t->source, i, &q, err, err_len))) {
            break;
        }
        ddt_sample_anchors(q.loss_mask, S, A, ddt_batch_seed(c->seed, 0, i, SEED_EVAL), anchors, keep);
        /* the held-out hidden states in rank 0's memory: its batch buffers are free between steps
         * (co-located: its replica computes them there) */
        const float *features = q.features, *th = q.teacher_hidden;
        if (t->colocated) {
            if ((rc = ddt_target_prefill(be, &rs->replica, q.input_ids, q.S < S ? q.S : S, c->drafter.target_layer_ids,
                                         (int)d->taps, rs->b.features, rs->b.teacher, NULL))) {
                snprintf(err, err_len, "the evaluation's target forward (rank 0's replica) failed: %s", strerror(-rc));
                break;
            }
            features = rs->b.features;
            th = rs->b.teacher;
        } else if (t->split) {   /* target rank 0 hands them to rank 0, as a step's */
            ddt_split_dest dest = { .drafter = 0, .tokens = q.input_ids, .features = rs->b.features,
                                    .teacher = rs->b.teacher };
            ddt_split_start(t->split, &dest, 1);
            if ((rc = ddt_split_wait(t->split, err, err_len)))
                break;
            features = rs->b.features;
            th = rs->b.teacher;
        } else if (rs->gpu >= 0) {
            be->copy(be, rs->b.features, q.features, (size_t)(S * LH) * sizeof(float));
            if (th && rs->b.teacher)
                be->copy(be, rs->b.teacher, th, (size_t)(S * H) * sizeof(float));
            features = rs->b.features;
            th = th ? rs->b.teacher : NULL;
        }
        ddt_batch b = { 1, S, A, q.input_ids, q.loss_mask, features, NULL, anchors, keep };
        if ((rc = ddt_drafter_forward(be, d, &rs->w, &head, &b, hs))) {
            snprintf(err, err_len, "the evaluation's forward failed: %s", strerror(-rc));
            break;
        }
        const int teacher_labels = c->ce_target_teacher && th;
        const int64_t slots = B < DDT_MAX_SLOTS ? B : DDT_MAX_SLOTS;
        for (int64_t j = 0; j < A && keep[j]; j++) {
            /* labels as training has them: the teacher's argmax (what greedy verification by
             * the target accepts), or the data's next token. Slot k >= 1 is taught by
             * th[a_j + k - 1]: rows a_j .. a_j + rows - 1, one product per block. */
            const int64_t rows = S - anchors[j] < slots - 1 ? S - anchors[j] : slots - 1;
            if (teacher_labels && rows > 0) {
                head_logits(be, &head, rows, V, H, th + anchors[j] * H, logits_dev);
                be->argmax_rows(be, logits_dev, rows, V, greedy_dev);   /* only the indices come back */
                be->copy(be, greedy, greedy_dev, (size_t)rows * sizeof(int32_t));
                be->synchronize(be);
            }
            for (int64_t k = 0; k < slots; k++) {
                int64_t p = anchors[j] + k;
                labels[k] = k >= 1 && p < S && q.loss_mask[p] ? q.input_ids[p] : -1;
                if (teacher_labels && labels[k] >= 0)
                    labels[k] = greedy[k - 1];
            }
            head_logits(be, &head, B, V, H, hs + j * B * H, logits_dev);
            be->copy(be, logits, logits_dev, logit_bytes);
            be->synchronize(be);
            ddt_acceptance_add_block(acc, logits, B, V, labels);
        }
    }
    ddk_free(be->alloc, hs, hs_bytes);
    ddk_free(be->alloc, logits_dev, logit_bytes);
    ddk_free(be->alloc, greedy_dev, DDT_MAX_SLOTS * sizeof(int32_t));
    free(logits);
    free(anchors);
    free(keep);
    if (rc == 0 && t->store) {
        char tree[512] = "{", accj[2048] = "{";
        size_t used = 1;
        for (int i = 0; i < acc->n_budgets; i++)
            used += (size_t)snprintf(tree + used, sizeof tree - used, "%s\"%lld\": %.6f", i ? ", " : "",
                                     (long long)acc->budgets[i], ddt_acceptance_tau_tree(acc, i));
        snprintf(tree + used, sizeof tree - used, "}");
        used = 1;
        for (int64_t k = 1; k < B && k < DDT_MAX_SLOTS && used < sizeof accj - 40; k++)
            used += (size_t)snprintf(accj + used, sizeof accj - used, "%s\"%lld\": %.6f", k > 1 ? ", " : "",
                                     (long long)k, ddt_acceptance_acc(acc, k));
        snprintf(accj + used, sizeof accj - used, "}");
        ddt_store_eval(t->store, t->run_id, t->step, ddt_acceptance_tau_chain(acc), tree, accj);
    }
    return rc;
}


/* ------------------------------------------------------------------------------------------
 * Speculative decoding on held-out prompts (SPEC.md section 7)
 */

static int open_speculator(ddt_trainer *t, char *err, size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    rank_state *rs = &t->rank[0];
    if (t->split || c->target_place == DDT_TARGET_SPLIT)
        return ddt_fail(err, err_len, -ENOTSUP, "eval.speculative: the target is on a split's own devices, not "
                        "beside rank 0's drafter: run `ddtreed speculate` on an export instead");
    if (t->colocated)
        t->spec_target = &rs->replica;
    else if (t->source && !t->gpu)
        t->spec_target = ddt_source_target(t->source);   /* the host target: CPU ranks read host memory */
    if (!t->spec_target || !t->spec_target->ops)
        return ddt_fail(err, err_len, -ENOTSUP, "eval.speculative: no target beside rank 0's drafter (%s)",
                        t->gpu ? "GPU ranks with target.devices \"host\": use \"same\" (co-located)"
                               : "a token file read without its target, or feature shards");
    ddt_run_config_spec_caps(c, &t->spec_prompts, &t->spec_gen_len, &t->spec_max_budget);
    /* within train.seq_len (eval.speculative's own is checked to be; its default need not be) */
    t->spec_prompt_len = c->spec_prompt_len < c->seq_len - 1 ? c->spec_prompt_len : c->seq_len - 1;
    if (t->spec_prompt_len + t->spec_gen_len + c->drafter.block_size > c->drafter.max_positions)
        return ddt_fail(err, err_len, -EINVAL, "eval.speculative: prompt_len %lld + gen_len %lld + block_size is "
                        "beyond the target's context (%lld)", (long long)t->spec_prompt_len,
                        (long long)t->spec_gen_len, (long long)c->drafter.max_positions);
    char why[900];
    int rc = ddt_speculator_open(&t->spec, rs->be, t->spec_target, &c->drafter, t->spec_prompt_len, t->spec_gen_len,
                                 t->spec_max_budget, why, sizeof why);
    if (rc)
        return ddt_fail(err, err_len, rc, "eval.speculative: rank 0's speculator (%lld prompt + %lld generated "
                        "tokens, trees of %lld nodes; its bytes: the `speculator` row of `ddtreed plan`): %s",
                        (long long)t->spec_prompt_len, (long long)t->spec_gen_len, (long long)t->spec_max_budget,
                        why);
    return 0;
}

/* Held-out sequence i's prompt into *tokens, *n and its end token into *stop (-1: none): a
 * conversation's (chat data: through its last user message, then the generation prompt; longer
 * than P, its last P tokens, the generation prompt kept), else the sequence's first P tokens
 * (fewer: a shorter sequence), from the evaluation's stream (generated: rank 0's generator
 * samples it once; else the source's) */
static int spec_prompt(ddt_trainer *t, int64_t i, int64_t P, const int32_t **tokens, int64_t *n, int32_t *stop,
                       char *err, size_t err_len)
{
    *stop = -1;
    if (t->generates) {
        int32_t *row;
        int rc = ddt_heldout_tokens_get(&t->held, &t->data, &t->rank[0].gen, i, &row, err, err_len);
        *tokens = row;
        *n = P;
        return rc;
    }
    int rc = ddt_source_heldout_prompt(t->source, i, tokens, n, stop, err, err_len);
    if (rc != -ENOTSUP) {   /* conversations */
        if (rc == 0 && *n > P)
            *tokens += *n - P, *n = P;
        return rc;
    }
    ddt_sequence q;
    rc = ddt_source_heldout(t->source, i, &q, err, err_len);
    *tokens = q.input_ids;
    *n = q.S < P ? q.S : P;
    return rc;
}

static void store_spec(ddt_trainer *t, int64_t step, const ddt_speculate_totals *tot, int64_t prompt_len,
                       int64_t gen_len, double seconds, int live)
{
    double tau_tree[DDT_MAX_BUDGETS];
    for (int i = 0; i < tot->n_budgets; i++)
        tau_tree[i] = ddt_speculate_tau_tree(tot, i);
    cJSON *tree = ddt_speculate_budgets_json(tot, tau_tree), *d = cJSON_CreateObject();
    cJSON_AddNumberToObject(d, "prompts", (double)tot->prompts);
    cJSON_AddNumberToObject(d, "prompt_len", (double)prompt_len);
    cJSON_AddNumberToObject(d, "gen_len", (double)gen_len);
    cJSON_AddNumberToObject(d, "generated", (double)tot->generated);
    cJSON_AddNumberToObject(d, "mismatched", (double)tot->mismatched);
    cJSON_AddBoolToObject(d, "greedy_equal", tot->mismatched == 0);
    cJSON_AddNumberToObject(d, "chain_calls", (double)tot->chain_calls);
    cJSON_AddNumberToObject(d, "seconds", seconds);
    cJSON_AddNumberToObject(d, "greedy_seconds", tot->greedy_seconds);
    cJSON_AddNumberToObject(d, "chain_seconds", tot->chain_seconds);
    cJSON_AddItemToObject(d, "tree_seconds", ddt_speculate_budgets_json(tot, tot->tree_seconds));
    cJSON_AddStringToObject(d, "weights", live ? "live" : "checkpoint");
    char *tree_text = cJSON_PrintUnformatted(tree), *detail = cJSON_PrintUnformatted(d);
    if (tree_text && detail)
        ddt_store_eval_spec(t->store, t->run_id, step, ddt_speculate_tau(tot), tree_text, detail);
    free(tree_text);
    free(detail);
    cJSON_Delete(tree);
    cJSON_Delete(d);
}

int ddt_trainer_speculate(ddt_trainer *t, const ddt_trainer_spec_request *q, ddt_speculate_totals *out, char *err,
                          size_t err_len)
{
    const ddt_run_config *c = &t->cfg;
    rank_state *rs = &t->rank[0];
    int rc = t->spec ? 0 : open_speculator(t, err, err_len);
    if (rc)
        return rc;
    ddt_speculate_params p = { .gen_len = q->gen_len > 0 ? q->gen_len : t->spec_gen_len, .stop = -1 };
    const int64_t prompts = q->prompts > 0 ? q->prompts : t->spec_prompts;
    if (q->n_budgets > DDT_MAX_BUDGETS)
        return ddt_fail(err, err_len, -EINVAL, "tree_budgets: at most %d", DDT_MAX_BUDGETS);
    /* the request's budgets, else eval.speculative.tree_budgets (its default without the section) */
    p.n_budgets = q->n_budgets >= 0 ? q->n_budgets : c->spec_n_budgets;
    memcpy(p.budgets, q->n_budgets >= 0 ? q->budgets : c->spec_budgets, sizeof(int64_t) * (size_t)p.n_budgets);
    if (prompts > t->spec_prompts)
        return ddt_fail(err, err_len, -EINVAL, "prompts: at most %lld (the speculator's, eval.speculative.prompts "
                        "and train.heldout)", (long long)t->spec_prompts);
    if (p.gen_len > t->spec_gen_len)
        return ddt_fail(err, err_len, -EINVAL, "gen_len: at most %lld (the speculator's, eval.speculative.gen_len)",
                        (long long)t->spec_gen_len);
    for (int i = 0; i < p.n_budgets; i++)
        if (p.budgets[i] < 1 || p.budgets[i] > t->spec_max_budget)
            return ddt_fail(err, err_len, -EINVAL, "tree_budgets: %lld is outside [1, %lld] (the planned cap, the "
                            "largest of eval.speculative.tree_budgets)", (long long)p.budgets[i],
                            (long long)t->spec_max_budget);
    /* the weights: rank 0's live ones, or a kept checkpoint's brought to rank 0's memory */
    const int live = q->step < 0 || q->step == t->step;
    const int64_t step = live ? t->step : q->step;
    const size_t bytes = (size_t)t->total * sizeof(float);
    float *host = NULL, *dev = NULL;
    ddt_drafter_weights w = rs->w;
    if (!live) {
        char dir[2200];
        if (ddt_checkpoint_find(t->run_dir, step, dir, sizeof dir))
            return ddt_fail(err, err_len, -ENOENT, "step: no kept checkpoint of step %lld (checkpoint.keep keeps "
                            "the newest)", (long long)step);
        if (!(host = malloc(bytes)))
            return ddt_fail(err, err_len, -ENOMEM, "no host memory for the checkpoint's weights");
        rc = ddt_checkpoint_read(dir, &c->drafter, host, NULL, NULL, err, err_len);
        if (!rc && rs->gpu >= 0) {
            if (!(dev = ddk_malloc(rs->be->alloc, bytes)))
                rc = ddt_fail(err, err_len, -ENOMEM, "no memory on rank 0 for the checkpoint's weights");
            else {
                rs->be->copy(rs->be, dev, host, bytes);
                rs->be->synchronize(rs->be);
            }
        }
        if (rc) {
            free(host);
            return rc;
        }
        ddt_drafter_bind(&c->drafter, dev ? dev : host, &w);
    }
    const double t0 = ddt_mono_s();
    ddt_speculate_totals_init(out, &p);
    for (int64_t i = 0; i < prompts && rc == 0; i++) {
        const int32_t *tokens;
        int64_t n;
        ddt_speculate_prompt_result r;
        if ((rc = spec_prompt(t, i, t->spec_prompt_len, &tokens, &n, &p.stop, err, err_len)))
            break;
        if ((rc = ddt_speculate_prompt(t->spec, &w, &p, tokens, n, &r, err, err_len)))
            break;
        ddt_speculate_totals_add(out, &r);
        if (!r.equal && t->store) {   /* a bug: speculative decoding is lossless (SPEC.md 7) */
            char message[300];
            snprintf(message, sizeof message, "speculative decoding of held-out prompt %lld at step %lld was not "
                     "equal to greedy decoding (a bug: it is lossless)", (long long)i, (long long)step);
            store_message(t, "error", step, i, message);
        }
    }
    const double seconds = ddt_mono_s() - t0;
    if (dev)
        ddk_free(rs->be->alloc, dev, bytes);
    free(host);
    if (rc == 0 && t->store)
        store_spec(t, step, out, t->spec_prompt_len, p.gen_len, seconds, live);
    return rc;
}
