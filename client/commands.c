/* commands.c: ddtreectl's commands and the one table of them (name, operand, options with their
 * kinds, help, handler) from which command_line.c derives the usage text and every command's
 * argument parsing. A handler gets its arguments checked, makes its request of API.md's
 * "Endpoints" (api_client.c) and prints the answer as tables and `key: value` lines
 * (format.c), or nothing more when --json printed it as it came. `watch` is watch.c's.
 * Tested by tests/daemon/api_e2e.py, which drives every command against ddtreed and checks outputs and
 * exit statuses, and by tests/client/test_client.c (the table and the parsing derived from it).
 */
#include "ddtreectl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Commands of one request: status, start, plan, show, pause, resume, cancel, export, events,
 * nccl-id */

/* What such a command prints of the daemon's answer (the object root, its HTTP status): the
 * exit status. path is the request's (after /runs/ID for a run). */
typedef int (*ddc_printer)(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                           long status);

/* method on path without an operand, on /runs/ID<path> with an ID, or with the FILE as the
 * body; then print on the answer, unless --json printed it as it came. */
static int ddc_one_request(ddc_ctx *ctx, const ddc_args *args, const char *method, const char *path,
                           ddc_printer print)
{
    cJSON *root;
    long status = 0;
    int rc;
    switch (args->command->operand) {
    case DDC_OPERAND_FILE:
        rc = ddc_file_request(ctx, method, path, args->operand, &root, &status);
        break;
    case DDC_OPERAND_RUN_ID:
        rc = ddc_run_request(ctx, method, args->operand, path, NULL, 0, &root, &status);
        break;
    default:
        rc = ddc_request(ctx, method, path, NULL, 0, &root, &status);
        break;
    }
    if (rc || !root)
        return rc;
    rc = print(ctx, args, path, root, status);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * status */

enum { DDC_DEVICE_COLUMNS = 5 };

/* a row of the devices table */
static const ddc_text *ddc_device_cells(const cJSON *device, ddc_text cells[DDC_DEVICE_COLUMNS])
{
    cells[0] = ddc_fmt_value(ddc_get(device, "id"));
    cells[1] = ddc_fmt_value(ddc_get(device, "name"));
    cells[2] = ddc_fmt_bytes(ddc_get(device, "memory_used_bytes"));
    cells[3] = ddc_fmt_bytes(ddc_get(device, "memory_total_bytes"));
    cells[4] = ddc_fmt_value(ddc_get(device, "run"));
    return cells;
}

static int ddc_print_status(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                            long status)
{
    double uptime = -1;
    ddc_number(ddc_get(root, "uptime_s"), &uptime);
    printf("ddtreed %s, up %s, backend %s\n", ddc_fmt_value(ddc_get(root, "version")).s,
           ddc_duration_text(uptime).s, ddc_fmt_value(ddc_get(root, "backend")).s);

    fputs("runs:", stdout);
    int any = 0;
    const cJSON *count;
    cJSON_ArrayForEach(count, ddc_object(ddc_get(root, "runs"))) {
        double n;
        if (count->string && ddc_number(count, &n) && n != 0) {
            printf("%s %.0f %s", any ? "," : "", n, count->string);
            any = 1;
        }
    }
    puts(any ? "" : " none");

    const cJSON *health = ddc_get(root, "health");
    if (health) {
        const cJSON *store = ddc_get(health, "store");
        double held = 0, queued = 0;
        ddc_number(ddc_get(health, "runs_held"), &held);
        ddc_number(ddc_get(store, "queued"), &queued);
        const char *cause = ddc_string(ddc_get(store, "cause"));
        if (cJSON_IsTrue(ddc_get(store, "degraded")))   /* the cause whole: a path, a pid, what to do */
            printf("health: DEGRADED: %s; %.0f record(s) waiting, %.0f run(s) held until it is over\n",
                   cause ? cause : "-", queued, held);
        else
            printf("health: ok%s\n", held > 0 ? ", but runs are held (see ddtreectl runs)" : "");
    }

    const cJSON *devices = ddc_get(root, "devices"), *device;
    if (cJSON_GetArraySize(devices) == 0) {
        puts("devices: none");
        return 0;
    }
    ddc_column columns[DDC_DEVICE_COLUMNS] = {
        {.header = "DEVICE", .left = 1, .fit = 1}, {.header = "NAME", .left = 1, .fit = 1},
        {.header = "USED", .width = 10},           {.header = "TOTAL", .width = 10},
        {.header = "RUN"},
    };
    ddc_text cells[DDC_DEVICE_COLUMNS];
    cJSON_ArrayForEach(device, ddc_array(devices))
        ddc_table_fit(columns, DDC_DEVICE_COLUMNS, ddc_device_cells(device, cells));
    ddc_table_header(columns, DDC_DEVICE_COLUMNS);
    cJSON_ArrayForEach(device, devices)
        ddc_table_row(columns, DDC_DEVICE_COLUMNS, ddc_device_cells(device, cells));
    return 0;
}

static int ddc_cmd_status(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "GET", "/status", ddc_print_status);
}

