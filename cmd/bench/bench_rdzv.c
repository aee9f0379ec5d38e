/* bench_rdzv.c - `dtrain bench rdzv`: N simulated agents rendezvous through one store; time to
 * form a round and to recover from one node's death.
 *
 *   dtrain bench rdzv [--nodes N]... [--hb-interval S] [--hb-timeout S] [--poll S]
 *                     [--last-call S] [--kill-rank G] [--json]
 *                     [--backend c10d|etcd] [--endpoints H:P,...] [--etcd-members 1|3]
 *
 * --backend etcd: the agents run the etcd rendezvous (rdzv_etcd.c) against the etcd members at
 * --endpoints, or, without it, against --etcd-members (default 1) etcd processes this command
 * starts on 127.0.0.1 (free ports, a temporary data directory; `etcd` must be on the PATH) and
 * kills at the end. Each agent then holds two HTTP connections (its own and its heartbeat
 * thread's) instead of two store connections.
 *
 * Each simulated agent is a thread running the real c10d rendezvous (rendezvous/rdzv.h) with
 * its own store connections and heartbeat thread, against one store server in this process
 * (127.0.0.1, its own loop thread), exactly as agents on N machines would talk to the store on
 * node 0 - except that here all of it shares this machine's cores. Per N:
 *   connect   every agent opens the rendezvous (two connections, heartbeat thread)
 *   round     all start dt_rdzv_next at once: time until the last one has its rank
 *   recovery  every agent polls (--poll, the agent's --monitor-interval); one agent (group rank
 *             --kill-rank, default N/2) dies without a word (dt_rdzv_kill). Detect: until the
 *             first survivor sees the round end (about --hb-timeout); rejoin: from then until
 *             the last survivor has its rank in the new round (what the design controls)
 *   finish    every survivor reports success and polls until the job succeeded
 * Agents run at nice 10, the store at nice 0: on a real cluster the store host's CPU is not
 * shared with thousands of agents. Per-node cost: round time and the process's CPU time during
 * the round, divided by N. The
 * default --nodes list is 256 1024 4096; a size this machine cannot hold (file descriptors,
 * threads) is reported, with the limit that stopped it, and the larger ones are skipped.
 * Target (issue 5, 2-core machine): a 1,024-node round in under 5 s, per-node cost flat in N.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/rdzv_etcd_client.h"
#include "rendezvous/store_server.h"

#define MAX_SIZES 16
#define NODE_STACK (256 * 1024)

typedef struct bench bench;

typedef struct node {
    bench *b;
    int idx;
    pthread_t th;
    bool started;
    dt_rdzv_round rd;
    double t_round0, t_seen, t_round1, t_done;
    int g0, g1;
    atomic_int kill;   /* set by the main thread: die now */
    bool dead;
} node;

struct bench {
    int n, port, kill_rank;
    const char *backend;     /* "c10d" or "etcd" */
    char endpoints[1024];    /* etcd: the members */
    double hb_interval, hb_timeout, poll, last_call;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int opened, formed0, formed1, finished, failed;
    bool go;
    double t_go, t_kill;
    char error[DT_ERR_MSG_MAX];
    node *nodes;
};

