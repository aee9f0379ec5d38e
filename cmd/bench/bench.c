/* bench.c - `dtrain bench NAME [options]`: dispatch to the benchmarks, one file each. */
#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"

static const struct {
    const char *name;
    int (*fn)(int, char **);
    const char *help;
} benches[] = {
    {"store", dt_bench_store, "store throughput, latency and a rendezvous-shaped round"},
    {"rdzv", dt_bench_rdzv, "simulated agents: round completion and node-loss recovery"},
    {"launch", dt_bench_launch, "worker start-up and restart latency"},
    {"kernels", dt_bench_kernels, "GFLOP/s of GEMM-bound ops against plain sgemm"},
    {"train", dt_bench_train, "training throughput and GEMM share of a job"},
    {"allreduce", dt_bench_allreduce, "all-reduce algbw/busbw table (nccl-tests style)"},
    {"dp-vs-ddp", dt_bench_dp_vs_ddp, "DataParallel against DDP on one job"},
    {"ckpt", dt_bench_ckpt, "checkpoint size, throughput and how long training is held"},
    {"memory", dt_bench_memory, "memory by category per ZeRO stage and recompute mode"},
    {"pipeline", dt_bench_pipeline, "pipeline bubble, throughput, activation memory: GPipe vs 1F1B"},
    {"tensor", dt_bench_tensor, "tensor parallelism (T = 1, 2, 4) against one process and DDP"},
};

int dt_bench_run_ranks(char **av, int rank_slot, int out_slot, const char *out_prefix, int n,
                       int *status)
{
    enum { OUT_MAX = 1200 };
    char(*ranks)[16] = calloc((size_t)n, sizeof *ranks);
    char(*outs)[OUT_MAX] = out_slot >= 0 ? calloc((size_t)n, sizeof *outs) : NULL;
    pid_t *pids = calloc((size_t)n, sizeof *pids);
    int failed = 0, start = n;
    if (!ranks || !pids || (out_slot >= 0 && !outs)) {
        fprintf(stderr, "dtrain bench: out of memory\n");
        failed = 1;
        start = 0;
    }
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < start; r++) {
        snprintf(ranks[r], sizeof ranks[r], "%d", r);
        av[rank_slot] = ranks[r];
        if (outs) {
            snprintf(outs[r], OUT_MAX, "%s%d", out_prefix, r);
            av[out_slot] = outs[r];
        }
        pids[r] = fork();
        if (pids[r] < 0) {
            perror("dtrain bench: fork");
            failed = 1;
            break;
        }
        if (pids[r] == 0) {
            execv(av[0], av);
            static const char msg[] = "dtrain bench: cannot exec the dtrain binary\n";
            ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
            (void)w;
            _exit(127);
        }
    }
    /* Reaped in the order they end: once one rank fails (or a fork did), the others are
     * stopped, not left waiting for it until the communicator's timeout (or for ever). */
    int left = 0;
    for (int r = 0; r < n; r++) {
        status[r] = -1;
        left += pids && pids[r] > 0;
    }
    bool stopped = false;
    while (left > 0) {
        if (failed && !stopped) {
            for (int r = 0; r < n; r++)
                if (pids[r] > 0)
                    kill(pids[r], SIGTERM);
            stopped = true;
        }
        int st;
        pid_t p = waitpid(-1, &st, 0);
        if (p < 0) {
            if (errno == EINTR)
                continue;
            perror("dtrain bench: waitpid");
            failed = 1;
            break;
        }
        for (int r = 0; r < n; r++)
            if (pids[r] == p) {
                status[r] = st;
                pids[r] = 0;
                left--;
                if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                    failed = 1;
            }
    }
    free(ranks);
    free(outs);
    free(pids);
    return failed;
}

int dt_bench_store_start(const char *name, dt_store_server **srv, char *port, size_t cap)
{
    dt_store_server_opts so;
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    so.port = 0;
    dt_err err = {0};
    *srv = NULL;
    if (dt_store_server_start(srv, &so, &err) != 0) {
        fprintf(stderr, "dtrain bench %s: %s\n", name, err.msg);
        return 1;
    }
    snprintf(port, cap, "%d", dt_store_server_port(*srv));
    return 0;
}

