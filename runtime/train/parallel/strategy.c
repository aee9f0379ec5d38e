/* strategy.c - what the strategies share: binding the worker to its CPUs, the backend, the
 * world communicator, the grid's groups, the optimiser, a whole model's checkpoint buffers, the
 * clip, update and zeroing of a gradient that lives whole on this rank; and, for the strategies
 * that split the model (tensor, pipeline), the checkpoint staging of whole tensors, the gather
 * and slice over the tensor group and the global norm of a split gradient; see strategy.h.
 *
 * Nothing here knows which strategy runs; the registry (strategies.c) chooses, the
 * implementations (strategy_*.c) call these. */
#include "runtime/train/parallel/strategy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpuset.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/train/obs/flight.h"
#include "runtime/train/obs/trace.h"

void dt_strategy_bind_cpus(const dt_job *j, const dt_backend *be, int local_rank,
                           int local_world)
{
    cpu_set_t base, mine;
    dt_err e = {0};
    char all[256], list[256];
    bool gpu = be->device_pci_bus_id != NULL; /* device k is local rank k's */
    if (j->cpu_bind != DT_CPU_BIND_AUTO ||
        (!gpu && (be->kind != DT_BACKEND_CPU || local_world < 2)))
        return;
    if (dt_cpuset_current(&base, &e) ||
        dt_backend_bind_set(be, &base, local_rank, local_world, &mine, &e) ||
        dt_cpuset_bind(&mine, &e)) {
        DT_DEBUG("job.cpu_bind = auto: not bound to CPUs: %s", e.msg);
        return;
    }
    if (!gpu)
        dt_cpu_backend_bind_blas_threads(); /* started before: at load or at the backend's open */
    dt_cpuset_format(&base, all, sizeof all);
    dt_cpuset_format(&mine, list, sizeof list);
    if (local_rank == 0)
        DT_INFO("job.cpu_bind = auto: each of this node's %d workers runs on its own share of "
                "%s %s (job.cpu_bind = none leaves it to the scheduler)",
                local_world, gpu ? "the CPUs near its GPU, within" : "CPUs", all);
    DT_DEBUG("local rank %d runs on CPU(s) %s", local_rank, list);
}

dt_backend_kind dt_strategy_device(dt_device_kind device)
{
    switch (device) {
    case DT_DEVICE_CPU:
        return DT_BACKEND_CPU;
    case DT_DEVICE_CUDA:
        return DT_BACKEND_CUDA;
    case DT_DEVICE_AUTO:
        break;
    }
    return DT_BACKEND_AUTO;
}

int dt_strategy_open_backend(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    int rc = dt_backend_open(&s->be, dt_strategy_device(ctx->job->device), ctx->be_opts, err);
    if (rc == -ENOENT) /* no CUDA library in this build: as absent as a missing GPU */
        rc = -ENODEV;
    if (rc)
        return rc;
    dt_strategy_bind_cpus(ctx->job, s->be, ctx->env->local_rank, ctx->env->local_world_size);
    return 0;
}

int dt_strategy_comm_backend(const dt_strategy *s, const dt_strategy_ctx *ctx,
                             dt_comm_kind *backend, dt_err *err)
{
    const dt_worker_env *e = ctx->env;
    if (!e->store_addr[0] || e->store_port <= 0)
        return dt_err_set(err, -EINVAL,
                          "WORLD_SIZE=%d but DTRAIN_STORE_ADDR/DTRAIN_STORE_PORT are not set: "
                          "start the workers with the dtrain launcher",
                          e->world_size);
    bool cuda = s->be->kind == DT_BACKEND_CUDA;
    dt_comm_backend_kind kind = ctx->job->comm_backend;
    if (kind == DT_COMM_BACKEND_AUTO)
        kind = cuda ? DT_COMM_BACKEND_NCCL : DT_COMM_BACKEND_CPU;
    if (kind == DT_COMM_BACKEND_NCCL && !cuda)
        return dt_err_set(err, -ENODEV, "ddp.backend = nccl needs device = cuda (this worker "
                                        "runs on %s); use ddp.backend = cpu or auto",
                          s->be->name);
    *backend = kind == DT_COMM_BACKEND_NCCL ? DT_COMM_NCCL : DT_COMM_CPU;
    return 0;
}