static void fail(bench *b, const char *what, const dt_err *e)
{
    pthread_mutex_lock(&b->mu);
    if (!b->failed++)
        snprintf(b->error, sizeof b->error, "%.60s: %.900s", what, dt_err_str(e));
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void bump(bench *b, int *counter)
{
    pthread_mutex_lock(&b->mu);
    (*counter)++;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
}

static void *node_main(void *arg)
{
    node *nd = arg;
    bench *b = nd->b;
    dt_rdzv *rz = NULL;
    dt_rdzv_opts o;
    dt_rdzv_status st;
    dt_err e = {0};
    /* The store's loop thread stands for another machine: agents on their own machines do not
     * take its CPU. Here they share two cores with it, so they run at a lower priority (nice
     * is per thread on Linux and inherited by the heartbeat thread the rendezvous starts). */
    setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), 10);
    memset(&o, 0, sizeof o);
    dt_strlcpy(o.backend, b->backend, sizeof o.backend);
    snprintf(o.nnodes, sizeof o.nnodes, "1:%d", b->n);
    dt_strlcpy(o.endpoint_host, "127.0.0.1", sizeof o.endpoint_host);
    o.endpoint_port = b->port;
    dt_strlcpy(o.endpoints, b->endpoints, sizeof o.endpoints);
    snprintf(o.run_id, sizeof o.run_id, "bench-%d-%d", b->n, (int)getpid());
    dt_strlcpy(o.local_addr, "127.0.0.1", sizeof o.local_addr);
    o.local_world_size = 8;
    o.max_restarts = 3;
    o.join_timeout = 300;
    o.close_timeout = 30;
    o.heartbeat_interval = b->hb_interval;
    o.heartbeat_timeout = b->hb_timeout;
    o.last_call_timeout = b->last_call;
    if (dt_rdzv_open(&rz, &o, &e)) {
        fail(b, "open", &e);
        return NULL;
    }
    pthread_mutex_lock(&b->mu);
    b->opened++;
    pthread_cond_broadcast(&b->cv);
    while (!b->go && !b->failed)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    if (b->failed)
        goto out;
    if (dt_rdzv_next(rz, &nd->rd, &st, &e)) {
        fail(b, "first round", &e);
        goto out;
    }
    nd->t_round0 = dt_now_s();
    nd->g0 = nd->rd.group_rank;
    bump(b, &b->formed0);
    int poll_ms = (int)(b->poll * 1000);
    /* The monitor loop of an agent whose workers run. */
    for (;;) {
        if (atomic_load(&nd->kill)) {
            pthread_mutex_lock(&b->mu);
            b->t_kill = dt_now_s();
            pthread_mutex_unlock(&b->mu);
            dt_rdzv_kill(rz);
            nd->dead = true;
            goto out;
        }
        if (dt_rdzv_poll(rz, &st, &e)) {
            fail(b, "poll", &e);
            goto out;
        }
        if (st.state == DT_RDZV_REGROUP)
            break;
        if (st.state != DT_RDZV_RUNNING) {
            dt_err_set(&e, -EPROTO, "unexpected end of the round: %s", st.why);
            fail(b, "poll", &e);
            goto out;
        }
        dt_sleep_ms(poll_ms);
    }
    nd->t_seen = dt_now_s();
    if (dt_rdzv_next(rz, &nd->rd, &st, &e)) {
        fail(b, "recovery round", &e);
        goto out;
    }
    nd->t_round1 = dt_now_s();
    nd->g1 = nd->rd.group_rank;
    bump(b, &b->formed1);
    if (dt_rdzv_succeeded(rz, &e)) {
        fail(b, "success", &e);
        goto out;
    }
    for (;;) {
        if (dt_rdzv_poll(rz, &st, &e)) {
            fail(b, "final poll", &e);
            goto out;
        }
        if (st.state == DT_RDZV_SUCCEEDED)
            break;
        if (st.state != DT_RDZV_RUNNING) {
            dt_err_set(&e, -EPROTO, "unexpected end of the round: %s", st.why);
            fail(b, "final poll", &e);
            goto out;
        }
        dt_sleep_ms(poll_ms);
    }
    nd->t_done = dt_now_s();
    bump(b, &b->finished);
out:
    dt_rdzv_close(rz);
    return NULL;
}

/* Waits until *counter >= want (or a failure); false on a failure or after timeout_s. */
static bool wait_count(bench *b, int *counter, int want, double timeout_s)
{
    double deadline = dt_now_s() + timeout_s;
    pthread_mutex_lock(&b->mu);
    while (*counter < want && !b->failed && dt_now_s() < deadline) {
        pthread_mutex_unlock(&b->mu);
        dt_sleep_ms(20);
        pthread_mutex_lock(&b->mu);
    }
    bool ok = *counter >= want && !b->failed;
    if (!ok && !b->failed)
        snprintf(b->error, sizeof b->error, "timed out after %g s (%d of %d)", timeout_s,
                 *counter, want);
    pthread_mutex_unlock(&b->mu);
    return ok;
}

