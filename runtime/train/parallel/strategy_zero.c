/* strategy_zero.c - ZeRO stages 1 and 2 over ddp.c's reducer in its sharding mode; see
 * strategy_zero.h.
 *
 * The file has two parts. dt_zero (strategy_zero.h, "ZeRO stages 1-2 over a data-parallel
 * group") is the sharded piece: the reducer in its sharding mode over a group, the optimiser
 * over this rank's shard of the local model, and the local-size staging of the optimiser state
 * a checkpoint reads and writes through; the tensor and pipeline strategies hold one over the
 * data-parallel group of their grid. The zero strategy is that piece over the world: open builds
 * the world communicator, the model and the piece (the reducer checks the model across ranks and
 * fixes the shard layout: it depends on the model and the bucket sizes only); start, after the
 * trainer resumed (or not), takes rank 0's parameters and buffers (as DDP) and this rank's slice
 * of whatever the load put in the staging. */
#include "runtime/train/parallel/strategy_zero.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/train/parallel/ddp.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

/* ---- the sharded piece (dt_zero, strategy_zero.h) ----------------------------------------- */

struct dt_zero {
    dt_strategy *s;                      /* borrowed: its be, model and optim */
    dt_ddp *ddp;                         /* the reducer (sharding mode), owned */
    int stage;                           /* 1 or 2 */
    float *full[DT_OPTIM_MAX_STATES];    /* (num_params, and up to the granule's next multiple)
                                            checkpoint staging per state: backend memory
                                            charged as DT_MEM_OTHER, owned */
    size_t full_bytes;                   /* bytes of each full[] allocation */
    bool resident;                       /* full[] are committed: usable, and counted */
    size_t held;                         /* bytes of full[] resident, as the allocator's
                                            statistics count them */
};

/* The allocator's resident bytes now (all categories: what one release or commit changes). */
static size_t total_now(dt_backend *be)
{
    dt_mem_stats st;
    dt_mem_read(be, &st);
    return st.total;
}

/* Full-size staging of the optimiser state for checkpoints, backend memory: zeroed (alloc's
 * contract: what start slices when nothing was loaded) and resident until start took this
 * rank's slice, then given back (mem_release) between a save or a load and the next update.
 * Each buffer is a whole number of granules where the backend gives memory back, so that
 * nothing of it stays resident once released. */
static int alloc_staging(dt_zero *z, dt_err *err)
{
    dt_strategy *s = z->s;
    dt_backend *be = s->be;
    int rc = 0;
    z->full_bytes = s->model->num_params * sizeof(float);
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER); /* checkpoint staging */
    for (int i = 0; i < s->optim->num_states && !rc; i++) {
        if ((rc = be->alloc(be, (void **)&z->full[i], z->full_bytes ? z->full_bytes : 1, err)))
            break;
        size_t g = dt_mem_granule(be, z->full[i]);
        if (i == 0 && g && z->full_bytes % g) { /* once more, rounded up to the granule */
            be->free(be, z->full[i]);
            z->full[i] = NULL;
            z->full_bytes = (z->full_bytes / g + 1) * g;
            rc = be->alloc(be, (void **)&z->full[i], z->full_bytes, err);
        }
    }
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "ZeRO: checkpoint staging: ");
    z->held = z->full_bytes * (size_t)s->optim->num_states;
    z->resident = true;
    return 0;
}

/* The staging becomes usable again before a save or a relayout writes all of it (its contents
 * are undefined until then). */
static int commit_staging(dt_zero *z, dt_err *err)
{
    dt_backend *be = z->s->be;
    if (z->resident || !be->mem_commit)
        return 0;
    for (int i = 0; i < z->s->optim->num_states; i++) {
        size_t before = total_now(be);
        int rc = be->mem_commit(be, z->full[i], 0, z->full_bytes, err);
        size_t after = total_now(be);
        z->held += after > before ? after - before : 0;
        if (rc)
            return dt_err_prefix(err, "ZeRO: checkpoint staging: ");
    }
    z->resident = true;
    return 0;
}