int dt_strategy_world_comm(dt_comm **out, const dt_strategy_ctx *ctx, dt_comm_kind backend,
                           dt_err *err)
{
    const dt_worker_env *e = ctx->env;
    dt_store *store = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    int rc = dt_store_connect(&store, e->store_addr, e->store_port, &so, err);
    if (rc)
        return dt_err_prefix(err, "connecting to the store at %s:%d: ", e->store_addr,
                             e->store_port);
    dt_comm_opts co;
    dt_comm_opts_default(&co);
    co.backend = backend;
    co.rank = e->rank;
    co.world_size = e->world_size;
    co.local_rank = e->local_rank;
    co.local_world_size = e->local_world_size;
    co.run_id = e->run_id;
    co.attempt = e->round; /* namespace: unique per rendezvous round, restarts and regroups alike */
    co.timeout_ms = (int)DT_MIN(ctx->job->comm_timeout * 1000.0, 2e9);
    co.device_index = e->local_rank;
    rc = dt_comm_init(out, store, &co, err); /* the store is needed for the bootstrap only */
    dt_store_free(store);
    return rc;
}

int dt_strategy_open_world(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    dt_comm_kind backend;
    int rc = dt_strategy_open_backend(s, ctx, err);
    if (!rc)
        rc = dt_strategy_comm_backend(s, ctx, &backend, err);
    if (!rc)
        rc = dt_strategy_world_comm(&s->comm, ctx, backend, err);
    return rc;
}

int dt_strategy_open_groups(dt_groups *out, dt_comm *world, const dt_strategy_ctx *ctx,
                            dt_err *err)
{
    const dt_worker_env *e = ctx->env;
    memset(out, 0, sizeof *out);
    int rc;
    dt_store *store = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    if ((rc = dt_store_connect(&store, e->store_addr, e->store_port, &so, err)))
        return dt_err_prefix(err, "connecting to the store at %s:%d to split the groups: ",
                             e->store_addr, e->store_port);
    /* the store serves the bootstrap only */
    rc = dt_groups_open(out, world, store, ctx->grid, err);
    dt_store_free(store);
    return rc;
}

int dt_strategy_open_optim(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    const dt_model *m = s->model;
    return dt_optim_create(&s->optim, ctx->optim, s->be, m->tensors, m->num_tensors,
                           m->num_params, err);
}

int dt_strategy_state_bufs(const dt_strategy *s, float *params, float *const *states,
                           dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    const dt_model *m = s->model;
    const dt_optim *o = s->optim;
    int k = 0;
    if (cap < 2 + o->num_states)
        return dt_err_set(err, -ENOSPC, "checkpoint buffers: room for %d, %d needed", cap,
                          2 + o->num_states);
    bufs[k++] = (dt_ckpt_buf){"model", "", m->tensors, m->num_tensors, params, m->num_params,
                              false};
    if (m->num_buffers) /* BatchNorm statistics change in the next forward: copied at once */
        bufs[k++] = (dt_ckpt_buf){"model", "", m->buffer_tensors, m->num_buffer_tensors,
                                  m->buffers, m->num_buffers, true};
    for (int i = 0; i < o->num_states; i++)
        bufs[k++] = (dt_ckpt_buf){"optim", o->states[i].prefix, m->tensors, m->num_tensors,
                                  states ? states[i] : o->states[i].buf, m->num_params, false};
    *n = k;
    return 0;
}

