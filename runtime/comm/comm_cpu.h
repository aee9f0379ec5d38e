/* comm_cpu.h - the "cpu" collective backend; internal to runtime/comm/ (comm.c creates it).
 * Everyone else uses runtime/comm/comm.h. What the backend and its transports say about a
 * collective (dt_coll_desc, dt_coll_ctx) is coll.h.
 *
 * The backend (comm_cpu.c) owns a comm thread that executes queued collectives in issue order.
 * It composes two transports:
 *   - comm_shm.c: ranks on one host, through one POSIX shared-memory segment per host;
 *   - comm_tcp.c: a pipelined, segmented TCP ring between hosts (one member per host, its
 *     lowest rank), or between every rank when the hosts hold different numbers of ranks or
 *     DTRAIN_COMM_TRANSPORT=tcp.
 * Point-to-point sends and receives run beside the collectives, on an engine with its own thread
 * (comm_p2p.c: shared-memory pairs on a host, direct TCP connections between hosts).
 * One host: shared memory only. One rank per host: the ring only. Both: hierarchical (reduce on
 * the host, ring between hosts, broadcast on the host).
 */
#ifndef DT_COMM_CPU_H
#define DT_COMM_CPU_H

#include <stdint.h>

#include "common/err.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm_impl.h"

/* Creates the cpu backend for opts (rank, world_size, run_id, attempt, timeout_ms, local_addr)
 * with store (a view already namespaced by run id, attempt and communicator number: borrowed for
 * the call only) for the bootstrap; gen is that communicator number (part of shared-memory
 * names, unique in the run and attempt). globals: (world_size) the global rank of each rank,
 * which errors name (a group split from a world), or NULL (a world: rank = global rank).
 * On success *ops and *self are set (destroy with ops->destroy(self)). */
int dt_comm_cpu_create(const dt_comm_opts *opts, dt_store *store, uint64_t gen,
                       const int *globals, const dt_comm_backend_ops **ops, void **self,
                       dt_err *err);

#endif
