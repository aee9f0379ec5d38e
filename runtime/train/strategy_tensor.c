/* strategy_tensor.c - tensor parallelism (Megatron-LM's column/row splits, in the gpt model) with
 * DDP over the data-parallel groups; see strategy_tensor.h.
 *
 * The model does the tensor-parallel work (its forward and backward all-reduce over the tensor
 * group); what is left here is what spans the step: the groups, the data-parallel reducer, the
 * norm over slices, and checkpoints of whole tensors.
 *
 * Checkpoint staging. state hands out full-size buffers laid out by a "whole" tensor table (the
 * model's table with whole_shape, packed in the same order), one for the parameters and one per
 * optimiser state. gather_state fills them: one all-gather over the tensor group per buffer (T x
 * the local buffer), then each tensor assembled from the T slices with dt_tensor_tp_copy
 * (replicated tensors: this rank's copy). open gathers the initial parameters there too, so that
 * start, which always slices the staging back into the local buffers, leaves an un-resumed model
 * as it was built and a resumed one as the checkpoint holds it. The staging is backend memory
 * charged as "other" (checkpoint staging); on the cpu its pages go back to the system (mem_release)
 * once start sliced it and after each save (at the next optim_step, when the trainer has fenced
 * the save's copy), so between checkpoints a rank holds its slices only. While a save gathers, a
 * rank holds the staging (whole model x (1 + optimiser states)) and T x its local buffer of
 * gathered slices; on the cpu the tensors are assembled in place, on a device through host
 * copies (checkpoints only: no step pays for them).
 *
 * Numerics against one process (T = 1) on the same global batch: the model's all-reduces sum
 * partial products in another order than one GEMM does, and the norm adds its squares in another
 * order, so losses and weights agree to float rounding (tests/test_tensor.c: 1e-5 relative over
 * 20 steps), not bit for bit.
 */
#include "runtime/train/strategy_tensor.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/ddp.h"

#define NSTAGE (1 + DT_OPTIM_MAX_STATES) /* parameters, then each optimiser state */

typedef struct tp_impl {
    const dt_job *job;         /* borrowed */
    dt_grid grid;              /* this rank's coordinates */
    dt_groups groups;          /* split from s->comm (owned) when opened; else zeroed */
    bool groups_open;
    dt_comm *tp;               /* the tensor group: groups.tp, or s->comm when D = 1 (borrowed) */
    dt_comm *dp;               /* the data-parallel group (groups.dp) or NULL when D = 1 */
    dt_ddp *ddp;               /* the reducer over dp (D > 1), owned; NULL before start */
    double *scratch;           /* (32) backend memory for the scalar collectives, owned */
    /* checkpoint staging */
    dt_tensor_info *whole;     /* (num_tensors) host, owned: shapes whole, packed offsets */
    size_t whole_numel;
    float *stage[NSTAGE];      /* (whole_numel) backend memory, owned: params, states... */
    int nstage;                /* 1 + the optimiser's states */
    bool staged;               /* stage[] hold data that is resident: release when done */
    /* figures */
    size_t split_local, replicated, split_whole;
    double dp_wait_s;
    uint64_t clips;
} tp_impl;

static int tp_rank_batch(const dt_job *job) { return job->batch_size; }

/* ---- checkpoint staging ------------------------------------------------------------------- */

/* The whole table: the model's tensors in buffer order, with their whole shapes, packed. */
static int build_whole(const dt_model *m, tp_impl *t, dt_err *err)
{
    t->whole = calloc((size_t)m->num_tensors, sizeof *t->whole);
    if (!t->whole)
        return dt_err_set(err, -ENOMEM, "out of memory");
    size_t off = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *l = &m->tensors[i];
        dt_tensor_info *w = &t->whole[i];
        *w = *l;
        size_t n = dt_tensor_whole_numel(l);
        if (l->tp_parts > 0) {
            memcpy(w->shape, l->whole_shape, sizeof w->shape);
            t->split_local += l->numel;
            t->split_whole += n;
        } else {
            t->replicated += l->numel;
        }
        w->numel = n;
        w->offset = off;
        w->tp_parts = 0;
        w->tp_dim = 0;
        memcpy(w->whole_shape, w->shape, sizeof w->whole_shape);
        off += n;
    }
    t->whole_numel = off;
    return 0;
}

