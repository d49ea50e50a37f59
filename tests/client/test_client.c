/* test_client.c: ddtreectl's parts that need no daemon: the formatters and the sparkline
 * (format.c), a table's alignment, and what command_line.c derives from the command table: the
 * usage lines and every option kind's values and refusals (exit status 2 and the message). The
 * requests are tests/daemon/api_e2e.py's business (the real client against the real daemon).
 * Exit 0 all passed, 1 a failure (each one printed).
 */
#include "ddtreectl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int failures;

#define CHECK(cond, ...)                                                                            \
    do {                                                                                            \
        if (!(cond)) {                                                                              \
            fprintf(stderr, "%s:%d: ", __FILE__, __LINE__);                                         \
            fprintf(stderr, __VA_ARGS__);                                                           \
            fputs("\n", stderr);                                                                    \
            failures++;                                                                             \
        }                                                                                           \
    } while (0)

#define CHECK_TEXT(got, want) check_text(__LINE__, (got), (want))

static void check_text(int line, const char *got, const char *want)
{
    if (strcmp(got, want)) {
        fprintf(stderr, "%s:%d: got '%s', want '%s'\n", __FILE__, line, got, want);
        failures++;
    }
}

/* ---------------------------------------------------------------------------------------------
 * What a piece of code wrote to stdout or stderr */

typedef struct capture {
    int fd, saved;
    FILE *file;
    char text[16384];
} capture;

static void capture_begin(capture *c, int fd)
{
    fflush(fd == 1 ? stdout : stderr);
    c->fd = fd;
    c->file = tmpfile();
    c->saved = dup(fd);
    dup2(fileno(c->file), fd);
}

static const char *capture_end(capture *c)
{
    fflush(c->fd == 1 ? stdout : stderr);
    dup2(c->saved, c->fd);
    close(c->saved);
    rewind(c->file);
    size_t n = fread(c->text, 1, sizeof c->text - 1, c->file);
    c->text[n] = '\0';
    fclose(c->file);
    return c->text;
}

/* ---------------------------------------------------------------------------------------------
 * format.c */

