/* test_elastic.c - the c10d (elastic) rendezvous: several real agents (build/dtrain) on
 * 127.0.0.1 with trivial `sh -c` workers, and the rendezvous API with in-process agents.
 *
 * Covered: 2..4 agents started in random order at staggered times form one job; a late joiner
 * grows a running job (the workers see the new world size, the restart count stays 0); a
 * SIGKILLed agent shrinks it; a SIGSTOPped agent is declared lost and, once continued, notices
 * and rejoins through a new round without ever running in the round that went on without it;
 * fewer than MIN nodes wait, then fail with a clear error; a spare beyond MAX takes a slot that
 * frees; every agent (spares too) ends with the job's exit code; a second job with the same
 * endpoint and id starts clean (hosted store and external store), and so does one after a job
 * whose agents were all killed; survivors keep their order and their slots (a spare never
 * pushes one out); a node declared lost and continued is no survivor, and when the job ends
 * while it is frozen it still sees the end (exit 0); a dead spare does not hold up the store's
 * host at the end; SIGTERM to one agent ends the job with 128+15 everywhere. The built-in
 * trainer: a DDP job regroups; a global batch survives a lost node; a job with parallel.tensor
 * or parallel.pipeline = 2 that loses a node goes on with D re-derived from the new world, from
 * its checkpoint; one whose new world cannot hold T x P ends as a configuration error; a node
 * whose world T x P cannot use waits as a spare (and joins once a fourth node makes a usable
 * world, or takes a lost node's place); parallel.layout = auto plans again for the survivor.
 *
 * No fixed ports: an external `dtrain store --port 0` (or an agent with is_host=1 and port 0)
 * prints the port, which the agents are then given. Every wait is bounded; every worker writes
 * its pid, and each test checks that none outlived its agent.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>
#include <math.h>

#include "common/rng.h"
#include "common/util.h"
#include "rendezvous/rdzv.h"
#include "rendezvous/store.h"
#include "rendezvous/store_server.h"
#include "runtime/train/ckpt/safetensors.h"
#include "tests/harness.h"

#define BIN dt_test_dtrain_bin()
#define TMP dt_test_tmpdir()

/* Short timeouts; heartbeat_timeout is long where no loss is expected, so that a loaded machine
 * cannot fake one. */
#define CONF_CALM "heartbeat_interval=0.2,heartbeat_timeout=10,join_timeout=30,last_call_timeout=1,close_timeout=5"
#define CONF_LOSS "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=30,last_call_timeout=1,close_timeout=5"

/* ---- helpers ---------------------------------------------------------------------------- */

/* A job: an external store (or none) and its agents. */
typedef dt_test_group cluster;

/* Starts `dtrain store --port 0` and reads the port it prints. */
static void start_store(cluster *c)
{
    char outp[1024], line[2048];
    snprintf(outp, sizeof outp, "%s/c%d_store.out", TMP, c->id);
    snprintf(line, sizeof line, "%s store --host 127.0.0.1 --port 0", BIN);
    c->store = dt_test_spawn(line, outp);
    c->port = dt_test_read_port(outp, "listening on 127.0.0.1:", 20);
}

/* The worker: records its pid, prints what it got, then runs `then` (sh code). */
static void worker_cmd(char *buf, size_t cap, const char *then)
{
    snprintf(buf, cap,
             "sh -c 'echo $$ >> %s/pids; echo \"E node=$GROUP_RANK rank=$RANK world=$WORLD_SIZE "
             "groups=$GROUP_WORLD_SIZE att=$TORCHELASTIC_RESTART_COUNT round=$DTRAIN_ROUND\"; %s'",
             TMP, then);
}

/* Starts agent k: `extra` are more launcher options, `then` what its workers do. */
static void start_agent(cluster *c, int k, const char *id, const char *nnodes, int nproc,
                        const char *conf, const char *extra, const char *then)
{
    char line[8192], cmd[4096], out[1024];
    worker_cmd(cmd, sizeof cmd, then);
    snprintf(out, sizeof out, "%s/c%d_agent%d.out", TMP, c->id, k);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s --nnodes %s "
             "--nproc-per-node %d --rdzv-conf %s --monitor-interval 0.05 --stop-grace 3 "
             "--log-dir %s/logs %s -- %s",
             BIN, c->port, id, nnodes, nproc, conf, TMP, extra ? extra : "", cmd);
    dt_test_group_spawn(c, k, line, out);
}

/* Starts agent k as the store's host (is_host=1, port 0) and reads the port it picked. */
static void start_host_agent(cluster *c, int k, const char *id, const char *nnodes,
                             const char *conf, const char *extra, const char *then)
{
    char conf2[512];
    snprintf(conf2, sizeof conf2, "%s,is_host=1", conf);
    c->port = 0;
    start_agent(c, k, id, nnodes, 1, conf2, extra, then);
    c->port = dt_test_read_port(c->out[k], "hosting the rendezvous store at 127.0.0.1:", 20);
}

/* Every worker that ever started has exited (the agents are gone by now). */
static void check_no_orphans(void)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/pids", TMP);
    char *s = dt_test_slurp(path);
    double deadline = dt_test_now() + 10;
    for (char *p = s; p && *p;) {
        int pid = (int)strtol(p, &p, 10);
        if (pid > 1) {
            while (!dt_test_pid_gone(pid) && dt_test_now() < deadline)
                dt_sleep_ms(20);
            DT_CHECK_MSG(dt_test_pid_gone(pid), "worker pid %d outlived its agent", pid);
        }
        while (*p == '\n' || *p == ' ')
            p++;
    }
    free(s);
}

static void finish(cluster *c)
{
    dt_test_group_kill(c);
    check_no_orphans();
}

/* ---- tests: real agents ----------------------------------------------------------------- */

/* 2, 3 and 4 agents with 1..4 workers each, started in a random order at staggered times: one
 * round, contiguous ranks per node, one world size. The node counts: 2:2 (closes when the
 * second joins), 2:5 with 3 agents (MIN<MAX, never full: closes when the last call after the
 * second joiner ends, with all three in), 3:4 with 4 (MIN<MAX, closes when the fourth joins). */
static void test_random_order(void)
{
    dt_rng rng;
    dt_rng_seed(&rng, 20240505);
    for (int n = 2; n <= 4; n++) {
        cluster c;
        dt_test_group_init(&c);
        start_store(&c);
        uint64_t order[4];
        dt_rng_permutation(&rng, order, (size_t)n);
        char id[32], nn[16];
        snprintf(id, sizeof id, "rand%d", n);
        snprintf(nn, sizeof nn, "%s", n == 2 ? "2:2" : n == 3 ? "2:5" : "3:4");
        /* a last call that outlasts the staggered starts by far (agent starts are < 0.4 s
         * apart); it only runs out for 2:5 */
        const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=10,join_timeout=30,"
                           "last_call_timeout=4,close_timeout=5";
        int world = n * (n + 1) / 2; /* agent k runs k+1 workers */
        for (int i = 0; i < n; i++) {
            int k = (int)order[i];
            start_agent(&c, k, id, nn, k + 1, conf, NULL, "exit 0");
            dt_sleep_ms((int)dt_rng_below(&rng, 400));
        }
        dt_test_group_wait(&c, 40);
        for (int k = 0; k < n; k++) {
            DT_CHECK_INT(c.code[k], 0);
            /* k+1 workers, all in the one round, with contiguous ranks first..first+k */
            char want[128];
            snprintf(want, sizeof want, "world=%d groups=%d att=0 round=0", world, n);
            DT_CHECK_INT(dt_test_count_text(c.out[k], want), k + 1);
            DT_CHECK_INT(dt_test_count_text(c.out[k], "E node="), k + 1);
            int first = -1;
            for (int r = 0; r < world && first < 0; r++) {
                snprintf(want, sizeof want, "[%d]:E node=", r);
                if (dt_test_count_text(c.out[k], want))
                    first = r;
            }
            for (int r = first; r >= 0 && r <= first + k; r++) {
                snprintf(want, sizeof want, "[%d]:E node=", r);
                DT_CHECK_MSG(dt_test_count_text(c.out[k], want) == 1, "%d agents: agent %d lacks rank %d",
                             n, k, r);
            }
        }
        /* every rank of the world was started exactly once in all */
        for (int r = 0; r < world; r++) {
            int times = 0;
            char want[64];
            snprintf(want, sizeof want, "[%d]:E node=", r);
            for (int k = 0; k < n; k++)
                times += dt_test_count_text(c.out[k], want);
            DT_CHECK_MSG(times == 1, "%d agents: rank %d started %d times", n, r, times);
        }
        if (c.code[0] || c.code[n - 1])
            dt_test_group_dump(&c);
        finish(&c);
    }
}

/* Two agents run (2:3); a third arrives: every worker is stopped and started again with
 * WORLD_SIZE 3, restart count still 0. */
static void test_late_joiner_grows_job(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *then = "[ $WORLD_SIZE -lt 3 ] && exec sleep 60; exit 0";
    start_agent(&c, 0, "grow", "2:3", 1, CONF_CALM, NULL, then);
    start_agent(&c, 1, "grow", "2:3", 1, CONF_CALM, NULL, then);
    DT_REQUIRE(dt_test_wait_text(c.out[0], "world=2 groups=2 att=0 round=0", 1, 30));
    DT_REQUIRE(dt_test_wait_text(c.out[1], "world=2 groups=2 att=0 round=0", 1, 30));
    start_agent(&c, 2, "grow", "2:3", 1, CONF_CALM, NULL, then);
    dt_test_group_wait(&c, 40);
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=3 groups=3 att=0 round=1"), 1);
    }
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "joining the next round (restart count unchanged)"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "asking it to regroup"), 1);
    /* The newcomer is ranked after the nodes that were there. */
    DT_CHECK_INT(dt_test_count_text(c.out[2], "[2]:E node=2 rank=2 world=3"), 1);
    char path[1024];
    snprintf(path, sizeof path, "%s/logs/grow/events.jsonl", TMP);
    DT_CHECK(dt_test_count_text(path, "\"event\":\"regroup\"") >= 1);
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* The built-in trainer under an elastic job: two agents train mlp with DDP; a third arrives.
 * The regroup keeps the restart count (the attempt) but is a new round, so the new world's
 * communicator must not meet the previous round's bootstrap keys: it is namespaced by
 * DTRAIN_ROUND. The job resumes from its checkpoint as a world of 3 and finishes. */
static void test_ddp_job_regroups(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char line[8192], out[1024];
    for (int k = 0; k < 3; k++) {
        if (k == 2) { /* either of the first two may hold rank 0, which logs the steps */
            double deadline = dt_test_now() + 60;
            while (!dt_test_count_text(c.out[0], "step 100/") && !dt_test_count_text(c.out[1], "step 100/")) {
                DT_REQUIRE(dt_test_now() < deadline);
                dt_sleep_ms(20);
            }
        }
        snprintf(out, sizeof out, "%s/c%d_agent%d.out", TMP, c.id, k);
        snprintf(line, sizeof line,
                 "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id ddpgrow "
                 "--nnodes 2:3 --nproc-per-node 1 --rdzv-conf %s --monitor-interval 0.05 "
                 "--stop-grace 5 configs/mlp.ini job.output_dir=%s/run train.steps=1500 "
                 "train.batch_size=64 job.log_every=50 checkpoint.every=100 ddp.timeout=20 "
                 "train.eval_every=0",
                 BIN, c.port, CONF_CALM, TMP);
        dt_test_group_spawn(&c, k, line, out);
    }
    dt_test_group_wait(&c, 120);
    int done = 0, world3 = 0;
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 0);
        done += dt_test_count_text(c.out[k], "done after 1500 steps");
        world3 += dt_test_count_text(c.out[k], "(3 ranks)");
    }
    DT_CHECK_INT(done, 1);
    DT_CHECK_INT(world3, 1);
    DT_CHECK(dt_test_count_text(c.out[0], "joining the next round (restart count unchanged)") >= 1);
    /* without train.global_batch the step grows with the world, and every agent says so */
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "global batch: 128 samples per step over 2 ranks "
                                                   "(batch 64 x accum 1 x 2 ranks); set "
                                                   "train.global_batch to keep it fixed"), 1);
    for (int k = 0; k < 3; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "global batch: now 192 samples per step over 3 "
                                                   "ranks (was 2 ranks) (batch 64 x accum 1 x 3 "
                                                   "ranks)"), k < 2 ? 1 : 0);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "global batch: 192 samples per step over 3 ranks "
                                               "(batch 64"), 1);
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* Three agents run (2:3); one is SIGKILLed: the two others are told within the heartbeat
 * timeout and go on as a world of 2, restart count still 0. */
