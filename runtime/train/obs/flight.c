/* flight.c - the trainer's flight records: see flight.h.
 *
 * State is process-wide (one trainer per process). The position has one writer, the trainer's
 * thread (the thread that calls dt_flight_step_begin; until then the one that opened); the comm
 * observer's callbacks run on whatever thread issues or waits (the DDP reducer's, a pipeline's
 * engine caller) and read the step and phase through atomics. Groups are registered under a
 * mutex the first time a call names them (at most DT_FLIGHTREC_GROUPS; a communicator of another
 * world than the job's, DP's replicas' own, is not recorded: its ranks are not the job's).
 */
#include "runtime/train/obs/flight.h"

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/comm/comm.h"
#include "runtime/train/obs/trace.h"

enum fault_kind { FAULT_NONE, FAULT_SKIP, FAULT_P2P_SIZE, FAULT_STALL };

#define WIN_VALS 4096 /* steps of a window whose compute times are kept for the median */

static struct {
    bool open, agent;
    dt_flightrec fr;
    int rank, world;
    int window;                    /* K (0: no windows) */
    double ratio;                  /* train.straggler_ratio */
    /* the position: written by the trainer's thread, read by the observer's */
    dt_flightrec_pos pos;
    _Atomic int64_t step;
    _Atomic int phase, micro;
    /* the step's accounting (the trainer's thread) */
    uint64_t step_t0, step_wait;
    int64_t win_index;
    int win_steps;
    uint64_t win_compute, win_wait;
    uint64_t *win_vals;            /* (min(K, WIN_VALS)) each step's compute time */
    /* groups: uid -> index in the mapping (-1: not recorded) */
    pthread_mutex_t mu;
    int ngroups;
    uint64_t uid[2 * DT_FLIGHTREC_GROUPS];
    int idx[2 * DT_FLIGHTREC_GROUPS];
    /* the fault */
    enum fault_kind fault;
    int f_rank;
    int64_t f_step;
    double f_secs;
    char f_group[16];
    atomic_bool f_fired;
} F = {.mu = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local bool on_trainer_thread;
/* the call this thread waits on (for the trace's wait span) */
static _Thread_local uint64_t waiting_token;

/* ---- DTRAIN_FAULT ------------------------------------------------------------------------- */

static int parse_fault(const char *spec, dt_err *err)
{
    F.fault = FAULT_NONE;
    if (!spec || !*spec)
        return 0;
    char buf[256];
    if (!dt_strlcpy(buf, spec, sizeof buf))
        return dt_err_set(err, -EINVAL, "DTRAIN_FAULT: too long");
    bool have_rank = false, have_step = false;
    F.f_secs = 3600;
    F.f_group[0] = '\0';
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *colon = strchr(kv, ':');
        if (!colon)
            return dt_err_set(err, -EINVAL, "DTRAIN_FAULT=%s: \"%s\" is not key:value (use "
                              "rank:R,step:S,kind:skip-collective|p2p-size|stall-data)",
                              spec, kv);
        *colon = '\0';
        const char *k = kv, *v = colon + 1;
        char *end = NULL;
        if (!strcmp(k, "rank")) {
            F.f_rank = (int)strtol(v, &end, 10);
            have_rank = end != v && !*end && F.f_rank >= 0;
        } else if (!strcmp(k, "step")) {
            F.f_step = strtoll(v, &end, 10);
            have_step = end != v && !*end && F.f_step >= 1;
        } else if (!strcmp(k, "secs")) {
            F.f_secs = strtod(v, &end);
            if (end == v || *end || !(F.f_secs >= 0))
                return dt_err_set(err, -EINVAL, "DTRAIN_FAULT: secs:%s is not a duration", v);
        } else if (!strcmp(k, "group")) {
            dt_strlcpy(F.f_group, v, sizeof F.f_group);
        } else if (!strcmp(k, "kind")) {
            F.fault = !strcmp(v, "skip-collective") ? FAULT_SKIP
                      : !strcmp(v, "p2p-size")      ? FAULT_P2P_SIZE
                      : !strcmp(v, "stall-data")    ? FAULT_STALL
                                                    : FAULT_NONE;
            if (F.fault == FAULT_NONE)
                return dt_err_set(err, -EINVAL, "DTRAIN_FAULT: kind:%s is not a fault (use "
                                  "skip-collective, p2p-size or stall-data)", v);
        } else {
            return dt_err_set(err, -EINVAL, "DTRAIN_FAULT: unknown key \"%s\" (rank, step, kind, "
                              "secs, group)", k);
        }
    }
    if (F.fault == FAULT_NONE || !have_rank || !have_step) {
        F.fault = FAULT_NONE;
        return dt_err_set(err, -EINVAL, "DTRAIN_FAULT=%s needs rank:R (>= 0), step:S (>= 1) and "
                          "kind:K", spec);
    }
    return 0;
}

