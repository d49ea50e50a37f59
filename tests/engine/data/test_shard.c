/* test_shard.c: token files and feature shards (shard.h), in both directions.
 * Readers: files made here by hand (ddt_st_write with the names of SPEC.md section 4 spelled
 * out, not shard.h's) are read back exactly, a good one with an empty and a one-token sequence
 * included (the offsets rule: never decreasing); one table of faults, each breaking a single
 * rule, is refused by every reader and writer it applies to, the error naming the file and
 * the tensor or key (and the sequence, for the feature rule). Writers: what they write holds
 * exactly the names, dtypes, shapes and metadata of the format, and reads back.
 * ctest: one line per case, a final "N passed, M failed".
 *
 * Legend: T tokens of the fixture, NSEQ sequences, H hidden, F = L_t*H feature width,
 * V vocabulary.
 */
#include "check.h"
#include "ddk_rng.h"
#include "model/safetensors.h"
#include "data/shard.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

enum { T = 10, NSEQ = 4, H = 4, N_TAPS = 2, F = N_TAPS * H, V = 20 };
/* sequence 1 is empty (equal offsets), sequence 2 has one token */
static const int64_t fixture_offsets[NSEQ + 1] = { 0, 4, 4, 5, 10 };
static const int32_t taps[N_TAPS] = { 3, 7 };
static const ddt_shard_shape shape = { H, V, N_TAPS, taps };
/* SPEC.md section 4's metadata for the fixture, spelled out here (not shard.h's table) */
static const char *const spec_keys[DDT_SHARD_KEYS] = { "format", "version", "hidden_size", "target_layer_ids",
                                                       "vocab_size", "target" };
static const char *const spec_values[DDT_SHARD_KEYS] = { "ddtree-features", "1", "4", "[3, 7]", "20", "test_shard.c" };

static char tmpdir[] = "/tmp/ddtree_test_shard.XXXXXX";
static int32_t fixture_ids[T];
static uint8_t fixture_mask[T];
static float fixture_features[T * F], fixture_teacher[T * H];   /* (T, F), (T, H) */

static void make_fixture(void)
{
    uint64_t rng = 41;
    for (int i = 0; i < T; i++) {
        fixture_ids[i] = (int32_t)(ddk_rng_next(&rng) % V);
        fixture_mask[i] = (uint8_t)(i % 3 != 1);
    }
    for (int i = 0; i < T * F; i++)
        fixture_features[i] = (float)ddk_rng_normal(&rng);
    for (int i = 0; i < T * H; i++)
        fixture_teacher[i] = (float)ddk_rng_normal(&rng);
}

static const char *tmp_path(const char *name)
{
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    return path;
}

/* ------------------------------------------------------------------------------------------
 * A file as parts: the fixture's arrays, the tensors and metadata that will be written.
 * A fault changes the parts; the same parts then feed the hand-made file and the writers.
 */

enum { E_IDS, E_MASK, E_OFFSETS, E_FEATURES, E_TEACHER, E_COUNT };

typedef struct parts {
    int32_t ids[T];
    uint8_t mask[T];
    int64_t offsets[NSEQ + 1];
    float features[T * F], teacher[T * H];
    uint16_t half[T * F], teacher_half[T * H];   /* the floats as BF16 / F16, when stored so */
    double wide[T * F];       /* features as F64 */
    ddt_st_entry e[E_COUNT];
    int dropped[E_COUNT];
    const char *keys[DDT_SHARD_KEYS], *values[DDT_SHARD_KEYS];
} parts;

static void parts_init(parts *p)
{
    memset(p, 0, sizeof *p);
    memcpy(p->ids, fixture_ids, sizeof p->ids);
    memcpy(p->mask, fixture_mask, sizeof p->mask);
    memcpy(p->offsets, fixture_offsets, sizeof p->offsets);
    memcpy(p->features, fixture_features, sizeof p->features);
    memcpy(p->teacher, fixture_teacher, sizeof p->teacher);
    p->e[E_IDS] = (ddt_st_entry){ "input_ids", DDT_I32, 1, { T }, p->ids };
    p->e[E_MASK] = (ddt_st_entry){ "loss_mask", DDT_U8, 1, { T }, p->mask };
    p->e[E_OFFSETS] = (ddt_st_entry){ "offsets", DDT_I64, 1, { NSEQ + 1 }, p->offsets };
    p->e[E_FEATURES] = (ddt_st_entry){ "features", DDT_F32, 2, { T, F }, p->features };
    p->e[E_TEACHER] = (ddt_st_entry){ "teacher_hidden", DDT_F32, 2, { T, H }, p->teacher };
    for (int k = 0; k < DDT_SHARD_KEYS; k++) {
        p->keys[k] = spec_keys[k];
        p->values[k] = spec_values[k];
    }
}

