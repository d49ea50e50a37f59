/* simt_backend.cpp: what the kernel files take from stream_cuda.cu and matmul_cuda.cu (cuda_backend.h), under the
 * SIMT emulation: the stream (none: every launch runs when made), the multiprocessors of the
 * profile in force, and the backend's scratch of DDK_CUDA_SCRATCH_FLOATS floats, filled with NaN
 * at every lock so that a kernel reading scratch it did not write shows. The backend handed to the
 * ops is the CPU's table (its allocator and products: the loss's logits come from be->matmul);
 * only the kernels are the emulated ones. Used by tests/simt/test_simt_kernels.cpp.
 */
#include "cuda_backend.h"
#include "simt_backend.h"

#include <mutex>
#include <stdlib.h>
#include <string.h>

static std::mutex scratch_lock;
static float *scratch;

cudaStream_t ddk_cuda_stream(const ddk_backend *) { return nullptr; }

int ddk_cuda_multiprocessors(const ddk_backend *) { return simt::profile()->multiprocessors; }

float *ddk_cuda_scratch_lock(const ddk_backend *)
{
    scratch_lock.lock();
    if (!scratch && !(scratch = (float *)malloc(sizeof(float) * DDK_CUDA_SCRATCH_FLOATS)))
        abort();
    memset(scratch, 0xff, sizeof(float) * DDK_CUDA_SCRATCH_FLOATS);
    return scratch;
}

void ddk_cuda_scratch_unlock(const ddk_backend *) { scratch_lock.unlock(); }

const ddk_backend *simt_backend(void)
{
    static ddk_backend table;
    static std::once_flag once;
    std::call_once(once, [] {
        table = *ddk_backend_cpu();
        table.name = "simt";
        ddk_cuda_kernel_ops(&table);
    });
    return &table;
}

/* matmul_w16's panel loop (matmul_cuda.cu, cuBLAS), which the loss calls with a bf16 head: a
 * product, not a kernel, so the CPU's matmul_w16 (trans_w 1) or matmul_w16_nn (trans_w 0) on the
 * same operands; the panel is left as it was (the caller reads nothing back from it) */
void ddk_cuda_w16_product(const ddk_backend *be, int trans_w, int64_t m, int64_t n, int64_t k,
                          float alpha, const float *a, int64_t lda, const uint16_t *w,
                          int64_t ldw, float beta, float *c, int64_t ldc, uint16_t *panel,
                          int64_t rows, int64_t kp)
{
    (void)panel, (void)rows, (void)kp;
    const ddk_backend *cpu = ddk_backend_cpu();
    (trans_w ? cpu->matmul_w16 : cpu->matmul_w16_nn)(cpu, m, n, k, alpha, a, lda, w, ldw, beta, c, ldc);
}
