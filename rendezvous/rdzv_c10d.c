/* rdzv_c10d.c - the elastic (c10d) rendezvous: MIN:MAX nodes, heartbeats, node loss. See rdzv.h
 * for the contract; this file is the design.
 *
 * What it does. Agents join in any order. Round R of the job closes at once when MAX nodes have
 * joined and no survivor of round R-1 is missing, when at least MIN have joined and every
 * survivor of round R-1 is back, or when at least MIN have joined and the last-call window
 * (last_call_timeout, counted from the MIN-th join) has passed. Survivors come first, so a
 * newcomer never pushes a survivor out to spare; a node declared lost in R-1 is no survivor
 * (it comes back as a newcomer). A node that arrives while a round runs ends that round (REGROUP) and joins the next
 * one, which takes it in; when the running round already has MAX nodes it waits as a spare
 * until the round ends for another reason. Where the job's layout rules out some worlds
 * (opts.world_usable: parallel.tensor x parallel.pipeline must divide it), a round takes the
 * most of its ordered joiners (at least MIN) whose world is usable, the rest wait as spares,
 * and a newcomer ends a running round only when the nodes then present make a larger usable
 * world. A node whose heartbeat stops for heartbeat_timeout
 * is declared lost and the round ends (REGROUP) for everyone else. Membership changes never
 * spend the restart budget; a failed worker does (FAILED: attempt + 1).
 *
 * Cost, the numbers that drove the design. With N nodes, nothing may be O(N) per node, or the
 * store sees O(N^2) (4,096 nodes polling 4,096 keys every 100 ms is 160 M key reads a second).
 * So:
 *   join      one add on a counter (the join order k), one set of the node's record, then one
 *             server-side wait on the round's "closed" key (sliced, to stay interruptible);
 *   close     ONE node (the MAX-th joiner, or the one whose last call expired) reads the
 *             records with one multi-get and writes every assignment with one multi-set, then
 *             compare-and-sets "closed": O(N) once, not per node;
 *   assigned  each node reads closed and its own assignment: two gets;
 *   running   one get of the round's "end" per poll (monitor_interval) and, from a background
 *             thread with its own connection, one set of its heartbeat counter per
 *             heartbeat_interval plus one get of group rank 0's counter. Group rank 0 alone
 *             reads all N counters (one multi-get per interval) and declares the lost; everyone
 *             watches rank 0, so the watcher itself is watched;
 *   success   one add on a counter; the node that brings it to N ends the round.
 * `dtrain bench rdzv` measures it (about flat per-node cost from 256 to 4,096 nodes).
 *
 * Keys. "dtrain/<rdzv id>/job" names the job instance J (12 hex digits). Every other key lives
 * under "dtrain/<rdzv id>/<J>/", so a new job with the same id and endpoint on a store that
 * outlives jobs (an external `dtrain store`) starts clean: an agent that finds the current
 * instance finished ("final" set), or abandoned (every agent of it silent for heartbeat_timeout:
 * all killed before any wrote the end), swaps in a new one with a compare-and-set.
 *   conf            {run_id, max_restarts, min, max} of the agent that created the instance
 *   final           "<exit code> <kind> <node> <signal>|<why>": the job is over (first writer);
 *                   kind "config" (code 2, signal -1): a node's workers report a configuration
 *                   error, which every node reports as a setup error
 *   round           the last round that closed (a hint for newcomers)
 *   agents          the ids of the agents that opened this instance, one a line (appended)
 *   pulse           "<agent id> <counter>": set by every agent's heartbeat (one look tells a
 *                   live instance from an abandoned one)
 *   a/<agent id>    that agent's liveness: a counter its heartbeat thread bumps every
 *                   heartbeat_interval from open to close (spares and agents between rounds
 *                   too), or "left" once it has seen the job's end. The store host waits at the
 *                   end for every agent that is neither left nor silent for heartbeat_timeout;
 *                   a new job with the same id replaces an instance whose agents are all silent
 *   l/<agent id>    "1": set with a/<agent id> = "left", so that the store host can wait for
 *                   the agents to leave with one server-side wait instead of polling each
 *   r<R>/count      join counter: its value after a node's add is that node's join order k
 *   r<R>/surv       survivors of round R-1 that have joined R
 *   r<R>/j/<k>      the k-th joiner's record (JSON: id, host, addr, nproc, pid, prev, port)
 *   r<R>/closed     JSON {n, tag, attempt, world, master_addr, master_port}, or {"final":1} when
 *                   the round was cancelled (join timeout, abort) before it formed
 *   r<R>/a/<tag>/<k>  "<group rank> <rank base>" of member k, written by the closer <tag>
 *   r<R>/m/<tag>    one line per member: "<group rank> <k> <nproc> <host> <addr>"
 *   r<R>/hb/<g>     group rank g's heartbeat counter
 *   r<R>/spares     newcomers that found R running and wait on it (only with
 *                   opts.world_usable: the layout rules out some worlds); r<R>/sp/<i> the i-th
 *                   one's worker count, so that a newcomer can tell whether the nodes present
 *                   make a larger usable world (then it ends R) or not (then it waits)
 *   r<R>/done       success counter
 *   r<R>/end        "<kind> <node> <signal> <expect> <lost>|<why>", kind success|fail|regroup|
 *                   abort (signal -1: a configuration error), expect = the nodes of R that go on
 *                   to R+1, lost = the group ranks declared lost, every one of them, as
 *                   ascending ranges ("-" none, "3-40,57"; a rack lost at once is one range;
 *                   see dt_rdzv_ranks_encode) (first writer wins)
 *   r<R>/failures   JSON lines, one per failure (the root-cause table)
 *
 * Fencing. Every decision is a compare-and-set on a key of one round: "closed" (one closer
 * wins; the assignment keys carry its tag, so a losing closer's writes are never read), "end"
 * (one ending wins), and "final" is written only by whoever won the end of a live round (or
 * cancelled a round that never formed, or was stopped by a signal). A stale agent - frozen,
 * declared lost, then continued - finds its round ended on its next poll, stops its workers
 * and rejoins through the current round like a newcomer; what it writes to its old round is
 * never read again. Workers are fenced by round too: MASTER_PORT and DTRAIN_ROUND are new
 * every round.
 *
 * Limits. If the agent that hosts the store dies (or is frozen), the store is gone: the others'
 * calls time out after about heartbeat_timeout and they end with an error that says so. A host
 * that was frozen past heartbeat_timeout knows, when it resumes, that everyone else gave it up:
 * it ends the job at once rather than wait join_timeout for nobody. Clocks need not agree:
 * every timeout is measured on the observer's own monotonic clock.
 *
 * Files. This one is the round logic (open, join, close a round, poll, end, leave); the
 * heartbeat thread that declares nodes lost is rdzv_c10d_hb.c, the records above as text are
 * rdzv_c10d_records.c, the helpers every backend shares rdzv_common.c.
 */
#include <cJSON.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv_c10d.h"
#include "rendezvous/rdzv_c10d_hb.h"
#include "rendezvous/rdzv_c10d_records.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/rdzv_ranks.h"
#include "rendezvous/rdzv_round.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"

#define KEY_MAX 160

/* One joiner, as the closer sees it. */
typedef struct joiner {
    int k, prev, nproc, port, g, base;
    char host[64];
    char addr[DT_RDZV_STR];
} joiner;

typedef struct c10d_rdzv c10d_rdzv;

static void c10d_close(void *self);
static int frozen_host(c10d_rdzv *c, dt_rdzv_status *st, dt_err *err);

struct c10d_rdzv {
    dt_rdzv_opts o;
    int min, max;                  /* the job's (from conf) */
    int max_restarts;              /* the job's budget (from conf) */
    char run_id[DT_RDZV_STR];      /* the run id workers see (from conf) */
    dt_store_server *server;       /* the store, when this agent hosts it (owned) */
    dt_store *base;                /* the main thread's connection (owned) */
    dt_store *ns_id;               /* view "dtrain/<rdzv id>/" (owned) */
    dt_store *ns;                  /* view "dtrain/<rdzv id>/<job>/" (owned) */
    char job[32];                  /* the job instance */
    char store_addr[DT_RDZV_STR];  /* the store as workers (and other nodes) reach it */
    int store_port;
    char store_conn[DT_RDZV_STR];  /* where this agent connects */
    char local_addr[DT_RDZV_STR];
    char id[40];                   /* this agent's node id */
    int slice_ms;                  /* longest single wait: 100 with an interrupt check, else 1000 */
    unsigned tag_seq;

