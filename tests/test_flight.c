/* test_flight.c - the flight records' pieces alone: the shared mapping (runtime/job/flightrec:
 * records, wrap-around, torn reads, a late completion of an overwritten record, the position,
 * windows and the agent's straggler list), the comm layer's observer (sequence numbers, labels,
 * the skip action), the trainer's side (runtime/train/obs/flight: records and phases through a
 * communicator, DTRAIN_FAULT's checks) and the hang verdict on hand-made inputs, one per cause
 * (runtime/launch/flight_verdict). The five hangs end to end are tests/test_hang.c.
 */
#include <cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/comm/comm.h"
#include "runtime/job/flightrec.h"
#include "runtime/launch/flight_verdict.h"
#include "runtime/train/obs/flight.h"
#include "tests/harness.h"

/* ---- the mapping ------------------------------------------------------------------------- */

static void test_mapping_round_trip(void)
{
    dt_flightrec agent, worker;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_flightrec_create(&agent, 4, 3, 1, &e), &e);
    int fd = dup(agent.fd); /* the worker's inherited copy (attach closes it) */
    DT_REQUIRE(fd > 2);
    DT_REQUIRE_OK(dt_flightrec_attach(&worker, fd, 0, 8, &e), &e);
    dt_flightrec_name_op(&worker, 0, "allreduce");
    dt_flightrec_name_dtype(&worker, 0, "float32");
    dt_flightrec_group g = {.label = "data", .uid = 0xabcdef, .size = 2, .rank = 1,
                            .nmembers = 2, .members = {5, 3}};
    DT_CHECK_INT(dt_flightrec_add_group(&worker, &g), 0);
    uint64_t ids[10];
    for (int i = 0; i < 10; i++) {
        dt_flightrec_rec r = {.state = DT_FLIGHTREC_QUEUED, .seq = (uint64_t)i + 1,
                              .count = 100 + (uint64_t)i, .peer = -1, .step = 7,
                              .phase = DT_PHASE_BACKWARD, .t_issue = 1000 + (uint64_t)i};
        ids[i] = dt_flightrec_issue(&worker, &r);
        DT_CHECK_INT(ids[i], i + 1);
    }
    dt_flightrec_update(&worker, ids[9], DT_FLIGHTREC_STARTED, 5000, 0);
    dt_flightrec_update(&worker, ids[8], DT_FLIGHTREC_FAILED, 6000, -ETIMEDOUT);
    dt_flightrec_update(&worker, ids[1], DT_FLIGHTREC_DONE, 7000, 0); /* overwritten: dropped */
    dt_flightrec_set_error(&worker, "allreduce #9 timed out");
    dt_flightrec_set_error(&worker, "a later one");
    dt_flightrec_pos p = {.phase = DT_PHASE_DATA, .step = 7, .micro = 1, .phase_since = 42,
                          .first_step = 1, .last_step_end = 40, .steps_done = 6};
    dt_flightrec_set_pos(&worker, &p);
    for (int w = 0; w < 10; w++) {
        dt_flightrec_window win = {.steps = 5, .index = w, .compute_ns = 10, .wait_ns = 2,
                                   .median_ns = 3};
        dt_flightrec_add_window(&worker, &win);
    }
    int ranks[] = {4, 1};
    dt_flightrec_set_stragglers(&agent, ranks, 2);
    int got[8];
    DT_CHECK_INT(dt_flightrec_get_stragglers(&worker, got, 8), 2);
    DT_CHECK_INT(got[0], 4);
    DT_CHECK_INT(got[1], 1);

    dt_flightrec_snap s;
    DT_REQUIRE_OK(dt_flightrec_snapshot(&agent, &s, true, &e), &e);
    DT_CHECK_INT(s.pid, getpid());
    DT_CHECK_INT(s.rank, 3);
    DT_CHECK_INT(s.local_rank, 1);
    DT_CHECK_INT(s.world_size, 8);
    DT_CHECK_INT(s.issued, 10);
    DT_CHECK_INT(s.n, 4); /* the ring keeps the last 4 */
    DT_CHECK_INT(s.torn, 0);
    for (size_t i = 0; i < s.n; i++)
        DT_CHECK_INT(s.recs[i].id, 7 + i);
    DT_CHECK_INT(s.recs[3].state, DT_FLIGHTREC_STARTED);
    DT_CHECK_INT(s.recs[3].t_start, 5000);
    DT_CHECK_INT(s.recs[2].state, DT_FLIGHTREC_FAILED);
    DT_CHECK_INT(s.recs[2].err, -ETIMEDOUT);
    DT_CHECK_INT(s.recs[0].count, 106);
    DT_CHECK_STR(s.error, "allreduce #9 timed out");
    DT_CHECK_STR(s.op_names[0], "allreduce");
    DT_CHECK_STR(s.dtype_names[0], "float32");
    DT_CHECK_INT(s.ngroups, 1);
    DT_CHECK_STR(s.groups[0].label, "data");
    DT_CHECK_INT(s.groups[0].members[0], 5);
    DT_CHECK(!s.pos_torn);
    DT_CHECK_INT(s.pos.step, 7);
    DT_CHECK_INT(s.pos.phase, DT_PHASE_DATA);
    DT_CHECK_INT(s.pos.phase_since, 42);
    DT_CHECK_INT(s.nwindows, DT_FLIGHTREC_WINDOWS); /* the last 8 of 10, oldest first */
    DT_CHECK_INT(s.windows[0].index, 2);
    DT_CHECK_INT(s.windows[DT_FLIGHTREC_WINDOWS - 1].index, 9);
    dt_flightrec_snap_free(&s);

    /* a writer stopped mid-record (its counter odd): that record is torn, the rest whole */
    atomic_fetch_add(&agent.recs[1].ver, 1);
    atomic_fetch_add(&agent.hdr->pos.ver, 1);
    DT_REQUIRE_OK(dt_flightrec_snapshot(&agent, &s, true, &e), &e);
    DT_CHECK_INT(s.torn, 1);
    DT_CHECK_INT(s.n, 3);
    DT_CHECK(s.pos_torn);
    dt_flightrec_snap_free(&s);
    /* without the records: the position and windows only */
    DT_REQUIRE_OK(dt_flightrec_snapshot(&agent, &s, false, &e), &e);
    DT_CHECK_INT(s.n, 0);
    DT_CHECK(s.recs == NULL);
    dt_flightrec_close(&worker);
    dt_flightrec_close(&agent);
    /* not a mapping */
    dt_flightrec bad = {0};
    DT_CHECK(dt_flightrec_snapshot(&bad, &s, true, &e) == -EPROTO);
    DT_CHECK(dt_flightrec_create(&bad, 0, 0, 0, &e) == -EINVAL);
}

