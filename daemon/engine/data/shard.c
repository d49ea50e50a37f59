/* shard.c: token files and feature shards (shard.h). One table names the tensors and one the
 * metadata keys; one function each holds a rule (offsets, ids, loss mask, features,
 * metadata), and the readers and the writers call the same ones, so a file this writes is
 * one it reads and a file it refuses to read it would never write.
 * The feature rule works on the stored bits (BF16, F16 or F32, little-endian): an all-ones
 * exponent is NaN or Inf, a zero magnitude is zero, and "the same at every position" is a
 * byte comparison of each row with the sequence's first. A shard stays mapped while a run reads
 * it: its rows are read through base/mapped.h (EIO naming the file and the offset, not SIGBUS,
 * when it cannot be read or was cut).
 * Not here: the safetensors container (safetensors.c) and the checked copies of tensors
 * (tensor_load.c), both used as they are.
 * Tested by tests/engine/data/test_shard.c.
 *
 * Legend: Ttot tokens of a file, nseq sequences, H hidden, L_t taps, F = L_t*H, V vocabulary.
 */
#include "shard.h"
#include "ddk.h"
#include "base/errors.h"
#include "base/mapped.h"
#include "model/tensor_load.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------------------------------
 * The names
 */

#define SHARD_FORMAT "ddtree-features"
#define SHARD_VERSION "1"

const char *const ddt_shard_keys[DDT_SHARD_KEYS] = {
    [DDT_SHARD_KEY_FORMAT] = "format",
    [DDT_SHARD_KEY_VERSION] = "version",
    [DDT_SHARD_KEY_HIDDEN_SIZE] = "hidden_size",
    [DDT_SHARD_KEY_TARGET_LAYER_IDS] = "target_layer_ids",
    [DDT_SHARD_KEY_VOCAB_SIZE] = "vocab_size",
    [DDT_SHARD_KEY_TARGET] = "target",
};

/* A shard's tensors in file order; a token file holds input_ids and offsets. DDT_F32 stands
 * for any of BF16, F16, F32 (SPEC.md section 4: no F64). */
enum { T_INPUT_IDS, T_LOSS_MASK, T_OFFSETS, T_FEATURES, T_TEACHER, T_COUNT };
static const struct {
    const char *name;
    ddt_dtype dtype;
    int ndim;
} tensors[T_COUNT] = {
    [T_INPUT_IDS] = { "input_ids", DDT_I32, 1 },   [T_LOSS_MASK] = { "loss_mask", DDT_U8, 1 },
    [T_OFFSETS] = { "offsets", DDT_I64, 1 },       [T_FEATURES] = { "features", DDT_F32, 2 },
    [T_TEACHER] = { "teacher_hidden", DDT_F32, 2 },
};

static int is_feature_dtype(ddt_dtype t)
{
    return t == DDT_F32 || t == DDT_BF16 || t == DDT_F16;
}

/* "[l1, l2, ...]": the metadata's target_layer_ids and the errors'; whether it fitted in len */
static int taps_text(const int32_t *taps, int n, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < n && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%d", i ? ", " : "", taps[i]);
    if (used < len)
        used += (size_t)snprintf(out + used, len - used, "]");
    return used < len;
}

/* ------------------------------------------------------------------------------------------
 * The rules (readers and writers alike)
 */

/* the one rule for offsets (nseq + 1) over total rows */
static int check_offsets(const char *path, const int64_t *offsets, int64_t nseq, int64_t total, char *err,
                         size_t err_len)
{
    const char *name = tensors[T_OFFSETS].name;
    if (nseq < 1)
        return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' must hold nseq+1 >= 2 entries (it has %lld)",
                             name, (long long)nseq + 1);
    if (offsets[0] != 0 || offsets[nseq] != total)
        return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' must start at 0 and end at the number of "
                             "tokens %lld; it runs %lld .. %lld", name, (long long)total, (long long)offsets[0],
                             (long long)offsets[nseq]);
    for (int64_t s = 0; s < nseq; s++)
        if (offsets[s + 1] < offsets[s])
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' must not decrease: offsets[%lld] = %lld > "
                                 "offsets[%lld] = %lld", name, (long long)s, (long long)offsets[s],
                                 (long long)s + 1, (long long)offsets[s + 1]);
    return 0;
}

