/* strategy.h - how one training step is spread over ranks: the one interface the trainer's loop
 * calls, whatever the layout.
 *
 * The loop in worker.c reads top to bottom and never asks which strategy runs:
 *
 *   open        build the communicator(s), the backend(s), the model(s) and the optimiser
 *               for this rank
 *   start       after a checkpoint was loaded into the model and the optimiser: make every rank
 *               agree (DDP: check the model, broadcast rank 0's parameters, build the buckets)
 *   zero_grads  the start of an accumulation: the gradients this rank accumulates into are zero
 *   micro_step  forward and backward of one micro-batch; `last` = the last micro-step of the
 *               accumulation (gradients are synchronised only then: DDP's no_sync for the rest)
 *   sync_grads  after the last micro-step: wait until this rank's gradients are final
 *               (all-reduced, reduced to the master, reduce-scattered, ...)
 *   average     the mean of a few doubles over the ranks (loss, stop flags, eval sums)
 *   clip        unscale (fp16), then the global gradient norm (over shards and stages where the
 *               strategy splits the gradients), clipping when train.grad_clip is set
 *   optim_step  the optimiser update of what this rank owns (and whatever must follow it: the
 *               all-gather of updated shards, ...)
 *   eval_step   forward only, for evaluation
 *   state       the tensors a checkpoint holds, whole, under their usual names
 *   gather_state  before a checkpoint is saved (every rank, collectively): make the buffers
 *               `state` handed out hold the whole tensors (ZeRO: all-gather the optimiser's
 *               shards); NULL where they always do. After a load the trainer calls start, which
 *               takes this rank's part of what the load put there
 *   close       tear-down; accepts a strategy whose open failed half way
 *
 * So one optimiser step, in the trainer, is:
 *
 *   zero_grads; micro_step x micro-steps (grad_accum, or derived from train.global_batch;
 *   last = true on the last); sync_grads;
 *   average(loss, stop flag); clip; optim_step (unless fp16 skips it); s->be->synchronize
 *
 * and a checkpoint, between steps, is gather_state (every rank) then rank 0's save; a resume is
 * every rank's load (open's `state` buffers) and then start.
 *
 * Implementations (the layouts): data (strategy_data.c: one replica of the whole model per
 * process, named single, ddp or zero after the data-parallel sync it holds), dp (strategy_dp.c:
 * DataParallel, replicas driven by one process, over dp.c), tensor (strategy_tensor.c:
 * Megatron-LM's splits inside gpt) and pipeline (strategy_pipeline.c: GPipe and 1F1B over the
 * stages of the D x T x P grid, any T). strategies.h picks one from the job.
 *
 * Parallelism is divided by axis: every layout but dp holds one data-parallel sync
 * (dpsync/dpsync.h: none, DDP, ZeRO-1/2, ZeRO-3) over its data-parallel group and its part of
 * the model, chosen once by the registry (ctx.sync) and reached only through that interface: a
 * layout never asks which flavour it holds. The D x T x P grid (grid.h) and the [ddp] options
 * are decided once too and come in ctx.
 *
 * An implementation includes this header and what it drives (comm/, the model, the optimiser);
 * it never includes worker.h or strategies.h: what it needs from the trainer comes in
 * dt_strategy_ctx, and the helpers below (strategy.c) are what implementations share.
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
#include "runtime/train/ckpt/ckpt.h"
#include "runtime/train/models/model.h"
#include "runtime/train/optim.h"
#include "runtime/train/parallel/dpsync/dpsync.h"
#include "runtime/train/parallel/grid.h"
#include "runtime/train/parallel/staging.h"

/* What the trainer gives a strategy to open it with. All borrowed, read during open (a layout
 * copies what it keeps; job and env outlive the strategy). */
typedef struct dt_strategy_ctx {
    const dt_job *job;              /* the job as loaded, read only */
    const dt_worker_env *env;       /* rank, world, store address, run id, round */
    const dt_backend_opts *be_opts; /* device index, threads, precision */
    const dt_model_config *model;   /* the model to build (max_batch = the rank's batch, see
                                       rank_batch) */
    const dt_optim_config *optim;   /* the optimiser to build over what this rank updates */
    const dt_grid *grid;            /* this rank's place in the D x T x P grid (grid.h), laid out
                                       once from the job and the world */
    const dt_ddp_opts *ddp;         /* the [ddp] keys, decoded once (dpsync/ddp.h) */
    const dt_dpsync_ops *sync;      /* the data-parallel sync the layout holds over its
                                       data-parallel group (NULL for dp) */
} dt_strategy_ctx;