/* path written by hand: a shard, or the token file (input_ids and offsets only) */
static void write_by_hand(const parts *p, const char *path, int token_file)
{
    ddt_st_entry e[E_COUNT];
    const char *keys[DDT_SHARD_KEYS], *values[DDT_SHARD_KEYS];
    int n = 0, m = 0;
    for (int i = 0; i < E_COUNT; i++)
        if (!p->dropped[i] && (!token_file || i == E_IDS || i == E_OFFSETS))
            e[n++] = p->e[i];
    for (int k = 0; k < DDT_SHARD_KEYS && !token_file; k++)
        if (p->values[k]) {
            keys[m] = p->keys[k];
            values[m++] = p->values[k];
        }
    char err[512] = "";
    unlink(path);
    check(ddt_st_write(path, e, n, keys, values, m, err, sizeof err) == 0, "writing %s by hand: %s", path, err);
}

static int write_tokens(const parts *p, const char *path, char *err, size_t err_len)
{
    unlink(path);
    return ddt_shard_tokens_write(path, p->e[E_IDS].data, p->e[E_IDS].shape[0], p->e[E_OFFSETS].data,
                                  p->e[E_OFFSETS].shape[0] - 1, NULL, V, err, err_len);
}

static int write_shard(const parts *p, const char *path, char *err, size_t err_len)
{
    const ddt_shard_data d = { shape, p->e[E_IDS].shape[0], p->e[E_OFFSETS].shape[0] - 1, p->e[E_IDS].data,
                               p->e[E_MASK].data, p->e[E_OFFSETS].data, p->e[E_FEATURES].dtype,
                               p->e[E_FEATURES].data, p->dropped[E_TEACHER] ? NULL : p->e[E_TEACHER].data,
                               "test_shard.c" };
    unlink(path);
    return ddt_shard_write(path, &d, err, err_len);
}

/* ------------------------------------------------------------------------------------------
 * Faults: each breaks one rule
 */

