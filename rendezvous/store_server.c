/* store_server.c - the dtrain store server: one libuv event loop on its own thread.
 *
 * Design. Everything (the key table, every connection, every waiter) belongs to the loop thread;
 * the only cross-thread operation is dt_store_server_stop, which wakes the loop through a
 * uv_async_t. torchrun's first store read each request with a blocking call on one thread, so
 * one slow client stalled every other; here no client can block the loop: input is parsed from
 * whatever bytes have arrived, replies are written with uv_try_write and queued when the kernel
 * buffer is full, and a request that must wait (GET, WAIT, MULTI_GET on a missing key) parks
 * its connection on that key instead of holding the loop.
 *
 * Memory. An idle connection holds no buffers: reads land in one 64 KiB buffer shared by the
 * loop and are parsed in place; only an incomplete frame is copied into the connection's own
 * buffer (grown to the frame's announced size, which the parser has already checked against
 * the frame limit). Replies are batched per read and written once. Output is flow-controlled:
 * once more than max_pending_output reply bytes wait for a client (beyond what the kernel
 * accepted), the server stops reading and processing that client's requests until its replies
 * drain, so one connection holds at most about twice that. A reply that alone exceeds
 * max_pending_output is refused with E2BIG (never a disconnect). A client is judged not to read
 * only when its replies pile up beyond the limit AND none of them is taken for write_stall_ms;
 * then it is disconnected. A blocked connection stops being read once 64 KiB of pipelined
 * requests is buffered behind its wait. So 4096 idle connections cost about 2 MiB.
 *
 * Input budget. Each connection may hold up to 64 KiB of unparsed input for free (bounded by
 * max_connections). A frame larger than that gets a buffer of exactly its size, charged against
 * max_input_buffered, the server-wide budget for large requests in flight; a connection whose
 * frame does not fit in what is left is not read (uv_read_stop) and waits in a first-come
 * first-served queue until finished frames free enough (a charge is released as soon as its frame
 * is processed, or its connection closes). Small requests never wait for the budget, and a
 * blocked or throttled connection never takes any, so the budget cannot hold back the SET that
 * a paused waiter needs. A frame larger than the whole budget is refused with E2BIG.
 * A client that stops sending in the middle of a large frame (SIGSTOP, a hung read, a dead NIC
 * without RST) would keep its charge forever and every large request behind it would wait: a
 * charged connection that is read and has delivered no byte for input_stall_ms while others
 * wait in the queue is disconnected (one server timer, armed only while the queue is not empty;
 * a slow sender whose bytes keep arriving is never cut, nor is a silent one while nobody waits).
 *
 * Waiters. A waiting connection is linked on exactly one missing key (the first one it lacks;
 * that key has an "absent" entry in the table that exists only while someone waits on it).
 * A write to the key wakes its waiters, each resumes its scan from where it stopped, so a wait
 * for N keys set one by one costs O(N) in all, and 1,024 waiters on one key cost one wake each.
 * Invariant: a present entry has no waiters.
 *
 * Descriptors: starting a server raises the process's soft RLIMIT_NOFILE toward
 * max_connections (up to the hard limit), since 1024 would cap a large job.
 *
 * Deliberately left out: persistence, replication, and fairness beyond per-read batching.
 *
 * Size. About 2,000 lines, one concern: the loop thread's state machine. The key table, the
 * waiters, output flow control, the input budget and the connection lifecycle share one set of
 * invariants (a present entry has no waiters; a charge is released exactly once; a closing
 * connection leaves every list it is on), and each callback touches several of them. Split
 * into files, the conn and entry structs would become a shared internal header and the files
 * would call each other both ways (a reply wakes waiters, a wake writes replies, a write
 * resumes reading), which is the loop this project's layering forbids; so it stays one file,
 * in sections.
 */
#include "rendezvous/store_server.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <uv.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/protocol.h"

#define READ_BUF_SIZE (64 * 1024)
#define FLUSH_AT (256 * 1024)          /* flush a reply batch once it is this large */
#define BLOCKED_INPUT_MAX READ_BUF_SIZE /* pipelined bytes buffered behind a wait */
#define CLOSE_GRACE_MS 2000             /* how long a final error reply may take to drain */
#define REPLY_OVERHEAD (64 * 1024)      /* max_pending_output - max_value_size, at least */

typedef struct conn conn;

/* A connection's place in one of the server's queues (conn_queue). */
typedef struct conn_link {
    conn *prev, *next;
    int in;                  /* it is in the queue */
} conn_link;

/* A queue of connections, oldest first, each linked through its conn_link at offset `link`
 * (the unauthenticated ones, those waiting for input budget). */
typedef struct conn_queue {
    conn *head, *tail;
    size_t n;
    size_t link;             /* offsetof(conn, the conn_link of this queue) */
} conn_queue;
typedef struct entry entry;

struct entry {
    entry *next;       /* hash chain */
    uint64_t hash;
    uint8_t *val;      /* owned; NULL when empty */
    size_t vlen, vcap;
    int present;       /* 0: placeholder that exists only while waiters are linked */
    uint64_t mark;     /* MULTI_SET bookkeeping */
    conn *waiters;     /* first waiting connection (list through conn->wnext/wprev) */
    conn *waiters_tail;
    size_t klen;
    char key[];        /* klen bytes + NUL */
};

enum { ST_HELLO, ST_AUTH, ST_READY };

/* An unauthenticated connection younger than this is never closed to make room for newer ones:
 * on loopback or a cluster network a real handshake completes well within it. */
#define EVICT_GRACE_MS 200

/* Why on_alloc handed libuv no buffer (read_cb then gets UV_ENOBUFS). */
enum { NOBUF_OOM, NOBUF_PAUSE, NOBUF_FULL };

struct conn {
    uv_tcp_t tcp;
    uv_timer_t timer;        /* a parked request's timeout; the grace of a final reply */
    uv_timer_t iotimer;      /* handshake deadline until ready; then write-stall watch */
    dt_store_server *srv;
    conn *prev, *next;       /* every connection */
    conn_link ulink;         /* while not ready: in the unauthenticated queue */
    uint64_t accepted_at;    /* loop time (ms) it was accepted */
    conn *rnext;             /* ready queue */
    int in_ready;
    int state;
    int closing, close_refs, close_after_flush, reading;
    char peer[64];
    uint8_t *in;             /* owned: unparsed input (an incomplete frame, or frames behind a
                                wait) */
    size_t in_len, in_cap;
    size_t in_charged;       /* of in_cap, what is charged against max_input_buffered */
    size_t in_need;          /* while paused for the input budget: the frame's size */
    int nobuf;               /* why on_alloc gave no buffer (NOBUF_*) */
    conn_link plink;         /* .in: waiting in the input budget queue (not read) */
    conn *cprev, *cnext;     /* the connections with in_charged > 0 */
    uint64_t last_rx;        /* loop time (ms) of its last byte received, or of its charge */
    dt_proto_buf out;        /* replies not yet written */
    size_t out_queued;       /* bytes handed to uv_write and not yet completed */
    int throttled;           /* over max_pending_output: input is not read nor processed */
    size_t stall_wq;         /* libuv write-queue size at the last stall check */
    /* A parked request (GET, WAIT, MULTI_GET). */
    int blocked;
    uint8_t wop;
    uint32_t wid;
    uint8_t *wkeys;          /* owned copy of the request's key items */
    size_t wkeys_len;
    uint32_t wn, wpos;       /* key count; index of the first key not yet seen present */
    const uint8_t *wcur;     /* item of key wpos inside wkeys */
    entry *wentry;           /* the key waited on */
    conn *wprev, *wnext;
};

typedef struct write_req {
    uv_write_t req;
    conn *c;
    uint8_t *data;           /* owned */
    size_t len;
} write_req;

struct dt_store_server {
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop_async;
    uv_async_t stats_async;  /* dt_store_server_get_stats asks the loop through this */
    pthread_mutex_t stats_call_mu; /* one stats request at a time */
    pthread_mutex_t stats_mu;
    pthread_cond_t stats_cv;
    dt_store_server_stats stats; /* under stats_mu: the answer */
    int stats_done;              /* under stats_mu */
    pthread_t thread;
    int thread_started;
    int port;
    dt_store_server_opts o;
    char *host, *token;      /* owned copies */
    size_t token_len;
    dt_proto_limits lim;
    dt_proto_limits lim_auth; /* before a connection is ready: an AUTH frame, no more */
    uint8_t rbuf[READ_BUF_SIZE];
    /* key table */
    entry **buckets;
    size_t nbuckets, nentries, npresent;
    size_t bytes;            /* keys + values + DT_STORE_KEY_OVERHEAD of present entries */
    uint64_t mark_gen;
    entry **scratch;         /* owned; entries of the keys of the request being answered */
    size_t scratch_cap;
    /* connections */
    conn *conns;
    size_t nconns;
    size_t max_conns;        /* max_connections, capped by the open-file limit */
    conn_queue unauth;       /* connections not ready yet (handshake, AUTH), oldest first */
    size_t max_unauth;
    uint64_t evicted, evicted_logged;     /* unauthenticated connections closed for newer ones */
    uint64_t accept_errs, accept_errs_logged;
    double evict_log_at, accept_log_at;   /* when each was last said (once per burst) */
    conn *ready_head, *ready_tail;
    /* input budget (max_input_buffered) */
    size_t in_charged;       /* sum of the connections' in_charged */
    size_t in_charged_peak;  /* highest in_charged since start */
    conn_queue paused;       /* waiting for budget, first come first served */
    conn *charged;           /* connections holding a charge (list through cnext/cprev) */
    uv_timer_t stall_timer;  /* while the queue is not empty: cuts stalled charged senders */
    uint64_t paused_since;   /* loop time (ms) the queue last became non-empty */
    uint64_t input_stall_cuts; /* connections cut by it */
    /* log rate limiting for misbehaving clients */
    double log_window;
    int log_count, log_dropped;
};

