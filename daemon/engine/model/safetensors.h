/* safetensors.h: the safetensors format (SPEC.md section 4): a reader over mmap that enforces
 * every rule of the format with an error naming the file and the broken rule, sharded Hugging
 * Face checkpoints (model.safetensors.index.json), a writer (atomic: temporary name, fsync,
 * rename; header padded to a multiple of 8; __metadata__; the checksum of what it wrote on
 * request), and dtype conversions (BF16 with round-to-nearest-even).
 * Tested by tests/engine/model/test_safetensors.c.
 */
#ifndef DDT_SAFETENSORS_H
#define DDT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

typedef enum ddt_dtype { DDT_F32, DDT_F64, DDT_BF16, DDT_F16, DDT_I64, DDT_I32, DDT_U8 } ddt_dtype;

enum { DDT_ST_MAX_DIMS = 8 };

typedef struct ddt_st_tensor {
    char *name;
    ddt_dtype dtype;
    int ndim;
    int64_t shape[DDT_ST_MAX_DIMS];
    const void *data;   /* into the file's mapping; valid until ddt_st_close */
    size_t bytes;
} ddt_st_tensor;

typedef struct ddt_st_file {
    char *path;
    void *map;
    size_t map_bytes;
    int fd;   /* open while mapped (its size now: base/mapped.h's guarded reads) */
    int count;
    ddt_st_tensor *tensors;   /* (count), in the order of their data offsets */
    int meta_count;
    char **meta_keys, **meta_values;   /* __metadata__ (string values), (meta_count) each */
} ddt_st_file;

/* 0, or a negative errno with err = "PATH: what is wrong" (nothing left open). */
int ddt_st_open(const char *path, ddt_st_file *f, char *err, size_t err_len);
void ddt_st_close(ddt_st_file *f);
const ddt_st_tensor *ddt_st_find(const ddt_st_file *f, const char *name);
const char *ddt_st_metadata(const ddt_st_file *f, const char *key);   /* NULL when absent */

const char *ddt_dtype_name(ddt_dtype t);    /* "F32", "BF16", ... */
size_t ddt_dtype_size(ddt_dtype t);
int64_t ddt_st_numel(const ddt_st_tensor *t);
/* out (numel floats) from F32, F64, BF16 or F16: 0, or -EINVAL for an integer dtype */
int ddt_st_to_f32(const ddt_st_tensor *t, float *out);
/* out (count floats) = elements first .. first+count-1 of t (row-major), as ddt_st_to_f32: a
 * tensor converted piece by piece through a bounded staging buffer (the target's loaders) */
int ddt_st_range_to_f32(const ddt_st_tensor *t, int64_t first, int64_t count, float *out);

uint16_t ddt_f32_to_bf16(float x);   /* round to nearest even; NaN stays NaN */
float ddt_bf16_to_f32(uint16_t x);
uint16_t ddt_f32_to_f16(float x);    /* round to nearest even, overflow to inf */
float ddt_f16_to_f32(uint16_t x);

/* A Hugging Face model directory: model.safetensors, or model.safetensors.index.json and the
 * shards its weight_map names (each opened once; every name found in the shard the index
 * says). */
typedef struct ddt_st_model {
    int file_count;
    ddt_st_file *files;
} ddt_st_model;

int ddt_st_model_open(const char *dir, ddt_st_model *m, char *err, size_t err_len);
void ddt_st_model_close(ddt_st_model *m);
const ddt_st_tensor *ddt_st_model_find(const ddt_st_model *m, const char *name);

/* Writing. */
typedef struct ddt_st_entry {
    const char *name;
    ddt_dtype dtype;
    int ndim;
    int64_t shape[DDT_ST_MAX_DIMS];
    const void *data;   /* ddt_dtype_size(dtype) * numel bytes, already in dtype */
} ddt_st_entry;

/* Writes path atomically (path.tmp, fsync, rename, fsync of the directory). meta: meta_count
 * key/value pairs for __metadata__ (string values); "format": "pt" is added unless meta names
 * a format. 0, or a negative errno with err saying what failed; on failure path is untouched. */
int ddt_st_write(const char *path, const ddt_st_entry *tensors, int count,
                 const char *const *meta_keys, const char *const *meta_values, int meta_count,
                 char *err, size_t err_len);
/* ddt_st_write, and *sum := the checksum of the bytes written (base/checksum.h; computed as
 * they are written, not read back) on success. */
struct ddt_checksum;
int ddt_st_write_summed(const char *path, const ddt_st_entry *tensors, int count,
                        const char *const *meta_keys, const char *const *meta_values, int meta_count,
                        struct ddt_checksum *sum, char *err, size_t err_len);

#endif
