/* ddtreectl.h: what the three files of ddtreectl share: the HTTP transport (http_client.c), the
 * commands (commands.c) and the entry point with its usage text (ddtreectl.c). Nothing here is
 * a library for others: the client is one executable and links no engine code.
 * Tested by hand against a scratch server and against ddtreed itself (client/README.md).
 */
#ifndef DDC_DDTREECTL_H
#define DDC_DDTREECTL_H

#include <stdio.h>
#include <stddef.h>

#define DDC_DEFAULT_SOCKET "/run/ddtreed/api.sock"
#define DDC_MAX_FILE_BYTES ((size_t)1 << 20) /* API.md: request bodies are at most 1 MiB */

/* ---------------------------------------------------------------------------------------------
 * Transport (http_client.c) */

typedef struct ddc_http ddc_http;

/* One answer of the daemon, whatever its status. body is NUL-terminated (never NULL after an
 * answer) and len excludes the NUL. */
typedef struct ddc_reply {
    long status;
    char *body;
    size_t len;
    size_t cap;
} ddc_reply;

enum {
    DDC_HTTP_ANSWERED = 0,     /* an HTTP status came back (2xx or not) */
    DDC_HTTP_UNREACHABLE = -1, /* no connection, or it broke or timed out: exit status 3 */
    DDC_HTTP_FAILED = -2,      /* a local failure (memory, an answer over the cap): exit status 1 */
};

/* socket_path is used when base_url is NULL; token (may be NULL) is sent only over TCP. */
ddc_http *ddc_http_open(const char *socket_path, const char *base_url, const char *token);
void ddc_http_close(ddc_http *http);
/* method "GET" or "POST"; path starts with '/' and carries the query. err says why on failure. */
int ddc_http_request(ddc_http *http, const char *method, const char *path, const char *body,
                     size_t body_len, ddc_reply *reply, char *err, size_t err_len);
void ddc_reply_free(ddc_reply *reply);

/* ---------------------------------------------------------------------------------------------
 * Commands (commands.c) */

typedef struct ddc_ctx {
    const char *where; /* the socket path or the URL, for "cannot reach" */
    ddc_http *http;
    int json;          /* print the daemon's JSON as it came */
    int quiet;         /* start: only the id */
    int line_open;     /* watch left a progress line on the terminal without its newline */
} ddc_ctx;

/* Each takes argv[0] = the command's name and returns the exit status (0, 1, 2 or 3). */
typedef int (*ddc_command_fn)(ddc_ctx *ctx, int argc, char **argv);

int ddc_cmd_status(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_runs(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_start(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_show(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_watch(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_pause(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_resume(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_cancel(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_rechunk(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_plan(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_steps(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_events(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_export(ddc_ctx *ctx, int argc, char **argv);
int ddc_cmd_nccl_id(ddc_ctx *ctx, int argc, char **argv);

/* ---------------------------------------------------------------------------------------------
 * Usage (ddtreectl.c) */

void ddc_usage(FILE *out);
/* Prints "ddtreectl: <why>" and the usage text to stderr; returns 2. */
int ddc_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* argv[*i] as "--name VALUE" (consumes both) or "--name=VALUE": 1 with *value set, 0 when it is
 * not this option, -1 when the value is missing. */
int ddc_option_value(int argc, char **argv, int *i, const char *name, const char **value);

#endif
