/* bench_dp_vs_ddp.c - `dtrain bench dp-vs-ddp JOB.ini`: DataParallel and DistributedDataParallel
 * on the same job, side by side, with a single worker as the baseline.
 *
 *   single  one process, one replica, batch B                     (the baseline)
 *   DP      one process driving N replicas on threads, batch N*B  (strategy dp, train/dp.c)
 *   DDP     N processes, one replica each, batch B each           (strategy ddp, train/ddp.c)
 *   indep   N processes, one replica each, batch B each, never synchronised
 * Every configuration runs the real trainer (worker.h: dt_trainer_init, dt_trainer_step), so what
 * is measured is what `dtrain` runs: the same step, through the strategy interface.
 * DP and DDP see the same global batch per step, so their throughput compares directly, and
 * DDP's against the single worker's is its scaling. "indep" is the ceiling for that scaling on
 * this machine: N single workers bound like DDP's ranks, started together and kept busy until
 * the last one has finished its timed steps, so each is timed under the same load; their
 * throughput is the sum of theirs. What DDP gets below it is the price of synchronising (the
 * all-reduce, and waiting for the slowest rank every step); what indep gets below N x single is
 * the machine (shared caches, memory bandwidth, unequal cores). Every configuration runs in
 * processes of its own (fork + exec of this binary), so CPU time and memory are measured per
 * configuration.
 *
 * Per replica peak memory is what the replica's backend allocated at most (parameters,
 * gradients, activations, optimiser state: everything the replica holds); its spread (max - min)
 * is DP's master imbalance. CPU utilisation is CPU time over wall time over the cores of this
 * machine. GPU utilisation is nvidia-smi's (the share of time a kernel ran, from the driver's
 * samples over the timed steps, common/nvml.h), averaged over the replicas; "-" where it cannot
 * be read (the CPU, no NVML).
 *
 * The seed's experiments (--model NAME): the seed measured DP against DDP on BERT-large (48 vs
 * 72 sentences/s on 8 V100s) and ResNet-50 (1250 vs 1820 images/s). --model resnet50 replaces
 * the job's model and data by torchvision's ResNet-50 on synthetic ImageNet-shaped images
 * (3x224x224, 1000 classes, batch 32 per replica) on a GPU, and on the CPU by ResNet-50 at a
 * quarter of the width on 3x32x32 (configs/resnet50.ini's shape, batch 16). --model bert-large replaces the job file's model by
 * BERT-large (with its NSP head, on the job's token data as masked-LM samples) and, after the
 * usual table, prints one row in the seed's columns (DP and DDP throughput in the seed's unit,
 * their ratio, utilisation, the memory spread between the busiest and the idlest replica)
 * beside the seed's figures. On a GPU (job.device = cuda, or auto with one visible) the model is
 * the real one (24 x 1024 x 16, sequences of 128, batch 8 per replica); on the CPU a scaled-down
 * one of the same proportions (head size 64, a 4C MLP: 2 x 256 x 4, sequences of 64, batch 4),
 * the shape the row names. The job file's and the command line's keys win over these.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/nvml.h"
#include "common/util.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/comm/comm.h"
#include "runtime/job/config.h"
#include "runtime/train/parallel/strategy.h"
#include "runtime/train/worker.h"

#define MAX_REPLICAS 64

typedef struct bench_opts {
    dt_bench_args a; /* the job, the overrides and the child's arguments (cmd.h) */
    const char *model; /* --model: one of the seed's models (seed_models), or NULL */
    int nproc;
    int steps, warmup;
    int repeat;          /* rounds of (single, DP, DDP); each row is the median round */
    int argc;            /* the command line, which the parent's children get again */
    char **argv;
} bench_opts;

