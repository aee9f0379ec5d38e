/* test_agent_multi.c - the static rendezvous with 2 and 3 agents on 127.0.0.1: ranks and the
 * environment agree across nodes, a worker failure on one node restarts every node, the budget
 * is job-wide, a SIGKILLed agent is detected (heartbeats) and leaves no orphan, a signal to one
 * agent ends the job on all, an external `dtrain store` is used when it holds the port.
 *
 * No fixed ports: node 0 hosts the store on port 0 and the test reads the port from its log
 * before starting the other agents. Heartbeats and timeouts are shortened through --rdzv-conf.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>
#include <string.h>

#include "common/util.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/rdzv_common.h"
#include "tests/harness.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

typedef dt_test_group job;

/* Starts agent k of a static job with its own --nnodes (port: node 0's store, 0 for node 0). */
static pid_t spawn_node(job *j, int k, int nnodes, const char *opts, const char *cmd)
{
    char line[8192];
    snprintf(j->out[k], sizeof j->out[k], "%s/node%d.out", TMP, k);
    snprintf(line, sizeof line,
             "%s --nnodes %d --node-rank %d --master-addr 127.0.0.1 --master-port %d "
             "--log-dir %s/logs %s -- %s",
             BIN, nnodes, k, k == 0 ? 0 : j->port, TMP, opts, cmd);
    dt_test_group_spawn(j, k, line, j->out[k]);
    return j->pid[k];
}

/* Starts n agents: node 0 first on port 0, then the others on the port it printed. `opts` are
 * common launcher options; `cmd` the worker command (quoted for sh). */
