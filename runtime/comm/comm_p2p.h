/* comm_p2p.h - point-to-point sends and receives of the cpu comm backend; internal to
 * runtime/comm/ (comm_cpu.c creates one engine per communicator).
 *
 * One engine per communicator, with its own progress thread (started by the first batch), so
 * point-to-point traffic never waits behind the communicator's collectives and the reverse.
 * Every pair of ranks talks over one bidirectional byte stream, opened on first use (the
 * transport, comm_p2p_link.h; comm_p2p.c is the matching engine over it):
 *   - ranks on one host (same host id): a shared-memory segment with two single-producer,
 *     single-consumer byte rings, created by the lower rank and unlinked once both mapped it;
 *   - otherwise (or with DTRAIN_COMM_TRANSPORT=tcp): one TCP connection from the lower rank to
 *     the higher rank's point-to-point listening socket (published by the bootstrap).
 * Protocol on the stream, per (sender, receiver) pair, in issue order: the sender announces its
 * k-th send (RTS: dtype, count); the receiver, once its k-th receive from that sender is posted,
 * answers CTS when they agree or NAK with its own description when not (both sides then fail
 * naming both); on CTS the sender streams the payload. Every received byte is consumed at once
 * (headers are queued, payloads go straight into the posted buffer), so the two directions of a
 * pair never block each other: a batch may send to and receive from the same peer, whatever the
 * sizes. All posted operations progress together, across batches, in issue order per pair.
 *
 * A send completes once its receive is posted and its last byte has been handed to the stream
 * (the socket buffer or the shared ring): its buffer may then be reused. A receive completes
 * when its last byte has arrived. Every batch is bounded by timeout_ms from its posting; a peer
 * that closes its connection, whose process exits (same host), or that reports a failure fails
 * the engine at once. After the first failure the engine is unusable: every pending and later
 * batch fails with the first error, and the peers are told (connections closed, abort flag in
 * the shared segments).
 */
#ifndef DT_COMM_P2P_H
#define DT_COMM_P2P_H

#include <stdbool.h>
#include <stdint.h>

#include "common/err.h"
#include "runtime/comm/comm_opts.h"

typedef struct dt_p2p dt_p2p;
typedef struct dt_p2p_batch dt_p2p_batch;

typedef struct dt_p2p_peer {
    int global;          /* global rank, for messages */
    bool shm;            /* reach it through shared memory (same host, not forced to TCP) */
    const char *addr;    /* TCP: where its point-to-point socket listens */
    int port;
    int pid;             /* shm: its process, watched while waiting on it */
} dt_p2p_peer;

typedef struct dt_p2p_opts {
    int rank, world;            /* in the communicator */
    const dt_p2p_peer *peers;   /* (world) copied; peers[rank] unused */
    int listen_fd;              /* taken over: where lower ranks connect to us (-1: none) */
    uint64_t tag;               /* communicator identity: connections of others are refused */
    const char *shm_base;       /* name prefix of the pair segments ("/dtrain...") */
    int timeout_ms;
} dt_p2p_opts;

/* Creates the engine (no thread, no connection yet). Takes listen_fd even on failure. */
int dt_p2p_create(dt_p2p **out, const dt_p2p_opts *opts, dt_err *err);

/* Lets outstanding batches finish (each bounded by its deadline), stops the thread, closes
 * everything, frees every batch not yet waited. Accepts NULL. */
void dt_p2p_close(dt_p2p *p);

/* Fails the engine with msg (another part of the communicator failed) and tells the peers. */
void dt_p2p_abort(dt_p2p *p, const char *msg);

/* Posts a batch (ops checked: kind, peer in range and not self, dtype); never blocks on peers.
 * *out is the batch to wait for. */
int dt_p2p_start(dt_p2p *p, const dt_p2p_op *ops, int n, dt_p2p_batch **out, dt_err *err);

/* Waits for the batch (bounded by its deadline) and frees it; its result. done_ns (may be NULL):
 * when the engine completed the batch's last op (dt_now_ns's clock), or, for a failed batch,
 * when this wait returned. */
int dt_p2p_wait(dt_p2p *p, dt_p2p_batch *b, uint64_t *done_ns, dt_err *err);

/* Payload bytes of this rank's sends written to their peers so far (frames not counted). Any
 * thread; 0 for NULL. */
uint64_t dt_p2p_sent(const dt_p2p *p);

#endif
