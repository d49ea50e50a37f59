/* simt.h: the SIMT emulator's device side and CUDA runtime, for the kernels of kernels/cuda/
 * compiled as host C++ (DDK_SIMT; tests/simt/include/ holds cuda_runtime.h, cuda_bf16.h and
 * cublas_v2.h, each only this header). Every CUDA thread of a block is a coroutine (simt.cpp);
 * __syncthreads, the warp shuffles and votes, __syncwarp and mma.sync are collectives that
 * resume their threads only when every thread that must take part has arrived at the same call
 * site, and abort with the kernel, block, thread and site on divergence, on a deadlock, on a mask
 * that is not the warp's whole, or on a barrier some threads of the block left by returning.
 * Shared memory is allocated per block at exactly the launch's (and each static declaration's)
 * size, filled with NaN bytes (0xff), so an unwritten read shows and a read past the end is an
 * AddressSanitizer error; a launch is refused (cudaGetLastError) as the device profile in force
 * refuses it: dynamic shared memory above 48 KB without cudaFuncSetAttribute, a block above the
 * card's opt-in shared memory or its threads per SM, bad dimensions.
 *
 * Not emulated: registers and __launch_bounds__, timing, memory ordering between blocks (blocks
 * run one after the other), warp-synchronous code without a collective (it is run in the order
 * of the schedule and so shows as a race). Tested by tests/simt/test_simt_self.cpp (the
 * collectives, the mma fragment tables, the refusals, the poisoning) and used by
 * tests/simt/test_simt_kernels.cpp.
 */
#ifndef DDK_SIMT_H
#define DDK_SIMT_H

#include "ddk.h"
#include "ddk_bf16.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <tuple>
#include <type_traits>
#include <utility>

/* ------------------------------------------------------------------------------------------
 * Qualifiers and vector types
 */

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

struct dim3 {
    unsigned x, y, z;
    constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
struct uint3 {
    unsigned x, y, z;
};
struct alignas(16) float4 {
    float x, y, z, w;
};
struct alignas(16) int4 {
    int x, y, z, w;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
struct alignas(8) uint2 {
    unsigned x, y;
};
static inline int4 make_int4(int x, int y, int z, int w) { return int4{ x, y, z, w }; }
static inline uint2 make_uint2(unsigned x, unsigned y) { return uint2{ x, y }; }
static inline float __uint_as_float(unsigned u) { return ddk_f32_from_bits(u); }
static inline unsigned __float_as_uint(float f) { return ddk_f32_bits(f); }

/* bf16 as the device converts (cvt.rn.bf16.f32): to nearest even (ddk_bf16.h), NaN to the
 * canonical 0x7fff (where the CPU's keeps the payload) */
struct __nv_bfloat16 {
    uint16_t bits;
};
struct alignas(4) __nv_bfloat162 {
    __nv_bfloat16 x, y;
};
static inline __nv_bfloat16 __float2bfloat16_rn(float f)
{
    return __nv_bfloat16{ f != f ? (uint16_t)0x7fff : ddk_f32_to_bf16(f) };
}
static inline __nv_bfloat162 __floats2bfloat162_rn(float lo, float hi)
{
    return __nv_bfloat162{ __float2bfloat16_rn(lo), __float2bfloat16_rn(hi) };
}
static inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
static inline float __bfloat162float(__nv_bfloat16 b) { return ddk_bf16_to_f32(b.bits); }

/* ------------------------------------------------------------------------------------------
 * The runtime: errors, streams, attributes, copies (device memory is host memory)
 */

typedef enum cudaError {
    cudaSuccess = 0,
    cudaErrorInvalidValue = 1,
    cudaErrorInvalidConfiguration = 9,
    cudaErrorNotReady = 600,
    cudaErrorLaunchOutOfResources = 701,
} cudaError_t;
typedef struct simt_stream *cudaStream_t;
enum cudaDeviceAttr {
    cudaDevAttrMaxThreadsPerBlock = 1,
    cudaDevAttrMultiProcessorCount = 16,
    cudaDevAttrMaxThreadsPerMultiProcessor = 39,
    cudaDevAttrComputeCapabilityMajor = 75,
    cudaDevAttrComputeCapabilityMinor = 76,
    cudaDevAttrMaxSharedMemoryPerMultiprocessor = 81,
    cudaDevAttrMaxRegistersPerMultiprocessor = 82,
    cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8 };
enum cudaMemcpyKind {
    cudaMemcpyHostToHost = 0,
    cudaMemcpyHostToDevice = 1,
    cudaMemcpyDeviceToHost = 2,
    cudaMemcpyDeviceToDevice = 3,
    cudaMemcpyDefault = 4,
};

cudaError_t cudaGetDevice(int *device);
cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attr, int device);
cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute attr, int value);
cudaError_t cudaGetLastError(void);
const char *cudaGetErrorString(cudaError_t err);
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream);
cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);

