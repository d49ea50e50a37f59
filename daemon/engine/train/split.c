/* split.c: the split placement's target ranks and their hand-off to the drafter ranks (split.h).
 *
 * A batch: target rank j of T takes the contiguous slice [first_j, first_j + n_j) of the batch's
 * destinations (ddt_slice_first, as the trainer slices a step over its ranks), in its own thread, and
 * for each sequence: samples its tokens with its generator (generated data), prefills them with
 * the run's taps into its one pair of buffers (features, teacher: one sequence), adds the
 * noise there, and hands both to the destination:
 *   - GPUs: ddk_link_send, queued on the link's streams after the prefill; the target's stream
 *     waits for the send before the next prefill rewrites the buffers, and the drafter's compute
 *     is ordered after its receives by the fence in ddt_split_wait;
 *   - CPU ranks: be->copy into the destination (the CPU backend's ops are done when they
 *     return).
 * The arithmetic is the host target's: an fp32 replica on a CPU rank gives the bits the host's
 * source gives, so a split run on CPU ranks repeats a host-target run bit for bit.
 * Tested by tests/engine/train/test_trainer.c and tests/kernels/test_comm.c (the link).
 */
#include "split.h"
#include "data/batch.h"
#include "base/errors.h"
#include "data/source.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct target_rank {
    struct ddt_split *s;
    int index;                    /* j: its link member is drafters + j */
    int device;                   /* its GPU, or its CPU rank (after the drafter's) */
    const ddk_backend *be;
    ddt_target_model replica;
    ddt_generator gen;            /* generates: its decoder over replica (else zeroed) */
    float *features, *teacher;    /* (S, L_t*H), (S, H) or NULL: one sequence, be's memory */
    size_t bytes;
    pthread_t thread;
    int started;                  /* thread runs the batch in flight */
    int rc;
    char err[512];
} target_rank;

struct ddt_split {
    const ddt_run_config *c;      /* the trainer's (outlives the split) */
    ddt_source_config data;       /* generates: the data's rules */
    int generates, gpu, targets, drafters;
    const ddk_backend *drafter_be[DDT_MAX_RANKS];
    ddk_link *link;               /* GPUs: members 0..drafters-1 the drafter's, then the targets */
    target_rank rank[DDT_MAX_RANKS];
    const ddt_split_dest *dest;   /* the batch in flight, or the last one */
    int64_t n;
    int running;                  /* 1: started, not waited for */
    int rc;                       /* the last batch's answer, and err's words */
    char err[600];
};

int ddt_replica_open(const ddt_run_config *c, const ddk_backend *be, int bf16, ddt_target_model *m,
                     ddt_generator *gen, char *err, size_t err_len)
{
    const ddt_target_options o = { .be = be, .bf16 = bf16 };
    int rc = c->target_kind == DDT_SOURCE_SYNTHETIC
                 ? ddt_target_open_synthetic_with(&c->synthetic, ddt_generate_seed(c->seed, 0, "target"), &o, m, err,
                                                  err_len)
                 : ddt_target_open_with(c->target_path, &o, m, err, err_len);
    if (!rc && (m->hidden != c->drafter.hidden || m->vocab != c->drafter.vocab)) {
        snprintf(err, err_len, "its shape (hidden %lld, vocab %lld) is not the drafter's (%lld, %lld)",
                 (long long)m->hidden, (long long)m->vocab, (long long)c->drafter.hidden,
                 (long long)c->drafter.vocab);
        rc = -EINVAL;
    }
    if (!rc && gen)   /* the cache of one sequence and the sampling workspace */
        rc = ddt_generator_open(gen, be, m, c->seq_len, err, err_len);
    return rc;
}

