/* deltanet_cuda.cu: the Gated DeltaNet core of the Qwen3.5 / Qwen3.6 target on the GPU
 * (ddk.h, struct ddk_backend's gated_delta; SPEC.md section 3.1), forward only, fp32 state and
 * chunk algebra: the token-by-token recurrence (chunk = 0, decoding and verification) and the
 * exact chunked form (chunk >= 1, prefill), in the order of the CPU's deltanet_cpu.c.
 *
 * The one observation both kernels rest on: a value column of the state evolves alone. For
 * column e of S_j, the update u_e = beta (v_e - S[:, e] . k), S[:, e] += k u_e, o_e = S[:, e] . q
 * reads no other column; in the chunked form every product that involves S or V (K S, Q S, the
 * triangular solve's right-hand sides, the output, the state pass) is column by column too, and
 * only the small chunk matrices (K K^T, Q K^T, the decays) are shared. So a thread block owns
 * one value head and a slice of its value columns, holds that slice of the state (in registers
 * for the recurrence, in shared memory for the chunked form) for the whole sequence and never
 * talks to another block. Both kernels are deterministic for a given shape and GPU.
 *
 * Recurrence: grid (nv, ceil(dv / 8)), 4 warps of 32 threads; warp w owns columns
 * 8 by + 2w, +1; lane l holds rows l, l + 32, ... (NR = ceil(dk / 32) <= 8 of them) of both
 * columns in registers. Per token: the decay, S^T k and S^T q are register products and warp
 * shuffle sums (no shared memory, no barrier). k and q are read by every warp of the head from
 * L1/L2.
 *
 * Chunked: grid (nv, ceil(dv / 32)), 256 threads (8 warps); the block's 32 columns of S_j
 * (dk, 32) live in shared memory from the first chunk to the last. Per chunk of L <= 64 tokens
 * (c the cumulative log decay, in double as on the CPU; Kh, Qh the chunk's keys and queries):
 *   1. load K, Q (L, dk), V's slice (L, 32), beta, c, exp(c), exp(c_last - c)  | barrier
 *   2. A[i][j] = beta_i (k_i . k_j) exp(c_i - c_j) (j < i), P[i][j] = (q_i . k_j) exp(c_i - c_j)
 *      (j <= i); R = diag(beta) (V - diag(exp(c)) K S), O0 = diag(exp(c)) Q S    | barrier
 *   3. solve (I + A) Un = R by forward substitution and O = O0 + P Un on the way: warp w owns
 *      4 columns, lane l rows l and l + 32 in registers; step j broadcasts the finished row j of
 *      Un by a shuffle and every later row subtracts A[i][j] times it (row j is final at step j:
 *      its last update came at step j - 1) and every row i >= j adds P[i][j] times it   | barrier
 *   4. out = O; S = exp(c_last) S + (diag(exp(c_last - c)) K)^T Un
 * R folds the CPU's U - W S into one solve: (I + A)^-1 diag(beta) V - (I + A)^-1
 * diag(beta exp(c)) K S is (I + A)^-1 of the difference, so W (L, dk) is never formed; the
 * terms and the order of every sum are otherwise the CPU's (rounding aside, see the test).
 * A chunk longer than 64 tokens (chunk > 64, or > T) runs as chunks of 64: the chunked form is
 * exact for any chunk length, so this changes rounding only (within the test's tolerance against
 * the CPU's one long chunk). Shared memory: 8 L + 4 (2 L (dk | 1) + 32 dk + 196 L + 1) bytes,
 * 215,812 at dk = 256, L = 64 (inside H100/H200/B200's 232,448 opt-in; checked at compile time
 * below); rows of K, Q, A, P, R and O are padded to odd strides, so every access pattern above
 * is free of bank conflicts.
 *
 * On a GPU with less shared memory per block (RTX PRO 6000, sm_120: 99 KB) the chunk shrinks
 * until it fits: 46 tokens at dk = 128, 23 at dk = 256 (exact for any length; rounding only).
 * Limits: dk, dv <= 256 (DDK_CUDA_MAX_HEAD_DIM, as the attention kernels), nv % nk == 0, else
 * -EINVAL with nothing written. No op allocates. Not here
 * (speed later, measured; CONVENTIONS.md): tensor cores, bf16, sharing the chunk matrices
 * between a head's column blocks (each block forms them again: ceil(dv / 32) times), a parallel
 * scan over chunks.
 *
 * Tested by tests/kernels/test_backend_ops.c against the CPU backend (recurrence and chunks of 64 with a
 * short last chunk, dk = dv = 128 with nv = 2 nk, small and odd shapes, dk = dv = 256, and the
 * chunked form against the recurrence on the GPU itself; skipped without a GPU), and from these
 * sources through the SIMT emulation under each card's limits by tests/simt/test_simt_kernels.cpp.
 *
 * Legend: T tokens, nk / nv key / value heads, dk / dv their dims, value head j reads key head
 * j / (nv / nk); L the current chunk's tokens (<= lmax <= 64), i, jj tokens of the chunk, r a
 * key dim, cc a column of the block's slice (col = col0 + cc the value column).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "launch.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>

/* ------------------------------------------------------------------------------------------
 * Sizes
 */

