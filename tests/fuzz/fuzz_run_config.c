/* fuzz_run_config.c: libFuzzer target for the run-config parser (daemon/engine/run/run_config.h),
 * the body of POST /runs and /plan, so untrusted bytes from any client of the API.
 *
 * The input is the JSON text itself (the seed corpus is corpus/run_config/: the examples and
 * small variants). For every input the parser must return 0 or -EINVAL; an error must come
 * with a sentence in err and leave nothing allocated; a success must satisfy what the rest of
 * the daemon relies on (the relations check_relations promises, lists within their arrays).
 * The same text parsed again with tiny err/field buffers (heap-allocated to their exact size,
 * so ASan sees a write past them) must give the same result and the same config byte for byte.
 * A success then goes through ddt_run_config_resolve with the declared target shape (what
 * POST /plan does when the target is not at hand) and ddt_run_config_source.
 * It does not touch files: ddt_run_config_target_shape (which opens the target's files) is
 * reached through fuzz_api.c's POST /plan instead.
 * A broken expectation prints what broke and aborts, which libFuzzer reports as a crash.
 */
#include "run/run_config.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "fuzz_run_config: expectation failed: %s: ", #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            abort();                                                        \
        }                                                                   \
    } while (0)

/* The NUL within len bytes: the buffer holds a C string. */
static int terminated(const char *s, size_t len)
{
    return memchr(s, '\0', len) != NULL;
}

