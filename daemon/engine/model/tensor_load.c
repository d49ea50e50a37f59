/* tensor_load.c: checked, aligned, converted copies of safetensors tensors (tensor_load.h).
 * Tested through the tools by tests/oracle/step_torch_check.py and tests/oracle/features_torch_check.py.
 */
#include "tensor_load.h"
#include "ddk.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static void shape_text(const int64_t *dims, int ndim, char *out, size_t len)
{
    size_t used = (size_t)snprintf(out, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(out + used, len - used, "%s%lld", i ? ", " : "", (long long)dims[i]);
    if (used < len)
        snprintf(out + used, len - used, "]");
}

int ddt_tensor_check(const ddt_st_tensor *t, const char *file, const ddt_tensor_want *want,
                     char *err, size_t err_len)
{
    int is_float = t->dtype == DDT_F32 || t->dtype == DDT_F64 || t->dtype == DDT_BF16 || t->dtype == DDT_F16;
    if (want->kind == DDT_F32 ? !is_float : t->dtype != want->kind) {
        snprintf(err, err_len, "%s: tensor '%s' is %s, expected %s", file, want->name,
                 ddt_dtype_name(t->dtype), want->kind == DDT_F32 ? "F32, BF16, F16 or F64" : ddt_dtype_name(want->kind));
        return -EINVAL;
    }
    int match = t->ndim == want->ndim;
    for (int i = 0; match && i < want->ndim; i++)
        match = want->dims[i] < 0 || want->dims[i] == t->shape[i];
    if (!match) {
        char got[128], expected[128];
        shape_text(t->shape, t->ndim, got, sizeof got);
        shape_text(want->dims, want->ndim, expected, sizeof expected);
        snprintf(err, err_len, "%s: tensor '%s' has shape %s, expected %s (-1: any)", file,
                 want->name, got, expected);
        return -EINVAL;
    }
    for (int i = 0; i < want->ndim; i++)
        want->dims[i] = t->shape[i];
    return 0;
}

void *ddt_tensor_copy(const ddt_st_tensor *t, const char *file, const ddt_tensor_want *want,
                      size_t *bytes, char *err, size_t err_len)
{
    if (ddt_tensor_check(t, file, want, err, err_len))
        return NULL;
    int64_t numel = ddt_st_numel(t);
    size_t elem = want->kind == DDT_F32 ? sizeof(float) : ddt_dtype_size(want->kind);
    *bytes = (size_t)(numel > 0 ? numel : 1) * elem;
    void *out = ddk_malloc(ddk_allocator_cpu(), *bytes);
    if (!out) {
        snprintf(err, err_len, "%s: no memory for tensor '%s' (%zu bytes)", file, want->name, *bytes);
        return NULL;
    }
    if (want->kind == DDT_F32)
        ddt_st_to_f32(t, out);
    else
        memcpy(out, t->data, t->bytes);
    return out;
}

void *ddt_tensor_load(const ddt_st_file *f, const ddt_tensor_want *want, size_t *bytes,
                      char *err, size_t err_len)
{
    const ddt_st_tensor *t = ddt_st_find(f, want->name);
    if (!t) {
        snprintf(err, err_len, "%s: tensor '%s' is missing", f->path, want->name);
        return NULL;
    }
    return ddt_tensor_copy(t, f->path, want, bytes, err, err_len);
}