/* ------------------------------------------------------------------------------------------ */
/* Small helpers                                                                              */
/* ------------------------------------------------------------------------------------------ */

/* Misbehaving clients can arrive by the thousand: at most 20 such warnings per second. */
static int srv_log_ok(dt_store_server *s)
{
    double now = dt_now_s();
    if (now - s->log_window >= 1.0) {
        if (s->log_dropped)
            DT_WARN("store: %d similar warnings suppressed in the last second", s->log_dropped);
        s->log_window = now;
        s->log_count = 0;
        s->log_dropped = 0;
    }
    if (s->log_count < 20) {
        s->log_count++;
        return 1;
    }
    s->log_dropped++;
    return 0;
}

#define SRV_WARN(s, ...)                                                                           \
    do {                                                                                           \
        if (DT_LOG_WARN >= dt_log_level && srv_log_ok(s))                                          \
            DT_WARN(__VA_ARGS__);                                                                  \
    } while (0)

/* 8 bytes at a time with multiply-xorshift mixing (keys are short; this runs for every key of
 * every request). Not flood-resistant: the store trusts its clients (and can require a token). */
static uint64_t hash_bytes(const uint8_t *p, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    if (n)
        memcpy(&v, p, n);
    h = (h ^ v) * 0x94d049bb133111ebull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h;
}

/* ------------------------------------------------------------------------------------------ */
/* Key table                                                                                  */
/* ------------------------------------------------------------------------------------------ */

static entry *table_find(dt_store_server *s, const uint8_t *k, size_t klen, uint64_t h)
{
    if (!s->nbuckets)
        return NULL;
    for (entry *e = s->buckets[h & (s->nbuckets - 1)]; e; e = e->next)
        if (e->hash == h && e->klen == klen && memcmp(e->key, k, klen) == 0)
            return e;
    return NULL;
}

static entry *table_lookup(dt_store_server *s, const dt_proto_item *k)
{
    return table_find(s, k->p, k->len, hash_bytes(k->p, k->len));
}

static int table_grow(dt_store_server *s)
{
    size_t n = s->nbuckets ? s->nbuckets * 2 : 1024;
    entry **b = calloc(n, sizeof *b);
    if (!b)
        return -ENOMEM;
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            e->next = b[e->hash & (n - 1)];
            b[e->hash & (n - 1)] = e;
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = b;
    s->nbuckets = n;
    return 0;
}

/* Finds or creates (absent, empty) the entry of key k. NULL only when out of memory. */
static entry *table_get(dt_store_server *s, const dt_proto_item *k)
{
    uint64_t h = hash_bytes(k->p, k->len);
    entry *e = table_find(s, k->p, k->len, h);
    if (e)
        return e;
    if (s->nentries >= s->nbuckets && table_grow(s) < 0 && !s->nbuckets)
        return NULL;
    e = calloc(1, sizeof *e + k->len + 1);
    if (!e)
        return NULL;
    e->hash = h;
    e->klen = k->len;
    memcpy(e->key, k->p, k->len);
    e->next = s->buckets[h & (s->nbuckets - 1)];
    s->buckets[h & (s->nbuckets - 1)] = e;
    s->nentries++;
    return e;
}

static void table_remove(dt_store_server *s, entry *e)
{
    entry **pp = &s->buckets[e->hash & (s->nbuckets - 1)];
    while (*pp != e)
        pp = &(*pp)->next;
    *pp = e->next;
    s->nentries--;
    free(e->val);
    free(e);
}

/* An absent entry with nobody waiting on it has no reason to exist. */
static void entry_maybe_drop(dt_store_server *s, entry *e)
{
    if (!e->present && !e->waiters)
        table_remove(s, e);
}

/* What a present key is charged against max_total_bytes. */
static size_t entry_cost(size_t klen, size_t vlen) { return klen + vlen + DT_STORE_KEY_OVERHEAD; }

/* Bytes the store would hold if e's value became vlen bytes long. */
static size_t bytes_after(const dt_store_server *s, const entry *e, size_t klen, size_t vlen)
{
    size_t old = (e && e->present) ? entry_cost(e->klen, e->vlen) : 0;
    return s->bytes - old + entry_cost(klen, vlen);
}

/* Replaces (append = 0) or extends (append = 1) e's value. The caller checked the limits. */
static int entry_write(dt_store_server *s, entry *e, const uint8_t *v, size_t n, int append)
{
    size_t base = append && e->present ? e->vlen : 0;
    size_t want = base + n;
    if (want > e->vcap || (!append && e->vcap > 2 * want + 64)) {
        size_t cap = want;
        if (append && want > e->vcap)
            cap = DT_MAX(want, e->vcap + e->vcap / 2);
        uint8_t *nv = realloc(e->val, cap ? cap : 1);
        if (!nv)
            return -ENOMEM;
        e->val = nv;
        e->vcap = cap;
    }
    if (n)
        memcpy(e->val + base, v, n);
    if (e->present)
        s->bytes -= entry_cost(e->klen, e->vlen);
    else
        s->npresent++;
    e->present = 1;
    e->vlen = want;
    s->bytes += entry_cost(e->klen, e->vlen);
    return 0;
}

static void entry_delete(dt_store_server *s, entry *e)
{
    s->bytes -= entry_cost(e->klen, e->vlen);
    s->npresent--;
    e->present = 0;
    e->vlen = 0;
    entry_maybe_drop(s, e); /* present entries have no waiters: it goes */
}

/* ------------------------------------------------------------------------------------------ */
/* Connections: output                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void conn_close(conn *c);
static void run_ready(dt_store_server *s);
static void ready_push(dt_store_server *s, conn *c);

/* Reply bytes waiting for c (built, or handed to libuv and not yet written) over the limit. */
static int conn_over(const conn *c)
{
    return c->out_queued + c->out.len > c->srv->o.max_pending_output;
}

/* While throttled, every write_stall_ms: a client that took none of its replies since the last
 * check does not read them; one that took some is only slow, and is left alone. */
static void on_stall_check(uv_timer_t *t)
{
    conn *c = t->data;
    dt_store_server *s = c->srv;
    if (c->closing || !c->throttled) {
        uv_timer_stop(t);
        return;
    }
    size_t wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    if (wq < c->stall_wq) {
        c->stall_wq = wq;
        return;
    }
    SRV_WARN(s, "store: %s does not read its replies (%zu bytes pending, over "
             "max_pending_output = %zu, and none taken for %d ms); disconnecting it",
             c->peer, c->out_queued + c->out.len, s->o.max_pending_output, s->o.write_stall_ms);
    conn_close(c);
}

/* Stops reading and processing c's input until its replies drain (on_write resumes it). */
static void conn_throttle(conn *c)
{
    dt_store_server *s = c->srv;
    if (c->throttled || c->closing)
        return;
    c->throttled = 1;
    c->stall_wq = uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp);
    uv_timer_start(&c->iotimer, on_stall_check, (uint64_t)s->o.write_stall_ms,
                   (uint64_t)s->o.write_stall_ms);
    if (c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
}

static void on_write(uv_write_t *req, int status)
{
    write_req *w = (write_req *)req;
    conn *c = w->c;
    c->out_queued -= w->len;
    free(w->data);
    free(w);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        DT_DEBUG("store: writing to %s failed: %s", c->peer, uv_strerror(status));
        conn_close(c);
    } else if (c->close_after_flush && c->out_queued == 0 && !c->closing) {
        conn_close(c);
    } else if (c->throttled && !c->closing && !conn_over(c)) {
        /* The replies drained below the limit: process the held input, read again. */
        c->throttled = 0;
        uv_timer_stop(&c->iotimer);
        ready_push(c->srv, c);
        run_ready(c->srv);
    }
}

/* Writes c->out: directly when nothing is queued and the kernel takes it, else through a
 * queued uv_write that owns the bytes. Disconnects a client that lets too much pile up. */
static void conn_flush(conn *c)
{
    dt_store_server *s = c->srv;
    if (c->closing)
        return;
    if (c->out.oom) {
        SRV_WARN(s, "store: out of memory building a reply for %s; disconnecting it", c->peer);
        conn_close(c);
        return;
    }
    if (c->out.len == 0) {
        if (c->close_after_flush && c->out_queued == 0)
            conn_close(c);
        return;
    }
    size_t off = 0;
    if (c->out_queued == 0) {
        uv_buf_t b = uv_buf_init((char *)c->out.data, (unsigned)DT_MIN(c->out.len, UINT32_MAX));
        int n = uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
        if (n < 0 && n != UV_EAGAIN) {
            DT_DEBUG("store: writing to %s failed: %s", c->peer, uv_strerror(n));
            conn_close(c);
            return;
        }
        off = n > 0 ? (size_t)n : 0;
    }
    if (off == c->out.len) {
        c->out.len = 0;
        if (c->out.cap > FLUSH_AT * 2)
            dt_proto_buf_free(&c->out);
        if (c->close_after_flush && c->out_queued == 0)
            conn_close(c);
        return;
    }
    size_t rest = c->out.len - off;
    write_req *w = malloc(sizeof *w);
    if (!w) {
        conn_close(c);
        return;
    }
    if (off)
        memmove(c->out.data, c->out.data + off, rest);
    w->c = c;
    w->data = c->out.data; /* ownership moves to the write request */
    w->len = rest;
    memset(&c->out, 0, sizeof c->out);
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)rest);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0) {
        free(w->data);
        free(w);
        conn_close(c);
        return;
    }
    c->out_queued += rest;
    if (conn_over(c))
        conn_throttle(c);
}