/* ------------------------------------------------------------------------------------------
 * The emulator (simt.cpp)
 */

namespace simt {

/* the device in force (ddk.h's profiles); h200 until set */
void set_profile(const ddk_device_profile *profile);
const ddk_device_profile *profile(void);
/* 0: blocks and each block's threads in increasing order; 1: both reversed (a second schedule:
 * a result that depends on the order of blocks or threads differs between the two) */
void set_schedule(int reversed);
/* launches made since the last call, one line each ("name grid block smem"), into buf */
size_t take_launch_log(char *buf, size_t len);

const uint3 &thread_idx(void);
const uint3 &block_idx(void);
const dim3 &block_dim(void);
const dim3 &grid_dim(void);
void syncthreads(const char *file, int line);
/* the warp collectives: shuffles (value bits), votes (0 / 1), __syncwarp */
enum warp_kind { SHFL_XOR, SHFL_IDX, VOTE_ANY, VOTE_ALL, SYNCWARP };
uint64_t warp_op(warp_kind kind, unsigned mask, uint64_t bits, int arg, int width, const char *file,
                 int line);
/* mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 with d = c in place (the PTX ISA's
 * fragments, simt.cpp) */
void mma_m16n8k16_bf16(float c[4], const uint32_t a[4], const uint32_t b[2], const char *file,
                       int line);
/* this block's dynamic shared memory; a static __shared__ declaration's region, one per function
 * (each template instance's name is its own string) and line */
void *dynamic_shared(void);
void *static_shared(size_t bytes, const char *function, const char *file, int line);
void launch(const void *kernel, const char *name, dim3 grid, dim3 block, size_t smem,
            void (*body)(void *), void *ctx);

} /* namespace simt */

#define threadIdx (simt::thread_idx())
#define blockIdx (simt::block_idx())
#define blockDim (simt::block_dim())
#define gridDim (simt::grid_dim())
#define __syncthreads() simt::syncthreads(__FILE__, __LINE__)

template <typename T>
static inline T simt_warp_value(simt::warp_kind kind, unsigned mask, T v, int arg, int width,
                                const char *file, int line)
{
    static_assert(sizeof(T) <= 8 && std::is_trivially_copyable<T>::value, "a register's value");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof v);
    bits = simt::warp_op(kind, mask, bits, arg, width, file, line);
    T r;
    memcpy(&r, &bits, sizeof r);
    return r;
}
template <typename T>
static inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = 32,
                                const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return simt_warp_value(simt::SHFL_XOR, mask, v, lane_mask, width, file, line);
}
template <typename T>
static inline T __shfl_sync(unsigned mask, T v, int src_lane, int width = 32,
                            const char *file = __builtin_FILE(), int line = __builtin_LINE())
{
    return simt_warp_value(simt::SHFL_IDX, mask, v, src_lane, width, file, line);
}
static inline int __any_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
    return (int)simt::warp_op(simt::VOTE_ANY, mask, pred != 0, 0, 32, file, line);
}
static inline int __all_sync(unsigned mask, int pred, const char *file = __builtin_FILE(),
                             int line = __builtin_LINE())
{
    return (int)simt::warp_op(simt::VOTE_ALL, mask, pred != 0, 0, 32, file, line);
}
static inline void __syncwarp(unsigned mask = 0xffffffffu, const char *file = __builtin_FILE(),
                              int line = __builtin_LINE())
{
    simt::warp_op(simt::SYNCWARP, mask, 0, 0, 32, file, line);
}

/* blocks run one at a time and a thread runs until it parks: an atomic is a read-modify-write */
template <typename T>
static inline T atomicAdd(T *address, T value)
{
    const T old = *address;
    *address = old + value;
    return old;
}

/* <<<grid, block, smem, stream>>>(args): the arguments converted to the kernel's parameter
 * types once, as the launch copies them, and each thread called with its own copy */
template <typename... P, typename... A>
void simt_launch(void (*kernel)(P...), const char *name, dim3 grid, dim3 block, size_t smem,
                 cudaStream_t stream, A &&...args)
{
    (void)stream;
    struct call {
        void (*kernel)(P...);
        std::tuple<typename std::decay<P>::type...> params;
    } c{ kernel, std::tuple<typename std::decay<P>::type...>(static_cast<P>(std::forward<A>(args))...) };
    simt::launch((const void *)kernel, name, grid, block, smem,
                 [](void *ctx) {
                     call *k = static_cast<call *>(ctx);
                     std::apply(k->kernel, k->params);
                 },
                 &c);
}

#endif
