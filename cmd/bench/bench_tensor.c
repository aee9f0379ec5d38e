/* bench_tensor.c - `dtrain bench tensor JOB.ini [--nproc N] [--steps S] [--repeat R] [overrides]`:
 * tensor parallelism (parallel.tensor = T, strategy_tensor.c) of a gpt job against one process
 * and against DDP, at the same global batch, in one run.
 *
 * The configurations, each the real trainer (worker.h) on its ranks, processes of their own
 * (fork + exec of this binary, as `bench memory` runs them) over an in-process store:
 *   T = 1, one process: the whole global batch G (the job's train.batch_size) on one rank: the
 *     baseline the target is stated against ("T = 2 reaches 1.6x the tokens/s of T =
 *     1": the same GEMMs, halved over two cores, against one core doing them whole);
 *   DDP on N ranks: G / N samples each (the other way to use the same N cores);
 *   T = 2, 4, ... up to N (D = 1): every rank the whole batch, 1/T of every block;
 *   when the job asks for parallel.sequence_parallel = true, each T > 1 twice:
 *     without ("T=2") and with Megatron sequence parallelism ("T=2 SP"), side by side. The
 *     T = 1 and DDP rows always run without it (it needs T > 1; the header says so).
 * A configuration that cannot run (n_head or a world the job's loader refuses) is printed with
 * the loader's or the model's reason.
 *
 * Each rank reports its mean step time after one warm-up step; then the same number of steps
 * with the backend's per-op profiler on, whose op seconds are the compute: what is left of the
 * step is "outside ops", the all-reduces and the waits for the other ranks (plus the host's own
 * overhead, which the one-process row shows by itself). Its parameter bytes are the allocator's
 * (DT_MEM_PARAMS), beside the prediction 4 x (the split tensors' whole elements / T + the
 * replicated tensors' elements), from the strategy's table (dt_strategy_tensor_stats).
 *
 * All-reduce volume per rank and step is measured, not computed: the bytes the tensor group's
 * communicator counted (comm.h's dt_comm_stats, nccl-tests' size: count x 4 for a float
 * all-reduce) over the timed steps, divided by their number; DDP's row, the world's (its
 * gradients). Beside it, two predictions:
 *   - the schedule's, from the model's own (gpt.c, "Tensor parallelism": every collective an
 *     all-reduce of a contiguous buffer): per layer 2 in forward (after each row-parallel
 *     c_proj) and 2 in backward (the gradients of ln_1's and ln_2's outputs), each B x T x C
 *     floats; the embedding's partial sums (B x T x C) and ln_f's gradient (B x T x C); the
 *     vocabulary-parallel cross-entropy's row maxima and sums (3 x B x T); then the step's two
 *     scalars all-reduces (strategy_tensor.c): the norm's double over the tensor group and, when
 *     D = 1 (the tensor group is the world), the loss and stop flag's two doubles. So
 *     4 x accum x ((4L + 2) x B x T x C + 3 x B x T) + 8 (+ 16) bytes, B the rank's samples per
 *     micro-step. The collectives are deterministic, so measured and predicted agree exactly;
 *     tests/test_bench.c checks that they do.
 *   - Megatron's: 4 all-reduces of B x T x C floats per layer, 4 x L x B x T x C x 4 bytes (per
 *     micro-step). DDP's reference is its gradients, parameters x 4 bytes (its schedule adds
 *     the loss's 16 bytes, and halves the gradients under ddp.compress).
 * With train.recompute = block the recomputed forward repeats attn.c_proj's all-reduce: + L
 * x B x T x C floats per micro-step.
 * Sequence parallelism's rows count the tensor group's reduce-scatters and all-gathers apart
 * (comm.h's sizes: the whole (B x T, C) input of a reduce-scatter, the whole output of an
 * all-gather), beside gpt.c's SP schedule per micro-step: reduce-scatters, the embedding's
 * partial sums, 2 per layer forward (the c_proj's), 2 per layer backward (the gradients of
 * ln_1's and ln_2's outputs) and the head's input gradient: 4L + 2; all-gathers, 2 per layer
 * forward (ln_1's and ln_2's outputs), 4 backward (the two row-parallel output gradients, the two
 * LayerNorm outputs again), ln_f's output in forward and again in backward, the embeddings'
 * gradient: 6L + 3; each B x T x C floats (recompute = block: + L reduce-scatters and + 2L
 * all-gathers). What stays an all-reduce: the cross-entropy's 3 x B x T and the LayerNorms'
 * weight and bias gradients, 4C per layer + 2C for ln_f, per micro-step; then the step's
 * scalars as above. The activation bytes per rank are the allocator's (DT_MEM_ACTS, peak),
 * with and without sequence parallelism.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store_server.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"

#define MAX_RANKS 64
#define MAX_REPEAT 16
#define MAX_CONF 8
#define MIB (1024.0 * 1024.0)

typedef struct bench_opts {
    dt_bench_args a; /* the job, the overrides and the child's arguments (cmd.h) */
    int nproc;        /* parent: the most ranks a configuration uses; child: this one's */
    int steps;
    int repeat;
} bench_opts;

