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
 * Two places use an accurate form rather than the literal one, so that the reference stays
 * exact where ddk_loss_cpu() is tested hardest (p_y -> 1): log softmax adds the non-maximal
 * terms through log1p and never adds the maximum to that (CE = -log p_y), and p_y - 1 is
 * expm1(log p_y). Both are the same functions, computed without the cancellation that would
 * leave them only ~1e-16 * |z| absolute accuracy.
 *
 * Tested by test_loss.c: its gradient against central finite differences of its own loss in
 * double (which validates SPEC.md's gradient formulas); its values are cross-checked by the
 * library agreeing with it and, independently, with the PyTorch oracle (ctest loss_torch).
 */
#include "loss_reference.h"

#include <errno.h>
#include <math.h>
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
 * The loss
 */

int loss_reference(const ddk_loss_params *p, const float *hs, const float *ht, const float *W,
                   const int32_t *labels, const float *weights, double *grad,
                   double *per_position, ddk_loss_result *out)
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
    int64_t counted = 0, correct = 0;
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
    }

    memset(out, 0, sizeof(*out));
    out->weight_sum = weight_sum;
    out->counted = counted;
    out->correct = correct;
    if (counted > 0) {
        out->loss = loss_sum / weight_sum;
        out->ce = ce_sum / weight_sum;
        out->kl = kl_sum / weight_sum;
        out->cap = cap_sum / weight_sum;
        if (grad)
            for (int64_t j = 0; j < n * H; j++)
                grad[j] /= weight_sum;
    }
    free(work);
    return 0;
}
