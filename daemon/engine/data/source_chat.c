/* source_chat.c: the chat implementation of source_impl.h (hf with chat files, SPEC.md section
 * 8): JSON Lines conversations, each rendered by the template and encoded with the target's
 * tokenizer.json (chat_tokens.h) on the loader thread when its turn comes, then the features
 * from the target's forward (tokens_only: none, and no target opened unless it regenerates).
 * One conversation is one sequence: cut to seq_len (the drop rule after the cut), a shorter one
 * padded with id 0 at loss mask 0, as token files are (source_listed.c); conversations are not
 * packed together, so no token's features see another conversation.
 * Regeneration: the prompt through the last user message with the generation prompt, then the
 * target samples the assistant turn in token space (generate.h: target.temperature / top_p,
 * seed ddt_generate_seed(seed, line, "regenerate"), stopped at `<|im_end|>` or at the cap
 * min(seq_len, prompt + max_new_tokens)); the mask is 1 on the sampled tokens, the stop included.
 * Lines are numbered g over the files in order. The last `heldout` usable lines are held out
 * (found at open by encoding from the end); the lines before the first of them train: cursor c
 * is line perm_e[c mod n] of epoch e = c / n (n those lines, usable or not; perm_e a
 * Fisher-Yates shuffle seeded by ddt_generate_seed(seed, e, "chat epoch")), or, when that line
 * is refused, the next usable one along perm_e: a pure function of (config, cursor). A refused
 * line is remembered (never encoded twice) and noted once, with its file, line number and
 * reason, for ddt_source_next_note; at open, a training set without a usable line is refused.
 * Tested through ddtreed train by tests/daemon/chat_train_test.sh (the real Qwen3 tokenizer).
 *
 * Legend: S tokens of a sequence, P prompt tokens, N lines of all files.
 */
#include "source_impl.h"
#include "chat_tokens.h"
#include "ddk_rng.h"
#include "base/errors.h"
#include "model/generate.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { LINE_UNKNOWN, LINE_GOOD, LINE_BAD };

typedef struct chat_source {
    ddt_target_model target;      /* features and regeneration; unopened tokens only without it */
    ddt_tokenizer *tok;
    ddt_chat_encoder enc;
    int n_files;
    ddt_chat_file files[DDT_MAX_CHAT_FILES];
    int64_t first_line[DDT_MAX_CHAT_FILES + 1];   /* g of each file's first line; [n_files] = N */
    int64_t n_train;              /* lines [0, n_train) train */
    int64_t *heldout_lines;       /* (n_heldout) ascending */

    pthread_mutex_t lock;         /* state and the notes */
    uint8_t *state;               /* (N) LINE_* */
    char **notes;                 /* notes [note_head, note_count) not taken yet */
    int64_t note_head, note_count, note_cap;
} chat_source;

typedef struct chat_worker {      /* one thread's */
    ddt_chat_tokens tokens;
    ddt_token_ids prompt;
    ddt_generator gen;            /* regeneration */
    int has_gen;
    int64_t epoch;                /* the loader's permutation: for epoch, -1 none */
    int64_t *perm;                /* (n_train) */
    char *line;                   /* (line_cap) the line read, copied out of its file's mapping */
    size_t line_cap;
} chat_worker;

static int accepts(const ddt_source_config *c)
{
    return c->kind == DDT_SOURCE_HF && c->chat_file_count > 0;
}

static int check(const ddt_source_config *c, int64_t hidden, char *err, size_t err_len)
{
    (void)hidden;
    ddt_chat_template ignored;
    if (c->chat_file_count > DDT_MAX_CHAT_FILES)
        return ddt_fail(err, err_len, -EINVAL, "source: at most %d chat files (got %d)", DDT_MAX_CHAT_FILES,
                        c->chat_file_count);
    if (c->tokens_file[0])
        return ddt_fail(err, err_len, -EINVAL, "source: chat files and a token file are two kinds of data: give one");
    if (ddt_chat_template_from_name(ddt_chat_template_name((ddt_chat_template)c->chat_template), &ignored))
        return ddt_fail(err, err_len, -EINVAL, "source: chat template %d is not one of qwen3, qwen3.5, qwen3.6",
                        c->chat_template);
    if (c->max_new_tokens < 0)
        return ddt_fail(err, err_len, -EINVAL, "source: max_new_tokens %lld must be >= 0", (long long)c->max_new_tokens);
    if (c->regenerate && !(c->top_p > 0.0f && c->top_p <= 1.0f && c->temperature >= 0.0f))
        return ddt_fail(err, err_len, -EINVAL, "source: regeneration needs temperature >= 0 and top_p in (0, 1]");
    return 0;
}

