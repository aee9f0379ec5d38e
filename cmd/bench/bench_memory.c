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
#include <math.h>
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
#define MAX_REPEAT 16
#define MIB (1024.0 * 1024.0)

typedef struct bench_opts {
    dt_bench_args a; /* the job, the overrides and the child's arguments (cmd.h) */
    int nproc;
    int steps;
    int repeat;        /* passes over the configurations, interleaved (step time: median) */
} bench_opts;

/* What one rank measured. */
typedef struct result {
    uint64_t num_params;   /* Ψ: the whole model's (its tensor table), not a shard */
    uint64_t block_params; /* the largest block's parameters (tensors named "a.N.*") */
    double step_s;         /* mean step time after the first step */
    double peak[DT_MEM_CAT_COUNT]; /* over the steps after the first (all, with one step) */
    double total_peak;
    double first_total_peak;       /* over the first step: ZeRO moves its shards then */
    double save_total_peak;        /* over a checkpoint save after the last step, written */
} result;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench memory JOB.ini [--nproc N] [--steps S] [section.key=value ...]\n"
            "\n"
            "  --nproc N   ranks per configuration (default 2)\n"
            "  --steps S   training steps per configuration (default 3; the first is not timed)\n"
            "  --repeat R  run all the configurations R times, one pass after the other, so\n"
            "              that a slow phase of a shared machine hits every configuration alike;\n"
            "              step time is the median of the passes, beside their min and max\n"
            "              (default 1)\n"
            "\n"
            "Runs the job for every parallel.zero (0..3) x train.recompute (none, block) the\n"
            "configuration accepts and prints each rank's memory by category, measured by the\n"
            "backend's allocator, beside the ZeRO paper's prediction.\n");
}

/* ---- the children ---------------------------------------------------------------------------- */

static int load_job(const bench_opts *o, char *const *more, int n_more, dt_job *job,
                    dt_config_errors *errs, dt_err *err)
{
    return dt_bench_load_job(o->a.job_path, o->a.overrides, o->a.n_overrides, more, n_more, job, errs,
                             err);
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
    fprintf(f, "%llu %llu %.9g %.17g %.17g %.17g", (unsigned long long)r->num_params,
            (unsigned long long)r->block_params, r->step_s, r->total_peak, r->first_total_peak,
            r->save_total_peak);
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        fprintf(f, " %.17g", r->peak[c]);
    fprintf(f, "\n");
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
    unsigned long long np = 0, bp = 0;
    int ok = fscanf(f, "%llu %llu %lf %lf %lf %lf", &np, &bp, &r->step_s, &r->total_peak,
                    &r->first_total_peak, &r->save_total_peak) == 6;
    for (int c = 0; ok && c < DT_MEM_CAT_COUNT; c++)
        ok = fscanf(f, "%lf", &r->peak[c]) == 1;
    fclose(f);
    r->num_params = np;
    r->block_params = bp;
    return ok ? 0 : -EPROTO;
}

/* One rank: the job with the configuration's overrides (already in o->a.overrides), S steps, no
 * metrics file, then one checkpoint save (in the job's format: checkpoint.sharded), its peak
 * apart. */
