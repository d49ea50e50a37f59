/* planner.h: the memory plan of a run before it starts: bytes of weights, gradients,
 * optimiser state, the frozen target head, the batch, activations and the loss workspace on
 * one device (rank), and the largest `chunk` (then a `vocab_tile`) that fits a budget.
 * `ddtreed plan` and POST /plan print it; the trainer records measured peaks beside it.
 * Where the target runs (API.md "Placement", DESIGN.md "Where the target runs"): on the host
 * (HOST), co-located on every drafter rank, CPU or GPU (SAME: what the trainer runs for
 * target.devices "same", "auto" on GPUs), or a split (planned only).
 * Tested by tests/engine/train/test_trainer.c (prediction against the accounting allocator's peak).
 */
#ifndef DDT_PLANNER_H
#define DDT_PLANNER_H

#include "devices.h"
#include "model/target_footprint.h"
#include "run_config.h"

#include <stdint.h>
#include <stdio.h>

/* The footprint of c's target (target.kind hf or synthetic; not shards): the hf directory's
 * config.json, or the synthetic target's shape. 0, or -EINVAL with err. */
int ddt_run_footprint(const ddt_run_config *c, ddt_target_footprint *f, char *err, size_t err_len);

/* Where the target runs (API.md "Placement"). */
typedef enum ddt_placement {
    DDT_PLACE_NONE,    /* shards: no target at train time */
    DDT_PLACE_HOST,    /* one fp32 target in host memory, beside the ranks' own (CPU ranks by
                          default; GPU ranks with target.devices "host") */
    DDT_PLACE_SAME,    /* a replica on each drafter rank: bf16 on a GPU, fp32 on a CPU rank
                          (target.devices "same"; "auto" on GPU ranks) */
    DDT_PLACE_SPLIT    /* replicas on target ranks apart from the drafter's (GPUs, or CPU ranks),
                          features handed to the drafter ranks */
} ddt_placement;

/* The target's part of a plan: bytes where it runs (HOST: the host; SAME: on each drafter rank,
 * counted in the drafter's peak, and what the source still keeps on the host; SPLIT: on each
 * target GPU). */
typedef struct ddt_target_plan {
    ddt_placement placement;
    int proposed;              /* SPLIT: the planner's proposal (co-location does not fit) */
    int64_t devices;           /* SPLIT: target ranks; else 0 */
    int64_t weights;           /* HOST, and SAME or SPLIT on CPU ranks: fp32; SAME or SPLIT on GPUs:
                                  bf16 (what the replica is opened as) */
    int64_t workspace;         /* the prefills at once (HOST: two threads; else one) */
    int64_t speculator;        /* eval.speculative: the speculator (footprint's speculator_bytes),
                                  on rank 0's device, counted in the drafter's peak */
    int64_t cache;             /* generating: the generators' caches and workspaces (HOST: the
                                  loader's and the held-out worker's; SPLIT: one; SAME: the rank's
                                  one, over its replica, counted in the drafter's peak); token
                                  files: 0 */
    int64_t queue;             /* HOST, SAME with a token file: the source's sequence buffers
                                  (ddt_source_queue_bytes; SAME: tokens and masks only); SAME
                                  generating: 0 (no source) */
    int64_t host;              /* SAME, SPLIT: what stays on the host: the token file's queue, or,
                                  generating, the held-out tokens (no host target either way) */
    int64_t handoff;           /* SPLIT: a drafter rank's second batch slot (double-buffered) */
    int64_t send;              /* SPLIT: a target rank's buffers of one sequence */
    int64_t peak;              /* HOST and SPLIT: the sum; SAME: 0 (in the drafter's peak) */
    double flops_share;        /* the target's share of a step's matrix FLOPs (0..1) */
} ddt_target_plan;

