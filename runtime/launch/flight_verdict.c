/* flight_verdict.c - the hang verdict from every rank's flight records: see flight_verdict.h.
 *
 * The JSON is read once into plain arrays (ranks by global rank, groups by uid, each rank's
 * records in issue order), then each group is walked by sequence number. Worlds of thousands of
 * ranks cost O(ranks x records kept) here, once per verdict.
 */
#include "runtime/launch/flight_verdict.h"

#include <cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

/* ---- the input, as plain arrays ---------------------------------------------------------- */

enum { ST_QUEUED = 1, ST_STARTED, ST_DONE, ST_FAILED };

typedef struct vrec {
    int g;               /* index into V.groups */
    uint64_t seq;
    const char *op, *dtype;
    double count;
    int peer;
    int state;
    int step;
    const char *phase;
    double t_issue;
    bool p2p, send;
} vrec;

typedef struct vrank {
    bool present;
    int rank, node, pid;
    const char *host, *state, *wchan, *exit, *error;
    bool alive;
    int64_t step;
    int micro;
    const char *phase;
    double phase_since;
    vrec *r;
    int nr;
} vrank;

typedef struct vgroup {
    const char *uid, *label;
    int size;
    int *members; /* size of them, -1 where not known */
} vgroup;

typedef struct vnode {
    int node, rank_base, nproc, pid;
    const char *host;
    bool answered;
} vnode;

typedef struct vin {
    double now;
    int world;
    const char *kind, *reason;
    vrank *ranks;  /* world of them */
    vgroup *groups;
    int ngroups;
    vnode *nodes;
    int nnodes;
} vin;

static double num(const cJSON *o, const char *k, double def)
{
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(x) ? x->valuedouble : def;
}

static const char *str(const cJSON *o, const char *k)
{
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, k));
    return s ? s : "";
}

static int state_of(const char *s)
{
    return !strcmp(s, "queued")    ? ST_QUEUED
           : !strcmp(s, "started") ? ST_STARTED
           : !strcmp(s, "done")    ? ST_DONE
           : !strcmp(s, "failed")  ? ST_FAILED
                                   : 0;
}

static int group_of(vin *V, const char *uid)
{
    for (int i = 0; i < V->ngroups; i++)
        if (!strcmp(V->groups[i].uid, uid))
            return i;
    return -1;
}

static void vin_free(vin *V)
{
    if (V->ranks)
        for (int r = 0; r < V->world; r++)
            free(V->ranks[r].r);
    for (int i = 0; i < V->ngroups; i++)
        free(V->groups[i].members);
    free(V->ranks);
    free(V->groups);
    free(V->nodes);
}

