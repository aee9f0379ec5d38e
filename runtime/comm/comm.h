/* comm.h - the collective-communication interface shared by DDP, DP, SyncBatchNorm and the
 * trainer.
 *
 * What runtime/comm/ is
 *   - this interface (comm.h, comm.c: options, the store bootstrap namespace, dispatch);
 *   - the element types and reduction ops (dtype.h) and the element kernels of the CPU
 *     collectives (comm_reduce.h: conversions, n-way reductions, streaming copies);
 *   - the "cpu" backend (comm_cpu.c): a comm thread that runs collectives in issue order over two
 *     transports, shared memory between the ranks of one host (comm_shm.c) and a pipelined TCP
 *     ring between hosts (comm_tcp.c), hierarchical when both; what they say about a collective
 *     in execution is coll.h; point-to-point runs on an engine of its own (comm_p2p.c);
 *   - the "nccl" backend (comm_nccl.cu, in libdtrain_cuda.so, loaded at run time by comm.c);
 *   - comm_impl.h, the table of operations a backend implements, and comm_opts.h, the types
 *     this interface and the backends share.
 * Inside the folder dependencies point one way: comm.c -> backends (comm_impl.h, comm_opts.h)
 * -> transports -> coll.h, comm_reduce.h -> dtype.h; in the folder only comm.c includes comm.h
 * (tools/module-loops.py finds no loop here).
 *
 * What it may include: common/ (errors, logging, env, util, half), rendezvous/store.h (the store
 * client, for the bootstrap only), kernels/backend.h (comm.c: where libdtrain_cuda.so is) and,
 * in comm_nccl.cu only, kernels/cuda/cuda_internal.h (the CUDA backend's compute streams).
 * Never runtime/train/ or runtime/launch/: the trainer uses comm/, not the other way round, and
 * the launcher runs no collective.
 *
 * Backends: "cpu" (shared memory between ranks on one host, a pipelined TCP ring between hosts,
 * hierarchical when both) and "nccl" (in libdtrain_cuda.so). Both bootstrap through the dtrain
 * store, under keys namespaced by run id and attempt, so a worker of an earlier attempt can never
 * be mixed into a new group.
 *
 * Every collective is asynchronous: it returns at once with a work handle (or, when `work` is
 * NULL, waits itself). Collectives are issued in the same order on every rank; each message
 * carries (sequence number, op, dtype, count) and a rank that disagrees is reported as an error
 * naming the op, its sequence number and both descriptions, instead of corrupting data. No call
 * waits forever: a dead or stalled peer becomes -ETIMEDOUT (or -ECONNRESET) within
 * opts.timeout_ms, with a message naming the operation, its sequence number and the peer.
 * After an error the communicator is unusable; the worker exits non-zero and the agent restarts
 * the job.
 *
 * Buffers are backend memory of the device the communicator was created for (host memory for
 * "cpu", device memory for "nccl"). Counts are in elements of dtype.
 *
 * Types (dtype.h): float32, bfloat16, float16 (reductions accumulate in float32), float64
 * (reductions in double; avg divides the sum by the world in double) and int32, int64, uint8
 * (reductions exact in the type, wrapping on overflow): every collective takes every
 * type, on both backends, so integers, flags and counters travel as what they are, never packed
 * into floats. Reductions: sum, max, min on every type; avg on the floating types only (an
 * integer avg is -EINVAL: sum, then divide as the caller needs).
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm_opts.h" /* dt_comm_opts, dt_comm, dt_comm_work */
#include "runtime/comm/dtype.h"     /* dt_dtype, dt_redop */

/* dt_comm_opts and dt_comm_opts_default are in comm_opts.h. */

/* Creates the communicator: every rank must call it with the same world_size, run_id and
 * attempt. store is borrowed for the bootstrap only (it may be freed afterwards). */
int dt_comm_init(dt_comm **out, dt_store *store, const dt_comm_opts *opts, dt_err *err);

