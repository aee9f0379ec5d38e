/* plan_cmd.c - `dtrain plan JOB.ini [section.key=value ...] --nnodes N --nproc-per-node G
 * [--device-memory M] [--global-batch B] [--json] [--top K] [--check K]`: the command line,
 * the ranked table and its JSON form, and --check, which runs the best layouts through the
 * launcher (this binary) and sets what they measured beside what was predicted. The planner
 * is cmd/plan.c (plan.h). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmd.h"
#include "cmd/plan.h"
#include "common/util.h"
#include "runtime/job/workenv.h"

#define MIB (1024.0 * 1024.0)

extern char **environ;

static void usage(FILE *out)
{
    fprintf(out,
            "usage: dtrain plan JOB.ini [section.key=value ...] --nnodes N --nproc-per-node G\n"
            "                   [--device-memory M] [--global-batch B] [--json] [--top K]\n"
            "                   [--check K [--check-steps S]]\n"
            "\n"
            "Enumerates every layout of the job's model on N x G ranks (data x tensor x pipeline,\n"
            "sequence parallelism, ZeRO 0-3, recomputation, micro-batches and schedule, the\n"
            "per-rank batch and accumulation that keep the global batch), predicts each one's\n"
            "per-rank memory by category and its step time, and prints them ranked: the fastest\n"
            "that fits first, then those that do not fit, with why.\n"
            "\n"
            "  --nnodes N          nodes (default 1)\n"
            "  --nproc-per-node G  ranks a node (required)\n"
            "  --device-memory M   bytes a rank may hold: K M G T (powers of 1000), Ki Mi Gi Ti\n"
            "                      (of 1024), an optional B (\"512Mi\", \"1GiB\"); default: no budget\n"
            "  --global-batch B    samples a step (default: train.global_batch, else the job's\n"
            "                      batch_size x grad_accum x its data degree)\n"
            "  --json              every figure as JSON on stdout\n"
            "  --top K             rows of the table (default 20; --json lists all)\n"
            "  --check K           run the K best layouts for a few steps on this host (one node,\n"
            "                      N x G ranks) and print predicted against measured\n"
            "  --check-steps S     steps each checked layout runs (default 4; the first is not\n"
            "                      timed)\n");
}

/* ---- output -------------------------------------------------------------------------------- */

void dt_plan_print(const dt_plan *p, int top, FILE *out)
{
    fprintf(out, "# dtrain plan: %s on %d rank(s), global batch %lld; GEMM %.1f GFLOP/s a rank, "
                 "shared memory %.2f GB/s, TCP %.2f GB/s\n",
            p->model, p->world, (long long)p->global_batch, p->rates.gemm_flops / 1e9,
            p->rates.shm_bw / 1e9, p->rates.net_bw / 1e9);
    fprintf(out, "# %d layout(s), %d fit; MiB per rank (the costliest rank); step in ms\n", p->n,
            p->n_fit);
    fprintf(out, "%4s  %-40s %8s %8s %8s %8s %8s %9s %9s %8s  %s\n", "rank", "layout", "params",
            "grads", "optim", "acts", "comm", "peak", "step_ms", "bubble", "fits");
    int shown = 0;
    for (int i = 0; i < p->n && shown < top; i++, shown++) {
        const dt_plan_layout *l = &p->v[i];
        char name[96];
        dt_plan_layout_name(l, name, sizeof name);
        fprintf(out, "%4d  %-40s %8.2f %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %8.2f  %s%s\n", i + 1,
                name, l->mem[DT_MEM_PARAMS] / MIB, l->mem[DT_MEM_GRADS] / MIB,
                l->mem[DT_MEM_OPTIM] / MIB, l->mem[DT_MEM_ACTS] / MIB,
                l->mem[DT_MEM_COMM] / MIB, l->peak_bytes / MIB, l->step_s * 1e3,
                l->bubble_s * 1e3, l->fits ? "yes" : "no: ", l->fits ? "" : l->why);
    }
    /* the best of those that do not fit, when the table stopped before them */
    if (p->n_fit >= top && p->n_fit < p->n) {
        const dt_plan_layout *l = &p->v[p->n_fit];
        char name[96];
        dt_plan_layout_name(l, name, sizeof name);
        fprintf(out, "  ... %d more that fit; %d that do not, the nearest: %s: %s\n",
                p->n_fit - top, p->n - p->n_fit, name, l->why);
    }
    for (int i = 0; i < p->n_excluded_why; i++)
        fprintf(out, "# not a layout here: %s\n", p->excluded_why[i]);
    if (p->chosen >= 0) {
        char av[DT_PLAN_OV_MAX][DT_PLAN_OV_LEN];
        int n = dt_plan_overrides(&p->v[p->chosen], av);
        fprintf(out, "# chosen:");
        for (int i = 0; i < n; i++)
            fprintf(out, " %s", av[i]);
        fprintf(out, "\n");
    } else {
        fprintf(out, "# nothing fits the budget\n");
    }
}

