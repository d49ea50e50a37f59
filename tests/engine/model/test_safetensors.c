/* test_safetensors.c: the safetensors reader, writer, model directories and dtype conversions
 * of daemon/engine/model/safetensors.c (SPEC.md section 4).
 *
 * Round trips of every dtype (0-d scalars, zero-size tensors, tensors at unaligned offsets),
 * metadata, the header layout (length a multiple of 8, space padding, "format": "pt"); BF16 and
 * F16 conversions against exact tables and against an independent reference (nearest
 * representable value by double arithmetic, ties to even) on every 16-bit pattern and random
 * floats; a table of corrupted files, each rejected with -EINVAL and an error naming the file
 * and the rule; sharded model directories; and writer failures that must leave the old file
 * untouched and no .tmp behind. Fixtures are written by the test into a mkdtemp directory under
 * /tmp, removed at the end.
 *
 * ctest: exit 0 when every case passes; one line per case; a final "N passed, M failed".
 */
#include "model/safetensors.h"
#include "check.h"
#include "ddk_bf16.h"

#include <cjson/cJSON.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmp_dir[] = "/tmp/ddtree-st-XXXXXX";

/* ------------------------------------------------------------------------------------------
 * Helpers
 */

static const char *tmp_path(const char *name)
{
    static char paths[8][512];   /* a few alive at once */
    static int next;
    char *p = paths[next++ % 8];
    snprintf(p, 512, "%s/%s", tmp_dir, name);
    return p;
}

static int write_bytes(const char *path, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "wb");
    if (!fp)
        return -1;
    size_t w = n ? fwrite(bytes, 1, n, fp) : 0;
    return fclose(fp) == 0 && w == n ? 0 : -1;
}

/* The whole file into a malloc'ed buffer (NULL when it cannot be read). */
static unsigned char *read_bytes(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return NULL;
    unsigned char *buf = NULL;
    size_t cap = 0, len = 0;
    for (;;) {
        if (len == cap) {
            cap = cap ? 2 * cap : 4096;
            unsigned char *grown = realloc(buf, cap);
            if (!grown) {
                free(buf);
                fclose(fp);
                return NULL;
            }
            buf = grown;
        }
        size_t r = fread(buf + len, 1, cap - len, fp);
        len += r;
        if (r == 0)
            break;
    }
    fclose(fp);
    *n = len;
    return buf;
}

static int exists(const char *path)
{
    struct stat st;
    return lstat(path, &st) == 0;
}


static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rng_next(void)   /* xorshift64*: fixed seed, reproducible */
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}

/* ------------------------------------------------------------------------------------------
 * Round trips
 */

static void test_roundtrip_all_dtypes(void)
{
    /* Odd sizes first so that later tensors sit at offsets unaligned for their type. */
    static const uint8_t u8[7] = { 0, 1, 2, 127, 128, 254, 255 };
    static const float f32[6] = { 1.0f, -2.5f, 3.25e-20f, 6.0e30f, 0.0f, -0.0f };
    static const double f64[3] = { 1.0 / 3.0, -1e300, 4.9e-324 };
    static const uint16_t bf16[4] = { 0x3f80, 0xc000, 0x7f80, 0x0001 };
    static const uint16_t f16[5] = { 0x3c00, 0xc000, 0x7bff, 0x0001, 0x7c00 };
    static const int64_t i64[2] = { INT64_MIN, INT64_MAX };
    static const int32_t i32[3] = { -1, 0, 2147483647 };
    static const float scalar = 42.5f;
    ddt_st_entry entries[] = {
        { "bytes", DDT_U8, 1, { 7 }, u8 },
        { "matrix.f32", DDT_F32, 2, { 2, 3 }, f32 },
        { "f64", DDT_F64, 1, { 3 }, f64 },
        { "empty.before", DDT_F32, 2, { 0, 4 }, NULL },   /* zero-size: data may be NULL */
        { "bf16", DDT_BF16, 2, { 2, 2 }, bf16 },
        { "f16", DDT_F16, 1, { 5 }, f16 },
        { "i64", DDT_I64, 1, { 2 }, i64 },
        { "i32", DDT_I32, 3, { 1, 1, 3 }, i32 },
        { "scalar", DDT_F32, 0, { 0 }, &scalar },
        { "empty.u8", DDT_U8, 1, { 0 }, u8 },
        { "empty.last", DDT_BF16, 3, { 3, 0, 2 }, NULL },
    };
    const int count = (int)(sizeof(entries) / sizeof(entries[0]));
    const char *path = tmp_path("all.safetensors");
    char err[512] = "";
    int rc = ddt_st_write(path, entries, count, NULL, NULL, 0, err, sizeof(err));
    check(rc == 0, "write: %d %s", rc, err);
    check(!exists(tmp_path("all.safetensors.tmp")), "the .tmp file was left behind");

    ddt_st_file f;
    rc = ddt_st_open(path, &f, err, sizeof(err));
    check(rc == 0, "open: %d %s", rc, err);
    if (rc != 0)
        return;
    check(f.count == count, "count %d, want %d", f.count, count);
    check(strcmp(f.path, path) == 0, "path '%s'", f.path);
    for (int i = 0; i < count && i < f.count; i++) {
        const ddt_st_entry *e = &entries[i];
        const ddt_st_tensor *t = &f.tensors[i];   /* written contiguously in order: same order */
        check(strcmp(t->name, e->name) == 0, "tensor %d is '%s', want '%s'", i, t->name, e->name);
        check(ddt_st_find(&f, e->name) == t, "find('%s') did not return tensor %d", e->name, i);
        check(t->dtype == e->dtype, "'%s' dtype %s, want %s", e->name, ddt_dtype_name(t->dtype),
              ddt_dtype_name(e->dtype));
        check(t->ndim == e->ndim, "'%s' ndim %d, want %d", e->name, t->ndim, e->ndim);
        for (int d = 0; d < e->ndim; d++)
            check(t->shape[d] == e->shape[d], "'%s' shape[%d] %lld, want %lld", e->name, d,
                  (long long)t->shape[d], (long long)e->shape[d]);
        int64_t numel = 1;
        for (int d = 0; d < e->ndim; d++)
            numel *= e->shape[d];
        check(ddt_st_numel(t) == numel, "'%s' numel %lld, want %lld", e->name,
              (long long)ddt_st_numel(t), (long long)numel);
        size_t bytes = (size_t)numel * ddt_dtype_size(e->dtype);
        check(t->bytes == bytes, "'%s' bytes %zu, want %zu", e->name, t->bytes, bytes);
        check(bytes == 0 || memcmp(t->data, e->data, bytes) == 0, "'%s' data differs", e->name);
        const unsigned char *lo = f.map, *hi = lo + f.map_bytes, *p = t->data;
        check(p >= lo && p + bytes <= hi, "'%s' data outside the mapping", e->name);
    }
    check(ddt_st_find(&f, "absent") == NULL, "find('absent') found something");
    check(strcmp(ddt_st_metadata(&f, "format") ? ddt_st_metadata(&f, "format") : "", "pt") == 0,
          "no default \"format\": \"pt\"");
    check(ddt_st_metadata(&f, "absent") == NULL, "metadata('absent') found something");

    /* to_f32 on the float dtypes, including the F32 at an unaligned offset */
    const ddt_st_tensor *m = ddt_st_find(&f, "matrix.f32");
    check(m && ((uintptr_t)m->data & 3) != 0, "matrix.f32 is aligned: the test lost its point");
    float out[8];
    check(m && ddt_st_to_f32(m, out) == 0 && memcmp(out, f32, sizeof(f32)) == 0,
          "to_f32 of F32");
    const ddt_st_tensor *t64 = ddt_st_find(&f, "f64");
    check(t64 && ddt_st_to_f32(t64, out) == 0 && out[0] == (float)(1.0 / 3.0) &&
          isinf(out[1]) && out[1] < 0 && out[2] == 0.0f, "to_f32 of F64: %g %g %g", out[0],
          out[1], out[2]);
    const ddt_st_tensor *tb = ddt_st_find(&f, "bf16");
    check(tb && ddt_st_to_f32(tb, out) == 0 && out[0] == 1.0f && out[1] == -2.0f &&
          isinf(out[2]) && out[3] == ddk_f32_from_bits(0x00010000u), "to_f32 of BF16");
    const ddt_st_tensor *th = ddt_st_find(&f, "f16");
    check(th && ddt_st_to_f32(th, out) == 0 && out[0] == 1.0f && out[1] == -2.0f &&
          out[2] == 65504.0f && out[3] == ldexpf(1.0f, -24) && isinf(out[4]),
          "to_f32 of F16");
    const ddt_st_tensor *ts = ddt_st_find(&f, "scalar");
    check(ts && ts->ndim == 0 && ddt_st_numel(ts) == 1 && ddt_st_to_f32(ts, out) == 0 &&
          out[0] == 42.5f, "to_f32 of a 0-d scalar");
    check(ddt_st_to_f32(ddt_st_find(&f, "i32"), out) == -EINVAL, "to_f32 of I32 is not -EINVAL");
    check(ddt_st_to_f32(ddt_st_find(&f, "bytes"), out) == -EINVAL, "to_f32 of U8 is not -EINVAL");
    check(ddt_st_to_f32(ddt_st_find(&f, "empty.last"), out) == 0, "to_f32 of a zero-size BF16");
    ddt_st_close(&f);
    check(f.map == NULL && f.tensors == NULL && f.count == 0, "close left the struct set");
    ddt_st_close(&f);   /* twice is harmless */
}

