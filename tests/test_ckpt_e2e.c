/* test_ckpt_e2e.c - checkpoints end to end: `dtrain worker` and the launcher stopped by
 * SIGTERM, killed with SIGKILL, pointed at damaged or foreign checkpoint directories, or at a
 * file where a checkpoint goes, and resumed on another world size; the final parameters must be
 * bit-identical to a run that was never interrupted.
 *
 * The unit tests of the checkpoint code (a fake model, injected failures) are in test_ckpt.c.
 * These skip, saying why, when the build has no `dtrain worker`. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/log.h"
#include "common/rng.h"
#include "common/util.h"
#include "runtime/job/workenv.h"
#include "runtime/train/ckpt/ckpt.h"
#include "tests/harness.h"

static char *run(const char *cmd, int *code)
{
    char *out = NULL;
    *code = dt_test_run(cmd, &out, 60);
    return out ? out : strdup("");
}

/* A job small enough to run 300 steps in a few seconds on a loaded machine, with state that
 * crosses epochs (128 steps per epoch) and AdamW moments, so a resume that is off in any of
 * them changes the final parameters. */
static const char *e2e_job(void)
{
    static char path[4200];
    snprintf(path, sizeof path, "%s/job.ini", dt_test_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("[job]\nname = ck\nseed = 7\ndevice = cpu\nlog_every = 1\n\n"
          "[model]\ntype = mlp\nhidden = 384,384\n\n"
          "[data]\ntype = synthetic\nsynthetic_shape = vector\nsynthetic_samples = 8192\n"
          "synthetic_dim = 64\nsynthetic_classes = 10\nval_fraction = 0\n\n"
          "[train]\nbatch_size = 128\nsteps = 300\noptimizer = adamw\nlr = 1e-3\n"
          "schedule = cosine\nwarmup_steps = 10\nthreads = 1\n\n"
          "[checkpoint]\nevery = 50\nkeep = 2\n", f);
    fclose(f);
    return path;
}

static void need_worker(void)
{
    char cmd[4200];
    int code;
    snprintf(cmd, sizeof cmd, "%s worker --help", dt_test_dtrain_bin());
    char *out = run(cmd, &code);
    bool missing = code != 0 || strstr(out, "not available");
    free(out);
    if (missing)
        DT_SKIP("`dtrain worker` is not in this build yet");
}

/* Starts `sh -c "exec CMD"` in its own process group, output to log; returns the pid. */
static pid_t spawn(const char *cmd, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        dup2(fd, 1);
        dup2(fd, 2);
        char full[8500];
        snprintf(full, sizeof full, "exec %s", cmd);
        execl("/bin/sh", "sh", "-c", full, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* Exit code (128+N for signal N), or -1 after timeout_s (the process group is then killed). */
static int wait_exit(pid_t pid, int timeout_s)
{
    for (int i = 0; i < timeout_s * 20; i++) {
        int st;
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        dt_sleep_ms(50);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

/* The last "step" of a metrics.jsonl (0 when none). */
static int64_t last_step(const char *outdir)
{
    char p[4200], *text = NULL;
    size_t len;
    snprintf(p, sizeof p, "%s/metrics.jsonl", outdir);
    if (dt_read_file(p, &text, &len, NULL) != 0)
        return 0;
    int64_t step = 0;
    for (char *q = strstr(text, "\"step\":"); q; q = strstr(q + 1, "\"step\":"))
        step = strtoll(q + 7, NULL, 10);
    free(text);
    return step;
}

/* Waits until outdir's metrics reach `step` (false when pid exits first or after timeout). */
static bool wait_step(const char *outdir, int64_t step, pid_t pid, int timeout_s)
{
    for (int i = 0; i < timeout_s * 50; i++) {
        if (last_step(outdir) >= step)
            return true;
        if (waitpid(pid, NULL, WNOHANG) == pid)
            return false;
        dt_sleep_ms(20);
    }
    return false;
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

/* The uninterrupted reference run (once per test process). */
static const char *reference_run(void)
{
    static char out[4200];
    if (out[0])
        return out;
    snprintf(out, sizeof out, "%s/ref", dt_test_tmpdir());
    char cmd[8500];
    int code;
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s", dt_test_dtrain_bin(), e2e_job(),
             out);
    char *o = run(cmd, &code);
    DT_CHECK_MSG(code == 0, "reference run failed (%d): %.2000s", code, o);
    free(o);
    return out;
}

static void check_final_identical(const char *outdir, const char *what)
{
    const char *ref = reference_run();
    const char *files[] = {"model.safetensors", "optim.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[4300], b[4300];
        snprintf(a, sizeof a, "%s/checkpoints/step_300/%s", ref, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/step_300/%s", outdir, files[i]);
        DT_CHECK_MSG(same_file(a, b), "%s: %s differs from the uninterrupted run's", what,
                     files[i]);
    }
}

static void test_worker_sigterm_resume(void)
{
    need_worker();
    const char *job = e2e_job();
    char out[4200], cmd[8500], log[4300];
    snprintf(out, sizeof out, "%s/sig", dt_test_tmpdir());
    snprintf(log, sizeof log, "%s/sig.log", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s", dt_test_dtrain_bin(), job, out);
    const int sigs[] = {SIGTERM, SIGUSR1, SIGUSR2};
    int64_t at = 0;
    for (int k = 0; k < 3; k++) {
        pid_t pid = spawn(cmd, log);
        at += 20 + 30 * k;
        bool reached = wait_step(out, at, pid, 60);
        DT_REQUIRE(reached);
        kill(pid, sigs[k]);
        int code = wait_exit(pid, 60);
        DT_CHECK_INT(code, DT_EXIT_PREEMPTED);
        /* A checkpoint of the step it stopped at: the newest, complete and valid. */
        int64_t *steps = NULL;
        int n = 0;
        char dir[4300];
        snprintf(dir, sizeof dir, "%s/checkpoints", out);
        DT_REQUIRE(dt_ckpt_list(dir, &steps, &n, NULL) == 0 && n > 0);
        int64_t stopped = last_step(out);
        DT_CHECK_INT(steps[0], stopped);
        DT_CHECK(steps[0] >= at);
        char p[4400];
        dt_ckpt_info info;
        dt_err err = {0};
        snprintf(p, sizeof p, "%s/step_%" PRId64, dir, steps[0]);
        DT_CHECK_MSG(dt_ckpt_inspect(p, true, &info, &err) == 0, "%s", err.msg);
        DT_CHECK_INT(info.state.step, steps[0]);
        dt_ckpt_info_free(&info);
        at = steps[0];
        free(steps);
    }
    /* Re-launched, it resumes and finishes with the parameters of an uninterrupted run. */
    char *o = run(cmd, &(int){0});
    DT_CHECK_CONTAINS(o, "resumed from");
    free(o);
    char *text = NULL;
    size_t len;
    dt_read_file(log, &text, &len, NULL);
    DT_CHECK_CONTAINS(text, "stopped by a signal; saving step");
    free(text);
    check_final_identical(out, "after SIGTERM, SIGUSR1 and SIGUSR2");
}

static void test_worker_skips_damaged(void)
{
    /* A finished run, then its newest checkpoint damaged as a power cut would: a longer run
     * resumes from the one before, and says which one it skipped and why. */
    need_worker();
    const char *ref = reference_run();
    char out[4200], cmd[8500];
    snprintf(out, sizeof out, "%s/dmg", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "cp -r %s %s", ref, out);
    int code;
    free(run(cmd, &code));
    DT_REQUIRE(code == 0);
    char p[4400];
    snprintf(p, sizeof p, "%s/checkpoints/step_300/model.safetensors", out);
    DT_REQUIRE(truncate(p, 1000) == 0);
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s train.steps=320",
             dt_test_dtrain_bin(), e2e_job(), out);
    char *o = run(cmd, &code);
    DT_CHECK_INT(code, 0);
    DT_CHECK_CONTAINS(o, "skipping checkpoint");
    DT_CHECK_CONTAINS(o, "step_300: model.safetensors has 1000 bytes");
    DT_CHECK_CONTAINS(o, "resumed from");
    DT_CHECK_CONTAINS(o, "step_250");
    free(o);
    /* An explicit path to a damaged checkpoint is an error, not a fresh start. */
    snprintf(p, sizeof p, "%s/checkpoints/step_320/optim.safetensors", out);
    DT_REQUIRE(truncate(p, 10) == 0);
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s checkpoint.resume=%s/checkpoints/"
             "step_320", dt_test_dtrain_bin(), e2e_job(), out, out);
    o = run(cmd, &code);
    DT_CHECK_INT(code, 2); /* a configuration error: retry scripts do not retry it */
    DT_CHECK_CONTAINS(o, "optim.safetensors has 10 bytes");
    DT_CHECK_CONTAINS(o, "a configuration error");
    free(o);
}

static void test_worker_foreign_dir(void)
{
    /* A job whose model or optimizer changed, pointed at the checkpoints of the old one: an
     * error (exit 2) naming the difference, never a fresh start that later replaces or removes
     * the user's checkpoints. */
    need_worker();
    const char *ref = reference_run();
    char out[4200], cmd[8500];
    int code;
    snprintf(out, sizeof out, "%s/foreign", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "cp -r %s %s", ref, out);
    free(run(cmd, &code));
    DT_REQUIRE(code == 0);
    const struct {
        const char *change, *want, *not;
    } cases[] = {
        {"model.hidden=256,256 train.steps=350", "written for another model", NULL},
        {"train.optimizer=sgd train.momentum=0.9 train.steps=350", "written with another "
         "optimizer", "another model"},
    };
    for (size_t k = 0; k < DT_ARRAY_LEN(cases); k++) {
        snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s %s", dt_test_dtrain_bin(),
                 e2e_job(), out, cases[k].change);
        char *o = run(cmd, &code);
        DT_CHECK_MSG(code == 2, "%s: exit %d: %.3000s", cases[k].change, code, o);
        DT_CHECK_CONTAINS(o, cases[k].want);
        DT_CHECK_CONTAINS(o, "checkpoint.dir");
        if (cases[k].not)
            DT_CHECK(!strstr(o, cases[k].not));
        free(o);
    }
    const char *files[] = {"step_250/model.safetensors", "step_300/model.safetensors",
                           "step_300/optim.safetensors"};
    for (size_t i = 0; i < DT_ARRAY_LEN(files); i++) {
        char a[4400], b[4400];
        snprintf(a, sizeof a, "%s/checkpoints/%s", ref, files[i]);
        snprintf(b, sizeof b, "%s/checkpoints/%s", out, files[i]);
        DT_CHECK_MSG(same_file(a, b), "%s changed", files[i]);
    }
}

/* The worker, with a file step_<last> in its checkpoint directory: it stops before training,
 * naming the file (a configuration error, exit 2), instead of failing the final save. */
static void test_worker_stray_step_file(void)
{
    need_worker();
    char out[4200], ck[4300], cmd[8500];
    int code;
    snprintf(out, sizeof out, "%s/strayw", dt_test_tmpdir());
    snprintf(ck, sizeof ck, "%s/checkpoints", out);
    DT_REQUIRE(dt_mkdir_p(ck, NULL) == 0);
    snprintf(ck, sizeof ck, "%s/checkpoints/step_300", out);
    DT_REQUIRE(dt_test_write_file(ck, "x") == 0);
    snprintf(cmd, sizeof cmd, "%s worker %s job.output_dir=%s 2>&1", dt_test_dtrain_bin(),
             e2e_job(), out);
    char *o = run(cmd, &code);
    DT_CHECK_MSG(code == 2, "exit %d: %.3000s", code, o);
    DT_CHECK_CONTAINS(o, "checkpoints/step_300 is not a directory");
    DT_CHECK_MSG(!strstr(o, "step 1/"), "it trained first: %.3000s", o);
    free(o);
}

/* The pids of pid's children. */
static int children(pid_t parent, pid_t *out, int max)
{
    DIR *d = opendir("/proc");
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)) && n < max) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char p[300], buf[512];
        snprintf(p, sizeof p, "/proc/%s/stat", de->d_name);
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof buf - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = 0;
        char *rp = strrchr(buf, ')'); /* the name may hold spaces */
        int ppid = 0;
        char state;
        if (rp && sscanf(rp + 1, " %c %d", &state, &ppid) == 2 && ppid == parent)
            out[n++] = (pid_t)atoi(de->d_name);
    }
    if (d)
        closedir(d);
    return n;
}

