/* rdzv_etcd.c - the elastic rendezvous on an etcd cluster (etcd >= 3.4, its v3 JSON gateway,
 * rdzv_etcd_client.c). The same contract and semantics as c10d (rdzv.h, rdzv_c10d.c): MIN:MAX
 * nodes, rounds, survivors first, spares beyond MAX, a newcomer ends a running round (REGROUP),
 * node loss ends it too, the restart budget is job-wide and spent only by failures. What
 * differs: the state lives in a replicated etcd cluster, so no agent is a single point of
 * failure (the agent that joined first may die; an etcd member, the leader too, may die).
 *
 * Liveness is leases. Every agent grants a lease with TTL = heartbeat_timeout at open and keeps
 * it alive from a thread of its own (its own client and connection, so nothing the main thread
 * waits on - a watch, a slow member, the workers - delays a keepalive), started as soon as the
 * lease exists, every heartbeat_interval but at least three times per TTL (as etcd's own clients
 * do), so that two keepalives in a row may be lost or late before the lease lapses. Every key an
 * agent writes about itself (a/<id>, r<R>/j/<id>) is bound to it, so the keys of a dead agent
 * vanish with it; an agent that leaves revokes it, so its keys vanish at once.
 *
 * Keys, under "dtrain/<rdzv id>/": "job" names the job instance J; everything else is under
 * "dtrain/<rdzv id>/<J>/":
 *   conf          {run_id, max_restarts, min, max} of the agent that created the instance
 *   final         {code, kind, node, sig, why}: the job is over (first writer, create txn)
 *   round         the last round that closed (a hint for newcomers)
 *   a/<id>        this agent is alive (lease)
 *   r<R>/j/<id>   join record {id, host, addr, nproc, prev} (lease); its create_revision is
 *                 the join order; its presence is the node's liveness in round R
 *   r<R>/s/<id>   "1" (lease): the joiner is a survivor of R-1 (counted, to close at once when
 *                 every survivor is back)
 *   r<R>/sp/<id>  its worker count (lease): a newcomer that found R running waits on it as a
 *                 spare (only with opts.world_usable: the layout rules out some worlds; a round
 *                 takes the most joiners whose world it can use, and a newcomer ends a running
 *                 round only when the nodes present make a larger usable world)
 *   r<R>/closed   {n, attempt, world, members: [[id, nproc, host, addr], ...] in group rank
 *                 order}, or {"final":1} when the round was cancelled before it formed
 *   r<R>/host     {master_addr, master_port, store_addr, store_port}: written by group rank 0,
 *                 which hosts the workers' dtrain store for the round
 *   r<R>/end      {kind, node, sig, expect, lost: [g...], why}, first writer wins
 *   r<R>/done/<g> node g's workers succeeded
 *   r<R>/f/<g>.<i> one failure (JSON, the root-cause table)
 *
 * Decisions, each one transaction (a compare-and-swap):
 *   job      create "job" (create_revision == 0) or replace a finished or abandoned instance
 *            (mod_revision == the one read), together with this agent's a/<id>, so that an
 *            instance is never seen without a live agent;
 *   conf     create (create_revision == 0), else read the job's;
 *   join     one txn: put j/<id> (and s/<id>), then count j/ and s/ (count-only ranges);
 *   close    create r<R>/closed (create_revision == 0) together with "round"; the members are
 *            read from the j/ records (one range) by whoever sees the round complete from the
 *            counts of its join: MAX in (every survivor back), MIN in with every survivor
 *            back, or MIN in and the last call over (on that node's clock); waiters watch only
 *            r<R>/closed, so a join wakes nobody;
 *   end      create r<R>/end; final likewise, written only by the winner of an end (or of a
 *            cancel), so a stale node's writes are never read.
 * Agents wait on watches (/v3/watch from the revision they last read) instead of polling.
 *
 * Node loss: group rank 0 checks every heartbeat_interval (one range, keys only) that each
 * member's j/ record is still there; every other member checks rank 0's. A record gone means
 * that agent's lease expired (heartbeat_timeout without a keepalive) or was revoked (the agent
 * closed the rendezvous without writing the round's end: it exited): the checker ends the round
 * (REGROUP, the lost ranks listed) and the others re-form without it.
 *
 * Failover: see rdzv_etcd_client.h. Each call may try for heartbeat_timeout / 2 (at least 2 s);
 * a leader election takes about a second, so a dead member (the leader too) costs a retry, not
 * the job. When no member can serve (quorum lost) the call fails naming every member and the
 * agent ends with exit 1 within the heartbeat timeout.
 */
#include "rendezvous/rdzv_etcd.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/rdzv_etcd_client.h"
#include "rendezvous/rdzv_round.h"
#include "rendezvous/store_server.h"

#define KEY_MAX 512

typedef struct member {
    char id[40];
    int nproc, prev;
    char host[64];
    char addr[DT_RDZV_STR];
    int64_t order;
} member;

typedef struct etcd_rdzv {
    dt_rdzv_opts o;
    dt_etcd_tls tls;          /* TLS files and credentials, for every client */
    int min, max, max_restarts;
    char run_id[DT_RDZV_STR];
    dt_etcd *ec;              /* the main thread's client */
    char base[DT_RDZV_STR + 16]; /* "dtrain/<rdzv id>/" */
    char ns[DT_RDZV_STR + 64];   /* base + "<J>/" */
    char job[32];
    char id[40];
    char local_addr[DT_RDZV_STR];
    _Atomic int64_t lease;    /* read by the heartbeat thread too */
    int slice_ms;

    int round, joining, g, n, attempt;
    member *mem;              /* the members of `round`, by group rank */
    bool done, killed, left;
    dt_rdzv_status ended;
    dt_rdzv_fail_list fails;
    int fail_seq;
    double next_check;
    double poll_ok_at; /* when the last poll whose reads succeeded started (< 0: none yet) */
    dt_store_server *server;  /* the workers' store, while this node is group rank 0 */

    /* heartbeat thread */
    pthread_t hb;
    bool hb_started;
    atomic_bool hb_stop, hb_expired, hb_lost;
    char hb_why[DT_ERR_MSG_MAX];
    pthread_mutex_t hb_mu;
} etcd_rdzv;

static void etcd_close(void *self);

static bool interrupted(void *arg)
{
    etcd_rdzv *c = arg;
    return c->o.interrupted && c->o.interrupted(c->o.arg);
}

