/* fault.c: the fault points of fault.h, a test hook: DDTREE_FAULT parsed once, each armed
 * point's hits counted (atomically: the loader, the writer and the trainer reach points from
 * their own threads), the kill or the -EIO on the armed hit.
 * Not here: where the points are (one line at each, fault.h's table), what the suite does
 * around them (tests/faults).
 */
#include "fault.h"
#include "log.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { FAULTS_MAX = 8, FAULT_NAME_MAX = 48 };

static const char *const known_points[] = {
    "checkpoint.tensors_written", "dir.renamed", "export.config_written", "store.mid_commit", "data.read",
};

typedef struct armed_point {
    char name[FAULT_NAME_MAX];
    long at;     /* fires on this hit (1 the first) */
    long hits;   /* so far, atomically */
} armed_point;

int ddt_fault_state;
static armed_point armed[FAULTS_MAX];
static int armed_count;
static pthread_once_t read_once = PTHREAD_ONCE_INIT;

static int is_known(const char *name)
{
    for (size_t i = 0; i < sizeof known_points / sizeof *known_points; i++)
        if (!strcmp(name, known_points[i]))
            return 1;
    return 0;
}

/* one entry "POINT[@N]" of len bytes into armed[], or a log line saying why not */
static void arm(const char *entry, size_t len)
{
    char text[2 * FAULT_NAME_MAX];
    if (len == 0)
        return;
    if (len >= sizeof text || armed_count == FAULTS_MAX) {
        ddt_log(DDT_LOG_ERR, "fault: DDTREE_FAULT entry \"%.*s\" ignored: too long, or more than %d entries",
                (int)(len < 64 ? len : 64), entry, FAULTS_MAX);
        return;
    }
    memcpy(text, entry, len);
    text[len] = '\0';
    long at = 1;
    char *count = strchr(text, '@');
    if (count) {
        char *end;
        *count++ = '\0';
        at = strtol(count, &end, 10);
        if (!*count || *end || at < 1) {
            ddt_log(DDT_LOG_ERR, "fault: DDTREE_FAULT entry \"%s@%s\" ignored: the count after @ must be an integer "
                    ">= 1", text, count);
            return;
        }
    }
    if (!is_known(text) || strlen(text) >= FAULT_NAME_MAX) {
        ddt_log(DDT_LOG_ERR, "fault: DDTREE_FAULT entry \"%s\" ignored: no such fault point (base/fault.h)", text);
        return;
    }
    armed_point *p = &armed[armed_count++];
    snprintf(p->name, sizeof p->name, "%s", text);
    p->at = at;
}

static void read_environment(void)
{
    const char *spec = getenv("DDTREE_FAULT");
    for (const char *p = spec; p && *p;) {
        size_t len = strcspn(p, ",");
        arm(p, len);
        p += len + (p[len] == ',');
    }
    __atomic_store_n(&ddt_fault_state, armed_count ? 2 : 1, __ATOMIC_RELEASE);
}

/* this reach of name: its number when it is the armed hit, else 0 */
static long fires(const char *name)
{
    pthread_once(&read_once, read_environment);
    for (int i = 0; i < armed_count; i++)
        if (!strcmp(armed[i].name, name))
            return __atomic_add_fetch(&armed[i].hits, 1, __ATOMIC_RELAXED) == armed[i].at ? armed[i].at : 0;
    return 0;
}

void ddt_fault_point_armed(const char *name)
{
    long hit = fires(name);
    if (!hit)
        return;
    ddt_log(DDT_LOG_ERR, "fault: DDTREE_FAULT point=%s hit=%ld: killed here (SIGKILL)", name, hit);
    kill(getpid(), SIGKILL);
    for (;;)
        pause();   /* not reached: SIGKILL cannot be caught */
}

int ddt_fault_io_armed(const char *name)
{
    long hit = fires(name);
    if (!hit)
        return 0;
    ddt_log(DDT_LOG_ERR, "fault: DDTREE_FAULT point=%s hit=%ld: this read fails (EIO)", name, hit);
    return -EIO;
}
