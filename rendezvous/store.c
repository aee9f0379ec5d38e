/* store.c - the blocking store client (see store.h for the contract, protocol.h for
 * the bytes).
 *
 * One TCP connection per base handle, one request in flight, a mutex around each call so that
 * threads can share a handle; prefixed views share their base's connection and lock. Each call
 * has a deadline; the socket is blocking with SO_RCVTIMEO/SO_SNDTIMEO bounded by the time left
 * (changed only when the time left drops well below the current setting), so a request costs
 * one send and usually one recv.
 *
 * Reconnects. A connection found dead is re-established within the call's deadline (with
 * backoff) and the request is sent again, except for the ops that are not idempotent (ADD,
 * APPEND, and CAS when the caller asks whether it swapped): for those a connection lost after the whole request was sent is an error
 * (-ECONNRESET, "may or may not have been applied"), and before sending them an idle
 * connection is first checked for a hang-up, so a store restart between calls is still
 * transparent. A client-side timeout closes the connection (a late reply must not be read as
 * the answer to the next request); the next call reconnects.
 *
 * Waiting ops (GET, WAIT, MULTI_GET) send their timeout to the server, which answers
 * ETIMEDOUT itself; the client allows a little more (wait_grace_ms: a tenth of the timeout,
 * between 250 ms and 5 s) before it gives up on the server, and reconnects after a lost
 * connection only until the caller's own deadline.
 */
#include "rendezvous/store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/env.h"
#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store_internal.h"

#define WAIT_GRACE_MIN_MS 250
#define WAIT_GRACE_MAX_MS 5000
#define BACKOFF_START_MS 10
#define BACKOFF_MAX_MS 1000
#define HELLO_WAIT_START_MS 1000 /* per-attempt wait for the server's hello, doubling ... */
#define HELLO_WAIT_MAX_MS 8000   /* ... up to this, while attempts keep getting no hello */
#define MAX_ATTEMPTS 8
#define RBUF_KEEP (1u << 20) /* a reply buffer grown beyond this is released after the call */

struct dt_store {
    dt_store *root;        /* the handle that owns the connection (itself for a base) */
    char *prefix;          /* owned; full prefix of a view ("" for a base) */
    size_t prefix_len;
    /* Only meaningful on a root: */
    pthread_mutex_t mu;
    char *host;            /* owned */
    int port;
    int connect_timeout_ms, timeout_ms;
    char *token;           /* owned; NULL = none */
    int fd;                /* -1 when not connected */
    int ever_connected;
    int rcvtimeo_ms, sndtimeo_ms; /* current socket timeouts (0 = none set) */
    uint32_t next_id;
    dt_rng rng;            /* connect-retry jitter (seeded from the clock and the pid) */
    dt_proto_buf req;      /* the request being sent */
    uint8_t *rbuf;         /* owned; the reply being read */
    size_t rcap;
};

void dt_store_opts_default(dt_store_opts *o)
{
    o->connect_timeout_ms = 30000;
    o->timeout_ms = 30000;
    o->token = NULL;
}

static int64_t ms_left(uint64_t deadline)
{
    uint64_t now = dt_now_ns();
    return now >= deadline ? 0 : (int64_t)((deadline - now) / 1000000);
}

static uint64_t deadline_in(int64_t ms) { return dt_now_ns() + (uint64_t)ms * 1000000ull; }

/* ------------------------------------------------------------------------------------------ */
/* Socket I/O with a deadline                                                                 */
/* ------------------------------------------------------------------------------------------ */

static void conn_drop(dt_store *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    r->rcvtimeo_ms = r->sndtimeo_ms = 0;
}

/* Keeps the socket's timeout (SO_RCVTIMEO or SO_SNDTIMEO) at most 10% above the time left,
 * and not so far below it that a long call wakes up often (at least half of it, or 1 s). It is
 * changed only when it leaves that band: calls alternating between a 30 s deadline and a
 * 5 s one (GET without waiting) settle on 5 s and make no setsockopt at all. */
static void sock_timeo(dt_store *r, int opt, int *cur, int64_t left)
{
    if (left < 1)
        left = 1;
    if (*cur > 0 && *cur <= left + left / 10 + 5 && (*cur >= left / 2 || *cur >= 1000))
        return;
    struct timeval tv = {.tv_sec = left / 1000, .tv_usec = (left % 1000) * 1000};
    if (setsockopt(r->fd, SOL_SOCKET, opt, &tv, sizeof tv) == 0)
        *cur = (int)DT_MIN(left, (int64_t)INT32_MAX);
}