static void test_sigkill_shrinks_job(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *then = "[ $WORLD_SIZE -gt 2 ] && exec sleep 60; exit 0";
    for (int k = 0; k < 3; k++)
        start_agent(&c, k, "shrink", "2:3", 1, CONF_LOSS, NULL, then);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[1], SIGKILL);
    dt_test_group_wait(&c, 40);
    DT_CHECK_INT(c.code[1], 128 + SIGKILL);
    for (int k = 0; k < 3; k += 2) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=2 groups=2 att=0 round=1"), 1);
        DT_CHECK(dt_test_count_text(c.out[k], "was lost: no heartbeat") >= 1);
    }
    if (c.code[0] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* A SIGSTOPped agent is declared lost; the others go on without it (round 1, world 2). When it
 * is continued it finds its round over, stops its workers and comes back through a new round
 * (2, world 3): it never runs a worker in round 1. */
static void test_sigstop_agent_fenced(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *then = "[ $WORLD_SIZE -eq 3 ] && [ $DTRAIN_ROUND -gt 0 ] && exit 0; exec sleep 60";
    for (int k = 0; k < 3; k++)
        start_agent(&c, k, "frozen", "2:3", 1, CONF_LOSS, NULL, then);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[2], SIGSTOP);
    bool shrunk = dt_test_wait_text(c.out[0], "world=2 groups=2 att=0 round=1", 1, 30) &&
                  dt_test_wait_text(c.out[1], "world=2 groups=2 att=0 round=1", 1, 30);
    kill(c.pid[2], SIGCONT);
    DT_CHECK(shrunk);
    dt_test_group_wait(&c, 60);
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "att=0 round=2"), 1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=3 groups=3 att=0 round=2"), 1);
    }
    DT_CHECK_INT(dt_test_count_text(c.out[2], "round=1"), 0);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "this node was declared lost by the others"), 1);
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* One agent alone with --nnodes 2:3 waits join_timeout, then fails saying why. */
static void test_too_few_nodes_times_out(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    double t0 = dt_test_now();
    start_agent(&c, 0, "few", "2:3", 1,
                "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=3,last_call_timeout=1",
                NULL, "exit 0");
    dt_test_group_wait(&c, 30);
    double took = dt_test_now() - t0;
    DT_CHECK_INT(c.code[0], 1);
    DT_CHECK(took >= 2.9);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "round 0 did not form: 1 node(s) joined within the join "
                                      "timeout (3 s) and MIN is 2"),
                 1);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "E node="), 0);
    finish(&c);
}

/* Two agents (2:2); one dies: the survivor waits for a replacement until join_timeout, then
 * fails naming the lost node. */
static void test_below_min_after_loss_fails(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=4,"
                       "last_call_timeout=1,close_timeout=5";
    for (int k = 0; k < 2; k++)
        start_agent(&c, k, "below", "2:2", 1, conf, NULL, "exec sleep 60");
    for (int k = 0; k < 2; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=2 groups=2 att=0 round=0", 1, 30));
    kill(c.pid[1], SIGKILL);
    dt_test_group_wait(&c, 40);
    DT_CHECK_INT(c.code[0], 1);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "round 1 did not form"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "MIN is 2 (the last round ended: node "), 1);
    DT_CHECK(dt_test_count_text(c.out[0], "was lost: no heartbeat for") >= 2); /* the watch, the error */
    finish(&c);
}

/* Three agents with --nnodes 1:2: two run, the third waits as a spare; when one of the two is
 * killed the spare takes its slot. */
static void test_spare_takes_free_slot(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *then = "[ $WORLD_SIZE -eq 2 ] && [ $DTRAIN_ROUND -gt 0 ] && exit 0; exec sleep 60";
    start_agent(&c, 0, "spare", "1:2", 1, CONF_LOSS, NULL, then);
    start_agent(&c, 1, "spare", "1:2", 1, CONF_LOSS, NULL, then);
    DT_REQUIRE(dt_test_wait_text(c.out[0], "world=2 groups=2 att=0 round=0", 1, 30));
    DT_REQUIRE(dt_test_wait_text(c.out[1], "world=2 groups=2 att=0 round=0", 1, 30));
    start_agent(&c, 2, "spare", "1:2", 1, CONF_LOSS, NULL, then);
    DT_REQUIRE(dt_test_wait_text(c.out[2], "waiting as a spare", 1, 30));
    DT_CHECK_INT(dt_test_count_text(c.out[2], "E node="), 0);
    kill(c.pid[1], SIGKILL);
    dt_test_group_wait(&c, 40);
    DT_CHECK_INT(c.code[0], 0);
    DT_CHECK_INT(c.code[1], 128 + SIGKILL);
    DT_CHECK_INT(c.code[2], 0);
    DT_CHECK(dt_test_count_text(c.out[2], "world=2 groups=2 att=0 round=") == 1);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "att=0 round=0"), 0);
    if (c.code[0] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* The job fails (budget 0) while a spare waits: all three agents exit 1, the spare saying why. */
static void test_same_exit_code_everywhere(void)
{
    cluster c;
    char then[1024];
    dt_test_group_init(&c);
    start_store(&c);
    snprintf(then, sizeof then,
             "[ $GROUP_RANK = 0 ] || exec sleep 60; while [ ! -e %s/go ]; do sleep 0.05; done; "
             "exit 3",
             TMP);
    start_agent(&c, 0, "code", "2:2", 1, CONF_CALM, "--max-restarts 0", then);
    start_agent(&c, 1, "code", "2:2", 1, CONF_CALM, "--max-restarts 0", then);
    DT_REQUIRE(dt_test_wait_text(c.out[0], "world=2 groups=2", 1, 30));
    DT_REQUIRE(dt_test_wait_text(c.out[1], "world=2 groups=2", 1, 30));
    start_agent(&c, 2, "code", "2:2", 1, CONF_CALM, "--max-restarts 0", then);
    DT_REQUIRE(dt_test_wait_text(c.out[2], "waiting as a spare", 1, 30));
    char path[1024];
    snprintf(path, sizeof path, "%s/go", TMP);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fclose(f);
    dt_test_group_wait(&c, 40);
    for (int k = 0; k < 3; k++)
        DT_CHECK_INT(c.code[k], 1);
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "the job failed: rank 0 on "), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "the job has ended: rank 0 on node 0 ("), 1);
    if (c.code[0] != 1 || c.code[1] != 1 || c.code[2] != 1)
        dt_test_group_dump(&c);
    finish(&c);
}

/* A job whose agent hosts the store (is_host=1, port 0), then a second job with the same
 * endpoint and id: it starts clean (round 0, attempt 0). Then the same on an external store
 * that outlives the jobs, after a first job that failed. */
static void test_second_job_starts_clean(void)
{
    cluster c;
    dt_test_group_init(&c);
    /* 1. hosted by agent 0 */
    start_host_agent(&c, 0, "again", "2:2", CONF_CALM, NULL, "exit 0");
    start_agent(&c, 1, "again", "2:2", 1, CONF_CALM, NULL, "exit 0");
    dt_test_group_wait(&c, 30);
    DT_CHECK_INT(c.code[0], 0);
    DT_CHECK_INT(c.code[1], 0);
    /* the same endpoint and id again: whoever binds the port first hosts */
    for (int k = 2; k < 4; k++)
        start_agent(&c, k, "again", "2:2", 1, CONF_CALM, NULL, "exit 0");
    dt_test_group_wait(&c, 30);
    for (int k = 2; k < 4; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=2 groups=2 att=0 round=0"), 1);
    }
    if (c.code[0] || c.code[1] || c.code[2] || c.code[3])
        dt_test_group_dump(&c);
    finish(&c);

    /* 2. an external store: job 1 fails, job 2 with the same id starts from round 0 */
    cluster d;
    dt_test_group_init(&d);
    start_store(&d);
    for (int k = 0; k < 2; k++)
        start_agent(&d, k, "reuse", "2:2", 1, CONF_CALM, "--max-restarts 0", "exit 5");
    dt_test_group_wait(&d, 30);
    DT_CHECK_INT(d.code[0], 1);
    DT_CHECK_INT(d.code[1], 1);
    for (int k = 2; k < 4; k++)
        start_agent(&d, k, "reuse", "2:2", 1, CONF_CALM, "--max-restarts 0", "exit 0");
    dt_test_group_wait(&d, 30);
    for (int k = 2; k < 4; k++) {
        DT_CHECK_INT(d.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(d.out[k], "world=2 groups=2 att=0 round=0"), 1);
    }
    if (d.code[2] || d.code[3])
        dt_test_group_dump(&d);
    finish(&d);
}

/* The agent that hosts the store dies: the others cannot go on, and say so (exit 1). */
static void test_store_host_dies(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_host_agent(&c, 0, "hostdies", "2:3", CONF_LOSS, NULL, "exec sleep 60");
    for (int k = 1; k < 3; k++)
        start_agent(&c, k, "hostdies", "2:3", 1, CONF_LOSS, NULL, "exec sleep 60");
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[0], SIGKILL);
    dt_test_group_wait(&c, 40);
    DT_CHECK_INT(c.code[0], 128 + SIGKILL);
    for (int k = 1; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "does not answer"), 1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "is gone, so the job cannot go on"), 1);
    }
    if (c.code[1] != 1 || c.code[2] != 1)
        dt_test_group_dump(&c);
    finish(&c);
}

/* Issue 21 #8: the store's host (agent 0) frozen past heartbeat_timeout: the others lose the
 * store and end (exit 1). Continued, the host finds its round over and nobody left: it ends at
 * once (exit 1, saying why) instead of waiting join_timeout (60 s here) for nobody. */
static void test_frozen_host_ends_at_once(void)
{
    cluster c;
    const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=60,"
                       "last_call_timeout=1,close_timeout=5";
    dt_test_group_init(&c);
    start_host_agent(&c, 0, "frozenhost", "2:3", conf, NULL, "exec sleep 90");
    for (int k = 1; k < 3; k++)
        start_agent(&c, k, "frozenhost", "2:3", 1, conf, NULL, "exec sleep 90");
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[0], SIGSTOP);
    bool others_gone = true;
    for (int k = 1; k < 3; k++)
        others_gone &= dt_test_wait_text(c.out[k], "is gone, so the job cannot go on", 1, 40);
    dt_sleep_ms(300); /* their connections are closed by now */
    double t0 = dt_test_now();
    kill(c.pid[0], SIGCONT);
    DT_CHECK(others_gone);
    dt_test_group_wait(&c, 90);
    double took = dt_test_now() - t0;
    printf("the host ended %.1f s after SIGCONT (join_timeout 60 s, stop-grace 3 s)\n", took);
    DT_CHECK_INT(c.code[0], 1);
    for (int k = 1; k < 3; k++)
        DT_CHECK_INT(c.code[k], 1);
    DT_CHECK_MSG(took < 20, "the host waited %.1f s for nobody", took);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "longer than heartbeat_timeout"), 1);
    if (c.code[0] != 1 || took >= 20)
        dt_test_group_dump(&c);
    finish(&c);
}

/* Creates TMP/<name> (a go signal for workers that wait for it). */
static void touch(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", TMP, name);
    FILE *f = fopen(path, "w");
    DT_REQUIRE(f != NULL);
    fclose(f);
}

/* An agent frozen past the heartbeat timeout is declared lost; the others go on and the job
 * succeeds while it is still frozen. Continued, it sees the end and exits 0 too: the store's
 * host (agent 0) waits for it, since it is alive again, rather than closing the store under
 * it (it was counted lost for good, and got a dead store: exit 1). */
static void test_lost_node_back_sees_success(void)
{
    cluster c;
    dt_test_group_init(&c);
    const char *then = "[ $DTRAIN_ROUND -ge 1 ] && exit 0; exec sleep 60";
    start_host_agent(&c, 0, "back", "1:3", CONF_LOSS, NULL, then);
    start_agent(&c, 1, "back", "1:3", 1, CONF_LOSS, NULL, then);
    /* The frozen one looks at its round only every 4 s once continued: the job is over by then. */
    start_agent(&c, 2, "back", "1:3", 1, CONF_LOSS, "--monitor-interval 4", then);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[2], SIGSTOP);
    bool shrunk = dt_test_wait_text(c.out[0], "world=2 groups=2 att=0 round=1", 1, 30);
    kill(c.pid[2], SIGCONT);
    DT_CHECK(shrunk);
    dt_test_group_wait(&c, 60);
    for (int k = 0; k < 3; k++)
        DT_CHECK_INT(c.code[k], 0);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "round=1"), 0);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "did not confirm the end of the job"), 0);
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* A spare that dies (SIGKILL) while it waits: at the end the store's host waits for it only
 * until it has been silent for heartbeat_timeout, not the whole close_timeout. */
static void test_dead_spare_not_waited_for(void)
{
    cluster c;
    char then[512];
    dt_test_group_init(&c);
    snprintf(then, sizeof then, "while [ ! -e %s/go ]; do sleep 0.05; done; exit 0", TMP);
    const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=30,"
                       "last_call_timeout=1,close_timeout=600";
    start_host_agent(&c, 0, "dspare", "1:2", conf, NULL, then);
    start_agent(&c, 1, "dspare", "1:2", 1, conf, NULL, then);
    for (int k = 0; k < 2; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=2 groups=2 att=0 round=0", 1, 30));
    start_agent(&c, 2, "dspare", "1:2", 1, conf, NULL, then);
    DT_REQUIRE(dt_test_wait_text(c.out[2], "waiting as a spare", 1, 30));
    kill(c.pid[2], SIGKILL);
    touch("go");
    dt_test_group_wait(&c, 60); /* well under close_timeout */
    DT_CHECK_INT(c.code[0], 0);
    DT_CHECK_INT(c.code[1], 0);
    DT_CHECK_INT(c.code[2], 128 + SIGKILL);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "did not confirm the end of the job"), 0);
    if (c.code[0] || c.code[1])
        dt_test_group_dump(&c);
    finish(&c);
}

