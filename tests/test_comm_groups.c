/* test_comm_groups.c - communicators split from a world (dt_comm_split, dt_comm_global_rank)
 * and point-to-point (dt_comm_p2p, dt_comm_send, dt_comm_recv) on the cpu backend: membership
 * and ranks for every split shape, collectives on groups, groups in flight at once in opposite
 * orders, groups across emulated hosts (shared memory, TCP ring, hierarchical, flat TCP), and
 * point-to-point rings, bidirectional batches of 16 MiB, ordering of many small messages,
 * mismatched counts, dead and stalled peers; the per-communicator counters (dt_comm_stats) and
 * completion times (dt_comm_wait_done).
 *
 * Ranks are forked processes that bootstrap through a real store server on 127.0.0.1; hosts are
 * emulated with DTRAIN_COMM_HOST_ID (a comma-separated host id per rank), DTRAIN_COMM_TRANSPORT
 * forces flat TCP. Values are small integers, exact in every type, compared bit for bit. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/comm/comm.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

/* ------------------------------------------------------------------------------------------ */
/* A group of forked ranks (as in test_comm.c)                                                */
/* ------------------------------------------------------------------------------------------ */

typedef dt_test_world world;
typedef dt_test_rank rank_ctx;
typedef dt_test_world_fn rank_fn;

/* Runs fn on w->n forked ranks against a fresh store; status[r] as waitpid reports it. */
static void run_world_status(world *w, rank_fn fn, void *arg, int limit_s, int *status)
{
    static int counter;
    snprintf(w->run_id, sizeof w->run_id, "tg-%d-%d", (int)getpid(), ++counter);
    dt_test_world_run(w, fn, arg, limit_s, status);
}

static void run_world(world *w, rank_fn fn, void *arg, int limit_s)
{
    int status[16];
    run_world_status(w, fn, arg, limit_s, status);
    for (int r = 0; r < w->n; r++)
        DT_CHECK_MSG(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0,
                     "rank %d of %d (transport %s, hosts \"%s\") ended with status %d", r, w->n,
                     w->transport ? w->transport : "auto", w->hosts ? w->hosts : "", status[r]);
}

/* ------------------------------------------------------------------------------------------ */
/* Splits                                                                                     */
/* ------------------------------------------------------------------------------------------ */

/* A split rule: color and key of each rank (up to 8). */
typedef struct split_rule {
    int color[8], key[8];
} split_rule;

/* What rank r's group must be under rule s in a world of n: its members (ranks of the parent,
 * ordered by key then rank) and r's index; -1 when r joins none. */
static int expected_group(const split_rule *s, int n, int r, int *members, int *m)
{
    *m = 0;
    if (s->color[r] < 0)
        return -1;
    for (int k = -100; k <= 100; k++) /* keys are small: order by key, then rank */
        for (int q = 0; q < n; q++)
            if (s->color[q] == s->color[r] && s->key[q] == k)
                members[(*m)++] = q;
    for (int i = 0; i < *m; i++)
        if (members[i] == r)
            return i;
    return -2;
}

/* Checks group g of rank x (from rule s over parent ranks `parent_global`): its size, rank,
 * global ranks, and an allreduce (sum of global ranks + 1) and allgather (global ranks). */
static void check_group(rank_ctx *x, dt_comm *g, const split_rule *s, int n, int prank,
                        const int *parent_global)
{
    int members[8], m;
    int me = expected_group(s, n, prank, members, &m);
    dt_err err = {0};
    if (me < 0) {
        RCHECK(g == NULL, "rank %d with color %d got a group", x->rank, s->color[prank]);
        return;
    }
    RCHECK(g != NULL, "rank %d (color %d) got no group", x->rank, s->color[prank]);
    if (!g)
        return;
    RCHECK(dt_comm_world_size(g) == m, "rank %d: group of %d, expected %d", x->rank,
           dt_comm_world_size(g), m);
    RCHECK(dt_comm_rank(g) == me, "rank %d: rank %d in the group, expected %d", x->rank,
           dt_comm_rank(g), me);
    int64_t want_sum = 0;
    for (int i = 0; i < m; i++) {
        int gl = parent_global[members[i]];
        RCHECK(dt_comm_global_rank(g, i) == gl, "rank %d: group rank %d has global rank %d, "
               "expected %d", x->rank, i, dt_comm_global_rank(g, i), gl);
        want_sum += gl + 1;
    }
    RCHECK(dt_comm_global_rank(g, m) == -1, "out of range global rank");
    int64_t v[3] = {x->rank + 1, 2 * (x->rank + 1), -(x->rank + 1)};
    int rc = dt_comm_allreduce(g, v, 3, DT_INT64, DT_SUM, NULL, &err);
    RCHECK(rc == 0, "rank %d: group allreduce: %s", x->rank, err.msg);
    RCHECK(v[0] == want_sum && v[1] == 2 * want_sum && v[2] == -want_sum,
           "rank %d: group allreduce %lld %lld %lld, expected %lld", x->rank, (long long)v[0],
           (long long)v[1], (long long)v[2], (long long)want_sum);
    int32_t mine = x->rank, all[8] = {0};
    rc = dt_comm_allgather(g, &mine, all, 1, DT_INT32, NULL, &err);
    RCHECK(rc == 0, "rank %d: group allgather: %s", x->rank, err.msg);
    for (int i = 0; i < m; i++)
        RCHECK(all[i] == parent_global[members[i]], "rank %d: allgather[%d] = %d, expected %d",
               x->rank, i, all[i], parent_global[members[i]]);
}

typedef struct split_case {
    split_rule rule;
    split_rule nested; /* applied to the group's ranks when nested_on */
    bool nested_on;
} split_case;

