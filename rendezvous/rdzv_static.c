/* rdzv_static.c - the static rendezvous (fixed nnodes, given node ranks) over the dtrain store;
 * see rdzv.h for the contract, rdzv_backend.h for how rdzv.c calls it.
 *
 * Keys, all under "dtrain/<rdzv id>/":
 *   owner            node 0's claim on the namespace (compare-and-set from absent)
 *   conf             node 0's settings, the job's (JSON: run_id, max_restarts, min = max =
 *                    nnodes, job: the settings every node must share, digest; see
 *                    dt_rdzv_conf_parse): every other node checks them and its own job against
 *                    them before it writes anything of its own; a node whose job differs is
 *                    refused (exit 2) and the job waits for that node as if it had not come
 *   refused          "<node> <why>" of the last node refused so (node 0 says it while it waits)
 *   round            the round node 0 is in; an agent of another node that starts late (or is
 *                    restarted) joins that round
 *   abort            "<node> <signal> <why>": the job was stopped; every node ends (signal
 *                    -1: a setup error, the nodes disagree on --nnodes or a node's workers
 *                    report a configuration error)
 *   left/<k>         node k has seen the job's outcome; the store host waits for these
 *   r<R>/hb/<k>      node k's heartbeat counter (decimal, written with set: idempotent)
 *   r<R>/node/<k>    node k's record for round R (JSON: host, addr, nproc, nnodes,
 *                    max_restarts, pid, nonce; node 0 adds run_id, master_port). Every node
 *                    checks its --nnodes against node 0's (node 0: against everyone's)
 *   r<R>/done/<k>    node k's workers all succeeded
 *   r<R>/failures    JSON lines appended by every node, one per failure
 *   r<R>/end         how round R ended, first writer wins (compare-and-set):
 *                    "fail <node> <why>" or "abort <node> <signal> <why>"
 *
 * A round costs each node three writes and one multi-get; a poll costs one get (plus, every
 * heartbeat_interval, one set and one multi-get). One node alone talks to no store at all
 * while its rounds come and go: it only hosts the store for its workers.
 */
#include "rendezvous/rdzv_static.h"

#include <cJSON.h>
#include <errno.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"

/* One agent's static rendezvous (the backend state behind a dt_rdzv). */
typedef struct static_rdzv {
    dt_rdzv_opts o;
    int nnodes;
    int node;                     /* this node's rank */
    dt_store_server *server;      /* the store, when this agent hosts it (owned) */
    dt_store *base;               /* connection to the store (owned; NULL for one node) */
    dt_store *ns;                 /* view under "dtrain/<id>/" (owned) */
    char store_addr[DT_RDZV_STR]; /* the store as workers reach it */
    int store_port;
    char local_addr[DT_RDZV_STR]; /* this node's address */
    char nonce[40];               /* tells this agent's records from another's */
    char run_id[DT_RDZV_STR];     /* effective run id (node 0 decides) */
    int max_restarts;             /* the job's (node 0's) */
    int round;                    /* current round, -1 before the first */
    int formed;                   /* last round that formed, -1 = none */
    bool done;                    /* this node reported success in the current round */
    bool left;                    /* left/<node> written */
    bool store_gone;              /* a call found the store unreachable: ask it nothing more */
    bool setup_failed;            /* the job ended on a setup error in round `round` */
    char refused_seen[17];        /* node 0: digest of the last "refused" record it said */
    dt_rdzv_status ended;         /* cached end of the current round (RUNNING = not yet) */
    bool *member;                 /* nnodes: in the last formed round and not lost */
    char (*hosts)[64];            /* nnodes: host names from the records */
    int64_t hb_count;             /* this node's heartbeat counter */
    double next_hb;               /* monotonic time of the next heartbeat */
    int64_t *hb_val;              /* nnodes: last counter seen */
    double *hb_seen;              /* nnodes: monotonic time it last changed */
    dt_rdzv_fail_list fails;      /* this node's failures of the current round */

    /* Liveness from open to close (a thread with its own connection, so that it beats while
     * the agent stops its workers or waits in a call): alive/<node> counts up every
     * heartbeat_interval. The store host reads these at the end, so that it waits for no node
     * whose agent is gone. alive_* under alive_mu; the thread alone uses alive_base/alive_ns. */
    pthread_t alive_thread;
    bool alive_running;
    pthread_mutex_t alive_mu;
    pthread_cond_t alive_cv;
    bool alive_stop;
    dt_store *alive_base, *alive_ns; /* owned */
} static_rdzv;

static int st_failed(void *self, const dt_rdzv_failure *f, int n, dt_err *err);
static void st_close(void *self);

/* Notes an error that means the store is gone (its host died): nothing more is asked of it,
 * so that ending the job does not wait out a timeout per call. Returns rc. */
static int store_failed(static_rdzv *r, int rc)
{
    if (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -EHOSTUNREACH ||
        rc == -ENETUNREACH || rc == -EPIPE)
        r->store_gone = true;
    return rc;
}

/* Key formatting: "r<R>/<what>" or "r<R>/<what>/<k>". */
static void rkey(char *buf, size_t cap, int round, const char *what, int k)
{
    if (k >= 0)
        snprintf(buf, cap, "r%d/%s/%d", round, what, k);
    else
        snprintf(buf, cap, "r%d/%s", round, what);
}

static int set_str(dt_store *s, const char *key, const char *v, dt_err *err)
{
    return dt_store_set(s, key, v, strlen(v), err);
}

/* The <signal> of an abort record that ends the job on a setup error (nodes that disagree on
 * --nnodes, a node's configuration error): no signal, and dt_rdzv_status.setup_error. */
#define SETUP_SIG (-1)

/* "abort <node> <sig> <why>" or "fail <node> <why>" (a round's end) or "<node> <sig> <why>"
 * (the job's abort key) into st. */
static void parse_end(const char *v, bool job_key, dt_rdzv_status *st)
{
    int node = -1, sig = 0, n = 0;
    memset(st, 0, sizeof *st);
    if (job_key) {
        sscanf(v, "%d %d %n", &node, &sig, &n);
        st->state = DT_RDZV_ABORTED;
    } else if (!strncmp(v, "abort ", 6)) {
        sscanf(v + 6, "%d %d %n", &node, &sig, &n);
        n += 6;
        st->state = DT_RDZV_ABORTED;
    } else {
        sscanf(v, "fail %d %n", &node, &n);
        st->state = DT_RDZV_FAILED;
    }
    st->node = node;
    st->signal = sig > 0 ? sig : 0;
    st->setup_error = sig == SETUP_SIG;
    snprintf(st->why, sizeof st->why, "%s", n > 0 && (size_t)n <= strlen(v) ? v + n : v);
}