static double cpu_s(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

typedef struct result {
    int n;
    bool ok;
    double connect_s, round_s, cpu_round_s, detect_s, rejoin_s, recovery_s, finish_s;
    char why[DT_ERR_MSG_MAX];
} result;

/* One size. The process's limits were raised by the caller. */
static void run_size(bench *b, result *r)
{
    dt_store_server *srv = NULL;
    dt_store_server_opts so;
    dt_err e = {0};
    memset(r, 0, sizeof *r);
    r->n = b->n;
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    so.max_connections = (size_t)4 * (size_t)b->n + 64;
    if (strcmp(b->backend, "etcd") && dt_store_server_start(&srv, &so, &e)) {
        snprintf(r->why, sizeof r->why, "store: %.900s", e.msg);
        return;
    }
    b->port = srv ? dt_store_server_port(srv) : 0;
    b->nodes = calloc((size_t)b->n, sizeof *b->nodes);
    if (!b->nodes) {
        snprintf(r->why, sizeof r->why, "out of memory");
        dt_store_server_stop(srv);
        return;
    }
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, NODE_STACK);
    double t0 = dt_now_s();
    int started = 0;
    for (int i = 0; i < b->n; i++) {
        node *nd = &b->nodes[i];
        nd->b = b;
        nd->idx = i;
        int rc = pthread_create(&nd->th, &at, node_main, nd);
        if (rc) {
            dt_err te = {0};
            dt_err_set(&te, -rc, "thread %d of %d: %s (threads: 2 per simulated agent)", i + 1,
                       b->n, strerror(rc));
            fail(b, "pthread_create", &te);
            break;
        }
        nd->started = true;
        started++;
    }
    pthread_attr_destroy(&at);
    double timeout = 60 + b->n * 0.05;
    if (!wait_count(b, &b->opened, b->n, timeout))
        goto done;
    r->connect_s = dt_now_s() - t0;

    double c0 = cpu_s();
    pthread_mutex_lock(&b->mu);
    b->t_go = dt_now_s();
    b->go = true;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    if (!wait_count(b, &b->formed0, b->n, timeout))
        goto done;
    double last = 0;
    for (int i = 0; i < b->n; i++)
        last = DT_MAX(last, b->nodes[i].t_round0);
    r->round_s = last - b->t_go;
    r->cpu_round_s = cpu_s() - c0;

    /* Recovery: let a few polls and heartbeats pass, then kill one node. */
    dt_sleep_ms((int)(1000 * DT_MAX(2 * b->hb_interval, 0.5)));
    int kg = b->kill_rank >= 0 && b->kill_rank < b->n ? b->kill_rank : b->n / 2;
    node *victim = NULL;
    for (int i = 0; i < b->n; i++)
        if (b->nodes[i].g0 == kg)
            victim = &b->nodes[i];
    if (!victim || b->n < 2) {
        snprintf(r->why, sizeof r->why, "no node with group rank %d to kill", kg);
        r->ok = true; /* the round figures stand */
        goto done;
    }
    atomic_store(&victim->kill, 1);
    if (!wait_count(b, &b->formed1, b->n - 1, timeout + 10 * b->hb_timeout))
        goto done;
    double first_seen = 1e300, last1 = 0, t_kill;
    pthread_mutex_lock(&b->mu);
    t_kill = b->t_kill;
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < b->n; i++) {
        node *nd = &b->nodes[i];
        if (nd->dead)
            continue;
        first_seen = DT_MIN(first_seen, nd->t_seen);
        last1 = DT_MAX(last1, nd->t_round1);
    }
    r->detect_s = first_seen - t_kill;
    r->rejoin_s = last1 - first_seen;
    r->recovery_s = last1 - t_kill;
    if (!wait_count(b, &b->finished, b->n - 1, timeout))
        goto done;
    double lastd = 0;
    for (int i = 0; i < b->n; i++)
        if (!b->nodes[i].dead)
            lastd = DT_MAX(lastd, b->nodes[i].t_done);
    r->finish_s = lastd - last1;
    r->ok = true;
done:
    if (!r->ok || r->why[0] == '\0') {
        pthread_mutex_lock(&b->mu);
        if (!r->ok)
            snprintf(r->why, sizeof r->why, "%s", b->error);
        pthread_mutex_unlock(&b->mu);
    }
    if (!r->ok) {
        /* Threads may be stuck in a rendezvous that cannot complete: the caller exits. */
        return;
    }
    for (int i = 0; i < b->n; i++)
        if (b->nodes[i].started)
            pthread_join(b->nodes[i].th, NULL);
    (void)started;
    free(b->nodes);
    b->nodes = NULL;
    dt_store_server_stop(srv);
}

