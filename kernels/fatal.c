/* fatal.c: ddk_fatal and ddk_set_fatal_hook (fatal.h, ddk.h). The hook runs at most once: a
 * second fatal error (from the hook itself, or another thread at the same time) goes straight
 * to abort(). Tested by tests/test_alloc.c. */
#include "ddk.h"
#include "fatal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

static void (*fatal_hook)(const char *message);
static int fatal_entered;

void ddk_set_fatal_hook(void (*hook)(const char *message))
{
    __atomic_store_n(&fatal_hook, hook, __ATOMIC_RELEASE);
}

void ddk_fatal(const char *file, int line, const char *fmt, ...)
{
    char message[768];
    int used = snprintf(message, sizeof message, "%s:%d ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message + used, sizeof message - (size_t)used, fmt, ap);
    va_end(ap);
    fprintf(stderr, "<2>%s\n", message);
    void (*hook)(const char *) = __atomic_load_n(&fatal_hook, __ATOMIC_ACQUIRE);
    if (hook && !__atomic_exchange_n(&fatal_entered, 1, __ATOMIC_ACQ_REL))
        hook(message);
    abort();
}
