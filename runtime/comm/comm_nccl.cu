// comm_nccl.cu - the "nccl" collective backend (runtime/comm/comm_impl.h), built into
// libdtrain_cuda.so. runtime/comm/comm.c does the store bootstrap (rank 0 calls dt_nccl_get_unique_id,
// publishes the id under the run/attempt namespace, every rank calls dt_nccl_comm_create) and
// dispatches dt_comm_* calls to the vtable below.
//
// Design
// - The communicator is created non-blocking (ncclConfig_t.blocking = 0): initialisation and
//   every collective return at once (possibly ncclInProgress) and the backend polls
//   ncclCommGetAsyncError with a deadline, so no NCCL call can hang the worker. A stalled or dead
//   peer becomes -ETIMEDOUT after opts->timeout_ms, a remote or internal NCCL error becomes -EIO;
//   either way the communicator is aborted (ncclCommAbort, which also stops its kernels) and
//   unusable from then on, the worker exits non-zero and the agent restarts the job.
// - A watchdog thread checks in-flight collectives every 100 ms for the same two conditions, so a
//   collective nobody waits on yet still times out and its kernels are stopped. NCCL calls of the
//   user's thread and the watchdog's abort are serialised by one mutex (abort frees the
//   communicator).
// - Collectives run on a dedicated high-priority comm stream. Before each one the comm stream
//   waits for an event recorded on the compute stream of the CUDA backend on the same device
//   (kernels/cuda/backend.cu keeps a registry), so a DDP bucket all-reduce starts as soon as the
//   backward kernels that produced the bucket have run, and overlaps the rest of backward.
//   wait() blocks the host until the collective has completed (polling its event, bounded by
//   the timeout); compute work issued after wait() is therefore ordered after it.
// - The device is opts->device_index (LOCAL_RANK). Data types: float32, bfloat16, float16, int32,
//   int64, uint8, float64 (ncclInt32, ncclInt64, ncclUint8, ncclFloat64); reductions: sum, avg
//   (ncclAvg), max, min.
//   comm.c has already refused avg on the integer types and any value outside dtype.h.
// - Single-process data parallelism (one process driving K GPUs, job.strategy = dp) uses the same
//   entry points from K threads: one dt_nccl_comm_create per replica thread with rank = replica,
//   world_size = K, device_index = replica and one shared unique id. Each thread then issues its
//   replica's collectives, which NCCL supports without group calls.
//
// - Groups (dt_comm_split): ncclCommSplit of the parent, non-blocking like the initialisation,
//   under the parent's mutex and bounded by the timeout; every rank of the parent calls it, a rank
//   with color < 0 passes NCCL_SPLIT_NOCOLOR and gets no communicator. The group gets its own comm
//   stream, watchdog and in-flight list, so its collectives progress independently of the
//   parent's and of other groups' (NCCL kernels of different communicators run concurrently).
// - Point-to-point (dt_comm_p2p): one ncclGroupStart, ncclSend/ncclRecv per op, ncclGroupEnd on
//   the comm stream, issued like a collective (ordered after the compute stream, settled, an
//   event, the watchdog, the same timeout and abort). Point-to-point and collectives of one
//   communicator therefore run in issue order on its stream; a send completes when NCCL has
//   handed its data to the receiver (it waits for the matching receive). NCCL does not check
//   that a send and its receive agree on the count: a mismatch is undefined there (and diagnosed
//   by the cpu backend).
//
// Unlike the cpu backend, NCCL carries no per-message description, so ranks that issue different
// collectives are not diagnosed by name: they stall and hit the timeout, whose message names this
// rank's operation and sequence number.
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/cuda_internal.h"

extern "C" {
#include "runtime/comm/comm_impl.h"
}

#define DT_CU_EXPORT extern "C" __attribute__((visibility("default")))

static_assert(sizeof(ncclUniqueId) == DT_NCCL_ID_BYTES, "NCCL unique id size changed");

typedef struct nccl_comm nccl_comm;

// One collective in flight. Handed out as dt_comm_work*.
typedef struct nccl_work {
    nccl_comm *c;
    cudaEvent_t done;   // recorded on the comm stream after the collective
    uint64_t seq;
    const char *op;     // static string
    int peer;           // point-to-point: the peer of the batch's first op; else -1
    size_t count;
    dt_dtype dtype;
    double t0;          // when it was issued (monotonic seconds)
    struct nccl_work *prev, *next; // the in-flight list, under c->mu
} nccl_work;