/* A job on an external store whose agents were all SIGKILLed (so it never ended): a new job
 * with the same id finds it abandoned and starts fresh (round 0, attempt 0, its own budget)
 * instead of joining the dead one. */
static void test_abandoned_job_replaced(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    for (int k = 0; k < 2; k++)
        start_agent(&c, k, "aband", "2:2", 1, CONF_LOSS, "--max-restarts 0", "exec sleep 60");
    for (int k = 0; k < 2; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=2 groups=2 att=0 round=0", 1, 30));
    for (int k = 0; k < 2; k++)
        kill(c.pid[k], SIGKILL);
    dt_test_group_wait(&c, 20);
    /* The new job fails once (rank 1 of attempt 0) and succeeds on its restart: the budget is
     * its own (the dead job's was 0). */
    const char *then = "[ $GROUP_RANK = 1 ] && [ $TORCHELASTIC_RESTART_COUNT = 0 ] && exit 4; exit 0";
    for (int k = 2; k < 4; k++)
        start_agent(&c, k, "aband", "2:2", 1, CONF_LOSS, "--max-restarts 1", then);
    dt_test_group_wait(&c, 60);
    for (int k = 2; k < 4; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=2 groups=2 att=0 round=0"), 1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=2 groups=2 att=1 round=1"), 1);
    }
    DT_CHECK(dt_test_count_text(c.out[2], "was abandoned") + dt_test_count_text(c.out[3], "was abandoned") >= 1);
    if (c.code[2] || c.code[3])
        dt_test_group_dump(&c);
    finish(&c);
}

/* Two agents run (1:2) and a spare waits. A worker fails (budget 1): the two survivors get
 * their slots back in the restart (attempt 1), although the spare rejoins before them, and
 * the spare stays a spare; the job then succeeds everywhere. */
static void test_survivors_not_pushed_out(void)
{
    cluster c;
    char then[512];
    dt_test_group_init(&c);
    start_store(&c);
    snprintf(then, sizeof then,
             "[ $TORCHELASTIC_RESTART_COUNT -ge 1 ] && exit 0; [ $GROUP_RANK = 1 ] || exec sleep "
             "60; while [ ! -e %s/go ]; do sleep 0.05; done; exit 3",
             TMP);
    const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=10,join_timeout=30,"
                       "last_call_timeout=8,close_timeout=5";
    start_agent(&c, 0, "push", "1:2", 1, conf, "--max-restarts 1", then);
    start_agent(&c, 1, "push", "1:2", 1, conf, "--max-restarts 1", then);
    for (int k = 0; k < 2; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=2 groups=2 att=0 round=0", 1, 30));
    start_agent(&c, 2, "push", "1:2", 1, conf, "--max-restarts 1", then);
    DT_REQUIRE(dt_test_wait_text(c.out[2], "waiting as a spare", 1, 30));
    touch("go");
    dt_test_group_wait(&c, 60);
    for (int k = 0; k < 3; k++)
        DT_CHECK_INT(c.code[k], 0);
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=2 groups=2 att=1 round=1"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "E node="), 0);
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* A node declared lost is no survivor of its round: continued before the real survivors are
 * back, it must not complete their count and close the next round without one of them. Node
 * 1's workers take 5 s to stop, so the frozen node is back first; the round waits for node 1
 * (last call 15 s) and forms with all three (world 3), rather than with two (then a third
 * round to take node 1 back). */
static void test_lost_node_not_a_survivor(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    const char *conf = "heartbeat_interval=0.2,heartbeat_timeout=3,join_timeout=30,"
                       "last_call_timeout=15,close_timeout=5";
    const char *slow = "[ $DTRAIN_ROUND -ge 1 ] && exit 0; trap \"sleep 5; exit 0\" TERM; "
                       "sleep 60 & wait";
    const char *fast = "[ $DTRAIN_ROUND -ge 1 ] && exit 0; exec sleep 60";
    start_agent(&c, 0, "notsurv", "2:3", 1, conf, NULL, fast);
    start_agent(&c, 1, "notsurv", "2:3", 1, conf, "--stop-grace 10", slow);
    start_agent(&c, 2, "notsurv", "2:3", 1, conf, NULL, fast);
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[2], SIGSTOP);
    bool lost = dt_test_wait_text(c.out[0], "was lost: no heartbeat", 1, 30);
    kill(c.pid[2], SIGCONT);
    DT_REQUIRE(lost);
    dt_test_group_wait(&c, 60);
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "world=3 groups=3 att=0 round=1"), 1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "groups=2"), 0);
    }
    if (c.code[0] || c.code[1] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* SIGTERM to one agent of a running elastic job ends the job: every agent exits 128+15. */
static void test_sigterm_one_agent(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    for (int k = 0; k < 3; k++)
        start_agent(&c, k, "term", "2:3", 1, CONF_CALM, "--max-restarts 3", "exec sleep 60");
    for (int k = 0; k < 3; k++)
        DT_REQUIRE(dt_test_wait_text(c.out[k], "world=3 groups=3 att=0 round=0", 1, 30));
    kill(c.pid[1], SIGTERM);
    dt_test_group_wait(&c, 40);
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(c.code[k], 128 + SIGTERM);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "att=1"), 0);
    }
    DT_CHECK(dt_test_count_text(c.out[0], "stopped by signal 15") >= 1);
    if (c.code[0] != 128 + SIGTERM || c.code[2] != 128 + SIGTERM)
        dt_test_group_dump(&c);
    finish(&c);
}

/* ---- tests: the API with in-process agents ----------------------------------------------- */

typedef struct inproc {
    dt_rdzv *rz;
    dt_rdzv_round rd;
    int rc;
    dt_err err;
} inproc;

static void *next_thread(void *arg)
{
    inproc *a = arg;
    dt_rdzv_status st;
    a->rc = dt_rdzv_next(a->rz, &a->rd, &st, &a->err);
    return NULL;
}

static void open_inproc(inproc *a, int port, const char *nnodes)
{
    dt_rdzv_opts o;
    memset(&o, 0, sizeof o);
    memset(a, 0, sizeof *a);
    dt_strlcpy(o.backend, "c10d", sizeof o.backend);
    dt_strlcpy(o.nnodes, nnodes, sizeof o.nnodes);
    dt_strlcpy(o.endpoint_host, "127.0.0.1", sizeof o.endpoint_host);
    o.endpoint_port = port;
    dt_strlcpy(o.run_id, "api", sizeof o.run_id);
    o.local_world_size = 2;
    o.max_restarts = 1;
    o.join_timeout = 20;
    o.close_timeout = 2;
    o.heartbeat_interval = 0.1;
    o.heartbeat_timeout = 1.5;
    o.last_call_timeout = 0.5;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_rdzv_open(&a->rz, &o, &e), &e);
}

/* Runs dt_rdzv_next on the given agents at once. */
static void next_all(inproc **as, int n)
{
    pthread_t th[8];
    for (int i = 0; i < n; i++)
        DT_REQUIRE(pthread_create(&th[i], NULL, next_thread, as[i]) == 0);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < n; i++)
        DT_REQUIRE_OK(as[i]->rc, &as[i]->err);
}

/* Polls until the agent's round ends with `state` (bounded). */
static void poll_until(inproc *a, dt_rdzv_state state, double timeout_s)
{
    double deadline = dt_test_now() + timeout_s;
    dt_rdzv_status st;
    dt_err e = {0};
    for (;;) {
        DT_REQUIRE_OK(dt_rdzv_poll(a->rz, &st, &e), &e);
        if (st.state == state)
            return;
        if (st.state != DT_RDZV_RUNNING) {
            dt_test_fail_at(__FILE__, __LINE__, "round ended with state %d, not %d: %s",
                            (int)st.state, (int)state, st.why);
            dt_test_stop();
        }
        DT_REQUIRE(dt_test_now() < deadline);
        dt_sleep_ms(20);
    }
}

/* A store server in this process on 127.0.0.1 (default limits); *port gets its port. */
static dt_store_server *local_store(int *port)
{
    dt_store_server *srv = NULL;
    dt_store_server_opts so;
    dt_err e = {0};
    dt_store_server_opts_default(&so);
    so.host = "127.0.0.1";
    DT_REQUIRE_OK(dt_store_server_start(&srv, &so, &e), &e);
    *port = dt_store_server_port(srv);
    return srv;
}

/* Four agents (3:5 nodes): ranks 0..3, worlds of 8. Group rank 1 dies: the three others keep
 * their order (0, 2, 3 -> 0, 1, 2) and the restart count. A fifth agent then arrives: the round
 * regroups and it is ranked last. Then rank 0 dies: ranks close up again, and the new rank 0
 * provides a MASTER_PORT. Finally the job succeeds. */
static void test_api_survivors_keep_order(void)
{
    dt_err e = {0};
    int port;
    dt_store_server *srv = local_store(&port);
    static inproc a[5];
    inproc *all[5] = {&a[0], &a[1], &a[2], &a[3], &a[4]};
    for (int i = 0; i < 4; i++)
        open_inproc(&a[i], port, "3:5");
    /* 4 of at most 5: the round closes 0.5 s (last call) after the third joined. */
    next_all(all, 4);
    int by_rank[4] = {-1, -1, -1, -1};
    for (int i = 0; i < 4; i++) {
        DT_CHECK_INT(a[i].rd.group_world_size, 4);
        DT_CHECK_INT(a[i].rd.world_size, 8);
        DT_CHECK_INT(a[i].rd.rank_base, 2 * a[i].rd.group_rank);
        DT_CHECK(a[i].rd.elastic);
        by_rank[a[i].rd.group_rank] = i;
    }
    for (int g = 0; g < 4; g++)
        DT_REQUIRE(by_rank[g] >= 0);
    int victim = by_rank[1];
    dt_rdzv_kill(a[victim].rz);
    inproc *surv[4];
    int ns = 0;
    for (int g = 0; g < 4; g++)
        if (g != 1)
            surv[ns++] = &a[by_rank[g]];
    for (int i = 0; i < ns; i++)
        poll_until(surv[i], DT_RDZV_REGROUP, 15);
    next_all(surv, ns);
    for (int i = 0; i < ns; i++) {
        DT_CHECK_INT(surv[i]->rd.group_rank, i); /* old 0, 2, 3 -> 0, 1, 2 */
        DT_CHECK_INT(surv[i]->rd.group_world_size, 3);
        DT_CHECK_INT(surv[i]->rd.attempt, 0);
        DT_CHECK_INT(surv[i]->rd.round, 1);
    }
    /* A newcomer: the running round regroups and takes it in, last. */
    open_inproc(&a[4], port, "3:5");
    pthread_t th;
    DT_REQUIRE(pthread_create(&th, NULL, next_thread, &a[4]) == 0);
    for (int i = 0; i < ns; i++)
        poll_until(surv[i], DT_RDZV_REGROUP, 15);
    /* Let the newcomer's join of round 2 land first (white box: its record is r2/j/1), so that
     * the survivors, once all back, close round 2 with it rather than without it. */
    dt_store *st = NULL;
    void *job = NULL;
    size_t len = 0;
    DT_REQUIRE_OK(dt_store_connect(&st, "127.0.0.1", port, NULL, &e), &e);
    DT_REQUIRE_OK(dt_store_get(st, "dtrain/api/job", &job, &len, 5000, &e), &e);
    char key[128];
    snprintf(key, sizeof key, "dtrain/api/%s/r2/j/1", (char *)job);
    free(job);
    void *rec = NULL;
    DT_REQUIRE_OK(dt_store_get(st, key, &rec, &len, 10000, &e), &e);
    free(rec);
    dt_store_free(st);
    surv[ns] = &a[4];
    pthread_t ths[4];
    for (int i = 0; i < ns; i++)
        DT_REQUIRE(pthread_create(&ths[i], NULL, next_thread, surv[i]) == 0);
    for (int i = 0; i < ns; i++)
        pthread_join(ths[i], NULL);
    pthread_join(th, NULL);
    for (int i = 0; i <= ns; i++) {
        DT_REQUIRE_OK(surv[i]->rc, &surv[i]->err);
        DT_CHECK_INT(surv[i]->rd.group_rank, i);
        DT_CHECK_INT(surv[i]->rd.group_world_size, 4);
        DT_CHECK_INT(surv[i]->rd.attempt, 0);
    }
    /* Group rank 0 dies: the others keep their order, and the new rank 0 (which did not
     * expect to be it) still hands out a MASTER_PORT that everyone agrees on. */
    int mp_before = surv[0]->rd.master_port;
    DT_CHECK(mp_before > 0);
    dt_rdzv_kill(surv[0]->rz);
    inproc *rest[3] = {surv[1], surv[2], surv[3]};
    for (int i = 0; i < 3; i++)
        poll_until(rest[i], DT_RDZV_REGROUP, 15);
    /* The future rank 0 joins round 3 last, so that it did not offer a port (white box). */
    pthread_t tr[3];
    DT_REQUIRE(pthread_create(&tr[1], NULL, next_thread, rest[1]) == 0);
    DT_REQUIRE(pthread_create(&tr[2], NULL, next_thread, rest[2]) == 0);
    DT_REQUIRE_OK(dt_store_connect(&st, "127.0.0.1", port, NULL, &e), &e);
    DT_REQUIRE_OK(dt_store_get(st, "dtrain/api/job", &job, &len, 5000, &e), &e);
    snprintf(key, sizeof key, "dtrain/api/%s/r3/j/2", (char *)job);
    DT_REQUIRE_OK(dt_store_get(st, key, &rec, &len, 10000, &e), &e);
    free(rec);
    DT_REQUIRE(pthread_create(&tr[0], NULL, next_thread, rest[0]) == 0);
    for (int i = 0; i < 3; i++)
        pthread_join(tr[i], NULL);
    for (int i = 0; i < 3; i++)
        DT_REQUIRE_OK(rest[i]->rc, &rest[i]->err);
    /* rank 0 published its port after the round closed */
    snprintf(key, sizeof key, "dtrain/api/%s/r3/master_port", (char *)job);
    free(job);
    rec = NULL;
    DT_CHECK(dt_store_get(st, key, &rec, &len, 0, &e) == 0 && rec &&
             atoi(rec) == rest[0]->rd.master_port);
    free(rec);
    dt_store_free(st);
    for (int i = 0; i < 3; i++) {
        DT_CHECK_INT(rest[i]->rd.group_rank, i);
        DT_CHECK_INT(rest[i]->rd.group_world_size, 3);
        DT_CHECK(rest[i]->rd.master_port > 0);
        DT_CHECK_INT(rest[i]->rd.master_port, rest[0]->rd.master_port);
        DT_CHECK_INT(rest[i]->rd.attempt, 0);
    }
    /* Success: every one reports, the round ends SUCCEEDED for all. */
    for (int i = 0; i < 3; i++)
        DT_REQUIRE_OK(dt_rdzv_succeeded(rest[i]->rz, &e), &e);
    for (int i = 0; i < 3; i++)
        poll_until(rest[i], DT_RDZV_SUCCEEDED, 10);
    for (int i = 0; i < 5; i++)
        dt_rdzv_close(a[i].rz);
    dt_store_server_stop(srv);
}