/* Appends a piece to *v (growing it); -ENOMEM. */
static int add_piece(dt_ckpt_piece **v, int *n, int *cap, const char *prefix,
                     const dt_tensor_info *t, int tp_rank, size_t start, size_t count,
                     const float *data)
{
    if (*n == *cap) {
        int nc = *cap ? *cap * 2 : 64;
        dt_ckpt_piece *nv = realloc(*v, (size_t)nc * sizeof *nv);
        if (!nv)
            return -ENOMEM;
        *v = nv, *cap = nc;
    }
    dt_ckpt_piece *p = &(*v)[(*n)++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s%s", prefix, t->name);
    p->local = t;
    p->tp_rank = tp_rank;
    p->start = start;
    p->n = count;
    p->data = data;
    return 0;
}

int dt_strategy_sync_pieces(const dt_strategy *s, int tp_rank, const int *skip, int nskip,
                            dt_ckpt_piece **out, int *n, dt_err *err)
{
    const dt_model *m = s->model;
    const dt_optim *o = s->optim;
    dt_dpsync *y = s->sync;
    dt_ckpt_piece *v = NULL;
    dt_dpsync_piece *own = NULL;
    int cnt = 0, cap = 0, rc = 0;
    *out = NULL;
    *n = 0;
    /* What every replica of the group holds alike (none, ddp) is split between them: rank r of
     * the group writes the r-th of `size` parts of each run, so no rank writes more than 1/size */
    bool split = y->ops->replicated && y->size > 1;
    for (int k = 0; k < 1 + o->num_states && !rc; k++) {
        const char *prefix = k ? o->states[k - 1].prefix : "";
        int no = 0;
        dt_dpsync_owned(y, k, NULL, 0, &no);
        free(own);
        if (!(own = calloc((size_t)(no ? no : 1), sizeof *own))) {
            rc = -ENOMEM;
            break;
        }
        dt_dpsync_owned(y, k, own, no, &no);
        for (int i = 0; split && i < no; i++) {
            size_t lo = own[i].n * (size_t)y->rank / (size_t)y->size;
            size_t hi = own[i].n * (size_t)(y->rank + 1) / (size_t)y->size;
            own[i] = (dt_dpsync_piece){own[i].off + lo, hi - lo, own[i].data + lo};
        }
        for (int i = 0; i < no && !rc; i++)
            for (int t = 0; t < m->num_tensors && !rc; t++) {
                const dt_tensor_info *ti = &m->tensors[t];
                size_t a = DT_MAX(own[i].off, ti->offset);
                size_t b = DT_MIN(own[i].off + own[i].n, ti->offset + ti->numel);
                bool skipped = ti->tp_parts <= 0 && tp_rank != 0;
                for (int q = 0; q < nskip; q++)
                    skipped |= skip[q] == t;
                if (a < b && !skipped)
                    rc = add_piece(&v, &cnt, &cap, prefix, ti, tp_rank, a - ti->offset, b - a,
                                   own[i].data + (a - own[i].off));
            }
    }
    /* BatchNorm statistics: rank 0's of every group, as a whole checkpoint takes them */
    for (int t = 0; !rc && y->rank == 0 && tp_rank == 0 && t < m->num_buffer_tensors; t++) {
        const dt_tensor_info *ti = &m->buffer_tensors[t];
        if (ti->numel)
            rc = add_piece(&v, &cnt, &cap, "", ti, 0, 0, ti->numel, m->buffers + ti->offset);
    }
    free(own);
    if (rc) {
        free(v);
        return dt_err_set(err, -ENOMEM, "out of memory listing the checkpoint's pieces");
    }
    *out = v;
    *n = cnt;
    return 0;
}

int dt_strategy_state_whole(dt_strategy *s, dt_ckpt_buf *bufs, int cap, int *n, dt_err *err)
{
    return dt_strategy_state_bufs(s, s->model->params, NULL, bufs, cap, n, err);
}

int dt_strategy_eval_whole(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                           dt_err *err)
{
    dt_model *m = s->model;
    int rc = m->ops->forward(m, batch, false, loss, err);
    if (!rc)
        *correct = m->last_correct;
    return rc;
}

int dt_strategy_clip_whole(dt_strategy *s, double unscale, double *norm, dt_err *err)
{
    (void)err;
    dt_model *m = s->model;
    if (unscale != 1.0)
        s->be->scale(s->be, m->grads, m->num_params, (float)unscale);
    *norm = dt_optim_clip(s->optim, m->grads);
    return 0;
}

int dt_strategy_optim_step_whole(dt_strategy *s, double lr, dt_err *err)
{
    (void)err;
    dt_optim_step(s->optim, s->model->params, s->model->grads, lr);
    return 0;
}

void dt_strategy_zero_grads_whole(dt_strategy *s)
{
    s->be->memset_zero(s->be, s->model->grads, sizeof(float) * s->model->num_params);
}

dt_backend *dt_strategy_backend_one(dt_strategy *s, int k)
{
    (void)k;
    return s->be;
}

/* ---- a model split over ranks, and its whole tensors ---------------------------------------- */

int dt_strategy_state_staged(const dt_strategy *s, const dt_tensor_info *whole, int nwhole,
                             const dt_staging *st, dt_ckpt_buf *bufs, int cap, int *n,
                             dt_err *err)
{
    const dt_optim *o = s->optim;
    if (cap < 1 + o->num_states || st->n < 1 + o->num_states)
        return dt_err_set(err, -ENOSPC, "checkpoint buffers: room for %d, %d needed", cap,
                          1 + o->num_states);
    bufs[0] = (dt_ckpt_buf){"model", "", whole, nwhole, st->buf[0], st->numel, false};
    for (int i = 0; i < o->num_states; i++)
        bufs[1 + i] = (dt_ckpt_buf){"optim", o->states[i].prefix, whole, nwhole, st->buf[1 + i],
                                    st->numel, false};
    *n = 1 + o->num_states;
    return 0;
}


/* Whether any of m's tensors is a slice (tp_parts > 0) rather than whole. */
static bool any_split(const dt_model *m)
{
    for (int i = 0; i < m->num_tensors; i++)
        if (m->tensors[i].tp_parts > 0)
            return true;
    return false;
}

/* One past the last float the whole tensors of m's table reach at offs[]. */
static size_t whole_end(const dt_model *m, const size_t *offs)
{
    size_t end = 0;
    for (int i = 0; i < m->num_tensors; i++)
        end = DT_MAX(end, offs[i] + dt_tensor_whole_numel(&m->tensors[i]));
    return end;
}

int dt_strategy_tp_gather(dt_strategy *s, dt_comm *tp, int T, int tp_rank, const float *local,
                          float *out, const size_t *out_off, dt_err *err)
{
    const dt_model *m = s->model;
    dt_backend *be = s->be;
    const size_t n = m->num_params;
    if (T <= 1) { /* whole already */
        for (int i = 0; i < m->num_tensors; i++)
            be->memcpy_d2d(be, out + out_off[i], local + m->tensors[i].offset,
                           sizeof(float) * m->tensors[i].numel);
        return 0;
    }
    const bool host = be->host_memory; /* assembled in place, no copies */
    const size_t wn = whole_end(m, out_off);
    float *gdev = NULL, *ghost = NULL, *whost = NULL;
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER);
    int rc = be->alloc(be, (void **)&gdev, sizeof(float) * ((size_t)T * n + 1), err);
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "the tensor group's slices (%zu floats): ", (size_t)T * n);
    if (host) {
        ghost = gdev;
        whost = out;
    } else {
        ghost = malloc(sizeof(float) * ((size_t)T * n + 1));
        whost = malloc(sizeof(float) * (wn + 1));
        if (!ghost || !whost) {
            rc = dt_err_set(err, -ENOMEM, "out of memory (%zu floats of gathered slices)",
                            (size_t)T * n + wn);
            goto out;
        }
    }
    if ((rc = dt_comm_allgather(tp, local, gdev, n, DT_FLOAT32, NULL, err)))
        goto out;
    if (!host)
        be->memcpy_d2h(be, ghost, gdev, sizeof(float) * (size_t)T * n); /* (T, num_params) */
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *l = &m->tensors[i];
        float *w = whost + out_off[i];
        if (l->tp_parts <= 0) /* replicated: this rank's copy (every rank holds the same) */
            dt_tensor_tp_copy(l, tp_rank, w, ghost + (size_t)tp_rank * n + l->offset, true);
        else
            for (int r = 0; r < T; r++)
                dt_tensor_tp_copy(l, r, w, ghost + (size_t)r * n + l->offset, true);
        if (!host)
            be->memcpy_h2d(be, out + out_off[i], w,
                           sizeof(float) * dt_tensor_whole_numel(l));
    }