static void test_metadata_roundtrip(void)
{
    const char *keys[] = { "format", "hidden_size", "target_layer_ids", "odd \"key\"\\" };
    const char *values[] = { "ddtree-features", "4096", "[1, 9, 17]", "line\nbreak \xc3\xa9 \t" };
    float w[3] = { 1, 2, 3 };
    ddt_st_entry e = { "w", DDT_F32, 1, { 3 }, w };
    const char *path = tmp_path("meta.safetensors");
    char err[512] = "";
    int rc = ddt_st_write(path, &e, 1, keys, values, 4, err, sizeof(err));
    check(rc == 0, "write: %d %s", rc, err);
    ddt_st_file f;
    rc = ddt_st_open(path, &f, err, sizeof(err));
    check(rc == 0, "open: %d %s", rc, err);
    if (rc != 0)
        return;
    check(f.meta_count == 4, "meta_count %d, want 4 (a caller's format replaces \"pt\")",
          f.meta_count);
    for (int i = 0; i < 4; i++) {
        const char *v = ddt_st_metadata(&f, keys[i]);
        check(v && strcmp(v, values[i]) == 0, "metadata '%s' = '%s', want '%s'", keys[i],
              v ? v : "(absent)", values[i]);
    }
    ddt_st_close(&f);

    /* No tensors at all: a header with only __metadata__, file size exactly 8 + N. */
    path = tmp_path("empty.safetensors");
    rc = ddt_st_write(path, NULL, 0, NULL, NULL, 0, err, sizeof(err));
    check(rc == 0, "write of no tensors: %d %s", rc, err);
    rc = ddt_st_open(path, &f, err, sizeof(err));
    check(rc == 0 && f.count == 0 && f.meta_count == 1, "open of no tensors: %d %s", rc, err);
    if (rc == 0)
        ddt_st_close(&f);
}

