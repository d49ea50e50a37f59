/* checkpoint.c: resumable checkpoints and the serving export (SPEC.md section 5; see
 * checkpoint.h).
 *
 * Both are directories built under a temporary name next to their final place: every file
 * written and fsynced, the directory fsynced, renamed into place, the parent fsynced. A crash
 * therefore leaves the whole directory or none of it. A directory already in place (same
 * checkpoint step, or an earlier export) is renamed aside, the new one renamed in, the parent
 * fsynced, and only then the old one removed. Checkpoint temporaries are named ".tmp-*" inside
 * RUN_DIR/checkpoints/: ddt_checkpoint_latest skips them and the next write removes them.
 *
 * Not here: several writers on one run directory (one trainer owns it), what state.json holds
 * (the trainer's, opaque text), sharded or compressed exports (a drafter is a few GB at most),
 * removing an export's temporaries left by a crash (they sit next to a directory the user
 * named, so nothing there is deleted by pattern).
 * Tested by tests/test_checkpoint.c.
 *
 * Legend: P floats in all parameters (the table's total), n entries of the parameter table.
 */
#include "errors.h"
#include "checkpoint.h"
#include "model_config.h"
#include "safetensors.h"

#include <cjson/cJSON.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { CKPT_PATH_MAX = 4096, CKPT_NAME_MAX = 96 };
/* state.json is the trainer's state (config, cursor, RNG): kilobytes; the cap only stops a
 * corrupted file from being read whole. */
#define CKPT_STATE_JSON_MAX (64u << 20)

static const char *const state_prefix[3] = { "param.", "adam_m.", "adam_v." };
static const char step_tensor[] = "adam_step";
static const char checkpoint_format[] = "ddtree-checkpoint", checkpoint_version[] = "1";

/* ------------------------------------------------------------------------------------------
 * Errors, paths and files
 */

__attribute__((format(printf, 4, 5)))
static int fail(char *err, size_t err_len, int rc, const char *fmt, ...)
{
    if (err && err_len > 0) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, err_len, fmt, args);
        va_end(args);
    }
    return rc;
}

/* out = the formatted path: 0, or -ENAMETOOLONG */
__attribute__((format(printf, 3, 4)))
static int path_join(char *out, size_t len, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(out, len, fmt, args);
    va_end(args);
    return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* path created (it must not exist) with text, fsynced: 0, or -errno with nothing left */
static int write_text_file(const char *path, const char *text, char *err, size_t err_len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0)
        return fail(err, err_len, -errno, "%s: cannot create: %s", path, strerror(errno));
    size_t len = strlen(text), done = 0;
    int rc = 0;
    while (rc == 0 && done < len) {
        ssize_t n = write(fd, text + done, len - done);
        if (n < 0 && errno != EINTR)
            rc = -errno;
        else if (n > 0)
            done += (size_t)n;
    }
    const char *failed = rc ? "write" : NULL;
    if (!failed && fsync(fd) != 0) {
        rc = -errno;
        failed = "fsync";
    }
    if (close(fd) != 0 && !failed) {
        rc = -errno;
        failed = "close";
    }
    if (failed) {
        unlink(path);
        return fail(err, err_len, rc, "%s: cannot %s: %s", path, failed, strerror(-rc));
    }
    return 0;
}

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path) != 0 ? -1 : 0;
}

/* path and everything under it (symbolic links removed, never followed); a missing path is
 * not an error. 0, or -errno. */
static int remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return errno == ENOENT ? 0 : -errno;
    return nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0 ? -(errno ? errno : EIO) : 0;
}

/* The directory built at tmp becomes final: one already there is renamed to aside, tmp renamed
 * in, parent fsynced, then the old one removed. On failure the old one is back in place and
 * the new one is at tmp again (the caller removes it). */
