/* test_comm.c: the collectives between data-parallel ranks (ddk.h, ddk_comm_*: NCCL in the
 * CUDA build, -ENOSYS without it).
 *
 * Without a GPU: the unique id's text form (ddk_comm_id_valid: the right length, hex only,
 * NULL), a new unique id (with NCCL: 256 lowercase hex digits, valid, two calls differ; without:
 * -ENOSYS and a sentence) and ddk_comm_init's refusals (world 0, first_rank out of range, more
 * local ranks than GPUs, a bad id, no id across processes): -EINVAL (-ENOSYS without NCCL) with
 * a sentence and no communicator.
 * The same for the GPU link (ddk_link_*: a split's hand-off): its refusals without a GPU.
 * With GPUs: the refusals that need one (a device that does not exist, the same GPU twice),
 * a 1-rank all-reduce that leaves its buffer as it was and, with two GPUs, a 2-rank sum of
 * known values that must be exact, a link copy ordered against both GPUs' queued work (the
 * sender's writes before it, the receiver's reads of its buffer before a fence, the receiver's
 * op after the fence), and link copies from another thread while the same GPUs all-reduce (the
 * process's one NCCL order: both exact, no deadlock). Without a GPU that part prints
 * "SKIPPED: no GPU" and the rest still decides the exit status.
 *
 * ctest: labels unit and sanitize; one line per case; a final "N passed, M failed"; exit 1 when
 * a case failed.
 */
#include "ddk.h"
#include "check.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond) check((cond), "%s:%d: %s", __FILE__, __LINE__, #cond)

static int with_nccl;   /* libddk has NCCL (the CUDA build always does) */
static int gpus;        /* GPUs this process sees */

static void test_id_valid(void)
{
    char id[DDK_COMM_ID_HEX + 2];
    for (int j = 0; j < DDK_COMM_ID_HEX; j++)
        id[j] = "0123456789abcdef"[(j * 7) % 16];
    id[DDK_COMM_ID_HEX] = '\0';
    CHECK(ddk_comm_id_valid(id) == 1);
    id[3] = 'A';   /* either case */
    id[100] = 'F';
    CHECK(ddk_comm_id_valid(id) == 1);

    id[DDK_COMM_ID_HEX - 1] = '\0';   /* 255 digits */
    CHECK(ddk_comm_id_valid(id) == 0);
    id[DDK_COMM_ID_HEX - 1] = '0';
    id[DDK_COMM_ID_HEX] = '0';        /* 257 */
    id[DDK_COMM_ID_HEX + 1] = '\0';
    CHECK(ddk_comm_id_valid(id) == 0);
    id[DDK_COMM_ID_HEX] = '\n';       /* a trailing newline is not part of an id */
    CHECK(ddk_comm_id_valid(id) == 0);
    id[DDK_COMM_ID_HEX] = '\0';
    CHECK(ddk_comm_id_valid(id) == 1);

    id[17] = 'g';
    CHECK(ddk_comm_id_valid(id) == 0);
    id[17] = ' ';
    CHECK(ddk_comm_id_valid(id) == 0);
    id[17] = '0';
    CHECK(ddk_comm_id_valid(id) == 1);

    CHECK(ddk_comm_id_valid(NULL) == 0);
    CHECK(ddk_comm_id_valid("") == 0);
    CHECK(ddk_comm_id_valid("0123abcd") == 0);
}

static void test_unique_id(void)
{
    char a[DDK_COMM_ID_HEX + 1], b[DDK_COMM_ID_HEX + 1], err[512] = "";
    int rc = ddk_comm_unique_id(a, err, sizeof err);
    if (!with_nccl) {
        check(rc == -ENOSYS && strstr(err, ddk_has_cuda() ? "without NCCL" : "without CUDA/NCCL"),
              "without NCCL: rc %d (want -ENOSYS), err \"%s\"", rc, err);
        return;
    }
    if (rc != 0) {
        check(0, "ddk_comm_unique_id: rc %d: %s", rc, err);
        return;
    }
    CHECK(strlen(a) == DDK_COMM_ID_HEX);
    CHECK(strspn(a, "0123456789abcdef") == DDK_COMM_ID_HEX);
    CHECK(ddk_comm_id_valid(a) == 1);
    rc = ddk_comm_unique_id(b, err, sizeof err);
    check(rc == 0, "second ddk_comm_unique_id: rc %d: %s", rc, err);
    CHECK(strcmp(a, b) != 0);
}

