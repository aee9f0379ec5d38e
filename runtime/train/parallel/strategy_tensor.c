/* strategy_tensor.c - tensor parallelism (Megatron-LM's column/row splits, in the gpt model) with
 * a data-parallel sync (dpsync.h: DDP, ZeRO stages 1-3) over the data-parallel groups; see
 * strategy_tensor.h.
 *
 * The model does the tensor-parallel work (its forward and backward all-reduce over the tensor
 * group); what is left here is what spans the step: the groups, the norm over slices, and
 * checkpoints of whole tensors. The data-parallel axis is the sync the registry chose, opened
 * over the data-parallel group and this rank's slices (none when D = 1: nothing to
 * synchronise), which builds the optimiser over what the rank owns of them; the layout never
 * asks which one it holds. The norm is the sync's clip over the counted tensors (the split ones
 * on every rank, the replicated ones on tp rank 0), added over the tensor group. A checkpoint
 * goes through both stagings: the sync's local buffers (gathered over dp first where the sync
 * shards them) assembled over the tensor group into whole tensors; a load the reverse, the sync
 * taking its part at start, so the checkpoint is the one T = 1 or one process writes.
 *
 * Checkpoint staging. state hands out full-size buffers laid out by a "whole" tensor table (the
 * model's table with whole_shape, packed in the same order), one for the parameters and one per
 * optimiser state (staging.h's dt_staging, shared with the pipeline strategy).
 * gather_state fills them (dt_strategy_tp_gather): one all-gather over the tensor group per
 * buffer (T x the local buffer), then each tensor assembled from the T slices with
 * dt_tensor_tp_copy (replicated tensors: this rank's copy); start slices them back
 * (dt_strategy_tp_slice). open gathers the initial parameters there too, so that
 * start, which always slices the staging back into the local buffers, leaves an un-resumed model
 * as it was built and a resumed one as the checkpoint holds it. The staging is backend memory
 * charged as "other" (checkpoint staging); its memory goes back (backend mem_release)
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
#include "runtime/train/parallel/strategy_tensor.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"

typedef struct tp_impl {
    const dt_job *job;         /* borrowed */
    dt_grid grid;              /* this rank's coordinates */
    dt_groups groups;          /* split from s->comm (owned) when opened; else zeroed */
    bool groups_open;
    dt_comm *tp;               /* the tensor group: groups.tp, or s->comm when D = 1 (borrowed) */
    dt_comm *dp;               /* the data-parallel group (groups.dp) or NULL when D = 1 */
    unsigned char *counted;    /* (num_tensors) what this rank counts in the norm, owned */
    double *scratch;           /* (32) backend memory for the scalar collectives, owned */
    /* checkpoint staging */
    dt_tensor_info *whole;     /* (num_tensors) host, owned: shapes whole, packed offsets */
    size_t *whole_off;         /* (num_tensors) host, owned: whole[i].offset */
    size_t whole_numel;
    dt_staging stg;   /* params, then each optimiser state; owned */
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
    t->whole_off = calloc((size_t)m->num_tensors + 1, sizeof *t->whole_off);
    if (!t->whole || !t->whole_off)
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
        w->offset = t->whole_off[i] = off;
        w->tp_parts = 0;
        w->tp_dim = 0;
        memcpy(w->whole_shape, w->shape, sizeof w->whole_shape);
        off += n;
    }
    t->whole_numel = off;
    return 0;
}

/* The staging buffers k < upto filled with the whole tensors of the sync's local ones (a
 * sharding sync: gathered over dp first; only the initial parameters, upto = 1, need not be).
 * Collective over the tensor (and data-parallel) group. */