/* 0, -ETIMEDOUT, or -ECONNRESET (or another -errno) when the connection is unusable. */
static int send_all(dt_store *r, const uint8_t *p, size_t n, uint64_t deadline)
{
    while (n) {
        int64_t left = ms_left(deadline);
        if (left <= 0)
            return -ETIMEDOUT;
        sock_timeo(r, SO_SNDTIMEO, &r->sndtimeo_ms, left);
        ssize_t w = send(r->fd, p, n, MSG_NOSIGNAL);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Receives at least `want` bytes in total into r->rbuf (which holds *have). */
static int recv_some(dt_store *r, size_t *have, size_t want, uint64_t deadline)
{
    if (want > r->rcap) {
        size_t cap = DT_MAX(want, r->rcap * 2);
        uint8_t *p = realloc(r->rbuf, cap);
        if (!p)
            return -ENOMEM;
        r->rbuf = p;
        r->rcap = cap;
    }
    while (*have < want) {
        int64_t left = ms_left(deadline);
        if (left <= 0)
            return -ETIMEDOUT;
        sock_timeo(r, SO_RCVTIMEO, &r->rcvtimeo_ms, left);
        ssize_t n = recv(r->fd, r->rbuf + *have, r->rcap - *have, 0);
        if (n == 0)
            return -ECONNRESET;
        if (n < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)
                continue;
            return -errno;
        }
        *have += (size_t)n;
    }
    return 0;
}

/* Reads one reply frame into r->rbuf and parses it into *m. */
static int recv_reply(dt_store *r, dt_proto_msg *m, uint64_t deadline)
{
    dt_proto_limits lim = dt_proto_reply_limits();
    size_t have = 0, need = DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE;
    for (;;) {
        int rc = recv_some(r, &have, need, deadline);
        if (rc < 0)
            return rc;
        const char *why = NULL;
        ssize_t n = dt_proto_parse(r->rbuf, have, &lim, 1, m, &need, &why);
        if (n < 0)
            return -EPROTO;
        if (n > 0)
            return m->bad == DT_PROTO_OK ? 0 : -EPROTO;
        if (need <= have)
            need = have + 1;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Connecting                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Keepalive probes and TCP_USER_TIMEOUT, both at about the client's call timeout: a link that
 * goes silent (a partition: packets vanish, nothing resets the connection) is reported as
 * ETIMEDOUT within about that time even while a long server-side WAIT has nothing in flight,
 * instead of after the whole wait (join_timeout can be many minutes). */
static void keepalive(int fd, int timeout_ms)
{
    int one = 1, idle = DT_MAX(1, timeout_ms / 3000), intvl = DT_MAX(1, timeout_ms / 6000),
        cnt = 3;
    unsigned int ut = (unsigned int)DT_MAX(timeout_ms, 1000);
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut);
}

/* Non-blocking connect to one address, bounded by the deadline. Returns the fd or -errno. */
static int connect_addr(const struct addrinfo *ai, uint64_t deadline, int timeout_ms)
{
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    ai->ai_protocol);
    if (fd < 0)
        return -errno;
    int rc = connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc < 0 && errno != EINPROGRESS && errno != EINTR) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if (rc < 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        for (;;) {
            int64_t left = ms_left(deadline);
            if (left <= 0) {
                close(fd);
                return -ETIMEDOUT;
            }
            int p = poll(&pfd, 1, (int)DT_MIN(left, 1000));
            if (p < 0 && errno == EINTR)
                continue;
            if (p < 0) {
                rc = -errno;
                close(fd);
                return rc;
            }
            if (p > 0)
                break;
        }
        int soerr = 0;
        socklen_t sl = sizeof soerr;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl);
        if (soerr) {
            close(fd);
            return -soerr;
        }
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    keepalive(fd, timeout_ms);
    dt_set_nonblock(fd, false);
    return fd;
}

/* One attempt: resolve, connect, handshake, authenticate. Returns 0, or -errno with a message
 * in err; -EPROTO and -EACCES are final (retrying cannot help), anything else is retried.
 * The server's hello is waited for hello_ms at most (it sends it on accepting): *silent is set
 * when the connection was accepted and nothing came back in that time. */
