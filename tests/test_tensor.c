/* test_tensor.c - tensor parallelism (strategy_tensor.c over the gpt model's tensor-parallel
 * slices, and bert's) against one process.
 *
 * Every run is N forked ranks driving the real trainer (dt_trainer_init / dt_trainer_step /
 * dt_trainer_run with configs/quickstart.ini shrunk to a tiny gpt plus overrides), meeting at a
 * store process on 127.0.0.1, so what is tested is the strategy the job picks (parallel.tensor =
 * T). Each rank writes its per-step loss and gradient norm, and the whole parameters and optimiser
 * state as a checkpoint takes them (gather_state + state: whole tensors assembled from the
 * tensor group's slices) into shared memory; the parent compares a run at T = 2, T = 4 and D = 2 x
 * T = 2 with one process (T = 1) on the same global batch.
 *
 * Tolerances. A tensor-parallel step sums the row-parallel GEMMs' partial products with an
 * all-reduce, the vocabulary-parallel cross-entropy its max and sum-of-exp, and the norm its
 * squares in other orders than one process does, so the runs agree to float rounding, not bit
 * for bit: every step's loss and gradient norm within 1e-5 relative, the final weights and each
 * optimiser state within 1e-5 relative as vectors (2-norm of the difference over the 2-norm).
 * Per tensor most differ by an ulp or two; the one that stands out is c_attn.bias, whose key
 * part has a gradient that is zero in exact arithmetic (softmax ignores a shift shared by a
 * row's scores), so it is rounding noise that AdamW normalises into steps of about lr: it moves
 * the weights a few 1e-5 of that tensor's largest and the loss not at all. Where the order is the
 * same (a checkpoint written at T = 2 resumed at T = 2, against the run that did not stop) the
 * comparison is bit for bit; across layouts (T = 2's checkpoint resumed at T = 1, T = 4 or as
 * DDP) it is the 1e-5 above.
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define MAX_RANKS 4
#define MAX_STEPS 24
#define MAX_PER (256 * 1024)
#define MAX_TENSORS 64
#define STEPS 20 /* the 20 steps */

/* The fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt dt_test_fmt

static const char *repo_dir(void) { return dt_test_repo_dir("configs"); }

/* What every rank of a run reports (shared memory). */
typedef struct rank_out {
    int status;                   /* 0 ok, 2 failed (msg) */
    char msg[1200];
    char strategy[16];
    double loss[MAX_STEPS], norm[MAX_STEPS];
    int64_t step;                 /* the trainer's step at the end */
    size_t local_params;          /* this rank's model buffer */
    size_t strategy_whole;        /* dt_strategy.whole_params (what the worker logs) */
    size_t whole;                 /* elements of the whole parameters, as a checkpoint holds them */
    int num_states;
    bool have_stats;
    dt_tensor_stats st;
    int num_tensors;              /* the whole table, as the checkpoint's */
    size_t t_off[MAX_TENSORS], t_n[MAX_TENSORS];
    char t_name[MAX_TENSORS][48];
    double took;                  /* seconds from the failing step's start to its error */
    size_t optim_bytes;           /* the backend's DT_MEM_OPTIM bytes at the end (this rank's
                                     optimiser state, as test_memory and bench memory count) */
    size_t params_bytes;          /* its DT_MEM_PARAMS bytes then (resident) */
    char summary[48];             /* the strategy's summary */
    float params[MAX_PER];
    float state[2][MAX_PER];      /* the whole optimiser state, as a checkpoint takes it */
} rank_out;

typedef enum mode { STEPS_MODE, RUN, KILL_IN_FORWARD } mode;

typedef struct trun {
    const char *config;           /* configs/<config>: quickstart.ini (gpt), or llama.ini */
    const char *ov[32];           /* overrides */
    int nov;
    int N;
    int steps;                    /* STEPS_MODE: dt_trainer_step this often */
    mode mode;
    int kill_rank;
    char name[64];
    char dir[PATH_MAX];           /* the test's temporary directory (the parent's) */
    int port;
    rank_out *out;                /* (N) shared */
} trun;

static void add(trun *z, const char *ov) { z->ov[z->nov++] = ov; }

/* A tiny gpt (4 heads: T = 4 divides them; vocabulary 256 bytes) on N ranks at tensor degree T,
 * B samples per data-parallel rank, AdamW with clipping on (and active: checked below). */
static trun base(int N, int T, int B, const char *name)
{
    trun z;
    memset(&z, 0, sizeof z);
    z.config = "quickstart.ini";
    z.N = N;
    z.steps = STEPS;
    z.kill_rank = -1;
    snprintf(z.name, sizeof z.name, "%s", name);
    add(&z, "job.device=cpu");
    add(&z, "train.threads=1");
    add(&z, "job.cpu_bind=none");
    add(&z, "checkpoint.resume=never"); /* index 3: train_run replaces it */
    add(&z, "checkpoint.every=0");
    add(&z, "checkpoint.async=false");
    add(&z, "ddp.timeout=5");
    add(&z, fmt("parallel.tensor=%d", T));
    add(&z, "model.n_layer=2");
    add(&z, "model.n_head=4");
    add(&z, "model.n_embd=16");
    add(&z, "model.block_size=16");
    add(&z, "data.seq_len=16");
    add(&z, fmt("train.batch_size=%d", B));
    add(&z, "train.warmup_steps=2");
    add(&z, "train.optimizer=adamw");
    add(&z, "train.schedule=constant"); /* stopped at step 3, a run goes on as one that did not */
    add(&z, "train.grad_clip=0.5");
    add(&z, "train.eval_every=0");
    add(&z, "data.val_fraction=0");
    add(&z, fmt("elastic.nproc_per_node=%d", N)); /* the world the loader checks T against */
    return z;
}