/* What one rank of the tensor strategy holds and did, for `dtrain bench tensor` and the tests. */
typedef struct dt_tensor_stats {
    int D, T;                 /* data-parallel and tensor degrees */
    int dp, tp;               /* this rank's coordinates */
    size_t local_params;      /* parameters this rank holds (its slices + replicated tensors) */
    size_t split_local;       /* of which slices of split tensors (vocabulary padding included) */
    size_t replicated;        /* of which replicated tensors (LayerNorms, wpe, row biases) */
    size_t whole_params;      /* the whole model's parameters (what a checkpoint holds) */
    size_t split_whole;       /* whole elements of the tensors that are split */
    double dp_wait_s;         /* total time sync_grads waited for the data-parallel reducer */
    uint64_t clips;           /* clip calls (each one all-reduce of one double when T > 1) */
    dt_comm_stats tp_comm;    /* the tensor group's counters (the world's when D = 1) */
    dt_comm_stats dp_comm;    /* the data-parallel group's (zero when D = 1) */
} dt_tensor_stats;


/* What the last training micro_step of a pipeline rank measured (for dtrain bench pipeline). */
typedef struct dt_pp_stats {
    int P, M, stage;         /* layout of this rank */
    int slots;               /* activation slots the model holds (GPipe M, 1F1B min(P-s, M)) */
    int peak_in_flight;      /* most micro-batches whose activations were alive at once */
    double step_s;           /* wall time of the last micro_step (the schedule, the loss) */
    double compute_s;        /* of which in the model's stage_forward/stage_backward */
    double fwd_s, bwd_s;     /* ... split into forwards and backwards */
    double idle;             /* 1 - compute_s / step_s: this stage's bubble plus its waits */
    size_t slot_bytes;       /* one micro-batch's activations on this stage (the model's) */
    size_t act_bytes;        /* the model's activation memory plus the strategy's p2p buffers */
    size_t peak_act_bytes;   /* peak_in_flight x slot_bytes: what the schedule kept alive */
} dt_pp_stats;


/* What a layout measured and holds beyond the sync's figures (strategy.h's stats op): the
 * part of the layout that ran; the other is zero. */
typedef struct dt_strategy_stats {
    bool tensor;        /* tp holds the tensor layout's figures */
    bool pipeline;      /* pp holds the pipeline layout's */
    dt_tensor_stats tp;
    dt_pp_stats pp;
} dt_strategy_stats;

typedef struct dt_strategy dt_strategy;

