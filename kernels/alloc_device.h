/* alloc_device.h: the accounting allocator's insides, for the files that give a device its
 * allocator (alloc.c for the host, cuda/device_cuda.cu for GPUs). Not installed. */
#ifndef DDK_ALLOC_DEVICE_H
#define DDK_ALLOC_DEVICE_H

#include "ddk.h"

#include <pthread.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { DDK_CACHE_SLOTS = 8 };

typedef struct ddk_cached_block {
    void *ptr;
    size_t bytes;   /* 0: empty slot */
} ddk_cached_block;

struct ddk_allocator {
    const char *device;   /* "cpu", "cuda:0" */
    char name[24];        /* storage for device names made at run time */
    int index;            /* the device's ordinal, passed to raw_alloc/raw_free */
    void *(*raw_alloc)(int index, size_t bytes);
    void (*raw_free)(int index, void *ptr);
    pthread_mutex_t lock; /* guards all below; an allocation is never on a hot path */
    size_t current, peak, budget, cached;
    uint64_t refused;
    ddk_cached_block cache[DDK_CACHE_SLOTS];
};

void ddk_allocator_init(ddk_allocator *a, const char *device, int index,
                        void *(*raw_alloc)(int index, size_t bytes),
                        void (*raw_free)(int index, void *ptr));

#ifdef __cplusplus
}
#endif

#endif