static void test_header_layout(void)
{
    uint16_t w[3] = { 0x3f80, 0x4000, 0x4040 };
    /* names of several lengths, so that the unpadded JSON is not by chance a multiple of 8 */
    ddt_st_entry e[] = { { "a", DDT_BF16, 1, { 3 }, w }, { "bb.weight", DDT_BF16, 1, { 1 }, w } };
    for (int variant = 0; variant < 8; variant++) {
        char name[16];
        snprintf(name, sizeof(name), "layer%.*s", variant, "xxxxxxx");
        e[1].name = name;
        const char *path = tmp_path("layout.safetensors");
        char err[512] = "";
        int rc = ddt_st_write(path, e, 2, NULL, NULL, 0, err, sizeof(err));
        check(rc == 0, "write: %d %s", rc, err);
        size_t n = 0;
        unsigned char *bytes = read_bytes(path, &n);
        check(bytes && n >= 8, "cannot read back %s", path);
        if (!bytes || n < 8) {
            free(bytes);
            return;
        }
        uint64_t header_len = 0;
        for (int i = 7; i >= 0; i--)
            header_len = header_len << 8 | bytes[i];
        check(header_len % 8 == 0, "header length %llu is not a multiple of 8",
              (unsigned long long)header_len);
        check(n == 8 + header_len + 8, "file is %zu bytes, want 8 + %llu + 8", n,
              (unsigned long long)header_len);
        if (n != 8 + header_len + 8) {
            free(bytes);
            return;
        }
        const char *json = (const char *)bytes + 8;
        size_t json_len = header_len;
        while (json_len > 0 && json[json_len - 1] == ' ')
            json_len--;
        check(json_len > 0 && json[json_len - 1] == '}', "the JSON does not end in '}'");
        check(header_len - json_len < 8, "%llu bytes of padding, more than needed",
              (unsigned long long)(header_len - json_len));
        check(memchr(json, '\n', header_len) == NULL, "the header is not compact JSON");
        cJSON *root = cJSON_ParseWithLengthOpts(json, json_len, NULL, 0);
        check(root != NULL, "the header is not JSON");
        const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "__metadata__");
        const cJSON *format = cJSON_GetObjectItemCaseSensitive(meta, "format");
        check(cJSON_IsString(format) && strcmp(format->valuestring, "pt") == 0,
              "__metadata__ has no \"format\": \"pt\"");
        check(root && root->child == meta, "__metadata__ is not the first entry");
        const cJSON *bb = cJSON_GetObjectItemCaseSensitive(root, name);
        const cJSON *offsets = cJSON_GetObjectItemCaseSensitive(bb, "data_offsets");
        check(cJSON_GetArraySize(offsets) == 2 && offsets->child->valuedouble == 6 &&
              offsets->child->next->valuedouble == 8,
              "second tensor's data_offsets are not [6, 8]");
        cJSON_Delete(root);
        free(bytes);
    }
}

/* ------------------------------------------------------------------------------------------
 * Conversions
 */

/* The f16 value of h from its definition (independent of the code under test). */
static double f16_value(uint16_t h)
{
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = exp == 0 ? ldexp(mant, -24) : exp == 31 ? (mant ? NAN : INFINITY)
                                                        : ldexp(1024 + mant, exp - 25);
    return h & 0x8000 ? -v : v;
}

/* Round-to-nearest-even by search: the nearest of the two neighbouring representable values,
 * the even one on a tie. `value` gives a code's value, with the infinity code counted as the
 * first value past the largest finite one (2^128 for BF16, 2^16 for F16): IEEE overflows
 * exactly when the rounded result would reach it. Positive x only; codes 0 .. inf_code. */
static uint16_t round_reference(double x, double (*value)(uint16_t), uint16_t inf_code,
                                double inf_value)
{
    uint16_t lo = 0, hi = inf_code;   /* value(lo) <= x < value(hi) or x beyond */
    if (x >= inf_value)
        return inf_code;
    while (hi - lo > 1) {
        uint16_t mid = (uint16_t)((lo + hi) / 2);
        if (value(mid) <= x)
            lo = mid;
        else
            hi = mid;
    }
    double vlo = value(lo), vhi = hi == inf_code ? inf_value : value(hi);
    if (x - vlo < vhi - x)
        return lo;
    if (x - vlo > vhi - x)
        return hi;
    return (lo & 1) ? hi : lo;
}

static double bf16_value(uint16_t b)
{
    return (double)ddk_f32_from_bits((uint32_t)b << 16);
}

static uint16_t bf16_reference(float x)
{
    uint16_t sign = (uint16_t)(ddk_f32_bits(x) >> 16 & 0x8000);
    return sign | round_reference(fabs((double)x), bf16_value, 0x7f80, ldexp(1, 128));
}

static uint16_t f16_reference(float x)
{
    uint16_t sign = (uint16_t)(ddk_f32_bits(x) >> 16 & 0x8000);
    return sign | round_reference(fabs((double)x), f16_value, 0x7c00, 65536.0);
}

/* Random floats: half uniform bit patterns, half in and around the F16 range, some with the
 * dropped bits forced to an exact tie. */
static float random_float(int i)
{
    uint32_t r = rng_next();
    if (i % 2 == 0)
        return ddk_f32_from_bits(r);
    uint32_t exp = 127 - 28 + rng_next() % 48;   /* 2^-28 .. 2^19 */
    uint32_t mant = r & 0x7fffff;
    if (i % 6 == 1)
        mant = (mant & ~0x1fffu) | 0x1000u;   /* F16 tie (normal range) */
    if (i % 6 == 3)
        mant = (mant & ~0xffffu) | 0x8000u;   /* BF16 tie */
    return ddk_f32_from_bits((r & 0x80000000u) | exp << 23 | mant);
}

#ifdef __FLT16_MAX__   /* the compiler's own f32 -> f16 conversion, where it has one */
static uint16_t f16_compiler(float x)
{
    _Float16 c = (_Float16)x;
    uint16_t bits;
    memcpy(&bits, &c, sizeof(bits));
    return bits;
}
#define F16_COMPILER f16_compiler
#else
#define F16_COMPILER NULL
#endif

/* convert (float -> the 16-bit type named `to`) against reference on 200000 random floats (NaNs
 * skipped), and against the compiler's own conversion where one is given; stops at the first
 * value that fails */
static void check_random_floats(const char *to, uint16_t (*convert)(float),
                                uint16_t (*reference)(float), uint16_t (*compiler)(float))
{
    for (int i = 0; i < 200000; i++) {
        float x = random_float(i);
        if (isnan(x))
            continue;
        uint16_t got = convert(x), want = reference(x);
        check(got == want, "f32 %08x (%g) -> %s %04x, reference %04x", ddk_f32_bits(x), x, to, got,
              want);
        if (compiler) {
            uint16_t own = compiler(x);
            check(got == own, "f32 %08x (%g) -> %s %04x, the compiler's conversion %04x",
                  ddk_f32_bits(x), x, to, got, own);
        }
        if (case_failed)
            return;
    }
}

