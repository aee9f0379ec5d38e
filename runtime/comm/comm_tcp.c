/* comm_tcp.c - the pipelined, segmented TCP ring of the cpu comm backend; see comm_tcp.h.
 *
 * A collective is a program of steps. Step k sends a byte range to the next member and receives
 * a byte range from the previous one, either copied straight into place or reduced into place
 * through a staging segment (dst = addend + incoming). A send may forward what an earlier step
 * received ("send_after"): its bytes go out as soon as they have been received and reduced, not
 * when the whole earlier step is complete. One thread drives both sockets, non-blocking, with
 * poll(2); it sends and receives as far as it can, and sleeps in poll only when neither side can
 * move. So a member never blocks on a full socket while its neighbour waits for it (no deadlock),
 * and every wait is bounded by the collective's deadline.
 *
 * Wire: per collective, a 40-byte header (magic, version, description) in each direction, then
 * the raw payload of the steps in order. Same-architecture peers only (no byte swapping), like
 * every other binary format of dtrain.
 */
#include "runtime/comm/comm_tcp.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/comm_reduce.h"

#define WIRE_MAGIC 0x676e6972u /* "ring" */
#define WIRE_VERSION 1u
#define HELLO_MAGIC 0x6f6c6c68u
#define DEFAULT_SEGMENT (256u << 10)
#define MIN_REDUCE_UNIT (32u << 10)
#define POLL_SLICE_MS 100
#define ALIGN_ELEMS 16

typedef struct wire_hdr {
    uint32_t magic, version;
    dt_coll_desc desc;
} wire_hdr;

typedef struct hello {
    uint32_t magic, version;
    uint64_t tag;
    int32_t from, size;
} hello;

struct dt_ring {
    int idx, n;
    int *globals;
    char next_host[256], prev_host[256]; /* the neighbours' hosts, for messages */
    int next_fd, prev_fd;
    size_t seg;
    char *stage;   /* (seg) reduction staging */
    bool failed;
    _Atomic uint64_t sent; /* payload bytes sent to the next member (dt_ring_sent) */
};

typedef struct ring_step {
    const char *send;   /* bytes to send to the next member (NULL = none) */
    size_t send_bytes;
    int send_after;     /* step whose received bytes these are (-1: available now) */
    char *recv;         /* where the previous member's bytes go (NULL = none) */
    size_t recv_bytes;
    const char *addend; /* non-NULL: recv = addend + incoming (reduction); else a copy */
    float scale;        /* applied by a reduction */
} ring_step;

static int mod(int a, int m) { return ((a % m) + m) % m; }

/* ---- failure ----------------------------------------------------------------------------- */

void dt_ring_abort(dt_ring *r)
{
    if (!r)
        return;
    r->failed = true;
    if (r->next_fd >= 0) {
        shutdown(r->next_fd, SHUT_RDWR);
        close(r->next_fd);
        r->next_fd = -1;
    }
    if (r->prev_fd >= 0) {
        shutdown(r->prev_fd, SHUT_RDWR);
        close(r->prev_fd);
        r->prev_fd = -1;
    }
}