/* ---------------------------------------------------------------------------------------------
 * runs */

enum { DDC_RUNS_STATE };   /* its options */
enum { DDC_RUN_COLUMNS = 6 };

/* a row of the runs table */
static const ddc_text *ddc_run_cells(const cJSON *run, ddc_text cells[DDC_RUN_COLUMNS])
{
    cells[0] = ddc_fmt_value(ddc_get(run, "id"));
    cells[1] = ddc_fmt_value(ddc_get(run, "state"));
    cells[2] = ddc_step_of_max(run);
    cells[3] = ddc_fmt_real(ddc_get(run, "loss"), 4);
    cells[4] = ddc_fmt_thousands(ddc_get(run, "tokens_per_s"));
    cells[5] = ddc_fmt_value(ddc_get(run, "name"));
    return cells;
}

static int ddc_cmd_runs(ddc_ctx *ctx, const ddc_args *args)
{
    const ddc_value *state = &args->option[DDC_RUNS_STATE];
    char path[DDC_PATH_MAX] = "/runs";
    if (state->given) {
        char escaped[DDC_QUERY_VALUE_MAX];
        ddc_escape(state->text, escaped, sizeof escaped); /* it fits: the parser checked */
        snprintf(path, sizeof path, "/runs?state=%s", escaped);
    }
    cJSON *root;
    int rc = ddc_request(ctx, "GET", path, NULL, 0, &root, NULL);
    if (rc || !root)
        return rc;
    const cJSON *runs = ddc_get(root, "runs");
    if (!cJSON_IsArray(runs)) {
        fputs("ddtreectl: the answer to GET /runs has no \"runs\" list\n", stderr);
        cJSON_Delete(root);
        return 1;
    }
    if (cJSON_GetArraySize(runs) == 0) {
        puts(state->given ? "no runs in that state" : "no runs");
        cJSON_Delete(root);
        return 0;
    }
    ddc_column columns[DDC_RUN_COLUMNS] = {
        {.header = "ID", .left = 1, .fit = 1}, {.header = "STATE", .left = 1, .fit = 1},
        {.header = "STEP/MAX", .fit = 1},      {.header = "LOSS", .width = 9},
        {.header = "TOK/S", .width = 10},      {.header = "NAME"},
    };
    ddc_text cells[DDC_RUN_COLUMNS];
    int count = cJSON_GetArraySize(runs);
    const cJSON **order = malloc((size_t)count * sizeof *order);
    if (!order) {
        fputs("ddtreectl: out of memory for the runs table\n", stderr);
        cJSON_Delete(root);
        return 1;
    }
    count = ddc_runs_newest_first(runs, order, count);   /* newest first, as the web view lists them */
    for (int k = 0; k < count; k++)
        ddc_table_fit(columns, DDC_RUN_COLUMNS, ddc_run_cells(order[k], cells));
    ddc_table_header(columns, DDC_RUN_COLUMNS);
    for (int k = 0; k < count; k++)
        ddc_table_row(columns, DDC_RUN_COLUMNS, ddc_run_cells(order[k], cells));
    free(order);
    cJSON_Delete(root);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * start, plan: a run config file as the body */

enum { DDC_START_QUIET };  /* its options */

static int ddc_print_started(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                             long status)
{
    const cJSON *id = ddc_get(root, "id");
    if (!ddc_string(id) && !cJSON_IsNumber(id)) {
        fputs("ddtreectl: the daemon accepted the run but its answer has no id\n", stderr);
        return 1;
    }
    /* --quiet before the command, or -q anywhere, is the context's; --quiet after it, start's */
    if (ctx->quiet || args->option[DDC_START_QUIET].given)
        printf("%s\n", ddc_fmt_value(id).s);
    else
        printf("started run %s (%s)\n", ddc_fmt_value(id).s, ddc_fmt_value(ddc_get(root, "state")).s);
    return 0;
}

static int ddc_cmd_start(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/runs", ddc_print_started);
}

/* one line of the plan's byte table: bytes in unit, or missing when there is no value */
static void ddc_plan_line(const char *label, int has_bytes, double bytes, double scale, const char *unit,
                          const char *missing)
{
    if (has_bytes)
        printf("  %-22s %12.3f %s\n", label, bytes / scale, unit);
    else
        printf("  %-22s %12s\n", label, missing);
}

/* The plan's table: the parts of one drafter device's peak (peak_parts, which sum to it; an older
 * daemon's bytes otherwise), the peak, the budget; then whether the run as configured fits (the
 * exit status: 1 when not), and a proposed split's devices to write. */
static int ddc_print_plan(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *plan,
                          long status)
{
    /* one unit for the whole table, so that the column reads down */
    double peak = 0, budget = 0;
    int has_peak = ddc_number(ddc_get(plan, "predicted_peak_bytes"), &peak);
    int has_budget = ddc_number(ddc_get(plan, "budget_bytes"), &budget) && budget > 0;
    double scale = (peak >= 1e9 || budget >= 1e9) ? 1e9 : 1e6;
    const char *unit = scale == 1e9 ? "GB" : "MB";

    double ranks = 0, target_ranks = 0;
    const cJSON *proposal = ddc_get(plan, "proposal");
    const int proposed = cJSON_IsObject(proposal) && ddc_number(ddc_get(proposal, "drafter_ranks"), &ranks) &&
                         ddc_number(ddc_get(proposal, "target_ranks"), &target_ranks);
    if (proposed)
        printf("memory plan of \"%s\" as the split proposed: %g drafter GPU%s beside %g target GPU%s (the config "
               "names %s), %s positions per drafter GPU, chunk %s, vocab tile %s\n",
               ddc_fmt_value(ddc_get(plan, "name")).s, ranks, ranks == 1 ? "" : "s", target_ranks,
               target_ranks == 1 ? "" : "s", ddc_fmt_count(ddc_get(plan, "ranks")).s,
               ddc_fmt_thousands(ddc_get(plan, "positions_per_rank")).s, ddc_fmt_count(ddc_get(plan, "chunk")).s,
               ddc_fmt_count(ddc_get(plan, "vocab_tile")).s);
    else
        printf("memory plan of \"%s\": %s rank%s, %s positions per rank, chunk %s, vocab tile %s\n",
               ddc_fmt_value(ddc_get(plan, "name")).s, ddc_fmt_count(ddc_get(plan, "ranks")).s,
               ddc_number(ddc_get(plan, "ranks"), &ranks) && ranks == 1 ? "" : "s",
               ddc_fmt_thousands(ddc_get(plan, "positions_per_rank")).s, ddc_fmt_count(ddc_get(plan, "chunk")).s,
               ddc_fmt_count(ddc_get(plan, "vocab_tile")).s);
    const cJSON *parts = ddc_object(ddc_get(plan, "peak_parts"));
    const cJSON *component;
    if (!parts)
        parts = ddc_object(ddc_get(plan, "bytes"));
    cJSON_ArrayForEach(component, parts) {
        double bytes = 0;
        if (!component->string)
            continue;
        char label[64];
        snprintf(label, sizeof label, "%s", !strcmp(component->string, "target") ? "target (co-located)"
                                            : component->string);
        for (char *c = label; *c; c++)
            *c = *c == '_' ? ' ' : *c;
        int has_bytes = ddc_number(component, &bytes);
        ddc_plan_line(label, has_bytes, bytes, scale, unit, "-");
    }
    ddc_plan_line("predicted peak", has_peak, peak, scale, unit, "-");
    const char *budget_from = ddc_string(ddc_get(plan, "budget_from"));
    ddc_plan_line(budget_from && !strcmp(budget_from, "card") ? "budget (card memory)" : "budget", has_budget,
                  budget, scale, unit, "none set");
    const cJSON *target = ddc_get(plan, "target");
    const char *placement = ddc_string(ddc_get(target, "placement"));
    double target_peak = 0;
    if (placement && strcmp(placement, "same") && ddc_number(ddc_get(target, "peak_bytes"), &target_peak))
        printf("target (%s): %.3f %s %s\n", placement, target_peak / scale, unit,
               !strcmp(placement, "host") ? "in host memory" : "on each target device");
    const cJSON *card = ddc_get(plan, "card");
    double memory = 0, smem = 0, threads = 0;
    if (cJSON_IsObject(card) && ddc_number(ddc_get(card, "memory_bytes"), &memory) &&
        ddc_number(ddc_get(card, "shared_memory_per_block_bytes"), &smem) &&
        ddc_number(ddc_get(card, "threads_per_sm"), &threads))
        printf("card %s: memory %.3f GB, shared memory %g KiB per block, %g threads per SM\n",
               ddc_fmt_value(ddc_get(card, "name")).s, memory / 1e9, smem / 1024, threads);
    const cJSON *fits = ddc_get(plan, "fits");
    const char *why = ddc_string(ddc_get(plan, "why"));
    if (!cJSON_IsBool(fits)) {
        puts("fits: -");
        return 1;
    }
    if (cJSON_IsTrue(fits)) {
        puts("fits");
        return 0;
    }
    printf("does not fit as configured%s%s\n", why ? ": " : "", why ? why : "");
    if (proposed) {
        char *write = cJSON_PrintUnformatted(ddc_get(proposal, "config"));
        if (cJSON_IsTrue(ddc_get(proposal, "fits")))
            printf("fits as a split (the figures above); write into the run config (merged: the target's other "
                   "keys stay):\n  %s\n", write ? write : "-");
        else
            puts("the split proposed (the figures above) does not fit either");
        free(write);
    }
    return 1;
}

static int ddc_cmd_plan(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/plan", ddc_print_plan);
}

/* ---------------------------------------------------------------------------------------------
 * show */

static void ddc_show_line(const char *key, const char *value)
{
    printf("%-17s %s\n", key, value);
}

/* run[key] {"16": 3.1, "64": 3.9} as the line "label 16: 3.1, 64: 3.9" ("-": none) */
static void show_budgets(const cJSON *run, const char *key, const char *label)
{
    char text[256] = "";
    const cJSON *budget;
    size_t used = 0;
    cJSON_ArrayForEach(budget, ddc_object(ddc_get(run, key))) {
        if (budget->string && used < sizeof text)
            used += (size_t)snprintf(text + used, sizeof text - used, "%s%s: %s", used ? ", " : "", budget->string,
                                     ddc_fmt_real(budget, 4).s);
    }
    ddc_show_line(label, used ? text : "-");
}
static int ddc_print_run(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *run,
                         long status)
{
    ddc_show_line("id:", ddc_fmt_value(ddc_get(run, "id")).s);
    ddc_show_line("name:", ddc_fmt_value(ddc_get(run, "name")).s);
    ddc_show_line("state:", ddc_fmt_value(ddc_get(run, "state")).s);
    ddc_show_line("step:", ddc_textf("%s / %s", ddc_fmt_count(ddc_get(run, "step")).s,
                                     ddc_fmt_count(ddc_get(run, "max_steps")).s).s);
    ddc_show_line("loss:", ddc_fmt_real(ddc_get(run, "loss"), 5).s);
    ddc_show_line("ce:", ddc_fmt_real(ddc_get(run, "ce"), 5).s);
    ddc_show_line("kl:", ddc_fmt_real(ddc_get(run, "kl"), 5).s);
    ddc_show_line("cap:", ddc_fmt_real(ddc_get(run, "cap"), 5).s);
    ddc_show_line("acc:", ddc_fmt_real(ddc_get(run, "acc"), 4).s);
    ddc_show_line("tau chain:", ddc_fmt_real(ddc_get(run, "tau_chain"), 4).s);

    show_budgets(run, "tau_tree", "tau tree:");
    const cJSON *unary = ddc_object(ddc_get(run, "unary"));
    if (unary) {   /* a DFlash2 run: the two above are its path selector's, these its unary head's */
        ddc_show_line("unary chain:", ddc_fmt_real(ddc_get(unary, "tau_chain"), 4).s);
        show_budgets(unary, "tau_tree", "unary tree:");
    }
    /* speculative decoding (SPEC.md 7): tau_spec and tau_spec_tree, the same form */
    ddc_show_line("tau spec:", ddc_fmt_real(ddc_get(run, "tau_spec"), 4).s);
    show_budgets(run, "tau_spec_tree", "tau spec tree:");
    const cJSON *spec = ddc_object(ddc_get(run, "speculative"));
    if (spec) {   /* its step, prompts, verdict and cost */
        const cJSON *equal = ddc_get(spec, "greedy_equal");
        ddc_show_line("speculative:", ddc_textf("step %s, %s prompts, %s, %s s", ddc_fmt_count(ddc_get(spec, "step")).s,
                                                ddc_fmt_count(ddc_get(spec, "prompts")).s,
                                                cJSON_IsFalse(equal) ? "NOT greedy-equal (a bug)" : "greedy-equal",
                                                ddc_fmt_real(ddc_get(spec, "seconds"), 3).s).s);
    }
    ddc_show_line("tokens/s:", ddc_fmt_thousands(ddc_get(run, "tokens_per_s")).s);
    ddc_show_line("positions/s:", ddc_fmt_thousands(ddc_get(run, "positions_per_s")).s);

    /* peak_memory_bytes: {"max": N, "devices": {"cpu:0": N}} -> "10.1 MB (cpu:0 10.1 MB)" */
    const cJSON *peak = ddc_get(run, "peak_memory_bytes");
    char peak_text[256];
    size_t used = (size_t)snprintf(peak_text, sizeof peak_text, "%s",
                                   ddc_fmt_bytes(cJSON_IsNumber(peak) ? peak : ddc_get(peak, "max")).s);
    const cJSON *device;
    int first = 1;
    cJSON_ArrayForEach(device, ddc_object(ddc_get(peak, "devices"))) {
        if (device->string && used < sizeof peak_text) {
            used += (size_t)snprintf(peak_text + used, sizeof peak_text - used, "%s%s %s", first ? " (" : ", ",
                                     device->string, ddc_fmt_bytes(device).s);
            first = 0;
        }
    }
    if (!first && used < sizeof peak_text)
        snprintf(peak_text + used, sizeof peak_text - used, ")");
    ddc_show_line("peak memory:", peak_text);

    ddc_show_line("chunk:", ddc_fmt_count(ddc_get(run, "chunk")).s);
    ddc_show_line("vocab tile:", ddc_fmt_count(ddc_get(run, "vocab_tile")).s);
    ddc_show_line("created:", ddc_fmt_time(ddc_get(run, "created_ms")).s);
    ddc_show_line("started:", ddc_fmt_time(ddc_get(run, "started_ms")).s);
    ddc_show_line("updated:", ddc_fmt_time(ddc_get(run, "updated_ms")).s);
    ddc_show_line("finished:", ddc_fmt_time(ddc_get(run, "finished_ms")).s);
    double checkpoint_step;
    ddc_show_line("last checkpoint:", ddc_number(ddc_get(run, "last_checkpoint_step"), &checkpoint_step)
                                          ? ddc_textf("step %.0f", checkpoint_step).s
                                          : "-");
    /* the error may be long: not through ddc_text, which would cut it */
    const char *error = ddc_string(ddc_get(run, "error"));
    ddc_show_line("error:", error && *error ? error : "-");
    return 0;
}

static int ddc_cmd_show(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "GET", "", ddc_print_run);
}