/* The job's abort key, if set: fills st and returns true. */
static bool job_aborted(static_rdzv *r, dt_rdzv_status *st)
{
    void *v = NULL;
    size_t len;
    if (!r->ns || dt_store_get(r->ns, "abort", &v, &len, 0, NULL) != 0)
        return false;
    parse_end(v, true, st);
    free(v);
    return true;
}

/* Node 0: a node that was refused (its job differs) is said once per record. */
static void say_refused(static_rdzv *r)
{
    char *v = NULL, dg[17];
    if (dt_rdzv_get_str(r->ns, "refused", &v, 0, NULL) != 0)
        return;
    dt_rdzv_job_digest(v, dg);
    if (strcmp(dg, r->refused_seen)) {
        int node = -1;
        sscanf(v, "%d", &node);
        for (char *p = v; *p; p++) /* written by another node: shown, not obeyed */
            if ((unsigned char)*p < 0x20 || *p == 0x7f)
                *p = '?';
        DT_WARN("node %d was refused and exited: node %.700s (see its log); waiting for it to "
                "come back with this job (join_timeout %g s)",
                node, v, r->o.join_timeout);
        memcpy(r->refused_seen, dg, sizeof dg);
    }
    free(v);
}

/* Gets n keys, waiting for all of them until deadline in slices of 100 ms; between slices
 * checks for an interrupt and for the job's abort. */
static int wait_keys(static_rdzv *r, const char *const *keys, size_t n, void **vals, size_t *lens,
                     double deadline, dt_rdzv_status *st, dt_err *err)
{
    for (;;) {
        double left = deadline - dt_now_s();
        if (left <= 0)
            return dt_err_set(err, -ETIMEDOUT, "timed out");
        /* At least 20 ms: the client sends the time left when it sends, and a wait that has
         * 0 ms left by then is answered as "do not wait" (-ENOENT). */
        int ms = left > 0.1 ? 100 : left > 0.02 ? (int)(left * 1000) : 20;
        dt_err e = {0};
        int rc = dt_store_multi_get(r->ns, keys, n, vals, lens, ms, &e);
        if (rc == 0)
            return 0;
        if (rc != -ETIMEDOUT && rc != -ENOENT) {
            if (err)
                *err = e;
            return rc;
        }
        if (r->o.interrupted && r->o.interrupted(r->o.arg))
            return dt_err_set(err, -EINTR, "interrupted while waiting for the other nodes");
        if (r->node == 0)
            say_refused(r);
        if (job_aborted(r, st))
            return dt_err_set(err, -ECANCELED, "node %d ended the job (%s)", st->node, st->why);
    }
}

static void mark_left(static_rdzv *r)
{
    char key[64];
    if (r->left || !r->ns || r->nnodes == 1 || r->store_gone)
        return;
    snprintf(key, sizeof key, "left/%d", r->node);
    if (set_str(r->ns, key, "1", NULL) == 0)
        r->left = true;
}

static int connect_store(static_rdzv *r, const char *host, int port, dt_err *err)
{
    return dt_rdzv_connect_store(&r->base, &r->o, host, port, err);
}

/* Hosts the store. Returns 0, or -EADDRINUSE when something already listens there. */
static int host_store(static_rdzv *r, const char *bind_host, int port, dt_err *err)
{
    return dt_rdzv_host_store(&r->server, bind_host, port, err);
}

/* ---- liveness ---------------------------------------------------------------------------- */

static void *alive_main(void *arg)
{
    static_rdzv *r = arg;
    char key[32];
    int64_t count = 0;
    snprintf(key, sizeof key, "alive/%d", r->node);
    pthread_mutex_lock(&r->alive_mu);
    while (!r->alive_stop) {
        pthread_mutex_unlock(&r->alive_mu);
        char v[32];
        snprintf(v, sizeof v, "%lld", (long long)++count);
        dt_err e = {0};
        if (set_str(r->alive_ns, key, v, &e))
            DT_DEBUG("liveness beat: %s", e.msg);
        pthread_mutex_lock(&r->alive_mu);
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + r->o.heartbeat_interval;
        ts.tv_sec = (time_t)at;
        ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
        while (!r->alive_stop && pthread_cond_timedwait(&r->alive_cv, &r->alive_mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&r->alive_mu);
    return NULL;
}

/* Starts the liveness thread on a connection of its own to host:port (prefix: the job's). */
static int alive_start(static_rdzv *r, const char *host, const char *prefix, dt_err *err)
{
    int rc;
    pthread_condattr_t ca;
    if ((rc = dt_rdzv_connect_store(&r->alive_base, &r->o, host, r->store_port, err)) ||
        (rc = dt_store_prefixed(&r->alive_ns, r->alive_base, prefix, err)))
        return rc;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&r->alive_mu, NULL);
    pthread_cond_init(&r->alive_cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = pthread_create(&r->alive_thread, NULL, alive_main, r))) {
        pthread_cond_destroy(&r->alive_cv);
        pthread_mutex_destroy(&r->alive_mu);
        return dt_err_errno(err, rc, "cannot start the liveness thread");
    }
    r->alive_running = true;
    return 0;
}

static void alive_stop(static_rdzv *r)
{
    if (r->alive_running) {
        pthread_mutex_lock(&r->alive_mu);
        r->alive_stop = true;
        pthread_cond_signal(&r->alive_cv);
        pthread_mutex_unlock(&r->alive_mu);
        pthread_join(r->alive_thread, NULL);
        pthread_cond_destroy(&r->alive_cv);
        pthread_mutex_destroy(&r->alive_mu);
        r->alive_running = false;
    }
    dt_store_free(r->alive_ns);
    dt_store_free(r->alive_base);
    r->alive_ns = r->alive_base = NULL;
}

