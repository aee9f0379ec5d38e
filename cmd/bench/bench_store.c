/* bench_store.c - `dtrain bench store`: store throughput, latency, a rendezvous-shaped round,
 * and many connections held open at once.
 *
 *   dtrain bench store [--endpoint H:P] [--clients N] [--ops M] [--value-size B]
 *                      [--round-clients R] [--hold K] [--json]
 *
 * Without --endpoint it starts an embedded server on 127.0.0.1 (in this process, on its own
 * loop thread), so the figures include the server sharing the machine with the clients, as on
 * a rendezvous host. Phases:
 *   hold     K connections opened and kept open through the other phases, then each pinged
 *   ops      N client threads, each with its own connection, run M ops (set, get, add in
 *            turn, on their own keys and one shared counter): aggregate ops/s, p50/p99
 *   round    R clients publish a value, add to a counter (the last one sets "go"), wait for
 *            "go", then multi-get all R values: time from start to the last client done
 * Targets (issue 3, 2-core machine): >= 50,000 ops/s with 64 clients and p99 < 2 ms; 4,096
 * connections held; the 1,024-client round in under 1 s.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"

typedef struct bench {
    char host[256];
    int port;
    int clients, ops, round_clients, hold;
    size_t value_size;
    int json;
    /* start gate: threads report ready, then wait for go */
    pthread_mutex_t gate_mu;
    pthread_cond_t gate_cv;
    int gate_ready, gate_go;
    uint64_t t_start;
    int failed;
    pthread_mutex_t mu;
    char first_error[DT_ERR_MSG_MAX];
} bench;

static void bench_fail(bench *b, const dt_err *err)
{
    pthread_mutex_lock(&b->mu);
    if (!b->failed++)
        dt_strlcpy(b->first_error, dt_err_str(err), sizeof b->first_error);
    pthread_mutex_unlock(&b->mu);
}

static void gate_reset(bench *b)
{
    pthread_mutex_lock(&b->gate_mu);
    b->gate_ready = 0;
    b->gate_go = 0;
    pthread_mutex_unlock(&b->gate_mu);
}

/* A client thread: "I am ready", then waits for the start. */
static void gate_wait(bench *b)
{
    pthread_mutex_lock(&b->gate_mu);
    b->gate_ready++;
    pthread_cond_broadcast(&b->gate_cv);
    while (!b->gate_go)
        pthread_cond_wait(&b->gate_cv, &b->gate_mu);
    pthread_mutex_unlock(&b->gate_mu);
}

/* The main thread: waits until n threads are ready, then starts them all. */
static void gate_open(bench *b, int n)
{
    pthread_mutex_lock(&b->gate_mu);
    while (b->gate_ready < n)
        pthread_cond_wait(&b->gate_cv, &b->gate_mu);
    b->t_start = dt_now_ns();
    b->gate_go = 1;
    pthread_cond_broadcast(&b->gate_cv);
    pthread_mutex_unlock(&b->gate_mu);
}

static dt_store *bench_connect(bench *b, dt_err *err)
{
    dt_store_opts o;
    dt_store_opts_default(&o);
    o.connect_timeout_ms = 60000;
    o.timeout_ms = 60000;
    dt_store *s = NULL;
    if (dt_store_connect(&s, b->host, b->port, &o, err) < 0)
        return NULL;
    return s;
}

static int cmp_f(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* ---- ops phase ---- */

typedef struct ops_arg {
    bench *b;
    int idx;
    float *lat_us; /* (ops) latency of each op, microseconds */
} ops_arg;

static void *ops_thread(void *p)
{
    ops_arg *a = p;
    bench *b = a->b;
    dt_err err = {0};
    dt_store *s = bench_connect(b, &err);
    char key[64];
    snprintf(key, sizeof key, "bench/ops/%d", a->idx);
    uint8_t *val = calloc(1, b->value_size + 1);
    if (val)
        memset(val, 'v', b->value_size);
    if (s && val && dt_store_set(s, key, val, b->value_size, &err) < 0) {
        dt_store_free(s);
        s = NULL;
    }
    gate_wait(b);
    if (!s || !val) {
        bench_fail(b, &err);
        free(val);
        return NULL;
    }
    for (int i = 0; i < b->ops; i++) {
        uint64_t t0 = dt_now_ns();
        int rc;
        void *v = NULL;
        size_t n;
        switch (i % 3) {
        case 0: rc = dt_store_set(s, key, val, b->value_size, &err); break;
        case 1:
            rc = dt_store_get(s, key, &v, &n, 0, &err);
            free(v);
            break;
        default: rc = dt_store_add(s, "bench/ops/counter", 1, NULL, &err); break;
        }
        a->lat_us[i] = (float)((double)(dt_now_ns() - t0) * 1e-3);
        if (rc < 0) {
            bench_fail(b, &err);
            break;
        }
    }
    dt_store_free(s);
    free(val);
    return NULL;
}

static pthread_attr_t small_stack(void)
{
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 256 * 1024);
    return at;
}

