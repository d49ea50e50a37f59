/* source_listed.c: the listed implementation of source_impl.h: sequences read from files, both
 * read and checked by shard.h:
 *   hf with a token file: the tokens, features and teacher from the target's forward (tokens_only:
 *           the tokens alone, the target never opened: its shape from config.json);
 *   shards: tokens, loss mask, features and teacher as the shards hold them, and the target's
 *           frozen head from its directory (ddt_target_load_head).
 * The usable sequences in file order (cut to seq_len, at least one anchor left in them: two
 * consecutive tokens of loss mask 1; a token file without a loss_mask trains every token), the
 * last `heldout` of them kept apart; training cursor c is item perm_e[c mod n] of epoch
 * e = c / n, perm_e a Fisher-Yates shuffle seeded by ddt_generate_seed(seed, e, "epoch").
 * Every sequence handed out is seq_len tokens: a shorter one is padded with id 0 at loss mask
 * 0 (features and teacher 0 from shards; the target's own from its forward), which no anchor,
 * weight or acceptance label reaches (anchors need mask 1, and a block sees only the context
 * before its anchor).
 * Tested through source.h by tests/engine/data/test_source.c.
 *
 * Legend: S tokens of a sequence.
 */
#include "source_impl.h"
#include "ddk_rng.h"
#include "base/errors.h"
#include "model/generate.h"
#include "model/safetensors.h"
#include "shard.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct item {        /* one usable sequence of a token file or a shard */
    int32_t shard;           /* shards: which file; token file: 0 */
    int64_t start, S;        /* first row in its file, rows kept (<= seq_len) */
} item;

typedef struct listed {
    int from_shards;             /* 1: shards; 0: a token file through the target */
    ddt_target_model target;     /* token file */
    ddt_shard_tokens tokens;     /* token file */
    ddt_target_head head;        /* shards: embed_tokens and lm_head */
    int shard_count;
    char (*shard_paths)[1024];   /* (shard_count): the config's, copied */
    ddt_shard *shards;           /* (shard_count) */
    int64_t n_train;             /* items: n_train training ones, then n_heldout */
    item *items;
} listed;

typedef struct shuffler {    /* the loader's: the permutation of one epoch */
    int64_t epoch;           /* what perm is for, -1 none */
    int64_t *perm;           /* (n_train) */
} shuffler;

static int accepts(const ddt_source_config *c)
{
    return (c->kind == DDT_SOURCE_HF && c->tokens_file[0]) || c->kind == DDT_SOURCE_SHARDS;
}

static int check(const ddt_source_config *c, int64_t hidden, char *err, size_t err_len)
{
    (void)hidden;
    if (c->kind == DDT_SOURCE_SHARDS && (c->shard_count < 1 || c->shard_count > DDT_MAX_SHARDS || !c->shards))
        return ddt_fail(err, err_len, -EINVAL, "source: shards needs 1 to %d shard files (got %d)", DDT_MAX_SHARDS,
                        c->shard_count);
    return 0;
}

