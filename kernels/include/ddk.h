/* ddk.h: the public interface of libddk, the numeric core of ddtree.
 *
 * libddk knows tensors, devices and ops; it knows nothing of runs, files or HTTP.
 * It holds:
 *   - the accounting allocator (one per device: current and peak bytes, an optional budget
 *     beyond which an allocation fails, which is how tests provoke out-of-memory on a CPU);
 *   - the backend interface (a struct of function pointers, NULL = unsupported; the CPU
 *     backend is complete and is the reference);
 *   - the fused, chunked lm_head + CE + KL + CAP loss of SPEC.md section 1 (with a DFlash2
 *     drafter's path selector term, SPEC.md 2.1), with the exact entry point ddk_loss_cpu()
 *     that outside tools call.
 *
 * Tested by tests/kernels/test_alloc.c, tests/kernels/test_loss.c and
 * tests/kernels/test_loss_selector.c (float64 C reference), tests/kernels/test_topk.c,
 * tests/oracle/loss_torch_check.py (PyTorch autograd), tests/kernels/test_ops.c and tests/kernels/test_attention.c (the
 * CPU backend's ops against float64 references), tests/kernels/test_backend_ops.c (every other backend
 * against the CPU's) and benchmarked by tests/bench/.
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

/* The host memory of CPU data-parallel rank `rank` (0..63), "cpu:R": its own accounting and
 * budget, as each GPU has. NULL for other ranks. */
DDK_API ddk_allocator *ddk_allocator_cpu_rank(int rank);

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

/* A device error (a failed launch, a sticky CUDA error: the GPU cannot be trusted any more) ends
 * the process: libddk prints the error, calls hook(message) once, then abort()s. The daemon's hook
 * flushes its records so that systemd's restart resumes the runs from their last checkpoint. The
 * hook may run on any thread and must not call libddk. NULL removes it. */
DDK_API void ddk_set_fatal_hook(void (*hook)(const char *message));
/* The one way libddk and the engine above it end the process on a device or programming error
 * (a failed launch, a sticky CUDA error, a cuBLAS failure, a host allocation that cannot fail
 * softly): "<2>FILE:LINE message" to stderr (a journal priority), then the hook, then abort(). */
DDK_API __attribute__((noreturn, format(printf, 3, 4)))
void ddk_fatal(const char *file, int line, const char *fmt, ...);

/* ------------------------------------------------------------------------------------------
 * GPUs (present when libddk was built with CUDA; ddk_has_cuda() says so at run time)
 */

typedef struct ddk_device_info {
    char name[96];               /* e.g. "NVIDIA H200" */
    size_t memory_total_bytes;
    size_t memory_free_bytes;
    int compute_capability;      /* 90 for sm_90 */
} ddk_device_info;

/* A card ddtree plans for: the limits its kernels' instances are chosen under and that the
 * planner reads (kernels/device_profile.c's table, the one place these figures are written;
 * the CUDA backend reads the same attributes from the GPU itself, and tests/simt runs every kernel
 * under each profile). Memory is what nvidia-smi reports as the card's total. */
typedef struct ddk_device_profile {
    const char *name;           /* "h100", "h200", "b200", "rtx-pro-6000" */
    const char *card;           /* as the driver names it */
    int compute_capability;     /* 90 for sm_90 */
    int multiprocessors;
    int64_t memory_bytes;
    int smem_per_block_optin;   /* cudaDevAttrMaxSharedMemoryPerBlockOptin */
    int smem_per_sm;            /* cudaDevAttrMaxSharedMemoryPerMultiprocessor */
    int threads_per_sm;         /* cudaDevAttrMaxThreadsPerMultiProcessor */
    int registers_per_sm;       /* cudaDevAttrMaxRegistersPerMultiprocessor */
} ddk_device_profile;

/* The profile called name (case-insensitive), or NULL. */
DDK_API const ddk_device_profile *ddk_device_profile_find(const char *name);
/* Every profile, *count of them, the order of the table. */
DDK_API const ddk_device_profile *ddk_device_profiles(int *count);
/* Shared memory a block may take when a launch asks for it (the static limit without opt-in). */
enum { DDK_CUDA_SMEM_STATIC = 48 * 1024 };

/* The largest head_dim the CUDA DFlash and causal attention support (each lane of a warp holds
 * ceil(head_dim / 32) <= 8 accumulator registers); the daemon refuses a GPU run whose drafter
 * has a larger one when the run config is validated (the target's forward runs on the CPU
 * backend). The CPU backend has no such limit. */
enum { DDK_CUDA_MAX_HEAD_DIM = 256 };

/* Which kernels the CUDA backend's dflash_attention, dflash_attention_backward and
 * causal_attention run:
 *   DDK_CUDA_ATTENTION_FLASH: tensor-core flash attention (attention_flash.cu): bf16 operands
 *     rounded from the fp32 inputs, fp32 softmax statistics and sums, mma.sync on sm_80 and
 *     later; a backward without atomics (a key-major pass for dk, dv, a query-major one for dq),
 *     so its results are the same bits at every call with the same inputs on the same GPU: GPU
 *     training steps are reproducible. Its instances are chosen from the GPU's shared memory
 *     (ddk_cuda_instances), so every card we plan for runs it at d <= 256. A shape it does not
 *     take (d > 256, more than 2^30 keys) runs the SIMT kernels instead, counted and said
 *     (ddk_cuda_fallbacks).
 *   DDK_CUDA_ATTENTION_SIMT: the first fp32 kernels (attention_cuda.cu): one warp per query
 *     row on the CUDA cores, dk and dv summed with float atomics (not reproducible bit for bit),
 *     kept for the before/after benchmark (on a card with 99 KB of shared memory a block, RTX
 *     PRO 6000, its backward takes 16 keys a tile above d 157).
 *   DDK_CUDA_ATTENTION_AUTO: flash on sm_80 and later, else SIMT. The default.
 * The environment variable DDTREE_CUDA_ATTENTION=simt|flash|auto, read once at the first
 * attention call, chooses; ddk_cuda_set_attention_kernels(kind) overrides it for the process (a
 * negative kind returns to the environment's choice) and ddk_cuda_attention_kernels() says which
 * is in force (AUTO, SIMT or FLASH, before a GPU's capability is applied). Neither kernel takes
 * workspace from the accounting allocator (ddk_attention_workspace_bytes is the CPU's). */