static int fail(dt_ring *r, const dt_coll_ctx *ctx, dt_err *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static int fail(dt_ring *r, const dt_coll_ctx *ctx, dt_err *err, int code, const char *fmt, ...)
{
    char what[160], msg[DT_ERR_MSG_MAX - 200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_coll_describe(&ctx->desc, what, sizeof what);
    dt_err_set(err, code, "%s: %s", what, msg);
    dt_ring_abort(r);
    return code;
}

/* The next member's connection failed. Before blaming it, read the previous member's header
 * if it has not arrived yet (briefly): when ranks issued different collectives, the previous
 * member may have sent its description and closed its connections because of the mismatch, and
 * the mismatch is the error worth reporting. Returns -EPROTO with the mismatch, or 0. */
static int salvage_mismatch(dt_ring *r, wire_hdr *in_h, size_t *got, const dt_coll_ctx *ctx,
                            dt_err *err)
{
    uint64_t until = dt_now_ns() + 200000000ull;
    while (*got < sizeof *in_h && r->prev_fd >= 0 && dt_now_ns() < until) {
        struct pollfd p = {r->prev_fd, POLLIN, 0};
        if (poll(&p, 1, 20) <= 0)
            continue;
        ssize_t k = recv(r->prev_fd, (char *)in_h + *got, sizeof *in_h - *got, MSG_DONTWAIT);
        if (k <= 0)
            break;
        *got += (size_t)k;
    }
    if (*got == sizeof *in_h && in_h->magic == WIRE_MAGIC && !dt_coll_same(&in_h->desc, &ctx->desc)) {
        char a[160];
        dt_coll_describe(&in_h->desc, a, sizeof a);
        return fail(r, ctx, err, -EPROTO,
                    "collective mismatch: rank %d issued %s at the same point (ranks must issue "
                    "the same collectives, with the same sizes, in the same order)",
                    r->globals[(r->idx - 1 + r->n) % r->n], a);
    }
    return 0;
}

/* ---- the step engine --------------------------------------------------------------------- */

/* Runs steps; a reduction step combines with op over elements of t. */
static int run(dt_ring *r, const ring_step *steps, int nsteps, dt_dtype t, dt_redop op,
               const dt_coll_ctx *ctx, dt_err *err)
{
    if (r->failed || r->next_fd < 0)
        return fail(r, ctx, err, -EPIPE, "the TCP ring failed earlier");
    const int prev = r->globals[mod(r->idx - 1, r->n)], next = r->globals[mod(r->idx + 1, r->n)];
    const size_t es = dt_dtype_size(t);
    wire_hdr out_h = {WIRE_MAGIC, WIRE_VERSION, ctx->desc}, in_h;
    size_t out_h_sent = 0, in_h_got = 0;
    int si = 0, ri = 0;
    size_t s_off = 0, r_got = 0, r_done = 0, st_fill = 0, st_used = 0;

    while (si < nsteps && steps[si].send_bytes == 0)
        si++;
    while (ri < nsteps && steps[ri].recv_bytes == 0)
        ri++;
    for (;;) {
        bool progress = false, want_out = false, want_in = false;
        /* ---- send ---- */
        if (out_h_sent < sizeof out_h) {
            ssize_t k = send(r->next_fd, (char *)&out_h + out_h_sent, sizeof out_h - out_h_sent,
                             MSG_DONTWAIT | MSG_NOSIGNAL);
            if (k > 0) {
                out_h_sent += (size_t)k;
                progress = true;
            } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                int e = errno;
                if (salvage_mismatch(r, &in_h, &in_h_got, ctx, err))
                    return -EPROTO;
                return fail(r, ctx, err, -ECONNRESET,
                            "connection to rank %d (next in the TCP ring, on %s) lost: %s (it "
                            "failed or exited, or the network between the hosts is down; its log "
                            "says why)",
                            next, r->next_host, strerror(e));
            }
            want_out = out_h_sent < sizeof out_h;
        } else if (si < nsteps) {
            const ring_step *s = &steps[si];
            size_t limit = s->send_bytes;
            if (s->send_after >= 0 && ri <= s->send_after)
                limit = ri == s->send_after ? DT_MIN(limit, r_done) : 0;
            if (s_off < limit) {
                ssize_t k = send(r->next_fd, s->send + s_off, limit - s_off,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
                if (k > 0) {
                    s_off += (size_t)k;
                    atomic_fetch_add_explicit(&r->sent, (uint64_t)k, memory_order_relaxed);
                    progress = true;
                } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                    int e = errno;
                    if (salvage_mismatch(r, &in_h, &in_h_got, ctx, err))
                        return -EPROTO;
                    return fail(r, ctx, err, -ECONNRESET,
                                "connection to rank %d (next in the TCP ring, on %s) lost: %s (it "
                                "failed or exited, or the network between the hosts is down; "
                                "its log says why)",
                                next, r->next_host, strerror(e));
                }
                want_out = s_off < limit;
            }
            if (s_off == s->send_bytes) {
                s_off = 0;
                for (si++; si < nsteps && steps[si].send_bytes == 0; si++)
                    ;
            }
        }
        /* ---- receive ---- */
        if (in_h_got < sizeof in_h) {
            ssize_t k = recv(r->prev_fd, (char *)&in_h + in_h_got, sizeof in_h - in_h_got,
                             MSG_DONTWAIT);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return fail(r, ctx, err, -ECONNRESET,
                            "rank %d (previous in the TCP ring, on %s) closed its connection%s%s "
                            "(it failed or exited, or the network between the hosts is down; "
                            "its log says why)",
                            prev, r->prev_host, k ? ": " : "", k ? strerror(errno) : "");
            if (k > 0) {
                in_h_got += (size_t)k;
                progress = true;
                if (in_h_got == sizeof in_h) {
                    if (in_h.magic != WIRE_MAGIC || in_h.version != WIRE_VERSION)
                        return fail(r, ctx, err, -EPROTO,
                                    "rank %d sent a malformed header (magic %08x, version %u): "
                                    "the stream is out of step",
                                    prev, in_h.magic, in_h.version);
                    if (!dt_coll_same(&in_h.desc, &ctx->desc)) {
                        char a[160];
                        dt_coll_describe(&in_h.desc, a, sizeof a);
                        return fail(r, ctx, err, -EPROTO,
                                    "collective mismatch: rank %d issued %s at the same point "
                                    "(ranks must issue the same collectives, with the same sizes, "
                                    "in the same order)",
                                    prev, a);
                    }
                }
            }
            want_in = in_h_got < sizeof in_h;
        } else if (ri < nsteps) {
            const ring_step *s = &steps[ri];
            ssize_t k;
            if (!s->addend) {
                k = recv(r->prev_fd, s->recv + r_got, s->recv_bytes - r_got, MSG_DONTWAIT);
                if (k > 0) {
                    r_got += (size_t)k;
                    r_done = r_got;
                }
            } else {
                size_t want = DT_MIN(r->seg - st_fill, s->recv_bytes - r_got);
                k = recv(r->prev_fd, r->stage + st_fill, want, MSG_DONTWAIT);
                if (k > 0) {
                    st_fill += (size_t)k;
                    r_got += (size_t)k;
                    size_t avail = (st_fill - st_used) / es * es;
                    if (avail > 0 && (avail >= MIN_REDUCE_UNIT || st_fill == r->seg ||
                                      r_got == s->recv_bytes)) {
                        const void *srcs[2] = {s->addend + r_done, r->stage + st_used};
                        dt_reduce(s->recv + r_done, NULL, srcs, 2, avail / es, t, op, s->scale,
                                  false);
                        st_used += avail;
                        r_done += avail;
                        if (st_used == st_fill)
                            st_used = st_fill = 0;
                    }
                }
            }
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
                return fail(r, ctx, err, -ECONNRESET,
                            "rank %d (previous in the TCP ring, on %s) closed its connection%s%s "
                            "(it failed or exited, or the network between the hosts is down; "
                            "its log says why)",
                            prev, r->prev_host, k ? ": " : "", k ? strerror(errno) : "");
            if (k > 0)
                progress = true;
            if (r_done == s->recv_bytes) {
                r_got = r_done = 0;
                st_fill = st_used = 0;
                for (ri++; ri < nsteps && steps[ri].recv_bytes == 0; ri++)
                    ;
                progress = true;
            } else {
                want_in = true;
            }
        }
        if (out_h_sent == sizeof out_h && in_h_got == sizeof in_h && si >= nsteps && ri >= nsteps)
            return 0;
        if (progress)
            continue;
        uint64_t now = dt_now_ns();
        if (now >= ctx->deadline_ns) {
            if (want_in || (ri < nsteps) || in_h_got < sizeof in_h)
                return fail(r, ctx, err, -ETIMEDOUT,
                            "timed out after %.1f s waiting for data from rank %d (previous in "
                            "the TCP ring, on %s); that rank or one before it is stalled, "
                            "issued fewer collectives than this one, or cannot reach this host; "
                            "ddp.timeout sets the limit",
                            ctx->timeout_ms / 1000.0, prev, r->prev_host);
            return fail(r, ctx, err, -ETIMEDOUT,
                        "timed out after %.1f s waiting for rank %d (next in the TCP ring, on "
                        "%s) to accept data; it is stalled or cannot be reached; ddp.timeout "
                        "sets the limit",
                        ctx->timeout_ms / 1000.0, next, r->next_host);
        }
        struct pollfd p[2] = {{r->next_fd, want_out ? POLLOUT : 0, 0},
                              {r->prev_fd, want_in ? POLLIN : 0, 0}};
        uint64_t left_ms = (ctx->deadline_ns - now) / 1000000u + 1;
        int pr = poll(p, 2, (int)DT_MIN(left_ms, (uint64_t)POLL_SLICE_MS));
        if (pr < 0 && errno != EINTR)
            return fail(r, ctx, err, -errno, "poll: %s", strerror(errno));
        /* A hang-up of the next member matters only while we still have bytes for it; the
         * previous one's is seen by recv (after any bytes it sent before closing). */
        if (pr > 0 && (p[0].revents & (POLLERR | POLLHUP)) &&
            (out_h_sent < sizeof out_h || si < nsteps)) {
            if (salvage_mismatch(r, &in_h, &in_h_got, ctx, err))
                return -EPROTO;
            return fail(r, ctx, err, -ECONNRESET,
                        "connection to rank %d (next in the TCP ring, on %s) lost (it failed or "
                        "exited, or the network between the hosts is down; its log says why)",
                        next, r->next_host);
        }
    }
}

/* Chunk j of m elements over n members: [lo, hi). */
static void chunk(size_t m, int n, int j, size_t *lo, size_t *hi)
{
    size_t c = (m + (size_t)n - 1) / (size_t)n;
    c = (c + ALIGN_ELEMS - 1) / ALIGN_ELEMS * ALIGN_ELEMS;
    *lo = DT_MIN((size_t)j * c, m);
    *hi = DT_MIN(*lo + c, m);
}

/* ---- collectives ------------------------------------------------------------------------- */

int dt_ring_allreduce(dt_ring *r, void *buf, size_t count, dt_dtype t, dt_redop op,
                      float scale, const dt_coll_ctx *ctx, dt_err *err)
{
    const int M = r->n, me = r->idx;
    const size_t es = dt_dtype_size(t);
    char *b = buf;
    ring_step *steps = calloc((size_t)(2 * (M - 1)), sizeof *steps);
    if (!steps)
        return dt_err_set(err, -ENOMEM, "ring all-reduce: out of memory");
    for (int k = 0; k < M - 1; k++) {
        size_t slo, shi, rlo, rhi;
        chunk(count, M, mod(me - k, M), &slo, &shi);
        chunk(count, M, mod(me - k - 1, M), &rlo, &rhi);
        steps[k] = (ring_step){b + slo * es, (shi - slo) * es, k - 1,
                               b + rlo * es, (rhi - rlo) * es, b + rlo * es,
                               k == M - 2 ? scale : 1.0f};
    }
    for (int k = 0; k < M - 1; k++) {
        int st = M - 1 + k;
        size_t slo, shi, rlo, rhi;
        chunk(count, M, mod(me + 1 - k, M), &slo, &shi);
        chunk(count, M, mod(me - k, M), &rlo, &rhi);
        steps[st] = (ring_step){b + slo * es, (shi - slo) * es, st - 1,
                                b + rlo * es, (rhi - rlo) * es, NULL, 1.0f};
    }
    int rc = run(r, steps, 2 * (M - 1), t, op, ctx, err);
    free(steps);
    return rc;
}

int dt_ring_broadcast(dt_ring *r, void *buf, size_t bytes, int root, const dt_coll_ctx *ctx,
                      dt_err *err)
{
    const int M = r->n, d = mod(r->idx - root, M);
    ring_step steps[2];
    int n = 0;
    memset(steps, 0, sizeof steps);
    if (d > 0) /* receive from the previous member, as a plain copy */
        steps[n++] = (ring_step){NULL, 0, -1, buf, bytes, NULL, 1.0f};
    if (d < M - 1) /* forward to the next one as it arrives */
        steps[n++] = (ring_step){buf, bytes, d > 0 ? 0 : -1, NULL, 0, NULL, 1.0f};
    return run(r, steps, n, DT_UINT8, DT_SUM, ctx, err); /* copies only */
}

int dt_ring_allgather(dt_ring *r, const void *send, void *recv, size_t bytes,
                      const dt_coll_ctx *ctx, dt_err *err)
{
    const int M = r->n, me = r->idx;
    char *out = recv;
    if (out + (size_t)me * bytes != (const char *)send)
        memmove(out + (size_t)me * bytes, send, bytes);
    ring_step *steps = calloc((size_t)(M - 1), sizeof *steps);
    if (!steps)
        return dt_err_set(err, -ENOMEM, "ring all-gather: out of memory");
    for (int k = 0; k < M - 1; k++)
        steps[k] = (ring_step){out + (size_t)mod(me - k, M) * bytes, bytes, k - 1,
                               out + (size_t)mod(me - k - 1, M) * bytes, bytes, NULL, 1.0f};
    int rc = run(r, steps, M - 1, DT_UINT8, DT_SUM, ctx, err); /* copies only */
    free(steps);
    return rc;
}

int dt_ring_reduce_scatter(dt_ring *r, const void *send, void *recv, size_t count, dt_dtype t,
                           dt_redop op, float scale, const dt_coll_ctx *ctx, dt_err *err)
{
    const int M = r->n, me = r->idx;
    const size_t es = dt_dtype_size(t), piece = count * es;
    const char *in = send;
    /* Partial sums of steps 0..M-3 each get their own piece: a step's result is forwarded by
     * the next step while later steps receive, so no buffer is reused within a collective. */
    char *tmp = M > 2 ? malloc((size_t)(M - 2) * (piece ? piece : 1)) : NULL;
    ring_step *steps = calloc((size_t)(M - 1), sizeof *steps);
    if (!steps || (M > 2 && !tmp)) {
        free(tmp);
        free(steps);
        return dt_err_set(err, -ENOMEM, "ring reduce-scatter: out of memory");
    }
    for (int k = 0; k < M - 1; k++) {
        const char *src = k == 0 ? in + (size_t)mod(me - 1, M) * piece : tmp + (size_t)(k - 1) * piece;
        char *dst = k == M - 2 ? (char *)recv : tmp + (size_t)k * piece;
        steps[k] = (ring_step){src, piece, k - 1, dst, piece,
                               in + (size_t)mod(me - k - 2, M) * piece, k == M - 2 ? scale : 1.0f};
    }
    int rc = run(r, steps, M - 1, t, op, ctx, err);
    free(steps);
    free(tmp);
    return rc;
}

uint64_t dt_ring_sent(const dt_ring *r)
{
    return r ? atomic_load_explicit(&((dt_ring *)(uintptr_t)r)->sent, memory_order_relaxed) : 0;
}

int dt_ring_barrier(dt_ring *r, const dt_coll_ctx *ctx, dt_err *err)
{
    float z[16 * 64];
    size_t n = (size_t)16 * (size_t)DT_MIN(r->n, 64);
    memset(z, 0, sizeof z);
    return dt_ring_allreduce(r, z, n, DT_FLOAT32, DT_SUM, 1.0f, ctx, err);
}

/* ---- connections ------------------------------------------------------------------------- */

static int wait_fd(int fd, short events, uint64_t deadline_ns)
{
    for (;;) {
        uint64_t now = dt_now_ns();
        if (now >= deadline_ns)
            return -ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int r = poll(&p, 1, (int)DT_MIN((deadline_ns - now) / 1000000u + 1, (uint64_t)1000));
        if (r < 0 && errno != EINTR)
            return -errno;
        if (r > 0)
            return (p.revents & (POLLERR | POLLNVAL)) && !(p.revents & events) ? -ECONNRESET : 0;
    }
}

int dt_tcp_io_all(int fd, void *buf, size_t n, bool out, uint64_t deadline_ns)
{
    char *p = buf;
    while (n > 0) {
        ssize_t k = out ? send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : recv(fd, p, n, MSG_DONTWAIT);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0)
            return -ECONNRESET;
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -errno;
        int rc = wait_fd(fd, out ? POLLOUT : POLLIN, deadline_ns);
        if (rc)
            return rc;
    }
    return 0;
}

