/* test_mapped.c: base/mapped.h's guarded reads of mapped files.
 *   - a whole file read through the guard; one shrunk since it was mapped refused before any read,
 *     the file and the sizes named;
 *   - a page that cannot be read (past the end of a file cut under its mapping, the size check
 *     out of the way, as an I/O error's SIGBUS would come): -ENODATA naming the file and the offset,
 *     and the next read of the same thread guarded again;
 *   - a SIGBUS outside a guarded read still ends the process (the handler hides no bug);
 *   - a chat file's line copied out of its mapping, and -ENODATA once the file is cut.
 * The fault point data.read's -EIO is tested in test_fault.c and through tests/faults.
 */
#include "base/mapped.h"
#include "data/chat_tokens.h"
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

enum { PAGE = 4096, PAGES = 3 };

static char dir[] = "/tmp/ddtree_test_mapped.XXXXXX";

/* a file of PAGES pages of bytes i % 251, mapped: *m describes it (path kept by the caller) */
static void *map_fixture(const char *path, ddt_mapped_file *m)
{
    unsigned char bytes[PAGES * PAGE];
    for (int i = 0; i < PAGES * PAGE; i++)
        bytes[i] = (unsigned char)(i % 251);
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, bytes, sizeof bytes) != (ssize_t)sizeof bytes) {
        perror(path);
        exit(2);
    }
    void *map = mmap(NULL, sizeof bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    *m = (ddt_mapped_file){ path, fd, map, sizeof bytes };
    return map;
}

typedef struct copy_request {
    unsigned char *to;
    const unsigned char *from;
    size_t n;
} copy_request;

static void copy(void *arg)
{
    const copy_request *c = arg;
    memcpy(c->to, c->from, c->n);
}

static void test_guarded_reads(void)
{
    char path[300], err[512] = "";
    snprintf(path, sizeof path, "%s/pages.bin", dir);
    ddt_mapped_file m;
    const unsigned char *map = map_fixture(path, &m);
    static unsigned char out[PAGES * PAGE];
    copy_request whole = { out, map, sizeof out };
    check(ddt_mapped_read(&m, 0, copy, &whole, err, sizeof err) == 0 && out[PAGE + 7] == (PAGE + 7) % 251,
          "a whole file's read: %s", err);

    /* cut to one page: the size check refuses, naming the file and both sizes */
    check(ftruncate(m.fd, PAGE) == 0, "ftruncate");
    int rc = ddt_mapped_read(&m, 2 * PAGE, copy, &whole, err, sizeof err);
    check(rc == -ENODATA && strstr(err, path) && strstr(err, "4096 bytes now, 12288 when it was opened") &&
          strstr(err, "truncated"), "a shrunk file: rc %d, %s", rc, err);

    /* the size check out of the way: the page past the end raises SIGBUS inside the guard */
    ddt_mapped_file cut = m;
    cut.bytes = PAGE;
    copy_request past = { out, map + 2 * PAGE + 16, 64 };
    err[0] = '\0';
    rc = ddt_mapped_read(&cut, 2 * PAGE + 16, copy, &past, err, sizeof err);
    check(rc == -ENODATA && strstr(err, path) && strstr(err, "a read at offset 8208 failed (SIGBUS"),
          "a page that cannot be read: rc %d, %s", rc, err);
    rc = ddt_mapped_read(&cut, 2 * PAGE + 16, copy, &past, err, sizeof err);
    check(rc == -ENODATA, "the same thread's next faulting read is guarded too: rc %d", rc);
    copy_request first = { out, map, 16 };
    check(ddt_mapped_read(&cut, 0, copy, &first, err, sizeof err) == 0 && out[15] == 15,
          "a read of the page still there after two faults: %s", err);

    /* outside a guarded read, SIGBUS keeps its disposition: the process ends */
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        int null = open("/dev/null", O_WRONLY);   /* a sanitizer's report of the fault: expected */
        if (null >= 0)
            dup2(null, 2);
        volatile unsigned char x = map[2 * PAGE];
        (void)x;
        _exit(3);   /* survived: the handler swallowed a real fault */
    }
    int status = 0;
    waitpid(child, &status, 0);
    check((WIFSIGNALED(status) && WTERMSIG(status) == SIGBUS) ||
          (WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 3),
          "a SIGBUS outside a guarded read did not end the process (status %#x)", status);
    munmap((void *)map, PAGES * PAGE);
    close(m.fd);
}

static void test_chat_line(void)
{
    char path[300], err[512] = "";
    snprintf(path, sizeof path, "%s/chat.jsonl", dir);
    FILE *f = fopen(path, "w");
    for (int i = 0; f && i < 400; i++)   /* ~20 KB: lines on pages past the first */
        fprintf(f, "{\"messages\": [{\"role\": \"user\", \"content\": \"line %03d\"}]}\r\n", i);
    if (!f || fclose(f)) {
        perror(path);
        exit(2);
    }
    ddt_chat_file c;
    check(ddt_chat_file_open(path, &c, err, sizeof err) == 0 && c.n_lines == 400, "open: %s", err);
    char *line = NULL;
    size_t cap = 0, len = 0;
    int rc = ddt_chat_file_copy_line(&c, 321, &line, &cap, &len, err, sizeof err);
    check(rc == 0 && strstr(line, "line 321\"}]}") && line[len - 1] == '}' && line[len] == '\0',
          "line 322 copied without its newline: rc %d, %s", rc, rc ? err : line);
    check(truncate(path, 100) == 0, "truncate");
    rc = ddt_chat_file_copy_line(&c, 321, &line, &cap, &len, err, sizeof err);
    check(rc == -ENODATA && strstr(err, path) && strstr(err, "truncated"), "a cut chat file: rc %d, %s", rc, err);
    free(line);
    ddt_chat_file_close(&c);
}

int main(void)
{
    scratch_dir(dir);
    static const test_case cases[] = {
        { "guarded reads of a mapping: a shrunk file, a page that cannot be read, SIGBUS elsewhere", test_guarded_reads },
        { "a chat file's line copied out of its mapping, and refused once the file is cut", test_chat_line },
    };
    run_cases(cases, sizeof cases / sizeof cases[0]);
    remove_tree(dir);
    return cases_summary();
}