static void reply_error(conn *c, uint32_t id, uint8_t status, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void reply_error(conn *c, uint32_t id, uint8_t status, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dt_proto_put_error(&c->out, id, status, msg);
}

static void reply_num(conn *c, uint32_t id, int64_t num)
{
    size_t st = dt_proto_begin(&c->out, DT_PROTO_OK, id, num, 0, 0);
    dt_proto_end(&c->out, st);
}

/* ------------------------------------------------------------------------------------------ */
/* Waiting                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static void ready_push(dt_store_server *s, conn *c)
{
    if (c->in_ready || c->closing)
        return;
    c->in_ready = 1;
    c->rnext = NULL;
    if (s->ready_tail)
        s->ready_tail->rnext = c;
    else
        s->ready_head = c;
    s->ready_tail = c;
}

static void wait_link(conn *c, entry *e)
{
    c->wentry = e;
    c->wnext = NULL;
    c->wprev = e->waiters_tail;
    if (e->waiters_tail)
        e->waiters_tail->wnext = c;
    else
        e->waiters = c;
    e->waiters_tail = c;
}

static void wait_unlink(dt_store_server *s, conn *c)
{
    entry *e = c->wentry;
    if (!e)
        return;
    if (c->wprev)
        c->wprev->wnext = c->wnext;
    else
        e->waiters = c->wnext;
    if (c->wnext)
        c->wnext->wprev = c->wprev;
    else
        e->waiters_tail = c->wprev;
    c->wentry = NULL;
    c->wprev = c->wnext = NULL;
    entry_maybe_drop(s, e);
}

/* Makes s->scratch hold at least n entry pointers. */
static int scratch_reserve(dt_store_server *s, size_t n)
{
    if (n <= s->scratch_cap)
        return 0;
    size_t cap = DT_MAX(n, 2 * s->scratch_cap);
    entry **p = realloc(s->scratch, cap * sizeof *p);
    if (!p)
        return -ENOMEM;
    s->scratch = p;
    s->scratch_cap = cap;
    return 0;
}

/* Replies to a GET/WAIT/MULTI_GET whose n keys are all present, as the entries es[0..n). */
static void reply_entries(conn *c, uint8_t op, uint32_t id, entry *const *es, uint32_t n)
{
    dt_store_server *s = c->srv;
    if (op == DT_OP_WAIT) {
        reply_num(c, id, 0);
        return;
    }
    size_t total = DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE;
    for (uint32_t i = 0; i < n; i++)
        total += DT_PROTO_ITEM_OVERHEAD + es[i]->vlen;
    if (total - DT_PROTO_LEN_SIZE > s->lim.max_frame) {
        reply_error(c, id, DT_PROTO_E2BIG,
                    "%s reply would be %zu bytes, over the frame size limit (%zu bytes); get "
                    "fewer keys at once",
                    dt_proto_op_name(op), total, s->lim.max_frame);
        return;
    }
    /* The server never buffers more than max_pending_output of replies for one client (the
     * start-up check guarantees that one value always fits). */
    if (total > s->o.max_pending_output) {
        reply_error(c, id, DT_PROTO_E2BIG,
                    "%s reply would be %zu bytes, over max_pending_output = %zu (the reply "
                    "bytes the server buffers per client); get fewer keys at once, or raise "
                    "max_pending_output (dtrain store --max-pending-output)",
                    dt_proto_op_name(op), total, s->o.max_pending_output);
        return;
    }
    if (dt_proto_reserve(&c->out, total) < 0)
        return; /* c->out.oom: conn_flush disconnects */
    size_t st = dt_proto_begin(&c->out, DT_PROTO_OK, id, 0, 0, n);
    for (uint32_t i = 0; i < n; i++)
        dt_proto_put_item(&c->out, es[i]->val, es[i]->vlen);
    dt_proto_end(&c->out, st);
}

/* Looks up the n keys at [keys, end) into s->scratch. Returns the index of the first missing
 * key (n when all are present; -1 when out of memory); *miss gets its item. */
static int64_t lookup_keys(dt_store_server *s, const uint8_t *keys, const uint8_t *end,
                           uint32_t n, const uint8_t **miss, dt_proto_item *missing)
{
    if (scratch_reserve(s, n) < 0)
        return -1;
    const uint8_t *cur = keys;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *at = cur;
        dt_proto_item k;
        if (dt_proto_next(&cur, end, &k) < 0)
            return i; /* cannot happen: the items were validated */
        entry *e = table_lookup(s, &k);
        if (!e || !e->present) {
            if (miss)
                *miss = at;
            if (missing)
                *missing = k;
            return i;
        }
        s->scratch[i] = e;
    }
    return n;
}

static void conn_unblock(conn *c)
{
    wait_unlink(c->srv, c);
    uv_timer_stop(&c->timer);
    free(c->wkeys);
    c->wkeys = NULL;
    c->wcur = NULL;
    c->blocked = 0;
    ready_push(c->srv, c);
}

/* Advances a parked request: scans on from the first key not yet seen present and parks on the
 * next missing one; once the scan reaches the end, a full pass confirms every key (an earlier
 * one may have been deleted meanwhile), then it replies and unblocks. */
static void wait_step(conn *c)
{
    dt_store_server *s = c->srv;
    const uint8_t *end = c->wkeys + c->wkeys_len;
    dt_proto_item k;
    for (;;) {
        while (c->wpos < c->wn) {
            const uint8_t *at = c->wcur;
            if (dt_proto_next(&c->wcur, end, &k) < 0)
                break; /* cannot happen: the items were validated */
            entry *e = table_lookup(s, &k);
            if (!e || !e->present) {
                c->wcur = at; /* stay on this key */
                e = e ? e : table_get(s, &k);
                if (!e) {
                    reply_error(c, c->wid, DT_PROTO_ENOMEM, "store out of memory");
                    conn_unblock(c);
                    return;
                }
                wait_link(c, e);
                return;
            }
            c->wpos++;
        }
        const uint8_t *at = NULL;
        int64_t i = lookup_keys(s, c->wkeys, end, c->wn, &at, NULL);
        if (i < 0) {
            reply_error(c, c->wid, DT_PROTO_ENOMEM, "store out of memory");
            conn_unblock(c);
            return;
        }
        if (i >= c->wn)
            break;
        c->wpos = (uint32_t)i;
        c->wcur = at;
    }
    reply_entries(c, c->wop, c->wid, s->scratch, c->wn);
    conn_unblock(c);
}

/* Wakes everyone parked on e (which just became present). */
static void wait_wake(dt_store_server *s, entry *e)
{
    conn *c = e->waiters;
    e->waiters = e->waiters_tail = NULL;
    while (c) {
        conn *next = c->wnext;
        c->wentry = NULL;
        c->wprev = c->wnext = NULL;
        wait_step(c);
        c = next;
    }
    (void)s;
}

static void on_wait_timeout(uv_timer_t *t)
{
    conn *c = t->data;
    dt_store_server *s = c->srv;
    if (c->closing)
        return;
    if (c->close_after_flush) { /* the final reply did not drain in time */
        conn_close(c);
        return;
    }
    if (!c->blocked)
        return;
    dt_proto_item k = {0};
    const uint8_t *cur = c->wcur;
    dt_proto_next(&cur, c->wkeys + c->wkeys_len, &k);
    reply_error(c, c->wid, DT_PROTO_ETIMEDOUT, "%s timed out waiting for key \"%.*s\"",
                dt_proto_op_name(c->wop), (int)DT_MIN(k.len, 200u),
                k.p ? (const char *)k.p : "");
    conn_unblock(c);
    run_ready(s);
}

/* Parks c on request m (GET, WAIT, MULTI_GET) whose first missing key is the item at `miss`,
 * index `idx`. */
