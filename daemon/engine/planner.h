/* planner.h: the memory plan of a run before it starts: bytes of weights, gradients,
 * optimiser state, the frozen target head, the batch, activations and the loss workspace on
 * one device (rank), and the largest `chunk` (then a `vocab_tile`) that fits a budget.
 * `ddtreed plan` and POST /plan print it; the trainer records measured peaks beside it.
 * Tested by tests/test_trainer.c (prediction against the accounting allocator's peak).
 */
#ifndef DDT_PLANNER_H
#define DDT_PLANNER_H

#include "run_config.h"

#include <stdint.h>
#include <stdio.h>

typedef struct ddt_memory_plan {
    int64_t positions;        /* per rank: sequences x anchors x block size */
    int64_t weights, gradients, optimizer, frozen_head, batch, activations, loss_workspace,
            attention_workspace;
    int64_t peak;             /* the sum: what one device holds at its busiest */
    int64_t budget;           /* 0: none */
    int64_t chunk, vocab_tile;/* chosen (the config's when they fit or there is no budget) */
    int fits;
} ddt_memory_plan;

/* c must be resolved (ddt_run_config_resolve), and c->ranks be the ranks the run takes on the
 * node (ddt_devices.ranks: "all" parses as 1). budget 0 = the config's (or none). */
int ddt_plan(const ddt_run_config *c, int64_t budget, int tied_head, ddt_memory_plan *plan);

/* A table in the seed documents' terms (positions x vocabulary x bytes = per-tensor GB). */
void ddt_plan_print(const ddt_run_config *c, const ddt_memory_plan *plan, FILE *out);
/* The same as one JSON object (malloc'd text); note, when neither NULL nor "", is added as
 * "devices_note" (ddt_devices.note: the GPUs "all" leaves idle). */
char *ddt_plan_json(const ddt_run_config *c, const ddt_memory_plan *plan, const char *note);

#endif
