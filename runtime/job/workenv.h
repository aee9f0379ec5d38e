/* workenv.h - the contract between the agent and a worker: the environment one writes and the
 * other reads, and the exit codes a worker ends with.
 *
 * One struct, one writer (dt_workenv_export, the agent, for every worker it starts) and one
 * reader (dt_workenv_read, the built-in worker). A command run as a worker (`dtrain -- python3
 * train.py`) reads the same variables under torchrun's names.
 *
 * (Contract settled first; the implementation and the remaining fields land with the launcher's
 * change: runtime/job/workenv.c.)
 */
#ifndef DT_WORKENV_H
#define DT_WORKENV_H

#include "common/err.h"

/* The exit codes of a worker, and of dtrain itself (README, "Exit codes"). */
#define DT_EXIT_OK 0
#define DT_EXIT_FAILED 1    /* a failure; the agent restarts the job while its budget lasts */
#define DT_EXIT_CONFIG 2    /* a usage or job-file error: the same command fails the same way */
#define DT_EXIT_PREEMPTED 75 /* EX_TEMPFAIL: stopped by a signal after saving a checkpoint; run
                                the same command again to resume */

/* What differs between workers and attempts. */
typedef struct dt_worker_env {
    int rank;              /* RANK (0) */
    int local_rank;        /* LOCAL_RANK (0): device index */
    int world_size;        /* WORLD_SIZE (1) */
    int local_world_size;  /* LOCAL_WORLD_SIZE (1) */
    int group_rank;        /* GROUP_RANK (0): node rank */
    char store_addr[256];  /* DTRAIN_STORE_ADDR ("" when unset: single process) */
    int store_port;        /* DTRAIN_STORE_PORT (0) */
    char run_id[256];      /* DTRAIN_RUN_ID, else TORCHELASTIC_RUN_ID, else "local" */
    int attempt;           /* DTRAIN_ATTEMPT, else TORCHELASTIC_RESTART_COUNT (0) */
    int round;             /* DTRAIN_ROUND (new on restarts and elastic regroups), else attempt */
} dt_worker_env;

/* Reads the environment; unset variables give a single process. Malformed values (not a
 * number, RANK >= WORLD_SIZE, ...) are an error naming the variable. */
int dt_workenv_read(dt_worker_env *e, dt_err *err);

#endif