static int connect_once(dt_store *r, uint64_t deadline, int hello_ms, int *silent, dt_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", r->port);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    int g = getaddrinfo(r->host, port, &hints, &res);
    if (g != 0)
        return dt_err_set(err, -EHOSTUNREACH, "cannot resolve \"%s\": %s", r->host,
                          gai_strerror(g));
    int fd = -EHOSTUNREACH;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        fd = connect_addr(ai, deadline, r->timeout_ms);
        if (fd >= 0)
            break;
    }
    freeaddrinfo(res);
    if (fd < 0)
        return dt_err_set(err, fd, "connect: %s", strerror(-fd));
    r->fd = fd;

    uint8_t hello[DT_PROTO_HELLO_SIZE];
    dt_proto_hello_encode(hello, DT_PROTO_VERSION, 0);
    uint64_t hello_t0 = dt_now_ns();
    uint64_t hello_by = DT_MIN(deadline, deadline_in(hello_ms));
    int rc = send_all(r, hello, sizeof hello, hello_by);
    size_t have = 0;
    if (rc == 0)
        rc = recv_some(r, &have, DT_PROTO_HELLO_SIZE, hello_by);
    if (rc < 0) {
        conn_drop(r);
        if (rc == -ETIMEDOUT && have == 0) {
            *silent = 1;
            return dt_err_set(err, rc, "something at %s:%d accepted the connection but sent no "
                              "dtrain store handshake (waited %.1f s): is that port another "
                              "service?", r->host, r->port,
                              (double)(dt_now_ns() - hello_t0) * 1e-9);
        }
        return dt_err_set(err, rc, "handshake: %s", strerror(-rc));
    }
    uint16_t ver = 0, flags = 0;
    if (dt_proto_hello_decode(r->rbuf, &ver, &flags) < 0) {
        conn_drop(r);
        return dt_err_set(err, -EPROTO, "the server is not a dtrain store (bad handshake "
                                        "magic); check the host and port");
    }
    if (ver != DT_PROTO_VERSION) {
        conn_drop(r);
        return dt_err_set(err, -EPROTO,
                          "the store speaks protocol version %u, this client speaks %u: use the "
                          "same dtrain version on every node", ver, DT_PROTO_VERSION);
    }
    if (flags & DT_PROTO_HELLO_FULL) {
        conn_drop(r);
        return dt_err_set(err, -ECONNREFUSED, "the store refused the connection: its "
                                              "connection limit (max_connections) is reached");
    }
    if (!(flags & DT_PROTO_HELLO_AUTH))
        return 0;
    if (!r->token) {
        conn_drop(r);
        return dt_err_set(err, -EACCES, "the store requires a token: set DTRAIN_STORE_TOKEN "
                                        "(or the token option) to the server's token");
    }
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_AUTH, 0, 0, 0, 1);
    dt_proto_put_item(&b, r->token, strlen(r->token));
    dt_proto_end(&b, st);
    rc = b.oom ? -ENOMEM : send_all(r, b.data, b.len, deadline);
    dt_proto_buf_free(&b);
    dt_proto_msg m;
    if (rc == 0)
        rc = recv_reply(r, &m, deadline);
    if (rc < 0) {
        conn_drop(r);
        return dt_err_set(err, rc, "authenticating: %s", strerror(-rc));
    }
    if (m.code != DT_PROTO_OK) {
        dt_proto_item it = {0};
        const uint8_t *cur = m.vals;
        dt_proto_next(&cur, m.end, &it);
        rc = dt_proto_status_to_errno(m.code);
        conn_drop(r);
        return dt_err_set(err, rc, "authentication refused: %.*s", (int)DT_MIN(it.len, 400u),
                          it.p ? (const char *)it.p : "");
    }
    return 0;
}

int dt_store_backoff_jitter_ms(dt_rng *rng, int base_ms)
{
    /* uniform in [base/2, 3*base/2]: thousands of agents retrying at once spread out */
    int lo = base_ms / 2, span = base_ms;
    return lo + (int)dt_rng_below(rng, (uint64_t)span + 1);
}

