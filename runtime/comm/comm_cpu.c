/* comm_cpu.c - the "cpu" collective backend: bootstrap, topology, the comm thread, and the
 * composition of the shared-memory and TCP-ring transports; see comm_cpu.h.
 *
 * Bootstrap (through the store view comm.c hands us, already namespaced by run id, attempt and
 * communicator number): every rank opens two listening TCP sockets (the ring's and the
 * point-to-point engine's), publishes "host id, address, ports, pid" under peer/<rank>, and reads
 * everyone's. Ranks with the same host id (host name +
 * kernel boot id + the device of /dev/shm, or DTRAIN_COMM_HOST_ID) share a segment created by the host's first rank
 * (announced under shm/<host>); the first rank of each host joins the ring between hosts.
 *
 * Execution: collectives are queued in issue order and executed one at a time by the comm
 * thread, so they overlap with whatever the issuing thread does next (backward, in DDP). A
 * blocking call (work == NULL) that finds the queue empty runs on the caller's thread instead,
 * which saves two thread hand-offs on small latency-bound collectives. The first failure makes
 * the communicator unusable: later and queued collectives fail at once with the first error,
 * and the peers are told (shared-memory abort flag, closed sockets) so that they fail promptly
 * instead of waiting for their timeout.
 */
#include "runtime/comm/comm_cpu.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/coll.h"
#include "runtime/comm/comm_p2p.h"
#include "runtime/comm/comm_reduce.h"
#include "runtime/comm/comm_shm.h"
#include "runtime/comm/comm_tcp.h"

/* A queued or running collective; the backend's type behind dt_comm_work. */
struct dt_comm_work {
    dt_coll_desc desc;
    void *buf;          /* allreduce, broadcast: in place */
    const void *send;   /* allgather, reduce_scatter */
    void *recv;
    dt_p2p_batch *batch; /* a point-to-point batch (comm_p2p.c runs it; nothing else is set) */
    int state;          /* 0 queued, 1 running, 2 finished */
    uint64_t done_ns;   /* when it finished (dt_now_ns; written before state = 2, under mu) */
    int rc;
    dt_err err;
    struct dt_comm_work *next;     /* queue */
    struct dt_comm_work *all_next; /* every handle not yet waited, for destroy */
    struct dt_comm_work **all_prev;
};

typedef struct peer {
    char host[160];
    char addr[256];
    int port;
    int p2p_port;
    int pid;
} peer;

typedef struct cpu_comm {
    int rank, world, timeout_ms;
    /* topology */
    int nhosts, host;        /* hosts, this rank's host index (hosts in order of first rank) */
    int local_rank, local_size;
    int *host_of;            /* (world) host index of each rank */
    int *local_of;           /* (world) index of each rank on its host */
    int *host_ranks;         /* (nhosts * max_local) ranks of each host, in rank order */
    int *host_size;          /* (nhosts) */
    int max_local;
    bool flat_tcp;           /* every rank is a ring member (no shared memory) */
    bool ring_only;          /* flat_tcp, or one rank per host: ring member index = rank */
    bool hier;               /* shared memory on hosts + ring between hosts */
    dt_shm *shm;             /* NULL when alone on the host or flat_tcp */
    dt_ring *ring;           /* NULL when not a ring member or the ring has one member */
    dt_p2p *p2p;             /* point-to-point engine (its own thread, started on first use) */
    int *global_of;          /* (world) global rank of each rank (the world's, for a group) */
    /* queue */
    pthread_mutex_t mu;
    pthread_cond_t work_cv, done_cv;
    pthread_t thread;
    bool thread_started, stop, busy;
    _Atomic int waiters;     /* callers blocked in cpu_wait: the comm thread need not yield */
    dt_comm_work *head, *tail;
    dt_comm_work *all;       /* handles not yet waited */
    uint64_t seq;
    bool failed;
    dt_err first_err;
} cpu_comm;

/* ---- execution ---------------------------------------------------------------------------- */

static int ring_member_index(const cpu_comm *c) { return c->flat_tcp ? c->rank : c->host; }

static int exec_allreduce(cpu_comm *c, dt_comm_work *w, const dt_coll_ctx *x, dt_err *err)
{
    dt_dtype t = (dt_dtype)w->desc.dtype;
    dt_redop op = (dt_redop)w->desc.redop;
    size_t n = w->desc.count;
    /* float64 averages are sums divided by the world in double (1/world as a float scale is
     * inexact unless the world is a power of two) */
    const bool f64_avg = t == DT_FLOAT64 && op == DT_AVG;
    if (f64_avg)
        op = DT_SUM;
    float scale = op == DT_AVG ? 1.0f / (float)c->world : 1.0f;
    int rc = 0;
    if (c->world == 1) {
        if (scale != 1.0f)
            dt_dtype_convert(w->buf, t, w->buf, t, n, scale);
        return 0;
    }
    if (c->shm &&
        (rc = dt_shm_allreduce(c->shm, w->buf, n, t, op, c->hier ? 1.0f : scale, x, err)))
        return rc;
    if (c->ring && (rc = dt_ring_allreduce(c->ring, w->buf, n, t, op, scale, x, err)))
        return rc;
    if (c->hier && c->shm)
        rc = dt_shm_broadcast(c->shm, w->buf, n * dt_dtype_size(t), 0, x, err);
    if (!rc && f64_avg)
        dt_f64_divide(w->buf, n, (double)c->world);
    return rc;
}

