/* commands.c: ddtreectl's commands. Each turns its arguments into one request of API.md's
 * "Endpoints" and the daemon's JSON into lines for people, or prints that JSON as it came
 * (--json). Every field is type-checked before use: a missing, null or mistyped one prints as
 * "-", so a daemon that adds fields, or sends null before a run's first step, never breaks the
 * client. `watch` polls GET /runs/ID (and /runs/ID/steps for the loss sparkline and the ETA).
 * It does not retry, cache or guess: a failed request ends the command with API.md's exit status
 * (1 the daemon said no, 3 unreachable).
 * Tested by hand against a scratch server and against ddtreed itself (client/README.md).
 */
#include "ddtreectl.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------------------------------------
 * Text: every formatter returns a small struct by value, so that it can sit inside a printf's
 * arguments; a value that is missing, null or of the wrong type comes out as "-". */

typedef struct ddc_text {
    char s[160];
} ddc_text;

static ddc_text ddc_textf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static ddc_text ddc_textf(const char *fmt, ...)
{
    ddc_text t;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t.s, sizeof t.s, fmt, ap);
    va_end(ap);
    return t;
}

static const cJSON *ddc_get(const cJSON *object, const char *key)
{
    return cJSON_IsObject(object) ? cJSON_GetObjectItemCaseSensitive(object, key) : NULL;
}

/* the item when it is of that type, else NULL: what cJSON_ArrayForEach may walk */
static const cJSON *ddc_array(const cJSON *item)
{
    return cJSON_IsArray(item) ? item : NULL;
}

static const cJSON *ddc_object(const cJSON *item)
{
    return cJSON_IsObject(item) ? item : NULL;
}

/* a finite number: 1 and *value set, else 0 */
static int ddc_number(const cJSON *item, double *value)
{
    if (!cJSON_IsNumber(item) || !isfinite(item->valuedouble))
        return 0;
    *value = item->valuedouble;
    return 1;
}

static const char *ddc_string(const cJSON *item)
{
    return cJSON_IsString(item) && item->valuestring ? item->valuestring : NULL;
}

/* width grown to fit text, for a table's column */
static void ddc_widen(int *width, const char *text)
{
    int w = (int)strlen(text);
    if (w > *width)
        *width = w;
}

static int ddc_is_integral(double v)
{
    return v > -9e15 && v < 9e15 && (double)(long long)v == v;
}

/* whatever the value is, as one short piece of text (strings without their quotes) */
static ddc_text ddc_fmt_value(const cJSON *item)
{
    double v;
    if (ddc_string(item))
        return ddc_textf("%s", item->valuestring);
    if (ddc_number(item, &v))
        return ddc_is_integral(v) ? ddc_textf("%.0f", v) : ddc_textf("%.6g", v);
    if (cJSON_IsBool(item))
        return ddc_textf("%s", cJSON_IsTrue(item) ? "true" : "false");
    if (cJSON_IsObject(item) || cJSON_IsArray(item)) {
        char *compact = cJSON_PrintUnformatted(item);
        ddc_text t = ddc_textf("%s", compact ? compact : "-");
        free(compact);
        return t;
    }
    return ddc_textf("-");
}

static ddc_text ddc_fmt_real(const cJSON *item, int digits)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%.*g", digits, v) : ddc_textf("-");
}

/* as ddc_fmt_real, keeping trailing zeros (5.10, not 5.1): for a line that is redrawn */
static ddc_text ddc_fmt_fixed_width_real(const cJSON *item, int digits)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%#.*g", digits, v) : ddc_textf("-");
}

static ddc_text ddc_fmt_count(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_textf("%.0f", v) : ddc_textf("-");
}

/* 12345.6 -> "12,346" */
static ddc_text ddc_thousands_text(double v)
{
    if (!isfinite(v))
        return ddc_textf("-");
    if (v >= 1e15 || v <= -1e15)
        return ddc_textf("%.3g", v);
    char digits[32];
    snprintf(digits, sizeof digits, "%.0f", v < 0 ? -v : v);
    ddc_text t;
    size_t n = strlen(digits), o = 0;
    if (v <= -0.5)
        t.s[o++] = '-';
    for (size_t k = 0; k < n; k++) {
        if (k && (n - k) % 3 == 0)
            t.s[o++] = ',';
        t.s[o++] = digits[k];
    }
    t.s[o] = '\0';
    return t;
}

static ddc_text ddc_fmt_thousands(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_thousands_text(v) : ddc_textf("-");
}

/* decimal units, as the planner prints them (1 MB = 1e6 bytes) */
static ddc_text ddc_bytes_text(double bytes)
{
    if (bytes < 1e3)
        return ddc_textf("%.0f B", bytes);
    if (bytes < 1e6)
        return ddc_textf("%.1f kB", bytes / 1e3);
    if (bytes < 1e9)
        return ddc_textf("%.1f MB", bytes / 1e6);
    return ddc_textf("%.2f GB", bytes / 1e9);
}