/* The staging's memory goes back (nothing reads it before the next commit_staging). */
static void release_staging(dt_zero *z)
{
    dt_backend *be = z->s->be;
    if (!z->resident || !be->mem_release)
        return;
    for (int i = 0; i < z->s->optim->num_states; i++) {
        size_t before = total_now(be);
        be->mem_release(be, z->full[i], 0, z->full_bytes);
        size_t after = total_now(be), n = before > after ? before - after : 0;
        z->held -= DT_MIN(n, z->held);
    }
    z->resident = false;
}

int dt_zero_open(dt_zero **out, dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *dp,
                 dt_err *err)
{
    *out = NULL;
    int stage = ctx->job->zero;
    if (stage < 1 || stage > 2)
        return dt_err_set(err, -EINVAL,
                          "parallel.zero = %d: stages 1 and 2 shard over the data-parallel "
                          "group here (stage 3 is dt_strategy_zero3_ops; 0 is DDP)", stage);
    dt_zero *z = calloc(1, sizeof *z);
    if (!z)
        return dt_err_set(err, -ENOMEM, "out of memory");
    z->s = s;
    z->stage = stage;
    dt_ddp_opts o;
    int rc = dt_ddp_opts_from_job(&o, ctx->job, err);
    if (rc)
        goto fail;
    o.shard = true;
    o.release = stage == 2;
    if ((rc = dt_ddp_create(&z->ddp, s->model, dp, &o, err)))
        goto fail;
    const dt_optim_range *ranges;
    int nr;
    size_t numel;
    dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
    const dt_model *m = s->model;
    if ((rc = dt_optim_create_ranges(&s->optim, ctx->optim, s->be, m->tensors, m->num_tensors,
                                     m->num_params, ranges, nr, numel, err)) ||
        (rc = alloc_staging(z, err)))
        goto fail;
    *out = z;
    return 0;
fail:
    dt_zero_free(z);
    return rc;
}

void dt_zero_free(dt_zero *z)
{
    if (!z)
        return;
    dt_ddp_free(z->ddp);
    for (int i = 0; i < DT_OPTIM_MAX_STATES; i++)
        if (z->full[i])
            z->s->be->free(z->s->be, z->full[i]);
    free(z);
}

int dt_zero_stage(const dt_zero *z) { return z->stage; }

dt_ddp *dt_zero_ddp(dt_zero *z) { return z->ddp; }

void dt_zero_zero_grads(dt_zero *z)
{
    if (z->stage == 2)
        dt_ddp_release_grads(z->ddp); /* each block is committed and zeroed before its backward */
    else
        dt_strategy_zero_grads_whole(z->s);
}

float *dt_zero_grads(dt_zero *z, size_t *numel)
{
    *numel = z->s->optim->state_numel;
    return dt_ddp_shard_grads(z->ddp);
}

/* Each rank's sum of squares of its shard (the padding is zero), or of the parts of it that
 * lie in counted tensors (one sumsq per run of them inside a range), then the ranks' sums added
 * in rank order on every rank. */
int dt_zero_sumsq(dt_zero *z, const unsigned char *counted, double *sum, dt_err *err)
{
    dt_strategy *s = z->s;
    const dt_model *m = s->model;
    size_t n;
    const float *g = dt_zero_grads(z, &n);
    double mine = 0;
    if (!counted) {
        mine = s->be->sumsq(s->be, g, n);
    } else {
        const dt_optim_range *ranges;
        int nr;
        size_t numel;
        dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
        for (int r = 0; r < nr; r++) {
            size_t lo = ranges[r].off, hi = lo + ranges[r].n, from = lo, to = lo;
            for (int t = 0; t < m->num_tensors && lo < hi; t++) { /* tensors in buffer order */
                const dt_tensor_info *ti = &m->tensors[t];
                size_t a = DT_MAX(ti->offset, lo), b = DT_MIN(ti->offset + ti->numel, hi);
                if (a >= b)
                    continue;
                if (counted[t] && a == to) { /* extends the run */
                    to = b;
                    continue;
                }
                if (to > from)
                    mine += s->be->sumsq(s->be, g + ranges[r].at + (from - lo), to - from);
                from = a;
                to = counted[t] ? b : a;
            }
            if (to > from)
                mine += s->be->sumsq(s->be, g + ranges[r].at + (from - lo), to - from);
        }
    }
    return dt_ddp_sum_double(z->ddp, mine, sum, err);
}

