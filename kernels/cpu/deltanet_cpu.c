/* deltanet_cpu.c: the Gated DeltaNet layer's own ops on the CPU (SPEC.md section 3.1), forward
 * only: the causal depthwise conv1d + silu in front of it, and its core, the gated delta rule,
 * both as the token-by-token recurrence (decoding) and in the exact chunked form (prefill).
 * Not here: the projections (matmul), the l2 norms, beta and g (the target's forward forms
 * them), the gated output norm (norm_cpu.c).
 *
 * Precision (SPEC.md: the state and the chunk algebra are fp32): every product, solve and state
 * update is float32. The one exception is the chunk's cumulative log decay c_i, summed in double:
 * c reaches -100 and more inside a chunk of strong decays, where float's absolute error (1e-5)
 * would enter every exp(c_i - c_j) as a relative error of that size; in double the differences
 * are exact to float's last bit, and the chunked form agrees with the recurrence to rounding.
 * Tested by tests/kernels/test_ops.c (float64 references of both ops; chunk 1, 3, 64 and > T against
 * the recurrence, the state out included).
 *
 * Legend: T tokens, C channels (conv) or the chunk's length (Lc <= chunk), K taps; nk / nv key
 * / value heads, dk / dv their dims; value head j reads key head j / (nv / nk).
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <errno.h>
#include <math.h>
#include <string.h>

static inline float silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* ------------------------------------------------------------------------------------------
 * Causal depthwise conv1d + silu
 */

void ddk_cpu_conv1d_silu(const ddk_backend *be, const float *x, const float *w, const float *history,
                         int64_t T, int64_t C, int64_t K, float *y)
{
    for (int64_t t = 0; t < T; t++)
        for (int64_t c = 0; c < C; c++) {
            const float *wc = w + c * K;   /* (K): tap m reads row t - (K-1) + m */
            float acc = 0.0f;
            for (int64_t m = 0; m < K; m++) {
                const int64_t s = t - (K - 1) + m;
                const float xs = s >= 0 ? x[s * C + c] : history ? history[(K - 1 + s) * C + c] : 0.0f;
                acc += wc[m] * xs;
            }
            y[t * C + c] = silu(acc);
        }
}

/* ------------------------------------------------------------------------------------------
 * The gated delta rule: the recurrence
 */

/* One token of value head j: S (dk, dv) decayed, corrected toward v along k, read along q.
 * u (dv) is scratch. */