typedef struct ddt_memory_plan {
    int64_t positions;        /* per rank: sequences x anchors x block size */
    int64_t weights, gradients, optimizer, frozen_head, batch, activations, loss_workspace,
            attention_workspace;
    int64_t peak;             /* the sum: what one device holds at its busiest */
    int gpu;                  /* the ranks are GPUs (ddt_plan's gpu) */
    int64_t ranks;            /* the drafter's ranks planned: c->ranks, or a proposed split's */
    int64_t budget;           /* 0: none */
    int budget_card;          /* 1: the budget is the card's memory (memory.card, GPU ranks, none given) */
    int64_t chunk, vocab_tile;/* chosen (the config's when they fit or there is no budget) */
    int fits;                 /* the drafter's devices, and the target's under SPLIT */
    ddt_target_plan target;
    char why[512];            /* "" or why it does not fit, in figures (a proposed split: why the
                                 placement configured does not) */
    /* a proposed split (target.proposed; ddt_plan_config): the GPUs to write as "devices" (ranks
     * of them) and as "target.devices" (target.devices of them), the config's GPUs first */
    int32_t split_devices[DDT_MAX_RANKS], split_target_devices[DDT_MAX_RANKS];
} ddt_memory_plan;

/* Whether the run as configured fits: its placement planned (not a proposal) and every device
 * within the budget. A proposed split that fits is not: the config must name it first. This is
 * POST /plan's "fits", and `ddtreed plan` / `ddtreectl plan` exit 0 only then. */
static inline int ddt_plan_fits(const ddt_memory_plan *p)
{
    return p->fits && !p->target.proposed;
}

/* One part of a drafter device's peak (ddt_plan_parts): a JSON key of POST /plan's
 * "peak_parts" ("weights", "target", "loss_workspace", ...) and its bytes. */
typedef struct ddt_plan_part {
    const char *key;
    int64_t bytes;
} ddt_plan_part;
enum { DDT_PLAN_PARTS = 12 };

/* The parts of p's peak, in the table's order; they sum to p->peak exactly. Their count. */
int ddt_plan_parts(const ddt_memory_plan *p, ddt_plan_part parts[DDT_PLAN_PARTS]);

/* c must be resolved (ddt_run_config_resolve), and c->ranks be the ranks the run takes on the
 * node (ddt_devices.ranks: "all" parses as 1). budget 0 = the config's, else on GPU ranks the
 * memory of the config's card (memory.card), else none. target: the
 * run's target (NULL: shards, none at train time); gpu: the ranks are GPUs; colocated: a
 * replica on every rank (ddt_devices_colocated); node_gpus: the GPUs a split may use (the
 * node's, or what the config names when planned away from it; 0: propose none, the trainer
 * plans what it runs).
 * Co-located (SAME) the rank holds the replica's weights (and, generating, its generator)
 * throughout and its prefill before the step, and its frozen head: an fp32 copy of embed_tokens / lm_head on a GPU (the loss reads
 * fp32; the replica's bf16 head is not read in place yet), nothing more on a CPU rank (it reads
 * the fp32 replica's own tensors). A GPU run co-located that does not fit the budget gets a
 * split of node_gpus proposed (target GPUs in proportion to the target's share of the FLOPs);
 * target.devices naming GPUs plans that split. Otherwise HOST. */
int ddt_plan(const ddt_run_config *c, int64_t budget, int tied_head, const ddt_target_footprint *target, int gpu,
             int colocated, int node_gpus, ddt_memory_plan *plan);

/* The plan of a parsed config on `node`, as `ddtreed plan` and POST /plan make it: the ranks it
 * takes there (c->ranks updated; a GPU it names that the node lacks: the ranks and GPUs it
 * names, a plan made for another node), the target's footprint from its config.json (not at
 * hand, or synthetic: the config's target.* shape, a dense target), the config resolved, then
 * ddt_plan. note: "" or the devices' note (ddt_devices.note); remark: "" or why the plan
 * stands on what the config names rather than the node or the model. 0, or -EINVAL with err and
 * field (the JSON path at fault, or ""). */
int ddt_plan_config(ddt_run_config *c, ddt_node node, int64_t budget, ddt_memory_plan *plan, char *note,
                    size_t note_len, char *remark, size_t remark_len, char *err, size_t err_len, char *field,
                    size_t field_len);

/* A table in the seed documents' terms (positions x vocabulary x bytes = per-tensor GB). */
void ddt_plan_print(const ddt_run_config *c, const ddt_memory_plan *plan, FILE *out);
/* The same as one JSON object (malloc'd text); note, when neither NULL nor "", is added as
 * "devices_note" (ddt_devices.note: the GPUs "all" leaves idle). */
char *ddt_plan_json(const ddt_run_config *c, const ddt_memory_plan *plan, const char *note);

#endif