static void conn_park(conn *c, const dt_proto_msg *m, const uint8_t *miss, uint32_t idx)
{
    size_t n = (size_t)(m->vals - m->keys);
    c->wkeys = malloc(n ? n : 1);
    if (!c->wkeys) {
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory");
        return;
    }
    memcpy(c->wkeys, m->keys, n);
    c->wkeys_len = n;
    c->wn = m->nkeys;
    c->wpos = idx;
    c->wcur = c->wkeys + (miss - m->keys);
    c->wop = m->code;
    c->wid = m->id;
    c->blocked = 1;
    if (m->num > 0)
        uv_timer_start(&c->timer, on_wait_timeout, (uint64_t)m->num, 0);
    wait_step(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Requests                                                                                   */
/* ------------------------------------------------------------------------------------------ */

static int store_full(conn *c, uint32_t id, size_t after)
{
    dt_store_server *s = c->srv;
    if (after <= s->o.max_total_bytes)
        return 0;
    reply_error(c, id, DT_PROTO_E2BIG,
                "store full: keys and values (plus %d bytes of bookkeeping per key) would take "
                "%zu bytes, limit max_total_bytes = %zu",
                DT_STORE_KEY_OVERHEAD, after, s->o.max_total_bytes);
    return 1;
}

/* Parses a decimal int64 (optional sign, digits only). */
static int parse_i64(const uint8_t *p, size_t n, int64_t *out)
{
    char buf[32];
    if (n == 0 || n >= sizeof buf)
        return -1;
    memcpy(buf, p, n);
    buf[n] = '\0';
    return dt_parse_i64(buf, out) == 0 ? 0 : -1;
}

static void op_set(conn *c, const dt_proto_msg *m, int append)
{
    dt_store_server *s = c->srv;
    const uint8_t *kc = m->keys, *vc = m->vals;
    dt_proto_item k, v;
    dt_proto_next(&kc, m->end, &k);
    dt_proto_next(&vc, m->end, &v);
    entry *e = table_lookup(s, &k);
    size_t vlen = v.len + (append && e && e->present ? e->vlen : 0);
    if (vlen > s->o.max_value_size) {
        reply_error(c, m->id, DT_PROTO_E2BIG,
                    "APPEND would make the value %zu bytes, limit max_value_size = %zu", vlen,
                    s->o.max_value_size);
        return;
    }
    if (store_full(c, m->id, bytes_after(s, e, k.len, vlen)))
        return;
    if (!e)
        e = table_get(s, &k);
    if (!e || entry_write(s, e, v.p, v.len, append) < 0) {
        if (e)
            entry_maybe_drop(s, e);
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory");
        return;
    }
    reply_num(c, m->id, 0);
    if (e->waiters)
        wait_wake(s, e);
}

static void op_add(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *kc = m->keys;
    dt_proto_item k;
    dt_proto_next(&kc, m->end, &k);
    entry *e = table_lookup(s, &k);
    int64_t cur = 0, res;
    if (e && e->present && parse_i64(e->val, e->vlen, &cur) < 0) {
        reply_error(c, m->id, DT_PROTO_EINVAL, "ADD: the value under the key is not an integer");
        return;
    }
    if (__builtin_add_overflow(cur, m->num, &res)) {
        reply_error(c, m->id, DT_PROTO_EINVAL, "ADD: %" PRId64 " + %" PRId64 " overflows int64",
                    cur, m->num);
        return;
    }
    char txt[32];
    int n = snprintf(txt, sizeof txt, "%" PRId64, res);
    if (store_full(c, m->id, bytes_after(s, e, k.len, (size_t)n)))
        return;
    if (!e)
        e = table_get(s, &k);
    if (!e || entry_write(s, e, (const uint8_t *)txt, (size_t)n, 0) < 0) {
        if (e)
            entry_maybe_drop(s, e);
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory");
        return;
    }
    reply_num(c, m->id, res);
    if (e->waiters)
        wait_wake(s, e);
}

static void op_cas(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *kc = m->keys, *vc = m->vals;
    dt_proto_item k, exp, des;
    dt_proto_next(&kc, m->end, &k);
    dt_proto_next(&vc, m->end, &exp);
    dt_proto_next(&vc, m->end, &des);
    entry *e = table_lookup(s, &k);
    int present = e && e->present;
    int match = present ? (e->vlen == exp.len && (!exp.len || !memcmp(e->val, exp.p, exp.len)))
                        : exp.len == 0;
    if (!match) {
        /* torch's TCPStore answers an absent key with a non-empty expected value by echoing
         * expected back (and sets nothing); do the same, so that code ported from
         * store.compare_set sees what it saw there. */
        size_t st = dt_proto_begin(&c->out, DT_PROTO_OK, m->id, 0, 0, 1);
        if (present)
            dt_proto_put_item(&c->out, e->val, e->vlen);
        else
            dt_proto_put_item(&c->out, exp.p, exp.len);
        dt_proto_end(&c->out, st);
        return;
    }
    if (store_full(c, m->id, bytes_after(s, e, k.len, des.len)))
        return;
    if (!e)
        e = table_get(s, &k);
    if (!e || entry_write(s, e, des.p, des.len, 0) < 0) {
        if (e)
            entry_maybe_drop(s, e);
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory");
        return;
    }
    size_t st = dt_proto_begin(&c->out, DT_PROTO_OK, m->id, 1, 0, 1);
    dt_proto_put_item(&c->out, e->val, e->vlen);
    dt_proto_end(&c->out, st);
    if (e->waiters)
        wait_wake(s, e);
}

/* GET, WAIT, MULTI_GET, CHECK: reply now when every key is present, else park or fail. */
static void op_keys(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *miss = NULL;
    dt_proto_item k = {0};
    int64_t i = lookup_keys(s, m->keys, m->vals, m->nkeys, &miss, &k);
    if (i < 0) {
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory");
        return;
    }
    if (m->code == DT_OP_CHECK) {
        reply_num(c, m->id, i == m->nkeys);
        return;
    }
    if (i == m->nkeys) {
        reply_entries(c, m->code, m->id, s->scratch, m->nkeys);
        return;
    }
    if (m->num == 0) {
        if (m->code == DT_OP_WAIT)
            reply_error(c, m->id, DT_PROTO_ETIMEDOUT, "WAIT: key \"%.*s\" is missing (timeout 0)",
                        (int)DT_MIN(k.len, 200u), (const char *)k.p);
        else
            reply_error(c, m->id, DT_PROTO_ENOENT, "%s: key \"%.*s\" not found",
                        dt_proto_op_name(m->code), (int)DT_MIN(k.len, 200u), (const char *)k.p);
        return;
    }
    conn_park(c, m, miss, (uint32_t)i);
}

static void op_delete(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *kc = m->keys;
    dt_proto_item k;
    dt_proto_next(&kc, m->end, &k);
    entry *e = table_lookup(s, &k);
    int existed = e && e->present;
    if (existed)
        entry_delete(s, e);
    reply_num(c, m->id, existed);
}

static void op_multi_set(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *kc = m->keys, *vc = m->vals;
    dt_proto_item k, v;
    /* Pass 1: the limit, counting each present key's old size once (duplicates allowed). */
    uint64_t gen = ++s->mark_gen;
    size_t add = 0, sub = 0;
    for (uint32_t i = 0; i < m->nkeys; i++) {
        dt_proto_next(&kc, m->end, &k);
        dt_proto_next(&vc, m->end, &v);
        entry *e = table_lookup(s, &k);
        if (e && e->present && e->mark != gen) {
            e->mark = gen;
            sub += entry_cost(e->klen, e->vlen);
        }
        add += entry_cost(k.len, v.len);
    }
    if (store_full(c, m->id, s->bytes - sub + add))
        return;
    /* Pass 2: apply, then pass 3: wake (after every key is written, so that a woken
     * MULTI_GET never sees half of this request). */
    kc = m->keys;
    vc = m->vals;
    int oom = 0;
    for (uint32_t i = 0; i < m->nkeys; i++) {
        dt_proto_next(&kc, m->end, &k);
        dt_proto_next(&vc, m->end, &v);
        entry *e = table_get(s, &k);
        if (!e || entry_write(s, e, v.p, v.len, 0) < 0) {
            if (e)
                entry_maybe_drop(s, e);
            oom = 1;
            break;
        }
    }
    if (oom)
        reply_error(c, m->id, DT_PROTO_ENOMEM, "store out of memory (MULTI_SET partly applied)");
    else
        reply_num(c, m->id, 0);
    kc = m->keys;
    for (uint32_t i = 0; i < m->nkeys; i++) {
        dt_proto_next(&kc, m->end, &k);
        entry *e = table_lookup(s, &k);
        if (e && e->present && e->waiters)
            wait_wake(s, e);
    }
}

static conn_link *queue_link(const conn_queue *q, conn *c)
{
    return (conn_link *)((char *)c + q->link);
}

/* Appends c (not in q) at the tail of q. */
static void queue_append(conn_queue *q, conn *c)
{
    conn_link *l = queue_link(q, c);
    l->next = NULL;
    l->prev = q->tail;
    if (q->tail)
        queue_link(q, q->tail)->next = c;
    else
        q->head = c;
    q->tail = c;
    l->in = 1;
    q->n++;
}

/* Takes c out of q (nothing when it is not in it). */
static void queue_remove(conn_queue *q, conn *c)
{
    conn_link *l = queue_link(q, c);
    if (!l->in)
        return;
    if (l->prev)
        queue_link(q, l->prev)->next = l->next;
    else
        q->head = l->next;
    if (l->next)
        queue_link(q, l->next)->prev = l->prev;
    else
        q->tail = l->prev;
    l->prev = l->next = NULL;
    l->in = 0;
    q->n--;
}

static void unauth_unlink(dt_store_server *s, conn *c)
{
    queue_remove(&s->unauth, c);
}

/* The handshake (and AUTH) is complete: the connection may send anything. */
static void conn_ready(conn *c)
{
    unauth_unlink(c->srv, c);
    c->state = ST_READY;
    uv_timer_stop(&c->iotimer);
}

static void op_auth(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    const uint8_t *vc = m->vals;
    dt_proto_item t;
    dt_proto_next(&vc, m->end, &t);
    if (s->token) {
        /* Constant-time comparison: no early exit on the first differing byte. */
        unsigned diff = (unsigned)(t.len != s->token_len);
        for (size_t i = 0; i < s->token_len; i++)
            diff |= (unsigned)(s->token[i] ^ (i < t.len ? t.p[i] : 0));
        if (diff) {
            SRV_WARN(s, "store: refused %s: wrong token", c->peer);
            reply_error(c, m->id, DT_PROTO_EACCES,
                        "wrong store token (check DTRAIN_STORE_TOKEN or the token file)");
            c->close_after_flush = 1;
            uv_timer_start(&c->timer, on_wait_timeout, CLOSE_GRACE_MS, 0);
            return;
        }
    }
    conn_ready(c);
    reply_num(c, m->id, 0);
}

static void handle_request(conn *c, const dt_proto_msg *m)
{
    dt_store_server *s = c->srv;
    if (c->state == ST_AUTH && m->code != DT_OP_AUTH) {
        SRV_WARN(s, "store: refused %s: %s before authenticating (the store requires a token)",
                 c->peer, dt_proto_op_name(m->code));
        reply_error(c, m->id, DT_PROTO_EACCES,
                    "the store requires a token: set DTRAIN_STORE_TOKEN (or the client's token "
                    "option) to the server's token");
        c->close_after_flush = 1;
        uv_timer_start(&c->timer, on_wait_timeout, CLOSE_GRACE_MS, 0);
        return;
    }
    if (m->bad != DT_PROTO_OK) {
        SRV_WARN(s, "store: bad %s request from %s: %s", dt_proto_op_name(m->code), c->peer,
                 m->why);
        reply_error(c, m->id, m->bad, "bad %s request: %s", dt_proto_op_name(m->code), m->why);
        return;
    }
    switch (m->code) {
    case DT_OP_AUTH: op_auth(c, m); break;
    case DT_OP_SET: op_set(c, m, 0); break;
    case DT_OP_APPEND: op_set(c, m, 1); break;
    case DT_OP_ADD: op_add(c, m); break;
    case DT_OP_CAS: op_cas(c, m); break;
    case DT_OP_GET:
    case DT_OP_WAIT:
    case DT_OP_MULTI_GET:
    case DT_OP_CHECK: op_keys(c, m); break;
    case DT_OP_DELETE: op_delete(c, m); break;
    case DT_OP_NUM_KEYS: reply_num(c, m->id, (int64_t)s->npresent); break;
    case DT_OP_MULTI_SET: op_multi_set(c, m); break;
    case DT_OP_PING: reply_num(c, m->id, (int64_t)(dt_now_ns() / 1000)); break;
    default: reply_error(c, m->id, DT_PROTO_EINVAL, "unknown op %d", m->code); break;
    }
}

/* ------------------------------------------------------------------------------------------ */
/* Connections: input                                                                         */
/* ------------------------------------------------------------------------------------------ */

/* Handles the complete frames (and the hello) at the start of data[0..len); stops at an
 * incomplete frame, a parked request or a close. Returns the bytes consumed. */
static size_t conn_process(conn *c, const uint8_t *data, size_t len)
{
    dt_store_server *s = c->srv;
    size_t off = 0;
    while (!c->closing && !c->blocked && !c->close_after_flush && !c->throttled && off < len) {
        if (c->state == ST_HELLO) {
            if (len - off < DT_PROTO_HELLO_SIZE)
                break;
            uint16_t ver, flags;
            if (dt_proto_hello_decode(data + off, &ver, &flags) < 0) {
                SRV_WARN(s, "store: %s is not a dtrain store client (bad handshake magic); "
                         "closing it", c->peer);
                conn_close(c);
                break;
            }
            if (ver != DT_PROTO_VERSION) {
                SRV_WARN(s, "store: %s speaks store protocol version %u, this server speaks "
                         "%u; closing it (use the same dtrain version everywhere)",
                         c->peer, ver, DT_PROTO_VERSION);
                conn_close(c);
                break;
            }
            off += DT_PROTO_HELLO_SIZE;
            if (s->token)
                c->state = ST_AUTH;
            else
                conn_ready(c);
            continue;
        }
        dt_proto_msg m;
        const char *why = NULL;
        const dt_proto_limits *lim = c->state == ST_READY ? &s->lim : &s->lim_auth;
        size_t need = 0;
        ssize_t r = dt_proto_parse(data + off, len - off, lim, 0, &m, &need, &why);
        if (r == 0 && need > READ_BUF_SIZE && need > s->o.max_input_buffered) {
            /* It would have to be held whole, and it can never fit the budget. */
            SRV_WARN(s, "store: %s sent a %zu-byte request, larger than max_input_buffered = "
                     "%zu (the bytes of large requests the server holds for all clients "
                     "together); refusing it and closing the connection",
                     c->peer, need, s->o.max_input_buffered);
            uint32_t id = len - off >= DT_PROTO_LEN_SIZE + 5
                              ? dt_proto_rd32(data + off + DT_PROTO_LEN_SIZE + 1)
                              : 0;
            reply_error(c, id, DT_PROTO_E2BIG,
                        "request of %zu bytes is larger than the server's max_input_buffered "
                        "(%zu bytes); closing the connection",
                        need, s->o.max_input_buffered);
            c->close_after_flush = 1;
            uv_timer_start(&c->timer, on_wait_timeout, CLOSE_GRACE_MS, 0);
            off = len;
            break;
        }
        if (r == 0)
            break;
        if (r < 0) {
            SRV_WARN(s, "store: %s sent a bad frame (%s%s); closing it", c->peer, why,
                     c->state == ST_READY ? "" : ", before authenticating");
            reply_error(c, 0, r == -E2BIG ? DT_PROTO_E2BIG : DT_PROTO_EPROTO,
                        "%s (limit %zu bytes%s); closing the connection", why, lim->max_frame,
                        c->state == ST_READY ? "" : " until authenticated");
            c->close_after_flush = 1;
            uv_timer_start(&c->timer, on_wait_timeout, CLOSE_GRACE_MS, 0);
            off = len; /* the stream cannot be resynchronised: drop the rest */
            break;
        }
        handle_request(c, &m);
        off += (size_t)r;
        if (c->out.len >= FLUSH_AT || conn_over(c))
            conn_flush(c); /* throttles c when its replies pile up */
    }
    return off;
}

/* ---- the input buffer and the input budget ---- */

static void conn_read_start(conn *c);
static void budget_resume(dt_store_server *s);
static void charged_link(conn *c);
static void charged_unlink(conn *c);

/* The list of charged connections, which the stall timer scans. A charge starts the silence
 * clock afresh: a connection granted budget after waiting in the queue has not stalled. */
static void charged_link(conn *c)
{
    dt_store_server *s = c->srv;
    c->cprev = NULL;
    c->cnext = s->charged;
    if (s->charged)
        s->charged->cprev = c;
    s->charged = c;
    c->last_rx = uv_now(&s->loop);
}

static void charged_unlink(conn *c)
{
    dt_store_server *s = c->srv;
    if (c->cprev)
        c->cprev->cnext = c->cnext;
    else
        s->charged = c->cnext;
    if (c->cnext)
        c->cnext->cprev = c->cprev;
    c->cprev = c->cnext = NULL;
}

/* Sets what c holds of max_input_buffered (its charged-list membership with it); when that
 * drops, the freed budget goes to the paused connections. */
static void charge_set(conn *c, size_t charge)
{
    dt_store_server *s = c->srv;
    size_t old = c->in_charged;
    s->in_charged = s->in_charged - old + charge;
    c->in_charged = charge;
    if (charge && !old)
        charged_link(c);
    else if (!charge && old)
        charged_unlink(c);
    s->in_charged_peak = DT_MAX(s->in_charged_peak, s->in_charged);
    if (charge < old)
        budget_resume(s);
}

/* Resizes c's input buffer to exactly cap bytes (>= in_len; 0 frees it) and keeps the charge
 * against max_input_buffered in step: a buffer over READ_BUF_SIZE holds one large frame and is
 * charged whole. Frees budget for paused connections when the charge drops. 0 or -ENOMEM (then
 * nothing changed). */
static int in_resize(conn *c, size_t cap)
{
    if (cap == c->in_cap)
        return 0;
    if (cap) {
        uint8_t *p = realloc(c->in, cap);
        if (!p)
            return -ENOMEM;
        c->in = p;
    } else {
        free(c->in);
        c->in = NULL;
    }
    c->in_cap = cap;
    charge_set(c, cap > READ_BUF_SIZE ? cap : 0);
    return 0;
}

static int in_reserve(conn *c, size_t want)
{
    return c->in_cap >= want ? 0 : in_resize(c, want);
}

static void budget_unqueue(dt_store_server *s, conn *c)
{
    if (!c->plink.in)
        return;
    queue_remove(&s->paused, c);
    if (!s->paused.n)
        uv_timer_stop(&s->stall_timer); /* nobody waits: a silent sender harms nobody */
}

/* Whether the peer of c has bytes waiting in the kernel that the loop has not read yet (a loop
 * that was slow to get here must not take its own lag for the client's silence). */
static int conn_has_unread(conn *c)
{
    uv_os_fd_t fd;
    char b;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) != 0)
        return 0;
    ssize_t n;
    do
        n = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    while (n < 0 && errno == EINTR);
    return n != 0 && !(n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
}

/* The stall timer, armed while connections wait for input budget: a connection that holds a
 * charge for an incomplete frame, is being read, and has delivered nothing for input_stall_ms
 * of that wait keeps budget it may never use; it is disconnected (its charge goes back to the
 * queue). Re-armed for the earliest next deadline. */
static void on_input_stall_check(uv_timer_t *t)
{
    dt_store_server *s = t->data;
    uint64_t stall = (uint64_t)s->o.input_stall_ms;
    for (;;) {
        if (!s->paused.n)
            return; /* budget_unqueue stopped the timer */
        uint64_t now = uv_now(&s->loop), next = stall;
        conn *cut = NULL;
        uint64_t silent = 0;
        for (conn *c = s->charged; c; c = c->cnext) {
            if (c->closing || !c->reading || c->blocked || c->throttled || c->close_after_flush ||
                c->in_len >= c->in_cap)
                continue; /* not read, or its frame is complete: the silence is not its own */
            uint64_t since = DT_MAX(c->last_rx, s->paused_since);
            if (now - since < stall) {
                next = DT_MIN(next, since + stall - now);
            } else if (conn_has_unread(c)) {
                c->last_rx = now; /* bytes arrived; the loop reads them next */
                next = DT_MIN(next, stall);
            } else {
                cut = c;
                silent = now - c->last_rx;
                break;
            }
        }
        if (!cut) {
            uv_timer_start(t, on_input_stall_check, DT_MAX(next, (uint64_t)1), 0);
            return;
        }
        s->input_stall_cuts++;
        SRV_WARN(s, "store: %s stalled in the middle of a %zu-byte request (%zu of %zu bytes "
                 "received, nothing for %" PRIu64 " ms) while %zu connections wait for input "
                 "budget (max_input_buffered = %zu); disconnecting it (input_stall_ms = %d)",
                 cut->peer, cut->in_cap, cut->in_len, cut->in_cap, silent, s->paused.n,
                 s->o.max_input_buffered, s->o.input_stall_ms);
        conn_close(cut); /* releases its charge and resumes the queue */
        run_ready(s);
    }
}

/* Queues c (not read meanwhile) until `need` bytes of budget are free for its frame. */
static void budget_pause(conn *c, size_t need)
{
    dt_store_server *s = c->srv;
    if (c->plink.in)
        return;
    c->in_need = need;
    queue_append(&s->paused, c);
    if (s->paused.n == 1) {
        s->paused_since = uv_now(&s->loop);
        uv_timer_start(&s->stall_timer, on_input_stall_check, (uint64_t)s->o.input_stall_ms, 0);
    }
    DT_DEBUG("store: %s waits for input budget: its %zu-byte request does not fit (%zu of "
             "max_input_buffered = %zu bytes held; %zu connections waiting)",
             c->peer, need, s->in_charged, s->o.max_input_buffered, s->paused.n);
}

/* Grants budget to the paused connections, in order, while the first one's frame fits. */
static void budget_resume(dt_store_server *s)
{
    conn *c;
    while ((c = s->paused.head) && s->in_charged + c->in_need <= s->o.max_input_buffered) {
        budget_unqueue(s, c);
        if (c->closing)
            continue;
        if (in_reserve(c, c->in_need) < 0) {
            SRV_WARN(s, "store: out of memory buffering a %zu-byte request from %s; "
                     "disconnecting it", c->in_need, c->peer);
            conn_close(c);
            continue;
        }
        if (!c->reading && !c->blocked && !c->throttled && !c->close_after_flush)
            conn_read_start(c);
    }
}

/* Processes the connection's own buffer and keeps what is left. */
static void conn_drain_input(conn *c)
{
    if (c->in_len == 0)
        return;
    size_t used = conn_process(c, c->in, c->in_len);
    if (c->closing)
        return;
    if (used == c->in_len || c->close_after_flush) {
        c->in_len = 0;
        if (c->in_cap > READ_BUF_SIZE)
            in_resize(c, 0); /* releases its charge */
    } else if (used) {
        memmove(c->in, c->in + used, c->in_len - used);
        c->in_len -= used;
        if (c->in_cap > READ_BUF_SIZE && c->in_len <= READ_BUF_SIZE)
            in_resize(c, READ_BUF_SIZE); /* the large frame is done: release its charge */
    }
}

/* Runs the connections whose parked request just completed: their pipelined input was held.
 * Called at the end of every loop callback that may have completed one. */
static void run_ready(dt_store_server *s)
{
    conn *c;
    while ((c = s->ready_head)) {
        s->ready_head = c->rnext;
        if (!s->ready_head)
            s->ready_tail = NULL;
        c->in_ready = 0;
        if (c->closing)
            continue;
        conn_drain_input(c);
        conn_flush(c);
        if (!c->closing && !c->reading && !c->blocked && !c->close_after_flush && !c->throttled)
            conn_read_start(c);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn *c = h->data;
    dt_store_server *s = c->srv;
    (void)suggested;
    if (c->in_len == 0 || c->close_after_flush) { /* (after a fatal error input is dropped) */
        *buf = uv_buf_init((char *)s->rbuf, sizeof s->rbuf);
        return;
    }
    /* An incomplete frame is pending: read straight into its buffer, sized to the frame.
     * Until a connection is ready (handshake, AUTH) only a hello and an AUTH frame can come,
     * so a stranger cannot make the server reserve more than that (the parser refuses a
     * larger length prefix before any of it is buffered). */
    size_t want = READ_BUF_SIZE;
    c->nobuf = NOBUF_OOM;
    if (c->state != ST_READY) {
        want = DT_MIN(c->in_len + READ_BUF_SIZE,
                      DT_PROTO_HELLO_SIZE + DT_PROTO_LEN_SIZE + s->lim_auth.max_frame);
        want = DT_MAX(want, c->in_len + 1);
    } else {
        size_t total = 0;
        if (c->in_len >= DT_PROTO_LEN_SIZE) {
            total = DT_PROTO_LEN_SIZE + (size_t)dt_proto_rd32(c->in);
            if (total <= c->in_len || total > DT_PROTO_LEN_SIZE + s->lim.max_frame)
                total = 0;
        }
        if (total > s->o.max_input_buffered && total > READ_BUF_SIZE) {
            /* Cannot happen: conn_process refuses such a frame before anything reads more. */
            SRV_WARN(s, "store: %s: a %zu-byte request over max_input_buffered; disconnecting",
                     c->peer, total);
            *buf = uv_buf_init(NULL, 0);
            return;
        }
        if (total > READ_BUF_SIZE && !c->blocked && !c->throttled) {
            /* A large frame: a buffer of exactly its size, charged against the budget.
             * (conn_process already refused one larger than the whole budget.) */
            want = total;
            if (c->in_cap < total &&
                (s->paused.head || s->in_charged - c->in_charged + total >
                                       s->o.max_input_buffered)) {
                budget_pause(c, total);
                c->nobuf = NOBUF_PAUSE;
                *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS and stops reading */
                return;
            }
        } else if (c->in_len >= READ_BUF_SIZE) {
            /* Pipelined input behind a wait (or held while throttled): enough is buffered. */
            c->nobuf = NOBUF_FULL;
            *buf = uv_buf_init(NULL, 0);
            return;
        }
    }
    if (in_reserve(c, want) < 0) {
        *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS */
        return;
    }
    *buf = uv_buf_init((char *)c->in + c->in_len, (unsigned)DT_MIN(c->in_cap - c->in_len,
                                                                    (size_t)UINT32_MAX));
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn *c = st->data;
    dt_store_server *s = c->srv;
    if (nread == UV_ENOBUFS && c->nobuf != NOBUF_OOM && !c->closing) {
        /* Paused for the input budget (budget_resume restarts it), or blocked with enough
         * pipelined input (run_ready restarts it): stop reading, keep the connection. */
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
        c->nobuf = NOBUF_OOM;
        return;
    }
    if (nread < 0) {
        if (nread == UV_ENOBUFS)
            SRV_WARN(s, "store: out of memory buffering input from %s; disconnecting it",
                     c->peer);
        else if (nread != UV_EOF)
            DT_DEBUG("store: reading from %s: %s", c->peer, uv_strerror((int)nread));
        if (c->in_len && !c->close_after_flush)
            SRV_WARN(s, "store: %s disconnected in the middle of a frame (%zu bytes)", c->peer,
                     c->in_len);
        else if (c->state == ST_AUTH && !c->close_after_flush)
            SRV_WARN(s, "store: %s closed the connection before authenticating (a client "
                     "without the store's token? it needs DTRAIN_STORE_TOKEN)", c->peer);
        else if (c->state == ST_HELLO)
            DT_DEBUG("store: %s closed the connection before the handshake", c->peer);
        conn_close(c);
        run_ready(s);
        return;
    }
    if (nread == 0 || c->closing)
        return;
    c->last_rx = uv_now(&s->loop);
    if (c->close_after_flush) /* discard input after a fatal error */
        return;
    if (buf->base == (char *)s->rbuf) {
        size_t used = 0;
        if (c->in_len == 0)
            used = conn_process(c, s->rbuf, (size_t)nread);
        if (!c->closing && !c->close_after_flush && used < (size_t)nread) {
            size_t rest = (size_t)nread - used;
            if (in_reserve(c, c->in_len + rest) < 0) {
                conn_close(c);
                run_ready(s);
                return;
            }
            memcpy(c->in + c->in_len, s->rbuf + used, rest);
            c->in_len += rest;
        }
    } else {
        c->in_len += (size_t)nread;
        conn_drain_input(c);
    }
    conn_flush(c);
    if (!c->closing && c->blocked && c->in_len >= BLOCKED_INPUT_MAX && c->reading) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->reading = 0;
    }
    run_ready(s);
}

static void conn_read_start(conn *c)
{
    if (c->plink.in || c->reading)
        return; /* budget_resume starts it */
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) == 0)
        c->reading = 1;
    else
        conn_close(c);
}