/* Whether the fault fires now on this rank (once). */
static bool fault_fires(enum fault_kind k, bool exact_step)
{
    if (F.fault != k || F.rank != F.f_rank)
        return false;
    int64_t step = atomic_load_explicit(&F.step, memory_order_relaxed);
    if (exact_step ? step != F.f_step : step < F.f_step)
        return false;
    bool no = false;
    return atomic_compare_exchange_strong(&F.f_fired, &no, true);
}

/* ---- the comm observer ------------------------------------------------------------------- */

/* The group's index in the mapping (registering it), -1 when it is not recorded. */
static int group_index(const dt_comm_call *c)
{
    pthread_mutex_lock(&F.mu);
    int idx = -1;
    for (int i = 0; i < F.ngroups; i++)
        if (F.uid[i] == c->group_id) {
            idx = F.idx[i];
            goto out;
        }
    if (F.ngroups >= (int)DT_ARRAY_LEN(F.uid))
        goto out;
    if (!(strcmp(c->group, "world") == 0 && c->group_size != F.world)) {
        dt_flightrec_group g;
        memset(&g, 0, sizeof g);
        dt_strlcpy(g.label, c->group, sizeof g.label);
        g.uid = c->group_id;
        g.size = c->group_size;
        g.rank = c->group_rank;
        if (c->members) {
            g.nmembers = c->group_size < DT_FLIGHTREC_MEMBERS ? c->group_size
                                                              : DT_FLIGHTREC_MEMBERS;
            for (int i = 0; i < g.nmembers; i++)
                g.members[i] = c->members[i];
        }
        idx = dt_flightrec_add_group(&F.fr, &g);
    }
    F.uid[F.ngroups] = c->group_id;
    F.idx[F.ngroups++] = idx;
out:
    pthread_mutex_unlock(&F.mu);
    return idx;
}

static uint64_t obs_issue(void *arg, const dt_comm_call *c, int *action)
{
    (void)arg;
    int g = group_index(c);
    if (g < 0)
        return 0;
    bool p2p = c->op == DT_COMM_OP_SEND || c->op == DT_COMM_OP_RECV;
    if (!p2p && fault_fires(FAULT_SKIP, false)) {
        if (F.f_group[0] && strcmp(F.f_group, c->group) != 0) {
            atomic_store(&F.f_fired, false); /* not its group: wait for one that is */
        } else {
            DT_WARN("DTRAIN_FAULT: rank %d skips %s #%llu of group %s at step %lld (a test hook)",
                    F.rank, dt_comm_op_name(c->op), (unsigned long long)c->seq, c->group,
                    (long long)atomic_load(&F.step));
            *action = DT_COMM_OBS_SKIP;
            return 0; /* never issued: no record */
        }
    }
    size_t count = c->count;
    if (c->op == DT_COMM_OP_RECV && fault_fires(FAULT_P2P_SIZE, false)) {
        DT_WARN("DTRAIN_FAULT: rank %d receives %zu instead of %zu elements from rank %d "
                "(recv #%llu of group %s, step %lld; a test hook)",
                F.rank, count / 2, count, c->peer, (unsigned long long)c->seq, c->group,
                (long long)atomic_load(&F.step));
        *action = DT_COMM_OBS_HALVE;
        count /= 2;
    }
    dt_flightrec_rec r;
    memset(&r, 0, sizeof r);
    r.state = DT_FLIGHTREC_QUEUED;
    r.op = (uint8_t)c->op;
    r.dtype = (uint8_t)c->dtype;
    r.group = (uint8_t)g;
    r.seq = c->seq;
    r.count = count;
    r.peer = c->peer;
    r.step = (int32_t)atomic_load_explicit(&F.step, memory_order_relaxed);
    r.phase = (uint8_t)atomic_load_explicit(&F.phase, memory_order_relaxed);
    int micro = atomic_load_explicit(&F.micro, memory_order_relaxed);
    r.micro = (uint8_t)(micro < 0 ? 0 : micro > 255 ? 255 : micro);
    r.t_issue = dt_now_ns();
    return dt_flightrec_issue(&F.fr, &r);
}

