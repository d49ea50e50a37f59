/* mapped.c: guarded reads of mapped files (mapped.h): the size check, the fault point, and the
 * SIGBUS handler that jumps back into the guarded read of its own thread.
 * Not here: mapping the files (safetensors.c, chat_tokens.c), what the readers copy.
 */
#include "mapped.h"
#include "errors.h"
#include "fault.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>

/* the guarded read this thread is in (NULL: none), and where its SIGBUS struck; initial-exec:
 * read from the handler without a call into the dynamic loader */
static __thread sigjmp_buf *guard __attribute__((tls_model("initial-exec")));
static __thread const void *fault_address __attribute__((tls_model("initial-exec")));
static struct sigaction previous;   /* SIGBUS's disposition before ours */
static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int install_rc;

static void on_sigbus(int sig, siginfo_t *info, void *context)
{
    (void)context;
    sigjmp_buf *env = guard;
    if (env) {
        guard = NULL;
        fault_address = info->si_addr;
        siglongjmp(*env, 1);
    }
    /* not a guarded read's: the disposition from before, which the faulting access meets when it
     * is retried on return (a SIGBUS sent by kill(2) is not retried: raised again, pending until
     * the handler returns) */
    sigaction(SIGBUS, &previous, NULL);
    if (info->si_code <= 0)
        raise(sig);
}

static void install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    install_rc = sigaction(SIGBUS, &sa, &previous) ? -errno : 0;
}

int ddt_mapped_read(const ddt_mapped_file *f, size_t offset, void (*read)(void *arg), void *arg, char *err,
                    size_t err_len)
{
    int rc = ddt_fault_io("data.read");
    if (rc)
        return ddt_fail_path(err, err_len, -ENODATA, f->path, "cannot be read at offset %zu: %s (injected: "
                             "DDTREE_FAULT data.read)", offset, strerror(-rc));
    struct stat st;
    if (fstat(f->fd, &st) != 0)
        return ddt_fail_path(err, err_len, -errno, f->path, "cannot stat: %s", strerror(errno));
    if ((uint64_t)st.st_size < (uint64_t)f->bytes)
        return ddt_fail_path(err, err_len, -ENODATA, f->path, "is %lld bytes now, %zu when it was opened: truncated "
                             "while in use, its data from offset %lld on gone (reading at offset %zu)",
                             (long long)st.st_size, f->bytes, (long long)st.st_size, offset);
    pthread_once(&install_once, install);
    if (install_rc)
        return ddt_fail(err, err_len, install_rc, "cannot install the SIGBUS handler that guards reads of %s: %s",
                        f->path, strerror(-install_rc));
    sigjmp_buf env;
    if (sigsetjmp(env, 1)) {   /* the mask saved: SIGBUS, blocked in the handler, unblocked again */
        const uintptr_t at = (uintptr_t)fault_address, base = (uintptr_t)f->base;
        const size_t where = at >= base && at - base < f->bytes ? (size_t)(at - base) : offset;
        return ddt_fail_path(err, err_len, -ENODATA, f->path, "a read at offset %zu failed (SIGBUS: an I/O error, or "
                             "the file shrank while mapped)", where);
    }
    guard = &env;
    read(arg);
    guard = NULL;
    return 0;
}
