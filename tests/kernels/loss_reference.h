/* loss_reference.h: an independent float64 reference of the loss of SPEC.md section 1.
 *
 * Written straight from the formulas, naive (O(n V H), every logit recomputed in double),
 * for clarity, not speed: it is what tests/kernels/test_loss.c compares ddk_loss_cpu() against.
 * It shares nothing with kernels/ but the parameter and result structs of ddk.h.
 * It validates its own arguments only as far as it needs to compute (see loss_reference.c);
 * refusing bad parameters is ddk_loss_cpu()'s job and is tested there.
 *
 * Dimension legend: n positions, H hidden size, V vocabulary. Row-major; W is (V, H).
 */
#ifndef LOSS_REFERENCE_H
#define LOSS_REFERENCE_H

#include <stdint.h>

#include "ddk.h"

/* The loss, its parts and d loss / d hs, all in double. p->chunk and p->vocab_tile are
 * ignored: they must not change the result. Returns 0, or -EINVAL when the inputs cannot be
 * computed on (p, out, hs or W NULL, the teacher needed but NULL, a label >= V).
 * grad and per_position may be NULL; out must not be. */
int loss_reference(const ddk_loss_params *p,
                   const float *hs,           /* (n, H) student hidden */
                   const float *ht,           /* (n, H) teacher hidden, or NULL */
                   const float *W,            /* (V, H) lm_head */
                   const int32_t *labels,     /* (n), or NULL: the teacher's argmax */
                   const float *weights,      /* (n), or NULL: all 1 */
                   double *grad,              /* (n, H) d loss / d hs, or NULL */
                   double *per_position,      /* (n) l_i, 0 where ignored, or NULL */
                   ddk_loss_result *out);

#endif
