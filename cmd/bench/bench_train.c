/* bench_train.c - `dtrain bench train JOB.ini [overrides] [--steps N] [--warmup N]`.
 *
 * Builds the job's trainer in this process (one rank, no metrics file, no checkpoint resume),
 * runs warmup steps, then N timed steps for throughput, then N more with the backend's per-op
 * profiling on for the breakdown: the share of step time spent in GEMM-bound ops (matmul,
 * attention GEMMs, conv) against everything else (element-wise ops, normalisation, softmax,
 * the optimiser, data). The target: a gpt-tiny step spends >= 70% of its time in GEMM.
 * It also prints the model's activation bytes (dt_model_activation_bytes), so that
 * train.recompute=none and =block can be compared run against run.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cmd/cmd.h"
#include "common/log.h"
#include "common/util.h"
#include "runtime/job/config.h"
#include "runtime/train/worker.h"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain bench train JOB.ini [section.key=value ...] [--steps N] [--warmup N]\n\n"
            "Runs N training steps of the job in this process and reports tokens/s (or samples/s)\n"
            "and the share of step time spent in GEMM-bound ops, with a per-op table.\n"
            "  --steps N    timed steps (default 20), run twice: plain, then profiled\n"
            "  --warmup N   untimed steps first (default 3)\n");
}

static int cmp_time(const void *a, const void *b)
{
    double x = ((const dt_op_stat *)a)->seconds, y = ((const dt_op_stat *)b)->seconds;
    return x < y ? 1 : x > y ? -1 : 0;
}

static int run_steps(dt_trainer *t, int n, double *seconds, dt_err *err)
{
    double t0 = dt_now_s();
    for (int i = 0; i < n; i++) {
        t->step = 0; /* keep the schedule at its start: the benchmark measures, not trains */
        int rc = dt_trainer_step(t, err);
        if (rc)
            return rc;
    }
    *seconds = dt_now_s() - t0;
    return 0;
}

