/* bench_launch.c - `dtrain bench launch`. */
#include "cmd/cmd.h"

int dt_bench_launch(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench launch", "this benchmark lands with its issue");
}