static int install_dir(const char *tmp, const char *final, const char *aside, const char *parent,
                       char *err, size_t err_len)
{
    struct stat st;
    int replacing = lstat(final, &st) == 0;
    if (!replacing && errno != ENOENT)
        return fail(err, err_len, -errno, "%s: cannot stat: %s", final, strerror(errno));
    if (replacing && !S_ISDIR(st.st_mode))
        return fail(err, err_len, -ENOTDIR, "%s: exists and is not a directory (not replaced)", final);
    if (replacing) {
        int rc = remove_tree(aside);   /* a leftover of a crash with our name */
        if (rc == 0 && rename(final, aside) != 0)
            rc = -errno;
        if (rc != 0)
            return fail(err, err_len, rc, "%s: cannot move the old one aside to %s: %s", final, aside,
                        strerror(-rc));
    }
    if (rename(tmp, final) != 0) {
        int rc = -errno;
        if (replacing)
            rename(aside, final);
        return fail(err, err_len, rc, "%s: cannot rename %s into place: %s", final, tmp, strerror(-rc));
    }
    int rc = ddt_fsync_dir(parent);
    if (rc != 0) {   /* the rename may not survive a crash: undo it rather than report a maybe */
        rename(final, tmp);
        if (replacing)
            rename(aside, final);
        return fail(err, err_len, rc, "%s: fsync of %s failed: %s", final, parent, strerror(-rc));
    }
    if (replacing)
        remove_tree(aside);   /* best effort: a checkpoint's aside is a .tmp-* the next write removes */
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * Step directories: "step-" and at least 8 digits
 */

typedef struct step_dir {
    int64_t step;
    char name[CKPT_NAME_MAX];
} step_dir;

static int parse_step_name(const char *name, int64_t *step)
{
    if (strncmp(name, "step-", 5) != 0)
        return 0;
    const char *digits = name + 5;
    size_t len = strlen(digits);
    if (len < 8 || len > 18 || strspn(digits, "0123456789") != len)
        return 0;
    *step = strtoll(digits, NULL, 10);
    return 1;
}

static int step_dir_newer_first(const void *a, const void *b)
{
    const step_dir *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : strcmp(x->name, y->name);
}

/* The step-* entries of ckdir, newest first (*dirs malloc'd, NULL when none): 0 or -errno */
static int list_steps(const char *ckdir, step_dir **dirs, int *count)
{
    *dirs = NULL;
    *count = 0;
    DIR *d = opendir(ckdir);
    if (!d)
        return -errno;
    int cap = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step;
        if (!parse_step_name(e->d_name, &step) || strlen(e->d_name) >= CKPT_NAME_MAX)
            continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            step_dir *grown = realloc(*dirs, (size_t)cap * sizeof **dirs);
            if (!grown) {
                rc = -ENOMEM;
                break;
            }
            *dirs = grown;
        }
        (*dirs)[*count].step = step;
        snprintf((*dirs)[*count].name, CKPT_NAME_MAX, "%s", e->d_name);
        (*count)++;
    }
    closedir(d);
    if (rc != 0) {
        free(*dirs);
        *dirs = NULL;
        *count = 0;
        return rc;
    }
    if (*count > 1)
        qsort(*dirs, (size_t)*count, sizeof **dirs, step_dir_newer_first);
    return 0;
}

/* Both files present and state.safetensors opens (every rule of the format holds). */
static int checkpoint_complete(const char *dir)
{
    char path[CKPT_PATH_MAX], why[512];
    struct stat st;
    if (path_join(path, sizeof path, "%s/state.json", dir) || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    ddt_st_file f;
    if (path_join(path, sizeof path, "%s/state.safetensors", dir) || ddt_st_open(path, &f, why, sizeof why))
        return 0;
    ddt_st_close(&f);
    return 1;
}

/* Removes complete checkpoints beyond the newest `keep`, never `written` (best effort: the
 * new checkpoint is in place, and the next write tries again). Incomplete step-* directories
 * cannot come from this writer; they are left alone and do not count. */
static void prune_checkpoints(const char *ckdir, int keep, const char *written)
{
    step_dir *dirs;
    int count;
    if (list_steps(ckdir, &dirs, &count) != 0)
        return;
    int kept = 0;
    for (int i = 0; i < count; i++) {
        char dir[CKPT_PATH_MAX];
        if (path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name))
            continue;
        int is_written = strcmp(dirs[i].name, written) == 0;
        if (!is_written && !checkpoint_complete(dir))
            continue;
        if (kept < keep || is_written)
            kept++;
        else
            remove_tree(dir);
    }
    free(dirs);
}

