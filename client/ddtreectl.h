/* ddtreectl.h: what the files of ddtreectl share, one section a file: the HTTP transport
 * (http_client.c), the formatting of the daemon's JSON for people (format.c), the API client
 * (api_client.c, whose bad run ids are usage errors of command_line.c), the command table and
 * the command line derived from it (commands.c, command_line.c), `watch` (watch.c); main.c is
 * the entry point. Calls go one way (scripts/check_layers); the table's handlers are how the
 * command line calls up. Nothing here
 * is a library for others: the client is one executable and links no engine code.
 * Tested by tests/client/test_client.c (formatting, the usage text and the argument parsing derived
 * from the table) and by tests/daemon/api_e2e.py against ddtreed itself (client/README.md).
 */
#ifndef DDC_DDTREECTL_H
#define DDC_DDTREECTL_H

#include <cjson/cJSON.h>
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
 * Formatting (format.c): every formatter returns a small struct by value, so that it can sit
 * inside a printf's arguments; a value that is missing, null or of the wrong type comes out as
 * "-". */

typedef struct ddc_text {
    char s[160];
} ddc_text;

ddc_text ddc_textf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* the member of an object (NULL when object is not one); the item when it is of that type, else
 * NULL (what cJSON_ArrayForEach may walk); a finite number (1 and *value set, else 0); a string */
const cJSON *ddc_get(const cJSON *object, const char *key);
const cJSON *ddc_array(const cJSON *item);
const cJSON *ddc_object(const cJSON *item);
int ddc_number(const cJSON *item, double *value);
const char *ddc_string(const cJSON *item);

ddc_text ddc_fmt_value(const cJSON *item);           /* any value, strings without quotes */
ddc_text ddc_fmt_real(const cJSON *item, int digits); /* %.*g */
ddc_text ddc_fmt_fixed_width_real(const cJSON *item, int digits); /* 5.10, not 5.1 */
ddc_text ddc_fmt_count(const cJSON *item);           /* %.0f */
ddc_text ddc_fmt_thousands(const cJSON *item);       /* 12345.6 -> "12,346" */
ddc_text ddc_fmt_bytes(const cJSON *item);           /* decimal units: "10.1 MB" */
ddc_text ddc_fmt_time(const cJSON *item);            /* ms since the epoch, local time */
ddc_text ddc_duration_text(double seconds);          /* 70 -> "1m10s"; negative -> "-" */
ddc_text ddc_step_of_max(const cJSON *run);          /* "120/1500" */

/* The runs of GET /runs (in the daemon's order, oldest first) into order[0..n), newest first: by
 * created_ms, the later of two equal ones first; what the web view's runs table does too. The
 * count put in order (at most cap). */
int ddc_runs_newest_first(const cJSON *runs, const cJSON **order, int cap);

/* A column of a table. Cells are two spaces apart; the last column is not padded. */
typedef struct ddc_column {
    const char *header;
    int width; /* the least width; with fit, grown by ddc_table_fit */
    int left;  /* aligned left, else right */
    int fit;   /* as wide as its header and its widest cell */
} ddc_column;

void ddc_table_fit(ddc_column *columns, int count, const ddc_text *cells);
void ddc_table_header(const ddc_column *columns, int count);
void ddc_table_row(const ddc_column *columns, int count, const ddc_text *cells);

/* values[0..count) as ▁▂▃▄▅▆▇█ between their own minimum and maximum; NAN is a blank */
void ddc_sparkline(const double *values, int count, char *out, size_t out_len);

/* Percent-encodes text as one path segment or query value; -1 when out is too small. */
int ddc_escape(const char *text, char *out, size_t out_len);

/* ---------------------------------------------------------------------------------------------
 * The API client (api_client.c): requests to API.md's routes and what the daemon said no with,
 * as a message and an exit status (1 the daemon said no, 3 unreachable). */

typedef struct ddc_ctx {
    const char *where; /* the socket path or the URL, for "cannot reach" */
    ddc_http *http;
    int json;          /* --json: print the daemon's JSON as it came */
    int quiet;         /* --quiet or -q, before or after the command (start: only the id) */
    int line_open;     /* watch left a progress line on the terminal without its newline */
} ddc_ctx;

enum { DDC_PATH_MAX = 1024, DDC_QUERY_VALUE_MAX = 64 };

/* ends the progress line watch left open, before anything else is said */
void ddc_end_line(ddc_ctx *ctx);
/* One request. 0 with *reply filled when the daemon answered 2xx; otherwise the exit status,
 * having said why: 1 (the daemon said no, or a local failure) or 3 (unreachable). */
int ddc_call(ddc_ctx *ctx, const char *method, const char *path, const char *body, size_t body_len,
             ddc_reply *reply);