    /* Membership (main thread only). */
    int round;                     /* last round this node was a member of, -1 = none */
    int joining;                   /* round being joined (not yet closed), -1 = none */
    int g, n, attempt;             /* group rank, nodes, attempt of `round` */
    char tag[64];                  /* closer tag of `round` */
    bool done;                     /* reported success in `round` */
    bool left, killed, opened;     /* left: a/<id> says "left" */
    bool gone;                     /* the store stopped answering: ask it nothing more */
    dt_rdzv_status ended;          /* cached end of `round` (RUNNING = not yet) */
    dt_rdzv_fail_list fails;       /* this node's failures of `round` */

    dt_rdzv_c10d_hb *hb;           /* the heartbeat thread (owned; NULL until open starts it) */
    char alive_key[64];            /* "a/<id>" */
};

/* An error of a store call, reworded. A connection error means the store's host is gone: then
 * nothing more is asked of the store (each call would wait out a timeout). */
static int store_gone(c10d_rdzv *c, int rc, dt_err *err, const char *what)
{
    if (rc == -ECONNREFUSED || rc == -ECONNRESET || rc == -ETIMEDOUT || rc == -EPIPE ||
        rc == -EHOSTUNREACH || rc == -ENETUNREACH) {
        char cause[DT_ERR_MSG_MAX / 2];
        dt_strlcpy(cause, err && err->msg[0] ? err->msg : strerror(-rc), sizeof cause);
        c->gone = true;
        return dt_err_set(err, rc,
                          "%s: the rendezvous store at %s:%d does not answer (%s); the agent that "
                          "hosted it (or the `dtrain store`) is gone, so the job cannot go on",
                          what, c->store_addr, c->store_port, cause);
    }
    return dt_err_prefix(err, "%s: ", what);
}

static bool interrupted(c10d_rdzv *c)
{
    return c->o.interrupted && c->o.interrupted(c->o.arg);
}

/* The job's final state, if set: fills st and returns true. */
static bool job_final(c10d_rdzv *c, dt_rdzv_status *st)
{
    char *v = NULL;
    if (c->gone || dt_rdzv_get_str(c->ns, "final", &v, 0, NULL) != 0)
        return false;
    dt_rdzv_c10d_final_status(v, st);
    free(v);
    return true;
}

/* Records the job's final state (first writer wins). */
static void write_final(c10d_rdzv *c, int code, const char *kind, int node, int sig,
                        const char *why)
{
    char v[1024];
    if (c->gone)
        return;
    snprintf(v, sizeof v, "%d %s %d %d|%.900s", code, kind, node, sig, why);
    dt_rdzv_cas_new(c->ns, "final", v, NULL, NULL, NULL);
}

/* This agent has seen the job's end: a/<id> becomes "left" (and the heartbeat thread stops
 * beating it), so the store host need not wait for it. */
static void mark_left(c10d_rdzv *c)
{
    if (c->left || c->killed || c->gone || !c->ns || !c->opened)
        return;
    if (dt_rdzv_c10d_hb_leave(c->hb, c->ns, c->id, NULL) == 0)
        c->left = true;
}

/* ---- opening -------------------------------------------------------------------------------- */

static int parse_nnodes(const char *s, int *min, int *max, dt_err *err)
{
    char tail;
    if (sscanf(s, "%d:%d%c", min, max, &tail) == 2) {
        if (*min < 1 || *max < *min)
            return dt_err_set(err, -EINVAL, "--nnodes=%s: must be MIN:MAX with 1 <= MIN <= MAX", s);
        return 0;
    }
    if (dt_parse_int(s, min) == 0 && *min >= 1) {
        *max = *min;
        return 0;
    }
    return dt_err_set(err, -EINVAL, "--nnodes=%s: must be N or MIN:MAX", s);
}

/* The agent ids listed under "agents" (NUL-separated in *buf, malloc'd), at most cap of them
 * in ids[]; returns how many. */
static int read_agents(dt_store *s, const char *key, char **buf, char **ids, int cap)
{
    char *v = NULL;
    int n = 0;
    *buf = NULL;
    if (dt_rdzv_get_str(s, key, &v, 0, NULL) != 0)
        return 0;
    for (char *p = v, *nl; *p && n < cap; p = nl + 1) {
        nl = strchr(p, '\n');
        if (!nl)
            break;
        *nl = '\0';
        if (*p)
            ids[n++] = p;
    }
    *buf = v;
    return n;
}

/* Watches agents' a/<id> keys (prefix: "" or "<instance>/") on the observer's clock. */
typedef struct watch {
    int n;
    char **ids;          /* n, into buf */
    char *buf;
    int64_t *val;        /* last value seen (-1: "left") */
    double *seen;        /* when it last changed */
    bool *gone;          /* left, or silent for the timeout */
} watch;

static void watch_free(watch *w)
{
    free(w->ids);
    free(w->buf);
    free(w->val);
    free(w->seen);
    free(w->gone);
    memset(w, 0, sizeof *w);
}

/* (Re)reads the list; keeps what is known of the agents seen before. Returns 0 or -ENOMEM. */
static int watch_list(dt_store *s, const char *prefix, watch *w, double now)
{
    char key[KEY_MAX], *buf = NULL;
    dt_rdzv_keyf(key, sizeof key, "%sagents", prefix);
    int cap = 1 << 16;
    char **ids = calloc((size_t)cap, sizeof *ids);
    if (!ids)
        return -ENOMEM;
    int n = read_agents(s, key, &buf, ids, cap);
    if (n == w->n) { /* appended only: the same list */
        free(ids);
        free(buf);
        return 0;
    }
    int64_t *val = calloc((size_t)n + 1, sizeof *val);
    double *seen = calloc((size_t)n + 1, sizeof *seen);
    bool *gone = calloc((size_t)n + 1, sizeof *gone);
    if (!val || !seen || !gone) {
        free(ids);
        free(buf);
        free(val);
        free(seen);
        free(gone);
        return -ENOMEM;
    }
    for (int i = 0; i < n; i++) {
        val[i] = i < w->n ? w->val[i] : -2;
        seen[i] = i < w->n ? w->seen[i] : now;
        gone[i] = i < w->n ? w->gone[i] : false;
    }
    watch_free(w);
    w->n = n;
    w->ids = ids;
    w->buf = buf;
    w->val = val;
    w->seen = seen;
    w->gone = gone;
    return 0;
}

/* One look at the agents not yet gone (except `self`): marks those that left or have been
 * silent for `timeout`. Returns how many are still live. */
static int watch_look(dt_store *s, const char *prefix, watch *w, const char *self, double timeout)
{
    int live = 0;
    double now = dt_now_s();
    for (int i = 0; i < w->n; i++) {
        if (w->gone[i] || (self && !strcmp(w->ids[i], self)))
            continue;
        char key[KEY_MAX], *v = NULL;
        dt_rdzv_keyf(key, sizeof key, "%sa/%s", prefix, w->ids[i]);
        int64_t x = -2;
        if (dt_rdzv_get_str(s, key, &v, 0, NULL) == 0)
            x = !strcmp(v, "left") ? -1 : atoll(v);
        free(v);
        if (x == -1) {
            w->gone[i] = true;
            continue;
        }
        if (x != w->val[i]) {
            w->val[i] = x;
            w->seen[i] = now;
        } else if (now - w->seen[i] > timeout) {
            w->gone[i] = true;
            continue;
        }
        live++;
    }
    return live;
}

/* Whether job instance J (not finished) has a live agent: its "pulse" (which every agent's
 * heartbeat sets) changes within heartbeat_timeout, watched on this agent's clock. O(1) for
 * the store: a live instance answers within a heartbeat interval (divided by its agents); an
 * abandoned one (every agent SIGKILLed, the store outliving them) costs a heartbeat_timeout,
 * once. A missing pulse counts as live until it has stayed missing that long (the agent that
 * just created the instance sets it right after). */
static int instance_live(c10d_rdzv *c, const char *J, bool *live)
{
    char key[KEY_MAX], *first = NULL;
    dt_rdzv_keyf(key, sizeof key, "%s/pulse", J);
    bool have = dt_rdzv_get_str(c->ns_id, key, &first, 0, NULL) == 0;
    double deadline = dt_now_s() + c->o.heartbeat_timeout;
    int ms = (int)(c->o.heartbeat_interval * 250);
    ms = ms < 10 ? 10 : ms > 100 ? 100 : ms;
    *live = true;
    for (;;) {
        char *v = NULL;
        bool now_have = dt_rdzv_get_str(c->ns_id, key, &v, 0, NULL) == 0;
        bool moved = now_have != have || (now_have && strcmp(v, first));
        free(v);
        if (moved)
            break;
        if (dt_now_s() >= deadline) {
            *live = false;
            break;
        }
        if (interrupted(c)) {
            free(first);
            return -EINTR;
        }
        dt_sleep_ms(ms);
    }
    free(first);
    return 0;
}