/* ---- the comm layer's observer ------------------------------------------------------------- */

static struct {
    int n;
    dt_comm_call c[32];
    char label[32][16];
    int waits, ends, fails, skip_next;
    uint64_t blocked;
} seen;

static uint64_t ob_issue(void *arg, const dt_comm_call *c, int *action)
{
    (void)arg;
    if (seen.n < 32) {
        seen.c[seen.n] = *c;
        dt_strlcpy(seen.label[seen.n], c->group, sizeof seen.label[0]);
    }
    seen.n++;
    if (seen.skip_next) {
        seen.skip_next = 0;
        *action = DT_COMM_OBS_SKIP;
    }
    return (uint64_t)seen.n;
}
static void ob_wait(void *arg, uint64_t t)
{
    (void)arg;
    (void)t;
    seen.waits++;
}
static void ob_end(void *arg, uint64_t t, int rc, uint64_t done, const char *msg)
{
    (void)arg;
    (void)t;
    (void)done;
    (void)msg;
    seen.ends++;
    seen.fails += rc != 0;
}
static void ob_blocked(void *arg, uint64_t t0, uint64_t t1)
{
    (void)arg;
    seen.blocked += t1 - t0;
}

static dt_comm *world_of_one(void)
{
    dt_comm_opts o;
    dt_comm_opts_default(&o);
    o.rank = 0;
    o.world_size = 1;
    o.run_id = "flight-test";
    dt_comm *c = NULL;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_comm_init(&c, NULL, &o, &e), &e);
    return c;
}