/* What one process measured. */
typedef struct result {
    double wall_s;       /* timed steps */
    double cpu_s;        /* CPU time of this process over the timed steps */
    double comm_s;       /* DDP: waiting for gradients; DP: the serial reduce */
    double loss;
    int64_t items;       /* tokens or samples processed in the timed steps (all replicas) */
    int replicas;        /* in this process */
    double peak[MAX_REPLICAS]; /* bytes per replica */
    double gpu[MAX_REPLICAS];  /* GPU utilisation per replica over the timed steps (%), -1: none */
    double rss;          /* max resident set size of this process */
} result;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench dp-vs-ddp JOB.ini [--nproc N] [--steps S] [--warmup W] "
            "[--repeat R] [section.key=value ...]\n\n"
            "  --nproc N    replicas for DP, ranks for DDP, workers for indep (default 2)\n"
            "  --steps S    timed optimiser steps per configuration (default 20)\n"
            "  --warmup W   untimed steps first (default 3)\n"
            "  --repeat R   rounds of the four, interleaved; each row is the median round "
            "(default 5)\n"
            "  --model M    one of the seed's models instead of the job's, and a row in the "
            "seed's columns\n"
            "               beside the seed's figures: bert-large, resnet50 (scaled down on the "
            "cpu)\n");
}

/* ---- the seed's models (--model) ------------------------------------------------------------ */

typedef struct seed_model {
    const char *name;
    const char *unit;              /* what the seed counts: "sentences", "images" */
    double seed_dp, seed_ddp;      /* the seed's throughput (8 V100s) */
    const char *seed_shape;
    const char *const *gpu, *const *cpu; /* overrides: the real shape, the scaled-down one */
} seed_model;

static const char *const bert_large_gpu[] = {"model.type=bert", "model.preset=bert-large",
                                             "model.nsp=true", "data.seq_len=128",
                                             "train.batch_size=8", NULL};
static const char *const bert_large_cpu[] = {"model.type=bert", "model.preset=bert-large",
                                             "model.nsp=true", "model.n_layer=2",
                                             "model.n_embd=256", "model.n_head=4",
                                             "data.seq_len=64", "train.batch_size=4", NULL};

static const char *const resnet50_gpu[] = {
    "model.type=resnet",          "model.preset=resnet50",          "model.width=64",
    "data.type=synthetic",        "data.synthetic_shape=3x224x224", "data.synthetic_classes=1000",
    "train.batch_size=32",        NULL};
static const char *const resnet50_cpu[] = {
    "model.type=resnet",          "model.preset=resnet50",          "model.width=16",
    "data.type=synthetic",        "data.synthetic_shape=3x32x32",   "data.synthetic_classes=10",
    "train.batch_size=16",        NULL};

static const seed_model seed_models[] = {
    {"bert-large", "sentences", 48, 72, "24 x 1024 x 16 on 8 V100s", bert_large_gpu,
     bert_large_cpu},
    {"resnet50", "images", 1250, 1820, "ResNet-50 at 224x224 on 8 V100s", resnet50_gpu,
     resnet50_cpu},
};

static const seed_model *find_seed_model(const char *name)
{
    for (size_t i = 0; name && i < DT_ARRAY_LEN(seed_models); i++)
        if (!strcmp(seed_models[i].name, name))
            return &seed_models[i];
    return NULL;
}

/* Whether the job runs on a GPU (the real shape): job.device = cuda, or auto where NVML sees
 * one (no CUDA in this process). */
static bool on_gpu(const dt_job *job)
{
    return job->device == DT_DEVICE_CUDA ||
           (job->device == DT_DEVICE_AUTO && dt_nvml_device_count() > 0);
}

/* ov (room for 32 + the user's): the seed model's overrides for the job's device, then the
 * user's (which win); *n their count. Without --model: the user's. */
static void model_overrides(const bench_opts *o, const dt_job *plain, char **ov, int *n)
{
    const seed_model *sm = find_seed_model(o->model);
    *n = 0;
    for (const char *const *k = sm ? (on_gpu(plain) ? sm->gpu : sm->cpu) : NULL; k && *k; k++)
        ov[(*n)++] = (char *)*k;
    for (int i = 0; i < o->a.n_overrides; i++)
        ov[(*n)++] = o->a.overrides[i];
}

/* "DP sentences/s" (a static ring of two: one call per column of a printf). */
static const char *fmt_unit(const char *unit, const char *mode)
{
    static char buf[2][48];
    static int k;
    char *b = buf[k++ % 2];
    snprintf(b, sizeof buf[0], "%s %s/s", mode, unit);
    return b;
}

static double cpu_now(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec * 1e-6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec * 1e-6;
}

static double max_rss(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_maxrss * 1024.0;
}

