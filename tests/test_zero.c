/* test_zero.c - ZeRO stages 1, 2 and 3 (dpsync_zero12.c over ddp.c's sharding mode, and
 * dpsync_zero3.c) against DDP.
 *
 * Every run is N forked ranks driving the real trainer (dt_trainer_init / dt_trainer_step /
 * dt_trainer_run with a job loaded from configs/ plus overrides), meeting at a store process on
 * 127.0.0.1, so what is tested is the strategy the job picks. Each rank writes its per-step
 * loss and gradient norm, its final parameters and the whole optimiser state (gathered through
 * the strategy's gather_state + state ops, as a checkpoint takes it) into shared memory; the
 * parent compares a ZeRO run with the DDP run (parallel.zero = 0) of the same job and world
 * size: bit for bit where the reduction order is the same (one host), which is every case here.
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
#include "runtime/train/parallel/dpsync/ddp.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define MAX_RANKS 4
#define MAX_STEPS 50
#define MAX_PER (512 * 1024)
#define Z3_STEPS 50 /* stage 3 against DDP: the issue's 50 steps */ /* parameters of the models here (checked) */

/* The fixtures' ring of formatted strings (tests/fixtures.h). */
#define fmt dt_test_fmt

static const char *repo_dir(void) { return dt_test_repo_dir("configs"); }

/* What every rank of a run reports (shared memory). */
typedef struct rank_out {
    int status;                   /* 0 ok, 2 failed (msg) */
    char msg[1200];
    char strategy[16];
    double loss[MAX_STEPS], norm[MAX_STEPS];
    double eval_loss, eval_acc;   /* EVAL */
    int64_t step;                 /* the trainer's step at the end */
    size_t num_params;
    int num_states;
    dt_strategy_mem mem;
    dt_mem_stats alloc;           /* the backend's statistics at the end (peaks: since training
                                   * started, as dt_trainer_init resets them) */
    int64_t skipped, optim_t;     /* the loss scaler's skipped steps, the optimiser's t */
    double scale;
    bool have_stats;
    dt_ddp_stats st;              /* zero: the reducer's */
    float params[MAX_PER];
    float state[2][MAX_PER];      /* the whole optimiser state, as a checkpoint takes it */
} rank_out;

typedef enum mode { STEPS, RUN, KILL_IN_GATHER, KILL_BETWEEN_STEPS, OVERFLOW_ON_ONE,
                    KILL_IN_FORWARD, EVAL } mode;

typedef struct zrun {
    const char *config;           /* configs/<config> */
    const char *ov[24];           /* overrides */
    int nov;
    int N;
    int steps;                    /* STEPS: dt_trainer_step this often */
    mode mode;
    int kill_rank;
    char name[64];
    char dir[PATH_MAX];           /* the test's temporary directory (the parent's) */
    int port;
    rank_out *out;                /* (N) shared */
} zrun;

static void add(zrun *z, const char *ov) { z->ov[z->nov++] = ov; }

static zrun base(const char *config, int N, int zero, const char *name)
{
    zrun z;
    memset(&z, 0, sizeof z);
    z.config = config;
    z.N = N;
    z.steps = 4;
    z.kill_rank = -1;
    snprintf(z.name, sizeof z.name, "%s", name);
    add(&z, "job.device=cpu");
    add(&z, "train.threads=1");
    add(&z, "job.cpu_bind=none");
    add(&z, "checkpoint.resume=never");
    add(&z, "checkpoint.every=0");
    add(&z, "checkpoint.async=false");
    add(&z, "ddp.timeout=20");
    add(&z, fmt("parallel.zero=%d", zero));
    return z;
}

static void tiny_mlp(zrun *z)
{
    /* 64*13+13 + 13*7+7 + 7*10+10 = 1023 parameters: odd, 3 divides it, 2 and 4 do not */
    add(z, "model.hidden=13,7");
    add(z, "train.batch_size=4");
    add(z, "train.warmup_steps=1");
    add(z, "train.lr=0.01");
}

static void tiny_gpt(zrun *z)
{
    add(z, "model.n_layer=2");
    add(z, "model.n_head=2");
    add(z, "model.n_embd=16");
    add(z, "model.block_size=16");
    add(z, "data.seq_len=16");
    add(z, "train.batch_size=2");
    add(z, "train.warmup_steps=1");
}

static void tiny_llama(zrun *z)
{
    tiny_gpt(z);
    add(z, "model.n_head=4");
    add(z, "model.n_kv_head=2");
    add(z, "model.intermediate_size=24");
}

/* gpt's shape as bert with the NSP head, on the MLM samples of the same text. */
static void tiny_bert(zrun *z)
{
    tiny_gpt(z);
    add(z, "model.type=bert");
    add(z, "model.nsp=true");
}

static void tiny_resnet(zrun *z)
{
    add(z, "model.depth=8");
    add(z, "model.width=4");
    add(z, "data.synthetic_shape=3x8x8");
    add(z, "data.synthetic_samples=512");
    add(z, "train.batch_size=4");
    add(z, "train.warmup_steps=1");
}

/* Small buckets: several per model, tensors of every size between them. */
static void small_buckets(zrun *z)
{
    add(z, "ddp.first_bucket_mb=0.001");
    add(z, "ddp.bucket_cap_mb=0.004");
}

static void record_end(dt_trainer *t, rank_out *o)
{
    dt_strategy *s = t->s;
    dt_err err = {0};
    o->step = t->step;
    o->num_params = t->model->num_params;
    dt_strategy_get_mem(s, &o->mem);
    dt_mem_read(t->be, &o->alloc);
    o->have_stats = dt_strategy_sync_stats(s, &o->st) == 0;
    if (o->num_params > MAX_PER) {
        snprintf(o->msg, sizeof o->msg, "model of %zu parameters: raise MAX_PER", o->num_params);
        o->status = 2;
        return;
    }
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
    /* the parameters as a checkpoint takes them (stage 3's flat buffer holds none now) */
    for (int i = 0; i < n; i++)
        if (!strcmp(bufs[i].file, "model") && !bufs[i].copy_at_save &&
            bufs[i].numel == o->num_params)
            t->be->memcpy_d2h(t->be, o->params, bufs[i].data, o->num_params * sizeof(float));
    for (int i = 0; i < n; i++)
        if (!strcmp(bufs[i].file, "optim") && o->num_states < 2)
            t->be->memcpy_d2h(t->be, o->state[o->num_states++], bufs[i].data,
                              bufs[i].numel * sizeof(float));
}

/* KILL_IN_FORWARD: the victim's model hook, around the strategy's: it dies just before block 1's
 * forward window of the second step, so its peers are in (or about to issue) that block's
 * all-gather. */
static dt_block_hook_fn inner_hook;
static void *inner_ctx;
static int hook_step;
static void killing_hook(void *ctx, int block, dt_block_event ev)
{
    (void)ctx;
    if (hook_step == 1 && block == 1 && ev == DT_BLOCK_BEFORE_FORWARD)
        kill(getpid(), SIGKILL);
    inner_hook(inner_ctx, block, ev);
}

/* OVERFLOW_ON_ONE at stage 3: the last block (the classifier) x 1e30 in each of its windows. */
static dt_model *scaled_model;
static void scaling_hook(void *ctx, int block, dt_block_event ev)
{
    (void)ctx;
    inner_hook(inner_ctx, block, ev);
    dt_model *m = scaled_model;
    if (block != m->num_blocks - 1 ||
        (ev != DT_BLOCK_BEFORE_FORWARD && ev != DT_BLOCK_BEFORE_BACKWARD))
        return;
    const dt_block *b = &m->blocks[block];
    for (size_t i = 0; i < b->numel; i++)
        m->params[b->offset + i] *= 1e30f; /* cpu: backend memory is host memory */
}