static void split_rank(rank_ctx *x, void *arg)
{
    const split_case *sc = arg;
    dt_err err = {0};
    int ident[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    RCHECK(dt_comm_global_rank(x->c, x->rank) == x->rank, "world global rank");
    /* a collective of the parent still in flight: the split runs after it, in issue order */
    int64_t before = x->rank;
    dt_comm_work *wb = NULL;
    int rc = dt_comm_allreduce(x->c, &before, 1, DT_INT64, DT_SUM, &wb, &err);
    RCHECK(rc == 0, "async allreduce: %s", err.msg);
    dt_comm *g = NULL;
    rc = dt_comm_split(x->c, x->store, sc->rule.color[x->rank], sc->rule.key[x->rank], &g, &err);
    RCHECK(rc == 0, "rank %d: split: %s", x->rank, err.msg);
    rc = dt_comm_wait(x->c, wb, &err);
    RCHECK(rc == 0 && before == (int64_t)x->n * (x->n - 1) / 2, "allreduce before split: %lld %s",
           (long long)before, err.msg);
    check_group(x, g, &sc->rule, x->n, x->rank, ident);
    /* The world still works, and a second split of it gets a namespace of its own. */
    int64_t one = 1;
    rc = dt_comm_allreduce(x->c, &one, 1, DT_INT64, DT_SUM, NULL, &err);
    RCHECK(rc == 0 && one == x->n, "rank %d: world allreduce after split: %s", x->rank, err.msg);
    if (g && sc->nested_on) {
        int gr = dt_comm_rank(g), gn = dt_comm_world_size(g), gglob[8];
        for (int i = 0; i < gn; i++)
            gglob[i] = dt_comm_global_rank(g, i);
        dt_comm *h = NULL;
        rc = dt_comm_split(g, x->store, sc->nested.color[gr], sc->nested.key[gr], &h, &err);
        RCHECK(rc == 0, "rank %d: nested split: %s", x->rank, err.msg);
        check_group(x, h, &sc->nested, gn, gr, gglob);
        dt_comm_free(h);
    }
    dt_comm_free(g);
}

static void test_split_shapes(void)
{
    /* 4 ranks: two colors, keys reversing the order */
    split_case a = {.rule = {{0, 1, 0, 1}, {0, 0, -1, -5}}};
    world w = {.n = 4};
    run_world(&w, split_rank, &a, 40);
    /* 4 ranks: one rank joins none, one group of one, one of two with equal keys */
    split_case b = {.rule = {{-1, 7, 3, 3}, {0, 9, 2, 2}}};
    run_world(&w, split_rank, &b, 40);
    /* 3 ranks: all in one group in reverse order, then a nested split of it */
    split_case c = {.rule = {{5, 5, 5}, {3, 2, 1}},
                    .nested = {{0, 1, 0}, {1, 0, 0}},
                    .nested_on = true};
    world w3 = {.n = 3};
    run_world(&w3, split_rank, &c, 40);
    /* 2 ranks: both alone */
    split_case d = {.rule = {{0, 1}, {0, 0}}};
    world w2 = {.n = 2};
    run_world(&w2, split_rank, &d, 40);
}

static void test_split_hosts(void)
{
    /* groups across two emulated hosts: {0,2} and {1,3} are one rank per host (TCP ring) */
    split_case a = {.rule = {{0, 1, 0, 1}, {0, 0, 0, 0}}};
    world w = {.n = 4, .hosts = "a,a,b,b"};
    run_world(&w, split_rank, &a, 60);
    /* {0,1,3}: two ranks on one host and one on another (flat TCP); {2} alone; then a nested
     * split into {0,1} (shared memory) and {3} */
    split_case b = {.rule = {{0, 0, 1, 0}, {0, 1, 0, 2}},
                    .nested = {{0, 0, 1}, {0, 0, 0}},
                    .nested_on = true};
    world w2 = {.n = 4, .hosts = "a,a,b,b"};
    run_world(&w2, split_rank, &b, 60);
    /* a hierarchical group: {0,1,2,3} reversed on hosts a,a,b,b; world forced to flat TCP */
    split_case c = {.rule = {{0, 0, 0, 0}, {3, 2, 1, 0}}};
    run_world(&w, split_rank, &c, 60);
    world wt = {.n = 4, .hosts = "a,a,b,b", .transport = "tcp"};
    run_world(&wt, split_rank, &a, 60);
}

/* A 2x2 grid: tp groups {0,1},{2,3}; dp groups {0,2},{1,3}. Even ranks issue tp then dp, odd
 * ranks dp then tp, asynchronously, with buffers large enough to be in flight together. */
static void grid_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    dt_comm *tp = NULL, *dp = NULL;
    int rc = dt_comm_split(x->c, x->store, x->rank / 2, x->rank, &tp, &err);
    RCHECK(rc == 0, "tp split: %s", err.msg);
    rc = dt_comm_split(x->c, x->store, x->rank % 2, x->rank, &dp, &err);
    RCHECK(rc == 0, "dp split: %s", err.msg);
    if (!tp || !dp)
        return;
    const size_t n = (size_t)1 << 20;
    float *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    for (int it = 0; it < 4; it++) {
        for (size_t i = 0; i < n; i++) {
            a[i] = (float)(x->rank + (int)(i % 5) + it);
            b[i] = (float)(10 * x->rank - (int)(i % 3));
        }
        dt_comm_work *wa = NULL, *wb = NULL;
        if (x->rank % 2 == 0) {
            rc = dt_comm_allreduce(tp, a, n, DT_FLOAT32, DT_SUM, &wa, &err);
            rc = rc ? rc : dt_comm_allreduce(dp, b, n, DT_FLOAT32, DT_SUM, &wb, &err);
        } else {
            rc = dt_comm_allreduce(dp, b, n, DT_FLOAT32, DT_SUM, &wb, &err);
            rc = rc ? rc : dt_comm_allreduce(tp, a, n, DT_FLOAT32, DT_SUM, &wa, &err);
        }
        RCHECK(rc == 0, "issue: %s", err.msg);
        if (x->rank % 2 == 0) {
            rc = dt_comm_wait(dp, wb, &err);
            rc = rc ? rc : dt_comm_wait(tp, wa, &err);
        } else {
            rc = dt_comm_wait(tp, wa, &err);
            rc = rc ? rc : dt_comm_wait(dp, wb, &err);
        }
        RCHECK(rc == 0, "rank %d: wait: %s", x->rank, err.msg);
        int t0 = (x->rank / 2) * 2, d0 = x->rank % 2;
        bool ok = true;
        for (size_t i = 0; i < n && ok; i++) {
            float wa_ = (float)(t0 + t0 + 1 + 2 * ((int)(i % 5) + it));
            float wb_ = (float)(10 * d0 + 10 * (d0 + 2) - 2 * (int)(i % 3));
            ok = a[i] == wa_ && b[i] == wb_;
            RCHECK(ok, "rank %d it %d: a[%zu] = %g (want %g), b = %g (want %g)", x->rank, it, i,
                   a[i], wa_, b[i], wb_);
        }
    }
    free(a);
    free(b);
    dt_comm_free(dp);
    dt_comm_free(tp);
}

static void test_concurrent_groups(void)
{
    world w = {.n = 4};
    run_world(&w, grid_rank, NULL, 60);
    world h = {.n = 4, .hosts = "a,a,b,b"}; /* tp on a host (shm), dp across hosts (TCP) */
    run_world(&h, grid_rank, NULL, 60);
}

/* ------------------------------------------------------------------------------------------ */
/* Point-to-point                                                                             */
/* ------------------------------------------------------------------------------------------ */

static int32_t pv(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 7919 + (int)i); }

/* Every rank sends to the next and receives from the previous, in one batch; then the reverse
 * direction with two separate async calls. */