static void obs_wait(void *arg, uint64_t token)
{
    (void)arg;
    dt_flightrec_update(&F.fr, token, DT_FLIGHTREC_STARTED, dt_now_ns(), 0);
    waiting_token = token;
}

static void obs_end(void *arg, uint64_t token, int rc, uint64_t done_ns, const char *msg)
{
    (void)arg;
    dt_flightrec_update(&F.fr, token, rc ? DT_FLIGHTREC_FAILED : DT_FLIGHTREC_DONE, done_ns, rc);
    if (rc)
        dt_flightrec_set_error(&F.fr, msg && *msg ? msg : "a collective failed");
}

/* The trace's names of waits (literals: the trace keeps names by pointer). */
static const char *wait_name(int op)
{
    static const char *const names[DT_COMM_OP_COUNT] = {
        [DT_COMM_OP_ALLREDUCE] = "wait allreduce", [DT_COMM_OP_REDUCE] = "wait reduce",
        [DT_COMM_OP_BROADCAST] = "wait broadcast", [DT_COMM_OP_ALLGATHER] = "wait allgather",
        [DT_COMM_OP_REDUCE_SCATTER] = "wait reduce_scatter",
        [DT_COMM_OP_BARRIER] = "wait barrier", [DT_COMM_OP_SEND] = "wait send",
        [DT_COMM_OP_RECV] = "wait recv"};
    return op >= 0 && op < DT_COMM_OP_COUNT ? names[op] : "wait";
}

static void obs_blocked(void *arg, uint64_t t0, uint64_t t1)
{
    (void)arg;
    uint64_t tok = waiting_token;
    waiting_token = 0;
    if (!on_trainer_thread)
        return;
    F.step_wait += t1 - t0;
    if (!dt_trace_begin())
        return;
    dt_trace_span s = {.t0 = t0, .t1 = t1, .cat = DT_TRACE_COMM, .name = "wait",
                       .track = "waits"};
    if (tok) {
        const dt_flightrec_rec *r = &F.fr.recs[(tok - 1) % F.fr.hdr->capacity];
        if (r->id == tok) { /* this thread's own record: no writer races it but the end */
            s.name = wait_name(r->op);
            s.key[0] = "seq";
            s.value[0] = (int64_t)r->seq;
            s.key[1] = "group";
            s.value[1] = r->group;
        }
    }
    dt_trace_add(&s);
}

/* ---- the position -------------------------------------------------------------------------- */

static dt_trace_cat phase_cat(int p)
{
    switch (p) {
    case DT_PHASE_DATA:
        return DT_TRACE_DATA;
    case DT_PHASE_FORWARD:
        return DT_TRACE_FORWARD;
    case DT_PHASE_BACKWARD:
        return DT_TRACE_BACKWARD;
    case DT_PHASE_GRAD_SYNC:
        return DT_TRACE_COMM;
    case DT_PHASE_OPTIM:
        return DT_TRACE_OPTIM;
    case DT_PHASE_EVAL:
        return DT_TRACE_EVAL;
    case DT_PHASE_CKPT:
        return DT_TRACE_CKPT;
    default:
        return DT_TRACE_OTHER;
    }
}

