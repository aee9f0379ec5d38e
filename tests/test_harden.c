/* test_harden.c - issue #34's hardening, end to end through the real binary: configuration
 * errors found at load (read-only or file output and checkpoint directories, a missing data
 * file, settings no worker can run), which exit 2 before anything starts and spend no restart;
 * checkpoints that must never be lost (only damaged ones of this setup: exit 2, never replaced;
 * another setup's at a step this run would save; a step_<N> whose state.json is another step's);
 * a signal to one worker; metrics.jsonl's run id; `dtrain ckpt list` on an output directory;
 * the interpreter of SCRIPT.py; the words of a resumed run's summary; the quickstart's curve.
 *
 * Each test ran against the code before its fix and failed there (the commit messages say how).
 * A test that needs a read-only file system mounts a read-only tmpfs in a mount namespace of its
 * own (unshare -m, as root); where that is not possible it is skipped, saying why. */
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/util.h"
#include "rendezvous/rdzv_common.h"
#include "runtime/job/config.h"
#include "runtime/train/ckpt/ckpt.h"
#include "tests/fixtures.h"
#include "tests/harness.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

/* Runs cmd (stdout and stderr together); *code gets the exit code. Never NULL. */
static char *run(const char *cmd, int *code, int timeout_s)
{
    char *out = NULL;
    *code = dt_test_run(cmd, &out, timeout_s);
    return out ? out : strdup("");
}

static __attribute__((unused)) int count_of(const char *hay, const char *needle)
{
    int n = 0;
    for (const char *p = hay; p && (p = strstr(p, needle)); p += strlen(needle))
        n++;
    return n;
}

/* A small mlp job (a few seconds for 60 steps), written once per test process. */
static const char *mlp_job(void)
{
    static char path[1024];
    if (path[0])
        return path;
    snprintf(path, sizeof path, "%s/mlp.ini", TMP);
    DT_REQUIRE(dt_test_write_file(path,
                                  "[job]\nname = h\nseed = 3\ndevice = cpu\nlog_every = 1\n"
                                  "[model]\ntype = mlp\nhidden = 32\n"
                                  "[data]\ntype = synthetic\nsynthetic_samples = 2048\n"
                                  "synthetic_dim = 16\nsynthetic_classes = 4\n"
                                  "[train]\nbatch_size = 16\nsteps = 60\nlr = 1e-3\nthreads = 1\n"
                                  "[checkpoint]\nevery = 20\nkeep = 5\n") == 0);
    return path;
}

/* Whether this process may mount a read-only tmpfs in a mount namespace of its own. */
static void need_unshare(void)
{
    char cmd[2048];
    int code;
    snprintf(cmd, sizeof cmd, "mkdir -p %s/rotest && unshare -m sh -c 'mount -t tmpfs -o ro "
             "tmpfs %s/rotest && ! touch %s/rotest/x' 2>&1", TMP, TMP, TMP);
    free(run(cmd, &code, 30));
    if (code != 0)
        DT_SKIP("cannot mount a read-only tmpfs in a mount namespace (needs root and unshare)");
}

/* `dtrain ARGS` with DIR a read-only tmpfs (made and mounted for this command only). */
static char *run_with_ro(const char *dir, const char *args, int *code)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "mkdir -p %s && unshare -m sh -c 'mount -t tmpfs -o ro tmpfs %s "
             "&& exec %s %s' 2>&1", dir, dir, BIN, args);
    return run(cmd, code, 120);
}

/* ---- configuration errors found at load (#34 items 3, 6, 13) ------------------------------ */

/* A read-only checkpoint.dir or job.output_dir: exit 2 before any training, whatever the
 * restart budget, instead of training and failing at the first save (3 times with
 * --max-restarts=2). */
static void test_readonly_dirs_at_load(void)
{
    need_unshare();
    const char *keys[] = {"checkpoint.dir", "job.output_dir"};
    for (int k = 0; k < 2; k++) {
        char ro[1024], args[4096];
        snprintf(ro, sizeof ro, "%s/ro%d", TMP, k);
        snprintf(args, sizeof args, "--max-restarts=2 %s job.output_dir=%s/out%d %s=%s%s",
                 mlp_job(), TMP, k, keys[k], ro, k ? "/sub" : "");
        int code;
        char *o = run_with_ro(ro, args, &code);
        DT_CHECK_MSG(code == 2, "%s read-only: exit %d: %.3000s", keys[k], code, o);
        DT_CHECK_CONTAINS(o, keys[k]);
        DT_CHECK_CONTAINS(o, "Read-only file system");
        DT_CHECK_CONTAINS(o, "nothing was started");
        DT_CHECK_MSG(!strstr(o, "step 1/"), "it trained: %.3000s", o);
        free(o);
    }
}

/* An output_dir that is a file, the same way. */
static void test_output_dir_file_at_load(void)
{
    char f[1024], cmd[4096];
    snprintf(f, sizeof f, "%s/afile", TMP);
    DT_REQUIRE(dt_test_write_file(f, "x") == 0);
    snprintf(cmd, sizeof cmd, "%s --max-restarts=2 %s job.output_dir=%s/sub", BIN, mlp_job(), f);
    int code;
    char *o = run(cmd, &code, 120);
    DT_CHECK_MSG(code == 2, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "job.output_dir");
    DT_CHECK_CONTAINS(o, "nothing was started");
    DT_CHECK(!strstr(o, "restarting every worker"));
    free(o);
}