static void keyf(etcd_rdzv *c, char *buf, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void keyf(etcd_rdzv *c, char *buf, const char *fmt, ...)
{
    va_list ap;
    size_t l = (size_t)snprintf(buf, KEY_MAX, "%s", c->ns);
    va_start(ap, fmt);
    vsnprintf(buf + l, KEY_MAX - l, fmt, ap);
    va_end(ap);
}

static int get(etcd_rdzv *c, const char *k, char **v, dt_err *err)
{
    return dt_etcd_get(c->ec, k, v, NULL, err);
}

/* ---- heartbeat: the lease ------------------------------------------------------------------ */

/* The lease's TTL: heartbeat_timeout, in whole seconds (etcd's unit), rounded up. */
static int64_t lease_ttl(const etcd_rdzv *c)
{
    return (int64_t)(c->o.heartbeat_timeout + 0.999);
}

/* Seconds between keepalives: heartbeat_interval, at most a third of the TTL. */
static double keepalive_period(const etcd_rdzv *c)
{
    return DT_MIN(c->o.heartbeat_interval, c->o.heartbeat_timeout / 3);
}

/* How long one keepalive may try (across members) before the thread waits for the next: a third
 * of the TTL, 1 to 5 s. Each try then waits half of it for an answer: long enough for a member on
 * a loaded machine (a keepalive is forwarded to the leader), short enough that a member that
 * hangs costs one try, not the lease. */
static double keepalive_budget(const etcd_rdzv *c)
{
    return DT_MIN(DT_MAX(c->o.heartbeat_timeout / 3, 1.0), 5.0);
}

static bool hb_stopping(void *arg)
{
    etcd_rdzv *c = arg;
    return atomic_load(&c->hb_stop);
}

static void *hb_main(void *arg)
{
    etcd_rdzv *c = arg;
    dt_etcd *ec = NULL;
    dt_err e = {0};
    if (dt_etcd_open(&ec, c->o.endpoints, keepalive_budget(c), &c->tls, &e)) {
        pthread_mutex_lock(&c->hb_mu);
        dt_strlcpy(c->hb_why, e.msg, sizeof c->hb_why);
        pthread_mutex_unlock(&c->hb_mu);
        atomic_store(&c->hb_lost, true);
        return NULL;
    }
    /* closing does not wait for a keepalive in flight (a member that does not answer) */
    dt_etcd_set_interrupt(ec, hb_stopping, c);
    /* When the keepalives started failing (< 0: the last one succeeded). The cluster is lost
     * once they have failed for heartbeat_timeout: counted from the first failed try, not from
     * the last success, so that time this process did not run (SIGSTOP, a paused VM) is not
     * taken for the cluster's silence - after a thaw the first answer says whether the lease
     * outlived the freeze. */
    double failing_since = -1;
    while (!atomic_load(&c->hb_stop)) {
        int64_t ttl = 0, id = atomic_load(&c->lease);
        dt_err ke = {0};
        double t0 = dt_now_s();
        int rc = dt_etcd_lease_keepalive(ec, id, &ttl, &ke);
        double now = dt_now_s();
        if (rc == 0 && ttl > 0) {
            failing_since = -1;
        } else if ((rc == 0 || rc == -ENOENT) && id == atomic_load(&c->lease)) {
            /* (an old lease that the main thread has replaced since is no news) */
            failing_since = -1;
            atomic_store(&c->hb_expired, true);
        } else if (rc != 0 && rc != -ENOENT && rc != -EINTR) {
            if (failing_since < 0)
                failing_since = t0;
            if (now - failing_since >= c->o.heartbeat_timeout) {
                pthread_mutex_lock(&c->hb_mu);
                dt_strlcpy(c->hb_why, ke.msg, sizeof c->hb_why);
                pthread_mutex_unlock(&c->hb_mu);
                atomic_store(&c->hb_lost, true);
            }
        }
        for (double until = t0 + keepalive_period(c);
             dt_now_s() < until && !atomic_load(&c->hb_stop);)
            dt_sleep_ms(20);
    }
    dt_etcd_free(ec);
    return NULL;
}

/* The lease expired (this agent was cut off for heartbeat_timeout): its keys are gone, the others
 * went on without it. A new lease, a new a/<id>; it rejoins as a newcomer. */
static int renew_lease(etcd_rdzv *c, dt_err *err)
{
    int64_t id = 0;
    char k[KEY_MAX];
    int rc = dt_etcd_lease_grant(c->ec, lease_ttl(c), &id, err);
    if (rc)
        return rc;
    atomic_store(&c->lease, id);
    atomic_store(&c->hb_expired, false);
    keyf(c, k, "a/%s", c->id);
    return dt_etcd_put(c->ec, k, "1", c->lease, err);
}

/* An error of the cluster (hb thread), if any. */
static int cluster_lost(etcd_rdzv *c, dt_err *err)
{
    if (!atomic_load(&c->hb_lost))
        return 0;
    pthread_mutex_lock(&c->hb_mu);
    int rc = dt_err_set(err, -ETIMEDOUT,
                        "the rendezvous lost etcd: no lease keepalive for heartbeat_timeout "
                        "(%g s): %s",
                        c->o.heartbeat_timeout, c->hb_why);
    pthread_mutex_unlock(&c->hb_mu);
    return rc;
}

/* ---- records -------------------------------------------------------------------------------- */

/* A final record -> st (false when v is NULL or not JSON). */
static bool final_status(const char *v, dt_rdzv_status *st)
{
    cJSON *o = v ? cJSON_Parse(v) : NULL;
    if (!o)
        return false;
    char kind[16], why[sizeof st->why];
    dt_rdzv_json_str(o, "kind", kind, sizeof kind);
    dt_rdzv_json_str(o, "why", why, sizeof why);
    dt_rdzv_round_final_status((int)dt_rdzv_json_num(o, "code", 1), kind,
                               (int)dt_rdzv_json_num(o, "node", -1),
                               (int)dt_rdzv_json_num(o, "sig", 0), why, st);
    cJSON_Delete(o);
    return true;
}

static bool job_final(etcd_rdzv *c, dt_rdzv_status *st)
{
    char k[KEY_MAX], *v = NULL;
    keyf(c, k, "final");
    if (get(c, k, &v, NULL))
        return false;
    bool fin = final_status(v, st);
    free(v);
    return fin;
}

static void write_final(etcd_rdzv *c, int code, const char *kind, int node, int sig,
                        const char *why)
{
    char k[KEY_MAX];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "code", code);
    cJSON_AddStringToObject(o, "kind", kind);
    cJSON_AddNumberToObject(o, "node", node);
    cJSON_AddNumberToObject(o, "sig", sig);
    cJSON_AddStringToObject(o, "why", why);
    char *v = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    keyf(c, k, "final");
    if (v)
        dt_etcd_create(c->ec, k, v, 0, NULL, NULL, NULL);
    free(v);
}

typedef enum { END_SUCCESS, END_FAIL, END_REGROUP, END_ABORT } end_kind;
static const char *const end_names[] = {"success", "fail", "regroup", "abort"};

typedef struct end_rec {
    end_kind kind;
    int node, sig, expect, nlost;
    int *lost;
    char why[256];
} end_rec;

static char *end_encode(end_kind kind, int node, int sig, int expect, const int *lost, int nl,
                        const char *why)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", end_names[kind]);
    cJSON_AddNumberToObject(o, "node", node);
    cJSON_AddNumberToObject(o, "sig", sig);
    cJSON_AddNumberToObject(o, "expect", expect);
    cJSON *l = cJSON_AddArrayToObject(o, "lost");
    for (int i = 0; i < nl; i++)
        cJSON_AddItemToArray(l, cJSON_CreateNumber(lost[i]));
    cJSON_AddStringToObject(o, "why", why);
    char *v = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return v;
}

static int end_decode(const char *v, end_rec *e)
{
    memset(e, 0, sizeof *e);
    cJSON *o = cJSON_Parse(v);
    if (!o)
        return -EBADMSG;
    char kind[16];
    dt_rdzv_json_str(o, "kind", kind, sizeof kind);
    e->kind = END_REGROUP;
    for (int i = 0; i < 4; i++)
        if (!strcmp(kind, end_names[i]))
            e->kind = (end_kind)i;
    e->node = (int)dt_rdzv_json_num(o, "node", -1);
    e->sig = (int)dt_rdzv_json_num(o, "sig", 0);
    e->expect = (int)dt_rdzv_json_num(o, "expect", -1);
    dt_rdzv_json_str(o, "why", e->why, sizeof e->why);
    const cJSON *l = cJSON_GetObjectItemCaseSensitive(o, "lost");
    int n = cJSON_IsArray(l) ? cJSON_GetArraySize(l) : 0;
    if (n) {
        e->lost = calloc((size_t)n, sizeof *e->lost);
        const cJSON *x;
        cJSON_ArrayForEach(x, l) if (e->lost) e->lost[e->nlost++] = (int)x->valuedouble;
    }
    cJSON_Delete(o);
    return 0;
}

static bool end_has_lost(const end_rec *e, int g)
{
    for (int i = 0; i < e->nlost; i++)
        if (e->lost[i] == g)
            return true;
    return false;
}

static void end_status(const end_rec *e, dt_rdzv_status *st)
{
    dt_rdzv_round_end_status(e->kind == END_SUCCESS ? DT_RDZV_SUCCEEDED
                             : e->kind == END_FAIL  ? DT_RDZV_FAILED
                             : e->kind == END_ABORT ? DT_RDZV_ABORTED
                                                    : DT_RDZV_REGROUP,
                             e->node, e->sig, e->why, st);
}

/* Round R's closed record: n (0 = cancelled or absent: *cancelled), attempt, world, members. */
typedef struct closed_rec {
    bool cancelled;
    int n, attempt, world;
    member *m;
} closed_rec;

static int closed_decode(const char *v, closed_rec *ci)
{
    memset(ci, 0, sizeof *ci);
    cJSON *o = cJSON_Parse(v);
    if (!o)
        return -EBADMSG;
    ci->cancelled = dt_rdzv_json_num(o, "final", 0) != 0;
    ci->n = (int)dt_rdzv_json_num(o, "n", 0);
    ci->attempt = (int)dt_rdzv_json_num(o, "attempt", 0);
    ci->world = (int)dt_rdzv_json_num(o, "world", 0);
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "members");
    if (!ci->cancelled) {
        if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != ci->n || ci->n <= 0 ||
            !(ci->m = calloc((size_t)ci->n, sizeof *ci->m))) {
            cJSON_Delete(o);
            return -EBADMSG;
        }
        int i = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, a)
        {
            const cJSON *id = cJSON_GetArrayItem(x, 0), *np = cJSON_GetArrayItem(x, 1),
                        *h = cJSON_GetArrayItem(x, 2), *ad = cJSON_GetArrayItem(x, 3);
            if (!cJSON_IsString(id) || !cJSON_IsNumber(np) || !cJSON_IsString(h) ||
                !cJSON_IsString(ad)) {
                free(ci->m);
                ci->m = NULL;
                cJSON_Delete(o);
                return -EBADMSG;
            }
            dt_strlcpy(ci->m[i].id, id->valuestring, sizeof ci->m[i].id);
            ci->m[i].nproc = (int)np->valuedouble;
            dt_strlcpy(ci->m[i].host, h->valuestring, sizeof ci->m[i].host);
            dt_strlcpy(ci->m[i].addr, ad->valuestring, sizeof ci->m[i].addr);
            i++;
        }
    }
    cJSON_Delete(o);
    return 0;
}

/* ---- open ---------------------------------------------------------------------------------- */

static int parse_nnodes(const char *s, int *min, int *max, dt_err *err)
{
    int a = 0, b = 0;
    char tail;
    if (sscanf(s, "%d:%d%c", &a, &b, &tail) == 2 || (sscanf(s, "%d%c", &a, &tail) == 1 && (b = a)))
        if (a >= 1 && b >= a) {
            *min = a;
            *max = b;
            return 0;
        }
    return dt_err_set(err, -EINVAL, "--nnodes=%s: expected N or MIN:MAX with 1 <= MIN <= MAX", s);
}

