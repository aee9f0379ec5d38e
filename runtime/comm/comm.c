/* comm.c - the collective-communication front end: the store bootstrap namespace, the checks
 * every backend shares (dtype, op, root), and dispatch to a backend ("cpu":
 * runtime/comm/comm_cpu.c; "nccl": libdtrain_cuda.so).
 *
 * Every communicator gets its own store namespace, comm/<run id>/<attempt>/<n>/, where n counts
 * the communicators this process created (every rank creates them in the same order). Nothing
 * an earlier attempt or another communicator left in the store can be read by a new one.
 */
#include "runtime/comm/comm.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "runtime/comm/comm_cpu.h"
#include "runtime/comm/comm_impl.h"

struct dt_comm {
    const dt_comm_backend_ops *ops;
    void *self;
    int rank, world;
};

static _Atomic uint64_t comm_counter;

/* ---- nccl: loaded from libdtrain_cuda.so ------------------------------------------------- */

static int nccl_create(const dt_comm_opts *o, dt_store *ns, const dt_comm_backend_ops **ops,
                       void **self, dt_err *err)
{
    char path[PATH_MAX];
    if (dt_cuda_lib_path(path, sizeof path) != 0 || access(path, R_OK) != 0)
        return dt_err_set(err, -ENOENT,
                          "comm backend nccl: libdtrain_cuda.so not found (this dtrain was built "
                          "without nvcc, or set DTRAIN_CUDA_LIB); use ddp.backend = cpu");
    /* Kept loaded for the life of the process, like the CUDA backend (same library). */
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h)
        return dt_err_set(err, -ENOENT, "comm backend nccl: cannot load %s: %s", path, dlerror());
    dt_nccl_get_unique_id_fn get_id =
        (dt_nccl_get_unique_id_fn)(uintptr_t)dlsym(h, DT_NCCL_GET_ID_SYMBOL);
    dt_nccl_comm_create_fn create =
        (dt_nccl_comm_create_fn)(uintptr_t)dlsym(h, DT_NCCL_CREATE_SYMBOL);
    if (!get_id || !create)
        return dt_err_set(err, -ENOENT,
                          "comm backend nccl: %s has no %s (built without NCCL?); use "
                          "ddp.backend = cpu",
                          path, !get_id ? DT_NCCL_GET_ID_SYMBOL : DT_NCCL_CREATE_SYMBOL);
    unsigned char id[DT_NCCL_ID_BYTES];
    int rc;
    if (o->rank == 0) {
        if ((rc = get_id(id, err)) != 0) {
            /* an empty id tells the others at once, instead of at their timeout */
            if (ns)
                dt_store_set(ns, "nccl_id", "", 0, NULL);
            return rc;
        }
        if (ns && (rc = dt_store_set(ns, "nccl_id", id, sizeof id, err)) != 0)
            return dt_err_prefix(err, "comm bootstrap: publishing the NCCL id: ");
    } else {
        void *v = NULL;
        size_t len = 0;
        if ((rc = dt_store_get(ns, "nccl_id", &v, &len, o->timeout_ms, err)) != 0)
            return dt_err_prefix(err, "comm bootstrap: waiting for rank 0's NCCL id: ");
        if (len == 0) {
            free(v);
            return dt_err_set(err, -EIO, "comm bootstrap: rank 0 could not create the NCCL id "
                                         "(its log says why)");
        }
        if (len != sizeof id) {
            free(v);
            return dt_err_set(err, -EPROTO, "comm bootstrap: the NCCL id has %zu bytes, not %zu",
                              len, sizeof id);
        }
        memcpy(id, v, sizeof id);
        free(v);
    }
    return create(o, id, ops, self, err);
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