/* A missing data file: one error at load naming the key and where it was set, exit 2, no
 * attempt spent (it was three attempts and exit 1, and scripts/dtrain-retry.sh retried it). */
static void test_missing_data_at_load(void)
{
    const char *qs = dt_test_fmt("%s/configs/quickstart.ini", dt_test_repo_dir("configs"));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --max-restarts=2 %s job.output_dir=%s/q data.path=%s/nope.txt",
             BIN, qs, TMP, TMP);
    int code;
    char *o = run(cmd, &code, 120);
    DT_CHECK_MSG(code == 2, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "data.path");
    DT_CHECK_CONTAINS(o, "nope.txt");
    DT_CHECK_CONTAINS(o, "No such file or directory");
    DT_CHECK_CONTAINS(o, "override 2 (data.path="); /* where it was set */
    DT_CHECK_CONTAINS(o, "nothing was started");
    DT_CHECK(!strstr(o, "restarting every worker"));
    DT_CHECK(!strstr(o, "attempt"));
    free(o);
    /* `dtrain worker` alone: the configuration exit code, not 1. */
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s/q data.path=%s/nope.txt", BIN, qs,
             TMP, TMP);
    o = run(cmd, &code, 120);
    DT_CHECK_MSG(code == 2, "worker: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "nope.txt");
    free(o);
}

/* Two static nodes, one of which lacks its data file (each node checks its own): that node
 * exits 2 at load, and the other, which waited for it until join_timeout (600 s by default)
 * before exiting 1, learns why at once and exits 2 too, whichever of them hosts the store. */
static void test_missing_data_one_node(void)
{
    const char *qs = dt_test_fmt("%s/configs/quickstart.ini", dt_test_repo_dir("configs"));
    for (int bad = 0; bad < 2; bad++) {
        dt_test_group g;
        dt_test_group_init(&g);
        char line[8192], out[2][1024];
        for (int k = 0; k < 2; k++)
            snprintf(out[k], sizeof out[k], "%s/mn%d_%d.out", TMP, bad, k);
        /* a worker already started on the good node is stopped within stop_grace */
        const char *flags = "--nproc-per-node 1 --rdzv-conf join_timeout=300,close_timeout=20 "
                            "--stop-grace 5";
        const char *ov = "job.device=cpu train.steps=3 train.eval_every=0 checkpoint.every=0";
        dt_err e = {0};
        DT_REQUIRE_OK(dt_rdzv_free_port(&g.port, &e), &e); /* node 0 may never bind one */
        snprintf(line, sizeof line, "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 "
                 "--master-port %d %s %s %s job.output_dir=%s/mn%d_0 %s", BIN, g.port, flags, qs,
                 ov, TMP, bad, bad == 0 ? dt_test_fmt("data.path=%s/nope.txt", TMP) : "");
        dt_test_group_spawn(&g, 0, line, out[0]);
        snprintf(line, sizeof line, "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 "
                 "--master-port %d %s %s %s job.output_dir=%s/mn%d_1 %s", BIN, g.port, flags, qs,
                 ov, TMP, bad, bad == 1 ? dt_test_fmt("data.path=%s/nope.txt", TMP) : "");
        dt_test_group_spawn(&g, 1, line, out[1]);
        dt_test_group_wait(&g, 60 * dt_test_timeout_scale());
        for (int k = 0; k < 2; k++) {
            char *o = dt_test_slurp(out[k]);
            DT_CHECK_MSG(g.code[k] == 2, "bad node %d: node %d exited %d: %.3000s", bad, k,
                         g.code[k], o ? o : "");
            DT_CHECK_CONTAINS(o, "nope.txt"); /* the good node says why too */
            DT_CHECK_MSG(o && !strstr(o, "step 1/"), "node %d trained: %.3000s", k, o ? o : "");
            if (k == bad)
                DT_CHECK_CONTAINS(o, "nothing was started");
            free(o);
        }
        dt_test_group_kill(&g);
    }
}

/* Settings no worker can run: found at load (recompute = selective on an mlp, nccl on the
 * cpu), or by the worker with the configuration exit code, which the agent does not retry (a
 * batch larger than the data; a device this node does not have: CUDA_VISIBLE_DEVICES="" hides
 * every GPU, where there are any). The last three exited 1 and were restarted. */
static void test_worker_config_errors_not_retried(void)
{
    const struct {
        const char *pre, *args, *want;
        bool at_load;
    } cases[] = {
        {"", "train.recompute=selective", "train.recompute", true},
        {"", "train.batch_size=1000000", "fewer than one step needs", false},
        {"", "ddp.backend=nccl", "ddp.backend", true},
        {"CUDA_VISIBLE_DEVICES=", "job.device=cuda", "CUDA", false},
        {"CUDA_VISIBLE_DEVICES=", "--nproc-per-node=2 job.device=auto ddp.backend=nccl",
         "needs device = cuda", false},
    };
    for (size_t k = 0; k < DT_ARRAY_LEN(cases); k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s %s --max-restarts=2 %s job.output_dir=%s/c%zu %s",
                 cases[k].pre, BIN, mlp_job(), TMP, k, cases[k].args);
        int code;
        char *o = run(cmd, &code, 120);
        DT_CHECK_MSG(code == 2, "%s: exit %d: %.3000s", cases[k].args, code, o);
        DT_CHECK_CONTAINS(o, cases[k].want);
        DT_CHECK_MSG(!strstr(o, "restarting every worker"), "%s: restarted: %.3000s", cases[k].args, o);
        if (cases[k].at_load)
            DT_CHECK_CONTAINS(o, "nothing was started");
        free(o);
    }
}