static void f_format(parts *p)
{
    p->values[DDT_SHARD_KEY_FORMAT] = "pt";
}
static void f_no_version(parts *p)
{
    p->values[DDT_SHARD_KEY_VERSION] = NULL;
}
static void f_version(parts *p)
{
    p->values[DDT_SHARD_KEY_VERSION] = "2";
}
static void f_hidden(parts *p)
{
    p->values[DDT_SHARD_KEY_HIDDEN_SIZE] = "8";
}
static void f_hidden_text(parts *p)
{
    p->values[DDT_SHARD_KEY_HIDDEN_SIZE] = "4 heads";
}
static void f_vocab(parts *p)
{
    p->values[DDT_SHARD_KEY_VOCAB_SIZE] = "21";
}
static void f_taps_order(parts *p)
{
    p->values[DDT_SHARD_KEY_TARGET_LAYER_IDS] = "[7, 3]";
}
static void f_taps_text(parts *p)
{
    p->values[DDT_SHARD_KEY_TARGET_LAYER_IDS] = "3,7";
}
static void f_no_ids(parts *p)
{
    p->dropped[E_IDS] = 1;
}
static void f_no_mask(parts *p)
{
    p->dropped[E_MASK] = 1;
}
static void f_no_offsets(parts *p)
{
    p->dropped[E_OFFSETS] = 1;
}
static void f_no_features(parts *p)
{
    p->dropped[E_FEATURES] = 1;
}
static void f_no_teacher(parts *p)
{
    p->dropped[E_TEACHER] = 1;
}
static void f_ids_f32(parts *p)
{
    p->e[E_IDS].dtype = DDT_F32;
}
static void f_offsets_i32(parts *p)
{
    p->e[E_OFFSETS].dtype = DDT_I32;   /* (NSEQ + 1) int32 of the ids' bytes: any will do */
    p->e[E_OFFSETS].data = p->ids;
}
static void f_features_f64(parts *p)
{
    for (int i = 0; i < T * F; i++)
        p->wide[i] = p->features[i];
    p->e[E_FEATURES].dtype = DDT_F64;
    p->e[E_FEATURES].data = p->wide;
}
static void f_features_wide(parts *p)
{
    p->e[E_FEATURES].shape[1] = F + H;   /* (T, F + H) floats: wide's bytes hold them */
    p->e[E_FEATURES].data = p->wide;
}
static void f_teacher_wide(parts *p)
{
    p->e[E_TEACHER].shape[1] = H + 1;    /* (T, H + 1) floats: the features' bytes */
    p->e[E_TEACHER].data = p->features;
}
static void f_mask_short(parts *p)
{
    p->e[E_MASK].shape[0] = T - 1;
}
static void f_mask_two(parts *p)
{
    p->mask[6] = 2;
}
static void f_id_vocab(parts *p)
{
    p->ids[7] = V;
}
static void f_id_negative(parts *p)
{
    p->ids[0] = -1;
}
static void f_offsets_start(parts *p)
{
    p->offsets[0] = 1;
}
static void f_offsets_end(parts *p)
{
    p->offsets[NSEQ] = T - 1;
}
static void f_offsets_past(parts *p)
{
    p->offsets[NSEQ] = T + 1;
}
static void f_offsets_decrease(parts *p)
{
    p->offsets[2] = 6;   /* 4, 6, 5: sequence 2 would run backwards */
}
static void f_offsets_one(parts *p)
{
    p->e[E_OFFSETS].shape[0] = 1;   /* [0]: no sequence at all */
}
static void f_nan(parts *p)
{
    p->features[7 * F + 3] = NAN;   /* sequence 3 */
}
static void f_inf(parts *p)
{
    p->features[1 * F + 5] = -INFINITY;   /* sequence 0 */
}
static void f_zero(parts *p)
{
    memset(p->features + 5 * F, 0, 5 * F * sizeof(float));   /* sequence 3, rows 5 .. 10 */
}
static void f_zero_single(parts *p)
{
    memset(p->features + 4 * F, 0, F * sizeof(float));   /* sequence 2: its one row */
}
static void f_same_rows(parts *p)
{
    for (int r = 1; r < 4; r++)   /* sequence 0: every row its first */
        memcpy(p->features + r * F, p->features, F * sizeof(float));
}
static uint16_t to_half(float x, ddt_dtype kind)
{
    return kind == DDT_BF16 ? ddt_f32_to_bf16(x) : ddt_f32_to_f16(x);
}

/* x as stored in kind (F32, BF16 or F16), back in float32 */
static float stored(float x, ddt_dtype kind)
{
    return kind == DDT_BF16 ? ddt_bf16_to_f32(ddt_f32_to_bf16(x))
           : kind == DDT_F16 ? ddt_f16_to_f32(ddt_f32_to_f16(x))
                             : x;
}

/* features and teacher_hidden stored as 2-byte floats (kind BF16 or F16) */
static void store_half(parts *p, ddt_dtype kind)
{
    for (int i = 0; i < T * F; i++)
        p->half[i] = to_half(p->features[i], kind);
    for (int i = 0; i < T * H; i++)
        p->teacher_half[i] = to_half(p->teacher[i], kind);
    p->e[E_FEATURES].dtype = p->e[E_TEACHER].dtype = kind;
    p->e[E_FEATURES].data = p->half;
    p->e[E_TEACHER].data = p->teacher_half;
}
static void f_bf16_nan(parts *p)
{
    p->features[2 * F] = NAN;   /* sequence 0 */
    store_half(p, DDT_BF16);
}
static void f_f16_overflow(parts *p)
{
    p->features[9 * F + 1] = 1e5f;   /* sequence 3: above F16's largest, stored as Inf */
    store_half(p, DDT_F16);
}
static void f_bf16_same_rows(parts *p)
{
    for (int j = 0; j < F; j++)   /* sequence 3's rows differ in float32 only below BF16's precision */
        for (int r = 5; r < 10; r++)
            p->features[r * F + j] = stored(p->features[5 * F + j], DDT_BF16) * (1.0f + 1e-4f * (r - 5));
    store_half(p, DDT_BF16);
}