static int vin_read(vin *V, const cJSON *in, dt_err *err)
{
    memset(V, 0, sizeof *V);
    if (!cJSON_IsObject(in))
        return dt_err_set(err, -EINVAL, "hang verdict: the input is not a JSON object");
    V->now = num(in, "time", 0);
    V->world = (int)num(in, "world_size", 0);
    const cJSON *trig = cJSON_GetObjectItemCaseSensitive(in, "trigger");
    V->kind = str(trig, "kind");
    V->reason = str(trig, "reason");
    const cJSON *ranks = cJSON_GetObjectItemCaseSensitive(in, "ranks"), *ro;
    const cJSON *nodes = cJSON_GetObjectItemCaseSensitive(in, "nodes"), *no;
    cJSON_ArrayForEach(ro, ranks)
    {
        int r = (int)num(ro, "rank", -1);
        if (r + 1 > V->world)
            V->world = r + 1;
        if (num(ro, "time", 0) > V->now)
            V->now = num(ro, "time", 0);
    }
    if (V->world < 1 || V->world > 10000000)
        return dt_err_set(err, -EINVAL, "hang verdict: no ranks (world size %d)", V->world);
    int nn = cJSON_GetArraySize(nodes);
    V->ranks = calloc((size_t)V->world, sizeof *V->ranks);
    V->nodes = calloc((size_t)(nn > 0 ? nn : 1), sizeof *V->nodes);
    int ng_cap = 8;
    V->groups = calloc((size_t)ng_cap, sizeof *V->groups);
    if (!V->ranks || !V->nodes || !V->groups)
        goto oom;
    cJSON_ArrayForEach(no, nodes)
    {
        vnode *n = &V->nodes[V->nnodes++];
        n->node = (int)num(no, "node", -1);
        n->rank_base = (int)num(no, "rank_base", -1);
        n->nproc = (int)num(no, "nproc", 0);
        n->pid = (int)num(no, "pid", 0);
        n->host = str(no, "host");
        n->answered = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(no, "answered"));
    }
    for (int r = 0; r < V->world; r++) {
        V->ranks[r].rank = r;
        V->ranks[r].node = -1;
        V->ranks[r].host = "";
        for (int i = 0; i < V->nnodes; i++)
            if (r >= V->nodes[i].rank_base && r < V->nodes[i].rank_base + V->nodes[i].nproc) {
                V->ranks[r].node = V->nodes[i].node;
                V->ranks[r].host = V->nodes[i].host;
            }
    }
    cJSON_ArrayForEach(ro, ranks)
    {
        int rk = (int)num(ro, "rank", -1);
        if (rk < 0)
            continue;
        vrank *R = &V->ranks[rk];
        R->present = true;
        R->node = (int)num(ro, "node", R->node);
        R->host = str(ro, "host");
        R->pid = (int)num(ro, "pid", 0);
        R->alive = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(ro, "alive"));
        R->state = str(ro, "state");
        R->wchan = str(ro, "wchan");
        R->exit = str(ro, "exit");
        R->error = str(ro, "error");
        const cJSON *pos = cJSON_GetObjectItemCaseSensitive(ro, "position");
        R->step = (int64_t)num(pos, "step", 0);
        R->micro = (int)num(pos, "micro", -1);
        R->phase = str(pos, "phase");
        R->phase_since = num(pos, "phase_since", 0);
        /* this rank's groups: local index -> global */
        int local[64];
        for (int i = 0; i < 64; i++)
            local[i] = -1;
        const cJSON *go;
        cJSON_ArrayForEach(go, cJSON_GetObjectItemCaseSensitive(ro, "groups"))
        {
            int li = (int)num(go, "index", -1);
            const char *uid = str(go, "uid");
            int g = group_of(V, uid);
            if (g < 0) {
                if (V->ngroups == ng_cap) {
                    vgroup *p = realloc(V->groups, 2 * (size_t)ng_cap * sizeof *p);
                    if (!p)
                        goto oom;
                    V->groups = p;
                    ng_cap *= 2;
                }
                g = V->ngroups++;
                vgroup *G = &V->groups[g];
                memset(G, 0, sizeof *G);
                G->uid = uid;
                G->label = str(go, "label");
                G->size = (int)num(go, "size", 1);
                if (G->size < 1 || G->size > V->world)
                    G->size = V->world;
                if (!(G->members = malloc((size_t)G->size * sizeof *G->members)))
                    goto oom;
                for (int i = 0; i < G->size; i++)
                    G->members[i] = -1;
            }
            vgroup *G = &V->groups[g];
            const cJSON *mem = cJSON_GetObjectItemCaseSensitive(go, "members");
            int nm = cJSON_GetArraySize(mem);
            for (int i = 0; i < nm && i < G->size; i++)
                G->members[i] = (int)cJSON_GetNumberValue(cJSON_GetArrayItem(mem, i));
            if (nm == 0 && !strcmp(G->label, "world")) /* a world: rank i is global rank i */
                for (int i = 0; i < G->size; i++)
                    G->members[i] = i;
            int grank = (int)num(go, "rank", -1);
            if (grank >= 0 && grank < G->size)
                G->members[grank] = rk;
            if (li >= 0 && li < 64)
                local[li] = g;
        }
        const cJSON *recs = cJSON_GetObjectItemCaseSensitive(ro, "records"), *x;
        int n = cJSON_GetArraySize(recs);
        if (n > 0 && !(R->r = calloc((size_t)n, sizeof *R->r)))
            goto oom;
        cJSON_ArrayForEach(x, recs)
        {
            int li = (int)num(x, "group", -1);
            if (li < 0 || li >= 64 || local[li] < 0)
                continue;
            vrec *v = &R->r[R->nr++];
            v->g = local[li];
            v->seq = (uint64_t)num(x, "seq", 0);
            v->op = str(x, "op");
            v->dtype = str(x, "dtype");
            v->count = num(x, "count", 0);
            v->peer = (int)num(x, "peer", -1);
            v->state = state_of(str(x, "state"));
            v->step = (int)num(x, "step", 0);
            v->phase = str(x, "phase");
            v->t_issue = num(x, "t_issue", 0);
            v->send = !strcmp(v->op, "send");
            v->p2p = v->send || !strcmp(v->op, "recv");
        }
    }
    return 0;
oom:
    vin_free(V);
    return dt_err_set(err, -ENOMEM, "hang verdict: out of memory");
}

/* ---- text helpers ---------------------------------------------------------------------------- */

/* snprintf that may cut (a sentence longer than its buffer is cut, not an error); through
 * vsnprintf so that the compiler's truncation guesses stay quiet. */
