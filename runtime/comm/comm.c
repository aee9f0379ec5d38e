/* comm.c - the collective-communication front end: the store bootstrap namespace, the checks
 * every backend shares (dtype, op, root), and dispatch to a backend ("cpu":
 * runtime/comm/comm_cpu.c; "nccl": libdtrain_cuda.so).
 *
 * Every communicator gets its own store namespace, comm/<run id>/<attempt>/<n>/, where n counts
 * the communicators this process created (every rank creates them in the same order). Nothing
 * an earlier attempt or another communicator left in the store can be read by a new one.
 *
 * Groups (dt_comm_split): the ranks allgather (color, key) over the parent, each computes its
 * group's members ranked by (key, parent rank), and the group is bootstrapped as a communicator
 * of its own under <parent's namespace>split/<s>/<color>/, where s counts the parent's splits
 * (every rank splits in the same order): the cpu backend's topology (shared memory per host,
 * TCP ring) is derived among the members alone, with its own comm thread and point-to-point
 * engine. Its number (shared-memory names, ring tag) is a hash of that namespace, never one of
 * the per-process counter. A backend that splits itself (nccl: ncclCommSplit) does so instead.
 * Each communicator keeps the global rank of each of its ranks (dt_comm_global_rank).
 *
 * Counters (dt_comm_stats): every dt_comm_* call that reaches a backend goes through the
 * dispatch below, which counts it (calls and nccl-tests' size in bytes, per op) after the backend
 * accepted it, and adds the time a blocking call or a wait held its caller. Relaxed atomics in
 * the dt_comm itself: no lock, and nothing a backend has to do.
 */
#include "runtime/comm/comm.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
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
    int *global;         /* (world) global rank of each rank; NULL in a world (identity) */
    dt_comm_opts opts;   /* as created (strings below), for the groups split from it */
    char *run_id, *local_addr;
    char prefix[512];    /* store namespace */
    uint64_t nsplits;
    /* counters (see dt_comm_stats): relaxed atomics, zeroed by calloc */
    _Atomic uint64_t calls[DT_COMM_OP_COUNT];
    _Atomic uint64_t bytes[DT_COMM_OP_COUNT];
    _Atomic uint64_t wait_ns;
    _Atomic uint64_t ring_sent; /* backends without sent_bytes: the ring's share of each call */
    uint64_t sent_base;  /* the backend's sent_bytes at the last reset */
    /* the observer's (see dt_comm_observer): under obs_mu */
    char label[16];
    uint64_t uid;        /* hash of prefix: the same on every member */
    pthread_mutex_t obs_mu;
    uint64_t obs_seq;    /* collectives issued */
    uint64_t *p2p_seq;   /* (2 x world) sends to / receives from each rank, or NULL */
    struct obs_pending { dt_comm_work *w; uint64_t token; } *pend; /* issued, not waited */
    size_t npend, cap_pend;
};

static _Atomic uint64_t comm_counter;

static uint64_t fnv1a64(const char *s);

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

static void free_comm(dt_comm *c)
{
    if (!c)
        return;
    pthread_mutex_destroy(&c->obs_mu);
    free(c->p2p_seq);
    free(c->pend);
    free(c->global);
    free(c->run_id);
    free(c->local_addr);
    free(c);
}

/* Keeps o (its strings copied) for the groups split from c. */
static int keep_opts(dt_comm *c, const dt_comm_opts *o, dt_err *err)
{
    c->opts = *o;
    c->run_id = strdup(o->run_id ? o->run_id : "none");
    c->local_addr = o->local_addr ? strdup(o->local_addr) : NULL;
    if (!c->run_id || (o->local_addr && !c->local_addr))
        return dt_err_set(err, -ENOMEM, "comm: out of memory");
    c->opts.run_id = c->run_id;
    c->opts.local_addr = c->local_addr;
    return 0;
}