static int write_result(const char *path, const result *r)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -errno;
    fprintf(f, "%.9g %.9g %.9g %.9g %lld %d %.9g", r->wall_s, r->cpu_s, r->comm_s, r->loss,
            (long long)r->items, r->replicas, r->rss);
    for (int k = 0; k < r->replicas; k++)
        fprintf(f, " %.9g %.9g", r->peak[k], r->gpu[k]);
    fprintf(f, "\n");
    fclose(f);
    return 0;
}

/* Process `rank`'s result from path into ((result *)res)[rank] (dt_bench_config's read). */
static int read_result(const char *path, int rank, void *res)
{
    result *r = (result *)res + rank;
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "r");
    if (!f)
        return -ENOENT;
    long long items = 0;
    int n = fscanf(f, "%lf %lf %lf %lf %lld %d %lf", &r->wall_s, &r->cpu_s, &r->comm_s, &r->loss,
                   &items, &r->replicas, &r->rss);
    r->items = items;
    int ok = n == 7 && r->replicas >= 1 && r->replicas <= MAX_REPLICAS;
    for (int k = 0; ok && k < r->replicas; k++)
        ok = fscanf(f, "%lf %lf", &r->peak[k], &r->gpu[k]) == 2;
    fclose(f);
    return ok ? 0 : -EPROTO;
}

/* ---- the children ---------------------------------------------------------------------------- */

static int load_job(const bench_opts *o, char *const *more, int n_more, dt_job *job,
                    dt_err *err)
{
    static dt_config_errors errs;
    char *ov[32 + 256];
    int n = 0, rc = 0;
    if (o->model) { /* the device decides the seed model's shape */
        if (o->a.n_overrides > 256)
            return dt_err_set(err, -EINVAL, "too many overrides");
        rc = dt_bench_load_job(o->a.job_path, o->a.overrides, o->a.n_overrides, NULL, 0, job,
                               &errs, err);
        if (!rc)
            model_overrides(o, job, ov, &n);
    }
    if (!rc)
        rc = dt_bench_load_job(o->a.job_path, o->model ? ov : o->a.overrides,
                               o->model ? n : o->a.n_overrides, more, n_more, job, &errs, err);
    for (int i = 0; rc && i < errs.count && i < 64; i++)
        fprintf(stderr, "%s\n", errs.lines[i]);
    return rc;
}

/* indep: every worker adds 1 to `key`, then waits until all nproc have; the store wakes it. */
static int store_gather(dt_store *store, const char *key, int n, dt_err *err)
{
    int64_t v = 0;
    char go[64];
    snprintf(go, sizeof go, "%s/go", key);
    int rc = dt_store_add(store, key, 1, &v, err);
    if (!rc && v == n)
        rc = dt_store_set(store, go, "1", 1, err);
    const char *keys[1] = {go};
    return rc ? rc : dt_store_wait(store, keys, 1, 600000, err);
}

/* One process of a configuration, the real trainer (worker.c's dt_trainer_step, through the
 * strategy interface): "single" and "indep" train one replica (strategy single), "ddp" one
 * replica with the others through a communicator (strategy ddp), "dp" nproc replicas on threads
 * (strategy dp). Each runs the job as given, with train.steps = warm-up + timed steps (the
 * schedule), no checkpoint and no metrics file. */