static void test_bf16(void)
{
    static const struct {
        uint32_t f32;
        uint16_t bf16;
        const char *why;
    } table[] = {
        { 0x3f800000u, 0x3f80, "1.0" },
        { 0xc0000000u, 0xc000, "-2.0" },
        { 0x00000000u, 0x0000, "+0" },
        { 0x80000000u, 0x8000, "-0" },
        { 0x3f808000u, 0x3f80, "tie 1 + 2^-8 goes down to the even 1.0" },
        { 0x3f818000u, 0x3f82, "tie 1 + 3*2^-8 goes up to the even one" },
        { 0x3f808001u, 0x3f81, "just above a tie goes up" },
        { 0x3f807fffu, 0x3f80, "just below a tie goes down" },
        { 0x7f7f0000u, 0x7f7f, "max finite BF16 is exact" },
        { 0x7f7f7fffu, 0x7f7f, "below the overflow tie stays finite" },
        { 0x7f7f8000u, 0x7f80, "the overflow tie goes to inf (even)" },
        { 0x7f7fffffu, 0x7f80, "max finite F32 overflows to inf" },
        { 0x7f800000u, 0x7f80, "inf" },
        { 0xff800000u, 0xff80, "-inf" },
        { 0x00010000u, 0x0001, "smallest BF16 subnormal is exact" },
        { 0x00008000u, 0x0000, "half of it ties to the even 0" },
        { 0x00018000u, 0x0002, "1.5 of it ties up to the even 2" },
        { 0x7fc00000u, 0x7fc0, "quiet NaN" },
        { 0xffc00001u, 0xffc0, "negative NaN keeps its sign" },
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        uint16_t got = ddt_f32_to_bf16(ddk_f32_from_bits(table[i].f32));
        check(got == table[i].bf16, "f32 %08x -> bf16 %04x, want %04x (%s)", table[i].f32, got,
              table[i].bf16, table[i].why);
    }
    /* Signalling NaNs whose payload lies only in the dropped bits must not become inf. */
    for (uint32_t payload = 1; payload < 0x10000u; payload <<= 1) {
        uint16_t got = ddt_f32_to_bf16(ddk_f32_from_bits(0x7f800000u | payload));
        check((got & 0x7f80) == 0x7f80 && (got & 0x7f) != 0 && (got & 0x40),
              "NaN %08x -> bf16 %04x, not a quiet NaN", 0x7f800000u | payload, got);
    }
    /* Every BF16 pattern widens exactly and narrows back to itself. */
    for (uint32_t b = 0; b < 0x10000u; b++) {
        float x = ddt_bf16_to_f32((uint16_t)b);
        check(ddk_f32_bits(x) == b << 16, "bf16 %04x -> f32 %08x, want %08x", b, ddk_f32_bits(x), b << 16);
        if (!isnan(x))
            check(ddt_f32_to_bf16(x) == b, "bf16 %04x does not round trip", b);
        else
            check(isnan(ddt_bf16_to_f32(ddt_f32_to_bf16(x))), "NaN %04x lost its NaN-ness", b);
        if (case_failed)
            return;
    }
    check_random_floats("bf16", ddt_f32_to_bf16, bf16_reference, NULL);
}

static void test_f16(void)
{
    static const struct {
        float x;
        uint16_t f16;
        const char *why;
    } table[] = {
        { 1.0f, 0x3c00, "1.0" },
        { -2.0f, 0xc000, "-2.0" },
        { 0.0f, 0x0000, "+0" },
        { -0.0f, 0x8000, "-0" },
        { 0.333333343f, 0x3555, "1/3" },
        { 65504.0f, 0x7bff, "max finite F16 is exact" },
        { 65519.996f, 0x7bff, "below the overflow tie stays finite" },
        { 65520.0f, 0x7c00, "the overflow tie goes to inf (even)" },
        { 1e6f, 0x7c00, "overflow to inf" },
        { -1e30f, 0xfc00, "overflow to -inf" },
        { 1.00048828125f, 0x3c00, "tie 1 + 2^-11 goes down to the even 1.0" },
        { 1.00146484375f, 0x3c02, "tie 1 + 3*2^-11 goes up to the even one" },
        { 0x1.002002p0f, 0x3c01, "just above a tie goes up" },
        { 0x1.001ffep0f, 0x3c00, "just below a tie goes down" },
        { 6.103515625e-05f, 0x0400, "smallest normal 2^-14" },
        { 6.097555160522461e-05f, 0x03ff, "largest subnormal 1023*2^-24" },
        { 5.9604644775390625e-08f, 0x0001, "smallest subnormal 2^-24" },
        { 2.98023223876953125e-08f, 0x0000, "2^-25 ties to the even 0" },
        { 2.9802326e-08f, 0x0001, "just above 2^-25 goes up to 2^-24" },
        { 8.94069671630859375e-08f, 0x0002, "1.5*2^-24 ties up to the even 2*2^-24" },
        { 1.49011611938476562e-07f, 0x0002, "2.5*2^-24 ties down to the even 2*2^-24" },
        { 0x1.ffcp-15f, 0x0400, "tie 1023.5*2^-24 goes up into the smallest normal (even)" },
        { 0x1.ffbffep-15f, 0x03ff, "just below it stays the largest subnormal" },
        { 1e-10f, 0x0000, "underflow to 0" },
        { -1e-10f, 0x8000, "underflow to -0" },
        { INFINITY, 0x7c00, "inf" },
        { -INFINITY, 0xfc00, "-inf" },
    };
    for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
        uint16_t got = ddt_f32_to_f16(table[i].x);
        check(got == table[i].f16, "f32 %.9g -> f16 %04x, want %04x (%s)", table[i].x, got,
              table[i].f16, table[i].why);
    }
    uint16_t nan = ddt_f32_to_f16(NAN);
    check((nan & 0x7c00) == 0x7c00 && (nan & 0x3ff) != 0, "NaN -> f16 %04x, not a NaN", nan);
    uint16_t snan = ddt_f32_to_f16(ddk_f32_from_bits(0x7f800001u));   /* payload only in dropped bits */
    check((snan & 0x7c00) == 0x7c00 && (snan & 0x200), "sNaN -> f16 %04x, not a quiet NaN", snan);

    /* Every F16 pattern widens to its value and narrows back to itself. */
    for (uint32_t h = 0; h < 0x10000u; h++) {
        float x = ddt_f16_to_f32((uint16_t)h);
        double want = f16_value((uint16_t)h);
        if (isnan(want)) {
            check(isnan(x), "f16 %04x is NaN, got %g", h, x);
            check((ddt_f32_to_f16(x) & 0x7fff) > 0x7c00, "NaN %04x lost its NaN-ness", h);
        } else {
            check((double)x == want && (signbit(x) != 0) == ((h & 0x8000) != 0),
                  "f16 %04x -> %.9g, want %.9g", h, x, want);
            check(ddt_f32_to_f16(x) == h, "f16 %04x does not round trip", h);
        }
        if (case_failed)
            return;
    }
    check_random_floats("f16", ddt_f32_to_f16, f16_reference, F16_COMPILER);
}