int dt_comm_init(dt_comm **out, dt_store *store, const dt_comm_opts *opts, dt_err *err)
{
    dt_comm_opts o = *opts;
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
    pthread_mutex_init(&c->obs_mu, NULL);
    dt_strlcpy(c->label, "world", sizeof c->label);
    uint64_t gen = o.number ? o.number : atomic_fetch_add(&comm_counter, 1) + 1;
    dt_store *ns = NULL;
    int rc = 0;
    snprintf(c->prefix, sizeof c->prefix, "comm/%s/%d/%llu/", o.run_id ? o.run_id : "none",
             o.attempt, (unsigned long long)gen);
    c->uid = fnv1a64(c->prefix);
    if ((rc = keep_opts(c, &o, err)) != 0)
        goto fail;
    if (store && (rc = dt_store_prefixed(&ns, store, c->prefix, err)) != 0)
        goto fail;
    if (o.backend == DT_COMM_CPU)
        rc = dt_comm_cpu_create(&o, ns, gen, NULL, &c->ops, &c->self, err);
    else if (o.backend == DT_COMM_NCCL)
        rc = nccl_create(&o, ns, &c->ops, &c->self, err);
    else
        rc = dt_err_set(err, -EINVAL, "comm: unknown backend %d (use cpu or nccl)",
                        (int)o.backend);
    if (rc)
        goto fail;
    dt_store_free(ns);
    DT_DEBUG("comm: %s communicator %llu ready: rank %d of %d", c->ops->name,
             (unsigned long long)gen, c->rank, c->world);
    *out = c;
    return 0;
fail:
    dt_store_free(ns);
    free_comm(c);
    return rc;
}

void dt_comm_free(dt_comm *c)
{
    if (!c)
        return;
    if (c->ops && c->ops->destroy)
        c->ops->destroy(c->self);
    free_comm(c);
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : 0; }

int dt_comm_world_size(const dt_comm *c) { return c ? c->world : 1; }

/* ---- counters ------------------------------------------------------------------------------ */

static const char *const op_names[DT_COMM_OP_COUNT] = {
    [DT_COMM_OP_ALLREDUCE] = "allreduce", [DT_COMM_OP_REDUCE] = "reduce",
    [DT_COMM_OP_BROADCAST] = "broadcast", [DT_COMM_OP_ALLGATHER] = "allgather",
    [DT_COMM_OP_REDUCE_SCATTER] = "reduce_scatter", [DT_COMM_OP_BARRIER] = "barrier",
    [DT_COMM_OP_SEND] = "send", [DT_COMM_OP_RECV] = "recv",
};

const char *dt_comm_op_name(dt_comm_op op)
{
    return (int)op >= 0 && op < DT_COMM_OP_COUNT ? op_names[op] : "?";
}

/* What a ring algorithm has each rank send for a call of size bytes (nccl-tests' bus bandwidth
 * factor): for a backend whose transports do not count (nccl). */
static uint64_t ring_share(const dt_comm *c, dt_comm_op op, uint64_t bytes)
{
    uint64_t n = (uint64_t)c->world;
    switch (op) {
    case DT_COMM_OP_ALLREDUCE:
        return bytes * 2 * (n - 1) / n;
    case DT_COMM_OP_REDUCE:
    case DT_COMM_OP_BROADCAST:
    case DT_COMM_OP_ALLGATHER:
    case DT_COMM_OP_REDUCE_SCATTER:
        return bytes * (n - 1) / n;
    case DT_COMM_OP_SEND:
        return bytes;
    default:
        return 0;
    }
}

static void count_op(dt_comm *c, dt_comm_op op, uint64_t bytes)
{
    atomic_fetch_add_explicit(&c->calls[op], 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&c->bytes[op], bytes, memory_order_relaxed);
    if (!c->ops->sent_bytes)
        atomic_fetch_add_explicit(&c->ring_sent, ring_share(c, op, bytes), memory_order_relaxed);
}

static uint64_t sent_now(const dt_comm *c)
{
    if (c->ops->sent_bytes)
        return c->ops->sent_bytes(c->self);
    return atomic_load_explicit(&((dt_comm *)(uintptr_t)c)->ring_sent, memory_order_relaxed);
}