/* Waits for outstanding work (bounded by the timeout), releases shared memory and sockets.
 * Accepts NULL. */
void dt_comm_free(dt_comm *c);

int dt_comm_rank(const dt_comm *c);
int dt_comm_world_size(const dt_comm *c);

/* In-place all-reduce of buf (count elements). */
int dt_comm_allreduce(dt_comm *c, void *buf, size_t count, dt_dtype dtype, dt_redop op,
                      dt_comm_work **work, dt_err *err);
/* In-place reduction to root: root's buf gets the reduction over ranks; the other ranks' buf is
 * unspecified afterwards (the cpu backend runs it as an all-reduce, nccl as ncclReduce). */
int dt_comm_reduce(dt_comm *c, void *buf, size_t count, dt_dtype dtype, dt_redop op, int root,
                   dt_comm_work **work, dt_err *err);
/* In-place broadcast of buf from root. */
int dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root,
                      dt_comm_work **work, dt_err *err);
/* recv (world_size * count) = concatenation of every rank's send (count), in rank order. */
int dt_comm_allgather(dt_comm *c, const void *send, void *recv, size_t count, dt_dtype dtype,
                      dt_comm_work **work, dt_err *err);
/* recv (count) = reduction over ranks of send[rank*count .. (rank+1)*count). */
int dt_comm_reduce_scatter(dt_comm *c, const void *send, void *recv, size_t count,
                           dt_dtype dtype, dt_redop op, dt_comm_work **work, dt_err *err);
/* Blocking barrier. */
int dt_comm_barrier(dt_comm *c, dt_err *err);

/* Waits for one piece of work and frees its handle (also on failure). */
int dt_comm_wait(dt_comm *c, dt_comm_work *work, dt_err *err);

/* dt_comm_wait, and *done_ns = when the work finished, on dt_now_ns's clock (CLOCK_MONOTONIC
 * nanoseconds, the clock trace.h's spans use), which may be well before the wait: a timeline can
 * end an overlapped collective's span where it ended rather than where it was waited on.
 *   cpu: when the comm thread (or the caller that ran it in place) finished the collective;
 *        for a point-to-point batch, when the engine completed its last send or receive.
 *   nccl: when the wait saw the collective's event complete (the same upper bound as the
 *        return of dt_comm_wait: the host learns of a stream's progress only by asking).
 * A NULL work, or work that failed, gives the time the wait returned. */
int dt_comm_wait_done(dt_comm *c, dt_comm_work *work, uint64_t *done_ns, dt_err *err);

/* Communicator memory: host memory (64-byte aligned, zero-filled) that the communicator's
 * transport can read and write in place, like NCCL's registered user buffers. On the cpu backend
 * it is shared memory mapped by every rank of the host, and an all-reduce of a range of it (the
 * same offset on every rank) runs without staging copies: each rank sums its share of the range
 * straight from its peers' memory and copies the others' results from theirs, about 2.5 passes
 * over the data per rank instead of 4 (see comm_shm.c). Everywhere else it behaves as plain
 * memory. Collective: every rank calls it in the same order with the same bytes (a rank that
 * disagrees fails as on a mismatched collective). -ENOTSUP when the backend has none (nccl: its
 * buffers are device memory); then use ordinary backend memory. */
int dt_comm_mem_alloc(dt_comm *c, size_t bytes, void **out, dt_err *err);
/* Releases communicator memory (not collective; no collective on it may be in flight). Accepts
 * NULL. */
void dt_comm_mem_free(dt_comm *c, void *p);