/* Removes the ".tmp-*" entries of ckdir: what a crashed write left (best effort). */
static void remove_stale_temporaries(const char *ckdir)
{
    DIR *d = opendir(ckdir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char path[CKPT_PATH_MAX];
        if (strncmp(e->d_name, ".tmp-", 5) == 0 && !path_join(path, sizeof path, "%s/%s", ckdir, e->d_name))
            remove_tree(path);   /* readdir tolerates entries removed while it runs */
    }
    closedir(d);
}

/* ------------------------------------------------------------------------------------------
 * state.safetensors
 */

/* The table of c (malloc'd, DDT_MAX_PARAMS rows): its count, or -1 when out of memory */
static int param_table(const ddt_drafter_config *c, ddt_param **table, int64_t *total)
{
    *table = malloc(DDT_MAX_PARAMS * sizeof **table);
    return *table ? ddt_drafter_param_table(c, *table, total) : -1;
}

static int write_state(const char *tmp, const ddt_drafter_config *c, const float *params,
                       const ddt_adamw_state *adam, const char *state_json, char *err, size_t err_len)
{
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
    ddt_st_entry *entries = n >= 0 ? calloc(3 * (size_t)n + 1, sizeof *entries) : NULL;
    char (*names)[CKPT_NAME_MAX] = n >= 0 ? calloc(3 * (size_t)n, sizeof *names) : NULL;
    int rc = 0;
    if (!entries || !names) {
        rc = fail(err, err_len, -ENOMEM, "%s: out of memory for the tensor list", tmp);
        goto done;
    }
    const float *family[3] = { params, adam->m, adam->v };   /* (P) each */
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) {
            ddt_st_entry *e = &entries[k * n + i];
            snprintf(names[k * n + i], CKPT_NAME_MAX, "%s%s", state_prefix[k], table[i].name);
            e->name = names[k * n + i];
            e->dtype = DDT_F32;
            e->ndim = table[i].ndim;
            e->shape[0] = table[i].shape[0];
            e->shape[1] = table[i].shape[1];
            e->data = family[k] + table[i].offset;
        }
    entries[3 * n] = (ddt_st_entry){ .name = step_tensor, .dtype = DDT_I64, .ndim = 0, .data = &adam->step };
    const char *const keys[] = { "format", "version" };
    const char *const values[] = { checkpoint_format, checkpoint_version };
    char path[CKPT_PATH_MAX];
    rc = path_join(path, sizeof path, "%s/state.safetensors", tmp);
    if (rc == 0)
        rc = ddt_st_write(path, entries, 3 * n + 1, keys, values, 2, err, err_len);
    if (rc == 0 && !(rc = path_join(path, sizeof path, "%s/state.json", tmp)))
        rc = write_text_file(path, state_json, err, err_len);
    if (rc == -ENAMETOOLONG)
        fail(err, err_len, rc, "%s: path too long", tmp);
done:
    free(names);
    free(entries);
    free(table);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Checkpoints
 */

