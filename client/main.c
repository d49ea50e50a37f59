/* main.c: the entry point of ddtreectl, the command-line client of ddtreed (API.md,
 * "ddtreectl"): the global options, the command by its name in the table (commands.c), where to
 * connect (the control socket by default, or a TCP URL with $DDTREE_TOKEN as a bearer token),
 * then the command's arguments (command_line.c) and its handler. Exit status: 0 success, 1 the
 * daemon said no, 2 usage, 3 the daemon is unreachable. It holds no state between calls and
 * never starts the daemon.
 * Tested by tests/daemon/api_e2e.py against ddtreed itself (--socket, --url with and without the token,
 * no command, an unknown one) and by hand against a scratch server (client/README.md).
 */
#include "ddtreectl.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef DDC_VERSION
#define DDC_VERSION "unknown"
#endif

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
    const ddc_command *command = ddc_find_command(argv[i]);
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
        /* after the connection's checks, as the command's own usage errors always came */
        ddc_args args;
        rc = ddc_parse_args(&ctx, command, argc - i, argv + i, &args);
        if (!rc && !args.help)
            rc = command->run(&ctx, &args);
    }
    ddc_http_close(ctx.http);
    curl_global_cleanup();
    return rc;
}
