/* rdzv_c10d_hb.c - see rdzv_c10d_hb.h: the c10d backend's heartbeat thread.
 *
 * Every heartbeat_interval the thread bumps this agent's counters in one multi-set (a/<id> and
 * "pulse" while the agent has not left, plus r<R>/hb/<g> while it is in round R), then, in a
 * round of two or more, reads group rank 0's counter (everyone) or all n counters (rank 0, one
 * multi-get). A counter that has not moved for heartbeat_timeout on this thread's clock
 * declares its node lost: the failures are appended to r<R>/failures and r<R>/end becomes a
 * REGROUP record listing every node silent for more than half the timeout (nodes that went
 * down together are declared in one regroup). The thread has its own store connection, so a
 * main thread blocked in a long call never delays a beat.
 */
#include "rendezvous/rdzv_c10d_hb.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/rdzv_c10d_records.h"
#include "rendezvous/rdzv_common.h"
#include "rendezvous/rdzv_ranks.h"
#include "rendezvous/store.h"

#define KEY_MAX 160
#define HB_STACK (256 * 1024)

typedef struct dt_rdzv_c10d_hb hbeat;

/* hb_* under mu; the thread alone uses hb_ns and the arrays. */
struct dt_rdzv_c10d_hb {
    dt_rdzv_opts o;                /* heartbeat_interval, heartbeat_timeout */
    char id[40];                   /* this agent's node id */
    char alive_key[64];            /* "a/<id>" */
    pthread_t hb_thread;
    bool hb_running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool hb_stop, hb_new;
    int hb_round, hb_g, hb_n;
    char hb_tag[64];
    dt_store *hb_base, *hb_ns;     /* owned */
    int64_t hb_count;
    int64_t *hb_val;               /* hb_n: last counter seen */
    double *hb_seen;               /* hb_n: monotonic time it last changed */
    int hb_cap;
    int hb_declared;               /* round whose loss this thread already declared */
    double hb_gap;                 /* under mu: the longest the thread went without a tick, past
                                      heartbeat_timeout, while beating for a round of 2 or more
                                      nodes (s; 0 = never): this agent was frozen (SIGSTOP, a
                                      hung host) long enough for the others to give it up */
    pthread_mutex_t beat_mu;       /* orders the thread's beats of a/<id> before "left" */
    bool beat_left;                /* under beat_mu: a/<id> is "left", beat it no more */
};

/* Bumps a/<id> and "pulse" (and, when rkey is not NULL, the round's heartbeat key to the same
 * value) in one request; only the round's key once this agent has left. Heartbeat thread only.
 * Returns the store's answer. */
static int beat(hbeat *c, const char *rkey, dt_err *err)
{
    char v[32], pulse[80];
    pthread_mutex_lock(&c->beat_mu);
    snprintf(v, sizeof v, "%lld", (long long)++c->hb_count);
    snprintf(pulse, sizeof pulse, "%s %s", c->id, v);
    const char *k[3];
    const void *vv[3];
    size_t l[3], n = 0;
    if (rkey) {
        k[n] = rkey;
        vv[n] = v;
        l[n++] = strlen(v);
    }
    if (!c->beat_left) {
        k[n] = c->alive_key;
        vv[n] = v;
        l[n++] = strlen(v);
        k[n] = "pulse";
        vv[n] = pulse;
        l[n++] = strlen(pulse);
    }
    int rc = n ? dt_store_multi_set(c->hb_ns, k, vv, l, n, err) : 0;
    pthread_mutex_unlock(&c->beat_mu);
    return rc;
}

void dt_rdzv_c10d_hb_assign(dt_rdzv_c10d_hb *c, int R, int g, int n, const char *tag)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->hb_round = R;
    c->hb_g = g;
    c->hb_n = n;
    dt_strlcpy(c->hb_tag, tag ? tag : "", sizeof c->hb_tag);
    c->hb_new = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