enum { DDK_CUDA_ATTENTION_AUTO = 0, DDK_CUDA_ATTENTION_SIMT = 1, DDK_CUDA_ATTENTION_FLASH = 2 };
DDK_API void ddk_cuda_set_attention_kernels(int kind);
DDK_API int ddk_cuda_attention_kernels(void);
/* Fallbacks: the times since the process started that an attention op ran the SIMT kernels
 * because no tensor-core instance takes the shape on that GPU (flash in force, -ENOTSUP from
 * attention_flash.cu: keys past 2^30, or a GPU without the shared memory for the smallest
 * instance): slower, and the backward's float atomics are not the same bits at every call. The
 * count; the last one said in a sentence into what (what_len bytes; what may be NULL). The
 * trainer says it once per run: a log line and a "kernel_fallback" event. */
DDK_API uint64_t ddk_cuda_fallbacks(char *what, size_t what_len);

/* What GPU `device` gets: its limits (compute capability, multiprocessors, opt-in shared memory
 * a block and shared memory an SM, threads an SM) and the kernel instances chosen under them
 * (the flash attention's rows a block, forward / dq / the key-major chunk, at head dims 64, 128,
 * 256; the Gated DeltaNet's chunk at dk 128 and 256), one line into text. 0, or -EINVAL (no such
 * GPU, or no CUDA: text says so). */
DDK_API int ddk_cuda_instances(int device, char *text, size_t len);

/* 1 when this libddk has the CUDA backend compiled in. */
DDK_API int ddk_has_cuda(void);
/* GPUs visible to this process: 0 without CUDA, a driver or a device. */
DDK_API int ddk_cuda_device_count(void);
/* 0, -EINVAL (no such device) or -EIO (the driver said no). */
DDK_API int ddk_cuda_device_info(int device, ddk_device_info *info);
/* 0 when GPU `device` can run this libddk's kernels; -ENOEXEC, with a sentence in why, when it
 * cannot load their code (the driver has no image for it among the architectures built: sm_90,
 * sm_100 and sm_120 by default, so an sm_80 or sm_89 GPU; a newer one runs the newest PTX);
 * -EINVAL (no such GPU, or no CUDA) or -EIO (the driver said no), with why too. ddk_backend_cuda
 * gives such a GPU no backend (NULL, errno ENOEXEC). */
DDK_API int ddk_cuda_device_usable(int device, char *why, size_t why_len);
/* The accounting allocator of GPU `device` (cudaMalloc); NULL when there is no such GPU. */
DDK_API ddk_allocator *ddk_allocator_cuda(int device);
/* The CUDA backend of GPU `device` (struct ddk_backend below; name "cuda", alloc
 * ddk_allocator_cuda(device)); NULL when there is no such GPU or no CUDA (errno EINVAL), a GPU
 * this libddk has no code for (errno ENOEXEC: ddk_cuda_device_usable), or when the GPU has no
 * memory left for what the first call makes: its stream, cuBLAS handle and
 * scratch, outside the accounting allocator and any budget (errno ENOMEM; a later call tries
 * again). No op allocates lazily. Its ops, zero and copy included, are queued in order on one
 * stream per GPU and return before they are done: the host reads what they wrote, and rewrites
 * or frees a host buffer given to copy, only after ddk_cuda_synchronize(device) (or the
 * backend's synchronize). Every op of the CPU backend is there, in fp32 storage, with bf16
 * tensor-core products where asked (matmul_bf16, the loss's bf16_products) and bf16 weights
 * where the op says so (matmul_w16, matmul_w16_nn, embedding_w16, the loss's head_bf16: the
 * frozen target's); the loss and sumsq return with their work done (their results are on the
 * host). */
DDK_API const struct ddk_backend *ddk_backend_cuda(int device);
/* ddk_backend_cuda, or NULL with a sentence in why that says which: no such GPU, a GPU this
 * libddk has no code for (ddk_cuda_device_usable), or no memory for the set-up. */
DDK_API const struct ddk_backend *ddk_backend_cuda_or_why(int device, char *why, size_t why_len);
/* Waits until every op queued on GPU `device`'s backend is done; a fault of one of them aborts
 * the process here with CUDA's message. Nothing to do without such a GPU. */
DDK_API void ddk_cuda_synchronize(int device);

/* Host memory to stage copies between the host and GPUs: page-locked (cudaHostAlloc, portable
 * to every GPU) when this libddk has CUDA and the node a GPU, so that a backend's copy from it
 * is a DMA queued on the stream that returns at once (from pageable memory cudaMemcpyAsync
 * bounces through a driver buffer, synchronously); ordinary memory otherwise, or when the
 * system has no page-locked memory left (a copy from it is only slower). 64-byte aligned. As
 * for any host buffer given to a GPU backend's copy, the caller rewrites or frees it only
 * after the copy is done (ddk_cuda_synchronize). Not counted by an accounting allocator: it is
 * host memory beside a GPU's, like the process's other host buffers, and a budget refusal of it
 * would make the out-of-memory recovery shrink a chunk for nothing. NULL with errno EINVAL
 * (bytes = 0) or ENOMEM. */
DDK_API void *ddk_host_alloc_pinned(size_t bytes);
/* p from ddk_host_alloc_pinned; NULL is a no-op. */
DDK_API void ddk_host_free_pinned(void *p);
/* 1 when p (from ddk_host_alloc_pinned) is page-locked, else 0. */
DDK_API int ddk_host_pinned(const void *p);

