/* source.c: the feature sources of source.h. Every training sequence is a pure function of
 * (config, cursor) and every held-out one of (config, index), so the loader thread may run
 * ahead, be restarted anywhere (seek) and never change what the trainer sees:
 *   - generated (synthetic, hf without a token file): sequence i of the "train" stream is
 *     sampled with seed ddt_generate_seed(seed, i, "train"), held-out i with (seed, i,
 *     "heldout"); features and teacher from ddt_target_forward over the tokens;
 *   - listed (hf with a token file, shards; both read and checked by shard.h): the usable
 *     sequences (>= DDT_SHARD_MIN_TRAINED tokens, cut to seq_len) in file order, the last
 *     `heldout` of them kept apart; training cursor c is item perm_e[c mod n]
 *     of epoch e = c / n, perm_e a Fisher-Yates shuffle seeded by ddt_generate_seed(seed, e,
 *     "epoch").
 * The queue: prefetch + 1 slots, each free, being written (by the loader), ready (holding
 * sequence `cursor` of its tag) or held (the sequence last handed out, untouched until the
 * next call that returns one, seeks included). The loader fills cursors [cursor, cursor +
 * prefetch), so a free slot is always there when it starts one. A seek frees the ready slots
 * and bumps a generation number: what the loader was computing for the old one is dropped.
 * A loader error stops it at that cursor; next() reports it there.
 * Not here: GPU memory (sequences are host float32; the trainer uploads them), caching
 * features of held-out sequences (their generated tokens are cached: the decode is the cost).
 * Tested by tests/test_source.c.
 *
 * Legend: S tokens of a sequence, H hidden, L_t taps, V vocabulary, N slots.
 */
#include "source.h"
#include "ddk_rng.h"
#include "generate.h"
#include "json_fields.h"
#include "shard.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * State
 */

typedef struct item {        /* one usable sequence of a token file or a shard */
    int32_t shard;           /* shards: which file; token file: 0 */
    int64_t start, S;        /* first row in its file, rows kept (<= seq_len) */
} item;

typedef enum slot_state { SLOT_FREE, SLOT_WRITING, SLOT_READY, SLOT_HELD } slot_state;

typedef struct slot {        /* room for one sequence of up to seq_len tokens */
    ddt_sequence seq;
    void *block;
    size_t bytes;
    slot_state state;        /* queue slots only; under the source's lock */
    int64_t cursor;          /* SLOT_READY: the training sequence it holds */
} slot;

typedef struct worker {      /* what one thread needs to make sequences */
    ddt_generator gen;       /* generated sources */
    int64_t perm_epoch;      /* listed sources: the epoch perm is for, -1 none */
    int64_t *perm;           /* (n_train) */
} worker;

struct ddt_source {
    ddt_source_config cfg;
    char (*shard_paths)[1024];   /* (shard_count): cfg.shards, copied */
    int64_t H, V, target_layers;
    const ddk_backend *be;
    int generated;               /* tokens sampled from the target */
    ddt_target target;           /* synthetic and hf */
    int has_target;
    const float *embed, *lm_head;   /* (V, H) */
    float *heads;                /* shards: embed and lm_head copied (float32) */
    size_t heads_bytes;

    /* listed sources: items (n_train + n_heldout), training first */
    int64_t n_train, n_heldout;
    item *items;
    ddt_shard_tokens tokens;     /* hf: the token file */
    ddt_shard *shards;           /* (shard_count) */

    /* the loader and its queue */
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock;
    pthread_cond_t wake;         /* either side: something changed */
    int nslots;                  /* N = prefetch + 1 */
    slot *slots;                 /* (N) */
    worker loader;
    int64_t cursor;              /* training sequences handed out */
    int64_t produced;            /* sequences [cursor, produced) are ready */
    uint64_t generation;         /* bumped by seek */
    int stop, failed, fail_rc;
    char fail_err[1024];

    /* held-out, on the caller's thread */
    worker heldout_worker;
    slot heldout_slot;
    int32_t *heldout_tokens;     /* generated: (n_heldout, S) once known */
    uint8_t *heldout_known;      /* (n_heldout) */
};