/* ddk_comm_init must refuse with want (-ENOSYS without NCCL), say why, and make nothing */
static void refused(int want, const char *what, const char *id, int world, int first_rank,
                    int local, const int *devices)
{
    if (!with_nccl)
        want = -ENOSYS;
    char err[512] = "";
    ddk_comm *c = (ddk_comm *)&err;   /* not NULL: the refusal must clear it */
    int rc = ddk_comm_init(id, world, first_rank, local, devices, &c, err, sizeof err);
    check(rc == want, "%s: rc %d, want %d (%s)", what, rc, want, err);
    check(strlen(err) > 20, "%s: no sentence in err (\"%s\")", what, err);
    check(c == NULL, "%s: a communicator was made", what);
    if (rc == 0)
        ddk_comm_destroy(c);
    else
        printf("  %s: %s\n", what, err);
}

static void test_init_refusals(void)
{
    char id[DDK_COMM_ID_HEX + 1];
    memset(id, 'a', DDK_COMM_ID_HEX);
    id[DDK_COMM_ID_HEX] = '\0';
    int devices[66];
    for (int j = 0; j < 66; j++)
        devices[j] = j;

    refused(-EINVAL, "world 0", id, 0, 0, 1, devices);
    refused(-EINVAL, "world -3", id, -3, 0, 1, devices);
    refused(-EINVAL, "local 0", id, 2, 0, 0, devices);
    refused(-EINVAL, "first_rank -1", id, 2, -1, 1, devices);
    refused(-EINVAL, "first_rank = world", id, 2, 2, 1, devices);
    refused(-EINVAL, "first_rank + local > world", id, 4, 3, 2, devices);
    refused(-EINVAL, "first_rank + local overflows", id, 4, 2147483647, 1, devices);
    refused(-EINVAL, "local > devices available", NULL, gpus + 1, 0, gpus + 1, devices);
    refused(-EINVAL, "bad id: too short", "0123abcd", 2, 0, 1, devices);
    id[10] = 'z';
    refused(-EINVAL, "bad id: not hex", id, 2, 0, 1, devices);
    refused(-EINVAL, "no id across processes", NULL, 2, 0, 1, devices);

    char err[512] = "";
    int want = with_nccl ? -EINVAL : -ENOSYS;
    int rc = ddk_comm_allreduce_sum(NULL, NULL, 4, err, sizeof err);
    check(rc == want && *err, "all-reduce without a communicator: rc %d, want %d (%s)", rc, want, err);
    float x, *bufs[1] = { &x };
    *err = '\0';
    rc = ddk_comm_allreduce_sum(NULL, bufs, -1, err, sizeof err);
    check(rc == want && *err, "all-reduce of -1 floats: rc %d, want %d (%s)", rc, want, err);
    ddk_comm_destroy(NULL);
}

/* the GPU link's refusals that need no GPU: too few members, a GPU twice or one the process
 * lacks, a send or fence without a link (-ENOSYS without NCCL) */
static void test_link_refusals(void)
{
    const int want = with_nccl ? -EINVAL : -ENOSYS;
    int devices[2] = { 0, 0 };
    char err[512] = "";
    ddk_link *l = (ddk_link *)&err;   /* must come back NULL */
    int rc = ddk_link_init(1, devices, &l, err, sizeof err);
    check(rc == want && *err && !l, "a link of 1 GPU: rc %d, want %d (%s)", rc, want, err);
    *err = '\0';
    rc = ddk_link_init(2, devices, &l, err, sizeof err);
    check(rc == want && *err && !l, "a link of cuda:0 twice: rc %d, want %d (%s)", rc, want, err);
    devices[0] = gpus;
    devices[1] = gpus + 1;
    *err = '\0';
    rc = ddk_link_init(2, devices, &l, err, sizeof err);
    check(rc == want && *err && !l, "a link of GPUs this process lacks: rc %d, want %d (%s)", rc, want, err);
    float x;
    *err = '\0';
    rc = ddk_link_send(NULL, 0, 1, &x, &x, sizeof x, err, sizeof err);
    check(rc == want && *err, "a send without a link: rc %d (%s)", rc, err);
    *err = '\0';
    rc = ddk_link_send(NULL, 0, 1, NULL, NULL, 0, err, sizeof err);   /* nothing to copy, still refused */
    check(rc == want && *err, "a send of 0 bytes without a link or buffers: rc %d (%s)", rc, err);
    *err = '\0';
    rc = ddk_link_fence(NULL, 0, err, sizeof err);
    check(rc == want && *err, "a fence without a link: rc %d (%s)", rc, err);
    ddk_link_destroy(NULL);
    printf("  link refusals: %s\n", err);
}

