/* bench_allreduce.c - `dtrain bench allreduce`. */
#include "cmd/cmd.h"

int dt_bench_allreduce(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench allreduce", "this benchmark lands with its issue");
}