/* Finds the job instance, or makes one (see the header: "job"). */
static int resolve_job(etcd_rdzv *c, dt_err *err)
{
    char jk[KEY_MAX], ak[KEY_MAX], pk[KEY_MAX];
    snprintf(jk, sizeof jk, "%sjob", c->base);
    for (int tries = 0; tries < 50; tries++) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while opening the rendezvous");
        char *J = NULL;
        int64_t mod = 0, old_live = 0;
        int rc = dt_etcd_get(c->ec, jk, &J, &mod, err);
        if (rc && rc != -ENOENT)
            return rc;
        bool replace = rc == -ENOENT;
        if (!replace) {
            /* finished (final set) or abandoned (no live agent): a new job may take the id */
            int64_t fin = 0, live = 0;
            snprintf(pk, sizeof pk, "%s%s/final", c->base, J);
            if ((rc = dt_etcd_range(c->ec, pk, false, true, true, NULL, NULL, &fin, NULL, err)))
                goto out;
            snprintf(pk, sizeof pk, "%s%s/a/", c->base, J);
            if ((rc = dt_etcd_range(c->ec, pk, true, true, true, NULL, NULL, &live, NULL, err)))
                goto out;
            old_live = live;
            if (fin == 0 && live > 0) {
                dt_strlcpy(c->job, J, sizeof c->job);
                free(J);
                snprintf(c->ns, sizeof c->ns, "%s%s/", c->base, c->job);
                keyf(c, ak, "a/%s", c->id);
                return dt_etcd_put(c->ec, ak, "1", c->lease, err);
            }
            replace = true;
        }
        char nj[32];
        dt_rdzv_make_id(nj, sizeof nj);
        snprintf(ak, sizeof ak, "%s%s/a/%s", c->base, nj, c->id);
        cJSON *cmp = cJSON_CreateArray(), *succ = cJSON_CreateArray();
        cJSON_AddItemToArray(cmp, J ? dt_etcd_cmp(jk, "MOD", "EQUAL", mod)
                                    : dt_etcd_cmp(jk, "CREATE", "EQUAL", 0));
        cJSON_AddItemToArray(succ, dt_etcd_op_put(jk, nj, 0));
        cJSON_AddItemToArray(succ, dt_etcd_op_put(ak, "1", c->lease));
        bool ok = false;
        rc = dt_etcd_txn(c->ec, cmp, succ, NULL, &ok, NULL, err);
        if (rc)
            goto out;
        if (ok) {
            if (J && old_live == 0) {
                /* the old instance's keys are of no use to anyone now (an agent of it that is
                 * still reading the outcome keeps them: they are left, a few small keys) */
                snprintf(pk, sizeof pk, "%s%s/", c->base, J);
                dt_etcd_delete(c->ec, pk, true, NULL);
            }
            if (J)
                DT_INFO("etcd: the last job with this id has ended; starting a new one");
            free(J);
            dt_strlcpy(c->job, nj, sizeof c->job);
            snprintf(c->ns, sizeof c->ns, "%s%s/", c->base, c->job);
            return 0;
        }
    out:
        free(J);
        if (rc)
            return rc;
    }
    return dt_err_set(err, -EAGAIN, "etcd: could not settle the job instance (too much contention)");
}

static int agree_conf(etcd_rdzv *c, dt_err *err)
{
    char k[KEY_MAX];
    char *mine = dt_rdzv_conf_propose(&c->o, c->min, c->max), *cur = NULL;
    if (!mine)
        return dt_err_set(err, -ENOMEM, "out of memory");
    keyf(c, k, "conf");
    int rc = dt_etcd_create(c->ec, k, mine, 0, NULL, &cur, err);
    free(mine);
    char where[KEY_MAX + 1100], fix[KEY_MAX + 200];
    snprintf(where, sizeof where, "etcd at %s (key %s)", c->o.endpoints, k);
    snprintf(fix, sizeof fix,
             "delete the job's keys (etcdctl del --prefix %s) or use another --rdzv-id; with "
             "etcd authentication only the job's user can write there",
             c->base);
    if (!rc)
        rc = dt_rdzv_conf_adopt(cur, where, fix, &c->o, &c->min, &c->max, &c->max_restarts,
                                c->run_id, sizeof c->run_id, err);
    free(cur);
    return rc;
}

/* TLS files and credentials from the options (the password from its file, first line). A file
 * that cannot be read is a configuration error (-EINVAL: exit 2, not retried). */
static int load_tls(etcd_rdzv *c, dt_err *err)
{
    const char *files[3] = {c->o.cacert, c->o.cert, c->o.key};
    for (int i = 0; i < 3; i++) {
        struct stat sb;
        int e = !files[i][0] ? 0
                : access(files[i], R_OK) != 0 || stat(files[i], &sb) != 0 ? errno
                : S_ISDIR(sb.st_mode) ? EISDIR
                                      : 0;
        if (e)
            return dt_err_set(err, -EINVAL,
                              "rendezvous.%s: cannot read %s: %s (fix the path in --rdzv-conf "
                              "or the job file's [rendezvous] section)",
                              i == 0 ? "cacert" : i == 1 ? "cert" : "key", files[i], strerror(e));
    }
    dt_strlcpy(c->tls.cacert, c->o.cacert, sizeof c->tls.cacert);
    dt_strlcpy(c->tls.cert, c->o.cert, sizeof c->tls.cert);
    dt_strlcpy(c->tls.key, c->o.key, sizeof c->tls.key);
    dt_strlcpy(c->tls.user, c->o.user, sizeof c->tls.user);
    if (c->o.password_file[0]) {
        FILE *f = fopen(c->o.password_file, "r");
        int e = f ? 0 : errno;
        if (f && !fgets(c->tls.password, sizeof c->tls.password, f)) {
            if (ferror(f)) /* a directory, an I/O error: an empty file is an empty password */
                e = errno ? errno : EIO;
            c->tls.password[0] = '\0';
        }
        if (f)
            fclose(f);
        if (e)
            return dt_err_set(err, -EINVAL,
                              "rendezvous.password_file: cannot read %s: %s (fix the path in "
                              "--rdzv-conf or the job file's [rendezvous] section)",
                              c->o.password_file, strerror(e));
        c->tls.password[strcspn(c->tls.password, "\r\n")] = '\0';
    }
    return 0;
}

/* One status call to each member (a second each at most): 0 when some member answered (what it
 * answered is for the calls that follow to judge), else -ETIMEDOUT with why listing each
 * member and its error. Each member that does not answer is said at once the first time
 * (told[m]): a typo in --rdzv-endpoint should not look like a slow cluster. */
static int probe_members(dt_etcd *ec, bool *told, char *why, size_t cap)
{
    int rc = -ETIMEDOUT, n = dt_etcd_count(ec);
    size_t len = 0;
    why[0] = '\0';
    for (int m = 0; m < n; m++) {
        cJSON *b = cJSON_CreateObject(), *r = NULL;
        dt_err e = {0};
        int one = b ? dt_etcd_call_one(ec, m, "/v3/maintenance/status", b, &r, 1.0, &e)
                    : -ENOMEM;
        cJSON_Delete(b);
        cJSON_Delete(r);
        if (one == -EINTR)
            return -EINTR;
        if (one != -ETIMEDOUT) {
            rc = 0;
            continue;
        }
        if (!told[m])
            DT_WARN("%s: check --rdzv-endpoint (%s)%s", e.msg, dt_etcd_endpoints(ec),
                    n > 1 ? "; the other members are tried" : "");
        told[m] = true;
        if (len < cap)
            len += (size_t)snprintf(why + len, cap - len, "%s%s", len ? "; " : "", e.msg);
    }
    return rc;
}

/* probe_members every second until one answers or deadline; every 5 s a line. */
static int wait_members(etcd_rdzv *c, dt_etcd *ec, double deadline, dt_err *err)
{
    bool told[64] = {false}, waited = false;
    char why[1500];
    double t0 = dt_now_s(), next_line = t0 + 5;
    for (;; waited = true) {
        int rc = probe_members(ec, told, why, sizeof why);
        if (rc != -ETIMEDOUT) {
            if (!rc && waited)
                DT_INFO("reached the etcd cluster at %s after %.1f s", c->o.endpoints,
                        dt_now_s() - t0);
            return rc == -EINTR ? dt_err_set(err, -EINTR, "interrupted while reaching etcd") : 0;
        }
        double now = dt_now_s();
        if (now >= deadline)
            return dt_err_set(err, -ETIMEDOUT,
                              "no member of the etcd cluster at %s answered within join_timeout "
                              "(%g s): %s; check --rdzv-endpoint and that etcd runs there",
                              c->o.endpoints, c->o.join_timeout, why);
        if (now >= next_line) {
            DT_INFO("still waiting for the etcd cluster at %s (%.0f s of join_timeout %g s): %s",
                    c->o.endpoints, now - t0, c->o.join_timeout, why);
            next_line = now + 5;
        }
        for (double until = DT_MIN(now + 1.0, deadline); dt_now_s() < until;) {
            if (interrupted(c))
                return dt_err_set(err, -EINTR, "interrupted while reaching etcd");
            dt_sleep_ms(50);
        }
    }
}