static ddc_text ddc_fmt_bytes(const cJSON *item)
{
    double v;
    return ddc_number(item, &v) ? ddc_bytes_text(v) : ddc_textf("-");
}

/* 70 -> "1m10s", 7384 -> "2h03m" */
static ddc_text ddc_duration_text(double seconds)
{
    if (!isfinite(seconds) || seconds < 0)
        return ddc_textf("-");
    long long s = (long long)(seconds + 0.5);
    if (s < 60)
        return ddc_textf("%llds", s);
    if (s < 3600)
        return ddc_textf("%lldm%02llds", s / 60, s % 60);
    if (s < 86400)
        return ddc_textf("%lldh%02lldm", s / 3600, s / 60 % 60);
    return ddc_textf("%lldd%02lldh", s / 86400, s / 3600 % 24);
}

/* milliseconds since the epoch, in local time */
static ddc_text ddc_fmt_time(const cJSON *item)
{
    double ms;
    if (!ddc_number(item, &ms) || ms <= 0)
        return ddc_textf("-");
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    ddc_text text;
    if (!localtime_r(&t, &tm) || !strftime(text.s, sizeof text.s, "%Y-%m-%d %H:%M:%S", &tm))
        return ddc_textf("%.0f", ms);
    return text;
}

/* ---------------------------------------------------------------------------------------------
 * Requests */

/* watch leaves its progress line open on a terminal: close it before anything else is said */
static void ddc_end_line(ddc_ctx *ctx)
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

/* One request. 0 with *reply filled when the daemon answered 2xx; otherwise the exit status,
 * having said why: 1 (the daemon said no, or a local failure) or 3 (unreachable). */
static int ddc_call(ddc_ctx *ctx, const char *method, const char *path, const char *body,
                    size_t body_len, ddc_reply *reply)
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

static void ddc_print_raw(const ddc_reply *reply)
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

/* ddc_exchange as a command wants it: raw with --json, when *root comes back NULL and the
 * command is done */
static int ddc_request(ddc_ctx *ctx, const char *method, const char *path, const char *body,
                       size_t body_len, cJSON **root, long *status)
{
    return ddc_exchange(ctx, method, path, body, body_len, ctx->json, root, status);
}

/* GET path as a JSON object whatever --json says (watch reads what it prints) */
static int ddc_get_object(ddc_ctx *ctx, const char *path, cJSON **root)
{
    return ddc_exchange(ctx, "GET", path, NULL, 0, 0, root, NULL);
}

/* Percent-encodes text as one path segment or query value; -1 when out is too small. */
static int ddc_escape(const char *text, char *out, size_t out_len)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (const unsigned char *p = (const unsigned char *)text; *p; p++) {
        int plain = (*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') ||
                    *p == '-' || *p == '.' || *p == '_' || *p == '~';
        if (o + (plain ? 1 : 3) >= out_len)
            return -1;
        if (plain) {
            out[o++] = (char)*p;
        } else {
            out[o++] = '%';
            out[o++] = hex[*p >> 4];
            out[o++] = hex[*p & 15];
        }
    }
    out[o] = '\0';
    return 0;
}

enum { DDC_PATH_MAX = 1024 };

/* "/runs/<id><suffix>"; a usage error (2) when the id is absurdly long */
static int ddc_run_path(const char *id, const char *suffix, char *path)
{
    char escaped[DDC_PATH_MAX / 2];
    if (ddc_escape(id, escaped, sizeof escaped))
        return ddc_usage_error("run id '%.40s...' is too long", id);
    snprintf(path, DDC_PATH_MAX, "/runs/%s%s", escaped, suffix);
    return 0;
}

/* ddc_request on "/runs/<id><suffix>" */
static int ddc_run_request(ddc_ctx *ctx, const char *method, const char *id, const char *suffix,
                           const char *body, size_t body_len, cJSON **root, long *status)
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