static int st_open(void **out, const dt_rdzv_opts *opts, dt_err *err)
{
    int rc, nnodes = 0;
    static_rdzv *r = NULL;
    *out = NULL;
    if (dt_parse_int(opts->nnodes, &nnodes) || nnodes < 1)
        return dt_err_set(err, strchr(opts->nnodes, ':') ? -ENOTSUP : -EINVAL,
                          "--nnodes=%s: the static rendezvous needs a fixed number of nodes (an "
                          "elastic MIN:MAX job needs --rdzv-backend=c10d)",
                          opts->nnodes);
    if (opts->node_rank < 0 || opts->node_rank >= nnodes)
        return dt_err_set(err, -EINVAL, "--node-rank=%d: must be 0..%d for --nnodes=%d",
                          opts->node_rank, nnodes - 1, nnodes);
    if (nnodes > 1 && opts->endpoint_port == 0 && opts->node_rank != 0)
        return dt_err_set(err, -EINVAL,
                          "--master-port (or the port of --rdzv-endpoint) is 0: only node 0 may "
                          "pick a free port; give the other nodes the port it printed");
    if (!(r = calloc(1, sizeof *r)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    r->o = *opts;
    r->nnodes = nnodes;
    r->node = opts->node_rank;
    r->round = r->formed = -1;
    r->max_restarts = opts->max_restarts;
    r->member = calloc((size_t)nnodes, sizeof *r->member);
    r->hosts = calloc((size_t)nnodes, sizeof *r->hosts);
    r->hb_val = calloc((size_t)nnodes, sizeof *r->hb_val);
    r->hb_seen = calloc((size_t)nnodes, sizeof *r->hb_seen);
    if (!r->member || !r->hosts || !r->hb_val || !r->hb_seen) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    dt_rdzv_make_id(r->nonce, sizeof r->nonce);
    if (r->node == 0 && opts->run_id[0] && strcmp(opts->run_id, "none"))
        dt_strlcpy(r->run_id, opts->run_id, sizeof r->run_id);
    else if (r->node == 0)
        dt_rdzv_make_id(r->run_id, sizeof r->run_id);

    const char *ep = opts->endpoint_host[0] ? opts->endpoint_host : "127.0.0.1";
    char bind[DT_RDZV_STR], conn[DT_RDZV_STR]; /* the store's address, this agent's way to it */
    if (nnodes == 1) {
        /* Nobody to agree with: the store exists for the workers only. A fixed endpoint (an
         * explicit --rdzv-endpoint) is honoured, else any free loopback port. */
        bool fixed = opts->endpoint_port > 0;
        if (fixed)
            dt_rdzv_store_bind(ep, bind, conn, sizeof bind);
        rc = host_store(r, fixed ? bind : "127.0.0.1", opts->endpoint_port, err);
        if (rc == -EADDRINUSE)
            rc = dt_err_set(err, rc, "port %d is in use; pick another --rdzv-endpoint port, or "
                                     "leave it out to use any free port",
                            opts->endpoint_port);
        if (rc)
            goto fail;
        dt_strlcpy(r->store_addr, fixed ? ep : "127.0.0.1", sizeof r->store_addr);
        r->store_port = dt_store_server_port(r->server);
        dt_strlcpy(r->local_addr, opts->local_addr[0] ? opts->local_addr : "127.0.0.1",
                   sizeof r->local_addr);
        *out = r;
        return 0;
    }

    bool local = dt_rdzv_is_local_host(ep);
    if (r->node == 0 && local) {
        dt_rdzv_store_bind(ep, bind, conn, sizeof bind);
        rc = host_store(r, bind, opts->endpoint_port, err);
        if (rc == -EADDRINUSE)
            DT_INFO("port %d is taken on this host: using the store already listening there "
                    "(an external `dtrain store`)",
                    opts->endpoint_port);
        else if (rc)
            goto fail;
        else
            DT_INFO("hosting the rendezvous store at %s:%d", ep, dt_store_server_port(r->server));
    }
    dt_strlcpy(r->store_addr, ep, sizeof r->store_addr);
    r->store_port = r->server ? dt_store_server_port(r->server) : opts->endpoint_port;
    if ((rc = connect_store(r, r->server ? conn : ep, r->store_port, err)))
        goto fail;
    if (opts->local_addr[0])
        dt_strlcpy(r->local_addr, opts->local_addr, sizeof r->local_addr);
    else if (local)
        dt_strlcpy(r->local_addr, ep, sizeof r->local_addr); /* others reach us there already */
    else
        dt_rdzv_route_addr(ep, r->store_port, r->local_addr, sizeof r->local_addr);

    char prefix[DT_RDZV_STR + 16];
    snprintf(prefix, sizeof prefix, "dtrain/%s/",
             opts->run_id[0] ? opts->run_id : "none");
    if ((rc = dt_store_prefixed(&r->ns, r->base, prefix, err)))
        goto fail;
    if (r->node == 0) {
        /* Claim the namespace: a second node 0, or an earlier job with this id on an external
         * store, is an error rather than a silent mix of two jobs' keys. */
        char claim[128];
        void *cur = NULL;
        size_t curlen = 0;
        snprintf(claim, sizeof claim, "%s:%d:%s", dt_hostname(), (int)getpid(), r->nonce);
        if ((rc = dt_store_cas(r->ns, "owner", NULL, 0, claim, strlen(claim), &cur, &curlen, err)))
            goto fail;
        bool mine = curlen == strlen(claim) && !memcmp(cur, claim, curlen);
        if (!mine)
            rc = dt_err_set(err, -EEXIST,
                            "run id \"%s\" is already in use on the store at %s:%d (by %.*s): "
                            "another node claims --node-rank=0, or an earlier job used this id "
                            "on an external store; pass a new --rdzv-id",
                            opts->run_id, ep, r->store_port, (int)DT_MIN(curlen, 200u),
                            (const char *)cur);
        free(cur);
        if (rc)
            goto fail;
        dt_rdzv_opts own = *opts;
        dt_strlcpy(own.run_id, r->run_id, sizeof own.run_id);
        char *conf = dt_rdzv_conf_propose(&own, nnodes, nnodes);
        rc = conf ? set_str(r->ns, "conf", conf, err) : dt_err_set(err, -ENOMEM, "out of memory");
        free(conf);
        if (rc)
            goto fail;
    }
    if ((rc = alive_start(r, r->server ? conn : ep, prefix, err)))
        goto fail;
    *out = r;
    return 0;
fail:
    st_close(r);
    return rc;
}

/* Checks node i's record (of round R) against this node's settings: a different --nnodes
 * ends the job on every node as a setup error (-EINVAL, and the job's abort key with SETUP_SIG
 * so that the others end the same way); a different --max-restarts is only warned about (node
 * 0's is the job's budget). */
static int check_peer(static_rdzv *r, int R, int i, const cJSON *rec, dt_err *err)
{
    if (!rec)
        return dt_err_set(err, -EBADMSG, "node %d's record in round %d is not JSON", i, R);
    int nn = (int)dt_rdzv_json_num(rec, "nnodes", r->nnodes);
    if (nn != r->nnodes) {
        char h[64], msg[400], v[512];
        dt_rdzv_json_str(rec, "host", h, sizeof h);
        snprintf(msg, sizeof msg,
                 "the nodes disagree on the number of nodes: --nnodes=%d on node %d (%.60s), "
                 "--nnodes=%d on node %d (%.60s); start every node with the same --nnodes",
                 r->nnodes, r->node, dt_hostname(), nn, i, h);
        int rc = dt_err_set(err, -EINVAL, "%s", msg);
        /* The job's abort (for the nodes still joining) and this round's end (for nodes whose
         * round formed without this one: node 0 counted fewer nodes than this node). */
        snprintf(v, sizeof v, "%d %d %s", r->node, SETUP_SIG, msg);
        void *cur = NULL;
        dt_store_cas(r->ns, "abort", NULL, 0, v, strlen(v), &cur, NULL, NULL);
        free(cur);
        cur = NULL;
        char key[64], e[sizeof v + 8];
        snprintf(e, sizeof e, "abort %s", v);
        rkey(key, sizeof key, R, "end", -1);
        dt_store_cas(r->ns, key, NULL, 0, e, strlen(e), &cur, NULL, NULL);
        free(cur);
        return rc;
    }
    int mr = (int)dt_rdzv_json_num(rec, "max_restarts", r->o.max_restarts);
    if (i == 0 && r->formed < 0 && mr != r->o.max_restarts)
        DT_WARN("--max-restarts=%d here, but node 0 has --max-restarts=%d: the job's budget is "
                "node 0's, %d",
                r->o.max_restarts, mr, mr);
    return 0;
}

/* Joins round R: writes this node's record and waits for everybody's. */
static int join_round(static_rdzv *r, int R, dt_rdzv_round *rd, dt_rdzv_status *st, dt_err *err)
{
    int rc = 0, master_port = 0;
    char key[96], **keys = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    cJSON *rec = NULL, **recs = NULL;
    char *text = NULL;
    double deadline = dt_now_s() + r->o.join_timeout;

    if (r->node == 0) {
        if ((rc = dt_rdzv_free_port(&master_port, err)))
            return rc;
        char v[32];
        snprintf(v, sizeof v, "%d", R);
        if ((rc = set_str(r->ns, "round", v, err)))
            return rc;
    }
    rkey(key, sizeof key, R, "hb", r->node);
    if ((rc = set_str(r->ns, key, "0", err)))
        return rc;
    rec = cJSON_CreateObject();
    cJSON_AddStringToObject(rec, "host", dt_hostname());
    cJSON_AddStringToObject(rec, "addr", r->local_addr);
    cJSON_AddNumberToObject(rec, "nproc", r->o.local_world_size);
    cJSON_AddNumberToObject(rec, "nnodes", r->nnodes);
    cJSON_AddNumberToObject(rec, "max_restarts", r->o.max_restarts);
    cJSON_AddNumberToObject(rec, "pid", (int)getpid());
    cJSON_AddStringToObject(rec, "nonce", r->nonce);
    if (r->node == 0) {
        cJSON_AddStringToObject(rec, "run_id", r->run_id);
        cJSON_AddNumberToObject(rec, "master_port", master_port);
    }
    text = cJSON_PrintUnformatted(rec);
    cJSON_Delete(rec);
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory");
    rkey(key, sizeof key, R, "node", r->node);
    rc = set_str(r->ns, key, text, err);
    free(text);
    if (rc)
        return rc;

    int n = r->nnodes;
    if (r->node != 0) {
        /* Node 0's record first: a node started with another --nnodes is told at once, rather
         * than when its join times out (or never, when its rank is within node 0's count). */
        void *v0 = NULL;
        size_t len0 = 0;
        rkey(key, sizeof key, R, "node", 0);
        const char *k0 = key;
        rc = wait_keys(r, &k0, 1, &v0, &len0, deadline, st, err);
        if (rc == 0) {
            cJSON *r0 = cJSON_ParseWithLength(v0, len0);
            rc = check_peer(r, R, 0, r0, err);
            cJSON_Delete(r0);
        }
        free(v0);
        if (rc && rc != -ETIMEDOUT)
            return rc;
        rc = 0; /* a timeout: said below, with the missing nodes */
    }
    keys = calloc((size_t)n, sizeof *keys);
    vals = calloc((size_t)n, sizeof *vals);
    lens = calloc((size_t)n, sizeof *lens);
    recs = calloc((size_t)n, sizeof *recs);
    if (!keys || !vals || !lens || !recs) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        keys[i] = malloc(64);
        if (!keys[i]) {
            rc = dt_err_set(err, -ENOMEM, "out of memory");
            goto out;
        }
        rkey(keys[i], 64, R, "node", i);
    }
    rc = wait_keys(r, (const char *const *)keys, (size_t)n, vals, lens, deadline, st, err);
    if (rc == -ETIMEDOUT) {
        char missing[256] = "";
        size_t k = 0;
        for (int i = 0; i < n && k < sizeof missing - 16; i++) {
            int exists = 0;
            const char *one = keys[i];
            if (dt_store_check(r->ns, &one, 1, &exists, NULL) == 0 && !exists)
                k += (size_t)snprintf(missing + k, sizeof missing - k, "%s%d", k ? ", " : "", i);
        }
        rc = dt_err_set(err, -ETIMEDOUT,
                        "node(s) %s did not join round %d within the join timeout (%g s); check "
                        "that every node runs with --nnodes=%d, its own --node-rank and the same "
                        "endpoint %s:%d",
                        missing, R, r->o.join_timeout, n, r->store_addr, r->store_port);
        goto out;
    }
    if (rc)
        goto out;
    for (int i = 0; i < n; i++) {
        recs[i] = cJSON_ParseWithLength(vals[i], lens[i]);
        if (!recs[i]) {
            rc = dt_err_set(err, -EBADMSG, "node %d's record in round %d is not JSON", i, R);
            goto out;
        }
    }
    char nonce[64];
    dt_rdzv_json_str(recs[r->node], "nonce", nonce, sizeof nonce);
    if (strcmp(nonce, r->nonce)) {
        char h[64];
        dt_rdzv_json_str(recs[r->node], "host", h, sizeof h);
        rc = dt_err_set(err, -EEXIST,
                        "another agent (on %s, pid %d) also runs as --node-rank=%d; give every "
                        "node its own rank",
                        h, (int)dt_rdzv_json_num(recs[r->node], "pid", 0), r->node);
        goto out;
    }
    for (int i = r->node == 0 ? 1 : n; i < n; i++) /* node 0 checks all; the others did above */
        if ((rc = check_peer(r, R, i, recs[i], err)))
            goto out;
    memset(rd, 0, sizeof *rd);
    int base = 0, world = 0;
    for (int i = 0; i < n; i++) {
        int np = (int)dt_rdzv_json_num(recs[i], "nproc", 0);
        if (np < 1) {
            rc = dt_err_set(err, -EBADMSG, "node %d's record in round %d has no nproc", i, R);
            goto out;
        }
        if (i < r->node)
            base += np;
        world += np;
        dt_rdzv_json_str(recs[i], "host", r->hosts[i], sizeof r->hosts[i]);
        r->member[i] = true;
        r->hb_val[i] = 0;
        r->hb_seen[i] = dt_now_s();
    }
    rd->round = R;
    rd->attempt = R;
    rd->max_restarts = r->max_restarts;
    rd->group_rank = r->node;
    rd->group_world_size = n;
    rd->rank_base = base;
    rd->local_world_size = r->o.local_world_size;
    rd->world_size = world;
    dt_strlcpy(rd->run_id, r->run_id, sizeof rd->run_id);
    dt_rdzv_json_str(recs[0], "addr", rd->master_addr, sizeof rd->master_addr);
    rd->master_port = (int)dt_rdzv_json_num(recs[0], "master_port", 0);
    dt_strlcpy(rd->store_addr, r->store_addr, sizeof rd->store_addr);
    rd->store_port = r->store_port;
    dt_strlcpy(rd->local_addr, r->local_addr, sizeof rd->local_addr);
    r->formed = R;
    r->next_hb = dt_now_s() + r->o.heartbeat_interval;
out:
    for (int i = 0; i < n; i++) {
        if (keys)
            free(keys[i]);
        if (vals)
            free(vals[i]);
        if (recs)
            cJSON_Delete(recs[i]);
    }
    free(keys);
    free(vals);
    free(lens);
    free(recs);
    return rc;
}

/* Node k > 0, before it writes anything of its own: node 0's settings (the conf key), checked
 * as the command line's are, and this node's job against the job's. A node whose job differs
 * is refused (-EINVAL) without touching the job: it records why under "refused" for node 0 to
 * say, and leaves no left/<k> (the node that comes back with the right job writes it). */
static int adopt_conf(static_rdzv *r, dt_rdzv_status *st, dt_err *err)
{
    const char *k = "conf";
    void *v = NULL;
    size_t len = 0;
    char where[2 * DT_RDZV_STR + 64];
    dt_rdzv_conf c;
    snprintf(where, sizeof where, "the store at %s:%d (key dtrain/%s/conf)", r->store_addr,
             r->store_port, r->o.run_id[0] ? r->o.run_id : "none");
    int rc = wait_keys(r, &k, 1, &v, &len, dt_now_s() + r->o.join_timeout, st, err);
    if (rc == -ETIMEDOUT)
        return dt_err_set(err, rc, "node 0 wrote no settings in %s within the join timeout (%g s)",
                          where, r->o.join_timeout);
    if (rc)
        return rc;
    char *text = strndup(v, len);
    free(v);
    if (!text)
        return dt_err_set(err, -ENOMEM, "out of memory");
    rc = dt_rdzv_conf_parse(text, where,
                            "a client of the store wrote it: start the job again with another "
                            "--rdzv-id, and give the store a token (DTRAIN_STORE_TOKEN) so that "
                            "only the job's agents can write there",
                            &c, err);
    free(text);
    if (rc)
        return rc;
    char keys[512];
    if (!r->o.ending && (rc = dt_rdzv_conf_check_job(&c, r->o.job, where, keys, sizeof keys, err))) {
        char rec[700];
        snprintf(rec, sizeof rec, "%d (%.64s, pid %d) runs another job: it differs in %s", r->node,
                 dt_hostname(), (int)getpid(), keys);
        set_str(r->ns, "refused", rec, NULL);
        r->left = true; /* nothing of this agent's for node 0 to wait for */
        dt_rdzv_conf_free(&c);
        return rc;
    }
    dt_strlcpy(r->run_id, c.run_id, sizeof r->run_id);
    r->max_restarts = c.max_restarts;
    dt_rdzv_conf_free(&c);
    return 0;
}

static int st_next(void *self, dt_rdzv_round *rd, dt_rdzv_status *st, dt_err *err)
{
    static_rdzv *r = self;
    dt_rdzv_status dummy;
    int rc;
    if (!st)
        st = &dummy;
    memset(st, 0, sizeof *st);
    if (r->o.interrupted && r->o.interrupted(r->o.arg))
        return dt_err_set(err, -EINTR, "interrupted before the rendezvous");
    int R = r->round + 1;
    r->done = false;
    memset(&r->ended, 0, sizeof r->ended);
    dt_rdzv_fail_list_clear(&r->fails);

    if (r->nnodes == 1) {
        r->round = R;
        memset(rd, 0, sizeof *rd);
        rd->round = rd->attempt = R;
        rd->max_restarts = r->max_restarts;
        rd->group_world_size = 1;
        rd->local_world_size = rd->world_size = r->o.local_world_size;
        dt_strlcpy(rd->run_id, r->run_id, sizeof rd->run_id);
        dt_strlcpy(rd->local_addr, r->local_addr, sizeof rd->local_addr);
        dt_strlcpy(rd->master_addr, r->local_addr, sizeof rd->master_addr);
        dt_strlcpy(rd->store_addr, r->store_addr, sizeof rd->store_addr);
        rd->store_port = r->store_port;
        return dt_rdzv_free_port(&rd->master_port, err);
    }
    if (job_aborted(r, st)) {
        mark_left(r);
        if (st->setup_error) {
            r->setup_failed = true;
            return dt_err_set(err, -EINVAL, "%s", st->why);
        }
        return dt_err_set(err, -ECANCELED, "node %d ended the job (%s)", st->node, st->why);
    }
    if (r->round < 0 && r->node != 0) {
        /* Join the round node 0 is in (0 for a fresh job; later for an agent restarted). */
        const char *k = "round";
        void *v = NULL;
        size_t len = 0;
        rc = wait_keys(r, &k, 1, &v, &len, dt_now_s() + r->o.join_timeout, st, err);
        if (rc == -ETIMEDOUT)
            return dt_err_set(err, rc,
                              "node 0 did not open the job on the store at %s:%d within the join "
                              "timeout (%g s)",
                              r->store_addr, r->store_port, r->o.join_timeout);
        if (rc == -ECANCELED)
            mark_left(r);
        if (rc)
            return rc;
        R = atoi(v);
        free(v);
        if ((rc = adopt_conf(r, st, err)))
            return rc;
    }
    r->round = R;
    rc = join_round(r, R, rd, st, err);
    if (rc == -ECANCELED && st->setup_error)
        rc = dt_err_set(err, -EINVAL, "%s", st->why);
    if (rc == -EINVAL)
        r->setup_failed = true;
    if (rc == -ECANCELED || rc == -EINVAL)
        mark_left(r);
    if (rc == -ETIMEDOUT || rc == -EEXIST) {
        /* End the job for everyone rather than leave the others waiting out their timeout. */
        char v[DT_ERR_MSG_MAX / 4];
        snprintf(v, sizeof v, "%d 0 node %d: %.180s", r->node, r->node, err ? err->msg : "");
        void *cur = NULL;
        dt_store_cas(r->ns, "abort", NULL, 0, v, strlen(v), &cur, NULL, NULL);
        free(cur);
    }
    return rc;
}

static void cache_end(static_rdzv *r, const char *v)
{
    parse_end(v, false, &r->ended);
}

/* Declares node i lost and fails the round with it as the cause. */
static int node_lost(static_rdzv *r, int i, double silent, dt_rdzv_status *st, dt_err *err)
{
    dt_rdzv_failure f;
    memset(&f, 0, sizeof f);
    f.time = dt_wall_s();
    dt_strlcpy(f.host, r->hosts[i], sizeof f.host);
    f.node = i;
    f.rank = f.local_rank = -1;
    snprintf(f.message, sizeof f.message,
             "node %d (%s) sent no heartbeat for %.1f s (heartbeat_timeout): its agent died, hangs "
             "or cannot reach the store",
             i, r->hosts[i], silent);
    r->member[i] = false;
    DT_WARN("%s", f.message);
    int rc = st_failed(r, &f, 1, err);
    *st = r->ended;
    return rc;
}

static int heartbeat(static_rdzv *r, dt_rdzv_status *st, dt_err *err)
{
    double now = dt_now_s();
    if (now < r->next_hb)
        return 0;
    r->next_hb = now + r->o.heartbeat_interval;
    char key[64], v[32];
    int rc, n = r->nnodes;
    rkey(key, sizeof key, r->round, "hb", r->node);
    snprintf(v, sizeof v, "%lld", (long long)++r->hb_count);
    if ((rc = set_str(r->ns, key, v, err)))
        return rc;
    char (*keys)[64] = calloc((size_t)n, sizeof *keys);
    const char **kp = calloc((size_t)n, sizeof *kp);
    void **vals = calloc((size_t)n, sizeof *vals);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    if (!keys || !kp || !vals || !lens) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        rkey(keys[i], sizeof keys[i], r->round, "hb", i);
        kp[i] = keys[i];
    }
    if ((rc = dt_store_multi_get(r->ns, kp, (size_t)n, vals, lens, 0, err)))
        goto out;
    now = dt_now_s();
    for (int i = 0; i < n && st->state == DT_RDZV_RUNNING; i++) {
        int64_t c = atoll(vals[i]);
        if (i == r->node || !r->member[i])
            continue;
        if (c != r->hb_val[i]) {
            r->hb_val[i] = c;
            r->hb_seen[i] = now;
        } else if (now - r->hb_seen[i] > r->o.heartbeat_timeout) {
            rc = node_lost(r, i, now - r->hb_seen[i], st, err);
        }
    }
out:
    for (int i = 0; vals && i < n; i++)
        free(vals[i]);
    free(keys);
    free(kp);
    free(vals);
    free(lens);
    return rc;
}