static void start_job(job *j, int n, const char *opts, const char *cmd)
{
    dt_test_group_init(j);
    for (int k = 0; k < n; k++) {
        if (k == 1)
            j->port = dt_test_read_port(j->out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
        spawn_node(j, k, n, opts, cmd);
    }
}

/* Waits for every agent; codes[k] = its exit code. */
static void wait_job(job *j, int *codes, double timeout_s)
{
    dt_test_group_wait(j, timeout_s);
    for (int k = 0; k < j->n; k++)
        codes[k] = j->code[k];
}

static const char *fast = "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=5,join_timeout=20,"
                          "close_timeout=10 --stop-grace 5 --monitor-interval 0.05";

/* Two nodes with 2 and 3 workers: contiguous ranks, one world, one MASTER_ADDR:PORT. */
static void test_two_nodes_env(void)
{
    job j;
    const char *cmd = "sh -c 'echo \"E rank=$RANK local=$LOCAL_RANK world=$WORLD_SIZE "
                      "lws=$LOCAL_WORLD_SIZE group=$GROUP_RANK groups=$GROUP_WORLD_SIZE "
                      "master=$MASTER_ADDR:$MASTER_PORT store=$DTRAIN_STORE_ADDR:$DTRAIN_STORE_PORT "
                      "run=$DTRAIN_RUN_ID/$TORCHELASTIC_RUN_ID attempt=$DTRAIN_ATTEMPT\"'";
    char line[8192];
    dt_test_group_init(&j);
    snprintf(j.out[0], sizeof j.out[0], "%s/node0.out", TMP);
    snprintf(j.out[1], sizeof j.out[1], "%s/node1.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 "
             "--nproc-per-node 2 --rdzv-id envm --log-dir %s/logs %s -- %s",
             BIN, TMP, fast, cmd);
    dt_test_group_spawn(&j, 0, line, j.out[0]);
    j.port = dt_test_read_port(j.out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port %d "
             "--nproc-per-node 3 --rdzv-id envm --log-dir %s/logs %s -- %s",
             BIN, j.port, TMP, fast, cmd);
    dt_test_group_spawn(&j, 1, line, j.out[1]);
    int codes[2];
    wait_job(&j, codes, 30);
    DT_CHECK_INT(codes[0], 0);
    DT_CHECK_INT(codes[1], 0);
    char *o0 = dt_test_slurp(j.out[0]), *o1 = dt_test_slurp(j.out[1]);
    DT_REQUIRE(o0 && o1);
    /* The master port node 0 chose, as its own workers saw it. */
    const char *m = strstr(o0, "master=127.0.0.1:");
    DT_REQUIRE(m != NULL);
    int mport = atoi(m + strlen("master=127.0.0.1:"));
    DT_CHECK(mport > 0 && mport != j.port);
    char want[512];
    for (int r = 0; r < 5; r++) {
        int node = r < 2 ? 0 : 1;
        snprintf(want, sizeof want,
                 "[%d]:E rank=%d local=%d world=5 lws=%d group=%d groups=2 master=127.0.0.1:%d "
                 "store=127.0.0.1:%d run=envm/envm attempt=0\n",
                 r, r, node ? r - 2 : r, node ? 3 : 2, node, mport, j.port);
        DT_CHECK_CONTAINS(node ? o1 : o0, want);
    }
    if (codes[0] || codes[1])
        dt_test_group_dump(&j);
    free(o0);
    free(o1);
}

/* Three nodes; rank 3 (node 1) fails in attempt 0; every node restarts; attempt 1 succeeds. */
static void test_three_nodes_restart_all(void)
{
    job j;
    char opts[1024];
    snprintf(opts, sizeof opts, "%s --rdzv-id r3 --nproc-per-node 2 --max-restarts 2", fast);
    start_job(&j, 3, opts,
              "sh -c 'echo attempt=$DTRAIN_ATTEMPT rank=$RANK; "
              "if [ $DTRAIN_ATTEMPT = 0 ]; then [ $RANK = 3 ] && exit 7; exec sleep 60; fi'");
    int codes[3];
    wait_job(&j, codes, 60);
    for (int k = 0; k < 3; k++)
        DT_CHECK_INT(codes[k], 0);
    char want[64];
    for (int k = 0; k < 3; k++) {
        char *o = dt_test_slurp(j.out[k]);
        DT_REQUIRE(o != NULL);
        for (int r = 2 * k; r < 2 * k + 2; r++) {
            snprintf(want, sizeof want, "[%d]:attempt=1 rank=%d\n", r, r);
            DT_CHECK_CONTAINS(o, want);
        }
        DT_CHECK_CONTAINS(o, "restarting every worker on every node (restart 1 of");
        DT_CHECK_CONTAINS(o, "all workers succeeded on every node");
        free(o);
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/logs/r3/events.jsonl", TMP);
    char *ev = dt_test_slurp(path);
    DT_REQUIRE(ev != NULL);
    DT_CHECK_CONTAINS(ev, "\"event\":\"restart\",\"attempt\":1");
    free(ev);
    snprintf(path, sizeof path, "%s/logs/r3/events_node1.jsonl", TMP);
    ev = dt_test_slurp(path);
    DT_REQUIRE(ev != NULL);
    DT_CHECK_CONTAINS(ev, "\"event\":\"failure\"");
    free(ev);
    if (codes[0] || codes[1] || codes[2])
        dt_test_group_dump(&j);
}

/* The budget is the job's: a rank on node 1 always fails; both nodes stop after one restart and
 * both print the same root cause. */
static void test_budget_is_job_wide(void)
{
    job j;
    char opts[1024];
    /* Node 1 is given a larger budget: node 0's is the job's. */
    snprintf(opts, sizeof opts, "%s --rdzv-id bw --nproc-per-node 1", fast);
    char line[8192];
    dt_test_group_init(&j);
    const char *cmd = "sh -c '[ $GROUP_RANK = 1 ] && exit 3; exec sleep 60'";
    snprintf(j.out[0], sizeof j.out[0], "%s/node0.out", TMP);
    snprintf(j.out[1], sizeof j.out[1], "%s/node1.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 --max-restarts 1 "
             "--log-dir %s/logs %s -- %s",
             BIN, TMP, opts, cmd);
    dt_test_group_spawn(&j, 0, line, j.out[0]);
    j.port = dt_test_read_port(j.out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr 127.0.0.1 --master-port %d --max-restarts 5 "
             "--log-dir %s/logs %s -- %s",
             BIN, j.port, TMP, opts, cmd);
    dt_test_group_spawn(&j, 1, line, j.out[1]);
    int codes[2];
    wait_job(&j, codes, 60);
    DT_CHECK_INT(codes[0], 1);
    DT_CHECK_INT(codes[1], 1);
    for (int k = 0; k < 2; k++) {
        char *o = dt_test_slurp(j.out[k]);
        DT_REQUIRE(o != NULL);
        DT_CHECK_CONTAINS(o, "the job failed: rank 1 on ");
        DT_CHECK_CONTAINS(o, "(attempt 1; --max-restarts=1 spent)");
        DT_CHECK_CONTAINS(o, "rank       : 1 (local_rank 0)");
        DT_CHECK_CONTAINS(o, "(node 1)");
        if (k == 1) /* told once, not every round */
            DT_CHECK_INT(dt_test_count_text(j.out[1], "but node 0 has --max-restarts=1"), 1);
        free(o);
    }
    if (codes[0] != 1 || codes[1] != 1)
        dt_test_group_dump(&j);
}

/* A SIGKILLed agent (node 1): its workers die with it, the others notice the silence, stop and
 * end the job with node 1 as the cause. */
static void test_sigkill_agent_detected(void)
{
    job j;
    char opts[1024];
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=20,"
             "close_timeout=5 --stop-grace 5 --rdzv-id kl --nproc-per-node 1");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s/w.$RANK; exec sleep 60'", TMP);
    start_job(&j, 3, opts, cmd);
    char path[4096];
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s/w.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    dt_sleep_ms(50);
    snprintf(path, sizeof path, "%s/w.1", TMP);
    char *s = dt_test_slurp(path);
    int w1 = s ? atoi(s) : 0;
    free(s);
    DT_REQUIRE(w1 > 1);
    kill(j.pid[1], SIGKILL);
    int codes[3];
    wait_job(&j, codes, 40);
    DT_CHECK_INT(codes[0], 1);
    DT_CHECK_INT(codes[1], 128 + SIGKILL);
    DT_CHECK_INT(codes[2], 1);
    double deadline = dt_test_now() + 5;
    while (!dt_test_pid_gone(w1) && dt_test_now() < deadline)
        dt_sleep_ms(20);
    DT_CHECK_MSG(dt_test_pid_gone(w1), "node 1's worker outlived its agent");
    for (int k = 0; k < 3; k += 2) {
        char *o = dt_test_slurp(j.out[k]);
        DT_REQUIRE(o != NULL);
        DT_CHECK_CONTAINS(o, "node 1 (");
        DT_CHECK_CONTAINS(o, "sent no heartbeat");
        DT_CHECK_CONTAINS(o, "the job failed: node 1");
        free(o);
    }
    if (codes[0] != 1 || codes[2] != 1)
        dt_test_group_dump(&j);
}

/* A node lost with budget left: the others try to restart, the lost node never comes back, and
 * the failed rendezvous ends the job with the table of what ended the attempt before it. */
static void test_lost_node_then_join_timeout(void)
{
    job j;
    char opts[1024], cmd[1024], path[4096];
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=2,"
             "close_timeout=5 --stop-grace 5 --rdzv-id lj --nproc-per-node 1 --max-restarts 2");
    snprintf(cmd, sizeof cmd, "sh -c 'touch %s/ready.$RANK; exec sleep 60'", TMP);
    start_job(&j, 2, opts, cmd);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    kill(j.pid[1], SIGKILL);
    int codes[2];
    wait_job(&j, codes, 40);
    DT_CHECK_INT(codes[0], 1);
    char *o = dt_test_slurp(j.out[0]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "restarting every worker on every node (restart 1 of");
    DT_CHECK_CONTAINS(o, "node(s) 1 did not join round 1");
    DT_CHECK_CONTAINS(o, "what ended attempt 0:");
    DT_CHECK_CONTAINS(o, "sent no heartbeat");
    free(o);
    if (codes[0] != 1)
        dt_test_group_dump(&j);
}