enum { TOKENS_READ = 1, TOKENS_WRITE = 2, SHARD_READ = 4, SHARD_WRITE = 8, TOKENS = 3, SHARD = 12, ALL = 15 };

static const struct {
    const char *what;
    void (*fault)(parts *);
    int applies;                  /* which readers and writers must refuse it */
    const char *named, *also;     /* what the error names, besides the file (also: or NULL) */
} faults[] = {
    { "metadata format", f_format, SHARD_READ, "format", NULL },
    { "metadata version", f_version, SHARD_READ, "version", NULL },
    { "metadata version absent", f_no_version, SHARD_READ, "version", "none" },
    { "metadata hidden_size", f_hidden, SHARD_READ, "hidden_size", NULL },
    { "metadata hidden_size not a number", f_hidden_text, SHARD_READ, "hidden_size", NULL },
    { "metadata vocab_size", f_vocab, SHARD_READ, "vocab_size", NULL },
    { "metadata target_layer_ids in another order", f_taps_order, SHARD_READ, "target_layer_ids", NULL },
    { "metadata target_layer_ids not a JSON list", f_taps_text, SHARD_READ, "target_layer_ids", NULL },
    { "input_ids absent", f_no_ids, TOKENS_READ | SHARD_READ, "input_ids", NULL },
    { "loss_mask absent", f_no_mask, SHARD_READ, "loss_mask", NULL },
    { "offsets absent", f_no_offsets, TOKENS_READ | SHARD_READ, "offsets", NULL },
    { "features absent", f_no_features, SHARD_READ, "features", NULL },
    { "teacher_hidden absent (needed)", f_no_teacher, SHARD_READ, "teacher_hidden", NULL },
    { "input_ids F32", f_ids_f32, TOKENS_READ | SHARD_READ, "input_ids", "F32" },
    { "offsets I32", f_offsets_i32, TOKENS_READ | SHARD_READ, "offsets", "I32" },
    { "features F64", f_features_f64, SHARD_READ, "features", "F64" },
    { "features not L_t*H wide", f_features_wide, SHARD_READ, "features", NULL },
    { "teacher_hidden not H wide", f_teacher_wide, SHARD_READ, "teacher_hidden", NULL },
    { "loss_mask shorter than input_ids", f_mask_short, SHARD_READ, "loss_mask", NULL },
    { "loss_mask 2", f_mask_two, SHARD, "loss_mask", NULL },
    { "id = V", f_id_vocab, ALL, "input_ids", NULL },
    { "id < 0", f_id_negative, ALL, "input_ids", NULL },
    { "offsets start at 1", f_offsets_start, ALL, "offsets", NULL },
    { "offsets end before Ttot", f_offsets_end, ALL, "offsets", NULL },
    { "offsets end past Ttot", f_offsets_past, ALL, "offsets", NULL },
    { "offsets decrease", f_offsets_decrease, ALL, "offsets", "decrease" },
    { "offsets [0]: no sequence", f_offsets_one, ALL, "offsets", NULL },
    { "features NaN", f_nan, SHARD, "features", "sequence 3" },
    { "features -Inf", f_inf, SHARD, "features", "sequence 0" },
    { "features all zero", f_zero, SHARD, "sequence 3", "zero" },
    { "features of a one-token sequence zero", f_zero_single, SHARD, "sequence 2", "zero" },
    { "features the same at every position", f_same_rows, SHARD, "sequence 0", "same" },
    { "BF16 features NaN", f_bf16_nan, SHARD, "features", "sequence 0" },
    { "F16 features Inf (overflow)", f_f16_overflow, SHARD, "features", "sequence 3" },
    { "BF16 features the same at every position", f_bf16_same_rows, SHARD, "sequence 3", "same" },
};

/* the error of rc / err for file path and fault i: refused, naming what it should */
static void expect_refusal(int rc, const char *err, const char *path, size_t i, const char *by)
{
    check(rc < 0 && strstr(err, path) && strstr(err, faults[i].named) &&
              (!faults[i].also || strstr(err, faults[i].also)),
          "%s by %s: rc %d, error \"%s\" should name the file, %s%s%s", faults[i].what, by, rc, err, faults[i].named,
          faults[i].also ? " and " : "", faults[i].also ? faults[i].also : "");
}

