/* dpsync_ddp.c - DDP over ddp.h's reducer; see dpsync_ddp.h.
 *
 * A replica holds what a rank without replicas holds (dpsync_none.c: the whole optimiser over
 * the whole local model, whose ops it borrows) plus the reducer, created at start: it checks
 * the model across the group, broadcasts group rank 0's parameters and buffers (after a load,
 * what rank 0 loaded) and builds the buckets. The backward of the step's final micro-step hands
 * each finished gradient range to it (no_sync for the others), so the buckets' all-reduces
 * overlap that backward; finish waits for them. A tensor another group sums too (the pipeline's
 * tied embedding) is summed after the average, on the averaged gradient every replica holds:
 * nothing is held back. */
#include "runtime/train/parallel/dpsync/dpsync_ddp.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/util.h"
#include "runtime/train/parallel/dpsync/dpsync_none.h"
#include "runtime/train/parallel/dpsync/lowbit.h"

typedef struct ddp_impl {
    dt_ddp_opts o; /* ctx.ddp, copied: the reducer is built at start */
    dt_ddp *ddp;   /* the reducer, owned; NULL before start */
} ddp_impl;

static const dt_dpsync_ops *const whole = &dt_dpsync_none_ops;

static int ddp_open(dt_dpsync *y, const dt_dpsync_ctx *ctx, dt_err *err)
{
    ddp_impl *d = calloc(1, sizeof *d);
    if (!d)
        return dt_err_set(err, -ENOMEM, "out of memory");
    y->impl = d;
    d->o = *ctx->ddp;
    d->o.shard = d->o.release = false;
    snprintf(y->label, sizeof y->label, "DDP");
    return whole->open(y, ctx, err);
}

static int ddp_start(dt_dpsync *y, dt_err *err)
{
    ddp_impl *d = y->impl;
    return dt_ddp_create(&d->ddp, y->model, y->dp, &d->o, err);
}

/* ddp.compress = 1bit: float32 for the first compress_warmup_steps updates. The optimiser's
 * update count is the step's index (a resume restores it), so a resumed job switches at the
 * same step as one that ran through. */
static void ddp_backward_begin(dt_dpsync *y, bool last)
{
    ddp_impl *d = y->impl;
    if (last && d->ddp)
        dt_ddp_set_lowbit(d->ddp,
                          d->o.lowbit != DT_LOWBIT_1BIT || y->optim->t >= d->o.lowbit_warmup,
                          y->optim->t);
}

static void ddp_grad_ready(dt_dpsync *y, size_t offset, size_t numel)
{
    dt_ddp_grad_ready(((ddp_impl *)y->impl)->ddp, offset, numel);
}

static int ddp_finish(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                      dt_err *err)
{
    ddp_impl *d = y->impl;
    double t0 = dt_now_s();
    int rc = dt_ddp_finish(d->ddp, err);
    *wait_s = dt_now_s() - t0;
    if (!rc && sum)
        rc = sum(ctx, err);
    return rc;
}

static int ddp_average(dt_dpsync *y, double *v, int n, dt_err *err)
{
    return dt_ddp_average(((ddp_impl *)y->impl)->ddp, v, n, err);
}

static int ddp_stats(dt_dpsync *y, dt_ddp_stats *out)
{
    ddp_impl *d = y->impl;
    if (!d || !d->ddp)
        return -EAGAIN;
    dt_ddp_get_stats(d->ddp, out);
    return 0;
}

/* The reducer first (it gives the model its own gradient buffer back), then the optimiser. */
static void ddp_close(dt_dpsync *y)
{
    ddp_impl *d = y->impl;
    if (d)
        dt_ddp_free(d->ddp);
    free(d);
    whole->close(y);
}

const dt_dpsync_ops dt_dpsync_ddp_ops = {
    .name = "ddp",
    .needs_group = true,
    .replicated = true,
    .open = ddp_open,
    .start = ddp_start,
    .zero_grads = dt_dpsync_none_zero_grads,
    .backward_begin = ddp_backward_begin,
    .grad_ready = ddp_grad_ready,
    .finish = ddp_finish,
    .average = ddp_average,
    .scale = dt_dpsync_none_scale,
    .sumsq = dt_dpsync_none_sumsq,
    .step = dt_dpsync_none_step,
    .local = dt_dpsync_none_local,
    .owned = dt_dpsync_none_owned,
    .mem = dt_dpsync_none_mem,
    .stats = ddp_stats,
    .close = ddp_close,
};