/* ---- counters: what a communicator moved ---------------------------------------------------
 *
 * Every communicator (a world or a group) counts, per operation, the calls issued on it and
 * their bytes, in comm.c's dispatch: one place for every backend, so a strategy or a benchmark
 * reads what really went through the groups it owns (dt_comm_stats_get on its tensor, data or
 * pipeline group) instead of computing it from a schedule. A call is counted when the backend
 * accepts it (an argument error is not counted; an op that fails later is). Counters are
 * relaxed atomics: several threads may issue on one communicator (DP's replicas, DDP's reducer
 * beside the trainer) and each increment costs one uncontended atomic add.
 *
 * Bytes are nccl-tests' "size" of the op (its algorithm bandwidth is bytes / time), on every
 * rank alike:
 *   allreduce, reduce, broadcast   count x dtype size (the buffer)
 *   allgather                      world x count x dtype size (the whole output; count is each
 *                                  rank's part)
 *   reduce_scatter                 world x count x dtype size (the whole input; count is each
 *                                  rank's output)
 *   barrier                        0 (calls only)
 *   send, recv                     count x dtype size per op, sends and receives apart; calls
 *                                  count ops, not batches
 * The bytes a rank puts on the wire depend on the algorithm (a ring all-reduce sends 2 (n-1)/n of
 * its size: nccl-tests' bus bandwidth factor); these are the sizes, not the wire bytes.
 * dt_comm_split's own exchange (an allgather of two int32 per rank) is counted on the parent. */
typedef enum dt_comm_op {
    DT_COMM_OP_ALLREDUCE = 0,
    DT_COMM_OP_REDUCE,
    DT_COMM_OP_BROADCAST,
    DT_COMM_OP_ALLGATHER,
    DT_COMM_OP_REDUCE_SCATTER,
    DT_COMM_OP_BARRIER,
    DT_COMM_OP_SEND,
    DT_COMM_OP_RECV,
    DT_COMM_OP_COUNT
} dt_comm_op;

typedef struct dt_comm_stats {
    uint64_t calls[DT_COMM_OP_COUNT]; /* ops issued (p2p: sends and receives, not batches) */
    uint64_t bytes[DT_COMM_OP_COUNT]; /* their sizes, as above */
    double wait_s; /* seconds callers were blocked in this communicator: dt_comm_wait from entry
                      to return, and blocking calls (work = NULL, barrier) from issue to return;
                      summed over threads (two waiting at once count twice). Asynchronous
                      collectives that finish before they are waited on cost (almost) none. */
    uint64_t sent_bytes; /* payload bytes this rank sent, over every op, as the transports
                            counted them where the data left (the cpu backend: bytes written
                            to the TCP ring and point-to-point streams, and what the host's
                            peers read of this rank's data in shared memory, counted where it
                            offers it; framing not included). Unlike bytes[] these are wire
                            bytes: a ring all-reduce of S bytes adds 2 (n-1)/n S (up to the
                            chunking's rounding). nccl does not say what it moves: there each
                            call adds the ring algorithm's share of its size (2 (n-1)/n for an
                            all-reduce, (n-1)/n for the others, a send its size). Counted as
                            the transfer happens, complete once the op was waited for. */
} dt_comm_stats;

/* "allreduce", "reduce", "broadcast", "allgather", "reduce_scatter", "barrier", "send", "recv";
 * "?" for anything else. */
const char *dt_comm_op_name(dt_comm_op op);

/* Copies c's counters into *out (zeroes when c is NULL). Each field is read atomically, the
 * whole not: read them when no other thread is issuing on c for figures that add up. */
void dt_comm_stats_get(const dt_comm *c, dt_comm_stats *out);

/* Zeroes c's counters (accepts NULL). Increments racing with it may survive or be lost: reset
 * when no other thread is issuing on c. Taking the difference of two dt_comm_stats_get (what
 * dt_comm_stats_sub does) needs no reset and no write access. */
void dt_comm_stats_reset(dt_comm *c);

/* *out = *after - *before, field by field (counts of the calls between the two snapshots). */
void dt_comm_stats_sub(const dt_comm_stats *after, const dt_comm_stats *before,
                       dt_comm_stats *out);

