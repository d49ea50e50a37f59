/* config.c: the daemon configuration's one table and its readers (config.h). */
#include "config.h"
#include "base/json_fields.h"
#include "base/log.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

typedef enum setting_type { S_STRING, S_INT, S_BOOL, S_LEVEL } setting_type;

typedef struct setting {
    const char *key;
    setting_type type;
    size_t offset, size;     /* into ddt_daemon_config; size for strings */
    const char *dflt;        /* as text */
    int64_t lo, hi;          /* S_INT bounds */
    int reloadable;
    int secret;              /* never printed */
    const char *help;
} setting;

#define CFG(member) offsetof(ddt_daemon_config, member), sizeof(((ddt_daemon_config *)0)->member)

static const setting settings[] = {
    { "state_dir", S_STRING, CFG(state_dir), "/var/lib/ddtreed", 0, 0, 0, 0,
      "the database (ddtree.db) and runs/<id>/ (checkpoints, exports)" },
    { "socket", S_STRING, CFG(socket), "/run/ddtreed/api.sock", 0, 0, 0, 0,
      "the control socket (Unix, mode 0660)" },
    { "listen", S_STRING, CFG(listen), "", 0, 0, 0, 0,
      "optional TCP listener HOST:PORT (e.g. 127.0.0.1:7460); not loopback needs a token" },
    { "token", S_STRING, CFG(token), "", 0, 0, 0, 1, "bearer token required on TCP (Authorization: Bearer ...)" },
    { "max_connections", S_INT, CFG(max_connections), "256", 1, 4096, 0, 0, "concurrent connections per listener" },
    { "max_connections_per_address", S_INT, CFG(max_connections_per_address), "16", 1, 4096, 0, 0,
      "TCP: concurrent connections from one client address (more are closed at once); the Unix socket has no such limit" },
    { "connection_timeout_s", S_INT, CFG(connection_timeout_s), "30", 1, 3600, 0, 0, "idle connections are closed after this" },
    { "request_timeout_s", S_INT, CFG(request_timeout_s), "30", 1, 3600, 0, 0,
      "a request's whole time, its headers and body however slowly they come; then its connection is closed" },
    { "log_level", S_LEVEL, CFG(log_level), "info", 0, 0, 1, 0, "err, warning, info or debug" },
    { "max_parallel_runs", S_INT, CFG(max_parallel_runs), "1", 1, 64, 1, 0,
      "runs trained at the same time; the others wait in the queue, and a run also waits while a running one holds any of its GPUs" },
    { "watchdog", S_BOOL, CFG(watchdog), "true", 0, 0, 0, 0,
      "ping systemd's watchdog (WatchdogSec) only while every training run makes progress" },
};
enum { SETTING_COUNT = sizeof settings / sizeof settings[0] };

static const setting *find(const char *key)
{
    for (int i = 0; i < SETTING_COUNT; i++)
        if (!strcmp(settings[i].key, key))
            return &settings[i];
    return NULL;
}

static int set_text(ddt_daemon_config *c, const setting *s, const char *value, char *err, size_t err_len)
{
    void *at = (char *)c + s->offset;
    char *end;
    switch (s->type) {
    case S_STRING:
        if (strlen(value) >= s->size) {
            snprintf(err, err_len, "%s: longer than %zu characters", s->key, s->size - 1);
            return -EINVAL;
        }
        snprintf(at, s->size, "%s", value);
        return 0;
    case S_LEVEL:
        if (ddt_log_level_from_name(value) < 0) {
            snprintf(err, err_len, "%s: must be err, warning, info or debug (got \"%s\")", s->key, value);
            return -EINVAL;
        }
        snprintf(at, s->size, "%s", value);
        return 0;
    case S_INT: {
        long long v = strtoll(value, &end, 10);
        if (!*value || *end || v < s->lo || v > s->hi) {
            snprintf(err, err_len, "%s: must be an integer in [%lld, %lld] (got \"%s\")", s->key,
                     (long long)s->lo, (long long)s->hi, value);
            return -EINVAL;
        }
        *(int64_t *)at = v;
        return 0;
    }
    case S_BOOL:
        if (strcmp(value, "true") && strcmp(value, "false")) {
            snprintf(err, err_len, "%s: must be true or false (got \"%s\")", s->key, value);
            return -EINVAL;
        }
        *(int *)at = !strcmp(value, "true");
        return 0;
    }
    return -EINVAL;
}

int ddt_daemon_config_set(ddt_daemon_config *c, const char *key, const char *value,
                          int reloadable_only, char *err, size_t err_len)
{
    const setting *s = find(key);
    if (!s) {
        snprintf(err, err_len, "%s: not a setting of ddtreed (see ddtreed serve --help)", key);
        return -EINVAL;
    }
    if (reloadable_only && !s->reloadable) {
        snprintf(err, err_len, "%s: takes effect only at start; restart ddtreed", key);
        return -EINVAL;
    }
    return set_text(c, s, value, err, err_len);
}