/* ------------------------------------------------------------------------------------------
 * With GPUs
 */

/* count floats on GPU d holding host[0..count) (the backend's copy, then a synchronize) */
static float *upload(int d, const float *host, int64_t count)
{
    const ddk_backend *be = ddk_backend_cuda(d);
    float *x = ddk_malloc(ddk_allocator_cuda(d), (size_t)count * sizeof(float));
    if (!x) {
        fprintf(stderr, "no memory on cuda:%d for %lld floats\n", d, (long long)count);
        exit(2);
    }
    be->copy(be, x, host, (size_t)count * sizeof(float));
    ddk_cuda_synchronize(d);
    return x;
}

static void download(int d, float *host, const float *x, int64_t count)
{
    const ddk_backend *be = ddk_backend_cuda(d);
    be->copy(be, host, x, (size_t)count * sizeof(float));
    ddk_cuda_synchronize(d);
}

static void test_gpu_refusals(void)
{
    int devices[2] = { gpus, 0 };
    refused(-EINVAL, "no such GPU", NULL, 1, 0, 1, devices);
    devices[0] = -1;
    refused(-EINVAL, "GPU -1", NULL, 1, 0, 1, devices);
    if (gpus >= 2) {
        devices[0] = 0;
        refused(-EINVAL, "the same GPU twice", NULL, 2, 0, 2, devices);
    }
}

/* 1 rank: the sum over one rank is the buffer itself */
static void test_allreduce_1rank(void)
{
    enum { count = 100003 };   /* odd: no vector-width luck */
    char err[512] = "";
    int device = 0;
    ddk_comm *c = NULL;
    int rc = ddk_comm_init(NULL, 1, 0, 1, &device, &c, err, sizeof err);
    if (rc != 0 || !c) {
        check(0, "ddk_comm_init of 1 rank: rc %d: %s", rc, err);
        return;
    }
    float *want = xcalloc(count, sizeof(float)), *got = xcalloc(count, sizeof(float));
    for (int j = 0; j < count; j++)
        want[j] = (float)(j % 1000) * 0.25f - 17.0f;
    float *x = upload(0, want, count);
    /* long work queued before it, so the first poll finds the stream busy; then a launch after
     * it (a stale "not ready" left behind would end the process at that launch's check) */
    const ddk_backend *be = ddk_backend_cuda(0);
    for (int k = 0; k < 200; k++)
        be->axpby(be, count, 1.0f, x, 0.0f, x);
    rc = ddk_comm_allreduce_sum(c, &x, count, err, sizeof err);
    check(rc == 0, "all-reduce: rc %d: %s", rc, err);
    be->axpby(be, count, 1.0f, x, 0.0f, x);
    be->synchronize(be);
    rc = ddk_comm_allreduce_sum(c, &x, 0, err, sizeof err);
    check(rc == 0, "all-reduce of 0 floats: rc %d: %s", rc, err);
    download(0, got, x, count);
    CHECK(memcmp(got, want, count * sizeof(float)) == 0);
    ddk_free(ddk_allocator_cuda(0), x, count * sizeof(float));
    ddk_comm_destroy(c);
    free(want);
    free(got);
}

/* 2 ranks on GPUs 0 and 1 of this process: a[j] + b[j], exact (the values are small
 * multiples of 0.5 well within float's 24 bits) */
