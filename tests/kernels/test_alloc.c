/* test_alloc.c: the accounting allocator of kernels/alloc.c (ddk.h, "Accounting allocator").
 *
 * Checks the bookkeeping (current, peak, budget, refused), that a refused allocation returns
 * NULL with errno set and changes nothing else, 64-byte alignment, reset_peak, a budget lowered
 * below what is live, and 4 threads allocating and freeing at once. Every check is relative to
 * the counters found at its start, so it does not assume the process allocated nothing before.
 * The budget is restored to 0 (unlimited) at the end. Also the fatal path (kernels/fatal.c): in a
 * child process, ddk_fatal prints its message, runs the hook once with it, and aborts. And the
 * host staging memory (ddk_host_alloc_pinned): aligned, writable, page-locked exactly when
 * there is a GPU, outside the accounting, refusals with errno; with a GPU, a round trip
 * through cuda:0's queued copies.
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 */
#include "ddk.h"
#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------------------------
 * Cases
 */

static void test_bookkeeping(ddk_allocator *a)
{
    check(strcmp(ddk_allocator_device(a), "cpu") == 0, "device name '%s', want 'cpu'",
          ddk_allocator_device(a));
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    check(s0.budget == 0, "budget %zu at start, want 0", s0.budget);

    void *x = ddk_malloc(a, 1000);
    check(x != NULL, "malloc(1000) failed");
    memset(x, 0x5a, 1000);   /* the memory is ours to write (ASan checks the extent) */
    ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(s1.current == s0.current + 1000, "current %zu, want %zu", s1.current, s0.current + 1000);
    check(s1.peak >= s1.current, "peak %zu below current %zu", s1.peak, s1.current);

    void *y = ddk_malloc(a, 3000);
    check(y != NULL, "malloc(3000) failed");
    ddk_allocator_reset_peak(a);
    ddk_alloc_stats s2 = ddk_allocator_stats(a);
    check(s2.current == s0.current + 4000, "current %zu, want %zu", s2.current, s0.current + 4000);
    check(s2.peak == s2.current, "after reset_peak: peak %zu, current %zu", s2.peak, s2.current);

    ddk_free(a, y, 3000);
    ddk_alloc_stats s3 = ddk_allocator_stats(a);
    check(s3.current == s0.current + 1000, "after free: current %zu, want %zu", s3.current,
          s0.current + 1000);
    check(s3.peak == s2.peak, "a free moved the peak: %zu -> %zu", s2.peak, s3.peak);
    ddk_allocator_reset_peak(a);
    check(ddk_allocator_stats(a).peak == s0.current + 1000, "reset_peak after a free: peak %zu",
          ddk_allocator_stats(a).peak);

    ddk_free(a, x, 1000);
    ddk_free(a, NULL, 12345);   /* NULL is a no-op, whatever the size */
    ddk_alloc_stats s4 = ddk_allocator_stats(a);
    check(s4.current == s0.current, "current %zu at the end, want %zu", s4.current, s0.current);
    check(s4.refused == s0.refused, "refused moved without a refusal: %llu -> %llu",
          (unsigned long long)s0.refused, (unsigned long long)s4.refused);
}

static void test_zero_bytes(ddk_allocator *a)
{
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    errno = 0;
    void *x = ddk_malloc(a, 0);
    int err = errno;
    check(x == NULL, "malloc(0) returned %p, want NULL", x);
    check(err == EINVAL, "malloc(0): errno %d, want EINVAL (%d)", err, EINVAL);
    ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(s1.current == s0.current && s1.peak == s0.peak && s1.budget == s0.budget,
          "malloc(0) changed current/peak/budget");
}