static void test_faults(void)
{
    const char *tokens = "tokens.safetensors", *shard = "shard.safetensors";
    char tokens_path[512], shard_path[512], err[512];
    snprintf(tokens_path, sizeof tokens_path, "%s", tmp_path(tokens));
    snprintf(shard_path, sizeof shard_path, "%s", tmp_path(shard));
    static parts p;
    for (size_t i = 0; i < sizeof faults / sizeof faults[0]; i++) {
        parts_init(&p);
        faults[i].fault(&p);
        const int applies = faults[i].applies;
        if (applies & TOKENS_READ) {
            write_by_hand(&p, tokens_path, 1);
            ddt_shard_tokens tf;
            err[0] = 0;
            int rc = ddt_shard_tokens_open(tokens_path, V, &tf, err, sizeof err);
            expect_refusal(rc, err, tokens_path, i, "the token file reader");
            if (rc == 0)
                ddt_shard_tokens_close(&tf);
        }
        if (applies & SHARD_READ) {
            write_by_hand(&p, shard_path, 0);
            ddt_shard sh;
            err[0] = 0;
            int rc = ddt_shard_open(shard_path, &shape, 1, &sh, err, sizeof err);
            expect_refusal(rc, err, shard_path, i, "the shard reader");
            if (rc == 0)
                ddt_shard_close(&sh);
        }
        if (applies & TOKENS_WRITE) {
            err[0] = 0;
            int rc = write_tokens(&p, tokens_path, err, sizeof err);
            expect_refusal(rc, err, tokens_path, i, "the token file writer");
            check(access(tokens_path, F_OK) != 0, "%s: the token file writer wrote a file it refused", faults[i].what);
        }
        if (applies & SHARD_WRITE) {
            err[0] = 0;
            int rc = write_shard(&p, shard_path, err, sizeof err);
            expect_refusal(rc, err, shard_path, i, "the shard writer");
            check(access(shard_path, F_OK) != 0, "%s: the shard writer wrote a file it refused", faults[i].what);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * Good files, by hand and by the writers
 */

static void check_tokens_read(const char *path, const char *made_by)
{
    ddt_shard_tokens tf;
    char err[512] = "";
    check(ddt_shard_tokens_open(path, V, &tf, err, sizeof err) == 0, "%s token file refused: %s", made_by, err);
    if (case_failed)
        return;
    check(tf.total == T && tf.nseq == NSEQ && !memcmp(tf.input_ids, fixture_ids, sizeof fixture_ids) &&
          !memcmp(tf.offsets, fixture_offsets, sizeof fixture_offsets),
          "%s token file not read back exactly (Ttot %lld, nseq %lld)", made_by, (long long)tf.total,
          (long long)tf.nseq);
    ddt_shard_tokens_close(&tf);
    check(tf.input_ids == NULL && tf.offsets == NULL, "close left pointers behind");
    ddt_shard_tokens_close(&tf);   /* twice: a no-op */
}

/* the shard at path holds the fixture, its floats stored as kind */
static void check_shard_read(const char *path, ddt_dtype kind, int teacher, const char *made_by)
{
    ddt_shard sh;
    char err[512] = "";
    check(ddt_shard_open(path, &shape, teacher, &sh, err, sizeof err) == 0, "%s shard refused: %s", made_by, err);
    if (case_failed)
        return;
    check(sh.total == T && sh.nseq == NSEQ && !memcmp(sh.offsets, fixture_offsets, sizeof fixture_offsets) &&
          (sh.teacher != NULL) == teacher, "%s shard: Ttot %lld, nseq %lld, offsets or teacher presence wrong", made_by,
          (long long)sh.total, (long long)sh.nseq);
    int32_t ids[T];
    uint8_t mask[T];
    float features[T * F], teacher_hidden[T * H];
    check(ddt_shard_rows(&sh, 5, 5, ids, mask, features, teacher ? teacher_hidden : NULL, err, sizeof err) == 0,
          "%s shard: rows 5 .. 10 not read: %s", made_by, err);   /* sequence 3 */
    int same = !memcmp(ids, fixture_ids + 5, 5 * sizeof *ids) && !memcmp(mask, fixture_mask + 5, 5);
    for (int i = 0; i < 5 * F; i++)
        same &= features[i] == stored(fixture_features[5 * F + i], kind);
    for (int i = 0; teacher && i < 5 * H; i++)
        same &= teacher_hidden[i] == stored(fixture_teacher[5 * H + i], kind);
    check(same, "%s shard (%s): rows 5 .. 10 not read back", made_by, ddt_dtype_name(kind));
    ddt_shard_close(&sh);
    ddt_shard_close(&sh);   /* twice: a no-op */
}

static void test_hand_made_read(void)
{
    static parts p;
    parts_init(&p);
    write_by_hand(&p, tmp_path("tokens.safetensors"), 1);
    check_tokens_read(tmp_path("tokens.safetensors"), "a hand-made");
    write_by_hand(&p, tmp_path("shard.safetensors"), 0);
    check_shard_read(tmp_path("shard.safetensors"), DDT_F32, 1, "a hand-made");
    for (int k = 0; k < 2; k++) {   /* features stored as BF16, then F16 */
        const ddt_dtype kind = k ? DDT_F16 : DDT_BF16;
        parts_init(&p);
        store_half(&p, kind);
        write_by_hand(&p, tmp_path("half.safetensors"), 0);
        check_shard_read(tmp_path("half.safetensors"), kind, 1, "a hand-made");
    }
    /* teacher_hidden is optional when the run does not need it */
    parts_init(&p);
    f_no_teacher(&p);
    write_by_hand(&p, tmp_path("no_teacher.safetensors"), 0);
    check_shard_read(tmp_path("no_teacher.safetensors"), DDT_F32, 0, "a hand-made teacherless");
    /* metadata target is free text, and may be absent */
    parts_init(&p);
    p.values[DDT_SHARD_KEY_TARGET] = NULL;
    write_by_hand(&p, tmp_path("no_target.safetensors"), 0);
    check_shard_read(tmp_path("no_target.safetensors"), DDT_F32, 1, "a hand-made untargeted");
}

/* tensor name of f is dtype with shape dims (ndim) */
static int tensor_is(const ddt_st_file *f, const char *name, ddt_dtype dtype, int ndim, int64_t d0, int64_t d1)
{
    const ddt_st_tensor *t = ddt_st_find(f, name);
    return t && t->dtype == dtype && t->ndim == ndim && t->shape[0] == d0 && (ndim < 2 || t->shape[1] == d1);
}

static void test_writers(void)
{
    static parts p;
    char err[512] = "";
    const char *tokens = tmp_path("written_tokens.safetensors");
    char tokens_path[512];
    snprintf(tokens_path, sizeof tokens_path, "%s", tokens);
    parts_init(&p);
    check(write_tokens(&p, tokens_path, err, sizeof err) == 0, "token file writer: %s", err);
    ddt_st_file f;
    check(ddt_st_open(tokens_path, &f, err, sizeof err) == 0, "written token file: %s", err);
    if (case_failed)
        return;
    check(f.count == 2 && tensor_is(&f, "input_ids", DDT_I32, 1, T, 0) &&
          tensor_is(&f, "offsets", DDT_I64, 1, NSEQ + 1, 0) &&
          !memcmp(ddt_st_find(&f, "input_ids")->data, fixture_ids, sizeof fixture_ids) &&
          !memcmp(ddt_st_find(&f, "offsets")->data, fixture_offsets, sizeof fixture_offsets),
          "the token file writer did not write input_ids I32 [Ttot] and offsets I64 [nseq+1] as given");
    ddt_st_close(&f);
    check_tokens_read(tokens_path, "the writer's");

    for (int k = 0; k < 3; k++) {   /* F32 with teacher, BF16 with teacher, F32 without */
        char path[512];
        snprintf(path, sizeof path, "%s", tmp_path("written_shard.safetensors"));
        parts_init(&p);
        const ddt_dtype kind = k == 1 ? DDT_BF16 : DDT_F32;
        if (k == 1)
            store_half(&p, DDT_BF16);
        if (k == 2)
            f_no_teacher(&p);
        check(write_shard(&p, path, err, sizeof err) == 0, "shard writer (%s): %s", ddt_dtype_name(kind), err);
        check(ddt_st_open(path, &f, err, sizeof err) == 0, "written shard: %s", err);
        if (case_failed)
            return;
        check(f.count == (k == 2 ? 4 : 5) && tensor_is(&f, "input_ids", DDT_I32, 1, T, 0) &&
              tensor_is(&f, "loss_mask", DDT_U8, 1, T, 0) && tensor_is(&f, "offsets", DDT_I64, 1, NSEQ + 1, 0) &&
              tensor_is(&f, "features", kind, 2, T, F) &&
              (k == 2 ? !ddt_st_find(&f, "teacher_hidden") : tensor_is(&f, "teacher_hidden", kind, 2, T, H)),
              "shard writer (%s): tensors, dtypes or shapes are not SPEC.md section 4's", ddt_dtype_name(kind));
        for (int m = 0; m < DDT_SHARD_KEYS; m++) {
            const char *v = ddt_st_metadata(&f, spec_keys[m]);
            check(v && !strcmp(v, spec_values[m]), "shard writer: __metadata__ %s is \"%s\", want \"%s\"", spec_keys[m],
                  v ? v : "(absent)", spec_values[m]);
        }
        check(f.meta_count == 6, "shard writer: %d metadata keys, want 6", f.meta_count);
        ddt_st_close(&f);
        check_shard_read(path, kind, k != 2, "the writer's");
    }
}

/* a token file's optional loss_mask: written, read back, absent as NULL, refused when broken */
static void test_token_mask(void)
{
    static parts p;
    char err[512] = "", path[512];
    snprintf(path, sizeof path, "%s", tmp_path("masked_tokens.safetensors"));
    parts_init(&p);
    unlink(path);
    check(ddt_shard_tokens_write(path, p.ids, T, p.offsets, NSEQ, p.mask, V, err, sizeof err) == 0,
          "token file writer with a mask: %s", err);
    ddt_shard_tokens tf;
    check(ddt_shard_tokens_open(path, V, &tf, err, sizeof err) == 0 && tf.loss_mask &&
          !memcmp(tf.loss_mask, fixture_mask, sizeof fixture_mask), "the mask was not read back (%s)", err);
    ddt_shard_tokens_close(&tf);
    check(tf.loss_mask == NULL, "close left the mask behind");
    check(write_tokens(&p, path, err, sizeof err) == 0 && ddt_shard_tokens_open(path, V, &tf, err, sizeof err) == 0 &&
          !tf.loss_mask, "a token file without a mask did not read as NULL (%s)", err);
    ddt_shard_tokens_close(&tf);

    p.mask[3] = 2;
    unlink(path);
    err[0] = 0;
    check(ddt_shard_tokens_write(path, p.ids, T, p.offsets, NSEQ, p.mask, V, err, sizeof err) == -EINVAL &&
          strstr(err, "loss_mask") && access(path, F_OK) != 0, "a mask of 2 written (%s)", err);
    ddt_st_entry e[3] = { p.e[E_IDS], p.e[E_MASK], p.e[E_OFFSETS] };
    check(ddt_st_write(path, e, 3, NULL, NULL, 0, err, sizeof err) == 0, "by hand: %s", err);
    err[0] = 0;
    check(ddt_shard_tokens_open(path, V, &tf, err, sizeof err) == -EINVAL && strstr(err, "loss_mask") &&
          strstr(err, path), "a hand-made mask of 2 read (%s)", err);
    p.mask[3] = 1;
    e[1].shape[0] = T - 1;
    unlink(path);
    check(ddt_st_write(path, e, 3, NULL, NULL, 0, err, sizeof err) == 0, "by hand: %s", err);
    err[0] = 0;
    check(ddt_shard_tokens_open(path, V, &tf, err, sizeof err) == -EINVAL && strstr(err, "loss_mask"),
          "a mask shorter than input_ids read (%s)", err);
}

int main(void)
{
    scratch_dir(tmpdir);
    make_fixture();
    static const test_case cases[] = {
        { "hand-made token file and shards (empty, one-token sequences; BF16, F16) read back", test_hand_made_read },
        { "each broken rule refused by every reader and writer, naming file and tensor / key", test_faults },
        { "writers: SPEC.md section 4's names, dtypes, shapes, metadata; read back", test_writers },
        { "token files: the optional loss_mask written, read, absent, refused when broken", test_token_mask },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    remove_tree(tmpdir);
    return cases_summary();
}
