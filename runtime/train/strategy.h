/* strategy.h - how one training step is spread over ranks: the one interface the trainer's loop
 * calls, whatever the layout.
 *
 * The loop in worker.c reads top to bottom and never asks which strategy runs:
 *
 *   open        build the communicator(s), the backend(s), the model(s) and the optimiser
 *               for this rank
 *   start       after a checkpoint was loaded into the model and the optimiser: make every rank
 *               agree (DDP: check the model, broadcast rank 0's parameters, build the buckets)
 *   micro_step  forward and backward of one micro-batch; `last` = the last micro-step of the
 *               accumulation (gradients are synchronised only then: DDP's no_sync for the rest)
 *   sync_grads  after the last micro-step: wait until this rank's gradients are final
 *               (all-reduced, reduced to the master, reduce-scattered, ...)
 *   average     the mean of a few doubles over the ranks (loss, stop flags, eval sums)
 *   clip        the global gradient norm (over shards and stages where the strategy splits the
 *               gradients), clipping when train.grad_clip is set
 *   optim_step  the optimiser update of what this rank owns (and whatever must follow it: the
 *               all-gather of updated shards, ...)
 *   eval_step   forward only, for evaluation
 *   state       the tensors a checkpoint holds, whole, under their usual names
 *   close       tear-down; accepts a strategy whose open failed half way
 *
 * Implementations: single (one process, one replica), ddp (strategy_ddp.c: DistributedDataParallel,
 * one replica per process) and dp (strategy_dp.c: DataParallel, replicas driven by one process);
 * ZeRO, tensor and pipeline parallelism plug in beside them. strategies.h picks one from the job.
 *
 * An implementation includes this header and what it drives (comm/, the model, the optimiser);
 * it never includes worker.h: what it needs from the trainer comes in dt_strategy_ctx.
 */
#ifndef DT_STRATEGY_H
#define DT_STRATEGY_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "kernels/backend.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/job/workenv.h"
#include "runtime/train/ckpt.h"
#include "runtime/train/model.h"
#include "runtime/train/optim.h"

/* What the trainer gives a strategy to open it with. All borrowed; they outlive the strategy. */
typedef struct dt_strategy_ctx {
    const dt_job *job;              /* the resolved job, read only */
    const dt_worker_env *env;       /* rank, world, store address, run id, round */
    const dt_backend_opts *be_opts; /* device index, threads, precision */
    const dt_model_config *model;   /* the model to build (max_batch = the rank's batch) */
    const dt_optim_config *optim;   /* the optimiser to build over what this rank updates */
} dt_strategy_ctx;

typedef struct dt_strategy dt_strategy;

typedef struct dt_strategy_ops {
    const char *name; /* "single", "ddp", "dp" */
    /* Builds s->be, s->model, s->optim and s->comm (NULL with one rank). -errno and err on
     * failure; close is still called. */
    int (*open)(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err);
    /* After the trainer resumed the model and the optimiser from a checkpoint (or did not). */
    int (*start)(dt_strategy *s, dt_err *err);
    /* One micro-batch: forward and backward of loss x dloss (dloss: 1/accum, times the fp16
     * loss scale). *loss gets this rank's mean loss over the batch. */
    int (*micro_step)(dt_strategy *s, const dt_batch *batch, float dloss, bool last, float *loss,
                      dt_err *err);
    int (*sync_grads)(dt_strategy *s, dt_err *err);
    int (*average)(dt_strategy *s, double *v, int n, dt_err *err);
    /* Returns the global norm before clipping (non-finite: nothing was scaled). */
    double (*clip)(dt_strategy *s);
    void (*optim_step)(dt_strategy *s, double lr);
    /* Forward only; *loss the batch mean, *correct the correct predictions (classifiers). */
    int (*eval_step)(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                     dt_err *err);
    /* Fills bufs[0..*n) (cap entries) with what a checkpoint saves and loads: whole tensors under
     * their usual names (the model's parameters and buffers, the optimiser's state). */
    int (*state)(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err);
    void (*close)(dt_strategy *s);
} dt_strategy_ops;

/* A strategy: the public part every implementation fills, then its own state (impl). */
struct dt_strategy {
    const dt_strategy_ops *ops;
    dt_backend *be;    /* this rank's (master) backend; owned by the strategy */
    dt_model *model;   /* this rank's (master) model; owned by the strategy */
    dt_comm *comm;     /* the world communicator, or NULL with one rank; owned by the strategy */
    dt_optim *optim;   /* the optimiser of what this rank updates; owned by the strategy */
    double comm_time_s;/* time spent in the last sync_grads */
    void *impl;        /* the implementation's state */
};

#endif
