/* worker.h - the built-in trainer behind `dtrain worker JOB.ini`.
 *
 * runtime/train/ is the worker side of dtrain: everything one training process runs. It holds
 *   worker       the training loop (this file): build, step, evaluate, run, the entry point
 *   parallel/    how a step is spread over ranks: the layout interface (strategy.h), its shared
 *                helpers (strategy.c), the layouts (strategy_data: single, DDP, ZeRO;
 *                strategy_dp over dp.c's replicas; strategy_tensor; strategy_pipeline), their
 *                registry (strategies.h), the grid, and in dpsync/ the data-parallel axis every
 *                layout but dp holds (none, DDP over ddp.c's reducer, ZeRO-1/2, ZeRO-3)
 *   optim        AdamW and SGD over the flat parameter buffer, schedules, clipping, loss scaling
 *   ckpt         checkpoints (safetensors + state.json), saved in the background, resumed
 *   data         datasets, the distributed sampler, batches
 *   metrics      metrics.jsonl and the progress line
 *   trace        the timeline of train.trace: spans per rank as a Chrome trace (trace.h)
 *   safetensors  the file format of checkpoints' tensors
 *   models/      the model zoo (mlp, resnet, gpt) against kernels/backend.h
 * It may include common/, kernels/, runtime/comm/, runtime/job/ and the rendezvous store's
 * client (rendezvous/store.h, to bootstrap communicators); never runtime/launch/ (the agent
 * runs workers, workers do not run agents) and never cmd/.
 *
 * One worker process trains one rank: it reads the torchrun environment the agent gives (or
 * runs as a single process without it), opens the data, picks and opens the strategy (which
 * builds the backend, the model, the optimiser and the communicator), opens the checkpoint with
 * the strategy's state buffers and resumes, then loops, top to bottom, with no per-strategy
 * branch: zero the gradients, micro-steps of forward and backward with gradient accumulation,
 * the gradient synchronisation, the average of the loss (and of the stop flags) over ranks,
 * clipping, the optimiser step, metrics, evaluation, checkpoints every checkpoint.every steps,
 * and at the end (or when a signal stops the loop: SIGTERM, SIGINT, SIGUSR1, SIGUSR2; the worker
 * then exits 75, DT_EXIT_PREEMPTED, and running it again resumes).
 *
 * Everything a checkpoint must capture to resume a run exactly lives in dt_trainer (or in what
 * the strategy hands the checkpoint through its state op): the step, the sampler's (epoch,
 * position), the trainer RNG, the optimiser's t and state buffers, the model's parameters and
 * buffers, the loss scale, the learning-rate schedule (a function of the step).
 *
 * The job is read only: the trainer keeps its copy as resolved and derives what depends on the
 * strategy (the rank's batch) into fields of its own, so the job a checkpoint records reads back
 * as the job that was run.
 */
#ifndef DT_WORKER_H
#define DT_WORKER_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "runtime/train/ckpt/ckpt.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/job/workenv.h"
#include "runtime/train/data/data.h"
#include "runtime/train/parallel/grid.h"
#include "runtime/train/obs/metrics.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"
#include "runtime/train/parallel/strategy.h"