/* What a successful parse promises to the planner, the trainer and the run manager. */
static void check_parsed(const ddt_run_config *c)
{
    EXPECT(terminated(c->name, sizeof c->name), "name not terminated");
    EXPECT(terminated(c->target_path, sizeof c->target_path), "target.path not terminated");
    EXPECT(terminated(c->target_tokens, sizeof c->target_tokens), "target.tokens not terminated");
    EXPECT(c->target_kind == DDT_SOURCE_SYNTHETIC || c->target_kind == DDT_SOURCE_HF ||
               c->target_kind == DDT_SOURCE_SHARDS, "target.kind %d", (int)c->target_kind);
    EXPECT((c->shard_count == 0) == (c->shards == NULL), "shard_count %d with shards %p", c->shard_count,
           (void *)c->shards);
    EXPECT(c->shard_count >= 0 && c->shard_count <= DDT_MAX_SHARDS, "shard_count %d", c->shard_count);
    for (int i = 0; i < c->shard_count; i++)
        EXPECT(c->shards[i][0] && terminated(c->shards[i], DDT_RUN_PATH), "shard %d empty or unterminated", i);
    if (c->target_kind == DDT_SOURCE_HF)
        EXPECT(c->target_path[0], "hf without target.path");
    if (c->target_kind == DDT_SOURCE_SHARDS)
        EXPECT(c->target_path[0] && c->shard_count > 0, "shards without path or shards");
    const ddt_drafter_config *d = &c->drafter;
    EXPECT(d->layers >= 1 && d->layers <= DDT_MAX_LAYERS, "drafter layers %lld", (long long)d->layers);
    EXPECT(d->heads >= 1 && d->kv_heads >= 1 && d->heads % d->kv_heads == 0, "heads %lld kv %lld",
           (long long)d->heads, (long long)d->kv_heads);
    EXPECT(d->head_dim >= 2 && d->head_dim % 2 == 0, "head_dim %lld", (long long)d->head_dim);
    EXPECT(c->layer_types_count == 0 || c->layer_types_count == d->layers, "layer_types %d for %lld layers",
           c->layer_types_count, (long long)d->layers);
    EXPECT(c->taps_auto || (d->taps >= 1 && d->taps <= DDT_MAX_TAPS), "taps %lld", (long long)d->taps);
    EXPECT(c->n_budgets >= 0 && c->n_budgets <= DDT_MAX_EVAL_BUDGETS, "n_budgets %d", c->n_budgets);
    for (int i = 0; i < c->n_budgets; i++)
        EXPECT(c->tree_budgets[i] >= 1 && c->tree_budgets[i] <= 65536, "tree_budgets[%d] %lld", i,
               (long long)c->tree_budgets[i]);
    EXPECT(c->ranks >= 1 && c->ranks <= 64, "ranks %lld", (long long)c->ranks);
    EXPECT(c->budget_bytes >= 0, "budget_bytes %lld", (long long)c->budget_bytes);
    EXPECT(c->steps >= 1 && c->seq_len >= 2 && c->max_anchors >= 1 && c->chunk >= 1 && c->vocab_tile >= 0,
           "steps %lld seq_len %lld anchors %lld chunk %lld tile %lld", (long long)c->steps,
           (long long)c->seq_len, (long long)c->max_anchors, (long long)c->chunk, (long long)c->vocab_tile);
    EXPECT(c->max_anchors * d->block_size <= (int64_t)1 << 30, "anchors x block_size");
    if (c->target_kind == DDT_SOURCE_SYNTHETIC)
        EXPECT(c->synthetic.kv_heads >= 1 && c->synthetic.heads % c->synthetic.kv_heads == 0 &&
                   c->synthetic.head_dim % 2 == 0, "synthetic heads %lld kv %lld d %lld",
               (long long)c->synthetic.heads, (long long)c->synthetic.kv_heads, (long long)c->synthetic.head_dim);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *json = (const char *)data;
    ddt_run_config c, again;
    char err[1024], field[160];
    memset(err, 0x5a, sizeof err);
    memset(field, 0x5a, sizeof field);
    int rc = ddt_run_config_parse(json, size, &c, err, sizeof err, field, sizeof field);
    EXPECT(rc == 0 || rc == -EINVAL || rc == -EBADMSG, "rc %d", rc);
    EXPECT(terminated(field, sizeof field), "field not terminated");
    if (rc) {
        EXPECT(terminated(err, sizeof err) && err[0], "an error without a message");
        EXPECT(c.shards == NULL && c.shard_count == 0, "an error left shards allocated");
    } else {
        check_parsed(&c);
    }

    /* again, with buffers too small for any message: the same answer, the same config */
    enum { TINY_ERR = 7, TINY_FIELD = 3 };
    char *tiny_err = malloc(TINY_ERR), *tiny_field = malloc(TINY_FIELD);
    EXPECT(tiny_err && tiny_field, "out of memory");
    int rc2 = ddt_run_config_parse(json, size, &again, tiny_err, TINY_ERR, tiny_field, TINY_FIELD);
    EXPECT(rc2 == rc, "rc %d then %d with small buffers", rc, rc2);
    EXPECT(terminated(tiny_field, TINY_FIELD), "small field not terminated");
    if (rc) {
        EXPECT(terminated(tiny_err, TINY_ERR), "small err not terminated");
        EXPECT(!strncmp(field, tiny_field, TINY_FIELD - 1), "field \"%s\" then \"%s\"", field, tiny_field);
    } else {
        EXPECT(again.shard_count == c.shard_count, "shard_count differs");
        for (int i = 0; i < c.shard_count; i++)
            EXPECT(!strcmp(c.shards[i], again.shards[i]), "shard %d differs", i);
        char (*shards)[DDT_RUN_PATH] = again.shards;
        again.shards = c.shards;   /* the one member that may differ */
        EXPECT(!memcmp(&c, &again, sizeof c), "two parses of one text differ");
        again.shards = shards;
        ddt_run_config_free(&again);
    }
    free(tiny_err);
    free(tiny_field);
    if (rc)
        return 0;

    /* what POST /plan does with a target not at hand: the declared shape */
    char why[1024] = "";
    int resolved = ddt_run_config_resolve(&c, c.synthetic.hidden, c.synthetic.vocab, c.synthetic.layers, why,
                                          sizeof why);
    EXPECT(resolved == 0 || (resolved == -EINVAL && why[0]), "resolve %d without a message", resolved);
    if (resolved == 0) {
        EXPECT(c.drafter.taps >= 1 && c.drafter.taps <= DDT_MAX_TAPS, "resolved taps %lld", (long long)c.drafter.taps);
        EXPECT(c.drafter.mask_token_id >= 0 && c.drafter.mask_token_id < c.drafter.vocab, "mask %d vocab %lld",
               c.drafter.mask_token_id, (long long)c.drafter.vocab);
        ddt_source_config s;
        ddt_run_config_source(&c, &s);
        EXPECT(s.n_taps == (int)c.drafter.taps && s.shard_count == c.shard_count, "source config");
    }
    ddt_run_config_free(&c);
    EXPECT(c.shards == NULL && c.shard_count == 0, "free left shards");
    return 0;
}