static void rank_body(zrun *z, int rank)
{
    static dt_job job;
    static dt_trainer t;
    rank_out *o = &z->out[rank];
    dt_err err = {0};
    if (dt_test_trainer_start(&t, &job, z->config, z->ov, z->nov, z->dir, z->name, rank, z->N,
                              z->port, o->msg, sizeof o->msg) != 0) {
        o->status = 2;
        _exit(2);
    }
    dt_strlcpy(o->strategy, t.s->ops->name, sizeof o->strategy);
    if (z->mode == OVERFLOW_ON_ONE && rank == z->kill_rank &&
        job.zero == 3) {
        /* stage 3: the flat buffer holds a block only inside its windows: scale the
         * classifier there, each time it is gathered (stage 2's reducer has a block hook as
         * well, but its parameters persist: scaled once, below) */
        inner_hook = t.model->block_hook;
        inner_ctx = t.model->block_hook_ctx;
        scaled_model = t.model;
        dt_model_set_block_hook(t.model, scaling_hook, NULL);
    } else if (z->mode == OVERFLOW_ON_ONE && rank == z->kill_rank) {
        /* this rank's classifier x 1e30: its gradients times the loss scale overflow, the
         * others' do not */
        dt_model *m = t.model;
        const dt_tensor_info *w = NULL;
        for (int i = 0; i < m->num_tensors; i++)
            if (m->tensors[i].ndim == 2)
                w = &m->tensors[i];
        float *h = malloc(w->numel * sizeof *h);
        t.be->memcpy_d2h(t.be, h, m->params + w->offset, w->numel * sizeof *h);
        for (size_t i = 0; i < w->numel; i++)
            h[i] *= 1e30f;
        t.be->memcpy_h2d(t.be, m->params + w->offset, h, w->numel * sizeof *h);
        free(h);
    }
    if (z->mode == KILL_IN_FORWARD && rank == z->kill_rank) {
        inner_hook = t.model->block_hook;
        inner_ctx = t.model->block_hook_ctx;
        DT_REQUIRE(inner_hook);
        dt_model_set_block_hook(t.model, killing_hook, NULL);
    }
    if (z->mode == EVAL) {
        for (int k = 0; k < z->steps; k++)
            if (dt_trainer_step(&t, &err) != 0)
                goto fail;
        if (dt_trainer_eval(&t, &o->eval_loss, &o->eval_acc, &err) != 0)
            goto fail;
    } else if (z->mode == RUN) {
        if (dt_trainer_run(&t, NULL, &err) != 0)
            goto fail;
    } else if (z->mode == KILL_IN_GATHER) {
        /* one step through the strategy's ops; the victim dies between the gradients'
         * reduce-scatter and the parameters' all-gather */
        dt_strategy *s = t.s;
        if (dt_trainer_step(&t, &err) != 0)
            goto fail;
        s->ops->zero_grads(s);
        if (dt_sampler_next(&t.sampler, t.idx, &err) != 0 ||
            dt_dataset_fill(t.data->train, t.idx, t.batch, &t.batch_buf, &err) != 0)
            goto fail;
        float loss;
        double norm;
        if (s->ops->micro_step(s, &t.batch_buf.batch, 1.0f, true, &loss, &err) != 0 ||
            s->ops->sync_grads(s, &err) != 0 || s->ops->clip(s, 1.0, &norm, &err) != 0)
            goto fail;
        if (rank == z->kill_rank)
            kill(getpid(), SIGKILL);
        if (s->ops->optim_step(s, 1e-3, &err) != 0)
            goto fail;
    } else {
        for (int k = 0; k < z->steps; k++) {
            if (z->mode == KILL_BETWEEN_STEPS && rank == z->kill_rank && k == 1)
                kill(getpid(), SIGKILL);
            hook_step = k;
            if (dt_trainer_step(&t, &err) != 0)
                goto fail;
            if (k < MAX_STEPS) {
                o->loss[k] = t.loss;
                o->norm[k] = t.grad_norm;
            }
        }
    }
    o->skipped = t.scaler.skipped;
    o->optim_t = t.optim->t;
    o->scale = t.scaler.scale;
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
static void run(zrun *z, int *status)
{
    DT_REQUIRE(z->N <= MAX_RANKS && z->steps <= MAX_STEPS);
    z->out = dt_test_shared_map(sizeof(rank_out) * (size_t)z->N);
    dt_strlcpy(z->dir, dt_test_tmpdir(), sizeof z->dir); /* made here, not in each child */
    dt_test_run_ranks(z->name, z->N, &z->port, run_rank, z, 150, status);
}

static void unmap(zrun *z)
{
    dt_test_shared_unmap(z->out, sizeof(rank_out) * (size_t)z->N);
    z->out = NULL;
}

/* Every rank exited 0; the message of the first that did not. */
static bool all_ok(const zrun *z, const int *status)
{
    return dt_test_ranks_ok(z->name, status, z->N, z->out[0].msg, sizeof(rank_out));
}

static size_t first_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0)
            return i;
    return n;
}

/* What compare_with_ddp's last run at a stage 1-2 measured on its rank 0 (its strategy's and
 * its allocator's memory figures, and its parameter count), for a test that checks them too. */
static rank_out last_zero;

/* Runs the job at stage `zero` and at stage 0 (DDP) and compares them: the strategy each
 * picked, every step's loss, the final parameters and optimiser state (bit for bit), every rank
 * against rank 0, and the gradient norm (bit for bit when norm_exact, else within 1e-12
 * relative). */
