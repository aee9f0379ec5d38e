/* strategy_single.c - one process trains one replica: forward and backward on this rank's
 * backend, nothing to synchronise, nothing to average. It is the reference every other
 * strategy is tested against. */
#include "runtime/train/parallel/strategy_single.h"

#include "runtime/train/models/model.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

static int single_rank_batch(const dt_job *job) { return job->batch_size; }

static int single_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (!rc)
        rc = dt_model_create(&s->model, ctx->model, s->be, NULL, err);
    if (!rc)
        rc = dt_strategy_open_optim(s, ctx, err);
    return rc;
}

static int single_start(dt_strategy *s, dt_err *err)
{
    (void)s;
    (void)err;
    return 0;
}

static int single_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                             float *loss, dt_err *err)
{
    (void)last;
    dt_model *m = s->model;
    uint64_t ts = dt_trace_begin();
    int rc = m->ops->forward(m, batch, true, loss, err);
    dt_trace_end(ts, DT_TRACE_FORWARD, "forward");
    if (rc)
        return rc;
    dt_flight_phase(DT_PHASE_BACKWARD);
    ts = dt_trace_begin();
    rc = m->ops->backward(m, dloss, NULL, NULL, err);
    dt_trace_end(ts, DT_TRACE_BACKWARD, "backward");
    return rc;
}

static int single_sync_grads(dt_strategy *s, dt_err *err)
{
    (void)err;
    s->comm_time_s = 0;
    return 0;
}

static int single_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    (void)s, (void)v, (void)n, (void)err;
    return 0;
}

static void single_close(dt_strategy *s)
{
    dt_optim_free(s->optim);
    dt_model_free(s->model);
    dt_backend_close(s->be);
}

const dt_strategy_ops dt_strategy_single_ops = {
    .name = "single",
    .rank_batch = single_rank_batch,
    .open = single_open,
    .start = single_start,
    .zero_grads = dt_strategy_zero_grads_whole,
    .micro_step = single_micro_step,
    .sync_grads = single_sync_grads,
    .average = single_average,
    .clip = dt_strategy_clip_whole,
    .optim_step = dt_strategy_optim_step_whole,
    .eval_step = dt_strategy_eval_whole,
    .state = dt_strategy_state_whole,
    .replica_backend = dt_strategy_backend_one,
    .close = single_close,
};