/* One sequence through rank r to d: 0, or an errno with r->err */
static int hand_off(target_rank *r, const ddt_split_dest *d)
{
    ddt_split *s = r->s;
    const ddt_run_config *c = s->c;
    const int64_t S = c->seq_len, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const ddk_backend *be = r->be;
    int rc = 0;
    if (d->sample && (rc = ddt_source_generate(&s->data, &r->gen, 0, d->index, d->tokens, NULL, r->err, sizeof r->err)))
        return rc;
    if ((rc = ddt_target_prefill(be, &r->replica, d->tokens, S, c->drafter.target_layer_ids, (int)c->drafter.taps,
                                 r->features, d->teacher ? r->teacher : NULL, NULL))) {
        snprintf(r->err, sizeof r->err, "its forward failed: %s", strerror(-rc));
        return rc;
    }
    if (d->noise)
        be->uniform_noise(be, r->features, S * LH, c->noise_std, d->noise_seed);
    const size_t fbytes = (size_t)(S * LH) * sizeof(float), tbytes = (size_t)(S * H) * sizeof(float);
    if (!s->link) {   /* CPU ranks: the copy is done when it returns */
        be->copy(be, d->features, r->features, fbytes);
        if (d->teacher)
            be->copy(be, d->teacher, r->teacher, tbytes);
        return 0;
    }
    const int from = s->drafters + r->index;
    rc = ddk_link_send(s->link, from, d->drafter, r->features, d->features, fbytes, r->err, sizeof r->err);
    if (!rc && d->teacher)
        rc = ddk_link_send(s->link, from, d->drafter, r->teacher, d->teacher, tbytes, r->err, sizeof r->err);
    return rc;
}

static void *rank_main(void *arg)
{
    target_rank *r = arg;
    const ddt_split *s = r->s;
    const int64_t first = ddt_slice_first(s->n, s->targets, r->index), end = ddt_slice_first(s->n, s->targets, r->index + 1);
    r->rc = 0;
    for (int64_t i = first; i < end && r->rc == 0; i++)
        r->rc = hand_off(r, &s->dest[i]);
    if (r->rc == 0)
        r->be->synchronize(r->be);   /* its forward's errors surface here, on its thread */
    return NULL;
}

void ddt_split_start(ddt_split *s, const ddt_split_dest *dest, int64_t n)
{
    s->dest = dest;
    s->n = n;
    s->running = 1;
    /* the copies into a drafter's batch wait for what its backend has queued on the batch before
     * now (ddk_link_send's contract: fence between the reads and the send): a held-out sequence
     * without a kept anchor leaves no synchronize between two evaluation batches */
    char err[256] = "";
    int rc = 0;
    for (int d = 0; s->link && d < s->drafters && !rc; d++)
        rc = ddk_link_fence(s->link, d, err, sizeof err);
    for (int j = 0; j < s->targets; j++) {
        target_rank *r = &s->rank[j];
        r->started = !rc && pthread_create(&r->thread, NULL, rank_main, r) == 0;
        if (!r->started) {
            r->rc = rc ? rc : -EAGAIN;
            snprintf(r->err, sizeof r->err, "%s", rc ? err : "no thread could be started for it");
        }
    }
}

int ddt_split_wait(ddt_split *s, char *err, size_t err_len)
{
    if (!s->running) {   /* waited for already: its answer again */
        if (s->rc)
            snprintf(err, err_len, "%s", s->err);
        return s->rc;
    }
    s->running = 0;
    s->rc = 0;
    for (int j = 0; j < s->targets; j++) {
        target_rank *r = &s->rank[j];
        if (r->started)
            pthread_join(r->thread, NULL);
        r->started = 0;
        if (r->rc && !s->rc) {
            s->rc = r->rc;
            snprintf(s->err, sizeof s->err, "target rank %d (%s:%d): %s", j, r->be->name, r->device, r->err);
        }
    }
    for (int d = 0; s->link && d < s->drafters && !s->rc; d++)
        s->rc = ddk_link_fence(s->link, d, s->err, sizeof s->err);
    if (s->rc)
        snprintf(err, err_len, "%s", s->err);
    return s->rc;
}