/* The store host (node 0) SIGKILLed: the other node loses the store, stops its workers and
 * exits 1; nothing of node 0 survives. */
static void test_store_host_killed(void)
{
    job j;
    char opts[1024], cmd[1024], path[4096];
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20,"
             "close_timeout=5 --stop-grace 5 --rdzv-id hk --nproc-per-node 1 --max-restarts 2");
    snprintf(cmd, sizeof cmd, "sh -c 'echo $$ > %s/w.$RANK; exec sleep 60'", TMP);
    start_job(&j, 2, opts, cmd);
    int w[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/w.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        dt_sleep_ms(20);
        char *s = dt_test_slurp(path);
        w[r] = s ? atoi(s) : 0;
        free(s);
        DT_REQUIRE(w[r] > 1);
    }
    kill(j.pid[0], SIGKILL);
    int codes[2];
    wait_job(&j, codes, 40);
    DT_CHECK_INT(codes[0], 128 + SIGKILL);
    DT_CHECK_INT(codes[1], 1);
    double deadline = dt_test_now() + 5;
    while ((!dt_test_pid_gone(w[0]) || !dt_test_pid_gone(w[1])) && dt_test_now() < deadline)
        dt_sleep_ms(20);
    DT_CHECK(dt_test_pid_gone(w[0]));
    DT_CHECK(dt_test_pid_gone(w[1]));
    char *o = dt_test_slurp(j.out[1]);
    DT_CHECK(o && strstr(o, "lost the rendezvous"));
    free(o);
    if (codes[1] != 1)
        dt_test_group_dump(&j);
}