/* Reads the member list of round R (closer tag) into hosts (n entries; "?" when unknown). */
static void read_hosts(dt_store *s, int R, const char *tag, int n, char (*hosts)[64])
{
    char key[KEY_MAX], *v = NULL;
    for (int i = 0; i < n; i++)
        dt_strlcpy(hosts[i], "?", sizeof hosts[i]);
    dt_rdzv_keyf(key, sizeof key, "r%d/m/%s", R, tag);
    if (dt_rdzv_get_str(s, key, &v, 0, NULL) != 0)
        return;
    for (char *line = v, *nl; line && *line; line = nl ? nl + 1 : NULL) {
        nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        int g = -1, k, np;
        char host[64];
        if (sscanf(line, "%d %d %d %63s", &g, &k, &np, host) == 4 && g >= 0 && g < n)
            dt_strlcpy(hosts[g], host, sizeof hosts[g]);
    }
    free(v);
}

/* Declares the nodes in lost[] (group ranks of round R) dead and ends the round. */
static void declare_lost(hbeat *c, dt_store *s, int R, int me, int n, const char *tag,
                         const int *lost, const double *silent, int nl)
{
    char key[KEY_MAX], why[256], *v = NULL, *cur = NULL;
    dt_rdzv_keyf(key, sizeof key, "r%d/end", R);
    if (dt_rdzv_get_str(s, key, &cur, 0, NULL) == 0) {
        free(cur); /* the round is over already: nothing to declare */
        return;
    }
    char (*hosts)[64] = calloc((size_t)n, sizeof *hosts);
    dt_rdzv_failure *f = calloc((size_t)nl, sizeof *f);
    if (!hosts || !f)
        goto out;
    read_hosts(s, R, tag, n, hosts);
    for (int i = 0; i < nl; i++) {
        f[i].time = dt_wall_s();
        dt_strlcpy(f[i].host, hosts[lost[i]], sizeof f[i].host);
        f[i].node = lost[i];
        f[i].rank = f[i].local_rank = -1;
        snprintf(f[i].message, sizeof f[i].message,
                 "node %d (%s) sent no heartbeat for %.1f s (heartbeat_timeout): its agent died, "
                 "hangs or cannot reach the store",
                 lost[i], hosts[lost[i]], silent[i]);
    }
    dt_rdzv_keyf(key, sizeof key, "r%d/failures", R);
    dt_rdzv_append_failures(s, key, f, nl, NULL);
    double lo = silent[0], hi = silent[0];
    for (int i = 1; i < nl; i++) {
        lo = DT_MIN(lo, silent[i]);
        hi = DT_MAX(hi, silent[i]);
    }
    if (nl == 1)
        snprintf(why, sizeof why, "node %d (%s) was lost: no heartbeat for %.1f s", lost[0],
                 hosts[lost[0]], silent[0]);
    else
        snprintf(why, sizeof why, "%d nodes were lost (node %d (%s) and others): no heartbeat for "
                                  "%.1f to %.1f s",
                 nl, lost[0], hosts[lost[0]], lo, hi);
    if (!(v = dt_rdzv_c10d_end_encode(DT_C10D_END_REGROUP, me, 0, n - nl, lost, nl, why))) {
        DT_ERROR("out of memory: cannot declare %d lost node(s) of round %d", nl, R);
        goto out;
    }
    bool won = false;
    dt_rdzv_keyf(key, sizeof key, "r%d/end", R);
    if (dt_rdzv_cas_new(s, key, v, &won, NULL, NULL) == 0 && won) {
        char *l = dt_rdzv_ranks_encode(lost, nl); /* as the record lists them */
        size_t ll = l ? strlen(l) : 0;
        DT_WARN("%s; the others re-rendezvous without %s (lost group ranks: %.*s%s)", why,
                nl == 1 ? "it" : "them", (int)DT_MIN(ll, (size_t)200), l ? l : "?",
                ll > 200 ? "..." : "");
        free(l);
    }
out:
    free(v);
    free(hosts);
    free(f);
}