typedef struct dt_strategy_ops {
    const char *name; /* "single", "ddp", "dp", "zero", "tensor", "pipeline" */
    /* Samples this rank's process draws from the data per micro-step (its sampler's batch),
     * derived from the job: train.batch_size for one replica per process, batch_size x
     * job.dp_replicas for DP (batch_size is per replica). Called before open. */
    int (*rank_batch)(const dt_job *job);
    /* Builds s->be, s->model, s->optim and s->comm (NULL with one rank). -errno and err on
     * failure; close is still called. */
    int (*open)(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err);
    /* After the trainer resumed the model and the optimiser from a checkpoint (or did not). */
    int (*start)(dt_strategy *s, dt_err *err);
    /* Zeroes the gradients the next micro-steps accumulate into. */
    void (*zero_grads)(dt_strategy *s);
    /* One micro-batch of at most rank_batch samples (fewer under train.global_batch, which
     * gives ranks and micro-steps unequal shares): forward and backward of loss x dloss (dloss:
     * 1/accum, or the micro-batch's weight n x world / global_batch, times the fp16 loss scale);
     * the gradients accumulate (+=). *loss gets this rank's mean loss over the batch. With
     * global_batch and batch_size = 1, ranks may run different numbers of micro-steps: a
     * strategy that communicates inside micro_step other than on the last must not rely on
     * equal counts (the trainer refuses model.sync_bn in that case). */
    int (*micro_step)(dt_strategy *s, const dt_batch *batch, float dloss, bool last, float *loss,
                      dt_err *err);
    /* Waits until the gradients are final; s->comm_time_s is the time it waited. */
    int (*sync_grads)(dt_strategy *s, dt_err *err);
    /* Replaces v[0..n) by its mean over the ranks (unchanged with one rank). */
    int (*average)(dt_strategy *s, double *v, int n, dt_err *err);
    /* Multiplies the gradients by unscale when it is not 1 (fp16: 1 / the loss scale), then
     * clips (train.grad_clip). *norm = the global norm before clipping (non-finite: nothing
     * was clipped). -errno and err when a collective it needs failed. */
    int (*clip)(dt_strategy *s, double unscale, double *norm, dt_err *err);
    /* One optimiser update at learning rate lr (and what must follow it: ZeRO's all-gather of
     * the updated parameters). -errno and err when a collective failed. */
    int (*optim_step)(dt_strategy *s, double lr, dt_err *err);
    /* Forward only, of up to rank_batch samples; *loss the batch mean, *correct the correct
     * predictions (classifiers). */
    int (*eval_step)(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                     dt_err *err);
    /* Fills bufs[0..*n) (cap entries) with what a checkpoint saves and loads: whole tensors under
     * their usual names (the model's parameters and buffers, the optimiser's state). The
     * buffers are the strategy's; they live until close. -ENOSPC when cap is too small. */
    int (*state)(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err);
    /* Before a save, on every rank at the same step (collective): afterwards the buffers state
     * gave hold the whole tensors until the next optim_step (by which time the trainer has
     * fenced the save's copy). NULL: they always hold them (dp). */
    int (*gather_state)(dt_strategy *s, dt_err *err);
    /* What this rank writes of a sharded checkpoint (ckpt.h's dt_ckpt_piece, names as state
     * gives them): the pieces it owns and holds now, without gathering anything; the pieces of
     * all ranks tile every tensor state gives once. *out malloc'd (caller frees; the data
     * pointers stay the strategy's, valid until close). NULL: the layout writes whole
     * checkpoints from rank 0 only (dp). */
    int (*pieces)(dt_strategy *s, dt_ckpt_piece **out, int *n, dt_err *err);
    /* The layout's own figures (dt_strategy_stats; NULL: it has none). */
    void (*stats)(dt_strategy *s, dt_strategy_stats *out);
    /* Replica k's backend, k < s->replicas (k = 0: s->be): for memory and utilisation
     * figures per replica. */
    dt_backend *(*replica_backend)(dt_strategy *s, int k);
    /* Frees what open built (s->impl included); the registry frees s itself. */
    void (*close)(dt_strategy *s);
} dt_strategy_ops;

/* A strategy: the public part every implementation fills, then its own state (impl). */
struct dt_strategy {
    const dt_strategy_ops *ops;
    dt_backend *be;     /* this rank's (master) backend; owned by the strategy */
    dt_model *model;    /* this rank's (master) model; owned by the strategy */
    dt_comm *comm;      /* the world communicator, or NULL with one rank; owned by the strategy.
                           The trainer borrows it for what is not a step: agreeing on the
                           checkpoint to resume, the barrier before leaving */
    dt_optim *optim;    /* the optimiser of what this rank updates; owned by the strategy */
    double comm_time_s; /* the last step's time synchronising gradients: DDP waiting in
                           sync_grads, DP its reduce to the master (in micro_step) */
    int replicas;       /* model replicas this process drives (DP: job.dp_replicas; else 1) */
    size_t whole_params; /* the whole model's parameters, as one process holds them and a
                            checkpoint saves them, where this rank holds part of it (tensor:
                            its slices; pipeline: its stage); 0: s->model->num_params, all */
    char summary[64];   /* for the run's summary line, "" or e.g. "DataParallel x 2" */
    dt_dpsync *sync;    /* the data-parallel sync of the layout (ctx.sync over its group and
                           its s->model), owned by the layout; s->optim is its. NULL: dp */
    void *impl;         /* the implementation's state */
};

/* What one rank's strategy holds, in bytes (dpsync.h's figures), for `dtrain bench memory` and
 * the tests: the sync's (s->sync), or a whole replica's (dp's master). */
typedef dt_dpsync_mem dt_strategy_mem;

void dt_strategy_get_mem(dt_strategy *s, dt_strategy_mem *out);

/* The layout's figures (the stats op): the tensor layout's, -EINVAL when s is another layout;
 * the pipeline layout's likewise. For `dtrain bench tensor` and `bench pipeline`, the tests. */
