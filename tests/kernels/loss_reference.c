/* loss_reference.c: the float64 reference of SPEC.md section 1 (see loss_reference.h).
 *
 * One position at a time, the whole vocabulary at once, every quantity in double:
 *   zs = W hs_i, zt = W ht_i                       (double dot products of the float inputs)
 *   y  = label, or argmax zt (ties: lowest index); ignored when y < 0 or w <= 0
 *   CE  = logsumexp(zs) - zs[y]
 *   KL  = T^2 sum_v pt_v (log pt_v - log ps_v),  pt = softmax(zt/T), ps = softmax(zs/T)
 *   CAP = c H(softmax(zs/Tc)),  c = [argmax zs == y]
 *   l   = (1-a) CE + a KL + lambda CAP,   loss = sum w l / sum w
 *   g   = (1-a)(softmax(zs) - onehot(y)) + a T (ps - pt) - lambda (c/Tc) pc (log pc + H(pc))
 *   d hs_i = (w_i / sum w) g W
 * With a selector (SPEC.md 2.1; K candidates, rank r, p_i = predecessors[i]):
 *   cand = the K ids of the largest zs (descending, ties: lowest id), found by K selections
 *   y among cand at k* (covered); not there: no term (strict), or (inject) cand[K-1] = y
 *   q = Hp hs_i (r);  s_k = zs[cand_k] + sum_r A[p_i, r] q_r Bs[cand_k, r]
 *   l_sel = logsumexp(s) - s[k*];  l += weight l_sel;  correct: cand[argmax s] == y
 *   ds_k = (w_i / sum w) weight (softmax(s)_k - [k = k*])
 *   d hs_i += sum_k ds_k W[cand_k] + dq Hp  (not with stop_gradient),  dq_r = sum_k ds_k A[p_i, r] Bs[cand_k, r]
 *   dHp += dq hs_i^T;  dA[p_i, r] += sum_k ds_k q_r Bs[cand_k, r];  dBs[cand_k, r] += ds_k A[p_i, r] q_r
 * Two places use an accurate form rather than the literal one, so that the reference stays
 * exact where ddk_loss_cpu() is tested hardest (p_y -> 1): log softmax adds the non-maximal
 * terms through log1p and never adds the maximum to that (CE = -log p_y), and p_y - 1 is
 * expm1(log p_y). Both are the same functions, computed without the cancellation that would
 * leave them only ~1e-16 * |z| absolute accuracy.
 *
 * Tested by test_loss.c: its gradient against central finite differences of its own loss in
 * double (which validates SPEC.md's gradient formulas); its values are cross-checked by the
 * library agreeing with it and, independently, with the PyTorch oracle (ctest loss_torch). The
 * selector's term: test_loss_selector.c, its gradients (hs, A, Bs, Hp) against central finite
 * differences of its own loss, and the library against it.
 */
#include "loss_reference.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Helpers on one logit vector (length V, double)
 */

/* the index of the largest x[v]; the lowest index on ties */
static int64_t argmax_d(const double *x, int64_t V)
{
    int64_t best = 0;
    for (int64_t v = 1; v < V; v++)
        if (x[v] > x[best])
            best = v;
    return best;
}

/* log softmax(x / temp), all V entries. Written as (x_v - x_m)/temp - log1p(sum_{u != m}
 * exp((x_u - x_m)/temp)) with m the argmax: the maximum's term is exactly 1 and is never added
 * to the tiny rest, and x_m is never added to log1p(rest) (37.5 + 1e-16 would be 37.5), so
 * log p_y stays accurate as p_y -> 1 where logsumexp(x) - x_y would keep only ~1e-15. */
static void log_softmax_d(const double *x, int64_t V, double temp, double *log_p)
{
    int64_t m = argmax_d(x, V);
    double rest = 0.0;
    for (int64_t v = 0; v < V; v++)
        if (v != m)
            rest += exp((x[v] - x[m]) / temp);
    double log_sum = log1p(rest);
    for (int64_t v = 0; v < V; v++)
        log_p[v] = (x[v] - x[m]) / temp - log_sum;
}