/* ddc_request with the run config file (ddc_read_file) as the body */
static int ddc_file_request(ddc_ctx *ctx, const char *method, const char *path, const char *file,
                            cJSON **root, long *status)
{
    char *config;
    size_t config_len;
    int rc = ddc_read_file(file, &config, &config_len);
    if (rc) {
        *root = NULL;
        return rc;
    }
    rc = ddc_request(ctx, method, path, config, config_len, root, status);
    free(config);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Arguments after the command: at most one operand (ID or FILE) and the command's own options,
 * in any order; --json and --quiet are understood here too. */

enum { DDC_MAX_VALUE_OPTIONS = 3, DDC_MAX_FLAG_OPTIONS = 1 };

typedef struct ddc_arg_spec {
    const char *operand; /* "ID", "FILE", or NULL: none */
    const char *values[DDC_MAX_VALUE_OPTIONS + 1]; /* options that take a value, NULL-ended */
    const char *flags[DDC_MAX_FLAG_OPTIONS + 1];   /* options that don't */
} ddc_arg_spec;

typedef struct ddc_args {
    const char *operand;
    const char *value[DDC_MAX_VALUE_OPTIONS]; /* NULL when not given */
    int flag[DDC_MAX_FLAG_OPTIONS];
    int help; /* --help was printed: the command is done, exit 0 */
} ddc_args;

/* The command's exit status so far: 0, go on unless args->help; 2, a usage error (said). */
static int ddc_parse_args(ddc_ctx *ctx, const ddc_arg_spec *spec, int argc, char **argv, ddc_args *args)
{
    memset(args, 0, sizeof *args);
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) {
            ddc_usage(stdout);
            args->help = 1;
            return 0;
        }
        if (!strcmp(arg, "--json")) {
            ctx->json = 1;
            continue;
        }
        if (!strcmp(arg, "--quiet") || !strcmp(arg, "-q")) {
            ctx->quiet = 1;
            continue;
        }
        if (arg[0] == '-' && arg[1]) { /* "-" alone is an operand: stdin */
            int matched = 0;
            for (int k = 0; !matched && spec->values[k]; k++) {
                matched = ddc_option_value(argc, argv, &i, spec->values[k], &args->value[k]);
                if (matched < 0)
                    return ddc_usage_error("%s: %s wants a value", argv[0], spec->values[k]);
            }
            for (int k = 0; !matched && spec->flags[k]; k++)
                if (!strcmp(arg, spec->flags[k]))
                    matched = args->flag[k] = 1;
            if (!matched)
                return ddc_usage_error("%s: unknown option %s", argv[0], arg);
            continue;
        }
        if (!spec->operand || args->operand)
            return ddc_usage_error("%s: unexpected argument '%s'", argv[0], arg);
        args->operand = arg;
    }
    if (spec->operand && (!args->operand || !*args->operand))
        return ddc_usage_error("%s: missing %s", argv[0], spec->operand);
    return 0;
}

/* a non-negative integer option; a usage error (2) otherwise */
static int ddc_parse_count(const char *command, const char *option, const char *text, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < 0)
        return ddc_usage_error("%s: %s wants a non-negative integer, not '%s'", command, option, text);
    *out = v;
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Commands of one request: status, start, plan, show, pause, resume, cancel, export, events */

/* What such a command prints of the daemon's answer (the object root, its HTTP status): the
 * exit status. operand is the command's ID or FILE, path the request's (after /runs/ID). */
typedef int (*ddc_printer)(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *root,
                           long status);

/* A command of no options and at most one operand (spec_operand "ID", "FILE" or NULL) and one
 * request: method on path without an operand, on /runs/ID<path> with an ID, or with the FILE
 * as the body; then print on the answer, unless --json printed it as it came. */
static int ddc_one_request(ddc_ctx *ctx, int argc, char **argv, const char *spec_operand, const char *method,
                           const char *path, ddc_printer print)
{
    const ddc_arg_spec spec = {.operand = spec_operand};
    ddc_args args;
    int rc = ddc_parse_args(ctx, &spec, argc, argv, &args);
    if (rc || args.help)
        return rc;
    cJSON *root;
    long status = 0;
    if (!spec_operand)
        rc = ddc_request(ctx, method, path, NULL, 0, &root, &status);
    else if (!strcmp(spec_operand, "FILE"))
        rc = ddc_file_request(ctx, method, path, args.operand, &root, &status);
    else
        rc = ddc_run_request(ctx, method, args.operand, path, NULL, 0, &root, &status);
    if (rc || !root)
        return rc;
    rc = print(ctx, args.operand, path, root, status);
    cJSON_Delete(root);
    return rc;
}

/* ---------------------------------------------------------------------------------------------
 * status */

static int ddc_print_status(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *root,
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

    const cJSON *devices = ddc_get(root, "devices"), *device;
    int id_width = 6, name_width = 4;
    cJSON_ArrayForEach(device, ddc_array(devices)) {
        ddc_widen(&id_width, ddc_fmt_value(ddc_get(device, "id")).s);
        ddc_widen(&name_width, ddc_fmt_value(ddc_get(device, "name")).s);
    }
    if (cJSON_GetArraySize(devices) > 0) {
        printf("%-*s  %-*s  %10s  %10s  %s\n", id_width, "DEVICE", name_width, "NAME", "USED", "TOTAL", "RUN");
        cJSON_ArrayForEach(device, devices) {
            printf("%-*s  %-*s  %10s  %10s  %s\n", id_width, ddc_fmt_value(ddc_get(device, "id")).s,
                   name_width, ddc_fmt_value(ddc_get(device, "name")).s,
                   ddc_fmt_bytes(ddc_get(device, "memory_used_bytes")).s,
                   ddc_fmt_bytes(ddc_get(device, "memory_total_bytes")).s,
                   ddc_fmt_value(ddc_get(device, "run")).s);
        }
    } else {
        puts("devices: none");
    }
    return 0;
}

int ddc_cmd_status(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, NULL, "GET", "/status", ddc_print_status);
}