static void compare_with_ddp(const char *what, int zero, int N, void (*setup)(zrun *),
                             const char *const *more, bool norm_exact)
{
    const char *config = !strcmp(what, "gpt") || !strcmp(what, "bert") ? "quickstart.ini"
                         : !strcmp(what, "llama")                        ? "llama.ini"
                         : !strcmp(what, "resnet")                       ? "resnet.ini"
                                                                         : "mlp.ini";
    zrun zr = base(config, N, zero, fmt("%s-z%d-n%d", what, zero, N));
    zrun dd = base(config, N, 0, fmt("%s-ddp-n%d", what, N));
    setup(&zr);
    setup(&dd);
    if (zero == 3) /* the issue's acceptance: 50 steps */
        zr.steps = dd.steps = Z3_STEPS;
    for (; more && *more; more++) {
        add(&zr, *more);
        add(&dd, *more);
    }
    int sz[MAX_RANKS], sd[MAX_RANKS];
    run(&zr, sz);
    run(&dd, sd);
    if (all_ok(&zr, sz) && all_ok(&dd, sd)) {
        const rank_out *a = &zr.out[0], *b = &dd.out[0];
        DT_CHECK_STR(a->strategy, "zero");
        DT_CHECK_STR(b->strategy, "ddp");
        DT_CHECK_INT(a->num_params, b->num_params);
        DT_CHECK_INT(a->num_states, b->num_states);
        DT_CHECK(a->num_states >= 1);
        DT_CHECK_INT(a->step, zr.steps);
        printf("    %-22s %zu parameters, loss %.6f -> %.6f, norm %.6g -> %.6g, norm %s DDP's\n",
               zr.name, a->num_params, a->loss[0], a->loss[zr.steps - 1], a->norm[0],
               a->norm[zr.steps - 1], memcmp(a->norm, b->norm, sizeof a->norm) ? "differs from"
                                                                           : "bit for bit");
        for (int k = 0; k < zr.steps; k++) {
            DT_CHECK_MSG(a->loss[k] == b->loss[k], "%s: step %d loss %.17g vs DDP %.17g",
                         zr.name, k + 1, a->loss[k], b->loss[k]);
            double rel = fabs(a->norm[k] - b->norm[k]) / fmax(fabs(b->norm[k]), 1e-30);
            DT_CHECK_MSG(norm_exact ? a->norm[k] == b->norm[k] : rel <= 1e-12,
                         "%s: step %d grad norm %.17g vs DDP %.17g", zr.name, k + 1, a->norm[k],
                         b->norm[k]);
        }
        size_t n = a->num_params;
        size_t d = first_diff(a->params, b->params, n);
        DT_CHECK_MSG(d == n, "%s: parameter %zu of %zu: %.9g vs DDP %.9g", zr.name, d, n,
                     (double)a->params[d < n ? d : 0], (double)b->params[d < n ? d : 0]);
        for (int i = 0; i < a->num_states && i < b->num_states; i++) {
            d = first_diff(a->state[i], b->state[i], n);
            DT_CHECK_MSG(d == n, "%s: optimiser state %d, element %zu of %zu: %.9g vs DDP %.9g",
                         zr.name, i, d, n, (double)a->state[i][d < n ? d : 0],
                         (double)b->state[i][d < n ? d : 0]);
        }
        /* a save gathers what ZeRO shards on rank 0 only (the writer of a whole-tensor
         * checkpoint; test_dpsync checks every rank's pieces against that gather): at stages
         * 1-2 every rank still holds the parameters whole */
        for (int r = 1; r < N && zero < 3; r++)
            DT_CHECK_MSG(first_diff(zr.out[r].params, a->params, n) == n,
                         "%s: rank %d's parameters differ from rank 0's", zr.name, r);
        /* the buckets went out from backward (overlapped), and were rebuilt from the ready
         * order after the first step (the optimiser state moved with the shards) */
        DT_CHECK(a->have_stats == (zero < 3));
        if (zero < 3) {
            DT_CHECK_MSG(a->st.launched_late == 0 && a->st.launched_early == a->st.bucket_syncs,
                         "%s: %llu buckets launched after backward, %llu from it, %llu due",
                         zr.name, (unsigned long long)a->st.launched_late,
                         (unsigned long long)a->st.launched_early,
                         (unsigned long long)a->st.bucket_syncs);
            DT_CHECK_MSG(a->st.rebuilt, "%s: the buckets were not rebuilt", zr.name);
        }
        if (zero == 3) {
            /* every gather after the first step came from a prefetch, except each forward's
             * first window (nothing runs before it); the backward's first is forward's last */
            const dt_strategy_mem *m3 = &a->mem;
            DT_CHECK_MSG(m3->gathers_sync == m3->windows + m3->forwards - 1 &&
                             m3->gathers_prefetched > 0,
                         "%s: %llu gathers waited for at once, %llu prefetched, %llu windows, "
                         "%llu forwards", zr.name, (unsigned long long)m3->gathers_sync,
                         (unsigned long long)m3->gathers_prefetched,
                         (unsigned long long)m3->windows, (unsigned long long)m3->forwards);
        }
        /* the shards held: 1/N of the state (plus at most N-1 padding per bucket) */
        const dt_strategy_mem *m = &a->mem;
        DT_CHECK_INT(m->zero_stage, zero);
        DT_CHECK_MSG(m->optim * N >= b->mem.optim && m->optim * N < b->mem.optim * 11 / 10,
                     "%s: optimiser state %zu bytes per rank, DDP %zu", zr.name, m->optim,
                     b->mem.optim);
        if (zero < 3)
            memcpy(&last_zero, a, offsetof(rank_out, params));
    }
    unmap(&zr);
    unmap(&dd);
}

static void test_mlp_stages(void)
{
    for (int zero = 1; zero <= 2; zero++)
        for (int N = 2; N <= 4; N++) {
            compare_with_ddp("mlp", zero, N, tiny_mlp, NULL, false);
            const char *const buckets[] = {"ddp.first_bucket_mb=0.001", "ddp.bucket_cap_mb=0.004",
                                           NULL};
            compare_with_ddp("mlp", zero, N, tiny_mlp, buckets, false);
        }
}

static void test_gpt_stages(void)
{
    const char *const buckets[] = {"ddp.first_bucket_mb=0.002", "ddp.bucket_cap_mb=0.01", NULL};
    for (int zero = 1; zero <= 2; zero++)
        for (int N = 2; N <= 4; N++)
            compare_with_ddp("gpt", zero, N, tiny_gpt, buckets, false);
}

/* llama: stages 1 and 2 at 2 and 3 ranks with small buckets, stage 3 at 2 and 3 ranks, with
 * selective recompute and accumulation too, each bit for bit DDP's. */
static void test_llama_stages(void)
{
    const char *const buckets[] = {"ddp.first_bucket_mb=0.002", "ddp.bucket_cap_mb=0.01", NULL};
    const char *const rec[] = {"train.recompute=selective", "train.grad_accum=2", NULL};
    for (int N = 2; N <= 3; N++) {
        compare_with_ddp("llama", 1, N, tiny_llama, buckets, false);
        compare_with_ddp("llama", 2, N, tiny_llama, buckets, false);
        compare_with_ddp("llama", 3, N, tiny_llama, NULL, false);
    }
    compare_with_ddp("llama", 3, 2, tiny_llama, rec, false);
}

/* bert: stages 1 and 2 on 2 to 4 ranks, stage 3 (with recompute = selective on 3) against DDP,
 * bit for bit. */
static void test_bert_stages(void)
{
    const char *const buckets[] = {"ddp.first_bucket_mb=0.002", "ddp.bucket_cap_mb=0.01", NULL};
    const char *const sel[] = {"train.recompute=selective", NULL};
    for (int zero = 1; zero <= 2; zero++)
        for (int N = 2; N <= 4; N++)
            compare_with_ddp("bert", zero, N, tiny_bert, buckets, false);
    compare_with_ddp("bert", 3, 2, tiny_bert, NULL, false);
    compare_with_ddp("bert", 3, 3, tiny_bert, sel, false);
}

static void test_resnet_stages(void)
{
    const char *const buckets[] = {"ddp.first_bucket_mb=0.002", "ddp.bucket_cap_mb=0.01", NULL};
    for (int zero = 1; zero <= 2; zero++)
        for (int N = 2; N <= 4; N += 1)
            compare_with_ddp("resnet", zero, N, tiny_resnet, buckets, false);
}

/* grad_clip active (mlp.ini's 1.0 against a tiny lr-high model: checked to clip), fp16 loss
 * scaling, grad_accum = 2, compress = bf16 and fp16, SGD with momentum. */
static void test_options(void)
{
    const char *const clip[] = {"train.grad_clip=0.05", NULL};
    const char *const fp16[] = {"train.precision=fp16", NULL};
    const char *const accum[] = {"train.grad_accum=2", NULL};
    const char *const bf16[] = {"ddp.compress=bf16", "ddp.first_bucket_mb=0.001",
                                "ddp.bucket_cap_mb=0.004", NULL};
    const char *const f16[] = {"ddp.compress=fp16", NULL};
    const char *const sgd[] = {"train.optimizer=sgd", "train.momentum=0.9", "train.nesterov=true",
                               NULL};
    for (int zero = 1; zero <= 2; zero++) {
        compare_with_ddp("mlp", zero, 3, tiny_mlp, clip, false);
        compare_with_ddp("mlp", zero, 2, tiny_mlp, fp16, false);
        compare_with_ddp("mlp", zero, 4, tiny_mlp, accum, false);
        compare_with_ddp("gpt", zero, 3, tiny_gpt, bf16, false);
        compare_with_ddp("mlp", zero, 3, tiny_mlp, f16, false);
        compare_with_ddp("mlp", zero, 3, tiny_mlp, sgd, false);
    }
}

/* Stage 2 where memory goes back in granules of 64 KiB (DTRAIN_CPU_MEM_GRANULE, for the ranks: a
 * coarser unit than the page, as cuda's 2 MiB granules are for bigger models): 13 Linear layers,
 * 11 of 192 x 192 (148 KB each, about 2.3 granules), a bucket each, plain and with fp16
 * payloads. Bit for bit DDP's, and the gradients resident at their peak (the allocator's count,
 * and the strategy's) stay well below the whole buffer, though only the granules wholly inside
 * reduced buckets go back: about two buckets are in flight besides the layer backward computes,
 * and each block is committed (and zeroed) before backward writes it. */
