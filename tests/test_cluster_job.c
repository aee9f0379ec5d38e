/* test_cluster_job.c - dtrain across the hosts of a simulated cluster (scripts/sim-cluster.sh):
 * separate network stacks, host names, /dev/shm and /tmp, as on real machines.
 *
 * Covered: a static job of 2 hosts x 2 workers and a c10d job of 3 hosts x 1 worker train to
 * the end with the losses of one host running the same number of workers (same global batch,
 * 1e-5 relative), the communicators on the hosts choosing shared memory inside a host and TCP
 * between hosts; two agents on one host name but separate /dev/shm (containers that share a
 * host name) choose TCP, not a shared-memory segment the other cannot see.
 * Faults of the network: see the second half of the file.
 *
 * Files the hosts share live under dt_test_tmpdir() (TMPDIR=/var/tmp: every host sees it); the
 * programs in a host keep their own /tmp. No fixed ports: node 0 binds port 0 and prints it.
 */
#include <cJSON.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "tests/cluster.h"
#include "tests/fixtures.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

#define STEPS 40
/* The trainer's job: a small mlp, 8 samples per rank and step, a loss every step. */
#define JOB                                                                                        \
    "configs/mlp.ini job.device=cpu model.hidden=64,64 data.synthetic_samples=4096 "             \
    "train.batch_size=8 train.warmup_steps=5 job.log_every=1 checkpoint.every=0 "                \
    "train.eval_every=0 ddp.timeout=20"

/* ---- helpers ------------------------------------------------------------------------------- */

/* Starts process k of g in host `host` of c: `dtrain ARGS` (with DTRAIN_LOG=debug for the comm
 * topology lines when debug). */
static void agent(dt_test_group *g, const dt_test_cluster *c, int k, int host, const char *args,
                  bool debug)
{
    const char *out = dt_test_fmt("%s/g%d_agent%d.out", TMP, g->id, k);
    const char *cmd = dt_test_fmt("cd %s && %sexec %s %s", dt_test_repo_dir("configs"),
                                  debug ? "DTRAIN_LOG=debug " : "", BIN, args);
    dt_test_group_spawn(g, k, dt_test_cluster_cmd(c, host, cmd), out);
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

/* A one-host run of nproc workers in this (the machine's own) namespace: the reference. */
static void reference(const char *outdir, int nproc, const char *extra)
{
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("cd %s && %s --nproc-per-node %d %s %s "
                                     "job.output_dir=%s",
                                     dt_test_repo_dir("configs"), BIN, nproc, JOB, extra, outdir),
                         &out, 120);
    DT_CHECK_MSG(rc == 0, "the one-host reference (%d workers) exited %d: %s", nproc, rc,
                 out ? out : "");
    free(out);
    DT_REQUIRE(rc == 0);
}

/* The run's losses equal the reference's at every step 1..steps (1e-5 relative). */
static void same_losses(const char *run, const char *ref, int steps)
{
    static double a[1024], b[1024];
    DT_REQUIRE(steps < 1024);
    losses(run, a, steps + 1);
    losses(ref, b, steps + 1);
    double worst = 0;
    for (int s = 1; s <= steps; s++) {
        DT_CHECK_MSG(isfinite(a[s]) && isfinite(b[s]), "step %d: no loss (%g, %g)", s, a[s], b[s]);
        double d = fabs(a[s] - b[s]) / fabs(b[s]);
        DT_CHECK_MSG(d <= 1e-5, "step %d: across hosts %.9g, one host %.9g", s, a[s], b[s]);
        if (d > worst)
            worst = d;
    }
    printf("    losses of steps 1-%d within %.2g relative of the one-host run\n", steps, worst);
}

/* Every agent of g says its ranks found `hosts` hosts with `local` ranks each and chose shared
 * memory inside a host and TCP between hosts (or TCP alone with one rank per host). */
