/* source.c: the common part of the feature sources of source.h, behind which the two
 * implementations of source_impl.h make the sequences (source_generated.c: sampled by the
 * target; source_listed.c: token files and feature shards). Every training sequence is a
 * pure function of (config, cursor) and every held-out one of (config, index), so the loader
 * thread may run ahead, be restarted anywhere (seek) and never change what the trainer sees.
 * The queue: prefetch + 1 slots, each free, being written (by the loader), ready (holding
 * sequence `cursor` of its tag) or held (the sequence last handed out, untouched until the
 * next call that returns one, seeks included). The loader fills cursors [cursor, cursor +
 * prefetch), so a free slot is always there when it starts one. A seek frees the ready slots
 * and bumps a generation number: what the loader was computing for the old one is dropped.
 * A loader error stops it at that cursor; next() reports it there.
 * Not here: anything that depends on the kind of source (the implementations), GPU memory
 * (sequences are host float32; the trainer uploads them). tokens_only: the slots hold tokens
 * and masks alone and ddt_source_target_features does nothing (the trainer's ranks prefill).
 * ddt_source_check: open's rules alone, for a co-located trainer that opens no source for
 * generated data (its ranks sample with ddt_source_generate).
 * Tested by tests/engine/data/test_source.c and, for chat data, tests/daemon/chat_train_test.sh.
 *
 * Legend: S tokens of a sequence, H hidden, L_t taps, V vocabulary, N slots.
 */
#include "source.h"
#include "source_impl.h"
#include "base/errors.h"
#include "model/model_config.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * State
 */

/* The implementations, in the order they are asked whether they serve a config. */
static const ddt_source_ops *const implementations[] = { &ddt_source_generated, &ddt_source_listed,
                                                         &ddt_source_chat };

typedef enum slot_state { SLOT_FREE, SLOT_WRITING, SLOT_READY, SLOT_HELD } slot_state;

typedef struct slot {        /* room for one sequence of up to seq_len tokens */
    ddt_sequence seq;
    void *block;
    size_t bytes;
    slot_state state;        /* queue slots only; under the source's lock */
    int64_t cursor;          /* SLOT_READY: the training sequence it holds */
} slot;

struct ddt_source {
    ddt_source_base b;           /* what the implementation sees */
    const ddt_source_ops *ops;

    /* the loader and its queue */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;         /* either side: something changed */
    int nslots;                  /* N = prefetch + 1 */
    slot *slots;                 /* (N) */
    void *loader;                /* the loader's worker (ops->worker_open) */
    int64_t cursor;              /* training sequences handed out */
    int64_t produced;            /* sequences [cursor, produced) are ready */
    uint64_t generation;         /* bumped by seek */
    int stop, failed, fail_rc;
    char fail_err[1024];

    /* held-out, on the caller's thread */
    void *heldout_worker;
    slot heldout_slot;
};

/* ------------------------------------------------------------------------------------------
 * Sequence buffers
 */

/* one sequence's buffer: floats first (64-byte aligned block), then ids and mask */
static int64_t slot_bytes(const ddt_source_config *c, int64_t H)
{
    const int64_t S = c->seq_len, F = c->tokens_only ? 0 : c->n_taps * H;
    const int teacher = c->want_teacher && !c->tokens_only;
    return (S * F + (teacher ? S * H : 0)) * (int64_t)sizeof(float) + S * (int64_t)(sizeof(int32_t) + 1);
}

int64_t ddt_source_queue_bytes(const ddt_source_config *c, int64_t hidden)
{
    /* the queue's prefetch + 1 and the held-out slot; generated data's held-out tokens too */
    return (c->prefetch + 2) * slot_bytes(c, hidden) + (ddt_source_generates(c) ? ddt_source_heldout_token_bytes(c) : 0);
}

static int slot_init(slot *sl, const ddt_source_base *b)
{
    const int64_t S = b->cfg.seq_len, H = b->H, F = b->cfg.tokens_only ? 0 : b->cfg.n_taps * H;
    const int teacher = b->cfg.want_teacher && !b->cfg.tokens_only;
    sl->bytes = (size_t)slot_bytes(&b->cfg, H);
    sl->block = ddk_malloc(ddk_allocator_cpu(), sl->bytes);
    if (!sl->block)
        return -ENOMEM;
    sl->seq.features = sl->block;
    sl->seq.teacher_hidden = teacher ? sl->seq.features + S * F : NULL;
    sl->seq.input_ids = (int32_t *)(sl->seq.features + S * F + (teacher ? S * H : 0));
    sl->seq.loss_mask = (uint8_t *)(sl->seq.input_ids + S);
    if (b->cfg.tokens_only)
        sl->seq.features = NULL;
    sl->seq.S = 0;
    return 0;
}

static void slot_free(slot *sl)
{
    if (sl->block)
        ddk_free(ddk_allocator_cpu(), sl->block, sl->bytes);
    sl->block = NULL;
}