enum {
    MAX_DIM = DDK_CUDA_MAX_HEAD_DIM,   /* dk, dv: ddk.h, as the attention kernels */
    /* recurrence */
    REC_WARPS = 4,                     /* warps per block */
    REC_COLS = 2,                      /* value columns per warp */
    REC_BLOCK_COLS = REC_WARPS * REC_COLS,
    /* chunked */
    CHUNK_MAX = 64,                    /* tokens per chunk at most: two rows per lane in step 3 */
    CHUNK_COLS = 32,                   /* value columns per block: one per lane in steps 2, 4 */
    CHUNK_THREADS = 256,
    CHUNK_WARPS = CHUNK_THREADS / 32,
    WARP_COLS = CHUNK_COLS / CHUNK_WARPS,   /* step 3's columns per warp */
    P_STRIDE = CHUNK_MAX + 1,          /* A, P rows: lanes reading A[lane][jj] hit 32 banks */
    R_STRIDE = CHUNK_COLS + 1,         /* R, O rows: lanes reading R[lane][cc] hit 32 banks */
};
static_assert(MAX_DIM <= 8 * 32, "the recurrence's largest instance (NR = 8) covers dk <= MAX_DIM");
static_assert(CHUNK_MAX <= 64, "step 3 holds rows lane and lane + 32");
static_assert(CHUNK_COLS == 32 && CHUNK_COLS % CHUNK_WARPS == 0, "a lane per column in steps 2, 4");

__device__ static float warp_sum(float v)
{
    for (int offset = 16; offset > 0; offset /= 2)
        v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
}

/* ------------------------------------------------------------------------------------------
 * The recurrence, token by token (chunk = 0). See the top comment for the layout. The decay is
 * exp in double rounded to float: the CPU's expf is correctly rounded in practice, CUDA's expf
 * is 2 ulp.
 */

