/* attention_select.c: which kernels the CUDA backend's attention ops run (ddk.h,
 * ddk_cuda_attention_kernels): the tensor-core flash kernels (attention_flash.cu) or the fp32
 * SIMT ones (attention_cuda.cu), kept for the before/after benchmark. Built with and without
 * CUDA (without it the choice is recorded and nothing runs), so that tests and benchmarks link
 * either way.
 *
 * The environment variable DDTREE_CUDA_ATTENTION (simt | flash | auto, unset = auto) is read
 * once, at the first query; an unknown value is reported once on stderr and taken as auto.
 * ddk_cuda_set_attention_kernels overrides it for the process. It also keeps the record of
 * fallbacks (ddk_cuda_fallbacks: flash in force, the SIMT kernels ran). Tested by
 * tests/kernels/test_backend_ops.c, which runs every attention case with both, and
 * tests/simt/test_simt_kernels.cpp (a fallback recorded once per call, said in a sentence).
 */
#include "ddk.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the CUDA attention's record of a fallback (declared for it in cuda_backend.h) */
void ddk_cuda_note_fallback(const char *what);

static int from_env;            /* DDK_CUDA_ATTENTION_*, set once by read_env */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static int override_kind = -1;  /* -1: none */
static pthread_mutex_t fallback_lock = PTHREAD_MUTEX_INITIALIZER;
static uint64_t fallback_count;  /* under fallback_lock, with the last sentence */
static char fallback_last[320];

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

void ddk_cuda_note_fallback(const char *what)
{
    pthread_mutex_lock(&fallback_lock);
    fallback_count++;
    snprintf(fallback_last, sizeof fallback_last, "%s", what);
    pthread_mutex_unlock(&fallback_lock);
}

uint64_t ddk_cuda_fallbacks(char *what, size_t what_len)
{
    pthread_mutex_lock(&fallback_lock);
    const uint64_t n = fallback_count;
    if (what && what_len)
        snprintf(what, what_len, "%s", fallback_last);
    pthread_mutex_unlock(&fallback_lock);
    return n;
}