/* ---------------------------------------------------------------------------------------------
 * pause, resume, cancel, rechunk, speculate, export: POSTs to one run */

/* path is "/<action>" */
static int ddc_print_requested(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                               long status)
{
    const char *id = args->operand;
    /* the state is the one at the answer: "running" after a cancel is not a refusal, the
     * cancel lands at the next step boundary */
    const char *state = ddc_string(ddc_get(root, "state"));
    printf("run %s: %s requested%s%s%s\n", id, path + 1, state ? " (now " : "", state ? state : "",
           state ? ")" : "");
    return 0;
}

static int ddc_cmd_pause(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/pause", ddc_print_requested);
}

static int ddc_cmd_resume(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/resume", ddc_print_requested);
}

static int ddc_cmd_cancel(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/cancel", ddc_print_requested);
}

enum { DDC_RECHUNK_CHUNK, DDC_RECHUNK_VOCAB_TILE }; /* its options */

static int ddc_cmd_rechunk(ddc_ctx *ctx, const ddc_args *args)
{
    const ddc_value *chunk_option = &args->option[DDC_RECHUNK_CHUNK];
    const ddc_value *vocab_tile_option = &args->option[DDC_RECHUNK_VOCAB_TILE];
    if (!chunk_option->given && !vocab_tile_option->given)
        return ddc_usage_error("rechunk: give --chunk N, --vocab-tile M or both");
    long long chunk = chunk_option->given ? chunk_option->count : -1;
    long long vocab_tile = vocab_tile_option->given ? vocab_tile_option->count : -1;
    char body[128];
    if (chunk >= 0 && vocab_tile >= 0)
        snprintf(body, sizeof body, "{\"chunk\":%lld,\"vocab_tile\":%lld}", chunk, vocab_tile);
    else if (chunk >= 0)
        snprintf(body, sizeof body, "{\"chunk\":%lld}", chunk);
    else
        snprintf(body, sizeof body, "{\"vocab_tile\":%lld}", vocab_tile);
    cJSON *root;
    int rc = ddc_run_request(ctx, "POST", args->operand, "/rechunk", body, strlen(body), &root, NULL);
    if (rc || !root)
        return rc;
    printf("run %s: rechunk applies from step %s\n", args->operand,
           ddc_fmt_count(ddc_get(root, "applies_from_step")).s);
    cJSON_Delete(root);
    return 0;
}

