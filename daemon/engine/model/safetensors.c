/* safetensors.c: the safetensors format of SPEC.md section 4 (see safetensors.h).
 *
 * A file is: 8-byte little-endian header length N, N bytes of JSON padded with spaces to a
 * multiple of 8, then the data region. The JSON maps each tensor name to
 * {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the data region) and may
 * hold "__metadata__" (string values). The reader maps the file read-only and keeps tensor data
 * pointers into the mapping; it enforces every rule (tensors tile the data region with no gap or
 * overlap, sizes agree with dtype and shape, the file ends exactly where the last tensor ends)
 * and names the file and the broken rule when one fails. The writer is atomic: PATH.tmp,
 * fsync, rename, fsync of the directory.
 *
 * Not here: byte-swapping (the format and every host we run on are little-endian), lazy or
 * partial reads (a file is mapped whole), and hashing of names (ddt_st_find is a linear scan;
 * our files hold hundreds of tensors, not millions).
 *
 * Tested by tests/engine/model/test_safetensors.c: round trips of every dtype, the conversions against exact
 * tables and a reference, a table of corrupted files, sharded model directories and writer
 * failures.
 */
#include "base/checksum.h"
#include "base/errors.h"
#include "safetensors.h"
#include "ddk_bf16.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* A header larger than this is refused before it is copied or parsed: the reference
 * implementation's limit, far above any real checkpoint's header (a few hundred KB). */
#define ST_MAX_HEADER_BYTES 100000000ull
/* Offsets and shape entries are JSON numbers, i.e. doubles: above 2^53 they are not exact. */
#define ST_MAX_EXACT_INTEGER 9007199254740992.0
/* model.safetensors.index.json is read into memory whole; real ones are tens of KB. */
#define ST_MAX_INDEX_BYTES (64ll << 20)

/* ------------------------------------------------------------------------------------------
 * Errors: "PATH: what is wrong", returned as a negative errno
 */


/* ------------------------------------------------------------------------------------------
 * Dtypes
 */

static const struct {
    const char *name;
    size_t size;
} dtype_table[] = {
    [DDT_F32] = { "F32", 4 },  [DDT_F64] = { "F64", 8 }, [DDT_BF16] = { "BF16", 2 },
    [DDT_F16] = { "F16", 2 },  [DDT_I64] = { "I64", 8 }, [DDT_I32] = { "I32", 4 },
    [DDT_U8] = { "U8", 1 },
};
enum { DTYPE_COUNT = (int)(sizeof(dtype_table) / sizeof(dtype_table[0])) };

static int dtype_valid(ddt_dtype t)
{
    return (int)t >= 0 && (int)t < DTYPE_COUNT;
}

const char *ddt_dtype_name(ddt_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].name : "?";
}

size_t ddt_dtype_size(ddt_dtype t)
{
    return dtype_valid(t) ? dtype_table[t].size : 0;
}

static int dtype_from_name(const char *name, ddt_dtype *t)
{
    for (int i = 0; i < DTYPE_COUNT; i++)
        if (strcmp(name, dtype_table[i].name) == 0) {
            *t = (ddt_dtype)i;
            return 0;
        }
    return -1;
}

int64_t ddt_st_numel(const ddt_st_tensor *t)
{
    int64_t n = 1;
    for (int d = 0; d < t->ndim; d++)
        n *= t->shape[d];
    return n;
}

/* numel of a shape, or -1 when it does not fit in int64 (a zero dimension makes it 0 whatever
 * the others are). */
static int64_t shape_numel(const int64_t *shape, int ndim)
{
    for (int d = 0; d < ndim; d++)
        if (shape[d] == 0)
            return 0;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0 || n > INT64_MAX / shape[d])
            return -1;
        n *= shape[d];
    }
    return n;
}

/* "F32 [2, 2]" for error messages. */
static const char *shape_text(ddt_dtype t, const int64_t *shape, int ndim, char *buf, size_t len)
{
    size_t n = (size_t)snprintf(buf, len, "%s [", ddt_dtype_name(t));
    for (int d = 0; d < ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
    return buf;
}

/* ------------------------------------------------------------------------------------------
 * Conversions (bit patterns through ddk_bf16.h's memcpy helpers).
 */


uint16_t ddt_f32_to_bf16(float x)
{
    return ddk_f32_to_bf16(x);
}

float ddt_bf16_to_f32(uint16_t x)
{
    return ddk_bf16_to_f32(x);
}

uint16_t ddt_f32_to_f16(float x)
{
    uint32_t u = ddk_f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u > 0x7f800000u)   /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((u >> 13) & 0x3ffu));
    if (u == 0x7f800000u)
        return (uint16_t)(sign | 0x7c00u);
    int exp = (int)(u >> 23) - 127 + 15;   /* the f16 biased exponent */
    if (exp >= 31)
        return (uint16_t)(sign | 0x7c00u);   /* overflow */
    if (exp <= 0) {
        /* subnormal f16 (or zero): value = m * 2^-24; below 2^-25 everything rounds to 0,
         * and exactly 2^-25 is a tie that goes to the even 0 */
        if (exp < -10)
            return sign;
        uint32_t mant = (u & 0x7fffffu) | 0x800000u;
        int shift = 14 - exp;   /* 14 .. 24 */
        uint32_t m = mant >> shift;
        uint32_t rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
        if (rest > half || (rest == half && (m & 1u)))
            m++;   /* may become 0x400: the smallest normal, which is right */
        return (uint16_t)(sign | m);
    }
    uint32_t h = ((uint32_t)exp << 10) | ((u >> 13) & 0x3ffu);
    uint32_t rest = u & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++;   /* a carry into the exponent is right; 0x7bff + 1 is inf */
    return (uint16_t)(sign | h);
}

