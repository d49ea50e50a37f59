/* source_impl.c: what the implementations of source_impl.h share (the target's shape checked
 * against the drafter's hidden size and taps, a sequence's features from the target's forward).
 * Tested through source.h by tests/engine/data/test_source.c.
 */
#include "source_impl.h"
#include "base/errors.h"

#include <errno.h>
#include <string.h>

int ddt_source_check_taps(const ddt_source_config *c, int64_t layers, char *err, size_t err_len)
{
    for (int i = 0; i < c->n_taps; i++)
        if (c->taps[i] < 0 || c->taps[i] >= layers)
            return ddt_fail(err, err_len, -EINVAL, "source: target layer id %d is not a layer of the target "
                            "(0 .. %lld)", c->taps[i], (long long)layers - 1);
    return 0;
}

int ddt_source_use_shape(ddt_source_base *b, int64_t hidden, int64_t vocab, int64_t layers, const char *what,
                         char *err, size_t err_len)
{
    b->V = vocab;
    b->target_layers = layers;
    if (hidden != b->H)
        return ddt_fail(err, err_len, -EINVAL, "%s: the target's hidden_size %lld differs from the drafter's %lld",
                        what, (long long)hidden, (long long)b->H);
    return ddt_source_check_taps(&b->cfg, layers, err, err_len);
}

int ddt_source_use_target(ddt_source_base *b, const ddt_target_model *t, const char *what, char *err,
                          size_t err_len)
{
    b->embed = t->embed_tokens;
    b->lm_head = t->lm_head;
    b->target = t;
    return ddt_source_use_shape(b, t->hidden, t->vocab, t->layers, what, err, err_len);
}

int ddt_source_target_features(const ddt_source_base *b, const ddt_target_model *t, ddt_sequence *q, char *err,
                               size_t err_len)
{
    if (b->cfg.tokens_only)
        return 0;
    int rc = ddt_target_prefill(b->be, t, q->input_ids, q->S, b->cfg.taps, b->cfg.n_taps, q->features,
                                b->cfg.want_teacher ? q->teacher_hidden : NULL, NULL);
    return rc ? ddt_fail(err, err_len, rc, "the target's forward failed: %s", strerror(-rc)) : 0;
}

int ddt_source_config_shape(const char *dir, int64_t *hidden, int64_t *vocab, int64_t *layers, int *tied,
                            char *err, size_t err_len)
{
    return ddt_target_config_shape(dir, hidden, vocab, layers, tied, err, err_len);
}
