/* test_cluster_sched.c - the real schedulers and launchers on a simulated cluster: Debian's
 * slurm-wlm (with munge) and OpenSSH, started in the hosts of scripts/sim-cluster.sh by
 * tests/cluster-slurm.sh and tests/cluster-sshd.sh.
 *
 * Covered: `sbatch scripts/dtrain-slurm.sbatch` with 2 nodes x 2 workers runs to the end, with
 * the losses of a standalone 4-worker run (1e-5 relative); `scancel --signal=TERM --full`
 * mid-run makes every node's agent checkpoint and exit 75 (the job's exit code is 75), and the
 * job, requeued (`scontrol requeue`), resumes from that checkpoint and finishes;
 * scripts/dtrain-ssh.sh started in host 0 runs a 3-host job to the end (losses equal to one host
 * with 3 workers); a host whose sshd refuses the login is reported at once, naming it, the
 * other agents are stopped, and the script exits 255.
 *
 * Skipped, saying why, without namespaces or without slurm-wlm/munge or openssh-server
 * (scripts/install-deps.sh installs them).
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/cluster.h"
#include "tests/fixtures.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()
#define REPO dt_test_repo_dir("configs")

#define JOB                                                                                        \
    "configs/mlp.ini job.device=cpu model.hidden=64,64 data.synthetic_samples=4096 "             \
    "train.batch_size=8 train.warmup_steps=5 job.log_every=1 checkpoint.every=0 "                \
    "train.eval_every=0 ddp.timeout=20"
#define LONG_JOB                                                                                   \
    "configs/mlp.ini job.device=cpu model.hidden=256,256 data.synthetic_samples=65536 "          \
    "train.batch_size=64 train.warmup_steps=5 job.log_every=100 checkpoint.every=1000 "          \
    "train.eval_every=0 ddp.timeout=30"

static void skip_without(const char *tools, const char *why)
{
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("for t in %s; do command -v $t >/dev/null || "
                                     "[ -x /usr/sbin/$t ] || exit 1; done",
                                     tools),
                         &out, 10);
    free(out);
    if (rc != 0)
        DT_SKIP(why);
}

/* metrics.jsonl's train losses by step (NaN where none). */
static void losses(const char *outdir, double *loss, int cap)
{
    for (int k = 0; k < cap; k++)
        loss[k] = NAN;
    char *text = dt_test_slurp(dt_test_fmt("%s/metrics.jsonl", outdir));
    DT_REQUIRE(text);
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        if (!o)
            continue;
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        int step = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step"));
        if (type && !strcmp(type, "train") && step > 0 && step < cap)
            loss[step] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss"));
        cJSON_Delete(o);
    }
    free(text);
}

/* The run's losses equal a one-host run of nproc workers (made here) at every step. */
static void same_as_one_host(const char *run, int nproc, int steps)
{
    char ref[1024];
    snprintf(ref, sizeof ref, "%s/ref", TMP);
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("cd %s && %s --nproc-per-node %d %s train.steps=%d "
                                     "job.output_dir=%s",
                                     REPO, BIN, nproc, JOB, steps, ref),
                         &out, 120);
    DT_CHECK_MSG(rc == 0, "the one-host reference exited %d: %s", rc, out ? out : "");
    free(out);
    if (rc)
        return;
    static double a[512], b[512];
    DT_REQUIRE(steps < 512);
    losses(run, a, steps + 1);
    losses(ref, b, steps + 1);
    double worst = 0;
    for (int s = 1; s <= steps; s++) {
        DT_CHECK_MSG(isfinite(a[s]) && isfinite(b[s]), "step %d: no loss (%g, %g)", s, a[s], b[s]);
        double d = fabs(a[s] - b[s]) / fabs(b[s]);
        DT_CHECK_MSG(d <= 1e-5, "step %d: %.9g vs one host %.9g", s, a[s], b[s]);
        worst = DT_MAX(worst, d);
    }
    printf("    losses of steps 1-%d within %.2g relative of one host with %d workers\n", steps,
           worst, nproc);
}

/* ---- Slurm ----------------------------------------------------------------------------------- */

