/* comm_cpu.h - the "cpu" collective backend and what its transports share; internal to
 * runtime/comm*.c. Everyone else uses runtime/comm/comm.h.
 *
 * The backend (comm_cpu.c) owns a comm thread that executes queued collectives in issue order.
 * It composes two transports:
 *   - comm_shm.c: ranks on one host, through one POSIX shared-memory segment per host;
 *   - comm_tcp.c: a pipelined, segmented TCP ring between hosts (one member per host, its
 *     lowest rank), or between every rank when the hosts hold different numbers of ranks or
 *     DTRAIN_COMM_TRANSPORT=tcp.
 * One host: shared memory only. One rank per host: the ring only. Both: hierarchical (reduce on
 * the host, ring between hosts, broadcast on the host).
 */
#ifndef DT_COMM_CPU_H
#define DT_COMM_CPU_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "runtime/comm/comm.h"
#include "runtime/comm/comm_impl.h"

/* What a collective is; every transport message carries it so that ranks that issue different
 * collectives are detected (a mismatch is -EPROTO with both descriptions). */
typedef enum dt_coll_kind {
    DT_COLL_ALLREDUCE = 1,
    DT_COLL_BROADCAST = 2,
    DT_COLL_ALLGATHER = 3,
    DT_COLL_REDUCE_SCATTER = 4,
    DT_COLL_BARRIER = 5,
    DT_COLL_MEM_ALLOC = 6, /* dt_comm_mem_alloc: count = bytes */
} dt_coll_kind;

typedef struct dt_coll_desc {
    uint64_t seq;   /* sequence number of the collective on its communicator (1, 2, ...) */
    int32_t kind;   /* dt_coll_kind */
    int32_t dtype;  /* dt_dtype */
    uint64_t count; /* elements (per rank for allgather and reduce_scatter) */
    int32_t root;   /* broadcast: global root rank; else -1 */
    int32_t redop;  /* dt_redop for reductions; else -1 */
} dt_coll_desc;

/* A collective in execution: its description and deadline (CLOCK_MONOTONIC ns). */
typedef struct dt_coll_ctx {
    dt_coll_desc desc;
    uint64_t deadline_ns;
    int timeout_ms;
    bool background; /* run by the comm thread, overlapping the caller's work: spin less... */
    const _Atomic int *waiters; /* ...unless this is > 0: a caller now blocks on the result */
} dt_coll_ctx;

/* "allreduce #12 (float32 x 1000, avg)" into buf; returns buf. */
const char *dt_coll_describe(const dt_coll_desc *d, char *buf, size_t cap);

/* True when two ranks' descriptions are of the same collective. */
int dt_coll_same(const dt_coll_desc *a, const dt_coll_desc *b);

/* Creates the cpu backend for opts (rank, world_size, run_id, attempt, timeout_ms, local_addr)
 * with store (a view already namespaced by run id, attempt and communicator number: borrowed for
 * the call only) for the bootstrap; gen is that communicator number (part of shared-memory
 * names). On success *ops and *self are set (destroy with ops->destroy(self)). */
int dt_comm_cpu_create(const dt_comm_opts *opts, dt_store *store, uint64_t gen,
                       const dt_comm_backend_ops **ops, void **self, dt_err *err);

#endif