/* ------------------------------------------------------------------------------------------
 * Corrupted files
 */

#define W16 "\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}"

typedef struct corrupt_case {
    const char *name;
    const char *json;       /* the header text, padded below */
    int64_t header_len;     /* what the length field says; 0: the padded length of json */
    char pad;               /* padding byte; 0: space */
    size_t data_bytes;      /* bytes of data after the header */
    size_t cut_to;          /* when > 0, the file is cut to this many bytes */
    const char *keyword;    /* a word of the broken rule that the error must contain */
} corrupt_case;

static const corrupt_case corrupt_cases[] = {
    { "truncated_file", "{" W16 "}", 0, 0, 16, 5, "too short" },
    { "short_header", "{" W16 "}", 0, 0, 16, 8 + 10, "beyond the end" },
    { "header_len_not_multiple_of_8", "{" W16 "}", -4, 0, 16, 0, "multiple of 8" },
    { "header_len_huge", "{" W16 "}", 1ll << 40, 0, 16, 0, "limit" },
    { "header_len_beyond_file", "{" W16 "}", 4096, 0, 16, 0, "beyond the end" },
    { "header_empty", "", -1, 0, 0, 0, "empty" },
    { "invalid_json", "{\"w\":{\"dtype\":\"F32\",", 0, 0, 16, 0, "JSON" },
    { "header_not_object", "[1,2]", 0, 0, 0, 0, "not a JSON object" },
    { "padding_not_spaces", "{" W16 "}", 0, 'x', 16, 0, "padding" },
    { "padding_nul", "{" W16 "}", 0, '\1', 16, 0, "NUL" },   /* '\1' stands for NUL below */
    { "entry_not_object", "{\"w\":5}", 0, 0, 0, 0, "not a JSON object" },
    { "empty_name", "{\"\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0, 0, 0,
      "empty name" },
    { "unknown_dtype", "{\"w\":{\"dtype\":\"Q4_K\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", 0,
      0, 16, 0, "Q4_K" },
    { "missing_dtype", "{\"w\":{\"shape\":[2,2],\"data_offsets\":[0,16]}}", 0, 0, 16, 0,
      "dtype" },
    { "unknown_field", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16],"
      "\"strides\":[2,1]}}", 0, 0, 16, 0, "unknown field 'strides'" },
    { "duplicate_field", "{\"w\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[2,2],"
      "\"data_offsets\":[0,16]}}", 0, 0, 16, 0, "duplicate field" },
    { "negative_shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[-2,-2],\"data_offsets\":[0,16]}}", 0,
      0, 16, 0, "shape entry 0" },
    { "float_shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,1.5],\"data_offsets\":[0,12]}}", 0, 0,
      12, 0, "shape entry 1" },
    { "string_shape", "{\"w\":{\"dtype\":\"F32\",\"shape\":[\"2\"],\"data_offsets\":[0,8]}}", 0, 0,
      8, 0, "shape entry 0" },
    { "shape_not_array", "{\"w\":{\"dtype\":\"F32\",\"shape\":4,\"data_offsets\":[0,16]}}", 0, 0,
      16, 0, "shape" },
    { "too_many_dims", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],"
      "\"data_offsets\":[0,1]}}", 0, 0, 1, 0, "dimensions" },
    { "numel_overflow", "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
      "\"data_offsets\":[0,0]}}", 0, 0, 0, 0, "overflow" },
    { "bytes_overflow", "{\"w\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296],"
      "\"data_offsets\":[0,0]}}", 0, 0, 0, 0, "overflow" },
    { "offsets_size_mismatch",
      "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 0, 0, 12, 0,
      "data_offsets [0, 12] hold 12 bytes but F32 [2, 2] needs 16" },
    { "offsets_reversed", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[16,0]}}", 0, 0,
      16, 0, "end before" },
    { "offsets_three", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16,32]}}", 0,
      0, 16, 0, "data_offsets" },
    { "offsets_negative", "{\"w\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[-1,-1]}}", 0, 0,
      0, 0, "data_offsets" },
    { "offsets_float", "{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0000001]}}", 0,
      0, 1, 0, "data_offsets" },
    { "gap", "{" W16 ",\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[20,36]}}", 0, 0, 36,
      0, "gap" },
    { "overlap", "{" W16 ",\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 0, 0,
      24, 0, "overlap" },
    { "zero_size_inside_other",
      "{" W16 ",\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,8]}}", 0, 0, 16, 0,
      "overlap" },
    { "first_not_at_zero", "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[4,20]}}", 0,
      0, 20, 0, "begins at 4, not 0" },
    { "trailing_bytes", "{" W16 "}", 0, 0, 20, 0, "trailing" },
    { "data_truncated", "{" W16 "}", 0, 0, 12, 0, "truncated" },
    { "duplicate_name", "{" W16 "," W16 "}", 0, 0, 16, 0, "duplicate name" },
    { "metadata_non_string", "{\"__metadata__\":{\"format\":\"pt\",\"step\":12}," W16 "}", 0, 0, 16,
      0, "__metadata__ value of 'step'" },
    { "metadata_not_object", "{\"__metadata__\":\"pt\"," W16 "}", 0, 0, 16, 0, "__metadata__" },
    { "metadata_twice", "{\"__metadata__\":{},\"__metadata__\":{}}", 0, 0, 0, 0, "duplicate" },
};

