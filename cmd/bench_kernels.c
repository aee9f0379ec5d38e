/* bench_kernels.c - `dtrain bench kernels`. */
#include "cmd/cmd.h"

int dt_bench_kernels(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench kernels", "this benchmark lands with its issue");
}
