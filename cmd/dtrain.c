/* dtrain.c - the dtrain command: subcommand dispatch and the default `run` (the launcher).
 *
 * cmd/ only parses and dispatches; the agent (runtime/launch/agent) does the launching. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cmd/args.h"
#include "cmd/blas_boot.h"
#include "cmd/cmd.h"
#include "cmd/plan.h"
#include "common/env.h"
#include "common/log.h"
#include "common/util.h"
#include "kernels/backend.h"
#include "runtime/launch/agent.h"
#include "runtime/job/config.h"
#include "runtime/job/preflight.h"
#include "runtime/job/workenv.h"

#ifndef DT_VERSION
#define DT_VERSION "0.0.0"
#endif

const char *dt_cmd_self_path(void)
{
    static char path[PATH_MAX];
    if (!path[0]) {
        ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
        if (n <= 0)
            dt_strlcpy(path, "dtrain", sizeof path);
        else
            path[n] = '\0';
    }
    return path;
}

static void print_version(void)
{
    char so[PATH_MAX];
    bool have = dt_cuda_lib_path(so, sizeof so) == 0 && access(so, R_OK) == 0;
    printf("dtrain %s\n", DT_VERSION);
    printf("CPU backend: built in (OpenBLAS)\n");
    printf("CUDA backend: %s%s\n", have ? so : "not built (no nvcc at build time): no ",
           have ? "" : so);
}

static void print_env_help(void)
{
    printf("DTRAIN_* environment variables:\n");
    for (size_t i = 0; i < dt_env_vars_count; i++)
        printf("  %-20s %s%s%s%s\n", dt_env_vars[i].name, dt_env_vars[i].help,
               dt_env_vars[i].def ? " [default: " : "", dt_env_vars[i].def ? dt_env_vars[i].def : "",
               dt_env_vars[i].def ? "]" : "");
}

static void print_config_errors(const dt_config_errors *errs)
{
    int shown = errs->count < (int)DT_ARRAY_LEN(errs->lines) ? errs->count : (int)DT_ARRAY_LEN(errs->lines);
    for (int i = 0; i < shown; i++)
        fprintf(stderr, "dtrain: %s\n", errs->lines[i]);
    if (errs->count > shown)
        fprintf(stderr, "dtrain: ... and %d more errors\n", errs->count - shown);
}

/* Whether the other nodes of this job wait for this one until join_timeout when it stays out:
 * a static rendezvous of several nodes. An elastic job goes on without it (or waits for MIN). */
static bool waits_for_every_node(const dt_launch *L)
{
    int n = 0;
    return !L->standalone && L->rdzv_backend == DT_RDZV_STATIC &&
           dt_parse_int(L->nnodes, &n) == 0 && n > 1;
}

static bool is_ini(const char *path)
{
    size_t n = strlen(path);
    return n >= 4 && !strcasecmp(path + n - 4, ".ini");
}

/* An executable regular file: what someone used to `torchrun prog` may pass as the job. */
static bool is_program(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Writes the resolved job (dt_job_print, which dt_job_load reads back to the same job) to
 * <dir>/job.ini in a new private directory under $TMPDIR (mode 0700): what `dtrain worker`
 * loads in every worker of this agent, on every attempt. dir and path get the names (the
 * caller removes both). */
static int write_resolved_job(const dt_job *job, char *dir, size_t dcap, char *path,
                              size_t pcap, dt_err *err)
{
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp)
        tmp = "/tmp";
    path[0] = '\0';
    if ((size_t)snprintf(dir, dcap, "%s/dtrain-job-XXXXXX", tmp) + 16 >= DT_MIN(dcap, pcap)) {
        dir[0] = '\0';
        return dt_err_set(err, -ENAMETOOLONG, "TMPDIR is too long: %s", tmp);
    }
    if (!mkdtemp(dir)) {
        dir[0] = '\0';
        return dt_err_errno(err, errno, "cannot create a directory for the resolved job under "
                                        "%s (set TMPDIR to a writable directory)", tmp);
    }
    snprintf(path, pcap, "%s/job.ini", dir);
    FILE *f = fopen(path, "wx");
    if (!f)
        return dt_err_errno(err, errno, "cannot write the resolved job to %s", path);
    dt_job_print(job, f);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad)
        return dt_err_errno(err, errno ? errno : EIO, "cannot write the resolved job to %s", path);
    return 0;
}