/* ---- 35 of 40 nodes lost at once ---------------------------------------------------------- */

/* The agents of api_many_lost_at_once are processes (so that they can be frozen), each running
 * the rendezvous API; they report to the test over one pipe and take orders over their own. */
#define ML_N 40
#define ML_LOST_LO 1 /* group ranks ML_LOST_LO..ML_LOST_HI of round 0 are frozen */
#define ML_LOST_HI 35

enum { ML_FORMED = 1, ML_ENDED, ML_ERROR };

#define ML_REQUIRE_MSG(cond, ...)                                                                  \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            dt_test_fail_at(__FILE__, __LINE__, __VA_ARGS__);                                      \
            dt_test_stop();                                                                        \
        }                                                                                          \
    } while (0)

typedef struct ml_msg {
    int child, ev, round, g, n, attempt, state, declared;
    char msg[256];
} ml_msg; /* < PIPE_BUF: one write is atomic */

static void ml_send(int fd, int child, int ev, const dt_rdzv_round *rd, const dt_rdzv_status *st,
                    const char *msg)
{
    ml_msg m;
    memset(&m, 0, sizeof m);
    m.child = child;
    m.ev = ev;
    if (rd) {
        m.round = rd->round;
        m.g = rd->group_rank;
        m.n = rd->group_world_size;
        m.attempt = rd->attempt;
    }
    if (st) {
        m.state = (int)st->state;
        m.declared = strstr(st->why, "declared lost") != NULL;
    }
    dt_strlcpy(m.msg, msg ? msg : (st ? st->why : ""), sizeof m.msg);
    if (write(fd, &m, sizeof m) != (ssize_t)sizeof m)
        _exit(3);
}

/* One agent: gets the store's port, then: next (report FORMED), poll until the round ends
 * (report ENDED; 's' meanwhile reports success), wait for an order: 'n' next again, 'x' exit. */
static void ml_child(int k, int ctl, int res)
{
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    int port = 0;
    if (read(ctl, &port, sizeof port) != (ssize_t)sizeof port)
        _exit(1);
    dt_rdzv_opts o;
    memset(&o, 0, sizeof o);
    dt_strlcpy(o.backend, "c10d", sizeof o.backend);
    dt_strlcpy(o.nnodes, "5:40", sizeof o.nnodes);
    dt_strlcpy(o.endpoint_host, "127.0.0.1", sizeof o.endpoint_host);
    o.endpoint_port = port;
    dt_strlcpy(o.run_id, "lost", sizeof o.run_id);
    o.local_world_size = 1;
    o.max_restarts = 1;
    o.join_timeout = 60;
    o.close_timeout = 2;
    o.heartbeat_interval = 0.3;
    o.heartbeat_timeout = 8; /* long: a loaded machine must not fake a loss */
    o.last_call_timeout = 60; /* rounds close on MAX or on the survivors, never on the clock */
    dt_rdzv *rz = NULL;
    dt_err e = {0};
    if (dt_rdzv_open(&rz, &o, &e)) {
        ml_send(res, k, ML_ERROR, NULL, NULL, e.msg);
        _exit(2);
    }
    char cmd = 'n';
    while (cmd == 'n') {
        dt_rdzv_round rd;
        dt_rdzv_status st;
        if (dt_rdzv_next(rz, &rd, &st, &e)) {
            ml_send(res, k, ML_ERROR, NULL, NULL, e.msg);
            _exit(2);
        }
        ml_send(res, k, ML_FORMED, &rd, NULL, "");
        for (;;) {
            struct pollfd pf = {.fd = ctl, .events = POLLIN};
            if (poll(&pf, 1, 100) == 1) {
                if (read(ctl, &cmd, 1) != 1)
                    _exit(0);
                if (cmd == 's' && dt_rdzv_succeeded(rz, &e)) {
                    ml_send(res, k, ML_ERROR, NULL, NULL, e.msg);
                    _exit(2);
                }
            }
            if (dt_rdzv_poll(rz, &st, &e)) {
                ml_send(res, k, ML_ERROR, NULL, NULL, e.msg);
                _exit(2);
            }
            if (st.state != DT_RDZV_RUNNING)
                break;
        }
        ml_send(res, k, ML_ENDED, &rd, &st, NULL);
        if (read(ctl, &cmd, 1) != 1)
            cmd = 'x';
    }
    dt_rdzv_close(rz);
    _exit(0);
}

/* Reads the next message (bounded); an agent's error fails the test. */
static void ml_read(int fd, ml_msg *m, double deadline, const char *waiting_for)
{
    for (;;) {
        double left = deadline - dt_test_now();
        if (left <= 0) {
            dt_test_fail_at(__FILE__, __LINE__, "timed out waiting for %s", waiting_for);
            dt_test_stop();
        }
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        int r = poll(&pf, 1, (int)(left * 1000) + 1);
        if (r == 1)
            break;
        DT_REQUIRE(r == 0 || errno == EINTR);
    }
    DT_REQUIRE(read(fd, m, sizeof *m) == (ssize_t)sizeof *m);
    if (m->ev == ML_ERROR) {
        dt_test_fail_at(__FILE__, __LINE__, "agent %d failed (waiting for %s): %s", m->child,
                        waiting_for, m->msg);
        dt_test_stop();
    }
}

static void ml_order(int fd, char cmd)
{
    DT_REQUIRE(write(fd, &cmd, 1) == 1);
}

/* The value of counter key (0 when absent). */
static int64_t ml_counter(dt_store *st, const char *key)
{
    int64_t v = 0;
    dt_err e = {0};
    DT_REQUIRE_OK(dt_store_add(st, key, 0, &v, &e), &e);
    return v;
}

/* The lost set of an end record "<kind> <node> <sig> <expect> <lost>|<why>", read by the test
 * itself (items "g" or "lo-hi", as listed; -1 in in[] marks a malformed list). */
static int ml_parse_lost(const char *rec, bool *in, int n, int *expect)
{
    int node, sig, used = 0, count = 0;
    char kind[16];
    DT_REQUIRE(sscanf(rec, "%15s %d %d %d %n", kind, &node, &sig, expect, &used) == 4 && used);
    for (const char *p = rec + used; *p && *p != '|';) {
        char *q;
        long lo = strtol(p, &q, 10), hi = lo;
        if (q == p)
            return -1;
        if (*q == '-' && q[1] >= '0' && q[1] <= '9')
            hi = strtol(q + 1, &q, 10);
        for (long g = lo; g <= hi; g++) {
            if (g < 0 || g >= n)
                return -1;
            in[g] = true;
            count++;
        }
        p = *q == ',' ? q + 1 : q;
    }
    return count;
}

/* 40 nodes (5:40); group ranks 1..35 freeze at once (more than the 32 an end record used to
 * hold). Group rank 0 declares every one of the 35 lost in the one end record, the 5 survivors
 * regroup, and the 35 - once continued - are each told that they were declared lost and come
 * back as newcomers: none counts as a survivor, so round 1 waits for the last real survivor
 * (it does not close early on a lost node's count, which would make that survivor end it again)
 * and forms with all 40, survivors first in their old order, in one regroup. */