float ddt_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exp = (x >> 10) & 0x1fu, mant = x & 0x3ffu;
    if (exp == 0) {
        if (mant == 0)
            return ddk_f32_from_bits(sign);
        uint32_t e = 127 - 14;   /* normalise the subnormal: 2^-14 * 0.mant */
        while (!(mant & 0x400u)) {
            mant <<= 1;
            e--;
        }
        return ddk_f32_from_bits(sign | (e << 23) | ((mant & 0x3ffu) << 13));
    }
    if (exp == 31)   /* inf, or NaN with its payload */
        return ddk_f32_from_bits(sign | 0x7f800000u | (mant << 13));
    return ddk_f32_from_bits(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

int ddt_st_range_to_f32(const ddt_st_tensor *t, int64_t first, int64_t count, float *out)
{
    const unsigned char *p = t->data;   /* may be unaligned for the dtype: read with memcpy */
    const int64_t end = first + count;
    switch (t->dtype) {
    case DDT_F32:
        if (count > 0)
            memcpy(out, p + first * 4, (size_t)count * sizeof(float));
        return 0;
    case DDT_F64:
        for (int64_t i = first; i < end; i++) {
            double v;
            memcpy(&v, p + i * 8, sizeof(v));
            out[i - first] = (float)v;
        }
        return 0;
    case DDT_BF16:
    case DDT_F16:
        for (int64_t i = first; i < end; i++) {
            uint16_t v;
            memcpy(&v, p + i * 2, sizeof(v));
            out[i - first] = t->dtype == DDT_BF16 ? ddt_bf16_to_f32(v) : ddt_f16_to_f32(v);
        }
        return 0;
    default:
        return -EINVAL;
    }
}

int ddt_st_to_f32(const ddt_st_tensor *t, float *out)
{
    return ddt_st_range_to_f32(t, 0, ddt_st_numel(t), out);
}

/* ------------------------------------------------------------------------------------------
 * Reader
 */

void ddt_st_close(ddt_st_file *f)
{
    if (!f)
        return;
    if (f->map) {
        munmap(f->map, f->map_bytes);
        close(f->fd);
    }
    for (int i = 0; i < f->count; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    for (int i = 0; i < f->meta_count; i++) {
        free(f->meta_keys[i]);
        free(f->meta_values[i]);
    }
    free(f->meta_keys);
    free(f->meta_values);
    free(f->path);
    memset(f, 0, sizeof(*f));
}

const ddt_st_tensor *ddt_st_find(const ddt_st_file *f, const char *name)
{
    for (int i = 0; i < f->count; i++)
        if (strcmp(f->tensors[i].name, name) == 0)
            return &f->tensors[i];
    return NULL;
}

const char *ddt_st_metadata(const ddt_st_file *f, const char *key)
{
    for (int i = 0; i < f->meta_count; i++)
        if (strcmp(f->meta_keys[i], key) == 0)
            return f->meta_values[i];
    return NULL;
}

/* A JSON number that is an exact non-negative integer no larger than 2^53. */
static int json_exact_uint(const cJSON *item, int64_t *value)
{
    if (!cJSON_IsNumber(item))
        return -1;
    double d = item->valuedouble;
    if (!(d >= 0.0 && d <= ST_MAX_EXACT_INTEGER) || (double)(int64_t)d != d)
        return -1;
    *value = (int64_t)d;
    return 0;
}

/* A tensor of the header before sorting: where its data lies in the data region. */
typedef struct st_span {
    int64_t begin, end;
    int header_order;
} st_span;

static int span_compare(const void *a, const void *b)
{
    const st_span *x = a, *y = b;
    if (x->begin != y->begin)
        return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end)   /* a zero-size tensor sits before a tensor starting where it is */
        return x->end < y->end ? -1 : 1;
    return (x->header_order > y->header_order) - (x->header_order < y->header_order);
}

static int name_compare(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Validates one tensor entry of the header into t (name not yet set) and span. */
static int parse_tensor_entry(const char *path, const cJSON *entry, ddt_st_tensor *t,
                              st_span *span, char *err, size_t err_len)
{
    const char *name = entry->string;
    if (!cJSON_IsObject(entry))
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' is not a JSON object with dtype, shape and data_offsets", name);
    const cJSON *dtype = NULL, *shape = NULL, *offsets = NULL;
    for (const cJSON *field = entry->child; field; field = field->next) {
        const cJSON **slot = strcmp(field->string, "dtype") == 0          ? &dtype
                             : strcmp(field->string, "shape") == 0        ? &shape
                             : strcmp(field->string, "data_offsets") == 0 ? &offsets
                                                                          : NULL;
        if (!slot)
            return ddt_fail_path(err, err_len, -EINVAL, path,
                           "tensor '%s' has an unknown field '%s' (allowed: dtype, shape, "
                           "data_offsets)", name, field->string);
        if (*slot)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' has a duplicate field '%s'",
                           name, field->string);
        *slot = field;
    }

    if (!dtype || !cJSON_IsString(dtype))
        return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' has no dtype string", name);
    if (dtype_from_name(dtype->valuestring, &t->dtype) != 0)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' has unknown dtype '%s' (supported: F32 F64 BF16 F16 I64 I32 "
                       "U8)", name, dtype->valuestring);

    if (!shape || !cJSON_IsArray(shape))
        return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' has no shape array", name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > DDT_ST_MAX_DIMS)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' shape has %d dimensions, more than the %d supported", name,
                       ndim, DDT_ST_MAX_DIMS);
    t->ndim = 0;
    for (const cJSON *dim = shape->child; dim; dim = dim->next) {
        if (json_exact_uint(dim, &t->shape[t->ndim]) != 0)
            return ddt_fail_path(err, err_len, -EINVAL, path,
                           "tensor '%s' shape entry %d is not a non-negative integer", name,
                           t->ndim);
        t->ndim++;
    }
    int64_t numel = shape_numel(t->shape, t->ndim);
    size_t dsize = ddt_dtype_size(t->dtype);
    char text[256];
    if (numel < 0 || numel > INT64_MAX / (int64_t)dsize)
        return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' %s: its byte size overflows",
                       name, shape_text(t->dtype, t->shape, t->ndim, text, sizeof(text)));

    int64_t begin, end;
    if (!offsets || !cJSON_IsArray(offsets) || cJSON_GetArraySize(offsets) != 2 ||
        json_exact_uint(offsets->child, &begin) != 0 ||
        json_exact_uint(offsets->child->next, &end) != 0)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' data_offsets must be [begin, end], two non-negative integers",
                       name);
    if (begin > end)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' data_offsets [%lld, %lld] end before they begin", name,
                       (long long)begin, (long long)end);
    if (end - begin != numel * (int64_t)dsize)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "tensor '%s' data_offsets [%lld, %lld] hold %lld bytes but %s needs %lld",
                       name, (long long)begin, (long long)end, (long long)(end - begin),
                       shape_text(t->dtype, t->shape, t->ndim, text, sizeof(text)),
                       (long long)(numel * (int64_t)dsize));
    span->begin = begin;
    span->end = end;
    t->bytes = (size_t)(end - begin);
    return 0;
}