__attribute__((format(printf, 4, 5))) static int fail(char *err, size_t err_len, int rc,
                                                      const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(err, err_len, fmt, args);
    va_end(args);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Sequence buffers
 */

static int slot_init(slot *sl, const ddt_source *s)
{
    const int64_t S = s->cfg.seq_len, H = s->H, F = s->cfg.n_taps * H;
    const int teacher = s->cfg.want_teacher;
    /* floats first (64-byte aligned block), then ids and mask */
    sl->bytes = (size_t)(S * F + (teacher ? S * H : 0)) * sizeof(float) + (size_t)S * (sizeof(int32_t) + 1);
    sl->block = ddk_malloc(ddk_allocator_cpu(), sl->bytes);
    if (!sl->block)
        return -ENOMEM;
    sl->seq.features = sl->block;
    sl->seq.teacher_hidden = teacher ? sl->seq.features + S * F : NULL;
    sl->seq.input_ids = (int32_t *)(sl->seq.features + S * F + (teacher ? S * H : 0));
    sl->seq.loss_mask = (uint8_t *)(sl->seq.input_ids + S);
    sl->seq.S = 0;
    return 0;
}

static void slot_free(slot *sl)
{
    if (sl->block)
        ddk_free(ddk_allocator_cpu(), sl->block, sl->bytes);
    sl->block = NULL;
}

/* shuffles: whether this worker makes training sequences of a listed source */
static int worker_init(worker *w, const ddt_source *s, int shuffles, char *err, size_t err_len)
{
    w->perm_epoch = -1;
    if (s->generated)
        return ddt_generator_init(&w->gen, s->be, &s->target, s->cfg.seq_len, err, err_len);
    if (!shuffles)
        return 0;
    w->perm = malloc((size_t)s->n_train * sizeof *w->perm);
    return w->perm ? 0 : fail(err, err_len, -ENOMEM, "source: no memory for a shuffle of %lld sequences",
                              (long long)s->n_train);
}

static void worker_free(worker *w)
{
    if (w->gen.block)
        ddt_generator_free(&w->gen);
    free(w->perm);
    w->perm = NULL;
}

/* ------------------------------------------------------------------------------------------
 * Making one sequence
 */

/* features and teacher of sl's tokens from the target */
static int target_features(const ddt_source *s, slot *sl, char *err, size_t err_len)
{
    ddt_sequence *q = &sl->seq;
    int rc = ddt_target_forward(s->be, &s->target, q->input_ids, q->S, s->cfg.taps, s->cfg.n_taps,
                                q->features, s->cfg.want_teacher ? q->teacher_hidden : NULL);
    return rc ? fail(err, err_len, rc, "the target's forward failed: %s", strerror(-rc)) : 0;
}

static int generate_tokens(const ddt_source *s, worker *w, uint64_t seed, int32_t *tokens,
                           char *err, size_t err_len)
{
    const ddt_generate_params p = { s->cfg.temperature, s->cfg.top_p };
    int rc = ddt_generate(&w->gen, &p, seed, NULL, 0, s->cfg.seq_len, tokens, NULL);
    return rc ? fail(err, err_len, rc, "generation failed: %s", strerror(-rc)) : 0;
}

/* a listed item into sl */
static int fill_item(const ddt_source *s, const item *it, slot *sl, char *err, size_t err_len)
{
    ddt_sequence *q = &sl->seq;
    q->S = it->S;
    if (s->cfg.kind == DDT_SOURCE_HF) {
        memcpy(q->input_ids, s->tokens.input_ids + it->start, (size_t)it->S * sizeof(int32_t));
        memset(q->loss_mask, 1, (size_t)it->S);
        return target_features(s, sl, err, err_len);
    }
    ddt_shard_rows(&s->shards[it->shard], it->start, it->S, q->input_ids, q->loss_mask, q->features,
                   s->cfg.want_teacher ? q->teacher_hidden : NULL);
    return 0;
}

/* the permutation of epoch e over the n_train training items */
static void shuffle(const ddt_source *s, worker *w, int64_t epoch)
{
    const int64_t n = s->n_train;
    for (int64_t i = 0; i < n; i++)
        w->perm[i] = i;
    uint64_t rng = ddt_generate_seed(s->cfg.seed, epoch, "epoch");
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(ddk_rng_next(&rng) % (uint64_t)(i + 1)), x = w->perm[i];
        w->perm[i] = w->perm[j];
        w->perm[j] = x;
    }
    w->perm_epoch = epoch;
}

