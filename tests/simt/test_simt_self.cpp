/* test_simt_self.cpp: the SIMT emulator (simt.h) against what the CUDA programming guide and the
 * PTX ISA say a GPU does, with small kernels of its own: the shuffles (xor, index, width) and
 * votes, mma.sync.m16n8k16 against a plain product with fragments loaded as the PTX ISA's table
 * states them by register, shared memory poisoned at exactly its size, and what a GPU would hang
 * or refuse on: divergence, a deadlock, a partial mask, a barrier after a return, a launch above
 * 48 KB without its attribute, above a card's shared memory or threads, too much static shared
 * memory; and, in the AddressSanitizer build, a kernel's local array overrun after a barrier. Each fault must end the emulation (a child process, killed by SIGABRT) with a report
 * that names it; each refusal must be a cudaGetLastError.
 *
 * ctest: simt_self (labels unit, sanitize); a final "N passed, M failed".
 */
#include "simt.h"
#include "launch.h"
#include "check.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static const ddk_device_profile *card(const char *name)
{
    const ddk_device_profile *p = ddk_device_profile_find(name);
    if (!p) {
        fprintf(stderr, "no profile %s\n", name);
        exit(1);
    }
    return p;
}

/* ---- kernels ---- */

__global__ static void shuffles_kernel(int *out)   /* (blockDim.x, 7) */
{
    const int t = (int)threadIdx.x, lane = t % 32;
    int *o = out + t * 7;
    o[0] = __shfl_xor_sync(0xffffffffu, t, 5);
    o[1] = __shfl_sync(0xffffffffu, t, 7);
    o[2] = __shfl_sync(0xffffffffu, t, lane + 3, 8);   /* lane + 3 in its group of 8 */
    o[3] = __any_sync(0xffffffffu, t == 33);
    o[4] = __all_sync(0xffffffffu, lane < 31);
    o[5] = (int)(__shfl_xor_sync(0xffffffffu, (double)t + 0.5, 16) * 2.0);
    o[6] = __shfl_xor_sync(0xffffffffu, t, 8, 4);   /* a later segment: its own; an earlier: read */
}

/* c (16 x 8) = a (16 x 16, row-major bf16) b (16 x 8, stored [n][k]) + c, one warp; the
 * fragments as the PTX ISA lists them by register */
__global__ static void mma_kernel(const uint16_t *a, const uint16_t *bt, float *c)
{
    const int lane = (int)threadIdx.x, g = lane / 4, t4 = lane % 4;
    auto pair = [](const uint16_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 16; };
    const uint32_t fa[4] = { pair(a + g * 16 + 2 * t4), pair(a + (g + 8) * 16 + 2 * t4),
                             pair(a + g * 16 + 2 * t4 + 8), pair(a + (g + 8) * 16 + 2 * t4 + 8) };
    const uint32_t fb[2] = { pair(bt + g * 16 + 2 * t4), pair(bt + g * 16 + 2 * t4 + 8) };
    float fc[4] = { c[g * 8 + 2 * t4], c[g * 8 + 2 * t4 + 1], c[(g + 8) * 8 + 2 * t4],
                    c[(g + 8) * 8 + 2 * t4 + 1] };
    simt::mma_m16n8k16_bf16(fc, fa, fb, __FILE__, __LINE__);
    __syncwarp();   /* every lane has read c before any writes it */
    c[g * 8 + 2 * t4] = fc[0];
    c[g * 8 + 2 * t4 + 1] = fc[1];
    c[(g + 8) * 8 + 2 * t4] = fc[2];
    c[(g + 8) * 8 + 2 * t4 + 1] = fc[3];
}

__global__ static void read_unwritten_kernel(float *out)
{
    DDK_DYNAMIC_SHARED(float, s);
    if (threadIdx.x == 0)
        s[0] = 1.0f;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];   /* only s[0] was written */
}

__global__ static void missing_barrier_kernel(float *out)
{
    DDK_SHARED(float, s, [64]);
    s[threadIdx.x] = (float)threadIdx.x;
    out[threadIdx.x] = s[63 - threadIdx.x];   /* no __syncthreads between */
}

__global__ static void divergent_kernel(float *out)
{
    float x = (float)threadIdx.x;
    if (threadIdx.x < 16)
        x = __shfl_xor_sync(0xffffffffu, x, 1);
    else
        x = __shfl_xor_sync(0xffffffffu, x, 2);
    out[threadIdx.x] = x;
}

__global__ static void early_return_kernel(float *out)
{
    if (threadIdx.x == 40)
        return;
    __syncthreads();
    out[threadIdx.x] = 1.0f;
}

__global__ static void partial_mask_kernel(float *out)
{
    out[threadIdx.x] = __shfl_xor_sync(0x0000ffffu, (float)threadIdx.x, 1);
}