/* SIGTERM to one agent ends the job everywhere with 128+15. */
static void test_sigterm_one_agent_ends_all(void)
{
    job j;
    char opts[1024], cmd[1024], path[4096];
    snprintf(opts, sizeof opts, "%s --rdzv-id st --nproc-per-node 1 --max-restarts 3", fast);
    snprintf(cmd, sizeof cmd, "sh -c 'touch %s/ready.$RANK; exec sleep 60'", TMP);
    start_job(&j, 2, opts, cmd);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    kill(j.pid[1], SIGTERM);
    int codes[2];
    wait_job(&j, codes, 40);
    DT_CHECK_INT(codes[0], 128 + SIGTERM);
    DT_CHECK_INT(codes[1], 128 + SIGTERM);
    char *o = dt_test_slurp(j.out[0]);
    DT_CHECK(o && strstr(o, "stopped by signal 15"));
    DT_CHECK(o && !strstr(o, "restarting"));
    free(o);
    if (codes[0] != 128 + SIGTERM)
        dt_test_group_dump(&j);
}

/* A `dtrain store` already listening on the endpoint is used by every node, node 0 included. */
static void test_external_store(void)
{
    char outp[4096], line[8192];
    snprintf(outp, sizeof outp, "%s/store.out", TMP);
    snprintf(line, sizeof line, "%s store --host 0.0.0.0 --port 0", BIN);
    pid_t store = dt_test_spawn(line, outp);
    int port = dt_test_read_port(outp, "listening on 0.0.0.0:", 20);
    job j;
    dt_test_group_init(&j);
    for (int k = 0; k < 2; k++) {
        snprintf(j.out[k], sizeof j.out[k], "%s/node%d.out", TMP, k);
        snprintf(line, sizeof line,
                 "%s --nnodes 2 --node-rank %d --rdzv-endpoint 127.0.0.1:%d --rdzv-id ext "
                 "--log-dir %s/logs %s -- sh -c 'echo store=$DTRAIN_STORE_PORT rank=$RANK'",
                 BIN, k, port, TMP, fast);
        dt_test_group_spawn(&j, k, line, j.out[k]);
    }
    int codes[2];
    wait_job(&j, codes, 30);
    kill(store, SIGTERM);
    DT_CHECK_INT(dt_test_wait_exit(store, 10), 0);
    DT_CHECK_INT(codes[0], 0);
    DT_CHECK_INT(codes[1], 0);
    char *o = dt_test_slurp(j.out[0]);
    char want[128];
    snprintf(want, sizeof want, "[0]:store=%d rank=0", port);
    DT_CHECK(o && strstr(o, want));
    DT_CHECK(o && strstr(o, "external"));
    free(o);
    o = dt_test_slurp(j.out[1]);
    snprintf(want, sizeof want, "[1]:store=%d rank=1", port);
    DT_CHECK(o && strstr(o, want));
    free(o);
    if (codes[0] || codes[1])
        dt_test_group_dump(&j);
}