static void ring_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    const size_t n = 300007;
    int next = (x->rank + 1) % x->n, prev = (x->rank + x->n - 1) % x->n;
    int32_t *s = malloc(n * 4), *r = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        s[i] = pv(x->rank, next, i);
    dt_p2p_op ops[2] = {{DT_P2P_RECV, r, n, DT_INT32, prev}, {DT_P2P_SEND, s, n, DT_INT32, next}};
    int rc = dt_comm_p2p(x->c, ops, 2, NULL, &err);
    RCHECK(rc == 0, "rank %d: ring batch: %s", x->rank, err.msg);
    for (size_t i = 0; i < n && rc == 0; i++)
        if (r[i] != pv(prev, x->rank, i)) {
            RCHECK(false, "rank %d: r[%zu] = %d, want %d", x->rank, i, r[i], pv(prev, x->rank, i));
            break;
        }
    for (size_t i = 0; i < n; i++)
        s[i] = pv(x->rank, prev, i);
    dt_comm_work *ws = NULL, *wr = NULL;
    rc = dt_comm_send(x->c, s, n, DT_INT32, prev, &ws, &err);
    RCHECK(rc == 0, "send: %s", err.msg);
    rc = dt_comm_recv(x->c, r, n, DT_INT32, next, &wr, &err);
    RCHECK(rc == 0, "recv: %s", err.msg);
    rc = dt_comm_wait(x->c, wr, &err);
    RCHECK(rc == 0, "rank %d: wait recv: %s", x->rank, err.msg);
    rc = dt_comm_wait(x->c, ws, &err);
    RCHECK(rc == 0, "rank %d: wait send: %s", x->rank, err.msg);
    for (size_t i = 0; i < n; i++)
        if (r[i] != pv(next, x->rank, i)) {
            RCHECK(false, "rank %d: reverse r[%zu] = %d", x->rank, i, r[i]);
            break;
        }
    /* collectives still run on the same communicator, and a send to oneself is refused */
    int64_t one = 1;
    rc = dt_comm_allreduce(x->c, &one, 1, DT_INT64, DT_SUM, NULL, &err);
    RCHECK(rc == 0 && one == x->n, "allreduce after p2p: %s", err.msg);
    rc = dt_comm_send(x->c, s, 1, DT_INT32, x->rank, NULL, &err);
    RCHECK(rc == -EINVAL, "send to self: rc %d", rc);
    free(s);
    free(r);
}

static void test_p2p_ring(void)
{
    world a = {.n = 4};
    run_world(&a, ring_rank, NULL, 40);
    world b = {.n = 4, .hosts = "a,a,b,b"};
    run_world(&b, ring_rank, NULL, 40);
    world c = {.n = 3, .transport = "tcp"};
    run_world(&c, ring_rank, NULL, 40);
    world d = {.n = 2};
    run_world(&d, ring_rank, NULL, 40);
}

/* 16 MiB each way between ranks 0 and 1 in one batch (send first, so a design that waits for
 * the send before receiving deadlocks); prints the time of the exchange. */
static void bidir_rank(rank_ctx *x, void *arg)
{
    const char *label = arg;
    dt_err err = {0};
    const size_t n = (16u << 20) / 4;
    int peer = 1 - x->rank;
    int32_t *s = malloc(n * 4), *r = malloc(n * 4);
    for (size_t i = 0; i < n; i++)
        s[i] = pv(x->rank, peer, i);
    dt_p2p_op ops[2] = {{DT_P2P_SEND, s, n, DT_INT32, peer}, {DT_P2P_RECV, r, n, DT_INT32, peer}};
    double best = 1e9;
    for (int it = 0; it < 3; it++) {
        memset(r, 0, n * 4);
        int rc = dt_comm_barrier(x->c, &err);
        RCHECK(rc == 0, "barrier: %s", err.msg);
        double t0 = dt_now_s();
        rc = dt_comm_p2p(x->c, ops, 2, NULL, &err);
        double t = dt_now_s() - t0;
        best = DT_MIN(best, t);
        RCHECK(rc == 0, "rank %d: 16 MiB exchange: %s", x->rank, err.msg);
        for (size_t i = 0; i < n && rc == 0; i++)
            if (r[i] != pv(peer, x->rank, i)) {
                RCHECK(false, "rank %d: r[%zu] = %d", x->rank, i, r[i]);
                break;
            }
    }
    if (x->rank == 0)
        printf("    p2p %s: 16 MiB each way in %.1f ms (best of 3): %.2f GB/s per direction\n",
               label, best * 1e3, (double)(n * 4) / best / 1e9);
    /* one direction only: rank 0 sends 16 MiB to rank 1 */
    for (int it = 0; it < 3; it++) {
        dt_comm_barrier(x->c, &err);
        double t0 = dt_now_s();
        int rc = x->rank == 0 ? dt_comm_send(x->c, s, n, DT_INT32, 1, NULL, &err)
                              : dt_comm_recv(x->c, r, n, DT_INT32, 0, NULL, &err);
        RCHECK(rc == 0, "one-way: %s", err.msg);
        dt_comm_barrier(x->c, &err);
        double t = dt_now_s() - t0;
        if (it == 0 || t < best)
            best = t;
    }
    if (x->rank == 0)
        printf("    p2p %s: 16 MiB one way in %.1f ms (best of 3, with a barrier): %.2f GB/s\n",
               label, best * 1e3, (double)(n * 4) / best / 1e9);
    /* the same volume as two one-way transfers in a row, for comparison */
    for (int it = 0; it < 3; it++) {
        dt_comm_barrier(x->c, &err);
        double t0 = dt_now_s();
        int rc = x->rank == 0 ? dt_comm_send(x->c, s, n, DT_INT32, 1, NULL, &err)
                              : dt_comm_recv(x->c, r, n, DT_INT32, 0, NULL, &err);
        rc = rc ? rc
                : x->rank == 0 ? dt_comm_recv(x->c, r, n, DT_INT32, 1, NULL, &err)
                               : dt_comm_send(x->c, s, n, DT_INT32, 0, NULL, &err);
        RCHECK(rc == 0, "two-way in a row: %s", err.msg);
        double t = dt_now_s() - t0;
        if (it == 0 || t < best)
            best = t;
    }
    if (x->rank == 0)
        printf("    p2p %s: 16 MiB one way then back in %.1f ms (best of 3)\n", label,
               best * 1e3);
    /* latency: 200 blocking round trips of one int32 */
    dt_comm_barrier(x->c, &err);
    double t0 = dt_now_s();
    for (int k = 0; k < 200; k++) {
        int32_t v = k, got = -1;
        int rc = x->rank == 0 ? dt_comm_send(x->c, &v, 1, DT_INT32, 1, NULL, &err)
                              : dt_comm_recv(x->c, &got, 1, DT_INT32, 0, NULL, &err);
        rc = rc ? rc
                : x->rank == 0 ? dt_comm_recv(x->c, &got, 1, DT_INT32, 1, NULL, &err)
                               : dt_comm_send(x->c, &got, 1, DT_INT32, 0, NULL, &err);
        RCHECK(rc == 0 && (x->rank == 1 || got == k), "round trip %d: got %d: %s", k, got,
               err.msg);
        if (rc)
            break;
    }
    if (x->rank == 0)
        printf("    p2p %s: %.0f us per round trip of 4 bytes (200 blocking send+recv)\n", label,
               (dt_now_s() - t0) / 200 * 1e6);
    /* delivery after a wait: rank 1's receive is posted ~3 ms before rank 0 sends; the message
     * carries its send time (CLOCK_MONOTONIC is one clock for both processes) */
    double worst = 0, sum = 0;
    for (int k = 0; k < 20; k++) {
        double stamp = 0;
        int rc;
        if (x->rank == 0) {
            dt_sleep_ms(3);
            stamp = dt_now_s();
            rc = dt_comm_send(x->c, &stamp, 1, DT_FLOAT64, 1, NULL, &err);
        } else {
            rc = dt_comm_recv(x->c, &stamp, 1, DT_FLOAT64, 0, NULL, &err);
            double d = dt_now_s() - stamp;
            sum += d;
            worst = DT_MAX(worst, d);
        }
        RCHECK(rc == 0, "wait %d: %s", k, err.msg);
    }
    if (x->rank == 1)
        printf("    p2p %s: a receive waiting ~3 ms gets its 8 bytes %.0f us after the send "
               "starts (mean of 20, worst %.0f us)\n",
               label, sum / 20 * 1e6, worst * 1e6);
    fflush(stdout);
    free(s);
    free(r);
}