out:
    be->free(be, gdev);
    if (!host) {
        free(ghost);
        free(whost);
    }
    return rc;
}

int dt_strategy_tp_slice(dt_strategy *s, int tp_rank, const float *whole,
                         const size_t *whole_off, float *local, dt_err *err)
{
    const dt_model *m = s->model;
    dt_backend *be = s->be;
    if (!any_split(m)) { /* whole tensors: a copy each */
        for (int i = 0; i < m->num_tensors; i++)
            be->memcpy_d2d(be, local + m->tensors[i].offset, whole + whole_off[i],
                           sizeof(float) * m->tensors[i].numel);
        return 0;
    }
    const bool host = be->host_memory; /* assembled in place, no copies */
    const size_t wn = whole_end(m, whole_off), n = m->num_params;
    float *whost = (float *)whole, *lhost = local; /* dt_tensor_tp_copy reads whole only */
    if (!host) {
        whost = malloc(sizeof(float) * (wn + 1));
        lhost = malloc(sizeof(float) * (n + 1));
        if (!whost || !lhost) {
            free(whost);
            free(lhost);
            return dt_err_set(err, -ENOMEM, "out of memory (%zu floats of slicing)", wn + n);
        }
        be->memcpy_d2h(be, whost, whole, sizeof(float) * wn);
    }
    for (int i = 0; i < m->num_tensors; i++)
        dt_tensor_tp_copy(&m->tensors[i], tp_rank, whost + whole_off[i],
                          lhost + m->tensors[i].offset, false);
    if (!host) {
        be->memcpy_h2d(be, local, lhost, sizeof(float) * n);
        free(whost);
        free(lhost);
    }
    return 0;
}