/* Finds the job instance under "dtrain/<id>/job": the current one, or a new one when there is
 * none, or the current one has finished, or it was abandoned (no agent of it is alive: they
 * were all killed before any could write the end). */
static int resolve_job(c10d_rdzv *c, dt_err *err)
{
    char fresh[32], key[KEY_MAX], *cur = NULL, *fin = NULL;
    int rc;
    dt_rdzv_make_id(fresh, sizeof fresh);
    if ((rc = dt_rdzv_get_str(c->ns_id, "job", &cur, 0, err)) == -ENOENT) {
        rc = dt_rdzv_cas_new(c->ns_id, "job", fresh, NULL, &cur, err);
    } else if (rc == 0) {
        dt_rdzv_keyf(key, sizeof key, "%s/final", cur);
        bool over = dt_rdzv_get_str(c->ns_id, key, &fin, 0, NULL) == 0, live = true;
        free(fin);
        if (!over && (rc = instance_live(c, cur, &live)) == -EINTR)
            rc = dt_err_set(err, rc, "interrupted while looking at the job on the store");
        if (rc == 0 && !over && !live)
            DT_INFO("rendezvous id \"%s\": the job found on the store (instance %s) was abandoned "
                    "(none of its agents has sent a heartbeat for heartbeat_timeout, %g s, and it "
                    "never ended): starting a new one",
                    c->o.run_id, cur, c->o.heartbeat_timeout);
        if (rc == 0 && (over || !live)) {
            /* That job is over: start a new one (one compare-and-set wins for everybody). */
            void *v = NULL;
            size_t len = 0;
            rc = dt_store_cas(c->ns_id, "job", cur, strlen(cur), fresh, strlen(fresh), &v, &len,
                              err);
            free(cur);
            cur = rc == 0 ? strndup(v, len) : NULL;
            free(v);
            if (rc == 0 && !cur)
                rc = dt_err_set(err, -ENOMEM, "out of memory");
        }
    }
    if (rc == 0)
        dt_strlcpy(c->job, cur, sizeof c->job);
    free(cur);
    return rc;
}

/* Agrees on the job's settings: the first agent's, recorded in "conf". */
static int agree_conf(c10d_rdzv *c, dt_err *err)
{
    char *mine = dt_rdzv_conf_propose(&c->o, c->min, c->max), *cur = NULL;
    if (!mine)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int rc = dt_rdzv_cas_new(c->ns, "conf", mine, NULL, &cur, err);
    free(mine);
    char where[2 * DT_RDZV_STR + 120];
    snprintf(where, sizeof where, "the store at %s:%d (key dtrain/%s/%s/conf)", c->store_addr,
             c->store_port, c->o.run_id[0] ? c->o.run_id : "none", c->job);
    if (!rc)
        rc = dt_rdzv_conf_adopt(cur, where,
                                "a client of the store wrote it: start the job again with "
                                "another --rdzv-id (or restart the store), and give the store a "
                                "token (DTRAIN_STORE_TOKEN) so that only the job's agents can "
                                "write there",
                                &c->o, &c->min, &c->max, &c->max_restarts, c->run_id,
                                sizeof c->run_id, err);
    free(cur);
    return rc;
}

static int c10d_open(void **out, const dt_rdzv_opts *opts, dt_err *err)
{
    int rc;
    c10d_rdzv *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        return dt_err_set(err, -ENOMEM, "out of memory");
    c->o = *opts;
    c->round = c->joining = -1;
    c->slice_ms = opts->interrupted ? 100 : 1000;
    dt_rdzv_make_id(c->id, sizeof c->id);
    if ((rc = parse_nnodes(opts->nnodes, &c->min, &c->max, err)))
        goto fail;

    const char *ep = opts->endpoint_host[0] ? opts->endpoint_host : "127.0.0.1";
    int port = opts->endpoint_port;
    bool local = dt_rdzv_is_local_host(ep);
    char bind[DT_RDZV_STR], conn[DT_RDZV_STR]; /* the store's address, this agent's way to it */
    if (opts->is_host || (local && port))
        dt_rdzv_store_bind(ep, bind, conn, sizeof bind);
    if (opts->is_host) {
        rc = dt_rdzv_host_store(&c->server, bind, port, err);
        if (rc == -EADDRINUSE)
            rc = dt_err_set(err, rc,
                            "is_host=1, but port %d is in use on this host: pick another endpoint "
                            "port, or drop is_host to use the store listening there",
                            port);
        if (rc)
            goto fail;
    } else if (port == 0) {
        rc = dt_err_set(err, -EINVAL,
                        "--rdzv-endpoint %s has no port: give every node HOST:PORT, or let one "
                        "node pick a free port with --rdzv-conf is_host=1 (it prints the port)",
                        ep);
        goto fail;
    } else if (local) {
        rc = dt_rdzv_host_store(&c->server, bind, port, err);
        if (rc == -EADDRINUSE) {
            DT_INFO("port %d is taken on this host: using the store listening there (another "
                    "agent's, or a `dtrain store`)",
                    port);
            rc = 0;
        } else if (rc) {
            goto fail;
        }
    }
    if (c->server)
        DT_INFO("hosting the rendezvous store at %s:%d", ep, dt_store_server_port(c->server));
    dt_strlcpy(c->store_addr, ep, sizeof c->store_addr);
    c->store_port = c->server ? dt_store_server_port(c->server) : port;
    dt_strlcpy(c->store_conn, c->server ? conn : ep, sizeof c->store_conn);
    if ((rc = dt_rdzv_connect_store(&c->base, &c->o, c->store_conn, c->store_port, err)))
        goto fail;
    if (opts->local_addr[0])
        dt_strlcpy(c->local_addr, opts->local_addr, sizeof c->local_addr);
    else if (local)
        dt_strlcpy(c->local_addr, ep, sizeof c->local_addr);
    else
        dt_rdzv_route_addr(ep, c->store_port, c->local_addr, sizeof c->local_addr);

    char prefix[DT_RDZV_STR + 48];
    snprintf(prefix, sizeof prefix, "dtrain/%s/", opts->run_id[0] ? opts->run_id : "none");
    if ((rc = dt_store_prefixed(&c->ns_id, c->base, prefix, err)) ||
        (rc = resolve_job(c, err)))
        goto fail;
    snprintf(prefix, sizeof prefix, "%s/", c->job);
    if ((rc = dt_store_prefixed(&c->ns, c->ns_id, prefix, err)))
        goto fail;
    snprintf(prefix, sizeof prefix, "dtrain/%s/%s/", opts->run_id[0] ? opts->run_id : "none",
             c->job);
    if ((rc = agree_conf(c, err)))
        goto fail;
    /* Registered: alive first, then listed (whoever reads the list finds the key). */
    snprintf(c->alive_key, sizeof c->alive_key, "a/%s", c->id);
    char pulse[64], line[64];
    snprintf(pulse, sizeof pulse, "%s 0", c->id);
    snprintf(line, sizeof line, "%s\n", c->id);
    if ((rc = dt_rdzv_set_str(c->ns, "pulse", pulse, err)) || (rc = dt_rdzv_set_str(c->ns, c->alive_key, "0", err)) ||
        (rc = dt_store_append(c->ns, "agents", line, strlen(line), err)))
        goto fail;
    c->opened = true;
    if ((rc = dt_rdzv_c10d_hb_start(&c->hb, &c->o, c->store_conn, c->store_port, prefix, c->id,
                                    err)))
        goto fail;
    DT_DEBUG("c10d: job instance %s, nodes %d:%d, node id %s", c->job, c->min, c->max, c->id);
    *out = c;
    return 0;
fail:
    if (rc != -EINTR && rc != -EINVAL && c->base)
        store_gone(c, rc, err, "opening the rendezvous");
    c10d_close(c);
    return rc;
}

/* ---- closing a round (one node) ------------------------------------------------------------- */