/* hf: its config.json; shards: the first shard's metadata when at hand (hidden and vocab) */
static int shape(const ddt_source_config *c, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                 char *err, size_t err_len)
{
    if (c->kind == DDT_SOURCE_HF)
        return ddt_source_config_shape(c->model_dir, hidden, vocab, layers, tied, err, err_len);
    ddt_st_file f;
    char ignored[512];
    if (c->shard_count < 1 || !c->shards || ddt_st_open(c->shards[0], &f, ignored, sizeof ignored))
        return 0;
    const char *h = ddt_st_metadata(&f, ddt_shard_keys[DDT_SHARD_KEY_HIDDEN_SIZE]),
               *v = ddt_st_metadata(&f, ddt_shard_keys[DDT_SHARD_KEY_VOCAB_SIZE]);
    if (h && v) {
        *hidden = atoll(h);
        *vocab = atoll(v);
    }
    ddt_st_close(&f);
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Opening
 */

/* whether rows [a, a + n) of mask (NULL: all ones) hold an anchor: two consecutive ones */
static int has_anchor(const uint8_t *mask, int64_t a, int64_t n)
{
    if (!mask)
        return n >= DDT_SHARD_MIN_TRAINED;
    for (int64_t p = a; p + 1 < a + n; p++)
        if (mask[p] && mask[p + 1])
            return 1;
    return 0;
}

/* the usable sequences of a checked file (offsets (nseq + 1), loss mask (Ttot) or NULL, shard
 * id sh) appended to the items, all counted as training for now */
static int add_items(const ddt_source_base *b, listed *l, const char *path, const int64_t *offsets, int64_t nseq,
                     const uint8_t *mask, int32_t sh, int64_t *capacity, char *err, size_t err_len)
{
    for (int64_t q = 0; q < nseq; q++) {
        const int64_t a = offsets[q], e = offsets[q + 1];
        if (!has_anchor(mask, a, e - a < b->cfg.seq_len ? e - a : b->cfg.seq_len))
            continue;
        if (l->n_train == *capacity) {
            int64_t cap = *capacity ? 2 * *capacity : 1024;
            item *grown = realloc(l->items, (size_t)cap * sizeof *grown);
            if (!grown)
                return ddt_fail(err, err_len, -ENOMEM, "%s: no memory for the sequence list", path);
            l->items = grown;
            *capacity = cap;
        }
        l->items[l->n_train++] = (item){ sh, a, e - a < b->cfg.seq_len ? e - a : b->cfg.seq_len };
    }
    return 0;
}

/* all items were counted as training: the last `heldout` become held-out */
static int reserve_heldout(ddt_source_base *b, listed *l, const char *what, char *err, size_t err_len)
{
    if (l->n_train < b->cfg.heldout + 1)
        return ddt_fail(err, err_len, -EINVAL, "%s: %lld usable sequences (two consecutive trained tokens in "
                        "their first seq_len) are too few for %lld held-out and at least one training sequence",
                        what, (long long)l->n_train, (long long)b->cfg.heldout);
    b->n_heldout = b->cfg.heldout;
    l->n_train -= b->n_heldout;
    return 0;
}

static int open_token_file(ddt_source_base *b, listed *l, const ddt_source_config *c, char *err, size_t err_len)
{
    int rc;
    if (c->tokens_only) {   /* the trainer's ranks hold the target: its shape is all the tokens need */
        int64_t hidden, vocab, layers;
        int tied;
        if ((rc = ddt_source_config_shape(c->model_dir, &hidden, &vocab, &layers, &tied, err, err_len)) ||
            (rc = ddt_source_use_shape(b, hidden, vocab, layers, c->model_dir, err, err_len)))
            return rc;
    } else if ((rc = ddt_target_open(c->model_dir, &l->target, err, err_len)) ||
               (rc = ddt_source_use_target(b, &l->target, c->model_dir, err, err_len))) {
        return rc;
    }
    const char *path = c->tokens_file;
    int64_t capacity = 0;
    rc = ddt_shard_tokens_open(path, b->V, &l->tokens, err, err_len);
    if (!rc)
        rc = add_items(b, l, path, l->tokens.offsets, l->tokens.nseq, l->tokens.loss_mask, 0, &capacity, err,
                       err_len);
    return rc ? rc : reserve_heldout(b, l, path, err, err_len);
}

static int open_shards(ddt_source_base *b, listed *l, const ddt_source_config *c, char *err, size_t err_len)
{
    l->shard_paths = malloc((size_t)c->shard_count * sizeof *l->shard_paths);
    if (!l->shard_paths)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    memcpy(l->shard_paths, c->shards, (size_t)c->shard_count * sizeof *l->shard_paths);
    int rc = ddt_target_load_head(c->model_dir, b->H, &l->head, err, err_len);
    if (rc)
        return rc;
    b->V = l->head.vocab;
    b->embed = l->head.embed_tokens;
    b->lm_head = l->head.lm_head;
    l->shards = calloc((size_t)c->shard_count, sizeof *l->shards);
    if (!l->shards)
        return ddt_fail(err, err_len, -ENOMEM, "source: no memory for %d shards", c->shard_count);
    l->shard_count = c->shard_count;
    const ddt_shard_shape want = { b->H, b->V, c->n_taps, c->taps };
    int64_t capacity = 0;
    for (int i = 0; i < c->shard_count && !rc; i++) {
        ddt_shard *sh = &l->shards[i];
        rc = ddt_shard_open(l->shard_paths[i], &want, c->want_teacher, sh, err, err_len);
        if (!rc)
            rc = add_items(b, l, l->shard_paths[i], sh->offsets, sh->nseq, sh->loss_mask->data, i, &capacity, err,
                           err_len);
    }
    return rc ? rc : reserve_heldout(b, l, "shards", err, err_len);
}

static int open_listed(ddt_source_base *b, const ddt_source_config *c, char *err, size_t err_len)
{
    listed *l = calloc(1, sizeof *l);
    if (!l)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    b->data = l;
    l->from_shards = c->kind == DDT_SOURCE_SHARDS;
    return l->from_shards ? open_shards(b, l, c, err, err_len) : open_token_file(b, l, c, err, err_len);
}

static void close_listed(ddt_source_base *b)
{
    listed *l = b->data;
    if (!l)
        return;
    for (int i = 0; l->shards && i < l->shard_count; i++)
        ddt_shard_close(&l->shards[i]);   /* a zeroed one (never opened) is a no-op */
    free(l->shards);
    free(l->shard_paths);
    ddt_shard_tokens_close(&l->tokens);
    free(l->items);
    ddt_target_head_free(&l->head);
    ddt_target_close(&l->target);
    free(l);
    b->data = NULL;
}

/* ------------------------------------------------------------------------------------------
 * Making one sequence
 */

/* the loader shuffles; the held-out thread reads items in order and needs nothing */
static int worker_open(const ddt_source_base *b, int trains, void **w, char *err, size_t err_len)
{
    const listed *l = b->data;
    *w = NULL;
    if (!trains)
        return 0;
    shuffler *sh = calloc(1, sizeof *sh);
    if (sh)
        sh->perm = malloc((size_t)l->n_train * sizeof *sh->perm);
    if (!sh || !sh->perm) {
        free(sh);
        return ddt_fail(err, err_len, -ENOMEM, "source: no memory for a shuffle of %lld sequences",
                        (long long)l->n_train);
    }
    sh->epoch = -1;
    *w = sh;
    return 0;
}

static void worker_close(void *w)
{
    shuffler *sh = w;
    free(sh->perm);
    free(sh);
}

/* the permutation of epoch e over the n_train training items */
static void shuffle(const ddt_source_base *b, const listed *l, shuffler *sh, int64_t epoch)
{
    const int64_t n = l->n_train;
    for (int64_t i = 0; i < n; i++)
        sh->perm[i] = i;
    uint64_t rng = ddt_generate_seed(b->cfg.seed, epoch, "epoch");
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(ddk_rng_next(&rng) % (uint64_t)(i + 1)), x = sh->perm[i];
        sh->perm[i] = sh->perm[j];
        sh->perm[j] = x;
    }
    sh->epoch = epoch;
}

