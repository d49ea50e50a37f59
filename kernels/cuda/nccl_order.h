/* nccl_order.h: the one order of this process's NCCL operations. The data-parallel all-reduce
 * (comm_nccl.cu) and a split's link copies (link_nccl.cu) run on two communicators over the same
 * GPUs, which NCCL allows only with care: its kernels wait on the GPU for their peers, so two
 * communicators' operations in flight on one GPU can deadlock ("Using multiple NCCL
 * communicators concurrently": use them at different epochs, under a lock, in one order), and
 * two threads may not issue operations to communicators of one device together ("Thread
 * Safety"). So, in both files:
 *   - every NCCL call that creates, queues on or aborts a communicator is made under
 *     ddk_nccl_lock: one order, the same on every GPU;
 *   - on each GPU an operation starts after the previous one in that order is done: before
 *     queuing it, ddk_nccl_after makes its stream wait for the GPU's last one; once NCCL has
 *     queued it, ddk_nccl_queued records it as the GPU's last.
 * Then at most one NCCL operation runs on a GPU at a time, and every wait points back in the one
 * order (an operation waits for earlier ones, and for work queued before it), so none waits on a
 * later one: no cycle, no deadlock. Its price: an all-reduce waits for the copies queued before
 * it on its GPUs, and a copy for the all-reduce queued before it.
 *
 * Defined in comm_nccl.cu. Not installed; tested through ddk.h by tests/kernels/test_comm.c (with two
 * GPUs: an all-reduce and link copies from another thread at once, on the same GPUs).
 */
#ifndef DDK_NCCL_ORDER_H
#define DDK_NCCL_ORDER_H

#include <cuda_runtime.h>

/* The process's NCCL lock (not recursive) */
void ddk_nccl_lock(void);
void ddk_nccl_unlock(void);
/* Under the lock: stream (on GPU device) waits for the last NCCL operation queued on device
 * (nothing before the first). */
cudaError_t ddk_nccl_after(int device, cudaStream_t stream);
/* Under the lock, once NCCL has queued an operation on stream (on GPU device): it is the last
 * on device. Leaves device the current GPU. */
cudaError_t ddk_nccl_queued(int device, cudaStream_t stream);

#endif