template <int NR>   /* rows per lane: dk <= 32 NR */
__global__ static void __launch_bounds__(REC_WARPS * 32)
delta_recurrent_kernel(const float *q, const float *k,     /* (T, nk, dk) */
                       const float *v,                     /* (T, nv, dv) */
                       const float *beta, const float *g,  /* (T, nv) */
                       int64_t T, int64_t nk, int64_t nv, int dk, int dv,
                       float *state,                       /* (nv, dk, dv) in/out */
                       float *out)                         /* (T, nv, dv) */
{
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    const int64_t j = blockIdx.x, ih = j / (nv / nk);
    const int col0 = (int)blockIdx.y * REC_BLOCK_COLS + warp * REC_COLS;
    if (col0 >= dv)
        return;   /* the whole warp (col0 is the warp's): no barrier in this kernel */
    const int64_t qs = nk * dk, vs = nv * dv;
    float *Sj = state + j * dk * dv;   /* (dk, dv) */
    float S[NR][REC_COLS];
#pragma unroll
    for (int n = 0; n < NR; n++)
#pragma unroll
        for (int m = 0; m < REC_COLS; m++) {
            const int r = lane + 32 * n, col = col0 + m;
            S[n][m] = r < dk && col < dv ? Sj[(int64_t)r * dv + col] : 0.0f;
        }
    for (int64_t t = 0; t < T; t++) {
        const float *kt = k + t * qs + ih * dk, *qt = q + t * qs + ih * dk;   /* (dk) */
        float kr[NR], qr[NR];
#pragma unroll
        for (int n = 0; n < NR; n++) {
            const int r = lane + 32 * n;
            kr[n] = r < dk ? kt[r] : 0.0f;
            qr[n] = r < dk ? qt[r] : 0.0f;
        }
        const float decay = (float)exp((double)g[t * nv + j]), b = beta[t * nv + j];
        const float *vt = v + t * vs + j * dv;
        float *ot = out + t * vs + j * dv;
#pragma unroll
        for (int m = 0; m < REC_COLS; m++) {
            const int col = col0 + m;
            if (col >= dv)
                continue;   /* uniform over the warp */
            float u = 0.0f;   /* S = exp(g) S; u = S^T k */
#pragma unroll
            for (int n = 0; n < NR; n++) {
                S[n][m] *= decay;
                u += S[n][m] * kr[n];
            }
            u = b * (vt[col] - warp_sum(u));
            float o = 0.0f;   /* S += k u^T; o = S^T q */
#pragma unroll
            for (int n = 0; n < NR; n++) {
                S[n][m] += kr[n] * u;
                o += S[n][m] * qr[n];
            }
            o = warp_sum(o);
            if (lane == 0)
                ot[col] = o;
        }
    }
#pragma unroll
    for (int n = 0; n < NR; n++)
#pragma unroll
        for (int m = 0; m < REC_COLS; m++) {
            const int r = lane + 32 * n, col = col0 + m;
            if (r < dk && col < dv)
                Sj[(int64_t)r * dv + col] = S[n][m];
        }
}

/* ------------------------------------------------------------------------------------------
 * The chunked form (chunk >= 1). See the top comment for the steps and the layout.
 */

typedef struct delta_params {
    const float *q, *k;         /* (T, nk, dk) */
    const float *v;             /* (T, nv, dv) */
    const float *beta, *g;      /* (T, nv) */
    float *state;               /* (nv, dk, dv) in/out */
    float *out;                 /* (T, nv, dv) */
    int64_t T, nk, nv;
    int dk, dv;
    int lmax;                   /* tokens per chunk (the last one may be shorter) */
} delta_params;

/* K and Q rows: an odd stride, so lanes reading rows jj, jj + 1, ... at one dim hit 32 banks */
__host__ __device__ constexpr int key_stride(int dk)
{
    return dk | 1;
}

/* the chunked kernel's dynamic shared memory, in the order the kernel carves it */
__host__ __device__ constexpr size_t chunk_smem(int dk, int lmax)
{
    return (size_t)lmax * sizeof(double)                         /* c (lmax) */
           + sizeof(float) * ((size_t)2 * lmax * key_stride(dk)  /* K, Q (lmax, dk | 1) */
                              + (size_t)dk * CHUNK_COLS          /* S's slice (dk, 32) */
                              + (size_t)2 * lmax * P_STRIDE      /* A, P (lmax, 65) */
                              + (size_t)2 * lmax * R_STRIDE      /* R / Un, O (lmax, 33) */
                              + (size_t)3 * lmax                 /* beta, exp(c), exp(c_last - c) */
                              + 1);                              /* exp(c_last) */
}

/* H100 / H200 / B200: 227 KiB of shared memory per block (opt-in) */
enum { SMEM_OPTIN = 232448 };
static_assert(chunk_smem(MAX_DIM, CHUNK_MAX) <= SMEM_OPTIN, "the chunked form fits at dk = 256");

