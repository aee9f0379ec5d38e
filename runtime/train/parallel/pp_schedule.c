/* pp_schedule.c - GPipe and 1F1B as per-stage action lists, and their replay with unit-time
 * operations; see pp_schedule.h. */
#include "runtime/train/parallel/pp_schedule.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

int dt_pp_batch_end(const dt_pp_action *list, int n, int first)
{
    bool recv = false;
    int i = first;
    for (; i < n && dt_pp_op_is_comm(list[i].op); i++) {
        bool r = list[i].op == DT_PP_RECV_ACT || list[i].op == DT_PP_RECV_GRAD;
        if (r && recv)
            break;
        recv |= r;
    }
    return i;
}

const char *dt_pp_op_name(dt_pp_op op)
{
    static const char *names[] = {"FWD", "BWD", "SEND_ACT", "RECV_ACT", "SEND_GRAD", "RECV_GRAD"};
    return (unsigned)op < sizeof names / sizeof names[0] ? names[op] : "?";
}

int dt_pp_schedule_cap(int M) { return 6 * (M > 0 ? M : 1); }

/* The list under construction. */
typedef struct builder {
    dt_pp_action *out;
    int n, cap;
    int P, stage;
} builder;

static void put(builder *b, dt_pp_op op, int mb)
{
    /* the ends of the pipeline have no neighbour on one side */
    if ((op == DT_PP_RECV_ACT || op == DT_PP_SEND_GRAD) && b->stage == 0)
        return;
    if ((op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD) && b->stage == b->P - 1)
        return;
    if (b->n < b->cap)
        b->out[b->n] = (dt_pp_action){op, mb};
    b->n++;
}

static void forward(builder *b, int k)
{
    put(b, DT_PP_RECV_ACT, k);
    put(b, DT_PP_FWD, k);
    put(b, DT_PP_SEND_ACT, k);
}

static void backward(builder *b, int k)
{
    put(b, DT_PP_RECV_GRAD, k);
    put(b, DT_PP_BWD, k);
    put(b, DT_PP_SEND_GRAD, k);
}

int dt_pp_schedule_build(dt_pp_schedule_kind kind, int P, int M, int stage, dt_pp_action *out,
                         int cap, int *n, dt_err *err)
{
    if (P < 1 || M < 1 || stage < 0 || stage >= P)
        return dt_err_set(err, -EINVAL, "pipeline schedule: stage %d of %d stages with %d "
                                        "micro-batches (P >= 1, M >= 1, 0 <= stage < P)",
                          stage, P, M);
    if (cap < dt_pp_schedule_cap(M))
        return dt_err_set(err, -EINVAL, "pipeline schedule: room for %d actions, %d needed",
                          cap, dt_pp_schedule_cap(M));
    builder b = {out, 0, cap, P, stage};
    if (kind == DT_PP_GPIPE) {
        for (int k = 0; k < M; k++)
            forward(&b, k);
        for (int k = 0; k < M; k++)
            backward(&b, k);
    } else {
        int W = P - stage - 1 < M ? P - stage - 1 : M, R = M - W;
        for (int k = 0; k < W; k++)
            forward(&b, k);
        if (R > 0)
            put(&b, DT_PP_RECV_ACT, W);
        for (int i = 0; i < R; i++) {
            int k = W + i, j = i;
            put(&b, DT_PP_FWD, k);
            put(&b, DT_PP_SEND_ACT, k);
            put(&b, DT_PP_RECV_GRAD, j);
            put(&b, DT_PP_BWD, j);
            put(&b, DT_PP_SEND_GRAD, j);
            if (i < R - 1)
                put(&b, DT_PP_RECV_ACT, k + 1);
        }
        for (int j = R; j < M; j++)
            backward(&b, j);
    }
    *n = b.n;
    return 0;
}

int dt_pp_max_in_flight(const dt_pp_action *list, int n)
{
    int live = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].op == DT_PP_FWD && ++live > most)
            most = live;
        else if (list[i].op == DT_PP_BWD)
            live--;
    }
    return most;
}

/* Moves list[from] to position to (to <= from), shifting what lies between one place on. */
static void move_back(dt_pp_action *list, int from, int to)
{
    dt_pp_action a = list[from];
    memmove(list + to + 1, list + to, sizeof *list * (size_t)(from - to));
    list[to] = a;
}

