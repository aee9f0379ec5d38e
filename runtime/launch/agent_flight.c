/* agent_flight.c - the agent's flight records, hang verdicts, step watchdog and straggler
 * scores: see agent_flight.h.
 *
 * Store keys, under the round's prefix P = "dtrain-flight/<run id>/r<round>-<master port>/" (the
 * master port is new every round, so no key of an earlier job with the same id on a store that
 * outlives jobs is read):
 *   node/<k>       node k's {host, pid, rank_base, nproc}, set when the round begins
 *   trigger        the dumps asked for so far (dt_store_add)
 *   why/<n>        dump n's {kind, node, reason, time}; agents poll for why/<seen + 1>
 *   failtrig       the round's first failure trigger (compare-and-set: one failure dump a round)
 *   sum/<n>/<k>    node k's ranks for dump n (each trimmed: dt_verdict_trim)
 *   ack/<n>        node 0 took up dump n (an agent waiting for a verdict stops waiting when no
 *                  ack comes: node 0's agent is gone or stuck)
 *   verdict/<n>    the verdict's lines; failverdict: the dump of the round's failure verdict
 *   win/<j%8>/<k>  node k's straggler window j: "j rank steps median_ns wait_ns ..." (a slot
 *                  of eight, overwritten: no key grows with the length of a job)
 */
#include "runtime/launch/agent_flight.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "runtime/job/config.h" /* DT_PATH_MAX */
#include "runtime/job/flightrec.h"
#include "runtime/launch/flight_verdict.h"

#define SLOTS 8 /* straggler window slots in the store */

typedef struct node_info {
    int rank_base, nproc;
} node_info;

struct dt_agent_flight {
    dt_agent_flight_opts o;
    dt_rdzv_round rd;
    int nproc;
    char run_dir[DT_PATH_MAX + 300];
    char dir[DT_PATH_MAX + 320]; /* <run dir>/flight */
    dt_events *ev;
    dt_rdzv *rz;
    dt_store *base, *st;         /* st: the round's prefix over base */
    dt_flightrec *fr;            /* nproc */
    int nfr;
    double next_tick;
    int64_t seen;                /* dumps answered */
    int64_t await;               /* a dump whose verdict this (non-zero) node waits to write */
    bool watchdog_fired, round_failed, round_failed_told, warned;
    /* stragglers */
    int64_t published;           /* the last window this node published (-1: none) */
    int64_t score_next;          /* node 0: the next window to score (-1: not yet known) */
    bool *flagged;               /* node 0: (world) */
    node_info *nodes;            /* (group_world_size) learnt from node/<k>, rank_base -1 */
};

static bool is_node0(const dt_agent_flight *f)
{
    return f->rd.group_rank == 0;
}

/* snprintf for keys and paths: false when it did not fit. */
static bool fmt(char *dst, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static bool fmt(char *dst, size_t cap, const char *f, ...)
{
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(dst, cap, f, ap);
    va_end(ap);
    return n >= 0 && (size_t)n < cap;
}

/* A store call failed (not a wait that timed out): the store is gone or unreachable, and every
 * later call would wait for its connection again, which the agent's loop cannot afford: no more
 * store calls this round. */
static void store_warn(dt_agent_flight *f, const char *what, const dt_err *e)
{
    dt_store_free(f->st);
    f->st = NULL;
    if (f->warned)
        return;
    f->warned = true;
    DT_WARN("flight records: %s: %s (no hang verdict across nodes in this round)", what, e->msg);
}

/* Text to a file, atomically (a temporary name, then rename). */
static void write_text(const char *path, const char *text)
{
    char tmp[DT_PATH_MAX + 400];
    if (!fmt(tmp, sizeof tmp, "%s.tmp", path))
        return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        DT_WARN("flight records: cannot write %s: %s", tmp, strerror(errno));
        return;
    }
    int rc = dt_write_all(fd, text, strlen(text));
    close(fd);
    if (rc || rename(tmp, path) != 0) {
        DT_WARN("flight records: cannot write %s: %s", path, strerror(rc ? -rc : errno));
        unlink(tmp);
    }
}

static void write_json(const char *path, const cJSON *o)
{
    char *t = cJSON_Print(o);
    if (t) {
        write_text(path, t);
        free(t);
    }
}

/* ---- a rank's records as JSON --------------------------------------------------------------- */

/* The process state letter and wait channel of pid from /proc ("" / "" when it is gone). */
static void proc_state(int pid, char *state, size_t scap, char *wchan, size_t wcap)
{
    state[0] = wchan[0] = '\0';
    if (pid <= 0)
        return;
    char path[64], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    if (dt_read_file(path, &text, &len, NULL) == 0 && text) {
        char *p = strrchr(text, ')'); /* the name may hold spaces and parentheses */
        if (p && p[1] == ' ' && p[2])
            snprintf(state, scap, "%c", p[2]);
    }
    free(text);
    text = NULL;
    snprintf(path, sizeof path, "/proc/%d/wchan", pid);
    if (state[0] && dt_read_file(path, &text, &len, NULL) == 0 && text && strcmp(text, "0"))
        snprintf(wchan, wcap, "%.*s", (int)strcspn(text, "\n"), text);
    free(text);
}

static double wall_of(double off, uint64_t ns)
{
    return ns ? (double)ns * 1e-9 + off : 0;
}

