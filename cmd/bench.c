/* bench.c - `dtrain bench NAME [options]`: dispatch to the benchmarks, one file each. */
#include <stdio.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/util.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} benches[] = {
    {"store", dt_bench_store, "store throughput, latency and a rendezvous-shaped round"},
    {"rdzv", dt_bench_rdzv, "simulated agents: round completion and node-loss recovery"},
    {"launch", dt_bench_launch, "worker start-up and restart latency"},
    {"kernels", dt_bench_kernels, "GFLOP/s of GEMM-bound ops against plain sgemm"},
    {"train", dt_bench_train, "training throughput and GEMM share of a job"},
    {"allreduce", dt_bench_allreduce, "all-reduce algbw/busbw table (nccl-tests style)"},
    {"dp-vs-ddp", dt_bench_dp_vs_ddp, "DataParallel against DDP on one job"},
    {"ckpt", dt_bench_ckpt, "checkpoint size, throughput and how long training is held"},
};

static void usage(FILE *out)
{
    fprintf(out, "usage: dtrain bench NAME [options]   (dtrain bench NAME --help)\n\n");
    for (size_t i = 0; i < DT_ARRAY_LEN(benches); i++)
        fprintf(out, "  %-10s %s\n", benches[i].name, benches[i].help);
}

int dt_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *names[DT_ARRAY_LEN(benches)];
    for (size_t i = 0; i < DT_ARRAY_LEN(benches); i++) {
        names[i] = benches[i].name;
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].fn(argc - 1, argv + 1);
    }
    const char *near = dt_nearest(argv[1], names, DT_ARRAY_LEN(benches));
    fprintf(stderr, "dtrain bench: unknown benchmark \"%s\"%s%s%s\n", argv[1],
            near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
    usage(stderr);
    return 2;
}