static void test_agent_kill9_bit_identical(void)
{
    /* Under the launcher, kill -9 the worker at random steps, three times per trial: the agent
     * restarts it, it resumes from the newest checkpoint (sometimes one whose write the kill
     * cut short), and the job ends with the parameters of an uninterrupted run, bit for bit. */
    need_worker();
    const char *job = e2e_job();
    dt_rng r;
    dt_rng_seed(&r, (uint64_t)getpid());
    for (int trial = 0; trial < 2; trial++) {
        char out[4200], cmd[8500], log[4300];
        snprintf(out, sizeof out, "%s/kill%d", dt_test_tmpdir(), trial);
        snprintf(log, sizeof log, "%s/kill%d.log", dt_test_tmpdir(), trial);
        snprintf(cmd, sizeof cmd, "%s --standalone --nproc-per-node=1 --max-restarts=5 %s "
                 "job.output_dir=%s", dt_test_dtrain_bin(), job, out);
        pid_t agent = spawn(cmd, log);
        int64_t at = 0;
        int kills = 0;
        for (int k = 0; k < 3; k++) {
            /* the first kill after the first checkpoint (every 50), so that a resume is there to
             * be seen: three kills before step 50 left none once */
            at += (k == 0 ? 51 : 10) + (int64_t)dt_rng_below(&r, 60);
            if (!wait_step(out, at, agent, 90))
                break;
            pid_t kids[8];
            int nk = children(agent, kids, 8);
            for (int i = 0; i < nk; i++)
                kill(kids[i], SIGKILL);
            kills += nk > 0;
            fprintf(stderr, "    trial %d: killed the worker at step %" PRId64 "\n", trial,
                    last_step(out));
            /* Wait for the restart to get past the kill point before the next one. */
            dt_sleep_ms(200);
        }
        int code = wait_exit(agent, 120);
        char *text = NULL;
        size_t len;
        dt_read_file(log, &text, &len, NULL);
        DT_CHECK_MSG(code == 0, "trial %d: the job exited %d: %.3000s", trial, code,
                     text ? text : "");
        DT_CHECK_MSG(kills >= 2, "trial %d: only %d kills landed", trial, kills);
        DT_CHECK_CONTAINS(text, "resumed from");
        free(text);
        check_final_identical(out, "after kill -9 under the launcher");
    }
}