/* Writes the case's file: length field, JSON, padding, data (a byte ramp), maybe cut short. */
static int write_corrupt(const char *path, const corrupt_case *c)
{
    size_t json_len = strlen(c->json), padded = (json_len + 7) / 8 * 8;
    if (c->header_len == -4)
        padded += 4;   /* a length that is not a multiple of 8 */
    else if (c->header_len == -1)
        padded = json_len;
    uint64_t header_len = c->header_len > 0 ? (uint64_t)c->header_len : (uint64_t)padded;
    size_t n = 8 + padded + c->data_bytes;
    unsigned char *bytes = malloc(n);
    if (!bytes)
        return -1;
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(header_len >> (8 * i));
    memcpy(bytes + 8, c->json, json_len);
    char pad = c->pad == '\1' ? '\0' : c->pad ? c->pad : ' ';
    check(!c->pad || padded > json_len, "%s: the JSON needs no padding: the case tests nothing",
          c->name);
    memset(bytes + 8 + json_len, pad, padded - json_len);
    for (size_t i = 0; i < c->data_bytes; i++)
        bytes[8 + padded + i] = (unsigned char)i;
    int rc = write_bytes(path, bytes, c->cut_to ? c->cut_to : n);
    free(bytes);
    return rc;
}

static void test_corrupt_files(void)
{
    int rejected = 0;
    for (size_t i = 0; i < sizeof(corrupt_cases) / sizeof(corrupt_cases[0]); i++) {
        const corrupt_case *c = &corrupt_cases[i];
        char name[128];
        snprintf(name, sizeof(name), "%s.safetensors", c->name);
        const char *path = tmp_path(name);
        if (write_corrupt(path, c) != 0) {
            check(0, "%s: cannot write the fixture", c->name);
            continue;
        }
        ddt_st_file f;
        memset(&f, 0x5a, sizeof(f));   /* open must not depend on the caller zeroing it */
        char err[512] = "";
        int rc = ddt_st_open(path, &f, err, sizeof(err));
        check(rc == -EINVAL, "%s: rc %d, want -EINVAL (err '%s')", c->name, rc, err);
        check(strstr(err, path) == err, "%s: error does not start with the path: '%s'", c->name,
              err);
        check(strstr(err, c->keyword) != NULL, "%s: error lacks '%s': '%s'", c->name, c->keyword,
              err);
        check(f.map == NULL && f.tensors == NULL && f.path == NULL && f.count == 0 &&
              f.meta_keys == NULL, "%s: a failed open left something in the struct", c->name);
        if (rc == 0)
            ddt_st_close(&f);
        else
            rejected++;
    }
    check(rejected == (int)(sizeof(corrupt_cases) / sizeof(corrupt_cases[0])),
          "%d of %zu corrupted files rejected", rejected,
          sizeof(corrupt_cases) / sizeof(corrupt_cases[0]));

    /* Not a file at all. */
    ddt_st_file f;
    char err[512] = "";
    int rc = ddt_st_open(tmp_path("no-such.safetensors"), &f, err, sizeof(err));
    check(rc == -ENOENT && strstr(err, "no-such.safetensors"), "missing file: %d '%s'", rc, err);
    rc = ddt_st_open(tmp_dir, &f, err, sizeof(err));
    check(rc == -EISDIR && strstr(err, "regular file"), "a directory: %d '%s'", rc, err);
}

