/* cmd_features.c: `ddtreed features`: token sequences in, a feature shard out (SPEC.md
 * section 4): the tapped layer outputs and the final-normed hidden state of a target (llama,
 * qwen3 or qwen3_5, through target.h's interface), computed once so that many drafters can
 * train on them.
 *
 *   ddtreed features --model DIR --tokens FILE --layers L1,L2,... [--dtype f32|bf16]
 *                    [--device cpu|cuda:N] [--weights fp32|bf16] --out FILE
 *
 * --device: where the target runs (cpu, the default, or a GPU); --weights: the precision its
 * weights are held in (fp32: exact, the CPU's default; bf16: as checkpoints store them, the
 * GPU's default, products with bf16 operands). --dtype is the shard's.
 * FILE (tokens): a token file; both files are read, checked and written by engine/data/shard.h.
 * Every sequence is kept (an empty one included), so shard sequence s is token sequence s; the
 * token file's loss_mask (`ddtreed tokenize`'s) becomes the shard's, all ones without one.
 * Tested by tests/oracle/features_torch_check.py (PyTorch float64 reference; stories260K) and
 * tests/oracle/qwen35_features_check.py (the qwen35-tiny variants against tests/oracle/qwen35.py).
 */
#include "commands.h"
#include "data/shard.h"
#include "model/target.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FEATURES_USAGE                                                                          \
    "usage: ddtreed features --model DIR --tokens FILE --layers L1,L2,... [--dtype f32|bf16]\n" \
    "                        [--device cpu|cuda:N] [--weights fp32|bf16] --out FILE\n"

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

/* float32 in place to bf16 in the same buffer's first half */
static void to_bf16(float *x, int64_t count)
{
    uint16_t *y = (uint16_t *)x;
    for (int64_t i = 0; i < count; i++)
        y[i] = ddt_f32_to_bf16(x[i]);
}

static int write_shard(const char *out, const char *model_dir, const ddt_target_model *t,
                       const ddt_shard_tokens *tf, const int32_t *ids, int n_taps, float *features,
                       float *teacher, int bf16, char *err, size_t err_len)
{
    const int64_t H = t->hidden, Ttot = tf->total;
    uint8_t *mask = malloc((size_t)Ttot + 1);
    if (!mask) {
        snprintf(err, err_len, "no memory for the loss mask");
        return -ENOMEM;
    }
    if (tf->loss_mask)   /* the token file's (ddtreed tokenize's assistant spans), else every token */
        memcpy(mask, tf->loss_mask, (size_t)Ttot);
    else
        memset(mask, 1, (size_t)Ttot);
    if (bf16) {
        to_bf16(features, Ttot * n_taps * H);
        to_bf16(teacher, Ttot * H);
    }
    char target[600];
    snprintf(target, sizeof target, "%s (%s)", model_dir, t->model_type);
    const ddt_shard_data d = { { H, t->vocab, n_taps, ids }, Ttot, tf->nseq, tf->input_ids, mask, tf->offsets,
                               bf16 ? DDT_BF16 : DDT_F32, features, teacher, target };
    int rc = ddt_shard_write(out, &d, err, err_len);
    free(mask);
    return rc;
}

