/* worker_guard.h - the worker's half of "workers never outlive their agent".
 *
 * Part of the agent-worker contract (runtime/job/): the agent's half is in runtime/launch, the
 * variable it sets is workenv.h's.
 *
 * The agent starts every worker with PR_SET_PDEATHSIG(SIGKILL) and DTRAIN_AGENT_PID set to its
 * own pid. A worker calls dt_worker_guard_init() first thing: it re-arms the parent-death signal
 * (harmless when already set, needed after an exec of a setuid helper cleared it) and checks that
 * its parent is still the agent, which closes the window where the agent died before the child's
 * prctl. Long loops may call dt_worker_guard_agent_alive() now and then (one getppid()).
 *
 * A worker started by hand (no DTRAIN_AGENT_PID) is not guarded: both calls succeed.
 */
#ifndef DT_WORKER_GUARD_H
#define DT_WORKER_GUARD_H

#include <stdbool.h>

#include "common/err.h"

/* Returns 0, or -ESRCH with err saying the agent is gone (the worker should exit non-zero). */
int dt_worker_guard_init(dt_err *err);

/* false once the agent that started this worker has gone (or was never the parent). */
bool dt_worker_guard_agent_alive(void);

#endif