static void test_alignment(ddk_allocator *a)
{
    static const size_t sizes[] = { 1, 3, 63, 64, 65, 100, 127, 4097, 1 << 20 };
    enum { count = sizeof(sizes) / sizeof(sizes[0]) };
    void *ptrs[count];
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    size_t total = 0;
    for (int j = 0; j < count; j++) {
        ptrs[j] = ddk_malloc(a, sizes[j]);
        check(ptrs[j] != NULL, "malloc(%zu) failed", sizes[j]);
        if (!ptrs[j])
            continue;
        check((uintptr_t)ptrs[j] % 64 == 0, "malloc(%zu) = %p is not 64-byte aligned", sizes[j],
              ptrs[j]);
        memset(ptrs[j], 0xa5, sizes[j]);
        total += sizes[j];
    }
    /* current counts the bytes asked for, not any rounding the device does */
    check(ddk_allocator_stats(a).current == s0.current + total, "current %zu, want %zu",
          ddk_allocator_stats(a).current, s0.current + total);
    for (int j = 0; j < count; j++)
        ddk_free(a, ptrs[j], sizes[j]);
    check(ddk_allocator_stats(a).current == s0.current, "current not back after the frees");
}

static void test_budget(ddk_allocator *a)
{
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    ddk_allocator_set_budget(a, s0.current + 500);
    check(ddk_allocator_stats(a).budget == s0.current + 500, "budget not set");

    /* one byte over: refused, errno ENOMEM, only `refused` moves */
    errno = 0;
    void *x = ddk_malloc(a, 501);
    int err = errno;
    ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(x == NULL, "malloc over the budget returned %p", x);
    check(err == ENOMEM, "over budget: errno %d, want ENOMEM (%d)", err, ENOMEM);
    check(s1.current == s0.current && s1.peak == s0.peak && s1.budget == s0.current + 500,
          "a refusal changed current/peak/budget");
    check(s1.refused == s0.refused + 1, "refused %llu, want %llu", (unsigned long long)s1.refused,
          (unsigned long long)(s0.refused + 1));

    /* exactly up to the budget: allowed */
    x = ddk_malloc(a, 500);
    check(x != NULL, "malloc exactly up to the budget was refused");
    ddk_alloc_stats s2 = ddk_allocator_stats(a);
    check(s2.current == s0.current + 500 && s2.peak >= s2.current, "current %zu peak %zu",
          s2.current, s2.peak);

    /* at the budget: even one byte is refused */
    errno = 0;
    void *z = ddk_malloc(a, 1);
    check(z == NULL && errno == ENOMEM, "malloc(1) at the budget: %p errno %d", z, errno);
    check(ddk_allocator_stats(a).refused == s0.refused + 2, "refused not counted");

    /* freeing makes room again */
    ddk_free(a, x, 500);
    x = ddk_malloc(a, 200);
    check(x != NULL, "malloc(200) after freeing refused");
    ddk_free(a, x, 200);

    /* budget 0 removes the limit */
    ddk_allocator_set_budget(a, 0);
    x = ddk_malloc(a, 100000);
    check(x != NULL, "malloc(100000) with no budget refused");
    ddk_free(a, x, 100000);
    check(ddk_allocator_stats(a).current == s0.current, "current not back at the end");
}

static void test_budget_below_current(ddk_allocator *a)
{
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    void *x = ddk_malloc(a, 1000), *y = ddk_malloc(a, 1000);
    check(x && y, "malloc(1000) failed");
    /* live: s0.current + 2000; lower the budget below that: nothing is freed ... */
    ddk_allocator_set_budget(a, s0.current + 1500);
    ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(s1.current == s0.current + 2000, "lowering the budget changed current");
    /* ... but every further allocation is refused */
    errno = 0;
    void *z = ddk_malloc(a, 1);
    check(z == NULL && errno == ENOMEM, "malloc(1) with current above the budget: %p errno %d", z,
          errno);
    ddk_alloc_stats s2 = ddk_allocator_stats(a);
    check(s2.current == s1.current && s2.refused == s1.refused + 1,
          "the refusal changed current or was not counted");
    /* one free later: 500 bytes of room, no more */
    ddk_free(a, y, 1000);
    z = ddk_malloc(a, 501);
    check(z == NULL, "malloc(501) with 500 bytes of room succeeded");
    z = ddk_malloc(a, 500);
    check(z != NULL, "malloc(500) with 500 bytes of room refused");
    ddk_free(a, z, 500);
    ddk_free(a, x, 1000);
    ddk_allocator_set_budget(a, 0);
    check(ddk_allocator_stats(a).current == s0.current, "current not back at the end");
}