static int cmp_joiner(const void *a, const void *b)
{
    const joiner *x = a, *y = b;
    /* Survivors of the previous round first, in their old order; then newcomers by join order. */
    if ((x->prev < 0) != (y->prev < 0))
        return x->prev < 0 ? 1 : -1;
    if (x->prev != y->prev)
        return x->prev < y->prev ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

/* The attempt of round R: R-1's, plus one when R-1 failed. Returns 0, or -EBADMSG when R-1's
 * end record is damaged (err says how). */
static int round_attempt(c10d_rdzv *c, int R, int *attempt, dt_err *err)
{
    char key[KEY_MAX], *v = NULL;
    dt_rdzv_c10d_closed ci;
    dt_rdzv_c10d_end e;
    *attempt = 0;
    if (R == 0)
        return 0;
    dt_rdzv_keyf(key, sizeof key, "r%d/closed", R - 1);
    if (dt_rdzv_get_str(c->ns, key, &v, 0, NULL) != 0)
        return 0;
    int a = dt_rdzv_c10d_closed_decode(v, &ci) == 0 ? ci.attempt : 0;
    free(v);
    dt_rdzv_keyf(key, sizeof key, "r%d/end", R - 1);
    if (dt_rdzv_get_str(c->ns, key, &v, 0, NULL) == 0) {
        int rc = dt_rdzv_c10d_end_decode(v, &e, err);
        free(v);
        dt_rdzv_c10d_end_free(&e);
        if (rc) {
            dt_err_prefix(err, "round %d: ", R - 1);
            return rc;
        }
        if (e.kind == DT_C10D_END_FAIL)
            a++;
    }
    *attempt = a;
    return 0;
}

/* Tries to close round R with the nodes that joined so far: survivors of R-1 first (in their
 * old order), then newcomers by join order, cut to MAX (a newcomer beyond it waits as a spare;
 * a survivor is never pushed out by a newcomer). Returns 0 (whether or not this call closed
 * it) or a store error. */
static int try_close(c10d_rdzv *c, int R, dt_err *err)
{
    char key[KEY_MAX];
    int64_t cnt = 0;
    int rc, nj = 0, n = 0;
    char (*keys)[48] = NULL;
    const char **kp = NULL, **mk = NULL;
    const void **mv = NULL;
    size_t *ml = NULL;
    void **vals = NULL;
    size_t *lens = NULL;
    joiner *js = NULL;
    char (*avals)[48] = NULL;
    char *members = NULL, *closed = NULL;

    dt_rdzv_keyf(key, sizeof key, "r%d/count", R);
    if ((rc = dt_store_add(c->ns, key, 0, &cnt, err)))
        return rc;
    if (cnt < c->min)
        return 0;
    nj = (int)cnt;
    keys = calloc((size_t)nj, sizeof *keys);
    kp = calloc((size_t)nj, sizeof *kp);
    vals = calloc((size_t)nj, sizeof *vals);
    lens = calloc((size_t)nj, sizeof *lens);
    js = calloc((size_t)nj, sizeof *js);
    if (!keys || !kp || !vals || !lens || !js) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < nj; i++) {
        snprintf(keys[i], sizeof keys[i], "r%d/j/%d", R, i + 1);
        kp[i] = keys[i];
    }
    /* Records are written right after the add: wait a little for the last ones. A joiner that
     * died in between leaves a hole, and is left out. */
    rc = dt_store_multi_get(c->ns, kp, (size_t)nj, vals, lens, 2000, err);
    if (rc == -ETIMEDOUT || rc == -ENOENT) {
        for (int i = 0; i < nj; i++) {
            char *v = NULL;
            vals[i] = dt_rdzv_get_str(c->ns, kp[i], &v, 0, NULL) == 0 ? v : NULL;
        }
        rc = 0;
    }
    if (rc)
        goto out;
    for (int i = 0; i < nj; i++) {
        cJSON *o = vals[i] ? cJSON_Parse(vals[i]) : NULL;
        if (!o)
            continue;
        joiner *j = &js[n];
        j->k = i + 1;
        j->prev = (int)dt_rdzv_json_num(o, "prev", -1);
        j->nproc = (int)dt_rdzv_json_num(o, "nproc", 0);
        j->port = (int)dt_rdzv_json_num(o, "port", 0);
        dt_rdzv_json_str(o, "host", j->host, sizeof j->host);
        dt_rdzv_json_str(o, "addr", j->addr, sizeof j->addr);
        cJSON_Delete(o);
        if (j->nproc >= 1)
            n++;
    }
    if (n < c->min)
        goto out; /* holes: not enough after all; a later joiner closes it */
    qsort(js, (size_t)n, sizeof *js, cmp_joiner);
    if (n > c->max)
        n = c->max;
    n = dt_rdzv_usable_prefix(&c->o, c->min, R, &js[0].nproc, sizeof *js, n);
    int world = 0;
    for (int i = 0; i < n; i++) {
        js[i].g = i;
        js[i].base = world;
        world += js[i].nproc;
    }
    char tag[64];
    snprintf(tag, sizeof tag, "%s.%u", c->id, ++c->tag_seq);
    /* One multi-set: assignments, the member list, and every heartbeat key (so that the watcher's
     * multi-get finds them all). */
    size_t nk = 2 * (size_t)n + 1, mcap = (size_t)n * 160 + 1, mlen = 0;
    mk = calloc(nk, sizeof *mk);
    mv = calloc(nk, sizeof *mv);
    ml = calloc(nk, sizeof *ml);
    avals = calloc(nk, sizeof *avals);
    char (*akeys)[96] = calloc(nk, sizeof *akeys);
    members = malloc(mcap);
    if (!mk || !mv || !ml || !avals || !akeys || !members) {
        free(akeys);
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < n; i++) {
        snprintf(akeys[2 * i], sizeof akeys[0], "r%d/a/%s/%d", R, tag, js[i].k);
        snprintf(avals[2 * i], sizeof avals[0], "%d %d", js[i].g, js[i].base);
        snprintf(akeys[2 * i + 1], sizeof akeys[0], "r%d/hb/%d", R, js[i].g);
        snprintf(avals[2 * i + 1], sizeof avals[0], "0");
        mlen += (size_t)snprintf(members + mlen, mcap - mlen, "%d %d %d %s %s\n", js[i].g,
                                 js[i].k, js[i].nproc, js[i].host[0] ? js[i].host : "?",
                                 js[i].addr[0] ? js[i].addr : "?");
        if (mlen >= mcap)
            mlen = mcap - 1;
    }
    for (size_t i = 0; i < 2 * (size_t)n; i++) {
        mk[i] = akeys[i];
        mv[i] = avals[i];
        ml[i] = strlen(avals[i]);
    }
    snprintf(akeys[nk - 1], sizeof akeys[0], "r%d/m/%s", R, tag);
    mk[nk - 1] = akeys[nk - 1];
    mv[nk - 1] = members;
    ml[nk - 1] = mlen;
    rc = dt_store_multi_set(c->ns, mk, mv, ml, nk, err);
    free(akeys);
    if (rc)
        goto out;
    int attempt = 0;
    if ((rc = round_attempt(c, R, &attempt, err)))
        goto out;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "n", n);
    cJSON_AddStringToObject(o, "tag", tag);
    cJSON_AddNumberToObject(o, "attempt", attempt);
    cJSON_AddNumberToObject(o, "world", world);
    cJSON_AddStringToObject(o, "master_addr", js[0].addr);
    cJSON_AddNumberToObject(o, "master_port", js[0].port);
    closed = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!closed) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    bool won = false;
    dt_rdzv_keyf(key, sizeof key, "r%d/closed", R);
    if ((rc = dt_rdzv_cas_new(c->ns, key, closed, &won, NULL, err)))
        goto out;
    if (won) {
        char v[32];
        snprintf(v, sizeof v, "%d", R);
        dt_rdzv_set_str(c->ns, "round", v, NULL);
        DT_DEBUG("c10d: closed round %d with %d of %lld joined nodes (world %d)", R, n,
                 (long long)cnt, world);
    }
out:
    for (int i = 0; vals && i < nj; i++)
        free(vals[i]);
    free(keys);
    free(kp);
    free(vals);
    free(lens);
    free(js);
    free(mk);
    free(mv);
    free(ml);
    free(avals);
    free(members);
    free(closed);
    return rc;
}

/* ---- joining -------------------------------------------------------------------------------- */

/* Fills rd for membership of round R. */
static void fill_round(c10d_rdzv *c, const dt_rdzv_c10d_closed *ci, int R, int g, int base,
                       dt_rdzv_round *rd)
{
    memset(rd, 0, sizeof *rd);
    rd->round = R;
    rd->attempt = ci->attempt;
    rd->max_restarts = c->max_restarts;
    rd->group_rank = g;
    rd->group_world_size = ci->n;
    rd->rank_base = base;
    rd->local_world_size = c->o.local_world_size;
    rd->world_size = ci->world;
    dt_strlcpy(rd->run_id, c->run_id, sizeof rd->run_id);
    dt_strlcpy(rd->master_addr, ci->master_addr, sizeof rd->master_addr);
    rd->master_port = ci->master_port;
    dt_strlcpy(rd->store_addr, c->store_addr, sizeof rd->store_addr);
    rd->store_port = c->store_port;
    dt_strlcpy(rd->local_addr, c->local_addr, sizeof rd->local_addr);
    rd->elastic = true;
}

