/* main.c - the dtrain binary's entry point; everything else is in cmd/dtrain.c.
 *
 * First the OpenBLAS kernel (cmd/blas_boot.h): this process may be a probe helper, and the
 * subcommands that run GEMMs (worker, bench, plan) re-execute themselves once with the kernel dtrain
 * chose when OpenBLAS picked one far below the CPU. The launcher gives its built-in workers the
 * choice in their environment instead (cmd/dtrain.c). */
#include <string.h>

#include "cmd/blas_boot.h"
#include "cmd/cmd.h"

int main(int argc, char **argv)
{
    bool gemms = argc >= 2 && (!strcmp(argv[1], "worker") || !strcmp(argv[1], "bench") ||
                                !strcmp(argv[1], "plan"));
    int rc = dt_blas_boot(argc, argv, gemms);
    if (rc >= 0)
        return rc;
    return dt_cmd_main(argc, argv);
}
