/* test_store.c - the store: protocol parser, every op with its timeouts and wake-ups, races,
 * the token, each limit, misbehaving clients, and the standalone `dtrain store` binary.
 *
 * Every test runs a real server on 127.0.0.1 with an ephemeral port. Misbehaving clients are
 * raw sockets that speak (or break) the wire protocol by hand. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "rendezvous/store_internal.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* Helpers                                                                                    */
/* ------------------------------------------------------------------------------------------ */

static dt_store_server *start_server(dt_store_server_opts *o)
{
    dt_store_server_opts def;
    dt_err err_ = {0}, *err = &err_;
    dt_store_server *srv = NULL;
    if (!o) {
        dt_store_server_opts_default(&def);
        o = &def;
    }
    o->host = "127.0.0.1";
    o->port = 0;
    DT_REQUIRE_OK(dt_store_server_start(&srv, o, err), err);
    DT_REQUIRE(dt_store_server_port(srv) > 0);
    return srv;
}

static dt_store *connect_to(dt_store_server *srv, const char *token)
{
    dt_store_opts o;
    dt_store_opts_default(&o);
    o.connect_timeout_ms = 5000;
    o.timeout_ms = 10000;
    o.token = token;
    dt_store *s = NULL;
    dt_err err_ = {0}, *err = &err_;
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", dt_store_server_port(srv), &o, err), err);
    return s;
}

/* A raw TCP connection to the server (blocking, with a receive timeout). */
static int raw_connect(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    DT_REQUIRE(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    DT_REQUIRE(connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    struct timeval tv = {.tv_sec = 10};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

/* Raw connection past the handshake (reads the server hello, sends ours). Retries while the
 * server is at its connection limit (it may not have seen a previous close yet). */
static int raw_hello(int port)
{
    int fd;
    uint8_t h[DT_PROTO_HELLO_SIZE];
    uint16_t ver, flags;
    for (int attempt = 0;; attempt++) {
        fd = raw_connect(port);
        DT_REQUIRE(dt_read_all(fd, h, sizeof h) == 0);
        DT_REQUIRE(dt_proto_hello_decode(h, &ver, &flags) == 0);
        if (!(flags & DT_PROTO_HELLO_FULL) || attempt == 100)
            break;
        close(fd);
        dt_sleep_ms(20);
    }
    DT_REQUIRE(!(flags & DT_PROTO_HELLO_FULL));
    DT_CHECK_INT(ver, DT_PROTO_VERSION);
    dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    return fd;
}

/* Reads one reply frame on a raw connection: returns its status, or -1 on EOF/error. */
static int raw_reply(int fd, dt_proto_buf *b)
{
    uint8_t hdr[4];
    if (dt_read_all(fd, hdr, 4) != 0)
        return -1;
    uint32_t n = dt_proto_rd32(hdr);
    b->len = 0;
    if (dt_proto_reserve(b, 4 + (size_t)n) < 0)
        return -1;
    memcpy(b->data, hdr, 4);
    if (dt_read_all(fd, b->data + 4, n) != 0)
        return -1;
    b->len = 4 + n;
    dt_proto_limits lim = dt_proto_reply_limits();
    dt_proto_msg m;
    if (dt_proto_parse(b->data, b->len, &lim, 1, &m, NULL, NULL) <= 0)
        return -1;
    return m.code;
}

/* Waits (bounded) until reading fd gives EOF or a reset: the server closed it. */
static int raw_closed_by_server(int fd, int timeout_ms)
{
    char buf[65536];
    uint64_t end = dt_now_ns() + (uint64_t)timeout_ms * 1000000ull;
    while (dt_now_ns() < end) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
            return 1;
    }
    return 0;
}

static void check_alive_token(dt_store_server *srv, const char *token)
{
    dt_store *s = connect_to(srv, token);
    dt_err err_ = {0}, *err = &err_;
    DT_CHECK_INT(dt_store_set(s, "alive", "yes", 3, err), 0);
    void *v = NULL;
    size_t n = 0;
    DT_CHECK_INT(dt_store_get(s, "alive", &v, &n, 0, err), 0);
    DT_CHECK(n == 3 && v && !memcmp(v, "yes", 3));
    free(v);
    dt_store_free(s);
}

static void check_alive(dt_store_server *srv) { check_alive_token(srv, NULL); }

static dt_store_server_stats stats_of(dt_store_server *srv)
{
    dt_store_server_stats st;
    DT_REQUIRE(dt_store_server_get_stats(srv, &st) == 0);
    return st;
}

/* Waits (bounded: the server sees closes asynchronously) until the server holds no parked
 * request, no armed wait timer, and exactly `entries` table entries. */
static bool stats_settle(dt_store_server *srv, int64_t entries, dt_store_server_stats *st)
{
    for (int i = 0; i < 500; i++) {
        *st = stats_of(srv);
        if (st->waiters == 0 && st->wait_timers == 0 && st->entries == entries)
            return true;
        dt_sleep_ms(10);
    }
    return false;
}

/* Captures this process's stderr (where the embedded server logs) into a file. */
typedef struct log_capture {
    int saved;
    char path[4200];
} log_capture;

static void capture_start(log_capture *lc)
{
    snprintf(lc->path, sizeof lc->path, "%s/stderr.log", dt_test_tmpdir());
    fflush(stderr);
    lc->saved = dup(2);
    int fd = open(lc->path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    DT_REQUIRE(lc->saved >= 0 && fd >= 0);
    dup2(fd, 2);
    close(fd);
}

/* Waits (bounded) until the captured log holds needle; true when it does. */
static bool capture_wait(log_capture *lc, const char *needle)
{
    return dt_test_wait_text(lc->path, needle, 1, 5.0);
}

/* Restores stderr and echoes what was captured there. */
static void capture_stop(log_capture *lc)
{
    fflush(stderr);
    dup2(lc->saved, 2);
    close(lc->saved);
    char *text = dt_test_slurp(lc->path);
    if (text)
        fputs(text, stderr);
    free(text);
}

/* ------------------------------------------------------------------------------------------ */
/* Protocol parser                                                                            */
/* ------------------------------------------------------------------------------------------ */

static dt_proto_limits test_limits(void)
{
    dt_proto_limits l = {.max_frame = 4096, .max_key = 16, .max_value = 256, .max_items = 4};
    return l;
}

static void test_proto_roundtrip(void)
{
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_MULTI_SET, 77, -5, 2, 2);
    dt_proto_put_item2(&b, "pre/", 4, "a", 1);
    dt_proto_put_item(&b, "b", 1);
    dt_proto_put_item(&b, "xyz", 3);
    dt_proto_put_item(&b, "", 0);
    dt_proto_end(&b, st);
    DT_REQUIRE(!b.oom);
    dt_proto_limits l = test_limits();
    dt_proto_msg m;
    size_t need = 0;
    /* Every prefix is "need more"; the whole frame parses. */
    for (size_t i = 0; i < b.len; i++)
        DT_CHECK_INT(dt_proto_parse(b.data, i, &l, 0, &m, &need, NULL), 0);
    DT_CHECK_INT(need, b.len);
    DT_REQUIRE(dt_proto_parse(b.data, b.len, &l, 0, &m, NULL, NULL) == (ssize_t)b.len);
    DT_CHECK_INT(m.bad, DT_PROTO_OK);
    DT_CHECK_INT(m.code, DT_OP_MULTI_SET);
    DT_CHECK_INT(m.id, 77);
    DT_CHECK_INT(m.num, -5);
    const uint8_t *cur = m.keys;
    dt_proto_item it;
    DT_REQUIRE(dt_proto_next(&cur, m.end, &it) == 0);
    DT_CHECK(it.len == 5 && !memcmp(it.p, "pre/a", 5));
    cur = m.vals;
    DT_REQUIRE(dt_proto_next(&cur, m.end, &it) == 0);
    DT_CHECK(it.len == 3 && !memcmp(it.p, "xyz", 3));
    DT_REQUIRE(dt_proto_next(&cur, m.end, &it) == 0);
    DT_CHECK_INT(it.len, 0);
    DT_CHECK(cur == m.end);
    dt_proto_buf_free(&b);
}

static void check_bad(const dt_proto_buf *b, int want_bad)
{
    dt_proto_limits l = test_limits();
    dt_proto_msg m;
    ssize_t r = dt_proto_parse(b->data, b->len, &l, 0, &m, NULL, NULL);
    DT_CHECK_INT(r, (ssize_t)b->len);
    if (r > 0)
        DT_CHECK_INT(m.bad, want_bad);
}

static void test_proto_rejects(void)
{
    dt_proto_limits l = test_limits();
    dt_proto_msg m;
    const char *why = NULL;
    uint8_t huge[8] = {0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4};
    DT_CHECK_INT(dt_proto_parse(huge, sizeof huge, &l, 0, &m, NULL, &why), -E2BIG);
    DT_CHECK(why != NULL);
    uint8_t tiny[8] = {0, 0, 0, 3, 1, 2, 3, 4};
    DT_CHECK_INT(dt_proto_parse(tiny, sizeof tiny, &l, 0, &m, NULL, &why), -EPROTO);

    dt_proto_buf b = {0};
    size_t st;
    /* Unknown op. */
    st = dt_proto_begin(&b, 99, 1, 0, 0, 0);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_EINVAL);
    /* Wrong counts for SET. */
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_SET, 1, 0, 1, 0);
    dt_proto_put_item(&b, "k", 1);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_EINVAL);
    /* Key too long, value too long, NUL in a key, too many keys. */
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_GET, 1, 0, 1, 0);
    dt_proto_put_item(&b, "0123456789abcdefg", 17);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_E2BIG);
    b.len = 0;
    char big[300] = {0};
    st = dt_proto_begin(&b, DT_OP_SET, 1, 0, 1, 1);
    dt_proto_put_item(&b, "k", 1);
    dt_proto_put_item(&b, big, sizeof big);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_E2BIG);
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_GET, 1, 0, 1, 0);
    dt_proto_put_item(&b, "a\0b", 3);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_EINVAL);
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_CHECK, 1, 0, 5, 0);
    for (int i = 0; i < 5; i++)
        dt_proto_put_item(&b, "k", 1);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_E2BIG);
    /* Counts larger than the bytes present; an item overrunning the frame; trailing bytes. */
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_CHECK, 1, 0, 0xffffffffu, 0);
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_EPROTO);
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_GET, 1, 0, 1, 0);
    dt_proto_put_item(&b, "key", 3);
    dt_proto_end(&b, st);
    dt_proto_wr32(b.data + 4 + DT_PROTO_HDR_SIZE, 1000); /* the key claims 1000 bytes */
    check_bad(&b, DT_PROTO_EPROTO);
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_PING, 1, 0, 0, 0);
    dt_proto_put_item(&b, "x", 1); /* an item nobody counted */
    dt_proto_end(&b, st);
    check_bad(&b, DT_PROTO_EPROTO);
    dt_proto_buf_free(&b);

    uint8_t h[8];
    uint16_t v, f;
    dt_proto_hello_encode(h, 7, 3);
    DT_CHECK(dt_proto_hello_decode(h, &v, &f) == 0 && v == 7 && f == 3);
    h[0] ^= 1;
    DT_CHECK_INT(dt_proto_hello_decode(h, &v, &f), -EPROTO);
    DT_CHECK_INT(dt_proto_status_to_errno(DT_PROTO_ETIMEDOUT), -ETIMEDOUT);
    DT_CHECK_INT(dt_proto_status_from_errno(-EACCES), DT_PROTO_EACCES);
}

/* ------------------------------------------------------------------------------------------ */
/* Operations                                                                                 */
/* ------------------------------------------------------------------------------------------ */