__global__ static void __launch_bounds__(CHUNK_THREADS) delta_chunked_kernel(delta_params p)
{
    DDK_DYNAMIC_SHARED(double, smem);
    const int lmax = p.lmax, dk = p.dk, dv = p.dv, ks = key_stride(dk);
    double *cs = smem;                            /* (lmax) cumulative log decay c */
    float *Ks = (float *)(cs + lmax);             /* (lmax, ks) the chunk's keys */
    float *Qs = Ks + lmax * ks;                   /* (lmax, ks) queries */
    float *Ss = Qs + lmax * ks;                   /* (dk, 32) the block's slice of S_j */
    float *Am = Ss + dk * CHUNK_COLS;             /* (lmax, 65) A, strictly lower */
    float *Pm = Am + lmax * P_STRIDE;             /* (lmax, 65) E * (Q K^T), lower */
    float *Rs = Pm + lmax * P_STRIDE;             /* (lmax, 33) V's slice, then R, then Un */
    float *Os = Rs + lmax * R_STRIDE;             /* (lmax, 33) O0, then O */
    float *bs = Os + lmax * R_STRIDE;             /* (lmax) beta */
    float *ec = bs + lmax;                        /* (lmax) exp(c_i) */
    float *fl = ec + lmax;                        /* (lmax) exp(c_last - c_i) */
    float *el = fl + lmax;                        /* (1) exp(c_last) */

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int64_t j = blockIdx.x, ih = j / (p.nv / p.nk), nv = p.nv;
    const int col0 = (int)blockIdx.y * CHUNK_COLS;
    const int64_t qs = p.nk * dk, vs = nv * dv;
    float *Sj = p.state + j * dk * dv;            /* (dk, dv) */

    for (int e = tid; e < dk * CHUNK_COLS; e += CHUNK_THREADS) {
        const int r = e / CHUNK_COLS, col = col0 + e % CHUNK_COLS;
        Ss[e] = col < dv ? Sj[(int64_t)r * dv + col] : 0.0f;   /* columns past dv stay 0 */
    }
    for (int64_t t0 = 0; t0 < p.T; t0 += lmax) {
        const int L = (int)(p.T - t0 < lmax ? p.T - t0 : lmax);
        __syncthreads();   /* the previous chunk's step 4 (or the state's load) is done */

        /* 1. the chunk's inputs */
        const float *kc = p.k + t0 * qs + ih * dk, *qc = p.q + t0 * qs + ih * dk;
        for (int e = tid; e < L * dk; e += CHUNK_THREADS) {
            const int i = e / dk, r = e % dk;
            Ks[i * ks + r] = kc[(int64_t)i * qs + r];
            Qs[i * ks + r] = qc[(int64_t)i * qs + r];
        }
        const float *vc = p.v + t0 * vs + j * dv;
        for (int e = tid; e < L * CHUNK_COLS; e += CHUNK_THREADS) {
            const int i = e / CHUNK_COLS, cc = e % CHUNK_COLS, col = col0 + cc;
            Rs[i * R_STRIDE + cc] = col < dv ? vc[(int64_t)i * vs + col] : 0.0f;
        }
        if (warp == 0) {
            for (int i = lane; i < L; i += 32) {
                cs[i] = (double)p.g[(t0 + i) * nv + j];
                bs[i] = p.beta[(t0 + i) * nv + j];
            }
            __syncwarp();
            if (lane == 0) {   /* in token order, in double, as the CPU */
                double run = 0.0;
                for (int i = 0; i < L; i++)
                    cs[i] = run += cs[i];
                *el = (float)exp(run);
            }
            __syncwarp();
            for (int i = lane; i < L; i += 32) {
                ec[i] = (float)exp(cs[i]);
                fl[i] = (float)exp(cs[L - 1] - cs[i]);
            }
        }
        __syncthreads();

        /* 2. A, P (lanes over jj: K rows at the odd stride; k_i, q_i broadcast) */
        for (int e = tid; e < L * L; e += CHUNK_THREADS) {
            const int i = e / L, jj = e % L;
            if (jj > i)
                continue;   /* never read */
            const float *ki = Ks + i * ks, *qi = Qs + i * ks, *kj = Ks + jj * ks;
            float kk = 0.0f, qk = 0.0f;
            for (int r = 0; r < dk; r++) {
                kk += ki[r] * kj[r];
                qk += qi[r] * kj[r];
            }
            const float decay = (float)exp(cs[i] - cs[jj]);
            if (jj < i)
                Am[i * P_STRIDE + jj] = bs[i] * kk * decay;
            Pm[i * P_STRIDE + jj] = qk * decay;
        }
        /* R = diag(beta) (V - diag(exp(c)) K S), O0 = diag(exp(c)) Q S (lane = column; each
         * element of Rs, Os read and written by its one thread) */
        for (int e = tid; e < L * CHUNK_COLS; e += CHUNK_THREADS) {
            const int i = e / CHUNK_COLS, cc = e % CHUNK_COLS;
            const float *ki = Ks + i * ks, *qi = Qs + i * ks;
            float kS = 0.0f, qS = 0.0f;
            for (int r = 0; r < dk; r++) {
                const float s = Ss[r * CHUNK_COLS + cc];
                kS += ki[r] * s;
                qS += qi[r] * s;
            }
            float *R = Rs + i * R_STRIDE + cc;
            *R = bs[i] * (*R - ec[i] * kS);
            Os[i * R_STRIDE + cc] = ec[i] * qS;
        }
        __syncthreads();

        /* 3. (I + A) Un = R and O = O0 + P Un: warp's columns, lane's rows lane, lane + 32 */
        {
            float x[2][WARP_COLS], o[2][WARP_COLS];   /* R then Un, O0 then O */
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int m = 0; m < WARP_COLS; m++) {
                    const int i = lane + 32 * s, cc = warp * WARP_COLS + m;
                    x[s][m] = i < L ? Rs[i * R_STRIDE + cc] : 0.0f;
                    o[s][m] = i < L ? Os[i * R_STRIDE + cc] : 0.0f;
                }
            for (int jj = 0; jj < L; jj++) {   /* uniform: every lane takes every step */
                float u[WARP_COLS];            /* row jj of Un, final */
#pragma unroll
                for (int m = 0; m < WARP_COLS; m++)
                    u[m] = __shfl_sync(0xffffffffu, jj < 32 ? x[0][m] : x[1][m], jj % 32);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const int i = lane + 32 * s;
                    if (i >= L || i < jj)
                        continue;
                    if (i > jj) {
                        const float a = Am[i * P_STRIDE + jj];
#pragma unroll
                        for (int m = 0; m < WARP_COLS; m++)
                            x[s][m] -= a * u[m];
                    }
                    const float pij = Pm[i * P_STRIDE + jj];
#pragma unroll
                    for (int m = 0; m < WARP_COLS; m++)
                        o[s][m] += pij * u[m];
                }
            }
#pragma unroll
            for (int s = 0; s < 2; s++)
#pragma unroll
                for (int m = 0; m < WARP_COLS; m++) {
                    const int i = lane + 32 * s, cc = warp * WARP_COLS + m;
                    if (i < L) {
                        Rs[i * R_STRIDE + cc] = x[s][m];
                        Os[i * R_STRIDE + cc] = o[s][m];
                    }
                }
        }
        __syncthreads();

        /* 4. out = O; S = exp(c_last) S + (diag(exp(c_last - c)) K)^T Un, in token order as the
         * CPU (lane = column; k broadcast) */
        float *oc = p.out + t0 * vs + j * dv;
        for (int e = tid; e < L * CHUNK_COLS; e += CHUNK_THREADS) {
            const int i = e / CHUNK_COLS, cc = e % CHUNK_COLS, col = col0 + cc;
            if (col < dv)
                oc[(int64_t)i * vs + col] = Os[i * R_STRIDE + cc];
        }
        const float e_last = *el;
        for (int e = tid; e < dk * CHUNK_COLS; e += CHUNK_THREADS) {
            const int r = e / CHUNK_COLS, cc = e % CHUNK_COLS;
            float acc = e_last * Ss[e];
            for (int i = 0; i < L; i++)
                acc += (fl[i] * Ks[i * ks + r]) * Rs[i * R_STRIDE + cc];
            Ss[e] = acc;   /* its one thread: read and written here only */
        }
    }
    __syncthreads();
    for (int e = tid; e < dk * CHUNK_COLS; e += CHUNK_THREADS) {
        const int r = e / CHUNK_COLS, col = col0 + e % CHUNK_COLS;
        if (col < dv)
            Sj[(int64_t)r * dv + col] = Ss[e];
    }
}

