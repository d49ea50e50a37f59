/* command_line.c: what ddtreectl derives from its command table (commands.c): the usage text
 * (each command's synopsis from its operand and options, its help beside it) and the parsing of
 * a command's arguments: at most one operand and the command's options, in any order, each
 * value checked by its kind before the handler runs, plus --json, --quiet (-q) and --help (-h),
 * which every command understands. No command parses its own argv.
 * Tested by tests/client/test_client.c (the usage lines, every kind's values and refusals) and by
 * tests/daemon/api_e2e.py (usage errors exit 2).
 */
#include "ddtreectl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * The usage text */

enum { DDC_HELP_COLUMN = 33 }; /* where a command's help starts: "  " and a 30-wide synopsis, " " */

static const char ddc_usage_head[] =
    "usage: ddtreectl [--socket PATH | --url http://HOST:PORT] [--json] COMMAND [ARGS]\n"
    "\n"
    "commands:\n";

/* the global options: main.c reads them */
static const char ddc_usage_tail[] =
    "\n"
    "options:\n"
    "  --socket PATH   the control socket (default $DDTREE_SOCKET, else " DDC_DEFAULT_SOCKET ")\n"
    "  --url URL       talk TCP to http://HOST:PORT instead, sending $DDTREE_TOKEN as a bearer token\n"
    "  --json          print the daemon's JSON as it came\n"
    "  --help, --version\n"
    "\n"
    "exit status: 0 success, 1 the daemon said no (its message printed), 2 usage, 3 daemon unreachable\n";

static const char *const ddc_operand_names[] = {
    [DDC_OPERAND_NONE] = NULL,
    [DDC_OPERAND_RUN_ID] = "ID",
    [DDC_OPERAND_FILE] = "FILE",
};

/* "steps ID [--csv] [--after S] [--limit N]" */
static void ddc_synopsis(const ddc_command *command, char *out, size_t out_len)
{
    const char *operand = ddc_operand_names[command->operand];
    size_t used =
        (size_t)snprintf(out, out_len, "%s%s%s", command->name, operand ? " " : "", operand ? operand : "");
    for (int k = 0; k < DDC_MAX_OPTIONS && command->options[k].name && used < out_len; k++) {
        const ddc_option *option = &command->options[k];
        used += (size_t)snprintf(out + used, out_len - used, " [%s%s%s]", option->name,
                                 option->value_name ? " " : "", option->value_name ? option->value_name : "");
    }
}

/* the help's lines, the first after the synopsis (or under it when the synopsis is too wide) */
static void ddc_usage_command(FILE *out, const char *synopsis, const char *help)
{
    if ((int)strlen(synopsis) < DDC_HELP_COLUMN - 2)
        fprintf(out, "  %-*s", DDC_HELP_COLUMN - 2, synopsis);
    else
        fprintf(out, "  %s\n%*s", synopsis, DDC_HELP_COLUMN, "");
    for (const char *line = help;;) {
        int n = (int)strcspn(line, "\n");
        fprintf(out, "%.*s\n", n, line);
        if (!line[n])
            break;
        line += n + 1;
        fprintf(out, "%*s", DDC_HELP_COLUMN, "");
    }
}

void ddc_usage(FILE *out)
{
    fputs(ddc_usage_head, out);
    for (size_t k = 0; k < ddc_command_count; k++) {
        char synopsis[160];
        ddc_synopsis(&ddc_commands[k], synopsis, sizeof synopsis);
        if (ddc_commands[k].help) {
            ddc_usage_command(out, synopsis, ddc_commands[k].help);
            continue;
        }
        /* commands without a help: one line, "pause ID | resume ID | cancel ID" */
        fprintf(out, "  %s", synopsis);
        while (k + 1 < ddc_command_count && !ddc_commands[k + 1].help) {
            ddc_synopsis(&ddc_commands[++k], synopsis, sizeof synopsis);
            fprintf(out, " | %s", synopsis);
        }
        fputs("\n", out);
    }
    fputs(ddc_usage_tail, out);
}

int ddc_usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("ddtreectl: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputs("\n", stderr);
    va_end(ap);
    ddc_usage(stderr);
    return 2;
}

/* ---------------------------------------------------------------------------------------------
 * A command's arguments */

const ddc_command *ddc_find_command(const char *name)
{
    for (size_t k = 0; k < ddc_command_count; k++)
        if (!strcmp(name, ddc_commands[k].name))
            return &ddc_commands[k];
    return NULL;
}

int ddc_option_value(int argc, char **argv, int *i, const char *name, const char **value)
{
    size_t n = strlen(name);
    if (strncmp(argv[*i], name, n))
        return 0;
    if (argv[*i][n] == '=') {
        *value = argv[*i] + n + 1;
        return 1;
    }
    if (argv[*i][n])
        return 0;
    if (*i + 1 >= argc)
        return -1;
    *value = argv[++*i];
    return 1;
}