static void test_ops(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    void *v = NULL;
    size_t n = 0;
    int64_t r = 0;

    /* set / get (binary values, NUL appended) */
    DT_REQUIRE_OK(dt_store_set(s, "k1", "a\0b", 3, err), err);
    DT_REQUIRE_OK(dt_store_get(s, "k1", &v, &n, 0, err), err);
    DT_CHECK(n == 3 && !memcmp(v, "a\0b", 3) && ((char *)v)[3] == '\0');
    free(v);
    DT_REQUIRE_OK(dt_store_set(s, "empty", "", 0, err), err);
    DT_REQUIRE_OK(dt_store_get(s, "empty", &v, &n, 0, err), err);
    DT_CHECK_INT(n, 0);
    free(v);
    /* get of a missing key without waiting */
    DT_CHECK_INT(dt_store_get(s, "missing", &v, &n, 0, err), -ENOENT);
    DT_CHECK_CONTAINS(err->msg, "missing");

    /* add */
    DT_REQUIRE_OK(dt_store_add(s, "ctr", 5, &r, err), err);
    DT_CHECK_INT(r, 5);
    DT_REQUIRE_OK(dt_store_add(s, "ctr", -7, &r, err), err);
    DT_CHECK_INT(r, -2);
    DT_REQUIRE_OK(dt_store_get(s, "ctr", &v, &n, 0, err), err);
    DT_CHECK_STR((char *)v, "-2");
    free(v);
    DT_CHECK_INT(dt_store_add(s, "k1", 1, &r, err), -EINVAL); /* not a number */
    DT_REQUIRE_OK(dt_store_set(s, "big", "9223372036854775807", 19, err), err);
    DT_CHECK_INT(dt_store_add(s, "big", 1, &r, err), -EINVAL); /* overflow */

    /* cas */
    DT_REQUIRE_OK(dt_store_cas(s, "c", "", 0, "one", 3, &v, &n, err), err);
    DT_CHECK(n == 3 && !memcmp(v, "one", 3));
    free(v);
    DT_REQUIRE_OK(dt_store_cas(s, "c", "zzz", 3, "two", 3, &v, &n, err), err);
    DT_CHECK(n == 3 && !memcmp(v, "one", 3)); /* unchanged */
    free(v);
    DT_REQUIRE_OK(dt_store_cas(s, "c", "one", 3, "two", 3, &v, &n, err), err);
    DT_CHECK(n == 3 && !memcmp(v, "two", 3));
    free(v);
    DT_REQUIRE_OK(dt_store_cas(s, "absent", "x", 1, "y", 1, &v, &n, err), err);
    DT_CHECK(n == 1 && !memcmp(v, "x", 1)); /* absent, expected non-empty: expected echoed */
    free(v);
    DT_REQUIRE_OK(dt_store_cas(s, "c", "two", 3, "three", 5, NULL, NULL, err), err);
    /* cas that says whether it swapped (the same value twice: only the first one swaps) */
    int sw = -1;
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "cs", "", 0, "a", 1, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 1);
    DT_CHECK(n == 1 && !memcmp(v, "a", 1));
    free(v);
    sw = -1;
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "cs", "", 0, "a", 1, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 0); /* current == desired, yet this call did not swap */
    DT_CHECK(n == 1 && !memcmp(v, "a", 1));
    free(v);
    sw = -1;
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "cs", "a", 1, "b", 1, &sw, NULL, NULL, err), err);
    DT_CHECK_INT(sw, 1);
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "cs", "a", 1, "c", 1, NULL, NULL, NULL, err), err);
    DT_REQUIRE_OK(dt_store_delete(s, "cs", NULL, err), err);

    /* check */
    const char *ks[] = {"k1", "ctr", "c"};
    int all = 0;
    DT_REQUIRE_OK(dt_store_check(s, ks, 3, &all, err), err);
    DT_CHECK_INT(all, 1);
    const char *ks2[] = {"k1", "nope"};
    DT_REQUIRE_OK(dt_store_check(s, ks2, 2, &all, err), err);
    DT_CHECK_INT(all, 0);

    /* wait on present keys returns at once; on a missing key with 0 it times out */
    DT_REQUIRE_OK(dt_store_wait(s, ks, 3, 1000, err), err);
    DT_CHECK_INT(dt_store_wait(s, ks2, 2, 0, err), -ETIMEDOUT);

    /* delete, num_keys */
    int64_t nk = 0;
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 5); /* k1 empty ctr big c */
    int del = 0;
    DT_REQUIRE_OK(dt_store_delete(s, "k1", &del, err), err);
    DT_CHECK_INT(del, 1);
    DT_REQUIRE_OK(dt_store_delete(s, "k1", &del, err), err);
    DT_CHECK_INT(del, 0);
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 4);

    /* append */
    DT_REQUIRE_OK(dt_store_append(s, "log", "ab", 2, err), err);
    DT_REQUIRE_OK(dt_store_append(s, "log", "cd", 2, err), err);
    DT_REQUIRE_OK(dt_store_get(s, "log", &v, &n, 0, err), err);
    DT_CHECK_STR((char *)v, "abcd");
    free(v);

    /* multi_set / multi_get */
    const char *mk[] = {"m0", "m1", "m2"};
    const void *mv[] = {"zero", "", "two"};
    size_t ml[] = {4, 0, 3};
    DT_REQUIRE_OK(dt_store_multi_set(s, mk, mv, ml, 3, err), err);
    void *out[3] = {0};
    size_t ol[3] = {0};
    DT_REQUIRE_OK(dt_store_multi_get(s, mk, 3, out, ol, 0, err), err);
    DT_CHECK(ol[0] == 4 && !memcmp(out[0], "zero", 4));
    DT_CHECK_INT(ol[1], 0);
    DT_CHECK_STR((char *)out[2], "two");
    for (int i = 0; i < 3; i++)
        free(out[i]);
    const char *mk2[] = {"m0", "nothere"};
    DT_CHECK_INT(dt_store_multi_get(s, mk2, 2, out, ol, 0, err), -ENOENT);
    DT_REQUIRE_OK(dt_store_multi_get(s, mk, 0, out, ol, 0, err), err); /* zero keys */

    /* ping */
    int64_t rtt = -1;
    DT_REQUIRE_OK(dt_store_ping(s, &rtt, err), err);
    DT_CHECK(rtt >= 0);

    dt_store_free(s);
    dt_store_server_stop(srv);
}

static void test_prefixed(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_store *a = NULL, *ab = NULL;
    dt_err err_ = {0}, *err = &err_;
    DT_REQUIRE_OK(dt_store_prefixed(&a, s, "a/", err), err);
    DT_REQUIRE_OK(dt_store_prefixed(&ab, a, "b/", err), err);
    DT_REQUIRE_OK(dt_store_set(ab, "k", "v", 1, err), err);
    void *v = NULL;
    size_t n;
    DT_REQUIRE_OK(dt_store_get(s, "a/b/k", &v, &n, 0, err), err);
    DT_CHECK_STR((char *)v, "v");
    free(v);
    DT_REQUIRE_OK(dt_store_get(a, "b/k", &v, &n, 0, err), err);
    free(v);
    DT_CHECK_INT(dt_store_get(a, "k", &v, &n, 0, err), -ENOENT);
    DT_CHECK_CONTAINS(err->msg, "a/k"); /* the message names the full key */
    int64_t r;
    DT_REQUIRE_OK(dt_store_add(ab, "n", 2, &r, err), err);
    const char *ks[] = {"k", "n"};
    int all = 0;
    DT_REQUIRE_OK(dt_store_check(ab, ks, 2, &all, err), err);
    DT_CHECK_INT(all, 1);
    int64_t nk = 0;
    DT_REQUIRE_OK(dt_store_num_keys(ab, &nk, err), err);
    DT_CHECK_INT(nk, 2);
    dt_store_free(ab);
    dt_store_free(a);
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err); /* base still fine after views go */
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Waiting                                                                                    */
/* ------------------------------------------------------------------------------------------ */

typedef struct delayed {
    int port;
    int delay_ms;
    int op; /* 0 set, 1 add, 2 append, 3 multi_set, 4 cas */
    const char *key;
} delayed;

static void *delayed_writer(void *arg)
{
    delayed *d = arg;
    dt_store *s = NULL;
    dt_err err_ = {0}, *err = &err_;
    if (dt_store_connect(&s, "127.0.0.1", d->port, NULL, err) < 0)
        return NULL;
    dt_sleep_ms(d->delay_ms);
    int64_t r;
    const char *k[] = {d->key};
    const void *v[] = {"x"};
    size_t l[] = {1};
    switch (d->op) {
    case 0: dt_store_set(s, d->key, "x", 1, err); break;
    case 1: dt_store_add(s, d->key, 1, &r, err); break;
    case 2: dt_store_append(s, d->key, "x", 1, err); break;
    case 3: dt_store_multi_set(s, k, v, l, 1, err); break;
    case 4: dt_store_cas(s, d->key, "", 0, "x", 1, NULL, NULL, err); break;
    }
    dt_store_free(s);
    return NULL;
}

static void test_wait_wakeups(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    const char *names[] = {"set", "add", "append", "multi_set", "cas"};
    for (int op = 0; op < 5; op++) {
        char key[32];
        snprintf(key, sizeof key, "wake-%s", names[op]);
        delayed d = {dt_store_server_port(srv), 100, op, key};
        pthread_t t;
        pthread_create(&t, NULL, delayed_writer, &d);
        void *v = NULL;
        size_t n = 0;
        uint64_t t0 = dt_now_ns();
        int rc = dt_store_get(s, key, &v, &n, 10000, err);
        DT_CHECK_MSG(rc == 0, "get woken by %s: %s", names[op], err->msg);
        DT_CHECK((dt_now_ns() - t0) / 1000000 >= 50); /* it did wait for the writer */
        free(v);
        pthread_join(t, NULL);
    }
    /* wait() on several keys, set one by one from another thread */
    delayed d1 = {dt_store_server_port(srv), 50, 0, "w1"};
    delayed d2 = {dt_store_server_port(srv), 150, 0, "w2"};
    pthread_t t1, t2;
    pthread_create(&t1, NULL, delayed_writer, &d1);
    pthread_create(&t2, NULL, delayed_writer, &d2);
    const char *ks[] = {"w2", "w1", "wake-set"};
    DT_CHECK_INT(dt_store_wait(s, ks, 3, 10000, err), 0);
    pthread_join(t1, NULL);
    pthread_join(t2, NULL);
    /* multi_get waits too */
    delayed d3 = {dt_store_server_port(srv), 50, 0, "mg"};
    pthread_create(&t1, NULL, delayed_writer, &d3);
    const char *mk[] = {"w1", "mg"};
    void *vals[2];
    size_t lens[2];
    DT_CHECK_INT(dt_store_multi_get(s, mk, 2, vals, lens, 10000, err), 0);
    if (err->code == 0) {
        free(vals[0]);
        free(vals[1]);
    }
    pthread_join(t1, NULL);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

static void test_wait_timeouts(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    void *v = NULL;
    size_t n;
    uint64_t t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_get(s, "never", &v, &n, 200, err), -ETIMEDOUT);
    double el = (double)(dt_now_ns() - t0) * 1e-6;
    DT_CHECK_MSG(el >= 190, "get returned after %.0f ms, before its 200 ms timeout", el);
    DT_CHECK_CONTAINS(err->msg, "never");
    const char *ks[] = {"never", "nor"};
    DT_CHECK_INT(dt_store_wait(s, ks, 2, 100, err), -ETIMEDOUT);
    void *vals[2];
    size_t lens[2];
    DT_CHECK_INT(dt_store_multi_get(s, ks, 2, vals, lens, 100, err), -ETIMEDOUT);
    /* The connection is still good, and the timed-out waits left no key behind: no
     * placeholder entry, no parked request, no timer. */
    int64_t nk = -1;
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 0);
    dt_store_server_stats ss;
    DT_CHECK_MSG(stats_settle(srv, 0, &ss), "after timed-out waits: %lld entries, %lld waiters, "
                 "%lld timers", (long long)ss.entries, (long long)ss.waiters,
                 (long long)ss.wait_timers);
    /* A waiter that disconnects is cleaned up: its parked request, its timer and the
     * placeholder of the key it waited on all go; the key can still be set. */
    int fd = raw_hello(dt_store_server_port(srv));
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_GET, 1, 60000, 1, 0);
    dt_proto_put_item(&b, "never", 5);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    for (int i = 0; i < 500 && stats_of(srv).waiters == 0; i++)
        dt_sleep_ms(10);
    ss = stats_of(srv);
    DT_CHECK_INT(ss.waiters, 1);
    DT_CHECK_INT(ss.wait_timers, 1);
    DT_CHECK_INT(ss.entries, 1); /* the placeholder of "never" */
    DT_CHECK_INT(ss.keys, 0);
    close(fd);
    DT_CHECK_MSG(stats_settle(srv, 0, &ss), "after the waiter left: %lld entries, %lld "
                 "waiters, %lld timers", (long long)ss.entries, (long long)ss.waiters,
                 (long long)ss.wait_timers);
    DT_REQUIRE_OK(dt_store_set(s, "never", "1", 1, err), err);
    ss = stats_of(srv);
    DT_CHECK_INT(ss.keys, 1);
    DT_CHECK_INT(ss.entries, 1);
    DT_CHECK_INT(ss.bytes, 5 + 1 + DT_STORE_KEY_OVERHEAD);
    dt_proto_buf_free(&b);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Concurrency                                                                                */
