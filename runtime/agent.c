/* agent.c - see agent.h. */
#include "runtime/agent.h"

int dt_agent_run(const dt_agent_spec *spec, dt_err *err)
{
    (void)spec;
    return dt_err_set(err, -ENOSYS, "the launcher lands with the launcher issue");
}
