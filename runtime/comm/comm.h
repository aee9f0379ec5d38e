/* comm.h - the collective-communication interface shared by DDP, DP, SyncBatchNorm and the
 * trainer, with two backends: "cpu" (shared memory between ranks on one host, a pipelined TCP
 * ring between hosts, hierarchical when both) and "nccl" (in libdtrain_cuda.so).
 *
 * Both bootstrap through the dtrain store, under keys namespaced by run id and attempt, so a
 * worker of an earlier attempt can never be mixed into a new group.
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
 */
#ifndef DT_COMM_H
#define DT_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "rendezvous/store.h"

typedef enum dt_dtype { DT_FLOAT32 = 0, DT_BFLOAT16 = 1, DT_FLOAT16 = 2 } dt_dtype;
typedef enum dt_redop { DT_SUM = 0, DT_AVG = 1 } dt_redop;

size_t dt_dtype_size(dt_dtype t);
const char *dt_dtype_name(dt_dtype t);

typedef struct dt_comm dt_comm;
typedef struct dt_comm_work dt_comm_work;

typedef struct dt_comm_opts {
    const char *backend;    /* "cpu" or "nccl" */
    int rank, world_size;   /* global */
    int local_rank, local_world_size;
    const char *run_id;     /* namespace for store keys and shared-memory names */
    int attempt;            /* restart attempt; part of the namespace */
    int timeout_ms;         /* per collective (default 300000) */
    const char *local_addr; /* address peers use to reach this rank over TCP (NULL: hostname) */
    int device_index;       /* nccl: CUDA device (LOCAL_RANK) */
    uint64_t number;        /* the communicator's number in the namespace; 0: this process's
                               next (processes create their communicators in the same order).
                               Set it (the same on every rank) when several ranks of one group
                               live in one process, as DP's replica threads do. */
} dt_comm_opts;

void dt_comm_opts_default(dt_comm_opts *o);

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

#endif