static void test_formatters(void)
{
    static const struct {
        ddc_text (*format)(const cJSON *);
        const char *json, *want;
    } cases[] = {
        {ddc_fmt_thousands, "12345.6", "12,346"},
        {ddc_fmt_thousands, "-1234567", "-1,234,567"},
        {ddc_fmt_thousands, "999", "999"},
        {ddc_fmt_thousands, "\"12\"", "-"}, /* a string is not a number */
        {ddc_fmt_bytes, "999", "999 B"},
        {ddc_fmt_bytes, "406700", "406.7 kB"},
        {ddc_fmt_bytes, "10100000", "10.1 MB"},
        {ddc_fmt_bytes, "25280000000", "25.28 GB"},
        /* decimal units, as the planner prints them; tests/daemon/ui_browser_test.mjs holds the
         * web view's ddtree.bytes to this same table */
        {ddc_fmt_bytes, "0", "0 B"},
        {ddc_fmt_bytes, "1000", "1.0 kB"},
        {ddc_fmt_bytes, "1048576", "1.0 MB"},
        {ddc_fmt_bytes, "423566", "423.6 kB"},
        {ddc_fmt_bytes, "149000000000", "149.00 GB"},
        {ddc_fmt_bytes, "null", "-"},
        {ddc_fmt_value, "42", "42"},
        {ddc_fmt_value, "0.5", "0.5"},
        {ddc_fmt_value, "\"queued\"", "queued"},
        {ddc_fmt_value, "true", "true"},
        {ddc_fmt_value, "{\"a\": [1, 2]}", "{\"a\":[1,2]}"},
        {ddc_fmt_value, "null", "-"},
        {ddc_fmt_count, "7.6", "8"},
        {ddc_fmt_time, "0", "-"},
        {ddc_step_of_max, "{\"step\": 120, \"max_steps\": 1500}", "120/1500"},
        {ddc_step_of_max, "{\"step\": null}", "-/-"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cJSON *item = cJSON_Parse(cases[k].json);
        CHECK_TEXT(cases[k].format(item).s, cases[k].want);
        cJSON_Delete(item);
    }

    cJSON *loss = cJSON_CreateNumber(5.1);
    CHECK_TEXT(ddc_fmt_real(loss, 4).s, "5.1");
    CHECK_TEXT(ddc_fmt_fixed_width_real(loss, 3).s, "5.10");
    cJSON_Delete(loss);

    CHECK_TEXT(ddc_duration_text(59.4).s, "59s");
    CHECK_TEXT(ddc_duration_text(70).s, "1m10s");
    CHECK_TEXT(ddc_duration_text(7384).s, "2h03m");
    CHECK_TEXT(ddc_duration_text(90000).s, "1d01h");
    CHECK_TEXT(ddc_duration_text(-1).s, "-");
}

/* ddtreectl runs: newest first by created_ms, a later one of the same time first, none last */
static void test_runs_order(void)
{
    cJSON *runs = cJSON_Parse("[{\"id\": \"a\", \"created_ms\": 1}, {\"id\": \"b\", \"created_ms\": 3},"
                              " {\"id\": \"c\", \"created_ms\": 2}, {\"id\": \"e\"},"
                              " {\"id\": \"d\", \"created_ms\": 3}]");
    const cJSON *order[8];
    int n = ddc_runs_newest_first(runs, order, 8);
    char ids[16] = "";
    for (int k = 0; k < n; k++)
        strcat(ids, ddc_string(ddc_get(order[k], "id")));
    CHECK_TEXT(ids, "dbcae");
    CHECK(ddc_runs_newest_first(runs, order, 2) == 2, "a cap of 2 put more than 2 runs");
    cJSON_Delete(runs);
}

static void test_sparkline(void)
{
    char out[64];
    double rising[] = {1, 2, 3, 4, 5, 6, 7, 8};
    ddc_sparkline(rising, 8, out, sizeof out);
    CHECK_TEXT(out, "▁▂▃▄▅▆▇█");
    double gap[] = {2, NAN, 1};
    ddc_sparkline(gap, 3, out, sizeof out);
    CHECK_TEXT(out, "█ ▁");
    double flat[] = {3, 3};
    ddc_sparkline(flat, 2, out, sizeof out);
    CHECK_TEXT(out, "▄▄");
    ddc_sparkline(rising, 8, out, 9); /* room for two bars and the NUL */
    CHECK_TEXT(out, "▁▂");
    ddc_sparkline(rising, 0, out, sizeof out);
    CHECK_TEXT(out, "");
}

static void test_table(void)
{
    ddc_column columns[] = {
        {.header = "ID", .left = 1, .fit = 1}, {.header = "N", .width = 4}, {.header = "NAME"}};
    ddc_text rows[2][3] = {{{"r1"}, {"7"}, {"a"}}, {{"r-long"}, {"12345"}, {"b"}}};
    ddc_table_fit(columns, 3, rows[0]);
    ddc_table_fit(columns, 3, rows[1]);
    CHECK(columns[0].width == 6 && columns[1].width == 4, "widths %d %d", columns[0].width, columns[1].width);
    capture c;
    capture_begin(&c, 1);
    ddc_table_header(columns, 3);
    ddc_table_row(columns, 3, rows[0]);
    ddc_table_row(columns, 3, rows[1]);
    const char *printed = capture_end(&c);
    /* a fixed column is not widened: its long cell pushes only its own row */
    CHECK_TEXT(printed, "ID         N  NAME\n"
                                "r1         7  a\n"
                                "r-long  12345  b\n");
}

/* ---------------------------------------------------------------------------------------------
 * command_line.c: the usage text and the arguments */

static void test_usage(void)
{
    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    ddc_usage(out);
    fclose(out);
    static const char *const lines[] = {
        "\n  status                         the daemon: version, uptime, backend, devices, runs by state\n",
        "\n  runs [--state S]               list runs",
        "\n  start FILE [--quiet]           enqueue a run from a run config (FILE '-' reads stdin);\n"
        "                                 prints the new run's id (only the id with --quiet)\n",
        "\n  watch ID [--interval SEC]      follow a run",
        "\n  pause ID | resume ID | cancel ID\n",
        "\n  rechunk ID [--chunk N] [--vocab-tile M]\n                                 change the loss chunking",
        "\n  steps ID [--csv] [--after S] [--limit N]\n                                 per-step records",
        "\n  speculate ID [--step N] [--prompts K] [--gen-len G] [--tree K1,K2]\n",
        "\n  nccl-id                        a new NCCL unique id",
        "\n  --socket PATH   the control socket",
    };
    for (size_t k = 0; k < sizeof lines / sizeof lines[0]; k++)
        CHECK(strstr(text, lines[k]), "the usage lacks '%s':\n%s", lines[k], text);
    for (size_t k = 0; k < ddc_command_count; k++) {
        char line[64];
        snprintf(line, sizeof line, "  %s", ddc_commands[k].name);
        CHECK(strstr(text, line) || ddc_commands[k].help == NULL, "the usage lacks %s", ddc_commands[k].name);
    }
    free(text);
}

/* parses the command line (its words split at spaces); the exit status, what stderr said */
static int parse(const char *line, ddc_ctx *ctx, ddc_args *args, char *said, size_t said_len)
{
    char copy[256], *argv[16];
    int argc = 0;
    snprintf(copy, sizeof copy, "%s", line);
    for (char *word = strtok(copy, " "); word && argc < 16; word = strtok(NULL, " "))
        argv[argc++] = word;
    const ddc_command *command = ddc_find_command(argv[0]);
    if (!command) {
        snprintf(said, said_len, "no command %s", argv[0]);
        return -1;
    }
    capture out, err;
    capture_begin(&out, 1);
    capture_begin(&err, 2);
    int rc = ddc_parse_args(ctx, command, argc, argv, args);
    const char *err_text = capture_end(&err);
    capture_end(&out);
    /* only the first line: the usage text follows every refusal */
    memcpy(said, err_text, said_len - 1);
    said[said_len - 1] = '\0';
    said[strcspn(said, "\n")] = '\0';
    return rc;
}

static void test_arguments(void)
{
    ddc_ctx ctx = {0};
    ddc_args args;
    char said[512];

    CHECK(parse("steps r1 --after=3 --csv --limit 4", &ctx, &args, said, sizeof said) == 0, "%s", said);
    CHECK_TEXT(args.operand, "r1");
    CHECK(args.option[0].given && !args.option[0].text, "--csv");
    CHECK(args.option[1].given && args.option[1].count == 3, "--after %lld", args.option[1].count);
    CHECK(args.option[2].given && args.option[2].count == 4, "--limit %lld", args.option[2].count);

    CHECK(parse("watch r1", &ctx, &args, said, sizeof said) == 0, "%s", said);
    CHECK(!args.option[DDC_WATCH_INTERVAL].given && args.option[DDC_WATCH_INTERVAL].seconds == 1,
          "the default interval is %g", args.option[DDC_WATCH_INTERVAL].seconds);
    CHECK(parse("watch --interval 0.2 r1", &ctx, &args, said, sizeof said) == 0, "%s", said);
    double interval = args.option[DDC_WATCH_INTERVAL].seconds;
    CHECK(interval == 0.2, "interval %g", interval);

    CHECK(parse("start - --json -q", &ctx, &args, said, sizeof said) == 0, "%s", said);
    CHECK_TEXT(args.operand, "-");
    CHECK(ctx.json && ctx.quiet, "--json and -q after the command are the context's");
    ctx = (ddc_ctx){0};
    CHECK(parse("start run.json --quiet", &ctx, &args, said, sizeof said) == 0 && args.option[0].given,
          "start's own --quiet: %s", said);

    CHECK(parse("speculate r1 --step 200 --tree 8,32 --gen-len=16", &ctx, &args, said, sizeof said) == 0, "%s", said);
    CHECK(args.option[0].given && args.option[0].count == 200 && !args.option[1].given, "speculate --step");
    CHECK(args.option[2].given && args.option[2].count == 16, "speculate --gen-len");
    CHECK(args.option[3].given && !strcmp(args.option[3].text, "8,32"), "speculate --tree");

    CHECK(parse("show r1 --help", &ctx, &args, said, sizeof said) == 0 && args.help, "--help");
    CHECK(parse("runs --state=running", &ctx, &args, said, sizeof said) == 0, "%s", said);
    CHECK_TEXT(args.option[0].text, "running");

    static const struct {
        const char *line, *said;
    } refused[] = {
        {"steps r1 --after x", "ddtreectl: steps: --after wants a non-negative integer, not 'x'"},
        {"rechunk r1 --chunk -1", "ddtreectl: rechunk: --chunk wants a non-negative integer, not '-1'"},
        {"rechunk r1 --vocab-tile", "ddtreectl: rechunk: --vocab-tile wants a value"},
        /* --tree: positive integers and commas only (the text goes into the JSON body as is) */
        {"speculate r1 --tree 8,,32", "ddtreectl: speculate: --tree wants 1 to 8 positive integers separated by commas, not '8,,32'"},
        {"speculate r1 --tree +8", "ddtreectl: speculate: --tree wants 1 to 8 positive integers separated by commas, not '+8'"},
        {"speculate r1 --tree 0", "ddtreectl: speculate: --tree wants 1 to 8 positive integers separated by commas, not '0'"},
        {"speculate r1 --tree 8,", "ddtreectl: speculate: --tree wants 1 to 8 positive integers separated by commas, not '8,'"},
        {"speculate r1 --tree 1,2,3,4,5,6,7,8,9", "ddtreectl: speculate: --tree wants 1 to 8 positive integers separated by commas, not '1,2,3,4,5,6,7,8,9'"},
        {"watch r1 --interval 0.01", "ddtreectl: watch: --interval wants seconds between 0.05 and 3600, not '0.01'"},
        {"watch r1 --interval 1x", "ddtreectl: watch: --interval wants seconds between 0.05 and 3600, not '1x'"},
        {"runs --state=", "ddtreectl: runs: --state wants a run state (queued, running, paused, ...)"},
        {"show", "ddtreectl: show: missing ID"},
        {"plan", "ddtreectl: plan: missing FILE"},
        {"show r1 r2", "ddtreectl: show: unexpected argument 'r2'"},
        {"status now", "ddtreectl: status: unexpected argument 'now'"},
        {"show r1 --csv", "ddtreectl: show: unknown option --csv"},
        {"steps r1 --csv=1", "ddtreectl: steps: unknown option --csv=1"},
        /* the operand is checked before the values, as it was read first */
        {"steps --after x", "ddtreectl: steps: missing ID"},
    };
    for (size_t k = 0; k < sizeof refused / sizeof refused[0]; k++) {
        int rc = parse(refused[k].line, &ctx, &args, said, sizeof said);
        CHECK(rc == 2, "'%s': exit %d, want 2", refused[k].line, rc);
        CHECK_TEXT(said, refused[k].said);
    }
}

int main(void)
{
    test_formatters();
    test_runs_order();
    test_sparkline();
    test_table();
    test_usage();
    test_arguments();
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    else
        puts("test_client: all passed");
    return failures ? 1 : 0;
}
