/* comm_tcp.h - a pipelined, segmented TCP ring between hosts; internal to the cpu comm backend
 * (runtime/comm/comm_cpu.c).
 *
 * M members (one per host, or every rank), member i sending to member i+1 and receiving from
 * member i-1 over two TCP connections. All-reduce is reduce-scatter then all-gather over M chunks
 * (2(M-1) steps, each member sending 2(M-1)/M of the buffer: the bandwidth-optimal ring).
 * Every step streams in segments: a member forwards the first bytes of a chunk as soon as they
 * are reduced, while the rest of the chunk is still arriving, so the steps overlap and a large
 * all-reduce runs at link speed rather than at (link speed / steps).
 *
 * Each collective begins with its description in both directions, so neighbours that issue
 * different collectives fail with -EPROTO instead of exchanging wrong data. Calls are bounded
 * by ctx->deadline_ns; a closed connection is -ECONNRESET naming the neighbour. After any error
 * the ring closes its sockets (its neighbours then fail at once) and is unusable.
 */
#ifndef DT_COMM_TCP_H
#define DT_COMM_TCP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/comm/coll.h"
#include "runtime/comm/dtype.h"

typedef struct dt_ring dt_ring;

typedef struct dt_ring_opts {
    int index, size;          /* this member's index in the ring, members (>= 2) */
    const int *global_ranks;  /* (size) global rank of each member, for messages (copied) */
    const char *next_host;    /* where member index+1 listens */
    int next_port;
    const char *prev_host;    /* member index-1's host, for messages (NULL: unknown; copied) */
    const char *next_name;    /* member index+1's host, for messages (NULL: next_host; copied) */
    int timeout_ms;           /* the communicator's timeout: TCP_USER_TIMEOUT of both sockets
                                 (0 = the kernel's default) */
    int listen_fd;            /* borrowed: where member index-1 connects to us */
    uint64_t tag;             /* group identity: connections from other groups are refused */
    size_t segment_bytes;     /* reduction pipeline unit (0 = 256 KiB) */
} dt_ring_opts;

/* Connects to the next member and accepts the previous one (until deadline_ns). */
int dt_ring_connect(dt_ring **out, const dt_ring_opts *opts, uint64_t deadline_ns, dt_err *err);

/* Closes both connections. Accepts NULL. */
void dt_ring_close(dt_ring *r);

/* Closes the connections now so that the neighbours fail promptly (after an error elsewhere). */
void dt_ring_abort(dt_ring *r);

/* buf (count of t) = op over members (sum: scale * the sum; see dt_reduce). In place. */
int dt_ring_allreduce(dt_ring *r, void *buf, size_t count, dt_dtype t, dt_redop op,
                      float scale, const dt_coll_ctx *ctx, dt_err *err);
/* buf (bytes) from member root to all. */
int dt_ring_broadcast(dt_ring *r, void *buf, size_t bytes, int root, const dt_coll_ctx *ctx,
                      dt_err *err);
/* recv (size * bytes) = every member's send (bytes) in member order. send may be
 * recv + index*bytes. */
int dt_ring_allgather(dt_ring *r, const void *send, void *recv, size_t bytes,
                      const dt_coll_ctx *ctx, dt_err *err);
/* recv (count) = op over members of send[index*count ...] (as dt_ring_allreduce). */
int dt_ring_reduce_scatter(dt_ring *r, const void *send, void *recv, size_t count, dt_dtype t,
                           dt_redop op, float scale, const dt_coll_ctx *ctx, dt_err *err);
/* Returns when every member has entered. */
int dt_ring_barrier(dt_ring *r, const dt_coll_ctx *ctx, dt_err *err);

/* Payload bytes this member has written to the next one so far (the 40-byte headers of each
 * collective not counted). Any thread; 0 for NULL. */
uint64_t dt_ring_sent(const dt_ring *r);

/* ---- helpers shared with the point-to-point engine (comm_p2p.c) ---- */

/* A blocking-style connect to host:port (retried with backoff until deadline_ns); *out is a
 * non-blocking socket. Errors name host and port. */
int dt_tcp_connect(const char *host, int port, uint64_t deadline_ns, int *out, dt_err *err);
/* Sends (out) or receives exactly n bytes on a non-blocking socket until deadline_ns: 0,
 * -ETIMEDOUT, -ECONNRESET (closed) or -errno. */
int dt_tcp_io_all(int fd, void *buf, size_t n, bool out, uint64_t deadline_ns);
/* TCP_NODELAY, non-blocking, and keepalive probes (after 5 s idle, every 2 s, 3 unanswered:
 * a peer cut off while the connection is idle is found within about 11 s, before the next
 * collective waits out its timeout on it). */
void dt_tcp_tune(int fd);

#endif