/* ---- groups and point-to-point (tensor and pipeline parallelism) --------------------------
 *
 * dt_comm_split: like MPI_Comm_split / ncclCommSplit. Collective over c: every rank of c calls
 * it, in the same order relative to c's other collectives. Ranks that pass the same color >= 0
 * form one new communicator, ranked by (key, rank in c); a rank that passes color < 0 joins none
 * and gets *out = NULL. The new communicator has c's backend, timeout and device, its own store
 * namespace (derived from c's and the split's sequence number, so two splits never mix) and its
 * own progress: collectives on different communicators may be in flight at the same time, on
 * the same or different ranks, without interfering or deadlocking each other. A rank that dies
 * fails every communicator it belongs to within the timeout, with an error naming the rank
 * (its rank in c's world, the "global" rank, as well as in the group). store: borrowed for the
 * bootstrap of the new communicator only (the cpu backend finds its peers through it; may be NULL
 * where the backend needs none, nccl with ncclCommSplit, or for a group of one). A group of one
 * is a valid communicator (its collectives are copies). Groups may be split again (nested).
 * Free groups with dt_comm_free, before their parent.
 * cpu: the group is a communicator of its own (its topology, shared memory per host and TCP
 * ring, derived among its members alone; its own comm thread and point-to-point engine) under
 * the store namespace <parent's>split/<n>/<color>/. nccl: ncclCommSplit, with its own stream
 * and watchdog. Transport errors of a group name its members by global rank. */
int dt_comm_split(dt_comm *c, dt_store *store, int color, int key, dt_comm **out, dt_err *err);

/* The rank in the world c was split from (c's first ancestor) of c's rank r; r for a world;
 * -1 when r is not a rank of c. */
int dt_comm_global_rank(const dt_comm *c, int r);

/* Point-to-point. A batch of sends and receives (NCCL: one ncclGroupStart/End; Megatron's
 * batch_isend_irecv) progresses together, so one batch may send to a peer and receive from it
 * (or from another) without deadlock whatever the sizes. Matching: the k-th send from A to B on
 * c matches B's k-th receive from A on c (count and dtype must agree: a mismatch is an error on
 * both sides naming the two, like a mismatched collective). A send completes once its buffer may
 * be reused; it may wait for the matching receive to be posted (as NCCL's does), so a rank must
 * never wait on a send before posting the receives its peers' sends need. Point-to-point ops do
 * not take part in c's collective sequence: use a communicator for point-to-point only (the
 * pipeline group), or issue collectives and point-to-point in an order every rank agrees on.
 * A dead peer fails the batch within the timeout with an error naming the peer, the op and its
 * count. A send or receive to oneself is -EINVAL. An empty batch (n = 0) is done at once.
 *
 * What each backend does:
 *   - cpu: point-to-point runs on the communicator's point-to-point engine, its own thread,
 *     beside (never queued behind) the communicator's collectives, so the two never wait on each
 *     other on the cpu backend (do not rely on it: nccl orders them). All posted ops progress
 *     together, across batches, in issue order per (sender, receiver). A pair of ranks on one
 *     host talks through a shared-memory segment (two rings), ranks on different hosts (or with
 *     DTRAIN_COMM_TRANSPORT=tcp) over a direct TCP connection. Each send is announced, the
 *     receiver answers when its matching receive is posted (a count or dtype mismatch fails both
 *     sides with -EPROTO, each naming both ops), and the data follows: a send completes when the
 *     receive is posted and its last byte is in the shared ring or socket buffer; a receive when
 *     its last byte has arrived. A peer that exits or closes its connection fails the batch at
 *     once (-ECONNRESET); one that never posts its side fails it after the timeout (-ETIMEDOUT),
 *     counted from the batch's posting. After any failure (of point-to-point or a collective)
 *     the communicator is unusable.
 *   - nccl: one ncclGroupStart, ncclSend/ncclRecv per op, ncclGroupEnd on the communicator's
 *     stream, in issue order with its collectives; a send waits for the matching receive. NCCL
 *     does not detect a count mismatch (undefined there). */