/* The agent's hook for parallel.layout = auto on an elastic job (runtime/launch/agent_layout.h):
 * the planner's layout for a round (cmd/plan.h). */
static int auto_layout(void *arg, int nnodes, int nproc, const char *given, char *choice,
                       size_t cap, int *tensor, int *pipeline, dt_err *err)
{
    return dt_plan_auto_round(arg, nnodes, nproc, given, choice, cap, tensor, pipeline, err);
}

/* The default subcommand: parse launcher options and the job, then run the agent. */
static int cmd_run(int argc, char **argv)
{
    dt_args a;
    dt_err err = {0};
    static dt_job job;
    static dt_config_errors errs;
    static char setup_error[DT_ERR_MSG_MAX]; /* this node's files failed their check */
    int code = DT_EXIT_CONFIG;

    if (dt_args_parse(&a, argc, argv, &err) != 0) {
        fprintf(stderr, "dtrain: %s\n", err.msg);
        goto out;
    }
    if (a.help) {
        dt_args_print_help(stdout);
        code = 0;
        goto out;
    }
    if (a.version) {
        print_version();
        code = 0;
        goto out;
    }
    if (a.help_config) {
        dt_job_print_reference(stdout);
        code = 0;
        goto out;
    }
    if (a.help_env) {
        print_env_help();
        code = 0;
        goto out;
    }
    if (a.start_method)
        fprintf(stderr, "dtrain: --start-method=%s ignored: dtrain always fork+execs its workers\n",
                a.start_method);
    memset(&errs, 0, sizeof errs);
    if (a.job_path && !is_ini(a.job_path) && is_program(a.job_path)) {
        fprintf(stderr,
                "dtrain: %s is a program, not a job file: to run a command, put it after -- "
                "(dtrain [options] -- %s ...)\n",
                a.job_path, a.job_path);
        goto out;
    }
    if (a.job_path) {
        /* PET_* first, then overrides, then flags (dt_args orders them): the last one wins. */
        if (dt_job_load_settings(&job, a.job_path, a.settings, a.n_settings, &errs, &err) != 0) {
            print_config_errors(&errs);
            fprintf(stderr, "dtrain: %s; nothing was started\n", err.msg);
            goto out;
        }
        /* parallel.layout = auto: the planner's layout for this world, resolved here once */
        if (dt_plan_apply_auto(&job, &err) != 0) {
            fprintf(stderr, "dtrain: %s; nothing was started\n", err.msg);
            code = DT_EXIT_CONFIG;
            goto out;
        }
        if (a.print_config) {
            dt_job_print(&job, stdout);
            code = 0;
            goto out;
        }
        /* this node's files: what the job reads is there, what it writes can be written */
        if (dt_preflight_check(&job, &errs) != 0) {
            print_config_errors(&errs);
            bool others_wait = waits_for_every_node(&job.launch);
            fprintf(stderr, "dtrain: %d error%s in the job's files and directories on this node "
                    "(%s); nothing was started%s\n", errs.count, errs.count == 1 ? "" : "s",
                    dt_hostname(), others_wait ? " (joining the rendezvous only to end the "
                    "job on every node)" : "");
            if (!others_wait)
                goto out;
            snprintf(setup_error, sizeof setup_error, "%s%s", errs.lines[0],
                     errs.count > 1 ? " (and more: see that node's output)" : "");
        }
    } else {
        /* The same settings, conf folding and validation as with a job file. */
        if (dt_launch_load(&job, a.settings, a.n_settings, &errs, &err) != 0) {
            print_config_errors(&errs);
            fprintf(stderr, "dtrain: %s; nothing was started\n", err.msg);
            goto out;
        }
        if (a.print_config) {
            fprintf(stderr, "dtrain: --print-config needs a job file\n");
            goto out;
        }
    }

    dt_agent_spec spec;
    memset(&spec, 0, sizeof spec);
    spec.launch = job.launch;
    if (a.job_path) {
        /* The workers load the job this agent resolved (file, PET_*, DTRAIN_OUTPUT_DIR,
         * overrides, flags), written once; never the job file and the settings again. */
        char dir[PATH_MAX], path[PATH_MAX + 16];
        if (write_resolved_job(&job, dir, sizeof dir, path, sizeof path, &err) == 0) {
            char *wargv[] = {(char *)dt_cmd_self_path(), "worker", path, NULL};
            spec.argv = wargv;
            spec.builtin_worker = true;
            /* the OpenBLAS kernel of the built-in workers (cmd/blas_boot.h), decided once here:
             * each worker gets it in its environment instead of probing and re-executing */
            static dt_blas_choice bc;
            static char bkv[2][700];
            static char *benv[3];
            dt_blas_choose(&bc);
            if (bc.coretype[0]) {
                char v[600];
                dt_blas_choice_value(&bc, v, sizeof v);
                snprintf(bkv[0], sizeof bkv[0], "OPENBLAS_CORETYPE=%s", bc.coretype);
                snprintf(bkv[1], sizeof bkv[1], "DTRAIN_BLAS_CHOICE=%s", v);
                benv[0] = bkv[0];
                benv[1] = bkv[1];
                spec.worker_env = benv;
            }
            spec.tensor = job.tensor;
            spec.pipeline = job.pipeline;
            spec.global_batch = job.global_batch;
            static dt_plan_auto pa;
            if (dt_plan_auto_elastic(&job)) { /* planned per round, for the round's world */
                pa = (dt_plan_auto){.job = &job, .path = path};
                spec.layout = auto_layout;
                spec.layout_arg = &pa;
            }
            spec.flight = (dt_agent_flight_opts){job.flight_records, job.step_timeout,
                                                 job.straggler_ratio, job.straggler_window};
            spec.setup_error = setup_error[0] ? setup_error : NULL;
            dt_strlcpy(spec.output_dir, job.output_dir, sizeof spec.output_dir);
            char *shared = dt_job_shared_text(&job);
            spec.job_shared = shared;
            code = shared ? dt_agent_run(&spec, &err) : dt_err_set(&err, -ENOMEM, "out of memory");
            free(shared);
        } else {
            code = -1;
        }
        if (path[0])
            unlink(path);
        if (dir[0])
            rmdir(dir);
    } else {
        spec.argv = a.command;
        code = dt_agent_run(&spec, &err);
        if (a.python && code != 0 && code != DT_EXIT_PREEMPTED && code < 128)
            fprintf(stderr, "dtrain: the workers ran %s with %s (%s); another interpreter: "
                    "--python PATH or DTRAIN_PYTHON=PATH\n", a.command[1], a.python,
                    a.python_from ? a.python_from : "the first python3 on PATH");
    }
    if (code < 0) {
        fprintf(stderr, "dtrain: %s\n", err.msg);
        code = 1;
    }
out:
    dt_args_free(&a);
    return code;
}