/* Until some member answers, or deadline (join_timeout): says every 5 s what it waits for.
 * Before the main client exists, with one of its own without the etcd user (whose
 * authentication is itself a call that would wait silently). */
static int wait_reachable(etcd_rdzv *c, double deadline, dt_err *err)
{
    dt_etcd_tls bare = c->tls;
    dt_etcd *ec = NULL;
    bare.user[0] = bare.password[0] = '\0';
    int rc = dt_etcd_open(&ec, c->o.endpoints, 1.0, &bare, err);
    if (rc)
        return rc;
    dt_etcd_set_interrupt(ec, interrupted, c);
    rc = wait_members(c, ec, deadline, err);
    dt_etcd_free(ec);
    return rc;
}

static int etcd_open(void **out, const dt_rdzv_opts *opts, dt_err *err)
{
    int rc;
    etcd_rdzv *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        return dt_err_set(err, -ENOMEM, "out of memory");
    c->o = *opts;
    pthread_mutex_init(&c->hb_mu, NULL);
    c->round = c->joining = -1;
    c->poll_ok_at = -1;
    c->slice_ms = opts->interrupted ? 300 : 1000;
    dt_rdzv_make_id(c->id, sizeof c->id);
    if (!opts->endpoints[0]) {
        rc = dt_err_set(err, -EINVAL,
                        "--rdzv-backend=etcd needs --rdzv-endpoint=HOST:PORT[,HOST:PORT...] (the "
                        "etcd members' client addresses)");
        goto fail;
    }
    if (opts->is_host) {
        rc = dt_err_set(err, -EINVAL, "is_host: the etcd backend has no store host (etcd is the "
                                      "store); drop is_host");
        goto fail;
    }
    if ((rc = parse_nnodes(opts->nnodes, &c->min, &c->max, err)))
        goto fail;
    double budget = DT_MAX(c->o.heartbeat_timeout / 2, 2.0);
    if (c->o.read_timeout > 0)
        budget = DT_MIN(budget, DT_MAX(c->o.read_timeout, 0.5));
    double deadline = dt_now_s() + opts->join_timeout;
    if ((rc = load_tls(c, err)) || (rc = wait_reachable(c, deadline, err)) ||
        (rc = dt_etcd_open(&c->ec, opts->endpoints, budget, &c->tls, err))) {
        if (rc == -ETIMEDOUT)
            dt_err_prefix(err, "opening the rendezvous: ");
        goto fail;
    }
    dt_etcd_set_interrupt(c->ec, interrupted, c);
    if (opts->local_addr[0]) {
        dt_strlcpy(c->local_addr, opts->local_addr, sizeof c->local_addr);
    } else {
        char host[DT_RDZV_STR];
        int port = 2379;
        if (dt_rdzv_parse_endpoint(dt_etcd_member(c->ec, 0), host, sizeof host, &port, NULL))
            dt_strlcpy(host, "127.0.0.1", sizeof host);
        dt_rdzv_route_addr(host, port, c->local_addr, sizeof c->local_addr);
    }
    /* The lease first: every key of this agent is bound to it. */
    for (;;) {
        int64_t id = 0;
        rc = dt_etcd_lease_grant(c->ec, lease_ttl(c), &id, err);
        atomic_store(&c->lease, id);
        if (rc != -ETIMEDOUT || dt_now_s() >= deadline)
            break;
    }
    if (rc) {
        dt_err_prefix(err, "opening the rendezvous: ");
        goto fail;
    }
    /* Kept alive from now on: settling the job below may take a few calls' budgets (a member
     * down, an election), which must not cost the lease. */
    if ((rc = pthread_create(&c->hb, NULL, hb_main, c))) {
        rc = dt_err_set(err, -rc, "cannot start the heartbeat thread");
        goto fail;
    }
    c->hb_started = true;
    snprintf(c->base, sizeof c->base, "dtrain/%s/", opts->run_id[0] ? opts->run_id : "none");
    if ((rc = resolve_job(c, err)) || (rc = agree_conf(c, err))) {
        dt_err_prefix(err, "opening the rendezvous: ");
        goto fail;
    }
    DT_DEBUG("etcd: job instance %s at %s, nodes %d:%d, node id %s, lease %" PRIx64 " (TTL %" PRId64
             " s, a keepalive every %.2f s)",
             c->job, opts->endpoints, c->min, c->max, c->id, (uint64_t)atomic_load(&c->lease),
             lease_ttl(c), keepalive_period(c));
    *out = c;
    return 0;
fail:
    etcd_close(c);
    return rc;
}

/* ---- forming a round ----------------------------------------------------------------------- */

static int cmp_member(const void *a, const void *b)
{
    const member *x = a, *y = b;
    if ((x->prev < 0) != (y->prev < 0))
        return x->prev < 0 ? 1 : -1;
    if (x->prev != y->prev)
        return x->prev < y->prev ? -1 : 1;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* The joiners of round R (sorted: survivors first, then by join order). */
static int read_joiners(etcd_rdzv *c, int R, member **out, int *n, int64_t *rev, dt_err *err)
{
    char k[KEY_MAX];
    dt_etcd_kv *kv = NULL;
    int nk = 0;
    keyf(c, k, "r%d/j/", R);
    int rc = dt_etcd_range(c->ec, k, true, false, false, &kv, &nk, NULL, rev, err);
    *out = NULL;
    *n = 0;
    if (rc)
        return rc;
    member *m = calloc((size_t)(nk ? nk : 1), sizeof *m);
    int cnt = 0;
    for (int i = 0; m && i < nk; i++) {
        cJSON *o = cJSON_Parse(kv[i].value);
        if (!o)
            continue;
        member *x = &m[cnt++];
        dt_rdzv_json_str(o, "id", x->id, sizeof x->id);
        dt_rdzv_json_str(o, "host", x->host, sizeof x->host);
        dt_rdzv_json_str(o, "addr", x->addr, sizeof x->addr);
        x->nproc = (int)dt_rdzv_json_num(o, "nproc", 1);
        x->prev = (int)dt_rdzv_json_num(o, "prev", -1);
        x->order = kv[i].create_rev;
        cJSON_Delete(o);
    }
    dt_etcd_kvs_free(kv, nk);
    if (!m)
        return dt_err_set(err, -ENOMEM, "out of memory");
    qsort(m, (size_t)cnt, sizeof *m, cmp_member);
    *out = m;
    *n = cnt;
    return 0;
}

/* Closes round R with the first min(n, MAX) joiners j, cut to the most whose world the layout
 * can use (one txn; whoever wins). */
static int close_round(etcd_rdzv *c, int R, const member *j, int n, int attempt, dt_err *err)
{
    char k[KEY_MAX], rk[KEY_MAX], rv[16];
    n = dt_rdzv_usable_prefix(&c->o, c->min, R, &j[0].nproc, sizeof *j, DT_MIN(n, c->max));
    cJSON *o = cJSON_CreateObject(), *a;
    int world = 0;
    cJSON_AddNumberToObject(o, "n", n);
    cJSON_AddNumberToObject(o, "attempt", attempt);
    a = cJSON_AddArrayToObject(o, "members");
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateArray();
        cJSON_AddItemToArray(x, cJSON_CreateString(j[i].id));
        cJSON_AddItemToArray(x, cJSON_CreateNumber(j[i].nproc));
        cJSON_AddItemToArray(x, cJSON_CreateString(j[i].host));
        cJSON_AddItemToArray(x, cJSON_CreateString(j[i].addr));
        cJSON_AddItemToArray(a, x);
        world += j[i].nproc;
    }
    cJSON_AddNumberToObject(o, "world", world);
    char *v = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!v)
        return dt_err_set(err, -ENOMEM, "out of memory");
    keyf(c, k, "r%d/closed", R);
    keyf(c, rk, "round");
    snprintf(rv, sizeof rv, "%d", R);
    cJSON *cmp = cJSON_CreateArray(), *succ = cJSON_CreateArray();
    cJSON_AddItemToArray(cmp, dt_etcd_cmp(k, "CREATE", "EQUAL", 0));
    cJSON_AddItemToArray(succ, dt_etcd_op_put(k, v, 0));
    cJSON_AddItemToArray(succ, dt_etcd_op_put(rk, rv, 0));
    bool ok = false;
    int rc = dt_etcd_txn(c->ec, cmp, succ, NULL, &ok, NULL, err);
    free(v);
    if (!rc && ok)
        DT_DEBUG("etcd: closed round %d with %d node(s)", R, n);
    return rc;
}

static void cancel_round(etcd_rdzv *c, int R, int code, const char *kind, const char *why,
                         bool *won)
{
    char k[KEY_MAX];
    keyf(c, k, "r%d/closed", R);
    *won = false;
    if (dt_etcd_create(c->ec, k, "{\"final\":1}", 0, won, NULL, NULL) == 0 && *won)
        write_final(c, code, kind, -1, 0, why);
}