void dt_tcp_tune(int fd)
{
    int one = 1, idle = 5, intvl = 2, cnt = 3;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    dt_set_nonblock(fd, true);
}

/* Sent data unacknowledged for timeout_ms (a link that went silent: packets vanish, nothing
 * resets the connection) makes the kernel drop the connection, and so do unanswered keepalive
 * probes past it; the next poll then reports the error instead of a silent wait. */
static void user_timeout(int fd, int timeout_ms)
{
    unsigned int t = timeout_ms > 0 ? (unsigned int)timeout_ms : 0;
    if (t)
        setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &t, sizeof t);
}

int dt_tcp_connect(const char *host, int port, uint64_t deadline_ns, int *out, dt_err *err)
{
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int last = 0;
    for (int backoff_ms = 10;; backoff_ms = DT_MIN(backoff_ms * 2, 500)) {
        struct addrinfo hints, *res = NULL;
        memset(&hints, 0, sizeof hints);
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        int g = getaddrinfo(host, ps, &hints, &res);
        if (g != 0)
            return dt_err_set(err, -EHOSTUNREACH, "cannot resolve %s: %s (set DTRAIN_LOCAL_ADDR "
                              "or rendezvous.local_addr to an address peers can reach)",
                              host, gai_strerror(g));
        for (struct addrinfo *a = res; a; a = a->ai_next) {
            int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                            a->ai_protocol);
            if (fd < 0) {
                last = -errno;
                continue;
            }
            int rc = connect(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : -errno;
            if (rc == -EINPROGRESS) {
                rc = wait_fd(fd, POLLOUT, deadline_ns);
                if (rc == 0) {
                    int soerr = 0;
                    socklen_t len = sizeof soerr;
                    getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &len);
                    rc = -soerr;
                }
            }
            if (rc == 0) {
                freeaddrinfo(res);
                *out = fd;
                return 0;
            }
            last = rc;
            close(fd);
        }
        freeaddrinfo(res);
        if (dt_now_ns() + (uint64_t)backoff_ms * 1000000u >= deadline_ns)
            return dt_err_set(err, last ? last : -ETIMEDOUT, "cannot connect to %s:%d: %s", host,
                              port, strerror(last ? -last : ETIMEDOUT));
        dt_sleep_ms(backoff_ms);
    }
}

