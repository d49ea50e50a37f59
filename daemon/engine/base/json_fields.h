/* json_fields.h: typed, range-checked fields of untrusted JSON objects (cJSON), each failure
 * an error "FILE: field what-is-wrong". Used by every reader of configuration files.
 * Tested by tests/engine/test_engine.c.
 */
#ifndef DDT_JSON_FIELDS_H
#define DDT_JSON_FIELDS_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdint.h>

typedef struct ddt_json_ctx {
    const char *path;   /* named in errors */
    char *err;
    size_t err_len;
} ddt_json_ctx;

/* -EINVAL with err = "PATH: field what" */
int ddt_json_fail(const ddt_json_ctx *j, const char *field, const char *what);
/* text (NUL-terminated, read from path) parsed as a JSON object; NULL with err = "PATH: ..." */
cJSON *ddt_json_parse_object(const char *path, const char *text, char *err, size_t err_len);
/* Parses a whole file as a JSON object, no key twice in one object; NULL with err. */
cJSON *ddt_json_parse_file(const char *path, size_t max_bytes, char *err, size_t err_len);
/* An integer in [lo, hi]; when missing or null: dflt if has_default, else an error. */
int ddt_json_int(const ddt_json_ctx *j, const cJSON *obj, const char *field, int64_t lo,
                 int64_t hi, int has_default, int64_t dflt, int64_t *out);
/* A finite number in [lo, hi] (lo_open: > lo); missing: as above. */
int ddt_json_number(const ddt_json_ctx *j, const cJSON *obj, const char *field, double lo,
                    int lo_open, double hi, int has_default, double dflt, double *out);
/* Every key of obj is one of allowed (NULL-terminated): else an error naming the first other,
 * with "did you mean X?" when ddt_json_nearest finds one. */
int ddt_json_only(const ddt_json_ctx *j, const cJSON *obj, const char *const *allowed);

/* The known key nearest to an unknown one, for "did you mean X?" (into out; 1, or 0 when none).
 * Keys may be dotted paths ("train.step"): a key is compared with the known ones of its own
 * level ("train.*") by Damerau-Levenshtein distance on its last name, at most 3 and at most half
 * that name's length ("step" -> "steps", "pth" -> "path", "prompt_length" -> "prompt_len"); then
 * aliases, pairs of names {"learning_rate", "lr", ...} ending with NULL (may be NULL), when the
 * alias is known at the key's level ("train.learning_rate" -> "train.lr"); last, a known key of
 * another level with the same last name ("lr" -> "train.lr"). known ends with NULL. */
int ddt_json_nearest(const char *key, const char *const *known, const char *const *aliases, char *out,
                     size_t len);

#endif
