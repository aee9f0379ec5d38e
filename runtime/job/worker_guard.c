/* worker_guard.c - see worker_guard.h. */
#include "runtime/job/worker_guard.h"

#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "common/env.h"
#include "common/util.h"

/* The agent's pid from DTRAIN_AGENT_PID, or 0 when not started by an agent. The contract's
 * reader is workenv.c (dt_workenv_read: dt_worker_env.agent_pid, the writer's round trip tested);
 * the guard reads this one variable itself because it runs first, before the worker reads (and
 * validates) the rest of its environment. */
static int agent_pid(void)
{
    const char *s = dt_env("DTRAIN_AGENT_PID");
    int pid;
    if (!s || dt_parse_int(s, &pid) || pid <= 0)
        return 0;
    return pid;
}

int dt_worker_guard_init(dt_err *err)
{
    int pid = agent_pid();
    if (!pid)
        return 0;
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != pid)
        return dt_err_set(err, -ESRCH,
                          "the dtrain agent that started this worker (pid %d) is gone; exiting", pid);
    return 0;
}

bool dt_worker_guard_agent_alive(void)
{
    int pid = agent_pid();
    return !pid || getppid() == pid;
}
