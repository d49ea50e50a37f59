/* drafter_reference.h: an independent float64 reference of the drafter's training loss, SPEC.md
 * sections 2 and 2.1 (DFlash and DFlash2) with the loss of section 1 and DFlash2's selector term.
 *
 * Written straight from SPEC.md, naive (every attention score and logit formed one at a time, in
 * double), for clarity, not speed; it shares nothing with daemon/engine/model/drafter.c but the
 * layout of the parameter buffer (ddt_drafter_param_table's offsets) and the batch struct. What
 * tests/engine/model/test_drafter_reference.c compares ddt_drafter_step and ddt_drafter_forward
 * against; gradients come from central differences of this loss (double), so the reference has no
 * backward of its own to be wrong.
 *
 * Legend: H hidden, V vocabulary, S sequence length, A anchors, B block size, L_t taps.
 */
#ifndef DRAFTER_REFERENCE_H
#define DRAFTER_REFERENCE_H

#include "model/drafter.h"

#include <stdint.h>

typedef struct drafter_reference_loss {
    double gamma;
    int ce_target_teacher;        /* labels: the teacher's argmax, else the data's next token */
    double kl_weight, kl_temperature, cap_weight, cap_temperature;
    double selector_weight;       /* DFlash2: alpha_sel */
    int selector_inject;
    /* stop_gradient, as a loss: the selector term reads hs from frozen_hs (nseq*A*B, H), the
     * hidden states of the unperturbed weights, so that the loss's gradient with respect to the
     * backbone leaves the selector term out; NULL: from the current weights */
    const double *frozen_hs;
} drafter_reference_loss;

/* The loss of a batch (one global normalisation) with the weights params (the table's layout,
 * in double); hs_out (nseq*A*B, H) the final-normed block rows, or NULL. embed and lm_head
 * (V, H) fp32, the batch's arrays on the host. Returns the loss (0 when no slot counts). */
double drafter_reference(const ddt_drafter_config *c, const double *params, const float *embed,
                         const float *lm_head, const ddt_batch *b, const drafter_reference_loss *lc,
                         double *hs_out);

#endif
