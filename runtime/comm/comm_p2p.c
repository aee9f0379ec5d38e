/* comm_p2p.c - the point-to-point engine of the cpu comm backend; see comm_p2p.h. The pairs'
 * byte streams (shared-memory rings, TCP) are comm_p2p_link.c's; this file matches sends with
 * receives over them and moves the frames.
 *
 * Threads: the issuing threads only queue requests (dt_p2p_start) and wait on batches
 * (dt_p2p_wait), under p->mu. Everything else (connections, queues, the streams) belongs to the
 * progress thread, which runs passes over the pairs with pending requests: read everything that
 * arrived, answer, write as far as the stream takes, check deadlines and peers. When a pass
 * moved nothing it spins briefly (SPIN_PASSES yields) while a shared-memory pair is active, then
 * sleeps: on futex doorbells (futex_waitv over the pairs' bells, which the peers ring after they
 * move, and a post bell) when only mapped shared-memory pairs are pending; else in poll(2) (TCP
 * sockets, the listening socket, a wake pipe), for at most 0.2 ms while a shared pair is active.
 *
 * Wire (both transports, one stream per direction of a pair): 32-byte frames (magic, type,
 * sequence number, count, dtype, sender's rank), a DATA frame followed by its payload. Frames
 * of both directions' requests share a stream (an RTS of my k-th send, the CTS of my j-th
 * receive), never interleaved inside a frame. Same-architecture peers only, like the ring.
 *
 * Numbers (test_comm_groups p2p_bidirectional, 2 ranks on a shared, loaded 2-core VM): 16 MiB one
 * way through shared memory in 1.7-4.3 ms (4-10 GB/s: two copies, pipelined across the two
 * ranks' threads), both ways at once in one batch in 6-12 ms (one thread per rank does both of
 * its copies); TCP loopback 5-9 ms one way; a blocking 4-byte round trip 35-140 us (shared
 * memory) and 120-280 us (TCP). A receive posted ~3 ms before its send completes ~0.1 ms after
 * the send starts: the idle thread sleeps on futex doorbells in the pair segments (1.5-2 ms with
 * the 1 ms naps it took before them; 0.2 ms naps now when a TCP pair is pending too, or without
 * futex_waitv).
 */
#include "runtime/comm/comm_p2p.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/comm_p2p_link.h"
#include "runtime/comm/dtype.h"

#define FRAME_MAGIC 0x70327066u /* "fp2p" */
#define SPIN_PASSES 200
#define PEER_CHECK_NS 50000000ull
#define BELL_WAIT_NS 20000000ull /* longest futex sleep: peers and deadlines are checked after */

enum { F_RTS = 1, F_CTS = 2, F_NAK = 3, F_DATA = 4 };

typedef struct frame {
    uint32_t magic, type;
    uint64_t seq;   /* k: the k-th send from the sender to the receiver */
    uint64_t count;
    int32_t dtype;
    int32_t from;   /* the frame's writer, rank in the communicator */
} frame;

/* ---- requests and batches ---- */

enum { S_RTS = 1, S_READY, R_WAIT, R_CTS, Q_DONE };

typedef struct req {
    dt_p2p_batch *b;
    int kind, peer;
    char *buf;
    uint64_t count;
    int32_t dtype;
    size_t bytes, done;
    uint64_t seq;
    int state;
    struct req *next;  /* the pair's list of its kind */
    struct req *dnext; /* the pair's data queue (sends with CTS) */
    struct req *inext; /* the engine's incoming list */
} req;

struct dt_p2p_batch {
    int n, left;
    int rc;
    dt_err err;
    bool done;
    uint64_t done_ns;  /* when its last op completed (dt_now_ns); 0: failed, or not yet */
    uint64_t deadline_ns;
    req *reqs;
    struct dt_p2p_batch *next, **prev; /* the engine's batches not yet waited */
};

typedef struct rts {
    uint64_t seq, count;
    int32_t dtype;
} rts;

typedef struct pair {
    int peer;
    dt_p2p_link link;  /* the byte stream to the peer (comm_p2p_link.h) */
    uint64_t next_peer_check;
    /* requests, in issue order */
    req *sends, *sends_tail, *send_wait; /* send_wait: the first send still waiting for CTS */
    req *recvs, *recvs_tail, *recv_match; /* recv_match: the first receive without an RTS */
    uint64_t nsend, nrecv, nrts;
    rts *rq;                              /* RTS received, not yet matched */
    size_t rq_head, rq_n, rq_cap;
    frame *cq;                            /* control frames to write */
    size_t cq_head, cq_n, cq_cap;
    req *dq, *dq_tail;                    /* sends with CTS, to stream */
    /* the frame being written */
    int out_kind; /* 0 none, 1 control, 2 data */
    frame out_f;
    size_t out_off;
    req *out_req;
    /* the frame being read */
    frame in_f;
    size_t in_got;
    req *in_req;
    int pending; /* requests not done */
} pair;