/* ---------------------------------------------------------------------------------------------
 * runs */

static ddc_text ddc_step_of_max(const cJSON *run)
{
    return ddc_textf("%s/%s", ddc_fmt_count(ddc_get(run, "step")).s, ddc_fmt_count(ddc_get(run, "max_steps")).s);
}

int ddc_cmd_runs(ddc_ctx *ctx, int argc, char **argv)
{
    static const ddc_arg_spec spec = {.values = {"--state"}};
    ddc_args args;
    int rc = ddc_parse_args(ctx, &spec, argc, argv, &args);
    if (rc || args.help)
        return rc;
    char path[DDC_PATH_MAX] = "/runs";
    if (args.value[0]) {
        char state[64];
        if (!*args.value[0] || ddc_escape(args.value[0], state, sizeof state))
            return ddc_usage_error("runs: --state wants a run state (queued, running, paused, ...)");
        snprintf(path, sizeof path, "/runs?state=%s", state);
    }
    cJSON *root;
    if ((rc = ddc_request(ctx, "GET", path, NULL, 0, &root, NULL)) || !root)
        return rc;
    const cJSON *runs = ddc_get(root, "runs"), *run;
    if (!cJSON_IsArray(runs)) {
        fputs("ddtreectl: the answer to GET /runs has no \"runs\" list\n", stderr);
        cJSON_Delete(root);
        return 1;
    }
    if (cJSON_GetArraySize(runs) == 0) {
        puts(args.value[0] ? "no runs in that state" : "no runs");
        cJSON_Delete(root);
        return 0;
    }
    int id_width = 2, state_width = 5, step_width = 8;
    cJSON_ArrayForEach(run, runs) {
        ddc_widen(&id_width, ddc_fmt_value(ddc_get(run, "id")).s);
        ddc_widen(&state_width, ddc_fmt_value(ddc_get(run, "state")).s);
        ddc_widen(&step_width, ddc_step_of_max(run).s);
    }
    printf("%-*s  %-*s  %*s  %9s  %10s  %s\n", id_width, "ID", state_width, "STATE", step_width, "STEP/MAX",
           "LOSS", "TOK/S", "NAME");
    cJSON_ArrayForEach(run, runs) {
        printf("%-*s  %-*s  %*s  %9s  %10s  %s\n", id_width, ddc_fmt_value(ddc_get(run, "id")).s, state_width,
               ddc_fmt_value(ddc_get(run, "state")).s, step_width, ddc_step_of_max(run).s,
               ddc_fmt_real(ddc_get(run, "loss"), 4).s, ddc_fmt_thousands(ddc_get(run, "tokens_per_s")).s,
               ddc_fmt_value(ddc_get(run, "name")).s);
    }
    cJSON_Delete(root);
    return 0;
}

/* ---------------------------------------------------------------------------------------------
 * start, plan: a run config file as the body */

static int ddc_print_started(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *root,
                             long status)
{
    const cJSON *id = ddc_get(root, "id");
    if (!ddc_string(id) && !cJSON_IsNumber(id)) {
        fputs("ddtreectl: the daemon accepted the run but its answer has no id\n", stderr);
        return 1;
    }
    if (ctx->quiet)
        printf("%s\n", ddc_fmt_value(id).s);
    else
        printf("started run %s (%s)\n", ddc_fmt_value(id).s, ddc_fmt_value(ddc_get(root, "state")).s);
    return 0;
}

int ddc_cmd_start(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "FILE", "POST", "/runs", ddc_print_started);
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

static int ddc_print_plan(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *plan,
                          long status)
{
    /* one unit for the whole table, so that the column reads down */
    double peak = 0, budget = 0;
    int has_peak = ddc_number(ddc_get(plan, "predicted_peak_bytes"), &peak);
    int has_budget = ddc_number(ddc_get(plan, "budget_bytes"), &budget) && budget > 0;
    double scale = (peak >= 1e9 || budget >= 1e9) ? 1e9 : 1e6;
    const char *unit = scale == 1e9 ? "GB" : "MB";

    double ranks = 0;
    int one_rank = ddc_number(ddc_get(plan, "ranks"), &ranks) && ranks == 1;
    printf("memory plan of \"%s\": %s rank%s, %s positions per rank, chunk %s, vocab tile %s\n",
           ddc_fmt_value(ddc_get(plan, "name")).s, ddc_fmt_count(ddc_get(plan, "ranks")).s, one_rank ? "" : "s",
           ddc_fmt_thousands(ddc_get(plan, "positions_per_rank")).s, ddc_fmt_count(ddc_get(plan, "chunk")).s,
           ddc_fmt_count(ddc_get(plan, "vocab_tile")).s);
    const cJSON *component;
    cJSON_ArrayForEach(component, ddc_object(ddc_get(plan, "bytes"))) {
        double bytes = 0;
        if (!component->string)
            continue;
        char label[64];
        snprintf(label, sizeof label, "%s", component->string);
        for (char *c = label; *c; c++)
            *c = *c == '_' ? ' ' : *c;
        int has_bytes = ddc_number(component, &bytes);
        ddc_plan_line(label, has_bytes, bytes, scale, unit, "-");
    }
    ddc_plan_line("predicted peak", has_peak, peak, scale, unit, "-");
    ddc_plan_line("budget", has_budget, budget, scale, unit, "none set");
    const cJSON *fits = ddc_get(plan, "fits");
    puts(cJSON_IsBool(fits) ? (cJSON_IsTrue(fits) ? "fits" : "does not fit") : "fits: -");
    return 0;
}