static void delta_token(float *S, const float *q, const float *k, const float *v, float beta,
                        float g, int64_t dk, int64_t dv, float *u, float *o)
{
    const float decay = expf(g);
    for (int64_t c = 0; c < dv; c++)
        u[c] = 0.0f;
    for (int64_t r = 0; r < dk; r++) {   /* S = exp(g) S; u = S^T k */
        float *Sr = S + r * dv;
        for (int64_t c = 0; c < dv; c++) {
            Sr[c] *= decay;
            u[c] += Sr[c] * k[r];
        }
    }
    for (int64_t c = 0; c < dv; c++)     /* u = beta (v - S^T k) */
        u[c] = beta * (v[c] - u[c]);
    for (int64_t c = 0; c < dv; c++)
        o[c] = 0.0f;
    for (int64_t r = 0; r < dk; r++) {   /* S += k u^T; o = S^T q */
        float *Sr = S + r * dv;
        for (int64_t c = 0; c < dv; c++) {
            Sr[c] += k[r] * u[c];
            o[c] += Sr[c] * q[r];
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * The gated delta rule: the chunked form (SPEC.md 3.1), one chunk of Lc tokens of one head
 */

typedef struct delta_chunk_ws {
    double *c;       /* (chunk) cumulative log decay */
    float *U;        /* (chunk, dv): (I + A)^-1 diag(beta) V, then Un = U - W S */
    float *W;        /* (chunk, dk): (I + A)^-1 diag(beta exp(c)) K */
} delta_chunk_ws;

static float dot(const float *a, const float *b, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

/* q, k at row stride qs (nk dk), v, o at vs (nv dv), beta, g at gs (nv); S (dk, dv) in/out */
static void delta_chunk(float *S, const float *q, const float *k, const float *v, const float *beta,
                        const float *g, int64_t Lc, int64_t qs, int64_t vs, int64_t gs, int64_t dk,
                        int64_t dv, const delta_chunk_ws *ws, float *o)
{
    double *c = ws->c;
    float *U = ws->U, *W = ws->W;
    double run = 0.0;
    for (int64_t i = 0; i < Lc; i++)
        c[i] = run += g[i * gs];
    /* forward substitution of (I + A) U = diag(beta) V, (I + A) W = diag(beta exp(c)) K with
     * A[i,j] = beta_i (k_i . k_j) exp(c_i - c_j), j < i: row i needs rows j < i, already solved,
     * and A's row once, so it is formed on the way */
    for (int64_t i = 0; i < Lc; i++) {
        const float *ki = k + i * qs;
        float *Ui = U + i * dv, *Wi = W + i * dk;
        const float bi = beta[i * gs], ebi = bi * (float)exp(c[i]);
        for (int64_t e = 0; e < dv; e++)
            Ui[e] = bi * v[i * vs + e];
        for (int64_t e = 0; e < dk; e++)
            Wi[e] = ebi * ki[e];
        for (int64_t j = 0; j < i; j++) {
            const float a = bi * dot(ki, k + j * qs, dk) * (float)exp(c[i] - c[j]);
            const float *Uj = U + j * dv, *Wj = W + j * dk;
            for (int64_t e = 0; e < dv; e++)
                Ui[e] -= a * Uj[e];
            for (int64_t e = 0; e < dk; e++)
                Wi[e] -= a * Wj[e];
        }
    }
    /* Un = U - W S */
    for (int64_t i = 0; i < Lc; i++)
        for (int64_t r = 0; r < dk; r++) {
            const float wr = W[i * dk + r];
            const float *Sr = S + r * dv;
            for (int64_t e = 0; e < dv; e++)
                U[i * dv + e] -= wr * Sr[e];
        }
    /* O = diag(exp(c)) Q S + (E * (Q K^T)) Un, the diagonal included */
    for (int64_t i = 0; i < Lc; i++) {
        const float *qi = q + i * qs;
        float *oi = o + i * vs;
        const float eci = (float)exp(c[i]);
        for (int64_t e = 0; e < dv; e++)
            oi[e] = 0.0f;
        for (int64_t r = 0; r < dk; r++) {
            const float qr = eci * qi[r];
            const float *Sr = S + r * dv;
            for (int64_t e = 0; e < dv; e++)
                oi[e] += qr * Sr[e];
        }
        for (int64_t j = 0; j <= i; j++) {
            const float a = dot(qi, k + j * qs, dk) * (float)exp(c[i] - c[j]);
            const float *Uj = U + j * dv;
            for (int64_t e = 0; e < dv; e++)
                oi[e] += a * Uj[e];
        }
    }
    /* S_next = exp(c_last) S + (diag(exp(c_last - c)) K)^T Un */
    const double last = c[Lc - 1];
    const float el = (float)exp(last);
    for (int64_t r = 0; r < dk * dv; r++)
        S[r] *= el;
    for (int64_t i = 0; i < Lc; i++) {
        const float f = (float)exp(last - c[i]);
        const float *ki = k + i * qs, *Ui = U + i * dv;
        for (int64_t r = 0; r < dk; r++) {
            const float kr = f * ki[r];
            float *Sr = S + r * dv;
            for (int64_t e = 0; e < dv; e++)
                Sr[e] += kr * Ui[e];
        }
    }
}

int ddk_cpu_gated_delta(const ddk_backend *be, const ddk_delta_shape *shape, const float *q,
                        const float *k, const float *v, const float *beta, const float *g,
                        float *state, float *out)
{
    const int64_t T = shape->T, nk = shape->nk, nv = shape->nv, dk = shape->dk, dv = shape->dv,
                  chunk = shape->chunk;
    if (T < 0 || nk < 1 || nv < 1 || dk < 1 || dv < 1 || chunk < 0 || nv % nk)
        return -EINVAL;
    if (T == 0)
        return 0;
    const int64_t r = nv / nk, qs = nk * dk, vs = nv * dv;
    const int64_t Cn = chunk < T ? chunk : T;   /* the longest chunk */
    /* recurrence: u (dv); chunked: c (Cn doubles), U (Cn dv), W (Cn dk) */
    const size_t bytes = chunk == 0 ? (size_t)dv * sizeof(float)
                                    : (size_t)Cn * sizeof(double) + (size_t)(Cn * dv + Cn * dk) * sizeof(float);
    void *scratch = ddk_malloc(be->alloc, bytes);
    if (!scratch)
        return -ENOMEM;
    for (int64_t j = 0; j < nv; j++) {
        const int64_t i = j / r;   /* the key head value head j reads */
        float *S = state + j * dk * dv;
        if (chunk == 0) {
            for (int64_t t = 0; t < T; t++)
                delta_token(S, q + t * qs + i * dk, k + t * qs + i * dk, v + t * vs + j * dv,
                            beta[t * nv + j], g[t * nv + j], dk, dv, scratch, out + t * vs + j * dv);
            continue;
        }
        delta_chunk_ws ws;
        ws.c = scratch;
        ws.U = (float *)(ws.c + Cn);
        ws.W = ws.U + Cn * dv;
        for (int64_t t0 = 0; t0 < T; t0 += chunk) {
            const int64_t Lc = T - t0 < chunk ? T - t0 : chunk;
            delta_chunk(S, q + t0 * qs + i * dk, k + t0 * qs + i * dk, v + t0 * vs + j * dv,
                        beta + t0 * nv + j, g + t0 * nv + j, Lc, qs, vs, nv, dk, dv, &ws,
                        out + t0 * vs + j * dv);
        }
    }
    ddk_free(be->alloc, scratch, bytes);
    return 0;
}