static int run_child(void *arg)
{
    const bench_opts *o = arg;
    static dt_job job;
    static dt_trainer t;
    dt_err err = {0};
    dt_store *store = NULL;
    bool built = false;
    int rc;
    bool is_dp = !strcmp(o->a.child, "dp"), is_ddp = !strcmp(o->a.child, "ddp");
    int world = is_ddp || !strcmp(o->a.child, "indep") ? o->nproc : 1;
    bool is_indep = !is_ddp && world > 1; /* apart, but started and ended together */
    char steps[32], replicas[32], outdir[1300];
    snprintf(steps, sizeof steps, "train.steps=%d", o->warmup + o->steps);
    snprintf(replicas, sizeof replicas, "job.dp_replicas=%d", o->nproc);
    snprintf(outdir, sizeof outdir, "job.output_dir=%s.run", o->a.out);
    char *more[] = {steps, outdir, "checkpoint.resume=never", "checkpoint.every=0",
                    is_dp ? "job.strategy=dp" : "job.strategy=ddp", replicas};
    if ((rc = load_job(o, more, is_dp ? 6 : 5, &job, &err)))
        goto out;
    /* DDP's ranks are the trainer's; indep's workers are single ones, bound like DDP's ranks */
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.world_size = is_ddp ? world : 1;
    env.rank = is_ddp ? o->a.rank : 0;
    env.local_world_size = world;
    env.local_rank = world > 1 ? o->a.rank : 0;
    dt_strlcpy(env.run_id, o->a.run_id ? o->a.run_id : "bench-dpddp", sizeof env.run_id);
    if (is_ddp) {
        dt_strlcpy(env.store_addr, "127.0.0.1", sizeof env.store_addr);
        env.store_port = o->a.port;
    }
    if (is_indep) {
        dt_store_opts so;
        dt_store_opts_default(&so);
        if ((rc = dt_store_connect(&store, "127.0.0.1", o->a.port, &so, &err)))
            goto out;
    }
    if ((rc = dt_trainer_init(&t, &job, &env, &err)))
        goto out;
    built = true;
    dt_strategy *s = t.s;
    int K = s->replicas;

    result res;
    memset(&res, 0, sizeof res);
    double t0 = 0, c0 = 0, loss_sum = 0;
    int64_t per_step = t.items_per_step / t.env.world_size; /* this process's */
    bool timing = false;
    dt_gpu_busy gpu[MAX_REPLICAS];
    bool gpu_on[MAX_REPLICAS] = {false};
    for (int step = 0;; step++) {
        if (step == o->warmup + o->steps) {
            res.wall_s = dt_now_s() - t0;
            res.cpu_s = cpu_now() - c0;
            for (int k = 0; k < K; k++)
                if (!gpu_on[k] || dt_gpu_busy_end(&gpu[k], &res.gpu[k], NULL) != 0)
                    res.gpu[k] = -1;
            timing = false;
            if (is_indep && (rc = dt_store_add(store, "end", 1, NULL, &err)))
                goto out;
        }
        if (step >= o->warmup + o->steps) {
            /* indep: keep the load on until every worker has finished its timed steps */
            int64_t ended = o->nproc;
            if (is_indep && (rc = dt_store_add(store, "end", 0, &ended, &err)))
                goto out;
            if (ended >= o->nproc)
                break;
        }
        if (step == o->warmup) {
            if ((s->comm && (rc = dt_comm_barrier(s->comm, &err))) ||
                (is_indep && (rc = store_gather(store, "start", o->nproc, &err))))
                goto out;
            timing = true;
            for (int k = 0; k < K; k++) { /* where NVML knows the replica's GPU */
                dt_backend *bk = s->ops->replica_backend(s, k);
                char bus[64];
                gpu_on[k] = bk->device_pci_bus_id &&
                            !bk->device_pci_bus_id(bk, K > 1 ? k : env.local_rank, bus,
                                                   sizeof bus) &&
                            !dt_gpu_busy_begin(&gpu[k], bus, NULL);
            }
            t0 = dt_now_s();
            c0 = cpu_now();
        }
        if ((rc = dt_trainer_step(&t, &err)))
            goto out;
        if (timing) {
            loss_sum += t.loss;
            res.items += per_step;
            res.comm_s += t.comm_time_s;
        }
    }
    res.loss = loss_sum / o->steps;
    res.rss = max_rss();
    res.replicas = K;
    for (int k = 0; k < K; k++) {
        dt_backend *bk = s->ops->replica_backend(s, k);
        res.peak[k] = bk->peak_bytes ? (double)bk->peak_bytes(bk) : 0;
    }
    if ((rc = write_result(o->a.out, &res)) != 0)
        dt_err_errno(&err, -rc, "writing %s", o->a.out);
out:
    if (rc)
        fprintf(stderr, "dtrain bench dp-vs-ddp (%s%s): %s\n", o->a.child,
                world > 1 ? " rank" : "", err.msg);
    if (built)
        dt_trainer_close(&t);
    dt_store_free(store);
    return rc ? 1 : 0;
}

/* ---- the parent ----------------------------------------------------------------------------- */