/* Cancels round R before it formed and ends the job (the first one to cancel writes final). */
static void cancel_round(c10d_rdzv *c, int R, int code, const char *kind, int sig,
                         const char *why, bool *won)
{
    char key[KEY_MAX];
    dt_rdzv_keyf(key, sizeof key, "r%d/closed", R);
    *won = false;
    if (dt_rdzv_cas_new(c->ns, key, "{\"final\":1}", won, NULL, NULL) == 0 && *won)
        write_final(c, code, kind, -1, sig, why);
}

/* Rank 0 did not propose a MASTER_PORT (it was not the node expected to be rank 0): rank 0
 * picks one now and publishes it; the others wait for it. If the round ends meanwhile (rank 0
 * lost), the port stays 0 and the caller's first poll sees the end. */
static int master_port(c10d_rdzv *c, int R, int g, dt_rdzv_c10d_closed *ci, dt_err *err)
{
    char key[KEY_MAX], endkey[KEY_MAX], v[32], *s = NULL;
    int rc, port = 0;
    dt_rdzv_keyf(key, sizeof key, "r%d/master_port", R);
    if (g == 0) {
        if ((rc = dt_rdzv_free_port(&port, err)))
            return rc;
        snprintf(v, sizeof v, "%d", port);
        if ((rc = dt_rdzv_set_str(c->ns, key, v, err)))
            return store_gone(c, rc, err, "publishing MASTER_PORT");
        ci->master_port = port;
        DT_DEBUG("c10d: round %d: MASTER_PORT %d picked by rank 0 after the round closed", R, port);
        return 0;
    }
    dt_rdzv_keyf(endkey, sizeof endkey, "r%d/end", R);
    double deadline = dt_now_s() + c->o.join_timeout;
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting for MASTER_PORT");
        dt_err e = {0};
        rc = dt_rdzv_get_str(c->ns, key, &s, c->slice_ms, &e);
        if (rc == 0) {
            ci->master_port = atoi(s);
            free(s);
            return 0;
        }
        if (rc != -ETIMEDOUT && rc != -ENOENT) {
            if (err)
                *err = e;
            return store_gone(c, rc, err, "waiting for MASTER_PORT");
        }
        if (dt_rdzv_get_str(c->ns, endkey, &s, 0, NULL) == 0 || dt_now_s() >= deadline) {
            free(s);
            return 0; /* the round is over already (or rank 0 never answered) */
        }
    }
}

/* Joins round R (not closed when looked at). Returns 0 as a member with rd filled, 1 when the
 * round closed without this node, or an error: -EINTR, -ECANCELED (the job ended: st says how),
 * -ETIMEDOUT (too few nodes within the join timeout), a store error. */
static int join_round(c10d_rdzv *c, int R, double deadline, dt_rdzv_round *rd,
                      dt_rdzv_status *st, dt_err *err)
{
    char key[KEY_MAX], *v = NULL, prev_why[256] = "";
    int rc, port = 0, expect = -1;
    int prev = c->round >= 0 && c->round == R - 1 ? c->g : -1;
    int64_t k = 0, s = 0, cnt = 0;
    dt_rdzv_c10d_closed ci;

    if (R > 0) {
        dt_rdzv_keyf(key, sizeof key, "r%d/end", R - 1);
        if (dt_rdzv_get_str(c->ns, key, &v, 0, NULL) == 0) {
            dt_rdzv_c10d_end e;
            rc = dt_rdzv_c10d_end_decode(v, &e, err);
            free(v);
            if (rc) {
                dt_rdzv_c10d_end_free(&e);
                dt_err_prefix(err, "joining round %d: round %d: ", R, R - 1);
                return rc;
            }
            expect = e.expect;
            snprintf(prev_why, sizeof prev_why, "%s", e.why);
            /* Declared lost in R-1: not one of the survivors the others wait for (the round
             * must not close early on this node's count); it comes back as a newcomer. */
            if (prev >= 0 && dt_rdzv_ranks_has(&e.lost, prev))
                prev = -1;
            dt_rdzv_c10d_end_free(&e);
        }
    }
    dt_rdzv_keyf(key, sizeof key, "r%d/count", R);
    if ((rc = dt_store_add(c->ns, key, 1, &k, err)))
        return store_gone(c, rc, err, "joining the rendezvous");
    /* MASTER_PORT: proposed by the nodes likely to be group rank 0 (the previous rank 0, the
     * first joiner), so that one or two nodes probe for a free port, not every node; when rank
     * 0 turns out to be another node, it picks one after the round closed. */
    if ((prev == 0 || k == 1) && (rc = dt_rdzv_free_port(&port, err)))
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "host", dt_hostname());
    cJSON_AddStringToObject(o, "addr", c->local_addr);
    cJSON_AddNumberToObject(o, "nproc", c->o.local_world_size);
    cJSON_AddNumberToObject(o, "pid", (int)getpid());
    cJSON_AddNumberToObject(o, "prev", prev);
    cJSON_AddNumberToObject(o, "port", port);
    char *rec = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!rec)
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_rdzv_keyf(key, sizeof key, "r%d/j/%lld", R, (long long)k);
    rc = dt_rdzv_set_str(c->ns, key, rec, err);
    free(rec);
    if (rc)
        return store_gone(c, rc, err, "joining the rendezvous");
    c->joining = R;
    double t_join = dt_now_s(), close_at = 1e300;
    if (k >= c->min && k <= c->max)
        close_at = t_join + c->o.last_call_timeout;
    /* Close at once when MAX nodes are in, or MIN with every survivor of R-1 back; but never
     * while a survivor is still missing (then the last call, or that survivor, closes it). A
     * survivor counts itself in whatever its join order, so the last one back closes. */
    bool surv_back = true;
    if (expect >= 0) {
        dt_rdzv_keyf(key, sizeof key, "r%d/surv", R);
        surv_back = dt_store_add(c->ns, key, prev >= 0 ? 1 : 0, &s, NULL) == 0 && s >= expect;
    }
    bool can = false;
    if (surv_back && k == c->max)
        can = true;
    else if (surv_back && expect >= 0 && prev >= 0) {
        dt_rdzv_keyf(key, sizeof key, "r%d/count", R);
        can = dt_store_add(c->ns, key, 0, &cnt, NULL) == 0 && cnt >= c->min;
    } else if (surv_back && expect >= 0 && k >= c->min) {
        can = true;
    }
    if (can && (rc = try_close(c, R, err)))
        return store_gone(c, rc, err, "closing a rendezvous round");
    DT_DEBUG("c10d: joined round %d as #%lld (nodes %d:%d)", R, (long long)k, c->min, c->max);

    dt_rdzv_keyf(key, sizeof key, "r%d/closed", R);
    double retry = 0.5;
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting for the other nodes");
        double now = dt_now_s();
        double until = DT_MIN(close_at, deadline);
        int ms = until - now > c->slice_ms / 1000.0 ? c->slice_ms : (int)((until - now) * 1000);
        if (ms < 20)
            ms = 20; /* the client rounds a tiny wait down to "do not wait" */
        dt_err e = {0};
        rc = dt_rdzv_get_str(c->ns, key, &v, ms, &e);
        if (rc == 0)
            break;
        if (rc != -ETIMEDOUT && rc != -ENOENT) {
            if (err)
                *err = e;
            return store_gone(c, rc, err, "waiting for the round to form");
        }
        if (job_final(c, st))
            return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s",
                              st->why);
        if ((rc = frozen_host(c, st, err)))
            return rc;
        now = dt_now_s();
        if (now >= close_at) {
            /* The last call is over (normally the MIN-th joiner closes first and nobody else
             * gets here). Should it not close (a joiner died between its add and its record,
             * leaving fewer than MIN), try again later, backing off. */
            if ((rc = try_close(c, R, err)))
                return store_gone(c, rc, err, "closing a rendezvous round");
            retry = DT_MIN(2 * retry, 8.0);
            close_at = now + retry;
        }
        if (now >= deadline) {
            dt_rdzv_keyf(key, sizeof key, "r%d/count", R);
            dt_store_add(c->ns, key, 0, &cnt, NULL);
            char why[700];
            snprintf(why, sizeof why,
                     "round %d did not form: %lld node(s) joined within the join timeout (%g s) "
                     "and MIN is %d%s%s%s",
                     R, (long long)cnt, c->o.join_timeout, c->min, prev_why[0] ? " (the last round ended: " : "",
                     prev_why, prev_why[0] ? ")" : "");
            bool won = false;
            cancel_round(c, R, 1, "rdzv", 0, why, &won);
            if (won || job_final(c, st))
                return dt_err_set(err, -ETIMEDOUT, "%s", why);
            dt_rdzv_keyf(key, sizeof key, "r%d/closed", R); /* it closed just now: read it */
            deadline = 1e300;
        }
    }
    rc = dt_rdzv_c10d_closed_decode(v, &ci);
    free(v);
    if (rc)
        return dt_err_set(err, rc, "round %d's record in the store is damaged", R);
    if (ci.cancelled) {
        if (!job_final(c, st)) {
            st->state = DT_RDZV_ABORTED;
            snprintf(st->why, sizeof st->why, "round %d was cancelled", R);
        }
        return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s", st->why);
    }
    dt_rdzv_keyf(key, sizeof key, "r%d/a/%s/%lld", R, ci.tag, (long long)k);
    rc = dt_rdzv_get_str(c->ns, key, &v, 0, err);
    if (rc == -ENOENT) {
        c->joining = -1;
        return 1;
    }
    if (rc)
        return store_gone(c, rc, err, "reading this node's rank");
    int g = -1, base = -1;
    sscanf(v, "%d %d", &g, &base);
    free(v);
    if (g < 0 || g >= ci.n || base < 0)
        return dt_err_set(err, -EBADMSG, "round %d: this node's assignment is damaged", R);
    c->round = R;
    c->joining = -1;
    c->g = g;
    c->n = ci.n;
    c->attempt = ci.attempt;
    dt_strlcpy(c->tag, ci.tag, sizeof c->tag);
    dt_rdzv_c10d_hb_assign(c->hb, R, g, ci.n, ci.tag);
    if (ci.master_port == 0 && (rc = master_port(c, R, g, &ci, err)))
        return rc;
    fill_round(c, &ci, R, g, base, rd);
    return 0;
}