__global__ static void lane_returns_kernel(float *out)
{
    if (threadIdx.x == 3)
        return;
    out[threadIdx.x] = __shfl_xor_sync(0xffffffffu, (float)threadIdx.x, 1);
}

__global__ static void big_static_kernel(float *out)
{
    DDK_SHARED(float, s, [13000]);   /* 52,000 bytes: over 48 KB */
    s[threadIdx.x] = 0.0f;
    out[0] = s[0];
}

/* a local array read one past its end after a collective (index 4 from out[0] = 4); left to
 * AddressSanitizer (UndefinedBehaviorSanitizer's bounds and object-size checks would see it first) */
__global__ static void __attribute__((no_sanitize_undefined)) local_overflow_kernel(float *out)
{
    float a[4] = { 1.0f, 2.0f, 3.0f, 4.0f };
    __syncthreads();
    out[threadIdx.x + 1] = a[(int)out[0]];
}

__global__ static void smem_kernel(float *out)
{
    DDK_DYNAMIC_SHARED(float, s);
    s[threadIdx.x] = (float)threadIdx.x;
    __syncthreads();
    out[threadIdx.x] = s[threadIdx.x];
}

/* ---- a fault ends the emulation: run f in a child, expect SIGABRT and `want` in its stderr ---- */

static void expect_abort(const char *want, void (*f)(void))
{
    int pipefd[2];
    if (pipe(pipefd)) {
        check(0, "pipe");
        return;
    }
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
        dup2(pipefd[1], 2);
        close(pipefd[0]);
        f();
        _exit(0);   /* not aborted: the fault went unseen */
    }
    close(pipefd[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t got;
    while ((got = read(pipefd[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)got;
    buf[n] = 0;
    close(pipefd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    /* the emulator aborts; AddressSanitizer exits with 1 */
    check((WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT) || (WIFEXITED(status) && WEXITSTATUS(status)),
          "expected an abort for \"%s\"; status %d", want, status);
    check(strstr(buf, want) != NULL, "the report lacks \"%s\":\n%s", want, buf);
}

static float g_out[1024];

/* ---- cases ---- */

static void case_shuffles(void)
{
    static int out[64 * 7];
    DDK_LAUNCH(shuffles_kernel, 1, 64, 0, (cudaStream_t) nullptr, out);
    check(cudaGetLastError() == cudaSuccess, "launch");
    for (int t = 0; t < 64; t++) {
        const int lane = t % 32, w = t / 32 * 32;
        const int *o = out + t * 7;
        check(o[0] == w + (lane ^ 5), "xor: thread %d got %d", t, o[0]);
        check(o[1] == w + 7, "index: thread %d got %d", t, o[1]);
        check(o[2] == w + lane / 8 * 8 + (lane + 3) % 8, "width 8: thread %d got %d", t, o[2]);
        check(o[3] == (t >= 32), "any: thread %d got %d", t, o[3]);
        check(o[4] == 0, "all: thread %d got %d", t, o[4]);
        check(o[5] == 2 * (w + (lane ^ 16)) + 1, "double: thread %d got %d", t, o[5]);
        check(o[6] == ((lane ^ 8) >= lane / 4 * 4 + 4 ? t : w + (lane ^ 8)), "xor 8 at width 4: thread %d got %d",
              t, o[6]);
    }
}

static void case_mma(void)
{
    uint16_t a[16 * 16], bt[8 * 16];
    float c[16 * 8];
    uint64_t s = 12345;
    auto next = [&s]() { s = s * 6364136223846793005ull + 1442695040888963407ull; return (int)(s >> 59) - 16; };
    for (int i = 0; i < 256; i++)
        a[i] = __bfloat16_as_ushort(__float2bfloat16_rn((float)next() / 8.0f));
    for (int i = 0; i < 128; i++) {
        bt[i] = __bfloat16_as_ushort(__float2bfloat16_rn((float)next() / 4.0f));
        c[i] = (float)next();
    }
    float want[16 * 8];
    for (int r = 0; r < 16; r++)
        for (int n = 0; n < 8; n++) {
            double x = c[r * 8 + n];
            for (int k = 0; k < 16; k++)
                x += (double)__bfloat162float(__nv_bfloat16{ a[r * 16 + k] }) *
                     __bfloat162float(__nv_bfloat16{ bt[n * 16 + k] });
            want[r * 8 + n] = (float)x;
        }
    DDK_LAUNCH(mma_kernel, 1, 32, 0, (cudaStream_t) nullptr, a, bt, c);
    for (int i = 0; i < 128; i++)
        check(c[i] == want[i], "mma element (%d, %d): %g, want %g", i / 8, i % 8, c[i], want[i]);
}

static void case_poison(void)
{
    DDK_LAUNCH(read_unwritten_kernel, 1, 32, 32 * sizeof(float), (cudaStream_t) nullptr, g_out);
    check(g_out[0] == 1.0f, "the written element: %g", g_out[0]);
    for (int i = 1; i < 32; i++)
        check(isnan(g_out[i]), "unwritten shared element %d read as %g, not NaN", i, g_out[i]);
    DDK_LAUNCH(missing_barrier_kernel, 1, 64, 0, (cudaStream_t) nullptr, g_out);
    int nans = 0;
    for (int i = 0; i < 64; i++)
        nans += isnan(g_out[i]);
    check(nans > 0, "a missing barrier went unseen: every thread read its partner's value");
}

static void divergent(void) { DDK_LAUNCH(divergent_kernel, 1, 32, 0, (cudaStream_t) nullptr, g_out); }
static void early_return(void) { DDK_LAUNCH(early_return_kernel, 1, 64, 0, (cudaStream_t) nullptr, g_out); }
static void partial_mask(void) { DDK_LAUNCH(partial_mask_kernel, 1, 32, 0, (cudaStream_t) nullptr, g_out); }
static void lane_returns(void) { DDK_LAUNCH(lane_returns_kernel, 1, 32, 0, (cudaStream_t) nullptr, g_out); }
static void big_static(void) { DDK_LAUNCH(big_static_kernel, 1, 32, 0, (cudaStream_t) nullptr, g_out); }
static void local_overflow(void)
{
    g_out[0] = 4.0f;
    DDK_LAUNCH(local_overflow_kernel, 1, 32, 0, (cudaStream_t) nullptr, g_out);
}

static void case_faults(void)
{
    expect_abort("divergence in warp 0", divergent);
    expect_abort("__syncthreads at", early_return);
    expect_abort("not the warp's whole", partial_mask);
    expect_abort("returned while lane", lane_returns);
    expect_abort("over the 48 KB", big_static);
#if defined(__SANITIZE_ADDRESS__)
    /* AddressSanitizer still guards a kernel's own stack frame after it parked (the switch is
     * none it intercepts) */
    expect_abort("stack-buffer-overflow", local_overflow);
#else
    (void)local_overflow;
#endif
}

/* launches refused as the card refuses them; nothing runs */
static void case_refusals(void)
{
    const size_t big = 60 * 1024;
    simt::set_profile(card("h200"));
    g_out[0] = -1.0f;
    DDK_LAUNCH(smem_kernel, 1, 32, big, (cudaStream_t) nullptr, g_out);
    check(cudaGetLastError() == cudaErrorInvalidValue, "60 KB without the attribute was not refused");
    check(g_out[0] == -1.0f, "a refused launch ran");
    check(cudaFuncSetAttribute((const void *)smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               (int)big) == cudaSuccess, "the attribute");
    DDK_LAUNCH(smem_kernel, 1, 32, big, (cudaStream_t) nullptr, g_out);
    check(cudaGetLastError() == cudaSuccess && g_out[5] == 5.0f, "60 KB with the attribute");
    /* 120 KB: H200's 227 KB fits, RTX PRO 6000's 99 KB does not (nor its attribute) */
    const int most = 120 * 1024;
    check(cudaFuncSetAttribute((const void *)smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               most) == cudaSuccess, "120 KB attribute on h200");
    DDK_LAUNCH(smem_kernel, 1, 32, (size_t)most, (cudaStream_t) nullptr, g_out);
    check(cudaGetLastError() == cudaSuccess, "120 KB on h200");
    simt::set_profile(card("rtx-pro-6000"));
    check(cudaFuncSetAttribute((const void *)smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               most) == cudaErrorInvalidValue, "120 KB attribute on rtx-pro-6000 allowed");
    cudaGetLastError();
    DDK_LAUNCH(smem_kernel, 1, 32, (size_t)most, (cudaStream_t) nullptr, g_out);
    check(cudaGetLastError() == cudaErrorInvalidValue, "120 KB on rtx-pro-6000 was not refused");
    DDK_LAUNCH(smem_kernel, 1, 1025, 4200, (cudaStream_t) nullptr, g_out);
    check(cudaGetLastError() == cudaErrorInvalidConfiguration, "1025 threads were not refused");
    int v = 0;
    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0);
    check(v == 101376, "rtx-pro-6000's opt-in shared memory: %d", v);
    cudaDeviceGetAttribute(&v, cudaDevAttrComputeCapabilityMajor, 0);
    check(v == 12, "rtx-pro-6000's major: %d", v);
    simt::set_profile(card("h200"));
}

int main(void)
{
    simt::set_profile(card("h200"));
    static const test_case cases[] = {
        { "shuffles and votes", case_shuffles },
        { "mma.sync m16n8k16 bf16 against a plain product", case_mma },
        { "shared memory poisoned; a missing barrier shows", case_poison },
        { "faults: divergence, barrier after return, partial mask, lane gone, static over 48 KB", case_faults },
        { "launches refused as each card refuses them", case_refusals },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    return cases_summary();
}
