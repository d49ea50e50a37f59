/* device_cuda.cu: the node's GPUs as libddk devices: discovery (name, memory) and one
 * accounting allocator per GPU over cudaMalloc, so that a budget, the peak and the
 * out-of-memory path behave on a GPU exactly as on the CPU (alloc.c).
 *
 * Deliberately not here (the CUDA backend's issue): ops, streams, NCCL.
 * Tested by tests/kernels/test_cuda_device.c, which reports skipped on a machine without a GPU.
 */
#include "ddk.h"
#include "alloc_device.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

enum { DDK_MAX_GPUS = 64 };

static ddk_allocator gpu_allocators[DDK_MAX_GPUS];
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static int gpu_count;

/* NULL (the allocator says ENOMEM, and out-of-memory recovery may halve the chunk) only when the
 * GPU is out of memory. Any other failure (a sticky fault of an earlier kernel, a lost device)
 * is a device error: retrying with a smaller chunk would run on a GPU that cannot be trusted, so
 * it ends the process through the fatal path (the store is flushed, systemd restarts, runs
 * resume from their checkpoints). */
static void *gpu_raw_alloc(int index, size_t bytes)
{
    void *ptr = NULL;
    cudaError_t err = cudaSetDevice(index);
    if (err == cudaSuccess)
        err = cudaMalloc(&ptr, bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();   /* out of memory is not sticky: clear it, report ENOMEM */
        return NULL;
    }
    if (err != cudaSuccess)
        ddk_fatal(__FILE__, __LINE__, "cudaMalloc of %zu bytes on cuda:%d failed: %s", bytes, index,
                  cudaGetErrorString(err));
    return ptr;
}

static void gpu_raw_free(int index, void *ptr)
{
    cudaError_t err = cudaSetDevice(index);
    if (err == cudaSuccess)
        err = cudaFree(ptr);
    if (err != cudaSuccess) {   /* a device error: the process cannot trust this GPU any more */
        ddk_fatal(__FILE__, __LINE__, "cudaFree on cuda:%d failed: %s", index, cudaGetErrorString(err));
    }
}

static void gpu_discover(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {   /* no driver or no device */
        cudaGetLastError();
        count = 0;
    }
    gpu_count = count < DDK_MAX_GPUS ? count : DDK_MAX_GPUS;
    for (int i = 0; i < gpu_count; i++) {
        char name[24];
        snprintf(name, sizeof name, "cuda:%d", i);
        ddk_allocator_init(&gpu_allocators[i], name, i, gpu_raw_alloc, gpu_raw_free);
    }
}

extern "C" int ddk_cuda_device_count(void)
{
    pthread_once(&gpu_once, gpu_discover);
    return gpu_count;
}

extern "C" int ddk_cuda_device_info(int device, ddk_device_info *info)
{
    if (device < 0 || device >= ddk_cuda_device_count() || !info)
        return -EINVAL;
    cudaDeviceProp prop;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaGetDeviceProperties(&prop, device) != cudaSuccess || cudaSetDevice(device) != cudaSuccess ||
        cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
        cudaGetLastError();
        return -EIO;
    }
    snprintf(info->name, sizeof info->name, "%.95s", prop.name);
    info->memory_total_bytes = total_bytes;
    info->memory_free_bytes = free_bytes;
    info->compute_capability = prop.major * 10 + prop.minor;
    return 0;
}

/* an empty kernel, built for the library's archs like every other: whether a GPU can load its code */
__global__ static void image_probe(void) {}

extern "C" int ddk_cuda_device_usable(int device, char *why, size_t why_len)
{
    char none[1];
    if (!why || !why_len) {
        why = none;
        why_len = sizeof none;
    }
    ddk_device_info info;
    const int rc = ddk_cuda_device_info(device, &info);
    if (rc) {
        snprintf(why, why_len, rc == -EINVAL ? "cuda:%d is not a GPU of this node (it has %d)"
                                             : "cuda:%d: the driver could not open it (its memory full, or a "
                                               "fault: see nvidia-smi; the node has %d GPUs)",
                 device, ddk_cuda_device_count());
        return rc;
    }
    cudaFuncAttributes attr;
    const cudaError_t e = cudaFuncGetAttributes(&attr, image_probe);   /* on the GPU info made current */
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction) {
        cudaGetLastError();
        snprintf(why, why_len,
                 "cuda:%d (%s, sm_%d) has no code in this build of ddtree (built for %s): run on "
                 "such a GPU, or rebuild with -DCMAKE_CUDA_ARCHITECTURES=%d added (the tensor-core "
                 "attention needs sm_80 or later)",
                 device, info.name, info.compute_capability, DDK_CUDA_ARCHS, info.compute_capability);
        return -ENOEXEC;
    }
    if (e != cudaSuccess)
        ddk_fatal(__FILE__, __LINE__, "cudaFuncGetAttributes on cuda:%d failed: %s", device, cudaGetErrorString(e));
    why[0] = '\0';
    return 0;
}

extern "C" ddk_allocator *ddk_allocator_cuda(int device)
{
    if (device < 0 || device >= ddk_cuda_device_count())
        return NULL;
    return &gpu_allocators[device];
}

extern "C" int ddk_has_cuda(void)
{
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * Host staging memory (ddk.h: ddk_host_alloc_pinned). A header before the caller's bytes says
 * how the block was made, so that free and ddk_host_pinned need no table; HOST_HEADER keeps the
 * caller's pointer 64-byte aligned (cudaHostAlloc returns page-aligned blocks).
 */

#include <stdint.h>

enum { HOST_HEADER = 64 };

typedef struct host_header {
    int pinned;   /* 1: cudaHostAlloc; 0: posix_memalign */
} host_header;

extern "C" void *ddk_host_alloc_pinned(size_t bytes)
{
    if (bytes == 0) {
        errno = EINVAL;
        return NULL;
    }
    if (bytes > SIZE_MAX - 2 * HOST_HEADER) {
        errno = ENOMEM;
        return NULL;
    }
    void *block = NULL;
    int pinned = 0;
    if (ddk_cuda_device_count() > 0) {
        cudaError_t err = cudaHostAlloc(&block, bytes + HOST_HEADER, cudaHostAllocPortable);
        if (err == cudaSuccess) {
            pinned = 1;
        } else if (err == cudaErrorMemoryAllocation) {
            cudaGetLastError();   /* no page-locked memory left: not sticky; pageable memory works */
            block = NULL;
        } else {                  /* a device error, as in gpu_raw_alloc */
            ddk_fatal(__FILE__, __LINE__, "cudaHostAlloc of %zu bytes failed: %s", bytes, cudaGetErrorString(err));
        }
    }
    if (!block) {
        size_t total = (bytes + HOST_HEADER + 63) / 64 * 64;
        if (posix_memalign(&block, 64, total)) {
            errno = ENOMEM;
            return NULL;
        }
    }
    ((host_header *)block)->pinned = pinned;
    return (char *)block + HOST_HEADER;
}

extern "C" void ddk_host_free_pinned(void *p)
{
    if (!p)
        return;
    void *block = (char *)p - HOST_HEADER;
    if (!((host_header *)block)->pinned) {
        free(block);
        return;
    }
    cudaError_t err = cudaFreeHost(block);
    if (err != cudaSuccess)
        ddk_fatal(__FILE__, __LINE__, "cudaFreeHost failed: %s", cudaGetErrorString(err));
}

extern "C" int ddk_host_pinned(const void *p)
{
    return p ? ((const host_header *)((const char *)p - HOST_HEADER))->pinned : 0;
}