static int gather_staging(dt_strategy *s, tp_impl *t, int upto, dt_err *err)
{
    int rc = dt_staging_commit(&t->stg, s->be, err);
    if (!rc && upto > 1 && (rc = dt_dpsync_gather_state(s->sync, err)))
        return dt_err_prefix(err, "tensor parallelism, data-parallel group of tp %d: ",
                             t->grid.tp);
    for (int k = 0; k < upto && !rc; k++)
        if ((rc = dt_strategy_tp_gather(s, t->tp, t->grid.T, t->grid.tp,
                                        dt_dpsync_local(s->sync, k), t->stg.buf[k],
                                        t->whole_off, err)))
            dt_err_prefix(err, "tensor parallelism: gathering %s over the tensor group: ",
                          k ? s->optim->states[k - 1].name : "the parameters");
    return rc;
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
    if (ctx->model->arch != DT_ARCH_GPT && ctx->model->arch != DT_ARCH_BERT &&
        ctx->model->arch != DT_ARCH_LLAMA)
        return dt_err_set(err, -EINVAL,
                          "parallel.tensor = %d splits gpt's, bert's and llama's attention, MLP "
                          "and vocabulary; model.type = %s has no tensor-parallel form: use "
                          "model.type = gpt, bert or llama, or parallel.tensor = 1", j->tensor,
                          dt_model_arch_name(ctx->model->arch));
    if (j->pipeline > 1)
        return dt_err_set(err, -EINVAL,
                          "parallel.pipeline = %d: the tensor strategy runs one stage (the "
                          "pipeline strategy runs parallel.pipeline > 1)", j->pipeline);
    t->grid = *ctx->grid;
    int rc;
    if ((rc = dt_strategy_open_world(s, ctx, err)))
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
                          "which this strategy does not gather", dt_model_arch_name(mc.arch));
    /* the sync over the data-parallel group (none when D = 1); the optimiser is its */
    if ((rc = dt_strategy_open_sync(s, ctx, t->dp, err)))
        return dt_err_prefix(err, "tensor parallelism, %s over the data-parallel group of tp "
                             "%d: ", s->sync ? s->sync->label : ctx->sync->name, t->grid.tp);
    if (!(t->counted = dt_strategy_counted(m, t->grid.tp, NULL, 0)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_mem_cat old = dt_mem_tag(s->be, DT_MEM_COMM);
    rc = s->be->alloc(s->be, (void **)&t->scratch, 32 * sizeof(double), err);
    dt_mem_tag(s->be, old);
    if (rc || (rc = build_whole(m, t, err)) ||
        (rc = dt_staging_alloc(&t->stg, s->be, 1 + s->optim->num_states,
                                        t->whole_numel, err)))
        return dt_err_prefix(err, "tensor parallelism: ");
    /* the initial parameters, whole: what start slices back when no checkpoint was loaded */
    if ((rc = gather_staging(s, t, 1, err)))
        return rc;
    s->whole_params = t->whole_numel;
    if (s->sync->sharded)
        snprintf(s->summary, sizeof s->summary, "tensor %d x data %d, %s", t->grid.T,
                 t->grid.D, s->sync->label);
    else
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
    int rc = 0;
    for (int k = 0; k < t->stg.n && !rc; k++)
        rc = dt_strategy_tp_slice(s, t->grid.tp, t->stg.buf[k], t->whole_off,
                                  dt_dpsync_local(s->sync, k), err);
    if (rc)
        return dt_err_prefix(err, "tensor parallelism: ");
    dt_staging_release(&t->stg, s->be);
    /* the data-parallel rank 0's slices everywhere (DDP: the reducer checks them across the
     * group first), this rank's part of the state */
    if ((rc = dt_dpsync_start(s->sync, err)))
        return dt_err_prefix(err, "tensor parallelism, data-parallel group of tp %d: ",
                             t->grid.tp);
    return 0;
}

static int tp_sync_grads(dt_strategy *s, dt_err *err)
{
    tp_impl *t = s->impl;
    int rc = dt_dpsync_finish(s->sync, NULL, NULL, &s->comm_time_s, err);
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
 * once, from tp rank 0 (t->counted); the data-parallel replicas hold the same all-reduced
 * gradient, so the tensor group's sum is the world's. A sharding sync holds a shard of it: the
 * shards' sums are added over dp first (dpsync.h's clip). */
static int tp_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    tp_impl *t = s->impl;
    t->clips++;
    int rc = dt_dpsync_clip(s->sync, unscale, t->counted, &t->tp, 1, t->scratch, norm, err);
    return rc ? dt_err_prefix(err, "tensor parallelism: ") : 0;
}

static int tp_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    tp_impl *t = s->impl;
    dt_staging_release(&t->stg, s->be); /* the trainer fenced the save's copy */
    return dt_dpsync_step(s->sync, lr, err);
}

/* The checkpoint's buffers: whole tensors in the staging, under the usual names and shapes. */
static int tp_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    tp_impl *t = s->impl;
    return dt_strategy_state_staged(s, t->whole, s->model->num_tensors, &t->stg, bufs, cap, n,
                                    err);
}

/* This rank's slices, as the sync owns them (replicated tensors: tensor rank 0's). */
static int tp_pieces(dt_strategy *s, dt_ckpt_piece **out, int *n, dt_err *err)
{
    tp_impl *t = s->impl;
    return dt_strategy_sync_pieces(s, t->grid.tp, NULL, 0, out, n, err);
}

static int tp_gather_state(dt_strategy *s, dt_err *err)
{
    tp_impl *t = s->impl;
    return gather_staging(s, t, t->stg.n, err);
}

/* The reducer first (it gives the model its own gradient buffer back), then the groups, the
 * world, and what they served. */
static void tp_close(dt_strategy *s)
{
    tp_impl *t = s->impl;
    dt_dpsync_close(s->sync);
    s->sync = NULL;
    s->optim = NULL;
    if (t) {
        dt_staging_free(&t->stg, s->be);
        if (s->be)
            s->be->free(s->be, t->scratch);
        if (t->groups_open)
            dt_groups_close(&t->groups);
        free(t->whole);
        free(t->whole_off);
        free(t->counted);
    }
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_model_free(s->model);
    dt_backend_close(s->be);
    free(t);
}

static void tp_stats(dt_strategy *s, dt_strategy_stats *all)
{
    const tp_impl *t = s->impl;
    dt_tensor_stats *out = &all->tp;
    all->tensor = true;
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
    dt_comm_stats_get(t->tp, &out->tp_comm);
    dt_comm_stats_get(t->dp, &out->dp_comm);
}

const dt_strategy_ops dt_strategy_tensor_ops = {
    .name = "tensor",
    .rank_batch = tp_rank_batch,
    .open = tp_open,
    .start = tp_start,
    .zero_grads = dt_strategy_sync_zero_grads,
    .micro_step = dt_strategy_sync_micro_step,
    .sync_grads = tp_sync_grads,
    .average = tp_average,
    .clip = tp_clip,
    .optim_step = tp_optim_step,
    .eval_step = dt_strategy_sync_eval,
    .state = tp_state,
    .gather_state = tp_gather_state,
    .pieces = tp_pieces,
    .stats = tp_stats,
    .replica_backend = dt_strategy_backend_one,
    .close = tp_close,
};
