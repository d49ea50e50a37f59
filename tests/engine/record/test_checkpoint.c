/* test_checkpoint.c: checkpoints and the serving export (SPEC.md section 5, checkpoint.h).
 * A small drafter (2 layers, one sliding) with random parameters, moments and step: the write
 * and read round trip is bit-exact (tensors and state.json's meta); keep leaves the newest;
 * latest skips stale temporaries and incomplete or corrupt step directories; a read refuses a
 * missing, mis-shaped, mistyped or foreign tensor naming it and leaves its outputs untouched; a
 * step written twice is replaced; the export's config.json has exactly the keys of section 5
 * (use_sliding_window true with the sliding window, or false with sliding_window null when no
 * layer slides; max_position_embeddings; torch_dtype and dtype bfloat16) and reads back to an
 * equal configuration, its model.safetensors holds exactly the table's names in BF16 =
 * bf16(params) with format pt; an export without max_position_embeddings is refused; an export
 * replaces the previous one; errors for missing directories; an export read back
 * (ddt_export_read) gives the configuration and bf16(params) bit for bit, and refuses a missing
 * or foreign tensor naming the file and the tensor. state.json: a missing, mistyped or
 * unknown key (drafter keys among them) is refused naming the file and the key; the export's
 * config.json is its drafter's form; version 2 (without the serving keys) reads, its
 * max_position_embeddings from the run config's target. A tiny trainer run: its checkpoint
 * exported without a trainer equals its live export byte for byte, also from state.json
 * rewritten in its first form, from which it resumes exactly. DFlash2 (SPEC.md 2.1): its export's
 * config.json (DFlash2DraftModel, is_causal false, dflash_config's block_size and four sizes) and
 * model.safetensors (the base kernels BF16 [2, taps, H]) read back bit for bit through the bf16
 * rounding; a config.json saying DFlash2DraftModel over DFlash's tensors, one of DFlash2's tensors
 * left out, an unknown or missing architecture refused by name; its checkpoint round trip through
 * the resume's reader, other taps or DFlash refused naming the tensor, state.json's DFlash2 keys
 * checked; a DFlash2 run saved by the trainer and resumed exports the same bytes.
 * Fixtures are written by the test under a mkdtemp directory, removed at the end.
 * ctest: one line per case, a final "N passed, M failed".
 */
#include "base/checksum.h"
#include "base/read_file.h"
#include "check.h"
#include "record/checkpoint.h"
#include "ddk_rng.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "train/trainer.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[] = "/tmp/ddtree_test_checkpoint.XXXXXX";

/* ------------------------------------------------------------------------------------------
 * Fixtures
 */

/* H 16, 2 layers (sliding, full), nh 4, nkv 2, d 8, I 24, 3 taps; eps and theta chosen so that
 * their shortest decimals are not the float's exact binary value */
static void small_config(ddt_drafter_config *c)
{
    memset(c, 0, sizeof *c);
    c->hidden = 16;
    c->layers = 2;
    c->heads = 4;
    c->kv_heads = 2;
    c->head_dim = 8;
    c->intermediate = 24;
    c->vocab = 100;
    c->block_size = 4;
    c->sliding_window = 3;
    c->rms_norm_eps = 1.234567e-6f;
    c->rope_theta = 1000000.0f;
    c->sliding[0] = 1;
    c->taps = 3;
    c->target_layer_ids[0] = 1;
    c->target_layer_ids[1] = 3;
    c->target_layer_ids[2] = 5;
    c->mask_token_id = 99;
    c->num_target_layers = 7;
    c->max_positions = 40960;
}

typedef struct fixture {
    ddt_drafter_config c;
    ddt_param table[DDT_MAX_PARAMS];
    int n;
    int64_t total;             /* P */
    float *params, *m, *v;     /* (P) each */
    ddt_adamw_state adam;
} fixture;

/* random normals, with -0, a denormal, +-inf and a NaN at fixed places: bits must survive */
static void fill_random(float *x, int64_t count, uint64_t seed)
{
    uint64_t s = seed;
    for (int64_t j = 0; j < count; j++)
        x[j] = (float)ddk_rng_normal(&s);
    static const float special[] = { -0.0f, 1e-40f, INFINITY, -INFINITY, NAN };
    for (size_t j = 0; j < sizeof special / sizeof special[0] && (int64_t)j < count; j++)
        x[3 + 7 * j] = special[j];
}

/* small_config as a DFlash2 drafter (SPEC.md 2.1): 2 taps, G 4, r 8, K 4 */
static void small_dflash2(ddt_drafter_config *c)
{
    c->dflash2 = 1;
    c->conv_taps = 2;
    c->conv_group_size = 4;
    c->selector_rank = 8;
    c->selector_top_k = 4;
}

static fixture *fixture_of(uint64_t seed, int dflash2)
{
    fixture *f = xcalloc(1, sizeof *f);
    small_config(&f->c);
    if (dflash2)
        small_dflash2(&f->c);
    f->n = ddt_drafter_param_table(&f->c, f->table, &f->total);
    f->params = xcalloc((size_t)f->total, sizeof(float));
    f->m = xcalloc((size_t)f->total, sizeof(float));
    f->v = xcalloc((size_t)f->total, sizeof(float));
    fill_random(f->params, f->total, seed);
    fill_random(f->m, f->total, seed + 1);
    fill_random(f->v, f->total, seed + 2);
    f->adam = (ddt_adamw_state){ .step = (int64_t)(seed * 7919 % 100000) + 1, .m = f->m, .v = f->v };
    return f;
}

static fixture *fixture_new(uint64_t seed)
{
    return fixture_of(seed, 0);
}

static void fixture_free(fixture *f)
{
    free(f->params);
    free(f->m);
    free(f->v);
    free(f);
}

/* ROOT/name, created empty */
static void new_dir(const char *name, char *path, size_t len)
{
    snprintf(path, len, "%s/%s", root, name);
    if (mkdir(path, 0755) != 0)
        check(0, "mkdir %s: %s", path, strerror(errno));
}

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static int64_t file_size(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (int64_t)st.st_size : -1;
}