static int exec_broadcast(cpu_comm *c, dt_comm_work *w, const dt_coll_ctx *x, dt_err *err)
{
    size_t bytes = w->desc.count * dt_dtype_size((dt_dtype)w->desc.dtype);
    int root = w->desc.root, rh = c->host_of[root], rc = 0;
    if (c->world == 1)
        return 0;
    if (c->ring_only)
        return dt_ring_broadcast(c->ring, w->buf, bytes, root, x, err);
    if (c->host == rh && c->shm &&
        (rc = dt_shm_broadcast(c->shm, w->buf, bytes, c->local_of[root], x, err)))
        return rc;
    if (c->ring && (rc = dt_ring_broadcast(c->ring, w->buf, bytes, rh, x, err)))
        return rc;
    if (c->host != rh && c->shm)
        rc = dt_shm_broadcast(c->shm, w->buf, bytes, 0, x, err);
    return rc;
}

static int exec_allgather(cpu_comm *c, dt_comm_work *w, const dt_coll_ctx *x, dt_err *err)
{
    size_t bytes = w->desc.count * dt_dtype_size((dt_dtype)w->desc.dtype);
    char *recv = w->recv;
    if (c->world == 1) {
        if (recv != w->send)
            memmove(recv, w->send, bytes);
        return 0;
    }
    if (c->ring_only)
        return dt_ring_allgather(c->ring, w->send, recv, bytes, x, err);
    if (!c->hier) /* one host: local index == rank */
        return dt_shm_allgather(c->shm, w->send, recv, bytes, x, err);
    /* Hierarchical (same number L of ranks on every host): gather the host's block, exchange
     * blocks between hosts in host order, then put every piece at its rank's place. */
    size_t L = (size_t)c->local_size, block = L * bytes;
    int rc = 0;
    char *all = malloc(c->ring || c->local_rank == 0 ? (size_t)c->nhosts * block + 1 : block + 1);
    if (!all)
        return dt_err_set(err, -ENOMEM, "allgather: out of memory for %zu bytes", block);
    char *mine = c->local_rank == 0 ? all + (size_t)c->host * block : all;
    if (c->shm)
        rc = dt_shm_allgather(c->shm, w->send, mine, bytes, x, err);
    else
        memcpy(mine, w->send, bytes);
    if (!rc && c->ring)
        rc = dt_ring_allgather(c->ring, mine, all, block, x, err);
    if (!rc && c->local_rank == 0)
        for (int h = 0; h < c->nhosts; h++)
            for (size_t j = 0; j < L; j++)
                memcpy(recv + (size_t)c->host_ranks[h * c->max_local + (int)j] * bytes,
                       all + ((size_t)h * L + j) * bytes, bytes);
    if (!rc && c->shm)
        rc = dt_shm_broadcast(c->shm, recv, (size_t)c->world * bytes, 0, x, err);
    free(all);
    return rc;
}

static int exec_reduce_scatter(cpu_comm *c, dt_comm_work *w, const dt_coll_ctx *x, dt_err *err)
{
    dt_dtype t = (dt_dtype)w->desc.dtype;
    dt_redop op = (dt_redop)w->desc.redop;
    size_t n = w->desc.count, es = dt_dtype_size(t);
    const bool f64_avg = t == DT_FLOAT64 && op == DT_AVG; /* see exec_allreduce */
    if (f64_avg)
        op = DT_SUM;
    float scale = op == DT_AVG ? 1.0f / (float)c->world : 1.0f;
    int rc = 0;
    if (c->world == 1) {
        dt_dtype_convert(w->recv, t, w->send, t, n, scale);
        return 0;
    }
    if (c->ring_only)
        rc = dt_ring_reduce_scatter(c->ring, w->send, w->recv, n, t, op, scale, x, err);
    else if (!c->hier)
        rc = dt_shm_reduce_scatter(c->shm, w->send, w->recv, n, t, op, scale, x, err);
    if (c->ring_only || !c->hier) {
        if (!rc && f64_avg)
            dt_f64_divide(w->recv, n, (double)c->world);
        return rc;
    }
    /* Hierarchical: a full all-reduce of a copy, then each rank keeps its piece. Simple, and
     * reduce-scatter across hosts is not on any hot path of dtrain. */
    size_t total = (size_t)c->world * n;
    char *tmp = malloc(total * es + 1);
    if (!tmp)
        return dt_err_set(err, -ENOMEM, "reduce_scatter: out of memory for %zu bytes", total * es);
    memcpy(tmp, w->send, total * es);
    if (c->shm)
        rc = dt_shm_allreduce(c->shm, tmp, total, t, op, 1.0f, x, err);
    if (!rc && c->ring)
        rc = dt_ring_allreduce(c->ring, tmp, total, t, op, scale, x, err);
    if (!rc && c->shm)
        rc = dt_shm_broadcast(c->shm, tmp, total * es, 0, x, err);
    if (!rc)
        memcpy(w->recv, tmp + (size_t)c->rank * n * es, n * es);
    if (!rc && f64_avg)
        dt_f64_divide(w->recv, n, (double)c->world);
    free(tmp);
    return rc;
}