int ddt_checkpoint_write(const char *run_dir, int64_t step, const ddt_drafter_config *c,
                         const float *params, const ddt_adamw_state *adam, const char *state_json,
                         int keep, char *path_out, size_t path_len, int64_t *bytes_out,
                         char *err, size_t err_len)
{
    if (path_out && path_len > 0)
        path_out[0] = '\0';
    if (bytes_out)
        *bytes_out = 0;
    if (!run_dir || !c || !params || !adam || !adam->m || !adam->v || !state_json)
        return fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    if (step < 0 || keep < 1)
        return fail(err, err_len, -EINVAL, "checkpoint: step must be >= 0 and keep >= 1 (got %lld, %d)",
                    (long long)step, keep);
    char why[512];
    if (ddt_drafter_config_check(c, why, sizeof why))
        return fail(err, err_len, -EINVAL, "checkpoint: %s", why);
    struct stat st;
    if (stat(run_dir, &st) != 0)
        return fail(err, err_len, -errno, "%s: run directory: %s", run_dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return fail(err, err_len, -ENOTDIR, "%s: run directory is not a directory", run_dir);

    char ckdir[CKPT_PATH_MAX], final[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], aside[CKPT_PATH_MAX],
        longest[CKPT_PATH_MAX];
    long pid = (long)getpid();
    if (path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir) ||
        path_join(final, sizeof final, "%s/step-%08lld", ckdir, (long long)step) ||
        path_join(tmp, sizeof tmp, "%s/.tmp-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        path_join(aside, sizeof aside, "%s/.tmp-replaced-step-%08lld-%ld", ckdir, (long long)step, pid) ||
        path_join(longest, sizeof longest, "%s/state.safetensors.tmp", tmp))
        return fail(err, err_len, -ENAMETOOLONG, "%s: path too long for a checkpoint", run_dir);
    if (path_out && strlen(final) >= path_len)
        return fail(err, err_len, -ENAMETOOLONG, "%s: longer than path_out (%zu bytes)", final, path_len);

    if (mkdir(ckdir, 0755) == 0) {
        int rc = ddt_fsync_dir(run_dir);
        if (rc != 0)
            return fail(err, err_len, rc, "%s: fsync after creating checkpoints/: %s", run_dir, strerror(-rc));
    } else if (errno != EEXIST) {
        return fail(err, err_len, -errno, "%s: cannot create: %s", ckdir, strerror(errno));
    } else if (stat(ckdir, &st) != 0 || !S_ISDIR(st.st_mode)) {
        return fail(err, err_len, -ENOTDIR, "%s: exists and is not a directory", ckdir);
    }
    remove_stale_temporaries(ckdir);

    if (mkdir(tmp, 0755) != 0)
        return fail(err, err_len, -errno, "%s: cannot create: %s", tmp, strerror(errno));
    int rc = write_state(tmp, c, params, adam, state_json, err, err_len);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = install_dir(tmp, final, aside, ckdir, err, err_len);
    if (rc != 0) {
        remove_tree(tmp);
        return rc;
    }

    int64_t bytes = 0;
    static const char *const files[] = { "state.safetensors", "state.json" };
    for (int i = 0; i < 2; i++) {
        char path[CKPT_PATH_MAX];
        if (!path_join(path, sizeof path, "%s/%s", final, files[i]) && stat(path, &st) == 0)
            bytes += (int64_t)st.st_size;
    }
    prune_checkpoints(ckdir, keep, strrchr(final, '/') + 1);
    if (path_out)
        snprintf(path_out, path_len, "%s", final);
    if (bytes_out)
        *bytes_out = bytes;
    return 0;
}

int ddt_checkpoint_latest(const char *run_dir, int64_t *step, char *path, size_t path_len)
{
    char ckdir[CKPT_PATH_MAX];
    if (!run_dir)
        return -EINVAL;
    if (path_join(ckdir, sizeof ckdir, "%s/checkpoints", run_dir))
        return -ENAMETOOLONG;
    step_dir *dirs;
    int count, rc = list_steps(ckdir, &dirs, &count);
    if (rc != 0)
        return rc;   /* -ENOENT when there is no checkpoints/ yet */
    rc = -ENOENT;
    for (int i = 0; i < count && rc == -ENOENT; i++) {
        char dir[CKPT_PATH_MAX];
        if (path_join(dir, sizeof dir, "%s/%s", ckdir, dirs[i].name) || !checkpoint_complete(dir))
            continue;
        if (path && path_join(path, path_len, "%s", dir)) {
            rc = -ENAMETOOLONG;
            break;
        }
        if (step)
            *step = dirs[i].step;
        rc = 0;
    }
    free(dirs);
    return rc;
}

static void shape_text(char *out, size_t len, int ndim, const int64_t *shape)
{
    size_t at = (size_t)snprintf(out, len, "[");
    for (int d = 0; d < ndim && at < len; d++)
        at += (size_t)snprintf(out + at, len - at, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (at < len)
        snprintf(out + at, len - at, "]");
}

/* Whether the file's tensor `name` is one a checkpoint of this table holds. */
static int expected_name(const char *name, const ddt_param *table, int n)
{
    if (!strcmp(name, step_tensor))
        return 1;
    for (int k = 0; k < 3; k++) {
        size_t plen = strlen(state_prefix[k]);
        if (strncmp(name, state_prefix[k], plen) != 0)
            continue;
        for (int i = 0; i < n; i++)
            if (!strcmp(name + plen, table[i].name))
                return 1;
    }
    return 0;
}

/* Every tensor the table of c wants, present as F32 of its shape, adam_step as I64 0-d, and no
 * other: 0, or -EINVAL naming the file and the first tensor that does not match. */
static int check_state(const ddt_st_file *f, const ddt_param *table, int n, char *err, size_t err_len)
{
    const char *format = ddt_st_metadata(f, "format"), *version = ddt_st_metadata(f, "version");
    if (!format || strcmp(format, checkpoint_format) || !version || strcmp(version, checkpoint_version))
        return fail(err, err_len, -EINVAL, "%s: __metadata__ format/version is '%s'/'%s', expected '%s'/'%s'",
                    f->path, format ? format : "(none)", version ? version : "(none)", checkpoint_format,
                    checkpoint_version);
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < n; i++) {
            char name[CKPT_NAME_MAX], got[128], want[128];
            snprintf(name, sizeof name, "%s%s", state_prefix[k], table[i].name);
            const ddt_st_tensor *t = ddt_st_find(f, name);
            if (!t)
                return fail(err, err_len, -EINVAL, "%s: tensor '%s' is missing", f->path, name);
            if (t->dtype != DDT_F32)
                return fail(err, err_len, -EINVAL, "%s: tensor '%s' is %s, expected F32", f->path, name,
                            ddt_dtype_name(t->dtype));
            if (t->ndim != table[i].ndim || t->shape[0] != table[i].shape[0] ||
                (t->ndim == 2 && t->shape[1] != table[i].shape[1])) {
                shape_text(got, sizeof got, t->ndim, t->shape);
                shape_text(want, sizeof want, table[i].ndim, table[i].shape);
                return fail(err, err_len, -EINVAL,
                            "%s: tensor '%s' has shape %s, expected %s (a checkpoint of another drafter configuration?)",
                            f->path, name, got, want);
            }
        }
    const ddt_st_tensor *s = ddt_st_find(f, step_tensor);
    if (!s)
        return fail(err, err_len, -EINVAL, "%s: tensor '%s' is missing", f->path, step_tensor);
    int64_t step = -1;
    if (s->dtype == DDT_I64 && s->ndim == 0)
        memcpy(&step, s->data, sizeof step);
    if (step < 0)
        return fail(err, err_len, -EINVAL, "%s: tensor '%s' must be an I64 scalar >= 0", f->path, step_tensor);
    for (int j = 0; f->count != 3 * n + 1 && j < f->count; j++)
        if (!expected_name(f->tensors[j].name, table, n))
            return fail(err, err_len, -EINVAL,
                        "%s: tensor '%s' is not a parameter of this drafter configuration", f->path,
                        f->tensors[j].name);
    return 0;
}

int ddt_checkpoint_read(const char *ckpt_dir, const ddt_drafter_config *c, float *params,
                        ddt_adamw_state *adam, char **state_json, char *err, size_t err_len)
{
    if (state_json)
        *state_json = NULL;
    if (!ckpt_dir || !c || !params || !adam || !adam->m || !adam->v)
        return fail(err, err_len, -EINVAL, "checkpoint: a required argument is NULL");
    char why[512], path[CKPT_PATH_MAX];
    if (ddt_drafter_config_check(c, why, sizeof why))
        return fail(err, err_len, -EINVAL, "%s: the drafter configuration: %s", ckpt_dir, why);
    if (path_join(path, sizeof path, "%s/state.safetensors", ckpt_dir))
        return fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
    ddt_st_file f;
    int rc = ddt_st_open(path, &f, err, err_len);
    if (rc != 0)
        return rc;
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
    char *text = NULL;
    if (n < 0)
        rc = fail(err, err_len, -ENOMEM, "%s: out of memory", path);
    if (rc == 0)
        rc = check_state(&f, table, n, err, err_len);
    if (rc == 0 && state_json) {   /* before any output is written: a failure leaves them as they were */
        if (path_join(path, sizeof path, "%s/state.json", ckpt_dir))
            rc = fail(err, err_len, -ENAMETOOLONG, "%s: path too long", ckpt_dir);
        else if (!(text = ddt_read_text_file(path, CKPT_STATE_JSON_MAX, err, err_len)))
            rc = -EINVAL;
    }
    if (rc == 0) {
        float *family[3] = { params, adam->m, adam->v };   /* (P) each */
        for (int k = 0; k < 3; k++)
            for (int i = 0; i < n; i++) {
                char name[CKPT_NAME_MAX];
                snprintf(name, sizeof name, "%s%s", state_prefix[k], table[i].name);
                const ddt_st_tensor *t = ddt_st_find(&f, name);
                memcpy(family[k] + table[i].offset, t->data, (size_t)table[i].numel * sizeof(float));
            }
        memcpy(&adam->step, ddt_st_find(&f, step_tensor)->data, sizeof adam->step);
        if (state_json)
            *state_json = text;
    }
    free(table);
    ddt_st_close(&f);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * The serving export
 */

/* The shortest decimal that reads back as x, as the double a JSON reader gets from it (cJSON
 * prints that double with those digits): rms_norm_eps 1e-6f is written 1e-06, not
 * 9.9999999747524271e-07, and (float) of what is read back is x again. */
static double float_for_json(float x)
{
    char text[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(text, sizeof text, "%.*g", digits, (double)x);
        double back = strtod(text, NULL);
        if ((float)back == x)
            return back;
    }
    return (double)x;   /* not reached: 9 significant digits always identify a float */
}

/* config.json of the export (SPEC.md section 5): malloc'd text, NULL when out of memory */
static char *export_config_text(const ddt_drafter_config *c)
{
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    cJSON *arch = ok ? cJSON_AddArrayToObject(root, "architectures") : NULL;
    ok = ok && arch && cJSON_AddItemToArray(arch, cJSON_CreateString("DFlashDraftModel"));
    ok = ok && cJSON_AddStringToObject(root, "model_type", "qwen3");
    const struct {
        const char *key;
        int64_t value;
    } sizes[] = {
        { "hidden_size", c->hidden },         { "num_hidden_layers", c->layers },
        { "num_attention_heads", c->heads },  { "num_key_value_heads", c->kv_heads },
        { "head_dim", c->head_dim },          { "intermediate_size", c->intermediate },
    };
    for (size_t i = 0; ok && i < sizeof sizes / sizeof sizes[0]; i++)
        ok = cJSON_AddNumberToObject(root, sizes[i].key, (double)sizes[i].value) != NULL;
    ok = ok && cJSON_AddNumberToObject(root, "rms_norm_eps", float_for_json(c->rms_norm_eps));
    ok = ok && cJSON_AddNumberToObject(root, "rope_theta", float_for_json(c->rope_theta));
    cJSON *types = ok ? cJSON_AddArrayToObject(root, "layer_types") : NULL;
    ok = ok && types;
    for (int64_t i = 0; ok && i < c->layers; i++)
        ok = cJSON_AddItemToArray(types, cJSON_CreateString(c->sliding[i] ? "sliding_attention" : "full_attention"));
    ok = ok && cJSON_AddNumberToObject(root, "sliding_window", (double)c->sliding_window);
    ok = ok && cJSON_AddNumberToObject(root, "block_size", (double)c->block_size);
    ok = ok && cJSON_AddNumberToObject(root, "num_target_layers", (double)c->num_target_layers);
    cJSON *dflash = ok ? cJSON_AddObjectToObject(root, "dflash_config") : NULL;
    ok = ok && dflash && cJSON_AddNumberToObject(dflash, "mask_token_id", (double)c->mask_token_id);
    cJSON *ids = ok ? cJSON_AddArrayToObject(dflash, "target_layer_ids") : NULL;
    ok = ok && ids;
    for (int64_t i = 0; ok && i < c->taps; i++)
        ok = cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)c->target_layer_ids[i]));
    ok = ok && cJSON_AddNullToObject(root, "rope_scaling");
    ok = ok && cJSON_AddFalseToObject(root, "tie_word_embeddings");
    ok = ok && cJSON_AddFalseToObject(root, "attention_bias");
    ok = ok && cJSON_AddStringToObject(root, "hidden_act", "silu");
    ok = ok && cJSON_AddNumberToObject(root, "vocab_size", (double)c->vocab);
    char *printed = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!printed)
        return NULL;
    size_t len = strlen(printed);
    char *text = malloc(len + 2);   /* with the final newline a text file ends with */
    if (text) {
        memcpy(text, printed, len);
        memcpy(text + len, "\n", 2);
    }
    cJSON_free(printed);
    return text;
}