static int run_child(void *arg)
{
    const bench_opts *o = arg;
    static dt_job job;
    static dt_trainer t;
    dt_err err = {0};
    bool built = false;
    int rc;
    /* one checkpoint directory for the configuration's ranks (a sharded save's files meet
     * there): the result file's name without its ".<rank>" */
    char ckdir[1300], **ov = calloc((size_t)o->a.n_overrides + 1, sizeof *ov);
    const char *dot = strrchr(o->a.out, '.');
    snprintf(ckdir, sizeof ckdir, "checkpoint.dir=%.*s.ckpt",
             (int)(dot ? (size_t)(dot - o->a.out) : strlen(o->a.out)), o->a.out);
    if (!ov) {
        rc = dt_err_set(&err, -ENOMEM, "out of memory");
        goto out;
    }
    for (int i = 0; i < o->a.n_overrides; i++)
        ov[i] = o->a.overrides[i];
    ov[o->a.n_overrides] = ckdir;
    rc = dt_bench_child_trainer(&t, &job, o->a.job_path, ov, o->a.n_overrides + 1, o->steps,
                                o->a.out, o->a.rank, o->nproc, o->a.port,
                                o->a.run_id ? o->a.run_id : "bench-memory", &err);
    free(ov);
    if (rc)
        goto out;
    built = true; /* the trainer reset the peaks: set-up's transients are left out */
    result res;
    memset(&res, 0, sizeof res);
    double timed = 0;
    dt_mem_stats ms;
    for (int step = 0; step < o->steps; step++) {
        if ((rc = dt_trainer_step(&t, &err)))
            goto out;
        if (step > 0)
            timed += t.step_time_s;
        if (step == 0 && o->steps > 1) {
            /* the first step builds what the rest reuse (ZeRO-1/2 rebuild their buckets from
             * the ready order and move the shards to them): its peak is kept
             * apart, and the columns are the steady state, as the step time is */
            dt_mem_read(t.be, &ms);
            res.first_total_peak = (double)ms.total_peak;
            dt_mem_reset_peak(t.be);
        }
    }
    res.step_s = o->steps > 1 ? timed / (o->steps - 1) : t.step_time_s;
    for (int i = 0; i < t.model->num_tensors; i++)
        res.num_params += t.model->tensors[i].numel;
    res.block_params = largest_block(t.model);
    dt_mem_read(t.be, &ms);
    if (o->steps == 1)
        res.first_total_peak = (double)ms.total_peak;
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        res.peak[c] = (double)ms.peak[c];
    res.total_peak = (double)ms.total_peak;
    /* a save of the last step, as checkpoint.every would make it (every rank at once), until
     * it is written: its peak is a column of its own */
    dt_mem_reset_peak(t.be);
    if ((rc = dt_trainer_save(&t, &err)))
        goto out;
    dt_mem_read(t.be, &ms);
    res.save_total_peak = (double)ms.total_peak;
    if ((rc = write_result(o->a.out, &res)) != 0)
        dt_err_errno(&err, -rc, "writing %s", o->a.out);
out:
    if (rc)
        fprintf(stderr, "dtrain bench memory (rank %d): %s\n", o->a.rank, err.msg);
    if (built)
        dt_trainer_close(&t);
    return rc ? 1 : 0;
}

/* ---- the parent ------------------------------------------------------------------------------ */

/* Runs one configuration (its overrides cfg[0..ncfg)) on o->nproc ranks; res[0..nproc). */
static int run_config(const bench_opts *o, char *const *cfg, int ncfg, const char *dir,
                      int index, result *res)
{
    char id[16], steps[16], nproc[16];
    snprintf(id, sizeof id, "c%d", index);
    snprintf(steps, sizeof steps, "%d", o->steps);
    snprintf(nproc, sizeof nproc, "%d", o->nproc);
    char *head[] = {"memory", (char *)o->a.job_path};
    char *tail[] = {"--nproc", nproc, "--steps", steps, "--child", "1"};
    const dt_bench_words parts[] = {{head, 2}, {o->a.overrides, o->a.n_overrides}, {cfg, ncfg},
                                    {tail, 6}};
    return dt_bench_config("memory", "memory", o->nproc > 1, parts, 4, dir, id, o->nproc,
                           read_result, res);
}

/* The configuration's overrides for (stage, recompute), as the loader accepts them: 0 when the
 * job loads with them; else, for stage 0 / recompute none (what a build without the key does),
 * the same without the rejected key; else the loader's messages in why, for the overrides that
 * matter (zero=1 recompute=none is refused for its parallel.zero only, when recompute=none
 * loads without its key). */