/* ids (total I32, maybe unaligned in a mapping) in [0, vocab) */
static int check_ids(const char *path, const void *ids, int64_t total, int64_t vocab, char *err, size_t err_len)
{
    for (int64_t i = 0; i < total; i++) {
        int32_t v;
        memcpy(&v, (const unsigned char *)ids + 4 * i, 4);
        if (v < 0 || v >= vocab)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s': element %lld is %d, outside the "
                                 "vocabulary [0, %lld)", tensors[T_INPUT_IDS].name, (long long)i, v, (long long)vocab);
    }
    return 0;
}

/* the sequences of a token file or shard: offsets, then ids */
static int check_tokens(const char *path, const void *ids, const int64_t *offsets, int64_t nseq, int64_t total,
                        int64_t vocab, char *err, size_t err_len)
{
    int rc = check_offsets(path, offsets, nseq, total, err, err_len);
    return rc ? rc : check_ids(path, ids, total, vocab, err, err_len);
}

static int check_mask(const char *path, const uint8_t *mask, int64_t total, char *err, size_t err_len)
{
    for (int64_t i = 0; i < total; i++)
        if (mask[i] > 1)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s': element %lld is %d, must be 0 or 1",
                                 tensors[T_LOSS_MASK].name, (long long)i, mask[i]);
    return 0;
}

/* element j of a row of BF16 / F16 (2 bytes) or F32 (4 bytes), as its bits */
static uint32_t element_bits(const unsigned char *row, int64_t j, size_t size)
{
    if (size == 2) {
        uint16_t b;
        memcpy(&b, row + 2 * j, 2);
        return b;
    }
    uint32_t b;
    memcpy(&b, row + 4 * j, 4);
    return b;
}

/* the feature rule: features (total, width) in dtype, each sequence of offsets */
static int check_features(const char *path, const void *features, ddt_dtype dtype, int64_t width,
                          const int64_t *offsets, int64_t nseq, char *err, size_t err_len)
{
    const size_t size = ddt_dtype_size(dtype), row_bytes = (size_t)width * size;
    const uint32_t exponent = dtype == DDT_F32 ? 0x7f800000u : dtype == DDT_BF16 ? 0x7f80u : 0x7c00u;
    const uint32_t magnitude = size == 4 ? 0x7fffffffu : 0x7fffu;
    const char *name = tensors[T_FEATURES].name;
    for (int64_t s = 0; s < nseq; s++) {
        const int64_t a = offsets[s], b = offsets[s + 1];
        const unsigned char *first = (const unsigned char *)features + (size_t)a * row_bytes;
        int nonzero = 0, varies = b - a < 2;   /* one position cannot repeat itself */
        for (int64_t r = a; r < b; r++) {
            const unsigned char *row = first + (size_t)(r - a) * row_bytes;
            for (int64_t j = 0; j < width; j++) {
                const uint32_t bits = element_bits(row, j, size);
                if ((bits & exponent) == exponent)
                    return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' of sequence %lld holds NaN or Inf "
                                         "(row %lld, column %lld)", name, (long long)s, (long long)r, (long long)j);
                nonzero |= (bits & magnitude) != 0;
            }
            varies |= r > a && memcmp(row, first, row_bytes) != 0;
        }
        if (b > a && !nonzero)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' of sequence %lld (rows [%lld, %lld)) is all "
                                 "zero: the capture produced nothing", name, (long long)s, (long long)a, (long long)b);
        if (!varies)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' of sequence %lld (rows [%lld, %lld)) is the "
                                 "same at every position", name, (long long)s, (long long)a, (long long)b);
    }
    return 0;
}