/* What one rank measured. */
typedef struct result {
    double step_s;      /* mean step time after the warm-up step */
    double cpu_s;       /* the process's CPU time per step over the same steps (all threads) */
    double prof_step_s; /* mean step time of the profiled steps */
    double ops_s;       /* of which inside the backend's ops, per step */
    double params_bytes; /* the allocator's parameter bytes (peak) */
    double pred_params; /* predicted parameter bytes of this rank */
    double ar_bytes;    /* measured: all-reduce bytes per step, the tensor group's (DDP: the
                           world's), counted by the communicator over the timed steps */
    double ar_calls;    /* all-reduce calls per step, likewise */
    double sched_bytes; /* the schedule's prediction of ar_bytes (see the top of this file) */
    double rs_bytes, rs_calls, sched_rs; /* reduce-scatters, likewise (sequence parallelism) */
    double ag_bytes, ag_calls, sched_ag; /* all-gathers, likewise */
    double act_bytes;   /* the allocator's activation bytes (DT_MEM_ACTS, peak) */
    double ref_bytes;   /* Megatron's 4 x L x B x T x C floats (tensor ranks; DDP: parameters)
                           x 4 bytes; 0 for one process */
    double tokens;      /* tokens per step, all ranks together (the global batch) */
    long long local_params, whole_params;
} result;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench tensor JOB.ini [--nproc N] [--steps S] [--repeat R] "
            "[section.key=value ...]\n"
            "\n"
            "  --nproc N   the most ranks a configuration uses (default 2)\n"
            "  --steps S   timed steps per configuration (default 5), after one warm-up step,\n"
            "              then S more with the backend's op profiler on\n"
            "  --repeat R  run all the configurations R times, interleaved; step times are the\n"
            "              median of the passes (default 1)\n"
            "\n"
            "For a gpt job: one process (T = 1), DDP on N ranks and parallel.tensor = 2, 4, ...\n"
            "up to N, all at the same global batch (the job's train.batch_size): tokens/s and its\n"
            "ratio to T = 1, the bytes each rank all-reduced per step (counted by the tensor\n"
            "group's communicator) beside the schedule's prediction and Megatron's count,\n"
            "the share of the step outside the compute ops (communication and waiting), each\n"
            "rank's parameter bytes beside 1/T of the split tensors plus the replicated ones, and\n"
            "its activation bytes. When the job asks for parallel.sequence_parallel = true, each\n"
            "T > 1 runs without and with it (T = 1 and DDP without), and the tensor group's\n"
            "reduce-scatters and all-gathers are counted beside their prediction.\n");
}

/* ---- the children ---------------------------------------------------------------------------- */

static int load_job(const bench_opts *o, char *const *more, int n_more, dt_job *job,
                    dt_config_errors *errs, dt_err *err)
{
    return dt_bench_load_job(o->a.job_path, o->a.overrides, o->a.n_overrides, more, n_more, job, errs,
                             err);
}

static int write_result(const char *path, const result *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "%.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g %lld %lld "
            "%.17g %.17g %.17g %.17g %.17g %.17g %.17g\n",
            r->step_s, r->cpu_s, r->prof_step_s, r->ops_s, r->params_bytes, r->pred_params,
            r->ar_bytes, r->ar_calls, r->sched_bytes, r->ref_bytes, r->tokens, r->local_params,
            r->whole_params, r->rs_bytes, r->rs_calls, r->sched_rs, r->ag_bytes, r->ag_calls,
            r->sched_ag, r->act_bytes);
    return fclose(f) ? -errno : 0;
}