/* Connects with exponential backoff (each delay jittered +-50%) until the deadline. */
static int conn_open(dt_store *r, uint64_t deadline, dt_err *err)
{
    int backoff = BACKOFF_START_MS, attempts = 0, hello_ms = HELLO_WAIT_START_MS;
    int silent_attempts = 0, last_silent = 0;
    uint64_t t0 = dt_now_ns();
    dt_err last = {0};
    for (;;) {
        attempts++;
        /* Keep the most telling error: an attempt cut short by the deadline says less than
         * the refusal before it. */
        dt_err cur = {0};
        int silent = 0;
        int rc = connect_once(r, deadline, hello_ms, &silent, &cur);
        if (!last.msg[0] || !(rc == -ETIMEDOUT && ms_left(deadline) <= 0 && !silent)) {
            last = cur;
            last_silent = silent;
        }
        if (silent) {
            /* Either another service, or a store too busy to accept: say so once, then
             * retry with a longer wait. */
            if (silent_attempts++ == 0 && ms_left(deadline) > 0)
                DT_WARN("store: %s (retrying until the connect timeout)", cur.msg);
            hello_ms = DT_MIN(hello_ms * 2, HELLO_WAIT_MAX_MS);
        }
        if (rc == 0) {
            if (r->ever_connected)
                DT_INFO("store: reconnected to %s:%d", r->host, r->port);
            r->ever_connected = 1;
            return 0;
        }
        if (rc == -EPROTO || rc == -EACCES)
            return dt_err_set(err, rc, "store at %s:%d: %s", r->host, r->port, last.msg);
        int64_t left = ms_left(deadline);
        if (left <= 0 && last_silent)
            return dt_err_set(err, -ECONNREFUSED, "%s (%d attempts over %.1f s)", last.msg,
                              attempts, (double)(dt_now_ns() - t0) * 1e-9);
        if (left <= 0)
            return dt_err_set(err, -ECONNREFUSED,
                              "cannot reach the store at %s:%d (%d attempts over %.1f s; last "
                              "error: %s); is it running (`dtrain store`, or the agent of the "
                              "first node) and reachable from here?",
                              r->host, r->port, attempts, (double)(dt_now_ns() - t0) * 1e-9,
                              last.msg);
        int delay = (int)DT_MIN(dt_store_backoff_jitter_ms(&r->rng, backoff), left);
        DT_DEBUG("store: connecting to %s:%d: %s; retrying in %d ms", r->host, r->port,
                 last.msg, delay);
        dt_sleep_ms(delay);
        backoff = DT_MIN(backoff * 2, BACKOFF_MAX_MS);
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Handles                                                                                    */
/* ------------------------------------------------------------------------------------------ */

int dt_store_connect(dt_store **out, const char *host, int port, const dt_store_opts *opts,
                     dt_err *err)
{
    dt_store_opts o;
    int rc;
    if (opts)
        o = *opts;
    else
        dt_store_opts_default(&o);
    if (!host || !*host || port <= 0 || port > 65535)
        return dt_err_set(err, -EINVAL, "store: bad address %s:%d (need a host and a port in "
                                        "1..65535)", host ? host : "(null)", port);
    const char *token = o.token ? o.token : dt_env("DTRAIN_STORE_TOKEN");
    dt_store *s = calloc(1, sizeof *s);
    if (!s)
        return dt_err_set(err, -ENOMEM, "store: out of memory");
    s->root = s;
    s->fd = -1;
    s->host = strdup(host);
    s->prefix = strdup("");
    s->token = token && *token ? strdup(token) : NULL;
    s->port = port;
    s->connect_timeout_ms = o.connect_timeout_ms > 0 ? o.connect_timeout_ms : 30000;
    s->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 30000;
    s->rcap = 4096;
    s->rbuf = malloc(s->rcap);
    dt_rng_seed2(&s->rng, dt_now_ns(), (uint64_t)getpid());
    pthread_mutex_init(&s->mu, NULL);
    if (!s->host || !s->prefix || !s->rbuf || (token && *token && !s->token)) {
        rc = dt_err_set(err, -ENOMEM, "store: out of memory");
        goto fail;
    }
    if ((rc = conn_open(s, deadline_in(s->connect_timeout_ms), err)) < 0)
        goto fail;
    *out = s;
    return 0;
fail:
    dt_store_free(s);
    return rc;
}

int dt_store_prefixed(dt_store **out, dt_store *base, const char *prefix, dt_err *err)
{
    if (!base || !prefix)
        return dt_err_set(err, -EINVAL, "store: dt_store_prefixed needs a handle and a prefix");
    dt_store *v = calloc(1, sizeof *v);
    size_t pl = strlen(prefix);
    char *p = malloc(base->prefix_len + pl + 1);
    if (!v || !p) {
        free(v);
        free(p);
        return dt_err_set(err, -ENOMEM, "store: out of memory");
    }
    memcpy(p, base->prefix, base->prefix_len);
    memcpy(p + base->prefix_len, prefix, pl + 1);
    v->root = base->root;
    v->prefix = p;
    v->prefix_len = base->prefix_len + pl;
    v->fd = -1;
    *out = v;
    return 0;
}

void dt_store_free(dt_store *s)
{
    if (!s)
        return;
    if (s->root == s) {
        conn_drop(s);
        pthread_mutex_destroy(&s->mu);
        free(s->host);
        free(s->token);
        free(s->rbuf);
        dt_proto_buf_free(&s->req);
    }
    free(s->prefix);
    free(s);
}

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                   */
/* ------------------------------------------------------------------------------------------ */

enum { IDEMPOTENT = 1, NOT_IDEMPOTENT = 0 };

/* A call in progress: the request is encoded into root->req between call_begin and
 * call_run; the lock is held from call_begin until call_end. */
typedef struct call {
    dt_store *s, *r;
    size_t start;
    uint32_t id;
    const char *what;     /* op name, for messages */
    const char *key;      /* first key, for messages (may be NULL) */
} call;

static void call_begin(call *c, dt_store *s, uint8_t op, int64_t num, uint32_t nkeys,
                       uint32_t nvals, const char *key)
{
    c->s = s;
    c->r = s->root;
    c->what = dt_proto_op_name(op);
    c->key = key;
    pthread_mutex_lock(&c->r->mu);
    c->r->req.len = 0;
    c->r->req.oom = 0;
    c->id = ++c->r->next_id;
    c->start = dt_proto_begin(&c->r->req, op, c->id, num, nkeys, nvals);
}

static void put_key(call *c, const char *key)
{
    dt_proto_put_item2(&c->r->req, c->s->prefix, c->s->prefix_len, key, strlen(key));
}

static void put_val(call *c, const void *v, size_t n) { dt_proto_put_item(&c->r->req, v, n); }

static void call_end(call *c)
{
    dt_store *r = c->r;
    if (r->rcap > RBUF_KEEP) {
        uint8_t *p = realloc(r->rbuf, 4096);
        if (p) {
            r->rbuf = p;
            r->rcap = 4096;
        }
    }
    if (r->req.cap > RBUF_KEEP)
        dt_proto_buf_free(&r->req);
    pthread_mutex_unlock(&r->mu);
}

/* A message names the key, but never so much of it that the reason (and the host) are cut
 * off: keys are shown up to KEY_SHOWN bytes, then "..." and the full length. */
#define KEY_SHOWN 200

static int call_fail(call *c, dt_err *err, int rc, const char *fmt, const char *detail)
{
    if (c->key) {
        /* "prefix+key" in quotes, or its first KEY_SHOWN bytes: "aaa..." (5000 bytes) */
        char k[KEY_SHOWN + 64];
        size_t pl = c->s->prefix_len, kl = strlen(c->key);
        if (pl + kl <= KEY_SHOWN)
            snprintf(k, sizeof k, "\"%s%s\"", c->s->prefix, c->key);
        else if (pl >= KEY_SHOWN)
            snprintf(k, sizeof k, "\"%.*s...\" (%zu bytes)", KEY_SHOWN, c->s->prefix, pl + kl);
        else
            snprintf(k, sizeof k, "\"%s%.*s...\" (%zu bytes)", c->s->prefix,
                     (int)(KEY_SHOWN - pl), c->key, pl + kl);
        dt_err_set(err, rc, "store %s %s at %s:%d: %s%s", c->what, k, c->r->host, c->r->port,
                   fmt, detail ? detail : "");
    } else {
        dt_err_set(err, rc, "store %s at %s:%d: %s%s", c->what, c->r->host, c->r->port, fmt,
                   detail ? detail : "");
    }
    return rc;
}

/* An idle connection whose peer hung up (or that has unexpected bytes) is stale. */
static int conn_stale(dt_store *r)
{
    struct pollfd p = {.fd = r->fd, .events = POLLIN | POLLRDHUP};
    return poll(&p, 1, 0) > 0;
}

/* Sends the request and reads its reply into *m (status OK, or an error is returned).
 * wait_ms >= 0 marks a waiting op: the server-side timeout (num) is refreshed on every attempt
 * and the client deadline is wait_ms + wait_grace_ms(wait_ms) (a wait of 0 has the handle's
 * ordinary deadline); after a lost connection it reconnects only until wait_ms has passed. */
static int64_t wait_grace_ms(int64_t wait_ms)
{
    return DT_MIN((int64_t)WAIT_GRACE_MAX_MS, DT_MAX((int64_t)WAIT_GRACE_MIN_MS, wait_ms / 10));
}

static int call_run(call *c, int idempotent, int64_t wait_ms, dt_proto_msg *m, dt_err *err)
{
    dt_store *r = c->r;
    if (r->req.oom)
        return call_fail(c, err, -ENOMEM, "out of memory encoding the request", NULL);
    dt_proto_end(&r->req, c->start);
    uint64_t t0 = dt_now_ns();
    uint64_t wait_deadline = wait_ms >= 0 ? t0 + (uint64_t)wait_ms * 1000000ull : 0;
    uint64_t deadline = wait_ms > 0
                            ? wait_deadline + (uint64_t)wait_grace_ms(wait_ms) * 1000000ull
                            : deadline_in(r->timeout_ms);
    /* Reconnecting: until the caller's deadline (a waiting op's own timeout, but never less
     * than the minimum grace so a short wait can still re-establish a dropped connection). */
    uint64_t reconnect_by =
        wait_ms > 0 ? DT_MAX(wait_deadline, t0 + (uint64_t)WAIT_GRACE_MIN_MS * 1000000ull)
                    : deadline;
    dt_err cerr = {0};
    int rc = 0, sent = 0;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        if (r->fd >= 0 && !idempotent && conn_stale(r))
            conn_drop(r);
        if (r->fd < 0 && (rc = conn_open(r, reconnect_by, &cerr)) < 0)
            return call_fail(c, err, rc, cerr.msg, NULL);
        if (wait_ms >= 0) { /* refresh the server-side timeout: the time left */
            int64_t left = wait_ms > 0 ? DT_MAX(ms_left(wait_deadline), 1) : 0;
            uint8_t *p = r->req.data + c->start + DT_PROTO_LEN_SIZE + 5;
            for (int i = 0; i < 8; i++)
                p[i] = (uint8_t)((uint64_t)left >> (56 - 8 * i));
        }
        rc = send_all(r, r->req.data, r->req.len, deadline);
        sent = rc == 0;
        if (rc == 0) {
            rc = recv_reply(r, m, deadline);
        } else if (rc != -ETIMEDOUT && recv_reply(r, m, dt_now_ns() + 100000000ull) == 0 &&
                   m->code != DT_PROTO_OK) {
            /* The server refused the request (a frame over its limit) and closed before we
             * finished sending: its error reply says why, which beats "connection lost". */
            conn_drop(r);
            rc = 0;
            break;
        }
        if (rc == 0 && m->id == 0 && m->code != DT_PROTO_OK) {
            conn_drop(r); /* a connection-level refusal (id 0): the server closes next */
            break;
        }
        if (rc == 0 && m->id != c->id)
            rc = -EPROTO;
        if (rc == 0)
            break;
        conn_drop(r);
        if (rc == -ETIMEDOUT)
            return call_fail(c, err, rc, "no reply from the store in time", NULL);
        if (rc == -EPROTO)
            return call_fail(c, err, rc, "malformed reply (is this a dtrain store of the same "
                                         "version?)", NULL);
        /* A failed send never delivered the whole frame, so the server cannot have applied
         * it; after a complete send, an ADD or APPEND may have been applied. */
        if (!idempotent && sent)
            return call_fail(c, err, -ECONNRESET, "connection lost after sending; the "
                             "operation may or may not have been applied: ", strerror(-rc));
        if (ms_left(reconnect_by) <= 0)
            break;
        DT_DEBUG("store: %s: connection lost (%s); reconnecting", c->what, strerror(-rc));
    }
    if (rc != 0)
        return call_fail(c, err, -ECONNRESET, "connection lost: ", strerror(-rc));
    if (m->code != DT_PROTO_OK) {
        dt_proto_item it = {0};
        const uint8_t *cur = m->vals;
        dt_proto_next(&cur, m->end, &it);
        char msg[600];
        snprintf(msg, sizeof msg, "%.*s", (int)DT_MIN(it.len, 500u),
                 it.p ? (const char *)it.p : "");
        return call_fail(c, err, dt_proto_status_to_errno(m->code), msg, NULL);
    }
    return 0;
}

/* Copies item bytes into a malloc'd buffer with one extra NUL. */
static void *dup_item(const dt_proto_item *it)
{
    uint8_t *p = malloc((size_t)it->len + 1);
    if (!p)
        return NULL;
    if (it->len)
        memcpy(p, it->p, it->len);
    p[it->len] = 0;
    return p;
}

static int64_t eff_timeout(dt_store *s, int timeout_ms)
{
    return timeout_ms < 0 ? s->root->timeout_ms : timeout_ms;
}

int dt_store_set(dt_store *s, const char *key, const void *val, size_t len, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_SET, 0, 1, 1, key);
    put_key(&c, key);
    put_val(&c, val, len);
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    call_end(&c);
    return rc;
}