static int phase_ops(bench *b, double *ops_s, double *p50, double *p99, double *wall)
{
    int n = b->clients;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    ops_arg *args = calloc((size_t)n, sizeof *args);
    float *lat = calloc((size_t)n * (size_t)b->ops, sizeof *lat);
    if (!th || !args || !lat) {
        free(th);
        free(args);
        free(lat);
        return -ENOMEM;
    }
    gate_reset(b);
    pthread_attr_t at = small_stack();
    int started = 0;
    for (; started < n; started++) {
        args[started] = (ops_arg){b, started, lat + (size_t)started * (size_t)b->ops};
        if (pthread_create(&th[started], &at, ops_thread, &args[started]) != 0)
            break;
    }
    pthread_attr_destroy(&at);
    gate_open(b, started);
    for (int i = 0; i < started; i++)
        pthread_join(th[i], NULL);
    *wall = (double)(dt_now_ns() - b->t_start) * 1e-9;
    if (started < n) {
        fprintf(stderr, "dtrain bench store: could only start %d of %d threads\n", started, n);
        b->failed++;
    }
    size_t total = (size_t)started * (size_t)b->ops;
    qsort(lat, total, sizeof *lat, cmp_f);
    *ops_s = (double)total / *wall;
    *p50 = lat[total / 2];
    *p99 = lat[DT_MIN(total - 1, total * 99 / 100)];
    free(th);
    free(args);
    free(lat);
    return 0;
}

/* ---- rendezvous round ---- */

typedef struct round_arg {
    bench *b;
    int idx;
    dt_store *s;
    const char **keys; /* (R) value keys, shared */
    double done_s;     /* seconds from the start when this client finished */
    int ok;
} round_arg;

static void *round_thread(void *p)
{
    round_arg *a = p;
    bench *b = a->b;
    int n = b->round_clients;
    dt_err err = {0};
    char val[64];
    snprintf(val, sizeof val, "10.0.%d.%d:29500", a->idx / 256, a->idx % 256);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    gate_wait(b);
    int64_t count = 0;
    int rc = vals && lens ? 0 : -ENOMEM;
    const char *go[] = {"bench/round/go"};
    if (rc == 0)
        rc = dt_store_set(a->s, a->keys[a->idx], val, strlen(val), &err);
    if (rc == 0)
        rc = dt_store_add(a->s, "bench/round/count", 1, &count, &err);
    if (rc == 0 && count == n)
        rc = dt_store_set(a->s, go[0], "1", 1, &err);
    if (rc == 0)
        rc = dt_store_wait(a->s, go, 1, 60000, &err);
    if (rc == 0)
        rc = dt_store_multi_get(a->s, a->keys, (size_t)n, vals, lens, 60000, &err);
    a->done_s = (double)(dt_now_ns() - b->t_start) * 1e-9;
    if (rc == 0) {
        /* Check a few published values. */
        a->ok = 1;
        for (int j = 0; j < n; j += DT_MAX(1, n / 8)) {
            char want[64];
            snprintf(want, sizeof want, "10.0.%d.%d:29500", j / 256, j % 256);
            if (strcmp(vals[j], want) != 0)
                a->ok = 0;
        }
        for (int j = 0; j < n; j++)
            free(vals[j]);
    } else {
        bench_fail(b, &err);
    }
    free(vals);
    free(lens);
    return NULL;
}