int ddt_daemon_config_load(const char *path, ddt_daemon_config *c, char *err, size_t err_len)
{
    memset(c, 0, sizeof *c);
    for (int i = 0; i < SETTING_COUNT; i++)
        set_text(c, &settings[i], settings[i].dflt, err, err_len);
    if (!path)
        return 0;
    cJSON *root = ddt_json_parse_file(path, 1 << 20, err, err_len);
    if (!root)
        return -EINVAL;
    int rc = 0;
    for (const cJSON *item = root->child; item && rc == 0; item = item->next) {
        const setting *s = find(item->string);
        char text[1100];
        if (!s) {
            snprintf(err, err_len, "%s: %s is not a setting of ddtreed (see ddtreed serve --help)", path, item->string);
            rc = -EINVAL;
            break;
        }
        if (cJSON_IsString(item))
            snprintf(text, sizeof text, "%s", item->valuestring);
        else if (cJSON_IsBool(item))
            snprintf(text, sizeof text, "%s", cJSON_IsTrue(item) ? "true" : "false");
        else if (cJSON_IsNumber(item))
            snprintf(text, sizeof text, "%.17g", item->valuedouble);
        else
            snprintf(text, sizeof text, "%s", "?");
        int type_ok = s->type == S_INT ? cJSON_IsNumber(item) : s->type == S_BOOL ? cJSON_IsBool(item) : cJSON_IsString(item);
        char why[512];
        if (!type_ok) {
            snprintf(err, err_len, "%s: %s must be %s", path, s->key,
                     s->type == S_INT ? "a number" : s->type == S_BOOL ? "true or false" : "a string");
            rc = -EINVAL;
        } else if ((rc = set_text(c, s, text, why, sizeof why))) {
            snprintf(err, err_len, "%s: %s", path, why);
        }
    }
    cJSON_Delete(root);
    return rc;
}

int ddt_daemon_config_reload(ddt_daemon_config *c, const ddt_daemon_config *fresh)
{
    int changed = 0;
    for (int i = 0; i < SETTING_COUNT; i++) {
        const setting *s = &settings[i];
        if (!s->reloadable || !memcmp((const char *)c + s->offset, (const char *)fresh + s->offset, s->size))
            continue;
        memcpy((char *)c + s->offset, (const char *)fresh + s->offset, s->size);
        changed++;
    }
    return changed;
}

static void value_text(const ddt_daemon_config *c, const setting *s, char *out, size_t len)
{
    const void *at = (const char *)c + s->offset;
    if (s->secret)
        snprintf(out, len, "%s", *(const char *)at ? "(set)" : "(none)");
    else if (s->type == S_INT)
        snprintf(out, len, "%lld", (long long)*(const int64_t *)at);
    else if (s->type == S_BOOL)
        snprintf(out, len, "%s", *(const int *)at ? "true" : "false");
    else
        snprintf(out, len, "%s", (const char *)at);
}

void ddt_daemon_config_print_help(FILE *out)
{
    fprintf(out, "settings (JSON keys of --config FILE; --state-dir, --socket, --listen override theirs):\n");
    for (int i = 0; i < SETTING_COUNT; i++) {
        const setting *s = &settings[i];
        fprintf(out, "  %-22s default %-24s%s %s\n", s->key, *s->dflt ? s->dflt : "\"\"",
                s->reloadable ? " (SIGHUP)" : "", s->help);
    }
}

void ddt_daemon_config_log(const ddt_daemon_config *c)
{
    char line[4096];
    size_t used = (size_t)snprintf(line, sizeof line, "config");
    for (int i = 0; i < SETTING_COUNT && used < sizeof line; i++) {
        char v[1100];
        value_text(c, &settings[i], v, sizeof v);
        used += (size_t)snprintf(line + used, sizeof line - used, " %s=%s", settings[i].key, *v ? v : "\"\"");
    }
    ddt_log(DDT_LOG_INFO, "%s", line);
}

cJSON *ddt_daemon_config_json(const ddt_daemon_config *c)
{
    cJSON *o = cJSON_CreateObject();
    for (int i = 0; i < SETTING_COUNT; i++) {
        const setting *s = &settings[i];
        const void *at = (const char *)c + s->offset;
        if (s->secret) {
            cJSON_AddBoolToObject(o, s->key, *(const char *)at != 0);
        } else if (s->type == S_INT) {
            cJSON_AddNumberToObject(o, s->key, (double)*(const int64_t *)at);
        } else if (s->type == S_BOOL) {
            cJSON_AddBoolToObject(o, s->key, *(const int *)at);
        } else {
            cJSON_AddStringToObject(o, s->key, at);
        }
    }
    return o;
}

int ddt_parse_bytes(const char *text, int64_t *out)
{
    static const struct { const char *unit; double scale; } units[] = {
        { "", 1 }, { "b", 1 }, { "k", 1e3 }, { "kb", 1e3 }, { "m", 1e6 }, { "mb", 1e6 }, { "g", 1e9 },
        { "gb", 1e9 }, { "t", 1e12 }, { "tb", 1e12 }, { "kib", 1024.0 }, { "mib", 1048576.0 },
        { "gib", 1073741824.0 }, { "tib", 1099511627776.0 },
    };
    if (ddt_parse_count(text, out) == 0)   /* exact beyond 2^53 */
        return 0;
    char *end;
    errno = 0;
    const double v = strtod(text, &end);
    if (errno || end == text || !(v >= 0) || (*text < '0' || *text > '9'))
        return -1;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcasecmp(end, units[i].unit))
            continue;
        /* a unit's decimal (1.1GB) rounds to the byte; bytes themselves must be whole */
        const double bytes = units[i].scale > 1 ? round(v * units[i].scale) : v;
        if (bytes > 4611686018427387904.0 || bytes != floor(bytes))
            return -1;
        *out = (int64_t)bytes;
        return 0;
    }
    return -1;
}

int ddt_parse_count(const char *text, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno || end == text || *end || v < 0)
        return -1;
    *out = v;
    return 0;
}