static void add_time(cJSON *o, const char *k, double off, uint64_t ns)
{
    if (ns)
        cJSON_AddNumberToObject(o, k, wall_of(off, ns));
    else
        cJSON_AddNullToObject(o, k);
}

static const char *state_long(const char *s)
{
    switch (s[0]) {
    case 'R':
        return "running";
    case 'S':
        return "sleeping";
    case 'D':
        return "in uninterruptible wait";
    case 'T':
    case 't':
        return "stopped";
    case 'Z':
        return "zombie";
    default:
        return s[0] ? "other" : "gone";
    }
}

/* A worker's records and process state, taken together. */
typedef struct taken {
    dt_flightrec_snap s;
    char st[8], wchan[128];
} taken;

static void take(dt_agent_flight *f, int i, taken *t)
{
    dt_err e = {0};
    if (dt_flightrec_snapshot(&f->fr[i], &t->s, true, &e)) {
        DT_WARN("flight records of rank %d: %s", f->rd.rank_base + i, e.msg);
        memset(&t->s, 0, sizeof t->s);
    }
    proc_state(t->s.pid, t->st, sizeof t->st, t->wchan, sizeof t->wchan);
}

/* Rank i's records as flight/rank_<N>.json holds them (NULL without memory); frees t's copy. */
static cJSON *rank_json(dt_agent_flight *f, int i, taken *t, int64_t dump, double now_wall,
                        double off)
{
    dt_flightrec_snap s = t->s;
    const char *st = t->st, *wchan = t->wchan;
    cJSON *o = cJSON_CreateObject();
    bool alive = st[0] && st[0] != 'Z' && st[0] != 'X';
    cJSON_AddNumberToObject(o, "version", 1);
    cJSON_AddNumberToObject(o, "rank", f->rd.rank_base + i);
    cJSON_AddNumberToObject(o, "local_rank", i);
    cJSON_AddNumberToObject(o, "node", f->rd.group_rank);
    cJSON_AddStringToObject(o, "host", dt_hostname());
    cJSON_AddNumberToObject(o, "pid", s.pid);
    cJSON_AddNumberToObject(o, "attempt", f->rd.attempt);
    cJSON_AddNumberToObject(o, "dump", (double)dump);
    cJSON_AddNumberToObject(o, "time", now_wall);
    cJSON_AddBoolToObject(o, "alive", alive);
    cJSON_AddStringToObject(o, "state", st);
    cJSON_AddStringToObject(o, "state_name", state_long(st));
    cJSON_AddStringToObject(o, "wchan", wchan);
    cJSON_AddStringToObject(o, "exit", s.pid == 0 ? "never attached its flight records"
                                       : alive  ? ""
                                                : "exited");
    cJSON_AddStringToObject(o, "error", s.error);
    cJSON *p = cJSON_AddObjectToObject(o, "position");
    cJSON_AddNumberToObject(p, "step", (double)s.pos.step);
    cJSON_AddNumberToObject(p, "micro", s.pos.micro);
    cJSON_AddStringToObject(p, "phase", dt_flightrec_phase_name(s.pos.phase));
    add_time(p, "phase_since", off, s.pos.phase_since);
    add_time(p, "first_step", off, s.pos.first_step);
    add_time(p, "last_step_end", off, s.pos.last_step_end);
    cJSON_AddNumberToObject(p, "steps_done", (double)s.pos.steps_done);
    cJSON_AddBoolToObject(p, "torn", s.pos_torn);
    cJSON *gs = cJSON_AddArrayToObject(o, "groups");
    for (int g = 0; g < s.ngroups; g++) {
        const dt_flightrec_group *G = &s.groups[g];
        cJSON *go = cJSON_CreateObject();
        char uid[24];
        snprintf(uid, sizeof uid, "%016" PRIx64, G->uid);
        cJSON_AddNumberToObject(go, "index", g);
        cJSON_AddStringToObject(go, "label", G->label);
        cJSON_AddStringToObject(go, "uid", uid);
        cJSON_AddNumberToObject(go, "size", G->size);
        cJSON_AddNumberToObject(go, "rank", G->rank);
        cJSON *m = cJSON_AddArrayToObject(go, "members");
        for (int k = 0; k < G->nmembers && k < DT_FLIGHTREC_MEMBERS; k++)
            cJSON_AddItemToArray(m, cJSON_CreateNumber(G->members[k]));
        cJSON_AddItemToArray(gs, go);
    }
    cJSON_AddNumberToObject(o, "issued", (double)s.issued);
    cJSON_AddNumberToObject(o, "torn", (double)s.torn);
    cJSON *rs = cJSON_AddArrayToObject(o, "records");
    for (size_t k = 0; k < s.n; k++) {
        const dt_flightrec_rec *r = &s.recs[k];
        if (r->group >= s.ngroups)
            continue; /* its group was being registered */
        cJSON *x = cJSON_CreateObject();
        cJSON_AddNumberToObject(x, "id", (double)r->id);
        cJSON_AddNumberToObject(x, "group", r->group);
        cJSON_AddNumberToObject(x, "seq", (double)r->seq);
        cJSON_AddStringToObject(x, "op", r->op < DT_FLIGHTREC_NAMES ? s.op_names[r->op] : "?");
        cJSON_AddStringToObject(x, "dtype",
                                r->dtype < DT_FLIGHTREC_NAMES ? s.dtype_names[r->dtype] : "?");
        cJSON_AddNumberToObject(x, "count", (double)r->count);
        cJSON_AddNumberToObject(x, "peer", r->peer);
        cJSON_AddStringToObject(x, "state", dt_flightrec_state_name(r->state));
        cJSON_AddNumberToObject(x, "step", r->step);
        cJSON_AddStringToObject(x, "phase", dt_flightrec_phase_name(r->phase));
        cJSON_AddNumberToObject(x, "micro", r->micro);
        add_time(x, "t_issue", off, r->t_issue);
        add_time(x, "t_start", off, r->t_start);
        add_time(x, "t_end", off, r->t_end);
        if (r->state == DT_FLIGHTREC_FAILED)
            cJSON_AddNumberToObject(x, "err", r->err);
        cJSON_AddItemToArray(rs, x);
    }
    cJSON *ws = cJSON_AddArrayToObject(o, "windows");
    for (int k = 0; k < s.nwindows; k++) {
        cJSON *w = cJSON_CreateObject();
        cJSON_AddNumberToObject(w, "index", (double)s.windows[k].index);
        cJSON_AddNumberToObject(w, "steps", s.windows[k].steps);
        cJSON_AddNumberToObject(w, "compute_s", (double)s.windows[k].compute_ns * 1e-9);
        cJSON_AddNumberToObject(w, "wait_s", (double)s.windows[k].wait_ns * 1e-9);
        cJSON_AddNumberToObject(w, "median_step_compute_s", (double)s.windows[k].median_ns * 1e-9);
        cJSON_AddItemToArray(ws, w);
    }
    dt_flightrec_snap_free(&s);
    return o;
}

