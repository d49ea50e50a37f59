/* test_fault.c: base/fault.h's fault points: "POINT@N" fires the N-th reach only, bad and
 * unknown entries of DDTREE_FAULT are ignored, a kill point SIGKILLs the process, an unarmed one
 * does nothing. DDTREE_FAULT is read once a process: every case runs in a child of its own.
 */
#include "base/fault.h"
#include "check.h"

#include <errno.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

/* body() in a child with DDTREE_FAULT=spec (NULL: unset): its wait status */
static int in_child(const char *spec, int (*body)(void))
{
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        if (spec)
            setenv("DDTREE_FAULT", spec, 1);
        else
            unsetenv("DDTREE_FAULT");
        _exit(body());
    }
    int status = 0;
    waitpid(child, &status, 0);
    return status;
}

/* data.read@2 among bad entries: 0, -EIO, 0; store.mid_commit not armed */
static int io_counts(void)
{
    int a = ddt_fault_io("data.read"), b = ddt_fault_io("data.read"), c = ddt_fault_io("data.read");
    ddt_fault_point("store.mid_commit");
    return a == 0 && b == -EIO && c == 0 ? 0 : 1;
}

static int kill_point(void)
{
    ddt_fault_point("export.config_written");   /* not armed: goes on */
    ddt_fault_point("checkpoint.tensors_written");
    return 4;   /* not reached */
}

static int unarmed(void)
{
    ddt_fault_point("checkpoint.tensors_written");
    return ddt_fault_io("data.read") == 0 && ddt_fault_state == 1 ? 0 : 1;
}

static void test_fault_points(void)
{
    int status = in_child("nonsense.point,data.read@x,data.read@,data.read@2", io_counts);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "data.read@2 did not fail the 2nd read only (status %#x)",
          status);
    status = in_child("checkpoint.tensors_written", kill_point);
    check(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL, "an armed kill point did not SIGKILL (status %#x)",
          status);
    status = in_child("checkpoint.tensors_written@2", kill_point);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 4, "a kill point armed @2 fired at its 1st reach (status %#x)",
          status);
    status = in_child(NULL, unarmed);
    check(WIFEXITED(status) && WEXITSTATUS(status) == 0, "unarmed points did something (status %#x)", status);
}

int main(void)
{
    run_case("fault points: DDTREE_FAULT=POINT@N, kill and EIO", test_fault_points);
    return cases_summary();
}