static void fill_round(etcd_rdzv *c, const closed_rec *ci, int R, int g, const cJSON *host,
                       dt_rdzv_round *rd)
{
    memset(rd, 0, sizeof *rd);
    int base = 0;
    for (int i = 0; i < g; i++)
        base += ci->m[i].nproc;
    rd->round = R;
    rd->attempt = ci->attempt;
    rd->max_restarts = c->max_restarts;
    rd->group_rank = g;
    rd->group_world_size = ci->n;
    rd->rank_base = base;
    rd->local_world_size = c->o.local_world_size;
    rd->world_size = ci->world;
    dt_strlcpy(rd->run_id, c->run_id, sizeof rd->run_id);
    dt_strlcpy(rd->master_addr, ci->m[0].addr, sizeof rd->master_addr);
    dt_strlcpy(rd->store_addr, ci->m[0].addr, sizeof rd->store_addr);
    if (host) {
        dt_rdzv_json_str(host, "master_addr", rd->master_addr, sizeof rd->master_addr);
        rd->master_port = (int)dt_rdzv_json_num(host, "master_port", 0);
        dt_rdzv_json_str(host, "store_addr", rd->store_addr, sizeof rd->store_addr);
        rd->store_port = (int)dt_rdzv_json_num(host, "store_port", 0);
    }
    dt_strlcpy(rd->local_addr, c->local_addr, sizeof rd->local_addr);
    rd->elastic = true;
}

/* Group rank 0: hosts the workers' store for round R and publishes where it and MASTER_PORT
 * are. */
static int host_round(etcd_rdzv *c, int R, cJSON **host, dt_err *err)
{
    char k[KEY_MAX];
    int mport = 0, rc;
    char bind[DT_RDZV_STR], conn[DT_RDZV_STR];
    dt_rdzv_store_bind(c->local_addr, bind, conn, sizeof bind); /* where the others reach it */
    if ((rc = dt_rdzv_host_store(&c->server, bind, 0, err)))
        return rc;
    if ((rc = dt_rdzv_free_port(&mport, err)))
        return rc;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "master_addr", c->local_addr);
    cJSON_AddNumberToObject(o, "master_port", mport);
    cJSON_AddStringToObject(o, "store_addr", c->local_addr);
    cJSON_AddNumberToObject(o, "store_port", dt_store_server_port(c->server));
    char *v = cJSON_PrintUnformatted(o);
    keyf(c, k, "r%d/host", R);
    rc = v ? dt_etcd_put(c->ec, k, v, 0, err) : dt_err_set(err, -ENOMEM, "out of memory");
    free(v);
    if (rc) {
        cJSON_Delete(o);
        return rc;
    }
    *host = o;
    return 0;
}

/* Waits (watching) until rank 0 published r<R>/host, or R ended, or deadline. *host NULL when it
 * did not come (the round's end is then seen by the first poll). */
static int wait_host(etcd_rdzv *c, int R, double deadline, cJSON **host, dt_err *err)
{
    char k[KEY_MAX], ek[KEY_MAX];
    keyf(c, k, "r%d/host", R);
    keyf(c, ek, "r%d/end", R);
    *host = NULL;
    for (;;) {
        int64_t rev = 0;
        dt_etcd_kv *kv = NULL;
        int n = 0;
        int rc = dt_etcd_range(c->ec, k, false, false, false, &kv, &n, NULL, &rev, err);
        if (rc)
            return rc;
        if (n > 0) {
            *host = cJSON_Parse(kv[0].value);
            dt_etcd_kvs_free(kv, n);
            return 0;
        }
        char *v = NULL;
        if (get(c, ek, &v, NULL) == 0) {
            free(v);
            return 0;
        }
        if (dt_now_s() >= deadline)
            return 0;
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting for node 0");
        bool ch = false;
        if ((rc = dt_etcd_watch(c->ec, k, false, rev + 1, c->slice_ms, &ch, err)))
            return rc; /* (the end is looked at between slices) */
    }
}

/* Joins round R. 0: a member (rd filled); 1: R closed without this node; else an error. */
static int join_round(etcd_rdzv *c, int R, double deadline, dt_rdzv_round *rd,
                      dt_rdzv_status *st, dt_err *err)
{
    char k[KEY_MAX], jk[KEY_MAX], sk[KEY_MAX], pk[KEY_MAX], spk[KEY_MAX], *v = NULL,
        prev_why[256] = "";
    int rc, expect = -1;
    int prev = c->round >= 0 && c->round == R - 1 ? c->g : -1, attempt = 0;
    if (R > 0) {
        /* R-1's end (survivors, lost nodes) and closed record (the attempt): one request */
        char ck[KEY_MAX], *cv = NULL;
        cJSON *resp = NULL, *ops = cJSON_CreateArray();
        keyf(c, k, "r%d/end", R - 1);
        keyf(c, ck, "r%d/closed", R - 1);
        cJSON_AddItemToArray(ops, dt_etcd_op_range(k));
        cJSON_AddItemToArray(ops, dt_etcd_op_range(ck));
        if ((rc = dt_etcd_txn(c->ec, NULL, ops, NULL, NULL, &resp, err)))
            return dt_err_prefix(err, "joining the rendezvous: ");
        dt_etcd_txn_range(resp, 0, &v, NULL);
        dt_etcd_txn_range(resp, 1, &cv, NULL);
        cJSON_Delete(resp);
        closed_rec pc;
        if (cv && closed_decode(cv, &pc) == 0)
            attempt = pc.attempt;
        if (cv)
            free(pc.m);
        free(cv);
        if (v) {
            end_rec e;
            if (end_decode(v, &e) == 0) {
                expect = e.expect;
                dt_strlcpy(prev_why, e.why, sizeof prev_why);
                if (prev >= 0 && end_has_lost(&e, prev))
                    prev = -1;
                if (e.kind == END_FAIL)
                    attempt++;
            }
            free(e.lost);
            free(v);
            v = NULL;
        }
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", c->id);
    cJSON_AddStringToObject(o, "host", dt_hostname());
    cJSON_AddStringToObject(o, "addr", c->local_addr);
    cJSON_AddNumberToObject(o, "nproc", c->o.local_world_size);
    cJSON_AddNumberToObject(o, "pid", (int)getpid());
    cJSON_AddNumberToObject(o, "prev", prev);
    char *rec = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    if (!rec)
        return dt_err_set(err, -ENOMEM, "out of memory");
    keyf(c, jk, "r%d/j/%s", R, c->id);
    keyf(c, sk, "r%d/s/%s", R, c->id);
    keyf(c, pk, "r%d/j/", R);
    keyf(c, spk, "r%d/s/", R);
    int64_t cnt = 0, surv = 0;
    for (int tries = 0;; tries++) {
        /* the join record, and for a survivor of R-1 its mark (counted apart, so that the last
         * survivor back can close the round at once), then how many are in: one request */
        cJSON *succ = cJSON_CreateArray(), *resp = NULL;
        cJSON_AddItemToArray(succ, dt_etcd_op_put(jk, rec, c->lease));
        if (prev >= 0)
            cJSON_AddItemToArray(succ, dt_etcd_op_put(sk, "1", c->lease));
        cJSON_AddItemToArray(succ, dt_etcd_op_count(pk));
        cJSON_AddItemToArray(succ, dt_etcd_op_count(spk));
        rc = dt_etcd_txn(c->ec, NULL, succ, NULL, NULL, &resp, err);
        if (rc == 0) {
            int at = prev >= 0 ? 2 : 1;
            dt_etcd_txn_range(resp, at, NULL, &cnt);
            dt_etcd_txn_range(resp, at + 1, NULL, &surv);
        }
        cJSON_Delete(resp);
        if (rc != -ENOENT || tries > 0)
            break;
        /* the lease expired (this agent was cut off, or frozen, for heartbeat_timeout) before
         * the heartbeat thread noticed: a new one, and this node joins as a newcomer */
        if ((rc = renew_lease(c, err)))
            break;
    }
    free(rec);
    if (rc)
        return dt_err_prefix(err, "joining the rendezvous: ");
    c->joining = R;
    keyf(c, k, "r%d/closed", R);
    /* Who closes (as c10d): the MAX-th joiner; with every survivor of R-1 back, a survivor (the
     * last one back) or a newcomer once MIN are in; else whoever's last call (counted from its
     * own join, MIN or more in) runs out first. Each node counts once when it joins (count-only
     * ranges, O(1) answers) and then watches only r<R>/closed: a join wakes nobody, so a round
     * of N nodes costs O(N) requests, not O(N^2). */
    bool surv_back = expect < 0 || surv >= expect;
    bool can = (surv_back && cnt >= c->max) ||
               (surv_back && expect >= 0 && cnt >= c->min);
    double t_join = dt_now_s(), close_at = cnt >= c->min ? t_join + c->o.last_call_timeout : 1e300;
    double next_count = t_join + 1.0, next_final = t_join + 2.0, retry = 0.5;
    DT_DEBUG("etcd: joined round %d as #%lld (nodes %d:%d, prev %d, expect %d, survivors back "
             "%lld)", R, (long long)cnt, c->min, c->max, prev, expect, (long long)surv);
    for (;;) {
        if (can) {
            member *j = NULL;
            int nj = 0;
            if ((rc = read_joiners(c, R, &j, &nj, NULL, err)) == 0 && nj >= c->min)
                rc = close_round(c, R, j, nj, attempt, err);
            free(j);
            if (rc)
                return dt_err_prefix(err, "closing a rendezvous round: ");
            can = false;
        }
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting for the other nodes");
        if ((rc = cluster_lost(c, err)))
            return rc;
        int64_t rev = 0;
        dt_etcd_kv *kv = NULL;
        int n = 0;
        if ((rc = dt_etcd_range(c->ec, k, false, false, false, &kv, &n, NULL, &rev, err)))
            return dt_err_prefix(err, "waiting for the round to form: ");
        if (n > 0) {
            v = kv[0].value;
            kv[0].value = NULL;
            dt_etcd_kvs_free(kv, n);
            break;
        }
        double now = dt_now_s();
        if (now >= next_final) { /* (a cancel also writes r<R>/closed; this is the backstop) */
            next_final = now + 2.0;
            if (job_final(c, st))
                return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s",
                                  st->why);
        }
        if (now >= next_count || now >= close_at || now >= deadline) {
            next_count = now + 1.0;
            if ((rc = dt_etcd_range(c->ec, pk, true, true, true, NULL, NULL, &cnt, NULL, err)))
                return dt_err_prefix(err, "waiting for the round to form: ");
            if (cnt >= c->min && close_at > 1e299)
                close_at = now + c->o.last_call_timeout;
            if (now >= close_at) {
                /* the last call is over (normally the first such node closes and nobody
                 * else gets here); fewer than MIN left (a joiner died): look again later */
                can = cnt >= c->min;
                retry = DT_MIN(2 * retry, 8.0);
                close_at = now + retry;
                continue;
            }
        }
        if (now >= deadline) {
            char why[700];
            snprintf(why, sizeof why,
                     "round %d did not form: %lld node(s) joined within the join timeout (%g s) "
                     "and MIN is %d%s%s%s",
                     R, (long long)cnt, c->o.join_timeout, c->min,
                     prev_why[0] ? " (the last round ended: " : "", prev_why,
                     prev_why[0] ? ")" : "");
            bool won = false;
            cancel_round(c, R, 1, "rdzv", why, &won);
            if (won || job_final(c, st))
                return dt_err_set(err, -ETIMEDOUT, "%s", why);
            deadline = 1e300; /* it closed just now: read it */
            continue;
        }
        double until = DT_MIN(DT_MIN(deadline, close_at), DT_MIN(next_count, next_final));
        int ms = (int)DT_MIN((until - now) * 1000 + 5, (double)c->slice_ms);
        bool ch = false;
        if ((rc = dt_etcd_watch(c->ec, k, false, rev + 1, DT_MAX(ms, 20), &ch, err)))
            return dt_err_prefix(err, "waiting for the round to form: ");
    }
    closed_rec ci;
    rc = closed_decode(v, &ci);
    free(v);
    if (rc)
        return dt_err_set(err, rc, "round %d's record in etcd is damaged", R);
    if (ci.cancelled) {
        if (!job_final(c, st)) {
            st->state = DT_RDZV_ABORTED;
            snprintf(st->why, sizeof st->why, "round %d was cancelled", R);
        }
        return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s", st->why);
    }
    int g = -1;
    for (int i = 0; i < ci.n; i++)
        if (!strcmp(ci.m[i].id, c->id))
            g = i;
    c->joining = -1;
    if (g < 0) {
        free(ci.m);
        return 1;
    }
    if (c->server) {
        dt_store_server_stop(c->server);
        c->server = NULL;
    }
    cJSON *host = NULL;
    if (g == 0)
        rc = host_round(c, R, &host, err);
    else
        rc = wait_host(c, R, dt_now_s() + c->o.join_timeout, &host, err);
    if (rc) {
        free(ci.m);
        return dt_err_prefix(err, "round %d: ", R);
    }
    c->round = R;
    c->poll_ok_at = dt_now_s(); /* the round was just read from the cluster */
    c->g = g;
    c->n = ci.n;
    c->attempt = ci.attempt;
    free(c->mem);
    c->mem = ci.m;
    c->next_check = dt_now_s() + c->o.heartbeat_interval;
    fill_round(c, &ci, R, g, host, rd);
    cJSON_Delete(host);
    return 0;
}