/* ---- etcd members started here -------------------------------------------------------- */

#define ETCD_MAX 3
static pid_t etcd_pid[ETCD_MAX];
static char etcd_dir[256];

static void etcd_stop(void)
{
    for (int i = 0; i < ETCD_MAX; i++)
        if (etcd_pid[i] > 0) {
            kill(etcd_pid[i], SIGKILL);
            waitpid(etcd_pid[i], NULL, 0);
            etcd_pid[i] = 0;
        }
    if (etcd_dir[0]) {
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", etcd_dir);
        if (system(cmd) != 0)
            fprintf(stderr, "dtrain bench rdzv: could not remove %s\n", etcd_dir);
        etcd_dir[0] = '\0';
    }
}

/* Starts m members on 127.0.0.1 (free ports) and waits (20 s at most) until they answer with a
 * leader; fills endpoints. */
static int etcd_start(int m, char *endpoints, size_t cap, dt_err *err)
{
    int client[ETCD_MAX], peer[ETCD_MAX], rc;
    char initial[512] = "";
    snprintf(etcd_dir, sizeof etcd_dir, "%s/dtrain-bench-etcd-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(etcd_dir)) {
        etcd_dir[0] = '\0';
        return dt_err_set(err, -errno, "mkdtemp: %s", strerror(errno));
    }
    endpoints[0] = '\0';
    for (int i = 0; i < m; i++) {
        if ((rc = dt_rdzv_free_port(&client[i], err)) || (rc = dt_rdzv_free_port(&peer[i], err)))
            return rc;
        snprintf(initial + strlen(initial), sizeof initial - strlen(initial),
                 "%sm%d=http://127.0.0.1:%d", i ? "," : "", i, peer[i]);
        snprintf(endpoints + strlen(endpoints), cap - strlen(endpoints), "%s127.0.0.1:%d",
                 i ? "," : "", client[i]);
    }
    for (int i = 0; i < m; i++) {
        char a[8][256], log[300];
        snprintf(a[0], sizeof a[0], "m%d", i);
        snprintf(a[1], sizeof a[1], "%.200s/m%d", etcd_dir, i);
        snprintf(a[2], sizeof a[2], "http://127.0.0.1:%d", client[i]);
        snprintf(a[3], sizeof a[3], "http://127.0.0.1:%d", peer[i]);
        snprintf(log, sizeof log, "%.200s/m%d.log", etcd_dir, i);
        pid_t pid = fork();
        if (pid < 0)
            return dt_err_set(err, -errno, "fork: %s", strerror(errno));
        if (pid == 0) {
            FILE *f = freopen(log, "w", stdout);
            (void)f;
            dup2(1, 2);
            execlp("etcd", "etcd", "--name", a[0], "--data-dir", a[1], "--listen-client-urls",
                   a[2], "--advertise-client-urls", a[2], "--listen-peer-urls", a[3],
                   "--initial-advertise-peer-urls", a[3], "--initial-cluster", initial,
                   "--initial-cluster-state", "new", "--max-txn-ops", "1024", (char *)NULL);
            _exit(127);
        }
        etcd_pid[i] = pid;
    }
    double deadline = dt_now_s() + 20;
    for (;;) {
        dt_etcd *ec = NULL;
        char *v = NULL;
        bool ok = dt_etcd_open(&ec, endpoints, 1, NULL, NULL) == 0;
        int grc = ok ? dt_etcd_get(ec, "dtrain-bench", &v, NULL, NULL) : -1;
        ok = grc == 0 || grc == -ENOENT; /* a linearizable read: there is a leader */
        free(v);
        dt_etcd_free(ec);
        if (ok)
            return 0;
        for (int i = 0; i < m; i++)
            if (waitpid(etcd_pid[i], NULL, WNOHANG) == etcd_pid[i]) {
                etcd_pid[i] = 0;
                return dt_err_set(err, -ECHILD,
                                  "etcd exited at start (is etcd on the PATH? see %s/m%d.log)",
                                  etcd_dir, i);
            }
        if (dt_now_s() >= deadline)
            return dt_err_set(err, -ETIMEDOUT, "etcd did not answer within 20 s (see %s)",
                              etcd_dir);
        dt_sleep_ms(100);
    }
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: dtrain bench rdzv [--nodes N]... [--hb-interval S] [--hb-timeout S] [--poll S]\n"
            "                         [--last-call S] [--kill-rank G] [--json]\n\n"
            "N simulated agents (threads with their own store connections and heartbeats) run the\n"
            "c10d rendezvous against one in-process store: time to form a round, to recover from\n"
            "one node's death, per-node cost. Default sizes 256 1024 4096.\n\n"
            "  --nodes N        a size (repeatable)\n"
            "  --hb-interval S  heartbeat interval (0.5)\n"
            "  --hb-timeout S   heartbeat timeout (2)\n"
            "  --poll S         how often each agent checks its round (0.25)\n"
            "  --last-call S    last-call window (60: rounds close on MAX or returning survivors)\n"
            "  --kill-rank G    group rank of the node that dies (default N/2)\n"
            "  --json           one JSON object per size instead of the table\n"
            "  --backend B      c10d (default: one in-process store) or etcd\n"
            "  --endpoints L    etcd: the members, HOST:PORT,... (default: start them here)\n"
            "  --etcd-members M etcd: how many members to start on 127.0.0.1 (1 or 3; default 1;\n"
            "                   `etcd` on the PATH)\n");
}

