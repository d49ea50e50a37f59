/* run_files.c: the files a run config names, checked before the run is accepted (POST /runs,
 * `ddtreed train`, `ddtreed plan`) so that a run that cannot start is refused in words naming
 * the field, not failed at its step 0. Cheap checks only: stat, and the tokenizer.json opened
 * (its largest id against the target's vocab_size); no weights are read. Relative paths: a
 * daemon's working directory is nobody's choice (`/` under systemd), so the API refuses them
 * (ddt_run_config_check_absolute) and the commands that read a config file resolve them against
 * the file's folder (ddt_run_config_rebase) before the config is parsed or stored.
 * Tested by tests/engine/test_engine.c (each refusal and its field, the rebase) and
 * tests/daemon/api_e2e.py (case bad_inputs: each refused at submit).
 */
#include "run_config.h"
#include "base/read_file.h"
#include "data/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* -EINVAL with field and err = "FIELD: what" */
static int refuse(char *err, size_t err_len, char *field, size_t field_len, const char *name, const char *fmt,
                  const char *a, const char *b)
{
    char what[4096];
    snprintf(field, field_len, "%s", name);
    snprintf(what, sizeof what, fmt, a, b);
    snprintf(err, err_len, "%s: %s", name, what);
    return -EINVAL;
}

/* path must be a regular file (dir 0) or a directory (dir 1): 0, or errno's sentence in why */
static int stat_kind(const char *path, int dir, char *why, size_t len)
{
    struct stat st;
    if (stat(path, &st))
        snprintf(why, len, "%s", errno == ENOENT ? "no such file or directory" : strerror(errno));
    else if (dir && !S_ISDIR(st.st_mode))
        snprintf(why, len, "not a directory");
    else if (!dir && !S_ISREG(st.st_mode))
        snprintf(why, len, "%s", S_ISDIR(st.st_mode) ? "a directory, not a file" : "not a regular file");
    else
        return 0;
    return -1;
}

/* each of paths (n) a file, else refused as "LIST[i]: "PATH": why: todo" */
static int check_list(const char (*paths)[DDT_RUN_PATH], int n, const char *list, const char *todo, char *err,
                      size_t err_len, char *field, size_t field_len)
{
    char why[128], name[64], quoted[1100];
    for (int i = 0; i < n; i++)
        if (stat_kind(paths[i], 0, why, sizeof why)) {
            snprintf(name, sizeof name, "%s[%d]", list, i);
            snprintf(quoted, sizeof quoted, "\"%s\": %s", paths[i], why);
            return refuse(err, err_len, field, field_len, name, "%s: %s", quoted, todo);
        }
    return 0;
}

/* the data files: chat files (entries of target.data.files), token file, shards */
static int check_data_files(const ddt_run_config *c, char *err, size_t err_len, char *field, size_t field_len)
{
    char why[128], quoted[1100];
    int rc = check_list((const char (*)[DDT_RUN_PATH])c->chat_files, c->chat_file_count, "target.data.files",
                        "give the path of a JSON Lines file of conversations (docs/chat-data.md)", err, err_len,
                        field, field_len);
    if (rc)
        return rc;
    if (*c->target_tokens && stat_kind(c->target_tokens, 0, why, sizeof why)) {
        snprintf(quoted, sizeof quoted, "\"%s\"", c->target_tokens);
        return refuse(err, err_len, field, field_len, "target.tokens", "%s: %s: give the token file `ddtreed "
                      "tokenize` wrote (or target.data.files for JSON Lines conversations)", quoted, why);
    }
    return check_list((const char (*)[DDT_RUN_PATH])c->shards, c->shard_count, "target.shards",
                      "give the feature shards `ddtreed features` wrote", err, err_len, field, field_len);
}

int ddt_run_config_check_files(const ddt_run_config *c, int64_t vocab, char *err, size_t err_len, char *field,
                               size_t field_len)
{
    char why[1024], quoted[1200];
    if (c->target_kind == DDT_SOURCE_SYNTHETIC)
        return 0;
    if (stat_kind(c->target_path, 1, why, sizeof why)) {
        snprintf(quoted, sizeof quoted, "\"%s\"", c->target_path);
        return refuse(err, err_len, field, field_len, "target.path", "%s: %s: give the model's directory (its "
                      "config.json and weights)", quoted, why);
    }
    int rc = check_data_files(c, err, err_len, field, field_len);
    if (rc || c->data_kind != DDT_DATA_CHAT)
        return rc;
    char path[DDT_RUN_PATH + 32];
    snprintf(path, sizeof path, "%s/tokenizer.json", c->target_path);
    snprintf(quoted, sizeof quoted, "\"%s\"", path);
    ddt_tokenizer *tok = ddt_tokenizer_open(path, why, sizeof why);   /* a missing one: what it must be */
    if (!tok)
        return refuse(err, err_len, field, field_len, "target.path", "%s%s", why, "");
    const int64_t ids = ddt_tokenizer_vocab_size(tok);
    ddt_tokenizer_close(tok);
    if (ids > vocab) {
        char figures[96];
        snprintf(figures, sizeof figures, "%lld, past the target's vocab_size %lld", (long long)ids - 1,
                 (long long)vocab);
        return refuse(err, err_len, field, field_len, "target.path", "%s: its ids run to %s (config.json): it is "
                      "not this model's tokenizer; put the tokenizer.json that came with the model beside its "
                      "config.json", quoted, figures);
    }
    return 0;
}

