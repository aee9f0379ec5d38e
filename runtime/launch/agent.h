/* agent.h - the per-node agent: rendezvous, forking workers, supervising and restarting them.
 *
 * runtime/launch/ is the launcher layer: everything `dtrain [launcher options] JOB.ini` (or
 * `-- COMMAND`) does on a node before, around and after the workers, and nothing of what a
 * worker does. agent.c runs the rounds over agent_loop (the agent's state, its signals,
 * reaping and output pumping); agent_job reads the settings and the job (rendezvous
 * options, where the logs go, the global batch, the worlds a layout can use); agent_layout
 * gets an elastic parallel.layout = auto round its layout; agent_env counts the devices
 * (--nproc-per-node); agent_proc forks, execs, signals and reaps the workers (process groups,
 * the guardian, the descendants they leave behind); agent_output forwards their lines;
 * agent_report writes events.jsonl and the root-cause table.
 *
 * What it may include: common/, rendezvous/ (the store and the rounds) and runtime/job/ (the job
 * file's launcher settings, the worker-environment contract workenv.h with its exit codes, the
 * error file). Never runtime/comm/, runtime/train/ or kernels/: the agent runs no model, opens
 * no communicator and touches no device (a process that initialised CUDA must not fork the
 * workers). What the agent and a worker share is the contract in runtime/job/workenv.h, not a
 * header of the other side. (python3 /work/shared/tools/module-loops.py checks the direction.)
 *
 * One agent runs on every node (`dtrain [launcher options] JOB.ini` or `... -- COMMAND`). It
 * joins (or hosts) the store, takes part in the rendezvous, starts nproc workers with fork+exec
 * and the torchrun environment, forwards their output line by line with a rank prefix, and on any
 * failure stops every worker on every node and restarts the job while the restart budget lasts.
 */
#ifndef DT_AGENT_H
#define DT_AGENT_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/job/config.h"
#include "runtime/launch/agent_flight.h"
#include "runtime/launch/agent_layout.h"

typedef struct dt_agent_spec {
    dt_launch launch;          /* resolved launcher settings */
    char *const *argv;         /* worker command, NULL-terminated; borrowed. For a job file this is
                                  {<path of dtrain>, "worker", JOB.ini, overrides..., NULL} */
    bool builtin_worker;       /* argv runs `dtrain worker` (job-file mode) */
    char output_dir[DT_PATH_MAX]; /* the job's output_dir ("" for commands) */
    int tensor, pipeline;      /* job-file mode: parallel.tensor and parallel.pipeline. Every
                                  round's world size must be a multiple of their product
                                  (dt_parallel_check_world): a round whose world is not ends the
                                  job as a configuration error (DT_EXIT_CONFIG) before any
                                  worker starts. 0 (commands) counts as 1. An elastic
                                  (c10d) round takes the most nodes whose world the layout can
                                  use (dt_agent_world_usable); the others wait as spares */
    int64_t global_batch;      /* job-file mode: train.global_batch (0: none), which a world's
                                  data-parallel ranks must not outnumber */
    dt_agent_layout_fn layout; /* parallel.layout = auto on an elastic job (cmd/plan.h's
                                  dt_plan_auto_round; NULL otherwise): at every round whose
                                  world is new, the layout for it (agent_layout.h), which the
                                  workers then load; its T and P replace tensor and pipeline */
    void *layout_arg;          /* layout's first argument (borrowed) */
    char *const *worker_env;   /* "NAME=value" strings (NULL-terminated; NULL: none; borrowed)
                                  each worker gets unless its environment has NAME already:
                                  cmd/ passes the OpenBLAS kernel it chose for built-in workers
                                  (OPENBLAS_CORETYPE, DTRAIN_BLAS_CHOICE: cmd/blas_boot.h) */
    const char *job_shared;    /* job-file mode: the settings every node must share
                                  (dt_job_shared_text; borrowed), agreed at the rendezvous: a
                                  node whose job differs from the first node's is refused
                                  (DT_EXIT_CONFIG); NULL for commands */
    dt_agent_flight_opts flight; /* job-file mode: the flight records' keys (train.flight_records,
                                    step_timeout, straggler_ratio, straggler_window); zero for
                                    commands: no flight records */
    const char *setup_error;   /* NULL, or one line (borrowed): this node's own files failed
                                  cmd/'s check (runtime/job/preflight.h) in a static job of
                                  several nodes, which would wait for this one until
                                  join_timeout. The agent then joins the first round only to end
                                  the job there for every node as a configuration error naming
                                  this node (DT_EXIT_CONFIG), and starts no worker */
} dt_agent_spec;

/* Runs the agent until the job ends. Returns the process exit code the README documents
 * (runtime/job/workenv.h: DT_EXIT_OK; DT_EXIT_FAILED, a worker failed and the budget is spent;
 * DT_EXIT_CONFIG, usage; DT_EXIT_PREEMPTED, every worker saved a checkpoint after a stop signal;
 * 128+n, killed by signal n), or a negative code with err set when the agent itself could not run
 * (cmd/ prints it, exits 1). */
int dt_agent_run(const dt_agent_spec *spec, dt_err *err);

#endif