/* ------------------------------------------------------------------------------------------
 * The op
 */

/* tokens a chunk: `want` (chunk or T), at most CHUNK_MAX, shorter where this GPU's shared memory
 * is smaller (exact for any length: rounding only): 46 at dk = 128 and 23 at dk = 256 on a 99 KB
 * card (RTX PRO 6000); 1 at the least (then the caller finds it too large) */
int ddk_cuda_delta_chunk(int64_t want, int dk, size_t limit)
{
    int lmax = want < CHUNK_MAX ? (int)want : CHUNK_MAX;
    while (lmax > 1 && chunk_smem(dk, lmax) > limit)
        lmax--;
    return lmax;
}

/* the most dynamic shared memory a block of the current GPU may have */
static size_t smem_limit(void)
{
    int device = 0, bytes = 0;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return (size_t)bytes;
}

typedef void (*recurrent_kernel)(const float *, const float *, const float *, const float *,
                                 const float *, int64_t, int64_t, int64_t, int, int, float *,
                                 float *);

static recurrent_kernel recurrent_for(int64_t dk)
{
    if (dk <= 32)
        return delta_recurrent_kernel<1>;
    if (dk <= 64)
        return delta_recurrent_kernel<2>;
    if (dk <= 128)
        return delta_recurrent_kernel<4>;
    return delta_recurrent_kernel<8>;
}