struct nccl_comm {
    ncclComm_t comm;       // NULL once aborted or destroyed
    int rank, world, device;
    int grank;             // global rank (the world's rank of this process), for messages
    double timeout_s;
    cudaStream_t stream;   // the comm stream
    cudaEvent_t ready;     // recorded on the compute stream before each collective
    float *barrier_buf;    // one float of device memory for barrier()

    pthread_mutex_t mu;    // guards comm, the in-flight list, broken/err
    pthread_cond_t cv;     // wakes the watchdog for shutdown
    pthread_t watchdog;
    bool watchdog_running, stopping;

    bool broken;           // aborted: every call fails with err
    int err_code;
    char err_msg[DT_ERR_MSG_MAX];
    uint64_t seq;          // collectives issued so far
    nccl_work inflight;    // list sentinel
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void nap(double *delay)
{
    struct timespec ts = {0, (long)(*delay * 1e9)};
    nanosleep(&ts, NULL);
    if (*delay < 1e-3)
        *delay *= 2;
}

// dtype.c is not linked into libdtrain_cuda.so (the CUDA build links common/ only), so the
// names are spelled here; they match dt_dtype_name.
static const char *dtype_name(dt_dtype t)
{
    switch (t) {
    case DT_BFLOAT16: return "bfloat16";
    case DT_FLOAT16: return "float16";
    case DT_INT32: return "int32";
    case DT_INT64: return "int64";
    case DT_UINT8: return "uint8";
    case DT_FLOAT64: return "float64";
    default: return "float32";
    }
}

static ncclDataType_t nccl_type(dt_dtype t)
{
    switch (t) {
    case DT_BFLOAT16: return ncclBfloat16;
    case DT_FLOAT16: return ncclFloat16;
    case DT_INT32: return ncclInt32;
    case DT_INT64: return ncclInt64;
    case DT_UINT8: return ncclUint8;
    case DT_FLOAT64: return ncclFloat64;
    default: return ncclFloat32;
    }
}

static ncclRedOp_t nccl_op(dt_redop op)
{
    switch (op) {
    case DT_AVG: return ncclAvg;
    case DT_MAX: return ncclMax;
    case DT_MIN: return ncclMin;
    default: return ncclSum;
    }
}

// Aborts the communicator (once) and records why. Caller holds c->mu.
static void abort_locked(nccl_comm *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void abort_locked(nccl_comm *c, int code, const char *fmt, ...)
{
    if (c->broken)
        return;
    c->broken = true;
    c->err_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err_msg, sizeof c->err_msg, fmt, ap);
    va_end(ap);
    DT_ERROR("NCCL rank %d/%d (global rank %d): %s; aborting the communicator", c->rank, c->world,
             c->grank, c->err_msg);
    if (c->comm) {
        ncclCommAbort(c->comm);
        c->comm = NULL;
    }
}

static int broken_err(nccl_comm *c, dt_err *err)
{
    pthread_mutex_lock(&c->mu);
    int code = c->err_code ? c->err_code : -EIO;
    dt_err_set(err, code, "%s", c->err_msg);
    pthread_mutex_unlock(&c->mu);
    return code;
}

// Polls the communicator until it leaves ncclInProgress. Caller holds c->mu. Returns the state
// (ncclSuccess when fine); on a deadline, aborts and returns ncclInProgress.
static ncclResult_t settle_locked(nccl_comm *c, const char *what, uint64_t seq)
{
    double t0 = now_s(), delay = 20e-6;
    for (;;) {
        ncclResult_t st = ncclSuccess;
        if (!c->comm)
            return ncclInvalidUsage;
        ncclResult_t q = ncclCommGetAsyncError(c->comm, &st);
        if (q != ncclSuccess)
            st = q;
        if (st != ncclInProgress)
            return st;
        if (now_s() - t0 > c->timeout_s) {
            abort_locked(c, -ETIMEDOUT,
                         "%s #%llu still in progress after %.0f s (a peer is dead, stalled, or "
                         "issued a different collective)",
                         what, (unsigned long long)seq, c->timeout_s);
            return ncclInProgress;
        }
        pthread_mutex_unlock(&c->mu);
        nap(&delay);
        pthread_mutex_lock(&c->mu);
    }
}

// ", peer rank 3" for a point-to-point batch, "" for a collective.
struct peer_buf {
    char s[48];
};
static peer_buf peer_text(const nccl_work *w)
{
    peer_buf b;
    b.s[0] = '\0';
    if (w->peer >= 0)
        snprintf(b.s, sizeof b.s, ", peer rank %d", w->peer);
    return b;
}

// =============================================================================================
// watchdog
// =============================================================================================

static void *watchdog_main(void *arg)
{
    nccl_comm *c = (nccl_comm *)arg;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        struct timespec dl;
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_nsec += 100 * 1000 * 1000;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&c->cv, &c->mu, &dl);
        if (c->stopping || c->broken || !c->comm)
            continue;
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(c->comm, &st) == ncclSuccess && st != ncclSuccess &&
            st != ncclInProgress) {
            abort_locked(c, st == ncclRemoteError ? -ECONNRESET : -EIO,
                         "asynchronous NCCL error: %s (%s)", ncclGetErrorString(st),
                         ncclGetLastError(c->comm));
            continue;
        }
        double t = now_s();
        for (nccl_work *w = c->inflight.next; w != &c->inflight; w = w->next) {
            if (cudaEventQuery(w->done) != cudaErrorNotReady)
                continue; // complete (or a CUDA error, which wait() reports)
            if (t - w->t0 > c->timeout_s) {
                abort_locked(c, -ETIMEDOUT,
                             "%s #%llu (%zu x %s%s) timed out after %.0f s: a peer is dead, "
                             "stalled or issued a different operation (ddp.timeout sets the "
                             "limit)",
                             w->op, (unsigned long long)w->seq, w->count, dtype_name(w->dtype),
                             peer_text(w).s, c->timeout_s);
                break;
            }
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

// =============================================================================================
// collectives
// =============================================================================================

static void work_free(nccl_work *w)
{
    if (!w)
        return;
    nccl_comm *c = w->c;
    pthread_mutex_lock(&c->mu);
    if (w->prev) {
        w->prev->next = w->next;
        w->next->prev = w->prev;
    }
    pthread_mutex_unlock(&c->mu);
    if (w->done)
        cudaEventDestroy(w->done);
    free(w);
}

static int nccl_wait_impl(nccl_comm *c, nccl_work *w, dt_err *err)
{
    double delay = 20e-6;
    int rc = 0;
    for (;;) {
        cudaError_t q = cudaEventQuery(w->done);
        if (q == cudaSuccess) {
            // An abort (the watchdog's, on an async or remote error or a timeout) stops the
            // kernels, which completes the event too: the data is then garbage, say so.
            pthread_mutex_lock(&c->mu);
            bool broken = c->broken;
            pthread_mutex_unlock(&c->mu);
            if (broken)
                rc = broken_err(c, err);
            break;
        }
        if (q != cudaErrorNotReady) {
            rc = dt_err_set(err, -EIO, "NCCL %s #%llu on rank %d: CUDA error: %s", w->op,
                            (unsigned long long)w->seq, c->rank, cudaGetErrorString(q));
            break;
        }
        pthread_mutex_lock(&c->mu);
        if (!c->broken && now_s() - w->t0 > c->timeout_s)
            abort_locked(c, -ETIMEDOUT,
                         "%s #%llu (%zu x %s%s) timed out after %.0f s: a peer is dead, stalled "
                         "or issued a different operation (ddp.timeout sets the limit)",
                         w->op, (unsigned long long)w->seq, w->count, dtype_name(w->dtype),
                         peer_text(w).s, c->timeout_s);
        bool broken = c->broken;
        pthread_mutex_unlock(&c->mu);
        if (broken) {
            rc = broken_err(c, err);
            break;
        }
        nap(&delay);
    }
    work_free(w);
    return rc;
}

// Issues one collective: ordering after the compute stream, the NCCL call, settling, the
// completion event. fn issues the NCCL call itself.
template <typename Fn>
static int issue(nccl_comm *c, const char *op, size_t count, dt_dtype dtype, Fn fn,
                 dt_comm_work **work, dt_err *err, int peer = -1)
{
    if (work)
        *work = NULL;
    cudaSetDevice(c->device);
    nccl_work *w = (nccl_work *)calloc(1, sizeof *w);
    if (!w)
        return dt_err_set(err, -ENOMEM, "NCCL %s: out of host memory", op);
    w->c = c;
    w->op = op;
    w->peer = peer;
    w->count = count;
    w->dtype = dtype;
    cudaError_t ce = cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming);
    if (ce != cudaSuccess) {
        free(w);
        return dt_err_set(err, -EIO, "NCCL %s: cudaEventCreate: %s", op, cudaGetErrorString(ce));
    }
    // The data was produced on the compute stream: start after everything issued there so far.
    if (dt_cuda_record_on_compute_stream(c->device, c->ready))
        ce = cudaStreamWaitEvent(c->stream, c->ready, 0);
    else
        ce = cudaDeviceSynchronize(); // no backend instance on this device: be conservative
    if (ce != cudaSuccess) {
        work_free(w);
        return dt_err_set(err, -EIO, "NCCL %s on rank %d: ordering after the compute stream: %s",
                          op, c->rank, cudaGetErrorString(ce));
    }

    pthread_mutex_lock(&c->mu);
    if (c->broken || !c->comm) {
        pthread_mutex_unlock(&c->mu);
        work_free(w);
        return broken_err(c, err);
    }
    w->seq = ++c->seq;
    w->t0 = now_s();
    ncclResult_t r = fn(c->comm, c->stream);
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle_locked(c, op, w->seq);
    if (r != ncclSuccess) {
        if (!c->broken)
            abort_locked(c, -EIO, "%s #%llu (%zu x %s%s) failed: %s (%s)", op,
                         (unsigned long long)w->seq, count, dtype_name(dtype), peer_text(w).s,
                         ncclGetErrorString(r), c->comm ? ncclGetLastError(c->comm) : "");
        pthread_mutex_unlock(&c->mu);
        work_free(w);
        return broken_err(c, err);
    }
    ce = cudaEventRecord(w->done, c->stream);
    // Into the in-flight list, where the watchdog sees it.
    w->next = &c->inflight;
    w->prev = c->inflight.prev;
    c->inflight.prev->next = w;
    c->inflight.prev = w;
    pthread_mutex_unlock(&c->mu);
    if (ce != cudaSuccess) {
        work_free(w);
        return dt_err_set(err, -EIO, "NCCL %s on rank %d: cudaEventRecord: %s", op, c->rank,
                          cudaGetErrorString(ce));
    }
    if (!work)
        return nccl_wait_impl(c, w, err);
    *work = reinterpret_cast<dt_comm_work *>(w);
    return 0;
}