int ddc_cmd_plan(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "FILE", "POST", "/plan", ddc_print_plan);
}

/* ---------------------------------------------------------------------------------------------
 * show */

static void ddc_show_line(const char *key, const char *value)
{
    printf("%-17s %s\n", key, value);
}

static int ddc_print_run(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *run,
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

    /* tau_tree: {"16": 3.1, "64": 3.9} -> "16: 3.1, 64: 3.9" */
    char tau_tree[256] = "";
    const cJSON *tau_budget;
    size_t used = 0;
    cJSON_ArrayForEach(tau_budget, ddc_object(ddc_get(run, "tau_tree"))) {
        if (tau_budget->string && used < sizeof tau_tree)
            used += (size_t)snprintf(tau_tree + used, sizeof tau_tree - used, "%s%s: %s", used ? ", " : "",
                                     tau_budget->string, ddc_fmt_real(tau_budget, 4).s);
    }
    ddc_show_line("tau tree:", used ? tau_tree : "-");
    ddc_show_line("tokens/s:", ddc_fmt_thousands(ddc_get(run, "tokens_per_s")).s);
    ddc_show_line("positions/s:", ddc_fmt_thousands(ddc_get(run, "positions_per_s")).s);

    /* peak_memory_bytes: {"max": N, "devices": {"cpu:0": N}} -> "10.1 MB (cpu:0 10.1 MB)" */
    const cJSON *peak = ddc_get(run, "peak_memory_bytes");
    char peak_text[256];
    used = (size_t)snprintf(peak_text, sizeof peak_text, "%s",
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

int ddc_cmd_show(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "GET", "", ddc_print_run);
}

/* ---------------------------------------------------------------------------------------------
 * pause, resume, cancel, rechunk, export: POSTs to one run */

/* path is "/<action>" */
static int ddc_print_requested(const ddc_ctx *ctx, const char *id, const char *path, const cJSON *root,
                               long status)
{
    /* the state is the one at the answer: "running" after a cancel is not a refusal, the
     * cancel lands at the next step boundary */
    const char *state = ddc_string(ddc_get(root, "state"));
    printf("run %s: %s requested%s%s%s\n", id, path + 1, state ? " (now " : "", state ? state : "",
           state ? ")" : "");
    return 0;
}

int ddc_cmd_pause(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "POST", "/pause", ddc_print_requested);
}

int ddc_cmd_resume(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "POST", "/resume", ddc_print_requested);
}

int ddc_cmd_cancel(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "POST", "/cancel", ddc_print_requested);
}

int ddc_cmd_rechunk(ddc_ctx *ctx, int argc, char **argv)
{
    static const ddc_arg_spec spec = {.operand = "ID", .values = {"--chunk", "--vocab-tile"}};
    ddc_args args;
    int rc = ddc_parse_args(ctx, &spec, argc, argv, &args);
    if (rc || args.help)
        return rc;
    if (!args.value[0] && !args.value[1])
        return ddc_usage_error("rechunk: give --chunk N, --vocab-tile M or both");
    long long chunk = -1, vocab_tile = -1;
    if (args.value[0] && (rc = ddc_parse_count("rechunk", "--chunk", args.value[0], &chunk)))
        return rc;
    if (args.value[1] && (rc = ddc_parse_count("rechunk", "--vocab-tile", args.value[1], &vocab_tile)))
        return rc;
    char body[128];
    if (chunk >= 0 && vocab_tile >= 0)
        snprintf(body, sizeof body, "{\"chunk\":%lld,\"vocab_tile\":%lld}", chunk, vocab_tile);
    else if (chunk >= 0)
        snprintf(body, sizeof body, "{\"chunk\":%lld}", chunk);
    else
        snprintf(body, sizeof body, "{\"vocab_tile\":%lld}", vocab_tile);
    cJSON *root;
    if ((rc = ddc_run_request(ctx, "POST", args.operand, "/rechunk", body, strlen(body), &root, NULL)) ||
        !root)
        return rc;
    printf("run %s: rechunk applies from step %s\n", args.operand,
           ddc_fmt_count(ddc_get(root, "applies_from_step")).s);
    cJSON_Delete(root);
    return 0;
}

