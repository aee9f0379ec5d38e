/* bench_memory.c - `dtrain bench memory JOB.ini [--nproc N] [--steps S] [overrides]`: the memory
 * each rank holds, by category, measured by the backend's allocator (kernels/backend_ops.h,
 * dt_mem_stats), for every ZeRO stage (parallel.zero = 0..3) and activation recomputation
 * (train.recompute = none | block), beside what the ZeRO paper's formulas predict.
 *
 * Every configuration runs the real trainer (worker.h: dt_trainer_init, dt_trainer_step) on N
 * ranks, processes of their own (fork + exec of this binary, as `bench dp-vs-ddp` runs its DDP
 * ranks) with a communicator over an in-process store, for a few steps. Each rank reports the
 * peak bytes of each category (parameters, gradients, optimiser state, activations,
 * communication buffers, other) during the steps (the peaks are reset once the trainer is set
 * up: ZeRO-3 initialises the whole model before it keeps its shard), the peak of the total, and
 * its mean step time after the first step.
 *
 * The configurations are asked of the configuration itself: the bench passes
 * `parallel.zero=K train.recompute=X` as overrides, and a combination the job file loader
 * rejects (a key this build does not know, a value it refuses) is printed as "not supported"
 * with the loader's own message, never run or estimated. Stage 0 and recompute = none are what
 * a build without those keys does anyway, so for them a rejected key is left out instead (and
 * the header says so). When the keys exist, every stage and mode they accept is measured.
 *
 * Predictions (per rank, Ψ parameters, N ranks, dtrain's fp32 master weights and gradients, k
 * optimiser bytes per parameter: AdamW 8, SGD with momentum 4, plain SGD 0):
 *   stage 0: params 4Ψ, grads 4Ψ, optim kΨ;  stage 1: optim kΨ/N;  stage 2: also grads 4Ψ/N;
 *   stage 3: also params 4Ψ/N, plus two blocks of gathered parameters (2 x 4 x the largest
 *   block's parameters: the one computed and the one prefetched).
 * The ratio column is measured / predicted for the model states (params + grads + optim).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "rendezvous/store_server.h"
#include "runtime/job/config.h"
#include "runtime/train/worker.h"

#define MAX_RANKS 64
#define MIB (1024.0 * 1024.0)

typedef struct bench_opts {
    const char *job_path;
    char **overrides; /* the user's, then (children) the configuration's */
    int n_overrides;
    int nproc;
    int steps;
    /* child mode */
    const char *child; /* "1" */
    int rank;
    int port;
    const char *run_id;
    const char *out;
} bench_opts;

/* What one rank measured. */
typedef struct result {
    uint64_t num_params;   /* Ψ: the whole model's (its tensor table), not a shard */
    uint64_t block_params; /* the largest block's parameters (tensors named "a.N.*") */
    double step_s;         /* mean step time after the first step */
    double peak[DT_MEM_CAT_COUNT];
    double total_peak;
} result;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench memory JOB.ini [--nproc N] [--steps S] [section.key=value ...]\n"
            "\n"
            "  --nproc N   ranks per configuration (default 2)\n"
            "  --steps S   training steps per configuration (default 3; the first is not timed)\n"
            "\n"
            "Runs the job for every parallel.zero (0..3) x train.recompute (none, block) the\n"
            "configuration accepts and prints each rank's memory by category, measured by the\n"
            "backend's allocator, beside the ZeRO paper's prediction.\n");
}

/* ---- the children ---------------------------------------------------------------------------- */

static int load_job(const bench_opts *o, char *const *more, int n_more, dt_job *job,
                    dt_config_errors *errs, dt_err *err)
{
    memset(errs, 0, sizeof *errs);
    char **ov = calloc((size_t)(o->n_overrides + n_more) + 1, sizeof *ov);
    if (!ov)
        return dt_err_set(err, -ENOMEM, "out of memory");
    memcpy(ov, o->overrides, sizeof *ov * (size_t)o->n_overrides);
    if (n_more)
        memcpy(ov + o->n_overrides, more, sizeof *ov * (size_t)n_more); /* later ones win */
    int rc = dt_job_load(job, o->job_path, ov, o->n_overrides + n_more, errs, err);
    free(ov);
    return rc;
}

/* Tensors named "<a>.<N>.<rest>" with N a number form block "<a>.<N>"; the largest block's
 * parameter count, 0 when no tensor is named so. */