/* The one value of a reply (GET, CAS), copied: *val (free()) and *len (may be NULL). */
static int reply_value(call *c, const dt_proto_msg *m, void **val, size_t *len, dt_err *err)
{
    dt_proto_item it;
    const uint8_t *cur = m->vals;
    void *p = NULL;
    if (m->nvals != 1 || dt_proto_next(&cur, m->end, &it) < 0)
        return call_fail(c, err, -EPROTO, "malformed reply", NULL);
    if (!(p = dup_item(&it)))
        return call_fail(c, err, -ENOMEM, "out of memory", NULL);
    *val = p;
    if (len)
        *len = it.len;
    return 0;
}

int dt_store_get(dt_store *s, const char *key, void **val, size_t *len, int timeout_ms,
                 dt_err *err)
{
    call c;
    dt_proto_msg m;
    int64_t t = eff_timeout(s, timeout_ms);
    call_begin(&c, s, DT_OP_GET, t, 1, 0, key);
    put_key(&c, key);
    int rc = call_run(&c, IDEMPOTENT, t, &m, err);
    if (rc == 0)
        rc = reply_value(&c, &m, val, len, err);
    call_end(&c);
    return rc;
}

int dt_store_add(dt_store *s, const char *key, int64_t delta, int64_t *result, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_ADD, delta, 1, 0, key);
    put_key(&c, key);
    int rc = call_run(&c, NOT_IDEMPOTENT, -1, &m, err);
    if (rc == 0 && result)
        *result = m.num;
    call_end(&c);
    return rc;
}

