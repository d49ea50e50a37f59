/* loss_reference.h: an independent float64 reference of the loss of SPEC.md section 1, with the
 * DFlash2 path selector's term of SPEC.md 2.1 when p->selector is set.
 *
 * Written straight from the formulas, naive (O(n V H), every logit recomputed in double),
 * for clarity, not speed: it is what tests/kernels/test_loss.c compares ddk_loss_cpu() against.
 * It shares nothing with kernels/ but the parameter and result structs of ddk.h.
 * It validates its own arguments only as far as it needs to compute (see loss_reference.c);
 * refusing bad parameters is ddk_loss_cpu()'s job and is tested there.
 *
 * Dimension legend: n positions, H hidden size, V vocabulary, K the selector's top_k, r its
 * rank. Row-major; W is (V, H).
 */
#ifndef LOSS_REFERENCE_H
#define LOSS_REFERENCE_H

#include <stdint.h>

#include "ddk.h"

/* The loss, its parts and d loss / d hs, all in double. p->chunk, p->vocab_tile and
 * p->bf16_products are ignored (the inputs are taken as they are). With p->selector: its term
 * (loss, sel, sel_covered, sel_correct, l_i, and in grad its part unless stop_gradient) from its
 * predecessors, A, Bs and Hp; its dA, dBs, dHp pointers are not used (loss_reference_selector
 * gives those gradients in double). Returns 0, or -EINVAL when the inputs cannot be computed on
 * (p, out, hs or W NULL, the teacher needed but NULL, a label >= V; a selector's tensors NULL or
 * a predecessor outside [0, V) at a position that counts). grad and per_position may be NULL;
 * out must not be. */
int loss_reference(const ddk_loss_params *p,
                   const float *hs,           /* (n, H) student hidden */
                   const float *ht,           /* (n, H) teacher hidden, or NULL */
                   const float *W,            /* (V, H) lm_head */
                   const int32_t *labels,     /* (n), or NULL: the teacher's argmax */
                   const float *weights,      /* (n), or NULL: all 1 */
                   double *grad,              /* (n, H) d loss / d hs, or NULL */
                   double *per_position,      /* (n) l_i, 0 where ignored, or NULL */
                   ddk_loss_result *out);

/* The selector's gradients in double, each overwritten: d loss / d A (V, r), d loss / d Bs
 * (V, r), d loss / d Hp (r, H); any may be NULL. */
typedef struct loss_reference_sel_grads {
    double *dA, *dBs, *dHp;
} loss_reference_sel_grads;

/* loss_reference, and with p->selector, grad and sg its tensors' gradients (sg NULL: none;
 * with grad NULL sg is not written) */
int loss_reference_selector(const ddk_loss_params *p, const float *hs, const float *ht,
                            const float *W, const int32_t *labels, const float *weights,
                            double *grad, double *per_position, ddk_loss_result *out,
                            const loss_reference_sel_grads *sg);

#endif