static void test_observer(void)
{
    memset(&seen, 0, sizeof seen);
    dt_comm_observer ob = {.issue = ob_issue, .wait = ob_wait, .end = ob_end,
                           .blocked = ob_blocked};
    dt_comm_set_observer(&ob);
    dt_comm *c = world_of_one();
    DT_CHECK_STR(dt_comm_label(c), "world");
    float buf[4] = {1, 2, 3, 4};
    dt_err e = {0};
    dt_comm_work *w = NULL;
    DT_CHECK_INT(dt_comm_allreduce(c, buf, 4, DT_FLOAT32, DT_SUM, &w, &e), 0);
    DT_CHECK_INT(dt_comm_wait(c, w, &e), 0);
    DT_CHECK_INT(dt_comm_broadcast(c, buf, 4, DT_FLOAT32, 0, NULL, &e), 0);
    seen.skip_next = 1; /* the fault hook: this one is not run and takes no number */
    DT_CHECK_INT(dt_comm_allreduce(c, buf, 2, DT_FLOAT32, DT_SUM, NULL, &e), 0);
    DT_CHECK_INT(dt_comm_barrier(c, &e), 0);
    dt_comm_set_label(c, "data");
    DT_CHECK_INT(dt_comm_allreduce(c, buf, 1, DT_FLOAT32, DT_MAX, NULL, &e), 0);
    DT_CHECK_INT(seen.n, 5);
    DT_CHECK_INT(seen.c[0].seq, 1);
    DT_CHECK_INT(seen.c[0].op, DT_COMM_OP_ALLREDUCE);
    DT_CHECK_INT(seen.c[0].count, 4);
    DT_CHECK_INT(seen.c[1].seq, 2);
    DT_CHECK_INT(seen.c[1].op, DT_COMM_OP_BROADCAST);
    DT_CHECK_INT(seen.c[1].peer, 0); /* the root's global rank */
    DT_CHECK_INT(seen.c[2].seq, 3);  /* skipped: its number goes to the next call */
    DT_CHECK_INT(seen.c[3].seq, 3);
    DT_CHECK_INT(seen.c[3].op, DT_COMM_OP_BARRIER);
    DT_CHECK_INT(seen.c[4].seq, 4);
    DT_CHECK_STR(seen.label[3], "world");
    DT_CHECK_STR(seen.label[4], "data");
    DT_CHECK(seen.c[4].group_id == seen.c[0].group_id && seen.c[0].group_id != 0);
    DT_CHECK_INT(seen.ends, 5);   /* the skipped one ends at once, as done */
    DT_CHECK_INT(seen.fails, 0);
    DT_CHECK_INT(seen.waits, 4);  /* the wait of the async one, three blocking calls */
    /* an argument error never reaches the observer */
    DT_CHECK(dt_comm_allreduce(c, buf, 1, DT_INT32, DT_AVG, NULL, &e) == -EINVAL);
    DT_CHECK_INT(seen.n, 5);
    dt_comm_set_observer(NULL);
    DT_CHECK_INT(dt_comm_allreduce(c, buf, 1, DT_FLOAT32, DT_SUM, NULL, &e), 0);
    DT_CHECK_INT(seen.n, 5);
    dt_comm_free(c);
}

/* ---- the trainer's side ------------------------------------------------------------------ */

static void test_trainer_records(void)
{
    dt_flightrec agent;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_flightrec_create(&agent, 64, 0, 0, &e), &e);
    unsetenv("DTRAIN_FAULT");
    dt_flight_opts o = {.rank = 0, .world_size = 1, .fd = dup(agent.fd), .records = 64,
                        .straggler_window = 2, .straggler_ratio = 1.3};
    DT_REQUIRE_OK(dt_flight_open(&o, &e), &e);
    DT_CHECK(dt_flight_has_agent());
    DT_CHECK(!dt_flight_scoring()); /* one rank: nobody to compare */
    dt_comm *c = world_of_one();
    float buf[8] = {0};
    for (int step = 1; step <= 4; step++) {
        dt_flight_step_begin(step);
        dt_flight_micro(0);
        dt_flight_phase(DT_PHASE_FORWARD);
        dt_flight_phase(DT_PHASE_BACKWARD);
        dt_comm_work *w = NULL;
        DT_CHECK_INT(dt_comm_allreduce(c, buf, 8, DT_FLOAT32, DT_SUM, &w, &e), 0);
        dt_flight_phase(DT_PHASE_GRAD_SYNC);
        DT_CHECK_INT(dt_comm_wait(c, w, &e), 0);
        dt_flight_phase(DT_PHASE_OPTIM);
        dt_flight_step_end();
    }
    dt_flight_phase(DT_PHASE_EVAL);
    dt_flightrec_snap s;
    DT_REQUIRE_OK(dt_flightrec_snapshot(&agent, &s, true, &e), &e);
    DT_CHECK_INT(s.n, 4);
    DT_CHECK_INT(s.recs[3].seq, 4);
    DT_CHECK_INT(s.recs[3].step, 4);
    DT_CHECK_INT(s.recs[3].phase, DT_PHASE_BACKWARD); /* issued in backward */
    DT_CHECK_INT(s.recs[3].state, DT_FLIGHTREC_DONE);
    DT_CHECK(s.recs[3].t_end >= s.recs[3].t_issue);
    DT_CHECK_STR(s.op_names[s.recs[3].op], "allreduce");
    DT_CHECK_STR(s.dtype_names[s.recs[3].dtype], "float32");
    DT_CHECK_STR(s.groups[s.recs[3].group].label, "world");
    DT_CHECK_INT(s.pos.phase, DT_PHASE_EVAL);
    DT_CHECK_INT(s.pos.steps_done, 4);
    DT_CHECK_INT(s.nwindows, 2); /* steps 1-2 and 3-4 */
    DT_CHECK_INT(s.windows[1].index, 1);
    DT_CHECK_INT(s.windows[1].steps, 2);
    dt_flightrec_snap_free(&s);
    dt_comm_free(c);
    dt_flight_close();
    dt_flightrec_close(&agent);
}