/* ------------------------------------------------------------------------------------------ */

typedef struct worker_arg {
    int port;
    dt_store *shared; /* when set, every thread uses this handle */
    int iters;
    int idx;
    int ok;
    int wins;
} worker_arg;

static void *adder(void *arg)
{
    worker_arg *w = arg;
    dt_store *s = w->shared;
    dt_err err_ = {0}, *err = &err_;
    if (!s && dt_store_connect(&s, "127.0.0.1", w->port, NULL, err) < 0)
        return NULL;
    int ok = 1;
    for (int i = 0; i < w->iters; i++)
        if (dt_store_add(s, "counter", 1, NULL, err) < 0)
            ok = 0;
    w->ok = ok;
    if (!w->shared)
        dt_store_free(s);
    return NULL;
}

static void test_concurrent_adds(void)
{
    dt_store_server *srv = start_server(NULL);
    enum { T = 8, N = 500 };
    pthread_t th[T];
    worker_arg w[T];
    dt_store *shared = connect_to(srv, NULL);
    for (int i = 0; i < T; i++) {
        /* half the threads share one handle (serialised), half have their own */
        w[i] = (worker_arg){.port = dt_store_server_port(srv), .iters = N,
                            .shared = i % 2 ? shared : NULL};
        pthread_create(&th[i], NULL, adder, &w[i]);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        DT_CHECK(w[i].ok);
    }
    dt_err err_ = {0}, *err = &err_;
    int64_t r = 0;
    DT_REQUIRE_OK(dt_store_add(shared, "counter", 0, &r, err), err);
    DT_CHECK_INT(r, T * N);
    dt_store_free(shared);
    dt_store_server_stop(srv);
}

static void *cas_racer(void *arg)
{
    worker_arg *w = arg;
    dt_store *s = NULL;
    dt_err err_ = {0}, *err = &err_;
    if (dt_store_connect(&s, "127.0.0.1", w->port, NULL, err) < 0)
        return NULL;
    /* Each racer increments a counter held as text with a CAS loop: no update may be lost. */
    for (int i = 0; i < w->iters; i++) {
        for (;;) {
            void *cur = NULL;
            size_t n = 0;
            if (dt_store_get(s, "casctr", &cur, &n, 5000, err) < 0)
                goto out;
            char next[32];
            /* unique per racer, so that "current == desired" proves this racer won */
            snprintf(next, sizeof next, "%lld r%d", atoll(cur) + 1, w->idx);
            void *after = NULL;
            size_t an = 0;
            int rc = dt_store_cas(s, "casctr", cur, n, next, strlen(next), &after, &an, err);
            free(cur);
            if (rc < 0)
                goto out;
            int won = an == strlen(next) && !memcmp(after, next, an);
            free(after);
            if (won) {
                w->wins++;
                break;
            }
        }
    }
    /* And one race for a single slot: exactly one racer may create it. */
    char me[16];
    snprintf(me, sizeof me, "r%d", w->idx);
    void *after = NULL;
    size_t an = 0;
    if (dt_store_cas(s, "slot", "", 0, me, strlen(me), &after, &an, err) == 0) {
        w->ok = 1 + (an == strlen(me) && !memcmp(after, me, an)); /* 2 = I won */
        free(after);
    }
out:
    dt_store_free(s);
    return NULL;
}

static void test_cas_race(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    DT_REQUIRE_OK(dt_store_set(s, "casctr", "0", 1, err), err);
    enum { T = 6, N = 60 };
    pthread_t th[T];
    worker_arg w[T];
    for (int i = 0; i < T; i++) {
        w[i] = (worker_arg){.port = dt_store_server_port(srv), .iters = N, .idx = i};
        pthread_create(&th[i], NULL, cas_racer, &w[i]);
    }
    int winners = 0;
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        DT_CHECK_INT(w[i].wins, N);
        DT_CHECK(w[i].ok >= 1);
        winners += w[i].ok == 2;
    }
    DT_CHECK_INT(winners, 1);
    void *v = NULL;
    size_t n;
    DT_REQUIRE_OK(dt_store_get(s, "casctr", &v, &n, 0, err), err);
    DT_CHECK_INT(atoll(v), T * N);
    free(v);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* The standalone server                                                                      */
/* ------------------------------------------------------------------------------------------ */

/* Starts `dtrain store ARGS` with stdout on a pipe; returns its pid and reads the port line. */
static pid_t spawn_store(const char *args, int *port, const char *env_token)
{
    int p[2];
    DT_REQUIRE(pipe2(p, O_CLOEXEC) == 0);
    pid_t pid = fork();
    DT_REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(p[1], 1);
        if (env_token)
            setenv("DTRAIN_STORE_TOKEN", env_token, 1);
        else
            unsetenv("DTRAIN_STORE_TOKEN");
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "exec '%s' store --host 127.0.0.1 --port 0 %s",
                 dt_test_dtrain_bin(), args);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    char line[64] = {0};
    size_t len = 0;
    uint64_t end = dt_now_ns() + 10000000000ull;
    while (len < sizeof line - 1 && !memchr(line, '\n', len) && dt_now_ns() < end) {
        struct pollfd pf = {.fd = p[0], .events = POLLIN};
        if (poll(&pf, 1, 100) <= 0)
            continue;
        ssize_t n = read(p[0], line + len, sizeof line - 1 - len);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(p[0]);
    *port = atoi(line);
    return pid;
}

static int wait_exit(pid_t pid, int timeout_ms)
{
    int status = 0;
    for (int i = 0; i < timeout_ms / 10; i++) {
        if (waitpid(pid, &status, WNOHANG) == pid)
            return status;
        dt_sleep_ms(10);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return -1;
}

static void test_standalone(void)
{
    int port = 0;
    pid_t pid = spawn_store("", &port, NULL);
    DT_REQUIRE(port > 0);
    dt_store *s = NULL;
    dt_err err_ = {0}, *err = &err_;
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", port, NULL, err), err);
    DT_REQUIRE_OK(dt_store_set(s, "hello", "world", 5, err), err);
    void *v = NULL;
    size_t n;
    DT_REQUIRE_OK(dt_store_get(s, "hello", &v, &n, 0, err), err);
    DT_CHECK_STR((char *)v, "world");
    free(v);
    dt_store_free(s);
    kill(pid, SIGTERM);
    int st = wait_exit(pid, 10000);
    DT_CHECK_MSG(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                 "dtrain store did not exit 0 on SIGTERM (status %d)", st);

    pid = spawn_store("", &port, NULL);
    DT_REQUIRE(port > 0);
    kill(pid, SIGINT);
    st = wait_exit(pid, 10000);
    DT_CHECK_MSG(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0,
                 "dtrain store did not exit 0 on SIGINT (status %d)", st);

    /* --max-input-buffered reaches the server: a request larger than it alone is refused. */
    pid = spawn_store("--max-input-buffered 100K", &port, NULL);
    DT_REQUIRE(port > 0);
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", port, NULL, err), err);
    char *big = calloc(1, 200 << 10);
    DT_REQUIRE(big != NULL);
    DT_CHECK(dt_store_set(s, "big", big, 200 << 10, err) != 0);
    free(big);
    dt_store_free(s);
    kill(pid, SIGTERM);
    wait_exit(pid, 10000);

    char *out = NULL;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' store --help", dt_test_dtrain_bin());
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 0);
    DT_CHECK_CONTAINS(out, "--token-file");
    DT_CHECK_CONTAINS(out, "--input-stall-ms");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' store --input-stall-ms 0", dt_test_dtrain_bin());
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 2);
    DT_CHECK_CONTAINS(out, "positive number of milliseconds");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' store --prot 5", dt_test_dtrain_bin());
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 2);
    DT_CHECK_CONTAINS(out, "--port");
    free(out);
}

/* compare_set exactly as torch's TCPStore answers it (TCPStoreBackend compareSetHandler), case
 * by case, with what each case leaves in the store. */
static void test_cas_torch(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    void *v = NULL;
    size_t n = 0;
    int sw = -1, del = -1;
    int64_t nk = -1;

    /* Absent, expected non-empty: nothing is set, expected comes back (not ""). */
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "old", 3, "new", 3, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 0);
    DT_CHECK_INT(n, 3);
    DT_CHECK(v && n == 3 && !memcmp(v, "old", 3));
    DT_CHECK(v && ((char *)v)[n] == '\0');
    free(v);
    v = NULL;
    DT_CHECK_INT(dt_store_get(s, "k", &v, &n, 0, err), -ENOENT); /* still absent */
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 0);
    /* The same through dt_store_cas, with expected == desired: torch says "x" too. */
    DT_REQUIRE_OK(dt_store_cas(s, "k", "x", 1, "x", 1, &v, &n, err), err);
    DT_CHECK(n == 1 && !memcmp(v, "x", 1));
    free(v);
    DT_CHECK_INT(dt_store_get(s, "k", &v, &n, 0, err), -ENOENT);

    /* Absent, expected empty: created with desired, desired comes back. */
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "", 0, "v1", 2, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 1);
    DT_CHECK(n == 2 && !memcmp(v, "v1", 2));
    free(v);
    /* Present, expected matches: swapped, new value comes back. */
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "v1", 2, "v2", 2, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 1);
    DT_CHECK(n == 2 && !memcmp(v, "v2", 2));
    free(v);
    /* Present, expected differs (empty or not): unchanged, current value comes back. */
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "v1", 2, "v3", 2, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 0);
    DT_CHECK(n == 2 && !memcmp(v, "v2", 2));
    free(v);
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "", 0, "v3", 2, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 0);
    DT_CHECK(n == 2 && !memcmp(v, "v2", 2));
    free(v);
    /* Present with an empty value: an empty expected matches it. */
    DT_REQUIRE_OK(dt_store_set(s, "e", "", 0, err), err);
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "e", "", 0, "full", 4, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 1);
    DT_CHECK(n == 4 && !memcmp(v, "full", 4));
    free(v);
    /* After a delete the key is absent again: a stale expected is echoed, nothing is set. */
    DT_REQUIRE_OK(dt_store_delete(s, "k", &del, err), err);
    DT_CHECK_INT(del, 1);
    DT_REQUIRE_OK(dt_store_cas_swapped(s, "k", "v2", 2, "v4", 2, &sw, &v, &n, err), err);
    DT_CHECK_INT(sw, 0);
    DT_CHECK(n == 2 && !memcmp(v, "v2", 2));
    free(v);
    DT_CHECK_INT(dt_store_get(s, "k", &v, &n, 0, err), -ENOENT);
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 1); /* only "e" */
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* The input budget (max_input_buffered)                                                      */
/* ------------------------------------------------------------------------------------------ */