static int st_poll(void *self, dt_rdzv_status *st, dt_err *err)
{
    static_rdzv *r = self;
    int rc;
    char key[64];
    memset(st, 0, sizeof *st);
    if (r->ended.state == DT_RDZV_FAILED && r->nnodes > 1 && r->ns && !r->store_gone) {
        /* The job may have ended since (a configuration error on another node): that wins
         * over a restart. */
        dt_rdzv_status ab;
        if (job_aborted(r, &ab)) {
            r->ended = ab;
            mark_left(r);
        }
    }
    if (r->ended.state != DT_RDZV_RUNNING) {
        *st = r->ended;
        return 0;
    }
    if (r->nnodes == 1) {
        if (r->done) {
            st->state = DT_RDZV_SUCCEEDED;
            snprintf(st->why, sizeof st->why, "every worker succeeded");
        }
        return 0;
    }
    void *v = NULL;
    size_t len;
    int exists = 0;
    const char *kp1 = key;
    rkey(key, sizeof key, r->round, "end", -1);
    /* CHECK, not GET: a non-waiting op gives up on an unreachable store after the client's
     * timeout (about heartbeat_timeout), where a waiting one would add its grace period. */
    rc = dt_store_check(r->ns, &kp1, 1, &exists, err);
    if (rc == 0 && exists)
        rc = dt_store_get(r->ns, key, &v, &len, 0, err);
    else if (rc == 0)
        rc = -ENOENT;
    if (rc == 0) {
        cache_end(r, v);
        free(v);
        *st = r->ended;
        if (st->state == DT_RDZV_ABORTED)
            mark_left(r);
        return 0;
    }
    if (rc != -ENOENT)
        return store_failed(r, rc);
    if (r->done) {
        char (*keys)[64] = calloc((size_t)r->nnodes, sizeof *keys);
        const char **kp = calloc((size_t)r->nnodes, sizeof *kp);
        int all = 0;
        if (!keys || !kp) {
            free(keys);
            free(kp);
            return dt_err_set(err, -ENOMEM, "out of memory");
        }
        for (int i = 0; i < r->nnodes; i++) {
            rkey(keys[i], sizeof keys[i], r->round, "done", i);
            kp[i] = keys[i];
        }
        rc = dt_store_check(r->ns, kp, (size_t)r->nnodes, &all, err);
        free(keys);
        free(kp);
        if (rc)
            return store_failed(r, rc);
        if (all) {
            r->ended.state = DT_RDZV_SUCCEEDED;
            snprintf(r->ended.why, sizeof r->ended.why, "every node succeeded");
            *st = r->ended;
            mark_left(r);
            return 0;
        }
    }
    return store_failed(r, heartbeat(r, st, err));
}