static int parse_metadata(const char *path, const cJSON *meta, ddt_st_file *f, char *err,
                          size_t err_len)
{
    if (!cJSON_IsObject(meta))
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "__metadata__ is not a JSON object of string values");
    int n = cJSON_GetArraySize(meta);
    f->meta_keys = calloc((size_t)n + 1, sizeof(char *));
    f->meta_values = calloc((size_t)n + 1, sizeof(char *));
    if (!f->meta_keys || !f->meta_values)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory reading __metadata__");
    for (const cJSON *item = meta->child; item; item = item->next) {
        if (!cJSON_IsString(item))
            return ddt_fail_path(err, err_len, -EINVAL, path,
                           "__metadata__ value of '%s' is not a string (metadata values must "
                           "be strings)", item->string);
        for (int i = 0; i < f->meta_count; i++)
            if (strcmp(f->meta_keys[i], item->string) == 0)
                return ddt_fail_path(err, err_len, -EINVAL, path, "__metadata__ has a duplicate key '%s'",
                               item->string);
        f->meta_keys[f->meta_count] = strdup(item->string);
        f->meta_values[f->meta_count] = strdup(item->valuestring);
        f->meta_count++;   /* counted before the check so that close frees a half pair */
        if (!f->meta_keys[f->meta_count - 1] || !f->meta_values[f->meta_count - 1])
            return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory reading __metadata__");
    }
    return 0;
}