static void record_end(dt_trainer *t, rank_out *o)
{
    dt_strategy *s = t->s;
    dt_err err = {0};
    o->step = t->step;
    o->local_params = t->model->num_params;
    o->strategy_whole = s->whole_params;
    o->have_stats = dt_strategy_tensor_stats(s, &o->st) == 0;
    dt_mem_stats ms;
    dt_mem_read(t->be, &ms);
    o->optim_bytes = ms.cur[DT_MEM_OPTIM];
    o->params_bytes = ms.cur[DT_MEM_PARAMS];
    dt_strlcpy(o->summary, s->summary, sizeof o->summary);
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
        if (bufs[i].numel > MAX_PER || bufs[i].num_tensors > MAX_TENSORS) {
            snprintf(o->msg, sizeof o->msg, "checkpoint buffer of %zu elements, %d tensors: "
                     "raise MAX_PER / MAX_TENSORS", bufs[i].numel, bufs[i].num_tensors);
            o->status = 2;
            return;
        }
        if (!strcmp(bufs[i].file, "model")) {
            o->whole = bufs[i].numel;
            t->be->memcpy_d2h(t->be, o->params, bufs[i].data, bufs[i].numel * sizeof(float));
            o->num_tensors = bufs[i].num_tensors;
            for (int k = 0; k < bufs[i].num_tensors; k++) {
                o->t_off[k] = bufs[i].tensors[k].offset;
                o->t_n[k] = bufs[i].tensors[k].numel;
                dt_strlcpy(o->t_name[k], bufs[i].tensors[k].name, sizeof o->t_name[k]);
            }
        } else if (!strcmp(bufs[i].file, "optim") && o->num_states < 2) {
            t->be->memcpy_d2h(t->be, o->state[o->num_states++], bufs[i].data,
                              bufs[i].numel * sizeof(float));
        }
    }
}

/* KILL_IN_FORWARD: the victim dies just before block 1's forward of the second step, so its
 * tensor group is in (or about to issue) that block's all-reduces. The strategy's own hook
 * (ZeRO-2 commits and zeroes each block's gradients in it, ZeRO-3 gathers) runs inside. */
static int hook_step;
static dt_block_hook_fn inner_hook;
static void *inner_ctx;
static void killing_hook(void *ctx, int block, dt_block_event ev)
{
    (void)ctx;
    if (hook_step == 1 && block == 1 && ev == DT_BLOCK_BEFORE_FORWARD)
        kill(getpid(), SIGKILL);
    if (inner_hook)
        inner_hook(inner_ctx, block, ev);
}

static void rank_body(trun *z, int rank)
{
    static dt_job job;
    static dt_trainer t;
    rank_out *o = &z->out[rank];
    dt_err err = {0};
    if (dt_test_trainer_start(&t, &job, z->config, z->ov, z->nov, z->dir, z->name, rank,
                              z->N, z->port, o->msg, sizeof o->msg) != 0) {
        o->status = 2;
        _exit(2);
    }
    dt_strlcpy(o->strategy, t.s->ops->name, sizeof o->strategy);
    if (z->mode == KILL_IN_FORWARD && rank == z->kill_rank) {
        inner_hook = t.model->block_hook;
        inner_ctx = t.model->block_hook_ctx;
        dt_model_set_block_hook(t.model, killing_hook, NULL);
    }
    if (z->mode == RUN) {
        if (dt_trainer_run(&t, NULL, &err) != 0)
            goto fail;
    } else {
        for (int k = 0; k < z->steps; k++) {
            hook_step = k;
            double t0 = dt_now_s();
            if (dt_trainer_step(&t, &err) != 0) {
                o->took = dt_now_s() - t0;
                goto fail;
            }
            if (k < MAX_STEPS) {
                o->loss[k] = t.loss;
                o->norm[k] = t.grad_norm;
            }
        }
    }
    record_end(&t, o);
    dt_trainer_close(&t);
    _exit(o->status);
fail:
    dt_strlcpy(o->msg, err.msg, sizeof o->msg);
    o->status = 2;
    _exit(2);
}

static void run_rank(int rank, int n, void *arg) { rank_body(arg, rank); }

/* Runs z's ranks; status[r] as waitpid gives it. */
static void run(trun *z, int *status)
{
    DT_REQUIRE(z->N <= MAX_RANKS && z->steps <= MAX_STEPS);
    z->out = dt_test_shared_map(sizeof(rank_out) * (size_t)z->N);
    dt_strlcpy(z->dir, dt_test_tmpdir(), sizeof z->dir); /* made here, not in each child */
    dt_test_run_ranks(z->name, z->N, &z->port, run_rank, z, 100, status);
}

static void unmap(trun *z)
{
    dt_test_shared_unmap(z->out, sizeof(rank_out) * (size_t)z->N);
    z->out = NULL;
}

/* Every rank exited 0; the message of the first that did not. */
static bool all_ok(const trun *z, const int *status)
{
    return dt_test_ranks_ok(z->name, status, z->N, z->out[0].msg, sizeof(rank_out));
}

/* Largest |a - b| / max |b| over each tensor of the whole table (a's), the worst tensor's. */
static double worst_rel(const rank_out *ref, const float *a, const float *b, int *which)
{
    double worst = 0;
    *which = 0;
    for (int k = 0; k < ref->num_tensors; k++) {
        double d = 0, m = 0;
        for (size_t i = ref->t_off[k]; i < ref->t_off[k] + ref->t_n[k]; i++) {
            d = fmax(d, fabs((double)a[i] - (double)b[i]));
            m = fmax(m, fabs((double)b[i]));
        }
        double rel = m > 0 ? d / m : d;
        if (rel > worst) {
            worst = rel;
            *which = k;
        }
    }
    return worst;
}

/* |a - b| / |b| over n elements (2-norms, in double). */
static double rel_l2(const float *a, const float *b, size_t n)
{
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)a[i] - (double)b[i];
        d += e * e;
        m += (double)b[i] * (double)b[i];
    }
    return m > 0 ? sqrt(d / m) : sqrt(d);
}

/* Compares run a (tensor-parallel) with r (one process): every step's loss and gradient norm
 * within tol relative, the final whole weights and each optimiser state within tol relative as
 * vectors (2-norms); and every rank of a against its rank 0 (bit for bit: the gathered
 * checkpoint is the same everywhere). */
