/* test_pipeline.c - pipeline parallelism: the schedules (pp_schedule.c) as data, the model
 * stages (model.h), and the pipeline strategy end to end through the trainer against one
 * process.
 *
 * Schedules: every stage forwards and backwards each micro-batch once, in order; every send
 * has its receive on the neighbour in the same order (p2p matching is by order); 1F1B holds at
 * most min(P - s, M) micro-batches' activations where GPipe holds M; replayed with unit-time
 * operations the idle fraction of every stage is (P-1)/(M+P-1); and the lists run to the end on
 * a model of the strictest backend, one that runs each rank's p2p batches one after the other
 * and completes a send only when its receive is posted (NCCL's stream, a comm thread), both
 * when every compute waits for all it posted and when it waits as dt_pp_wait_before says; the
 * same for the order the strategy posts in (dt_pp_post_early: receives one compute earlier),
 * and the trace of a D2 x P2 run shows those receives posted early and the data-parallel
 * buckets (DDP, ZeRO-1) starting inside the last backward.
 *
 * Model stages (model.h's stage ops): mlp stages chained by hand start with the whole model's
 * parameters bit for bit, and compute its loss and gradients: bit for bit with one
 * micro-batch, within 1e-5 relative with several (only the sums over the batch are split);
 * what a stage refuses; a gpt stage's slot memory (recomputed intermediates shared).
 *
 * End to end: N forked ranks drive the real trainer (dt_trainer_init/step/run with
 * configs/mlp.ini or quickstart.ini and overrides) at a store process on 127.0.0.1, each
 * recording its per-step loss and gradient norm and the whole model and optimiser state as a
 * checkpoint takes them (gather_state + state) in shared memory: P = 2 and 4 with M = 4, both
 * schedules, mlp and gpt (tied wte), against one process on the same global batch (20 steps,
 * 1e-5 relative on the loss, and on the weights as a vector, 2-norms, see vec_rel; eval loss and
 * accuracy too); gpt at D2 x P2 with grad_accum = 2, its step-1 gradients per tensor too;
 * grad_accum, fp16, SGD, a global batch, recompute; an fp16 overflow on one stage skipping the step on all;
 * D2 x P2 against DDP; llama at P = 2 and 4, T2 x P2 with sequence parallelism and D2 x P2
 * with ZeRO-1 and 3; T2 x P2 and D2 x T2 x P2 against one process; resnet (BatchNorm: each
 * micro-batch its own statistics) at P = 2 and 3 and D2 x P2 with SyncBatchNorm against one
 * process with grad_accum = M, running statistics too, and its checkpoints (the stages'
 * running statistics) resumed by one process and another pipeline; checkpoints resharded
 * between layouts bit for bit; a stage killed mid-step; the trace's spans; the dtrain binary
 * with 4 workers; and `dtrain bench pipeline`.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/models/model.h"
#include "runtime/train/parallel/pp_schedule.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"
#include "tests/fixtures.h"
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
    /* uneven stages: stage 1 twice as slow; GPipe, P = 2, M = 4, by hand: stage 1 forwards at
     * 1..9 and backwards at 9..17, stage 0 backwards after each of them: 11, 13, 15, 17..18 */
    const double tf[2] = {1, 2}, tb[2] = {1, 2};
    double span = 0;
    DT_REQUIRE_OK(dt_pp_simulate_stages(DT_PP_GPIPE, 2, 4, tf, tb, &span, idle, &err), &err);
    DT_CHECK_NEAR(span, 18, 1e-12);
    DT_CHECK_NEAR(idle[0], 10.0 / 18, 1e-12);
    DT_CHECK_NEAR(idle[1], 2.0 / 18, 1e-12);
    DT_CHECK_NEAR(dt_pp_bubble_formula(1, 8), 0.0, 0);
}

/* The strictest backend: each rank runs its p2p batches (maximal runs of consecutive
 * communication actions) one after the other; an operation of the running batch completes when
 * the peer's matching operation (the k-th send from A to B with B's k-th receive from A) is in
 * the peer's running batch or already done; a batch completes when all its operations have.
 * The executor posts a batch without waiting and, before each compute action, waits for the
 * batches up to the one holding what dt_pp_wait_before names (all of them: lazy = false). Every
 * rank must reach the end of its list. early: the lists as dt_pp_post_early reorders them (the
 * strategy's posting order); 2: and every gradient's receive moved one backward earlier too. */
typedef struct sim_op {
    int batch;     /* batch index on its rank */
    bool send;
    int peer;      /* stage */
    int seq;       /* k-th operation of this direction between the two ranks */
    bool done;
} sim_op;

static bool run_strict(dt_pp_schedule_kind kind, int P, int M, bool lazy, int early)
{
    enum { CAP = 6 * 16 };
    dt_pp_action a[8][CAP];
    int n[8];
    sim_op ops[8][CAP];
    int nops[8] = {0}, nb[8] = {0}, batch_of[8][CAP];
    for (int s = 0; s < P; s++) {
        n[s] = build(kind, P, M, s, a[s]);
        if (early)
            dt_pp_post_early(a[s], n[s]);
        if (early > 1) /* and every gradient's receive one backward earlier, forwards or not */
            for (int j = 1; j < M; j++) {
                int r = 0, b = 0;
                while (r < n[s] && (a[s][r].op != DT_PP_RECV_GRAD || a[s][r].mb != j))
                    r++;
                while (b < n[s] && (a[s][b].op != DT_PP_BWD || a[s][b].mb != j - 1))
                    b++;
                if (r < n[s] && b < r) {
                    dt_pp_action x = a[s][r];
                    memmove(&a[s][b + 1], &a[s][b], sizeof x * (size_t)(r - b));
                    a[s][b] = x;
                }
            }
        int cnt[8][2] = {{0}}; /* [peer][send] */
        int batch_end = 0; /* the batches as the strategy posts them (dt_pp_batch_end) */
        for (int i = 0; i < n[s]; i++) {
            batch_of[s][i] = -1;
            dt_pp_op op = a[s][i].op;
            if (!dt_pp_op_is_comm(op))
                continue;
            if (i >= batch_end) {
                nb[s]++;
                batch_end = dt_pp_batch_end(a[s], n[s], i);
            }
            bool send = op == DT_PP_SEND_ACT || op == DT_PP_SEND_GRAD;
            int peer = op == DT_PP_SEND_ACT || op == DT_PP_RECV_GRAD ? s + 1 : s - 1;
            ops[s][nops[s]] = (sim_op){nb[s] - 1, send, peer, cnt[peer][send]++, false};
            batch_of[s][i] = nb[s] - 1;
            nops[s]++;
        }
    }
    int slots[8];
    for (int s = 0; s < P; s++)
        slots[s] = dt_pp_max_in_flight(a[s], n[s]);
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
                } else {
                    /* the batches this compute waits for: all posted, or up to the one with
                     * the action dt_pp_wait_before names */
                    int need = posted[s];
                    if (lazy) {
                        int j = dt_pp_wait_before(a[s], pos[s], slots[s]);
                        need = j < 0 ? 0 : batch_of[s][j] + 1;
                    }
                    if (running[s] < need)
                        break;
                    pos[s]++;
                    moved = true;
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
                for (int lazy = 0; lazy < 2; lazy++)
                    DT_CHECK_MSG(run_strict(kinds[ki], P, M, lazy, 0), "%s P=%d M=%d deadlocks%s",
                                 kind_name(kinds[ki]), P, M,
                                 lazy ? " (waits as dt_pp_wait_before says)" : "");
}

/* What a compute waits for: its input's receive, and the sends of the buffers it overwrites;
 * GPipe's stage 0 then runs its forwards, and its last stage its backwards, back to back. */
static void test_wait_before(void)
{
    dt_pp_action a[6 * 8];
    for (int ki = 0; ki < 2; ki++)
        for (int P = 1; P <= 5; P++)
            for (int M = 1; M <= 8; M++)
                for (int s = 0; s < P; s++) {
                    int n = build(kinds[ki], P, M, s, a), slots = dt_pp_max_in_flight(a, n);
                    for (int i = 0; i < n; i++) {
                        if (dt_pp_op_is_comm(a[i].op))
                            continue;
                        int j = dt_pp_wait_before(a, i, slots);
                        DT_REQUIRE(j < i);
                        dt_pp_op in = a[i].op == DT_PP_FWD ? DT_PP_RECV_ACT : DT_PP_RECV_GRAD;
                        for (int k = 0; k < i; k++) /* the input's receive is covered */
                            if (a[k].op == in && a[k].mb == a[i].mb)
                                DT_CHECK(j >= k);
                    }
                }
    int n = build(DT_PP_GPIPE, 3, 4, 0, a);
    for (int i = 0; i < n; i++)
        if (a[i].op == DT_PP_FWD)
            DT_CHECK_INT(dt_pp_wait_before(a, i, 4), -1);
    n = build(DT_PP_GPIPE, 3, 4, 2, a);
    for (int i = 0; i < n; i++)
        if (a[i].op == DT_PP_BWD && a[i].mb >= 2) /* the send of mb - 2's gradient, in flight */
            DT_CHECK(a[dt_pp_wait_before(a, i, 4)].op == DT_PP_SEND_GRAD);
}

/* ---- model stages --------------------------------------------------------------------------- */

static dt_model_config mlp_cfg(int B)
{
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_MLP;
    c.shape.kind = DT_SAMPLE_VECTOR;
    c.shape.input_dim = 7;
    c.shape.n_classes = 5;
    c.max_batch = B;
    c.seed = 43;
    c.n_hidden = 3;
    c.hidden[0] = 9;
    c.hidden[1] = 6;
    c.hidden[2] = 8;
    return c;
}

/* The largest |a - b| over the tensor, relative to the largest |b|. */
static double rel_diff(const float *a, const float *b, size_t n)
{
    double d = 0, mx = 1e-30;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        mx = fmax(mx, fabs((double)b[i]));
    }
    return d / mx;
}

/* Whole model vs P stages chained by hand (GPipe order, M micro-batches in M slots). */
static void chain(int P, int M, const int *counts)
{
    const int B = 8, L = 4;
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    dt_model_config wc = mlp_cfg(B);
    dt_model *whole = NULL, *st[4] = {0};
    DT_REQUIRE_OK(dt_model_create(&whole, &wc, be, NULL, &err), &err);
    DT_REQUIRE(whole->stage && whole->stage->stage_forward && whole->stage->stage_backward);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &wc, B, 7);
    hb.targets[3] = -1; /* ignored: micro-batches count different numbers of targets */
    float wloss = 0;
    DT_REQUIRE_OK(whole->ops->forward(whole, &hb.b, true, &wloss, &err), &err);
    DT_REQUIRE_OK(whole->ops->backward(whole, 1.0f, NULL, NULL, &err), &err);

    int at = 0, mb = B / M;
    for (int s = 0; s < P; s++) {
        dt_model_config c = mlp_cfg(mb);
        c.pp_size = P;
        c.pp_rank = s;
        c.pp_first = at;
        c.pp_count = counts[s];
        c.pp_slots = M;
        at += counts[s];
        DT_REQUIRE_OK(dt_model_create(&st[s], &c, be, NULL, &err), &err);
        static const int dims[5] = {7, 9, 6, 8, 5}; /* input, hidden..., classes */
        DT_CHECK_INT(st[s]->pp_in_numel, s == 0 ? 0 : dims[c.pp_first]);
        DT_CHECK_INT(st[s]->pp_out_numel, s == P - 1 ? 0 : dims[c.pp_first + c.pp_count]);
        /* a stage is driven through its stage ops only */
        float l;
        DT_CHECK_INT(st[s]->ops->forward(st[s], &hb.b, true, &l, &err), -EINVAL);
        /* its tensors: the whole model's, under the same names, initialised bit for bit */
        for (int t = 0; t < st[s]->num_tensors; t++) {
            const dt_tensor_info *ti = &st[s]->tensors[t];
            int w = dt_model_find_tensor(whole, ti->name);
            DT_REQUIRE(w >= 0);
            DT_CHECK_INT(whole->tensors[w].numel, ti->numel);
            DT_CHECK_MSG(!memcmp(whole->params + whole->tensors[w].offset,
                                 st[s]->params + ti->offset, ti->numel * sizeof(float)),
                         "P=%d stage %d: %s starts unlike the whole model's", P, s, ti->name);
        }
    }
    DT_CHECK_INT(at, L);

    /* valid targets per micro-batch: each micro-batch's loss weighs valid_k / valid */
    int valid[16] = {0}, total = 0;
    for (int k = 0; k < M; k++)
        for (int i = 0; i < mb; i++)
            if (hb.targets[k * mb + i] >= 0)
                valid[k]++, total++;
    float *dbuf[4][16] = {{0}};
    double loss = 0;
    for (int k = 0; k < M; k++) {
        dt_batch b = {.B = mb, .x = hb.x + (size_t)k * mb * 7, .targets = hb.targets + k * mb};
        const float *in = NULL;
        for (int s = 0; s < P; s++) {
            float *out = NULL, l = -1;
            DT_REQUIRE_OK(st[s]->stage->stage_forward(st[s], k, &b, in, true, &out, &l, &err),
                          &err);
            DT_CHECK(s == P - 1 ? out == NULL : out != NULL);
            if (s == P - 1)
                loss += (double)l * valid[k] / total;
            in = out;
        }
    }
    for (int k = 0; k < M; k++) {
        const float *dout = NULL;
        for (int s = P - 1; s >= 0; s--) {
            float *din = NULL;
            if (s > 0) {
                dbuf[s][k] = calloc((size_t)mb * st[s]->pp_in_numel, sizeof(float));
                din = dbuf[s][k];
            }
            DT_REQUIRE_OK(st[s]->stage->stage_backward(st[s], k, (float)valid[k] / (float)total,
                                                     dout, din, NULL, NULL, &err),
                          &err);
            dout = din;
        }
    }
    double worst = 0;
    for (int s = 0; s < P; s++)
        for (int t = 0; t < st[s]->num_tensors; t++) {
            const dt_tensor_info *ti = &st[s]->tensors[t];
            int w = dt_model_find_tensor(whole, ti->name);
            const float *a = st[s]->grads + ti->offset;
            const float *g = whole->grads + whole->tensors[w].offset;
            double r = rel_diff(a, g, ti->numel);
            worst = fmax(worst, r);
            if (M == 1)
                DT_CHECK_MSG(!memcmp(a, g, ti->numel * sizeof(float)),
                             "P=%d M=1: gradient of %s differs from the whole model's (%.3g)", P,
                             ti->name, r);
            else
                DT_CHECK_MSG(r <= 1e-5, "P=%d M=%d: gradient of %s differs by %.3g relative", P,
                             M, ti->name, r);
        }
    if (M == 1)
        DT_CHECK_MSG(loss == (double)wloss, "P=%d: loss %.9g vs %.9g", P, loss, (double)wloss);
    else
        DT_CHECK_MSG(fabs(loss - wloss) <= 1e-6 * fabs(wloss), "P=%d M=%d: loss %.9g vs %.9g", P,
                     M, loss, (double)wloss);
    printf("    P=%d M=%d: loss %.7f (whole %.7f), gradients within %.2g\n", P, M, loss,
           (double)wloss, worst);
    for (int s = 0; s < P; s++) {
        for (int k = 0; k < M; k++)
            free(dbuf[s][k]);
        dt_model_free(st[s]);
    }
    dt_model_free(whole);
    dt_test_batch_free(&hb);
    dt_backend_close(be);
}

