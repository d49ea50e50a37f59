/* attention_select.c: which kernels the CUDA backend's attention ops run (ddk.h,
 * ddk_cuda_attention_kernels): the tensor-core flash kernels (attention_flash.cu) or the fp32
 * SIMT ones (attention_cuda.cu), kept for the before/after benchmark. Built with and without
 * CUDA (without it the choice is recorded and nothing runs), so that tests and benchmarks link
 * either way.
 *
 * The environment variable DDTREE_CUDA_ATTENTION (simt | flash | auto, unset = auto) is read
 * once, at the first query; an unknown value is reported once on stderr and taken as auto.
 * ddk_cuda_set_attention_kernels overrides it for the process. Tested by
 * tests/test_backend_ops.c, which runs every attention case with both.
 */
#include "ddk.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int from_env;            /* DDK_CUDA_ATTENTION_*, set once by read_env */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int override_kind = -1;  /* -1: none */

static void read_env(void)
{
    const char *s = getenv("DDTREE_CUDA_ATTENTION");
    from_env = DDK_CUDA_ATTENTION_AUTO;
    if (!s || !*s || strcmp(s, "auto") == 0)
        return;
    if (strcmp(s, "simt") == 0)
        from_env = DDK_CUDA_ATTENTION_SIMT;
    else if (strcmp(s, "flash") == 0)
        from_env = DDK_CUDA_ATTENTION_FLASH;
    else
        fprintf(stderr, "<4>ddk: DDTREE_CUDA_ATTENTION=%s is not simt, flash or auto: using auto\n", s);
}

void ddk_cuda_set_attention_kernels(int kind)
{
    const int k = kind == DDK_CUDA_ATTENTION_SIMT || kind == DDK_CUDA_ATTENTION_FLASH ? kind
                                                                                     : DDK_CUDA_ATTENTION_AUTO;
    __atomic_store_n(&override_kind, kind < 0 ? -1 : k, __ATOMIC_RELEASE);
}

int ddk_cuda_attention_kernels(void)
{
    const int o = __atomic_load_n(&override_kind, __ATOMIC_ACQUIRE);
    if (o >= 0)
        return o;
    pthread_once(&env_once, read_env);
    return from_env;
}