typedef struct slurm {
    dt_test_cluster c;
    char dir[1024];  /* conf, munge, state, logs */
    char conf[1100]; /* SLURM_CONF */
} slurm;

static void slurm_up(slurm *s, int n)
{
    skip_without("munged slurmctld slurmd sbatch srun scontrol",
                 "slurm-wlm or munge is not installed (scripts/install-deps.sh installs them)");
    dt_test_cluster_up(&s->c, n, NULL);
    snprintf(s->dir, sizeof s->dir, "%s/slurm", TMP);
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("%s/tests/cluster-slurm.sh up %s %s 2", REPO, s->c.name, s->dir),
                         &out, 60);
    DT_CHECK_MSG(rc == 0, "cluster-slurm.sh up: exit %d: %s", rc, out ? out : "");
    free(out);
    DT_REQUIRE(rc == 0);
    snprintf(s->conf, sizeof s->conf, "%s/slurm.conf", s->dir);
}

/* A Slurm command run in h0; its output (malloc'd) and exit code. */
static int slurm_cmd(const slurm *s, const char *cmd, char **out)
{
    return dt_test_run(dt_test_cluster_cmd(&s->c, 0, dt_test_fmt("export SLURM_CONF=%s; %s", s->conf, cmd)),
                       out, 60);
}

/* Submits the dtrain batch script with DTRAIN_NPROC=2 and returns the job id. */
static int sbatch(const slurm *s, const char *outfile, const char *args)
{
    char *out = NULL;
    int rc = slurm_cmd(s,
                       dt_test_fmt("cd %s && DTRAIN=%s DTRAIN_NPROC=2 sbatch --nodes=2 "
                                   "--gpus-per-node=0 --cpus-per-task=2 --output=%s "
                                   "scripts/dtrain-slurm.sbatch %s",
                                   REPO, BIN, outfile, args),
                       &out);
    int id = 0;
    const char *p = out ? strstr(out, "Submitted batch job ") : NULL;
    if (p)
        id = atoi(p + strlen("Submitted batch job "));
    DT_CHECK_MSG(rc == 0 && id > 0, "sbatch: exit %d: %s", rc, out ? out : "");
    free(out);
    DT_REQUIRE(id > 0);
    return id;
}

/* The job's state and exit code from scontrol ("COMPLETED", "75:0"). */
static void job_state(const slurm *s, int id, char *state, char *exit_code, size_t cap)
{
    char *out = NULL;
    slurm_cmd(s, dt_test_fmt("scontrol show job %d", id), &out);
    state[0] = exit_code[0] = '\0';
    const char *p = out ? strstr(out, "JobState=") : NULL;
    if (p)
        snprintf(state, cap, "%.*s", (int)strcspn(p + 9, " \n"), p + 9);
    p = out ? strstr(out, " ExitCode=") : NULL;
    if (p)
        snprintf(exit_code, cap, "%.*s", (int)strcspn(p + 10, " \n"), p + 10);
    free(out);
}

/* Waits until the job is no longer pending or running (at most timeout_s, scaled). */
static void wait_job_end(const slurm *s, int id, double timeout_s, char *state, char *code, size_t cap)
{
    double end = dt_test_now() + timeout_s * dt_test_timeout_scale();
    for (;;) {
        job_state(s, id, state, code, cap);
        bool live = !strcmp(state, "PENDING") || !strcmp(state, "RUNNING") ||
                    !strcmp(state, "CONFIGURING") || !strcmp(state, "COMPLETING") ||
                    !strcmp(state, "REQUEUED") || !state[0];
        if (!live || dt_test_now() > end)
            return;
        dt_sleep_ms(200);
    }
}