int ddt_cmd_features(int argc, char **argv)
{
    const char *model = NULL, *tokens = NULL, *layers = NULL, *dtype = "f32", *out = NULL, *device = "cpu",
               *weights = NULL;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "--help")) {
            fputs(FEATURES_USAGE, stdout);
            return 0;
        }
        const char **slot = !strcmp(k, "--model") ? &model : !strcmp(k, "--tokens") ? &tokens
                          : !strcmp(k, "--layers") ? &layers : !strcmp(k, "--dtype") ? &dtype
                          : !strcmp(k, "--out") ? &out : !strcmp(k, "--device") ? &device
                          : !strcmp(k, "--weights") ? &weights : NULL;
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

    char *end = NULL;
    const long gpu = !strncmp(device, "cuda:", 5) && device[5] >= '0' && device[5] <= '9'
                         ? strtol(device + 5, &end, 10) : -1;
    if ((strcmp(device, "cpu") && (gpu < 0 || *end)) || (weights && strcmp(weights, "fp32") && strcmp(weights, "bf16"))) {
        fprintf(stderr, "ddtreed features: --device is cpu or cuda:N, --weights fp32 or bf16\n" FEATURES_USAGE);
        return 2;
    }
    char why[400];
    const ddk_backend *be = gpu < 0 ? ddk_backend_cpu() : ddk_backend_cuda_or_why((int)gpu, why, sizeof why);
    if (!be) {
        fprintf(stderr, "ddtreed features: --device %s: %s\n", device, why);
        return 1;
    }
    const ddt_target_options o = { .be = be, .bf16 = weights ? !strcmp(weights, "bf16") : gpu >= 0 };
    ddt_target_model t;
    ddt_shard_tokens tf = { 0 };
    char err[1024] = "";
    int rc = ddt_target_open_with(model, &o, &t, err, sizeof err);
    for (int i = 0; rc == 0 && i < n_taps; i++)
        if (ids[i] >= t.layers) {
            snprintf(err, sizeof err, "--layers: %d is not a layer of %s (0 .. %lld)", ids[i], model,
                     (long long)t.layers - 1);
            rc = -EINVAL;
        }
    if (rc == 0)
        rc = ddt_shard_tokens_open(tokens, t.vocab, &tf, err, sizeof err);
    const int64_t H = t.hidden;
    size_t feat_bytes = (size_t)((tf.total + 1) * n_taps * H) * sizeof(float);   /* + 1: Ttot may be 0 */
    size_t teach_bytes = (size_t)((tf.total + 1) * H) * sizeof(float);
    float *features = rc ? NULL : ddk_malloc(ddk_allocator_cpu(), feat_bytes);   /* (Ttot, L_t*H) */
    float *teacher = rc ? NULL : ddk_malloc(ddk_allocator_cpu(), teach_bytes);   /* (Ttot, H) */
    if (rc == 0 && (!features || !teacher)) {
        snprintf(err, sizeof err, "no memory for %lld tokens of features", (long long)tf.total);
        rc = -ENOMEM;
    }
    /* on a GPU: one sequence's outputs in its memory, then copied into the host arrays */
    int64_t longest = 1;
    for (int64_t s = 0; rc == 0 && s < tf.nseq; s++)
        longest = tf.offsets[s + 1] - tf.offsets[s] > longest ? tf.offsets[s + 1] - tf.offsets[s] : longest;
    const size_t dev_bytes = gpu < 0 ? 0 : (size_t)(longest * (n_taps + 1) * H) * sizeof(float);
    float *dev = dev_bytes && rc == 0 ? ddk_malloc(be->alloc, dev_bytes) : NULL;   /* (T, L_t*H) then (T, H) */
    if (rc == 0 && dev_bytes && !dev) {
        snprintf(err, sizeof err, "no memory on %s for a sequence of %lld tokens' features (%.1f MB)", device,
                 (long long)longest, dev_bytes / 1e6);
        rc = -ENOMEM;
    }
    for (int64_t s = 0; rc == 0 && s < tf.nseq; s++) {
        int64_t t0 = tf.offsets[s], T = tf.offsets[s + 1] - t0;
        if (T == 0)
            continue;   /* an empty sequence: nothing to compute, kept as it is */
        float *f = dev ? dev : features + t0 * n_taps * H, *h = dev ? dev + T * n_taps * H : teacher + t0 * H;
        rc = ddt_target_prefill(be, &t, tf.input_ids + t0, T, ids, n_taps, f, h, NULL);
        if (rc == 0 && dev) {
            be->copy(be, features + t0 * n_taps * H, f, (size_t)(T * n_taps * H) * sizeof(float));
            be->copy(be, teacher + t0 * H, h, (size_t)(T * H) * sizeof(float));
            be->synchronize(be);
        }
        if (rc)
            snprintf(err, sizeof err, "the target's forward failed on sequence %lld: %s", (long long)s,
                     strerror(-rc));
    }
    if (dev)
        ddk_free(be->alloc, dev, dev_bytes);
    if (rc == 0)
        rc = write_shard(out, model, &t, &tf, ids, n_taps, features, teacher, !strcmp(dtype, "bf16"),
                         err, sizeof err);
    const int64_t nseq = tf.nseq, total = tf.total;
    ddk_free(ddk_allocator_cpu(), features, feat_bytes);
    ddk_free(ddk_allocator_cpu(), teacher, teach_bytes);
    ddt_shard_tokens_close(&tf);
    ddt_target_close(&t);
    if (rc) {
        fprintf(stderr, "ddtreed features: %s\n", err);
        return 1;
    }
    printf("%lld sequences, %lld tokens, layers %s -> %s\n", (long long)nseq, (long long)total, layers, out);
    return 0;
}