/* Runs `mode` as n processes (each: this command with --child MODE); results in res[0..n). */
static int run_mode(const bench_opts *o, const char *mode, int n, const char *dir, result *res)
{
    char *child[] = {"--child", (char *)mode};
    const dt_bench_words parts[] = {{o->argv, o->argc}, {child, 2}};
    /* a store for ddp's communicator, indep's start and end */
    return dt_bench_config("dp-vs-ddp", "dpddp", n > 1, parts, 2, dir, mode, n, read_result,
                           res);
}

/* Throughput of a configuration: what its processes did together over the slowest one's time,
 * or (apart: the processes never wait for each other) the sum of each one's own throughput. */
static double throughput(const result *res, int n, bool apart)
{
    double wall = 0, sum = 0;
    int64_t items = 0;
    for (int p = 0; p < n; p++) {
        wall = DT_MAX(wall, res[p].wall_s);
        items += res[p].items;
        sum += res[p].wall_s > 0 ? (double)res[p].items / res[p].wall_s : 0;
    }
    return apart ? sum : wall > 0 ? (double)items / wall : 0;
}

static void print_row(const char *name, int replicas, const result *res, int nproc_rows,
                      bool apart, double base_tput, int steps, int cores)
{
    /* Wall time: the slowest process; CPU: all processes; memory: every replica. */
    double wall = 0, cpu = 0, comm = 0, lo = 1e300, hi = 0, gpu = 0;
    int nrep = 0, ngpu = 0;
    for (int p = 0; p < nproc_rows; p++) {
        wall = DT_MAX(wall, res[p].wall_s);
        cpu += res[p].cpu_s;
        comm = DT_MAX(comm, res[p].comm_s);
        for (int k = 0; k < res[p].replicas; k++) {
            lo = DT_MIN(lo, res[p].peak[k]);
            hi = DT_MAX(hi, res[p].peak[k]);
            nrep++;
            if (res[p].gpu[k] >= 0) {
                gpu += res[p].gpu[k];
                ngpu++;
            }
        }
    }
    char gpu_col[16] = "-";
    if (ngpu)
        snprintf(gpu_col, sizeof gpu_col, "%.1f%%", gpu / ngpu);
    double tput = throughput(res, nproc_rows, apart);
    char mem[512];
    size_t k = 0;
    for (int p = 0; p < nproc_rows && k < sizeof mem; p++)
        for (int j = 0; j < res[p].replicas && k < sizeof mem; j++)
            k += (size_t)snprintf(mem + k, sizeof mem - k, "%s%.1f", k ? " " : "",
                                  res[p].peak[j] / (1024.0 * 1024.0));
    printf("%-7s %8d %9.1f %12.0f %9.2fx %10.1f%% %9s %9.2f %11.1f%%  %s\n", name, replicas,
           wall * 1e3 / steps, tput, base_tput > 0 ? tput / base_tput : 1.0,
           100.0 * cpu / (wall * cores), gpu_col, comm * 1e3 / steps,
           lo > 0 && nrep > 1 ? 100.0 * (hi - lo) / lo : 0.0, mem);
}

/* Utilisation and memory spread of a configuration: CPU time over wall time over the cores (%),
 * nvidia-smi's mean over the replicas (%, -1: none), (max - min) / min of the replicas' peaks
 * (%) and max - min (bytes). */
static void mode_figures(const result *res, int n, int cores, double *cpu_util, double *gpu_util,
                         double *spread_pct, double *spread_bytes)
{
    double wall = 0, cpu = 0, lo = 1e300, hi = 0, gpu = 0;
    int nrep = 0, ngpu = 0;
    for (int p = 0; p < n; p++) {
        wall = DT_MAX(wall, res[p].wall_s);
        cpu += res[p].cpu_s;
        for (int k = 0; k < res[p].replicas; k++) {
            lo = DT_MIN(lo, res[p].peak[k]);
            hi = DT_MAX(hi, res[p].peak[k]);
            nrep++;
            if (res[p].gpu[k] >= 0) {
                gpu += res[p].gpu[k];
                ngpu++;
            }
        }
    }
    *cpu_util = wall > 0 ? 100.0 * cpu / (wall * cores) : 0;
    *gpu_util = ngpu ? gpu / ngpu : -1;
    *spread_pct = lo > 0 && nrep > 1 ? 100.0 * (hi - lo) / lo : 0.0;
    *spread_bytes = nrep > 1 ? hi - lo : 0.0;
}