/* A SET frame of key = vlen bytes of `fill`. */
static void set_frame(dt_proto_buf *b, uint32_t id, const char *key, size_t vlen, int fill)
{
    char *v = malloc(vlen);
    DT_REQUIRE(v);
    memset(v, fill, vlen);
    size_t st = dt_proto_begin(b, DT_OP_SET, id, 0, 1, 1);
    dt_proto_put_item(b, key, strlen(key));
    dt_proto_put_item(b, v, vlen);
    dt_proto_end(b, st);
    free(v);
}

typedef struct raw_writer {
    int fd;
    const uint8_t *p;
    size_t n;
    int rc;
} raw_writer;

static void *raw_writer_main(void *arg)
{
    raw_writer *w = arg;
    w->rc = dt_write_all(w->fd, w->p, w->n);
    return NULL;
}

/* Polls the stats (bounded) until want(st) holds. */
static bool stats_until(dt_store_server *srv, bool (*want)(const dt_store_server_stats *, size_t),
                        size_t arg, dt_store_server_stats *st)
{
    for (int i = 0; i < 1000; i++) {
        *st = stats_of(srv);
        if (want(st, arg))
            return true;
        dt_sleep_ms(10);
    }
    return false;
}
static bool st_charged_is(const dt_store_server_stats *st, size_t n)
{
    return st->input_charged == (int64_t)n;
}
static bool st_paused_is(const dt_store_server_stats *st, size_t n)
{
    return st->input_paused == (int64_t)n;
}

static void check_value(dt_store *s, const char *key, size_t vlen, int fill)
{
    dt_err err_ = {0}, *err = &err_;
    void *v = NULL;
    size_t n = 0;
    DT_REQUIRE_OK(dt_store_get(s, key, &v, &n, 0, err), err);
    DT_CHECK_INT(n, vlen);
    int same = n == vlen;
    for (size_t i = 0; same && i < n; i++)
        same = ((uint8_t *)v)[i] == (uint8_t)fill;
    DT_CHECK_MSG(same, "value of %s is not what was set", key);
    free(v);
}

/* The budget and stall tests: a server with an input budget, a well-behaved client, and two
 * raw clients' large SET frames (A's "a" and B's "b"). */
typedef struct budget_fix {
    dt_store_server *srv;
    int port;
    dt_store *s;
    dt_proto_buf fa, fb, rep; /* A's and B's frames; a reply buffer */
} budget_fix;

static void budget_begin(budget_fix *f, int64_t cap, int stall_ms, size_t vlen)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.max_input_buffered = cap;
    if (stall_ms > 0)
        o.input_stall_ms = stall_ms;
    memset(f, 0, sizeof *f);
    f->srv = start_server(&o);
    f->port = dt_store_server_port(f->srv);
    f->s = connect_to(f->srv, NULL);
    set_frame(&f->fa, 1, "a", vlen, 'a');
    set_frame(&f->fb, 2, "b", vlen, 'b');
}

static void budget_end(budget_fix *f)
{
    dt_proto_buf_free(&f->fa);
    dt_proto_buf_free(&f->fb);
    dt_proto_buf_free(&f->rep);
    dt_store_free(f->s);
    dt_store_server_stop(f->srv);
}

/* B: a new connection that sends its whole frame from a thread, since the server may stop
 * reading it (its sends give up after timeout_s). Returns B's socket. */
static int start_b(budget_fix *f, raw_writer *w, pthread_t *th, int timeout_s)
{
    int b = raw_hello(f->port);
    struct timeval tv = {.tv_sec = timeout_s};
    setsockopt(b, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    *w = (raw_writer){.fd = b, .p = f->fb.data, .n = f->fb.len, .rc = -1};
    DT_REQUIRE(pthread_create(th, NULL, raw_writer_main, w) == 0);
    return b;
}

/* Two clients whose large SETs together exceed the budget: the second is paused (not refused,
 * not disconnected) while the first is held, small requests still flow, both succeed, and the
 * charged total never goes over the limit. Then the same with the first client dying in the
 * middle of its frame, and a frame larger than the whole budget (E2BIG, closed, logged). */
static void test_input_budget(void)
{
    enum { CAP = 1 << 20, VLEN = 700 * 1024 };
    budget_fix f;
    budget_begin(&f, CAP, 0, VLEN);
    dt_store_server *srv = f.srv;
    int port = f.port;
    dt_store *s = f.s;
    dt_err err_ = {0}, *err = &err_;
    dt_store_server_stats st;

    for (int round = 0; round < 2; round++) {
        /* A: half of its frame, then stops: its buffer (the whole frame) is charged. */
        int a = raw_hello(port);
        DT_REQUIRE(dt_write_all(a, f.fa.data, f.fa.len / 2) == 0);
        bool charged = stats_until(srv, st_charged_is, f.fa.len, &st);
        DT_CHECK_MSG(charged, "A's frame was never charged (input_charged %" PRId64 ")",
                     st.input_charged);
        DT_REQUIRE(charged);
        /* B: its whole frame, from a thread (the server stops reading it). */
        raw_writer w;
        pthread_t th;
        int b = start_b(&f, &w, &th, 20);
        DT_CHECK_MSG(stats_until(srv, st_paused_is, 1, &st), "B was never paused");
        DT_CHECK(st.input_charged <= CAP);
        DT_CHECK_INT(st.connections, 3);
        /* Small requests are not held back by the budget. */
        DT_CHECK_INT(dt_store_set(s, "small", "x", 1, err), 0);
        DT_CHECK_INT(dt_store_ping(s, NULL, err), 0);
        if (round == 0) { /* A finishes: A succeeds, then B resumes and succeeds */
            DT_REQUIRE(dt_write_all(a, f.fa.data + f.fa.len / 2, f.fa.len - f.fa.len / 2) == 0);
            DT_CHECK_INT(raw_reply(a, &f.rep), DT_PROTO_OK);
        }
        close(a); /* round 1: A dies in the middle of its frame, which frees its budget */
        pthread_join(th, NULL);
        DT_CHECK_INT(w.rc, 0);
        DT_CHECK_INT(raw_reply(b, &f.rep), DT_PROTO_OK);
        close(b);
        DT_CHECK(stats_until(srv, st_charged_is, 0, &st));
        DT_CHECK_INT(st.input_paused, 0);
        if (round == 0)
            check_value(s, "a", VLEN, 'a');
        check_value(s, "b", VLEN, 'b');
        DT_REQUIRE_OK(dt_store_delete(s, "b", NULL, err), err);
    }
    st = stats_of(srv);
    DT_CHECK_MSG(st.input_charged_peak <= CAP, "peak %" PRId64 " over the cap %d",
                 st.input_charged_peak, CAP);
    DT_CHECK(st.input_charged_peak >= (int64_t)f.fa.len);

    /* A frame larger than the whole budget: E2BIG, the connection closed, the client named. */
    dt_proto_buf fc = {0};
    set_frame(&fc, 7, "c", CAP + 1, 'c');
    log_capture lc;
    capture_start(&lc);
    int c = raw_hello(port);
    DT_REQUIRE(dt_write_all(c, fc.data, 64) == 0);
    int status = raw_reply(c, &f.rep);
    bool logged = capture_wait(&lc, "larger than max_input_buffered");
    capture_stop(&lc);
    DT_CHECK_INT(status, DT_PROTO_E2BIG);
    DT_CHECK(logged);
    DT_CHECK(raw_closed_by_server(c, 10000));
    close(c);
    DT_CHECK_INT(dt_store_get(s, "c", &(void *){NULL}, &(size_t){0}, 0, err), -ENOENT);
    check_alive(srv);

    dt_proto_buf_free(&fc);
    budget_end(&f);
}

static bool st_cuts_is(const dt_store_server_stats *st, size_t n)
{
    return st->input_stall_cuts == (int64_t)n;
}

/* "127.0.0.1:PORT" of fd's own end: how the server names this client in its log. */
static void local_name(int fd, char *out, size_t n)
{
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    DT_REQUIRE(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    snprintf(out, n, "127.0.0.1:%d", ntohs(a.sin_port));
}

/* A client that stops in the middle of a large SET keeps its charge while nobody waits (it
 * harms nobody: not cut, however long), but once another large SET waits behind it, it is
 * disconnected after input_stall_ms of silence (counted, logged with its address and how much
 * arrived); its charge goes to the waiter, whose SET then completes. */
static void test_input_stall(void)
{
    enum { CAP = 1 << 20, VLEN = 700 * 1024, STALL_MS = 300 };
    budget_fix f;
    budget_begin(&f, CAP, STALL_MS, VLEN);
    dt_store_server *srv = f.srv;
    int port = f.port;
    dt_store *s = f.s;
    dt_store_server_stats st;

    /* A: the header and part of its frame, then silence. Alone, it is not cut. */
    int a = raw_hello(port);
    DT_REQUIRE(dt_write_all(a, f.fa.data, f.fa.len / 3) == 0);
    DT_REQUIRE(stats_until(srv, st_charged_is, f.fa.len, &st));
    dt_sleep_ms(3 * STALL_MS);
    st = stats_of(srv);
    DT_CHECK_INT(st.input_stall_cuts, 0);
    DT_CHECK_INT(st.connections, 2);
    DT_CHECK_INT(st.input_charged, (int64_t)f.fa.len);

    /* B: a whole 700 KiB SET, paused behind A; A is cut, B completes. */
    char aname[64];
    local_name(a, aname, sizeof aname);
    log_capture lc;
    capture_start(&lc);
    raw_writer w;
    pthread_t th;
    int b = start_b(&f, &w, &th, 20);
    bool cut = stats_until(srv, st_cuts_is, 1, &st);
    bool logged = cut && capture_wait(&lc, "stalled in the middle");
    capture_stop(&lc);
    DT_CHECK_MSG(cut, "the stalled client was never cut (input_stall_cuts %" PRId64
                 ", input_paused %" PRId64 ")", st.input_stall_cuts, st.input_paused);
    DT_REQUIRE(cut);
    DT_CHECK(logged);
    char *text = dt_test_slurp(lc.path);
    DT_REQUIRE(text);
    char want[128];
    snprintf(want, sizeof want, "%zu of %zu bytes received", f.fa.len / 3, f.fa.len);
    DT_CHECK_CONTAINS(text, aname);
    DT_CHECK_CONTAINS(text, want);
    DT_CHECK_CONTAINS(text, "input_stall_ms");
    free(text);
    DT_CHECK(raw_closed_by_server(a, 10000));
    close(a);
    pthread_join(th, NULL);
    DT_CHECK_INT(w.rc, 0);
    DT_CHECK_INT(raw_reply(b, &f.rep), DT_PROTO_OK);
    close(b);
    DT_CHECK(stats_until(srv, st_charged_is, 0, &st));
    DT_CHECK_INT(st.input_paused, 0);
    DT_CHECK_INT(st.input_stall_cuts, 1);
    DT_CHECK(st.input_charged_peak <= CAP);
    check_value(s, "b", VLEN, 'b');
    DT_CHECK_INT(dt_store_get(s, "a", &(void *){NULL}, &(size_t){0}, 0, &(dt_err){0}), -ENOENT);
    check_alive(srv);

    budget_end(&f);
}

/* A slow sender whose bytes keep arriving (24 KiB every 100 ms, for longer in all than
 * input_stall_ms) is never cut, even with another large SET waiting behind it: both succeed. */
static void test_input_stall_progress(void)
{
    enum { CAP = 1 << 20, VLEN = 700 * 1024, STALL_MS = 1200, FIRST = 100 << 10, CHUNK = 24 << 10 };
    budget_fix f;
    budget_begin(&f, CAP, STALL_MS, VLEN);
    dt_store_server *srv = f.srv;
    int port = f.port;
    dt_store *s = f.s;
    dt_store_server_stats st;

    int a = raw_hello(port);
    /* Over 64 KiB first: the server charges the frame on its next read after that. */
    size_t sent = FIRST;
    DT_REQUIRE(dt_write_all(a, f.fa.data, sent) == 0);
    DT_REQUIRE(stats_until(srv, st_charged_is, f.fa.len, &st));
    raw_writer w;
    pthread_t th;
    int b = start_b(&f, &w, &th, 30);
    DT_CHECK_MSG(stats_until(srv, st_paused_is, 1, &st), "B was never paused");
    uint64_t t0 = dt_now_ns();
    while (sent < f.fa.len) {
        dt_sleep_ms(100);
        size_t n = DT_MIN((size_t)CHUNK, f.fa.len - sent);
        DT_REQUIRE(dt_write_all(a, f.fa.data + sent, n) == 0);
        sent += n;
    }
    double secs = (double)(dt_now_ns() - t0) / 1e9;
    DT_CHECK_MSG(secs * 1000 > STALL_MS, "the slow send took %.2f s, not longer than the stall "
                 "timeout", secs);
    DT_CHECK_INT(raw_reply(a, &f.rep), DT_PROTO_OK);
    close(a);
    pthread_join(th, NULL);
    DT_CHECK_INT(w.rc, 0);
    DT_CHECK_INT(raw_reply(b, &f.rep), DT_PROTO_OK);
    close(b);
    DT_CHECK(stats_until(srv, st_charged_is, 0, &st));
    DT_CHECK_INT(st.input_stall_cuts, 0);
    DT_CHECK_INT(st.input_paused, 0);
    check_value(s, "a", VLEN, 'a');
    check_value(s, "b", VLEN, 'b');

    budget_end(&f);
}

/* ------------------------------------------------------------------------------------------ */
/* Waiting: many keys, deletes in between, pipelining behind a wait                           */
/* ------------------------------------------------------------------------------------------ */

typedef struct many_writer {
    int port, n;
} many_writer;

static void *set_many_reverse(void *arg)
{
    many_writer *w = arg;
    dt_store *s = NULL;
    dt_err err = {0};
    if (dt_store_connect(&s, "127.0.0.1", w->port, NULL, &err) < 0)
        return NULL;
    dt_sleep_ms(50);
    for (int i = w->n - 1; i >= 0; i--) {
        char k[32];
        snprintf(k, sizeof k, "many/%d", i);
        dt_store_set(s, k, "v", 1, &err);
    }
    dt_store_free(s);
    return NULL;
}

static void test_wait_many_keys(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    enum { N = 2000 };
    static char names[N][32];
    const char *keys[N];
    for (int i = 0; i < N; i++) {
        snprintf(names[i], sizeof names[i], "many/%d", i);
        keys[i] = names[i];
    }
    many_writer w = {dt_store_server_port(srv), N};
    pthread_t t;
    pthread_create(&t, NULL, set_many_reverse, &w);
    DT_CHECK_INT(dt_store_wait(s, keys, N, 20000, err), 0);
    pthread_join(t, NULL);

    /* A key seen present, then deleted, must be waited for again. */
    dt_store *s2 = connect_to(srv, NULL);
    int fd = raw_hello(dt_store_server_port(srv));
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_WAIT, 9, 20000, 2, 0);
    dt_proto_put_item(&b, "da", 2);
    dt_proto_put_item(&b, "db", 2);
    dt_proto_end(&b, st);
    /* Pipelined behind the wait: a PING, answered only after the wait completes. */
    st = dt_proto_begin(&b, DT_OP_PING, 10, 0, 0, 0);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    DT_REQUIRE_OK(dt_store_set(s2, "da", "1", 1, err), err);
    DT_REQUIRE_OK(dt_store_delete(s2, "da", NULL, err), err);
    DT_REQUIRE_OK(dt_store_set(s2, "db", "1", 1, err), err);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    DT_CHECK_MSG(poll(&p, 1, 200) == 0, "WAIT completed although \"da\" was deleted");
    DT_REQUIRE_OK(dt_store_set(s2, "da", "2", 1, err), err);
    dt_proto_buf r = {0};
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_OK);
    DT_CHECK_INT(dt_proto_rd32(r.data + 5), 9); /* the WAIT's id, then the PING's */
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_OK);
    DT_CHECK_INT(dt_proto_rd32(r.data + 5), 10);
    close(fd);
    dt_proto_buf_free(&b);
    dt_proto_buf_free(&r);
    dt_store_free(s2);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Token                                                                                      */