static void test_p2p_bidirectional(void)
{
    world a = {.n = 2};
    run_world(&a, bidir_rank, "shared memory", 60);
    world b = {.n = 2, .hosts = "a,b"};
    run_world(&b, bidir_rank, "TCP", 60);
}

/* Rank 0 sends 3000 small messages of varying sizes and dtypes to rank 1 in batches and single
 * async sends; rank 1 receives them in the same order with other batch shapes. Then the other
 * way. Every message carries its number. */
static size_t small_len(int k) { return (size_t)(k * 37 % 50); }

static void small_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    enum { N = 3000 };
    int64_t **bufs = calloc(N, sizeof *bufs);
    for (int k = 0; k < N; k++) {
        bufs[k] = calloc(small_len(k) + 1, 8);
        for (size_t i = 0; i < small_len(k); i++)
            bufs[k][i] = x->rank == 0 ? (int64_t)k * 1000 + (int64_t)i : -1;
    }
    for (int dir = 0; dir < 2; dir++) {
        bool sender = x->rank == dir;
        int peer = 1 - x->rank;
        /* the sender batches by 100, the receiver by 7, with single calls every 13th */
        int per = sender ? 100 : 7;
        dt_comm_work *works[N];
        int nw = 0;
        for (int k = 0; k < N;) {
            if (k % 13 == 0) {
                int rc = sender ? dt_comm_send(x->c, bufs[k], small_len(k), DT_INT64, peer,
                                               &works[nw++], &err)
                                : dt_comm_recv(x->c, bufs[k], small_len(k), DT_INT64, peer,
                                               &works[nw++], &err);
                RCHECK(rc == 0, "single %d: %s", k, err.msg);
                k++;
                continue;
            }
            dt_p2p_op ops[100];
            int m = 0;
            while (m < per && k < N && k % 13 != 0) {
                ops[m++] = (dt_p2p_op){sender ? DT_P2P_SEND : DT_P2P_RECV, bufs[k],
                                       small_len(k), DT_INT64, peer};
                k++;
            }
            int rc = dt_comm_p2p(x->c, ops, m, &works[nw++], &err);
            RCHECK(rc == 0, "batch at %d: %s", k, err.msg);
        }
        for (int i = 0; i < nw; i++) {
            int rc = dt_comm_wait(x->c, works[i], &err);
            RCHECK(rc == 0, "rank %d: wait %d: %s", x->rank, i, err.msg);
        }
        if (!sender)
            for (int k = 0; k < N; k++)
                for (size_t i = 0; i < small_len(k); i++)
                    if (bufs[k][i] != (int64_t)k * 1000 + (int64_t)i) {
                        RCHECK(false, "rank %d: message %d [%zu] = %lld", x->rank, k, i,
                               (long long)bufs[k][i]);
                        k = N;
                        break;
                    }
    }
    for (int k = 0; k < N; k++)
        free(bufs[k]);
    free(bufs);
}

static void test_p2p_many_small(void)
{
    world a = {.n = 2};
    run_world(&a, small_rank, NULL, 60);
    world b = {.n = 2, .hosts = "a,b"};
    run_world(&b, small_rank, NULL, 60);
}

/* Rank 0 posts a 4 MiB send and frees the communicator without waiting for it: the free lets
 * it finish (rank 1 receives it whole), as it does for collectives. */
static void unwaited_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    const size_t n = (4u << 20) / 4;
    int32_t *buf = malloc(n * 4);
    if (x->rank == 0) {
        for (size_t i = 0; i < n; i++)
            buf[i] = pv(0, 1, i);
        dt_comm_work *w = NULL;
        int rc = dt_comm_send(x->c, buf, n, DT_INT32, 1, &w, &err);
        RCHECK(rc == 0 && w, "send: %s", err.msg);
        dt_comm_free(x->c); /* must not return before the data is out */
        x->c = NULL;
    } else {
        dt_sleep_ms(200); /* the sender is in dt_comm_free by now */
        int rc = dt_comm_recv(x->c, buf, n, DT_INT32, 0, NULL, &err);
        RCHECK(rc == 0, "recv: %s", err.msg);
        for (size_t i = 0; i < n && rc == 0; i++)
            if (buf[i] != pv(0, 1, i)) {
                RCHECK(false, "[%zu] = %d", i, buf[i]);
                break;
            }
    }
    free(buf);
}

static void test_p2p_unwaited(void)
{
    world a = {.n = 2};
    run_world(&a, unwaited_rank, NULL, 30);
    world b = {.n = 2, .hosts = "a,b"};
    run_world(&b, unwaited_rank, NULL, 30);
}

/* Rank 0 sends 100 floats, rank 1 expects 200: both fail naming both ranks and both counts. */
static void mismatch_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    float buf[200] = {0};
    double t0 = dt_now_s();
    int rc = x->rank == 0 ? dt_comm_send(x->c, buf, 100, DT_FLOAT32, 1, NULL, &err)
                          : dt_comm_recv(x->c, buf, 200, DT_FLOAT32, 0, NULL, &err);
    double t = dt_now_s() - t0;
    RCHECK(rc == -EPROTO, "rank %d: rc %d (%s)", x->rank, rc, err.msg);
    RCHECK(strstr(err.msg, "x 100") && strstr(err.msg, "x 200"), "rank %d: %s", x->rank,
           err.msg);
    RCHECK(strstr(err.msg, x->rank == 0 ? "to rank 1" : "from rank 0") &&
               strstr(err.msg, x->rank == 0 ? "rank 1's receive" : "rank 0's send"),
           "rank %d: %s", x->rank, err.msg);
    RCHECK(t < 5, "rank %d: took %.1f s", x->rank, t);
    /* the communicator is unusable afterwards, with the first error */
    rc = dt_comm_send(x->c, buf, 1, DT_FLOAT32, 1 - x->rank, NULL, &err);
    RCHECK(rc != 0 && strstr(err.msg, "failed earlier"), "after failure: rc %d %s", rc, err.msg);
}

/* Same count, other dtype: float32 sent, int32 expected. */
static void dtype_mismatch_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    int32_t buf[100] = {0};
    int rc = x->rank == 0 ? dt_comm_send(x->c, buf, 100, DT_FLOAT32, 1, NULL, &err)
                          : dt_comm_recv(x->c, buf, 100, DT_INT32, 0, NULL, &err);
    RCHECK(rc == -EPROTO, "rank %d: rc %d (%s)", x->rank, rc, err.msg);
    RCHECK(strstr(err.msg, "float32 x 100") && strstr(err.msg, "int32 x 100"), "rank %d: %s",
           x->rank, err.msg);
}

