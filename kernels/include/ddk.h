/* ddk.h: the public interface of libddk, the numeric core of ddtree.
 *
 * libddk knows tensors, devices and ops; it knows nothing of runs, files or HTTP.
 * It holds:
 *   - the accounting allocator (one per device: current and peak bytes, an optional budget
 *     beyond which an allocation fails, which is how tests provoke out-of-memory on a CPU);
 *   - the backend interface (a struct of function pointers, NULL = unsupported; the CPU
 *     backend is complete and is the reference);
 *   - the fused, chunked lm_head + CE + KL + CAP loss of SPEC.md section 1, with the exact
 *     entry point ddk_loss_cpu() that outside tools call.
 *
 * Tested by tests/test_alloc.c, tests/test_loss.c (float64 C reference),
 * tests/loss_torch_check.py (PyTorch autograd) and benchmarked by tests/bench/.
 *
 * Dimension legend: n positions, H hidden size, V vocabulary. Row-major throughout;
 * the lm_head uses the Hugging Face layout (V, H).
 */
#ifndef DDK_H
#define DDK_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DDK_VERSION "0.1.0"

#if defined(DDK_BUILDING) && defined(__GNUC__)
#define DDK_API __attribute__((visibility("default")))
#else
#define DDK_API
#endif

/* ------------------------------------------------------------------------------------------
 * Accounting allocator
 */

typedef struct ddk_allocator ddk_allocator;

typedef struct ddk_alloc_stats {
    size_t current;   /* bytes live now */
    size_t peak;      /* high-water mark of current since creation or the last reset */
    size_t budget;    /* 0: unlimited */
    size_t cached;    /* freed bytes kept for reuse by a request of the same size (not current) */
    uint64_t refused; /* allocations refused (over budget or the device said no) */
} ddk_alloc_stats;

/* The process's host-memory device ("cpu"). Never NULL. */
DDK_API ddk_allocator *ddk_allocator_cpu(void);

/* bytes on the allocator's device, 64-byte aligned; NULL (errno = ENOMEM) when the request
 * would pass the budget or the device is out of memory. bytes = 0 is refused (EINVAL). */
DDK_API void *ddk_malloc(ddk_allocator *a, size_t bytes);
/* ptr from ddk_malloc on the same allocator with the same bytes; NULL is a no-op. */
DDK_API void ddk_free(ddk_allocator *a, void *ptr, size_t bytes);

DDK_API ddk_alloc_stats ddk_allocator_stats(const ddk_allocator *a);
DDK_API const char *ddk_allocator_device(const ddk_allocator *a);
/* budget = 0 removes the limit. Lowering it below `current` frees nothing: it refuses the
 * next allocations until enough is freed. */
DDK_API void ddk_allocator_set_budget(ddk_allocator *a, size_t budget);
/* peak := current */
DDK_API void ddk_allocator_reset_peak(ddk_allocator *a);
/* Returns the cached blocks to the device. */
DDK_API void ddk_allocator_trim(ddk_allocator *a);

/* ------------------------------------------------------------------------------------------
 * GPUs (present when libddk was built with CUDA; ddk_has_cuda() says so at run time)
 */

typedef struct ddk_device_info {
    char name[96];               /* e.g. "NVIDIA H200" */
    size_t memory_total_bytes;
    size_t memory_free_bytes;
    int compute_capability;      /* 90 for sm_90 */
} ddk_device_info;

/* 1 when this libddk has the CUDA backend compiled in. */
DDK_API int ddk_has_cuda(void);
/* GPUs visible to this process: 0 without CUDA, a driver or a device. */
DDK_API int ddk_cuda_device_count(void);
/* 0, -EINVAL (no such device) or -EIO (the driver said no). */
DDK_API int ddk_cuda_device_info(int device, ddk_device_info *info);
/* The accounting allocator of GPU `device` (cudaMalloc); NULL when there is no such GPU. */
DDK_API ddk_allocator *ddk_allocator_cuda(int device);

