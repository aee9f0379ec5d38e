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
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/protocol.h"
#include "rendezvous/store.h"
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

/* Raw connection past the handshake (reads the server hello, sends ours). */
static int raw_hello(int port)
{
    int fd = raw_connect(port);
    uint8_t h[DT_PROTO_HELLO_SIZE];
    DT_REQUIRE(dt_read_all(fd, h, sizeof h) == 0);
    uint16_t ver, flags;
    DT_REQUIRE(dt_proto_hello_decode(h, &ver, &flags) == 0);
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

static void check_alive(dt_store_server *srv)
{
    dt_store *s = connect_to(srv, NULL);
    dt_err err_ = {0}, *err = &err_;
    DT_CHECK_INT(dt_store_set(s, "alive", "yes", 3, err), 0);
    void *v = NULL;
    size_t n = 0;
    DT_CHECK_INT(dt_store_get(s, "alive", &v, &n, 0, err), 0);
    DT_CHECK(n == 3 && v && !memcmp(v, "yes", 3));
    free(v);
    dt_store_free(s);
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
    DT_CHECK_INT(n, 0); /* absent and expected non-empty: no swap, empty current */
    free(v);
    DT_REQUIRE_OK(dt_store_cas(s, "c", "two", 3, "three", 5, NULL, NULL, err), err);

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
    /* The connection is still good, and the timed-out waits left no key behind. */
    int64_t nk = -1;
    DT_REQUIRE_OK(dt_store_num_keys(s, &nk, err), err);
    DT_CHECK_INT(nk, 0);
    /* A waiter that disconnects is cleaned up: the key it waited on can still be set. */
    int fd = raw_hello(dt_store_server_port(srv));
    dt_proto_buf b = {0};
    size_t st = dt_proto_begin(&b, DT_OP_GET, 1, 60000, 1, 0);
    dt_proto_put_item(&b, "never", 5);
    dt_proto_end(&b, st);
    DT_REQUIRE(dt_write_all(fd, b.data, b.len) == 0);
    dt_sleep_ms(50);
    close(fd);
    dt_sleep_ms(50);
    DT_REQUIRE_OK(dt_store_set(s, "never", "1", 1, err), err);
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

    char *out = NULL;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "'%s' store --help", dt_test_dtrain_bin());
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 0);
    DT_CHECK_CONTAINS(out, "--token-file");
    free(out);
    snprintf(cmd, sizeof cmd, "'%s' store --prot 5", dt_test_dtrain_bin());
    DT_CHECK_INT(dt_test_run(cmd, &out, 10), 2);
    DT_CHECK_CONTAINS(out, "--port");
    free(out);
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
    {"standalone", test_standalone, 60},
};

int main(int argc, char **argv)
{
    (void)check_alive;
    (void)raw_reply;
    (void)raw_closed_by_server;
    return dt_test_main("test_store", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