static bool end_is_final(etcd_rdzv *c, const end_rec *e, int attempt, dt_rdzv_status *st)
{
    dt_rdzv_status end;
    end_status(e, &end);
    if (!dt_rdzv_round_ends_job(&end, attempt, c->max_restarts))
        return false;
    *st = end;
    return true;
}

static int create_end(etcd_rdzv *c, int R, const char *v, bool *won, char **cur, dt_err *err)
{
    char k[KEY_MAX];
    keyf(c, k, "r%d/end", R);
    return dt_etcd_create(c->ec, k, v, 0, won, cur, err);
}

/* A newcomer finds round R running without it on ci->n nodes, fewer than MAX. Sets *grow:
 * whether the nodes now present (R's, the spares that wait on R, this one) make a larger world
 * the job can use (opts.world_usable): then this node ends R (REGROUP) for R+1 to take them
 * in; else it waits as a spare. This node records itself as a spare of R (r<R>/sp/<id>: its
 * worker count, under its lease, so that a dead spare is not counted). Without world_usable
 * *grow stays true and nothing is recorded. */
static int spare_grows(etcd_rdzv *c, int R, const closed_rec *ci, bool *grow, dt_err *err)
{
    char k[KEY_MAX], v[32];
    dt_etcd_kv *kv = NULL;
    int nk = 0, rc;
    if (!c->o.world_usable)
        return 0;
    keyf(c, k, "r%d/sp/%s", R, c->id);
    snprintf(v, sizeof v, "%d", c->o.local_world_size);
    if ((rc = dt_etcd_put(c->ec, k, v, c->lease, err)))
        return rc;
    keyf(c, k, "r%d/sp/", R);
    if ((rc = dt_etcd_range(c->ec, k, true, false, false, &kv, &nk, NULL, NULL, err)))
        return rc;
    /* the first spares fill the free slots (with the same worker count everywhere, any order
     * makes the same worlds) */
    int world = ci->world;
    *grow = false;
    for (int i = 0; i < nk && i < c->max - ci->n && !*grow; i++) {
        int np = atoi(kv[i].value);
        world += np > 0 ? np : 0;
        *grow = dt_rdzv_world_usable(&c->o, world);
    }
    dt_etcd_kvs_free(kv, nk);
    return 0;
}

/* Waits as a spare while round R (full, or layout: one the job's layout cannot grow by this
 * node) runs, until it ends; watches its rank 0 meanwhile. */
static int spare_wait(etcd_rdzv *c, int R, const closed_rec *ci, bool layout, dt_rdzv_status *st,
                      dt_err *err)
{
    char ek[KEY_MAX], zk[KEY_MAX], *v = NULL;
    double next = dt_now_s() + c->o.heartbeat_interval;
    if (layout)
        DT_INFO("round %d runs on %d of at most %d nodes (world %d), and the job's layout cannot "
                "use the world this node would make with it: waiting as a spare until a later "
                "round can use it",
                R, ci->n, c->max, ci->world);
    else
        DT_INFO("round %d is full (%d of at most %d nodes): waiting as a spare until a slot "
                "frees",
                R, ci->n, c->max);
    keyf(c, ek, "r%d/end", R);
    keyf(c, zk, "r%d/j/%s", R, ci->m[0].id);
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while waiting as a spare");
        int rc;
        if ((rc = cluster_lost(c, err)))
            return rc;
        int64_t rev = 0, cnt = 0;
        dt_etcd_kv *kv = NULL;
        int n = 0;
        if ((rc = dt_etcd_range(c->ec, ek, false, false, false, &kv, &n, NULL, &rev, err)))
            return dt_err_prefix(err, "waiting as a spare: ");
        dt_etcd_kvs_free(kv, n);
        if (n > 0)
            return 0;
        if (job_final(c, st))
            return dt_err_set(err, -ECANCELED, "the job ended while this node waited: %s",
                              st->why);
        if (dt_now_s() >= next) {
            next = dt_now_s() + c->o.heartbeat_interval;
            if (dt_etcd_range(c->ec, zk, false, true, true, NULL, NULL, &cnt, NULL, NULL) == 0 &&
                cnt == 0) {
                char why[256];
                snprintf(why, sizeof why, "node 0 of round %d was lost (its etcd lease is gone: "
                         "expired or revoked; seen by a spare)", R);
                int zero = 0;
                if ((v = end_encode(END_REGROUP, -1, 0, ci->n - 1, &zero, 1, why))) {
                    bool won = false;
                    if (create_end(c, R, v, &won, NULL, NULL) == 0 && won)
                        DT_WARN("%s", why);
                    free(v);
                }
                continue;
            }
        }
        bool ch = false;
        if ((rc = dt_etcd_watch(c->ec, ek, false, rev + 1, c->slice_ms, &ch, err)))
            return dt_err_prefix(err, "waiting as a spare: ");
    }
}