/* The dispatch's epilogue: counts an accepted call (rc == 0), and for a blocking one (no work
 * handle) the time since t0 it held its caller. Returns rc. */
static int counted(dt_comm *c, int rc, dt_comm_op op, uint64_t bytes, bool blocking, uint64_t t0)
{
    if (rc == 0)
        count_op(c, op, bytes);
    if (blocking)
        atomic_fetch_add_explicit(&c->wait_ns, dt_now_ns() - t0, memory_order_relaxed);
    return rc;
}

static uint64_t size_of(size_t count, dt_dtype t) { return (uint64_t)count * dt_dtype_size(t); }

void dt_comm_stats_get(const dt_comm *c, dt_comm_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!c)
        return;
    /* the counters are only ever read here: casting const away for the atomic loads is safe */
    dt_comm *m = (dt_comm *)(uintptr_t)c;
    for (int i = 0; i < DT_COMM_OP_COUNT; i++) {
        out->calls[i] = atomic_load_explicit(&m->calls[i], memory_order_relaxed);
        out->bytes[i] = atomic_load_explicit(&m->bytes[i], memory_order_relaxed);
    }
    out->wait_s = (double)atomic_load_explicit(&m->wait_ns, memory_order_relaxed) * 1e-9;
    uint64_t sent = sent_now(c);
    out->sent_bytes = sent > m->sent_base ? sent - m->sent_base : 0;
}

void dt_comm_stats_reset(dt_comm *c)
{
    if (!c)
        return;
    for (int i = 0; i < DT_COMM_OP_COUNT; i++) {
        atomic_store_explicit(&c->calls[i], 0, memory_order_relaxed);
        atomic_store_explicit(&c->bytes[i], 0, memory_order_relaxed);
    }
    atomic_store_explicit(&c->wait_ns, 0, memory_order_relaxed);
    atomic_store_explicit(&c->ring_sent, 0, memory_order_relaxed);
    c->sent_base = c->ops->sent_bytes ? c->ops->sent_bytes(c->self) : 0;
}

void dt_comm_stats_sub(const dt_comm_stats *after, const dt_comm_stats *before,
                       dt_comm_stats *out)
{
    dt_comm_stats d;
    for (int i = 0; i < DT_COMM_OP_COUNT; i++) {
        d.calls[i] = after->calls[i] - before->calls[i];
        d.bytes[i] = after->bytes[i] - before->bytes[i];
    }
    d.wait_s = after->wait_s - before->wait_s;
    d.sent_bytes = after->sent_bytes - before->sent_bytes;
    *out = d;
}

/* ---- the observer (flight records) ------------------------------------------------------- */

static dt_comm_observer obs;
static _Atomic int obs_on;

void dt_comm_set_observer(const dt_comm_observer *o)
{
    atomic_store(&obs_on, 0);
    if (o) {
        obs = *o;
        atomic_store(&obs_on, 1);
    }
}

void dt_comm_set_label(dt_comm *c, const char *label)
{
    if (c && label)
        dt_strlcpy(c->label, label, sizeof c->label);
}

const char *dt_comm_label(const dt_comm *c)
{
    return c ? c->label : "";
}

/* One call as the observer sees it, from its issue to its end. */
typedef struct obs_call {
    uint64_t token; /* 0: not observed */
    int action;
} obs_call;

/* Tells the observer of a call about to go to the backend (seq: 0 = the next collective's,
 * else the point-to-point number given). Returns the action it asks for. */
