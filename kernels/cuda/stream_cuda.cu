/* stream_cuda.cu: what every op of the CUDA backend takes from its GPU's backend (stream_cuda.h):
 * the stream (and the GPU made current), the multiprocessors, the scratch under its lock and the
 * cuBLAS handle, and their making, once per GPU (ddk_cuda_stream_setup, from ddk_backend_cuda).
 * Under the SIMT emulation tests/simt/simt_backend.cpp stands in for this file.
 * Tested through the backend: tests/kernels/test_backend_ops.c on a GPU (skipped without one).
 */
#include "ddk.h"
#include "cuda_backend.h"
#include "cuda_check.h"
#include "stream_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <errno.h>
#include <pthread.h>

/* rmsnorm_backward's per-slice dg partials: 4 MiB bounds the slices at 2^20 / d (ops_cuda.cu);
 * sumsq's block partials take 8 KiB of it (vector_cuda.cu), the loss its first half for chunk
 * sums (40 bytes a chunk) and the second for its bf16 operand panel (loss_cuda.cu), matmul_w16
 * and matmul_w16_nn all of it for their bf16 panel of a (2^21 values) */
static const size_t scratch_floats = DDK_CUDA_SCRATCH_FLOATS;
/* cuBLAS's workspace, given to it (cublasSetWorkspace) instead of its own lazy allocation:
 * 32 MiB, what NVIDIA recommends for Hopper and Blackwell */
static const size_t cublas_workspace_bytes = (size_t)32 << 20;

/* Makes this host thread's current device be's GPU (current devices are per thread) and returns
 * its stream. be came from ddk_backend_cuda, which made the stream. */
cudaStream_t ddk_cuda_stream(const ddk_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    CUDA_CHECK(cudaSetDevice(cb->device));
    return cb->stream;
}

int ddk_cuda_multiprocessors(const ddk_backend *be)
{
    return cuda_of(be)->multiprocessors;
}

/* The cuBLAS handle of be's GPU, bound to its stream. cuBLAS allows one handle to be used by
 * several threads as long as its settings do not change, and they are set once, in
 * ddk_cuda_stream_setup. */
cublasHandle_t ddk_cuda_cublas(const ddk_backend *be)
{
    ddk_cuda_stream(be);   /* be's GPU current for the call */
    return cuda_of(be)->cublas;
}

/* Locks be's scratch (DDK_CUDA_SCRATCH_FLOATS floats, made with the stream: never NULL) and
 * returns it. Always pair with ddk_cuda_scratch_unlock(), called after the last launch that uses
 * it is queued: launches are stream-ordered, so the next holder's launches run after them. */
float *ddk_cuda_scratch_lock(const ddk_backend *be)
{
    cuda_backend *cb = cuda_of(be);
    pthread_mutex_lock(&cb->scratch_lock);
    return cb->scratch;
}

void ddk_cuda_scratch_unlock(const ddk_backend *be)
{
    pthread_mutex_unlock(&cuda_of(be)->scratch_lock);
}

/* The stream, the cuBLAS handle and the scratch of cb's GPU, all or nothing. They are made here
 * once, so that no op allocates on its first call inside a run: cuBLAS's handle and its 32 MiB
 * workspace and the 4 MiB scratch are the backend's, outside the accounting allocator and any
 * budget a run sets. (The driver still loads a kernel's module at its first launch.)
 * 0; -ENOMEM when the GPU has no memory for them (what was made is undone, and a later call tries
 * again); any other failure is a device error and ends the process (CUDA_CHECK). */
int ddk_cuda_stream_setup(cuda_backend *cb)
{
    CUDA_CHECK(cudaSetDevice(cb->device));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, cb->device));
    cb->multiprocessors = prop.multiProcessorCount;
    /* non-blocking: the legacy default stream (cudaMalloc's neighbours, other libraries) does not
     * serialise with it; our ops order themselves on it */
    cudaError_t err = cudaStreamCreateWithFlags(&cb->stream, cudaStreamNonBlocking);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        return -ENOMEM;
    }
    CUDA_CHECK(err);
    /* one block: the scratch, then cuBLAS's workspace (so that its first product allocates
     * nothing either) */
    err = cudaMalloc((void **)&cb->scratch, scratch_floats * sizeof(float) + cublas_workspace_bytes);
    if (err == cudaErrorMemoryAllocation) {
        cudaGetLastError();
        CUDA_CHECK(cudaStreamDestroy(cb->stream));
        return -ENOMEM;
    }
    CUDA_CHECK(err);
    const cublasStatus_t st = cublasCreate(&cb->cublas);
    if (st == CUBLAS_STATUS_ALLOC_FAILED) {
        cudaGetLastError();   /* cuBLAS's own failed cudaMalloc: not sticky, not ours to report */
        CUDA_CHECK(cudaFree(cb->scratch));
        CUDA_CHECK(cudaStreamDestroy(cb->stream));
        return -ENOMEM;
    }
    CUBLAS_CHECK(st);
    CUBLAS_CHECK(cublasSetStream(cb->cublas, cb->stream));   /* resets the workspace: set it after */
    CUBLAS_CHECK(cublasSetWorkspace(cb->cublas, cb->scratch + scratch_floats, cublas_workspace_bytes));
    /* plain fp32 FMA with fp32 accumulation, never TF32 (cuBLAS's default, made explicit): the
     * CPU backend's numbers. TF32 would be a later, measured choice. */
    CUBLAS_CHECK(cublasSetMathMode(cb->cublas, CUBLAS_DEFAULT_MATH));
    return 0;
}