/* The seed's row for --model: DP's and DDP's throughput in the seed's unit (tokens / seq_len
 * for a token model), their ratio, utilisation, the memory spread; then the seed's figures. */
static void seed_row(const seed_model *sm, const dt_job *job, bool gpu_shape, const result *dp,
                     int n_dp, const result *ddp, int n_ddp, double dp_tput, double ddp_tput,
                     double ratio, int cores)
{
    const bool tok = dt_model_reads_tokens(job->model_type);
    const double per = tok && job->seq_len > 0 ? job->seq_len : 1;
    double cu[2], gu[2], sp[2], sb[2];
    mode_figures(dp, 1, cores, &cu[0], &gu[0], &sp[0], &sb[0]);
    mode_figures(ddp, n_ddp, cores, &cu[1], &gu[1], &sp[1], &sb[1]);
    (void)n_dp;
    char shape[96], util[2][48];
    if (job->model_type == DT_MODEL_RESNET)
        snprintf(shape, sizeof shape, "width %d, %dx%dx%d images, batch %d%s", job->width,
                 job->synthetic_shape[0], job->synthetic_shape[1], job->synthetic_shape[2],
                 job->batch_size, gpu_shape ? "" : " (cpu: scaled down)");
    else
        snprintf(shape, sizeof shape, "%d x %d x %d, T %d, batch %d%s", job->n_layer,
                 job->n_embd, job->n_head, job->seq_len, job->batch_size,
                 gpu_shape ? "" : " (cpu: scaled down)");
    for (int k = 0; k < 2; k++) {
        if (gu[k] >= 0)
            snprintf(util[k], sizeof util[k], "gpu %.0f%%", gu[k]);
        else
            snprintf(util[k], sizeof util[k], "cpu %.0f%%", cu[k]);
    }
    printf("#\n# the seed's experiment, %s (%s):\n", sm->name, shape);
    printf("%-12s %14s %14s %8s %10s %10s %16s %16s\n", "model", fmt_unit(sm->unit, "DP"),
           fmt_unit(sm->unit, "DDP"), "DDP/DP", "util DP", "util DDP", "mem spread DP",
           "mem spread DDP");
    char m0[40], m1[40];
    snprintf(m0, sizeof m0, "%.1f MiB %.0f%%", sb[0] / (1024.0 * 1024.0), sp[0]);
    snprintf(m1, sizeof m1, "%.1f MiB %.0f%%", sb[1] / (1024.0 * 1024.0), sp[1]);
    printf("%-12s %14.1f %14.1f %7.2fx %10s %10s %16s %16s\n", sm->name, dp_tput / per,
           ddp_tput / per, ratio, util[0], util[1], m0, m1);
    printf("%-12s %14.0f %14.0f %7.2fx %10s %10s %16s %16s   (%s)\n", "seed", sm->seed_dp,
           sm->seed_ddp, sm->seed_ddp / sm->seed_dp, "-", "-", "-", "-", sm->seed_shape);
}

/* The command line's limits beyond dt_bench_main_run's (0, or 2 after the usage). */
static int check(void *arg)
{
    const bench_opts *o = arg;
    if (o->nproc < 1 || o->nproc > MAX_REPLICAS || o->steps < 1 || o->repeat < 1) {
        usage(stderr);
        return 2;
    }
    if (o->model && !find_seed_model(o->model)) {
        fprintf(stderr, "dtrain bench dp-vs-ddp: --model %s is not one of the seed's models "
                        "(bert-large, resnet50)\n", o->model);
        return 2;
    }
    return 0;
}