static int obs_issue(dt_comm *c, obs_call *oc, dt_comm_op op, dt_dtype t, size_t count,
                     int peer, uint64_t seq, bool blocking)
{
    oc->token = 0;
    oc->action = DT_COMM_OBS_RUN;
    if (!atomic_load_explicit(&obs_on, memory_order_acquire))
        return DT_COMM_OBS_RUN;
    dt_comm_call call = {.group = c->label, .group_id = c->uid, .group_rank = c->rank,
                         .group_size = c->world, .members = c->global, .op = op, .dtype = t,
                         .count = count, .peer = peer >= 0 ? dt_comm_global_rank(c, peer) : -1};
    pthread_mutex_lock(&c->obs_mu);
    call.seq = seq ? seq : c->obs_seq + 1;
    oc->token = obs.issue(obs.arg, &call, &oc->action);
    if (!seq && oc->action != DT_COMM_OBS_SKIP)
        c->obs_seq++; /* a skipped call takes no number: the next one takes it */
    pthread_mutex_unlock(&c->obs_mu);
    if (oc->action == DT_COMM_OBS_SKIP) {
        if (oc->token)
            obs.end(obs.arg, oc->token, 0, dt_now_ns(), "");
        oc->token = 0;
    } else if (blocking && oc->token) {
        obs.wait(obs.arg, oc->token);
    }
    return oc->action;
}

/* After the backend took the call (rc): a blocking call ended (t0: its start); an asynchronous
 * one is remembered under its work handle until it is waited. */
static void obs_issued(dt_comm *c, const obs_call *oc, int rc, dt_comm_work *w, bool blocking,
                       uint64_t t0, const dt_err *err)
{
    if (!atomic_load_explicit(&obs_on, memory_order_acquire))
        return;
    uint64_t now = dt_now_ns();
    if (blocking)
        obs.blocked(obs.arg, t0, now);
    if (!oc->token)
        return;
    if (blocking || rc || !w) {
        obs.end(obs.arg, oc->token, rc, now, rc && err ? err->msg : "");
        return;
    }
    pthread_mutex_lock(&c->obs_mu);
    if (c->npend == c->cap_pend) {
        size_t cap = c->cap_pend ? 2 * c->cap_pend : 16;
        struct obs_pending *p = realloc(c->pend, cap * sizeof *p);
        if (p) {
            c->pend = p;
            c->cap_pend = cap;
        }
    }
    if (c->npend < c->cap_pend) /* else (out of memory) the record stays "queued" */
        c->pend[c->npend++] = (struct obs_pending){w, oc->token};
    pthread_mutex_unlock(&c->obs_mu);
}

/* Takes the tokens issued under w out of the pending list (up to cap; a point-to-point batch
 * has one per op) and returns how many. */
static size_t obs_take(dt_comm *c, dt_comm_work *w, uint64_t *tokens, size_t cap)
{
    size_t n = 0;
    pthread_mutex_lock(&c->obs_mu);
    for (size_t i = 0; i < c->npend;) {
        if (c->pend[i].w == w) {
            if (n < cap)
                tokens[n++] = c->pend[i].token;
            c->pend[i] = c->pend[--c->npend];
        } else {
            i++;
        }
    }
    pthread_mutex_unlock(&c->obs_mu);
    return n;
}