static void test_slurm_job_equals_standalone(void)
{
    slurm s;
    slurm_up(&s, 2);
    char run[1024], outf[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    snprintf(outf, sizeof outf, "%s/slurm.out", TMP);
    int steps = 40;
    int id = sbatch(&s, outf, dt_test_fmt("%s train.steps=%d job.output_dir=%s", JOB, steps, run));
    char state[64], code[64];
    wait_job_end(&s, id, 120, state, code, sizeof state);
    DT_CHECK_STR(state, "COMPLETED");
    DT_CHECK_STR(code, "0:0");
    DT_CHECK(dt_test_count_text(outf, "attempt 0: node 1 of 2, ranks 2-3 of 4") == 1);
    DT_CHECK(dt_test_count_text(outf, "dtrain[h1:") > 0);
    if (strcmp(state, "COMPLETED")) {
        char *o = dt_test_slurp(outf);
        fprintf(stderr, "%s\n", o ? o : "(no output)");
        free(o);
        return;
    }
    same_as_one_host(run, 4, steps);
    DT_CHECK_INT(dt_test_cluster_down(&s.c), 0);
}

/* The step of the last "resumed from ...: step N" in a file (-1: none). */
static int resumed_step(const char *path)
{
    char *text = dt_test_slurp(path);
    int step = -1;
    for (char *p = text; p && (p = strstr(p, "resumed from ")); p++) {
        char *q = strstr(p, ": step ");
        char *nl = strchr(p, '\n');
        if (q && (!nl || q < nl))
            step = atoi(q + 7);
    }
    free(text);
    return step;
}

static void test_slurm_preempt_and_requeue(void)
{
    slurm s;
    slurm_up(&s, 2);
    char run[1024], outf[1024], first[1100];
    snprintf(run, sizeof run, "%s/run", TMP);
    snprintf(outf, sizeof outf, "%s/slurm.out", TMP);
    int steps = 6000;
    int id = sbatch(&s, outf, dt_test_fmt("%s train.steps=%d job.output_dir=%s", LONG_JOB, steps, run));
    DT_REQUIRE(dt_test_wait_text(outf, "step 1500/", 1, 120));
    char *o = NULL;
    DT_CHECK_INT(slurm_cmd(&s, dt_test_fmt("scancel --signal=TERM --full %d", id), &o), 0);
    free(o);
    char state[64], code[64];
    wait_job_end(&s, id, 60, state, code, sizeof state);
    DT_CHECK_STR(code, "75:0");
    /* every node's agent checkpointed and exited 75 */
    DT_CHECK_INT(dt_test_count_text(outf, "preempted: workers saved their checkpoints"), 2);
    DT_CHECK_INT(dt_test_count_text(outf, "Exited with exit code 75"), 2);
    DT_CHECK_INT(dt_test_count_text(outf, "forcing job termination"), 0);
    char *text = dt_test_slurp(outf);
    const char *saved = text ? strstr(text, "stopped by a signal; saving step ") : NULL;
    int saved_step = saved ? atoi(saved + strlen("stopped by a signal; saving step ")) : -1;
    free(text);
    DT_CHECK_MSG(saved_step > 0, "no checkpoint saved on the signal");
    if (strcmp(code, "75:0") || saved_step <= 0) {
        char *a = dt_test_slurp(outf);
        fprintf(stderr, "the preempted run:\n%s\n", a ? a : "");
        free(a);
    }
    snprintf(first, sizeof first, "%s.first", outf);
    DT_REQUIRE(rename(outf, first) == 0);
    /* requeued, it resumes from that checkpoint and finishes. Slurm holds a requeued job back
     * (BeginTime) for cred_expire (10 s here, 120 by default): the last run's credentials stay
     * revoked that long, and a run started sooner is killed ("Job credential revoked"). */
    DT_CHECK_INT(slurm_cmd(&s, dt_test_fmt("scontrol requeue %d", id), &o), 0);
    free(o);
    dt_sleep_ms(1000);
    wait_job_end(&s, id, 180, state, code, sizeof state);
    DT_CHECK_STR(state, "COMPLETED");
    DT_CHECK_STR(code, "0:0");
    int r = resumed_step(outf);
    printf("    scancel --signal=TERM --full: both agents exit 75, checkpoint of step %d; "
           "requeued: resumed from step %d\n", saved_step, r);
    DT_CHECK_INT(r, saved_step);
    DT_CHECK_INT(dt_test_count_text(outf, dt_test_fmt("done after %d steps", steps)), 1);
    if (strcmp(state, "COMPLETED") || r != saved_step) {
        char *a = dt_test_slurp(first), *b = dt_test_slurp(outf);
        fprintf(stderr, "first run:\n%s\nrequeued:\n%s\n", a ? a : "", b ? b : "");
        free(a);
        free(b);
    }
    DT_CHECK_INT(dt_test_cluster_down(&s.c), 0);
}

/* ---- ssh --------------------------------------------------------------------------------------- */

/* sshd in every host (refuse: a host whose sshd lets nobody in, -1: none); the ssh command. */
static const char *sshd_up(dt_test_cluster *c, int n, int refuse)
{
    skip_without("sshd ssh ssh-keygen",
                 "openssh-server is not installed (scripts/install-deps.sh installs it)");
    dt_test_cluster_up(c, n, NULL);
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("%s/tests/cluster-sshd.sh up %s %s/ssh %s", REPO, c->name, TMP,
                                     refuse >= 0 ? dt_test_fmt("h%d", refuse) : ""),
                         &out, 60);
    DT_CHECK_MSG(rc == 0, "cluster-sshd.sh up: exit %d: %s", rc, out ? out : "");
    DT_REQUIRE(rc == 0);
    out[strcspn(out, "\n")] = '\0';
    const char *cmd = dt_test_fmt("%s", out);
    free(out);
    return cmd;
}

