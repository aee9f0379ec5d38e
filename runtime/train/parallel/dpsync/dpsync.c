/* dpsync.c - the data-parallel sync's calls (each an op of the flavour, with the defaults of the
 * optional ones), the clip over what a rank owns, and what the replicated flavours share; see
 * dpsync.h. Nothing here knows a flavour: the registry (strategies.c) picks one. */
#include "runtime/train/parallel/dpsync/dpsync.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

int dt_dpsync_open(dt_dpsync **out, const dt_dpsync_ops *ops, const dt_dpsync_ctx *ctx,
                   dt_err *err)
{
    *out = NULL;
    if (ops->needs_group && !ctx->dp)
        return dt_err_set(err, -EINVAL, "data-parallel sync %s: no data-parallel group given",
                          ops->name);
    dt_dpsync *y = calloc(1, sizeof *y);
    if (!y)
        return dt_err_set(err, -ENOMEM, "out of memory");
    y->ops = ops;
    y->model = ctx->model;
    y->be = ctx->model->be;
    y->dp = ctx->dp;
    y->rank = ctx->dp ? dt_comm_rank(ctx->dp) : 0;
    y->size = ctx->dp ? dt_comm_world_size(ctx->dp) : 1;
    int rc = ops->open(y, ctx, err);
    if (rc) {
        dt_dpsync_close(y);
        return rc;
    }
    *out = y;
    return 0;
}

void dt_dpsync_close(dt_dpsync *y)
{
    if (!y)
        return;
    y->ops->close(y);
    free(y);
}

int dt_dpsync_start(dt_dpsync *y, dt_err *err) { return y->ops->start(y, err); }

void dt_dpsync_zero_grads(dt_dpsync *y) { y->ops->zero_grads(y); }

void dt_dpsync_forward_begin(dt_dpsync *y, bool training)
{
    if (y->ops->forward_begin)
        y->ops->forward_begin(y, training);
}

int dt_dpsync_forward_end(dt_dpsync *y, int rc, dt_err *err)
{
    return y->ops->forward_end ? y->ops->forward_end(y, rc, err) : rc;
}

void dt_dpsync_backward_begin(dt_dpsync *y, bool last, dt_grad_ready_fn *fn, void **ctx)
{
    if (y->ops->backward_begin)
        y->ops->backward_begin(y, last);
    bool hook = last && y->ops->grad_ready;
    *fn = hook ? dt_dpsync_grad_ready : NULL;
    *ctx = hook ? y : NULL;
}

int dt_dpsync_backward_end(dt_dpsync *y, int rc, dt_err *err)
{
    return y->ops->backward_end ? y->ops->backward_end(y, rc, err) : rc;
}

void dt_dpsync_drop(dt_dpsync *y)
{
    if (y->ops->drop)
        y->ops->drop(y);
}

void dt_dpsync_grad_ready(void *ctx, size_t offset, size_t numel)
{
    dt_dpsync *y = ctx;
    y->ops->grad_ready(y, offset, numel);
}

int dt_dpsync_hold(dt_dpsync *y, int tensor, dt_err *err)
{
    if (tensor < 0 || tensor >= y->model->num_tensors)
        return dt_err_set(err, -EINVAL, "data-parallel sync: tensor %d is not in the model",
                          tensor);
    return y->ops->hold ? y->ops->hold(y, tensor, err) : 0;
}

int dt_dpsync_finish(dt_dpsync *y, dt_dpsync_sum_fn sum, void *ctx, double *wait_s,
                     dt_err *err)
{
    *wait_s = 0;
    return y->ops->finish(y, sum, ctx, wait_s, err);
}

int dt_dpsync_average(dt_dpsync *y, double *v, int n, dt_err *err)
{
    return y->ops->average(y, v, n, err);
}

int dt_dpsync_clip(dt_dpsync *y, double unscale, const unsigned char *counted,
                   dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                   dt_err *err)
{
    dt_backend *be = y->be;
    if (unscale != 1.0)
        y->ops->scale(y, (float)unscale);
    double sum = 0;
    int rc = y->ops->sumsq(y, counted, &sum, err);
    if (!rc && ngroups > 0)
        be->memcpy_h2d(be, scratch, &sum, sizeof sum);
    for (int g = 0; g < ngroups && !rc; g++)
        if (groups[g])
            rc = dt_comm_allreduce(groups[g], scratch, 1, DT_FLOAT64, DT_SUM, NULL, err);
    if (rc)
        return dt_err_prefix(err, "%s%sthe global gradient norm: ", y->label,
                             y->label[0] ? ": " : "");
    if (ngroups > 0)
        be->memcpy_d2h(be, &sum, scratch, sizeof sum);
    *norm = sqrt(sum);
    double clip = y->optim->cfg.grad_clip;
    if (clip > 0 && isfinite(*norm) && *norm > clip)
        y->ops->scale(y, (float)(clip / (*norm + 1e-6)));
    return 0;
}

int dt_dpsync_step(dt_dpsync *y, double lr, dt_err *err) { return y->ops->step(y, lr, err); }

float *dt_dpsync_local(dt_dpsync *y, int k) { return y->ops->local(y, k); }

int dt_dpsync_gather_state(dt_dpsync *y, dt_err *err)
{
    return y->ops->gather_state ? y->ops->gather_state(y, err) : 0;
}

int dt_dpsync_owned(dt_dpsync *y, int k, dt_dpsync_piece *out, int cap, int *n)
{
    *n = 0;
    if (k < 0 || k > y->optim->num_states)
        return -EINVAL;
    return y->ops->owned(y, k, out, cap, n);
}

void dt_dpsync_get_mem(dt_dpsync *y, dt_dpsync_mem *out)
{
    memset(out, 0, sizeof *out);
    y->ops->mem(y, out);
}

int dt_dpsync_stats(dt_dpsync *y, dt_ddp_stats *out)
{
    return y->ops->stats ? y->ops->stats(y, out) : -ENOTSUP;
}

/* ---- what the flavours share ------------------------------------------------------------- */

void dt_dpsync_mem_whole(const dt_model *m, const dt_optim *o, dt_dpsync_mem *out)
{
    memset(out, 0, sizeof *out);
    out->params = out->params_peak = m->num_params * sizeof(float);
    out->grads = out->grads_peak = m->num_params * sizeof(float);
    out->optim = (size_t)o->num_states * o->state_numel * sizeof(float);
}

double dt_dpsync_sumsq_whole(const dt_model *m, const unsigned char *counted)
{
    dt_backend *be = m->be;
    if (!counted)
        return be->sumsq(be, m->grads, m->num_params);
    double sum = 0;
    size_t from = 0, to = 0; /* the run of neighbouring counted tensors: one sumsq each */
    for (int t = 0; t < m->num_tensors; t++) {
        const dt_tensor_info *ti = &m->tensors[t];
        if (!counted[t])
            continue;
        if (to > from && ti->offset == to) {
            to += ti->numel;
            continue;
        }
        if (to > from)
            sum += be->sumsq(be, m->grads + from, to - from);
        from = ti->offset;
        to = from + ti->numel;
    }
    if (to > from)
        sum += be->sumsq(be, m->grads + from, to - from);
    return sum;
}