/* ---- triggers and dumps ------------------------------------------------------------------- */

static bool is_failure_kind(const char *kind)
{
    return strcmp(kind, "request") != 0;
}

/* Asks every agent for dump n+1 (kind: "timeout", "failure", "watchdog", "request"). A failure
 * kind makes a dump only when it is the round's first. Returns the dump, 0 when none was made. */
static int64_t trigger(dt_agent_flight *f, const char *kind, const char *reason)
{
    if (!f->st)
        return 0;
    dt_err e = {0};
    if (is_failure_kind(kind)) {
        int swapped = 0;
        void *cur = NULL;
        size_t len = 0;
        if (dt_store_cas_swapped(f->st, "failtrig", "", 0, reason, strlen(reason), &swapped,
                                 &cur, &len, &e)) {
            store_warn(f, "asking for a dump", &e);
            return 0;
        }
        free(cur);
        if (!swapped)
            return 0; /* another node asked first: its dump tells this story too */
    }
    int64_t n = 0;
    if (dt_store_add(f->st, "trigger", 1, &n, &e)) {
        store_warn(f, "asking for a dump", &e);
        return 0;
    }
    cJSON *w = cJSON_CreateObject();
    cJSON_AddStringToObject(w, "kind", kind);
    cJSON_AddNumberToObject(w, "node", f->rd.group_rank);
    cJSON_AddStringToObject(w, "reason", reason);
    cJSON_AddNumberToObject(w, "time", dt_wall_s());
    char *t = cJSON_PrintUnformatted(w);
    cJSON_Delete(w);
    char key[64];
    snprintf(key, sizeof key, "why/%lld", (long long)n);
    if (t && dt_store_set(f->st, key, t, strlen(t), &e))
        store_warn(f, "asking for a dump", &e);
    free(t);
    DT_INFO("flight records: dump %lld asked for (%s): %s", (long long)n, kind, reason);
    return n;
}

/* The culprits as failures of the round: first in the root-cause table. */
static void record_culprits(dt_agent_flight *f, const dt_verdict *v, const cJSON *in)
{
    if (v->n == 0)
        return;
    dt_rdzv_failure *fl = calloc((size_t)v->n, sizeof *fl);
    if (!fl)
        return;
    char path[DT_PATH_MAX + 400];
    fmt(path, sizeof path, "%s/verdict.txt", f->dir);
    for (int i = 0; i < v->n; i++) {
        const dt_verdict_culprit *c = &v->c[i];
        dt_rdzv_failure *x = &fl[i];
        x->time = c->since > 0 ? c->since : dt_wall_s();
        dt_strlcpy(x->host, c->host, sizeof x->host);
        x->node = c->node;
        x->rank = c->rank;
        x->local_rank = -1;
        const cJSON *no;
        cJSON_ArrayForEach(no, cJSON_GetObjectItemCaseSensitive(in, "nodes"))
        {
            int base = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(no, "rank_base"));
            int np = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(no, "nproc"));
            if (c->rank >= base && c->rank < base + np)
                x->local_rank = c->rank - base;
        }
        x->pid = c->pid;
        x->exit_code = DT_REPORT_HANG_CULPRIT;
        fmt(x->message, sizeof x->message, "hang verdict (%s): %s", v->cause, c->what);
        dt_strlcpy(x->error_file, path, sizeof x->error_file);
    }
    dt_err e = {0};
    if (dt_rdzv_failed(f->rz, fl, v->n, &e))
        DT_WARN("flight records: cannot record the hang's culprits in the rendezvous: %s", e.msg);
    free(fl);
    f->round_failed = true;
}

/* Node 0: gathers dump n's summaries, makes the verdict, tells everyone. mine: this node's
 * ranks (taken over). */