/* ---- checkpoints that must not be lost (#34 items 4, 5, 10, and the foreign file) ---------- */

/* sh -c cmd; fails the test unless it exits 0. */
static void sh(const char *cmd)
{
    int code;
    char *o = run(cmd, &code, 60);
    DT_CHECK_MSG(code == 0, "`%s` exited %d: %.2000s", cmd, code, o);
    free(o);
    if (code)
        dt_test_stop();
}

static bool same_file(const char *a, const char *b)
{
    char *x = NULL, *y = NULL;
    size_t xl = 0, yl = 0;
    bool same = dt_read_file(a, &x, &xl, NULL) == 0 && dt_read_file(b, &y, &yl, NULL) == 0 &&
                xl == yl && memcmp(x, y, xl) == 0;
    free(x);
    free(y);
    return same;
}

static bool exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The mlp job trained by `dtrain worker` into TMP/name for `steps` steps (checkpoints every 20),
 * with extra overrides; returns the output directory. */
static const char *train(const char *name, int steps, const char *extra)
{
    const char *out = dt_test_fmt("%s/%s", TMP, name);
    int code;
    char *o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=%d %s 2>&1", BIN,
                              mlp_job(), out, steps, extra),
                  &code, 120);
    DT_CHECK_MSG(code == 0, "training %s: exit %d: %.3000s", name, code, o);
    free(o);
    if (code)
        dt_test_stop();
    return out;
}

/* Every checkpoint of this setup damaged (two model files swapped between step_20 and step_40,
 * recoverable by hand): resume = auto stops with exit 2 before training (it was a warning, a
 * fresh start and both rewritten), and leaves both as they are. */
static void test_only_damaged_checkpoints_stop(void)
{
    const char *out = train("dmg", 40, "");
    const char *ck = dt_test_fmt("%s/checkpoints", out);
    sh(dt_test_fmt("cd %s && mv step_20/model.safetensors m && mv step_40/model.safetensors "
                   "step_20/ && mv m step_40/model.safetensors && cp -r %s %s/saved",
                   ck, ck, TMP));
    int code;
    char *o = run(dt_test_fmt("%s --max-restarts=2 %s job.output_dir=%s train.steps=60 2>&1",
                              BIN, mlp_job(), out),
                  &code, 120);
    DT_CHECK_MSG(code == 2, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "none of the 2 checkpoints");
    DT_CHECK_CONTAINS(o, "checksum mismatch");
    DT_CHECK_CONTAINS(o, "checkpoint.resume = never");
    DT_CHECK_MSG(!strstr(o, "step 1/"), "it trained: %.3000s", o);
    DT_CHECK(!strstr(o, "restarting every worker"));
    free(o);
    const char *files[] = {"step_20/model.safetensors", "step_40/model.safetensors",
                           "step_20/state.json", "step_40/optim.safetensors"};
    for (size_t i = 0; i < DT_ARRAY_LEN(files); i++)
        DT_CHECK_MSG(same_file(dt_test_fmt("%s/%s", ck, files[i]),
                               dt_test_fmt("%s/saved/%s", TMP, files[i])),
                     "%s changed", files[i]);
    /* A fresh start (resume = never) trains, and moves each damaged checkpoint it would save
     * over aside (step_<N>.damaged) instead of replacing it. */
    o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=40 checkpoint.resume=never "
                        "2>&1", BIN, mlp_job(), out),
            &code, 120);
    DT_CHECK_MSG(code == 0, "fresh start: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "step_40.damaged");
    free(o);
    for (size_t i = 0; i < 2; i++)
        DT_CHECK_MSG(same_file(dt_test_fmt("%s/%.7s.damaged/%s", ck, files[i], files[i] + 8),
                               dt_test_fmt("%s/saved/%s", TMP, files[i])),
                     "%s was not kept aside", files[i]);
    DT_CHECK(dt_ckpt_inspect(dt_test_fmt("%s/step_40", ck), true, NULL, NULL) == 0);
    o = run(dt_test_fmt("%s ckpt list %s", BIN, ck), &code, 60);
    DT_CHECK_CONTAINS(o, "set aside as damaged");
    DT_CHECK_CONTAINS(o, "step_40.damaged");
    free(o);
}

/* A damaged newest checkpoint: the run resumes from the one before (as it did), and when it
 * saves that step again the damaged one is moved aside, not replaced. Retention (keep) never
 * deletes a damaged checkpoint either. */