static void test_p2p_mismatch(void)
{
    world d = {.n = 2, .timeout_ms = 15000};
    run_world(&d, dtype_mismatch_rank, NULL, 30);
    world a = {.n = 2, .timeout_ms = 15000};
    run_world(&a, mismatch_rank, NULL, 30);
    world b = {.n = 2, .hosts = "a,b", .timeout_ms = 15000};
    run_world(&b, mismatch_rank, NULL, 30);
}

/* A group {global 1, global 3} of a 4-rank world does one exchange; then global 3 exits and
 * global 1's receive fails fast (well within the timeout) naming it, with its global rank. */
static void dead_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    dt_comm *g = NULL;
    int rc = dt_comm_split(x->c, x->store, x->rank % 2, -x->rank, &g, &err);
    RCHECK(rc == 0, "split: %s", err.msg);
    if (x->rank % 2 == 0 || !g) {
        dt_comm_free(g);
        return;
    }
    /* keys reversed: global 3 is rank 0 of the group, global 1 is rank 1 */
    int peer = 1 - dt_comm_rank(g);
    int32_t v = x->rank, got = -1;
    dt_p2p_op ops[2] = {{DT_P2P_SEND, &v, 1, DT_INT32, peer}, {DT_P2P_RECV, &got, 1, DT_INT32,
                                                               peer}};
    rc = dt_comm_p2p(g, ops, 2, NULL, &err);
    RCHECK(rc == 0 && got == 4 - x->rank, "exchange: rc %d got %d: %s", rc, got, err.msg);
    if (x->rank == 3)
        _exit(dt_test_rank_failed ? 1 : 0); /* dies without a word */
    double t0 = dt_now_s();
    rc = dt_comm_recv(g, &got, 1, DT_INT32, peer, NULL, &err);
    double t = dt_now_s() - t0;
    RCHECK(rc != 0, "receive from a dead peer succeeded");
    RCHECK(strstr(err.msg, "rank 0 (global rank 3)") &&
               strstr(err.msg, "receive #2 (int32 x 1) from rank 0"),
           "message: %s", err.msg);
    RCHECK(t < 4.0, "took %.1f s (timeout %d ms)", t, x->w->timeout_ms);
    dt_comm_free(g);
}

/* Rank 1 never posts the receive: rank 0's send times out within the timeout, naming rank 1. */
static void stalled_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    float buf[4] = {0};
    if (x->rank == 1) {
        dt_sleep_ms(2500);
        return;
    }
    double t0 = dt_now_s();
    int rc = dt_comm_send(x->c, buf, 4, DT_FLOAT32, 1, NULL, &err);
    double t = dt_now_s() - t0;
    RCHECK(rc == -ETIMEDOUT, "rc %d: %s", rc, err.msg);
    RCHECK(strstr(err.msg, "to rank 1") && strstr(err.msg, "timed out"), "message: %s", err.msg);
    RCHECK(t >= 0.9 && t < 2.5, "took %.2f s (timeout 1 s)", t);
}

static void test_p2p_dead_peer(void)
{
    world a = {.n = 4, .timeout_ms = 8000};
    run_world(&a, dead_rank, NULL, 40);
    world b = {.n = 4, .hosts = "a,a,b,b", .timeout_ms = 8000}; /* the group spans hosts */
    run_world(&b, dead_rank, NULL, 40);
    world c = {.n = 2, .timeout_ms = 1000};
    run_world(&c, stalled_rank, NULL, 30);
    world d = {.n = 2, .hosts = "a,b", .timeout_ms = 1000};
    run_world(&d, stalled_rank, NULL, 30);
}

/* Every rank sends 1 MiB to every other and receives from every other, in one batch, twice
 * (the second time in the reverse op order): many pairs in flight at once, mixed transports. */
static void alltoall_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    const size_t n = (1u << 20) / 4;
    int32_t *s = malloc(n * 4 * (size_t)x->n), *r = malloc(n * 4 * (size_t)x->n);
    dt_p2p_op ops[16];
    for (int round = 0; round < 2; round++) {
        int m = 0;
        for (int q = 0; q < x->n; q++) {
            if (q == x->rank)
                continue;
            for (size_t i = 0; i < n; i++)
                s[(size_t)q * n + i] = pv(x->rank, q, i + (size_t)round);
            ops[m++] = (dt_p2p_op){DT_P2P_SEND, s + (size_t)q * n, n, DT_INT32, q};
            ops[m++] = (dt_p2p_op){DT_P2P_RECV, r + (size_t)q * n, n, DT_INT32, q};
        }
        if (round == 1)
            for (int i = 0; i < m / 2; i++) {
                dt_p2p_op t = ops[i];
                ops[i] = ops[m - 1 - i];
                ops[m - 1 - i] = t;
            }
        int rc = dt_comm_p2p(x->c, ops, m, NULL, &err);
        RCHECK(rc == 0, "rank %d round %d: %s", x->rank, round, err.msg);
        for (int q = 0; q < x->n && rc == 0; q++)
            for (size_t i = 0; q != x->rank && i < n; i++)
                if (r[(size_t)q * n + i] != pv(q, x->rank, i + (size_t)round)) {
                    RCHECK(false, "rank %d round %d: from %d [%zu] = %d", x->rank, round, q, i,
                           r[(size_t)q * n + i]);
                    break;
                }
    }
    free(s);
    free(r);
}

static void test_p2p_all_pairs(void)
{
    world a = {.n = 4, .hosts = "a,a,b,b"};
    run_world(&a, alltoall_rank, NULL, 40);
    world b = {.n = 3};
    run_world(&b, alltoall_rank, NULL, 40);
}

/* Collectives on a group {global 1, global 3}: global 3 exits after one all-reduce, and global
 * 1's next all-reduce fails within the timeout naming global rank 3. */
static void group_dead_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    dt_comm *g = NULL;
    int rc = dt_comm_split(x->c, x->store, x->rank % 2, x->rank, &g, &err);
    RCHECK(rc == 0 && g, "split: %s", err.msg);
    if (x->rank % 2 == 0 || !g) {
        dt_comm_free(g);
        return;
    }
    float v[64] = {0};
    rc = dt_comm_allreduce(g, v, 64, DT_FLOAT32, DT_SUM, NULL, &err);
    RCHECK(rc == 0, "allreduce: %s", err.msg);
    if (x->rank == 3)
        _exit(dt_test_rank_failed ? 1 : 0);
    double t0 = dt_now_s();
    rc = dt_comm_allreduce(g, v, 64, DT_FLOAT32, DT_SUM, NULL, &err);
    double t = dt_now_s() - t0;
    RCHECK(rc != 0, "allreduce with a dead peer succeeded");
    RCHECK(strstr(err.msg, "rank 3"), "message does not name global rank 3: %s", err.msg);
    RCHECK(t < 7.0, "took %.1f s (timeout 8 s)", t);
    dt_comm_free(g);
}

static void test_group_dead_peer(void)
{
    world a = {.n = 4, .timeout_ms = 8000};
    run_world(&a, group_dead_rank, NULL, 40);
    world b = {.n = 4, .hosts = "a,a,b,b", .timeout_ms = 8000};
    run_world(&b, group_dead_rank, NULL, 40);
}

