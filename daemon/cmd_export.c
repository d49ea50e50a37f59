/* cmd_export.c: `ddtreed export RUN_DIR --out DIR [--step N]`: the serving export
 * (SPEC.md section 5) of a run's newest checkpoint, or of step N. The drafter's shape comes
 * from the checkpoint's state.json (the run config and what it resolved from the target), so
 * the target need not be at hand.
 * Tested by tests/train_cli_test.sh.
 */
#include "checkpoint.h"
#include "commands.h"
#include "model_config.h"
#include "run_config.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT_USAGE "usage: ddtreed export RUN_DIR --out DIR [--step N]\n"

static int drafter_of(const char *ckpt, ddt_run_config *rc_out, char *err, size_t err_len)
{
    char path[2500], field[160];
    snprintf(path, sizeof path, "%.2400s/state.json", ckpt);
    char *text = ddt_read_text_file(path, 1 << 22, err, err_len);
    cJSON *o = text ? cJSON_Parse(text) : NULL;
    free(text);
    const char *config = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "config"));
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(o, "resolved");
    int rc = config && cJSON_IsObject(r) ? 0 : -EINVAL;
    if (rc)
        snprintf(err, err_len, "%s: no run config and resolved drafter shape in it", path);
    if (!rc)
        rc = ddt_run_config_parse(config, strlen(config), rc_out, err, err_len, field, sizeof field);
    if (!rc) {
        ddt_drafter_config *d = &rc_out->drafter;
        const cJSON *ids = cJSON_GetObjectItemCaseSensitive(r, "target_layer_ids");
        d->hidden = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "hidden_size"));
        d->vocab = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "vocab_size"));
        d->num_target_layers = (int64_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "num_target_layers"));
        d->mask_token_id = (int32_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(r, "mask_token_id"));
        d->taps = cJSON_GetArraySize(ids);
        for (int i = 0; i < d->taps && i < DDT_MAX_TAPS; i++)
            d->target_layer_ids[i] = (int32_t)cJSON_GetNumberValue(cJSON_GetArrayItem(ids, i));
        char why[512];
        if (ddt_drafter_config_check(d, why, sizeof why)) {
            snprintf(err, err_len, "%s: %s", path, why);
            rc = -EINVAL;
        }
    }
    cJSON_Delete(o);
    return rc;
}

int ddt_cmd_export(int argc, char **argv)
{
    const char *run_dir = NULL, *out = NULL;
    int64_t step = -1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc)
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
    int64_t latest;
    int rc = 0;
    if (step >= 0)
        snprintf(ckpt, sizeof ckpt, "%s/checkpoints/step-%08lld", run_dir, (long long)step);
    else if (ddt_checkpoint_latest(run_dir, &latest, ckpt, sizeof ckpt)) {
        snprintf(err, sizeof err, "%s has no complete checkpoint", run_dir);
        rc = -ENOENT;
    }
    ddt_run_config c = { 0 };
    if (!rc)
        rc = drafter_of(ckpt, &c, err, sizeof err);
    float *params = NULL, *m = NULL, *v = NULL;
    char *state = NULL;
    if (!rc) {
        static ddt_param params_table[DDT_MAX_PARAMS];
        int64_t total;
        ddt_drafter_param_table(&c.drafter, params_table, &total);
        params = malloc((size_t)total * sizeof(float));
        m = malloc((size_t)total * sizeof(float));
        v = malloc((size_t)total * sizeof(float));
        ddt_adamw_state adam = { 0, m, v };
        rc = params && m && v ? ddt_checkpoint_read(ckpt, &c.drafter, params, &adam, &state, err, sizeof err) : -ENOMEM;
    }
    if (!rc)
        rc = ddt_export_write(out, &c.drafter, params, err, sizeof err);
    free(params);
    free(m);
    free(v);
    free(state);
    ddt_run_config_free(&c);
    if (rc) {
        fprintf(stderr, "ddtreed export: %s\n", err);
        return 1;
    }
    printf("%s -> %s\n", ckpt, out);
    return 0;
}