static int st_succeeded(void *self, dt_err *err)
{
    static_rdzv *r = self;
    char key[64];
    r->done = true;
    if (r->nnodes == 1)
        return 0;
    rkey(key, sizeof key, r->round, "done", r->node);
    return store_failed(r, set_str(r->ns, key, "1", err));
}

static int st_failed(void *self, const dt_rdzv_failure *f, int n, dt_err *err)
{
    static_rdzv *r = self;
    int rc = dt_rdzv_fail_list_add(&r->fails, f, n, err);
    char key[64];
    if (rc)
        return rc;
    char why[200];
    if (n > 0 && f[0].rank >= 0)
        snprintf(why, sizeof why, "rank %d on node %d (%s) failed", f[0].rank, f[0].node, f[0].host);
    else if (n > 0)
        snprintf(why, sizeof why, "node %d (%s) was lost", f[0].node, f[0].host);
    else
        snprintf(why, sizeof why, "node %d failed", r->node);
    if (r->nnodes == 1 || r->store_gone) {
        if (r->ended.state == DT_RDZV_RUNNING) {
            r->ended.state = DT_RDZV_FAILED;
            r->ended.node = r->node;
            snprintf(r->ended.why, sizeof r->ended.why, "%s", why);
        }
        return 0;
    }
    /* The failures first, then the end: whoever sees the end can read the cause. */
    rkey(key, sizeof key, r->round, "failures", -1);
    rc = dt_rdzv_append_failures(r->ns, key, f, n, err);
    char v[256];
    snprintf(v, sizeof v, "fail %d %s", r->node, why);
    void *cur = NULL;
    size_t curlen = 0;
    rkey(key, sizeof key, r->round, "end", -1);
    int rc2 = dt_store_cas(r->ns, key, NULL, 0, v, strlen(v), &cur, &curlen, err);
    if (rc2 == 0 && cur) {
        char *s = strndup(cur, curlen);
        if (s)
            cache_end(r, s);
        free(s);
    } else if (r->ended.state == DT_RDZV_RUNNING) {
        cache_end(r, v);
    }
    free(cur);
    return rc ? rc : rc2;
}