static int cas_call(dt_store *s, const char *key, const void *expected, size_t expected_len,
                    const void *desired, size_t desired_len, int idempotent, int *swapped,
                    void **current, size_t *current_len, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_CAS, 0, 1, 2, key);
    put_key(&c, key);
    put_val(&c, expected, expected_len);
    put_val(&c, desired, desired_len);
    int rc = call_run(&c, idempotent, -1, &m, err);
    if (rc == 0 && swapped)
        *swapped = m.num != 0;
    if (rc == 0 && current)
        rc = reply_value(&c, &m, current, current_len, err);
    call_end(&c);
    return rc;
}

int dt_store_cas(dt_store *s, const char *key, const void *expected, size_t expected_len,
                 const void *desired, size_t desired_len, void **current, size_t *current_len,
                 dt_err *err)
{
    /* Retrying is safe: a CAS that was applied is seen as "current == desired" the second
     * time, which is how callers recognise success. */
    return cas_call(s, key, expected, expected_len, desired, desired_len, IDEMPOTENT, NULL,
                    current, current_len, err);
}

int dt_store_cas_swapped(dt_store *s, const char *key, const void *expected, size_t expected_len,
                         const void *desired, size_t desired_len, int *swapped, void **current,
                         size_t *current_len, dt_err *err)
{
    /* The swapped flag of a resent request could be wrong: never resend after a full send. */
    return cas_call(s, key, expected, expected_len, desired, desired_len, NOT_IDEMPOTENT,
                    swapped, current, current_len, err);
}