static int put(char *dst, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static int put(char *dst, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(dst, cap, f, ap);
    va_end(ap);
    /* the bytes written: an offset to go on from */
    return n < 0 ? 0 : (size_t)n < cap ? n : (int)cap - 1;
}

typedef struct sb {
    char *p;
    size_t n, cap;
} sb;

static void sb_add(sb *b, const char *f, ...) __attribute__((format(printf, 2, 3)));
static void sb_add(sb *b, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int k = vsnprintf(NULL, 0, f, ap);
    va_end(ap);
    if (k < 0)
        return;
    if (b->n + (size_t)k + 1 > b->cap) {
        size_t cap = 2 * (b->n + (size_t)k + 1) + 256;
        char *p = realloc(b->p, cap);
        if (!p)
            return;
        b->p = p;
        b->cap = cap;
    }
    va_start(ap, f);
    vsnprintf(b->p + b->n, b->cap - b->n, f, ap);
    va_end(ap);
    b->n += (size_t)k;
}

static double age(const vin *V, double t)
{
    return t > 0 && V->now >= t ? V->now - t : 0;
}

/* "rank 3 (node 1)" */
static void who(const vin *V, int r, char *buf, size_t cap)
{
    const vrank *R = &V->ranks[r];
    if (R->node >= 0)
        put(buf, cap, "rank %d (node %d)", r, R->node);
    else
        put(buf, cap, "rank %d", r);
}

/* "allreduce #57 of group world" */
static void call_name(const vin *V, const vrec *x, char *buf, size_t cap)
{
    put(buf, cap, "%s #%llu of group %s", x->op, (unsigned long long)x->seq,
             V->groups[x->g].label);
}

/* "float32 x 4096" */
static void sig(const vrec *x, char *buf, size_t cap)
{
    put(buf, cap, "%s x %.0f", x->dtype, x->count);
}

static bool same_sig(const vrec *a, const vrec *b)
{
    return !strcmp(a->op, b->op) && !strcmp(a->dtype, b->dtype) && a->count == b->count;
}

/* ranks' list: "rank 1", "ranks 0, 2, 5", "ranks 0, 1, 2, ... (40 ranks)" */
static void rank_list(const int *r, int n, char *buf, size_t cap)
{
    size_t k = (size_t)put(buf, cap, "%s", n == 1 ? "rank " : "ranks ");
    for (int i = 0; i < n && i < 8 && k < cap; i++)
        k += (size_t)snprintf(buf + k, cap - k, "%s%d", i ? ", " : "", r[i]);
    if (n > 8 && k + 1 < cap)
        snprintf(buf + k, cap - k, ", ... (%d ranks)", n);
}

/* ---- the walk ---------------------------------------------------------------------------- */

enum { C_NONE, C_MISMATCH, C_MISSING, C_P2P_MISMATCH, C_P2P_MISSING };

typedef struct cand {
    int type;
    int g;
    uint64_t k;
    double t;          /* earliest issue of the disagreeing calls */
    const vrec *ex;    /* an entered call (MISSING), one side (MISMATCH, P2P) */
    const vrec *other; /* P2P_MISMATCH: the other side */
    int ex_rank, other_rank;
} cand;

/* Rank R's call of group g with seq k (collectives or, p2p, of that peer and direction). */
static const vrec *find(const vrank *R, int g, uint64_t k, int p2p, int peer, bool send)
{
    for (int i = R->nr - 1; i >= 0; i--) {
        const vrec *x = &R->r[i];
        if (x->g != g || x->seq != k || x->p2p != (p2p != 0))
            continue;
        if (p2p && (x->peer != peer || x->send != send))
            continue;
        return x;
    }
    return NULL;
}

/* The lowest and highest seq rank R holds of group g (collectives, or p2p with peer/direction). */
static void range(const vrank *R, int g, int p2p, int peer, bool send, uint64_t *lo,
                  uint64_t *hi)
{
    *lo = UINT64_MAX;
    *hi = 0;
    for (int i = 0; i < R->nr; i++) {
        const vrec *x = &R->r[i];
        if (x->g != g || x->p2p != (p2p != 0) || (p2p && (x->peer != peer || x->send != send)))
            continue;
        if (x->seq < *lo)
            *lo = x->seq;
        if (x->seq > *hi)
            *hi = x->seq;
    }
}

static void better(cand *best, const cand *c)
{
    bool cm = c->type == C_MISMATCH || c->type == C_P2P_MISMATCH;
    bool bm = best->type == C_MISMATCH || best->type == C_P2P_MISMATCH;
    if (best->type == C_NONE || (cm && !bm) || (cm == bm && c->t < best->t))
        *best = *c;
}

static void walk_collectives(const vin *V, int g, cand *best)
{
    const vgroup *G = &V->groups[g];
    if (G->size < 2)
        return;
    uint64_t lo = 1, hi = 0;
    for (int i = 0; i < G->size; i++) {
        int m = G->members[i];
        if (m < 0 || !V->ranks[m].present)
            continue;
        uint64_t a, b;
        range(&V->ranks[m], g, 0, 0, false, &a, &b);
        if (a != UINT64_MAX && a > lo)
            lo = a;
        if (b > hi)
            hi = b;
    }
    for (uint64_t k = lo; k <= hi; k++) {
        const vrec *first = NULL;
        int first_rank = -1;
        bool differ = false, missing = false, pending = false, failed = false;
        double t = 0;
        const vrec *diff = NULL;
        int diff_rank = -1;
        for (int i = 0; i < G->size; i++) {
            int m = G->members[i];
            if (m < 0)
                continue; /* a member no rank named (groups over 64 ranks): no evidence */
            const vrank *R = &V->ranks[m];
            const vrec *x = R->present ? find(R, g, k, 0, 0, false) : NULL;
            if (!x) {
                uint64_t a, b;
                if (R->present)
                    range(R, g, 0, 0, false, &a, &b);
                if (!R->present || b < k)
                    missing = true; /* else a gap (a torn record): not evidence */
                continue;
            }
            if (!first) {
                first = x;
                first_rank = m;
                t = x->t_issue;
            } else if (!same_sig(first, x) && !differ) {
                differ = true;
                diff = x;
                diff_rank = m;
            }
            if (x->t_issue > 0 && (t == 0 || x->t_issue < t))
                t = x->t_issue;
            pending = pending || x->state != ST_DONE;
            failed = failed || x->state == ST_FAILED;
        }
        if (!first)
            continue;
        if (differ) {
            cand c = {C_MISMATCH, g, k, t, first, diff, first_rank, diff_rank};
            better(best, &c);
            return;
        }
        if (missing && pending && (failed || age(V, t) >= DT_VERDICT_MIN_WAIT_S)) {
            cand c = {C_MISSING, g, k, t, first, NULL, first_rank, -1};
            better(best, &c);
            return;
        }
    }
}

static void walk_p2p(const vin *V, int g, cand *best)
{
    for (int r = 0; r < V->world; r++) {
        const vrank *R = &V->ranks[r];
        if (!R->present)
            continue;
        for (int i = 0; i < R->nr; i++) {
            const vrec *x = &R->r[i];
            if (x->g != g || !x->p2p || x->peer < 0 || x->peer >= V->world)
                continue;
            const vrank *P = &V->ranks[x->peer];
            const vrec *y = P->present ? find(P, g, x->seq, 1, r, !x->send) : NULL;
            if (y) {
                if (x->send && (strcmp(x->dtype, y->dtype) || x->count != y->count)) {
                    cand c = {C_P2P_MISMATCH, g, x->seq, DT_MIN(x->t_issue, y->t_issue), x, y,
                              r, x->peer};
                    better(best, &c);
                }
                continue;
            }
            if (x->state == ST_DONE ||
                (x->state != ST_FAILED && age(V, x->t_issue) < DT_VERDICT_MIN_WAIT_S))
                continue;
            uint64_t a = 0, b = 0;
            if (P->present) {
                range(P, g, 1, r, !x->send, &a, &b);
                if (a != UINT64_MAX && a > x->seq)
                    continue; /* the peer's record of it was trimmed */
                if (b >= x->seq)
                    continue;
            }
            cand c = {C_P2P_MISSING, g, x->seq, x->t_issue, x, NULL, r, x->peer};
            better(best, &c);
        }
    }
}

/* ---- culprits ------------------------------------------------------------------------------- */

static const vnode *node_of(const vin *V, int node)
{
    for (int i = 0; i < V->nnodes; i++)
        if (V->nodes[i].node == node)
            return &V->nodes[i];
    return NULL;
}

/* The call rank R waits in on another group than g (newest pending), or NULL. */
static const vrec *waits_elsewhere(const vrank *R, int g)
{
    for (int i = R->nr - 1; i >= 0; i--) {
        const vrec *x = &R->r[i];
        if (x->g != g && (x->state == ST_QUEUED || x->state == ST_STARTED))
            return x;
    }
    return NULL;
}

enum { K_NEVER, K_STOPPED, K_GONE, K_LOST, K_UNKNOWN };

/* How culprit r is described: *kind and one phrase (without "rank r"). */
static int describe(const vin *V, int r, int g, char *buf, size_t cap)
{
    const vrank *R = &V->ranks[r];
    if (!R->present) {
        const vnode *n = node_of(V, R->node);
        if (R->node >= 0 && (!n || !n->answered)) {
            put(buf, cap, "is lost with node %d%s%s: its agent did not answer", R->node,
                     n && n->host[0] ? " on " : "", n ? n->host : "");
            return K_LOST;
        }
        put(buf, cap, "has no flight records (its node did not say why)");
        return K_UNKNOWN;
    }
    if (!R->alive || !strcmp(R->state, "Z") || !strcmp(R->state, "X")) {
        put(buf, cap, "is gone (its process %s%s%s)", R->exit[0] ? R->exit : "exited",
                 R->error[0] ? ": " : "", R->error);
        return K_GONE;
    }
    char where[160];
    snprintf(where, sizeof where, "step %lld, phase %s", (long long)R->step,
             R->phase[0] ? R->phase : "?");
    if (!strcmp(R->state, "T") || !strcmp(R->state, "t")) {
        put(buf, cap, "stopped (process state %s) since %s (%.1f s)", R->state, where,
                 age(V, R->phase_since));
        return K_STOPPED;
    }
    size_t k = (size_t)put(buf, cap, "is in %s since %.1f s, process state %s%s%s%s", where,
                                age(V, R->phase_since), R->state[0] ? R->state : "?",
                                R->wchan[0] ? " (" : "", R->wchan, R->wchan[0] ? ")" : "");
    const vrec *w = waits_elsewhere(R, g);
    if (w && k < cap) {
        char cn[160], sg[64];
        call_name(V, w, cn, sizeof cn);
        sig(w, sg, sizeof sg);
        snprintf(buf + k, cap - k, "; it waits in %s (%s, issued %.1f s ago)", cn, sg,
                 age(V, w->t_issue));
    }
    return K_NEVER;
}

static void add_culprit(dt_verdict *v, const vin *V, int r, int node, double since,
                        const char *what)
{
    for (int i = 0; i < v->n; i++)
        if (v->c[i].rank == r && (r >= 0 || v->c[i].node == node))
            return;
    if (v->n >= DT_VERDICT_CULPRITS)
        return;
    dt_verdict_culprit *c = &v->c[v->n++];
    memset(c, 0, sizeof *c);
    c->rank = r;
    c->node = r >= 0 ? V->ranks[r].node : node;
    const vnode *n = node_of(V, c->node);
    dt_strlcpy(c->host, r >= 0 && V->ranks[r].host[0] ? V->ranks[r].host : n ? n->host : "",
               sizeof c->host);
    c->pid = r >= 0 ? V->ranks[r].pid : 0;
    c->since = since;
    dt_strlcpy(c->what, what, sizeof c->what);
}

static const char *kind_cause(int kind)
{
    switch (kind) {
    case K_STOPPED:
        return "stopped";
    case K_GONE:
        return "gone";
    case K_LOST:
        return "node_lost";
    default:
        return "never_entered";
    }
}

/* Collective MISSING: the members that did not enter c->k, and the ones that wait in it. */
static void verdict_missing(dt_verdict *v, const vin *V, const cand *c, sb *lines)
{
    const vgroup *G = &V->groups[c->g];
    int *culp = malloc(sizeof(int) * (size_t)G->size), *wait = malloc(sizeof(int) * (size_t)G->size);
    int nc = 0, nw = 0;
    if (!culp || !wait) {
        free(culp);
        free(wait);
        return;
    }
    for (int i = 0; i < G->size; i++) {
        int m = G->members[i];
        if (m < 0)
            continue;
        const vrank *R = &V->ranks[m];
        if (R->present && find(R, c->g, c->k, 0, 0, false))
            wait[nw++] = m;
        else
            culp[nc++] = m;
    }
    char cn[160], sg[64], w[64], what[512], wl[128];
    call_name(V, c->ex, cn, sizeof cn);
    sig(c->ex, sg, sizeof sg);
    int first_kind = -1;
    for (int i = 0; i < nc; i++) {
        char d[400];
        int kind = describe(V, culp[i], c->g, d, sizeof d);
        if (first_kind < 0)
            first_kind = kind;
        who(V, culp[i], w, sizeof w);
        if (kind == K_NEVER)
            put(what, sizeof what, "%s never entered %s (%s): it %s", w, cn, sg, d);
        else
            put(what, sizeof what, "%s %s", w, d);
        double since = V->ranks[culp[i]].phase_since;
        if (since <= 0 || (c->t > 0 && c->t < since))
            since = c->t;
        add_culprit(v, V, culp[i], V->ranks[culp[i]].node, since - 0.001, what);
        if (i > 0)
            sb_add(lines, "%s\n", what);
    }
    rank_list(wait, nw, wl, sizeof wl);
    const char *lead = v->n ? v->c[0].what : "";
    if (nc > 1)
        put(v->summary, sizeof v->summary, "%s (and %d more rank%s); %s wait%s in %s", lead,
                 nc - 1, nc == 2 ? "" : "s", nw == G->size - nc ? "all others" : wl,
                 nw == 1 && nw != G->size - nc ? "s" : "", cn);
    else
        put(v->summary, sizeof v->summary, "%s; %s wait%s in %s (%s, for %.1f s)", lead,
                 nw == G->size - nc ? "all others" : wl,
                 nw == 1 && nw != G->size - nc ? "s" : "", cn, sg, age(V, c->t));
    dt_strlcpy(v->cause, kind_cause(first_kind), sizeof v->cause);
    free(culp);
    free(wait);
}

/* Whether rank b's calls of group g from k on are rank a's from k+1 on (b skipped a's #k). */
static bool shifted(const vin *V, int g, uint64_t k, int a, int b)
{
    int compared = 0;
    for (uint64_t j = 0; j < 4; j++) {
        const vrec *xb = find(&V->ranks[b], g, k + j, 0, 0, false);
        const vrec *xa = find(&V->ranks[a], g, k + 1 + j, 0, 0, false);
        if (!xb || !xa)
            break;
        if (!same_sig(xa, xb))
            return false;
        compared++;
    }
    return compared > 0;
}

/* Rank r's call at #k of group g against its own calls of the step before: the call at the same
 * place in that step (NULL when there is none). A rank that skipped a call has, at #k, what came
 * next in its last step. */
static const vrec *same_place_before(const vin *V, int g, uint64_t k, int r, int shift)
{
    const vrank *R = &V->ranks[r];
    const vrec *x = find(R, g, k, 0, 0, false);
    if (!x || x->step < 2)
        return NULL;
    int place = 0; /* x's place among r's calls of its step on g */
    for (int i = 0; i < R->nr; i++)
        if (R->r[i].g == g && !R->r[i].p2p && R->r[i].step == x->step && R->r[i].seq < k)
            place++;
    int at = 0;
    for (int i = 0; i < R->nr; i++) {
        const vrec *y = &R->r[i];
        if (y->g == g && !y->p2p && y->step == x->step - 1 && at++ == place + shift)
            return y;
    }
    return NULL;
}

/* Whether rank r's #k is what its own last step had one place later (it skipped a call). */
static bool skipped_by_pattern(const vin *V, int g, uint64_t k, int r)
{
    const vrec *x = find(&V->ranks[r], g, k, 0, 0, false);
    const vrec *same = same_place_before(V, g, k, r, 0), *next = same_place_before(V, g, k, r, 1);
    return x && same && next && !same_sig(same, x) && same_sig(next, x);
}

static void verdict_mismatch(dt_verdict *v, const vin *V, const cand *c, sb *lines)
{
    const vgroup *G = &V->groups[c->g];
    const vrec *A = c->ex;
    char cn[160], w[64], sa[64], what[512];
    snprintf(cn, sizeof cn, "#%llu of group %s", (unsigned long long)c->k, G->label);
    /* the two sides: the members whose call matches the first one seen, and the others */
    int *side = calloc((size_t)G->size, sizeof *side), na = 0, nb = 0, ra[8], rb[8];
    if (!side)
        return;
    for (int i = 0; i < G->size; i++) {
        int m = G->members[i];
        const vrec *x = m >= 0 && V->ranks[m].present ? find(&V->ranks[m], c->g, c->k, 0, 0, false)
                                                      : NULL;
        side[i] = !x ? 0 : same_sig(A, x) ? 1 : 2;
        if (side[i] == 1 && na < 8)
            ra[na++] = m;
        else if (side[i] == 2 && nb < 8)
            rb[nb++] = m;
    }
    sb desc = {0};
    for (int s = 1; s <= 2; s++) {
        bool firstone = true;
        for (int i = 0; i < G->size; i++) {
            if (side[i] != s)
                continue;
            int m = G->members[i];
            const vrec *x = find(&V->ranks[m], c->g, c->k, 0, 0, false);
            sig(x, sa, sizeof sa);
            who(V, m, w, sizeof w);
            if (firstone)
                sb_add(&desc, "%s%s %s %s (step %d, phase %s)", s == 2 ? "; " : "", w, x->op, sa,
                       x->step, x->phase);
            firstone = false;
        }
    }
    /* which side skipped: its calls from #k are the other side's from #k+1 */
    bool bskip = nb > 0 && na > 0 && shifted(V, c->g, c->k, ra[0], rb[0]);
    bool askip = nb > 0 && na > 0 && shifted(V, c->g, c->k, rb[0], ra[0]);
    bool by_pattern = false;
    if (!bskip && !askip && nb > 0 && na > 0) { /* the others stopped at #k: each side's steps */
        by_pattern = true;
        bskip = skipped_by_pattern(V, c->g, c->k, rb[0]);
        askip = skipped_by_pattern(V, c->g, c->k, ra[0]);
    }
    if (bskip != askip) {
        int *sk = bskip ? rb : ra, nsk = bskip ? nb : na;
        const vrec *missed = find(&V->ranks[bskip ? ra[0] : rb[0]], c->g, c->k, 0, 0, false);
        const vrec *theirs = find(&V->ranks[sk[0]], c->g, c->k, 0, 0, false);
        char sm[64], st[64];
        sig(missed, sm, sizeof sm);
        sig(theirs, st, sizeof st);
        for (int i = 0; i < nsk; i++) {
            who(V, sk[i], w, sizeof w);
            if (by_pattern)
                put(what, sizeof what, "%s skipped %s %s (%s, issued by the others in step %d, "
                    "phase %s): it entered #%llu as %s %s, the call that came next in its step "
                    "%d", w, missed->op, cn, sm, missed->step, missed->phase,
                    (unsigned long long)c->k, theirs->op, st, theirs->step - 1);
            else
                put(what, sizeof what, "%s skipped %s %s (%s, issued by the others in step %d, "
                    "phase %s): its #%llu is their #%llu (%s %s)", w, missed->op, cn, sm,
                    missed->step, missed->phase, (unsigned long long)c->k,
                    (unsigned long long)c->k + 1, theirs->op, st);
            add_culprit(v, V, sk[i], V->ranks[sk[i]].node, c->t - 0.001, what);
        }
        dt_strlcpy(v->cause, "skipped", sizeof v->cause);
        put(v->summary, sizeof v->summary, "%s", v->c[0].what);
        sb_add(lines, "the calls at %s: %s\n", cn, desc.p ? desc.p : "");
    } else {
        /* the smaller side is the odd one out; both when even */
        bool both = na == nb;
        for (int s = 1; s <= 2; s++) {
            if (!both && (s == 1) != (na < nb))
                continue;
            int *rs = s == 1 ? ra : rb, ns = s == 1 ? na : nb;
            for (int i = 0; i < ns; i++) {
                const vrec *x = find(&V->ranks[rs[i]], c->g, c->k, 0, 0, false);
                sig(x, sa, sizeof sa);
                who(V, rs[i], w, sizeof w);
                put(what, sizeof what, "%s entered %s as %s %s, unlike the others", w, cn,
                         x->op, sa);
                add_culprit(v, V, rs[i], V->ranks[rs[i]].node, c->t - 0.001, what);
            }
        }
        dt_strlcpy(v->cause, "mismatch", sizeof v->cause);
        put(v->summary, sizeof v->summary, "ranks disagree at %s: %s", cn,
                 desc.p ? desc.p : "");
    }
    free(desc.p);
    free(side);
}

static void verdict_p2p(dt_verdict *v, const vin *V, const cand *c, sb *lines)
{
    const char *label = V->groups[c->g].label;
    char w1[64], w2[64], s1[64], s2[64], what[512];
    (void)lines;
    if (c->type == C_P2P_MISMATCH) {
        const vrec *snd = c->ex->send ? c->ex : c->other, *rcv = c->ex->send ? c->other : c->ex;
        int rs = c->ex->send ? c->ex_rank : c->other_rank, rr = c->ex->send ? c->other_rank
                                                                           : c->ex_rank;
        who(V, rs, w1, sizeof w1);
        who(V, rr, w2, sizeof w2);
        sig(snd, s1, sizeof s1);
        sig(rcv, s2, sizeof s2);
        put(v->summary, sizeof v->summary,
                 "point-to-point mismatch on group %s: %s sends %s to rank %d (its send #%llu to "
                 "it, step %d, phase %s); %s receives %s from rank %d (its recv #%llu from it, "
                 "step %d, phase %s)",
                 label, w1, s1, rr, (unsigned long long)snd->seq, snd->step, snd->phase, w2, s2,
                 rs, (unsigned long long)rcv->seq, rcv->step, rcv->phase);
        put(what, sizeof what, "%s sends %s to rank %d (send #%llu on group %s)", w1, s1, rr,
                 (unsigned long long)snd->seq, label);
        add_culprit(v, V, rs, V->ranks[rs].node, c->t - 0.001, what);
        put(what, sizeof what, "%s receives %s from rank %d (recv #%llu on group %s)", w2, s2,
                 rs, (unsigned long long)rcv->seq, label);
        add_culprit(v, V, rr, V->ranks[rr].node, c->t - 0.001, what);
        dt_strlcpy(v->cause, "p2p_mismatch", sizeof v->cause);
        return;
    }
    /* a send (receive) whose other side never posted */
    const vrec *x = c->ex;
    int culprit = c->other_rank;
    char d[400];
    int kind = describe(V, culprit, c->g, d, sizeof d);
    who(V, culprit, w1, sizeof w1);
    who(V, c->ex_rank, w2, sizeof w2);
    sig(x, s1, sizeof s1);
    if (kind == K_NEVER)
        put(what, sizeof what, "%s never posted its %s #%llu %s rank %d on group %s: it %s",
                 w1, x->send ? "recv" : "send", (unsigned long long)x->seq,
                 x->send ? "from" : "to", c->ex_rank, label, d);
    else
        put(what, sizeof what, "%s %s", w1, d);
    double since = V->ranks[culprit].phase_since;
    if (since <= 0 || (c->t > 0 && c->t < since))
        since = c->t;
    add_culprit(v, V, culprit, V->ranks[culprit].node, since - 0.001, what);
    put(v->summary, sizeof v->summary, "%s; %s waits in its %s #%llu %s rank %d (%s, for %.1f s)",
             what, w2, x->op, (unsigned long long)x->seq, x->send ? "to" : "from", culprit, s1,
             age(V, x->t_issue));
    dt_strlcpy(v->cause, kind_cause(kind), sizeof v->cause);
}

/* Whether rank R's records show a call that failed (it was a victim of the comm layer). */
static bool failed_in_comm(const vrank *R)
{
    for (int i = 0; i < R->nr; i++)
        if (R->r[i].state == ST_FAILED)
            return true;
    return false;
}

/* No disagreement among the calls: the stopped ranks, the lost nodes and the ranks gone for
 * reasons of their own come first (a rank gone after a failed call is a victim, named only when
 * there is nothing else); else (a watchdog) the ranks that wait in no collective. */
static void verdict_other(dt_verdict *v, const vin *V)
{
    char d[400], w[64], what[512];
    for (int pass = 0; pass < 3 && !v->n; pass++)
        for (int r = 0; r < V->world; r++) {
            const vrank *R = &V->ranks[r];
            if (R->present && R->alive && strcmp(R->state, "T") && strcmp(R->state, "t") &&
                strcmp(R->state, "Z"))
                continue; /* running: not evidence by itself */
            int kind = describe(V, r, -1, d, sizeof d);
            bool take = pass == 0   ? kind == K_STOPPED || kind == K_LOST
                        : pass == 1 ? kind == K_GONE && !failed_in_comm(R)
                                    : kind == K_GONE;
            if (!take)
                continue;
            who(V, r, w, sizeof w);
            snprintf(what, sizeof what, "%s %s", w, d);
            add_culprit(v, V, r, R->node, R->phase_since > 0 ? R->phase_since : V->now, what);
            if (!v->cause[0])
                dt_strlcpy(v->cause, kind_cause(kind), sizeof v->cause);
        }
    if (v->n) {
        /* what the others were last in */
        const vrec *last = NULL;
        for (int r = 0; r < V->world; r++) {
            const vrank *R = &V->ranks[r];
            bool culprit = false;
            for (int i = 0; i < v->n; i++)
                culprit = culprit || v->c[i].rank == r;
            for (int i = 0; !culprit && i < R->nr; i++) /* the first it is stuck in */
                if (R->r[i].state != ST_DONE) {
                    if (!last || R->r[i].t_issue < last->t_issue)
                        last = &R->r[i];
                    break;
                }
        }
        char cn[160] = "", sg[64] = "";
        if (last) {
            call_name(V, last, cn, sizeof cn);
            sig(last, sg, sizeof sg);
        }
        if (last)
            put(v->summary, sizeof v->summary, "%s%s; all others %s %s (%s)%s", v->c[0].what,
                v->n > 1 ? " (and others, below)" : "",
                last->state == ST_FAILED ? "waited in" : "wait in", cn, sg,
                last->state == ST_FAILED ? " until it failed" : "");
        else
            put(v->summary, sizeof v->summary, "%s%s", v->c[0].what,
                v->n > 1 ? " (and others, below)" : "");
        return;
    }
    if (!strcmp(V->kind, "watchdog")) {
        /* everyone is out of the comm layer: the ranks longest in their phase */
        double oldest = 0;
        for (int r = 0; r < V->world; r++) {
            const vrank *R = &V->ranks[r];
            if (R->present && (!R->nr || !waits_elsewhere(R, -1)) &&
                (oldest == 0 || R->phase_since < oldest))
                oldest = R->phase_since;
        }
        for (int r = 0; r < V->world && oldest > 0; r++) {
            const vrank *R = &V->ranks[r];
            if (!R->present || R->phase_since > oldest + 1.0 || (R->nr && waits_elsewhere(R, -1)))
                continue;
            describe(V, r, -1, d, sizeof d);
            who(V, r, w, sizeof w);
            put(what, sizeof what, "%s %s, with no collective pending", w, d);
            add_culprit(v, V, r, R->node, R->phase_since, what);
        }
        if (v->n) {
            dt_strlcpy(v->cause, "stalled", sizeof v->cause);
            put(v->summary, sizeof v->summary, "%s%s", v->c[0].what,
                     v->n > 1 ? " (and others, below)" : "");
            return;
        }
    }
    dt_strlcpy(v->cause, "none", sizeof v->cause);
    put(v->summary, sizeof v->summary, "no hang found: the ranks agree on every collective "
             "and point-to-point call they hold, and none is stopped or gone");
}

/* One line per rank (the first 16; the files hold the rest). */
static void rank_lines(const vin *V, sb *lines)
{
    int shown = 0;
    for (int r = 0; r < V->world; r++) {
        const vrank *R = &V->ranks[r];
        if (shown++ == 16) {
            sb_add(lines, "... and %d more ranks (flight/rank_<N>.json)\n", V->world - 16);
            break;
        }
        char w[64];
        who(V, r, w, sizeof w);
        if (!R->present) {
            char d[400];
            describe(V, r, -1, d, sizeof d);
            sb_add(lines, "%s: %s\n", w, d);
            continue;
        }
        sb_add(lines, "%s, pid %d: step %lld", w, R->pid, (long long)R->step);
        if (R->micro >= 0)
            sb_add(lines, " micro-step %d", R->micro);
        sb_add(lines, ", phase %s since %.1f s; process %s%s%s%s", R->phase[0] ? R->phase : "?",
               age(V, R->phase_since), R->alive ? "state " : "", R->alive ? R->state : R->exit[0] ? R->exit : "gone",
               R->wchan[0] && R->alive ? " " : "", R->alive ? R->wchan : "");
        const vrec *last = R->nr ? &R->r[R->nr - 1] : NULL;
        if (last) {
            char cn[160], sg[64];
            call_name(V, last, cn, sizeof cn);
            sig(last, sg, sizeof sg);
            static const char *const sn[] = {"?", "queued", "started", "done", "failed"};
            sb_add(lines, "; last call: %s (%s) %s, issued %.1f s ago", cn, sg,
                   sn[last->state >= 0 && last->state <= 4 ? last->state : 0],
                   age(V, last->t_issue));
        }
        if (R->error[0])
            sb_add(lines, "; error: %.200s", R->error);
        sb_add(lines, "\n");
    }
}

int dt_verdict_make(const cJSON *in, dt_verdict *v, dt_err *err)
{
    memset(v, 0, sizeof *v);
    vin V;
    int rc = vin_read(&V, in, err);
    if (rc)
        return rc;
    cand best = {0};
    for (int g = 0; g < V.ngroups; g++) {
        walk_collectives(&V, g, &best);
        walk_p2p(&V, g, &best);
    }
    sb lines = {0};
    switch (best.type) {
    case C_MISSING:
        verdict_missing(v, &V, &best, &lines);
        break;
    case C_MISMATCH:
        verdict_mismatch(v, &V, &best, &lines);
        break;
    case C_P2P_MISMATCH:
    case C_P2P_MISSING:
        verdict_p2p(v, &V, &best, &lines);
        break;
    default:
        verdict_other(v, &V);
        break;
    }
    sb text = {0};
    sb_add(&text, "%s\n", v->summary);
    if (V.reason[0])
        sb_add(&text, "trigger: %s\n", V.reason);
    if (lines.p)
        sb_add(&text, "%s", lines.p);
    for (int i = 1; i < v->n; i++)
        if (!lines.p || !strstr(lines.p, v->c[i].what))
            sb_add(&text, "culprit: %s\n", v->c[i].what);
    rank_lines(&V, &text);
    free(lines.p);
    v->text = text.p;
    /* the event */
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "trigger", V.kind);
    cJSON_AddStringToObject(e, "reason", V.reason);
    cJSON_AddStringToObject(e, "cause", v->cause);
    cJSON_AddStringToObject(e, "verdict", v->summary);
    cJSON *cr = cJSON_AddArrayToObject(e, "culprit_ranks");
    cJSON *cn = cJSON_AddArrayToObject(e, "culprit_nodes");
    for (int i = 0; i < v->n; i++) {
        if (v->c[i].rank >= 0)
            cJSON_AddItemToArray(cr, cJSON_CreateNumber(v->c[i].rank));
        bool seen = false;
        for (int j = 0; j < i; j++)
            seen = seen || v->c[j].node == v->c[i].node;
        if (!seen && v->c[i].node >= 0)
            cJSON_AddItemToArray(cn, cJSON_CreateNumber(v->c[i].node));
    }
    if (best.type != C_NONE) {
        cJSON_AddStringToObject(e, "group", V.groups[best.g].label);
        cJSON_AddNumberToObject(e, "seq", (double)best.k);
        cJSON_AddStringToObject(e, "op", best.ex->op);
    }
    cJSON *ls = cJSON_AddArrayToObject(e, "lines");
    for (char *p = v->text; p && *p;) {
        char *nl = strchr(p, '\n');
        size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, n);
        if (line)
            cJSON_AddItemToArray(ls, cJSON_CreateString(line));
        free(line);
        p += n + (nl ? 1 : 0);
    }
    v->event = e;
    vin_free(&V);
    if (!v->text)
        return dt_err_set(err, -ENOMEM, "hang verdict: out of memory");
    return 0;
}

void dt_verdict_free(dt_verdict *v)
{
    if (!v)
        return;
    free(v->text);
    cJSON_Delete(v->event);
    memset(v, 0, sizeof *v);
}

cJSON *dt_verdict_trim(const cJSON *rank)
{
    cJSON *t = cJSON_Duplicate(rank, true);
    if (!t)
        return NULL;
    cJSON *recs = cJSON_GetObjectItemCaseSensitive(t, "records");
    int n = cJSON_GetArraySize(recs);
    if (n <= DT_VERDICT_RECENT)
        return t;
    /* from the newest back: keep RECENT per group */
    int counts[256] = {0};
    for (int i = n - 1; i >= 0; i--) {
        cJSON *x = cJSON_GetArrayItem(recs, i);
        int g = (int)num(x, "group", 0);
        g = g < 0 || g > 255 ? 255 : g;
        if (++counts[g] > DT_VERDICT_RECENT)
            cJSON_DeleteItemFromArray(recs, i);
    }
    return t;
}
