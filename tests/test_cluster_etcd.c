/* test_cluster_etcd.c - the etcd rendezvous across partitions of a simulated cluster: a
 * 3-member etcd, one member on each host of scripts/sim-cluster.sh, and one dtrain agent (the
 * built-in trainer) on each host.
 *
 * Covered: the etcd leader's host is cut off mid-run: a new leader is elected by the other two
 * members, the two agents there declare the cut-off node lost, re-form and finish; the cut-off
 * agent (whose own member is alone, without quorum) stops by itself. Two of the three hosts cut
 * off: no member has quorum; every agent stops cleanly within the rendezvous timeouts, saying
 * quorum was lost; once the links are back, the job started again resumes from its last
 * checkpoint and finishes.
 *
 * etcd listens on its standard ports 2379/2380 inside each host: every host is a network
 * namespace of this test's own, so nothing else can hold them (the one place where a test here
 * uses fixed ports). Without `etcd` (scripts/install-deps.sh installs etcd-server) or without
 * namespaces, the tests skip, saying so.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cJSON.h>

#include "common/util.h"
#include "rendezvous/rdzv_etcd_client.h"
#include "tests/cluster.h"
#include "tests/fixtures.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()
#define HOSTS 3
#define HB 5.0
#define CONF "heartbeat_interval=0.3,heartbeat_timeout=5,join_timeout=20,last_call_timeout=1"
#define JOB                                                                                        \
    "configs/mlp.ini job.device=cpu model.hidden=256,256 data.synthetic_samples=65536 "          \
    "train.batch_size=64 train.warmup_steps=5 job.log_every=100 checkpoint.every=500 "           \
    "checkpoint.keep=100 train.eval_every=0 ddp.timeout=30"

static void skip_without_etcd(void)
{
    char *out = NULL;
    int rc = dt_test_run("command -v etcd", &out, 10);
    free(out);
    if (rc != 0)
        DT_SKIP("etcd is not on the PATH (install etcd-server: scripts/install-deps.sh)");
}

static const char *endpoints(const dt_test_cluster *c)
{
    return dt_test_fmt("%s:2379,%s:2379,%s:2379", c->addr[0], c->addr[1], c->addr[2]);
}

/* etcd member i in host i (data in the host's own /tmp), as process i of g. */
static void start_members(dt_test_group *g, const dt_test_cluster *c)
{
    const char *initial = dt_test_fmt("m0=http://%s:2380,m1=http://%s:2380,m2=http://%s:2380",
                                      c->addr[0], c->addr[1], c->addr[2]);
    for (int i = 0; i < HOSTS; i++) {
        const char *a = c->addr[i];
        const char *cmd = dt_test_fmt(
            "exec etcd --name m%d --data-dir /tmp/etcd.m%d --listen-client-urls "
            "http://%s:2379,http://127.0.0.1:2379 --advertise-client-urls http://%s:2379 "
            "--listen-peer-urls http://%s:2380 --initial-advertise-peer-urls http://%s:2380 "
            "--initial-cluster %s --initial-cluster-state new --initial-cluster-token %s",
            i, i, a, a, a, a, initial, c->name);
        dt_test_group_spawn(g, i, dt_test_cluster_cmd(c, i, cmd), dt_test_fmt("%s/etcd%d.log", TMP, i));
    }
}

/* Which member leads, asked from host `from` (a forked child in its network namespace): its
 * index, or -1 when none answers with a leader within timeout_s. */