static int alloc_staging(dt_strategy *s, tp_impl *t, dt_err *err)
{
    size_t bytes = t->whole_numel * sizeof(float);
    dt_mem_cat old = dt_mem_tag(s->be, DT_MEM_OTHER); /* checkpoint staging */
    int rc = 0;
    t->nstage = 1 + s->optim->num_states;
    for (int k = 0; k < t->nstage && !rc; k++) {
        rc = s->be->alloc(s->be, (void **)&t->stage[k], bytes ? bytes : sizeof(float), err);
        if (!rc)
            s->be->memset_zero(s->be, t->stage[k], bytes); /* nothing loaded: zero state */
    }
    dt_mem_tag(s->be, old);
    if (rc)
        return dt_err_prefix(err, "tensor parallelism: checkpoint staging (%zu bytes x %d): ",
                             bytes, t->nstage);
    t->staged = true;
    return 0;
}

/* The staging's pages go back to the system (cpu; a no-op that keeps the count elsewhere). */
static void release_staging(dt_strategy *s, tp_impl *t)
{
    if (!t->staged || !s->be->mem_release)
        return;
    for (int k = 0; k < t->nstage; k++)
        s->be->mem_release(s->be, t->stage[k], 0, t->whole_numel * sizeof(float));
    t->staged = false;
}

static int commit_staging(dt_strategy *s, tp_impl *t, dt_err *err)
{
    if (t->staged || !s->be->mem_commit) {
        t->staged = true;
        return 0;
    }
    for (int k = 0; k < t->nstage; k++) {
        int rc = s->be->mem_commit(s->be, t->stage[k], 0, t->whole_numel * sizeof(float), err);
        if (rc)
            return rc;
    }
    t->staged = true;
    return 0;
}

/* The local buffer k (0: parameters, else optimiser state k-1). */
static float *local_buf(dt_strategy *s, int k)
{
    return k == 0 ? s->model->params : s->optim->states[k - 1].buf;
}

/* Backend memory the host can address (the cpu backend's): assembled in place, no copies. */
static bool host_memory(const dt_backend *be) { return !strcmp(be->name, "cpu"); }

/* stage[k] = the whole tensors of local buffer k, assembled from the tensor group's slices
 * gathered into gdev (T x num_params, backend memory); ghost and whost are host copies of gdev
 * and of the staging, or gdev and the staging themselves on host memory. Collective over the
 * tensor group. */
static int gather_one(dt_strategy *s, tp_impl *t, int k, float *gdev, float *ghost, float *whost,
                      dt_err *err)
{
    const dt_model *m = s->model;
    dt_backend *be = s->be;
    const int T = t->grid.T;
    size_t n = m->num_params;
    int rc = dt_comm_allgather(t->tp, local_buf(s, k), gdev, n, DT_FLOAT32, NULL, err);
    if (rc)
        return rc;
    bool host = host_memory(be);
    if (!host)
        be->memcpy_d2h(be, ghost, gdev, (size_t)T * n * sizeof(float)); /* (T, num_params) */
    else
        whost = t->stage[k];
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *l = &m->tensors[i];
        float *w = whost + t->whole[i].offset;
        if (l->tp_parts == 0) { /* replicated: this rank's copy (every rank holds the same) */
            memcpy(w, ghost + (size_t)t->grid.tp * n + l->offset, l->numel * sizeof(float));
            continue;
        }
        for (int r = 0; r < T; r++)
            dt_tensor_tp_copy(l, r, w, ghost + (size_t)r * n + l->offset, true);
    }
    if (!host)
        be->memcpy_h2d(be, t->stage[k], whost, t->whole_numel * sizeof(float));
    return 0;
}

/* Every staging buffer filled from the local ones (k < upto). Collective over the tensor group. */
static int gather_staging(dt_strategy *s, tp_impl *t, int upto, dt_err *err)
{
    dt_backend *be = s->be;
    const int T = t->grid.T;
    size_t n = s->model->num_params;
    bool host = host_memory(be);
    float *gdev = NULL, *ghost = NULL, *whost = NULL;
    int rc = commit_staging(s, t, err);
    if (!rc) {
        dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER);
        rc = be->alloc(be, (void **)&gdev, (size_t)T * n * sizeof(float) + sizeof(float), err);
        dt_mem_tag(be, old);
    }
    if (!rc && host) {
        ghost = gdev;
    } else if (!rc) {
        ghost = malloc((size_t)T * n * sizeof(float) + sizeof(float));
        whost = malloc(t->whole_numel * sizeof(float) + sizeof(float));
        if (!ghost || !whost)
            rc = dt_err_set(err, -ENOMEM, "out of memory (%zu floats of gathered slices)",
                            (size_t)T * n);
    }
    for (int k = 0; k < upto && !rc; k++)
        if ((rc = gather_one(s, t, k, gdev, ghost, whost, err)))
            dt_err_prefix(err, "tensor parallelism: gathering %s over the tensor group: ",
                          k ? s->optim->states[k - 1].name : "the parameters");
    be->free(be, gdev);
    if (!host) {
        free(ghost);
        free(whost);
    }
    return rc;
}