static void test_allreduce_2rank(void)
{
    enum { count = 1000003 };
    char err[512] = "";
    int devices[2] = { 0, 1 };
    ddk_comm *c = NULL;
    int rc = ddk_comm_init(NULL, 2, 0, 2, devices, &c, err, sizeof err);
    if (rc != 0 || !c) {
        check(0, "ddk_comm_init of 2 ranks: rc %d: %s", rc, err);
        return;
    }
    float *a = xcalloc(count, sizeof(float)), *b = xcalloc(count, sizeof(float));
    float *got = xcalloc(count, sizeof(float));
    for (int j = 0; j < count; j++) {
        a[j] = (float)j;
        b[j] = 2.0f * (float)j + 0.5f;
    }
    float *bufs[2] = { upload(0, a, count), upload(1, b, count) };
    for (int round = 0; round < 2; round++) {   /* twice: the communicator is reusable */
        rc = ddk_comm_allreduce_sum(c, bufs, count, err, sizeof err);
        check(rc == 0, "all-reduce round %d: rc %d: %s", round, rc, err);
    }
    /* after two rounds: 2 * (a + b) = 6j + 1 on both GPUs */
    for (int d = 0; d < 2; d++) {
        download(d, got, bufs[d], count);
        int64_t wrong = 0, first = -1;
        for (int j = 0; j < count; j++)
            if (got[j] != 6.0f * (float)j + 1.0f && wrong++ == 0)
                first = j;
        check(wrong == 0, "cuda:%d: %lld of %d sums wrong (first [%lld] = %g, want %g)", d,
              (long long)wrong, count, (long long)first, first >= 0 ? got[first] : 0.0,
              first >= 0 ? 6.0 * first + 1.0 : 0.0);
        ddk_free(ddk_allocator_cuda(d), bufs[d], count * sizeof(float));
    }
    ddk_comm_destroy(c);
    free(a);
    free(b);
    free(got);
}

/* the link of cuda:0 and cuda:1, or NULL (a failed check) */
static ddk_link *link_2gpu(void)
{
    char err[512] = "";
    int devices[2] = { 0, 1 };
    ddk_link *l = NULL;
    const int rc = ddk_link_init(2, devices, &l, err, sizeof err);
    check(rc == 0 && l, "ddk_link_init of cuda:0, cuda:1: rc %d: %s", rc, err);
    return rc == 0 ? l : NULL;
}

/* 2 GPUs: a copy over the link is ordered after the sender's queued work (200 updates of its
 * source) and before the sender's next op (which zeroes the source), and the receiver's op after
 * the fence (a doubling) reads what arrived: 2 * (the source's last value), exactly. Twice, into
 * the same buffer (the link's events are reusable). */
static void test_link_2gpu(void)
{
    enum { count = 1000003 };
    char err[512] = "";
    int rc;
    ddk_link *l = link_2gpu();
    if (!l)
        return;
    float *host = xcalloc(count, sizeof(float)), *got = xcalloc(count, sizeof(float));
    for (int j = 0; j < count; j++)
        host[j] = (float)(j % 4096) - 1000.0f;
    float *src = upload(0, host, count), *dst = upload(1, host, count);
    const ddk_backend *a = ddk_backend_cuda(0), *b = ddk_backend_cuda(1);
    for (int round = 1; round <= 2; round++) {
        a->copy(a, src, host, count * sizeof(float));
        for (int k = 0; k < 200; k++)   /* long work queued: src := src, 200 times */
            a->axpby(a, count, 1.0f, src, 0.0f, src);
        a->axpby(a, count, (float)round, src, 0.0f, src);   /* src := round * host, last */
        rc = ddk_link_send(l, 0, 1, src, dst, count * sizeof(float), err, sizeof err);
        check(rc == 0, "send round %d: rc %d: %s", round, rc, err);
        a->zero(a, src, count * sizeof(float));             /* after the send has read it */
        rc = ddk_link_fence(l, 1, err, sizeof err);
        check(rc == 0, "fence round %d: rc %d: %s", round, rc, err);
        b->axpby(b, count, 2.0f, dst, 0.0f, dst);           /* after the copy has landed */
        download(1, got, dst, count);
        int64_t wrong = 0, first = -1;
        for (int j = 0; j < count; j++)
            if (got[j] != 2.0f * (float)round * host[j] && wrong++ == 0)
                first = j;
        check(wrong == 0, "round %d: %lld of %d values wrong (first [%lld] = %g, want %g)", round,
              (long long)wrong, count, (long long)first, first >= 0 ? got[first] : 0.0,
              first >= 0 ? 2.0 * round * host[first] : 0.0);
    }
    ddk_cuda_synchronize(0);
    ddk_free(ddk_allocator_cuda(0), src, count * sizeof(float));
    ddk_free(ddk_allocator_cuda(1), dst, count * sizeof(float));
    ddk_link_destroy(l);
    free(host);
    free(got);
}