/* entries of dir whose name starts with prefix */
static int count_entries(const char *dir, const char *prefix)
{
    DIR *d = opendir(dir);
    if (!d)
        return -1;
    int count = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        count += strncmp(e->d_name, prefix, strlen(prefix)) == 0 && strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
    closedir(d);
    return count;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    check(f != NULL, "cannot create %s", path);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* f's drafter at step with config as the run config (opaque text to checkpoint.c) */
static ddt_checkpoint_meta fixture_meta(const fixture *f, int64_t step, const char *config)
{
    ddt_checkpoint_meta m = { .run_id = "r20250101-000000-abcdef", .step = step, .cursor = 3 * step + 1,
                              .chunk = 64, .vocab_tile = 32, .config_json = (char *)config, .drafter = f->c };
    return m;
}

static int metas_equal(const ddt_checkpoint_meta *a, const ddt_checkpoint_meta *b);
static void edit_state(const char *dir, const char *dotted, const char *value);

/* dir/state.json recording dir/state.safetensors as it is now: a checkpoint edited on purpose,
 * which its reader then takes as written (the checks behind the checksum are what is tested) */
static void record_tensors(const char *dir)
{
    char path[1024], err[1024] = "", hex[DDT_CHECKSUM_HEX], json[128];
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    ddt_checksum sum;
    check(ddt_checksum_file(path, &sum, err, sizeof err) == 0, "checksum of %s: %s", path, err);
    ddt_checksum_hex(sum.xxh64, hex);
    snprintf(json, sizeof json, "{\"size\": %lld, \"xxh64\": \"%s\"}", (long long)sum.size, hex);
    edit_state(dir, "files.state.safetensors", json);
}

static int write_step(const char *run, int64_t step, const fixture *f, const char *config, int keep,
                      char *path, size_t path_len, int64_t *bytes)
{
    char err[1024] = "";
    ddt_checkpoint_meta meta = fixture_meta(f, step, config);
    int rc = ddt_checkpoint_write(run, &meta, f->params, &f->adam, keep, path, path_len, bytes, err, sizeof err);
    check(rc == 0, "write of step %lld: %d %s", (long long)step, rc, err);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Checkpoints
 */

static void test_round_trip(void)
{
    char run[512], path[1024], file[1200];
    new_dir("round_trip", run, sizeof run);
    fixture *f = fixture_new(11);
    const char *state = "{\"step\": 123, \"cursor\": [4, 5], \"rng\": \"0x9e3779b97f4a7c15\"}";
    int64_t bytes = -1;
    write_step(run, 123, f, state, 3, path, sizeof path, &bytes);
    char want[600];
    snprintf(want, sizeof want, "%s/checkpoints/step-00000123", run);
    check(!strcmp(path, want), "path_out is %s, expected %s", path, want);
    snprintf(file, sizeof file, "%s/state.safetensors", want);
    int64_t st_bytes = file_size(file);
    snprintf(file, sizeof file, "%s/state.json", want);
    check(bytes == st_bytes + file_size(file) && bytes > 0, "bytes_out %lld is not the size of the two files",
          (long long)bytes);
    snprintf(file, sizeof file, "%s/checkpoints", run);
    check(count_entries(file, ".tmp-") == 0, "a temporary is left in %s", file);

    /* the file itself: the format of checkpoint.h */
    snprintf(file, sizeof file, "%s/state.safetensors", want);
    ddt_st_file st;
    char err[1024] = "";
    int rc = ddt_st_open(file, &st, err, sizeof err);
    check(rc == 0, "state.safetensors does not open: %s", err);
    if (rc == 0) {
        const char *format = ddt_st_metadata(&st, "format"), *version = ddt_st_metadata(&st, "version");
        check(format && !strcmp(format, "ddtree-checkpoint") && version && !strcmp(version, "1"),
              "metadata format/version wrong");
        check(st.count == 3 * f->n + 1, "%d tensors, expected %d", st.count, 3 * f->n + 1);
        const ddt_st_tensor *s = ddt_st_find(&st, "adam_step");
        check(s && s->dtype == DDT_I64 && s->ndim == 0, "adam_step is not an I64 scalar");
        const ddt_st_tensor *q = ddt_st_find(&st, "adam_m.layers.1.self_attn.q_proj.weight");
        check(q && q->dtype == DDT_F32 && q->ndim == 2 && q->shape[0] == 32 && q->shape[1] == 16,
              "adam_m of q_proj is not F32 [32, 16]");
        ddt_st_close(&st);
    }

    /* read back into sentinel-filled buffers: every bit, nothing past the end */
    float *params = sentinel_floats(f->total), *m = sentinel_floats(f->total), *v = sentinel_floats(f->total);
    ddt_adamw_state adam = { .step = -1, .m = m, .v = v };
    ddt_checkpoint_meta meta = { .step = -1 };
    rc = ddt_checkpoint_read(want, &f->c, params, &adam, &meta, err, sizeof err);
    check(rc == 0, "read: %d %s", rc, err);
    size_t bytes_p = (size_t)f->total * sizeof(float);
    check(!memcmp(params, f->params, bytes_p), "params differ after the round trip");
    check(!memcmp(m, f->m, bytes_p), "adam m differs after the round trip");
    check(!memcmp(v, f->v, bytes_p), "adam v differs after the round trip");
    check(adam.step == f->adam.step, "step %lld, expected %lld", (long long)adam.step, (long long)f->adam.step);
    ddt_checkpoint_meta want_meta = fixture_meta(f, 123, state);
    check(metas_equal(&meta, &want_meta), "state.json reads back to another meta (step %lld, config %s)",
          (long long)meta.step, meta.config_json ? meta.config_json : "(null)");
    check(guard_intact(params, f->total) && guard_intact(m, f->total) && guard_intact(v, f->total),
          "read wrote past the end of a buffer");
    ddt_checkpoint_meta_free(&meta);
    free(params);
    free(m);
    free(v);
    fixture_free(f);
}

static void test_keep(void)
{
    char run[512], dir[600], path[1024];
    new_dir("keep", run, sizeof run);
    fixture *f = fixture_new(21);
    for (int64_t step = 1; step <= 5; step++)
        write_step(run, step * 100, f, "{}", 2, path, sizeof path, NULL);
    snprintf(dir, sizeof dir, "%s/checkpoints", run);
    check(count_entries(dir, "step-") == 2, "%d step directories, expected 2", count_entries(dir, "step-"));
    for (int64_t step = 100; step <= 500; step += 100) {
        snprintf(path, sizeof path, "%s/step-%08lld", dir, (long long)step);
        check(is_dir(path) == (step >= 400), "step-%08lld %s", (long long)step,
              step >= 400 ? "was removed" : "is still there");
    }
    /* an older step than the newest (a resume from an earlier checkpoint) is never the one removed */
    write_step(run, 250, f, "{}", 2, path, sizeof path, NULL);
    check(is_dir(path), "the checkpoint just written (step 250) was removed");
    snprintf(path, sizeof path, "%s/step-00000500", dir);
    check(is_dir(path), "step 500 was removed, though among the newest 2");
    int64_t step = -1;
    check(ddt_checkpoint_latest(run, &step, path, sizeof path) == 0 && step == 500, "latest is %lld, expected 500",
          (long long)step);
    fixture_free(f);
}

static void test_latest(void)
{
    char run[512], dir[600], path[1024], file[800];
    new_dir("latest", run, sizeof run);
    int64_t step = -1;
    check(ddt_checkpoint_latest(run, &step, path, sizeof path) == -ENOENT, "no checkpoints/: not -ENOENT");
    snprintf(dir, sizeof dir, "%s/checkpoints", run);
    mkdir(dir, 0755);
    check(ddt_checkpoint_latest(run, &step, path, sizeof path) == -ENOENT, "empty checkpoints/: not -ENOENT");

    fixture *f = fixture_new(31);
    write_step(run, 10, f, "{\"step\": 10}", 10, path, sizeof path, NULL);
    write_step(run, 20, f, "{\"step\": 20}", 10, path, sizeof path, NULL);
    /* a crash's temporary, complete inside, with a higher step */
    snprintf(file, sizeof file, "%s/.tmp-step-00000030-999999", dir);
    mkdir(file, 0755);
    char source[700];
    snprintf(source, sizeof source, "%s/step-00000020/state.json", dir);
    snprintf(path, sizeof path, "%s/state.json", file);
    write_file(path, "{\"step\": 30}");
    snprintf(source, sizeof source, "%s/step-00000020/state.safetensors", dir);
    snprintf(path, sizeof path, "%s/state.safetensors", file);
    check(link(source, path) == 0, "link %s: %s", path, strerror(errno));
    /* step dirs: one without state.safetensors, one without state.json, one that does not open */
    snprintf(file, sizeof file, "%s/step-00000040", dir);
    mkdir(file, 0755);
    snprintf(path, sizeof path, "%s/state.json", file);
    write_file(path, "{}");
    snprintf(file, sizeof file, "%s/step-00000050", dir);
    mkdir(file, 0755);
    snprintf(path, sizeof path, "%s/state.safetensors", file);
    check(link(source, path) == 0, "link %s: %s", path, strerror(errno));
    snprintf(file, sizeof file, "%s/step-00000060", dir);
    mkdir(file, 0755);
    snprintf(path, sizeof path, "%s/state.json", file);
    write_file(path, "{}");
    snprintf(path, sizeof path, "%s/state.safetensors", file);
    write_file(path, "not a safetensors file");

    int rc = ddt_checkpoint_latest(run, &step, path, sizeof path);
    char want[700];
    snprintf(want, sizeof want, "%s/step-00000020", dir);
    check(rc == 0 && step == 20 && !strcmp(path, want), "latest: rc %d step %lld path %s, expected step 20",
          rc, (long long)step, path);
    char small[8];
    check(ddt_checkpoint_latest(run, &step, small, sizeof small) == -ENAMETOOLONG, "a short path buffer is not refused");

    /* the next write removes the temporary; the incomplete ones neither count for keep nor go */
    write_step(run, 25, f, "{}", 2, path, sizeof path, NULL);
    check(count_entries(dir, ".tmp-") == 0, "the stale temporary was not removed");
    snprintf(path, sizeof path, "%s/step-00000020", dir);
    check(is_dir(path), "step 20 was removed: incomplete step directories counted for keep");
    snprintf(path, sizeof path, "%s/step-00000010", dir);
    check(!is_dir(path), "step 10 was kept beyond keep = 2");
    check(ddt_checkpoint_latest(run, &step, path, sizeof path) == 0 && step == 25, "latest after the write is %lld",
          (long long)step);
    fixture_free(f);
}

/* rewrites dir/state.safetensors from itself: `drop` left out, `reshape` given its 2-d shape
 * transposed, `retype` written as BF16; state.json records the new file */
static void rewrite_state(const char *dir, const char *drop, const char *reshape, const char *retype)
{
    char path[1024], err[1024] = "";
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    ddt_st_file st;
    if (ddt_st_open(path, &st, err, sizeof err)) {
        check(0, "open %s: %s", path, err);
        return;
    }
    ddt_st_entry *entries = xcalloc((size_t)st.count, sizeof *entries);
    uint16_t *half = NULL;
    int count = 0;
    for (int j = 0; j < st.count; j++) {
        const ddt_st_tensor *t = &st.tensors[j];
        if (drop && !strcmp(t->name, drop))
            continue;
        ddt_st_entry *e = &entries[count++];
        *e = (ddt_st_entry){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data };
        memcpy(e->shape, t->shape, sizeof e->shape);
        if (reshape && !strcmp(t->name, reshape)) {
            e->shape[0] = t->shape[1];
            e->shape[1] = t->shape[0];
        }
        if (retype && !strcmp(t->name, retype)) {
            int64_t numel = ddt_st_numel(t);
            half = xcalloc((size_t)numel, sizeof *half);
            e->dtype = DDT_BF16;
            e->data = half;
        }
    }
    const char *const keys[] = { "format", "version" }, *const values[] = { "ddtree-checkpoint", "1" };
    int rc = ddt_st_write(path, entries, count, keys, values, 2, err, sizeof err);
    check(rc == 0, "rewrite %s: %s", path, err);
    free(half);
    free(entries);
    ddt_st_close(&st);
    record_tensors(dir);
}

/* a read of dir with c must fail with an error naming `named`, leaving every output untouched */
static void check_refused(const char *dir, const ddt_drafter_config *c, const char *named)
{
    ddt_param table[DDT_MAX_PARAMS];
    int64_t total;
    ddt_drafter_param_table(c, table, &total);
    float *params = sentinel_floats(total), *m = sentinel_floats(total), *v = sentinel_floats(total);
    ddt_adamw_state adam = { .step = -7, .m = m, .v = v };
    ddt_checkpoint_meta meta = { .step = -7 };
    char err[1024] = "";
    int rc = ddt_checkpoint_read(dir, c, params, &adam, &meta, err, sizeof err);
    check(rc == -EINVAL, "read refusing %s: rc %d, expected -EINVAL", named, rc);
    check(strstr(err, named) && strstr(err, "state.safetensors"), "error does not name %s and the file: %s",
          named, err);
    check(all_sentinel(params, total + guard_words) && all_sentinel(m, total + guard_words) &&
              all_sentinel(v, total + guard_words) && adam.step == -7,
          "a refused read wrote into its outputs");
    check(meta.step == -7 && meta.config_json == NULL, "a refused read wrote into its meta");
    free(params);
    free(m);
    free(v);
}

static void test_read_refuses(void)
{
    char run[512], dir[700];
    new_dir("refuses", run, sizeof run);
    fixture *f = fixture_new(41);
    snprintf(dir, sizeof dir, "%s/checkpoints/step-00000001", run);

    write_step(run, 1, f, "{}", 5, NULL, 0, NULL);
    rewrite_state(dir, "adam_v.layers.1.mlp.up_proj.weight", NULL, NULL);
    check_refused(dir, &f->c, "'adam_v.layers.1.mlp.up_proj.weight' is missing");

    write_step(run, 1, f, "{}", 5, NULL, 0, NULL);
    rewrite_state(dir, NULL, "param.layers.0.self_attn.o_proj.weight", NULL);
    check_refused(dir, &f->c, "'param.layers.0.self_attn.o_proj.weight' has shape [32, 16], expected [16, 32]");

    write_step(run, 1, f, "{}", 5, NULL, 0, NULL);
    rewrite_state(dir, NULL, NULL, "adam_m.norm.weight");
    check_refused(dir, &f->c, "'adam_m.norm.weight' is BF16");

    write_step(run, 1, f, "{}", 5, NULL, 0, NULL);
    rewrite_state(dir, "adam_step", NULL, NULL);
    check_refused(dir, &f->c, "'adam_step' is missing");

    /* a checkpoint of another configuration */
    write_step(run, 1, f, "{}", 5, NULL, 0, NULL);
    ddt_drafter_config wider = f->c;
    wider.intermediate = 32;
    check_refused(dir, &wider, "'param.layers.0.mlp.gate_proj.weight' has shape [24, 16], expected [32, 16]");
    ddt_drafter_config shallower = f->c;
    shallower.layers = 1;
    check_refused(dir, &shallower, "'param.layers.1.");
    fixture_free(f);
}

static void test_same_step(void)
{
    char run[512], dir[600], path[1024], err[1024] = "";
    new_dir("same_step", run, sizeof run);
    fixture *a = fixture_new(51), *b = fixture_new(52);
    write_step(run, 7, a, "{\"from\": \"a\"}", 3, path, sizeof path, NULL);
    write_step(run, 7, b, "{\"from\": \"b\"}", 3, path, sizeof path, NULL);
    snprintf(dir, sizeof dir, "%s/checkpoints", run);
    check(count_entries(dir, "step-") == 1 && count_entries(dir, ".") == 0, "not exactly one step-00000007 left");
    float *params = sentinel_floats(b->total), *m = sentinel_floats(b->total), *v = sentinel_floats(b->total);
    ddt_adamw_state adam = { .m = m, .v = v };
    ddt_checkpoint_meta meta;
    int rc = ddt_checkpoint_read(path, &b->c, params, &adam, &meta, err, sizeof err);
    check(rc == 0, "read: %s", err);
    size_t bytes = (size_t)b->total * sizeof(float);
    check(!memcmp(params, b->params, bytes) && !memcmp(m, b->m, bytes) && !memcmp(v, b->v, bytes) &&
              adam.step == b->adam.step,
          "the second write of step 7 did not replace the first");
    check(rc == 0 && !strcmp(meta.config_json, "{\"from\": \"b\"}"), "state.json is the first write's");
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    free(params);
    free(m);
    free(v);
    fixture_free(a);
    fixture_free(b);
}

static void test_errors(void)
{
    fixture *f = fixture_new(61);
    char missing[512], path[1024] = "x", err[1024] = "";
    snprintf(missing, sizeof missing, "%s/no_such_run", root);
    int64_t bytes = 5;
    ddt_checkpoint_meta meta = fixture_meta(f, 1, "{}");
    int rc = ddt_checkpoint_write(missing, &meta, f->params, &f->adam, 2, path, sizeof path, &bytes, err, sizeof err);
    check(rc == -ENOENT, "write into a missing run_dir: rc %d, expected -ENOENT", rc);
    check(strstr(err, missing) != NULL, "error does not name the run directory: %s", err);
    check(!is_dir(missing), "the missing run_dir was created");
    check(path[0] == '\0' && bytes == 0, "outputs set by a failed write");

    char run[512];
    new_dir("errors", run, sizeof run);
    rc = ddt_checkpoint_write(run, &meta, f->params, &f->adam, 0, NULL, 0, NULL, err, sizeof err);
    check(rc == -EINVAL, "keep = 0 not refused (rc %d)", rc);
    rc = ddt_checkpoint_write(run, &meta, f->params, &f->adam, 1, path, 10, NULL, err, sizeof err);
    check(rc == -ENAMETOOLONG, "a path_out too short not refused before writing (rc %d)", rc);
    ddt_checkpoint_meta bad = meta;
    bad.drafter.head_dim = 7;
    rc = ddt_checkpoint_write(run, &bad, f->params, &f->adam, 1, NULL, 0, NULL, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "head_dim"), "a bad configuration not refused: %s", err);
    /* what the reader would refuse is refused before anything is written */
    bad = meta;
    bad.chunk = 0;
    rc = ddt_checkpoint_write(run, &bad, f->params, &f->adam, 1, NULL, 0, NULL, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "chunk"), "chunk 0 not refused: %s", err);
    bad = meta;
    bad.config_json = NULL;
    rc = ddt_checkpoint_write(run, &bad, f->params, &f->adam, 1, NULL, 0, NULL, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "run config"), "a meta without a run config not refused: %s", err);
    snprintf(path, sizeof path, "%s/checkpoints", run);
    check(count_entries(path, "") <= 0, "a refused write left something in %s", path);

    int64_t step;
    check(ddt_checkpoint_latest(missing, &step, NULL, 0) == -ENOENT, "latest of a missing run_dir is not -ENOENT");
    float *params = xcalloc((size_t)f->total, sizeof(float));
    ddt_adamw_state adam = { .m = f->m, .v = f->v };
    snprintf(path, sizeof path, "%s/checkpoints/step-00000001", missing);
    rc = ddt_checkpoint_read(path, &f->c, params, &adam, NULL, err, sizeof err);
    check(rc < 0 && strstr(err, path), "read of a missing checkpoint: rc %d, %s", rc, err);
    snprintf(path, sizeof path, "%s/export", missing);
    rc = ddt_export_write(path, &f->c, f->params, err, sizeof err);
    check(rc < 0 && strstr(err, missing), "export under a missing directory: rc %d, %s", rc, err);
    check(!is_dir(missing), "export created the missing directory");
    free(params);
    fixture_free(f);
}