enum { DDC_SPECULATE_STEP, DDC_SPECULATE_PROMPTS, DDC_SPECULATE_GEN_LEN, DDC_SPECULATE_TREE }; /* its options */

/* POST /runs/{id}/speculate: {"step", "prompts", "gen_len", "tree_budgets"} of what was given */
static int ddc_cmd_speculate(ddc_ctx *ctx, const ddc_args *args)
{
    static const char *const keys[] = { "step", "prompts", "gen_len" };
    char body[512] = "{";
    size_t used = 1;
    for (int k = DDC_SPECULATE_STEP; k <= DDC_SPECULATE_GEN_LEN; k++)
        if (args->option[k].given)
            used += (size_t)snprintf(body + used, sizeof body - used, "%s\"%s\":%lld", used > 1 ? "," : "", keys[k],
                                     args->option[k].count);
    if (args->option[DDC_SPECULATE_TREE].given)   /* "8,32" (checked: integers and commas) */
        used += (size_t)snprintf(body + used, sizeof body - used, "%s\"tree_budgets\":[%s]", used > 1 ? "," : "",
                                 args->option[DDC_SPECULATE_TREE].text);
    snprintf(body + used, sizeof body - used, "}");
    cJSON *root;
    int rc = ddc_run_request(ctx, "POST", args->operand, "/speculate", body, strlen(body), &root, NULL);
    if (rc || !root)
        return rc;
    printf("run %s: speculative evaluation of the %s weights requested (step %s); its result lands in "
           "`ddtreectl show`\n", args->operand, ddc_string(ddc_get(root, "weights")) ? ddc_string(ddc_get(root, "weights")) : "live",
           ddc_fmt_count(ddc_get(root, "step")).s);
    cJSON_Delete(root);
    return 0;
}

