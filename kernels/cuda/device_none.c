/* device_none.c: the GPU entry points of a libddk built without CUDA (DDTREE_CUDA=OFF or no
 * nvcc): such a build sees no GPU, so callers take their CPU path. The CUDA build compiles
 * device_cuda.cu instead. Tested by tests/kernels/test_cuda_device.c (skipped without GPUs). */
#include "ddk.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>

int ddk_has_cuda(void)
{
    return 0;
}

int ddk_cuda_device_count(void)
{
    return 0;
}

int ddk_cuda_device_info(int device, ddk_device_info *info)
{
    return -EINVAL;
}

ddk_allocator *ddk_allocator_cuda(int device)
{
    return NULL;
}

const ddk_backend *ddk_backend_cuda(int device)
{
    errno = EINVAL;
    return NULL;
}

int ddk_cuda_instances(int device, char *text, size_t len)
{
    if (text && len)
        snprintf(text, len, "cuda:%d: this build of ddtree has no CUDA", device);
    return -EINVAL;
}

int ddk_cuda_device_usable(int device, char *why, size_t why_len)
{
    if (why && why_len)
        snprintf(why, why_len, "cuda:%d: this build of ddtree has no CUDA (rebuild where nvcc is found)", device);
    return -EINVAL;
}

const ddk_backend *ddk_backend_cuda_or_why(int device, char *why, size_t why_len)
{
    ddk_cuda_device_usable(device, why, why_len);
    errno = EINVAL;
    return NULL;
}

void ddk_cuda_synchronize(int device)
{
}

/* Host staging memory: without CUDA nothing is page-locked, ordinary 64-byte aligned memory. */
#include <stdint.h>
#include <stdlib.h>

void *ddk_host_alloc_pinned(size_t bytes)
{
    void *p = NULL;
    if (bytes == 0) {
        errno = EINVAL;
        return NULL;
    }
    if (bytes > SIZE_MAX - 64 || !(p = aligned_alloc(64, (bytes + 63) / 64 * 64))) {
        errno = ENOMEM;
        return NULL;
    }
    return p;
}

void ddk_host_free_pinned(void *p)
{
    free(p);
}

int ddk_host_pinned(const void *p)
{
    (void)p;
    return 0;
}