/* The index of the first action of op on micro-batch mb in list[0..n), -1 when none. */
static int find(const dt_pp_action *list, int n, dt_pp_op op, int mb)
{
    for (int i = 0; i < n; i++)
        if (list[i].op == op && list[i].mb == mb)
            return i;
    return -1;
}

/* Receives one compute earlier, and why it cannot deadlock.
 *
 * The model is the strictest backend (NCCL's): a rank's p2p batches run one after the other in
 * issue order, a send may not complete before its receive is posted, and the host waits for a
 * batch (and so for every batch before it) before the compute that needs it. A receive posted
 * early is then safe only if the peer's matching send never depends, through the peer's own
 * batches or computes, on anything this rank posts after that receive.
 *
 *   RECV_ACT k (stage s, from s-1), now in the batch before FWD k-1. Stage s-1 sends k after
 *   its FWD k. GPipe, and 1F1B's warm-up, run that forward after nothing from downstream; in
 *   1F1B's steady state (round i runs FWD W+i then BWD i, W = P-s-1 on s, P-s on s-1) both
 *   stage s's FWD k-1 and stage s-1's FWD k come right after their backward of
 *   b = k-1-(P-s), so what s-1 needs from s is the gradient of b, whose SEND_GRAD is in the
 *   very batch the early receive joins (a batch's operations progress together). By induction
 *   towards stage 0, which receives no activation, every early receive is matched. The sends
 *   to s+1 queued behind it are only delayed: upstream depends on downstream through
 *   gradients alone.
 *
 *   RECV_GRAD j (from s+1), now before BWD j-1 when no forward lies between (GPipe's backward
 *   half, 1F1B's cool-down): every activation stage s sends is posted before it, so s+1's
 *   backward of j needs nothing more from s; by induction towards the last stage, which
 *   receives no gradient, it is matched. In 1F1B's steady state it would not be: s's stream
 *   would hold RECV_GRAD j+1 ahead of SEND_ACT k+1, while s+1's stream holds its early
 *   RECV_ACT k+1 ahead of its SEND_GRAD j+1 (a cycle; the test's replay finds it for P = 2,
 *   M = 3).
 *
 * Receive buffers: the activation of k+1 arrives while k and the micro-batches before it whose
 * backward has not run still hold theirs (the model borrows `in` until the backward), so a
 * stage > 0 needs one buffer more than its slots (dt_pp_recv_buffers); gradients still fit two
 * buffers (the receive of j+1 is posted after BWD j-1 has read (j+1) % 2's last gradient). */
void dt_pp_post_early(dt_pp_action *list, int n)
{
    for (int k = 1; k < n; k++) {
        int r = find(list, n, DT_PP_RECV_ACT, k), f = find(list, n, DT_PP_FWD, k - 1);
        if (r > f && f >= 0)
            move_back(list, r, f);
        r = find(list, n, DT_PP_RECV_GRAD, k);
        int b = find(list, n, DT_PP_BWD, k - 1);
        if (r > b && b >= 0) {
            bool fwd_between = false;
            for (int i = b + 1; i < r; i++)
                fwd_between |= list[i].op == DT_PP_FWD;
            if (!fwd_between)
                move_back(list, r, b);
        }
    }
}

int dt_pp_recv_buffers(const dt_pp_action *list, int n)
{
    int live = 0, most = 0;
    for (int i = 0; i < n; i++) {
        if (list[i].op == DT_PP_RECV_ACT && ++live > most)
            most = live;
        else if (list[i].op == DT_PP_BWD)
            live--;
    }
    return most;
}

int dt_pp_wait_before(const dt_pp_action *list, int i, int slots)
{
    const dt_pp_action c = list[i];
    for (int j = i - 1; j >= 0; j--) {
        const dt_pp_action a = list[j];
        bool need = false;
        if (c.op == DT_PP_FWD)
            need = (a.op == DT_PP_RECV_ACT && a.mb == c.mb) ||
                   (a.op == DT_PP_SEND_ACT && a.mb != c.mb && a.mb % slots == c.mb % slots);
        else if (c.op == DT_PP_BWD)
            need = (a.op == DT_PP_RECV_GRAD && a.mb == c.mb) ||
                   (a.op == DT_PP_SEND_GRAD && a.mb != c.mb && a.mb % 2 == c.mb % 2);
        if (need)
            return j;
    }
    return -1;
}

