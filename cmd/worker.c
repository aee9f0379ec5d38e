/* worker.c - `dtrain worker JOB.ini [section.key=value ...]`: the built-in trainer.
 *
 * The agent runs this in every worker process with the torchrun environment, on the job it
 * resolved and wrote to a file (see runtime/job/config.h); run by hand it trains in one process
 * (the file and the overrides given here; no PET_* or DTRAIN_OUTPUT_DIR: those are the
 * launcher's). A job file that does not load is reported like any other fatal error, on stderr
 * and in the error file (DTRAIN_ERROR_FILE / TORCHELASTIC_ERROR_FILE), but with exit status
 * DT_EXIT_CONFIG (2): the agent then ends the job instead of restarting it into the same error. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/blas_boot.h"
#include "cmd/cmd.h"
#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/job/preflight.h"
#include "runtime/job/errfile.h"
#include "runtime/job/workenv.h"
#include "runtime/train/worker.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain worker JOB.ini [section.key=value ...]\n\n"
            "Trains the job in this process: the built-in trainer the launcher starts in every\n"
            "worker. Without the launcher's environment (RANK, WORLD_SIZE, ...) it is a single\n"
            "process; with WORLD_SIZE > 1 it joins the others through the dtrain store.\n"
            "Writes <output_dir>/metrics.jsonl (rank 0) and prints a summary when done.\n\n"
            "examples:\n"
            "  dtrain worker configs/quickstart.ini\n"
            "  dtrain worker configs/mlp.ini train.steps=50 train.lr=1e-2\n");
}

int dt_cmd_worker(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (dt_log_level <= DT_LOG_DEBUG) { /* the kernel every GEMM of this worker runs */
        char blas[1400];
        dt_blas_describe(blas, sizeof blas, true);
        DT_DEBUG("BLAS: %s", blas);
    }
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    for (int i = 2; i < argc; i++)
        if (!strchr(argv[i], '=')) {
            fprintf(stderr, "dtrain worker: \"%s\" is not section.key=value\n", argv[i]);
            usage(stderr);
            return DT_EXIT_CONFIG;
        }
    int rc = dt_job_load(&job, argv[1], argv + 2, argc - 2, &errs, &err);
    /* the job's files on this node: a worker run alone, or one whose files went since the
     * launcher looked (runtime/job/preflight.h) */
    if (!rc && dt_preflight_check(&job, &errs))
        rc = dt_err_set(&err, -EINVAL, "%d error%s in the job's files and directories on this "
                        "node", errs.count, errs.count == 1 ? "" : "s");
    if (rc != 0) {
        int shown = DT_MIN(errs.count, (int)DT_ARRAY_LEN(errs.lines));
        char msg[DT_ERR_MSG_MAX];
        snprintf(msg, sizeof msg, "%s", shown ? errs.lines[0] : err.msg);
        for (int i = 0; i < shown; i++)
            fprintf(stderr, "dtrain worker: %s\n", errs.lines[i]);
        fprintf(stderr, "dtrain worker: %s\n", err.msg);
        const char *rank = getenv("RANK");
        int r = 0;
        if (rank)
            dt_parse_int(rank, &r);
        dt_errfile_write(NULL, r, DT_EXIT_CONFIG, msg, NULL);
        return DT_EXIT_CONFIG;
    }
    return dt_worker_main(&job);
}