/* Rank `rank`'s result from path into ((result *)res)[rank] (dt_bench_config's read). */
static int read_result(const char *path, int rank, void *res)
{
    result *r = (result *)res + rank;
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -ENOENT;
    int ok = fscanf(f, "%lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lf %lld %lld %lf %lf %lf %lf "
                    "%lf %lf %lf", &r->step_s, &r->cpu_s, &r->prof_step_s, &r->ops_s,
                    &r->params_bytes, &r->pred_params, &r->ar_bytes, &r->ar_calls,
                    &r->sched_bytes, &r->ref_bytes, &r->tokens, &r->local_params,
                    &r->whole_params, &r->rs_bytes, &r->rs_calls, &r->sched_rs, &r->ag_bytes,
                    &r->ag_calls, &r->sched_ag, &r->act_bytes) == 20;
    fclose(f);
    return ok ? 0 : -EPROTO;
}

static double cpu_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* n steps: *secs of wall-clock time, *cpu of this process's CPU time (every thread's). */
static int run_steps(dt_trainer *t, int n, double *secs, double *cpu, dt_err *err)
{
    double t0 = dt_now_s(), c0 = cpu_now_s();
    for (int i = 0; i < n; i++) {
        int rc = dt_trainer_step(t, err);
        if (rc)
            return rc;
    }
    *secs = dt_now_s() - t0;
    *cpu = cpu_now_s() - c0;
    return 0;
}

/* The counters of the group whose all-reduces the bench reports: the tensor group (tensor
 * strategy), else the strategy's world (DDP's gradients; zeros for one process, which has none). */
static void group_stats(dt_trainer *t, dt_comm_stats *out)
{
    dt_tensor_stats ts;
    if (dt_strategy_tensor_stats(t->s, &ts) == 0)
        *out = ts.tp_comm;
    else
        dt_comm_stats_get(t->s->comm, out);
}