static int st_abort(void *self, int sig, dt_err *err)
{
    static_rdzv *r = self;
    char v[128], key[64];
    if (!r)
        return 0;
    if (r->ended.state == DT_RDZV_RUNNING || r->ended.state == DT_RDZV_FAILED) {
        r->ended.state = DT_RDZV_ABORTED;
        r->ended.node = r->node;
        r->ended.signal = sig;
        snprintf(r->ended.why, sizeof r->ended.why, "node %d's agent was stopped", r->node);
    }
    if (r->nnodes == 1 || !r->ns || r->store_gone)
        return 0;
    void *cur = NULL;
    snprintf(v, sizeof v, "%d %d node %d's agent was stopped by signal %d", r->node, sig, r->node,
             sig);
    int rc = dt_store_cas(r->ns, "abort", NULL, 0, v, strlen(v), &cur, NULL, err);
    free(cur);
    cur = NULL;
    if (r->round >= 0) {
        snprintf(v, sizeof v, "abort %d %d node %d's agent was stopped by signal %d", r->node, sig,
                 r->node, sig);
        rkey(key, sizeof key, r->round, "end", -1);
        dt_store_cas(r->ns, key, NULL, 0, v, strlen(v), &cur, NULL, NULL);
        free(cur);
    }
    mark_left(r);
    return rc;
}

