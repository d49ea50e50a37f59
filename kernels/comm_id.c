/* comm_id.c: the NCCL unique id as text (DDK_COMM_ID_HEX hex digits, the form daemons hand each
 * other through POST /nccl/unique-id and the run config's "cluster" section) and the err
 * sentences of ddk_comm_*. Plain C, in every build; the communicator itself is
 * cuda/comm_nccl.cu (or cuda/comm_none.c without CUDA).
 * Tested by tests/kernels/test_comm.c.
 */
#include "comm_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* 0..15, or -1 when c is not a hex digit */
static int hex_value(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

int ddk_comm_id_valid(const char *hex)
{
    if (!hex)
        return 0;
    for (int j = 0; j < DDK_COMM_ID_HEX; j++)
        if (hex_value(hex[j]) < 0)   /* also stops at a NUL before the end */
            return 0;
    return hex[DDK_COMM_ID_HEX] == '\0';
}

void ddk_comm_id_encode(const unsigned char *bytes, char *hex)
{
    static const char digits[] = "0123456789abcdef";
    for (int j = 0; j < DDK_COMM_ID_HEX / 2; j++) {
        hex[2 * j] = digits[bytes[j] >> 4];
        hex[2 * j + 1] = digits[bytes[j] & 15];
    }
    hex[DDK_COMM_ID_HEX] = '\0';
}

int ddk_comm_id_decode(const char *hex, unsigned char *bytes)
{
    if (!ddk_comm_id_valid(hex))
        return -EINVAL;
    for (int j = 0; j < DDK_COMM_ID_HEX / 2; j++)
        bytes[j] = (unsigned char)(hex_value(hex[2 * j]) << 4 | hex_value(hex[2 * j + 1]));
    return 0;
}

int ddk_comm_error(int code, char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list args;
        va_start(args, fmt);
        vsnprintf(err, err_len, fmt, args);
        va_end(args);
    }
    return code;
}