/* config.json and model.safetensors (BF16, the table's names, format pt) into dir */
static int write_export_files(const char *dir, const ddt_drafter_config *c, const float *params,
                              char *err, size_t err_len)
{
    char path[CKPT_PATH_MAX];
    char *config = export_config_text(c);
    ddt_param *table;
    int64_t total;
    int n = param_table(c, &table, &total);
    uint16_t *weights = n >= 0 ? malloc((size_t)total * sizeof *weights) : NULL;   /* (P) BF16 */
    ddt_st_entry *entries = n >= 0 ? calloc((size_t)n, sizeof *entries) : NULL;
    int rc = 0;
    if (!config || !weights || !entries)
        rc = fail(err, err_len, -ENOMEM, "%s: out of memory for the export", dir);
    if (rc == 0 && !(rc = path_join(path, sizeof path, "%s/config.json", dir)))
        rc = write_text_file(path, config, err, err_len);
    if (rc == 0) {
        for (int64_t j = 0; j < total; j++)
            weights[j] = ddt_f32_to_bf16(params[j]);
        for (int i = 0; i < n; i++)
            entries[i] = (ddt_st_entry){ .name = table[i].name, .dtype = DDT_BF16, .ndim = table[i].ndim,
                                         .shape = { table[i].shape[0], table[i].shape[1] },
                                         .data = weights + table[i].offset };
        const char *const key[] = { "format" }, *const value[] = { "pt" };
        if (!(rc = path_join(path, sizeof path, "%s/model.safetensors", dir)))
            rc = ddt_st_write(path, entries, n, key, value, 1, err, err_len);
    }
    if (rc == -ENAMETOOLONG)
        fail(err, err_len, rc, "%s: path too long", dir);
    free(entries);
    free(weights);
    free(table);
    free(config);
    return rc;
}