static void make_verdict(dt_agent_flight *f, int64_t n, cJSON *why, cJSON *mine, double now)
{
    const int G = f->rd.group_world_size;
    char ack[64];
    snprintf(ack, sizeof ack, "ack/%lld", (long long)n);
    if (f->st)
        dt_store_set(f->st, ack, "1", 1, NULL);
    cJSON *in = cJSON_CreateObject();
    cJSON_AddNumberToObject(in, "version", 1);
    cJSON_AddNumberToObject(in, "time", now);
    cJSON_AddNumberToObject(in, "dump", (double)n);
    cJSON_AddNumberToObject(in, "world_size", f->rd.world_size);
    cJSON_AddNumberToObject(in, "attempt", f->rd.attempt);
    cJSON_AddStringToObject(in, "run_id", f->rd.run_id);
    cJSON_AddItemToObject(in, "trigger", cJSON_Duplicate(why, true));
    cJSON *nodes = cJSON_AddArrayToObject(in, "nodes");
    cJSON *ranks = cJSON_AddArrayToObject(in, "ranks");
    double deadline = dt_now_s() + DT_AGENT_FLIGHT_ANSWER_S;
    for (int k = 0; k < G; k++) {
        char key[64];
        dt_err e = {0};
        void *val = NULL;
        size_t len = 0;
        cJSON *no = NULL, *sum = NULL;
        snprintf(key, sizeof key, "node/%d", k);
        if (f->st && dt_store_get(f->st, key, &val, &len, 0, &e) == 0)
            no = cJSON_Parse(val);
        free(val);
        val = NULL;
        if (!no) {
            no = cJSON_CreateObject();
            cJSON_AddNumberToObject(no, "node", k);
        }
        if (k == f->rd.group_rank) {
            sum = mine;
            mine = NULL;
        } else if (f->st) {
            snprintf(key, sizeof key, "sum/%lld/%d", (long long)n, k);
            int ms = (int)((deadline - dt_now_s()) * 1000);
            if (dt_store_get(f->st, key, &val, &len, ms > 0 ? ms : 0, &e) == 0)
                sum = cJSON_Parse(val);
            free(val);
        }
        cJSON_AddBoolToObject(no, "answered", sum != NULL);
        cJSON_AddItemToArray(nodes, no);
        cJSON *ro;
        while (sum && (ro = cJSON_DetachItemFromArray(sum, 0)))
            cJSON_AddItemToArray(ranks, ro);
        cJSON_Delete(sum);
    }
    cJSON_Delete(mine);
    dt_verdict v;
    dt_err e = {0};
    char path[DT_PATH_MAX + 400];
    if (dt_verdict_make(in, &v, &e)) {
        DT_WARN("hang verdict: cannot be made: %s", e.msg);
        cJSON_Delete(in);
        return;
    }
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(why, "kind"));
    bool failure = kind && is_failure_kind(kind);
    /* the lines, as logged and as verdict.txt holds them */
    size_t cap = strlen(v.text) * 2 + 64, k = 0;
    char *out = malloc(cap);
    for (char *p = v.text; out && *p;) {
        char *nl = strchr(p, '\n');
        int len = nl ? (int)(nl - p) : (int)strlen(p);
        if (failure)
            DT_WARN("hang verdict: %.*s", len, p);
        else
            DT_INFO("hang verdict: %.*s", len, p);
        k += (size_t)snprintf(out + k, cap - k, "hang verdict: %.*s\n", len, p);
        p += len + (nl ? 1 : 0);
    }
    cJSON_AddItemToObject(in, "verdict", cJSON_Duplicate(v.event, true));
    fmt(path, sizeof path, "%s/verdict.json", f->dir);
    write_json(path, in);
    if (out) {
        fmt(path, sizeof path, "%s/verdict.txt", f->dir);
        write_text(path, out);
        char key[64];
        snprintf(key, sizeof key, "verdict/%lld", (long long)n);
        if (f->st && dt_store_set(f->st, key, out, strlen(out), &e))
            store_warn(f, "publishing the verdict", &e);
    }
    cJSON *fields = v.event;
    v.event = NULL;
    cJSON_AddNumberToObject(fields, "dump", (double)n);
    dt_report_hang(f->ev, !failure && !strcmp(v.cause, "none") ? "flight_dump" : "hang", fields);
    if (failure) {
        char nb[32];
        snprintf(nb, sizeof nb, "%lld", (long long)n);
        if (f->st)
            dt_store_set(f->st, "failverdict", nb, strlen(nb), NULL);
        record_culprits(f, &v, in);
    }
    free(out);
    dt_verdict_free(&v);
    cJSON_Delete(in);
}

/* Answers dump n: this node's records to files and to the store; node 0 makes the verdict. */
static void answer(dt_agent_flight *f, int64_t n, cJSON *why)
{
    double now = dt_wall_s(), off = now - dt_now_s();
    cJSON *sum = cJSON_CreateArray();
    char path[DT_PATH_MAX + 400];
    /* every worker's copy first, the JSON after: the ranks' records are of one moment */
    taken *t = calloc((size_t)(f->nfr > 0 ? f->nfr : 1), sizeof *t);
    for (int i = 0; t && i < f->nfr; i++)
        take(f, i, &t[i]);
    for (int i = 0; t && i < f->nfr; i++) {
        cJSON *r = rank_json(f, i, &t[i], n, now, off);
        if (!r)
            continue;
        if (fmt(path, sizeof path, "%s/rank_%d.json", f->dir, f->rd.rank_base + i))
            write_json(path, r);
        cJSON *tr = dt_verdict_trim(r);
        if (tr)
            cJSON_AddItemToArray(sum, tr);
        cJSON_Delete(r);
    }
    free(t);
    if (is_node0(f)) {
        make_verdict(f, n, why, sum, now);
        return;
    }
    char *text = cJSON_PrintUnformatted(sum);
    cJSON_Delete(sum);
    char key[64];
    snprintf(key, sizeof key, "sum/%lld/%d", (long long)n, f->rd.group_rank);
    dt_err e = {0};
    if (text && f->st && dt_store_set(f->st, key, text, strlen(text), &e))
        store_warn(f, "publishing this node's records", &e);
    free(text);
    f->await = n;
}