/* Files the rules allow, though no writer of ours makes them: must be accepted. */
static void test_unusual_but_valid(void)
{
    static const struct {
        const char *name, *json;
        size_t data_bytes;
    } cases[] = {
        { "shuffled_order", "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[3,5]},"
          "\"a\":{\"data_offsets\":[0,3],\"shape\":[3],\"dtype\":\"U8\"}}", 5 },
        { "zero_size_at_boundaries",
          "{\"z1\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0]},"
          "\"a\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
          "\"z2\":{\"dtype\":\"I64\",\"shape\":[2,0],\"data_offsets\":[3,3]},"
          "\"z3\":{\"dtype\":\"I64\",\"shape\":[0,2],\"data_offsets\":[3,3]}}", 3 },
        { "only_zero_size", "{\"z\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0 },
        { "empty_object", "{}", 0 },
        { "zero_dim_overflow_free", "{\"z\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,0],"
          "\"data_offsets\":[0,0]}}", 0 },
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        corrupt_case c = { cases[i].name, cases[i].json, 0, 0, cases[i].data_bytes, 0, "" };
        char name[128];
        snprintf(name, sizeof(name), "%s.safetensors", c.name);
        const char *path = tmp_path(name);
        check(write_corrupt(path, &c) == 0, "%s: cannot write the fixture", c.name);
        ddt_st_file f;
        char err[512] = "";
        int rc = ddt_st_open(path, &f, err, sizeof(err));
        check(rc == 0, "%s: rejected: %s", c.name, err);
        if (rc != 0)
            continue;
        for (int t = 1; t < f.count; t++)   /* tensors come in data-offset order */
            check((const char *)f.tensors[t].data >= (const char *)f.tensors[t - 1].data,
                  "%s: tensors not in offset order", c.name);
        if (i == 0)
            check(f.count == 2 && strcmp(f.tensors[0].name, "a") == 0 &&
                  ((const unsigned char *)f.tensors[1].data)[0] == 3,
                  "shuffled_order: 'a' is not first or 'b' does not point at byte 3");
        if (i == 1)
            check(f.count == 4 && strcmp(f.tensors[0].name, "z1") == 0 &&
                  strcmp(f.tensors[1].name, "a") == 0, "zero_size_at_boundaries: order %s %s",
                  f.count > 1 ? f.tensors[0].name : "", f.count > 1 ? f.tensors[1].name : "");
        ddt_st_close(&f);
    }
}

/* ------------------------------------------------------------------------------------------
 * Model directories
 */

static int write_text(const char *path, const char *text)
{
    return write_bytes(path, text, strlen(text));
}

static void test_sharded_model(void)
{
    const char *dir = tmp_path("model");
    check(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    float a[4] = { 1, 2, 3, 4 }, b[2] = { 5, 6 }, c[3] = { 7, 8, 9 };
    ddt_st_entry shard1[] = { { "a", DDT_F32, 2, { 2, 2 }, a }, { "b", DDT_F32, 1, { 2 }, b } };
    ddt_st_entry shard2[] = { { "c", DDT_F32, 1, { 3 }, c } };
    char err[512] = "";
    check(ddt_st_write(tmp_path("model/model-00001-of-00002.safetensors"), shard1, 2, NULL, NULL,
                       0, err, sizeof(err)) == 0, "write shard 1: %s", err);
    check(ddt_st_write(tmp_path("model/model-00002-of-00002.safetensors"), shard2, 1, NULL, NULL,
                       0, err, sizeof(err)) == 0, "write shard 2: %s", err);
    const char *index_path = tmp_path("model/model.safetensors.index.json");
    check(write_text(index_path,
                     "{\"metadata\": {\"total_size\": 36}, \"weight_map\": {"
                     "\"a\": \"model-00001-of-00002.safetensors\", "
                     "\"c\": \"model-00002-of-00002.safetensors\", "
                     "\"b\": \"model-00001-of-00002.safetensors\"}}\n") == 0, "write index");

    ddt_st_model m;
    int rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == 0, "open: %d %s", rc, err);
    if (rc == 0) {
        check(m.file_count == 2, "file_count %d, want 2 (each shard opened once)", m.file_count);
        const ddt_st_tensor *ta = ddt_st_model_find(&m, "a"), *tb = ddt_st_model_find(&m, "b");
        const ddt_st_tensor *tc = ddt_st_model_find(&m, "c");
        check(ta && ta->ndim == 2 && memcmp(ta->data, a, sizeof(a)) == 0, "tensor a");
        check(tb && memcmp(tb->data, b, sizeof(b)) == 0, "tensor b");
        check(tc && tc->shape[0] == 3 && memcmp(tc->data, c, sizeof(c)) == 0, "tensor c");
        check(ddt_st_model_find(&m, "d") == NULL, "found a tensor no shard holds");
        ddt_st_model_close(&m);
        check(m.files == NULL && m.file_count == 0, "model_close left the struct set");
    }

    /* An index naming a tensor its shard does not hold. */
    check(write_text(index_path,
                     "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
                     "\"c\": \"model-00002-of-00002.safetensors\", "
                     "\"d\": \"model-00001-of-00002.safetensors\"}}") == 0, "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -EINVAL, "missing tensor: rc %d, want -EINVAL", rc);
    check(strstr(err, "model.safetensors.index.json") && strstr(err, "'d'") &&
          strstr(err, "model-00001-of-00002.safetensors"),
          "error does not name the index, the tensor and the shard: '%s'", err);
    check(m.files == NULL && m.file_count == 0, "a failed model_open left files open");

    /* ... a tensor listed in the wrong shard */
    check(write_text(index_path,
                     "{\"weight_map\": {\"a\": \"model-00002-of-00002.safetensors\", "
                     "\"c\": \"model-00002-of-00002.safetensors\"}}") == 0, "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -EINVAL && strstr(err, "'a'") && strstr(err, "model-00002-of-00002"),
          "tensor in the wrong shard: %d '%s'", rc, err);

    /* ... a shard that is not there */
    check(write_text(index_path, "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
                                 "\"x\": \"model-00009-of-00009.safetensors\"}}") == 0,
          "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -ENOENT && strstr(err, "model-00009-of-00009.safetensors"),
          "missing shard: %d '%s'", rc, err);

    /* ... a shard outside the directory, an index without a weight map, one that is not JSON */
    check(write_text(index_path, "{\"weight_map\": {\"a\": \"../all.safetensors\"}}") == 0,
          "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -EINVAL && strstr(err, "weight_map"), "shard outside: %d '%s'", rc, err);
    check(write_text(index_path, "{\"metadata\": {}}") == 0, "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -EINVAL && strstr(err, "weight_map") && strstr(err, "index.json"),
          "no weight_map: %d '%s'", rc, err);
    check(write_text(index_path, "{\"weight_map\": ") == 0, "write index");
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -EINVAL && strstr(err, "JSON"), "index not JSON: %d '%s'", rc, err);
}

static void test_single_file_model(void)
{
    const char *dir = tmp_path("single");
    check(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    ddt_st_model m;
    char err[512] = "";
    int rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == -ENOENT && strstr(err, dir) && strstr(err, "model.safetensors"),
          "empty directory: %d '%s'", rc, err);

    int32_t ids[3] = { 1, 2, 3 };
    ddt_st_entry e = { "ids", DDT_I32, 1, { 3 }, ids };
    check(ddt_st_write(tmp_path("single/model.safetensors"), &e, 1, NULL, NULL, 0, err,
                       sizeof(err)) == 0, "write: %s", err);
    rc = ddt_st_model_open(dir, &m, err, sizeof(err));
    check(rc == 0 && m.file_count == 1, "open: %d %s", rc, err);
    if (rc == 0) {
        const ddt_st_tensor *t = ddt_st_model_find(&m, "ids");
        check(t && t->dtype == DDT_I32 && memcmp(t->data, ids, sizeof(ids)) == 0, "tensor ids");
        ddt_st_model_close(&m);
    }
}

/* ------------------------------------------------------------------------------------------
 * Writer failures: the old file stays, no .tmp stays
 */

static void expect_untouched(const char *what, const char *path, const unsigned char *old,
                             size_t old_n)
{
    size_t n = 0;
    unsigned char *now = read_bytes(path, &n);
    check(now && n == old_n && memcmp(now, old, n) == 0, "%s: the old file changed", what);
    free(now);
    char tmp[600];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    check(!exists(tmp), "%s: %s was left behind", what, tmp);
}

static void test_writer_failures(void)
{
    static const float w[4] = { 1, 2, 3, 4 };
    ddt_st_entry good = { "w", DDT_F32, 1, { 4 }, w };
    const char *path = tmp_path("keep.safetensors");
    char err[512] = "";
    check(ddt_st_write(path, &good, 1, NULL, NULL, 0, err, sizeof(err)) == 0, "write: %s", err);
    size_t old_n = 0;
    unsigned char *old = read_bytes(path, &old_n);
    check(old != NULL, "cannot read %s", path);
    if (!old)
        return;

    /* Invalid input: refused before anything is created. */
    const char *keys[] = { "k", "k" }, *values[] = { "1", "2" };
    static const struct {
        const char *why;
        ddt_st_entry entries[2];
        int count, meta_count;
        const char *keyword;
    } bad[] = {
        { "empty name", { { "", DDT_F32, 1, { 4 }, w } }, 1, 0, "name" },
        { "reserved name", { { "__metadata__", DDT_F32, 1, { 4 }, w } }, 1, 0, "name" },
        { "duplicate names", { { "w", DDT_F32, 1, { 4 }, w }, { "w", DDT_F32, 1, { 4 }, w } }, 2,
          0, "twice" },
        { "ndim 9", { { "w", DDT_F32, 9, { 1, 1, 1, 1, 1, 1, 1, 1 }, w } }, 1, 0, "ndim" },
        { "ndim -1", { { "w", DDT_F32, -1, { 4 }, w } }, 1, 0, "ndim" },
        { "negative dimension", { { "w", DDT_F32, 2, { 2, -2 }, w } }, 1, 0, "negative" },
        { "invalid dtype", { { "w", (ddt_dtype)99, 1, { 4 }, w } }, 1, 0, "dtype" },
        { "NULL data", { { "w", DDT_F32, 1, { 4 }, NULL } }, 1, 0, "NULL" },
        { "too large", { { "w", DDT_F64, 2, { 1ll << 40, 1ll << 40 }, w } }, 1, 0, "large" },
        { "duplicate metadata key", { { "w", DDT_F32, 1, { 4 }, w } }, 1, 2, "'k'" },
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        int rc = ddt_st_write(path, bad[i].entries, bad[i].count, keys, values, bad[i].meta_count,
                              err, sizeof(err));
        check(rc == -EINVAL, "%s: rc %d, want -EINVAL", bad[i].why, rc);
        check(strstr(err, path) == err && strstr(err, bad[i].keyword),
              "%s: error lacks the path or '%s': '%s'", bad[i].why, bad[i].keyword, err);
        expect_untouched(bad[i].why, path, old, old_n);
    }

    /* A directory that does not exist; a parent that is a file. */
    int rc = ddt_st_write(tmp_path("no-such-dir/x.safetensors"), &good, 1, NULL, NULL, 0, err,
                          sizeof(err));
    check(rc == -ENOENT && strstr(err, "no-such-dir/x.safetensors"),
          "missing directory: %d '%s'", rc, err);
    check(!exists(tmp_path("no-such-dir")), "the missing directory was created");
    rc = ddt_st_write(tmp_path("keep.safetensors/x.safetensors"), &good, 1, NULL, NULL, 0, err,
                      sizeof(err));
    check(rc == -ENOTDIR && strstr(err, "keep.safetensors/x.safetensors"),
          "parent is a file: %d '%s'", rc, err);
    expect_untouched("parent is a file", path, old, old_n);

    /* PATH.tmp cannot be created (a directory is in the way): not ours, so not removed. */
    const char *blocker = tmp_path("keep.safetensors.tmp");
    check(mkdir(blocker, 0755) == 0, "mkdir %s", blocker);
    rc = ddt_st_write(path, &good, 1, NULL, NULL, 0, err, sizeof(err));
    check(rc == -EISDIR && strstr(err, "keep.safetensors.tmp"), ".tmp blocked: %d '%s'", rc, err);
    struct stat st;
    check(stat(blocker, &st) == 0 && S_ISDIR(st.st_mode), "the blocking directory was removed");
    rmdir(blocker);
    expect_untouched(".tmp blocked", path, old, old_n);

    /* A write that fails half way (the file size limit): the .tmp is removed. */
    static uint8_t big[1 << 16];
    ddt_st_entry large = { "big", DDT_U8, 1, { sizeof(big) }, big };
    struct rlimit saved, limited;
    if (getrlimit(RLIMIT_FSIZE, &saved) == 0) {
        void (*old_handler)(int) = signal(SIGXFSZ, SIG_IGN);   /* EFBIG instead of a signal */
        limited = saved;
        limited.rlim_cur = 4096;
        if (setrlimit(RLIMIT_FSIZE, &limited) == 0) {
            rc = ddt_st_write(path, &large, 1, NULL, NULL, 0, err, sizeof(err));
            setrlimit(RLIMIT_FSIZE, &saved);
            check(rc == -EFBIG && strstr(err, "write"), "write over the size limit: %d '%s'", rc,
                  err);
            expect_untouched("write over the size limit", path, old, old_n);
        }
        signal(SIGXFSZ, old_handler);
    }

    /* And a write that succeeds replaces the file. */
    rc = ddt_st_write(path, &large, 1, NULL, NULL, 0, err, sizeof(err));
    ddt_st_file f;
    check(rc == 0 && ddt_st_open(path, &f, err, sizeof(err)) == 0 && f.count == 1 &&
          f.tensors[0].bytes == sizeof(big), "the replacing write: %d '%s'", rc, err);
    if (rc == 0 && f.count == 1)
        ddt_st_close(&f);
    free(old);
}

/* ------------------------------------------------------------------------------------------
 * Main
 */

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    return remove(path);
}

int main(void)
{
    static const test_case cases[] = {
        { "roundtrip_all_dtypes", test_roundtrip_all_dtypes },
        { "metadata_roundtrip", test_metadata_roundtrip },
        { "header_layout", test_header_layout },
        { "bf16_conversion", test_bf16 },
        { "f16_conversion", test_f16 },
        { "corrupt_files_rejected", test_corrupt_files },
        { "unusual_but_valid_files", test_unusual_but_valid },
        { "sharded_model", test_sharded_model },
        { "single_file_model", test_single_file_model },
        { "writer_failures", test_writer_failures },
    };
    if (!mkdtemp(tmp_dir)) {
        printf("cannot create a temporary directory under /tmp: %s\n", strerror(errno));
        return 1;
    }
    run_cases(cases, sizeof(cases) / sizeof(cases[0]));
    nftw(tmp_dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return cases_summary();
}