int ddt_export_write(const char *out_dir, const ddt_drafter_config *c, const float *params,
                     char *err, size_t err_len)
{
    if (!out_dir || !out_dir[0] || !c || !params)
        return fail(err, err_len, -EINVAL, "export: a required argument is NULL or empty");
    char why[512];
    if (ddt_drafter_config_check(c, why, sizeof why))
        return fail(err, err_len, -EINVAL, "%s: the drafter configuration: %s", out_dir, why);
    char out[CKPT_PATH_MAX], parent[CKPT_PATH_MAX], tmp[CKPT_PATH_MAX], aside[CKPT_PATH_MAX],
        longest[CKPT_PATH_MAX];
    long pid = (long)getpid();
    int too_long = path_join(out, sizeof out, "%s", out_dir);
    size_t len = strlen(out);
    while (len > 1 && out[len - 1] == '/')   /* "dir/" names dir: its siblings are "dir.tmp-*" */
        out[--len] = '\0';
    if (too_long || path_join(tmp, sizeof tmp, "%s.tmp-%ld", out, pid) ||
        path_join(aside, sizeof aside, "%s.old-%ld", out, pid) ||
        path_join(longest, sizeof longest, "%s/model.safetensors.tmp", tmp))
        return fail(err, err_len, -ENAMETOOLONG, "%s: path too long for an export", out_dir);
    const char *slash = strrchr(out, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        snprintf(parent, sizeof parent, "%.*s", slash == out ? 1 : (int)(slash - out), out);
    struct stat st;
    if (stat(parent, &st) != 0 || !S_ISDIR(st.st_mode))
        return fail(err, err_len, -ENOENT, "%s: the directory it goes in (%s) does not exist", out_dir, parent);

    int rc = remove_tree(tmp);   /* a leftover of a crash with our name */
    if (rc == 0 && mkdir(tmp, 0755) != 0)
        rc = -errno;
    if (rc != 0)
        return fail(err, err_len, rc, "%s: cannot create: %s", tmp, strerror(-rc));
    rc = write_export_files(tmp, c, params, err, err_len);
    if (rc == 0 && (rc = ddt_fsync_dir(tmp)) != 0)
        fail(err, err_len, rc, "%s: fsync: %s", tmp, strerror(-rc));
    if (rc == 0)
        rc = install_dir(tmp, out, aside, parent, err, err_len);
    if (rc != 0)
        remove_tree(tmp);
    return rc;
}
