/* cpu_backend.h: the CPU backend's ops, shared between its files (not installed). */
#ifndef DDK_CPU_BACKEND_H
#define DDK_CPU_BACKEND_H

#include "ddk.h"

/* The loss of SPEC.md section 1 (loss_cpu.c); contract of ddk_loss_cpu. */
int ddk_cpu_loss(const ddk_backend *be, const ddk_loss_params *p,
                 const float *student_hidden, const float *teacher_hidden, const float *lm_head,
                 const int32_t *labels, const float *weights,
                 float *grad_student, float *per_position, ddk_loss_result *out);

#endif
