/* bench_pipeline.c - `dtrain bench pipeline JOB.ini [--steps S] [--stages 2,4] [--micro
 * 1,2,4,8,16] [overrides]`: the pipeline bubble, throughput and activation memory of GPipe and
 * 1F1B, measured on the real trainer, beside what the formulas predict.
 *
 * For every P stages x M micro-batches x schedule the job runs on P ranks (processes of their
 * own, fork + exec of this binary with a store in this process, as `bench memory` runs its
 * ranks), D = 1, for S steps; the first step is not counted. Each rank reports, from the
 * pipeline strategy's statistics (strategy.h, dt_pp_stats), its idle fraction (1 - the
 * time in its stage's forward and backward / the time of the micro-step: the bubble, plus the
 * waits for its neighbours and for the CPU), the step time, and its activation memory: the
 * slots it holds and the micro-batches that were alive at once x one micro-batch's
 * activations. Printed: the idle fraction of every stage beside (P-1)/(M+P-1) and beside the
 * schedule replayed with the stages' measured forward and backward times (pp_schedule.h's
 * dt_pp_simulate_stages: the bubble uneven stages make, communication free), samples or
 * tokens per second, and stage 0's peak activation memory under each schedule with 1F1B's
 * share of GPipe's beside P/M.
 *
 * The formula assumes stages of equal cost; a job whose stages are uneven (mlp's first layer
 * is wider than its last) or a machine with fewer cores than P ranks measures more idle time.
 * Train.batch_size must be a multiple of every M (the loader says so otherwise); a (P, M) the
 * loader refuses (P larger than the model's blocks) is printed as not supported, with its
 * message.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "rendezvous/store_server.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/pp_schedule.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"

#define MAX_P 8
#define MAX_LIST 8
#define MIB (1024.0 * 1024.0)

typedef struct bench_opts {
    dt_bench_args a; /* the job, the overrides and the child's arguments (cmd.h) */
    int steps;
    const char *stages, *micro;
    int Ps[MAX_LIST], Ms[MAX_LIST]; /* parent: the lists */
    int nP, nM;
    int nproc;
} bench_opts;

/* What one rank measured (means over the counted steps). */
typedef struct result {
    int stage, slots, peak_in_flight;
    double idle, step_s, items_per_s;
    double fwd_s, bwd_s;   /* the stage's forwards and backwards per micro-step */
    double slot_bytes, act_bytes, peak_act_bytes;
} result;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench pipeline JOB.ini [--steps S] [--stages 2,4] "
            "[--micro 1,2,4,8,16] [section.key=value ...]\n"
            "\n"
            "  --steps S     training steps per configuration (default 4; the first is not "
            "counted)\n"
            "  --stages L    pipeline stages to run, a comma list (default 2,4)\n"
            "  --micro L     micro-batches per rank batch, a comma list (default 1,2,4,8,16)\n"
            "\n"
            "Runs the job with every parallel.pipeline x parallel.micro_batches x "
            "parallel.schedule\n(gpipe, 1f1b) on P ranks and prints each stage's idle fraction "
            "beside (P-1)/(M+P-1),\nthroughput, and stage 0's peak activation memory per "
            "schedule (1F1B holds at most P\nmicro-batches, GPipe M).\n");
}

static int parse_list(const char *s, int *out, int cap)
{
    int n = 0;
    char buf[128];
    dt_strlcpy(buf, s, sizeof buf);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && n < cap; t = strtok_r(NULL, ",", &save)) {
        int v;
        if (dt_parse_int(dt_trim(t), &v) || v < 1)
            return -EINVAL;
        out[n++] = v;
    }
    return n > 0 ? n : -EINVAL;
}

static int load_job(const bench_opts *o, char *const *more, int n_more, dt_job *job,
                    dt_config_errors *errs, dt_err *err)
{
    return dt_bench_load_job(o->a.job_path, o->a.overrides, o->a.n_overrides, more, n_more, job, errs,
                             err);
}

/* ---- a rank ---------------------------------------------------------------------------------- */

