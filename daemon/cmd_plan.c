/* cmd_plan.c: `ddtreed plan CONFIG.json [--budget BYTES] [--card NAME] [--json]`: the memory
 * plan of a run without starting it (planner.h's ddt_plan_config, as POST /plan): the drafter's
 * devices and the target's placement. The target's shape comes from the target itself (hf:
 * config.json alone; shards: the first shard's metadata when readable) or, for synthetic targets
 * and targets not at hand, from the config's target.* shape fields. --budget and --card stand in
 * for the config's memory.budget_bytes and memory.card; the budget is checked against the card
 * after both.
 * Tested by tests/daemon/train_cli_test.sh (every example must pass it; the 96 GB card's plan, and the
 * card and budget refused).
 */
#include "base/read_file.h"
#include "commands.h"
#include "ddk.h"
#include "model/model_config.h"
#include "run/planner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PLAN_USAGE "usage: ddtreed plan CONFIG.json [--budget BYTES] [--card NAME] [--json]\n"

/* The files the run would read, as POST /runs and `ddtreed train` check them
 * (ddt_run_config_check_files), when the target is here (its weights beside its config.json): a
 * run of this config would be refused. A target not at hand (planning for another machine from
 * its config.json alone) is planned all the same, the files' sentence printed as a remark. */
static int check_files(const ddt_run_config *c, char *err, size_t err_len, char *field, size_t field_len)
{
    int64_t hidden, vocab, layers;
    int tied;
    char why[2048];
    if (c->target_kind == DDT_SOURCE_SYNTHETIC ||
        ddt_run_config_target_shape(c, &hidden, &vocab, &layers, &tied, why, sizeof why))
        return 0;   /* the shape's trouble is the planner's remark */
    int rc = ddt_run_config_check_files(c, vocab, why, sizeof why, field, field_len);
    if (rc == 0)
        return 0;
    char weights[DDT_RUN_PATH + 40], index[DDT_RUN_PATH + 40];
    snprintf(weights, sizeof weights, "%s/model.safetensors", c->target_path);
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", c->target_path);
    if (c->target_kind == DDT_SOURCE_HF && (!access(weights, F_OK) || !access(index, F_OK))) {
        snprintf(err, err_len, "%s", why);
        return rc;
    }
    fprintf(stderr, "ddtreed plan: %s (the target's weights are not here: planned all the same)\n", why);
    *field = '\0';
    return 0;
}

int ddt_cmd_plan(int argc, char **argv)
{
    const char *config = NULL;
    int64_t budget = 0;
    const ddk_device_profile *card = NULL;
    int json = 0;
    char err[2048] = "", field[160] = "";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--budget") && i + 1 < argc && !ddt_parse_count(argv[i + 1], &budget)) {
            i++;
        } else if (!strcmp(argv[i], "--card") && i + 1 < argc) {
            if (!(card = ddt_run_config_card(argv[++i], err, sizeof err))) {
                fprintf(stderr, "ddtreed plan: --card: %s\n" PLAN_USAGE, err);
                return 2;
            }
        } else if (argv[i][0] != '-' && !config) {
            config = argv[i];
        } else {
            fprintf(stderr, "ddtreed plan: %s: not understood (--budget wants a number of bytes, --card a card's "
                    "name)\n" PLAN_USAGE, argv[i]);
            return 2;
        }
    }
    if (!config) {
        fputs(PLAN_USAGE, stderr);
        return 2;
    }
    char *text = ddt_run_config_read_file(config, err, sizeof err);   /* relative paths: the file's folder */
    ddt_run_config c = { 0 };   /* freed on every path, a file that could not be read included */
    int rc = text ? ddt_run_config_parse(text, strlen(text), &c, err, sizeof err, field, sizeof field) : -EINVAL;
    free(text);
    if (rc == 0 && card)
        c.card = card;
    if (rc == 0)
        rc = ddt_run_config_check_budget(&c, budget ? budget : c.budget_bytes,
                                         budget ? "--budget" : "memory.budget_bytes", err, sizeof err);
    if (rc == 0)
        rc = check_files(&c, err, sizeof err, field, sizeof field);
    ddt_memory_plan plan;
    char note[256] = "", remark[2048] = "";
    if (rc == 0)
        rc = ddt_plan_config(&c, ddt_node_here(), budget, &plan, note, sizeof note, remark, sizeof remark, err,
                             sizeof err, field, sizeof field);
    if (*remark)
        fprintf(stderr, "ddtreed plan: %s\n", remark);
    if (rc) {
        fprintf(stderr, "ddtreed plan: %s: %s\n", config, err);
        ddt_run_config_free(&c);
        return 1;
    }
    if (json) {
        char *out = ddt_plan_json(&c, &plan, note);
        printf("%s\n", out);
        free(out);
    } else {
        ddt_plan_print(&c, &plan, stdout);
        if (*note)
            printf("  %s\n", note);
    }
    ddt_run_config_free(&c);
    /* a proposal (co-location did not fit) is printed, but the config as written does not run */
    return plan.fits && !plan.target.proposed ? 0 : 1;
}