static int exec_barrier(cpu_comm *c, const dt_coll_ctx *x, dt_err *err)
{
    int rc = 0;
    if (c->shm && (rc = dt_shm_barrier(c->shm, x, err)))
        return rc;
    if (c->ring && (rc = dt_ring_barrier(c->ring, x, err)))
        return rc;
    if (c->hier && c->shm)
        rc = dt_shm_barrier(c->shm, x, err);
    return rc;
}

/* Communicator memory: shared memory mapped by the host's ranks, or plain memory when this rank
 * has no local peers. *(void **)w->recv receives it. */
static int exec_mem_alloc(cpu_comm *c, dt_comm_work *w, const dt_coll_ctx *x, dt_err *err)
{
    void **out = w->recv, *p = NULL;
    size_t bytes = w->desc.count;
    int rc = c->shm ? dt_shm_mem_alloc(c->shm, bytes, &p, x, err) : -ENOSPC;
    if (rc == -ENOSPC && c->shm && c->local_rank == 0)
        DT_WARN("comm: no communicator memory on this host (%s): its ranks use plain memory and "
                "staged copies, about 1.6x the memory traffic per all-reduce (give /dev/shm more "
                "room, e.g. docker run --shm-size, or see DTRAIN_COMM_SHM_MEM_MB)", err->msg);
    if (rc && rc != -ENOSPC)
        return rc;
    if (rc) {
        size_t n = (DT_MAX(bytes, (size_t)1) + 63) / 64 * 64;
        if (!(p = aligned_alloc(64, n)))
            return dt_err_set(err, -ENOMEM, "mem_alloc: out of memory for %zu bytes", bytes);
        memset(p, 0, n);
    }
    *out = p;
    return 0;
}

/* Runs one collective; on failure makes the communicator unusable and tells the peers.
 * background: on the comm thread (the issuer is busy with other work meanwhile). */
static void execute(cpu_comm *c, dt_comm_work *w, bool background)
{
    dt_err *err = &w->err;
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    if (failed) {
        char what[160];
        dt_coll_describe(&w->desc, what, sizeof what);
        w->rc = dt_err_set(err, c->first_err.code ? c->first_err.code : -EPIPE,
                           "%s: the communicator failed earlier: %s", what, c->first_err.msg);
    }
    pthread_mutex_unlock(&c->mu);
    if (failed)
        return;
    dt_coll_ctx x;
    x.desc = w->desc;
    x.timeout_ms = c->timeout_ms;
    x.background = background;
    x.waiters = &c->waiters;
    x.deadline_ns = dt_now_ns() + (uint64_t)c->timeout_ms * 1000000ull;
    int rc;
    switch (w->desc.kind) {
    case DT_COLL_ALLREDUCE: rc = exec_allreduce(c, w, &x, err); break;
    case DT_COLL_BROADCAST: rc = exec_broadcast(c, w, &x, err); break;
    case DT_COLL_ALLGATHER: rc = exec_allgather(c, w, &x, err); break;
    case DT_COLL_REDUCE_SCATTER: rc = exec_reduce_scatter(c, w, &x, err); break;
    case DT_COLL_MEM_ALLOC: rc = exec_mem_alloc(c, w, &x, err); break;
    default: rc = exec_barrier(c, &x, err); break;
    }
    w->rc = rc;
    if (rc == 0)
        return;
    if (c->shm)
        dt_shm_abort(c->shm, err->msg);
    if (c->ring)
        dt_ring_abort(c->ring);
    dt_p2p_abort(c->p2p, err->msg);
    pthread_mutex_lock(&c->mu);
    if (!c->failed) {
        c->failed = true;
        c->first_err = *err;
    }
    pthread_mutex_unlock(&c->mu);
    DT_ERROR("comm: rank %d: %s", c->global_of[c->rank], err->msg);
}