int ddt_split_open(const ddt_run_config *c, const ddt_devices *dev, const ddk_backend *const *drafter_be,
                   int drafters, int generates, ddt_split **out, char *err, size_t err_len)
{
    *out = NULL;
    ddt_split *s = calloc(1, sizeof *s);
    if (!s)
        return ddt_fail(err, err_len, -ENOMEM, "no memory for the split's target ranks");
    s->c = c;
    s->generates = generates;
    s->gpu = dev->gpu;
    s->targets = dev->target_ranks;
    s->drafters = drafters;
    memcpy(s->drafter_be, drafter_be, (size_t)drafters * sizeof *drafter_be);
    if (generates) {
        ddt_run_config_source(c, &s->data);
        s->data.shards = NULL;
    }
    const int64_t S = c->seq_len, H = c->drafter.hidden, LH = c->drafter.taps * H;
    const int teacher = c->ce_target_teacher || c->kl_weight > 0.0f;
    int rc = 0;
    for (int j = 0; j < s->targets && !rc; j++) {
        target_rank *r = &s->rank[j];
        r->s = s;
        r->index = j;
        r->device = s->gpu ? dev->target_gpu_ids[j] : drafters + j;
        char why[900] = "";
        r->be = s->gpu ? ddk_backend_cuda_or_why(r->device, why, sizeof why) : ddk_backend_cpu_rank(r->device);
        rc = r->be ? ddt_replica_open(c, r->be, s->gpu, &r->replica, generates ? &r->gen : NULL, why, sizeof why)
                   : errno == ENOMEM ? -ENOMEM : -ENODEV;
        if (!rc) {
            r->bytes = (size_t)(S * (LH + (teacher ? H : 0))) * sizeof(float);
            if (c->budget_bytes)
                ddk_allocator_set_budget(r->be->alloc, (size_t)c->budget_bytes);
            r->features = ddk_malloc(r->be->alloc, r->bytes);
            r->teacher = r->features && teacher ? r->features + S * LH : NULL;
            if (!r->features) {
                snprintf(why, sizeof why, "no memory for one sequence's features");
                rc = -ENOMEM;
            }
        }
        if (rc)
            snprintf(err, err_len, "target rank %d (%s:%d): its replica of the target (target.devices, a split): "
                     "%s%s", j, s->gpu ? "cuda" : "cpu", r->device, why,
                     rc == -ENOMEM ? "; see `ddtreed plan`" : "");
    }
    if (!rc && s->gpu) {   /* the drafter's GPUs first, then the target's */
        int devices[2 * DDT_MAX_RANKS];
        memcpy(devices, dev->gpu_ids, (size_t)drafters * sizeof *devices);
        for (int j = 0; j < s->targets; j++)
            devices[drafters + j] = dev->target_gpu_ids[j];
        rc = ddk_link_init(drafters + s->targets, devices, &s->link, err, err_len);
    }
    if (rc) {
        ddt_split_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

void ddt_split_close(ddt_split *s)
{
    if (!s)
        return;
    char err[8];
    ddt_split_wait(s, err, sizeof err);
    for (int j = 0; j < s->targets; j++) {
        target_rank *r = &s->rank[j];
        if (!r->be)
            continue;
        r->be->synchronize(r->be);   /* no send reads the buffers any more */
        ddk_free(r->be->alloc, r->features, r->bytes);
        ddt_generator_free(&r->gen);
        ddt_target_close(&r->replica);
        ddk_allocator_set_budget(r->be->alloc, 0);
    }
    for (int d = 0; d < s->drafters && s->link; d++)
        s->drafter_be[d]->synchronize(s->drafter_be[d]);   /* nor writes into the drafter's */
    ddk_link_destroy(s->link);
    free(s);
}

void ddt_split_reset_peaks(ddt_split *s)
{
    for (int j = 0; j < s->targets; j++)
        ddk_allocator_reset_peak(s->rank[j].be->alloc);
}

const ddt_target_model *ddt_split_replica(const ddt_split *s)
{
    return &s->rank[0].replica;
}

ddt_generator *ddt_split_generator(ddt_split *s)
{
    return &s->rank[0].gen;
}
