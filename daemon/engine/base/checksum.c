/* checksum.c: xxHash64 of what is written and of what is read back, and the verdicts on a
 * directory's files (checksum.h).
 *
 * xxHash comes from Debian's libxxhash-dev as a header compiled into this file alone
 * (XXH_INLINE_ALL): the binaries link no libxxhash, so a machine without the package runs them.
 * Files are read in 1 MiB blocks: a checkpoint's tensors are gigabytes, never held whole.
 * Tested by tests/engine/record/test_checkpoint.c.
 */
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "checksum.h"
#include "errors.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { READ_BLOCK = 1 << 20 };

struct ddt_checksum_stream {
    XXH64_state_t state;
    int64_t size;
};

ddt_checksum ddt_checksum_of(const void *data, size_t n)
{
    return (ddt_checksum){ .size = (int64_t)n, .xxh64 = XXH64(data, n, 0) };
}

ddt_checksum_stream *ddt_checksum_begin(void)
{
    ddt_checksum_stream *s = malloc(sizeof *s);
    if (s) {
        XXH64_reset(&s->state, 0);
        s->size = 0;
    }
    return s;
}

void ddt_checksum_update(ddt_checksum_stream *s, const void *data, size_t n)
{
    XXH64_update(&s->state, data, n);
    s->size += (int64_t)n;
}

ddt_checksum ddt_checksum_end(ddt_checksum_stream *s)
{
    ddt_checksum c = { .size = s->size, .xxh64 = XXH64_digest(&s->state) };
    free(s);
    return c;
}

int ddt_checksum_file(const char *path, ddt_checksum *out, char *err, size_t err_len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return ddt_fail_path(err, err_len, -errno, path, "cannot open: %s", strerror(errno));
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    unsigned char *block = malloc(READ_BLOCK);
    ddt_checksum_stream *s = ddt_checksum_begin();
    int rc = block && s ? 0 : ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory for its checksum");
    for (ssize_t got = 1; rc == 0 && got > 0;) {
        got = read(fd, block, READ_BLOCK);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            rc = ddt_fail_path(err, err_len, -errno, path, "cannot read: %s", strerror(errno));
        else
            ddt_checksum_update(s, block, (size_t)got);
    }
    close(fd);
    free(block);
    if (s && rc == 0)
        *out = ddt_checksum_end(s);
    else
        free(s);
    return rc;
}

void ddt_checksum_hex(uint64_t h, char hex[DDT_CHECKSUM_HEX])
{
    snprintf(hex, DDT_CHECKSUM_HEX, "%016" PRIx64, h);
}

int ddt_checksum_from_hex(const char *hex, uint64_t *h)
{
    if (!hex || strlen(hex) != 16 || strspn(hex, "0123456789abcdef") != 16)
        return -EINVAL;
    *h = strtoull(hex, NULL, 16);
    return 0;
}

/* The 16 digits of text's seal: the value of its last "seal" key, when nothing but the object's
 * end follows it; NULL when there is none. */
static const char *find_seal(const char *text, size_t len)
{
    static const char key[] = "\"seal\"";
    const char *last = NULL;
    for (const char *p = text; (p = memmem(p, len - (size_t)(p - text), key, sizeof key - 1)); p++)
        last = p;
    if (!last)
        return NULL;
    const char *p = last + sizeof key - 1, *end = text + len;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    if (p == end || *p++ != ':')
        return NULL;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    if (end - p < 18 || p[0] != '"' || p[17] != '"')
        return NULL;
    const char *digits = p + 1;
    for (p += 18; p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r' || *p == '}'); p++)
        ;
    return p == end && memchr(digits + 17, '}', (size_t)(end - digits - 17)) ? digits : NULL;
}

/* the checksum of text with its seal's digits as zeros */
static uint64_t sealed_sum(const char *text, size_t len, const char *digits)
{
    XXH64_state_t *st = XXH64_createState();
    if (!st)
        return 0;
    XXH64_reset(st, 0);
    XXH64_update(st, text, (size_t)(digits - text));
    XXH64_update(st, DDT_SEAL_ZERO, 16);
    XXH64_update(st, digits + 16, len - (size_t)(digits + 16 - text));
    uint64_t h = XXH64_digest(st);
    XXH64_freeState(st);
    return h;
}

int ddt_checksum_seal(char *text)
{
    size_t len = strlen(text);
    char *digits = (char *)find_seal(text, len);
    if (!digits || memcmp(digits, DDT_SEAL_ZERO, 16))
        return -EINVAL;
    char hex[DDT_CHECKSUM_HEX];
    ddt_checksum_hex(sealed_sum(text, len, digits), hex);
    memcpy(digits, hex, 16);
    return 0;
}

int ddt_checksum_check_seal(const char *text, size_t len, uint64_t *want, uint64_t *got)
{
    const char *digits = find_seal(text, len);
    char hex[DDT_CHECKSUM_HEX];
    if (!digits)
        return -ENOENT;
    memcpy(hex, digits, 16);
    hex[16] = '\0';
    *got = sealed_sum(text, len, digits);
    if (ddt_checksum_from_hex(hex, want))   /* not hex digits: a byte changed there */
        *want = ~*got;
    return *want == *got ? 0 : -EBADMSG;
}