/* 4 threads, each many malloc/free pairs of varying size, writing what they get */
enum { n_threads = 4, pairs_per_thread = 20000, max_thread_bytes = 4096 };

static void *thread_worker(void *arg)
{
    ddk_allocator *a = ddk_allocator_cpu();
    uint64_t state = (uint64_t)(uintptr_t)arg * 0x9e3779b97f4a7c15ull + 1;
    intptr_t failures = 0;
    for (int j = 0; j < pairs_per_thread; j++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;   /* xorshift64 */
        size_t bytes = 1 + (size_t)(state % max_thread_bytes);
        unsigned char *x = ddk_malloc(a, bytes);
        if (!x) {
            failures++;
            continue;
        }
        x[0] = x[bytes - 1] = (unsigned char)j;
        ddk_free(a, x, bytes);
    }
    return (void *)failures;
}

static void test_threads(ddk_allocator *a)
{
    ddk_allocator_reset_peak(a);
    ddk_alloc_stats s0 = ddk_allocator_stats(a);
    pthread_t threads[n_threads];
    for (intptr_t t = 0; t < n_threads; t++)
        check(pthread_create(&threads[t], NULL, thread_worker, (void *)(t + 1)) == 0,
              "pthread_create failed");
    for (int t = 0; t < n_threads; t++) {
        void *failures = NULL;
        pthread_join(threads[t], &failures);
        check(failures == NULL, "thread %d: %ld allocations failed", t, (long)(intptr_t)failures);
    }
    ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(s1.current == s0.current, "current %zu after the threads, want %zu", s1.current,
          s0.current);
    /* at least one allocation was live at some time; at most one per thread at once */
    check(s1.peak >= s0.current + 1 && s1.peak <= s0.current + n_threads * max_thread_bytes,
          "peak %zu outside [%zu, %zu]", s1.peak, s0.current + 1,
          s0.current + (size_t)n_threads * max_thread_bytes);
    check(s1.refused == s0.refused, "refusals with no budget");
}

/* ------------------------------------------------------------------------------------------
 * Host staging memory (ddk_host_alloc_pinned): page-locked where there is a GPU, ordinary
 * memory otherwise, 64-byte aligned either way, outside the accounting allocators
 */