static void test_api_many_lost_at_once(void)
{
    int res[2], ctl[ML_N];
    pid_t pid[ML_N];
    DT_REQUIRE(pipe(res) == 0);
    for (int k = 0; k < ML_N; k++) {
        int p[2];
        DT_REQUIRE(pipe(p) == 0);
        pid[k] = fork();
        DT_REQUIRE(pid[k] >= 0);
        if (pid[k] == 0) {
            close(res[0]);
            close(p[1]);
            for (int j = 0; j < k; j++)
                close(ctl[j]);
            ml_child(k, p[0], res[1]);
        }
        close(p[0]);
        ctl[k] = p[1];
    }
    close(res[1]);
    dt_err e = {0};
    int port;
    dt_store_server *srv = local_store(&port);
    for (int k = 0; k < ML_N; k++)
        DT_REQUIRE(write(ctl[k], &port, sizeof port) == (ssize_t)sizeof port);

    /* Round 0: all 40 (it closes when the 40th joins). */
    int by_g[ML_N], g0[ML_N];
    for (int g = 0; g < ML_N; g++)
        by_g[g] = -1;
    ml_msg m;
    double deadline = dt_test_now() + 90;
    for (int i = 0; i < ML_N; i++) {
        ml_read(res[0], &m, deadline, "round 0 to form");
        DT_REQUIRE(m.ev == ML_FORMED && m.round == 0 && m.n == ML_N);
        DT_REQUIRE(m.g >= 0 && m.g < ML_N && by_g[m.g] < 0);
        by_g[m.g] = m.child;
        g0[m.child] = m.g;
    }
    /* A rack goes down: group ranks 1..35 stop at once. */
    for (int g = ML_LOST_LO; g <= ML_LOST_HI; g++)
        DT_REQUIRE(kill(pid[by_g[g]], SIGSTOP) == 0);
    deadline = dt_test_now() + 60;
    for (int i = 0; i < ML_N - (ML_LOST_HI - ML_LOST_LO + 1); i++) {
        ml_read(res[0], &m, deadline, "the survivors to see the loss");
        DT_REQUIRE(m.ev == ML_ENDED);
        DT_CHECK_INT(m.state, DT_RDZV_REGROUP);
        DT_CHECK_MSG(!m.declared, "survivor %d (group rank %d) was declared lost: %s", m.child,
                     g0[m.child], m.msg);
        DT_CHECK(g0[m.child] < ML_LOST_LO || g0[m.child] > ML_LOST_HI);
    }
    /* The end record: every one of the 35, nobody else; 5 go on. */
    dt_store *st = NULL;
    void *job = NULL, *rec = NULL;
    size_t len = 0;
    char key[200];
    DT_REQUIRE_OK(dt_store_connect(&st, "127.0.0.1", port, NULL, &e), &e);
    DT_REQUIRE_OK(dt_store_get(st, "dtrain/lost/job", &job, &len, 5000, &e), &e);
    char J[64];
    snprintf(J, sizeof J, "%.*s", (int)len, (char *)job);
    free(job);
    snprintf(key, sizeof key, "dtrain/lost/%s/r0/end", J);
    DT_REQUIRE_OK(dt_store_get(st, key, &rec, &len, 0, &e), &e);
    char *end = strndup(rec, len);
    free(rec);
    bool in[ML_N] = {false};
    int expect = -1, nl = ml_parse_lost(end, in, ML_N, &expect);
    DT_CHECK_MSG(nl == ML_LOST_HI - ML_LOST_LO + 1, "%d lost listed in \"%s\"", nl, end);
    for (int g = 0; g < ML_N; g++)
        DT_CHECK_MSG(in[g] == (g >= ML_LOST_LO && g <= ML_LOST_HI), "group rank %d %s in \"%s\"",
                     g, in[g] ? "listed" : "not listed", end);
    DT_CHECK_INT(expect, ML_N - (ML_LOST_HI - ML_LOST_LO + 1));
    free(end);
    /* The 35 come back: each is told it was declared lost. */
    for (int g = ML_LOST_LO; g <= ML_LOST_HI; g++)
        DT_REQUIRE(kill(pid[by_g[g]], SIGCONT) == 0);
    deadline = dt_test_now() + 60;
    for (int i = ML_LOST_LO; i <= ML_LOST_HI; i++) {
        ml_read(res[0], &m, deadline, "the lost nodes to see the end");
        DT_REQUIRE(m.ev == ML_ENDED);
        DT_CHECK_INT(m.state, DT_RDZV_REGROUP);
        DT_CHECK_MSG(m.declared, "group rank %d was not told it was declared lost: %s",
                     g0[m.child], m.msg);
    }
    /* Four survivors rejoin (group ranks 0, 36, 37, 38); the last one (39) is held back. */
    char surv[200], cnt[200], closed[200];
    snprintf(surv, sizeof surv, "dtrain/lost/%s/r1/surv", J);
    snprintf(cnt, sizeof cnt, "dtrain/lost/%s/r1/count", J);
    snprintf(closed, sizeof closed, "dtrain/lost/%s/r1/closed", J);
    ml_order(ctl[by_g[0]], 'n');
    for (int g = ML_LOST_HI + 1; g < ML_N - 1; g++)
        ml_order(ctl[by_g[g]], 'n');
    deadline = dt_test_now() + 30;
    while (ml_counter(st, surv) < 4) {
        ML_REQUIRE_MSG(dt_test_now() < deadline, "4 survivors did not rejoin");
        dt_sleep_ms(50);
    }
    /* The 35 rejoin too, as newcomers: they must not complete the survivors' count. */
    for (int g = ML_LOST_LO; g <= ML_LOST_HI; g++)
        ml_order(ctl[by_g[g]], 'n');
    const char *ck = closed;
    int exists = 0;
    deadline = dt_test_now() + 30;
    for (;;) {
        DT_REQUIRE_OK(dt_store_check(st, &ck, 1, &exists, &e), &e);
        if (exists || ml_counter(st, cnt) >= ML_N - 1)
            break;
        ML_REQUIRE_MSG(dt_test_now() < deadline, "the lost nodes did not rejoin");
        dt_sleep_ms(50);
    }
    ML_REQUIRE_MSG(!exists, "round 1 closed before its last survivor came back: a node declared "
                            "lost was counted as a survivor (survivors in: %lld)",
                   (long long)ml_counter(st, surv));
    DT_CHECK_INT(ml_counter(st, surv), 4);
    /* The last survivor: round 1 forms with everyone, in one regroup. */
    ml_order(ctl[by_g[ML_N - 1]], 'n');
    deadline = dt_test_now() + 60;
    for (int i = 0; i < ML_N; i++) {
        ml_read(res[0], &m, deadline, "round 1 to form");
        DT_REQUIRE(m.ev == ML_FORMED);
        DT_CHECK_INT(m.round, 1);
        DT_CHECK_INT(m.n, ML_N);
        DT_CHECK_INT(m.attempt, 0);
        int old = g0[m.child];
        if (old == 0)
            DT_CHECK_INT(m.g, 0);
        else if (old > ML_LOST_HI)
            DT_CHECK_INT(m.g, old - ML_LOST_HI); /* 36..39 -> 1..4: survivors first, in order */
        else
            DT_CHECK_MSG(m.g > ML_N - 1 - ML_LOST_HI, "lost node (was %d) ranked %d, among the "
                                                       "survivors",
                         old, m.g);
    }
    dt_store_free(st);
    /* Success everywhere, then every agent exits. */
    for (int k = 0; k < ML_N; k++)
        ml_order(ctl[k], 's');
    deadline = dt_test_now() + 60;
    for (int i = 0; i < ML_N; i++) {
        ml_read(res[0], &m, deadline, "the job to succeed");
        DT_REQUIRE(m.ev == ML_ENDED);
        DT_CHECK_INT(m.state, DT_RDZV_SUCCEEDED);
    }
    for (int k = 0; k < ML_N; k++) {
        ml_order(ctl[k], 'x');
        close(ctl[k]);
    }
    for (int k = 0; k < ML_N; k++)
        DT_CHECK_INT(dt_test_wait_exit(pid[k], 30), 0);
    close(res[0]);
    dt_store_server_stop(srv);
}

/* A damaged end record (lost list "1,,2") is an error with a message from poll, not a crash or a
 * shorter set. */
static void test_api_damaged_end_record(void)
{
    dt_err e = {0};
    int port;
    dt_store_server *srv = local_store(&port);
    static inproc a[2];
    inproc *all[2] = {&a[0], &a[1]};
    for (int i = 0; i < 2; i++)
        open_inproc(&a[i], port, "2:2");
    next_all(all, 2);
    dt_store *st = NULL;
    void *job = NULL;
    size_t len = 0;
    char key[200];
    DT_REQUIRE_OK(dt_store_connect(&st, "127.0.0.1", port, NULL, &e), &e);
    DT_REQUIRE_OK(dt_store_get(st, "dtrain/api/job", &job, &len, 5000, &e), &e);
    snprintf(key, sizeof key, "dtrain/api/%.*s/r0/end", (int)len, (char *)job);
    free(job);
    const char *bad = "regroup 0 0 1 1,,2|a damaged record";
    DT_REQUIRE_OK(dt_store_set(st, key, bad, strlen(bad), &e), &e);
    dt_store_free(st);
    dt_rdzv_status s;
    dt_err pe = {0};
    int rc = dt_rdzv_poll(a[1].rz, &s, &pe);
    DT_CHECK_INT(rc, -EBADMSG);
    DT_CHECK_CONTAINS(pe.msg, "lost nodes");
    DT_CHECK_CONTAINS(pe.msg, "1,,2");
    for (int i = 0; i < 2; i++)
        dt_rdzv_kill(a[i].rz);
    for (int i = 0; i < 2; i++)
        dt_rdzv_close(a[i].rz);
    dt_store_server_stop(srv);
}

/* ---- a global batch across a membership change ---------------------------------------------- */

/* The built-in trainer's job for the global-batch tests: mlp, G = 24 of batch 8 (3 ranks: one
 * micro-step of 8 each; 2 ranks: 8 then 4 each), a checkpoint every 25 steps. */
#define GB_STEPS 300
#define GB_JOB                                                                                     \
    "configs/mlp.ini job.device=cpu model.hidden=64,64 data.synthetic_samples=4096 "             \
    "train.batch_size=8 train.global_batch=24 train.warmup_steps=10 job.log_every=1 "            \
    "checkpoint.every=25 checkpoint.keep=100 ddp.timeout=20 train.eval_every=0"

static void gb_agent(cluster *c, int k, const char *id, const char *nnodes, const char *outdir)
{
    char line[8192], out[1024];
    snprintf(out, sizeof out, "%s/c%d_agent%d.out", TMP, c->id, k);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s --nnodes %s "
             "--nproc-per-node 1 --rdzv-conf %s --monitor-interval 0.05 --stop-grace 5 "
             "--max-restarts 3 %s train.steps=%d job.output_dir=%s",
             BIN, c->port, id, nnodes, CONF_LOSS, GB_JOB, GB_STEPS, outdir);
    dt_test_group_spawn(c, k, line, out);
}

/* metrics.jsonl's train losses by step (the last record of a step: after a resume, the steps
 * trained again are the new world's). */
static void gb_losses(const char *outdir, double *loss, int cap)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", outdir);
    char *text = dt_test_slurp(path);
    DT_REQUIRE(text);
    for (int k = 0; k < cap; k++)
        loss[k] = NAN;
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        if (!o)
            continue; /* a line cut by a SIGKILL */
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        int step = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step"));
        if (type && !strcmp(type, "train") && step > 0 && step < cap)
            loss[step] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss"));
        cJSON_Delete(o);
    }
    free(text);
}

/* The step of the last "resumed from ...: step N" in an agent's output (-1: none). */
static int gb_resumed_step(const char *path)
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

/* The acceptance: a 3-node elastic job (c10d, the built-in trainer, train.global_batch
 * = 24) loses a node (SIGKILL of an agent that does not hold rank 0) and goes on as 2 nodes
 * with the same G from its last checkpoint; the agents say the global batch is kept. A 2-node
 * job resumed from that same checkpoint with the same G then has the same losses after the
 * change (1e-5 relative) and the same final weights. */
static void test_global_batch_survives_lost_node(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024];
    snprintf(run, sizeof run, "%s/gb-run", TMP);
    for (int k = 0; k < 3; k++)
        gb_agent(&c, k, "gbshrink", "2:3", run);
    /* rank 0 (which logs the steps) is on one of them; the victim is another, once the job is
     * past two checkpoints */
    int host0 = -1;
    double deadline = dt_test_now() + 60 * dt_test_timeout_scale();
    while (host0 < 0) {
        for (int k = 0; k < 3 && host0 < 0; k++)
            if (dt_test_count_text(c.out[k], "[0]:") && dt_test_count_text(c.out[k], "step 60/"))
                host0 = k;
        if (host0 < 0 && dt_test_now() > deadline) {
            dt_test_group_dump(&c);
            DT_REQUIRE(!"the 3-node job did not reach step 60");
        }
        dt_sleep_ms(20);
    }
    int victim = (host0 + 1) % 3;
    kill(c.pid[victim], SIGKILL);
    dt_test_group_wait(&c, 150);
    int said = 0, resumed = -1;
    for (int k = 0; k < 3; k++) {
        if (k == victim)
            continue;
        DT_CHECK_INT(c.code[k], 0);
        said += dt_test_count_text(c.out[k],
                                   "global batch: 24 samples per step over 2 ranks (was 3 ranks), "
                                   "kept by train.global_batch: 2 micro-steps of up to 8 samples "
                                   "per rank");
        DT_CHECK_INT(dt_test_count_text(c.out[k], "global batch: 24 samples per step over 3 ranks, "
                                                   "kept by train.global_batch: 1 micro-step of "
                                                   "up to 8 samples per rank"), 1);
        int r = gb_resumed_step(c.out[k]);
        if (r > resumed)
            resumed = r;
    }
    DT_CHECK_INT(said, 2);
    DT_CHECK_MSG(resumed >= 50 && resumed < GB_STEPS && resumed % 25 == 0,
                 "the 2-node world resumed at step %d", resumed);
    int done = 0;
    for (int k = 0; k < 3; k++)
        done += dt_test_count_text(c.out[k], "done after 300 steps");
    DT_CHECK_INT(done, 1);
    if (c.code[(victim + 1) % 3] || c.code[(victim + 2) % 3] || resumed < 0) {
        dt_test_group_dump(&c);
        finish(&c);
        return;
    }
    finish(&c);

    /* The references: 2 nodes, and 3 nodes, from that same checkpoint (only that one) with the
     * same G. The 3-node one shows that G was kept: without it 2 nodes would train on 16
     * samples a step and 3 on 24. */
    static double a[GB_STEPS + 1], b[GB_STEPS + 1];
    gb_losses(run, a, GB_STEPS + 1);
    for (int nodes = 2; nodes <= 3; nodes++) {
        char ref[1024], cmd[4096], id[32], nn[8], *out = NULL;
        snprintf(ref, sizeof ref, "%s/gb-ref%d", TMP, nodes);
        snprintf(id, sizeof id, "gbref%d", nodes);
        snprintf(nn, sizeof nn, "%d:%d", nodes, nodes);
        snprintf(cmd, sizeof cmd,
                 "mkdir -p '%s/checkpoints' && cp -r '%s/checkpoints/step_%d' '%s/checkpoints/'",
                 ref, run, resumed, ref);
        DT_REQUIRE(dt_test_run(cmd, &out, 30) == 0);
        free(out);
        cluster r;
        dt_test_group_init(&r);
        start_store(&r);
        for (int k = 0; k < nodes; k++)
            gb_agent(&r, k, id, nn, ref);
        dt_test_group_wait(&r, 150);
        int ref_resumed = -1;
        for (int k = 0; k < nodes; k++) {
            DT_CHECK_INT(r.code[k], 0);
            int s = gb_resumed_step(r.out[k]);
            if (s > ref_resumed)
                ref_resumed = s;
        }
        DT_CHECK_INT(ref_resumed, resumed);
        bool bad = false;
        for (int k = 0; k < nodes; k++)
            bad |= r.code[k] != 0;
        if (bad)
            dt_test_group_dump(&r);
        finish(&r);
        if (bad)
            return;
        gb_losses(ref, b, GB_STEPS + 1);
        double worst = 0;
        for (int k = resumed + 1; k <= GB_STEPS; k++) {
            DT_CHECK_MSG(isfinite(a[k]) && isfinite(b[k]), "step %d: no loss (%g, %g)", k, a[k],
                         b[k]);
            double d = fabs(a[k] - b[k]) / fabs(b[k]);
            DT_CHECK_MSG(d <= 1e-5, "step %d: the elastic job's loss %.9g, the %d-node job's %.9g",
                         k, a[k], nodes, b[k]);
            if (d > worst)
                worst = d;
        }
        fprintf(stderr, "    | steps %d-%d after the change vs %d nodes from the same "
                        "checkpoint: losses within %.2g relative\n",
                resumed + 1, GB_STEPS, nodes, worst);
        /* and the weights at the end */
        dt_st_file *fa = NULL, *fb = NULL;
        dt_err err = {0};
        char pa[1100], pb[1100];
        snprintf(pa, sizeof pa, "%s/checkpoints/step_%d/model.safetensors", run, GB_STEPS);
        snprintf(pb, sizeof pb, "%s/checkpoints/step_%d/model.safetensors", ref, GB_STEPS);
        DT_REQUIRE_OK(dt_st_open(pa, true, &fa, &err), &err);
        DT_REQUIRE_OK(dt_st_open(pb, true, &fb, &err), &err);
        double wworst = 0;
        for (int i = 0; i < fa->num_tensors; i++) {
            const dt_st_tensor *ta = &fa->tensors[i], *tb = dt_st_find(fb, ta->name);
            DT_REQUIRE(tb && tb->end - tb->begin == ta->end - ta->begin && ta->dtype == DT_ST_F32);
            const float *x = ta->data, *y = tb->data;
            double d2 = 0, n2 = 0;
            for (size_t k = 0; k < (ta->end - ta->begin) / 4; k++) {
                d2 += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
                n2 += (double)y[k] * y[k];
            }
            double rr = n2 > 0 ? sqrt(d2 / n2) : sqrt(d2);
            DT_CHECK_MSG(rr <= 1e-5, "%s vs %d nodes: %.3g relative", ta->name, nodes, rr);
            wworst = fmax(wworst, rr);
        }
        fprintf(stderr, "    | weights at step %d vs %d nodes: within %.2g relative\n", GB_STEPS,
                nodes, wworst);
        dt_st_free(fa);
        dt_st_free(fb);
        /* every step was G samples: the run's count says so */
        snprintf(cmd, sizeof cmd, "%s/checkpoints/step_%d/state.json", ref, GB_STEPS);
        char *st = dt_test_slurp(cmd);
        DT_CHECK_CONTAINS(st, "\"samples_seen\":\t7200,");
        free(st);
    }
    char path[1100];
    snprintf(path, sizeof path, "%s/checkpoints/step_%d/state.json", run, GB_STEPS);
    char *st = dt_test_slurp(path);
    DT_CHECK_CONTAINS(st, "\"samples_seen\":\t7200,"); /* 300 steps x 24 */
    free(st);
}

