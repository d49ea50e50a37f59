/* ddtreectl.c: the entry point of ddtreectl, the command-line client of ddtreed (API.md,
 * "ddtreectl"): global options, the command table, and where to connect (the control socket by
 * default, or a TCP URL with $DDTREE_TOKEN as a bearer token). Exit status: 0 success, 1 the
 * daemon said no, 2 usage, 3 the daemon is unreachable. It holds no state between calls and
 * never starts the daemon.
 * Tested by hand against a scratch server and against ddtreed itself (client/README.md).
 */
#include "ddtreectl.h"

#include <curl/curl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DDC_VERSION
#define DDC_VERSION "unknown"
#endif

static const char ddc_usage_text[] =
    "usage: ddtreectl [--socket PATH | --url http://HOST:PORT] [--json] COMMAND [ARGS]\n"
    "\n"
    "commands:\n"
    "  status                         the daemon: version, uptime, backend, devices, runs by state\n"
    "  runs [--state S]               list runs (S: queued, running, paused, completed, ...)\n"
    "  start FILE [--quiet]           enqueue a run from a run config (FILE '-' reads stdin);\n"
    "                                 prints the new run's id (only the id with --quiet)\n"
    "  show ID                        one run: progress, losses, acceptance, memory, times\n"
    "  watch ID [--interval SEC]      follow a run until it ends (default every 1 s); exit 0 when\n"
    "                                 it completes, 1 when it fails or is cancelled\n"
    "  pause ID | resume ID | cancel ID\n"
    "  rechunk ID [--chunk N] [--vocab-tile M]\n"
    "                                 change the loss chunking from the next step\n"
    "  plan FILE                      the memory plan of a run config, without starting it\n"
    "  steps ID [--csv] [--after S] [--limit N]\n"
    "                                 per-step records (--csv: the daemon's CSV as is)\n"
    "  events ID                      state changes, re-chunks, OOM recoveries, checkpoints\n"
    "  export ID                      write the serving export of the latest checkpoint\n"
    "  nccl-id                        a new NCCL unique id from this daemon (rank 0 of a run over\n"
    "                                 several daemons: their configs' cluster.unique_id)\n"
    "\n"
    "options:\n"
    "  --socket PATH   the control socket (default $DDTREE_SOCKET, else " DDC_DEFAULT_SOCKET ")\n"
    "  --url URL       talk TCP to http://HOST:PORT instead, sending $DDTREE_TOKEN as a bearer token\n"
    "  --json          print the daemon's JSON as it came\n"
    "  --help, --version\n"
    "\n"
    "exit status: 0 success, 1 the daemon said no (its message printed), 2 usage, 3 daemon unreachable\n";

void ddc_usage(FILE *out)
{
    fputs(ddc_usage_text, out);
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

static const struct ddc_command {
    const char *name;
    ddc_command_fn run;
} ddc_commands[] = {
    {"status", ddc_cmd_status}, {"runs", ddc_cmd_runs},       {"start", ddc_cmd_start},
    {"show", ddc_cmd_show},     {"watch", ddc_cmd_watch},     {"pause", ddc_cmd_pause},
    {"resume", ddc_cmd_resume}, {"cancel", ddc_cmd_cancel},   {"rechunk", ddc_cmd_rechunk},
    {"plan", ddc_cmd_plan},     {"steps", ddc_cmd_steps},     {"events", ddc_cmd_events},
    {"export", ddc_cmd_export}, {"nccl-id", ddc_cmd_nccl_id},
};

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

int main(int argc, char **argv)
{
    ddc_ctx ctx = {0};
    const char *env_socket = getenv("DDTREE_SOCKET");
    const char *socket_path = env_socket && *env_socket ? env_socket : DDC_DEFAULT_SOCKET;
    const char *url = NULL;
    int socket_given = 0;

    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *value = NULL;
        int got;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            ddc_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--version")) {
            printf("ddtreectl %s\n", DDC_VERSION);
            return 0;
        } else if (!strcmp(argv[i], "--json")) {
            ctx.json = 1;
        } else if (!strcmp(argv[i], "--quiet") || !strcmp(argv[i], "-q")) {
            ctx.quiet = 1;
        } else if ((got = ddc_option_value(argc, argv, &i, "--socket", &value)) != 0) {
            if (got < 0 || !*value)
                return ddc_usage_error("--socket wants a path");
            socket_path = value;
            socket_given = 1;
        } else if ((got = ddc_option_value(argc, argv, &i, "--url", &value)) != 0) {
            if (got < 0 || !*value)
                return ddc_usage_error("--url wants http://HOST:PORT");
            url = value;
        } else {
            return ddc_usage_error("unknown option %s", argv[i]);
        }
    }
    if (i >= argc)
        return ddc_usage_error("no command given");
    const struct ddc_command *command = NULL;
    for (size_t k = 0; k < sizeof ddc_commands / sizeof ddc_commands[0]; k++)
        if (!strcmp(argv[i], ddc_commands[k].name))
            command = &ddc_commands[k];
    if (!command)
        return ddc_usage_error("unknown command '%s'", argv[i]);
    if (url && socket_given)
        return ddc_usage_error("give --socket or --url, not both");
    if (url && strncmp(url, "http://", 7) && strncmp(url, "https://", 8))
        return ddc_usage_error("--url %s: want http://HOST:PORT", url);
    const char *token = getenv("DDTREE_TOKEN");
    if (url && token && strpbrk(token, "\r\n")) {
        fputs("ddtreectl: DDTREE_TOKEN holds a line break; it cannot be sent as a header\n", stderr);
        return 2;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT)) {
        fputs("ddtreectl: libcurl failed to initialise\n", stderr);
        return 1;
    }
    ctx.where = url ? url : socket_path;
    ctx.http = ddc_http_open(url ? NULL : socket_path, url, token);
    int rc;
    if (!ctx.http) {
        fputs("ddtreectl: out of memory\n", stderr);
        rc = 1;
    } else {
        rc = command->run(&ctx, argc - i, argv + i);
    }
    ddc_http_close(ctx.http);
    curl_global_cleanup();
    return rc;
}
