/* comm_impl.h - what a collective backend implements; internal to runtime/comm/ (comm.c, the cpu
 * backend comm_cpu.c, the NCCL backend comm_nccl.cu in libdtrain_cuda.so). Everyone else uses
 * runtime/comm/comm.h. It includes comm_opts.h, not comm.h, so that comm.c can include the
 * backends without a loop.
 *
 * runtime/comm/comm.c owns the dispatch: dt_comm_init picks the backend by opts->backend, does the
 * store bootstrap, and forwards every dt_comm_* call to ops with `self`. A backend's work handles
 * are its own type behind dt_comm_work. Before forwarding, comm.c has checked what every backend
 * would: the dtype is one of dtype.h's, the op too, avg only on floating types, and a reduce's
 * root is a rank. A backend runs every (dtype, op) pair that passes.
 */
#ifndef DT_COMM_IMPL_H
#define DT_COMM_IMPL_H

#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/comm/comm_opts.h"

typedef struct dt_comm_backend_ops {
    const char *name;
    int (*allreduce)(void *self, void *buf, size_t count, dt_dtype dtype, dt_redop op,
                     dt_comm_work **work, dt_err *err);
    int (*broadcast)(void *self, void *buf, size_t count, dt_dtype dtype, int root,
                     dt_comm_work **work, dt_err *err);
    int (*allgather)(void *self, const void *send, void *recv, size_t count, dt_dtype dtype,
                     dt_comm_work **work, dt_err *err);
    int (*reduce_scatter)(void *self, const void *send, void *recv, size_t count, dt_dtype dtype,
                          dt_redop op, dt_comm_work **work, dt_err *err);
    int (*barrier)(void *self, dt_err *err);
    int (*wait)(void *self, dt_comm_work *work, dt_err *err);
    void (*destroy)(void *self);
    /* Optional (NULL: dt_comm_mem_alloc fails with -ENOTSUP): see dt_comm_mem_alloc. */
    int (*mem_alloc)(void *self, size_t bytes, void **out, dt_err *err);
    void (*mem_free)(void *self, void *p);
    /* Optional (NULL: dt_comm_reduce runs allreduce, which leaves the root the same result). */
    int (*reduce)(void *self, void *buf, size_t count, dt_dtype dtype, dt_redop op, int root,
                  dt_comm_work **work, dt_err *err);
    /* Optional (NULL: dt_comm_p2p fails with -ENOTSUP): a point-to-point batch, see dt_comm_p2p.
     * comm.c has checked every op (kind, peer a rank other than self, dtype). Its work handle
     * is waited with wait, like a collective's. */
    int (*p2p)(void *self, const dt_p2p_op *ops, int n, dt_comm_work **work, dt_err *err);
    /* Optional: the backend splits itself (nccl: ncclCommSplit), collectively over self; every
     * rank calls it, also with color < 0 (then *child_self = NULL). child: the new group's
     * options (rank and world_size in the group, the parent's backend, timeout and device).
     * NULL: comm.c bootstraps each group as a new communicator through the store (cpu). */
    int (*split)(void *self, int color, int key, const dt_comm_opts *child,
                 const struct dt_comm_backend_ops **ops, void **child_self, dt_err *err);
    /* Optional: wait, and *done_ns (never NULL) = when the backend finished the work, on
     * dt_now_ns's clock (see dt_comm_wait_done). NULL: comm.c calls wait and takes the time it
     * returned. Last in the table, so that positional tables (comm_nccl.cu) stay valid. */
    int (*wait_done)(void *self, dt_comm_work *work, uint64_t *done_ns, dt_err *err);
    /* Optional: the payload bytes this rank has sent so far over every transport (collectives
     * and point-to-point), as the transports counted them (see dt_comm_stats.sent_bytes). NULL:
     * comm.c counts each call at dispatch with the ring algorithm's share (nccl, which does not
     * say what it moved). After wait_done, the last before it, so that positional tables
     * (comm_nccl.cu) stay valid. */
    uint64_t (*sent_bytes)(void *self);
} dt_comm_backend_ops;

/* The NCCL backend in libdtrain_cuda.so exports these two symbols. comm.c calls the first on
 * rank 0, publishes the id through the store under the run/attempt namespace, and every rank then
 * calls the second. */
#define DT_NCCL_ID_BYTES 128
#define DT_NCCL_GET_ID_SYMBOL "dt_nccl_get_unique_id"
#define DT_NCCL_CREATE_SYMBOL "dt_nccl_comm_create"
typedef int (*dt_nccl_get_unique_id_fn)(unsigned char id[DT_NCCL_ID_BYTES], dt_err *err);
typedef int (*dt_nccl_comm_create_fn)(const dt_comm_opts *opts,
                                      const unsigned char id[DT_NCCL_ID_BYTES],
                                      const dt_comm_backend_ops **ops, void **self, dt_err *err);

#endif
