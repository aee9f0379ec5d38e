/* strategy_data.c - the data-parallel layout: every rank holds the whole model, and the world is
 * its data-parallel group; what keeps the replicas in step is the sync the registry chose
 * (ctx->sync: none with one rank, DDP, ZeRO-1/2/3), which this file never names. One process
 * (none) is the reference every other layout is tested against.
 *
 * open builds the backend, the world communicator (before the model: SyncBatchNorm borrows it;
 * none with one rank has no communicator), the model and the sync over the world, which builds
 * the optimiser over what the rank owns (ZeRO: its shard; the reducer of ZeRO-1/2 checks the
 * model across the ranks and fixes the shards there). start, once the trainer has resumed rank
 * 0's checkpoint (or not), is the sync's: DDP creates its reducer (the model checked, rank 0's
 * parameters and buffers broadcast, the buckets built), ZeRO takes rank 0's parameters and its
 * share of the state. A step is the sync's too: zero_grads, forward and backward with its hook
 * on the last micro-step (no_sync before), finish, the norm over what each rank owns, its
 * update. The checkpoint holds the sync's local buffers (dpsync.h: whole tensors in the model's
 * layout, gathered first where the sync shards them) and the model's buffers. */
#include "runtime/train/parallel/strategy_data.h"

#include <stdio.h>

#include "common/log.h"

static int data_rank_batch(const dt_job *job) { return job->batch_size; }

static int data_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (rc)
        return rc;
    if (ctx->env->world_size > 1 || ctx->sync->needs_group) {
        dt_comm_kind backend;
        if ((rc = dt_strategy_comm_backend(s, ctx, &backend, err)))
            return rc;
        /* communication before the model: SyncBatchNorm borrows the communicator */
        if ((rc = dt_strategy_world_comm(&s->comm, ctx, backend, err)))
            return dt_err_prefix(err, "data parallelism: ");
    }
    if ((rc = dt_model_create(&s->model, ctx->model, s->be, s->comm, err)) ||
        (rc = dt_strategy_open_sync(s, ctx, s->comm, err)))
        return rc;
    if (s->sync->sharded)
        snprintf(s->summary, sizeof s->summary, "%s over %d ranks", s->sync->label,
                 s->sync->size);
    return 0;
}

static int data_start(dt_strategy *s, dt_err *err) { return dt_dpsync_start(s->sync, err); }

static int data_sync_grads(dt_strategy *s, dt_err *err)
{
    return dt_dpsync_finish(s->sync, NULL, NULL, &s->comm_time_s, err);
}

static int data_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    return dt_dpsync_average(s->sync, v, n, err);
}

/* The global norm over what each rank owns (the whole gradient, or its shard summed over the
 * ranks), then clip_grad_norm_'s scaling. */
static int data_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    return dt_dpsync_clip(s->sync, unscale, NULL, NULL, 0, NULL, norm, err);
}

static int data_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    return dt_dpsync_step(s->sync, lr, err);
}

/* The model's parameters and the optimiser's state as the sync's local buffers hold them (after
 * gather_state where it shards them), and the model's buffers. */
static int data_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    float *states[DT_OPTIM_MAX_STATES] = {0};
    for (int i = 0; i < s->optim->num_states; i++)
        states[i] = dt_dpsync_local(s->sync, 1 + i);
    return dt_strategy_state_bufs(s, dt_dpsync_local(s->sync, 0), states, bufs, cap, n, err);
}

static int data_pieces(dt_strategy *s, dt_ckpt_piece **out, int *n, dt_err *err)
{
    return dt_strategy_sync_pieces(s, 0, NULL, 0, out, n, err);
}

static int data_gather_state(dt_strategy *s, dt_err *err)
{
    return dt_dpsync_gather_state(s->sync, err);
}

/* The sync first (DDP's reducer gives the model its own gradient buffer back; the optimiser is
 * the sync's), then the communicator, then what they served. */
static void data_close(dt_strategy *s)
{
    dt_dpsync_close(s->sync);
    s->sync = NULL;
    s->optim = NULL;
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_model_free(s->model);
    dt_backend_close(s->be);
}

#define DATA_OPS(label)                                                                         \
    {                                                                                           \
        .name = label, .rank_batch = data_rank_batch, .open = data_open, .start = data_start,   \
        .zero_grads = dt_strategy_sync_zero_grads, .micro_step = dt_strategy_sync_micro_step,   \
        .sync_grads = data_sync_grads, .average = data_average, .clip = data_clip,              \
        .optim_step = data_optim_step, .eval_step = dt_strategy_sync_eval,                      \
        .state = data_state, .gather_state = data_gather_state, .pieces = data_pieces,          \
        .replica_backend = dt_strategy_backend_one, .close = data_close,                        \
    }

const dt_strategy_ops dt_strategy_single_ops = DATA_OPS("single");
const dt_strategy_ops dt_strategy_ddp_ops = DATA_OPS("ddp");
const dt_strategy_ops dt_strategy_zero_ops = DATA_OPS("zero");
