/* test_pipeline.c - pipeline parallelism: the schedules (pp_schedule.c) as data, and the
 * pipeline strategy end to end through the trainer against one process.
 *
 * Schedules: every stage forwards and backwards each micro-batch once, in order; every send
 * has its receive on the neighbour in the same order (p2p matching is by order); 1F1B holds at
 * most min(P - s, M) micro-batches' activations where GPipe holds M; replayed with unit-time
 * operations the idle fraction of every stage is (P-1)/(M+P-1); and the lists run to the end on
 * a model of the strictest backend, one that runs each rank's p2p batches one after the other
 * and completes a send only when its receive is posted (NCCL's stream, a comm thread).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/train/pp_schedule.h"
#include "tests/harness.h"

static const dt_pp_schedule_kind kinds[] = {DT_PP_GPIPE, DT_PP_1F1B};
static const char *kind_name(dt_pp_schedule_kind k) { return k == DT_PP_GPIPE ? "gpipe" : "1f1b"; }

/* ---- schedules ------------------------------------------------------------------------------ */

static int build(dt_pp_schedule_kind kind, int P, int M, int s, dt_pp_action *out)
{
    dt_err err = {0};
    int n = 0;
    DT_REQUIRE_OK(dt_pp_schedule_build(kind, P, M, s, out, dt_pp_schedule_cap(M), &n, &err),
                  &err);
    return n;
}

/* Each micro-batch forwarded once and backwarded once, forwards and backwards each in
 * micro-batch order, a backward after its forward, the receive of an input before its use and
 * the send of an output after it is made, no communication past the ends of the pipeline. */
static void test_schedule_order(void)
{
    dt_pp_action a[6 * 16];
    for (int ki = 0; ki < 2; ki++)
        for (int P = 1; P <= 5; P++)
            for (int M = 1; M <= 16; M++)
                for (int s = 0; s < P; s++) {
                    int n = build(kinds[ki], P, M, s, a);
                    int nf = 0, nb = 0, cnt[6] = {0};
                    int fpos[16], bpos[16], rpos[16], gpos[16];
                    for (int k = 0; k < M; k++)
                        fpos[k] = bpos[k] = rpos[k] = gpos[k] = -1;
                    for (int i = 0; i < n; i++) {
                        cnt[a[i].op]++;
                        int k = a[i].mb;
                        DT_REQUIRE(k >= 0 && k < M);
                        if (a[i].op == DT_PP_FWD) {
                            DT_CHECK_INT(k, nf); /* in order */
                            nf++;
                            fpos[k] = i;
                        } else if (a[i].op == DT_PP_BWD) {
                            DT_CHECK_INT(k, nb);
                            nb++;
                            bpos[k] = i;
                            DT_CHECK(fpos[k] >= 0 && fpos[k] < i);
                        } else if (a[i].op == DT_PP_RECV_ACT) {
                            rpos[k] = i;
                        } else if (a[i].op == DT_PP_RECV_GRAD) {
                            gpos[k] = i;
                        } else if (a[i].op == DT_PP_SEND_ACT) {
                            DT_CHECK(fpos[k] >= 0 && fpos[k] < i);
                        } else if (a[i].op == DT_PP_SEND_GRAD) {
                            DT_CHECK(bpos[k] >= 0 && bpos[k] < i);
                        }
                    }
                    DT_CHECK_INT(nf, M);
                    DT_CHECK_INT(nb, M);
                    DT_CHECK_INT(cnt[DT_PP_RECV_ACT], s > 0 ? M : 0);
                    DT_CHECK_INT(cnt[DT_PP_SEND_GRAD], s > 0 ? M : 0);
                    DT_CHECK_INT(cnt[DT_PP_SEND_ACT], s < P - 1 ? M : 0);
                    DT_CHECK_INT(cnt[DT_PP_RECV_GRAD], s < P - 1 ? M : 0);
                    DT_CHECK(n <= dt_pp_schedule_cap(M));
                    for (int k = 0; k < M; k++) {
                        if (s > 0)
                            DT_CHECK_MSG(rpos[k] >= 0 && rpos[k] < fpos[k],
                                         "%s P=%d M=%d stage %d: input of %d received at %d, "
                                         "used at %d", kind_name(kinds[ki]), P, M, s, k, rpos[k],
                                         fpos[k]);
                        if (s < P - 1)
                            DT_CHECK(gpos[k] >= 0 && gpos[k] < bpos[k]);
                    }
                }
}

/* p2p matches the k-th send with the k-th receive: stage s's sends of activations list the
 * micro-batches in the order stage s+1 receives them, and the gradients likewise back. */