static int shape(const ddt_source_config *c, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                 char *err, size_t err_len)
{
    return ddt_source_config_shape(c->model_dir, hidden, vocab, layers, tied, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Lines, their state and notes
 */

static int file_of(const chat_source *d, int64_t g)
{
    int k = 0;
    while (k + 1 < d->n_files && g >= d->first_line[k + 1])
        k++;
    return k;
}

/* why cut to at most n bytes at a character boundary */
static void cut_utf8(char *why, size_t n)
{
    if (strlen(why) <= n)
        return;
    while (n > 0 && ((unsigned char)why[n] & 0xC0) == 0x80)
        n--;
    why[n] = '\0';
}

/* line g refused: remembered, and noted the first time */
static void refuse_line(const ddt_source_base *b, chat_source *d, int64_t g, ddt_chat_refusal reason, char *why)
{
    const int k = file_of(d, g);
    cut_utf8(why, 300);
    cJSON *note = cJSON_CreateObject();
    cJSON_AddStringToObject(note, "file", b->cfg.chat_files[k]);
    cJSON_AddNumberToObject(note, "line", (double)(g - d->first_line[k] + 1));
    cJSON_AddStringToObject(note, "reason", ddt_chat_refusal_name(reason));
    cJSON_AddStringToObject(note, "message", why);
    char *text = cJSON_PrintUnformatted(note);
    cJSON_Delete(note);
    if (!text)
        ddk_fatal(__FILE__, __LINE__, "out of memory for a note");
    pthread_mutex_lock(&d->lock);
    if (d->state[g] == LINE_BAD) {   /* another thread noted it first */
        free(text);
    } else {
        d->state[g] = LINE_BAD;
        if (d->note_count == d->note_cap) {
            d->note_cap = d->note_cap ? 2 * d->note_cap : 64;
            d->notes = realloc(d->notes, (size_t)d->note_cap * sizeof *d->notes);
            if (!d->notes)
                ddk_fatal(__FILE__, __LINE__, "out of memory for %lld notes", (long long)d->note_cap);
        }
        d->notes[d->note_count++] = text;
    }
    pthread_mutex_unlock(&d->lock);
}

static int next_note(ddt_source_base *b, char *out, size_t len)
{
    chat_source *d = b->data;
    pthread_mutex_lock(&d->lock);
    char *text = d->note_head < d->note_count ? d->notes[d->note_head++] : NULL;
    if (d->note_head == d->note_count)
        d->note_head = d->note_count = 0;   /* all taken: the array starts again */
    pthread_mutex_unlock(&d->lock);
    if (!text)
        return 0;
    snprintf(out, len, "%s", text);
    cut_utf8(out, len ? len - 1 : 0);
    free(text);
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * One conversation into a sequence
 */

/* line g's tokens and mask into q (seq_len, padded) and, with features, its features: 0, a
 * refusal (> 0, why says it) or an error (< 0, err says it) */
static int produce(const ddt_source_base *b, chat_worker *w, int64_t g, int features, ddt_sequence *q, char *why,
                   size_t why_len, char *err, size_t err_len)
{
    const chat_source *d = b->data;
    const ddt_source_config *c = &b->cfg;
    const int64_t S = c->seq_len;
    const int k = file_of(d, g);
    size_t len;
    int rc = ddt_chat_file_copy_line(&d->files[k], g - d->first_line[k], &w->line, &w->line_cap, &len, err, err_len);
    if (rc)
        return rc;
    ddt_chat chat;
    ddt_chat_refusal r = ddt_chat_parse_line(w->line, len, &chat, why, why_len);
    if (r)
        return (int)r;
    int64_t n = 0;
    if (!c->regenerate) {
        r = ddt_chat_tokens_encode(&d->enc, &chat, S, &w->tokens, why, why_len);
        n = r ? 0 : (int64_t)w->tokens.ids.count;
        if (!r) {
            memcpy(q->input_ids, w->tokens.ids.ids, (size_t)n * sizeof(int32_t));
            memcpy(q->loss_mask, w->tokens.mask, (size_t)n);
        }
    } else {
        r = ddt_chat_tokens_prompt(&d->enc, &chat, &w->prompt, why, why_len);
        const int64_t P = (int64_t)w->prompt.count;
        if (!r && P + 2 > S) {
            snprintf(why, why_len, "the prompt is %lld tokens, leaving no room in seq_len %lld for an answer of two",
                     (long long)P, (long long)S);
            r = DDT_CHAT_PROMPT_TOO_LONG;
        }
        if (!r) {
            const int64_t cap = c->max_new_tokens > 0 && P + c->max_new_tokens < S ? P + c->max_new_tokens : S;
            const ddt_generate_params p = { c->temperature, c->top_p };
            rc = ddt_generate_until(&w->gen, &p, ddt_generate_seed(c->seed, g, "regenerate"), w->prompt.ids, P,
                                    cap, d->enc.im_end, q->input_ids, NULL, &n);
            if (rc) {
                ddt_chat_free(&chat);
                return ddt_fail(err, err_len, rc, "line %lld: the target's regeneration failed: %s", (long long)g + 1,
                                strerror(-rc));
            }
            memset(q->loss_mask, 0, (size_t)P);
            memset(q->loss_mask + P, 1, (size_t)(n - P));
            if (n - P < 2) {
                snprintf(why, why_len, "the target's answer is %lld token(s); two are needed", (long long)(n - P));
                r = DDT_CHAT_NOT_TRAINED;
            }
        }
    }
    ddt_chat_free(&chat);
    if (r)
        return (int)r;
    memset(q->input_ids + n, 0, (size_t)(S - n) * sizeof(int32_t));
    memset(q->loss_mask + n, 0, (size_t)(S - n));
    q->S = S;
    return features ? ddt_source_target_features(b, &d->target, q, err, err_len) : 0;
}

/* line g into q when it is usable: 1; 0 when it is refused (remembered and noted); < 0 an error */
static int serve(const ddt_source_base *b, chat_worker *w, int64_t g, int features, ddt_sequence *q, char *err,
                 size_t err_len)
{
    chat_source *d = b->data;
    pthread_mutex_lock(&d->lock);
    const int known_bad = d->state[g] == LINE_BAD;
    pthread_mutex_unlock(&d->lock);
    if (known_bad)
        return 0;
    char why[1024] = "";
    int rc = produce(b, w, g, features, q, why, sizeof why, err, err_len);
    if (rc < 0)
        return rc;
    if (rc > 0) {
        refuse_line(b, d, g, (ddt_chat_refusal)rc, why);
        return 0;
    }
    pthread_mutex_lock(&d->lock);
    d->state[g] = LINE_GOOD;
    pthread_mutex_unlock(&d->lock);
    return 1;
}

/* ------------------------------------------------------------------------------------------
 * Workers
 */

static void worker_free(chat_worker *w)
{
    if (!w)
        return;
    ddt_chat_tokens_free(&w->tokens);
    ddt_token_ids_free(&w->prompt);
    if (w->has_gen)
        ddt_generator_free(&w->gen);
    free(w->perm);
    free(w->line);
    free(w);
}

static void worker_close(void *w)
{
    worker_free(w);
}

static int worker_open(const ddt_source_base *b, int trains, void **out, char *err, size_t err_len)
{
    const chat_source *d = b->data;
    *out = NULL;
    chat_worker *w = calloc(1, sizeof *w);
    if (!w)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    w->epoch = -1;
    if (trains && !(w->perm = malloc((size_t)d->n_train * sizeof *w->perm))) {
        worker_free(w);
        return ddt_fail(err, err_len, -ENOMEM, "source: no memory for a shuffle of %lld lines", (long long)d->n_train);
    }
    if (b->cfg.regenerate) {
        int rc = ddt_generator_open(&w->gen, b->be, &d->target, b->cfg.seq_len, err, err_len);
        if (rc) {
            worker_free(w);
            return rc;
        }
        w->has_gen = 1;
    }
    *out = w;
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Opening
 */

static void close_chat(ddt_source_base *b)
{
    chat_source *d = b->data;
    if (!d)
        return;
    for (int k = 0; k < d->n_files; k++)
        ddt_chat_file_close(&d->files[k]);
    ddt_chat_encoder_free(&d->enc);
    ddt_tokenizer_close(d->tok);
    ddt_target_close(&d->target);
    for (int64_t i = d->note_head; i < d->note_count; i++)
        free(d->notes[i]);
    free(d->notes);
    free(d->state);
    free(d->heldout_lines);
    pthread_mutex_destroy(&d->lock);
    free(d);
    b->data = NULL;
}

/* the tokenizer and the template bound to it, the target (or its shape) */
static int open_tokenizer_and_target(ddt_source_base *b, chat_source *d, const ddt_source_config *c, char *err,
                                     size_t err_len)
{
    char path[1100], why[1024];
    snprintf(path, sizeof path, "%s/tokenizer.json", c->model_dir);
    if (!(d->tok = ddt_tokenizer_open(path, why, sizeof why)))
        return ddt_fail(err, err_len, -EINVAL, "chat data: %s", why);
    ddt_chat_template_options opt = ddt_chat_template_defaults((ddt_chat_template)c->chat_template);
    opt.system_prompt = c->system_prompt[0] ? c->system_prompt : NULL;
    opt.train_only_last_turn = c->train_only_last_turn;
    opt.drop_reasoning = c->drop_reasoning;
    int rc = ddt_chat_encoder_init(&d->enc, d->tok, &opt, why, sizeof why);
    if (rc)
        return ddt_fail(err, err_len, rc, "chat data: %s: %s", path, why);
    if (c->tokens_only && !c->regenerate) {   /* the trainer's ranks hold the target: its shape is enough */
        int64_t hidden, vocab, layers;
        int tied;
        if ((rc = ddt_source_config_shape(c->model_dir, &hidden, &vocab, &layers, &tied, err, err_len)) ||
            (rc = ddt_source_use_shape(b, hidden, vocab, layers, c->model_dir, err, err_len)))
            return rc;
    } else if ((rc = ddt_target_open(c->model_dir, &d->target, err, err_len)) ||
               (rc = ddt_source_use_target(b, &d->target, c->model_dir, err, err_len))) {
        return rc;
    }
    if (ddt_tokenizer_vocab_size(d->tok) > b->V)
        return ddt_fail(err, err_len, -EINVAL, "chat data: %s: the tokenizer's ids run to %d, past the target's "
                        "vocab_size %lld: it is not this target's tokenizer", path, ddt_tokenizer_vocab_size(d->tok) - 1,
                        (long long)b->V);
    return 0;
}

/* the held-out lines (the last `heldout` usable ones) and a usable training line, found with a
 * scratch worker */
static int find_heldout(ddt_source_base *b, chat_source *d, char *err, size_t err_len)
{
    const int64_t N = d->first_line[d->n_files], want = b->cfg.heldout;
    chat_worker *w;
    int rc = worker_open(b, 0, (void **)&w, err, err_len);
    if (rc)
        return rc;
    ddt_sequence q = { 0 };
    q.input_ids = malloc((size_t)b->cfg.seq_len * sizeof(int32_t));
    q.loss_mask = malloc((size_t)b->cfg.seq_len);
    d->heldout_lines = malloc((size_t)(want + 1) * sizeof *d->heldout_lines);
    if (!q.input_ids || !q.loss_mask || !d->heldout_lines)
        rc = ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    int64_t found = 0, g = N - 1;
    for (; !rc && found < want && g >= 0; g--) {
        rc = serve(b, w, g, 0, &q, err, err_len);
        if (rc == 1) {
            d->heldout_lines[want - 1 - found++] = g;
            rc = 0;
        }
    }
    d->n_train = found ? d->heldout_lines[0] : N;
    int trainable = 0;
    for (int64_t t = 0; !rc && !trainable && t < d->n_train; t++) {
        const int served = serve(b, w, t, 0, &q, err, err_len);
        rc = served < 0 ? served : 0;
        trainable = served == 1;
    }
    free(q.input_ids);
    free(q.loss_mask);
    worker_free(w);
    if (!rc && (found < want || !trainable))
        rc = ddt_fail(err, err_len, -EINVAL, "chat data: %lld lines hold %s usable conversations for %lld held-out "
                      "and at least one training one (the reasons are the run's data_skipped events)", (long long)N,
                      found < want ? "too few" : "no training", (long long)want);
    b->n_heldout = want;
    return rc;
}

static int open_chat(ddt_source_base *b, const ddt_source_config *c, char *err, size_t err_len)
{
    chat_source *d = calloc(1, sizeof *d);
    if (!d)
        return ddt_fail(err, err_len, -ENOMEM, "source: out of memory");
    pthread_mutex_init(&d->lock, NULL);
    b->data = d;
    int rc = open_tokenizer_and_target(b, d, c, err, err_len);
    for (int k = 0; !rc && k < c->chat_file_count; k++) {
        rc = ddt_chat_file_open(c->chat_files[k], &d->files[k], err, err_len);
        d->n_files += !rc;
        d->first_line[k + 1] = d->first_line[k] + (rc ? 0 : d->files[k].n_lines);
    }
    if (rc)
        return rc;
    const int64_t N = d->first_line[d->n_files];
    if (!(d->state = calloc((size_t)N + 1, 1)))
        return ddt_fail(err, err_len, -ENOMEM, "source: no memory for the state of %lld lines", (long long)N);
    return find_heldout(b, d, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Sequences
 */

static void shuffle(const ddt_source_base *b, const chat_source *d, chat_worker *w, int64_t epoch)
{
    const int64_t n = d->n_train;
    for (int64_t i = 0; i < n; i++)
        w->perm[i] = i;
    uint64_t rng = ddt_generate_seed(b->cfg.seed, epoch, "chat epoch");
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)(ddk_rng_next(&rng) % (uint64_t)(i + 1)), x = w->perm[i];
        w->perm[i] = w->perm[j];
        w->perm[j] = x;
    }
    w->epoch = epoch;
}

static int train(const ddt_source_base *b, void *wv, int64_t cursor, ddt_sequence *q, char *err, size_t err_len)
{
    const chat_source *d = b->data;
    chat_worker *w = wv;
    const int64_t n = d->n_train, epoch = cursor / n;
    if (w->epoch != epoch)
        shuffle(b, d, w, epoch);
    for (int64_t j = 0; j < n; j++) {
        int rc = serve(b, w, w->perm[(cursor + j) % n], 1, q, err, err_len);
        if (rc)
            return rc < 0 ? rc : 0;
    }
    return ddt_fail(err, err_len, -EIO, "chat data: no training line is usable any more");
}

static int heldout(ddt_source_base *b, void *w, int64_t i, ddt_sequence *q, char *err, size_t err_len)
{
    const chat_source *d = b->data;
    int rc = serve(b, w, d->heldout_lines[i], 1, q, err, err_len);
    return rc == 1 ? 0 : rc < 0 ? rc : ddt_fail(err, err_len, -EIO, "chat data: held-out line %lld was usable at "
                                                "open and is not now", (long long)d->heldout_lines[i] + 1);
}

static int heldout_prompt(ddt_source_base *b, void *w, int64_t i, const int32_t **ids, int64_t *n, int32_t *stop,
                          char *err, size_t err_len)
{
    const chat_source *d = b->data;
    chat_worker *cw = w;
    const int64_t g = d->heldout_lines[i];
    const int k = file_of(d, g);
    size_t len;
    int rc = ddt_chat_file_copy_line(&d->files[k], g - d->first_line[k], &cw->line, &cw->line_cap, &len, err,
                                     err_len);
    if (rc)
        return rc;
    char why[512];
    ddt_chat chat;
    ddt_chat_refusal r = ddt_chat_parse_line(cw->line, len, &chat, why, sizeof why);
    if (r == DDT_CHAT_OK) {
        r = ddt_chat_tokens_prompt(&d->enc, &chat, &cw->prompt, why, sizeof why);
        ddt_chat_free(&chat);
    }
    if (r != DDT_CHAT_OK)   /* it was usable when the held-out lines were chosen */
        return ddt_fail(err, err_len, -EIO, "chat data: held-out line %lld gives no prompt: %s", (long long)g + 1,
                        why);
    *ids = cw->prompt.ids;
    *n = (int64_t)cw->prompt.count;
    *stop = d->enc.im_end;
    return 0;
}

const ddt_source_ops ddt_source_chat = {
    .name = "chat",
    .accepts = accepts,
    .check = check,
    .shape = shape,
    .open = open_chat,
    .close = close_chat,
    .worker_open = worker_open,
    .worker_close = worker_close,
    .train = train,
    .heldout = heldout,
    .heldout_prompt = heldout_prompt,
    .next_note = next_note,
};