/* ------------------------------------------------------------------------------------------
 * Collectives between the data-parallel ranks on GPUs (NCCL), one node or several
 *
 * A run's communicator spans `world` ranks; this process drives `local` of them, its GPUs
 * devices[0..local), as ranks first_rank .. first_rank + local - 1. Several daemons share one
 * communicator through rank 0's unique id: the daemon of rank 0 makes it
 * (ddk_comm_unique_id), the others are given it (docs/api.md: POST /nccl/unique-id, the run
 * config's "cluster" section).
 *
 * One order for the process's NCCL operations: the all-reduces and the links' copies (below)
 * share GPUs over two communicators, and NCCL can deadlock when two communicators' operations
 * are in flight on one GPU at once. So every ddk_comm_* and ddk_link_* call that creates, queues
 * on or aborts a communicator takes one process-wide lock, and on each GPU an operation starts
 * only after the NCCL operation queued there before it is done, whatever their streams. Any
 * threads may call them, at once. The price: an all-reduce waits for the copies queued before it
 * on its GPUs, and a copy for the all-reduce queued before it; ddk_comm_init holds the lock
 * until the world has joined.
 */

typedef struct ddk_comm ddk_comm;

enum { DDK_COMM_ID_HEX = 256 };   /* an NCCL unique id (128 bytes) as 256 lowercase hex digits */

/* A new unique id into hex (DDK_COMM_ID_HEX + 1 bytes). 0; -ENOSYS when this libddk has no
 * NCCL (built without CUDA); -EIO with err when NCCL said no. Needs no GPU. */
DDK_API int ddk_comm_unique_id(char *hex, char *err, size_t err_len);
/* 1 when this libddk has NCCL (a CUDA build where NCCL was found), else 0: without it every
 * ddk_comm_* call but ddk_comm_id_valid says -ENOSYS, and a run trains on one GPU at most. */
DDK_API int ddk_has_nccl(void);
/* 1 when hex is DDK_COMM_ID_HEX hex digits (either case) and nothing else, else 0. */
DDK_API int ddk_comm_id_valid(const char *hex);
/* The communicator of this process's ranks, as above. id_hex may be NULL only when world ==
 * local (one node: the id is made here). Returns after every rank of the world has joined.
 * 0, -EINVAL (bad arguments, err says which), -ENOSYS (no NCCL), -EIO (NCCL's message) or
 * -ETIMEDOUT (the world's other ranks did not join within 10 minutes). */
DDK_API int ddk_comm_init(const char *id_hex, int world, int first_rank, int local,
                          const int *devices, ddk_comm **out, char *err, size_t err_len);
/* In-place sum over all ranks of count floats: bufs[i] on GPU devices[i] of the local ranks,
 * queued on each GPU's backend stream (after the ops queued there, and after the NCCL
 * operations queued on that GPU before it: the order above) and waited for while polling NCCL
 * for asynchronous errors (a peer that died, a network failure). 0; -EIO with NCCL's message,
 * or -ETIMEDOUT after 10 minutes without the peers (one whose run stopped raises no error),
 * after which the communicator is aborted (ncclCommAbort) and only destroy is allowed; -EINVAL
 * for bad arguments. A CUDA error of a local GPU's stream meanwhile is that GPU's fault, not a
 * peer's: a device error, which ends the process (ddk_fatal, naming the GPU). */
DDK_API int ddk_comm_allreduce_sum(ddk_comm *c, float *const *bufs, int64_t count, char *err,
                                   size_t err_len);
/* Frees the communicator (NULL: nothing). */
DDK_API void ddk_comm_destroy(ddk_comm *c);

/* ------------------------------------------------------------------------------------------
 * Copies between the GPUs of this process over NCCL send/recv (a split placement's hand-off
 * of the target's features to the drafter's ranks)
 *
 * A link joins n GPUs, devices[0..n) (its members 0..n-1), with a stream of its own on each,
 * beside the backend's: a copy runs beside the compute queued on both GPUs, ordered against it
 * by events, never by the host waiting.
 */

typedef struct ddk_link ddk_link;

/* 0, -EINVAL (n < 2, a device twice or not a GPU of this process: err says which), -ENOSYS (no
 * NCCL), -ENOMEM, or -EIO (NCCL's or CUDA's message). */
DDK_API int ddk_link_init(int n, const int *devices, ddk_link **out, char *err, size_t err_len);
/* Queues a copy of bytes from src (member from's GPU) to dst (member to's): it starts after the
 * ops queued on from's backend stream before the call, and from's backend stream runs nothing
 * queued after the call before the copy has read src (src may be rewritten then). dst is
 * written beside to's backend stream, after the ops queued there before the last
 * ddk_link_fence(l, to) (or before ddk_link_init), not after those queued since: a caller that
 * copies into a buffer which to's backend reads fences to between queuing the reads and the
 * send. ddk_link_fence orders to's compute after the copy. Several threads may send at once
 * (the process's NCCL lock, above, serialises the calls). 0; -EINVAL (bad members, from == to,
 * NULL buffers); -EIO with err, after which the link is aborted and only destroy is allowed. */
DDK_API int ddk_link_send(ddk_link *l, int from, int to, const void *src, void *dst, size_t bytes, char *err,
                          size_t err_len);
/* A barrier both ways between member to's backend stream and the copies into to: the backend
 * stream runs nothing queued after the call before every copy into to queued before it is done
 * (dst written), and no copy into to queued after the call writes before the ops queued on the
 * backend stream before it are done (what they read may be a later copy's dst). Returns at once.
 * 0, -EINVAL, or -EIO as above. */
DDK_API int ddk_link_fence(ddk_link *l, int to, char *err, size_t err_len);
/* Frees the link (NULL: nothing); nothing may be in flight (the callers synchronised). */
DDK_API void ddk_link_destroy(ddk_link *l);

/* ------------------------------------------------------------------------------------------
 * The loss (SPEC.md section 1)
 */