static void test_fault_spec(void)
{
    static const char *bad[] = {"rank:1", "rank:1,step:0,kind:stall-data",
                                "rank:1,step:2,kind:explode", "rank:x,step:2,kind:p2p-size",
                                "rank:1,step:2,kind:stall-data,secs:-1", "nonsense",
                                "rank:1,step:2,kind:skip-collective,colour:red"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("DTRAIN_FAULT", bad[i], 1);
        dt_flight_opts o = {.rank = 0, .world_size = 1, .fd = -1, .records = 16};
        dt_err e = {0};
        DT_CHECK_MSG(dt_flight_open(&o, &e) == -EINVAL, "DTRAIN_FAULT=%s was accepted", bad[i]);
        DT_CHECK_CONTAINS(e.msg, "DTRAIN_FAULT");
        dt_flight_close();
    }
    setenv("DTRAIN_FAULT", "rank:0,step:2,kind:stall-data,secs:0.2", 1);
    dt_flight_opts o = {.rank = 0, .world_size = 1, .fd = -1, .records = 16};
    dt_err e = {0};
    DT_REQUIRE_OK(dt_flight_open(&o, &e), &e);
    double t0 = dt_now_s();
    dt_flight_step_begin(1);
    DT_CHECK(dt_now_s() - t0 < 0.1);
    dt_flight_step_begin(2); /* the stall, in its data phase */
    DT_CHECK(dt_now_s() - t0 >= 0.19);
    dt_flight_close();
    unsetenv("DTRAIN_FAULT");
}

/* ---- the verdict ------------------------------------------------------------------------------ */

static const double T = 1700000000.0; /* the dump's time */

/* A rank's object: state letter, phase, then its records as "op:count:state:age[:peer]" on
 * group 0 (world of 2), numbered 1, 2, ... (p2p: per peer and direction). */
