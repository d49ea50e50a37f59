/* api_client.c: requests to the daemon's routes (API.md, "Endpoints") on top of http_client.c:
 * the paths of a run (its id percent-encoded), a run config file as a body, answers as JSON
 * objects or, with --json, as they came; and what the daemon said no with, turned into API.md's
 * message and exit status: `ddtreectl: <message> (<code>[, field <field>])` and 1, `cannot reach
 * ddtreed at ...` and 3. It does not retry, cache or guess: a failed request ends the command.
 * Tested by tests/daemon/api_e2e.py against ddtreed itself (error bodies, a dead or missing socket, TCP
 * with and without the token) and by hand against a scratch server (client/README.md).
 */
#include "ddtreectl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------------
 * Requests and their failures */

/* watch leaves its progress line open on a terminal: close it before anything else is said */
void ddc_end_line(ddc_ctx *ctx)
{
    if (ctx->line_open) {
        fputs("\n", stdout);
        fflush(stdout);
        ctx->line_open = 0;
    }
}

/* "ddtreectl: <message> (<code>[, field <field>])" from API.md's error body, or the status and
 * the first line of whatever came instead (a proxy's page, say). */
static void ddc_print_daemon_error(const ddc_reply *reply)
{
    cJSON *root = cJSON_ParseWithLength(reply->body, reply->len);
    const cJSON *error = ddc_get(root, "error");
    const char *message = ddc_string(ddc_get(error, "message"));
    const char *code = ddc_string(ddc_get(error, "code"));
    const char *field = ddc_string(ddc_get(error, "field"));
    if (message || code) {
        fprintf(stderr, "ddtreectl: %s (", message ? message : "the daemon refused");
        if (code)
            fputs(code, stderr);
        else
            fprintf(stderr, "HTTP %ld", reply->status);
        if (field)
            fprintf(stderr, ", field %s", field);
        fputs(")\n", stderr);
    } else {
        int n = (int)strcspn(reply->body, "\r\n");
        if (n > 200)
            n = 200;
        fprintf(stderr, "ddtreectl: HTTP %ld from ddtreed%s%.*s\n", reply->status, n ? ": " : "", n,
                reply->body);
    }
    cJSON_Delete(root);
}

int ddc_call(ddc_ctx *ctx, const char *method, const char *path, const char *body, size_t body_len,
             ddc_reply *reply)
{
    char err[512];
    int rc = ddc_http_request(ctx->http, method, path, body, body_len, reply, err, sizeof err);
    if (rc == DDC_HTTP_UNREACHABLE) {
        ddc_end_line(ctx);
        fprintf(stderr, "ddtreectl: cannot reach ddtreed at %s: %s; is it running?\n", ctx->where, err);
        return 3;
    }
    if (rc != DDC_HTTP_ANSWERED) {
        ddc_end_line(ctx);
        fprintf(stderr, "ddtreectl: %s\n", err);
        return 1;
    }
    if (reply->status >= 200 && reply->status < 300)
        return 0;
    ddc_end_line(ctx);
    ddc_print_daemon_error(reply);
    ddc_reply_free(reply);
    return 1;
}

/* The answer as a JSON object (an empty body, as a bare 202 may have, is an empty object);
 * NULL, having said so, when it is anything else. */
static cJSON *ddc_parse_object(ddc_ctx *ctx, const ddc_reply *reply, const char *method, const char *path)
{
    if (reply->body[strspn(reply->body, " \t\r\n")] == '\0')
        return cJSON_CreateObject();
    cJSON *root = cJSON_ParseWithLengthOpts(reply->body, reply->len + 1, NULL, 1);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        ddc_end_line(ctx);
        fprintf(stderr, "ddtreectl: the answer to %s %s is not a JSON object (HTTP %ld)\n", method, path,
                reply->status);
        return NULL;
    }
    return root;
}

void ddc_print_raw(const ddc_reply *reply)
{
    fwrite(reply->body, 1, reply->len, stdout);
    if (reply->len == 0 || reply->body[reply->len - 1] != '\n')
        fputs("\n", stdout);
}

/* A request whose answer is a JSON object. With raw that answer is printed as it came and
 * *root is left NULL. Otherwise *root is the object (the caller frees it). status, when not
 * NULL, gets the HTTP status. Returns the exit status so far. */
static int ddc_exchange(ddc_ctx *ctx, const char *method, const char *path, const char *body,
                        size_t body_len, int raw, cJSON **root, long *status)
{
    *root = NULL;
    ddc_reply reply;
    int rc = ddc_call(ctx, method, path, body, body_len, &reply);
    if (rc)
        return rc;
    if (status)
        *status = reply.status;
    if (raw)
        ddc_print_raw(&reply);
    else
        *root = ddc_parse_object(ctx, &reply, method, path);
    ddc_reply_free(&reply);
    return raw || *root ? 0 : 1;
}

/* ddc_exchange as a command wants it: raw with --json */
int ddc_request(ddc_ctx *ctx, const char *method, const char *path, const char *body, size_t body_len,
                cJSON **root, long *status)
{
    return ddc_exchange(ctx, method, path, body, body_len, ctx->json, root, status);
}

