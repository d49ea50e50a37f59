/* loss_params.c: validation of the loss's parameters, its workspace arithmetic and the weight
 * sum, shared by every backend and by the memory planner (ddk_loss_workspace_bytes). With the
 * DFlash2 selector (p->selector) the workspace grows by its per-chunk buffers
 * (ddk_loss_sel_carve's: chunk records, three (chunk, K), three (chunk, r)), nothing vocabulary-
 * sized.
 *
 * Tested by tests/kernels/test_loss.c (bad parameters refused with nothing written, a bf16 head without
 * bf16_products among them; the allocator's measured peak equals ddk_loss_workspace_bytes
 * exactly, with an fp32 or a bf16 head; weights, ignored labels and nothing counted against the
 * float64 reference); the selector's refusals and exact workspace by
 * tests/kernels/test_loss_selector.c.
 */
#include "loss_internal.h"

#include <errno.h>
#include <math.h>

static int positive_finite(float x)
{
    return isfinite(x) && x > 0.0f;
}

static int flag(int x)
{
    return x == 0 || x == 1;
}

/* the selector's parameters (not its pointers: ddk_loss_check_selector) */
static int selector_ok(const ddk_selector *s, int64_t vocab)
{
    const int64_t max_k = vocab < DDK_SELECTOR_MAX_K ? vocab : DDK_SELECTOR_MAX_K;
    return s->top_k >= 1 && s->top_k <= max_k && s->rank >= 1 && s->rank <= INT32_MAX &&
           isfinite(s->weight) && s->weight >= 0.0f && flag(s->inject) && flag(s->stop_gradient);
}

/* a (rows, cols) buffer of `size`-byte values rounded up to 64 bytes, or 0 on overflow */
static uint64_t line_bytes(uint64_t rows, uint64_t cols, uint64_t size)
{
    uint64_t b;
    if (__builtin_mul_overflow(rows, cols, &b) || __builtin_mul_overflow(b, size, &b) ||
        b > (uint64_t)INT64_MAX / 16)
        return 0;
    return (b + 63) / 64 * 64;
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
    if (p->selector && !selector_ok(p->selector, p->vocab))
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
    /* the selector's, after the logits (ddk_loss_sel_carve): chunk records, cand, cz and ds
     * (chunk, K), q, u and dq (chunk, r) */
    uint64_t sel_rows = 0, sel_k = 0, sel_r = 0;
    if (p->selector) {
        sel_rows = line_bytes((uint64_t)chunk, 1, sizeof(ddk_loss_sel_row));
        sel_k = line_bytes((uint64_t)chunk, (uint64_t)p->selector->top_k, 4);
        sel_r = line_bytes((uint64_t)chunk, (uint64_t)p->selector->rank, sizeof(float));
        if (!sel_rows || !sel_k || !sel_r)
            return -EINVAL;
        total += sel_rows + 3 * sel_k + 3 * sel_r;   /* each term < 2^59: no overflow */
    }
    shape->chunk = chunk;
    shape->width = width;
    shape->uses_teacher = uses_teacher != 0;
    shape->rows_bytes = (size_t)rows;
    shape->logits_bytes = (size_t)logits;
    shape->sel_rows_bytes = (size_t)sel_rows;
    shape->sel_k_bytes = (size_t)sel_k;
    shape->sel_r_bytes = (size_t)sel_r;
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

int ddk_loss_check_selector(const ddk_loss_params *p, const int32_t *predecessors,
                            const int32_t *labels, const float *weights,
                            const float *grad_student)
{
    const ddk_selector *s = p->selector;
    if (!s)
        return 0;
    const int with_grads = grad_student != NULL;
    if (!predecessors || !s->A || !s->Bs || !s->Hp || (s->dA != NULL) != with_grads ||
        (s->dBs != NULL) != with_grads || (s->dHp != NULL) != with_grads)
        return -EINVAL;
    for (int64_t i = 0; i < p->n; i++) {
        const float w = weights ? weights[i] : 1.0f;
        if ((labels && labels[i] < 0) || !(w > 0.0f))
            continue;   /* not counted: its predecessor is never read */
        if (predecessors[i] < 0 || predecessors[i] >= p->vocab)
            return -EINVAL;
    }
    return 0;
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