/* Answers every dump asked for since the last one answered. */
static void poll_dumps(dt_agent_flight *f)
{
    while (f->st) {
        char key[64];
        void *val = NULL;
        size_t len = 0;
        dt_err e = {0};
        snprintf(key, sizeof key, "why/%lld", (long long)f->seen + 1);
        int rc = dt_store_get(f->st, key, &val, &len, 0, &e);
        if (rc) {
            if (rc != -ENOENT && rc != -ETIMEDOUT)
                store_warn(f, "looking for dumps", &e);
            free(val);
            return;
        }
        cJSON *why = cJSON_Parse(val);
        free(val);
        f->seen++;
        if (!why)
            continue;
        answer(f, f->seen, why);
        cJSON_Delete(why);
    }
}

/* A node other than 0: writes the verdict of the dump it answered once it is out. */
static bool take_verdict(dt_agent_flight *f, int timeout_ms)
{
    if (!f->await || !f->st)
        return false;
    char key[64];
    void *val = NULL;
    size_t len = 0;
    snprintf(key, sizeof key, "verdict/%lld", (long long)f->await);
    if (dt_store_get(f->st, key, &val, &len, timeout_ms, NULL) != 0) {
        free(val);
        return false;
    }
    char path[DT_PATH_MAX + 400];
    if (fmt(path, sizeof path, "%s/verdict.txt", f->dir))
        write_text(path, val);
    free(val);
    f->await = 0;
    return true;
}

/* `dtrain debug dump`: <run dir>/flight/request, claimed by a rename (agents may share it). */
static void poll_request(dt_agent_flight *f)
{
    char req[DT_PATH_MAX + 400], mine[DT_PATH_MAX + 440];
    if (!fmt(req, sizeof req, "%s/request", f->dir) ||
        !fmt(mine, sizeof mine, "%s.%d", req, (int)getpid()) || rename(req, mine) != 0)
        return;
    char *text = NULL, why[512];
    size_t len = 0;
    dt_read_file(mine, &text, &len, NULL);
    unlink(mine);
    fmt(why, sizeof why, "%.*s (read by node %d's agent)",
        text ? (int)strcspn(text, "\n") : 0, text ? text : "", f->rd.group_rank);
    free(text);
    trigger(f, "request", why);
}

/* ---- the step watchdog ---------------------------------------------------------------------- */

static void watchdog(dt_agent_flight *f)
{
    if (f->o.step_timeout <= 0 || f->watchdog_fired || !f->nfr)
        return;
    uint64_t now = dt_now_ns();
    double fresh = -1; /* the least time since a step ended, over the ranks in training */
    int stale_rank = -1;
    int64_t stale_step = 0;
    for (int i = 0; i < f->nfr; i++) {
        dt_flightrec_snap s;
        if (dt_flightrec_snapshot(&f->fr[i], &s, false, NULL) || s.pid == 0 || s.pos_torn)
            continue;
        if (!s.pos.first_step || s.pos.phase == DT_PHASE_END)
            continue;
        uint64_t last = s.pos.last_step_end > s.pos.first_step ? s.pos.last_step_end
                                                                : s.pos.first_step;
        double age = now > last ? (double)(now - last) * 1e-9 : 0;
        if (fresh < 0 || age < fresh) {
            fresh = age;
            stale_rank = f->rd.rank_base + i;
            stale_step = s.pos.steps_done ? s.pos.step : 0;
        }
    }
    if (fresh < f->o.step_timeout)
        return;
    f->watchdog_fired = true;
    char why[512];
    fmt(why, sizeof why, "step watchdog on node %d: no rank of it finished a step for %.1f s "
        "(train.step_timeout = %g s; rank %d's last finished step: %lld)", f->rd.group_rank,
        fresh, f->o.step_timeout, stale_rank, (long long)stale_step);
    DT_WARN("%s", why);
    if (trigger(f, "watchdog", why) && is_node0(f))
        poll_dumps(f);
}

/* ---- stragglers ----------------------------------------------------------------------------- */

static bool scoring(const dt_agent_flight *f)
{
    return f->o.straggler_ratio >= 1 && f->o.straggler_window > 0 && f->rd.world_size > 1 &&
           f->st;
}