static int metadata_fail(const ddt_st_file *f, ddt_shard_key key, const char *want, const char *got, char *err,
                         size_t err_len)
{
    return ddt_fail_path(err, err_len, -EINVAL, f->path, "__metadata__ %s must be %s (got %s%s%s)", ddt_shard_keys[key],
                         want, got ? "\"" : "", got ? got : "none", got ? "\"" : "");
}

/* a decimal count equal to want */
static int is_count(const char *text, int64_t want)
{
    char *end;
    return text && *text && strtoll(text, &end, 10) == want && !*end;
}

/* a JSON list equal to taps (n) */
static int is_taps(const char *text, const int32_t *taps, int n)
{
    cJSON *list = text ? cJSON_Parse(text) : NULL;
    int same = cJSON_IsArray(list) && cJSON_GetArraySize(list) == n;
    for (int i = 0; same && i < n; i++) {
        const cJSON *v = cJSON_GetArrayItem(list, i);
        same = cJSON_IsNumber(v) && v->valuedouble == (double)taps[i];
    }
    cJSON_Delete(list);
    return same;
}

static int check_metadata(const ddt_st_file *f, const ddt_shard_shape *want, char *err, size_t err_len)
{
    const char *got[DDT_SHARD_KEYS];
    for (int k = 0; k < DDT_SHARD_KEYS; k++)
        got[k] = ddt_st_metadata(f, ddt_shard_keys[k]);
    char text[640];
    if (!got[DDT_SHARD_KEY_FORMAT] || strcmp(got[DDT_SHARD_KEY_FORMAT], SHARD_FORMAT))
        return metadata_fail(f, DDT_SHARD_KEY_FORMAT, "\"" SHARD_FORMAT "\"", got[DDT_SHARD_KEY_FORMAT], err, err_len);
    if (!got[DDT_SHARD_KEY_VERSION] || strcmp(got[DDT_SHARD_KEY_VERSION], SHARD_VERSION))
        return metadata_fail(f, DDT_SHARD_KEY_VERSION, "\"" SHARD_VERSION "\"", got[DDT_SHARD_KEY_VERSION], err,
                             err_len);
    if (!is_count(got[DDT_SHARD_KEY_HIDDEN_SIZE], want->hidden)) {
        snprintf(text, sizeof text, "the run's hidden size %lld", (long long)want->hidden);
        return metadata_fail(f, DDT_SHARD_KEY_HIDDEN_SIZE, text, got[DDT_SHARD_KEY_HIDDEN_SIZE], err, err_len);
    }
    if (!is_count(got[DDT_SHARD_KEY_VOCAB_SIZE], want->vocab)) {
        snprintf(text, sizeof text, "the target's vocabulary %lld", (long long)want->vocab);
        return metadata_fail(f, DDT_SHARD_KEY_VOCAB_SIZE, text, got[DDT_SHARD_KEY_VOCAB_SIZE], err, err_len);
    }
    if (!is_taps(got[DDT_SHARD_KEY_TARGET_LAYER_IDS], want->taps, want->n_taps)) {
        char list[600];
        taps_text(want->taps, want->n_taps, list, sizeof list);
        snprintf(text, sizeof text, "the configured taps %s", list);
        return metadata_fail(f, DDT_SHARD_KEY_TARGET_LAYER_IDS, text, got[DDT_SHARD_KEY_TARGET_LAYER_IDS], err,
                             err_len);
    }
    return 0;
}

/* tensor i of the table in f, of shape dims (ndim of the table; -1 any, learnt): *out NULL
 * when optional and absent */
