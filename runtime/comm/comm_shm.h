/* comm_shm.h - collectives between the ranks of one host through POSIX shared memory;
 * internal to the cpu comm backend (runtime/comm/comm_cpu.c).
 *
 * One segment per host and communicator, created by the host's first rank, attached by the
 * others, and unlinked by whichever rank attaches last (so nothing is left in /dev/shm even if a
 * process dies later; the mapping lives until every rank has unmapped it). Segments whose
 * creator died before that point are removed by the next group of the same run (dt_shm_clean).
 *
 * Every call is executed by one thread per rank (the comm thread), with the same sequence of
 * calls on every local rank. Calls are bounded by ctx->deadline_ns; a dead peer (its process
 * exited), a peer that reported a failure, and a peer executing another collective are errors
 * naming the collective, its sequence number and the peer's global rank. After an error the
 * engine is unusable: it calls dt_shm_abort itself so that its peers fail promptly too.
 */
#ifndef DT_COMM_SHM_H
#define DT_COMM_SHM_H

#include <stdbool.h>
#include <stddef.h>

#include "common/err.h"
#include "runtime/comm/coll.h"
#include "runtime/comm/dtype.h"

#define DT_SHM_MAX_LOCAL 256

typedef struct dt_shm dt_shm;

typedef struct dt_shm_opts {
    const char *name;         /* segment name, "/dtrain...." (see dt_shm_name) */
    int local_rank;           /* this rank's index on the host */
    int local_size;           /* ranks on the host, 2..DT_SHM_MAX_LOCAL */
    const int *global_ranks;  /* (local_size) global rank of each local index (copied) */
    size_t slot_bytes;        /* staging bytes per rank and slice, 8 slices (0 = 512 KiB) */
    int spin_us;              /* spin before sleeping on a futex (<0 = default) */
    long long mem_max_bytes;  /* communicator memory a rank may put in /dev/shm (<0 = no limit) */
} dt_shm_opts;

/* Writes the segment name for (run_id, attempt, communicator number gen, host index). */
void dt_shm_name(char *buf, size_t cap, const char *run_id, int attempt, uint64_t gen,
                 int host_index);

/* Removes segments of this user and run (any attempt) whose creating process no longer exists;
 * returns how many it removed. Never fails (problems are logged at debug level). */
int dt_shm_clean(const char *run_id);

/* Creates (create = true: the host's first rank) or attaches to the segment. Then call
 * dt_shm_ready before any collective. */
int dt_shm_open(dt_shm **out, const dt_shm_opts *opts, bool create, dt_err *err);

/* Waits (until deadline_ns) for every local rank to attach. */
int dt_shm_ready(dt_shm *s, uint64_t deadline_ns, dt_err *err);

/* Unmaps (and unlinks when still linked). Accepts NULL. */
void dt_shm_close(dt_shm *s);

/* Tells the peers that this rank failed with msg (they fail with it within a few ms). */
void dt_shm_abort(dt_shm *s, const char *msg);

/* buf (count of t) = op over local ranks (sum: scale * the sum; see dt_reduce). In place. */
int dt_shm_allreduce(dt_shm *s, void *buf, size_t count, dt_dtype t, dt_redop op,
                     float scale, const dt_coll_ctx *ctx, dt_err *err);
/* buf (bytes) from local index root to every local rank. */
int dt_shm_broadcast(dt_shm *s, void *buf, size_t bytes, int root, const dt_coll_ctx *ctx,
                     dt_err *err);
/* recv (local_size * bytes) = every local rank's send (bytes), in local index order. */
int dt_shm_allgather(dt_shm *s, const void *send, void *recv, size_t bytes,
                     const dt_coll_ctx *ctx, dt_err *err);
/* recv (count) = op over local ranks of send[local_rank*count ...] (as dt_shm_allreduce). */
int dt_shm_reduce_scatter(dt_shm *s, const void *send, void *recv, size_t count, dt_dtype t,
                          dt_redop op, float scale, const dt_coll_ctx *ctx, dt_err *err);
int dt_shm_barrier(dt_shm *s, const dt_coll_ctx *ctx, dt_err *err);

/* Payload bytes this rank has sent so far, as a message-passing transport would: what its peers
 * read of its data (see count_sent in comm_shm.c). Any thread; 0 for NULL. */
uint64_t dt_shm_sent(const dt_shm *s);
/* Communicator memory (see dt_comm_mem_alloc in comm.h): every local rank creates a
 * shared-memory object of `bytes` (zero-filled, 64-byte aligned) and maps every peer's. A call on
 * every local rank, like a collective (ctx->desc describes it, so ranks that ask for different
 * sizes fail as a mismatch). *out = this rank's memory. dt_shm_allreduce of a range of it runs
 * without staging copies. -ENOSPC (the group stays usable) when /dev/shm cannot hold it on some
 * local rank, or it exceeds opts.mem_max_bytes there: every local rank gets -ENOSPC, and
 * err says which rank and why. */
int dt_shm_mem_alloc(dt_shm *s, size_t bytes, void **out, const dt_coll_ctx *ctx, dt_err *err);
/* Unmaps p (from dt_shm_mem_alloc) and this rank's view of the peers' memory of the same
 * allocation; false when p is not such memory (or NULL). */
bool dt_shm_mem_free(dt_shm *s, void *p);

#endif