enum { DDC_EXPORT_OUT }; /* its options */

/* POST /runs/{id}/export, {"out": DIR} with --out: where it went (200) or goes (202) */
static int ddc_cmd_export(ddc_ctx *ctx, const ddc_args *args)
{
    char *body = NULL;
    if (args->option[DDC_EXPORT_OUT].given) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "out", args->option[DDC_EXPORT_OUT].path);
        body = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        if (!body) {
            fputs("ddtreectl: out of memory for the request\n", stderr);
            return 1;
        }
    }
    cJSON *root;
    long status = 0;
    int rc = ddc_run_request(ctx, "POST", args->operand, "/export", body, body ? strlen(body) : 0, &root, &status);
    free(body);
    if (rc || !root)
        return rc;
    const char *dir = ddc_string(ddc_get(root, "path"));
    if (status == 202)
        printf("run %s: export of step %s at the next step boundary, into %s\n", args->operand,
               ddc_fmt_count(ddc_get(root, "step")).s, dir ? dir : "-");
    else
        printf("run %s: exported step %s (its newest checkpoint) to %s\n", args->operand,
               ddc_fmt_count(ddc_get(root, "step")).s, dir ? dir : "-");
    cJSON_Delete(root);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * steps, events */

enum { DDC_STEPS_CSV, DDC_STEPS_AFTER, DDC_STEPS_LIMIT }; /* its options */
enum { DDC_STEP_COLUMNS = 12 };