static void granule_mlp(zrun *z)
{
    add(z, "model.hidden=192,192,192,192,192,192,192,192,192,192,192,192");
    add(z, "train.batch_size=4");
    add(z, "train.warmup_steps=1");
    add(z, "train.lr=0.001");
    add(z, "ddp.first_bucket_mb=0.15");
    add(z, "ddp.bucket_cap_mb=0.15");
}

static void test_stage2_coarse_granule(void)
{
    DT_REQUIRE(setenv("DTRAIN_CPU_MEM_GRANULE", "65536", 1) == 0); /* inherited by the ranks */
    const char *const plain[] = {NULL};
    const char *const f16[] = {"ddp.compress=fp16", NULL};
    const char *const *runs[2] = {plain, f16};
    for (int k = 0; k < 2; k++) {
        memset(&last_zero, 0, sizeof last_zero);
        compare_with_ddp("mlp", 2, 2, granule_mlp, runs[k], false);
        const rank_out *o = &last_zero;
        size_t P = o->num_params * sizeof(float), shard = o->st.shard_numel * sizeof(float);
        size_t pay = k ? o->num_params * sizeof(uint16_t) : 0; /* the 16-bit payloads, whole */
        DT_REQUIRE(o->num_params > 400000);
        const dt_strategy_mem *m = &o->mem;
        size_t g = o->alloc.peak[DT_MEM_GRADS];
        printf("    granule 64 KiB%s: gradient buffer %zu bytes, shard %zu; resident at the peak "
               "%zu (the allocator's: %zu), after the step %zu\n", k ? ", fp16 payloads" : "",
               P, shard, m->grads_peak - shard, g - shard, m->grads - shard);
        DT_CHECK_MSG(g > shard && g - shard < P * 60 / 100,
                     "the allocator's gradient peak %zu: %zu resident of the %zu-byte buffer", g,
                     g - shard, P);
        DT_CHECK_MSG(m->grads_peak >= m->grads && m->grads_peak - shard < (P + pay) * 60 / 100,
                     "stage 2 grads peak %zu: %zu resident of the %zu-byte buffers",
                     m->grads_peak, m->grads_peak - shard, P + pay);
        DT_CHECK_MSG(m->grads - shard < 2 * 65536, "after the step %zu bytes resident besides "
                     "the shard (at most the buffer's partial granules at its ends)",
                     m->grads - shard);
        if (k == 1) /* the payloads went back with the gradients (the 16-bit shard stays) */
            DT_CHECK_MSG(m->comm - o->st.shard_numel * sizeof(uint16_t) < 2 * 65536,
                         "the 16-bit payloads held after the step %zu bytes (whole: %zu)",
                         m->comm - o->st.shard_numel * sizeof(uint16_t), pay);
    }
    unsetenv("DTRAIN_CPU_MEM_GRANULE");
}

/* Stage 3 against DDP over 50 steps: mlp (1023 parameters: 2 and 4 do not divide it), gpt and
 * resnet, at 2, 3 and 4 ranks. */
static void test_stage3_models(void)
{
    for (int N = 2; N <= 4; N++) {
        compare_with_ddp("mlp", 3, N, tiny_mlp, NULL, false);
        compare_with_ddp("gpt", 3, N, tiny_gpt, NULL, false);
        compare_with_ddp("resnet", 3, N, tiny_resnet, NULL, false);
    }
}

/* Stage 3 with clipping, fp16 loss scaling, grad_accum = 2, compress, SGD, recompute,
 * SyncBatchNorm. */
static void test_stage3_options(void)
{
    const char *const clip[] = {"train.grad_clip=0.05", NULL};
    const char *const fp16[] = {"train.precision=fp16", NULL};
    const char *const accum[] = {"train.grad_accum=2", NULL};
    const char *const bf16[] = {"ddp.compress=bf16", NULL};
    const char *const f16[] = {"ddp.compress=fp16", NULL};
    const char *const sgd[] = {"train.optimizer=sgd", "train.momentum=0.9", "train.nesterov=true",
                               NULL};
    const char *const rec[] = {"train.recompute=block", NULL};
    compare_with_ddp("mlp", 3, 3, tiny_mlp, clip, false);
    compare_with_ddp("gpt", 3, 2, tiny_gpt, clip, false);
    compare_with_ddp("mlp", 3, 2, tiny_mlp, fp16, false);
    compare_with_ddp("gpt", 3, 3, tiny_gpt, fp16, false);
    compare_with_ddp("mlp", 3, 4, tiny_mlp, accum, false);
    compare_with_ddp("gpt", 3, 3, tiny_gpt, accum, false);
    compare_with_ddp("resnet", 3, 2, tiny_resnet, accum, false);
    compare_with_ddp("gpt", 3, 3, tiny_gpt, bf16, false);
    compare_with_ddp("mlp", 3, 3, tiny_mlp, f16, false);
    compare_with_ddp("mlp", 3, 3, tiny_mlp, sgd, false);
    const char *const sbn[] = {"model.sync_bn=true", NULL};
    compare_with_ddp("gpt", 3, 2, tiny_gpt, rec, false);
    compare_with_ddp("resnet", 3, 3, tiny_resnet, rec, false);
    /* SyncBatchNorm's collectives inside the windows, among the prefetched gathers */
    compare_with_ddp("resnet", 3, 3, tiny_resnet, sbn, false);
}

/* The clipping test above must clip: the norms it compares are above grad_clip. */
static void test_clip_is_active(void)
{
    zrun z = base("mlp.ini", 2, 1, "clip-active");
    tiny_mlp(&z);
    add(&z, "train.grad_clip=0.05");
    int st[MAX_RANKS];
    run(&z, st);
    if (all_ok(&z, st))
        for (int k = 0; k < z.steps; k++)
            DT_CHECK_MSG(z.out[0].norm[k] > 0.05, "step %d: norm %g does not clip", k + 1,
                         z.out[0].norm[k]);
    unmap(&z);
}

/* ---- checkpoints across stages and world sizes --------------------------------------------- */

/* Trains `steps` with dt_trainer_run (which saves at the end) and returns rank 0's output. */
static void train_run(zrun *z, int steps, const char *resume)
{
    add(z, fmt("train.steps=%d", steps));
    add(z, "train.eval_every=0");
    add(z, "data.val_fraction=0");
    if (resume) {
        z->ov[3] = fmt("checkpoint.resume=%s", resume); /* replaces base's resume=never */
    }
    z->mode = RUN;
    int st[MAX_RANKS];
    run(z, st);
    all_ok(z, st);
}

static const char *ckpt_of(const zrun *z, int step)
{
    return fmt("%s/%s/checkpoints/step_%d", dt_test_tmpdir(), z->name, step);
}

static bool same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    bool same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb)
            same = false;
        if (ca == EOF || cb == EOF)
            break;
    }
    if (fa)
        fclose(fa);
    if (fb)
        fclose(fb);
    return same;
}

static void check_same_params(const zrun *a, const zrun *b)
{
    size_t n = a->out[0].num_params;
    DT_CHECK_INT(a->out[0].num_params, b->out[0].num_params);
    DT_CHECK_INT(a->out[0].step, b->out[0].step);
    size_t d = first_diff(a->out[0].params, b->out[0].params, n);
    DT_CHECK_MSG(d == n, "%s vs %s: parameter %zu of %zu differs", a->name, b->name, d, n);
    for (int i = 0; i < a->out[0].num_states; i++)
        DT_CHECK_MSG(first_diff(a->out[0].state[i], b->out[0].state[i], n) == n,
                     "%s vs %s: optimiser state %d differs", a->name, b->name, i);
}