/* ------------------------------------------------------------------------------------------ */

static void test_token(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.token = "s3cret";
    dt_store_server *srv = start_server(&o);
    int port = dt_store_server_port(srv);
    dt_err err_ = {0}, *err = &err_;

    dt_store *s = connect_to(srv, "s3cret");
    DT_REQUIRE_OK(dt_store_set(s, "k", "v", 1, err), err);
    dt_store_free(s);

    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 20000; /* refusals are final: they must not wait for this */
    co.token = "wrong";
    unsetenv("DTRAIN_STORE_TOKEN");
    uint64_t t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), -EACCES);
    DT_CHECK_CONTAINS(err->msg, "token");
    co.token = NULL;
    log_capture lc;
    capture_start(&lc);
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), -EACCES);
    /* That client hangs up without sending a frame: the server says so. */
    bool logged = capture_wait(&lc, "before authenticating");
    capture_stop(&lc);
    DT_CHECK_MSG(logged, "the server did not log a client that left before authenticating");
    DT_CHECK_CONTAINS(err->msg, "DTRAIN_STORE_TOKEN");
    DT_CHECK((dt_now_ns() - t0) / 1000000 < 10000);

    /* DTRAIN_STORE_TOKEN is used when opts.token is NULL. */
    setenv("DTRAIN_STORE_TOKEN", "s3cret", 1);
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", port, &co, err), err);
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);
    dt_store_free(s);
    unsetenv("DTRAIN_STORE_TOKEN");

    /* A raw client that skips AUTH is refused and disconnected. */
    int fd = raw_connect(port);
    uint8_t h[DT_PROTO_HELLO_SIZE];
    DT_REQUIRE(dt_read_all(fd, h, sizeof h) == 0);
    uint16_t ver, flags;
    DT_REQUIRE(dt_proto_hello_decode(h, &ver, &flags) == 0);
    DT_CHECK(flags & DT_PROTO_HELLO_AUTH);
    dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_GET, 1, 0, 1, 0);
    dt_proto_put_item(&b, "k", 1);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    dt_proto_buf r = {0};
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_EACCES);
    DT_CHECK(raw_closed_by_server(fd, 5000));
    close(fd);

    /* Before AUTH only an AUTH-sized frame is accepted: a stranger announcing a 200 MiB frame
     * is refused at once (nothing of it buffered), not waited for. */
    fd = raw_connect(port);
    DT_REQUIRE(dt_read_all(fd, h, sizeof h) == 0);
    dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    uint8_t big[4 + DT_PROTO_HDR_SIZE] = {0};
    dt_proto_wr32(big, 200u << 20);
    big[4] = DT_OP_SET;
    DT_REQUIRE(dt_write_all(fd, big, sizeof big) == 0);
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_E2BIG);
    DT_CHECK(raw_closed_by_server(fd, 5000));
    close(fd);
    /* An AUTH with a long wrong token is still answered as a wrong token. */
    fd = raw_connect(port);
    DT_REQUIRE(dt_read_all(fd, h, sizeof h) == 0);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    char longtok[2000];
    memset(longtok, 't', sizeof longtok);
    b.len = 0;
    st = dt_proto_begin(&b, DT_OP_AUTH, 1, 0, 0, 1);
    dt_proto_put_item(&b, longtok, sizeof longtok);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_EACCES);
    close(fd);
    dt_proto_buf_free(&b);
    dt_proto_buf_free(&r);
    check_alive_token(srv, "s3cret");
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Limits                                                                                     */
/* ------------------------------------------------------------------------------------------ */