/* A pipeline-like group: p2p on a split group while the world runs collectives. */
static void pipe_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    dt_comm *pp = NULL;
    /* pipeline groups {0,2} and {1,3} */
    int rc = dt_comm_split(x->c, x->store, x->rank % 2, x->rank, &pp, &err);
    RCHECK(rc == 0 && pp, "split: %s", err.msg);
    if (!pp)
        return;
    const size_t n = 1 << 18;
    float *act = malloc(n * 4), *grad = malloc(n * 4);
    for (int mb = 0; mb < 4; mb++) {
        dt_comm_work *w = NULL, *wc = NULL;
        int64_t one = 1;
        rc = dt_comm_allreduce(x->c, &one, 1, DT_INT64, DT_SUM, &wc, &err);
        RCHECK(rc == 0, "world allreduce: %s", err.msg);
        if (dt_comm_rank(pp) == 0) {
            for (size_t i = 0; i < n; i++)
                act[i] = (float)(mb * 10 + x->rank + (int)(i % 7));
            dt_p2p_op ops[2] = {{DT_P2P_SEND, act, n, DT_FLOAT32, 1},
                                {DT_P2P_RECV, grad, n, DT_FLOAT32, 1}};
            rc = dt_comm_p2p(pp, ops, 2, &w, &err);
        } else {
            dt_p2p_op ops[2] = {{DT_P2P_RECV, act, n, DT_FLOAT32, 0},
                                {DT_P2P_SEND, grad, n, DT_FLOAT32, 0}};
            for (size_t i = 0; i < n; i++)
                grad[i] = (float)(-mb - x->rank);
            rc = dt_comm_p2p(pp, ops, 2, &w, &err);
        }
        RCHECK(rc == 0, "p2p: %s", err.msg);
        rc = dt_comm_wait(pp, w, &err);
        RCHECK(rc == 0, "rank %d: p2p wait: %s", x->rank, err.msg);
        rc = dt_comm_wait(x->c, wc, &err);
        RCHECK(rc == 0 && one == x->n, "world wait: %s", err.msg);
        int other = dt_comm_global_rank(pp, 1 - dt_comm_rank(pp));
        for (size_t i = 0; i < n; i++) {
            float want = dt_comm_rank(pp) == 0 ? (float)(-mb - other)
                                               : (float)(mb * 10 + other + (int)(i % 7));
            float got = dt_comm_rank(pp) == 0 ? grad[i] : act[i];
            if (got != want) {
                RCHECK(false, "rank %d mb %d [%zu] = %g, want %g", x->rank, mb, i, got, want);
                break;
            }
        }
    }
    free(act);
    free(grad);
    dt_comm_free(pp);
}

static void test_p2p_on_groups(void)
{
    world a = {.n = 4, .hosts = "a,a,b,b"};
    run_world(&a, pipe_rank, NULL, 40);
}

/* ------------------------------------------------------------------------------------------ */
/* Counters (dt_comm_stats)                                                                   */
/* ------------------------------------------------------------------------------------------ */

/* want[op] = {calls, bytes}; every op not listed must be zero. */
static void check_stats(rank_ctx *x, const char *what, const dt_comm *c,
                        const uint64_t want[DT_COMM_OP_COUNT][2])
{
    dt_comm_stats st;
    dt_comm_stats_get(c, &st);
    for (int op = 0; op < DT_COMM_OP_COUNT; op++)
        RCHECK(st.calls[op] == want[op][0] && st.bytes[op] == want[op][1],
               "rank %d, %s: %s counted %llu calls, %llu bytes; want %llu, %llu", x->rank, what,
               dt_comm_op_name((dt_comm_op)op), (unsigned long long)st.calls[op],
               (unsigned long long)st.bytes[op], (unsigned long long)want[op][0],
               (unsigned long long)want[op][1]);
}

/* 4 ranks: a world and two groups {0, 1}, {2, 3}; collectives and p2p of known sizes on each,
 * counted exactly (nccl-tests' sizes), each communicator apart, reset, and a snapshot
 * difference. */