static int find_tensor(const ddt_st_file *f, int i, int optional, int64_t *dims, const ddt_st_tensor **out,
                       char *err, size_t err_len)
{
    const char *name = tensors[i].name;
    const ddt_st_tensor *t = *out = ddt_st_find(f, name);
    if (!t)
        return optional ? 0 : ddt_fail_path(err, err_len, -EINVAL, f->path, "tensor '%s' is missing%s", name,
                                            i == T_TEACHER ? " (the run's loss needs the teacher)" : "");
    if (tensors[i].dtype == DDT_F32 && !is_feature_dtype(t->dtype))
        return ddt_fail_path(err, err_len, -EINVAL, f->path, "tensor '%s' is %s, must be BF16, F16 or F32", name,
                             ddt_dtype_name(t->dtype));
    const ddt_tensor_want want = { name, tensors[i].dtype, tensors[i].ndim, dims };
    return ddt_tensor_check(t, f->path, &want, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Token files
 */

int ddt_shard_tokens_open(const char *path, int64_t vocab, ddt_shard_tokens *out, char *err, size_t err_len)
{
    memset(out, 0, sizeof *out);
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc)
        return rc;
    int64_t ids_dims[1] = { -1 }, offsets_dims[1] = { -1 };
    const ddt_tensor_want want_ids = { tensors[T_INPUT_IDS].name, DDT_I32, 1, ids_dims },
                          want_offsets = { tensors[T_OFFSETS].name, DDT_I64, 1, offsets_dims };
    out->input_ids = ddt_tensor_load(&f, &want_ids, &out->ids_bytes, err, err_len);
    if (out->input_ids)
        out->offsets = ddt_tensor_load(&f, &want_offsets, &out->offsets_bytes, err, err_len);
    rc = out->offsets ? 0 : -EINVAL;
    if (!rc && ddt_st_find(&f, tensors[T_LOSS_MASK].name)) {   /* optional: absent, every token is trained */
        int64_t mask_dims[1] = { ids_dims[0] };
        const ddt_tensor_want want_mask = { tensors[T_LOSS_MASK].name, DDT_U8, 1, mask_dims };
        out->loss_mask = ddt_tensor_load(&f, &want_mask, &out->mask_bytes, err, err_len);
        rc = out->loss_mask ? 0 : -EINVAL;
    }
    ddt_st_close(&f);
    if (!rc) {
        out->total = ids_dims[0];
        out->nseq = offsets_dims[0] - 1;
        rc = check_tokens(path, out->input_ids, out->offsets, out->nseq, out->total, vocab, err, err_len);
    }
    if (!rc && out->loss_mask)
        rc = check_mask(path, out->loss_mask, out->total, err, err_len);
    if (rc)
        ddt_shard_tokens_close(out);
    return rc;
}

void ddt_shard_tokens_close(ddt_shard_tokens *t)
{
    ddk_free(ddk_allocator_cpu(), t->input_ids, t->ids_bytes);
    ddk_free(ddk_allocator_cpu(), t->offsets, t->offsets_bytes);
    ddk_free(ddk_allocator_cpu(), t->loss_mask, t->mask_bytes);
    memset(t, 0, sizeof *t);
}

int ddt_shard_tokens_write(const char *path, const int32_t *input_ids, int64_t total, const int64_t *offsets,
                           int64_t nseq, const uint8_t *loss_mask, int64_t vocab, char *err, size_t err_len)
{
    int rc = check_tokens(path, input_ids, offsets, nseq, total, vocab, err, err_len);
    if (!rc && loss_mask)
        rc = check_mask(path, loss_mask, total, err, err_len);
    if (rc)
        return rc;
    const ddt_st_entry entries[] = {   /* the shard's order: input_ids, loss_mask, offsets */
        { tensors[T_INPUT_IDS].name, DDT_I32, 1, { total }, input_ids },
        { tensors[T_LOSS_MASK].name, DDT_U8, 1, { total }, loss_mask },
        { tensors[T_OFFSETS].name, DDT_I64, 1, { nseq + 1 }, offsets },
    };
    if (loss_mask)
        return ddt_st_write(path, entries, 3, NULL, NULL, 0, err, err_len);
    const ddt_st_entry plain[] = { entries[0], entries[2] };
    return ddt_st_write(path, plain, 2, NULL, NULL, 0, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Feature shards
 */

static int check_shard(ddt_shard *sh, const ddt_shard_shape *want, int need_teacher, char *err, size_t err_len)
{
    const ddt_st_file *f = &sh->file;
    const ddt_st_tensor *offsets;
    int64_t ids_dims[1] = { -1 }, offsets_dims[1] = { -1 };
    int rc = check_metadata(f, want, err, err_len);
    if (!rc)
        rc = find_tensor(f, T_INPUT_IDS, 0, ids_dims, &sh->input_ids, err, err_len);
    if (rc)
        return rc;
    const int64_t T = ids_dims[0];
    int64_t mask_dims[1] = { T }, feature_dims[2] = { T, want->n_taps * want->hidden },
            teacher_dims[2] = { T, want->hidden };
    if ((rc = find_tensor(f, T_LOSS_MASK, 0, mask_dims, &sh->loss_mask, err, err_len)) ||
        (rc = find_tensor(f, T_OFFSETS, 0, offsets_dims, &offsets, err, err_len)) ||
        (rc = find_tensor(f, T_FEATURES, 0, feature_dims, &sh->features, err, err_len)) ||
        (rc = find_tensor(f, T_TEACHER, !need_teacher, teacher_dims, &sh->teacher, err, err_len)))
        return rc;
    sh->total = T;
    sh->nseq = offsets_dims[0] - 1;
    const ddt_tensor_want want_offsets = { tensors[T_OFFSETS].name, DDT_I64, 1, offsets_dims };
    sh->offsets = ddt_tensor_copy(offsets, f->path, &want_offsets, &sh->offsets_bytes, err, err_len);
    if (!sh->offsets)
        return -ENOMEM;
    if ((rc = check_tokens(f->path, sh->input_ids->data, sh->offsets, sh->nseq, T, want->vocab, err, err_len)) ||
        (rc = check_mask(f->path, sh->loss_mask->data, T, err, err_len)))
        return rc;
    return check_features(f->path, sh->features->data, sh->features->dtype, feature_dims[1], sh->offsets, sh->nseq,
                          err, err_len);
}

int ddt_shard_open(const char *path, const ddt_shard_shape *want, int need_teacher, ddt_shard *out, char *err,
                   size_t err_len)
{
    memset(out, 0, sizeof *out);
    int rc = ddt_st_open(path, &out->file, err, err_len);
    if (rc)
        return rc;
    rc = check_shard(out, want, need_teacher, err, err_len);
    if (rc)
        ddt_shard_close(out);
    return rc;
}

void ddt_shard_close(ddt_shard *sh)
{
    ddt_st_close(&sh->file);   /* a zeroed one is a no-op */
    ddk_free(ddk_allocator_cpu(), sh->offsets, sh->offsets_bytes);
    memset(sh, 0, sizeof *sh);
}

/* rows [first, first + count) of a float tensor (rows, width) as float32 (mapped data may be
 * unaligned) */
static void rows_to_f32(const ddt_st_tensor *t, int64_t first, int64_t count, float *out)
{
    const int64_t width = t->shape[1];
    const unsigned char *src = (const unsigned char *)t->data + (size_t)(first * width) * ddt_dtype_size(t->dtype);
    if (t->dtype == DDT_F32) {
        memcpy(out, src, (size_t)(count * width) * sizeof(float));
        return;
    }
    for (int64_t i = 0; i < count * width; i++) {
        const uint16_t b = (uint16_t)element_bits(src, i, 2);
        out[i] = t->dtype == DDT_BF16 ? ddt_bf16_to_f32(b) : ddt_f16_to_f32(b);
    }
}

/* what ddt_shard_rows asks of the guarded read */
typedef struct rows_request {
    const ddt_shard *sh;
    int64_t first, count;
    int32_t *input_ids;
    uint8_t *loss_mask;
    float *features, *teacher_hidden;
} rows_request;

static void read_rows(void *arg)
{
    const rows_request *r = arg;
    const ddt_shard *sh = r->sh;
    memcpy(r->input_ids, (const unsigned char *)sh->input_ids->data + 4 * r->first, (size_t)r->count * sizeof(int32_t));
    memcpy(r->loss_mask, (const uint8_t *)sh->loss_mask->data + r->first, (size_t)r->count);
    rows_to_f32(sh->features, r->first, r->count, r->features);
    if (r->teacher_hidden)
        rows_to_f32(sh->teacher, r->first, r->count, r->teacher_hidden);
}

int ddt_shard_rows(const ddt_shard *sh, int64_t first, int64_t count, int32_t *input_ids, uint8_t *loss_mask,
                   float *features, float *teacher_hidden, char *err, size_t err_len)
{
    const ddt_st_file *f = &sh->file;
    const ddt_mapped_file m = { f->path, f->fd, f->map, f->map_bytes };
    rows_request r = { sh, first, count, input_ids, loss_mask, features, teacher_hidden };
    const size_t offset = (size_t)((const unsigned char *)sh->input_ids->data - (const unsigned char *)f->map) +
                          4 * (size_t)first;
    return ddt_mapped_read(&m, offset, read_rows, &r, err, err_len);
}

int ddt_shard_write(const char *path, const ddt_shard_data *d, char *err, size_t err_len)
{
    const ddt_shard_shape *shape = &d->shape;
    if (shape->hidden < 1 || shape->vocab < 1 || shape->n_taps < 1 || !shape->taps || !is_feature_dtype(d->dtype) ||
        d->total < 0)
        return ddt_fail_path(err, err_len, -EINVAL, path, "a shard needs hidden_size >= 1, vocab_size >= 1, one or "
                             "more target layer ids and BF16, F16 or F32 features");
    const int64_t T = d->total, H = shape->hidden, width = shape->n_taps * H;
    int rc;
    if ((rc = check_tokens(path, d->input_ids, d->offsets, d->nseq, T, shape->vocab, err, err_len)) ||
        (rc = check_mask(path, d->loss_mask, T, err, err_len)) ||
        (rc = check_features(path, d->features, d->dtype, width, d->offsets, d->nseq, err, err_len)))
        return rc;
    const ddt_st_entry entries[T_COUNT] = {
        [T_INPUT_IDS] = { tensors[T_INPUT_IDS].name, DDT_I32, 1, { T }, d->input_ids },
        [T_LOSS_MASK] = { tensors[T_LOSS_MASK].name, DDT_U8, 1, { T }, d->loss_mask },
        [T_OFFSETS] = { tensors[T_OFFSETS].name, DDT_I64, 1, { d->nseq + 1 }, d->offsets },
        [T_FEATURES] = { tensors[T_FEATURES].name, d->dtype, 2, { T, width }, d->features },
        [T_TEACHER] = { tensors[T_TEACHER].name, d->dtype, 2, { T, H }, d->teacher_hidden },
    };
    char hidden[32], vocab[32], layers[4096];
    snprintf(hidden, sizeof hidden, "%lld", (long long)H);
    snprintf(vocab, sizeof vocab, "%lld", (long long)shape->vocab);
    if (!taps_text(shape->taps, shape->n_taps, layers, sizeof layers))
        return ddt_fail_path(err, err_len, -EINVAL, path, "__metadata__ %s: %d target layer ids do not fit in %zu "
                             "characters", ddt_shard_keys[DDT_SHARD_KEY_TARGET_LAYER_IDS], shape->n_taps,
                             sizeof layers);
    const char *const values[DDT_SHARD_KEYS] = {
        [DDT_SHARD_KEY_FORMAT] = SHARD_FORMAT, [DDT_SHARD_KEY_VERSION] = SHARD_VERSION,
        [DDT_SHARD_KEY_HIDDEN_SIZE] = hidden,  [DDT_SHARD_KEY_TARGET_LAYER_IDS] = layers,
        [DDT_SHARD_KEY_VOCAB_SIZE] = vocab,    [DDT_SHARD_KEY_TARGET] = d->target ? d->target : "",
    };
    return ddt_st_write(path, entries, d->teacher_hidden ? T_COUNT : T_COUNT - 1, ddt_shard_keys, values,
                        DDT_SHARD_KEYS, err, err_len);
}
