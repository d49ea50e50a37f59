/* alloc.c: the accounting allocator, one per device.
 *
 * Every device allocation of ddtree goes through here, so current and peak bytes are known
 * exactly, and a budget makes an allocation fail with ENOMEM deterministically: this is how
 * the planner's predictions are checked and how tests provoke (and the trainer recovers from)
 * an out-of-memory step on a machine without a GPU. Sizes are passed back on free (sized
 * deallocation), so the same bookkeeping serves device memory the host cannot read.
 *
 * Freed blocks are kept in a small cache and handed out again to a request of the same size:
 * a training step allocates the same sizes every time, and returning a 65 MB loss workspace to
 * the kernel each call cost 16,000 page faults per call (about 10% of a CPU loss call). Cached
 * bytes are not "current": the budget and the peak count what is handed out.
 *
 * Tested by tests/kernels/test_alloc.c (budget, peak, refusals, threads).
 */
#include "ddk.h"
#include "alloc_device.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { DDK_ALIGN = 64 };   /* a cache line, and an AVX-512 vector */

static void *cpu_raw_alloc(int index, size_t bytes)
{
    size_t rounded = (bytes + DDK_ALIGN - 1) / DDK_ALIGN * DDK_ALIGN;
    return aligned_alloc(DDK_ALIGN, rounded);
}

static void cpu_raw_free(int index, void *ptr)
{
    free(ptr);
}

static ddk_allocator cpu_allocator = {
    .device = "cpu",
    .raw_alloc = cpu_raw_alloc,
    .raw_free = cpu_raw_free,
    .lock = PTHREAD_MUTEX_INITIALIZER,
};

void ddk_allocator_init(ddk_allocator *a, const char *device, int index,
                        void *(*raw_alloc)(int index, size_t bytes),
                        void (*raw_free)(int index, void *ptr))
{
    memset(a, 0, sizeof *a);
    snprintf(a->name, sizeof a->name, "%s", device);
    a->device = a->name;
    a->index = index;
    a->raw_alloc = raw_alloc;
    a->raw_free = raw_free;
    pthread_mutex_init(&a->lock, NULL);
}

/* called with the lock held */
static void release_cache(ddk_allocator *a)
{
    for (int i = 0; i < DDK_CACHE_SLOTS; i++)
        if (a->cache[i].bytes) {
            a->raw_free(a->index, a->cache[i].ptr);
            a->cache[i] = (ddk_cached_block){ NULL, 0 };
        }
    a->cached = 0;
}

ddk_allocator *ddk_allocator_cpu(void)
{
    return &cpu_allocator;
}

enum { DDK_MAX_CPU_RANKS = 64 };
static ddk_allocator rank_allocators[DDK_MAX_CPU_RANKS];
static pthread_once_t rank_once = PTHREAD_ONCE_INIT;

static void rank_allocators_init(void)
{
    for (int r = 0; r < DDK_MAX_CPU_RANKS; r++) {
        char name[24];
        snprintf(name, sizeof name, "cpu:%d", r);
        ddk_allocator_init(&rank_allocators[r], name, r, cpu_raw_alloc, cpu_raw_free);
    }
}

ddk_allocator *ddk_allocator_cpu_rank(int rank)
{
    if (rank < 0 || rank >= DDK_MAX_CPU_RANKS)
        return NULL;
    pthread_once(&rank_once, rank_allocators_init);
    return &rank_allocators[rank];
}

void *ddk_malloc(ddk_allocator *a, size_t bytes)
{
    if (bytes == 0 || bytes > SIZE_MAX - DDK_ALIGN) {
        errno = bytes == 0 ? EINVAL : ENOMEM;
        return NULL;
    }
    pthread_mutex_lock(&a->lock);
    int over_budget = a->budget != 0 && bytes > a->budget - (a->current < a->budget ? a->current : a->budget);
    void *ptr = NULL;
    for (int i = 0; i < DDK_CACHE_SLOTS && !over_budget && !ptr; i++)
        if (a->cache[i].bytes == bytes) {
            ptr = a->cache[i].ptr;
            a->cache[i] = (ddk_cached_block){ NULL, 0 };
            a->cached -= bytes;
        }
    if (!ptr && !over_budget) {
        ptr = a->raw_alloc(a->index, bytes);
        if (!ptr && a->cached) {   /* the device is full: give the cache back and try again */
            release_cache(a);
            ptr = a->raw_alloc(a->index, bytes);
        }
    }
    if (ptr) {
        a->current += bytes;
        if (a->current > a->peak)
            a->peak = a->current;
    } else {
        a->refused++;
    }
    pthread_mutex_unlock(&a->lock);
    if (!ptr)
        errno = ENOMEM;
    return ptr;
}

void ddk_free(ddk_allocator *a, void *ptr, size_t bytes)
{
    if (!ptr)
        return;
    pthread_mutex_lock(&a->lock);
    a->current -= bytes;
    for (int i = 0; i < DDK_CACHE_SLOTS && ptr; i++)
        if (a->cache[i].bytes == 0) {
            a->cache[i] = (ddk_cached_block){ ptr, bytes };
            a->cached += bytes;
            ptr = NULL;
        }
    pthread_mutex_unlock(&a->lock);
    if (ptr)   /* the cache is full */
        a->raw_free(a->index, ptr);
}

void ddk_allocator_trim(ddk_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    release_cache(a);
    pthread_mutex_unlock(&a->lock);
}

ddk_alloc_stats ddk_allocator_stats(const ddk_allocator *a)
{
    ddk_allocator *m = (ddk_allocator *)a;   /* the lock is not part of the value */
    pthread_mutex_lock(&m->lock);
    ddk_alloc_stats s = { a->current, a->peak, a->budget, a->cached, a->refused };
    pthread_mutex_unlock(&m->lock);
    return s;
}

const char *ddk_allocator_device(const ddk_allocator *a)
{
    return a->device;
}

void ddk_allocator_set_budget(ddk_allocator *a, size_t budget)
{
    pthread_mutex_lock(&a->lock);
    a->budget = budget;
    pthread_mutex_unlock(&a->lock);
}

void ddk_allocator_reset_peak(ddk_allocator *a)
{
    pthread_mutex_lock(&a->lock);
    a->peak = a->current;
    pthread_mutex_unlock(&a->lock);
}