static void publish(void)
{
    atomic_store_explicit(&F.step, F.pos.step, memory_order_relaxed);
    atomic_store_explicit(&F.phase, F.pos.phase, memory_order_relaxed);
    atomic_store_explicit(&F.micro, F.pos.micro, memory_order_relaxed);
    dt_flightrec_set_pos(&F.fr, &F.pos);
}

/* The phases' names on the trace's "phases" track (literals; apart from the spans of the same
 * work on the training thread's track, which tools count by name). */
static const char *phase_span_name(int p)
{
    static const char *const names[DT_PHASE_COUNT] = {
        "phase none",          "phase init",      "phase data",       "phase forward",
        "phase backward",      "phase gradient sync", "phase optimiser", "phase evaluation",
        "phase checkpoint",    "phase end"};
    return p >= 0 && p < DT_PHASE_COUNT ? names[p] : "phase";
}

/* The phase p from now (the previous one becomes a span of the trace). */
static void set_phase(dt_flightrec_phase p, uint64_t now)
{
    if (F.pos.phase != (int)p && F.pos.phase_since && dt_trace_begin()) {
        dt_trace_span s = {.t0 = F.pos.phase_since, .t1 = now, .cat = phase_cat(F.pos.phase),
                           .name = phase_span_name(F.pos.phase), .track = "phases"};
        if (s.t1 > s.t0)
            dt_trace_add(&s);
    }
    if (F.pos.phase != (int)p)
        F.pos.phase_since = now;
    F.pos.phase = (int)p;
}

/* The stall fault: sleeps (in the data phase just published) until secs have passed or a
 * signal arrives. */
static void stall(void)
{
    DT_WARN("DTRAIN_FAULT: rank %d stalls in its data phase of step %lld for %g s (a test hook)",
            F.rank, (long long)F.pos.step, F.f_secs);
    double until = dt_now_s() + F.f_secs;
    for (;;) {
        double left = until - dt_now_s();
        if (left <= 0)
            break;
        if (left > 0.1)
            left = 0.1;
        struct timespec ts = {0, (long)(left * 1e9)};
        if (nanosleep(&ts, NULL) != 0 && errno == EINTR)
            break; /* stopped: let the worker see its signal */
    }
}

void dt_flight_phase(dt_flightrec_phase p)
{
    if (!F.open || (F.pos.phase == DT_PHASE_END && p != DT_PHASE_DATA))
        return; /* after the last step: the final evaluation and save are the end (no watchdog) */
    set_phase(p, dt_now_ns());
    publish();
    if (p == DT_PHASE_DATA && fault_fires(FAULT_STALL, true))
        stall();
}

void dt_flight_step_begin(int64_t step)
{
    if (!F.open)
        return;
    on_trainer_thread = true;
    uint64_t now = dt_now_ns();
    F.pos.step = step;
    F.pos.micro = 0;
    if (!F.pos.first_step)
        F.pos.first_step = now;
    F.step_t0 = now;
    F.step_wait = 0;
    dt_flight_phase(DT_PHASE_DATA);
}