static void compare(const trun *a, const trun *r, int steps, double tol)
{
    const rank_out *x = &a->out[0], *y = &r->out[0];
    DT_CHECK_INT(x->whole, y->whole);
    DT_CHECK_INT(x->num_tensors, y->num_tensors);
    DT_CHECK_INT(x->num_states, y->num_states);
    DT_CHECK_INT(x->step, y->step);
    for (int k = 0; k < x->num_tensors && k < y->num_tensors; k++) {
        DT_CHECK_STR(x->t_name[k], y->t_name[k]);
        DT_CHECK_INT(x->t_n[k], y->t_n[k]);
    }
    double worst_loss = 0;
    for (int k = 0; k < steps; k++) {
        double rel = fabs(x->loss[k] - y->loss[k]) / fmax(fabs(y->loss[k]), 1e-30);
        worst_loss = fmax(worst_loss, rel);
        DT_CHECK_MSG(rel <= tol, "%s: step %d loss %.9g vs one process %.9g (%.2e relative)",
                     a->name, k + 1, x->loss[k], y->loss[k], rel);
        double nrel = fabs(x->norm[k] - y->norm[k]) / fmax(fabs(y->norm[k]), 1e-30);
        DT_CHECK_MSG(nrel <= tol, "%s: step %d grad norm %.9g vs one process %.9g", a->name,
                     k + 1, x->norm[k], y->norm[k]);
    }
    /* the weights and each optimiser state as vectors: |a - b| / |b| (2-norms) */
    int which = 0;
    bool same = x->whole == y->whole;
    double wp = same ? rel_l2(x->params, y->params, y->whole) : 1;
    double wt = same ? worst_rel(y, x->params, y->params, &which) : 1;
    DT_CHECK_MSG(wp <= tol, "%s: weights differ from one process's by %.2e (2-norm relative; "
                 "worst tensor %s, %.2e of its largest)", a->name, wp, y->t_name[which], wt);
    double ws = 0;
    for (int i = 0; i < x->num_states && i < y->num_states && same; i++) {
        double s = rel_l2(x->state[i], y->state[i], y->whole);
        DT_CHECK_MSG(s <= tol, "%s: optimiser state %d differs from one process's by %.2e",
                     a->name, i, s);
        ws = fmax(ws, s);
    }
    for (int q = 1; q < a->N; q++)
        if (dt_test_gathers_whole(a->ov, a->nov, a->N, q))
            DT_CHECK_MSG(!memcmp(a->out[q].params, x->params, x->whole * sizeof(float)),
                         "%s: rank %d's gathered weights differ from rank 0's", a->name, q);
    printf("    %-10s %zu of %zu parameters per rank, loss %.5f -> %.5f; relative to one "
           "process: loss %.1e, weights %.1e (worst tensor %s: %.1e of its largest), optimiser "
           "state %.1e\n",
           a->name, x->local_params, x->whole, x->loss[0], x->loss[steps - 1], worst_loss, wp,
           y->t_name[which], wt, ws);
}

/* ---- against one process -------------------------------------------------------------------- */

/* T = 2 on 2 ranks and T = 4 on 4 ranks (D = 1) equal one process on the same batch. */
static void test_tensor_equals_one_process(void)
{
    trun one = base(1, 1, 4, "one");
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    DT_CHECK_STR(one.out[0].strategy, "single");
    /* the clip is active: the norm exceeds grad_clip on most steps */
    int clipped = 0;
    for (int k = 0; k < STEPS; k++)
        clipped += one.out[0].norm[k] > 0.5;
    DT_CHECK_MSG(clipped >= STEPS / 2, "grad_clip = 0.5 clipped %d of %d steps", clipped, STEPS);
    for (int T = 2; T <= 4; T += 2) {
        trun tp = base(T, T, 4, fmt("t%d", T));
        run(&tp, st);
        if (all_ok(&tp, st)) {
            DT_CHECK_STR(tp.out[0].strategy, "tensor");
            DT_REQUIRE(tp.out[0].have_stats);
            const dt_tensor_stats *s = &tp.out[0].st;
            DT_CHECK_INT(s->T, T);
            DT_CHECK_INT(s->D, 1);
            /* each rank holds 1/T of the split tensors, the replicated ones whole */
            DT_CHECK_INT(s->split_local * T, s->split_whole);
            DT_CHECK_INT(s->split_whole + s->replicated, s->whole_params);
            DT_CHECK_INT(s->local_params, s->split_local + s->replicated);
            DT_CHECK_INT(s->whole_params, one.out[0].whole);
            DT_CHECK_INT(tp.out[0].strategy_whole, one.out[0].whole);
            for (int q = 0; q < T; q++)
                DT_CHECK_INT(tp.out[q].st.tp, q);
            compare(&tp, &one, STEPS, 1e-5);
        }
        unmap(&tp);
    }
    unmap(&one);
}

/* The same tiny shapes as a llama (configs/llama.ini): 8 query heads on 4 key/value heads (T = 2
 * and 4 divide both), head size 4, SwiGLU width 48, sequence parallelism when sp. */
static trun llama_base(int N, int T, int B, bool sp, const char *name)
{
    trun z = base(N, T, B, name);
    z.config = "llama.ini";
    add(&z, "model.n_head=8");
    add(&z, "model.n_kv_head=4");
    add(&z, "model.n_embd=32");
    add(&z, "model.intermediate_size=48");
    if (sp)
        add(&z, "parallel.sequence_parallel=true");
    return z;
}

/* llama: T = 2 and 4, T = 2 with sequence parallelism, and D = 2 x T = 2 at ZeRO 0 to 3 equal one
 * process on the same global batch, as gpt's do. */
static void test_llama_equals_one_process(void)
{
    trun one = llama_base(1, 1, 4, false, "llama-one"), one8 = llama_base(1, 1, 8, false,
                                                                        "llama-one-b8");
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    run(&one8, st);
    DT_REQUIRE(all_ok(&one8, st));
    DT_CHECK_STR(one.out[0].t_name[0], "model.embed_tokens.weight");
    DT_CHECK(one.out[0].loss[STEPS - 1] < one.out[0].loss[0]);
    struct {
        int N, T, zero;
        bool sp;
    } cases[] = {{2, 1, 0, false}, {2, 2, 0, false}, {4, 4, 0, false}, {2, 2, 0, true}, {4, 4, 0, true},
                 {4, 2, 0, false}, {4, 2, 1, false}, {4, 2, 2, false}, {4, 2, 3, true}};
    for (size_t i = 0; i < DT_ARRAY_LEN(cases); i++) {
        const int N = cases[i].N, T = cases[i].T;
        trun tp = llama_base(N, T, 4, cases[i].sp,
                             fmt("llama-d%dt%d-z%d%s", N / T, T, cases[i].zero,
                                 cases[i].sp ? "-sp" : ""));
        add(&tp, fmt("parallel.zero=%d", cases[i].zero));
        run(&tp, st);
        if (all_ok(&tp, st)) {
            DT_CHECK_STR(tp.out[0].strategy, T > 1 ? "tensor" : "ddp");
            if (T > 1) {
                DT_CHECK_INT(tp.out[0].st.T, T);
                DT_CHECK_INT(tp.out[0].st.split_local * T, tp.out[0].st.split_whole);
            }
            compare(&tp, N / T > 1 ? &one8 : &one, STEPS, 1e-5);
        }
        unmap(&tp);
    }
    unmap(&one);
    unmap(&one8);
}