int dt_comm_init(dt_comm **out, dt_store *store, const dt_comm_opts *opts, dt_err *err)
{
    dt_comm_opts o = *opts;
    if (!o.backend || !*o.backend)
        o.backend = "cpu";
    if (o.timeout_ms <= 0)
        o.timeout_ms = 300000;
    if (!o.local_addr || !*o.local_addr)
        o.local_addr = dt_env("DTRAIN_LOCAL_ADDR");
    if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
        return dt_err_set(err, -EINVAL, "comm: rank %d is not in a world of %d", o.rank,
                          o.world_size);
    if (o.world_size > 1 && !store)
        return dt_err_set(err, -EINVAL, "comm: %d ranks need a store to find each other",
                          o.world_size);
    dt_comm *c = calloc(1, sizeof *c);
    if (!c)
        return dt_err_set(err, -ENOMEM, "comm: out of memory");
    c->rank = o.rank;
    c->world = o.world_size;
    uint64_t gen = o.number ? o.number : atomic_fetch_add(&comm_counter, 1) + 1;
    dt_store *ns = NULL;
    int rc = 0;
    if (store) {
        char prefix[512];
        snprintf(prefix, sizeof prefix, "comm/%s/%d/%llu/", o.run_id ? o.run_id : "none",
                 o.attempt, (unsigned long long)gen);
        if ((rc = dt_store_prefixed(&ns, store, prefix, err)) != 0)
            goto fail;
    }
    if (!strcmp(o.backend, "cpu"))
        rc = dt_comm_cpu_create(&o, ns, gen, &c->ops, &c->self, err);
    else if (!strcmp(o.backend, "nccl"))
        rc = nccl_create(&o, ns, &c->ops, &c->self, err);
    else
        rc = dt_err_set(err, -EINVAL, "comm: unknown backend \"%s\" (use cpu or nccl)", o.backend);
    if (rc)
        goto fail;
    dt_store_free(ns);
    DT_DEBUG("comm: %s communicator %llu ready: rank %d of %d", c->ops->name,
             (unsigned long long)gen, c->rank, c->world);
    *out = c;
    return 0;
fail:
    dt_store_free(ns);
    free(c);
    return rc;
}

void dt_comm_free(dt_comm *c)
{
    if (!c)
        return;
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c->self);
    free(c);
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }

int dt_comm_world_size(const dt_comm *c) { return c ? c->world : 1; }

/* ---- dispatch ------------------------------------------------------------------------------ */

/* The reduction op on t is one every backend runs: any op on floats, sum/max/min on integers. */
static int check_reduction(const char *what, dt_dtype t, dt_redop op, dt_err *err)
{
    if (!dt_dtype_valid((int)t))
        return dt_err_set(err, -EINVAL, "%s: unknown dtype %d", what, (int)t);
    if (!dt_redop_valid((int)op))
        return dt_err_set(err, -EINVAL, "%s: unknown reduction op %d", what, (int)op);
    if (op == DT_AVG && !dt_dtype_is_float(t))
        return dt_err_set(err, -EINVAL,
                          "%s: avg of %s is not defined (it would have to round): reduce with "
                          "sum and divide as needed",
                          what, dt_dtype_name(t));
    return 0;
}

static int check_dtype(const char *what, dt_dtype t, dt_err *err)
{
    if (!dt_dtype_valid((int)t))
        return dt_err_set(err, -EINVAL, "%s: unknown dtype %d", what, (int)t);
    return 0;
}

int dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype dtype, dt_redop op,
                      dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_reduction("allreduce", dtype, op, err);
    if (rc)
        return rc;
    return c->ops->allreduce(c->self, buf, count, dtype, op, work, err);
}

int dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype dtype, dt_redop op, int root,
                   dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    if (root < 0 || root >= c->world)
        return dt_err_set(err, -EINVAL, "reduce: root %d is not a rank (world size %d)", root,
                          c->world);
    int rc = check_reduction("reduce", dtype, op, err);
    if (rc)
        return rc;
    if (!c->ops->reduce)
        return c->ops->allreduce(c->self, buf, count, dtype, op, work, err);
    return c->ops->reduce(c->self, buf, count, dtype, op, root, work, err);
}

int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root,
                      dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_dtype("broadcast", dtype, err);
    if (rc)
        return rc;
    return c->ops->broadcast(c->self, buf, count, dtype, root, work, err);
}

int dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype,
                      dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_dtype("allgather", dtype, err);
    if (rc)
        return rc;
    return c->ops->allgather(c->self, send, recv, count, dtype, work, err);
}

int dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                           dt_dtype dtype, dt_redop op, dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_reduction("reduce_scatter", dtype, op, err);
    if (rc)
        return rc;
    return c->ops->reduce_scatter(c->self, send, recv, count, dtype, op, work, err);
}

int dt_comm_barrier(dt_comm *c, dt_err *err) { return c->ops->barrier(c->self, err); }

int dt_comm_wait(dt_comm *c, dt_comm_work *work, dt_err *err)
{
    if (!work)
        return 0;
    return c->ops->wait(c->self, work, err);
}

int dt_comm_mem_alloc(dt_comm *c, size_t bytes, void **out, dt_err *err)
{
    *out = NULL;
    if (!c->ops->mem_alloc)
        return dt_err_set(err, -ENOTSUP, "comm: the %s backend has no communicator memory",
                          c->ops->name);
    return c->ops->mem_alloc(c->self, bytes, out, err);
}

void dt_comm_mem_free(dt_comm *c, void *p)
{
    if (c && p && c->ops->mem_free)
        c->ops->mem_free(c->self, p);
}