static void test_resume_across_stages(void)
{
    /* A checkpoint written at stage 1 on 2 ranks is the one DDP writes on 2 ranks, file for
     * file (whole tensors, same names, same bits)... */
    zrun z1 = base("mlp.ini", 2, 1, "ck-z1-n2"), d0 = base("mlp.ini", 2, 0, "ck-ddp-n2");
    tiny_mlp(&z1);
    tiny_mlp(&d0);
    small_buckets(&z1);
    train_run(&z1, 3, NULL);
    train_run(&d0, 3, NULL);
    DT_CHECK_STR(z1.out[0].strategy, "zero");
    for (int f = 0; f < 2; f++) {
        const char *file = f ? "optim.safetensors" : "model.safetensors";
        DT_CHECK_MSG(same_file(fmt("%s/%s", ckpt_of(&z1, 3), file),
                               fmt("%s/%s", ckpt_of(&d0, 3), file)),
                     "%s of ZeRO-1 and DDP differ", file);
    }
    /* ... so it resumes at stage 0 on 1 rank exactly as DDP's does */
    zrun a = base("mlp.ini", 1, 0, "ck-z1-to-single"), b = base("mlp.ini", 1, 0, "ck-ddp-to-single");
    tiny_mlp(&a);
    tiny_mlp(&b);
    train_run(&a, 5, ckpt_of(&z1, 3));
    train_run(&b, 5, ckpt_of(&d0, 3));
    DT_CHECK_STR(a.out[0].strategy, "single");
    DT_CHECK_INT(a.out[0].step, 5);
    check_same_params(&a, &b);
    /* The reverse: one process's checkpoint resumed at stage 1 on 2 ranks, and at stage 2 on 3,
     * equals DDP resuming it on as many ranks. */
    zrun s = base("mlp.ini", 1, 0, "ck-single");
    tiny_mlp(&s);
    train_run(&s, 3, NULL);
    const int stage[2] = {1, 2}, ranks[2] = {2, 3};
    for (int k = 0; k < 2; k++) {
        zrun zz = base("mlp.ini", ranks[k], stage[k], fmt("ck-single-to-z%d", stage[k]));
        zrun dd = base("mlp.ini", ranks[k], 0, fmt("ck-single-to-ddp%d", ranks[k]));
        tiny_mlp(&zz);
        tiny_mlp(&dd);
        small_buckets(&zz);
        train_run(&zz, 5, ckpt_of(&s, 3));
        train_run(&dd, 5, ckpt_of(&s, 3));
        DT_CHECK_STR(zz.out[0].strategy, "zero");
        DT_CHECK_INT(zz.out[0].step, 5);
        check_same_params(&zz, &dd);
        unmap(&zz);
        unmap(&dd);
    }
    /* and stage 1 on 2 ranks resumed at stage 2 on 3 ranks equals DDP on 3 ranks */
    zrun e = base("mlp.ini", 3, 2, "ck-z1-to-z2"), f = base("mlp.ini", 3, 0, "ck-z1-to-ddp3");
    tiny_mlp(&e);
    tiny_mlp(&f);
    train_run(&e, 5, ckpt_of(&z1, 3));
    train_run(&f, 5, ckpt_of(&z1, 3));
    check_same_params(&e, &f);
    unmap(&z1);
    unmap(&d0);
    unmap(&a);
    unmap(&b);
    unmap(&s);
    unmap(&e);
    unmap(&f);
}

/* Stage 3: its checkpoint is DDP's file for file (mlp on 3 ranks, gpt on 4), resumes at stage 0
 * on 1 rank and at stage 1 on 2; one process's resumes at stage 3 on 4 ranks, stage 1's (2
 * ranks) at stage 3 on 3, each as DDP resuming it. */
static void test_stage3_resume(void)
{
    const char *cfg[2] = {"mlp.ini", "quickstart.ini"};
    void (*setup[2])(zrun *) = {tiny_mlp, tiny_gpt};
    const int ranks[2] = {3, 4};
    for (int m = 0; m < 2; m++) {
        zrun z3 = base(cfg[m], ranks[m], 3, fmt("ck3-z3-%d", m));
        zrun d0 = base(cfg[m], ranks[m], 0, fmt("ck3-ddp-%d", m));
        setup[m](&z3);
        setup[m](&d0);
        train_run(&z3, 3, NULL);
        train_run(&d0, 3, NULL);
        DT_CHECK_STR(z3.out[0].strategy, "zero");
        for (int f = 0; f < 2; f++) {
            const char *file = f ? "optim.safetensors" : "model.safetensors";
            DT_CHECK_MSG(same_file(fmt("%s/%s", ckpt_of(&z3, 3), file),
                                   fmt("%s/%s", ckpt_of(&d0, 3), file)),
                         "%s of ZeRO-3 and DDP differ (%s)", file, cfg[m]);
        }
        /* resumed on 1 rank (stage 0) and at stage 1 on 2 ranks, against DDP's checkpoint */
        const int to_n[2] = {1, 2}, to_z[2] = {0, 1};
        for (int k = 0; k < 2; k++) {
            zrun a = base(cfg[m], to_n[k], to_z[k], fmt("ck3-z3-to-%d-%d", k, m));
            zrun b = base(cfg[m], to_n[k], to_z[k], fmt("ck3-ddp-to-%d-%d", k, m));
            setup[m](&a);
            setup[m](&b);
            train_run(&a, 5, ckpt_of(&z3, 3));
            train_run(&b, 5, ckpt_of(&d0, 3));
            DT_CHECK_INT(a.out[0].step, 5);
            check_same_params(&a, &b);
            unmap(&a);
            unmap(&b);
        }
        unmap(&z3);
        unmap(&d0);
    }
    /* the reverse: one process's checkpoint at stage 3 on 4 ranks; stage 1's (2 ranks) on 3 */
    zrun s = base("mlp.ini", 1, 0, "ck3-single"), z1 = base("mlp.ini", 2, 1, "ck3-z1");
    tiny_mlp(&s);
    tiny_mlp(&z1);
    train_run(&s, 3, NULL);
    train_run(&z1, 3, NULL);
    const zrun *src[2] = {&s, &z1};
    const int n3[2] = {4, 3};
    for (int k = 0; k < 2; k++) {
        zrun a = base("mlp.ini", n3[k], 3, fmt("ck3-to-z3-%d", k));
        zrun b = base("mlp.ini", n3[k], 0, fmt("ck3-to-ddp-%d", k));
        tiny_mlp(&a);
        tiny_mlp(&b);
        train_run(&a, 5, ckpt_of(src[k], 3));
        train_run(&b, 5, ckpt_of(src[k], 3));
        DT_CHECK_STR(a.out[0].strategy, "zero");
        DT_CHECK_INT(a.out[0].step, 5);
        check_same_params(&a, &b); /* rank 0's gather (the others keep none: stage 3) */
        unmap(&a);
        unmap(&b);
    }
    unmap(&s);
    unmap(&z1);
}

/* ---- failures ------------------------------------------------------------------------------ */

static void check_killed(zrun *z, const int *st, const char *coll, double took)
{
    DT_CHECK(WIFSIGNALED(st[z->kill_rank]) && WTERMSIG(st[z->kill_rank]) == SIGKILL);
    for (int r = 0; r < z->N; r++) {
        if (r == z->kill_rank)
            continue;
        DT_CHECK_MSG(WIFEXITED(st[r]) && WEXITSTATUS(st[r]) == 2, "rank %d: status %d", r, st[r]);
        DT_CHECK_CONTAINS(z->out[r].msg, coll);
        DT_CHECK_CONTAINS(z->out[r].msg, fmt("rank %d", z->kill_rank));
    }
    DT_CHECK_MSG(took < 15, "the survivors took %.1f s to notice", took);
}