/* dt_p2p_kind and dt_p2p_op (one send or receive of a batch) are in comm_opts.h. */
int dt_comm_p2p(dt_comm *c, const dt_p2p_op *ops, int n, dt_comm_work **work, dt_err *err);
/* One send or one receive: a batch of one. */
int dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer,
                 dt_comm_work **work, dt_err *err);
int dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer,
                 dt_comm_work **work, dt_err *err);

/* ---- observing the calls: the flight recorder's hook ----------------------------------------
 *
 * Every collective and point-to-point call passes through comm.c's dispatch, which tells a
 * process-wide observer (set once, before the first communicator is created; the trainer's
 * runtime/train/obs/flight.c records the calls into its flight records) what each call is, when
 * its caller begins to wait on it, and how it ended. The comm layer knows nothing of steps or
 * phases: the observer adds them. Without an observer the dispatch costs one atomic load more.
 *
 * Sequence numbers: a communicator numbers its collectives 1, 2, ... in issue order, as the cpu
 * backend does in its messages and errors ("allreduce #k"), so the k-th call on one rank is the
 * k-th on every other (dt_comm_mem_alloc, a collective of the cpu backend's sequence, takes a
 * number too, unrecorded); point-to-point ops are numbered per (peer, direction): the k-th send to
 * a peer matches that peer's k-th receive from this rank. Labels name a communicator's kind
 * ("world" for one made by dt_comm_init, "group" for a split until dt_comm_set_label names it:
 * the grid names its groups "tensor", "data", "pipeline", "embedding"); its id is the same on
 * every member and differs between communicators (a hash of its store namespace). */
typedef struct dt_comm_call {
    const char *group;     /* the communicator's label */
    uint64_t group_id;     /* the same on every member of the communicator */
    int group_rank, group_size;
    const int *members;    /* (group_size) global rank of each group rank; NULL in a world */
    dt_comm_op op;
    dt_dtype dtype;
    size_t count;          /* elements, as the call was given */
    int peer;              /* point-to-point: the peer's global rank; broadcast, reduce: the
                              root's global rank; -1 otherwise */
    uint64_t seq;          /* as above */
} dt_comm_call;

/* What an observer may ask of a call it is told of: a test hook, for the faults DTRAIN_FAULT
 * injects (runtime/train/obs/flight.h), never used otherwise. */
enum {
    DT_COMM_OBS_RUN = 0,   /* run it */
    DT_COMM_OBS_SKIP,      /* a collective: do not run it, return 0 as if done (it takes no
                              sequence number: the rank's next call takes this one's) */
    DT_COMM_OBS_HALVE,     /* a point-to-point receive: post it for half its count */
};

typedef struct dt_comm_observer {
    /* A call is about to go to the backend. Returns a token for the calls below (0: not
     * recorded); *action (DT_COMM_OBS_RUN on entry) may be changed as above. */
    uint64_t (*issue)(void *arg, const dt_comm_call *call, int *action);
    /* Its caller is blocked on it from now: dt_comm_wait, or a blocking call (which gets its
     * issue and then its wait at once). */
    void (*wait)(void *arg, uint64_t token);
    /* It ended: rc 0 when it finished at done_ns (dt_now_ns's clock), else it failed with rc
     * and msg (the error's message, may be ""). */
    void (*end)(void *arg, uint64_t token, int rc, uint64_t done_ns, const char *msg);
    /* The calling thread was blocked in the comm layer from t0 to t1 (a wait or a blocking
     * call; dt_comm_stats' wait_s counts the same intervals). */
    void (*blocked)(void *arg, uint64_t t0, uint64_t t1);
    void *arg;
} dt_comm_observer;

/* Sets the process's observer (copied; NULL removes it). Set it before creating communicators:
 * a call issued before and waited after a change is not reported. */
void dt_comm_set_observer(const dt_comm_observer *o);

/* Names c's kind for its observer's records (copied, at most 15 bytes kept). */
void dt_comm_set_label(dt_comm *c, const char *label);
/* c's label ("world", "group", or what dt_comm_set_label set). */
const char *dt_comm_label(const dt_comm *c);

#endif