static cJSON *rank(int r, const char *state, const char *phase, double since_age,
                   const char *recs)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "rank", r);
    cJSON_AddNumberToObject(o, "node", r);
    cJSON_AddStringToObject(o, "host", "h");
    cJSON_AddNumberToObject(o, "pid", 100 + r);
    cJSON_AddNumberToObject(o, "time", T);
    cJSON_AddBoolToObject(o, "alive", strcmp(state, "") != 0);
    cJSON_AddStringToObject(o, "state", state);
    cJSON_AddStringToObject(o, "wchan", state[0] == 'S' ? "hrtimer_nanosleep" : "");
    cJSON_AddStringToObject(o, "exit", state[0] ? "" : "exited");
    cJSON_AddStringToObject(o, "error", "");
    cJSON *p = cJSON_AddObjectToObject(o, "position");
    cJSON_AddNumberToObject(p, "step", 5);
    cJSON_AddNumberToObject(p, "micro", 0);
    cJSON_AddStringToObject(p, "phase", phase);
    cJSON_AddNumberToObject(p, "phase_since", T - since_age);
    cJSON *gs = cJSON_AddArrayToObject(o, "groups");
    cJSON *g = cJSON_CreateObject();
    cJSON_AddNumberToObject(g, "index", 0);
    cJSON_AddStringToObject(g, "label", "world");
    cJSON_AddStringToObject(g, "uid", "00000000000000aa");
    cJSON_AddNumberToObject(g, "size", 2);
    cJSON_AddNumberToObject(g, "rank", r);
    cJSON_AddArrayToObject(g, "members");
    cJSON_AddItemToArray(gs, g);
    cJSON *rs = cJSON_AddArrayToObject(o, "records");
    char buf[4096];
    dt_strlcpy(buf, recs, sizeof buf);
    int seq = 0, psend = 0, precv = 0;
    for (char *save = NULL, *t = strtok_r(buf, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        char op[16], st[16];
        double count, a;
        int peer = -1;
        if (sscanf(t, "%15[^:]:%lf:%15[^:]:%lf:%d", op, &count, st, &a, &peer) < 4)
            continue;
        cJSON *x = cJSON_CreateObject();
        bool send = !strcmp(op, "send"), p2p = send || !strcmp(op, "recv");
        cJSON_AddNumberToObject(x, "group", 0);
        cJSON_AddNumberToObject(x, "seq", p2p ? (send ? ++psend : ++precv) : ++seq);
        cJSON_AddStringToObject(x, "op", op);
        cJSON_AddStringToObject(x, "dtype", count == 2 ? "float64" : "float32");
        cJSON_AddNumberToObject(x, "count", count);
        cJSON_AddNumberToObject(x, "peer", peer);
        cJSON_AddStringToObject(x, "state", st);
        cJSON_AddNumberToObject(x, "step", 5);
        cJSON_AddStringToObject(x, "phase", count == 2 ? "gradient sync" : "backward");
        cJSON_AddNumberToObject(x, "t_issue", T - a);
        cJSON_AddItemToArray(rs, x);
    }
    return o;
}

static cJSON *input(const char *kind, cJSON *r0, cJSON *r1, bool node1_answered)
{
    cJSON *in = cJSON_CreateObject();
    cJSON_AddNumberToObject(in, "time", T);
    cJSON_AddNumberToObject(in, "world_size", 2);
    cJSON *t = cJSON_AddObjectToObject(in, "trigger");
    cJSON_AddStringToObject(t, "kind", kind);
    cJSON_AddStringToObject(t, "reason", "a test");
    cJSON *nodes = cJSON_AddArrayToObject(in, "nodes");
    for (int k = 0; k < 2; k++) {
        cJSON *n = cJSON_CreateObject();
        cJSON_AddNumberToObject(n, "node", k);
        cJSON_AddStringToObject(n, "host", "h");
        cJSON_AddNumberToObject(n, "rank_base", k);
        cJSON_AddNumberToObject(n, "nproc", 1);
        cJSON_AddBoolToObject(n, "answered", k == 0 || node1_answered);
        cJSON_AddItemToArray(nodes, n);
    }
    cJSON *ranks = cJSON_AddArrayToObject(in, "ranks");
    if (r0)
        cJSON_AddItemToArray(ranks, r0);
    if (r1)
        cJSON_AddItemToArray(ranks, r1);
    return in;
}

/* Makes the verdict of in (freed) and checks its cause, first culprit and summary. */
static void expect(cJSON *in, const char *cause, int culprit, const char *phrase)
{
    dt_verdict v;
    dt_err e = {0};
    int rc = dt_verdict_make(in, &v, &e);
    cJSON_Delete(in);
    DT_REQUIRE_OK(rc, &e);
    DT_CHECK_STR(v.cause, cause);
    if (culprit >= 0) {
        DT_CHECK(v.n >= 1);
        DT_CHECK_INT(v.n ? v.c[0].rank : -9, culprit);
    } else {
        DT_CHECK_INT(v.n, 0);
    }
    DT_CHECK_CONTAINS(v.summary, phrase);
    DT_CHECK_CONTAINS(v.text, "trigger: a test\n");
    const char *ev_cause = cJSON_GetStringValue(cJSON_GetObjectItem(v.event, "cause"));
    DT_CHECK_STR(ev_cause, cause);
    dt_verdict_free(&v);
}