static void test_killed_rank(void)
{
    for (int zero = 1; zero <= 2; zero++) {
        /* dies before a step: the others fail in the gradients' reduce-scatter */
        zrun a = base("mlp.ini", 3, zero, fmt("kill-scatter-z%d", zero));
        tiny_mlp(&a);
        a.mode = KILL_BETWEEN_STEPS;
        a.kill_rank = 2;
        int st[MAX_RANKS];
        uint64_t t0 = dt_now_ns();
        run(&a, st);
        check_killed(&a, st, "reduce_scatter #", (double)(dt_now_ns() - t0) / 1e9);
        unmap(&a);
        /* dies after the reduce-scatter: the others fail in the parameters' all-gather */
        zrun b = base("mlp.ini", 3, zero, fmt("kill-gather-z%d", zero));
        tiny_mlp(&b);
        b.mode = KILL_IN_GATHER;
        b.kill_rank = 1;
        t0 = dt_now_ns();
        run(&b, st);
        check_killed(&b, st, "allgather #", (double)(dt_now_ns() - t0) / 1e9);
        for (int r = 0; r < 3; r += 2)
            DT_CHECK_CONTAINS(b.out[r].msg, "gathering the updated parameters");
        unmap(&b);
    }
}

/* Stage 3: a rank that dies as block 1's forward begins (its peers in that block's gather, or
 * about to issue the next one) fails the step on every other rank with the collective and the
 * rank named, within ddp.timeout; one that dies between steps fails the first gather. */
static void test_stage3_killed_rank(void)
{
    const char *cfg[2] = {"mlp.ini", "quickstart.ini"};
    void (*setup[2])(zrun *) = {tiny_mlp, tiny_gpt};
    for (int m = 0; m < 2; m++) {
        zrun a = base(cfg[m], 3, 3, fmt("kill-forward-z3-%d", m));
        setup[m](&a);
        a.mode = KILL_IN_FORWARD;
        a.kill_rank = 1;
        int st[MAX_RANKS];
        uint64_t t0 = dt_now_ns();
        run(&a, st);
        check_killed(&a, st, "allgather #", (double)(dt_now_ns() - t0) / 1e9);
        for (int r = 0; r < 3; r += 2)
            DT_CHECK_CONTAINS(a.out[r].msg, "ZeRO-3: ");
        printf("    %s: rank 0 said: %.300s\n", a.name, a.out[0].msg);
        unmap(&a);
    }
    zrun b = base("mlp.ini", 4, 3, "kill-between-z3");
    tiny_mlp(&b);
    b.mode = KILL_BETWEEN_STEPS;
    b.kill_rank = 3;
    int st[MAX_RANKS];
    uint64_t t0 = dt_now_ns();
    run(&b, st);
    check_killed(&b, st, "allgather #", (double)(dt_now_ns() - t0) / 1e9);
    DT_CHECK_CONTAINS(b.out[0].msg, "before its forward) the parameters of fc.0");
    unmap(&b);
}

/* Stage 3 evaluation: forward windows only, every rank running as many forwards even when the
 * validation set leaves some ranks without samples in the last batch; equals DDP's. */
static void test_stage3_eval(void)
{
    const char *cfg[3] = {"mlp.ini", "quickstart.ini", "resnet.ini"};
    void (*setup[3])(zrun *) = {tiny_mlp, tiny_gpt, tiny_resnet};
    for (int m = 0; m < 3; m++) {
        zrun z = base(cfg[m], 3, 3, fmt("eval-z3-%d", m)), d = base(cfg[m], 3, 0, fmt("eval-ddp-%d", m));
        zrun *both[2] = {&z, &d};
        for (int k = 0; k < 2; k++) {
            setup[m](both[k]);
            add(both[k], "train.eval_batches=1000");
            if (m != 1) /* 10% of 490: 49 = 4 batches of 3 x 4 + 1: ranks 1 and 2 run out */
                add(both[k], "data.synthetic_samples=490");
            both[k]->mode = EVAL;
            both[k]->steps = 3;
            int st[MAX_RANKS];
            run(both[k], st);
            all_ok(both[k], st);
        }
        printf("    %s: eval loss %.9g (DDP %.9g), accuracy %g (DDP %g)\n", z.name,
               z.out[0].eval_loss, d.out[0].eval_loss, z.out[0].eval_acc, d.out[0].eval_acc);
        DT_CHECK_MSG(isfinite(z.out[0].eval_loss) && z.out[0].eval_loss == d.out[0].eval_loss,
                     "%s: eval loss %.17g vs DDP %.17g", z.name, z.out[0].eval_loss,
                     d.out[0].eval_loss);
        DT_CHECK(z.out[0].eval_acc == d.out[0].eval_acc);
        for (int r = 1; r < 3; r++)
            DT_CHECK(z.out[r].eval_loss == z.out[0].eval_loss);
        unmap(&z);
        unmap(&d);
    }
}

/* fp16: an overflow in one rank's gradients skips the step on every rank */
static void test_overflow_skips_everywhere(void)
{
    for (int zero = 1; zero <= 3; zero++) {
        zrun z = base("mlp.ini", 3, zero, fmt("overflow-z%d", zero));
        tiny_mlp(&z);
        add(&z, "train.precision=fp16");
        add(&z, "train.loss_scale=1e12");
        z.mode = OVERFLOW_ON_ONE;
        z.kill_rank = 1;
        z.steps = 1;
        int st[MAX_RANKS];
        run(&z, st);
        if (all_ok(&z, st))
            for (int r = 0; r < 3; r++) {
                DT_CHECK_MSG(z.out[r].skipped == 1 && z.out[r].optim_t == 0 &&
                                 z.out[r].scale == 5e11,
                             "zero %d rank %d: %lld skipped, t %lld, scale %g", zero, r,
                             (long long)z.out[r].skipped, (long long)z.out[r].optim_t,
                             z.out[r].scale);
                DT_CHECK_MSG(!isfinite(z.out[r].norm[0]), "rank %d: norm %g", r, z.out[r].norm[0]);
            }
        unmap(&z);
    }
}

/* ---- configuration -------------------------------------------------------------------------- */

static void test_config_errors(void)
{
    static dt_job job;
    dt_config_errors errs = {0};
    dt_err err = {0};
    char *dp[] = {"job.strategy=dp", "parallel.zero=1"};
    DT_CHECK(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), dp, 2, &errs, &err) != 0);
    DT_CHECK(errs.count >= 1);
    DT_CHECK_CONTAINS(errs.lines[0], "parallel.zero = 1");
    DT_CHECK_CONTAINS(errs.lines[0], "job.strategy = ddp");
    memset(&errs, 0, sizeof errs);
    char *z3[] = {"parallel.zero=3"};
    DT_CHECK(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), z3, 1, &errs, &err) == 0);
    DT_CHECK_INT(job.zero, 3);
    /* stage 3 gathers in every micro-step: a global batch's unequal micro-steps would not meet */
    memset(&errs, 0, sizeof errs);
    char *z3g[] = {"parallel.zero=3", "train.global_batch=64"};
    DT_CHECK(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), z3g, 2, &errs, &err) != 0);
    DT_CHECK(errs.count >= 1);
    DT_CHECK_CONTAINS(errs.lines[0], "parallel.zero = 3");
    DT_CHECK_CONTAINS(errs.lines[0], "train.global_batch");
    memset(&errs, 0, sizeof errs);
    char *z4[] = {"parallel.zero=4"};
    DT_CHECK(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), z4, 1, &errs, &err) != 0);
    DT_CHECK_CONTAINS(errs.lines[0], "parallel.zero");
    /* one rank: plain single */
    memset(&errs, 0, sizeof errs);
    char *z1[] = {"parallel.zero=2"};
    DT_REQUIRE(dt_job_load(&job, fmt("%s/configs/mlp.ini", repo_dir()), z1, 1, &errs, &err) == 0);
    DT_CHECK_INT(job.zero, 2);
}

/* ---- memory ---------------------------------------------------------------------------------- */

