/* cmd_features.c: `ddtreed features`: token sequences in, a feature shard out (SPEC.md
 * section 4): the tapped layer outputs and the final-normed hidden state of a llama / qwen3
 * target, computed once so that many drafters can train on them.
 *
 *   ddtreed features --model DIR --tokens FILE --layers L1,L2,... [--dtype f32|bf16] --out FILE
 *
 * FILE (tokens): safetensors with input_ids I32 [Ttot] and offsets I64 [nseq+1].
 * Tested by tests/features_torch_check.py (PyTorch float64 reference; stories260K).
 */
#include "commands.h"
#include "safetensors.h"
#include "target.h"
#include "tensor_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FEATURES_USAGE                                                                          \
    "usage: ddtreed features --model DIR --tokens FILE --layers L1,L2,... [--dtype f32|bf16]\n" \
    "                        --out FILE\n"

static int parse_layers(const char *text, int32_t *ids, int max)
{
    int n = 0;
    const char *p = text;
    while (*p) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 100000 || n == max || (*end && *end != ','))
            return -1;
        ids[n++] = (int32_t)v;
        p = *end ? end + 1 : end;
    }
    return n;
}

typedef struct token_file {
    int32_t *input_ids;   /* (Ttot) */
    int64_t *offsets;     /* (nseq + 1) */
    size_t ids_bytes, offsets_bytes;
    int64_t total, nseq;
} token_file;

static int load_tokens(const char *path, int64_t vocab, token_file *tf, char *err, size_t err_len)
{
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc)
        return rc;
    int64_t ids_dims[1] = { -1 }, off_dims[1] = { -1 };
    ddt_tensor_want want_ids = { "input_ids", DDT_I32, 1, ids_dims };
    ddt_tensor_want want_off = { "offsets", DDT_I64, 1, off_dims };
    tf->input_ids = ddt_tensor_load(&f, &want_ids, &tf->ids_bytes, err, err_len);
    if (tf->input_ids)
        tf->offsets = ddt_tensor_load(&f, &want_off, &tf->offsets_bytes, err, err_len);
    ddt_st_close(&f);
    if (!tf->input_ids || !tf->offsets)
        return -EINVAL;
    tf->total = ids_dims[0];
    tf->nseq = off_dims[0] - 1;
    if (tf->nseq < 1 || tf->offsets[0] != 0 || tf->offsets[tf->nseq] != tf->total) {
        snprintf(err, err_len, "%s: offsets must start at 0 and end at the number of tokens (%lld), "
                 "with at least one sequence", path, (long long)tf->total);
        return -EINVAL;
    }
    for (int64_t s = 0; s < tf->nseq; s++)
        if (tf->offsets[s + 1] <= tf->offsets[s]) {
            snprintf(err, err_len, "%s: offsets[%lld..%lld] = %lld, %lld: every sequence needs >= 1 token "
                     "and offsets must increase", path, (long long)s, (long long)s + 1,
                     (long long)tf->offsets[s], (long long)tf->offsets[s + 1]);
            return -EINVAL;
        }
    for (int64_t i = 0; i < tf->total; i++)
        if (tf->input_ids[i] < 0 || tf->input_ids[i] >= vocab) {
            snprintf(err, err_len, "%s: input_ids[%lld] = %d is outside the target's vocabulary [0, %lld)",
                     path, (long long)i, tf->input_ids[i], (long long)vocab);
            return -EINVAL;
        }
    return 0;
}

static void free_tokens(token_file *tf)
{
    ddk_free(ddk_allocator_cpu(), tf->input_ids, tf->ids_bytes);
    ddk_free(ddk_allocator_cpu(), tf->offsets, tf->offsets_bytes);
}

/* float32 in place to bf16 in the same buffer's first half */
static void to_bf16(float *x, int64_t count)
{
    uint16_t *y = (uint16_t *)x;
    for (int64_t i = 0; i < count; i++)
        y[i] = ddt_f32_to_bf16(x[i]);
}

