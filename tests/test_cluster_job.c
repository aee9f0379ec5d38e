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
    const char *run = dt_test_fmt("%s/run", TMP), *ref = dt_test_fmt("%s/ref", TMP);
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
    const char *run = dt_test_fmt("%s/run", TMP), *ref = dt_test_fmt("%s/ref", TMP);
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
    const char *run = dt_test_fmt("%s/run", TMP), *ref = dt_test_fmt("%s/ref", TMP);
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

static const dt_test tests[] = {
    {"static_two_hosts", test_static_two_hosts, 180},
    {"c10d_three_hosts", test_c10d_three_hosts, 180},
    {"same_name_own_shm", test_same_name_own_shm, 180},
};

int main(int argc, char **argv)
{
    return dt_test_cluster_main("test_cluster_job", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
