/* tensor_load.h: tensors of a safetensors file checked against what the engine expects
 * (name, dtype, rank and dimensions, with wildcards learnt from the file) and copied into
 * aligned memory of the CPU allocator (mapped data can be unaligned). Errors name the file,
 * the tensor and the mismatch.
 * Tested through the tools by tests/oracle/step_torch_check.py and tests/oracle/features_torch_check.py.
 */
#ifndef DDT_TENSOR_LOAD_H
#define DDT_TENSOR_LOAD_H

#include "safetensors.h"

#include <stddef.h>

/* The kinds a tensor may be stored as: DDT_F32 accepts F32, F64, BF16 and F16 (converted to
 * float32); DDT_I32 and DDT_U8 must match exactly. */
typedef struct ddt_tensor_want {
    const char *name;
    ddt_dtype kind;
    int ndim;
    int64_t *dims;   /* (ndim): > 0 must match; -1 is learnt from the file (written back) */
} ddt_tensor_want;

/* 0 when t is as wanted (learning the -1 dims), else -EINVAL with err naming file and tensor. */
int ddt_tensor_check(const ddt_st_tensor *t, const char *file, const ddt_tensor_want *want,
                     char *err, size_t err_len);

/* A copy of the tensor (float32, int32 or uint8 per kind) from ddk_malloc(ddk_allocator_cpu());
 * *bytes is its size for ddk_free. NULL with err when absent or not as wanted. */
void *ddt_tensor_load(const ddt_st_file *f, const ddt_tensor_want *want, size_t *bytes,
                      char *err, size_t err_len);

/* The same from an already found tensor (model directories); file names the error. */
void *ddt_tensor_copy(const ddt_st_tensor *t, const char *file, const ddt_tensor_want *want,
                      size_t *bytes, char *err, size_t err_len);

#endif
