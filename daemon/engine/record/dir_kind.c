/* dir_kind.c: what a directory is, by its files (dir_kind.h). */
#include "dir_kind.h"
#include "export.h"
#include "base/read_file.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* whether DIR/name exists */
static int has(const char *dir, const char *name)
{
    char path[4200];
    struct stat st;
    return snprintf(path, sizeof path, "%s/%s", dir, name) < (int)sizeof path && stat(path, &st) == 0;
}

/* DIR/config.json is a drafter's (it has a dflash_config), not a target's */
static int drafter_config(const char *dir)
{
    char path[4200], err[256];
    snprintf(path, sizeof path, "%s/config.json", dir);
    char *text = ddt_read_text_file(path, 1 << 20, err, sizeof err);
    int yes = text && strstr(text, "\"dflash_config\"") != NULL;
    free(text);
    return yes;
}

ddt_dir_kind ddt_dir_kind_of(const char *dir)
{
    struct stat st;
    if (!dir || stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return DDT_DIR_MISSING;
    if (has(dir, "state.json") || has(dir, "state.safetensors"))
        return DDT_DIR_CHECKPOINT;
    if (has(dir, DDT_EXPORT_MANIFEST) || (has(dir, "config.json") && drafter_config(dir)))
        return DDT_DIR_EXPORT;
    if (has(dir, "config.json"))
        return DDT_DIR_MODEL;
    if (has(dir, "checkpoints") || has(dir, "export"))
        return DDT_DIR_RUN;
    if (has(dir, "runs") || has(dir, "ddtree.db"))
        return DDT_DIR_STATE;
    return DDT_DIR_OTHER;
}

const char *ddt_dir_kind_name(ddt_dir_kind kind)
{
    static const char *const names[] = {
        [DDT_DIR_MISSING] = "no directory",        [DDT_DIR_CHECKPOINT] = "a checkpoint",
        [DDT_DIR_EXPORT] = "a drafter export",     [DDT_DIR_MODEL] = "a target model (its config.json has no dflash_config)",
        [DDT_DIR_RUN] = "a run directory",         [DDT_DIR_STATE] = "a state directory",
        [DDT_DIR_OTHER] = "none of ddtree's directories",
    };
    return (unsigned)kind <= DDT_DIR_OTHER ? names[kind] : "";
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void ddt_dir_list_runs(const char *state_dir, char *out, size_t out_len)
{
    char runs[4200];
    snprintf(runs, sizeof runs, "%s/runs", state_dir);
    snprintf(out, out_len, "none");
    DIR *d = opendir(runs);
    char *names[256];
    int n = 0;
    for (struct dirent *e; d && n < 256 && (e = readdir(d));)
        if (e->d_name[0] != '.' && (names[n] = strdup(e->d_name)))
            n++;
    if (d)
        closedir(d);
    qsort(names, (size_t)n, sizeof names[0], by_name);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        if (at < out_len)
            at += (size_t)snprintf(out + at, out_len - at, "%s%s", i ? ", " : "", names[i]);
        free(names[i]);
    }
}
