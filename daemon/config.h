/* config.h: the daemon's configuration (/etc/ddtreed/ddtreed.json and command-line flags).
 * ONE table (config.c) names every setting with its type, default, bounds, whether SIGHUP
 * reloads it and its help; parsing, validation, --help, the start-up summary and GET /status
 * all read it. Unknown keys and bad values are start-up errors naming the key.
 * Tested by tests/daemon/api_e2e.py (start-up, reload, status).
 */
#ifndef DDT_CONFIG_H
#define DDT_CONFIG_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct ddt_daemon_config {
    char state_dir[1024];       /* ddtree.db and runs/ */
    char socket[1024];          /* the control socket */
    char listen[256];           /* "HOST:PORT" or "" */
    char token[256];            /* bearer token for TCP */
    int64_t max_connections;
    int64_t connection_timeout_s;
    int64_t max_connections_per_address;
    int64_t request_timeout_s;
    char log_level[16];         /* err | warning | info | debug (reloadable) */
    int64_t max_parallel_runs;  /* runs trained at once (reloadable) */
    int watchdog;               /* ping systemd's watchdog while trainers progress */
} ddt_daemon_config;

/* Defaults, then the file (when path is not NULL), then nothing else: flags are applied by
 * the caller with ddt_daemon_config_set. 0, or -EINVAL / -errno with err naming the key. */
int ddt_daemon_config_load(const char *path, ddt_daemon_config *c, char *err, size_t err_len);
/* One setting by its key from text (flags); reloadable_only refuses the others (SIGHUP). */
int ddt_daemon_config_set(ddt_daemon_config *c, const char *key, const char *value,
                          int reloadable_only, char *err, size_t err_len);
/* The reloadable settings of fresh taken into c (SIGHUP); returns how many changed. */
int ddt_daemon_config_reload(ddt_daemon_config *c, const ddt_daemon_config *fresh);
/* --help: every setting, its default and help */
void ddt_daemon_config_print_help(FILE *out);
/* The start-up summary: one log line with every setting (the token hidden). */
void ddt_daemon_config_log(const ddt_daemon_config *c);
/* A non-negative decimal integer (flags, query strings): 0, or -1 when text is anything else. */
int ddt_parse_count(const char *text, int64_t *out);
/* A number of bytes (`ddtreed plan --budget`): an integer, a decimal with an exponent that comes
 * to whole bytes (96e9, 9.6e10), or a number with a unit: decimal B, KB, MB, GB, TB (96GB,
 * 96G, 95.5GB: 1000s) or binary KiB, MiB, GiB, TiB (96GiB: 1024s), case-insensitive, no space.
 * 0, or -1 when text is anything else (negative, a fraction of a byte without a unit, over 2^62). */
int ddt_parse_bytes(const char *text, int64_t *out);

/* Every setting as a JSON object (the token hidden), for GET /status. */
cJSON *ddt_daemon_config_json(const ddt_daemon_config *c);

#endif