struct dt_p2p {
    int rank, world, timeout_ms;
    dt_p2p_peer *peers;
    char **addrs;
    int listen_fd;
    uint64_t tag;
    char shm_base[200];
    pair *pairs;
    int wake[2];
    /* shared with the issuing threads, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv, done_cv;
    pthread_t thread;
    bool thread_started, stop;
    req *incoming, *incoming_tail;
    dt_p2p_batch *batches;
    bool failed;
    dt_err first_err;
    bool settled;      /* after a failure: the thread no longer touches any request */
    bool abort_req;    /* dt_p2p_abort asked the thread to fail the engine */
    char abort_msg[DT_ERR_MSG_MAX];
    /* the progress thread's */
    int pending;
    bool no_waitv;             /* futex_waitv is missing (kernel < 5.16): nap instead */
    /* wakes the progress thread from a futex sleep (posts, abort, stop) */
    _Atomic uint32_t post_bell;
    _Atomic int thread_sleeping;
    _Atomic uint64_t sent;     /* payload bytes of sends written to their peers (dt_p2p_sent) */
};

/* ---- names ---------------------------------------------------------------------------- */

/* "rank 3" or "rank 1 (global rank 5)". */
static const char *who(const dt_p2p *p, int r, char *buf, size_t cap)
{
    int g = p->peers[r].global;
    if (g == r)
        snprintf(buf, cap, "rank %d", r);
    else
        snprintf(buf, cap, "rank %d (global rank %d)", r, g);
    return buf;
}

static const char *tname(int32_t t)
{
    return dt_dtype_valid(t) ? dt_dtype_name((dt_dtype)t) : "?";
}

/* "send #3 (float32 x 1000) to rank 1" */
static const char *describe(const dt_p2p *p, const req *q, char *buf, size_t cap)
{
    char w[64];
    snprintf(buf, cap, "%s #%llu (%s x %llu) %s %s", q->kind == DT_P2P_SEND ? "send" : "receive",
             (unsigned long long)q->seq, tname(q->dtype), (unsigned long long)q->count,
             q->kind == DT_P2P_SEND ? "to" : "from", who(p, q->peer, w, sizeof w));
    return buf;
}

/* ---- waking and failing ---------------------------------------------------------------- */

/* Wakes the progress thread if it sleeps on futexes (a post, an abort, the stop). */
static void wake_thread(dt_p2p *p)
{
    atomic_fetch_add(&p->post_bell, 1);
    if (atomic_load(&p->thread_sleeping))
        dt_p2p_futex_wake(&p->post_bell, false);
}

/* Fails the engine (first error wins): every batch not done gets the error; peers are told.
 * log: the error is this engine's own (not another part of the communicator's, logged there). */
static void fail_all(dt_p2p *p, int code, const char *msg, bool log)
{
    pthread_mutex_lock(&p->mu);
    bool first = !p->failed;
    if (first) {
        p->failed = true;
        p->first_err.code = code;
        dt_strlcpy(p->first_err.msg, msg, sizeof p->first_err.msg);
    }
    for (dt_p2p_batch *b = p->batches; b; b = b->next)
        if (!b->done) {
            b->done = true;
            b->rc = p->first_err.code;
            b->err = p->first_err;
        }
    pthread_cond_broadcast(&p->done_cv);
    pthread_mutex_unlock(&p->mu);
    if (first && log)
        DT_ERROR("comm: rank %d: %s", p->peers[p->rank].global, msg);
}

