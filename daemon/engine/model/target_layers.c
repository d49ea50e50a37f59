/* target_layers.c: what both frozen targets (target_dense.c with target_dense_cache.c, and
 * target_qwen35.c) share (target_layers.h): the products and embedding on the weights' storage
 * (ddt_target_linear, with an fp32 CPU target's plain-C matrix-vector product for a decode
 * step), the token ids' upload, the SwiGLU MLP and the taps, a tree rollback's compaction of
 * keys and values, and the staged loading of a tensor (ddt_weight_put: a bounded host buffer,
 * page-locked for a GPU, converted, narrowed to bf16, q_proj's rows reordered, then the
 * backend's copy).
 * Tested through both targets: tests/oracle/features_torch_check.py, tests/engine/test_engine.c,
 * tests/engine/data/test_source.c (the dense one), tests/engine/model/test_qwen35.c, tests/oracle/qwen35_features_check.py (the
 * qwen3_5 one) and tests/engine/model/test_target_cuda.c (both on a GPU).
 *
 * Legend: as target.h.
 */
#include "target_layers.h"
#include "target_vec8.h"
#include "ddk_bf16.h"
#include "ddk_rng.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * Products, embedding, token ids
 */

int ddt_target_host_backend(const ddk_backend *be)
{
    return !strcmp(be->name, "cpu");
}

/* y (out) = W x (+ y when accumulate), W (out, in): 4 rows at a time, sharing the loads of x */
static void matvec(const float *W, const float *x, int64_t out, int64_t in, int accumulate, float *y)
{
    int64_t o = 0;
    for (; o + 4 <= out; o += 4) {
        const float *w0 = W + o * in, *w1 = w0 + in, *w2 = w1 + in, *w3 = w2 + in;
        ddt_v8 a0 = { 0 }, a1 = { 0 }, a2 = { 0 }, a3 = { 0 };
        int64_t j = 0;
        for (; j + 8 <= in; j += 8) {
            const ddt_v8 xj = DDT_LOAD8(x + j);
            a0 += DDT_LOAD8(w0 + j) * xj;
            a1 += DDT_LOAD8(w1 + j) * xj;
            a2 += DDT_LOAD8(w2 + j) * xj;
            a3 += DDT_LOAD8(w3 + j) * xj;
        }
        float s[4] = { ddt_sum8(&a0), ddt_sum8(&a1), ddt_sum8(&a2), ddt_sum8(&a3) };
        for (; j < in; j++) {
            s[0] += w0[j] * x[j];
            s[1] += w1[j] * x[j];
            s[2] += w2[j] * x[j];
            s[3] += w3[j] * x[j];
        }
        for (int r = 0; r < 4; r++)
            y[o + r] = (accumulate ? y[o + r] : 0.0f) + s[r];
    }
    for (; o < out; o++)
        y[o] = (accumulate ? y[o] : 0.0f) + ddt_dot(W + o * in, x, in);
}

/* A decode step (n = 1) is a matrix-vector product, which OpenBLAS's sgemm does by packing all
 * of W first: matvec is faster at every size tried (2x on a 2048-hidden, 32K-vocabulary
 * target, BLAS on 2 threads). */