static int st_abort_config(void *self, const dt_rdzv_failure *f, int n, const char *why,
                         dt_err *err)
{
    static_rdzv *r = self;
    char v[512], e[sizeof v + 8], key[64];
    if (!r)
        return 0;
    int rc = dt_rdzv_fail_list_add(&r->fails, f, n, err);
    if (rc)
        return rc;
    if (r->ended.state == DT_RDZV_RUNNING || r->ended.state == DT_RDZV_FAILED) {
        memset(&r->ended, 0, sizeof r->ended);
        r->ended.state = DT_RDZV_ABORTED;
        r->ended.node = r->node;
        r->ended.setup_error = true;
        snprintf(r->ended.why, sizeof r->ended.why, "%s", why);
    }
    if (r->nnodes == 1 || !r->ns || r->store_gone)
        return 0;
    /* The failures first, then the job's abort (for the nodes between rounds and those whose
     * round another node ended first), then the round's end (what a running node polls). */
    if (r->round >= 0) {
        rkey(key, sizeof key, r->round, "failures", -1);
        rc = dt_rdzv_append_failures(r->ns, key, f, n, err);
    }
    snprintf(v, sizeof v, "%d %d %s", r->node, SETUP_SIG, why);
    void *cur = NULL;
    int rc2 = dt_store_cas(r->ns, "abort", NULL, 0, v, strlen(v), &cur, NULL, rc ? NULL : err);
    free(cur);
    cur = NULL;
    if (r->round >= 0) {
        snprintf(e, sizeof e, "abort %s", v);
        rkey(key, sizeof key, r->round, "end", -1);
        dt_store_cas(r->ns, key, NULL, 0, e, strlen(e), &cur, NULL, NULL);
        free(cur);
    }
    mark_left(r);
    return store_failed(r, rc ? rc : rc2);
}