/* The value of RANK in pid's environment (-1 when unreadable). */
static int rank_of(pid_t pid)
{
    char p[64], *text = NULL;
    size_t len;
    snprintf(p, sizeof p, "/proc/%d/environ", (int)pid);
    if (dt_read_file(p, &text, &len, NULL) != 0)
        return -1;
    int rank = -1;
    for (size_t o = 0; o < len; o += strlen(text + o) + 1)
        if (!strncmp(text + o, "RANK=", 5))
            rank = atoi(text + o + 5);
    free(text);
    return rank;
}

/* The step in rank r's "stopped ... after step N" line of a launcher log (-1 when none). */
static int64_t stop_step(const char *log, int r)
{
    char tag[32];
    int64_t step = -1;
    snprintf(tag, sizeof tag, " r%d] ", r);
    for (const char *l = log; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        const char *e = strchr(l, '\n'), *a = strstr(l, "after step "), *t = strstr(l, tag);
        if (!e)
            e = l + strlen(l);
        if (a && t && a < e && t < e && strstr(l, "INFO: stopped") &&
            strstr(l, "INFO: stopped") < e)
            step = strtoll(a + 11, NULL, 10);
    }
    return step;
}

static void test_stop_signal_one_rank(void)
{
    /* A stop signal that reaches only one of two ranks (or the ranks at different steps): they
     * agree on one step boundary, rank 0 saves it, both stop there with exit 75. */
    need_worker();
    char out[4200], cmd[8500], log[4300];
    snprintf(out, sizeof out, "%s/stop1", dt_test_tmpdir());
    snprintf(log, sizeof log, "%s/stop1.log", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s --standalone --nproc-per-node=2 --max-restarts=0 %s "
             "train.steps=100000 job.output_dir=%s", dt_test_dtrain_bin(), e2e_job(), out);
    pid_t agent = spawn(cmd, log);
    bool reached = wait_step(out, 20, agent, 90);
    pid_t kids[8];
    int nk = reached ? children(agent, kids, 8) : 0, signalled = 0;
    for (int i = 0; i < nk; i++)
        if (rank_of(kids[i]) == 1 && kill(kids[i], SIGTERM) == 0)
            signalled++;
    int code = wait_exit(agent, 120);
    char *text = NULL;
    size_t len;
    dt_read_file(log, &text, &len, NULL);
    if (!reached || signalled != 1) {
        DT_CHECK_MSG(false, "the job did not reach step 20 with 2 workers: %.3000s",
                     text ? text : "");
        free(text);
        return;
    }
    fprintf(stderr, "    the launcher exited %d\n", code);
    int64_t s0 = stop_step(text, 0), s1 = stop_step(text, 1);
    DT_CHECK_MSG(s0 > 0 && s0 == s1, "rank 0 stopped after step %" PRId64 ", rank 1 after %"
                 PRId64 ": %.4000s", s0, s1, text ? text : "");
    /* every rank saved and exited 75: the job preempted, not a failure (docs/failures.md) */
    DT_CHECK_CONTAINS(text, "preempted: workers saved their checkpoints");
    DT_CHECK_INT(code, 75);
    DT_CHECK(!strstr(text, "mismatch"));
    free(text);
    char p[4400];
    dt_ckpt_info info;
    dt_err err = {0};
    snprintf(p, sizeof p, "%s/checkpoints/step_%" PRId64, out, s0);
    DT_CHECK_MSG(dt_ckpt_inspect(p, true, &info, &err) == 0, "%s", err.msg);
    DT_CHECK_INT(info.state.step, s0);
    dt_ckpt_info_free(&info);
}