static int phase_round(bench *b, double *round_s, double *connect_s)
{
    int n = b->round_clients;
    pthread_t *th = calloc((size_t)n, sizeof *th);
    round_arg *args = calloc((size_t)n, sizeof *args);
    char (*names)[32] = calloc((size_t)n, sizeof *names);
    const char **keys = calloc((size_t)n, sizeof *keys);
    int rc = 0, started = 0;
    if (!th || !args || !names || !keys) {
        rc = -ENOMEM;
        goto out;
    }
    uint64_t c0 = dt_now_ns();
    for (int i = 0; i < n; i++) {
        dt_err err = {0};
        snprintf(names[i], sizeof names[i], "bench/round/v/%d", i);
        keys[i] = names[i];
        args[i] = (round_arg){.b = b, .idx = i, .keys = keys};
        if (!(args[i].s = bench_connect(b, &err))) {
            fprintf(stderr, "dtrain bench store: round client %d: %s\n", i, dt_err_str(&err));
            rc = -ECONNREFUSED;
            goto out;
        }
    }
    *connect_s = (double)(dt_now_ns() - c0) * 1e-9;
    gate_reset(b);
    pthread_attr_t at = small_stack();
    for (; started < n; started++)
        if (pthread_create(&th[started], &at, round_thread, &args[started]) != 0)
            break;
    pthread_attr_destroy(&at);
    if (started < n) { /* the round cannot complete: the count never reaches n */
        fprintf(stderr, "dtrain bench store: could only start %d of %d threads\n", started, n);
        rc = -EAGAIN;
    }
    gate_open(b, started);
    double worst = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        worst = DT_MAX(worst, args[i].done_s);
        if (!args[i].ok)
            rc = rc ? rc : -EIO;
    }
    *round_s = worst;
out:
    if (args)
        for (int i = 0; i < n; i++)
            dt_store_free(args[i].s);
    free(th);
    free(args);
    free(names);
    free(keys);
    return rc;
}

/* ---- main ---- */

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench store [--endpoint H:P] [--clients N] [--ops M] [--value-size B]\n"
            "                          [--round-clients R] [--hold K] [--json]\n"
            "\n"
            "  --endpoint H:P     benchmark a running store (default: an embedded one on 127.0.0.1)\n"
            "  --clients N        client threads in the ops phase (64)\n"
            "  --ops M            ops per client: set, get, add in turn (5000)\n"
            "  --value-size B     bytes per value (64)\n"
            "  --round-clients R  clients in the rendezvous round (1024; 0 skips it)\n"
            "  --hold K           connections held open during the run, then each pinged (0)\n"
            "  --json             one JSON line with every figure, after the table\n");
}

static int raise_nofile(int need)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return -errno;
    if (rl.rlim_cur >= (rlim_t)need)
        return 0;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= (rlim_t)need ? (rlim_t)need
                                                                                : rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    return rl.rlim_cur >= (rlim_t)need ? 0 : -EMFILE;
}