/* Nodes that do not come: the rendezvous ends with a clear message after join_timeout. */
static void test_join_timeout(void)
{
    char *out = NULL, cmd[4096];
    snprintf(cmd, sizeof cmd,
             "%s --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port 0 "
             "--rdzv-conf join_timeout=1 --log-dir %s -- true",
             BIN, TMP);
    int rc = dt_test_run(cmd, &out, 30);
    DT_CHECK_INT(rc, 1);
    DT_CHECK_CONTAINS(out, "node(s) 1 did not join round 0 within the join timeout");
    free(out);
}

static void test_bad_node_rank(void)
{
    char *out = NULL, cmd[4096];
    snprintf(cmd, sizeof cmd, "%s --nnodes 2 --node-rank 2 -- true", BIN);
    int rc = dt_test_run(cmd, &out, 30);
    DT_CHECK_INT(rc, 2);
    DT_CHECK_CONTAINS(out, "--node-rank=2: must be 0..1");
    free(out);
}

/* The exit code of a node that ended on a setup error: 2, as a usage error. */
static bool setup_error_code(int code) { return code == 2; }

/* Every node ended promptly with a message that names both --nnodes values. */
static void check_nnodes_mismatch(job *j, const int *codes, int a, int b)
{
    char want_a[32], want_b[32];
    snprintf(want_a, sizeof want_a, "--nnodes=%d", a);
    snprintf(want_b, sizeof want_b, "--nnodes=%d", b);
    bool ok = true;
    for (int k = 0; k < j->n; k++) {
        DT_CHECK(setup_error_code(codes[k]));
        char *o = dt_test_slurp(j->out[k]);
        bool named = o && strstr(o, "disagree on the number of nodes") && strstr(o, want_a) &&
                     strstr(o, want_b);
        DT_CHECK(named);
        ok = ok && named && setup_error_code(codes[k]);
        free(o);
    }
    if (!ok)
        dt_test_group_dump(j);
}

/* Node 0 says --nnodes 2, node 1 --nnodes 3: both end at once (not at the join or heartbeat
 * timeout) with a setup error naming both values. */
static void test_nnodes_mismatch(void)
{
    job j;
    char opts[1024];
    dt_test_group_init(&j);
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=60,join_timeout=60,"
             "close_timeout=10 --stop-grace 5 --monitor-interval 0.05 --rdzv-id nnm");
    spawn_node(&j, 0, 2, opts, "sleep 60");
    j.port = dt_test_read_port(j.out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
    spawn_node(&j, 1, 3, opts, "sleep 60");
    int codes[2];
    wait_job(&j, codes, 40 * dt_test_timeout_scale());
    check_nnodes_mismatch(&j, codes, 2, 3);
}

/* Nodes 0 and 1 run a 2-node job; a node 2 started with --nnodes 3 joins their round: it does
 * not form a 3-node world of its own, and the running job ends with the setup error. */