static void test_mlp_stages(void)
{
    int two[2] = {2, 2}, three[3] = {1, 2, 1}, four[4] = {1, 1, 1, 1}, lop[2] = {3, 1};
    chain(2, 1, two);
    chain(2, 4, two);
    chain(2, 2, lop);
    chain(3, 4, three);
    chain(4, 1, four);
    chain(4, 8, four);
}

/* A gpt stage's slots: each further slot adds pp_slot_bytes; what backward recomputes
 * (recompute = block: a layer's intermediates) is one copy for every slot, so a slot costs
 * less under recompute. */
static void test_gpt_slot_memory(void)
{
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    size_t slot_bytes[2] = {0};
    for (int rec = 0; rec < 2; rec++) {
        size_t acts[2] = {0};
        for (int k = 0; k < 2; k++) {
            dt_model_config c;
            memset(&c, 0, sizeof c);
            c.arch = DT_ARCH_GPT;
            c.shape.kind = DT_SAMPLE_TOKENS;
            c.shape.seq_len = 8;
            c.shape.vocab_size = 32;
            c.max_batch = 2;
            c.seed = 5;
            c.n_layer = 4;
            c.n_head = 2;
            c.n_embd = 16;
            c.block_size = 8;
            c.recompute = rec ? DT_RECOMPUTE_BLOCK : DT_RECOMPUTE_NONE;
            c.pp_size = 2;
            c.pp_rank = 0;
            c.pp_first = 0;
            c.pp_count = 2;
            c.pp_slots = k ? 4 : 1;
            dt_model *m = NULL;
            DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, &err), &err);
            DT_CHECK_INT(m->pp_in_numel, 0);
            DT_CHECK_INT(m->pp_out_numel, 8 * 16);
            acts[k] = dt_model_activation_bytes(m);
            slot_bytes[rec] = m->pp_slot_bytes;
            dt_model_free(m);
        }
        DT_CHECK_MSG(acts[1] - acts[0] == 3 * slot_bytes[rec],
                     "recompute %d: 4 slots hold %zu bytes more than 1, 3 x %zu expected", rec,
                     acts[1] - acts[0], slot_bytes[rec]);
    }
    DT_CHECK_MSG(slot_bytes[1] < slot_bytes[0], "a slot: %zu bytes with recompute, %zu without",
                 slot_bytes[1], slot_bytes[0]);
    dt_backend_close(be);
}

/* What a stage refuses: a backward without its forward, a slot it does not have, a middle
 * stage's forward without the previous stage's output, a bad layer range. */