typedef struct dt_trainer {
    dt_job job;               /* the resolved job (a copy, never written after init) */
    dt_worker_env env;
    dt_grid grid;             /* this rank in the data x tensor x pipeline grid of env's world
                                 (parallel.tensor, parallel.pipeline): the data shard is the
                                 one of data-parallel rank grid.dp of grid.D */
    int batch;                /* samples this rank draws per micro-step (the strategy's
                                 rank_batch: batch_size, x dp_replicas for DP) */
    dt_gbatch gb;             /* train.global_batch over this run's world and `batch`: the
                                 micro-steps and this rank's share of each (gb.global = 0: off,
                                 grad_accum micro-steps of `batch`) */
    int micro_steps;          /* micro-steps this rank runs per step (gb: its M_r; else
                                 grad_accum) */
    dt_strategy *s;           /* owned: the backend, model, optimiser and communicator */
    dt_backend *be;           /* s->be, borrowed: this rank's (master) backend */
    dt_model *model;          /* s->model, borrowed */
    dt_optim *optim;          /* s->optim, borrowed */
    dt_data *data;            /* owned */
    dt_metrics *metrics;      /* owned; opened by dt_trainer_run (NULL in benchmarks) */
    bool trace_owned;         /* dt_trainer_run opened the process's trace (train.trace,
                                 runtime/train/obs/trace.h); dt_trainer_close closes it */
    dt_lr_schedule sched;     /* lr as a function of step */
    dt_loss_scaler scaler;    /* train.precision = fp16: dynamic loss scale (checkpointed) */
    bool tokens;              /* language model: throughput in tokens */
    int64_t items_per_step;   /* tokens or samples per optimiser step, all data-parallel ranks */

    /* ---- state a checkpoint saves and restores ---- */
    int64_t step;             /* optimiser steps completed */
    dt_sampler sampler;       /* training order: sampler.epoch and sampler.pos */
    dt_rng rng;               /* trainer RNG, seeded from (seed, rank); for run-time randomness */
    int64_t samples_seen;     /* samples trained on since the start, all ranks: each step adds
                                 its global batch (train.global_batch, else batch x accum x
                                 data-parallel ranks, grid.D, at the time) */
    uint64_t run;             /* metrics.jsonl's "run" (48 bits, as 12 hex digits): drawn at a
                                 fresh start, a resume continues its checkpoint's */
    /* (and optim->t, optim->states[], model->params, model->buffers) */

    int64_t total_steps;      /* train.steps, or epochs x steps per epoch */
    int64_t steps_per_epoch;  /* optimiser steps per epoch */

    /* ---- the last step ---- */
    double loss;              /* mean over micro-steps (and ranks) */
    double grad_norm;         /* before clipping */
    double lr;
    double step_time_s;
    double comm_time_s;       /* synchronising gradients (the strategy's s->comm_time_s) */
    int64_t comm_bytes;       /* bytes this rank sent for the gradients of the last step (the
                                 sync's dt_ddp_stats.comm_bytes); -1 without a reducer */

    /* ---- checkpoints and stopping ---- */
    dt_ckpt *ckpt;            /* checkpoints, owned; opened by dt_trainer_init */
    bool ckpt_sharded;        /* every rank saves its own pieces (checkpoint.sharded) */
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
    dt_batch_buf batch_buf;   /* host batch of `batch` samples */
    int64_t *idx;             /* (batch) sample indices; with gb, (M x batch): a whole step's */
} dt_trainer;

/* Builds everything for job on this worker: the data and its sampler, the strategy (backend,
 * model, optimiser, communicator), the checkpoint, which it resumes from unless
 * checkpoint.resume = never, and starts the strategy. job is copied. On failure t is cleaned up
 * (dt_trainer_close is safe). */
int dt_trainer_init(dt_trainer *t, const dt_job *job, const dt_worker_env *env, dt_err *err);

/* One optimiser step (grad_accum micro-steps, or with train.global_batch this rank's share of
 * exactly global_batch samples, see dt_gbatch in data.h); fills loss (the mean over the step's
 * samples), grad_norm, lr, step_time_s. Fails on a non-finite loss or gradient, and on any
 * data or strategy error. */
int dt_trainer_step(dt_trainer *t, dt_err *err);

/* Saves a checkpoint of the current step (every rank, at the same step: as checkpoint.every
 * does) and waits until it is written. Nothing when there is no checkpoint or this step is
 * saved already. */
int dt_trainer_save(dt_trainer *t, dt_err *err);

/* Mean validation loss over eval_batches batches (all ranks); *acc gets the classification
 * accuracy, or -1 for language models. -ENOENT when there is no validation data. */
int dt_trainer_eval(dt_trainer *t, double *loss, double *acc, dt_err *err);

/* The whole run: trains to total_steps with metrics, evaluation every eval_every steps and at
 * the end, checkpoints every checkpoint.every steps and at the end, and a summary on stdout
 * (rank 0). *stopped is set when a signal stopped the run early (may be NULL). */
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
