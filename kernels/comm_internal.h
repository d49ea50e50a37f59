/* comm_internal.h: what the two builds of the NCCL communicator (cuda/comm_nccl.cu with NCCL,
 * cuda/comm_none.c without) share from comm_id.c: the unique id as hex, and err sentences.
 * Not installed; tested through ddk.h's ddk_comm_* in tests/kernels/test_comm.c.
 */
#ifndef DDK_COMM_INTERNAL_H
#define DDK_COMM_INTERNAL_H

#include "ddk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* bytes[0..DDK_COMM_ID_HEX / 2) as DDK_COMM_ID_HEX lowercase hex digits and a NUL */
void ddk_comm_id_encode(const unsigned char *bytes, char *hex);
/* hex (ddk_comm_id_valid, either case) into bytes[0..DDK_COMM_ID_HEX / 2): 0, or -EINVAL */
int ddk_comm_id_decode(const char *hex, unsigned char *bytes);
/* snprintf into err (nothing when err is NULL or err_len is 0); returns code */
int ddk_comm_error(int code, char *err, size_t err_len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#ifdef __cplusplus
}
#endif

#endif