int dt_store_check(dt_store *s, const char *const *keys, size_t n, int *all_exist, dt_err *err)
{
    call c;
    dt_proto_msg m;
    if (n > UINT32_MAX)
        return dt_err_set(err, -E2BIG, "store CHECK: too many keys");
    call_begin(&c, s, DT_OP_CHECK, 0, (uint32_t)n, 0, n ? keys[0] : NULL);
    for (size_t i = 0; i < n; i++)
        put_key(&c, keys[i]);
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    if (rc == 0)
        *all_exist = m.num != 0;
    call_end(&c);
    return rc;
}

int dt_store_wait(dt_store *s, const char *const *keys, size_t n, int timeout_ms, dt_err *err)
{
    call c;
    dt_proto_msg m;
    if (n > UINT32_MAX)
        return dt_err_set(err, -E2BIG, "store WAIT: too many keys");
    int64_t t = eff_timeout(s, timeout_ms);
    call_begin(&c, s, DT_OP_WAIT, t, (uint32_t)n, 0, n ? keys[0] : NULL);
    for (size_t i = 0; i < n; i++)
        put_key(&c, keys[i]);
    int rc = call_run(&c, IDEMPOTENT, t, &m, err);
    call_end(&c);
    return rc;
}

int dt_store_delete(dt_store *s, const char *key, int *deleted, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_DELETE, 0, 1, 0, key);
    put_key(&c, key);
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    if (rc == 0 && deleted)
        *deleted = m.num != 0;
    call_end(&c);
    return rc;
}