static int write_shard(const char *out, const char *model_dir, const ddt_target *t,
                       const token_file *tf, const int32_t *ids, int n_taps, float *features,
                       float *teacher, int bf16, char *err, size_t err_len)
{
    const int64_t H = t->cfg.hidden, Ttot = tf->total;
    uint8_t *mask = malloc((size_t)Ttot);
    if (!mask) {
        snprintf(err, err_len, "no memory for the loss mask");
        return -ENOMEM;
    }
    memset(mask, 1, (size_t)Ttot);
    ddt_dtype dt = bf16 ? DDT_BF16 : DDT_F32;
    if (bf16) {
        to_bf16(features, Ttot * n_taps * H);
        to_bf16(teacher, Ttot * H);
    }
    const ddt_st_entry entries[] = {
        { "input_ids", DDT_I32, 1, { Ttot }, tf->input_ids },
        { "loss_mask", DDT_U8, 1, { Ttot }, mask },
        { "offsets", DDT_I64, 1, { tf->nseq + 1 }, tf->offsets },
        { "features", dt, 2, { Ttot, n_taps * H }, features },
        { "teacher_hidden", dt, 2, { Ttot, H }, teacher },
    };
    char hidden[32], vocab[32], layers[1024], target[600];
    snprintf(hidden, sizeof hidden, "%lld", (long long)H);
    snprintf(vocab, sizeof vocab, "%lld", (long long)t->cfg.vocab);
    size_t used = (size_t)snprintf(layers, sizeof layers, "[");
    for (int i = 0; i < n_taps && used < sizeof layers; i++)
        used += (size_t)snprintf(layers + used, sizeof layers - used, "%s%d", i ? ", " : "", ids[i]);
    if (used < sizeof layers)
        snprintf(layers + used, sizeof layers - used, "]");
    snprintf(target, sizeof target, "%s (%s)", model_dir, t->cfg.qwen3 ? "qwen3" : "llama");
    const char *const keys[] = { "format", "version", "hidden_size", "target_layer_ids", "vocab_size", "target" };
    const char *const values[] = { "ddtree-features", "1", hidden, layers, vocab, target };
    int rc = ddt_st_write(out, entries, 5, keys, values, 6, err, err_len);
    free(mask);
    return rc;
}

int ddt_cmd_features(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *layers = NULL, *dtype = "f32", *out = NULL;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(FEATURES_USAGE, stdout);
            return 0;
        }
        const char **slot = !strcmp(k, "--model") ? &model : !strcmp(k, "--tokens") ? &tokens
                          : !strcmp(k, "--layers") ? &layers : !strcmp(k, "--dtype") ? &dtype
                          : !strcmp(k, "--out") ? &out : NULL;
        if (!slot || !v) {
            fprintf(stderr, "ddtreed features: %s %s\n" FEATURES_USAGE, k, v ? "is not an option" : "needs a value");
            return 2;
        }
        *slot = v;
        i++;
    }
    int32_t ids[DDT_MAX_TARGET_LAYERS];
    int n_taps = layers ? parse_layers(layers, ids, DDT_MAX_TARGET_LAYERS) : -1;
    if (!model || !tokens || !out || n_taps < 1 || (strcmp(dtype, "f32") && strcmp(dtype, "bf16"))) {
        fprintf(stderr, "ddtreed features: --model, --tokens, --out and --layers (comma-separated layer "
                "ids) are required; --dtype is f32 or bf16\n" FEATURES_USAGE);
        return 2;
    }

    static ddt_target t;   /* large: not on the stack */
    token_file tf = { 0 };
    char err[1024] = "";
    int rc = ddt_target_load(model, &t, err, sizeof err);
    for (int i = 0; rc == 0 && i < n_taps; i++)
        if (ids[i] >= t.cfg.layers) {
            snprintf(err, sizeof err, "--layers: %d is not a layer of %s (0 .. %lld)", ids[i], model,
                     (long long)t.cfg.layers - 1);
            rc = -EINVAL;
        }
    if (rc == 0)
        rc = load_tokens(tokens, t.cfg.vocab, &tf, err, sizeof err);
    const int64_t H = t.cfg.hidden;
    size_t feat_bytes = (size_t)(tf.total * n_taps * H) * sizeof(float);
    size_t teach_bytes = (size_t)(tf.total * H) * sizeof(float);
    float *features = rc ? NULL : ddk_malloc(ddk_allocator_cpu(), feat_bytes);   /* (Ttot, L_t*H) */
    float *teacher = rc ? NULL : ddk_malloc(ddk_allocator_cpu(), teach_bytes);   /* (Ttot, H) */
    if (rc == 0 && (!features || !teacher)) {
        snprintf(err, sizeof err, "no memory for %lld tokens of features", (long long)tf.total);
        rc = -ENOMEM;
    }
    for (int64_t s = 0; rc == 0 && s < tf.nseq; s++) {
        int64_t t0 = tf.offsets[s], T = tf.offsets[s + 1] - t0;
        rc = ddt_target_forward(ddk_backend_cpu(), &t, tf.input_ids + t0, T, ids, n_taps,
                                features + t0 * n_taps * H, teacher + t0 * H);
        if (rc)
            snprintf(err, sizeof err, "the target's forward failed on sequence %lld: %s", (long long)s,
                     strerror(-rc));
    }
    if (rc == 0)
        rc = write_shard(out, model, &t, &tf, ids, n_taps, features, teacher, !strcmp(dtype, "bf16"),
                         err, sizeof err);
    ddk_free(ddk_allocator_cpu(), features, feat_bytes);
    ddk_free(ddk_allocator_cpu(), teacher, teach_bytes);
    free_tokens(&tf);
    ddt_target_free(&t);
    if (rc) {
        fprintf(stderr, "ddtreed features: %s\n", err);
        return 1;
    }
    printf("%lld sequences, %lld tokens, layers %s -> %s\n", (long long)tf.nseq, (long long)tf.total,
           layers, out);
    return 0;
}