int ddc_get_object(ddc_ctx *ctx, const char *path, cJSON **root)
{
    return ddc_exchange(ctx, "GET", path, NULL, 0, 0, root, NULL);
}

/* ---------------------------------------------------------------------------------------------
 * Paths and bodies */

int ddc_run_path(const char *id, const char *suffix, char *path)
{
    char escaped[DDC_PATH_MAX / 2];
    if (ddc_escape(id, escaped, sizeof escaped))
        return ddc_usage_error("run id '%.40s...' is too long", id);
    snprintf(path, DDC_PATH_MAX, "/runs/%s%s", escaped, suffix);
    return 0;
}

int ddc_run_request(ddc_ctx *ctx, const char *method, const char *id, const char *suffix, const char *body,
                    size_t body_len, cJSON **root, long *status)
{
    char path[DDC_PATH_MAX];
    int rc = ddc_run_path(id, suffix, path);
    if (rc) {
        *root = NULL;
        return rc;
    }
    return ddc_request(ctx, method, path, body, body_len, root, status);
}

/* Reads a run config whole: "-" is stdin. Larger than the daemon's body limit, or unreadable,
 * is a usage error (2) naming the file. */
static int ddc_read_file(const char *path, char **text, size_t *len)
{
    *text = NULL;
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "ddtreectl: cannot read %s: %s\n", path, strerror(errno));
        return 2;
    }
    char *buf = malloc(DDC_MAX_FILE_BYTES + 1);
    size_t n = 0;
    int failed = !buf;
    while (!failed && n <= DDC_MAX_FILE_BYTES) {
        size_t got = fread(buf + n, 1, DDC_MAX_FILE_BYTES + 1 - n, f);
        if (got == 0)
            break;
        n += got;
    }
    int read_error = !failed && ferror(f);
    int saved_errno = errno;
    if (f != stdin)
        fclose(f);
    if (failed || read_error) {
        fprintf(stderr, "ddtreectl: cannot read %s: %s\n", path, failed ? "out of memory" : strerror(saved_errno));
        free(buf);
        return 2;
    }
    if (n > DDC_MAX_FILE_BYTES) {
        fprintf(stderr, "ddtreectl: %s is larger than 1 MiB, the most the daemon accepts\n", path);
        free(buf);
        return 2;
    }
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

/* The config's relative paths (target.path, .tokens, .shards[], .data.files[]) made absolute
 * against the folder of file, as `ddtreed train` and `ddtreed plan` read them: the daemon
 * refuses relative paths, its working directory being none of the user's. A config that does not
 * parse is left as it is (the daemon names what is wrong); "-" (stdin) has no folder. */
static void ddc_rebase_paths(const char *file, char **text, size_t *len)
{
    char *dir = strcmp(file, "-") ? realpath(file, NULL) : NULL;
    char *slash = dir ? strrchr(dir, '/') : NULL;
    cJSON *root = slash ? cJSON_ParseWithLength(*text, *len) : NULL;
    cJSON *target = root ? cJSON_GetObjectItemCaseSensitive(root, "target") : NULL;
    int changed = 0;
    if (slash)
        slash[slash == dir ? 1 : 0] = '\0';   /* the folder ("/" for a file at the root) */
    cJSON *data = target ? cJSON_GetObjectItemCaseSensitive(target, "data") : NULL;
    cJSON *values[] = { target ? cJSON_GetObjectItemCaseSensitive(target, "path") : NULL,
                        target ? cJSON_GetObjectItemCaseSensitive(target, "tokens") : NULL,
                        target ? cJSON_GetObjectItemCaseSensitive(target, "shards") : NULL,
                        data ? cJSON_GetObjectItemCaseSensitive(data, "files") : NULL };
    for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
        cJSON *v = values[k], *item = cJSON_IsArray(v) ? v->child : v;
        for (; item; item = cJSON_IsArray(v) ? item->next : NULL) {
            if (!cJSON_IsString(item) || !item->valuestring[0] || item->valuestring[0] == '/')
                continue;
            size_t n = strlen(dir) + strlen(item->valuestring) + 2;
            char *joined = malloc(n);
            if (joined) {
                snprintf(joined, n, "%s%s%s", dir, dir[strlen(dir) - 1] == '/' ? "" : "/", item->valuestring);
                cJSON_SetValuestring(item, joined);
                changed = 1;
            }
            free(joined);
        }
    }
    char *out = changed ? cJSON_PrintUnformatted(root) : NULL;
    if (out) {
        free(*text);
        *text = out;
        *len = strlen(out);
    }
    cJSON_Delete(root);
    free(dir);
}

int ddc_file_request(ddc_ctx *ctx, const char *method, const char *path, const char *file, cJSON **root,
                     long *status)
{
    char *config;
    size_t config_len;
    int rc = ddc_read_file(file, &config, &config_len);
    if (rc) {
        *root = NULL;
        return rc;
    }
    ddc_rebase_paths(file, &config, &config_len);
    rc = ddc_request(ctx, method, path, config, config_len, root, status);
    free(config);
    return rc;
}

