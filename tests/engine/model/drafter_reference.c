/* drafter_reference.c: the float64 reference of drafter_reference.h, SPEC.md sections 1, 2 and
 * 2.1 written out one formula at a time. Tested by tests/engine/model/test_drafter_reference.c
 * (which also checks it against hand-made facts: a DFlash2 drafter at its initialisation gives
 * DFlash's hidden states).
 */
#include "drafter_reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct ref {
    const ddt_drafter_config *c;
    const double *params;
    ddt_param table[DDT_MAX_PARAMS];
    int count;
} ref;

/* the tensor called fmt (with the layer number) */
static const double *T(const ref *r, const char *fmt, int layer)
{
    char name[96];
    snprintf(name, sizeof name, fmt, layer);
    for (int i = 0; i < r->count; i++)
        if (!strcmp(r->table[i].name, name))
            return r->params + r->table[i].offset;
    fprintf(stderr, "drafter_reference: no tensor %s\n", name);
    abort();
}

/* y (n) = x / sqrt(mean(x^2) + eps) * g */
static void rms(const double *x, const double *g, int64_t n, double eps, double *y)
{
    double ss = 0;
    for (int64_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = x[i] * s * g[i];
}

/* y (out) = W x with W (out, in) */
static void mv(const double *W, const double *x, int64_t out, int64_t in, double *y)
{
    for (int64_t o = 0; o < out; o++) {
        double s = 0;
        for (int64_t i = 0; i < in; i++)
            s += W[o * in + i] * x[i];
        y[o] = s;
    }
}

/* rotate-half RoPE of one head (d) at position pos */
static void rope(double *x, int64_t d, int64_t pos, double theta)
{
    for (int64_t i = 0; i < d / 2; i++) {
        const double ang = (double)pos * pow(theta, -2.0 * (double)i / (double)d);
        const double a = x[i], b = x[i + d / 2];
        x[i] = a * cos(ang) - b * sin(ang);
        x[i + d / 2] = a * sin(ang) + b * cos(ang);
    }
}

/* y (B, H) = conv(x; base, delta) over one block: base (taps, H), delta (B, taps, G) with row
 * stride ld (SPEC.md 2.1) */
static void conv(const ddt_drafter_config *c, const double *x, const double *base, const double *delta,
                 int64_t ld, double *y)
{
    const int64_t B = c->block_size, H = c->hidden, gs = c->conv_group_size, G = H / gs;
    for (int64_t t = 0; t < B; t++)
        for (int64_t ch = 0; ch < H; ch++) {
            double s = 0;
            for (int64_t j = 0; j < c->conv_taps && j <= t; j++)
                s += (base[j * H + ch] + delta[t * ld + j * G + ch / gs]) * x[(t - j) * H + ch];
            y[t * H + ch] = s;
        }
}

/* One kept block j of sequence s through the layers: hs (B, H). ctx (S, H) the context C. */
static void block_forward(const ref *r, const ddt_batch *b, int64_t s, int64_t j, const double *ctx,
                          const float *embed, double *hs)
{
    const ddt_drafter_config *c = r->c;
    const int64_t H = c->hidden, B = c->block_size, S = b->S, nh = c->heads, nkv = c->kv_heads,
                  d = c->head_dim, I = c->intermediate, P2 = 2 * c->conv_taps * ddt_conv_groups(c),
                  TG = c->conv_taps * ddt_conv_groups(c);
    const double eps = c->rms_norm_eps, theta = c->rope_theta;
    const int64_t a = b->anchors[s * b->A + j];
    const int32_t *x = b->input_ids + s * S;
    double *h = calloc((size_t)(B * H), sizeof *h), *u = calloc((size_t)(B * H), sizeof *u),
           *ub = calloc((size_t)(B * H), sizeof *ub), *coef = calloc((size_t)(B * (P2 ? P2 : 1)), sizeof *coef),
           *q = calloc((size_t)(B * nh * d), sizeof *q), *kb = calloc((size_t)(B * nkv * d), sizeof *kb),
           *vb = calloc((size_t)(B * nkv * d), sizeof *vb), *kc = calloc((size_t)(S * nkv * d), sizeof *kc),
           *vc = calloc((size_t)(S * nkv * d), sizeof *vc), *att = calloc((size_t)(B * nh * d), sizeof *att),
           *o = calloc((size_t)(B * H), sizeof *o), *br = calloc((size_t)(B * H), sizeof *br),
           *g = calloc((size_t)I, sizeof *g), *up = calloc((size_t)I, sizeof *up),
           *sc = calloc((size_t)(S + B), sizeof *sc);
    for (int64_t k = 0; k < B; k++) {
        const int32_t tok = k == 0 ? x[a] : c->mask_token_id;
        for (int64_t i = 0; i < H; i++)
            h[k * H + i] = embed[(int64_t)tok * H + i];
    }
    for (int l = 0; l < (int)c->layers; l++) {
        /* attention */
        for (int64_t k = 0; k < B; k++)
            rms(h + k * H, T(r, "layers.%d.input_layernorm.weight", l), H, eps, u + k * H);
        if (c->dflash2) {
            for (int64_t k = 0; k < B; k++)
                mv(T(r, "layers.%d.attention_conv.kernel_projection.weight", l), u + k * H, P2, H, coef + k * P2);
            conv(c, u, T(r, "layers.%d.attention_conv.base_kernel", l), coef, P2, ub);
        } else
            memcpy(ub, u, sizeof(double) * (size_t)(B * H));
        const double *Wq = T(r, "layers.%d.self_attn.q_proj.weight", l), *Wk = T(r, "layers.%d.self_attn.k_proj.weight", l),
                     *Wv = T(r, "layers.%d.self_attn.v_proj.weight", l), *qn = T(r, "layers.%d.self_attn.q_norm.weight", l),
                     *kn = T(r, "layers.%d.self_attn.k_norm.weight", l);
        for (int64_t k = 0; k < B; k++) {
            mv(Wq, ub + k * H, nh * d, H, q + k * nh * d);
            mv(Wk, ub + k * H, nkv * d, H, kb + k * nkv * d);
            mv(Wv, ub + k * H, nkv * d, H, vb + k * nkv * d);
            for (int64_t hh = 0; hh < nh; hh++) {
                double *qh = q + (k * nh + hh) * d;
                rms(qh, qn, d, eps, qh);
                rope(qh, d, a + k, theta);
            }
            for (int64_t hh = 0; hh < nkv; hh++) {
                double *kh = kb + (k * nkv + hh) * d;
                rms(kh, kn, d, eps, kh);
                rope(kh, d, a + k, theta);
            }
        }
        for (int64_t t = 0; t < S; t++) {
            mv(Wk, ctx + t * H, nkv * d, H, kc + t * nkv * d);
            mv(Wv, ctx + t * H, nkv * d, H, vc + t * nkv * d);
            for (int64_t hh = 0; hh < nkv; hh++) {
                double *kh = kc + (t * nkv + hh) * d;
                rms(kh, kn, d, eps, kh);
                rope(kh, d, t, theta);
            }
        }
        const int64_t W = c->sliding[l] ? c->sliding_window : 0;
        for (int64_t k = 0; k < B; k++)
            for (int64_t hh = 0; hh < nh; hh++) {
                const int64_t kv = hh / (nh / nkv);
                const double *qh = q + (k * nh + hh) * d;
                double mx = -INFINITY;
                /* scores: context t visible when t < a (and the window), block slots o' */
                for (int64_t t = 0; t < S + B; t++) {
                    int sees;
                    const double *kh;
                    if (t < S) {
                        sees = t < a && (W == 0 || t >= a + k - (W - 1));
                        kh = kc + (t * nkv + kv) * d;
                    } else {
                        const int64_t o2 = t - S;
                        sees = W == 0 || c->dflash2 || o2 <= k;
                        kh = kb + (o2 * nkv + kv) * d;
                    }
                    double dot = 0;
                    for (int64_t i = 0; i < d; i++)
                        dot += qh[i] * kh[i];
                    sc[t] = sees ? dot / sqrt((double)d) : -INFINITY;
                    mx = fmax(mx, sc[t]);
                }
                double z = 0;
                for (int64_t t = 0; t < S + B; t++)
                    z += sc[t] == -INFINITY ? 0 : exp(sc[t] - mx);
                double *out = att + (k * nh + hh) * d;
                for (int64_t i = 0; i < d; i++)
                    out[i] = 0;
                for (int64_t t = 0; t < S + B; t++) {
                    if (sc[t] == -INFINITY)
                        continue;
                    const double p = exp(sc[t] - mx) / z;
                    const double *vh = t < S ? vc + (t * nkv + kv) * d : vb + ((t - S) * nkv + kv) * d;
                    for (int64_t i = 0; i < d; i++)
                        out[i] += p * vh[i];
                }
            }
        for (int64_t k = 0; k < B; k++)
            mv(T(r, "layers.%d.self_attn.o_proj.weight", l), att + k * nh * d, H, nh * d, o + k * H);
        if (c->dflash2)
            conv(c, o, T(r, "layers.%d.attention_conv.base_kernel", l) + c->conv_taps * H, coef + TG, P2, br);
        else
            memcpy(br, o, sizeof(double) * (size_t)(B * H));
        for (int64_t i = 0; i < B * H; i++)
            h[i] += br[i];
        /* MLP */
        for (int64_t k = 0; k < B; k++)
            rms(h + k * H, T(r, "layers.%d.post_attention_layernorm.weight", l), H, eps, u + k * H);
        if (c->dflash2) {
            for (int64_t k = 0; k < B; k++)
                mv(T(r, "layers.%d.mlp_conv.kernel_projection.weight", l), u + k * H, P2, H, coef + k * P2);
            conv(c, u, T(r, "layers.%d.mlp_conv.base_kernel", l), coef, P2, ub);
        } else
            memcpy(ub, u, sizeof(double) * (size_t)(B * H));
        for (int64_t k = 0; k < B; k++) {
            mv(T(r, "layers.%d.mlp.gate_proj.weight", l), ub + k * H, I, H, g);
            mv(T(r, "layers.%d.mlp.up_proj.weight", l), ub + k * H, I, H, up);
            for (int64_t i = 0; i < I; i++)
                g[i] = g[i] / (1.0 + exp(-g[i])) * up[i];
            mv(T(r, "layers.%d.mlp.down_proj.weight", l), g, H, I, o + k * H);
        }
        if (c->dflash2)
            conv(c, o, T(r, "layers.%d.mlp_conv.base_kernel", l) + c->conv_taps * H, coef + TG, P2, br);
        else
            memcpy(br, o, sizeof(double) * (size_t)(B * H));
        for (int64_t i = 0; i < B * H; i++)
            h[i] += br[i];
    }
    for (int64_t k = 0; k < B; k++)
        rms(h + k * H, T(r, "norm.weight", 0), H, eps, hs + k * H);
    free(h), free(u), free(ub), free(coef), free(q), free(kb), free(vb), free(kc), free(vc), free(att);
    free(o), free(br), free(g), free(up), free(sc);
}

/* z (V) = lm_head x */
static void logits(const float *W, const double *x, int64_t V, int64_t H, double *z)
{
    for (int64_t v = 0; v < V; v++) {
        double s = 0;
        for (int64_t i = 0; i < H; i++)
            s += (double)W[v * H + i] * x[i];
        z[v] = s;
    }
}

static double lse(const double *z, int64_t n, double scale)
{
    double mx = -INFINITY, s = 0;
    for (int64_t i = 0; i < n; i++)
        mx = fmax(mx, z[i] * scale);
    for (int64_t i = 0; i < n; i++)
        s += exp(z[i] * scale - mx);
    return mx + log(s);
}

static int64_t argmax(const double *z, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (z[i] > z[best])
            best = i;
    return best;
}

/* the selector's l_sel of one slot (SPEC.md 2.1), or -1 when the label has no term (strict) */
static double selector_term(const ref *r, const drafter_reference_loss *lc, const double *z,
                            const double *hsr, int32_t pred, int32_t y)
{
    const ddt_drafter_config *c = r->c;
    const int64_t V = c->vocab, K = c->selector_top_k, R = c->selector_rank, H = c->hidden;
    int64_t cand[DDK_SELECTOR_MAX_K];
    int taken_n = 0;
    char *taken = calloc((size_t)V, 1);
    for (int64_t k = 0; k < K; k++) {   /* descending, ties to the lower id */
        int64_t best = -1;
        for (int64_t v = 0; v < V; v++)
            if (!taken[v] && (best < 0 || z[v] > z[best]))
                best = v;
        taken[best] = 1;
        cand[taken_n++] = best;
    }
    free(taken);
    int64_t star = -1;
    for (int64_t k = 0; k < K; k++)
        if (cand[k] == y)
            star = k;
    if (star < 0) {
        if (!lc->selector_inject)
            return -1;
        cand[K - 1] = y;
        star = K - 1;
    }
    const double *A = T(r, "candidate_selector.predecessor_codebook", 0),
                 *Bs = T(r, "candidate_selector.successor_codebook", 0),
                 *Hp = T(r, "candidate_selector.hidden_projection.weight", 0);
    double q[4096], s[DDK_SELECTOR_MAX_K];
    mv(Hp, hsr, R, H, q);
    for (int64_t k = 0; k < K; k++) {
        double t = z[cand[k]];
        for (int64_t i = 0; i < R; i++)
            t += A[(int64_t)pred * R + i] * q[i] * Bs[cand[k] * R + i];
        s[k] = t;
    }
    return lse(s, K, 1.0) - s[star];
}

double drafter_reference(const ddt_drafter_config *c, const double *params, const float *embed,
                         const float *lm_head, const ddt_batch *b, const drafter_reference_loss *lc,
                         double *hs_out)
{
    ref r = { .c = c, .params = params };
    int64_t total;
    r.count = ddt_drafter_param_table(c, r.table, &total);
    const int64_t H = c->hidden, V = c->vocab, S = b->S, B = c->block_size, LH = c->taps * H;
    double *ctx = calloc((size_t)(S * H), sizeof *ctx), *xf = calloc((size_t)H, sizeof *xf),
           *X = calloc((size_t)LH, sizeof *X), *hs = calloc((size_t)(B * H), sizeof *hs),
           *th = calloc((size_t)H, sizeof *th), *zs = calloc((size_t)V, sizeof *zs),
           *zt = calloc((size_t)V, sizeof *zt), *frozen_z = calloc((size_t)V, sizeof *frozen_z);
    double wsum = 0, lsum = 0;
    for (int64_t s = 0; s < b->nseq; s++) {
        const int32_t *x = b->input_ids + s * S;
        const uint8_t *mask = b->loss_mask + s * S;
        for (int64_t t = 0; t < S; t++) {   /* C = RMSNorm(X fc^T; hidden_norm) */
            for (int64_t i = 0; i < LH; i++)
                X[i] = b->features[(s * S + t) * LH + i];
            mv(T(&r, "fc.weight", 0), X, H, LH, xf);
            rms(xf, T(&r, "hidden_norm.weight", 0), H, c->rms_norm_eps, ctx + t * H);
        }
        for (int64_t j = 0; j < b->A; j++) {
            const int64_t row0 = (s * b->A + j) * B;
            if (!b->keep[s * b->A + j]) {
                if (hs_out)
                    memset(hs_out + row0 * H, 0, sizeof(double) * (size_t)(B * H));
                continue;
            }
            block_forward(&r, b, s, j, ctx, embed, hs);
            if (hs_out)
                memcpy(hs_out + row0 * H, hs, sizeof(double) * (size_t)(B * H));
            const int64_t a = b->anchors[s * b->A + j];
            for (int64_t k = 1; k < B; k++) {
                const int64_t tgt = a + k;
                if (tgt >= S || !mask[tgt])
                    continue;
                const double w = exp(-(double)(k - 1) / lc->gamma) *
                                 (b->slot_scale ? b->slot_scale[(s * b->A + j) * B + k] : 1.0);
                logits(lm_head, hs + k * H, V, H, zs);
                const int teacher = b->teacher_hidden != NULL;
                if (teacher) {
                    for (int64_t i = 0; i < H; i++)
                        th[i] = b->teacher_hidden[(s * S + tgt - 1) * H + i];
                    logits(lm_head, th, V, H, zt);
                }
                const int32_t y = lc->ce_target_teacher ? (int32_t)argmax(zt, V) : x[tgt];
                const double ce = lse(zs, V, 1.0) - zs[y];
                double kl = 0, cap = 0;
                if (lc->kl_weight > 0) {
                    const double T_ = lc->kl_temperature, ls = lse(zs, V, 1 / T_), lt = lse(zt, V, 1 / T_);
                    for (int64_t v = 0; v < V; v++) {
                        const double lpt = zt[v] / T_ - lt, lps = zs[v] / T_ - ls;
                        kl += exp(lpt) * (lpt - lps);
                    }
                    kl *= T_ * T_;
                }
                if (argmax(zs, V) == y) {
                    const double Tc = lc->cap_temperature, lc_ = lse(zs, V, 1 / Tc);
                    for (int64_t v = 0; v < V; v++) {
                        const double lp = zs[v] / Tc - lc_;
                        cap -= exp(lp) * lp;
                    }
                }
                double l = (1 - lc->kl_weight) * ce + lc->kl_weight * kl + lc->cap_weight * cap;
                if (c->dflash2) {
                    const double *hsr = hs + k * H;
                    const double *z = zs;
                    if (lc->frozen_hs) {
                        hsr = lc->frozen_hs + (row0 + k) * H;
                        logits(lm_head, hsr, V, H, frozen_z);
                        z = frozen_z;
                    }
                    const double ls = selector_term(&r, lc, z, hsr, x[tgt - 1], y);
                    if (ls >= 0)
                        l += lc->selector_weight * ls;
                }
                wsum += w;
                lsum += w * l;
            }
        }
    }
    free(ctx), free(xf), free(X), free(hs), free(th), free(zs), free(zt), free(frozen_z);
    return wsum > 0 ? lsum / wsum : 0;
}
