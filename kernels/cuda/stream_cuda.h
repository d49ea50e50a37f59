/* stream_cuda.h: one GPU's CUDA backend as the backend's own files hold it (not installed): its
 * table, and the stream, cuBLAS handle and scratch made for it (stream_cuda.cu). backend_cuda.cu
 * keeps one per GPU and sets each up once; the kernel files reach the stream, multiprocessors
 * and scratch through cuda_backend.h, the products (matmul_cuda.cu) the cuBLAS handle here.
 * Tested through the backend: tests/kernels/test_backend_ops.c on a GPU (skipped without one).
 */
#ifndef DDK_STREAM_CUDA_H
#define DDK_STREAM_CUDA_H

#include "ddk.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <pthread.h>

/* One backend per GPU: the table first (a const ddk_backend * is a pointer to it), then the
 * device's stream, cuBLAS handle and scratch, all three made together by the first
 * ddk_backend_cuda(device) (ddk_cuda_stream_setup), before any run sets a budget on the GPU's
 * allocator */
typedef struct cuda_backend {
    ddk_backend table;          /* must stay first */
    int device;
    int multiprocessors;        /* read once, for grid sizes */
    pthread_mutex_t lock;       /* guards the set-up below */
    int ready;                  /* stream, cublas, scratch made; read with acquire, written
                                   with release under lock */
    cudaStream_t stream;
    cublasHandle_t cublas;
    pthread_mutex_t scratch_lock;   /* held from the first to the last launch that uses it */
    float *scratch;             /* DDK_CUDA_SCRATCH_FLOATS, then cuBLAS's workspace: one cudaMalloc
                                   outside the accounting allocator */
} cuda_backend;


static inline cuda_backend *cuda_of(const ddk_backend *be)
{
    return (cuda_backend *)be;   /* table is the first member */
}

/* The stream, the cuBLAS handle and the scratch of cb's GPU (cb->device), all or nothing: 0, or
 * -ENOMEM (contract in stream_cuda.cu) */
int ddk_cuda_stream_setup(cuda_backend *cb);

/* The cuBLAS handle of be's GPU, bound to its stream, with be's GPU made current */
cublasHandle_t ddk_cuda_cublas(const ddk_backend *be);

#endif