int dt_bench_store(int argc, char **argv)
{
    bench b = {.clients = 64, .ops = 5000, .round_clients = 1024, .value_size = 64};
    const char *endpoint = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int *ip = NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            b.json = 1;
            continue;
        } else if (!strcmp(a, "--endpoint") && v) {
            endpoint = v;
        } else if (!strcmp(a, "--clients") && v) {
            ip = &b.clients;
        } else if (!strcmp(a, "--ops") && v) {
            ip = &b.ops;
        } else if (!strcmp(a, "--round-clients") && v) {
            ip = &b.round_clients;
        } else if (!strcmp(a, "--hold") && v) {
            ip = &b.hold;
        } else if (!strcmp(a, "--value-size") && v) {
            int64_t x;
            if (dt_parse_i64(v, &x) < 0 || x < 0 || x > (64 << 20)) {
                fprintf(stderr, "dtrain bench store: --value-size %s: need 0..67108864\n", v);
                return 2;
            }
            b.value_size = (size_t)x;
        } else {
            fprintf(stderr, "dtrain bench store: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
        if (ip && (dt_parse_int(v, ip) < 0 || *ip < 0)) {
            fprintf(stderr, "dtrain bench store: %s %s: need a number >= 0\n", a, v);
            return 2;
        }
        i++;
    }
    if (b.clients < 1 || b.ops < 1) {
        fprintf(stderr, "dtrain bench store: --clients and --ops must be >= 1\n");
        return 2;
    }
    pthread_mutex_init(&b.mu, NULL);
    pthread_mutex_init(&b.gate_mu, NULL);
    pthread_cond_init(&b.gate_cv, NULL);
    if (raise_nofile(2 * (b.hold + b.clients + b.round_clients) + 64) < 0)
        fprintf(stderr, "dtrain bench store: warning: RLIMIT_NOFILE is too low for %d "
                        "connections (raise it with ulimit -n)\n",
                b.hold + b.clients + b.round_clients);

    dt_err err = {0};
    dt_store_server *srv = NULL;
    if (endpoint) {
        const char *colon = strrchr(endpoint, ':');
        if (!colon || colon == endpoint || (size_t)(colon - endpoint) >= sizeof b.host ||
            dt_parse_int(colon + 1, &b.port) < 0 || b.port <= 0 || b.port > 65535) {
            fprintf(stderr, "dtrain bench store: --endpoint %s: need HOST:PORT\n", endpoint);
            return 2;
        }
        memcpy(b.host, endpoint, (size_t)(colon - endpoint));
        b.host[colon - endpoint] = '\0';
        /* Fail fast on a wrong endpoint instead of letting every client retry for a minute. */
        dt_store_opts po;
        dt_store_opts_default(&po);
        po.connect_timeout_ms = 5000;
        dt_store *probe = NULL;
        if (dt_store_connect(&probe, b.host, b.port, &po, &err) < 0) {
            fprintf(stderr, "dtrain bench store: %s\n", dt_err_str(&err));
            return 1;
        }
        dt_store_free(probe);
    } else {
        dt_store_server_opts o;
        dt_store_server_opts_default(&o);
        o.host = "127.0.0.1";
        if (dt_store_server_start(&srv, &o, &err) < 0) {
            fprintf(stderr, "dtrain bench store: %s\n", dt_err_str(&err));
            return 1;
        }
        dt_strlcpy(b.host, "127.0.0.1", sizeof b.host);
        b.port = dt_store_server_port(srv);
    }
    printf("store bench: %s:%d (%s), %d clients x %d ops, %zu-byte values, round of %d, "
           "%d held\n",
           b.host, b.port, srv ? "embedded server" : "external server", b.clients, b.ops,
           b.value_size, b.round_clients, b.hold);
    fflush(stdout);

    int code = 0;
    double hold_open_s = 0, hold_ping_s = 0;
    int held = 0;
    dt_store **hs = b.hold ? calloc((size_t)b.hold, sizeof *hs) : NULL;
    if (b.hold) {
        uint64_t t0 = dt_now_ns();
        for (; held < b.hold; held++)
            if (!(hs[held] = bench_connect(&b, &err)))
                break;
        hold_open_s = (double)(dt_now_ns() - t0) * 1e-9;
        printf("  hold   %d/%d connections open in %.2f s%s%s\n", held, b.hold, hold_open_s,
               held < b.hold ? ": " : "", held < b.hold ? dt_err_str(&err) : "");
        if (held < b.hold)
            code = 1;
    }

    double ops_s = 0, p50 = 0, p99 = 0, wall = 0;
    if (phase_ops(&b, &ops_s, &p50, &p99, &wall) < 0 || b.failed) {
        fprintf(stderr, "dtrain bench store: ops phase: %d failures; first: %s\n", b.failed,
                b.first_error);
        code = 1;
    }
    printf("  ops    %.0f ops/s   p50 %.0f us   p99 %.0f us   (%d x %d in %.2f s)\n", ops_s, p50,
           p99, b.clients, b.ops, wall);
    fflush(stdout);

    double round_s = 0, round_connect_s = 0;
    if (b.round_clients > 0) {
        b.failed = 0;
        int rc = phase_round(&b, &round_s, &round_connect_s);
        if (rc < 0 || b.failed) {
            fprintf(stderr, "dtrain bench store: round: %s (%d failures; first: %s)\n",
                    strerror(-rc), b.failed, b.first_error);
            code = 1;
        }
        printf("  round  %d clients: %.3f s from start to the last client done (connecting "
               "them took %.2f s)\n",
               b.round_clients, round_s, round_connect_s);
    }

    if (held) {
        uint64_t t0 = dt_now_ns();
        int ok = 0;
        for (int i = 0; i < held; i++) {
            ok += dt_store_ping(hs[i], NULL, &err) == 0;
            dt_store_free(hs[i]);
        }
        hold_ping_s = (double)(dt_now_ns() - t0) * 1e-9;
        printf("  hold   %d/%d held connections answered a ping after the run (%.2f s)\n", ok,
               held, hold_ping_s);
        if (ok < held)
            code = 1;
    }
    free(hs);
    if (b.json)
        printf("{\"bench\":\"store\",\"clients\":%d,\"ops\":%d,\"value_size\":%zu,"
               "\"ops_per_s\":%.0f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"round_clients\":%d,"
               "\"round_s\":%.4f,\"held\":%d,\"hold_open_s\":%.3f,\"ok\":%s}\n",
               b.clients, b.ops, b.value_size, ops_s, p50, p99, b.round_clients, round_s, held,
               hold_open_s, code ? "false" : "true");
    dt_store_server_stop(srv);
    pthread_mutex_destroy(&b.mu);
    return code;
}