/* One rank of one configuration (its overrides already in o->a.overrides). */
static int run_child(void *arg)
{
    const bench_opts *o = arg;
    static dt_job job;
    static dt_trainer t;
    dt_err err = {0};
    bool built = false;
    int rc;
    if ((rc = dt_bench_child_trainer(&t, &job, o->a.job_path, o->a.overrides, o->a.n_overrides,
                                     0, o->a.out, o->a.rank, o->nproc, o->a.port,
                                     o->a.run_id ? o->a.run_id : "bench-tensor", &err)))
        goto out;
    built = true;
    result res;
    memset(&res, 0, sizeof res);
    double secs, cpu;
    dt_comm_stats c0, c1, dc;
    if ((rc = run_steps(&t, 1, &secs, &cpu, &err)))
        goto out;
    group_stats(&t, &c0);
    if ((rc = run_steps(&t, o->steps, &secs, &cpu, &err)))
        goto out;
    group_stats(&t, &c1);
    dt_comm_stats_sub(&c1, &c0, &dc);
    res.ar_bytes = (double)dc.bytes[DT_COMM_OP_ALLREDUCE] / o->steps;
    res.ar_calls = (double)dc.calls[DT_COMM_OP_ALLREDUCE] / o->steps;
    res.rs_bytes = (double)dc.bytes[DT_COMM_OP_REDUCE_SCATTER] / o->steps;
    res.rs_calls = (double)dc.calls[DT_COMM_OP_REDUCE_SCATTER] / o->steps;
    res.ag_bytes = (double)dc.bytes[DT_COMM_OP_ALLGATHER] / o->steps;
    res.ag_calls = (double)dc.calls[DT_COMM_OP_ALLGATHER] / o->steps;
    res.step_s = secs / o->steps;
    res.cpu_s = cpu / o->steps;
    dt_backend *be = t.be;
    if (be->profile_enable && be->profile_read) {
        be->profile_enable(be, true);
        if ((rc = run_steps(&t, o->steps, &secs, &cpu, &err)))
            goto out;
        dt_op_stat st[128];
        int n = DT_MIN(be->profile_read(be, st, (int)DT_ARRAY_LEN(st)), (int)DT_ARRAY_LEN(st));
        be->profile_enable(be, false);
        for (int i = 0; i < n; i++)
            res.ops_s += st[i].seconds;
        res.ops_s /= o->steps;
        res.prof_step_s = secs / o->steps;
    }
    dt_mem_stats ms;
    dt_mem_read(be, &ms);
    res.params_bytes = (double)ms.peak[DT_MEM_PARAMS];
    res.act_bytes = (double)ms.peak[DT_MEM_ACTS];
    const dt_model_config *mc = &t.model->cfg;
    double btc = (double)t.batch * job.grad_accum * mc->shape.seq_len * mc->n_embd;
    double bt = (double)t.batch * job.grad_accum * mc->shape.seq_len;
    res.tokens = (double)t.items_per_step;
    dt_tensor_stats ts;
    res.local_params = (long long)t.model->num_params;
    res.whole_params = res.local_params;
    res.pred_params = 4.0 * (double)t.model->num_params;
    if (dt_strategy_tensor_stats(t.s, &ts) == 0) {
        res.whole_params = (long long)ts.whole_params;
        res.pred_params = 4.0 * ((double)ts.split_whole / ts.T + (double)ts.replicated);
        /* the model's, the norm's double, and (D = 1) the loss and stop flag's two doubles */
        const double L = mc->n_layer, step = 8.0 + (ts.D == 1 ? 16.0 : 0.0);
        const bool rec = job.recompute == DT_RECOMP_BLOCK; /* repeats the attention's g */
        if (job.sequence_parallel) {
            /* the cross-entropy's statistics and the LayerNorms' gradients (4C a layer, 2C
             * ln_f) per micro-step; (B,T,C) reduce-scatters and all-gathers (the top) */
            res.sched_bytes = 4.0 * (3.0 * bt + job.grad_accum * (4.0 * L + 2.0) * mc->n_embd) +
                              step;
            res.sched_rs = 4.0 * (4.0 * L + 2.0 + (rec ? L : 0.0)) * btc;
            res.sched_ag = 4.0 * (6.0 * L + 3.0 + (rec ? 2.0 * L : 0.0)) * btc;
        } else {
            res.sched_bytes = 4.0 * ((4.0 * L + 2.0 + (rec ? L : 0.0)) * btc + 3.0 * bt) + step;
        }
        res.ref_bytes = 4.0 * 4.0 * mc->n_layer * btc;
        /* the trainer counts every rank's batch; a tensor group's ranks share theirs */
        res.tokens = (double)t.batch * job.grad_accum * mc->shape.seq_len * ts.D;
    } else if (o->nproc > 1) {
        /* DDP: the gradients (16-bit payloads under ddp.compress), then the loss's two doubles */
        double payload = job.compress == DT_COMPRESS_NONE ? 4.0 : 2.0;
        res.sched_bytes = payload * (double)t.model->num_params + 16.0;
        res.ref_bytes = 4.0 * (double)t.model->num_params;
    }
    if ((rc = write_result(o->a.out, &res)) != 0)
        dt_err_errno(&err, -rc, "writing %s", o->a.out);
out:
    if (rc)
        fprintf(stderr, "dtrain bench tensor (rank %d): %s\n", o->a.rank, err.msg);
    if (built)
        dt_trainer_close(&t);
    return rc ? 1 : 0;
}

/* ---- the parent ------------------------------------------------------------------------------ */

typedef struct conf {
    char label[32];
    int ranks, T, batch;
    bool sp;          /* with sequence parallelism */
    char ov[4][48];   /* parallel.tensor, train.batch_size, elastic.nproc_per_node,
                         parallel.sequence_parallel */
    bool ok;
    char why[1024];
} conf;