static void *comm_thread(void *arg)
{
    cpu_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        while (!c->stop && (c->head == NULL || c->busy))
            pthread_cond_wait(&c->work_cv, &c->mu);
        if (c->head == NULL && c->stop)
            break;
        if (c->busy)
            continue;
        dt_comm_work *w = c->head;
        c->head = w->next;
        if (!c->head)
            c->tail = NULL;
        w->state = 1;
        c->busy = true;
        pthread_mutex_unlock(&c->mu);
        execute(c, w, true);
        w->done_ns = dt_now_ns();
        pthread_mutex_lock(&c->mu);
        c->busy = false;
        w->state = 2;
        pthread_cond_broadcast(&c->done_cv);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* ---- issuing ------------------------------------------------------------------------------ */

static void unlink_handle(cpu_comm *c, dt_comm_work *w)
{
    if (w->all_prev) {
        *w->all_prev = w->all_next;
        if (w->all_next)
            w->all_next->all_prev = w->all_prev;
        w->all_prev = NULL;
    }
}

/* Runs w on the calling thread, with c->mu held on entry and on return: the comm thread stays
 * out of the way (busy) and picks up queued work again afterwards. */
static void run_here(cpu_comm *c, dt_comm_work *w)
{
    w->state = 1;
    c->busy = true;
    pthread_mutex_unlock(&c->mu);
    execute(c, w, false);
    w->done_ns = dt_now_ns();
    pthread_mutex_lock(&c->mu);
    c->busy = false;
    w->state = 2;
    pthread_cond_signal(&c->work_cv);    /* another thread may have queued meanwhile */
    pthread_cond_broadcast(&c->done_cv); /* another waiter's work may be next */
}

/* w's result, then w freed. */
static int reap(dt_comm_work *w, dt_err *err)
{
    int rc = w->rc;
    if (rc && err)
        *err = w->err;
    free(w);
    return rc;
}

/* Waits for w and frees it; *done_ns (may be NULL): when it finished (see dt_comm_wait_done). */
static int cpu_wait_done(void *self, dt_comm_work *w, uint64_t *done_ns, dt_err *err)
{
    cpu_comm *c = self;
    if (!w) {
        if (done_ns)
            *done_ns = dt_now_ns();
        return 0;
    }
    if (w->batch) {
        int rc = dt_p2p_wait(c->p2p, w->batch, done_ns, &w->err);
        pthread_mutex_lock(&c->mu);
        unlink_handle(c, w);
        if (rc && !c->failed) { /* the communicator is unusable after any failure */
            c->failed = true;
            c->first_err = w->err;
        }
        pthread_mutex_unlock(&c->mu);
        w->rc = rc;
        return reap(w, err);
    }
    pthread_mutex_lock(&c->mu);
    atomic_fetch_add(&c->waiters, 1);
    while (w->state != 2) {
        if (w == c->head && !c->busy) {
            /* Next in line and the comm thread has not picked it up yet: run it here rather
             * than wait for that thread to be scheduled (the order stays the issue order). */
            c->head = w->next;
            if (!c->head)
                c->tail = NULL;
            run_here(c, w);
            break;
        }
        pthread_cond_wait(&c->done_cv, &c->mu);
    }
    atomic_fetch_sub(&c->waiters, 1);
    unlink_handle(c, w);
    pthread_mutex_unlock(&c->mu);
    if (done_ns)
        *done_ns = w->done_ns;
    return reap(w, err);
}

static int cpu_wait(void *self, dt_comm_work *w, dt_err *err)
{
    return cpu_wait_done(self, w, NULL, err);
}

/* Queues w (or runs it here when it is blocking and nothing is queued or running). */
static int submit(cpu_comm *c, dt_comm_work *w, dt_comm_work **work, dt_err *err)
{
    pthread_mutex_lock(&c->mu);
    w->desc.seq = ++c->seq;
    if (!work && !c->busy && !c->head) {
        run_here(c, w);
        pthread_mutex_unlock(&c->mu);
        return reap(w, err);
    }
    if (c->tail)
        c->tail->next = w;
    else
        c->head = w;
    c->tail = w;
    w->all_next = c->all;
    if (c->all)
        c->all->all_prev = &w->all_next;
    w->all_prev = &c->all;
    c->all = w;
    pthread_cond_signal(&c->work_cv);
    pthread_mutex_unlock(&c->mu);
    if (work) {
        *work = w;
        return 0;
    }
    return cpu_wait(c, w, err);
}

static dt_comm_work *new_work(int kind, dt_dtype t, size_t count, int root, int redop, dt_err *err)
{
    dt_comm_work *w = calloc(1, sizeof *w);
    if (!w) {
        dt_err_set(err, -ENOMEM, "comm: out of memory");
        return NULL;
    }
    w->desc.kind = kind;
    w->desc.dtype = (int32_t)t;
    w->desc.count = count;
    w->desc.root = root;
    w->desc.redop = redop;
    return w;
}

static int check_dtype(dt_dtype t, dt_err *err)
{
    if (!dt_dtype_valid((int)t))
        return dt_err_set(err, -EINVAL, "comm: unknown dtype %d", (int)t);
    return 0;
}

/* Every op on every type, except avg on integers (comm.c rejects it first, with a message). */
static bool op_ok(dt_dtype t, dt_redop op)
{
    return dt_redop_valid((int)op) && (op != DT_AVG || dt_dtype_is_float(t));
}

static int cpu_allreduce(void *self, void *buf, size_t count, dt_dtype t, dt_redop op,
                         dt_comm_work **work, dt_err *err)
{
    if (check_dtype(t, err) || !op_ok(t, op))
        return dt_err_set(err, -EINVAL, "allreduce: invalid dtype %d or op %d", (int)t, (int)op);
    dt_comm_work *w = new_work(DT_COLL_ALLREDUCE, t, count, -1, op, err);
    if (!w)
        return -ENOMEM;
    w->buf = buf;
    return submit(self, w, work, err);
}

static int cpu_broadcast(void *self, void *buf, size_t count, dt_dtype t, int root,
                         dt_comm_work **work, dt_err *err)
{
    cpu_comm *c = self;
    if (check_dtype(t, err))
        return -EINVAL;
    if (root < 0 || root >= c->world)
        return dt_err_set(err, -EINVAL, "broadcast: root %d is not a rank (world size %d)", root,
                          c->world);
    dt_comm_work *w = new_work(DT_COLL_BROADCAST, t, count, root, -1, err);
    if (!w)
        return -ENOMEM;
    w->buf = buf;
    return submit(c, w, work, err);
}

static int cpu_allgather(void *self, const void *send, void *recv, size_t count, dt_dtype t,
                         dt_comm_work **work, dt_err *err)
{
    if (check_dtype(t, err))
        return -EINVAL;
    dt_comm_work *w = new_work(DT_COLL_ALLGATHER, t, count, -1, -1, err);
    if (!w)
        return -ENOMEM;
    w->send = send;
    w->recv = recv;
    return submit(self, w, work, err);
}

static int cpu_reduce_scatter(void *self, const void *send, void *recv, size_t count, dt_dtype t,
                              dt_redop op, dt_comm_work **work, dt_err *err)
{
    if (check_dtype(t, err) || !op_ok(t, op))
        return dt_err_set(err, -EINVAL, "reduce_scatter: invalid dtype %d or op %d", (int)t,
                          (int)op);
    dt_comm_work *w = new_work(DT_COLL_REDUCE_SCATTER, t, count, -1, op, err);
    if (!w)
        return -ENOMEM;
    w->send = send;
    w->recv = recv;
    return submit(self, w, work, err);
}

static int cpu_barrier(void *self, dt_err *err)
{
    dt_comm_work *w = new_work(DT_COLL_BARRIER, DT_FLOAT32, 0, -1, -1, err);
    if (!w)
        return -ENOMEM;
    return submit(self, w, NULL, err);
}

static int cpu_mem_alloc(void *self, size_t bytes, void **out, dt_err *err)
{
    dt_comm_work *w = new_work(DT_COLL_MEM_ALLOC, DT_FLOAT32, bytes, -1, -1, err);
    if (!w)
        return -ENOMEM;
    w->recv = out;
    return submit(self, w, NULL, err);
}

/* Point-to-point runs on the engine's own thread, beside (not in) the collective queue. */
static int cpu_p2p(void *self, const dt_p2p_op *ops, int n, dt_comm_work **work, dt_err *err)
{
    cpu_comm *c = self;
    pthread_mutex_lock(&c->mu);
    bool failed = c->failed;
    dt_err first = c->first_err;
    pthread_mutex_unlock(&c->mu);
    if (failed)
        return dt_err_set(err, first.code ? first.code : -EPIPE,
                          "p2p: the communicator failed earlier: %s", first.msg);
    dt_comm_work *w = calloc(1, sizeof *w);
    if (!w)
        return dt_err_set(err, -ENOMEM, "p2p: out of memory");
    int rc = dt_p2p_start(c->p2p, ops, n, &w->batch, err);
    if (rc) {
        free(w);
        return rc;
    }
    if (!work)
        return cpu_wait(c, w, err);
    pthread_mutex_lock(&c->mu);
    w->all_next = c->all;
    if (c->all)
        c->all->all_prev = &w->all_next;
    w->all_prev = &c->all;
    c->all = w;
    pthread_mutex_unlock(&c->mu);
    *work = w;
    return 0;
}

static void cpu_mem_free(void *self, void *p)
{
    cpu_comm *c = self;
    if (!p)
        return;
    /* The comm thread reads the list of allocations while it runs a collective: free when it
     * is idle (the caller promised no collective on p is in flight; others may be). */
    pthread_mutex_lock(&c->mu);
    while (c->busy || c->head)
        pthread_cond_wait(&c->done_cv, &c->mu);
    if (!dt_shm_mem_free(c->shm, p))
        free(p);
    pthread_mutex_unlock(&c->mu);
}

static void cpu_destroy(void *self)
{
    cpu_comm *c = self;
    if (!c)
        return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = true;
        pthread_cond_broadcast(&c->work_cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL); /* it drains the queue first; each item is bounded */
    }
    dt_p2p_close(c->p2p); /* frees the batches of unwaited point-to-point handles */
    while (c->all) { /* handles the caller never waited for */
        dt_comm_work *w = c->all;
        unlink_handle(c, w);
        free(w);
    }
    dt_shm_close(c->shm);
    dt_ring_close(c->ring);
    free(c->host_of);
    free(c->global_of);
    free(c->local_of);
    free(c->host_ranks);
    free(c->host_size);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->work_cv);
    pthread_cond_destroy(&c->done_cv);
    free(c);
}

