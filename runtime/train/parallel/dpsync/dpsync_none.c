/* dpsync_none.c - the sync of a rank that has no data-parallel replicas (one process, or a
 * tensor or pipeline layout with D = 1): the optimiser over the whole local model, gradients
 * final as backward leaves them, nothing communicated. */
#include "runtime/train/parallel/dpsync/dpsync_none.h"

#include <errno.h>

static int none_open(dt_dpsync *y, const dt_dpsync_ctx *ctx, dt_err *err)
{
    const dt_model *m = y->model;
    return dt_optim_create(&y->optim, ctx->optim, y->be, m->tensors, m->num_tensors,
                           m->num_params, err);
}

static int none_start(dt_dpsync *y, dt_err *err)
{
    (void)y, (void)err;
    return 0;
}

void dt_dpsync_none_zero_grads(dt_dpsync *y)
{
    y->be->memset_zero(y->be, y->model->grads, sizeof(float) * y->model->num_params);
}

static int none_finish(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                       dt_err *err)
{
    (void)y, (void)wait_s;
    return sum ? sum(ctx, err) : 0;
}

static int none_average(dt_dpsync *y, double *v, int n, dt_err *err)
{
    (void)y, (void)v, (void)n, (void)err;
    return 0;
}

void dt_dpsync_none_scale(dt_dpsync *y, float f)
{
    y->be->scale(y->be, y->model->grads, y->model->num_params, f);
}

int dt_dpsync_none_sumsq(dt_dpsync *y, const unsigned char *counted, double *sum, dt_err *err)
{
    (void)err;
    *sum = dt_dpsync_sumsq_whole(y->model, counted);
    return 0;
}

int dt_dpsync_none_step(dt_dpsync *y, double lr, dt_err *err)
{
    (void)err;
    dt_optim_step(y->optim, y->model->params, y->model->grads, lr);
    return 0;
}

float *dt_dpsync_none_local(dt_dpsync *y, int k)
{
    return k == 0 ? y->model->params : y->optim->states[k - 1].buf;
}

int dt_dpsync_none_owned(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n)
{
    *n = 1;
    if (cap < 1)
        return -ENOSPC;
    out[0] = (dt_dpsync_piece){0, y->model->num_params, dt_dpsync_none_local(y, k)};
    return 0;
}

void dt_dpsync_none_mem(dt_dpsync *y, dt_dpsync_mem *out)
{
    dt_dpsync_mem_whole(y->model, y->optim, out);
}

static void none_close(dt_dpsync *y) { dt_optim_free(y->optim); }

const dt_dpsync_ops dt_dpsync_none_ops = {
    .name = "none",
    .replicated = true,
    .open = none_open,
    .start = none_start,
    .zero_grads = dt_dpsync_none_zero_grads,
    .finish = none_finish,
    .average = none_average,
    .scale = dt_dpsync_none_scale,
    .sumsq = dt_dpsync_none_sumsq,
    .step = dt_dpsync_none_step,
    .local = dt_dpsync_none_local,
    .owned = dt_dpsync_none_owned,
    .mem = dt_dpsync_none_mem,
    .close = none_close,
};