static void test_damaged_checkpoint_kept_aside(void)
{
    const char *out = train("aside", 60, "");
    const char *ck = dt_test_fmt("%s/checkpoints", out);
    sh(dt_test_fmt("truncate -s 100 %s/step_60/optim.safetensors && "
                   "printf 'XXXX' | dd of=%s/step_20/model.safetensors bs=1 seek=200 "
                   "conv=notrunc 2>/dev/null && cp -r %s %s/saved2", ck, ck, ck, TMP));
    int code;
    char *o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=80 checkpoint.keep=1 "
                              "2>&1", BIN, mlp_job(), out),
                  &code, 120);
    DT_CHECK_MSG(code == 0, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "resumed from");
    DT_CHECK_CONTAINS(o, "step_40");
    DT_CHECK_CONTAINS(o, "step_60.damaged");
    free(o);
    DT_CHECK(same_file(dt_test_fmt("%s/step_60.damaged/optim.safetensors", ck),
                       dt_test_fmt("%s/saved2/step_60/optim.safetensors", TMP)));
    DT_CHECK(dt_ckpt_inspect(dt_test_fmt("%s/step_80", ck), true, NULL, NULL) == 0);
    /* keep = 1: step_40 and step_60 (valid) went; the damaged step_20 stays */
    DT_CHECK(!exists(dt_test_fmt("%s/step_40", ck)));
    DT_CHECK(!exists(dt_test_fmt("%s/step_60", ck)));
    DT_CHECK(same_file(dt_test_fmt("%s/step_20/model.safetensors", ck),
                       dt_test_fmt("%s/saved2/step_20/model.safetensors", TMP)));
}

/* Another setup's checkpoint at a step this run would save (an mlp of another width's step_60
 * in a run at step_40 of 80): found before training, exit 2 naming it (it was the failed save
 * at step 60, every attempt). One past the run's last step is only skipped. */
static void test_foreign_future_checkpoint(void)
{
    const char *a = train("fa", 40, "");
    const char *b = train("fb", 60, "model.hidden=64");
    sh(dt_test_fmt("cp -r %s/checkpoints/step_60 %s/checkpoints/", b, a));
    int code;
    char *o = run(dt_test_fmt("%s --max-restarts=2 %s job.output_dir=%s train.steps=80 2>&1",
                              BIN, mlp_job(), a),
                  &code, 120);
    DT_CHECK_MSG(code == 2, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "checkpoints/step_60");
    DT_CHECK_CONTAINS(o, "another setup");
    DT_CHECK_CONTAINS(o, "checkpoint.dir");
    DT_CHECK_MSG(!strstr(o, "step 41/"), "it trained: %.3000s", o);
    DT_CHECK(!strstr(o, "restarting every worker"));
    free(o);
    DT_CHECK(same_file(dt_test_fmt("%s/checkpoints/step_60/model.safetensors", a),
                       dt_test_fmt("%s/checkpoints/step_60/model.safetensors", b)));
    /* off the save schedule (every 25: steps 50, 75, 80) it is refused too, since a stop signal
     * saves at any step; the message says so (it said "a step this run would save") */
    o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=80 checkpoint.every=25 2>&1",
                        BIN, mlp_job(), a),
            &code, 120);
    DT_CHECK_MSG(code == 2, "every=25: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "a stop signal");
    free(o);
    o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=50 2>&1", BIN, mlp_job(), a),
            &code, 120);
    DT_CHECK_MSG(code == 0, "steps=50: exit %d: %.3000s", code, o);
    free(o);
}

/* cp -r step_40 step_80: the copy says step 40 in its state.json. It is never the newest (the
 * run resumed "at step 80" from step 40's state): skipped with a warning, and verify refuses
 * it. */
static void test_renamed_checkpoint_refused(void)
{
    const char *out = train("ren", 60, "");
    const char *ck = dt_test_fmt("%s/checkpoints", out);
    sh(dt_test_fmt("cp -r %s/step_40 %s/step_80", ck, ck));
    int code;
    char *o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=70 2>&1", BIN,
                              mlp_job(), out),
                  &code, 120);
    DT_CHECK_MSG(code == 0, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "step_80");
    DT_CHECK_CONTAINS(o, "state.json is step 40's");
    DT_CHECK_CONTAINS(o, "step_60: step 60");
    free(o);
    o = run(dt_test_fmt("%s ckpt verify %s/step_80 2>&1", BIN, ck), &code, 60);
    DT_CHECK_MSG(code == 1, "verify: exit %d: %.2000s", code, o);
    DT_CHECK_CONTAINS(o, "state.json is step 40's");
    free(o);
}

/* Another model's model.safetensors put into a checkpoint: said as such, not "truncated". */
static void test_foreign_file_named(void)
{
    const char *a = train("ffa", 20, "");
    const char *b = train("ffb", 20, "model.hidden=64");
    sh(dt_test_fmt("cp %s/checkpoints/step_20/model.safetensors %s/checkpoints/step_20/", b, a));
    int code;
    char *o = run(dt_test_fmt("%s ckpt verify %s/checkpoints/step_20 2>&1", BIN, a), &code, 60);
    DT_CHECK_MSG(code == 1, "exit %d: %.2000s", code, o);
    DT_CHECK_CONTAINS(o, "another model");
    DT_CHECK_CONTAINS(o, "tensor fc.0.bias is F32 (64) there");
    DT_CHECK_MSG(!strstr(o, "truncated") && !strstr(o, "appended"), "%.2000s", o);
    free(o);
}

/* ---- a signal to one worker (#34 item 12) ------------------------------------------------- */

