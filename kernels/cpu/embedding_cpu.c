/* embedding_cpu.c: the frozen token embedding on the CPU: rows of the (V, H) table gathered
 * by token id, from an fp32 table (embedding) or from the target's bf16 table as stored
 * (embedding_w16, widened exactly). No backward: the drafter never trains the target's embedding.
 * Tested by tests/kernels/test_ops.c.
 */
#include "ddk.h"
#include "ddk_bf16.h"
#include "cpu_backend.h"

#include <string.h>

void ddk_cpu_embedding(const ddk_backend *be, const float *table, const int32_t *tokens,
                       int64_t rows, int64_t H, float *out)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + r * H, table + (int64_t)tokens[r] * H, (size_t)H * sizeof(float));
}

void ddk_cpu_embedding_w16(const ddk_backend *be, const uint16_t *table, const int32_t *tokens,
                           int64_t rows, int64_t H, float *out)
{
    for (int64_t r = 0; r < rows; r++) {
        const uint16_t *src = table + (int64_t)tokens[r] * H;   /* (H) */
        float *dst = out + r * H;                               /* (H) */
        for (int64_t i = 0; i < H; i++)
            dst[i] = ddk_bf16_to_f32(src[i]);
    }
}