/* training sequence `cursor` into sl */
static int fill_train(const ddt_source *s, worker *w, int64_t cursor, slot *sl, char *err, size_t err_len)
{
    if (s->generated) {
        sl->seq.S = s->cfg.seq_len;
        memset(sl->seq.loss_mask, 1, (size_t)sl->seq.S);
        int rc = generate_tokens(s, w, ddt_generate_seed(s->cfg.seed, cursor, "train"), sl->seq.input_ids,
                                 err, err_len);
        return rc ? rc : target_features(s, sl, err, err_len);
    }
    const int64_t epoch = cursor / s->n_train;
    if (w->perm_epoch != epoch)
        shuffle(s, w, epoch);
    return fill_item(s, &s->items[w->perm[cursor % s->n_train]], sl, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * The loader thread
 */

static void *loader_main(void *arg)
{
    ddt_source *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stop && (s->failed || s->produced >= s->cursor + s->cfg.prefetch))
            pthread_cond_wait(&s->wake, &s->lock);
        if (s->stop)
            break;
        const int64_t c = s->produced;
        const uint64_t generation = s->generation;
        slot *sl = NULL;   /* one is free: at most prefetch - 1 ready and one held (see the top) */
        for (int i = 0; i < s->nslots && !sl; i++)
            if (s->slots[i].state == SLOT_FREE)
                sl = &s->slots[i];
        if (!sl) {   /* the counting above is wrong: a programming error */
            fprintf(stderr, "%s:%d: source loader found no free slot\n", __FILE__, __LINE__);
            abort();
        }
        sl->state = SLOT_WRITING;
        pthread_mutex_unlock(&s->lock);

        char err[1024] = "";
        int rc = fill_train(s, &s->loader, c, sl, err, sizeof err);

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
        rc = fail(err, err_len, s->fail_rc, "%s", s->fail_err);
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
    if (i < 0 || i >= s->n_heldout)
        return fail(err, err_len, -EINVAL, "held-out sequence %lld does not exist (the source keeps %lld)",
                    (long long)i, (long long)s->n_heldout);
    slot *sl = &s->heldout_slot;
    int rc;
    if (s->generated) {
        const int64_t S = s->cfg.seq_len;
        int32_t *tokens = s->heldout_tokens + i * S;
        if (!s->heldout_known[i]) {
            rc = generate_tokens(s, &s->heldout_worker, ddt_generate_seed(s->cfg.seed, i, "heldout"), tokens,
                                 err, err_len);
            if (rc)
                return rc;
            s->heldout_known[i] = 1;
        }
        sl->seq.S = S;
        memcpy(sl->seq.input_ids, tokens, (size_t)S * sizeof *tokens);
        memset(sl->seq.loss_mask, 1, (size_t)S);
        rc = target_features(s, sl, err, err_len);
    } else {
        rc = fill_item(s, &s->items[s->n_train + i], sl, err, err_len);
    }
    if (!rc)
        *out = sl->seq;
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Opening: the configuration
 */

static int check_config(const ddt_source_config *c, int64_t hidden, char *err, size_t err_len)
{
    if (c->kind != DDT_SOURCE_SYNTHETIC && c->kind != DDT_SOURCE_HF && c->kind != DDT_SOURCE_SHARDS)
        return fail(err, err_len, -EINVAL, "source: unknown kind %d", (int)c->kind);
    if (hidden < 1)
        return fail(err, err_len, -EINVAL, "source: the drafter's hidden size %lld must be >= 1", (long long)hidden);
    if (c->seq_len < 2 || c->seq_len > (1 << 24))
        return fail(err, err_len, -EINVAL, "source: seq_len %lld must be in [2, %d]", (long long)c->seq_len, 1 << 24);
    if (c->n_taps < 1 || c->n_taps > 64)
        return fail(err, err_len, -EINVAL, "source: n_taps %d must be in [1, 64]", c->n_taps);
    if (c->prefetch < 1 || c->prefetch > 4096)
        return fail(err, err_len, -EINVAL, "source: prefetch %d must be in [1, 4096]", c->prefetch);
    if (c->heldout < 0)
        return fail(err, err_len, -EINVAL, "source: heldout %lld must be >= 0", (long long)c->heldout);
    const int generates = c->kind == DDT_SOURCE_SYNTHETIC || (c->kind == DDT_SOURCE_HF && !c->tokens_file[0]);
    if (generates && !(c->temperature >= 0.0f && c->temperature < 1e6f))
        return fail(err, err_len, -EINVAL, "source: temperature %g must be >= 0", (double)c->temperature);
    if (generates && !(c->top_p > 0.0f && c->top_p <= 1.0f))
        return fail(err, err_len, -EINVAL, "source: top_p %g must be in (0, 1]", (double)c->top_p);
    if (c->kind == DDT_SOURCE_SHARDS && (c->shard_count < 1 || c->shard_count > DDT_MAX_SHARDS || !c->shards))
        return fail(err, err_len, -EINVAL, "source: shards needs 1 to %d shard files (got %d)", DDT_MAX_SHARDS,
                    c->shard_count);
    if (c->kind == DDT_SOURCE_SYNTHETIC) {
        const ddt_target_config *t = &c->synthetic;
        if (t->hidden != hidden)
            return fail(err, err_len, -EINVAL, "source: the synthetic target's hidden size %lld differs from the "
                        "drafter's %lld", (long long)t->hidden, (long long)hidden);
        if (t->layers < 1 || t->layers > DDT_MAX_TARGET_LAYERS || t->heads < 1 || t->kv_heads < 1 ||
            t->heads % t->kv_heads || t->head_dim < 2 || t->head_dim > 1024 || t->head_dim % 2 ||
            t->intermediate < 1 || t->vocab < 2 || t->vocab > INT32_MAX || !(t->rms_norm_eps > 0.0f) ||
            !(t->rope_theta > 0.0f))
            return fail(err, err_len, -EINVAL, "source: the synthetic target's shape is invalid (layers 1..%d, "
                        "heads a multiple of kv_heads, head_dim even <= 1024, vocab >= 2, eps and theta > 0)",
                        DDT_MAX_TARGET_LAYERS);
    }
    return 0;
}

static int check_taps(const ddt_source *s, char *err, size_t err_len)
{
    for (int i = 0; i < s->cfg.n_taps; i++)
        if (s->cfg.taps[i] < 0 || s->cfg.taps[i] >= s->target_layers)
            return fail(err, err_len, -EINVAL, "source: target layer id %d is not a layer of the target (0 .. %lld)",
                        s->cfg.taps[i], (long long)s->target_layers - 1);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Opening: listed sequences (token file, shards)
 */

/* the usable sequences of a checked file (offsets (nseq + 1), shard id sh) appended to
 * s->items, all counted as training for now */
static int add_items(ddt_source *s, const char *path, const int64_t *offsets, int64_t nseq, int32_t sh,
                     int64_t *capacity, char *err, size_t err_len)
{
    for (int64_t q = 0; q < nseq; q++) {
        const int64_t a = offsets[q], b = offsets[q + 1];
        if (b - a < DDT_SHARD_MIN_TRAINED)
            continue;
        if (s->n_train == *capacity) {
            int64_t cap = *capacity ? 2 * *capacity : 1024;
            item *grown = realloc(s->items, (size_t)cap * sizeof *grown);
            if (!grown)
                return fail(err, err_len, -ENOMEM, "%s: no memory for the sequence list", path);
            s->items = grown;
            *capacity = cap;
        }
        s->items[s->n_train++] = (item){ sh, a, b - a < s->cfg.seq_len ? b - a : s->cfg.seq_len };
    }
    return 0;
}

/* all items were counted as training: the last `heldout` become held-out */
static int reserve_heldout(ddt_source *s, const char *what, char *err, size_t err_len)
{
    if (s->n_train < s->cfg.heldout + 1)
        return fail(err, err_len, -EINVAL, "%s: %lld usable sequences (>= %d tokens) are too few for %lld held-out "
                    "and at least one training sequence", what, (long long)s->n_train, DDT_SHARD_MIN_TRAINED,
                    (long long)s->cfg.heldout);
    s->n_heldout = s->cfg.heldout;
    s->n_train -= s->n_heldout;
    return 0;
}

static int open_token_file(ddt_source *s, char *err, size_t err_len)
{
    const char *path = s->cfg.tokens_file;
    int64_t capacity = 0;
    int rc = ddt_shard_tokens_open(path, s->V, &s->tokens, err, err_len);
    if (!rc)
        rc = add_items(s, path, s->tokens.offsets, s->tokens.nseq, 0, &capacity, err, err_len);
    return rc ? rc : reserve_heldout(s, path, err, err_len);
}

static int open_shard(ddt_source *s, int32_t index, int64_t *capacity, char *err, size_t err_len)
{
    const ddt_shard_shape want = { s->H, s->V, s->cfg.n_taps, s->cfg.taps };
    ddt_shard *sh = &s->shards[index];
    int rc = ddt_shard_open(s->shard_paths[index], &want, s->cfg.want_teacher, sh, err, err_len);
    return rc ? rc : add_items(s, s->shard_paths[index], sh->offsets, sh->nseq, index, capacity, err, err_len);
}

/* tie_word_embeddings of DIR/config.json (top level or text_config); 0 when absent */
static int config_ties(const char *dir)
{
    char path[1100], err[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    cJSON *root = ddt_json_parse_file(path, 1 << 22, err, sizeof err);
    if (!root)
        return 0;
    const cJSON *tie = cJSON_GetObjectItemCaseSensitive(root, "tie_word_embeddings");
    if (!tie)
        tie = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "text_config"),
                                               "tie_word_embeddings");
    int tied = cJSON_IsTrue(tie);
    cJSON_Delete(root);
    return tied;
}

/* embed_tokens and lm_head of model_dir, float32 */
static int open_heads(ddt_source *s, char *err, size_t err_len)
{
    const char *dir = s->cfg.model_dir;
    ddt_st_model m;
    int rc = ddt_st_model_open(dir, &m, err, err_len);
    if (rc)
        return rc;
    const ddt_st_tensor *embed = ddt_st_model_find(&m, "model.embed_tokens.weight");
    if (!embed)
        embed = ddt_st_model_find(&m, "model.language_model.embed_tokens.weight");
    const ddt_st_tensor *head = ddt_st_model_find(&m, "lm_head.weight");
    const ddt_st_tensor *both[2] = { embed, head };
    if (!embed)
        rc = fail(err, err_len, -EINVAL, "%s: neither model.embed_tokens.weight nor "
                  "model.language_model.embed_tokens.weight is there", dir);
    else if (!head && !config_ties(dir))
        rc = fail(err, err_len, -EINVAL, "%s: lm_head.weight is missing and config.json does not set "
                  "tie_word_embeddings: true", dir);
    for (int i = 0; i < 2 && !rc && both[i]; i++) {
        const ddt_st_tensor *t = both[i];
        if ((t->dtype != DDT_F32 && t->dtype != DDT_BF16 && t->dtype != DDT_F16) || t->ndim != 2 ||
            t->shape[1] != s->H || t->shape[0] < 2 || t->shape[0] > INT32_MAX || t->shape[0] != embed->shape[0])
            rc = fail(err, err_len, -EINVAL, "%s: %s must be F32, BF16 or F16 of shape [V, %lld] (the drafter's hidden "
                      "size), the same V for embed_tokens and lm_head", dir, t->name, (long long)s->H);
    }
    if (!rc) {
        s->V = embed->shape[0];
        s->heads_bytes = (size_t)((head ? 2 : 1) * s->V * s->H) * sizeof(float);
        s->heads = ddk_malloc(ddk_allocator_cpu(), s->heads_bytes);
        if (!s->heads)
            rc = fail(err, err_len, -ENOMEM, "%s: no memory for embed_tokens and lm_head", dir);
    }
    if (!rc) {
        ddt_st_to_f32(embed, s->heads);
        if (head)
            ddt_st_to_f32(head, s->heads + s->V * s->H);
        s->embed = s->heads;
        s->lm_head = head ? s->heads + s->V * s->H : s->heads;
    }
    ddt_st_model_close(&m);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Open, close, accessors
 */

static int open_data(ddt_source *s, char *err, size_t err_len)
{
    const ddt_source_config *c = &s->cfg;
    int rc;
    if (c->kind == DDT_SOURCE_SHARDS) {
        if ((rc = open_heads(s, err, err_len)))
            return rc;
        s->shards = calloc((size_t)c->shard_count, sizeof *s->shards);
        if (!s->shards)
            return fail(err, err_len, -ENOMEM, "source: no memory for %d shards", c->shard_count);
        int64_t capacity = 0;
        for (int i = 0; i < c->shard_count; i++)
            if ((rc = open_shard(s, i, &capacity, err, err_len)))
                return rc;
        return reserve_heldout(s, "shards", err, err_len);
    }
    if (c->kind == DDT_SOURCE_SYNTHETIC)
        rc = ddt_target_synthetic(&c->synthetic, ddt_generate_seed(c->seed, 0, "target"), &s->target, err, err_len);
    else
        rc = ddt_target_load(c->model_dir, &s->target, err, err_len);
    if (rc)
        return rc;
    s->has_target = 1;
    s->V = s->target.cfg.vocab;
    s->target_layers = s->target.cfg.layers;
    s->embed = s->target.embed_tokens;
    s->lm_head = s->target.lm_head;
    if (s->target.cfg.hidden != s->H)
        return fail(err, err_len, -EINVAL, "%s: the target's hidden_size %lld differs from the drafter's %lld",
                    c->kind == DDT_SOURCE_HF ? c->model_dir : "synthetic target", (long long)s->target.cfg.hidden,
                    (long long)s->H);
    if ((rc = check_taps(s, err, err_len)))
        return rc;
    if (c->kind == DDT_SOURCE_HF && c->tokens_file[0])
        return open_token_file(s, err, err_len);
    s->generated = 1;
    s->n_heldout = c->heldout;
    return 0;
}

int ddt_source_open(const ddt_source_config *c, int64_t hidden, ddt_source **out, char *err, size_t err_len)
{
    *out = NULL;
    int rc = check_config(c, hidden, err, err_len);
    if (rc)
        return rc;
    ddt_source *s = calloc(1, sizeof *s);
    if (!s)
        return fail(err, err_len, -ENOMEM, "source: out of memory");
    s->cfg = *c;
    s->cfg.shards = NULL;
    s->H = hidden;
    s->be = ddk_backend_cpu();
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->wake, NULL);
    if (c->kind == DDT_SOURCE_SHARDS) {
        s->shard_paths = malloc((size_t)c->shard_count * sizeof *s->shard_paths);
        if (!s->shard_paths)
            rc = fail(err, err_len, -ENOMEM, "source: out of memory");
        else
            memcpy(s->shard_paths, c->shards, (size_t)c->shard_count * sizeof *s->shard_paths);
    }
    if (!rc)
        rc = open_data(s, err, err_len);
    if (!rc) {
        s->nslots = c->prefetch + 1;
        s->slots = calloc((size_t)s->nslots, sizeof *s->slots);
        rc = s->slots ? 0 : -ENOMEM;
        for (int i = 0; i < s->nslots && !rc; i++)
            rc = slot_init(&s->slots[i], s);
        if (!rc)
            rc = slot_init(&s->heldout_slot, s);
        if (rc)
            fail(err, err_len, rc, "source: no memory for %d sequences of %lld tokens", s->nslots + 1,
                 (long long)c->seq_len);
    }
    if (!rc && s->generated) {
        s->heldout_tokens = malloc((size_t)(s->n_heldout * c->seq_len + 1) * sizeof(int32_t));
        s->heldout_known = calloc((size_t)s->n_heldout + 1, 1);
        if (!s->heldout_tokens || !s->heldout_known)
            rc = fail(err, err_len, -ENOMEM, "source: no memory for %lld held-out sequences", (long long)s->n_heldout);
    }
    if (!rc)
        rc = worker_init(&s->loader, s, 1, err, err_len);
    if (!rc)
        rc = worker_init(&s->heldout_worker, s, 0, err, err_len);
    if (!rc) {
        int e = pthread_create(&s->thread, NULL, loader_main, s);
        if (e)
            rc = fail(err, err_len, -e, "source: cannot start the loader thread: %s", strerror(e));
        s->thread_started = !e;
    }
    if (rc) {
        ddt_source_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

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
    worker_free(&s->loader);
    worker_free(&s->heldout_worker);
    for (int i = 0; s->slots && i < s->nslots; i++)
        slot_free(&s->slots[i]);
    free(s->slots);
    slot_free(&s->heldout_slot);
    free(s->heldout_tokens);
    free(s->heldout_known);
    for (int i = 0; s->shards && i < s->cfg.shard_count; i++)
        ddt_shard_close(&s->shards[i]);   /* a zeroed one (never opened) is a no-op */
    free(s->shards);
    free(s->shard_paths);
    ddt_shard_tokens_close(&s->tokens);
    free(s->items);
    if (s->heads)
        ddk_free(ddk_allocator_cpu(), s->heads, s->heads_bytes);
    if (s->has_target)
        ddt_target_free(&s->target);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

const float *ddt_source_embed(const ddt_source *s)
{
    return s->embed;
}

const float *ddt_source_lm_head(const ddt_source *s)
{
    return s->lm_head;
}

int64_t ddt_source_vocab(const ddt_source *s)
{
    return s->V;
}

int64_t ddt_source_target_layers(const ddt_source *s)
{
    return s->target_layers;
}