/* Every local buffer sliced from its staging (whole -> this rank's slices), through host copies
 * where the backend's memory is not the host's. Local. */
static int slice_staging(dt_strategy *s, tp_impl *t, dt_err *err)
{
    const dt_model *m = s->model;
    dt_backend *be = s->be;
    size_t n = m->num_params;
    bool host = host_memory(be);
    float *whost = NULL, *lhost = NULL;
    if (!host) {
        whost = malloc(t->whole_numel * sizeof(float) + sizeof(float));
        lhost = malloc(n * sizeof(float) + sizeof(float));
        if (!whost || !lhost) {
            free(whost);
            free(lhost);
            return dt_err_set(err, -ENOMEM, "out of memory");
        }
    }
    for (int k = 0; k < t->nstage; k++) {
        float *w = host ? t->stage[k] : whost, *l = host ? local_buf(s, k) : lhost;
        if (!host)
            be->memcpy_d2h(be, whost, t->stage[k], t->whole_numel * sizeof(float));
        for (int i = 0; i < m->num_tensors; i++)
            dt_tensor_tp_copy(&m->tensors[i], t->grid.tp, w + t->whole[i].offset,
                              l + m->tensors[i].offset, false);
        if (!host)
            be->memcpy_h2d(be, local_buf(s, k), lhost, n * sizeof(float));
    }
    free(whost);
    free(lhost);
    return 0;
}

/* ---- the ops --------------------------------------------------------------------------------*/

static int tp_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    const dt_job *j = ctx->job;
    const dt_worker_env *e = ctx->env;
    tp_impl *t = calloc(1, sizeof *t);
    if (!t)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = t;
    t->job = j;
    if (strcmp(ctx->model->type, "gpt") != 0)
        return dt_err_set(err, -EINVAL,
                          "parallel.tensor = %d splits gpt's attention, MLP and vocabulary; "
                          "model.type = %s has no tensor-parallel form: use model.type = gpt or "
                          "parallel.tensor = 1", j->tensor, ctx->model->type);
    if (j->pipeline > 1)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d: the tensor strategy runs one stage (the "
                          "pipeline strategy runs parallel.pipeline > 1)", j->pipeline);
    if (j->zero > 0)
        return dt_err_set(err, -EINVAL,
                          "parallel.zero = %d with parallel.tensor = %d: ZeRO over the "
                          "data-parallel groups of a tensor-parallel job is not built yet; use "
                          "parallel.zero = 0 (DDP over each shard's data-parallel group)",
                          j->zero, j->tensor);
    int rc = dt_grid_init(&t->grid, e->rank, e->world_size, j->tensor, 1, err);
    if (rc)
        return rc;
    if ((rc = dt_strategy_open_backend(s, ctx, err)))
        return rc;
    const char *backend;
    if ((rc = dt_strategy_comm_backend(s, ctx, &backend, err)))
        return rc;
    if ((rc = dt_strategy_world_comm(&s->comm, ctx, backend, err)))
        return dt_err_prefix(err, "tensor parallelism: ");
    if (t->grid.D == 1) {
        t->tp = s->comm; /* the tensor group is the world: no split, no second communicator */
    } else {
        if ((rc = dt_strategy_open_groups(&t->groups, s->comm, ctx, err)))
            return dt_err_prefix(err, "tensor parallelism: ");
        t->groups_open = true;
        t->tp = t->groups.tp;
        t->dp = t->groups.dp;
    }
    dt_model_config mc = *ctx->model;
    mc.tp_size = t->grid.T;
    mc.tp_rank = t->grid.tp;
    mc.sequence_parallel = t->grid.T > 1 && ctx->job->sequence_parallel;
    if ((rc = dt_model_create(&s->model, &mc, s->be, t->tp, err)))
        return rc;
    const dt_model *m = s->model;
    if (m->num_buffers)
        return dt_err_set(err, -EINVAL, "tensor parallelism: model %s has non-trained buffers, "
                          "which this strategy does not gather", mc.type);
    if ((rc = dt_strategy_open_optim(s, ctx, err)))
        return rc;
    dt_mem_cat old = dt_mem_tag(s->be, DT_MEM_COMM);
    rc = s->be->alloc(s->be, (void **)&t->scratch, 32 * sizeof(double), err);
    dt_mem_tag(s->be, old);
    if (rc || (rc = build_whole(m, t, err)) || (rc = alloc_staging(s, t, err)))
        return rc;
    /* the initial parameters, whole: what start slices back when no checkpoint was loaded */
    if ((rc = gather_staging(s, t, 1, err)))
        return rc;
    snprintf(s->summary, sizeof s->summary, "tensor %d x data %d", t->grid.T, t->grid.D);
    DT_DEBUG("tensor parallelism: rank %d is (dp %d, tp %d, pp 0) of %d x %d x 1", e->rank,
             t->grid.dp, t->grid.tp, t->grid.D, t->grid.T);
    if (e->rank == 0)
        DT_INFO("tensor parallelism: T = %d, D = %d; each rank holds %zu of %zu parameters "
                "(%zu of the split tensors' %zu, and %zu replicated)",
                t->grid.T, t->grid.D, m->num_params, t->whole_numel, t->split_local,
                t->split_whole, t->replicated);
    return 0;
}

