/* cmd_export.c: `ddtreed export RUN_DIR --out DIR [--step N]`: the serving export
 * (SPEC.md section 5) of a run's newest checkpoint, or of step N, from the checkpoint alone
 * (ddt_checkpoint_export): its state.json holds the drafter in the export's config.json form,
 * so neither the target nor the data need be at hand.
 * Tested by tests/daemon/train_cli_test.sh.
 */
#include "commands.h"
#include "record/checkpoint.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT_USAGE "usage: ddtreed export RUN_DIR --out DIR [--step N]\n"

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
    int rc = ddt_checkpoint_export(run_dir, step, out, ckpt, sizeof ckpt, err, sizeof err);
    if (rc) {
        fprintf(stderr, "ddtreed export: %s\n", err);
        return 1;
    }
    printf("%s -> %s\n", ckpt, out);
    return 0;
}