/* What the transports counted: shared memory (what the host's peers read of this rank's data),
 * the TCP ring (written to the next member) and the point-to-point engine. */
static uint64_t cpu_sent_bytes(void *self)
{
    cpu_comm *c = self;
    return dt_shm_sent(c->shm) + dt_ring_sent(c->ring) + dt_p2p_sent(c->p2p);
}

static const dt_comm_backend_ops cpu_ops = {
    .name = "cpu",
    .allreduce = cpu_allreduce,
    .broadcast = cpu_broadcast,
    .allgather = cpu_allgather,
    .reduce_scatter = cpu_reduce_scatter,
    .barrier = cpu_barrier,
    .wait = cpu_wait,
    .destroy = cpu_destroy,
    .mem_alloc = cpu_mem_alloc,
    .mem_free = cpu_mem_free,
    .p2p = cpu_p2p,
    .wait_done = cpu_wait_done,
    .sent_bytes = cpu_sent_bytes,
};

/* ---- bootstrap ---------------------------------------------------------------------------- */

static void host_identity(char *buf, size_t cap)
{
    const char *env = dt_env("DTRAIN_COMM_HOST_ID");
    if (env) {
        dt_strlcpy(buf, env, cap);
        return;
    }
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof boot, f))
            boot[0] = '\0';
        fclose(f);
        boot[strcspn(boot, "\n")] = '\0';
    }
    char host[128];
    if (gethostname(host, sizeof host) != 0)
        dt_strlcpy(host, "localhost", sizeof host);
    host[sizeof host - 1] = '\0';
    /* The shared-memory domain too: containers (or network namespaces) that share a host name
     * and a kernel can still have /dev/shm mounts of their own, and ranks that cannot see each
     * other's segments are on different hosts for us. Every view of one tmpfs has its st_dev. */
    struct stat st;
    unsigned long long shm_dev = stat("/dev/shm", &st) == 0 ? (unsigned long long)st.st_dev : 0;
    snprintf(buf, cap, "%.100s/%.40s/%llx", host, boot, shm_dev);
}