/* The pids of parent's children that have RANK=rank in their environment. */
static int worker_of_rank(pid_t parent, int rank, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n < max) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char *stat = dt_test_slurp(dt_test_fmt("/proc/%s/stat", de->d_name));
        char *rp = stat ? strrchr(stat, ')') : NULL, state;
        int ppid = 0;
        bool child = rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent;
        free(stat);
        if (!child)
            continue;
        char *env = NULL;
        size_t len = 0;
        if (dt_read_file(dt_test_fmt("/proc/%s/environ", de->d_name), &env, &len, NULL) != 0)
            continue;
        for (size_t o = 0; o < len; o += strlen(env + o) + 1)
            if (!strncmp(env + o, "RANK=", 5) && atoi(env + o + 5) == rank)
                out[n++] = (pid_t)atoi(de->d_name);
        free(env);
    }
    if (d)
        closedir(d);
    return n;
}

/* SIGTERM to one worker of a T2 job (not to the agent): every rank saves and exits 75, and the
 * agent reads that as the job preempted (exit 75, no failure table, no restart), as when the
 * signal reaches it (it printed the table and exited 1, or spent a restart). */
static void test_sigterm_one_worker_preempts(void)
{
    char out[1024], log[1024]; /* not dt_test_fmt's: worker_of_rank makes many */
    snprintf(out, sizeof out, "%s/t2", TMP);
    snprintf(log, sizeof log, "%s/t2.log", TMP);
    const char *cmd = dt_test_fmt("%s --max-restarts=1 %s/configs/tp2.ini job.output_dir=%s "
                                  "job.device=cpu job.log_every=1 train.steps=100000 "
                                  "train.eval_every=0", BIN, dt_test_repo_dir("configs"), out);
    pid_t agent = dt_test_spawn(cmd, log);
    bool reached = dt_test_wait_text(log, "step 3/", 1, 120 * dt_test_timeout_scale());
    pid_t w[4];
    int n = reached ? worker_of_rank(agent, 1, w, 4) : 0;
    if (n == 1)
        kill(w[0], SIGTERM);
    int code = dt_test_wait_exit(agent, 120 * dt_test_timeout_scale());
    char *text = dt_test_slurp(log);
    DT_CHECK_MSG(reached && n == 1, "no rank 1 worker at step 3 (%d found): %.3000s", n,
                 text ? text : "");
    DT_CHECK_MSG(code == 75, "exit %d: %.4000s", code, text ? text : "");
    DT_CHECK_CONTAINS(text, "preempted");
    DT_CHECK(text && !strstr(text, "the job failed"));
    DT_CHECK(text && !strstr(text, "restarting every worker"));
    /* the advice to run the command again is the agent's (which decides what follows: a
     * regroup, a restart or the end), said once, not the workers' */
    DT_CHECK_MSG(count_of(text, "run the same command again") == 1, "%.4000s", text ? text : "");
    free(text);
    int64_t *steps = NULL;
    int ns = 0;
    DT_CHECK(dt_ckpt_list(dt_test_fmt("%s/checkpoints", out), &steps, &ns, NULL) == 0 && ns == 1);
    free(steps);
}

/* ---- metrics.jsonl's runs (#34 item 14) ---------------------------------------------------- */

/* The "run" values of metrics.jsonl's lines, in order, into runs (n lines; "" for a line
 * without one). Returns the number of lines. */
static int metrics_runs(const char *outdir, char runs[][32], int max)
{
    char *text = dt_test_slurp(dt_test_fmt("%s/metrics.jsonl", outdir));
    int n = 0;
    for (char *l = text, *e; l && *l && n < max; l = e + 1) {
        e = strchr(l, '\n');
        if (!e)
            break;
        *e = '\0';
        const char *r = strstr(l, "\"run\":\"");
        runs[n][0] = '\0';
        if (r)
            sscanf(r + 7, "%31[^\"]", runs[n]);
        n++;
    }
    free(text);
    return n;
}

/* A fresh start into a used output_dir appends under a new run id; a resume keeps its run's;
 * scripts/plot-metrics.sh --print draws the latest run only (it drew lines from step 60 back to
 * step 0, and no record said which run it belonged to). */
static void test_metrics_run_id(void)
{
    const char *out = train("runs", 5, "");
    char runs[64][32];
    int n1 = metrics_runs(out, runs, 64);
    DT_REQUIRE(n1 >= 6); /* the layout, steps 1-5, the eval */
    for (int i = 0; i < n1; i++)
        DT_CHECK_MSG(runs[i][0] && !strcmp(runs[i], runs[0]), "line %d: run \"%s\", first \"%s\"",
                     i, runs[i], runs[0]);
    char first[32];
    dt_strlcpy(first, runs[0], sizeof first);
    train("runs", 8, ""); /* resumes at step 5: the same run */
    int n2 = metrics_runs(out, runs, 64);
    DT_REQUIRE(n2 > n1);
    for (int i = n1; i < n2; i++)
        DT_CHECK_MSG(!strcmp(runs[i], first), "resumed line %d: run \"%s\", not \"%s\"", i,
                     runs[i], first);
    train("runs", 3, "checkpoint.resume=never");
    int n3 = metrics_runs(out, runs, 64);
    DT_REQUIRE(n3 > n2);
    for (int i = n2; i < n3; i++)
        DT_CHECK_MSG(runs[i][0] && strcmp(runs[i], first) && !strcmp(runs[i], runs[n2]),
                     "fresh line %d: run \"%s\" (first run \"%s\")", i, runs[i], first);
    int code;
    char *o = run(dt_test_fmt("%s/scripts/plot-metrics.sh --print %s", dt_test_repo_dir("scripts"),
                              out),
                  &code, 30);
    DT_CHECK_MSG(code == 0, "plot --print: exit %d: %.2000s", code, o);
    DT_CHECK_MSG(count_of(o, "\ntrain ") + !strncmp(o, "train ", 6) == 3,
                 "the latest run has 3 train records: %.2000s", o);
    DT_CHECK_CONTAINS(o, "train 3 ");
    DT_CHECK(!strstr(o, "train 8 "));
    free(o);
}