static void on_conn_closed(uv_handle_t *h)
{
    conn *c = h->data;
    if (--c->close_refs > 0)
        return;
    free(c->in);
    free(c->wkeys);
    dt_proto_buf_free(&c->out);
    free(c);
}

static void conn_close(conn *c)
{
    dt_store_server *s = c->srv;
    if (c->closing)
        return;
    c->closing = 1;
    wait_unlink(s, c);
    unauth_unlink(s, c);
    c->blocked = 0;
    budget_unqueue(s, c);
    charge_set(c, 0); /* the buffer goes with the handles; its budget goes now */
    uv_timer_stop(&c->timer);
    uv_timer_stop(&c->iotimer);
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    c->close_refs = 3;
    uv_close((uv_handle_t *)&c->timer, on_conn_closed);
    uv_close((uv_handle_t *)&c->iotimer, on_conn_closed);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void peer_name(uv_tcp_t *t, char *out, size_t n)
{
    struct sockaddr_storage ss;
    int len = sizeof ss;
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(t, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof ip);
            port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        }
    }
    snprintf(out, n, "%s:%d", ip, port);
}

static void on_full_closed(uv_handle_t *h) { free(h); }

static const char *stage_name(int state)
{
    return state == ST_HELLO ? "the handshake" : "authenticating";
}

