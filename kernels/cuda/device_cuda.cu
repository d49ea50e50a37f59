/* device_cuda.cu: the node's GPUs as libddk devices: discovery (name, memory) and one
 * accounting allocator per GPU over cudaMalloc, so that a budget, the peak and the
 * out-of-memory path behave on a GPU exactly as on the CPU (alloc.c).
 *
 * Deliberately not here (the CUDA backend's issue): ops, streams, NCCL.
 * Tested by tests/test_cuda_device.c, which reports skipped on a machine without a GPU.
 */
#include "ddk.h"
#include "fatal.h"
#include "alloc_device.h"

#include <cuda_runtime.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

enum { DDK_MAX_GPUS = 64 };

static ddk_allocator gpu_allocators[DDK_MAX_GPUS];
static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static int gpu_count;

static void *gpu_raw_alloc(int index, size_t bytes)
{
    void *ptr = NULL;
    if (cudaSetDevice(index) != cudaSuccess || cudaMalloc(&ptr, bytes) != cudaSuccess) {
        cudaGetLastError();   /* out of memory is not sticky: clear it, report ENOMEM */
        return NULL;
    }
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