void ddt_target_linear(const ddk_backend *be, int w16, int fast, int64_t n, int64_t out, int64_t in,
                       const float *x, const void *W, int accumulate, float *y)
{
    if (w16)
        be->matmul_w16(be, n, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
    else if (n > 1 || !fast)
        be->matmul(be, 0, 1, n, out, in, 1.0f, x, in, W, in, accumulate ? 1.0f : 0.0f, y, out);
    else
        matvec(W, x, out, in, accumulate, y);
}

void ddt_target_embed(const ddk_backend *be, int w16, const void *table, const int32_t *ids, int64_t rows,
                      int64_t H, float *out)
{
    if (w16)
        be->embedding_w16(be, table, ids, rows, H, out);
    else
        be->embedding(be, table, ids, rows, H, out);
}

void ddt_target_put_ids(const ddk_backend *be, const int32_t *tokens, int64_t n, int64_t p0, const int32_t *parents,
                        int32_t *dst)
{
    const int64_t count = (parents ? 3 : 2) * n;
    int32_t *host = ddt_target_host_backend(be) ? dst : malloc((size_t)count * sizeof *host);
    if (!host)
        ddk_fatal(__FILE__, __LINE__, "no host memory for %lld token ids", (long long)n);
    memcpy(host, tokens, (size_t)n * sizeof *host);
    for (int64_t i = 0; i < n; i++)   /* a tree node's position: p0 + its depth (its parent's + 1) */
        host[n + i] = (int32_t)(parents ? (parents[i] < 0 ? p0 : host[n + parents[i]] + 1) : p0 + i);
    if (parents)
        memcpy(host + 2 * n, parents, (size_t)n * sizeof *host);
    if (host != dst) {
        be->copy(be, dst, host, (size_t)count * sizeof *host);
        be->synchronize(be);   /* before the host buffer goes */
        free(host);
    }
}

/* ------------------------------------------------------------------------------------------
 * Loading through a staging buffer
 */

enum { STAGING_FLOATS = 1 << 24 };   /* 64 MiB: a tensor larger than this goes in pieces */

size_t ddt_weight_slot_bytes(int64_t numel, int w16, int bf16_block)
{
    const size_t bytes = (size_t)numel * (w16 ? sizeof(uint16_t) : sizeof(float));
    return bf16_block ? (bytes + 15) / 16 * 16 : bytes;
}

int ddt_weight_stager_init(ddt_weight_stager *s, const ddk_backend *be, int64_t max_numel)
{
    memset(s, 0, sizeof *s);
    s->be = be;
    s->floats = max_numel < STAGING_FLOATS ? (max_numel > 0 ? max_numel : 1) : STAGING_FLOATS;
    s->pinned = !ddt_target_host_backend(be);
    s->buf = s->pinned ? ddk_host_alloc_pinned((size_t)s->floats * sizeof(float))
                       : malloc((size_t)s->floats * sizeof(float));
    return s->buf ? 0 : -ENOMEM;
}

void ddt_weight_stager_free(ddt_weight_stager *s)
{
    if (s->pinned)
        ddk_host_free_pinned(s->buf);
    else
        free(s->buf);
    s->buf = NULL;
}

void ddt_weight_put(ddt_weight_stager *s, const ddt_weight_src *src, void *dst)
{
    const int64_t rows = src->rows, cols = src->cols, esize = src->w16 ? 2 : 4,
                  run = src->split_rows > 0 ? src->split_rows : rows,
                  per = s->floats / cols > 0 ? s->floats / cols : 1;   /* rows a piece */
    uint64_t rng = src->seed;
    if (cols > s->floats)   /* a stager holds a row at least (ddt_weight_stager_init's bound) */
        ddk_fatal(__FILE__, __LINE__, "a weight row of %lld values passes the staging buffer", (long long)cols);
    for (int64_t r = 0; r < rows;) {
        const int64_t run_end = (r / run + 1) * run < rows ? (r / run + 1) * run : rows,
                      n = per < run_end - r ? per : run_end - r, count = n * cols;
        float *v = s->buf;
        if (src->st)
            ddt_st_range_to_f32(src->st, r * cols, count, v);
        else
            for (int64_t i = 0; i < count; i++)
                v[i] = src->std > 0 ? (float)(src->std * ddk_rng_normal(&rng)) : src->fill;
        for (int64_t i = 0; src->add != 0.0f && i < count; i++)
            v[i] += src->add;
        int64_t to = r;
        if (src->split_rows > 0) {   /* run k: head k / 2, its a (k even) or b rows */
            const int64_t k = r / run;
            to = (k % 2) * (rows / 2) + (k / 2) * run + r % run;
        }
        if (src->w16)   /* narrowed in place, front to back (through memcpy: no aliasing) */
            for (int64_t i = 0; i < count; i++) {
                const uint16_t b = ddk_f32_to_bf16(v[i]);
                memcpy((char *)v + i * 2, &b, sizeof b);
            }
        s->be->copy(s->be, (char *)dst + to * cols * esize, v, (size_t)(count * esize));
        if (s->pinned)
            s->be->synchronize(s->be);   /* before the buffer is rewritten */
        r += n;
    }
}

/* ------------------------------------------------------------------------------------------
 * The forwards' MLP and taps, a tree rollback's keys and values
 */

void ddt_target_mlp(const ddk_backend *be, int bf16, int fast, const float *u, const void *gate_proj,
                    const void *up_proj, const void *down_proj, int64_t T, int64_t H, int64_t I, float *gate,
                    float *up, float *x)
{
    ddt_target_linear(be, bf16, fast, T, I, H, u, gate_proj, 0, gate);
    ddt_target_linear(be, bf16, fast, T, I, H, u, up_proj, 0, up);
    be->swiglu(be, gate, up, T * I, gate);
    ddt_target_linear(be, bf16, fast, T, H, I, gate, down_proj, 1, x);   /* residual */
}

void ddt_target_tap(const ddk_backend *be, const float *x, int64_t T, int64_t H, int64_t l,
                    const int32_t *tap_ids, int n_taps, float *features)
{
    for (int i = 0; features && i < n_taps; i++)
        if (tap_ids[i] == l)
            be->copy_rows(be, features + i * H, n_taps * H, x, H, T, H);
}

void ddt_target_kv_compact(const ddk_backend *be, float *keys, float *values, int64_t kvd, int64_t p0,
                           const int32_t *path, int64_t n)
{
    const size_t row = (size_t)kvd * sizeof(float);
    for (int64_t k = 0; k < n; k++)
        if (path[k] != k) {
            be->copy(be, keys + (p0 + k) * kvd, keys + (p0 + path[k]) * kvd, row);
            be->copy(be, values + (p0 + k) * kvd, values + (p0 + path[k]) * kvd, row);
        }
}