static uint64_t largest_block(const dt_model *m)
{
    uint64_t best = 0;
    for (int i = 0; i < m->num_tensors; i++) {
        const char *n = m->tensors[i].name, *d1 = strchr(n, '.');
        if (!d1 || d1[1] < '0' || d1[1] > '9')
            continue;
        const char *d2 = strchr(d1 + 1, '.');
        if (!d2)
            continue;
        size_t plen = (size_t)(d2 - n);
        bool seen = false; /* counted with an earlier tensor of the same block */
        for (int j = 0; j < i && !seen; j++)
            seen = !strncmp(m->tensors[j].name, n, plen) && m->tensors[j].name[plen] == '.';
        if (seen)
            continue;
        uint64_t sum = 0;
        for (int j = i; j < m->num_tensors; j++)
            if (!strncmp(m->tensors[j].name, n, plen) && m->tensors[j].name[plen] == '.')
                sum += m->tensors[j].numel;
        best = DT_MAX(best, sum);
    }
    return best;
}

static int write_result(const char *path, const result *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "%llu %llu %.9g %.17g", (unsigned long long)r->num_params,
            (unsigned long long)r->block_params, r->step_s, r->total_peak);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        fprintf(f, " %.17g", r->peak[c]);
    fprintf(f, "\n");
    return fclose(f) ? -errno : 0;
}

static int read_result(const char *path, result *r)
{
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -ENOENT;
    unsigned long long np = 0, bp = 0;
    int ok = fscanf(f, "%llu %llu %lf %lf", &np, &bp, &r->step_s, &r->total_peak) == 4;
    for (int c = 0; ok && c < DT_MEM_CAT_COUNT; c++)
        ok = fscanf(f, "%lf", &r->peak[c]) == 1;
    fclose(f);
    r->num_params = np;
    r->block_params = bp;
    return ok ? 0 : -EPROTO;
}

/* One rank: the job with the configuration's overrides (already in o->overrides), S steps, no
 * checkpoint, no metrics file. */
static int run_child(const bench_opts *o)
{
    static dt_job job;
    static dt_trainer t;
    static dt_config_errors errs;
    dt_err err = {0};
    bool built = false;
    int rc;
    char steps[32], outdir[1300];
    snprintf(steps, sizeof steps, "train.steps=%d", o->steps);
    snprintf(outdir, sizeof outdir, "job.output_dir=%s.run", o->out);
    char *more[] = {steps, outdir, "checkpoint.resume=never", "checkpoint.every=0",
                    "train.eval_every=0"};
    if ((rc = load_job(o, more, 5, &job, &errs, &err))) {
        for (int i = 0; i < errs.count && i < 64; i++)
            fprintf(stderr, "%s\n", errs.lines[i]);
        goto out;
    }
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.world_size = o->nproc;
    env.rank = o->rank;
    env.local_world_size = o->nproc;
    env.local_rank = o->rank;
    dt_strlcpy(env.run_id, o->run_id ? o->run_id : "bench-memory", sizeof env.run_id);
    if (o->nproc > 1) {
        dt_strlcpy(env.store_addr, "127.0.0.1", sizeof env.store_addr);
        env.store_port = o->port;
    }
    if ((rc = dt_trainer_init(&t, &job, &env, &err)))
        goto out;
    built = true;
    /* the steps' peaks: set-up may hold what it needs once (ZeRO-3 draws the whole model, then
     * keeps its shard) */
    dt_mem_reset_peak(t.be);
    result res;
    memset(&res, 0, sizeof res);
    double timed = 0;
    for (int step = 0; step < o->steps; step++) {
        if ((rc = dt_trainer_step(&t, &err)))
            goto out;
        if (step > 0)
            timed += t.step_time_s;
    }
    res.step_s = o->steps > 1 ? timed / (o->steps - 1) : t.step_time_s;
    for (int i = 0; i < t.model->num_tensors; i++)
        res.num_params += t.model->tensors[i].numel;
    res.block_params = largest_block(t.model);
    dt_mem_stats ms;
    dt_mem_read(t.be, &ms);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        res.peak[c] = (double)ms.peak[c];
    res.total_peak = (double)ms.total_peak;
    if ((rc = write_result(o->out, &res)) != 0)
        dt_err_errno(&err, -rc, "writing %s", o->out);
out:
    if (rc)
        fprintf(stderr, "dtrain bench memory (rank %d): %s\n", o->rank, err.msg);
    if (built)
        dt_trainer_close(&t);
    return rc ? 1 : 0;
}