/* how many of got[0..count) differ from want, the first at *first (-1: none) */
static int64_t mismatches(const float *got, const float *want, int64_t count, int64_t *first)
{
    int64_t wrong = 0;
    *first = -1;
    for (int64_t j = 0; j < count; j++)
        if (got[j] != want[j] && wrong++ == 0)
            *first = j;
    return wrong;
}

/* got against want, exactly, as one check named what */
static void expect_exact(const char *what, const float *got, const float *want, int64_t count)
{
    int64_t first;
    int64_t wrong = mismatches(got, want, count, &first);
    check(wrong == 0, "%s: %lld of %lld values wrong (first [%lld] = %g, want %g)", what, (long long)wrong,
          (long long)count, (long long)first, first >= 0 ? got[first] : 0.0, first >= 0 ? want[first] : 0.0);
}

/* 2 GPUs: a copy into a buffer the receiver's queued ops still read. The receiver queues long
 * reads of dst (y := dst, 200 times), fences, then the copy of new values into dst is queued:
 * every read saw the old values (y = old, exactly), and after a second fence dst holds the new
 * ones. Without the fence's wait the copy lands while the reads still run. */
static void test_link_reuse_2gpu(void)
{
    enum { count = 1000003 };
    char err[512] = "";
    int rc;
    ddk_link *l = link_2gpu();
    if (!l)
        return;
    float *old = xcalloc(count, sizeof(float)), *fresh = xcalloc(count, sizeof(float));
    float *got = xcalloc(count, sizeof(float));
    for (int j = 0; j < count; j++) {
        old[j] = (float)(j % 4096) - 1000.0f;
        fresh[j] = -old[j] - 7.0f;   /* never old[j] (that needs old[j] = -3.5) */
    }
    float *src = upload(0, fresh, count), *dst = upload(1, old, count), *y = upload(1, got, count);
    const ddk_backend *b = ddk_backend_cuda(1);
    for (int k = 0; k < 200; k++)
        b->axpby(b, count, 1.0f, dst, 0.0f, y);   /* y := dst: reads dst, 200 times */
    rc = ddk_link_fence(l, 1, err, sizeof err);
    check(rc == 0, "fence before the copy: rc %d: %s", rc, err);
    rc = ddk_link_send(l, 0, 1, src, dst, count * sizeof(float), err, sizeof err);
    check(rc == 0, "send: rc %d: %s", rc, err);
    rc = ddk_link_fence(l, 1, err, sizeof err);
    check(rc == 0, "fence after the copy: rc %d: %s", rc, err);
    download(1, got, y, count);
    expect_exact("the reads queued before the fence (y)", got, old, count);
    download(1, got, dst, count);
    expect_exact("the copy (dst)", got, fresh, count);
    ddk_cuda_synchronize(0);
    ddk_free(ddk_allocator_cuda(0), src, count * sizeof(float));
    ddk_free(ddk_allocator_cuda(1), dst, count * sizeof(float));
    ddk_free(ddk_allocator_cuda(1), y, count * sizeof(float));
    ddk_link_destroy(l);
    free(old);
    free(fresh);
    free(got);
}

/* a thread's link copies: rounds sends of src (member 0) into dst (member 1) */
typedef struct copier {
    ddk_link *l;
    const float *src;
    float *dst;
    size_t bytes;
    int rounds, rc;
    char err[512];
} copier;

static void *copy_rounds(void *arg)
{
    copier *k = arg;
    for (int r = 0; r < k->rounds && k->rc == 0; r++)
        k->rc = ddk_link_send(k->l, 0, 1, k->src, k->dst, k->bytes, k->err, sizeof k->err);
    return NULL;
}

/* 2 GPUs, two communicators on them at once (a split's link, the data-parallel all-reduce):
 * another thread copies over the link while this one all-reduces. The process's NCCL order
 * (ddk.h) keeps both going: every sum exact after 8 rounds (2^7 (a + b), small integers and
 * halves: exact in fp32), the copy exact, and no deadlock (ctest's timeout would end a hang). */