static void json_layout(const dt_plan_layout *l, FILE *out)
{
    static const char *const cats[DT_MEM_CAT_COUNT] = {"other", "params", "grads", "optim",
                                                        "activations", "comm"};
    fprintf(out, "{\"data\":%d,\"tensor\":%d,\"pipeline\":%d,\"zero\":%d,\"recompute\":\"%s\","
                 "\"micro_batches\":%d,\"schedule\":\"%s\",\"sequence_parallel\":%s,"
                 "\"batch_size\":%d,\"grad_accum\":%d,\"predicted_peak_bytes\":%.0f,"
                 "\"predicted_step_s\":%.6g,\"compute_s\":%.6g,\"comm_s\":%.6g,"
                 "\"bubble_s\":%.6g,\"fits\":%s",
            l->data, l->tensor, l->pipeline, l->zero, dt_recompute_name(l->recompute),
            l->micro_batches, dt_pp_schedule_name(l->schedule),
            l->sequence_parallel ? "true" : "false", l->batch_size, l->grad_accum,
            l->peak_bytes, l->step_s, l->compute_s, l->comm_s, l->bubble_s,
            l->fits ? "true" : "false");
    fprintf(out, ",\"predicted_bytes\":{");
    for (int c = 0; c < DT_MEM_CAT_COUNT; c++)
        fprintf(out, "%s\"%s\":%.0f", c ? "," : "", cats[c], l->mem[c]);
    fprintf(out, "}");
    if (!l->fits) {
        fprintf(out, ",\"why\":\"");
        for (const char *s = l->why; *s; s++)
            fprintf(out, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
        fprintf(out, "\"");
    }
}

void dt_plan_print_json(const dt_plan *p, bool close, FILE *out)
{
    fprintf(out, "{\"model\":\"%s\",\"world\":%d,\"global_batch\":%lld,\"rates\":{\"gemm_flops\":"
                 "%.6g,\"shm_bw\":%.6g,\"shm_lat\":%.6g,\"net_bw\":%.6g,\"net_lat\":%.6g},"
                 "\"chosen\":%d,\"layouts\":[",
            p->model, p->world, (long long)p->global_batch, p->rates.gemm_flops,
            p->rates.shm_bw, p->rates.shm_lat, p->rates.net_bw, p->rates.net_lat, p->chosen);
    for (int i = 0; i < p->n; i++) {
        fprintf(out, i ? ",\n" : "\n");
        json_layout(&p->v[i], out);
        fprintf(out, "}");
    }
    fprintf(out, "],\"excluded\":[");
    for (int i = 0; i < p->n_excluded_why; i++) {
        fprintf(out, "%s\"", i ? "," : "");
        for (const char *s = p->excluded_why[i]; *s; s++)
            fprintf(out, *s == '"' || *s == '\\' ? "\\%c" : "%c", *s);
        fprintf(out, "\"");
    }
    fprintf(out, "]%s", close ? "}\n" : "");
}

/* ---- --check ------------------------------------------------------------------------------- */

/* The number after "key": in line, or NAN. */
static double json_num(const char *line, const char *key)
{
    char pat[64];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *s = strstr(line, pat);
    return s ? strtod(s + strlen(pat), NULL) : NAN;
}

int dt_plan_measure_layout(const char *bin, const char *job_path, char *const *ov, int n_ov,
                           const dt_plan_layout *l, int world, int steps, const char *dir,
                           dt_plan_measure *out, dt_err *err)
{
    memset(out, 0, sizeof *out);
    char lay[DT_PLAN_OV_MAX][DT_PLAN_OV_LEN];
    int nl = dt_plan_overrides(l, lay);
    char nproc[32], steps_ov[48], outdir[DT_PATH_MAX + 32], log_path[DT_PATH_MAX + 16];
    snprintf(nproc, sizeof nproc, "--nproc-per-node=%d", world);
    snprintf(steps_ov, sizeof steps_ov, "train.steps=%d", steps);
    snprintf(outdir, sizeof outdir, "job.output_dir=%s", dir);
    snprintf(log_path, sizeof log_path, "%s.log", dir);
    char *fixed[] = {"checkpoint.resume=never", "checkpoint.every=0", "train.eval_every=0",
                     "job.log_every=1", "train.eval_batches=1", "elastic.max_restarts=0",
                     "job.device=cpu"};
    size_t nfixed = DT_ARRAY_LEN(fixed);
    char **av = calloc((size_t)(n_ov + nl) + nfixed + 8, sizeof *av);
    if (!av)
        return dt_err_set(err, -ENOMEM, "out of memory");
    int n = 0;
    av[n++] = (char *)(bin ? bin : dt_cmd_self_path());
    av[n++] = "--nnodes=1";
    av[n++] = nproc;
    av[n++] = (char *)job_path;
    for (int i = 0; i < n_ov; i++)
        av[n++] = ov[i];
    for (int i = 0; i < nl; i++)
        av[n++] = lay[i];
    for (size_t i = 0; i < nfixed; i++)
        av[n++] = fixed[i];
    av[n++] = steps_ov;
    av[n++] = outdir;
    av[n] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, av[0], &fa, NULL, av, environ);
    posix_spawn_file_actions_destroy(&fa);
    free(av);
    if (rc)
        return dt_err_set(err, -rc, "could not start the launcher: %s", strerror(rc));
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return dt_err_set(err, -EIO, "the layout's run failed (exit %d): see %s",
                          WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), log_path);
    char path[DT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    FILE *f = fopen(path, "r");
    if (!f)
        return dt_err_set(err, -errno, "%s: %s", path, strerror(errno));
    static const char *const cats[DT_MEM_CAT_COUNT] = {"other", "params", "grads", "optim",
                                                        "activations", "comm"};
    char line[4096];
    double times[1024];
    int nt = 0;
    while (fgets(line, sizeof line, f)) {
        if (!strstr(line, "\"type\":\"train\""))
            continue;
        double step = json_num(line, "step"), t = json_num(line, "step_time_s");
        if (step >= 2 && isfinite(t) && nt < 1024)
            times[nt++] = t;
        /* each record's peaks are its own steps': the run's are the largest */
        out->peak_bytes = DT_MAX(out->peak_bytes, json_num(line, "peak_mem_bytes"));
        const char *m = strstr(line, "\"mem_peak_bytes\":");
        for (int c = 0; m && c < DT_MEM_CAT_COUNT; c++)
            out->mem[c] = DT_MAX(out->mem[c], json_num(m, cats[c]));
    }
    fclose(f);
    if (nt == 0)
        return dt_err_set(err, -EIO, "%s: no timed step (steps >= 2) in it", path);
    qsort(times, (size_t)nt, sizeof times[0], dt_cmp_double);
    out->step_s = times[nt / 2];
    return 0;
}

