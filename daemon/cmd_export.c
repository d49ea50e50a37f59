/* cmd_export.c: `ddtreed export RUN_DIR --out DIR [--step N]`: the serving export
 * (SPEC.md section 5) of a run's newest checkpoint, or of step N, from the checkpoint alone
 * (ddt_checkpoint_export): its state.json holds the drafter in the export's config.json form,
 * so neither the target nor the data need be at hand.
 * Tested by tests/daemon/train_cli_test.sh.
 */
#include "commands.h"
#include "base/errors.h"
#include "record/checkpoint.h"
#include "record/dir_kind.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT_USAGE "usage: ddtreed export RUN_DIR --out DIR [--step N]\n"

/* RUN_DIR is another of ddtree's directories: -EINVAL with err saying what to give instead */
static int not_a_run(const char *dir, char *err, size_t err_len)
{
    ddt_dir_kind kind = ddt_dir_kind_of(dir);
    char runs[2048];
    if (kind == DDT_DIR_STATE) {
        ddt_dir_list_runs(dir, runs, sizeof runs);
        return ddt_fail(err, err_len, -EINVAL, "%s is a state directory: give one of its runs, %s/runs/<id> (its runs: "
                        "%s)", dir, dir, runs);
    }
    if (kind == DDT_DIR_CHECKPOINT)
        return ddt_fail(err, err_len, -EINVAL, "%s is a checkpoint: give its run directory (two levels up) and --step "
                        "N for this one", dir);
    if (kind == DDT_DIR_EXPORT)
        return ddt_fail(err, err_len, -EINVAL, "%s is an export already: copy it, or give its run directory", dir);
    return 0;
}

/* err, a step not kept, followed by the steps that are */
static void kept_steps(const char *run_dir, char *err, size_t err_len)
{
    ddt_checkpoint_dir *dirs = NULL;
    int count = 0;
    size_t at = strlen(err);
    if (ddt_checkpoint_dirs(run_dir, &dirs, &count) == 0 && at < err_len) {
        at += (size_t)snprintf(err + at, err_len - at, "; the kept steps:");
        for (int i = count - 1; i >= 0 && at < err_len; i--)
            at += (size_t)snprintf(err + at, err_len - at, " %lld", (long long)dirs[i].step);
        if (count == 0 && at < err_len)
            snprintf(err + at, err_len - at, " none");
    }
    free(dirs);
}

int ddt_cmd_export(int argc, char **argv)
{
    const char *run_dir = NULL, *out = NULL;
    int64_t step = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(EXPORT_USAGE "The serving export (SPEC.md section 5) of RUN_DIR's newest checkpoint, or of step N, "
                  "into DIR.\n", stdout);
            return 0;
        } else if (!strcmp(argv[i], "--out") && i + 1 < argc)
            out = argv[++i];
        else if (!strcmp(argv[i], "--step") && i + 1 < argc && !ddt_parse_count(argv[i + 1], &step))
            i++;
        else if (argv[i][0] != '-' && !run_dir)
            run_dir = argv[i];
        else {
            fprintf(stderr, "ddtreed export: %s: not understood\n" EXPORT_USAGE, argv[i]);
            return 2;
        }
    }
    if (!run_dir || !out) {
        fputs(EXPORT_USAGE, stderr);
        return 2;
    }
    char ckpt[2400], err[3072] = "";
    int rc = not_a_run(run_dir, err, sizeof err);
    if (!rc)
        rc = ddt_checkpoint_export(run_dir, step, out, ckpt, sizeof ckpt, err, sizeof err);
    if (rc == -ENOENT && step >= 0)
        kept_steps(run_dir, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ddtreed export: %s\n", err);
        return 1;
    }
    printf("%s -> %s\n", ckpt, out);
    return 0;
}
