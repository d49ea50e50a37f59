/* cmd_verify.c: `ddtreed verify DIR`: every checkpoint and export under DIR read back against the
 * checksums written beside it (docs/operations.md, "A corrupt checkpoint or export"). DIR is a
 * state directory (runs/ID/...), a run directory (checkpoints/step-*, export/), a checkpoint
 * directory (state.json) or an export directory (config.json, ddtree-manifest.json). One line
 * per checkpoint or export, its path and what record/checkpoint.h's ddt_checkpoint_verify or
 * export.h's ddt_export_verify found:
 *   PATH: good
 *   PATH: unverified (written before checksums)
 *   PATH: incomplete: FILE missing
 *   PATH: corrupt: FILE (expected xxh64 X, got Y)
 * Exit status 0 when every one is good or unverified, 1 when one is incomplete or corrupt (or a
 * directory cannot be read), 2 for a command line that is not understood or a DIR that is none of
 * those. Checkpoint temporaries (.tmp-*) are not looked at; a checkpoint pruned while this runs is
 * left out, not reported missing.
 * Tested by tests/daemon/train_cli_test.sh.
 */
#include "commands.h"
#include "record/dir_kind.h"
#include "record/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define VERIFY_USAGE                                                                                 \
    "usage: ddtreed verify DIR\n"                                                                    \
    "  DIR: a state directory (runs/), a run directory (checkpoints/, export/), a checkpoint\n"     \
    "  (state.json) or an export (config.json); exit 0 all good, 1 one corrupt or incomplete\n"

enum { VERIFY_PATH_MAX = 4096 };

typedef struct verify_tally {
    int checked, bad;   /* checkpoints and exports said; of those, incomplete or corrupt */
} verify_tally;

static int is_dir(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* one line: the path and the verdict */
static void say(verify_tally *t, const char *path, const ddt_verdict *v)
{
    char text[1024];
    ddt_verdict_text(v, text, sizeof text);
    printf("%s: %s\n", path, text);
    t->checked++;
    t->bad += v->state == DDT_VERDICT_INCOMPLETE || v->state == DDT_VERDICT_CORRUPT;
}

static void verify_checkpoint(verify_tally *t, const char *dir)
{
    ddt_verdict v;
    if (ddt_checkpoint_verify(dir, &v) == 0)   /* else pruned meanwhile: nothing to say */
        say(t, dir, &v);
}

static void verify_export(verify_tally *t, const char *dir)
{
    ddt_verdict v;
    if (ddt_export_verify(dir, &v) == 0)
        say(t, dir, &v);
}

/* a run's checkpoints, oldest first, then its export: 0, or 1 when they cannot be listed */
static int verify_run(verify_tally *t, const char *run)
{
    char path[VERIFY_PATH_MAX];
    ddt_checkpoint_dir *dirs;
    int count, rc = ddt_checkpoint_dirs(run, &dirs, &count);
    if (rc != 0 && rc != -ENOENT) {
        fprintf(stderr, "ddtreed verify: %s/checkpoints: cannot be listed: %s\n", run, strerror(-rc));
        return 1;
    }
    for (int i = count - 1; i >= 0; i--)
        if (snprintf(path, sizeof path, "%s/checkpoints/%s", run, dirs[i].name) < (int)sizeof path)
            verify_checkpoint(t, path);
    free(dirs);
    if (snprintf(path, sizeof path, "%s/export", run) < (int)sizeof path && is_dir(path))
        verify_export(t, path);
    return 0;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* every run of a state directory, by name: 0, or 1 when runs/ cannot be read */
static int verify_state(verify_tally *t, const char *state)
{
    char runs[VERIFY_PATH_MAX], path[VERIFY_PATH_MAX];
    snprintf(runs, sizeof runs, "%s/runs", state);
    DIR *d = opendir(runs);
    if (!d) {
        fprintf(stderr, "ddtreed verify: %s: cannot be read: %s\n", runs, strerror(errno));
        return 1;
    }
    char **names = NULL;
    size_t count = 0, cap = 0;
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        if (count == cap) {
            cap = cap ? 2 * cap : 16;
            char **grown = realloc(names, cap * sizeof *names);
            if (!grown) {
                rc = 1;
                break;
            }
            names = grown;
        }
        if (!(names[count] = strdup(e->d_name)))
            rc = 1;
        else
            count++;
    }
    closedir(d);
    if (rc)
        fprintf(stderr, "ddtreed verify: %s: out of memory\n", runs);
    if (count > 1)
        qsort(names, count, sizeof *names, by_name);
    for (size_t i = 0; i < count; i++) {
        if (!rc && snprintf(path, sizeof path, "%s/%s", runs, names[i]) < (int)sizeof path && is_dir(path))
            rc = verify_run(t, path);
        free(names[i]);
    }
    free(names);
    return rc;
}

int ddt_cmd_verify(int argc, char **argv)
{
    if (argc == 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(VERIFY_USAGE, stdout);
        return 0;
    }
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "ddtreed verify: %s\n" VERIFY_USAGE,
                argc < 2 ? "DIR is required" : argc > 2 ? "one DIR only" : "DIR is not an option");
        return 2;
    }
    char dir[VERIFY_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", argv[1]);
    for (size_t len = strlen(dir); len > 1 && dir[len - 1] == '/';)   /* "dir/" names dir */
        dir[--len] = '\0';
    struct stat st;
    const char *wrong = stat(dir, &st) != 0 ? (errno == ENOENT ? "no such directory" : strerror(errno))
                        : !S_ISDIR(st.st_mode) ? "not a directory" : NULL;
    if (wrong) {
        fprintf(stderr, "ddtreed verify: %s: %s\n" VERIFY_USAGE, dir, wrong);
        return 2;
    }
    verify_tally t = { 0 };
    int rc = 0;
    ddt_dir_kind kind = ddt_dir_kind_of(dir);
    if (kind == DDT_DIR_CHECKPOINT)
        verify_checkpoint(&t, dir);
    else if (kind == DDT_DIR_EXPORT)
        verify_export(&t, dir);
    else if (kind == DDT_DIR_RUN)
        rc = verify_run(&t, dir);
    else if (kind == DDT_DIR_STATE)
        rc = verify_state(&t, dir);
    else {
        fprintf(stderr, "ddtreed verify: %s is %s: name a state directory (with runs/), a run directory "
                "(checkpoints/, export/), a checkpoint (state.json) or an export (config.json)\n", dir,
                ddt_dir_kind_name(kind));
        return 2;
    }
    if (t.checked == 0 && rc == 0)
        printf("%s: no checkpoint or export to verify\n", dir);
    return rc || t.bad ? 1 : 0;
}