static void test_server_limits(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.max_key_size = 16;
    o.max_value_size = 64;
    o.max_keys_per_request = 4;
    o.max_total_bytes = 200 + 3 * DT_STORE_KEY_OVERHEAD;
    o.max_connections = 3;
    dt_store_server *srv = start_server(&o);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    char big[100];
    memset(big, 'x', sizeof big);

    DT_CHECK_INT(dt_store_set(s, "0123456789abcdefX", "v", 1, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_key_size");
    /* A very long key is shortened in the message, so the reason and the host still show. */
    char *longkey = malloc(5001);
    DT_REQUIRE(longkey);
    memset(longkey, 'q', 5000);
    longkey[5000] = '\0';
    DT_CHECK_INT(dt_store_set(s, longkey, "v", 1, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_key_size");
    DT_CHECK_CONTAINS(err->msg, "127.0.0.1");
    DT_CHECK_CONTAINS(err->msg, "...\" (5000 bytes)");
    free(longkey);
    DT_CHECK_INT(dt_store_set(s, "k", big, 65, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_value_size");
    DT_REQUIRE_OK(dt_store_set(s, "k", big, 64, err), err);
    DT_CHECK_INT(dt_store_append(s, "k", "y", 1, err), -E2BIG);
    const char *five[] = {"a", "b", "c", "d", "e"};
    int all;
    DT_CHECK_INT(dt_store_check(s, five, 5, &all, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_keys_per_request");
    /* total bytes, each key charged DT_STORE_KEY_OVERHEAD more: k (1+64) stored; two more
     * 64-byte values fit (195), a fourth key does not */
    DT_REQUIRE_OK(dt_store_set(s, "k2", big, 64, err), err);
    DT_REQUIRE_OK(dt_store_set(s, "k3", big, 63, err), err);
    DT_CHECK_INT(dt_store_set(s, "k4", big, 10, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_total_bytes");
    DT_CHECK_INT(dt_store_add(s, "counter1", 1, NULL, err), -E2BIG); /* 9 more bytes */
    const char *mk[] = {"m1", "m2"};
    const void *mv[] = {"12345", "12345"};
    size_t ml[] = {5, 5};
    DT_CHECK_INT(dt_store_multi_set(s, mk, mv, ml, 2, err), -E2BIG);
    /* overwriting within the limit is fine; deleting frees room */
    DT_REQUIRE_OK(dt_store_set(s, "k3", big, 60, err), err);
    DT_REQUIRE_OK(dt_store_delete(s, "k2", NULL, err), err);
    DT_REQUIRE_OK(dt_store_set(s, "k4", big, 10, err), err);
    /* Many empty values are not free: each key costs its bookkeeping (which the limit
     * counts), so a store full of tiny keys stays within its memory bound. */
    DT_CHECK_INT(dt_store_set(s, "e1", "", 0, err), -E2BIG); /* 141 bytes of keys+values */
    DT_CHECK_CONTAINS(err->msg, "bookkeeping");
    /* the connection survived every refusal */
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);
    /* A request over the frame limit: the server answers E2BIG and closes; the client reports
     * the refusal (not "connection lost") and the next call reconnects. */
    size_t hl = 4 << 20;
    char *huge_val = calloc(1, hl);
    DT_CHECK_INT(dt_store_set(s, "k", huge_val, hl, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "limit");
    free(huge_val);
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);

    /* connections: 3 allowed (s + 2); the 4th is refused with a clear message */
    dt_store *c2 = connect_to(srv, NULL), *c3 = connect_to(srv, NULL), *c4 = NULL;
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 300;
    DT_CHECK_INT(dt_store_connect(&c4, "127.0.0.1", dt_store_server_port(srv), &co, err),
                 -ECONNREFUSED);
    DT_CHECK_CONTAINS(err->msg, "max_connections");
    dt_store_free(c3);
    dt_sleep_ms(100); /* the server sees the close */
    co.connect_timeout_ms = 5000;
    DT_REQUIRE_OK(dt_store_connect(&c4, "127.0.0.1", dt_store_server_port(srv), &co, err), err);
    dt_store_free(c4);
    dt_store_free(c2);

    /* A length prefix over the frame limit: an error reply, then the server closes. */
    int fd = raw_hello(dt_store_server_port(srv));
    uint8_t huge[8] = {0xff, 0xff, 0xff, 0xf0, 1, 2, 3, 4};
    DT_REQUIRE(dt_write_all(fd, huge, sizeof huge) == 0);
    dt_proto_buf r = {0};
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_E2BIG);
    DT_CHECK(raw_closed_by_server(fd, 5000));
    close(fd);
    dt_proto_buf_free(&r);
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Misbehaving clients                                                                        */
/* ------------------------------------------------------------------------------------------ */

static void test_garbage(void)
{
    dt_store_server *srv = start_server(NULL);
    int port = dt_store_server_port(srv);
    /* Not a dtrain client at all. */
    log_capture lc;
    capture_start(&lc);
    int fd = raw_connect(port);
    const char *http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    DT_REQUIRE(dt_write_all(fd, http, strlen(http)) == 0);
    DT_CHECK(raw_closed_by_server(fd, 5000));
    close(fd);
    /* Another protocol version: closed, and the server's log says which versions. */
    fd = raw_connect(port);
    uint8_t h[DT_PROTO_HELLO_SIZE];
    dt_proto_hello_encode(h, DT_PROTO_VERSION + 1, 0);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    DT_CHECK(raw_closed_by_server(fd, 5000));
    close(fd);
    char want[128];
    snprintf(want, sizeof want, "speaks store protocol version %d, this server speaks %d",
             DT_PROTO_VERSION + 1, DT_PROTO_VERSION);
    bool logged = capture_wait(&lc, want);
    capture_stop(&lc);
    DT_CHECK_MSG(logged, "the server did not log the version mismatch (\"%s\")", want);
    char *text = dt_test_slurp(lc.path);
    DT_CHECK_CONTAINS(text, "not a dtrain store client");
    free(text);
    /* Random bytes after a good handshake, many times over (seeded, so reproducible). */
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int round = 0; round < 50; round++) {
        fd = raw_hello(port);
        uint8_t junk[512];
        for (size_t i = 0; i < sizeof junk; i++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            junk[i] = (uint8_t)x;
        }
        if (round % 2) /* half of them with a plausible length prefix */
            dt_proto_wr32(junk, (uint32_t)(x % 600));
        DT_REQUIRE(dt_write_all(fd, junk, sizeof junk) == 0);
        close(fd);
    }
    check_alive(srv);
    dt_store_server_stop(srv);
}

static void test_mid_frame(void)
{
    dt_store_server *srv = start_server(NULL);
    int port = dt_store_server_port(srv);
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_SET, 1, 0, 1, 1);
    dt_proto_put_item(&b, "half", 4);
    dt_proto_put_item(&b, "value", 5);
    dt_proto_end(&b, st);
    /* Die after each possible prefix of a frame (and in the middle of the handshake). */
    for (size_t cut = 0; cut < b.len; cut++) {
        int fd = raw_hello(port);
        DT_REQUIRE(dt_write_all(fd, b.data, cut) == 0);
        if (cut % 2) { /* half of them with a reset instead of a clean close */
            struct linger l = {1, 0};
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        close(fd);
    }
    int fd = raw_connect(port);
    DT_REQUIRE(dt_write_all(fd, "DTS", 3) == 0);
    close(fd);
    /* A large value cut in the middle (the server buffers it, then drops it). */
    dt_proto_buf big = {0};
    st = dt_proto_begin(&big, DT_OP_SET, 1, 0, 1, 1);
    dt_proto_put_item(&big, "big", 3);
    char *v = calloc(1, 1 << 20);
    dt_proto_put_item(&big, v, 1 << 20);
    dt_proto_end(&big, st);
    fd = raw_hello(port);
    DT_REQUIRE(dt_write_all(fd, big.data, big.len / 2) == 0);
    close(fd);
    free(v);
    dt_proto_buf_free(&big);
    dt_proto_buf_free(&b);

    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    void *val = NULL;
    size_t n;
    DT_CHECK_INT(dt_store_get(s, "half", &val, &n, 0, err), -ENOENT);
    DT_CHECK_INT(dt_store_get(s, "big", &val, &n, 0, err), -ENOENT);
    dt_store_free(s);
    check_alive(srv);
    dt_store_server_stop(srv);
}

static void test_slow_reader(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.max_value_size = 192 * 1024;
    o.max_pending_output = 256 * 1024;
    o.write_stall_ms = 300;
    dt_store_server *srv = start_server(&o);
    int port = dt_store_server_port(srv);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    size_t vlen = 192 * 1024;
    char *v = calloc(1, vlen);
    DT_REQUIRE_OK(dt_store_set(s, "fat", v, vlen, err), err);
    free(v);

    /* A client that asks for 48 MiB of replies and never reads any. */
    int fd = raw_connect(port);
    int small = 4096;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    uint8_t h[DT_PROTO_HELLO_SIZE];
    dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
    DT_REQUIRE(dt_write_all(fd, h, sizeof h) == 0);
    dt_proto_buf b = {0};
    for (int i = 0; i < 256; i++) {
        size_t st = dt_proto_begin(&b, DT_OP_GET, (uint32_t)i, 0, 1, 0);
        dt_proto_put_item(&b, "fat", 3);
        dt_proto_end(&b, st);
    }
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    dt_proto_buf_free(&b);
    /* Everyone else is still served meanwhile. */
    for (int i = 0; i < 20; i++)
        DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);
    /* And the non-reader was cut off. Its socket still holds replies the kernel accepted, so
     * reading would take long; but new bytes sent to a closed socket are answered with a
     * reset, so sending fails once the server has closed its end. */
    int closed = 0;
    uint8_t ping[DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE];
    dt_proto_buf pb = {0};
    size_t st = dt_proto_begin(&pb, DT_OP_PING, 1, 0, 0, 0);
    dt_proto_end(&pb, st);
    memcpy(ping, pb.data, sizeof ping);
    dt_proto_buf_free(&pb);
    for (int i = 0; i < 200 && !closed; i++) {
        if (send(fd, ping, sizeof ping, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
            closed = 1;
        else
            dt_sleep_ms(50);
    }
    DT_CHECK_MSG(closed, "the server never disconnected a client that does not read");
    close(fd);
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* Sends `count` pipelined GETs of key on a raw connection. */
static void raw_send_gets(int fd, const char *key, int count)
{
    dt_proto_buf b = {0};
    for (int i = 0; i < count; i++) {
        size_t st = dt_proto_begin(&b, DT_OP_GET, (uint32_t)i + 1, 0, 1, 0);
        dt_proto_put_item(&b, key, strlen(key));
        dt_proto_end(&b, st);
    }
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    dt_proto_buf_free(&b);
}

/* Replies larger than max_pending_output, and more replies than it, from well-behaved clients:
 * an error for the first, flow control for the second, never a disconnect. */
static void test_big_replies(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.max_value_size = 512 * 1024;
    o.max_pending_output = 512 * 1024 + 64 * 1024;
    o.write_stall_ms = 2000;
    dt_store_server *srv = start_server(&o);
    int port = dt_store_server_port(srv);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    size_t vlen = 512 * 1024;
    char *v = calloc(1, vlen);
    DT_REQUIRE(v);
    memset(v, 'a', vlen);
    DT_REQUIRE_OK(dt_store_set(s, "a", v, vlen, err), err);
    memset(v, 'b', vlen);
    DT_REQUIRE_OK(dt_store_set(s, "b", v, vlen, err), err);
    free(v);

    /* One value at its limit fits; two in one reply do not: a clear error naming the setting,
     * on the same connection, which stays usable. */
    void *vals[2] = {0};
    size_t lens[2] = {0};
    const char *ab[] = {"a", "b"};
    DT_REQUIRE_OK(dt_store_multi_get(s, ab, 1, vals, lens, 0, err), err);
    DT_CHECK(lens[0] == vlen && ((char *)vals[0])[vlen - 1] == 'a');
    free(vals[0]);
    DT_CHECK_INT(dt_store_multi_get(s, ab, 2, vals, lens, 0, err), -E2BIG);
    DT_CHECK_CONTAINS(err->msg, "max_pending_output");
    DT_REQUIRE_OK(dt_store_ping(s, NULL, err), err);

    /* A client that pipelines 40 such GETs (20 MiB of replies, far over the limit) and reads
     * them at its own pace gets every one: the server waits for it instead of cutting it. */
    int fd = raw_hello(port);
    enum { N = 40 };
    raw_send_gets(fd, "b", N);
    dt_proto_buf r = {0};
    int got = 0;
    for (int i = 0; i < N; i++) {
        if (i % 8 == 0)
            dt_sleep_ms(30);
        if (raw_reply(fd, &r) != DT_PROTO_OK)
            break;
        DT_CHECK_INT(dt_proto_rd32(r.data + 5), i + 1);
        got++;
    }
    DT_CHECK_MSG(got == N, "a client reading its replies slowly got %d of %d", got, N);
    /* ... and keeps its connection. */
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_PING, 99, 0, 0, 0);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    DT_CHECK_INT(raw_reply(fd, &r), DT_PROTO_OK);
    close(fd);
    dt_proto_buf_free(&b);
    dt_proto_buf_free(&r);
    dt_store_free(s);
    dt_store_server_stop(srv);

    /* Settings that could never send one value are refused at start, naming both. */
    dt_store_server_opts_default(&o);
    o.host = "127.0.0.1";
    o.max_value_size = 1 << 20;
    o.max_pending_output = 1 << 20;
    dt_store_server *bad = NULL;
    DT_CHECK_INT(dt_store_server_start(&bad, &o, err), -EINVAL);
    DT_CHECK_CONTAINS(err->msg, "max_pending_output");
    DT_CHECK_CONTAINS(err->msg, "max_value_size");
    /* ... as are values the wire format cannot carry. */
    o.max_value_size = (size_t)UINT32_MAX;
    o.max_pending_output = (size_t)UINT32_MAX * 2;
    DT_CHECK_INT(dt_store_server_start(&bad, &o, err), -EINVAL);
    DT_CHECK_CONTAINS(err->msg, "4 GiB");
    /* The defaults are consistent. */
    dt_store_server_opts_default(&o);
    DT_CHECK(o.max_pending_output >= o.max_value_size + 64 * 1024);
}

/* Connections that never finish the handshake or AUTH are closed after handshake_timeout_ms,
 * so a few silent sockets cannot lock real clients out. */
static void test_handshake_timeout(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.token = "tok";
    o.max_connections = 4;
    o.handshake_timeout_ms = 300;
    dt_store_server *srv = start_server(&o);
    int port = dt_store_server_port(srv);
    log_capture lc;
    capture_start(&lc);
    int fds[4];
    for (int i = 0; i < 4; i++) {
        fds[i] = raw_connect(port);
        if (i % 2) { /* half of them send a hello, then nothing (no AUTH) */
            uint8_t h[DT_PROTO_HELLO_SIZE];
            dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
            DT_REQUIRE(dt_write_all(fds[i], h, sizeof h) == 0);
        }
    }
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 5000;
    co.token = "tok";
    dt_store *s = NULL;
    dt_err err_ = {0}, *err = &err_;
    int rc = dt_store_connect(&s, "127.0.0.1", port, &co, err);
    bool logged = capture_wait(&lc, "did not finish");
    capture_stop(&lc);
    DT_CHECK_MSG(rc == 0, "a real client was locked out by 4 silent sockets: %s", err->msg);
    DT_CHECK(logged);
    for (int i = 0; i < 4; i++) {
        DT_CHECK_MSG(raw_closed_by_server(fds[i], 5000), "silent socket %d still open", i);
        close(fds[i]);
    }
    if (rc == 0)
        DT_CHECK_INT(dt_store_ping(s, NULL, err), 0);
    dt_store_free(s);
    dt_store_server_stop(srv);
}

/* Issue 21 #5: a flood of connections that send a hello and never authenticate must not lock out
 * a client that holds the token. The server runs in a child whose open-file limit is lowered to
 * 96 (setrlimit), so that a few hundred connections would exhaust it; a thread here keeps
 * opening such connections (closing its oldest) while a client with the token connects, sets
 * and gets, and one connected before the flood keeps working. The server says what happens. */
typedef struct flood {
    int port;
    volatile int stop;
    long opened;
} flood;

static void *flood_main(void *arg)
{
    flood *f = arg;
    enum { RING = 300 };
    int fds[RING];
    for (int i = 0; i < RING; i++)
        fds[i] = -1;
    double end = dt_test_now() + 30; /* a bound of its own, whatever the test does */
    for (int i = 0; !f->stop && dt_test_now() < end; i = (i + 1) % RING) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fds[i] < 0)
            break;
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)f->port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        struct timeval tv = {.tv_sec = 1};
        setsockopt(fds[i], SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (connect(fds[i], (struct sockaddr *)&a, sizeof a) == 0) {
            uint8_t h[DT_PROTO_HELLO_SIZE];
            dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
            if (write(fds[i], h, sizeof h) == (ssize_t)sizeof h)
                f->opened++;
        }
        dt_sleep_ms(2);
    }
    for (int i = 0; i < RING; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    return NULL;
}

static void test_unauthenticated_flood(void)
{
    char outp[1024];
    int pfd[2];
    snprintf(outp, sizeof outp, "%s/flood_server.out", dt_test_tmpdir());
    DT_REQUIRE(pipe(pfd) == 0);
    pid_t child = fork();
    DT_REQUIRE(child >= 0);
    if (child == 0) {
        int out = open(outp, O_CREAT | O_TRUNC | O_WRONLY, 0644);
        if (out >= 0) {
            dup2(out, 1);
            dup2(out, 2);
            close(out);
        }
        close(pfd[0]);
        struct rlimit rl = {.rlim_cur = 96, .rlim_max = 96};
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            _exit(3);
        dt_store_server_opts o;
        dt_store_server_opts_default(&o);
        o.host = "127.0.0.1";
        o.token = "tok";
        dt_store_server *srv = NULL;
        dt_err e = {0};
        if (dt_store_server_start(&srv, &o, &e) != 0) {
            fprintf(stderr, "server: %s\n", e.msg);
            _exit(4);
        }
        int port = dt_store_server_port(srv);
        if (write(pfd[1], &port, sizeof port) != (ssize_t)sizeof port)
            _exit(5);
        alarm(60); /* never outlives the test */
        for (;;)
            pause();
    }
    close(pfd[1]);
    int port = 0;
    bool got = read(pfd[0], &port, sizeof port) == (ssize_t)sizeof port;
    close(pfd[0]);
    if (!got) {
        kill(child, SIGKILL);
        waitpid(child, NULL, 0);
        char *o = dt_test_slurp(outp);
        DT_CHECK_MSG(false, "the server did not start: %s", o ? o : "");
        free(o);
        return;
    }
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 5000;
    co.timeout_ms = 5000;
    co.token = "tok";
    dt_err err_ = {0}, *err = &err_;
    dt_store *before = NULL, *during = NULL;
    int rc0 = dt_store_connect(&before, "127.0.0.1", port, &co, err);
    flood f = {.port = port};
    pthread_t th;
    DT_REQUIRE(pthread_create(&th, NULL, flood_main, &f) == 0);
    for (double until = dt_test_now() + 10; f.opened < 400 && dt_test_now() < until;)
        dt_sleep_ms(10);
    double t0 = dt_test_now();
    int rc = dt_store_connect(&during, "127.0.0.1", port, &co, err);
    double took = dt_test_now() - t0;
    int rc1 = rc == 0 ? dt_store_set(during, "k", "v", 1, err) : rc;
    void *v = NULL;
    size_t len = 0;
    int rc2 = rc1 == 0 ? dt_store_get(during, "k", &v, &len, 0, err) : rc1;
    int rc3 = rc0 == 0 ? dt_store_ping(before, NULL, err) : rc0;
    long opened = f.opened;
    f.stop = 1;
    pthread_join(th, NULL);
    printf("flood: %ld unauthenticated connections; the client with the token connected in "
           "%.2f s\n", opened, took);
    DT_CHECK_MSG(rc0 == 0, "the first client could not connect: %s", err->msg);
    DT_CHECK_MSG(rc == 0, "a client with the token was locked out by the flood: %s", err->msg);
    DT_CHECK_INT(rc1, 0);
    DT_CHECK_INT(rc2, 0);
    DT_CHECK(len == 1 && v && !memcmp(v, "v", 1));
    DT_CHECK_MSG(rc3 == 0, "the client connected before the flood was cut off");
    DT_CHECK_MSG(opened >= 400, "the flood opened only %ld connections", opened);
    free(v);
    dt_store_free(during);
    dt_store_free(before);
    kill(child, SIGTERM);
    waitpid(child, NULL, 0);
    char *o = dt_test_slurp(outp);
    DT_CHECK_MSG(o && strstr(o, "have not authenticated"), "the server said nothing: %s",
                 o ? o : "(no output)");
    free(o);
}

static void test_storm(void)
{
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.max_connections = 64;
    dt_store_server *srv = start_server(&o);
    int port = dt_store_server_port(srv);
    /* 1,000 connections opened at once (far over the limit), then dropped every which way. */
    enum { N = 1000 };
    static int fds[N];
    int opened = 0;
    for (; opened < N; opened++) {
        fds[opened] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (fds[opened] < 0 || connect(fds[opened], (struct sockaddr *)&a, sizeof a) != 0) {
            if (fds[opened] >= 0)
                close(fds[opened]);
            break;
        }
    }
    DT_CHECK_MSG(opened == N, "only %d connections could be opened", opened);
    for (int i = 0; i < opened; i++) {
        if (i % 3 == 0) {
            struct linger l = {1, 0};
            setsockopt(fds[i], SOL_SOCKET, SO_LINGER, &l, sizeof l);
        } else if (i % 3 == 1) {
            uint8_t h[DT_PROTO_HELLO_SIZE];
            dt_proto_hello_encode(h, DT_PROTO_VERSION, 0);
            (void)!write(fds[i], h, sizeof h);
        }
        close(fds[i]);
    }
    /* Every slot comes back: the limit's worth of real clients can connect and work. */
    dt_store *cs[64] = {0};
    dt_err err_ = {0}, *err = &err_;
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 10000;
    for (int i = 0; i < 64; i++) {
        DT_REQUIRE_OK(dt_store_connect(&cs[i], "127.0.0.1", port, &co, err), err);
        DT_REQUIRE_OK(dt_store_add(cs[i], "storm", 1, NULL, err), err);
    }
    int64_t r = 0;
    DT_REQUIRE_OK(dt_store_add(cs[0], "storm", 0, &r, err), err);
    DT_CHECK_INT(r, 64);
    for (int i = 0; i < 64; i++)
        dt_store_free(cs[i]);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Client: retries, reconnects, timeouts, version mismatch                                    */
/* ------------------------------------------------------------------------------------------ */

/* A free port now (bound, then released). */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    DT_REQUIRE(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
    getsockname(fd, (struct sockaddr *)&a, &l);
    close(fd);
    return ntohs(a.sin_port);
}

typedef struct late_server {
    int port, delay_ms;
    dt_store_server *srv;
} late_server;

static void *start_late(void *arg)
{
    late_server *l = arg;
    dt_sleep_ms(l->delay_ms);
    dt_store_server_opts o;
    dt_store_server_opts_default(&o);
    o.host = "127.0.0.1";
    o.port = l->port;
    dt_err err = {0};
    dt_store_server_start(&l->srv, &o, &err);
    return NULL;
}

/* Retry delays are spread +-50% around the backoff, never the same on every client. */
static void test_backoff_jitter(void)
{
    dt_rng a, b;
    dt_rng_seed2(&a, 1, 100);
    dt_rng_seed2(&b, 1, 101);
    int lo = 1 << 30, hi = 0, same = 0;
    for (int i = 0; i < 1000; i++) {
        int d = dt_store_backoff_jitter_ms(&a, 100);
        DT_CHECK_MSG(d >= 50 && d <= 150, "delay %d ms for a 100 ms backoff", d);
        lo = DT_MIN(lo, d);
        hi = DT_MAX(hi, d);
        same += d == dt_store_backoff_jitter_ms(&b, 100);
    }
    DT_CHECK_MSG(lo < 60 && hi > 140, "delays only span %d..%d ms", lo, hi);
    DT_CHECK_MSG(same < 100, "two clients drew the same delay %d times in 1000", same);
    DT_CHECK_INT(dt_store_backoff_jitter_ms(&a, 0), 0);
    int d1 = dt_store_backoff_jitter_ms(&a, 1);
    DT_CHECK(d1 >= 0 && d1 <= 1);
}

static void test_connect_retry(void)
{
    dt_err err_ = {0}, *err = &err_;
    /* Nobody listening: refused after the connect timeout, with a useful message. */
    int port = free_port();
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 300;
    dt_store *s = NULL;
    uint64_t t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), -ECONNREFUSED);
    double el = (double)(dt_now_ns() - t0) * 1e-6;
    DT_CHECK_MSG(el >= 250 && el < 5000, "connect gave up after %.0f ms (timeout 300)", el);
    DT_CHECK_CONTAINS(err->msg, "attempts");
    /* The server comes up later: connect retries until it is there. */
    late_server l = {port, 300, NULL};
    pthread_t t;
    pthread_create(&t, NULL, start_late, &l);
    co.connect_timeout_ms = 10000;
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), 0);
    pthread_join(t, NULL);
    DT_REQUIRE(l.srv != NULL);
    if (err->code == 0) {
        DT_CHECK_INT(dt_store_set(s, "k", "v", 1, err), 0);
        /* The server restarts on the same port: the next calls reconnect transparently,
         * including an ADD (a hang-up is detected before the request is sent). */
        dt_store_server_stop(l.srv);
        l.delay_ms = 200;
        l.srv = NULL;
        pthread_create(&t, NULL, start_late, &l);
        DT_CHECK_INT(dt_store_ping(s, NULL, err), 0);
        pthread_join(t, NULL);
        DT_REQUIRE(l.srv != NULL);
        int64_t r = 0;
        DT_CHECK_INT(dt_store_add(s, "n", 1, &r, err), 0);
        DT_CHECK_INT(r, 1);
        dt_store_free(s);
    }
    dt_store_server_stop(l.srv);
}

typedef struct fake_server {
    int lfd, port;
    uint16_t version;
    int hold_ms;
    int drop; /* close as soon as a request has arrived, without answering */
} fake_server;

/* Accepts connections, sends a hello with the given version, then never answers (holding the
 * connection hold_ms, or dropping it once a request arrived). */
static void *fake_main(void *arg)
{
    fake_server *f = arg;
    for (;;) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            return NULL;
        uint8_t h[DT_PROTO_HELLO_SIZE];
        dt_proto_hello_encode(h, f->version, 0);
        (void)!write(fd, h, sizeof h);
        if (f->drop) {
            uint8_t buf[DT_PROTO_HELLO_SIZE + DT_PROTO_LEN_SIZE + DT_PROTO_HDR_SIZE];
            struct timeval tv = {.tv_sec = 5};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            (void)!dt_read_all(fd, buf, sizeof buf);
        } else {
            dt_sleep_ms(f->hold_ms);
        }
        close(fd);
    }
}

static void start_fake(fake_server *f, pthread_t *t)
{
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t l = sizeof a;
    DT_REQUIRE(bind(f->lfd, (struct sockaddr *)&a, sizeof a) == 0);
    DT_REQUIRE(listen(f->lfd, 16) == 0);
    getsockname(f->lfd, (struct sockaddr *)&a, &l);
    f->port = ntohs(a.sin_port);
    pthread_create(t, NULL, fake_main, f);
}

static void *stop_later(void *arg)
{
    dt_sleep_ms(200);
    dt_store_server_stop(arg);
    return NULL;
}

/* A waiting call whose server goes away reconnects only until its own deadline. */
static void test_wait_server_gone(void)
{
    dt_store_server *srv = start_server(NULL);
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    pthread_t t;
    pthread_create(&t, NULL, stop_later, srv);
    void *v = NULL;
    size_t n = 0;
    uint64_t t0 = dt_now_ns();
    int rc = dt_store_get(s, "never", &v, &n, 1500, err);
    double el = (double)(dt_now_ns() - t0) * 1e-6;
    pthread_join(t, NULL);
    DT_CHECK(rc < 0);
    DT_CHECK_MSG(el < 3500, "a 1500 ms GET whose server left returned after %.0f ms: %s", el,
                 err->msg);
    dt_store_free(s);
}

static void test_client_timeouts(void)
{
    dt_err err_ = {0}, *err = &err_;
    /* A server that completes the handshake and then never replies. */
    fake_server f = {.version = DT_PROTO_VERSION, .hold_ms = 3000};
    pthread_t t;
    start_fake(&f, &t);
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.connect_timeout_ms = 2000;
    co.timeout_ms = 300;
    dt_store *s = NULL;
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", f.port, &co, err), err);
    uint64_t t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_set(s, "k", "v", 1, err), -ETIMEDOUT);
    double el = (double)(dt_now_ns() - t0) * 1e-6;
    DT_CHECK_MSG(el >= 250 && el < 3000, "set gave up after %.0f ms (timeout 300)", el);
    DT_CHECK_CONTAINS(err->msg, "no reply");
    dt_store_free(s);

    /* A waiting call on a server that never answers gives up soon after its own timeout
     * (a grace of a tenth of it, at least 250 ms), not seconds later. */
    fake_server fw = {.version = DT_PROTO_VERSION, .hold_ms = 8000};
    pthread_t tw;
    start_fake(&fw, &tw);
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", fw.port, &co, err), err);
    void *v = NULL;
    size_t vn = 0;
    t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_get(s, "k", &v, &vn, 1000, err), -ETIMEDOUT);
    el = (double)(dt_now_ns() - t0) * 1e-6;
    DT_CHECK_MSG(el >= 950 && el < 3000, "a 1000 ms GET gave up after %.0f ms", el);
    dt_store_free(s);

    /* Something that accepts connections and never speaks: each attempt waits a short while
     * for the hello, and the error says what it looks like. */
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    DT_REQUIRE(bind(lfd, (struct sockaddr *)&a, sizeof a) == 0 && listen(lfd, 16) == 0);
    getsockname(lfd, (struct sockaddr *)&a, &al);
    co.connect_timeout_ms = 2500;
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", ntohs(a.sin_port), &co, err),
                 -ECONNREFUSED);
    DT_CHECK_CONTAINS(err->msg, "accepted the connection but sent no dtrain store handshake");
    DT_CHECK_CONTAINS(err->msg, "another service");
    DT_CHECK_CONTAINS(err->msg, "attempts over");
    close(lfd);

    /* A server of another protocol version: a clear, immediate error. */
    fake_server g = {.version = DT_PROTO_VERSION + 1, .hold_ms = 10};
    pthread_t t2;
    start_fake(&g, &t2);
    co.connect_timeout_ms = 20000;
    t0 = dt_now_ns();
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", g.port, &co, err), -EPROTO);
    DT_CHECK_CONTAINS(err->msg, "version");
    DT_CHECK((dt_now_ns() - t0) / 1000000 < 5000);

    /* A connection lost after an ADD was sent: an error that says so, never a silent retry
     * (it may have been applied). An idempotent op is retried, then fails the same way. */
    fake_server d = {.version = DT_PROTO_VERSION, .drop = 1};
    pthread_t t3;
    start_fake(&d, &t3);
    co.connect_timeout_ms = 2000;
    co.timeout_ms = 1000;
    DT_REQUIRE_OK(dt_store_connect(&s, "127.0.0.1", d.port, &co, err), err);
    DT_CHECK_INT(dt_store_add(s, "n", 1, NULL, err), -ECONNRESET);
    DT_CHECK_CONTAINS(err->msg, "may or may not");
    DT_CHECK_INT(dt_store_set(s, "k", "v", 1, err), -ECONNRESET);
    DT_CHECK_CONTAINS(err->msg, "connection lost");
    dt_store_free(s);
    /* the fake threads end with the test process */
}

/* The standalone server with a token file, and with DTRAIN_STORE_TOKEN. */
static void test_standalone_token(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/token", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f);
    fputs("file-token\n", f);
    fclose(f);
    char args[4200];
    snprintf(args, sizeof args, "--token-file '%s'", path);
    int port = 0;
    pid_t pid = spawn_store(args, &port, NULL);
    DT_REQUIRE(port > 0);
    dt_err err_ = {0}, *err = &err_;
    dt_store_opts co;
    dt_store_opts_default(&co);
    co.token = "file-token";
    dt_store *s = NULL;
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), 0);
    dt_store_free(s);
    co.token = "nope";
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), -EACCES);
    kill(pid, SIGTERM);
    DT_CHECK_INT(wait_exit(pid, 10000), 0);

    pid = spawn_store("", &port, "env-token");
    DT_REQUIRE(port > 0);
    co.token = "env-token";
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), 0);
    dt_store_free(s);
    co.token = NULL;
    unsetenv("DTRAIN_STORE_TOKEN");
    co.connect_timeout_ms = 2000;
    DT_CHECK_INT(dt_store_connect(&s, "127.0.0.1", port, &co, err), -EACCES);
    kill(pid, SIGTERM);
    DT_CHECK_INT(wait_exit(pid, 10000), 0);

    /* A port in use is a clear error, not a crash. */
    dt_store_server *srv = start_server(NULL);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' store --host 127.0.0.1 --port %d", dt_test_dtrain_bin(),
             dt_store_server_port(srv));
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 1);
    DT_CHECK_CONTAINS(out, "in use");
    free(out);
    dt_store_server_stop(srv);
}

