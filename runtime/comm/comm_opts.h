/* comm_opts.h - the types the collective interface (comm.h) and its backends (comm_impl.h)
 * share: a communicator's options and the opaque handles. A leaf of runtime/comm/ (it includes
 * dtype.h and common/ only), so that comm.c can include the backends and the backends never
 * include comm.h back. Everyone outside runtime/comm/ gets it through comm.h.
 */
#ifndef DT_COMM_OPTS_H
#define DT_COMM_OPTS_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/comm/dtype.h"

typedef struct dt_comm dt_comm;           /* a communicator (comm.c) */
typedef struct dt_comm_work dt_comm_work; /* a collective in flight (each backend's own type) */

/* The collective backends; runtime/comm/ owns the list (the job's ddp.backend maps onto it,
 * dt_comm_kind_name gives the names back). */
typedef enum dt_comm_kind { DT_COMM_CPU = 0, DT_COMM_NCCL = 1 } dt_comm_kind;

/* "cpu", "nccl"; "?" for a value that is neither. */
const char *dt_comm_kind_name(dt_comm_kind kind);

typedef struct dt_comm_opts {
    dt_comm_kind backend;   /* DT_COMM_CPU or DT_COMM_NCCL */
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

/* One operation of a point-to-point batch (dt_comm_p2p in comm.h). */
typedef enum dt_p2p_kind { DT_P2P_SEND = 0, DT_P2P_RECV = 1 } dt_p2p_kind;

typedef struct dt_p2p_op {
    dt_p2p_kind kind;
    void *buf;       /* send: read; recv: written (backend memory, as for collectives) */
    size_t count;    /* elements of dtype */
    dt_dtype dtype;
    int peer;        /* rank in c */
} dt_p2p_op;

/* Fills o with the defaults: backend cpu, rank 0 of 1, timeout 300 s, everything else 0/NULL. */
void dt_comm_opts_default(dt_comm_opts *o);

#endif