/* What each stage holds on 2 ranks, measured: optimiser state 1/N of DDP's (within 2%), stage
 * 2's gradients given back after the step and, during it, well under the whole buffer. */
static void test_memory(void)
{
    zrun z[3];
    int st[MAX_RANKS];
    const char *gr = getenv("DTRAIN_CPU_MEM_GRANULE");
    if (gr && *gr && strtoull(gr, NULL, 10) > (unsigned long long)sysconf(_SC_PAGESIZE))
        DT_SKIP("sized for the page granule (a 219 KB gradient buffer); "
                "stage2_coarse_granule_64k checks coarser ones");
    for (int zero = 0; zero <= 2; zero++) {
        z[zero] = base("mlp.ini", 2, zero, fmt("mem-z%d", zero));
        /* 14 layers of about 4k parameters, a bucket each: a few are in flight at a time */
        add(&z[zero], "model.hidden=64,64,64,64,64,64,64,64,64,64,64,64,64");
        add(&z[zero], "train.batch_size=4");
        add(&z[zero], "ddp.first_bucket_mb=0.01");
        add(&z[zero], "ddp.bucket_cap_mb=0.01");
        z[zero].steps = 2;
        run(&z[zero], st);
        all_ok(&z[zero], st);
    }
    const dt_strategy_mem *m0 = &z[0].out[0].mem, *m1 = &z[1].out[0].mem, *m2 = &z[2].out[0].mem;
    size_t P = z[0].out[0].num_params * 4;
    DT_CHECK_INT(m0->optim, 2 * P);
    double r1 = (double)m1->optim / (double)m0->optim;
    DT_CHECK_MSG(fabs(r1 - 0.5) <= 0.01, "stage 1 optimiser state %zu vs %zu: ratio %.4f",
                 m1->optim, m0->optim, r1);
    DT_CHECK_INT(m2->optim, m1->optim);
    /* stage 1: the whole gradient plus the shard; stage 2: the shard plus what is resident */
    DT_CHECK_MSG(m1->grads >= P + P / 2, "stage 1 grads %zu", m1->grads);
    DT_CHECK_MSG(m2->grads <= P / 2 + P / 4, "stage 2 grads after the step %zu (whole: %zu)",
                 m2->grads, P);
    /* during backward, pages were given back before the last bucket was reduced */
    size_t shard = m2->optim / 2;
    DT_CHECK_MSG(m2->grads_peak >= m2->grads && m2->grads_peak - shard < P * 60 / 100,
                 "stage 2 grads peak %zu, of which resident %zu of the %zu-byte buffer",
                 m2->grads_peak, m2->grads_peak - shard, P);
    DT_CHECK_INT(m1->ckpt_staging, 0); /* reserved, not resident, between saves */
    /* the allocator sees it too (mem_release / mem_commit): stage 2's gradient bytes at their
     * peak over the steps are what was resident, well below stage 1's whole buffer, and about
     * what mincore measured */
    const dt_mem_stats *a1 = &z[1].out[0].alloc, *a2 = &z[2].out[0].alloc;
    size_t g1 = a1->peak[DT_MEM_GRADS], g2 = a2->peak[DT_MEM_GRADS];
    DT_CHECK_MSG(g1 >= P, "stage 1: the allocator's gradient peak %zu, whole buffer %zu", g1, P);
    DT_CHECK_MSG(g2 < g1 && g2 < P * 60 / 100 + shard,
                 "stage 2: the allocator's gradient peak %zu vs stage 1's %zu (buffer %zu)", g2,
                 g1, P);
    DT_CHECK_MSG(a2->cur[DT_MEM_GRADS] < g2, "stage 2: gradient bytes after the step %zu, peak %zu",
                 a2->cur[DT_MEM_GRADS], g2);
    DT_CHECK_MSG(a2->total_peak < a1->total_peak, "total peak: stage 2 %zu, stage 1 %zu",
                 a2->total_peak, a1->total_peak);
    printf("    memory (2 ranks, %zu parameters): optim %zu / %zu / %zu bytes, grads %zu / %zu / "
           "%zu (stage 2 peak %zu); allocator's grads peak %zu / %zu / %zu\n",
           z[0].out[0].num_params, m0->optim, m1->optim, m2->optim, m0->grads, m1->grads,
           m2->grads, m2->grads_peak, (size_t)z[0].out[0].alloc.peak[DT_MEM_GRADS], g1, g2);
    for (int k = 0; k < 3; k++)
        unmap(&z[k]);
}

/* Stage 3 on 2 ranks, 7 blocks (the largest 65,792 parameters): the parameters resident during
 * the steps (allocator's count at every window) within 10% of 1/N of the model plus two blocks
 * (the one computed, the one prefetched), and after a step about 1/N plus the gather staging;
 * the gradients likewise; the optimiser state 1/N. With grad_accum = 2 the whole gradient
 * buffer is resident during the accumulation (the documented cost). */
static void test_stage3_memory(void)
{
    zrun z[3];
    int st[MAX_RANKS];
    /* the formula's figures are at the page granule (stage3_granules runs coarser ones); the
     * ranks are forked from here and read the variable at their first allocation */
    unsetenv("DTRAIN_CPU_MEM_GRANULE");
    for (int k = 0; k < 3; k++) {
        z[k] = base("mlp.ini", 2, k ? 3 : 0, fmt("mem3-%d", k));
        add(&z[k], "model.hidden=256,256,256,256,256,256");
        add(&z[k], "train.batch_size=4");
        if (k == 2)
            add(&z[k], "train.grad_accum=2");
        z[k].steps = 2;
        run(&z[k], st);
        all_ok(&z[k], st);
    }
    const dt_strategy_mem *m0 = &z[0].out[0].mem, *m3 = &z[1].out[0].mem, *ma = &z[2].out[0].mem;
    double P = (double)z[0].out[0].num_params * 4, blk = 65792.0 * 4, N = 2;
    DT_CHECK_INT(m3->zero_stage, 3);
    DT_CHECK_MSG(m3->params_peak <= 1.10 * (P / N + 2 * blk) && m3->params_peak >= P / N + blk,
                 "stage 3 parameters peak %zu bytes, 1/N + 2 blocks = %.0f", m3->params_peak,
                 P / N + 2 * blk);
    DT_CHECK_MSG(m3->params <= 1.05 * (P / N + blk), "stage 3 parameters after a step %zu bytes",
                 m3->params);
    DT_CHECK_MSG(m3->grads_peak <= 1.10 * (P / N + 2 * blk) && m3->grads <= 1.05 * P / N,
                 "stage 3 gradients %zu bytes after a step, %zu at their peak", m3->grads,
                 m3->grads_peak);
    DT_CHECK_MSG(fabs((double)m3->optim / (double)m0->optim - 0.5) < 0.01,
                 "stage 3 optimiser state %zu vs %zu", m3->optim, m0->optim);
    DT_CHECK_MSG(ma->grads_peak >= P && ma->grads <= 1.05 * P / N,
                 "stage 3 with grad_accum = 2: gradients peak %zu (whole %.0f), after %zu",
                 ma->grads_peak, P, ma->grads);
    printf("    stage 3 memory (2 ranks, %zu parameters, largest block %.0f bytes): params %zu "
           "peak %zu (stage 0 %zu), grads %zu peak %zu (accum 2: peak %zu), optim %zu (%zu)\n",
           z[0].out[0].num_params, blk, m3->params, m3->params_peak, m0->params, m3->grads,
           m3->grads_peak, ma->grads_peak, m3->optim, m0->optim);
    for (int k = 0; k < 3; k++)
        unmap(&z[k]);
}