static int run_child(void *arg)
{
    const bench_opts *o = arg;
    static dt_job job;
    static dt_trainer t;
    dt_err err = {0};
    bool built = false;
    int rc;
    if ((rc = dt_bench_child_trainer(&t, &job, o->a.job_path, o->a.overrides, o->a.n_overrides,
                                     o->steps, o->a.out, o->a.rank, o->nproc, o->a.port,
                                     o->a.run_id ? o->a.run_id : "bench-pipeline", &err)))
        goto out;
    built = true;
    result res;
    memset(&res, 0, sizeof res);
    int counted = 0;
    for (int step = 0; step < o->steps; step++) {
        if ((rc = dt_trainer_step(&t, &err)))
            goto out;
        dt_pp_stats st;
        if (dt_strategy_pipeline_stats(t.s, &st) != 0) {
            rc = dt_err_set(&err, -EINVAL, "the job did not run the pipeline strategy (%s)",
                            t.s->ops->name);
            goto out;
        }
        res.stage = st.stage;
        res.slots = st.slots;
        res.peak_in_flight = DT_MAX(res.peak_in_flight, st.peak_in_flight);
        res.slot_bytes = (double)st.slot_bytes;
        res.act_bytes = (double)st.act_bytes;
        res.peak_act_bytes = DT_MAX(res.peak_act_bytes, (double)st.peak_act_bytes);
        if (step == 0 && o->steps > 1)
            continue;
        res.idle += st.idle;
        res.fwd_s += st.fwd_s;
        res.bwd_s += st.bwd_s;
        res.step_s += t.step_time_s;
        res.items_per_s += (double)t.items_per_step / t.step_time_s;
        counted++;
    }
    res.idle /= counted;
    res.fwd_s /= counted;
    res.bwd_s /= counted;
    res.step_s /= counted;
    res.items_per_s /= counted;
    FILE *f = fopen(o->a.out, "w");
    if (!f) {
        rc = dt_err_errno(&err, errno, "writing %s", o->a.out);
        goto out;
    }
    fprintf(f, "%d %d %d %.17g %.17g %.17g %.17g %.17g %.17g %.17g %.17g\n", res.stage,
            res.slots, res.peak_in_flight, res.idle, res.step_s, res.items_per_s,
            res.slot_bytes, res.act_bytes, res.peak_act_bytes, res.fwd_s, res.bwd_s);
    if (fclose(f))
        rc = dt_err_errno(&err, errno, "writing %s", o->a.out);
out:
    if (rc)
        fprintf(stderr, "dtrain bench pipeline (rank %d): %s\n", o->a.rank, err.msg);
    if (built)
        dt_trainer_close(&t);
    return rc ? 1 : 0;
}

static int read_result(const char *path, result *r)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -ENOENT;
    int ok = fscanf(f, "%d %d %d %lf %lf %lf %lf %lf %lf %lf %lf", &r->stage, &r->slots,
                    &r->peak_in_flight, &r->idle, &r->step_s, &r->items_per_s, &r->slot_bytes,
                    &r->act_bytes, &r->peak_act_bytes, &r->fwd_s, &r->bwd_s) == 11;
    fclose(f);
    return ok ? 0 : -EPROTO;
}

/* ---- the parent ------------------------------------------------------------------------------ */

/* dt_bench_config's read: a rank's result into res[its stage] (stages 0..P-1). */
typedef struct stage_results {
    result *res;
    int P;
} stage_results;
static int read_stage(const char *path, int rank, void *arg)
{
    const stage_results *sr = arg;
    result x;
    (void)rank;
    if (read_result(path, &x) != 0)
        return 1;
    if (x.stage >= 0 && x.stage < sr->P)
        sr->res[x.stage] = x;
    return 0;
}

/* One configuration on P ranks into res[0..P). */
static int run_config(const bench_opts *o, int P, char *const *cfg, int ncfg, const char *dir,
                      int index, result *res)
{
    char id[16], steps[16], nproc[16];
    snprintf(id, sizeof id, "c%d", index);
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(nproc, sizeof nproc, "%d", P);
    char *head[] = {"pipeline", (char *)o->a.job_path};
    char *tail[] = {"--steps", steps, "--child", "1", "--child-nproc", nproc};
    const dt_bench_words parts[] = {{head, 2}, {o->a.overrides, o->a.n_overrides}, {cfg, ncfg},
                                    {tail, 6}};
    stage_results sr = {res, P};
    return dt_bench_config("pipeline", "pipeline", true, parts, 4, dir, id, P, read_stage, &sr);
}

/* The command line's limits beyond dt_bench_main_run's, and the lists parsed into o->Ps, o->Ms
 * (0, or 2 after saying why). */
static int check(void *arg)
{
    bench_opts *o = arg;
    o->nP = parse_list(o->stages, o->Ps, MAX_LIST);
    o->nM = parse_list(o->micro, o->Ms, MAX_LIST);
    if (o->steps < 1 || o->nP < 0 || o->nM < 0) {
        usage(stderr);
        return 2;
    }
    for (int i = 0; i < o->nP; i++)
        if (o->Ps[i] < 2 || o->Ps[i] > MAX_P) {
            fprintf(stderr, "dtrain bench pipeline: --stages %d: use 2 to %d\n", o->Ps[i],
                    MAX_P);
            return 2;
        }
    return 0;
}