/* ------------------------------------------------------------------------------------------ */
/* Fuzz corpus                                                                                */
/* ------------------------------------------------------------------------------------------ */

/* Replays tests/fuzz/corpus/ through the parser's self-check, then through a live server. */
static void test_proto_corpus(void)
{
    /* dt_test_dtrain_bin() is BUILD/dtrain; the corpus is in the source tree beside BUILD. */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", dt_test_dtrain_bin());
    char *last = strrchr(dir, '/');
    DT_REQUIRE(last);
    snprintf(last, sizeof dir - (size_t)(last - dir), "/../tests/fuzz/corpus");
    DIR *d = opendir(dir);
    DT_CHECK_MSG(d != NULL, "cannot open the fuzz corpus %s", dir);
    DT_REQUIRE(d);
    dt_store_server *srv = start_server(NULL);
    int port = dt_store_server_port(srv);
    dt_proto_limits lim = {.max_frame = 4096, .max_key = 64, .max_value = 1024, .max_items = 16};
    struct dirent *de;
    int files = 0;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[8192];
        snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
        char *data = NULL;
        size_t len = 0;
        dt_err err = {0};
        DT_REQUIRE(dt_read_file(path, &data, &len, &err) == 0);
        int frames = dt_proto_check_stream((const uint8_t *)data, len, &lim);
        DT_CHECK_MSG(frames >= 0, "corpus %s: the parser broke a promise", de->d_name);
        /* Non-blocking ops only, so the server answers without waiting: send and drop. */
        int fd = raw_hello(port);
        DT_REQUIRE(dt_write_all(fd, data, len) == 0);
        close(fd);
        free(data);
        files++;
    }
    closedir(d);
    DT_CHECK_MSG(files >= 20, "only %d corpus files in %s", files, dir);
    check_alive(srv);
    dt_store_server_stop(srv);
}