/* ------------------------------------------------------------------------------------------
 * The JSON form {"size": N, "xxh64": "HEX"}
 */

static const char *const checksum_keys[] = { "size", "xxh64", NULL };

cJSON *ddt_checksum_json(const ddt_checksum *c)
{
    char hex[DDT_CHECKSUM_HEX];
    ddt_checksum_hex(c->xxh64, hex);
    cJSON *o = cJSON_CreateObject();
    if (o && (!cJSON_AddNumberToObject(o, "size", (double)c->size) || !cJSON_AddStringToObject(o, "xxh64", hex))) {
        cJSON_Delete(o);
        o = NULL;
    }
    return o;
}

int ddt_checksum_from_json(const ddt_json_ctx *j, const cJSON *obj, const char *name, ddt_checksum *out)
{
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!o)
        return ddt_json_fail(j, name, "is missing");
    if (!cJSON_IsObject(o))
        return ddt_json_fail(j, name, "must be an object {\"size\": N, \"xxh64\": \"16 hex digits\"}");
    char where[1200];
    snprintf(where, sizeof where, "%s: %s", j->path, name);
    ddt_json_ctx in = { where, j->err, j->err_len };
    ddt_checksum c;
    int rc = ddt_json_only(&in, o, checksum_keys);
    if (!rc)
        rc = ddt_json_int(&in, o, "size", 0, (int64_t)1 << 53, 0, 0, &c.size);
    if (!rc && ddt_checksum_from_hex(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "xxh64")), &c.xxh64))
        rc = ddt_json_fail(&in, "xxh64", "must be 16 lowercase hex digits");
    if (!rc)
        *out = c;
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Verdicts
 */

void ddt_verdict_good(ddt_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->state = DDT_VERDICT_GOOD;
}

void ddt_verdict_set(ddt_verdict *v, ddt_verdict_state state, const char *file, const char *fmt, ...)
{
    ddt_verdict_good(v);
    v->state = state;
    snprintf(v->file, sizeof v->file, "%s", file);
    va_list args;
    va_start(args, fmt);
    vsnprintf(v->detail, sizeof v->detail, fmt, args);
    va_end(args);
}

void ddt_verdict_unreadable(ddt_verdict *v, const char *file, const char *path, const char *err)
{
    size_t len = strlen(path);
    if (!strncmp(err, path, len) && !strncmp(err + len, ": ", 2))
        err += len + 2;
    ddt_verdict_set(v, DDT_VERDICT_CORRUPT, file, "%s", err[0] ? err : "cannot be read");
}

ddt_verdict_state ddt_checksum_verify(const char *dir, const char *name, const ddt_checksum *want, ddt_verdict *v)
{
    char path[4096], why[1024] = "";
    struct stat st;
    ddt_verdict_good(v);
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path)
        ddt_verdict_set(v, DDT_VERDICT_CORRUPT, name, "path too long to read");
    else if (stat(path, &st) != 0 && errno == ENOENT)
        ddt_verdict_set(v, DDT_VERDICT_INCOMPLETE, name, "missing");
    else if (stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        ddt_verdict_set(v, DDT_VERDICT_CORRUPT, name, "not a regular file");
    else if ((int64_t)st.st_size != want->size)
        ddt_verdict_set(v, DDT_VERDICT_CORRUPT, name, "expected %lld bytes, got %lld", (long long)want->size,
                        (long long)st.st_size);
    else {
        ddt_checksum got;
        if (ddt_checksum_file(path, &got, why, sizeof why) != 0) {
            ddt_verdict_unreadable(v, name, path, why);
        } else if (got.xxh64 != want->xxh64 || got.size != want->size) {
            char a[DDT_CHECKSUM_HEX], b[DDT_CHECKSUM_HEX];
            ddt_checksum_hex(want->xxh64, a);
            ddt_checksum_hex(got.xxh64, b);
            ddt_verdict_set(v, DDT_VERDICT_CORRUPT, name, "expected xxh64 %s, got %s", a, b);
        }
    }
    return v->state;
}

void ddt_verdict_text(const ddt_verdict *v, char *out, size_t len)
{
    switch (v->state) {
    case DDT_VERDICT_GOOD:
        snprintf(out, len, "good");
        break;
    case DDT_VERDICT_UNVERIFIED:
        snprintf(out, len, "unverified (written before checksums)");
        break;
    case DDT_VERDICT_INCOMPLETE:
        snprintf(out, len, "incomplete: %s missing", v->file);
        break;
    case DDT_VERDICT_CORRUPT:
        snprintf(out, len, "corrupt: %s (%s)", v->file, v->detail);
        break;
    }
}

int ddt_verdict_fail(const ddt_verdict *v, const char *dir, const char *remedy, char *err, size_t err_len)
{
    if (v->state == DDT_VERDICT_INCOMPLETE)
        return ddt_fail(err, err_len, -ENOENT, "%s/%s is missing: %s", dir, v->file, remedy);
    return ddt_fail(err, err_len, -EBADMSG, "%s/%s is corrupt (%s): %s", dir, v->file, v->detail, remedy);
}