/* Publishes the windows every local rank completed. */
static void publish_windows(dt_agent_flight *f)
{
    int n = f->nfr < 64 ? f->nfr : 64;
    dt_flightrec_snap *s = calloc((size_t)(n > 0 ? n : 1), sizeof *s);
    int64_t upto = INT64_MAX;
    for (int i = 0; s && i < n; i++) {
        if (dt_flightrec_snapshot(&f->fr[i], &s[i], false, NULL) || !s[i].nwindows) {
            free(s);
            return;
        }
        int64_t last = s[i].windows[s[i].nwindows - 1].index;
        if (last < upto)
            upto = last;
    }
    if (!s)
        return;
    for (int64_t j = f->published + 1; n > 0 && j <= upto; j++) {
        if (f->published < 0 && j < upto)
            j = upto; /* the round's first look: from the newest on */
        char val[64 * 80], key[64];
        size_t k = (size_t)snprintf(val, sizeof val, "%lld", (long long)j);
        bool all = true;
        for (int i = 0; i < n && all; i++) {
            const dt_flightrec_window *w = NULL;
            for (int m = 0; m < s[i].nwindows; m++)
                if (s[i].windows[m].index == j)
                    w = &s[i].windows[m];
            if (!w) {
                all = false;
                break;
            }
            k += (size_t)snprintf(val + k, sizeof val - k, " %d %d %llu %llu",
                                  f->rd.rank_base + i, w->steps,
                                  (unsigned long long)w->median_ns,
                                  (unsigned long long)w->wait_ns);
        }
        f->published = j;
        if (!all || k >= sizeof val || !f->st)
            continue; /* a window a rank no longer holds: skipped */
        snprintf(key, sizeof key, "win/%d/%d", (int)(j % SLOTS), f->rd.group_rank);
        dt_err e = {0};
        if (dt_store_set(f->st, key, val, k, &e))
            store_warn(f, "publishing straggler windows", &e);
    }
    free(s);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static int node_of_rank(dt_agent_flight *f, int r)
{
    for (int k = 0; k < f->rd.group_world_size; k++) {
        node_info *ni = &f->nodes[k];
        if (ni->rank_base < 0 && f->st) { /* learn it once */
            char key[32];
            void *val = NULL;
            size_t len = 0;
            snprintf(key, sizeof key, "node/%d", k);
            if (dt_store_get(f->st, key, &val, &len, 0, NULL) == 0) {
                cJSON *o = cJSON_Parse(val);
                ni->rank_base = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "rank_base"));
                ni->nproc = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "nproc"));
                cJSON_Delete(o);
            }
            free(val);
        }
        if (ni->rank_base >= 0 && r >= ni->rank_base && r < ni->rank_base + ni->nproc)
            return k;
    }
    return -1;
}

/* Node 0: scores window j from every node's line. */
static void score(dt_agent_flight *f, int64_t j, char **vals, int nvals)
{
    const int W = f->rd.world_size;
    double *c = calloc((size_t)W, sizeof *c), *sorted = calloc((size_t)W, sizeof *sorted);
    int *steps = calloc((size_t)W, sizeof *steps);
    if (!c || !sorted || !steps)
        goto out;
    for (int r = 0; r < W; r++)
        c[r] = -1;
    for (int k = 0; k < nvals; k++) {
        char *p = vals[k], *end;
        strtoll(p, &end, 10);
        p = end;
        for (;;) {
            long r = strtol(p, &end, 10);
            if (end == p)
                break;
            p = end;
            long st = strtol(p, &end, 10);
            p = end;
            unsigned long long comp = strtoull(p, &end, 10);
            p = end;
            strtoull(p, &end, 10);
            p = end;
            if (r >= 0 && r < W && st > 0) {
                c[r] = (double)comp * 1e-9; /* the median step's compute time */
                steps[r] = (int)st;
            }
        }
    }
    int n = 0;
    for (int r = 0; r < W; r++)
        if (c[r] >= 0)
            sorted[n++] = c[r];
    if (n < 2)
        goto out;
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_double);
    double median = sorted[(n - 1) / 2]; /* the lower median */
    if (!(median > 0))
        goto out;
    int K = f->o.straggler_window;
    int64_t first = j * K + 1, last = (j + 1) * K;
    for (int r = 0; r < W; r++) {
        if (c[r] < 0)
            continue;
        double ratio = c[r] / median;
        bool now = ratio >= f->o.straggler_ratio &&
                   (c[r] - median) * 1e3 >= DT_AGENT_FLIGHT_STRAGGLER_MS;
        if (now == f->flagged[r])
            continue;
        f->flagged[r] = now;
        int node = node_of_rank(f, r);
        if (now)
            DT_WARN("straggler: rank %d (node %d) %.2fx the median compute time over %d steps "
                    "(steps %lld-%lld: %.2f ms per step, median %.2f ms; train.straggler_ratio = "
                    "%g)", r, node, ratio, steps[r], (long long)first, (long long)last,
                    c[r] * 1e3, median * 1e3, f->o.straggler_ratio);
        else
            DT_INFO("straggler: rank %d (node %d) recovered: %.2fx the median compute time over "
                    "%d steps (steps %lld-%lld)", r, node, ratio, steps[r], (long long)first,
                    (long long)last);
        dt_report_straggler(f->ev, !now, r, node, ratio, first, last, c[r] * 1e3, median * 1e3);
    }
    /* rank 0's metrics.jsonl names the stragglers of now */
    int list[DT_FLIGHTREC_STRAGGLERS], nl = 0;
    for (int r = 0; r < W && nl < DT_FLIGHTREC_STRAGGLERS; r++)
        if (f->flagged[r])
            list[nl++] = r;
    for (int i = 0; i < f->nfr; i++)
        if (f->rd.rank_base + i == 0)
            dt_flightrec_set_stragglers(&f->fr[i], list, nl);
out:
    free(c);
    free(sorted);
    free(steps);
}

