/* embedding_cpu.c: the frozen token embedding on the CPU: rows of the (V, H) table gathered
 * by token id. No backward: the drafter never trains the target's embedding.
 * Tested by tests/test_ops.c.
 */
#include "ddk.h"
#include "cpu_backend.h"

#include <string.h>

void ddk_cpu_embedding(const ddk_backend *be, const float *table, const int32_t *tokens,
                       int64_t rows, int64_t H, float *out)
{
    for (int64_t r = 0; r < rows; r++)
        memcpy(out + r * H, table + (int64_t)tokens[r] * H, (size_t)H * sizeof(float));
}
