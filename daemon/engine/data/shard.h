/* shard.h: the two data files of SPEC.md section 4 (docs/formats.md), each with its one home
 * here, read with every rule checked and written under the same rules:
 *   token file:    input_ids I32 [Ttot], offsets I64 [nseq+1] and, optionally, loss_mask U8
 *                  [Ttot] (0 or 1; absent: all 1) (`target.tokens`, `ddtreed features
 *                  --tokens`, written by `ddtreed tokenize`): the sequences, back to back;
 *   feature shard: the same with loss_mask U8 [Ttot] (0 or 1), features BF16|F16|F32
 *                  [Ttot, L_t*H], teacher_hidden (optional) BF16|F16|F32 [Ttot, H] and the
 *                  string __metadata__ format, version, hidden_size, target_layer_ids (a JSON
 *                  list), vocab_size and target (free text, not checked).
 * The one rule for offsets and lengths (both files, reading and writing): nseq >= 1,
 * offsets[0] = 0, never decreasing, offsets[nseq] = Ttot; sequence s is rows
 * [offsets[s], offsets[s+1]), so equal neighbours are an empty sequence. A file keeps every
 * sequence as written (a shard's sequence s is its token file's sequence s); training skips
 * the ones shorter than DDT_SHARD_MIN_TRAINED tokens. Ids lie in [0, V).
 * The feature rule (at write and at open): a sequence whose features hold NaN or Inf, are all
 * zero, or are the same at every position (bit for bit) is refused with the file and the
 * sequence's index: captures that silently produced nothing train a useless drafter.
 * Errors are "PATH: tensor 'NAME' ..." / "PATH: __metadata__ KEY ..." saying what is wrong.
 * Not here: the safetensors container (safetensors.h), choosing, cutting or shuffling
 * sequences for training (source.c).
 * Tested by tests/engine/data/test_shard.c (hand-made files, good and broken, against the readers; the
 * writers' refusals; round trips), and through its users by tests/engine/data/test_source.c and
 * tests/oracle/features_torch_check.py.
 *
 * Legend: Ttot tokens of a file, nseq sequences, H hidden, L_t taps, V vocabulary.
 */
#ifndef DDT_SHARD_H
#define DDT_SHARD_H

#include "model/safetensors.h"

#include <stddef.h>
#include <stdint.h>

/* tokens a sequence needs to be trained on: no anchor fits in fewer */
enum { DDT_SHARD_MIN_TRAINED = 2 };

/* A shard's __metadata__ keys, in the order they are written. */
typedef enum ddt_shard_key {
    DDT_SHARD_KEY_FORMAT,             /* "ddtree-features" */
    DDT_SHARD_KEY_VERSION,            /* "1" */
    DDT_SHARD_KEY_HIDDEN_SIZE,        /* H, decimal */
    DDT_SHARD_KEY_TARGET_LAYER_IDS,   /* "[l1, l2, ...]", in feature order */
    DDT_SHARD_KEY_VOCAB_SIZE,         /* V, decimal */
    DDT_SHARD_KEY_TARGET,             /* free text: what computed the features */
    DDT_SHARD_KEYS
} ddt_shard_key;

extern const char *const ddt_shard_keys[DDT_SHARD_KEYS];

/* ------------------------------------------------------------------------------------------
 * Token files
 */

typedef struct ddt_shard_tokens {
    int64_t total, nseq;   /* Ttot, nseq */
    int32_t *input_ids;    /* (Ttot): aligned copies from ddk_allocator_cpu() */
    int64_t *offsets;      /* (nseq + 1) */
    uint8_t *loss_mask;    /* (Ttot), or NULL when the file has none (every token trained) */
    size_t ids_bytes, offsets_bytes, mask_bytes;
} ddt_shard_tokens;

/* Reads the token file path (ids in [0, vocab)). 0, or a negative errno with err (nothing
 * held). */
int ddt_shard_tokens_open(const char *path, int64_t vocab, ddt_shard_tokens *out, char *err,
                          size_t err_len);
void ddt_shard_tokens_close(ddt_shard_tokens *t);   /* a zeroed one is a no-op */

/* Writes a token file (atomically): input_ids (total), offsets (nseq + 1) and loss_mask
 * (total; NULL: none written), after the same checks; on failure nothing is written. 0, or a
 * negative errno with err. */
int ddt_shard_tokens_write(const char *path, const int32_t *input_ids, int64_t total,
                           const int64_t *offsets, int64_t nseq, const uint8_t *loss_mask,
                           int64_t vocab, char *err, size_t err_len);

/* ------------------------------------------------------------------------------------------
 * Feature shards
 */

/* What a shard's metadata and shapes must say. */
typedef struct ddt_shard_shape {
    int64_t hidden, vocab;   /* H, V */
    int n_taps;              /* L_t */
    const int32_t *taps;     /* (L_t) target layer ids, in feature order */
} ddt_shard_shape;

/* An open shard: mapped, its tensors pointing into the mapping. */
typedef struct ddt_shard {
    ddt_st_file file;
    int64_t total, nseq;               /* Ttot, nseq */
    int64_t *offsets;                  /* (nseq + 1), an aligned copy */
    size_t offsets_bytes;
    const ddt_st_tensor *input_ids;    /* I32 (Ttot) */
    const ddt_st_tensor *loss_mask;    /* U8 (Ttot) */
    const ddt_st_tensor *features;     /* (Ttot, L_t*H) */
    const ddt_st_tensor *teacher;      /* (Ttot, H), NULL when the file has none */
} ddt_shard;

/* Opens path and checks it against want (need_teacher: teacher_hidden must be there). 0, or a
 * negative errno with err (nothing held). */
int ddt_shard_open(const char *path, const ddt_shard_shape *want, int need_teacher, ddt_shard *out,
                   char *err, size_t err_len);
void ddt_shard_close(ddt_shard *sh);   /* a zeroed one is a no-op */

/* Rows [first, first + count) as the engine holds them: input_ids (count), loss_mask (count),
 * features (count, L_t*H) and, when teacher_hidden is not NULL, teacher_hidden (count, H), the
 * floats converted to float32. The shard must hold a teacher when teacher_hidden is asked.
 * Read from the mapping through base/mapped.h: 0, or -EIO with err = "PATH: ... offset ..." when
 * the file shrank since it was opened or a page cannot be read (the outputs then undefined). */
int ddt_shard_rows(const ddt_shard *sh, int64_t first, int64_t count, int32_t *input_ids, uint8_t *loss_mask,
                   float *features, float *teacher_hidden, char *err, size_t err_len);

/* What ddt_shard_write writes. */
typedef struct ddt_shard_data {
    ddt_shard_shape shape;
    int64_t total, nseq;            /* Ttot, nseq */
    const int32_t *input_ids;       /* (Ttot) */
    const uint8_t *loss_mask;       /* (Ttot) */
    const int64_t *offsets;         /* (nseq + 1) */
    ddt_dtype dtype;                /* of features and teacher_hidden: DDT_BF16, DDT_F16 or DDT_F32 */
    const void *features;           /* (Ttot, L_t*H), in dtype */
    const void *teacher_hidden;     /* (Ttot, H), in dtype; NULL: none */
    const char *target;             /* __metadata__ target */
} ddt_shard_data;

/* Writes a shard (atomically) after checking every rule the reader checks; on failure nothing
 * is written. 0, or a negative errno with err. */
int ddt_shard_write(const char *path, const ddt_shard_data *d, char *err, size_t err_len);

#endif