/* The parent: every (P, M, schedule) in turn, outputs under dir, a row each. */
static int run_parent(void *arg, const char *dir)
{
    const bench_opts o = *(const bench_opts *)arg;
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    if (dt_bench_parent_job("pipeline", o.a.job_path, o.a.overrides, o.a.n_overrides, NULL, 0, &job))
        return 1;
    const int *Ps = o.Ps, *Ms = o.Ms, nP = o.nP, nM = o.nM;
    bool tokens = job.model_type == DT_MODEL_GPT;
    printf("# dtrain bench pipeline %s: model %s, batch %d per pipeline, %d step(s) per "
           "configuration (the first not counted), device %s\n",
           o.a.job_path, dt_model_name(job.model_type), job.batch_size, o.steps,
           dt_device_name(job.device));
    printf("# idle: 1 - (time in the stage's forward and backward) / (micro-step time), per "
           "stage; formula: (P-1)/(M+P-1), stages of equal cost; simulated: the schedule "
           "replayed with each stage's measured forward and backward times and free "
           "communication (what uneven stages alone make); act0: stage 0's activations alive "
           "at once (micro-batches x one micro-batch's), MiB; act0 all: all it allocated\n");
    printf("%2s %3s %-6s %-27s %-27s %8s %11s %6s %8s %8s %12s\n", "P", "M", "sched",
           "idle per stage", "simulated", "formula", tokens ? "tokens/s" : "samples/s", "slots0",
           "act0", "act0 all", "1f1b/gpipe");
    int failed = 0, index = 0;
    static const char *const scheds[2] = {"gpipe", "1f1b"};
    for (int pi = 0; pi < nP && !failed; pi++)
        for (int mi = 0; mi < nM && !failed; mi++) {
            int P = Ps[pi], M = Ms[mi];
            double gpipe_act0 = 0;
            for (int si = 0; si < 2 && !failed; si++) {
                char pb[32], mb[40], sb[40], nb[40];
                snprintf(pb, sizeof pb, "parallel.pipeline=%d", P);
                snprintf(nb, sizeof nb, "elastic.nproc_per_node=%d", P);
                snprintf(mb, sizeof mb, "parallel.micro_batches=%d", M);
                snprintf(sb, sizeof sb, "parallel.schedule=%s", scheds[si]);
                char *cfg[4] = {pb, mb, sb, nb};
                static dt_job cj;
                if (load_job(&o, cfg, 4, &cj, &errs, &err) != 0) {
                    printf("%2d %3d %-6s not supported: %s\n", P, M, scheds[si],
                           errs.count ? errs.lines[0] : err.msg);
                    continue;
                }
                result res[MAX_P];
                memset(res, 0, sizeof res);
                if (run_config(&o, P, cfg, 4, dir, index++, res) != 0) {
                    printf("%2d %3d %-6s FAILED: the run did not complete (its ranks' messages "
                           "are above)\n", P, M, scheds[si]);
                    failed = 1;
                    break;
                }
                char idle[64] = "", sim[64] = "";
                double tf[MAX_P], tb[MAX_P], span = 0, sidle[MAX_P];
                for (int s = 0; s < P; s++) {
                    tf[s] = res[s].fwd_s / M;
                    tb[s] = res[s].bwd_s / M;
                }
                dt_err serr = {0};
                bool simulated = dt_pp_simulate_stages(si == 0 ? DT_PP_GPIPE : DT_PP_1F1B, P, M,
                                                       tf, tb, &span, sidle, &serr) == 0;
                size_t n = 0, n2 = 0;
                for (int s = 0; s < P && n < sizeof idle && n2 < sizeof sim; s++) {
                    n += (size_t)snprintf(idle + n, sizeof idle - n, "%s%.3f", s ? " " : "",
                                          res[s].idle);
                    n2 += (size_t)snprintf(sim + n2, sizeof sim - n2, "%s%.3f", s ? " " : "",
                                           simulated ? sidle[s] : NAN);
                }
                char ratio[32] = "";
                if (si == 0)
                    gpipe_act0 = res[0].peak_act_bytes;
                else if (gpipe_act0 > 0)
                    snprintf(ratio, sizeof ratio, "%.3f (P/M %.3f)",
                             res[0].peak_act_bytes / gpipe_act0,
                             (double)P / (double)M > 1 ? 1.0 : (double)P / (double)M);
                printf("%2d %3d %-6s %-27s %-27s %8.3f %11.1f %6d %8.3f %8.3f %12s\n", P, M,
                       scheds[si], idle, sim, dt_pp_bubble_formula(P, M),
                       res[P - 1].items_per_s, res[0].peak_in_flight,
                       res[0].peak_act_bytes / MIB, res[0].act_bytes / MIB, ratio);
                fflush(stdout);
            }
        }
    return failed;
}

int dt_bench_pipeline(int argc, char **argv)
{
    bench_opts o = {.steps = 4, .stages = "2,4", .micro = "1,2,4,8,16"};
    const dt_bench_opt opts[] = {
        {"--steps", &o.steps, NULL},
        {"--stages", NULL, &o.stages},
        {"--micro", NULL, &o.micro},
        {"--child-nproc", &o.nproc, NULL},
    };
    const dt_bench_main m = {.name = "pipeline", .tag = "pipeline", .opts = opts,
                             .nopts = (int)DT_ARRAY_LEN(opts), .print_usage = usage, .o = &o,
                             .args = &o.a, .check = check, .run_child = run_child,
                             .run_parent = run_parent};
    return dt_bench_main_run(&m, argc, argv);
}
