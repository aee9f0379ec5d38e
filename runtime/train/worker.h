/* worker.h - the built-in trainer behind `dtrain worker JOB.ini`.
 *
 * One worker process trains one model replica: it reads the torchrun environment the agent
 * gives (or runs as a single process without it), opens the backend, the data, the model and
 * the optimiser, and loops: micro-steps of forward and backward with gradient accumulation, a
 * gradient synchronisation point, clipping, the optimiser step, metrics, evaluation.
 *
 * Everything a checkpoint must capture to resume a run exactly lives in dt_trainer: the step,
 * the sampler's (epoch, position), the trainer RNG, the optimiser's t and state buffers, the
 * model's parameters and buffers, the learning-rate schedule (a function of the step).
 *
 * Seams for the modules that slot in later (each is one static function in worker.c, marked
 * "SEAM", that the module's author fills in; nothing else in the loop needs to change):
 *   comm_init    DDP: create t->comm from the store (DTRAIN_STORE_ADDR/PORT, run id, attempt)
 *                and the reducer t->ddp; set t->grad_ready/t->grad_ready_ctx to the reducer's
 *                hook. Without DDP a world size > 1 is an error that says so.
 *   after_build  DDP: broadcast parameters and buffers from rank 0, check consistency.
 *                Checkpoints (wired): open t->ckpt, resume (checkpoint.resume = auto | path;
 *                a restart of a run that began from a path resumes what that run wrote since).
 *   sync_grads   DDP: wait for the bucket all-reduces launched from grad_ready (averaged), before
 *                clipping and the optimiser step; the time spent is t->comm_time_s.
 *   average      DDP: all-reduce (mean) of a few doubles (the step loss, eval sums) for metrics.
 *   after_step   Checkpoints (wired): save every checkpoint.every steps (rank 0, in the
 *                background; dt_ckpt_fence before the next optimiser update).
 *   finish       Checkpoints (wired): save at the end, and when a signal (SIGTERM, SIGINT,
 *                SIGUSR1, SIGUSR2) stopped the loop; the worker then exits 75
 *                (DT_EXIT_PREEMPTED) and running it again resumes.
 * grad_ready is passed to backward of the LAST micro-step of an accumulation only (DDP's
 * no_sync for the others); backward reports gradient ranges as they become final.
 */
#ifndef DT_WORKER_H
#define DT_WORKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "runtime/train/ckpt.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/job/workenv.h"
#include "runtime/train/data.h"
#include "runtime/train/metrics.h"
#include "runtime/train/model.h"
#include "runtime/train/optim.h"