/* logits (V) = W (V, H) h (H), in double */
static void logits_d(const float *W, const float *h, int64_t V, int64_t H, double *z)
{
    for (int64_t v = 0; v < V; v++) {
        double acc = 0.0;
        for (int64_t k = 0; k < H; k++)
            acc += (double)W[v * H + k] * (double)h[k];
        z[v] = acc;
    }
}

/* ------------------------------------------------------------------------------------------
 * The selector's term of one position
 */

/* What one position's selector term gave */
typedef struct sel_position {
    double l_sel;        /* 0 without a term */
    int term, covered, correct;
} sel_position;

/* The term of position i (label y, weight w, logits zs (V) in double) and, when grad_row (H) is
 * given, its gradients times w (the caller divides everything by sum w): into grad_row (unless
 * stop_gradient) and into sg's arrays (any NULL). */
static sel_position sel_term(const ddk_loss_params *p, const float *hs_i, const float *W,
                             const double *zs, int64_t y, double w, int32_t pred,
                             double *grad_row, const loss_reference_sel_grads *sg)
{
    const ddk_selector *S = p->selector;
    const int64_t H = p->hidden, V = p->vocab, K = S->top_k, r = S->rank;
    int64_t cand[DDK_SELECTOR_MAX_K];
    double s[DDK_SELECTOR_MAX_K], ds[DDK_SELECTOR_MAX_K];
    sel_position o = { 0.0, 0, 0, 0 };

    /* the top K: K selections of the largest zs not taken yet, the lowest id on ties */
    for (int64_t k = 0; k < K; k++) {
        int64_t best = -1;
        for (int64_t v = 0; v < V; v++) {
            int taken = 0;
            for (int64_t j = 0; j < k; j++)
                taken |= cand[j] == v;
            if (!taken && (best < 0 || zs[v] > zs[best]))
                best = v;
        }
        cand[k] = best;
    }
    int64_t kstar = -1;
    for (int64_t k = 0; k < K; k++)
        if (cand[k] == y)
            kstar = k;
    o.covered = kstar >= 0;
    if (kstar < 0 && S->inject) {
        cand[K - 1] = y;
        kstar = K - 1;
    }
    if (kstar < 0)
        return o;
    o.term = 1;

    double *q = calloc((size_t)r, sizeof(double));   /* (r) Hp hs_i */
    double *dq = calloc((size_t)r, sizeof(double));  /* (r) */
    if (!q || !dq) {
        fprintf(stderr, "loss_reference: out of memory\n");
        exit(2);
    }
    const float *a = S->A + (int64_t)pred * r;   /* (r) A[p_i] */
    for (int64_t j = 0; j < r; j++)
        for (int64_t h = 0; h < H; h++)
            q[j] += (double)S->Hp[j * H + h] * hs_i[h];
    for (int64_t k = 0; k < K; k++) {
        s[k] = zs[cand[k]];
        for (int64_t j = 0; j < r; j++)
            s[k] += (double)a[j] * q[j] * S->Bs[cand[k] * r + j];
    }
    int64_t pick = 0;
    for (int64_t k = 1; k < K; k++)
        if (s[k] > s[pick])
            pick = k;
    double sum = 0.0;
    for (int64_t k = 0; k < K; k++)
        sum += exp(s[k] - s[pick]);
    o.l_sel = log(sum) + s[pick] - s[kstar];
    o.correct = pick == kstar;

    if (grad_row && S->weight > 0.0f) {
        for (int64_t k = 0; k < K; k++)
            ds[k] = w * S->weight * (exp(s[k] - s[pick]) / sum - (k == kstar ? 1.0 : 0.0));
        for (int64_t j = 0; j < r; j++)
            for (int64_t k = 0; k < K; k++)
                dq[j] += ds[k] * a[j] * S->Bs[cand[k] * r + j];
        if (!S->stop_gradient)
            for (int64_t h = 0; h < H; h++) {
                double acc = 0.0;
                for (int64_t k = 0; k < K; k++)
                    acc += ds[k] * W[cand[k] * H + h];
                for (int64_t j = 0; j < r; j++)
                    acc += dq[j] * S->Hp[j * H + h];
                grad_row[h] += acc;
            }
        if (sg && sg->dHp)
            for (int64_t j = 0; j < r; j++)
                for (int64_t h = 0; h < H; h++)
                    sg->dHp[j * H + h] += dq[j] * hs_i[h];
        if (sg && sg->dA)
            for (int64_t j = 0; j < r; j++)
                for (int64_t k = 0; k < K; k++)
                    sg->dA[pred * r + j] += ds[k] * q[j] * S->Bs[cand[k] * r + j];
        if (sg && sg->dBs)
            for (int64_t k = 0; k < K; k++)
                for (int64_t j = 0; j < r; j++)
                    sg->dBs[cand[k] * r + j] += ds[k] * a[j] * q[j];
    }
    free(q);
    free(dq);
    return o;
}