static void test_nnodes_mismatch_late(void)
{
    job j;
    char opts[1024], cmd[1024], path[4096];
    dt_test_group_init(&j);
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=60,join_timeout=60,"
             "close_timeout=10 --stop-grace 5 --monitor-interval 0.05 --rdzv-id nnl");
    snprintf(cmd, sizeof cmd, "sh -c 'touch %s/ready.$RANK; exec sleep 60'", TMP);
    spawn_node(&j, 0, 2, opts, cmd);
    j.port = dt_test_read_port(j.out[0], "hosting the rendezvous store at 127.0.0.1:", 20);
    spawn_node(&j, 1, 2, opts, cmd);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        double deadline = dt_test_now() + 20 * dt_test_timeout_scale();
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    spawn_node(&j, 2, 3, opts, cmd);
    int codes[3];
    wait_job(&j, codes, 40 * dt_test_timeout_scale());
    check_nnodes_mismatch(&j, codes, 2, 3);
    snprintf(path, sizeof path, "%s/ready.2", TMP);
    DT_CHECK(access(path, F_OK) != 0); /* node 2 never ran a worker */
}

/* Issue 21 #4: node 1's agent SIGKILLed, and node 0's worker fails at once (as a collective with
 * the dead node would): the round ends by that failure before anyone declares node 1 lost, so
 * node 1 stays a member whose "left" node 0 waits for at the end. A node whose heartbeat is gone
 * confirms nothing: node 0 ends within about heartbeat_timeout (2 s), not close_timeout (40 s). */
static void test_dead_node_not_awaited_at_close(void)
{
    job j;
    char opts[1024], cmd[1024], path[4096];
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=2,join_timeout=20,"
             "close_timeout=40 --stop-grace 5 --rdzv-id dn --nproc-per-node 1 --monitor-interval 0.05");
    snprintf(cmd, sizeof cmd,
             "sh -c 'touch %s/ready.$RANK; if [ $RANK = 0 ]; then "
             "while [ ! -e %s/dead ]; do sleep 0.02; done; exit 3; fi; exec sleep 60'",
             TMP, TMP);
    start_job(&j, 2, opts, cmd);
    for (int r = 0; r < 2; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    double t0 = dt_test_now();
    kill(j.pid[1], SIGKILL);
    snprintf(path, sizeof path, "%s/dead", TMP);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
    DT_REQUIRE(fd >= 0);
    close(fd);
    int codes[2];
    wait_job(&j, codes, 60);
    double took = dt_test_now() - t0;
    printf("node 0 ended %.1f s after node 1's agent was killed (heartbeat_timeout 2 s, "
           "close_timeout 40 s)\n", took);
    DT_CHECK_INT(codes[0], 1);
    DT_CHECK_INT(codes[1], 128 + SIGKILL);
    DT_CHECK_MSG(took < 20, "node 0 waited %.1f s for a dead node to confirm the end", took);
    char *o = dt_test_slurp(j.out[0]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "the job failed");
    free(o);
    if (codes[0] != 1 || took >= 20)
        dt_test_group_dump(&j);
}

/* Issue 21 #9: a --master-addr that does not resolve is said at once (not after join_timeout),
 * retried with a line every few seconds, and the final message's count and time are those of
 * the whole wait. Nothing listens anywhere: the name never resolves (.invalid, RFC 6761). */
static void test_unresolvable_master_addr(void)
{
    char line[4096], out[1024];
    snprintf(out, sizeof out, "%s/node1.out", TMP);
    snprintf(line, sizeof line,
             "%s --nnodes 2 --node-rank 1 --master-addr no-such-host.invalid --master-port 29500 "
             "--rdzv-conf join_timeout=12 --log-dir %s/logs -- true",
             BIN, TMP);
    pid_t pid = dt_test_spawn(line, out);
    bool told = dt_test_wait_text(out, "cannot resolve", 1, 5);
    bool again = dt_test_wait_text(out, "still waiting for the rendezvous store", 1, 10);
    int code = dt_test_wait_exit(pid, 40);
    DT_CHECK_MSG(told, "an address that does not resolve was not reported within 5 s");
    DT_CHECK_MSG(again, "no line while waiting for the store");
    DT_CHECK_INT(code, 1);
    char *o = dt_test_slurp(out);
    DT_REQUIRE(o != NULL);
    const char *m = strstr(o, "attempts over ");
    double secs = m ? atof(m + strlen("attempts over ")) : 0;
    int attempts = 0;
    if (m) {
        const char *q = m;
        while (q > o && q[-1] == ' ')
            q--;
        while (q > o && q[-1] >= '0' && q[-1] <= '9')
            q--;
        attempts = atoi(q);
    }
    DT_CHECK_MSG(m && secs >= 11 && secs < 20 && attempts >= 5,
                 "the final message's counts disagree with the wait (12 s): %s",
                 m ? m : "(no \"attempts over\")");
    DT_CHECK_CONTAINS(o, "join_timeout 12 s");
    if (!told || !again || code != 1 || !m)
        fprintf(stderr, "%s", o);
    free(o);
}