int dt_bench_children(const char *name, bool with_store, const dt_bench_words *parts,
                      int nparts, const char *run_id, const char *out_prefix, int n)
{
    dt_store_server *srv = NULL;
    char port[16] = "0";
    if (with_store && dt_bench_store_start(name, &srv, port, sizeof port))
        return 1;
    size_t words = 0;
    for (int p = 0; p < nparts; p++)
        words += (size_t)parts[p].n;
    char **av = calloc(words + 12, sizeof *av);
    int *status = calloc((size_t)n, sizeof *status);
    int failed = 1;
    if (av && status) {
        int k = 0;
        av[k++] = (char *)dt_cmd_self_path();
        av[k++] = "bench";
        for (int p = 0; p < nparts; p++)
            for (int i = 0; i < parts[p].n; i++)
                av[k++] = parts[p].w[i];
        av[k++] = "--child-rank";
        const int rank_slot = k++;
        av[k++] = "--child-port";
        av[k++] = port;
        av[k++] = "--child-run-id";
        av[k++] = (char *)run_id;
        av[k++] = "--child-out";
        const int out_slot = k++;
        av[k] = NULL;
        failed = dt_bench_run_ranks(av, rank_slot, out_slot, out_prefix, n, status);
    }
    free(av);
    free(status);
    dt_store_server_stop(srv);
    return failed;
}

int dt_bench_config(const char *name, const char *tag, bool with_store,
                    const dt_bench_words *parts, int nparts, const char *dir, const char *id,
                    int n, int (*read)(const char *path, int rank, void *ctx), void *ctx)
{
    char run_id[64], prefix[1100];
    snprintf(run_id, sizeof run_id, "bench-%s-%d-%s", tag, (int)getpid(), id);
    snprintf(prefix, sizeof prefix, "%s/%s.", dir, id);
    int failed = dt_bench_children(name, with_store, parts, nparts, run_id, prefix, n);
    for (int r = 0; r < n && !failed; r++) {
        char out[1200];
        snprintf(out, sizeof out, "%s%d", prefix, r);
        failed = read(out, r, ctx) != 0;
    }
    return failed;
}

int dt_bench_main_run(const dt_bench_main *m, int argc, char **argv)
{
    const dt_bench_opt child_opts[] = {
        {"--child", NULL, &m->args->child},     {"--child-rank", &m->args->rank, NULL},
        {"--child-port", &m->args->port, NULL}, {"--child-run-id", NULL, &m->args->run_id},
        {"--child-out", NULL, &m->args->out},
    };
    const int nchild = (int)DT_ARRAY_LEN(child_opts);
    char **ovr = calloc((size_t)argc + 1, sizeof *ovr);
    dt_bench_opt *opts = calloc((size_t)(m->nopts + nchild), sizeof *opts);
    int rc = 1;
    if (!ovr || !opts)
        goto out;
    memcpy(opts, m->opts, sizeof *opts * (size_t)m->nopts);
    memcpy(opts + m->nopts, child_opts, sizeof child_opts);
    char label[64];
    snprintf(label, sizeof label, "dtrain bench %s", m->name);
    rc = dt_bench_parse_args(argc, argv, label, opts, m->nopts + nchild, &m->args->job_path, ovr,
                             &m->args->n_overrides, m->print_usage);
    if (rc) {
        rc = rc == 1 ? 0 : 2;
        goto out;
    }
    m->args->overrides = ovr;
    if (!m->args->job_path) {
        m->print_usage(stderr);
        rc = 2;
        goto out;
    }
    if (m->check && (rc = m->check(m->o)) != 0)
        goto out;
    dt_log_init();
    if (m->args->child) {
        dt_log_set_rank(m->args->rank);
        rc = m->run_child(m->o);
        goto out;
    }
    char dir[64], cmd[96];
    snprintf(dir, sizeof dir, "/tmp/dtrain-%s-XXXXXX", m->tag);
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        rc = 1;
        goto out;
    }
    rc = m->run_parent(m->o, dir);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "dtrain bench %s: could not remove %s\n", m->name, dir);
out:
    free(ovr);
    free(opts);
    return rc;
}

int dt_bench_load_job(const char *job_path, char *const *ov, int n_ov, char *const *more,
                      int n_more, dt_job *job, dt_config_errors *errs, dt_err *err)
{
    memset(errs, 0, sizeof *errs);
    char **all = calloc((size_t)(n_ov + n_more) + 1, sizeof *all);
    if (!all)
        return dt_err_set(err, -ENOMEM, "out of memory");
    if (n_ov)
        memcpy(all, ov, sizeof *all * (size_t)n_ov);
    if (n_more)
        memcpy(all + n_ov, more, sizeof *all * (size_t)n_more); /* later ones win */
    int rc = dt_job_load(job, job_path, all, n_ov + n_more, errs, err);
    free(all);
    return rc;
}