void dt_flight_micro(int micro)
{
    if (!F.open)
        return;
    F.pos.micro = micro;
    if (micro > 0)
        dt_flight_phase(DT_PHASE_DATA);
    else
        publish();
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

void dt_flight_step_end(void)
{
    if (!F.open || !F.step_t0)
        return;
    uint64_t now = dt_now_ns();
    uint64_t wall = now - F.step_t0, wait = F.step_wait < wall ? F.step_wait : wall;
    F.pos.last_step_end = now;
    F.pos.steps_done++;
    F.pos.micro = -1;
    publish();
    if (F.window <= 0)
        return;
    int64_t step = F.pos.step, index = (step - 1) / F.window;
    if (F.win_steps && index != F.win_index) { /* cannot happen in order; start afresh */
        F.win_steps = 0;
        F.win_compute = F.win_wait = 0;
    }
    F.win_index = index;
    if (F.win_vals && F.win_steps < WIN_VALS)
        F.win_vals[F.win_steps] = wall - wait;
    F.win_steps++;
    F.win_compute += wall - wait;
    F.win_wait += wait;
    if (step % F.window == 0) {
        int nv = F.win_steps < WIN_VALS ? F.win_steps : WIN_VALS;
        uint64_t median = 0;
        if (F.win_vals && nv > 0) {
            qsort(F.win_vals, (size_t)nv, sizeof *F.win_vals, cmp_u64);
            median = F.win_vals[(nv - 1) / 2];
        }
        dt_flightrec_window w = {.steps = F.win_steps, .index = index,
                                 .compute_ns = F.win_compute, .wait_ns = F.win_wait,
                                 .median_ns = median};
        dt_flightrec_add_window(&F.fr, &w);
        F.win_steps = 0;
        F.win_compute = F.win_wait = 0;
    }
}

/* ---- open, close --------------------------------------------------------------------------- */

int dt_flight_open(const dt_flight_opts *o, dt_err *err)
{
    if (F.open)
        return dt_err_set(err, -EBUSY, "flight records: already open");
    int rc = parse_fault(dt_env("DTRAIN_FAULT"), err);
    if (rc)
        return rc;
    if ((rc = dt_flightrec_attach(&F.fr, o->fd, o->records, o->world_size, err)))
        return rc;
    F.agent = o->fd >= 0;
    F.rank = o->rank;
    F.world = o->world_size;
    F.window = o->straggler_window;
    F.ratio = o->straggler_ratio;
    free(F.win_vals);
    F.win_vals = F.window > 0 ? calloc((size_t)(F.window < WIN_VALS ? F.window : WIN_VALS),
                                       sizeof *F.win_vals)
                              : NULL;
    F.ngroups = 0;
    atomic_store(&F.f_fired, false);
    for (int i = 0; i < DT_COMM_OP_COUNT && i < DT_FLIGHTREC_NAMES; i++)
        dt_flightrec_name_op(&F.fr, i, dt_comm_op_name((dt_comm_op)i));
    for (int i = 0; i < DT_FLIGHTREC_NAMES; i++)
        if (dt_dtype_valid(i))
            dt_flightrec_name_dtype(&F.fr, i, dt_dtype_name((dt_dtype)i));
    memset(&F.pos, 0, sizeof F.pos);
    F.pos.micro = -1;
    F.step_t0 = 0;
    F.win_steps = 0;
    F.win_compute = F.win_wait = 0;
    F.open = true;
    on_trainer_thread = true;
    set_phase(DT_PHASE_INIT, dt_now_ns());
    publish();
    dt_comm_observer ob = {.issue = obs_issue, .wait = obs_wait, .end = obs_end,
                           .blocked = obs_blocked};
    dt_comm_set_observer(&ob);
    if (F.fault != FAULT_NONE && F.rank == F.f_rank)
        DT_WARN("DTRAIN_FAULT=%s is set: this rank injects a fault (a test hook)",
                dt_env("DTRAIN_FAULT"));
    return 0;
}

void dt_flight_close(void)
{
    if (!F.open)
        return;
    dt_comm_set_observer(NULL);
    F.open = false;
    free(F.win_vals);
    F.win_vals = NULL;
    dt_flightrec_close(&F.fr);
}

bool dt_flight_has_agent(void)
{
    return F.open && F.agent;
}

bool dt_flight_scoring(void)
{
    return F.open && F.agent && F.world > 1 && F.ratio >= 1 && F.window > 0;
}

int dt_flight_stragglers(int *ranks, int cap)
{
    return F.open ? dt_flightrec_get_stragglers(&F.fr, ranks, cap) : 0;
}
