/* fatal.c: ddk_fatal and ddk_set_fatal_hook (ddk.h). The hook runs at most once: a
 * fatal error inside the hook goes straight to abort(); one on another thread meanwhile (a
 * device fault seen by several rank threads) waits for the first thread's hook to end the
 * process. Tested by tests/kernels/test_alloc.c. */
#include "ddk.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void (*fatal_hook)(const char *message);
static int fatal_entered;
static pthread_t fatal_owner;

void ddk_set_fatal_hook(void (*hook)(const char *message))
{
    __atomic_store_n(&fatal_hook, hook, __ATOMIC_RELEASE);
}

void ddk_fatal(const char *file, int line, const char *fmt, ...)
{
    char message[768];
    int used = snprintf(message, sizeof message, "%s:%d ", file, line);
    if (used < 0 || used >= (int)sizeof message)
        used = (int)sizeof message - 1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message + used, sizeof message - (size_t)used, fmt, ap);
    va_end(ap);
    fprintf(stderr, "<2>%s\n", message);
    if (__atomic_exchange_n(&fatal_entered, 1, __ATOMIC_ACQ_REL)) {
        if (pthread_equal(__atomic_load_n(&fatal_owner, __ATOMIC_ACQUIRE), pthread_self()))
            abort();   /* from within the hook */
        for (;;)
            pause();   /* another thread's hook is flushing; that thread aborts the process */
    }
    __atomic_store_n(&fatal_owner, pthread_self(), __ATOMIC_RELEASE);
    void (*hook)(const char *) = __atomic_load_n(&fatal_hook, __ATOMIC_ACQUIRE);
    if (hook)
        hook(message);
    abort();
}