static void test_ssh_three_hosts(void)
{
    dt_test_cluster c;
    char ssh[2048];
    snprintf(ssh, sizeof ssh, "%s", sshd_up(&c, 3, -1));
    char run[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    int steps = 40;
    char *out = NULL;
    int rc = dt_test_run(
        dt_test_cluster_cmd(&c, 0, dt_test_fmt("cd %s && scripts/dtrain-ssh.sh --hosts h0,h1,h2 "
                                               "--ssh '%s' --dtrain %s --log-dir %s/sshlogs -- "
                                               "--nproc-per-node 1 %s train.steps=%d "
                                               "job.output_dir=%s",
                                               REPO, ssh, BIN, TMP, JOB, steps, run)),
        &out, 120);
    DT_CHECK_MSG(rc == 0, "dtrain-ssh.sh: exit %d: %s", rc, out ? out : "");
    DT_CHECK_CONTAINS(out, "dtrain-ssh.sh: node 2 (h2) exited 0");
    DT_CHECK_CONTAINS(out, "h2: dtrain[h2:");
    free(out);
    if (rc == 0)
        same_as_one_host(run, 3, steps);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static void test_ssh_refused(void)
{
    dt_test_cluster c;
    char ssh[2048];
    snprintf(ssh, sizeof ssh, "%s", sshd_up(&c, 3, 2));
    char *out = NULL;
    double t0 = dt_test_now();
    int rc = dt_test_run(
        dt_test_cluster_cmd(&c, 0, dt_test_fmt("cd %s && scripts/dtrain-ssh.sh --hosts h0,h1,h2 "
                                               "--ssh '%s' --dtrain %s --log-dir %s/sshlogs -- "
                                               "--nproc-per-node 1 --rdzv-conf join_timeout=60 %s "
                                               "train.steps=40 job.output_dir=%s/run",
                                               REPO, ssh, BIN, TMP, JOB, TMP)),
        &out, 60);
    double took = dt_test_now() - t0;
    printf("    dtrain-ssh.sh ended %.1f s after it started (join_timeout 60 s)\n", took);
    DT_CHECK_INT(rc, 255);
    DT_CHECK_CONTAINS(out, "h2: root@h2: Permission denied");
    DT_CHECK_CONTAINS(out, "cannot start the agent of node 2 on h2: ssh failed");
    DT_CHECK_MSG(took < 30, "took %.1f s: the others waited for h2", took);
    free(out);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static const dt_test tests[] = {
    {"slurm_job_equals_standalone", test_slurm_job_equals_standalone, 240},
    {"slurm_preempt_and_requeue", test_slurm_preempt_and_requeue, 360},
    {"ssh_three_hosts", test_ssh_three_hosts, 180},
    {"ssh_refused", test_ssh_refused, 120},
};

int main(int argc, char **argv)
{
    return dt_test_cluster_main("test_cluster_sched", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