/* The parent: rounds of the modes, their processes' outputs under dir, then the table. */
static int run_parent(void *arg, const char *dir)
{
    const bench_opts o = *(const bench_opts *)arg;
    static dt_job job;
    if (dt_bench_parent_job("dp-vs-ddp", o.a.job_path, o.a.overrides, o.a.n_overrides, NULL, 0, &job))
        return 1;
    const seed_model *sm = find_seed_model(o.model);
    const bool gpu_shape = on_gpu(&job);
    if (sm) { /* the seed's model in the job's place */
        char *ov[32 + 256];
        int n = 0;
        if (o.a.n_overrides > 256)
            return 1;
        model_overrides(&o, &job, ov, &n);
        if (dt_bench_parent_job("dp-vs-ddp", o.a.job_path, ov, n, NULL, 0, &job))
            return 1;
    }
    int cores = (int)sysconf(_SC_NPROCESSORS_ONLN);
    bool tokens = dt_model_reads_tokens(job.model_type);
    printf("# dtrain bench dp-vs-ddp %s: model %s, %d replicas, batch %d per replica x accum %d, "
           "%d timed steps (+%d warm-up), device %s, %d BLAS thread(s) per replica, %d cores, "
           "cpu_bind %s, dp_transport %s\n",
           o.a.job_path, dt_model_name(job.model_type), o.nproc, job.batch_size, job.grad_accum,
           o.steps, o.warmup, dt_device_name(job.device), job.threads, cores,
           dt_cpu_bind_name(job.cpu_bind), dt_dp_transport_name(job.dp_transport));
    printf("# throughput in %s/s over all replicas; comm = per-step time DDP waits for its "
           "gradients, DP spends in the serial reduce (dp_transport = collectives: in its "
           "reduce)\n",
           tokens ? "tokens" : "samples");
    printf("# indep: %d single workers at once, bound like DDP's ranks, never synchronised: the "
           "ceiling for %d workers on this machine (throughput: the sum of theirs)\n",
           o.nproc, o.nproc);
    printf("# peak memory: what each replica's backend allocated at most (MiB); spread = (max - "
           "min) / min\n#\n");
    printf("%-7s %8s %9s %12s %10s %11s %9s %9s %12s  %s\n", "mode", "replicas", "step(ms)",
           "throughput", "speedup", "cpu util", "gpu util", "comm(ms)", "mem spread",
           "peak MiB per replica");
    /* Rounds of (single, DP, DDP, indep), interleaved so that a change in the machine's load
     * hits every mode alike (DP and DDP swap places every other round); each mode's row is its
     * median round by throughput, and DDP against DP is judged round by round. */
    enum { SINGLE, DP, DDP, INDEP, MODES };
    static const char *const modes[MODES] = {"single", "dp", "ddp", "indep"};
    static const char *const labels[MODES] = {"single", "DP", "DDP", "indep"};
    result *runs = calloc((size_t)o.repeat * MODES * MAX_REPLICAS, sizeof *runs);
    double *tput = calloc((size_t)o.repeat * MODES, sizeof *tput);
    int failed = !runs || !tput;
    for (int rep = 0; rep < o.repeat && !failed; rep++)
        for (int i = 0; i < MODES && !failed; i++) {
            int m = rep % 2 && (i == DP || i == DDP) ? DP + DDP - i : i;
            int n = m == DDP || m == INDEP ? o.nproc : 1;
            result *res = runs + ((size_t)rep * MODES + (size_t)m) * MAX_REPLICAS;
            if (run_mode(&o, modes[m], n, dir, res) != 0) {
                fprintf(stderr, "dtrain bench dp-vs-ddp: the %s run failed\n", labels[m]);
                failed = 1;
                break;
            }
            tput[rep * MODES + m] = throughput(res, n, m == INDEP);
        }
    double med[MODES] = {0}, spread[MODES] = {0};
    const result *pick[MODES] = {NULL};
    for (int m = 0; m < MODES && !failed; m++) {
        /* the median round: the one with as many rounds faster as slower */
        int best = 0;
        for (int a = 0; a < o.repeat; a++) {
            int below = 0, above = 0;
            for (int b = 0; b < o.repeat; b++) {
                below += tput[b * MODES + m] < tput[a * MODES + m];
                above += tput[b * MODES + m] > tput[a * MODES + m];
            }
            if (below <= o.repeat / 2 && above <= o.repeat / 2)
                best = a;
        }
        med[m] = tput[best * MODES + m];
        pick[m] = runs + ((size_t)best * MODES + (size_t)m) * MAX_REPLICAS;
    }
    for (int m = 0; m < MODES && !failed; m++) {
        int n = m == DDP || m == INDEP ? o.nproc : 1;
        print_row(labels[m], m == SINGLE ? 1 : o.nproc, pick[m], n, m == INDEP, med[SINGLE],
                  o.steps, cores);
        double lo = 1e300, hi = 0;
        for (int r = 0; r < n; r++)
            for (int k = 0; k < pick[m][r].replicas; k++) {
                lo = DT_MIN(lo, pick[m][r].peak[k]);
                hi = DT_MAX(hi, pick[m][r].peak[k]);
            }
        spread[m] = hi - lo;
    }
    if (!failed) {
        /* Paired by round: DP and DDP ran next to each other, under the same load. */
        double ratio[64], lo_r = 1e300, hi_r = 0;
        int nr = DT_MIN(o.repeat, 64), wins = 0;
        for (int rep = 0; rep < nr; rep++) {
            double dp_t = tput[rep * MODES + DP];
            ratio[rep] = dp_t > 0 ? tput[rep * MODES + DDP] / dp_t : 0;
            wins += ratio[rep] > 1.0;
            lo_r = DT_MIN(lo_r, ratio[rep]);
            hi_r = DT_MAX(hi_r, ratio[rep]);
        }
        qsort(ratio, (size_t)nr, sizeof *ratio, dt_cmp_double);
        /* Sign test: how likely so many wins (or more) are if neither were faster (p = 1/2). */
        double p = 0, c = 1; /* c = C(nr, k) */
        for (int k = 0; k <= nr; k++) {
            if (k >= wins)
                p += c;
            c = c * (nr - k) / (k + 1);
        }
        p = ldexp(p, -nr);
        printf("#\n# DDP / DP throughput: %.2fx (median of the rounds' ratios; %.2f..%.2f), DDP "
               "faster in %d of %d rounds (sign test p = %.2g: the odds of as many if equally fast); "
               "memory spread DP %.1f MiB, DDP %.1f MiB\n",
               ratio[nr / 2], lo_r, hi_r, wins, nr, p, spread[DP] / (1024.0 * 1024.0),
               spread[DDP] / (1024.0 * 1024.0));
        printf("# DDP scaling over one worker: %.2fx on %d ranks; %d unsynchronised workers "
               "(indep) reach %.2fx, so DDP gets %.0f%% of this machine's ceiling\n",
               med[SINGLE] > 0 ? med[DDP] / med[SINGLE] : 0, o.nproc, o.nproc,
               med[SINGLE] > 0 ? med[INDEP] / med[SINGLE] : 0,
               med[INDEP] > 0 ? 100.0 * med[DDP] / med[INDEP] : 0);
        if (sm)
            seed_row(sm, &job, gpu_shape, pick[DP], o.nproc, pick[DDP], o.nproc, med[DP],
                     med[DDP], ratio[nr / 2], cores);
        if (o.repeat > 1) {
            printf("# median of %d interleaved rounds; throughput of every round:", o.repeat);
            for (int m = 0; m < MODES; m++) {
                printf(" %s", labels[m]);
                for (int rep = 0; rep < o.repeat; rep++)
                    printf("%s%.0f", rep ? "/" : " ", tput[rep * MODES + m]);
                printf(m < MODES - 1 ? ";" : "\n");
            }
        }
    }
    free(runs);
    free(tput);
    return failed;
}

int dt_bench_dp_vs_ddp(int argc, char **argv)
{
    bench_opts o = {.nproc = 2, .steps = 20, .warmup = 3, .repeat = 5,
                    .argc = argc, .argv = argv};
    const dt_bench_opt opts[] = {
        {"--nproc", &o.nproc, NULL},
        {"--steps", &o.steps, NULL},
        {"--warmup", &o.warmup, NULL},
        {"--repeat", &o.repeat, NULL},
        {"--model", NULL, &o.model},
    };
    const dt_bench_main m = {.name = "dp-vs-ddp", .tag = "dpddp", .opts = opts,
                             .nopts = (int)DT_ARRAY_LEN(opts), .print_usage = usage, .o = &o,
                             .args = &o.a, .check = check, .run_child = run_child,
                             .run_parent = run_parent};
    return dt_bench_main_run(&m, argc, argv);
}