/* a row of the steps table */
static const ddc_text *ddc_step_cells(const cJSON *step, ddc_text cells[DDC_STEP_COLUMNS])
{
    cells[0] = ddc_fmt_count(ddc_get(step, "step"));
    cells[1] = ddc_fmt_real(ddc_get(step, "loss"), 5);
    cells[2] = ddc_fmt_real(ddc_get(step, "ce"), 5);
    cells[3] = ddc_fmt_real(ddc_get(step, "kl"), 5);
    cells[4] = ddc_fmt_real(ddc_get(step, "cap"), 5);
    cells[5] = ddc_fmt_real(ddc_get(step, "acc"), 4);
    cells[6] = ddc_fmt_real(ddc_get(step, "lr"), 3);
    cells[7] = ddc_fmt_real(ddc_get(step, "grad_norm"), 4);
    cells[8] = ddc_fmt_thousands(ddc_get(step, "tokens_per_s"));
    cells[9] = ddc_fmt_bytes(ddc_get(step, "peak_bytes"));
    cells[10] = ddc_fmt_count(ddc_get(step, "step_ms"));
    cells[11] = ddc_textf("%s/%s", ddc_fmt_count(ddc_get(step, "chunk")).s,
                          ddc_fmt_count(ddc_get(step, "vocab_tile")).s);
    return cells;
}