/* the body as it came, with a last newline when it has none */
void ddc_print_raw(const ddc_reply *reply);
/* A request whose answer is a JSON object. With --json that answer is printed as it came and
 * *root is left NULL: the command is done. Otherwise *root is the object (the caller frees it).
 * status, when not NULL, gets the HTTP status. Returns the exit status so far. */
int ddc_request(ddc_ctx *ctx, const char *method, const char *path, const char *body, size_t body_len,
                cJSON **root, long *status);
/* ddc_request on "/runs/<id><suffix>" */
int ddc_run_request(ddc_ctx *ctx, const char *method, const char *id, const char *suffix, const char *body,
                    size_t body_len, cJSON **root, long *status);
/* ddc_request with a run config file as the body: "-" is stdin; unreadable or larger than the
 * daemon's body limit is a usage error (2) naming the file */
int ddc_file_request(ddc_ctx *ctx, const char *method, const char *path, const char *file, cJSON **root,
                     long *status);
/* GET path as a JSON object whatever --json says (watch reads what it prints) */
int ddc_get_object(ddc_ctx *ctx, const char *path, cJSON **root);
/* "/runs/<id><suffix>" into path[DDC_PATH_MAX]; a usage error (2) when the id is absurdly long */
int ddc_run_path(const char *id, const char *suffix, char *path);

/* ---------------------------------------------------------------------------------------------
 * The command table (commands.c) and the command line derived from it (command_line.c): the
 * usage text, and every command's arguments: at most one operand and the command's options, in
 * any order, plus --json, --quiet (-q) and --help (-h), which every command understands. */

enum { DDC_MAX_OPTIONS = 4 };

typedef enum ddc_option_kind {
    DDC_OPT_FLAG,    /* no value */
    DDC_OPT_COUNT,   /* a non-negative integer */
    DDC_OPT_SECONDS, /* a time in [min, max] seconds, default_value when not given */
    DDC_OPT_STATE,   /* a run state's name, for a query (the daemon judges it) */
    DDC_OPT_COUNTS,  /* a comma-separated list of 1 to 8 positive integers ("8,32") */
    DDC_OPT_DIR,     /* a directory: non-empty; a relative one is made absolute against the
                        working directory (the daemon resolves paths on its own machine) */
} ddc_option_kind;

typedef struct ddc_option {
    const char *name;       /* "--chunk", given as "--chunk N" or "--chunk=N"; NULL after the last */
    ddc_option_kind kind;
    const char *value_name; /* "N" in the usage; NULL for a flag */
    double min, max, default_value; /* DDC_OPT_SECONDS */
} ddc_option;

typedef enum ddc_operand {
    DDC_OPERAND_NONE,
    DDC_OPERAND_RUN_ID, /* "ID" */
    DDC_OPERAND_FILE,   /* "FILE": a run config, "-" for stdin */
} ddc_operand;

/* what the command line said, after the table's checks */
typedef struct ddc_value {
    int given;
    const char *text; /* as given */
    long long count;  /* DDC_OPT_COUNT */
    double seconds;   /* DDC_OPT_SECONDS (its default when not given) */
    char path[4096];  /* DDC_OPT_DIR, absolute */
} ddc_value;

typedef struct ddc_command ddc_command;

typedef struct ddc_args {
    const ddc_command *command;
    const char *operand;               /* non-empty when the command has one, else NULL */
    ddc_value option[DDC_MAX_OPTIONS]; /* in the order of command->options */
    int help;                          /* --help was printed: the command is done, exit 0 */
} ddc_args;

struct ddc_command {
    const char *name;
    ddc_operand operand;
    ddc_option options[DDC_MAX_OPTIONS];
    /* one line, or two with a '\n'; NULL: the command is listed on one line with the next ones
     * that have none (pause, resume, cancel say what their names say) */
    const char *help;
    /* the exit status (0, 1, 2 or 3) */
    int (*run)(ddc_ctx *ctx, const ddc_args *args);
};

extern const ddc_command ddc_commands[];
extern const size_t ddc_command_count;

/* the command of that name, or NULL */
const ddc_command *ddc_find_command(const char *name);
void ddc_usage(FILE *out);
/* Prints "ddtreectl: <why>" and the usage text to stderr; returns 2. */
int ddc_usage_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* argv[*i] as "--name VALUE" (consumes both) or "--name=VALUE": 1 with *value set, 0 when it is
 * not this option, -1 when the value is missing. */
int ddc_option_value(int argc, char **argv, int *i, const char *name, const char **value);
/* argv[0] is the command's name. The exit status so far: 0, go on unless args->help; 2, a usage
 * error (said). */
int ddc_parse_args(ddc_ctx *ctx, const ddc_command *command, int argc, char **argv, ddc_args *args);

/* ---------------------------------------------------------------------------------------------
 * watch (watch.c) */

enum { DDC_WATCH_INTERVAL }; /* its options */
int ddc_cmd_watch(ddc_ctx *ctx, const ddc_args *args);

#endif
