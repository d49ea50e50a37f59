/* cuda_check.h: CUDA_CHECK(call), CUBLAS_CHECK(call) and LAUNCH_CHECK() for the .cu files of
 * the CUDA backend: any failure is a device error, ended by ddk_fatal (ddk.h) with the call
 * and CUDA's message. Not installed. */
#ifndef DDK_CUDA_CHECK_H
#define DDK_CUDA_CHECK_H

#include "ddk.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#define CUDA_CHECK(call) ddk_cuda_check((call), #call, __FILE__, __LINE__)
#define CUBLAS_CHECK(call) ddk_cublas_check((call), #call, __FILE__, __LINE__)
#define LAUNCH_CHECK() ddk_cuda_check(cudaGetLastError(), "kernel launch", __FILE__, __LINE__)

static inline void ddk_cuda_check(cudaError_t err, const char *what, const char *file, int line)
{
    if (err != cudaSuccess)
        ddk_fatal(file, line, "%s failed: %s", what, cudaGetErrorString(err));
}

static inline void ddk_cublas_check(cublasStatus_t status, const char *what, const char *file, int line)
{
    if (status != CUBLAS_STATUS_SUCCESS)
        ddk_fatal(file, line, "%s failed: %s", what, cublasGetStatusString(status));
}

#endif