/* argv[*i] as one of the command's options: 1 when it is one (and its value taken), 0 when it is
 * none of them, 2 when its value is missing (said) */
static int ddc_take_option(const ddc_command *command, int argc, char **argv, int *i, ddc_args *args)
{
    for (int k = 0; k < DDC_MAX_OPTIONS && command->options[k].name; k++) {
        const ddc_option *option = &command->options[k];
        if (option->kind == DDC_OPT_FLAG) {
            if (strcmp(argv[*i], option->name))
                continue;
            args->option[k].given = 1;
            return 1;
        }
        int got = ddc_option_value(argc, argv, i, option->name, &args->option[k].text);
        if (got < 0)
            return ddc_usage_error("%s: %s wants a value", command->name, option->name);
        if (got) {
            args->option[k].given = 1;
            return 1;
        }
    }
    return 0;
}

/* the value of option k by its kind, once the whole command line was read; 2 when it is not one
 * (said) */
static int ddc_check_value(const ddc_command *command, int k, ddc_value *value)
{
    const ddc_option *option = &command->options[k];
    const char *text = value->text;
    char *end;
    switch (option->kind) {
    case DDC_OPT_COUNT:
        errno = 0;
        value->count = strtoll(text, &end, 10);
        if (errno || end == text || *end || value->count < 0)
            return ddc_usage_error("%s: %s wants a non-negative integer, not '%s'", command->name, option->name,
                                   text);
        return 0;
    case DDC_OPT_SECONDS:
        value->seconds = strtod(text, &end);
        if (end == text || *end || !(value->seconds >= option->min && value->seconds <= option->max))
            return ddc_usage_error("%s: %s wants seconds between %g and %g, not '%s'", command->name,
                                   option->name, option->min, option->max, text);
        return 0;
    case DDC_OPT_STATE: {
        char escaped[DDC_QUERY_VALUE_MAX];
        if (!*text || ddc_escape(text, escaped, sizeof escaped))
            return ddc_usage_error("%s: %s wants a run state (queued, running, paused, ...)", command->name,
                                   option->name);
        return 0;
    }
    case DDC_OPT_COUNTS: {
        int n = 0;
        for (const char *at = text;; at = end + 1) {
            errno = 0;
            long long budget = strtoll(at, &end, 10);
            if (errno || *at < '0' || *at > '9' || end == at || budget < 1 || ++n > 8 || (*end && *end != ','))
                return ddc_usage_error("%s: %s wants 1 to 8 positive integers separated by commas, not '%s'",
                                       command->name, option->name, text);
            if (!*end)
                return 0;
        }
    }
    case DDC_OPT_DIR: {
        char cwd[2048];
        int n = !*text ? -1
                : text[0] == '/' ? snprintf(value->path, sizeof value->path, "%s", text)
                : getcwd(cwd, sizeof cwd) ? snprintf(value->path, sizeof value->path, "%s/%s", cwd, text) : -1;
        if (n < 0 || n >= (int)sizeof value->path)
            return ddc_usage_error("%s: %s wants a directory, not '%s'", command->name, option->name, text);
        return 0;
    }
    case DDC_OPT_FLAG:
        return 0;
    }
    return 0;
}

int ddc_parse_args(ddc_ctx *ctx, const ddc_command *command, int argc, char **argv, ddc_args *args)
{
    memset(args, 0, sizeof *args);
    args->command = command;
    for (int k = 0; k < DDC_MAX_OPTIONS && command->options[k].name; k++)
        args->option[k].seconds = command->options[k].default_value;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            ddc_usage(stdout);
            args->help = 1;
            return 0;
        }
        if (arg[0] == '-' && arg[1]) { /* "-" alone is an operand: stdin */
            int taken = ddc_take_option(command, argc, argv, &i, args);
            if (taken == 2)
                return 2;
            if (taken)
                continue;
            if (!strcmp(arg, "--json"))
                ctx->json = 1;
            else if (!strcmp(arg, "--quiet") || !strcmp(arg, "-q"))
                ctx->quiet = 1;
            else
                return ddc_usage_error("%s: unknown option %s", command->name, arg);
            continue;
        }
        if (command->operand == DDC_OPERAND_NONE || args->operand)
            return ddc_usage_error("%s: unexpected argument '%s'", command->name, arg);
        args->operand = arg;
    }
    if (command->operand != DDC_OPERAND_NONE && (!args->operand || !*args->operand))
        return ddc_usage_error("%s: missing %s", command->name, ddc_operand_names[command->operand]);
    for (int k = 0; k < DDC_MAX_OPTIONS && command->options[k].name; k++) {
        int rc = args->option[k].given ? ddc_check_value(command, k, &args->option[k]) : 0;
        if (rc)
            return rc;
    }
    return 0;
}