int dt_strategy_tensor_stats(dt_strategy *s, dt_tensor_stats *out);
int dt_strategy_pipeline_stats(dt_strategy *s, dt_pp_stats *out);

/* The reducer's figures of s's sync (ddp.h's dt_ddp_stats): -ENOTSUP for a sync without one
 * (none, ZeRO-3) or a strategy without a sync (dp), -EAGAIN before it exists. */
int dt_strategy_sync_stats(dt_strategy *s, dt_ddp_stats *out);

/* ---- helpers the implementations share (strategy.c) ---------------------------------------- */

/* job.cpu_bind = auto binds the calling thread, and the threads it starts afterwards (comm, DP
 * replicas, NCCL's), and says so in the log (common/cpuset.h):
 *   cpu backend, local_world > 1: to share local_rank of local_world of the CPUs it may use;
 *   cuda backend: to its share of the CPUs near its GPU (device local_rank), from sysfs.
 * Nothing otherwise, or when that cannot be had (fewer CPUs than workers, no NUMA information,
 * a cgroup without the GPU's node): left to the scheduler, logged at debug. */
void dt_strategy_bind_cpus(const dt_job *j, const dt_backend *be, int local_rank,
                           int local_world);

/* job.device as the kernels' device kind (config's enum mapped onto kernels/'s). */
dt_backend_kind dt_strategy_device(dt_device_kind device);

/* Opens ctx's backend (job.device, ctx->be_opts) into s->be and binds the CPUs (above).
 * -ENODEV when this node has not the device the job asks for (no GPU or driver, more workers
 * than GPUs, a build without the CUDA library): a configuration error of this node. */
int dt_strategy_open_backend(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err);

/* The comm backend for s->be from ddp.backend (auto: nccl on cuda, else cpu) into *backend, after
 * checking that the launcher gave the store's address; the fix otherwise (-ENODEV: nccl
 * without cuda; -EINVAL: no DTRAIN_STORE_ADDR/PORT). */
int dt_strategy_comm_backend(const dt_strategy *s, const dt_strategy_ctx *ctx,
                             dt_comm_kind *backend, dt_err *err);

/* The world communicator of ctx->env's ranks over backend (cpu, nccl), bootstrapped
 * through the dtrain store (DTRAIN_STORE_ADDR/PORT), namespaced by the run id and the
 * rendezvous round, with job.comm_timeout. */
int dt_strategy_world_comm(dt_comm **out, const dt_strategy_ctx *ctx, dt_comm_kind backend,
                           dt_err *err);

/* The three above in turn: s->be (bound to its CPUs) and s->comm over the backend ddp.backend
 * names. -errno and err from the first that failed (close frees what was made). */
int dt_strategy_open_world(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err);

/* The groups of ctx->grid split from world (dt_groups_open), bootstrapped through a store
 * connection of its own (DTRAIN_STORE_ADDR/PORT, closed before it returns). Collective over
 * world: every rank calls it at the same point. On failure nothing is left open. */
int dt_strategy_open_groups(dt_groups *out, dt_comm *world, const dt_strategy_ctx *ctx,
                            dt_err *err);

/* Builds s->optim over s->model's parameters on s->be from ctx->optim (dp's master). */
int dt_strategy_open_optim(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err);

/* ---- a layout over a data-parallel sync (every one but dp) ---------------------------------- */

/* Opens ctx->sync over dp (the layout's data-parallel group; NULL: none, for a sync that needs
 * none) and s->model into s->sync, and s->optim = its optimiser. Collective over dp. */
int dt_strategy_open_sync(dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *dp, dt_err *err);

/* micro_step of a whole model (data and tensor layouts): its forward and backward between the
 * sync's pass calls, the backward with the sync's grad-ready hook on the last micro-step, each
 * a span of the trace. */
int dt_strategy_sync_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                                float *loss, dt_err *err);

/* eval_step of a whole model: forward only, between the sync's pass calls. */
int dt_strategy_sync_eval(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                          dt_err *err);

/* zero_grads: the sync's. */
void dt_strategy_sync_zero_grads(dt_strategy *s);

/* The ops of a strategy whose rank holds the whole model, its whole gradient and the whole
 * optimiser state in s->model and s->optim, without a sync (DP's master). */