/* ------------------------------------------------------------------------------------------
 * The loss
 */

int loss_reference(const ddk_loss_params *p, const float *hs, const float *ht, const float *W,
                   const int32_t *labels, const float *weights, double *grad,
                   double *per_position, ddk_loss_result *out)
{
    return loss_reference_selector(p, hs, ht, W, labels, weights, grad, per_position, out, NULL);
}

int loss_reference_selector(const ddk_loss_params *p, const float *hs, const float *ht,
                            const float *W, const int32_t *labels, const float *weights,
                            double *grad, double *per_position, ddk_loss_result *out,
                            const loss_reference_sel_grads *sg)
{
    if (!p || !out || !hs || !W || p->n < 1 || p->hidden < 1 || p->vocab < 1)
        return -EINVAL;
    const int64_t n = p->n, H = p->hidden, V = p->vocab;
    const double a = p->kl_weight, T = p->kl_temperature;
    const double lambda = p->cap_weight, Tc = p->cap_temperature;
    const int needs_teacher = labels == NULL || a > 0.0;
    if (needs_teacher && !ht)
        return -EINVAL;
    if (labels)
        for (int64_t i = 0; i < n; i++)
            if (labels[i] >= V)
                return -EINVAL;
    const ddk_selector *S = p->selector;
    if (S) {
        if (!S->predecessors || !S->A || !S->Bs || !S->Hp || S->top_k < 1 || S->top_k > V ||
            S->top_k > DDK_SELECTOR_MAX_K || S->rank < 1)
            return -EINVAL;
        for (int64_t i = 0; i < n; i++) {
            int counts = (!labels || labels[i] >= 0) && (!weights || weights[i] > 0.0f);
            if (counts && (S->predecessors[i] < 0 || S->predecessors[i] >= V))
                return -EINVAL;
        }
        const int64_t r = S->rank;
        if (sg && sg->dA)
            memset(sg->dA, 0, (size_t)(V * r) * sizeof(double));
        if (sg && sg->dBs)
            memset(sg->dBs, 0, (size_t)(V * r) * sizeof(double));
        if (sg && sg->dHp)
            memset(sg->dHp, 0, (size_t)(r * H) * sizeof(double));
    }

    double *work = calloc((size_t)(7 * V), sizeof(double));
    if (!work)
        return -ENOMEM;
    double *zs = work;                   /* (V) student logits */
    double *zt = work + V;               /* (V) teacher logits */
    double *log_p = work + 2 * V;        /* (V) log softmax(zs) */
    double *log_ps = work + 3 * V;       /* (V) log softmax(zs / T) */
    double *log_pt = work + 4 * V;       /* (V) log softmax(zt / T) */
    double *log_pc = work + 5 * V;       /* (V) log softmax(zs / Tc) */
    double *g = work + 6 * V;            /* (V) d l_i / d zs */

    double weight_sum = 0.0, loss_sum = 0.0, ce_sum = 0.0, kl_sum = 0.0, cap_sum = 0.0;
    double sel_sum = 0.0;
    int64_t counted = 0, correct = 0, sel_covered = 0, sel_correct = 0;
    if (grad)
        memset(grad, 0, (size_t)(n * H) * sizeof(double));

    for (int64_t i = 0; i < n; i++) {
        if (per_position)
            per_position[i] = 0.0;
        logits_d(W, hs + i * H, V, H, zs);
        if (needs_teacher)
            logits_d(W, ht + i * H, V, H, zt);
        int64_t y = labels ? labels[i] : argmax_d(zt, V);
        double w = weights ? (double)weights[i] : 1.0;
        if (y < 0 || !(w > 0.0))
            continue;

        /* CE = logsumexp(zs) - zs[y] = -log softmax(zs)[y] */
        log_softmax_d(zs, V, 1.0, log_p);
        double ce = -log_p[y];

        /* KL (teacher to student, at temperature T) */
        double kl = 0.0;
        if (a > 0.0) {
            log_softmax_d(zs, V, T, log_ps);
            log_softmax_d(zt, V, T, log_pt);
            for (int64_t v = 0; v < V; v++) {
                double pt = exp(log_pt[v]);
                if (pt > 0.0)   /* pt log pt -> 0 as pt -> 0 */
                    kl += pt * (log_pt[v] - log_ps[v]);
            }
            kl *= T * T;
        }

        /* CAP: the entropy of softmax(zs/Tc) where the student's argmax is the label */
        int c = argmax_d(zs, V) == y;
        log_softmax_d(zs, V, Tc, log_pc);
        double entropy = 0.0;
        for (int64_t v = 0; v < V; v++) {
            double pc = exp(log_pc[v]);
            if (pc > 0.0)
                entropy -= pc * log_pc[v];
        }
        double cap = c ? entropy : 0.0;

        double l = (1.0 - a) * ce + a * kl + lambda * cap;
        /* the selector's term; its gradient into grad's row once the unary one is there */
        sel_position sp = { 0.0, 0, 0, 0 };
        if (S) {
            sp = sel_term(p, hs + i * H, W, zs, y, w, S->predecessors[i], NULL, NULL);
            l += S->weight * sp.l_sel;
            sel_sum += w * sp.l_sel;
            sel_covered += sp.covered;
            sel_correct += sp.correct;
        }
        if (per_position)
            per_position[i] = l;
        weight_sum += w;
        loss_sum += w * l;
        ce_sum += w * ce;
        kl_sum += w * kl;
        cap_sum += w * cap;
        counted++;
        correct += c;

        if (!grad)
            continue;
        for (int64_t v = 0; v < V; v++) {
            /* softmax - onehot; at the label p_y - 1 = expm1(log p_y), exact as p_y -> 1 */
            double ce_grad = v == y ? expm1(log_p[v]) : exp(log_p[v]);
            double kl_grad = a > 0.0 ? T * (exp(log_ps[v]) - exp(log_pt[v])) : 0.0;
            double cap_grad = c ? -(1.0 / Tc) * exp(log_pc[v]) * (log_pc[v] + entropy) : 0.0;
            g[v] = (1.0 - a) * ce_grad + a * kl_grad + lambda * cap_grad;
        }
        /* grad_i = w_i g W; divided by sum w once all positions are seen */
        for (int64_t k = 0; k < H; k++) {
            double acc = 0.0;
            for (int64_t v = 0; v < V; v++)
                acc += g[v] * (double)W[v * H + k];
            grad[i * H + k] = w * acc;
        }
        if (S && sp.term)   /* again, now for its gradients */
            sel_term(p, hs + i * H, W, zs, y, w, S->predecessors[i], grad + i * H, sg);
    }

    memset(out, 0, sizeof(*out));
    out->weight_sum = weight_sum;
    out->counted = counted;
    out->correct = correct;
    out->sel_covered = sel_covered;
    out->sel_correct = sel_correct;
    if (counted > 0) {
        out->loss = loss_sum / weight_sum;
        out->ce = ce_sum / weight_sum;
        out->kl = kl_sum / weight_sum;
        out->cap = cap_sum / weight_sum;
        out->sel = sel_sum / weight_sum;
        if (grad)
            for (int64_t j = 0; j < n * H; j++)
                grad[j] /= weight_sum;
        if (S && sg) {   /* d loss / d (A, Bs, Hp): the same division */
            const int64_t r = S->rank;
            for (int64_t j = 0; sg->dA && j < V * r; j++)
                sg->dA[j] /= weight_sum;
            for (int64_t j = 0; sg->dBs && j < V * r; j++)
                sg->dBs[j] /= weight_sum;
            for (int64_t j = 0; sg->dHp && j < r * H; j++)
                sg->dHp[j] /= weight_sum;
        }
    }
    free(work);
    return 0;
}