static int cmd_help(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    dt_args_print_help(stdout);
    return 0;
}

static const struct {
    const char *name;
    int (*fn)(int, char **);
} subcommands[] = {
    {"worker", dt_cmd_worker}, {"store", dt_cmd_store}, {"bench", dt_cmd_bench},
    {"ckpt", dt_cmd_ckpt},     {"debug", dt_cmd_debug},   {"plan", dt_cmd_plan},
    {"help", cmd_help},
};

int dt_cmd_main(int argc, char **argv)
{
    dt_log_init();
    if (argc >= 2) {
        for (size_t i = 0; i < DT_ARRAY_LEN(subcommands); i++)
            if (!strcmp(argv[1], subcommands[i].name)) {
                dt_log_set_role(subcommands[i].name);
                return subcommands[i].fn(argc - 1, argv + 1);
            }
        if (!strcmp(argv[1], "run")) /* explicit form of the default */
            return cmd_run(argc - 1, argv + 1);
        /* "dtrain wroker": a word that is no file but close to a subcommand. */
        const char *word = argv[1];
        if (word[0] != '-' && !strchr(word, '.') && !strchr(word, '/') && !strchr(word, '=') &&
            access(word, F_OK) != 0) {
            const char *names[DT_ARRAY_LEN(subcommands) + 1];
            for (size_t i = 0; i < DT_ARRAY_LEN(subcommands); i++)
                names[i] = subcommands[i].name;
            names[DT_ARRAY_LEN(subcommands)] = "run";
            const char *near = dt_nearest(word, names, DT_ARRAY_LEN(names));
            if (near) {
                fprintf(stderr, "dtrain: unknown subcommand \"%s\"; did you mean %s? (see dtrain "
                                "--help)\n",
                        word, near);
                return DT_EXIT_CONFIG;
            }
        }
    }
    dt_log_set_role("agent");
    return cmd_run(argc, argv);
}
