/* strategy_dp.c - DataParallel over dp.c; see dp.h.
 *
 * One process takes the batch of all its replicas (train.batch_size is per replica, so the
 * rank's batch is batch_size x job.dp_replicas: a value derived here, the job is not changed),
 * scatters it, and runs forward and backward on every replica; the gradients arrive summed on
 * the master (replica 0) within micro_step, so sync_grads has nothing left to wait for and
 * reports the reduce's time instead. The master's model and backend are the strategy's
 * s->model and s->be: the optimiser and checkpoints see only them. */
#include "runtime/train/parallel/strategy_dp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "runtime/train/parallel/dp.h"

typedef struct dp_impl {
    dt_dp *dp;         /* the replicas, owned */
    double reduce_s;   /* dt_dp_stats.reduce_s at the last sync_grads */
} dp_impl;

static int dp_rank_batch(const dt_job *job) { return job->batch_size * job->dp_replicas; }

static int dp_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    const dt_job *j = ctx->job;
    if (ctx->env->world_size > 1)
        return dt_err_set(err, -EINVAL,
                          "job.strategy = dp: one process drives all %d replicas "
                          "(job.dp_replicas), but %d workers were started; run one worker "
                          "(--nproc-per-node=1 on one node), or use job.strategy = ddp",
                          j->dp_replicas, ctx->env->world_size);
    dp_impl *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = d;
    /* K replicas, each with a backend of its own; the master's are the strategy's. */
    if (ctx->model->sync_bn && ctx->env->rank == 0)
        DT_WARN("model.sync_bn has no effect with job.strategy = dp (each replica normalises "
                "its own chunk, as in torch DataParallel)");
    dt_dp_opts o;
    dt_dp_opts_from_job(&o, j, ctx->be_opts);
    int rc = dt_dp_create(&d->dp, ctx->model, &o, err);
    if (rc)
        return rc;
    s->be = dt_dp_backend(d->dp, 0);
    s->model = dt_dp_master(d->dp);
    s->replicas = dt_dp_replicas(d->dp);
    snprintf(s->summary, sizeof s->summary, "DataParallel x %d", s->replicas);
    return dt_strategy_open_optim(s, ctx, err);
}

static int dp_start(dt_strategy *s, dt_err *err)
{
    (void)s;
    (void)err;
    return 0; /* every forward replicates the master's parameters first */
}

static int dp_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                         float *loss, dt_err *err)
{
    (void)last;
    dp_impl *d = s->impl;
    /* replicate, scatter, forward and backward on every replica, reduce to the master */
    return dt_dp_forward_backward(d->dp, batch, dloss, loss, err);
}

static int dp_sync_grads(dt_strategy *s, dt_err *err)
{
    (void)err;
    dp_impl *d = s->impl;
    dt_dp_stats st;
    dt_dp_get_stats(d->dp, &st);
    s->comm_time_s = st.reduce_s - d->reduce_s; /* this step's reduces, done in micro_step */
    d->reduce_s = st.reduce_s;
    return 0;
}

static int dp_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    (void)s, (void)v, (void)n, (void)err;
    return 0; /* one process: its loss is the whole batch's */
}

static int dp_eval_step(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                        dt_err *err)
{
    dp_impl *d = s->impl;
    return dt_dp_forward_eval(d->dp, batch, loss, correct, err);
}

static dt_backend *dp_replica_backend(dt_strategy *s, int k)
{
    dp_impl *d = s->impl;
    return dt_dp_backend(d->dp, k);
}

/* The optimiser first (on the master's backend), then the replicas with their backends. */
static void dp_close(dt_strategy *s)
{
    dp_impl *d = s->impl;
    dt_optim_free(s->optim);
    if (d)
        dt_dp_free(d->dp);
    free(d);
}

const dt_strategy_ops dt_strategy_dp_ops = {
    .name = "dp",
    .rank_batch = dp_rank_batch,
    .open = dp_open,
    .start = dp_start,
    .zero_grads = dt_strategy_zero_grads_whole,
    .micro_step = dp_micro_step,
    .sync_grads = dp_sync_grads,
    .average = dp_average,
    .clip = dt_strategy_clip_whole,
    .optim_step = dt_strategy_optim_step_whole,
    .eval_step = dp_eval_step,
    .state = dt_strategy_state_whole,
    .replica_backend = dp_replica_backend,
    .close = dp_close,
};
