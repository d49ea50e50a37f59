/* selector_cpu.c: the DFlash2 path selector's term inside the CPU's fused loss (SPEC.md 2.1),
 * called by loss_cpu.c chunk by chunk; nothing logit-sized of its own (the workspace's
 * ddk_loss_sel_buffers: (chunk, K) and (chunk, r) buffers).
 *
 * Per chunk:
 *   - the vocabulary pass: each tile's logits merged into each row's online top-K (vector_cpu.c's
 *     ddk_cpu_topk_merge, topk_row.h's order: ties to the lower id, so the candidates are the same
 *     for every chunk and vocab_tile), keeping their zs (cz): the materialised gradient overwrites
 *     the logits;
 *   - q = hs Hp^T, one (m, H) x (H, r) product; then per row (after its unary terms) the label
 *     placed among the candidates, u = A[p] * q, s_k = cz_k + u . Bs[cand_k], and
 *     selector_row.h's l_sel and ds; with gradients b = sum_k ds_k Bs[cand_k], dq = A[p] * b and
 *     q * b (dA's row, over q);
 *   - the gradient pass: ds_k added into the gradient row g at column cand_k before g's product
 *     with W (so d hs gets ds_k W[cand_k] with no gather of W's rows), in whichever tile holds it;
 *   - after it: d hs += dq Hp (m, r) x (r, H), dHp += dq^T hs (r, m) x (m, H), and dA's and dBs's
 *     rows added in row order (deterministic).
 * The products are the loss's (be->matmul, or matmul_bf16 with bf16_products); the rest is plain
 * float loops (r and K are small: 3 (m, r, H) products and O(m K r) against the loss's O(m V H)).
 * stop_gradient keeps ds and dq out of d hs; weight 0 computes and reports the term, no gradient.
 *
 * Tested by tests/kernels/test_loss_selector.c (against the float64 reference, finite
 * differences, chunk and vocab_tile invariance, ties, stop_gradient, weight 0 and the bf16 head).
 *
 * Legend: m rows of the chunk, H hidden, K candidates, r the selector's rank, w tile width.
 */
#include "selector_cpu.h"
#include "cpu_backend.h"    /* ddk_cpu_topk_merge */
#include "selector_row.h"   /* the K-long arithmetic, the CUDA kernels' too */

#include <string.h>

void ddk_cpu_sel_tile(const ddk_cpu_selector *S, const ddk_loss_row *rows, int64_t m,
                      const float *zs, int64_t off, int64_t w)
{
    const int K = (int)S->K;
    for (int64_t i = 0; i < m; i++) {
        if (rows[i].ignored)
            continue;
        /* every column enters while the list has room: off columns seen so far */
        int count = off < K ? (int)off : K;
        ddk_cpu_topk_merge(zs + i * w, w, off, K, S->b.cz + i * K, S->b.cand + i * K, &count);
    }
}

void ddk_cpu_sel_project(const ddk_cpu_selector *S, const float *hs, int64_t m)
{
    S->product(S->be, 0, 1, m, S->r, S->H, 1.0f, hs, S->H, S->s->Hp, S->H, 0.0f, S->b.q, S->r);
}

double ddk_cpu_sel_row(const ddk_cpu_selector *S, int64_t i, const ddk_loss_row *row,
                       int32_t predecessor, double scale)
{
    const int64_t K = S->K, r = S->r;
    ddk_loss_sel_row *R = &S->b.rows[i];
    int32_t *cand = S->b.cand + i * K;    /* (K) */
    float *cz = S->b.cz + i * K;          /* (K) */
    float *s = S->b.ds + i * K;           /* (K) the scores, then ds */
    float *q = S->b.q + i * r;            /* (r) */
    float *u = S->b.u + i * r;            /* (r) */
    float *dq = S->b.dq + i * r;          /* (r) */
    memset(R, 0, sizeof *R);
    R->kstar = -1;
    if (S->grads)
        memset(dq, 0, (size_t)r * sizeof(float));   /* the products read every row */
    if (row->ignored)
        return 0.0;
    R->kstar = ddk_sel_place_label(cand, cz, (int)K, row->label, row->z_label, S->s->inject,
                                   &R->covered);
    if (R->kstar < 0)
        return 0.0;

    const float *a = S->s->A + (int64_t)predecessor * r;   /* (r) A[p] */
    for (int64_t j = 0; j < r; j++)
        u[j] = a[j] * q[j];
    for (int64_t k = 0; k < K; k++) {
        const float *bs = S->s->Bs + (int64_t)cand[k] * r;   /* (r) Bs[cand_k] */
        float dot = 0.0f;
        for (int64_t j = 0; j < r; j++)
            dot += u[j] * bs[j];
        s[k] = cz[k] + dot;
    }
    int pick;
    R->l_sel = ddk_sel_terms(s, (int)K, R->kstar, scale * S->s->weight, S->grads, &pick);
    R->correct = pick == R->kstar;
    if (!S->grads)
        return R->l_sel;

    /* b = sum_k ds_k Bs[cand_k] (summed in dq, in k order); dq = A[p] * b; q * b is dA's row
     * (over q) */
    for (int64_t k = 0; k < K; k++) {
        const float *bs = S->s->Bs + (int64_t)cand[k] * r;   /* (r) Bs[cand_k] */
        for (int64_t j = 0; j < r; j++)
            dq[j] += s[k] * bs[j];
    }
    for (int64_t j = 0; j < r; j++) {
        const float b = dq[j];
        dq[j] = a[j] * b;
        q[j] *= b;
    }
    return R->l_sel;
}

void ddk_cpu_sel_grad_tile(const ddk_cpu_selector *S, int64_t i, float *g, int64_t off,
                           int64_t w)
{
    if (S->b.rows[i].kstar < 0)
        return;
    const int32_t *cand = S->b.cand + i * S->K;
    const float *ds = S->b.ds + i * S->K;
    for (int64_t k = 0; k < S->K; k++)
        if (cand[k] >= off && cand[k] < off + w)
            g[cand[k] - off] += ds[k];
}

void ddk_cpu_sel_backward(const ddk_cpu_selector *S, const float *hs, int64_t m,
                          const int32_t *predecessors, float *dhs)
{
    const int64_t H = S->H, K = S->K, r = S->r;
    const ddk_selector *s = S->s;
    if (S->to_hidden)   /* d hs (m, H) += dq (m, r) Hp (r, H) */
        S->product(S->be, 0, 0, m, H, r, 1.0f, S->b.dq, r, s->Hp, H, 1.0f, dhs, H);
    /* dHp (r, H) += dq^T (r, m) hs (m, H) */
    S->product(S->be, 1, 0, r, H, m, 1.0f, S->b.dq, r, hs, H, 1.0f, s->dHp, H);
    for (int64_t i = 0; i < m; i++) {
        if (S->b.rows[i].kstar < 0)
            continue;
        const float *qb = S->b.q + i * r, *u = S->b.u + i * r;   /* (r) q * b, A[p] * q */
        float *da = s->dA + (int64_t)predecessors[i] * r;       /* (r) dA[p] */
        for (int64_t j = 0; j < r; j++)
            da[j] += qb[j];
        for (int64_t k = 0; k < K; k++) {
            const float ds = S->b.ds[i * K + k];
            float *dbs = s->dBs + (int64_t)S->b.cand[i * K + k] * r;   /* (r) dBs[cand_k] */
            for (int64_t j = 0; j < r; j++)
                dbs[j] += ds * u[j];
        }
    }
}