int dt_store_num_keys(dt_store *s, int64_t *n, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_NUM_KEYS, 0, 0, 0, NULL);
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    if (rc == 0)
        *n = m.num;
    call_end(&c);
    return rc;
}

int dt_store_append(dt_store *s, const char *key, const void *val, size_t len, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_APPEND, 0, 1, 1, key);
    put_key(&c, key);
    put_val(&c, val, len);
    int rc = call_run(&c, NOT_IDEMPOTENT, -1, &m, err);
    call_end(&c);
    return rc;
}

int dt_store_multi_get(dt_store *s, const char *const *keys, size_t n, void **vals, size_t *lens,
                       int timeout_ms, dt_err *err)
{
    call c;
    dt_proto_msg m;
    if (n > UINT32_MAX)
        return dt_err_set(err, -E2BIG, "store MULTI_GET: too many keys");
    int64_t t = eff_timeout(s, timeout_ms);
    call_begin(&c, s, DT_OP_MULTI_GET, t, (uint32_t)n, 0, n ? keys[0] : NULL);
    for (size_t i = 0; i < n; i++)
        put_key(&c, keys[i]);
    int rc = call_run(&c, IDEMPOTENT, t, &m, err);
    if (rc == 0 && m.nvals != n)
        rc = call_fail(&c, err, -EPROTO, "malformed reply", NULL);
    if (rc == 0) {
        const uint8_t *cur = m.vals;
        size_t i = 0;
        for (; i < n; i++) {
            dt_proto_item it;
            if (dt_proto_next(&cur, m.end, &it) < 0 || !(vals[i] = dup_item(&it)))
                break;
            lens[i] = it.len;
        }
        if (i < n) {
            for (size_t j = 0; j < i; j++) {
                free(vals[j]);
                vals[j] = NULL;
            }
            rc = call_fail(&c, err, -ENOMEM, "out of memory", NULL);
        }
    }
    call_end(&c);
    return rc;
}

int dt_store_multi_set(dt_store *s, const char *const *keys, const void *const *vals,
                       const size_t *lens, size_t n, dt_err *err)
{
    call c;
    dt_proto_msg m;
    if (n > UINT32_MAX)
        return dt_err_set(err, -E2BIG, "store MULTI_SET: too many keys");
    call_begin(&c, s, DT_OP_MULTI_SET, 0, (uint32_t)n, (uint32_t)n, n ? keys[0] : NULL);
    for (size_t i = 0; i < n; i++)
        put_key(&c, keys[i]);
    for (size_t i = 0; i < n; i++)
        put_val(&c, vals[i], lens[i]);
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    call_end(&c);
    return rc;
}

int dt_store_ping(dt_store *s, int64_t *rtt_us, dt_err *err)
{
    call c;
    dt_proto_msg m;
    call_begin(&c, s, DT_OP_PING, 0, 0, 0, NULL);
    uint64_t t0 = dt_now_ns();
    int rc = call_run(&c, IDEMPOTENT, -1, &m, err);
    if (rc == 0 && rtt_us)
        *rtt_us = (int64_t)((dt_now_ns() - t0) / 1000);
    call_end(&c);
    return rc;
}
