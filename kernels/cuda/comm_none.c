/* comm_none.c: the NCCL collectives of a libddk built without NCCL: without CUDA
 * (DDTREE_CUDA=OFF or no nvcc), or with CUDA where NCCL was not found (DDK_CUDA_WITHOUT_NCCL:
 * one GPU per run). Every call says -ENOSYS and why, so a caller (the daemon's POST
 * /nccl/unique-id: 501; the run config's check of a multi-GPU run) can tell the user. A CUDA build
 * with NCCL compiles comm_nccl.cu instead.
 * The same for the GPU link (ddk_link_*). Tested by tests/kernels/test_comm.c (its -ENOSYS branch).
 */
#include "ddk.h"
#include "comm_internal.h"

#include <errno.h>

#ifdef DDK_CUDA_WITHOUT_NCCL
static const char no_nccl[] =
    "this ddtreed was built with CUDA but without NCCL, so a run trains on one GPU: rebuild it "
    "with NCCL found (apt-get install libnccl-dev, or -DDDTREE_NCCL_LIBRARY=/path/libnccl.so.2 "
    "-DDDTREE_NCCL_INCLUDE=/path/include) to train on several GPUs or nodes";
#else
static const char no_nccl[] =
    "this ddtreed was built without CUDA/NCCL: rebuild it with the CUDA toolkit and NCCL "
    "(DDTREE_CUDA=ON) to train on GPUs across ranks";
#endif

int ddk_has_nccl(void)
{
    return 0;
}

int ddk_comm_unique_id(char *hex, char *err, size_t err_len)
{
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

int ddk_comm_init(const char *id_hex, int world, int first_rank, int local, const int *devices,
                  ddk_comm **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

int ddk_comm_allreduce_sum(ddk_comm *c, float *const *bufs, int64_t count, char *err,
                           size_t err_len)
{
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

void ddk_comm_destroy(ddk_comm *c)
{
}

int ddk_link_init(int n, const int *devices, ddk_link **out, char *err, size_t err_len)
{
    if (out)
        *out = NULL;
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

int ddk_link_send(ddk_link *l, int from, int to, const void *src, void *dst, size_t bytes, char *err,
                  size_t err_len)
{
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

int ddk_link_fence(ddk_link *l, int to, char *err, size_t err_len)
{
    return ddk_comm_error(-ENOSYS, err, err_len, "%s", no_nccl);
}

void ddk_link_destroy(ddk_link *l)
{
}