/* Node 0: scores the windows every node published. */
static void score_windows(dt_agent_flight *f)
{
    const int G = f->rd.group_world_size;
    if (f->score_next < 0) {
        if (f->published < 0)
            return;
        f->score_next = f->published + 1; /* the round's first window holds start-up */
        return;
    }
    char **keys = calloc((size_t)G, sizeof *keys);
    void **vals = calloc((size_t)G, sizeof *vals);
    size_t *lens = calloc((size_t)G, sizeof *lens);
    for (int guard = 0; keys && vals && lens && guard < SLOTS; guard++) {
        int64_t j = f->score_next;
        if (j > f->published)
            break; /* node 0's own ranks are not there yet */
        for (int k = 0; k < G; k++) {
            free(keys[k]);
            keys[k] = malloc(48);
            if (keys[k])
                snprintf(keys[k], 48, "win/%d/%d", (int)(j % SLOTS), k);
        }
        int all = 0;
        if (!f->st || dt_store_check(f->st, (const char *const *)keys, (size_t)G, &all, NULL) ||
            !all)
            break;
        if (dt_store_multi_get(f->st, (const char *const *)keys, (size_t)G, vals, lens, 0, NULL))
            break;
        bool ready = true, lost = false;
        for (int k = 0; k < G; k++) {
            long long jj = strtoll(vals[k], NULL, 10);
            ready = ready && jj == j;
            lost = lost || jj > j;
        }
        if (ready)
            score(f, j, (char **)vals, G);
        for (int k = 0; k < G; k++) {
            free(vals[k]);
            vals[k] = NULL;
        }
        if (!ready && !lost)
            break; /* some node has not finished it yet */
        f->score_next++; /* scored, or overwritten in its slot by a later one: skipped */
    }
    for (int k = 0; keys && k < G; k++)
        free(keys[k]);
    free(keys);
    free(vals);
    free(lens);
}

/* ---- the agent's calls ---------------------------------------------------------------------- */

static void close_round(dt_agent_flight *f)
{
    for (int i = 0; i < f->nfr; i++)
        dt_flightrec_close(&f->fr[i]);
    free(f->fr);
    f->fr = NULL;
    f->nfr = 0;
    dt_store_free(f->st);
    dt_store_free(f->base);
    f->st = f->base = NULL;
    free(f->flagged);
    free(f->nodes);
    f->flagged = NULL;
    f->nodes = NULL;
}

void dt_agent_flight_round(dt_agent_flight **out, const dt_agent_flight_opts *o,
                           const dt_rdzv_round *rd, int nproc, const char *run_dir,
                           dt_events *ev, dt_rdzv *rz)
{
    if (o->records <= 0)
        return;
    dt_agent_flight *f = *out;
    if (!f && !(f = *out = calloc(1, sizeof *f)))
        return;
    close_round(f);
    f->o = *o;
    f->rd = *rd;
    f->nproc = nproc;
    f->ev = ev;
    f->rz = rz;
    f->seen = f->await = 0;
    f->watchdog_fired = f->round_failed = f->round_failed_told = f->warned = false;
    f->published = f->score_next = -1;
    f->next_tick = 0;
    dt_strlcpy(f->run_dir, run_dir, sizeof f->run_dir);
    dt_err e = {0};
    fmt(f->dir, sizeof f->dir, "%s/flight", run_dir);
    if (dt_mkdir_p(f->dir, &e))
        DT_WARN("flight records: %s", e.msg);
    if (!(f->fr = calloc((size_t)nproc, sizeof *f->fr)) ||
        !(f->flagged = calloc((size_t)(rd->world_size > 0 ? rd->world_size : 1), sizeof *f->flagged)) ||
        !(f->nodes = calloc((size_t)(rd->group_world_size > 0 ? rd->group_world_size : 1),
                            sizeof *f->nodes)))
        return;
    for (int k = 0; k < rd->group_world_size; k++)
        f->nodes[k].rank_base = -1;
    for (int i = 0; i < nproc; i++) {
        if (dt_flightrec_create(&f->fr[i], (uint32_t)o->records, rd->rank_base + i, i, &e)) {
            DT_WARN("flight records of rank %d: %s", rd->rank_base + i, e.msg);
            break;
        }
        f->nfr++;
    }
    if (o->straggler_ratio > 0 && o->straggler_ratio < 1 && is_node0(f))
        DT_WARN("train.straggler_ratio = %g is below 1, which would flag every rank: no "
                "straggler scores", o->straggler_ratio);
    /* the store, at the round's address; a prefix of the round's own */
    dt_store_opts so;
    dt_store_opts_default(&so);
    /* short: the agent's loop waits for every call (a store that is gone costs one connect) */
    so.connect_timeout_ms = 1000;
    so.timeout_ms = 3000;
    char prefix[DT_RDZV_STR + 64];
    fmt(prefix, sizeof prefix, "dtrain-flight/%s/r%d-%d/", rd->run_id, rd->round,
        rd->master_port);
    if (dt_store_connect(&f->base, rd->store_addr, rd->store_port, &so, &e) ||
        dt_store_prefixed(&f->st, f->base, prefix, &e)) {
        store_warn(f, "cannot reach the store", &e);
        dt_store_free(f->base);
        f->base = NULL;
        return;
    }
    cJSON *me = cJSON_CreateObject();
    cJSON_AddNumberToObject(me, "node", rd->group_rank);
    cJSON_AddStringToObject(me, "host", dt_hostname());
    cJSON_AddNumberToObject(me, "pid", (int)getpid());
    cJSON_AddNumberToObject(me, "rank_base", rd->rank_base);
    cJSON_AddNumberToObject(me, "nproc", nproc);
    char *t = cJSON_PrintUnformatted(me), key[32];
    cJSON_Delete(me);
    snprintf(key, sizeof key, "node/%d", rd->group_rank);
    if (t && dt_store_set(f->st, key, t, strlen(t), &e))
        store_warn(f, "publishing this node", &e);
    free(t);
}