static const dt_test tests[] = {
    {"proto_roundtrip", test_proto_roundtrip, 0},
    {"proto_rejects", test_proto_rejects, 0},
    {"ops", test_ops, 0},
    {"prefixed", test_prefixed, 0},
    {"wait_wakeups", test_wait_wakeups, 0},
    {"wait_timeouts", test_wait_timeouts, 0},
    {"concurrent_adds", test_concurrent_adds, 60},
    {"cas_race", test_cas_race, 60},
    {"cas_torch", test_cas_torch, 60},
    {"input_budget", test_input_budget, 60},
    {"input_stall", test_input_stall, 60},
    {"input_stall_progress", test_input_stall_progress, 60},
    {"standalone", test_standalone, 60},
    {"wait_many_keys", test_wait_many_keys, 60},
    {"token", test_token, 60},
    {"limits", test_server_limits, 60},
    {"garbage", test_garbage, 60},
    {"mid_frame", test_mid_frame, 60},
    {"slow_reader", test_slow_reader, 60},
    {"big_replies", test_big_replies, 60},
    {"handshake_timeout", test_handshake_timeout, 60},
    {"unauthenticated_flood", test_unauthenticated_flood, 90},
    {"storm", test_storm, 60},
    {"backoff_jitter", test_backoff_jitter, 0},
    {"connect_retry", test_connect_retry, 60},
    {"client_timeouts", test_client_timeouts, 60},
    {"wait_server_gone", test_wait_server_gone, 60},
    {"standalone_token", test_standalone_token, 60},
    {"proto_corpus", test_proto_corpus, 60},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_store", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