/* A connection still in the handshake or AUTH when its time is up holds a slot for nothing. */
static void on_handshake_timeout(uv_timer_t *t)
{
    conn *c = t->data;
    dt_store_server *s = c->srv;
    if (c->closing || c->state == ST_READY)
        return;
    SRV_WARN(s, "store: %s did not finish %s within %d ms (handshake_timeout_ms); closing it",
             c->peer, stage_name(c->state), s->o.handshake_timeout_ms);
    conn_close(c);
    run_ready(s);
}

static void on_connection(uv_stream_t *ls, int status)
{
    dt_store_server *s = ls->data;
    if (status < 0) {
        /* EMFILE/ENFILE: libuv has already done the reserve-descriptor trick (uv__server_io
         * keeps loop->emfile_fd open, and on EMFILE closes it, accepts and closes what waits,
         * and reopens it), so the clients got an EOF rather than hanging in the backlog. The
         * limits below keep the store's own connections from getting here; say it once per
         * burst (the first failure, then a count every 10 s while they go on). */
        s->accept_errs++;
        double now = dt_now_s();
        if (now - s->accept_log_at >= 10) {
            DT_WARN("store: accepting connections fails: %s (%llu time%s; %zu connections open, "
                    "%zu of them unauthenticated): the process is out of file descriptors "
                    "(ulimit -n)",
                    uv_strerror(status),
                    (unsigned long long)(s->accept_errs - s->accept_errs_logged),
                    s->accept_errs - s->accept_errs_logged == 1 ? "" : "s", s->nconns,
                    s->unauth.n);
            s->accept_log_at = now;
            s->accept_errs_logged = s->accept_errs;
        }
        return;
    }
    uint8_t hello[DT_PROTO_HELLO_SIZE];
    if (s->unauth.n >= s->max_unauth && s->unauth.head &&
        uv_now(&s->loop) - s->unauth.head->accepted_at >= EVICT_GRACE_MS) {
        /* A flood of connections that never authenticate must not lock out the clients that
         * do: the oldest unauthenticated one makes room (a real client completes its handshake
         * in a round trip, so it is never the oldest for long). One still within its first
         * EVICT_GRACE_MS is a handshake in flight, not a flood: it is kept, and the newcomer
         * counts against max_connections like any other. */
        conn *old = s->unauth.head;
        s->evicted++;
        double now = dt_now_s();
        if (now - s->evict_log_at >= 10) {
            DT_WARN("store: %zu connections have not authenticated (limit %zu): closing the "
                    "oldest for newer ones (%llu so far; %s was the last) - is something "
                    "flooding the store's port?",
                    s->unauth.n, s->max_unauth,
                    (unsigned long long)(s->evicted - s->evicted_logged), old->peer);
            s->evict_log_at = now;
            s->evicted_logged = s->evicted;
        }
        conn_close(old);
    }
    if (s->nconns >= s->max_conns) {
        /* Accept, say why in the hello, and close: the client reports the limit. */
        uv_tcp_t *t = malloc(sizeof *t);
        if (!t || uv_tcp_init(&s->loop, t) < 0) {
            free(t);
            return;
        }
        if (uv_accept(ls, (uv_stream_t *)t) == 0) {
            dt_proto_hello_encode(hello, DT_PROTO_VERSION, DT_PROTO_HELLO_FULL);
            uv_buf_t b = uv_buf_init((char *)hello, sizeof hello);
            uv_try_write((uv_stream_t *)t, &b, 1);
            SRV_WARN(s, "store: refused a connection: %zu open, limit max_connections = %zu",
                     s->nconns, s->max_conns);
        }
        uv_close((uv_handle_t *)t, on_full_closed);
        return;
    }
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return;
    c->srv = s;
    c->accepted_at = uv_now(&s->loop);
    uv_tcp_init(&s->loop, &c->tcp);
    uv_timer_init(&s->loop, &c->timer);
    uv_timer_init(&s->loop, &c->iotimer);
    c->tcp.data = c;
    c->timer.data = c;
    c->iotimer.data = c;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    if (uv_accept(ls, (uv_stream_t *)&c->tcp) < 0) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_tcp_keepalive(&c->tcp, 1, 60);
    peer_name(&c->tcp, c->peer, sizeof c->peer);
    DT_DEBUG("store: connection from %s (%zu open)", c->peer, s->nconns);
    c->state = ST_HELLO;
    queue_append(&s->unauth, c);
    uv_timer_start(&c->iotimer, on_handshake_timeout, (uint64_t)s->o.handshake_timeout_ms, 0);
    dt_proto_hello_encode(hello, DT_PROTO_VERSION, s->token ? DT_PROTO_HELLO_AUTH : 0);
    if (dt_proto_reserve(&c->out, sizeof hello) == 0) {
        memcpy(c->out.data, hello, sizeof hello);
        c->out.len = sizeof hello;
    }
    conn_flush(c);
    if (!c->closing)
        conn_read_start(c);
}