/* Everything after the mapping: the header length, the JSON, every tensor, the tiling. */
static int parse_mapped(ddt_st_file *f, char *err, size_t err_len)
{
    const char *path = f->path;
    const unsigned char *bytes = f->map;
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; i--)
        header_len = (header_len << 8) | bytes[i];
    uint64_t file_bytes = f->map_bytes;
    if (header_len > ST_MAX_HEADER_BYTES)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "header length %llu exceeds the %llu-byte limit (not a safetensors file, "
                       "or a corrupted one)", (unsigned long long)header_len,
                       ST_MAX_HEADER_BYTES);
    if (header_len > file_bytes - 8)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "header length %llu goes beyond the end of the file (%llu bytes after the "
                       "length): the file is truncated", (unsigned long long)header_len,
                       (unsigned long long)(file_bytes - 8));
    if (header_len == 0)
        return ddt_fail_path(err, err_len, -EINVAL, path, "header is empty (length 0)");
    if (header_len % 8 != 0)
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "header length %llu is not a multiple of 8 (the header must be padded "
                       "with spaces)", (unsigned long long)header_len);
    const char *header = (const char *)bytes + 8;
    if (memchr(header, '\0', header_len))
        return ddt_fail_path(err, err_len, -EINVAL, path, "header contains a NUL byte");

    char *text = malloc(header_len + 1);   /* cJSON wants a NUL-terminated copy */
    if (!text)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory for a %llu-byte header",
                       (unsigned long long)header_len);
    memcpy(text, header, header_len);
    text[header_len] = '\0';
    const char *json_end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, header_len, &json_end, 0);
    st_span *spans = NULL;
    const char **names = NULL;
    ddt_st_tensor *parsed = NULL;   /* (entries) in header order, names borrowed from root */
    int rc = 0;
    if (!root) {
        size_t at = json_end && json_end >= text ? (size_t)(json_end - text) : 0;
        rc = ddt_fail_path(err, err_len, -EINVAL, path, "header is not valid JSON (error near byte %zu)",
                     at);
        goto done;
    }
    for (const char *p = json_end; p < text + header_len; p++)
        if (*p != ' ') {
            rc = ddt_fail_path(err, err_len, -EINVAL, path,
                         "header has something other than space padding after the JSON (byte "
                         "%zu)", (size_t)(p - text));
            goto done;
        }
    if (!cJSON_IsObject(root)) {
        rc = ddt_fail_path(err, err_len, -EINVAL, path, "header is not a JSON object");
        goto done;
    }

    /* Names: unique (cJSON keeps duplicate keys; we refuse them), the metadata found. */
    int entries = cJSON_GetArraySize(root);
    names = malloc(((size_t)entries + 1) * sizeof(*names));
    parsed = calloc((size_t)entries + 1, sizeof(*parsed));
    f->tensors = calloc((size_t)entries + 1, sizeof(*f->tensors));
    spans = calloc((size_t)entries + 1, sizeof(*spans));
    if (!names || !parsed || !f->tensors || !spans) {
        rc = ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory for %d header entries", entries);
        goto done;
    }
    int name_count = 0;
    for (const cJSON *item = root->child; item; item = item->next)
        names[name_count++] = item->string;
    qsort(names, (size_t)name_count, sizeof(*names), name_compare);
    for (int i = 1; i < name_count; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            rc = ddt_fail_path(err, err_len, -EINVAL, path, "header names '%s' twice (duplicate name)",
                         names[i]);
            goto done;
        }

    /* Every tensor, in header order. */
    int count = 0;
    for (const cJSON *item = root->child; item; item = item->next) {
        if (strcmp(item->string, "__metadata__") == 0) {
            rc = parse_metadata(path, item, f, err, err_len);
        } else if (item->string[0] == '\0') {
            rc = ddt_fail_path(err, err_len, -EINVAL, path, "header has a tensor with an empty name");
        } else {
            rc = parse_tensor_entry(path, item, &parsed[count], &spans[count], err, err_len);
            parsed[count].name = (char *)item->string;   /* borrowed until copied below */
            spans[count].header_order = count;
            count++;
        }
        if (rc != 0)
            goto done;
    }

    /* The tiling: sorted by offset, the first at 0, each where the previous ended. */
    qsort(spans, (size_t)count, sizeof(*spans), span_compare);
    int64_t data_end = 0;
    for (int i = 0; i < count; i++) {
        const ddt_st_tensor *t = &parsed[spans[i].header_order];
        const char *prev = i ? parsed[spans[i - 1].header_order].name : NULL;
        if (i == 0 && spans[i].begin != 0)
            rc = ddt_fail_path(err, err_len, -EINVAL, path,
                         "first tensor '%s' begins at %lld, not 0 (tensors must tile the data "
                         "region from its start)", t->name, (long long)spans[i].begin);
        else if (spans[i].begin > data_end)
            rc = ddt_fail_path(err, err_len, -EINVAL, path,
                         "gap of %lld bytes between tensor '%s' (ends at %lld) and '%s' (begins "
                         "at %lld)", (long long)(spans[i].begin - data_end), prev,
                         (long long)data_end, t->name, (long long)spans[i].begin);
        else if (spans[i].begin < data_end)
            rc = ddt_fail_path(err, err_len, -EINVAL, path,
                         "tensor '%s' [%lld, %lld] overlaps tensor '%s' (ends at %lld)", t->name,
                         (long long)spans[i].begin, (long long)spans[i].end, prev,
                         (long long)data_end);
        if (rc != 0)
            goto done;
        data_end = spans[i].end;
    }
    uint64_t expected = 8 + header_len + (uint64_t)data_end;
    if (file_bytes < expected)
        rc = ddt_fail_path(err, err_len, -EINVAL, path,
                     "file is %llu bytes but its tensors end at byte %llu: the file is truncated",
                     (unsigned long long)file_bytes, (unsigned long long)expected);
    else if (file_bytes > expected)
        rc = ddt_fail_path(err, err_len, -EINVAL, path,
                     "%llu trailing bytes after the last tensor (file is %llu bytes, data ends at "
                     "%llu)", (unsigned long long)(file_bytes - expected),
                     (unsigned long long)file_bytes, (unsigned long long)expected);
    if (rc != 0)
        goto done;

    /* Copy out in offset order, names owned, data pointing into the mapping. */
    const unsigned char *data = bytes + 8 + header_len;
    for (int i = 0; i < count; i++) {
        ddt_st_tensor *t = &f->tensors[i];
        *t = parsed[spans[i].header_order];
        t->data = data + spans[i].begin;
        t->name = strdup(t->name);
        f->count++;
        if (!t->name) {
            rc = ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory for tensor names");
            break;
        }
    }