/* ---- dtrain ckpt list on an output directory (#34 item 15) ------------------------------ */

/* `dtrain ckpt list OUTPUT_DIR` lists OUTPUT_DIR/checkpoints, saying so (it said there were no
 * checkpoints); a directory that holds neither says where checkpoints go. */
static void test_ckpt_list_output_dir(void)
{
    const char *out = train("lst", 40, "");
    int code;
    char *o = run(dt_test_fmt("%s ckpt list %s", BIN, out), &code, 60);
    DT_CHECK_MSG(code == 0, "exit %d: %.2000s", code, o);
    DT_CHECK_CONTAINS(o, dt_test_fmt("%s/checkpoints", out));
    DT_CHECK_CONTAINS(o, "resume = auto loads this one");
    DT_CHECK_MSG(strstr(o, "\n40 ") != NULL, "no row of step 40: %.2000s", o);
    free(o);
    /* verify checks them there too; show and export, which take one checkpoint, name the
     * newest there (all three said "state.json is missing (an incomplete checkpoint)") */
    o = run(dt_test_fmt("%s ckpt verify %s", BIN, out), &code, 60);
    DT_CHECK_MSG(code == 0, "verify: exit %d: %.2000s", code, o);
    DT_CHECK_CONTAINS(o, dt_test_fmt("%s/checkpoints/step_40: valid", out));
    DT_CHECK(!strstr(o, "incomplete"));
    free(o);
    const char *one[] = {"show", "export"};
    for (int i = 0; i < 2; i++) {
        o = run(dt_test_fmt("%s ckpt %s %s%s", BIN, one[i], out, i ? " /dev/null" : ""), &code,
                60);
        DT_CHECK_MSG(code == 1, "%s: exit %d: %.2000s", one[i], code, o);
        DT_CHECK_CONTAINS(o, dt_test_fmt("%s/checkpoints/step_40", out));
        free(o);
    }
    sh(dt_test_fmt("mkdir -p %s/empty", TMP));
    o = run(dt_test_fmt("%s ckpt list %s/empty", BIN, TMP), &code, 60);
    DT_CHECK_MSG(code == 0, "empty: exit %d: %.2000s", code, o);
    DT_CHECK_CONTAINS(o, "no checkpoints under");
    DT_CHECK_CONTAINS(o, "checkpoint.dir");
    free(o);
}

/* ---- the interpreter of SCRIPT.py (#34 item 16) --------------------------------------------- */

/* SCRIPT.py runs with python3 from PATH unless --python PATH or DTRAIN_PYTHON says otherwise;
 * when the workers fail the launcher says which interpreter ran and how to choose another (a
 * pyenv shim without torch first on PATH failed every rank with no word of it). */