/* ---- tensor and pipeline parallelism across a membership change ----------------------------- */

/* A tiny gpt on the GPL text (configs/quickstart.ini made smaller): a step is a few ms, so the
 * job is past a checkpoint within a second. train.global_batch = 8 keeps the step's samples
 * whatever D is (D = 2: one micro-step of 4 per data-parallel rank; D = 1: two), and a constant
 * learning rate after the warm-up: the steps a job trains again after a resume in another layout
 * see the same samples, the same weights and the same learning rate as before the change, so
 * their losses are the same numbers (to rounding: the sums run in another order). Checkpoints
 * are written before the next step (checkpoint.async = false): in the background, on a loaded
 * machine, a save can end 50 steps later, right before the next one, which leaves a victim
 * killed "after step 50 is saved" no step past the checkpoint it resumes from. */
#define LAY_STEPS 600
#define LAY_EVERY 50 /* checkpoint.every: the victim dies once the first is saved, at step >= 60 */
#define LAY_JOB                                                                                    \
    "configs/quickstart.ini job.device=cpu job.cpu_bind=none model.n_layer=2 model.n_head=4 "    \
    "model.n_embd=16 model.block_size=16 data.seq_len=16 train.batch_size=4 "                    \
    "train.global_batch=8 train.schedule=constant train.lr=3e-3 train.warmup_steps=20 "         \
    "job.log_every=1 checkpoint.keep=100 "                                                       \
    "checkpoint.async=false train.eval_every=0 ddp.timeout=20"

/* Agent k of a LAY_JOB on --nnodes `nnodes` (MIN:MAX) with nproc workers. */
static void lay_agent_n(cluster *c, int k, const char *id, const char *nnodes, int nproc,
                        const char *outdir, const char *parallel, const char *conf)
{
    char line[8192], out[1024];
    snprintf(out, sizeof out, "%s/c%d_agent%d.out", TMP, c->id, k);
    snprintf(line, sizeof line,
             "%s --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:%d --rdzv-id %s --nnodes %s "
             "--nproc-per-node %d --rdzv-conf %s --monitor-interval 0.05 --stop-grace 5 "
             "--max-restarts 3 --log-dir %s/logs %s train.steps=%d checkpoint.every=%d "
             "job.output_dir=%s %s",
             BIN, c->port, id, nnodes, nproc, conf, TMP, LAY_JOB, LAY_STEPS, LAY_EVERY, outdir,
             parallel);
    dt_test_group_spawn(c, k, line, out);
}

static void lay_agent(cluster *c, int k, const char *id, int nproc, const char *outdir,
                      const char *parallel, const char *conf)
{
    lay_agent_n(c, k, id, "1:2", nproc, outdir, parallel, conf);
}

/* The agent whose output holds rank 0's "step N/" line (rank 0 logs the steps, and writes
 * metrics.jsonl before it) and, unless NULL, `also` (a line of rank 0's: its checkpoint writer
 * says "saved" once the checkpoint is complete), waiting for them up to timeout_s; -1 when none
 * does by then. */
static int lay_rank0_at(cluster *c, int n, int step, const char *also, double timeout_s)
{
    char want[32];
    snprintf(want, sizeof want, "step %d/", step);
    double deadline = dt_test_now() + timeout_s * dt_test_timeout_scale();
    for (;;) {
        for (int k = 0; k < n; k++)
            if (dt_test_count_text(c->out[k], "[0]:") && dt_test_count_text(c->out[k], want) &&
                (!also || dt_test_count_text(c->out[k], also)))
                return k;
        if (dt_test_now() > deadline)
            return -1;
        dt_sleep_ms(20);
    }
}

/* Every worker an agent's output names ("[R]:dtrain[HOST:PID rR]") is gone within 10 s: a
 * SIGKILLed agent's workers do not outlive it. Returns how many it named (distinct pids). */
static int lay_workers_gone(const char *path)
{
    char *text = dt_test_slurp(path);
    long seen[16];
    int n = 0;
    double deadline = dt_test_now() + 10;
    for (char *p = text; p && (p = strstr(p, "]:dtrain[")); p++) {
        char *colon = strchr(p + 9, ':'), *end = NULL;
        if (!colon)
            break;
        long pid = strtol(colon + 1, &end, 10);
        if (pid <= 1 || strncmp(end, " r", 2))
            continue;
        int i = 0;
        while (i < n && seen[i] != pid)
            i++;
        if (i < n)
            continue;
        DT_REQUIRE(n < (int)DT_ARRAY_LEN(seen));
        seen[n++] = pid;
        while (!dt_test_pid_gone((pid_t)pid) && dt_test_now() < deadline)
            dt_sleep_ms(20);
        DT_CHECK_MSG(dt_test_pid_gone((pid_t)pid), "worker pid %ld outlived its SIGKILLed agent",
                     pid);
    }
    free(text);
    return n;
}

/* metrics.jsonl read as layouts: the layout records in order, and after each one the train
 * losses by step until the next (seg[i][step], NaN where none); first[i] and last[i] the
 * lowest and highest step of segment i (0: none). */
#define LAY_SEGS 4
typedef struct {
    int n;
    int world[LAY_SEGS], dp[LAY_SEGS], tp[LAY_SEGS], pp[LAY_SEGS], attempt[LAY_SEGS];
    int first[LAY_SEGS], last[LAY_SEGS], gaps[LAY_SEGS];
    double seg[LAY_SEGS][LAY_STEPS + 1];
} lay_metrics;

static void lay_read(const char *outdir, lay_metrics *m)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", outdir);
    char *text = dt_test_slurp(path);
    DT_REQUIRE(text);
    memset(m, 0, sizeof *m);
    for (int i = 0; i < LAY_SEGS; i++)
        for (int k = 0; k <= LAY_STEPS; k++)
            m->seg[i][k] = NAN;
    char *save = NULL;
    for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        cJSON *o = cJSON_Parse(l);
        if (!o)
            continue; /* a line cut by a SIGKILL */
        const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(o, "type"));
        int i = m->n - 1;
        if (type && !strcmp(type, "layout") && m->n < LAY_SEGS) {
            i = m->n++;
            m->world[i] = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "world_size"));
            m->dp[i] = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "dp"));
            m->tp[i] = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "tp"));
            m->pp[i] = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "pp"));
            m->attempt[i] = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "attempt"));
        } else if (type && !strcmp(type, "train") && i >= 0) {
            int step = (int)cJSON_GetNumberValue(cJSON_GetObjectItem(o, "step"));
            if (step > 0 && step <= LAY_STEPS) {
                if (m->last[i] && step != m->last[i] + 1)
                    m->gaps[i]++;
                if (!m->first[i])
                    m->first[i] = step;
                m->last[i] = step;
                m->seg[i][step] = cJSON_GetNumberValue(cJSON_GetObjectItem(o, "loss"));
            }
        }
        cJSON_Delete(o);
    }
    free(text);
}

/* The run's metrics.jsonl after one change of layout, D0 x T x P then D1 x T x P (attempt
 * restarted: a later attempt, else the same one, the restart count unchanged by a regroup): the
 * old layout trained from step 1 to at least `resumed`, the new one from resumed + 1 to the end,
 * each step once; the steps both trained have the same losses; the loss before the change is
 * not the loss of a fresh model, and the end is below it. Then the last checkpoint's count of
 * samples: every step had the global batch. Returns how many steps both layouts trained. */
static int lay_check_run(const char *run, int resumed, int D0, int D1, int T, int P,
                         bool restarted)
{
    int same = 0;
    lay_metrics *m = calloc(1, sizeof *m);
    DT_REQUIRE(m);
    lay_read(run, m);
    DT_CHECK_INT(m->n, 2);
    if (m->n == 2 && resumed > 20) {
        DT_CHECK_MSG(m->world[0] == D0 * T * P && m->dp[0] == D0 && m->tp[0] == T &&
                         m->pp[0] == P,
                     "first layout: world %d, dp %d, tp %d, pp %d", m->world[0], m->dp[0],
                     m->tp[0], m->pp[0]);
        DT_CHECK_MSG(m->world[1] == D1 * T * P && m->dp[1] == D1 && m->tp[1] == T &&
                         m->pp[1] == P,
                     "second layout: world %d, dp %d, tp %d, pp %d", m->world[1], m->dp[1],
                     m->tp[1], m->pp[1]);
        if (restarted)
            DT_CHECK(m->attempt[1] > m->attempt[0]);
        else
            DT_CHECK_INT(m->attempt[1], m->attempt[0]);
        DT_CHECK_INT(m->first[0], 1);
        DT_CHECK(m->last[0] >= resumed);
        DT_CHECK_INT(m->gaps[0], 0);
        DT_CHECK_INT(m->first[1], resumed + 1);
        DT_CHECK_INT(m->last[1], LAY_STEPS);
        DT_CHECK_INT(m->gaps[1], 0);
        double worst = 0;
        for (int s = resumed + 1; s <= m->last[0] && s <= LAY_STEPS; s++) {
            double a = m->seg[0][s], b = m->seg[1][s];
            double d = fabs(a - b) / fabs(a);
            DT_CHECK_MSG(isfinite(a) && isfinite(b) && d <= 1e-4,
                         "step %d: loss %.9g in the old layout, %.9g in the new", s, a, b);
            worst = fmax(worst, d);
            same++;
        }
        if (same)
            fprintf(stderr, "    | resumed at step %d; steps %d-%d trained in both layouts: "
                            "losses within %.2g relative\n",
                    resumed, resumed + 1, resumed + same, worst);
        else
            fprintf(stderr, "    | resumed at step %d, where the old layout stopped\n", resumed);
        /* the 20 steps before the change and after it, and the last 20: after it the loss goes
         * on falling (or stays) from where it was, far below a fresh model's. It falls by 0.1
         * over 150 steps or more; a change that came late (a loaded machine: the second node
         * joined at step 426 of 600 once) leaves fewer, and then the end is only below the
         * loss before the change */
        double before = 0, after = 0, end = 0;
        for (int k = 0; k < 20; k++) {
            before += m->seg[0][resumed - k] / 20;
            after += m->seg[1][resumed + 1 + k] / 20;
            end += m->seg[1][LAY_STEPS - k] / 20;
        }
        double fall = LAY_STEPS - resumed >= 150 ? 0.1 : 0;
        DT_CHECK_MSG(after < m->seg[0][1] - 1 && after < before + 0.15 && end < before - fall,
                     "mean losses: %.4f before the change, %.4f after it, %.4f at the end (step "
                     "1: %.4f)",
                     before, after, end, m->seg[0][1]);
    }
    free(m);
    char path[1100];
    snprintf(path, sizeof path, "%s/checkpoints/step_%d/state.json", run, LAY_STEPS);
    char *st = dt_test_slurp(path);
    DT_CHECK_CONTAINS(st, "\"samples_seen\":\t4800,"); /* 600 steps x 8 */
    free(st);
    return same;
}