int dt_zero_clip_split(dt_zero *z, double unscale, int tp_rank, const int *skip, int nskip,
                       dt_comm *const *groups, int ngroups, double *scratch, double *norm,
                       dt_err *err)
{
    dt_strategy *s = z->s;
    const dt_model *m = s->model;
    dt_backend *be = s->be;
    size_t n;
    float *g = dt_zero_grads(z, &n);
    if (unscale != 1.0)
        be->scale(be, g, n, (float)unscale);
    unsigned char *counted = malloc((size_t)m->num_tensors + 1);
    if (!counted)
        return dt_err_set(err, -ENOMEM, "out of memory");
    for (int t = 0; t < m->num_tensors; t++) {
        counted[t] = m->tensors[t].tp_parts > 0 || tp_rank == 0;
        for (int i = 0; counted[t] && i < nskip; i++)
            counted[t] = skip[i] != t;
    }
    double sum = 0;
    int rc = dt_zero_sumsq(z, counted, &sum, err);
    free(counted);
    if (!rc)
        be->memcpy_h2d(be, scratch, &sum, sizeof sum);
    for (int k = 0; k < ngroups && !rc; k++)
        if (groups[k])
            rc = dt_comm_allreduce(groups[k], scratch, 1, DT_FLOAT64, DT_SUM, NULL, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO: the global gradient norm: ");
    be->memcpy_d2h(be, &sum, scratch, sizeof sum);
    *norm = sqrt(sum);
    double clip = s->optim->cfg.grad_clip;
    if (clip > 0 && isfinite(*norm) && *norm > clip)
        be->scale(be, g, n, (float)(clip / (*norm + 1e-6)));
    return 0;
}

/* The reducer rebuilt its buckets from the first backward's ready order (ddp.h): the state
 * moves from the old shards to the new ones through the full-size staging. */
static int relayout(dt_zero *z, dt_err *err)
{
    dt_optim *o = z->s->optim;
    int rc = commit_staging(z, err);
    for (int i = 0; i < o->num_states && !rc; i++)
        rc = dt_ddp_gather_shards(z->ddp, o->states[i].buf, z->full[i], err);
    if (rc)
        return dt_err_prefix(err, "ZeRO: moving the optimiser state to the rebuilt buckets: ");
    const dt_optim_range *ranges;
    int nr;
    size_t numel;
    if ((rc = dt_ddp_relayout(z->ddp, err)))
        return rc;
    dt_ddp_shard_ranges(z->ddp, &ranges, &nr, &numel);
    if ((rc = dt_optim_set_ranges(o, ranges, nr, numel, err)))
        return rc;
    for (int i = 0; i < o->num_states; i++)
        dt_ddp_slice_shard(z->ddp, z->full[i], o->states[i].buf);
    release_staging(z);
    return 0;
}

int dt_zero_step(dt_zero *z, double lr, dt_err *err)
{
    dt_strategy *s = z->s;
    release_staging(z); /* the trainer fenced the last save's copy before this */
    dt_optim_step(s->optim, s->model->params, dt_ddp_shard_grads(z->ddp), lr);
    int rc = dt_ddp_gather_params(z->ddp, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO: gathering the updated parameters: ");
    return dt_ddp_relayout_pending(z->ddp) ? relayout(z, err) : 0;
}

float *dt_zero_local_state(dt_zero *z, int i)
{
    dt_err err = {0};
    if (commit_staging(z, &err)) /* only after start: a load writes while it is resident */
        DT_WARN("%s", err.msg);
    return z->full[i];
}

int dt_zero_gather_state(dt_zero *z, dt_err *err)
{
    dt_optim *o = z->s->optim;
    int rc = commit_staging(z, err);
    if (rc)
        return rc;
    for (int i = 0; i < o->num_states; i++) {
        rc = dt_ddp_gather_shards(z->ddp, o->states[i].buf, z->full[i], err);
        if (rc)
            return dt_err_prefix(err, "ZeRO: gathering %s: ", o->states[i].name);
    }
    return 0;
}

void dt_zero_take_state(dt_zero *z)
{
    dt_optim *o = z->s->optim;
    for (int i = 0; i < o->num_states; i++)
        dt_ddp_slice_shard(z->ddp, z->full[i], o->states[i].buf);
    release_staging(z);
}

void dt_zero_mem(dt_zero *z, dt_strategy_mem *out)
{
    dt_ddp_stats st;
    dt_ddp_get_stats(z->ddp, &st);
    size_t shard = st.shard_numel * sizeof(float);
    out->zero_stage = z->stage;
    out->comm = st.payload_bytes;
    if (z->stage == 2) {
        out->grads = st.grads_resident + shard;
        out->grads_peak = DT_MAX(st.grads_resident_peak, st.grads_resident) + shard;
    } else {
        out->grads = z->s->model->num_params * sizeof(float) + shard;
    }
    out->ckpt_staging = z->held;
}

/* ---- the zero strategy: the piece over the world ------------------------------------------ */

typedef struct zero_impl {
    dt_zero *zero;                       /* owned */
} zero_impl;

static int zero_rank_batch(const dt_job *job) { return job->batch_size; }

static int zero_open(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    const dt_worker_env *e = ctx->env;
    zero_impl *z = calloc(1, sizeof *z);
    if (!z)
        return dt_err_set(err, -ENOMEM, "out of memory");
    s->impl = z;
    int stage = ctx->job->zero;
    if (stage < 1 || stage > 2)
        return dt_err_set(err, -EINVAL,
                          "parallel.zero = %d: this strategy runs stages 1 and 2 (stage 3 is "
                          "dt_strategy_zero3_ops; 0 is DDP)", stage);
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (rc)
        return rc;
    const char *backend;
    if ((rc = dt_strategy_comm_backend(s, ctx, &backend, err)))
        return rc;
    if ((rc = dt_strategy_world_comm(&s->comm, ctx, backend, err)))
        return dt_err_prefix(err, "ZeRO: ");
    if ((rc = dt_model_create(&s->model, ctx->model, s->be, s->comm, err)))
        return rc;
    if ((rc = dt_zero_open(&z->zero, s, ctx, s->comm, err)))
        return rc;
    const dt_model *m = s->model;
    size_t numel = s->optim->state_numel;
    snprintf(s->summary, sizeof s->summary, "ZeRO-%d over %d ranks", stage, e->world_size);
    if (e->rank == 0)
        DT_INFO("ZeRO stage %d: %zu parameters, this rank's shard %zu (%.1f%%), optimiser state "
                "%.2f MB per rank (%.2f MB whole)",
                stage, m->num_params, numel, 100.0 * (double)numel / (double)m->num_params,
                (double)numel * 4 * s->optim->num_states / 1e6,
                (double)m->num_params * 4 * s->optim->num_states / 1e6);
    return 0;
}

static int zero_start(dt_strategy *s, dt_err *err)
{
    zero_impl *z = s->impl;
    dt_model *m = s->model;
    int rc;
    /* rank 0's parameters and buffers, as DDP (the reducer took them at open, before resume) */
    if ((rc = dt_comm_broadcast(s->comm, m->params, m->num_params, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO: broadcasting rank 0's parameters: ");
    if (m->num_buffers &&
        (rc = dt_comm_broadcast(s->comm, m->buffers, m->num_buffers, DT_FLOAT32, 0, NULL, err)))
        return dt_err_prefix(err, "ZeRO: broadcasting rank 0's buffers: ");
    /* this rank's slice of what a load put in the staging (zeros when nothing was loaded) */
    dt_zero_take_state(z->zero);
    return 0;
}

static void zero_zero_grads(dt_strategy *s)
{
    zero_impl *z = s->impl;
    dt_zero_zero_grads(z->zero);
}

static int zero_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                           float *loss, dt_err *err)
{
    zero_impl *z = s->impl;
    dt_model *m = s->model;
    dt_ddp *d = dt_zero_ddp(z->zero);
    uint64_t ts = dt_trace_begin();
    int rc = m->ops->forward(m, batch, true, loss, err);
    dt_trace_end(ts, DT_TRACE_FORWARD, "forward");
    if (rc)
        return rc;
    /* the reducer hears of finished gradients on the last micro-step only (no_sync before) */
    dt_flight_phase(DT_PHASE_BACKWARD);
    ts = dt_trace_begin();
    rc = m->ops->backward(m, dloss, last ? dt_ddp_grad_ready : NULL, last ? d : NULL, err);
    dt_trace_end(ts, DT_TRACE_BACKWARD, "backward");
    return rc;
}

static int zero_sync_grads(dt_strategy *s, dt_err *err)
{
    zero_impl *z = s->impl;
    double t0 = dt_now_s();
    int rc = dt_ddp_finish(dt_zero_ddp(z->zero), err);
    s->comm_time_s = dt_now_s() - t0;
    return rc;
}

static int zero_average(dt_strategy *s, double *v, int n, dt_err *err)
{
    zero_impl *z = s->impl;
    return dt_ddp_average(dt_zero_ddp(z->zero), v, n, err);
}

/* The global norm over the shards (dt_zero_sumsq), then clip_grad_norm_'s scaling. */
static int zero_clip(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    zero_impl *z = s->impl;
    const dt_optim_config *c = &s->optim->cfg;
    size_t n;
    float *g = dt_zero_grads(z->zero, &n);
    if (unscale != 1.0)
        s->be->scale(s->be, g, n, (float)unscale);
    double sum = 0;
    int rc = dt_zero_sumsq(z->zero, NULL, &sum, err);
    if (rc)
        return dt_err_prefix(err, "ZeRO: the global gradient norm: ");
    *norm = sqrt(sum);
    if (c->grad_clip > 0 && isfinite(*norm) && *norm > c->grad_clip)
        s->be->scale(s->be, g, n, (float)(c->grad_clip / (*norm + 1e-6)));
    return 0;
}

static int zero_optim_step(dt_strategy *s, double lr, dt_err *err)
{
    zero_impl *z = s->impl;
    return dt_zero_step(z->zero, lr, err);
}

static int zero_state(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    zero_impl *z = s->impl;
    float *full[DT_OPTIM_MAX_STATES] = {0};
    for (int i = 0; i < s->optim->num_states; i++)
        full[i] = z->zero->full[i]; /* not dt_zero_local_state: nothing is written yet */
    return dt_strategy_state_bufs(s, s->model->params, full, bufs, cap, n, err);
}

static int zero_gather_state(dt_strategy *s, dt_err *err)
{
    zero_impl *z = s->impl;
    return dt_zero_gather_state(z->zero, err);
}

/* The reducer first, then the communicator, then what they served. */
static void zero_close(dt_strategy *s)
{
    zero_impl *z = s->impl;
    if (z)
        dt_zero_free(z->zero);
    dt_comm_free(s->comm);
    s->comm = NULL;
    dt_optim_free(s->optim);
    dt_model_free(s->model);
    dt_backend_close(s->be);
    free(z);
}

void dt_strategy_get_mem(dt_strategy *s, dt_strategy_mem *out)
{
    memset(out, 0, sizeof *out);
    if (s->ops == &dt_strategy_zero3_ops && s->impl) {
        dt_strategy_zero3_mem(s, out);
        return;
    }
    const dt_model *m = s->model;
    const dt_optim *o = s->optim;
    out->params = m->num_params * sizeof(float);
    out->grads = m->num_params * sizeof(float);
    out->optim = (size_t)o->num_states * o->state_numel * sizeof(float);
    if (s->ops == &dt_strategy_zero_ops && s->impl && ((zero_impl *)s->impl)->zero)
        dt_zero_mem(((zero_impl *)s->impl)->zero, out);
    if (!out->grads_peak)
        out->grads_peak = out->grads;
    out->params_peak = out->params;
}

int dt_strategy_zero_stats(dt_strategy *s, dt_ddp_stats *out)
{
    if (s->ops != &dt_strategy_zero_ops || !s->impl || !((zero_impl *)s->impl)->zero)
        return -EINVAL;
    dt_ddp_get_stats(((zero_impl *)s->impl)->zero->ddp, out);
    return 0;
}

const dt_strategy_ops dt_strategy_zero_ops = {
    .name = "zero",
    .rank_batch = zero_rank_batch,
    .open = zero_open,
    .start = zero_start,
    .zero_grads = zero_zero_grads,
    .micro_step = zero_micro_step,
    .sync_grads = zero_sync_grads,
    .average = zero_average,
    .clip = zero_clip,
    .optim_step = zero_optim_step,
    .eval_step = dt_strategy_eval_whole,
    .state = zero_state,
    .gather_state = zero_gather_state,
    .replica_backend = dt_strategy_backend_one,
    .close = zero_close,
};
