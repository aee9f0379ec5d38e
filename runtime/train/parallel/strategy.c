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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/cpuset.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"

void dt_strategy_bind_cpus(const dt_job *j, const dt_backend *be, int local_rank,
                           int local_world)
{
    cpu_set_t base, mine;
    dt_err e = {0};
    char all[256], list[256];
    bool gpu = be->device_pci_bus_id != NULL; /* device k is local rank k's */
    if (j->cpu_bind != DT_CPU_BIND_AUTO || (!gpu && (strcmp(be->name, "cpu") || local_world < 2)))
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

int dt_strategy_open_backend(dt_strategy *s, const dt_strategy_ctx *ctx, dt_err *err)
{
    int rc = dt_backend_open(&s->be, dt_device_name(ctx->job->device), ctx->be_opts, err);
    if (rc)
        return rc;
    dt_strategy_bind_cpus(ctx->job, s->be, ctx->env->local_rank, ctx->env->local_world_size);
    return 0;
}

int dt_strategy_comm_backend(const dt_strategy *s, const dt_strategy_ctx *ctx,
                             const char **backend, dt_err *err)
{
    const dt_worker_env *e = ctx->env;
    if (!e->store_addr[0] || e->store_port <= 0)
        return dt_err_set(err, -EINVAL,
                          "WORLD_SIZE=%d but DTRAIN_STORE_ADDR/DTRAIN_STORE_PORT are not set: "
                          "start the workers with the dtrain launcher",
                          e->world_size);
    bool cuda = !strcmp(s->be->name, "cuda");
    dt_comm_backend_kind kind = ctx->job->comm_backend;
    if (kind == DT_COMM_BACKEND_AUTO)
        kind = cuda ? DT_COMM_BACKEND_NCCL : DT_COMM_BACKEND_CPU;
    if (kind == DT_COMM_BACKEND_NCCL && !cuda)
        return dt_err_set(err, -EINVAL, "ddp.backend = nccl needs device = cuda (this worker "
                                        "runs on %s); use ddp.backend = cpu or auto",
                          s->be->name);
    *backend = dt_comm_backend_name(kind);
    return 0;
}

int dt_strategy_world_comm(dt_comm **out, const dt_strategy_ctx *ctx, const char *backend,
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
    const char *backend;
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
    dt_grid g;
    int rc = dt_grid_init(&g, e->rank, e->world_size, ctx->job->tensor, ctx->job->pipeline, err);
    if (rc)
        return rc;
    dt_store *store = NULL;
    dt_store_opts so;
    dt_store_opts_default(&so);
    if ((rc = dt_store_connect(&store, e->store_addr, e->store_port, &so, err)))
        return dt_err_prefix(err, "connecting to the store at %s:%d to split the groups: ",
                             e->store_addr, e->store_port);
    rc = dt_groups_open(out, world, store, &g, err); /* the store serves the bootstrap only */
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

int dt_strategy_staging_alloc(dt_strategy_staging *st, dt_backend *be, int n, size_t numel,
                              dt_err *err)
{
    memset(st, 0, sizeof *st);
    st->n = n;
    st->numel = numel;
    size_t bytes = sizeof(float) * (numel ? numel : 1);
    dt_mem_cat old = dt_mem_tag(be, DT_MEM_OTHER); /* checkpoint staging */
    int rc = 0;
    for (int k = 0; k < n && !rc; k++)
        if (!(rc = be->alloc(be, (void **)&st->buf[k], bytes, err)))
            be->memset_zero(be, st->buf[k], bytes); /* nothing loaded: zero state */
    dt_mem_tag(be, old);
    if (rc)
        return dt_err_prefix(err, "checkpoint staging (%zu bytes x %d): ", bytes, n);
    st->resident = true;
    return 0;
}

int dt_strategy_staging_commit(dt_strategy_staging *st, dt_backend *be, dt_err *err)
{
    for (int k = 0; k < st->n && !st->resident && be->mem_commit; k++) {
        int rc = be->mem_commit(be, st->buf[k], 0, sizeof(float) * st->numel, err);
        if (rc)
            return dt_err_prefix(err, "checkpoint staging: ");
    }
    st->resident = true;
    return 0;
}

void dt_strategy_staging_release(dt_strategy_staging *st, dt_backend *be)
{
    if (!st->resident || !be->mem_release)
        return;
    for (int k = 0; k < st->n; k++)
        be->mem_release(be, st->buf[k], 0, sizeof(float) * st->numel);
    st->resident = false;
}

void dt_strategy_staging_free(dt_strategy_staging *st, dt_backend *be)
{
    for (int k = 0; k < 1 + DT_OPTIM_MAX_STATES; k++) {
        if (be)
            be->free(be, st->buf[k]);
        st->buf[k] = NULL;
    }
    st->resident = false;
}

int dt_strategy_state_staged(const dt_strategy *s, const dt_tensor_info *whole, int nwhole,
                             const dt_strategy_staging *st, dt_ckpt_buf *bufs, int cap, int *n,
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

/* Backend memory the host can address (the cpu backend's): assembled in place, no copies. */
static bool host_memory(const dt_backend *be) { return !strcmp(be->name, "cpu"); }

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
    const bool host = host_memory(be);
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
    const bool host = host_memory(be);
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

int dt_strategy_clip_split(dt_strategy *s, double unscale, int tp_rank, const int *skip,
                           int nskip, dt_comm *const *groups, int ngroups, double *scratch,
                           double *norm, dt_err *err)
{
    dt_model *m = s->model;
    dt_backend *be = s->be;
    if (unscale != 1.0)
        be->scale(be, m->grads, m->num_params, (float)unscale);
    double sum = 0;
    size_t from = 0, to = 0; /* the run of neighbouring counted tensors: one sumsq each */
    for (int t = 0; t < m->num_tensors; t++) {
        const dt_tensor_info *ti = &m->tensors[t];
        bool counted = ti->tp_parts > 0 || tp_rank == 0;
        for (int i = 0; counted && i < nskip; i++)
            counted = skip[i] != t;
        if (!counted)
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
    be->memcpy_h2d(be, scratch, &sum, sizeof sum);
    for (int g = 0; g < ngroups; g++) {
        if (!groups[g])
            continue;
        int rc = dt_comm_allreduce(groups[g], scratch, 1, DT_FLOAT64, DT_SUM, NULL, err);
        if (rc)
            return dt_err_prefix(err, "the global gradient norm: ");
    }
    be->memcpy_d2h(be, &sum, scratch, sizeof sum);
    *norm = sqrt(sum);
    double clip = s->optim->cfg.grad_clip;
    if (clip > 0 && isfinite(*norm) && *norm > clip)
        be->scale(be, m->grads, m->num_params, (float)(clip / (*norm + 1e-6)));
    return 0;
}