static int resolve_config(const bench_opts *o, int stage, const char *rec, char *zbuf,
                          char *rbuf, char *nbuf, char **cfg, int *ncfg, char *why,
                          size_t why_cap, bool *dropped_zero, bool *dropped_rec)
{
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    snprintf(zbuf, 32, "parallel.zero=%d", stage);
    snprintf(rbuf, 48, "train.recompute=%s", rec);
    /* the world the ranks form: parallel.tensor and parallel.pipeline are checked against it */
    snprintf(nbuf, 48, "elastic.nproc_per_node=%d", o->nproc);
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
        cfg[n++] = nbuf;
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

/* The parent: every configuration in turn (its ranks, outputs under dir), then the tables. */
static int run_parent(void *arg, const char *dir)
{
    const bench_opts o = *(const bench_opts *)arg;
    static dt_job job;
    char nproc_ov[48];
    snprintf(nproc_ov, sizeof nproc_ov, "elastic.nproc_per_node=%d", o.nproc);
    char *more[] = {nproc_ov};
    if (dt_bench_parent_job("memory", o.a.job_path, o.a.overrides, o.a.n_overrides, more, 1,
                            &job))
        return 1;
    const int k_optim = job.optimizer == DT_OPTIM_ADAMW ? 8 : job.momentum > 0 ? 4 : 0;
    printf("# dtrain bench memory %s: model %s, %d rank(s), batch %d per rank, %d step(s) per "
           "configuration (step time: mean after the first), device %s, optimizer %s\n",
           o.a.job_path, dt_model_name(job.model_type), o.nproc, job.batch_size, o.steps,
           dt_device_name(job.device), dt_optim_name(job.optimizer));
    printf("# MiB per rank, peak of each category as the backend's allocator measured it over the "
           "steps after the first (set-up excluded); comm = communication buffers (DDP staging, "
           "communicator memory); other = the rest (ZeRO's checkpoint staging while it holds "
           "data, the checkpoint writer's buffer); 1st step = the total's peak in the first step, "
           "when ZeRO-1/2 rebuild their buckets and move the shards through one I/O buffer; "
           "save = the total's peak over a checkpoint save after the last step (%s format, "
           "written before it is measured); target for both: at most the steady total + "
           "checkpoint.io_buffer_mb = %d MiB (+ 64 KiB of collective scratch)\n",
           job.ckpt_sharded ? "sharded" : "whole-tensor", job.ckpt_io_buffer_mb);
    printf("# predicted (ZeRO paper, fp32 master weights and gradients as dtrain keeps them): "
           "params 4Ψ, grads 4Ψ, optim %dΨ; stage 1 divides optim by N, stage 2 also grads, "
           "stage 3 also params (+ 2 blocks of 4 x block params gathered)\n",
           k_optim);

    static const char *const recs[2] = {"none", "block"};
    enum { NCONF = 8 };
    /* res[(rep * NCONF + ci) * MAX_RANKS + rank] */
    result *res = calloc((size_t)o.repeat * NCONF * MAX_RANKS, sizeof *res);
    bool ran[NCONF] = {false}, ok[NCONF] = {false};
    char zbufs[NCONF][32], rbufs[NCONF][48], nbufs[NCONF][48], *cfgs[NCONF][3];
    char why[NCONF][2048];
    int ncfgs[NCONF] = {0};
    int failed = !res;
    bool notes_zero = false, notes_rec = false;
    for (int ci = 0; ci < NCONF && !failed; ci++) {
        bool dz = false, dr = false;
        ok[ci] = resolve_config(&o, ci / 2, recs[ci % 2], zbufs[ci], rbufs[ci], nbufs[ci],
                                cfgs[ci], &ncfgs[ci], why[ci], sizeof why[ci], &dz, &dr) == 0;
        notes_zero |= ok[ci] && dz;
        notes_rec |= ok[ci] && dr;
    }
    /* the passes: every supported configuration once per pass, in the same order */
    for (int rep = 0; rep < o.repeat && !failed; rep++) {
        for (int ci = 0; ci < NCONF && !failed; ci++) {
            if (!ok[ci])
                continue;
            if (o.repeat > 1)
                fprintf(stderr, "dtrain bench memory: pass %d/%d, zero=%d recompute=%s\n",
                        rep + 1, o.repeat, ci / 2, recs[ci % 2]);
            result *r = res + ((size_t)rep * NCONF + (size_t)ci) * MAX_RANKS;
            if (run_config(&o, cfgs[ci], ncfgs[ci], dir, rep * NCONF + ci, r) != 0) {
                printf("zero=%d recompute=%-6s FAILED: the run did not complete (its ranks' "
                       "messages are above)\n", ci / 2, recs[ci % 2]);
                failed = 1;
                break;
            }
            ran[ci] = rep == o.repeat - 1;
        }
    }
    /* per configuration and rank: the largest peaks of the passes (they differ only where
     * timing moves them: stage 2's gradient pages in flight), the median, min and max of the
     * step times */
    static result fin[NCONF][MAX_RANKS];
    static double med[NCONF][MAX_RANKS], lo[NCONF][MAX_RANKS], hi[NCONF][MAX_RANKS];
    double conf_step[NCONF] = {0}; /* the mean over ranks of each rank's median */
    for (int ci = 0; ci < NCONF && !failed; ci++) {
        if (!ran[ci])
            continue;
        for (int k = 0; k < o.nproc; k++) {
            double v[MAX_REPEAT];
            for (int rep = 0; rep < o.repeat; rep++)
                v[rep] = res[((size_t)rep * NCONF + (size_t)ci) * MAX_RANKS + (size_t)k].step_s;
            qsort(v, (size_t)o.repeat, sizeof *v, dt_cmp_double);
            med[ci][k] = o.repeat % 2 ? v[o.repeat / 2]
                                      : 0.5 * (v[o.repeat / 2 - 1] + v[o.repeat / 2]);
            lo[ci][k] = v[0];
            hi[ci][k] = v[o.repeat - 1];
            fin[ci][k] = res[(size_t)ci * MAX_RANKS + (size_t)k];
            for (int rep = 1; rep < o.repeat; rep++) {
                const result *x = &res[((size_t)rep * NCONF + (size_t)ci) * MAX_RANKS + (size_t)k];
                for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
                    fin[ci][k].peak[c] = DT_MAX(fin[ci][k].peak[c], x->peak[c]);
                fin[ci][k].total_peak = DT_MAX(fin[ci][k].total_peak, x->total_peak);
                fin[ci][k].first_total_peak =
                    DT_MAX(fin[ci][k].first_total_peak, x->first_total_peak);
                fin[ci][k].save_total_peak =
                    DT_MAX(fin[ci][k].save_total_peak, x->save_total_peak);
            }
            conf_step[ci] += med[ci][k] / o.nproc;
        }
    }
    const double base_step = conf_step[0]; /* stage 0, recompute none */
    bool header = false;
    for (int ci = 0; ci < NCONF && !failed; ci++) {
        int stage = ci / 2;
        char label[64];
        snprintf(label, sizeof label, "zero=%d recompute=%s", stage, recs[ci % 2]);
        if (!ok[ci]) {
            printf("%-26s not supported: %s\n", label, why[ci]);
            continue;
        }
        const result *r = fin[ci];
        if (!header) {
            printf("# \u03a8 = %llu parameters; largest block %llu parameters\n#\n",
                   (unsigned long long)r[0].num_params, (unsigned long long)r[0].block_params);
            printf("%-26s %4s %9s %9s %9s %9s %9s %9s %9s %9s %9s | %9s %9s %9s %7s | %9s %17s "
                   "%7s\n",
                   "configuration", "rank", "params", "grads", "optim", "acts", "comm", "other",
                   "total", "1st step", "save", "p.params", "p.grads", "p.optim", "ratio", "step(ms)",
                   o.repeat > 1 ? "min-max(ms)" : "", "vs z0");
            header = true;
        }
        for (int k = 0; k < o.nproc; k++) {
            double pred[3];
            predict(r[k].num_params, r[k].block_params, k_optim, stage, o.nproc, pred);
            double states = r[k].peak[DT_MEM_PARAMS] + r[k].peak[DT_MEM_GRADS] +
                            r[k].peak[DT_MEM_OPTIM];
            double pstates = pred[0] + pred[1] + pred[2];
            char vs[16] = "-", range[32] = "";
            if (base_step > 0)
                snprintf(vs, sizeof vs, "%.2fx", med[ci][k] / base_step);
            if (o.repeat > 1)
                snprintf(range, sizeof range, "%.0f-%.0f", lo[ci][k] * 1e3, hi[ci][k] * 1e3);
            printf("%-26s %4d %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f %9.3f | %9.3f "
                   "%9.3f %9.3f %7.4f | %9.2f %17s %7s\n",
                   k == 0 ? label : "", k, r[k].peak[DT_MEM_PARAMS] / MIB,
                   r[k].peak[DT_MEM_GRADS] / MIB, r[k].peak[DT_MEM_OPTIM] / MIB,
                   r[k].peak[DT_MEM_ACTS] / MIB, r[k].peak[DT_MEM_COMM] / MIB,
                   r[k].peak[DT_MEM_OTHER] / MIB, r[k].total_peak / MIB,
                   r[k].first_total_peak / MIB, r[k].save_total_peak / MIB, pred[0] / MIB,
                   pred[1] / MIB, pred[2] / MIB, pstates > 0 ? states / pstates : 0,
                   med[ci][k] * 1e3, range, vs);
        }
    }
    /* the targets, as ratios of what ran (rank 0's memory; step times: the mean over
     * ranks of the medians) */
    if (!failed) {
        printf("#\n# ratios (targets in brackets):\n");
        if (ran[0] && ran[2] && fin[0][0].peak[DT_MEM_OPTIM] > 0)
            printf("#   optimiser state, stage 1 / stage 0: %.4f (1/N = %.4f, within 2%%: %s)\n",
                   fin[2][0].peak[DT_MEM_OPTIM] / fin[0][0].peak[DT_MEM_OPTIM], 1.0 / o.nproc,
                   fabs(fin[2][0].peak[DT_MEM_OPTIM] / fin[0][0].peak[DT_MEM_OPTIM] * o.nproc -
                        1.0) <= 0.02 ? "yes" : "no");
        for (int st = 0; st < 4; st++) {
            int a = 2 * st, b = 2 * st + 1;
            if (!ran[a] || !ran[b] || fin[a][0].peak[DT_MEM_ACTS] <= 0 || conf_step[a] <= 0)
                continue;
            double dm = 1.0 - fin[b][0].peak[DT_MEM_ACTS] / fin[a][0].peak[DT_MEM_ACTS];
            double dt = conf_step[b] / conf_step[a] - 1.0;
            printf("#   zero=%d, recompute block vs none: activations -%.1f%% (>= 50%%: %s), "
                   "step time %+.1f%% (<= +35%%: %s)\n",
                   st, 100.0 * dm, dm >= 0.5 ? "yes" : "no", 100.0 * dt,
                   dt <= 0.35 ? "yes" : "no");
        }
        for (int st = 1; st < 4; st++) {
            for (int x = 0; x < 2; x++) {
                int c = 2 * st + x, c0 = x;
                if (!ran[c] || !ran[c0] || conf_step[c0] <= 0)
                    continue;
                double dt = conf_step[c] / conf_step[c0] - 1.0, lim = st == 3 ? 0.20 : 0.05;
                printf("#   zero=%d vs zero=0 (recompute %s): step time %+.1f%% (within %.0f%%: "
                       "%s)\n",
                       st, recs[x], 100.0 * dt, 100.0 * lim, fabs(dt) <= lim ? "yes" : "no");
            }
        }
        for (int ci = 0; ci < NCONF; ci++) { /* every rank: the first step, the save */
            if (!ran[ci])
                continue;
            /* the buffer, and a few bytes of collective scratch (a save's outcome) */
            const double io = (double)job.ckpt_io_buffer_mb * MIB + 65536;
            double first = 0, save = 0;
            bool fits = true;
            for (int k = 0; k < o.nproc; k++) {
                const result *r = &fin[ci][k];
                first = DT_MAX(first, r->first_total_peak - r->total_peak);
                save = DT_MAX(save, r->save_total_peak - r->total_peak);
                fits = fits && r->first_total_peak <= r->total_peak + io &&
                       r->save_total_peak <= r->total_peak + io;
            }
            printf("#   zero=%d recompute=%s: above the steady state, most of any rank: first "
                   "step %+.3f MiB, save %+.3f MiB (<= +%d MiB: %s)\n",
                   ci / 2, recs[ci % 2], first / MIB, save / MIB, job.ckpt_io_buffer_mb,
                   fits ? "yes" : "no");
        }
        if (o.repeat < 3)
            printf("#   (step times from %d pass(es): on a shared machine use --repeat 3 or "
                   "more and read the min-max spread before trusting a few per cent)\n",
                   o.repeat);
    }
    if (!failed) {
        /* exact bytes of the model states of every rank that ran, for scripts and tests */
        printf("#\n# bytes (rank: params grads optim; predicted params grads optim):\n");
        for (int ci = 0; ci < NCONF; ci++) {
            if (!ran[ci])
                continue;
            const result *r = fin[ci];
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
    return failed;
}

int dt_bench_memory(int argc, char **argv)
{
    bench_opts o = {.nproc = 2, .steps = 3, .repeat = 1};
    const dt_bench_opt opts[] = {
        {"--nproc", &o.nproc, NULL},
        {"--steps", &o.steps, NULL},
        {"--repeat", &o.repeat, NULL},
    };
    const dt_bench_main m = {.name = "memory", .tag = "memory", .opts = opts,
                             .nopts = (int)DT_ARRAY_LEN(opts), .print_usage = usage, .o = &o,
                             .args = &o.a, .check = check, .run_child = run_child,
                             .run_parent = run_parent};
    return dt_bench_main_run(&m, argc, argv);
}