static int failf(dt_p2p *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int failf(dt_p2p *p, int code, const char *fmt, ...)
{
    char msg[DT_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_all(p, code, msg, true);
    return code;
}

/* ---- lost peers --------------------------------------------------------------------------- */

/* "receive #2 (int32 x 1) from rank 3": the first op still pending with c's peer. */
static const char *pending_op(const dt_p2p *p, const pair *c, char *buf, size_t cap)
{
    const req *q = c->recvs ? c->recvs : c->sends;
    if (!q)
        snprintf(buf, cap, "point-to-point");
    else
        describe(p, q, buf, cap);
    return buf;
}

static int lost(dt_p2p *p, pair *c, ssize_t rc, bool writing)
{
    char w[64], d[200];
    who(p, c->peer, w, sizeof w);
    pending_op(p, c, d, sizeof d);
    if (rc == -ECONNRESET || rc == -EPIPE)
        return failf(p, -ECONNRESET,
                     "%s: %s closed its connection (it failed or exited; its own log says why)",
                     d, w);
    return failf(p, (int)rc, "%s: %s the connection to %s: %s", d,
                 writing ? "writing to" : "reading from", w, strerror((int)-rc));
}

/* ---- connections ---------------------------------------------------------------------------- */

/* Opens the pair's stream when it is not open yet: 0 (open, or not yet: try again later) or
 * the engine's failure. */
static int pair_open(dt_p2p *p, pair *c, uint64_t deadline_ns)
{
    char w[64];
    dt_err e = {0};
    int rc = 0;
    if (c->link.open)
        return 0;
    who(p, c->peer, w, sizeof w);
    if (c->link.shm)
        rc = dt_p2p_link_open_shm(&c->link, w, &e);
    else if (p->rank < c->peer) /* the lower rank connects; accept_pending files the connection */
        rc = dt_p2p_link_connect(&c->link, p->peers[c->peer].addr, p->peers[c->peer].port,
                                 p->tag, p->rank, p->world, deadline_ns, w, &e);
    return rc ? failf(p, rc, "%s", e.msg) : 0;
}

/* Files the connections that lower ranks made to us (one per pair, greeted with the tag). */
static void accept_pending(dt_p2p *p)
{
    if (p->listen_fd < 0)
        return;
    for (;;) {
        int fd = -1, from = -1;
        int got = dt_p2p_link_accept(p->listen_fd, p->tag, p->world, &fd, &from);
        if (got == 0)
            return;
        if (got < 0 || from < 0 || from >= p->rank || p->pairs[from].link.shm ||
            p->pairs[from].link.open) {
            DT_WARN("comm: rank %d refused a point-to-point connection that is not from a lower "
                    "rank of this communicator (another job or an earlier attempt?)",
                    p->peers[p->rank].global);
            if (got > 0)
                close(fd);
            continue;
        }
        dt_p2p_link_adopt(&p->pairs[from].link, fd);
    }
}

/* ---- the protocol ---------------------------------------------------------------------------- */

static int push_ctl(dt_p2p *p, pair *c, uint32_t type, uint64_t seq, uint64_t count,
                    int32_t dtype)
{
    if (c->cq_head + c->cq_n == c->cq_cap) {
        if (c->cq_head > 0) {
            memmove(c->cq, c->cq + c->cq_head, c->cq_n * sizeof *c->cq);
            c->cq_head = 0;
        }
        if (c->cq_n == c->cq_cap) {
            size_t cap = c->cq_cap ? c->cq_cap * 2 : 16;
            frame *q = realloc(c->cq, cap * sizeof *q);
            if (!q)
                return failf(p, -ENOMEM, "point-to-point: out of memory");
            c->cq = q;
            c->cq_cap = cap;
        }
    }
    frame f = {FRAME_MAGIC, type, seq, count, dtype, p->rank};
    c->cq[c->cq_head + c->cq_n++] = f;
    return 0;
}

static void pop_done(pair *c)
{
    while (c->sends && c->sends->state == Q_DONE) {
        c->sends = c->sends->next;
        if (!c->sends)
            c->sends_tail = NULL;
    }
    while (c->recvs && c->recvs->state == Q_DONE) {
        c->recvs = c->recvs->next;
        if (!c->recvs)
            c->recvs_tail = NULL;
    }
}

/* A request finished: off the pair's lists first, then its batch may be done. Once the batch
 * is done its waiter may free it (and reuse the memory for its next batch) at any moment, so
 * this thread must not touch q afterwards. */
static void complete(dt_p2p *p, pair *c, req *q)
{
    q->state = Q_DONE;
    c->pending--;
    p->pending--;
    pop_done(c);
    dt_p2p_batch *b = q->b;
    pthread_mutex_lock(&p->mu);
    if (--b->left == 0 && !b->done) {
        b->done = true;
        b->done_ns = dt_now_ns();
        pthread_cond_broadcast(&p->done_cv);
    }
    pthread_mutex_unlock(&p->mu);
}

/* Writes as much as the stream takes; *moved when anything went. */
static int pair_write(dt_p2p *p, pair *c, bool *moved)
{
    for (;;) {
        if (c->out_kind == 0) {
            if (c->cq_n > 0) {
                c->out_f = c->cq[c->cq_head++];
                c->cq_n--;
                if (c->cq_n == 0)
                    c->cq_head = 0;
                c->out_kind = 1;
            } else if (c->dq) {
                req *q = c->dq;
                c->dq = q->dnext;
                if (!c->dq)
                    c->dq_tail = NULL;
                frame f = {FRAME_MAGIC, F_DATA, q->seq, q->count, q->dtype, p->rank};
                c->out_f = f;
                c->out_req = q;
                c->out_kind = 2;
            } else {
                return 0;
            }
            c->out_off = 0;
        }
        size_t payload = c->out_kind == 2 ? c->out_req->bytes : 0, total = sizeof(frame) + payload;
        ssize_t k;
        if (c->out_off < sizeof(frame))
            k = dt_p2p_link_write(&c->link, (char *)&c->out_f + c->out_off,
                                  sizeof(frame) - c->out_off);
        else
            k = dt_p2p_link_write(&c->link, c->out_req->buf + (c->out_off - sizeof(frame)),
                                  total - c->out_off);
        if (k < 0)
            return lost(p, c, k, true);
        if (k == 0)
            return 0;
        *moved = true;
        if (c->out_off >= sizeof(frame))
            atomic_fetch_add_explicit(&p->sent, (uint64_t)k, memory_order_relaxed);
        c->out_off += (size_t)k;
        if (c->out_off == total) {
            if (c->out_kind == 2) {
                c->out_req->done = c->out_req->bytes;
                complete(p, c, c->out_req);
            }
            c->out_kind = 0;
            c->out_req = NULL;
        }
    }
}

/* Matches received RTS with posted receives, in order: CTS when they agree, else NAK and fail. */
static int match(dt_p2p *p, pair *c)
{
    while (c->recv_match && c->rq_n > 0) {
        req *q = c->recv_match;
        rts x = c->rq[c->rq_head];
        char d[200], w[64];
        if (x.seq != q->seq)
            return failf(p, -EPROTO, "point-to-point: %s: %s announced send #%llu (protocol "
                                     "error)",
                         describe(p, q, d, sizeof d), who(p, c->peer, w, sizeof w),
                         (unsigned long long)x.seq);
        c->rq_head++;
        c->rq_n--;
        if (c->rq_n == 0)
            c->rq_head = 0;
        if (x.count != q->count || x.dtype != q->dtype) {
            /* Tell the sender first (best effort, briefly), then fail here. */
            int rc = push_ctl(p, c, F_NAK, q->seq, q->count, q->dtype);
            uint64_t until = dt_now_ns() + 200000000ull;
            bool moved = false;
            while (!rc && (c->cq_n > 0 || c->out_kind) && dt_now_ns() < until) {
                if ((rc = pair_write(p, c, &moved)) != 0)
                    break;
                if (c->cq_n > 0 || c->out_kind)
                    sched_yield();
            }
            return failf(p, -EPROTO,
                         "point-to-point: %s does not match %s's send #%llu (%s x %llu): both "
                         "sides must agree on count and dtype",
                         describe(p, q, d, sizeof d), who(p, c->peer, w, sizeof w),
                         (unsigned long long)x.seq, tname(x.dtype), (unsigned long long)x.count);
        }
        int rc = push_ctl(p, c, F_CTS, q->seq, q->count, q->dtype);
        if (rc)
            return rc;
        q->state = R_CTS;
        c->recv_match = q->next;
    }
    return 0;
}

/* One frame has arrived in c->in_f. */
static int on_frame(dt_p2p *p, pair *c)
{
    frame *f = &c->in_f;
    char d[200], w[64];
    who(p, c->peer, w, sizeof w);
    if (f->magic != FRAME_MAGIC || f->from != c->peer)
        return failf(p, -EPROTO, "point-to-point: garbage from %s (magic %08x, from %d)", w,
                     f->magic, f->from);
    switch (f->type) {
    case F_RTS: {
        if (f->seq != c->nrts + 1)
            return failf(p, -EPROTO, "point-to-point: %s announced send #%llu, expected #%llu",
                         w, (unsigned long long)f->seq, (unsigned long long)(c->nrts + 1));
        c->nrts++;
        if (c->rq_head + c->rq_n == c->rq_cap) {
            if (c->rq_head > 0) {
                memmove(c->rq, c->rq + c->rq_head, c->rq_n * sizeof *c->rq);
                c->rq_head = 0;
            }
            if (c->rq_n == c->rq_cap) {
                size_t cap = c->rq_cap ? c->rq_cap * 2 : 16;
                rts *q = realloc(c->rq, cap * sizeof *q);
                if (!q)
                    return failf(p, -ENOMEM, "point-to-point: out of memory");
                c->rq = q;
                c->rq_cap = cap;
            }
        }
        rts x = {f->seq, f->count, f->dtype};
        c->rq[c->rq_head + c->rq_n++] = x;
        return match(p, c);
    }
    case F_CTS: {
        req *q = c->send_wait;
        if (!q || q->seq != f->seq)
            return failf(p, -EPROTO, "point-to-point: %s cleared send #%llu to go, which is not "
                                     "the next send waiting (protocol error)",
                         w, (unsigned long long)f->seq);
        q->state = S_READY;
        c->send_wait = q->next;
        q->dnext = NULL;
        if (c->dq_tail)
            c->dq_tail->dnext = q;
        else
            c->dq = q;
        c->dq_tail = q;
        return 0;
    }
    case F_NAK: {
        req *q = c->send_wait;
        if (!q || q->seq != f->seq)
            return failf(p, -EPROTO, "point-to-point: %s refused send #%llu, which is not the "
                                     "next send waiting (protocol error)",
                         w, (unsigned long long)f->seq);
        return failf(p, -EPROTO,
                     "point-to-point: %s does not match %s's receive #%llu (%s x %llu): both "
                     "sides must agree on count and dtype",
                     describe(p, q, d, sizeof d), w, (unsigned long long)f->seq, tname(f->dtype),
                     (unsigned long long)f->count);
    }
    case F_DATA: {
        req *q = c->recvs;
        if (!q || q->state != R_CTS || q->seq != f->seq || q->count != f->count)
            return failf(p, -EPROTO,
                         "point-to-point: %s sent the data of send #%llu (%llu elements), which "
                         "no cleared receive waits for (protocol error)",
                         w, (unsigned long long)f->seq, (unsigned long long)f->count);
        if (q->bytes == 0) {
            complete(p, c, q);
        } else {
            c->in_req = q;
        }
        return 0;
    }
    default:
        return failf(p, -EPROTO, "point-to-point: %s sent frame type %u", w, f->type);
    }
}

/* Reads everything that arrived while requests with the peer are pending (an end of stream
 * after the last one is the peer finishing, not failing); *moved when anything did. */
static int pair_read(dt_p2p *p, pair *c, bool *moved)
{
    while (c->pending > 0) {
        ssize_t k;
        if (c->in_req) {
            req *q = c->in_req;
            k = dt_p2p_link_read(&c->link, q->buf + q->done, q->bytes - q->done);
            if (k < 0)
                return lost(p, c, k, false);
            if (k == 0)
                return 0;
            *moved = true;
            q->done += (size_t)k;
            if (q->done == q->bytes) {
                c->in_req = NULL;
                complete(p, c, q);
            }
            continue;
        }
        k = dt_p2p_link_read(&c->link, (char *)&c->in_f + c->in_got, sizeof(frame) - c->in_got);
        if (k < 0)
            return lost(p, c, k, false);
        if (k == 0)
            return 0;
        *moved = true;
        c->in_got += (size_t)k;
        if (c->in_got < sizeof(frame))
            continue;
        c->in_got = 0;
        int rc = on_frame(p, c);
        if (rc)
            return rc;
    }
    return 0;
}

/* Same-host peers: has the process exited, or did it report a failure? */
static int check_peer(dt_p2p *p, pair *c, uint64_t now)
{
    if (!c->link.shm || now < c->next_peer_check)
        return 0;
    c->next_peer_check = now + PEER_CHECK_NS;
    char w[64], d[200];
    if (dt_p2p_link_peer_failed(&c->link))
        return failf(p, -ECONNRESET, "%s: %s failed (its own log says why)",
                     pending_op(p, c, d, sizeof d), who(p, c->peer, w, sizeof w));
    bool moved = false;
    if (dt_p2p_link_peer_exited(&c->link) && c->link.open &&
        (pair_read(p, c, &moved) || c->pending == 0))
        return p->failed ? -ECONNRESET : 0; /* it finished writing what we wait for first */
    if (dt_p2p_link_peer_exited(&c->link))
        return failf(p, -ECONNRESET, "%s: %s (pid %d, this host) exited",
                     pending_op(p, c, d, sizeof d), who(p, c->peer, w, sizeof w),
                     p->peers[c->peer].pid);
    return 0;
}

static int post(dt_p2p *p, req *q)
{
    pair *c = &p->pairs[q->peer];
    q->next = NULL;
    c->pending++;
    p->pending++;
    if (q->kind == DT_P2P_SEND) {
        q->seq = ++c->nsend;
        q->state = S_RTS;
        if (c->sends_tail)
            c->sends_tail->next = q;
        else
            c->sends = q;
        c->sends_tail = q;
        if (!c->send_wait)
            c->send_wait = q;
        return push_ctl(p, c, F_RTS, q->seq, q->count, q->dtype);
    }
    {
        q->seq = ++c->nrecv;
        q->state = R_WAIT;
        if (c->recvs_tail)
            c->recvs_tail->next = q;
        else
            c->recvs = q;
        c->recvs_tail = q;
        if (!c->recv_match)
            c->recv_match = q;
        return match(p, c);
    }
}

/* The earliest unfinished request of a batch past its deadline, as a failure. */
static int check_deadlines(dt_p2p *p, uint64_t now)
{
    pthread_mutex_lock(&p->mu);
    dt_p2p_batch *late = NULL;
    for (dt_p2p_batch *b = p->batches; b && !late; b = b->next)
        if (!b->done && now > b->deadline_ns)
            late = b;
    req *q = NULL;
    if (late)
        for (int i = 0; i < late->n && !q; i++)
            if (late->reqs[i].state != Q_DONE)
                q = &late->reqs[i];
    pthread_mutex_unlock(&p->mu);
    if (!q)
        return 0;
    char d[200], w[64];
    const pair *c = &p->pairs[q->peer];
    const char *why = !c->link.open                          ? "no connection to it yet"
                      : q->state == S_RTS                ? "it has not posted the matching receive"
                      : q->state == R_WAIT               ? "it has not posted the matching send"
                      : q->done < q->bytes && q->done > 0 ? "the transfer stalled"
                                                          : "waiting for its data";
    return failf(p, -ETIMEDOUT,
                 "point-to-point: %s timed out after %d ms (%s; %zu of %zu bytes moved): %s is "
                 "stalled, dead, or the ranks disagree on the order of sends and receives",
                 describe(p, q, d, sizeof d), p->timeout_ms, why, q->done, q->bytes,
                 who(p, q->peer, w, sizeof w));
}

/* Can pair c move now (data to read, or room for what it has to write)? */
static bool shm_ready(const pair *c)
{
    return dt_p2p_link_ready(&c->link, c->out_kind || c->cq_n || c->dq);
}

/* Sleeps on futexes until a peer of an active shared-memory pair moves, a request is posted, or
 * BELL_WAIT_NS pass. Returns false (nothing slept) when some pending pair is not a mapped
 * shared-memory pair (then poll(2) naps instead) or futex_waitv is missing. Lost wake-ups are
 * excluded by the order: sleeping flag, then bell value, then the readiness check, against the
 * peer's publish, then bell bump, then sleeping check. */
static bool bell_sleep(dt_p2p *p)
{
#ifdef __NR_futex_waitv
    struct futex_waitv wv[FUTEX_WAITV_MAX];
    int n = 0;
    for (int r = 0; r < p->world; r++) {
        pair *c = &p->pairs[r];
        if (r == p->rank || c->pending == 0)
            continue;
        if (!c->link.shm || !c->link.open || n + 1 >= FUTEX_WAITV_MAX)
            return false;
        n++;
    }
    atomic_store(&p->thread_sleeping, 1);
    wv[0] = (struct futex_waitv){.val = atomic_load(&p->post_bell),
                                 .uaddr = (uintptr_t)&p->post_bell,
                                 .flags = FUTEX_32 | FUTEX_PRIVATE_FLAG};
    n = 1;
    bool ready = false;
    for (int r = 0; r < p->world; r++) {
        pair *c = &p->pairs[r];
        if (r == p->rank || c->pending == 0)
            continue;
        _Atomic uint32_t *bell = dt_p2p_link_bell(&c->link, true);
        wv[n++] = (struct futex_waitv){.val = atomic_load(bell),
                                       .uaddr = (uintptr_t)bell,
                                       .flags = FUTEX_32};
        ready = ready || shm_ready(c);
    }
    pthread_mutex_lock(&p->mu);
    ready = ready || p->incoming || p->stop || (p->abort_req && !p->settled);
    pthread_mutex_unlock(&p->mu);
    int rc = 0;
    if (!ready) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        uint64_t t = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec + BELL_WAIT_NS;
        ts.tv_sec = (time_t)(t / 1000000000ull);
        ts.tv_nsec = (long)(t % 1000000000ull);
        rc = (int)syscall(__NR_futex_waitv, wv, (unsigned)n, 0, &ts, CLOCK_MONOTONIC);
        if (rc < 0 && errno == ENOSYS)
            p->no_waitv = true;
    }
    for (int r = 0; r < p->world; r++) {
        pair *c = &p->pairs[r];
        if (r != p->rank && c->pending > 0)
            dt_p2p_link_bell(&c->link, false);
    }
    atomic_store(&p->thread_sleeping, 0);
    return !p->no_waitv;
#else
    p->no_waitv = true;
    return false;
#endif
}

static void drain_wake(dt_p2p *p)
{
    char buf[64];
    while (read(p->wake[0], buf, sizeof buf) > 0) {
    }
}

static void *progress_thread(void *arg)
{
    dt_p2p *p = arg;
    int idle = 0;
    struct pollfd *fds = calloc((size_t)p->world + 2, sizeof *fds);
    if (!fds) {
        fail_all(p, -ENOMEM, "point-to-point: out of memory", true);
        pthread_mutex_lock(&p->mu);
        p->settled = true; /* no request was touched */
        pthread_cond_broadcast(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->stop && !p->incoming && !(p->abort_req && !p->settled) &&
               (p->pending == 0 || p->failed))
            pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            break;
        }
        req *in = p->incoming;
        p->incoming = p->incoming_tail = NULL;
        bool failed = p->failed, abort_req = p->abort_req && !p->settled;
        pthread_mutex_unlock(&p->mu);
        int rc = 0;
        if (abort_req) {
            char msg[DT_ERR_MSG_MAX];
            pthread_mutex_lock(&p->mu);
            dt_strlcpy(msg, p->abort_msg, sizeof msg);
            pthread_mutex_unlock(&p->mu);
            fail_all(p, -EPIPE, msg, false);
            rc = -EPIPE;
        } else if (failed) {
            continue; /* the batches of `in` were failed with the rest */
        }
        for (req *q = in, *nx; q && !rc; q = nx) {
            nx = q->inext;
            rc = post(p, q);
        }
        bool moved = false, shm_active = false;
        uint64_t now = dt_now_ns();
        if (!rc)
            accept_pending(p);
        for (int r = 0; r < p->world && !rc; r++) {
            pair *c = &p->pairs[r];
            if (r == p->rank || c->pending == 0)
                continue;
            if (!c->link.open && (rc = pair_open(p, c, now + (uint64_t)p->timeout_ms * 1000000ull)))
                break;
            if (c->link.shm)
                shm_active = true;
            if (!c->link.open) {
                rc = check_peer(p, c, now);
                continue;
            }
            bool pair_moved = false;
            if ((rc = pair_read(p, c, &pair_moved)) || (rc = pair_write(p, c, &pair_moved)))
                break;
            if (pair_moved) {
                moved = true;
                if (c->link.shm)
                    dt_p2p_link_ring(&c->link);
            }
            rc = check_peer(p, c, now);
        }
        if (!rc)
            rc = check_deadlines(p, now);
        if (rc) {
            for (int r = 0; r < p->world; r++)
                if (r != p->rank)
                    dt_p2p_link_close(&p->pairs[r].link, true);
            pthread_mutex_lock(&p->mu);
            p->pending = 0;
            p->settled = true; /* from here on no request is touched: waiters may free them */
            pthread_cond_broadcast(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        if (moved) {
            idle = 0;
            continue;
        }
        if (shm_active && ++idle < SPIN_PASSES) {
            sched_yield();
            continue;
        }
        /* Only shared-memory pairs, all open: sleep on their bells (and the post bell). */
        if (shm_active && !p->no_waitv && bell_sleep(p))
            continue;
        /* Sleep until a socket moves, a request arrives, or (shared memory) a short while. */
        int nf = 0;
        fds[nf++] = (struct pollfd){p->wake[0], POLLIN, 0};
        if (p->listen_fd >= 0)
            fds[nf++] = (struct pollfd){p->listen_fd, POLLIN, 0};
        for (int r = 0; r < p->world; r++) {
            pair *c = &p->pairs[r];
            if (r != p->rank && !c->link.shm && c->link.open && c->pending > 0)
                fds[nf++] = (struct pollfd){c->link.fd, (short)(POLLIN | (c->out_kind || c->cq_n ||
                                                                     c->dq ? POLLOUT : 0)),
                                            0};
        }
        struct timespec nap = {0, shm_active ? 200000 : 50000000}; /* shared rings: 0.2 ms */
        ppoll(fds, (nfds_t)nf, &nap, NULL);
        drain_wake(p);
    }
    free(fds);
    return NULL;
}

/* ---- the interface ---------------------------------------------------------------------------- */

int dt_p2p_create(dt_p2p **out, const dt_p2p_opts *o, dt_err *err)
{
    dt_p2p *p = calloc(1, sizeof *p);
    if (!p) {
        if (o->listen_fd >= 0)
            close(o->listen_fd);
        return dt_err_set(err, -ENOMEM, "comm: out of memory");
    }
    p->rank = o->rank;
    p->world = o->world;
    p->timeout_ms = o->timeout_ms;
    p->listen_fd = o->listen_fd;
    if (p->listen_fd >= 0)
        dt_set_nonblock(p->listen_fd, true); /* accepted between passes, never waited on */
    p->tag = o->tag;
    p->wake[0] = p->wake[1] = -1;
    dt_strlcpy(p->shm_base, o->shm_base ? o->shm_base : "/dtrain.p2p", sizeof p->shm_base);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    p->peers = calloc((size_t)o->world, sizeof *p->peers);
    p->addrs = calloc((size_t)o->world, sizeof *p->addrs);
    p->pairs = calloc((size_t)o->world, sizeof *p->pairs);
    if (!p->peers || !p->addrs || !p->pairs) {
        free(p->pairs); /* nothing in it to close yet */
        p->pairs = NULL;
        dt_p2p_close(p);
        return dt_err_set(err, -ENOMEM, "comm: out of memory");
    }
    for (int r = 0; r < o->world; r++) /* before anything can fail: close() reads them */
        dt_p2p_link_init(&p->pairs[r].link, false, 0, "", 0);
    for (int r = 0; r < o->world; r++) {
        p->peers[r] = o->peers[r];
        p->addrs[r] = strdup(o->peers[r].addr ? o->peers[r].addr : "127.0.0.1");
        if (!p->addrs[r]) {
            dt_p2p_close(p);
            return dt_err_set(err, -ENOMEM, "comm: out of memory");
        }
        p->peers[r].addr = p->addrs[r];
        pair *c = &p->pairs[r];
        char name[256];
        c->peer = r;
        snprintf(name, sizeof name, "%s.p%d.%d", p->shm_base, DT_MIN(p->rank, r),
                 DT_MAX(p->rank, r));
        dt_p2p_link_init(&c->link, o->peers[r].shm, p->rank < r ? 0 : 1, name, o->peers[r].pid);
    }
    if (pipe2(p->wake, O_CLOEXEC | O_NONBLOCK) != 0) {
        int e = errno;
        dt_p2p_close(p);
        return dt_err_errno(err, e, "comm: point-to-point wake pipe");
    }
    *out = p;
    return 0;
}

uint64_t dt_p2p_sent(const dt_p2p *p)
{
    return p ? atomic_load_explicit(&((dt_p2p *)(uintptr_t)p)->sent, memory_order_relaxed) : 0;
}

void dt_p2p_close(dt_p2p *p)
{
    if (!p)
        return;
    if (p->thread_started) {
        pthread_mutex_lock(&p->mu);
        /* Outstanding batches (handles never waited) finish first, each bounded by its
         * deadline, which the thread enforces. */
        for (;;) {
            bool busy = false;
            for (dt_p2p_batch *b = p->batches; b && !busy; b = b->next)
                busy = !b->done;
            if (!busy)
                break;
            pthread_cond_wait(&p->done_cv, &p->mu);
        }
        while (p->failed && !p->settled)
            pthread_cond_wait(&p->done_cv, &p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        wake_thread(p);
        if (write(p->wake[1], "x", 1) < 0) {
        } /* the thread may sleep in poll */
        pthread_join(p->thread, NULL);
    }
    if (p->pairs)
        for (int r = 0; r < p->world; r++) {
            if (r != p->rank)
                dt_p2p_link_close(&p->pairs[r].link, false);
            free(p->pairs[r].rq);
            free(p->pairs[r].cq);
            dt_p2p_link_destroy(&p->pairs[r].link); /* its pidfd */
        }
    while (p->batches) {
        dt_p2p_batch *b = p->batches;
        p->batches = b->next;
        free(b->reqs);
        free(b);
    }
    if (p->addrs)
        for (int r = 0; r < p->world; r++)
            free(p->addrs[r]);
    if (p->listen_fd >= 0)
        close(p->listen_fd);
    if (p->wake[0] >= 0)
        close(p->wake[0]);
    if (p->wake[1] >= 0)
        close(p->wake[1]);
    free(p->addrs);
    free(p->peers);
    free(p->pairs);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    pthread_cond_destroy(&p->done_cv);
    free(p);
}

void dt_p2p_abort(dt_p2p *p, const char *msg)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    bool running = p->thread_started;
    if (running && !p->failed) {
        /* The thread owns the requests: it fails them and closes the pairs itself. */
        p->abort_req = true;
        dt_strlcpy(p->abort_msg, msg, sizeof p->abort_msg);
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    if (!running) { /* no pair is open, no request posted */
        fail_all(p, -EPIPE, msg, false);
        pthread_mutex_lock(&p->mu);
        p->settled = true;
        pthread_mutex_unlock(&p->mu);
        return;
    }
    wake_thread(p);
    if (write(p->wake[1], "x", 1) < 0) {
    } /* it may sleep in poll */
}

int dt_p2p_start(dt_p2p *p, const dt_p2p_op *ops, int n, dt_p2p_batch **out, dt_err *err)
{
    *out = NULL;
    if (n < 0 || (n > 0 && !ops))
        return dt_err_set(err, -EINVAL, "p2p: %d operations", n);
    for (int i = 0; i < n; i++) {
        const dt_p2p_op *o = &ops[i];
        if (o->kind != DT_P2P_SEND && o->kind != DT_P2P_RECV)
            return dt_err_set(err, -EINVAL, "p2p: operation %d has kind %d (use DT_P2P_SEND or "
                                            "DT_P2P_RECV)",
                              i, (int)o->kind);
        if (o->peer < 0 || o->peer >= p->world)
            return dt_err_set(err, -EINVAL, "p2p: operation %d names peer %d, not a rank of this "
                                            "communicator of %d",
                              i, o->peer, p->world);
        if (o->peer == p->rank)
            return dt_err_set(err, -EINVAL, "p2p: operation %d %s rank %d itself (a send or "
                                            "receive to oneself is not allowed: copy instead)",
                              i, o->kind == DT_P2P_SEND ? "sends to" : "receives from", p->rank);
        if (!dt_dtype_valid((int)o->dtype))
            return dt_err_set(err, -EINVAL, "p2p: operation %d has unknown dtype %d", i,
                              (int)o->dtype);
        if (o->count > 0 && !o->buf)
            return dt_err_set(err, -EINVAL, "p2p: operation %d has no buffer for %zu elements",
                              i, o->count);
    }
    dt_p2p_batch *b = calloc(1, sizeof *b);
    if (!b || !(b->reqs = calloc((size_t)DT_MAX(n, 1), sizeof *b->reqs))) {
        free(b);
        return dt_err_set(err, -ENOMEM, "p2p: out of memory");
    }
    b->n = b->left = n;
    b->deadline_ns = dt_now_ns() + (uint64_t)p->timeout_ms * 1000000ull;
    for (int i = 0; i < n; i++) {
        req *q = &b->reqs[i];
        q->b = b;
        q->kind = ops[i].kind;
        q->peer = ops[i].peer;
        q->buf = ops[i].buf;
        q->count = ops[i].count;
        q->dtype = (int32_t)ops[i].dtype;
        q->bytes = ops[i].count * dt_dtype_size(ops[i].dtype);
        q->inext = i + 1 < n ? &b->reqs[i + 1] : NULL;
    }
    pthread_mutex_lock(&p->mu);
    b->next = p->batches;
    if (p->batches)
        p->batches->prev = &b->next;
    b->prev = &p->batches;
    p->batches = b;
    if (p->failed) {
        b->done = true;
        b->rc = p->first_err.code ? p->first_err.code : -EPIPE;
        dt_err_set(&b->err, b->rc, "p2p: the communicator failed earlier: %s", p->first_err.msg);
    } else if (n == 0) {
        b->done = true;
        b->done_ns = dt_now_ns();
    } else {
        if (p->incoming_tail)
            p->incoming_tail->inext = &b->reqs[0];
        else
            p->incoming = &b->reqs[0];
        p->incoming_tail = &b->reqs[n - 1];
        if (!p->thread_started) {
            int rc = pthread_create(&p->thread, NULL, progress_thread, p);
            if (rc) {
                p->incoming = p->incoming_tail = NULL;
                *b->prev = b->next;
                if (b->next)
                    b->next->prev = b->prev;
                pthread_mutex_unlock(&p->mu);
                free(b->reqs);
                free(b);
                return dt_err_set(err, -rc, "p2p: cannot start the progress thread: %s",
                                  strerror(rc));
            }
            p->thread_started = true;
        }
        pthread_cond_signal(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    wake_thread(p);
    if (write(p->wake[1], "x", 1) < 0) {
    } /* full pipe: the thread is awake anyway */
    *out = b;
    return 0;
}

int dt_p2p_wait(dt_p2p *p, dt_p2p_batch *b, uint64_t *done_ns, dt_err *err)
{
    if (!b) {
        if (done_ns)
            *done_ns = dt_now_ns();
        return 0;
    }
    pthread_mutex_lock(&p->mu);
    /* A failed batch may still be referenced by the thread until it settles. */
    while (!b->done || (b->rc && p->failed && p->thread_started && !p->settled))
        pthread_cond_wait(&p->done_cv, &p->mu);
    *b->prev = b->next;
    if (b->next)
        b->next->prev = b->prev;
    uint64_t done = b->done_ns;
    pthread_mutex_unlock(&p->mu);
    if (done_ns)
        *done_ns = done ? done : dt_now_ns();
    int rc = b->rc;
    if (rc && err)
        *err = b->err;
    free(b->reqs);
    free(b);
    return rc;
}