/* The wait on w, observed: *done_ns (may be NULL) = when it finished. */
static int observed_wait(dt_comm *c, dt_comm_work *w, uint64_t *done_ns, dt_err *err)
{
    uint64_t tok[64];
    bool on = atomic_load_explicit(&obs_on, memory_order_acquire);
    size_t n = on ? obs_take(c, w, tok, DT_ARRAY_LEN(tok)) : 0;
    for (size_t i = 0; i < n; i++)
        obs.wait(obs.arg, tok[i]);
    uint64_t t0 = dt_now_ns(), done = 0;
    int rc = c->ops->wait_done ? c->ops->wait_done(c->self, w, &done, err)
                               : c->ops->wait(c->self, w, err);
    uint64_t t1 = dt_now_ns();
    atomic_fetch_add_explicit(&c->wait_ns, t1 - t0, memory_order_relaxed);
    if (done == 0 || done > t1 || rc)
        done = t1; /* a backend that could not tell, or a failure: when the wait returned */
    if (on) {
        obs.blocked(obs.arg, t0, t1);
        for (size_t i = 0; i < n; i++)
            obs.end(obs.arg, tok[i], rc, done, rc && err ? err->msg : "");
    }
    if (done_ns)
        *done_ns = done;
    return rc;
}

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
    uint64_t t0 = work ? 0 : dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_ALLREDUCE, dtype, count, -1, 0, !work) == DT_COMM_OBS_SKIP)
        return 0;
    rc = c->ops->allreduce(c->self, buf, count, dtype, op, work, err);
    obs_issued(c, &oc, rc, work ? *work : NULL, !work, t0, err);
    return counted(c, rc, DT_COMM_OP_ALLREDUCE, size_of(count, dtype), !work, t0);
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
    uint64_t t0 = work ? 0 : dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_REDUCE, dtype, count, root, 0, !work) == DT_COMM_OBS_SKIP)
        return 0;
    if (!c->ops->reduce)
        rc = c->ops->allreduce(c->self, buf, count, dtype, op, work, err);
    else
        rc = c->ops->reduce(c->self, buf, count, dtype, op, root, work, err);
    obs_issued(c, &oc, rc, work ? *work : NULL, !work, t0, err);
    return counted(c, rc, DT_COMM_OP_REDUCE, size_of(count, dtype), !work, t0);
}

int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root,
                      dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_dtype("broadcast", dtype, err);
    if (rc)
        return rc;
    uint64_t t0 = work ? 0 : dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_BROADCAST, dtype, count, root, 0, !work) ==
        DT_COMM_OBS_SKIP)
        return 0;
    rc = c->ops->broadcast(c->self, buf, count, dtype, root, work, err);
    obs_issued(c, &oc, rc, work ? *work : NULL, !work, t0, err);
    return counted(c, rc, DT_COMM_OP_BROADCAST, size_of(count, dtype), !work, t0);
}

int dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype,
                      dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_dtype("allgather", dtype, err);
    if (rc)
        return rc;
    uint64_t t0 = work ? 0 : dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_ALLGATHER, dtype, count, -1, 0, !work) == DT_COMM_OBS_SKIP)
        return 0;
    rc = c->ops->allgather(c->self, send, recv, count, dtype, work, err);
    obs_issued(c, &oc, rc, work ? *work : NULL, !work, t0, err);
    return counted(c, rc, DT_COMM_OP_ALLGATHER, (uint64_t)c->world * size_of(count, dtype),
                   !work, t0);
}

int dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                           dt_dtype dtype, dt_redop op, dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    int rc = check_reduction("reduce_scatter", dtype, op, err);
    if (rc)
        return rc;
    uint64_t t0 = work ? 0 : dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_REDUCE_SCATTER, dtype, count, -1, 0, !work) ==
        DT_COMM_OBS_SKIP)
        return 0;
    rc = c->ops->reduce_scatter(c->self, send, recv, count, dtype, op, work, err);
    obs_issued(c, &oc, rc, work ? *work : NULL, !work, t0, err);
    return counted(c, rc, DT_COMM_OP_REDUCE_SCATTER, (uint64_t)c->world * size_of(count, dtype),
                   !work, t0);
}

int dt_comm_barrier(dt_comm *c, dt_err *err)
{
    uint64_t t0 = dt_now_ns();
    obs_call oc;
    if (obs_issue(c, &oc, DT_COMM_OP_BARRIER, DT_UINT8, 0, -1, 0, true) == DT_COMM_OBS_SKIP)
        return 0;
    int rc = c->ops->barrier(c->self, err);
    obs_issued(c, &oc, rc, NULL, true, t0, err);
    return counted(c, rc, DT_COMM_OP_BARRIER, 0, true, t0);
}

int dt_comm_wait(dt_comm *c, dt_comm_work *work, dt_err *err)
{
    if (!work)
        return 0;
    return observed_wait(c, work, NULL, err);
}

int dt_comm_wait_done(dt_comm *c, dt_comm_work *work, uint64_t *done_ns, dt_err *err)
{
    if (!work) {
        *done_ns = dt_now_ns();
        return 0;
    }
    return observed_wait(c, work, done_ns, err);
}