/* ------------------------------------------------------------------------------------------
 * The loss (SPEC.md section 1)
 */

typedef struct ddk_loss_params {
    int64_t n, hidden, vocab;   /* positions, H, V */
    int64_t chunk;              /* positions per chunk, >= 1 */
    int64_t vocab_tile;         /* 0: whole vocabulary per chunk; > 0: streamed tiles of this width */
    float kl_weight;            /* alpha in [0, 1] */
    float kl_temperature;       /* T > 0 */
    float cap_weight;           /* lambda >= 0 */
    float cap_temperature;      /* Tc > 0 */
} ddk_loss_params;

typedef struct ddk_loss_result {
    double loss, ce, kl, cap;   /* weighted means, SPEC.md section 1 */
    double weight_sum;          /* sum of w_i over positions not ignored */
    int64_t counted;            /* positions not ignored */
    int64_t correct;            /* of those, argmax(zs) == label */
} ddk_loss_result;

/* 0 on success; a negative errno (-EINVAL bad parameters, -ENOMEM) with NOTHING written.
 * Workspace comes from ddk_allocator_cpu() and is exactly ddk_loss_workspace_bytes(). */
DDK_API int ddk_loss_cpu(const ddk_loss_params *p,
                         const float *student_hidden,  /* (n, H) */
                         const float *teacher_hidden,  /* (n, H), or NULL: then labels are required and kl_weight must be 0 */
                         const float *lm_head,         /* (V, H) */
                         const int32_t *labels,        /* (n), or NULL: the teacher's argmax; < 0 means ignored */
                         const float *weights,         /* (n), or NULL: all 1 */
                         float *grad_student,          /* (n, H), or NULL; overwritten with d loss / d student_hidden */
                         float *per_position,          /* (n), or NULL; l_i, 0 where ignored */
                         ddk_loss_result *out);

/* Whether the loss needs the teacher's logits: for its labels (labels = NULL) or for the KL. */
static inline int ddk_loss_uses_teacher(const ddk_loss_params *p, int has_labels)
{
    return !has_labels || p->kl_weight > 0.0f;
}

/* Bytes of workspace the loss allocates for these parameters (uses_teacher as above):
 * the chunk's logit buffers (student, and teacher when used) of chunk x V floats, or
 * chunk x vocab_tile when tiled, plus per-position softmax statistics.
 * -EINVAL when the parameters are invalid. The planner predicts memory with this. */
DDK_API int64_t ddk_loss_workspace_bytes(const ddk_loss_params *p, int uses_teacher);

/* ------------------------------------------------------------------------------------------
 * Backends
 */

typedef struct ddk_backend ddk_backend;

struct ddk_backend {
    const char *name;        /* "cpu", "cuda" */
    ddk_allocator *alloc;    /* where this backend's tensors live */

    /* c (m, n) = alpha * op(a) op(b) + beta * c; op(x) = x^T when trans_x; fp32 with fp32
     * accumulation; leading dimensions are row strides. */
    void (*matmul)(const ddk_backend *be, int trans_a, int trans_b,
                   int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb,
                   float beta, float *c, int64_t ldc);

    /* The loss of SPEC.md section 1 on this backend's memory; contract of ddk_loss_cpu. */
    int (*loss)(const ddk_backend *be, const ddk_loss_params *p,
                const float *student_hidden, const float *teacher_hidden, const float *lm_head,
                const int32_t *labels, const float *weights,
                float *grad_student, float *per_position, ddk_loss_result *out);
};

/* The CPU backend: complete, the reference for every other backend. */
DDK_API const ddk_backend *ddk_backend_cpu(void);

/* Threads the CPU backend's matrix products use (the BLAS's pool); <= 0 leaves it as is. */
DDK_API void ddk_cpu_set_threads(int threads);

#ifdef __cplusplus
}
#endif

#endif