static void check_topology(const dt_test_group *g, int hosts, int local, int world)
{
    for (int k = 0; k < g->n; k++) {
        const char *how = local > 1 ? "shared memory + TCP ring between hosts"
                                    : "TCP ring between hosts";
        int n = dt_test_count_text(
            g->out[k], dt_test_fmt("of %d: %d host(s), %d rank(s) on this one, %s", world, hosts,
                                   local, how));
        DT_CHECK_MSG(n >= local, "agent %d: %d of its ranks said \"%d host(s) ... %s\"", k, n,
                     hosts, how);
    }
}

static void dump_on_failure(const dt_test_group *g, bool bad)
{
    if (bad)
        dt_test_group_dump(g);
}

/* ---- dtrain across hosts --------------------------------------------------------------------- */

static void test_static_two_hosts(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 2, NULL);
    char run[1024], ref[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    snprintf(ref, sizeof ref, "%s/ref", TMP);
    dt_test_group g;
    dt_test_group_init(&g);
    const char *common = dt_test_fmt("--nnodes 2 --master-addr %s --nproc-per-node 2 %s "
                                     "train.steps=%d job.output_dir=%s",
                                     c.addr[0], JOB, STEPS, run);
    agent(&g, &c, 0, 0, dt_test_fmt("--node-rank 0 --master-port 0 %s", common), true);
    int port = dt_test_read_port(g.out[0], dt_test_fmt("hosting the rendezvous store at %s:", c.addr[0]), 30);
    agent(&g, &c, 1, 1, dt_test_fmt("--node-rank 1 --master-port %d %s", port, common), true);
    dt_test_group_wait(&g, 120);
    DT_CHECK_INT(g.code[0], 0);
    DT_CHECK_INT(g.code[1], 0);
    check_topology(&g, 2, 2, 4);
    /* each host's ranks named their own host */
    DT_CHECK(dt_test_count_text(g.out[1], "[2]:dtrain[h1:") > 0);
    dump_on_failure(&g, g.code[0] || g.code[1]);
    dt_test_group_kill(&g);
    if (g.code[0] || g.code[1])
        return;
    reference(ref, 4, dt_test_fmt("train.steps=%d", STEPS));
    same_losses(run, ref, STEPS);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

#define CONF_CALM "heartbeat_interval=0.2,heartbeat_timeout=10,join_timeout=30,last_call_timeout=1,close_timeout=5"

static void test_c10d_three_hosts(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 3, NULL);
    char run[1024], ref[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    snprintf(ref, sizeof ref, "%s/ref", TMP);
    dt_test_group g;
    dt_test_group_init(&g);
    const char *common = dt_test_fmt("--rdzv-backend c10d --rdzv-id c3 --nnodes 3:3 "
                                     "--nproc-per-node 1 --monitor-interval 0.05 %s train.steps=%d "
                                     "job.output_dir=%s",
                                     JOB, STEPS, run);
    agent(&g, &c, 0, 0,
          dt_test_fmt("--rdzv-endpoint %s:0 --rdzv-conf %s,is_host=1 %s", c.addr[0], CONF_CALM,
                      common),
          true);
    int port = dt_test_read_port(g.out[0], dt_test_fmt("hosting the rendezvous store at %s:", c.addr[0]), 30);
    for (int k = 1; k < 3; k++)
        agent(&g, &c, k, k,
              dt_test_fmt("--rdzv-endpoint %s:%d --rdzv-conf %s %s", c.addr[0], port, CONF_CALM,
                          common),
              true);
    dt_test_group_wait(&g, 150);
    bool bad = false;
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(g.code[k], 0);
        bad |= g.code[k] != 0;
    }
    check_topology(&g, 3, 1, 3);
    dump_on_failure(&g, bad);
    dt_test_group_kill(&g);
    if (bad)
        return;
    reference(ref, 3, dt_test_fmt("train.steps=%d", STEPS));
    same_losses(run, ref, STEPS);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* Two agents on h0, the second in a mount namespace of its own with another /dev/shm: the same
 * host name, but no shared memory between them, as with two containers on one host name. */
static void test_same_name_own_shm(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 1, NULL);
    char run[1024], ref[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    snprintf(ref, sizeof ref, "%s/ref", TMP);
    dt_test_group g;
    dt_test_group_init(&g);
    const char *common = dt_test_fmt("--nnodes 2 --master-addr 127.0.0.1 --nproc-per-node 1 %s "
                                     "train.steps=%d job.output_dir=%s",
                                     JOB, STEPS, run);
    agent(&g, &c, 0, 0, dt_test_fmt("--node-rank 0 --master-port 0 %s", common), true);
    int port = dt_test_read_port(g.out[0], "hosting the rendezvous store at 127.0.0.1:", 30);
    const char *out = dt_test_fmt("%s/g%d_agent1.out", TMP, g.id);
    const char *cmd = dt_test_fmt(
        "cd %s && exec unshare --mount --propagation private sh -c 'mount -t tmpfs tmpfs /dev/shm "
        "&& DTRAIN_LOG=debug exec %s --node-rank 1 --master-port %d %s'",
        dt_test_repo_dir("configs"), BIN, port, common);
    dt_test_group_spawn(&g, 1, dt_test_cluster_cmd(&c, 0, cmd), out);
    dt_test_group_wait(&g, 120);
    DT_CHECK_INT(g.code[0], 0);
    DT_CHECK_INT(g.code[1], 0);
    check_topology(&g, 2, 1, 2);
    dump_on_failure(&g, g.code[0] || g.code[1]);
    dt_test_group_kill(&g);
    if (g.code[0] || g.code[1])
        return;
    reference(ref, 2, dt_test_fmt("train.steps=%d", STEPS));
    same_losses(run, ref, STEPS);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* ---- faults of the network -------------------------------------------------------------------
 * A cut link (sim-cluster.sh link HOST down) drops every packet in both directions and resets
 * nothing: TCP only learns of it by timeouts. The jobs below train long enough (a step every
 * few ms) that the cut always falls mid-run; the time limits are the issue's: survivors re-form
 * within the heartbeat timeout (plus a few seconds), the cut-off agent stops its workers within
 * twice the heartbeat timeout, collectives fail within ddp.timeout. */

#define HB 4.0 /* heartbeat_timeout of the fault tests, s */
#define CONF_FAULT "heartbeat_interval=0.25,heartbeat_timeout=4,join_timeout=8,last_call_timeout=1,close_timeout=5"
#define LONG_JOB                                                                                   \
    "configs/mlp.ini job.device=cpu model.hidden=256,256 data.synthetic_samples=65536 "          \
    "train.batch_size=64 train.warmup_steps=5 job.log_every=100 checkpoint.every=500 "           \
    "train.eval_every=0"

/* Whether a `dtrain worker` process runs in host k (found by its network namespace). */
static bool host_has_worker(const dt_test_cluster *c, int k)
{
    char *out = NULL;
    int rc = dt_test_run(dt_test_fmt("for p in $(ip netns pids %s-h%d); do "
                                     "tr '\\0' ' ' < /proc/$p/cmdline 2>/dev/null; echo; done",
                                     c->name, k),
                         &out, 10);
    bool yes = rc == 0 && out && strstr(out, " worker ");
    free(out);
    return yes;
}

/* Waits (at most timeout_s, scaled) until no worker runs in host k; seconds waited, or -1. */
static double wait_no_worker(const dt_test_cluster *c, int k, double timeout_s)
{
    double t0 = dt_test_now(), end = t0 + timeout_s * dt_test_timeout_scale();
    while (host_has_worker(c, k)) {
        if (dt_test_now() > end)
            return -1;
        dt_sleep_ms(50);
    }
    return dt_test_now() - t0;
}

/* Waits until process k of g says needle (within timeout_s, scaled); the time it took. */
static double wait_said(const dt_test_group *g, int k, const char *needle, double timeout_s)
{
    double t0 = dt_test_now();
    bool ok = dt_test_wait_text(g->out[k], needle, 1, timeout_s);
    DT_CHECK_MSG(ok, "agent %d did not say \"%s\" within %.0f s", k, needle, timeout_s);
    return ok ? dt_test_now() - t0 : -1;
}

/* Waits for process k of g to end, at most timeout_s from now (scaled); its exit code, or -1. */
static int wait_end(dt_test_group *g, int k, double timeout_s)
{
    int code = dt_test_wait_exit(g->pid[k], timeout_s * dt_test_timeout_scale());
    g->done[k] = true;
    g->code[k] = code;
    return code;
}

/* Starts a c10d job of n hosts x 1 worker (h0's agent hosts the store) and waits until rank 0
 * has trained `at` steps; returns the store's port. */
static int c10d_job(dt_test_group *g, const dt_test_cluster *c, int n, int steps, int at,
                    const char *run, const char *extra)
{
    const char *common = dt_test_fmt("--rdzv-backend c10d --rdzv-id cut --nnodes 2:%d "
                                     "--nproc-per-node 1 --monitor-interval 0.05 --stop-grace 5 "
                                     "--max-restarts 3 %s ddp.timeout=30 train.steps=%d "
                                     "job.output_dir=%s %s",
                                     n, LONG_JOB, steps, run, extra);
    agent(g, c, 0, 0,
          dt_test_fmt("--rdzv-endpoint %s:0 --rdzv-conf %s,is_host=1 %s", c->addr[0], CONF_FAULT,
                      common),
          false);
    int port = dt_test_read_port(g->out[0], dt_test_fmt("hosting the rendezvous store at %s:", c->addr[0]), 30);
    for (int k = 1; k < n; k++)
        agent(g, c, k, k,
              dt_test_fmt("--rdzv-endpoint %s:%d --rdzv-conf %s %s", c->addr[0], port, CONF_FAULT,
                          common),
              false);
    /* rank 0 logs the steps; it is on one of the hosts */
    double end = dt_test_now() + 90 * dt_test_timeout_scale();
    for (;;) {
        for (int k = 0; k < n; k++)
            if (dt_test_count_text(g->out[k], dt_test_fmt("step %d/", at)))
                return port;
        if (dt_test_now() > end) {
            dt_test_group_dump(g);
            DT_REQUIRE(!"the job did not reach the step where the link is cut");
        }
        dt_sleep_ms(20);
    }
}

/* c10d on 3 hosts, h2's link cut mid-run: h0 and h1 declare it lost within the heartbeat
 * timeout and finish as 2; h2's agent notices on its own that it is out of the job, stops its
 * worker within twice the heartbeat timeout with a clear message, and never starts a round of
 * its own. Its link comes back after it left: the job is not disturbed. */
static void test_c10d_member_cut(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 3, NULL);
    char run[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    dt_test_group g;
    dt_test_group_init(&g);
    int steps = 6000;
    c10d_job(&g, &c, 3, steps, 1000, run, "");
    DT_REQUIRE(host_has_worker(&c, 2));
    DT_REQUIRE(dt_test_cluster_link(&c, 2, false) == 0);
    double t0 = dt_test_now();
    /* the cut-off agent stops its worker on its own */
    double w = wait_no_worker(&c, 2, 2 * HB);
    DT_CHECK_MSG(w >= 0, "h2's worker still runs %.0f s after the cut", 2 * HB);
    printf("    h2's worker stopped %.1f s after the cut (2 x heartbeat_timeout: %.0f s)\n", w, 2 * HB);
    /* the survivors: "node 2 (h2) was lost: no heartbeat for ..." */
    double lost = -1;
    for (int k = 0; k < 2; k++) {
        double t = wait_said(&g, k, "(h2) was lost: no heartbeat", HB + 6);
        lost = DT_MAX(lost, t >= 0 ? dt_test_now() - t0 : 99);
    }
    printf("    survivors had declared h2 lost by %.1f s after the cut (heartbeat_timeout %.0f s)\n", lost, HB);
    /* the cut-off agent, on its own */
    int code2 = wait_end(&g, 2, 2 * HB + 3 - (dt_test_now() - t0));
    double gone = dt_test_now() - t0;
    printf("    h2's agent stopped its worker and exited %.1f s after the cut\n", gone);
    DT_CHECK_MSG(code2 > 0 && code2 < 128, "h2's agent: exit %d (expected a failure, in time)", code2);
    DT_CHECK(dt_test_count_text(g.out[2], "this node is out of the job") == 1);
    DT_CHECK_INT(dt_test_count_text(g.out[2], "(round 1)"), 0);
    DT_CHECK_INT(dt_test_count_text(g.out[2], "done after"), 0);
    /* the link returns; the two finish */
    DT_REQUIRE(dt_test_cluster_link(&c, 2, true) == 0);
    int code0 = wait_end(&g, 0, 150), code1 = wait_end(&g, 1, 30);
    DT_CHECK_INT(code0, 0);
    DT_CHECK_INT(code1, 0);
    int done = 0;
    for (int k = 0; k < 2; k++) {
        DT_CHECK(dt_test_count_text(g.out[k], "node 2 of 2") + dt_test_count_text(g.out[k], "node 1 of 2") +
                     dt_test_count_text(g.out[k], "node 0 of 2") >= 1);
        done += dt_test_count_text(g.out[k], dt_test_fmt("done after %d steps", steps));
    }
    DT_CHECK_INT(done, 1);
    if (code0 || code1 || code2 <= 0)
        dt_test_group_dump(&g);
    dt_test_group_kill(&g);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* The store's host cut off (c10d, h0 hosts the store): h1 and h2 end within the timeouts with
 * a message naming the store's address; nothing hangs. */
static void test_c10d_store_host_cut(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 3, NULL);
    dt_test_group g;
    dt_test_group_init(&g);
    int port = c10d_job(&g, &c, 3, 100000, 500, dt_test_fmt("%s/run", TMP), "");
    DT_REQUIRE(dt_test_cluster_link(&c, 0, false) == 0);
    double t0 = dt_test_now();
    char where[64];
    snprintf(where, sizeof where, "%s:%d", c.addr[0], port);
    for (int k = 1; k < 3; k++) {
        int code = wait_end(&g, k, 2 * HB + 3 - (dt_test_now() - t0));
        DT_CHECK_MSG(code > 0 && code < 128, "h%d's agent: exit %d (expected a failure, in time)", k, code);
        DT_CHECK_MSG(dt_test_count_text(g.out[k], where) > 0, "h%d's agent does not name %s", k, where);
        DT_CHECK(dt_test_count_text(g.out[k], "this node is out of the job") == 1);
    }
    printf("    h1 and h2 ended %.1f s after the store's host was cut off\n", dt_test_now() - t0);
    /* h0 still has its store: it sees both others lost, and ends at the join timeout */
    int code0 = wait_end(&g, 0, HB + 8 + 10);
    DT_CHECK_MSG(code0 > 0 && code0 < 128, "h0's agent: exit %d", code0);
    if (g.code[1] <= 0 || g.code[2] <= 0 || code0 <= 0)
        dt_test_group_dump(&g);
    dt_test_group_kill(&g);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* The store's host cut off in a static job of 2 hosts: h1 ends within the timeouts naming the
 * store's address; h0 (which still has its store) ends at its join timeout. */
static void test_static_store_host_cut(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 2, NULL);
    dt_test_group g;
    dt_test_group_init(&g);
    const char *common = dt_test_fmt("--nnodes 2 --master-addr %s --nproc-per-node 1 --rdzv-conf %s "
                                     "--monitor-interval 0.05 --stop-grace 5 --max-restarts 1 %s "
                                     "ddp.timeout=30 train.steps=100000 job.output_dir=%s/run",
                                     c.addr[0], CONF_FAULT, LONG_JOB, TMP);
    agent(&g, &c, 0, 0, dt_test_fmt("--node-rank 0 --master-port 0 %s", common), false);
    int port = dt_test_read_port(g.out[0], dt_test_fmt("hosting the rendezvous store at %s:", c.addr[0]), 30);
    agent(&g, &c, 1, 1, dt_test_fmt("--node-rank 1 --master-port %d %s", port, common), false);
    DT_REQUIRE(dt_test_wait_text(g.out[0], "step 500/", 1, 90));
    DT_REQUIRE(dt_test_cluster_link(&c, 0, false) == 0);
    double t0 = dt_test_now();
    int code1 = wait_end(&g, 1, 2 * HB + 3);
    printf("    h1 ended %.1f s after the store's host was cut off\n", dt_test_now() - t0);
    DT_CHECK_MSG(code1 > 0 && code1 < 128, "h1's agent: exit %d (expected a failure, in time)", code1);
    char where[64];
    snprintf(where, sizeof where, "%s:%d", c.addr[0], port);
    DT_CHECK_MSG(dt_test_count_text(g.out[1], where) > 0, "h1's agent does not name %s", where);
    int code0 = wait_end(&g, 0, HB + 8 + 15);
    DT_CHECK_MSG(code0 > 0 && code0 < 128, "h0's agent: exit %d", code0);
    if (code1 <= 0 || code0 <= 0)
        dt_test_group_dump(&g);
    dt_test_group_kill(&g);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

/* A collective across a cut link (the heartbeat timeout is long, so the collective is the first
 * to notice): the error names the rank, its peer, the peer's host and the operation, within
 * ddp.timeout. */
static void test_collective_across_cut(void)
{
    dt_test_cluster c;
    dt_test_cluster_up(&c, 2, NULL);
    dt_test_group g;
    dt_test_group_init(&g);
    const char *common = dt_test_fmt(
        "--nnodes 2 --master-addr %s --nproc-per-node 1 --rdzv-conf heartbeat_interval=0.25,"
        "heartbeat_timeout=60,join_timeout=15 --monitor-interval 0.05 --stop-grace 2 "
        "--max-restarts 0 %s ddp.timeout=4 train.steps=100000 job.output_dir=%s/run",
        c.addr[0], LONG_JOB, TMP);
    agent(&g, &c, 0, 0, dt_test_fmt("--node-rank 0 --master-port 0 %s", common), false);
    int port = dt_test_read_port(g.out[0], dt_test_fmt("hosting the rendezvous store at %s:", c.addr[0]), 30);
    agent(&g, &c, 1, 1, dt_test_fmt("--node-rank 1 --master-port %d %s", port, common), false);
    DT_REQUIRE(dt_test_wait_text(g.out[0], "step 500/", 1, 90));
    DT_REQUIRE(dt_test_cluster_link(&c, 1, false) == 0);
    double t0 = dt_test_now();
    /* rank 0 (on h0) waits for rank 1 (on h1) */
    const char *want = "comm: rank 0: allreduce #";
    bool said = dt_test_wait_text(g.out[0], want, 1, 4 + 4);
    double t = dt_test_now() - t0;
    DT_CHECK_MSG(said, "rank 0 did not report the collective within ddp.timeout + 4 s");
    char *o0 = dt_test_slurp(g.out[0]);
    const char *line = o0 ? strstr(o0, want) : NULL;
    DT_CHECK_MSG(line && strstr(line, "rank 1 (") && strstr(line, dt_test_fmt("on %s)", c.addr[1])),
                 "rank 0's error does not name rank 1 on %s: %.300s", c.addr[1],
                 line ? line : "(none)");
    printf("    rank 0's collective failed %.1f s after the cut (ddp.timeout 4 s): %.*s\n", t,
           line ? (int)strcspn(line, "\n") : 0, line ? line : "");
    free(o0);
    DT_REQUIRE(dt_test_cluster_link(&c, 1, true) == 0);
    /* rank 0's failure ends node 0 (no restarts): the job is over, nothing hangs there */
    int code0 = wait_end(&g, 0, 20);
    DT_CHECK_MSG(code0 > 0 && code0 < 128, "node 0: exit %d", code0);
    dt_test_group_kill(&g);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static const dt_test tests[] = {
    {"static_two_hosts", test_static_two_hosts, 180},
    {"c10d_three_hosts", test_c10d_three_hosts, 180},
    {"same_name_own_shm", test_same_name_own_shm, 180},
    {"c10d_member_cut", test_c10d_member_cut, 240},
    {"c10d_store_host_cut", test_c10d_store_host_cut, 180},
    {"static_store_host_cut", test_static_store_host_cut, 180},
    {"collective_across_cut", test_collective_across_cut, 180},
};

int main(int argc, char **argv)
{
    return dt_test_cluster_main("test_cluster_job", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