static void stats_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    const int n = x->n;
    uint64_t w[DT_COMM_OP_COUNT][2] = {{0}};
    check_stats(x, "world at init (the bootstrap is not a collective)", x->c, w);
    float f[10] = {0};
    double d[3] = {0};
    int32_t i32[5] = {0};
    float ag_in[6] = {0}, ag_out[4 * 6];
    int64_t rs_in[4 * 2] = {0}, rs_out[2];
    uint8_t u8[7] = {0};
    dt_comm_work *wk = NULL;
    RCHECK(dt_comm_allreduce(x->c, f, 10, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_allreduce(x->c, d, 3, DT_FLOAT64, DT_AVG, &wk, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_wait(x->c, wk, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_broadcast(x->c, i32, 5, DT_INT32, 1, NULL, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_allgather(x->c, ag_in, ag_out, 6, DT_FLOAT32, NULL, &err) == 0, "%s",
           err.msg);
    RCHECK(dt_comm_reduce_scatter(x->c, rs_in, rs_out, 2, DT_INT64, DT_SUM, NULL, &err) == 0,
           "%s", err.msg);
    RCHECK(dt_comm_reduce(x->c, u8, 7, DT_UINT8, DT_MAX, 3, NULL, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_barrier(x->c, &err) == 0, "%s", err.msg);
    /* refused before it reaches the backend: not counted */
    RCHECK(dt_comm_allreduce(x->c, i32, 5, DT_INT32, DT_AVG, NULL, &err) == -EINVAL,
           "an integer avg was accepted");
    w[DT_COMM_OP_ALLREDUCE][0] = 2, w[DT_COMM_OP_ALLREDUCE][1] = 10 * 4 + 3 * 8;
    w[DT_COMM_OP_BROADCAST][0] = 1, w[DT_COMM_OP_BROADCAST][1] = 5 * 4;
    w[DT_COMM_OP_ALLGATHER][0] = 1, w[DT_COMM_OP_ALLGATHER][1] = (uint64_t)n * 6 * 4;
    w[DT_COMM_OP_REDUCE_SCATTER][0] = 1, w[DT_COMM_OP_REDUCE_SCATTER][1] = (uint64_t)n * 2 * 8;
    w[DT_COMM_OP_REDUCE][0] = 1, w[DT_COMM_OP_REDUCE][1] = 7;
    w[DT_COMM_OP_BARRIER][0] = 1;
    check_stats(x, "world", x->c, w);
    dt_comm_stats before;
    dt_comm_stats_get(x->c, &before);
    RCHECK(before.wait_s > 0, "rank %d: blocking calls and a wait, %g s waited", x->rank,
           before.wait_s);

    /* the split's exchange (2 int32 per rank, allgathered) is the parent's */
    dt_comm *g = NULL;
    RCHECK(dt_comm_split(x->c, x->store, x->rank / 2, 0, &g, &err) == 0 && g, "split: %s",
           err.msg);
    if (!g)
        return;
    w[DT_COMM_OP_ALLGATHER][0] += 1, w[DT_COMM_OP_ALLGATHER][1] += (uint64_t)n * 2 * 4;
    check_stats(x, "world after the split", x->c, w);
    uint64_t gw[DT_COMM_OP_COUNT][2] = {{0}};
    check_stats(x, "a new group", g, gw);

    /* on the group: an all-reduce whose size differs per group (they count apart), and one
     * p2p batch: 9 floats one way, 4 int64 the other */
    const size_t ar = x->rank < 2 ? 100 : 33;
    float *buf = calloc(ar, sizeof *buf);
    float s9[9] = {0};
    int64_t r4[4] = {0};
    RCHECK(buf && dt_comm_allreduce(g, buf, ar, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s",
           err.msg);
    free(buf);
    const int gr = dt_comm_rank(g), peer = 1 - gr;
    dt_p2p_op ops[2];
    if (gr == 0) {
        ops[0] = (dt_p2p_op){DT_P2P_SEND, s9, 9, DT_FLOAT32, peer};
        ops[1] = (dt_p2p_op){DT_P2P_RECV, r4, 4, DT_INT64, peer};
    } else {
        ops[0] = (dt_p2p_op){DT_P2P_RECV, s9, 9, DT_FLOAT32, peer};
        ops[1] = (dt_p2p_op){DT_P2P_SEND, r4, 4, DT_INT64, peer};
    }
    RCHECK(dt_comm_p2p(g, ops, 2, &wk, &err) == 0, "p2p: %s", err.msg);
    RCHECK(dt_comm_wait(g, wk, &err) == 0, "p2p wait: %s", err.msg);
    gw[DT_COMM_OP_ALLREDUCE][0] = 1, gw[DT_COMM_OP_ALLREDUCE][1] = ar * 4;
    gw[gr == 0 ? DT_COMM_OP_SEND : DT_COMM_OP_RECV][0] = 1;
    gw[gr == 0 ? DT_COMM_OP_SEND : DT_COMM_OP_RECV][1] = 9 * 4;
    gw[gr == 0 ? DT_COMM_OP_RECV : DT_COMM_OP_SEND][0] = 1;
    gw[gr == 0 ? DT_COMM_OP_RECV : DT_COMM_OP_SEND][1] = 4 * 8;
    check_stats(x, "the group", g, gw);
    check_stats(x, "world after the group's work", x->c, w);

    /* a snapshot difference: exactly what ran between the two */
    int64_t one = 1;
    RCHECK(dt_comm_allreduce(x->c, &one, 1, DT_INT64, DT_SUM, NULL, &err) == 0, "%s", err.msg);
    dt_comm_stats after, diff;
    dt_comm_stats_get(x->c, &after);
    dt_comm_stats_sub(&after, &before, &diff);
    for (int op = 0; op < DT_COMM_OP_COUNT; op++) {
        uint64_t wc = op == DT_COMM_OP_ALLREDUCE || op == DT_COMM_OP_ALLGATHER ? 1 : 0;
        uint64_t wb = op == DT_COMM_OP_ALLREDUCE ? 8 : op == DT_COMM_OP_ALLGATHER ? n * 8 : 0;
        RCHECK(diff.calls[op] == wc && diff.bytes[op] == wb,
               "rank %d: %s between the snapshots: %llu calls, %llu bytes", x->rank,
               dt_comm_op_name((dt_comm_op)op), (unsigned long long)diff.calls[op],
               (unsigned long long)diff.bytes[op]);
    }

    /* reset: the group's counters only */
    dt_comm_stats_reset(g);
    uint64_t zero[DT_COMM_OP_COUNT][2] = {{0}};
    check_stats(x, "the group after a reset", g, zero);
    dt_comm_stats gs;
    dt_comm_stats_get(g, &gs);
    RCHECK(gs.wait_s == 0, "wait_s %g after a reset", gs.wait_s);
    RCHECK(dt_comm_barrier(g, &err) == 0, "%s", err.msg);
    zero[DT_COMM_OP_BARRIER][0] = 1;
    check_stats(x, "the group after a reset and a barrier", g, zero);
    w[DT_COMM_OP_ALLREDUCE][0] += 1, w[DT_COMM_OP_ALLREDUCE][1] += 8;
    check_stats(x, "world after the group's reset", x->c, w);
    dt_comm_free(g);
}

static void test_stats(void)
{
    world w = {.n = 4};
    run_world(&w, stats_rank, NULL, 40);
    /* a world of one and NULL */
    dt_err err = {0};
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.run_id = "tg-stats-one";
    dt_comm *c = NULL;
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    double v[4] = {1, 2, 3, 4};
    DT_CHECK_INT(dt_comm_allreduce(c, v, 4, DT_FLOAT64, DT_SUM, NULL, &err), 0);
    dt_comm_stats st;
    dt_comm_stats_get(c, &st);
    DT_CHECK(st.calls[DT_COMM_OP_ALLREDUCE] == 1 && st.bytes[DT_COMM_OP_ALLREDUCE] == 32);
    dt_comm_stats_get(NULL, &st);
    DT_CHECK(st.calls[DT_COMM_OP_ALLREDUCE] == 0 && st.wait_s == 0);
    dt_comm_stats_reset(NULL);
    DT_CHECK_STR(dt_comm_op_name(DT_COMM_OP_REDUCE_SCATTER), "reduce_scatter");
    DT_CHECK_STR(dt_comm_op_name(DT_COMM_OP_COUNT), "?");
    dt_comm_free(c);
}

/* sent_bytes: the wire bytes the transports counted, against each algorithm's share. An
 * all-reduce of S bytes sends 2 (n-1)/n S (shared memory: chunk j to its owner, the owner's
 * reduced chunk back to every peer; the TCP ring: n-1 reduce-scatter and n-1 all-gather steps
 * of S/n), an all-gather (n-1) x its part, a point-to-point send its payload. 4096 floats cut
 * into n chunks of a multiple of 16 elements evenly for n = 2 and 4: exact. */
static void sent_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    const uint64_t n = (uint64_t)x->n;
    float *buf = calloc(4096, sizeof *buf), part[24] = {0}, *all = calloc(24 * n, sizeof *all);
    dt_comm_stats a, b, d;
    dt_comm_stats_get(x->c, &a);
    RCHECK(dt_comm_allreduce(x->c, buf, 4096, DT_FLOAT32, DT_SUM, NULL, &err) == 0, "%s",
           err.msg);
    dt_comm_stats_get(x->c, &b);
    dt_comm_stats_sub(&b, &a, &d);
    RCHECK(d.sent_bytes == 2 * (n - 1) * 4096 * 4 / n, "rank %d: all-reduce of 16 KiB sent %llu",
           x->rank, (unsigned long long)d.sent_bytes);
    RCHECK(dt_comm_allgather(x->c, part, all, 24, DT_FLOAT32, NULL, &err) == 0, "%s", err.msg);
    dt_comm_stats_get(x->c, &a);
    dt_comm_stats_sub(&a, &b, &d);
    RCHECK(d.sent_bytes == (n - 1) * 24 * 4, "rank %d: all-gather of 96 bytes sent %llu",
           x->rank, (unsigned long long)d.sent_bytes);
    if (x->n == 2) {
        dt_comm_work *wk = NULL;
        dt_p2p_op op = {x->rank ? DT_P2P_RECV : DT_P2P_SEND, part, 9, DT_FLOAT32, 1 - x->rank};
        RCHECK(dt_comm_p2p(x->c, &op, 1, &wk, &err) == 0 && dt_comm_wait(x->c, wk, &err) == 0,
               "p2p: %s", err.msg);
        dt_comm_stats_get(x->c, &b);
        dt_comm_stats_sub(&b, &a, &d);
        RCHECK(d.sent_bytes == (x->rank ? 0u : 36u), "rank %d: a send of 36 bytes sent %llu",
               x->rank, (unsigned long long)d.sent_bytes);
    }
    free(buf);
    free(all);
}

static void test_sent_bytes(void)
{
    world shm = {.n = 2};
    run_world(&shm, sent_rank, NULL, 40);
    world ring = {.n = 2, .hosts = "a,b"};
    run_world(&ring, sent_rank, NULL, 40);
    world flat = {.n = 4, .hosts = "a,a,b,b", .transport = "tcp"}; /* one ring of 4 */
    run_world(&flat, sent_rank, NULL, 40);
    /* (hierarchical, a host's first rank sends more: its host's sum around the ring and the
     * result to its host; counted as it happens, not as the flat formula) */
}

/* dt_comm_wait_done: an all-reduce and a p2p batch waited on 300 ms after their issue report
 * a completion time between the issue and the wait (the cpu backend stamps them when its comm
 * thread or point-to-point engine finishes them; 300 ms leaves a loaded machine ample time to
 * run a collective of 64 bytes), and a NULL handle the time of the call. */
static void wait_done_rank(rank_ctx *x, void *arg)
{
    (void)arg;
    dt_err err = {0};
    float v[16] = {0};
    float pv2[8] = {0};
    dt_comm_work *wa = NULL, *wp = NULL;
    RCHECK(dt_comm_barrier(x->c, &err) == 0, "%s", err.msg);
    uint64_t t_issue = dt_now_ns();
    RCHECK(dt_comm_allreduce(x->c, v, 16, DT_FLOAT32, DT_SUM, &wa, &err) == 0, "%s", err.msg);
    dt_p2p_op op = {x->rank == 0 ? DT_P2P_SEND : DT_P2P_RECV, pv2, 8, DT_FLOAT32, 1 - x->rank};
    RCHECK(dt_comm_p2p(x->c, &op, 1, &wp, &err) == 0, "%s", err.msg);
    dt_sleep_ms(300);
    uint64_t t_wait = dt_now_ns(), done_a = 0, done_p = 0, done_n = 0;
    RCHECK(dt_comm_wait_done(x->c, wa, &done_a, &err) == 0, "%s", err.msg);
    RCHECK(dt_comm_wait_done(x->c, wp, &done_p, &err) == 0, "%s", err.msg);
    uint64_t t_end = dt_now_ns();
    RCHECK(done_a >= t_issue && done_a < t_wait,
           "rank %d: the all-reduce done %.3f ms after its issue, the wait began at %.3f ms",
           x->rank, (double)(done_a - t_issue) * 1e-6, (double)(t_wait - t_issue) * 1e-6);
    RCHECK(done_p >= t_issue && done_p < t_wait,
           "rank %d: the p2p batch done %.3f ms after its issue, the wait began at %.3f ms",
           x->rank, (double)(done_p - t_issue) * 1e-6, (double)(t_wait - t_issue) * 1e-6);
    RCHECK(dt_comm_wait_done(x->c, NULL, &done_n, &err) == 0 && done_n >= t_end,
           "a NULL handle");
    dt_comm_stats st;
    dt_comm_stats_get(x->c, &st);
    RCHECK(st.calls[DT_COMM_OP_ALLREDUCE] == 1 && st.calls[DT_COMM_OP_BARRIER] == 1 &&
               st.bytes[x->rank == 0 ? DT_COMM_OP_SEND : DT_COMM_OP_RECV] == 32,
           "rank %d: counters", x->rank);
}

static void test_wait_done(void)
{
    world w = {.n = 2};
    run_world(&w, wait_done_rank, NULL, 30);
}

/* One process: a world of one, its split, a group of one, invalid p2p arguments. */
static void test_one_rank(void)
{
    dt_err err = {0};
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.run_id = "tg-one";
    dt_comm *c = NULL;
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &err), &err);
    DT_CHECK_INT(dt_comm_global_rank(c, 0), 0);
    dt_comm *g = NULL;
    DT_CHECK_INT(dt_comm_split(c, NULL, -3, 0, &g, &err), 0);
    DT_CHECK(g == NULL);
    DT_REQUIRE_OK(dt_comm_split(c, NULL, 4, 9, &g, &err), &err);
    DT_REQUIRE(g != NULL);
    DT_CHECK_INT(dt_comm_world_size(g), 1);
    DT_CHECK_INT(dt_comm_rank(g), 0);
    DT_CHECK_INT(dt_comm_global_rank(g, 0), 0);
    float a[3] = {1, 2, 3}, b[3] = {0};
    DT_CHECK_INT(dt_comm_allreduce(g, a, 3, DT_FLOAT32, DT_SUM, NULL, &err), 0);
    DT_CHECK(a[0] == 1 && a[2] == 3);
    DT_CHECK_INT(dt_comm_allgather(g, a, b, 3, DT_FLOAT32, NULL, &err), 0);
    DT_CHECK(b[1] == 2);
    DT_CHECK_INT(dt_comm_send(g, a, 3, DT_FLOAT32, 0, NULL, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "itself");
    DT_CHECK_INT(dt_comm_recv(g, a, 3, DT_FLOAT32, 1, NULL, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "not a rank");
    dt_p2p_op bad = {(dt_p2p_kind)7, a, 1, DT_FLOAT32, 0};
    DT_CHECK_INT(dt_comm_p2p(g, &bad, 1, NULL, &err), -EINVAL);
    dt_comm_work *w = NULL;
    DT_CHECK_INT(dt_comm_p2p(g, NULL, 0, &w, &err), 0); /* an empty batch */
    DT_CHECK_INT(dt_comm_wait(g, w, &err), 0);
    dt_comm_free(g);
    dt_comm_free(c);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"one_rank", test_one_rank, 0},
        {"p2p_ring", test_p2p_ring, 60},
        {"p2p_bidirectional", test_p2p_bidirectional, 90},
        {"p2p_many_small", test_p2p_many_small, 90},
        {"p2p_mismatch", test_p2p_mismatch, 60},
        {"p2p_unwaited", test_p2p_unwaited, 60},
        {"p2p_dead_peer", test_p2p_dead_peer, 90},
        {"p2p_on_groups", test_p2p_on_groups, 60},
        {"p2p_all_pairs", test_p2p_all_pairs, 60},
        {"group_dead_peer", test_group_dead_peer, 60},
        {"split_shapes", test_split_shapes, 90},
        {"split_hosts", test_split_hosts, 120},
        {"concurrent_groups", test_concurrent_groups, 90},
        {"stats", test_stats, 60},
        {"sent_bytes", test_sent_bytes, 90},
        {"wait_done", test_wait_done, 40},
    };
    return dt_test_main("test_comm_groups", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
