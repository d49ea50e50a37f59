/* test_cuda_device.c: the GPUs as libddk devices: discovery, the accounting allocator over
 * cudaMalloc (current, peak, budget refusal with ENOMEM, reuse of freed blocks), the backend's
 * set-up outside any budget (its stream, cuBLAS handle and scratch made by the first
 * ddk_backend_cuda, so sumsq under a budget of zero bytes still works), and a sticky device fault
 * surfacing in cudaMalloc ending the process through the fatal path instead of passing for out
 * of memory. Reports skipped (exit 77) when this libddk has no CUDA or the machine no GPU.
 */
#include "ddk.h"
#include "check.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(cond) check((cond), "%s:%d: %s", __FILE__, __LINE__, #cond)

/* ------------------------------------------------------------------------------------------
 * A sticky fault is not out of memory. Runs in a child forked before this process touches CUDA
 * (a CUDA context does not survive fork): the child faults a kernel (axpby on an address no
 * allocation has), then allocates fresh sizes until the fault surfaces. The allocator must end
 * the process (the fatal hook, then abort) with cudaMalloc's message, never return NULL as
 * ENOMEM (which would send the step into out-of-memory recovery on a broken GPU).
 */

static int hook_fd = -1;

static void write_hook(const char *message)
{
    if (write(hook_fd, message, strlen(message)) < 0)
        _exit(3);
}

static void child_sticky_fault(void)
{
    if (ddk_cuda_device_count() == 0)
        _exit(77);
    ddk_set_fatal_hook(write_hook);
    freopen("/dev/null", "w", stderr);   /* the "<2>..." line is for the journal */
    const ddk_backend *be = ddk_backend_cuda(0);
    if (!be)
        _exit(4);
    float *nowhere = (float *)(uintptr_t)0x1000;   /* below any device allocation */
    be->axpby(be, 1 << 20, 1.0f, nowhere, 0.0f, nowhere);
    ddk_allocator *a = be->alloc;
    for (int i = 1; i <= 200; i++) {   /* the fault is asynchronous: up to ~10 s for it */
        usleep(50 * 1000);
        const size_t bytes = (size_t)i << 20;   /* a new size each time: no cached block */
        void *p = ddk_malloc(a, bytes);
        if (!p)
            _exit(5);   /* the defect: the fault was taken for out of memory */
        ddk_free(a, p, bytes);
        ddk_allocator_trim(a);
    }
    _exit(6);   /* the fault never surfaced */
}

/* 1 when the child saw no GPU (nothing checked), else 0 */
static int test_sticky_fault(void)
{
    int fds[2];
    if (pipe(fds)) {
        check(0, "pipe failed");
        return 0;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        close(fds[0]);
        hook_fd = fds[1];
        child_sticky_fault();
    }
    close(fds[1]);
    char got[512] = "";
    size_t have = 0;
    ssize_t n;
    while (have < sizeof got - 1 && (n = read(fds[0], got + have, sizeof got - 1 - have)) > 0)
        have += (size_t)n;
    close(fds[0]);
    got[have] = '\0';
    int status = 0;
    waitpid(child, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77)
        return 1;
    check(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
          "the child ends by abort (status %#x; exit 5: the fault passed for ENOMEM, 6: it never "
          "surfaced)", status);
    /* the first CUDA call after the fault reports it: cudaMalloc, or the free/trim around it */
    check(strstr(got, "cudaMalloc") || strstr(got, "cudaFree"),
          "the fatal message names the allocation: \"%s\"", got);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Discovery and the allocator
 */

static void test_allocator(int d)
{
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

/* The backend's own memory is made by ddk_backend_cuda, outside the allocator: with a budget that
 * allows nothing more, the backend still opens and sumsq (whose partials live in the scratch)
 * still answers instead of aborting the process. */
static void test_setup_outside_budget(int d)
{
    ddk_allocator *a = ddk_allocator_cuda(d);
    const size_t before = ddk_allocator_stats(a).current;
    float *x = (float *)ddk_malloc(a, 4096 * sizeof(float));
    CHECK(x != NULL);
    if (!x)
        return;
    ddk_allocator_set_budget(a, ddk_allocator_stats(a).current);   /* nothing more */
    const ddk_backend *be = ddk_backend_cuda(d);
    CHECK(be != NULL);
    if (be) {
        float host[4096];
        for (int i = 0; i < 4096; i++)
            host[i] = (float)(i % 7) - 3.0f;   /* sum of squares: exact in double */
        be->copy(be, x, host, sizeof host);
        double want = 0.0;
        for (int i = 0; i < 4096; i++)
            want += (double)host[i] * host[i];
        CHECK(be->sumsq(be, x, 4096) == want);
        CHECK(ddk_allocator_stats(a).current == before + 4096 * sizeof(float));
    }
    ddk_allocator_set_budget(a, 0);
    ddk_free(a, x, 4096 * sizeof(float));
    errno = 0;
    CHECK(ddk_backend_cuda(ddk_cuda_device_count()) == NULL && errno == EINVAL);
}

int main(void)
{
    if (!ddk_has_cuda()) {
        printf("skipped: libddk was built without CUDA\n");
        return 77;
    }
    /* forked before this process's first CUDA call (device_count is one): the child has its own */
    const int no_gpu = test_sticky_fault();
    int count = no_gpu ? 0 : ddk_cuda_device_count();
    if (count == 0) {
        printf("skipped: no GPU visible\n");
        return 77;
    }
    case_done("sticky_fault_is_fatal_not_enomem");
    CHECK(ddk_allocator_cuda(count) == NULL);
    CHECK(ddk_cuda_device_info(-1, NULL) == -EINVAL);
    for (int d = 0; d < count; d++) {   /* each GPU's limits and the instances chosen: the check's summary */
        char text[400], why[400];
        CHECK(ddk_cuda_instances(d, text, sizeof text) == 0);
        printf("instances cuda:%d %s\n", d, text);
        CHECK(ddk_cuda_device_usable(d, why, sizeof why) == 0);
    }
    case_done("instances_and_usable");
    for (int d = 0; d < count; d++) {
        char name[64];
        /* the set-up first: before anything else on this GPU made the backend */
        snprintf(name, sizeof name, "cuda:%d setup_outside_budget", d);
        test_setup_outside_budget(d);
        case_done(name);
        snprintf(name, sizeof name, "cuda:%d allocator", d);
        test_allocator(d);
        case_done(name);
    }
    return cases_summary();
}