/* Issue 19's elastic promise, end to end: a job on 2 nodes of T x P workers (D = 2)
 * loses a node (its agent SIGKILLed some steps past a saved checkpoint) and goes on alone as
 * D = 1 with the same T and P, from its last checkpoint, to the end. Its workers log the new
 * layout and metrics.jsonl records one layout per attempt; the steps after the checkpoint that
 * the old layout had trained already come out with the same losses, the first one trained anew
 * is the checkpoint's next (no restart from step 0), every step is recorded once after the
 * change, and the last checkpoint counts every step's 8 samples. kill_host0: the victim is the
 * node of rank 0 (the checkpoint writer, the first pipeline stage), else the other one. */
static void lay_shrinks(const char *name, int T, int P, const char *parallel, bool kill_host0,
                        const char *summary)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    /* the run id names the jobs' shared-memory segments: unique on this host */
    char run[1024], id[64], saved[1100];
    snprintf(run, sizeof run, "%s/%s", TMP, name);
    snprintf(id, sizeof id, "%s-%d", name, (int)getpid());
    for (int k = 0; k < 2; k++)
        lay_agent(&c, k, id, T * P, run, parallel, CONF_LOSS);
    /* killed before the first checkpoint is complete, the job would rightly start over: wait for
     * it (written before step 51, so step 60 is past it) */
    snprintf(saved, sizeof saved, "checkpoint: saved %s/checkpoints/step_%d (", run, LAY_EVERY);
    int host0 = lay_rank0_at(&c, 2, LAY_EVERY + 10, saved, 40);
    if (host0 < 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 2-node job did not reach step 60 with its step 50 saved");
    }
    int victim = kill_host0 ? host0 : 1 - host0, survivor = 1 - victim;
    kill(c.pid[victim], SIGKILL);
    dt_test_group_wait(&c, 60 * dt_test_timeout_scale());
    DT_CHECK_INT(c.code[victim], 128 + SIGKILL);
    DT_CHECK_INT(c.code[survivor], 0);
    DT_CHECK_INT(lay_workers_gone(c.out[victim]), T * P);

    /* the layouts: 2 x T x P on both nodes, then 1 x T x P on the survivor only */
    char before[128], after[128], gb[256];
    snprintf(before, sizeof before, "layout: data 2 x tensor %d x pipeline %d; this rank:", T, P);
    snprintf(after, sizeof after, "layout: data 1 x tensor %d x pipeline %d; this rank:", T, P);
    for (int k = 0; k < 2; k++) {
        DT_CHECK_INT(dt_test_count_text(c.out[k], before), T * P);
        DT_CHECK_INT(dt_test_count_text(c.out[k], after), k == survivor ? T * P : 0);
    }
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "layout: data 1 x tensor"), T * P);
    /* the agent counts the data-parallel ranks, before the change as after */
    DT_CHECK_INT(dt_test_count_text(c.out[survivor],
                                    "global batch: 8 samples per step over 2 data-parallel "
                                    "ranks, kept by train.global_batch: 1 micro-step of up to 4 "
                                    "samples per rank"),
                 1);
    snprintf(gb, sizeof gb,
             "global batch: 8 samples per step over 1 data-parallel ranks (was 2 data-parallel "
             "ranks), kept by train.global_batch: 2 micro-steps of up to 4 samples per rank");
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], gb), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "done after 600 steps"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], summary), 1);
    int resumed = gb_resumed_step(c.out[survivor]);
    DT_CHECK_MSG(resumed >= LAY_EVERY && resumed % LAY_EVERY == 0 && resumed < LAY_STEPS,
                 "the 1-node world resumed at step %d", resumed);

    /* killed at step 60 or later, with step 50 saved: the new layout trained some steps again */
    int same = lay_check_run(run, resumed, 2, 1, T, P, true);
    DT_CHECK_MSG(same >= 1, "no step after the checkpoint (%d) was trained in both layouts",
                 resumed);
    if (c.code[survivor] || resumed < 0)
        dt_test_group_dump(&c);
    finish(&c);
}

/* T = 2: each node holds one tensor group (ranks 2k, 2k+1); the node without rank 0 dies. */
static void test_tensor_job_shrinks(void)
{
    lay_shrinks("tpshrink", 2, 1, "parallel.tensor=2", false, "(2 ranks, tensor 2 x data 1)");
}

/* P = 2: the stages span the nodes (stage 0 on node 0: ranks 0 and 1 are pp 0, dp 0 and 1); the
 * node of rank 0 dies, with the first stage and the checkpoint writer. */
static void test_pipeline_job_shrinks(void)
{
    lay_shrinks("ppshrink", 1, 2, "parallel.pipeline=2 parallel.micro_batches=2", true,
                "(2 ranks, pipeline 2 x 2 micro-batches (1f1b))");
}

/* T = 2 x P = 2 (the full mix, 8 ranks): node 0 holds stage 0 of both replicas, node 1 stage 1
 * (rank = (pp x D + dp) x T + tp); afterwards one replica, ranks pp x 2 + tp. */
static void test_tensor_pipeline_job_shrinks(void)
{
    lay_shrinks("tppshrink", 2, 2, "parallel.tensor=2 parallel.pipeline=2 parallel.micro_batches=2",
                false, "(4 ranks, tensor 2 x pipeline 2 x 2 micro-batches (1f1b))");
}

/* The other way: a T = 2 job running alone on one node of 2 workers (nnodes 1:2, D = 1) is
 * joined by a second node; it stops (saving the step it is at), regroups with the restart count
 * unchanged, and goes on as D = 2 from that step, the new node's workers logging their
 * coordinates too. */
static void test_tensor_job_grows(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024], id[64];
    snprintf(run, sizeof run, "%s/tpgrow", TMP);
    snprintf(id, sizeof id, "tpgrow-%d", (int)getpid());
    lay_agent(&c, 0, id, 2, run, "parallel.tensor=2", CONF_CALM);
    if (lay_rank0_at(&c, 1, LAY_EVERY + 10, NULL, 40) != 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 1-node job did not reach step 60");
    }
    lay_agent(&c, 1, id, 2, run, "parallel.tensor=2", CONF_CALM);
    dt_test_group_wait(&c, 60 * dt_test_timeout_scale());
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(c.code[k], 0);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "layout: data 1 x tensor 2 x pipeline 1; this "
                                              "rank:"),
                 2);
    DT_CHECK_INT(dt_test_count_text(c.out[1], "layout: data 1 x tensor"), 0);
    for (int k = 0; k < 2; k++)
        DT_CHECK_INT(dt_test_count_text(c.out[k], "layout: data 2 x tensor 2 x pipeline 1; this "
                                                  "rank:"),
                     2);
    DT_CHECK(dt_test_count_text(c.out[0], "joining the next round (restart count unchanged)") >=
             1);
    DT_CHECK_INT(dt_test_count_text(c.out[0], "global batch: 8 samples per step over 2 "
                                              "data-parallel ranks (was 1 data-parallel ranks), "
                                              "kept by train.global_batch: 1 micro-step of up "
                                              "to 4 samples per rank"),
                 1);
    int done = 0, resumed = -1;
    for (int k = 0; k < 2; k++) {
        done += dt_test_count_text(c.out[k], "done after 600 steps");
        done += 10 * dt_test_count_text(c.out[k], "(4 ranks, tensor 2 x data 2)");
        int r = gb_resumed_step(c.out[k]);
        if (r > resumed)
            resumed = r;
    }
    DT_CHECK_INT(done, 11);
    DT_CHECK_MSG(resumed >= LAY_EVERY + 10 && resumed < LAY_STEPS,
                 "the 2-node world resumed at step %d", resumed);
    lay_check_run(run, resumed, 1, 2, 2, 1, false);
    if (c.code[0] || c.code[1] || resumed < 0)
        dt_test_group_dump(&c);
    finish(&c);
}

/* T = 2 over 2 nodes of one worker (nnodes 1:2: a world of 2 is within reach, so the job
 * loads): one node dies, and the world of 1 that the survivor gathers cannot hold one tensor
 * group. The survivor's workers fail at the lost peer, its restart ends at the agent's check
 * of the new round: exit 2 (DT_EXIT_CONFIG), the message naming parallel.tensor and the world
 * sizes that would do, no worker started in it, within seconds of the loss. */
static void test_world_too_small_for_tensor(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024], id[64];
    snprintf(run, sizeof run, "%s/tpsmall", TMP);
    snprintf(id, sizeof id, "tpsmall-%d", (int)getpid());
    for (int k = 0; k < 2; k++)
        lay_agent(&c, k, id, 1, run, "parallel.tensor=2", CONF_LOSS);
    int host0 = lay_rank0_at(&c, 2, 20, NULL, 40);
    if (host0 < 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 2-node job did not reach its step 20");
    }
    int victim = 1 - host0, survivor = host0;
    double t0 = dt_test_now();
    kill(c.pid[victim], SIGKILL);
    dt_test_group_wait(&c, 30 * dt_test_timeout_scale());
    double took = dt_test_now() - t0;
    DT_CHECK_INT(c.code[victim], 128 + SIGKILL);
    DT_CHECK_INT(c.code[survivor], 2);
    /* the survivor does not wait out a timeout: the failure, a round of 1 node after the last
     * call, the check (heartbeat_timeout is 3 s, last_call_timeout 1 s) */
    DT_CHECK_MSG(took < 15 * dt_test_timeout_scale(), "the survivor ended %.1f s after the loss",
                 took);
    char *o = dt_test_slurp(c.out[survivor]);
    DT_REQUIRE(o != NULL);
    DT_CHECK_CONTAINS(o, "this round gathered 1 node: world size 1 is not divisible by "
                         "parallel.tensor x parallel.pipeline = 2 x 1 = 2");
    DT_CHECK_CONTAINS(o, "run a multiple of 2 ranks (2, 4, 6, ...), or change parallel.tensor "
                         "or parallel.pipeline; no worker was started");
    free(o);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "layout: "), 1); /* attempt 0's only */
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "layout: data 1 x tensor 2 x pipeline 1"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "restarting every worker") +
                     dt_test_count_text(c.out[survivor], "joining the next round"),
                 1);
    /* the line about the global batch is for a world that runs */
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "global batch: "), 1);
    DT_CHECK_INT(lay_workers_gone(c.out[victim]), 1);
    lay_metrics *m = calloc(1, sizeof *m);
    DT_REQUIRE(m);
    lay_read(run, m);
    DT_CHECK_INT(m->n, 1);
    DT_CHECK(m->world[0] == 2 && m->dp[0] == 1 && m->tp[0] == 2 && m->pp[0] == 1);
    free(m);
    /* the survivor's end, in its events: a setup error, exit 2 */
    char cmd[1100], *ev = NULL;
    snprintf(cmd, sizeof cmd, "cat %s/logs/%s/events*.jsonl", TMP, id);
    DT_REQUIRE(dt_test_run(cmd, &ev, 30) == 0);
    DT_CHECK_CONTAINS(ev, "\"event\":\"end\",\"result\":\"setup_error\",\"exit_code\":2,");
    free(ev);
    if (c.code[survivor] != 2)
        dt_test_group_dump(&c);
    finish(&c);
}

/* Issue 34's item 7: a T = 2 job on 2 nodes of one worker (nnodes 2:4, D = 1) is joined by a
 * third node. A world of 3 cannot hold tensor groups of 2: the newcomer waits as a spare
 * instead of ending the round into a world the layout refuses (before: every agent exit 2, "world
 * size 3 is not divisible"), and the job trains on undisturbed. A fourth node makes a world of 4:
 * it ends the round, and the next one takes all four in (D = 2), from the step the job was at,
 * with the restart count unchanged. Every agent warned at start that a world of 3 is one the
 * layout cannot use. 6,000 steps (some 10 s) leave the nodes time to arrive while it runs. */
