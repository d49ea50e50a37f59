/* json_fields.c: typed, range-checked JSON fields (json_fields.h).
 * Tested by tests/engine/test_engine.c.
 */
#include "json_fields.h"
#include "read_file.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int ddt_json_fail(const ddt_json_ctx *j, const char *field, const char *what)
{
    snprintf(j->err, j->err_len, "%s: %s %s", j->path, field, what);
    return -EINVAL;
}

/* The first key that appears twice in one object, at any depth: such a file is ambiguous. */
static const char *duplicate_key(const cJSON *node)
{
    for (const cJSON *a = node->child; a; a = a->next) {
        if (cJSON_IsObject(node))
            for (const cJSON *b = a->next; b; b = b->next)
                if (!strcmp(a->string, b->string))
                    return a->string;
        const char *inner = duplicate_key(a);
        if (inner)
            return inner;
    }
    return NULL;
}

cJSON *ddt_json_parse_object(const char *path, const char *text, char *err, size_t err_len)
{
    const char *end = NULL;
    /* length + 1: require_null_terminated looks for the NUL within the length */
    cJSON *root = cJSON_ParseWithLengthOpts(text, strlen(text) + 1, &end, 1);
    if (!root || !cJSON_IsObject(root)) {
        if (root)
            snprintf(err, err_len, "%s: must hold a JSON object", path);
        else
            snprintf(err, err_len, "%s: invalid JSON near byte %ld", path, (long)(end ? end - text : 0));
        cJSON_Delete(root);
        root = NULL;
    }
    return root;
}

cJSON *ddt_json_parse_file(const char *path, size_t max_bytes, char *err, size_t err_len)
{
    char *text = ddt_read_text_file(path, max_bytes, err, err_len);
    if (!text)
        return NULL;
    cJSON *root = ddt_json_parse_object(path, text, err, err_len);
    const char *twice = root ? duplicate_key(root) : NULL;
    if (twice) {
        snprintf(err, err_len, "%s: \"%s\" appears twice in one object", path, twice);
        cJSON_Delete(root);
        root = NULL;
    }
    free(text);
    return root;
}

int ddt_json_int(const ddt_json_ctx *j, const cJSON *obj, const char *field, int64_t lo,
                 int64_t hi, int has_default, int64_t dflt, int64_t *out)
{
    double x;
    int rc = ddt_json_number(j, obj, field, (double)lo, 0, (double)hi, has_default, (double)dflt, &x);
    if (rc == 0 && x != floor(x)) {
        char what[96];
        snprintf(what, sizeof what, "must be an integer in [%lld, %lld]", (long long)lo, (long long)hi);
        return ddt_json_fail(j, field, what);
    }
    *out = rc == 0 ? (int64_t)x : 0;
    return rc;
}

int ddt_json_number(const ddt_json_ctx *j, const cJSON *obj, const char *field, double lo,
                    int lo_open, double hi, int has_default, double dflt, double *out)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!v || cJSON_IsNull(v)) {
        if (!has_default)
            return ddt_json_fail(j, field, "is missing");
        *out = dflt;
        return 0;
    }
    double x = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(x) || (lo_open ? x <= lo : x < lo) || x > hi) {
        char what[96];
        snprintf(what, sizeof what, "must be a number in %s%g, %g]", lo_open ? "(" : "[", lo, hi);
        return ddt_json_fail(j, field, what);
    }
    *out = x;
    return 0;
}

int ddt_json_only(const ddt_json_ctx *j, const cJSON *obj, const char *const *allowed)
{
    for (const cJSON *item = obj->child; item; item = item->next) {
        int known = 0;
        for (const char *const *a = allowed; *a && !known; a++)
            known = !strcmp(item->string, *a);
        if (!known) {
            char near[128], what[256] = "is not a known field (unknown keys are errors, not ignored)";
            if (ddt_json_nearest(item->string, allowed, NULL, near, sizeof near))
                snprintf(what, sizeof what, "is not a known field: did you mean %s? (unknown keys are errors, "
                         "not ignored)", near);
            return ddt_json_fail(j, item->string, what);
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------------
 * "Did you mean": the nearest known key
 */

/* Damerau-Levenshtein distance (optimal string alignment) of a[0, n) and b[0, m), both < 64;
 * 99 beyond */
static int edit_distance(const char *a, size_t n, const char *b, size_t m)
{
    if (n >= 64 || m >= 64)
        return 99;
    int d[64][64];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = (int)i;
    for (size_t k = 0; k <= m; k++)
        d[0][k] = (int)k;
    for (size_t i = 1; i <= n; i++)
        for (size_t k = 1; k <= m; k++) {
            int cost = a[i - 1] != b[k - 1], best = d[i - 1][k - 1] + cost;
            if (d[i - 1][k] + 1 < best)
                best = d[i - 1][k] + 1;
            if (d[i][k - 1] + 1 < best)
                best = d[i][k - 1] + 1;
            if (i > 1 && k > 1 && a[i - 1] == b[k - 2] && a[i - 2] == b[k - 1] && d[i - 2][k - 2] + 1 < best)
                best = d[i - 2][k - 2] + 1;
            d[i][k] = best;
        }
    return d[n][m];
}

/* the length of key's level ("train." of "train.step": 6; 0 at the top) */
static size_t level_length(const char *key)
{
    const char *dot = strrchr(key, '.');
    return dot ? (size_t)(dot - key) + 1 : 0;
}

int ddt_json_nearest(const char *key, const char *const *known, const char *const *aliases, char *out,
                     size_t len)
{
    const size_t level = level_length(key), name_len = strlen(key) - level;
    const char *best = NULL;
    int best_d = 4;
    for (const char *const *k = known; *k; k++) {
        if (level_length(*k) != level || strncmp(*k, key, level))
            continue;
        int d = edit_distance(key + level, name_len, *k + level, strlen(*k) - level);
        if (d < best_d && 2 * (size_t)d <= name_len)
            best = *k, best_d = d;
    }
    for (const char *const *a = aliases; !best && a && a[0]; a += 2)
        if (!strcmp(key + level, a[0]))
            for (const char *const *k = known; *k && !best; k++)
                if (level_length(*k) == level && !strncmp(*k, key, level) && !strcmp(*k + level, a[1]))
                    best = *k;
    for (const char *const *k = known; !best && *k; k++)   /* the same name at another level */
        if (!strcmp(*k + level_length(*k), key + level))
            best = *k;
    for (const char *const *a = aliases; !best && a && a[0]; a += 2)   /* an alias's, at another level */
        if (!strcmp(key + level, a[0]))
            for (const char *const *k = known; *k && !best; k++)
                if (!strcmp(*k + level_length(*k), a[1]))
                    best = *k;
    if (best)
        snprintf(out, len, "%s", best);
    return best != NULL;
}