static int etcd_next(void *self, dt_rdzv_round *rd, dt_rdzv_status *st, dt_err *err)
{
    etcd_rdzv *c = self;
    dt_rdzv_status dummy;
    char k[KEY_MAX], *v = NULL;
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
    if ((rc = cluster_lost(c, err)))
        return rc;
    if (atomic_load(&c->hb_expired) && (rc = renew_lease(c, err)))
        return rc;

    int R = c->round + 1;
    bool hinted = false;
    double deadline = dt_now_s() + c->o.join_timeout;
    bool announced = false;
    for (;;) {
        if (interrupted(c))
            return dt_err_set(err, -EINTR, "interrupted while joining the rendezvous");
        /* The job's end, the last round that closed (a newcomer's hint), round R's closed and end
         * records: one request. */
        char fk[KEY_MAX], hk[KEY_MAX], ek[KEY_MAX], *fv = NULL, *hv = NULL, *ev = NULL;
        cJSON *ops = cJSON_CreateArray(), *resp = NULL;
        keyf(c, fk, "final");
        keyf(c, hk, "round");
        keyf(c, k, "r%d/closed", R);
        keyf(c, ek, "r%d/end", R);
        cJSON_AddItemToArray(ops, dt_etcd_op_range(fk));
        cJSON_AddItemToArray(ops, dt_etcd_op_range(hk));
        cJSON_AddItemToArray(ops, dt_etcd_op_range(k));
        cJSON_AddItemToArray(ops, dt_etcd_op_range(ek));
        if ((rc = dt_etcd_txn(c->ec, NULL, ops, NULL, NULL, &resp, err)))
            return dt_err_prefix(err, "joining the rendezvous: ");
        dt_etcd_txn_range(resp, 0, &fv, NULL);
        dt_etcd_txn_range(resp, 1, &hv, NULL);
        dt_etcd_txn_range(resp, 2, &v, NULL);
        dt_etcd_txn_range(resp, 3, &ev, NULL);
        cJSON_Delete(resp);
        bool fin = final_status(fv, st);
        int hint = hv ? atoi(hv) : -1;
        free(fv);
        free(hv);
        if (fin) {
            free(v);
            free(ev);
            return dt_err_set(err, -ECANCELED, "the job has ended: %s", st->why);
        }
        if (!hinted && c->round < 0 && hint > R) {
            hinted = true; /* rounds before the last closed one are over */
            free(v);
            free(ev);
            R = hint;
            continue;
        }
        hinted = true;
        rc = v ? 0 : -ENOENT;
        if (rc == -ENOENT) {
            free(ev);
            rc = join_round(c, R, deadline, rd, st, err);
            if (rc <= 0)
                return rc;
            continue;
        }
        if (rc)
            return dt_err_prefix(err, "joining the rendezvous: ");
        closed_rec ci;
        rc = closed_decode(v, &ci);
        free(v);
        if (rc) {
            free(ev);
            return dt_err_set(err, rc, "round %d's record in etcd is damaged", R);
        }
        if (ci.cancelled) {
            free(ev);
            R++;
            continue;
        }
        v = ev;
        rc = v ? 0 : -ENOENT;
        if (rc == 0) {
            end_rec e;
            rc = end_decode(v, &e);
            free(v);
            bool over = rc == 0 && end_is_final(c, &e, ci.attempt, st);
            free(e.lost);
            free(ci.m);
            if (over)
                return dt_err_set(err, -ECANCELED, "the job has ended: %s", st->why);
            R++;
            continue;
        }
        if (rc != -ENOENT) {
            free(ci.m);
            return dt_err_prefix(err, "joining the rendezvous: ");
        }
        bool grow = ci.n < c->max;
        if (grow && (rc = spare_grows(c, R, &ci, &grow, err))) {
            free(ci.m);
            return dt_err_prefix(err, "joining the rendezvous: ");
        }
        if (grow) {
            char why[600];
            snprintf(why, sizeof why, "node %s (%s) joins the job, which runs on %d of at most %d",
                     c->local_addr, dt_hostname(), ci.n, c->max);
            char *rv = end_encode(END_REGROUP, -1, 0, ci.n, NULL, 0, why);
            if (!announced)
                DT_INFO("round %d runs with %d node(s): asking it to regroup so that this node "
                        "joins",
                        R, ci.n);
            announced = true;
            rc = rv ? create_end(c, R, rv, NULL, NULL, err)
                    : dt_err_set(err, -ENOMEM, "out of memory");
            free(rv);
            free(ci.m);
            if (rc)
                return dt_err_prefix(err, "joining the rendezvous: ");
            R++;
            continue;
        }
        rc = spare_wait(c, R, &ci, ci.n < c->max, st, err);
        free(ci.m);
        if (rc)
            return rc;
        deadline = dt_now_s() + c->o.join_timeout;
    }
}

/* ---- while a round runs -------------------------------------------------------------------- */

static void cache_end(etcd_rdzv *c, const char *v)
{
    end_rec e;
    if (end_decode(v, &e)) {
        free(e.lost);
        return;
    }
    end_status(&e, &c->ended);
    if (end_has_lost(&e, c->g))
        dt_rdzv_round_declared_lost(&c->ended, e.why);
    bool final = dt_rdzv_round_ends_job(&c->ended, c->attempt, c->max_restarts);
    if (final && e.kind == END_FAIL)
        write_final(c, 1, "fail", e.node, 0, e.why);
    free(e.lost);
}

/* Every heartbeat_interval: rank 0 checks that every member's join record (bound to its lease)
 * is there; the others check rank 0's. A missing one ends the round (REGROUP). */
static int check_members(etcd_rdzv *c, dt_err *err)
{
    char k[KEY_MAX], why[256];
    int *lost = calloc((size_t)c->n, sizeof *lost), nl = 0, rc = 0;
    if (!lost)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (c->g == 0) {
        dt_etcd_kv *kv = NULL;
        int n = 0;
        keyf(c, k, "r%d/j/", c->round);
        size_t pl = strlen(k);
        if ((rc = dt_etcd_range(c->ec, k, true, true, false, &kv, &n, NULL, NULL, err)))
            goto out;
        for (int g = 1; g < c->n; g++) {
            bool there = false;
            for (int i = 0; i < n && !there; i++)
                there = strlen(kv[i].key) > pl && !strcmp(kv[i].key + pl, c->mem[g].id);
            if (!there)
                lost[nl++] = g;
        }
        dt_etcd_kvs_free(kv, n);
    } else {
        int64_t cnt = 0;
        keyf(c, k, "r%d/j/%s", c->round, c->mem[0].id);
        if ((rc = dt_etcd_range(c->ec, k, false, true, true, NULL, NULL, &cnt, NULL, err)))
            goto out;
        if (cnt == 0)
            lost[nl++] = 0;
    }
    if (nl > 0) {
        char list[128] = "";
        for (int i = 0; i < nl && strlen(list) < 100; i++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d (%s)", i ? ", " : "",
                     lost[i], c->mem[lost[i]].host);
        /* A record is gone when its lease expired (no keepalive for heartbeat_timeout) or was
         * revoked (its agent ended without writing the round's end): from here both look the
         * same, so the message names both. */
        snprintf(why, sizeof why, "node%s %s of round %d lost: etcd lease gone (no keepalive for "
                 "heartbeat_timeout, %g s, or its agent ended)", nl > 1 ? "s" : "", list,
                 c->round, c->o.heartbeat_timeout);
        char *v = end_encode(END_REGROUP, -1, 0, c->n - nl, lost, nl, why);
        bool won = false;
        if (v && create_end(c, c->round, v, &won, NULL, NULL) == 0 && won)
            DT_WARN("%s", why);
        free(v);
    }
out:
    free(lost);
    return rc;
}

static int etcd_poll(void *self, dt_rdzv_status *st, dt_err *err)
{
    etcd_rdzv *c = self;
    char k[KEY_MAX], *v = NULL;
    memset(st, 0, sizeof *st);
    if (c->killed)
        return dt_err_set(err, -EIO, "this rendezvous was killed");
    if ((c->ended.state == DT_RDZV_FAILED || c->ended.state == DT_RDZV_REGROUP) && c->round >= 0) {
        dt_rdzv_status fs;
        if (job_final(c, &fs) && fs.state == DT_RDZV_ABORTED)
            c->ended = fs;
    }
    if (c->ended.state != DT_RDZV_RUNNING || c->round < 0) {
        *st = c->ended;
        return 0;
    }
    double t_call = dt_now_s();
    int rc = cluster_lost(c, err);
    if (rc)
        return rc;
    if (atomic_load(&c->hb_expired)) {
        /* cut off for heartbeat_timeout: the others went on without this node */
        c->ended.state = DT_RDZV_REGROUP;
        c->ended.node = c->g;
        snprintf(c->ended.why, sizeof c->ended.why,
                 "this node's etcd lease expired (cut off for heartbeat_timeout, %g s): the "
                 "others went on without it; it rejoins the job as a new node",
                 c->o.heartbeat_timeout);
        c->round = -1; /* a newcomer from now on */
        *st = c->ended;
        return renew_lease(c, err);
    }
    keyf(c, k, "r%d/end", c->round);
    rc = get(c, k, &v, err);
    if (rc == -ENOENT && dt_now_s() >= c->next_check && c->n > 1) {
        c->next_check = dt_now_s() + c->o.heartbeat_interval;
        if (!(rc = check_members(c, err)))
            rc = get(c, k, &v, err);
    }
    /* No member answered in one call's budget: an election (a leader's host cut off) takes
     * seconds, so the round is lost only once no read has succeeded for heartbeat_timeout - the
     * lease's own clock, counted from the start of the last poll that got an answer, so that the
     * agents end within heartbeat_timeout of the cluster's last answer (test_etcd quorum_lost,
     * test_cluster_etcd leader_host_cut). Until then the last known state (running) stands. */
    if (rc == -ETIMEDOUT) {
        if (c->poll_ok_at < 0)
            c->poll_ok_at = t_call;
        if (dt_now_s() - c->poll_ok_at < c->o.heartbeat_timeout)
            return 0;
    } else {
        c->poll_ok_at = t_call;
    }
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return dt_err_prefix(err, "checking the round: ");
    cache_end(c, v);
    free(v);
    *st = c->ended;
    return 0;
}

