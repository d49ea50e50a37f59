/* trainer_impl.h: the trainer's state (struct ddt_trainer, its ranks' rank_state) and the calls
 * between the files that implement trainer.h; internal to train/, not a public header. They use each other in one direction, each file
 * only the ones listed after it:
 *   cadence.c     the cadence of a run: ddt_trainer_advance, _hold, _finish
 *   open.c        ddt_trainer_open, _open_parsed, _close: the run's config, data, ranks, weights
 *   step.c        ddt_trainer_step: the ranks' threads, the all-reduce, AdamW, out-of-memory recovery
 *   walk.c        ddt_trainer_match_serving: the walks' anchors (train.anchors), the tree term's scales
 *   evaluation.c  ddt_trainer_eval, _speculate: acceptance and speculative decoding, held out
 *   batches.c     a step's batch into the ranks' buffers, and a split's next one taken ahead
 *   ranks.c       the ranks on their devices, with their replicas of the target and the weights
 *   trainer.c     what they all use: events, the weights between the host and the ranks, where the
 *                 run stands (its data's cursor, checkpoints, the export), the memory plan
 * and split.c beneath them all. trainer.c and trainer.h are one unit to scripts/check_layers and
 * the lowest: this header includes no trainer.h (its calls name struct ddt_trainer).
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
 *     slots, ddt_trainer_load_batch copies them into each rank's batch buffers, a GPU's through a
 *     pinned staging buffer;
 *   - co-located ("same"; "auto" on GPU ranks): every rank holds its own replica of the target on
 *     its own backend (fp32 on a CPU rank, bf16 on a GPU) and, in its own thread before its step,
 *     prefills its sequences straight into its batch buffers (rank_main, step.c). A token file:
 *     the source yields tokens only. Generated data: no source and no host target at all; each
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
 *     first (split_batch, batches.c); the drafter reads target rank 0's head: in place on CPU
 *     ranks, a bf16 copy on each GPU. On CPU ranks the host run's losses bit for bit.
 * Tested through trainer.h by tests/engine/train/test_trainer.c (CPU ranks) and tests/engine/train/test_step_cuda.c (GPU
 * ranks against CPU ones; skipped without a GPU).
 */
#ifndef DDT_TRAINER_IMPL_H
#define DDT_TRAINER_IMPL_H

#include "split.h"
#include "ddk.h"
#include "data/source.h"
#include "eval/speculate.h"
#include "model/optimizer.h"
#include "record/store.h"
#include "run/planner.h"

#include <stddef.h>
#include <stdint.h>

enum { MAX_RANKS = DDT_MAX_RANKS, CHUNK_FLOOR = 16, TILE_FLOOR = 256, SEED_ANCHORS = 1,
       SEED_NOISE = 2, SEED_EVAL = 3, SEED_INIT = 4, SEED_WALK = 5 };

/* Floats appended to a GPU rank's gradient for the all-reduce: its weight sum, the weighted
 * sums of loss, ce, kl, cap and DFlash2's sel, the counted and correct positions and the selector's
 * correct ones (exact below 2^24). */
enum { R_WEIGHT, R_LOSS, R_CE, R_KL, R_CAP, R_SEL, R_COUNTED, R_CORRECT, R_SEL_CORRECT, REDUCED };

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
    float *slot_scale;            /* (nseq, A, B) host: the tree term's scales of b's slots
                                     (walk.c), or NULL */
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
    /* a checkpoint or the final export that failed is owed: the run holds until ddt_trainer_ready
     * writes it (tried again after retry_pause_s, doubling from HOLD_RETRY_FIRST_S to _LONGEST_S) */
    int owed;
    const char *owed_what;        /* "the checkpoint", "the export" */
    char owed_why[1200];
    double retry_at_s, retry_pause_s; /* monotonic */
    int exported;                 /* the final export (ddt_trainer_finish) is written */
    char held_why[1600];          /* "" or why ddt_trainer_ready last held the run */
    /* speculative decoding (eval.speculative, POST /runs/{id}/speculate): rank 0's speculator
     * over the target beside it, opened once (at open with eval.speculative, else on first use) */
    ddt_speculator *spec;
    const ddt_target_model *spec_target;   /* rank 0's replica, or the source's host target */
    int64_t spec_prompts, spec_prompt_len, spec_gen_len, spec_max_budget;   /* its caps */
};

/* ---- trainer.c */

/* an event of the run's (nothing without a store): kind, and the detail fmt makes */
void ddt_trainer_event(struct ddt_trainer *t, const char *kind, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* an event of kind {"step", ["prompt",] "message"} (prompt < 0: none; the message may be long:
 * cJSON escapes it, no fixed buffer cuts it) */
void ddt_trainer_store_message(struct ddt_trainer *t, const char *kind, int64_t step, int64_t prompt,
                               const char *message);
/* The ranks' replicas := the host's weights and moments (after initialisation or a resume), and
 * the bf16 copies := the weights rounded (AdamW keeps them so after that). */
void ddt_trainer_push_weights(struct ddt_trainer *t);
/* The data's cursor after the steps done: the source's or the generated one's, less a split's
 * next batch taken already */
int64_t ddt_trainer_done_cursor(const struct ddt_trainer *t);
/* t's memory plan for budget (0: the config's): the ranks' devices, and the target where this
 * trainer runs it: co-located on the ranks, or in host memory beside them (the source's CPU
 * backend); never a proposal of something else. 0, or -EINVAL when the target's config.json
 * cannot be read again. */
int ddt_trainer_plan_for(const struct ddt_trainer *t, int64_t budget, ddt_memory_plan *p, char *err,
                         size_t err_len);

/* ---- ranks.c */

/* t's ranks on the devices of dev (at open, once the data is open): each one's backend, its
 * co-located replica of the target (or the split's target ranks), the head its step reads, its
 * gradients, a GPU's replica of the weights and moments, its batch slots. 0, or an errno with
 * err naming the rank. */
int ddt_trainer_alloc_ranks(struct ddt_trainer *t, const ddt_devices *dev, char *err, size_t err_len);

/* ---- batches.c */

/* A split's batch in flight (ahead) waited for: its answer in ahead_rc / ahead_err */
void ddt_trainer_split_settle(struct ddt_trainer *t);
/* The step's batch into the ranks' b slots (a split's next one started into their ahead slots):
 * 0, or an errno with err */
int ddt_trainer_load_batch(struct ddt_trainer *t, char *err, size_t err_len);

/* ---- walk.c */

/* Before the step of rs's slice (its features and labels in place, the step's weights bound):
 * train.anchors "walk" / "tree_walk": the walked sequences' anchors redrawn from the walk's
 * starts in rs->b; train.tree_weight: the tree term's scales of every block's slots in
 * rs->slot_scale. 0, or -ENOMEM (its workspace) or the forward's errno. */
int ddt_trainer_match_serving(rank_state *rs);

/* ---- evaluation.c */

/* logits (rows, V) = x (rows, H) lm_head^T in the backend's memory, fp32 or on the bf16 head as
 * it is stored */
void ddt_head_logits(const ddk_backend *be, const ddt_head *head, int64_t rows, int64_t V, int64_t H,
                     const float *x, float *logits);

/* Rank 0's speculator over the target beside it (at open with eval.speculative, else at the
 * first request): 0, or -ENOTSUP, -EINVAL or the speculator's errno with err */
int ddt_trainer_open_speculator(struct ddt_trainer *t, char *err, size_t err_len);

#endif