/* Stage 3 at granules coarser than the page, as cuda's virtual memory has them (the cpu
 * backend's DTRAIN_CPU_MEM_GRANULE, set for the ranks): the mlp of stage3_memory (7 blocks, the
 * largest 65,792 parameters = 257 KiB) on 4 ranks against DDP (bit for bit: loss every step,
 * parameters and gathered optimiser state at the end; the norm within 1e-12), and its figures:
 *   64 KiB: each large block spans 4-5 granules and shares its edge granules with its
 *     neighbours; they go back once neither side uses them, so after a step the parameters
 *     resident are the shard and the gather staging (1/N + one block, + the buffer's partial
 *     last granule), well below the whole model, and at their peak one block more (rounded
 *     out to granules);
 *   2 MiB: the whole flat buffer (1.4 MB) is inside one granule, so nothing can be given back,
 *     and the figures say so: the flat buffers stay resident besides the shards. */
static void test_stage3_granules(void)
{
    const int N = 4;
    const size_t grains[2] = {65536, 2097152};
    for (int gi = 0; gi < 2; gi++) {
        const size_t g = grains[gi];
        zrun zr = base("mlp.ini", N, 3, fmt("gran%zu-z3", g));
        zrun dd = base("mlp.ini", N, 0, fmt("gran%zu-ddp", g));
        zrun *both[2] = {&zr, &dd};
        for (int k = 0; k < 2; k++) {
            add(both[k], "model.hidden=256,256,256,256,256,256");
            add(both[k], "train.batch_size=4");
            add(both[k], "train.warmup_steps=1");
            both[k]->steps = 20;
        }
        int sz[MAX_RANKS], sd[MAX_RANKS];
        setenv("DTRAIN_CPU_MEM_GRANULE", fmt("%zu", g), 1); /* the ranks' cpu backends read it */
        run(&zr, sz);
        unsetenv("DTRAIN_CPU_MEM_GRANULE"); /* the reference as the other tests run it */
        run(&dd, sd);
        if (all_ok(&zr, sz) && all_ok(&dd, sd)) {
            const rank_out *a = &zr.out[0], *b = &dd.out[0];
            DT_CHECK_STR(a->strategy, "zero");
            DT_CHECK_INT(a->step, zr.steps);
            size_t n = a->num_params;
            DT_CHECK_INT(n, b->num_params);
            for (int k = 0; k < zr.steps; k++) {
                double rel = fabs(a->norm[k] - b->norm[k]) / fmax(fabs(b->norm[k]), 1e-30);
                DT_CHECK_MSG(a->loss[k] == b->loss[k] && rel <= 1e-12,
                             "%s: step %d loss %.17g vs DDP %.17g, norm %.17g vs %.17g",
                             zr.name, k + 1, a->loss[k], b->loss[k], a->norm[k], b->norm[k]);
            }
            size_t d = first_diff(a->params, b->params, n);
            DT_CHECK_MSG(d == n, "%s: parameter %zu of %zu: %.9g vs DDP %.9g", zr.name, d, n,
                         (double)a->params[d < n ? d : 0], (double)b->params[d < n ? d : 0]);
            for (int i = 0; i < a->num_states && i < 2; i++)
                DT_CHECK_MSG(first_diff(a->state[i], b->state[i], n) == n,
                             "%s: optimiser state %d differs from DDP's", zr.name, i);
            /* (stage 3 gathers the parameters on rank 0 only) */
            const dt_strategy_mem *m = &a->mem;
            double P = (double)n * 4, blk = 65792.0 * 4, G = (double)g;
            DT_CHECK_INT(m->zero_stage, 3);
            if (g < 1048576) {
                DT_CHECK_MSG(m->params <= P / N + blk + 2 * G && m->params <= 0.55 * P,
                             "%s: parameters after a step %zu bytes; 1/N + a block + 2 "
                             "granules = %.0f, whole model %.0f", zr.name, m->params,
                             P / N + blk + 2 * G, P);
                DT_CHECK_MSG(m->params_peak <= P / N + 2 * blk + 4 * G && m->params_peak < P,
                             "%s: parameters peak %zu bytes; 1/N + 2 blocks + 4 granules = "
                             "%.0f, whole model %.0f", zr.name, m->params_peak,
                             P / N + 2 * blk + 4 * G, P);
                DT_CHECK_MSG(m->grads <= P / N + 2 * G && m->grads_peak < P,
                             "%s: gradients %zu bytes after a step, %zu at their peak (whole "
                             "%.0f)", zr.name, m->grads, m->grads_peak, P);
            } else {
                DT_CHECK_MSG(m->params >= P + P / N && m->grads >= P + P / N,
                             "%s: nothing can be given back below a granule, yet the figures "
                             "show parameters %zu and gradients %zu bytes (whole %.0f)",
                             zr.name, m->params, m->grads, P);
            }
            printf("    %s: %zu parameters (%.0f bytes) on %d ranks, bit for bit DDP's over %d "
                   "steps; params %zu peak %zu, grads %zu peak %zu bytes\n",
                   zr.name, n, P, N, zr.steps, m->params, m->params_peak, m->grads,
                   m->grads_peak);
        }
        unmap(&zr);
        unmap(&dd);
    }
}

/* Stage 3 on one rank: stage 3 runs (not the single process), gathering and giving back every
 * block over a group of one, and trains bit for bit as the single process does (gpt: the head's
 * tied window; 10 steps). */
static void test_stage3_one_rank(void)
{
    zrun zr = base("quickstart.ini", 1, 3, "one-z3");
    zrun one = base("quickstart.ini", 1, 0, "one-single");
    tiny_gpt(&zr);
    tiny_gpt(&one);
    zr.steps = one.steps = 10;
    int sz[1], so[1];
    run(&zr, sz);
    run(&one, so);
    if (all_ok(&zr, sz) && all_ok(&one, so)) {
        const rank_out *a = &zr.out[0], *b = &one.out[0];
        DT_CHECK_STR(a->strategy, "zero");
        DT_CHECK_STR(b->strategy, "single");
        for (int k = 0; k < zr.steps; k++)
            DT_CHECK_MSG(a->loss[k] == b->loss[k], "step %d loss %.17g vs one process %.17g",
                         k + 1, a->loss[k], b->loss[k]);
        size_t n = a->num_params;
        DT_CHECK_MSG(first_diff(a->params, b->params, n) == n,
                     "one rank at stage 3: other parameters than one process");
        DT_CHECK_MSG(a->mem.gathers_prefetched > 0, "one rank at stage 3: no prefetch");
    }
    unmap(&zr);
    unmap(&one);
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"config_errors", test_config_errors, 30},
        {"mlp_stages_2_to_4_ranks", test_mlp_stages, 300},
        {"gpt_stages_2_to_4_ranks", test_gpt_stages, 300},
        {"resnet_stages_2_to_4_ranks", test_resnet_stages, 300},
        {"bert_stages_1_2_3", test_bert_stages, 300},
        {"llama_stages_1_to_3", test_llama_stages, 300},
        {"options_clip_fp16_accum_compress_sgd", test_options, 300},
        {"stage2_coarse_granule_64k", test_stage2_coarse_granule, 120},
        {"stage3_mlp_gpt_resnet_2_to_4_ranks", test_stage3_models, 300},
        {"stage3_options_clip_fp16_accum_compress_sgd_recompute", test_stage3_options, 300},
        {"clip_is_active", test_clip_is_active, 60},
        {"resume_across_stages", test_resume_across_stages, 300},
        {"killed_rank", test_killed_rank, 120},
        {"fp16_overflow_on_one_rank_skips_everywhere", test_overflow_skips_everywhere, 60},
        {"stage3_killed_rank", test_stage3_killed_rank, 120},
        {"stage3_resume_across_stages", test_stage3_resume, 300},
        {"stage3_eval", test_stage3_eval, 120},
        {"memory", test_memory, 120},
        {"stage3_memory", test_stage3_memory, 120},
        {"stage3_granules_64k_2m", test_stage3_granules, 180},
        {"stage3_one_rank", test_stage3_one_rank, 60},
    };
    return dt_test_main("test_zero", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