unsigned char *dt_strategy_counted(const dt_model *m, int tp_rank, const int *skip, int nskip)
{
    unsigned char *counted = malloc((size_t)m->num_tensors + 1);
    for (int t = 0; counted && t < m->num_tensors; t++) {
        counted[t] = m->tensors[t].tp_parts > 0 || tp_rank == 0;
        for (int i = 0; counted[t] && i < nskip; i++)
            counted[t] = skip[i] != t;
    }
    return counted;
}

/* ---- a layout over a data-parallel sync ------------------------------------------------------ */

int dt_strategy_open_sync(dt_strategy *s, const dt_strategy_ctx *ctx, dt_comm *dp, dt_err *err)
{
    dt_dpsync_ctx yc = {.model = s->model, .dp = dp, .optim = ctx->optim, .ddp = ctx->ddp,
                        .announce = ctx->env->rank == 0,
                        .io_buffer = (size_t)ctx->job->ckpt_io_buffer_mb << 20};
    int rc = dt_dpsync_open(&s->sync, ctx->sync, &yc, err);
    if (!rc)
        s->optim = s->sync->optim;
    return rc;
}

int dt_strategy_sync_micro_step(dt_strategy *s, const dt_batch *batch, float dloss, bool last,
                                float *loss, dt_err *err)
{
    dt_model *m = s->model;
    dt_dpsync *y = s->sync;
    dt_dpsync_forward_begin(y, true);
    uint64_t ts = dt_trace_begin();
    int rc = m->ops->forward(m, batch, true, loss, err);
    dt_trace_end(ts, DT_TRACE_FORWARD, "forward");
    if ((rc = dt_dpsync_forward_end(y, rc, err)))
        return rc;
    /* the sync hears of finished gradients on the last micro-step only (no_sync before) */
    dt_grad_ready_fn ready;
    void *ready_ctx;
    dt_dpsync_backward_begin(y, last, &ready, &ready_ctx);
    dt_flight_phase(DT_PHASE_BACKWARD);
    ts = dt_trace_begin();
    rc = m->ops->backward(m, dloss, ready, ready_ctx, err);
    dt_trace_end(ts, DT_TRACE_BACKWARD, "backward");
    return dt_dpsync_backward_end(y, rc, err);
}

int dt_strategy_sync_eval(dt_strategy *s, const dt_batch *batch, float *loss, int64_t *correct,
                          dt_err *err)
{
    dt_model *m = s->model;
    dt_dpsync_forward_begin(s->sync, false);
    int rc = m->ops->forward(m, batch, false, loss, err);
    rc = dt_dpsync_forward_end(s->sync, rc, err);
    if (!rc)
        *correct = m->last_correct;
    return rc;
}

void dt_strategy_sync_zero_grads(dt_strategy *s) { dt_dpsync_zero_grads(s->sync); }

void dt_strategy_get_mem(dt_strategy *s, dt_strategy_mem *out)
{
    if (s->sync)
        dt_dpsync_get_mem(s->sync, out);
    else
        dt_dpsync_mem_whole(s->model, s->optim, out);
}

/* The layout's stats op, when it has one and s is open. */
static int layout_stats(dt_strategy *s, dt_strategy_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!s || !s->ops->stats || !s->impl || !s->model)
        return -EINVAL;
    s->ops->stats(s, out);
    return 0;
}

int dt_strategy_tensor_stats(dt_strategy *s, dt_tensor_stats *out)
{
    dt_strategy_stats st;
    int rc = layout_stats(s, &st);
    *out = st.tp;
    return rc ? rc : st.tensor ? 0 : -EINVAL;
}

int dt_strategy_pipeline_stats(dt_strategy *s, dt_pp_stats *out)
{
    dt_strategy_stats st;
    int rc = layout_stats(s, &st);
    *out = st.pp;
    return rc ? rc : st.pipeline ? 0 : -EINVAL;
}

int dt_strategy_sync_stats(dt_strategy *s, dt_ddp_stats *out)
{
    return s->sync ? dt_dpsync_stats(s->sync, out) : -ENOTSUP;
}
