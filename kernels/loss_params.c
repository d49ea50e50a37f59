/* loss_params.c: validation of the loss's parameters, its workspace arithmetic and the weight
 * sum, shared by every backend and by the memory planner (ddk_loss_workspace_bytes).
 *
 * Tested by tests/kernels/test_loss.c (bad parameters refused with nothing written, a bf16 head without
 * bf16_products among them; the allocator's measured peak equals ddk_loss_workspace_bytes
 * exactly, with an fp32 or a bf16 head; weights, ignored labels and nothing counted against the
 * float64 reference).
 */
#include "loss_internal.h"

#include <errno.h>
#include <math.h>

static int positive_finite(float x)
{
    return isfinite(x) && x > 0.0f;
}

int ddk_loss_shape_of(const ddk_loss_params *p, int uses_teacher, ddk_loss_shape *shape)
{
    if (!p || p->n < 1 || p->hidden < 1 || p->vocab < 1 || p->vocab > INT32_MAX ||
        p->chunk < 1 || p->vocab_tile < 0 || (p->bf16_products != 0 && p->bf16_products != 1) ||
        (p->head_bf16 != 0 && p->head_bf16 != 1) || (p->head_bf16 && !p->bf16_products))
        return -EINVAL;   /* a bf16 head's products have bf16 operands: bf16_products says so */
    if (!(p->kl_weight >= 0.0f && p->kl_weight <= 1.0f) || !positive_finite(p->kl_temperature) ||
        !(p->cap_weight >= 0.0f && isfinite(p->cap_weight)) || !positive_finite(p->cap_temperature))
        return -EINVAL;

    int64_t chunk = p->chunk < p->n ? p->chunk : p->n;
    int64_t width = p->vocab_tile > 0 && p->vocab_tile < p->vocab ? p->vocab_tile : p->vocab;
    uint64_t logits, rows, total;
    if (__builtin_mul_overflow((uint64_t)chunk, (uint64_t)width, &logits) ||
        __builtin_mul_overflow(logits, (uint64_t)sizeof(float), &logits) ||
        logits > (uint64_t)INT64_MAX / 4)
        return -EINVAL;
    /* statistics first, then the logit buffers, each starting on a 64-byte line */
    rows = ((uint64_t)chunk * sizeof(ddk_loss_row) + 63) / 64 * 64;
    logits = (logits + 63) / 64 * 64;
    total = rows + logits * (uses_teacher ? 2u : 1u);
    shape->chunk = chunk;
    shape->width = width;
    shape->uses_teacher = uses_teacher != 0;
    shape->rows_bytes = (size_t)rows;
    shape->logits_bytes = (size_t)logits;
    shape->workspace_bytes = (size_t)total;
    return 0;
}

int64_t ddk_loss_workspace_bytes(const ddk_loss_params *p, int uses_teacher)
{
    ddk_loss_shape shape;
    int rc = ddk_loss_shape_of(p, uses_teacher, &shape);
    return rc ? rc : (int64_t)shape.workspace_bytes;
}

int ddk_loss_check_call(const ddk_loss_params *p, const float *student_hidden,
                        const float *teacher_hidden, const void *lm_head,
                        const int32_t *labels, const float *weights, const ddk_loss_result *out)
{
    if (!p || !student_hidden || !lm_head || !out)
        return -EINVAL;
    if (!teacher_hidden && (!labels || p->kl_weight > 0.0f))
        return -EINVAL;   /* the teacher supplies the labels and the KL */
    if (labels)
        for (int64_t i = 0; i < p->n; i++)
            if (labels[i] >= p->vocab)
                return -EINVAL;
    double weight_sum = 0.0;
    if (weights)
        for (int64_t i = 0; i < p->n; i++) {
            if (!isfinite(weights[i]))
                return -EINVAL;
            if (weights[i] > 0.0f)
                weight_sum += weights[i];
        }
    return isfinite(weight_sum) ? 0 : -EINVAL;
}

double ddk_loss_weight_sum(int64_t n, const int32_t *labels, const float *weights,
                           int64_t *counted)
{
    double weight_sum = 0.0;
    *counted = 0;
    for (int64_t i = 0; i < n; i++) {
        float w = weights ? weights[i] : 1.0f;
        if ((labels && labels[i] < 0) || !(w > 0.0f))
            continue;
        weight_sum += w;
        (*counted)++;
    }
    return weight_sum;
}
