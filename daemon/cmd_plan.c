/* cmd_plan.c: `ddtreed plan CONFIG.json [--budget BYTES] [--json]`: the memory plan of a run
 * without starting it (planner.h). The target's shape comes from the target itself (hf:
 * config.json; shards: the first shard's metadata when readable) or, for synthetic targets
 * and targets not at hand (a plan made before the model is downloaded), from the config's
 * target.* shape fields.
 * Tested by tests/train_cli_test.sh (every example must pass it).
 */
#include "commands.h"
#include "ddk.h"
#include "model_config.h"
#include "planner.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_USAGE "usage: ddtreed plan CONFIG.json [--budget BYTES] [--json]\n"

int ddt_cmd_plan(int argc, char **argv)
{
    const char *config = NULL;
    int64_t budget = 0;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--budget") && i + 1 < argc && !ddt_parse_count(argv[i + 1], &budget))
            i++;
        else if (argv[i][0] != '-' && !config)
            config = argv[i];
        else {
            fprintf(stderr, "ddtreed plan: %s: not understood (--budget wants a number of bytes)\n" PLAN_USAGE,
                    argv[i]);
            return 2;
        }
    }
    if (!config) {
        fputs(PLAN_USAGE, stderr);
        return 2;
    }
    char err[2048] = "", field[160] = "";
    char *text = ddt_read_text_file(config, 1 << 20, err, sizeof err);
    ddt_run_config c;
    int rc = text ? ddt_run_config_parse(text, strlen(text), &c, err, sizeof err, field, sizeof field) : -EINVAL;
    free(text);
    /* the ranks the run takes on this node ("all": the GPUs it trains on); a plan made away
     * from the node (a GPU it names is not here) takes the ranks the config names */
    ddt_devices dev;
    memset(&dev, 0, sizeof dev);
    if (rc == 0) {
        char why[1024];
        int drc = ddt_run_config_devices(&c, ddt_node_here(), &dev, why, sizeof why, field, sizeof field);
        if (drc == -ENODEV) {
            fprintf(stderr, "ddtreed plan: %s\nddtreed plan: planning with the %lld rank(s) it names\n", why,
                    (long long)c.ranks);
            *field = '\0';
        } else if (drc) {
            rc = drc;
            snprintf(err, sizeof err, "%s", why);
        } else {
            c.ranks = dev.ranks;
        }
    }
    int64_t hidden = 0, vocab = 0, layers = 0;
    int tied = 0;
    if (rc == 0 && ddt_run_config_target_shape(&c, &hidden, &vocab, &layers, &tied, err, sizeof err)) {
        /* planning needs only the shape: say so, and use the config's target.* fields */
        fprintf(stderr, "ddtreed plan: %s\nddtreed plan: planning with the config's declared target shape "
                "(target.hidden_size %lld, num_hidden_layers %lld, vocab_size %lld)\n", err,
                (long long)c.synthetic.hidden, (long long)c.synthetic.layers, (long long)c.synthetic.vocab);
        hidden = c.synthetic.hidden;
        vocab = c.synthetic.vocab;
        layers = c.synthetic.layers;
    }
    if (rc == 0)
        rc = ddt_run_config_resolve(&c, hidden, vocab, layers, err, sizeof err);
    ddt_memory_plan plan;
    if (rc == 0)
        rc = ddt_plan(&c, budget, tied, &plan);
    if (rc) {
        fprintf(stderr, "ddtreed plan: %s: %s\n", config, err);
        ddt_run_config_free(&c);
        return 1;
    }
    if (json) {
        char *out = ddt_plan_json(&c, &plan, dev.note);
        printf("%s\n", out);
        free(out);
    } else {
        ddt_plan_print(&c, &plan, stdout);
        if (*dev.note)
            printf("  %s\n", dev.note);
    }
    ddt_run_config_free(&c);
    return plan.fits ? 0 : 1;
}