static int nccl_allreduce(void *self, void *buf, size_t count, dt_dtype dtype, dt_redop op,
                          dt_comm_work **work, dt_err *err)
{
    static const char *const names[] = {"allreduce(sum)", "allreduce(avg)", "allreduce(max)",
                                        "allreduce(min)"};
    ncclRedOp_t rop = nccl_op(op);
    ncclDataType_t t = nccl_type(dtype);
    return issue(
        (nccl_comm *)self, names[(unsigned)op < DT_REDOP_COUNT ? op : 0], count, dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclAllReduce(buf, buf, count, t, rop, comm, s);
        },
        work, err);
}

static int nccl_reduce(void *self, void *buf, size_t count, dt_dtype dtype, dt_redop op,
                       int root, dt_comm_work **work, dt_err *err)
{
    static const char *const names[] = {"reduce(sum)", "reduce(avg)", "reduce(max)",
                                        "reduce(min)"};
    ncclRedOp_t rop = nccl_op(op);
    ncclDataType_t t = nccl_type(dtype);
    return issue(
        (nccl_comm *)self, names[(unsigned)op < DT_REDOP_COUNT ? op : 0], count, dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclReduce(buf, buf, count, t, rop, root, comm, s);
        },
        work, err);
}

static int nccl_broadcast(void *self, void *buf, size_t count, dt_dtype dtype, int root,
                          dt_comm_work **work, dt_err *err)
{
    ncclDataType_t t = nccl_type(dtype);
    return issue(
        (nccl_comm *)self, "broadcast", count, dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclBroadcast(buf, buf, count, t, root, comm, s);
        },
        work, err);
}