static void test_mlp_stage_errors(void)
{
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    dt_model_config c = mlp_cfg(4);
    c.pp_size = 2;
    c.pp_rank = 1;
    c.pp_first = 2;
    c.pp_count = 2;
    c.pp_slots = 2;
    dt_model *m = NULL;
    DT_REQUIRE_OK(dt_model_create(&m, &c, be, NULL, &err), &err);
    dt_test_batch hb;
    dt_test_batch_make(&hb, &c, 4, 3);
    float *out, l;
    DT_CHECK_INT(m->stage->stage_forward(m, 0, &hb.b, NULL, true, &out, &l, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "previous stage's output");
    DT_CHECK_INT(m->stage->stage_forward(m, 2, &hb.b, NULL, true, &out, &l, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "slot 2 of 2");
    DT_CHECK_INT(m->stage->stage_backward(m, 1, 1.0f, NULL, NULL, NULL, NULL, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "slot 1");
    dt_model_free(m);
    c.pp_first = 1; /* the last stage must end at the last layer */
    DT_CHECK(dt_model_create(&m, &c, be, NULL, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "last end at layer 3");
    dt_test_batch_free(&hb);
    dt_backend_close(be);
}

/* resnet's stages (CIFAR depth 8 on 3x8x8: layer1.0 4 channels, layer2.0 8 at 4x4 with its
 * downsample, layer3.0 16 at 2x2; stage 0 of 2,1 holds the stem and the first two): what each
 * holds and passes on, what a slot costs, and what a stage refuses. */
static void test_resnet_stage_errors(void)
{
    dt_err err = {0};
    dt_backend *be = NULL;
    DT_REQUIRE_OK(dt_backend_open(&be, DT_BACKEND_CPU, NULL, &err), &err);
    dt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = DT_ARCH_RESNET;
    c.shape.kind = DT_SAMPLE_IMAGE;
    c.shape.channels = 3;
    c.shape.height = c.shape.width = 8;
    c.shape.n_classes = 4;
    c.max_batch = 4;
    c.seed = 7;
    c.depth = 8;
    c.width = 4;
    c.bn_momentum = 0.1f;
    c.bn_eps = 1e-5f;
    c.pp_size = 2;
    c.pp_slots = 2;
    dt_model *s0 = NULL, *s1 = NULL;
    c.pp_rank = 0, c.pp_first = 0, c.pp_count = 2;
    DT_REQUIRE_OK(dt_model_create(&s0, &c, be, NULL, &err), &err);
    c.pp_rank = 1, c.pp_first = 2, c.pp_count = 1;
    DT_REQUIRE_OK(dt_model_create(&s1, &c, be, NULL, &err), &err);
    DT_CHECK_INT(s0->pp_in_numel, 0);
    DT_CHECK_INT(s0->pp_out_numel, 8 * 4 * 4);
    DT_CHECK_INT(s1->pp_in_numel, 8 * 4 * 4);
    DT_CHECK_INT(s1->pp_out_numel, 0);
    DT_CHECK_INT(s0->num_blocks, 3); /* stem, layer1.0, layer2.0 */
    DT_CHECK_INT(s1->num_blocks, 2); /* layer3.0, fc */
    DT_CHECK_STR(s0->blocks[0].name, "stem");
    DT_CHECK_STR(s1->blocks[1].name, "fc");
    /* running_mean and running_var of each BatchNorm: bn1, layer1.0's two, layer2.0's three */
    DT_CHECK_INT(s0->num_buffer_tensors, 2 * 6);
    DT_CHECK_INT(s1->num_buffer_tensors, 2 * 3);
    DT_CHECK(dt_model_find_tensor(s0, "layer2.0.downsample.0.weight") >= 0);
    DT_CHECK(dt_model_find_tensor(s0, "fc.weight") < 0);
    DT_CHECK(dt_model_find_tensor(s1, "conv1.weight") < 0);
    DT_CHECK(dt_model_find_tensor(s1, "layer3.0.conv1.weight") >= 0);
    dt_test_batch hb;
    dt_model_config bc = c; /* the fixture makes vectors: 3x8x8 pixels a sample */
    bc.shape.input_dim = 3 * 8 * 8;
    dt_test_batch_make(&hb, &bc, 4, 3);
    float *out = NULL, l;
    DT_CHECK_INT(s0->ops->forward(s0, &hb.b, true, &l, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "drive it with its stage ops");
    DT_CHECK_INT(s1->stage->stage_forward(s1, 0, &hb.b, NULL, true, &out, &l, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "previous stage's output");
    DT_CHECK_INT(s0->stage->stage_forward(s0, 2, &hb.b, NULL, true, &out, &l, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "slot 2 of 2");
    DT_CHECK_INT(s0->stage->stage_backward(s0, 1, 1.0f, NULL, NULL, NULL, NULL, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "slot 1");
    DT_REQUIRE_OK(s0->stage->stage_forward(s0, 1, &hb.b, NULL, true, &out, &l, &err), &err);
    DT_CHECK(out != NULL);
    DT_CHECK_INT(s0->stage->stage_backward(s0, 1, 1.0f, NULL, NULL, NULL, NULL, &err), -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "needs the next stage's gradient");
    /* each slot beyond the first adds pp_slot_bytes (activations, BatchNorm statistics);
     * with recompute = block the intermediates are one set for all slots, so a slot adds less */
    for (int rec = 0; rec < 2; rec++) {
        dt_model *one = NULL, *three = NULL;
        c.recompute = rec ? DT_RECOMPUTE_BLOCK : DT_RECOMPUTE_NONE;
        c.pp_rank = 0, c.pp_first = 0, c.pp_count = 2;
        c.pp_slots = 1;
        DT_REQUIRE_OK(dt_model_create(&one, &c, be, NULL, &err), &err);
        c.pp_slots = 3;
        DT_REQUIRE_OK(dt_model_create(&three, &c, be, NULL, &err), &err);
        DT_CHECK(three->pp_slot_bytes > 0 && three->pp_slot_bytes == one->pp_slot_bytes);
        DT_CHECK_INT(three->activation_bytes - one->activation_bytes, 2 * one->pp_slot_bytes);
        if (rec)
            DT_CHECK_MSG(one->pp_slot_bytes < s0->pp_slot_bytes,
                         "recompute = block: a slot of %zu bytes, %zu without", one->pp_slot_bytes,
                         s0->pp_slot_bytes);
        dt_model_free(one);
        dt_model_free(three);
    }
    c.recompute = DT_RECOMPUTE_NONE;
    c.pp_rank = 1, c.pp_count = 1, c.pp_slots = 2;
    dt_model *bad = NULL;
    c.pp_first = 1; /* the last stage must end at the last block */
    DT_CHECK(dt_model_create(&bad, &c, be, NULL, &err) == -EINVAL);
    DT_CHECK_CONTAINS(err.msg, "the last ends at block 2");
    dt_model_free(bad);
    dt_test_batch_free(&hb);
    dt_model_free(s0);
    dt_model_free(s1);
    dt_backend_close(be);
}

/* ---- end to end through the trainer ------------------------------------------------------- */

#define MAX_RANKS 8
#define MAX_STEPS 24
#define MAX_PER 32768
#define MAX_TENS 64
#define MAX_BUFS 4096

/* The fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt dt_test_fmt

static const char *repo_dir(void) { return dt_test_repo_dir("configs"); }

typedef struct rank_out {
    int status;                    /* 0 ok, 2 failed (msg) */
    char msg[1200];
    char strategy[16];
    double loss[MAX_STEPS], norm[MAX_STEPS];
    double eval_loss, eval_acc;
    int64_t step, start_step;      /* at the end; right after init (a resume's) */
    size_t numel;                  /* of the whole model, as the checkpoint holds it */
    size_t whole_params;           /* the strategy's whole count (dt_strategy.whole_params) */
    size_t local_params;           /* this rank's model buffer */
    int num_states;
    dt_pp_stats st;
    bool have_st;
    int64_t skipped, optim_t;      /* the loss scaler's skipped steps, the optimiser's t */
    double scale;
    char summary[64];              /* the strategy's summary line */
    size_t optim_bytes;            /* the backend's DT_MEM_OPTIM bytes at the end (this rank's
                                      optimiser state, as test_memory and bench memory count) */
    size_t nbufs;                  /* the whole model's buffers (BatchNorm's running statistics) */
    float start_bufs[MAX_BUFS];    /* ... right after init (a resume's) */
    float bufs[MAX_BUFS];          /* ... at the end */
    float start_params[MAX_PER];   /* right after init (a resume's parameters) */
    float params[MAX_PER];         /* at the end, whole */
    float state[2][MAX_PER];
    /* prun.grads_step: this rank's tensors' gradients as that step left them */
    int ntens;
    char tname[MAX_TENS][DT_TENSOR_NAME_MAX];
    size_t toff[MAX_TENS], tnumel[MAX_TENS];
    float grads[MAX_PER];
} rank_out;

typedef struct prun {
    const char *ov[32];
    int nov;
    int N;
    int steps;
    bool run;                      /* dt_trainer_run (checkpoints) instead of steps x step */
    bool eval;                     /* an evaluation after the steps */
    int kill_rank, kill_step;      /* that rank dies (SIGKILL) before that step; -1: none */
    bool stall;                    /* ... it stops (SIGSTOP) instead: killed once the others
                                      have ended */
    int overflow_rank;             /* its stage's weights named fc.3.weight x 1e30; -1: none */
    int grads_step;                /* the gradients after that step (1-based) kept; 0: none */
    char name[64];
    char dir[PATH_MAX];
    int port;
    rank_out *out;
    int status[MAX_RANKS];         /* as waitpid gave them */
    const char *config;            /* configs/<config> */
} prun;

static void padd(prun *r, const char *ov) { r->ov[r->nov++] = ov; }

static prun pbase(int N, int P, int M, const char *sched, const char *name)
{
    prun r;
    memset(&r, 0, sizeof r);
    r.N = N;
    r.steps = 20;
    r.kill_rank = -1;
    r.overflow_rank = -1;
    r.config = "mlp.ini";
    snprintf(r.name, sizeof r.name, "%s", name);
    padd(&r, "job.device=cpu");
    padd(&r, "train.threads=1");
    padd(&r, "job.cpu_bind=none");
    padd(&r, "checkpoint.resume=never");
    padd(&r, "checkpoint.every=0");
    padd(&r, "checkpoint.async=false");
    padd(&r, "ddp.timeout=10");
    padd(&r, "train.batch_size=8");
    padd(&r, "train.warmup_steps=2");
    padd(&r, "train.lr=0.003");
    padd(&r, "train.grad_clip=0.5");   /* the global norm, across the stages, clips */
    padd(&r, fmt("elastic.nproc_per_node=%d", N)); /* the world the layout is checked against */
    padd(&r, fmt("parallel.pipeline=%d", P));
    padd(&r, fmt("parallel.micro_batches=%d", M));
    padd(&r, fmt("parallel.schedule=%s", sched));
    padd(&r, "model.hidden=13,11,7"); /* 4 Linear layers: 4 stages at most */
    return r;
}

/* pgpt makes bert runs instead (the same shape, with the NSP head and the MLM samples of the
 * text) when set: by the bert tests, before anything forks. */
static bool pbert;

/* The same with a tiny gpt on bytes of text (configs/quickstart.ini): 4 transformer blocks. */
static prun pgpt(int N, int P, int M, const char *sched, const char *name)
{
    prun r = pbase(N, P, M, sched, name);
    r.nov--; /* not the mlp's widths */
    r.config = "quickstart.ini";
    padd(&r, "model.n_layer=4");
    padd(&r, "model.n_head=2");
    padd(&r, "model.n_embd=16");
    padd(&r, "model.block_size=16");
    padd(&r, "data.seq_len=16");
    if (pbert) {
        padd(&r, "model.type=bert");
        padd(&r, "model.nsp=true");
    }
    return r;
}

/* A tiny llama (configs/llama.ini): 4 decoder layers, 4 query heads on 2 key/value heads, the
 * embedding on the first stage, model.norm and the untied lm_head on the last. */
static prun pllama(int N, int P, int M, const char *sched, const char *name)
{
    prun r = pgpt(N, P, M, sched, name);
    r.config = "llama.ini";
    padd(&r, "model.n_head=4");
    padd(&r, "model.n_kv_head=2");
    padd(&r, "model.intermediate_size=24");
    return r;
}

/* The whole model and optimiser state as a checkpoint takes them (the model's buffers, the
 * "model" file's buffer copied at save, into bufs). */
static void record_state(dt_trainer *t, rank_out *o, float *params, float *bufs_out,
                         bool states)
{
    dt_strategy *s = t->s;
    dt_err err = {0};
    if (s->ops->gather_state && s->ops->gather_state(s, &err) != 0) {
        snprintf(o->msg, sizeof o->msg, "gather_state: %.1000s", err.msg);
        o->status = 2;
        return;
    }
    dt_ckpt_buf bufs[8];
    int n = 0;
    if (s->ops->state(s, bufs, 8, &n, &err) != 0) {
        snprintf(o->msg, sizeof o->msg, "state: %.1000s", err.msg);
        o->status = 2;
        return;
    }
    for (int i = 0; i < n; i++) {
        if (bufs[i].numel > MAX_PER) {
            snprintf(o->msg, sizeof o->msg, "%zu elements: raise MAX_PER", bufs[i].numel);
            o->status = 2;
            return;
        }
        if (!strcmp(bufs[i].file, "model") && bufs[i].copy_at_save) {
            if (bufs[i].numel > MAX_BUFS) {
                snprintf(o->msg, sizeof o->msg, "%zu buffer elements: raise MAX_BUFS",
                         bufs[i].numel);
                o->status = 2;
                return;
            }
            o->nbufs = bufs[i].numel;
            t->be->memcpy_d2h(t->be, bufs_out, bufs[i].data, bufs[i].numel * sizeof(float));
        } else if (!strcmp(bufs[i].file, "model")) {
            o->numel = bufs[i].numel;
            t->be->memcpy_d2h(t->be, params, bufs[i].data, bufs[i].numel * sizeof(float));
        } else if (states && !strcmp(bufs[i].file, "optim") && o->num_states < 2) {
            t->be->memcpy_d2h(t->be, o->state[o->num_states++], bufs[i].data,
                              bufs[i].numel * sizeof(float));
        }
    }
}

/* This rank's tensors' gradients as the step left them (synchronised, clipped unless
 * train.grad_clip = 0; cpu: backend memory is host memory). */
static void record_grads(dt_trainer *t, rank_out *o)
{
    const dt_model *m = t->model;
    size_t at = 0;
    o->ntens = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const dt_tensor_info *ti = &m->tensors[i];
        if (i >= MAX_TENS || at + ti->numel > MAX_PER) {
            snprintf(o->msg, sizeof o->msg, "gradients: raise MAX_TENS or MAX_PER");
            o->status = 2;
            return;
        }
        dt_strlcpy(o->tname[i], ti->name, sizeof o->tname[i]);
        o->toff[i] = at;
        o->tnumel[i] = ti->numel;
        memcpy(o->grads + at, m->grads + ti->offset, ti->numel * sizeof(float));
        at += ti->numel;
        o->ntens++;
    }
}

static void rank_body(prun *r, int rank)
{
    static dt_job job;
    static dt_trainer t;
    rank_out *o = &r->out[rank];
    dt_config_errors errs = {0};
    dt_err err = {0};
    const char *ov[40];
    int n = 0;
    for (int i = 0; i < r->nov; i++)
        ov[n++] = r->ov[i];
    ov[n++] = fmt("job.output_dir=%s/%s", r->dir, r->name);
    if (dt_job_load(&job, fmt("%s/configs/%s", repo_dir(), r->config), (char **)ov, n, &errs,
                    &err) != 0) {
        snprintf(o->msg, sizeof o->msg, "job: %.500s %.500s", err.msg,
                 errs.count ? errs.lines[0] : "");
        o->status = 2;
        _exit(2);
    }
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = r->N;
    dt_strlcpy(env.store_addr, "127.0.0.1", sizeof env.store_addr);
    env.store_port = r->port;
    snprintf(env.run_id, sizeof env.run_id, "%s-%d", r->name, (int)getppid());
    if (dt_trainer_init(&t, &job, &env, &err) != 0)
        goto fail;
    dt_strlcpy(o->strategy, t.s->ops->name, sizeof o->strategy);
    o->start_step = t.step;
    o->whole_params = t.s->whole_params;
    o->local_params = t.model->num_params;
    int w = rank == r->overflow_rank ? dt_model_find_tensor(t.model, "fc.3.weight") : -1;
    if (w >= 0) { /* cpu: backend memory is host memory */
        const dt_tensor_info *ti = &t.model->tensors[w];
        for (size_t i = 0; i < ti->numel; i++)
            t.model->params[ti->offset + i] *= 1e30f;
    }
    record_state(&t, o, o->start_params, o->start_bufs, false);
    if (o->status)
        _exit(2);
    if (r->run) {
        if (dt_trainer_run(&t, NULL, &err) != 0)
            goto fail;
    } else {
        for (int k = 0; k < r->steps; k++) {
            if (rank == r->kill_rank && k == r->kill_step)
                kill(getpid(), r->stall ? SIGSTOP : SIGKILL);
            if (dt_trainer_step(&t, &err) != 0)
                goto fail;
            o->loss[k] = t.loss;
            o->norm[k] = t.grad_norm;
            if (k + 1 == r->grads_step)
                record_grads(&t, o);
        }
    }
    if (r->eval && dt_trainer_eval(&t, &o->eval_loss, &o->eval_acc, &err) != 0)
        goto fail;
    o->have_st = dt_strategy_pipeline_stats(t.s, &o->st) == 0;
    dt_strlcpy(o->summary, t.s->summary, sizeof o->summary);
    dt_mem_stats ms;
    dt_mem_read(t.be, &ms);
    o->optim_bytes = ms.cur[DT_MEM_OPTIM];
    o->skipped = t.scaler.skipped;
    o->optim_t = t.optim->t;
    o->scale = t.scaler.scale;
    o->step = t.step;
    record_state(&t, o, o->params, o->bufs, true);
    dt_trainer_close(&t);
    _exit(o->status);
fail:
    dt_strlcpy(o->msg, err.msg, sizeof o->msg);
    o->status = 2;
    _exit(2);
}

/* Runs r's ranks; true when every one exited 0 (else a failure naming the first that did not). */
static bool prun_run(prun *r)
{
    DT_REQUIRE(r->N <= MAX_RANKS && r->steps <= MAX_STEPS);
    size_t bytes = sizeof(rank_out) * (size_t)r->N;
    r->out = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    DT_REQUIRE(r->out != MAP_FAILED);
    if (!r->dir[0])
        dt_strlcpy(r->dir, dt_test_tmpdir(), sizeof r->dir);
    pid_t srv = dt_test_store_start(&r->port);
    pid_t pids[MAX_RANKS];
    int status[MAX_RANKS];
    fflush(stdout);
    fflush(stderr);
    for (int k = 0; k < r->N; k++) {
        pids[k] = fork();
        DT_REQUIRE(pids[k] >= 0);
        if (pids[k] == 0)
            rank_body(r, k);
    }
    double deadline = dt_test_now() + 40 * dt_test_timeout_scale();
    int ended = 0;
    for (int k = 0; k < r->N; k++)
        for (;;) {
            if (waitpid(pids[k], &status[k], WNOHANG) == pids[k]) {
                ended++;
                break;
            }
            if (r->stall && k == r->kill_rank) {
                /* the stopped rank waits for the others to give up on it */
                int others = 0;
                for (int q = 0; q < r->N; q++)
                    others += q != k && dt_test_pid_gone(pids[q]);
                if (others == r->N - 1)
                    kill(pids[k], SIGKILL);
            }
            if (dt_test_now() > deadline) {
                for (int q = 0; q < r->N; q++)
                    kill(pids[q], SIGKILL);
                waitpid(pids[k], &status[k], 0);
                dt_test_fail_at(__FILE__, __LINE__, "%s: rank %d hung", r->name, k);
                break;
            }
            dt_sleep_ms(5);
        }
    dt_test_store_stop(srv);
    bool ok = true;
    for (int k = 0; k < r->N; k++) {
        r->status[k] = status[k];
        if (r->kill_rank >= 0)
            continue; /* the caller looks at each rank's end */
        if (!WIFEXITED(status[k]) || WEXITSTATUS(status[k]) != 0) {
            dt_test_fail_at(__FILE__, __LINE__, "%s: rank %d: status %d: %s", r->name, k,
                            status[k], r->out[k].msg);
            ok = false;
        }
    }
    return ok;
}

static void prun_free(prun *r)
{
    if (r->out)
        munmap(r->out, sizeof(rank_out) * (size_t)r->N);
    r->out = NULL;
}

/* |a - b| / |b| over the whole parameter (or optimiser-state) vector, 2-norms in double, as
 * test_tensor.c compares; not the largest element's difference over the largest element. The
 * layouts sum the same gradients in other orders (micro-batches, data-parallel replicas,
 * accumulated micro-steps), so the gradients agree to rounding (every tensor's within 1e-6 of
 * one process's after the first step, gpt_d2_p2_accum), but AdamW divides each element by its
 * own |g| + eps: an element whose gradient is near eps = 1e-8 turns a rounding difference of
 * 1e-10 into a fraction of a step of lr, and momentum on a gradient that changes sign the next
 * step amplifies it again. gpt at D2 x P2 with grad_accum = 2: wte's element 1684 has a first
 * gradient of -1.355e-8 there and -1.382e-8 in one process (the tensor's largest ~1e-2), the
 * weights are 7.4e-6 apart after that step, and after 20 steps h.1.attn.c_proj.weight's element
 * 77 ends 2.1e-5 apart (2.0e-5 of the largest weight) while the loss agrees within 3e-7; plain
 * DDP at D = 2 ends the same, P = 2 alone 1.2e-5; with SGD, or AdamW at eps = 1e-6, all are
 * within 4e-7. Over the whole vector it is 6.4e-6; a wrong gradient (a tensor summed twice, a
 * loss weight off) moves every element of a tensor and shows in the 2-norm, and before that in
 * the gradient norm compared at every step. */
static double vec_rel(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        m += (double)b[i] * (double)b[i];
    }
    return m > 0 ? sqrt(d / m) : sqrt(d);
}

/* Every step's loss and gradient norm of pp's rank 0 against the reference b within 1e-5
 * relative, and every rank of pp logging rank 0's loss; returns the worst loss difference. */
static double check_losses(const prun *pp, const rank_out *b, int N)
{
    const rank_out *a = &pp->out[0];
    double worst_loss = 0;
    for (int k = 0; k < pp->steps; k++) {
        double rel = fabs(a->loss[k] - b->loss[k]) / fabs(b->loss[k]);
        worst_loss = fmax(worst_loss, rel);
        DT_CHECK_MSG(rel <= 1e-5, "%s: step %d loss %.9g vs one process %.9g", pp->name, k + 1,
                     a->loss[k], b->loss[k]);
        DT_CHECK_MSG(fabs(a->norm[k] - b->norm[k]) <= 1e-5 * b->norm[k],
                     "%s: step %d gradient norm %.9g vs %.9g", pp->name, k + 1, a->norm[k],
                     b->norm[k]);
        for (int q = 1; q < N; q++) /* every rank logs the same loss */
            DT_CHECK(pp->out[q].loss[k] == a->loss[k]);
    }
    return worst_loss;
}

/* D x T x P ranks (D data-parallel replicas of batch 8 / D, T tensor ranks, P stages of M
 * micro-batches of `sched`) against one process of batch 8, 20 steps; more: overrides for both
 * (NULL-terminated), tag: their name in the runs' names. */
typedef prun (*prun_make)(int N, int P, int M, const char *sched, const char *name);

static void against_one_made(prun_make make, int D, int T, int P, int M, const char *sched,
                             const char *const *more, const char *tag)
{
    const int N = D * T * P;
    prun one = make(1, 1, 1, "1f1b", fmt("one-%d-%s%s", P, sched, tag));
    prun pp = make(N, P, M, sched, fmt("p%d-m%d-%s%s", P, M, sched, tag));
    one.eval = pp.eval = true;
    padd(&pp, fmt("parallel.tensor=%d", T));
    padd(&pp, fmt("train.batch_size=%d", 8 / D));
    /* evaluation over the whole validation set (BatchNorm on the running statistics) */
    one.eval = pp.eval = true;
    padd(&one, "train.eval_batches=1000");
    padd(&pp, "train.eval_batches=1000");
    int zero = 0; /* the layout must run parallel.zero; the reference is one plain process
                   * (stage 3 on one rank would run stage 3: it is not given the key) */
    for (; more && *more; more++) {
        bool zkey = !strncmp(*more, "parallel.zero=", 14);
        if (!zkey && strncmp(*more, "parallel.sequence_parallel=", 27)) /* the layout's only */
            padd(&one, *more);
        padd(&pp, *more);
        if (zkey)
            zero = atoi(*more + 14);
    }
    if (!prun_run(&one) || !prun_run(&pp))
        goto out;
    const rank_out *a = &pp.out[0], *b = &one.out[0];
    DT_CHECK_STR(a->strategy, "pipeline");
    if (zero > 0 && D > 1)
        DT_CHECK_CONTAINS(a->summary, fmt("ZeRO-%d", zero));
    DT_CHECK_STR(b->strategy, "single");
    DT_REQUIRE(a->numel == b->numel && a->numel > 0);
    /* every layout starts bit-identical to one process */
    DT_CHECK_MSG(!memcmp(a->start_params, b->start_params, a->numel * sizeof(float)),
                 "%s: the initial parameters differ from one process's", pp.name);
    double worst_loss = check_losses(&pp, b, N);
    double wp = vec_rel(a->params, b->params, a->numel);
    DT_CHECK_MSG(wp <= 1e-5, "%s: weights after %d steps differ by %.3g (2-norm relative)",
                 pp.name, pp.steps, wp);
    /* every rank that gathers the whole model (at ZeRO-3 only each data-parallel group's rank
     * 0: dpsync.h; rank = (pp * D + dp) * T + tp) gathers the same */
    for (int q = 1; q < N; q++)
        if (zero < 3 || (q / T) % D == 0)
            DT_CHECK_MSG(!memcmp(pp.out[q].params, a->params, a->numel * sizeof(float)),
                         "%s: rank %d gathered other weights than rank 0", pp.name, q);
    DT_CHECK_INT(a->num_states, b->num_states);
    double ws = 0;
    for (int i = 0; i < a->num_states && i < b->num_states; i++)
        ws = fmax(ws, vec_rel(a->state[i], b->state[i], a->numel));
    DT_CHECK_MSG(ws <= 1e-4, "%s: optimiser state differs by %.3g (2-norm relative)", pp.name,
                 ws);
    DT_CHECK_MSG(fabs(a->eval_loss - b->eval_loss) <= 1e-5 * b->eval_loss,
                 "%s: eval loss %.9g vs %.9g", pp.name, a->eval_loss, b->eval_loss);
    DT_CHECK_NEAR(a->eval_acc, b->eval_acc, 1e-12);
    /* the schedule's memory: 1F1B keeps min(P - s, M) micro-batches alive on stage s */
    for (int q = 0; q < N; q++) {
        const rank_out *o = &pp.out[q];
        DT_REQUIRE(o->have_st);
        DT_CHECK_INT(o->st.stage, q / (D * T)); /* rank = (pp * D + dp) * T + tp */
        int want = !strcmp(sched, "gpipe") ? M : (P - o->st.stage < M ? P - o->st.stage : M);
        DT_CHECK_INT(o->st.peak_in_flight, want);
        DT_CHECK_INT(o->st.slots, want);
        /* what the worker logs: the whole model's count, and the stage's share of it */
        DT_CHECK_INT(o->whole_params, b->numel);
        DT_CHECK_MSG(o->local_params > 0 && o->local_params < o->whole_params,
                     "%s: rank %d holds %zu of %zu parameters", pp.name, q, o->local_params,
                     o->whole_params);
    }
    DT_CHECK_INT(b->whole_params, 0); /* one process: its model is the whole one */
    printf("    %-18s loss %.6f -> %.6f (one process %.6f), loss within %.2g, weights %.2g, "
           "state %.2g\n",
           pp.name, a->loss[0], a->loss[pp.steps - 1], b->loss[pp.steps - 1], worst_loss, wp,
           ws);
out:
    prun_free(&one);
    prun_free(&pp);
}

static void against_one_layout(bool gpt, int D, int T, int P, int M, const char *sched,
                               const char *const *more, const char *tag)
{
    against_one_made(gpt ? pgpt : pbase, D, T, P, M, sched, more, tag);
}

static void against_one_model(bool gpt, int P, int M, const char *sched,
                              const char *const *more, const char *tag)
{
    against_one_layout(gpt, 1, 1, P, M, sched, more, tag);
}

static void against_one_with(int P, int M, const char *sched, const char *const *more,
                             const char *tag)
{
    against_one_model(false, P, M, sched, more, tag);
}

static void against_one(int P, int M, const char *sched)
{
    against_one_with(P, M, sched, NULL, "");
}

/* Gradient accumulation, fp16 loss scaling, SGD with momentum, a global batch, and a batch that
 * M does not divide into equal micro-batches (under train.global_batch the micro-steps differ). */
static void test_options(void)
{
    const char *const accum[] = {"train.grad_accum=3", NULL};
    const char *const fp16[] = {"train.precision=fp16", NULL};
    const char *const sgd[] = {"train.optimizer=sgd", "train.momentum=0.9", NULL};
    const char *const gb[] = {"train.global_batch=20", NULL}; /* micro-steps of 8, 8 and 4 */
    const char *const gb8[] = {"train.global_batch=19", NULL}; /* 8, 8 and 3 < M = 8 */
    against_one_with(2, 4, "1f1b", accum, "-accum");
    against_one_with(3, 2, "gpipe", fp16, "-fp16");
    against_one_with(2, 4, "gpipe", sgd, "-sgd");
    against_one_with(2, 4, "1f1b", gb, "-gb");
    against_one_with(3, 8, "1f1b", gb8, "-gb-short");
}

/* fp16: an overflow in one stage's gradients skips the step on every stage. The last stage's
 * classifier x 1e30 (rank 1 only): its own weight gradients stay finite (they do not scale with
 * the weights), the input gradient it sends back overflows, so stage 0's gradients are inf and
 * stage 1 must learn of it through the global norm. */
static void test_overflow_skips_everywhere(void)
{
    prun r = pbase(2, 2, 4, "1f1b", "overflow");
    padd(&r, "train.precision=fp16");
    padd(&r, "train.loss_scale=1e12");
    r.overflow_rank = 1;
    r.steps = 1;
    if (prun_run(&r))
        for (int q = 0; q < 2; q++) {
            DT_CHECK_MSG(r.out[q].skipped == 1 && r.out[q].optim_t == 0 &&
                             r.out[q].scale == 5e11,
                         "rank %d: %lld skipped, t %lld, scale %g", q,
                         (long long)r.out[q].skipped, (long long)r.out[q].optim_t,
                         r.out[q].scale);
            DT_CHECK_MSG(!isfinite(r.out[q].norm[0]), "rank %d: norm %g", q, r.out[q].norm[0]);
        }
    prun_free(&r);
}

/* The same under ZeRO-1 at D = 2 x P = 2: rank 2 (stage 1, data-parallel rank 0) alone
 * overflows; the shards' sums carry the inf to every rank's norm, and all four skip. */
static void test_overflow_skips_everywhere_zero(void)
{
    prun r = pbase(4, 2, 4, "1f1b", "overflow-zero");
    padd(&r, "train.precision=fp16");
    padd(&r, "train.loss_scale=1e12");
    padd(&r, "train.batch_size=4");
    padd(&r, "parallel.zero=1");
    r.overflow_rank = 2;
    r.steps = 1;
    if (prun_run(&r)) {
        DT_CHECK_CONTAINS(r.out[0].summary, "ZeRO-1");
        for (int q = 0; q < 4; q++) {
            DT_CHECK_MSG(r.out[q].skipped == 1 && r.out[q].optim_t == 0 &&
                             r.out[q].scale == 5e11,
                         "rank %d: %lld skipped, t %lld, scale %g", q,
                         (long long)r.out[q].skipped, (long long)r.out[q].optim_t,
                         r.out[q].scale);
            DT_CHECK_MSG(!isfinite(r.out[q].norm[0]), "rank %d: norm %g", q, r.out[q].norm[0]);
        }
    }
    prun_free(&r);
}

/* D = 2 x P = 2 (4 ranks): DDP over each stage's two replicas, against plain DDP on 2 ranks
 * (the same global batch, the same shards). */
static void test_d2_p2(void)
{
    prun ddp = pbase(2, 1, 1, "1f1b", "ddp-2");
    prun pp = pbase(4, 2, 4, "1f1b", "d2-p2-1f1b");
    pp.steps = ddp.steps = 10;
    if (!prun_run(&ddp) || !prun_run(&pp))
        goto out;
    const rank_out *a = &pp.out[0], *b = &ddp.out[0];
    DT_CHECK_STR(a->strategy, "pipeline");
    DT_CHECK_STR(b->strategy, "ddp");
    for (int k = 0; k < pp.steps; k++)
        DT_CHECK_MSG(fabs(a->loss[k] - b->loss[k]) <= 1e-5 * fabs(b->loss[k]),
                     "%s: step %d loss %.9g vs DDP %.9g", pp.name, k + 1, a->loss[k],
                     b->loss[k]);
    double wp = vec_rel(a->params, b->params, a->numel);
    DT_CHECK_MSG(wp <= 1e-5, "%s: weights differ from DDP's by %.3g relative", pp.name, wp);
    for (int q = 1; q < 4; q++)
        DT_CHECK_MSG(!memcmp(pp.out[q].params, a->params, a->numel * sizeof(float)),
                     "%s: rank %d gathered other weights than rank 0", pp.name, q);
    printf("    %-18s loss %.6f -> %.6f (DDP %.6f), weights within %.2g\n", pp.name, a->loss[0],
           a->loss[pp.steps - 1], b->loss[pp.steps - 1], wp);
out:
    prun_free(&ddp);
    prun_free(&pp);
}


/* ZeRO 1-2 over each stage's data-parallel group against one process on the same global batch
 * over 20 steps: mlp at D2 x P2 (zero = 1 under 1F1B, zero = 2 under GPipe), gpt at D2 x P2 with
 * the tied wte (its two copies sharded differently, summed over the embedding group before the
 * reduce-scatter) at zero = 1 and 2, and gpt at D2 x T2 x P2 (8 ranks) at zero = 1; with
 * accumulation, fp16 and a global batch. Then each
 * rank's optimiser state (the allocator's DT_MEM_OPTIM bytes) at D2 x P2 with zero = 1 against
 * zero = 0: half, within 2% (chunks padded to ceil(n / 2)). */
static void test_d2_p2_zero(void)
{
    const char *const z1[] = {"parallel.zero=1", "ddp.first_bucket_mb=0.001",
                              "ddp.bucket_cap_mb=0.004", NULL};
    const char *const z2[] = {"parallel.zero=2", "ddp.first_bucket_mb=0.001",
                              "ddp.bucket_cap_mb=0.004", NULL};
    against_one_layout(false, 2, 1, 2, 4, "1f1b", z1, "-d2-zero1");
    against_one_layout(false, 2, 1, 2, 4, "gpipe", z2, "-d2-zero2");
    against_one_layout(true, 2, 1, 2, 4, "1f1b", z1, "-gpt-d2-zero1");
    against_one_layout(true, 2, 1, 2, 2, "gpipe", z2, "-gpt-d2-zero2");
    against_one_layout(true, 2, 2, 2, 2, "1f1b", z1, "-gpt-d2-t2-zero1");
    /* accumulation (stage 2: the earlier micro-steps keep the whole gradient), fp16 (the
     * shards unscaled; an overflow anywhere skips everywhere), a global batch of unequal shares */
    const char *const acc[] = {"parallel.zero=2", "train.grad_accum=3", NULL};
    const char *const f16[] = {"parallel.zero=1", "train.precision=fp16", NULL};
    const char *const gb[] = {"parallel.zero=2", "train.global_batch=20", NULL};
    against_one_layout(false, 2, 1, 2, 4, "1f1b", acc, "-d2-zero2-accum");
    against_one_layout(true, 2, 1, 2, 2, "1f1b", f16, "-gpt-d2-zero1-fp16");
    against_one_layout(false, 2, 1, 2, 2, "gpipe", gb, "-d2-zero2-gb");
    /* stage 3: each stage's parameters sharded over its replicas, gathered block by block
     * around each micro-batch's forward and backward; the tied wte's block held back until the
     * embedding group summed it; with an accumulation too (gpt's: gpt_d2_p2_accum) */
    const char *const z3[] = {"parallel.zero=3", NULL};
    const char *const z3acc[] = {"parallel.zero=3", "train.grad_accum=2", NULL};
    against_one_layout(false, 2, 1, 2, 4, "1f1b", z3, "-d2-zero3");
    against_one_layout(true, 2, 1, 2, 4, "1f1b", z3, "-gpt-d2-zero3");
    against_one_layout(false, 2, 1, 2, 2, "gpipe", z3acc, "-d2-zero3-accum");
    against_one_layout(true, 2, 2, 2, 2, "1f1b", z3, "-gpt-d2-t2-zero3");
    prun r[3];
    for (int zero = 0; zero < 3; zero++) { /* 0, 1, 3 */
        int stage = zero == 2 ? 3 : zero;
        r[zero] = pgpt(4, 2, 2, "1f1b", fmt("gpt-d2-p2-mem-zero%d", stage));
        padd(&r[zero], "train.batch_size=4");
        padd(&r[zero], fmt("parallel.zero=%d", stage));
        r[zero].steps = 2;
    }
    if (prun_run(&r[0]) && prun_run(&r[1]) && prun_run(&r[2]))
        for (int q = 0; q < 4; q++)
            for (int k = 1; k < 3; k++) {
                double half = (double)r[0].out[q].optim_bytes / 2;
                double rel = fabs((double)r[k].out[q].optim_bytes - half) / half;
                DT_CHECK_MSG(half > 0 && rel <= 0.02, "rank %d (stage %d): optimiser state %zu "
                             "bytes at zero = %d, %zu at zero = 0 (%.2f%% off half)", q, q / 2,
                             r[k].out[q].optim_bytes, k == 2 ? 3 : 1, r[0].out[q].optim_bytes,
                             100 * rel);
                printf("    rank %d (stage %d): optimiser state %zu bytes at zero = %d, %zu at "
                       "zero = 0\n", q, q / 2, r[k].out[q].optim_bytes, k == 2 ? 3 : 1,
                       r[0].out[q].optim_bytes);
            }
    for (int k = 0; k < 3; k++)
        prun_free(&r[k]);
}

/* gpt at D = 2 x P = 2 with grad_accum = 2 (zero = 0): the tied wte's two copies accumulate
 * over both micro-steps and are summed over the embedding group once, after DDP's buckets.
 * First the gradients themselves, before any optimiser can amplify a difference: after step 1
 * with no clipping, every tensor of every rank within 1e-5 of one process's (2-norm relative;
 * they agree within 1e-6: a tensor summed over the embedding group on every micro-step, or a
 * loss weight off by grad_accum, is 1 or more off). Then 20 steps against one process with
 * AdamW (both schedules) and SGD, and with ZeRO-3 (wte's block held over both micro-steps). */
static void grads_against_one(int D, int P, int M, const char *sched, int accum)
{
    const int N = D * P;
    prun one = pgpt(1, 1, 1, "1f1b", fmt("grads-one-a%d", accum));
    prun pp = pgpt(N, P, M, sched, fmt("grads-d%d-p%d-m%d-%s-a%d", D, P, M, sched, accum));
    prun *both[2] = {&one, &pp};
    for (int k = 0; k < 2; k++) {
        padd(both[k], fmt("train.grad_accum=%d", accum));
        padd(both[k], "train.grad_clip=0");
        both[k]->steps = both[k]->grads_step = 1;
    }
    padd(&pp, fmt("train.batch_size=%d", 8 / D));
    if (!prun_run(&one) || !prun_run(&pp))
        goto out;
    const rank_out *b = &one.out[0];
    DT_CHECK_MSG(fabs(pp.out[0].loss[0] - b->loss[0]) <= 1e-6 * b->loss[0] &&
                     fabs(pp.out[0].norm[0] - b->norm[0]) <= 1e-6 * b->norm[0],
                 "%s: loss %.9g, gradient norm %.9g; one process %.9g, %.9g", pp.name,
                 pp.out[0].loss[0], pp.out[0].norm[0], b->loss[0], b->norm[0]);
    double worst = 0;
    const char *worst_name = "";
    int covered[MAX_TENS] = {0};
    for (int q = 0; q < N; q++) {
        const rank_out *a = &pp.out[q];
        DT_CHECK(a->ntens > 0);
        for (int i = 0; i < a->ntens; i++) {
            int j = 0;
            while (j < b->ntens && strcmp(b->tname[j], a->tname[i]))
                j++;
            DT_CHECK_MSG(j < b->ntens, "%s: rank %d's %s is not one process's", pp.name, q,
                         a->tname[i]);
            if (j == b->ntens)
                continue;
            DT_REQUIRE(a->tnumel[i] == b->tnumel[j]);
            covered[j]++;
            double r = vec_rel(a->grads + a->toff[i], b->grads + b->toff[j], a->tnumel[i]);
            DT_CHECK_MSG(r <= 1e-5, "%s: rank %d: the gradient of %s differs from one "
                         "process's by %.3g (2-norm relative)", pp.name, q, a->tname[i], r);
            if (r > worst)
                worst = r, worst_name = b->tname[j];
        }
    }
    /* every tensor on the D replicas of its stage, wte on both ends' */
    for (int j = 0; j < b->ntens; j++)
        DT_CHECK_MSG(covered[j] == (!strcmp(b->tname[j], "wte.weight") ? 2 * D : D),
                     "%s: %s held by %d ranks", pp.name, b->tname[j], covered[j]);
    printf("    %-28s step 1 gradients within %.2g of one process (worst %s)\n", pp.name,
           worst, worst_name);
out:
    prun_free(&one);
    prun_free(&pp);
}

static void test_gpt_d2_p2_accum(void)
{
    grads_against_one(2, 2, 2, "1f1b", 2);
    grads_against_one(2, 2, 4, "gpipe", 2);
    const char *const acc[] = {"train.grad_accum=2", NULL};
    const char *const sgd[] = {"train.grad_accum=2", "train.optimizer=sgd", "train.momentum=0.9",
                               NULL};
    const char *const z3[] = {"train.grad_accum=2", "parallel.zero=3", NULL};
    against_one_layout(true, 2, 1, 2, 2, "1f1b", acc, "-gpt-d2-accum");
    against_one_layout(true, 2, 1, 2, 4, "gpipe", acc, "-gpt-d2-accum");
    against_one_layout(true, 2, 1, 2, 2, "1f1b", sgd, "-gpt-d2-accum-sgd");
    against_one_layout(true, 2, 1, 2, 2, "1f1b", z3, "-gpt-d2-accum-z3");
}

/* gpt: the embeddings on stage 0, ln_f and the tied head on the last, the two copies of wte
 * kept equal by the embedding group's all-reduce. */
static void test_gpt_p2(void)
{
    against_one_model(true, 2, 4, "1f1b", NULL, "-gpt");
    against_one_model(true, 2, 2, "gpipe", NULL, "-gpt");
}

/* The mix: tensor parallelism inside each stage (T = 2 x P = 2 on 4 ranks), and D = 2 x T = 2 x
 * P = 2 on 8 ranks (a tiny gpt), each equal to one process on the same global batch. */
static void test_gpt_t2_p2(void) { against_one_layout(true, 1, 2, 2, 4, "1f1b", NULL, "-t2"); }

static void test_gpt_d2_t2_p2(void)
{
    against_one_layout(true, 2, 2, 2, 2, "1f1b", NULL, "-d2-t2");
}

/* bert (bert.c's stages: the embeddings on stage 0, the MLM and NSP heads and a copy of the
 * tied word embeddings on the last, kept equal by the embedding group): P = 2 and 4, the seed's
 * mix T = 2 x P = 2 (also with sequence parallelism: the stages pass the shards) and D = 2 x T =
 * 2 x P = 2, and D = 2 x P = 2 under ZeRO-1 with recompute = block, each against one process on
 * the same global batch. */
static void test_bert_pipeline(void)
{
    pbert = true;
    const char *const sel[] = {"train.recompute=selective", NULL};
    const char *const z1[] = {"parallel.zero=1", "train.recompute=block", NULL};
    against_one_model(true, 2, 4, "1f1b", NULL, "-bert");
    against_one_model(true, 4, 4, "gpipe", sel, "-bert-sel");
    const char *const sp[] = {"parallel.sequence_parallel=true", NULL};
    against_one_layout(true, 1, 2, 2, 4, "1f1b", NULL, "-bert-t2");
    against_one_layout(true, 1, 2, 2, 4, "gpipe", sp, "-bert-t2-sp");
    against_one_layout(true, 2, 2, 2, 2, "1f1b", NULL, "-bert-d2-t2");
    against_one_layout(true, 2, 1, 2, 2, "gpipe", z1, "-bert-d2-z1-rec");
}

static void test_gpt_p4(void)
{
    const char *const rec[] = {"train.recompute=block", NULL};
    const char *const sel[] = {"train.recompute=selective", NULL};
    against_one_model(true, 4, 4, "gpipe", NULL, "-gpt");
    against_one_model(true, 4, 4, "1f1b", rec, "-gpt-rec");
    against_one_model(true, 4, 2, "1f1b", sel, "-gpt-sel");
}

/* llama: P = 2 and 4 under both schedules, with recompute, T2 x P2 (sequence parallel too),
 * D2 x P2 with ZeRO-1 and ZeRO-3, each against one process. */
static void test_llama_stages(void)
{
    const char *const rec[] = {"train.recompute=block", NULL};
    const char *const sp[] = {"parallel.sequence_parallel=true", NULL};
    const char *const z1[] = {"parallel.zero=1", NULL};
    const char *const z3[] = {"parallel.zero=3", "train.recompute=selective", NULL};
    against_one_made(pllama, 1, 1, 2, 4, "1f1b", NULL, "-llama");
    against_one_made(pllama, 1, 1, 4, 4, "gpipe", rec, "-llama-rec");
    against_one_made(pllama, 1, 2, 2, 2, "1f1b", sp, "-llama-t2-sp");
    against_one_made(pllama, 2, 1, 2, 2, "1f1b", z1, "-llama-d2-zero1");
    against_one_made(pllama, 2, 1, 2, 4, "gpipe", z3, "-llama-d2-zero3");
}

/* ---- resnet: BatchNorm in a pipeline -------------------------------------------------------
 * A stage's BatchNorms normalise each micro-batch with its own batch statistics, which its
 * slot keeps for the micro-batch's backward, and every training forward moves the stage's
 * running statistics once, in the order the forwards run (micro-batch 0, 1, ... on every
 * stage, GPipe and 1F1B alike). One process does the same with train.grad_accum = M and
 * micro-steps of batch / M samples: that is the run a pipeline of M micro-batches equals (not
 * one process of the whole batch, whose statistics are over all of it). */

/* A tiny resnet (configs/resnet.ini) on synthetic images in 4 classes: the CIFAR form of depth
 * 8 (3 BasicBlocks, width 4) on 3x8x8, or with r50 torchvision's ResNet-50 (7x7 stem,
 * max-pool, 16 Bottlenecks) at width 2 on 3x16x16. */
static prun presnet(int N, int P, int M, const char *sched, const char *name, bool r50)
{
    prun r = pbase(N, P, M, sched, name);
    r.nov--; /* not the mlp's widths */
    r.config = "resnet.ini";
    r.steps = 10;
    padd(&r, "train.lr=0.05");
    padd(&r, "data.synthetic_samples=512");
    padd(&r, "data.synthetic_classes=4");
    padd(&r, "train.eval_every=0");
    if (r50) {
        padd(&r, "model.preset=resnet50");
        padd(&r, "model.width=2");
        padd(&r, "data.synthetic_shape=3x16x16");
    } else {
        padd(&r, "model.depth=8");
        padd(&r, "model.width=4");
        padd(&r, "data.synthetic_shape=3x8x8");
    }
    return r;
}

/* The reference of a resnet pipeline of M micro-batches of batch 8: one process with
 * train.grad_accum = M of 8 / M samples a micro-step. */
static prun presnet_one(int M, const char *name, bool r50)
{
    prun r = presnet(1, 1, 1, "1f1b", name, r50);
    padd(&r, fmt("train.batch_size=%d", 8 / M));
    padd(&r, fmt("train.grad_accum=%d", M));
    return r;
}

/* D replicas (of batch 8 / D) of P stages x M micro-batches of `sched` against presnet_one:
 * the losses and gradient norms of every step, the weights and the running statistics at the
 * end, within 1e-5 (2-norms relative, vec_rel); the start bit for bit. more: overrides for
 * both (NULL-terminated). D > 1 needs model.sync_bn: the sampler interleaves the replicas
 * (rank r takes positions r, r + D, ...), so micro-batch k of every replica together is the
 * reference's micro-step k, whose statistics SyncBatchNorm computes over the stage's
 * replicas. */
static void resnet_against_one_d(int D, int P, int M, const char *sched, bool r50,
                                 const char *const *more, const char *tag)
{
    const int N = D * P;
    prun one = presnet_one(M, fmt("rn-one-m%d%s", M, tag), r50);
    prun pp = presnet(N, P, M, sched, fmt("rn-d%d-p%d-m%d-%s%s", D, P, M, sched, tag), r50);
    padd(&pp, fmt("train.batch_size=%d", 8 / D));
    /* evaluation over the whole validation set (BatchNorm on the running statistics) */
    one.eval = pp.eval = true;
    padd(&one, "train.eval_batches=1000");
    padd(&pp, "train.eval_batches=1000");
    int zero = 0;
    for (; more && *more; more++) {
        if (strncmp(*more, "parallel.zero=", 14)) /* the layout's only */
            padd(&one, *more);
        else
            zero = atoi(*more + 14);
        padd(&pp, *more);
    }
    if (!prun_run(&one) || !prun_run(&pp))
        goto out;
    const rank_out *a = &pp.out[0], *b = &one.out[0];
    DT_CHECK_STR(a->strategy, "pipeline");
    if (zero > 0)
        DT_CHECK_CONTAINS(a->summary, fmt("ZeRO-%d", zero));
    DT_CHECK_STR(b->strategy, "single");
    DT_REQUIRE(a->numel == b->numel && a->numel > 0);
    DT_REQUIRE(a->nbufs == b->nbufs && a->nbufs > 0);
    DT_CHECK_MSG(!memcmp(a->start_params, b->start_params, a->numel * sizeof(float)),
                 "%s: the initial parameters differ from one process's", pp.name);
    DT_CHECK_MSG(!memcmp(a->start_bufs, b->start_bufs, a->nbufs * sizeof(float)),
                 "%s: the initial running statistics differ from one process's", pp.name);
    double worst_loss = check_losses(&pp, b, N);
    double wp = vec_rel(a->params, b->params, a->numel);
    double wb = vec_rel(a->bufs, b->bufs, a->nbufs);
    double moved = vec_rel(b->bufs, b->start_bufs, b->nbufs); /* the statistics did move */
    DT_CHECK_MSG(wp <= 1e-5, "%s: weights after %d steps differ by %.3g (2-norm relative)",
                 pp.name, pp.steps, wp);
    DT_CHECK_MSG(wb <= 1e-5, "%s: running statistics after %d steps differ by %.3g", pp.name,
                 pp.steps, wb);
    DT_CHECK_MSG(moved > 1e-3, "%s: the running statistics barely moved (%.3g)", pp.name, moved);
    for (int q = 0; q < N; q++) {
        const int stage = q / D; /* rank = pp x D + dp */
        /* at ZeRO-3 only each data-parallel group's rank 0 gathers the whole model (dpsync.h) */
        DT_CHECK_MSG((zero == 3 && q % D) ||
                         (!memcmp(pp.out[q].params, a->params, a->numel * sizeof(float)) &&
                          !memcmp(pp.out[q].bufs, a->bufs, a->nbufs * sizeof(float))),
                     "%s: rank %d gathered another model than rank 0", pp.name, q);
        DT_CHECK_INT(pp.out[q].st.stage, stage);
        DT_CHECK_INT(pp.out[q].st.slots, !strcmp(sched, "gpipe") ? M : DT_MIN(P - stage, M));
    }
    double ws = 0;
    DT_CHECK_INT(a->num_states, b->num_states);
    for (int i = 0; i < a->num_states && i < b->num_states; i++)
        ws = fmax(ws, vec_rel(a->state[i], b->state[i], a->numel));
    DT_CHECK_MSG(ws <= 1e-4, "%s: optimiser state differs by %.3g", pp.name, ws);
    double we = fabs(a->eval_loss - b->eval_loss) / b->eval_loss;
    DT_CHECK_MSG(we <= 1e-5, "%s: eval loss %.9g vs %.9g", pp.name, a->eval_loss, b->eval_loss);
    DT_CHECK_NEAR(a->eval_acc, b->eval_acc, 1e-12);
    printf("    %-22s loss %.6f -> %.6f (one process, grad_accum %d: %.6f), loss within %.2g, "
           "weights %.2g, running statistics %.2g (moved %.2g), state %.2g, eval loss %.2g\n",
           pp.name, a->loss[0], a->loss[pp.steps - 1], M, b->loss[pp.steps - 1], worst_loss, wp,
           wb, moved, ws, we);
out:
    prun_free(&one);
    prun_free(&pp);
}

static void resnet_against_one(int P, int M, const char *sched, bool r50,
                               const char *const *more, const char *tag)
{
    resnet_against_one_d(1, P, M, sched, r50, more, tag);
}

/* The CIFAR form at P = 2 (blocks 2 + 1) with both schedules, at P = 3 (a block a stage) with
 * recompute = block, and at D2 x P2 with SyncBatchNorm (DDP, and ZeRO-3 with GPipe); ResNet-50
 * at P = 2 (8 + 8 Bottlenecks). */
static void test_resnet_pipeline(void)
{
    const char *const sync[] = {"model.sync_bn=true", NULL};
    const char *const sync_z3[] = {"model.sync_bn=true", "parallel.zero=3", NULL};
    resnet_against_one_d(2, 2, 2, "1f1b", false, sync, "-syncbn");
    resnet_against_one_d(2, 2, 2, "gpipe", false, sync_z3, "-syncbn-z3");
    resnet_against_one(2, 2, "1f1b", false, NULL, "");
    resnet_against_one(2, 4, "gpipe", false, NULL, "");
    const char *const rec[] = {"train.recompute=block", NULL};
    resnet_against_one(3, 2, "1f1b", false, rec, "-recompute");
    resnet_against_one(2, 2, "1f1b", true, NULL, "-r50");
    resnet_against_one(2, 2, "gpipe", true, NULL, "-r50");
}

/* A resnet pipeline's checkpoint holds every stage's running statistics: P = 2 saves at step 3
 * (sharded: each stage writes its own; and whole tensors, gathered to rank 0), one process
 * (grad_accum 2) and P = 2 with the other schedule resume its weights and statistics bit for
 * bit and train on as one uninterrupted process does; and P = 2 resumes one process's. */
static void test_resnet_ckpt(void)
{
    const char *dir = dt_test_tmpdir();
    prun save[2], one[2], pipe, straight = presnet_one(2, "rn-ck-straight", false);
    prun one_save = presnet_one(2, "rn-ck-one-save", false);
    prun pipe2 = presnet(2, 2, 2, "1f1b", "rn-ck-pipe-from-one", false);
    padd(&one_save, fmt("checkpoint.dir=%s/rck2", dir));
    padd(&one_save, "train.steps=3");
    one_save.run = true;
    padd(&pipe2, fmt("checkpoint.dir=%s/rck2", dir));
    padd(&pipe2, "checkpoint.resume=auto");
    padd(&pipe2, "train.steps=6");
    pipe2.steps = 3;
    for (int f = 0; f < 2; f++) {
        save[f] = presnet(2, 2, 2, "1f1b", fmt("rn-ck-save%d", f), false);
        padd(&save[f], fmt("checkpoint.dir=%s/rck%d", dir, f));
        padd(&save[f], f ? "checkpoint.sharded=false" : "checkpoint.sharded=true");
        padd(&save[f], "train.steps=3");
        save[f].run = true;
        one[f] = presnet_one(2, fmt("rn-ck-one%d", f), false);
        padd(&one[f], fmt("checkpoint.dir=%s/rck%d", dir, f));
        padd(&one[f], "checkpoint.resume=auto");
        padd(&one[f], "train.steps=6");
        one[f].steps = 3;
    }
    pipe = presnet(2, 2, 2, "gpipe", "rn-ck-pipe", false);
    padd(&pipe, fmt("checkpoint.dir=%s/rck0", dir));
    padd(&pipe, "checkpoint.resume=auto");
    padd(&pipe, "train.steps=6");
    pipe.steps = 3;
    padd(&straight, "train.steps=6");
    straight.steps = 6;
    /* the resumes first write nothing before their end: the pipeline resumes step 3 too */
    if (!prun_run(&save[0]) || !prun_run(&save[1]) || !prun_run(&pipe) || !prun_run(&one[0]) ||
        !prun_run(&one[1]) || !prun_run(&straight) || !prun_run(&one_save) ||
        !prun_run(&pipe2))
        goto out;
    const rank_out *c = &straight.out[0];
    const prun *resumed[4] = {&one[0], &one[1], &pipe, &pipe2};
    const prun *from[4] = {&save[0], &save[1], &save[0], &one_save};
    for (int i = 0; i < 4; i++) {
        const rank_out *s = &from[i]->out[0];
        DT_CHECK_INT(s->step, 3);
        DT_REQUIRE(s->nbufs == c->nbufs && s->nbufs > 0);
        for (int q = 0; q < resumed[i]->N; q++) {
            const rank_out *r = &resumed[i]->out[q];
            DT_CHECK_INT(r->start_step, 3);
            DT_CHECK_MSG(!memcmp(r->start_params, s->params, s->numel * sizeof(float)),
                         "%s: rank %d resumed other weights than %s saved", resumed[i]->name, q,
                         from[i]->name);
            DT_CHECK_MSG(!memcmp(r->start_bufs, s->bufs, s->nbufs * sizeof(float)),
                         "%s: rank %d resumed other running statistics than %s saved",
                         resumed[i]->name, q, from[i]->name);
        }
        const rank_out *r = &resumed[i]->out[0];
        for (int k = 0; k < 3; k++)
            DT_CHECK_MSG(fabs(r->loss[k] - c->loss[k + 3]) <= 1e-5 * c->loss[k + 3],
                         "%s: step %d loss %.9g vs %.9g uninterrupted", resumed[i]->name, k + 4,
                         r->loss[k], c->loss[k + 3]);
        double wp = vec_rel(r->params, c->params, c->numel);
        double wb = vec_rel(r->bufs, c->bufs, c->nbufs);
        DT_CHECK_MSG(wp <= 1e-5 && wb <= 1e-5, "%s: weights %.3g, running statistics %.3g from "
                     "the uninterrupted run", resumed[i]->name, wp, wb);
        printf("    %-19s resumed %s bit for bit; at step 6 weights within %.2g, running "
               "statistics %.2g of one uninterrupted process\n",
               resumed[i]->name, from[i]->name, wp, wb);
    }
out:
    for (int f = 0; f < 2; f++) {
        prun_free(&save[f]);
        prun_free(&one[f]);
    }
    prun_free(&pipe);
    prun_free(&straight);
    prun_free(&one_save);
    prun_free(&pipe2);
}

static void test_p2_1f1b(void) { against_one(2, 4, "1f1b"); }
static void test_p2_gpipe(void) { against_one(2, 4, "gpipe"); }
static void test_p4_1f1b(void) { against_one(4, 4, "1f1b"); }
static void test_p4_gpipe(void) { against_one(4, 4, "gpipe"); }

/* A checkpoint of P = 2 holds whole tensors: one process resumes it (bit for bit the gathered
 * state) and goes on as the pipeline would have; and a checkpoint of one process resumes at
 * P = 2. */
static void test_ckpt_resume(void)
{
    const char *dir = dt_test_tmpdir();
    prun a = pbase(2, 2, 4, "1f1b", "ckpt-p2");
    padd(&a, fmt("checkpoint.dir=%s/ck", dir));
    padd(&a, "train.steps=3");
    a.run = true;
    prun b = pbase(1, 1, 1, "1f1b", "ckpt-one");
    padd(&b, fmt("checkpoint.dir=%s/ck", dir));
    padd(&b, "checkpoint.resume=auto");
    padd(&b, "train.steps=6");
    b.steps = 3;
    prun c = pbase(2, 2, 4, "gpipe", "ckpt-p2-again");
    padd(&c, fmt("checkpoint.dir=%s/ck2", dir));
    padd(&c, "checkpoint.resume=never");
    padd(&c, "train.steps=6");
    c.steps = 6;
    prun d = pbase(1, 1, 1, "1f1b", "ckpt-one-save");
    padd(&d, fmt("checkpoint.dir=%s/ck3", dir));
    padd(&d, "train.steps=3");
    d.run = true;
    prun e = pbase(2, 2, 2, "gpipe", "ckpt-p2-resume");
    padd(&e, fmt("checkpoint.dir=%s/ck3", dir));
    padd(&e, "checkpoint.resume=auto");
    padd(&e, "train.steps=6");
    e.steps = 3;
    if (!prun_run(&a) || !prun_run(&b) || !prun_run(&c) || !prun_run(&d) || !prun_run(&e))
        goto out;
    DT_CHECK_INT(a.out[0].step, 3);
    DT_CHECK_INT(b.out[0].start_step, 3);
    DT_CHECK_STR(b.out[0].strategy, "single");
    DT_CHECK_MSG(!memcmp(b.out[0].start_params, a.out[0].params, a.out[0].numel * sizeof(float)),
                 "one process resumed other parameters than P = 2 saved");
    DT_CHECK_INT(b.out[0].step, 6);
    /* the resumed run's last 3 steps against 6 uninterrupted pipeline steps */
    for (int k = 0; k < 3; k++)
        DT_CHECK_MSG(fabs(b.out[0].loss[k] - c.out[0].loss[k + 3]) <= 1e-5 * c.out[0].loss[k + 3],
                     "resumed step %d: loss %.9g vs %.9g", k + 4, b.out[0].loss[k],
                     c.out[0].loss[k + 3]);
    DT_CHECK(vec_rel(b.out[0].params, c.out[0].params, c.out[0].numel) <= 1e-5);
    /* and the reverse: one process's checkpoint resumed by two stages */
    DT_CHECK_INT(e.out[0].start_step, 3);
    DT_CHECK_STR(e.out[0].strategy, "pipeline");
    for (int q = 0; q < 2; q++)
        DT_CHECK_MSG(!memcmp(e.out[q].start_params, d.out[0].params,
                             d.out[0].numel * sizeof(float)),
                     "rank %d of P = 2 resumed other parameters than one process saved", q);
    for (int k = 0; k < 3; k++)
        DT_CHECK_MSG(fabs(e.out[0].loss[k] - c.out[0].loss[k + 3]) <= 1e-5 * c.out[0].loss[k + 3],
                     "P = 2 resumed step %d: loss %.9g vs %.9g", k + 4, e.out[0].loss[k],
                     c.out[0].loss[k + 3]);
out:
    prun_free(&a);
    prun_free(&b);
    prun_free(&c);
    prun_free(&d);
    prun_free(&e);
}

/* Checkpoints reshard through whole tensors: D2 x T2 x P2 (8 ranks, tiny gpt) saves, and one
 * process, T2 x P2 and plain DDP on 2 ranks resume its parameters bit for bit; one process
 * saves, and D2 x T2 x P2 and T2 x P2 resume it bit for bit. */
static prun gpt_layout(int D, int T, int P, const char *name, const char *ck, bool save)
{
    prun r = pgpt(D * T * P, P, 2, "1f1b", name);
    padd(&r, fmt("parallel.tensor=%d", T));
    padd(&r, fmt("train.batch_size=%d", 8 / D));
    padd(&r, fmt("checkpoint.dir=%s", ck));
    if (save) {
        padd(&r, "train.steps=3");
        r.run = true;
    } else {
        padd(&r, "checkpoint.resume=auto");
        padd(&r, "train.steps=5");
        r.steps = 2;
    }
    return r;
}

static void test_ckpt_layouts(void)
{
    const char *ck = fmt("%s/ck", dt_test_tmpdir()), *ck2 = fmt("%s/ck2", dt_test_tmpdir());
    struct {
        int D, T, P;
    } from[2] = {{2, 2, 2}, {1, 1, 1}}, to[2][3] = {{{1, 1, 1}, {1, 2, 2}, {2, 1, 1}},
                                                   {{2, 2, 2}, {1, 2, 2}, {1, 1, 2}}};
    for (int f = 0; f < 2; f++) {
        const char *dir = f ? ck2 : ck;
        prun w = gpt_layout(from[f].D, from[f].T, from[f].P,
                            fmt("save-d%dt%dp%d", from[f].D, from[f].T, from[f].P), dir, true);
        if (!prun_run(&w)) {
            prun_free(&w);
            return;
        }
        DT_CHECK_INT(w.out[0].step, 3);
        for (int k = 0; k < 3; k++) {
            prun r = gpt_layout(to[f][k].D, to[f][k].T, to[f][k].P,
                                fmt("resume-d%dt%dp%d-from-d%dt%dp%d", to[f][k].D, to[f][k].T,
                                    to[f][k].P, from[f].D, from[f].T, from[f].P),
                                dir, false);
            if (prun_run(&r)) {
                for (int q = 0; q < r.N; q++) {
                    DT_CHECK_INT(r.out[q].start_step, 3);
                    DT_CHECK_INT(r.out[q].numel, w.out[0].numel);
                    DT_CHECK_MSG(!memcmp(r.out[q].start_params, w.out[0].params,
                                         w.out[0].numel * sizeof(float)),
                                 "%s: rank %d resumed other parameters than were saved", r.name,
                                 q);
                }
                DT_CHECK_INT(r.out[0].step, 5);
            }
            prun_free(&r);
        }
        prun_free(&w);
    }
}

/* gpt_layout's run of 5 steps from the start, without checkpoints. */
static prun straight_layout(int D, int T, int P, const char *name)
{
    prun r = pgpt(D * T * P, P, 2, "1f1b", name);
    padd(&r, fmt("parallel.tensor=%d", T));
    padd(&r, fmt("train.batch_size=%d", 8 / D));
    padd(&r, "train.steps=5"); /* the learning-rate schedule of the resumed runs */
    r.steps = 5;
    return r;
}

/* Checkpoints with ZeRO: gpt at D2 x P2 with zero = 1 saves at step 3 (the optimiser shards
 * gathered over each stage's replicas, then the stages over the pipeline group); one process
 * resumes the parameters it saved bit for bit and trains on as the uninterrupted D2 x P2 run
 * does (within 1e-5: the optimiser state came back whole). The reverse: one process saves, D2
 * x T2 x P2 with zero = 2, and D2 x P2 with zero = 3, resume and train on as one process does. */
static void test_ckpt_zero(void)
{
    const char *ck = fmt("%s/ckz", dt_test_tmpdir()), *ck2 = fmt("%s/ckz2", dt_test_tmpdir());
    prun w = gpt_layout(2, 1, 2, "ckz-save-d2p2", ck, true);
    padd(&w, "parallel.zero=1");
    prun straight = straight_layout(2, 1, 2, "ckz-straight-d2p2");
    padd(&straight, "parallel.zero=1");
    prun one = gpt_layout(1, 1, 1, "ckz-resume-one", ck, false);
    prun w1 = gpt_layout(1, 1, 1, "ckz-save-one", ck2, true);
    prun straight1 = straight_layout(1, 1, 1, "ckz-straight-one");
    prun r = gpt_layout(2, 2, 2, "ckz-resume-d2t2p2", ck2, false);
    padd(&r, "parallel.zero=2");
    prun r3 = gpt_layout(2, 1, 2, "ckz-resume-d2p2-z3", ck2, false);
    padd(&r3, "parallel.zero=3");
    if (!prun_run(&w) || !prun_run(&straight) || !prun_run(&one) || !prun_run(&w1) ||
        !prun_run(&straight1) || !prun_run(&r) || !prun_run(&r3))
        goto out;
    DT_CHECK_CONTAINS(r3.out[0].summary, "ZeRO-3");
    DT_CHECK_CONTAINS(w.out[0].summary, "ZeRO-1");
    DT_CHECK_CONTAINS(r.out[0].summary, "ZeRO-2");
    DT_CHECK_INT(one.out[0].start_step, 3);
    DT_CHECK_MSG(!memcmp(one.out[0].start_params, w.out[0].params, w.out[0].numel * 4),
                 "one process resumed other parameters than D2 x P2 zero = 1 saved");
    const struct {
        const prun *x, *ref;
    } pairs[3] = {{&one, &straight}, {&r, &straight1}, {&r3, &straight1}};
    for (int k = 0; k < 3; k++) {
        const rank_out *a = &pairs[k].x->out[0], *b = &pairs[k].ref->out[0];
        DT_CHECK_INT(a->step, 5);
        for (int i = 0; i < 2; i++)
            DT_CHECK_MSG(fabs(a->loss[i] - b->loss[i + 3]) <= 1e-5 * b->loss[i + 3],
                         "%s: step %d loss %.9g vs %s's %.9g", pairs[k].x->name, i + 4,
                         a->loss[i], pairs[k].ref->name, b->loss[i + 3]);
        double wp = vec_rel(a->params, b->params, b->numel);
        double ws = vec_rel(a->state[1], b->state[1], b->numel);
        DT_CHECK_MSG(wp <= 1e-5 && ws <= 1e-5, "%s: weights %.3g, exp_avg_sq %.3g off %s",
                     pairs[k].x->name, wp, ws, pairs[k].ref->name);
        printf("    %-18s step 5 weights within %.2g, exp_avg_sq %.2g of %s\n", pairs[k].x->name,
               wp, ws, pairs[k].ref->name);
    }
out:
    prun_free(&w);
    prun_free(&straight);
    prun_free(&one);
    prun_free(&w1);
    prun_free(&straight1);
    prun_free(&r);
    prun_free(&r3);
}

/* A stage that dies mid-step ends the step on the others with an error naming the stage, the
 * rank and the micro-batch, within ddp.timeout (every stage of P = 4, the dead one's neighbours
 * and the stages behind them). */
static void test_dead_stage(void)
{
    prun r = pbase(4, 4, 4, "1f1b", "dead-stage");
    r.kill_rank = 2;
    r.kill_step = 2;
    r.steps = 4;
    double t0 = dt_test_now();
    prun_run(&r);
    double took = dt_test_now() - t0;
    DT_CHECK(WIFSIGNALED(r.status[2]) && WTERMSIG(r.status[2]) == SIGKILL);
    for (int q = 0; q < 4; q++) {
        if (q == 2)
            continue;
        DT_CHECK_MSG(WIFEXITED(r.status[q]) && WEXITSTATUS(r.status[q]) == 2,
                     "rank %d: status %d", q, r.status[q]);
        DT_CHECK_CONTAINS(r.out[q].msg, fmt("pipeline stage %d of 4 (rank %d)", q, q));
    }
    /* its neighbours name the micro-batch they were at */
    DT_CHECK_CONTAINS(r.out[1].msg, "micro-batch");
    DT_CHECK_CONTAINS(r.out[3].msg, "micro-batch");
    DT_CHECK_MSG(took < 35 * dt_test_timeout_scale(),
                 "the stages took %.1f s to give up (ddp.timeout = 10)", took);
    printf("    ended in %.1f s; rank 1: %.300s\n", took, r.out[1].msg);
    prun_free(&r);
}

/* A stage that hangs (stopped) mid-step: the others give up within ddp.timeout (10 s here)
 * with an error naming their stage and rank, and its neighbours the micro-batch and the wait. */
static void test_stalled_stage(void)
{
    prun r = pbase(4, 4, 4, "gpipe", "stalled-stage");
    r.kill_rank = 1;
    r.kill_step = 1;
    r.stall = true;
    r.steps = 3;
    double t0 = dt_test_now();
    prun_run(&r);
    double took = dt_test_now() - t0;
    for (int q = 0; q < 4; q++) {
        if (q == 1)
            continue;
        DT_CHECK_MSG(WIFEXITED(r.status[q]) && WEXITSTATUS(r.status[q]) == 2,
                     "rank %d: status %d", q, r.status[q]);
        DT_CHECK_CONTAINS(r.out[q].msg, fmt("pipeline stage %d of 4 (rank %d)", q, q));
    }
    DT_CHECK_CONTAINS(r.out[0].msg, "micro-batch");
    DT_CHECK_CONTAINS(r.out[2].msg, "micro-batch");
    DT_CHECK_CONTAINS(r.out[2].msg, "timed out");
    DT_CHECK_MSG(took < 35 * dt_test_timeout_scale(),
                 "the stages took %.1f s to give up (ddp.timeout = 10)", took);
    printf("    ended in %.1f s; rank 2: %.300s\n", took, r.out[2].msg);
    prun_free(&r);
}

/* train.trace: each stage's forward and backward of every micro-batch and its p2p batches, in
 * the merged Chrome trace rank 0 writes. */
static void test_trace(void)
{
    prun r = pbase(2, 2, 4, "gpipe", "trace");
    padd(&r, "train.trace=on");
    padd(&r, "train.steps=2");
    padd(&r, "train.eval_every=0");
    padd(&r, "data.val_fraction=0"); /* no evaluation: its forwards would be in the trace too */
    r.run = true;
    if (prun_run(&r)) {
        char *text = dt_test_slurp(fmt("%s/trace/trace.json", fmt("%s/%s", r.dir, r.name)));
        DT_REQUIRE(text);
        int fwd = 0, bwd = 0, p2p = 0, want = 0;
        for (const char *q = text; (q = strstr(q, "\"name\":\"forward\"")); q++)
            fwd++;
        for (const char *q = text; (q = strstr(q, "\"name\":\"backward\"")); q++)
            bwd++;
        static const char *const names[] = {"\"name\":\"send\"", "\"name\":\"recv\"",
                                            "\"name\":\"send+recv\""};
        for (int k = 0; k < 3; k++)
            for (const char *q = text; (q = strstr(q, names[k])); q++)
                p2p++;
        /* one span per p2p batch, as the strategy cuts them (dt_pp_batch_end) */
        dt_pp_action a[6 * 4];
        for (int st = 0; st < 2; st++) {
            int n = build(DT_PP_GPIPE, 2, 4, st, a);
            dt_pp_post_early(a, n); /* the order the strategy posts in */
            for (int i = 0; i < n; i++)
                if (dt_pp_op_is_comm(a[i].op)) {
                    want++;
                    i = dt_pp_batch_end(a, n, i) - 1;
                }
        }
        /* 2 stages x 2 steps x 4 micro-batches */
        DT_CHECK_MSG(fwd == 16 && bwd == 16, "%d forward and %d backward spans", fwd, bwd);
        DT_CHECK_MSG(p2p == 2 * want, "%d p2p spans, %d expected", p2p, 2 * want);
        DT_CHECK_CONTAINS(text, "\"mb\":3");
        free(text);
    }
    prun_free(&r);
}

/* The dtrain binary as a user runs it: 4 workers, a tiny gpt in 2 stages x 2 tensor ranks,
 * trains, evaluates, saves whole tensors, and logs the layout; then one process resumes it. */
static void test_dtrain_binary(void)
{
    char *out = NULL;
    const char *dir = fmt("%s/e2e", dt_test_tmpdir());
    const char *common = "job.device=cpu job.cpu_bind=none model.n_layer=2 model.n_head=2 "
                         "model.n_embd=16 model.block_size=16 data.seq_len=16 train.batch_size=4 "
                         "train.eval_every=4 checkpoint.every=4";
    int rc = dt_test_run(fmt("%s --standalone --nproc-per-node=4 --max-restarts=0 "
                             "%s/configs/quickstart.ini parallel.pipeline=2 parallel.tensor=2 "
                             "parallel.micro_batches=2 train.steps=8 %s job.output_dir=%s 2>&1",
                             dt_test_dtrain_bin(), repo_dir(), common, dir),
                         &out, 120);
    DT_CHECK_MSG(rc == 0, "dtrain exited %d: %.4000s", rc, out ? out : "");
    if (out) {
        DT_CHECK_CONTAINS(out, "pipeline: 2 stages");
        DT_CHECK_CONTAINS(out, "pipeline 2");
        DT_CHECK_CONTAINS(out, "done after 8 steps");
    }
    free(out);
    out = NULL;
    DT_CHECK(access(fmt("%s/checkpoints/step_8/model.safetensors", dir), F_OK) == 0);
    rc = dt_test_run(fmt("%s --standalone --nproc-per-node=1 --max-restarts=0 "
                         "%s/configs/quickstart.ini train.steps=10 %s job.output_dir=%s "
                         "checkpoint.resume=auto 2>&1",
                         dt_test_dtrain_bin(), repo_dir(), common, dir),
                     &out, 120);
    DT_CHECK_MSG(rc == 0, "dtrain (one process) exited %d: %.4000s", rc, out ? out : "");
    if (out) {
        DT_CHECK_CONTAINS(out, "resumed from");
        DT_CHECK_CONTAINS(out, "step 8");
        DT_CHECK_CONTAINS(out, "done after 10 steps");
    }
    free(out);
}

/* `dtrain bench pipeline` on a tiny job: it runs both schedules, prints the formula, and 1F1B's
 * stage-0 activation peak is exactly P/M of GPipe's (slots of equal size: P of M). */
static void test_bench(void)
{
    const char *out = fmt("%s/bench.txt", dt_test_tmpdir());
    pid_t pid = dt_test_spawn(
        fmt("%s bench pipeline %s/configs/mlp.ini job.device=cpu train.threads=1 "
            "job.cpu_bind=none model.hidden=16,16,16 train.batch_size=16 --stages 2,4 "
            "--micro 1,8 --steps 2",
            dt_test_dtrain_bin(), repo_dir()),
        out);
    int code = dt_test_wait_exit(pid, 100 * dt_test_timeout_scale());
    char *text = dt_test_slurp(out);
    DT_CHECK_MSG(code == 0, "bench pipeline exited %d: %.2000s", code, text ? text : "");
    DT_CHECK_CONTAINS(text, "formula: (P-1)/(M+P-1)");
    DT_CHECK_CONTAINS(text, " 2   8 1f1b");
    DT_CHECK_CONTAINS(text, "0.250 (P/M 0.250)");
    DT_CHECK_CONTAINS(text, "0.500 (P/M 0.500)"); /* P = 4, M = 8 */
    DT_CHECK_CONTAINS(text, "0.750"); /* the formula at P = 4, M = 1 */
    free(text);
}

/* ---- receives posted early (dt_pp_post_early) -------------------------------------------- */

/* The order the strategy posts in: every receive of an activation one forward earlier (and of a
 * gradient one backward earlier where no forward lies between), the same sends and computes in
 * the same order, the same matching, runs to the end on the strictest backend (run_strict) both
 * when every compute waits for all it posted and when it waits as dt_pp_wait_before says, and
 * needs one receive buffer more than the slots (1F1B's activation slots unchanged: P on stage
 * 0). Moving the gradients' receives of 1F1B's steady state too (run_strict's early = 2)
 * deadlocks, which is why dt_pp_post_early leaves them: the replay finds it. */
static void test_schedule_early(void)
{
    dt_pp_action a[6 * 16], e[6 * 16];
    for (int ki = 0; ki < 2; ki++)
        for (int P = 1; P <= 8; P++)
            for (int M = 1; M <= 16; M++) {
                for (int lazy = 0; lazy < 2; lazy++)
                    DT_CHECK_MSG(run_strict(kinds[ki], P, M, lazy, 1),
                                 "%s P=%d M=%d deadlocks with early receives%s",
                                 kind_name(kinds[ki]), P, M,
                                 lazy ? " (waits as dt_pp_wait_before says)" : "");
                for (int s = 0; s < P; s++) {
                    int n = build(kinds[ki], P, M, s, a);
                    memcpy(e, a, sizeof(dt_pp_action) * (size_t)n);
                    dt_pp_post_early(e, n);
                    int fi = 0, fe = 0, moved = 0;
                    for (int op = 0; op < 6; op++) { /* each kind in the same order */
                        int ia = 0, ie = 0;
                        for (;;) {
                            while (ia < n && (int)a[ia].op != op)
                                ia++;
                            while (ie < n && (int)e[ie].op != op)
                                ie++;
                            if (ia == n || ie == n)
                                break;
                            DT_CHECK_INT(e[ie].mb, a[ia].mb);
                            moved += op == DT_PP_RECV_ACT && ie < ia;
                            ia++, ie++;
                        }
                        DT_CHECK(ia == n && ie == n);
                    }
                    for (int i = 0; i < n; i++) { /* computes in the same order */
                        while (fi < n && dt_pp_op_is_comm(a[fi].op))
                            fi++;
                        while (fe < n && dt_pp_op_is_comm(e[fe].op))
                            fe++;
                        if (fi < n && fe < n) {
                            DT_CHECK(a[fi].op == e[fe].op && a[fi].mb == e[fe].mb);
                            fi++, fe++;
                        }
                    }
                    /* the activation of k >= 1 is asked for before the forward of k - 1 */
                    for (int k = 1; k < M && s > 0; k++) {
                        int r = -1, f = -1;
                        for (int i = 0; i < n; i++) {
                            if (e[i].op == DT_PP_RECV_ACT && e[i].mb == k)
                                r = i;
                            if (e[i].op == DT_PP_FWD && e[i].mb == k - 1)
                                f = i;
                        }
                        DT_CHECK_MSG(r >= 0 && r < f, "%s P=%d M=%d stage %d: activation %d "
                                     "received at %d, forward of %d at %d",
                                     kind_name(kinds[ki]), P, M, s, k, r, k - 1, f);
                    }
                    DT_CHECK_INT(moved, s > 0 ? M - 1 : 0);
                    DT_CHECK_INT(dt_pp_max_in_flight(e, n), dt_pp_max_in_flight(a, n));
                    if (s > 0)
                        DT_CHECK_INT(dt_pp_recv_buffers(e, n),
                                     DT_MIN(dt_pp_max_in_flight(a, n) + 1, M));
                }
            }
    /* the replay tells: the gradients' receives of 1F1B's steady state moved too deadlock */
    DT_CHECK(!run_strict(DT_PP_1F1B, 2, 4, false, 2));
    DT_CHECK(!run_strict(DT_PP_1F1B, 4, 8, true, 2));
    DT_CHECK(run_strict(DT_PP_GPIPE, 4, 8, true, 2)); /* GPipe's backwards have no forward */
}

/* One "X" span of a merged trace: its name, rank (pid), start and end (us), step and "mb" (-1
 * when it has none). */
typedef struct tspan {
    char name[32];
    int pid;
    double ts, end;
    long step, mb;
} tspan;

/* The number after `key` in line (its first occurrence), or dflt. */
static double after(const char *line, const char *key, double dflt)
{
    const char *q = strstr(line, key);
    return q ? strtod(q + strlen(key), NULL) : dflt;
}

/* The spans of trace.json (one event a line, as dt_trace_merge writes it); *n of them, cap at
 * most. */
static int read_spans(const char *text, tspan *out, int cap)
{
    int n = 0;
    for (const char *line = text; line && *line && n < cap; line = strchr(line, '\n')) {
        if (*line == '\n')
            line++;
        const char *eol = strchr(line, '\n');
        size_t len = eol ? (size_t)(eol - line) : strlen(line);
        char buf[1024];
        if (len >= sizeof buf)
            continue;
        memcpy(buf, line, len);
        buf[len] = '\0';
        const char *nm = strstr(buf, "{\"name\":\"");
        if (!nm || !strstr(buf, "\"ph\":\"X\""))
            continue;
        tspan *t = &out[n++];
        nm += strlen("{\"name\":\"");
        size_t k = 0;
        while (nm[k] && nm[k] != '"' && k + 1 < sizeof t->name)
            k++;
        memcpy(t->name, nm, k);
        t->name[k] = '\0';
        t->pid = (int)after(buf, "\"pid\":", -1);
        t->ts = after(buf, "\"ts\":", 0);
        t->end = t->ts + after(buf, "\"dur\":", 0);
        t->step = (long)after(buf, "\"step\":", -1);
        t->mb = (long)after(buf, "\"mb\":", -1);
    }
    return n;
}

/* The overlap the trace shows, D = 2 x P = 2, 1F1B, M = 4, small buckets: on each rank of
 * stage 1 every micro-batch k >= 1's activation receive is posted before the forward of k - 1
 * begins (Megatron's batched order posts it after that forward, or after a backward), and on
 * every rank the first bucket's collective over the data-parallel group (coll: DDP's
 * all-reduce, ZeRO's reduce-scatter) starts inside the step's last backward (the cool-down), not
 * after the schedule. zero: an override, or NULL. */
static void overlap_trace(const char *name, const char *zero, const char *coll)
{
    enum { M = 4, STEPS = 3, CAP = 4096 };
    prun r = pbase(4, 2, M, "1f1b", name);
    if (zero)
        padd(&r, zero);
    padd(&r, "train.trace=on");
    padd(&r, fmt("train.steps=%d", STEPS));
    padd(&r, "train.eval_every=0");
    padd(&r, "data.val_fraction=0");
    padd(&r, "ddp.first_bucket_mb=0.001");
    padd(&r, "ddp.bucket_cap_mb=0.001");
    r.steps = STEPS;
    r.run = true;
    tspan *sp = calloc(CAP, sizeof *sp);
    DT_REQUIRE(sp);
    if (prun_run(&r)) {
        char *text = dt_test_slurp(fmt("%s/%s/trace/trace.json", r.dir, r.name));
        DT_REQUIRE(text);
        int n = read_spans(text, sp, CAP), full = 0, none = 0, in_bwd = 0;
        for (int pid = 0; pid < 4; pid++) {
            int early = 0, pairs = 0;
            for (int i = 0; i < n; i++) { /* forward k-1 of a step, and the receive of k */
                if (sp[i].pid != pid || strcmp(sp[i].name, "forward") || sp[i].mb + 1 >= M)
                    continue;
                pairs++;
                for (int j = 0; j < n; j++)
                    if (sp[j].pid == pid && strstr(sp[j].name, "recv") &&
                        sp[j].step == sp[i].step && sp[j].mb == sp[i].mb + 1 &&
                        sp[j].ts < sp[i].ts) {
                        early++;
                        break;
                    }
            }
            DT_CHECK_INT(pairs, STEPS * (M - 1));
            full += early == pairs;
            none += early == 0;
            /* the last backward of each step, and the step's first bucket collective */
            for (int i = 0; i < n; i++) {
                if (sp[i].pid != pid || strcmp(sp[i].name, "backward") || sp[i].mb != M - 1)
                    continue;
                double first = -1;
                for (int j = 0; j < n; j++)
                    if (sp[j].pid == pid && !strcmp(sp[j].name, coll) &&
                        sp[j].step == sp[i].step && (first < 0 || sp[j].ts < first))
                        first = sp[j].ts;
                DT_CHECK_MSG(first >= 0, "%s: rank %d step %ld: no bucket %s", name, pid,
                             sp[i].step, coll);
                in_bwd += first >= sp[i].ts && first < sp[i].end;
                DT_CHECK_MSG(first < sp[i].end, "%s: rank %d step %ld: the first bucket starts "
                             "at %.1f us, after the last backward (%.1f..%.1f)",
                             name, pid, sp[i].step, first, sp[i].ts, sp[i].end);
            }
        }
        /* two ranks per stage: stage 1's receive early, stage 0 receives no activation */
        DT_CHECK_MSG(full == 2 && none == 2, "%s: %d ranks with every receive early, %d with "
                     "none", name, full, none);
        DT_CHECK_INT(in_bwd, 4 * STEPS);
        free(text);
    }
    free(sp);
    prun_free(&r);
}

static void test_overlap_trace(void)
{
    overlap_trace("overlap-trace", NULL, "all-reduce");
    overlap_trace("overlap-trace-zero1", "parallel.zero=1", "reduce-scatter");
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"schedule_order", test_schedule_order, 0},
        {"schedule_matching", test_schedule_matching, 0},
        {"schedule_in_flight", test_schedule_in_flight, 0},
        {"schedule_bubble", test_schedule_bubble, 0},
        {"schedule_no_deadlock", test_schedule_no_deadlock, 0},
        {"wait_before", test_wait_before, 0},
        {"mlp_stages", test_mlp_stages, 0},
        {"mlp_stage_errors", test_mlp_stage_errors, 0},
        {"resnet_stage_errors", test_resnet_stage_errors, 0},
        {"gpt_slot_memory", test_gpt_slot_memory, 0},
        {"p2_1f1b", test_p2_1f1b, 180},
        {"p2_gpipe", test_p2_gpipe, 180},
        {"p4_1f1b", test_p4_1f1b, 180},
        {"p4_gpipe", test_p4_gpipe, 180},
        {"gpt_p2", test_gpt_p2, 240},
        {"gpt_p4", test_gpt_p4, 240},
        {"gpt_t2_p2", test_gpt_t2_p2, 240},
        {"gpt_d2_t2_p2", test_gpt_d2_t2_p2, 300},
        {"bert_p2_p4_t2p2_d2t2p2_zero", test_bert_pipeline, 400},
        {"llama_stages", test_llama_stages, 400},
        {"resnet_pipeline", test_resnet_pipeline, 400},
        {"resnet_ckpt", test_resnet_ckpt, 300},
        {"options", test_options, 300},
        {"overflow_skips_everywhere", test_overflow_skips_everywhere, 120},
        {"overflow_skips_everywhere_zero", test_overflow_skips_everywhere_zero, 120},
        {"d2_p2", test_d2_p2, 180},
        {"ckpt_resume", test_ckpt_resume, 300},
        {"ckpt_layouts", test_ckpt_layouts, 300},
        {"d2_p2_zero", test_d2_p2_zero, 400},
        {"gpt_d2_p2_accum", test_gpt_d2_p2_accum, 300},
        {"ckpt_zero", test_ckpt_zero, 300},
        {"dead_stage", test_dead_stage, 120},
        {"stalled_stage", test_stalled_stage, 120},
        {"trace", test_trace, 120},
        {"dtrain_binary", test_dtrain_binary, 300},
        {"bench", test_bench, 120},
        {"schedule_early", test_schedule_early, 0},
        {"overlap_trace", test_overlap_trace, 180},
    };
    return dt_test_main("test_pipeline", tests, (int)(sizeof tests / sizeof tests[0]), argc, argv);
}