/* bert (bert.c's tensor-parallel form, the MLM samples of the GPL text with sentence pairs: 4
 * special tokens, vocabulary 260) at T = 2, D = 2 x T = 2 under DDP, under ZeRO-1 with sequence
 * parallelism, and under ZeRO-3 with recompute = block, and plain DDP on 2 ranks and DP with 2
 * replicas (job.strategy = dp), each against one process on the same
 * global batch over 20 steps (the masked positions are the same in every layout, and every
 * sample has as many: data/mlm.h). */
static trun bert_base(int N, int T, int B, const char *name)
{
    trun z = base(N, T, B, name);
    add(&z, "model.type=bert");
    add(&z, "model.nsp=true");
    return z;
}

static void test_bert_layouts(void)
{
    trun one = bert_base(1, 1, 8, "bert-one");
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    DT_CHECK_STR(one.out[0].t_name[0], "bert.embeddings.word_embeddings.weight");
    DT_CHECK_INT(one.out[0].t_n[0], 260 * 16);
    trun runs[6] = {bert_base(2, 2, 8, "bert-t2"),          bert_base(4, 2, 4, "bert-d2xt2"),
                    bert_base(4, 2, 4, "bert-d2xt2-z1-sp"), bert_base(4, 2, 4, "bert-d2xt2-z3"),
                    bert_base(2, 1, 4, "bert-ddp2"),        bert_base(1, 1, 4, "bert-dp2")};
    const char *want[6] = {"tensor", "tensor", "tensor", "tensor", "ddp", "dp"};
    add(&runs[1], "ddp.first_bucket_mb=0.002");
    add(&runs[2], "parallel.zero=1");
    add(&runs[2], "parallel.sequence_parallel=true");
    add(&runs[3], "parallel.zero=3");
    add(&runs[3], "train.recompute=block");
    add(&runs[4], "ddp.first_bucket_mb=0.002"); /* plain DDP: several buckets */
    add(&runs[5], "job.strategy=dp");           /* DP: one process, 2 replica threads */
    add(&runs[5], "job.dp_replicas=2");
    for (int i = 0; i < 6; i++) {
        run(&runs[i], st);
        if (all_ok(&runs[i], st)) {
            DT_CHECK_STR(runs[i].out[0].strategy, want[i]);
            compare(&runs[i], &one, STEPS, 1e-5);
        }
        unmap(&runs[i]);
    }
    DT_CHECK(one.out[0].loss[STEPS - 1] < one.out[0].loss[0]);
    unmap(&one);
}

/* A vocabulary that T does not divide (258 at T = 4: padded to 260, the padding rows zero, out
 * of the loss and of the checkpoint): still one process's training, and the gathered wte is
 * (258, C) as one process's. */
static void test_padded_vocabulary(void)
{
    trun one = base(1, 1, 4, "one-v258"), t4 = base(4, 4, 4, "t4-v258");
    add(&one, "data.vocab_size=258");
    add(&t4, "data.vocab_size=258");
    one.steps = t4.steps = 10;
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    run(&t4, st);
    if (all_ok(&t4, st)) {
        DT_CHECK_STR(t4.out[0].t_name[0], "wte.weight");
        DT_CHECK_INT(t4.out[0].t_n[0], 258 * 16);
        /* each rank holds 65 rows of wte (260 / 4), the last rank's two of them padding */
        DT_CHECK_INT(t4.out[0].st.split_local * 4 - t4.out[0].st.split_whole, 2 * 16);
        compare(&t4, &one, 10, 1e-5);
    }
    unmap(&one);
    unmap(&t4);
}

/* D = 2 x T = 2 on 4 ranks equals one process on the same global batch (2 x 4 samples): the
 * data-parallel reducer averages each shard's gradients over its data-parallel group. */
static void test_data_x_tensor(void)
{
    trun one = base(1, 1, 8, "one-b8");
    trun dt = base(4, 2, 4, "d2xt2");
    add(&dt, "ddp.first_bucket_mb=0.002"); /* several buckets, overlapped with backward */
    add(&dt, "ddp.bucket_cap_mb=0.01");
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    run(&dt, st);
    if (all_ok(&dt, st)) {
        DT_CHECK_STR(dt.out[0].strategy, "tensor");
        for (int q = 0; q < 4; q++) {
            DT_CHECK_INT(dt.out[q].st.D, 2);
            DT_CHECK_INT(dt.out[q].st.dp, q / 2); /* tensor groups are consecutive ranks */
            DT_CHECK_INT(dt.out[q].st.tp, q % 2);
        }
        compare(&dt, &one, STEPS, 1e-5);
    }
    unmap(&one);
    unmap(&dt);
}

/* ZeRO stages 1, 2 and 3 over the data-parallel groups of D = 2 x T = 2 (each rank shards its
 * own slices' optimiser state, at stage 2 its gradients too, at stage 3 its parameters too,
 * gathered block by block around their use) equal one process on the same global batch over 20
 * steps, within 1e-5 as DDP's D2 x T2 does; and each
 * rank's optimiser state, as the backend's allocator counts it (DT_MEM_OPTIM), is half of what
 * the same layout holds at zero = 0 (within 2%: the shards' chunks are padded to ceil(n / 2)). */