static void test_allreduce_with_link_2gpu(void)
{
    enum { count = 1000003, rounds = 8 };
    char err[512] = "";
    int devices[2] = { 0, 1 };
    ddk_comm *c = NULL;
    ddk_link *l = NULL;
    int rc = ddk_comm_init(NULL, 2, 0, 2, devices, &c, err, sizeof err);
    if (rc == 0)
        rc = ddk_link_init(2, devices, &l, err, sizeof err);
    if (rc != 0) {
        check(0, "ddk_comm_init / ddk_link_init on cuda:0, cuda:1: rc %d: %s", rc, err);
        ddk_comm_destroy(c);
        return;
    }
    float *a = xcalloc(count, sizeof(float)), *b = xcalloc(count, sizeof(float));
    float *sum = xcalloc(count, sizeof(float)), *got = xcalloc(count, sizeof(float));
    for (int j = 0; j < count; j++) {
        a[j] = (float)(j % 100);
        b[j] = 2.0f * (float)(j % 100) + 0.5f;
        sum[j] = (float)(1 << (rounds - 1)) * (a[j] + b[j]);
    }
    float *bufs[2] = { upload(0, a, count), upload(1, b, count) };
    float *src = upload(0, b, count), *dst = upload(1, got, count);
    copier k = { .l = l, .src = src, .dst = dst, .bytes = count * sizeof(float), .rounds = 2 * rounds };
    pthread_t thread;
    const int started = pthread_create(&thread, NULL, copy_rounds, &k) == 0;
    check(started, "no thread for the link's copies");
    for (int round = 0; round < rounds; round++) {
        rc = ddk_comm_allreduce_sum(c, bufs, count, err, sizeof err);
        check(rc == 0, "all-reduce round %d beside the copies: rc %d: %s", round, rc, err);
    }
    if (started)
        pthread_join(thread, NULL);
    check(k.rc == 0, "the copies beside the all-reduces: rc %d: %s", k.rc, k.err);
    rc = ddk_link_fence(l, 1, err, sizeof err);
    check(rc == 0, "fence: rc %d: %s", rc, err);
    for (int d = 0; d < 2; d++) {
        download(d, got, bufs[d], count);
        expect_exact(d ? "the sums on cuda:1" : "the sums on cuda:0", got, sum, count);
        ddk_free(ddk_allocator_cuda(d), bufs[d], count * sizeof(float));
    }
    download(1, got, dst, count);
    expect_exact("the copy", got, b, count);
    ddk_cuda_synchronize(0);
    ddk_free(ddk_allocator_cuda(0), src, count * sizeof(float));
    ddk_free(ddk_allocator_cuda(1), dst, count * sizeof(float));
    ddk_link_destroy(l);
    ddk_comm_destroy(c);
    free(a);
    free(b);
    free(sum);
    free(got);
}

int main(void)
{
    with_nccl = ddk_has_nccl();
    gpus = ddk_cuda_device_count();
    printf("libddk %s NCCL; %d GPU(s)\n", with_nccl ? "with" : "without", gpus);
    static const test_case cpu_cases[] = {
        { "id_valid", test_id_valid },
        { "unique_id", test_unique_id },
        { "init_refusals", test_init_refusals },
        { "link_refusals", test_link_refusals },
    };
    run_cases(cpu_cases, sizeof cpu_cases / sizeof cpu_cases[0]);
    if (!with_nccl || gpus == 0) {
        printf("SKIPPED: no %s (gpu_refusals, allreduce_1rank, allreduce_2rank, link_2gpu, "
               "link_reuse_2gpu, allreduce_with_link_2gpu not run)\n", with_nccl ? "GPU" : "NCCL");
    } else {
        run_case("gpu_refusals", test_gpu_refusals);
        run_case("allreduce_1rank", test_allreduce_1rank);
        if (gpus >= 2) {
            run_case("allreduce_2rank", test_allreduce_2rank);
            run_case("link_2gpu", test_link_2gpu);
            run_case("link_reuse_2gpu", test_link_reuse_2gpu);
            run_case("allreduce_with_link_2gpu", test_allreduce_with_link_2gpu);
        } else {
            printf("SKIPPED: one GPU (allreduce_2rank, link_2gpu, link_reuse_2gpu and "
                   "allreduce_with_link_2gpu need two)\n");
        }
    }
    return cases_summary();
}
