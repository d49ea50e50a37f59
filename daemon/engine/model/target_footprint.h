/* target_footprint.h: what a target costs a run, from its config.json alone: its weights in
 * fp32 and in the stored type, one prefill's workspace, one generating sequence's cache, the
 * prefill's FLOPs and eval.speculative's speculator, for the planner (run/planner.h).
 * Tested by tests/engine/train/test_trainer.c and tests/daemon/train_cli_test.sh (`ddtreed plan` of the examples).
 */
#ifndef DDT_TARGET_FOOTPRINT_H
#define DDT_TARGET_FOOTPRINT_H

#include "model_config.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_target_footprint {
    char model_type[16];       /* "llama", "qwen3", "qwen3_5" */
    char dtype[64];            /* the checkpoint's, as config.json says */
    int64_t hidden, vocab, layers;
    int tied;
    int64_t params;            /* weights, elements */
    int stored_bytes;          /* bytes per weight in the checkpoint's dtype (bf16: 2) */
    int64_t fp32_bytes;        /* the loaded weights' allocation in fp32 (a CPU target's) */
    int64_t stored_weight_bytes; /* ... in the stored type: bf16 matrices and embedding, fp32
                                  vectors (a bf16 target's); fp32_bytes for an fp32 checkpoint */
    int64_t prefill_bytes;     /* the forward's fp32 workspace for one sequence of seq_len tokens */
    int64_t cache_bytes;       /* one generator's: its cache of seq_len positions and its workspace */
    double prefill_flops;      /* the matrix products of one seq_len prefill */
    int64_t speculator_bytes;  /* eval.speculative's speculator on rank 0's device (its cache of
                                  prompt_len + gen_len + max(B, K + 1) positions, verify blocks of
                                  max(B, K + 1) for the largest budget K, and its workspace); 0:
                                  none (ddt_run_footprint sets it) */
} ddt_target_footprint;

/* DIR/config.json (llama, qwen3, qwen3_5) planned for sequences of T tokens. 0, or the config
 * loader's negative errno with err. */
int ddt_target_footprint_load(const char *dir, int64_t T, ddt_target_footprint *f, char *err, size_t err_len);
/* a dense target of shape c (synthetic: stored_bytes 4, it is made in fp32) */
void ddt_target_footprint_dense(const ddt_target_config *c, int stored_bytes, int64_t T, ddt_target_footprint *f);
/* a Qwen3.5 target of shape c; 0 or -ENOMEM (counting its weights) */
int ddt_target_footprint_qwen35(const ddt_qwen35_config *c, int stored_bytes, int64_t T, ddt_target_footprint *f);

/* f->speculator_bytes = rest + the cache of the target (DIR/config.json, or the synthetic shape
 * when dir is NULL) for max_len positions and verify blocks of max_block. 0 or the config
 * loader's error. */
int ddt_target_footprint_speculator(const char *dir, const ddt_target_config *synthetic, int64_t max_len,
                                    int64_t max_block, int64_t rest, ddt_target_footprint *f, char *err,
                                    size_t err_len);

#endif