/* ------------------------------------------------------------------------------------------ */
/* Lifecycle                                                                                  */
/* ------------------------------------------------------------------------------------------ */

void dt_store_server_opts_default(dt_store_server_opts *o)
{
    memset(o, 0, sizeof *o);
    o->host = "0.0.0.0";
    o->port = 0;
    o->token = NULL;
    o->max_key_size = 4096;
    o->max_value_size = 64u << 20;
    o->max_keys_per_request = 65536;
    o->max_total_bytes = (size_t)1 << 30;
    o->max_connections = 65536;
    o->max_pending_output = 65u << 20;
    o->write_stall_ms = 10000;
    o->handshake_timeout_ms = 3000;
    o->max_input_buffered = (size_t)1 << 30;
    o->input_stall_ms = 10000;
}

static void on_stop(uv_async_t *a)
{
    dt_store_server *s = a->data;
    if (!uv_is_closing((uv_handle_t *)&s->listener))
        uv_close((uv_handle_t *)&s->listener, NULL);
    while (s->conns)
        conn_close(s->conns);
    uv_close((uv_handle_t *)&s->stop_async, NULL);
    uv_close((uv_handle_t *)&s->stats_async, NULL);
    uv_close((uv_handle_t *)&s->stall_timer, NULL);
}

/* On the loop thread: computes the snapshot and hands it to the waiting caller. */
static void on_stats(uv_async_t *a)
{
    dt_store_server *s = a->data;
    dt_store_server_stats st = {0};
    st.connections = (int64_t)s->nconns;
    st.keys = (int64_t)s->npresent;
    st.entries = (int64_t)s->nentries;
    st.bytes = (int64_t)s->bytes;
    for (conn *c = s->conns; c; c = c->next) {
        st.waiters += c->blocked;
        st.wait_timers += c->blocked && uv_is_active((uv_handle_t *)&c->timer);
        st.input_buffered += (int64_t)c->in_cap;
        st.output_pending += (int64_t)(c->out.len +
                                       uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp));
        st.throttled += c->throttled;
    }
    st.input_charged = (int64_t)s->in_charged;
    st.input_charged_peak = (int64_t)s->in_charged_peak;
    st.input_paused = (int64_t)s->paused.n;
    st.input_stall_cuts = (int64_t)s->input_stall_cuts;
    pthread_mutex_lock(&s->stats_mu);
    s->stats = st;
    s->stats_done = 1;
    pthread_cond_broadcast(&s->stats_cv);
    pthread_mutex_unlock(&s->stats_mu);
}

int dt_store_server_get_stats(dt_store_server *s, dt_store_server_stats *out)
{
    if (!s || !out || !s->thread_started)
        return -EINVAL;
    pthread_mutex_lock(&s->stats_call_mu);
    pthread_mutex_lock(&s->stats_mu);
    s->stats_done = 0;
    pthread_mutex_unlock(&s->stats_mu);
    uv_async_send(&s->stats_async);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    int rc = 0;
    pthread_mutex_lock(&s->stats_mu);
    while (!s->stats_done && rc == 0)
        rc = pthread_cond_timedwait(&s->stats_cv, &s->stats_mu, &until);
    if (s->stats_done) {
        *out = s->stats;
        rc = 0;
    } else {
        rc = -ETIMEDOUT;
    }
    pthread_mutex_unlock(&s->stats_mu);
    pthread_mutex_unlock(&s->stats_call_mu);
    return rc;
}

static void *loop_main(void *arg)
{
    dt_store_server *s = arg;
    uv_run(&s->loop, UV_RUN_DEFAULT);
    return NULL;
}

static void free_table(dt_store_server *s)
{
    for (size_t i = 0; i < s->nbuckets; i++) {
        entry *e = s->buckets[i];
        while (e) {
            entry *next = e->next;
            free(e->val);
            free(e);
            e = next;
        }
    }
    free(s->buckets);
    s->buckets = NULL;
    s->nbuckets = 0;
}

static int bind_listener(dt_store_server *s, dt_err *err)
{
    struct addrinfo hints = {0}, *res = NULL;
    char port[16];
    snprintf(port, sizeof port, "%d", s->o.port);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int g = getaddrinfo(s->host, port, &hints, &res);
    if (g != 0)
        return dt_err_set(err, -EINVAL, "store server: cannot resolve bind address \"%s\": %s",
                          s->host, gai_strerror(g));
    int rc = -EADDRNOTAVAIL;
    for (struct addrinfo *ai = res; ai; ai = ai->ai_next) {
        rc = uv_tcp_bind(&s->listener, ai->ai_addr, 0);
        if (rc == 0)
            rc = uv_listen((uv_stream_t *)&s->listener, 8192, on_connection);
        if (rc == 0)
            break;
    }
    freeaddrinfo(res);
    if (rc < 0)
        return dt_err_set(err, rc, "store server: cannot listen on %s:%d: %s%s", s->host,
                          s->o.port, uv_strerror(rc),
                          rc == UV_EADDRINUSE ? " (another process holds the port; pick another "
                                                "or use port 0)" : "");
    struct sockaddr_storage ss;
    int len = sizeof ss;
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&ss, &len);
    s->port = ss.ss_family == AF_INET6 ? ntohs(((struct sockaddr_in6 *)&ss)->sin6_port)
                                       : ntohs(((struct sockaddr_in *)&ss)->sin_port);
    return 0;
}