/* ------------------------------------------------------------------------------------------
 * Export
 */

static const char *string_or_empty(const cJSON *item)
{
    const char *s = cJSON_GetStringValue(item);
    return s ? s : "";
}

static int configs_equal(const ddt_drafter_config *a, const ddt_drafter_config *b)
{
    int same = a->hidden == b->hidden && a->layers == b->layers && a->heads == b->heads &&
               a->kv_heads == b->kv_heads && a->head_dim == b->head_dim && a->intermediate == b->intermediate &&
               a->vocab == b->vocab && a->block_size == b->block_size && a->sliding_window == b->sliding_window &&
               a->rms_norm_eps == b->rms_norm_eps && a->rope_theta == b->rope_theta && a->taps == b->taps &&
               a->mask_token_id == b->mask_token_id && a->num_target_layers == b->num_target_layers &&
               a->max_positions == b->max_positions && a->dflash2 == b->dflash2 && a->conv_taps == b->conv_taps &&
               a->conv_group_size == b->conv_group_size && a->selector_rank == b->selector_rank &&
               a->selector_top_k == b->selector_top_k;
    for (int i = 0; i < DDT_MAX_LAYERS; i++)
        same &= a->sliding[i] == b->sliding[i];
    for (int i = 0; i < DDT_MAX_TAPS; i++)
        same &= a->target_layer_ids[i] == b->target_layer_ids[i];
    return same;
}

/* out's model.safetensors holds exactly f's table in BF16 equal to bf16(params), format pt */
static void check_export_weights(const char *out, const fixture *f)
{
    char path[1024], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    ddt_st_file st;
    if (ddt_st_open(path, &st, err, sizeof err)) {
        check(0, "model.safetensors does not open: %s", err);
        return;
    }
    const char *format = ddt_st_metadata(&st, "format");
    check(format && !strcmp(format, "pt") && st.meta_count == 1, "__metadata__ is not exactly {format: pt}");
    check(st.count == f->n, "%d tensors, expected the table's %d", st.count, f->n);
    int wrong = 0;
    for (int i = 0; i < f->n; i++) {
        const ddt_param *p = &f->table[i];
        const ddt_st_tensor *t = ddt_st_find(&st, p->name);
        int same = t && t->dtype == DDT_BF16 && t->ndim == p->ndim;
        for (int d = 0; same && d < p->ndim; d++)
            same = t->shape[d] == p->shape[d];
        if (!same) {
            check(0, "%s: missing, or not BF16 of the table's shape", p->name);
            continue;
        }
        const uint16_t *got = t->data;   /* the data offsets of our writer keep 2-byte alignment */
        for (int64_t j = 0; j < p->numel; j++)
            wrong += got[j] != ddt_f32_to_bf16(f->params[p->offset + j]);
    }
    check(wrong == 0, "%d BF16 values differ from bf16(params)", wrong);
    ddt_st_close(&st);
}

static void test_export(void)
{
    char dir[512], out[600], path[1024], err[1024] = "";
    new_dir("export", dir, sizeof dir);
    fixture *f = fixture_new(71);
    snprintf(out, sizeof out, "%s/drafter", dir);
    int rc = ddt_export_write(out, &f->c, f->params, err, sizeof err);
    check(rc == 0, "export: %s", err);
    check(count_entries(dir, "") == 1, "something besides the export is left in %s", dir);

    /* config.json: exactly the keys of SPEC.md section 5, the fixed ones with their values */
    snprintf(path, sizeof path, "%s/config.json", out);
    char *text = ddt_read_text_file(path, 1 << 20, err, sizeof err);
    cJSON *json = text ? cJSON_Parse(text) : NULL;
    check(json != NULL, "config.json does not parse");
    if (json) {
        static const char *const keys[] = {
            "architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta",
            "layer_types", "use_sliding_window", "sliding_window", "block_size", "num_target_layers",
            "dflash_config", "rope_scaling", "tie_word_embeddings", "attention_bias", "hidden_act",
            "vocab_size", "max_position_embeddings", "torch_dtype", "dtype",
        };
        int nkeys = (int)(sizeof keys / sizeof keys[0]);
        check(cJSON_GetArraySize(json) == nkeys, "config.json has %d keys, expected %d", cJSON_GetArraySize(json),
              nkeys);
        for (int i = 0; i < nkeys; i++)
            check(cJSON_GetObjectItemCaseSensitive(json, keys[i]) != NULL, "config.json lacks %s", keys[i]);
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(json, "architectures");
        check(cJSON_IsArray(arch) && cJSON_GetArraySize(arch) == 1 &&
                  !strcmp(string_or_empty(cJSON_GetArrayItem(arch, 0)), "DFlashDraftModel"),
              "architectures is not [\"DFlashDraftModel\"]");
        check(!strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(json, "model_type")), "qwen3"),
              "model_type is not qwen3");
        check(!strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(json, "hidden_act")), "silu"),
              "hidden_act is not silu");
        check(cJSON_IsNull(cJSON_GetObjectItemCaseSensitive(json, "rope_scaling")), "rope_scaling is not null");
        check(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(json, "tie_word_embeddings")) &&
                  cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(json, "attention_bias")),
              "tie_word_embeddings / attention_bias are not false");
        const cJSON *dflash = cJSON_GetObjectItemCaseSensitive(json, "dflash_config");
        check(cJSON_GetArraySize(dflash) == 2, "dflash_config does not hold exactly 2 keys");
        const cJSON *types = cJSON_GetObjectItemCaseSensitive(json, "layer_types");
        check(!strcmp(string_or_empty(cJSON_GetArrayItem(types, 0)), "sliding_attention") &&
                  !strcmp(string_or_empty(cJSON_GetArrayItem(types, 1)), "full_attention"),
              "layer_types wrong");
        check(strstr(text, "1.234567e-06") != NULL, "rms_norm_eps not written as its shortest decimal:\n%s", text);
        check(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(json, "use_sliding_window")) &&
                  cJSON_GetObjectItemCaseSensitive(json, "sliding_window")->valuedouble == 3,
              "a sliding layer: use_sliding_window is not true with sliding_window 3");
        check(cJSON_GetObjectItemCaseSensitive(json, "max_position_embeddings")->valuedouble == 40960,
              "max_position_embeddings is not the config's");
        check(!strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(json, "torch_dtype")), "bfloat16") &&
                  !strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(json, "dtype")), "bfloat16"),
              "torch_dtype / dtype are not bfloat16");
        cJSON_Delete(json);
    }
    free(text);

    ddt_drafter_config back;
    rc = ddt_drafter_config_load(out, &back, err, sizeof err);
    check(rc == 0, "config.json does not load: %s", err);
    check(rc == 0 && configs_equal(&back, &f->c), "config.json loads to another configuration");
    check_export_weights(out, f);
    fixture_free(f);
}

/* dir/model.safetensors rewritten from src's tensors without `drop` (NULL: none) and with an
 * extra F32 tensor `extra` (NULL: none) */
static void rewrite_export_tensors(const char *src, const char *dir, const char *drop, const char *extra)
{
    char path[1024], err[1024] = "";
    snprintf(path, sizeof path, "%s/model.safetensors", src);
    ddt_st_file st;
    if (ddt_st_open(path, &st, err, sizeof err)) {
        check(0, "%s does not open: %s", path, err);
        return;
    }
    ddt_st_entry *e = xcalloc((size_t)st.count + 1, sizeof *e);
    static const float one = 1.0f;
    int n = 0;
    for (int i = 0; i < st.count; i++) {
        const ddt_st_tensor *t = &st.tensors[i];
        if (drop && !strcmp(t->name, drop))
            continue;
        e[n] = (ddt_st_entry){ .name = t->name, .dtype = t->dtype, .ndim = t->ndim, .data = t->data };
        memcpy(e[n++].shape, t->shape, sizeof e[0].shape);
    }
    if (extra)
        e[n++] = (ddt_st_entry){ .name = extra, .dtype = DDT_F32, .ndim = 1, .shape = { 1 }, .data = &one };
    static const char *const keys[] = { "format" }, *const values[] = { "pt" };
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    check(ddt_st_write(path, e, n, keys, values, 1, err, sizeof err) == 0, "rewrite %s: %s", path, err);
    free(e);
    ddt_st_close(&st);
}

/* ddt_export_read: config.json to an equal configuration, the weights bf16(params) widened, bit
 * for bit (NaN, inf, -0 included); a missing tensor or one beside the table's (in an export
 * without a manifest, as another trainer writes it), or no model.safetensors refused naming the
 * file and the tensor, *params NULL */
