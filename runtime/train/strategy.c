/* strategy.c - what the strategies share: binding the worker to its CPUs, the backend, the
 * world communicator, the grid's groups, the optimiser, a whole model's checkpoint buffers, and
 * the clip, update and zeroing of a gradient that lives whole on this rank; see strategy.h.
 *
 * Nothing here knows which strategy runs; the registry (strategies.c) chooses, the
 * implementations (strategy_*.c) call these. */
#include "runtime/train/strategy.h"

#include <errno.h>
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