/* state: s->model's parameters, its buffers (BatchNorm statistics, copied at save), and each of
 * s->optim's states under the prefix the optimiser gives it. */
int dt_strategy_state_whole(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err);

/* pieces over s->sync (every layout but dp): of buffer k (0 the parameters, 1 + i optimiser
 * state i under its prefix) the runs dt_dpsync_owned gives, cut at tensor boundaries of
 * s->model's table; a replicated sync's split between its group's ranks (each run in `size`
 * parts, rank r writes part r: every replica holds the same); a tensor not split over the
 * tensor group (tp_parts 0) only on tensor rank 0; none of skip[0..nskip) (a tied copy another
 * stage writes); the model's buffers (BatchNorm statistics) where both ranks are 0. */
int dt_strategy_sync_pieces(const dt_strategy *s, int tp_rank, const int *skip, int nskip,
                            dt_ckpt_piece **out, int *n, dt_err *err);

/* The same table with whole-size buffers of the caller's (a sharding strategy's staging): params
 * (num_params floats) for the parameters, states[i] (NULL: the optimiser's own) for state i. */
int dt_strategy_state_bufs(const dt_strategy *s, float *params, float *const *states,
                           dt_ckpt_buf *bufs, int cap, int *n, dt_err *err);

/* eval_step: s->model's forward; *correct its last_correct. */
int dt_strategy_eval_whole(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                           dt_err *err);

/* Unscale, then clip s->model's gradients with s->optim (the whole gradient lives here). */
int dt_strategy_clip_whole(dt_strategy *s, double unscale, double *norm, dt_err *err);

/* s->optim's update of s->model's parameters. */
int dt_strategy_optim_step_whole(dt_strategy *s, double lr, dt_err *err);

/* Zeroes s->model's gradients on s->be. */
void dt_strategy_zero_grads_whole(dt_strategy *s);

/* replica_backend of one replica per process: s->be. */
dt_backend *dt_strategy_backend_one(dt_strategy *s, int k);

/* ---- a model split over ranks, and its whole tensors (tensor and pipeline strategies) ------- */

/* The checkpoint staging (staging.h) of such a layout: whole-model buffers laid out by a table
 * of whole tensors (the layout's), buf[0] the parameters and buf[1 + i] optimiser state i. */

/* state over a staging: bufs[0] the model's whole tensors (whole[0..nwhole), offsets into the
 * staging), bufs[1 + i] optimiser state i under the optimiser's prefix, same table. */
int dt_strategy_state_staged(const dt_strategy *s, const dt_tensor_info *whole, int nwhole,
                             const dt_staging *st, dt_ckpt_buf *bufs, int cap, int *n,
                             dt_err *err);

/* The whole tensors of a buffer laid out by s->model's table (local: num_params floats, backend
 * memory; this rank's slices where the model is split over the tensor group) into out (backend
 * memory) at out_off[i] floats for tensor i. With T > 1, collective over tp (the tensor group,
 * T ranks, this rank tp_rank): local is all-gathered and every split tensor assembled from its
 * T slices (dt_tensor_tp_copy), a replicated one taken from this rank's copy; on a backend whose
 * memory the host cannot address, through host copies. T = 1: a copy per tensor, no
 * communication. -errno and err when the all-gather (or memory for it) fails. */
int dt_strategy_tp_gather(dt_strategy *s, dt_comm *tp, int T, int tp_rank, const float *local,
                          float *out, const size_t *out_off, dt_err *err);

/* The reverse, local: each tensor i of s->model's table, this rank's slice of the whole tensor
 * at whole + whole_off[i], into local (num_params floats, backend memory). -ENOMEM only. */
int dt_strategy_tp_slice(dt_strategy *s, int tp_rank, const float *whole,
                         const size_t *whole_off, float *local, dt_err *err);

/* The counted tensors of a gradient split over the tensor group, for dpsync.h's clip: counted[t]
 * (m's table, num_tensors entries, malloc'd: the caller frees) = tensor t is this rank's alone to
 * count: split over the group (tp_parts > 0) on every rank, replicated ones on tensor rank 0 only
 * (the model all-reduces their gradients over the group: every rank holds the same), none of
 * skip[0..nskip) (a tied copy another stage counts). NULL when out of memory. */
unsigned char *dt_strategy_counted(const dt_model *m, int tp_rank, const int *skip, int nskip);

#endif