/* ---- the command --------------------------------------------------------------------------- */

static int int_flag(const char *flag, const char *v, int lo, int *out)
{
    if (!v || dt_parse_int(v, out) || *out < lo) {
        fprintf(stderr, "dtrain plan: %s needs a whole number >= %d (given \"%s\"); e.g. %s "
                        "%d\n", flag, lo, v ? v : "", flag, lo > 1 ? lo : 2);
        return -1;
    }
    return 0;
}

int dt_cmd_plan(int argc, char **argv)
{
    const char *job_path = NULL;
    char **ov = calloc((size_t)argc + 1, sizeof *ov);
    if (!ov)
        return 1;
    int n_ov = 0, nnodes = 1, nproc = 0, top = 20, check = 0, check_steps = 4, code = 2;
    bool json = false;
    dt_plan_req req = {0};
    dt_plan plan = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        char flag[64];
        const char *eq = strchr(a, '=');
        if (a[0] == '-' && a[1] == '-' && eq) { /* --flag=value */
            snprintf(flag, sizeof flag, "%.*s", (int)(eq - a), a);
            v = eq + 1;
        } else {
            snprintf(flag, sizeof flag, "%s", a);
        }
        bool takes = !strcmp(flag, "--nnodes") || !strcmp(flag, "--nproc-per-node") ||
                     !strcmp(flag, "--device-memory") || !strcmp(flag, "--global-batch") ||
                     !strcmp(flag, "--top") || !strcmp(flag, "--check") ||
                     !strcmp(flag, "--check-steps");
        if (takes && !v) {
            if (i + 1 >= argc) {
                fprintf(stderr, "dtrain plan: %s needs a value (see dtrain plan --help)\n", flag);
                goto out;
            }
            v = argv[++i];
        }
        if (!strcmp(flag, "--help") || !strcmp(flag, "-h")) {
            usage(stdout);
            code = 0;
            goto out;
        } else if (!strcmp(flag, "--json")) {
            json = true;
        } else if (!strcmp(flag, "--nnodes")) {
            if (int_flag("--nnodes", v, 1, &nnodes))
                goto out;
        } else if (!strcmp(flag, "--nproc-per-node")) {
            if (int_flag("--nproc-per-node", v, 1, &nproc))
                goto out;
        } else if (!strcmp(flag, "--top")) {
            if (int_flag("--top", v, 1, &top))
                goto out;
        } else if (!strcmp(flag, "--check")) {
            if (int_flag("--check", v, 1, &check))
                goto out;
        } else if (!strcmp(flag, "--check-steps")) {
            if (int_flag("--check-steps", v, 2, &check_steps))
                goto out;
        } else if (!strcmp(flag, "--device-memory")) {
            if (dt_plan_parse_bytes(v, &req.device_memory)) {
                fprintf(stderr, "dtrain plan: --device-memory \"%s\" is not a size: a number "
                                "with K, M, G, T (powers of 1000) or Ki, Mi, Gi, Ti (of 1024), "
                                "e.g. --device-memory 16Gi\n", v);
                goto out;
            }
        } else if (!strcmp(flag, "--global-batch")) {
            int64_t gb = 0;
            if (dt_parse_i64(v, &gb) || gb < 1) {
                fprintf(stderr, "dtrain plan: --global-batch needs a whole number of samples "
                                ">= 1 (given \"%s\"), e.g. --global-batch 32\n", v);
                goto out;
            }
            req.global_batch = gb;
        } else if (a[0] == '-') {
            fprintf(stderr, "dtrain plan: unknown option %s (see dtrain plan --help)\n", a);
            goto out;
        } else if (strchr(a, '=')) {
            ov[n_ov++] = argv[i];
        } else if (!job_path) {
            job_path = a;
        } else {
            fprintf(stderr, "dtrain plan: a second job file \"%s\" (one job, then "
                            "section.key=value overrides)\n", a);
            goto out;
        }
    }
    if (!job_path) {
        fprintf(stderr, "dtrain plan: no job file given\n");
        usage(stderr);
        goto out;
    }
    if (nproc < 1) {
        fprintf(stderr, "dtrain plan: --nproc-per-node is required: the ranks a node runs, "
                        "e.g. --nproc-per-node 4\n");
        goto out;
    }
    req.nnodes = nnodes;
    req.nproc = nproc;
    static dt_job job;
    static dt_config_errors errs;
    dt_err err = {0};
    if (dt_job_load(&job, job_path, ov, n_ov, &errs, &err)) {
        for (int i = 0; i < errs.count && i < 64; i++)
            fprintf(stderr, "%s\n", errs.lines[i]);
        fprintf(stderr, "dtrain plan: %s\n", err.msg);
        goto out;
    }
    if (dt_plan_make(&plan, &job, &req, NULL, &err)) {
        fprintf(stderr, "dtrain plan: %s\n", err.msg);
        code = err.code == -EINVAL ? 2 : 1;
        goto out;
    }
    code = 0;
    if (json)
        dt_plan_print_json(&plan, check == 0, stdout);
    else
        dt_plan_print(&plan, top, stdout);
    if (check > 0) {
        int k = DT_MIN(check, plan.n_fit > 0 ? plan.n_fit : plan.n);
        char tmpl[] = "/tmp/dtrain-plan-XXXXXX";
        if (!mkdtemp(tmpl)) {
            fprintf(stderr, "dtrain plan: mkdtemp: %s\n", strerror(errno));
            code = 1;
            goto out;
        }
        double *pt = calloc((size_t)k, sizeof *pt), *mt = calloc((size_t)k, sizeof *mt);
        int nm = 0;
        if (!json)
            printf("\n# check: predicted against measured (%d steps, the median step after the "
                   "first)\n%4s  %-40s %10s %10s %7s %9s %9s %7s\n",
                   check_steps, "rank", "layout", "pred_MiB", "meas_MiB", "ratio", "pred_ms",
                   "meas_ms", "ratio");
        else
            printf(",\"check\":[");
        for (int i = 0; i < k && pt && mt; i++) {
            const dt_plan_layout *l = &plan.v[i];
            char dir[64 + sizeof tmpl], name[96];
            snprintf(dir, sizeof dir, "%s/%d", tmpl, i);
            dt_plan_layout_name(l, name, sizeof name);
            dt_plan_measure ms;
            dt_err e = {0};
            if (dt_plan_measure_layout(NULL, job_path, ov, n_ov, l, plan.world, check_steps, dir, &ms,
                                       &e)) {
                fprintf(stderr, "dtrain plan: --check %s: %s\n", name, e.msg);
                code = 1;
                continue;
            }
            pt[nm] = l->step_s;
            mt[nm++] = ms.step_s;
            if (!json) {
                printf("%4d  %-40s %10.2f %10.2f %7.3f %9.2f %9.2f %7.3f\n", i + 1, name,
                       l->peak_bytes / MIB, ms.peak_bytes / MIB, ms.peak_bytes / l->peak_bytes,
                       l->step_s * 1e3, ms.step_s * 1e3, ms.step_s / l->step_s);
            } else {
                printf("%s\n", nm > 1 ? "," : "");
                json_layout(l, stdout);
                printf(",\"measured_peak_bytes\":%.0f,\"measured_step_s\":%.6g,"
                       "\"measured_bytes\":{\"params\":%.0f,\"grads\":%.0f,\"optim\":%.0f,"
                       "\"activations\":%.0f,\"comm\":%.0f,\"other\":%.0f}}",
                       ms.peak_bytes, ms.step_s, ms.mem[DT_MEM_PARAMS], ms.mem[DT_MEM_GRADS],
                       ms.mem[DT_MEM_OPTIM], ms.mem[DT_MEM_ACTS], ms.mem[DT_MEM_COMM],
                       ms.mem[DT_MEM_OTHER]);
            }
        }
        double rho = nm >= 2 ? dt_plan_spearman(pt, mt, nm) : NAN;
        if (!json)
            printf("# rank correlation (Spearman) of predicted and measured step: %.3f over %d "
                   "layout(s)\n", rho, nm);
        else
            printf("],\"check_spearman\":%.4g", isfinite(rho) ? rho : 0);
        free(pt);
        free(mt);
        dt_err e = {0};
        dt_rm_rf(tmpl, &e);
    }
    if (json && check > 0)
        printf("}\n");
out:
    dt_plan_free(&plan);
    free(ov);
    return code;
}