/* ddk.h's contract; CUDA's limits: dk, dv <= 256, and the chunked form's shared memory (see the
 * top comment), else -EINVAL with nothing written. Returns when the kernel is queued. */
int ddk_cuda_gated_delta(const ddk_backend *be, const ddk_delta_shape *shape, const float *q,
                         const float *k, const float *v, const float *beta, const float *g,
                         float *state, float *out)
{
    const int64_t T = shape->T, nk = shape->nk, nv = shape->nv, dk = shape->dk, dv = shape->dv,
                  chunk = shape->chunk;
    if (T < 0 || nk < 1 || nv < 1 || dk < 1 || dv < 1 || chunk < 0 || nv % nk || dk > MAX_DIM ||
        dv > MAX_DIM || nv > INT32_MAX)
        return -EINVAL;
    if (T == 0)
        return 0;
    cudaStream_t stream = ddk_cuda_stream(be);   /* also makes be's GPU current */
    if (chunk == 0) {
        const dim3 grid((unsigned)nv, (unsigned)((dv + REC_BLOCK_COLS - 1) / REC_BLOCK_COLS));
        const recurrent_kernel delta_recurrent = recurrent_for(dk);
        DDK_LAUNCH(delta_recurrent, grid, REC_WARPS * 32, 0, stream, q, k, v, beta, g, T, nk, nv,
                   (int)dk, (int)dv, state, out);
        LAUNCH_CHECK();
        return 0;
    }
    const size_t limit = smem_limit();
    const int64_t lmax = ddk_cuda_delta_chunk(chunk < T ? chunk : T, (int)dk, limit);
    const size_t smem = chunk_smem((int)dk, (int)lmax);
    if (smem > limit)
        return -EINVAL;
    if (smem > 48 * 1024) {
        /* the largest need of any shape, so that two threads launching with different shapes
         * never lower it under each other */
        size_t most = chunk_smem(MAX_DIM, CHUNK_MAX);
        most = most < limit ? most : limit;
        CUDA_CHECK(cudaFuncSetAttribute((const void *)delta_chunked_kernel,
                                        cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    }
    delta_params p;
    p.q = q;
    p.k = k;
    p.v = v;
    p.beta = beta;
    p.g = g;
    p.state = state;
    p.out = out;
    p.T = T;
    p.nk = nk;
    p.nv = nv;
    p.dk = (int)dk;
    p.dv = (int)dv;
    p.lmax = (int)lmax;
    const dim3 grid((unsigned)nv, (unsigned)((dv + CHUNK_COLS - 1) / CHUNK_COLS));
    DDK_LAUNCH(delta_chunked_kernel, grid, CHUNK_THREADS, smem, stream, p);
    LAUNCH_CHECK();
    return 0;
}
