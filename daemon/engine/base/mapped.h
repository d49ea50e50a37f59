/* mapped.h: reads of a mapped file that fail cleanly. A page of a mapping that cannot be read
 * (an I/O error), or that lies past the end of a file truncated while mapped, raises SIGBUS,
 * which would end the daemon with every run in it. ddt_mapped_read runs a reader over the
 * mapping with SIGBUS caught for the calling thread: a fault inside the reader returns -ENODATA
 * (the data could not be read: its own code, which the run manager pauses a run for, apart from a
 * device's or NCCL's -EIO) with err = "PATH: ... offset X ..." It also refuses, before reading, a file that is now shorter
 * than when it was mapped (the last page past a new end reads zeros, not SIGBUS), and answers
 * -ENODATA at the fault point "data.read" (fault.h, whose EIO it names in err).
 * How: a SIGBUS handler installed once (at the first guarded read) jumps back (siglongjmp) only
 * when the faulting thread is inside a guarded read; any other SIGBUS gets the disposition that
 * was there before (the default: the process ends, with a core), so a bug is not hidden.
 * The reader must only read the mapping and write its outputs: no locks, no allocation (it may
 * be left half-way).
 * Tested by tests/engine/base/test_mapped.c.
 */
#ifndef DDT_MAPPED_H
#define DDT_MAPPED_H

#include <stddef.h>

/* A file mapped whole: its path, an open descriptor of it (for its size now) and the mapping. */
typedef struct ddt_mapped_file {
    const char *path;
    int fd;
    const void *base;
    size_t bytes;   /* the file's size when it was mapped */
} ddt_mapped_file;

/* read(arg), which reads from f's mapping from offset on (offset: for the messages): 0, or
 * -ENODATA with err when the file shrank, a page could not be read, or the fault point data.read
 * fired. */
int ddt_mapped_read(const ddt_mapped_file *f, size_t offset, void (*read)(void *arg), void *arg, char *err,
                    size_t err_len);

#endif