static void test_export_read(void)
{
    char dir[512], out[600], bad[600], path[1024], err[1024] = "";
    new_dir("export_read", dir, sizeof dir);
    fixture *f = fixture_new(83);
    snprintf(out, sizeof out, "%s/drafter", dir);
    check(ddt_export_write(out, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    ddt_drafter_config back;
    float *params = NULL, sentinel = 0;
    int rc = ddt_export_read(out, &back, &params, err, sizeof err);
    check(rc == 0 && params != NULL, "export read: %d %s", rc, err);
    if (rc == 0) {
        check(configs_equal(&back, &f->c), "the export reads back to another configuration");
        int64_t wrong = 0;
        for (int64_t j = 0; j < f->total; j++) {
            const uint32_t want = (uint32_t)ddt_f32_to_bf16(f->params[j]) << 16;
            uint32_t got;
            memcpy(&got, &params[j], sizeof got);
            wrong += got != want;
        }
        check(wrong == 0, "%lld weights read back differ from bf16(params)", (long long)wrong);
        check(((uintptr_t)params & 63) == 0, "the weights are not 64-byte aligned");
    }
    free(params);

    /* the export's tensors, one left out / one too many */
    static const struct { const char *drop, *extra, *want; } cases[] = {
        { "layers.1.mlp.up_proj.weight", NULL, "tensor 'layers.1.mlp.up_proj.weight' is missing" },
        { NULL, "lm_head.weight", "tensor 'lm_head.weight' is not a parameter of this drafter" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(bad, sizeof bad, "%s/bad%zu", dir, i);
        check(ddt_export_write(bad, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
        rewrite_export_tensors(out, bad, cases[i].drop, cases[i].extra);
        snprintf(path, sizeof path, "%s/%s", bad, DDT_EXPORT_MANIFEST);   /* as another trainer's export */
        check(unlink(path) == 0, "unlink %s", path);
        params = &sentinel;   /* must come back NULL */
        err[0] = '\0';
        rc = ddt_export_read(bad, &back, &params, err, sizeof err);
        snprintf(path, sizeof path, "%s/model.safetensors: %s", bad, cases[i].want);
        check(rc == -EINVAL && params == NULL && strstr(err, path), "%s: %d '%s', expected '%s'",
              cases[i].want, rc, err, path);
    }
    snprintf(path, sizeof path, "%s/bad0/model.safetensors", dir);
    unlink(path);
    snprintf(bad, sizeof bad, "%s/bad0", dir);
    params = &sentinel;
    rc = ddt_export_read(bad, &back, &params, err, sizeof err);
    check(rc != 0 && params == NULL && strstr(err, path), "no model.safetensors: %d '%s'", rc, err);
    fixture_free(f);
}

/* out/config.json's key, parsed (the caller deletes *doc) */
static const cJSON *export_key(const char *out, const char *key, cJSON **doc)
{
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/config.json", out);
    char *text = ddt_read_text_file(path, 1 << 20, err, sizeof err);
    *doc = text ? cJSON_Parse(text) : NULL;
    free(text);
    return cJSON_GetObjectItemCaseSensitive(*doc, key);
}

/* No sliding layer: use_sliding_window false, sliding_window null (what Qwen3Config makes of
 * it anyway), read back with no window; state.json holds the same drafter. Without
 * max_positions the export is refused. */
static void test_export_without_sliding(void)
{
    char dir[512], out[600], err[1024] = "";
    new_dir("export_full", dir, sizeof dir);
    fixture *f = fixture_new(73);
    f->c.sliding[0] = 0;
    snprintf(out, sizeof out, "%s/drafter", dir);
    check(ddt_export_write(out, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    cJSON *doc;
    check(cJSON_IsFalse(export_key(out, "use_sliding_window", &doc)), "use_sliding_window is not false");
    cJSON_Delete(doc);
    check(cJSON_IsNull(export_key(out, "sliding_window", &doc)), "sliding_window is not null");
    cJSON_Delete(doc);
    ddt_drafter_config back, want = f->c;
    want.sliding_window = 0;   /* not said: no layer uses it */
    int rc = ddt_drafter_config_load(out, &back, err, sizeof err);
    check(rc == 0 && configs_equal(&back, &want), "config.json loads to another configuration: %s", err);

    char run[600], path[1200];
    snprintf(run, sizeof run, "%s/run", dir);
    check(mkdir(run, 0755) == 0, "mkdir %s", run);
    write_step(run, 7, f, "{\"name\": \"r\"}", 1, path, sizeof path, NULL);
    ddt_checkpoint_meta meta;
    rc = ddt_checkpoint_read_meta(path, &meta, err, sizeof err);
    check(rc == 0 && configs_equal(&meta.drafter, &want), "state.json of a drafter without sliding layers: %s", err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);

    f->c.max_positions = 0;
    rc = ddt_export_write(out, &f->c, f->params, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "max_position_embeddings"), "an export without max_positions: rc %d, %s", rc,
          err);
    fixture_free(f);
}

static void test_export_replaces(void)
{
    char dir[512], out[600], path[1024], err[1024] = "";
    new_dir("export_replace", dir, sizeof dir);
    fixture *a = fixture_new(81), *b = fixture_new(82);
    snprintf(out, sizeof out, "%s/drafter/", dir);   /* a trailing slash names the same directory */
    check(ddt_export_write(out, &a->c, a->params, err, sizeof err) == 0, "first export: %s", err);
    snprintf(path, sizeof path, "%s/drafter/stale.txt", dir);
    write_file(path, "from before");
    b->c.vocab = 151936;   /* a different config.json too */
    check(ddt_export_write(out, &b->c, b->params, err, sizeof err) == 0, "second export: %s", err);
    check(access(path, F_OK) != 0, "the old export's files are still there");
    check(count_entries(dir, "") == 1, "a temporary or the old export is left in %s", dir);
    ddt_drafter_config back;
    check(ddt_drafter_config_load(out, &back, err, sizeof err) == 0 && back.vocab == 151936,
          "config.json is not the second export's");
    check_export_weights(out, b);

    /* an export onto a file is refused and leaves the file and no temporary */
    snprintf(path, sizeof path, "%s/a_file", dir);
    write_file(path, "keep me");
    int rc = ddt_export_write(path, &a->c, a->params, err, sizeof err);
    check(rc == -ENOTDIR && strstr(err, path), "export onto a file: rc %d, %s", rc, err);
    check(file_size(path) == 7 && count_entries(dir, "") == 2, "a refused export changed %s", dir);
    fixture_free(a);
    fixture_free(b);
}

/* ------------------------------------------------------------------------------------------
 * state.json: checked at read, the first form read too, the export from a checkpoint
 */

static int metas_equal(const ddt_checkpoint_meta *a, const ddt_checkpoint_meta *b)
{
    return !strcmp(a->run_id, b->run_id) && a->step == b->step && a->cursor == b->cursor && a->chunk == b->chunk &&
           a->vocab_tile == b->vocab_tile && a->config_json && b->config_json &&
           !strcmp(a->config_json, b->config_json) && configs_equal(&a->drafter, &b->drafter);
}

/* the object holding the dotted key in doc, and the key's last name: each step down takes the
 * longest name before a dot that is an object there (state.json's "files" holds
 * "state.safetensors", a name with a dot) */
static cJSON *path_parent(cJSON *doc, const char *dotted, char *last, size_t last_len)
{
    cJSON *at = doc;
    const char *from = dotted;
    for (int deeper = 1; at && deeper && !cJSON_GetObjectItemCaseSensitive(at, from);) {
        deeper = 0;
        for (size_t n = strlen(from); n-- > 0 && !deeper;) {
            if (from[n] != '.')
                continue;
            snprintf(last, last_len, "%.*s", (int)n, from);
            cJSON *inner = cJSON_GetObjectItemCaseSensitive(at, last);
            if (cJSON_IsObject(inner)) {
                at = inner;
                from += n + 1;
                deeper = 1;
            }
        }
    }
    snprintf(last, last_len, "%s", from);
    return at;
}

/* dir/state.json with the value at the dotted key replaced by (or, when absent, given) the JSON
 * text `value`, or removed when value is NULL; sealed again as a writer seals it (base/checksum.h:
 * the last key, from version 4 on) unless the seal is the key edited: what the tests check lies
 * behind the seal */
static void edit_state(const char *dir, const char *dotted, const char *value)
{
    char path[1024], err[1024] = "", last[128];
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *text = ddt_read_text_file(path, 1 << 22, err, sizeof err);
    cJSON *doc = text ? cJSON_Parse(text) : NULL, *parent = doc ? path_parent(doc, dotted, last, sizeof last) : NULL;
    check(parent != NULL, "%s: no %s to edit: %s", path, dotted, err);
    if (parent && !value) {
        cJSON_DeleteItemFromObjectCaseSensitive(parent, last);
    } else if (parent) {
        cJSON *v = cJSON_Parse(value);
        if (cJSON_GetObjectItemCaseSensitive(parent, last))
            cJSON_ReplaceItemInObjectCaseSensitive(parent, last, v);
        else
            cJSON_AddItemToObject(parent, last, v);
    }
    const cJSON *version = doc ? cJSON_GetObjectItemCaseSensitive(doc, "version") : NULL;
    int seal = strcmp(dotted, "seal") && cJSON_IsNumber(version) && version->valuedouble >= 4;
    if (doc && strcmp(dotted, "seal")) {
        cJSON_DeleteItemFromObjectCaseSensitive(doc, "seal");
        if (seal)
            cJSON_AddStringToObject(doc, "seal", DDT_SEAL_ZERO);
    }
    char *edited = doc ? cJSON_Print(doc) : NULL;
    if (edited && seal)
        check(ddt_checksum_seal(edited) == 0, "%s: not sealed again", path);
    if (edited)
        write_file(path, edited);
    free(edited);
    cJSON_Delete(doc);
    free(text);
}

/* state.json in the first form (before "version"), as the trainer wrote it: the run config and,
 * in "resolved", what the config left to the target */
static void write_first_form(const char *dir, const ddt_checkpoint_meta *m)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "run_id", m->run_id);
    cJSON_AddNumberToObject(o, "step", (double)m->step);
    cJSON_AddNumberToObject(o, "cursor", (double)m->cursor);
    cJSON_AddNumberToObject(o, "chunk", (double)m->chunk);
    cJSON_AddNumberToObject(o, "vocab_tile", (double)m->vocab_tile);
    cJSON_AddStringToObject(o, "config", m->config_json);
    const ddt_drafter_config *d = &m->drafter;
    cJSON *r = cJSON_AddObjectToObject(o, "resolved");
    cJSON_AddNumberToObject(r, "hidden_size", (double)d->hidden);
    cJSON_AddNumberToObject(r, "vocab_size", (double)d->vocab);
    cJSON_AddNumberToObject(r, "num_target_layers", (double)d->num_target_layers);
    cJSON_AddNumberToObject(r, "mask_token_id", d->mask_token_id);
    cJSON_AddItemToObject(r, "target_layer_ids", cJSON_CreateIntArray(d->target_layer_ids, (int)d->taps));
    char path[1024], *text = cJSON_Print(o);
    snprintf(path, sizeof path, "%s/state.json", dir);
    write_file(path, text);
    free(text);
    cJSON_Delete(o);
}

/* a read of dir's state.json must fail naming the file and `named`, leaving meta as it was */
static void check_meta_refused(const char *dir, const char *named)
{
    ddt_checkpoint_meta meta = { .step = -7 };
    char err[1024] = "";
    int rc = ddt_checkpoint_read_meta(dir, &meta, err, sizeof err);
    check(rc == -EINVAL, "state.json refusing %s: rc %d, expected -EINVAL", named, rc);
    check(strstr(err, named) && strstr(err, "state.json"), "error does not name %s and the file: %s", named, err);
    check(meta.step == -7 && meta.config_json == NULL, "a refused read of state.json wrote into meta");
}

static void test_meta_refuses(void)
{
    char run[512], dir[700], path[800], err[1024] = "";
    new_dir("meta_refuses", run, sizeof run);
    fixture *f = fixture_new(91);
    snprintf(dir, sizeof dir, "%s/checkpoints/step-00000005", run);
    snprintf(path, sizeof path, "%s/state.json", dir);
    write_step(run, 5, f, "{\"name\": \"r\"}", 5, NULL, 0, NULL);
    char *good = ddt_read_text_file(path, 1 << 22, err, sizeof err);
    /* the key, a replacement (NULL: removed), what the error must name */
    static const struct {
        const char *key, *value, *named;
    } cases[] = {
        { "cursor", NULL, "cursor is missing" },
        { "chunk", "\"64\"", "chunk must be" },
        { "step", "-1", "step must be" },
        { "vocab_tile", "1.5", "vocab_tile must be an integer" },
        { "config", "{}", "config must be a string" },
        { "run_id", "7", "run_id must be a string" },
        { "version", "5", "version must be 2, 3 or 4" },
        { "files", NULL, "files is missing" },
        { "files", "[]", "files must be an object" },
        { "files.state.safetensors", NULL, "files: state.safetensors is missing" },
        { "files.model.safetensors", "{}", "files: model.safetensors is not a known field" },
        { "files.state.safetensors.xxh64", "\"ABCDEF0123456789\"", "files: state.safetensors: xxh64 must be 16" },
        { "files.state.safetensors.size", "-1", "files: state.safetensors: size must be" },
        { "rng", "\"0x9e37\"", "rng is not a known field" },
        { "drafter", NULL, "drafter is missing" },
        { "drafter", "[]", "drafter must be an object" },
        { "drafter.hidden_size", NULL, "drafter: hidden_size is missing" },
        { "drafter.num_attention_heads", "\"4\"", "drafter: num_attention_heads must be" },
        { "drafter.rms_norm_eps", "0", "drafter: rms_norm_eps must be" },
        { "drafter.model_type", "\"llama\"", "drafter: model_type must be \"qwen3\"" },
        { "drafter.architectures", "[\"Qwen3ForCausalLM\"]", "drafter: architectures must be" },
        { "drafter.architectures", "[\"DFlash2DraftModel\"]", "drafter: is_causal is missing" },
        { "drafter.rope_scaling", "{}", "drafter: rope_scaling must be null" },
        { "drafter.tie_word_embeddings", "true", "drafter: tie_word_embeddings must be false" },
        { "drafter.tie_word_embedding", "false", "drafter: tie_word_embedding is not a key" },
        { "drafter.layer_types", "[\"full_attention\"]", "drafter: layer_types must be" },
        { "drafter.layer_types", "[\"full_attention\", \"local\"]", "drafter: layer_types entries" },
        { "drafter.dflash_config.mask_token_id", NULL, "drafter.dflash_config: mask_token_id is missing" },
        { "drafter.dflash_config.target_layer_ids", "\"1,3,5\"", "drafter.dflash_config: target_layer_ids must be" },
        { "drafter.dflash_config.block_size", "4", "drafter.dflash_config: block_size is not a known field" },
        { "drafter.dflash_config.conv_kernel_size", "2", "drafter.dflash_config: conv_kernel_size is not a known" },
        { "drafter.is_causal", "false", "drafter: is_causal is a DFlash2DraftModel's key" },
        { "drafter.dflash_config.mask_token_id", "100", "drafter: dflash_config.mask_token_id must be in [0, vocab_size)" },
        { "drafter.head_dim", "7", "drafter: head_dim must be even" },
        { "drafter.use_sliding_window", "false", "drafter: use_sliding_window must be true when" },
        { "drafter.use_sliding_window", NULL, "drafter: use_sliding_window is missing" },
        { "drafter.sliding_window", "null", "drafter: sliding_window must be a number" },
        { "drafter.max_position_embeddings", NULL, "drafter: max_position_embeddings is missing" },
        { "drafter.max_position_embeddings", "0", "drafter: max_position_embeddings must be in [1, 2^53]" },
        { "drafter.torch_dtype", "\"float32\"", "drafter: torch_dtype must be \"bfloat16\"" },
        { "drafter.dtype", NULL, "drafter: dtype is missing" },
    };
    for (size_t i = 0; good && i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, good);
        edit_state(dir, cases[i].key, cases[i].value);
        check_meta_refused(dir, cases[i].named);
    }
    write_file(path, "{\"step\": 5,");
    check_meta_refused(dir, "invalid JSON");
    write_file(path, "{\"step\": 5, \"step\": 6}");
    check_meta_refused(dir, "\"step\" appears twice");

    /* a full read refused for its state.json leaves the tensors' outputs untouched too */
    write_file(path, good);
    edit_state(dir, "drafter.vocab_size", "true");
    float *params = sentinel_floats(f->total);
    ddt_checkpoint_meta meta = { .step = -7 };
    int rc = ddt_checkpoint_read(dir, &f->c, params, NULL, &meta, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "vocab_size"), "a read with a mistyped drafter key: rc %d, %s", rc, err);
    check(all_sentinel(params, f->total + guard_words) && meta.step == -7, "a refused read wrote into its outputs");
    /* the tensors alone need no state.json */
    rc = ddt_checkpoint_read(dir, &f->c, params, NULL, NULL, err, sizeof err);
    check(rc == 0 && !memcmp(params, f->params, (size_t)f->total * sizeof(float)), "params alone: %s", err);

    /* the good one reads; so does the export's config.json as its drafter (one form) */
    write_file(path, good);
    rc = ddt_checkpoint_read_meta(dir, &meta, err, sizeof err);
    ddt_checkpoint_meta want = fixture_meta(f, 5, "{\"name\": \"r\"}");
    check(rc == 0 && metas_equal(&meta, &want), "the written state.json does not read back: %s", err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    char out[800], config_path[900];
    snprintf(out, sizeof out, "%s/export", run);
    snprintf(config_path, sizeof config_path, "%s/config.json", out);
    check(ddt_export_write(out, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    char *config = ddt_read_text_file(config_path, 1 << 20, err, sizeof err);
    write_file(path, good);
    edit_state(dir, "drafter", config);
    rc = ddt_checkpoint_read_meta(dir, &meta, err, sizeof err);
    check(rc == 0 && configs_equal(&meta.drafter, &f->c), "the export's config.json as the drafter: %s", err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    free(config);

    /* version 2: no serving keys; max_position_embeddings is the run config's target's */
    char target[800];
    snprintf(target, sizeof target, "%s/target", run);
    check(mkdir(target, 0755) == 0, "mkdir %s", target);
    snprintf(config_path, sizeof config_path, "%s/config.json", target);
    write_file(config_path, "{\"model_type\": \"llama\", \"max_position_embeddings\": 2048}");
    char run_config[1200];
    snprintf(run_config, sizeof run_config, "\"{\\\"target\\\": {\\\"kind\\\": \\\"hf\\\", "
             "\\\"path\\\": \\\"%s\\\"}}\"", target);
    static const char *const newer[] = { "drafter.use_sliding_window", "drafter.max_position_embeddings",
                                         "drafter.torch_dtype", "drafter.dtype" };
    write_file(path, good);
    edit_state(dir, "version", "2");
    edit_state(dir, "files", NULL);
    edit_state(dir, "config", run_config);
    for (int i = 0; i < 4; i++)
        edit_state(dir, newer[i], NULL);
    rc = ddt_checkpoint_read_meta(dir, &meta, err, sizeof err);
    ddt_drafter_config v2 = f->c;
    v2.max_positions = 2048;
    check(rc == 0 && configs_equal(&meta.drafter, &v2), "version 2 without the serving keys: %s (max %lld)", err,
          (long long)meta.drafter.max_positions);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    write_file(config_path, "{\"max_position_embeddings\": -1}");
    check_meta_refused(dir, "target.path: ");
    edit_state(dir, "version", "3");
    check_meta_refused(dir, "drafter: use_sliding_window is missing");
    free(params);
    free(good);
    fixture_free(f);
}

/* the whole file at path (malloc'd, *len its size), or NULL */
static unsigned char *read_bytes(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    unsigned char *data = NULL;
    *len = 0;
    if (f && fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        data = size >= 0 ? xcalloc((size_t)size + 1, 1) : NULL;
        rewind(f);
        if (data && fread(data, 1, (size_t)size, f) != (size_t)size) {
            free(data);
            data = NULL;
        }
        *len = data ? (size_t)size : 0;
    }
    if (f)
        fclose(f);
    return data;
}

/* both exports hold the same config.json and model.safetensors, byte for byte */
static void check_same_export(const char *got, const char *want)
{
    static const char *const files[] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        char a[1024], b[1024];
        snprintf(a, sizeof a, "%s/%s", got, files[i]);
        snprintf(b, sizeof b, "%s/%s", want, files[i]);
        size_t la, lb;
        unsigned char *x = read_bytes(a, &la), *y = read_bytes(b, &lb);
        check(x && y && la == lb && !memcmp(x, y, la), "%s differs from %s (%zu vs %zu bytes)", a, b, la, lb);
        free(x);
        free(y);
    }
}

/* a tiny run whose drafter has `drafter` after its target_layer_ids ("" or ", KEY: VALUE...") */
#define TINY_RUN_WITH(drafter)                                                                      \
    "{\"name\": \"c\", \"target\": {\"kind\": \"synthetic\", \"hidden_size\": 32, "                \
    "\"num_hidden_layers\": 4, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "           \
    "\"head_dim\": 8, \"intermediate_size\": 48, \"vocab_size\": 96},"                              \
    " \"drafter\": {\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2," \
    " \"head_dim\": 8, \"intermediate_size\": 48, \"block_size\": 4, \"rms_norm_eps\": 1.234567e-6,"  \
    " \"layer_types\": [\"sliding_attention\", \"full_attention\"], \"sliding_window\": 6,"         \
    " \"target_layer_ids\": [1, 2]" drafter "},"                                                   \
    " \"train\": {\"steps\": 6, \"sequences_per_step\": 4, \"seq_len\": 24, \"max_anchors\": 4,"    \
    " \"heldout\": 4, \"noise_std\": 0.05, \"lr\": 0.003, \"seed\": 5},"                            \
    " \"loss\": {\"chunk\": 64, \"vocab_tile\": 32}, \"devices\": \"cpu\","                        \
    " \"checkpoint\": {\"every_steps\": 100, \"keep\": 2}, \"eval\": {\"every_steps\": 100, \"sequences\": 2}}"
#define TINY_RUN TINY_RUN_WITH("")

static ddt_trainer *open_trainer(const char *state, const char *json, const char *resume_id)
{
    ddt_trainer *t = NULL;
    char err[1024] = "", field[128] = "";
    int rc = ddt_trainer_open(json, strlen(json), state, resume_id, resume_id != NULL, NULL, &t, err, sizeof err,
                              field, sizeof field);
    check(rc == 0, "trainer open (%d): %s [%s]", rc, err, field);
    return rc == 0 ? t : NULL;
}

static double trainer_steps(ddt_trainer *t, int n)
{
    ddt_step_record rec = { .loss = NAN };
    char err[1024] = "";
    for (int i = 0; i < n; i++)
        if (ddt_trainer_step(t, &rec, err, sizeof err)) {
            check(0, "step: %s", err);
            return NAN;
        }
    return rec.loss;
}

/* A trainer's checkpoint exported without it equals its live export at that step, byte for
 * byte, from state.json as written and in its first form; the first form resumes exactly. */
static void test_export_from_checkpoint(void)
{
    char state[512], live[600], out[600], err[1024] = "", ckpt[1200], run_dir[2200], run_id[64];
    new_dir("from_checkpoint", state, sizeof state);
    snprintf(live, sizeof live, "%s/live", state);
    snprintf(out, sizeof out, "%s/exported", state);
    ddt_trainer *t = open_trainer(state, TINY_RUN, NULL);
    if (!t)
        return;
    trainer_steps(t, 3);
    check(ddt_trainer_checkpoint(t, err, sizeof err) == 0, "checkpoint: %s", err);
    check(ddt_trainer_export(t, live, err, sizeof err) == 0, "live export: %s", err);
    const double straight = trainer_steps(t, 1);   /* step 4, uninterrupted */
    ddt_checkpoint_meta want = { .step = 3, .chunk = 64, .vocab_tile = 32, .config_json = (char *)TINY_RUN,
                                 .drafter = ddt_trainer_config(t)->drafter };
    snprintf(want.run_id, sizeof want.run_id, "%s", ddt_trainer_run_id(t));
    snprintf(run_id, sizeof run_id, "%s", ddt_trainer_run_id(t));
    snprintf(run_dir, sizeof run_dir, "%s", ddt_trainer_run_dir(t));
    ddt_trainer_close(t);

    int rc = ddt_checkpoint_export(run_dir, -1, out, ckpt, sizeof ckpt, err, sizeof err);
    check(rc == 0 && strstr(ckpt, "/checkpoints/step-00000003"), "export of the newest: rc %d %s (%s)", rc, err, ckpt);
    check_same_export(out, live);
    rc = ddt_checkpoint_export(run_dir, 3, out, ckpt, sizeof ckpt, err, sizeof err);
    check(rc == 0, "export of step 3: %s", err);
    check_same_export(out, live);
    char other[1200];
    rc = ddt_checkpoint_export(run_dir, 2, out, other, sizeof other, err, sizeof err);
    check(rc == -ENOENT && strstr(err, "step-00000002"), "export of a step not kept: rc %d, %s", rc, err);

    ddt_checkpoint_meta meta;
    rc = ddt_checkpoint_read_meta(ckpt, &meta, err, sizeof err);
    check(rc == 0, "state.json: %s", err);
    if (rc)
        return;
    want.cursor = meta.cursor;   /* the source's; the resume below checks it is the right one */
    check(metas_equal(&meta, &want), "the trainer's state.json reads back to another meta");

    /* the first form: the same meta, the same export, and a resume that repeats step 4 */
    write_first_form(ckpt, &meta);
    ddt_checkpoint_meta first;
    rc = ddt_checkpoint_read_meta(ckpt, &first, err, sizeof err);
    check(rc == 0 && metas_equal(&first, &meta), "the first form reads to another meta: %s", err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&first);
    rc = ddt_checkpoint_export(run_dir, -1, out, ckpt, sizeof ckpt, err, sizeof err);
    check(rc == 0, "export of the first form: %s", err);
    check_same_export(out, live);
    t = open_trainer(state, "", run_id);
    if (t) {
        check(ddt_trainer_step_count(t) == 3, "resumed from the first form at step %lld",
              (long long)ddt_trainer_step_count(t));
        double resumed = trainer_steps(t, 1);
        check(resumed == straight, "step 4 resumed from the first form: %.9g, uninterrupted %.9g", resumed, straight);
        ddt_trainer_close(t);
    }
    edit_state(ckpt, "resolved.vocab_size", NULL);
    check_meta_refused(ckpt, "resolved: vocab_size is missing");
    write_first_form(ckpt, &meta);
    edit_state(ckpt, "config", "\"{\\\"train\\\": {\\\"steps\\\": -1}}\"");
    check_meta_refused(ckpt, "state.json: config: ");
    ddt_checkpoint_meta_free(&meta);
}

/* ------------------------------------------------------------------------------------------
 * Checksums: taken as a file is written, verified by reading it back
 */

/* path with the byte at `at` (-1: the middle one) flipped in its lowest bit; a second flip
 * undoes it */
static void flip_byte(const char *path, long at)
{
    FILE *f = fopen(path, "r+b");
    check(f != NULL, "cannot open %s", path);
    if (!f)
        return;
    if (at < 0 && fseek(f, 0, SEEK_END) == 0)
        at = ftell(f) / 2;
    int c = fseek(f, at, SEEK_SET) == 0 ? fgetc(f) : EOF;
    check(c != EOF && fseek(f, at, SEEK_SET) == 0 && fputc(c ^ 1, f) != EOF, "cannot flip byte %ld of %s", at, path);
    fclose(f);
}

/* the checksum of dir/name as 16 hex digits */
static void file_hex(const char *dir, const char *name, char hex[DDT_CHECKSUM_HEX])
{
    char path[1024], err[1024] = "";
    ddt_checksum sum = { 0 };
    snprintf(path, sizeof path, "%s/%s", dir, name);
    check(ddt_checksum_file(path, &sum, err, sizeof err) == 0, "checksum of %s: %s", path, err);
    ddt_checksum_hex(sum.xxh64, hex);
}

/* the verdict's text must be `want` */
static void check_verdict(const ddt_verdict *v, const char *what, const char *want)
{
    char text[1024];
    ddt_verdict_text(v, text, sizeof text);
    check(!strcmp(text, want), "%s: '%s', expected '%s'", what, text, want);
}

/* xxHash64's published vectors; the stream in uneven pieces, a file read back in blocks and
 * the hex form agree with them */
static void test_checksum(void)
{
    check(ddt_checksum_of("", 0).xxh64 == 0xef46db3751d8e999ull, "xxh64 of no bytes is not ef46db3751d8e999");
    check(ddt_checksum_of("abc", 3).xxh64 == 0x44bc2cf5ad770999ull, "xxh64 of \"abc\" is not 44bc2cf5ad770999");
    static unsigned char data[3 << 20];   /* past one block of the file reader */
    for (size_t i = 0; i < sizeof data; i++)
        data[i] = (unsigned char)(i * 7 + (i >> 13));
    const ddt_checksum whole = ddt_checksum_of(data, sizeof data);
    ddt_checksum_stream *s = ddt_checksum_begin();
    static const size_t pieces[] = { 1, 31, 32, 1000, 65536 };
    size_t at = 0;
    for (size_t i = 0; s && i < sizeof pieces / sizeof pieces[0]; at += pieces[i++])
        ddt_checksum_update(s, data + at, pieces[i]);
    if (s)
        ddt_checksum_update(s, data + at, sizeof data - at);
    ddt_checksum streamed = s ? ddt_checksum_end(s) : (ddt_checksum){ 0 };
    check(streamed.xxh64 == whole.xxh64 && streamed.size == (int64_t)sizeof data, "the stream differs from the whole");

    char path[600], err[1024] = "", hex[DDT_CHECKSUM_HEX];
    snprintf(path, sizeof path, "%s/checksum.bin", root);
    FILE *f = fopen(path, "wb");
    check(f && fwrite(data, 1, sizeof data, f) == sizeof data, "cannot write %s", path);
    if (f)
        fclose(f);
    ddt_checksum read_back = { 0 };
    check(ddt_checksum_file(path, &read_back, err, sizeof err) == 0 && read_back.xxh64 == whole.xxh64 &&
              read_back.size == whole.size,
          "the file read back differs: %s", err);
    unlink(path);
    check(ddt_checksum_file(path, &read_back, err, sizeof err) == -ENOENT && strstr(err, path),
          "a missing file: %s", err);

    uint64_t h = 0;
    ddt_checksum_hex(0x0123456789abcdefull, hex);
    check(!strcmp(hex, "0123456789abcdef"), "hex form %s", hex);
    check(ddt_checksum_from_hex(hex, &h) == 0 && h == 0x0123456789abcdefull, "hex form read back");
    static const char *const refused[] = { "0123456789ABCDEF", "0123456789abcde", "0123456789abcdef0",
                                           "0123456789abcdeg", "" };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++)
        check(ddt_checksum_from_hex(refused[i], &h) == -EINVAL, "hex '%s' not refused", refused[i]);
}

/* state.json records state.safetensors as written; a byte flipped, the file cut short or
 * missing, or state.json unreadable, is refused by every reader naming the file (both checksums
 * when they differ) and what to do, outputs untouched, and ddt_checkpoint_verify says it */
/* state.json is sealed with its own checksum (base/checksum.h): a byte changed where the JSON
 * still parses (the step 9 made 8), in the seal's digits, or the seal removed, is refused as
 * corrupt naming the file, not read as another checkpoint */
static void test_state_sealed(void)
{
    char run[512], dir[700], path[800], err[2048] = "";
    new_dir("sealed", run, sizeof run);
    fixture *f = fixture_new(103);
    write_step(run, 9, f, "{}", 3, dir, sizeof dir, NULL);
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *text = ddt_read_text_file(path, 1 << 22, err, sizeof err);
    char *step = text ? strstr(text, "\"step\":\t9") : NULL;
    char *seal = text ? strstr(text, "\"seal\":\t\"") : NULL;
    check(step && seal, "state.json lacks its step or its seal: %s", text ? text : err);
    const char *const what[] = { "a digit that still parses", "a digit of the seal", "the seal's key" };
    for (int k = 0; step && seal && k < 3; k++) {
        char *edited = strdup(text);
        if (k == 0)
            edited[step - text + 8] = '8';
        else if (k == 1)
            edited[seal - text + 9] ^= 1;
        else
            edited[seal - text + 1] = 'S';
        write_file(path, edited);
        free(edited);
        ddt_checkpoint_meta meta = { .step = -7 };
        int rc = ddt_checkpoint_read_meta(dir, &meta, err, sizeof err);
        check(rc == -EBADMSG && strstr(err, path) && strstr(err, "is corrupt") && meta.step == -7,
              "%s changed in state.json: rc %d, %s", what[k], rc, err);
        ddt_verdict v;
        check(ddt_checkpoint_verify(dir, &v) == 0 && v.state == DDT_VERDICT_CORRUPT && !strcmp(v.file, "state.json"),
              "%s changed in state.json: verify says state %d, file %s", what[k], v.state, v.file);
    }
    if (text)
        write_file(path, text);
    ddt_checkpoint_meta meta;
    check(ddt_checkpoint_read_meta(dir, &meta, err, sizeof err) == 0 && meta.step == 9, "state.json put back: %s", err);
    ddt_checkpoint_meta_free(&meta);
    free(text);
    fixture_free(f);
}

static void test_checkpoint_corrupt(void)
{
    char run[512], dir[700], tensors[800], out[800], ckpt[1200], err[2048] = "", want[DDT_CHECKSUM_HEX],
        got[DDT_CHECKSUM_HEX], expect[1600];
    new_dir("corrupt", run, sizeof run);
    fixture *f = fixture_new(101);
    write_step(run, 9, f, "{}", 3, dir, sizeof dir, NULL);
    snprintf(tensors, sizeof tensors, "%s/state.safetensors", dir);
    snprintf(out, sizeof out, "%s/export", run);

    /* the record, taken while writing, is the file's as read back */
    snprintf(expect, sizeof expect, "%s/state.json", dir);
    char *text = ddt_read_text_file(expect, 1 << 22, err, sizeof err);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(doc, "files");
    const cJSON *rec = cJSON_GetObjectItemCaseSensitive(files, "state.safetensors");
    file_hex(dir, "state.safetensors", want);
    check(cJSON_GetObjectItemCaseSensitive(doc, "version")->valuedouble == 4, "state.json is not version 4");
    check(cJSON_GetArraySize(files) == 1 && cJSON_GetObjectItemCaseSensitive(rec, "size") &&
              cJSON_GetObjectItemCaseSensitive(rec, "size")->valuedouble == (double)file_size(tensors) &&
              !strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(rec, "xxh64")), want),
          "state.json's files do not record state.safetensors as it is (%s)", want);
    cJSON_Delete(doc);
    free(text);
    ddt_verdict v;
    check(ddt_checkpoint_verify(dir, &v) == 0, "verify of a directory failed");
    check_verdict(&v, "a checkpoint as written", "good");

    /* one byte flipped */
    flip_byte(tensors, -1);
    file_hex(dir, "state.safetensors", got);
    float *params = sentinel_floats(f->total), *m = sentinel_floats(f->total), *vv = sentinel_floats(f->total);
    ddt_adamw_state adam = { .step = -7, .m = m, .v = vv };
    ddt_checkpoint_meta meta = { .step = -7 };
    int rc = ddt_checkpoint_read(dir, &f->c, params, &adam, &meta, err, sizeof err);
    snprintf(expect, sizeof expect, "%s is corrupt (expected xxh64 %s, got %s): ", tensors, want, got);
    check(rc == -EBADMSG && strstr(err, expect) && strstr(err, "earlier checkpoint") && strstr(err, "ddtreed verify"),
          "a flipped byte: rc %d, '%s', expected '%s...'", rc, err, expect);
    check(all_sentinel(params, f->total + guard_words) && all_sentinel(m, f->total + guard_words) &&
              adam.step == -7 && meta.step == -7 && meta.config_json == NULL,
          "a refused read wrote into its outputs");
    rc = ddt_checkpoint_read(dir, &f->c, params, NULL, NULL, err, sizeof err);
    check(rc == -EBADMSG && strstr(err, expect), "the weights alone: rc %d, %s", rc, err);
    check(ddt_checkpoint_verify(dir, &v) == 0 && v.state == DDT_VERDICT_CORRUPT && !strcmp(v.file, "state.safetensors"),
          "verify of a flipped byte: state %d file %s", v.state, v.file);
    snprintf(expect, sizeof expect, "corrupt: state.safetensors (expected xxh64 %s, got %s)", want, got);
    check_verdict(&v, "a flipped byte", expect);
    rc = ddt_checkpoint_export(run, 9, out, ckpt, sizeof ckpt, err, sizeof err);
    check(rc == -EBADMSG && strstr(err, tensors) && !is_dir(out), "export of a corrupt checkpoint: rc %d, %s", rc, err);
    flip_byte(tensors, -1);
    check(ddt_checkpoint_verify(dir, &v) == 0 && v.state == DDT_VERDICT_GOOD, "the byte flipped back is not good");

    /* cut short, missing, state.json unreadable */
    int64_t size = file_size(tensors);
    check(truncate(tensors, size - 8) == 0, "truncate %s", tensors);
    ddt_checkpoint_verify(dir, &v);
    snprintf(expect, sizeof expect, "corrupt: state.safetensors (expected %lld bytes, got %lld)", (long long)size,
             (long long)size - 8);
    check_verdict(&v, "a file cut short", expect);
    unlink(tensors);
    ddt_checkpoint_verify(dir, &v);
    check_verdict(&v, "a missing file", "incomplete: state.safetensors missing");
    rc = ddt_checkpoint_read(dir, &f->c, params, &adam, NULL, err, sizeof err);
    check(rc == -ENOENT && strstr(err, tensors) && strstr(err, "is missing"), "a missing file: rc %d, %s", rc, err);
    write_step(run, 9, f, "{}", 3, dir, sizeof dir, NULL);
    snprintf(expect, sizeof expect, "%s/state.json", dir);
    write_file(expect, "{\"version\": 4,");
    ddt_checkpoint_verify(dir, &v);
    check(v.state == DDT_VERDICT_CORRUPT && !strcmp(v.file, "state.json") && strstr(v.detail, "invalid JSON") &&
              !strstr(v.detail, dir),
          "an unreadable state.json: state %d, %s: %s", v.state, v.file, v.detail);
    check(ddt_checkpoint_verify(tensors, &v) == -ENOTDIR, "verify of a file is not -ENOTDIR");
    free(params);
    free(m);
    free(vv);
    fixture_free(f);
}

/* a state.json before checksums (version 3, no "files") reads, its tensors unverified (the
 * warning it logs: train_cli_test.sh); verify says so, and still refuses a tensors file that is
 * not one */
static void test_checkpoint_unverified(void)
{
    char run[512], dir[700], path[800], err[2048] = "";
    new_dir("unverified", run, sizeof run);
    fixture *f = fixture_new(103);
    write_step(run, 2, f, "{}", 3, dir, sizeof dir, NULL);
    edit_state(dir, "files", NULL);
    edit_state(dir, "version", "3");
    float *params = sentinel_floats(f->total);
    ddt_checkpoint_meta meta;
    int rc = ddt_checkpoint_read(dir, &f->c, params, NULL, &meta, err, sizeof err);
    check(rc == 0 && !memcmp(params, f->params, (size_t)f->total * sizeof(float)), "version 3: %s", err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    ddt_verdict v;
    ddt_checkpoint_verify(dir, &v);
    check_verdict(&v, "version 3", "unverified (written before checksums)");
    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    write_file(path, "not a safetensors file");
    ddt_checkpoint_verify(dir, &v);
    check(v.state == DDT_VERDICT_CORRUPT && !strcmp(v.file, "state.safetensors"),
          "an unverified checkpoint's malformed tensors: state %d %s", v.state, v.file);
    free(params);
    fixture_free(f);
}

/* ddt_checkpoint_read_newest: the newest checkpoint that verifies, the newer ones passed over
 * newest first with what is wrong; none verifying is -EBADMSG naming each, outputs untouched.
 * The next write prunes by count as before (a corrupt checkpoint counts, an incomplete one
 * neither counts nor goes). */
static void test_read_newest(void)
{
    char run[512], dir[700], path[1200], ckdir[700], err[4096] = "";
    new_dir("newest", run, sizeof run);
    fixture *fx[3] = { fixture_new(111), fixture_new(112), fixture_new(113) };
    for (int i = 0; i < 3; i++)
        write_step(run, i + 1, fx[i], "{\"n\": 1}", 5, NULL, 0, NULL);
    snprintf(ckdir, sizeof ckdir, "%s/checkpoints", run);
    snprintf(path, sizeof path, "%s/step-00000003/state.safetensors", ckdir);
    flip_byte(path, -1);   /* in the data: the file is still well formed */
    snprintf(path, sizeof path, "%s/step-00000002/state.safetensors", ckdir);
    unlink(path);

    const fixture *f = fx[0];
    float *params = sentinel_floats(f->total), *m = sentinel_floats(f->total), *v = sentinel_floats(f->total);
    ddt_adamw_state adam = { .m = m, .v = v };
    ddt_checkpoint_meta meta;
    ddt_checkpoint_passed *passed = NULL;
    int n = -1;
    int rc = ddt_checkpoint_read_newest(run, &f->c, params, &adam, &meta, dir, sizeof dir, &passed, &n, err,
                                        sizeof err);
    snprintf(path, sizeof path, "%s/step-00000001", ckdir);
    check(rc == 0 && !strcmp(dir, path) && meta.step == 1 &&
              !memcmp(params, f->params, (size_t)f->total * sizeof(float)) && adam.step == f->adam.step,
          "resumed from %s (rc %d, step %lld): %s", dir, rc, (long long)meta.step, err);
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    check(n == 2 && passed && passed[0].step == 3 && passed[0].verdict.state == DDT_VERDICT_CORRUPT &&
              !strcmp(passed[0].verdict.file, "state.safetensors") && strstr(passed[0].dir, "/step-00000003") &&
              passed[1].step == 2 && passed[1].verdict.state == DDT_VERDICT_INCOMPLETE,
          "passed over: %d", n);
    free(passed);

    /* the newest state.json that reads (a resume's config): step 3's */
    check(ddt_checkpoint_newest_meta(run, &meta, dir, sizeof dir, err, sizeof err) == 0 && meta.step == 3,
          "newest meta: %s", err);
    ddt_checkpoint_meta_free(&meta);

    /* none verifies */
    snprintf(path, sizeof path, "%s/step-00000001/state.safetensors", ckdir);
    flip_byte(path, -1);
    float *untouched = sentinel_floats(f->total);
    rc = ddt_checkpoint_read_newest(run, &f->c, untouched, NULL, NULL, dir, sizeof dir, &passed, &n, err, sizeof err);
    check(rc == -EBADMSG && n == 3 && strstr(err, run) && strstr(err, "step-00000003 corrupt: state.safetensors (expected xxh64") &&
              strstr(err, "step-00000002 incomplete: state.safetensors missing") &&
              strstr(err, "step-00000001 corrupt: state.safetensors") && strstr(err, "ddtreed verify"),
          "none verifies: rc %d, %d passed, %s", rc, n, err);
    check(all_sentinel(untouched, f->total + guard_words), "a resume that found nothing wrote into its outputs");
    free(passed);
    char empty[600];
    new_dir("newest_empty", empty, sizeof empty);
    rc = ddt_checkpoint_read_newest(empty, &f->c, untouched, NULL, NULL, dir, sizeof dir, &passed, &n, err, sizeof err);
    check(rc == -ENOENT && n == 0 && passed == NULL, "a run without checkpoints: rc %d", rc);

    /* pruning as before: keep 2 after step 4 leaves 4 and the corrupt 3, removes 1, leaves the incomplete 2 */
    write_step(run, 4, fx[1], "{\"n\": 1}", 2, NULL, 0, NULL);
    for (int step = 1; step <= 4; step++) {
        snprintf(path, sizeof path, "%s/step-%08d", ckdir, step);
        check(is_dir(path) == (step != 1), "after the write of step 4 (keep 2): step %d %s", step,
              step == 1 ? "is still there" : "was removed");
    }
    free(untouched);
    free(params);
    free(m);
    free(v);
    for (int i = 0; i < 3; i++)
        fixture_free(fx[i]);
}

/* The export's manifest lists config.json and model.safetensors as written, beside exactly those
 * two; a byte flipped in either, a missing file or a manifest that does not read is refused by
 * the readers naming the file and what to do, *params NULL, and ddt_export_verify says it;
 * without a manifest the export reads, unverified (its warning: speculate_cli_test.sh). */
static void test_export_corrupt(void)
{
    char dir[512], out[600], path[1024], err[2048] = "", want[DDT_CHECKSUM_HEX], got[DDT_CHECKSUM_HEX],
        expect[1600];
    new_dir("export_corrupt", dir, sizeof dir);
    fixture *f = fixture_new(121);
    snprintf(out, sizeof out, "%s/drafter", dir);
    check(ddt_export_write(out, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    check(count_entries(out, "") == 3, "the export holds %d files, expected 3", count_entries(out, ""));

    snprintf(path, sizeof path, "%s/%s", out, DDT_EXPORT_MANIFEST);
    char *text = ddt_read_text_file(path, 1 << 20, err, sizeof err);
    cJSON *doc = text ? cJSON_Parse(text) : NULL;
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(doc, "files");
    check(!strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(doc, "format")), "ddtree-manifest") &&
              cJSON_GetObjectItemCaseSensitive(doc, "version")->valuedouble == 1 && cJSON_GetArraySize(files) == 2,
          "the manifest is not {format ddtree-manifest, version 1, files of 2}:\n%s", text ? text : "");
    static const char *const names[] = { "config.json", "model.safetensors" };
    for (int i = 0; i < 2; i++) {
        char file[1024];
        snprintf(file, sizeof file, "%s/%s", out, names[i]);
        file_hex(out, names[i], want);
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(files, names[i]);
        check(e && cJSON_GetObjectItemCaseSensitive(e, "size")->valuedouble == (double)file_size(file) &&
                  !strcmp(string_or_empty(cJSON_GetObjectItemCaseSensitive(e, "xxh64")), want),
              "the manifest does not record %s as it is", names[i]);
    }
    cJSON_Delete(doc);
    ddt_verdict v;
    check(ddt_export_verify(out, &v) == 0, "verify of an export failed");
    check_verdict(&v, "an export as written", "good");

    ddt_drafter_config back;
    float *params = NULL, sentinel = 0;
    for (int i = 0; i < 2; i++) {   /* one byte of each file flipped */
        snprintf(path, sizeof path, "%s/%s", out, names[i]);
        file_hex(out, names[i], want);
        flip_byte(path, i == 0 ? 10 : -1);
        file_hex(out, names[i], got);
        params = &sentinel;
        int rc = ddt_export_read(out, &back, &params, err, sizeof err);
        snprintf(expect, sizeof expect, "%s is corrupt (expected xxh64 %s, got %s): ", path, want, got);
        check(rc == -EBADMSG && params == NULL && strstr(err, expect) && strstr(err, "ddtreed export"),
              "%s flipped: rc %d, '%s'", names[i], rc, err);
        rc = ddt_export_read_config(out, &back, err, sizeof err);
        check(i == 0 ? rc == -EBADMSG && strstr(err, expect) : rc == 0,
              "%s flipped, config.json read alone: rc %d, %s", names[i], rc, err);
        ddt_export_verify(out, &v);
        snprintf(expect, sizeof expect, "corrupt: %s (expected xxh64 %s, got %s)", names[i], want, got);
        check_verdict(&v, names[i], expect);
        flip_byte(path, i == 0 ? 10 : -1);
    }
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    rename(path, expect);
    ddt_export_verify(out, &v);
    check_verdict(&v, "no model.safetensors", "incomplete: model.safetensors missing");
    rename(expect, path);

    /* the manifest damaged: refused naming it */
    snprintf(path, sizeof path, "%s/%s", out, DDT_EXPORT_MANIFEST);
    static const struct { const char *text, *named; } manifests[] = {
        { "{\"format\": \"ddtree-manifest\",", "invalid JSON" },
        { "{\"format\": \"ddtree-manifest\", \"version\": 1, \"files\": {\"config.json\": {}}}", "model.safetensors" },
        { "{\"format\": \"ddtree-manifest\", \"version\": 2, \"files\": {}}", "version must be" },
        { "{\"format\": \"x\", \"version\": 1, \"files\": {}}", "format must be" },
    };
    for (size_t i = 0; i < sizeof manifests / sizeof manifests[0]; i++) {
        write_file(path, manifests[i].text);
        ddt_export_verify(out, &v);
        check(v.state == DDT_VERDICT_CORRUPT && !strcmp(v.file, DDT_EXPORT_MANIFEST) &&
                  strstr(v.detail, manifests[i].named),
              "manifest %zu: state %d, %s: %s", i, v.state, v.file, v.detail);
        params = &sentinel;
        int rc = ddt_export_read(out, &back, &params, err, sizeof err);
        check(rc == -EBADMSG && params == NULL && strstr(err, path), "read with manifest %zu: %d %s", i, rc, err);
    }
    /* a name leading out of the export is never read */
    write_file(path, "{\"format\": \"ddtree-manifest\", \"version\": 1, \"files\": {\"config.json\": "
                     "{\"size\": 1, \"xxh64\": \"0000000000000000\"}, \"model.safetensors\": {\"size\": 1, \"xxh64\": "
                     "\"0000000000000000\"}, \"../drafter/config.json\": {\"size\": 1, \"xxh64\": \"0000000000000000\"}}}");
    ddt_export_verify(out, &v);
    check(v.state == DDT_VERDICT_CORRUPT && strstr(v.detail, "is not a file name in the export"),
          "a path in the manifest: %d %s", v.state, v.detail);

    /* no manifest: unverified, read */
    unlink(path);
    ddt_export_verify(out, &v);
    check_verdict(&v, "no manifest", "unverified (written before checksums)");
    params = NULL;
    int rc = ddt_export_read(out, &back, &params, err, sizeof err);
    check(rc == 0 && params && configs_equal(&back, &f->c), "an export without a manifest: %s", err);
    free(params);
    check(ddt_export_verify(path, &v) == -ENOENT, "verify of a missing directory is not -ENOENT");
    free(text);
    fixture_free(f);
}

/* ------------------------------------------------------------------------------------------
 * DFlash2 (SPEC.md 2.1): its export and checkpoint, and what is refused
 */

/* the DFlash2 fixture's tensors as the table has them: the base kernels 3-D [2, taps, H] */
static void check_dflash2_shapes(const ddt_st_file *st, const char *prefix, ddt_dtype dtype)
{
    static const struct { const char *name; int ndim; int64_t shape[3]; } want[] = {
        { "layers.0.attention_conv.base_kernel", 3, { 2, 2, 16 } },
        { "layers.1.mlp_conv.base_kernel", 3, { 2, 2, 16 } },
        { "layers.1.attention_conv.kernel_projection.weight", 2, { 16, 16 } },   /* 2 * taps * G, H */
        { "candidate_selector.predecessor_codebook", 2, { 100, 8 } },
        { "candidate_selector.successor_codebook", 2, { 100, 8 } },
        { "candidate_selector.hidden_projection.weight", 2, { 8, 16 } },
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char name[160];
        snprintf(name, sizeof name, "%s%s", prefix, want[i].name);
        const ddt_st_tensor *t = ddt_st_find(st, name);
        int same = t && t->dtype == dtype && t->ndim == want[i].ndim;
        for (int d = 0; same && d < want[i].ndim; d++)
            same = t->shape[d] == want[i].shape[d];
        check(same, "%s: missing, or not %s [%lld, %lld%s%.0lld]", name, ddt_dtype_name(dtype),
              (long long)want[i].shape[0], (long long)want[i].shape[1], want[i].ndim == 3 ? ", " : "",
              (long long)want[i].shape[2]);
    }
}

/* The export of a DFlash2 drafter: architectures ["DFlash2DraftModel"], is_causal false, DFlash's
 * keys besides, dflash_config with block_size and the four sizes in their order; it reads back to
 * an equal configuration and, through ddt_export_read, to bf16(params) bit for bit, the base
 * kernels BF16 [2, taps, H] */
static void test_export_dflash2(void)
{
    char dir[512], out[600], path[1024], err[1024] = "";
    new_dir("export_dflash2", dir, sizeof dir);
    fixture *f = fixture_of(97, 1);
    snprintf(out, sizeof out, "%s/drafter", dir);
    check(ddt_export_write(out, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    cJSON *doc;
    const cJSON *arch = export_key(out, "architectures", &doc);
    check(cJSON_GetArraySize(arch) == 1 && !strcmp(string_or_empty(cJSON_GetArrayItem(arch, 0)), "DFlash2DraftModel"),
          "architectures is not [\"DFlash2DraftModel\"]");
    check(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(doc, "is_causal")), "is_causal is not false");
    check(cJSON_GetArraySize(doc) == 25, "config.json has %d keys, expected DFlash's 24 and is_causal",
          cJSON_GetArraySize(doc));
    check(cJSON_GetObjectItemCaseSensitive(doc, "block_size")->valuedouble == 4, "the top-level block_size is not 4");
    const cJSON *dflash = cJSON_GetObjectItemCaseSensitive(doc, "dflash_config"), *item = dflash ? dflash->child : NULL;
    static const struct { const char *key; double value; } sizes[] = {
        { "mask_token_id", 99 }, { "target_layer_ids", -1 }, { "block_size", 4 }, { "conv_kernel_size", 2 },
        { "conv_group_size", 4 }, { "selector_rank", 8 }, { "selector_top_k", 4 },
    };
    check(cJSON_GetArraySize(dflash) == 7, "dflash_config holds %d keys, expected 7", cJSON_GetArraySize(dflash));
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0] && item; i++, item = item->next)
        check(!strcmp(item->string, sizes[i].key) && (sizes[i].value < 0 || item->valuedouble == sizes[i].value),
              "dflash_config's key %zu is %s = %g, expected %s = %g", i, item->string, item->valuedouble,
              sizes[i].key, sizes[i].value);
    cJSON_Delete(doc);

    ddt_drafter_config back;
    int rc = ddt_drafter_config_load(out, &back, err, sizeof err);
    check(rc == 0 && configs_equal(&back, &f->c), "config.json loads to another configuration: %s", err);
    check_export_weights(out, f);
    snprintf(path, sizeof path, "%s/model.safetensors", out);
    ddt_st_file st;
    if (ddt_st_open(path, &st, err, sizeof err) == 0) {
        check_dflash2_shapes(&st, "", DDT_BF16);
        ddt_st_close(&st);
    }
    float *params = NULL;
    rc = ddt_export_read(out, &back, &params, err, sizeof err);
    check(rc == 0 && configs_equal(&back, &f->c), "export read: %d %s", rc, err);
    int64_t wrong = 0;
    for (int64_t j = 0; rc == 0 && j < f->total; j++) {
        const uint32_t want = (uint32_t)ddt_f32_to_bf16(f->params[j]) << 16;
        uint32_t got;
        memcpy(&got, &params[j], sizeof got);
        wrong += got != want;
    }
    check(wrong == 0, "%lld weights read back differ from bf16(params)", (long long)wrong);
    free(params);
    fixture_free(f);
}

/* dir/config.json replaced by text, and dir's manifest removed (an export as another trainer
 * writes it, read unverified) */
static void replace_config(const char *dir, const char *text)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/config.json", dir);
    write_file(path, text);
    snprintf(path, sizeof path, "%s/%s", dir, DDT_EXPORT_MANIFEST);
    check(unlink(path) == 0, "unlink %s", path);
}

/* ddt_export_read must refuse dir with rc -EINVAL and *params NULL, the error holding want */
static void check_export_refused(const char *dir, const char *want)
{
    char err[1024] = "";
    ddt_drafter_config back;
    float sentinel = 0, *params = &sentinel;
    int rc = ddt_export_read(dir, &back, &params, err, sizeof err);
    check(rc == -EINVAL && params == NULL && strstr(err, want), "%s: rc %d '%s', expected '%s'", dir, rc, err, want);
}

/* A config.json saying DFlash2DraftModel beside a DFlash drafter's tensors, a DFlash2 export
 * without one of its tensors, and a config.json of an architecture ddtree does not implement:
 * each refused naming the missing tensor or the field */
static void test_export_dflash2_refused(void)
{
    char dir[512], plain[600], second[600], bad[700], path[1024], want[1200], err[1024] = "";
    new_dir("export_dflash2_refused", dir, sizeof dir);
    fixture *f = fixture_of(101, 0), *g = fixture_of(101, 1);
    snprintf(plain, sizeof plain, "%s/dflash", dir);
    snprintf(second, sizeof second, "%s/dflash2", dir);
    check(ddt_export_write(plain, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    check(ddt_export_write(second, &g->c, g->params, err, sizeof err) == 0, "export: %s", err);
    snprintf(path, sizeof path, "%s/config.json", second);
    char *dflash2_config = ddt_read_text_file(path, 1 << 20, err, sizeof err);

    /* DFlash's tensors under a DFlash2 config.json */
    snprintf(bad, sizeof bad, "%s/relabelled", dir);
    check(ddt_export_write(bad, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
    replace_config(bad, dflash2_config ? dflash2_config : "");
    snprintf(want, sizeof want, "%s/model.safetensors: tensor 'layers.0.attention_conv.base_kernel' is missing", bad);
    check_export_refused(bad, want);

    /* one of DFlash2's own tensors left out */
    snprintf(bad, sizeof bad, "%s/dropped", dir);
    check(ddt_export_write(bad, &g->c, g->params, err, sizeof err) == 0, "export: %s", err);
    rewrite_export_tensors(second, bad, "candidate_selector.successor_codebook", NULL);
    snprintf(path, sizeof path, "%s/%s", bad, DDT_EXPORT_MANIFEST);
    check(unlink(path) == 0, "unlink %s", path);
    snprintf(want, sizeof want, "%s/model.safetensors: tensor 'candidate_selector.successor_codebook' is missing", bad);
    check_export_refused(bad, want);

    /* an architecture ddtree does not implement, and none */
    static const char *const arch[] = { "[\"Qwen3ForCausalLM\"]", NULL };
    for (int i = 0; i < 2; i++) {
        snprintf(bad, sizeof bad, "%s/arch%d", dir, i);
        check(ddt_export_write(bad, &f->c, f->params, err, sizeof err) == 0, "export: %s", err);
        cJSON *doc;
        export_key(bad, "architectures", &doc);
        cJSON_DeleteItemFromObjectCaseSensitive(doc, "architectures");
        if (arch[i])
            cJSON_AddItemToObject(doc, "architectures", cJSON_Parse(arch[i]));
        char *text = cJSON_Print(doc);
        replace_config(bad, text ? text : "");
        snprintf(want, sizeof want, "%s/config.json: architectures %s", bad, arch[i] ? "is [" : "is missing");
        check_export_refused(bad, want);
        free(text);
        cJSON_Delete(doc);
    }
    free(dflash2_config);
    fixture_free(f);
    fixture_free(g);
}

/* A DFlash2 checkpoint: every tensor in its own shape (the base kernels F32 [2, taps, H], the
 * moments too), read back bit for bit by the resume's reader (ddt_checkpoint_read_newest) with
 * state.json's drafter equal, a configuration of other taps or of DFlash refused naming the
 * tensor, the export from the checkpoint alone the direct one byte for byte; state.json's DFlash2
 * keys refused when wrong, and beside a DFlash drafter */
static void test_checkpoint_dflash2(void)
{
    char run[512], dir[700], path[1200], out[700], direct[700], err[1024] = "";
    new_dir("checkpoint_dflash2", run, sizeof run);
    fixture *g = fixture_of(103, 1);
    const char *config = "{\"name\": \"d2\"}";
    write_step(run, 9, g, config, 2, dir, sizeof dir, NULL);

    snprintf(path, sizeof path, "%s/state.safetensors", dir);
    ddt_st_file st;
    if (ddt_st_open(path, &st, err, sizeof err) == 0) {
        check_dflash2_shapes(&st, "param.", DDT_F32);
        check_dflash2_shapes(&st, "adam_v.", DDT_F32);
        ddt_st_close(&st);
    } else {
        check(0, "%s does not open: %s", path, err);
    }
    float *params = sentinel_floats(g->total), *m = sentinel_floats(g->total), *v = sentinel_floats(g->total);
    ddt_adamw_state adam = { .step = -1, .m = m, .v = v };
    ddt_checkpoint_meta meta = { .step = -1 };
    ddt_checkpoint_passed *passed = NULL;
    int n_passed = -1;
    int rc = ddt_checkpoint_read_newest(run, &g->c, params, &adam, &meta, path, sizeof path, &passed, &n_passed, err,
                                        sizeof err);
    size_t bytes = (size_t)g->total * sizeof(float);
    check(rc == 0 && n_passed == 0, "resume's read: %d %s", rc, err);
    check(rc == 0 && !memcmp(params, g->params, bytes) && !memcmp(m, g->m, bytes) && !memcmp(v, g->v, bytes) &&
              adam.step == g->adam.step, "the DFlash2 checkpoint does not read back bit for bit");
    ddt_checkpoint_meta want = fixture_meta(g, 9, config);
    check(rc == 0 && metas_equal(&meta, &want), "state.json's DFlash2 drafter reads back to another one");
    if (rc == 0)
        ddt_checkpoint_meta_free(&meta);
    free(passed);

    /* other taps, and DFlash: the tensors say which configuration they are */
    ddt_drafter_config other = g->c;
    other.conv_taps = 3;
    rc = ddt_checkpoint_read(dir, &other, params, NULL, NULL, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "tensor 'param.layers.0.attention_conv.base_kernel' has shape [2, 2, 16], "
                                       "expected [2, 3, 16]"), "a checkpoint of 2 taps read as 3: %d %s", rc, err);
    other = g->c;
    other.dflash2 = 0;
    rc = ddt_checkpoint_read(dir, &other, params, NULL, NULL, err, sizeof err);
    check(rc == -EINVAL && strstr(err, "attention_conv.base_kernel' is not a parameter of this drafter configuration"),
          "a DFlash2 checkpoint read as DFlash: %d %s", rc, err);

    snprintf(out, sizeof out, "%s/exported", run);
    snprintf(direct, sizeof direct, "%s/direct", run);
    rc = ddt_checkpoint_export(run, 9, out, path, sizeof path, err, sizeof err);
    check(rc == 0, "export of the DFlash2 checkpoint: %s", err);
    check(ddt_export_write(direct, &g->c, g->params, err, sizeof err) == 0, "export: %s", err);
    check_same_export(out, direct);

    /* state.json's DFlash2 keys, each checked */
    snprintf(path, sizeof path, "%s/state.json", dir);
    char *good = ddt_read_text_file(path, 1 << 22, err, sizeof err);
    static const struct { const char *key, *value, *named; } cases[] = {
        { "drafter.is_causal", "true", "drafter: is_causal must be false" },
        { "drafter.is_causal", NULL, "drafter: is_causal is missing" },
        { "drafter.dflash_config.selector_rank", NULL, "drafter.dflash_config: selector_rank is missing" },
        { "drafter.dflash_config.conv_kernel_size", "\"2\"", "drafter.dflash_config: conv_kernel_size must be" },
        { "drafter.dflash_config.conv_group_size", "3", "drafter: dflash_config.conv_group_size must divide" },
        { "drafter.dflash_config.block_size", "8", "drafter.dflash_config: block_size must be the top-level" },
        { "drafter.dflash_config.output_multiplier", "1", "drafter.dflash_config: output_multiplier is not" },
        { "drafter.architectures", "[\"DFlashDraftModel\"]", "drafter: is_causal is a DFlash2DraftModel's key" },
    };
    for (size_t i = 0; good && i < sizeof cases / sizeof cases[0]; i++) {
        write_file(path, good);
        edit_state(dir, cases[i].key, cases[i].value);
        check_meta_refused(dir, cases[i].named);
    }
    free(good);
    free(params);
    free(m);
    free(v);
    fixture_free(g);
}

/* A DFlash2 run saved by the trainer and resumed: the resumed trainer's export is the one it had
 * when saved, byte for byte (no step taken: the DFlash2 step is not this test's) */
static void test_resume_dflash2(void)
{
    char state[512], live[600], again[600], err[1024] = "", run_id[64];
    new_dir("resume_dflash2", state, sizeof state);
    snprintf(live, sizeof live, "%s/live", state);
    snprintf(again, sizeof again, "%s/again", state);
    ddt_trainer *t = open_trainer(state, TINY_RUN_WITH(", \"architecture\": \"dflash2\", \"conv_group_size\": 8,"
                                                       " \"selector_rank\": 8, \"selector_top_k\": 4"), NULL);
    if (!t)
        return;
    check(ddt_trainer_config(t)->drafter.dflash2 == 1, "the run config's drafter.architecture dflash2 is not read");
    check(ddt_trainer_checkpoint(t, err, sizeof err) == 0, "checkpoint: %s", err);
    check(ddt_trainer_export(t, live, err, sizeof err) == 0, "live export: %s", err);
    snprintf(run_id, sizeof run_id, "%s", ddt_trainer_run_id(t));
    ddt_trainer_close(t);
    t = open_trainer(state, "", run_id);
    if (!t)
        return;
    check(ddt_trainer_config(t)->drafter.dflash2 == 1 && ddt_trainer_step_count(t) == 0,
          "resumed as another drafter, or at step %lld", (long long)ddt_trainer_step_count(t));
    check(ddt_trainer_export(t, again, err, sizeof err) == 0, "export after the resume: %s", err);
    check_same_export(again, live);
    ddt_trainer_close(t);
}

/* ------------------------------------------------------------------------------------------ */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

int main(void)
{
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 2;
    }
    static const test_case cases[] = {
        { "checkpoint_round_trip", test_round_trip },
        { "checkpoint_keep", test_keep },
        { "checkpoint_latest", test_latest },
        { "checkpoint_read_refuses", test_read_refuses },
        { "checkpoint_same_step", test_same_step },
        { "checkpoint_errors", test_errors },
        { "export", test_export },
        { "export_without_sliding", test_export_without_sliding },
        { "export_replaces", test_export_replaces },
        { "export_read", test_export_read },
        { "state_json_refuses", test_meta_refuses },
        { "export_from_checkpoint", test_export_from_checkpoint },
        { "checksum", test_checksum },
        { "checkpoint_corrupt", test_checkpoint_corrupt },
        { "state_sealed", test_state_sealed },
        { "checkpoint_unverified", test_checkpoint_unverified },
        { "checkpoint_read_newest", test_read_newest },
        { "export_corrupt", test_export_corrupt },
        { "export_dflash2", test_export_dflash2 },
        { "export_dflash2_refused", test_export_dflash2_refused },
        { "checkpoint_dflash2", test_checkpoint_dflash2 },
        { "resume_dflash2", test_resume_dflash2 },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    nftw(root, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return cases_summary();
}
