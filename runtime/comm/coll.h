/* coll.h - what the cpu backend's transports say about a collective in execution: its kind and
 * description (carried by every shared-memory slice and TCP message, so that ranks issuing
 * different collectives are detected), its deadline, and how to print and compare it.
 *
 * Shared by comm_cpu.c (which numbers and issues collectives) and its transports comm_shm.c and
 * comm_tcp.c (which check them against their peers'); it depends on dtype.h only, so the
 * backend and the transports need not include each other. Internal to runtime/comm/.
 */
#ifndef DT_COLL_H
#define DT_COLL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/dtype.h"

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

#endif