static int ddc_cmd_steps(ddc_ctx *ctx, const ddc_args *args)
{
    const ddc_value *after = &args->option[DDC_STEPS_AFTER], *limit = &args->option[DDC_STEPS_LIMIT];
    int csv = args->option[DDC_STEPS_CSV].given;
    char query[128] = "";
    size_t used = 0;
    if (after->given)
        used = (size_t)snprintf(query, sizeof query, "?after=%lld", after->count);
    if (limit->given)
        used += (size_t)snprintf(query + used, sizeof query - used, "%climit=%lld", used ? '&' : '?', limit->count);
    if (csv)
        snprintf(query + used, sizeof query - used, "%cformat=csv", used ? '&' : '?');
    char suffix[160], path[DDC_PATH_MAX];
    snprintf(suffix, sizeof suffix, "/steps%s", query);
    int rc = ddc_run_path(args->operand, suffix, path);
    if (rc)
        return rc;

    if (csv) { /* CSV: the daemon's text as it came */
        ddc_reply reply;
        if ((rc = ddc_call(ctx, "GET", path, NULL, 0, &reply)))
            return rc;
        if (reply.len)
            ddc_print_raw(&reply); /* adds the last line's newline when the daemon left it out */
        ddc_reply_free(&reply);
        return 0;
    }
    cJSON *root;
    if ((rc = ddc_request(ctx, "GET", path, NULL, 0, &root, NULL)) || !root)
        return rc;
    const cJSON *steps = ddc_get(root, "steps"), *step;
    if (cJSON_GetArraySize(steps) == 0) {
        puts("no steps");
        cJSON_Delete(root);
        return 0;
    }
    static const ddc_column columns[DDC_STEP_COLUMNS] = {
        {.header = "STEP", .width = 7},   {.header = "LOSS", .width = 9},    {.header = "CE", .width = 9},
        {.header = "KL", .width = 9},     {.header = "CAP", .width = 9},     {.header = "ACC", .width = 7},
        {.header = "LR", .width = 9},     {.header = "GRAD", .width = 9},    {.header = "TOK/S", .width = 10},
        {.header = "PEAK", .width = 9},   {.header = "STEP_MS", .width = 8}, {.header = "CHUNK/TILE"},
    };
    ddc_text cells[DDC_STEP_COLUMNS];
    ddc_table_header(columns, DDC_STEP_COLUMNS);
    cJSON_ArrayForEach(step, ddc_array(steps))
        ddc_table_row(columns, DDC_STEP_COLUMNS, ddc_step_cells(step, cells));
    cJSON_Delete(root);
    return 0;
}

static int ddc_print_events(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                            long status)
{
    const cJSON *events = ddc_get(root, "events"), *event;
    if (cJSON_GetArraySize(events) == 0) {
        puts("no events");
        return 0;
    }
    printf("%-19s  %-12s  %s\n", "TIME", "KIND", "DETAIL");
    cJSON_ArrayForEach(event, ddc_array(events)) {
        printf("%-19s  %-12s ", ddc_fmt_time(ddc_get(event, "ts_ms")).s, ddc_fmt_value(ddc_get(event, "kind")).s);
        /* detail {"from": "running", "to": "paused"} -> from=running to=paused */
        const cJSON *detail = ddc_get(event, "detail"), *entry;
        if (cJSON_IsObject(detail)) {
            cJSON_ArrayForEach(entry, detail) {
                if (ddc_string(entry)) /* a string may be a long error: print it whole */
                    printf(" %s=%s", entry->string ? entry->string : "?", entry->valuestring);
                else
                    printf(" %s=%s", entry->string ? entry->string : "?", ddc_fmt_value(entry).s);
            }
        } else if (detail && !cJSON_IsNull(detail)) {
            printf(" %s", ddc_fmt_value(detail).s);
        }
        puts("");
    }
    return 0;
}

static int ddc_cmd_events(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "GET", "/events", ddc_print_events);
}

/* ---------------------------------------------------------------------------------------------
 * nccl-id: rank 0's NCCL unique id, for the other daemons' "cluster" sections */

static int ddc_print_nccl_id(const ddc_ctx *ctx, const ddc_args *args, const char *path, const cJSON *root,
                             long status)
{
    const char *id = ddc_string(ddc_get(root, "nccl_unique_id"));
    if (!id) {
        fputs("ddtreectl: the answer to POST /nccl/unique-id has no \"nccl_unique_id\"\n", stderr);
        return 1;
    }
    puts(id);
    return 0;
}