/* Whether round R's end (with its closed record) ends the job; fills st when it does. */
static bool end_is_final(c10d_rdzv *c, const dt_rdzv_c10d_end *e, const dt_rdzv_c10d_closed *ci,
                         dt_rdzv_status *st)
{
    dt_rdzv_status end;
    dt_rdzv_c10d_end_status(e, &end);
    if (!dt_rdzv_round_ends_job(&end, ci->attempt, c->max_restarts))
        return false;
    *st = end;
    return true;
}

/* A newcomer finds round R running without it on ci->n nodes, fewer than MAX. Sets *grow:
 * whether the nodes now present (R's, the spares that wait on R, this one) make a larger world
 * the job can use (opts.world_usable), so that this node should end R (REGROUP) for R+1 to take
 * them in; else it waits as a spare. This node counts itself among R's spares (r<R>/spares, its
 * worker count in r<R>/sp/<i>: the i-th spare). Without world_usable every world is usable:
 * *grow stays true and nothing is recorded. Returns 0 or a store error. */
static int spare_grows(c10d_rdzv *c, int R, const dt_rdzv_c10d_closed *ci, bool *grow,
                       dt_err *err)
{
    char key[KEY_MAX], v[32];
    int64_t i = 0;
    int rc;
    if (!c->o.world_usable)
        return 0;
    dt_rdzv_keyf(key, sizeof key, "r%d/spares", R);
    if ((rc = dt_store_add(c->ns, key, 1, &i, err)))
        return store_gone(c, rc, err, "joining the rendezvous");
    snprintf(v, sizeof v, "%d", c->o.local_world_size);
    dt_rdzv_keyf(key, sizeof key, "r%d/sp/%lld", R, (long long)i);
    if ((rc = dt_rdzv_set_str(c->ns, key, v, err)))
        return store_gone(c, rc, err, "joining the rendezvous");
    /* the first spares fill the free slots (R+1 takes them by join order; with the same worker
     * count everywhere any order makes the same worlds) */
    int64_t slots = DT_MIN(i, (int64_t)(c->max - ci->n));
    int world = ci->world;
    *grow = false;
    for (int64_t j = 1; j <= slots && !*grow; j++) {
        char *sv = NULL;
        int np = c->o.local_world_size; /* a spare that has not written its record yet */
        dt_rdzv_keyf(key, sizeof key, "r%d/sp/%lld", R, (long long)j);
        if (j != i && dt_rdzv_get_str(c->ns, key, &sv, 500, NULL) == 0) {
            np = atoi(sv);
            free(sv);
        }
        world += np > 0 ? np : 0;
        *grow = dt_rdzv_world_usable(&c->o, world);
    }
    return 0;
}

/* Waits as a spare while round R (full, or layout: one the job's layout cannot grow by this
 * node) runs: until it ends. Watches its group rank 0 meanwhile,
 * so that a round whose nodes all died cannot keep spares waiting forever. */
static int spare_wait(c10d_rdzv *c, int R, const dt_rdzv_c10d_closed *ci, bool layout,
                      dt_rdzv_status *st, dt_err *err)
{
    char key[KEY_MAX], hbkey[KEY_MAX], *v = NULL;
    int64_t last = -1;
    double seen = dt_now_s(), next_hb = seen;
    if (layout)
        DT_INFO("round %d runs on %d of at most %d nodes (world %d), and the job's layout cannot "
                "use the world this node would make with it: waiting as a spare until a later "
                "round can use it",
                R, ci->n, c->max, ci->world);
    else
        DT_INFO("round %d is full (%d of at most %d nodes): waiting as a spare until a slot "
                "frees",
                R, ci->n, c->max);
    dt_rdzv_keyf(key, sizeof key, "r%d/end", R);
    dt_rdzv_keyf(hbkey, sizeof hbkey, "r%d/hb/0", R);
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting as a spare");
        dt_err e = {0};
        int rc = dt_rdzv_get_str(c->ns, key, &v, c->slice_ms, &e);
        if (rc == 0) {
            free(v);
            return 0;
        }
        if (rc != -ETIMEDOUT && rc != -ENOENT) {
            if (err)
                *err = e;
            return store_gone(c, rc, err, "waiting as a spare");
        }
        if (job_final(c, st))
            return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s",
                              st->why);
        double now = dt_now_s();
        if (now < next_hb)
            continue;
        next_hb = now + c->o.heartbeat_interval;
        if (dt_rdzv_get_str(c->ns, hbkey, &v, 0, NULL) != 0)
            continue;
        int64_t val = atoll(v);
        free(v);
        if (val != last) {
            last = val;
            seen = now;
        } else if (now - seen > c->o.heartbeat_timeout) {
            char why[256];
            snprintf(why, sizeof why,
                     "node 0 of round %d was lost: no heartbeat for %.1f s (seen by a spare)", R,
                     now - seen);
            int zero = 0;
            char *ev = dt_rdzv_c10d_end_encode(DT_C10D_END_REGROUP, -1, 0, ci->n - 1, &zero, 1, why);
            if (!ev)
                return dt_err_set(err, -ENOMEM, "out of memory");
            bool won = false;
            if (dt_rdzv_cas_new(c->ns, key, ev, &won, NULL, NULL) == 0 && won)
                DT_WARN("%s", why);
            free(ev);
        }
    }
}

/* The store host was frozen (SIGSTOP, a hung host) for longer than heartbeat_timeout while a
 * round of two or more nodes ran: the store froze with it, so every other agent's calls timed
 * out and each ended its job ("the store cannot come back"). Nobody is left to join: rather than
 * wait join_timeout for nobody, the job ends here at once (-ENOTCONN, and the job's final record
 * for anyone who might still look). 0 when this is not the case. */
static int frozen_host(c10d_rdzv *c, dt_rdzv_status *st, dt_err *err)
{
    double gap = c->server ? dt_rdzv_c10d_hb_gap(c->hb) : 0;
    if (gap <= 0)
        return 0;
    char why[400];
    snprintf(why, sizeof why,
             "this agent hosts the rendezvous store and was stopped for %.1f s, longer than "
             "heartbeat_timeout (%g s): every other agent lost the store and ended its job",
             gap, c->o.heartbeat_timeout);
    write_final(c, 1, "fail", c->round >= 0 ? c->g : -1, 0, why);
    memset(st, 0, sizeof *st);
    st->state = DT_RDZV_FAILED;
    st->node = c->round >= 0 ? c->g : -1;
    dt_strlcpy(st->why, why, sizeof st->why);
    mark_left(c);
    return dt_err_set(err, -ENOTCONN, "%s; nobody is left to join, so the job ends", why);
}