static void test_data_x_tensor_zero(void)
{
    trun one = base(1, 1, 8, "one-b8-z");
    trun ddp = base(4, 2, 4, "d2xt2-z0");
    int st[MAX_RANKS];
    run(&one, st);
    DT_REQUIRE(all_ok(&one, st));
    run(&ddp, st);
    DT_REQUIRE(all_ok(&ddp, st));
    for (int zero = 1; zero <= 3; zero++) {
        trun z = base(4, 2, 4, fmt("d2xt2-zero%d", zero));
        add(&z, fmt("parallel.zero=%d", zero));
        add(&z, "ddp.first_bucket_mb=0.002"); /* several buckets, overlapped with backward */
        add(&z, "ddp.bucket_cap_mb=0.01");
        run(&z, st);
        if (all_ok(&z, st)) {
            DT_CHECK_STR(z.out[0].strategy, "tensor");
            DT_CHECK_CONTAINS(z.out[0].summary, fmt("ZeRO-%d", zero));
            compare(&z, &one, STEPS, 1e-5);
            for (int q = 0; q < 4; q++) {
                double half = (double)ddp.out[q].optim_bytes / 2;
                double rel = fabs((double)z.out[q].optim_bytes - half) / half;
                DT_CHECK_MSG(ddp.out[q].optim_bytes > 0 && rel <= 0.02,
                             "zero = %d, rank %d: optimiser state %zu bytes, zero = 0's %zu "
                             "(%.2f%% off half)", zero, q, z.out[q].optim_bytes,
                             ddp.out[q].optim_bytes, 100 * rel);
            }
            printf("    zero = %d: per rank optimiser state %zu bytes (zero = 0: %zu)\n", zero,
                   z.out[0].optim_bytes, ddp.out[0].optim_bytes);
        }
        unmap(&z);
    }
    unmap(&one);
    unmap(&ddp);
}

/* ZeRO-3 at D = 2 x T = 2 holds, between steps, its shard of its slices (half) and one block's
 * gather buffer instead of its slices: with 4 blocks of about a quarter of the slices each
 * (n_embd 64), about 3/4 of what zero = 0 holds, as the allocator counts DT_MEM_PARAMS (the flat
 * buffer's pages given back); the optimiser state half. */
static void test_zero3_memory(void)
{
    trun r[2];
    int st[MAX_RANKS];
    /* at the page granule: the slices (440 KB) lie inside one granule of a coarser
     * DTRAIN_CPU_MEM_GRANULE, where nothing can be given back (test_zero's stage3_granules covers
     * that); the ranks forked from here read the variable at their first allocation */
    unsetenv("DTRAIN_CPU_MEM_GRANULE");
    for (int k = 0; k < 2; k++) {
        r[k] = base(4, 2, 4, fmt("d2xt2-mem-zero%d", 3 * k));
        add(&r[k], "model.n_embd=64");
        add(&r[k], "model.n_layer=4");
        add(&r[k], fmt("parallel.zero=%d", 3 * k));
        r[k].steps = 2;
        run(&r[k], st);
        all_ok(&r[k], st);
    }
    for (int q = 0; q < 4; q++) {
        const rank_out *a = &r[1].out[q], *b = &r[0].out[q];
        double p = (double)a->params_bytes / (double)b->params_bytes;
        double o = (double)a->optim_bytes / (double)b->optim_bytes;
        DT_CHECK_MSG(p < 0.85 && fabs(o - 0.5) <= 0.01, "rank %d: zero = 3 holds %zu parameter "
                     "bytes (%.2f of zero = 0's %zu), optimiser %zu (%.3f of %zu)", q,
                     a->params_bytes, p, b->params_bytes, a->optim_bytes, o, b->optim_bytes);
        if (q == 0)
            printf("    zero = 3 at D2 x T2: parameters %zu bytes (zero = 0: %zu, %.2f), "
                   "optimiser state %zu (%zu)\n", a->params_bytes, b->params_bytes, p,
                   a->optim_bytes, b->optim_bytes);
    }
    unmap(&r[0]);
    unmap(&r[1]);
}

/* Gradient accumulation (2 micro-steps: the data-parallel reducer hears of the last one only),
 * global_batch (micro-steps of unequal shares) and fp16 loss scaling (clip unscales the slices)
 * at D = 2 x T = 2 against one process. */
static void test_accumulation(void)
{
    const char *const more[3][2] = {{"train.grad_accum=2", "train.grad_accum=2"},
                                    {"train.global_batch=12", "train.global_batch=12"},
                                    {"train.precision=fp16", "train.precision=fp16"}};
    const char *names[3] = {"accum", "gbatch", "fp16"};
    for (int k = 0; k < 3; k++) {
        /* accum, fp16: one process draws each micro-step's 2 x 4 samples itself; global_batch:
         * 12 samples a step whoever draws them (one process: 3 micro-steps of 4) */
        trun one = base(1, 1, k == 1 ? 4 : 8, fmt("one-%s", names[k]));
        trun dt = base(4, 2, 4, fmt("d2xt2-%s", names[k]));
        one.steps = dt.steps = 10;
        add(&one, more[k][0]);
        add(&dt, more[k][1]);
        int st[MAX_RANKS];
        run(&one, st);
        DT_REQUIRE(all_ok(&one, st));
        run(&dt, st);
        if (all_ok(&dt, st))
            compare(&dt, &one, 10, 1e-5);
        unmap(&one);
        unmap(&dt);
    }
}

/* The same options at D = 2 x T = 2 with ZeRO: accumulation at stage 2 (the earlier micro-step
 * keeps the whole gradient, the last one's pages are given back as its buckets are reduced),
 * global_batch at stage 1, fp16 (clip unscales the shards) at stage 2, against one process. */
static void test_accumulation_zero(void)
{
    const char *const more[3] = {"train.grad_accum=2", "train.global_batch=12",
                                 "train.precision=fp16"};
    const char *names[3] = {"accum", "gbatch", "fp16"};
    const int zero[3] = {2, 1, 2};
    for (int k = 0; k < 3; k++) {
        trun one = base(1, 1, k == 1 ? 4 : 8, fmt("one-z-%s", names[k]));
        trun dt = base(4, 2, 4, fmt("d2xt2-zero%d-%s", zero[k], names[k]));
        one.steps = dt.steps = 10;
        add(&one, more[k]);
        add(&dt, more[k]);
        add(&dt, fmt("parallel.zero=%d", zero[k]));
        add(&dt, "ddp.first_bucket_mb=0.002");
        add(&dt, "ddp.bucket_cap_mb=0.01");
        int st[MAX_RANKS];
        run(&one, st);
        DT_REQUIRE(all_ok(&one, st));
        run(&dt, st);
        if (all_ok(&dt, st)) {
            DT_CHECK_CONTAINS(dt.out[0].summary, fmt("ZeRO-%d", zero[k]));
            compare(&dt, &one, 10, 1e-5);
        }
        unmap(&one);
        unmap(&dt);
    }
}