/* ---- the parent ------------------------------------------------------------------------------ */

/* Runs one configuration (its overrides cfg[0..ncfg)) on o->nproc ranks; res[0..nproc). */
static int run_config(const bench_opts *o, char *const *cfg, int ncfg, const char *dir,
                      int index, result *res)
{
    dt_store_server *srv = NULL;
    char port[16] = "0", run_id[64], steps[16], nproc[16];
    snprintf(run_id, sizeof run_id, "bench-memory-%d-%d", (int)getpid(), index);
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(nproc, sizeof nproc, "%d", o->nproc);
    if (o->nproc > 1) {
        dt_store_server_opts so;
        dt_store_server_opts_default(&so);
        so.host = "127.0.0.1";
        so.port = 0;
        dt_err err = {0};
        if (dt_store_server_start(&srv, &so, &err) != 0) {
            fprintf(stderr, "dtrain bench memory: %s\n", err.msg);
            return 1;
        }
        snprintf(port, sizeof port, "%d", dt_store_server_port(srv));
    }
    char **av = calloc((size_t)(o->n_overrides + ncfg) + 24, sizeof *av);
    if (!av) {
        dt_store_server_stop(srv);
        return 1;
    }
    int k = 0;
    av[k++] = (char *)dt_cmd_self_path();
    av[k++] = "bench";
    av[k++] = "memory";
    av[k++] = (char *)o->job_path;
    for (int i = 0; i < o->n_overrides; i++)
        av[k++] = o->overrides[i];
    for (int i = 0; i < ncfg; i++)
        av[k++] = cfg[i];
    av[k++] = "--nproc";
    av[k++] = nproc;
    av[k++] = "--steps";
    av[k++] = steps;
    av[k++] = "--child";
    av[k++] = "1";
    av[k++] = "--child-rank";
    const int rank_slot = k++;
    av[k++] = "--child-port";
    av[k++] = port;
    av[k++] = "--child-run-id";
    av[k++] = run_id;
    av[k++] = "--child-out";
    const int out_slot = k++;
    av[k] = NULL;
    char prefix[1100];
    int status[MAX_RANKS];
    snprintf(prefix, sizeof prefix, "%s/c%d.", dir, index);
    int failed = dt_bench_run_ranks(av, rank_slot, out_slot, prefix, o->nproc, status);
    free(av);
    for (int r = 0; r < o->nproc && !failed; r++) {
        char out[1200];
        snprintf(out, sizeof out, "%s%d", prefix, r);
        failed = read_result(out, &res[r]) != 0;
    }
    dt_store_server_stop(srv);
    return failed;
}

/* The configuration's overrides for (stage, recompute), as the loader accepts them: 0 when the
 * job loads with them; else, for stage 0 / recompute none (what a build without the key does),
 * the same without the rejected key; else the loader's messages in why, for the overrides that
 * matter (zero=1 recompute=none is refused for its parallel.zero only, when recompute=none
 * loads without its key). */
static int resolve_config(const bench_opts *o, int stage, const char *rec, char *zbuf,
                          char *rbuf, char **cfg, int *ncfg, char *why, size_t why_cap,
                          bool *dropped_zero, bool *dropped_rec)
{
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    snprintf(zbuf, 32, "parallel.zero=%d", stage);
    snprintf(rbuf, 48, "train.recompute=%s", rec);
    /* try with both keys, then without those that default to what the build does anyway */
    for (int drop = 0; drop < 4; drop++) {
        bool dz = drop & 1, dr = drop & 2;
        if ((dz && stage != 0) || (dr && strcmp(rec, "none") != 0))
            continue;
        int n = 0;
        if (!dz)
            cfg[n++] = zbuf;
        if (!dr)
            cfg[n++] = rbuf;
        if (load_job(o, cfg, n, &job, &errs, &err) == 0) {
            *ncfg = n;
            *dropped_zero = dz;
            *dropped_rec = dr;
            return 0;
        }
        { /* the loader's messages; the last attempt's (the fewest keys asked) stay */
            size_t k = 0;
            why[0] = '\0';
            for (int i = 0; i < errs.count && i < 64 && k < why_cap; i++)
                k += (size_t)snprintf(why + k, why_cap - k, "%s%s", i ? "; " : "",
                                      errs.lines[i]);
            if (!errs.count)
                snprintf(why, why_cap, "%s", err.msg);
        }
    }
    return -EINVAL;
}