/* dt_bench_load_job, printing errs' lines on stderr when it fails. */
static int load_job_say(const char *job_path, char *const *ov, int n_ov, char *const *more,
                        int n_more, dt_job *job, dt_err *err)
{
    static dt_config_errors errs;
    int rc = dt_bench_load_job(job_path, ov, n_ov, more, n_more, job, &errs, err);
    for (int i = 0; rc && i < errs.count && i < 64; i++)
        fprintf(stderr, "%s\n", errs.lines[i]);
    return rc;
}

int dt_bench_parent_job(const char *name, const char *job_path, char *const *ov, int n_ov,
                        char *const *more, int n_more, dt_job *job)
{
    dt_err err = {0};
    if (load_job_say(job_path, ov, n_ov, more, n_more, job, &err) == 0)
        return 0;
    fprintf(stderr, "dtrain bench %s: %s\n", name, err.msg);
    return 1;
}

int dt_bench_child_trainer(dt_trainer *t, dt_job *job, const char *job_path, char *const *ov,
                           int n_ov, int steps, const char *out, int rank, int nproc, int port,
                           const char *run_id, dt_err *err)
{
    char steps_ov[32], outdir[1300];
    snprintf(steps_ov, sizeof steps_ov, "train.steps=%d", steps);
    snprintf(outdir, sizeof outdir, "job.output_dir=%s.run", out);
    char *more[] = {steps_ov, outdir, "checkpoint.resume=never", "checkpoint.every=0",
                    "train.eval_every=0"};
    const int skip = steps > 0 ? 0 : 1; /* no train.steps */
    int rc = load_job_say(job_path, ov, n_ov, more + skip, 5 - skip, job, err);
    if (rc)
        return rc;
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.world_size = env.local_world_size = nproc;
    env.rank = env.local_rank = rank;
    dt_strlcpy(env.run_id, run_id, sizeof env.run_id);
    if (nproc > 1) {
        dt_strlcpy(env.store_addr, "127.0.0.1", sizeof env.store_addr);
        env.store_port = port;
    }
    return dt_trainer_init(t, job, &env, err);
}

static void usage(FILE *out)
{
    fprintf(out, "usage: dtrain bench NAME [options]   (dtrain bench NAME --help)\n\n");
    for (size_t i = 0; i < DT_ARRAY_LEN(benches); i++)
        fprintf(out, "  %-10s %s\n", benches[i].name, benches[i].help);
}

int dt_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *names[DT_ARRAY_LEN(benches)];
    for (size_t i = 0; i < DT_ARRAY_LEN(benches); i++) {
        names[i] = benches[i].name;
        if (!strcmp(argv[1], benches[i].name))
            return benches[i].fn(argc - 1, argv + 1);
    }
    const char *near = dt_nearest(argv[1], names, DT_ARRAY_LEN(benches));
    fprintf(stderr, "dtrain bench: unknown benchmark \"%s\"%s%s%s\n", argv[1],
            near ? "; did you mean \"" : "", near ? near : "", near ? "\"?" : "");
    usage(stderr);
    return 2;
}

int dt_bench_parse_args(int argc, char **argv, const char *name, const dt_bench_opt *opts,
                        int nopts, const char **job_path, char **ovr, int *n_ovr,
                        void (*print_usage)(FILE *out))
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            print_usage(stdout);
            return 1;
        }
        const dt_bench_opt *opt = NULL;
        for (int k = 0; k < nopts && !opt; k++)
            if (!strcmp(a, opts[k].flag))
                opt = &opts[k];
        if (opt) {
            if (!v || (opt->ival && (dt_parse_int(v, opt->ival) || *opt->ival < 0))) {
                fprintf(stderr, "%s: %s needs a %s\n", name, a, opt->ival ? "number" : "value");
                return 2;
            }
            if (opt->sval)
                *opt->sval = v;
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "%s: unknown option %s\n", name, a);
            print_usage(stderr);
            return 2;
        } else if (strchr(a, '=')) {
            ovr[(*n_ovr)++] = (char *)a;
        } else if (!*job_path) {
            *job_path = a;
        } else {
            fprintf(stderr, "%s: one job file only (%s, %s)\n", name, *job_path, a);
            return 2;
        }
    }
    return 0;
}