/* SIGTERM reaches node 0's agent only (Slurm signals nodes one at a time; here the others never
 * get it): node 0's workers checkpoint and exit 75, and node 1's, stopped "with the other
 * ranks", exit 75 before node 1's agent has seen node 0's abort. Node 1's agent must take that
 * for the job's preemption, as node 0 does (exit 75 on both), not for a failure (it used to end
 * 143 after "rank 1 exited with code 75": found under real Slurm, test_cluster_sched). */
static void preempted_elsewhere(int signalled)
{
    job j;
    char opts[1024], cmd[2048], path[4096];
    snprintf(opts, sizeof opts,
             "--rdzv-conf heartbeat_interval=0.2,heartbeat_timeout=10,join_timeout=20 "
             "--monitor-interval 1 --rdzv-id pe --nproc-per-node 2 --max-restarts 3");
    /* the signalled node's workers exit 75 on SIGTERM (a checkpoint); the others exit 75 once
     * they have (the collective stop of the built-in worker), local rank 1 a little later, so
     * that its agent sees a 75 while a worker still runs */
    snprintf(cmd, sizeof cmd,
             "sh -c 'touch %s/ready.$RANK; if [ $GROUP_RANK = %d ]; then trap \"touch %s/stop; "
             "exit 75\" TERM; while :; do sleep 0.05; done; else while [ ! -e %s/stop ]; do "
             "sleep 0.01; done; [ $LOCAL_RANK = 1 ] && sleep 0.5; exit 75; fi'",
             TMP, signalled, TMP, TMP);
    start_job(&j, 2, opts, cmd);
    for (int r = 0; r < 4; r++) {
        snprintf(path, sizeof path, "%s/ready.%d", TMP, r);
        double deadline = dt_test_now() + 20;
        while (access(path, F_OK) != 0 && dt_test_now() < deadline)
            dt_sleep_ms(10);
        DT_REQUIRE(access(path, F_OK) == 0);
    }
    kill(j.pid[signalled], SIGTERM);
    int codes[2];
    wait_job(&j, codes, 40);
    DT_CHECK_INT(codes[0], 75);
    DT_CHECK_INT(codes[1], 75);
    DT_CHECK(dt_test_count_text(j.out[1 - signalled], "preempted: workers saved their checkpoints "
                                                      "(after SIGTERM)") == 1);
    if (codes[0] != 75 || codes[1] != 75)
        dt_test_group_dump(&j);
}

static void test_preempted_elsewhere(void) { preempted_elsewhere(0); }
static void test_preempted_elsewhere_host(void) { preempted_elsewhere(1); }

/* ---- the store host waits for every node to see the end (rendezvous API, in process) ---- */

typedef struct node {
    dt_rdzv *rz;
    dt_rdzv_round rd;
    int rc;
    dt_err err;
    double closed_s; /* how long dt_rdzv_close took */
} node;

static void *node_next(void *arg)
{
    node *n = arg;
    dt_rdzv_status st;
    n->rc = dt_rdzv_next(n->rz, &n->rd, &st, &n->err);
    return NULL;
}

static void *node_close(void *arg)
{
    node *n = arg;
    double t0 = dt_test_now();
    dt_rdzv_close(n->rz);
    n->closed_s = dt_test_now() - t0;
    return NULL;
}