/* Predicted bytes per rank of (params, grads, optim) for stage on n ranks. */
static void predict(uint64_t psi, uint64_t block, int k_optim, int stage, int n, double out[3])
{
    double p = (double)psi;
    out[0] = stage >= 3 ? 4.0 * p / n + 2.0 * 4.0 * (double)block : 4.0 * p;
    out[1] = stage >= 2 ? 4.0 * p / n : 4.0 * p;
    out[2] = stage >= 1 ? (double)k_optim * p / n : (double)k_optim * p;
}

int dt_bench_memory(int argc, char **argv)
{
    bench_opts o = {.nproc = 2, .steps = 3};
    char **ovr = calloc((size_t)argc + 1, sizeof *ovr);
    if (!ovr)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            free(ovr);
            return 0;
        }
        int *ip = !strcmp(a, "--nproc")        ? &o.nproc
                  : !strcmp(a, "--steps")      ? &o.steps
                  : !strcmp(a, "--child-rank") ? &o.rank
                  : !strcmp(a, "--child-port") ? &o.port
                                               : NULL;
        const char **sp = !strcmp(a, "--child")          ? &o.child
                          : !strcmp(a, "--child-run-id") ? &o.run_id
                          : !strcmp(a, "--child-out")    ? &o.out
                                                         : NULL;
        if (ip || sp) {
            if (!v || (ip && (dt_parse_int(v, ip) || *ip < 0))) {
                fprintf(stderr, "dtrain bench memory: %s needs a %s\n", a,
                        ip ? "number" : "value");
                free(ovr);
                return 2;
            }
            if (sp)
                *sp = v;
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "dtrain bench memory: unknown option %s\n", a);
            usage(stderr);
            free(ovr);
            return 2;
        } else if (strchr(a, '=')) {
            ovr[o.n_overrides++] = (char *)a;
        } else if (!o.job_path) {
            o.job_path = a;
        } else {
            fprintf(stderr, "dtrain bench memory: one job file only (%s, %s)\n", o.job_path, a);
            free(ovr);
            return 2;
        }
    }
    o.overrides = ovr;
    if (!o.job_path || o.nproc < 1 || o.nproc > MAX_RANKS || o.steps < 1) {
        usage(stderr);
        free(ovr);
        return 2;
    }
    dt_log_init();
    if (o.child) {
        dt_log_set_rank(o.rank);
        int rc = run_child(&o);
        free(ovr);
        return rc;
    }

    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    if (load_job(&o, NULL, 0, &job, &errs, &err) != 0) {
        for (int i = 0; i < errs.count && i < 64; i++)
            fprintf(stderr, "%s\n", errs.lines[i]);
        fprintf(stderr, "dtrain bench memory: %s\n", err.msg);
        free(ovr);
        return 1;
    }
    const int k_optim = job.optimizer == DT_OPTIM_ADAMW ? 8 : job.momentum > 0 ? 4 : 0;
    char dir[] = "/tmp/dtrain-memory-XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        free(ovr);
        return 1;
    }
    printf("# dtrain bench memory %s: model %s, %d rank(s), batch %d per rank, %d step(s) per "
           "configuration (step time: mean after the first), device %s, optimizer %s\n",
           o.job_path, dt_model_name(job.model_type), o.nproc, job.batch_size, o.steps,
           dt_device_name(job.device), dt_optim_name(job.optimizer));
    printf("# MiB per rank, peak of each category as the backend's allocator measured it; "
           "comm = communication buffers (DDP staging, communicator memory)\n");
    printf("# predicted (ZeRO paper, fp32 master weights and gradients as dtrain keeps them): "
           "params 4Ψ, grads 4Ψ, optim %dΨ; stage 1 divides optim by N, stage 2 also grads, "
           "stage 3 also params (+ 2 blocks of 4 x block params gathered)\n",
           k_optim);

    static const char *const recs[2] = {"none", "block"};
    enum { NCONF = 8 };
    result *res = calloc((size_t)NCONF * MAX_RANKS, sizeof *res);
    bool ran[NCONF] = {false};
    int failed = !res;
    double base_step = 0; /* stage 0, recompute none: the mean over ranks */
    bool notes_zero = false, notes_rec = false, header = false;
    for (int ci = 0; ci < NCONF && !failed; ci++) {
        int stage = ci / 2;
        const char *rec = recs[ci % 2];
        char zbuf[32], rbuf[48], why[2048], *cfg[2];
        int ncfg = 0;
        bool dz = false, dr = false;
        char label[64];
        snprintf(label, sizeof label, "zero=%d recompute=%s", stage, rec);
        if (resolve_config(&o, stage, rec, zbuf, rbuf, cfg, &ncfg, why, sizeof why, &dz, &dr)) {
            printf("%-26s not supported: %s\n", label, why);
            continue;
        }
        notes_zero |= dz;
        notes_rec |= dr;
        result *r = res + (size_t)ci * MAX_RANKS;
        if (run_config(&o, cfg, ncfg, dir, ci, r) != 0) {
            printf("%-26s FAILED: the run did not complete (its ranks' messages are above)\n",
                   label);
            failed = 1;
            break;
        }
        ran[ci] = true;
        double mean_step = 0;
        for (int k = 0; k < o.nproc; k++)
            mean_step += r[k].step_s / o.nproc;
        if (ci == 0)
            base_step = mean_step;
        if (!header) {
            printf("# Ψ = %llu parameters; largest block %llu parameters\n#\n",
                   (unsigned long long)r[0].num_params, (unsigned long long)r[0].block_params);
            printf("%-26s %4s %9s %9s %9s %9s %9s %9s %9s | %9s %9s %9s %7s | %9s %7s\n",
                   "configuration", "rank", "params", "grads", "optim", "acts", "comm", "other",
                   "total", "p.params", "p.grads", "p.optim", "ratio", "step(ms)", "vs z0");
            header = true;
        }
        for (int k = 0; k < o.nproc; k++) {
            double pred[3];
            predict(r[k].num_params, r[k].block_params, k_optim, stage, o.nproc, pred);
            double states = r[k].peak[DT_MEM_PARAMS] + r[k].peak[DT_MEM_GRADS] +
                            r[k].peak[DT_MEM_OPTIM];
            double pstates = pred[0] + pred[1] + pred[2];
            char vs[16] = "-";
            if (base_step > 0)
                snprintf(vs, sizeof vs, "%.2fx", r[k].step_s / base_step);
            printf("%-26s %4d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f | %9.3f %9.3f %9.3f "
                   "%7.4f | %9.2f %7s\n",
                   k == 0 ? label : "", k, r[k].peak[DT_MEM_PARAMS] / MIB,
                   r[k].peak[DT_MEM_GRADS] / MIB, r[k].peak[DT_MEM_OPTIM] / MIB,
                   r[k].peak[DT_MEM_ACTS] / MIB, r[k].peak[DT_MEM_COMM] / MIB,
                   r[k].peak[DT_MEM_OTHER] / MIB, r[k].total_peak / MIB, pred[0] / MIB,
                   pred[1] / MIB, pred[2] / MIB, pstates > 0 ? states / pstates : 0,
                   r[k].step_s * 1e3, vs);
        }
    }
    if (!failed) {
        /* exact bytes of the model states of every rank that ran, for scripts and tests */
        printf("#\n# bytes (rank: params grads optim; predicted params grads optim):\n");
        for (int ci = 0; ci < NCONF; ci++) {
            if (!ran[ci])
                continue;
            const result *r = res + (size_t)ci * MAX_RANKS;
            for (int k = 0; k < o.nproc; k++) {
                double pred[3];
                predict(r[k].num_params, r[k].block_params, k_optim, ci / 2, o.nproc, pred);
                printf("# zero=%d recompute=%s rank %d: %.0f %.0f %.0f; predicted %.0f %.0f "
                       "%.0f\n",
                       ci / 2, recs[ci % 2], k, r[k].peak[DT_MEM_PARAMS],
                       r[k].peak[DT_MEM_GRADS], r[k].peak[DT_MEM_OPTIM], pred[0], pred[1],
                       pred[2]);
            }
        }
        if (notes_zero)
            printf("# parallel.zero is not a key of this build: stage 0 ran without it (what "
                   "the build does)\n");
        if (notes_rec)
            printf("# train.recompute is not a key of this build: recompute = none ran "
                   "without it (what the build does)\n");
    }
    free(res);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "dtrain bench memory: could not remove %s\n", dir);
    free(ovr);
    return failed;
}