static void test_schedule_matching(void)
{
    dt_pp_action a[6 * 12], b[6 * 12];
    for (int ki = 0; ki < 2; ki++)
        for (int P = 2; P <= 5; P++)
            for (int M = 1; M <= 12; M++)
                for (int s = 0; s + 1 < P; s++) {
                    int na = build(kinds[ki], P, M, s, a), nb = build(kinds[ki], P, M, s + 1, b);
                    int sa[12], ra[12], sg[12], rg[12], n1 = 0, n2 = 0, n3 = 0, n4 = 0;
                    for (int i = 0; i < na; i++) {
                        if (a[i].op == DT_PP_SEND_ACT)
                            sa[n1++] = a[i].mb;
                        if (a[i].op == DT_PP_RECV_GRAD)
                            rg[n4++] = a[i].mb;
                    }
                    for (int i = 0; i < nb; i++) {
                        if (b[i].op == DT_PP_RECV_ACT)
                            ra[n2++] = b[i].mb;
                        if (b[i].op == DT_PP_SEND_GRAD)
                            sg[n3++] = b[i].mb;
                    }
                    DT_REQUIRE(n1 == M && n2 == M && n3 == M && n4 == M);
                    DT_CHECK(!memcmp(sa, ra, sizeof(int) * (size_t)M));
                    DT_CHECK(!memcmp(sg, rg, sizeof(int) * (size_t)M));
                }
}

/* The memory bound: 1F1B keeps at most min(P - s, M) micro-batches' activations on stage s
 * (P on stage 0), GPipe all M on every stage. */
static void test_schedule_in_flight(void)
{
    dt_pp_action a[6 * 16];
    for (int P = 1; P <= 6; P++)
        for (int M = 1; M <= 16; M++)
            for (int s = 0; s < P; s++) {
                int n = build(DT_PP_1F1B, P, M, s, a);
                int want = P - s < M ? P - s : M;
                DT_CHECK_MSG(dt_pp_max_in_flight(a, n) == want,
                             "1f1b P=%d M=%d stage %d: %d in flight, %d expected", P, M, s,
                             dt_pp_max_in_flight(a, n), want);
                n = build(DT_PP_GPIPE, P, M, s, a);
                DT_CHECK_INT(dt_pp_max_in_flight(a, n), M);
            }
    /* the 1F1B steady state of a middle stage, spelled out: P = 3, M = 4, stage 1 */
    int n = build(DT_PP_1F1B, 3, 4, 1, a);
    const char *want = "RECV_ACT0 FWD0 SEND_ACT0 RECV_ACT1 FWD1 SEND_ACT1 RECV_GRAD0 BWD0 "
                       "SEND_GRAD0 RECV_ACT2 FWD2 SEND_ACT2 RECV_GRAD1 BWD1 SEND_GRAD1 RECV_ACT3 "
                       "FWD3 SEND_ACT3 RECV_GRAD2 BWD2 SEND_GRAD2 RECV_GRAD3 BWD3 SEND_GRAD3";
    char got[1024] = "";
    for (int i = 0; i < n; i++) {
        char one[32];
        snprintf(one, sizeof one, "%s%s%d", i ? " " : "", dt_pp_op_name(a[i].op), a[i].mb);
        strcat(got, one);
    }
    DT_CHECK_STR(got, want);
}

/* Unit-time replay: every stage idles (P-1)/(M+P-1) of the step, for both schedules, with
 * backward as long as forward and twice as long; the makespan is (tf+tb)(M+P-1). */
static void test_schedule_bubble(void)
{
    dt_err err = {0};
    double idle[8];
    for (int ki = 0; ki < 2; ki++)
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 16; M++)
                for (int tb = 1; tb <= 2; tb++) {
                    double span = 0;
                    DT_REQUIRE_OK(dt_pp_simulate(kinds[ki], P, M, 1.0, tb, &span, idle, &err),
                                  &err);
                    DT_CHECK_NEAR(span, (1.0 + tb) * (M + P - 1), 1e-9);
                    for (int s = 0; s < P; s++)
                        DT_CHECK_MSG(fabs(idle[s] - dt_pp_bubble_formula(P, M)) < 1e-12,
                                     "%s P=%d M=%d tb=%d stage %d: idle %.6f, formula %.6f",
                                     kind_name(kinds[ki]), P, M, tb, s, idle[s],
                                     dt_pp_bubble_formula(P, M));
                }
    DT_CHECK_NEAR(dt_pp_bubble_formula(4, 4), 3.0 / 7.0, 1e-15);
    DT_CHECK_NEAR(dt_pp_bubble_formula(1, 8), 0.0, 0);
}

/* The strictest backend: each rank runs its p2p batches (maximal runs of consecutive
 * communication actions) one after the other; an operation of the running batch completes when
 * the peer's matching operation (the k-th send from A to B with B's k-th receive from A) is in
 * the peer's running batch or already done; a batch completes when all its operations have.
 * The executor posts a batch without waiting and, before each compute action, waits for every
 * batch posted before it. Every rank must reach the end of its list. */