/* One heartbeat: bump this node's counter, then check group rank 0's (everyone) or all (rank
 * 0). fresh: the round changed, so the watch starts over on this clock. */
static void hb_tick(hbeat *c, int R, int g, int n, const char *tag, bool fresh)
{
    char key[KEY_MAX];
    double now = dt_now_s();
    if (fresh || c->hb_cap < n) {
        if (c->hb_cap < n) {
            int64_t *val = realloc(c->hb_val, sizeof *val * (size_t)n);
            if (val)
                c->hb_val = val;
            double *seen = realloc(c->hb_seen, sizeof *seen * (size_t)n);
            if (seen)
                c->hb_seen = seen;
            if (!val || !seen)
                return;
            c->hb_cap = n;
        }
        for (int i = 0; i < n; i++) {
            c->hb_val[i] = -1;
            c->hb_seen[i] = now;
        }
    }
    dt_rdzv_keyf(key, sizeof key, "r%d/hb/%d", R, g);
    dt_err e = {0};
    if (beat(c, key, &e)) {
        DT_DEBUG("heartbeat: %s", e.msg);
        return;
    }
    if (n < 2 || c->hb_declared == R)
        return;
    int cnt = g == 0 ? n : 1; /* rank 0 watches all; the others watch rank 0 */
    char (*keys)[32] = calloc((size_t)cnt, sizeof *keys);
    const char **kp = calloc((size_t)cnt, sizeof *kp);
    void **vals = calloc((size_t)cnt, sizeof *vals);
    size_t *lens = calloc((size_t)cnt, sizeof *lens);
    int *lost = calloc((size_t)cnt, sizeof *lost);
    double *silent = calloc((size_t)cnt, sizeof *silent);
    int nl = 0;
    if (!keys || !kp || !vals || !lens || !lost || !silent)
        goto out;
    for (int i = 0; i < cnt; i++) {
        snprintf(keys[i], sizeof keys[i], "r%d/hb/%d", R, i);
        kp[i] = keys[i];
    }
    if (dt_store_multi_get(c->hb_ns, kp, (size_t)cnt, vals, lens, 0, NULL) != 0)
        goto out; /* missing keys: the closer writes them all, so the round is being replaced */
    /* Once one node is past heartbeat_timeout, every node silent for more than half of it is
     * declared with it: nodes that went down together (a rack, a switch) stopped beating within
     * about an interval of each other, and declaring them one regroup at a time would leave the
     * next round waiting for the rest. A live node beats every interval. */
    now = dt_now_s();
    bool past = false;
    for (int i = 0; i < cnt; i++) {
        int who = i;
        int64_t val = atoll(vals[i]);
        free(vals[i]);
        if (who == g)
            continue;
        if (val != c->hb_val[who]) {
            c->hb_val[who] = val;
            c->hb_seen[who] = now;
        } else if (now - c->hb_seen[who] > c->o.heartbeat_timeout / 2) {
            past |= now - c->hb_seen[who] > c->o.heartbeat_timeout;
            lost[nl] = who;
            silent[nl++] = now - c->hb_seen[who];
        }
    }
    if (past) {
        c->hb_declared = R;
        declare_lost(c, c->hb_ns, R, g, n, tag, lost, silent, nl);
    }
out:
    free(keys);
    free(kp);
    free(vals);
    free(lens);
    free(lost);
    free(silent);
}