/* ------------------------------------------------------------------------------------------
 * The loader thread
 */

static void *loader_main(void *arg)
{
    ddt_source *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stop && (s->failed || s->produced >= s->cursor + s->b.cfg.prefetch))
            pthread_cond_wait(&s->wake, &s->lock);
        if (s->stop)
            break;
        const int64_t c = s->produced;
        const uint64_t generation = s->generation;
        slot *sl = NULL;   /* one is free: at most prefetch - 1 ready and one held (see the top) */
        for (int i = 0; i < s->nslots && !sl; i++)
            if (s->slots[i].state == SLOT_FREE)
                sl = &s->slots[i];
        if (!sl)   /* the counting above is wrong: a programming error */
            ddk_fatal(__FILE__, __LINE__, "source loader found no free slot");
        sl->state = SLOT_WRITING;
        pthread_mutex_unlock(&s->lock);

        char err[1024] = "";
        int rc = s->ops->train(&s->b, s->loader, c, &sl->seq, err, sizeof err);

        pthread_mutex_lock(&s->lock);
        sl->state = SLOT_FREE;
        if (generation != s->generation)
            continue;   /* a seek came: this one is not wanted */
        if (rc) {
            s->failed = 1;
            s->fail_rc = rc;
            snprintf(s->fail_err, sizeof s->fail_err, "training sequence %lld: %s", (long long)c, err);
        } else {
            sl->state = SLOT_READY;
            sl->cursor = c;
            s->produced = c + 1;
        }
        pthread_cond_broadcast(&s->wake);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

int ddt_source_next(ddt_source *s, ddt_sequence *out, char *err, size_t err_len)
{
    pthread_mutex_lock(&s->lock);
    while (s->produced <= s->cursor && !s->failed)
        pthread_cond_wait(&s->wake, &s->lock);
    int rc = 0;
    if (s->produced > s->cursor) {
        for (int i = 0; i < s->nslots; i++) {
            slot *sl = &s->slots[i];
            if (sl->state == SLOT_HELD)
                sl->state = SLOT_FREE;
            else if (sl->state == SLOT_READY && sl->cursor == s->cursor) {
                sl->state = SLOT_HELD;
                *out = sl->seq;
            }
        }
        s->cursor++;
        pthread_cond_broadcast(&s->wake);   /* a slot is free again */
    } else {
        rc = ddt_fail(err, err_len, s->fail_rc, "%s", s->fail_err);
    }
    pthread_mutex_unlock(&s->lock);
    return rc;
}

int64_t ddt_source_cursor(const ddt_source *s)
{
    return s->cursor;   /* written only by the caller's own thread (next, seek) */
}

