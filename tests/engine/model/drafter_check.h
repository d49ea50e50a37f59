/* drafter_check.h: the drafter's step on a backend against the float64 reference of SPEC.md 1, 2
 * and 2.1 (drafter_reference.h), one loss setting at a time: what tests/engine/model/
 * test_drafter_reference.c runs on the CPU backend and tests/simt/test_simt_step.cpp through the
 * CUDA kernels under the SIMT emulation.
 *
 * The fixture: random weights (every tensor away from its initialisation: norm gains, the
 * convolutions' base kernels and projections, the selector's codebooks), 2 sequences with a
 * padded block and masked positions, a sliding and a full layer. Compared: the loss against the
 * reference's; the forward's hidden states of the kept blocks against the reference's; every
 * gradient, tensor by tensor, against central differences of the reference's loss in double
 * (normalised error max |g - fd| / max |fd|; a tensor whose reference gradient is 0, the
 * selector's at alpha_sel 0, must get exactly 0).
 */
#ifndef DRAFTER_CHECK_H
#define DRAFTER_CHECK_H

#include "ddk.h"
#include "model/drafter.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct drafter_setting {
    const char *name;
    int dflash2, teacher_labels, inject, stop_gradient;
    float kl, cap, sel_weight;
    int64_t chunk, vocab_tile;
    int slot_scale;   /* 1: the batch scales its slots' weights (ddt_batch.slot_scale) */
} drafter_setting;

/* the settings every backend is checked under (DFlash, and DFlash2's candidate modes,
 * stop_gradient, alpha_sel, materialised and streamed loss, labels, KL and CAP, slot scales) */
extern const drafter_setting drafter_settings[];
extern const int drafter_setting_count;

/* 1 when an expectation failed (0: passed), each printed as "  # WHY" under the case's line: what is
 * off by more than tol (the loss's and the hidden states' relative error) or grad_tol (each
 * gradient's normalised error); prints the figures too. */
int drafter_check_step(const ddk_backend *be, const drafter_setting *st, double tol, double grad_tol);

/* A fresh DFlash2 drafter is DFlash with the same backbone: its hidden states (engine's and
 * reference's, full layers) equal the DFlash drafter's of the same seed. */
int drafter_check_init_is_dflash(const ddk_backend *be);

#ifdef __cplusplus
}
#endif

#endif
