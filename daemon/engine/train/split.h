/* split.h: the split placement's target ranks ("target.devices" a GPU list or a count): each
 * holds its own replica of the run's target on its own backend (a GPU apart from the drafter's,
 * bf16; or a CPU rank, fp32), computes the features of its share of a batch's sequences and
 * hands them to the drafter ranks' batch buffers: an NCCL send/recv between GPUs (ddk_link,
 * beside both GPUs' compute), a copy between CPU ranks. The trainer (batches.c) runs a batch
 * one step ahead of the drafter, into the second of its two batch slots: double-buffered.
 * Also the one opener of a rank's replica (co-located ranks use it too).
 * Tested by tests/engine/train/test_trainer.c (CPU target ranks: the losses of a split run are those of the
 * host's target bit for bit) and tests/kernels/test_comm.c (the link).
 *
 * Legend: S tokens of a sequence, H hidden, L_t taps.
 */
#ifndef DDT_SPLIT_H
#define DDT_SPLIT_H

#include "model/generate.h"
#include "run/devices.h"
#include "run/run_config.h"
#include "model/target.h"

#include <stddef.h>
#include <stdint.h>

/* A rank's replica of c's target on be (bf16 or fp32 weights), its shape checked against the
 * drafter's; with gen, its generator too (sequences of seq_len). 0, or an errno with err. */
int ddt_replica_open(const ddt_run_config *c, const ddk_backend *be, int bf16, ddt_target_model *m,
                     ddt_generator *gen, char *err, size_t err_len);

/* Where one sequence of a batch goes. */
typedef struct ddt_split_dest {
    int drafter;          /* the local drafter rank that trains on it */
    int32_t *tokens;      /* (S) host: its tokens, or where generated ones are written */
    float *features;      /* (S, L_t*H) in the drafter rank's memory */
    float *teacher;       /* (S, H) there, or NULL */
    int sample;           /* 1: its tokens sampled first (generated data; ddt_split_open's generates) */
    int64_t index;        /* sample: the sequence's index (ddt_source_generate) in the training stream */
    int noise;            /* 1: the feature noise of seed noise_seed added (training batches) */
    uint64_t noise_seed;
} ddt_split_dest;

typedef struct ddt_split ddt_split;

/* The target ranks of dev (dev->target_ranks, on dev->target_gpu_ids when dev->gpu) for c,
 * handing off to the drafter ranks drafter_be[0..drafters) (GPUs drafter_gpus when dev->gpu);
 * generates: the ranks sample the tokens (c's data rules). 0, or an errno with err naming the
 * target rank. */
int ddt_split_open(const ddt_run_config *c, const ddt_devices *dev, const ddk_backend *const *drafter_be,
                   int drafters, int generates, ddt_split **out, char *err, size_t err_len);
/* Waits for a batch in flight, then frees everything (NULL: nothing). */
void ddt_split_close(ddt_split *s);

/* Starts the target ranks on the batch dest[0..n) (kept by the caller until ddt_split_wait):
 * rank j takes a contiguous slice of it, in order, and for each sequence samples its tokens
 * (sample), runs the prefill with the run's taps into its own buffers, adds the noise, and
 * sends features and teacher to the destination. Returns at once. */
void ddt_split_start(ddt_split *s, const ddt_split_dest *dest, int64_t n);
/* Waits for the batch started last (at once when none is in flight): 0, or the first rank's
 * error with err; then every drafter rank's later work is ordered after the hand-offs into it
 * (a GPU's stream waits for the copies; CPU ranks copied before this returns). Idempotent. */
int ddt_split_wait(ddt_split *s, char *err, size_t err_len);

/* Every target rank's allocator's peak := its current bytes (a step's figures start) */
void ddt_split_reset_peaks(ddt_split *s);

/* Target rank 0's replica (the head the drafter ranks read) and generator (held-out tokens);
 * only between batches (after ddt_split_wait) */
const ddt_target_model *ddt_split_replica(const ddt_split *s);
ddt_generator *ddt_split_generator(ddt_split *s);

#endif