/* Runs configuration c on its ranks; res[0..ranks). */
static int run_config(const bench_opts *o, const conf *c, const char *dir, int index,
                      result *res)
{
    char id[16], steps[16], nproc[16];
    snprintf(id, sizeof id, "c%d", index);
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(nproc, sizeof nproc, "%d", c->ranks);
    char *head[] = {"tensor", (char *)o->a.job_path};
    char *cov[] = {(char *)c->ov[0], (char *)c->ov[1], (char *)c->ov[2], (char *)c->ov[3]};
    char *tail[] = {"--nproc", nproc, "--steps", steps, "--child", "1"};
    const dt_bench_words parts[] = {{head, 2}, {o->a.overrides, o->a.n_overrides}, {cov, 4},
                                    {tail, 6}};
    return dt_bench_config("tensor", "tensor", c->ranks > 1, parts, 4, dir, id, c->ranks,
                           read_result, res);
}

/* c's overrides, and whether the job loads with them (else the loader's reason in c->why). */
static void make_conf(const bench_opts *o, conf *c, const char *label, int ranks, int T,
                      int batch, bool sp, const dt_job *base)
{
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    memset(c, 0, sizeof *c);
    snprintf(c->label, sizeof c->label, "%s", label);
    c->ranks = ranks;
    c->T = T;
    c->batch = batch;
    c->sp = sp;
    snprintf(c->ov[0], sizeof c->ov[0], "parallel.tensor=%d", T);
    snprintf(c->ov[1], sizeof c->ov[1], "train.batch_size=%d", batch);
    snprintf(c->ov[2], sizeof c->ov[2], "elastic.nproc_per_node=%d", ranks);
    snprintf(c->ov[3], sizeof c->ov[3], "parallel.sequence_parallel=%s", sp ? "true" : "false");
    if (batch < 1) {
        snprintf(c->why, sizeof c->why, "train.batch_size = %d does not split over %d ranks",
                 base->batch_size, ranks);
        return;
    }
    if (T > 1 && base->n_head % T) {
        snprintf(c->why, sizeof c->why, "model.n_head = %d is not a multiple of %d (each rank "
                 "holds n_head / T whole heads)", base->n_head, T);
        return;
    }
    char *cfg[4] = {c->ov[0], c->ov[1], c->ov[2], c->ov[3]};
    if (load_job(o, cfg, 4, &job, &errs, &err) != 0) {
        size_t k = 0;
        for (int i = 0; i < errs.count && i < 8 && k < sizeof c->why; i++)
            k += (size_t)snprintf(c->why + k, sizeof c->why - k, "%s%s", i ? "; " : "",
                                  errs.lines[i]);
        if (!errs.count)
            snprintf(c->why, sizeof c->why, "%s", err.msg);
        return;
    }
    c->ok = true;
}

/* Whether the job asks for sequence parallelism: the last parallel.sequence_parallel override,
 * else the file's (loaded with parallel.tensor = 2, where it is allowed; a job that does not load
 * so does not ask). */