/* ---- checkpoints ----------------------------------------------------------------------------*/

static void train_run(trun *z, int steps, const char *resume)
{
    add(z, fmt("train.steps=%d", steps));
    if (resume)
        z->ov[3] = fmt("checkpoint.resume=%s", resume); /* replaces base's resume=never */
    z->mode = RUN;
    int st[MAX_RANKS];
    run(z, st);
    all_ok(z, st);
}

static const char *ckpt_of(const trun *z, int step)
{
    return fmt("%s/%s/checkpoints/step_%d", dt_test_tmpdir(), z->name, step);
}

/* What an independent reader (tests/safetensors_read.py, the standard library only) lists of a
 * safetensors file: one line per tensor, name, dtype, shape. */
static char *listing(const char *file)
{
    char *out = NULL;
    int rc = dt_test_run(fmt("python3 '%s/tests/safetensors_read.py' '%s'", repo_dir(), file),
                         &out, 30);
    DT_CHECK_MSG(rc == 0, "safetensors_read.py %s: exit %d: %s", file, rc, out ? out : "");
    return out;
}

/* A checkpoint written at T = 2 holds whole tensors under the names and shapes one process
 * writes (an independent reader lists the same tensors), and resumes: at T = 2, bit for bit as
 * the run that did not stop; at T = 1 and T = 4, and as plain DDP on 2 ranks, within 1e-5 of it
 * (the reduction orders differ). One process's checkpoint resumes at T = 2 likewise. */
static void test_checkpoint_across_layouts(void)
{
    trun t2 = base(2, 2, 4, "ck-t2"), one = base(1, 1, 4, "ck-one");
    train_run(&t2, 3, NULL);
    train_run(&one, 3, NULL);
    DT_CHECK_STR(t2.out[0].strategy, "tensor");
    for (int f = 0; f < 2; f++) {
        const char *file = f ? "optim.safetensors" : "model.safetensors";
        char *a = listing(fmt("%s/%s", ckpt_of(&t2, 3), file));
        char *b = listing(fmt("%s/%s", ckpt_of(&one, 3), file));
        if (a && b) {
            DT_CHECK_MSG(!strcmp(a, b), "%s at T = 2 lists\n%s\nand one process's\n%s", file, a,
                         b);
            DT_CHECK_CONTAINS(a, f ? "exp_avg.h.0.attn.c_attn.weight" : "h.1.mlp.c_fc.weight");
        }
        free(a);
        free(b);
    }
    /* the run that does not stop */
    trun straight = base(2, 2, 4, "ck-t2-straight");
    train_run(&straight, 6, NULL);
    trun same = base(2, 2, 4, "ck-t2-to-t2");
    train_run(&same, 6, ckpt_of(&t2, 3));
    DT_CHECK_INT(same.out[0].step, 6);
    DT_CHECK_MSG(!memcmp(same.out[0].params, straight.out[0].params,
                         straight.out[0].whole * sizeof(float)),
                 "T = 2 resumed at T = 2 differs from the run that did not stop");
    for (int i = 0; i < straight.out[0].num_states; i++)
        DT_CHECK_MSG(!memcmp(same.out[0].state[i], straight.out[0].state[i],
                             straight.out[0].whole * sizeof(float)),
                     "optimiser state %d: T = 2 resumed at T = 2 differs", i);
    /* other layouts */
    const int to_n[3] = {1, 4, 2}, to_t[3] = {1, 4, 1};
    const char *const to_s[3] = {"single", "tensor", "ddp"};
    for (int k = 0; k < 3; k++) {
        trun x = base(to_n[k], to_t[k], 4, fmt("ck-t2-to-n%d-t%d", to_n[k], to_t[k]));
        if (to_n[k] == 2) /* plain DDP: 2 ranks of 2 samples, the same global batch of 4 */
            x.ov[13] = "train.batch_size=2";
        train_run(&x, 6, ckpt_of(&t2, 3));
        DT_CHECK_STR(x.out[0].strategy, to_s[k]);
        DT_CHECK_INT(x.out[0].step, 6);
        int which = 0;
        double w = worst_rel(&straight.out[0], x.out[0].params, straight.out[0].params, &which);
        double l2 = rel_l2(x.out[0].params, straight.out[0].params, straight.out[0].whole);
        DT_CHECK_MSG(l2 <= 1e-5, "T = 2's checkpoint resumed on %d rank(s) at T = %d: weights "
                     "differ from T = 2's by %.2e (worst tensor %s)", to_n[k], to_t[k], l2,
                     straight.out[0].t_name[which]);
        printf("    T = 2's step 3 resumed on %d rank(s) at T = %d (%s): step 6 weights within "
               "%.1e of T = 2's (worst tensor %s: %.1e of its largest)\n", to_n[k], to_t[k],
               to_s[k], l2, straight.out[0].t_name[which], w);
        unmap(&x);
    }
    /* the reverse: one process's checkpoint at T = 2 */
    trun rev = base(2, 2, 4, "ck-one-to-t2"), cont = base(1, 1, 4, "ck-one-straight");
    train_run(&rev, 6, ckpt_of(&one, 3));
    train_run(&cont, 6, NULL);
    DT_CHECK_STR(rev.out[0].strategy, "tensor");
    int which = 0;
    double w = worst_rel(&cont.out[0], rev.out[0].params, cont.out[0].params, &which);
    double l2 = rel_l2(rev.out[0].params, cont.out[0].params, cont.out[0].whole);
    DT_CHECK_MSG(l2 <= 1e-5, "one process's checkpoint resumed at T = 2: weights differ by %.2e "
                 "(worst tensor %s: %.1e of its largest)", l2, cont.out[0].t_name[which], w);
    unmap(&t2);
    unmap(&one);
    unmap(&straight);
    unmap(&same);
    unmap(&rev);
    unmap(&cont);
}

/* A checkpoint written at D = 2 x T = 2 with zero = 1 (shards gathered over the data-parallel
 * group, then slices over the tensor group) holds what one process's does and resumes: at
 * D2 x T2 zero = 1 bit for bit as the run that did not stop; as one process within 1e-5 of it.
 * The reverse: one process's checkpoint resumed at D2 x T2 with zero = 2 trains on within 1e-5
 * of one process that did not stop. */