typedef struct sim_op {
    int batch;     /* batch index on its rank */
    bool send;
    int peer;      /* stage */
    int seq;       /* k-th operation of this direction between the two ranks */
    bool done;
} sim_op;

static bool run_strict(dt_pp_schedule_kind kind, int P, int M)
{
    enum { CAP = 6 * 16 };
    dt_pp_action a[8][CAP];
    int n[8];
    sim_op ops[8][CAP];
    int nops[8] = {0}, nb[8] = {0}, batch_of[8][CAP];
    for (int s = 0; s < P; s++) {
        n[s] = build(kind, P, M, s, a[s]);
        int cnt[8][2] = {{0}}; /* [peer][send] */
        bool in_batch = false;
        for (int i = 0; i < n[s]; i++) {
            batch_of[s][i] = -1;
            dt_pp_op op = a[s][i].op;
            if (!dt_pp_op_is_comm(op)) {
                in_batch = false;
                continue;
            }
            if (!in_batch)
                nb[s]++;
            in_batch = true;
            bool send = op == DT_PP_SEND_ACT || op == DT_PP_SEND_GRAD;
            int peer = op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD ? s + 1 : s - 1;
            ops[s][nops[s]] = (sim_op){nb[s] - 1, send, peer, cnt[peer][send]++, false};
            batch_of[s][i] = nb[s] - 1;
            nops[s]++;
        }
    }
    int pos[8] = {0}, posted[8] = {0}, running[8] = {0}; /* running: first batch not done */
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < P; s++) {
            /* the executor: post batches, stop at a compute whose earlier batches are not done */
            while (pos[s] < n[s]) {
                if (batch_of[s][pos[s]] >= 0) {
                    posted[s] = batch_of[s][pos[s]] + 1;
                    pos[s]++;
                    moved = true;
                } else if (running[s] >= posted[s]) {
                    pos[s]++;
                    moved = true;
                } else {
                    break;
                }
            }
            /* the backend: progress the running batch */
            if (running[s] >= posted[s])
                continue;
            bool all = true;
            for (int i = 0; i < nops[s]; i++) {
                sim_op *o = &ops[s][i];
                if (o->batch != running[s] || o->done)
                    continue;
                int q = o->peer;
                for (int j = 0; j < nops[q]; j++) {
                    sim_op *p = &ops[q][j];
                    if (p->peer == s && p->send != o->send && p->seq == o->seq &&
                        (p->done || (p->batch == running[q] && running[q] < posted[q]))) {
                        o->done = p->done = true;
                        moved = true;
                    }
                }
                all = all && o->done;
            }
            if (all) {
                running[s]++;
                moved = true;
            }
        }
    }
    for (int s = 0; s < P; s++)
        if (pos[s] < n[s] || running[s] < nb[s])
            return false;
    return true;
}

static void test_schedule_no_deadlock(void)
{
    for (int ki = 0; ki < 2; ki++)
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 16; M++)
                DT_CHECK_MSG(run_strict(kinds[ki], P, M), "%s P=%d M=%d deadlocks",
                             kind_name(kinds[ki]), P, M);
}

static void test_partition(void)
{
    dt_err err = {0};
    int first[8], count[8];
    DT_REQUIRE_OK(dt_pp_partition(7, 3, NULL, 0, "layers", first, count, &err), &err);
    DT_CHECK(count[0] == 3 && count[1] == 2 && count[2] == 2);
    DT_CHECK(first[0] == 0 && first[1] == 3 && first[2] == 5);
    int ex[3] = {1, 1, 5};
    DT_REQUIRE_OK(dt_pp_partition(7, 3, ex, 3, "layers", first, count, &err), &err);
    DT_CHECK(first[2] == 2 && count[2] == 5);
    DT_CHECK_INT(dt_pp_partition(3, 4, NULL, 0, "mlp layers", first, count, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "parallel.pipeline = 4");
    DT_CHECK_CONTAINS(err.msg, "at most 3");
    int bad[3] = {2, 2, 2};
    DT_CHECK_INT(dt_pp_partition(7, 3, bad, 3, "layers", first, count, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "parallel.stages adds up to 6");
    DT_CHECK_INT(dt_pp_partition(7, 3, bad, 2, "layers", first, count, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "parallel.pipeline = 3");
    int zero[3] = {0, 2, 5};
    DT_CHECK_INT(dt_pp_partition(7, 3, zero, 3, "layers", first, count, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "stage 0 has 0");
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"schedule_order", test_schedule_order, 0},
        {"schedule_matching", test_schedule_matching, 0},
        {"schedule_in_flight", test_schedule_in_flight, 0},
        {"schedule_bubble", test_schedule_bubble, 0},
        {"schedule_no_deadlock", test_schedule_no_deadlock, 0},
        {"partition", test_partition, 0},
    };
    return dt_test_main("test_pipeline", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
