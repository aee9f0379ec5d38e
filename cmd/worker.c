/* worker.c - `dtrain worker JOB.ini [section.key=value ...]`: the built-in trainer. */
#include "cmd/cmd.h"

int dt_cmd_worker(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("worker", "the built-in trainer lands with the compute-core issue");
}