/* The train loss of `step` in outdir's metrics.jsonl (NAN when absent). */
static double loss_at(const char *outdir, int64_t step)
{
    char p[4200], *text = NULL, key[64];
    size_t len;
    double loss = NAN;
    snprintf(p, sizeof p, "%s/metrics.jsonl", outdir);
    if (dt_read_file(p, &text, &len, NULL) != 0)
        return NAN;
    snprintf(key, sizeof key, "\"step\":%" PRId64 ",", step);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        char *l = strstr(line, "\"loss\":");
        if (strstr(line, key) && strstr(line, "\"train\"") && l)
            loss = strtod(l + 7, NULL);
    }
    free(text);
    return loss;
}

static void test_resume_other_world_size(void)
{
    /* A checkpoint written by 2 ranks resumes on 1, 2 and 3: same step, same global sample
     * position, and the loss goes on from where it was. */
    need_worker();
    char out2[4200], cmd[32768];
    int code;
    snprintf(out2, sizeof out2, "%s/ws2", dt_test_tmpdir());
    snprintf(cmd, sizeof cmd, "%s --standalone --nproc-per-node=2 --max-restarts=0 %s "
             "train.steps=40 checkpoint.every=40 job.output_dir=%s", dt_test_dtrain_bin(),
             e2e_job(), out2);
    char *out = run(cmd, &code);
    if (code != 0 && strstr(out, "DDP")) {
        free(out);
        DT_SKIP("multi-rank training (DDP) is not in this build yet: resume on 1, 2 and 3 ranks "
                "from a checkpoint written by 2 is untested");
    }
    DT_REQUIRE_OK(code, (dt_err *)NULL);
    free(out);
    char ck[4300];
    snprintf(ck, sizeof ck, "%s/checkpoints/step_40", out2);
    dt_ckpt_info info;
    dt_err err = {0};
    DT_REQUIRE_OK(dt_ckpt_inspect(ck, true, &info, &err), &err);
    DT_CHECK_INT(info.state.world_size, 2);
    int64_t epoch = info.state.epoch, pos = info.state.sample_pos;
    int64_t seen = info.state.samples_seen;
    DT_CHECK_INT(seen, 40 * 2 * 128);
    dt_ckpt_info_free(&info);
    double before = loss_at(out2, 40);
    DT_REQUIRE(isfinite(before));
    for (int n = 1; n <= 3; n++) {
        char outn[4200];
        snprintf(outn, sizeof outn, "%s/ws2to%d", dt_test_tmpdir(), n);
        snprintf(cmd, sizeof cmd, "mkdir -p %s/checkpoints && cp -r %s %s/checkpoints/ && "
                 "%s --standalone --nproc-per-node=%d --max-restarts=0 %s train.steps=44 "
                 "job.output_dir=%s", outn, ck, outn, dt_test_dtrain_bin(), n, e2e_job(), outn);
        out = run(cmd, &code);
        DT_CHECK_MSG(code == 0, "%d ranks: exit %d: %.3000s", n, code, out);
        char want[256];
        snprintf(want, sizeof want, "step 40, epoch %" PRId64 ", sample %" PRId64 " (saved by 2 "
                 "ranks)", epoch, pos);
        DT_CHECK_CONTAINS(out, want);
        free(out);
        double after = loss_at(outn, 41);
        DT_CHECK_MSG(isfinite(after) && fabs(after - before) < 0.25 * before,
                     "%d ranks: loss %.4f at step 41 after %.4f at step 40", n, after, before);
        snprintf(ck, sizeof ck, "%s/checkpoints/step_44", outn);
        DT_CHECK_MSG(dt_ckpt_inspect(ck, true, &info, &err) == 0, "%s", err.msg);
        DT_CHECK_INT(info.state.world_size, n);
        /* 4 more steps of n x 128 samples: the position and the count go on from step 40's */
        DT_CHECK_INT(info.state.step, 44);
        DT_CHECK_INT(info.state.epoch, epoch);
        DT_CHECK_INT(info.state.sample_pos, pos + 4 * n * 128);
        DT_CHECK_INT(info.state.samples_seen, seen + 4 * n * 128);
        dt_ckpt_info_free(&info);
        snprintf(ck, sizeof ck, "%s/checkpoints/step_40", out2);
    }
}

int main(int argc, char **argv)
{
    static const dt_test tests[] = {
        {"worker_sigterm_resume", test_worker_sigterm_resume, 180},
        {"worker_skips_damaged", test_worker_skips_damaged, 120},
        {"worker_foreign_dir", test_worker_foreign_dir, 120},
        {"worker_stray_step_file", test_worker_stray_step_file, 120},
        {"agent_kill9_bit_identical", test_agent_kill9_bit_identical, 300},
        {"resume_other_world_size", test_resume_other_world_size, 240},
        {"stop_signal_one_rank", test_stop_signal_one_rank, 240},
    };
    return dt_test_main("test_ckpt_e2e", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
