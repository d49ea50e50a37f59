/* checksum.h: the checksums of the files ddtree writes to last (checkpoints, exports): a file's
 * size and the xxHash64 (seed 0) of its bytes, written as 16 lowercase hex digits, the digits
 * `xxh64sum FILE` prints (Debian package xxhash). A writer computes it over the bytes it hands
 * to write() (ddt_checksum_update), a reader verifies a file by reading it back in blocks
 * (ddt_checksum_verify), and says what it found as a ddt_verdict: the one sentence `ddtreed
 * verify` prints and the one error a reader refuses a damaged file with.
 *
 * Not here: which files a checkpoint or an export records, or where (checkpoint.c's state.json,
 * export.c's manifest). xxHash is compiled in (XXH_INLINE_ALL): no library is linked.
 * Tested by tests/engine/record/test_checkpoint.c (xxHash's own test vectors, files flipped by one byte).
 */
#ifndef DDT_CHECKSUM_H
#define DDT_CHECKSUM_H

#include "json_fields.h"

#include <cjson/cJSON.h>

#include <stddef.h>
#include <stdint.h>

typedef struct ddt_checksum {
    int64_t size;     /* bytes */
    uint64_t xxh64;   /* of those bytes, seed 0 */
} ddt_checksum;

enum { DDT_CHECKSUM_HEX = 17 };   /* 16 hex digits and the NUL */

/* The checksum of bytes in memory (a file's whole text). */
ddt_checksum ddt_checksum_of(const void *data, size_t n);

/* The checksum of bytes written in pieces, in the order written: begin (NULL when out of
 * memory), update per piece, end (frees the stream). */
typedef struct ddt_checksum_stream ddt_checksum_stream;
ddt_checksum_stream *ddt_checksum_begin(void);
void ddt_checksum_update(ddt_checksum_stream *s, const void *data, size_t n);
ddt_checksum ddt_checksum_end(ddt_checksum_stream *s);

/* The checksum of the file at path, read in blocks: 0, or -errno with err = "PATH: cannot ...". */
int ddt_checksum_file(const char *path, ddt_checksum *out, char *err, size_t err_len);

/* h as 16 lowercase hex digits; and back: 0, or -EINVAL for anything but 16 hex digits. */
void ddt_checksum_hex(uint64_t h, char hex[DDT_CHECKSUM_HEX]);
int ddt_checksum_from_hex(const char *hex, uint64_t *h);

/* c as its JSON object {"size": N, "xxh64": "HEX"}: NULL when out of memory. */
cJSON *ddt_checksum_json(const ddt_checksum *c);
/* obj's key `name` as such an object, every key checked: 0, or -EINVAL with err =
 * "PATH: NAME.size must be ..." (j names the file). */
int ddt_checksum_from_json(const ddt_json_ctx *j, const cJSON *obj, const char *name, ddt_checksum *out);

/* A JSON text sealed with its own checksum (state.json, which records the other files' but
 * cannot hold its own beside itself): its object's last key "seal" holds the xxHash64 of the
 * whole text taken with those 16 digits as DDT_SEAL_ZERO, so that a byte changed anywhere, in a
 * value that still parses too (a digit of the step, of the run config), is found. */
#define DDT_SEAL_ZERO "0000000000000000"
/* text's seal (the last key "seal": DDT_SEAL_ZERO as made) set to the checksum of the text: 0, or
 * -EINVAL when text does not end with that key. */
int ddt_checksum_seal(char *text);
/* text (len bytes)'s seal checked: 0 when it matches; -EBADMSG when it differs (*want the
 * recorded checksum, *got the text's); -ENOENT when text ends with no "seal" key. */
int ddt_checksum_check_seal(const char *text, size_t len, uint64_t *want, uint64_t *got);

/* ------------------------------------------------------------------------------------------
 * Verdicts: what a directory's files are worth
 */

typedef enum {
    DDT_VERDICT_GOOD,         /* every file as recorded */
    DDT_VERDICT_UNVERIFIED,   /* written before checksums: nothing recorded to compare with */
    DDT_VERDICT_INCOMPLETE,   /* a file is missing */
    DDT_VERDICT_CORRUPT,      /* a file's size or checksum differs, or it cannot be read or parsed */
} ddt_verdict_state;

typedef struct ddt_verdict {
    ddt_verdict_state state;
    char file[256];     /* INCOMPLETE, CORRUPT: the file, by its name in the directory */
    char detail[640];   /* CORRUPT: "expected xxh64 X, got Y", "expected N bytes, got M", or why it is unreadable */
} ddt_verdict;

/* v := GOOD; and v := state, file, detail (printf-style). */
void ddt_verdict_good(ddt_verdict *v);
__attribute__((format(printf, 4, 5)))
void ddt_verdict_set(ddt_verdict *v, ddt_verdict_state state, const char *file, const char *fmt, ...);

/* v := CORRUPT `file`, unreadable: its detail a reader's error about path, "PATH: what", said
 * without the path. */
void ddt_verdict_unreadable(ddt_verdict *v, const char *file, const char *path, const char *err);

/* DIR/NAME against want into *v: GOOD, INCOMPLETE (no such file), or CORRUPT (another size,
 * another checksum, or a read error). Returns v->state. */
ddt_verdict_state ddt_checksum_verify(const char *dir, const char *name, const ddt_checksum *want, ddt_verdict *v);

/* v as `ddtreed verify` says it: "good", "unverified (written before checksums)",
 * "incomplete: FILE missing", "corrupt: FILE (DETAIL)". */
void ddt_verdict_text(const ddt_verdict *v, char *out, size_t len);

/* v (INCOMPLETE or CORRUPT) as a reader's error: err = "DIR/FILE is missing: REMEDY" or
 * "DIR/FILE is corrupt (DETAIL): REMEDY"; -ENOENT or -EBADMSG back. */
int ddt_verdict_fail(const ddt_verdict *v, const char *dir, const char *remedy, char *err, size_t err_len);

#endif