int dt_ring_connect(dt_ring **out, const dt_ring_opts *o, uint64_t deadline_ns, dt_err *err)
{
    int rc = 0;
    dt_ring *r = calloc(1, sizeof *r);
    if (!r)
        return dt_err_set(err, -ENOMEM, "TCP ring: out of memory");
    r->idx = o->index;
    r->n = o->size;
    r->next_fd = r->prev_fd = -1;
    r->seg = o->segment_bytes ? o->segment_bytes : DEFAULT_SEGMENT;
    r->seg = DT_MAX((size_t)4096, r->seg / 64 * 64);
    r->globals = calloc((size_t)r->n, sizeof *r->globals);
    r->stage = malloc(r->seg);
    if (!r->globals || !r->stage) {
        rc = dt_err_set(err, -ENOMEM, "TCP ring: out of memory");
        goto fail;
    }
    memcpy(r->globals, o->global_ranks, (size_t)r->n * sizeof *r->globals);
    dt_strlcpy(r->next_host, o->next_name ? o->next_name : o->next_host, sizeof r->next_host);
    dt_strlcpy(r->prev_host, o->prev_host ? o->prev_host : "?", sizeof r->prev_host);
    const int next = r->globals[mod(r->idx + 1, r->n)], prev = r->globals[mod(r->idx - 1, r->n)];

    /* Connect first, then accept: every connect completes through the listen backlog, so the
     * order cannot deadlock. */
    if ((rc = dt_tcp_connect(o->next_host, o->next_port, deadline_ns, &r->next_fd, err)) != 0) {
        dt_err_prefix(err, "TCP ring: connecting to rank %d: ", next);
        goto fail;
    }
    hello h = {HELLO_MAGIC, WIRE_VERSION, o->tag, r->idx, r->n};
    if ((rc = dt_tcp_io_all(r->next_fd, &h, sizeof h, true, deadline_ns)) != 0) {
        rc = dt_err_set(err, rc, "TCP ring: greeting rank %d at %s:%d: %s", next, o->next_host,
                        o->next_port, strerror(-rc));
        goto fail;
    }
    while (r->prev_fd < 0) {
        if ((rc = wait_fd(o->listen_fd, POLLIN, deadline_ns)) != 0) {
            rc = dt_err_set(err, rc, "TCP ring: rank %d did not connect in time (%s)", prev,
                            strerror(-rc));
            goto fail;
        }
        int fd = accept4(o->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0)
            continue;
        hello in;
        uint64_t hd = DT_MIN(deadline_ns, dt_now_ns() + 10000000000ull);
        if (dt_tcp_io_all(fd, &in, sizeof in, false, hd) != 0 || in.magic != HELLO_MAGIC ||
            in.version != WIRE_VERSION || in.tag != o->tag || in.size != r->n ||
            in.from != mod(r->idx - 1, r->n)) {
            DT_WARN("comm: refused a connection that is not from rank %d of this group "
                    "(another job or an earlier attempt?)",
                    prev);
            close(fd);
            continue;
        }
        r->prev_fd = fd;
    }
    dt_tcp_tune(r->next_fd);
    dt_tcp_tune(r->prev_fd);
    user_timeout(r->next_fd, o->timeout_ms);
    user_timeout(r->prev_fd, o->timeout_ms);
    *out = r;
    return 0;
fail:
    dt_ring_close(r);
    return rc;
}

void dt_ring_close(dt_ring *r)
{
    if (!r)
        return;
    if (r->next_fd >= 0)
        close(r->next_fd);
    if (r->prev_fd >= 0)
        close(r->prev_fd);
    free(r->stage);
    free(r->globals);
    free(r);
}