static bool asks_sp(const bench_opts *o)
{
    static const char key[] = "parallel.sequence_parallel=";
    for (int i = o->a.n_overrides - 1; i >= 0; i--)
        if (!strncmp(o->a.overrides[i], key, sizeof key - 1)) {
            const char *v = o->a.overrides[i] + sizeof key - 1;
            return !strcasecmp(v, "true") || !strcmp(v, "1") || !strcasecmp(v, "yes") ||
                   !strcasecmp(v, "on");
        }
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    char *t2[] = {"parallel.tensor=2"};
    return load_job(o, t2, 1, &job, &errs, &err) == 0 && job.sequence_parallel;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, dt_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The command line's limits beyond dt_bench_main_run's (0, or 2 after the usage). */
static int check(void *arg)
{
    const bench_opts *o = arg;
    if (o->nproc < 1 || o->nproc > MAX_RANKS || o->steps < 1 || o->repeat < 1 ||
        o->repeat > MAX_REPEAT) {
        usage(stderr);
        return 2;
    }
    return 0;
}

/* The parent: the configurations (T = 1, DDP, T = 2, 4, ...) in turn, outputs under dir, then
 * the table. */
static int run_parent(void *arg, const char *dir)
{
    const bench_opts o = *(const bench_opts *)arg;
    static dt_job job;
    /* the job, loaded without sequence parallelism (it needs T > 1, and the rows choose T) */
    const bool want_sp = asks_sp(&o);
    char *no_sp[] = {"parallel.tensor=1", "parallel.sequence_parallel=false"};
    if (dt_bench_parent_job("tensor", o.a.job_path, o.a.overrides, o.a.n_overrides, no_sp, 2, &job))
        return 1;
    if (job.model_type != DT_MODEL_GPT) {
        fprintf(stderr, "dtrain bench tensor: %s is a %s job; tensor parallelism splits gpt "
                "only (model.type = gpt)\n", o.a.job_path, dt_model_name(job.model_type));
        return 2;
    }
    const int G = job.batch_size, N = o.nproc;
    conf confs[MAX_CONF];
    int nc = 0;
    /* sequence parallelism, when the job asks for it: T > 1 without and with it */
    make_conf(&o, &confs[nc++], "T=1 (1 process)", 1, 1, G, false, &job);
    if (N > 1) {
        char l[32];
        snprintf(l, sizeof l, "DDP x %d", N);
        make_conf(&o, &confs[nc++], l, N, 1, G % N ? 0 : G / N, false, &job);
    }
    for (int T = 2; T <= N && nc < MAX_CONF; T *= 2) {
        char l[32];
        snprintf(l, sizeof l, "T=%d", T);
        make_conf(&o, &confs[nc++], l, T, T, G, false, &job);
        if (want_sp && nc < MAX_CONF) {
            snprintf(l, sizeof l, "T=%d SP", T);
            make_conf(&o, &confs[nc++], l, T, T, G, true, &job);
        }
    }
    printf("# dtrain bench tensor %s: gpt L=%d NH=%d C=%d, seq %d, global batch %d x accum %d "
           "(train.batch_size: every configuration's), device %s, %d step(s) per configuration "
           "after a warm-up step (and as many profiled), %d pass(es)\n",
           o.a.job_path, job.n_layer, job.n_head, job.n_embd, job.seq_len, G, job.grad_accum,
           dt_device_name(job.device), o.steps, o.repeat);
    printf("# baseline: T=1 is one process doing the whole global batch (the same GEMMs that T "
           "ranks split, on one core); DDP x %d is the other way to use the same %d cores\n",
           N, N);
    if (want_sp)
        printf("# sequence parallelism asked for: T=1 and DDP x %d run without it (it needs T > "
               "1); each T > 1 runs without it and with it (\"SP\")\n", N);
    result *res = calloc((size_t)o.repeat * MAX_CONF * MAX_RANKS, sizeof *res);
    bool ran[MAX_CONF] = {false};
    int failed = !res;
    for (int rep = 0; rep < o.repeat && !failed; rep++) {
        for (int ci = 0; ci < nc && !failed; ci++) {
            if (!confs[ci].ok)
                continue;
            if (o.repeat > 1)
                fprintf(stderr, "dtrain bench tensor: pass %d/%d, %s\n", rep + 1, o.repeat,
                        confs[ci].label);
            result *r = res + ((size_t)rep * MAX_CONF + (size_t)ci) * MAX_RANKS;
            if (run_config(&o, &confs[ci], dir, rep * MAX_CONF + ci, r) != 0) {
                printf("%s FAILED: the run did not complete (its ranks' messages are above)\n",
                       confs[ci].label);
                failed = 1;
                break;
            }
            ran[ci] = rep == o.repeat - 1;
        }
    }
    /* per configuration, the median over the passes of: the mean over ranks of the wall-clock
     * figures; the largest rank's CPU time per step (the slowest rank sets the pace) */
    double step[MAX_CONF] = {0}, cpu[MAX_CONF] = {0}, prof[MAX_CONF] = {0}, ops[MAX_CONF] = {0};
    double cpu_lo[MAX_CONF] = {0}, cpu_hi[MAX_CONF] = {0};
    for (int ci = 0; ci < nc && !failed; ci++) {
        if (!ran[ci])
            continue;
        double v[4][MAX_REPEAT];
        for (int rep = 0; rep < o.repeat; rep++) {
            v[0][rep] = v[1][rep] = v[2][rep] = v[3][rep] = 0;
            for (int k = 0; k < confs[ci].ranks; k++) {
                const result *x = &res[((size_t)rep * MAX_CONF + (size_t)ci) * MAX_RANKS + k];
                v[0][rep] += x->step_s / confs[ci].ranks;
                v[1][rep] += x->prof_step_s / confs[ci].ranks;
                v[2][rep] += x->ops_s / confs[ci].ranks;
                v[3][rep] = fmax(v[3][rep], x->cpu_s);
            }
        }
        step[ci] = median(v[0], o.repeat);
        prof[ci] = median(v[1], o.repeat);
        ops[ci] = median(v[2], o.repeat);
        cpu[ci] = median(v[3], o.repeat); /* sorts v[3] */
        cpu_lo[ci] = v[3][0];
        cpu_hi[ci] = v[3][o.repeat - 1];
    }
    if (!failed) {
        printf("%-16s %5s %5s %9s %10s %6s %9s %13s %10s %6s %8s %10s %10s %10s %13s %7s %10s "
               "%10s %8s\n",
               "configuration", "ranks", "batch", "step(ms)", "tokens/s", "vs T=1", "cpu(ms)",
               o.repeat > 1 ? "cpu min-max" : "", "tok/s/cpu", "vs T=1", "outside", "AR MiB",
               "RS+AG MiB", "schedule", "Megatron", "vs Meg", "params MiB", "predicted",
               "act MiB");
        double base_tps = 0, base_cpu = 0, t2_wall = 0, t2_cpu = 0;
        for (int ci = 0; ci < nc; ci++) {
            const conf *c = &confs[ci];
            if (!c->ok) {
                printf("%-16s not run: %s\n", c->label, c->why);
                continue;
            }
            const result *r = &res[((size_t)(o.repeat - 1) * MAX_CONF + (size_t)ci) * MAX_RANKS];
            double tps = r->tokens / step[ci], tpc = cpu[ci] > 0 ? r->tokens / cpu[ci] : 0;
            if (ci == 0) {
                base_tps = tps;
                base_cpu = tpc;
            }
            char vs[16] = "-", vc[16] = "-", outside[24] = "n/a", meg[24] = "-", ratio[16] = "-";
            if (base_tps > 0)
                snprintf(vs, sizeof vs, "%.2fx", tps / base_tps);
            if (base_cpu > 0)
                snprintf(vc, sizeof vc, "%.2fx", tpc / base_cpu);
            if (c->T == 2 && !c->sp) {
                t2_wall = base_tps > 0 ? tps / base_tps : 0;
                t2_cpu = base_cpu > 0 ? tpc / base_cpu : 0;
            }
            if (prof[ci] > 0)
                snprintf(outside, sizeof outside, "%.1f%%",
                         100.0 * fmax(0.0, prof[ci] - ops[ci]) / prof[ci]);
            const double moved = r->ar_bytes + r->rs_bytes + r->ag_bytes;
            if (r->ref_bytes > 0) {
                snprintf(meg, sizeof meg, "%.3f%s", r->ref_bytes / MIB, c->T > 1 ? "" : " grads");
                snprintf(ratio, sizeof ratio, "%.3f", moved / r->ref_bytes);
            }
            char range[32] = "";
            if (o.repeat > 1)
                snprintf(range, sizeof range, "%.0f-%.0f", cpu_lo[ci] * 1e3, cpu_hi[ci] * 1e3);
            printf("%-16s %5d %5d %9.2f %10.0f %6s %9.2f %13s %10.0f %6s %8s %10.3f %10.3f "
                   "%10.3f %13s %7s %10.3f %10.3f %8.2f\n",
                   c->label, c->ranks, c->batch, step[ci] * 1e3, tps, vs, cpu[ci] * 1e3, range,
                   tpc, vc, outside, r->ar_bytes / MIB, (r->rs_bytes + r->ag_bytes) / MIB,
                   (r->sched_bytes + r->sched_rs + r->sched_ag) / MIB, meg, ratio,
                   r->params_bytes / MIB, r->pred_params / MIB, r->act_bytes / MIB);
        }
        printf("#\n# step(ms), tokens/s: wall clock (the global batch's tokens over the ranks' "
               "mean step time, median of the passes); vs T=1: against one process\n"
               "# cpu(ms): CPU time per step of the busiest rank (all its threads: compute and "
               "the communicator's); tok/s/cpu: tokens over it, the rate with a core per rank "
               "and nothing else running (waits for a peer are not CPU time: a slight "
               "overestimate where ranks are unequal); the figure to read on a shared machine, "
               "where other processes take the cores\n"
               "# outside: the share of a profiled step (wall clock) outside the backend's "
               "compute ops: the all-reduces and the waits for the other ranks, plus the host "
               "overhead the one-process row shows alone\n"
               "# AR MiB: what each rank all-reduced per timed step, counted by the communicator "
               "(tensor ranks: the tensor group's; DDP: the world's), in nccl-tests' sizes; "
               "schedule: its prediction (tensor ranks: 4 x ((4L + 2) x B x T x C + 3 x B x T) "
               "bytes per micro-step, + 8 for the norm, + 16 for the loss when D = 1; DDP: its "
               "gradients + 16 for the loss); Megatron: 4 x L x B x T x C floats (DDP: its "
               "gradients, parameters x 4 bytes); vs Meg: (AR + RS + AG) / Megatron\n"
               "# RS+AG MiB: the tensor group's reduce-scatters and all-gathers per step "
               "(sequence parallelism; nccl-tests' sizes, the whole (B x T, C) buffer each); "
               "the SP rows' schedule adds gpt.c's (4L + 2) reduce-scatters and (6L + 3) "
               "all-gathers of B x T x C floats per micro-step to what stays an all-reduce (the "
               "cross-entropy's 3 x B x T, the LayerNorms' gradients (4L + 2) x C, the norm, the "
               "loss)\n"
               "# params MiB: the allocator's parameter bytes per rank; predicted: 4 x (split "
               "tensors' whole elements / T + replicated elements); act MiB: the allocator's "
               "activation bytes per rank (peak)\n");
        if (t2_cpu > 0)
            printf("# T=2 vs T=1 (one process): %.2fx the tokens/s per busiest rank's CPU "
                   "second, %.2fx wall clock (target on 2 free cores, gpt-mini: >= "
                   "1.6x: %s by CPU time)\n",
                   t2_cpu, t2_wall, t2_cpu >= 1.6 ? "yes" : "no");
        if (o.repeat < 3)
            printf("# (from %d pass(es): on a shared machine use --repeat 3 or more)\n",
                   o.repeat);
        /* exact figures of every rank, for scripts and tests */
        printf("#\n# per rank: parameter bytes (allocator; predicted), bytes all-reduced per "
               "step as counted (calls; the schedule's prediction; Megatron's or DDP's "
               "gradients), reduce-scattered and all-gathered likewise, activation bytes "
               "(allocator, peak), parameters held of the whole model's:\n");
        for (int ci = 0; ci < nc; ci++) {
            if (!confs[ci].ok)
                continue;
            for (int k = 0; k < confs[ci].ranks; k++) {
                const result *r =
                    &res[((size_t)(o.repeat - 1) * MAX_CONF + (size_t)ci) * MAX_RANKS + k];
                printf("# %s rank %d: params %.0f predicted %.0f; all-reduce bytes %.0f calls %.0f "
                       "schedule %.0f reference %.0f; reduce-scatter bytes %.0f calls %.0f "
                       "schedule %.0f; all-gather bytes %.0f calls %.0f schedule %.0f; "
                       "activations %.0f; holds %lld of %lld\n",
                       confs[ci].label, k, r->params_bytes, r->pred_params, r->ar_bytes,
                       r->ar_calls, r->sched_bytes, r->ref_bytes, r->rs_bytes, r->rs_calls,
                       r->sched_rs, r->ag_bytes, r->ag_calls, r->sched_ag, r->act_bytes,
                       r->local_params, r->whole_params);
            }
        }
    }
    free(res);
    return failed;
}

int dt_bench_tensor(int argc, char **argv)
{
    bench_opts o = {.nproc = 2, .steps = 5, .repeat = 1};
    const dt_bench_opt opts[] = {
        {"--nproc", &o.nproc, NULL},
        {"--steps", &o.steps, NULL},
        {"--repeat", &o.repeat, NULL},
    };
    const dt_bench_main m = {.name = "tensor", .tag = "tensor", .opts = opts,
                             .nopts = (int)DT_ARRAY_LEN(opts), .print_usage = usage, .o = &o,
                             .args = &o.a, .check = check, .run_child = run_child,
                             .run_parent = run_parent};
    return dt_bench_main_run(&m, argc, argv);
}