static int ddc_print_export(const ddc_ctx *ctx, const char *id, const char *path, const cJSON *root,
                            long status)
{
    const char *export_dir = ddc_string(ddc_get(root, "path"));
    if (status == 202)
        printf("run %s: export started%s%s\n", id, export_dir ? ", into " : "", export_dir ? export_dir : "");
    else
        printf("run %s: exported to %s\n", id, export_dir ? export_dir : "-");
    return 0;
}

int ddc_cmd_export(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "POST", "/export", ddc_print_export);
}

/* ---------------------------------------------------------------------------------------------
 * steps, events */

int ddc_cmd_steps(ddc_ctx *ctx, int argc, char **argv)
{
    static const ddc_arg_spec spec = {.operand = "ID", .values = {"--after", "--limit"}, .flags = {"--csv"}};
    ddc_args args;
    int rc = ddc_parse_args(ctx, &spec, argc, argv, &args);
    if (rc || args.help)
        return rc;
    long long after = -1, limit = -1;
    if (args.value[0] && (rc = ddc_parse_count("steps", "--after", args.value[0], &after)))
        return rc;
    if (args.value[1] && (rc = ddc_parse_count("steps", "--limit", args.value[1], &limit)))
        return rc;
    char query[128] = "";
    size_t used = 0;
    if (after >= 0)
        used += (size_t)snprintf(query + used, sizeof query - used, "%cafter=%lld", used ? '&' : '?', after);
    if (limit >= 0)
        used += (size_t)snprintf(query + used, sizeof query - used, "%climit=%lld", used ? '&' : '?', limit);
    if (args.flag[0])
        snprintf(query + used, sizeof query - used, "%cformat=csv", used ? '&' : '?');
    char suffix[160], path[DDC_PATH_MAX];
    snprintf(suffix, sizeof suffix, "/steps%s", query);
    if ((rc = ddc_run_path(args.operand, suffix, path)))
        return rc;

    if (args.flag[0]) { /* CSV: the daemon's text as it came */
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
    printf("%7s  %9s  %9s  %9s  %9s  %7s  %9s  %9s  %10s  %9s  %8s  %s\n", "STEP", "LOSS", "CE", "KL", "CAP",
           "ACC", "LR", "GRAD", "TOK/S", "PEAK", "STEP_MS", "CHUNK/TILE");
    cJSON_ArrayForEach(step, ddc_array(steps)) {
        printf("%7s  %9s  %9s  %9s  %9s  %7s  %9s  %9s  %10s  %9s  %8s  %s/%s\n",
               ddc_fmt_count(ddc_get(step, "step")).s, ddc_fmt_real(ddc_get(step, "loss"), 5).s,
               ddc_fmt_real(ddc_get(step, "ce"), 5).s, ddc_fmt_real(ddc_get(step, "kl"), 5).s,
               ddc_fmt_real(ddc_get(step, "cap"), 5).s, ddc_fmt_real(ddc_get(step, "acc"), 4).s,
               ddc_fmt_real(ddc_get(step, "lr"), 3).s, ddc_fmt_real(ddc_get(step, "grad_norm"), 4).s,
               ddc_fmt_thousands(ddc_get(step, "tokens_per_s")).s, ddc_fmt_bytes(ddc_get(step, "peak_bytes")).s,
               ddc_fmt_count(ddc_get(step, "step_ms")).s, ddc_fmt_count(ddc_get(step, "chunk")).s,
               ddc_fmt_count(ddc_get(step, "vocab_tile")).s);
    }
    cJSON_Delete(root);
    return 0;
}

static int ddc_print_events(const ddc_ctx *ctx, const char *id, const char *path, const cJSON *root,
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

int ddc_cmd_events(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, "ID", "GET", "/events", ddc_print_events);
}

/* ---------------------------------------------------------------------------------------------
 * watch: one progress line (redrawn on a terminal, a line per new step otherwise) and a
 * sparkline of the last losses, until the run ends. */

enum { DDC_SPARK_LEN = 40 };

/* the newest step records, oldest first: their losses draw the sparkline, their times the ETA */
typedef struct ddc_history {
    int count;
    long long last_step; /* the newest step taken in; -1 before any */
    long long step[DDC_SPARK_LEN];
    double loss[DDC_SPARK_LEN];  /* NAN when the record had none */
    double ts_ms[DDC_SPARK_LEN]; /* NAN when the record had none */
} ddc_history;

static volatile sig_atomic_t ddc_interrupted;

static void ddc_on_signal(int signo)
{
    ddc_interrupted = signo;
}

static void ddc_history_push(ddc_history *h, long long step, double loss, double ts_ms)
{
    if (h->count == DDC_SPARK_LEN) {
        memmove(h->step, h->step + 1, (DDC_SPARK_LEN - 1) * sizeof h->step[0]);
        memmove(h->loss, h->loss + 1, (DDC_SPARK_LEN - 1) * sizeof h->loss[0]);
        memmove(h->ts_ms, h->ts_ms + 1, (DDC_SPARK_LEN - 1) * sizeof h->ts_ms[0]);
        h->count--;
    }
    h->step[h->count] = step;
    h->loss[h->count] = loss;
    h->ts_ms[h->count] = ts_ms;
    h->count++;
    h->last_step = step;
}

/* Takes in the step records after the newest one held, at most the last DDC_SPARK_LEN up to
 * run_step (a watcher that starts late, or falls behind, needs no more). */
static int ddc_history_update(ddc_ctx *ctx, const char *id, long long run_step, ddc_history *h)
{
    long long after = run_step - DDC_SPARK_LEN;
    if (h->last_step > after)
        after = h->last_step;
    char suffix[96], path[DDC_PATH_MAX];
    if (after >= 0)
        snprintf(suffix, sizeof suffix, "/steps?after=%lld&limit=%d", after, DDC_SPARK_LEN);
    else
        snprintf(suffix, sizeof suffix, "/steps?limit=%d", DDC_SPARK_LEN);
    cJSON *root;
    int rc = ddc_run_path(id, suffix, path);
    if (rc || (rc = ddc_get_object(ctx, path, &root)))
        return rc;
    const cJSON *record;
    cJSON_ArrayForEach(record, ddc_array(ddc_get(root, "steps"))) {
        double step, loss = NAN, ts_ms = NAN;
        if (!ddc_number(ddc_get(record, "step"), &step) || (long long)step <= h->last_step)
            continue; /* a daemon whose "after" is inclusive repeats the last one */
        ddc_number(ddc_get(record, "loss"), &loss);
        ddc_number(ddc_get(record, "ts_ms"), &ts_ms);
        ddc_history_push(h, (long long)step, loss, ts_ms);
    }
    cJSON_Delete(root);
    return 0;
}

/* the last `width` losses as ▁▂▃▄▅▆▇█ between their own minimum and maximum */
static void ddc_sparkline(const ddc_history *h, int width, char *out, size_t out_len)
{
    static const char *const bars[8] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
    int first = h->count > width ? h->count - width : 0;
    double lo = INFINITY, hi = -INFINITY;
    for (int k = first; k < h->count; k++) {
        if (isfinite(h->loss[k])) {
            lo = h->loss[k] < lo ? h->loss[k] : lo;
            hi = h->loss[k] > hi ? h->loss[k] : hi;
        }
    }
    size_t used = 0;
    out[0] = '\0';
    for (int k = first; k < h->count && used + 4 < out_len; k++) {
        const char *bar = " ";
        if (isfinite(h->loss[k]))
            bar = hi > lo ? bars[(int)((h->loss[k] - lo) / (hi - lo) * 7 + 0.5)] : bars[3];
        used += (size_t)snprintf(out + used, out_len - used, "%s", bar);
    }
}

/* seconds to the last step from the pace of the recent records, else of the run so far */
static double ddc_eta_s(const ddc_history *h, const cJSON *run, double step, double max_steps)
{
    if (step >= max_steps)
        return 0;
    double ms_per_step = -1;
    int oldest = -1, newest = -1;
    for (int k = 0; k < h->count; k++) {
        if (isfinite(h->ts_ms[k])) {
            oldest = oldest < 0 ? k : oldest;
            newest = k;
        }
    }
    if (oldest >= 0 && h->step[newest] > h->step[oldest] && h->ts_ms[newest] > h->ts_ms[oldest]) {
        ms_per_step = (h->ts_ms[newest] - h->ts_ms[oldest]) / (double)(h->step[newest] - h->step[oldest]);
    } else {
        double started, updated;
        if (step > 0 && ddc_number(ddc_get(run, "started_ms"), &started) &&
            ddc_number(ddc_get(run, "updated_ms"), &updated) && updated > started)
            ms_per_step = (updated - started) / step;
    }
    return ms_per_step > 0 ? (max_steps - step) * ms_per_step / 1000 : -1;
}

/* "step 120/1500  loss 5.12  12,345 tok/s  peak 10.1 MB  ETA 1m10s" (+ the state when it is not
 * running) */
static void ddc_progress_text(const cJSON *run, const ddc_history *h, char *out, size_t out_len)
{
    const char *state = ddc_string(ddc_get(run, "state"));
    double step = -1, max_steps = -1, eta = -1;
    if (state && !strcmp(state, "running") && ddc_number(ddc_get(run, "step"), &step) &&
        ddc_number(ddc_get(run, "max_steps"), &max_steps))
        eta = ddc_eta_s(h, run, step, max_steps);
    const cJSON *peak = ddc_get(run, "peak_memory_bytes");
    int n = snprintf(out, out_len, "step %s  loss %s  %s tok/s  peak %s  ETA %s", ddc_step_of_max(run).s,
                     ddc_fmt_fixed_width_real(ddc_get(run, "loss"), 3).s, ddc_fmt_thousands(ddc_get(run, "tokens_per_s")).s,
                     ddc_fmt_bytes(cJSON_IsNumber(peak) ? peak : ddc_get(peak, "max")).s, ddc_duration_text(eta).s);
    if ((!state || strcmp(state, "running")) && n > 0 && (size_t)n < out_len)
        snprintf(out + n, out_len - (size_t)n, "  [%s]", state ? state : "-");
}

static int ddc_terminal_width(void)
{
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
        return ws.ws_col;
    return 80;
}

/* sleeps, waking early when a signal came */
static void ddc_sleep(double seconds)
{
    struct timespec left = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    while (!ddc_interrupted && nanosleep(&left, &left) == -1 && errno == EINTR)
        ;
}

int ddc_cmd_watch(ddc_ctx *ctx, int argc, char **argv)
{
    static const ddc_arg_spec spec = {.operand = "ID", .values = {"--interval"}};
    ddc_args args;
    int rc = ddc_parse_args(ctx, &spec, argc, argv, &args);
    if (rc || args.help)
        return rc;
    double interval = 1.0;
    if (args.value[0]) {
        char *end;
        interval = strtod(args.value[0], &end);
        if (end == args.value[0] || *end || !(interval >= 0.05 && interval <= 3600))
            return ddc_usage_error("watch: --interval wants seconds between 0.05 and 3600, not '%s'", args.value[0]);
    }
    const char *id = args.operand;
    char run_path[DDC_PATH_MAX];
    if ((rc = ddc_run_path(id, "", run_path)))
        return rc;

    /* a signal only sets a flag: the loop ends the progress line and returns */
    struct sigaction action = {.sa_handler = ddc_on_signal};
    sigemptyset(&action.sa_mask);
    sigaction(SIGINT, &action, NULL);
    sigaction(SIGTERM, &action, NULL);

    int tty = !ctx->json && isatty(STDOUT_FILENO);
    ddc_history history = {.last_step = -1};
    double shown_step = -2;
    char shown_state[64] = "";
    for (;;) {
        cJSON *run;
        if ((rc = ddc_get_object(ctx, run_path, &run)))
            return rc;
        const char *state = ddc_string(ddc_get(run, "state"));
        double step = -1;
        ddc_number(ddc_get(run, "step"), &step);
        if (!ctx->json && step >= 0 && (long long)step > history.last_step &&
            (rc = ddc_history_update(ctx, id, (long long)step, &history))) {
            cJSON_Delete(run);
            return rc;
        }
        int changed = step != shown_step || strcmp(state ? state : "-", shown_state);
        shown_step = step;
        snprintf(shown_state, sizeof shown_state, "%s", state ? state : "-");

        if (ctx->json) {
            if (changed) { /* one compact line per change, for scripts that follow a run */
                char *line = cJSON_PrintUnformatted(run);
                if (line)
                    puts(line);
                free(line);
            }
        } else {
            char line[512], spark[DDC_SPARK_LEN * 4 + 1];
            ddc_progress_text(run, &history, line, sizeof line);
            if (tty) {
                /* one line that never wraps: the text first, the sparkline in what is left */
                int width = ddc_terminal_width() - 1, text_len = (int)strlen(line);
                if (text_len > width)
                    line[text_len = width] = '\0';
                int room = width - text_len - 2;
                ddc_sparkline(&history, room < DDC_SPARK_LEN ? room : DDC_SPARK_LEN, spark, sizeof spark);
                printf("\r\033[K%s%s%s", line, spark[0] ? "  " : "", spark);
                ctx->line_open = 1;
            } else if (changed) {
                puts(line);
            }
        }
        fflush(stdout);

        if (state && !strcmp(state, "completed")) {
            ddc_end_line(ctx);
            if (!ctx->json)
                printf("run %s completed: step %s, loss %s\n", id, ddc_step_of_max(run).s,
                       ddc_fmt_real(ddc_get(run, "loss"), 4).s);
            cJSON_Delete(run);
            return 0;
        }
        if (state && (!strcmp(state, "failed") || !strcmp(state, "cancelled"))) {
            ddc_end_line(ctx);
            fflush(stdout);
            const char *error = ddc_string(ddc_get(run, "error"));
            fprintf(stderr, "ddtreectl: run %s %s%s%s\n", id, state, error && *error ? ": " : "",
                    error && *error ? error : "");
            cJSON_Delete(run);
            return 1;
        }
        cJSON_Delete(run);
        ddc_sleep(interval);
        if (ddc_interrupted) {
            ddc_end_line(ctx);
            return 128 + (int)ddc_interrupted;
        }
    }
}

/* ---------------------------------------------------------------------------------------------
 * nccl-id: rank 0's NCCL unique id, for the other daemons' "cluster" sections */

static int ddc_print_nccl_id(const ddc_ctx *ctx, const char *operand, const char *path, const cJSON *root,
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

int ddc_cmd_nccl_id(ddc_ctx *ctx, int argc, char **argv)
{
    return ddc_one_request(ctx, argc, argv, NULL, "POST", "/nccl/unique-id", ddc_print_nccl_id);
}