/* A TCP socket listening on every address (IPv6 dual-stack when possible), any free port. */
static int listen_any(int *fd_out, int *port_out, dt_err *err)
{
    int fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0) {
        int zero = 0;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            close(fd);
            fd = -1;
        }
    }
    if (fd < 0) {
        fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return dt_err_errno(err, errno, "comm: socket");
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            int e = errno;
            close(fd);
            return dt_err_errno(err, e, "comm: bind");
        }
    }
    if (listen(fd, 128) != 0) {
        int e = errno;
        close(fd);
        return dt_err_errno(err, e, "comm: listen");
    }
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &len);
    *port_out = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                         : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return 0;
}

static int parse_peer(const char *text, peer *p)
{
    memset(p, 0, sizeof *p);
    /* "host=<id>\naddr=<addr>\nport=<n>\np2p=<n>\npid=<n>\n" */
    const char *h = strstr(text, "host="), *a = strstr(text, "\naddr="),
               *po = strstr(text, "\nport="), *pp = strstr(text, "\np2p="),
               *pi = strstr(text, "\npid=");
    if (!h || !a || !po || !pp || !pi)
        return -EPROTO;
    size_t hl = (size_t)(a - (h + 5));
    const char *ae = strchr(a + 6, '\n');
    if (!ae || hl >= sizeof p->host || (size_t)(ae - (a + 6)) >= sizeof p->addr)
        return -EPROTO;
    memcpy(p->host, h + 5, hl);
    memcpy(p->addr, a + 6, (size_t)(ae - (a + 6)));
    p->port = atoi(po + 6);
    p->p2p_port = atoi(pp + 5);
    p->pid = atoi(pi + 5);
    return 0;
}

static uint64_t group_tag(const dt_comm_opts *o, uint64_t gen)
{
    uint64_t h = 1469598103934665603ull;
    const char *run = o->run_id ? o->run_id : "none";
    for (const char *p = run; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ (uint64_t)(uint32_t)o->attempt) * 1099511628211ull;
    h = (h ^ gen) * 1099511628211ull;
    return (h ^ (uint64_t)(uint32_t)o->world_size) * 1099511628211ull;
}

static int env_int(const char *name, int def)
{
    const char *v = dt_env(name);
    int x;
    return v && dt_parse_int(v, &x) == 0 ? x : def;
}

