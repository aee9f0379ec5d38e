/* bench_store.c - `dtrain bench store`. */
#include "cmd/cmd.h"

int dt_bench_store(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return dt_cmd_unavailable("bench store", "this benchmark lands with its issue");
}