static int ddc_cmd_nccl_id(ddc_ctx *ctx, const ddc_args *args)
{
    return ddc_one_request(ctx, args, "POST", "/nccl/unique-id", ddc_print_nccl_id);
}

/* ---------------------------------------------------------------------------------------------
 * The command table: the usage text lists the commands in this order */

const ddc_command ddc_commands[] = {
    {.name = "status", .run = ddc_cmd_status,
     .help = "the daemon: version, uptime, backend, devices, runs by state"},
    {.name = "runs", .run = ddc_cmd_runs,
     .options = {[DDC_RUNS_STATE] = {.name = "--state", .kind = DDC_OPT_STATE, .value_name = "S"}},
     .help = "list runs, newest first (S: queued, running, paused, completed, ...)"},
    {.name = "start", .operand = DDC_OPERAND_FILE, .run = ddc_cmd_start,
     .options = {[DDC_START_QUIET] = {.name = "--quiet", .kind = DDC_OPT_FLAG}},
     .help = "enqueue a run from a run config (FILE '-' reads stdin);\n"
             "prints the new run's id (only the id with --quiet)"},
    {.name = "show", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_show,
     .help = "one run: progress, losses, acceptance, memory, times"},
    {.name = "watch", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_watch,
     .options = {[DDC_WATCH_INTERVAL] = {.name = "--interval", .kind = DDC_OPT_SECONDS, .value_name = "SEC",
                                         .min = 0.05, .max = 3600, .default_value = 1}},
     .help = "follow a run until it ends (default every 1 s); exit 0 when\n"
             "it completes, 1 when it fails or is cancelled"},
    {.name = "pause", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_pause},
    {.name = "resume", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_resume},
    {.name = "cancel", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_cancel},
    {.name = "rechunk", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_rechunk,
     .options = {[DDC_RECHUNK_CHUNK] = {.name = "--chunk", .kind = DDC_OPT_COUNT, .value_name = "N"},
                 [DDC_RECHUNK_VOCAB_TILE] = {.name = "--vocab-tile", .kind = DDC_OPT_COUNT, .value_name = "M"}},
     .help = "change the loss chunking from the next step"},
    {.name = "speculate", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_speculate,
     .options = {[DDC_SPECULATE_STEP] = {.name = "--step", .kind = DDC_OPT_COUNT, .value_name = "N"},
                 [DDC_SPECULATE_PROMPTS] = {.name = "--prompts", .kind = DDC_OPT_COUNT, .value_name = "K"},
                 [DDC_SPECULATE_GEN_LEN] = {.name = "--gen-len", .kind = DDC_OPT_COUNT, .value_name = "G"},
                 [DDC_SPECULATE_TREE] = {.name = "--tree", .kind = DDC_OPT_COUNTS, .value_name = "K1,K2"}},
     .help = "speculative decoding of held-out prompts (SPEC.md 7) with the\n"
             "live weights or checkpoint N's, at the next step boundary"},
    {.name = "plan", .operand = DDC_OPERAND_FILE, .run = ddc_cmd_plan,
     .help = "the memory plan of a run config, without starting it"},
    {.name = "steps", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_steps,
     .options = {[DDC_STEPS_CSV] = {.name = "--csv", .kind = DDC_OPT_FLAG},
                 [DDC_STEPS_AFTER] = {.name = "--after", .kind = DDC_OPT_COUNT, .value_name = "S"},
                 [DDC_STEPS_LIMIT] = {.name = "--limit", .kind = DDC_OPT_COUNT, .value_name = "N"}},
     .help = "per-step records (--csv: the daemon's CSV as is)"},
    {.name = "events", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_events,
     .help = "state changes, re-chunks, OOM recoveries, checkpoints"},
    {.name = "export", .operand = DDC_OPERAND_RUN_ID, .run = ddc_cmd_export,
     .options = {[DDC_EXPORT_OUT] = {.name = "--out", .kind = DDC_OPT_DIR, .value_name = "DIR"}},
     .help = "the serving export of the live weights (else the newest checkpoint)\n"
             "into DIR; default runs/ID/exports/step-N, kept beside the final export"},
    {.name = "nccl-id", .run = ddc_cmd_nccl_id,
     .help = "a new NCCL unique id from this daemon (rank 0 of a run over\n"
             "several daemons: their configs' cluster.unique_id)"},
};

const size_t ddc_command_count = sizeof ddc_commands / sizeof ddc_commands[0];