static int tp_start(dt_strategy *s, dt_err *err)
{
    tp_impl *t = s->impl;
    /* whole -> local: the checkpoint a load put in the staging, or the initial parameters */
    int rc = slice_staging(s, t, err);
    if (rc)
        return rc;
    release_staging(s, t);
    if (t->dp) {
        dt_ddp_opts o;
        if ((rc = dt_ddp_opts_from_job(&o, t->job, err)))
            return rc;
        /* checks the slices across the data-parallel group, broadcasts its rank 0's */
        if ((rc = dt_ddp_create(&t->ddp, s->model, t->dp, &o, err)))
            return dt_err_prefix(err, "tensor parallelism, data-parallel group of tp %d: ",
                                 t->grid.tp);
    }
    return 0;
}

static int tp_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                         float *loss, dt_err *err)
{
    tp_impl *t = s->impl;
    dt_model *m = s->model;
    int rc = m->ops->forward(m, batch, true, loss, err);
    if (rc)
        return rc;
    /* the reducer hears of finished gradients on the last micro-step only (no_sync before) */
    bool hook = last && t->ddp;
    return m->ops->backward(m, dloss, hook ? dt_ddp_grad_ready : NULL, hook ? t->ddp : NULL,
                            err);
}

static int tp_sync_grads(dt_strategy *s, dt_err *err)
{
    tp_impl *t = s->impl;
    s->comm_time_s = 0;
    if (!t->ddp)
        return 0;
    double t0 = dt_now_s();
    int rc = dt_ddp_finish(t->ddp, err);
    s->comm_time_s = dt_now_s() - t0;
    t->dp_wait_s += s->comm_time_s;
    if (rc)
        dt_err_prefix(err, "tensor parallelism, the gradients of tp %d over its data-parallel "
                      "group: ", t->grid.tp);
    return rc;
}

/* The mean over the world: the ranks of a tensor group hold the same loss, so it is the mean
 * over the data-parallel ranks, and a flag raised on one rank reaches all. */
static int tp_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    tp_impl *t = s->impl;
    dt_backend *be = s->be;
    int rc = 0;
    for (int k = 0; k < n && !rc; k += 32) {
        int c = DT_MIN(32, n - k);
        be->memcpy_h2d(be, t->scratch, v + k, (size_t)c * sizeof(double));
        rc = dt_comm_allreduce(s->comm, t->scratch, (size_t)c, DT_FLOAT64, DT_AVG, NULL, err);
        if (!rc)
            be->memcpy_d2h(be, v + k, t->scratch, (size_t)c * sizeof(double));
    }
    return rc;
}

/* The global gradient norm: the split tensors' squares summed over the tensor group, the
 * replicated tensors' (the same on every rank of the group: the model all-reduces them) counted
 * once, from tp rank 0; one all-reduce of a double, whose sum every rank of the group gets alike.
 * Then clip_grad_norm_'s scaling, as dt_optim_clip. */
