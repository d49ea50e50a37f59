/* devices.h: where a run's ranks go on a node: the run config's "devices" (and its cluster
 * section) resolved against the GPUs this process sees and what this build can join, before
 * the trainer places a rank on each (train/ranks.c) and the planner sizes them, and whether the
 * target is co-located (a replica on every rank: "target.devices" "same", or "auto" on GPU
 * ranks) or on the host ("host", or "auto" on CPU ranks). The config itself
 * is parsed by run_config.c, which does not look at the node.
 * Tested by tests/engine/train/test_trainer.c (nodes of 0, 1, 2 and 8 GPUs, with and without NCCL).
 */
#ifndef DDT_DEVICES_H
#define DDT_DEVICES_H

#include "run_config.h"

#include <stddef.h>
#include <stdint.h>

/* What "devices" comes to on a node (ddt_run_config_devices). */
typedef struct ddt_devices {
    int gpu;                        /* 1: the ranks are GPUs; 0: CPU ranks */
    int ranks;                      /* this daemon's */
    int32_t gpu_ids[DDT_MAX_RANKS]; /* gpu: the GPU ordinal of each rank */
    int target_ranks;               /* a split's target ranks (0: none): GPUs target_gpu_ids when
                                       gpu, else CPU ranks after the drafter's */
    int32_t target_gpu_ids[DDT_MAX_RANKS];
    int colocated;                  /* 1: every rank runs its own replica of the target on its own
                                       backend (ddt_devices_colocated); 0: the source's host target,
                                       a split, or no target (shards) */
    char note[256];                 /* "" or a sentence for the run's events and the plan: "all"
                                       left GPUs idle (fewer sequences per step than GPUs) */
} ddt_devices;

/* What a node offers a run: its GPUs, and whether this build can join several of them. */
typedef struct ddt_node {
    int gpus;         /* GPUs this process sees */
    int single_gpu;   /* 1: a CUDA build without NCCL, so a run has one GPU rank at most */
} ddt_node;

/* This process's node: ddk_cuda_device_count(), and ddk_has_cuda() && !ddk_has_nccl(). */
ddt_node ddt_node_here(void);

/* Whether c's target is co-located with ranks that are GPUs (gpu 1) or CPU ranks (gpu 0):
 * "same", or "auto" on GPU ranks; never for shards (no target) or a split. */
int ddt_devices_colocated(const ddt_run_config *c, int gpu);

/* The ranks of this daemon for a run on `node` (ddt_node_here(); a test passes any node).
 * Every rank trains on one sequence of each step at least, so "all" takes min(gpus, train.sequences_per_step) GPUs (saying so in out->note), while ranks named
 * (a count, a list, the cluster's world) beyond train.sequences_per_step are refused. A GPU
 * run's drafter must fit the CUDA attention (head_dim <= DDK_CUDA_MAX_HEAD_DIM); a list of
 * GPUs is a GPU run even on a node without them, so that is checked first. A single_gpu build
 * refuses more than one GPU rank named (a count, a list, a cluster) and trains "all" on cuda:0,
 * saying so in out->note.
 * 0; -EINVAL when the config cannot run as asked on any node; -ENODEV when this node lacks
 * what it names (cuda:N, N GPUs, a GPU for a cluster run). err is "path: sentence" and field
 * (may be NULL) the JSON path at fault: devices, cluster, cluster.world_size or
 * drafter.head_dim. */
int ddt_run_config_devices(const ddt_run_config *c, ddt_node node, ddt_devices *out, char *err,
                           size_t err_len, char *field, size_t field_len);

#endif