/* the path fields of a run config, each a string or a list of strings */
static const char *const path_fields[][2] = {
    { "target", "path" }, { "target", "tokens" }, { "target", "shards" }, { "data", "files" },
};

/* the JSON value of path field k in root (target.data.files: under target) */
static cJSON *path_value(cJSON *root, int k)
{
    cJSON *target = cJSON_GetObjectItemCaseSensitive(root, "target");
    cJSON *in = k == 3 ? cJSON_GetObjectItemCaseSensitive(target, "data") : target;
    return cJSON_IsObject(in) ? cJSON_GetObjectItemCaseSensitive(in, path_fields[k][1]) : NULL;
}

int ddt_run_config_check_absolute(const ddt_run_config *c, char *err, size_t err_len, char *field, size_t field_len)
{
    char name[64];
    const char *relative = NULL;
    if (c->target_kind != DDT_SOURCE_SYNTHETIC && *c->target_path && *c->target_path != '/')
        relative = c->target_path, snprintf(name, sizeof name, "target.path");
    else if (*c->target_tokens && *c->target_tokens != '/')
        relative = c->target_tokens, snprintf(name, sizeof name, "target.tokens");
    for (int i = 0; !relative && i < c->chat_file_count; i++)
        if (*c->chat_files[i] != '/')
            relative = c->chat_files[i], snprintf(name, sizeof name, "target.data.files[%d]", i);
    for (int i = 0; !relative && i < c->shard_count; i++)
        if (*c->shards[i] != '/')
            relative = c->shards[i], snprintf(name, sizeof name, "target.shards[%d]", i);
    if (!relative)
        return 0;
    char quoted[1100];
    snprintf(quoted, sizeof quoted, "\"%s\"", relative);
    return refuse(err, err_len, field, field_len, name, "%s is a relative path, which the daemon would resolve "
                  "against its own working directory (%s under systemd): give an absolute path (`ddtreectl start` "
                  "and `plan`, `ddtreed train` and `plan` resolve a config file's relative paths against the "
                  "file's folder)", quoted, "/");
}

/* s relative (not "" nor absolute): dir/s as a new string in v */
static int rebase_string(cJSON *v, const char *dir, int *changed)
{
    const char *s = cJSON_GetStringValue(v);
    if (!s || !*s || *s == '/')
        return 0;
    size_t n = strlen(dir) + strlen(s) + 2;
    char *joined = malloc(n);
    if (!joined)
        return -ENOMEM;
    snprintf(joined, n, "%s/%s", dir, s);
    char *old = v->valuestring;
    v->valuestring = joined;
    free(old);   /* cJSON's allocator is the default malloc/free here */
    *changed = 1;
    return 0;
}

char *ddt_run_config_rebase(const char *json, const char *dir)
{
    cJSON *root = strstr(json, "\\u0000") ? NULL : cJSON_Parse(json);
    int changed = 0, rc = 0;
    for (int k = 0; root && k < 4 && !rc; k++) {
        cJSON *v = path_value(root, k);
        if (cJSON_IsArray(v))
            for (cJSON *e = v->child; e && !rc; e = e->next)
                rc = rebase_string(e, dir, &changed);
        else if (v)
            rc = rebase_string(v, dir, &changed);
    }
    char *out = root && changed && !rc ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return out ? out : strdup(json);
}

char *ddt_run_config_read_file(const char *path, char *err, size_t err_len)
{
    char *text = ddt_read_text_file(path, 1 << 20, err, err_len);
    char *full = text ? realpath(path, NULL) : NULL;
    if (!text || !full) {
        if (text)
            snprintf(err, err_len, "%s: %s", path, strerror(errno));
        free(text);
        return NULL;
    }
    *strrchr(full, '/') = '\0';   /* its folder ("" for a file in /: paths then start "/") */
    char *rebased = ddt_run_config_rebase(text, full);
    if (!rebased)
        snprintf(err, err_len, "%s: no memory for the config", path);
    free(full);
    free(text);
    return rebased;
}