static int c10d_next(void *self, dt_rdzv_round *rd, dt_rdzv_status *st, dt_err *err)
{
    c10d_rdzv *c = self;
    dt_rdzv_status dummy;
    char key[KEY_MAX], *v = NULL;
    int rc;
    if (!st)
        st = &dummy;
    memset(st, 0, sizeof *st);
    if (c->killed)
        return dt_err_set(err, -EIO, "this rendezvous was killed");
    if (interrupted(c))
        return dt_err_set(err, -EINTR, "interrupted before the rendezvous");
    c->done = false;
    memset(&c->ended, 0, sizeof c->ended);
    dt_rdzv_fail_list_clear(&c->fails);
    dt_rdzv_c10d_hb_assign(c->hb, -1, 0, 0, NULL); /* the old round is over: stop beating for it */
    if ((rc = frozen_host(c, st, err)))
        return rc;

    int R = c->round + 1;
    if (dt_rdzv_get_str(c->ns, "round", &v, 0, NULL) == 0) {
        int hint = atoi(v);
        free(v);
        if (hint > R)
            R = hint; /* rounds before the last closed one are over */
    }
    double deadline = dt_now_s() + c->o.join_timeout;
    bool announced = false;
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while joining the rendezvous");
        if (job_final(c, st)) {
            mark_left(c);
            return dt_err_set(err, -ECANCELED, "the job has ended: %s", st->why);
        }
        dt_rdzv_keyf(key, sizeof key, "r%d/closed", R);
        rc = dt_rdzv_get_str(c->ns, key, &v, 0, err);
        if (rc == -ENOENT) {
            rc = join_round(c, R, deadline, rd, st, err);
            if (rc == -ECANCELED || rc == -ETIMEDOUT)
                mark_left(c);
            if (rc <= 0)
                return rc;
            continue; /* the round closed without this node: look at it again */
        }
        if (rc)
            return store_gone(c, rc, err, "joining the rendezvous");
        dt_rdzv_c10d_closed ci;
        rc = dt_rdzv_c10d_closed_decode(v, &ci);
        free(v);
        if (rc)
            return dt_err_set(err, rc, "round %d's record in the store is damaged", R);
        if (ci.cancelled) {
            R++;
            continue; /* final is set too (checked above on the next turn) */
        }
        dt_rdzv_keyf(key, sizeof key, "r%d/end", R);
        rc = dt_rdzv_get_str(c->ns, key, &v, 0, err);
        if (rc == 0) {
            dt_rdzv_c10d_end e;
            rc = dt_rdzv_c10d_end_decode(v, &e, err);
            free(v);
            dt_rdzv_c10d_end_free(&e); /* only the kind is needed */
            if (rc) {
                dt_err_prefix(err, "joining the rendezvous: round %d: ", R);
                return rc;
            }
            if (end_is_final(c, &e, &ci, st)) {
                mark_left(c);
                return dt_err_set(err, -ECANCELED, "the job has ended: %s", st->why);
            }
            R++;
            continue;
        }
        if (rc != -ENOENT)
            return store_gone(c, rc, err, "joining the rendezvous");
        /* Round R runs without this node. */
        bool grow = ci.n < c->max;
        if (grow && (rc = spare_grows(c, R, &ci, &grow, err)))
            return rc;
        if (grow) {
            char why[600];
            snprintf(why, sizeof why, "node %s (%s) joins the job, which runs on %d of at most %d",
                     c->local_addr, dt_hostname(), ci.n, c->max);
            char *ev = dt_rdzv_c10d_end_encode(DT_C10D_END_REGROUP, -1, 0, ci.n, NULL, 0, why);
            if (!ev)
                return dt_err_set(err, -ENOMEM, "out of memory");
            if (!announced)
                DT_INFO("round %d runs with %d node(s): asking it to regroup so that this node "
                        "joins",
                        R, ci.n);
            announced = true;
            rc = dt_rdzv_cas_new(c->ns, key, ev, NULL, NULL, err);
            free(ev);
            if (rc)
                return store_gone(c, rc, err, "joining the rendezvous");
            R++;
            continue;
        }
        if ((rc = spare_wait(c, R, &ci, ci.n < c->max, st, err))) {
            if (rc == -ECANCELED)
                mark_left(c);
            return rc;
        }
        deadline = dt_now_s() + c->o.join_timeout;
    }
}

/* ---- while a round runs --------------------------------------------------------------------- */

/* Caches the end v of this node's round. Returns 0, or -EBADMSG when v is damaged (err says
 * how; nothing cached). */
static int cache_end(c10d_rdzv *c, const char *v, dt_err *err)
{
    dt_rdzv_c10d_end e;
    int rc = dt_rdzv_c10d_end_decode(v, &e, err);
    if (rc) {
        dt_rdzv_c10d_end_free(&e);
        dt_err_prefix(err, "round %d: ", c->round);
        return rc;
    }
    dt_rdzv_c10d_end_status(&e, &c->ended);
    if (dt_rdzv_ranks_has(&e.lost, c->g)) /* frozen or cut off for too long: the others went on */
        dt_rdzv_round_declared_lost(&c->ended, e.why);
    bool final = dt_rdzv_round_ends_job(&c->ended, c->attempt, c->max_restarts);
    if (final && e.kind == DT_C10D_END_FAIL)
        write_final(c, 1, "fail", e.node, 0, e.why);
    if (final)
        mark_left(c);
    dt_rdzv_c10d_end_free(&e);
    return 0;
}

static int c10d_poll(void *self, dt_rdzv_status *st, dt_err *err)
{
    c10d_rdzv *c = self;
    char key[KEY_MAX], *v = NULL;
    memset(st, 0, sizeof *st);
    if (c->killed)
        return dt_err_set(err, -EIO, "this rendezvous was killed");
    if ((c->ended.state == DT_RDZV_FAILED || c->ended.state == DT_RDZV_REGROUP) &&
        c->round >= 0) {
        /* The job may have ended since (a configuration error on another node): that wins
         * over a restart or a regroup. */
        dt_rdzv_status fs;
        if (job_final(c, &fs) && fs.state == DT_RDZV_ABORTED) {
            c->ended = fs;
            mark_left(c);
        }
    }
    if (c->ended.state != DT_RDZV_RUNNING || c->round < 0) {
        *st = c->ended;
        return 0;
    }
    if (c->gone)
        return dt_err_set(err, -ECONNRESET, "the rendezvous store at %s:%d is gone",
                          c->store_addr, c->store_port);
    /* CHECK first: a call that does not wait gives up on a dead store after the client's
     * timeout, a GET (a waiting call even with 0 ms) only after its grace period too. */
    const char *kp = key;
    int exists = 0;
    dt_rdzv_keyf(key, sizeof key, "r%d/end", c->round);
    int rc = dt_store_check(c->ns, &kp, 1, &exists, err);
    if (rc == 0 && !exists)
        return 0;
    if (rc == 0)
        rc = dt_rdzv_get_str(c->ns, key, &v, 0, err);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return store_gone(c, rc, err, "checking the round");
    rc = cache_end(c, v, err);
    free(v);
    if (rc)
        return rc;
    dt_rdzv_c10d_hb_assign(c->hb, -1, 0, 0, NULL); /* nobody watches a round that ended */
    *st = c->ended;
    return 0;
}

