/* test_cuda_device.c: the GPUs as libddk devices: discovery and the accounting allocator over
 * cudaMalloc (current, peak, budget refusal with ENOMEM, reuse of freed blocks).
 * Reports skipped (exit 77) when this libddk has no CUDA or the machine no GPU. */
#include "ddk.h"
#include "check.h"

#include <errno.h>
#include <stdio.h>

#define CHECK(cond) check((cond), "%s:%d: %s", __FILE__, __LINE__, #cond)

int main(void)
{
    if (!ddk_has_cuda()) {
        printf("skipped: libddk was built without CUDA\n");
        return 77;
    }
    int count = ddk_cuda_device_count();
    if (count == 0) {
        printf("skipped: no GPU visible\n");
        return 77;
    }
    CHECK(ddk_allocator_cuda(count) == NULL);
    CHECK(ddk_cuda_device_info(-1, NULL) == -EINVAL);
    for (int d = 0; d < count; d++) {
        ddk_device_info info;
        CHECK(ddk_cuda_device_info(d, &info) == 0);
        CHECK(info.memory_total_bytes > 0 && info.memory_free_bytes <= info.memory_total_bytes);
        printf("cuda:%d %s, %.1f GiB, sm_%d\n", d, info.name, info.memory_total_bytes / 1073741824.0,
               info.compute_capability);

        ddk_allocator *a = ddk_allocator_cuda(d);
        ddk_alloc_stats s0 = ddk_allocator_stats(a);
        void *p = ddk_malloc(a, 1 << 20);
        CHECK(p != NULL);
        ddk_alloc_stats s1 = ddk_allocator_stats(a);
        CHECK(s1.current == s0.current + (1 << 20) && s1.peak >= s1.current);

        ddk_allocator_set_budget(a, s1.current + 1000);
        errno = 0;
        CHECK(ddk_malloc(a, 4096) == NULL && errno == ENOMEM);
        CHECK(ddk_allocator_stats(a).refused == s1.refused + 1);
        ddk_allocator_set_budget(a, 0);

        /* larger than the card: the device itself says no, reported as ENOMEM, not sticky */
        errno = 0;
        CHECK(ddk_malloc(a, info.memory_total_bytes * 2) == NULL && errno == ENOMEM);
        ddk_free(a, p, 1 << 20);
        CHECK(ddk_allocator_stats(a).current == s0.current);
        void *again = ddk_malloc(a, 1 << 20);   /* served from the freed block */
        CHECK(again == p);
        ddk_free(a, again, 1 << 20);
        ddk_allocator_trim(a);
        CHECK(ddk_allocator_stats(a).cached == 0);
    }
    printf("%d passed, %d failed\n", !case_failed, case_failed);
    return case_failed ? 1 : 0;
}