static void test_checkpoint_zero(void)
{
    trun z1 = base(4, 2, 4, "ckz-d2t2"), one = base(1, 1, 8, "ckz-one");
    add(&z1, "parallel.zero=1");
    train_run(&z1, 3, NULL);
    train_run(&one, 3, NULL);
    DT_CHECK_STR(z1.out[0].strategy, "tensor");
    for (int f = 0; f < 2; f++) {
        const char *file = f ? "optim.safetensors" : "model.safetensors";
        char *a = listing(fmt("%s/%s", ckpt_of(&z1, 3), file));
        char *b = listing(fmt("%s/%s", ckpt_of(&one, 3), file));
        if (a && b)
            DT_CHECK_MSG(!strcmp(a, b), "%s at D2 x T2 zero = 1 lists\n%s\nand one process's\n%s",
                         file, a, b);
        free(a);
        free(b);
    }
    trun straight = base(4, 2, 4, "ckz-d2t2-straight");
    add(&straight, "parallel.zero=1");
    train_run(&straight, 6, NULL);
    trun same = base(4, 2, 4, "ckz-d2t2-to-d2t2");
    add(&same, "parallel.zero=1");
    train_run(&same, 6, ckpt_of(&z1, 3));
    DT_CHECK_INT(same.out[0].step, 6);
    DT_CHECK_MSG(!memcmp(same.out[0].params, straight.out[0].params,
                         straight.out[0].whole * sizeof(float)),
                 "D2 x T2 zero = 1 resumed at the same layout differs from the run that did not "
                 "stop");
    for (int i = 0; i < straight.out[0].num_states; i++)
        DT_CHECK_MSG(!memcmp(same.out[0].state[i], straight.out[0].state[i],
                             straight.out[0].whole * sizeof(float)),
                     "optimiser state %d: D2 x T2 zero = 1 resumed at the same layout differs", i);
    trun to1 = base(1, 1, 8, "ckz-d2t2-to-one");
    train_run(&to1, 6, ckpt_of(&z1, 3));
    DT_CHECK_STR(to1.out[0].strategy, "single");
    DT_CHECK_INT(to1.out[0].step, 6);
    double l2 = rel_l2(to1.out[0].params, straight.out[0].params, straight.out[0].whole);
    double s2 = rel_l2(to1.out[0].state[1], straight.out[0].state[1], straight.out[0].whole);
    DT_CHECK_MSG(l2 <= 1e-5 && s2 <= 1e-5, "D2 x T2 zero = 1's checkpoint resumed as one process: "
                 "weights %.2e, exp_avg_sq %.2e off the run that did not stop", l2, s2);
    trun rev = base(4, 2, 4, "ckz-one-to-d2t2"), cont = base(1, 1, 8, "ckz-one-straight");
    add(&rev, "parallel.zero=2");
    train_run(&rev, 6, ckpt_of(&one, 3));
    train_run(&cont, 6, NULL);
    DT_CHECK_STR(rev.out[0].strategy, "tensor");
    DT_CHECK_INT(rev.out[0].step, 6);
    double r2 = rel_l2(rev.out[0].params, cont.out[0].params, cont.out[0].whole);
    double rs = rel_l2(rev.out[0].state[1], cont.out[0].state[1], cont.out[0].whole);
    DT_CHECK_MSG(r2 <= 1e-5 && rs <= 1e-5, "one process's checkpoint resumed at D2 x T2 zero = 2: "
                 "weights %.2e, exp_avg_sq %.2e off one process", r2, rs);
    /* stage 3: one process's checkpoint resumed at D2 x T2, and its own checkpoint resumed as
     * one process */
    trun rev3 = base(4, 2, 4, "ckz-one-to-d2t2-z3");
    add(&rev3, "parallel.zero=3");
    train_run(&rev3, 6, ckpt_of(&one, 3));
    DT_CHECK_CONTAINS(rev3.out[0].summary, "ZeRO-3");
    double r3 = rel_l2(rev3.out[0].params, cont.out[0].params, cont.out[0].whole);
    double s3 = rel_l2(rev3.out[0].state[1], cont.out[0].state[1], cont.out[0].whole);
    DT_CHECK_MSG(r3 <= 1e-5 && s3 <= 1e-5, "one process's checkpoint resumed at D2 x T2 zero = 3: "
                 "weights %.2e, exp_avg_sq %.2e off one process", r3, s3);
    trun to1b = base(1, 1, 8, "ckz-d2t2-z3-to-one");
    train_run(&to1b, 9, fmt("%s/%s/checkpoints/step_6", dt_test_tmpdir(), rev3.name));
    trun cont9 = base(1, 1, 8, "ckz-one-straight-9");
    train_run(&cont9, 9, NULL);
    double q3 = rel_l2(to1b.out[0].params, cont9.out[0].params, cont9.out[0].whole);
    DT_CHECK_INT(to1b.out[0].step, 9);
    DT_CHECK_MSG(q3 <= 1e-5, "D2 x T2 zero = 3's checkpoint resumed as one process: weights "
                 "%.2e off one process", q3);
    printf("    D2 x T2 zero = 1 -> one process: weights %.1e, exp_avg_sq %.1e; one process -> "
           "D2 x T2 zero = 2: %.1e, %.1e; zero = 3: %.1e, %.1e; and back: %.1e\n", l2, s2, r2, rs,
           r3, s3, q3);
    unmap(&rev3);
    unmap(&to1b);
    unmap(&cont9);
    unmap(&z1);
    unmap(&one);
    unmap(&straight);
    unmap(&same);
    unmap(&to1);
    unmap(&rev);
    unmap(&cont);
}

/* ---- failures ------------------------------------------------------------------------------ */

/* A rank killed as block 1's forward begins: its tensor peers are in (or about to issue) that
 * block's all-reduces. On 2 ranks (T = 2) the survivor's step fails within ddp.timeout (5 s)
 * with an error naming the dead rank. On 4 (D = 2 x T = 2, rank 3 killed) every other rank's
 * step fails within it too: rank 2's (its tensor peer) naming rank 3; ranks 0 and 1 as their
 * groups fall (rank 2's exit ends the data-parallel group of tp 0, rank 3's that of tp 1). */
