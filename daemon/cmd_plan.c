/* cmd_plan.c: `ddtreed plan CONFIG.json [--budget BYTES] [--card NAME] [--json]`: the memory
 * plan of a run without starting it (planner.h's ddt_plan_config, as POST /plan): the drafter's
 * devices and the target's placement. The target's shape comes from the target itself (hf:
 * config.json alone; shards: the first shard's metadata when readable) or, for synthetic targets
 * and targets not at hand, from the config's target.* shape fields. --budget and --card stand in
 * for the config's memory.budget_bytes and memory.card; the budget is checked against the card
 * after both.
 * Tested by tests/daemon/train_cli_test.sh (every example must pass it; the 96 GB card's plan, and the
 * card and budget refused; the seed's split proposed under 95 GB, --budget's forms, --help).
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
#define PLAN_HELP                                                                                   \
    PLAN_USAGE                                                                                      \
    "The memory plan of a run config without starting it (as POST /plan): what one device holds\n"  \
    "at its busiest, where the target runs, and the chunk / vocab_tile that fit the budget.\n"       \
    "  --budget BYTES  a device's budget instead of memory.budget_bytes: 96000000000, 96e9, 96GB,\n"  \
    "                  96G (1000s), 96GiB (1024s)\n"                                                \
    "  --card NAME     the card planned for instead of memory.card (its memory is the budget\n"      \
    "                  when none is given)\n"                                                       \
    "  --json          POST /plan's reply instead of the table\n"                                   \
    "Exit status: 0 when the run as configured fits (POST /plan's \"fits\"); 1 when it does not,\n" \
    "a proposed split included (the plan prints the \"devices\" and \"target.devices\" to write),\n" \
    "or the config is refused; 2 for a command line not understood.\n"

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
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(PLAN_HELP, stdout);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--budget") && i + 1 < argc && !ddt_parse_bytes(argv[i + 1], &budget)) {
            i++;
        } else if (!strcmp(argv[i], "--card") && i + 1 < argc) {
            if (!(card = ddt_run_config_card(argv[++i], err, sizeof err))) {
                fprintf(stderr, "ddtreed plan: --card: %s\n" PLAN_USAGE, err);
                return 2;
            }
        } else if (argv[i][0] != '-' && !config) {
            config = argv[i];
        } else {
            fprintf(stderr, "ddtreed plan: %s%s%s: not understood (--budget wants bytes: 96000000000, 96e9, 96GB, "
                    "96G or 96GiB; --card a card's name; see --help)\n" PLAN_USAGE, argv[i],
                    !strcmp(argv[i], "--budget") && i + 1 < argc ? " " : "",
                    !strcmp(argv[i], "--budget") && i + 1 < argc ? argv[i + 1] : "");
            return 2;
        }
    }
    if (!config) {
        fputs(PLAN_USAGE, stderr);
        return 2;
    }
    char *text = ddt_run_config_read_file(config, err, sizeof err);   /* relative paths: the file's folder */
    const int unread = !text;   /* err names the file already */
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
        if (unread)
            fprintf(stderr, "ddtreed plan: %s\n", err);
        else
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
    return ddt_plan_fits(&plan) ? 0 : 1;
}