typedef struct dt_trainer {
    dt_job job;               /* the resolved job (a copy) */
    dt_worker_env env;
    dt_backend *be;           /* owned */
    dt_data *data;            /* owned */
    dt_model *model;          /* owned */
    dt_optim *optim;          /* owned */
    dt_metrics *metrics;      /* owned; opened by dt_trainer_run (NULL in benchmarks) */
    dt_lr_schedule sched;     /* lr as a function of step */
    dt_loss_scaler scaler;    /* train.precision = fp16: dynamic loss scale (checkpointed) */
    bool tokens;              /* language model: throughput in tokens */
    int64_t items_per_step;   /* tokens or samples per optimiser step, all ranks */

    /* ---- state a checkpoint saves and restores ---- */
    int64_t step;             /* optimiser steps completed */
    dt_sampler sampler;       /* training order: sampler.epoch and sampler.pos */
    dt_rng rng;               /* trainer RNG, seeded from (seed, rank); for run-time randomness */
    int64_t samples_seen;     /* samples trained on since the start, all ranks: each step adds
                                 its global batch (batch x accum x world size at the time) */
    /* (and optim->t, optim->state[], model->params, model->buffers) */

    int64_t total_steps;      /* train.steps, or epochs x steps per epoch */
    int64_t steps_per_epoch;  /* optimiser steps per epoch */

    /* ---- the last step ---- */
    double loss;              /* mean over micro-steps (and ranks) */
    double grad_norm;         /* before clipping */
    double lr;
    double step_time_s;
    double comm_time_s;       /* spent in sync_grads */

    /* ---- seams (see the top of this file) ---- */
    dt_comm *comm;            /* DDP: communicator, owned by the DDP module; NULL without */
    void *ddp;                /* DDP: the reducer; NULL without */
    struct dt_dp *dp;         /* DP (job.strategy = dp): the replicas, owned; model and be are
                                 its master replica's (borrowed from it); NULL without */
    dt_grad_ready_fn grad_ready; /* handed to backward on the last micro-step; NULL = none */
    void *grad_ready_ctx;
    dt_ckpt *ckpt;            /* checkpoints, owned; opened by after_build */
    int64_t last_saved_step;  /* step of the newest checkpoint this process saved or loaded
                                 (-1 = none) */
    volatile sig_atomic_t *stop; /* set (by a signal handler) to stop at the next step boundary;
                                    may be NULL */
    bool stop_agreed;         /* after a step: some rank's *stop was set when the step's loss
                                 was averaged, so every rank stops after this step (with
                                 several ranks, the loop stops on this, not on *stop) */
    bool config_error;        /* set when init failed on the configuration in a way every
                                 retry repeats (a bad checkpoint.resume path, checkpoints of
                                 another setup): dt_worker_main exits DT_EXIT_CONFIG */
    bool stop_self;           /* ... and this rank's own *stop was set then (it was signalled
                                 itself, not only told by another rank) */

    /* ---- scratch ---- */
    dt_batch_buf batch;       /* host batch of batch_size samples */
    int64_t *idx;             /* (batch_size) sample indices */
} dt_trainer;

/* job.cpu_bind = auto binds the calling thread, and the threads it starts afterwards (comm, DP
 * replicas, NCCL's), and says so in the log (common/cpuset.h):
 *   cpu backend, local_world > 1: to share local_rank of local_world of the CPUs it may use;
 *   cuda backend: to its share of the CPUs near its GPU (device local_rank), from sysfs.
 * Nothing otherwise, or when that cannot be had (fewer CPUs than workers, no NUMA information,
 * a cgroup without the GPU's node): left to the scheduler, logged at debug. */
void dt_worker_bind_cpus(const dt_job *j, const dt_backend *be, int local_rank, int local_world);

/* Builds everything for job on this worker: backend, data, model, optimiser, sampler, and the
 * comm_init and after_build seams (which resume from a checkpoint unless checkpoint.resume =
 * never). On failure t is cleaned up (dt_trainer_close is safe). */
int dt_trainer_init(dt_trainer *t, const dt_job *job, const dt_worker_env *env, dt_err *err);

/* One optimiser step (grad_accum micro-steps); fills loss, grad_norm, lr, step_time_s. Fails on
 * a non-finite loss or gradient, and on any data or seam error. */
int dt_trainer_step(dt_trainer *t, dt_err *err);

/* Mean validation loss over eval_batches batches (all ranks); *acc gets the classification
 * accuracy, or -1 for language models. -ENOENT when there is no validation data. */
int dt_trainer_eval(dt_trainer *t, double *loss, double *acc, dt_err *err);

/* The whole run: trains to total_steps with metrics, evaluation every eval_every steps and at
 * the end, the after_step and finish seams, and a summary on stdout (rank 0). *stopped is set
 * when a signal stopped the run early (may be NULL). */
int dt_trainer_run(dt_trainer *t, bool *stopped, dt_err *err);

/* What a divergence message suggests for job: setting train.grad_clip only when it is off. */
const char *dt_trainer_diverged_hint(const dt_job *job);

/* Accepts a zeroed or failed trainer. */
void dt_trainer_close(dt_trainer *t);

/* `dtrain worker` without the argument parsing: runs the job, writes the error file on failure.
 * Returns the process exit code: 0, 1 on failure, DT_EXIT_CONFIG (2) on a configuration
 * error found while starting, DT_EXIT_PREEMPTED (75) when a signal stopped it after saving
 * a checkpoint. */
int dt_worker_main(const dt_job *job);

#endif