static int leader_seen_from(const dt_test_cluster *c, int from, double timeout_s)
{
    double end = dt_test_now() + timeout_s * dt_test_timeout_scale();
    do {
        pid_t pid = fork();
        DT_REQUIRE(pid >= 0);
        if (pid == 0) {
            dt_test_cluster_enter_net(c, from);
            char id[HOSTS][64], lead[64] = "";
            for (int i = 0; i < HOSTS; i++) {
                id[i][0] = '\0';
                dt_etcd *e = NULL;
                cJSON *b = cJSON_CreateObject(), *r = NULL;
                if (dt_etcd_open(&e, dt_test_fmt("%s:2379", c->addr[i]), 1, NULL, NULL) == 0 &&
                    dt_etcd_call_one(e, 0, "/v3/maintenance/status", b, &r, 1.0, NULL) == 0) {
                    const cJSON *h = cJSON_GetObjectItemCaseSensitive(r, "header");
                    const cJSON *m = cJSON_GetObjectItemCaseSensitive(h, "member_id");
                    const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, "leader");
                    if (cJSON_IsString(m))
                        snprintf(id[i], sizeof id[i], "%s", m->valuestring);
                    if (cJSON_IsString(l) && strcmp(l->valuestring, "0"))
                        snprintf(lead, sizeof lead, "%s", l->valuestring);
                }
                cJSON_Delete(b);
                cJSON_Delete(r);
                dt_etcd_free(e);
            }
            for (int i = 0; i < HOSTS; i++)
                if (id[i][0] && !strcmp(id[i], lead))
                    _exit(i);
            _exit(100);
        }
        int st = 0;
        waitpid(pid, &st, 0);
        if (WIFEXITED(st) && WEXITSTATUS(st) < HOSTS)
            return WEXITSTATUS(st);
        dt_sleep_ms(200);
    } while (dt_test_now() < end);
    return -1;
}

/* The agent of host k, as process k of g. */
static void start_agent(dt_test_group *g, const dt_test_cluster *c, int k, const char *run,
                        int steps)
{
    const char *cmd = dt_test_fmt(
        "cd %s && exec %s --rdzv-backend etcd --rdzv-endpoint %s --rdzv-id part --nnodes 2:3 "
        "--nproc-per-node 1 --rdzv-conf %s --monitor-interval 0.05 --stop-grace 5 "
        "--max-restarts 3 %s train.steps=%d job.output_dir=%s",
        dt_test_repo_dir("configs"), BIN, endpoints(c), CONF, JOB, steps, run);
    dt_test_group_spawn(g, k, dt_test_cluster_cmd(c, k, cmd),
                        dt_test_fmt("%s/g%d_agent%d.out", TMP, g->id, k));
}

/* Waits until some agent's rank 0 has logged step `at`. */
static void wait_step(const dt_test_group *g, int at, double timeout_s)
{
    double end = dt_test_now() + timeout_s * dt_test_timeout_scale();
    for (;;) {
        for (int k = 0; k < g->n; k++)
            if (dt_test_count_text(g->out[k], dt_test_fmt("step %d/", at)))
                return;
        if (dt_test_now() > end) {
            dt_test_group_dump(g);
            DT_REQUIRE(!"the job did not reach the step where the links are cut");
        }
        dt_sleep_ms(20);
    }
}

static int wait_end(dt_test_group *g, int k, double timeout_s)
{
    g->code[k] = dt_test_wait_exit(g->pid[k], timeout_s * dt_test_timeout_scale());
    g->done[k] = true;
    return g->code[k];
}

