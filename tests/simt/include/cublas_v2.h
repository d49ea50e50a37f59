/* cublas_v2.h of the SIMT emulation (tests/simt): cuda_check.h's CUBLAS_CHECK names these; no
 * kernel file calls cuBLAS (the products are the backend's, the CPU's under emulation). */
#ifndef DDK_SIMT_CUBLAS_H
#define DDK_SIMT_CUBLAS_H
#include "../simt.h"
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;
static inline const char *cublasGetStatusString(cublasStatus_t s) { return s ? "error" : "success"; }
#endif