static void *hb_main(void *arg)
{
    hbeat *c = arg;
    double last = dt_now_s();
    pthread_mutex_lock(&c->mu);
    while (!c->hb_stop) {
        int R = c->hb_round, g = c->hb_g, n = c->hb_n;
        double now = dt_now_s();
        if (R >= 0 && n >= 2 && now - last > c->o.heartbeat_timeout && now - last > c->hb_gap)
            c->hb_gap = now - last;
        last = now;
        char tag[64];
        bool fresh = c->hb_new;
        dt_strlcpy(tag, c->hb_tag, sizeof tag);
        c->hb_new = false;
        pthread_mutex_unlock(&c->mu);
        if (R >= 0)
            hb_tick(c, R, g, n, tag, fresh);
        else if (beat(c, NULL, NULL))
            DT_DEBUG("heartbeat: the store does not answer");
        pthread_mutex_lock(&c->mu);
        if (c->hb_stop || c->hb_new)
            continue;
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        double t = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9 + c->o.heartbeat_interval;
        ts.tv_sec = (time_t)t;
        ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
        while (!c->hb_stop && !c->hb_new &&
               pthread_cond_timedwait(&c->cv, &c->mu, &ts) == 0)
            ;
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

void dt_rdzv_c10d_hb_stop(dt_rdzv_c10d_hb *c)
{
    if (!c || !c->hb_running)
        return;
    pthread_mutex_lock(&c->mu);
    c->hb_stop = true;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
    pthread_join(c->hb_thread, NULL);
    c->hb_running = false;
}

int dt_rdzv_c10d_hb_start(dt_rdzv_c10d_hb **out, const dt_rdzv_opts *o, const char *host,
                          int port, const char *prefix, const char *id, dt_err *err)
{
    int rc;
    *out = NULL;
    hbeat *c = calloc(1, sizeof *c);
    if (!c)
        return dt_err_set(err, -ENOMEM, "out of memory");
    c->o = *o;
    dt_strlcpy(c->id, id, sizeof c->id);
    snprintf(c->alive_key, sizeof c->alive_key, "a/%s", id);
    c->hb_round = -1;
    c->hb_declared = -1;
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->beat_mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->cv, &ca);
    pthread_condattr_destroy(&ca);
    if ((rc = dt_rdzv_connect_store(&c->hb_base, o, host, port, err)) ||
        (rc = dt_store_prefixed(&c->hb_ns, c->hb_base, prefix, err)))
        goto fail;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, HB_STACK);
    rc = pthread_create(&c->hb_thread, &at, hb_main, c);
    pthread_attr_destroy(&at);
    if (rc) {
        rc = dt_err_set(err, -rc, "cannot start the heartbeat thread: %s", strerror(rc));
        goto fail;
    }
    c->hb_running = true;
    *out = c;
    return 0;
fail:
    dt_rdzv_c10d_hb_free(c);
    return rc;
}

/* a/<id> = "left" and l/<id> = "1" in one request. */
static int write_left(dt_store *ns, const char *id, dt_err *err)
{
    char ak[64], lk[64];
    snprintf(ak, sizeof ak, "a/%s", id);
    snprintf(lk, sizeof lk, "l/%s", id);
    const char *k[2] = {ak, lk};
    const void *v[2] = {"left", "1"};
    size_t l[2] = {4, 1};
    return dt_store_multi_set(ns, k, v, l, 2, err);
}

int dt_rdzv_c10d_hb_leave(dt_rdzv_c10d_hb *c, dt_store *ns, const char *id, dt_err *err)
{
    if (!c)
        return write_left(ns, id, err);
    pthread_mutex_lock(&c->beat_mu);
    c->beat_left = true;
    int rc = write_left(ns, id, err);
    pthread_mutex_unlock(&c->beat_mu);
    return rc;
}

double dt_rdzv_c10d_hb_gap(dt_rdzv_c10d_hb *c)
{
    if (!c)
        return 0;
    pthread_mutex_lock(&c->mu);
    double gap = c->hb_gap;
    pthread_mutex_unlock(&c->mu);
    return gap;
}

void dt_rdzv_c10d_hb_free(dt_rdzv_c10d_hb *c)
{
    if (!c)
        return;
    dt_rdzv_c10d_hb_stop(c);
    dt_store_free(c->hb_ns);
    dt_store_free(c->hb_base);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->beat_mu);
    pthread_cond_destroy(&c->cv);
    free(c->hb_val);
    free(c->hb_seen);
    free(c);
}