int dt_bench_rdzv(int argc, char **argv)
{
    int sizes[MAX_SIZES], ns = 0, json = 0, members = 0;
    bench b;
    memset(&b, 0, sizeof b);
    b.backend = "c10d";
    b.hb_interval = 0.5;
    b.hb_timeout = 2;
    b.poll = 0.25;
    b.last_call = 60;
    b.kill_rank = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        int n;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--nodes") && v && dt_parse_int(v, &n) == 0 && n >= 1 &&
                   ns < MAX_SIZES) {
            sizes[ns++] = n;
            i++;
        } else if (!strcmp(a, "--backend") && v && (!strcmp(v, "c10d") || !strcmp(v, "etcd"))) {
            b.backend = !strcmp(v, "etcd") ? "etcd" : "c10d";
            i++;
        } else if (!strcmp(a, "--endpoints") && v) {
            dt_strlcpy(b.endpoints, v, sizeof b.endpoints);
            i++;
        } else if (!strcmp(a, "--etcd-members") && v && dt_parse_int(v, &n) == 0 &&
                   (n == 1 || n == 3)) {
            members = n;
            i++;
        } else if (!strcmp(a, "--kill-rank") && v && dt_parse_int(v, &n) == 0) {
            b.kill_rank = n;
            i++;
        } else if ((!strcmp(a, "--hb-interval") || !strcmp(a, "--hb-timeout") ||
                    !strcmp(a, "--poll") || !strcmp(a, "--last-call")) &&
                   v && dt_parse_duration(v, &d) == 0 && d > 0) {
            if (!strcmp(a, "--hb-interval"))
                b.hb_interval = d;
            else if (!strcmp(a, "--hb-timeout"))
                b.hb_timeout = d;
            else if (!strcmp(a, "--poll"))
                b.poll = d;
            else
                b.last_call = d;
            i++;
        } else {
            fprintf(stderr, "dtrain bench rdzv: bad argument \"%s\"\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (b.hb_timeout <= b.hb_interval) {
        fprintf(stderr, "dtrain bench rdzv: --hb-timeout must be longer than --hb-interval\n");
        return 2;
    }
    if (ns == 0) {
        sizes[ns++] = 256;
        sizes[ns++] = 1024;
        sizes[ns++] = 4096;
    }
    bool etcd = !strcmp(b.backend, "etcd");
    if (!etcd && (b.endpoints[0] || members)) {
        fprintf(stderr, "dtrain bench rdzv: --endpoints and --etcd-members are for --backend "
                        "etcd\n");
        return 2;
    }
    if (etcd && b.endpoints[0] && members) {
        fprintf(stderr, "dtrain bench rdzv: --endpoints (members running) or --etcd-members "
                        "(members started here), not both\n");
        return 2;
    }
    if (etcd && !b.endpoints[0]) {
        dt_err e = {0};
        if (etcd_start(members ? members : 1, b.endpoints, sizeof b.endpoints, &e)) {
            fprintf(stderr, "dtrain bench rdzv: cannot start etcd: %s\n", e.msg);
            etcd_stop();
            return 1;
        }
        atexit(etcd_stop); /* the return below, and the exit of a size that stops */
    }
    pthread_mutex_init(&b.mu, NULL);
    pthread_cond_init(&b.cv, NULL);
    if (dt_log_level == DT_LOG_INFO && !getenv("DTRAIN_LOG"))
        dt_log_level = DT_LOG_WARN; /* N agents saying hello is not news */

    /* File descriptors: 2 connections per agent, both ends in this process. */
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    getrlimit(RLIMIT_NOFILE, &rl);
    struct rlimit rt;
    getrlimit(RLIMIT_NPROC, &rt);

    int code = 0;
    if (!json) {
        if (etcd)
            printf("dtrain bench rdzv: etcd rendezvous, N simulated agents (threads at nice 10, 2 "
                   "HTTP connections and a heartbeat thread each) on etcd at %s%s\n",
                   b.endpoints, etcd_pid[0] ? " (started here)" : "");
        else
            printf("dtrain bench rdzv: c10d rendezvous, N simulated agents (threads at nice 10, 2 "
                   "store connections and a heartbeat thread each) on one in-process store (nice "
                   "0)\n");
        printf("heartbeat %g s, timeout %g s; poll %g s; last call %g s; file descriptors %llu, "
               "threads (RLIMIT_NPROC) %llu\n\n",
               b.hb_interval, b.hb_timeout, b.poll, b.last_call, (unsigned long long)rl.rlim_cur,
               (unsigned long long)rt.rlim_cur);
        printf("%7s %10s %9s %9s %12s %9s %9s %11s %9s\n", "nodes", "connect_s", "round_s",
               "ms/node", "cpu_us/node", "detect_s", "rejoin_s", "recovery_s", "finish_s");
    }
    for (int s = 0; s < ns; s++) {
        result r;
        int n = sizes[s];
        unsigned long long need_fd = 4ull * (unsigned long long)n + 64;
        if (rl.rlim_cur != RLIM_INFINITY && need_fd > rl.rlim_cur) {
            printf("%7d  stops here: needs about %llu file descriptors (4 per agent: 2 connections, "
                   "both ends in this process); RLIMIT_NOFILE allows %llu\n",
                   n, need_fd, (unsigned long long)rl.rlim_cur);
            code = code ? code : 0;
            continue;
        }
        b.n = n;
        b.opened = b.formed0 = b.formed1 = b.finished = b.failed = 0;
        b.go = false;
        b.error[0] = '\0';
        run_size(&b, &r);
        if (!r.ok) {
            printf("%7d  stops here: %s\n", n, r.why);
            fflush(stdout);
            return 1; /* threads may still be waiting in the store: exiting ends them */
        }
        if (json)
            printf("{\"nodes\":%d,\"connect_s\":%.3f,\"round_s\":%.3f,\"ms_per_node\":%.4f,"
                   "\"cpu_us_per_node\":%.1f,\"detect_s\":%.3f,\"rejoin_s\":%.3f,"
                   "\"recovery_s\":%.3f,\"finish_s\":%.3f}\n",
                   n, r.connect_s, r.round_s, 1000 * r.round_s / n, 1e6 * r.cpu_round_s / n,
                   r.detect_s, r.rejoin_s, r.recovery_s, r.finish_s);
        else
            printf("%7d %10.2f %9.3f %9.4f %12.1f %9.2f %9.3f %11.2f %9.3f\n", n, r.connect_s,
                   r.round_s, 1000 * r.round_s / n, 1e6 * r.cpu_round_s / n, r.detect_s,
                   r.rejoin_s, r.recovery_s, r.finish_s);
        fflush(stdout);
    }
    if (!json)
        printf("\nround: all N call dt_rdzv_next at once -> the last has its rank. recovery: one "
               "agent dies silently -> detect (first survivor sees the round end; about the "
               "heartbeat timeout) + rejoin (last survivor ranked in the new round).\n");
    return code;
}
