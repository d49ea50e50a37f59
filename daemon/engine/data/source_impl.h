/* source_impl.h: the engine-internal interface between the common part of a feature source
 * (source.c: the public ddt_source_* API, the loader thread and its queue, the held-out slot)
 * and the two ways of making sequences behind it, a struct of function pointers as ggml's
 * backends are:
 *   ddt_source_generated (source_generated.c): the target samples every sequence with its KV
 *       cache (target.kind synthetic, or hf without a token file);
 *   ddt_source_listed (source_listed.c): the usable sequences of files, shuffled per epoch
 *       (hf with a token file, features from the target; or feature shards);
 *   ddt_source_chat (source_chat.c): JSON Lines conversations, tokenized (or regenerated) in
 *       the loader, shuffled per epoch (hf with chat files).
 * The common part picks the first implementation that accepts a config and never looks at
 * the kind itself. Every sequence an implementation makes is a pure function of (config,
 * cursor) or (config, held-out index): the common part relies on it to run ahead and seek.
 * Tested through source.h by tests/engine/data/test_source.c.
 *
 * Legend: S tokens of a sequence, H hidden, V vocabulary.
 */
#ifndef DDT_SOURCE_IMPL_H
#define DDT_SOURCE_IMPL_H

#include "source_config.h"

/* What every implementation sees of an open source. */
typedef struct ddt_source_base {
    ddt_source_config cfg;        /* cfg.shards: NULL (an implementation keeps what it needs) */
    int64_t H;                    /* the drafter's hidden size */
    const ddk_backend *be;        /* the target's forward and generation: the CPU */
    /* set by open */
    int64_t V, target_layers;     /* target_layers 0: unknown (shards) */
    int64_t n_heldout;
    const float *embed, *lm_head; /* (V, H), the implementation's */
    const ddt_target_model *target; /* the implementation's loaded target (ddt_source_use_target), or NULL */
    void *data;                   /* the implementation's state */
} ddt_source_base;

typedef struct ddt_source_ops {
    const char *name;
    /* 1 when this implementation serves config c */
    int (*accepts)(const ddt_source_config *c);
    /* the rules of c that are this implementation's (after the common ones): 0 or -EINVAL */
    int (*check)(const ddt_source_config *c, int64_t hidden, char *err, size_t err_len);
    /* the target's shape from its files, where they say it (ddt_source_target_shape); the
     * outputs hold the declared shape on entry and keep it where the files are silent */
    int (*shape)(const ddt_source_config *c, int64_t *hidden, int64_t *vocab, int64_t *layers,
                 int *tied, char *err, size_t err_len);
    /* the target or its head and the data: sets b->V, target_layers, n_heldout, embed,
     * lm_head and data (c is the caller's config, shards included). close undoes a failed
     * open as well. */
    int (*open)(ddt_source_base *b, const ddt_source_config *c, char *err, size_t err_len);
    void (*close)(ddt_source_base *b);
    /* one thread's scratch (*w, NULL when none is needed); trains: the loader's (training
     * sequences), else the held-out one's */
    int (*worker_open)(const ddt_source_base *b, int trains, void **w, char *err, size_t err_len);
    void (*worker_close)(void *w);
    /* training sequence `cursor` into q (room for seq_len tokens), on the loader thread */
    int (*train)(const ddt_source_base *b, void *w, int64_t cursor, ddt_sequence *q, char *err,
                 size_t err_len);
    /* held-out sequence i in [0, n_heldout) into q, on the caller's thread */
    int (*heldout)(ddt_source_base *b, void *w, int64_t i, ddt_sequence *q, char *err, size_t err_len);
    /* held-out sequence i's prompt (SPEC.md 7: the conversation through its last user message,
     * then the generation prompt) into *ids, *n (w's memory, until its next call) and the end
     * of an answer into *stop, on the caller's thread; NULL where the data has no conversations */
    int (*heldout_prompt)(ddt_source_base *b, void *w, int64_t i, const int32_t **ids, int64_t *n, int32_t *stop,
                          char *err, size_t err_len);
    /* ddt_source_next_note's, from any thread; NULL: never any */
    int (*next_note)(ddt_source_base *b, char *out, size_t len);
} ddt_source_ops;

extern const ddt_source_ops ddt_source_generated, ddt_source_listed, ddt_source_chat;

/* ------------------------------------------------------------------------------------------
 * What the implementations share (source_impl.c)
 */

/* c's tap ids against a target of `layers` layers: 0, or -EINVAL with err */
int ddt_source_check_taps(const ddt_source_config *c, int64_t layers, char *err, size_t err_len);
/* A loaded target (synthetic or hf) as the source's: V, layers and head from it, after
 * checking its hidden size against the drafter's and the taps against its layers. what names
 * it in errors (its directory, or "synthetic target"). */
int ddt_source_use_target(ddt_source_base *b, const ddt_target_model *t, const char *what, char *err,
                          size_t err_len);
/* The source's V and layers := a target's shape, checking its hidden size against the
 * drafter's and the taps against its layers (ddt_source_use_target's checks, for a token file
 * read tokens_only, whose target is never opened). */
int ddt_source_use_shape(ddt_source_base *b, int64_t hidden, int64_t vocab, int64_t layers, const char *what,
                         char *err, size_t err_len);
/* q's features and teacher from the target's forward over q's tokens (nothing: tokens_only) */
int ddt_source_target_features(const ddt_source_base *b, const ddt_target_model *t, ddt_sequence *q, char *err,
                               size_t err_len);
/* hidden size, vocabulary, layers and tie of DIR/config.json (any target ddt_target_open
 * takes); the outputs untouched on failure */
int ddt_source_config_shape(const char *dir, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                            char *err, size_t err_len);

#endif
