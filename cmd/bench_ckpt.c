/* bench_ckpt.c - `dtrain bench ckpt`. */
#include "cmd/cmd.h"

int dt_bench_ckpt(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench ckpt", "this benchmark lands with its issue");
}