static int st_failures(void *self, dt_rdzv_failure **out, int *n, dt_err *err)
{
    static_rdzv *r = self;
    char key[64];
    *out = NULL;
    *n = 0;
    if (r->nnodes > 1 && r->ns && r->round >= 0 && !r->store_gone) {
        rkey(key, sizeof key, r->round, "failures", -1);
        int rc = dt_rdzv_read_failures(r->ns, key, out, n, NULL);
        if (rc == 0)
            return 0;
        if (rc != -ENOENT)
            DT_WARN("cannot read the job's failures from the store; showing this node's");
    }
    return dt_rdzv_fail_list_copy(&r->fails, out, n, err);
}

/* The store host waits until every node still in the job has seen the outcome (left/<k>), up
 * to close_timeout. A node whose liveness counter (alive/<k>, beaten by its agent's thread until
 * it closes) stands still for heartbeat_timeout has no agent left to confirm anything: it is
 * waited for no longer, so that a job whose node died ends within about heartbeat_timeout. */
static void wait_others_left(static_rdzv *r)
{
    int n = 0, *who = calloc((size_t)r->nnodes, sizeof *who);
    char (*keys)[32] = calloc((size_t)r->nnodes, sizeof *keys);
    const char **kp = calloc((size_t)r->nnodes, sizeof *kp);
    int64_t *val = calloc((size_t)r->nnodes, sizeof *val);
    double *seen = calloc((size_t)r->nnodes, sizeof *seen);
    if (!who || !keys || !kp || !val || !seen)
        goto out;
    double now = dt_now_s(), deadline = now + r->o.close_timeout, next_look = now;
    for (int i = 0; i < r->nnodes; i++)
        if (i != r->node && r->member[i]) {
            who[n] = i;
            val[n] = -1;
            seen[n++] = now;
        }
    while (n > 0) {
        for (int j = 0; j < n; j++) {
            snprintf(keys[j], sizeof keys[j], "left/%d", who[j]);
            kp[j] = keys[j];
        }
        double left = deadline - dt_now_s();
        if (left <= 0) {
            DT_WARN("not every node confirmed the end of the job within close_timeout (%g s); "
                    "closing the store",
                    r->o.close_timeout);
            break;
        }
        int rc = dt_store_wait(r->ns, kp, (size_t)n, left > 0.1 ? 100 : 20, NULL);
        if (rc == 0 || rc != -ETIMEDOUT)
            break;
        /* No early way out for a signalled agent: after a SIGTERM (a preemption, Slurm's
         * scancel) the others must still read the abort from this store to stop with exit 75,
         * and they leave as soon as they do (a dead one is given up below, and close_timeout
         * bounds the rest). */
        if ((now = dt_now_s()) < next_look)
            continue;
        next_look = now + DT_MIN(r->o.heartbeat_interval, 1.0);
        for (int j = 0; j < n; j++) {
            /* The left/<k> key from who[j] itself: keys[] is in the order of the last wait, and
             * a node removed below moves the last one into slot j (using keys[j] then asked
             * about the removed node again, and a node that had not left was dropped). */
            char key[32], lkey[32];
            const char *lk = lkey;
            void *v = NULL;
            size_t len;
            int done = 0;
            snprintf(lkey, sizeof lkey, "left/%d", who[j]);
            snprintf(key, sizeof key, "alive/%d", who[j]);
            if (dt_store_check(r->ns, &lk, 1, &done, NULL) == 0 && done) {
                who[j] = who[--n]; /* it has left: wait for the others */
                val[j] = val[n];
                seen[j--] = seen[n];
                continue;
            }
            int64_t c = dt_store_get(r->ns, key, &v, &len, 0, NULL) == 0 ? atoll(v) : -1;
            free(v);
            if (c != val[j]) {
                val[j] = c;
                seen[j] = now;
            } else if (now - seen[j] > r->o.heartbeat_timeout) {
                DT_WARN("node %d (%s) sent no heartbeat for %.1f s (heartbeat_timeout) while the "
                        "job ended: its agent is gone; not waiting for it to confirm the end",
                        who[j], r->hosts[who[j]][0] ? r->hosts[who[j]] : "?", now - seen[j]);
                who[j] = who[--n];
                val[j] = val[n];
                seen[j--] = seen[n];
            }
        }
    }
out:
    free(who);
    free(keys);
    free(kp);
    free(val);
    free(seen);
}

static void st_close(void *self)
{
    static_rdzv *r = self;
    if (!r)
        return;
    if (r->ns && r->nnodes > 1 && !r->store_gone) {
        mark_left(r);
        if (r->server && r->setup_failed && r->round >= 0) {
            /* Every node that wrote a record must read why the job ended before the store
             * goes: they leave as soon as they see the abort. */
            for (int i = 0; i < r->nnodes; i++) {
                char key[64];
                const char *kp = key;
                int exists = 0;
                rkey(key, sizeof key, r->round, "node", i);
                r->member[i] = i != r->node && dt_store_check(r->ns, &kp, 1, &exists, NULL) == 0 &&
                               exists;
            }
            wait_others_left(r);
        } else if (r->server && r->formed >= 0) {
            /* Nodes any node declared lost in the last formed round will not confirm. */
            char key[64];
            void *v = NULL;
            size_t len = 0;
            rkey(key, sizeof key, r->formed, "failures", -1);
            if (dt_store_get(r->ns, key, &v, &len, 0, NULL) == 0) {
                for (char *p = v, *nl; p < (char *)v + len; p = nl + 1) {
                    nl = memchr(p, '\n', (size_t)((char *)v + len - p));
                    if (!nl)
                        nl = (char *)v + len;
                    dt_rdzv_failure f;
                    if (dt_rdzv_failure_from_json(p, (size_t)(nl - p), &f) == 0 && f.rank < 0 &&
                        f.node >= 0 && f.node < r->nnodes)
                        r->member[f.node] = false;
                }
                free(v);
            }
            wait_others_left(r);
        }
    }
    alive_stop(r);
    dt_store_free(r->ns);
    dt_store_free(r->base);
    dt_store_server_stop(r->server);
    free(r->member);
    free(r->hosts);
    free(r->hb_val);
    free(r->hb_seen);
    dt_rdzv_fail_list_clear(&r->fails);
    free(r);
}

const dt_rdzv_ops dt_rdzv_static_ops = {
    .name = "static",
    .open = st_open,
    .next = st_next,
    .poll = st_poll,
    .succeeded = st_succeeded,
    .failed = st_failed,
    .abort = st_abort,
    .abort_config = st_abort_config,
    .failures = st_failures,
    .kill = NULL, /* nothing to simulate: a static job has no heartbeat thread */
    .close = st_close,
};