static int etcd_succeeded(void *self, dt_err *err)
{
    etcd_rdzv *c = self;
    char k[KEY_MAX], *v = NULL;
    int64_t d = 0;
    bool won = false;
    c->done = true;
    if (c->round < 0 || c->killed)
        return 0;
    keyf(c, k, "r%d/done/%d", c->round, c->g);
    int rc = dt_etcd_put(c->ec, k, "1", 0, err);
    if (!rc) {
        keyf(c, k, "r%d/done/", c->round);
        rc = dt_etcd_range(c->ec, k, true, true, true, NULL, NULL, &d, NULL, err);
    }
    if (rc)
        return dt_err_prefix(err, "reporting success: ");
    if (d < c->n)
        return 0;
    if (!(v = end_encode(END_SUCCESS, c->g, 0, c->n, NULL, 0, "every node succeeded")))
        return dt_err_set(err, -ENOMEM, "out of memory");
    rc = create_end(c, c->round, v, &won, NULL, err);
    free(v);
    if (rc)
        return dt_err_prefix(err, "reporting success: ");
    if (won)
        write_final(c, 0, "success", c->g, 0, "every node succeeded");
    return 0;
}

static int put_failures(etcd_rdzv *c, const dt_rdzv_failure *f, int n, dt_err *err)
{
    char k[KEY_MAX];
    for (int i = 0; i < n; i++) {
        char *j = dt_rdzv_failure_to_json(&f[i]);
        if (!j)
            return dt_err_set(err, -ENOMEM, "out of memory");
        keyf(c, k, "r%d/f/%d.%d", c->round, c->g, c->fail_seq++);
        int rc = dt_etcd_put(c->ec, k, j, 0, err);
        free(j);
        if (rc)
            return rc;
    }
    return 0;
}

static int etcd_failed(void *self, const dt_rdzv_failure *f, int n, dt_err *err)
{
    etcd_rdzv *c = self;
    char why[200], *v = NULL, *cur = NULL;
    int rc;
    if ((rc = dt_rdzv_fail_list_add(&c->fails, f, n, err)))
        return rc;
    dt_rdzv_round_failure_why(f, n, c->g, why, sizeof why);
    if (c->round < 0 || c->killed) {
        dt_rdzv_round_failed_here(&c->ended, c->g, why);
        return 0;
    }
    if (!(v = end_encode(END_FAIL, c->g, 0, c->n, NULL, 0, why)))
        return dt_err_set(err, -ENOMEM, "out of memory");
    rc = put_failures(c, f, n, err);
    int rc2 = rc ? rc : create_end(c, c->round, v, NULL, &cur, err);
    if (rc2 == 0 && cur && cur[0])
        cache_end(c, cur);
    else if (c->ended.state == DT_RDZV_RUNNING)
        cache_end(c, v);
    free(cur);
    free(v);
    return rc2 ? dt_err_prefix(err, "reporting a failure: ") : 0;
}

static void end_job(etcd_rdzv *c, int code, const char *kind, int sig, const char *why)
{
    char k[KEY_MAX], *h = NULL;
    dt_rdzv_round_abort_here(&c->ended, c->round >= 0 ? c->g : -1, sig, why);
    if (!c->ec || c->killed || dt_etcd_unreachable(c->ec))
        return; /* nobody could read it: the others lose the cluster too */
    /* Said even when this agent was interrupted (a signal is what ends the job here): each call
     * is still bounded by the client's budget. */
    dt_etcd_set_interrupt(c->ec, NULL, NULL);
    write_final(c, code, kind, c->round >= 0 ? c->g : -1, sig, why);
    if (c->joining >= 0) {
        keyf(c, k, "r%d/closed", c->joining);
        dt_etcd_create(c->ec, k, "{\"final\":1}", 0, NULL, NULL, NULL);
    }
    int latest = c->round;
    keyf(c, k, "round");
    if (get(c, k, &h, NULL) == 0)
        latest = DT_MAX(latest, atoi(h));
    free(h);
    char *v = end_encode(END_ABORT, c->round >= 0 ? c->g : -1, sig, c->n, NULL, 0, why);
    int ends[2] = {c->round, latest};
    for (int i = 0; i < 2 && v; i++) {
        if (ends[i] < 0 || (i == 1 && ends[1] == ends[0]))
            continue;
        create_end(c, ends[i], v, NULL, NULL, NULL);
    }
    if (latest >= 0) {
        keyf(c, k, "r%d/closed", latest + 1);
        dt_etcd_create(c->ec, k, "{\"final\":1}", 0, NULL, NULL, NULL);
    }
    free(v);
}

static int etcd_abort(void *self, int sig, dt_err *err)
{
    etcd_rdzv *c = self;
    char why[200];
    if (c->killed)
        return 0;
    snprintf(why, sizeof why, "node %d's agent (%s) was stopped by signal %d",
             c->round >= 0 ? c->g : -1, dt_hostname(), sig);
    end_job(c, 128 + sig, "abort", sig, why);
    (void)err;
    return 0;
}

static int etcd_abort_config(void *self, const dt_rdzv_failure *f, int n, const char *why,
                             dt_err *err)
{
    etcd_rdzv *c = self;
    int rc = 0;
    if (c->killed)
        return 0;
    if ((rc = dt_rdzv_fail_list_add(&c->fails, f, n, err)))
        return rc;
    if (n > 0 && c->round >= 0 && (rc = put_failures(c, f, n, err)))
        dt_err_prefix(err, "reporting a configuration error: ");
    end_job(c, 2, "config", -1, why);
    return rc;
}

static int etcd_failures(void *self, dt_rdzv_failure **out, int *n, dt_err *err)
{
    etcd_rdzv *c = self;
    char k[KEY_MAX];
    *out = NULL;
    *n = 0;
    if (c->round >= 0 && !c->killed && !dt_etcd_unreachable(c->ec)) {
        dt_etcd_kv *kv = NULL;
        int nk = 0;
        keyf(c, k, "r%d/f/", c->round);
        if (dt_etcd_range(c->ec, k, true, false, false, &kv, &nk, NULL, NULL, NULL) == 0 &&
            nk > 0) {
            dt_rdzv_failure *f = calloc((size_t)nk, sizeof *f);
            int m = 0;
            for (int i = 0; f && i < nk; i++)
                if (dt_rdzv_failure_from_json(kv[i].value, strlen(kv[i].value), &f[m]) == 0)
                    m++;
            dt_etcd_kvs_free(kv, nk);
            if (f && m > 0) {
                dt_rdzv_sort_failures(f, m);
                *out = f;
                *n = m;
                return 0;
            }
            free(f);
        } else if (nk == 0) {
            dt_etcd_kvs_free(kv, nk);
        }
    }
    return dt_rdzv_fail_list_copy(&c->fails, out, n, err);
}

static void stop_hb(etcd_rdzv *c)
{
    if (c->hb_started) {
        atomic_store(&c->hb_stop, true);
        pthread_join(c->hb, NULL);
        c->hb_started = false;
    }
}

static void etcd_kill(void *self)
{
    etcd_rdzv *c = self;
    if (c->killed)
        return;
    stop_hb(c); /* no keepalive: the lease expires after heartbeat_timeout, as for a dead agent */
    c->killed = true;
}

static void etcd_close(void *self)
{
    etcd_rdzv *c = self;
    if (!c)
        return;
    stop_hb(c);
    if (c->ec)
        dt_etcd_set_interrupt(c->ec, NULL, NULL); /* leaving is said even after a signal */
    if (c->ec && c->lease && !c->killed && !dt_etcd_unreachable(c->ec))
        /* this agent's keys go at once, not after a TTL */
        dt_etcd_lease_revoke(c->ec, c->lease, NULL);
    dt_store_server_stop(c->server);
    dt_etcd_free(c->ec);
    dt_rdzv_fail_list_clear(&c->fails);
    free(c->mem);
    pthread_mutex_destroy(&c->hb_mu);
    free(c);
}

const dt_rdzv_ops dt_rdzv_etcd_ops = {
    .name = "etcd",
    .open = etcd_open,
    .next = etcd_next,
    .poll = etcd_poll,
    .succeeded = etcd_succeeded,
    .failed = etcd_failed,
    .abort = etcd_abort,
    .abort_config = etcd_abort_config,
    .failures = etcd_failures,
    .kill = etcd_kill,
    .close = etcd_close,
};