/* The DFlash2 path selector's term of the loss (SPEC.md section 2.1), computed inside the fused
 * loss (ddk_loss_params.selector): per position i, cand = the top-K ids of the unary logits zs_i
 * (descending, ties to the lower id, found online across the vocabulary tiles), q = Hp hs_i (r),
 * s_k = zs_i[cand_k] + sum_r A[p_i, r] q_r Bs[cand_k, r] with p_i = predecessors[i],
 * l_sel = logsumexp_k s_k - s_{k*} where cand_{k*} is the label y_i (the unary CE's label). A label
 * outside the top-K adds no selector term (inject = 0, "strict"), or (inject = 1) replaces the last
 * candidate with itself and its own unary logit. l_i += weight * l_sel, inside the same weighted
 * sum and the same denominator sum w. Gradients go into A, Bs, Hp (ADDED: dA, dBs, dHp) and, unless
 * stop_gradient, into d hs through zs[cand] and through q. Nothing logit-sized is allocated: the
 * workspace (ddk_loss_workspace_bytes) grows by a few (chunk, K) and (chunk, r) buffers. Its
 * three products (q = Hp hs, dq Hp, dq^T hs) are the loss's: bf16 operands with bf16_products.
 * Every pointer in the loss's backend's memory. */
typedef struct ddk_selector {
    int64_t top_k;                /* K in [1, DDK_SELECTOR_MAX_K] and <= V */
    int64_t rank;                 /* r >= 1 */
    float weight;                 /* alpha_sel >= 0 (0: the term is computed and reported, no gradient) */
    int inject;                   /* 0 "strict", 1 "inject" */
    int stop_gradient;            /* 1: the selector term adds nothing to d hs */
    const int32_t *predecessors;  /* (n) in [0, V): the data token before each position (checked
                                     where the position counts, -EINVAL; never read elsewhere) */
    const float *A, *Bs;          /* (V, r) predecessor_codebook, successor_codebook */
    const float *Hp;              /* (r, H) hidden_projection */
    float *dA, *dBs, *dHp;        /* the same shapes, ADDED into; all NULL when grad_student is NULL */
} ddk_selector;
enum { DDK_SELECTOR_MAX_K = 64 };

typedef struct ddk_loss_params {
    int64_t n, hidden, vocab;   /* positions, H, V */
    int64_t chunk;              /* positions per chunk, >= 1 */
    int64_t vocab_tile;         /* 0: whole vocabulary per chunk; > 0: streamed tiles of this width */
    float kl_weight;            /* alpha in [0, 1] */
    float kl_temperature;       /* T > 0 */
    float cap_weight;           /* lambda >= 0 */
    float cap_temperature;      /* Tc > 0 */
    int bf16_products;          /* 1: the logit and gradient products take their operands rounded
                                   to bf16 (backend->matmul_bf16); statistics stay fp32 */
    int head_bf16;              /* 1: lm_head is (V, H) bf16 bit patterns (uint16_t), read in
                                   place; every product with it takes bf16 operands (as
                                   bf16_products, which must then be 1: -EINVAL otherwise),
                                   through backend->matmul_w16 and matmul_w16_nn: the same bits
                                   as bf16_products on the head widened to fp32 (exact) */
    const ddk_selector *selector; /* the DFlash2 selector's term, or NULL (DFlash) */
} ddk_loss_params;

typedef struct ddk_loss_result {
    double loss, ce, kl, cap;   /* weighted means, SPEC.md section 1 */
    double weight_sum;          /* sum of w_i over positions not ignored */
    int64_t counted;            /* positions not ignored */
    int64_t correct;            /* of those, argmax(zs) == label */
    double sel;                 /* with a selector: the weighted mean of 1[y in cand] l_sel (so
                                   loss = (1-alpha) ce + alpha kl + lambda cap + weight sel) */
    int64_t sel_covered;        /* counted positions whose label is among the top-K (strict) */
    int64_t sel_correct;        /* counted positions where the selector's pick is the label */
} ddk_loss_result;

/* 0 on success; a negative errno (-EINVAL bad parameters, -ENOMEM) with NOTHING written.
 * Workspace comes from ddk_allocator_cpu() and is exactly ddk_loss_workspace_bytes(). */
