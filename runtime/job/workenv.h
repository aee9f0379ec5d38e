/* workenv.h - the contract between the agent and a worker: the environment one writes and the
 * other reads, and the exit codes a worker ends with.
 *
 * One struct, one writer (dt_workenv_export: the agent, for every worker it starts) and one
 * reader (dt_workenv_read: the built-in worker). A command run as a worker (`dtrain -- python3
 * train.py`) reads the same variables under torchrun's names:
 *
 *   RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK GROUP_WORLD_SIZE
 *   ROLE_NAME ROLE_RANK ROLE_WORLD_SIZE MASTER_ADDR MASTER_PORT
 *   TORCHELASTIC_RESTART_COUNT TORCHELASTIC_MAX_RESTARTS TORCHELASTIC_RUN_ID
 *   TORCHELASTIC_USE_AGENT_STORE (always "False": dtrain's store is not PyTorch's TCPStore)
 *   TORCHELASTIC_ERROR_FILE OMP_NUM_THREADS TORCH_NCCL_ASYNC_ERROR_HANDLING (1 unless set)
 *
 * and dtrain's own (common/env.c's table): DTRAIN_STORE_ADDR DTRAIN_STORE_PORT DTRAIN_RUN_ID
 * DTRAIN_ATTEMPT DTRAIN_ROUND DTRAIN_ERROR_FILE DTRAIN_LOCAL_ADDR DTRAIN_AGENT_PID
 * DTRAIN_FLIGHT_FD.
 *
 * What reads a variable the writer sets is written here and nowhere else; the test
 * (tests/test_agent.c, workenv_round_trip) exports a struct, reads it back and compares.
 */
#ifndef DT_WORKENV_H
#define DT_WORKENV_H

#include <stddef.h>

#include "common/err.h"

/* The exit codes of a worker, and of dtrain itself (docs/failures.md, "Exit codes"). */
#define DT_EXIT_OK 0
#define DT_EXIT_FAILED 1    /* a failure; the agent restarts the job while its budget lasts */
#define DT_EXIT_CONFIG 2    /* a usage or job-file error: the same command fails the same way */
#define DT_EXIT_OOM 3       /* out of device memory (job.device_memory or the device's own): the
                               layout does not fit; the agent does not restart into it */
#define DT_EXIT_PREEMPTED 75 /* EX_TEMPFAIL: stopped by a signal after saving a checkpoint; run
                                the same command again to resume */

#define DT_WORKENV_STR 256   /* host names, run ids, role names */
#define DT_WORKENV_PATH 1040 /* the error file: <log dir>/<run id>/attempt_<k>/<rank>/error.json */

/* What differs between workers and attempts. The reader's value when the variable is unset is
 * in parentheses: a worker started by hand is a single process. */
typedef struct dt_worker_env {
    int rank;              /* RANK, ROLE_RANK (0) */
    int local_rank;        /* LOCAL_RANK (0): device index */
    int world_size;        /* WORLD_SIZE, ROLE_WORLD_SIZE (1) */
    int local_world_size;  /* LOCAL_WORLD_SIZE (1) */
    int group_rank;        /* GROUP_RANK (0): node rank */
    int group_world_size;  /* GROUP_WORLD_SIZE (1): nodes */
    char role[DT_WORKENV_STR]; /* ROLE_NAME ("default"; the writer turns "" into "default") */
    char master_addr[DT_WORKENV_STR]; /* MASTER_ADDR ("127.0.0.1"): the workers' own port's host */
    int master_port;       /* MASTER_PORT (0): a free port for the workers (PyTorch's store) */
    char store_addr[DT_WORKENV_STR]; /* DTRAIN_STORE_ADDR ("" = no store: the writer leaves it
                                        and DTRAIN_STORE_PORT unset) */
    int store_port;        /* DTRAIN_STORE_PORT (0) */
    char run_id[DT_WORKENV_STR]; /* DTRAIN_RUN_ID and TORCHELASTIC_RUN_ID (written; read: the
                                    first set of the two, else "local") */
    int attempt;           /* DTRAIN_ATTEMPT and TORCHELASTIC_RESTART_COUNT (0): the restart */
    int max_restarts;      /* TORCHELASTIC_MAX_RESTARTS (0) */
    int round;             /* DTRAIN_ROUND: the rendezvous round, new on every restart and every
                              membership change of an elastic job (read: attempt when unset) */
    char error_file[DT_WORKENV_PATH]; /* DTRAIN_ERROR_FILE and TORCHELASTIC_ERROR_FILE (""):
                                         where the worker writes its error record */
    char local_addr[DT_WORKENV_STR]; /* DTRAIN_LOCAL_ADDR ("127.0.0.1"): how other nodes reach
                                        this node's workers */
    int agent_pid;         /* DTRAIN_AGENT_PID (0 = not started by an agent) */
    int flight_fd;         /* DTRAIN_FLIGHT_FD (0 = none; 0-2 never are): the inherited
                              descriptor of the agent's flight-record mapping for this worker
                              (runtime/job/flightrec.h); written when > 2 */
    int omp_num_threads;   /* OMP_NUM_THREADS: written when > 0 (the agent gives 1 when the user
                              did not set it and a node runs several workers); read: 0 if unset */
} dt_worker_env;

/* Reads the environment; unset variables give a single process. Malformed values (not a
 * number, RANK >= WORLD_SIZE, ...) are an error naming the variable; *e is then partly set. */
int dt_workenv_read(dt_worker_env *e, dt_err *err);

/* ---- the writer --------------------------------------------------------------------------- */

/* A growable environment: "NAME=value" strings, NULL-terminated for execve. */
typedef struct dt_envb {
    char **v;   /* owned strings, v[n] == NULL */
    size_t n, cap;
} dt_envb;

/* Copies base (NULL-terminated, e.g. environ; NULL = empty). On failure b is empty. */
int dt_envb_init(dt_envb *b, char *const *base, dt_err *err);
/* Sets name=value, replacing an existing entry. */
int dt_envb_set(dt_envb *b, const char *name, const char *value, dt_err *err);
int dt_envb_setf(dt_envb *b, dt_err *err, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The value of name, or NULL. */
const char *dt_envb_get(const dt_envb *b, const char *name);
/* Accepts NULL and a zeroed b. */
void dt_envb_free(dt_envb *b);

/* Sets every variable of the contract from e on top of what b holds (the agent's environment):
 * what the reader reads back as e. Returns 0, or -ENOMEM with err set (b keeps what was set). */
int dt_workenv_export(const dt_worker_env *e, dt_envb *b, dt_err *err);

#endif
