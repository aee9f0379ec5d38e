/* bench_rdzv.c - `dtrain bench rdzv`. */
#include "cmd/cmd.h"

int dt_bench_rdzv(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench rdzv", "this benchmark lands with its issue");
}