static void test_host_staging(ddk_allocator *a)
{
    const int gpus = ddk_cuda_device_count();
    const size_t sizes[] = { 1, 63, 64, 1000, ((size_t)1 << 20) + 3 };
    const ddk_alloc_stats s0 = ddk_allocator_stats(a);
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = ddk_host_alloc_pinned(sizes[i]);
        check(p != NULL, "ddk_host_alloc_pinned(%zu) failed", sizes[i]);
        if (!p)
            continue;
        check((uintptr_t)p % 64 == 0, "ddk_host_alloc_pinned(%zu) = %p is not 64-byte aligned", sizes[i], (void *)p);
        for (size_t k = 0; k < sizes[i]; k++)   /* every byte is ours (ASan checks the extent) */
            p[k] = (unsigned char)(k * 7 + 1);
        size_t wrong = 0;
        for (size_t k = 0; k < sizes[i]; k++)
            wrong += p[k] != (unsigned char)(k * 7 + 1);
        check(wrong == 0, "%zu of %zu bytes read back wrong", wrong, sizes[i]);
        /* page-locked exactly when a GPU can DMA from it (a small request never runs out) */
        check(ddk_host_pinned(p) == (gpus > 0), "%zu bytes: pinned %d with %d GPUs", sizes[i], ddk_host_pinned(p),
              gpus);
        ddk_host_free_pinned(p);
    }
    const ddk_alloc_stats s1 = ddk_allocator_stats(a);
    check(s1.current == s0.current && s1.peak == s0.peak, "staging memory was counted by the host allocator: "
          "current %zu -> %zu, peak %zu -> %zu", s0.current, s1.current, s0.peak, s1.peak);
    errno = 0;
    check(ddk_host_alloc_pinned(0) == NULL && errno == EINVAL, "0 bytes: want NULL and EINVAL (errno %d)", errno);
    errno = 0;
    check(ddk_host_alloc_pinned(SIZE_MAX) == NULL && errno == ENOMEM, "SIZE_MAX bytes: want NULL and ENOMEM (errno %d)",
          errno);
    ddk_host_free_pinned(NULL);   /* a no-op */
    check(ddk_host_pinned(NULL) == 0, "ddk_host_pinned(NULL) is not 0");

    /* with a GPU: a round trip through its backend's queued copies, host reads after the
     * synchronize only */
    const ddk_backend *be = gpus > 0 ? ddk_backend_cuda(0) : NULL;
    if (!be) {
        printf("  # no GPU: the round trip through cuda:0 is skipped\n");
        return;
    }
    const size_t n = ((size_t)1 << 22) + 12;
    float *src = ddk_host_alloc_pinned(n * sizeof(float)), *back = ddk_host_alloc_pinned(n * sizeof(float));
    float *dev = ddk_malloc(be->alloc, n * sizeof(float));
    check(src && back && dev, "no memory for the round trip");
    if (src && back && dev) {
        for (size_t k = 0; k < n; k++)
            src[k] = (float)k * 0.5f;
        memset(back, 0, n * sizeof(float));
        be->copy(be, dev, src, n * sizeof(float));
        be->copy(be, back, dev, n * sizeof(float));
        be->synchronize(be);
        check(!memcmp(src, back, n * sizeof(float)), "pinned -> cuda:0 -> pinned changed the floats");
    }
    ddk_free(be->alloc, dev, n * sizeof(float));
    ddk_host_free_pinned(src);
    ddk_host_free_pinned(back);
}

/* ------------------------------------------------------------------------------------------
 * The fatal path: the hook gets the message, then the process aborts
 */

static int hook_fd = -1;

static void write_hook(const char *message)
{
    if (write(hook_fd, message, strlen(message)) < 0)
        _exit(3);
}

static void test_fatal_hook(ddk_allocator *a)
{
    (void)a;
    int fds[2];
    if (pipe(fds)) {
        check(0, "pipe failed");
        return;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        hook_fd = fds[1];
        ddk_set_fatal_hook(write_hook);
        freopen("/dev/null", "w", stderr);   /* the "<2>..." line is for the journal */
        ddk_fatal("somewhere.cu", 42, "a sticky error on cuda:%d", 3);
    }
    close(fds[1]);
    char got[256] = "";
    ssize_t n = read(fds[0], got, sizeof got - 1);
    close(fds[0]);
    int status = 0;
    waitpid(child, &status, 0);
    got[n > 0 ? n : 0] = '\0';
    check(!strcmp(got, "somewhere.cu:42 a sticky error on cuda:3"), "the hook got \"%s\"", got);
    check(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "the child ends by abort (status %#x)", status);
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

int main(void)
{
    static const struct {
        const char *name;
        void (*run)(ddk_allocator *a);
    } cases[] = {
        { "bookkeeping", test_bookkeeping },
        { "zero_bytes", test_zero_bytes },
        { "alignment_64", test_alignment },
        { "budget", test_budget },
        { "budget_below_current", test_budget_below_current },
        { "threads", test_threads },
        { "host_staging_pinned", test_host_staging },
        { "fatal_hook_then_abort", test_fatal_hook },
    };
    ddk_allocator *a = ddk_allocator_cpu();
    for (size_t j = 0; j < sizeof(cases) / sizeof(cases[0]); j++) {
        cases[j].run(a);
        case_done(cases[j].name);
    }
    ddk_allocator_set_budget(a, 0);
    return cases_summary();
}