int ddt_source_seek(ddt_source *s, int64_t cursor)
{
    if (cursor < 0)
        return -EINVAL;
    pthread_mutex_lock(&s->lock);
    s->generation++;
    s->cursor = s->produced = cursor;
    s->failed = 0;
    for (int i = 0; i < s->nslots; i++)
        if (s->slots[i].state == SLOT_READY)
            s->slots[i].state = SLOT_FREE;
    pthread_cond_broadcast(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int ddt_source_heldout(ddt_source *s, int64_t i, ddt_sequence *out, char *err, size_t err_len)
{
    if (i < 0 || i >= s->b.n_heldout)
        return ddt_fail(err, err_len, -EINVAL, "held-out sequence %lld does not exist (the source keeps %lld)",
                        (long long)i, (long long)s->b.n_heldout);
    slot *sl = &s->heldout_slot;
    int rc = s->ops->heldout(&s->b, s->heldout_worker, i, &sl->seq, err, err_len);
    if (!rc)
        *out = sl->seq;
    return rc;
}

int ddt_source_heldout_prompt(ddt_source *s, int64_t i, const int32_t **ids, int64_t *n, int32_t *stop, char *err,
                              size_t err_len)
{
    if (!s->ops->heldout_prompt)
        return -ENOTSUP;
    if (i < 0 || i >= s->b.n_heldout)
        return ddt_fail(err, err_len, -EINVAL, "held-out sequence %lld does not exist (the source keeps %lld)",
                        (long long)i, (long long)s->b.n_heldout);
    return s->ops->heldout_prompt(&s->b, s->heldout_worker, i, ids, n, stop, err, err_len);
}

int ddt_source_next_note(ddt_source *s, char *out, size_t len)
{
    return s->ops->next_note ? s->ops->next_note(&s->b, out, len) : 0;
}

/* ------------------------------------------------------------------------------------------
 * Opening
 */

static const ddt_source_ops *implementation_for(const ddt_source_config *c)
{
    for (size_t i = 0; i < sizeof implementations / sizeof *implementations; i++)
        if (implementations[i]->accepts(c))
            return implementations[i];
    return NULL;
}

/* The rules every source keeps; then the implementation's (its own kind of data). */
static int check_config(const ddt_source_ops *ops, const ddt_source_config *c, int64_t hidden, char *err,
                        size_t err_len)
{
    if (!ops)
        return ddt_fail(err, err_len, -EINVAL, "source: unknown kind %d", (int)c->kind);
    if (hidden < 1)
        return ddt_fail(err, err_len, -EINVAL, "source: the drafter's hidden size %lld must be >= 1", (long long)hidden);
    if (c->seq_len < 2 || c->seq_len > (1 << 24))
        return ddt_fail(err, err_len, -EINVAL, "source: seq_len %lld must be in [2, %d]", (long long)c->seq_len,
                        1 << 24);
    if (c->n_taps < 1 || c->n_taps > 64)
        return ddt_fail(err, err_len, -EINVAL, "source: n_taps %d must be in [1, 64]", c->n_taps);
    if (c->prefetch < 1 || c->prefetch > 4096)
        return ddt_fail(err, err_len, -EINVAL, "source: prefetch %d must be in [1, 4096]", c->prefetch);
    if (c->heldout < 0)
        return ddt_fail(err, err_len, -EINVAL, "source: heldout %lld must be >= 0", (long long)c->heldout);
    if (c->tokens_only && c->kind == DDT_SOURCE_SHARDS)
        return ddt_fail(err, err_len, -EINVAL, "source: feature shards cannot be read tokens only (their features "
                        "are the data; there is no target to compute them)");
    return ops->check(c, hidden, err, err_len);
}

int ddt_source_check(const ddt_source_config *c, int64_t hidden, int64_t layers, char *err, size_t err_len)
{
    int rc = check_config(implementation_for(c), c, hidden, err, err_len);
    return rc ? rc : ddt_source_check_taps(c, layers, err, err_len);
}

int ddt_source_target_shape(const ddt_source_config *c, int64_t *hidden, int64_t *vocab, int64_t *layers,
                            int *tied, char *err, size_t err_len)
{
    *hidden = c->synthetic.hidden;
    *vocab = c->synthetic.vocab;
    *layers = c->synthetic.layers;
    *tied = 0;
    const ddt_source_ops *ops = implementation_for(c);
    if (!ops)
        return ddt_fail(err, err_len, -EINVAL, "source: unknown kind %d", (int)c->kind);
    return ops->shape(c, hidden, vocab, layers, tied, err, err_len);
}

int ddt_source_open(const ddt_source_config *c, int64_t hidden, ddt_source **out, char *err, size_t err_len)
{
    *out = NULL;
    const ddt_source_ops *ops = implementation_for(c);
    int rc = check_config(ops, c, hidden, err, err_len);
    if (rc)
        return rc;
    ddt_source *s = calloc(1, sizeof *s);
    if (!s)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    s->b.cfg = *c;
    s->b.cfg.shards = NULL;
    s->b.H = hidden;
    s->b.be = ddk_backend_cpu();
    s->ops = ops;
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    rc = ops->open(&s->b, c, err, err_len);
    if (!rc) {
        s->nslots = c->prefetch + 1;
        s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
        rc = s->slots ? 0 : -ENOMEM;
        for (int i = 0; i < s->nslots && !rc; i++)
            rc = slot_init(&s->slots[i], &s->b);
        if (!rc)
            rc = slot_init(&s->heldout_slot, &s->b);
        if (rc)
            ddt_fail(err, err_len, rc, "source: no memory for %d sequences of %lld tokens", s->nslots + 1,
                     (long long)c->seq_len);
    }
    if (!rc)
        rc = ops->worker_open(&s->b, 1, &s->loader, err, err_len);
    if (!rc)
        rc = ops->worker_open(&s->b, 0, &s->heldout_worker, err, err_len);
    if (!rc) {
        int e = pthread_create(&s->thread, NULL, loader_main, s);
        if (e)
            rc = ddt_fail(err, err_len, -e, "source: cannot start the loader thread: %s", strerror(e));
        s->thread_started = !e;
    }
    if (rc) {
        ddt_source_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Close, accessors
 */

void ddt_source_close(ddt_source *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        pthread_mutex_lock(&s->lock);
        s->stop = 1;
        pthread_cond_broadcast(&s->wake);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
    }
    if (s->loader)
        s->ops->worker_close(s->loader);
    if (s->heldout_worker)
        s->ops->worker_close(s->heldout_worker);
    for (int i = 0; s->slots && i < s->nslots; i++)
        slot_free(&s->slots[i]);
    free(s->slots);
    slot_free(&s->heldout_slot);
    s->ops->close(&s->b);   /* after a failed open too */
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const ddt_target_model *ddt_source_target(const ddt_source *s)
{
    return s->b.target;
}

const float *ddt_source_embed(const ddt_source *s)
{
    return s->b.embed;
}

const float *ddt_source_lm_head(const ddt_source *s)
{
    return s->b.lm_head;
}

int64_t ddt_source_vocab(const ddt_source *s)
{
    return s->b.V;
}

int64_t ddt_source_target_layers(const ddt_source *s)
{
    return s->b.target_layers;
}