static void test_tensor_job_keeps_spare(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024], id[64];
    const char *par = "parallel.tensor=2 train.steps=6000";
    snprintf(run, sizeof run, "%s/tpspare", TMP);
    snprintf(id, sizeof id, "tpspare-%d", (int)getpid());
    for (int k = 0; k < 2; k++)
        lay_agent_n(&c, k, id, "2:4", 1, run, par, CONF_CALM);
    int host0 = lay_rank0_at(&c, 2, 20, NULL, 40);
    if (host0 < 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 2-node job did not reach step 20");
    }
    lay_agent_n(&c, 2, id, "2:4", 1, run, par, CONF_CALM);
    const char *spare = "waiting as a spare until a later round can use it";
    double deadline = dt_test_now() + 30 * dt_test_timeout_scale();
    while (!dt_test_count_text(c.out[2], spare) && dt_test_now() < deadline)
        dt_sleep_ms(20);
    DT_CHECK_INT(dt_test_count_text(c.out[2], spare), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[host0], "done after"), 0); /* it came while it ran */
    lay_agent_n(&c, 3, id, "2:4", 1, run, par, CONF_CALM);
    dt_test_group_wait(&c, 120 * dt_test_timeout_scale());
    for (int k = 0; k < 4; k++) {
        DT_CHECK_INT(c.code[k], 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "cannot use world size 3; a round that "
                                                  "gathers such a node count runs on the "
                                                  "largest world it can use"),
                     1);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "not divisible"), 0);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "layout: data 1 x tensor 2 x pipeline 1"),
                     k < 2);
        DT_CHECK_INT(dt_test_count_text(c.out[k], "layout: data 2 x tensor 2 x pipeline 1"), 1);
    }
    DT_CHECK_INT(dt_test_count_text(c.out[3], "waiting as a spare"), 0);
    int done = 0;
    for (int k = 0; k < 4; k++)
        done += dt_test_count_text(c.out[k], "done after 6000 steps");
    DT_CHECK_INT(done, 1);
    lay_metrics *m = calloc(1, sizeof *m);
    DT_REQUIRE(m);
    lay_read(run, m);
    DT_CHECK_INT(m->n, 2);
    DT_CHECK(m->world[0] == 2 && m->dp[0] == 1 && m->tp[0] == 2);
    DT_CHECK(m->world[1] == 4 && m->dp[1] == 2 && m->tp[1] == 2);
    DT_CHECK_INT(m->attempt[1], m->attempt[0]);
    DT_CHECK_INT(m->first[0], 1);
    DT_CHECK_INT(m->gaps[0], 0);
    free(m);
    /* lay_read keeps steps up to LAY_STEPS only: where the 4-node world began, its workers say */
    int resumed = -1;
    for (int k = 0; k < 4; k++) {
        int r = gb_resumed_step(c.out[k]);
        if (r > resumed)
            resumed = r;
    }
    DT_CHECK_MSG(resumed > 20 && resumed < 6000, "the 4-node world resumed at step %d", resumed);
    if (c.code[0] || c.code[1] || c.code[2] || c.code[3])
        dt_test_group_dump(&c);
    finish(&c);
}

/* The spare of tensor_job_keeps_spare takes the place of a lost node: a T = 2 job on 2 nodes
 * of one worker (nnodes 2:3) with a third node waiting as a spare loses the node without rank
 * 0 (SIGKILL, past a checkpoint); the next round takes the survivor and the spare (a world of 2
 * again), which resume from the checkpoint as D = 1 x T = 2 and finish. */
static void test_spare_replaces_lost_node(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024], id[64], saved[1100];
    const char *par = "parallel.tensor=2 train.steps=6000";
    snprintf(run, sizeof run, "%s/tpreplace", TMP);
    snprintf(id, sizeof id, "tpreplace-%d", (int)getpid());
    for (int k = 0; k < 2; k++)
        lay_agent_n(&c, k, id, "2:3", 1, run, par, CONF_LOSS);
    snprintf(saved, sizeof saved, "checkpoint: saved %s/checkpoints/step_%d (", run, LAY_EVERY);
    int host0 = lay_rank0_at(&c, 2, LAY_EVERY + 10, saved, 40);
    if (host0 < 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 2-node job did not reach step 60 with its step 50 saved");
    }
    lay_agent_n(&c, 2, id, "2:3", 1, run, par, CONF_LOSS);
    DT_REQUIRE(dt_test_wait_text(c.out[2], "waiting as a spare until a later round can use it",
                                 1, 30 * dt_test_timeout_scale()));
    int victim = 1 - host0;
    kill(c.pid[victim], SIGKILL);
    dt_test_group_wait(&c, 120 * dt_test_timeout_scale());
    DT_CHECK_INT(c.code[victim], 128 + SIGKILL);
    DT_CHECK_INT(c.code[host0], 0);
    DT_CHECK_INT(c.code[2], 0);
    DT_CHECK_INT(lay_workers_gone(c.out[victim]), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[2], "layout: data 1 x tensor 2 x pipeline 1"), 1);
    DT_CHECK_INT(dt_test_count_text(c.out[host0], "layout: data 1 x tensor 2 x pipeline 1"), 2);
    int done = 0, resumed = -1;
    for (int k = 0; k < 3; k++) {
        DT_CHECK_INT(dt_test_count_text(c.out[k], "not divisible"), 0);
        done += dt_test_count_text(c.out[k], "done after 6000 steps");
        int r = gb_resumed_step(c.out[k]);
        resumed = r > resumed ? r : resumed;
    }
    DT_CHECK_INT(done, 1);
    DT_CHECK_MSG(resumed >= LAY_EVERY && resumed % LAY_EVERY == 0 && resumed < 6000,
                 "the survivor and the spare resumed at step %d", resumed);
    if (c.code[host0] || c.code[2])
        dt_test_group_dump(&c);
    finish(&c);
}

/* Issue 27: parallel.layout = auto on an elastic job (nnodes 1:2, 2 workers a node). The
 * agents plan at the first round for 2 x 2 ranks (group rank 0 plans, the other node applies
 * the same keys); the node of rank 0 dies some steps past a checkpoint, and the survivor plans
 * again, for its own 1 x 2 ranks, keeping the first plan's global batch (train.global_batch = 8
 * of LAY_JOB, which the plan turns into batch x accumulation x D), and resumes from the
 * checkpoint at the new layout to the end. The layouts the planner picks depend on this host's
 * measured rates, so the test checks what every pick must be: a layout that fills its world,
 * the same one on every rank, and 8 samples a step before and after. */
static void test_auto_layout_replans(void)
{
    cluster c;
    dt_test_group_init(&c);
    start_store(&c);
    char run[1024], id[64], saved[1100];
    snprintf(run, sizeof run, "%s/autoplan", TMP);
    snprintf(id, sizeof id, "autoplan-%d", (int)getpid());
    for (int k = 0; k < 2; k++)
        lay_agent(&c, k, id, 2, run, "parallel.layout=auto", CONF_LOSS);
    snprintf(saved, sizeof saved, "checkpoint: saved %s/checkpoints/step_%d (", run, LAY_EVERY);
    int host0 = lay_rank0_at(&c, 2, LAY_EVERY + 10, saved, 60);
    if (host0 < 0) {
        dt_test_group_dump(&c);
        DT_REQUIRE(!"the 2-node auto job did not reach step 60 with its step 50 saved");
    }
    int victim = host0, survivor = 1 - host0;
    DT_CHECK_INT(dt_test_count_text(c.out[host0], "parallel.layout = auto: gpt-tiny on 2 x 2 "
                                                  "ranks, global batch 8: "
                                                  "chose D"),
                 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "parallel.layout = auto: 2 x 2 ranks: the "
                                                     "layout group rank 0 planned: "
                                                     "plan.global_batch=8 parallel.tensor="),
                 1);
    kill(c.pid[victim], SIGKILL);
    dt_test_group_wait(&c, 90 * dt_test_timeout_scale());
    DT_CHECK_INT(c.code[victim], 128 + SIGKILL);
    DT_CHECK_INT(c.code[survivor], 0);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "parallel.layout = auto: gpt-tiny on 1 x 2 "
                                                     "ranks, global batch 8: "
                                                     "chose D"),
                 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "parallel.layout = auto: the world changed "
                                                     "from 4 to 2 ranks: the workers resume from "
                                                     "the latest checkpoint at the new layout"),
                 1);
    DT_CHECK_INT(dt_test_count_text(c.out[survivor], "done after 600 steps"), 1);
    int resumed = gb_resumed_step(c.out[survivor]);
    DT_CHECK_MSG(resumed >= LAY_EVERY && resumed % LAY_EVERY == 0 && resumed < LAY_STEPS,
                 "the 1-node world resumed at step %d", resumed);
    lay_metrics *m = calloc(1, sizeof *m);
    DT_REQUIRE(m);
    lay_read(run, m);
    DT_CHECK_INT(m->n, 2);
    for (int i = 0; i < m->n && i < 2; i++)
        DT_CHECK_MSG(m->world[i] == 4 - 2 * i && m->dp[i] * m->tp[i] * m->pp[i] == m->world[i],
                     "layout %d: world %d = dp %d x tp %d x pp %d", i, m->world[i], m->dp[i],
                     m->tp[i], m->pp[i]);
    DT_CHECK_INT(m->first[0], 1);
    DT_CHECK_INT(m->gaps[0], 0);
    DT_CHECK_INT(m->first[1], resumed + 1);
    DT_CHECK_INT(m->last[1], LAY_STEPS);
    DT_CHECK_INT(m->gaps[1], 0);
    /* every rank of a round logged the same layout as rank 0's metrics.jsonl */
    for (int i = 0; i < m->n && i < 2; i++) {
        char want[96];
        snprintf(want, sizeof want, "layout: data %d x tensor %d x pipeline %d; this rank:",
                 m->dp[i], m->tp[i], m->pp[i]);
        int n = dt_test_count_text(c.out[survivor], want) +
                (i == 0 ? dt_test_count_text(c.out[victim], want) : 0);
        DT_CHECK_MSG(n >= m->world[i], "%d ranks logged \"%s\" (world %d)", n, want,
                     m->world[i]);
    }
    free(m);
    char path[1100];
    snprintf(path, sizeof path, "%s/checkpoints/step_%d/state.json", run, LAY_STEPS);
    char *st = dt_test_slurp(path);
    DT_CHECK_CONTAINS(st, "\"samples_seen\":\t4800,"); /* 600 steps x 8 */
    free(st);
    /* the layouts in the agents' events: planned by rank 0 and applied by the other node, then
     * planned by the survivor alone */
    char cmd[1100], *ev = NULL;
    snprintf(cmd, sizeof cmd, "cat %s/logs/%s/events*.jsonl", TMP, id);
    DT_REQUIRE(dt_test_run(cmd, &ev, 30) == 0);
    DT_CHECK_CONTAINS(ev, "\"event\":\"layout\",\"world\":4,\"nodes\":2,\"planned\":true,"
                          "\"keys\":\"plan.global_batch=8 parallel.tensor=");
    DT_CHECK_CONTAINS(ev, "\"event\":\"layout\",\"world\":4,\"nodes\":2,\"planned\":false,"
                          "\"keys\":\"plan.global_batch=8 parallel.tensor=");
    DT_CHECK_CONTAINS(ev, "\"event\":\"layout\",\"world\":2,\"nodes\":1,\"planned\":true,"
                          "\"keys\":\"plan.global_batch=8 parallel.tensor=");
    free(ev);
    if (c.code[survivor] || resumed < 0)
        dt_test_group_dump(&c);
    finish(&c);
}

static const dt_test tests[] = {
    {"api_survivors_keep_order", test_api_survivors_keep_order, 60},
    {"api_many_lost_at_once", test_api_many_lost_at_once, 240},
    {"api_damaged_end_record", test_api_damaged_end_record, 60},
    {"random_order", test_random_order, 120},
    {"late_joiner_grows_job", test_late_joiner_grows_job, 90},
    {"ddp_job_regroups", test_ddp_job_regroups, 150},
    {"sigkill_shrinks_job", test_sigkill_shrinks_job, 90},
    {"sigstop_agent_fenced", test_sigstop_agent_fenced, 120},
    {"too_few_nodes_times_out", test_too_few_nodes_times_out, 60},
    {"below_min_after_loss_fails", test_below_min_after_loss_fails, 90},
    {"spare_takes_free_slot", test_spare_takes_free_slot, 90},
    {"same_exit_code_everywhere", test_same_exit_code_everywhere, 90},
    {"second_job_starts_clean", test_second_job_starts_clean, 120},
    {"store_host_dies", test_store_host_dies, 90},
    {"frozen_host_ends_at_once", test_frozen_host_ends_at_once, 180},
    {"lost_node_back_sees_success", test_lost_node_back_sees_success, 90},
    {"dead_spare_not_waited_for", test_dead_spare_not_waited_for, 90},
    {"abandoned_job_replaced", test_abandoned_job_replaced, 90},
    {"survivors_not_pushed_out", test_survivors_not_pushed_out, 90},
    {"lost_node_not_a_survivor", test_lost_node_not_a_survivor, 90},
    {"sigterm_one_agent", test_sigterm_one_agent, 60},
    {"global_batch_survives_lost_node", test_global_batch_survives_lost_node, 400},
    {"tensor_job_shrinks", test_tensor_job_shrinks, 150},
    {"pipeline_job_shrinks", test_pipeline_job_shrinks, 150},
    {"tensor_pipeline_job_shrinks", test_tensor_pipeline_job_shrinks, 180},
    {"tensor_job_grows", test_tensor_job_grows, 150},
    {"world_too_small_for_tensor", test_world_too_small_for_tensor, 90},
    {"tensor_job_keeps_spare", test_tensor_job_keeps_spare, 150},
    {"spare_replaces_lost_node", test_spare_replaces_lost_node, 180},
    {"auto_layout_replans", test_auto_layout_replans, 180},
};

int main(int argc, char **argv)
{
    return dt_test_main("test_elastic", tests, (int)DT_ARRAY_LEN(tests), argc, argv);
}