double dt_pp_bubble_formula(int P, int M) { return (double)(P - 1) / (double)(M + P - 1); }

int dt_pp_simulate(dt_pp_schedule_kind kind, int P, int M, double tf, double tb,
                   double *makespan, double *idle, dt_err *err)
{
    if (P < 1 || P > 1024)
        return dt_err_set(err, -EINVAL, "pipeline simulation: %d stages", P);
    double f[1024], b[1024];
    for (int s = 0; s < P; s++)
        f[s] = tf, b[s] = tb;
    return dt_pp_simulate_stages(kind, P, M, f, b, makespan, idle, err);
}

int dt_pp_simulate_stages(dt_pp_schedule_kind kind, int P, int M, const double *tf,
                          const double *tb, double *makespan, double *idle, dt_err *err)
{
    int cap = dt_pp_schedule_cap(M), rc = 0;
    dt_pp_action *lists = calloc((size_t)P * (size_t)cap, sizeof *lists);
    int *len = calloc((size_t)P, sizeof *len), *pos = calloc((size_t)P, sizeof *pos);
    double *fdone = malloc(sizeof(double) * (size_t)P * (size_t)M);
    double *bdone = malloc(sizeof(double) * (size_t)P * (size_t)M);
    double *clock = calloc((size_t)P, sizeof *clock), *busy = calloc((size_t)P, sizeof *busy);
    if (P < 1 || M < 1) {
        rc = dt_err_set(err, -EINVAL, "pipeline simulation: %d stages, %d micro-batches", P, M);
        goto out;
    }
    if (!lists || !len || !pos || !fdone || !bdone || !clock || !busy) {
        rc = dt_err_set(err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < P * M; i++)
        fdone[i] = bdone[i] = -1;
    for (int s = 0; s < P && !rc; s++)
        rc = dt_pp_schedule_build(kind, P, M, s, lists + (size_t)s * cap, cap, &len[s], err);
    if (rc)
        goto out;
    /* Each stage runs its compute actions in list order, each as soon as the stage is free and
     * what it consumes exists; sweep until no stage can move. */
    for (bool moved = true; moved;) {
        moved = false;
        for (int s = 0; s < P; s++) {
            while (pos[s] < len[s]) {
                dt_pp_action a = lists[(size_t)s * cap + pos[s]];
                if (dt_pp_op_is_comm(a.op)) {
                    pos[s]++;
                    continue;
                }
                double ready = clock[s];
                if (a.op == DT_PP_FWD && s > 0) {
                    double d = fdone[(s - 1) * M + a.mb];
                    if (d < 0)
                        break;
                    ready = d > ready ? d : ready;
                } else if (a.op == DT_PP_BWD) {
                    double d = s < P - 1 ? bdone[(s + 1) * M + a.mb] : fdone[s * M + a.mb];
                    if (d < 0)
                        break;
                    ready = d > ready ? d : ready;
                }
                double t = a.op == DT_PP_FWD ? tf[s] : tb[s];
                clock[s] = ready + t;
                busy[s] += t;
                (a.op == DT_PP_FWD ? fdone : bdone)[s * M + a.mb] = clock[s];
                pos[s]++;
                moved = true;
            }
        }
    }
    double end = 0;
    for (int s = 0; s < P; s++) {
        if (pos[s] < len[s]) {
            rc = dt_err_set(err, -EDEADLK, "pipeline simulation: stage %d of %d stuck at action "
                                           "%d (%s of micro-batch %d)",
                            s, P, pos[s], dt_pp_op_name(lists[(size_t)s * cap + pos[s]].op),
                            lists[(size_t)s * cap + pos[s]].mb);
            goto out;
        }
        end = clock[s] > end ? clock[s] : end;
    }
    *makespan = end;
    for (int s = 0; s < P && idle; s++)
        idle[s] = end > 0 ? 1.0 - busy[s] / end : 0;
out:
    free(lists);
    free(len);
    free(pos);
    free(fdone);
    free(bdone);
    free(clock);
    free(busy);
    return rc;
}