static void test_verdicts(void)
{
    const char *done4 = "allreduce:100:done:9 allreduce:2:done:9 allreduce:100:done:8 "
                        "allreduce:2:done:8 ";
    char r0[512];
    snprintf(r0, sizeof r0, "%sallreduce:100:started:6", done4);
    /* stopped: rank 1 never entered #5 and its process is stopped */
    expect(input("timeout", rank(0, "S", "gradient sync", 6, r0), rank(1, "T", "backward", 7, done4),
                 true),
           "stopped", 1, "rank 1 (node 1) stopped (process state T) since step 5, phase backward "
                         "(7.0 s); all others wait in allreduce #5 of group world");
    /* never entered: rank 1 is in its data phase */
    expect(input("watchdog", rank(0, "S", "gradient sync", 6, r0), rank(1, "S", "data", 6.5, done4),
                 true),
           "never_entered", 1, "rank 1 (node 1) never entered allreduce #5 of group world "
                               "(float32 x 100): it is in step 5, phase data since 6.5 s, "
                               "process state S (hrtimer_nanosleep)");
    /* gone: rank 1's process exited */
    expect(input("timeout", rank(0, "S", "gradient sync", 6, r0), rank(1, "", "backward", 7, done4),
                 true),
           "gone", 1, "rank 1 (node 1) is gone");
    /* node lost: no records of rank 1, node 1 did not answer */
    expect(input("failure", rank(0, "S", "gradient sync", 6, r0), NULL, false), "node_lost", 1,
           "rank 1 (node 1) is lost with node 1 on h: its agent did not answer");
    /* mismatch at #5, no way to tell who: both named */
    char a[512], b[512];
    snprintf(a, sizeof a, "%sallreduce:100:failed:1", done4);
    snprintf(b, sizeof b, "%sallreduce:7:failed:1", done4);
    expect(input("failure", rank(0, "", "backward", 1, a), rank(1, "", "backward", 1, b), true),
           "mismatch", 0, "ranks disagree at #5 of group world: rank 0 (node 0) allreduce float32 "
                          "x 100");
    /* skipped, by shift: rank 1's #5 is rank 0's #6 */
    snprintf(a, sizeof a, "%sallreduce:100:done:2 allreduce:2:failed:1", done4);
    snprintf(b, sizeof b, "%sallreduce:2:failed:1", done4);
    expect(input("failure", rank(0, "", "gradient sync", 1, a), rank(1, "", "gradient sync", 1, b),
                 true),
           "skipped", 1, "rank 1 (node 1) skipped allreduce #5 of group world (float32 x 100");
    /* point-to-point: sizes disagree */
    expect(input("failure", rank(0, "", "forward", 1, "send:64:failed:0.5:1"),
                 rank(1, "", "forward", 1, "recv:32:failed:0.5:0"), true),
           "p2p_mismatch", 0, "point-to-point mismatch on group world: rank 0 (node 0) sends "
                              "float32 x 64 to rank 1");
    /* a receive whose send was never posted, pending for 4 s */
    expect(input("watchdog", rank(0, "S", "backward", 4, ""),
                 rank(1, "S", "forward", 4, "recv:32:started:4:0"), true),
           "never_entered", 0, "rank 0 (node 0) never posted its send #1 to rank 1");
    /* a running job dumped: fresh calls, no hang */
    snprintf(r0, sizeof r0, "%sallreduce:100:started:0.01", done4);
    expect(input("request", rank(0, "R", "gradient sync", 0.01, r0),
                 rank(1, "R", "backward", 0.01, done4), true),
           "none", -1, "no hang found");
}

static void test_trim(void)
{
    char recs[100 * 24] = "";
    size_t k = 0;
    for (int i = 0; i < 100; i++)
        k += (size_t)snprintf(recs + k, sizeof recs - k, "allreduce:100:done:1 ");
    cJSON *r = rank(0, "R", "data", 1, recs);
    cJSON *t = dt_verdict_trim(r);
    DT_REQUIRE(t);
    cJSON *rs = cJSON_GetObjectItem(t, "records");
    DT_CHECK_INT(cJSON_GetArraySize(rs), DT_VERDICT_RECENT);
    DT_CHECK_INT((int)cJSON_GetNumberValue(cJSON_GetObjectItem(cJSON_GetArrayItem(rs, 0), "seq")),
                 100 - DT_VERDICT_RECENT + 1);
    cJSON_Delete(t);
    cJSON_Delete(r);
    dt_verdict v;
    dt_err e = {0};
    cJSON *not_obj = cJSON_CreateArray();
    DT_CHECK(dt_verdict_make(not_obj, &v, &e) == -EINVAL);
    cJSON_Delete(not_obj);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"mapping_round_trip", test_mapping_round_trip, 0},
        {"observer", test_observer, 0},
        {"trainer_records", test_trainer_records, 0},
        {"fault_spec", test_fault_spec, 0},
        {"verdicts", test_verdicts, 0},
        {"trim", test_trim, 0},
    };
    return dt_test_main("test_flight", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
