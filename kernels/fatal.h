/* fatal.h: the one way libddk ends the process on a device or programming error (a failed
 * launch, a sticky CUDA error, a cuBLAS failure, a dimension cuBLAS cannot take): the message to
 * stderr as "<2>FILE:LINE ..." (a journal priority), then the hook the daemon set
 * (ddk_set_fatal_hook: flush what must survive), then abort(). DESIGN.md, "Failure policy":
 * systemd restarts the daemon and interrupted runs resume from their last checkpoint.
 * Not installed. Tested by tests/test_alloc.c (the hook runs, in a child process).
 */
#ifndef DDK_FATAL_H
#define DDK_FATAL_H

#include "ddk.h"

#ifdef __cplusplus
extern "C" {
#endif

/* exported (not installed) so that tests/test_alloc.c can check the hook */
__attribute__((noreturn, format(printf, 3, 4)))
DDK_API void ddk_fatal(const char *file, int line, const char *fmt, ...);

#ifdef __cplusplus
}
#endif

#endif