/* Node 1 sees the end and leaves at once; node 2 is slow to look (a host whose agent lags).
 * The store's host (node 0) must wait for node 2 too: its first look found only node 1 gone,
 * and it used to take node 2 for gone as well (a stale key of the list it shrank) and close the
 * store under it, so node 2's agent failed after the others succeeded (found by dtrain-ssh.sh
 * on the simulated cluster, test_cluster_sched). */
static void test_host_waits_for_slow_leaver(void)
{
    node n[3];
    memset(n, 0, sizeof n);
    int port = 0;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_free_port(&port, &e), &e);
    for (int k = 0; k < 3; k++) {
        dt_rdzv_opts o;
        memset(&o, 0, sizeof o);
        dt_strlcpy(o.backend, "static", sizeof o.backend);
        dt_strlcpy(o.nnodes, "3", sizeof o.nnodes);
        o.node_rank = k;
        dt_strlcpy(o.endpoint_host, "127.0.0.1", sizeof o.endpoint_host);
        o.endpoint_port = port;
        dt_strlcpy(o.run_id, "leave", sizeof o.run_id);
        o.local_world_size = 1;
        o.join_timeout = 20;
        o.close_timeout = 10;
        o.heartbeat_interval = 0.1;
        o.heartbeat_timeout = 5;
        DT_REQUIRE_OK(dt_rdzv_open(&n[k].rz, &o, &e), &e);
    }
    pthread_t th[3];
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(pthread_create(&th[k], NULL, node_next, &n[k]) == 0);
    for (int k = 0; k < 3; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE_OK(n[k].rc, &n[k].err);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE_OK(dt_rdzv_succeeded(n[k].rz, &e), &e);
    dt_rdzv_status st;
    DT_REQUIRE_OK(dt_rdzv_poll(n[1].rz, &st, &e), &e);
    DT_CHECK_INT(st.state, DT_RDZV_SUCCEEDED);
    dt_rdzv_close(n[1].rz); /* node 1 leaves */
    DT_REQUIRE(pthread_create(&th[0], NULL, node_close, &n[0]) == 0);
    dt_sleep_ms(600); /* node 0's first wait for the others times out meanwhile */
    int rc = dt_rdzv_poll(n[2].rz, &st, &e);
    DT_CHECK_MSG(rc == 0 && st.state == DT_RDZV_SUCCEEDED,
                 "the slow node could not see the end: %d (%s), state %d", rc, e.msg,
                 (int)st.state);
    dt_rdzv_close(n[2].rz);
    pthread_join(th[0], NULL);
    DT_CHECK_MSG(n[0].closed_s >= 0.5 && n[0].closed_s < 9,
                 "the store host closed after %.2f s (it must wait for node 2, not close_timeout)",
                 n[0].closed_s);
}

static const dt_test tests[] = {
    {"host_waits_for_slow_leaver", test_host_waits_for_slow_leaver, 60},
    {"preempted_elsewhere", test_preempted_elsewhere, 60},
    {"preempted_elsewhere_host", test_preempted_elsewhere_host, 60},
    {"two_nodes_env", test_two_nodes_env, 60},
    {"three_nodes_restart_all", test_three_nodes_restart_all, 90},
    {"budget_is_job_wide", test_budget_is_job_wide, 90},
    {"sigkill_agent_detected", test_sigkill_agent_detected, 90},
    {"lost_node_then_join_timeout", test_lost_node_then_join_timeout, 90},
    {"store_host_killed", test_store_host_killed, 90},
    {"dead_node_not_awaited_at_close", test_dead_node_not_awaited_at_close, 90},
    {"sigterm_one_agent_ends_all", test_sigterm_one_agent_ends_all, 90},
    {"external_store", test_external_store, 60},
    {"join_timeout", test_join_timeout, 60},
    {"unresolvable_master_addr", test_unresolvable_master_addr, 60},
    {"bad_node_rank", test_bad_node_rank, 0},
    {"nnodes_mismatch", test_nnodes_mismatch, 90},
    {"nnodes_mismatch_late", test_nnodes_mismatch_late, 90},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_agent_multi", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