/* The leader's host cut off mid-run: the job goes on with the other two and finishes. */
static void test_leader_host_cut(void)
{
    skip_without_etcd();
    dt_test_cluster c;
    dt_test_cluster_up(&c, HOSTS, NULL);
    dt_test_group etcd, g;
    dt_test_group_init(&etcd);
    start_members(&etcd, &c);
    int leader = leader_seen_from(&c, 0, 30);
    DT_REQUIRE(leader >= 0);
    dt_test_group_init(&g);
    char run[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    int steps = 6000;
    for (int k = 0; k < HOSTS; k++)
        start_agent(&g, &c, k, run, steps);
    wait_step(&g, 1000, 90);
    DT_REQUIRE(dt_test_cluster_link(&c, leader, false) == 0);
    double t0 = dt_test_now();
    int a = (leader + 1) % HOSTS, b = (leader + 2) % HOSTS;
    int now_leader = leader_seen_from(&c, a, 15);
    printf("    cut off h%d (the etcd leader); h%d leads %.1f s later\n", leader, now_leader,
           dt_test_now() - t0);
    DT_CHECK_MSG(now_leader == a || now_leader == b, "no new leader among h%d and h%d (%d)", a, b,
                 now_leader);
    /* the cut-off agent stops by itself */
    int cut = wait_end(&g, leader, 3 * HB + 10);
    printf("    the cut-off agent ended %.1f s after the cut\n", dt_test_now() - t0);
    DT_CHECK_MSG(cut > 0 && cut < 128, "the cut-off agent (h%d): exit %d", leader, cut);
    DT_CHECK_INT(dt_test_count_text(g.out[leader], "done after"), 0);
    int ca = wait_end(&g, a, 150), cb = wait_end(&g, b, 30);
    DT_CHECK_INT(ca, 0);
    DT_CHECK_INT(cb, 0);
    DT_CHECK_INT(dt_test_count_text(g.out[a], dt_test_fmt("done after %d steps", steps)) +
                     dt_test_count_text(g.out[b], dt_test_fmt("done after %d steps", steps)),
                 1);
    if (ca || cb || cut <= 0)
        dt_test_group_dump(&g);
    dt_test_group_kill(&g);
    dt_test_group_kill(&etcd);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
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

/* Two of three hosts cut off: quorum is lost everywhere; every agent stops cleanly and says so;
 * with the links back, the job started again resumes from its checkpoint and finishes. */
static void test_quorum_lost_and_back(void)
{
    skip_without_etcd();
    dt_test_cluster c;
    dt_test_cluster_up(&c, HOSTS, NULL);
    dt_test_group etcd, g;
    dt_test_group_init(&etcd);
    start_members(&etcd, &c);
    DT_REQUIRE(leader_seen_from(&c, 0, 30) >= 0);
    dt_test_group_init(&g);
    char run[1024];
    snprintf(run, sizeof run, "%s/run", TMP);
    int steps = 4000;
    for (int k = 0; k < HOSTS; k++)
        start_agent(&g, &c, k, run, steps);
    wait_step(&g, 1200, 90);
    DT_REQUIRE(dt_test_cluster_link(&c, 1, false) == 0);
    DT_REQUIRE(dt_test_cluster_link(&c, 2, false) == 0);
    double t0 = dt_test_now();
    for (int k = 0; k < HOSTS; k++) {
        int code = wait_end(&g, k, 3 * HB + 10 - (dt_test_now() - t0));
        DT_CHECK_MSG(code > 0 && code < 128, "agent h%d: exit %d (expected a failure, in time)", k,
                     code);
        DT_CHECK_MSG(dt_test_count_text(g.out[k], "quorum") >= 1,
                     "agent h%d does not say that quorum was lost", k);
    }
    printf("    every agent had stopped %.1f s after 2 of 3 hosts were cut off "
           "(heartbeat_timeout %.0f s)\n",
           dt_test_now() - t0, HB);
    bool bad = false;
    for (int k = 0; k < HOSTS; k++)
        bad |= g.code[k] <= 0;
    if (bad)
        dt_test_group_dump(&g);
    dt_test_group_kill(&g);
    /* the links come back: etcd has quorum again; the job, started again, resumes */
    DT_REQUIRE(dt_test_cluster_link(&c, 1, true) == 0);
    DT_REQUIRE(dt_test_cluster_link(&c, 2, true) == 0);
    DT_REQUIRE(leader_seen_from(&c, 0, 30) >= 0);
    dt_test_group r;
    dt_test_group_init(&r);
    for (int k = 0; k < HOSTS; k++)
        start_agent(&r, &c, k, run, steps);
    dt_test_group_wait(&r, 150);
    int resumed = -1, done = 0;
    for (int k = 0; k < HOSTS; k++) {
        DT_CHECK_INT(r.code[k], 0);
        resumed = DT_MAX(resumed, resumed_step(r.out[k]));
        done += dt_test_count_text(r.out[k], dt_test_fmt("done after %d steps", steps));
    }
    printf("    started again: resumed from step %d\n", resumed);
    DT_CHECK_MSG(resumed >= 1000 && resumed % 500 == 0, "resumed at step %d", resumed);
    DT_CHECK_INT(done, 1);
    if (done != 1)
        dt_test_group_dump(&r);
    dt_test_group_kill(&r);
    dt_test_group_kill(&etcd);
    DT_CHECK_INT(dt_test_cluster_down(&c), 0);
}

static const dt_test tests[] = {
    {"leader_host_cut", test_leader_host_cut, 240},
    {"quorum_lost_and_back", test_quorum_lost_and_back, 300},
};

int main(int argc, char **argv)
{
    return dt_test_cluster_main("test_cluster_etcd", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