int dt_comm_cpu_create(const dt_comm_opts *o, dt_store *store, uint64_t gen, const int *globals,
                       const dt_comm_backend_ops **ops, void **self, dt_err *err)
{
    int rc = 0, lfd = -1, port = 0, pfd = -1, p2p_port = 0;
    int *host_globals = NULL;
    peer *peers = NULL;
    char **keys = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    const int world = o->world_size, rank = o->rank;
    uint64_t deadline = dt_now_ns() + (uint64_t)o->timeout_ms * 1000000ull;
    cpu_comm *c = calloc(1, sizeof *c);
    if (!c)
        return dt_err_set(err, -ENOMEM, "comm: out of memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->work_cv, NULL);
    pthread_cond_init(&c->done_cv, NULL);
    c->rank = rank;
    c->world = world;
    c->timeout_ms = o->timeout_ms;
    c->host_of = calloc((size_t)world, sizeof *c->host_of);
    c->local_of = calloc((size_t)world, sizeof *c->local_of);
    c->host_size = calloc((size_t)world, sizeof *c->host_size);
    c->global_of = calloc((size_t)world, sizeof *c->global_of);
    peers = calloc((size_t)world, sizeof *peers);
    if (!c->host_of || !c->local_of || !c->host_size || !c->global_of || !peers) {
        rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
        goto fail;
    }
    for (int r = 0; r < world; r++)
        c->global_of[r] = globals ? globals[r] : r;
    const char *transport = dt_env("DTRAIN_COMM_TRANSPORT");
    if (strcmp(transport, "auto") && strcmp(transport, "shm") && strcmp(transport, "tcp")) {
        rc = dt_err_set(err, -EINVAL, "DTRAIN_COMM_TRANSPORT=%s: use auto, shm or tcp", transport);
        goto fail;
    }

    if (world > 1) {
        /* ---- exchange host identities and ring addresses ---- */
        if (!store) {
            rc = dt_err_set(err, -EINVAL, "comm: %d ranks need a store for the bootstrap", world);
            goto fail;
        }
        if ((rc = listen_any(&lfd, &port, err)) != 0 ||
            (rc = listen_any(&pfd, &p2p_port, err)) != 0)
            goto fail;
        char me[660], host[160], key[64];
        host_identity(host, sizeof host);
        const char *addr = o->local_addr && *o->local_addr ? o->local_addr : dt_hostname();
        int n = snprintf(me, sizeof me, "host=%s\naddr=%s\nport=%d\np2p=%d\npid=%d\n", host,
                         addr, port, p2p_port, (int)getpid());
        snprintf(key, sizeof key, "peer/%d", rank);
        if ((rc = dt_store_set(store, key, me, (size_t)n, err)) != 0) {
            dt_err_prefix(err, "comm bootstrap: publishing rank %d: ", rank);
            goto fail;
        }
        keys = calloc((size_t)world, sizeof *keys);
        vals = calloc((size_t)world, sizeof *vals);
        lens = calloc((size_t)world, sizeof *lens);
        if (!keys || !vals || !lens) {
            rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
            goto fail;
        }
        for (int r = 0; r < world; r++) {
            keys[r] = malloc(24);
            if (!keys[r]) {
                rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
                goto fail;
            }
            snprintf(keys[r], 24, "peer/%d", r);
        }
        if ((rc = dt_store_multi_get(store, (const char *const *)keys, (size_t)world, vals, lens,
                                     o->timeout_ms, err)) != 0) {
            dt_err_prefix(err, "comm bootstrap: waiting for all %d ranks to publish their "
                               "addresses (a rank did not start, or ranks disagree on the world "
                               "size, run id or attempt): ",
                          world);
            goto fail;
        }
        for (int r = 0; r < world; r++)
            if (parse_peer(vals[r], &peers[r]) != 0) {
                rc = dt_err_set(err, -EPROTO, "comm bootstrap: rank %d published \"%.100s\"", r,
                                (char *)vals[r]);
                goto fail;
            }
    }

    /* ---- topology: hosts in order of their first rank ---- */
    for (int r = 0; r < world; r++) {
        int h = -1;
        for (int q = 0; q < r && world > 1; q++)
            if (!strcmp(peers[q].host, peers[r].host)) {
                h = c->host_of[q];
                break;
            }
        if (h < 0)
            h = c->nhosts++;
        c->host_of[r] = h;
        c->local_of[r] = c->host_size[h]++;
    }
    for (int h = 0; h < c->nhosts; h++)
        c->max_local = DT_MAX(c->max_local, c->host_size[h]);
    c->host_ranks = calloc((size_t)c->nhosts * (size_t)c->max_local, sizeof *c->host_ranks);
    if (!c->host_ranks) {
        rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
        goto fail;
    }
    host_globals = calloc((size_t)c->nhosts * (size_t)c->max_local, sizeof *host_globals);
    if (!host_globals) {
        rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
        goto fail;
    }
    for (int r = 0; r < world; r++) {
        c->host_ranks[c->host_of[r] * c->max_local + c->local_of[r]] = r;
        host_globals[c->host_of[r] * c->max_local + c->local_of[r]] = c->global_of[r];
    }
    c->host = c->host_of[rank];
    c->local_rank = c->local_of[rank];
    c->local_size = c->host_size[c->host];
    bool equal = true;
    for (int h = 0; h < c->nhosts; h++)
        equal = equal && c->host_size[h] == c->max_local;
    if (!strcmp(transport, "shm") && c->nhosts > 1) {
        rc = dt_err_set(err, -EINVAL, "DTRAIN_COMM_TRANSPORT=shm, but the ranks are on %d hosts",
                        c->nhosts);
        goto fail;
    }
    c->flat_tcp = world > 1 && (!strcmp(transport, "tcp") || (c->nhosts > 1 && !equal) ||
                                c->max_local > DT_SHM_MAX_LOCAL);
    c->hier = !c->flat_tcp && c->nhosts > 1 && c->max_local > 1;
    c->ring_only = world > 1 && (c->flat_tcp || (c->nhosts > 1 && c->max_local == 1));
    if (world > 1)
        DT_DEBUG("comm: rank %d of %d: %d host(s), %d rank(s) on this one, %s", rank, world,
                 c->nhosts, c->local_size,
                 c->flat_tcp ? "TCP ring between all ranks"
                 : c->hier   ? "shared memory + TCP ring between hosts"
                 : c->nhosts > 1 ? "TCP ring between hosts"
                                 : "shared memory");

    /* ---- shared memory on this host ---- */
    if (!c->flat_tcp && c->local_size > 1) {
        char name[200], key[64];
        dt_shm_name(name, sizeof name, o->run_id, o->attempt, gen, c->host);
        snprintf(key, sizeof key, "shm/%d", c->host);
        dt_shm_opts so = {.name = name,
                          .local_rank = c->local_rank,
                          .local_size = c->local_size,
                          .global_ranks = &host_globals[c->host * c->max_local],
                          .slot_bytes = (size_t)env_int("DTRAIN_COMM_SHM_SLOT_KB", 0) * 1024u,
                          .spin_us = env_int("DTRAIN_COMM_SPIN_US", -1),
                          .mem_max_bytes = (long long)env_int("DTRAIN_COMM_SHM_MEM_MB", -1) *
                                           (1ll << 20)};
        if (c->local_rank == 0) {
            dt_shm_clean(o->run_id);
            if ((rc = dt_shm_open(&c->shm, &so, true, err)) != 0) {
                /* Tell the other local ranks now rather than let them wait for the timeout. */
                char why[DT_ERR_MSG_MAX + 2];
                int n = snprintf(why, sizeof why, "!%s", err ? err->msg : "failed");
                dt_store_set(store, key, why, (size_t)DT_MIN(n, (int)sizeof why - 1), NULL);
                goto fail;
            }
            if ((rc = dt_store_set(store, key, name, strlen(name), err)) != 0)
                goto fail;
        } else {
            void *v = NULL;
            size_t len = 0;
            int left = (int)DT_MAX((int64_t)1, (int64_t)(deadline - dt_now_ns()) / 1000000);
            if ((rc = dt_store_get(store, key, &v, &len, left, err)) != 0) {
                dt_err_prefix(err, "comm bootstrap: waiting for rank %d to create the shared "
                                   "memory of this host: ",
                              host_globals[c->host * c->max_local]);
                goto fail;
            }
            if (v && ((char *)v)[0] == '!') {
                rc = dt_err_set(err, -EIO, "comm bootstrap: rank %d could not create the shared "
                                "memory of this host: %s",
                                host_globals[c->host * c->max_local], (char *)v + 1);
                free(v);
                goto fail;
            }
            free(v);
            if ((rc = dt_shm_open(&c->shm, &so, false, err)) != 0)
                goto fail;
        }
    }

    if (c->shm && (rc = dt_shm_ready(c->shm, deadline, err)) != 0)
        goto fail;

    /* ---- the ring ---- */
    int members = c->flat_tcp ? world : c->nhosts;
    bool member = c->flat_tcp || c->local_rank == 0;
    if (members > 1 && member) {
        int idx = ring_member_index(c);
        int *ring_globals = calloc((size_t)members, sizeof *ring_globals);
        if (!ring_globals) {
            rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
            goto fail;
        }
        for (int i = 0; i < members; i++)
            ring_globals[i] = c->global_of[c->flat_tcp ? i : c->host_ranks[i * c->max_local]];
        int nx = (idx + 1) % members, nr = c->flat_tcp ? nx : c->host_ranks[nx * c->max_local];
        int pv = (idx + members - 1) % members,
            pr = c->flat_tcp ? pv : c->host_ranks[pv * c->max_local];
        dt_ring_opts ro = {.index = idx,
                           .size = members,
                           .global_ranks = ring_globals,
                           .next_host = strcmp(peers[nr].host, peers[rank].host) ? peers[nr].addr
                                                                                 : "127.0.0.1",
                           .next_port = peers[nr].port,
                           .next_name = peers[nr].addr,
                           .prev_host = peers[pr].addr,
                           .timeout_ms = o->timeout_ms,
                           .listen_fd = lfd,
                           .tag = group_tag(o, gen),
                           .segment_bytes =
                               (size_t)env_int("DTRAIN_COMM_TCP_SEGMENT_KB", 0) * 1024u};
        rc = dt_ring_connect(&c->ring, &ro, deadline, err);
        free(ring_globals);
        if (rc) {
            dt_err_prefix(err, "comm bootstrap: ");
            goto fail;
        }
    }
    if (lfd >= 0)
        close(lfd);
    lfd = -1;

    /* ---- point-to-point: pairs open on first use (see comm_p2p.h) ---- */
    {
        dt_p2p_peer *pp = calloc((size_t)world, sizeof *pp);
        if (!pp) {
            rc = dt_err_set(err, -ENOMEM, "comm: out of memory");
            goto fail;
        }
        for (int r = 0; r < world; r++) {
            bool same = world > 1 && !strcmp(peers[r].host, peers[rank].host);
            pp[r].global = c->global_of[r];
            pp[r].shm = same && strcmp(transport, "tcp") != 0;
            pp[r].addr = world == 1 ? "127.0.0.1" : same ? "127.0.0.1" : peers[r].addr;
            pp[r].port = peers[r].p2p_port;
            pp[r].pid = peers[r].pid;
        }
        char base[200];
        dt_shm_name(base, sizeof base, o->run_id, o->attempt, gen, 0);
        dt_p2p_opts po = {.rank = rank,
                          .world = world,
                          .peers = pp,
                          .listen_fd = pfd,
                          .tag = group_tag(o, gen) ^ 0x7032703270327032ull,
                          .shm_base = base,
                          .timeout_ms = o->timeout_ms};
        pfd = -1; /* the engine owns it now */
        rc = dt_p2p_create(&c->p2p, &po, err);
        free(pp);
        if (rc)
            goto fail;
    }

    if ((rc = pthread_create(&c->thread, NULL, comm_thread, c)) != 0) {
        rc = dt_err_set(err, -rc, "comm: cannot start the comm thread: %s", strerror(rc));
        goto fail;
    }
    c->thread_started = true;
    *ops = &cpu_ops;
    *self = c;
    rc = 0;
    goto out;
fail:
    cpu_destroy(c);
out:
    if (lfd >= 0)
        close(lfd);
    if (pfd >= 0)
        close(pfd);
    free(host_globals);
    if (keys)
        for (int r = 0; r < world; r++)
            free(keys[r]);
    if (vals)
        for (int r = 0; r < world; r++)
            free(vals[r]);
    free(keys);
    free(vals);
    free(lens);
    free(peers);
    return rc;
}