static int nccl_allgather(void *self, const void *send, void *recv, size_t count, dt_dtype dtype,
                          dt_comm_work **work, dt_err *err)
{
    ncclDataType_t t = nccl_type(dtype);
    return issue(
        (nccl_comm *)self, "allgather", count, dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclAllGather(send, recv, count, t, comm, s);
        },
        work, err);
}

static int nccl_reduce_scatter(void *self, const void *send, void *recv, size_t count,
                               dt_dtype dtype, dt_redop op, dt_comm_work **work, dt_err *err)
{
    ncclRedOp_t rop = nccl_op(op);
    ncclDataType_t t = nccl_type(dtype);
    return issue(
        (nccl_comm *)self, "reduce_scatter", count, dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclReduceScatter(send, recv, count, t, rop, comm, s);
        },
        work, err);
}

static int nccl_barrier(void *self, dt_err *err)
{
    nccl_comm *c = (nccl_comm *)self;
    float *b = c->barrier_buf;
    return issue(
        c, "barrier", 1, DT_FLOAT32,
        [=](ncclComm_t comm, cudaStream_t s) {
            return ncclAllReduce(b, b, 1, ncclFloat32, ncclSum, comm, s);
        },
        NULL, err);
}

// A batch of sends and receives: one NCCL group, so a batch that sends to a peer and receives
// from it progresses together. The group is ended even when an op inside it fails.
static int nccl_p2p(void *self, const dt_p2p_op *ops, int n, dt_comm_work **work, dt_err *err)
{
    nccl_comm *c = (nccl_comm *)self;
    if (work)
        *work = NULL;
    if (n == 0)
        return 0; // nothing to wait for: a NULL handle waits as done
    bool all_send = true, all_recv = true;
    for (int i = 0; i < n; i++) {
        all_send = all_send && ops[i].kind == DT_P2P_SEND;
        all_recv = all_recv && ops[i].kind == DT_P2P_RECV;
    }
    const char *name = n == 1 ? (all_send ? "send" : "recv")
                       : all_send ? "send batch"
                       : all_recv ? "recv batch"
                                  : "send/recv batch";
    return issue(
        c, name, ops[0].count, ops[0].dtype,
        [=](ncclComm_t comm, cudaStream_t s) {
            ncclResult_t first = ncclGroupStart();
            if (first != ncclSuccess)
                return first;
            for (int i = 0; i < n; i++) {
                const dt_p2p_op *o = &ops[i];
                ncclResult_t r = o->kind == DT_P2P_SEND
                                     ? ncclSend(o->buf, o->count, nccl_type(o->dtype), o->peer,
                                                comm, s)
                                     : ncclRecv(o->buf, o->count, nccl_type(o->dtype), o->peer,
                                                comm, s);
                if (r != ncclSuccess && r != ncclInProgress && first == ncclSuccess)
                    first = r;
            }
            ncclResult_t e = ncclGroupEnd();
            return first != ncclSuccess ? first : e;
        },
        work, err, ops[0].peer);
}