int dt_comm_mem_alloc(dt_comm *c, size_t bytes, void **out, dt_err *err)
{
    *out = NULL;
    if (!c->ops->mem_alloc)
        return dt_err_set(err, -ENOTSUP, "comm: the %s backend has no communicator memory",
                          c->ops->name);
    /* a collective of the cpu backend's sequence: it takes a number (not recorded) */
    pthread_mutex_lock(&c->obs_mu);
    c->obs_seq++;
    pthread_mutex_unlock(&c->obs_mu);
    return c->ops->mem_alloc(c->self, bytes, out, err);
}

void dt_comm_mem_free(dt_comm *c, void *p)
{
    if (c && p && c->ops->mem_free)
        c->ops->mem_free(c->self, p);
}

/* ---- groups and point-to-point ---------------------------------------------------------------- */

int dt_comm_global_rank(const dt_comm *c, int r)
{
    if (!c || r < 0 || r >= c->world)
        return -1;
    return c->global ? c->global[r] : r;
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

int dt_comm_split(dt_comm *c, dt_store *store, int color, int key, dt_comm **out, dt_err *err)
{
    *out = NULL;
    const int n = c->world;
    if (color < 0)
        color = -1;
    int32_t mine[2] = {color, key};
    int32_t *all = malloc((size_t)n * 2 * sizeof *all);
    int *members = malloc((size_t)n * sizeof *members);
    dt_comm *g = calloc(1, sizeof *g);
    int rc = 0;
    dt_store *ns = NULL;
    if (!all || !members || !g) {
        free(g);
        g = NULL;
        rc = dt_err_set(err, -ENOMEM, "comm split: out of memory");
        goto out;
    }
    pthread_mutex_init(&g->obs_mu, NULL);
    dt_strlcpy(g->label, "group", sizeof g->label);
    /* Every rank of c takes part, whatever its color: the split is a collective of c. */
    if ((rc = dt_comm_allgather(c, mine, all, 2, DT_INT32, NULL, err)) != 0) {
        dt_err_prefix(err, "comm split (global rank %d): exchanging colors and keys: ",
                      dt_comm_global_rank(c, c->rank));
        goto out;
    }
    const uint64_t split_no = ++c->nsplits;
    /* Members: ranks of my color, ordered by (key, rank in c) (insertion sort: stable). */
    int m = 0, me = -1;
    if (color >= 0)
        for (int r = 0; r < n; r++) {
            if (all[2 * r] != color)
                continue;
            int i = m++;
            while (i > 0 && all[2 * members[i - 1] + 1] > all[2 * r + 1]) {
                members[i] = members[i - 1];
                i--;
            }
            members[i] = r;
        }
    for (int i = 0; i < m; i++)
        if (members[i] == c->rank)
            me = i;
    if (color >= 0 && me < 0) { /* cannot happen: my own entry has my color */
        rc = dt_err_set(err, -EPROTO, "comm split: rank %d is missing from its own group",
                        c->rank);
        goto out;
    }
    dt_comm_opts o = c->opts;
    o.rank = color >= 0 ? me : 0;
    o.world_size = color >= 0 ? m : 1;
    o.number = 0;
    if ((rc = keep_opts(g, &o, err)) != 0)
        goto out;
    g->rank = o.rank;
    g->world = o.world_size;
    int pn = snprintf(g->prefix, sizeof g->prefix, "%ssplit/%llu/%d/", c->prefix,
                      (unsigned long long)split_no, color);
    if (pn < 0 || (size_t)pn >= sizeof g->prefix) {
        rc = dt_err_set(err, -ENAMETOOLONG, "comm split: groups nested too deep (store "
                        "namespace over %zu bytes)", sizeof g->prefix);
        goto out;
    }
    g->uid = fnv1a64(g->prefix);
    if (color >= 0) {
        if (!(g->global = malloc((size_t)m * sizeof *g->global))) {
            rc = dt_err_set(err, -ENOMEM, "comm split: out of memory");
            goto out;
        }
        for (int i = 0; i < m; i++)
            g->global[i] = dt_comm_global_rank(c, members[i]);
    }
    if (c->ops->split) {
        rc = c->ops->split(c->self, color, key, &g->opts, &g->ops, &g->self, err);
        if (rc) {
            dt_err_prefix(err, "comm split (global rank %d, color %d): ",
                          dt_comm_global_rank(c, c->rank), color);
            goto out;
        }
        if (color < 0) {
            if (g->self && g->ops && g->ops->destroy)
                g->ops->destroy(g->self);
            goto out;
        }
    } else {
        if (color < 0)
            goto out;
        if (g->opts.backend != DT_COMM_CPU) {
            rc = dt_err_set(err, -ENOTSUP, "comm split: the %s backend cannot split",
                            dt_comm_kind_name(g->opts.backend));
            goto out;
        }
        if (m > 1 && !store) {
            rc = dt_err_set(err, -EINVAL,
                            "comm split: the cpu backend bootstraps a group of %d ranks through "
                            "the store: pass the store the world was created with",
                            m);
            goto out;
        }
        if (m > 1 && (rc = dt_store_prefixed(&ns, store, g->prefix, err)) != 0)
            goto out;
        /* The top bit keeps the number apart from the per-process counter's. */
        uint64_t gen = fnv1a64(g->prefix) | (1ull << 63);
        if ((rc = dt_comm_cpu_create(&g->opts, ns, gen, g->global, &g->ops, &g->self, err))) {
            dt_err_prefix(err, "comm split (global rank %d, color %d, rank %d of %d in the "
                               "group): ",
                          dt_comm_global_rank(c, c->rank), color, me, m);
            goto out;
        }
    }
    DT_DEBUG("comm: split %llu: global rank %d is rank %d of %d in group %d",
             (unsigned long long)split_no, dt_comm_global_rank(c, c->rank), g->rank, g->world,
             color);
    *out = g;
    g = NULL;
out:
    dt_store_free(ns);
    free_comm(g);
    free(all);
    free(members);
    return rc;
}

/* The observer's records of a batch's ops (a point-to-point number each: per peer and
 * direction), for the first 64 ops of a batch. Their tokens wait in p2p_tok (the calling
 * thread's) until observed_p2p files them under the batch's work. */
static _Thread_local uint64_t p2p_tok[64];

static int observe_p2p(dt_comm *c, const dt_p2p_op *ops, int n, bool blocking, dt_p2p_op **mine,
                       dt_err *err)
{
    *mine = NULL;
    if (!atomic_load_explicit(&obs_on, memory_order_acquire))
        return 0;
    pthread_mutex_lock(&c->obs_mu);
    if (!c->p2p_seq && !(c->p2p_seq = calloc(2 * (size_t)c->world, sizeof *c->p2p_seq))) {
        pthread_mutex_unlock(&c->obs_mu);
        return dt_err_set(err, -ENOMEM, "p2p: out of memory");
    }
    uint64_t seq[64];
    for (int i = 0; i < n && i < 64; i++)
        seq[i] = ++c->p2p_seq[2 * ops[i].peer + (ops[i].kind == DT_P2P_RECV)];
    pthread_mutex_unlock(&c->obs_mu);
    for (int i = 0; i < n && i < 64; i++) {
        const dt_p2p_op *o = &ops[i];
        obs_call oc;
        int act = obs_issue(c, &oc, o->kind == DT_P2P_SEND ? DT_COMM_OP_SEND : DT_COMM_OP_RECV,
                            o->dtype, o->count, o->peer, seq[i], blocking);
        p2p_tok[i] = oc.token;
        if (act != DT_COMM_OBS_HALVE || o->kind != DT_P2P_RECV)
            continue;
        if (!*mine) {
            if (!(*mine = malloc((size_t)n * sizeof **mine)))
                return dt_err_set(err, -ENOMEM, "p2p: out of memory");
            memcpy(*mine, ops, (size_t)n * sizeof **mine);
        }
        (*mine)[i].count = o->count / 2;
    }
    return 0;
}

/* After the backend took the batch: as obs_issued, for each of its ops. */
static void observed_p2p(dt_comm *c, int n, int rc, dt_comm_work *w, bool blocking,
                         uint64_t t0, const dt_err *err)
{
    if (!atomic_load_explicit(&obs_on, memory_order_acquire))
        return;
    for (int i = 0; i < n && i < 64; i++) {
        obs_call oc = {p2p_tok[i], DT_COMM_OBS_RUN};
        /* the blocked interval once for the batch */
        if (blocking && i > 0) {
            if (oc.token)
                obs.end(obs.arg, oc.token, rc, dt_now_ns(), rc && err ? err->msg : "");
            continue;
        }
        obs_issued(c, &oc, rc, w, blocking, t0, err);
    }
}

int dt_comm_p2p(dt_comm *c, const dt_p2p_op *ops, int n, dt_comm_work **work, dt_err *err)
{
    if (work)
        *work = NULL;
    if (n < 0 || (n > 0 && !ops))
        return dt_err_set(err, -EINVAL, "p2p: %d operations", n);
    for (int i = 0; i < n; i++) {
        const dt_p2p_op *o = &ops[i];
        const char *what = o->kind == DT_P2P_SEND ? "send" : "receive";
        if (o->kind != DT_P2P_SEND && o->kind != DT_P2P_RECV)
            return dt_err_set(err, -EINVAL,
                              "p2p: operation %d has kind %d (use DT_P2P_SEND or DT_P2P_RECV)", i,
                              (int)o->kind);
        if (o->peer < 0 || o->peer >= c->world)
            return dt_err_set(err, -EINVAL,
                              "p2p: %s %d names peer %d, not a rank of this communicator of %d",
                              what, i, o->peer, c->world);
        if (o->peer == c->rank)
            return dt_err_set(err, -EINVAL,
                              "p2p: %s %d names rank %d (global rank %d), the caller itself: copy "
                              "instead",
                              what, i, c->rank, dt_comm_global_rank(c, c->rank));
        if (!dt_dtype_valid((int)o->dtype))
            return dt_err_set(err, -EINVAL, "p2p: %s %d has unknown dtype %d", what, i,
                              (int)o->dtype);
    }
    if (!c->ops->p2p)
        return dt_err_set(err, -ENOTSUP, "p2p: the %s backend has no point-to-point",
                          c->ops->name);
    uint64_t t0 = work ? 0 : dt_now_ns();
    dt_p2p_op *mine = NULL; /* the batch as an observer changed it (a fault's halved receive) */
    int rc = observe_p2p(c, ops, n, !work, &mine, err);
    if (rc)
        return rc;
    rc = c->ops->p2p(c->self, mine ? mine : ops, n, work, err);
    free(mine);
    observed_p2p(c, n, rc, work ? *work : NULL, !work, t0, err);
    if (rc == 0)
        for (int i = 0; i < n; i++)
            count_op(c, ops[i].kind == DT_P2P_SEND ? DT_COMM_OP_SEND : DT_COMM_OP_RECV,
                     size_of(ops[i].count, ops[i].dtype));
    if (!work)
        atomic_fetch_add_explicit(&c->wait_ns, dt_now_ns() - t0, memory_order_relaxed);
    return rc;
}

int dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer,
                 dt_comm_work **work, dt_err *err)
{
    dt_p2p_op op = {DT_P2P_SEND, (void *)(uintptr_t)buf, count, dtype, peer};
    return dt_comm_p2p(c, &op, 1, work, err);
}

int dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer,
                 dt_comm_work **work, dt_err *err)
{
    dt_p2p_op op = {DT_P2P_RECV, buf, count, dtype, peer};
    return dt_comm_p2p(c, &op, 1, work, err);
}