int dt_agent_flight_fd(const dt_agent_flight *f, int local_rank)
{
    if (!f || local_rank < 0 || local_rank >= f->nfr)
        return 0;
    return f->fr[local_rank].fd > 2 ? f->fr[local_rank].fd : 0;
}

bool dt_agent_flight_tick(dt_agent_flight *f, int *ms)
{
    if (!f)
        return false;
    double now = dt_now_s();
    if (now < f->next_tick) {
        int left = (int)((f->next_tick - now) * 1000) + 1;
        if (*ms < 0 || *ms > left)
            *ms = left;
        return false;
    }
    f->next_tick = now + DT_AGENT_FLIGHT_TICK_S;
    if (*ms < 0 || *ms > (int)(DT_AGENT_FLIGHT_TICK_S * 1000))
        *ms = (int)(DT_AGENT_FLIGHT_TICK_S * 1000);
    poll_request(f);
    poll_dumps(f);
    take_verdict(f, 0);
    watchdog(f);
    if (scoring(f)) {
        publish_windows(f);
        if (is_node0(f))
            score_windows(f);
    }
    if (f->round_failed && !f->round_failed_told) {
        f->round_failed_told = true;
        return true;
    }
    return false;
}

void dt_agent_flight_signal(dt_agent_flight *f, int sig)
{
    if (!f || sig != SIGUSR1)
        return;
    char why[128];
    fmt(why, sizeof why, "SIGUSR1 to the agent of node %d (pid %d)", f->rd.group_rank,
        (int)getpid());
    int64_t n = trigger(f, "request", why);
    if (!n)
        return;
    /* every node's records before the signal goes on to the workers (which then stop) */
    poll_dumps(f);
    if (!is_node0(f))
        take_verdict(f, (int)(DT_AGENT_FLIGHT_VERDICT_S * 1000));
}

/* This node's first failed worker that failed in the comm layer: its rank and message. */
static bool comm_failure(dt_agent_flight *f, int *rank, char *msg, size_t cap, bool *timeout)
{
    for (int i = 0; i < f->nfr; i++) {
        dt_flightrec_snap s;
        if (dt_flightrec_snapshot(&f->fr[i], &s, true, NULL))
            continue;
        bool failed = s.error[0] != '\0';
        int err = 0;
        for (size_t k = 0; k < s.n; k++)
            if (s.recs[k].state == DT_FLIGHTREC_FAILED) {
                failed = true;
                err = s.recs[k].err;
            }
        if (failed) {
            *rank = s.rank;
            dt_strlcpy(msg, s.error[0] ? s.error : "a collective failed", cap);
            *timeout = err == -ETIMEDOUT || strstr(s.error, "timed out") ||
                       strstr(s.error, "timeout");
        }
        dt_flightrec_snap_free(&s);
        if (failed)
            return true;
    }
    return false;
}

void dt_agent_flight_stopping(dt_agent_flight *f, bool local_failed)
{
    if (!f || !f->st)
        return;
    int rank = -1;
    bool timeout = false;
    char msg[480], why[640];
    if (local_failed && comm_failure(f, &rank, msg, sizeof msg, &timeout)) {
        fmt(why, sizeof why, "%s on rank %d: %s", timeout ? "collective timeout" : "comm failure",
            rank, msg);
        trigger(f, timeout ? "timeout" : "failure", why);
        /* the round's first failure dump, this node's or another's (which may be asked for a
         * moment later): answered here, and node 0 makes its verdict here. Another node waits
         * for it while node 0 has taken the dump up (ack/<n>): a node 0 that is gone must not
         * hold this node's failure back (the rendezvous would see a lost node first) */
        double t0 = dt_now_s(), until = t0 + DT_AGENT_FLIGHT_VERDICT_S;
        while (dt_now_s() < until) {
            poll_dumps(f);
            void *v = NULL;
            size_t len = 0;
            if (!f->st || dt_store_get(f->st, "failverdict", &v, &len, 100, NULL) == 0) {
                free(v);
                break;
            }
            char ack[64];
            snprintf(ack, sizeof ack, "ack/%lld", (long long)(f->await ? f->await : f->seen));
            if (!is_node0(f) && dt_now_s() - t0 > DT_AGENT_FLIGHT_ACK_S && f->st &&
                dt_store_get(f->st, ack, &v, &len, 0, NULL) != 0) {
                DT_WARN("flight records: node 0's agent did not take up the dump in %g s (gone "
                        "or stuck): no hang verdict", DT_AGENT_FLIGHT_ACK_S);
                break;
            }
            free(v);
        }
        take_verdict(f, 500);
        return;
    }
    poll_dumps(f); /* a dump asked for while this node's round ended */
}

void dt_agent_flight_free(dt_agent_flight *f)
{
    if (!f)
        return;
    close_round(f);
    free(f);
}
