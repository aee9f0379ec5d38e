/* comm_p2p_link.h - one pair's byte stream for the point-to-point engine (comm_p2p.c); internal
 * to runtime/comm/.
 *
 * A link is the bidirectional byte stream between this rank and one peer, and nothing of what
 * travels on it (the frames, the matching of sends and receives are comm_p2p.c's):
 *   - same host: a shared-memory segment with two single-producer, single-consumer byte rings
 *     (RING_CAP bytes a direction, published in RING_CHUNK pieces so the reader starts early),
 *     created by the lower rank (side 0) and unlinked once both mapped it; futex doorbells in
 *     the segment let a side sleep until its peer moved, an abort flag tells it the peer failed;
 *   - otherwise: one TCP connection from the lower rank to the higher rank's listening socket,
 *     greeted with the communicator's tag (connections of other jobs are refused).
 * Reads and writes never block. Every function is for the engine's progress thread, except
 * dt_p2p_futex_wake.
 */
#ifndef DT_COMM_P2P_LINK_H
#define DT_COMM_P2P_LINK_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "common/err.h"

struct dt_p2p_seg; /* the shared segment's header (comm_p2p_link.c) */
struct dt_p2p_ring;

typedef struct dt_p2p_link {
    bool shm;          /* shared memory, else TCP */
    bool open;         /* the stream can be read and written */
    int side;          /* 0: this rank is the lower of the pair, 1: the higher */
    /* TCP */
    int fd;            /* the connection, -1 until open */
    /* shared memory */
    struct dt_p2p_seg *h;           /* the mapped segment, NULL until open */
    size_t map_bytes;
    char *out_data, *in_data;       /* the rings' bytes: written here / read here */
    struct dt_p2p_ring *out, *in;   /* their counters */
    bool creator, unlinked;         /* this side created the segment / removed its name */
    char name[256];                 /* the segment's name */
    int pid;                        /* the peer's process (same host; dt_p2p_link_peer_exited) */
    int pidfd;                      /* -1 until first needed, or unavailable */
    bool pidfd_tried;
} dt_p2p_link;

/* A closed link to a peer: over shared memory (shm) under name, with the peer's pid, or over
 * TCP; side 0 when this rank is the lower of the pair. */
void dt_p2p_link_init(dt_p2p_link *l, bool shm, int side, const char *name, int pid);

/* Shared memory: creates (side 0) or attaches to (side 1) the segment. 0 with l->open set, 0
 * with it unset when the peer has not created it yet (try again later), or a negative code with
 * err saying what failed; who names the peer in messages ("rank 1 (global rank 5)"). */
int dt_p2p_link_open_shm(dt_p2p_link *l, const char *who, dt_err *err);

/* TCP, from the lower rank: connects to addr:port (until deadline_ns) and greets the peer with
 * tag, rank and world. 0 with l->open set, or a negative code with err. */
int dt_p2p_link_connect(dt_p2p_link *l, const char *addr, int port, uint64_t tag, int rank,
                        int world, uint64_t deadline_ns, const char *who, dt_err *err);

/* TCP, at the higher rank: takes one connection waiting on listen_fd (non-blocking) and reads
 * its greeting (5 s at most). 1 with *fd and the sender's *from when the greeting names this
 * communicator (tag, world); 0 when none waits; -1 when one came whose greeting does not (it is
 * closed). */
int dt_p2p_link_accept(int listen_fd, uint64_t tag, int world, int *fd, int *from);

/* Files a connection dt_p2p_link_accept took as l's stream. */
void dt_p2p_link_adopt(dt_p2p_link *l, int fd);

/* Closes the stream (l->open unset). aborting: the peer is told (shutdown; the segment's abort
 * flag and doorbell). The segment's name is removed if this side still owns it. */
void dt_p2p_link_close(dt_p2p_link *l, bool aborting);

/* dt_p2p_link_close, and the peer's pidfd. Accepts a link never opened. */
void dt_p2p_link_destroy(dt_p2p_link *l);

/* Bytes written (0: the stream is full), or -errno. */
ssize_t dt_p2p_link_write(dt_p2p_link *l, const void *src, size_t n);

/* Bytes read (0: nothing yet), or -errno (-ECONNRESET: the peer closed). */
ssize_t dt_p2p_link_read(dt_p2p_link *l, void *dst, size_t n);

/* Shared memory: tells the peer that this side moved (data in, space freed). */
void dt_p2p_link_ring(dt_p2p_link *l);

/* Shared memory: whether the peer set its abort flag (it failed). */
bool dt_p2p_link_peer_failed(const dt_p2p_link *l);

/* Whether the peer's process (same host) has exited. A pidfd sees an exited process that its
 * parent has not reaped yet (kill(pid, 0) still finds a zombie); kill is the fallback. */
bool dt_p2p_link_peer_exited(dt_p2p_link *l);

/* Shared memory, open: whether the link can move now (data to read, or room when has_out: this
 * side has something to write). */
bool dt_p2p_link_ready(const dt_p2p_link *l, bool has_out);

/* Shared memory, open: marks this side as sleeping (or awake again) on its doorbell and returns
 * the doorbell's futex word (shared between processes), which the peer bumps when it moves. */
_Atomic uint32_t *dt_p2p_link_bell(dt_p2p_link *l, bool sleeping);

/* FUTEX_WAKE on w (shared: a word in shared memory, else a process-private one). */
void dt_p2p_futex_wake(_Atomic uint32_t *w, bool shared);

#endif