static int tp_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    tp_impl *t = s->impl;
    dt_model *m = s->model;
    dt_backend *be = s->be;
    const dt_optim_config *c = &s->optim->cfg;
    if (unscale != 1.0)
        be->scale(be, m->grads, m->num_params, (float)unscale);
    double split = 0, repl = 0;
    for (int i = 0; i < m->num_tensors;) {
        /* runs of neighbours of one kind: one sumsq each */
        const dt_tensor_info *a = &m->tensors[i];
        bool sp = a->tp_parts > 0;
        size_t n = a->numel;
        int k = i + 1;
        for (; k < m->num_tensors && (m->tensors[k].tp_parts > 0) == sp; k++)
            n += m->tensors[k].numel;
        double q = be->sumsq(be, m->grads + a->offset, n);
        if (sp)
            split += q;
        else
            repl += q;
        i = k;
    }
    double sum = split + (t->grid.tp == 0 ? repl : 0.0);
    t->clips++;
    be->memcpy_h2d(be, t->scratch, &sum, sizeof sum);
    int rc = dt_comm_allreduce(t->tp, t->scratch, 1, DT_FLOAT64, DT_SUM, NULL, err);
    if (rc)
        return dt_err_prefix(err, "tensor parallelism: the global gradient norm: ");
    be->memcpy_d2h(be, &sum, t->scratch, sizeof sum);
    *norm = sqrt(sum);
    if (c->grad_clip > 0 && isfinite(*norm) && *norm > c->grad_clip)
        be->scale(be, m->grads, m->num_params, (float)(c->grad_clip / (*norm + 1e-6)));
    return 0;
}

static int tp_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    release_staging(s, s->impl); /* the trainer fenced the last save's copy before this */
    return dt_strategy_optim_step_whole(s, lr, err);
}

/* The checkpoint's buffers: whole tensors in the staging, under the usual names and shapes. */
static int tp_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    tp_impl *t = s->impl;
    const dt_model *m = s->model;
    const dt_optim *o = s->optim;
    if (cap < t->nstage)
        return dt_err_set(err, -ENOSPC, "checkpoint buffers: room for %d, %d needed", cap,
                          t->nstage);
    bufs[0] = (dt_ckpt_buf){"model", "", t->whole, m->num_tensors, t->stage[0], t->whole_numel,
                            false};
    for (int i = 0; i < o->num_states; i++)
        bufs[1 + i] = (dt_ckpt_buf){"optim", o->states[i].prefix, t->whole, m->num_tensors,
                                    t->stage[1 + i], t->whole_numel, false};
    *n = t->nstage;
    return 0;
}

static int tp_gather_state(dt_strategy *s, dt_err *err)
{
    tp_impl *t = s->impl;
    return gather_staging(s, t, t->nstage, err);
}

/* The reducer first (it gives the model its own gradient buffer back), then the groups, the
 * world, and what they served. */
static void tp_close(dt_strategy *s)
{
    tp_impl *t = s->impl;
    if (t) {
        dt_ddp_free(t->ddp);
        if (s->be) {
            for (int k = 0; k < NSTAGE; k++)
                s->be->free(s->be, t->stage[k]);
            s->be->free(s->be, t->scratch);
        }
        if (t->groups_open)
            dt_groups_close(&t->groups);
        free(t->whole);
    }
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_optim_free(s->optim);
    dt_model_free(s->model);
    dt_backend_close(s->be);
    free(t);
}

int dt_strategy_tensor_stats(dt_strategy *s, dt_tensor_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s || s->ops != &dt_strategy_tensor_ops || !s->impl || !s->model)
        return -EINVAL;
    const tp_impl *t = s->impl;
    out->D = t->grid.D;
    out->T = t->grid.T;
    out->dp = t->grid.dp;
    out->tp = t->grid.tp;
    out->local_params = s->model->num_params;
    out->split_local = t->split_local;
    out->replicated = t->replicated;
    out->whole_params = t->whole_numel;
    out->split_whole = t->split_whole;
    out->dp_wait_s = t->dp_wait_s;
    out->clips = t->clips;
    return 0;
}

const dt_strategy_ops dt_strategy_tensor_ops = {
    .name = "tensor",
    .rank_batch = tp_rank_batch,
    .open = tp_open,
    .start = tp_start,
    .zero_grads = dt_strategy_zero_grads_whole,
    .micro_step = tp_micro_step,
    .sync_grads = tp_sync_grads,
    .average = tp_average,
    .clip = tp_clip,
    .optim_step = tp_optim_step,
    .eval_step = dt_strategy_eval_whole, /* the model runs the tensor group's forward */
    .state = tp_state,
    .gather_state = tp_gather_state,
    .replica_backend = dt_strategy_backend_one,
    .close = tp_close,
};
