/* strategy_ddp.c - DistributedDataParallel over ddp.c's reducer; see ddp.h.
 *
 * open builds the world communicator before the model (SyncBatchNorm borrows it); start, once
 * the trainer has resumed rank 0's checkpoint (or not), creates the reducer, which checks the
 * model across ranks and broadcasts rank 0's parameters and buffers. The reducer's grad-ready
 * hook goes to the backward of the last micro-step only (no_sync for the others), so the
 * buckets' all-reduces overlap that backward; sync_grads waits for them. */
#include "runtime/train/parallel/strategy_ddp.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "runtime/train/parallel/ddp.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

typedef struct ddp_impl {
    dt_ddp *ddp;           /* the reducer, owned; NULL before start */
    const dt_job *job;     /* borrowed */
} ddp_impl;

static int ddp_rank_batch(const dt_job *job) { return job->batch_size; }

static int ddp_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    ddp_impl *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = d;
    d->job = ctx->job;
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (rc)
        return rc;
    const char *backend;
    if ((rc = dt_strategy_comm_backend(s, ctx, &backend, err)))
        return rc;
    /* communication before the model: SyncBatchNorm borrows the communicator */
    if ((rc = dt_strategy_world_comm(&s->comm, ctx, backend, err)))
        return dt_err_prefix(err, "DDP: ");
    if ((rc = dt_model_create(&s->model, ctx->model, s->be, s->comm, err)))
        return rc;
    return dt_strategy_open_optim(s, ctx, err);
}

static int ddp_start(dt_strategy *s, dt_err *err)
{
    ddp_impl *d = s->impl;
    dt_ddp_opts o;
    int rc = dt_ddp_opts_from_job(&o, d->job, err);
    return rc ? rc : dt_ddp_create(&d->ddp, s->model, s->comm, &o, err);
}

static int ddp_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                          float *loss, dt_err *err)
{
    ddp_impl *d = s->impl;
    dt_model *m = s->model;
    uint64_t ts = dt_trace_begin();
    int rc = m->ops->forward(m, batch, true, loss, err);
    dt_trace_end(ts, DT_TRACE_FORWARD, "forward");
    if (rc)
        return rc;
    /* the reducer hears of finished gradients on the last micro-step only (no_sync before) */
    dt_flight_phase(DT_PHASE_BACKWARD);
    ts = dt_trace_begin();
    rc = m->ops->backward(m, dloss, last ? dt_ddp_grad_ready : NULL, last ? d->ddp : NULL, err);
    dt_trace_end(ts, DT_TRACE_BACKWARD, "backward");
    return rc;
}

static int ddp_sync_grads(dt_strategy *s, dt_err *err)
{
    ddp_impl *d = s->impl;
    double t0 = dt_now_s();
    int rc = dt_ddp_finish(d->ddp, err);
    s->comm_time_s = dt_now_s() - t0;
    return rc;
}

static int ddp_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    ddp_impl *d = s->impl;
    return dt_ddp_average(d->ddp, v, n, err);
}

/* The reducer first (it gives the model its own gradient buffer back), then the communicator,
 * then what it served. */
static void ddp_close(dt_strategy *s)
{
    ddp_impl *d = s->impl;
    if (d)
        dt_ddp_free(d->ddp);
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_optim_free(s->optim);
    dt_model_free(s->model);
    dt_backend_close(s->be);
    free(d);
}

const dt_strategy_ops dt_strategy_ddp_ops = {
    .name = "ddp",
    .rank_batch = ddp_rank_batch,
    .open = ddp_open,
    .start = ddp_start,
    .zero_grads = dt_strategy_zero_grads_whole,
    .micro_step = ddp_micro_step,
    .sync_grads = ddp_sync_grads,
    .average = ddp_average,
    .clip = dt_strategy_clip_whole,
    .optim_step = dt_strategy_optim_step_whole,
    .eval_step = dt_strategy_eval_whole,
    .state = dt_strategy_state_whole,
    .replica_backend = dt_strategy_backend_one,
    .close = ddp_close,
};