/* item `index` into q, padded to seq_len */
static int fill_item(const ddt_source_base *b, const listed *l, int64_t index, ddt_sequence *q, char *err,
                     size_t err_len)
{
    const item *it = &l->items[index];
    const int64_t S = b->cfg.seq_len, n = it->S, pad = S - n;
    q->S = S;
    memset(q->input_ids + n, 0, (size_t)pad * sizeof(int32_t));
    memset(q->loss_mask + n, 0, (size_t)pad);
    if (!l->from_shards) {
        memcpy(q->input_ids, l->tokens.input_ids + it->start, (size_t)n * sizeof(int32_t));
        if (l->tokens.loss_mask)
            memcpy(q->loss_mask, l->tokens.loss_mask + it->start, (size_t)n);
        else
            memset(q->loss_mask, 1, (size_t)n);
        return ddt_source_target_features(b, &l->target, q, err, err_len);
    }
    const int teacher = b->cfg.want_teacher;
    const int64_t F = b->cfg.n_taps * b->H;
    int rc = ddt_shard_rows(&l->shards[it->shard], it->start, n, q->input_ids, q->loss_mask, q->features,
                            teacher ? q->teacher_hidden : NULL, err, err_len);
    if (rc)
        return rc;
    memset(q->features + n * F, 0, (size_t)(pad * F) * sizeof(float));
    if (teacher)
        memset(q->teacher_hidden + n * b->H, 0, (size_t)(pad * b->H) * sizeof(float));
    return 0;
}

static int train(const ddt_source_base *b, void *w, int64_t cursor, ddt_sequence *q, char *err, size_t err_len)
{
    const listed *l = b->data;
    shuffler *sh = w;
    const int64_t epoch = cursor / l->n_train;
    if (sh->epoch != epoch)
        shuffle(b, l, sh, epoch);
    return fill_item(b, l, sh->perm[cursor % l->n_train], q, err, err_len);
}

static int heldout(ddt_source_base *b, void *w, int64_t i, ddt_sequence *q, char *err, size_t err_len)
{
    (void)w;
    const listed *l = b->data;
    return fill_item(b, l, l->n_train + i, q, err, err_len);
}

const ddt_source_ops ddt_source_listed = {
    .name = "listed",
    .accepts = accepts,
    .check = check,
    .shape = shape,
    .open = open_listed,
    .close = close_listed,
    .worker_open = worker_open,
    .worker_close = worker_close,
    .train = train,
    .heldout = heldout,
};