static int nccl_wait(void *self, dt_comm_work *work, dt_err *err)
{
    (void)self;
    if (!work)
        return 0;
    nccl_work *w = reinterpret_cast<nccl_work *>(work);
    return nccl_wait_impl(w->c, w, err);
}

// =============================================================================================
// lifecycle
// =============================================================================================

static void comm_destroy(nccl_comm *c)
{
    if (!c)
        return;
    cudaSetDevice(c->device);
    pthread_mutex_lock(&c->mu);
    c->stopping = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (c->watchdog_running)
        pthread_join(c->watchdog, NULL);

    // Outstanding work nobody waited for: wait (bounded), then drop the handles.
    while (c->inflight.next != &c->inflight) {
        nccl_work *w = c->inflight.next;
        dt_err e = {};
        if (nccl_wait_impl(c, w, &e) != 0)
            DT_WARN("NCCL rank %d: at shutdown: %s", c->rank, e.msg);
    }
    pthread_mutex_lock(&c->mu);
    if (c->comm) {
        // Finalize flushes and waits for every rank (bounded); destroy then frees locally.
        ncclResult_t r = ncclCommFinalize(c->comm);
        if (r == ncclSuccess || r == ncclInProgress)
            r = settle_locked(c, "finalize", c->seq);
        if (c->comm) {
            if (r == ncclSuccess)
                ncclCommDestroy(c->comm);
            else
                ncclCommAbort(c->comm);
            c->comm = NULL;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (c->barrier_buf)
        cudaFree(c->barrier_buf);
    if (c->ready)
        cudaEventDestroy(c->ready);
    if (c->stream)
        cudaStreamDestroy(c->stream);
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static void nccl_destroy(void *self) { comm_destroy((nccl_comm *)self); }

static int nccl_split(void *self, int color, int key, const dt_comm_opts *child,
                      const dt_comm_backend_ops **ops, void **child_self, dt_err *err);

// wait_done NULL: the host learns a stream's progress only by polling the event, so comm.c's
// fallback (the time wait returned) is as good as anything this backend could stamp.
static const dt_comm_backend_ops nccl_ops = {
    "nccl",         nccl_allreduce, nccl_broadcast, nccl_allgather, nccl_reduce_scatter,
    nccl_barrier,   nccl_wait,      nccl_destroy,   NULL,           NULL,
    nccl_reduce,    nccl_p2p,       nccl_split,     NULL,
};

// A communicator's host and CUDA state (no NCCL communicator yet): the comm stream, the ordering
// event, the barrier's float.
static int comm_new(int rank, int world, int grank, int device, int timeout_ms, nccl_comm **out,
                    dt_err *err)
{
    *out = NULL;
    nccl_comm *c = (nccl_comm *)calloc(1, sizeof *c);
    if (!c)
        return dt_err_set(err, -ENOMEM, "NCCL: out of host memory");
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    c->inflight.next = c->inflight.prev = &c->inflight;
    c->rank = rank;
    c->world = world;
    c->grank = grank;
    c->device = device;
    c->timeout_s = (timeout_ms > 0 ? timeout_ms : 300000) / 1000.0;
    int lo = 0, hi = 0;
    cudaError_t ce = cudaSetDevice(c->device);
    if (ce != cudaSuccess) {
        int rc = dt_err_set(err, -EIO, "NCCL: cudaSetDevice(%d): %s", c->device,
                            cudaGetErrorString(ce));
        comm_destroy(c);
        return rc;
    }
    // Highest priority: comm kernels get scheduled as soon as they are ready, ahead of the
    // backward kernels they overlap with.
    cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if ((ce = cudaStreamCreateWithPriority(&c->stream, cudaStreamNonBlocking, hi)) != cudaSuccess ||
        (ce = cudaEventCreateWithFlags(&c->ready, cudaEventDisableTiming)) != cudaSuccess ||
        (ce = cudaMalloc((void **)&c->barrier_buf, sizeof(float))) != cudaSuccess) {
        int rc = dt_err_set(err, -EIO, "NCCL: CUDA set-up on device %d: %s", c->device,
                            cudaGetErrorString(ce));
        comm_destroy(c);
        return rc;
    }
    *out = c;
    return 0;
}

static int start_watchdog(nccl_comm *c, dt_err *err)
{
    if (pthread_create(&c->watchdog, NULL, watchdog_main, c) != 0)
        return dt_err_set(err, -EAGAIN, "NCCL: cannot start the watchdog thread");
    c->watchdog_running = true;
    return 0;
}

// ncclCommSplit of the parent (collective over it: every rank of the parent calls it).
static int nccl_split(void *self, int color, int key, const dt_comm_opts *child,
                      const dt_comm_backend_ops **ops, void **child_self, dt_err *err)
{
    nccl_comm *p = (nccl_comm *)self;
    *child_self = NULL;
    nccl_comm *c = NULL;
    int rc;
    if (color >= 0 &&
        (rc = comm_new(child->rank, child->world_size, p->grank, p->device,
                       (int)(p->timeout_s * 1000.0), &c, err)) != 0)
        return rc;
    cudaSetDevice(p->device);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclComm_t nc = NULL;
    pthread_mutex_lock(&p->mu);
    if (p->broken || !p->comm) {
        pthread_mutex_unlock(&p->mu);
        comm_destroy(c);
        return broken_err(p, err);
    }
    uint64_t seq = ++p->seq;
    ncclResult_t r = ncclCommSplit(p->comm, color >= 0 ? color : NCCL_SPLIT_NOCOLOR, key, &nc,
                                   &cfg);
    // The split is an operation of the parent (settle it there: it aborts the parent on its
    // deadline), then the new communicator finishes its own initialisation.
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle_locked(p, "split", seq);
    if (r != ncclSuccess && !p->broken)
        abort_locked(p, -EIO, "split #%llu (color %d, key %d) failed: %s (%s)",
                     (unsigned long long)seq, color, key, ncclGetErrorString(r),
                     p->comm ? ncclGetLastError(p->comm) : "");
    bool broken = p->broken;
    pthread_mutex_unlock(&p->mu);
    if (broken) {
        if (nc)
            ncclCommAbort(nc);
        comm_destroy(c);
        return broken_err(p, err);
    }
    if (color < 0) { // NCCL_SPLIT_NOCOLOR: no communicator for this rank
        if (nc)
            ncclCommDestroy(nc);
        return 0;
    }
    if (!nc) {
        comm_destroy(c);
        return dt_err_set(err, -EIO, "NCCL: ncclCommSplit (color %d) gave rank %d no "
                          "communicator", color, p->grank);
    }
    pthread_mutex_lock(&c->mu);
    c->comm = nc;
    r = settle_locked(c, "group initialisation", 0);
    if (r != ncclSuccess && !c->broken)
        abort_locked(c, -EIO, "ncclCommSplit: %s (%s)", ncclGetErrorString(r),
                     c->comm ? ncclGetLastError(c->comm) : "");
    pthread_mutex_unlock(&c->mu);
    if (c->broken) {
        rc = dt_err_set(err, c->err_code, "NCCL: creating group %d (rank %d of %d): %s", color,
                        c->rank, c->world, c->err_msg);
        comm_destroy(c);
        return rc;
    }
    if ((rc = start_watchdog(c, err)) != 0) {
        comm_destroy(c);
        return rc;
    }
    DT_DEBUG("NCCL group %d: rank %d of %d (global rank %d) on device %d", color, c->rank,
             c->world, c->grank, c->device);
    *ops = &nccl_ops;
    *child_self = c;
    return 0;
}

DT_CU_EXPORT int dt_nccl_get_unique_id(unsigned char id[DT_NCCL_ID_BYTES], dt_err *err)
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess)
        return dt_err_set(err, -EIO,
                          "NCCL: ncclGetUniqueId: %s (%s); check that a network interface is up "
                          "(NCCL_SOCKET_IFNAME) or use ddp.backend = cpu",
                          ncclGetErrorString(r), ncclGetLastError(NULL));
    memcpy(id, uid.internal, DT_NCCL_ID_BYTES);
    return 0;
}

DT_CU_EXPORT int dt_nccl_comm_create(const dt_comm_opts *opts,
                                     const unsigned char id[DT_NCCL_ID_BYTES],
                                     const dt_comm_backend_ops **ops, void **self, dt_err *err)
{
    int ndev = 0, rc = 0;
    cudaError_t ce = cudaGetDeviceCount(&ndev);
    if (ce != cudaSuccess || ndev == 0)
        return dt_err_set(err, -ENODEV, "NCCL: no usable GPU (%s): use ddp.backend = cpu",
                          ce != cudaSuccess ? cudaGetErrorString(ce) : "no device");
    if (opts->device_index < 0 || opts->device_index >= ndev)
        return dt_err_set(err, -ENODEV,
                          "NCCL: rank %d wants device %d (LOCAL_RANK) but %d GPU(s) are visible",
                          opts->rank, opts->device_index, ndev);
    nccl_comm *c = NULL;
    if ((rc = comm_new(opts->rank, opts->world_size, opts->rank, opts->device_index,
                       opts->timeout_ms, &c, err)) != 0)
        return rc;

    ncclUniqueId uid;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    ncclResult_t r;
    memcpy(uid.internal, id, DT_NCCL_ID_BYTES);
    cfg.blocking = 0;
    pthread_mutex_lock(&c->mu);
    r = ncclCommInitRankConfig(&c->comm, c->world, uid, c->rank, &cfg);
    if (r == ncclSuccess || r == ncclInProgress)
        r = settle_locked(c, "communicator initialisation", 0);
    if (r != ncclSuccess && !c->broken)
        abort_locked(c, -EIO, "ncclCommInitRankConfig: %s (%s)", ncclGetErrorString(r),
                     c->comm ? ncclGetLastError(c->comm) : ncclGetLastError(NULL));
    pthread_mutex_unlock(&c->mu);
    if (c->broken) {
        rc = dt_err_set(err, c->err_code,
                        "NCCL: creating the communicator (rank %d of %d, device %d): %s. Set "
                        "NCCL_DEBUG=INFO for details",
                        c->rank, c->world, c->device, c->err_msg);
        goto fail;
    }
    if ((rc = start_watchdog(c, err)) != 0)
        goto fail;
    DT_DEBUG("NCCL %d.%d communicator: rank %d of %d on device %d, timeout %.0f s", NCCL_MAJOR,
             NCCL_MINOR, c->rank, c->world, c->device, c->timeout_s);
    *ops = &nccl_ops;
    *self = c;
    return 0;

fail:
    comm_destroy(c);
    return rc;
}