DDK_API int ddk_loss_cpu(const ddk_loss_params *p,
                         const float *student_hidden,  /* (n, H) */
                         const float *teacher_hidden,  /* (n, H), or NULL: then labels are required and kl_weight must be 0 */
                         const void *lm_head,          /* (V, H): float, or uint16_t bf16 with head_bf16 */
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
 * chunk x vocab_tile when tiled, plus per-position softmax statistics; the same with an fp32
 * or a bf16 head (head_bf16: the bf16 operands are rounded in the backend's own scratch).
 * -EINVAL when the parameters are invalid. The planner predicts memory with this. */
DDK_API int64_t ddk_loss_workspace_bytes(const ddk_loss_params *p, int uses_teacher);

/* ------------------------------------------------------------------------------------------
 * Backends
 */

typedef struct ddk_backend ddk_backend;

/* The scalars of one AdamW update (backend->adamw); the trainer's optimizer.c forms them. */
typedef struct ddk_adamw_scalars {
    float grad_scale;                  /* clipping factor, 1 when not clipped */
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float inv_bc1, inv_bc2;            /* 1 / (1 - beta^t) */
    float eps, lr, lr_wd;              /* lr_wd = lr * weight_decay (0 for norm gains) */
} ddk_adamw_scalars;

typedef struct ddk_attention_shape {
    int64_t S;        /* context rows (the target's tokens of the sequence) */
    int64_t A, B;     /* blocks (anchors) and block size: A*B query rows */
    int64_t nh, nkv;  /* query heads, key/value heads; nh % nkv == 0 */
    int64_t d;        /* head dim */
    int64_t window;   /* 0: full_attention; > 0: sliding_attention with this window */
    int64_t q_rows;   /* causal_attention only: 0, a prefill (S query rows); in [1, S], the
                         queries are positions S - q_rows .. S - 1 over a cache of S keys */
    int64_t bidirectional; /* dflash_attention only: nonzero = a DFlash2 drafter's (SPEC.md 2.1):
                              block rows see every slot of their own block also when window > 0
                              (the window still bounds the context rows); 0 = section 2's rule */
} ddk_attention_shape;

/* The Gated DeltaNet core's sizes (backend->gated_delta) */
typedef struct ddk_delta_shape {
    int64_t T;          /* tokens */
    int64_t nk, nv;     /* key heads, value heads; nv % nk == 0 */
    int64_t dk, dv;     /* key and value head dims */
    int64_t chunk;      /* 0: the recurrence; >= 1: the chunked form, this many tokens a chunk */
} ddk_delta_shape;

struct ddk_backend {
    const char *name;        /* "cpu", "cuda" */
    ddk_allocator *alloc;    /* where this backend's tensors live */

    /* c (m, n) = alpha * op(a) op(b) + beta * c; op(x) = x^T when trans_x; fp32 with fp32
     * accumulation; leading dimensions are row strides. beta = 0 ignores c's contents (even
     * NaN); k = 0 leaves c = beta c; m or n = 0 writes nothing. */
    void (*matmul)(const ddk_backend *be, int trans_a, int trans_b,
                   int64_t m, int64_t n, int64_t k, float alpha,
                   const float *a, int64_t lda, const float *b, int64_t ldb,
                   float beta, float *c, int64_t ldc);

    /* matmul with a and b rounded to bf16 (round to nearest even) before the product, fp32
     * accumulation and output: the tensor cores' product (cuBLAS CUBLAS_COMPUTE_32F_FAST_16BF on
     * the GPU; the CPU emulates the rounding, panel by panel, for reference). beta, k = 0 and an
     * empty c as matmul. */
    void (*matmul_bf16)(const ddk_backend *be, int trans_a, int trans_b,
                        int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, const float *b, int64_t ldb,
                        float beta, float *c, int64_t ldc);

    /* The frozen target's projection on its weights as stored: c (m, n) = alpha a W^T + beta c
     * with W (n, k) bf16 (uint16_t bit patterns, ddk_bf16.h; row stride ldw), a (m, k) fp32 (row
     * stride lda) rounded to bf16 (round to nearest even) before the product, fp32 accumulation
     * and output c (m, n) (row stride ldc). Exactly matmul_bf16 (trans_a 0, trans_b 1) of a and W
     * widened to fp32 (exact): on the CPU bit for bit, converting W 256 columns of k at a time
     * (scratch (m + n) x 256 floats, never all of W). beta = 0 ignores c's contents (even NaN);
     * k = 0 leaves c = beta c. CUDA: a rounded into the backend's scratch in panels, bf16 tensor
     * cores with fp32 accumulation (cuBLAS CUBLAS_COMPUTE_32F); no allocation. */
    void (*matmul_w16)(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                       const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                       float *c, int64_t ldc);

    /* matmul_w16 with W not transposed: c (m, n) = alpha a W + beta c with W (k, n) bf16
     * (uint16_t bit patterns; row stride ldw), a (m, k) fp32 (row stride lda) rounded to bf16
     * (round to nearest even), fp32 accumulation and output c (m, n) (row stride ldc): the
     * backward of matmul_w16's product with respect to a (da = dc W), the loss's gradient
     * d hs = g lm_head. Exactly matmul_bf16 (trans_a 0, trans_b 0) of a and W widened to fp32:
     * on the CPU bit for bit, widening W 256 rows (of k) at a time (scratch (m + n) x 256
     * floats, never all of W). beta = 0 ignores c's contents (even NaN); k = 0 leaves
     * c = beta c. CUDA: as matmul_w16 (a rounded into the backend's scratch in panels, bf16
     * tensor cores, fp32 accumulation: cuBLAS CUBLAS_COMPUTE_32F); no allocation. */
    void (*matmul_w16_nn)(const ddk_backend *be, int64_t m, int64_t n, int64_t k, float alpha,
                          const float *a, int64_t lda, const uint16_t *w, int64_t ldw, float beta,
                          float *c, int64_t ldc);

    /* Both operands bf16 in memory: c (m, n) = alpha op(a) op(b) + beta c with a, b uint16_t bf16
     * bit patterns (ddk_bf16.h), op(x) = x^T when trans_x, leading dimensions row strides; fp32
     * accumulation and output c (row stride ldc). Exactly matmul_bf16 of a and b widened to fp32
     * (exact): on the CPU bit for bit (the same panels of k, widened instead of rounded). beta = 0
     * ignores c's contents (even NaN); k = 0 leaves c = beta c. CUDA: one cublasGemmEx with
     * CUDA_R_16BF operands and CUBLAS_COMPUTE_32F (the tensor cores), no conversion pass, no
     * scratch. The bf16 step's products: its weights' bf16 copies against activations rounded
     * once by round_bf16. */
    void (*matmul_16)(const ddk_backend *be, int trans_a, int trans_b, int64_t m, int64_t n,
                      int64_t k, float alpha, const uint16_t *a, int64_t lda, const uint16_t *b,
                      int64_t ldb, float beta, float *c, int64_t ldc);

    /* y (count) bf16 = x (count) rounded to nearest even: ddk_f32_to_bf16's bits for every
     * value but NaN, which stays a NaN; x and y in this backend's memory, not overlapping. */
    void (*round_bf16)(const ddk_backend *be, const float *x, int64_t count, uint16_t *y);

    /* The loss of SPEC.md section 1 on this backend's memory; contract of ddk_loss_cpu
     * (lm_head float, or uint16_t bf16 with p->head_bf16). */
    int (*loss)(const ddk_backend *be, const ddk_loss_params *p,
                const float *student_hidden, const float *teacher_hidden, const void *lm_head,
                const int32_t *labels, const float *weights,
                float *grad_student, float *per_position, ddk_loss_result *out);

    /* ---- memory on this backend's device ---- */
    void (*zero)(const ddk_backend *be, void *dst, size_t bytes);
    /* dst and src anywhere (host or this device): the backend knows its own pointers */
    void (*copy)(const ddk_backend *be, void *dst, const void *src, size_t bytes);
    /* A strided copy of floats: dst (rows, cols), row stride ld_dst, = src (rows, cols), row
     * stride ld_src; ld_dst, ld_src >= cols; anywhere, as for copy; the two regions must not
     * overlap. Nothing past column cols of a dst row is written. rows or cols 0: nothing.
     * (CUDA: one cudaMemcpy2DAsync on the stream.) */
    void (*copy_rows)(const ddk_backend *be, float *dst, int64_t ld_dst, const float *src,
                      int64_t ld_src, int64_t rows, int64_t cols);
    /* Returns when every op queued on this backend is done (the CPU's are done on return). */
    void (*synchronize)(const ddk_backend *be);

    /* out (rows) int32 = the argmax of each row of x (rows, n), row stride n: the first index of
     * the row's largest value (ties to the lowest index; NaNs passed over; a row of only NaNs
     * and -infs gives 0); x and out in this backend's memory, 1 <= n < 2^31. Queued like the
     * other ops. The greedy labels of an evaluation and speculative decoding's argmaxes: only
     * the indices leave the device. */
    void (*argmax_rows)(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int32_t *out);

    /* ---- whole buffers: the trainer's gradient reduction and optimiser ---- */
    /* sum of x[i]^2 over count floats, accumulated in float64 in an order that depends on
     * count alone (the same result at every call); returns with the work done */
    double (*sumsq)(const ddk_backend *be, const float *x, int64_t count);
    /* y (count) = alpha * x + beta * y; beta = 0 ignores y's old contents (even NaN) */
    void (*axpby)(const ddk_backend *be, int64_t count, float alpha, const float *x, float beta,
                  float *y);
    /* x (count) += sigma * (2 u_i - 1), the training features' noise U(-sigma, sigma), with
     * u_i = (ddk_rng_at(seed, i) >> 40) 2^-24 (ddk_rng.h) and one rounding (fmaf): the same bits on
     * every backend. sigma = 0 leaves x untouched. */
    void (*uniform_noise)(const ddk_backend *be, float *x, int64_t count, float sigma, uint64_t seed);
    /* One AdamW update of a parameter tensor, per element, in float32:
     *   g *= grad_scale; m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
     *   w -= lr * (m * inv_bc1) / (sqrt(v * inv_bc2) + eps) + lr_wd * w   (g keeps the scaled value)
     * and, when w16 is not NULL, w16 (count) = the new w rounded to bf16 (round to nearest even):
     * the bf16 copy of the weights that a bf16 step's products read, refreshed in the same pass. */
    void (*adamw)(const ddk_backend *be, float *w, float *g, float *m, float *v, uint16_t *w16,
                  int64_t count, const ddk_adamw_scalars *s);

    /* ---- the drafter's and the target's ops (SPEC.md sections 2 and 3) ----
     * Convention (llm.c's): forward ops overwrite their outputs; backward ops ADD into their
     * gradient outputs, so a tensor used twice gets both contributions; callers zero them. */

    /* y (rows, d) = x / sqrt(mean(x^2) + eps) * g; rstd (rows) = 1 / sqrt(mean(x^2) + eps), or
     * NULL when no backward follows. Per-head norms are rows = tokens * heads, d = head_dim.
     * y may be x (in place). */
    void (*rmsnorm)(const ddk_backend *be, const float *x, const float *g, int64_t rows,
                    int64_t d, float eps, float *y, float *rstd);
    /* dx (rows, d) += d/dx, dg (d) += d/dg, from x, g, the forward's rstd and dy (rows, d) */
    void (*rmsnorm_backward)(const ddk_backend *be, const float *x, const float *g,
                             const float *rstd, const float *dy, int64_t rows, int64_t d,
                             float *dx, float *dg);


    /* Rotate-half RoPE in place over the full head dim: x (rows, heads, d), d even; row r at
     * position pos[r]; pair (x_i, x_{i+d/2}) rotated by pos * theta^(-2i/d); d <= 1024. inverse = 1
     * rotates by the negative angle, which is the backward (the rotation's transpose). */
    void (*rope)(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                 int64_t heads, int64_t d, float theta, int inverse);

    /* h (count) = silu(gate) * up; h may be gate or up (in place) */
    void (*swiglu)(const ddk_backend *be, const float *gate, const float *up, int64_t count,
                   float *h);
    /* dgate += dh * up * silu'(gate), dup += dh * silu(gate) */
    void (*swiglu_backward)(const ddk_backend *be, const float *gate, const float *up,
                            const float *dh, int64_t count, float *dgate, float *dup);
    /* swiglu and swiglu_backward with gate and up kept in bf16 (uint16_t bit patterns, a bf16
     * step's largest activations): exactly those ops on gate and up widened (the same bits) */
    void (*swiglu_16)(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                      int64_t count, float *h);
    void (*swiglu_backward_16)(const ddk_backend *be, const uint16_t *gate, const uint16_t *up,
                               const float *dh, int64_t count, float *dgate, float *dup);

    /* out (rows, H) = table[tokens] with table (V, H); tokens in [0, V) (checked by callers) */
    void (*embedding)(const ddk_backend *be, const float *table, const int32_t *tokens,
                      int64_t rows, int64_t H, float *out);
    /* The same gather from the target's table as stored: out (rows, H) fp32 = table[tokens]
     * with table (V, H) bf16 bit patterns, widened exactly (the same bits on every backend) */
    void (*embedding_w16)(const ddk_backend *be, const uint16_t *table, const int32_t *tokens,
                          int64_t rows, int64_t H, float *out);

    /* DFlash attention of one sequence (SPEC.md section 2, step 4), flash-style: online
     * softmax over key tiles, memory linear in the number of queries, never a dense mask.
     * q (A*B, nh, d) block rows; k, v (S + A*B, nkv, d): context rows [0, S) then block rows
     * (block j slot o at S + j*B + o); anchors (A) sorted ascending; keep (A): 0 = padded
     * block, its output rows are 0. Query head h reads kv head h / (nh / nkv); scale
     * 1/sqrt(d). Visibility of query (j, o): context t < anchors[j] (and, when window > 0,
     * t >= anchors[j] + o - (window - 1)); block slots of block j only: all of them when
     * window = 0 (full_attention) or shape->bidirectional, slots <= o when window > 0
     * (sliding_attention) otherwise.
     * out (A*B, nh, d); lse (A*B, nh) the log-sum-exp of each query's scaled scores, kept for
     * the backward. 0, or -ENOMEM when the backend's workspace cannot be had. */
    int (*dflash_attention)(const ddk_backend *be, const ddk_attention_shape *shape,
                            const float *q, const float *k, const float *v,
                            const int32_t *anchors, const uint8_t *keep, float *out, float *lse);
    /* dq (A*B, nh, d) +=, dk, dv (S + A*B, nkv, d) += from the forward's out, lse and dout */
    int (*dflash_attention_backward)(const ddk_backend *be, const ddk_attention_shape *shape,
                                     const float *q, const float *k, const float *v,
                                     const int32_t *anchors, const uint8_t *keep,
                                     const float *out, const float *lse, const float *dout,
                                     float *dq, float *dk, float *dv);
    /* Plain causal attention (the target, forward only) of T = q_rows query rows (T = S when
     * shape->q_rows = 0, a prefill) over S key positions: q (T, nh, d), k, v (S, nkv, d); query
     * row i is position p = S - T + i and sees keys 0..p; out (T, nh, d). Query head h reads kv
     * head h / (nh / nkv); scale 1/sqrt(d). A, B, window unused. q_rows = 0 and q_rows = S are
     * the same call; rows of a prefill's last T equal this to rounding (the key tiles of the
     * CPU start at another row). 0, -EINVAL (bad heads or d, S < 0, q_rows outside [0, S]) or
     * -ENOMEM (the CPU's workspace, ddk_causal_attention_workspace_bytes). */
    int (*causal_attention)(const ddk_backend *be, const ddk_attention_shape *shape,
                            const float *q, const float *k, const float *v, float *out);
    /* Tree attention (the target's DDTree verify, SPEC.md section 7), forward only: N =
     * shape->q_rows query rows, the nodes of a tree, over S key positions whose last N are the
     * nodes themselves (node j's key and value at row S - N + j): q (N, nh, d), k, v (S, nkv, d).
     * Node i sees the S - N cached keys and the nodes of its own root path: i, parents[i],
     * parents[parents[i]], ... (a parent of -1 ends the path); parents (N) int32 in the backend's
     * memory, parents[i] in [-1, i). out (N, nh, d). Query head h reads kv head h / (nh / nkv);
     * scale 1/sqrt(d). A, B, window unused. A chain (parents[i] = i - 1) is causal_attention's
     * q_rows = N call to rounding. 0, -EINVAL (bad heads or d, N outside [1, S], or a parent
     * outside [-1, i) where the backend checks it: the CPU) or -ENOMEM. */
    int (*tree_attention)(const ddk_backend *be, const ddk_attention_shape *shape, const float *q,
                          const float *k, const float *v, const int32_t *parents, float *out);

    /* ---- the Qwen3.5 / Qwen3.6 target's ops (SPEC.md section 3.1), forward only: the target
     * is frozen. NULL on a backend that does not have them (the CPU and CUDA backends have all
     * seven).
     * Legend: T tokens, C channels, K taps, rows independent vectors of d values; nk / nv key /
     * value heads of dk / dv dims. ---- */

    /* Causal depthwise conv1d over K taps, then silu, per channel c:
     *   y[t, c] = silu(sum_{m < K} w[c, m] x[t - (K-1) + m, c]),  x (T, C), w (C, K), y (T, C)
     * rows before t = 0 are history (K-1, C) (the K-1 rows fed before, oldest first: the decoding
     * cache) or 0 when history is NULL. y must not overlap x or history. */
    void (*conv1d_silu)(const ddk_backend *be, const float *x, const float *w, const float *history,
                        int64_t T, int64_t C, int64_t K, float *y);

    /* Gated RMSNorm (the DeltaNet output norm, norm before the gate), per row:
     *   y (rows, d) = x / sqrt(mean(x^2) + eps) * w * silu(z),  x, z (rows, d), w (d) as stored
     * y may be x or z (in place). */
    void (*gated_rmsnorm)(const ddk_backend *be, const float *x, const float *z, const float *w,
                          int64_t rows, int64_t d, float eps, float *y);

    /* Partial rotary RoPE in place: rope's rotate-half on the first rd of each head's d dims
     * (pair j, j + rd/2 turned by pos * theta^(-2j/rd), j < rd/2), dims rd..d-1 untouched;
     * x (rows, heads, d), rd even, 2 <= rd <= d <= 1024. rd = d is rope (inverse 0) bit for bit. */
    void (*rope_partial)(const ddk_backend *be, float *x, const int32_t *pos, int64_t rows,
                         int64_t heads, int64_t d, int64_t rd, float theta);

    /* The Gated DeltaNet core of one sequence (SPEC.md 3.1), fp32 state and chunk algebra. Per
     * token t and value head j, reading key head i = j / (nv / nk), with S_j = state[j] (dk, dv):
     *   S = exp(g[t,j]) S;  u = beta[t,j] (v[t,j] - S^T k[t,i]);  S += k[t,i] u^T;  out[t,j] = S^T q[t,i]
     * q (T, nk, dk) already l2-normalised and scaled by 1/sqrt(dk), k (T, nk, dk) l2-normalised,
     * v (T, nv, dv), beta (T, nv) in (0, 1), g (T, nv) the log decay (<= 0); state (nv, dk, dv)
     * enters and leaves (zero it for a new sequence); out (T, nv, dv). shape->chunk = 0 runs the
     * recurrence above token by token (decoding); chunk >= 1 the exact chunked form of SPEC.md
     * with chunks of that many tokens (the last one shorter): the same result to rounding.
     * 0, -EINVAL (nv % nk, a non-positive size) or -ENOMEM (the chunk's workspace). CUDA:
     * dk, dv <= 256 (DDK_CUDA_MAX_HEAD_DIM) else -EINVAL, chunks of at most 64 tokens (a longer
     * chunk runs as chunks of 64: only rounding changes), no workspace (never -ENOMEM). */
    int (*gated_delta)(const ddk_backend *be, const ddk_delta_shape *shape, const float *q,
                       const float *k, const float *v, const float *beta, const float *g,
                       float *state, float *out);

    /* The DeltaNet's q / k normalisation, per token t and head h:
     *   dst[t, h] = x * (scale / sqrtf(ss + eps)),  x = src[t * ld + h * d .. + d), ss = sum x_i^2
     * src (T, ld) holding `heads` heads of d floats from column 0 (ld >= heads * d), dst
     * (T, heads, d). The CPU sums ss in float in index order and rounds as written (no FMA
     * contraction): the engine's loop bit for bit; CUDA sums in a fixed order of its own. dst may
     * be src when ld = heads * d (in place); otherwise they must not overlap. */
    void (*l2norm_heads)(const ddk_backend *be, const float *src, int64_t ld, int64_t T,
                         int64_t heads, int64_t d, float scale, float eps, float *dst);

    /* The gated attention's output gate: x (count) *= sigmoid(gate) (count), with sigmoid(s) =
     * 1 / (1 + expf(-s)) in float. gate must not overlap x. */
    void (*sigmoid_mul)(const ddk_backend *be, float *x, const float *gate, int64_t count);

    /* The DeltaNet's gates from in_proj_b's and in_proj_a's outputs b, a (T, nv) and the layer's
     * A_log, dt_bias (nv), per token t and value head j, in float:
     *   beta[t, j] = 1 / (1 + expf(-b[t, j]))
     *   g[t, j] = -expf(A_log[j]) * softplus(a[t, j] + dt_bias[j]),  softplus(s) = s when s > 20
     *             (torch's threshold), else log1pf(expf(s))
     * beta, g (T, nv); beta may be b and g may be a (in place), no other overlap. */
    void (*delta_gates)(const ddk_backend *be, const float *b, const float *a, const float *A_log,
                        const float *dt_bias, int64_t T, int64_t nv, float *beta, float *g);

    /* ---- DFlash2 (SPEC.md 2.1), last: members are only ever added at the end, so that a
     * program built against an older ddk.h finds every member where it was ---- */

    /* The DFlash2 two-tap grouped dynamic causal convolution over the slots of each block
     * (SPEC.md 2.1): x, y (rows, H), rows a multiple of B, blocks of B consecutive rows (row t is
     * slot t % B); base (taps, H); delta (rows, ld_delta), row t's coefficients (taps, G) from its
     * column 0 (tap j, group g at column j*G + g; G = H / gs, gs divides H):
     *   y[t, c] = sum_{j < taps, j <= t % B} (base[j, c] + delta[t, j*G + c/gs]) x[t - j, c]
     * (never across blocks). taps >= 1, ld_delta >= taps * G (the drafter's projection row holds
     * both sides: delta = its side's first column, ld_delta = 2 * taps * G). y must not overlap x
     * or delta. */
    void (*block_conv)(const ddk_backend *be, const float *x, const float *base,
                       const float *delta, int64_t ld_delta, int64_t rows, int64_t B, int64_t H,
                       int64_t taps, int64_t gs, float *y);
    /* dx (rows, H) +=, dbase (taps, H) +=, ddelta (rows, ld_delta; the (taps, G) columns) +=
     * from x, base, delta and dy (rows, H). dx may be NULL (no gradient into x). Columns of
     * ddelta past taps * G, and row t's tap-j columns where j > t % B (no such term), are
     * untouched. The gradients overlap no input and no other gradient. Every sum is in a fixed
     * order (no atomics): the same bits at every call on a given backend and shape. */
    void (*block_conv_backward)(const ddk_backend *be, const float *x, const float *base,
                                const float *delta, int64_t ld_delta, const float *dy,
                                int64_t rows, int64_t B, int64_t H, int64_t taps, int64_t gs,
                                float *dx, float *dbase, float *ddelta);

    /* idx, val (rows, k) = the k largest values of each row of x (rows, n), row stride n, and
     * their indices, descending, ties to the lower index (NaNs passed over: after every number,
     * by index, so a row with fewer than k numbers ends in its NaNs; -inf is a value);
     * 1 <= k <= min(n, DDK_SELECTOR_MAX_K), n < 2^31 (else ddk_fatal). val may be NULL. Queued
     * like the other ops; deterministic. The DFlash2 selector's candidates
     * at evaluation and in speculative decoding (SPEC.md 2.1). */
    void (*topk_rows)(const ddk_backend *be, const float *x, int64_t rows, int64_t n, int64_t k,
                      int32_t *idx, float *val);
    /* lse (rows) = log sum_j exp(x[r, j]) of each row of x (rows, n), row stride n, accumulated
     * from the row's max (NaNs passed over as -inf; a row of only -inf and NaNs gives -inf);
     * and lp (rows), where lp is not NULL, = x[r, col[r]] - lse[r] for col[r] in [0, n) (a NaN
     * there as -inf), -inf where col[r] < 0 or >= n; col (rows) in this backend's memory, read only when
     * lp is given. 1 <= n < 2^31. Queued like the other ops. With topk_rows, a block's per-slot
     * ranks and its labels' log-probabilities without its logits leaving the device (the tree
     * term and the tree walk of train/walk.c). */
    void (*logsumexp_rows)(const ddk_backend *be, const float *x, int64_t rows, int64_t n, const int32_t *col,
                           float *lse, float *lp);
};

/* Bytes the CPU backend's DFlash attention takes while it runs (forward, or backward = 1):
 * a function of B, nh / nkv and d only. -EINVAL for an invalid shape. The planner's figure. */
DDK_API int64_t ddk_attention_workspace_bytes(const ddk_attention_shape *shape, int backward);
/* Bytes the CPU backend's causal_attention takes while it runs: a function of the heads and d
 * only, whatever S and q_rows (-EINVAL for an invalid shape). The planner's figure for a
 * target's prefill and its cached steps. */
DDK_API int64_t ddk_causal_attention_workspace_bytes(int64_t nh, int64_t nkv, int64_t d);

/* The CPU backend: complete, the reference for every other backend. */
DDK_API const ddk_backend *ddk_backend_cpu(void);
/* The CPU backend of data-parallel rank `rank`: the same ops on ddk_allocator_cpu_rank(rank).
 * NULL for ranks outside 0..63. */
DDK_API const ddk_backend *ddk_backend_cpu_rank(int rank);

/* Threads the CPU backend's matrix products use (the BLAS's pool); <= 0 leaves it as is. */
DDK_API void ddk_cpu_set_threads(int threads);

#ifdef __cplusplus
}
#endif

#endif