static void test_killed_rank(void)
{
    for (int N = 2; N <= 4; N += 2) {
        trun z = base(N, 2, 4, fmt("kill-n%d", N));
        z.mode = KILL_IN_FORWARD;
        z.kill_rank = N - 1;
        z.steps = 4;
        int st[MAX_RANKS];
        run(&z, st);
        DT_CHECK(WIFSIGNALED(st[N - 1]) && WTERMSIG(st[N - 1]) == SIGKILL);
        for (int r = 0; r < N - 1; r++) {
            DT_CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 2, "%s: rank %d: status %d",
                         z.name, r, st[r]);
            DT_CHECK_MSG(z.out[r].took < 5.0 + 2, "%s: rank %d took %.1f s to fail (ddp.timeout "
                         "5)", z.name, r, z.out[r].took);
            printf("    %s: rank %d failed after %.2f s: %.300s\n", z.name, r, z.out[r].took,
                   z.out[r].msg);
        }
        DT_CHECK_CONTAINS(z.out[N - 2].msg, fmt("rank %d", N - 1));
        DT_CHECK_CONTAINS(z.out[N - 2].msg, "all-reduce");
        if (N == 4) /* rank 1 (tp 1) lost rank 3, its data-parallel peer, in the gradients' */
            DT_CHECK_CONTAINS(z.out[1].msg, "rank 3");
        unmap(&z);
    }
}

/* The same at D = 2 x T = 2 with zero = 2, rank 3 killed as block 1's forward begins: every
 * other rank's step fails within ddp.timeout, rank 2 (its tensor peer) naming rank 3; rank 1
 * (its data-parallel peer) in the reduce-scatter or the all-gather of the shards, naming it. */
static void test_killed_rank_zero(void)
{
    trun z = base(4, 2, 4, "kill-zero2");
    add(&z, "parallel.zero=2");
    z.mode = KILL_IN_FORWARD;
    z.kill_rank = 3;
    z.steps = 4;
    int st[MAX_RANKS];
    run(&z, st);
    DT_CHECK(WIFSIGNALED(st[3]) && WTERMSIG(st[3]) == SIGKILL);
    for (int r = 0; r < 3; r++) {
        DT_CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 2, "%s: rank %d: status %d",
                     z.name, r, st[r]);
        DT_CHECK_MSG(z.out[r].took < 5.0 + 2, "%s: rank %d took %.1f s to fail (ddp.timeout 5)",
                     z.name, r, z.out[r].took);
        printf("    %s: rank %d failed after %.2f s: %.300s\n", z.name, r, z.out[r].took,
               z.out[r].msg);
    }
    DT_CHECK_CONTAINS(z.out[2].msg, "rank 3");
    DT_CHECK_CONTAINS(z.out[1].msg, "rank 3");
    unmap(&z);
}

/* ---- the launcher -------------------------------------------------------------------------- */

/* `dtrain --nproc-per-node=2 JOB parallel.tensor=2` as a user runs it: the agent starts two
 * workers, they pick the tensor strategy, train, save a checkpoint of whole tensors and exit 0;
 * the summary names the layout. */
static void test_dtrain_binary(void)
{
    char *out = NULL;
    const char *dir = fmt("%s/e2e", dt_test_tmpdir());
    int rc = dt_test_run(
        fmt("%s --standalone --nproc-per-node=2 --max-restarts=0 %s/configs/quickstart.ini "
            "parallel.tensor=2 job.device=cpu job.cpu_bind=none model.n_layer=2 model.n_head=4 "
            "model.n_embd=16 model.block_size=16 data.seq_len=16 train.batch_size=4 "
            "train.steps=8 train.eval_every=4 checkpoint.every=4 job.output_dir=%s 2>&1",
            dt_test_dtrain_bin(), repo_dir(), dir),
        &out, 90);
    DT_CHECK_MSG(rc == 0, "dtrain exited %d: %.4000s", rc, out ? out : "");
    if (out) {
        DT_CHECK_CONTAINS(out, "tensor 2 x data 1");
        DT_CHECK_CONTAINS(out, "done after 8 steps");
    }
    DT_CHECK(access(fmt("%s/checkpoints/step_8/model.safetensors", dir), F_OK) == 0);
    DT_CHECK(access(fmt("%s/metrics.jsonl", dir), F_OK) == 0);
    free(out);
}

/* ---- configuration ------------------------------------------------------------------------ */

/* parallel.tensor with a model that has no tensor-parallel form fails at open, naming the key. */
static void test_config_errors(void)
{
    trun z = base(2, 2, 4, "cfg-mlp");
    add(&z, "model.type=mlp");
    add(&z, "data.type=synthetic");
    add(&z, "model.hidden=8");
    z.steps = 1;
    int st[MAX_RANKS];
    run(&z, st);
    for (int r = 0; r < 2; r++) {
        DT_CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 2, "rank %d: status %d", r,
                     st[r]);
        DT_CHECK_CONTAINS(z.out[r].msg, "parallel.tensor");
    }
    unmap(&z);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"config_errors", test_config_errors, 60},
        {"tensor_2_and_4_equal_one_process", test_tensor_equals_one_process, 120},
        {"padded_vocabulary", test_padded_vocabulary, 120},
        {"bert_t2_d2xt2_zero_sp_ddp_dp_equal_one_process", test_bert_layouts, 240},
        {"llama_tensor_sequence_zero_equal_one_process", test_llama_equals_one_process, 300},
        {"data_2_x_tensor_2_equals_one_process", test_data_x_tensor, 120},
        {"data_2_x_tensor_2_zero_1_2_3", test_data_x_tensor_zero, 180},
        {"accumulation_global_batch_fp16", test_accumulation, 120},
        {"accumulation_global_batch_fp16_zero", test_accumulation_zero, 120},
        {"zero3_memory", test_zero3_memory, 120},
        {"checkpoint_across_layouts", test_checkpoint_across_layouts, 180},
        {"checkpoint_zero_across_layouts", test_checkpoint_zero, 240},
        {"killed_rank", test_killed_rank, 60},
        {"killed_rank_zero", test_killed_rank_zero, 60},
        {"dtrain_binary", test_dtrain_binary, 120},
    };
    return dt_test_main("test_tensor", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