/* Thousands of agents mean thousands of descriptors, and many systems start processes with a
 * soft RLIMIT_NOFILE of 1024: raise the soft limit toward what max_connections needs (never
 * above the hard limit, which only root can raise), and say so when it stays short. */
static void raise_nofile(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY ||
        rl.rlim_cur >= (rlim_t)want)
        return;
    rlim_t old = rl.rlim_cur;
    rl.rlim_cur = (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)want) ? (rlim_t)want
                                                                                 : rl.rlim_max;
    if (rl.rlim_cur > old && setrlimit(RLIMIT_NOFILE, &rl) == 0)
        DT_DEBUG("store: raised RLIMIT_NOFILE from %llu to %llu", (unsigned long long)old,
                 (unsigned long long)rl.rlim_cur);
    else
        rl.rlim_cur = old;
    if (rl.rlim_cur < (rlim_t)DT_MIN(want, (size_t)8192))
        DT_WARN("store: the open-file limit (%llu) caps the store at fewer clients than "
                "max_connections; raise it (ulimit -n) for large jobs",
                (unsigned long long)rl.rlim_cur);
}

/* Descriptors kept out of max_connections for everything else in the process (the loop's own,
 * the listener, a connection being refused, and, inside an agent, its workers' pipes and logs):
 * 32 plus an eighth of the limit, at most FD_RESERVE_MAX. */
#define FD_RESERVE_MAX 1280

/* max_connections, or fewer when the open-file limit would run out first: a store that runs
 * out of descriptors cannot even accept the client that would tell it to stop waiting. */
static size_t conns_allowed(size_t want)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return want;
    rlim_t reserve = DT_MIN((rlim_t)FD_RESERVE_MAX, 32 + rl.rlim_cur / 8);
    size_t allowed = rl.rlim_cur > reserve ? (size_t)(rl.rlim_cur - reserve) : 1;
    if (allowed >= want)
        return want;
    /* Debug only: raise_nofile has warned already when the limit is small enough to matter. */
    DT_DEBUG("store: at most %zu connections (the open-file limit is %llu)", allowed,
             (unsigned long long)rl.rlim_cur);
    return allowed;
}

int dt_store_server_start(dt_store_server **out, const dt_store_server_opts *opts, dt_err *err)
{
    dt_store_server *s = calloc(1, sizeof *s);
    int rc, loop_ok = 0;
    if (!s)
        return dt_err_set(err, -ENOMEM, "store server: out of memory");
    s->unauth.link = offsetof(conn, ulink);
    s->paused.link = offsetof(conn, plink);
    pthread_mutex_init(&s->stats_call_mu, NULL);
    pthread_mutex_init(&s->stats_mu, NULL);
    pthread_cond_init(&s->stats_cv, NULL);
    if (opts)
        s->o = *opts;
    else
        dt_store_server_opts_default(&s->o);
    if (!s->o.max_connections || !s->o.max_pending_output || !s->o.max_keys_per_request) {
        rc = dt_err_set(err, -EINVAL, "store server: max_connections, max_pending_output and "
                                      "max_keys_per_request must be > 0");
        goto fail;
    }
    if (s->o.write_stall_ms <= 0)
        s->o.write_stall_ms = 10000;
    if (s->o.handshake_timeout_ms <= 0)
        s->o.handshake_timeout_ms = 3000;
    if (!s->o.max_input_buffered)
        s->o.max_input_buffered = (size_t)1 << 30;
    if (s->o.input_stall_ms <= 0)
        s->o.input_stall_ms = 10000;
    /* One item is at most 4 GiB - 1 on the wire, and a SET frame carries the key too. */
    if ((uint64_t)s->o.max_value_size + s->o.max_key_size + 2 * DT_PROTO_ITEM_OVERHEAD +
            DT_PROTO_HDR_SIZE > UINT32_MAX) {
        rc = dt_err_set(err, -EINVAL, "store server: max_value_size (%zu) + max_key_size (%zu) "
                        "is over what one frame of the wire format carries (4 GiB); lower "
                        "max_value_size (dtrain store --max-value-size)",
                        s->o.max_value_size, s->o.max_key_size);
        goto fail;
    }
    if (s->o.max_pending_output < s->o.max_value_size + REPLY_OVERHEAD) {
        rc = dt_err_set(err, -EINVAL, "store server: max_pending_output (%zu) must be at least "
                        "max_value_size (%zu) + 64 KiB, or a reply carrying one value could "
                        "never be sent; raise max_pending_output or lower max_value_size "
                        "(dtrain store --max-pending-output, --max-value-size)",
                        s->o.max_pending_output, s->o.max_value_size);
        goto fail;
    }
    if (s->o.port < 0 || s->o.port > 65535) {
        rc = dt_err_set(err, -EINVAL, "store server: port %d is out of range (0..65535)",
                        s->o.port);
        goto fail;
    }
    s->host = strdup(s->o.host && *s->o.host ? s->o.host : "0.0.0.0");
    if (s->o.token && *s->o.token) {
        s->token = strdup(s->o.token);
        s->token_len = s->token ? strlen(s->token) : 0;
    }
    if (!s->host || (s->o.token && *s->o.token && !s->token)) {
        rc = dt_err_set(err, -ENOMEM, "store server: out of memory");
        goto fail;
    }
    s->o.host = s->host;
    s->o.token = s->token;
    s->lim.max_key = s->o.max_key_size;
    s->lim.max_value = s->o.max_value_size;
    s->lim.max_items = s->o.max_keys_per_request;
    s->lim.max_frame =
        dt_proto_max_frame(s->o.max_key_size, s->o.max_value_size, s->o.max_keys_per_request);
    /* AUTH: one value, the token (a wrong token may be longer than ours: allow 4 KiB more). */
    s->lim_auth.max_key = 0;
    s->lim_auth.max_value = s->token_len + 4096;
    s->lim_auth.max_items = 1;
    s->lim_auth.max_frame = DT_PROTO_HDR_SIZE + DT_PROTO_ITEM_OVERHEAD + s->lim_auth.max_value;
    raise_nofile(DT_MIN(s->o.max_connections, (size_t)1 << 20) + FD_RESERVE_MAX);
    s->max_conns = conns_allowed(s->o.max_connections);
    s->max_unauth = s->o.max_unauthenticated ? DT_MIN(s->o.max_unauthenticated, s->max_conns)
                                             : DT_MAX(s->max_conns / 2, (size_t)1);
    if ((rc = uv_loop_init(&s->loop)) < 0) {
        dt_err_set(err, rc, "store server: uv_loop_init: %s", uv_strerror(rc));
        goto fail;
    }
    loop_ok = 1;
    uv_tcp_init(&s->loop, &s->listener);
    s->listener.data = s;
    uv_async_init(&s->loop, &s->stop_async, on_stop);
    s->stop_async.data = s;
    uv_async_init(&s->loop, &s->stats_async, on_stats);
    s->stats_async.data = s;
    uv_timer_init(&s->loop, &s->stall_timer);
    s->stall_timer.data = s;
    if ((rc = bind_listener(s, err)) < 0)
        goto fail;

    /* The loop thread takes no signals: SIGPIPE from a write to a vanished client stays
     * pending there instead of killing the process, and SIGINT/SIGTERM go to the embedder. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_create(&s->thread, NULL, loop_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        rc = dt_err_errno(err, rc, "store server: cannot start its thread");
        goto fail;
    }
    s->thread_started = 1;
    if (s->o.quiet)
        DT_DEBUG("store: listening on %s:%d%s", s->host, s->port,
                 s->token ? " (token required)" : "");
    else
        DT_INFO("store: listening on %s:%d%s", s->host, s->port,
                s->token ? " (token required)" : "");
    *out = s;
    return 0;
fail:
    if (loop_ok) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        uv_close((uv_handle_t *)&s->stop_async, NULL);
        uv_close((uv_handle_t *)&s->stats_async, NULL);
        uv_close((uv_handle_t *)&s->stall_timer, NULL);
        uv_run(&s->loop, UV_RUN_DEFAULT);
        uv_loop_close(&s->loop);
    }
    free(s->host);
    free(s->token);
    pthread_cond_destroy(&s->stats_cv);
    pthread_mutex_destroy(&s->stats_mu);
    pthread_mutex_destroy(&s->stats_call_mu);
    free(s);
    return rc;
}

int dt_store_server_port(const dt_store_server *s) { return s ? s->port : -1; }

void dt_store_server_stop(dt_store_server *s)
{
    if (!s)
        return;
    if (s->thread_started) {
        uv_async_send(&s->stop_async);
        pthread_join(s->thread, NULL);
    }
    int rc = uv_loop_close(&s->loop);
    if (rc < 0)
        DT_WARN("store: closing the event loop: %s", uv_strerror(rc));
    free_table(s);
    free(s->scratch);
    free(s->host);
    free(s->token);
    pthread_cond_destroy(&s->stats_cv);
    pthread_mutex_destroy(&s->stats_mu);
    pthread_mutex_destroy(&s->stats_call_mu);
    free(s);
}