int dt_bench_train(int argc, char **argv)
{
    int steps = 20, warmup = 3;
    const char *path = NULL;
    char **ovr = calloc((size_t)argc + 1, sizeof(char *));
    int novr = 0, code = 1;
    static dt_job job;
    static dt_config_errors errs;
    static dt_trainer t;
    dt_err err = {0};
    bool built = false;
    if (!ovr)
        return 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            code = 0;
            goto out;
        }
        if (!strncmp(a, "--steps", 7) || !strncmp(a, "--warmup", 8)) {
            int *dst = a[2] == 's' ? &steps : &warmup;
            const char *v = strchr(a, '=');
            v = v ? v + 1 : (i + 1 < argc ? argv[++i] : NULL);
            if (!v || dt_parse_int(v, dst) != 0 || *dst < (dst == &steps ? 1 : 0)) {
                fprintf(stderr, "dtrain bench train: %s needs a number%s\n", a,
                        dst == &steps ? " >= 1" : " >= 0");
                code = 2;
                goto out;
            }
        } else if (a[0] == '-') {
            fprintf(stderr, "dtrain bench train: unknown option %s\n", a);
            usage(stderr);
            code = 2;
            goto out;
        } else if (!path) {
            path = a;
        } else {
            ovr[novr++] = argv[i];
        }
    }
    if (!path) {
        usage(stderr);
        code = 2;
        goto out;
    }
    if (dt_job_load(&job, path, ovr, novr, &errs, &err) != 0) {
        for (int i = 0; i < DT_MIN(errs.count, (int)DT_ARRAY_LEN(errs.lines)); i++)
            fprintf(stderr, "dtrain bench train: %s\n", errs.lines[i]);
        fprintf(stderr, "dtrain bench train: %s\n", err.msg);
        goto out;
    }
    job.resume = DT_RESUME_NEVER;
    job.resume_path[0] = '\0';
    dt_worker_env env;
    memset(&env, 0, sizeof env);
    env.world_size = env.local_world_size = 1;
    dt_strlcpy(env.run_id, "bench", sizeof env.run_id);
    if (dt_trainer_init(&t, &job, &env, &err) != 0) {
        fprintf(stderr, "dtrain bench train: %s\n", err.msg);
        goto out;
    }
    built = true;
    dt_backend *be = t.be;
    printf("bench train: %s | %s %s, %zu parameters | %s | batch %d x accum %d = %lld %s/step\n",
           path, dt_model_arch_name(t.model->cfg.arch),
           job.preset != DT_PRESET_NONE ? dt_preset_name(job.preset) : "", t.model->num_params,
           be->name, job.batch_size, job.grad_accum, (long long)t.items_per_step,
           t.tokens ? "tokens" : "samples");
    printf("activations: %.1f MiB allocated by the model (train.recompute = %s)\n",
           (double)dt_model_activation_bytes(t.model) / (1024.0 * 1024.0),
           dt_recompute_name(job.recompute));
    double secs;
    if (run_steps(&t, warmup, &secs, &err) || run_steps(&t, steps, &secs, &err)) {
        fprintf(stderr, "dtrain bench train: %s\n", err.msg);
        goto out;
    }
    double step_s = secs / steps, rate = (double)t.items_per_step / step_s;
    /* the rank's batch: DP's covers all its replicas */
    double flops = t.model->flops_per_sample * t.batch * job.grad_accum / step_s;
    printf("throughput: %.1f %s/s, %.2f ms/step, %.2f GFLOP/s of model FLOPs (%d steps)\n", rate,
           t.tokens ? "tokens" : "samples", step_s * 1e3, flops / 1e9, steps);

    if (!be->profile_enable || !be->profile_read) {
        printf("GEMM share: not available (the %s backend has no op profiling)\n", be->name);
        code = 0;
        goto out;
    }
    be->profile_enable(be, true);
    if (run_steps(&t, steps, &secs, &err)) {
        fprintf(stderr, "dtrain bench train: %s\n", err.msg);
        goto out;
    }
    dt_op_stat st[128];
    int n = be->profile_read(be, st, (int)DT_ARRAY_LEN(st));
    be->profile_enable(be, false);
    n = DT_MIN(n, (int)DT_ARRAY_LEN(st));
    qsort(st, (size_t)n, sizeof st[0], cmp_time);
    double gemm = 0, ops = 0;
    for (int i = 0; i < n; i++) {
        ops += st[i].seconds;
        if (st[i].gemm)
            gemm += st[i].seconds;
    }
    printf("\n%-22s %8s %10s %7s %9s\n", "op", "calls", "ms/step", "share", "GFLOP/s");
    for (int i = 0; i < n; i++) {
        if (st[i].calls == 0)
            continue;
        char gf[32] = "";
        if (st[i].flops > 0 && st[i].seconds > 0)
            snprintf(gf, sizeof gf, "%.1f", st[i].flops / st[i].seconds / 1e9);
        printf("%-22s %8llu %10.3f %6.1f%% %9s%s\n", st[i].name,
               (unsigned long long)(st[i].calls / (uint64_t)steps), st[i].seconds / steps * 1e3,
               100.0 * st[i].seconds / secs, gf, st[i].gemm ? "  gemm" : "");
    }
    double other = secs - ops;
    printf("%-22s %8s %10.3f %6.1f%%\n", "(outside ops)", "", other / steps * 1e3,
           100.0 * other / secs);
    printf("\nGEMM share of step time: %.1f%% (GEMM %.2f ms, rest %.2f ms per step; target for "
           "gpt-tiny >= 70%%)\n",
           100.0 * gemm / secs, gemm / steps * 1e3, (secs - gemm) / steps * 1e3);
    code = 0;
out:
    if (built)
        dt_trainer_close(&t);
    free(ovr);
    return code;
}