static int c10d_succeeded(void *self, dt_err *err)
{
    c10d_rdzv *c = self;
    char key[KEY_MAX], *v = NULL, why[64];
    int64_t d = 0;
    bool won = false;
    c->done = true;
    if (c->round < 0 || c->killed || c->gone)
        return 0;
    dt_rdzv_keyf(key, sizeof key, "r%d/done", c->round);
    int rc = dt_store_add(c->ns, key, 1, &d, err);
    if (rc)
        return store_gone(c, rc, err, "reporting success");
    if (d < c->n)
        return 0;
    snprintf(why, sizeof why, "every node succeeded");
    if (!(v = dt_rdzv_c10d_end_encode(DT_C10D_END_SUCCESS, c->g, 0, c->n, NULL, 0, why)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_rdzv_keyf(key, sizeof key, "r%d/end", c->round);
    rc = dt_rdzv_cas_new(c->ns, key, v, &won, NULL, err);
    free(v);
    if (rc)
        return store_gone(c, rc, err, "reporting success");
    if (won) /* fenced: only the end of a live round may end the job */
        write_final(c, 0, "success", c->g, 0, why);
    return 0;
}

static int c10d_failed(void *self, const dt_rdzv_failure *f, int n, dt_err *err)
{
    c10d_rdzv *c = self;
    char key[KEY_MAX], why[200], *v = NULL, *cur = NULL;
    int rc = 0;
    if ((rc = dt_rdzv_fail_list_add(&c->fails, f, n, err)))
        return rc;
    dt_rdzv_round_failure_why(f, n, c->g, why, sizeof why);
    if (c->round < 0 || c->killed || c->gone) {
        dt_rdzv_round_failed_here(&c->ended, c->g, why);
        return 0;
    }
    if (!(v = dt_rdzv_c10d_end_encode(DT_C10D_END_FAIL, c->g, 0, c->n, NULL, 0, why)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    dt_rdzv_keyf(key, sizeof key, "r%d/failures", c->round);
    rc = dt_rdzv_append_failures(c->ns, key, f, n, err);
    bool won = false;
    dt_rdzv_keyf(key, sizeof key, "r%d/end", c->round);
    int rc2 = dt_rdzv_cas_new(c->ns, key, v, &won, &cur, err), rc3 = 0;
    dt_err e3 = {0};
    if (rc2 == 0 && cur)
        rc3 = cache_end(c, cur, &e3); /* the end that won (maybe another node's) */
    else if (c->ended.state == DT_RDZV_RUNNING)
        cache_end(c, v, NULL); /* this node's own: well formed */
    free(cur);
    free(v);
    if (rc || rc2)
        return store_gone(c, rc ? rc : rc2, err, "reporting a failure");
    if (rc3 && err)
        *err = e3;
    return rc3;
}

/* Ends the job from this node: final (code, kind), this node's round and the latest one ended
 * with DT_C10D_END_ABORT (sig; -1: a configuration error), the round being joined and the one after
 * the latest cancelled, so that every agent - running, between rounds, joining, spare - sees the
 * end. this->ended becomes that abort unless the round had already ended for good. */
static void end_job(c10d_rdzv *c, int code, const char *kind, int sig, const char *why)
{
    char *v = NULL, key[KEY_MAX];
    dt_rdzv_round_abort_here(&c->ended, c->round >= 0 ? c->g : -1, sig, why);
    if (!c->ns || c->gone)
        return;
    write_final(c, code, kind, c->round >= 0 ? c->g : -1, sig, why);
    if (c->joining >= 0) {
        dt_rdzv_keyf(key, sizeof key, "r%d/closed", c->joining);
        dt_rdzv_cas_new(c->ns, key, "{\"final\":1}", NULL, NULL, NULL);
    }
    /* End this node's round, and the latest one (the others may have gone on without this
     * node), and cancel the one after it (survivors between rounds wait there). */
    int latest = c->round;
    char *h = NULL;
    if (dt_rdzv_get_str(c->ns, "round", &h, 0, NULL) == 0)
        latest = DT_MAX(latest, atoi(h));
    free(h);
    v = dt_rdzv_c10d_end_encode(DT_C10D_END_ABORT, c->round >= 0 ? c->g : -1, sig, c->n, NULL, 0, why);
    if (!v)
        DT_ERROR("out of memory: the end of round %d is not written", c->round);
    int ends[2] = {c->round, latest};
    for (int i = 0; i < 2 && v; i++) {
        if (ends[i] < 0 || (i == 1 && ends[1] == ends[0]))
            continue;
        dt_rdzv_keyf(key, sizeof key, "r%d/end", ends[i]);
        dt_rdzv_cas_new(c->ns, key, v, NULL, NULL, NULL);
    }
    if (latest >= 0) {
        dt_rdzv_keyf(key, sizeof key, "r%d/closed", latest + 1);
        dt_rdzv_cas_new(c->ns, key, "{\"final\":1}", NULL, NULL, NULL);
    }
    free(v);
    mark_left(c);
}

static int c10d_abort(void *self, int sig, dt_err *err)
{
    c10d_rdzv *c = self;
    char why[200];
    if (c->killed)
        return 0;
    snprintf(why, sizeof why, "node %d's agent (%s) was stopped by signal %d", c->round >= 0 ? c->g : -1,
             dt_hostname(), sig);
    end_job(c, 128 + sig, "abort", sig, why);
    (void)err;
    return 0;
}

static int c10d_abort_config(void *self, const dt_rdzv_failure *f, int n, const char *why,
                              dt_err *err)
{
    c10d_rdzv *c = self;
    char key[KEY_MAX];
    int rc = 0;
    if (c->killed)
        return 0;
    if ((rc = dt_rdzv_fail_list_add(&c->fails, f, n, err)))
        return rc;
    /* The failures first: whoever sees the end can read the cause. */
    if (n > 0 && c->round >= 0 && c->ns && !c->gone) {
        dt_rdzv_keyf(key, sizeof key, "r%d/failures", c->round);
        if ((rc = dt_rdzv_append_failures(c->ns, key, f, n, err)))
            rc = store_gone(c, rc, err, "reporting a configuration error");
    }
    end_job(c, 2, "config", -1, why);
    return rc;
}

static int c10d_failures(void *self, dt_rdzv_failure **out, int *n, dt_err *err)
{
    c10d_rdzv *c = self;
    char key[KEY_MAX];
    *out = NULL;
    *n = 0;
    if (c->round >= 0 && c->ns && !c->killed && !c->gone) {
        dt_rdzv_keyf(key, sizeof key, "r%d/failures", c->round);
        int rc = dt_rdzv_read_failures(c->ns, key, out, n, NULL);
        if (rc == 0)
            return 0;
        if (rc != -ENOENT)
            DT_WARN("cannot read the job's failures from the store; showing this node's");
    }
    return dt_rdzv_fail_list_copy(&c->fails, out, n, err);
}

/* ---- leaving -------------------------------------------------------------------------------- */

/* The store host waits until every agent of the job has seen the end (a/<id> = "left") or has
 * been silent for heartbeat_timeout (dead, frozen, cut off: a spare that died too), up to
 * close_timeout. Agents that open meanwhile (a late spare) are waited for too. */
static void wait_others_left(c10d_rdzv *c)
{
    watch w = {0};
    char (*keys)[KEY_MAX] = NULL;
    const char **kp = NULL;
    int cap = 0, n = 0, live = 0;
    /* Silence is looked for every half heartbeat interval (a live agent beats every interval);
     * "left" is waited for server-side in between, so the end is seen as soon as it is set. */
    double look_every = DT_MIN(DT_MAX(c->o.heartbeat_interval / 2, 0.05), 1.0);
    double deadline = dt_now_s() + c->o.close_timeout, next_look = 0;
    for (;;) {
        double now = dt_now_s();
        if (now >= next_look) {
            if (watch_list(c->ns, "", &w, now))
                break;
            if ((live = watch_look(c->ns, "", &w, c->id, c->o.heartbeat_timeout)) == 0)
                break;
            next_look = now + look_every;
            if (cap < w.n) {
                free(keys);
                free(kp);
                cap = w.n;
                keys = calloc((size_t)cap, sizeof *keys);
                kp = calloc((size_t)cap, sizeof *kp);
                if (!keys || !kp)
                    break;
            }
            n = 0;
            for (int i = 0; i < w.n; i++)
                if (!w.gone[i] && strcmp(w.ids[i], c->id)) {
                    dt_rdzv_keyf(keys[n], sizeof keys[n], "l/%s", w.ids[i]);
                    kp[n] = keys[n];
                    n++;
                }
        }
        if (now >= deadline) {
            DT_WARN("%d agent(s) did not confirm the end of the job within close_timeout (%g s); "
                    "closing the store",
                    live, c->o.close_timeout);
            break;
        }
        if (interrupted(c))
            break;
        double left = DT_MIN(next_look, deadline) - now;
        int ms = left > 0.1 ? 100 : left > 0.02 ? (int)(left * 1000) : 20;
        int rc = dt_store_wait(c->ns, kp, (size_t)n, ms, NULL);
        if (rc == 0)
            break; /* every agent not yet gone has left */
        if (rc != -ETIMEDOUT)
            dt_sleep_ms(50); /* the store answers oddly: look again, without spinning */
    }
    free(keys);
    free(kp);
    watch_free(&w);
}

static void c10d_kill(void *self)
{
    c10d_rdzv *c = self;
    if (!c || c->killed)
        return;
    dt_rdzv_c10d_hb_free(c->hb);
    c->hb = NULL;
    c->killed = true;
    dt_store_free(c->ns);
    dt_store_free(c->ns_id);
    dt_store_free(c->base);
    c->ns = c->ns_id = c->base = NULL;
}

static void c10d_close(void *self)
{
    c10d_rdzv *c = self;
    if (!c)
        return;
    dt_rdzv_c10d_hb_stop(c->hb);
    if (c->ns && !c->killed && !c->gone && c->opened) {
        mark_left(c);
        if (c->server)
            wait_others_left(c);
    }
    dt_rdzv_c10d_hb_free(c->hb);
    dt_store_free(c->ns);
    dt_store_free(c->ns_id);
    dt_store_free(c->base);
    dt_store_server_stop(c->server);
    dt_rdzv_fail_list_clear(&c->fails);
    free(c);
}

const dt_rdzv_ops dt_rdzv_c10d_ops = {
    .name = "c10d",
    .open = c10d_open,
    .next = c10d_next,
    .poll = c10d_poll,
    .succeeded = c10d_succeeded,
    .failed = c10d_failed,
    .abort = c10d_abort,
    .abort_config = c10d_abort_config,
    .failures = c10d_failures,
    .kill = c10d_kill,
    .close = c10d_close,
};