static void test_python_interpreter(void)
{
    const char *bin = dt_test_fmt("%s/fakebin", TMP);
    sh(dt_test_fmt("mkdir -p %s && printf '#!/bin/sh\\necho \"ModuleNotFoundError: No module "
                   "named torch\" >&2\\nexit 1\\n' > %s/python3 && printf '#!/bin/sh\\necho "
                   "\"other-python ran $1\"\\n' > %s/other && chmod +x %s/python3 %s/other && "
                   "printf 'print(1)\\n' > %s/train.py", bin, bin, bin, bin, bin, TMP));
    char path_env[4096];
    snprintf(path_env, sizeof path_env, "PATH=%s:$PATH", bin);
    int code;
    char *o = run(dt_test_fmt("%s %s --nproc-per-node=1 %s/train.py 2>&1", path_env, BIN, TMP),
                  &code, 60);
    DT_CHECK_MSG(code == 1, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, dt_test_fmt("%s/python3", bin)); /* which one ran */
    DT_CHECK_CONTAINS(o, "--python");
    DT_CHECK_CONTAINS(o, "DTRAIN_PYTHON");
    free(o);
    o = run(dt_test_fmt("%s %s --nproc-per-node=1 --python %s/other %s/train.py 2>&1", path_env,
                        BIN, bin, TMP),
            &code, 60);
    DT_CHECK_MSG(code == 0, "--python: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, dt_test_fmt("other-python ran %s/train.py", TMP));
    free(o);
    o = run(dt_test_fmt("%s DTRAIN_PYTHON=%s/other %s --nproc-per-node=1 %s/train.py 2>&1",
                        path_env, bin, BIN, TMP),
            &code, 60);
    DT_CHECK_MSG(code == 0, "DTRAIN_PYTHON: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "other-python ran");
    free(o);
    o = run(dt_test_fmt("%s --nproc-per-node=1 --python %s/nonexistent %s/train.py 2>&1", BIN, bin,
                        TMP),
            &code, 60);
    DT_CHECK_MSG(code == 2, "a missing interpreter: exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "--python");
    free(o);
}

/* ---- the words of a resumed run (#34 item 18) ---------------------------------------------- */

/* A resumed run's summary says how many steps this run trained (it said "done after 60 steps"
 * for a run that trained 20 of them). */
static void test_resumed_summary(void)
{
    const char *out = train("sum", 40, "");
    int code;
    char *o = run(dt_test_fmt("%s worker %s job.output_dir=%s train.steps=60 2>&1", BIN,
                              mlp_job(), out),
                  &code, 120);
    DT_CHECK_MSG(code == 0, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "done after 60 steps (20 of them in this run, resumed at step 40) in ");
    free(o);
}

/* ---- how values are written (#34, "also seen") --------------------------------------------- */

/* Loads mlp.ini with one override; 0 or the load's error, the first line in why. */
static int load_with(dt_job *job, const char *setting, char *why, size_t cap)
{
    static dt_config_errors errs;
    memset(&errs, 0, sizeof errs);
    dt_err err = {0};
    char *ov[] = {(char *)setting};
    int rc = dt_job_load(job, mlp_job(), ov, 1, &errs, &err);
    dt_strlcpy(why, errs.count ? errs.lines[0] : "", cap);
    return rc;
}

/* Decided (docs/keys.md, "How values are written"): names of fixed choices in any case, printed
 * in lower case; a number with a sign; a number with blanks around it (kept by quotes) refused;
 * blanks around a list's commas accepted. It took " 2" as 2 without a word. */
static void test_value_forms(void)
{
    static dt_job job;
    char why[1024];
    DT_CHECK(load_with(&job, "parallel.schedule=1F1B", why, sizeof why) == 0);
    DT_CHECK_INT(job.pp_schedule, DT_PP_1F1B);
    DT_CHECK(load_with(&job, "job.strategy=DDP", why, sizeof why) == 0);
    DT_CHECK_INT(job.strategy, DT_STRATEGY_DDP);
    DT_CHECK(load_with(&job, "elastic.nproc_per_node=CPU", why, sizeof why) == 0);
    DT_CHECK_INT(job.launch.nproc_per_node.kind, DT_NPROC_CPU);
    DT_CHECK(load_with(&job, "data.synthetic_shape=3X8X8", why, sizeof why) == 0);
    DT_CHECK_INT(job.synthetic_shape[0], 3);
    DT_CHECK(load_with(&job, "train.steps=+2", why, sizeof why) == 0);
    DT_CHECK_INT(job.steps, 2);
    DT_CHECK(load_with(&job, "train.lr=+1e-3", why, sizeof why) == 0);
    DT_CHECK(load_with(&job, "model.hidden=32, 16", why, sizeof why) == 0);
    DT_CHECK_STR(job.hidden, "32, 16");
    int w[DT_MAX_HIDDEN];
    DT_CHECK_INT(dt_job_mlp_widths(job.hidden, w, NULL), 2);
    const char *refused[] = {"train.steps=\" 2\"", "train.lr=\"1e-3 \"", "train.steps=2, 2",
                             "elastic.nproc_per_node=\" 2\"", "rendezvous.join_timeout=\" 5\""};
    for (size_t i = 0; i < DT_ARRAY_LEN(refused); i++) {
        DT_CHECK_MSG(load_with(&job, refused[i], why, sizeof why) != 0, "%s accepted", refused[i]);
        DT_CHECK_MSG(strstr(why, "blanks") || strstr(why, "not an integer"), "%s: %s",
                     refused[i], why);
    }
    /* --print-config writes the canonical names, which load back to the same job */
    FILE *f = fopen(dt_test_fmt("%s/printed.ini", TMP), "w");
    DT_REQUIRE(f != NULL);
    DT_CHECK(load_with(&job, "parallel.schedule=GPipe", why, sizeof why) == 0);
    dt_job_print(&job, f);
    fclose(f);
    char *text = dt_test_slurp(dt_test_fmt("%s/printed.ini", TMP));
    DT_CHECK_CONTAINS(text, "schedule = gpipe");
    free(text);
}

/* The pipeline's line under train.global_batch: a 7-sample step of batch_size 8 is one
 * micro-step of 7, cut into micro-batches of 2, 2, 2 and 1; it said "4 micro-batches of 2
 * samples". */
static void test_pipeline_line_global_batch(void)
{
    int code;
    char *o = run(dt_test_fmt("%s %s/configs/pp2.ini job.output_dir=%s/pp job.device=cpu "
                              "train.global_batch=7 train.steps=1 train.eval_every=0 2>&1", BIN,
                              dt_test_repo_dir("configs"), TMP),
                  &code, 120);
    DT_CHECK_MSG(code == 0, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "4 micro-batches of up to 2 samples per micro-step");
    DT_CHECK_CONTAINS(o, "1 micro-step of up to 8");
    free(o);
}

/* ---- the quickstart's curve (#34 item 19) -------------------------------------------------- */

/* The train losses (every step: job.log_every=1) and the last val loss of a run's metrics. */
static int losses(const char *outdir, double *loss, int max, double *val)
{
    char *text = dt_test_slurp(dt_test_fmt("%s/metrics.jsonl", outdir));
    int n = 0;
    *val = NAN;
    for (char *l = text; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *a;
        if (strncmp(l, "{\"type\":\"train\"", 15) == 0 && (a = strstr(l, "\"loss\":")) && n < max)
            loss[n++] = strtod(a + 7, NULL);
        else if (strncmp(l, "{\"type\":\"eval\"", 14) == 0 && (a = strstr(l, "\"val_loss\":")))
            *val = strtod(a + 11, NULL);
    }
    free(text);
    return n;
}

/* configs/quickstart.ini, at every length the README shows (300 steps on one rank, on two, and
 * a shortened two-rank run of 12 steps), falls smoothly: no step's loss above every earlier
 * one's by more than 0.1 (the spike: step 14 at 7.98 after 3.54), none more than 1.5 above the
 * lowest of the ten before it (a batch of the GPL's rarer text costs up to about 1), and the last
 * val loss below the first step's loss (the 12-step run ended at 5.77, above its start) and, at
 * 300 steps, below 2.8. */
static void test_quickstart_curve(void)
{
    const struct {
        int nproc, steps;
        double val_below;
    } runs[] = {{1, 300, 2.8}, {2, 300, 2.8}, {2, 12, 0}};
    for (size_t r = 0; r < DT_ARRAY_LEN(runs); r++) {
        char out[1024];
        snprintf(out, sizeof out, "%s/qs%zu", TMP, r);
        int code;
        char *o = run(dt_test_fmt("%s --nproc-per-node=%d %s/configs/quickstart.ini "
                                  "job.output_dir=%s job.device=cpu job.log_every=1 "
                                  "train.steps=%d 2>&1", BIN, runs[r].nproc,
                                  dt_test_repo_dir("configs"), out, runs[r].steps),
                      &code, 600);
        DT_CHECK_MSG(code == 0, "%d x %d: exit %d: %.3000s", runs[r].nproc, runs[r].steps, code,
                     o);
        free(o);
        static double loss[400];
        double val;
        int n = losses(out, loss, 400, &val);
        DT_REQUIRE(n == runs[r].steps);
        double max = loss[0], worst_rise = -INFINITY, worst_jump = -INFINITY;
        int at_rise = 0, at_jump = 0;
        for (int i = 1; i < n; i++) {
            double lo = loss[i - 1];
            for (int k = i - 10 < 0 ? 0 : i - 10; k < i; k++)
                lo = fmin(lo, loss[k]);
            if (loss[i] - max > worst_rise) {
                worst_rise = loss[i] - max;
                at_rise = i + 1;
            }
            if (loss[i] - lo > worst_jump) {
                worst_jump = loss[i] - lo;
                at_jump = i + 1;
            }
            max = fmax(max, loss[i]);
        }
        fprintf(stderr, "    %d x %d steps: loss %.3f -> %.3f, val %.3f; highest rise over the "
                "earlier steps %.3f (step %d), over the last ten %.3f (step %d)\n",
                runs[r].nproc, runs[r].steps, loss[0], loss[n - 1], val, worst_rise, at_rise,
                worst_jump, at_jump);
        DT_CHECK_MSG(worst_rise <= 0.1, "%d x %d: step %d's loss is %.3f above every earlier one",
                     runs[r].nproc, runs[r].steps, at_rise, worst_rise);
        DT_CHECK_MSG(worst_jump <= 1.5, "%d x %d: step %d's loss is %.3f above the last ten's "
                     "lowest", runs[r].nproc, runs[r].steps, at_jump, worst_jump);
        DT_CHECK_MSG(val < loss[0], "%d x %d: val loss %.3f, above the first step's %.3f",
                     runs[r].nproc, runs[r].steps, val, loss[0]);
        if (runs[r].val_below > 0)
            DT_CHECK_MSG(val < runs[r].val_below, "%d x %d: val loss %.3f, not below %.1f",
                         runs[r].nproc, runs[r].steps, val, runs[r].val_below);
    }
}

static const dt_test tests[] = {
    {"readonly_dirs_at_load", test_readonly_dirs_at_load, 180},
    {"output_dir_file_at_load", test_output_dir_file_at_load, 120},
    {"missing_data_at_load", test_missing_data_at_load, 120},
    {"missing_data_one_node", test_missing_data_one_node, 240},
    {"worker_config_errors_not_retried", test_worker_config_errors_not_retried, 180},
    {"only_damaged_checkpoints_stop", test_only_damaged_checkpoints_stop, 180},
    {"damaged_checkpoint_kept_aside", test_damaged_checkpoint_kept_aside, 180},
    {"foreign_future_checkpoint", test_foreign_future_checkpoint, 180},
    {"renamed_checkpoint_refused", test_renamed_checkpoint_refused, 180},
    {"foreign_file_named", test_foreign_file_named, 120},
    {"sigterm_one_worker_preempts", test_sigterm_one_worker_preempts, 300},
    {"metrics_run_id", test_metrics_run_id, 120},
    {"ckpt_list_output_dir", test_ckpt_list_output_dir, 120},
    {"python_interpreter", test_python_interpreter, 120},
    {"resumed_summary", test_resumed_summary, 120},
    {"value_forms", test_value_forms, 30},
    {"pipeline_line_global_batch", test_pipeline_line_global_batch, 120},
    {"quickstart_curve", test_quickstart_curve, 900},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_harden", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