done:
    free(parsed);
    free(spans);
    free(names);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int ddt_st_open(const char *path, ddt_st_file *f, char *err, size_t err_len)
{
    memset(f, 0, sizeof(*f));
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return ddt_fail_path(err, err_len, -e, path, "cannot open: %s", strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ddt_fail_path(err, err_len, -e, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ddt_fail_path(err, err_len, S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL, path,
                       "not a regular file");
    }
    if (st.st_size < 8) {
        close(fd);
        return ddt_fail_path(err, err_len, -EINVAL, path,
                       "file is %lld bytes, too short for the 8-byte header length (truncated?)",
                       (long long)st.st_size);
    }
    if ((unsigned long long)st.st_size > SIZE_MAX) {
        close(fd);
        return ddt_fail_path(err, err_len, -EFBIG, path, "file of %lld bytes cannot be mapped",
                       (long long)st.st_size);
    }
    size_t map_bytes = (size_t)st.st_size;
    void *map = mmap(NULL, map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (map == MAP_FAILED) {
        close(fd);
        return ddt_fail_path(err, err_len, -map_errno, path, "cannot map %zu bytes: %s", map_bytes,
                       strerror(map_errno));
    }

    f->map = map;
    f->map_bytes = map_bytes;
    f->fd = fd;   /* kept while mapped: the size now, for guarded reads (base/mapped.h) */
    f->path = strdup(path);
    int rc = f->path ? parse_mapped(f, err, err_len)
                     : ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    if (rc != 0)
        ddt_st_close(f);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Model directories: model.safetensors, or model.safetensors.index.json and its shards
 */

void ddt_st_model_close(ddt_st_model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->file_count; i++)
        ddt_st_close(&m->files[i]);
    free(m->files);
    memset(m, 0, sizeof(*m));
}

const ddt_st_tensor *ddt_st_model_find(const ddt_st_model *m, const char *name)
{
    for (int i = 0; i < m->file_count; i++) {
        const ddt_st_tensor *t = ddt_st_find(&m->files[i], name);
        if (t)
            return t;
    }
    return NULL;
}

static char *path_join(const char *dir, const char *name)
{
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (p)
        snprintf(p, a + b + 2, "%s%s%s", dir, a && dir[a - 1] == '/' ? "" : "/", name);
    return p;
}

/* The whole of a small file, NUL-terminated, into *text. */
static int read_small_file(const char *path, long long limit, char **text, size_t *len,
                           char *err, size_t err_len)
{
    *text = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return ddt_fail_path(err, err_len, -e, path, "cannot open: %s", strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ddt_fail_path(err, err_len, -e, path, "cannot stat: %s", strerror(e));
    }
    if (!S_ISREG(st.st_mode) || st.st_size > limit) {
        close(fd);
        return ddt_fail_path(err, err_len, -EINVAL, path, "not a regular file of at most %lld bytes",
                       limit);
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    }
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            int e = r < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return ddt_fail_path(err, err_len, -e, path, "read failed: %s",
                           r < 0 ? strerror(e) : "file shrank while reading");
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return 0;
}

/* Opens the shards an index names. */
static int open_sharded(const char *dir, const char *index_path, ddt_st_model *m, char *err,
                        size_t err_len)
{
    char *text = NULL;
    size_t len = 0;
    int rc = read_small_file(index_path, ST_MAX_INDEX_BYTES, &text, &len, err, err_len);
    if (rc != 0)
        return rc;
    /* the length counts the terminator: cJSON looks for it after the value */
    cJSON *root = cJSON_ParseWithLengthOpts(text, len + 1, NULL, 1);
    const cJSON *weight_map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const char **shards = NULL;
    char *shard_path = NULL;
    if (!root) {
        rc = ddt_fail_path(err, err_len, -EINVAL, index_path, "not valid JSON");
        goto done;
    }
    if (!cJSON_IsObject(weight_map) || !weight_map->child) {
        rc = ddt_fail_path(err, err_len, -EINVAL, index_path,
                     "has no \"weight_map\" object naming the shard of each tensor");
        goto done;
    }

    /* The distinct shards, in the order the weight map first names them. */
    int names = cJSON_GetArraySize(weight_map);
    shards = calloc((size_t)names, sizeof(*shards));
    m->files = calloc((size_t)names, sizeof(*m->files));
    if (!shards || !m->files) {
        rc = ddt_fail_path(err, err_len, -ENOMEM, index_path, "out of memory");
        goto done;
    }
    int shard_count = 0;
    for (const cJSON *item = weight_map->child; item; item = item->next) {
        if (!cJSON_IsString(item) || !item->valuestring[0] || strchr(item->valuestring, '/') ||
            strcmp(item->valuestring, ".") == 0 || strcmp(item->valuestring, "..") == 0) {
            rc = ddt_fail_path(err, err_len, -EINVAL, index_path,
                         "weight_map entry '%s' must name a shard file in %s", item->string, dir);
            goto done;
        }
        for (const cJSON *prev = weight_map->child; prev != item; prev = prev->next)
            if (strcmp(prev->string, item->string) == 0) {
                rc = ddt_fail_path(err, err_len, -EINVAL, index_path,
                             "weight_map names tensor '%s' twice", item->string);
                goto done;
            }
        int known = 0;
        for (int s = 0; s < shard_count && !known; s++)
            known = strcmp(shards[s], item->valuestring) == 0;
        if (!known)
            shards[shard_count++] = item->valuestring;
    }

    for (int s = 0; s < shard_count; s++) {
        free(shard_path);
        shard_path = path_join(dir, shards[s]);
        if (!shard_path) {
            rc = ddt_fail_path(err, err_len, -ENOMEM, index_path, "out of memory");
            goto done;
        }
        rc = ddt_st_open(shard_path, &m->files[s], err, err_len);
        if (rc != 0)
            goto done;
        m->file_count++;
    }

    /* Every name where the index says it is. */
    for (const cJSON *item = weight_map->child; item; item = item->next) {
        int s = 0;
        while (strcmp(shards[s], item->valuestring) != 0)
            s++;
        if (!ddt_st_find(&m->files[s], item->string)) {
            rc = ddt_fail_path(err, err_len, -EINVAL, index_path,
                         "tensor '%s' is listed in shard '%s' but that shard does not hold it",
                         item->string, item->valuestring);
            goto done;
        }
    }

done:
    free(shard_path);
    free(shards);
    cJSON_Delete(root);
    free(text);
    return rc;
}

int ddt_st_model_open(const char *dir, ddt_st_model *m, char *err, size_t err_len)
{
    memset(m, 0, sizeof(*m));
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char *single_path = path_join(dir, "model.safetensors");
    int rc;
    struct stat st;
    if (!index_path || !single_path) {
        rc = ddt_fail_path(err, err_len, -ENOMEM, dir, "out of memory");
    } else if (stat(index_path, &st) == 0) {
        rc = open_sharded(dir, index_path, m, err, err_len);
    } else if (errno != ENOENT) {
        int e = errno;
        rc = ddt_fail_path(err, err_len, -e, index_path, "cannot stat: %s", strerror(e));
    } else if (stat(single_path, &st) == 0) {
        m->files = calloc(1, sizeof(*m->files));
        rc = !m->files ? ddt_fail_path(err, err_len, -ENOMEM, dir, "out of memory")
                       : ddt_st_open(single_path, &m->files[0], err, err_len);
        if (rc == 0)
            m->file_count = 1;
    } else if (errno == ENOENT) {
        rc = ddt_fail_path(err, err_len, -ENOENT, dir,
                     "neither model.safetensors nor model.safetensors.index.json is there (is "
                     "this a Hugging Face model directory?)");
    } else {
        int e = errno;
        rc = ddt_fail_path(err, err_len, -e, single_path, "cannot stat: %s", strerror(e));
    }
    free(index_path);
    free(single_path);
    if (rc != 0)
        ddt_st_model_close(m);
    return rc;
}

/* ------------------------------------------------------------------------------------------
 * Writer
 */

/* A decimal integer as it must appear in the header ("%lld": cJSON would print large doubles
 * with an exponent). */
static cJSON *json_integer(int64_t v)
{
    char text[32];
    snprintf(text, sizeof(text), "%lld", (long long)v);
    return cJSON_CreateRaw(text);
}

/* Checks the entries and metadata; bytes[i] = the size of tensor i. */
static int validate_entries(const char *path, const ddt_st_entry *tensors, int count,
                            const char *const *meta_keys, const char *const *meta_values,
                            int meta_count, size_t *bytes, char *err, size_t err_len)
{
    if (count < 0 || (count > 0 && !tensors))
        return ddt_fail_path(err, err_len, -EINVAL, path, "invalid tensor list (count %d)", count);
    if (meta_count < 0 || (meta_count > 0 && (!meta_keys || !meta_values)))
        return ddt_fail_path(err, err_len, -EINVAL, path, "invalid metadata (count %d)", meta_count);
    uint64_t total = 0;
    for (int i = 0; i < count; i++) {
        const ddt_st_entry *e = &tensors[i];
        if (!e->name || !e->name[0] || strcmp(e->name, "__metadata__") == 0)
            return ddt_fail_path(err, err_len, -EINVAL, path,
                           "tensor %d has an empty or reserved name", i);
        if (!dtype_valid(e->dtype))
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' has invalid dtype %d",
                           e->name, (int)e->dtype);
        if (e->ndim < 0 || e->ndim > DDT_ST_MAX_DIMS)
            return ddt_fail_path(err, err_len, -EINVAL, path,
                           "tensor '%s' has ndim %d (allowed: 0 to %d)", e->name, e->ndim,
                           DDT_ST_MAX_DIMS);
        for (int d = 0; d < e->ndim; d++)
            if (e->shape[d] < 0)
                return ddt_fail_path(err, err_len, -EINVAL, path,
                               "tensor '%s' has negative dimension %lld", e->name,
                               (long long)e->shape[d]);
        int64_t numel = shape_numel(e->shape, e->ndim);
        size_t dsize = ddt_dtype_size(e->dtype);
        if (numel < 0 || (uint64_t)numel > (uint64_t)(ST_MAX_EXACT_INTEGER / (double)dsize))
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' is too large", e->name);
        bytes[i] = (size_t)numel * dsize;
        total += bytes[i];
        if (total > (uint64_t)ST_MAX_EXACT_INTEGER)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensors are too large in total");
        if (bytes[i] > 0 && !e->data)
            return ddt_fail_path(err, err_len, -EINVAL, path, "tensor '%s' has no data (NULL)",
                           e->name);
    }
    /* Unique names: sort pointers to them. */
    const char **names = malloc(((size_t)count + 1) * sizeof(*names));
    if (!names)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    for (int i = 0; i < count; i++)
        names[i] = tensors[i].name;
    qsort(names, (size_t)count, sizeof(*names), name_compare);
    int rc = 0;
    for (int i = 1; i < count && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0)
            rc = ddt_fail_path(err, err_len, -EINVAL, path, "tensor name '%s' is given twice",
                         names[i]);
    free(names);
    if (rc != 0)
        return rc;
    for (int i = 0; i < meta_count; i++) {
        if (!meta_keys[i] || !meta_values[i])
            return ddt_fail_path(err, err_len, -EINVAL, path, "metadata entry %d is NULL", i);
        for (int j = 0; j < i; j++)
            if (strcmp(meta_keys[i], meta_keys[j]) == 0)
                return ddt_fail_path(err, err_len, -EINVAL, path, "metadata key '%s' is given twice",
                               meta_keys[i]);
    }
    return 0;
}

/* The header: 8-byte length, then the JSON padded with spaces to a multiple of 8. */
static int build_header(const char *path, const ddt_st_entry *tensors, int count,
                        const size_t *bytes, const char *const *meta_keys,
                        const char *const *meta_values, int meta_count, unsigned char **header,
                        size_t *header_bytes, char *err, size_t err_len)
{
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject();
    int ok = root && meta && cJSON_AddItemToObject(root, "__metadata__", meta);
    if (!ok)
        cJSON_Delete(meta);
    int has_format = 0;
    for (int i = 0; ok && i < meta_count; i++) {
        has_format |= strcmp(meta_keys[i], "format") == 0;
        ok = cJSON_AddStringToObject(meta, meta_keys[i], meta_values[i]) != NULL;
    }
    if (ok && !has_format)
        ok = cJSON_AddStringToObject(meta, "format", "pt") != NULL;
    int64_t offset = 0;
    for (int i = 0; ok && i < count; i++) {
        const ddt_st_entry *e = &tensors[i];
        cJSON *entry = cJSON_AddObjectToObject(root, e->name);
        ok = entry && cJSON_AddStringToObject(entry, "dtype", ddt_dtype_name(e->dtype));
        cJSON *shape = ok ? cJSON_AddArrayToObject(entry, "shape") : NULL;
        cJSON *offsets = shape ? cJSON_AddArrayToObject(entry, "data_offsets") : NULL;
        ok = offsets != NULL;
        for (int d = 0; ok && d < e->ndim; d++)
            ok = cJSON_AddItemToArray(shape, json_integer(e->shape[d]));
        ok = ok && cJSON_AddItemToArray(offsets, json_integer(offset));
        offset += (int64_t)bytes[i];
        ok = ok && cJSON_AddItemToArray(offsets, json_integer(offset));
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory building the header");
    size_t json_len = strlen(json), padded = (json_len + 7) / 8 * 8;
    *header = malloc(8 + padded);
    if (!*header) {
        free(json);
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory building the header");
    }
    for (int i = 0; i < 8; i++)
        (*header)[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    memcpy(*header + 8, json, json_len);
    memset(*header + 8 + json_len, ' ', padded - json_len);
    *header_bytes = 8 + padded;
    free(json);
    return 0;
}

/* fsync of the directory holding path, so that the rename survives a crash. */
static int sync_parent_dir(const char *path)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash == path ? strdup("/") : slash ? strndup(path, (size_t)(slash - path))
                                                    : strdup(".");
    if (!dir)
        return -ENOMEM;
    int rc = ddt_fsync_dir(dir);
    free(dir);
    return rc;
}

int ddt_st_write(const char *path, const ddt_st_entry *tensors, int count,
                 const char *const *meta_keys, const char *const *meta_values, int meta_count,
                 char *err, size_t err_len)
{
    return ddt_st_write_summed(path, tensors, count, meta_keys, meta_values, meta_count, NULL, err, err_len);
}

int ddt_st_write_summed(const char *path, const ddt_st_entry *tensors, int count,
                        const char *const *meta_keys, const char *const *meta_values, int meta_count,
                        ddt_checksum *sum, char *err, size_t err_len)
{
    size_t *bytes = calloc((size_t)(count > 0 ? count : 0) + 1, sizeof(*bytes));
    if (!bytes)
        return ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    int rc = validate_entries(path, tensors, count, meta_keys, meta_values, meta_count, bytes, err,
                              err_len);
    unsigned char *header = NULL;
    size_t header_bytes = 0;
    if (rc == 0)
        rc = build_header(path, tensors, count, bytes, meta_keys, meta_values, meta_count,
                          &header, &header_bytes, err, err_len);
    char *tmp_path = NULL;
    ddt_checksum_stream *summing = NULL;   /* over the bytes as written */
    if (rc == 0 && sum && !(summing = ddt_checksum_begin()))
        rc = ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    if (rc == 0) {
        size_t n = strlen(path) + 5;
        tmp_path = malloc(n);
        if (tmp_path)
            snprintf(tmp_path, n, "%s.tmp", path);
        else
            rc = ddt_fail_path(err, err_len, -ENOMEM, path, "out of memory");
    }
    if (rc != 0)
        goto done;

    int fd = open(tmp_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        rc = -errno;
        ddt_fail_path(err, err_len, rc, path, "cannot create %s: %s", tmp_path, strerror(-rc));
        goto done;   /* nothing of ours to remove */
    }
    rc = ddt_write_all(fd, header, header_bytes);
    if (summing)
        ddt_checksum_update(summing, header, header_bytes);
    for (int i = 0; rc == 0 && i < count; i++) {
        rc = ddt_write_all(fd, tensors[i].data, bytes[i]);
        if (summing)
            ddt_checksum_update(summing, tensors[i].data, bytes[i]);
    }
    const char *failed = rc != 0 ? "write" : NULL;
    if (failed)
        close(fd);
    else
        failed = ddt_sync_close(fd, &rc);
    if (!failed && rename(tmp_path, path) != 0) {
        rc = -errno;
        failed = "rename";
    }
    if (failed)
        ddt_fail_path(err, err_len, rc, path, "cannot %s %s: %s (the old file, if any, is untouched)",
                failed, tmp_path, strerror(-rc));
    if (rc != 0) {
        unlink(tmp_path);
        goto done;
    }
    rc = sync_parent_dir(path);
    if (rc != 0)   /* the file is in place; only its durability across a crash is in doubt */
        ddt_fail_path(err, err_len, rc, path, "written, but fsync of its directory failed: %s",
                strerror(-rc));

done:
    if (summing) {
        ddt_checksum written = ddt_checksum_end(summing);
        if (rc == 0)
            *sum = written;
    }
    free(tmp_path);
    free(header);
    free(bytes);
    return rc;
}
