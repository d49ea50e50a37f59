/* device_none.c: the GPU entry points of a libddk built without CUDA (DDTREE_CUDA=OFF or no
 * nvcc): such a build sees no GPU, so callers take their CPU path. The CUDA build compiles
 * device_cuda.cu instead. Tested by tests/test_cuda_device.c (skipped without GPUs). */
#include "ddk.h"

#include <errno.h>
#include <stddef.h>

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
    return NULL;
}

void ddk_cuda_synchronize(int device)
{
}
